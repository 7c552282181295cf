//! Raft RPCs between nodes over the internal gRPC `Peer` service. openraft's
//! own request and response types travel as bincode blobs, so this file is
//! the only place that knows how a Raft message crosses the wire. The
//! [`Dialer`] opens every channel a node needs: to peer listeners (mutual
//! TLS as this node, with the sender header) and to public listeners.

use std::sync::Arc;
use std::time::Duration;

use kairos_proto::peer::{peer_client::PeerClient, Blob};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::{de::DeserializeOwned, Serialize};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use super::{NodeId, TypeConfig};
use crate::core::codec::{decode, encode};
use crate::tls::NodeTls;

/// Metadata naming the node a peer request comes from; with TLS the
/// receiver checks that the sender's certificate names that node.
pub const SENDER_HEADER: &str = "x-kairos-node";

/// A peer-service client that names its sender on every request.
pub type PeerRpc = PeerClient<InterceptedService<Channel, SenderHeader>>;

#[derive(Clone)]
pub struct SenderHeader(tonic::metadata::AsciiMetadataValue);

impl tonic::service::Interceptor for SenderHeader {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert(SENDER_HEADER, self.0.clone());
        Ok(req)
    }
}

/// Opens this node's channels, with TLS when the node has it.
#[derive(Clone)]
pub struct Dialer {
    pub self_id: NodeId,
    pub tls: Option<Arc<NodeTls>>,
}

impl Dialer {
    fn endpoint(&self, addr: &str) -> Result<Endpoint, tonic::transport::Error> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        Ok(Endpoint::from_shared(format!("{scheme}://{addr}"))?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5)))
    }

    /// A lazily connecting channel to node `target`'s peer listener.
    pub fn peer_channel(
        &self,
        target: NodeId,
        addr: &str,
    ) -> Result<Channel, tonic::transport::Error> {
        let mut ep = self.endpoint(addr)?;
        if let Some(tls) = &self.tls {
            ep = ep.tls_config(tls.peer_client(target))?;
        }
        Ok(ep.connect_lazy())
    }

    /// A lazily connecting channel to a node's public listener.
    pub fn public_channel(&self, addr: &str) -> Result<Channel, tonic::transport::Error> {
        let mut ep = self.endpoint(addr)?;
        if let Some(tls) = &self.tls {
            ep = ep.tls_config(tls.public_client())?;
        }
        Ok(ep.connect_lazy())
    }

    /// The peer-service client over `channel` (from [`Dialer::peer_channel`]).
    pub fn peer_client(&self, channel: Channel) -> PeerRpc {
        let id = tonic::metadata::AsciiMetadataValue::from(self.self_id);
        PeerClient::with_interceptor(channel, SenderHeader(id))
            .max_decoding_message_size(crate::grpc::PEER_MAX_MESSAGE_BYTES)
            .max_encoding_message_size(crate::grpc::PEER_MAX_MESSAGE_BYTES)
    }
}

#[derive(Clone)]
pub struct Network {
    pub dialer: Dialer,
}

pub struct PeerConn {
    target: NodeId,
    client: Option<PeerRpc>,
    addr: String,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerConn;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerConn {
        let client =
            (self.dialer.peer_channel(target, &node.addr).ok()).map(|c| self.dialer.peer_client(c));
        PeerConn {
            target,
            client,
            addr: node.addr.clone(),
        }
    }
}

type RpcErr<E> = RPCError<NodeId, BasicNode, RaftError<NodeId, E>>;

impl PeerConn {
    async fn call<Req, Resp, E>(
        &mut self,
        kind: Kind,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RpcErr<E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let Some(client) = self.client.as_mut() else {
            let e = std::io::Error::other(format!("bad peer address {:?}", self.addr));
            return Err(RPCError::Unreachable(Unreachable::new(&e)));
        };
        let mut request = tonic::Request::new(Blob { data: encode(req) });
        request.set_timeout(option.hard_ttl());
        let reply = match kind {
            Kind::Append => client.append_entries(request).await,
            Kind::Vote => client.vote(request).await,
            Kind::Snapshot => client.install_snapshot(request).await,
        };
        let blob = reply.map_err(|s| status_to_rpc(&s))?.into_inner();
        let res: Result<Resp, RaftError<NodeId, E>> =
            decode(&blob.data).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        res.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

fn status_to_rpc<E: std::error::Error>(s: &tonic::Status) -> RpcErr<E> {
    match s.code() {
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
            RPCError::Unreachable(Unreachable::new(s))
        }
        _ => RPCError::Network(NetworkError::new(s)),
    }
}

enum Kind {
    Append,
    Vote,
    Snapshot,
}

impl RaftNetwork<TypeConfig> for PeerConn {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcErr<openraft::error::Infallible>> {
        self.call(Kind::Append, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcErr<InstallSnapshotError>> {
        self.call(Kind::Snapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcErr<openraft::error::Infallible>> {
        self.call(Kind::Vote, &rpc, &option).await
    }
}
