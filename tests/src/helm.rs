//! The Helm chart (`charts/holdfast`) rendered by a real Helm: `helm template` and `helm lint`
//! of the v4 built from its Go module (`helm.sh/helm/v4/cmd/helm`, the version pinned in
//! scripts/setup.sh, which installs it as `target/bin/helm`), to compare with the kustomize
//! install ([`crate::kustomize`]) object by object.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

/// The chart's directory.
pub fn chart() -> PathBuf {
    crate::envoy::workspace_root().join("charts/holdfast")
}

/// Helm: `$HOLDFAST_HELM`, else `target/bin/helm` (scripts/setup.sh). `None` if neither is
/// there.
pub fn binary() -> Option<PathBuf> {
    let p = std::env::var_os("HOLDFAST_HELM")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::envoy::workspace_root().join("target/bin/helm"));
    p.is_file().then_some(p)
}

/// Helm, or a reason to skip (outside CI) or fail (in CI) that names the fix.
pub fn binary_or_reason() -> Result<PathBuf, String> {
    binary().ok_or_else(|| {
        "no Helm at target/bin/helm (nor $HOLDFAST_HELM): run scripts/setup.sh, which builds the pinned helm v4 from its Go module".to_string()
    })
}

/// One `--set`-style value: `key=value` (Helm's own syntax; `--set-string` when `string`).
#[derive(Debug, Clone)]
pub struct Set {
    pub key: String,
    pub value: String,
    pub string: bool,
}

/// `key=value` as `--set` parses it (numbers and booleans typed).
pub fn set(key: &str, value: &str) -> Set {
    Set {
        key: key.into(),
        value: value.into(),
        string: false,
    }
}

/// `key=value` as a string whatever it looks like (`--set-string`).
pub fn set_string(key: &str, value: &str) -> Set {
    Set {
        key: key.into(),
        value: value.into(),
        string: true,
    }
}

fn value_args(values: &[Set]) -> Vec<String> {
    values
        .iter()
        .flat_map(|s| {
            [
                if s.string { "--set-string" } else { "--set" }.to_string(),
                format!("{}={}", s.key, s.value),
            ]
        })
        .collect()
}

/// What a Helm command printed, and whether it succeeded.
#[derive(Debug)]
pub struct Output {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `helm ARGS` (arguments as a list, never a shell string).
pub fn run(helm: &std::path::Path, args: &[String]) -> Result<Output> {
    let out = Command::new(helm)
        .args(args)
        // Helm's own state (repositories, cache) away from the user's.
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("hf-helm/cache"),
        )
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("hf-helm/config"),
        )
        .env("HELM_DATA_HOME", std::env::temp_dir().join("hf-helm/data"))
        .output()
        .with_context(|| format!("running {}", helm.display()))?;
    Ok(Output {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// `helm template holdfast charts/holdfast -n RELEASE_NS VALUES`: its output, success or not.
pub fn template_raw(helm: &std::path::Path, release_ns: &str, values: &[Set]) -> Result<Output> {
    let mut args = vec![
        "template".to_string(),
        "holdfast".to_string(),
        chart().display().to_string(),
        "--namespace".to_string(),
        release_ns.to_string(),
    ];
    args.extend(value_args(values));
    run(helm, &args)
}

/// The objects `helm template` renders (release in namespace `default`), in order.
pub fn template(helm: &std::path::Path, values: &[Set]) -> Result<Vec<Value>> {
    let out = template_raw(helm, "default", values)?;
    ensure!(
        out.ok,
        "helm template with {values:?} failed: {}",
        out.stderr.trim()
    );
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&out.stdout).context("helm template's output is not YAML")?;
    Ok(docs.into_iter().filter(|v| !v.is_null()).collect())
}

/// `helm lint --strict charts/holdfast VALUES`.
pub fn lint(helm: &std::path::Path, values: &[Set]) -> Result<Output> {
    let mut args = vec![
        "lint".to_string(),
        "--strict".to_string(),
        chart().display().to_string(),
    ];
    args.extend(value_args(values));
    run(helm, &args)
}

/// An object's identity: apiVersion, kind, namespace, name.
pub fn key(v: &Value) -> String {
    let s = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or("");
    format!(
        "{} {} {}/{}",
        s("/apiVersion"),
        s("/kind"),
        s("/metadata/namespace"),
        s("/metadata/name")
    )
}

/// Objects by [`key`]; a key twice is an error.
pub fn by_key(objects: impl IntoIterator<Item = Value>) -> Result<BTreeMap<String, Value>> {
    let mut out = BTreeMap::new();
    for o in objects {
        let k = key(&o);
        if out.insert(k.clone(), o).is_some() {
            bail!("{k} rendered twice");
        }
    }
    Ok(out)
}

/// Where two JSON values first differ: every differing path, with both sides (at most `max`).
pub fn differences(a: &Value, b: &Value, max: usize) -> Vec<String> {
    fn walk(path: &str, a: &Value, b: &Value, out: &mut Vec<String>, max: usize) {
        if out.len() >= max || a == b {
            return;
        }
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                for k in keys {
                    let p = format!("{path}/{k}");
                    match (x.get(k), y.get(k)) {
                        (Some(l), Some(r)) => walk(&p, l, r, out, max),
                        (l, r) => out.push(format!("{p}: {l:?} vs {r:?}")),
                    }
                }
            }
            (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
                for (i, (l, r)) in x.iter().zip(y).enumerate() {
                    walk(&format!("{path}/{i}"), l, r, out, max);
                }
            }
            _ => out.push(format!("{path}: {a} vs {b}")),
        }
    }
    let mut out = Vec::new();
    walk("", a, b, &mut out, max);
    out
}

/// Compares two installs object by object: the objects only one side has, and for each object
/// both have, where they differ. Empty when they agree.
pub fn compare(
    left_name: &str,
    left: &BTreeMap<String, Value>,
    right_name: &str,
    right: &BTreeMap<String, Value>,
) -> Vec<String> {
    let mut out = Vec::new();
    for k in left.keys().filter(|k| !right.contains_key(*k)) {
        out.push(format!("{k}: only in {left_name}"));
    }
    for k in right.keys().filter(|k| !left.contains_key(*k)) {
        out.push(format!("{k}: only in {right_name}"));
    }
    for (k, l) in left {
        if let Some(r) = right.get(k) {
            for d in differences(l, r, 10) {
                out.push(format!("{k}: {d} ({left_name} vs {right_name})"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn differences_name_the_path() {
        let a = json!({"a": {"b": [1, 2]}, "c": 1});
        let b = json!({"a": {"b": [1, 3]}, "d": 1});
        assert_eq!(
            differences(&a, &b, 10),
            [
                "/a/b/1: 2 vs 3",
                "/c: Some(Number(1)) vs None",
                "/d: None vs Some(Number(1))"
            ]
        );
        assert!(differences(&a, &a, 10).is_empty());
    }
}
