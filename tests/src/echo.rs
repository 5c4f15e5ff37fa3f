//! A TCP echo server on loopback: the upstream behind Envoy in filter tests and benchmarks.
//!
//! One thread accepts, one thread per connection echoes. The server can close every open
//! connection on demand ([`EchoServer::close_all`]), which is how tests make the upstream end
//! a connection. Dropping the server stops it and closes its connections.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

/// A running echo server.
#[derive(Debug)]
pub struct EchoServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Shared {
    stopping: AtomicBool,
    accepted: AtomicU64,
    /// Clones of the open connections, so `close_all` can shut them from outside their threads.
    open: Mutex<Vec<TcpStream>>,
}

impl EchoServer {
    /// Starts on 127.0.0.1 with a port the kernel picks.
    pub fn start() -> std::io::Result<EchoServer> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let accept_thread = std::thread::Builder::new()
            .name("echo-accept".into())
            .spawn(move || accept_loop(listener, s))?;
        Ok(EchoServer {
            addr,
            shared,
            accept_thread: Some(accept_thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// Shuts down (both ways) every connection open now: their peers see the upstream close.
    /// Returns how many were shut.
    pub fn close_all(&self) -> usize {
        let mut open = self
            .shared
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let n = open.len();
        for s in open.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        n
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the blocking accept() so the thread sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.accept_thread.take() {
            let _ = t.join();
        }
        self.close_all();
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(conn) = conn else {
            // EMFILE and friends: keep serving the connections that exist.
            continue;
        };
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        let _ = conn.set_nodelay(true);
        if let Ok(clone) = conn.try_clone() {
            let mut open = shared.open.lock().unwrap_or_else(PoisonError::into_inner);
            // Forget connections that ended, so the list stays as long as what is open.
            open.retain(|s| s.peer_addr().is_ok());
            open.push(clone);
        }
        let _ = std::thread::Builder::new()
            .name("echo-conn".into())
            .spawn(move || echo(conn));
    }
}

fn echo(mut conn: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if conn.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = conn.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoes_and_closes() {
        let srv = EchoServer::start().unwrap();
        let mut c = TcpStream::connect(srv.addr()).unwrap();
        c.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"ping");
        assert_eq!(srv.accepted(), 1);
        assert_eq!(srv.close_all(), 1);
        assert_eq!(
            c.read(&mut b).unwrap_or(0),
            0,
            "peer sees EOF after close_all"
        );
    }
}
