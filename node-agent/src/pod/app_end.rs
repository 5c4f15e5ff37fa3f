//! When a pod's app is finished: the one rule every part of the agent asks.
//!
//! The machine asks it of the Pod status alone (may the app still run? is the pod over?), the
//! drain and the Job watch of the status joined with what procfs saw (the app's processes exit
//! before the kubelet reports it). The answer is one of three, in order:
//!
//! - [`AppEnd::Running`]: some app container runs, or has not run yet. A container still
//!   `waiting` for its first start (ContainerCreating, PodInitializing, a slow image pull) is
//!   never done: a Job's proxy is not ended, a deleted pod gets no early quit, before its app ran.
//! - [`AppEnd::Exited`]: every app container ran and none runs now, but the kubelet may start
//!   one again (`restartPolicy: Always`; `OnFailure` with a non-zero or unknown exit code — a
//!   process exit seen in procfs has no code). Enough for a drain (the kubelet restarts nothing
//!   of a pod being deleted); not a finished Job.
//! - [`AppEnd::ForGood`]: every app container ran and exited, and the kubelet will restart none
//!   (`Never`; `OnFailure` with exit code 0 from the status): a finished Job.
//!
//! Whether the kubelet restarts a container is the pod's `restartPolicy` unless the container
//! has its own ([`ContainerRestart`]: Kubernetes 1.35's container restart rules, KEP-5307,
//! `ContainerRestartRules` beta and on by default): a `Never` Job's app may be restarted on exit
//! code 42. The rule follows kubernetes/kubernetes v1.35.4 pkg/api/v1/pod/util.go
//! `ContainerShouldRestart` (by exit code) and `IsContainerRestartable` (exit code unknown).
//!
//! Only regular app containers are asked about: native sidecars (restartable init containers)
//! are stopped by the kubelet after every regular container, the proxy included
//! (kubernetes/kubernetes pkg/kubelet/kuberuntime/kuberuntime_termination_order.go), and
//! pkg/kubelet/status `PodPhase` ends a pod without waiting for them.

use serde::{Deserialize, Serialize};

/// `spec.restartPolicy` (`Always` when absent, as the API server defaults it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum RestartPolicy {
    #[default]
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    /// The spec's value; anything else is `Always` (the API server admits only these three).
    pub(crate) fn from_spec(value: Option<&str>) -> RestartPolicy {
        match value {
            Some("Never") => RestartPolicy::Never,
            Some("OnFailure") => RestartPolicy::OnFailure,
            _ => RestartPolicy::Always,
        }
    }

    /// A Job-like pod: the kubelet does not restart an app that finished (well).
    pub(crate) fn is_job(self) -> bool {
        self != RestartPolicy::Always
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RestartPolicy::Always => "Always",
            RestartPolicy::OnFailure => "OnFailure",
            RestartPolicy::Never => "Never",
        }
    }
}

/// A container's own restart policy and rules (`spec.containers[].restartPolicy` and
/// `restartPolicyRules`, KEP-5307). None set: the pod's policy decides.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRestart {
    /// The container's `restartPolicy` (the rules are read only when it is set, as the kubelet
    /// does). `None`: unset.
    pub policy: Option<RestartPolicy>,
    /// `restartPolicyRules`, in order: the first that matches the exit code decides.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RestartRule>,
}

/// One `restartPolicyRules` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartRule {
    /// `Restart` or `RestartAllContainers` (KEP-5532, alpha: the API server admits it only with
    /// its gate on, and then the kubelet restarts); any other action is ignored, as the kubelet
    /// does (`default:` falls back to the container's policy).
    pub restarts: bool,
    /// `exitCodes.operator`: `In` (true) or `NotIn` (false); `None`: an unknown operator or no
    /// `exitCodes`, which matches nothing.
    pub exit_code_in: Option<bool>,
    pub values: Vec<i32>,
}

impl RestartRule {
    fn matches(&self, exit_code: i32) -> bool {
        match self.exit_code_in {
            Some(in_) => self.values.contains(&exit_code) == in_,
            None => false,
        }
    }
}

impl ContainerRestart {
    /// Reads a container's spec: its `restartPolicy` (an unknown value reads as unset; the API
    /// server admits only the three) and `restartPolicyRules` (at most 64 read).
    pub(crate) fn from_spec(c: &k8s_openapi::api::core::v1::Container) -> ContainerRestart {
        let policy = match c.restart_policy.as_deref() {
            Some("Never") => Some(RestartPolicy::Never),
            Some("OnFailure") => Some(RestartPolicy::OnFailure),
            Some("Always") => Some(RestartPolicy::Always),
            _ => None,
        };
        let rules = c
            .restart_policy_rules
            .iter()
            .flatten()
            .take(MAX_RULES)
            .map(|r| RestartRule {
                restarts: matches!(r.action.as_str(), "Restart" | "RestartAllContainers"),
                exit_code_in: r
                    .exit_codes
                    .as_ref()
                    .and_then(|e| match e.operator.as_str() {
                        "In" => Some(true),
                        "NotIn" => Some(false),
                        _ => None,
                    }),
                values: r
                    .exit_codes
                    .as_ref()
                    .and_then(|e| e.values.as_ref())
                    .map(|v| v.iter().take(MAX_RULE_VALUES).copied().collect())
                    .unwrap_or_default(),
            })
            .collect();
        ContainerRestart { policy, rules }
    }

    /// Whether the kubelet restarts the container after it exited with `exit_code`
    /// (`ContainerShouldRestart`): the first matching rule that restarts, else the container's
    /// policy, else the pod's.
    pub(crate) fn restarts_after(&self, pod: RestartPolicy, exit_code: i32) -> bool {
        let policy = match self.policy {
            Some(own) => {
                if self
                    .rules
                    .iter()
                    .find(|r| r.matches(exit_code))
                    .is_some_and(|r| r.restarts)
                {
                    return true;
                }
                own
            }
            None => pod,
        };
        match policy {
            RestartPolicy::Never => false,
            RestartPolicy::OnFailure => exit_code != 0,
            RestartPolicy::Always => true,
        }
    }

    /// Whether the kubelet may restart the container at all (`IsContainerRestartable`): asked
    /// when the exit code is not known yet (procfs saw the processes go).
    pub(crate) fn restartable(&self, pod: RestartPolicy) -> bool {
        match self.policy {
            Some(own) => self.rules.iter().any(|r| r.restarts) || own != RestartPolicy::Never,
            None => pod != RestartPolicy::Never,
        }
    }
}

/// Bounds on what is read of a container's rules (the API server allows 20 rules of 255 values;
/// anything beyond is hostile input and would only cost memory).
const MAX_RULES: usize = 64;
const MAX_RULE_VALUES: usize = 256;

/// Where one app container is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AppNow {
    /// Not started yet, or waiting to start again (CrashLoopBackOff).
    Waiting,
    /// Running (by the status, or with live processes).
    Running,
    /// Terminated, by the kubelet's status.
    Terminated { exit_code: i32 },
    /// Its processes all exited (procfs), before the kubelet reported it: no exit code.
    Exited,
}

/// One regular app container, as far as the caller knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AppContainerEnd {
    /// It ran at some point (a process seen, or the status says so).
    pub ran: bool,
    pub now: AppNow,
    /// Its own restart policy and rules, if any.
    pub restart: ContainerRestart,
}

/// How far the app is from finished; ordered: `Running < Exited < ForGood`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum AppEnd {
    Running,
    Exited,
    ForGood,
}

/// The rule (see the module docs). A pod without app containers is never finished.
pub(crate) fn app_end(
    policy: RestartPolicy,
    apps: impl IntoIterator<Item = AppContainerEnd>,
) -> AppEnd {
    let mut any = false;
    let mut for_good = true;
    for app in apps {
        any = true;
        let restarts = match app.now {
            _ if !app.ran => return AppEnd::Running,
            AppNow::Waiting | AppNow::Running => return AppEnd::Running,
            AppNow::Terminated { exit_code } => app.restart.restarts_after(policy, exit_code),
            AppNow::Exited => app.restart.restartable(policy),
        };
        for_good &= !restarts;
    }
    match (any, for_good) {
        (false, _) => AppEnd::Running,
        (true, true) => AppEnd::ForGood,
        (true, false) => AppEnd::Exited,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(ran: bool, now: AppNow) -> AppContainerEnd {
        AppContainerEnd {
            ran,
            now,
            restart: ContainerRestart::default(),
        }
    }

    /// A container with `restartPolicy: Never` and a rule restarting it on `codes` (the KEP's
    /// example: retry on exit code 42).
    fn retried_on(codes: &[i32], now: AppNow) -> AppContainerEnd {
        AppContainerEnd {
            ran: true,
            now,
            restart: ContainerRestart {
                policy: Some(RestartPolicy::Never),
                rules: vec![RestartRule {
                    restarts: true,
                    exit_code_in: Some(true),
                    values: codes.to_vec(),
                }],
            },
        }
    }

    #[test]
    fn a_container_restart_rule_keeps_a_never_job_going() {
        use RestartPolicy::{Always, Never};
        let exited = |code| AppNow::Terminated { exit_code: code };
        // Exit code 42 matches the rule: the kubelet restarts the app, the Job is not finished.
        assert_eq!(
            app_end(Never, [retried_on(&[42], exited(42))]),
            AppEnd::Exited
        );
        // Any other code: the container's own Never.
        assert_eq!(
            app_end(Never, [retried_on(&[42], exited(0))]),
            AppEnd::ForGood
        );
        assert_eq!(
            app_end(Never, [retried_on(&[42], exited(1))]),
            AppEnd::ForGood
        );
        // Gone by procfs (no code yet): a rule may restart it, so not for good.
        assert_eq!(
            app_end(Never, [retried_on(&[42], AppNow::Exited)]),
            AppEnd::Exited
        );
        // The container's own policy beats the pod's, both ways.
        let own = |policy| AppContainerEnd {
            restart: ContainerRestart {
                policy: Some(policy),
                rules: vec![],
            },
            ..c(true, exited(0))
        };
        assert_eq!(app_end(Always, [own(Never)]), AppEnd::ForGood);
        assert_eq!(app_end(Never, [own(Always)]), AppEnd::Exited);
        // NotIn, and a rule that is not "Restart" (ignored).
        let mut not_in = retried_on(&[0], exited(3));
        not_in.restart.rules[0].exit_code_in = Some(false);
        assert_eq!(app_end(Never, [not_in.clone()]), AppEnd::Exited);
        not_in.now = exited(0);
        assert_eq!(app_end(Never, [not_in]), AppEnd::ForGood);
        let mut other = retried_on(&[42], exited(42));
        other.restart.rules[0].restarts = false;
        assert_eq!(app_end(Never, [other]), AppEnd::ForGood);
    }

    /// The spec as the API server serves it (k8s.io/api v0.35.4 core/v1 types.go
    /// `ContainerRestartRule`, `ContainerRestartRuleOnExitCodes`).
    #[test]
    fn container_restart_reads_the_spec() {
        let c: k8s_openapi::api::core::v1::Container = serde_json::from_value(serde_json::json!({
            "name": "main",
            "restartPolicy": "Never",
            "restartPolicyRules": [
                {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}},
                {"action": "Bogus", "exitCodes": {"operator": "In", "values": [7]}},
                {"action": "Restart", "exitCodes": {"operator": "Sometimes", "values": [8]}}
            ]
        }))
        .expect("a container");
        let r = ContainerRestart::from_spec(&c);
        assert_eq!(r.policy, Some(RestartPolicy::Never));
        assert!(r.restarts_after(RestartPolicy::Never, 42));
        assert!(
            !r.restarts_after(RestartPolicy::Never, 7),
            "unknown action: ignored"
        );
        assert!(
            !r.restarts_after(RestartPolicy::Never, 8),
            "unknown operator: no match"
        );
        assert!(r.restartable(RestartPolicy::Never));
        let plain: k8s_openapi::api::core::v1::Container =
            serde_json::from_value(serde_json::json!({"name": "app"})).expect("a container");
        assert_eq!(
            ContainerRestart::from_spec(&plain),
            ContainerRestart::default()
        );
    }

    #[test]
    fn the_rule_as_a_table() {
        use AppEnd::{Exited as Gone, ForGood, Running as NotDone};
        use AppNow::{Exited, Running, Terminated, Waiting};
        use RestartPolicy::{Always, Never, OnFailure};
        let ok = Terminated { exit_code: 0 };
        let failed = Terminated { exit_code: 1 };
        for (policy, apps, want) in [
            // Nothing to ask about: never finished.
            (Never, vec![], NotDone),
            // Not started yet (ContainerCreating): never finished, whatever the policy.
            (Never, vec![c(false, Waiting)], NotDone),
            (Never, vec![c(false, ok)], NotDone),
            // Running, or waiting to run again.
            (Never, vec![c(true, Running)], NotDone),
            (Always, vec![c(true, Waiting)], NotDone),
            // One of two done.
            (Never, vec![c(true, ok), c(true, Running)], NotDone),
            // Never: any end is for good, by status or by procfs.
            (Never, vec![c(true, failed)], ForGood),
            (Never, vec![c(true, Exited), c(true, ok)], ForGood),
            // OnFailure: only exit code 0 from the status.
            (OnFailure, vec![c(true, ok)], ForGood),
            (OnFailure, vec![c(true, failed)], Gone),
            (OnFailure, vec![c(true, Exited)], Gone),
            // Always: gone now, but it comes back.
            (Always, vec![c(true, ok)], Gone),
            (Always, vec![c(true, Exited)], Gone),
        ] {
            assert_eq!(app_end(policy, apps.clone()), want, "{policy:?} {apps:?}");
        }
    }

    #[test]
    fn restart_policy_reads_the_spec() {
        assert_eq!(RestartPolicy::from_spec(None), RestartPolicy::Always);
        assert_eq!(
            RestartPolicy::from_spec(Some("Never")),
            RestartPolicy::Never
        );
        assert_eq!(
            RestartPolicy::from_spec(Some("OnFailure")),
            RestartPolicy::OnFailure
        );
        assert_eq!(
            RestartPolicy::from_spec(Some("bogus")),
            RestartPolicy::Always
        );
        assert!(RestartPolicy::Never.is_job() && !RestartPolicy::Always.is_job());
    }
}
