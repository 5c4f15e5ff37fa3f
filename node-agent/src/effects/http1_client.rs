//! The one HTTP/1.1 client of the agent and its CLI, on `hyper::client::conn::http1`: used for
//! Envoy's admin API ([`crate::effects::envoy_admin`], a kept-alive connection per pod over a socket made
//! in the pod's netns), by `holdfast status --agent` ([`crate::cli::status`]) and by
//! `holdfast status --node` over a port-forward stream ([`crate::cli::remote`]).
//!
//! The caller brings a connected stream (so it decides the netns and the connect timeout);
//! this module does the handshake, one request at a time, the body cap
//! (`http_body_util::Limited`, plus a check of a declared `Content-Length` before reading) and
//! sorts failures into the kinds the callers report. Timeouts are the caller's (it wraps the
//! exchange in `tokio::time::timeout`).

#![forbid(unsafe_code)]

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::client::conn::http1::{Builder, SendRequest};
use hyper_util::rt::TokioIo;

/// Largest response head accepted (hyper's read buffer).
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// A connection ready for requests (one at a time). Dropping it closes the connection.
pub(crate) struct Connection {
    sender: SendRequest<Empty<Bytes>>,
}

/// A complete response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    pub status: hyper::StatusCode,
    pub body: Vec<u8>,
}

/// Why an exchange failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The request was not written (the connection was found closed first): safe to retry on a
    /// new connection, whatever the method.
    NotSent(String),
    /// The peer closed or reset the connection after the request was written, before the
    /// answer was complete.
    Closed(String),
    /// The answer is not valid HTTP/1.x, or is truncated mid-body.
    Malformed(String),
    /// The answer's body is larger than the cap (declared, or read up to the cap): nothing
    /// more was read.
    TooLarge(String),
    /// Another I/O error.
    Io(std::io::Error),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::NotSent(why) => write!(f, "request not sent: {why}"),
            Failure::Closed(why) => write!(f, "connection closed before the answer: {why}"),
            Failure::Malformed(why) | Failure::TooLarge(why) => f.write_str(why),
            Failure::Io(e) => write!(f, "{e}"),
        }
    }
}

impl Connection {
    /// HTTP/1.1 over `stream`; the connection's driver runs as a tokio task that ends when the
    /// connection does (peer close, or this value dropped).
    /// `stream` is a `TcpStream` (admin client, `holdfast status --agent`) or a port-forward
    /// stream through the API server (`holdfast status --node`).
    pub(crate) async fn handshake<S>(stream: S) -> Result<Connection, Failure>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, driver) = Builder::new()
            // Requests as curl writes them (`Content-Length`, not `content-length`).
            .title_case_headers(true)
            .max_buf_size(MAX_HEAD_BYTES)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| classify(&e))?;
        tokio::spawn(async move {
            // Errors surface on the request that was in flight; nothing to add here.
            let _ = driver.await;
        });
        Ok(Connection { sender })
    }

    /// Whether the peer has closed the connection (a new one is needed).
    pub(crate) fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// One request without a body; the answer's body is read whole, at most `max_body` bytes.
    pub(crate) async fn exchange(
        &mut self,
        method: hyper::Method,
        path: &str,
        host: &str,
        headers: &[(&'static str, &str)],
        max_body: usize,
    ) -> Result<Answer, Failure> {
        let mut builder = hyper::Request::builder()
            .method(method.clone())
            .uri(path)
            .header(hyper::header::HOST, host);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        if method == hyper::Method::POST {
            builder = builder.header(hyper::header::CONTENT_LENGTH, "0");
        }
        let request = builder
            .body(Empty::<Bytes>::new())
            .map_err(|e| Failure::Malformed(format!("cannot build the request: {e}")))?;
        if self.sender.ready().await.is_err() {
            return Err(Failure::NotSent("the connection is closed".into()));
        }
        let response = match self.sender.try_send_request(request).await {
            Ok(response) => response,
            Err(mut e) => {
                let not_sent = e.take_message().is_some();
                let failure = classify(e.error());
                return Err(if not_sent {
                    Failure::NotSent(failure.to_string())
                } else {
                    failure
                });
            }
        };
        let status = response.status();
        let declared = response
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
        if let Some(length) = declared.filter(|&l| l > max_body as u64) {
            return Err(Failure::TooLarge(format!(
                "body of {length} bytes exceeds the {max_body} byte cap"
            )));
        }
        let body = Limited::new(response.into_body(), max_body)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    Failure::TooLarge(format!("body larger than the {max_body} byte cap"))
                } else if let Some(h) = e.downcast_ref::<hyper::Error>() {
                    match classify(h) {
                        // A body cut short is a truncated answer, not a refused request.
                        Failure::Closed(why) => Failure::Closed(format!("truncated body: {why}")),
                        other => other,
                    }
                } else {
                    Failure::Malformed(e.to_string())
                }
            })?
            .to_bytes()
            .to_vec();
        Ok(Answer { status, body })
    }
}

/// A hyper error and its causes, as one line.
fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Sorts a hyper error: bad HTTP, a close mid-exchange, or another I/O error.
fn classify(e: &hyper::Error) -> Failure {
    let text = describe(e);
    if e.is_parse() || e.is_parse_status() || e.is_parse_too_large() {
        return Failure::Malformed(text);
    }
    if e.is_incomplete_message() || e.is_canceled() || e.is_closed() {
        return Failure::Closed(text);
    }
    // An I/O error among the causes: decoding errors (bad chunk size) are InvalidInput /
    // InvalidData, a reset is ConnectionReset, ...
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::InvalidInput
                | std::io::ErrorKind::InvalidData
                | std::io::ErrorKind::UnexpectedEof => Failure::Malformed(text),
                std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe => Failure::Closed(text),
                kind => Failure::Io(std::io::Error::new(kind, text)),
            };
        }
        source = cause.source();
    }
    Failure::Malformed(text)
}
