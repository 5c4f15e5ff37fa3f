//! Just enough PromQL to say which series a query reads: a tokenizer (Prometheus'
//! promql/parser/lex.go token classes: identifiers, strings, numbers and durations, operators)
//! and, from its tokens, every vector selector (metric name and label matchers) and every
//! grouping label (`by`, `without`, `on`, `ignoring`, `group_left`, `group_right`). Not a
//! parser: it does not need to know what a query computes, only what it names.
//!
//! Grafana's variables (`$node`, `${node}`, `$__rate_interval`) are tokens of their own, so a
//! dashboard's queries read as they are written.

use anyhow::{bail, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    /// A metric name, label name, function, aggregation or keyword.
    Ident(String),
    /// A string literal, unquoted (escapes kept as written: label values here need none).
    Str(String),
    /// A number or duration (`0.8`, `5m`, `1h30m`, `1e3`).
    Number(String),
    /// A Grafana variable (`$node`, `${node}`, `$__rate_interval`).
    Var(String),
    /// `( ) { } [ ] ,`
    Punct(char),
    /// `= != =~ !~ == > < >= <= + - * / % ^ @ :`
    Op(String),
}

/// The tokens of `query`, or an error naming the offset of what cannot start a token.
pub fn tokenize(query: &str) -> Result<Vec<Token>> {
    let chars: Vec<char> = query.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    // Inside `[...]` a `:` is a subquery's colon (lex.go: bracketOpen), elsewhere it may
    // start a recording rule's name.
    let mut in_brackets = false;
    let is_ident_start = |c: char, in_brackets: bool| {
        c.is_ascii_alphabetic() || c == '_' || (c == ':' && !in_brackets)
    };
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if is_ident_start(c, in_brackets) {
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            // `inf` and `nan` are numbers.
            if matches!(word.to_ascii_lowercase().as_str(), "inf" | "nan") {
                out.push(Token::Number(word));
            } else {
                out.push(Token::Ident(word));
            }
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            let start = i;
            while i < chars.len() {
                let ch = chars[i];
                // An exponent's sign (1e-3), after a mantissa of digits and a dot only.
                let exponent_sign = matches!(ch, '+' | '-')
                    && matches!(chars[i - 1], 'e' | 'E')
                    && chars[start..i - 1]
                        .iter()
                        .all(|c| c.is_ascii_digit() || *c == '.');
                if ch.is_ascii_alphanumeric() || ch == '.' || exponent_sign {
                    i += 1;
                } else {
                    break;
                }
            }
            out.push(Token::Number(chars[start..i].iter().collect()));
        } else if matches!(c, '"' | '\'' | '`') {
            let quote = c;
            i += 1;
            let start = i;
            while i < chars.len() && chars[i] != quote {
                if chars[i] == '\\' && quote != '`' {
                    i += 1;
                }
                i += 1;
            }
            if i >= chars.len() {
                bail!("unterminated string starting at offset {}", start - 1);
            }
            out.push(Token::Str(chars[start..i].iter().collect()));
            i += 1;
        } else if c == '$' {
            i += 1;
            let name: String = if chars.get(i) == Some(&'{') {
                let start = i + 1;
                while i < chars.len() && chars[i] != '}' {
                    i += 1;
                }
                if i >= chars.len() {
                    bail!("unterminated ${{...}} at offset {}", start - 2);
                }
                i += 1;
                chars[start..i - 1].iter().collect()
            } else {
                let start = i;
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
                chars[start..i].iter().collect()
            };
            if name.is_empty() {
                bail!("a lone $ at offset {}", i - 1);
            }
            out.push(Token::Var(name));
        } else if matches!(c, '(' | ')' | '{' | '}' | '[' | ']' | ',') {
            match c {
                '[' => in_brackets = true,
                ']' => in_brackets = false,
                _ => {}
            }
            out.push(Token::Punct(c));
            i += 1;
        } else {
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            let op = match two.as_str() {
                "!=" | "=~" | "!~" | "==" | ">=" | "<=" => two,
                _ if "=<>+-*/%^@:".contains(c) => c.to_string(),
                _ => bail!("unexpected {c:?} at offset {i} in {query:?}"),
            };
            i += op.len();
            out.push(Token::Op(op));
        }
    }
    Ok(out)
}

/// One label matcher of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matcher {
    pub label: String,
    /// `=`, `!=`, `=~` or `!~`.
    pub op: String,
    /// The value as written; `None` when it is a Grafana variable.
    pub value: Option<String>,
}

/// A vector selector: `name{matchers}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    /// `None` for `{__name__=...}`-only selectors.
    pub metric: Option<String>,
    pub matchers: Vec<Matcher>,
}

/// What a query names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Names {
    pub selectors: Vec<Selector>,
    /// Labels in `by (...)`, `without (...)`, `on (...)`, `ignoring (...)`, `group_left (...)`,
    /// `group_right (...)`.
    pub grouping: Vec<String>,
}

/// Words that are never metric names (promql/parser/lex.go `key` and the set operators).
const KEYWORDS: [&str; 12] = [
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "atan2",
];
/// Aggregation operators (promql/parser/lex.go): followed by `by`/`without` or `(`, never a
/// metric name here.
const AGGREGATIONS: [&str; 14] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];
const GROUPING: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The selectors and grouping labels of `query`.
pub fn names(query: &str) -> Result<Names> {
    let t = tokenize(query)?;
    let mut out = Names::default();
    let mut i = 0;
    while i < t.len() {
        match &t[i] {
            Token::Ident(w) if GROUPING.contains(&w.as_str()) => {
                i += 1;
                if t.get(i) == Some(&Token::Punct('(')) {
                    i += 1;
                    while i < t.len() && t[i] != Token::Punct(')') {
                        match &t[i] {
                            Token::Ident(l) => out.grouping.push(l.clone()),
                            Token::Punct(',') => {}
                            other => bail!("{query:?}: {other:?} in the label list of {w}"),
                        }
                        i += 1;
                    }
                    i += 1;
                }
            }
            Token::Ident(w) if KEYWORDS.contains(&w.as_str()) => i += 1,
            Token::Ident(w) if AGGREGATIONS.contains(&w.as_str()) => i += 1,
            // A function or aggregation call.
            Token::Ident(_) if t.get(i + 1) == Some(&Token::Punct('(')) => i += 1,
            Token::Ident(w) => {
                let mut sel = Selector {
                    metric: Some(w.clone()),
                    matchers: Vec::new(),
                };
                i += 1;
                if t.get(i) == Some(&Token::Punct('{')) {
                    i = matchers(&t, i, query, &mut sel.matchers)?;
                }
                out.selectors.push(sel);
            }
            Token::Punct('{') => {
                let mut sel = Selector {
                    metric: None,
                    matchers: Vec::new(),
                };
                i = matchers(&t, i, query, &mut sel.matchers)?;
                if let Some(n) = sel
                    .matchers
                    .iter()
                    .find(|m| m.label == "__name__" && m.op == "=")
                {
                    sel.metric = n.value.clone();
                }
                out.selectors.push(sel);
            }
            // Ranges, subqueries and offsets: durations and variables, no names.
            Token::Punct('[') => {
                while i < t.len() && t[i] != Token::Punct(']') {
                    i += 1;
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    Ok(out)
}

/// Reads `{label op "value", ...}` from `t[open]` (a `{`); returns the index after the `}`.
fn matchers(t: &[Token], open: usize, query: &str, out: &mut Vec<Matcher>) -> Result<usize> {
    let mut i = open + 1;
    loop {
        match t.get(i) {
            Some(Token::Punct('}')) => return Ok(i + 1),
            Some(Token::Punct(',')) => i += 1,
            Some(Token::Ident(label)) => {
                let op = match t.get(i + 1) {
                    Some(Token::Op(op)) if matches!(op.as_str(), "=" | "!=" | "=~" | "!~") => op,
                    other => {
                        bail!("{query:?}: label {label} is followed by {other:?}, not a matcher")
                    }
                };
                let value = match t.get(i + 2) {
                    Some(Token::Str(s)) => {
                        // A value made of one Grafana variable is not checked.
                        if s.starts_with('$')
                            && tokenize(s).is_ok_and(|x| matches!(x.as_slice(), [Token::Var(_)]))
                        {
                            None
                        } else {
                            Some(s.clone())
                        }
                    }
                    other => bail!("{query:?}: matcher {label}{op} has {other:?}, not a string"),
                };
                out.push(Matcher {
                    label: label.clone(),
                    op: op.clone(),
                    value,
                });
                i += 3;
            }
            other => bail!("{query:?}: {other:?} inside a selector's braces"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(metric: &str, m: &[(&str, &str, Option<&str>)]) -> Selector {
        Selector {
            metric: Some(metric.into()),
            matchers: m
                .iter()
                .map(|(l, o, v)| Matcher {
                    label: l.to_string(),
                    op: o.to_string(),
                    value: v.map(str::to_string),
                })
                .collect(),
        }
    }

    #[test]
    fn selectors_and_grouping_of_real_queries() {
        let n = names(
            r#"histogram_quantile(0.99, sum by (le, node) (rate(holdfast_hold_duration_seconds_bucket{node=~"$node"}[$__rate_interval])))"#,
        )
        .expect("parse");
        assert_eq!(
            n.selectors,
            [sel(
                "holdfast_hold_duration_seconds_bucket",
                &[("node", "=~", None)]
            )]
        );
        assert_eq!(n.grouping, ["le", "node"]);

        let n = names(
            r#"sum(rate(a_total{outcome="deadline", kind!~"x|y"}[5m] offset 1m)) without(instance) / on (node) group_left() max(b) > 0.8 and absent(up{job="holdfast"})"#,
        )
        .expect("parse");
        assert_eq!(
            n.selectors,
            [
                sel(
                    "a_total",
                    &[
                        ("outcome", "=", Some("deadline")),
                        ("kind", "!~", Some("x|y"))
                    ]
                ),
                sel("b", &[]),
                sel("up", &[("job", "=", Some("holdfast"))]),
            ]
        );
        assert_eq!(n.grouping, ["instance", "node"]);

        let n = names(r#"max by (node) (x) / count without (pod) (y)"#).expect("parse");
        assert_eq!(n.selectors, [sel("x", &[]), sel("y", &[])]);
        assert_eq!(n.grouping, ["node", "pod"]);

        let n = names(r#"{__name__="x", a='b'} + 1e-3 * inf + c:rule:rate5m"#).expect("parse");
        assert_eq!(
            n.selectors,
            [
                sel("x", &[("__name__", "=", Some("x")), ("a", "=", Some("b"))]),
                sel("c:rule:rate5m", &[])
            ]
        );
        assert_eq!(
            tokenize("rate(x[1h30m:1m])").expect("lex")[3..],
            [
                Token::Punct('['),
                Token::Number("1h30m".into()),
                Token::Op(":".into()),
                Token::Number("1m".into()),
                Token::Punct(']'),
                Token::Punct(')')
            ]
        );
    }

    #[test]
    fn bad_queries_are_errors_not_guesses() {
        assert!(names(r#"x{a="b"#).is_err(), "unterminated string");
        assert!(names(r#"x{a}"#).is_err(), "matcher without op");
        assert!(names(r#"x{a=b}"#).is_err(), "unquoted value");
        assert!(names("x ; y").is_err(), "not PromQL");
    }
}
