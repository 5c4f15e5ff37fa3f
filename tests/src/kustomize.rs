//! What `kubectl kustomize DIR` renders, for the fields holdfast's kustomizations (and the
//! overlay `just image` writes) use: `resources` (files and directories, recursively),
//! `components` (kind `Component`, the optional monitoring), `namespace`, `images` and
//! `patches` (JSON 6902, by target kind and name). Any other field of a kustomization is an
//! error (so a kustomization using more than this implements fails here rather than rendering
//! wrongly).
//!
//! Semantics follow kustomize (kubernetes-sigs/kustomize, api/): a kustomization's
//! transformers apply to everything it accumulates, its bases' output included; `namespace`
//! sets `metadata.namespace` on namespaced kinds only (api/filters/namespace); `images` matches
//! a container's image by name without tag or digest and rewrites it to `newName`, then
//! `@digest` (dropping the tag) or `:newTag` (api/filters/imagetag, api/image `Split`), in every
//! `containers`/`initContainers` list at any depth; `patches` with a JSON 6902 body apply to the
//! objects matching `target` (api/filters/patchjson6902). Resource files outside a
//! kustomization's directory are refused, as kustomize's default load restrictor does;
//! directories (bases) may be anywhere. A component (api/internal/target/kusttarget.go
//! `accumulateComponents`) is accumulated after the kustomization's resources, into the same
//! set: its resources are added and its own transformers apply to everything accumulated so
//! far; the including kustomization's transformers then apply to all. A `Component` is only
//! ever listed under `components`, and only a `Component` may be.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Kustomization {
    api_version: String,
    kind: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    components: Vec<String>,
    #[serde(default)]
    images: Vec<ImageOverride>,
    #[serde(default)]
    patches: Vec<PatchSpec>,
}

/// One `images:` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageOverride {
    pub name: String,
    #[serde(default)]
    pub new_name: Option<String>,
    #[serde(default)]
    pub new_tag: Option<String>,
    #[serde(default)]
    pub digest: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchSpec {
    target: PatchTarget,
    patch: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchTarget {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
}

/// One rendered object.
#[derive(Debug, Clone)]
pub struct Object {
    /// The file it came from, relative to the rendered directory's parent-most root (see
    /// [`render`]).
    pub file: PathBuf,
    /// The object as written in its file.
    pub original: Value,
    /// The object as rendered.
    pub value: Value,
}

impl Object {
    pub fn kind(&self) -> &str {
        self.value.get("kind").and_then(Value::as_str).unwrap_or("")
    }

    pub fn name(&self) -> &str {
        self.value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    pub fn namespace(&self) -> Option<&str> {
        self.value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
    }
}

/// A rendered kustomization.
#[derive(Debug, Default)]
pub struct Rendered {
    pub objects: Vec<Object>,
    /// Every resource file included, relative to `root`.
    pub files: Vec<PathBuf>,
    /// Every kustomization file visited, relative to `root`.
    pub kustomizations: Vec<PathBuf>,
}

/// Kinds the namespace transformer leaves alone (cluster-scoped; kustomize's list in
/// api/internal/builtins and the API's scope of each kind holdfast uses).
pub const CLUSTER_SCOPED: [&str; 8] = [
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PriorityClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "Node",
];

/// Renders the kustomization in `root.join(dir)`; paths in the result are relative to `root`.
pub fn render(root: &Path, dir: &Path) -> Result<Rendered> {
    let mut out = Rendered::default();
    accumulate(
        root,
        &normalize(dir),
        Expect::Either,
        &mut out.objects,
        &mut out.files,
        &mut out.kustomizations,
    )?;
    Ok(out)
}

/// What a directory's kustomization must be: a `Kustomization` where listed under
/// `resources`, a `Component` under `components`; the directory rendered may be either (as
/// `kustomize build` of a component directory renders it alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Kustomization,
    Component,
    Either,
}

fn render_into(
    root: &Path,
    dir_rel: &Path,
    files: &mut Vec<PathBuf>,
    kustomizations: &mut Vec<PathBuf>,
) -> Result<Vec<Object>> {
    let mut objects = Vec::new();
    accumulate(
        root,
        dir_rel,
        Expect::Kustomization,
        &mut objects,
        files,
        kustomizations,
    )?;
    Ok(objects)
}

/// Reads `dir_rel`'s kustomization, adds its resources and components to `objects` and applies
/// its transformers to all of `objects`.
fn accumulate(
    root: &Path,
    dir_rel: &Path,
    expect: Expect,
    objects: &mut Vec<Object>,
    files: &mut Vec<PathBuf>,
    kustomizations: &mut Vec<PathBuf>,
) -> Result<()> {
    let k_rel = dir_rel.join("kustomization.yaml");
    let k_path = root.join(&k_rel);
    ensure!(
        k_path.is_file(),
        "{} is referenced as a kustomize {} directory but has no kustomization.yaml",
        root.join(dir_rel).display(),
        if expect == Expect::Component {
            "component"
        } else {
            "resource"
        }
    );
    let text = std::fs::read_to_string(&k_path)
        .with_context(|| format!("reading {}", k_path.display()))?;
    let k: Kustomization = serde_saphyr::from_str(&text).with_context(|| {
        format!(
            "{}: not a kustomization this renderer knows",
            k_path.display()
        )
    })?;
    let component = (k.api_version.as_str(), k.kind.as_str())
        == ("kustomize.config.k8s.io/v1alpha1", "Component");
    let kustomization = (k.api_version.as_str(), k.kind.as_str())
        == ("kustomize.config.k8s.io/v1beta1", "Kustomization");
    match expect {
        Expect::Kustomization => ensure!(
            kustomization,
            "{}: apiVersion/kind must be kustomize.config.k8s.io/v1beta1 Kustomization (a Component is listed under `components`, not `resources`)",
            k_path.display()
        ),
        Expect::Component => ensure!(
            component,
            "{}: apiVersion/kind must be kustomize.config.k8s.io/v1alpha1 Component (it is listed under `components`)",
            k_path.display()
        ),
        Expect::Either => ensure!(
            component || kustomization,
            "{}: apiVersion/kind must be kustomize.config.k8s.io/v1beta1 Kustomization or v1alpha1 Component",
            k_path.display()
        ),
    }
    kustomizations.push(k_rel.clone());
    for r in &k.resources {
        let rel = normalize(&dir_rel.join(r));
        let abs = root.join(&rel);
        if abs.is_dir() {
            objects.extend(render_into(root, &rel, files, kustomizations)?);
            continue;
        }
        ensure!(
            abs.is_file(),
            "{} lists resource {r:?}, but {} does not exist",
            k_path.display(),
            abs.display()
        );
        ensure!(
            rel.starts_with(dir_rel),
            "{}: resource file {r:?} is outside the kustomization's directory (kustomize refuses it)",
            k_path.display()
        );
        files.push(rel.clone());
        for doc in documents(&abs)? {
            objects.push(Object {
                file: rel.clone(),
                original: doc.clone(),
                value: doc,
            });
        }
    }
    for c in &k.components {
        let rel = normalize(&dir_rel.join(c));
        ensure!(
            root.join(&rel).is_dir(),
            "{} lists component {c:?}, which is not a directory",
            k_path.display()
        );
        accumulate(
            root,
            &rel,
            Expect::Component,
            objects,
            files,
            kustomizations,
        )
        .with_context(|| format!("{}: component {c:?}", k_path.display()))?;
    }
    for p in &k.patches {
        apply_patch(p, objects).with_context(|| format!("{}: patches", k_path.display()))?;
    }
    if let Some(ns) = &k.namespace {
        for o in objects.iter_mut() {
            if !CLUSTER_SCOPED.contains(&o.kind()) {
                o.value["metadata"]["namespace"] = Value::String(ns.clone());
            }
        }
    }
    for img in &k.images {
        ensure!(
            !(img.digest.is_some() && img.new_tag.is_some()),
            "{}: images {}: digest and newTag together",
            k_path.display(),
            img.name
        );
        for o in objects.iter_mut() {
            rewrite_images(&mut o.value, img);
        }
    }
    Ok(())
}

/// Every YAML document of a file (multi-document aware; empty documents skipped).
pub fn documents(path: &Path) -> Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .with_context(|| format!("{}: not valid YAML", path.display()))?;
    Ok(docs.into_iter().filter(|v| !v.is_null()).collect())
}

/// Resolves `a/../b` lexically (kustomize paths are relative, never through symlinks here).
pub fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                if out.as_os_str().is_empty() || out.ends_with("..") {
                    out.push("..");
                } else {
                    out.pop();
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// kustomize's image.Split: (name, tag, digest).
pub fn split_image(image: &str) -> (&str, Option<&str>, Option<&str>) {
    let (rest, digest) = match image.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (image, None),
    };
    // A tag is after the last ':' that comes after the last '/' (a registry port is not a tag).
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    match rest[last_slash..].rfind(':') {
        Some(i) => (
            &rest[..last_slash + i],
            Some(&rest[last_slash + i + 1..]),
            digest,
        ),
        None => (rest, None, digest),
    }
}

fn rewrite_image(image: &str, o: &ImageOverride) -> Option<String> {
    let (name, tag, digest) = split_image(image);
    if name != o.name {
        return None;
    }
    let new_name = o.new_name.as_deref().unwrap_or(name);
    Some(if let Some(d) = &o.digest {
        format!("{new_name}@{d}")
    } else if let Some(t) = &o.new_tag {
        format!("{new_name}:{t}")
    } else {
        let mut s = new_name.to_string();
        if let Some(t) = tag {
            s.push(':');
            s.push_str(t);
        }
        if let Some(d) = digest {
            s.push('@');
            s.push_str(d);
        }
        s
    })
}

fn rewrite_images(v: &mut Value, o: &ImageOverride) {
    match v {
        Value::Object(map) => {
            for (k, child) in map.iter_mut() {
                if matches!(k.as_str(), "containers" | "initContainers") {
                    if let Value::Array(list) = child {
                        for c in list {
                            let new = c
                                .get("image")
                                .and_then(Value::as_str)
                                .and_then(|i| rewrite_image(i, o));
                            if let Some(new) = new {
                                c["image"] = Value::String(new);
                            }
                        }
                    }
                }
                rewrite_images(child, o);
            }
        }
        Value::Array(list) => list.iter_mut().for_each(|c| rewrite_images(c, o)),
        _ => {}
    }
}

fn matches_target(t: &PatchTarget, o: &Object) -> bool {
    t.kind.as_deref().is_none_or(|k| k == o.kind())
        && t.name.as_deref().is_none_or(|n| n == o.name())
        && t.namespace
            .as_deref()
            .is_none_or(|n| Some(n) == o.namespace())
}

fn apply_patch(p: &PatchSpec, objects: &mut [Object]) -> Result<()> {
    let body: Value = serde_saphyr::from_str(&p.patch).context("the patch is not YAML/JSON")?;
    if !body.is_array() {
        bail!("only JSON 6902 patches (a list of operations) are implemented here");
    }
    let ops: json_patch::Patch = serde_json::from_value(body).context("not a JSON 6902 patch")?;
    let mut hit = 0;
    for o in objects.iter_mut().filter(|o| matches_target(&p.target, o)) {
        json_patch::patch(&mut o.value, &ops)
            .with_context(|| format!("patching {} {}", o.kind(), o.name()))?;
        hit += 1;
    }
    ensure!(
        hit > 0,
        "the patch's target {:?} matches no object",
        p.target
    );
    Ok(())
}

/// The kinds rendered, in order.
pub fn kinds(r: &Rendered) -> Vec<String> {
    r.objects.iter().map(|o| o.kind().to_string()).collect()
}

/// Every image a rendered pod template or pod names.
pub fn images(r: &Rendered) -> BTreeSet<String> {
    fn walk(v: &Value, out: &mut BTreeSet<String>) {
        match v {
            Value::Object(map) => {
                for (k, child) in map {
                    if matches!(k.as_str(), "containers" | "initContainers") {
                        for c in child.as_array().into_iter().flatten() {
                            if let Some(i) = c.get("image").and_then(Value::as_str) {
                                out.insert(i.to_string());
                            }
                        }
                    }
                    walk(child, out);
                }
            }
            Value::Array(l) => l.iter().for_each(|c| walk(c, out)),
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    for o in &r.objects {
        walk(&o.value, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names_split_like_kustomize() {
        assert_eq!(
            split_image("ghcr.io/a/b:1.0"),
            ("ghcr.io/a/b", Some("1.0"), None)
        );
        assert_eq!(
            split_image("127.0.0.1:5000/a/b"),
            ("127.0.0.1:5000/a/b", None, None)
        );
        assert_eq!(
            split_image("127.0.0.1:5000/a/b:t@sha256:ab"),
            ("127.0.0.1:5000/a/b", Some("t"), Some("sha256:ab"))
        );
        let o = ImageOverride {
            name: "ghcr.io/a/b".into(),
            new_name: Some("r:5000/x".into()),
            new_tag: None,
            digest: Some("sha256:cd".into()),
        };
        assert_eq!(
            rewrite_image("ghcr.io/a/b:1.0", &o).as_deref(),
            Some("r:5000/x@sha256:cd")
        );
        assert_eq!(rewrite_image("ghcr.io/a/bc:1.0", &o), None);
        let tag = ImageOverride {
            digest: None,
            new_tag: Some("2".into()),
            ..o
        };
        assert_eq!(
            rewrite_image("ghcr.io/a/b:1.0", &tag).as_deref(),
            Some("r:5000/x:2")
        );
    }

    /// A component adds its resources to the including kustomization's and its patches reach
    /// the including kustomization's objects; the including namespace reaches the
    /// component's (kusttarget.go: components accumulate before the transformers run). A
    /// component listed as a resource, or a kustomization as a component, is refused.
    #[test]
    fn components_accumulate_into_the_including_kustomization() {
        let dir = std::env::temp_dir().join(format!("hf-kz-comp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let w = |p: &str, t: &str| {
            let f = dir.join(p);
            std::fs::create_dir_all(f.parent().expect("parent")).expect("mkdir");
            std::fs::write(f, t).expect("write");
        };
        w(
            "base/kustomization.yaml",
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [cm.yaml]\n",
        );
        w(
            "base/cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n",
        );
        w(
            "comp/kustomization.yaml",
            "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\nresources: [extra.yaml]\n\
             patches:\n- target: {kind: ConfigMap, name: a}\n  patch: '[{\"op\": \"add\", \"path\": \"/data\", \"value\": {\"k\": \"v\"}}]'\n",
        );
        w(
            "comp/extra.yaml",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: b}\n",
        );
        w(
            "overlay/kustomization.yaml",
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: ns\n\
             resources: [../base]\ncomponents: [../comp]\n",
        );
        let r = render(&dir, Path::new("overlay")).expect("render");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(kinds(&r), ["ConfigMap", "Secret"]);
        assert_eq!(r.objects[0].value["data"]["k"], "v");
        assert!(r.objects.iter().all(|o| o.namespace() == Some("ns")));
        assert_eq!(
            r.files,
            [
                PathBuf::from("base/cm.yaml"),
                PathBuf::from("comp/extra.yaml")
            ]
        );
    }

    #[test]
    fn a_component_as_a_resource_is_refused() {
        let dir = std::env::temp_dir().join(format!("hf-kz-wrong-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("comp")).expect("mkdir");
        std::fs::create_dir_all(dir.join("o")).expect("mkdir");
        std::fs::write(
            dir.join("comp/kustomization.yaml"),
            "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\n",
        )
        .expect("write");
        std::fs::write(
            dir.join("o/kustomization.yaml"),
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [../comp]\n",
        )
        .expect("write");
        let e = render(&dir, Path::new("o")).expect_err("a component as a resource");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            format!("{e:#}").contains("listed under `components`"),
            "{e:#}"
        );
    }

    #[test]
    fn paths_normalize() {
        assert_eq!(
            normalize(Path::new("agent/../wasm.yaml")),
            PathBuf::from("wasm.yaml")
        );
        assert_eq!(normalize(Path::new("a/./b")), PathBuf::from("a/b"));
        assert_eq!(normalize(Path::new("../../m")), PathBuf::from("../../m"));
        assert_eq!(normalize(Path::new("t/i/../../m")), PathBuf::from("m"));
    }
}
