//! A small async client for Envoy's admin API, reached inside a pod's network namespace.
//!
//! Owns the agent's conversation with Envoy: `GET /ready`, `GET /stats?filter=...`, and the
//! `POST`s of the drain (`/drain_listeners?inboundonly&graceful`, `/healthcheck/fail`,
//! `/quitquitquit`). The socket is created in the pod's netns ([`PodNetns::connect_tcp`]) and
//! handed to tokio, so the runtime stays in the host's netns. Tests plug in another connector to
//! reach a fake server on 127.0.0.1 without a netns.
//!
//! HTTP/1.1 by hand, one request per connection (`Connection: close`): Envoy's admin answers
//! HTTP/1.0 with 426, and a full HTTP client would be a large dependency for four requests.
//! Bodies may be `Content-Length`, chunked, or delimited by the close; they are capped (4 MiB by
//! default) and every exchange has a connect and a response timeout.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::netns::PodNetns;

/// Envoy's admin address in Istio sidecars.
pub const DEFAULT_ADMIN_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 15000);

/// Largest header block accepted.
const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Errors of this module, by kind.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot connect to Envoy admin at {addr}: {reason}")]
    Connect {
        addr: SocketAddr,
        reason: String,
        /// The connection was refused: nothing listens on the admin port.
        refused: bool,
    },
    #[error("Envoy admin at {addr}: {what} timed out after {after:?}")]
    Timeout {
        addr: SocketAddr,
        what: &'static str,
        after: Duration,
    },
    #[error("Envoy admin at {addr}: {path} answered HTTP {status}: {body}")]
    Http {
        addr: SocketAddr,
        path: String,
        status: u16,
        /// The start of the body, for the log.
        body: String,
    },
    #[error("Envoy admin at {addr}: malformed response: {reason}")]
    Malformed { addr: SocketAddr, reason: String },
    #[error("Envoy admin at {addr}: I/O error: {source}")]
    Io {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl Error {
    /// A short label, usable as a metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Connect { .. } => "connect",
            Error::Timeout { .. } => "timeout",
            Error::Http { .. } => "http",
            Error::Malformed { .. } => "malformed",
            Error::Io { .. } => "io",
        }
    }

    /// Whether the admin port refused the connection (nothing listens: Envoy not started yet,
    /// or gone). Other connect failures (entering the netns failed) say nothing about Envoy.
    pub fn is_refused(&self) -> bool {
        matches!(self, Error::Connect { refused: true, .. })
    }

    /// The HTTP status, for `Http` errors.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Http { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Envoy's server state, as `/ready` reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum ServerState {
    /// 200 `LIVE`.
    Live,
    /// 503 `DRAINING` (after `/healthcheck/fail`, or while draining).
    Draining,
    /// 503 `PRE_INITIALIZING`.
    PreInitializing,
    /// 503 `INITIALIZING`.
    Initializing,
    /// Any other body with status 200 or 503.
    Other { status: u16, body: String },
}

impl ServerState {
    pub fn is_live(&self) -> bool {
        *self == ServerState::Live
    }
}

/// Parsed `/stats` text output.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Counters and gauges, by name.
    pub values: BTreeMap<String, u64>,
    /// Histogram and text-readout lines, skipped.
    pub skipped: usize,
    /// Lines that could not be parsed (at most [`Stats::MAX_MALFORMED_KEPT`] kept; counted in
    /// `malformed_count`).
    pub malformed: Vec<String>,
    pub malformed_count: usize,
}

impl Stats {
    pub const MAX_MALFORMED_KEPT: usize = 10;

    pub fn get(&self, name: &str) -> Option<u64> {
        self.values.get(name).copied()
    }

    /// Parses Envoy's text stats (`name: value` per line). Never fails: bad lines are reported
    /// in `malformed`, histograms and text readouts are skipped.
    pub fn parse(text: &str) -> Stats {
        let mut stats = Stats::default();
        for line in text.lines() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() {
                continue;
            }
            let parsed = line.split_once(": ").and_then(|(name, value)| {
                let name = name.trim();
                (!name.is_empty() && !name.contains(char::is_whitespace))
                    .then_some((name, value.trim()))
            });
            let Some((name, value)) = parsed else {
                stats.note_malformed(line);
                continue;
            };
            if let Ok(number) = value.parse::<u64>() {
                stats.values.insert(name.to_string(), number);
            } else if value.starts_with("P0(")
                || value.starts_with("No recorded values")
                || value.starts_with('"')
            {
                stats.skipped += 1;
            } else {
                stats.note_malformed(line);
            }
        }
        stats
    }

    fn note_malformed(&mut self, line: &str) {
        self.malformed_count += 1;
        if self.malformed.len() < Self::MAX_MALFORMED_KEPT {
            self.malformed.push(line.chars().take(200).collect());
        }
    }
}

/// An HTTP response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Makes a connected, blocking TCP stream to an address within a timeout. Called on a blocking
/// thread.
pub type Connector =
    Arc<dyn Fn(SocketAddr, Duration) -> std::io::Result<std::net::TcpStream> + Send + Sync>;

/// A client for one Envoy's admin API.
#[derive(Clone)]
pub struct AdminClient {
    addr: SocketAddr,
    connector: Connector,
    connect_timeout: Duration,
    response_timeout: Duration,
    max_body: usize,
    errors: Option<
        prometheus_client::metrics::family::Family<
            crate::metrics::KindLabel,
            prometheus_client::metrics::counter::Counter,
        >,
    >,
}

impl std::fmt::Debug for AdminClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminClient")
            .field("addr", &self.addr)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("max_body", &self.max_body)
            .finish()
    }
}

impl AdminClient {
    /// Envoy's admin inside a pod's netns (sockets are created in the netns). Takes a
    /// `PodNetns` or an `Arc<PodNetns>`.
    pub fn in_netns(netns: impl Into<Arc<PodNetns>>, addr: SocketAddr) -> AdminClient {
        let netns: Arc<PodNetns> = netns.into();
        AdminClient::with_connector(
            addr,
            Arc::new(move |addr, timeout| {
                netns.connect_tcp(addr, timeout).map_err(|e| match e {
                    // Keep the kind (TimedOut, ConnectionRefused) for the error mapping.
                    crate::netns::Error::Connect { source, .. } => source,
                    other => std::io::Error::other(other.to_string()),
                })
            }),
        )
    }

    /// Envoy's admin reachable from the agent's own netns (tests, local runs).
    pub fn local(addr: SocketAddr) -> AdminClient {
        AdminClient::with_connector(
            addr,
            Arc::new(|addr, timeout| std::net::TcpStream::connect_timeout(&addr, timeout)),
        )
    }

    /// Any way of connecting (tests).
    pub fn with_connector(addr: SocketAddr, connector: Connector) -> AdminClient {
        AdminClient {
            addr,
            connector,
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(5),
            max_body: 4 << 20,
            errors: None,
        }
    }

    /// Sets the connect and response timeouts.
    pub fn with_timeouts(mut self, connect: Duration, response: Duration) -> AdminClient {
        self.connect_timeout = connect;
        self.response_timeout = response;
        self
    }

    /// Sets both the connect and the response timeout.
    pub fn with_timeout(self, timeout: Duration) -> AdminClient {
        self.with_timeouts(timeout, timeout)
    }

    /// Sets the body cap.
    pub fn with_max_body(mut self, max_body: usize) -> AdminClient {
        self.max_body = max_body;
        self
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `GET /ready`: 200 `LIVE`, 503 with the state otherwise.
    pub async fn ready(&self) -> Result<ServerState> {
        let response = self.request("GET", "/ready").await?;
        let body = response.text();
        let body = body.trim();
        match (response.status, body) {
            (200, "LIVE") => Ok(ServerState::Live),
            (503, "DRAINING") => Ok(ServerState::Draining),
            (503, "PRE_INITIALIZING") => Ok(ServerState::PreInitializing),
            (503, "INITIALIZING") => Ok(ServerState::Initializing),
            (200 | 503, other) => Ok(ServerState::Other {
                status: response.status,
                body: other.chars().take(200).collect(),
            }),
            (status, _) => Err(self.http_error("/ready", status, &response.body)),
        }
    }

    /// `GET /stats[?filter=<regex>]`, parsed. The filter (an RE2 regex) is percent-encoded here.
    pub async fn stats(&self, filter: Option<&str>) -> Result<Stats> {
        self.stats_with(filter, false).await
    }

    /// Like [`stats`](Self::stats); `used_only` adds `usedonly` (stats that were ever updated),
    /// as pilot-agent's drain poll does.
    pub async fn stats_with(&self, filter: Option<&str>, used_only: bool) -> Result<Stats> {
        let mut query = Vec::new();
        if used_only {
            query.push("usedonly".to_string());
        }
        if let Some(regex) = filter {
            query.push(format!("filter={}", percent_encode(regex)));
        }
        let path = if query.is_empty() {
            "/stats".to_string()
        } else {
            format!("/stats?{}", query.join("&"))
        };
        let response = self.request("GET", &path).await?;
        if response.status != 200 {
            return Err(self.http_error(&path, response.status, &response.body));
        }
        let text = std::str::from_utf8(&response.body).map_err(|e| Error::Malformed {
            addr: self.addr,
            reason: format!("/stats body is not UTF-8: {e}"),
        })?;
        let stats = Stats::parse(text);
        if stats.malformed_count > 0 {
            tracing::debug!(addr = %self.addr, count = stats.malformed_count, first = ?stats.malformed.first(), "unparsable /stats lines skipped");
        }
        Ok(stats)
    }

    /// `POST <path>` (e.g. `/drain_listeners?inboundonly&graceful`, `/healthcheck/fail`,
    /// `/quitquitquit`); any non-2xx status is an error.
    pub async fn post(&self, path: &str) -> Result<Response> {
        let response = self.request("POST", path).await?;
        if !(200..300).contains(&response.status) {
            return Err(self.http_error(path, response.status, &response.body));
        }
        Ok(response)
    }

    /// One request on a new connection; any status is returned.
    pub async fn request(&self, method: &str, path: &str) -> Result<Response> {
        let result = self.request_uncounted(method, path).await;
        if let (Err(e), Some(errors)) = (&result, &self.errors) {
            errors
                .get_or_create(&crate::metrics::KindLabel {
                    kind: e.kind().to_string(),
                })
                .inc();
        }
        result
    }

    async fn request_uncounted(&self, method: &str, path: &str) -> Result<Response> {
        let stream = self.connect().await?;
        let exchange = self.exchange(stream, method, path);
        match tokio::time::timeout(self.response_timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(Error::Timeout {
                addr: self.addr,
                what: "response",
                after: self.response_timeout,
            }),
        }
    }

    /// Counts every failed request in `errors`, by [`Error::kind`].
    pub fn with_error_metric(
        mut self,
        errors: prometheus_client::metrics::family::Family<
            crate::metrics::KindLabel,
            prometheus_client::metrics::counter::Counter,
        >,
    ) -> AdminClient {
        self.errors = Some(errors);
        self
    }

    fn http_error(&self, path: &str, status: u16, body: &[u8]) -> Error {
        Error::Http {
            addr: self.addr,
            path: path.to_string(),
            status,
            body: String::from_utf8_lossy(&body[..body.len().min(200)])
                .trim()
                .to_string(),
        }
    }

    async fn connect(&self) -> Result<tokio::net::TcpStream> {
        let connector = self.connector.clone();
        let (addr, timeout) = (self.addr, self.connect_timeout);
        let blocking = tokio::task::spawn_blocking(move || connector(addr, timeout));
        // The connector honours the timeout itself; the margin covers entering the netns.
        let joined = tokio::time::timeout(timeout + Duration::from_millis(500), blocking)
            .await
            .map_err(|_| Error::Timeout {
                addr,
                what: "connect",
                after: timeout,
            })?;
        let connected = joined.map_err(|e| Error::Connect {
            addr,
            reason: format!("connector task failed: {e}"),
            refused: false,
        })?;
        let std_stream = connected.map_err(|e| {
            if e.kind() == std::io::ErrorKind::TimedOut {
                Error::Timeout {
                    addr,
                    what: "connect",
                    after: timeout,
                }
            } else {
                Error::Connect {
                    addr,
                    reason: e.to_string(),
                    refused: e.kind() == std::io::ErrorKind::ConnectionRefused,
                }
            }
        })?;
        let io = |source| Error::Io { addr, source };
        std_stream.set_nonblocking(true).map_err(io)?;
        tokio::net::TcpStream::from_std(std_stream).map_err(io)
    }

    async fn exchange(
        &self,
        mut stream: tokio::net::TcpStream,
        method: &str,
        path: &str,
    ) -> Result<Response> {
        let addr = self.addr;
        let host = match addr {
            SocketAddr::V4(v4) => format!("{}:{}", v4.ip(), v4.port()),
            SocketAddr::V6(v6) => format!("[{}]:{}", v6.ip(), v6.port()),
        };
        let length = if method == "POST" {
            "Content-Length: 0\r\n"
        } else {
            ""
        };
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: holdfast\r\nAccept: */*\r\n{length}Connection: close\r\n\r\n"
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|source| Error::Io { addr, source })?;
        read_response(&mut stream, self.max_body)
            .await
            .map_err(|e| match e {
                ReadError::Io(source) => Error::Io { addr, source },
                ReadError::Malformed(reason) => Error::Malformed { addr, reason },
            })
    }
}

/// Errors while reading a response, before the address is attached.
#[derive(Debug)]
enum ReadError {
    Io(std::io::Error),
    Malformed(String),
}

impl From<std::io::Error> for ReadError {
    fn from(e: std::io::Error) -> Self {
        ReadError::Io(e)
    }
}

/// Buffered reading over an async stream.
struct Reader<'a, R> {
    inner: &'a mut R,
    buf: Vec<u8>,
    pos: usize,
}

impl<R: AsyncRead + Unpin> Reader<'_, R> {
    /// Reads more into the buffer; `false` at end of stream.
    async fn fill(&mut self) -> Result<bool, ReadError> {
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
        let mut chunk = [0u8; 16 * 1024];
        let n = self.inner.read(&mut chunk).await?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }

    /// A line without its `\r\n` (a bare `\n` is tolerated); `None` at end of stream.
    async fn line(&mut self, max: usize) -> Result<Option<Vec<u8>>, ReadError> {
        loop {
            if let Some(nl) = self.buf[self.pos..].iter().position(|&b| b == b'\n') {
                let mut line = self.buf[self.pos..self.pos + nl].to_vec();
                self.pos += nl + 1;
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(Some(line));
            }
            if self.buf.len() - self.pos > max {
                return Err(ReadError::Malformed(format!(
                    "line longer than {max} bytes"
                )));
            }
            if !self.fill().await? {
                return Ok(None);
            }
        }
    }

    /// Exactly `n` bytes, or an error naming what was truncated.
    async fn exact(&mut self, n: usize, what: &str) -> Result<Vec<u8>, ReadError> {
        while self.buf.len() - self.pos < n {
            if !self.fill().await? {
                return Err(ReadError::Malformed(format!(
                    "truncated {what}: connection closed after {} of {n} bytes",
                    self.buf.len() - self.pos
                )));
            }
        }
        let out = self.buf[self.pos..self.pos + n].to_vec();
        self.pos += n;
        Ok(out)
    }

    /// Everything until the peer closes, at most `max` bytes.
    async fn read_to_close(&mut self, max: usize) -> Result<Vec<u8>, ReadError> {
        loop {
            if self.buf.len() - self.pos > max {
                return Err(ReadError::Malformed(format!(
                    "body larger than {max} bytes"
                )));
            }
            if !self.fill().await? {
                return Ok(self.buf[self.pos..].to_vec());
            }
        }
    }
}

async fn read_response<R: AsyncRead + Unpin>(
    stream: &mut R,
    max_body: usize,
) -> Result<Response, ReadError> {
    let mut reader = Reader {
        inner: stream,
        buf: Vec::with_capacity(16 * 1024),
        pos: 0,
    };
    let status_line = reader.line(MAX_HEADER_BYTES).await?.ok_or_else(|| {
        ReadError::Malformed("connection closed before the status line".to_string())
    })?;
    let status = parse_status_line(&status_line)?;

    let mut content_length: Option<usize> = None;
    let mut chunked = false;
    let mut header_bytes = 0;
    loop {
        let line = reader.line(MAX_HEADER_BYTES).await?.ok_or_else(|| {
            ReadError::Malformed("connection closed inside the headers".to_string())
        })?;
        if line.is_empty() {
            break;
        }
        header_bytes += line.len();
        if header_bytes > MAX_HEADER_BYTES {
            return Err(ReadError::Malformed(format!(
                "headers larger than {MAX_HEADER_BYTES} bytes"
            )));
        }
        let line = String::from_utf8_lossy(&line);
        let Some((name, value)) = line.split_once(':') else {
            return Err(ReadError::Malformed(format!(
                "header line without a colon: {:.100}",
                line
            )));
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let length = value
                .parse::<usize>()
                .map_err(|_| ReadError::Malformed(format!("bad Content-Length {value:.40}")))?;
            if content_length.is_some_and(|l| l != length) {
                return Err(ReadError::Malformed(
                    "conflicting Content-Length headers".to_string(),
                ));
            }
            content_length = Some(length);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value
                .rsplit(',')
                .next()
                .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        }
    }

    let no_body = status == 204 || status == 304 || (100..200).contains(&status);
    let body = if no_body {
        Vec::new()
    } else if chunked {
        read_chunked(&mut reader, max_body).await?
    } else if let Some(length) = content_length {
        if length > max_body {
            return Err(ReadError::Malformed(format!(
                "body of {length} bytes exceeds the {max_body} byte cap"
            )));
        }
        reader.exact(length, "body").await?
    } else {
        reader.read_to_close(max_body).await?
    };
    Ok(Response { status, body })
}

fn parse_status_line(line: &[u8]) -> Result<u16, ReadError> {
    let text = String::from_utf8_lossy(line);
    let mut parts = text.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let code = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(ReadError::Malformed(format!(
            "not an HTTP/1.x status line: {:.100}",
            text
        )));
    }
    match code.parse::<u16>() {
        Ok(status) if (100..=999).contains(&status) => Ok(status),
        _ => Err(ReadError::Malformed(format!(
            "bad status code in: {:.100}",
            text
        ))),
    }
}

async fn read_chunked<R: AsyncRead + Unpin>(
    reader: &mut Reader<'_, R>,
    max_body: usize,
) -> Result<Vec<u8>, ReadError> {
    let mut body = Vec::new();
    loop {
        let size_line = reader.line(1024).await?.ok_or_else(|| {
            ReadError::Malformed("truncated chunked body: no chunk size".to_string())
        })?;
        let size_text = String::from_utf8_lossy(&size_line);
        let size_hex = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| ReadError::Malformed(format!("bad chunk size {size_hex:.40}")))?;
        if size == 0 {
            // Trailers until the empty line; a close right after the last chunk is tolerated.
            while let Some(line) = reader.line(MAX_HEADER_BYTES).await? {
                if line.is_empty() {
                    break;
                }
            }
            return Ok(body);
        }
        if body.len().saturating_add(size) > max_body {
            return Err(ReadError::Malformed(format!(
                "chunked body exceeds the {max_body} byte cap"
            )));
        }
        body.extend(reader.exact(size, "chunk").await?);
        match reader.line(2).await? {
            Some(empty) if empty.is_empty() => {}
            _ => {
                return Err(ReadError::Malformed(
                    "chunk not followed by CRLF".to_string(),
                ))
            }
        }
    }
}

/// Percent-encodes a query value (everything but RFC 3986 unreserved characters).
fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len() * 3);
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_parse_tolerates_garbage() {
        let text = "cluster_manager.cds.update_success: 3\n\
                    server.state: 0\n\
                    listener_manager.workers_started: 1\n\
                    cluster.x.upstream_cx_length_ms: P0(nan,0) P25(nan,0)\n\
                    http.admin.downstream_rq_time: No recorded values\n\
                    server.version_text: \"1.40.0\"\n\
                    garbage without colon\n\
                    bad.value: -1\n\
                    : 5\n\
                    \n";
        let stats = Stats::parse(text);
        assert_eq!(stats.get("cluster_manager.cds.update_success"), Some(3));
        assert_eq!(stats.get("server.state"), Some(0));
        assert_eq!(stats.values.len(), 3);
        assert_eq!(stats.skipped, 3);
        assert_eq!(stats.malformed_count, 3, "{stats:?}");
    }

    #[test]
    fn percent_encoding() {
        assert_eq!(
            percent_encode("downstream_cx_active$"),
            "downstream_cx_active%24"
        );
        assert_eq!(percent_encode("^a.b|c"), "%5Ea.b%7Cc");
    }

    #[tokio::test]
    async fn parses_chunked_and_length() {
        let mut raw: &[u8] =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nLIVE\r\n0\r\n\r\n";
        let r = read_response(&mut raw, 100).await.expect("chunked");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"LIVE"[..]));
        let mut raw: &[u8] =
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 8\r\n\r\nDRAINING";
        let r = read_response(&mut raw, 100).await.expect("length");
        assert_eq!((r.status, r.text().as_str()), (503, "DRAINING"));
        let mut raw: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nLIVE";
        assert!(matches!(
            read_response(&mut raw, 100).await,
            Err(ReadError::Malformed(_))
        ));
        let mut raw: &[u8] = b"\x00\x01garbage\r\n\r\n";
        assert!(matches!(
            read_response(&mut raw, 100).await,
            Err(ReadError::Malformed(_))
        ));
        let mut raw: &[u8] = b"";
        assert!(matches!(
            read_response(&mut raw, 100).await,
            Err(ReadError::Malformed(_))
        ));
    }
}
