//! The xDS stand-in in the pilot-agent stand-in: istiod's config, arriving late.
//!
//! In Istio, Envoy's xDS stream goes to pilot-agent's XDS proxy on a unix socket
//! (`./etc/istio/proxy/XDS`, bootstrap cluster `xds-grpc`), which forwards it to istiod; Envoy
//! starts at once, its admin API answers, and it stays PRE_INITIALIZING (no listeners, workers
//! not started) until istiod's first push arrives. The stand-in keeps that shape with Envoy's
//! REST-JSON xDS (the JSON `DiscoveryResponse`s the sim already renders for LDS and CDS, no
//! protobuf): Envoy POSTs `/v3/discovery:clusters` and `/v3/discovery:listeners` over a unix
//! socket in the pod's directory, and the stand-in answers each first request only `delay`
//! after pilot-agent started (standing in for istiod's connection and first push). Envoy holds
//! its initialization on the pending request (`initial_fetch_timeout: 0s`, a `request_timeout`
//! longer than the delay), as it does on a gRPC stream that has not answered yet. Later polls
//! (every `refresh_delay`, an hour) get the same resources at once.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The socket's file name in the pod's directory.
pub const XDS_SOCKET: &str = "xds.sock";

/// The `type_url` of each REST discovery path, and the file holding its resources.
fn resources_for(path: &str) -> Option<(&'static str, &'static str)> {
    match path {
        "/v3/discovery:listeners" => Some((
            "type.googleapis.com/envoy.config.listener.v3.Listener",
            super::bootstrap::LDS_FILE,
        )),
        "/v3/discovery:clusters" => Some((
            "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            super::bootstrap::CDS_FILE,
        )),
        _ => None,
    }
}

fn log(msg: &str) {
    eprintln!("{} pilot-agent xds: {msg}", super::report::now_ms());
}

/// Serves REST xDS on `socket` from the LDS/CDS files in `dir`, the first answer not before
/// `ready_at`. The socket is made writable for Envoy's uid (the agent runs as root here).
pub fn serve(socket: &Path, dir: PathBuf, ready_at: Instant) -> io::Result<()> {
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket)
        .map_err(|e| io::Error::new(e.kind(), format!("xDS socket {}: {e}", socket.display())))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666))?;
    std::thread::Builder::new()
        .name("xds".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let dir = dir.clone();
                let _ = std::thread::Builder::new()
                    .name("xds-conn".into())
                    .spawn(move || {
                        if let Err(e) = serve_connection(conn, &dir, ready_at) {
                            log(&format!("connection ended: {e}"));
                        }
                    });
            }
        })?;
    Ok(())
}

/// Requests on one keep-alive connection (Envoy's HTTP/1.1 pool reuses it), until EOF.
fn serve_connection(conn: UnixStream, dir: &Path, ready_at: Instant) -> io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut w = conn;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let mut length = 0usize;
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            if line == "\r\n" || line == "\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        // The DiscoveryRequest (node, version) is not needed: every answer is the full set.
        let mut body = vec![0u8; length.min(1 << 20)];
        reader.read_exact(&mut body)?;
        let path = request_line.split_whitespace().nth(1).unwrap_or("");
        let (status, answer) = match resources_for(path) {
            Some((type_url, file)) => {
                let wait = ready_at.saturating_duration_since(Instant::now());
                if !wait.is_zero() {
                    log(&format!("holding {path} for {} ms", wait.as_millis()));
                    std::thread::sleep(wait);
                }
                match discovery_response(&dir.join(file), type_url) {
                    Ok(json) => ("200 OK", json),
                    Err(e) => ("503 Service Unavailable", e.to_string()),
                }
            }
            None => ("404 Not Found", String::new()),
        };
        write!(
            w,
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
            answer.len()
        )?;
        w.flush()?;
    }
}

/// The file's `DiscoveryResponse` with its `type_url`.
fn discovery_response(file: &Path, type_url: &str) -> io::Result<String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", file.display())))?;
    let mut v: serde_json::Value = serde_json::from_str(&text).map_err(io::Error::other)?;
    if let Some(obj) = v.as_object_mut() {
        obj.insert("type_url".into(), type_url.into());
    }
    serde_json::to_string(&v).map_err(io::Error::other)
}

/// How long Envoy waits for a REST answer: longer than any delay the sim asks for.
pub fn request_timeout(delay: Duration) -> Duration {
    delay + Duration::from_secs(60)
}
