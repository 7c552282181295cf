//! Leadership handover, run on the leader: `cluster transfer-leader`, a
//! graceful stop, and removing the leader's own node. openraft 0.9 has no
//! transfer call, so it is built on its election trigger and leader lease.
//!
//! A voter whose vote is committed refuses every vote request while its
//! lease runs (`election_timeout_max` after its vote last changed or was
//! touched). Followers touch it at every AppendEntries, so they refuse; the
//! leader touches it only when it was elected, so once that lease has run
//! out it grants a vote to a candidate whose log is at least as long as its
//! own. So the leader holds every proposal and read index back
//! (`Node::handover_gate`), waits until the target holds its whole log, and
//! asks it (peer RPC `Elect`) to start an election now: target and old
//! leader are a majority of three, and leadership moves in about one round
//! trip. With four or more voters they are not a majority, and the others
//! refuse while their lease from the last heartbeat runs: the leader stops
//! its heartbeats and waits one lease first (their own election timers run
//! a lease plus an election timeout, so none of them campaigns before the
//! target). A candidate with a shorter log would be refused and still
//! depose the leader with its higher term: that is why writes are held
//! until the target has caught up.

use std::time::Duration;

use openraft::{BasicNode, RaftMetrics};
use tokio::time::timeout;

use crate::membership::{self, Members, MembershipError};
use crate::node::Node;
use crate::raft::NodeId;

/// How long proposals already in flight may take to commit once new ones are held.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a leader elected a moment ago gets to apply its membership.
const FRESH_LEADER_WAIT: Duration = Duration::from_secs(2);
/// How long the target may take to hold the leader's whole log.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the election may take once the target was asked to start it.
const ELECTED_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on each call to the target (its status, then `Elect`).
pub const RPC_TIMEOUT: Duration = Duration::from_secs(1);
/// Added to the leader's own lease before the target campaigns.
const LEASE_MARGIN: Duration = Duration::from_millis(20);
/// Added to the followers' lease after the last heartbeat: it may still be
/// on its way when heartbeats stop.
const SILENCE_MARGIN: Duration = Duration::from_millis(50);
/// A graceful stop waits at most this long for a handover, then stops anyway.
const STOP_TIMEOUT: Duration = Duration::from_secs(3);

/// Why leadership did not move.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    /// Not started (nothing changed); the message says why.
    #[error("{0}")]
    Refused(String),
    #[error("this node is not the leader")]
    NotLeader { leader: Option<(NodeId, String)> },
    /// Started but not seen to finish in time: leadership may still move.
    #[error("{0}")]
    Incomplete(String),
}

/// A finished handover.
#[derive(Debug, Clone, Copy)]
pub struct Handover {
    pub leader: NodeId,
    pub previous: NodeId,
    pub took_ms: i64,
}

fn refused(msg: impl Into<String>) -> HandoverError {
    HandoverError::Refused(msg.into())
}

impl From<MembershipError> for HandoverError {
    fn from(e: MembershipError) -> Self {
        match e {
            MembershipError::Refused(m) => HandoverError::Refused(m),
            MembershipError::NotLeader { leader } => HandoverError::NotLeader { leader },
            MembershipError::Raft(m) => HandoverError::Incomplete(m),
        }
    }
}

/// Hands leadership to voter `to`, or to the most up-to-date other voter,
/// and returns who leads now. Proposals wait meanwhile (at most the
/// timeouts above) and then find this node a follower.
pub async fn transfer_leader(node: &Node, to: Option<NodeId>) -> Result<Handover, HandoverError> {
    let started_ms = node.clock.mono_ms();
    // A leader elected a moment ago may not have applied the membership it
    // leads with yet, which `settled` refuses as a change in progress.
    let mut metrics = node.raft.metrics();
    let applied = |m: &RaftMetrics<NodeId, BasicNode>| {
        m.last_applied.map(|l| l.index) >= m.membership_config.log_id().map(|l| l.index)
    };
    let _ = timeout(FRESH_LEADER_WAIT, metrics.wait_for(applied)).await;
    let members = membership::settled(node)?;
    let (target, addr) = first_answering(node, candidates(node, &members, to)?).await?;
    wait_own_lease(node).await;
    let _quiet = timeout(QUIESCE_TIMEOUT, node.handover_gate.write())
        .await
        .map_err(|_| {
            refused(format!(
                "proposals in flight did not commit within {QUIESCE_TIMEOUT:?}"
            ))
        })?;
    let last = caught_up(node, target).await?;
    let _silent = match members.voters.len() > 3 {
        true => Some(silence(node).await),
        false => None,
    };
    crate::grpc::peer::ask_elect(node, target, &addr, last).await?;
    let leader = new_leader(node, target).await?;
    Ok(Handover {
        leader,
        previous: node.id,
        took_ms: node.clock.mono_ms() - started_ms,
    })
}

/// The voters that may take over, best first: `to` if it is another
/// voter, else every other voter by lag (the lowest id among equals).
fn candidates(node: &Node, m: &Members, to: Option<NodeId>) -> Result<Vec<NodeId>, HandoverError> {
    match to {
        Some(id) if id == node.id => Err(refused(format!("node {id} is already the leader"))),
        Some(id) if m.learners.contains(&id) => Err(refused(format!(
            "node {id} is a learner, not a voter; promote it first"
        ))),
        Some(id) if !m.voters.contains(&id) => Err(refused(format!("node {id} is not a member"))),
        Some(id) => Ok(vec![id]),
        None if m.voters.len() < 2 => Err(refused(format!(
            "node {} is the only voter: no other voter can take over",
            node.id
        ))),
        None => {
            let lags = node.replication_lags();
            let mut others: Vec<NodeId> = m
                .voters
                .iter()
                .copied()
                .filter(|id| *id != node.id)
                .collect();
            others.sort_by_key(|id| (lags.get(id).copied().unwrap_or(u64::MAX), *id));
            Ok(others)
        }
    }
}

/// The first of `ids` that answers a status probe now, with its peer address.
async fn first_answering(node: &Node, ids: Vec<NodeId>) -> Result<(NodeId, String), HandoverError> {
    let members = node.members();
    for id in &ids {
        let Some((_, addr)) = members.iter().find(|(m, _)| m == id) else {
            continue;
        };
        if let Ok(Some(_)) = timeout(RPC_TIMEOUT, node.peer_status(*id, addr, false)).await {
            return Ok((*id, addr.clone()));
        }
    }
    Err(refused(format!(
        "no voter can take over: {ids:?} did not answer within {RPC_TIMEOUT:?}"
    )))
}

/// Waits until this leader's own lease has run out, so it grants the
/// target's vote (at most `election_timeout_max` after it was elected).
async fn wait_own_lease(node: &Node) {
    let lease = Duration::from_millis(node.raft.config().election_timeout_max) + LEASE_MARGIN;
    let elected_at = node.raft.with_raft_state(|s| s.vote_last_modified()).await;
    if let Ok(Some(at)) = elected_at {
        tokio::time::sleep_until(at + lease).await;
    }
}

/// Heartbeats stay off while this lives.
struct Silence<'a>(&'a Node);

impl Drop for Silence<'_> {
    fn drop(&mut self) {
        self.0.raft.runtime_config().heartbeat(true);
    }
}

/// Stops heartbeats and waits until every follower's lease has run out, so
/// each grants the target's vote. Only heartbeats are left to send: the gate
/// holds proposals and read indexes.
async fn silence(node: &Node) -> Silence<'_> {
    node.raft.runtime_config().heartbeat(false);
    let silent = Silence(node);
    let lease = Duration::from_millis(node.raft.config().election_timeout_max);
    tokio::time::sleep(lease + SILENCE_MARGIN).await;
    silent
}

/// Waits up to `within` until `f` finds what it wants in this node's Raft metrics.
async fn metrics_until<T>(
    node: &Node,
    within: Duration,
    mut f: impl FnMut(&RaftMetrics<NodeId, BasicNode>) -> Option<T>,
) -> Option<T> {
    let mut metrics = node.raft.metrics();
    let wait = async {
        loop {
            if let Some(v) = f(&metrics.borrow_and_update()) {
                return Some(v);
            }
            metrics.changed().await.ok()?;
        }
    };
    timeout(within, wait).await.ok().flatten()
}

/// Whether this node leads, its last log index, and `target`'s matched index.
fn progress(m: &RaftMetrics<NodeId, BasicNode>, me: NodeId, target: NodeId) -> (bool, u64, u64) {
    let matched = m.replication.as_ref().and_then(|r| r.get(&target).copied());
    let matched = matched.flatten().map_or(0, |l| l.index);
    (
        m.current_leader == Some(me),
        m.last_log_index.unwrap_or(0),
        matched,
    )
}

/// Waits until `target` holds the leader's whole log; returns its last index.
async fn caught_up(node: &Node, target: NodeId) -> Result<u64, HandoverError> {
    let done = metrics_until(node, CATCH_UP_TIMEOUT, |m| {
        let (leading, last, matched) = progress(m, node.id, target);
        (!leading || matched >= last).then_some((leading, last))
    });
    match done.await {
        Some((true, last)) => Ok(last),
        Some((false, _)) => Err(HandoverError::NotLeader {
            leader: node.leader(),
        }),
        None => {
            let (_, last, matched) = progress(&node.raft.metrics().borrow(), node.id, target);
            Err(refused(format!(
                "node {target} has not caught up within {CATCH_UP_TIMEOUT:?}: it holds the log up to index {matched}, the leader's ends at {last}"
            )))
        }
    }
}

/// Waits until this node follows another leader; returns its id.
async fn new_leader(node: &Node, target: NodeId) -> Result<NodeId, HandoverError> {
    let other = |m: &RaftMetrics<NodeId, BasicNode>| m.current_leader.filter(|id| *id != node.id);
    metrics_until(node, ELECTED_TIMEOUT, other).await.ok_or_else(|| {
        let now = node.raft.metrics().borrow().current_leader;
        HandoverError::Incomplete(format!(
            "node {target} was asked to take over, but no new leader was seen within {ELECTED_TIMEOUT:?} (leader now: {now:?}); check `cluster status`"
        ))
    })
}

/// A graceful stop of the leader hands leadership to an up-to-date voter
/// first (bounded by `STOP_TIMEOUT`), so the cluster does not wait for an
/// election. Logs the outcome; stops anyway.
pub async fn before_stop(node: &Node) {
    if !node.is_leader() || node.voters().len() < 2 {
        return;
    }
    match timeout(STOP_TIMEOUT, transfer_leader(node, None)).await {
        Ok(Ok(h)) => tracing::info!(
            leader = h.leader,
            took_ms = h.took_ms,
            "stopping: handed leadership over"
        ),
        Ok(Err(e)) => tracing::warn!("stopping without a handover: {e}"),
        Err(_) => tracing::warn!("stopping without a handover: not done within {STOP_TIMEOUT:?}"),
    }
}
