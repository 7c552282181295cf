//! Rolling upgrades: the cluster's *active* log format.
//!
//! A binary reads log formats up to `command::LOG_FORMAT`, but a leader
//! writes entries at the active format, which is replicated state
//! (`query::log_format`, absent = `LOG_FORMAT_INITIAL`). So while members of
//! an older release remain, a newer leader writes nothing they cannot read.
//! Each node reports the newest format it reads (peer `LogFormats`, and
//! `log_format_max` in `LocalStatus`); a node of a release before format 2
//! answers neither and reads format 1. Once every member, voters and learners,
//! reports a newer format, the leader proposes `ActivateLogFormat`, written
//! at that format; from its commit on, entries are written at it.
//! A command that needs a newer format than the active one is refused
//! (`FAILED_PRECONDITION`, naming both and what to upgrade).
//!
//! **Invariant:** the active format never exceeds what every member read
//! when it was raised, and never goes down. Activation and adding a learner
//! are serialised on the leader (`Node::format_change`), and a learner
//! that reads less than the active format is refused, so a member that joins
//! afterwards reads it too. Downgrading below an activated format is not
//! possible: the older binary refuses the newer entries and stops applying.

use std::sync::Arc;
use std::time::Duration;

use kairos_proto::peer::{Empty, LocalStatusResponse};

use crate::core::command::{LOG_FORMAT, LOG_FORMAT_INITIAL};
use crate::core::{Command, VersionedCommand};
use crate::membership;
use crate::node::Node;
use crate::raft::NodeId;

/// How often a leader whose cluster's active format is behind its binary's
/// asks the members which formats they read.
const CHECK: Duration = Duration::from_secs(1);
/// Bound on one member's answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The newest log format a node reads, from its status.
pub fn reads(s: &LocalStatusResponse) -> u32 {
    s.log_format_max.max(LOG_FORMAT_INITIAL)
}

/// The newest log format member `id` reads, asked now with the peer
/// `LogFormats` call (`None`: it did not answer). A node of a release
/// before that call answers UNIMPLEMENTED: it reads `LOG_FORMAT_INITIAL`.
pub(crate) async fn member_reads(node: &Node, id: NodeId, peer_addr: &str) -> Option<u32> {
    if id == node.id {
        return Some(LOG_FORMAT);
    }
    let mut req = tonic::Request::new(Empty {});
    req.set_timeout(PROBE_TIMEOUT);
    match node.peer_rpc(id, peer_addr)?.log_formats(req).await {
        Ok(r) => Some(r.into_inner().newest.max(LOG_FORMAT_INITIAL)),
        Err(s) if s.code() == tonic::Code::Unimplemented => Some(LOG_FORMAT_INITIAL),
        Err(_) => None,
    }
}

/// How long adding a learner waits for it to say which formats it reads:
/// it may have been started a moment ago.
pub(crate) const JOIN_PROBE_WAIT: Duration = Duration::from_secs(10);

/// The newest log format a node about to be added reads, asked until it
/// answers (at most [`JOIN_PROBE_WAIT`]); `None` if it never did.
pub(crate) async fn joining_reads(node: &Node, id: NodeId, peer_addr: &str) -> Option<u32> {
    let ask = async {
        loop {
            if let Some(reads) = member_reads(node, id, peer_addr).await {
                return reads;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::time::timeout(JOIN_PROBE_WAIT, ask).await.ok()
}

/// The newest format every member reads, or why it cannot be known now.
async fn every_member_reads(node: &Node) -> Result<u32, String> {
    membership::settled(node).map_err(|e| e.to_string())?;
    let members = node.members();
    let asks = members
        .iter()
        .map(|(id, addr)| async move { (*id, member_reads(node, *id, addr).await) });
    let mut least = LOG_FORMAT;
    for (id, reads) in futures::future::join_all(asks).await {
        let reads = reads.ok_or_else(|| format!("node {id} did not answer"))?;
        least = least.min(reads);
    }
    Ok(least)
}

/// On the leader, raises the active format to the newest every member
/// reads, checked every [`CHECK`] while it is behind this binary's.
pub async fn raise_active_format(node: Arc<Node>) {
    loop {
        tokio::time::sleep(CHECK).await;
        if node.is_leader() && node.sm.log_format() < LOG_FORMAT {
            if let Err(why) = raise_now(&node).await {
                tracing::debug!("the active log format stays for now: {why}");
            }
        }
    }
}

/// Raises the active format to the newest every member reads, now (a
/// client write that needs a newer format than the active one asks this
/// first, so a fresh cluster does not refuse it for the second before the
/// periodic check). Returns the active format after it.
pub(crate) async fn raise_now(node: &Node) -> Result<u32, String> {
    let _serial = node.format_change.lock().await;
    let active = node.sm.log_format();
    let format = every_member_reads(node).await?;
    if format <= active {
        return Ok(active);
    }
    let cmd = Command::ActivateLogFormat { format };
    let entry = VersionedCommand::at(&cmd, format).map_err(|e| e.to_string())?;
    node.propose_entry(entry)
        .await
        .map_err(|e| format!("activating log format {format} did not commit: {e}"))?;
    tracing::info!(
        from = active,
        to = format,
        "every member reads log format {format}: it is now the cluster's active format"
    );
    Ok(node.sm.log_format())
}
