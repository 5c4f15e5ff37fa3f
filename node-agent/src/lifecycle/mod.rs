//! One pod's lifecycle: the pure [`machine`] decides, the `driver` performs its effects, the
//! recorder (`record`) writes every outcome to the board, the metrics, the Events and the log together.

pub mod drain;
pub(crate) mod driver;
pub(crate) mod facts;
pub mod machine;
pub mod messages;
pub(crate) mod pacing;
pub mod readiness;
pub(crate) mod record;
pub mod replay;
