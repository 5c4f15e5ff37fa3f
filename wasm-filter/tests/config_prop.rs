//! Property tests of the plugin configuration parser (issue 11, "Fuzz the parsers"), native:
//! whatever bytes Envoy hands over (Istio's WasmPlugin `pluginConfig`, an EnvoyFilter's
//! `configuration` value), parsing returns a config or an error, never a panic; valid
//! configurations read back as written. Bounded case count: runs in well under a second.

use holdfast_filter::config::{FilterConfig, MAX_STAT_PREFIX_LEN};
use holdfast_filter::direction::Direction;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn never_panics_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = FilterConfig::parse(Some(&bytes));
    }

    #[test]
    fn never_panics_on_json_shaped_text(text in r#"[{}\[\]":, a-z_0-9\\]{0,80}"#) {
        let _ = FilterConfig::parse(Some(text.as_bytes()));
    }

    #[test]
    fn valid_configs_read_back(prefix in "[a-z0-9_]{1,64}", dir in proptest::option::of(any::<bool>()),
                               pad in "[ \n\t]{0,3}") {
        let mut fields = vec![format!(r#""stat_prefix":"{prefix}""#)];
        if let Some(inbound) = dir {
            fields.push(format!(r#""direction_override":"{}""#, if inbound { "inbound" } else { "outbound" }));
        }
        let raw = format!("{pad}{{{}}}{pad}", fields.join(","));
        let c = FilterConfig::parse(Some(raw.as_bytes()));
        prop_assert!(c.is_ok(), "{}: {:?}", raw, c);
        let c = c.unwrap_or_default();
        prop_assert_eq!(c.stat_prefix, prefix);
        prop_assert_eq!(c.direction_override, dir.map(|i| if i { Direction::Inbound } else { Direction::Outbound }));
    }

    #[test]
    fn invalid_prefixes_are_errors(prefix in ".{0,80}") {
        let valid = !prefix.is_empty() && prefix.len() <= MAX_STAT_PREFIX_LEN
            && prefix.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        let raw = serde_json::json!({"stat_prefix": prefix}).to_string();
        prop_assert_eq!(FilterConfig::parse(Some(raw.as_bytes())).is_ok(), valid, "{}", raw);
    }
}
