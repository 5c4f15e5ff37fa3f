//! The agent's log writer: every line it writes is one line, whatever a pod put in it.
//!
//! Log fields quote pods (a skip reason naming a container's args, a problem quoting an
//! annotation or what a pod's Envoy answered). The text format writes field values as they are,
//! so a CR or LF in one forged a whole log line; the JSON format escapes C0 controls but writes
//! C1 controls and bidi overrides raw (issue 29). [`OneLineLog`] wraps the writer and escapes
//! them in each formatted event (tracing-subscriber's fmt layer formats one event into a buffer
//! and hands it over in one `write_all`, ending with its newline): the text format gets
//! [`escape_controls`], the JSON format [`escape_json_document`] (the line still parses, to the
//! same values). The strings are cut before they reach a log ([`crate::api::text::pod_text`]);
//! this is the last line of defence for what is not.

use std::io::{self, Write};

use crate::api::text::{escape_controls, escape_json_document};

/// The log's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// A writer of formatted log events that keeps each event on one line (see the module).
pub struct OneLineLog<W> {
    inner: W,
    format: LogFormat,
}

impl<W: Write> OneLineLog<W> {
    pub fn new(inner: W, format: LogFormat) -> Self {
        OneLineLog { inner, format }
    }
}

impl<W: Write> Write for OneLineLog<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let (body, newline) = match text.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (&*text, ""),
        };
        let safe = match self.format {
            LogFormat::Text => escape_controls(body),
            LogFormat::Json => escape_json_document(body),
        };
        // One write of the whole line: stderr locks per call, so two threads' lines never mix.
        let mut line = String::with_capacity(safe.len() + 1);
        line.push_str(&safe);
        line.push_str(newline);
        self.inner.write_all(line.as_bytes())?;
        // All of `buf` is handled: the caller must not hand any of it again.
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer the test can read back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);
    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// What the agent's subscriber (main.rs `init_logging`) writes for one event whose field
    /// carries a forged line, a C1 control and a bidi override.
    fn log_one(format: LogFormat) -> String {
        let out = Captured::default();
        let make = {
            let out = out.clone();
            move || OneLineLog::new(out.clone(), format)
        };
        let builder = tracing_subscriber::fmt().with_writer(make).with_ansi(false);
        let reason = "gateway\r\n2026-01-01T00:00:00Z  INFO holdfast: all pods healthy \u{9b}2J \u{202e}lamron";
        let emit = || tracing::info!(%reason, "pod has the proxy container but is not tracked");
        match format {
            LogFormat::Text => tracing::subscriber::with_default(builder.finish(), emit),
            LogFormat::Json => tracing::subscriber::with_default(builder.json().finish(), emit),
        }
        let bytes = out.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn a_text_log_line_cannot_be_forged() {
        let out = log_one(LogFormat::Text);
        assert_eq!(out.matches('\n').count(), 1, "one event, one line: {out:?}");
        assert!(out.ends_with('\n'));
        assert!(out.contains("gateway\\u{d}\\u{a}2026"), "{out:?}");
        assert!(!out
            .trim_end_matches('\n')
            .chars()
            .any(crate::api::text::is_unsafe_char));
    }

    #[test]
    fn a_json_log_line_has_no_raw_c1_or_bidi_and_means_the_same() {
        let out = log_one(LogFormat::Json);
        assert_eq!(out.matches('\n').count(), 1, "{out:?}");
        assert!(
            !out.trim_end_matches('\n')
                .chars()
                .any(crate::api::text::is_unsafe_char),
            "{out:?}"
        );
        let line: serde_json::Value = serde_json::from_str(out.trim_end()).unwrap();
        let reason = line["fields"]["reason"].as_str().unwrap();
        assert!(reason.contains('\u{9b}') && reason.contains('\u{202e}'));
    }

    /// Without the wrapper, the text format writes the forged line: the test above can fail.
    #[test]
    fn without_it_the_text_log_is_forged() {
        let out = Captured::default();
        let make = {
            let out = out.clone();
            move || out.clone()
        };
        let sub = tracing_subscriber::fmt()
            .with_writer(make)
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(sub, || tracing::info!(reason = %"a\r\nb", "x"));
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.matches('\n').count(), 2, "{text:?}");
    }
}
