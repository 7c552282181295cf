//! One Kairos node: opens storage, starts Raft, serves gRPC and HTTP, and
//! runs the leader's tasks while it leads. [`run`] takes a validated
//! [`Config`] and already bound listeners, so tests can start nodes on
//! port 0; the `kairos` binary is a thin clap wrapper around it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_proto::peer::{Empty, LocalStatusRequest, LocalStatusResponse};
use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::BasicNode;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;

use crate::admission::{self, Admission, Overloaded, Ticket};
use crate::clock::{Clock, ClusterClock, Sample, SystemClock};
use crate::core::command::{FormatTooNew, LOG_FORMAT_INITIAL};
use crate::core::{limits, Command, CommandError, FinishReport, Response, VersionedCommand};
use crate::leader::dispatch::{Dispatcher, Handed};
use crate::raft::network::{self, Dialer, PeerRpc};
use crate::raft::{LogId, NodeId, Raft};
use crate::store::{self, LogStore, StateMachine};
use crate::tls::NodeTls;

/// Validated node configuration.
#[derive(Clone)]
pub struct Config {
    pub id: NodeId,
    /// Address clients and workers use for this node's public gRPC port.
    pub advertise: String,
    pub data_dir: PathBuf,
    /// Peer (Raft) address of every voter of a fresh cluster, this node included.
    pub peers: BTreeMap<NodeId, String>,
    pub heartbeat_ms: u64,
    pub election_min_ms: u64,
    pub election_max_ms: u64,
    /// Build a snapshot after this many log entries, and no sooner than 4
    /// times the last build's duration after it (`raft::snapshots`) unless
    /// 10 times this many are waiting.
    pub snapshot_logs: u64,
    /// Log entries kept behind a snapshot for slow followers.
    pub keep_logs: u64,
    /// Bytes of sled's page cache (the storage engine's in-memory part).
    pub cache_bytes: u64,
    pub clock: Arc<dyn Clock>,
    /// TLS for both listeners and every dial; None = plain TCP.
    pub tls: Option<Arc<NodeTls>>,
    /// `--auth-token-file`: calls need a token, and this secret becomes the
    /// first admin of a cluster without tokens. None = development mode.
    pub auth_token: Option<String>,
    /// `--join`: public endpoints of an existing cluster. The node never
    /// bootstraps; it waits, empty, to be added (`cluster add-learner`).
    pub join: Vec<String>,
    /// Most ready attempts the leader queues in memory per worker group;
    /// the rest wait in the replicated active-runs table and are paged in.
    pub queue_max: usize,
    /// Applied state is written to sled at least this often (0: after each batch).
    pub flush_ms: u64,
    /// Events the watch ring keeps (`--watch-events`).
    pub watch_events: usize,
    /// When the leader refuses client writes (`RESOURCE_EXHAUSTED`).
    pub admission: admission::Bounds,
    /// Bytes the data directory's disk keeps free: below it the node
    /// refuses writes (`disk`), and it does not open its store.
    pub disk_reserve_bytes: u64,
}

impl Config {
    pub fn new(
        id: NodeId,
        advertise: String,
        data_dir: PathBuf,
        peers: BTreeMap<NodeId, String>,
    ) -> Self {
        Config {
            id,
            advertise,
            data_dir,
            peers,
            // openraft uses the heartbeat interval as the AppendEntries timeout,
            // so it must cover a large batch plus the follower's fsync under load.
            heartbeat_ms: 100,
            // A follower votes only once the leader lease (election_max) has
            // passed since the last heartbeat, so a failover takes
            // election_max + a random election timeout: 800–1000 ms here.
            election_min_ms: 300,
            election_max_ms: 500,
            snapshot_logs: 10_000,
            keep_logs: 1_000,
            cache_bytes: 1 << 30,
            clock: Arc::new(SystemClock),
            tls: None,
            auth_token: None,
            join: Vec::new(),
            queue_max: crate::leader::dispatch::QUEUE_MAX,
            flush_ms: store::sm::FLUSH_MS_DEFAULT,
            watch_events: crate::watch::RING_EVENTS_DEFAULT,
            admission: admission::Bounds::default(),
            disk_reserve_bytes: crate::disk::RESERVE_MB_DEFAULT << 20,
        }
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.id > 0, "id: must be at least 1");
        anyhow::ensure!(
            (1 << 20..=64 << 30).contains(&self.cache_bytes),
            "cache-mb: must be between 1 and 65536, got {}",
            self.cache_bytes >> 20
        );
        anyhow::ensure!(
            self.peers.contains_key(&self.id),
            "peers: must include this node's own id {} (e.g. --peers {}={})",
            self.id,
            self.id,
            self.advertise
        );
        anyhow::ensure!(
            self.peers.len() <= 9,
            "peers: at most 9 voters, got {}",
            self.peers.len()
        );
        anyhow::ensure!(
            self.heartbeat_ms * 2 < self.election_min_ms
                && self.election_min_ms < self.election_max_ms,
            "election timeouts: need heartbeat*2 < election_min < election_max"
        );
        anyhow::ensure!(self.snapshot_logs > 0, "snapshot_logs: must be at least 1");
        anyhow::ensure!(
            self.flush_ms <= store::sm::FLUSH_MS_MAX,
            "flush-ms: must be between 0 and {}, got {}",
            store::sm::FLUSH_MS_MAX,
            self.flush_ms
        );
        anyhow::ensure!(
            (crate::watch::RING_EVENTS_MIN..=crate::watch::RING_EVENTS_MAX)
                .contains(&self.watch_events),
            "watch-events: must be between {} and {}, got {}",
            crate::watch::RING_EVENTS_MIN,
            crate::watch::RING_EVENTS_MAX,
            self.watch_events
        );
        anyhow::ensure!(
            (1..=crate::leader::dispatch::QUEUE_MAX).contains(&self.queue_max),
            "queue-max: must be between 1 and {}, got {}",
            crate::leader::dispatch::QUEUE_MAX,
            self.queue_max
        );
        self.admission.validate().map_err(anyhow::Error::msg)?;
        Ok(())
    }

    fn raft_config(&self) -> anyhow::Result<openraft::Config> {
        let c = openraft::Config {
            cluster_name: "kairos".into(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.election_min_ms,
            election_timeout_max: self.election_max_ms,
            // `raft::snapshots::build_when_due` asks for each build.
            snapshot_policy: openraft::SnapshotPolicy::Never,
            max_in_snapshot_log_to_keep: self.keep_logs,
            max_payload_entries: MAX_PAYLOAD_ENTRIES,
            ..Default::default()
        };
        Ok(c.validate()?)
    }
}

/// Entries per AppendEntries (each at most `limits::ENTRY_MAX_BYTES`).
const MAX_PAYLOAD_ENTRIES: u64 = 64;

/// Why a proposal did not produce a response.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProposeError {
    #[error("this node is not the leader")]
    NotLeader { leader: Option<(NodeId, String)> },
    /// The outcome is unknown: it may still commit.
    #[error("proposal timed out; the outcome is unknown")]
    Timeout,
    #[error("raft: {0}")]
    Raft(String),
    /// Some member could not read the entry this command needs.
    #[error(transparent)]
    Format(#[from] FormatTooNew),
    /// Refused by admission control before it was proposed: nothing was written.
    #[error(transparent)]
    Overloaded(#[from] Overloaded),
    /// This node's disk is below its reserve (`disk`): nothing was written.
    #[error("{0}")]
    DiskFull(crate::disk::Low),
}

type FinishItem = (FinishReport, oneshot::Sender<Result<(), CommandError>>);
/// An admitted client command waiting for its batch.
struct ProposalItem {
    cmd: Command,
    /// Its encoded size.
    bytes: usize,
    /// When it was admitted, on the monotonic clock.
    queued_ms: i64,
    tx: oneshot::Sender<Result<Response, ProposeError>>,
    /// Holds the command's share of the admission load until it is answered.
    ticket: Ticket,
    claim: Arc<Claim>,
}

/// Taken once, by whichever comes first: the batcher putting the command
/// into a proposal (it may commit; its waiter waits for the outcome), or the
/// waiter withdrawing it after `max_wait_ms` (refused, never proposed).
#[derive(Default)]
struct Claim(std::sync::atomic::AtomicBool);

impl Claim {
    fn take(&self) -> bool {
        !self.0.swap(true, std::sync::atomic::Ordering::AcqRel)
    }
}
/// Reports per Finish proposal: applying one writes about three state keys,
/// in a sled batch that this node's Raft log appends wait behind.
const FINISH_PROPOSAL_REPORTS: usize = 1024;
const _: () = assert!(FINISH_PROPOSAL_REPORTS <= limits::FINISH_BATCH_MAX);
/// Client-command batches in flight at once; while they are, new commands
/// queue up and go out together in the next entry (group commit).
const PROPOSALS_IN_FLIGHT: usize = 4;
/// Shared entries in flight at once ([`combine_entries`]); what is proposed
/// meanwhile waits to go out together in the next. One had lower lateness
/// than two or four at 1,000 and 3,000 fires/s and the same saturated
/// fires/s (BENCHMARKS.md, eighteenth pass): openraft appends entries one
/// at a time whatever is in flight.
const ENTRIES_IN_FLIGHT: usize = 1;
/// Bound on proposals waiting for an entry (each caller has its own bound
/// on what it proposes at once; past this one they wait to queue).
const ENTRY_QUEUE: usize = 1024;

pub struct Node {
    pub id: NodeId,
    /// This node's public address.
    pub addr: String,
    /// Public addresses of the other members, learned over the peer channel
    /// (the membership holds peer addresses only).
    api_addrs: Mutex<HashMap<NodeId, String>>,
    pub raft: Raft,
    pub sm: StateMachine,
    pub log: LogStore,
    pub clock: Arc<ClusterClock>,
    pub dispatcher: Arc<Dispatcher>,
    assign_tx: mpsc::Sender<Handed>,
    finish_tx: mpsc::Sender<FinishItem>,
    proposal_tx: mpsc::Sender<ProposalItem>,
    entry_tx: mpsc::Sender<Shared>,
    pub admission: Arc<Admission>,
    /// The data directory's free space (`disk`): below the reserve, client
    /// writes and peers' Raft writes are refused.
    pub disk: crate::disk::Monitor,
    /// Cached channels: to peer listeners by (Some(id), addr), to public ones by (None, addr).
    channels: Mutex<HashMap<(Option<NodeId>, String), Channel>>,
    pub dialer: Dialer,
    /// Public calls need a token (`--auth-token-file`).
    pub auth_required: bool,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Held shared by everything that makes the leader send AppendEntries
    /// besides heartbeats (proposals, membership changes, read indexes);
    /// exclusively by a leadership handover, so no entry is appended (and no
    /// follower's lease renewed) while the next leader catches up and is
    /// elected (see `handover`).
    pub(crate) handover_gate: tokio::sync::RwLock<()>,
    /// Serialises raising the active log format with adding a learner, so
    /// no member joins between the check that every member reads a format
    /// and its activation (`upgrade`).
    pub(crate) format_change: tokio::sync::Mutex<()>,
}

const PROPOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on assignments and finishes waiting to be proposed.
const BATCH_QUEUE: usize = 65_536;

impl Node {
    /// Proposes `cmd` as an entry of the cluster's active log format (which
    /// every member reads); a command that needs a newer one is refused.
    /// Commands proposed meanwhile share its entry ([`combine_entries`]).
    pub async fn propose(&self, cmd: Command) -> Result<Response, ProposeError> {
        // Checked alone: in a shared entry it would refuse the others too.
        let (needs, active) = (cmd.min_format(), self.sm.log_format());
        if needs > active {
            return Err(FormatTooNew { needs, active }.into());
        }
        let bytes = crate::core::codec::encoded_len(&cmd);
        let (tx, rx) = oneshot::channel();
        let (cmds, whole) = match cmd {
            Command::Batch { commands } => (commands, true),
            cmd => (vec![cmd], false),
        };
        let stopping = || ProposeError::Raft("the node is stopping".into());
        let shared = Shared {
            cmds,
            whole,
            bytes,
            tx,
        };
        self.entry_tx.send(shared).await.map_err(|_| stopping())?;
        rx.await.map_err(|_| stopping())?
    }

    /// Proposes `cmd` as one entry of its own.
    async fn propose_alone(&self, cmd: Command) -> Result<Response, ProposeError> {
        let entry = VersionedCommand::at(&cmd, self.sm.log_format())?;
        self.propose_entry(entry).await
    }

    /// Proposes an entry as it is (`upgrade` raises the active format with
    /// an entry of the new one).
    pub(crate) async fn propose_entry(
        &self,
        entry: VersionedCommand,
    ) -> Result<Response, ProposeError> {
        let write = async {
            let _open = self.handover_gate.read().await;
            self.raft.client_write(entry).await
        };
        let res = tokio::time::timeout(PROPOSE_TIMEOUT, write).await;
        match res {
            Err(_) => Err(ProposeError::Timeout),
            Ok(Ok(r)) => Ok(r.data),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(ProposeError::NotLeader {
                    leader: f.leader_id.zip(f.leader_node.map(|n| n.addr)),
                })
            }
            Ok(Err(e)) => Err(ProposeError::Raft(e.to_string())),
        }
    }

    /// A read index (openraft's `ensure_linearizable`: AppendEntries to a
    /// quorum), behind the handover gate.
    pub async fn ensure_linearizable(
        &self,
    ) -> Result<Option<LogId>, RaftError<NodeId, CheckIsLeaderError<NodeId, BasicNode>>> {
        let _open = self.handover_gate.read().await;
        self.raft.ensure_linearizable().await
    }

    /// Confirms with a quorum that this node is still the leader, without
    /// waiting for apply (a backlog is not a lost quorum); held, like reads,
    /// while a handover is under way.
    pub async fn confirm_leadership(
        &self,
    ) -> Result<
        (Option<LogId>, Option<LogId>),
        RaftError<NodeId, CheckIsLeaderError<NodeId, BasicNode>>,
    > {
        let _open = self.handover_gate.read().await;
        self.raft.get_read_log_id().await
    }

    /// Proposes a client command, grouped with others that arrive meanwhile
    /// into one log entry, if admission control lets it in (else it is
    /// refused at once with [`ProposeError::Overloaded`]).
    pub async fn propose_grouped(&self, cmd: Command) -> Result<Response, ProposeError> {
        // Checked alone: in a batch it would refuse the others' commands too.
        // Every format reads a command of the first; only a newer one needs
        // the active format read from the state.
        let needs = cmd.min_format();
        if needs > LOG_FORMAT_INITIAL {
            let active = self.sm.log_format();
            if needs > active && self.is_leader() {
                let active = crate::upgrade::raise_now(self).await.unwrap_or(active);
                if needs > active {
                    return Err(FormatTooNew { needs, active }.into());
                }
            }
        }
        self.disk.check().map_err(ProposeError::DiskFull)?;
        let bytes = crate::core::codec::encoded_len(&cmd);
        let now_ms = self.clock.mono_ms();
        let ticket = (self.admission).admit(bytes, self.apply_progress().1, now_ms)?;
        let (tx, mut rx) = oneshot::channel();
        let claim = Arc::new(Claim::default());
        let item = ProposalItem {
            cmd,
            bytes,
            queued_ms: now_ms,
            tx,
            ticket,
            claim: claim.clone(),
        };
        // The queue holds as many commands as admission lets in flight.
        let busy = || ProposeError::Raft("proposal queue full; retry".into());
        self.proposal_tx.try_send(item).map_err(|_| busy())?;
        let wait = Duration::from_millis(self.admission.bounds.max_wait_ms);
        let res = match tokio::time::timeout(wait, &mut rx).await {
            Ok(res) => res,
            Err(_) if claim.take() => {
                let refused = self.admission.withdraw(now_ms, self.clock.mono_ms());
                return Err(refused.into());
            }
            Err(_) => rx.await,
        };
        let res = res.map_err(|_| ProposeError::Timeout)?;
        res.map_err(|e| self.with_public_hint(e))
    }

    /// openraft names the new leader by its membership (peer) address;
    /// clients need its public one, or no hint rather than a wrong one.
    fn with_public_hint(&self, e: ProposeError) -> ProposeError {
        match e {
            ProposeError::NotLeader { leader } => ProposeError::NotLeader {
                leader: leader.and_then(|(id, _)| Some((id, self.api_addr(id)?))),
            },
            other => other,
        }
    }

    /// This node's applied index, and the log entries it has appended and
    /// not yet applied.
    pub fn apply_progress(&self) -> (u64, u64) {
        let m = self.raft.metrics();
        let m = m.borrow();
        let applied = m.last_applied.map_or(0, |l| l.index);
        (
            applied,
            m.last_log_index.unwrap_or(0).saturating_sub(applied),
        )
    }

    /// The leader this node knows of, with its public address (None until
    /// that address has been learned).
    pub fn leader(&self) -> Option<(NodeId, String)> {
        let id = self.raft.metrics().borrow().current_leader?;
        Some((id, self.api_addr(id)?))
    }

    /// A member's public address, if known.
    pub fn api_addr(&self, id: NodeId) -> Option<String> {
        if id == self.id {
            return Some(self.addr.clone());
        }
        let map = self.api_addrs.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&id).cloned()
    }

    /// Records a member's public address as it reported it.
    pub fn learn_api_addr(&self, id: NodeId, addr: &str) {
        if id != self.id && !addr.is_empty() {
            let mut map = self.api_addrs.lock().unwrap_or_else(|e| e.into_inner());
            map.insert(id, addr.to_string());
        }
    }

    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().current_leader == Some(self.id)
    }

    /// Voters of the current membership with their peer addresses.
    /// Is the membership a joint configuration (a change between its steps)?
    pub fn membership_changing(&self) -> bool {
        let m = self.raft.metrics().borrow().membership_config.clone();
        m.membership().get_joint_config().len() > 1
    }

    pub fn voters(&self) -> Vec<(NodeId, String)> {
        let m = self.raft.metrics().borrow().membership_config.clone();
        let voters: BTreeSet<NodeId> = m.membership().voter_ids().collect();
        m.membership()
            .nodes()
            .filter(|(id, _)| voters.contains(id))
            .map(|(id, n)| (*id, n.addr.clone()))
            .collect()
    }

    /// On the leader: how many entries each other member is behind its last log entry.
    pub fn replication_lags(&self) -> BTreeMap<NodeId, u64> {
        let m = self.raft.metrics().borrow().clone();
        let last = m.last_log_index.unwrap_or(0);
        m.replication
            .map(|r| {
                r.into_iter()
                    .filter(|(id, _)| *id != self.id)
                    .map(|(id, matched)| (id, last.saturating_sub(matched.map_or(0, |l| l.index))))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// All members (voters and learners) with their peer addresses.
    pub fn members(&self) -> Vec<(NodeId, String)> {
        let m = self.raft.metrics().borrow().membership_config.clone();
        m.membership()
            .nodes()
            .map(|(id, n)| (*id, n.addr.clone()))
            .collect()
    }

    /// A cached, lazily connecting channel to another node's public listener.
    pub fn public_channel(&self, addr: &str) -> Option<Channel> {
        self.cached_channel(None, addr)
    }

    /// A peer-service client for node `id` at its peer address.
    pub fn peer_rpc(&self, id: NodeId, addr: &str) -> Option<PeerRpc> {
        let ch = self.cached_channel(Some(id), addr)?;
        Some(self.dialer.peer_client(ch))
    }

    fn cached_channel(&self, peer: Option<NodeId>, addr: &str) -> Option<Channel> {
        let mut map = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        let key = (peer, addr.to_string());
        if let Some(c) = map.get(&key) {
            return Some(c.clone());
        }
        let c = match peer {
            Some(id) => self.dialer.peer_channel(id, addr),
            None => self.dialer.public_channel(addr),
        };
        let c = c.ok()?;
        map.insert(key, c.clone());
        Some(c)
    }

    /// A member's own status, asked over its peer address; its state digest
    /// only with `digest` (costly: see [`crate::grpc::peer::local_status`]).
    pub async fn peer_status(
        &self,
        id: NodeId,
        peer_addr: &str,
        digest: bool,
    ) -> Option<LocalStatusResponse> {
        let mut req = tonic::Request::new(LocalStatusRequest {
            skip_digest: !digest,
        });
        req.set_timeout(Duration::from_secs(2));
        let mut client = self.peer_rpc(id, peer_addr)?;
        let s = client.local_status(req).await.ok()?.into_inner();
        Some(s)
    }

    /// One round-trip clock probe: the peer's wall clock and the midpoint of
    /// the round trip on our monotonic clock.
    pub async fn probe_clock(&self, id: NodeId, addr: &str) -> Option<Sample> {
        let mut client = self.peer_rpc(id, addr)?;
        let mut req = tonic::Request::new(Empty {});
        req.set_timeout(Duration::from_millis(500));
        let sent = self.clock.mono_ms();
        let peer_ms = client.clock_probe(req).await.ok()?.into_inner().now_ms;
        let mono_mid_ms = sent + (self.clock.mono_ms() - sent) / 2;
        Some(Sample {
            peer: id,
            peer_ms,
            mono_mid_ms,
        })
    }

    /// Hands queued attempts to workers and records the handovers through the log.
    pub fn dispatch_now(&self) {
        for h in self.dispatcher.dispatch(self.clock.now_ms()) {
            if self.assign_tx.try_send(h).is_err() {
                tracing::warn!("assignment record queue full; the attempt stays pending in state");
            }
        }
    }

    /// Proposes a worker's finish (batched with others) and waits for the commit.
    pub async fn finish(&self, report: FinishReport) -> Result<(), CommandError> {
        let (tx, rx) = oneshot::channel();
        let busy = || {
            CommandError::FailedPrecondition(
                "finish not committed (leader busy or changing); retry".into(),
            )
        };
        self.finish_tx.try_send((report, tx)).map_err(|_| busy())?;
        rx.await.map_err(|_| busy())?
    }
}

/// Drains what is queued after the first item, so one log entry carries many.
/// Takes the next batch: up to `max` commands and `limits::ENTRY_MAX_BYTES`
/// of the items' `cost` (commands, bytes). An item that would overflow
/// either waits in `carry` for the next batch; a batch always has one item.
async fn next_batch<T>(
    rx: &mut mpsc::Receiver<T>,
    carry: &mut Option<T>,
    max: usize,
    cost: impl Fn(&T) -> (usize, usize),
) -> Option<Vec<T>> {
    let first = match carry.take() {
        Some(x) => x,
        None => rx.recv().await?,
    };
    let (mut n, mut bytes) = cost(&first);
    let mut batch = vec![first];
    while n < max {
        let Ok(x) = rx.try_recv() else { break };
        let (more, more_bytes) = cost(&x);
        n = n.saturating_add(more);
        bytes = bytes.saturating_add(more_bytes);
        if n > max || bytes > limits::ENTRY_MAX_BYTES {
            *carry = Some(x);
            break;
        }
        batch.push(x);
    }
    Some(batch)
}

/// What a finish report adds to a log entry: one report, and its bytes (its
/// strings and result, plus the fixed fields).
fn finish_cost(item: &FinishItem) -> (usize, usize) {
    let r = &item.0;
    (
        1,
        r.result.len() + r.error.len() + r.worker.len() + r.run.job.len() + 64,
    )
}

async fn record_assignments(node: Arc<Node>, mut rx: mpsc::Receiver<Handed>) {
    let mut carry = None;
    let size = |h: &Handed| (1, h.run.job.len() + h.worker.len() + 32);
    while let Some(batch) = next_batch(&mut rx, &mut carry, limits::FINISH_BATCH_MAX, size).await {
        for h in &batch {
            node.metrics.dispatched(h.waited);
            crate::runlog::dispatched(&h.run, h.attempt, &h.group, &h.worker, h.waited.as_millis());
        }
        let assignments = batch
            .into_iter()
            .map(|h| (h.run, h.attempt, h.worker))
            .collect();
        // Only a calibrated leader hands out attempts; one that lost its
        // term meanwhile leaves them unrecorded (the worker claims them).
        let Some(now_ms) = node.clock.calibrated_now_ms() else {
            tracing::debug!("assignment record dropped: clock not calibrated");
            continue;
        };
        let cmd = Command::Assign {
            now_ms,
            assignments,
        };
        if let Err(e) = node.propose(cmd).await {
            tracing::debug!("assignment record not committed: {e}");
        }
    }
}

/// Drains `rx` in batches (as [`next_batch`] takes them) with at most
/// `in_flight` batches being handled at once, so items arriving meanwhile
/// share the next batch (one log entry) instead of each waiting for their own.
async fn in_batches<T, Fut>(
    mut rx: mpsc::Receiver<T>,
    (in_flight, max): (usize, usize),
    cost: impl Fn(&T) -> (usize, usize),
    mut handle: impl FnMut(Vec<T>) -> Fut,
) where
    Fut: Future<Output = ()> + Send + 'static,
{
    let permits = Arc::new(tokio::sync::Semaphore::new(in_flight));
    let mut carry = None;
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let Some(batch) = next_batch(&mut rx, &mut carry, max, &cost).await else {
            return;
        };
        let work = handle(batch);
        tokio::spawn(async move {
            work.await;
            drop(permit);
        });
    }
}

async fn commit_finishes(node: Arc<Node>, rx: mpsc::Receiver<FinishItem>) {
    use rand::Rng;
    let (caps, cost) = ((PROPOSALS_IN_FLIGHT, FINISH_PROPOSAL_REPORTS), finish_cost);
    in_batches(rx, caps, cost, |batch| {
        let (mut reports, waiters): (Vec<FinishReport>, Vec<_>) = batch.into_iter().unzip();
        let mut rng = rand::thread_rng();
        for r in &mut reports {
            r.jitter_ms = rng.gen_range(0..10_000);
        }
        let node = node.clone();
        // Each waiter gets its own report's result.
        async move {
            let res = match node.clock.calibrated_now_ms() {
                Some(now_ms) => node.propose(Command::Finish { now_ms, reports }).await,
                None => Err(ProposeError::Raft(
                    "the leader's clock is not calibrated yet".into(),
                )),
            };
            let results = match res {
                Ok(Response::Batch(results)) => results.into_iter().map(Some).collect(),
                Ok(other) => vec![Some(Err(CommandError::FailedPrecondition(format!(
                    "unexpected {other:?}"
                ))))],
                Err(e) => vec![Some(Err(CommandError::FailedPrecondition(format!(
                    "finish not committed: {e}"
                ))))],
            };
            let fallback = results.first().cloned().flatten();
            for (i, w) in waiters.into_iter().enumerate() {
                let r = results
                    .get(i)
                    .cloned()
                    .flatten()
                    .or_else(|| fallback.clone())
                    .unwrap_or(Ok(()));
                let _ = w.send(r);
            }
        }
    })
    .await
}

/// Feeds admission control this node's apply progress (`admission::Drain`).
async fn sample_apply(node: Arc<Node>) {
    let every = Duration::from_millis(admission::DRAIN_SAMPLE_MS);
    loop {
        tokio::time::sleep(every).await;
        let (applied, backlog) = node.apply_progress();
        (node.admission).observe_apply(node.clock.mono_ms(), applied, backlog);
    }
}

/// How often the runtime lag probe asks to be woken.
const LAG_PROBE_MS: u64 = 10;
/// A lag at least this long is logged (a warning each): every Raft message
/// and answer of this node waited as long.
const LAG_WARN_MS: u64 = 250;

/// Measures how late the async runtime wakes a task that is due
/// (`kairos_runtime_lag_seconds`): while every worker is busy with other
/// tasks, or the process is not scheduled, nothing due runs, Raft's
/// heartbeats and replies included. A wake-up late by [`LAG_WARN_MS`] or
/// more is also logged, so a stall can be told from a slow peer or disk.
/// Reads the data directory's free space every second (`disk`). While it
/// is below the reserve this node starts and joins no election, and a
/// leader hands its leadership to another voter (again each second until
/// one takes it, if none could at first).
async fn watch_disk(node: Arc<Node>) {
    loop {
        match node.disk.poll() {
            Ok((free, changed)) => {
                node.metrics.set_disk_free(free, node.disk.reserve());
                match changed {
                    Some(true) => {
                        let low = node.disk.check().err();
                        tracing::error!(
                            "{}; this node takes no elections and no entries until then",
                            low.map(|l| l.to_string()).unwrap_or_default()
                        );
                        node.raft.runtime_config().elect(false);
                    }
                    Some(false) => {
                        tracing::info!(free, "disk space is back above the reserve; resuming");
                        node.raft.runtime_config().elect(true);
                    }
                    None => {}
                }
                if node.disk.is_low() && node.is_leader() {
                    match crate::handover::transfer_leader(&node, None).await {
                        Ok(h) => tracing::warn!(to = h.leader, "disk full: handed leadership over"),
                        Err(e) => tracing::warn!("disk full: could not hand leadership over: {e}"),
                    }
                }
            }
            Err(e) => {
                tracing::warn!(dir = %node.disk.dir().display(), "reading free disk space: {e}")
            }
        }
        tokio::time::sleep(crate::disk::POLL).await;
    }
}

async fn probe_runtime_lag(node: Arc<Node>) {
    loop {
        let asked_ms = node.clock.mono_ms();
        tokio::time::sleep(Duration::from_millis(LAG_PROBE_MS)).await;
        let late_ms = (node.clock.mono_ms() - asked_ms - LAG_PROBE_MS as i64).max(0) as u64;
        node.metrics.runtime_lagged(Duration::from_millis(late_ms));
        if late_ms >= LAG_WARN_MS {
            tracing::warn!(
                late_ms,
                "the async runtime ran no due task for this long (every worker busy, \
                 or the process not scheduled)"
            );
        }
    }
}

async fn group_proposals(node: Arc<Node>, rx: mpsc::Receiver<ProposalItem>) {
    let cost = |item: &ProposalItem| (1, item.bytes);
    let caps = (PROPOSALS_IN_FLIGHT, limits::PROPOSAL_BATCH_MAX);
    in_batches(rx, caps, cost, |batch| {
        // Commands that waited past the bound, or would now queue behind
        // too long a backlog, are refused, unproposed.
        let (now_ms, (_, backlog)) = (node.clock.mono_ms(), node.apply_progress());
        let mut fresh = Vec::with_capacity(batch.len());
        for item in batch.into_iter().filter(|i| i.claim.take()) {
            match node.admission.recheck(item.queued_ms, backlog, now_ms) {
                Ok(()) => fresh.push(item),
                Err(e) => drop(item.tx.send(Err(e.into()))),
            }
        }
        let node = node.clone();
        async move { propose_batch(&node, fresh).await }
    })
    .await
}

/// A proposal waiting for a log entry ([`combine_entries`]).
struct Shared {
    /// Its commands: one, or those of a client `Batch`.
    cmds: Vec<Command>,
    /// Whether it was a `Batch` (answered with its responses as one `Many`).
    whole: bool,
    /// Its encoded size.
    bytes: usize,
    tx: oneshot::Sender<Result<Response, ProposeError>>,
}

/// Group commit for everything this node proposes. The proposals queued
/// while an entry is in flight (fires, assignment records, finishes, expiries,
/// client batches) go out together as one `Batch` entry, each command
/// applied as if alone, as every release has applied a `Batch`. openraft
/// 0.9 appends and fsyncs entries one at a time, each before it is sent to
/// the followers: a fire behind four entries waited for the leader's fsync
/// of each of them, then its own, then a follower's. A proposal alone is
/// proposed as it is, so a quiet node's log is unchanged.
async fn combine_entries(node: Arc<Node>, rx: mpsc::Receiver<Shared>) {
    let caps = (ENTRIES_IN_FLIGHT, limits::PROPOSAL_BATCH_MAX);
    let cost = |s: &Shared| (s.cmds.len().max(1), s.bytes);
    in_batches(rx, caps, cost, |group| {
        let node = node.clone();
        async move { propose_shared(&node, group).await }
    })
    .await
}

async fn propose_shared(node: &Node, mut group: Vec<Shared>) {
    if group.len() == 1 {
        let Some(one) = group.pop() else { return };
        let mut cmds = one.cmds;
        let cmd = match (one.whole, cmds.pop()) {
            (false, Some(cmd)) if cmds.is_empty() => cmd,
            (_, last) => {
                cmds.extend(last);
                Command::Batch { commands: cmds }
            }
        };
        let _ = one.tx.send(node.propose_alone(cmd).await);
        return;
    }
    let mut commands = Vec::new();
    let mut waiters = Vec::with_capacity(group.len());
    for s in group {
        waiters.push((s.tx, s.whole, s.cmds.len()));
        commands.extend(s.cmds);
    }
    node.metrics.entry_shared(waiters.len());
    let res = node.propose_alone(Command::Batch { commands }).await;
    let shapes: Vec<(bool, usize)> = waiters.iter().map(|(_, w, n)| (*w, *n)).collect();
    for ((tx, _, _), r) in waiters.into_iter().zip(split_shared(&shapes, res)) {
        let _ = tx.send(r);
    }
}

/// Each proposal's answer from a shared entry's, in order: the responses of
/// its commands, one (`whole` false) or all as one `Many`. An entry that
/// failed, or answered otherwise than with a response per command (a refused
/// `Batch`), gives every proposal that answer.
fn split_shared(
    shapes: &[(bool, usize)],
    res: Result<Response, ProposeError>,
) -> Vec<Result<Response, ProposeError>> {
    let total: usize = shapes.iter().map(|(_, n)| n).sum();
    let mut rs = match res {
        Ok(Response::Many(rs)) if rs.len() == total => rs.into_iter(),
        Ok(other) => {
            let e = ProposeError::Raft(format!("shared entry answered {other:?}"));
            return shapes.iter().map(|_| Err(e.clone())).collect();
        }
        Err(e) => return shapes.iter().map(|_| Err(e.clone())).collect(),
    };
    (shapes.iter())
        .map(|&(whole, n)| {
            let mut mine: Vec<Response> = rs.by_ref().take(n).collect();
            match (whole, mine.len()) {
                (false, 1) => Ok(mine.remove(0)),
                _ => Ok(Response::Many(mine)),
            }
        })
        .collect()
}

/// Proposes a batch (one command alone, else a `Batch` entry), answers each
/// waiter, and tells admission control how long the proposal took.
async fn propose_batch(node: &Node, mut batch: Vec<ProposalItem>) {
    let (n, started_ms) = (batch.len(), node.clock.mono_ms());
    let took = || (node.clock.mono_ms() - started_ms).max(0) as u64;
    // Counted in the write age until every waiter has its answer.
    let _in_log = node.admission.proposing(started_ms);
    if n <= 1 {
        if let Some(item) = batch.pop() {
            let res = node.propose(item.cmd).await;
            node.admission.completed(took(), n);
            let _ = item.tx.send(res);
        }
        return;
    }
    let (commands, waiters): (Vec<Command>, Vec<_>) =
        batch.into_iter().map(|i| (i.cmd, (i.tx, i.ticket))).unzip();
    let res = node.propose(Command::Batch { commands }).await;
    node.admission.completed(took(), n);
    match res {
        Ok(Response::Many(rs)) if rs.len() == n => {
            for ((tx, _ticket), r) in waiters.into_iter().zip(rs) {
                let _ = tx.send(Ok(r));
            }
        }
        Ok(other) => {
            let e = ProposeError::Raft(format!("batch answered {other:?}"));
            waiters
                .into_iter()
                .for_each(|(tx, _ticket)| drop(tx.send(Err(e.clone()))));
        }
        Err(e) => waiters
            .into_iter()
            .for_each(|(tx, _ticket)| drop(tx.send(Err(e.clone())))),
    }
}

/// Bootstraps a fresh cluster: the lowest id initializes once every peer answers.
async fn bootstrap(node: Arc<Node>, peers: BTreeMap<NodeId, String>) {
    if node.raft.is_initialized().await.unwrap_or(true) || peers.keys().next() != Some(&node.id) {
        return;
    }
    // Fresh nodes hold the same state: nothing, or one backup restored into
    // each (`kairos restore`), which no log carries to the others.
    let (_, ours) = node.sm.digest().await;
    let mut warned = std::collections::BTreeSet::new();
    loop {
        let mut all = true;
        for (id, addr) in peers.iter().filter(|(id, _)| **id != node.id) {
            let Some(mut client) = node.peer_rpc(*id, addr) else {
                return;
            };
            let mut req = tonic::Request::new(LocalStatusRequest::default());
            req.set_timeout(Duration::from_millis(500));
            match client.local_status(req).await {
                Ok(s) if s.get_ref().term > 0 => {
                    tracing::info!(
                        peer = id,
                        "peer already belongs to a cluster; not bootstrapping"
                    );
                    return;
                }
                // Its first digest is still hashing (a large restored
                // state): not a difference, ask again.
                Ok(s) if s.get_ref().state_digest.is_empty() => all = false,
                Ok(s) if s.get_ref().state_digest != ours => {
                    all = false;
                    if !warned.insert(*id) {
                        continue;
                    }
                    tracing::error!(
                        peer = id,
                        peer_digest = %s.get_ref().state_digest,
                        our_digest = %ours,
                        "not bootstrapping: this fresh node and peer {id} hold different state; \
                         prepare every node from the same backup (kairos restore) or start all empty"
                    );
                }
                Ok(_) => {}
                Err(_) => all = false,
            }
        }
        if all {
            let members: BTreeMap<NodeId, BasicNode> = peers
                .iter()
                .map(|(id, a)| (*id, BasicNode { addr: a.clone() }))
                .collect();
            match node.raft.initialize(members).await {
                Ok(()) => tracing::info!("cluster bootstrapped with {} voters", peers.len()),
                Err(e) => tracing::info!("bootstrap skipped: {e}"),
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// On a cluster without tokens, the leader makes the `--auth-token-file`
/// secret its first admin (apply takes it only while no token exists).
async fn bootstrap_admin(node: Arc<Node>, hash: String) {
    loop {
        if !node.sm.list_tokens().is_empty() {
            return;
        }
        if node.is_leader() {
            let token = crate::core::Token {
                name: "admin".into(),
                role: crate::core::Role::Admin,
                groups: vec![],
                hash: hash.clone(),
                created_at_ms: 0,
            };
            let Some(now_ms) = node.clock.calibrated_now_ms() else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            match node
                .propose(Command::PutToken {
                    token,
                    first: true,
                    now_ms,
                })
                .await
            {
                Ok(Response::Token(_)) => {
                    tracing::info!(
                        "the --auth-token-file token is the first admin (name \"admin\")"
                    );
                    return;
                }
                Ok(_) => return, // another node's bootstrap won; tokens exist now
                Err(e) => tracing::debug!("first admin not committed yet: {e}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How often members' public addresses are asked for (each unknown one every
/// tick; all of them every `API_ADDR_REFRESH_TICKS`).
const API_ADDR_TICK: Duration = Duration::from_secs(1);
const API_ADDR_REFRESH_TICKS: u32 = 30;

/// Learns the other members' public addresses over the peer channel, and
/// says loudly (at every refresh) when a member runs other tzdata: cron fire
/// times are decided in apply, so replicas with different tzdata may diverge.
async fn learn_api_addrs(node: Arc<Node>) {
    let mut tick = 0u32;
    loop {
        let refresh = tick.is_multiple_of(API_ADDR_REFRESH_TICKS);
        tick = tick.wrapping_add(1);
        let wanted: Vec<(NodeId, String)> = node
            .members()
            .into_iter()
            .filter(|(id, _)| *id != node.id && (refresh || node.api_addr(*id).is_none()))
            .collect();
        let asks = wanted.iter().map(|(id, peer)| {
            let node = node.clone();
            async move {
                if let Some(s) = node.peer_status(*id, peer, false).await {
                    node.learn_api_addr(*id, &s.api_addr);
                    let ours = crate::core::schedule::TZDATA_VERSION;
                    if !s.tzdata.is_empty() && s.tzdata != ours {
                        tracing::error!(
                            peer = id,
                            peer_tzdata = %s.tzdata,
                            our_tzdata = ours,
                            "a member runs different tzdata: cron fire times may diverge; run the same build on every node"
                        );
                    }
                }
            }
        });
        futures::future::join_all(asks).await;
        tokio::time::sleep(API_ADDR_TICK).await;
    }
}

/// Runs a node until `shutdown` resolves. `grpc` is the public port, `peer`
/// the peer (Raft) port.
pub async fn run(
    config: Config,
    grpc: TcpListener,
    peer: TcpListener,
    http: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    config.validate()?;
    tracing::info!(id = config.id, data_dir = %config.data_dir.display(), "opening the store");
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let sm_opts = store::sm::Options {
        metrics: metrics.clone(),
        flush_ms: config.flush_ms,
        watch_events: config.watch_events,
        ..Default::default()
    };
    // A node restarted by a full disk (`disk`) waits here, not in a loop of crashes.
    std::fs::create_dir_all(&config.data_dir)?;
    let (dir, reserve) = (config.data_dir.clone(), config.disk_reserve_bytes);
    tokio::task::spawn_blocking(move || crate::disk::wait_for_space(&dir, reserve)).await??;
    let (log, sm) = store::open(&config.data_dir, config.cache_bytes, sm_opts)?;
    let raft_config = Arc::new(config.raft_config()?);
    let dialer = Dialer {
        self_id: config.id,
        tls: config.tls.clone(),
    };
    let raft = Raft::new(
        config.id,
        raft_config,
        network::Network::new(dialer.clone()),
        log.clone(),
        sm.clone(),
    )
    .await?;
    tracing::info!("store open, raft started");
    let (assign_tx, assign_rx) = mpsc::channel(BATCH_QUEUE);
    let (finish_tx, finish_rx) = mpsc::channel(BATCH_QUEUE);
    let (proposal_tx, proposal_rx) = mpsc::channel(config.admission.max_commands);
    let (entry_tx, entry_rx) = mpsc::channel(ENTRY_QUEUE);
    let node = Arc::new(Node {
        id: config.id,
        addr: config.advertise.clone(),
        raft,
        sm,
        log,
        clock: Arc::new(ClusterClock::new(config.clock.clone())),
        dispatcher: Arc::new(Dispatcher::with_queue_max(config.queue_max)),
        api_addrs: Mutex::new(HashMap::new()),
        assign_tx,
        finish_tx,
        proposal_tx,
        entry_tx,
        admission: Admission::new(config.admission, config.clock.mono_ms()),
        disk: crate::disk::Monitor::new(config.data_dir.clone(), config.disk_reserve_bytes),
        channels: Mutex::new(HashMap::new()),
        dialer,
        auth_required: config.auth_token.is_some(),
        metrics,
        handover_gate: tokio::sync::RwLock::new(()),
        format_change: tokio::sync::Mutex::new(()),
    });
    let mut tasks = vec![
        tokio::spawn(record_assignments(node.clone(), assign_rx)),
        tokio::spawn(commit_finishes(node.clone(), finish_rx)),
        tokio::spawn(group_proposals(node.clone(), proposal_rx)),
        tokio::spawn(combine_entries(node.clone(), entry_rx)),
        tokio::spawn(sample_apply(node.clone())),
        tokio::spawn(probe_runtime_lag(node.clone())),
        tokio::spawn(watch_disk(node.clone())),
        tokio::spawn(crate::leader::supervise(node.clone())),
        tokio::spawn(learn_api_addrs(node.clone())),
        tokio::spawn(crate::membership::finish_interrupted(node.clone())),
        tokio::spawn(crate::upgrade::raise_active_format(node.clone())),
        tokio::spawn(node.sm.clone().run_flusher()),
        tokio::spawn(crate::raft::snapshots::build_when_due(
            node.raft.clone(),
            node.sm.clone(),
            config.snapshot_logs,
        )),
    ];
    if config.join.is_empty() {
        tasks.push(tokio::spawn(bootstrap(node.clone(), config.peers.clone())));
    } else if !node.raft.is_initialized().await.unwrap_or(false) {
        let peer = config.peers.get(&node.id).cloned().unwrap_or_default();
        tracing::info!(
            "joining: waiting to be added; run `kairosctl --endpoints {} cluster add-learner {} {peer}` (or `cluster replace OLD {} {peer}`)",
            config.join.join(","),
            node.id,
            node.id
        );
    }
    if let Some(secret) = &config.auth_token {
        let hash = crate::grpc::auth::hash_secret(secret);
        tasks.push(tokio::spawn(bootstrap_admin(node.clone(), hash)));
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopping = node.clone();
    tokio::spawn(async move {
        shutdown.await;
        // Still serving: the next leader needs this node's votes and log.
        crate::handover::before_stop(&stopping).await;
        // Watch streams never end by themselves; the server waits for them.
        stopping.sm.watch().close();
        let _ = stop_tx.send(true);
    });
    let http_task = http.map(|l| {
        tokio::spawn(crate::http::serve(
            node.clone(),
            l,
            wait_stop(stop_rx.clone()),
        ))
    });
    let peer_addr = peer.local_addr()?;
    let tls = config.tls.clone();
    tracing::info!(id = node.id, addr = %node.addr, peer = %peer_addr, tls = tls.is_some(), "node started");
    tokio::try_join!(
        crate::grpc::serve_peer(node.clone(), peer, tls.clone(), wait_stop(stop_rx.clone())),
        crate::grpc::serve_public(node.clone(), grpc, tls, wait_stop(stop_rx)),
    )?;
    for t in tasks {
        t.abort();
    }
    if let Some(t) = http_task {
        t.abort();
    }
    node.raft
        .shutdown()
        .await
        .map_err(|e| anyhow::anyhow!("raft shutdown: {e}"))?;
    // Not needed for safety (the log is applied again after a restart),
    // but a clean stop restarts without replaying the last window.
    node.sm
        .flush()
        .await
        .map_err(|e| anyhow::anyhow!("flushing applied state: {e}"))?;
    Ok(())
}

async fn wait_stop(mut rx: tokio::sync::watch::Receiver<bool>) {
    while !*rx.borrow() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The peer message cap must hold a full AppendEntries of maximal entries.
    const _: () = assert!(
        MAX_PAYLOAD_ENTRIES as usize * limits::ENTRY_MAX_BYTES
            < crate::core::codec::DECODE_LIMIT_BYTES
    );

    #[tokio::test]
    async fn batches_are_cut_by_bytes_and_the_overflowing_item_leads_the_next() {
        let (tx, mut rx) = mpsc::channel(16);
        let mb = limits::ENTRY_MAX_BYTES;
        for size in [mb / 2, mb / 2, 1, mb * 2, 7] {
            tx.send(size).await.unwrap();
        }
        drop(tx);
        let mut carry = None;
        let mut batches = Vec::new();
        while let Some(b) = next_batch(&mut rx, &mut carry, 100, |x: &usize| (1, *x)).await {
            batches.push(b);
        }
        // An item larger than the cap still goes, alone.
        assert_eq!(
            batches,
            vec![vec![mb / 2, mb / 2], vec![1], vec![mb * 2], vec![7]]
        );
    }

    #[test]
    fn a_shared_entry_answers_each_proposal_with_its_own_responses() {
        use crate::core::CommandError;
        let refused = Response::Error(CommandError::Invalid("id: empty".into()));
        let fired = Response::Fired {
            runs: 3,
            skipped_keys: 1,
        };
        // A fire, a client batch of two (one refused), a delete, an empty batch.
        let shapes = [(false, 1), (true, 2), (false, 1), (true, 0)];
        let entry = Response::Many(vec![
            fired.clone(),
            Response::Deleted(true),
            refused.clone(),
            Response::Deleted(false),
        ]);
        let got: Vec<Response> = split_shared(&shapes, Ok(entry))
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            got,
            vec![
                fired,
                Response::Many(vec![Response::Deleted(true), refused.clone()]),
                Response::Deleted(false),
                Response::Many(vec![]),
            ]
        );
        // A failed entry fails every proposal in it, with its error.
        let failed = split_shared(&shapes, Err(ProposeError::Timeout));
        assert_eq!(failed.len(), 4);
        assert!(failed
            .iter()
            .all(|r| matches!(r, Err(ProposeError::Timeout))));
        // So does an answer that is not one response per command.
        for wrong in [Response::Many(vec![Response::Deleted(true)]), refused] {
            let split = split_shared(&shapes, Ok(wrong));
            assert_eq!(split.len(), 4);
            assert!(split
                .iter()
                .all(|r| matches!(r, Err(ProposeError::Raft(_)))));
        }
    }

    #[test]
    fn a_command_is_either_proposed_or_withdrawn_never_both() {
        let claim = Claim::default();
        assert!(claim.take(), "the first taker wins");
        assert!(!claim.take(), "the other one finds it taken");
    }

    #[tokio::test]
    async fn batches_are_cut_by_count() {
        let (tx, mut rx) = mpsc::channel(16);
        let (tx2, mut rx2) = mpsc::channel(16);
        for i in 0..5usize {
            tx.send(i).await.unwrap();
        }
        drop(tx);
        let mut carry = None;
        let one = |_: &usize| (1, 0);
        let first = next_batch(&mut rx, &mut carry, 3, one).await;
        assert_eq!(first, Some(vec![0, 1, 2]));
        assert_eq!(
            next_batch(&mut rx, &mut carry, 3, one).await,
            Some(vec![3, 4])
        );
        // Items of several commands: one that would pass the count leads the next.
        for n in [2usize, 2, 3, 9] {
            tx2.send(n).await.unwrap();
        }
        drop(tx2);
        let own = |n: &usize| (*n, 0);
        let mut cut = Vec::new();
        while let Some(b) = next_batch(&mut rx2, &mut carry, 5, own).await {
            cut.push(b);
        }
        assert_eq!(cut, vec![vec![2, 2], vec![3], vec![9]]);
    }
}
