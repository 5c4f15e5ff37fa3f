//! One pod's lifecycle: the pure [`machine`] decides, the [`driver`] performs its effects, the
//! [`record`]er writes every outcome to the board, the metrics, the Events and the log together.

pub mod drain;
pub mod driver;
pub mod facts;
pub mod machine;
pub mod messages;
pub mod pacing;
pub mod readiness;
pub mod record;
pub mod replay;
