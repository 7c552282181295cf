//! kairos-jepsen: a fault-injection harness for Kairos. It starts a real
//! 3- or 5-node cluster (each node in its own network namespace when run as
//! root), drives client and worker workloads while a seeded nemesis injects
//! partitions, crashes, pauses, clock skew and lossy links, records everything
//! to `history.jsonl`, and judges the history with pure checkers.
//!
//! The offline half (`event`, `history`, `checker`, `report`, `check`) needs
//! no cluster and no root; the live half (`net`, `cluster`, `nemesis`,
//! `workload`, `run`) does the driving.

pub mod campaign;
pub mod check;
pub mod checker;
pub mod clean;
pub mod client;
pub mod clock;
pub mod cluster;
pub mod disk;
pub mod event;
pub mod final_state;
pub mod generator;
pub mod history;
pub mod membership;
pub mod nemesis;
pub mod net;
pub mod recorder;
pub mod report;
pub mod run;
pub mod signal;
pub mod testkit;
pub mod workload;
