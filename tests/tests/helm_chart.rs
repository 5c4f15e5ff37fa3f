//! The Helm chart (`charts/holdfast`) against the kustomize install (`manifests/`): for each
//! install kustomize offers, `helm template` with the matching values renders the same objects,
//! compared parsed, object by object and field by field (holdfast_tests::kustomize renders the
//! kustomizations, a real helm v4 the chart). Then what only the chart has: every value
//! (image and digest, resources, tolerations, namespace, platforms, Kuma meshes) reaches the
//! objects it is for, and the renders with them match the API server's schemas; settings that
//! cannot work are refused with a message naming the fix; `helm lint --strict` passes.
//!
//! Needs helm (scripts/setup.sh builds it into target/bin/helm); without it each test skips with
//! a message, and fails when CI is set.

use std::collections::BTreeMap;
use std::path::Path;

use holdfast_tests::helm::{self, set, set_string, Set};
use holdfast_tests::kustomize;
use holdfast_tests::schema::{self, SchemaSet};
use serde_json::Value;

fn helm_or_skip() -> Option<std::path::PathBuf> {
    match helm::binary_or_reason() {
        Ok(p) => Some(p),
        Err(why) if std::env::var_os("CI").is_some() => panic!("{why} (CI is set: not skipping)"),
        Err(why) => {
            eprintln!("SKIP: {why}");
            None
        }
    }
}

fn kustomize_install(dir: &str) -> BTreeMap<String, Value> {
    let root = holdfast_tests::envoy::workspace_root().join("manifests");
    let objects = kustomize::render(&root, Path::new(dir))
        .unwrap_or_else(|e| panic!("rendering manifests/{dir}: {e:#}"))
        .objects;
    helm::by_key(objects.into_iter().map(|o| o.value)).expect("kustomize objects")
}

fn helm_install(helm_bin: &Path, values: &[Set]) -> BTreeMap<String, Value> {
    helm::by_key(helm::template(helm_bin, values).unwrap_or_else(|e| panic!("{e:#}")))
        .expect("helm objects")
}

fn assert_agree(name: &str, kustomize: &BTreeMap<String, Value>, helm: &BTreeMap<String, Value>) {
    let diffs = helm::compare("kustomize", kustomize, "helm", helm);
    assert!(
        diffs.is_empty(),
        "{name}: the chart and the kustomize install differ:\n{}",
        diffs.join("\n")
    );
    eprintln!("{name}: {} objects agree: {:?}", helm.len(), helm.keys());
}

/// Each kustomize install and the values that give the same install from the chart.
#[test]
fn the_chart_renders_every_kustomize_install_object_by_object() {
    let Some(h) = helm_or_skip() else { return };
    let cases: [(&str, &str, Vec<Set>); 4] = [
        ("default (manifests/)", "", vec![]),
        (
            "manifests/envoyfilter",
            "envoyfilter",
            vec![set("meshes.istio.filter", "envoyfilter")],
        ),
        (
            "manifests/trafficextension",
            "trafficextension",
            vec![set("meshes.istio.filter", "trafficextension")],
        ),
        (
            "manifests/kuma",
            "kuma",
            vec![
                set("meshes.istio.enabled", "false"),
                set("meshes.kuma.enabled", "true"),
            ],
        ),
    ];
    for (name, dir, values) in cases {
        let k = kustomize_install(dir);
        assert!(k.len() >= 10, "{name}: only {} objects rendered", k.len());
        assert_agree(name, &k, &helm_install(&h, &values));
    }
}

/// The default install with the monitoring component (docs/install.md's overlay) is
/// `monitoring.enabled=true`; the PrometheusRule's rules come from the one rules file, its
/// `{{ $labels }}` templates intact.
#[test]
fn monitoring_on_is_the_monitoring_component() {
    let Some(h) = helm_or_skip() else { return };
    let k = helm::by_key(
        holdfast_tests::monitoring::render_install_with_monitoring()
            .expect("the install with monitoring")
            .into_iter()
            .map(|o| o.value),
    )
    .expect("objects");
    let chart = helm_install(&h, &[set("monitoring.enabled", "true")]);
    assert_agree("with monitoring", &k, &chart);
    let rule = chart
        .values()
        .find(|o| o["kind"] == "PrometheusRule")
        .expect("a PrometheusRule");
    assert!(
        rule.to_string().contains("{{ $labels.node }}"),
        "the alerts' templates must reach Prometheus unrendered"
    );
    // Grafana's dashboard as a ConfigMap for its sidecar: the one dashboard file, parsed equal.
    let with_dashboard = helm_install(
        &h,
        &[
            set("monitoring.dashboard.enabled", "true"),
            set("monitoring.dashboard.namespace", "grafana"),
        ],
    );
    let cm = with_dashboard
        .get("v1 ConfigMap grafana/holdfast-dashboard")
        .unwrap_or_else(|| panic!("no dashboard ConfigMap: {:?}", with_dashboard.keys()));
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let served: Value =
        serde_json::from_str(cm["data"]["holdfast.json"].as_str().expect("data")).expect("JSON");
    let file: Value = serde_json::from_str(
        &std::fs::read_to_string(
            holdfast_tests::envoy::workspace_root().join("manifests/monitoring/dashboard.json"),
        )
        .expect("dashboard.json"),
    )
    .expect("JSON");
    assert_eq!(
        served, file,
        "the ConfigMap carries manifests/monitoring/dashboard.json"
    );
    // ConfigMap is not in the schema corpus: read as the API's type, strictly.
    let _: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(cm.clone()).expect("a ConfigMap");
    assert!(!chart.values().any(|o| o["kind"] == "ConfigMap"));
    // And off by default: no monitoring kinds.
    let off = helm_install(&h, &[]);
    assert!(
        !off.keys().any(|k| k.starts_with("monitoring.coreos.com/")),
        "{:?}",
        off.keys()
    );
}

/// `just image`'s pinned overlay (the agent by digest, the filter's OCI URL) and the chart with
/// the same pins as values.
#[test]
fn digest_pins_agree_with_the_pinned_overlay() {
    let Some(h) = helm_or_skip() else { return };
    let d = |c: char| format!("sha256:{}", c.to_string().repeat(64));
    let agent = format!("registry.example.com/holdfast/agent@{}", d('a'));
    let filter = format!("registry.example.com/holdfast/filter@{}", d('b'));
    let r = |s: &str| holdfast_image::registry::ImageRef::parse(s).expect("a reference");
    let pins = holdfast_image::pin::Pins::new(Some(r(&agent)), Some(r(&filter))).expect("pins");
    let dir = std::env::temp_dir().join(format!("hf-helm-pinned-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("overlay dir");
    let dir = std::path::absolute(&dir).expect("absolute");
    let manifests = holdfast_tests::envoy::workspace_root()
        .join("manifests")
        .canonicalize()
        .expect("manifests");
    let base = holdfast_image::release::relative(&dir, &manifests);
    std::fs::write(
        dir.join("kustomization.yaml"),
        pins.overlay(&base.to_string_lossy()),
    )
    .expect("write overlay");
    let rendered = kustomize::render(Path::new("/"), dir.strip_prefix("/").expect("absolute"));
    let _ = std::fs::remove_dir_all(&dir);
    let k = helm::by_key(
        rendered
            .expect("render the overlay")
            .objects
            .into_iter()
            .map(|o| o.value),
    )
    .expect("objects");
    let chart = helm_install(
        &h,
        &[
            set("image.repository", "registry.example.com/holdfast/agent"),
            set_string("image.digest", &d('a')),
            set_string(
                "filter.oci",
                &format!("oci://registry.example.com/holdfast/filter@{}", d('b')),
            ),
        ],
    );
    assert_agree("pinned", &k, &chart);
}

fn daemonset(objects: &BTreeMap<String, Value>) -> &Value {
    objects
        .values()
        .find(|o| o["kind"] == "DaemonSet")
        .expect("a DaemonSet")
}

fn corpus() -> Vec<SchemaSet> {
    schema::corpus()
        .expect("the schema corpus")
        .into_values()
        .collect()
}

/// Every violation of every object against the schema sets that have its kind.
fn schema_violations(sets: &[SchemaSet], objects: &BTreeMap<String, Value>) -> Vec<String> {
    let mut out = Vec::new();
    for (k, o) in objects {
        let av = o["apiVersion"].as_str().unwrap_or("");
        let kind = o["kind"].as_str().unwrap_or("");
        let mut checked = 0;
        for s in sets.iter().filter(|s| s.has(av, kind)) {
            checked += 1;
            for e in s.validate(o).expect("a schema this validator reads") {
                out.push(format!("{k}: {}: {e}", s.name));
            }
        }
        if checked == 0 {
            out.push(format!(
                "{k}: no schema in tests/corpus/schemas has {av} {kind}"
            ));
        }
    }
    out
}

/// Each value reaches what it is for, and the result is still valid for the API server.
#[test]
fn values_reach_the_objects_and_stay_valid() {
    let Some(h) = helm_or_skip() else { return };
    let sets = corpus();
    let digest = format!("sha256:{}", "c".repeat(64));

    // Image, digest, resources, tolerations, node selector, extra args and env, pull secrets.
    let chart = helm_install(
        &h,
        &[
            set("image.repository", "reg.example/hf"),
            set_string("image.tag", "9.9"),
            set_string("image.digest", &digest),
            set("image.pullPolicy", "Always"),
            set_string("agent.resources.limits.cpu", "1"),
            set_string("agent.resources.requests.memory", "64Mi"),
            set("agent.tolerations[0].key", "dedicated"),
            set("agent.tolerations[0].operator", "Equal"),
            set("agent.tolerations[0].value", "mesh"),
            set("agent.tolerations[0].effect", "NoSchedule"),
            set("agent.extraArgs[0]", "--hold-deadline"),
            set("agent.extraArgs[1]", "60s"),
            set("agent.extraEnv[0].name", "RUST_BACKTRACE"),
            set_string("agent.extraEnv[0].value", "1"),
            set("imagePullSecrets[0].name", "regcred"),
            set("agent.log", "holdfast=debug"),
        ],
    );
    let ds = daemonset(&chart);
    let spec = &ds["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
    assert_eq!(
        c["image"],
        format!("reg.example/hf@{digest}"),
        "digest wins over the tag"
    );
    assert_eq!(c["imagePullPolicy"], "Always");
    assert_eq!(c["resources"]["limits"]["cpu"], "1");
    assert_eq!(c["resources"]["limits"]["memory"], "128Mi", "others kept");
    assert_eq!(c["resources"]["requests"]["memory"], "64Mi");
    assert_eq!(
        spec["tolerations"],
        serde_json::json!([{"key": "dedicated", "operator": "Equal", "value": "mesh", "effect": "NoSchedule"}])
    );
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(&args[args.len() - 2..], ["--hold-deadline", "60s"]);
    assert!(c["env"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "RUST_BACKTRACE" && e["value"] == "1"));
    assert!(c["env"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "HOLDFAST_LOG" && e["value"] == "holdfast=debug"));
    assert_eq!(
        spec["imagePullSecrets"],
        serde_json::json!([{"name": "regcred"}])
    );
    let v = schema_violations(&sets, &chart);
    assert!(v.is_empty(), "{}", v.join("\n"));

    // A tag without a digest.
    let tagged = helm_install(&h, &[set_string("image.tag", "0.2.0")]);
    assert_eq!(
        daemonset(&tagged)["spec"]["template"]["spec"]["containers"][0]["image"],
        "ghcr.io/holdfast-mesh/holdfast:0.2.0"
    );

    // Another namespace: every namespaced agent object moves, the policy names its account.
    let other = helm_install(&h, &[set("namespace", "mesh-agents")]);
    for (k, o) in &other {
        let kind = o["kind"].as_str().unwrap_or("");
        let group_filter = o["metadata"]["labels"]["app.kubernetes.io/component"] == "filter";
        if kustomize::CLUSTER_SCOPED.contains(&kind) || group_filter {
            continue;
        }
        assert_eq!(o["metadata"]["namespace"], "mesh-agents", "{k}");
    }
    assert!(
        other.contains_key("v1 Namespace /mesh-agents"),
        "{:?}",
        other.keys()
    );
    let crb = other
        .values()
        .find(|o| o["kind"] == "ClusterRoleBinding")
        .expect("binding");
    assert_eq!(crb["subjects"][0]["namespace"], "mesh-agents");
    let vap = other
        .values()
        .find(|o| o["kind"] == "ValidatingAdmissionPolicy")
        .expect("policy");
    assert!(
        vap.to_string()
            .contains("system:serviceaccount:mesh-agents:holdfast-agent"),
        "the policy must match the agent's account in its namespace"
    );
    let v = schema_violations(&sets, &other);
    assert!(v.is_empty(), "{}", v.join("\n"));

    // Without the namespace object (created and labelled by the user), the quota, the reader role.
    let bare = helm_install(
        &h,
        &[
            set("createNamespace", "false"),
            set("resourceQuota.enabled", "false"),
            set("statusReaderRole", "false"),
        ],
    );
    for kind in ["Namespace", "ResourceQuota", "Role"] {
        assert!(!bare.values().any(|o| o["kind"] == kind), "{kind} rendered");
    }
    // The quota's size.
    let big = helm_install(
        &h,
        &[set("resourceQuota.pods", "9000"), set("platform", "gke")],
    );
    let quota = big
        .values()
        .find(|o| o["kind"] == "ResourceQuota")
        .expect("quota");
    assert_eq!(quota["spec"]["hard"]["pods"], "9000");

    // Every platform preset renders and validates.
    for p in ["gke", "aks", "eks", "karpenter"] {
        let r = helm_install(&h, &[set("platform", p)]);
        let v = schema_violations(&sets, &r);
        assert!(v.is_empty(), "platform {p}: {}", v.join("\n"));
    }

    // Istio and Kuma together, Kuma with two meshes, in another control-plane namespace.
    let both = helm_install(
        &h,
        &[
            set("meshes.kuma.enabled", "true"),
            set("meshes.kuma.namespace", "kong-mesh-system"),
            set("meshes.kuma.meshes[0]", "default"),
            set("meshes.kuma.meshes[1]", "payments"),
            set("monitoring.enabled", "true"),
            set("monitoring.labels.release", "kube-prometheus-stack"),
        ],
    );
    let patches: Vec<&Value> = both
        .values()
        .filter(|o| o["kind"] == "MeshProxyPatch")
        .collect();
    assert_eq!(patches.len(), 2);
    for p in &patches {
        assert_eq!(p["metadata"]["namespace"], "kong-mesh-system");
    }
    assert!(patches
        .iter()
        .any(|p| p["metadata"]["labels"]["kuma.io/mesh"] == "payments"
            && p["metadata"]["name"] == "holdfast-payments"));
    assert_eq!(
        both.values().filter(|o| o["kind"] == "WasmPlugin").count(),
        2
    );
    assert!(both
        .values()
        .filter(|o| o["kind"] == "PodMonitor" || o["kind"] == "PrometheusRule")
        .all(|o| o["metadata"]["labels"]["release"] == "kube-prometheus-stack"));
    let v = schema_violations(&sets, &both);
    assert!(v.is_empty(), "{}", v.join("\n"));

    // Consul alone: the agent, no filter object (Consul cannot take one).
    let consul = helm_install(
        &h,
        &[
            set("meshes.istio.enabled", "false"),
            set("meshes.consul.enabled", "true"),
        ],
    );
    assert!(
        !consul
            .values()
            .any(|o| o["metadata"]["labels"]["app.kubernetes.io/component"] == "filter"),
        "{:?}",
        consul.keys()
    );
    assert!(consul.values().any(|o| o["kind"] == "DaemonSet"));
}

/// Settings that cannot work fail the render, each with the fix in the message.
#[test]
fn impossible_settings_are_refused_with_the_fix() {
    let Some(h) = helm_or_skip() else { return };
    let cases: [(&str, Vec<Set>, &str); 7] = [
        (
            "default",
            vec![set("platform", "gke-autopilot")],
            "GKE Standard",
        ),
        (
            "default",
            vec![set("platform", "eks-fargate")],
            "platform=eks",
        ),
        (
            "default",
            vec![set("platform", "openshift")],
            "is not one of",
        ),
        (
            "default",
            vec![
                set("platform", "gke"),
                set("resourceQuota.enabled", "false"),
            ],
            "keep resourceQuota.enabled=true",
        ),
        (
            "default",
            vec![set_string("image.digest", "abc")],
            "sha256:<64 hex digits>",
        ),
        (
            "default",
            vec![set("meshes.istio.filter", "wasm")],
            "wasmplugin, trafficextension, envoyfilter",
        ),
        // The release in the namespace the chart creates: Helm would own it twice.
        (
            "holdfast-system",
            vec![],
            "install the release into another existing namespace",
        ),
    ];
    for (release_ns, values, want) in cases {
        let out = helm::template_raw(&h, release_ns, &values).expect("helm runs");
        assert!(!out.ok, "{values:?} rendered, but cannot work");
        assert!(out.stderr.contains(want), "{values:?}: {}", out.stderr);
    }
    // No mesh at all.
    let out = helm::template_raw(&h, "default", &[set("meshes.istio.enabled", "false")])
        .expect("helm runs");
    assert!(
        !out.ok && out.stderr.contains("no mesh enabled"),
        "{}",
        out.stderr
    );
}

/// `helm lint --strict`, for the defaults and the other installs.
#[test]
fn helm_lint_passes() {
    let Some(h) = helm_or_skip() else { return };
    for values in [
        vec![],
        vec![set("meshes.istio.filter", "envoyfilter")],
        vec![
            set("meshes.istio.enabled", "false"),
            set("meshes.kuma.enabled", "true"),
            set("monitoring.enabled", "true"),
        ],
    ] {
        let out = helm::lint(&h, &values).expect("helm runs");
        assert!(
            out.ok,
            "helm lint {values:?}:\n{}\n{}",
            out.stdout, out.stderr
        );
        assert!(
            !out.stdout.contains("[WARNING]") && !out.stdout.contains("[ERROR]"),
            "{}",
            out.stdout
        );
    }
}
