//! gRPC: the only module that touches tonic on the server side. The public
//! port serves `kairos.v1`, health and reflection; the internal peer service
//! (`kairos.peer.v1`: Raft, status, clock probes) has a listener of its own
//! and is never reachable on the public port. A follower forwards public
//! calls to the leader; a call already forwarded once is never forwarded again.

pub mod api;
pub mod auth;
pub mod convert;
pub mod error;
pub mod peer;
pub mod watch;
pub mod workers;

use std::future::Future;
use std::sync::Arc;

use kairos_proto::peer::peer_server::PeerServer;
use kairos_proto::v1::{
    cluster_server::ClusterServer, jobs_server::JobsServer, runs_server::RunsServer,
    workers_server::WorkersServer,
};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::node::Node;
use crate::tls::NodeTls;

/// Set on a forwarded call so the receiver does not forward it again.
pub const FORWARDED_HEADER: &str = "x-kairos-forwarded";
/// Asks for this node's local state, without forwarding or a read index.
pub const LOCAL_HEADER: &str = "x-kairos-local";
/// Largest gRPC message accepted (a 512 KiB result or 256 KiB payload plus overhead).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Largest peer message, either way: an AppendEntries of up to 64 entries or
/// one snapshot chunk. Its bincode is decoded with the same limit.
pub const PEER_MAX_MESSAGE_BYTES: usize = crate::core::codec::DECODE_LIMIT_BYTES;

/// Both ports ping each connection this often and close one whose ping is
/// not answered in `KEEPALIVE_TIMEOUT`, so a client, watcher or peer whose
/// host vanished without closing its connection is let go within 25 s, not
/// after TCP's many minutes (a worker stream is closed sooner, on silence:
/// `workers::SESSION_SILENCE_MS`).
const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(15);
const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A server with the keepalive above.
fn server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
}

/// The services of the public port, as reflection names them.
const PUBLIC_SERVICES: [&str; 5] = [
    "kairos.v1.Jobs",
    "kairos.v1.Runs",
    "kairos.v1.Workers",
    "kairos.v1.Cluster",
    "grpc.health.v1.Health",
];

/// The public port: clients, workers, health and reflection. No peer RPC.
pub async fn serve_public(
    node: Arc<Node>,
    listener: TcpListener,
    tls: Option<Arc<NodeTls>>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<JobsServer<api::Api>>().await;
    // Only the public services are advertised (the descriptor set also holds
    // the peer API), in both reflection versions: many tools still ask v1alpha.
    let reflection = || {
        PUBLIC_SERVICES
            .iter()
            .fold(tonic_reflection::server::Builder::configure(), |b, s| {
                b.with_service_name(*s)
            })
            .register_encoded_file_descriptor_set(kairos_proto::FILE_DESCRIPTOR_SET)
    };
    let api = api::Api { node: node.clone() };
    let mut server = server();
    if let Some(tls) = &tls {
        server = server.tls_config(tls.public_server())?;
    }
    server
        .add_service(health)
        .add_service(reflection().build_v1()?)
        .add_service(reflection().build_v1alpha()?)
        .add_service(JobsServer::new(api.clone()).max_decoding_message_size(MAX_MESSAGE_BYTES))
        .add_service(RunsServer::new(api.clone()))
        .add_service(ClusterServer::new(api))
        .add_service(
            WorkersServer::new(workers::WorkerService { node })
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(incoming(listener), shutdown)
        .await?;
    Ok(())
}

/// The peer port: Raft RPCs, local status and clock probes between nodes.
pub async fn serve_peer(
    node: Arc<Node>,
    listener: TcpListener,
    tls: Option<Arc<NodeTls>>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut server = server();
    if let Some(tls) = &tls {
        server = server.tls_config(tls.peer_server())?;
    }
    server
        .add_service(
            PeerServer::new(peer::PeerService { node })
                .max_decoding_message_size(PEER_MAX_MESSAGE_BYTES)
                .max_encoding_message_size(PEER_MAX_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(incoming(listener), shutdown)
        .await?;
    Ok(())
}

/// The connections `listener` accepts, with Nagle's algorithm off.
/// `Server::tcp_nodelay` applies only to listeners tonic binds itself; on
/// ours every small message written while an earlier one was unacknowledged
/// (an assignment, a Raft reply) waited for the peer's delayed ACK, tens of
/// milliseconds on Linux.
fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

pub fn has_header<T>(req: &Request<T>, name: &str) -> bool {
    req.metadata().get(name).is_some()
}

/// Where a public call should go: `None` to serve it here, or the leader's channel.
pub fn route<T>(node: &Node, req: &Request<T>) -> Result<Option<Channel>, Status> {
    if has_header(req, LOCAL_HEADER) || node.is_leader() {
        return Ok(None);
    }
    let leader = node.leader();
    if has_header(req, FORWARDED_HEADER) {
        return Err(error::not_leader(leader));
    }
    match &leader {
        Some((_, addr)) => node
            .public_channel(addr)
            .map(Some)
            .ok_or_else(|| error::not_leader(leader.clone())),
        None => Err(error::not_leader(None)),
    }
}

/// Cluster time to stamp into a write: waits up to `CALIBRATION_WAIT_MS`
/// for a new leader's first quorum clock measurement, else `UNAVAILABLE`.
/// Every client write asks for it first, so an overloaded leader refuses
/// the write here, before waiting or working on it.
pub async fn write_now_ms(node: &Node) -> Result<i64, Status> {
    let (_, backlog) = node.apply_progress();
    (node.admission.precheck(backlog, node.clock.mono_ms())).map_err(|o| error::overloaded(&o))?;
    node.clock
        .wait_calibrated_ms(crate::clock::CALIBRATION_WAIT_MS)
        .await
        .ok_or_else(error::uncalibrated)
}

/// Re-wraps a request for forwarding: the caller's token goes along (the
/// leader checks it too), and the mark that it must not be forwarded again.
pub fn forwarded<T>(req: Request<T>) -> Request<T> {
    let keep = [kairos_client::AUTH_HEADER, kairos_client::REQUEST_ID_HEADER];
    let values: Vec<_> = keep
        .iter()
        .map(|k| req.metadata().get(*k).cloned())
        .collect();
    let mut r = Request::new(req.into_inner());
    for (k, v) in keep.iter().zip(values) {
        if let Some(v) = v {
            r.metadata_mut().insert(*k, v);
        }
    }
    r.metadata_mut().insert(
        FORWARDED_HEADER,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    r
}

/// Waits until this leader has applied everything committed before the read began.
pub async fn read_barrier<T>(node: &Node, req: &Request<T>) -> Result<(), Status> {
    if has_header(req, LOCAL_HEADER) {
        return Ok(());
    }
    node.ensure_linearizable()
        .await
        .map(|_| ())
        .map_err(|e| match e {
            openraft::error::RaftError::APIError(
                openraft::error::CheckIsLeaderError::ForwardToLeader(f),
            ) => {
                // The membership holds peer addresses: hint the public one.
                let leader = f.leader_id.and_then(|id| Some((id, node.api_addr(id)?)));
                error::not_leader(leader)
            }
            other => Status::unavailable(format!("read index: {other}")),
        })
}

#[cfg(test)]
mod tests {
    use axum::serve::Listener;
    use tokio::net::{TcpListener, TcpStream};
    use tokio_stream::StreamExt;

    /// Nagle is off on what the gRPC and the HTTP listeners accept, and on
    /// by default, which is what they guard against.
    #[tokio::test]
    async fn accepted_connections_have_nagle_off() {
        let bind = || TcpListener::bind("127.0.0.1:0");
        let (grpc, http, plain) = (
            bind().await.unwrap(),
            bind().await.unwrap(),
            bind().await.unwrap(),
        );
        let addrs = [grpc.local_addr(), http.local_addr(), plain.local_addr()].map(Result::unwrap);
        let mut clients = Vec::new();
        for a in addrs {
            clients.push(TcpStream::connect(a).await.unwrap());
        }
        let via_grpc = super::incoming(grpc).next().await.unwrap().unwrap();
        let (via_http, _) = crate::http::nagle_off(http).accept().await;
        let (via_plain, _) = plain.accept().await.unwrap();
        assert!(via_grpc.nodelay().unwrap(), "gRPC listener left Nagle on");
        assert!(via_http.nodelay().unwrap(), "HTTP listener left Nagle on");
        assert!(!via_plain.nodelay().unwrap());
    }
}
