//! HTTP side port: `/healthz` (the process is up), `/readyz` (a leader is
//! known and this node has applied entries), Prometheus `/metrics`, and a
//! small dashboard at `/`.

use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
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
    let m = node.raft.metrics().borrow().clone();
    let mut s = String::new();
    let is_leader = (m.current_leader == Some(node.id)) as u8;
    let _ = writeln!(
        s,
        "# TYPE kairos_is_leader gauge\nkairos_is_leader {is_leader}"
    );
    let _ = writeln!(
        s,
        "# TYPE kairos_term gauge\nkairos_term {}",
        m.current_term
    );
    let applied = m.last_applied.map(|l| l.index).unwrap_or(0);
    let _ = writeln!(
        s,
        "# TYPE kairos_applied_index gauge\nkairos_applied_index {applied}"
    );
    let first_log = node.log.first_index().unwrap_or(0);
    let _ = writeln!(
        s,
        "# TYPE kairos_log_first_index gauge\nkairos_log_first_index {first_log}"
    );
    let last_log = m.last_log_index.unwrap_or(0);
    let _ = writeln!(
        s,
        "# TYPE kairos_last_log_index gauge\nkairos_last_log_index {last_log}"
    );
    let _ = writeln!(
        s,
        "# TYPE kairos_cluster_time_offset_ms gauge\nkairos_cluster_time_offset_ms {}",
        node.clock.offset_ms()
    );
    let _ = writeln!(s, "# TYPE kairos_clock_skew_ms gauge");
    for (peer, off) in node.clock.peer_offsets() {
        let _ = writeln!(s, "kairos_clock_skew_ms{{peer=\"{peer}\"}} {off}");
    }
    let _ = writeln!(s, "# TYPE kairos_queue_depth gauge\n# TYPE kairos_workers gauge\n# TYPE kairos_in_flight gauge");
    for (g, st) in node.dispatcher.stats() {
        let _ = writeln!(s, "kairos_queue_depth{{group=\"{g}\"}} {}", st.queued);
        let _ = writeln!(s, "kairos_workers{{group=\"{g}\"}} {}", st.workers);
        let _ = writeln!(s, "kairos_in_flight{{group=\"{g}\"}} {}", st.in_flight);
    }
    s
}

async fn metrics(State(node): State<Arc<Node>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        render_metrics(&node),
    )
}

async fn dashboard(State(node): State<Arc<Node>>) -> Html<String> {
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
