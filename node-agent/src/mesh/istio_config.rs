//! Istio's per-pod settings as annotations: the injection record, the interception mode and the
//! `proxy.istio.io/config` overlay, whose `proxyMetadata` the agent reads with a bounded parser
//! (issue 29). Istio's, so in `mesh/` (issue 37: no mesh's facts outside it).

/// Istio's injection record: JSON naming the init containers and containers its template added
/// (istio/istio pkg/kube/inject/webhook.go, `getInjectionStatus`; struct `SidecarInjectionStatus`
/// in pkg/kube/inject/inject.go).
pub const ANNOTATION_ISTIO_SIDECAR_STATUS: &str = "sidecar.istio.io/status";
/// Istio's interception mode for one pod: `REDIRECT` (default), `TPROXY` or `NONE` (istio/istio
/// manifests/charts/istio-control/istio-discovery/files/injection-template.yaml).
pub const ANNOTATION_ISTIO_INTERCEPTION_MODE: &str = "sidecar.istio.io/interceptionMode";
/// Istio's per-pod ProxyConfig overlay (YAML or JSON), whose `proxyMetadata` the injector renders
/// into the proxy's environment (pkg/kube/inject/webhook.go applies it before rendering).
pub const ANNOTATION_ISTIO_PROXY_CONFIG: &str = "proxy.istio.io/config";

/// The most bytes of a `proxy.istio.io/config` value holdfast parses. Istio's documented
/// overlays are a few lines (a drain duration, a handful of `proxyMetadata` entries); a larger
/// value is reported and ignored before any parsing (issue 29: the pod's author chooses it, and
/// every update of the pod would parse it again).
pub const MAX_PROXY_CONFIG_BYTES: usize = 16 * 1024;

/// The parser's budget for a `proxy.istio.io/config` value: a few thousand events, a handful of
/// anchors and aliases, a replay bound on aliases, shallow nesting, one document. serde-saphyr's
/// defaults (1,000,000 events, 50,000 aliases, 1,000,000 replayed events: its `Budget` and
/// `AliasLimits`, serde-saphyr 2.1 src/de/budget.rs and src/de/options.rs) let an 8 KB alias
/// bomb build ~200k values (~80 MB transient) on every update of the pod; this one stops it
/// after at most a few thousand events.
fn proxy_config_parse_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_events: 4_000,
            max_nodes: 2_000,
            max_aliases: 16,
            max_anchors: 16,
            max_depth: 16,
            max_documents: 1,
            max_merge_keys: 16,
            max_total_scalar_bytes: MAX_PROXY_CONFIG_BYTES,
            max_recorded_anchor_events: 2_000,
            max_recorded_anchor_bytes: MAX_PROXY_CONFIG_BYTES,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: 2_000,
            max_replay_stack_depth: 4,
            max_alias_expansions_per_anchor: 16,
        },
    }
}

/// A `proxyMetadata` value: a scalar only (Istio's `ProxyConfig.proxy_metadata` is a
/// `map<string, string>`, meshconfig proxy.proto); a sequence or mapping is refused as soon as it
/// starts, so nothing nested is ever built.
struct MetadataScalar(String);

impl<'de> serde::Deserialize<'de> for MetadataScalar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = MetadataScalar;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string, boolean or number")
            }
            fn visit_str<E>(self, v: &str) -> Result<MetadataScalar, E> {
                Ok(MetadataScalar(v.to_string()))
            }
            fn visit_bool<E>(self, v: bool) -> Result<MetadataScalar, E> {
                Ok(MetadataScalar(v.to_string()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<MetadataScalar, E> {
                Ok(MetadataScalar(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<MetadataScalar, E> {
                Ok(MetadataScalar(v.to_string()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<MetadataScalar, E> {
                Ok(MetadataScalar(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// The proxy's `proxyMetadata` from a `proxy.istio.io/config` annotation value: an empty map when
/// the value has no `proxyMetadata`, an error (for the pod's problems) when it is larger than
/// [`MAX_PROXY_CONFIG_BYTES`], breaks the parser's small budget, is not a YAML/JSON mapping, or
/// `proxyMetadata` is not a mapping of scalars. Every other field is skipped unbuilt.
pub fn proxy_metadata_from_annotation(
    value: &str,
) -> Result<std::collections::BTreeMap<String, String>, String> {
    let bad = |why: &str| format!("annotation {ANNOTATION_ISTIO_PROXY_CONFIG}: {why}");
    /// The part of Istio's ProxyConfig read here; every other field is ignored.
    #[derive(serde::Deserialize, Default)]
    struct Overlay {
        #[serde(default, rename = "proxyMetadata")]
        proxy_metadata: Option<std::collections::BTreeMap<String, MetadataScalar>>,
    }
    if value.len() > MAX_PROXY_CONFIG_BYTES {
        return Err(bad(&format!(
            "{} bytes, above the {MAX_PROXY_CONFIG_BYTES} holdfast reads",
            value.len()
        )));
    }
    if value.trim().is_empty() {
        return Ok(Default::default());
    }
    // YAML is a superset of JSON: one parser for both shapes the annotation takes.
    let overlay: Option<Overlay> =
        serde_saphyr::from_str_with_options(value, proxy_config_parse_options()).map_err(|e| {
            // The parser's message may quote the value: the first line, cut, is enough.
            let e = e.to_string();
            let e = crate::api::text::cut(e.lines().next().unwrap_or(""), 200).into_owned();
            if e.contains("proxyMetadata") {
                bad("proxyMetadata is not a mapping of strings")
            } else {
                bad(&format!(
                    "not a YAML or JSON mapping within holdfast's parse budget ({e})"
                ))
            }
        })?;
    Ok(overlay
        .and_then(|o| o.proxy_metadata)
        .unwrap_or_default()
        .into_iter()
        .map(|(k, MetadataScalar(v))| (k, v))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_config_annotation_metadata() {
        // The shapes Istio documents for the annotation: YAML and JSON.
        let yaml = "proxyMetadata:\n  ISTIO_META_DNS_CAPTURE: \"true\"\n  EXIT_ON_ZERO_ACTIVE_CONNECTIONS: true\nterminationDrainDuration: 30s\n";
        let m = proxy_metadata_from_annotation(yaml).unwrap();
        assert_eq!(m["ISTIO_META_DNS_CAPTURE"], "true");
        assert_eq!(m["EXIT_ON_ZERO_ACTIVE_CONNECTIONS"], "true");
        let json = r#"{"terminationDrainDuration": "60s"}"#;
        assert!(proxy_metadata_from_annotation(json).unwrap().is_empty());
        assert!(proxy_metadata_from_annotation("").unwrap().is_empty());
        for bad in [
            "[1, 2]",
            "proxyMetadata: [a]",
            "{",
            "proxyMetadata: {A: [1]}",
        ] {
            let e = proxy_metadata_from_annotation(bad).expect_err(bad);
            assert!(e.contains(ANNOTATION_ISTIO_PROXY_CONFIG), "{e}");
        }
    }

    /// An alias bomb (issue 29: ~8 KB that expands to hundreds of thousands of values) is
    /// refused within the small budget, fast, on every shape: in an ignored field and under
    /// `proxyMetadata`. A value over the size cap is refused unparsed. A modest anchor still
    /// works (Istio reads the annotation with a YAML parser that resolves aliases).
    #[test]
    fn proxy_config_annotation_parse_is_bounded() {
        let mut bomb = String::from("a: &a [\"xxxxxxxx\",\"xxxxxxxx\",\"xxxxxxxx\",\"xxxxxxxx\",\"xxxxxxxx\",\"xxxxxxxx\",\"xxxxxxxx\",\"xxxxxxxx\"]\n");
        let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
        for w in names.windows(2) {
            let refs = vec![format!("*{}", w[0]); 8].join(",");
            bomb.push_str(&format!("{}: &{} [{}]\n", w[1], w[1], refs));
        }
        for tail in ["terminationDrainDuration: 5s\n", "proxyMetadata: *i\n"] {
            let value = format!("{bomb}{tail}");
            assert!(value.len() < 8 * 1024, "{}", value.len());
            let started = std::time::Instant::now();
            let e = proxy_metadata_from_annotation(&value).expect_err("over budget");
            let took = started.elapsed();
            assert!(e.contains(ANNOTATION_ISTIO_PROXY_CONFIG), "{e}");
            assert!(e.len() < 600, "{e}");
            // Before the budget this took ~240 ms in a release build (8^8 values to replay).
            assert!(took < std::time::Duration::from_millis(50), "{took:?}");
        }
        let big = format!(
            "proxyMetadata:\n  A: \"{}\"\n",
            "x".repeat(MAX_PROXY_CONFIG_BYTES)
        );
        let e = proxy_metadata_from_annotation(&big).unwrap_err();
        assert!(e.contains("bytes, above the"), "{e}");
        let anchored = "defaults: &d \"true\"\nproxyMetadata:\n  ISTIO_META_DNS_CAPTURE: *d\n";
        assert_eq!(
            proxy_metadata_from_annotation(anchored).unwrap()["ISTIO_META_DNS_CAPTURE"],
            "true"
        );
    }
}
