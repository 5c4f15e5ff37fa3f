//! The ValidatingAdmissionPolicy that narrows the agent's `nodes patch` grant
//! (manifests/agent/node-taint-policy.yaml), evaluated here: there is no API server on this
//! machine, so its CEL expressions are run with a CEL interpreter (the `cel-interpreter` crate)
//! against the requests the agent makes and against the ones it must not be able to make.
//!
//! What the API server binds (k8s.io/apiserver pkg/admission/plugin/cel): `object` and
//! `oldObject` (the node after and before the change, as JSON), `request` (the admission
//! request: `userInfo.username`, `userInfo.extra` a map of string lists). The policy denies when
//! a match condition holds and any validation is false.
//!
//! The dialect: Kubernetes' CEL is type-checked against the objects' schemas, this interpreter is
//! dynamic. The expressions use only what both evaluate the same way: `has()` on fields,
//! ternaries, `==` on lists and maps, `in` on a map, the `exists` and `filter` macros.

use cel_interpreter::{Context, Program, Value as Cel};
use serde_json::{json, Value};

const POLICY: &str = "manifests/agent/node-taint-policy.yaml";
const AGENT: &str = "system:serviceaccount:holdfast-system:holdfast-agent";
const TAINT: &str = "holdfast.io/agent-not-ready";

/// The policy's match conditions and validations, read from the shipped file.
struct Policy {
    conditions: Vec<String>,
    validations: Vec<(String, String)>,
}

fn policy() -> Policy {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .join(POLICY);
    let text = std::fs::read_to_string(&path).expect("reading the policy");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
    let vap = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .expect("a ValidatingAdmissionPolicy");
    assert_eq!(vap["apiVersion"], "admissionregistration.k8s.io/v1");
    assert_eq!(vap["spec"]["failurePolicy"], "Fail");
    let rule = &vap["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(rule["resources"], json!(["nodes"]));
    assert_eq!(rule["operations"], json!(["UPDATE"]));
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
        .expect("a binding: a policy without one does nothing");
    assert_eq!(binding["spec"]["policyName"], vap["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    let strings = |v: &Value, field: &str| -> Vec<String> {
        v.as_array()
            .expect("a list")
            .iter()
            .map(|e| e[field].as_str().expect("an expression").to_string())
            .collect()
    };
    Policy {
        conditions: strings(&vap["spec"]["matchConditions"], "expression"),
        validations: vap["spec"]["validations"]
            .as_array()
            .expect("validations")
            .iter()
            .map(|v| {
                (
                    v["expression"].as_str().expect("expression").to_string(),
                    v["message"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect(),
    }
}

fn eval(expr: &str, object: &Value, old: &Value, request: &Value) -> bool {
    let program = Program::compile(expr).unwrap_or_else(|e| panic!("compile {expr}: {e}"));
    let mut ctx = Context::default();
    ctx.add_variable("object", object.clone()).unwrap();
    ctx.add_variable("oldObject", old.clone()).unwrap();
    ctx.add_variable("request", request.clone()).unwrap();
    match program.execute(&ctx) {
        Ok(Cel::Bool(b)) => b,
        other => panic!("{expr} evaluated to {other:?}"),
    }
}

/// `Ok(())` when the API server would admit the request, `Err(message)` when it denies it.
fn admit(
    p: &Policy,
    user: &str,
    node_of_token: Option<&str>,
    old: &Value,
    new: &Value,
) -> Result<(), String> {
    let mut extra = serde_json::Map::new();
    if let Some(n) = node_of_token {
        extra.insert("authentication.kubernetes.io/node-name".into(), json!([n]));
        extra.insert(
            "authentication.kubernetes.io/pod-name".into(),
            json!(["holdfast-agent-x"]),
        );
    }
    let request = json!({"userInfo": {"username": user, "extra": extra}, "operation": "UPDATE"});
    admit_request(p, &request, old, new)
}

/// [`admit`] for a whole admission request as the API server binds it.
fn admit_request(p: &Policy, request: &Value, old: &Value, new: &Value) -> Result<(), String> {
    let request = request.clone();
    if !p.conditions.iter().all(|c| eval(c, new, old, &request)) {
        return Ok(()); // not the agent: the policy does not apply
    }
    for (expr, message) in &p.validations {
        if !eval(expr, new, old, &request) {
            return Err(message.clone());
        }
    }
    Ok(())
}

/// A node as the API server holds it: what a cloud node carries (an owner reference and a
/// finalizer from its provider's controllers, addresses and conditions in its status).
fn node(name: &str, taints: &[&str]) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name, "uid": "0b5c3d7e-0000-4000-8000-000000000001",
            "labels": {"kubernetes.io/hostname": name},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "name": format!("{name}-m"), "uid": "0b5c3d7e-0000-4000-8000-000000000002"}],
            "finalizers": ["example.com/node-cleanup"],
        },
        "spec": {
            "podCIDR": "10.0.1.0/24",
            "podCIDRs": ["10.0.1.0/24"],
            "providerID": format!("kind://docker/{name}"),
            "taints": taints.iter().map(|k| json!({"key": k, "effect": "NoSchedule"})).collect::<Vec<_>>(),
        },
        "status": {
            "addresses": [{"type": "InternalIP", "address": "10.0.0.5"}],
            "conditions": [{"type": "Ready", "status": "True"}],
        }
    })
}

fn without_taints(mut n: Value) -> Value {
    n["spec"].as_object_mut().unwrap().remove("taints");
    n
}

#[test]
fn the_agent_may_remove_its_own_nodes_startup_taint() {
    let p = policy();
    // The agent's patch: the taint list as read, without the startup taint.
    let old = node("node-a", &["example.com/gpu", TAINT]);
    let new = node("node-a", &["example.com/gpu"]);
    assert_eq!(admit(&p, AGENT, Some("node-a"), &old, &new), Ok(()));
    // The only taint: the list becomes empty (or the field goes).
    let old = node("node-a", &[TAINT]);
    assert_eq!(
        admit(&p, AGENT, Some("node-a"), &old, &node("node-a", &[])),
        Ok(())
    );
    assert_eq!(
        admit(
            &p,
            AGENT,
            Some("node-a"),
            &old,
            &without_taints(node("node-a", &[]))
        ),
        Ok(())
    );
}

#[test]
fn the_agent_may_not_touch_another_node_or_anything_else() {
    let p = policy();
    let old = node("node-b", &["example.com/gpu", TAINT]);
    let new = node("node-b", &["example.com/gpu"]);
    let denied = |r: Result<(), String>, what: &str| {
        let why = r.expect_err(what);
        assert!(why.contains("holdfast agent"), "{what}: {why}");
    };
    denied(
        admit(&p, AGENT, Some("node-a"), &old, &new),
        "another node's taint",
    );
    denied(admit(&p, AGENT, None, &old, &new), "a token without a node");
    let own = node("node-a", &["example.com/gpu", TAINT]);
    denied(
        admit(&p, AGENT, Some("node-a"), &own, &node("node-a", &[TAINT])),
        "removing someone else's taint",
    );
    denied(
        admit(
            &p,
            AGENT,
            Some("node-a"),
            &own,
            &node("node-a", &["example.com/gpu", TAINT, "x"]),
        ),
        "adding a taint",
    );
    let mut relabelled = node("node-a", &["example.com/gpu"]);
    relabelled["metadata"]["labels"]["node-role.kubernetes.io/control-plane"] = json!("");
    denied(
        admit(&p, AGENT, Some("node-a"), &own, &relabelled),
        "a label with the taint",
    );
    let mut cordoned = node("node-a", &["example.com/gpu", TAINT]);
    cordoned["spec"]["unschedulable"] = json!(true);
    denied(
        admit(&p, AGENT, Some("node-a"), &own, &cordoned),
        "cordoning",
    );
    let mut annotated = node("node-a", &["example.com/gpu", TAINT]);
    annotated["metadata"]["annotations"] = json!({"x": "y"});
    denied(
        admit(&p, AGENT, Some("node-a"), &own, &annotated),
        "an annotation",
    );
    let mut moved = node("node-a", &["example.com/gpu"]);
    moved["spec"]["podCIDRs"] = json!(["10.9.0.0/16"]);
    denied(
        admit(&p, AGENT, Some("node-a"), &own, &moved),
        "the pod CIDR with the taint",
    );
}

/// A requester with no user extra at all (the agent's identity impersonated, `kubectl --as`): the
/// request's `userInfo` has no `extra` field, not an empty one. Refused with the policy's own
/// message: the `has()` guard keeps the expression from failing on the missing field (without
/// it the real API server answered 422 with the CEL error: docs/real-cluster.md).
#[test]
fn a_requester_without_any_user_extra_gets_the_policys_message() {
    let p = policy();
    let old = node("node-a", &["holdfast.io/agent-not-ready"]);
    let new = without_taints(old.clone());
    let request = json!({"userInfo": {"username": AGENT}, "operation": "UPDATE"});
    assert_eq!(
        admit_request(&p, &request, &old, &new),
        Err("the holdfast agent may change only the node it runs on".to_string())
    );
}

#[test]
fn other_users_are_not_this_policys_business() {
    let p = policy();
    let old = node("node-b", &[TAINT]);
    let mut new = node("node-b", &["x"]);
    new["spec"]["unschedulable"] = json!(true);
    for user in [
        "kubernetes-admin",
        "system:node:node-b",
        "system:serviceaccount:kube-system:x",
    ] {
        assert_eq!(admit(&p, user, None, &old, &new), Ok(()), "{user}");
    }
}

/// Every field of the Node the agent's patch could reach but must not change, each alone next to
/// the taint's removal: refused, with a message naming that field; the same change of an absent
/// field (added where the node had none) too.
#[test]
fn each_pinned_field_is_refused_by_name() {
    let p = policy();
    let own = node("node-a", &["example.com/gpu", TAINT]);
    type Edit = fn(&mut Value);
    let cases: [(&str, Edit); 15] = [
        ("metadata.labels", |n| {
            n["metadata"]["labels"]["x"] = json!("y")
        }),
        ("metadata.labels", |n| {
            n["metadata"].as_object_mut().unwrap().remove("labels");
        }),
        ("metadata.annotations", |n| {
            n["metadata"]["annotations"]["node.alpha.kubernetes.io/ttl"] = json!("30")
        }),
        ("metadata.ownerReferences", |n| {
            n["metadata"]["ownerReferences"] = json!([])
        }),
        ("metadata.ownerReferences", |n| {
            n["metadata"]["ownerReferences"][0]["name"] = json!("other")
        }),
        ("metadata.finalizers", |n| {
            n["metadata"].as_object_mut().unwrap().remove("finalizers");
        }),
        ("metadata.finalizers", |n| {
            n["metadata"]["finalizers"] = json!(["example.com/node-cleanup", "x/y"])
        }),
        ("spec.unschedulable", |n| {
            n["spec"]["unschedulable"] = json!(true)
        }),
        ("spec.podCIDR", |n| {
            n["spec"]["podCIDR"] = json!("10.9.0.0/24")
        }),
        ("spec.podCIDRs", |n| {
            n["spec"]["podCIDRs"] = json!(["10.9.0.0/24"])
        }),
        ("spec.providerID", |n| {
            n["spec"]["providerID"] = json!("aws:///x")
        }),
        ("spec.externalID", |n| {
            n["spec"]["externalID"] = json!("i-123")
        }),
        (
            "spec.configSource",
            |n| n["spec"]["configSource"] = json!({"configMap": {"name": "kubelet", "namespace": "kube-system", "kubeletConfigKey": "kubelet"}}),
        ),
        ("status", |n| {
            n["status"]["conditions"][0]["status"] = json!("False")
        }),
        ("status", |n| {
            n.as_object_mut().unwrap().remove("status");
        }),
    ];
    for (field, edit) in cases {
        let mut new = node("node-a", &["example.com/gpu"]);
        // The agent's own change alone is admitted ...
        assert_eq!(
            admit(&p, AGENT, Some("node-a"), &own, &new),
            Ok(()),
            "{field}"
        );
        // ... and with this field changed too, refused, naming the field.
        edit(&mut new);
        let why = admit(&p, AGENT, Some("node-a"), &own, &new)
            .expect_err(&format!("{field} changed: admitted"));
        assert!(
            why.contains(&format!("({field})"))
                || (field == "status" && why.ends_with("its status")),
            "{field}: {why}"
        );
    }
}
