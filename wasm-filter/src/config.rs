//! The plugin configuration: parsed once in `on_configure`, validated, then read-only.
//!
//! The configuration is optional JSON. An absent or empty (whitespace-only) configuration means
//! the defaults. Unknown fields are errors, so a typo does not silently fall back to a default.

use serde::Deserialize;

use crate::direction::Direction;

/// The stat prefix used when the configuration does not set one.
pub const DEFAULT_STAT_PREFIX: &str = "holdfast";

/// Longest accepted `stat_prefix`: stat names stay readable and well under Envoy's limits.
pub const MAX_STAT_PREFIX_LEN: usize = 64;

/// The filter's validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterConfig {
    /// First segment of every stat name: `<stat_prefix>.<direction>.cx_active`.
    pub stat_prefix: String,
    /// Direction to count every connection under, whatever the listener says: set when the
    /// plugin is delivered per direction (Istio WasmPlugin `match: [{mode: SERVER}]` → inbound,
    /// `CLIENT` → outbound). When set, the listener direction property is never read.
    pub direction: Option<Direction>,
    /// Direction to count connections under when their listener has no `traffic_direction`.
    pub direction_override: Option<Direction>,
}

impl FilterConfig {
    /// The direction connections of a root context count under, given the listener direction
    /// property as read once for that root context (`None` when it was not read or absent).
    pub fn resolve_direction(&self, listener_property: Option<&[u8]>) -> Direction {
        match self.direction {
            Some(d) => d,
            None => Direction::resolve(listener_property, self.direction_override),
        }
    }
}

impl Default for FilterConfig {
    fn default() -> Self {
        FilterConfig {
            stat_prefix: DEFAULT_STAT_PREFIX.to_string(),
            direction: None,
            direction_override: None,
        }
    }
}

/// Why a plugin configuration was rejected. The message names the field and the fix.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// Not valid JSON, wrong type, or an unknown field (serde's message names it).
    #[error("invalid plugin configuration: {0} (expected a JSON object with optional fields \"stat_prefix\", \"direction\" and \"direction_override\")")]
    Json(String),
    /// `direction` and `direction_override` are both set: the override could never apply.
    #[error("invalid plugin configuration: \"direction\" and \"direction_override\" are exclusive (with \"direction\" set, every connection counts under it and the override could never apply)")]
    DirectionConflict,
    /// `stat_prefix` is empty, too long or has characters outside [a-z0-9_].
    #[error("invalid plugin configuration: field \"stat_prefix\" = {value:?}: {reason}")]
    StatPrefix {
        /// The rejected value.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// The configuration as written by the operator, before validation.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    stat_prefix: Option<String>,
    /// Only "inbound" or "outbound": the direction of every connection this plugin sees.
    direction: Option<OverrideDirection>,
    /// Only "inbound" or "outbound": "unknown" is what no override means.
    direction_override: Option<OverrideDirection>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum OverrideDirection {
    Inbound,
    Outbound,
}

impl From<OverrideDirection> for Direction {
    fn from(d: OverrideDirection) -> Direction {
        match d {
            OverrideDirection::Inbound => Direction::Inbound,
            OverrideDirection::Outbound => Direction::Outbound,
        }
    }
}

impl FilterConfig {
    /// Parses and validates the raw plugin configuration bytes (as Envoy hands them over).
    pub fn parse(raw: Option<&[u8]>) -> Result<FilterConfig, ConfigError> {
        let bytes = raw.unwrap_or_default();
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(FilterConfig::default());
        }
        let raw: RawConfig =
            serde_json::from_slice(bytes).map_err(|e| ConfigError::Json(e.to_string()))?;
        let stat_prefix = match raw.stat_prefix {
            Some(p) => {
                validate_stat_prefix(&p)?;
                p
            }
            None => DEFAULT_STAT_PREFIX.to_string(),
        };
        if raw.direction.is_some() && raw.direction_override.is_some() {
            return Err(ConfigError::DirectionConflict);
        }
        Ok(FilterConfig {
            stat_prefix,
            direction: raw.direction.map(Direction::from),
            direction_override: raw.direction_override.map(Direction::from),
        })
    }
}

fn validate_stat_prefix(p: &str) -> Result<(), ConfigError> {
    let reject = |reason| ConfigError::StatPrefix {
        value: p.to_string(),
        reason,
    };
    if p.is_empty() {
        return Err(reject("must not be empty"));
    }
    if p.len() > MAX_STAT_PREFIX_LEN {
        return Err(reject("must be at most 64 characters"));
    }
    if !p
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(reject(
            "must contain only lowercase letters, digits and '_' (dots would split the stat name)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<FilterConfig, ConfigError> {
        FilterConfig::parse(Some(s.as_bytes()))
    }

    #[test]
    fn absent_or_empty_means_defaults() {
        assert_eq!(FilterConfig::parse(None), Ok(FilterConfig::default()));
        assert_eq!(parse(""), Ok(FilterConfig::default()));
        assert_eq!(parse("  \n"), Ok(FilterConfig::default()));
        assert_eq!(parse("{}"), Ok(FilterConfig::default()));
        assert_eq!(FilterConfig::default().stat_prefix, "holdfast");
    }

    #[test]
    fn all_fields() {
        let c = parse(r#"{"stat_prefix":"hf_2","direction_override":"outbound"}"#).unwrap();
        assert_eq!(c.stat_prefix, "hf_2");
        assert_eq!(c.direction_override, Some(Direction::Outbound));
        let c = parse(r#"{"direction_override":"inbound"}"#).unwrap();
        assert_eq!(c.direction_override, Some(Direction::Inbound));
        assert_eq!(c.stat_prefix, "holdfast");
    }

    #[test]
    fn unknown_field_is_named() {
        let e = parse(r#"{"stat_prefx":"x"}"#).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("stat_prefx"), "{msg}");
        assert!(matches!(e, ConfigError::Json(_)));
    }

    #[test]
    fn bad_values_are_rejected_with_the_field_name() {
        for bad in [
            "",
            "Holdfast",
            "hold.fast",
            "hold-fast",
            "hé",
            &"a".repeat(65),
        ] {
            let json = serde_json::json!({ "stat_prefix": bad }).to_string();
            let e = parse(&json).unwrap_err();
            assert!(matches!(e, ConfigError::StatPrefix { .. }), "{bad:?}: {e}");
            assert!(e.to_string().contains("stat_prefix"), "{e}");
        }
        let e = parse(r#"{"direction_override":"unknown"}"#).unwrap_err();
        assert!(e.to_string().contains("unknown variant"), "{e}");
        assert!(parse(r#"{"direction_override":"INBOUND"}"#).is_err());
        assert!(parse(r#"{"stat_prefix":7}"#).is_err());
        assert!(parse("[]").is_err());
        assert!(parse("not json").is_err());
        assert!(parse("{} trailing").is_err());
        assert!(FilterConfig::parse(Some(&[0xff, 0xfe])).is_err());
    }

    #[test]
    fn direction_from_configuration() {
        let c = parse(r#"{"direction":"outbound"}"#).unwrap();
        assert_eq!(c.direction, Some(Direction::Outbound));
        // The configured direction wins over whatever the listener says, and needs no property.
        let inbound = 1i64.to_le_bytes();
        assert_eq!(c.resolve_direction(Some(&inbound)), Direction::Outbound);
        assert_eq!(c.resolve_direction(None), Direction::Outbound);
        let c = parse(r#"{"direction":"inbound"}"#).unwrap();
        assert_eq!(c.resolve_direction(None), Direction::Inbound);
        // Without it, the listener property decides, then the override, then unknown.
        let c = parse(r#"{"direction_override":"inbound"}"#).unwrap();
        let outbound = 2i64.to_le_bytes();
        assert_eq!(c.resolve_direction(Some(&outbound)), Direction::Outbound);
        assert_eq!(c.resolve_direction(None), Direction::Inbound);
        assert_eq!(
            FilterConfig::default().resolve_direction(None),
            Direction::Unknown
        );
    }

    #[test]
    fn direction_is_checked() {
        let e = parse(r#"{"direction":"outbound","direction_override":"inbound"}"#).unwrap_err();
        assert_eq!(e, ConfigError::DirectionConflict);
        assert!(e.to_string().contains("exclusive"), "{e}");
        for bad in [
            r#"{"direction":"unknown"}"#,
            r#"{"direction":"SERVER"}"#,
            r#"{"direction":1}"#,
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.to_string().contains("direction"), "{bad}: {e}");
        }
    }

    #[test]
    fn longest_prefix_is_accepted() {
        let p = "a".repeat(MAX_STAT_PREFIX_LEN);
        assert_eq!(
            parse(&format!(r#"{{"stat_prefix":"{p}"}}"#))
                .unwrap()
                .stat_prefix,
            p
        );
    }
}
