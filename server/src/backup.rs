//! Backup and restore, on the leader.
//!
//! A backup is a fresh snapshot file (`store::snapfile`: format version,
//! meta, pairs, count and SHA-256 trailer): the leader builds one at or past
//! its applied index when asked and streams that file. A restore takes such
//! a file into a new cluster: the whole file is verified before anything is
//! written, then its scheduling state (jobs, runs, timers, active runs, job
//! history; not tokens, meta or the dedup table, which belong to the new
//! cluster) goes through the log as `RestorePairs` parts of at most
//! `PART_MAX_BYTES`, so every replica, and every later snapshot, holds it.
//! An offline restore ([`restore_offline`], `kairos restore`) applies the
//! same parts straight to the empty data directory of each node of a new
//! cluster before it starts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::core::{keys, limits, Command, Response};
use crate::node::{Node, ProposeError};
use crate::store::snapfile;

/// Bytes of pairs in one restore part (well under a log entry's cap).
const PART_MAX_BYTES: usize = limits::ENTRY_MAX_BYTES / 2;
/// Pairs in one restore part.
const PART_MAX_PAIRS: usize = 4096;
/// How long the leader may take to build the snapshot a backup streams.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("this node is not the leader")]
    NotLeader { leader: Option<(u64, String)> },
    /// The file or the cluster is not fit for this; the message says why.
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Failed(String),
}

fn leader_only(node: &Node) -> Result<(), BackupError> {
    if node.is_leader() {
        return Ok(());
    }
    Err(BackupError::NotLeader {
        leader: node.leader(),
    })
}

/// Builds a snapshot covering everything applied so far and returns its file.
pub async fn fresh_snapshot(node: &Node) -> Result<PathBuf, BackupError> {
    leader_only(node)?;
    let want = node.raft.metrics().borrow().last_applied.map(|l| l.index);
    node.raft
        .trigger()
        .snapshot()
        .await
        .map_err(|e| BackupError::Failed(format!("snapshot: {e}")))?;
    let mut metrics = node.raft.metrics();
    let built = tokio::time::timeout(
        SNAPSHOT_WAIT,
        metrics.wait_for(|m| m.snapshot.map(|l| l.index) >= want),
    )
    .await;
    match built {
        Ok(Ok(_)) => Ok(node.sm.snapshot_file()),
        Ok(Err(_)) => Err(BackupError::Failed("raft stopped".into())),
        Err(_) => Err(BackupError::Failed(format!(
            "no snapshot at index {want:?} within {SNAPSHOT_WAIT:?}"
        ))),
    }
}

/// What a restore wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    pub pairs: u64,
    pub backup_index: u64,
}

/// Restores the scheduling state of the snapshot file at `path` into this
/// cluster (which must hold no jobs, runs or timers).
pub async fn restore(node: &Node, path: &Path) -> Result<Restored, BackupError> {
    leader_only(node)?;
    let refused = |e: std::io::Error| BackupError::Refused(format!("backup file: {e}"));
    let backup_index = tokio::task::block_in_place(|| verified(path))?;
    let mut reader = snapfile::Reader::open(path).map_err(refused)?;
    let mut pairs = 0u64;
    let mut first = true;
    let mut part = next_part(&mut reader).map_err(refused)?;
    loop {
        let following = next_part(&mut reader).map_err(refused)?;
        let last = following.is_empty();
        pairs += part.len() as u64;
        propose_part(node, part, first, last).await?;
        if last {
            return Ok(Restored {
                pairs,
                backup_index,
            });
        }
        (part, first) = (following, false);
    }
}

/// The next pairs of restored key spaces, up to a part's size.
fn next_part(reader: &mut snapfile::Reader) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    tokio::task::block_in_place(|| read_part(reader))
}

fn read_part(reader: &mut snapfile::Reader) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let (mut part, mut bytes) = (Vec::new(), 0usize);
    while part.len() < PART_MAX_PAIRS && bytes < PART_MAX_BYTES {
        let Some((k, v)) = reader.next_pair()? else {
            break;
        };
        if k.first().is_some_and(|p| keys::RESTORED_SPACES.contains(p)) {
            bytes += k.len() + v.len();
            part.push((k, v));
        }
    }
    Ok(part)
}

/// Verifies a backup file whole (its format included) and returns its log index.
fn verified(path: &Path) -> Result<u64, BackupError> {
    let (_, meta) =
        snapfile::verify(path).map_err(|e| BackupError::Refused(format!("backup file: {e}")))?;
    Ok(meta.last_log_id.map_or(0, |l| l.index))
}

/// Offline restore: prepares the empty (or absent) `data_dir` of one node of
/// a new cluster from the backup at `from`, before any node runs. The same
/// parts a live restore commits are applied straight to the store, so the
/// checks are the same; the file is verified whole first, and a directory
/// that holds anything is refused, so a refusal writes nothing. Every node
/// of the new cluster is prepared from the same file and then started with
/// `kairos serve --peers ...` as a fresh cluster.
pub fn restore_offline(from: &Path, data_dir: &Path) -> Result<Restored, BackupError> {
    let backup_index = verified(from)?;
    if std::fs::read_dir(data_dir).is_ok_and(|mut d| d.next().is_some()) {
        return Err(BackupError::Refused(format!(
            "--data-dir {}: not empty; restore prepares a new node's directory",
            data_dir.display()
        )));
    }
    let existed = data_dir.exists();
    let res = load_offline(from, data_dir, backup_index);
    if res.is_err() {
        // Leave the directory as it was found: absent or empty.
        let _ = std::fs::remove_dir_all(data_dir);
        if existed {
            let _ = std::fs::create_dir_all(data_dir);
        }
    }
    res
}

fn load_offline(from: &Path, data_dir: &Path, backup_index: u64) -> Result<Restored, BackupError> {
    let failed =
        |e: &dyn std::fmt::Display| BackupError::Failed(format!("{}: {e}", data_dir.display()));
    let (_log, sm) =
        crate::store::open(data_dir, 64 << 20, Default::default()).map_err(|e| failed(&e))?;
    let refused = |e: std::io::Error| BackupError::Refused(format!("backup file: {e}"));
    let mut reader = snapfile::Reader::open(from).map_err(refused)?;
    let (mut pairs, mut first) = (0u64, true);
    let mut part = read_part(&mut reader).map_err(refused)?;
    loop {
        let following = read_part(&mut reader).map_err(refused)?;
        let last = following.is_empty();
        pairs += part.len() as u64;
        let cmd = Command::RestorePairs {
            pairs: part,
            first,
            last,
            now_ms: 0,
        };
        match sm.apply_offline(&cmd).map_err(|e| failed(&e))? {
            Response::Error(e) => return Err(BackupError::Refused(e.to_string())),
            _ if last => {
                return Ok(Restored {
                    pairs,
                    backup_index,
                })
            }
            _ => {}
        }
        (part, first) = (following, false);
    }
}

async fn propose_part(
    node: &Node,
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
    first: bool,
    last: bool,
) -> Result<(), BackupError> {
    let now_ms = node.clock.calibrated_now_ms().ok_or_else(|| {
        BackupError::Failed("the leader's clock is not calibrated yet; retry".into())
    })?;
    let cmd = Command::RestorePairs {
        pairs,
        first,
        last,
        now_ms,
    };
    match node.propose(cmd).await {
        Ok(Response::Error(e)) => Err(BackupError::Refused(e.to_string())),
        Ok(_) => Ok(()),
        Err(ProposeError::NotLeader { leader }) => Err(BackupError::NotLeader { leader }),
        Err(e) => Err(BackupError::Failed(format!(
            "restore part not committed ({e}); restore again into a new cluster"
        ))),
    }
}
