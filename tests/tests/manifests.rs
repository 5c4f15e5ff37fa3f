//! The install manifests (`manifests/`) and the RBAC the code needs, checked without a cluster:
//! every YAML document is parsed the way the API server would read it (k8s-openapi types for
//! Kubernetes kinds, small serde structs for Istio's), and the invariants that matter for a node
//! agent are asserted (docs/install.md says why each holds). Schema validation and Pod Security
//! admission of the rendered install: tests/manifests_admitted.rs.
//!
//! `kubectl`/`kustomize` are not needed: the kustomizations are rendered by
//! holdfast_tests::kustomize. The EnvoyFilter's Wasm config is also loaded by real Envoy
//! (`--mode validate`, the module from disk); that one check skips without Envoy or the filter,
//! unless CI is set. The ClusterRole is compared with the kube-rs calls found in
//! node-agent/src (a small pattern table; see `calls_in`), except `holdfast status --node`'s
//! (it runs with the user's credentials): those are compared with the status reader Role.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use holdfast::lifecycle::drain::DrainSample;
use holdfast_tests::kustomize;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, Namespace, PodSpec, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

const NAMESPACE: &str = "holdfast-system";
/// Capabilities the agent needs (docs/install.md, "Privileges"), spelled as the API expects.
const CAPABILITIES: [&str; 3] = ["NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"];
/// Files meant to be merged by hand into the mesh's config, never applied by a kustomization.
const MERGED_BY_HAND: [&str; 2] = [
    "mesh-config/istiooperator.yaml",
    "mesh-config/istiod-values.yaml",
];
/// Files for Prometheus itself, not the API server: the plain rules file (`rule_files`, the
/// one source the PrometheusRule is generated from; tests/tests/monitoring.rs).
const LOADED_BY_PROMETHEUS: [&str; 1] = ["monitoring/holdfast.rules.yaml"];
/// Kubernetes' default terminationGracePeriodSeconds, which the drain duration must cover.
const DEFAULT_POD_GRACE_SECONDS: u64 = 30;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

fn manifests() -> PathBuf {
    workspace().join("manifests")
}

/// Every YAML document of a file (multi-document aware; empty documents skipped).
fn documents(path: &Path) -> Result<Vec<Value>> {
    kustomize::documents(path)
}

/// Every `*.yaml`/`*.yml` under `dir`, relative to it, sorted.
fn yaml_files(dir: &Path) -> Result<BTreeSet<PathBuf>> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                out.insert(path.strip_prefix(dir)?.to_path_buf());
            }
        }
    }
    Ok(out)
}

/// What a kustomization directory renders (holdfast_tests::kustomize, the renderer the
/// containerd backend and the filter test use too): the resource files it includes
/// (recursively), every kustomization file visited, and the namespace each file's objects end
/// up in. Fails on a missing file or directory.
#[derive(Debug, Default)]
struct Rendered {
    files: Vec<PathBuf>,
    kustomizations: Vec<PathBuf>,
    /// Namespace of the objects of each resource file after rendering.
    namespace_of: BTreeMap<PathBuf, String>,
}

fn rendered(dir: &str) -> Rendered {
    let r = kustomize::render(&manifests(), Path::new(dir))
        .unwrap_or_else(|e| panic!("rendering manifests/{dir}: {e:#}"));
    let mut namespace_of = BTreeMap::new();
    for o in &r.objects {
        if let Some(ns) = o.namespace() {
            namespace_of.insert(o.file.clone(), ns.to_string());
        }
    }
    Rendered {
        files: r.files,
        kustomizations: r.kustomizations,
        namespace_of,
    }
}

/// The objects a kustomization renders: (file, rendered object).
fn objects(dir: &str) -> Vec<(PathBuf, Value)> {
    kustomize::render(&manifests(), Path::new(dir))
        .unwrap_or_else(|e| panic!("rendering manifests/{dir}: {e:#}"))
        .objects
        .into_iter()
        .map(|o| (o.file, o.value))
        .collect()
}

fn kind_of(v: &Value) -> &str {
    v.get("kind").and_then(Value::as_str).unwrap_or("")
}

/// The one object of `kind` the default install renders, parsed as `T`. ClusterRoles: the
/// agent's (`holdfast-agent`); the people's `holdfast-cluster-reader` is read by name.
fn one<T: DeserializeOwned>(dir: &str, kind: &str) -> T {
    let found: Vec<_> = objects(dir)
        .into_iter()
        .filter(|(_, v)| kind_of(v) == kind)
        .filter(|(_, v)| {
            kind != "ClusterRole"
                || v.pointer("/metadata/name") == Some(&Value::from("holdfast-agent"))
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "manifests/{dir} must render exactly one {kind}, found {}",
        found.len()
    );
    let (file, v) = found.into_iter().next().expect("one");
    serde_json::from_value(v)
        .unwrap_or_else(|e| panic!("manifests/{}: not a valid {kind}: {e}", file.display()))
}

fn daemonset() -> DaemonSet {
    one("", "DaemonSet")
}

fn pod_spec(ds: &DaemonSet) -> PodSpec {
    ds.spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("the DaemonSet has a pod template spec")
}

fn agent_container(ds: &DaemonSet) -> Container {
    let spec = pod_spec(ds);
    assert_eq!(spec.containers.len(), 1, "one container: the agent");
    assert!(spec.init_containers.is_none(), "no init containers");
    spec.containers[0].clone()
}

fn args(c: &Container) -> Vec<String> {
    c.args.clone().unwrap_or_default()
}

/// The value following `flag` in the args.
fn arg_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1).map(String::as_str)
}

#[test]
fn every_manifest_is_in_a_kustomization_and_every_listed_file_exists() {
    let all = yaml_files(&manifests()).expect("listing manifests/");
    let default = rendered("");
    let envoyfilter = rendered("envoyfilter");
    let trafficextension = rendered("trafficextension");
    let kuma = rendered("kuma");
    // The optional monitoring component, rendered on its own (as `kustomize build` renders a
    // component directory; tests/tests/manifests_admitted.rs renders it with the install).
    let monitoring = rendered("monitoring");
    // Kuma's filter component, alone (manifests/kuma renders it with the agent).
    let kuma_filter = rendered("kuma-filter");
    let mut covered: BTreeSet<PathBuf> = BTreeSet::new();
    for r in [
        &default,
        &envoyfilter,
        &trafficextension,
        &kuma,
        &monitoring,
        &kuma_filter,
    ] {
        covered.extend(r.files.iter().cloned());
        covered.extend(r.kustomizations.iter().cloned());
    }
    for f in LOADED_BY_PROMETHEUS {
        assert!(
            !covered.contains(Path::new(f)),
            "{f} is for Prometheus, not the API server"
        );
        assert!(all.contains(Path::new(f)), "{f} is missing");
        covered.insert(PathBuf::from(f));
    }
    for f in MERGED_BY_HAND {
        assert!(
            !covered.contains(Path::new(f)),
            "{f} changes the mesh config: it must not be applied by a kustomization"
        );
        assert!(all.contains(Path::new(f)), "{f} is missing");
        covered.insert(PathBuf::from(f));
    }
    let uncovered: Vec<_> = all.difference(&covered).collect();
    assert!(
        uncovered.is_empty(),
        "YAML files under manifests/ that no kustomization applies (list them, or add them to MERGED_BY_HAND or LOADED_BY_PROMETHEUS): {uncovered:?}"
    );
    // Each install has exactly one way to load the filter: never both (double counting).
    let kinds = |dir: &str| -> Vec<String> {
        objects(dir)
            .iter()
            .map(|(_, v)| kind_of(v).to_string())
            .collect()
    };
    let d = kinds("");
    let e = kinds("envoyfilter");
    assert!(
        d.contains(&"WasmPlugin".into()) && !d.contains(&"EnvoyFilter".into()),
        "{d:?}"
    );
    assert!(
        e.contains(&"EnvoyFilter".into()) && !e.contains(&"WasmPlugin".into()),
        "{e:?}"
    );
    let t = kinds("trafficextension");
    assert!(
        t.iter().filter(|k| *k == "TrafficExtension").count() == 2
            && !t.contains(&"WasmPlugin".into())
            && !t.contains(&"EnvoyFilter".into()),
        "{t:?}"
    );
    assert!(!d.contains(&"TrafficExtension".into()) && !e.contains(&"TrafficExtension".into()));
    // Kuma's install: the filter through its MeshProxyPatch, and no Istio kind (a cluster
    // without Istio has none of their CRDs, and `kubectl apply` would refuse the install).
    let k = kinds("kuma");
    assert!(
        k.iter().filter(|x| *x == "MeshProxyPatch").count() == 1
            && !k
                .iter()
                .any(|x| ["WasmPlugin", "EnvoyFilter", "TrafficExtension"].contains(&x.as_str())),
        "{k:?}"
    );
    for other in [&d, &e, &t] {
        assert!(!other.contains(&"MeshProxyPatch".into()), "{other:?}");
    }
    assert_eq!(kinds("kuma-filter"), vec!["MeshProxyPatch".to_string()]);
    // Each carries the whole agent.
    // ClusterRoles: the agent's and the people's holdfast-cluster-reader.
    for (name, k) in [
        ("default", &d),
        ("envoyfilter", &e),
        ("trafficextension", &t),
    ] {
        assert_eq!(
            k.iter().filter(|x| *x == "ClusterRole").count(),
            2,
            "{name}"
        );
    }
    for k in [
        "Namespace",
        "ServiceAccount",
        "ClusterRoleBinding",
        "Role",
        "DaemonSet",
    ] {
        assert_eq!(d.iter().filter(|x| *x == k).count(), 1, "default: {k}");
        assert_eq!(e.iter().filter(|x| *x == k).count(), 1, "envoyfilter: {k}");
        assert_eq!(
            t.iter().filter(|x| *x == k).count(),
            1,
            "trafficextension: {k}"
        );
        assert_eq!(
            kinds("kuma").iter().filter(|x| *x == k).count(),
            1,
            "kuma: {k}"
        );
    }
}

/// The TrafficExtensions are the WasmPlugins as istiod 1.30 translates them (istio/istio 1.30.3
/// pilot/pkg/config/kube/extensions/translate.go `translateWasmPlugin`: selector, phase,
/// priority and match kept; url, sha256, imagePullPolicy, imagePullSecret, pluginConfig,
/// pluginName, failStrategy, vmConfig and type moved under `wasm`): so they reach the same
/// filter config, and what the WasmPlugins' tests prove holds for them.
#[test]
fn trafficextensions_are_the_wasmplugins_as_istio_translates_them() {
    let plugins = objects("");
    let exts = objects("trafficextension");
    let by_name = |list: &[(PathBuf, Value)], kind: &str| -> BTreeMap<String, Value> {
        list.iter()
            .filter(|(_, v)| kind_of(v) == kind)
            .map(|(_, v)| {
                (
                    v["metadata"]["name"].as_str().unwrap().to_string(),
                    v.clone(),
                )
            })
            .collect()
    };
    let (wps, tes) = (
        by_name(&plugins, "WasmPlugin"),
        by_name(&exts, "TrafficExtension"),
    );
    assert_eq!(
        wps.keys().collect::<Vec<_>>(),
        tes.keys().collect::<Vec<_>>()
    );
    for (name, wp) in &wps {
        let mut want = serde_json::Map::new();
        let mut wasm = serde_json::Map::new();
        for (k, v) in wp["spec"].as_object().unwrap() {
            match k.as_str() {
                "selector" | "targetRefs" | "phase" | "priority" | "match" => {
                    want.insert(k.clone(), v.clone());
                }
                "url" | "sha256" | "imagePullPolicy" | "imagePullSecret" | "pluginConfig"
                | "pluginName" | "failStrategy" | "vmConfig" | "type" => {
                    wasm.insert(k.clone(), v.clone());
                }
                other => panic!("{name}: WasmPlugin field {other} has no TrafficExtension place"),
            }
        }
        want.insert("wasm".into(), Value::Object(wasm));
        assert_eq!(tes[name]["spec"], Value::Object(want), "{name}");
        assert_eq!(tes[name]["metadata"], wp["metadata"], "{name}");
    }
}

#[test]
fn agent_objects_live_in_the_holdfast_namespace() {
    let r = rendered("");
    let ns: Namespace = one("", "Namespace");
    assert_eq!(ns.metadata.name.as_deref(), Some(NAMESPACE));
    let all = kustomize::render(&manifests(), Path::new("")).expect("rendering manifests/");
    for o in &all.objects {
        let (file, kind) = (&o.file, o.kind());
        if matches!(kind, "ServiceAccount" | "DaemonSet") {
            let in_file = o
                .original
                .get("metadata")
                .and_then(|m| m.get("namespace"))
                .and_then(Value::as_str);
            let effective = r.namespace_of.get(file).map(String::as_str).or(in_file);
            assert_eq!(effective, Some(NAMESPACE), "{kind} in {}", file.display());
            assert_eq!(in_file, Some(NAMESPACE), "{kind} in {}", file.display());
        }
    }
}

#[test]
fn daemonset_pod_shares_host_pids_not_host_network() {
    let ds = daemonset();
    let spec = pod_spec(&ds);
    assert_eq!(
        spec.host_pid,
        Some(true),
        "hostPID: the agent reads every pod's /proc"
    );
    assert_ne!(
        spec.host_network,
        Some(true),
        "no hostNetwork: netns are entered by setns"
    );
    assert_ne!(spec.host_ipc, Some(true));
    let sa: ServiceAccount = one("", "ServiceAccount");
    assert_eq!(spec.service_account_name, sa.metadata.name);
    // /proc comes with hostPID; nothing of the host's filesystem is mounted.
    for v in spec.volumes.iter().flatten() {
        assert!(v.host_path.is_none(), "hostPath volume {}", v.name);
    }
    assert_eq!(
        spec.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    // Linux nodes only, as istio-cni's DaemonSet, of every architecture: the image is an index
    // of one image per architecture `just image` builds (holdfast_image::arch::Arch::ALL:
    // amd64 and arm64, tests/tests/agent_image.rs reads each back), and the runtime pulls its
    // node's. An architecture selector would leave arm64 nodes without the agent.
    assert_eq!(
        spec.node_selector,
        Some([("kubernetes.io/os".to_string(), "linux".to_string())].into())
    );
    assert_eq!(
        holdfast_image::arch::Arch::ALL.map(|a| a.name()),
        ["amd64", "arm64"],
        "the architectures docs/install.md names"
    );
    let grace = spec
        .termination_grace_period_seconds
        .expect("grace period set");
    assert!(
        (1..=10).contains(&grace),
        "the agent exits at once on SIGTERM, leaving holds for its successor: {grace}s"
    );
    let tolerates_all =
        spec.tolerations.iter().flatten().any(|t| {
            t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none()
        });
    assert!(
        tolerates_all,
        "a toleration with operator Exists and no key/effect: every node"
    );
    // That includes the agent's own startup taint, which it removes once ready
    // (node-agent/src/effects/node_taint.rs): an agent that did not tolerate it could never start.
    let startup_taint = k8s_openapi::api::core::v1::Taint {
        key: holdfast::effects::node_taint::STARTUP_TAINT_KEY.into(),
        effect: holdfast::effects::node_taint::STARTUP_TAINT_EFFECT.into(),
        ..Default::default()
    };
    assert!(
        spec.tolerations.iter().flatten().any(|t| {
            t.operator.as_deref() == Some("Exists")
                && t.key.as_deref().is_none_or(|k| k == startup_taint.key)
                && t.effect
                    .as_deref()
                    .is_none_or(|e| e == startup_taint.effect)
        }),
        "the agent tolerates its own startup taint {}",
        startup_taint.key
    );
    let strategy = ds
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.clone())
        .expect("update strategy");
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    assert_eq!(
        strategy.rolling_update.and_then(|r| r.max_unavailable),
        Some(IntOrString::String("10%".into()))
    );
    // The selector picks the template's pods.
    let selector = ds
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .expect("matchLabels");
    let labels = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .expect("template labels");
    for (k, v) in &selector {
        assert_eq!(labels.get(k), Some(v), "selector label {k}");
    }
}

/// Kuma's install adds exactly the two capabilities only Kuma's pods need (`KILL`: the second
/// SIGTERM that ends kuma-dp's drainTime wait; `DAC_OVERRIDE`: Kuma 2.14's 0600 admin socket),
/// each justified in docs/install.md; the default install grants neither.
#[test]
fn kuma_install_adds_only_kill_and_dac_override() {
    let caps_of = |ds: &DaemonSet| -> BTreeSet<String> {
        let sc = agent_container(ds)
            .security_context
            .expect("securityContext");
        sc.capabilities
            .and_then(|c| c.add)
            .unwrap_or_default()
            .into_iter()
            .collect()
    };
    let default = caps_of(&daemonset());
    let kuma = caps_of(&one("kuma", "DaemonSet"));
    let extra: BTreeSet<String> = kuma.difference(&default).cloned().collect();
    assert_eq!(
        extra,
        BTreeSet::from(["DAC_OVERRIDE".to_string(), "KILL".to_string()]),
        "{kuma:?}"
    );
    assert!(default.is_subset(&kuma));
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/install.md"),
    )
    .expect("docs/install.md");
    for cap in ["`CAP_KILL`", "`CAP_DAC_OVERRIDE`"] {
        assert!(
            doc.lines()
                .any(|l| l.starts_with(&format!("| {cap} (Kuma install)"))),
            "docs/install.md's privileges table justifies {cap} for the Kuma install"
        );
    }
}

#[test]
fn agent_container_has_exactly_the_justified_privileges() {
    let c = agent_container(&daemonset());
    let sc = c.security_context.clone().expect("securityContext");
    assert_ne!(sc.privileged, Some(true), "never privileged");
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.run_as_user, Some(0), "root, for setns and iptables");
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let caps = sc.capabilities.expect("capabilities");
    assert_eq!(caps.drop, Some(vec!["ALL".to_string()]), "drop ALL");
    let added: BTreeSet<String> = caps.add.unwrap_or_default().into_iter().collect();
    let expected: BTreeSet<String> = CAPABILITIES.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        added, expected,
        "each added capability is justified in docs/install.md"
    );
    // The API server rejects `CAP_SYS_ADMIN` together with allowPrivilegeEscalation: false.
    assert!(added.iter().all(|c| !c.starts_with("CAP_")), "{added:?}");
    // As istio-cni (manifests/charts/istio-cni/templates/daemonset.yaml): AppArmor unconfined
    // and SELinux spc_t, so other pods' namespaces are reachable where the node enforces them.
    assert_eq!(
        sc.app_armor_profile.as_ref().map(|p| p.type_.as_str()),
        Some("Unconfined")
    );
    assert_eq!(
        sc.se_linux_options
            .as_ref()
            .and_then(|o| o.type_.as_deref()),
        Some("spc_t")
    );
    // /run is writable on the read-only root (iptables-legacy's lock).
    let mounts = c.volume_mounts.clone().unwrap_or_default();
    let run = mounts
        .iter()
        .find(|m| m.mount_path == "/run")
        .expect("/run mounted");
    assert_ne!(run.read_only, Some(true));
    let spec = pod_spec(&daemonset());
    let vol = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == run.name)
        .expect("the /run volume");
    assert!(vol.empty_dir.is_some(), "/run is an emptyDir");
    assert!(
        c.lifecycle
            .as_ref()
            .and_then(|l| l.pre_stop.clone())
            .is_none(),
        "no preStop"
    );
}

/// Long flag names of `holdfast agent`, read from the clap struct in node-agent/src/main.rs
/// (field `status_listen` is flag `--status-listen`).
fn agent_flags() -> BTreeSet<String> {
    let main = std::fs::read_to_string(workspace().join("node-agent/src/main.rs"))
        .expect("reading node-agent/src/main.rs");
    let body = main
        .split("struct AgentArgs {")
        .nth(1)
        .and_then(|rest| rest.split("\n}").next())
        .expect("struct AgentArgs in main.rs");
    body.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("//") && !l.starts_with('#'))
        .filter_map(|l| l.split_once(": "))
        // Field declarations only (`status_listen: SocketAddr,`), not attribute arguments.
        .filter(|(name, _)| {
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
        })
        .map(|(name, _)| format!("--{}", name.replace('_', "-")))
        .collect()
}

#[test]
fn agent_runs_the_kube_source_for_its_own_node() {
    let c = agent_container(&daemonset());
    let a = args(&c);
    assert_eq!(a.first().map(String::as_str), Some("agent"), "{a:?}");
    assert!(a.contains(&"--kube".to_string()), "{a:?}");
    assert!(
        !a.iter().any(|x| x == "--pods-dir"),
        "--pods-dir conflicts with --kube"
    );
    assert_eq!(arg_value(&a, "--node-name"), Some("$(NODE_NAME)"));
    let flags = agent_flags();
    assert!(
        flags.contains("--node-name") && flags.contains("--kube"),
        "{flags:?}"
    );
    for flag in a.iter().filter(|x| x.starts_with("--")) {
        assert!(
            flags.contains(flag),
            "{flag} is not a flag of `holdfast agent` (main.rs has {flags:?})"
        );
    }
    let node_name = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_NAME")
        .expect("env NODE_NAME");
    let field = node_name
        .value_from
        .as_ref()
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    assert_eq!(
        field,
        Some("spec.nodeName"),
        "NODE_NAME from the downward API"
    );
    // Image tag = the workspace's version; a pinned tag, never latest.
    let image = c.image.clone().expect("image");
    let version = workspace_version();
    assert!(
        image.ends_with(&format!(":{version}")),
        "image {image} should be tagged {version}"
    );
}

fn workspace_version() -> String {
    let cargo = std::fs::read_to_string(workspace().join("Cargo.toml")).expect("Cargo.toml");
    cargo
        .split("[workspace.package]")
        .nth(1)
        .and_then(|s| s.lines().find(|l| l.trim_start().starts_with("version")))
        .and_then(|l| l.split('"').nth(1))
        .expect("[workspace.package] version")
        .to_string()
}

/// The probes go to the health listener on the pod IP (a listener of their own, issue 25), the
/// status API stays on loopback, `/metrics` has its own listener, and the NetworkPolicy admits
/// only Prometheus, to the metrics port.
#[test]
fn probes_have_their_own_listener_and_status_stays_on_loopback() {
    let c = agent_container(&daemonset());
    let a = args(&c);
    let listen = |flag: &str| -> SocketAddr {
        arg_value(&a, flag)
            .unwrap_or_else(|| panic!("{flag} set"))
            .parse()
            .unwrap_or_else(|_| panic!("{flag} is an IP:port"))
    };
    let status = listen("--status-listen");
    assert!(
        status.ip().is_loopback(),
        "/status and /config are for the agent's pod only: got {status}"
    );
    let health = listen("--health-listen");
    let metrics = listen("--metrics-listen");
    for (what, addr) in [("health", health), ("metrics", metrics)] {
        assert!(
            addr.ip().is_unspecified(),
            "kubelet probes and Prometheus reach the pod IP: {what} on 0.0.0.0, got {addr}"
        );
    }
    let ports = c.ports.clone().unwrap_or_default();
    let resolve = |p: &IntOrString| -> i32 {
        match p {
            IntOrString::Int(n) => *n,
            IntOrString::String(name) => {
                ports
                    .iter()
                    .find(|cp| cp.name.as_deref() == Some(name))
                    .unwrap_or_else(|| panic!("probe port {name:?} is not a named container port"))
                    .container_port
            }
        }
    };
    // Liveness: the process answers. Readiness: the first pod list is loaded (`/readyz`).
    for (what, probe, path) in [
        ("liveness", c.liveness_probe.clone(), "/healthz"),
        ("readiness", c.readiness_probe.clone(), "/readyz"),
    ] {
        let get = probe
            .and_then(|p| p.http_get)
            .unwrap_or_else(|| panic!("{what} probe is an httpGet"));
        assert_eq!(get.path.as_deref(), Some(path), "{what}");
        assert_eq!(
            resolve(&get.port),
            i32::from(health.port()),
            "{what} probe port"
        );
    }
    assert!(
        !ports
            .iter()
            .any(|p| p.container_port == i32::from(status.port())),
        "the loopback status port is not a container port: {ports:?}"
    );

    let policy: k8s_openapi::api::networking::v1::NetworkPolicy = one("", "NetworkPolicy");
    let spec = policy.spec.expect("spec");
    assert_eq!(
        spec.pod_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone())
            .unwrap_or_default()
            .get("app.kubernetes.io/component")
            .map(String::as_str),
        Some("agent")
    );
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
    let rules = spec.ingress.unwrap_or_default();
    assert_eq!(rules.len(), 1, "one rule: Prometheus to /metrics");
    let admitted: Vec<i32> = rules[0]
        .ports
        .iter()
        .flatten()
        .filter_map(|p| p.port.as_ref().map(&resolve))
        .collect();
    assert_eq!(
        admitted,
        vec![i32::from(metrics.port())],
        "only the metrics port"
    );
    assert!(
        rules[0].from.as_ref().is_some_and(|f| !f.is_empty()),
        "from a selected namespace only, not from everywhere"
    );
}

/// A Kubernetes quantity in base units (millicores for cpu, bytes for memory).
fn quantity(q: &str) -> f64 {
    let (num, mult) = if let Some(n) = q.strip_suffix('m') {
        (n, 1.0)
    } else if let Some(n) = q.strip_suffix("Ki") {
        (n, 1024.0)
    } else if let Some(n) = q.strip_suffix("Mi") {
        (n, 1024.0 * 1024.0)
    } else if let Some(n) = q.strip_suffix("Gi") {
        (n, 1024.0 * 1024.0 * 1024.0)
    } else {
        (q, 1000.0) // plain cpu cores; plain bytes do not appear in these manifests
    };
    num.parse::<f64>()
        .unwrap_or_else(|_| panic!("quantity {q:?}"))
        * mult
}

#[test]
fn agent_resources_are_bounded() {
    let c = agent_container(&daemonset());
    let r = c.resources.expect("resources");
    let requests = r.requests.expect("requests");
    let limits = r.limits.expect("limits");
    for res in ["cpu", "memory"] {
        let req = quantity(
            &requests
                .get(res)
                .unwrap_or_else(|| panic!("{res} request"))
                .0,
        );
        let lim = quantity(&limits.get(res).unwrap_or_else(|| panic!("{res} limit")).0);
        assert!(
            req > 0.0 && req <= lim,
            "{res}: request {req} <= limit {lim}"
        );
    }
}

#[test]
fn rbac_grants_exactly_pods_read_events_write_and_node_taint_removal() {
    let role: ClusterRole = one("", "ClusterRole");
    let granted = granted_rules(&role);
    let expected: BTreeSet<Rule> = [
        ("", "pods", "list"),
        ("", "pods", "watch"),
        // The startup taint: read the node, patch its taints (node-agent/src/effects/node_taint.rs).
        ("", "nodes", "get"),
        ("", "nodes", "patch"),
        ("events.k8s.io", "events", "create"),
        ("events.k8s.io", "events", "patch"),
    ]
    .into_iter()
    .map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string()))
    .collect();
    assert_eq!(granted, expected);

    let binding: ClusterRoleBinding = one("", "ClusterRoleBinding");
    let sa: ServiceAccount = one("", "ServiceAccount");
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(binding.role_ref.api_group, "rbac.authorization.k8s.io");
    assert_eq!(Some(&binding.role_ref.name), role.metadata.name.as_ref());
    let subjects = binding.subjects.expect("subjects");
    assert_eq!(subjects.len(), 1, "bound to the agent only");
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(Some(&subjects[0].name), sa.metadata.name.as_ref());
    assert_eq!(subjects[0].namespace.as_deref(), Some(NAMESPACE));
}

type Rule = (String, String, String);

fn granted_rules(role: &ClusterRole) -> BTreeSet<Rule> {
    granted(role.rules.as_deref())
}

fn granted(rules: Option<&[PolicyRule]>) -> BTreeSet<Rule> {
    let mut out = BTreeSet::new();
    for rule in rules.into_iter().flatten() {
        assert!(
            rule.resource_names.is_none() && rule.non_resource_urls.is_none(),
            "{rule:?}"
        );
        for g in rule.api_groups.iter().flatten() {
            for r in rule.resources.iter().flatten() {
                for v in &rule.verbs {
                    assert!(
                        g != "*" && r != "*" && v != "*",
                        "no wildcards in the agent's role: {rule:?}"
                    );
                    out.insert((g.clone(), r.clone(), v.clone()));
                }
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// RBAC derived from the code. A deliberately simple scanner: it finds kube-rs API use in the
// agent's sources through a table of patterns, each mapped to the API calls it makes, and fails
// on kube-rs API surface the table does not know (extend the table, and the ClusterRole, then).

/// kube-rs resource types the agent may build an `Api<T>` for: (type, API group, resource).
/// `Event` is events.k8s.io's unless the file imports core/v1's.
const API_TYPES: [(&str, &str, &str); 4] = [
    ("Pod", "", "pods"),
    ("Event", "events.k8s.io", "events"),
    ("Node", "", "nodes"),
    ("ResourceQuota", "", "resourcequotas"),
];

/// Methods of `kube::Api` called as `<api>.method(...).await`, and the verb each needs. A
/// method of the Api surface missing here (status, eviction, exec, logs...) fails the scan.
const API_METHODS: [(&str, &str); 14] = [
    ("get", "get"),
    ("get_opt", "get"),
    ("get_metadata", "get"),
    ("get_metadata_opt", "get"),
    ("list", "list"),
    ("list_metadata", "list"),
    ("watch", "watch"),
    ("watch_metadata", "watch"),
    ("create", "create"),
    ("patch", "patch"),
    ("patch_metadata", "patch"),
    ("replace", "update"),
    ("delete", "delete"),
    ("delete_collection", "deletecollection"),
];

/// Methods of `kube::Api` that reach subresources or other verbs: never expected in the agent.
const FORBIDDEN_METHODS: [&str; 12] = [
    "patch_status",
    "replace_status",
    "get_status",
    "evict",
    "exec",
    "attach",
    "portforward",
    "logs",
    "log_stream",
    "get_subresource",
    "create_subresource",
    "patch_subresource",
];

/// Patterns that imply API calls on their own: kube-runtime's building blocks.
/// (pattern, calls on the file's Api types, fixed calls, why).
type Pattern = (
    &'static str,
    &'static [&'static str],
    &'static [(&'static str, &'static str, &'static str)],
    &'static str,
);
const PATTERNS: [Pattern; 4] = [
    ("watcher(", &["list", "watch"], &[], "kube_runtime::watcher: an initial list, then a watch"),
    ("metadata_watcher(", &["list", "watch"], &[], "kube_runtime::metadata_watcher: list + watch"),
    ("reflector(", &[], &[], "a reflector only stores what a watcher returns"),
    (
        "Recorder",
        &[],
        &[("events.k8s.io", "events", "create"), ("events.k8s.io", "events", "patch")],
        "kube_runtime::events::Recorder: creates an events.k8s.io/v1 Event, patches it when it repeats",
    ),
];

/// kube-rs surface that this table does not cover: finding it fails the scan.
const UNKNOWN_SURFACE: [&str; 5] = [
    "Controller::new",
    "EvictParams",
    "AttachParams",
    "LogParams",
    "DynamicObject",
];

/// Whether a source file uses kube-rs (crate paths, not words like "kubepods" or "--kube").
fn uses_kube(src: &str) -> bool {
    ["kube::", "kube_runtime::", "kube_client::", "use kube;"]
        .iter()
        .any(|p| src.contains(p))
}

/// The API calls one source file makes, as (group, resource, verb), or why it cannot tell.
fn calls_in(src: &str) -> Result<BTreeSet<Rule>> {
    let mut out = BTreeSet::new();
    if !uses_kube(src) {
        return Ok(out);
    }
    // The Api<T> types this file builds.
    let mut types: Vec<(String, String)> = Vec::new();
    let compact: String = src.chars().filter(|c| !c.is_whitespace()).collect();
    for marker in ["Api<", "Api::<"] {
        for piece in compact.split(marker).skip(1) {
            let ty = piece.split(['>', ':']).next().unwrap_or("");
            let ty = ty.rsplit("::").next().unwrap_or(ty);
            let Some((_, group, resource)) = API_TYPES.iter().find(|(t, _, _)| *t == ty) else {
                bail!("Api<{ty}> is not in the table (API_TYPES): add the resource and its verbs");
            };
            let group = if ty == "Event" && compact.contains("core::v1::Event") {
                ""
            } else {
                group
            };
            let entry = (group.to_string(), resource.to_string());
            if !types.contains(&entry) {
                types.push(entry);
            }
        }
    }
    let on_types = |verb: &str, out: &mut BTreeSet<Rule>| {
        for (g, r) in &types {
            out.insert((g.clone(), r.clone(), verb.to_string()));
        }
    };
    for token in UNKNOWN_SURFACE {
        if compact.contains(token) {
            bail!("{token} is kube-rs API use the table does not cover");
        }
    }
    for (pattern, verbs, fixed, _why) in PATTERNS {
        if compact.contains(pattern) {
            ensure!(
                !verbs.is_empty() || !fixed.is_empty() || pattern == "reflector(",
                "pattern {pattern} maps to nothing"
            );
            if !verbs.is_empty() && types.is_empty() {
                bail!("{pattern} used without an Api<T> in the same file: which resource?");
            }
            for v in verbs {
                on_types(v, &mut out);
            }
            for (g, r, v) in fixed {
                out.insert((g.to_string(), r.to_string(), v.to_string()));
            }
        }
    }
    // `.method(args).await`: an awaited call named like an Api method.
    for (method, verb) in API_METHODS {
        if awaited_calls(&compact, method) > 0 {
            if types.is_empty() {
                bail!(".{method}(..).await without an Api<T> in the same file: which resource?");
            }
            on_types(verb, &mut out);
        }
    }
    for method in FORBIDDEN_METHODS {
        if awaited_calls(&compact, method) > 0 {
            bail!(".{method}(..).await: a subresource or verb the agent must not need");
        }
    }
    Ok(out)
}

/// How many times `.method(...)` is directly followed by `.await` in whitespace-free source.
fn awaited_calls(compact: &str, method: &str) -> usize {
    let needle = format!(".{method}(");
    let mut count = 0;
    let mut from = 0;
    while let Some(at) = compact[from..].find(&needle) {
        let open = from + at + needle.len();
        let mut depth = 1usize;
        let mut end = None;
        for (i, ch) in compact[open..].char_indices() {
            match ch {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(open + i + 1);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(end) = end else { break };
        if compact[end..].starts_with(".await") {
            count += 1;
        }
        from = open;
    }
    count
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("listing sources").flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().and_then(|e| e.to_str()) == Some("rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Sources that run as the person at the keyboard, never in the agent: `holdfast status --node`
/// reads a node's agent through the API server with the user's kubeconfig. Their calls are
/// checked against the status reader Role, not the agent's ClusterRole.
const CLI_SOURCES: [&str; 2] = [
    "node-agent/src/cli/remote.rs",
    "node-agent/src/cli/cluster.rs",
];
/// The only agent sources that may use [`CLI_SOURCES`] (the module list and the status CLI).
const CLI_USERS: [&str; 4] = [
    "node-agent/src/cli/mod.rs",
    "node-agent/src/cli/check.rs",
    "node-agent/src/cli/status.rs",
    "node-agent/src/cli/status/tests.rs",
];

/// The API calls of a CLI source: those of [`calls_in`], plus the port-forward, which the
/// agent must never need. `Api::portforward` is a WebSocket upgrade, a GET: the API server
/// authorizes it as `get` on pods/portforward, and from Kubernetes 1.35 also as `create`
/// (AuthorizePodWebsocketUpgradeCreatePermission, kubernetes/kubernetes#134577).
fn cli_calls_in(src: &str) -> Result<BTreeSet<Rule>> {
    let compact: String = src.chars().filter(|c| !c.is_whitespace()).collect();
    let forwards = awaited_calls(&compact, "portforward");
    let mut out = calls_in(&src.replace(".portforward(", ".port_forward_seen("))?;
    if forwards > 0 {
        ensure!(
            compact.contains("Api<Pod>") || compact.contains("Api::<Pod>"),
            ".portforward(..).await without an Api<Pod>: which resource?"
        );
        for verb in ["get", "create"] {
            out.insert(("".into(), "pods/portforward".into(), verb.into()));
        }
    }
    Ok(out)
}

/// Grants made ahead of the code, each with the reason. Shown on every run; a grant that is
/// neither called by the code nor listed here fails the test. Remove an entry once the code uses
/// it (the test then says so).
const PLANNED: [(&str, &str, &str, &str); 0] = [];

#[test]
fn rbac_matches_the_api_calls_the_agent_makes() {
    let role: ClusterRole = one("", "ClusterRole");
    let granted = granted_rules(&role);
    let mut needed = BTreeSet::new();
    let mut kube_files = Vec::new();
    for file in rust_files(&workspace().join("node-agent/src")) {
        let src = std::fs::read_to_string(&file).expect("reading a source file");
        // Unit tests inside a file (mock API servers) do not run in the cluster.
        let src = src.split("#[cfg(test)]").next().unwrap_or("");
        let rel = file
            .strip_prefix(workspace())
            .expect("under the workspace")
            .to_string_lossy()
            .to_string();
        if CLI_SOURCES.contains(&rel.as_str()) {
            continue;
        }
        assert!(
            CLI_USERS.contains(&rel.as_str()) || !src.contains("cli::remote::"),
            "{rel} uses the CLI's remote status code: the agent would need the user's RBAC"
        );
        let calls = calls_in(src).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        if uses_kube(src) {
            kube_files.push(file.clone());
        }
        needed.extend(calls);
    }
    let missing: Vec<_> = needed.difference(&granted).collect();
    assert!(
        missing.is_empty(),
        "the code makes API calls the ClusterRole does not grant: {missing:?}"
    );
    if kube_files.is_empty() {
        println!(
            "NOTE: no kube-rs code in node-agent/src yet (the --kube source is being written): \
             only checked that nothing the code does is missing from the ClusterRole"
        );
        return;
    }
    let planned: BTreeSet<Rule> = PLANNED
        .iter()
        .map(|(g, r, v, _)| (g.to_string(), r.to_string(), v.to_string()))
        .collect();
    let stale: Vec<_> = planned.intersection(&needed).collect();
    assert!(
        stale.is_empty(),
        "the code now makes these calls: remove them from PLANNED: {stale:?}"
    );
    for (g, r, v, why) in PLANNED {
        println!("NOTE: granted ahead of the code: {g}/{r} {v}: {why}");
    }
    let unused: Vec<_> = granted
        .difference(&needed)
        .filter(|rule| !planned.contains(*rule))
        .collect();
    assert!(
        unused.is_empty(),
        "the ClusterRole grants what the code never calls (remove it): {unused:?}; kube-rs files: {kube_files:?}"
    );
}

/// `holdfast status --node` and `holdfast check` need exactly what the reader Role (in the
/// agent's namespace) and the ClusterRole holdfast-cluster-reader grant together: the Role the
/// namespaced calls, the ClusterRole the cluster-scoped nodes list.
#[test]
fn status_reader_role_grants_exactly_what_status_node_calls() {
    let role: Role = one("", "Role");
    assert_eq!(
        role.metadata.name.as_deref(),
        Some("holdfast-status-reader")
    );
    let r = rendered("");
    let file = objects("")
        .into_iter()
        .find(|(_, v)| kind_of(v) == "Role")
        .map(|(f, _)| f)
        .expect("the Role's file");
    let namespace = r
        .namespace_of
        .get(&file)
        .cloned()
        .or(role.metadata.namespace.clone());
    assert_eq!(namespace.as_deref(), Some(NAMESPACE));
    let cluster_reader: ClusterRole = objects("")
        .into_iter()
        .find(|(_, v)| {
            kind_of(v) == "ClusterRole"
                && v.pointer("/metadata/name") == Some(&Value::from("holdfast-cluster-reader"))
        })
        .map(|(_, v)| serde_json::from_value(v).expect("a ClusterRole"))
        .expect("the ClusterRole holdfast-cluster-reader");
    let cluster_granted = granted_rules(&cluster_reader);
    assert!(
        cluster_granted.iter().all(|(_, r, _)| r == "nodes"),
        "the cluster-wide grant is for nodes only: {cluster_granted:?}"
    );
    let mut granted = granted(role.rules.as_deref());
    granted.extend(cluster_granted);
    let mut needed = BTreeSet::new();
    for rel in CLI_SOURCES {
        let src = std::fs::read_to_string(workspace().join(rel)).expect("reading a CLI source");
        let src = src.split("#[cfg(test)]").next().unwrap_or("");
        needed.extend(cli_calls_in(src).unwrap_or_else(|e| panic!("{rel}: {e}")));
    }
    let expected: BTreeSet<Rule> = [
        ("", "pods", "list"),
        ("", "pods/portforward", "get"),
        ("", "pods/portforward", "create"),
        ("", "resourcequotas", "list"),
        ("", "nodes", "list"),
    ]
    .into_iter()
    .map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string()))
    .collect();
    assert_eq!(
        needed, expected,
        "what the scanner finds in {CLI_SOURCES:?}"
    );
    assert_eq!(
        granted, needed,
        "the Role and `holdfast status --node` disagree"
    );
    // People are bound by the cluster's admin; the install binds nobody (least of all the
    // agent's ServiceAccount) to it.
    assert!(
        objects("").iter().all(|(_, v)| kind_of(v) != "RoleBinding"),
        "the install must not bind the reader Role"
    );
}

#[test]
fn rbac_scanner_sees_watch_get_recorder_and_refuses_unknown_calls() {
    let src = r#"
        use kube::{Api, runtime::{watcher, events::Recorder}};
        use k8s_openapi::api::core::v1::Pod;
        async fn run(client: kube::Client) -> Result<(), kube::Error> {
            let pods: Api<Pod> = Api::all(client.clone());
            let stream = watcher(pods.clone(), watcher::Config::default().fields("spec.nodeName=n"));
            let one = pods
                .get_opt("x")
                .await?;
            let map = std::collections::HashMap::<u8, u8>::new();
            let _ = map.get(&1);
            let recorder = Recorder::new(client, reporter);
            Ok(())
        }
    "#;
    let calls = calls_in(src).expect("known patterns");
    let names: BTreeSet<String> = calls
        .iter()
        .map(|(g, r, v)| format!("{g}/{r}:{v}"))
        .collect();
    let expected: BTreeSet<String> = [
        "/pods:get",
        "/pods:list",
        "/pods:watch",
        "events.k8s.io/events:create",
        "events.k8s.io/events:patch",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(names, expected);

    let deletes = src.replace(
        ".get_opt(\"x\")",
        ".delete(\"x\", &DeleteParams::default())",
    );
    let calls = calls_in(&deletes).expect("delete is a known method");
    assert!(
        calls.contains(&("".into(), "pods".into(), "delete".into())),
        "{calls:?}"
    );

    let forwards = src.replace(".get_opt(\"x\")", ".portforward(\"x\", &[15300])");
    assert!(
        calls_in(&forwards).is_err(),
        "the agent must not port-forward"
    );
    let cli = cli_calls_in(&forwards).expect("the CLI may port-forward");
    for verb in ["get", "create"] {
        assert!(
            cli.contains(&("".into(), "pods/portforward".into(), verb.into())),
            "{cli:?}"
        );
    }

    let evicts = src.replace(".get_opt(\"x\")", ".evict(\"x\", &EvictParams::default())");
    assert!(calls_in(&evicts).is_err(), "eviction is not in the table");
    let secrets = src.replace("Api<Pod>", "Api<Secret>");
    assert!(
        calls_in(&secrets).is_err(),
        "Api<Secret> is not in the table"
    );
    assert!(calls_in("let x = kubepods; // --kube")
        .expect("no kube")
        .is_empty());
}

// ---------------------------------------------------------------------------------------------
// Istio objects: small serde structs with the fields holdfast sets.

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: String,
    namespace: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WasmPlugin {
    api_version: String,
    metadata: Meta,
    spec: WasmPluginSpec,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WasmPluginSpec {
    #[serde(rename = "type")]
    type_: String,
    phase: Option<String>,
    url: String,
    sha256: Option<String>,
    image_pull_policy: Option<String>,
    fail_strategy: Option<String>,
    plugin_name: Option<String>,
    plugin_config: Option<Value>,
    selector: Option<Value>,
    target_refs: Option<Value>,
    #[serde(rename = "match")]
    match_: Option<Value>,
}

/// Every object of `kind` the install in `dir` renders, parsed as `T`.
fn all_of<T: DeserializeOwned>(dir: &str, kind: &str) -> Vec<T> {
    objects(dir)
        .into_iter()
        .filter(|(_, v)| kind_of(v) == kind)
        .map(|(file, v)| {
            serde_json::from_value(v)
                .unwrap_or_else(|e| panic!("manifests/{}: not a valid {kind}: {e}", file.display()))
        })
        .collect()
}

/// Two WasmPlugins of the same module, one per direction: Istio applies `match` mode SERVER to
/// the sidecar's inbound listeners and CLIENT to its outbound ones — and to gateways' listeners
/// (istio/istio pilot/pkg/model/extensions.go `workloadModeForListenerClass`, 1.24.6–1.30.3) —
/// so each names its `direction` in pluginConfig and both select sidecars only, by the label
/// Istio's sidecar injection template sets and its gateway templates do not
/// (`security.istio.io/tlsMode`, manifests/charts/istio-control/istio-discovery/files/).
/// `pluginName` is the filter's root id (extensions.go `buildPluginConfig`).
#[test]
fn wasmplugins_are_fail_open_network_filters_one_per_direction_for_the_whole_mesh() {
    let plugins: Vec<WasmPlugin> = all_of("", "WasmPlugin");
    assert_eq!(plugins.len(), 2, "one WasmPlugin per direction");
    let mut seen = BTreeSet::new();
    let mut urls = BTreeSet::new();
    for p in plugins {
        assert_eq!(p.api_version, "extensions.istio.io/v1alpha1");
        assert_eq!(
            p.metadata.namespace.as_deref(),
            Some("istio-system"),
            "root namespace: every sidecar"
        );
        let s = p.spec;
        assert_eq!(s.type_, "NETWORK", "an L4 filter: every TCP connection");
        assert_eq!(
            s.phase.as_deref(),
            Some("AUTHN"),
            "first in the filter chain"
        );
        assert_eq!(
            s.fail_strategy.as_deref(),
            Some("FAIL_OPEN"),
            "never break traffic"
        );
        assert!(
            s.target_refs.is_none(),
            "targetRefs name Gateways or Services, not sidecars"
        );
        assert_eq!(
            s.selector,
            Some(serde_json::json!({"matchLabels": {"security.istio.io/tlsMode": "istio"}})),
            "{}: sidecars only, never a gateway",
            p.metadata.name
        );
        assert_eq!(
            s.plugin_name.as_deref(),
            Some("holdfast"),
            "{}: pluginName is the root id",
            p.metadata.name
        );
        assert!(
            matches!(
                s.image_pull_policy.as_deref(),
                None | Some("IfNotPresent" | "Always")
            ),
            "{:?}",
            s.image_pull_policy
        );
        // One mode, no ports: every listener of that side.
        let modes: Vec<&str> = s
            .match_
            .as_ref()
            .and_then(Value::as_array)
            .map(|m| m.iter().filter_map(|t| str_at(t, &["mode"])).collect())
            .unwrap_or_default();
        let mode = match modes.as_slice() {
            [m] => *m,
            other => panic!("{}: match must be one mode, got {other:?}", p.metadata.name),
        };
        let selectors = s.match_.as_ref().and_then(Value::as_array);
        assert!(
            selectors.is_some_and(|m| m.iter().all(|t| t.get("ports").is_none())),
            "{}: no port selector (every listener of that side)",
            p.metadata.name
        );
        let direction = match mode {
            "SERVER" => "inbound",
            "CLIENT" => "outbound",
            other => panic!("{}: mode {other} is not one direction", p.metadata.name),
        };
        assert_eq!(p.metadata.name, format!("holdfast-{direction}"));
        // The configuration the filter gets: exactly its direction (defaults otherwise).
        let config = s.plugin_config.expect("pluginConfig");
        let json = serde_json::to_string(&config).expect("pluginConfig as JSON");
        assert_eq!(
            json,
            format!(r#"{{"direction":"{direction}"}}"#),
            "{}",
            p.metadata.name
        );
        assert!(seen.insert(mode.to_string()), "{mode} twice");
        let version = workspace_version();
        if let Some(image) = s.url.strip_prefix("oci://") {
            assert!(
                image.ends_with(&format!(":{version}")) || image.contains("@sha256:"),
                "{image}"
            );
        } else {
            assert!(
                s.url.starts_with("https://"),
                "oci:// or https:// url: {}",
                s.url
            );
            assert!(
                s.sha256.is_some(),
                "an https module needs its sha256 pinned"
            );
        }
        urls.insert((s.url, s.sha256));
    }
    assert_eq!(urls.len(), 1, "both load the same module: {urls:?}");
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EnvoyFilter {
    api_version: String,
    metadata: Meta,
    spec: EnvoyFilterSpec,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct EnvoyFilterSpec {
    config_patches: Vec<ConfigPatch>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ConfigPatch {
    apply_to: String,
    #[serde(rename = "match")]
    match_: Option<PatchMatch>,
    patch: Patch,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PatchMatch {
    context: Option<String>,
    listener: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Patch {
    operation: String,
    value: Value,
}

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    at(v, path).and_then(Value::as_str)
}

#[test]
fn envoyfilter_inserts_the_filter_first_inbound_and_outbound() {
    let f: EnvoyFilter = one("envoyfilter", "EnvoyFilter");
    assert_eq!(f.api_version, "networking.istio.io/v1alpha3");
    assert_eq!(f.metadata.name, "holdfast");
    assert_eq!(f.metadata.namespace.as_deref(), Some("istio-system"));
    let mut contexts = BTreeSet::new();
    let mut clusters_used = BTreeSet::new();
    for p in f
        .spec
        .config_patches
        .iter()
        .filter(|p| p.apply_to == "NETWORK_FILTER")
    {
        let m = p
            .match_
            .as_ref()
            .expect("a NETWORK_FILTER patch matches a context");
        let ctx = m.context.clone().expect("context");
        assert!(
            m.listener.is_some(),
            "{ctx}: matches listeners' filter chains"
        );
        assert_eq!(p.patch.operation, "INSERT_FIRST", "{ctx}");
        let v = &p.patch.value;
        assert_eq!(
            str_at(v, &["name"]),
            Some("envoy.filters.network.wasm"),
            "{ctx}"
        );
        assert_eq!(
            str_at(v, &["typed_config", "@type"]),
            Some("type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm")
        );
        let config = at(v, &["typed_config", "config"]).expect("Wasm config");
        assert_eq!(str_at(config, &["root_id"]), Some("holdfast"), "{ctx}");
        // The patch's context is its direction: the filter is told, and reads nothing per
        // connection.
        let direction = match ctx.as_str() {
            "SIDECAR_INBOUND" => "inbound",
            "SIDECAR_OUTBOUND" => "outbound",
            other => panic!("unexpected context {other}"),
        };
        let plugin_config: serde_json::Value = serde_json::from_str(
            str_at(config, &["configuration", "value"]).expect("configuration value"),
        )
        .expect("configuration is JSON");
        assert_eq!(
            plugin_config,
            serde_json::json!({ "direction": direction }),
            "{ctx}"
        );
        assert_eq!(
            at(config, &["fail_open"]).and_then(Value::as_bool),
            Some(true),
            "{ctx}"
        );
        assert_eq!(
            str_at(config, &["vm_config", "runtime"]),
            Some("envoy.wasm.runtime.v8")
        );
        let code = at(config, &["vm_config", "code"]).expect("vm_config.code");
        if let Some(remote) = code.get("remote") {
            let sha = str_at(remote, &["sha256"]).expect("remote code needs sha256");
            assert!(!sha.is_empty());
            let uri = str_at(remote, &["http_uri", "uri"]).expect("uri");
            assert!(uri.starts_with("https://"), "{uri}");
            clusters_used.insert(
                str_at(remote, &["http_uri", "cluster"])
                    .expect("cluster")
                    .to_string(),
            );
        } else {
            assert!(code.get("local").is_some(), "code is remote or local");
        }
        assert!(contexts.insert(ctx.clone()), "{ctx} patched twice");
    }
    let expected: BTreeSet<String> = ["SIDECAR_INBOUND", "SIDECAR_OUTBOUND"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(contexts, expected);
    // Every download cluster the remote code names is added by the same EnvoyFilter.
    let added: BTreeSet<String> = f
        .spec
        .config_patches
        .iter()
        .filter(|p| p.apply_to == "CLUSTER" && p.patch.operation == "ADD")
        .filter_map(|p| str_at(&p.patch.value, &["name"]).map(String::from))
        .collect();
    for c in &clusters_used {
        assert!(
            added.contains(c),
            "cluster {c} is used but not added: {added:?}"
        );
    }
}

/// Parses `30s`, `1m`, `1m30s` (the forms the mesh config uses) into seconds.
fn duration_seconds(s: &str) -> u64 {
    holdfast::config::parse_duration(s)
        .unwrap_or_else(|e| panic!("duration {s:?}: {e}"))
        .as_secs()
}

#[test]
fn mesh_config_keeps_envoy_for_the_whole_grace_period() {
    let dir = manifests();
    let op = documents(&dir.join(MERGED_BY_HAND[0])).expect("istiooperator.yaml");
    assert_eq!(op.len(), 1);
    assert_eq!(str_at(&op[0], &["kind"]), Some("IstioOperator"));
    let values = documents(&dir.join(MERGED_BY_HAND[1])).expect("istiod-values.yaml");
    assert_eq!(values.len(), 1);
    for (what, default_config) in [
        (
            "IstioOperator",
            at(&op[0], &["spec", "meshConfig", "defaultConfig"]),
        ),
        (
            "istiod values",
            at(&values[0], &["meshConfig", "defaultConfig"]),
        ),
    ] {
        let dc = default_config.unwrap_or_else(|| panic!("{what}: meshConfig.defaultConfig"));
        let drain = str_at(dc, &["terminationDrainDuration"])
            .unwrap_or_else(|| panic!("{what}: terminationDrainDuration"));
        assert_eq!(
            duration_seconds(drain),
            DEFAULT_POD_GRACE_SECONDS,
            "{what}: drain as long as the default grace period"
        );
        // The filter's stats need no inclusion prefix: Istio keeps every `wasm*` stat
        // (istio/istio pkg/bootstrap/config.go, master at 86c9f01:
        // requiredEnvoyStatsMatcherInclusionPrefixes = "cluster_manager,listener_manager,
        // server,cluster.xds-grpc,wasm", always prepended to the mesh's list), and a list of
        // ours would replace the user's own (lists are never merged).
        const ISTIO_REQUIRED_PREFIXES: [&str; 5] = [
            "cluster_manager",
            "listener_manager",
            "server",
            "cluster.xds-grpc",
            "wasm",
        ];
        assert!(ISTIO_REQUIRED_PREFIXES
            .iter()
            .any(|p| "wasmcustom.holdfast.inbound.cx_active".starts_with(p)));
        assert!(
            at(dc, &["proxyStatsMatcher", "inclusionPrefixes"]).is_none(),
            "{what}: no inclusionPrefixes (a no-op that would replace the user's list)"
        );
        // Envoy's byte counters, which the drain's idle test reads, every one the agent's own
        // parser counts (Istio's default matcher keeps none: pkg/bootstrap/config.go).
        let suffixes: Vec<&str> = at(dc, &["proxyStatsMatcher", "inclusionSuffixes"])
            .and_then(Value::as_array)
            .map(|s| s.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for stat in [
            "http.admin.downstream_cx_rx_bytes_total",
            "http.inbound_0.0.0.0_8080.downstream_cx_tx_bytes_total",
            "tcp.outbound|9080||reviews.default.svc.cluster.local.downstream_cx_rx_bytes_total",
            "tcp.PassthroughCluster.downstream_cx_tx_bytes_total",
            "tcp.InboundPassthroughCluster.downstream_cx_tx_bytes_buffered",
            "http.inbound_0.0.0.0_8080.downstream_cx_tx_bytes_buffered",
        ] {
            assert!(
                suffixes.iter().any(|x| stat.ends_with(x)),
                "{what}: {stat} is kept: {suffixes:?}"
            );
            let sample = DrainSample::from_stats_skipping(
                "wasmcustom.holdfast",
                &holdfast::mesh::istio::OWN_HTTP_PREFIXES,
                [(stat, 1u64)],
            );
            assert!(
                sample.traffic.exposed || sample.traffic.total == 1 || sample.traffic.buffered == 1,
                "the agent reads {stat}"
            );
        }
    }
}

/// The images the manifests name are the ones `just image` builds and pins: the names its
/// kustomize edits match (holdfast_image::pin), tagged with the workspace's version until
/// pinned. There is no Dockerfile: `just image` is the one build (docs/images.md).
#[test]
fn manifests_name_the_images_just_image_builds() {
    let version = workspace_version();
    let c = agent_container(&daemonset());
    assert_eq!(
        c.image.as_deref(),
        Some(format!("{}:{version}", holdfast_image::pin::AGENT_IMAGE_NAME).as_str()),
        "the DaemonSet's image is what `kustomize edit set image` pins"
    );
    for p in all_of::<WasmPlugin>("", "WasmPlugin") {
        assert_eq!(
            p.spec.url,
            format!("oci://{}:{version}", holdfast_image::pin::FILTER_IMAGE_NAME),
            "{}: the url the WasmPlugin patch replaces",
            p.metadata.name
        );
    }
    for stale in ["Dockerfile", "manifests/filter.Dockerfile", ".dockerignore"] {
        assert!(
            !workspace().join(stale).exists(),
            "{stale}: images are built by `just image` (docs/images.md), not Docker"
        );
    }
}

/// Whether a privileged/tool-dependent check may skip: not when CI is set.
fn skip_or_fail(why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{why} (CI is set: not skipping)");
    }
    eprintln!("SKIP: {why}");
}

/// Envoy and the filter module, or `None` after skipping (fails under CI).
fn envoy_and_filter() -> Option<(PathBuf, PathBuf)> {
    match (
        holdfast_tests::envoy::envoy_binary(),
        holdfast_tests::envoy::filter_wasm(),
    ) {
        (Ok(e), Ok(w)) => Some((e, w)),
        (e, w) => {
            skip_or_fail(&format!(
                "needs Envoy and the filter (`just setup`, `just filter`): {:?} {:?}",
                e.err(),
                w.err()
            ));
            None
        }
    }
}

/// Loads `filters` (each the Wasm network filter as a manifest delivers it, with its listener
/// direction) and `clusters` into real Envoy (`--mode validate`), the module from disk instead
/// of the release URL, each filter first in a listener's chain before a tcp_proxy, as the
/// manifest puts it. Fails with Envoy's words if Envoy rejects the config or the filter fails
/// to load.
fn loads_in_real_envoy(
    what: &str,
    envoy: &Path,
    wasm: &Path,
    filters: Vec<(&str, Value)>,
    clusters: Vec<Value>,
) {
    let mut listeners = Vec::new();
    for (i, (direction, mut value)) in filters.into_iter().enumerate() {
        value["typed_config"]["config"]["vm_config"]["code"] =
            serde_json::json!({ "local": { "filename": wasm } });
        listeners.push(serde_json::json!({
            "name": format!("l{i}"),
            "traffic_direction": direction,
            "address": { "socket_address": { "address": "127.0.0.1", "port_value": 0 } },
            "filter_chains": [{ "filters": [value, {
                "name": "envoy.filters.network.tcp_proxy",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                    "stat_prefix": "t",
                    "cluster": "holdfast-filter-download"
                }
            }]}]
        }));
    }
    let bootstrap = serde_json::json!({
        "admin": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": 0 } } },
        "static_resources": { "listeners": listeners, "clusters": clusters }
    });
    let dir = std::env::temp_dir().join(format!("hf-manifests-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("bootstrap.json");
    std::fs::write(&path, bootstrap.to_string()).expect("writing the bootstrap");
    let out = std::process::Command::new(envoy)
        .args(["--mode", "validate", "--log-level", "warn", "-c"])
        .arg(&path)
        .output()
        .expect("running envoy --mode validate");
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "envoy rejected the {what}'s config:\n{text}"
    );
    assert!(text.contains("OK"), "{text}");
    assert!(
        !text.contains("failed to load"),
        "the filter did not load:\n{text}"
    );
}

#[test]
fn envoyfilter_wasm_config_loads_in_real_envoy() {
    let Some((envoy, wasm)) = envoy_and_filter() else {
        return;
    };
    let f: EnvoyFilter = one("envoyfilter", "EnvoyFilter");
    let mut filters = Vec::new();
    let mut clusters = Vec::new();
    for p in &f.spec.config_patches {
        let value: Value = serde_json::to_value(&p.patch.value).expect("patch value as JSON");
        match p.apply_to.as_str() {
            "NETWORK_FILTER" => {
                let ctx = p.match_.as_ref().and_then(|m| m.context.clone());
                let direction = if ctx.as_deref() == Some("SIDECAR_INBOUND") {
                    "INBOUND"
                } else {
                    "OUTBOUND"
                };
                filters.push((direction, value));
            }
            "CLUSTER" => clusters.push(value),
            other => panic!("unexpected applyTo {other}"),
        }
    }
    loads_in_real_envoy("EnvoyFilter", &envoy, &wasm, filters, clusters);
}

// ---------------------------------------------------------------------------------------------
// Kuma: the filter through a MeshProxyPatch (manifests/kuma-filter/).

/// One `appendModifications` entry of the MeshProxyPatch, its `value` parsed as kuma-cp parses
/// it (YAML, then an Envoy resource: pkg/plugins/policies/meshproxypatch/plugin/v1alpha1).
struct KumaModification {
    /// `networkFilter`, `cluster`, ...
    kind: String,
    operation: String,
    origin: Option<String>,
    value: Option<Value>,
}

fn meshproxypatch() -> Value {
    let found: Vec<_> = objects("kuma-filter")
        .into_iter()
        .filter(|(_, v)| kind_of(v) == "MeshProxyPatch")
        .map(|(_, v)| v)
        .collect();
    assert_eq!(found.len(), 1, "manifests/kuma-filter: one MeshProxyPatch");
    found.into_iter().next().expect("one")
}

/// The modifications of a MeshProxyPatch, checked as Kuma's admission validator checks them
/// (kumahq/kuma v2.14.3 pkg/plugins/policies/meshproxypatch/api/v1alpha1/validator.go
/// `validateDefault`: at least one; exactly one kind per entry; `validateNetworkFilterMod`:
/// AddFirst / AddLast need a `value`; `validateClusterMod`: Add needs a `value` and no
/// `match`), each failure an Err naming the entry.
fn kuma_modifications(mpp: &Value) -> Result<Vec<KumaModification>> {
    const KINDS: [&str; 5] = [
        "cluster",
        "listener",
        "virtualHost",
        "networkFilter",
        "httpFilter",
    ];
    let list = mpp
        .pointer("/spec/default/appendModifications")
        .and_then(Value::as_array)
        .context("spec.default.appendModifications")?;
    ensure!(!list.is_empty(), "appendModifications: must not be empty");
    let mut out = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let present: Vec<&str> = KINDS
            .iter()
            .copied()
            .filter(|k| m.get(*k).is_some())
            .collect();
        ensure!(
            present.len() == 1,
            "appendModifications[{i}]: exactly one modification can be defined at a time. Currently, {} modifications are defined",
            present.len()
        );
        let kind = present[0];
        let body = &m[kind];
        let operation = body["operation"].as_str().unwrap_or_default().to_string();
        let value = match body.get("value").and_then(Value::as_str) {
            Some(text) => Some(
                serde_saphyr::from_str::<Value>(text)
                    .with_context(|| format!("appendModifications[{i}].{kind}.value: not YAML"))?,
            ),
            None => None,
        };
        match (kind, operation.as_str()) {
            ("networkFilter", "AddFirst" | "AddLast") | ("cluster", "Add") => {
                ensure!(
                    value.is_some(),
                    "appendModifications[{i}].{kind}.value: must be defined"
                );
            }
            _ => bail!("appendModifications[{i}]: {kind} {operation} is not one holdfast uses"),
        }
        if kind == "cluster" {
            ensure!(
                body.get("match").is_none(),
                "appendModifications[{i}].cluster.match: must not be defined"
            );
        }
        out.push(KumaModification {
            kind: kind.to_string(),
            operation,
            origin: body
                .pointer("/match/origin")
                .and_then(Value::as_str)
                .map(String::from),
            value,
        });
    }
    Ok(out)
}

/// Kuma gets the very filter Istio's EnvoyFilter delivers (name, root id, vm id, direction,
/// fail-open, code, and so the stat prefix the agent reads), first in every chain of the
/// sidecar's inbound and outbound listeners, with the same download cluster; the policy covers
/// the whole mesh from the control plane's namespace.
#[test]
fn meshproxypatch_is_the_envoyfilters_filter_for_kuma() {
    let mpp = meshproxypatch();
    assert_eq!(mpp["apiVersion"], "kuma.io/v1alpha1");
    assert_eq!(mpp["metadata"]["namespace"], "kuma-system");
    assert_eq!(mpp["metadata"]["labels"]["kuma.io/mesh"], "default");
    assert_eq!(
        mpp["spec"]["targetRef"],
        serde_json::json!({ "kind": "Mesh" }),
        "every data plane proxy of the mesh"
    );
    let mods = kuma_modifications(&mpp).unwrap_or_else(|e| panic!("{e:#}"));
    let f: EnvoyFilter = one("envoyfilter", "EnvoyFilter");
    let istio = |apply_to: &str, context: Option<&str>| -> Value {
        let p = f
            .spec
            .config_patches
            .iter()
            .find(|p| {
                p.apply_to == apply_to
                    && p.match_.as_ref().and_then(|m| m.context.as_deref()) == context
            })
            .unwrap_or_else(|| panic!("the EnvoyFilter's {apply_to} {context:?} patch"));
        serde_json::to_value(&p.patch.value).expect("JSON")
    };
    let mut origins = BTreeSet::new();
    for m in mods.iter().filter(|m| m.kind == "networkFilter") {
        assert_eq!(
            m.operation, "AddFirst",
            "first in every chain, as INSERT_FIRST"
        );
        let origin = m
            .origin
            .clone()
            .expect("a network filter matches an origin");
        let context = match origin.as_str() {
            "inbound" => "SIDECAR_INBOUND",
            "outbound" => "SIDECAR_OUTBOUND",
            other => panic!("origin {other}: holdfast patches inbound and outbound only"),
        };
        assert_eq!(
            m.value.as_ref(),
            Some(&istio("NETWORK_FILTER", Some(context))),
            "{origin}: the EnvoyFilter's filter, value for value"
        );
        assert!(origins.insert(origin.clone()), "{origin} patched twice");
    }
    assert_eq!(
        origins,
        ["inbound", "outbound"].map(String::from).into(),
        "one filter per direction"
    );
    let clusters: Vec<_> = mods.iter().filter(|m| m.kind == "cluster").collect();
    assert_eq!(clusters.len(), 1, "the download cluster");
    assert_eq!(
        clusters[0].value.as_ref(),
        Some(&istio("CLUSTER", Some("SIDECAR_OUTBOUND"))),
        "the EnvoyFilter's download cluster"
    );
    assert_eq!(mods.len(), 3, "two filters and the cluster, nothing else");
}

/// The ported validator refuses what Kuma's refuses (so the test above can fail).
#[test]
fn kuma_validator_port_refuses_what_kuma_refuses() {
    let mpp = meshproxypatch();
    let refused = |what: &str, edit: &dyn Fn(&mut Value), expect: &str| {
        let mut v = mpp.clone();
        edit(&mut v);
        let e = match kuma_modifications(&v) {
            Ok(_) => panic!("{what}: accepted"),
            Err(e) => format!("{e:#}"),
        };
        assert!(e.contains(expect), "{what}: {e}");
    };
    refused(
        "two kinds in one entry",
        &|v| {
            v["spec"]["default"]["appendModifications"][0]["cluster"] =
                serde_json::json!({"operation": "Remove"})
        },
        "exactly one modification",
    );
    refused(
        "AddFirst without value",
        &|v| {
            v["spec"]["default"]["appendModifications"][0]["networkFilter"]
                .as_object_mut()
                .expect("object")
                .remove("value");
        },
        "value: must be defined",
    );
    refused(
        "cluster Add with a match",
        &|v| {
            v["spec"]["default"]["appendModifications"][2]["cluster"]["match"] =
                serde_json::json!({"name": "x"})
        },
        "cluster.match: must not be defined",
    );
    refused(
        "no modifications",
        &|v| v["spec"]["default"]["appendModifications"] = serde_json::json!([]),
        "must not be empty",
    );
}

/// What kuma-cp would put into a Kuma sidecar's listeners and clusters, loaded by real Envoy:
/// the module loads from the MeshProxyPatch's filter config.
#[test]
fn meshproxypatch_wasm_config_loads_in_real_envoy() {
    let Some((envoy, wasm)) = envoy_and_filter() else {
        return;
    };
    let mods = kuma_modifications(&meshproxypatch()).unwrap_or_else(|e| panic!("{e:#}"));
    let mut filters = Vec::new();
    let mut clusters = Vec::new();
    for m in mods {
        let value = m.value.expect("value");
        match (m.kind.as_str(), m.origin.as_deref()) {
            ("networkFilter", Some("inbound")) => filters.push(("INBOUND", value)),
            ("networkFilter", _) => filters.push(("OUTBOUND", value)),
            ("cluster", _) => clusters.push(value),
            (other, _) => panic!("unexpected modification {other}"),
        }
    }
    loads_in_real_envoy("MeshProxyPatch", &envoy, &wasm, filters, clusters);
}

/// The EnvoyFilter's download cluster does not re-resolve its host every 5 s in every sidecar
/// (Envoy's default dns_refresh_rate for STRICT_DNS and LOGICAL_DNS): once an hour, the host's
/// TTL not trusted with the fleet's rate, a failed lookup retried with back-off.
#[test]
fn the_filter_download_cluster_resolves_dns_hourly() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/envoyfilter/envoyfilter.yaml"),
    )
    .expect("envoyfilter.yaml");
    let doc: Value = serde_saphyr::from_str(&text).expect("YAML");
    let cluster = doc["spec"]["configPatches"]
        .as_array()
        .expect("configPatches")
        .iter()
        .find(|p| p["applyTo"] == "CLUSTER")
        .map(|p| &p["patch"]["value"])
        .expect("the download cluster");
    assert_eq!(cluster["type"], "STRICT_DNS");
    assert_eq!(cluster["dns_refresh_rate"], "3600s");
    assert_eq!(cluster["respect_dns_ttl"], false);
    assert_eq!(cluster["dns_failure_refresh_rate"]["base_interval"], "5s");
    assert_eq!(cluster["dns_failure_refresh_rate"]["max_interval"], "300s");
}
