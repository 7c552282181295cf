//! Kairos server library: a Raft-replicated scheduling server.
//!
//! See `ARCHITECTURE.md` at the repository root for the codemap and the
//! invariants each module keeps.

pub mod admission;
pub mod backup;
pub mod clock;
pub mod console;
pub mod core;
pub mod disk;
pub mod failpoint;
pub mod grpc;
pub mod handover;
pub mod http;
pub mod leader;
pub mod logsink;
pub mod membership;
pub mod metrics;
pub mod node;
pub mod otel;
pub mod raft;
pub mod runlog;
pub mod store;
pub mod tls;
pub mod upgrade;
pub mod watch;

pub use node::{run, Config};
