//! The pure scheduling core: jobs, wheel entries and runs as a deterministic
//! state machine. `apply(view, command)` reads state through a [`StateView`]
//! and returns what to write and what the leader should do
//! ([`Applied`]). Nothing in here reads a clock, draws randomness or does
//! I/O; every time value arrives inside the command.

pub mod apply;
pub mod backfill;
pub mod codec;
pub mod command;
pub mod keys;
#[cfg(test)]
mod proptests;
pub mod query;
pub mod run_search;
pub mod schedule;
pub mod stats;
#[cfg(test)]
mod tests;
pub mod types;
pub mod validate;
pub mod view;
pub mod workflow;

pub use apply::{apply, apply_into, Applied, Effect, Finished, JobChange};
pub use command::{Command, CommandError, FinishReport, Response, VersionedCommand};
pub use types::*;
pub use view::{Layered, MemView, Overlay, Pending, StateView, Write};
