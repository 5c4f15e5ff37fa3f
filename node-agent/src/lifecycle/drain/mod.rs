//! The end of a pod's proxy: the drain when the pod is deleted, and the quit when a Job's app
//! has finished.
//!
//! - [`drain`] (`deletion.rs`): on deletion, drain Envoy's inbound listeners at once, as
//!   pilot-agent does, and nothing that touches outbound (`envoy_version` says why and what
//!   each Envoy version does with the call), watch the app's processes exit (`app_exit`) and
//!   what is in flight (the filter's connection counts, Envoy's byte counters: [`in_flight`]),
//!   and `POST /quitquitquit` as soon as the app is gone and nothing is in flight — or at the
//!   deadline ([`plan`]) derived from the grace period.
//! - [`finish_job`] (`job.rs`): for a pod that is not being deleted, quit the proxy once every
//!   app container has exited for good (`restartPolicy: Never`, or `OnFailure` with exit code
//!   0), so the pod completes.
//!
//! The two executors only sample and perform: what they do next is decided in `decide`, pure
//! functions of what was observed that both share (when the app is finished is
//! `crate::pod::app_end()`, the one rule the machine asks too). How they talk to Envoy is
//! [`admin`].
//!
//! Both are bounded: every admin call has a timeout and a bounded number of attempts, the drain
//! ends by its deadline, and both return promptly when the agent stops or the pod goes. They
//! never fail: what went wrong is in the report.
//!
//! Generic over `ProxyAdmin` (implemented for [`AdminClient`]) and [`PodProcessSource`]
//! (implemented by [`PodProcsSource`]), so the logic is tested with real processes and a fake
//! admin API, and against a real Envoy in `node-agent/tests/drain_parts.rs`.

pub mod admin;
pub(crate) mod app_exit;
pub(crate) mod decide;
mod deletion;
pub(crate) mod envoy_version;
pub mod in_flight;
mod job;
pub mod plan;
mod step;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use admin::PodProxy;
pub use app_exit::{
    AppContainer, AppTracker, ExitWatcher, PodProcessSource, PodProcsSource, Watch,
};
pub use deletion::{drain, HEALTHCHECK_OK_PATH};
pub use in_flight::{DrainSample, InFlight, InFlightJudge, TrafficBytes, DEFAULT_STAT_PREFIX};
pub use job::finish_job;

// The wire types live in `crate::api`; re-exported here so callers keep their paths.
pub use crate::api::time::{ms, opt_ms};
pub use crate::api::{
    DrainOutcome, DrainReport, FilterCounts, FinishedBy, IdleReason, JobOutcome, JobReport,
    QuitReason, TimestampMeaning,
};
pub use crate::config::DrainSettings;

#[cfg(doc)]
use crate::effects::envoy_admin::AdminClient;
use crate::pod::{PodKey, PodView};

/// Envoy admin paths the drain uses (the inbound drain's is decided in [`envoy_version`]).
pub(crate) const SERVER_INFO_PATH: &str = "/server_info";
pub(crate) use crate::effects::envoy_admin::QUIT_PATH;

/// What [`drain`] and [`finish_job`] work with.
pub struct DrainCtx<'a, A, S> {
    pub key: &'a PodKey,
    /// The pod's Envoy admin API (an [`AdminClient`] made in the pod's netns).
    pub admin: &'a A,
    /// The pod's processes (a [`PodProcsSource`]).
    pub processes: S,
    /// The latest view of the pod; `None` once it is gone.
    pub view: watch::Receiver<Option<PodView>>,
    /// Cancelled when the agent stops.
    pub stop: CancellationToken,
    pub settings: &'a DrainSettings,
    /// Told each [`DrainStep`] as it happens (the driver: the row's phase and the pod's
    /// timeline; tests: "the drain has begun" without a sleep).
    pub steps: Option<tokio::sync::mpsc::UnboundedSender<DrainStep>>,
}

/// What an executor works with once started from its [`DrainCtx`] (the set-up [`drain`] and
/// [`finish_job`] share): the admin calls, their errors and the steps told, from `t0`; the app's
/// processes; the pod's view; the agent's stop.
struct Started<'a, A, S> {
    d: admin::Drainer<'a, A>,
    app: AppTracker<S>,
    view: watch::Receiver<Option<PodView>>,
    stop: CancellationToken,
    settings: &'a DrainSettings,
}

impl<'a, A, S: PodProcessSource> DrainCtx<'a, A, S> {
    /// Starts an executor at `t0` (`t0_wall` on the wall clock).
    fn start(self, t0: tokio::time::Instant, t0_wall: std::time::SystemTime) -> Started<'a, A, S> {
        let DrainCtx {
            key,
            admin,
            processes,
            view,
            stop,
            settings,
            steps,
        } = self;
        Started {
            d: admin::Drainer::new(admin, settings, steps, t0, t0_wall),
            app: AppTracker::new(key, processes),
            view,
            stop,
            settings,
        }
    }
}

/// A step of a drain or a Job watch, told as it happens (see [`DrainCtx::steps`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainStep {
    /// The inbound drain was asked of Envoy: `drained` when it answered 2xx; the Envoy version
    /// read from `/server_info` (`None`: not read).
    InboundDrained {
        drained: bool,
        envoy_version: Option<String>,
    },
    /// One app container is gone: its processes all exited (`exit_code` `None`: seen by the
    /// agent first), or its status says it terminated (with its code). Told once per container.
    AppContainerExited {
        container: String,
        exit_code: Option<i32>,
    },
    /// Every app process was seen gone (the drain now waits only for what is in flight).
    AppGone,
    /// The Job's app finished for good, by this signal.
    JobFinished(FinishedBy),
    /// Envoy's counts said idle, but the pod's sockets still held `bytes` for their peers in
    /// the kernel's send queues ([`InFlight::Sending`]): the quit waits. Told once.
    KernelFlushing { bytes: u64 },
    /// `/quitquitquit` is about to be sent, for this reason.
    Quitting(QuitReason),
}

#[cfg(test)]
mod tests;
