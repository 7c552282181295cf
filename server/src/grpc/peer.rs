//! The internal peer service: Raft RPCs (bincode blobs), local status and
//! clock probes.

use std::sync::Arc;

use kairos_proto::peer::{peer_server::Peer, Blob, ClockProbeResponse, Empty, LocalStatusResponse};
use tonic::{Request, Response, Status};

use crate::core::codec::{decode, encode};
use crate::node::Node;

pub struct PeerService {
    pub node: Arc<Node>,
}

fn bad(e: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("peer message does not decode: {e}"))
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn append_entries(&self, req: Request<Blob>) -> Result<Response<Blob>, Status> {
        let rpc = decode(&req.into_inner().data).map_err(bad)?;
        let res = self.node.raft.append_entries(rpc).await;
        Ok(Response::new(Blob { data: encode(&res) }))
    }

    async fn vote(&self, req: Request<Blob>) -> Result<Response<Blob>, Status> {
        let rpc = decode(&req.into_inner().data).map_err(bad)?;
        let res = self.node.raft.vote(rpc).await;
        Ok(Response::new(Blob { data: encode(&res) }))
    }

    async fn install_snapshot(&self, req: Request<Blob>) -> Result<Response<Blob>, Status> {
        let rpc = decode(&req.into_inner().data).map_err(bad)?;
        let res = self.node.raft.install_snapshot(rpc).await;
        Ok(Response::new(Blob { data: encode(&res) }))
    }

    async fn local_status(
        &self,
        _req: Request<Empty>,
    ) -> Result<Response<LocalStatusResponse>, Status> {
        Ok(Response::new(local_status(&self.node).await))
    }

    async fn clock_probe(
        &self,
        _req: Request<Empty>,
    ) -> Result<Response<ClockProbeResponse>, Status> {
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
    }
}
