//! The internal peer service: Raft RPCs (bincode blobs), local status and
//! clock probes. Served only on the peer listener. With TLS, every request
//! must come with a cluster-CA client certificate (the handshake enforces
//! that) naming the node in its sender header, and a Raft message must be
//! sent by that same node: a certificate for node 3 cannot speak as node 2.

use std::sync::Arc;

use kairos_proto::peer::{
    peer_server::Peer, Blob, ClockProbeResponse, ElectRequest, Empty, LocalStatusRequest,
    LocalStatusResponse, LogFormatsResponse,
};
use tonic::{Request, Response, Status};

use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};

use crate::core::codec::{decode, encode};
use crate::handover::{HandoverError, RPC_TIMEOUT};
use crate::node::Node;
use crate::raft::network::SENDER_HEADER;
use crate::raft::{NodeId, TypeConfig};
use crate::tls;

pub struct PeerService {
    pub node: Arc<Node>,
}

fn bad(e: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("peer message does not decode: {e}"))
}

/// The node a peer request says it comes from (checked against the
/// certificate by [`PeerService::sender`] when there is TLS).
fn claimed_sender<T>(req: &Request<T>) -> Option<NodeId> {
    let v = req.metadata().get(SENDER_HEADER)?.to_str().ok()?;
    v.parse().ok()
}

impl PeerService {
    /// With TLS: the node the request's certificate proves it comes from.
    /// Without TLS (loopback development, or --insecure): None, nothing to check.
    fn sender<T>(&self, req: &Request<T>) -> Result<Option<NodeId>, Status> {
        if self.node.dialer.tls.is_none() {
            return Ok(None);
        }
        let claimed = claimed_sender(req).ok_or_else(|| {
            Status::unauthenticated(format!(
                "peer request without a valid {SENDER_HEADER} header"
            ))
        })?;
        let certs = req.peer_certs().unwrap_or_default();
        match certs.first() {
            Some(c) if tls::names_node(c, claimed) => Ok(Some(claimed)),
            Some(_) => Err(Status::permission_denied(format!(
                "peer certificate does not name node {claimed} ({})",
                tls::node_name(claimed)
            ))),
            None => Err(Status::unauthenticated(
                "peer request without a client certificate",
            )),
        }
    }

    /// While this node's disk is below its reserve it takes no Raft message
    /// that writes (entries, votes, snapshots): to the sender it is down.
    fn disk_room(&self) -> Result<(), Status> {
        self.node
            .disk
            .check()
            .map_err(|low| Status::unavailable(low.to_string()))
    }

    /// Decodes a Raft message and checks it is sent by the authenticated node.
    fn raft_message<T: serde::de::DeserializeOwned>(
        &self,
        req: Request<Blob>,
        from: impl Fn(&T) -> Option<NodeId>,
    ) -> Result<T, Status> {
        let sender = self.sender(&req)?;
        let rpc: T = decode(&req.into_inner().data).map_err(bad)?;
        match (sender, from(&rpc)) {
            (Some(cert), claimed) if claimed != Some(cert) => Err(Status::permission_denied(
                format!("raft message from node {claimed:?} sent with node {cert}'s certificate"),
            )),
            _ => Ok(rpc),
        }
    }
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn append_entries(&self, req: Request<Blob>) -> Result<Response<Blob>, Status> {
        self.disk_room()?;
        let rpc = self.raft_message(req, |r: &AppendEntriesRequest<TypeConfig>| {
            r.vote.leader_id().voted_for()
        })?;
        let res = self.node.raft.append_entries(rpc).await;
        Ok(Response::new(Blob { data: encode(&res) }))
    }

    async fn vote(&self, req: Request<Blob>) -> Result<Response<Blob>, Status> {
        self.disk_room()?;
        let rpc = self.raft_message(req, |r: &VoteRequest<NodeId>| {
            r.vote.leader_id().voted_for()
        })?;
        let res = self.node.raft.vote(rpc).await;
        Ok(Response::new(Blob { data: encode(&res) }))
    }

    async fn install_snapshot(&self, req: Request<Blob>) -> Result<Response<Blob>, Status> {
        self.disk_room()?;
        let rpc = self.raft_message(req, |r: &InstallSnapshotRequest<TypeConfig>| {
            r.vote.leader_id().voted_for()
        })?;
        let res = self.node.raft.install_snapshot(rpc).await;
        Ok(Response::new(Blob { data: encode(&res) }))
    }

    async fn local_status(
        &self,
        req: Request<LocalStatusRequest>,
    ) -> Result<Response<LocalStatusResponse>, Status> {
        self.sender(&req)?;
        let digest = !req.get_ref().skip_digest;
        Ok(Response::new(local_status(&self.node, digest).await))
    }

    async fn clock_probe(
        &self,
        req: Request<Empty>,
    ) -> Result<Response<ClockProbeResponse>, Status> {
        self.sender(&req)?;
        Ok(Response::new(ClockProbeResponse {
            now_ms: self.node.clock.local_ms(),
        }))
    }

    async fn log_formats(
        &self,
        req: Request<Empty>,
    ) -> Result<Response<LogFormatsResponse>, Status> {
        self.sender(&req)?;
        Ok(Response::new(LogFormatsResponse {
            newest: crate::core::command::LOG_FORMAT,
        }))
    }

    /// A handover: the leader this node follows asks it to campaign now.
    async fn elect(&self, req: Request<ElectRequest>) -> Result<Response<Empty>, Status> {
        self.sender(&req)?;
        let from = claimed_sender(&req);
        let min = req.into_inner().min_last_log_index;
        let m = self.node.raft.metrics().borrow().clone();
        let me = self.node.id;
        if !m
            .membership_config
            .membership()
            .voter_ids()
            .any(|id| id == me)
        {
            return Err(Status::failed_precondition(format!(
                "node {me} is not a voter"
            )));
        }
        if from.is_none() || from != m.current_leader {
            return Err(Status::failed_precondition(format!(
                "election request from node {from:?}, but node {me} follows {:?}",
                m.current_leader
            )));
        }
        let last = m.last_log_index.unwrap_or(0);
        if last < min {
            return Err(Status::failed_precondition(format!(
                "node {me}'s log ends at index {last}, the leader's at {min}"
            )));
        }
        if crate::failpoint::on("ignore-elect") {
            tracing::error!("failpoint: not starting the election the leader asked for");
            return Ok(Response::new(Empty {}));
        }
        tracing::info!(leader = from, "handover: starting an election");
        self.node
            .raft
            .trigger()
            .elect()
            .await
            .map_err(|e| Status::unavailable(format!("raft: {e}")))?;
        Ok(Response::new(Empty {}))
    }
}

/// Asks voter `target` (peer address `addr`) to campaign now; it refuses
/// unless its log reaches `min_last_log_index` and it follows this node.
pub async fn ask_elect(
    node: &Node,
    target: NodeId,
    addr: &str,
    min_last_log_index: u64,
) -> Result<(), HandoverError> {
    let mut client = node.peer_rpc(target, addr).ok_or_else(|| {
        HandoverError::Refused(format!("node {target}: bad peer address {addr:?}"))
    })?;
    let mut req = Request::new(ElectRequest { min_last_log_index });
    req.set_timeout(RPC_TIMEOUT);
    match client.elect(req).await {
        Ok(_) => Ok(()),
        Err(s) if s.code() == tonic::Code::FailedPrecondition => Err(HandoverError::Refused(
            format!("node {target} refused to take over: {}", s.message()),
        )),
        // It may have started the election before the answer was lost.
        Err(s) => Err(HandoverError::Incomplete(format!(
            "node {target} did not answer the election request ({}); check `cluster status`",
            s.message()
        ))),
    }
}

/// How long a status call waits for a fresh state digest before it
/// answers with the last one: well inside the 2 s a peer's status is given
/// (`Node::peer_status`), so a node hashing a large state is not reported
/// unreachable.
pub const DIGEST_BUDGET: std::time::Duration = std::time::Duration::from_secs(1);

/// This node's status; with `digest`, a SHA-256 of its whole state, hashed
/// from a point-in-time read while apply goes on, as fresh as
/// [`DIGEST_BUDGET`] allows (`StateMachine::digest_within`).
pub async fn local_status(node: &Node, digest: bool) -> LocalStatusResponse {
    let (digest_index, state_digest) = if digest {
        node.sm.digest_within(DIGEST_BUDGET).await
    } else {
        (0, String::new())
    };
    // Read after the digest: the digest's index is this one or older.
    let m = node.raft.metrics().borrow().clone();
    let applied_index = node.sm.last_applied().map_or(0, |l| l.index);
    let role = match m.state {
        openraft::ServerState::Leader => "leader",
        openraft::ServerState::Follower => "follower",
        openraft::ServerState::Candidate => "candidate",
        openraft::ServerState::Learner => "learner",
        openraft::ServerState::Shutdown => "shutdown",
    };
    LocalStatusResponse {
        id: node.id,
        role: role.to_string(),
        applied_index,
        state_digest,
        term: m.current_term,
        leader: m.current_leader.unwrap_or(0),
        api_addr: node.addr.clone(),
        tzdata: crate::core::schedule::TZDATA_VERSION.to_string(),
        log_format_max: crate::core::command::LOG_FORMAT,
        refusal: node.sm.refusal().unwrap_or_default(),
        log_format: node.sm.log_format(),
        digest_index: digest.then_some(digest_index),
    }
}
