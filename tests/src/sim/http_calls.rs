//! HTTP through the sidecar's outbound HTTP listener, the way real apps call services: one
//! pooled HTTP/1.1 keep-alive connection and one HTTP/2 connection (h2c, prior knowledge), each
//! reused for every call, as HTTP client libraries pool them.
//!
//! What an app sees of a drain that touches outbound is counted here, from the app's side: an
//! HTTP/1.1 response with `Connection: close` (the app must then open a new connection; a call
//! that races the close fails), an HTTP/2 GOAWAY frame (counted on the wire, by a tap on the
//! connection's bytes from the server, not inferred from errors), each new connection, and each
//! failed call. The remote side is a plain HTTP/1.1 keep-alive server (`GET` → `200 pong`); Envoy
//! speaks HTTP/1.1 to it whatever the app speaks to Envoy, as for an Istio service port of
//! protocol `http`.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::apps::TermSignal;
use super::report::{now_us, AppEvent, CallError, HttpProto, Phase, ReportWriter};

/// The remote services' HTTP port (an Istio service port of protocol `http`; the sidecar's
/// outbound listener for it is `0.0.0.0_8080`).
pub const REMOTE_HTTP_PORT: u16 = 8080;

/// The answer body.
const BODY: &[u8] = b"pong";

/// Longest request head the remote server reads.
const MAX_HEAD: usize = 16 * 1024;

// ---- the remote server ---------------------------------------------------------------------

/// Serves HTTP/1.1 keep-alive on every connection, one thread per connection, until the process
/// exits: every request (its body, if any, is not expected) gets `200` with `pong`.
pub fn serve_http(listener: TcpListener) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let _ = std::thread::Builder::new()
            .name("http-conn".into())
            .spawn(move || {
                let _ = serve_http_conn(conn);
            });
    }
}

fn serve_http_conn(conn: TcpStream) -> io::Result<()> {
    conn.set_nodelay(true)?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut writer = conn;
    loop {
        let mut head = 0usize;
        let mut line = String::new();
        // The request line and headers, up to the blank line.
        loop {
            line.clear();
            let n = reader.read_line(&mut line)?;
            if n == 0 {
                return Ok(());
            }
            head += n;
            if head > MAX_HEAD {
                return Err(io::Error::other("request head too long"));
            }
            if line == "\r\n" || line == "\n" {
                break;
            }
        }
        writer.write_all(
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n",
                BODY.len()
            )
            .as_bytes(),
        )?;
        writer.write_all(BODY)?;
    }
}

// ---- HTTP/1.1 ------------------------------------------------------------------------------

/// One pooled HTTP/1.1 connection, replaced when the server asks to close it or it fails.
struct H1Pool {
    remote: SocketAddr,
    timeout: Duration,
    conn: Option<BufReader<TcpStream>>,
    /// Connections opened so far (the current one's ordinal).
    opened: u32,
}

/// What one call saw.
struct Seen {
    result: Result<(), CallError>,
    /// The response carried `Connection: close` (HTTP/1.1) / a GOAWAY had arrived by the end of
    /// the call (HTTP/2).
    closing: bool,
    connection: u32,
}

impl H1Pool {
    fn call(&mut self) -> Seen {
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => match open(self.remote, self.timeout) {
                Ok(s) => {
                    self.opened += 1;
                    BufReader::new(s)
                }
                Err(e) => {
                    return Seen {
                        result: Err(e),
                        closing: false,
                        connection: self.opened,
                    }
                }
            },
        };
        let connection = self.opened;
        match h1_exchange(&mut conn) {
            Ok(close) => {
                if !close {
                    self.conn = Some(conn);
                }
                Seen {
                    result: Ok(()),
                    closing: close,
                    connection,
                }
            }
            Err(e) => Seen {
                result: Err(e),
                closing: false,
                connection,
            },
        }
    }
}

fn open(remote: SocketAddr, timeout: Duration) -> Result<TcpStream, CallError> {
    let s = TcpStream::connect_timeout(&remote, timeout).map_err(|e| CallError::from_io(&e))?;
    s.set_read_timeout(Some(timeout))
        .and_then(|()| s.set_write_timeout(Some(timeout)))
        .and_then(|()| s.set_nodelay(true))
        .map_err(|e| CallError::from_io(&e))?;
    Ok(s)
}

/// `GET /` on the connection; `Ok(true)` when the answer says `Connection: close`.
fn h1_exchange(conn: &mut BufReader<TcpStream>) -> Result<bool, CallError> {
    conn.get_mut()
        .write_all(b"GET / HTTP/1.1\r\nhost: remote\r\nuser-agent: sim-app\r\n\r\n")
        .map_err(|e| CallError::from_io(&e))?;
    let mut line = String::new();
    let read_line = |conn: &mut BufReader<TcpStream>, line: &mut String| {
        line.clear();
        match conn.read_line(line) {
            Ok(0) => Err(CallError::Closed),
            Ok(_) => Ok(()),
            Err(e) => Err(CallError::from_io(&e)),
        }
    };
    read_line(conn, &mut line)?;
    let status_ok = line.starts_with("HTTP/1.1 200 ");
    let mut length = None;
    let mut close = false;
    loop {
        read_line(conn, &mut line)?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let Some((name, value)) = header.split_once(':') else {
            return Err(CallError::BadResponse);
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = value.parse::<usize>().ok();
        } else if name.eq_ignore_ascii_case("connection") {
            close |= value
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("close"));
        }
    }
    let mut body = vec![0u8; length.ok_or(CallError::BadResponse)?.min(MAX_HEAD)];
    conn.read_exact(&mut body)
        .map_err(|e| CallError::from_io(&e))?;
    if !status_ok || body != BODY {
        return Err(CallError::BadResponse);
    }
    Ok(close)
}

// ---- HTTP/2 --------------------------------------------------------------------------------

/// Counts GOAWAY frames (type 0x7) in the bytes a server sends (RFC 9113 §4.1: every frame is a
/// 9-byte header — 24-bit length, type, flags, stream id — then `length` bytes of payload; the
/// server sends no preface), so the count is what arrived on the wire.
#[derive(Debug, Default)]
struct FrameScanner {
    header: [u8; 9],
    have: usize,
    skip: usize,
}

const FRAME_GOAWAY: u8 = 0x7;

impl FrameScanner {
    /// Feeds received bytes; returns how many GOAWAY frame headers they completed.
    fn feed(&mut self, mut bytes: &[u8]) -> u32 {
        let mut goaways = 0;
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == 9 {
                let h = self.header;
                self.skip = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                if h[3] == FRAME_GOAWAY {
                    goaways += 1;
                }
                self.have = 0;
            }
        }
        goaways
    }
}

/// A TCP stream whose received bytes are scanned for GOAWAY frames.
struct GoawayTap {
    inner: tokio::net::TcpStream,
    scanner: FrameScanner,
    goaways: Arc<AtomicU32>,
}

impl AsyncRead for GoawayTap {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let n = this.scanner.feed(&buf.filled()[before..]);
            if n > 0 {
                this.goaways.fetch_add(n, Ordering::SeqCst);
            }
        }
        polled
    }
}

impl AsyncWrite for GoawayTap {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// One live HTTP/2 connection.
struct H2Conn {
    client: h2::client::SendRequest<bytes::Bytes>,
    driver: tokio::task::JoinHandle<()>,
    goaways: Arc<AtomicU32>,
}

/// One pooled HTTP/2 connection, replaced when the server sends GOAWAY, it ends, or a call on it
/// fails.
struct H2Pool {
    remote: SocketAddr,
    timeout: Duration,
    conn: Option<H2Conn>,
    opened: u32,
    /// GOAWAY frames on every connection so far.
    goaways: u32,
}

impl H2Pool {
    async fn call(&mut self) -> Seen {
        if self.conn.is_none() {
            match tokio::time::timeout(self.timeout, h2_open(self.remote)).await {
                Ok(Ok(c)) => {
                    self.opened += 1;
                    self.conn = Some(c);
                }
                Ok(Err(e)) => return self.failed(e),
                Err(_) => return self.failed(CallError::Timeout),
            }
        }
        let connection = self.opened;
        let Some(conn) = self.conn.as_mut() else {
            return self.failed(CallError::Other);
        };
        let result = match tokio::time::timeout(self.timeout, h2_exchange(conn, self.remote)).await
        {
            Ok(r) => r,
            Err(_) => Err(CallError::Timeout),
        };
        let goaways = conn.goaways.load(Ordering::SeqCst);
        let ended = conn.driver.is_finished();
        let closing = goaways > 0;
        if closing || ended || result.is_err() {
            if let Some(old) = self.conn.take() {
                self.goaways += old.goaways.load(Ordering::SeqCst);
                old.driver.abort();
            }
        }
        Seen {
            result,
            closing,
            connection,
        }
    }

    fn failed(&self, e: CallError) -> Seen {
        Seen {
            result: Err(e),
            closing: false,
            connection: self.opened,
        }
    }
}

async fn h2_open(remote: SocketAddr) -> Result<H2Conn, CallError> {
    let tcp = tokio::net::TcpStream::connect(remote)
        .await
        .map_err(|e| CallError::from_io(&e))?;
    tcp.set_nodelay(true).map_err(|e| CallError::from_io(&e))?;
    let goaways = Arc::new(AtomicU32::new(0));
    let tap = GoawayTap {
        inner: tcp,
        scanner: FrameScanner::default(),
        goaways: goaways.clone(),
    };
    let (client, connection) = h2::client::handshake(tap)
        .await
        .map_err(|_| CallError::Other)?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(H2Conn {
        client,
        driver,
        goaways,
    })
}

async fn h2_exchange(conn: &mut H2Conn, remote: SocketAddr) -> Result<(), CallError> {
    let h2_error = |e: h2::Error| {
        if e.is_io() {
            e.into_io()
                .map_or(CallError::Other, |io| CallError::from_io(&io))
        } else if e.is_go_away() || e.is_reset() {
            CallError::Closed
        } else {
            CallError::Other
        }
    };
    let mut client = conn.client.clone().ready().await.map_err(h2_error)?;
    let request = http::Request::get(format!("http://{remote}/"))
        .body(())
        .map_err(|_| CallError::Other)?;
    let (response, _) = client.send_request(request, true).map_err(h2_error)?;
    let response = response.await.map_err(h2_error)?;
    let ok = response.status() == http::StatusCode::OK;
    let mut body = response.into_body();
    let mut got = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(h2_error)?;
        let _ = body.flow_control().release_capacity(chunk.len());
        got.extend_from_slice(&chunk);
        if got.len() > MAX_HEAD {
            return Err(CallError::BadResponse);
        }
    }
    if !ok || got != BODY {
        return Err(CallError::BadResponse);
    }
    Ok(())
}

// ---- the app -------------------------------------------------------------------------------

/// Calls `remote` every `every` over one pooled HTTP/1.1 and one HTTP/2 connection, on two
/// threads, until `after_sigterm` after SIGTERM; records every call.
pub fn call_through_shutdown(
    report: &Arc<ReportWriter>,
    term: &TermSignal,
    remote: SocketAddr,
    every: Duration,
    after_sigterm: Duration,
    timeout: Duration,
) -> io::Result<()> {
    let phase = |term: &TermSignal| {
        if term.received_at_ms().is_some() {
            Phase::AfterSigterm
        } else {
            Phase::Running
        }
    };
    // Whether to make another call, and when: until `after_sigterm` past the signal.
    let go_on = |term: &TermSignal, signalled: &mut Option<Instant>| -> bool {
        if term.received_at_ms().is_some() {
            let at = *signalled.get_or_insert_with(Instant::now);
            at.elapsed() < after_sigterm
        } else {
            true
        }
    };
    std::thread::scope(|s| -> io::Result<()> {
        let h1 = std::thread::Builder::new()
            .name("http1".into())
            .spawn_scoped(s, || {
                let mut pool = H1Pool {
                    remote,
                    timeout,
                    conn: None,
                    opened: 0,
                };
                let mut signalled = None;
                while go_on(term, &mut signalled) {
                    let t = Instant::now();
                    let p = phase(term);
                    let seen = pool.call();
                    record(report, HttpProto::Http1, p, t, &seen, 0);
                    // The app keeps its pace through shutdown: the signal does not cut it short.
                    std::thread::sleep(every.saturating_sub(t.elapsed()));
                }
            })?;
        let h2 = std::thread::Builder::new()
            .name("http2".into())
            .spawn_scoped(s, || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => return eprintln!("app: no runtime for HTTP/2: {e}"),
                };
                rt.block_on(async {
                    let mut pool = H2Pool {
                        remote,
                        timeout,
                        conn: None,
                        opened: 0,
                        goaways: 0,
                    };
                    let mut signalled = None;
                    while go_on(term, &mut signalled) {
                        let t = Instant::now();
                        let p = phase(term);
                        let seen = pool.call().await;
                        let live = pool
                            .conn
                            .as_ref()
                            .map_or(0, |c| c.goaways.load(Ordering::SeqCst));
                        record(report, HttpProto::Http2, p, t, &seen, pool.goaways + live);
                        let rest = every.saturating_sub(t.elapsed());
                        tokio::time::sleep(rest).await;
                    }
                });
            })?;
        let _ = h1.join();
        let _ = h2.join();
        Ok(())
    })
}

fn record(
    report: &ReportWriter,
    proto: HttpProto,
    phase: Phase,
    started: Instant,
    seen: &Seen,
    goaways: u32,
) {
    let at_us = now_us();
    report.record(&AppEvent::HttpCall {
        at_ms: at_us / 1000,
        proto,
        phase,
        ok: seen.result.is_ok(),
        error: seen.result.err(),
        latency_ms: started.elapsed().as_millis() as u64,
        connection: seen.connection,
        closing: seen.closing,
        goaways,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            0,
            0,
            0,
            0,
            0,
        ];
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn goaway_frames_are_counted_across_any_split() {
        // SETTINGS, HEADERS, DATA with a payload holding a 0x07 byte, GOAWAY, PING.
        let mut wire = frame(0x4, &[0; 6]);
        wire.extend(frame(0x1, &[0x88]));
        wire.extend(frame(0x0, &[7, 7, 7, 7, 7, 7, 7, 7, 7, 7]));
        wire.extend(frame(FRAME_GOAWAY, &[0, 0, 0, 1, 0, 0, 0, 0]));
        wire.extend(frame(0x6, &[0; 8]));
        for chunk in [1, 2, 5, 9, 10, wire.len()] {
            let mut s = FrameScanner::default();
            let n: u32 = wire.chunks(chunk).map(|c| s.feed(c)).sum();
            assert_eq!(n, 1, "chunks of {chunk}");
        }
        let mut two = wire.clone();
        two.extend(frame(FRAME_GOAWAY, &[0; 8]));
        assert_eq!(FrameScanner::default().feed(&two), 2);
    }
}
