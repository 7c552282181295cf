//! The leader's housekeeping timer: proposes `Housekeep` when the state
//! says there is work (runs of a deleted job left, or a job due for its
//! history limits). It only proposes; what goes is decided in apply, a
//! bounded number of records per entry.

use std::sync::Arc;
use std::time::Duration;

use crate::core::{Command, Response};
use crate::node::Node;

/// How often the leader asks whether there is housekeeping to do.
const HOUSEKEEP_EVERY: Duration = Duration::from_millis(250);
/// Run records one proposal deletes at most (≤ `limits::HOUSEKEEP_DELETES_MAX`):
/// small enough that one entry applies quickly among the fires.
const DELETES_PER_PROPOSAL: u32 = 1024;

/// Runs while this node leads (aborted with the leader's task).
pub async fn run(node: Arc<Node>) {
    let mut tick = tokio::time::interval(HOUSEKEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // Writes are stamped only with calibrated cluster time.
        let Some(now_ms) = node.clock.calibrated_now_ms() else {
            continue;
        };
        if !node.sm.housekeeping_due(now_ms) {
            continue;
        }
        let cmd = Command::Housekeep {
            now_ms,
            max_deletes: DELETES_PER_PROPOSAL,
        };
        match node.propose(cmd).await {
            Ok(Response::Housekept { removed }) => {
                tracing::debug!(removed, "housekeeping removed run records");
            }
            Ok(other) => tracing::warn!("housekeeping refused: {other:?}"),
            Err(e) => tracing::warn!("housekeeping not committed: {e}"),
        }
    }
}
