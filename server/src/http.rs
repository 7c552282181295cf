//! HTTP side port: `/healthz` (the process is up), `/readyz` (a leader is
//! known and this node has applied entries), Prometheus `/metrics`, and the
//! web console (`crate::console`: the page at `/`, its JSON API under
//! `/api/`). The first three stay open (probes and scrapers); with
//! `--auth-token-file` every `/api` call needs a token.

use std::future::Future;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::serve::{ListenerExt, TapIo};
use axum::Router;
use tokio::net::{TcpListener, TcpStream};

use crate::node::Node;

pub async fn serve(
    node: Arc<Node>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .merge(crate::console::router())
        .with_state(node);
    if let Err(e) = axum::serve(nagle_off(listener), app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::error!("http server: {e}");
    }
}

/// `listener` with Nagle off on every connection it accepts, as on the gRPC
/// ports (`grpc::incoming`): a response's second small write must not wait
/// for the client's delayed ACK.
pub(crate) fn nagle_off(listener: TcpListener) -> TapIo<TcpListener, fn(&mut TcpStream)> {
    listener.tap_io(set_nodelay)
}

fn set_nodelay(tcp: &mut TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!("http: TCP_NODELAY not set: {e}");
    }
}

async fn readyz(State(node): State<Arc<Node>>) -> impl IntoResponse {
    let m = node.raft.metrics().borrow().clone();
    match (m.current_leader, m.last_applied) {
        (Some(l), Some(_)) => (StatusCode::OK, format!("ready: leader is node {l}\n")),
        (None, _) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: no leader known\n".to_string(),
        ),
        (_, None) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: nothing applied yet\n".to_string(),
        ),
    }
}

async fn metrics(State(node): State<Arc<Node>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        node.metrics.render(&node),
    )
}
