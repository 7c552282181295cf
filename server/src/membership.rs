//! Membership changes at runtime, on the leader: add a learner, promote it,
//! remove a node. openraft carries each through joint consensus; this module
//! decides whether a change is safe to start and says why not.
//!
//! Refused (the reason named): a change that would leave fewer than a quorum
//! of reachable voters, a change while another is in progress (the last
//! membership entry is not committed, or is a joint configuration), removing
//! the last voter, promoting a node that is not a learner. Removing the
//! leader's own node hands leadership over first (`handover`) and answers
//! with a redirect; the new leader removes it, without waiting for an election. A change holds the
//! handover gate shared, like a proposal, so a handover never races one.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers};

use crate::core::command::LOG_FORMAT_INITIAL;
use crate::handover::{self, HandoverError};
use crate::node::Node;
use crate::raft::NodeId;
use crate::upgrade;

/// How long a voter may take to answer before it counts as unreachable.
const REACH_TIMEOUT: Duration = Duration::from_millis(1500);

/// How often a leader looks for a joint configuration nobody is finishing.
const INTERRUPTED_CHECK: Duration = Duration::from_secs(1);

/// Why a change was not made.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    /// The change is unsafe or impossible now; the message says why.
    #[error("{0}")]
    Refused(String),
    #[error("this node is not the leader")]
    NotLeader { leader: Option<(NodeId, String)> },
    #[error("raft: {0}")]
    Raft(String),
}

/// Voters and learners after a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Members {
    pub voters: BTreeSet<NodeId>,
    pub learners: BTreeSet<NodeId>,
}

fn refused(msg: impl Into<String>) -> MembershipError {
    MembershipError::Refused(msg.into())
}

/// The current membership, refusing if a change is still in progress.
pub(crate) fn settled(node: &Node) -> Result<Members, MembershipError> {
    let m = node.raft.metrics().borrow().clone();
    if m.current_leader != Some(node.id) {
        return Err(MembershipError::NotLeader {
            leader: node.leader(),
        });
    }
    let stored = m.membership_config.clone();
    let membership = stored.membership();
    if membership.get_joint_config().len() > 1 {
        return Err(refused(
            "a membership change is in progress (joint configuration); retry when it completes",
        ));
    }
    let committed = m.last_applied.map(|l| l.index) >= stored.log_id().map(|l| l.index);
    if !committed {
        return Err(refused(
            "a membership change is in progress (not yet applied); retry when it completes",
        ));
    }
    Ok(members_now(node))
}

/// Voters of `set` that answer now (this node counts as reachable).
async fn reachable(node: &Node, set: &BTreeSet<NodeId>) -> BTreeSet<NodeId> {
    let members = node.members();
    let asks = set.iter().map(|id| {
        let addr = members
            .iter()
            .find(|(m, _)| m == id)
            .map(|(_, a)| a.clone());
        async move {
            if *id == node.id {
                return Some(*id);
            }
            let s = tokio::time::timeout(REACH_TIMEOUT, node.peer_status(*id, &addr?, false)).await;
            s.ok().flatten().map(|_| *id)
        }
    });
    futures::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Refuses unless a quorum of `voters` answers.
async fn require_quorum(
    node: &Node,
    voters: &BTreeSet<NodeId>,
    what: &str,
) -> Result<(), MembershipError> {
    let up = reachable(node, voters).await;
    let quorum = voters.len() / 2 + 1;
    if up.len() < quorum {
        let down: Vec<_> = voters.difference(&up).collect();
        return Err(refused(format!(
            "{what} would leave voters {voters:?} of which only {} answer (need {quorum}; unreachable: {down:?})",
            up.len()
        )));
    }
    Ok(())
}

fn raft_error(e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> MembershipError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => MembershipError::NotLeader {
            leader: f.leader_id.zip(f.leader_node.map(|n| n.addr)),
        },
        RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => refused(c.to_string()),
        other => MembershipError::Raft(other.to_string()),
    }
}

fn members_now(node: &Node) -> Members {
    let m = node.raft.metrics().borrow().membership_config.clone();
    Members {
        voters: m.membership().voter_ids().collect(),
        learners: m.membership().learner_ids().collect(),
    }
}

/// Adds node `id` at `peer_addr` as a learner: it starts receiving the log.
pub async fn add_learner(
    node: &Node,
    id: NodeId,
    peer_addr: &str,
) -> Result<Members, MembershipError> {
    if id == 0 {
        return Err(refused("id: must be at least 1"));
    }
    if peer_addr.is_empty() || !peer_addr.contains(':') {
        return Err(refused(format!(
            "peer_addr: expected HOST:PORT, got {peer_addr:?}"
        )));
    }
    let now = settled(node)?;
    if now.voters.contains(&id) {
        return Err(refused(format!("node {id} is already a voter")));
    }
    let known = node.members().into_iter().find(|(m, _)| *m == id);
    if let Some((_, addr)) = known {
        if addr == peer_addr {
            return Ok(now); // already a learner there: nothing to do (a resumed replace)
        }
        return Err(refused(format!(
            "node {id} is already a learner at {addr}; remove it first to move it"
        )));
    }
    let _serial = node.format_change.lock().await;
    let active = node.sm.log_format();
    if active > LOG_FORMAT_INITIAL {
        match upgrade::joining_reads(node, id, peer_addr).await {
            Some(reads) if reads >= active => {}
            Some(reads) => {
                return Err(refused(format!(
                    "node {id} reads log formats up to {reads}, but the cluster's active log \
                     format is {active}: start it with a release that reads format {active}"
                )))
            }
            None => {
                return Err(refused(format!(
                    "node {id} at {peer_addr} did not answer within {:?}, so whether it reads \
                     the cluster's active log format {active} is unknown; start it first",
                    upgrade::JOIN_PROBE_WAIT
                )))
            }
        }
    }
    let _open = node.handover_gate.read().await;
    node.raft
        .add_learner(id, BasicNode::new(peer_addr), false)
        .await
        .map_err(raft_error)?;
    Ok(members_now(node))
}

/// Makes learner `id` a voter.
pub async fn promote(node: &Node, id: NodeId) -> Result<Members, MembershipError> {
    let now = settled(node)?;
    if now.voters.contains(&id) {
        return Ok(now); // already done (a resumed replace)
    }
    if !now.learners.contains(&id) {
        return Err(refused(format!(
            "node {id} is not a learner; add it with add-learner first"
        )));
    }
    let mut after = now.voters.clone();
    after.insert(id);
    require_quorum(node, &after, &format!("promoting node {id}")).await?;
    let _open = node.handover_gate.read().await;
    node.raft
        .change_membership(ChangeMembers::AddVoterIds([id].into()), false)
        .await
        .map_err(raft_error)?;
    Ok(members_now(node))
}

/// Removes voter or learner `id` from the cluster.
pub async fn remove(node: &Node, id: NodeId) -> Result<Members, MembershipError> {
    let now = settled(node)?;
    if now.learners.contains(&id) {
        let _open = node.handover_gate.read().await;
        node.raft
            .change_membership(ChangeMembers::RemoveNodes([id].into()), false)
            .await
            .map_err(raft_error)?;
        return Ok(members_now(node));
    }
    if !now.voters.contains(&id) {
        return Err(refused(format!("node {id} is not a member")));
    }
    if now.voters.len() == 1 {
        return Err(refused(format!("node {id} is the last voter")));
    }
    let mut after = now.voters.clone();
    after.remove(&id);
    require_quorum(node, &after, &format!("removing node {id}")).await?;
    if id == node.id {
        // A redirect: the caller retries at the new leader, which removes
        // this node (and the caller talks to a member from then on).
        let h = handover::transfer_leader(node, None)
            .await
            .map_err(|e| match e {
                HandoverError::NotLeader { leader } => MembershipError::NotLeader { leader },
                e => refused(format!(
                    "removing the leader: handing leadership over first failed: {e}"
                )),
            })?;
        tracing::info!(leader = h.leader, "handed leadership over to be removed");
        return Err(MembershipError::NotLeader {
            leader: node.leader(),
        });
    }
    let _open = node.handover_gate.read().await;
    node.raft
        .change_membership(ChangeMembers::RemoveVoters([id].into()), false)
        .await
        .map_err(raft_error)?;
    Ok(members_now(node))
}

/// Finishes a membership change its leader did not live to finish.
///
/// openraft moves a change through a joint configuration in two log entries,
/// both proposed by the leader that took the request. If that leader dies
/// between them, the next leader inherits a committed joint configuration
/// that nothing drives on, and every later change would be refused as "in
/// progress". So the leader checks once per [`INTERRUPTED_CHECK`]: a
/// committed joint configuration seen at two checks in a row (a live change
/// finishes its second step within milliseconds) is moved to its target
/// voters.
pub async fn finish_interrupted(node: Arc<Node>) {
    let mut seen: Option<u64> = None;
    loop {
        tokio::time::sleep(INTERRUPTED_CHECK).await;
        let m = node.raft.metrics().borrow().clone();
        let stored = &m.membership_config;
        let joint = stored.membership().get_joint_config();
        let index = stored.log_id().map(|l| l.index);
        let committed = m.last_applied.map(|l| l.index) >= index;
        let stuck = m.current_leader == Some(node.id) && joint.len() > 1 && committed;
        let stuck = stuck && !crate::failpoint::on("leave-joint");
        if !stuck {
            seen = None;
            continue;
        }
        if seen != index {
            seen = index;
            continue;
        }
        let target = joint.last().cloned().unwrap_or_default();
        tracing::warn!(
            ?joint,
            ?target,
            "finishing a membership change interrupted by a leader change"
        );
        match node
            .raft
            .change_membership(ChangeMembers::ReplaceAllVoters(target), false)
            .await
        {
            Ok(_) => tracing::info!("interrupted membership change finished"),
            Err(e) => tracing::warn!("finishing the interrupted membership change: {e}"),
        }
        seen = None;
    }
}
