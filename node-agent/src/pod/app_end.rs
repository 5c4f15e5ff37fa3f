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
    pub fn from_spec(value: Option<&str>) -> RestartPolicy {
        match value {
            Some("Never") => RestartPolicy::Never,
            Some("OnFailure") => RestartPolicy::OnFailure,
            _ => RestartPolicy::Always,
        }
    }

    /// A Job-like pod: the kubelet does not restart an app that finished (well).
    pub fn is_job(self) -> bool {
        self != RestartPolicy::Always
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RestartPolicy::Always => "Always",
            RestartPolicy::OnFailure => "OnFailure",
            RestartPolicy::Never => "Never",
        }
    }
}

/// Where one app container is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppNow {
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppContainerEnd {
    /// It ran at some point (a process seen, or the status says so).
    pub ran: bool,
    pub now: AppNow,
}

/// How far the app is from finished; ordered: `Running < Exited < ForGood`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum AppEnd {
    Running,
    Exited,
    ForGood,
}

/// The rule (see the module docs). A pod without app containers is never finished.
pub fn app_end(policy: RestartPolicy, apps: impl IntoIterator<Item = AppContainerEnd>) -> AppEnd {
    let mut any = false;
    let mut for_good = true;
    for app in apps {
        any = true;
        let restarts = match app.now {
            _ if !app.ran => return AppEnd::Running,
            AppNow::Waiting | AppNow::Running => return AppEnd::Running,
            AppNow::Terminated { exit_code } => match policy {
                RestartPolicy::Never => false,
                RestartPolicy::OnFailure => exit_code != 0,
                RestartPolicy::Always => true,
            },
            AppNow::Exited => policy != RestartPolicy::Never,
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
        AppContainerEnd { ran, now }
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
