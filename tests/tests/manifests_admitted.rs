//! Would a real cluster admit `kubectl apply -k manifests/`? Checked on the rendered output
//! (holdfast_tests::kustomize), without a cluster:
//!
//! - every object against the API server's schemas (holdfast_tests::schema, the corpus in
//!   tests/corpus/schemas/: Kubernetes 1.30.0 and 1.37.0, Istio's CRDs at 1.24.6 and 1.30.3,
//!   the Prometheus Operator's at v0.73.2 and v0.93.0 for the optional monitoring component,
//!   Kuma's MeshProxyPatch at v2.13.10, v2.14.3 and master 348b652 for manifests/kuma/),
//!   strictly: a misspelt or misplaced field fails, naming it; and bad inputs (an unknown field,
//!   a wrong type, a missing required field, a broken pattern or CEL rule) fail with a message
//!   that names the field;
//! - Pod Security admission (holdfast_tests::pod_security): on a cluster enforcing `baseline`
//!   by default, every pod the install creates is admitted — the agent's because its namespace
//!   opts in to `privileged`, with the reason, and for exactly the checks it fails.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use holdfast_tests::kustomize::{self, Object};
use holdfast_tests::pod_security::{self, ENFORCE_LABEL};
use holdfast_tests::schema::{self, SchemaSet};
use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{json, Value};

fn manifests() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests")
}

/// The installs `manifests/` offers: the default (WasmPlugins), the EnvoyFilter, the
/// TrafficExtension and the Kuma one (MeshProxyPatch).
const INSTALLS: [&str; 4] = ["", "envoyfilter", "trafficextension", "kuma"];

fn render(dir: &str) -> Vec<Object> {
    kustomize::render(&manifests(), Path::new(dir))
        .unwrap_or_else(|e| panic!("rendering manifests/{dir}: {e:#}"))
        .objects
}

/// The default install with the monitoring component, as docs/install.md's overlay has it.
fn render_with_monitoring() -> Vec<Object> {
    holdfast_tests::monitoring::render_install_with_monitoring()
        .unwrap_or_else(|e| panic!("rendering the install with manifests/monitoring: {e:#}"))
}

fn corpus() -> Vec<SchemaSet> {
    schema::corpus()
        .expect("the schema corpus")
        .into_values()
        .collect()
}

fn gvk(v: &Value) -> (String, String) {
    let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    (s("apiVersion"), s("kind"))
}

/// Every violation of `object` against every schema set that has its kind; fails the test if
/// no Kubernetes and no Istio set has it, or if fewer than two sets (the oldest and the newest
/// release) do.
fn violations(sets: &[SchemaSet], object: &Value) -> Vec<String> {
    let (api_version, kind) = gvk(object);
    let mut checked = 0;
    let mut out = Vec::new();
    for set in sets.iter().filter(|s| s.has(&api_version, &kind)) {
        checked += 1;
        for e in set.validate(object).expect("a schema this validator reads") {
            out.push(format!("{}: {e}", set.name));
        }
    }
    assert!(
        checked >= 2,
        "{api_version} {kind}: {checked} schema set(s) have it; the corpus must cover the oldest \
         and newest supported release (tests/corpus/schemas/README.md)"
    );
    out
}

#[test]
fn every_rendered_object_matches_the_api_servers_schemas() {
    let sets = corpus();
    let mut seen = BTreeSet::new();
    let mut errors = Vec::new();
    let installs = INSTALLS
        .iter()
        .map(|d| (format!("manifests/{d}"), render(d)))
        .chain([("(with monitoring)".to_string(), render_with_monitoring())]);
    for (dir, objects) in installs {
        for o in objects {
            seen.insert(format!("{} {}", gvk(&o.value).0, o.kind()));
            for e in violations(&sets, &o.value) {
                errors.push(format!(
                    "install {dir:?}: {} {} {}: {e}",
                    o.file.display(),
                    o.kind(),
                    o.name()
                ));
            }
        }
    }
    for kind in [
        "monitoring.coreos.com/v1 PodMonitor",
        "monitoring.coreos.com/v1 PrometheusRule",
    ] {
        assert!(seen.contains(kind), "{kind} not rendered: {seen:?}");
    }
    eprintln!("validated: {seen:?}");
    for s in &sets {
        eprintln!("against {}: {}", s.name, s.source);
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

/// The install pinned by `just image`'s overlay validates too (the image edit, the url patch).
#[test]
fn the_pinned_overlay_matches_the_schemas() {
    let sets = corpus();
    let d = |c: char| format!("sha256:{}", c.to_string().repeat(64));
    let r = |s: String| holdfast_image::registry::ImageRef::parse(&s).expect("a reference");
    let pins = holdfast_image::pin::Pins::new(
        Some(r(format!("registry.example.com/holdfast/agent@{}", d('a')))),
        Some(r(format!(
            "registry.example.com/holdfast/filter@{}",
            d('b')
        ))),
    )
    .expect("pins");
    let dir = std::env::temp_dir().join(format!("hf-overlay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("overlay dir");
    let dir = std::path::absolute(&dir).expect("absolute");
    let base =
        holdfast_image::release::relative(&dir, &manifests().canonicalize().expect("manifests"));
    std::fs::write(
        dir.join("kustomization.yaml"),
        pins.overlay(&base.to_string_lossy()),
    )
    .expect("write overlay");
    let objects = kustomize::render(Path::new("/"), dir.strip_prefix("/").expect("absolute"))
        .expect("render the overlay")
        .objects;
    let _ = std::fs::remove_dir_all(&dir);
    let mut errors = Vec::new();
    for o in &objects {
        errors.extend(violations(&sets, &o.value));
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    let images = kustomize::images(&kustomize::Rendered {
        objects: objects.clone(),
        ..Default::default()
    });
    assert_eq!(
        images,
        [format!("registry.example.com/holdfast/agent@{}", d('a'))].into()
    );
    for o in objects.iter().filter(|o| o.kind() == "WasmPlugin") {
        assert_eq!(
            o.value.pointer("/spec/url").and_then(Value::as_str),
            Some(format!("oci://registry.example.com/holdfast/filter@{}", d('b')).as_str())
        );
    }
}

fn rendered_one(kind: &str) -> Value {
    render("")
        .into_iter()
        .find(|o| o.kind() == kind)
        .unwrap_or_else(|| panic!("no {kind} rendered"))
        .value
}

/// Asserts that `object`, changed by `edit`, fails validation with a message containing each of
/// `expect`.
fn fails(sets: &[SchemaSet], base: &Value, what: &str, edit: impl Fn(&mut Value), expect: &[&str]) {
    let mut v = base.clone();
    edit(&mut v);
    let errors = violations(sets, &v);
    assert!(!errors.is_empty(), "{what}: passed validation");
    for e in expect {
        assert!(
            errors.iter().any(|x| x.contains(e)),
            "{what}: no error mentions {e:?}: {errors:#?}"
        );
    }
    eprintln!("{what}: {}", errors[0]);
}

#[test]
fn bad_kubernetes_manifests_fail_naming_the_field() {
    let sets = corpus();
    let ds = rendered_one("DaemonSet");
    assert!(violations(&sets, &ds).is_empty());
    fails(
        &sets,
        &ds,
        "misspelt field",
        |v| {
            let sc = &mut v["spec"]["template"]["spec"]["containers"][0]["securityContext"];
            let caps = sc["capabilities"].take();
            sc.as_object_mut().expect("object").remove("capabilities");
            sc["capabilites"] = caps;
        },
        &["unknown field \"spec.template.spec.containers[0].securityContext.capabilites\""],
    );
    fails(
        &sets,
        &ds,
        "misplaced field (a pod field under the container)",
        |v| v["spec"]["template"]["spec"]["containers"][0]["hostPID"] = json!(true),
        &["unknown field \"spec.template.spec.containers[0].hostPID\""],
    );
    fails(
        &sets,
        &ds,
        "wrong type",
        |v| v["spec"]["template"]["spec"]["hostPID"] = json!("yes"),
        &["spec.template.spec.hostPID: must be boolean", "got string"],
    );
    fails(
        &sets,
        &ds,
        "missing required field",
        |v| {
            v["spec"]["template"]["spec"]["containers"][0]
                .as_object_mut()
                .expect("object")
                .remove("name");
        },
        &["missing required field \"spec.template.spec.containers[0].name\""],
    );
    fails(
        &sets,
        &ds,
        "missing selector",
        |v| {
            v["spec"]
                .as_object_mut()
                .expect("object")
                .remove("selector");
        },
        &["missing required field \"spec.selector\""],
    );
    // A field newer than the oldest supported release fails against that release only.
    fails(
        &sets,
        &ds,
        "a field 1.30 does not know",
        |v| {
            v["spec"]["template"]["spec"]["containers"][0]["securityContext"]
                ["nonexistentNewField"] = json!(true)
        },
        &["kubernetes-v1.30.0.json: unknown field"],
    );
}

#[test]
fn bad_istio_manifests_fail_naming_the_field() {
    let sets = corpus();
    let wp = rendered_one("WasmPlugin");
    assert!(violations(&sets, &wp).is_empty());
    fails(
        &sets,
        &wp,
        "misspelt field",
        |v| {
            let name = v["spec"]["pluginName"].take();
            v["spec"]
                .as_object_mut()
                .expect("object")
                .remove("pluginName");
            v["spec"]["pluginname"] = name;
        },
        &["unknown field \"spec.pluginname\""],
    );
    fails(
        &sets,
        &wp,
        "wrong type",
        |v| v["spec"]["match"] = json!({"mode": "SERVER"}),
        &["spec.match: must be array"],
    );
    fails(
        &sets,
        &wp,
        "missing required field",
        |v| {
            v["spec"].as_object_mut().expect("object").remove("url");
        },
        &["missing required field \"spec.url\""],
    );
    fails(
        &sets,
        &wp,
        "sha256 with its prefix (the CRD wants 64 hex digits)",
        |v| v["spec"]["sha256"] = json!(format!("sha256:{}", "a".repeat(64))),
        &["spec.sha256", "does not match"],
    );
    fails(
        &sets,
        &wp,
        "an enum value that does not exist",
        |v| v["spec"]["phase"] = json!("FIRST"),
        &["spec.phase: \"FIRST\" is not one of"],
    );
    fails(
        &sets,
        &wp,
        "selector and targetRefs together (a CEL rule)",
        |v| {
            v["spec"]["targetRefs"] =
                json!([{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "gw"}])
        },
        &["spec: only one of targetRefs or selector can be set"],
    );
    fails(
        &sets,
        &wp,
        "a wildcard label (a CEL rule)",
        |v| v["spec"]["selector"]["matchLabels"]["app"] = json!("*"),
        &["wildcard not allowed in label value match"],
    );
    fails(
        &sets,
        &wp,
        "a url scheme Istio refuses (a CEL rule)",
        |v| v["spec"]["url"] = json!("ftp://example.com/plugin.wasm"),
        &["url must have schema one of"],
    );
    fails(
        &sets,
        &wp,
        "unknown metadata field",
        |v| v["metadata"]["labelz"] = json!({}),
        &["unknown field \"metadata.labelz\""],
    );
    let ef = render("envoyfilter")
        .into_iter()
        .find(|o| o.kind() == "EnvoyFilter")
        .expect("the EnvoyFilter")
        .value;
    assert!(violations(&sets, &ef).is_empty());
    fails(
        &sets,
        &ef,
        "misplaced field",
        |v| v["spec"]["configPatches"][0]["patch"]["context"] = json!("SIDECAR_INBOUND"),
        &["unknown field \"spec.configPatches[0].patch.context\""],
    );
    fails(
        &sets,
        &ef,
        "an applyTo Istio does not have",
        |v| v["spec"]["configPatches"][0]["applyTo"] = json!("WASM_FILTER"),
        &["spec.configPatches[0].applyTo"],
    );
}

/// The MeshProxyPatch fails validation against Kuma's CRDs on a misspelt or misplaced field, an
/// operation Kuma does not have, or a missing required field, naming it.
#[test]
fn bad_kuma_manifests_fail_naming_the_field() {
    let sets = corpus();
    let mpp = render("kuma")
        .into_iter()
        .find(|o| o.kind() == "MeshProxyPatch")
        .expect("the MeshProxyPatch")
        .value;
    assert!(violations(&sets, &mpp).is_empty());
    fails(
        &sets,
        &mpp,
        "misspelt field",
        |v| {
            let m = v["spec"]["default"].take();
            v["spec"].as_object_mut().expect("object").remove("default");
            v["spec"]["defaults"] = m;
        },
        &[
            "kuma-v2.13.10.json: unknown field \"spec.defaults\"",
            "kuma-v2.14.3.json: unknown field \"spec.defaults\"",
            "kuma-master-348b652.json: missing required field \"spec.default\"",
        ],
    );
    fails(
        &sets,
        &mpp,
        "Istio's operation name",
        |v| {
            v["spec"]["default"]["appendModifications"][0]["networkFilter"]["operation"] =
                json!("INSERT_FIRST")
        },
        &["spec.default.appendModifications[0].networkFilter.operation: \"INSERT_FIRST\" is not one of"],
    );
    fails(
        &sets,
        &mpp,
        "the match at the wrong level",
        |v| {
            let nf = &mut v["spec"]["default"]["appendModifications"][1];
            nf["match"] = nf["networkFilter"]["match"].take();
        },
        &["unknown field \"spec.default.appendModifications[1].match\""],
    );
    fails(
        &sets,
        &mpp,
        "a value as YAML, not a string",
        |v| {
            v["spec"]["default"]["appendModifications"][2]["cluster"]["value"] =
                json!({"name": "holdfast-filter-download"})
        },
        &["spec.default.appendModifications[2].cluster.value: must be string"],
    );
    fails(
        &sets,
        &mpp,
        "a targetRef kind master no longer has",
        |v| v["spec"]["targetRef"]["kind"] = json!("MeshService"),
        &["kuma-master-348b652.json: spec.targetRef.kind: \"MeshService\" is not one of"],
    );
}

/// The monitoring component's objects fail validation on a misspelt field or a wrong type,
/// naming it, against both Prometheus Operator releases of the corpus.
#[test]
fn bad_monitoring_manifests_fail_naming_the_field() {
    let sets = corpus();
    let objects = render_with_monitoring();
    let pm = objects
        .iter()
        .find(|o| o.kind() == "PodMonitor")
        .expect("the PodMonitor")
        .value
        .clone();
    assert!(violations(&sets, &pm).is_empty());
    fails(
        &sets,
        &pm,
        "misspelt field",
        |v| {
            let eps = v["spec"]["podMetricsEndpoints"].take();
            v["spec"]
                .as_object_mut()
                .expect("object")
                .remove("podMetricsEndpoints");
            v["spec"]["podMetricEndpoints"] = eps;
        },
        &[
            "prometheus-operator-v0.73.2.json: unknown field \"spec.podMetricEndpoints\"",
            "prometheus-operator-v0.93.0.json: unknown field \"spec.podMetricEndpoints\"",
        ],
    );
    fails(
        &sets,
        &pm,
        "wrong type",
        |v| v["spec"]["podMetricsEndpoints"][0]["relabelings"] = json!({"targetLabel": "node"}),
        &["spec.podMetricsEndpoints[0].relabelings: must be array"],
    );
    let pr = objects
        .iter()
        .find(|o| o.kind() == "PrometheusRule")
        .expect("the PrometheusRule")
        .value
        .clone();
    assert!(violations(&sets, &pr).is_empty());
    fails(
        &sets,
        &pr,
        "a rule without its expression",
        |v| {
            v["spec"]["groups"][0]["rules"][0]
                .as_object_mut()
                .expect("object")
                .remove("expr");
        },
        &["missing required field \"spec.groups[0].rules[0].expr\""],
    );
}

/// The pod (and its metadata) an object creates, if it creates one.
fn pod_template(v: &Value) -> Option<(ObjectMeta, PodSpec)> {
    let (meta, spec) = match v.get("kind").and_then(Value::as_str)? {
        "Pod" => (v.get("metadata"), v.get("spec")),
        "CronJob" => (
            v.pointer("/spec/jobTemplate/spec/template/metadata"),
            v.pointer("/spec/jobTemplate/spec/template/spec"),
        ),
        _ => (
            v.pointer("/spec/template/metadata"),
            v.pointer("/spec/template/spec"),
        ),
    };
    let spec: PodSpec = serde_json::from_value(spec?.clone()).ok()?;
    let meta: ObjectMeta = meta
        .and_then(|m| serde_json::from_value(m.clone()).ok())
        .unwrap_or_default();
    Some((meta, spec))
}

/// On a cluster enforcing Pod Security `baseline` by default, every pod the install creates is
/// admitted. The agent's namespace opts in to `privileged`; its pod fails baseline for exactly
/// the checks the namespace's reason names, so the opt-in is needed and says why.
#[test]
fn the_install_is_admitted_where_pod_security_enforces_baseline() {
    for dir in INSTALLS {
        let objects = render(dir);
        let levels: std::collections::BTreeMap<String, String> = objects
            .iter()
            .filter(|o| o.kind() == "Namespace")
            .map(|o| {
                let level = o
                    .value
                    .pointer(&format!(
                        "/metadata/labels/{}",
                        ENFORCE_LABEL.replace('/', "~1")
                    ))
                    .and_then(Value::as_str)
                    .unwrap_or("baseline");
                (o.name().to_string(), level.to_string())
            })
            .collect();
        let mut pods = 0;
        for o in &objects {
            let Some((meta, spec)) = pod_template(&o.value) else {
                continue;
            };
            pods += 1;
            let ns = o.namespace().unwrap_or("default");
            // The cluster's default for namespaces the install does not create or label.
            let level = levels.get(ns).map(String::as_str).unwrap_or("baseline");
            let failed = pod_security::baseline(&meta, &spec);
            match level {
                "privileged" => {
                    let checks: BTreeSet<&str> = failed.iter().map(|v| v.check).collect();
                    assert_eq!(
                        checks,
                        [
                            "appArmorProfile",
                            "capabilities",
                            "hostNamespaces",
                            "seLinuxOptions"
                        ]
                        .into(),
                        "{} {}: the checks its privileged namespace is needed for: {failed:#?}",
                        o.kind(),
                        o.name()
                    );
                    let reason = objects
                        .iter()
                        .find(|n| n.kind() == "Namespace" && n.name() == ns)
                        .and_then(|n| n.value.pointer("/metadata/annotations/holdfast.io~1pod-security-reason"))
                        .and_then(Value::as_str)
                        .unwrap_or_else(|| panic!("namespace {ns} opts in to privileged without holdfast.io/pod-security-reason"));
                    for needed in [
                        "hostPID",
                        "SYS_ADMIN",
                        "NET_ADMIN",
                        "SYS_PTRACE",
                        "AppArmor Unconfined",
                        "spc_t",
                    ] {
                        assert!(
                            reason.contains(needed),
                            "the reason names {needed}: {reason}"
                        );
                    }
                }
                "baseline" | "restricted" => assert!(
                    failed.is_empty(),
                    "{} {} in {ns} ({level}) would be refused: {failed:#?}",
                    o.kind(),
                    o.name()
                ),
                other => panic!("namespace {ns}: unknown Pod Security level {other:?}"),
            }
        }
        assert_eq!(
            pods, 1,
            "manifests/{dir}: the agent's DaemonSet is the only pod template"
        );
        assert_eq!(
            levels.get("holdfast-system").map(String::as_str),
            Some("privileged"),
            "manifests/{dir}"
        );
    }
}

/// Without the namespace's opt-in, a baseline cluster refuses the agent: the check is not
/// vacuous.
#[test]
fn without_the_opt_in_a_baseline_cluster_refuses_the_agent() {
    let ds = rendered_one("DaemonSet");
    let (meta, spec) = pod_template(&ds).expect("a pod template");
    let failed = pod_security::baseline(&meta, &spec);
    let text = format!("{failed:?}");
    for needed in [
        "hostPID=true",
        "SYS_ADMIN",
        "NET_ADMIN",
        "SYS_PTRACE",
        "Unconfined",
        "spc_t",
    ] {
        assert!(text.contains(needed), "{needed}: {text}");
    }
}

/// GKE limits the critical priority classes by default (its quota admission configuration,
/// holdfast_tests::resource_quota): the agent's DaemonSet pod, `system-node-critical` in
/// holdfast-system, is admitted there because the install ships a ResourceQuota matching that
/// class, as istio-cni does — and refused with GKE's message without it (0 agent pods, issue
/// 30), so the check is not vacuous. The pod counts against the quota: a node count past its
/// `pods` is refused too.
#[test]
fn the_agent_is_admitted_where_gke_limits_its_priority_class() {
    use holdfast_tests::resource_quota::{admit_pod, gke_limited_resources, synced, Refused};
    use k8s_openapi::api::core::v1::ResourceQuota;
    let gke = gke_limited_resources();
    for dir in INSTALLS {
        let objects = render(dir);
        let ds = objects
            .iter()
            .find(|o| o.kind() == "DaemonSet")
            .expect("the agent's DaemonSet");
        let ns = ds.namespace().expect("a namespaced DaemonSet");
        let (_, spec) = pod_template(&ds.value).expect("a pod template");
        assert_eq!(
            spec.priority_class_name.as_deref(),
            Some("system-node-critical")
        );
        let quotas: Vec<ResourceQuota> = objects
            .iter()
            .filter(|o| o.kind() == "ResourceQuota" && o.namespace() == Some(ns))
            .map(|o| serde_json::from_value(o.value.clone()).expect("a ResourceQuota"))
            .collect();
        assert_eq!(quotas.len(), 1, "manifests/{dir}: one quota in {ns}");
        let hard: i64 = quotas[0].spec.as_ref().unwrap().hard.as_ref().unwrap()["pods"]
            .0
            .parse()
            .expect("a plain pod count");
        // The first agent, and one on a node of a 4500-node cluster during a rolling update.
        for used in [0, 4500] {
            let synced_quotas: Vec<_> = quotas.iter().cloned().map(|q| synced(q, used)).collect();
            assert_eq!(
                admit_pod(&gke, &synced_quotas, &spec),
                Ok(()),
                "manifests/{dir}: agent pod {used} in {ns}"
            );
        }
        let full: Vec<_> = quotas.iter().cloned().map(|q| synced(q, hard)).collect();
        assert!(
            matches!(admit_pod(&gke, &full, &spec), Err(Refused(m)) if m.starts_with("exceeded quota: holdfast-critical-pods")),
            "past its pod count the quota refuses"
        );
        assert_eq!(
            admit_pod(&gke, &[], &spec),
            Err(Refused(
                "insufficient quota to match these scopes: [{PriorityClass In \
                 [system-node-critical system-cluster-critical]}]"
                    .into()
            )),
            "without the quota GKE refuses the agent"
        );
    }
}

/// The TrafficExtension install against Istio 1.30.3's and master's CRDs: a bad one fails,
/// naming the field or the CRD's rule; 1.24.6 has no TrafficExtension at all (use the
/// WasmPlugins there).
#[test]
fn bad_trafficextensions_fail_naming_the_field() {
    let sets = corpus();
    let te = render("trafficextension")
        .into_iter()
        .find(|o| o.kind() == "TrafficExtension")
        .expect("a TrafficExtension")
        .value;
    let with_it: Vec<&str> = sets
        .iter()
        .filter(|s| s.has("extensions.istio.io/v1alpha1", "TrafficExtension"))
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(
        with_it,
        ["istio-1.30.3.json", "istio-master-86c9f01.json"],
        "the CRD exists from 1.30"
    );
    assert!(violations(&sets, &te).is_empty());
    fails(
        &sets,
        &te,
        "url at the WasmPlugin's place",
        |v| v["spec"]["url"] = json!("oci://x/y"),
        &["unknown field \"spec.url\""],
    );
    fails(
        &sets,
        &te,
        "wasm and lua",
        |v| v["spec"]["lua"] = json!({"inlineCode": "function envoy_on_request(h) end"}),
        &["exactly one of wasm or lua must be set"],
    );
    fails(
        &sets,
        &te,
        "a bad url scheme",
        |v| v["spec"]["wasm"]["url"] = json!("ftp://x/y"),
        &["url must have schema one of"],
    );
    fails(
        &sets,
        &te,
        "a bad type",
        |v| v["spec"]["wasm"]["type"] = json!("L4"),
        &["spec.wasm.type"],
    );
}
