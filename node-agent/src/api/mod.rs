//! The wire types: the `/status` document's rows, phases, outcomes, reports and per-pod
//! timelines, and their serde helpers. A leaf: it imports nothing from the agent, so the agent, the status API and
//! `holdfast status` all depend on it and it depends on none of them.

pub mod reports;
pub mod status;
pub mod text;
pub mod time;
pub mod timeline;

pub use reports::{
    DirectionCounts, DrainOutcome, DrainReport, FilterCounts, FinishedBy, IdleReason, JobOutcome,
    JobReport, QuitReason, TimestampMeaning, DEFAULT_STAT_PREFIX,
};
pub use status::{
    HoldOutcome, HoldRecord, Mesh, NodeStatus, Phase, PodStatus, SidecarMode, SourceProblem,
    StartupTaint,
};
pub use timeline::{Step, StepKind, Timeline, MAX_STEPS};
