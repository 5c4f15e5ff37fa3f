//! A stand-in for the API server's **ResourceQuota admission** of a pod CREATE, small and
//! named as one: what decides whether a pod of a "limited by default" priority class is
//! admitted in a namespace (issue 30: GKE refuses `system-node-critical` outside kube-system
//! unless a quota in the namespace matches it).
//!
//! Followed from kubernetes/kubernetes (master, read 2026-11):
//! - `staging/src/k8s.io/apiserver/pkg/admission/plugin/resourcequota/controller.go`
//!   `CheckRequest`: the request's *limited scopes* are the admission configuration's
//!   `limitedResources[].matchScopes` (for group "" resource `pods`) the pod matches
//!   (`getMatchedLimitedScopes`); every quota of the namespace adds the scope selectors the pod
//!   matches to the *restricted scopes* (`MatchingScopes`, each expression alone); a quota
//!   *applies* when the pod matches all its selectors and its `status.hard` names a pod
//!   resource (`generic.Matches`). A limited scope without a restricted scope of the same
//!   name is refused: `insufficient quota to match these scopes: [...]` (pods.go
//!   `UncoveredQuotaScopes` compares scope names only). An applying quota without usage for
//!   each hard resource is refused (`status unknown for quota`); then each applying quota's
//!   `used + 1 pod <= hard` or `exceeded quota: ...`.
//! - `pkg/quota/v1/evaluator/core/pods.go` `podMatchesScopeFunc` / `podMatchesSelector`:
//!   `PriorityClass` with `Exists` is "the pod names a class"; otherwise a label selector over
//!   `{PriorityClass: <class>}` (the empty map when the pod names none), with `In`, `NotIn`,
//!   `Exists`, `DoesNotExist` as label selectors read them.
//!
//! Only the `pods` count resource and the `PriorityClass` scope are modelled (what the agent's
//! DaemonSet consumes and GKE limits); a quota or configuration using anything else is an
//! error here, not a silent pass.

use k8s_openapi::api::core::v1::{PodSpec, ResourceQuota, ScopedResourceSelectorRequirement};

/// One `limitedResources` entry of the ResourceQuota admission plugin's configuration
/// (`apiserver.config.k8s.io` `ResourceQuotaConfiguration`).
#[derive(Debug, Clone)]
pub struct LimitedResource {
    pub api_group: String,
    pub resource: String,
    pub match_scopes: Vec<ScopedResourceSelectorRequirement>,
}

/// GKE's configuration (its error text names it: `[{PriorityClass In [system-node-critical
/// system-cluster-critical]}]`, gatekeeper#1120, osm#4408): pods of either critical class are
/// limited by default; kube-system has the quota `gcp-critical-pods` that admits them.
pub fn gke_limited_resources() -> Vec<LimitedResource> {
    vec![LimitedResource {
        api_group: String::new(),
        resource: "pods".into(),
        match_scopes: vec![ScopedResourceSelectorRequirement {
            scope_name: "PriorityClass".into(),
            operator: "In".into(),
            values: Some(vec![
                "system-node-critical".into(),
                "system-cluster-critical".into(),
            ]),
        }],
    }]
}

/// Why the API server refused the pod (the message is the API server's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

fn scope_matches(sel: &ScopedResourceSelectorRequirement, pod: &PodSpec) -> Result<bool, String> {
    if sel.scope_name != "PriorityClass" {
        return Err(format!(
            "scope {} is not modelled by this stand-in",
            sel.scope_name
        ));
    }
    let class = pod.priority_class_name.as_deref().filter(|c| !c.is_empty());
    let values = sel.values.as_deref().unwrap_or(&[]);
    Ok(match sel.operator.as_str() {
        "Exists" => class.is_some(),
        "DoesNotExist" => class.is_none(),
        "In" => class.is_some_and(|c| values.iter().any(|v| v == c)),
        // A label selector's NotIn matches a set without the key.
        "NotIn" => class.is_none_or(|c| !values.iter().any(|v| v == c)),
        other => return Err(format!("operator {other} is not a scope selector operator")),
    })
}

fn quota_selectors(q: &ResourceQuota) -> Vec<ScopedResourceSelectorRequirement> {
    let spec = q.spec.clone().unwrap_or_default();
    let mut out: Vec<_> = spec
        .scopes
        .unwrap_or_default()
        .into_iter()
        .map(|s| ScopedResourceSelectorRequirement {
            scope_name: s,
            operator: "Exists".into(),
            values: None,
        })
        .collect();
    out.extend(
        spec.scope_selector
            .and_then(|s| s.match_expressions)
            .unwrap_or_default(),
    );
    out
}

/// Go's `%v` of a `[]ScopedResourceSelectorRequirement`, as the refusal prints it.
fn go_format(scopes: &[ScopedResourceSelectorRequirement]) -> String {
    let each: Vec<String> = scopes
        .iter()
        .map(|s| {
            format!(
                "{{{} {} [{}]}}",
                s.scope_name,
                s.operator,
                s.values.as_deref().unwrap_or(&[]).join(" ")
            )
        })
        .collect();
    format!("[{}]", each.join(" "))
}

fn count(q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> Result<i64, String> {
    let s = q.0.trim();
    let (digits, mult) = match s.strip_suffix('k') {
        Some(d) => (d, 1_000),
        None => match s.strip_suffix('M') {
            Some(d) => (d, 1_000_000),
            None => match s.strip_suffix('G') {
                Some(d) => (d, 1_000_000_000),
                None => (s, 1),
            },
        },
    };
    digits
        .parse::<i64>()
        .map(|n| n * mult)
        .map_err(|_| format!("pod count {s:?} is not modelled by this stand-in"))
}

/// Decides the CREATE of a pod with `spec` in a namespace holding `quotas`, under the admission
/// configuration `limited`. `Ok(())` admitted; `Err(Refused)` with the API server's message.
/// A quota or configuration outside what is modelled panics with the reason (test input).
pub fn admit_pod(
    limited: &[LimitedResource],
    quotas: &[ResourceQuota],
    spec: &PodSpec,
) -> Result<(), Refused> {
    let fail = |e: String| -> ! { panic!("resource_quota stand-in: {e}") };
    let mut limited_scopes = Vec::new();
    for l in limited
        .iter()
        .filter(|l| l.api_group.is_empty() && l.resource == "pods")
    {
        for s in &l.match_scopes {
            if scope_matches(s, spec).unwrap_or_else(|e| fail(e)) {
                limited_scopes.push(s.clone());
            }
        }
    }
    let mut restricted = Vec::new();
    let mut applying = Vec::new();
    for q in quotas {
        let selectors = quota_selectors(q);
        let mut all = true;
        for s in &selectors {
            let m = scope_matches(s, spec).unwrap_or_else(|e| fail(e));
            if m {
                restricted.push(s.clone());
            }
            all &= m;
        }
        let hard = q
            .status
            .as_ref()
            .and_then(|s| s.hard.clone())
            .unwrap_or_default();
        for k in hard.keys() {
            if k != "pods" && k != "count/pods" {
                fail(format!("quota resource {k} is not modelled"));
            }
        }
        if all && !hard.is_empty() {
            applying.push(q);
        }
    }
    let uncovered: Vec<_> = limited_scopes
        .into_iter()
        .filter(|l| !restricted.iter().any(|r| r.scope_name == l.scope_name))
        .collect();
    if !uncovered.is_empty() {
        return Err(Refused(format!(
            "insufficient quota to match these scopes: {}",
            go_format(&uncovered)
        )));
    }
    for q in applying {
        let name = q.metadata.name.clone().unwrap_or_default();
        let status = q.status.clone().unwrap_or_default();
        let hard = status.hard.unwrap_or_default();
        let used = status.used.unwrap_or_default();
        for (res, h) in &hard {
            let Some(u) = used.get(res) else {
                return Err(Refused(format!("status unknown for quota: {name}")));
            };
            let (h, u) = (
                count(h).unwrap_or_else(|e| fail(e)),
                count(u).unwrap_or_else(|e| fail(e)),
            );
            if u + 1 > h {
                return Err(Refused(format!(
                    "exceeded quota: {name}, requested: {res}=1, used: {res}={u}, limited: {res}={h}"
                )));
            }
        }
    }
    Ok(())
}

/// The quota as the API server holds it once its controller has synced it: `status.hard` =
/// `spec.hard`, `status.used` = `used` pods.
pub fn synced(mut q: ResourceQuota, used: i64) -> ResourceQuota {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let hard = q
        .spec
        .as_ref()
        .and_then(|s| s.hard.clone())
        .unwrap_or_default();
    let used = hard
        .keys()
        .map(|k| (k.clone(), Quantity(used.to_string())))
        .collect();
    q.status = Some(k8s_openapi::api::core::v1::ResourceQuotaStatus {
        hard: Some(hard),
        used: Some(used),
    });
    q
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(class: Option<&str>) -> PodSpec {
        PodSpec {
            priority_class_name: class.map(str::to_string),
            ..Default::default()
        }
    }

    fn quota(name: &str, values: &[&str], pods: &str) -> ResourceQuota {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"hard": {"pods": pods}, "scopeSelector": {"matchExpressions": [
                {"scopeName": "PriorityClass", "operator": "In", "values": values}]}}
        }))
        .unwrap()
    }

    #[test]
    fn follows_the_api_servers_quota_admission() {
        let gke = gke_limited_resources();
        // No class, or a class not limited: no quota needed.
        assert_eq!(admit_pod(&gke, &[], &pod(None)), Ok(()));
        assert_eq!(admit_pod(&gke, &[], &pod(Some("high"))), Ok(()));
        // A limited class without a covering quota: GKE's message, verbatim.
        assert_eq!(
            admit_pod(&gke, &[], &pod(Some("system-node-critical"))),
            Err(Refused(
                "insufficient quota to match these scopes: [{PriorityClass In \
                 [system-node-critical system-cluster-critical]}]"
                    .into()
            ))
        );
        // A quota for another class does not cover it (a scope *name* must match the pod).
        let other = synced(quota("q", &["system-cluster-critical"], "10"), 0);
        assert!(admit_pod(&gke, &[other], &pod(Some("system-node-critical"))).is_err());
        // A covering quota: admitted while it has room, then `exceeded quota`.
        let q = quota("q", &["system-node-critical"], "2");
        assert_eq!(
            admit_pod(
                &gke,
                &[synced(q.clone(), 1)],
                &pod(Some("system-node-critical"))
            ),
            Ok(())
        );
        assert_eq!(
            admit_pod(
                &gke,
                &[synced(q.clone(), 2)],
                &pod(Some("system-node-critical"))
            ),
            Err(Refused(
                "exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2".into()
            ))
        );
        // A quota its controller has not synced yet refuses.
        assert_eq!(
            admit_pod(
                &gke,
                &[ResourceQuota {
                    status: Some(k8s_openapi::api::core::v1::ResourceQuotaStatus {
                        hard: q.spec.clone().unwrap().hard,
                        used: None,
                    }),
                    ..q
                }],
                &pod(Some("system-node-critical"))
            ),
            Err(Refused("status unknown for quota: q".into()))
        );
        // Without the limiting configuration (most clusters) the class is free.
        assert_eq!(
            admit_pod(&[], &[], &pod(Some("system-node-critical"))),
            Ok(())
        );
    }
}
