//! Raft RPCs between nodes over the internal gRPC `Peer` service. openraft's
//! own request and response types travel as bincode blobs, so this file is
//! the only place that knows how a Raft message crosses the wire. The
//! [`Dialer`] opens every channel a node needs: to peer listeners (mutual
//! TLS as this node, with the sender header) and to public listeners.
//!
//! AppendEntries are sized to arrive in time. openraft 0.9 cancels every
//! AppendEntries after the heartbeat interval whatever it carries
//! (`replication/mod.rs`: `timeout(heartbeat_interval, ..)`), so a large
//! payload cannot be given a longer timeout here. Instead: the entries of one
//! AppendEntries are capped in bytes ([`AppendBudget`], halved after a
//! timeout) and more entries than fit are refused with `PayloadTooLarge`,
//! whose hint makes openraft resend only as many; an AppendEntries runs as a
//! task of its own with a longer deadline, and while one openraft gave up on
//! is still with the peer nothing more is sent to it, so a slow follower
//! never queues stale copies; a timeout is reported as `Timeout`, not
//! `Unreachable`, so replication does not back off for 500 ms without
//! heartbeats, which is what let followers start elections.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
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

/// openraft's connection factory. One cached channel per peer: openraft
/// asks for a new client for every read-index round too, and a fresh
/// connection each time would spend a handshake inside a 100 ms deadline.
#[derive(Clone)]
pub struct Network {
    dialer: Dialer,
    channels: Arc<Mutex<HashMap<(NodeId, String), Channel>>>,
}

impl Network {
    pub fn new(dialer: Dialer) -> Self {
        Network {
            dialer,
            channels: Arc::default(),
        }
    }

    fn client(&self, target: NodeId, addr: &str) -> Option<PeerRpc> {
        let mut map = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        let key = (target, addr.to_string());
        let channel = match map.get(&key) {
            Some(c) => c.clone(),
            None => {
                let c = self.dialer.peer_channel(target, addr).ok()?;
                map.insert(key, c.clone());
                c
            }
        };
        Some(self.dialer.peer_client(channel))
    }
}

/// Most bytes of log entries in one AppendEntries to a peer that keeps up
/// (one entry always goes, whatever its size).
pub const APPEND_MAX_BYTES: usize = 1 << 20;
/// The least the budget shrinks to after timeouts.
pub const APPEND_MIN_BYTES: usize = 64 << 10;
/// Longest an AppendEntries may stay with a peer (its gRPC deadline), also
/// after openraft stopped waiting for it.
pub const APPEND_DEADLINE: Duration = Duration::from_secs(1);

/// The entry bytes one AppendEntries to a peer may carry: halved after one
/// that did not answer within openraft's timeout, doubled back toward
/// [`APPEND_MAX_BYTES`] after each one that did.
#[derive(Debug)]
pub struct AppendBudget {
    bytes: usize,
}

impl Default for AppendBudget {
    fn default() -> Self {
        AppendBudget {
            bytes: APPEND_MAX_BYTES,
        }
    }
}

impl AppendBudget {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn timed_out(&mut self) {
        self.bytes = (self.bytes / 2).max(APPEND_MIN_BYTES);
    }

    pub fn answered(&mut self) {
        self.bytes = self.bytes.saturating_mul(2).min(APPEND_MAX_BYTES);
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

/// openraft's connection to one peer.
pub struct PeerConn {
    /// This node (the sender).
    from: NodeId,
    target: NodeId,
    client: Option<PeerRpc>,
    addr: String,
    budget: AppendBudget,
    /// The last AppendEntries, sent as a task of its own so that it stays
    /// with the peer when openraft stops waiting for it. Still here when the
    /// next one starts = openraft gave up on it.
    pending: Option<tokio::task::JoinHandle<()>>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerConn;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerConn {
        PeerConn {
            from: self.dialer.self_id,
            target,
            client: self.client(target, &node.addr),
            addr: node.addr.clone(),
            budget: AppendBudget::default(),
            pending: None,
        }
    }
}

type RpcErr<E> = RPCError<NodeId, BasicNode, RaftError<NodeId, E>>;
type AppendResult = Result<AppendEntriesResponse<NodeId>, RpcErr<openraft::error::Infallible>>;

/// Sends one peer request with `deadline`.
async fn send(
    mut client: PeerRpc,
    kind: Kind,
    data: Vec<u8>,
    deadline: Duration,
) -> Result<Blob, tonic::Status> {
    let mut request = tonic::Request::new(Blob { data });
    request.set_timeout(deadline);
    let reply = match kind {
        Kind::Append => client.append_entries(request).await,
        Kind::Vote => client.vote(request).await,
        Kind::Snapshot => client.install_snapshot(request).await,
    };
    reply.map(tonic::Response::into_inner)
}

impl PeerConn {
    fn client<E: std::error::Error>(&self) -> Result<PeerRpc, RpcErr<E>> {
        self.client.clone().ok_or_else(|| {
            let e = std::io::Error::other(format!("bad peer address {:?}", self.addr));
            RPCError::Unreachable(Unreachable::new(&e))
        })
    }

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
        let reply = send(self.client()?, kind, encode(req), option.hard_ttl()).await;
        self.reply(kind, reply, option)
    }

    fn reply<Resp, E>(
        &self,
        kind: Kind,
        reply: Result<Blob, tonic::Status>,
        option: &RPCOption,
    ) -> Result<Resp, RpcErr<E>>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let blob = reply.map_err(|s| self.status_to_rpc(kind, &s, option))?;
        let res: Result<Resp, RaftError<NodeId, E>> =
            decode(&blob.data).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        res.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    /// One AppendEntries. While the previous one is still with the peer
    /// (openraft gave up waiting for it), nothing more is sent: a slow peer
    /// never has a queue of stale requests to work through. Entries past
    /// the byte budget are refused with `PayloadTooLarge`, whose hint makes
    /// openraft send only those that fit.
    async fn append(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: &RPCOption,
    ) -> AppendResult {
        if let Some(mut previous) = self.pending.take() {
            self.budget.timed_out();
            if tokio::time::timeout(option.soft_ttl(), &mut previous)
                .await
                .is_err()
            {
                self.pending = Some(previous);
                return Err(self.timeout(option));
            }
        }
        if rpc.entries.len() > 1 {
            let sizes = rpc.entries.iter().map(encoded_len);
            let fit = entries_within(sizes, self.budget.bytes());
            if fit < rpc.entries.len() {
                let hint = PayloadTooLarge::new_entries_hint(fit as u64);
                return Err(RPCError::PayloadTooLarge(hint));
            }
        }
        let (client, data) = (self.client()?, encode(&rpc));
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.pending = Some(tokio::spawn(async move {
            let _ = tx.send(send(client, Kind::Append, data, APPEND_DEADLINE).await);
        }));
        let ended = || Err(tonic::Status::cancelled("AppendEntries task ended"));
        let reply = rx.await.unwrap_or_else(|_| ended());
        self.pending = None;
        self.budget.answered();
        self.reply(Kind::Append, reply, option)
    }

    fn timeout<E: std::error::Error>(&self, option: &RPCOption) -> RpcErr<E> {
        RPCError::Timeout(Timeout {
            action: openraft::RPCTypes::AppendEntries,
            id: self.from,
            target: self.target,
            timeout: option.hard_ttl(),
        })
    }

    /// A failed call as openraft's error. A peer that did not answer an
    /// AppendEntries in time is slow, not gone: `Timeout` (retry at once),
    /// not `Unreachable` (back off 500 ms, sending nothing, heartbeats
    /// included). tonic reports its own deadline as `Cancelled` ("Timeout
    /// expired"), the server's as `DeadlineExceeded`.
    fn status_to_rpc<E: std::error::Error>(
        &self,
        kind: Kind,
        s: &tonic::Status,
        option: &RPCOption,
    ) -> RpcErr<E> {
        use tonic::Code::{Cancelled, DeadlineExceeded, Unavailable};
        match (kind, s.code()) {
            (Kind::Append, Cancelled | DeadlineExceeded) => self.timeout(option),
            (_, Unavailable | DeadlineExceeded | Cancelled) => {
                RPCError::Unreachable(Unreachable::new(s))
            }
            _ => RPCError::Network(NetworkError::new(s)),
        }
    }
}

#[derive(Clone, Copy)]
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
    ) -> AppendResult {
        self.append(rpc, &option).await
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
        b.timed_out();
        assert_eq!(b.bytes(), APPEND_MAX_BYTES / 2);
        b.timed_out();
        b.answered();
        assert_eq!(b.bytes(), APPEND_MAX_BYTES / 2);
        (0..20).for_each(|_| b.timed_out());
        assert_eq!(b.bytes(), APPEND_MIN_BYTES);
        (0..20).for_each(|_| b.answered());
        assert_eq!(b.bytes(), APPEND_MAX_BYTES);
    }

    fn entry(index: u64, bytes: usize) -> crate::raft::Entry {
        let cmd = Command::DeleteJob {
            id: "x".repeat(bytes),
            now_ms: 0,
        };
        crate::raft::Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(cmd.into()),
        }
    }

    fn unreachable_conn() -> PeerConn {
        PeerConn {
            from: 1,
            target: 2,
            client: None,
            addr: "nowhere".into(),
            budget: AppendBudget::default(),
            pending: None,
        }
    }

    fn request(entries: Vec<crate::raft::Entry>) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: openraft::Vote::new_committed(1, 1),
            prev_log_id: None,
            leader_commit: None,
            entries,
        }
    }

    #[tokio::test]
    async fn nothing_more_is_sent_while_an_abandoned_append_is_with_the_peer() {
        let mut conn = unreachable_conn();
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        conn.pending = Some(tokio::spawn(async move {
            let _ = released.await;
        }));
        let option = RPCOption::new(Duration::from_millis(20));
        // Still with the peer: a timeout, without sending (here sending
        // would fail at once with Unreachable), and a smaller budget.
        let res = conn.append_entries(request(vec![]), option.clone()).await;
        assert!(matches!(res, Err(RPCError::Timeout(_))), "{res:?}");
        assert_eq!(conn.budget.bytes(), APPEND_MAX_BYTES / 2);
        // Once it is done, the next one goes out.
        release.send(()).unwrap();
        let res = conn.append_entries(request(vec![]), option).await;
        assert!(matches!(res, Err(RPCError::Unreachable(_))), "{res:?}");
        assert!(conn.pending.is_none());
    }

    #[tokio::test]
    async fn an_append_over_the_budget_is_refused_with_how_many_entries_fit() {
        let mut conn = unreachable_conn();
        let third = APPEND_MAX_BYTES / 3;
        let rpc = request((1..=5).map(|i| entry(i, third)).collect());
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
