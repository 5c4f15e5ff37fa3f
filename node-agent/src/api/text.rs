//! Text a pod controls, made safe to show: cut to a bound (and the cut said), and every
//! character that can forge or hide output escaped.
//!
//! A pod's author writes its names, annotations, env values and container args, and its Envoy
//! writes its admin answers; any of them can reach a status row, a log line or an Event. Two
//! harms follow (issue 29): size (a few large pods pushed `/status` past the CLI's 16 MiB cap, so
//! `holdfast status` stopped working for the whole node) and control characters (CR/LF forge
//! text log lines; C1 controls drive terminals; bidi overrides make a line read other than it
//! is, CVE-2021-42574 "Trojan Source"). Every pod-controlled string goes through [`pod_text`]
//! before it is stored or logged; JSON documents and JSON log lines go through
//! [`escape_json_document`], which the JSON encoders do not do themselves (serde_json escapes
//! only C0 controls, `"` and `\`).

use std::borrow::Cow;

/// The most bytes of one pod-controlled string kept on a row or in a log line (a problem, a
/// skip reason). A row has a handful of such strings and at most
/// [`crate::api::timeline::MAX_STEPS`] step details of at most 300 characters, so one pod's row
/// stays within a few tens of KiB whatever the pod says.
pub const MAX_POD_TEXT: usize = 1024;

/// Whether `c` must not reach an operator's terminal or log raw: C0 controls (CR, LF, ESC...),
/// DEL, C1 controls (U+0080–U+009F: CSI, NEL...), the Unicode line and paragraph separators,
/// and the bidirectional formatting characters (Unicode TR9: LRE, RLE, PDF, LRO, RLO, LRI, RLI,
/// FSI, PDI, LRM, RLM, ALM).
pub fn is_unsafe_char(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{1f}'
        | '\u{7f}'..='\u{9f}'
        | '\u{2028}' | '\u{2029}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}'
        | '\u{200e}' | '\u{200f}' | '\u{061c}')
}

/// `s` with every [`is_unsafe_char`] written as `\u{..}` (visible, one line), borrowed when
/// there is none.
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if is_unsafe_char(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `s` cut to at most `max` bytes on a character boundary, with the cut said
/// (`… [N bytes cut]`), borrowed when it fits.
pub fn cut(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}… [{} bytes cut]", &s[..end], s.len() - end))
}

/// A pod-controlled string made fit for a row, a log line or an Event: cut to
/// [`MAX_POD_TEXT`] bytes (cut first, so escaping cannot multiply an unbounded input), then its
/// unsafe characters escaped. The result is at most about 10× [`MAX_POD_TEXT`] (every byte an
/// escaped control), and in practice its length.
pub fn pod_text(s: &str) -> String {
    escape_controls(&cut(s, MAX_POD_TEXT)).into_owned()
}

/// A JSON document with every [`is_unsafe_char`] that serde_json leaves raw (DEL, C1 controls,
/// U+2028/U+2029, bidi controls) written as a JSON `\uXXXX` escape. Outside strings JSON allows
/// only ASCII whitespace and punctuation, so every such character is inside a string and the
/// escaped document means exactly the same. Borrowed when there is none.
pub fn escape_json_document(json: &str) -> Cow<'_, str> {
    let raw = |c: char| is_unsafe_char(c) && c as u32 >= 0x7f;
    if !json.chars().any(raw) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if raw(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_says_how_much_it_cut_and_keeps_whole_characters() {
        assert_eq!(cut("short", 10), "short");
        let s = "é".repeat(10); // 20 bytes
        let c = cut(&s, 5);
        assert_eq!(c, "éé… [16 bytes cut]");
        assert!(matches!(cut("abc", 3), Cow::Borrowed(_)));
    }

    #[test]
    fn pod_text_is_bounded_and_one_line() {
        let hostile = format!(
            "x\r\nFAKE level=error\u{1b}[31m\u{9b}2J\u{202e}txt{}",
            "y".repeat(100_000)
        );
        let t = pod_text(&hostile);
        assert!(t.len() < MAX_POD_TEXT + 200, "{}", t.len());
        assert!(t.contains("bytes cut]"));
        assert!(!t.chars().any(is_unsafe_char), "{t:?}");
        assert!(t.starts_with("x\\u{d}\\u{a}FAKE level=error\\u{1b}[31m\\u{9b}2J\\u{202e}txt"));
        // Worst case: every byte a control, escaped after the cut.
        let worst = pod_text(&"\n".repeat(1 << 20));
        assert!(worst.len() <= 7 * MAX_POD_TEXT + 64, "{}", worst.len());
        assert_eq!(pod_text("plain"), "plain");
    }

    #[test]
    fn a_json_document_keeps_its_meaning_and_loses_its_raw_controls() {
        let value = serde_json::json!({"a": "x\u{85}y\u{202e}z\u{2066}\u{7f}", "b": "é\n"});
        let raw = serde_json::to_string(&value).unwrap();
        assert!(raw.contains('\u{85}'), "serde_json leaves C1 raw: {raw:?}");
        let safe = escape_json_document(&raw);
        assert!(!safe.chars().any(is_unsafe_char), "{safe:?}");
        assert!(safe.contains("\\u0085") && safe.contains("\\u202e"));
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back, value);
        assert!(matches!(
            escape_json_document("{\"a\":\"é\"}"),
            Cow::Borrowed(_)
        ));
    }
}
