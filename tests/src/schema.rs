//! Validating objects against the API server's schemas, as `kubectl apply` with strict field
//! validation (the default) would: a field the schema does not declare is an error ("unknown
//! field"), as are a wrong type, a missing required field, a value outside an enum, pattern or
//! bound. The schemas are the test corpus in `tests/corpus/schemas/` (README there): Kubernetes'
//! OpenAPI as JSON Schema at named releases, and the `openAPIV3Schema` of Istio's CRDs at named
//! tags.
//!
//! Kubernetes' structural-schema rules apply: an object schema accepts only its declared
//! `properties` unless `additionalProperties` says otherwise or
//! `x-kubernetes-preserve-unknown-fields: true` (then unknown fields are kept, not checked);
//! `x-kubernetes-int-or-string: true` accepts an integer or a string; `nullable: true` (or
//! `null` among the types) accepts null.
//!
//! CEL rules (`x-kubernetes-validations`) cannot be evaluated here: each rule the schemas
//! contain is ported by hand in [`CEL_RULES`], keyed by its message, and a rule with no port
//! fails validation, so a newer CRD's new rule is never skipped silently.
//!
//! Every schema keyword is either checked or listed as an annotation (`ANNOTATIONS`); any
//! other keyword fails, so this validator never passes what it does not understand.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};

/// Keywords that describe and never constrain (here).
const ANNOTATIONS: [&str; 12] = [
    "description",
    "title",
    "default",
    "example",
    "format",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-patch-merge-key",
    "x-kubernetes-patch-strategy",
    "x-kubernetes-group-version-kind",
    "x-kubernetes-unions",
];

/// One schema set of the corpus: a release's kinds, by `apiVersion/kind`.
#[derive(Debug, Clone)]
pub struct SchemaSet {
    /// The file's name (`kubernetes-v1.30.0.json`).
    pub name: String,
    /// Where it comes from (the file's `source`).
    pub source: String,
    kinds: Map<String, Value>,
    defs: Map<String, Value>,
}

impl SchemaSet {
    pub fn load(path: &Path) -> Result<SchemaSet> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the schema corpus {}", path.display()))?;
        let v: Value =
            serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
        let obj = |k: &str| {
            v.get(k)
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default()
        };
        Ok(SchemaSet {
            name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            source: v
                .get("source")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            kinds: obj("kinds"),
            defs: obj("$defs"),
        })
    }

    /// Whether this set has a schema for `apiVersion/kind`.
    pub fn has(&self, api_version: &str, kind: &str) -> bool {
        self.kinds.contains_key(&format!("{api_version}/{kind}"))
    }

    /// The kinds this set has, as `apiVersion/kind`.
    pub fn kinds(&self) -> impl Iterator<Item = &str> {
        self.kinds.keys().map(String::as_str)
    }

    /// Validates `object` (its own apiVersion and kind pick the schema); returns every
    /// violation, each naming the field (`spec.template.spec.containers[0].image`).
    pub fn validate(&self, object: &Value) -> Result<Vec<String>> {
        let api_version = object
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
        let Some(schema) = self.kinds.get(&format!("{api_version}/{kind}")) else {
            bail!(
                "{}: no schema for {api_version} {kind} (add the kind to tests/corpus/schemas/trim.py and regenerate)",
                self.name
            );
        };
        let mut errors = Vec::new();
        self.check(schema, object, "", &mut errors)?;
        Ok(errors)
    }

    fn resolve<'a>(&'a self, r: &str) -> Result<&'a Value> {
        let name = r
            .strip_prefix("#/$defs/")
            .with_context(|| format!("{}: $ref {r:?} is not local", self.name))?;
        self.defs
            .get(name)
            .with_context(|| format!("{}: $ref {r:?} names no definition", self.name))
    }

    /// Checks `v` at `path` against `schema`, pushing violations; errors only for schemas this
    /// validator cannot read.
    fn check(&self, schema: &Value, v: &Value, path: &str, out: &mut Vec<String>) -> Result<()> {
        let s = match schema {
            Value::Bool(true) => return Ok(()),
            Value::Bool(false) => {
                out.push(format!("{}: not allowed", shown(path)));
                return Ok(());
            }
            Value::Object(s) => s,
            other => bail!("{}: schema at {path} is {other}", self.name),
        };
        for k in s.keys() {
            let known = ANNOTATIONS.contains(&k.as_str())
                || matches!(
                    k.as_str(),
                    "$ref"
                        | "type"
                        | "nullable"
                        | "properties"
                        | "additionalProperties"
                        | "required"
                        | "items"
                        | "enum"
                        | "oneOf"
                        | "anyOf"
                        | "allOf"
                        | "not"
                        | "minimum"
                        | "maximum"
                        | "minLength"
                        | "maxLength"
                        | "minItems"
                        | "maxItems"
                        | "minProperties"
                        | "maxProperties"
                        | "pattern"
                        | "x-kubernetes-int-or-string"
                        | "x-kubernetes-preserve-unknown-fields"
                        | "x-kubernetes-validations"
                );
            if !known {
                bail!(
                    "{}: schema keyword {k:?} (at {}) is not implemented by tests/src/schema.rs",
                    self.name,
                    shown(path)
                );
            }
        }
        if let Some(Value::String(r)) = s.get("$ref") {
            self.check(self.resolve(r)?, v, path, out)?;
        }
        if v.is_null() {
            let nullable = s.get("nullable") == Some(&Value::Bool(true))
                || types(s).iter().any(|t| t == "null");
            if !nullable && s.contains_key("type") {
                out.push(format!("{}: must not be null", shown(path)));
            }
            return Ok(());
        }
        let int_or_string = s.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
        let ts = types(s);
        if int_or_string {
            if !(v.is_string() || v.is_i64() || v.is_u64()) {
                out.push(format!(
                    "{}: must be an integer or a string, got {}",
                    shown(path),
                    type_name(v)
                ));
                return Ok(());
            }
        } else if !ts.is_empty() && !ts.iter().any(|t| is_type(v, t)) {
            out.push(format!(
                "{}: must be {}, got {} {}",
                shown(path),
                ts.join(" or "),
                type_name(v),
                short(v)
            ));
            return Ok(());
        }
        if let Some(Value::Array(allowed)) = s.get("enum") {
            if !allowed.contains(v) {
                out.push(format!(
                    "{}: {} is not one of {}",
                    shown(path),
                    short(v),
                    Value::Array(allowed.clone())
                ));
            }
        }
        match v {
            Value::Object(m) => self.check_object(s, m, path, out)?,
            Value::Array(items) => {
                if let Some(item) = s.get("items") {
                    for (i, x) in items.iter().enumerate() {
                        self.check(item, x, &format!("{path}[{i}]"), out)?;
                    }
                }
                bound(s, "minItems", "maxItems", items.len(), path, "items", out);
            }
            Value::String(text) => {
                bound(
                    s,
                    "minLength",
                    "maxLength",
                    text.chars().count(),
                    path,
                    "characters",
                    out,
                );
                if let Some(Value::String(p)) = s.get("pattern") {
                    let re = regex::Regex::new(p)
                        .with_context(|| format!("{}: pattern {p:?}", self.name))?;
                    if !re.is_match(text) {
                        out.push(format!("{}: {text:?} does not match {p:?}", shown(path)));
                    }
                }
            }
            Value::Number(n) => {
                let x = n.as_f64().unwrap_or(f64::NAN);
                if let Some(min) = s.get("minimum").and_then(Value::as_f64) {
                    if x < min {
                        out.push(format!("{}: {n} is less than {min}", shown(path)));
                    }
                }
                if let Some(max) = s.get("maximum").and_then(Value::as_f64) {
                    if x > max {
                        out.push(format!("{}: {n} is more than {max}", shown(path)));
                    }
                }
            }
            _ => {}
        }
        for (key, sub) in [("allOf", true), ("anyOf", false), ("oneOf", false)] {
            let Some(Value::Array(branches)) = s.get(key) else {
                continue;
            };
            let mut passing = 0;
            let mut branch_errors = Vec::new();
            for b in branches {
                let mut e = Vec::new();
                self.check(b, v, path, &mut e)?;
                if e.is_empty() {
                    passing += 1;
                } else {
                    branch_errors.extend(e);
                }
            }
            let ok = match key {
                "allOf" => passing == branches.len(),
                "anyOf" => passing > 0,
                _ => passing == 1,
            };
            if !ok {
                if sub {
                    out.extend(branch_errors);
                } else {
                    out.push(format!(
                        "{}: must match {} of its {key} schemas, matches {passing} ({})",
                        shown(path),
                        if key == "anyOf" {
                            "at least one"
                        } else {
                            "exactly one"
                        },
                        if branch_errors.is_empty() {
                            "all".to_string()
                        } else {
                            branch_errors.join("; ")
                        }
                    ));
                }
            }
        }
        if let Some(not) = s.get("not") {
            let mut e = Vec::new();
            self.check(not, v, path, &mut e)?;
            if e.is_empty() {
                out.push(format!("{}: must not match {}", shown(path), short(not)));
            }
        }
        if let Some(Value::Array(rules)) = s.get("x-kubernetes-validations") {
            for r in rules {
                let message = r.get("message").and_then(Value::as_str).unwrap_or_default();
                let rule = r.get("rule").and_then(Value::as_str).unwrap_or_default();
                let Some((_, _, port)) = CEL_RULES
                    .iter()
                    .find(|(m, r, _)| *m == message && same_rule(r, rule))
                else {
                    bail!(
                        "{}: the CEL rule {rule:?} (at {}, message {message:?}) has no port in tests/src/schema.rs CEL_RULES",
                        self.name,
                        shown(path)
                    );
                };
                if !port(v) {
                    out.push(format!("{}: {message}", shown(path)));
                }
            }
        }
        Ok(())
    }

    fn check_object(
        &self,
        s: &Map<String, Value>,
        m: &Map<String, Value>,
        path: &str,
        out: &mut Vec<String>,
    ) -> Result<()> {
        let empty = Map::new();
        let props = s
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let preserve = s.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
        for (k, x) in m {
            let at = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            if let Some(p) = props.get(k) {
                self.check(p, x, &at, out)?;
                continue;
            }
            match s.get("additionalProperties") {
                Some(Value::Bool(false)) => out.push(format!("unknown field {at:?}")),
                Some(sub @ Value::Object(_)) => self.check(sub, x, &at, out)?,
                Some(Value::Bool(true)) => {}
                None if preserve => {}
                // A structural schema keeps only declared fields: strict validation refuses
                // the rest (only object schemas get here; others have no fields).
                None if s.contains_key("properties") || types(s).iter().any(|t| t == "object") => {
                    out.push(format!("unknown field {at:?}"))
                }
                None => {}
                Some(other) => bail!("{}: additionalProperties {other}", self.name),
            }
        }
        for r in s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(name) = r.as_str() else { continue };
            if m.get(name).is_none_or(Value::is_null) {
                let at = if path.is_empty() {
                    name.to_string()
                } else {
                    format!("{path}.{name}")
                };
                out.push(format!("missing required field {at:?}"));
            }
        }
        bound(
            s,
            "minProperties",
            "maxProperties",
            m.len(),
            path,
            "fields",
            out,
        );
        Ok(())
    }
}

fn types(s: &Map<String, Value>) -> Vec<String> {
    match s.get("type") {
        Some(Value::String(t)) => vec![t.clone()],
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(|t| t.as_str().map(String::from))
            .collect(),
        _ => Vec::new(),
    }
}

fn is_type(v: &Value, t: &str) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "null" => v.is_null(),
        _ => false,
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 60 {
        format!(
            "{}…",
            &s[..s.char_indices().nth(57).map_or(s.len(), |(i, _)| i)]
        )
    } else {
        s
    }
}

fn shown(path: &str) -> &str {
    if path.is_empty() {
        "the object"
    } else {
        path
    }
}

fn bound(
    s: &Map<String, Value>,
    min: &str,
    max: &str,
    n: usize,
    path: &str,
    what: &str,
    out: &mut Vec<String>,
) {
    if let Some(lo) = s.get(min).and_then(Value::as_u64) {
        if (n as u64) < lo {
            out.push(format!(
                "{}: {n} {what}, at least {lo} required",
                shown(path)
            ));
        }
    }
    if let Some(hi) = s.get(max).and_then(Value::as_u64) {
        if (n as u64) > hi {
            out.push(format!("{}: {n} {what}, at most {hi} allowed", shown(path)));
        }
    }
}

type CelPort = fn(&Value) -> bool;

/// Two spellings of one CEL rule (Istio's releases differ in quotes and spacing).
fn same_rule(a: &str, b: &str) -> bool {
    let norm = |s: &str| -> String {
        s.chars()
            .filter(|c| !c.is_whitespace())
            .map(|c| if c == '\'' { '"' } else { c })
            .collect()
    };
    norm(a) == norm(b)
}

fn has(v: &Value, k: &str) -> bool {
    v.get(k).is_some_and(|x| !x.is_null())
}

fn keys_and_values(v: &Value) -> impl Iterator<Item = (&String, &Value)> {
    v.as_object().into_iter().flatten()
}

/// The CEL rules of the corpus's CRDs, each ported by hand: (message, rule, port). The port
/// returns whether the value satisfies the rule.
pub const CEL_RULES: [(&str, &str, CelPort); 15] = [
    (
        "only one of targetRefs or selector can be set",
        "(has(self.selector) ? 1 : 0) + (has(self.targetRef) ? 1 : 0) + (has(self.targetRefs) ? 1 : 0) <= 1",
        |v| ["selector", "targetRef", "targetRefs"].iter().filter(|k| has(v, k)).count() <= 1,
    ),
    (
        "wildcard not allowed in label key match",
        "self.all(key, !key.contains(\"*\"))",
        |v| keys_and_values(v).all(|(k, _)| !k.contains('*')),
    ),
    (
        "key must not be empty",
        "self.all(key, key.size() != 0)",
        |v| keys_and_values(v).all(|(k, _)| !k.is_empty()),
    ),
    (
        "wildcard not allowed in label value match",
        "!self.contains(\"*\")",
        |v| !v.as_str().is_some_and(|s| s.contains('*')),
    ),
    (
        "cross namespace referencing is not currently supported",
        "self.size() == 0",
        |v| v.as_str().is_none_or(str::is_empty),
    ),
    (
        "url must have schema one of [http, https, file, oci]",
        "isURL(self) ? (url(self).getScheme() in [\"\", \"http\", \"https\", \"oci\", \"file\"]) : (isURL(\"http://\" + self) &&\nurl(\"http://\" + self).getScheme() in [\"\", \"http\", \"https\", \"oci\", \"file\"])",
        |v| {
            // A URL with a scheme must use one of these; one without is taken as host/path.
            let s = v.as_str().unwrap_or_default();
            match s.split_once("://") {
                Some((scheme, rest)) => {
                    ["http", "https", "oci", "file"].contains(&scheme) && !rest.is_empty()
                }
                None => !s.is_empty() && !s.contains(char::is_whitespace),
            }
        },
    ),
    (
        "value may only be set when valueFrom is INLINE",
        "(has(self.valueFrom) ? self.valueFrom : \"\") != \"HOST\" || !has(self.value)",
        |v| v.get("valueFrom").and_then(Value::as_str) != Some("HOST") || !has(v, "value"),
    ),
    (
        "only one of targetRefs or workloadSelector can be set",
        "(has(self.workloadSelector) ? 1 : 0) + (has(self.targetRefs) ? 1 : 0) <= 1",
        |v| ["workloadSelector", "targetRefs"].iter().filter(|k| has(v, k)).count() <= 1,
    ),
    (
        "wildcard is not supported in selector",
        "!self.contains(\"*\")",
        |v| !v.as_str().is_some_and(|s| s.contains('*')),
    ),
    (
        "Support kinds are core/Service, networking.istio.io/ServiceEntry, gateway.networking.k8s.io/Gateway",
        "[self.group, self.kind] in [[\"core\",\"Service\"], [\"\",\"Service\"], [\"gateway.networking.k8s.io\",\"Gateway\"], [\"networking.istio.io\",\"ServiceEntry\"]]",
        |v| {
            let f = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("");
            matches!(
                (f("group"), f("kind")),
                ("core" | "", "Service")
                    | ("gateway.networking.k8s.io", "Gateway")
                    | ("networking.istio.io", "ServiceEntry")
            )
        },
    ),
    (
        "only support waypointMatch when context is WAYPOINT",
        "has(self.context) ? ((self.context == \"WAYPOINT\") ? has(self.waypoint) : !has(self.waypoint)) : !has(self.waypoint)",
        |v| {
            let waypoint = has(v, "waypoint");
            match v.get("context").and_then(Value::as_str) {
                Some("WAYPOINT") => waypoint,
                _ => !waypoint,
            }
        },
    ),
    // TrafficExtension (Istio 1.30+): the same url rule with its schemes in another order,
    // the selector/targetRefs rule without the deprecated singular targetRef, and its union.
    (
        "url must have schema one of [http, https, file, oci]",
        "isURL(self) ? (url(self).getScheme() in [\"\", \"http\", \"https\", \"file\", \"oci\"]) : (isURL(\"http://\" + self) &&\nurl(\"http://\" + self).getScheme() in [\"\", \"http\", \"https\", \"file\", \"oci\"])",
        |v| {
            let s = v.as_str().unwrap_or_default();
            match s.split_once("://") {
                Some((scheme, rest)) => {
                    ["http", "https", "oci", "file"].contains(&scheme) && !rest.is_empty()
                }
                None => !s.is_empty() && !s.contains(char::is_whitespace),
            }
        },
    ),
    (
        "only one of targetRefs or selector can be set",
        "(has(self.selector) ? 1 : 0) + (has(self.targetRefs) ? 1 : 0) <= 1",
        |v| ["selector", "targetRefs"].iter().filter(|k| has(v, k)).count() <= 1,
    ),
    (
        "exactly one of wasm or lua must be set",
        "has(self.wasm) != has(self.lua)",
        |v| has(v, "wasm") != has(v, "lua"),
    ),
    (
        "port must be between 1-65535",
        "0 < self && self <= 65535",
        |v| v.as_i64().is_some_and(|p| 0 < p && p <= 65535),
    ),
];

/// Every schema set of the corpus (`tests/corpus/schemas/*.json`), by file name.
pub fn corpus() -> Result<BTreeMap<String, SchemaSet>> {
    let dir = crate::envoy::workspace_root().join("tests/corpus/schemas");
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "json") {
            let set = SchemaSet::load(&p)?;
            out.insert(set.name.clone(), set);
        }
    }
    Ok(out)
}
