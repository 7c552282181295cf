//! The internal peer service: Raft RPCs (bincode blobs), local status and
//! clock probes. Served only on the peer listener. With TLS, every request
//! must come with a cluster-CA client certificate (the handshake enforces
//! that) naming the node in its sender header, and a Raft message must be
//! sent by that same node: a certificate for node 3 cannot speak as node 2.

use std::sync::Arc;

use kairos_proto::peer::{peer_server::Peer, Blob, ClockProbeResponse, Empty, LocalStatusResponse};
use tonic::{Request, Response, Status};

use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};

use crate::core::codec::{decode, encode};
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

impl PeerService {
    /// With TLS: the node the request's certificate proves it comes from.
    /// Without TLS (loopback development, or --insecure): None, nothing to check.
    fn sender<T>(&self, req: &Request<T>) -> Result<Option<NodeId>, Status> {
        if self.node.dialer.tls.is_none() {
            return Ok(None);
        }
        let claimed = req
            .metadata()
            .get(SENDER_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<NodeId>().ok())
            .ok_or_else(|| {
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
        let rpc = self.raft_message(req, |r: &AppendEntriesRequest<TypeConfig>| {
            r.vote.leader_id().voted_for()
        })?;
        let res = self.node.raft.append_entries(rpc).await;
        Ok(Response::new(Blob { data: encode(&res) }))
    }

    async fn vote(&self, req: Request<Blob>) -> Result<Response<Blob>, Status> {
        let rpc = self.raft_message(req, |r: &VoteRequest<NodeId>| {
            r.vote.leader_id().voted_for()
        })?;
        let res = self.node.raft.vote(rpc).await;
        Ok(Response::new(Blob { data: encode(&res) }))
    }

    async fn install_snapshot(&self, req: Request<Blob>) -> Result<Response<Blob>, Status> {
        let rpc = self.raft_message(req, |r: &InstallSnapshotRequest<TypeConfig>| {
            r.vote.leader_id().voted_for()
        })?;
        let res = self.node.raft.install_snapshot(rpc).await;
        Ok(Response::new(Blob { data: encode(&res) }))
    }

    async fn local_status(
        &self,
        req: Request<Empty>,
    ) -> Result<Response<LocalStatusResponse>, Status> {
        self.sender(&req)?;
        Ok(Response::new(local_status(&self.node).await))
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
}

pub async fn local_status(node: &Node) -> LocalStatusResponse {
    let m = node.raft.metrics().borrow().clone();
    let (applied_index, state_digest) = node.sm.digest().await;
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
    }
}
