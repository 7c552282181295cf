//! The console's JSON shapes, converted from the gRPC messages the API
//! answers with (so the console shows exactly what the gRPC API says).
//! Enums become short lower-case names ("failed", "fire_all").

use kairos_proto::v1 as pb;
use serde_json::{json, Value};

/// Bytes of a run's result shown (as lossy UTF-8); the rest is cut.
pub const RESULT_SHOWN_MAX_BYTES: usize = 4096;

/// `RUN_STATE_TIMED_OUT` -> `timed_out`.
fn short(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix)
        .unwrap_or(name)
        .to_ascii_lowercase()
}

pub fn run_state(v: i32) -> String {
    pb::RunState::try_from(v)
        .map_or_else(|_| v.to_string(), |s| short(s.as_str_name(), "RUN_STATE_"))
}

pub fn job(j: &pb::Job) -> Value {
    let s = j.spec.clone().unwrap_or_default();
    let schedule = match s.schedule.and_then(|s| s.kind) {
        Some(pb::schedule::Kind::Cron(c)) => {
            json!({"cron": c.expr, "tz": c.tz, "dialect": c.dialect})
        }
        Some(pb::schedule::Kind::EveryMs(ms)) => json!({ "every_ms": ms }),
        Some(pb::schedule::Kind::AtMs(ms)) => json!({ "at_ms": ms }),
        Some(pb::schedule::Kind::AfterMs(ms)) => json!({ "after_ms": ms }),
        None => Value::Null,
    };
    let misfire = pb::MisfirePolicy::try_from(s.misfire).map_or_else(
        |_| s.misfire.to_string(),
        |p| short(p.as_str_name(), "MISFIRE_POLICY_"),
    );
    let overlap = pb::OverlapPolicy::try_from(s.overlap).map_or_else(
        |_| s.overlap.to_string(),
        |p| short(p.as_str_name(), "OVERLAP_POLICY_"),
    );
    let route = pb::RoutePolicy::try_from(s.route).map_or_else(
        |_| s.route.to_string(),
        |p| short(p.as_str_name(), "ROUTE_POLICY_"),
    );
    json!({
        "id": s.id,
        "group": s.group,
        "schedule": schedule,
        "paused": j.paused,
        "revision": j.revision,
        "created_at_ms": j.created_at_ms,
        "updated_at_ms": j.updated_at_ms,
        "next_fire_at_ms": j.next_fire_at_ms,
        "payload_bytes": s.payload.len(),
        "misfire": misfire,
        "misfire_grace_ms": s.misfire_grace_ms,
        "timeout_ms": s.timeout_ms,
        "max_attempts": s.max_attempts,
        "backoff_ms": s.backoff_ms,
        "priority": s.priority,
        "overlap": overlap,
        "route": route,
        "labels": s.labels,
        "shards": s.shards,
        "broadcast": s.broadcast,
        "keep_runs": s.keep_runs,
        "keep_for_ms": s.keep_for_ms,
    })
}

pub fn run(r: &pb::Run) -> Value {
    let shown = &r.result[..r.result.len().min(RESULT_SHOWN_MAX_BYTES)];
    json!({
        "run_id": r.run_id,
        "job": r.job,
        "scheduled_at_ms": r.scheduled_at_ms,
        "fired_at_ms": r.fired_at_ms,
        "state": run_state(r.state),
        "attempt": r.attempt,
        "worker": r.worker,
        "finished_at_ms": r.finished_at_ms,
        "result": String::from_utf8_lossy(shown),
        "result_bytes": r.result.len(),
        "error": r.error,
        "note": r.note,
        "received_at_ms": r.received_at_ms,
        "shard": r.shard,
        "shard_count": r.shard_count,
    })
}

pub fn stats(s: &pb::JobStatsResponse) -> Value {
    json!({
        "job": s.job,
        "runs": s.runs,
        "fired": s.fired,
        "succeeded": s.succeeded,
        "failed": s.failed,
        "timed_out": s.timed_out,
        "cancelled": s.cancelled,
        "skipped": s.skipped,
        "active": s.active,
        "lateness_runs": s.lateness_runs,
        "lateness_ms_p50": s.lateness_ms_p50,
        "lateness_ms_p99": s.lateness_ms_p99,
        "oldest_scheduled_at_ms": s.oldest_scheduled_at_ms,
        "last_run": s.last_run.as_ref().map(run),
    })
}

pub fn status(s: &pb::StatusResponse) -> Value {
    let nodes: Vec<Value> = s
        .nodes
        .iter()
        .map(|n| {
            json!({
                "id": n.id,
                "addr": n.addr,
                "peer_addr": n.peer_addr,
                "role": n.role,
                "voter": n.voter,
                "applied_index": n.applied_index,
                "state_digest": n.state_digest,
                "term": n.term,
                "clock_offset_ms": n.clock_offset_ms,
                "lag": n.lag,
                "tzdata": n.tzdata,
                "log_format_max": n.log_format_max,
                "refusal": n.refusal,
            })
        })
        .collect();
    json!({
        "leader": s.leader,
        "membership_changing": s.membership_changing,
        "log_format": s.log_format,
        "nodes": nodes,
    })
}

pub fn watch_event(e: &pb::WatchEvent) -> Value {
    let kind = pb::WatchEventKind::try_from(e.kind).map_or_else(
        |_| e.kind.to_string(),
        |k| short(k.as_str_name(), "WATCH_EVENT_KIND_"),
    );
    json!({
        "index": e.index,
        "seq": e.seq,
        "kind": kind,
        "job": e.job,
        "group": e.group,
        "run_id": e.run_id,
        "attempt": e.attempt,
        "worker": e.worker,
        "outcome": run_state(e.outcome),
    })
}
