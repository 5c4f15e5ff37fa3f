//! A slow client downloading from a pod's served port through its sidecar's inbound listener
//! (issue 28): the response a drain must not cut. The client sits in the remote namespace (the
//! host's on the containerd backend), asks `get\n` of an [`AppScript::ServeDownload`] app and
//! reads at a fixed rate with a small receive buffer, so the bytes it has not read yet wait in
//! Envoy and the kernel, not in its own buffer.
//!
//! [`AppScript::ServeDownload`]: super::AppScript::ServeDownload

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc::{channel, Receiver};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use super::{SimError, SimNode};

/// Bytes read before a download counts as begun (the server is writing, Envoy is forwarding).
const BEGUN_AT: u64 = 64 * 1024;
/// A read that gets nothing for this long ends the download with an error (the pod is gone
/// without a close, or Envoy stopped forwarding).
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What a download saw.
#[derive(Debug, Clone, Default)]
pub struct Download {
    pub got: u64,
    /// When the last byte arrived (wall clock).
    pub last_byte: Option<SystemTime>,
    /// How it ended, if not by the server's close after the whole response.
    pub error: Option<String>,
}

/// A download under way on its own thread.
pub struct DownloadClient {
    begun: Receiver<()>,
    has_begun: bool,
    handle: Option<JoinHandle<Download>>,
}

impl DownloadClient {
    /// Connects to `pod`'s `port` from the remote side and starts reading at `rate` bytes per
    /// second; returns at once (see [`DownloadClient::begun`]).
    pub fn start(
        node: &SimNode,
        pod: &str,
        port: u16,
        rate: f64,
    ) -> Result<DownloadClient, SimError> {
        use socket2::{Domain, Socket, Type};
        let ip = node
            .pod_ip(pod)
            .ok_or_else(|| SimError::Setup(format!("pod {pod} has no IP to download from")))?;
        let addr = SocketAddr::from((ip, port));
        let stream = node
            .in_remote_netns(|| -> std::io::Result<TcpStream> {
                let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
                s.set_recv_buffer_size(64 * 1024)?;
                s.connect_timeout(&addr.into(), Duration::from_secs(2))?;
                Ok(s.into())
            })?
            .map_err(|e| SimError::Setup(format!("download from {addr}: connect: {e}")))?;
        let (begun_tx, begun) = channel();
        let handle = std::thread::spawn(move || {
            let mut s = stream;
            let mut d = Download::default();
            if let Err(e) = s
                .set_read_timeout(Some(READ_TIMEOUT))
                .and_then(|()| s.write_all(b"get\n"))
            {
                d.error = Some(format!("request: {e}"));
                let _ = begun_tx.send(());
                return d;
            }
            let t0 = Instant::now();
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        d.got += n as u64;
                        d.last_byte = Some(SystemTime::now());
                        if d.got >= BEGUN_AT {
                            let _ = begun_tx.send(());
                        }
                    }
                    Err(e) => {
                        d.error = Some(format!("read after {} bytes: {e}", d.got));
                        break;
                    }
                }
                // Pace: never ahead of the rate.
                let due = Duration::from_secs_f64(d.got as f64 / rate);
                if let Some(wait) = due.checked_sub(t0.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
            let _ = begun_tx.send(());
            d
        });
        Ok(DownloadClient {
            begun,
            has_begun: false,
            handle: Some(handle),
        })
    }

    /// Whether the download has begun (its first 64 KiB arrived) or already ended; does not
    /// block.
    pub fn begun(&mut self) -> bool {
        self.has_begun = self.has_begun || self.begun.try_recv().is_ok();
        self.has_begun
    }

    /// Waits up to `timeout` for [`DownloadClient::begun`].
    pub fn wait_begun(&mut self, timeout: Duration) -> bool {
        self.has_begun = self.has_begun || self.begun.recv_timeout(timeout).is_ok();
        self.has_begun
    }

    /// Whether the client's thread has ended (the server closed, or an error).
    pub fn ended(&self) -> bool {
        self.handle.as_ref().is_none_or(|h| h.is_finished())
    }

    /// What the download saw; waits for its thread to end.
    pub fn finish(mut self) -> Download {
        match self.handle.take().map(JoinHandle::join) {
            Some(Ok(d)) => d,
            Some(Err(_)) => Download {
                error: Some("the download thread panicked".into()),
                ..Download::default()
            },
            None => Download::default(),
        }
    }
}
