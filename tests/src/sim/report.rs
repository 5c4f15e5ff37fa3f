//! The apps' machine-readable reports: one JSON object per line, appended by the app (`sim-app`)
//! and read by tests, benchmarks and the demo, so success and failure are counted from what the
//! app itself saw, never inferred from the node.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Wall-clock milliseconds since the Unix epoch: comparable between the app and the test process.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Wall-clock microseconds since the Unix epoch (for latencies of a few ms between processes).
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// When in the app's life a call was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Calls the app makes before it considers itself started (e.g. fetching config at boot).
    Startup,
    /// Calls while running normally (before SIGTERM).
    Running,
    /// Calls after the app received SIGTERM.
    AfterSigterm,
}

/// The protocol of an [`AppEvent::HttpCall`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HttpProto {
    Http1,
    Http2,
}

/// What an app's pooled HTTP calls of one protocol saw in some phases.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpTally {
    pub ok: u32,
    pub failed: u32,
    /// Responses with `Connection: close` (HTTP/1.1), or calls that ended with a GOAWAY on
    /// their connection (HTTP/2).
    pub closing: u32,
    /// HTTP/2 GOAWAY frames received in all (0 for HTTP/1.1).
    pub goaways: u32,
    /// Connections the app opened in all (the whole run).
    pub connections: u32,
}

/// Why a call failed, as the app's socket reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CallError {
    /// `connect()` got ECONNREFUSED: nothing listened on the (redirected) port.
    ConnectionRefused,
    /// The connection was reset or aborted (ECONNRESET, EPIPE, ECONNABORTED).
    ConnectionReset,
    /// No answer within the call timeout.
    Timeout,
    /// The peer closed the connection before answering (EOF).
    Closed,
    /// The answer was not the expected one.
    BadResponse,
    /// Anything else.
    Other,
}

impl CallError {
    /// Classifies an I/O error the way an operator reads it.
    pub fn from_io(e: &io::Error) -> CallError {
        match e.kind() {
            io::ErrorKind::ConnectionRefused => CallError::ConnectionRefused,
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted => CallError::ConnectionReset,
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => CallError::Timeout,
            io::ErrorKind::UnexpectedEof => CallError::Closed,
            _ => CallError::Other,
        }
    }
}

/// One line of an app report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum AppEvent {
    /// The app process started (`at_us`: the same instant in µs; absent in older reports).
    Start {
        at_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at_us: Option<u64>,
        pid: u32,
    },
    /// One outbound request/response call to a remote service, recorded when it ended
    /// (`at_us`: the same instant in µs; absent in older reports).
    Call {
        at_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at_us: Option<u64>,
        phase: Phase,
        ok: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<CallError>,
        latency_ms: u64,
        /// When `connect()` returned (µs since the epoch), for calls on a fresh connection: the
        /// end of a held connect, apart from the request/response through Envoy after it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        connected_us: Option<u64>,
    },
    /// A name lookup through the system resolver (getaddrinfo), recorded when it ended.
    Lookup {
        at_ms: u64,
        name: String,
        ok: bool,
        /// The address used (of the family the app calls), when `ok`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        addr: Option<String>,
        /// The resolver's error text, when not `ok`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        latency_ms: u64,
    },
    /// One HTTP request on a pooled connection ([`super::http_calls`]), recorded when it ended.
    HttpCall {
        at_ms: u64,
        proto: HttpProto,
        phase: Phase,
        ok: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<CallError>,
        latency_ms: u64,
        /// Ordinal of the connection the call used (1 = the first the app opened).
        connection: u32,
        /// HTTP/1.1: the response said `Connection: close`; HTTP/2: a GOAWAY had arrived on the
        /// connection by the end of the call. Either way the app must open a new connection.
        closing: bool,
        /// HTTP/2 GOAWAY frames received so far, on every connection (0 for HTTP/1.1).
        goaways: u32,
    },
    /// One inbound request the app served.
    Served { at_ms: u64 },
    /// The app received SIGTERM.
    Sigterm { at_ms: u64 },
    /// The app is about to exit with this code.
    Exit { at_ms: u64, code: i32 },
}

/// Appends events to a report file; one `write` per line (O_APPEND), so threads may share it.
#[derive(Debug)]
pub struct ReportWriter {
    file: Mutex<File>,
}

impl ReportWriter {
    /// Opens (creating) the report at `path` for appending.
    pub fn open(path: &Path) -> io::Result<ReportWriter> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(ReportWriter {
            file: Mutex::new(file),
        })
    }

    /// Appends one event. A report that cannot be written is reported on stderr, not fatal: the
    /// app's behaviour must not change because its report failed.
    pub fn record(&self, event: &AppEvent) {
        let mut line = match serde_json::to_string(event) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("report: cannot encode {event:?}: {e}");
                return;
            }
        };
        line.push('\n');
        let mut file = match self.file.lock() {
            Ok(f) => f,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Err(e) = file.write_all(line.as_bytes()) {
            eprintln!("report: cannot append: {e}");
        }
    }
}

/// Errors reading a report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot read app report {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("app report {path} line {line}: {source} (expected one JSON event per line, as sim-app writes)")]
    Parse {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
}

/// Successes and failures of a set of calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallCounts {
    pub ok: u32,
    pub failed: u32,
    pub by_error: BTreeMap<CallError, u32>,
}

impl CallCounts {
    /// Failures of one kind.
    pub fn errors(&self, kind: CallError) -> u32 {
        self.by_error.get(&kind).copied().unwrap_or(0)
    }
}

/// An app's report, parsed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppReport {
    pub events: Vec<AppEvent>,
}

impl AppReport {
    /// Reads a report; a missing file is an empty report (the app has not started yet). A last
    /// line without its newline is still being written and is left out.
    pub fn read(path: &Path) -> Result<AppReport, ReportError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(AppReport::default()),
            Err(source) => {
                return Err(ReportError::Read {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        AppReport::parse(&text).map_err(|(line, source)| ReportError::Parse {
            path: path.to_path_buf(),
            line,
            source,
        })
    }

    /// Parses report text; the error carries the 1-based line number.
    pub fn parse(text: &str) -> Result<AppReport, (usize, serde_json::Error)> {
        let complete = match text.rfind('\n') {
            Some(i) => &text[..=i],
            None => "",
        };
        let mut events = Vec::new();
        for (i, line) in complete.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            events.push(serde_json::from_str(line).map_err(|e| (i + 1, e))?);
        }
        Ok(AppReport { events })
    }

    /// Tallies the pooled HTTP calls of `proto` made in any of `phases`; `connections` and
    /// `goaways` count the whole run (a connection opened before the phase and kept is one).
    pub fn http(&self, proto: HttpProto, phases: &[Phase]) -> HttpTally {
        let mut t = HttpTally::default();
        for e in &self.events {
            if let AppEvent::HttpCall {
                proto: p,
                phase,
                ok,
                connection,
                closing,
                goaways,
                ..
            } = e
            {
                if *p != proto {
                    continue;
                }
                t.connections = t.connections.max(*connection);
                t.goaways = t.goaways.max(*goaways);
                if phases.contains(phase) {
                    if *ok {
                        t.ok += 1;
                    } else {
                        t.failed += 1;
                    }
                    t.closing += u32::from(*closing);
                }
            }
        }
        t
    }

    /// Counts calls made in `phase`.
    pub fn calls(&self, phase: Phase) -> CallCounts {
        self.count(|p, _| p == phase)
    }

    /// Counts every call.
    pub fn all_calls(&self) -> CallCounts {
        self.count(|_, _| true)
    }

    fn count(&self, keep: impl Fn(Phase, u64) -> bool) -> CallCounts {
        let mut c = CallCounts::default();
        for e in &self.events {
            if let AppEvent::Call {
                at_ms,
                phase,
                ok,
                error,
                ..
            } = e
            {
                if !keep(*phase, *at_ms) {
                    continue;
                }
                if *ok {
                    c.ok += 1;
                } else {
                    c.failed += 1;
                    *c.by_error
                        .entry(error.unwrap_or(CallError::Other))
                        .or_default() += 1;
                }
            }
        }
        c
    }

    /// When the app started (first start event; a restarted container appends to the same report).
    pub fn started_at_ms(&self) -> Option<u64> {
        self.events.iter().find_map(|e| match e {
            AppEvent::Start { at_ms, .. } => Some(*at_ms),
            _ => None,
        })
    }

    /// The app's name lookups: (ok, latency in ms, address or error), in order.
    pub fn lookups(&self) -> Vec<(bool, u64, String)> {
        self.events
            .iter()
            .filter_map(|e| match e {
                AppEvent::Lookup {
                    ok,
                    latency_ms,
                    addr,
                    error,
                    ..
                } => Some((
                    *ok,
                    *latency_ms,
                    addr.clone().or_else(|| error.clone()).unwrap_or_default(),
                )),
                _ => None,
            })
            .collect()
    }

    /// How many times the app process started (restarts included).
    pub fn starts(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, AppEvent::Start { .. }))
            .count()
    }

    /// When the app received SIGTERM.
    pub fn sigterm_at_ms(&self) -> Option<u64> {
        self.events.iter().find_map(|e| match e {
            AppEvent::Sigterm { at_ms } => Some(*at_ms),
            _ => None,
        })
    }

    /// The exit codes the app reported, in order (one per run).
    pub fn exit_codes(&self) -> Vec<i32> {
        self.events
            .iter()
            .filter_map(|e| match e {
                AppEvent::Exit { code, .. } => Some(*code),
                _ => None,
            })
            .collect()
    }

    /// When the app last reported its exit.
    pub fn exited_at_ms(&self) -> Option<u64> {
        self.events.iter().rev().find_map(|e| match e {
            AppEvent::Exit { at_ms, .. } => Some(*at_ms),
            _ => None,
        })
    }

    /// Time from SIGTERM to the first failed call after it.
    pub fn first_failure_after_sigterm(&self) -> Option<Duration> {
        let term = self.sigterm_at_ms()?;
        self.events.iter().find_map(|e| match e {
            AppEvent::Call {
                at_ms,
                phase: Phase::AfterSigterm,
                ok: false,
                ..
            } => Some(Duration::from_millis(at_ms.saturating_sub(term))),
            _ => None,
        })
    }

    /// Inbound requests served.
    pub fn served(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, AppEvent::Served { .. }))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_counts_and_skips_partial_last_line() {
        let text = concat!(
            r#"{"event":"start","at_ms":1000,"pid":7}"#,
            "\n",
            r#"{"event":"call","at_ms":1001,"phase":"startup","ok":false,"error":"ConnectionRefused","latency_ms":0}"#,
            "\n",
            r#"{"event":"sigterm","at_ms":2000}"#,
            "\n",
            r#"{"event":"call","at_ms":2500,"phase":"after_sigterm","ok":true,"latency_ms":1}"#,
            "\n",
            r#"{"event":"call","at_ms":7100,"phase":"after_sigterm","ok":false,"error":"ConnectionReset","latency_ms":1}"#,
            "\n",
            r#"{"event":"exit","at_ms":8000,"code":0}"#,
            "\n",
            r#"{"event":"ca"#,
        );
        let r = AppReport::parse(text).expect("valid report");
        assert_eq!(r.events.len(), 6);
        assert_eq!(
            r.calls(Phase::Startup).errors(CallError::ConnectionRefused),
            1
        );
        let after = r.calls(Phase::AfterSigterm);
        assert_eq!((after.ok, after.failed), (1, 1));
        assert_eq!(
            r.first_failure_after_sigterm(),
            Some(Duration::from_millis(5100))
        );
        assert_eq!(r.exit_codes(), vec![0]);
    }

    #[test]
    fn bad_line_names_its_number() {
        let err = AppReport::parse("{\"event\":\"start\",\"at_ms\":1,\"pid\":1}\nnot json\n")
            .expect_err("line 2 is not JSON");
        assert_eq!(err.0, 2);
    }
}
