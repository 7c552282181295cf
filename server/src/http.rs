//! HTTP side port: `/healthz` (the process is up), `/readyz` (a leader is
//! known and this node has applied entries), Prometheus `/metrics`, and a
//! small dashboard at `/`. The first three stay open (probes and scrapers);
//! with `--auth-token-file` the dashboard needs a reader token, sent as a
//! bearer header or kept by its login form in a `kairos_token` cookie.

use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

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
        .route("/", get(dashboard))
        .with_state(node);
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::error!("http server: {e}");
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

fn render_metrics(node: &Node) -> String {
    node.metrics.render(node)
}

async fn metrics(State(node): State<Arc<Node>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        render_metrics(&node),
    )
}

/// Login form shown instead of the dashboard without a valid reader token.
const LOGIN: &str = "<!doctype html><html><head><title>Kairos</title></head><body>\
<h1>Kairos</h1><p>This cluster needs a token (role reader or above).</p>\
<form onsubmit=\"document.cookie='kairos_token='+encodeURIComponent(this.t.value)+\
';path=/;SameSite=Strict';location.reload();return false\">\
<input name=t type=password placeholder=token size=70> <button>Open</button></form></body></html>";

/// The bearer token of a dashboard request: header first, then the login cookie.
fn dashboard_token(headers: &HeaderMap) -> Option<String> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let cookie = || {
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .find_map(|c| c.trim().strip_prefix("kairos_token="))
    };
    bearer.or_else(cookie).map(str::to_string)
}

async fn dashboard(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
) -> (StatusCode, Html<String>) {
    if node.auth_required {
        let mut md = tonic::metadata::MetadataMap::new();
        if let Some(v) = dashboard_token(&headers).and_then(|t| format!("Bearer {t}").parse().ok())
        {
            md.insert(kairos_client::AUTH_HEADER, v);
        }
        let req = tonic::Request::from_parts(md, Default::default(), ());
        if crate::grpc::auth::authorize(&node, &req, crate::grpc::auth::Need::Read).is_err() {
            return (StatusCode::UNAUTHORIZED, Html(LOGIN.to_string()));
        }
    }
    (StatusCode::OK, render_dashboard(&node))
}

fn render_dashboard(node: &Node) -> Html<String> {
    let m = node.raft.metrics().borrow().clone();
    let jobs = node.sm.list_jobs("", 50);
    let mut rows = String::new();
    for j in &jobs {
        let next = j
            .next_fire_at_ms
            .map(|t| t.to_string())
            .unwrap_or_else(|| "-".into());
        let _ = write!(
            rows,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&j.id),
            esc(&j.group),
            next,
            j.paused
        );
    }
    Html(format!(
        "<!doctype html><html><head><meta http-equiv=refresh content=2><title>Kairos node {id}</title>\
         <style>body{{font-family:sans-serif}}td,th{{padding:2px 8px;text-align:left}}</style></head><body>\
         <h1>Kairos node {id}</h1><p>state {state:?}, term {term}, leader {leader:?}, applied {applied:?}</p>\
         <h2>Jobs (first 50)</h2><table><tr><th>id</th><th>group</th><th>next fire (ms)</th><th>paused</th></tr>{rows}</table>\
         <h2>Metrics</h2><pre>{metrics}</pre></body></html>",
        id = node.id,
        state = m.state,
        term = m.current_term,
        leader = m.current_leader,
        applied = m.last_applied.map(|l| l.index),
        metrics = esc(&render_metrics(&node)),
    ))
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
