//! Raft RPCs between nodes over the internal gRPC `Peer` service. openraft's
//! own request and response types travel as bincode blobs, so this file is
//! the only place that knows how a Raft message crosses the wire. The
//! [`Dialer`] opens every channel a node needs: to peer listeners (mutual
//! TLS as this node, with the sender header) and to public listeners.
//!
//! AppendEntries are sized to arrive in time. openraft 0.9 cancels every
//! AppendEntries after the heartbeat interval whatever it carries
//! (`replication/mod.rs`: `timeout(heartbeat_interval, ..)`), so a large
//! payload cannot be given a longer timeout here; instead the entries of one
//! AppendEntries are capped in bytes ([`AppendBudget`]). More entries than
//! fit are refused with `PayloadTooLarge`, and openraft resends only as many
//! as the hint says. A timeout is reported as `Timeout`, not `Unreachable`,
//! so replication retries at once (smaller) instead of backing off for
//! 500 ms without heartbeats, which is what let followers start elections.

use std::sync::Arc;
use std::time::Duration;

use kairos_proto::peer::{peer_client::PeerClient, Blob};
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Timeout,
    Unreachable,
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
use crate::core::codec::{decode, encode, encoded_len};
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
    /// This node (the sender).
    from: NodeId,
    target: NodeId,
    client: Option<PeerRpc>,
    addr: String,
    budget: AppendBudget,
}

/// Most bytes of log entries in one AppendEntries to a peer that keeps up
/// (one entry always goes, whatever its size).
pub const APPEND_MAX_BYTES: usize = 1 << 20;
/// The least the budget shrinks to after timeouts.
pub const APPEND_MIN_BYTES: usize = 64 << 10;

/// The entry bytes one AppendEntries to a peer may carry: halved after an
/// AppendEntries that did not answer within openraft's timeout (openraft
/// drops the call, so a call still pending when the next one starts timed
/// out), doubled back toward [`APPEND_MAX_BYTES`] after each one that did.
#[derive(Debug)]
pub struct AppendBudget {
    bytes: usize,
    pending: bool,
}

impl Default for AppendBudget {
    fn default() -> Self {
        AppendBudget {
            bytes: APPEND_MAX_BYTES,
            pending: false,
        }
    }
}

impl AppendBudget {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// An AppendEntries starts.
    pub fn begin(&mut self) {
        if self.pending {
            self.shrink();
        }
        self.pending = true;
    }

    /// It ended: answered (whatever the answer) or timed out.
    pub fn end(&mut self, timed_out: bool) {
        self.pending = false;
        match timed_out {
            true => self.shrink(),
            false => self.bytes = self.bytes.saturating_mul(2).min(APPEND_MAX_BYTES),
        }
    }

    fn shrink(&mut self) {
        self.bytes = (self.bytes / 2).max(APPEND_MIN_BYTES);
    }
}

/// How many leading entries of these sizes fit in `budget` bytes; at least one.
pub fn entries_within(sizes: impl IntoIterator<Item = usize>, budget: usize) -> usize {
    let mut total = 0usize;
    let mut n = 0;
    for size in sizes {
        total = total.saturating_add(size);
        if total > budget && n > 0 {
            break;
        }
        n += 1;
    }
    n.max(1)
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerConn;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerConn {
        let client =
            (self.dialer.peer_channel(target, &node.addr).ok()).map(|c| self.dialer.peer_client(c));
        PeerConn {
            from: self.dialer.self_id,
            target,
            client,
            addr: node.addr.clone(),
            budget: AppendBudget::default(),
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
        let blob = reply
            .map_err(|s| self.status_to_rpc(&kind, &s, option))?
            .into_inner();
        let res: Result<Resp, RaftError<NodeId, E>> =
            decode(&blob.data).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        res.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl PeerConn {
    /// A failed call as openraft's error. A peer that did not answer an
    /// AppendEntries in time is slow, not gone: `Timeout` (retry at once),
    /// not `Unreachable` (back off 500 ms, sending nothing, heartbeats included).
    fn status_to_rpc<E: std::error::Error>(
        &self,
        kind: &Kind,
        s: &tonic::Status,
        option: &RPCOption,
    ) -> RpcErr<E> {
        match (kind, s.code()) {
            (Kind::Append, tonic::Code::DeadlineExceeded) => RPCError::Timeout(Timeout {
                action: openraft::RPCTypes::AppendEntries,
                id: self.from,
                target: self.target,
                timeout: option.hard_ttl(),
            }),
            (
                _,
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled,
            ) => RPCError::Unreachable(Unreachable::new(s)),
            _ => RPCError::Network(NetworkError::new(s)),
        }
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
        if rpc.entries.len() > 1 {
            let sizes = rpc.entries.iter().map(encoded_len);
            let fit = entries_within(sizes, self.budget.bytes());
            if fit < rpc.entries.len() {
                let hint = PayloadTooLarge::new_entries_hint(fit as u64);
                return Err(RPCError::PayloadTooLarge(hint));
            }
        }
        self.budget.begin();
        let res = self.call(Kind::Append, &rpc, &option).await;
        self.budget.end(matches!(res, Err(RPCError::Timeout(_))));
        res
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Command;
    use openraft::{CommittedLeaderId, EntryPayload, LogId};

    #[test]
    fn entries_are_counted_while_they_fit_and_one_always_goes() {
        assert_eq!(entries_within([400, 400, 400], 1000), 2);
        assert_eq!(entries_within([400, 600, 1], 1000), 2);
        assert_eq!(
            entries_within([5000, 1], 1000),
            1,
            "an oversized first entry goes alone"
        );
        assert_eq!(entries_within([1; 64], 1000), 64);
        assert_eq!(entries_within([], 1000), 1);
    }

    #[test]
    fn the_budget_halves_after_a_timeout_and_grows_back_after_answers() {
        let mut b = AppendBudget::default();
        b.begin();
        b.end(true);
        assert_eq!(b.bytes(), APPEND_MAX_BYTES / 2);
        // A call dropped by openraft's timeout never ends: the next begin sees it.
        b.begin();
        b.begin();
        assert_eq!(b.bytes(), APPEND_MAX_BYTES / 4);
        b.end(false);
        assert_eq!(b.bytes(), APPEND_MAX_BYTES / 2);
        for _ in 0..20 {
            b.begin();
            b.end(true);
        }
        assert_eq!(b.bytes(), APPEND_MIN_BYTES);
        for _ in 0..20 {
            b.begin();
            b.end(false);
        }
        assert_eq!(b.bytes(), APPEND_MAX_BYTES);
    }

    fn entry(index: u64, bytes: usize) -> crate::raft::Entry {
        let cmd = Command::DeleteJob {
            id: "x".repeat(bytes),
            now_ms: 0,
        };
        crate::raft::Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(cmd),
        }
    }

    #[tokio::test]
    async fn an_append_over_the_budget_is_refused_with_how_many_entries_fit() {
        let mut conn = PeerConn {
            from: 1,
            target: 2,
            client: None,
            addr: "nowhere".into(),
            budget: AppendBudget::default(),
        };
        let third = APPEND_MAX_BYTES / 3;
        let rpc = AppendEntriesRequest {
            vote: openraft::Vote::new_committed(1, 1),
            prev_log_id: None,
            leader_commit: None,
            entries: (1..=5).map(|i| entry(i, third)).collect(),
        };
        let option = RPCOption::new(Duration::from_millis(100));
        match conn.append_entries(rpc.clone(), option.clone()).await {
            Err(RPCError::PayloadTooLarge(p)) => assert_eq!(p.entries_hint(), 2),
            other => panic!("expected PayloadTooLarge, got {other:?}"),
        }
        // What fits is sent (here: fails to reach the bad address).
        let mut fits = rpc;
        fits.entries.truncate(2);
        match conn.append_entries(fits, option).await {
            Err(RPCError::Unreachable(_)) => {}
            other => panic!("expected an attempt to send, got {other:?}"),
        }
    }
}
