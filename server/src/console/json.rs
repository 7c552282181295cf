//! The console's JSON shapes, converted from the gRPC messages the API
//! answers with (so the console shows exactly what the gRPC API says).
//! Enums become short lower-case names ("failed", "fire_all"). A small
//! writer of its own (`Json`) keeps serde_json out of the server library.

use std::fmt::Write as _;

use kairos_proto::v1 as pb;

/// A JSON value to write out.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Int(i128),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

/// An object from `(key, value)` pairs, in that order.
pub fn obj<const N: usize>(pairs: [(&str, Json); N]) -> Json {
    Json::Obj(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

impl Json {
    /// Adds a member to an object (no-op on other values).
    pub fn with(mut self, key: &str, v: impl Into<Json>) -> Json {
        if let Json::Obj(members) = &mut self {
            members.push((key.to_string(), v.into()));
        }
        self
    }

    fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Int(n) => {
                let _ = write!(out, "{n}");
            }
            Json::Str(s) => write_str(s, out),
            Json::Arr(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.write(out);
                }
                out.push(']');
            }
            Json::Obj(members) => {
                out.push('{');
                for (i, (k, v)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_str(k, out);
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
        }
    }
}

impl std::fmt::Display for Json {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut out = String::new();
        self.write(&mut out);
        f.write_str(&out)
    }
}

/// A JSON string literal: quotes, backslashes and control characters
/// escaped, and `<` `>` `&` too so the text is inert wherever it lands.
fn write_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 || matches!(c, '<' | '>' | '&' | '\u{2028}' | '\u{2029}') => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

macro_rules! from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Json {
            fn from(n: $t) -> Json {
                Json::Int(n as i128)
            }
        }
    )*};
}
from_int!(i64, u64, i32, u32, usize);

impl From<bool> for Json {
    fn from(b: bool) -> Json {
        Json::Bool(b)
    }
}

impl From<&str> for Json {
    fn from(s: &str) -> Json {
        Json::Str(s.to_string())
    }
}

impl From<String> for Json {
    fn from(s: String) -> Json {
        Json::Str(s)
    }
}

impl From<&String> for Json {
    fn from(s: &String) -> Json {
        Json::Str(s.clone())
    }
}

impl<T: Into<Json>> From<Option<T>> for Json {
    fn from(v: Option<T>) -> Json {
        v.map_or(Json::Null, Into::into)
    }
}

impl<T: Into<Json>> From<Vec<T>> for Json {
    fn from(v: Vec<T>) -> Json {
        Json::Arr(v.into_iter().map(Into::into).collect())
    }
}

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

fn schedule(s: Option<pb::Schedule>) -> Json {
    match s.and_then(|s| s.kind) {
        Some(pb::schedule::Kind::Cron(c)) => obj([
            ("cron", c.expr.into()),
            ("tz", c.tz.into()),
            ("dialect", c.dialect.into()),
        ]),
        Some(pb::schedule::Kind::EveryMs(ms)) => obj([("every_ms", ms.into())]),
        Some(pb::schedule::Kind::AtMs(ms)) => obj([("at_ms", ms.into())]),
        Some(pb::schedule::Kind::AfterMs(ms)) => obj([("after_ms", ms.into())]),
        Some(pb::schedule::Kind::UpstreamOnly(_)) => obj([("upstream_only", true.into())]),
        None => Json::Null,
    }
}

pub fn job(j: &pb::Job) -> Json {
    let s = j.spec.clone().unwrap_or_default();
    let also = s.also_schedules.into_iter().map(|a| schedule(Some(a)));
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
    obj([
        ("id", s.id.into()),
        ("group", s.group.into()),
        ("schedule", schedule(s.schedule)),
        ("also_schedules", Json::Arr(also.collect())),
        ("paused", j.paused.into()),
        ("state", (&j.state).into()),
        ("fired_count", j.fired_count.into()),
        ("finished_at_ms", j.finished_at_ms.into()),
        ("pause_note", (&j.pause_note).into()),
        ("paused_by", (&j.paused_by).into()),
        ("paused_at_ms", j.paused_at_ms.into()),
        ("start_at_ms", s.start_at_ms.into()),
        ("end_at_ms", s.end_at_ms.into()),
        ("max_runs", s.max_runs.into()),
        ("job_labels", strings(s.job_labels)),
        (
            "upstream",
            Json::Arr(s.upstream.into_iter().map(Into::into).collect()),
        ),
        ("trigger_rule", s.trigger_rule.into()),
        ("on_upstream_failure", s.on_upstream_failure.into()),
        ("workflow_state", (&j.workflow_state).into()),
        (
            "downstream",
            Json::Arr(j.downstream.iter().map(Into::into).collect()),
        ),
        ("max_concurrent", s.max_concurrent.into()),
        ("queued_at_ms", j.queued_at_ms.clone().into()),
        ("backfill", j.backfill.as_ref().map_or(Json::Null, backfill)),
        ("revision", j.revision.into()),
        ("created_at_ms", j.created_at_ms.into()),
        ("updated_at_ms", j.updated_at_ms.into()),
        ("next_fire_at_ms", j.next_fire_at_ms.into()),
        ("next_offset_ms", j.next_offset_ms.into()),
        ("jitter_ms", s.jitter_ms.into()),
        ("catch_up_max", s.catch_up_max.into()),
        ("payload_bytes", s.payload.len().into()),
        ("misfire", misfire.into()),
        ("misfire_grace_ms", s.misfire_grace_ms.into()),
        ("timeout_ms", s.timeout_ms.into()),
        ("max_attempts", s.max_attempts.into()),
        ("backoff_ms", s.backoff_ms.into()),
        ("priority", s.priority.into()),
        ("overlap", overlap.into()),
        ("route", route.into()),
        (
            "labels",
            Json::Obj(s.labels.into_iter().map(|(k, v)| (k, v.into())).collect()),
        ),
        ("shards", s.shards.into()),
        ("broadcast", s.broadcast.into()),
        ("keep_runs", s.keep_runs.into()),
        ("keep_for_ms", s.keep_for_ms.into()),
    ])
}

fn backfill(b: &pb::Backfill) -> Json {
    obj([
        ("state", (&b.state).into()),
        ("from_ms", b.from_ms.into()),
        ("to_ms", b.to_ms.into()),
        ("overlap", (&b.overlap).into()),
        ("total", b.total.into()),
        ("started", b.started.into()),
        ("existing", b.existing.into()),
        ("skipped", b.skipped.into()),
        ("next_at_ms", b.next_at_ms.into()),
    ])
}

fn strings(map: std::collections::HashMap<String, String>) -> Json {
    let mut pairs: Vec<(String, Json)> = map.into_iter().map(|(k, v)| (k, v.into())).collect();
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    Json::Obj(pairs)
}

pub fn run(r: &pb::Run) -> Json {
    let shown = &r.result[..r.result.len().min(RESULT_SHOWN_MAX_BYTES)];
    obj([
        ("run_id", (&r.run_id).into()),
        ("job", (&r.job).into()),
        ("scheduled_at_ms", r.scheduled_at_ms.into()),
        ("offset_ms", r.offset_ms.into()),
        ("fired_at_ms", r.fired_at_ms.into()),
        ("state", run_state(r.state).into()),
        ("attempt", r.attempt.into()),
        ("worker", (&r.worker).into()),
        ("finished_at_ms", r.finished_at_ms.into()),
        ("result", String::from_utf8_lossy(shown).into_owned().into()),
        ("result_bytes", r.result.len().into()),
        ("error", (&r.error).into()),
        ("note", (&r.note).into()),
        ("received_at_ms", r.received_at_ms.into()),
        ("shard", r.shard.into()),
        ("shard_count", r.shard_count.into()),
        ("backfill", (&r.backfill).into()),
    ])
}

pub fn stats(s: &pb::JobStatsResponse) -> Json {
    obj([
        ("job", (&s.job).into()),
        ("runs", s.runs.into()),
        ("fired", s.fired.into()),
        ("succeeded", s.succeeded.into()),
        ("failed", s.failed.into()),
        ("timed_out", s.timed_out.into()),
        ("cancelled", s.cancelled.into()),
        ("skipped", s.skipped.into()),
        ("active", s.active.into()),
        ("lateness_runs", s.lateness_runs.into()),
        ("lateness_ms_p50", s.lateness_ms_p50.into()),
        ("lateness_ms_p99", s.lateness_ms_p99.into()),
        ("oldest_scheduled_at_ms", s.oldest_scheduled_at_ms.into()),
        ("last_run", s.last_run.as_ref().map(run).into()),
    ])
}

pub fn status(s: &pb::StatusResponse) -> Json {
    let nodes: Vec<Json> = s
        .nodes
        .iter()
        .map(|n| {
            obj([
                ("id", n.id.into()),
                ("addr", (&n.addr).into()),
                ("peer_addr", (&n.peer_addr).into()),
                ("role", (&n.role).into()),
                ("voter", n.voter.into()),
                ("applied_index", n.applied_index.into()),
                ("state_digest", (&n.state_digest).into()),
                ("digest_index", n.digest_index.into()),
                ("term", n.term.into()),
                ("clock_offset_ms", n.clock_offset_ms.into()),
                ("lag", n.lag.into()),
                ("tzdata", (&n.tzdata).into()),
                ("log_format_max", n.log_format_max.into()),
                ("refusal", (&n.refusal).into()),
            ])
        })
        .collect();
    obj([
        ("leader", s.leader.into()),
        ("membership_changing", s.membership_changing.into()),
        ("log_format", s.log_format.into()),
        ("nodes", Json::Arr(nodes)),
    ])
}

pub fn watch_event(e: &pb::WatchEvent) -> Json {
    let kind = pb::WatchEventKind::try_from(e.kind).map_or_else(
        |_| e.kind.to_string(),
        |k| short(k.as_str_name(), "WATCH_EVENT_KIND_"),
    );
    obj([
        ("index", e.index.into()),
        ("seq", e.seq.into()),
        ("kind", kind.into()),
        ("job", (&e.job).into()),
        ("group", (&e.group).into()),
        ("run_id", (&e.run_id).into()),
        ("attempt", e.attempt.into()),
        ("worker", (&e.worker).into()),
        ("outcome", run_state(e.outcome).into()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped_so_hostile_text_stays_text() {
        let v = obj([
            ("id", "a\"b\\c\n<script>&\u{1}".into()),
            ("n", Json::from(-3i64)),
            ("x", Json::Null),
        ]);
        assert_eq!(
            v.to_string(),
            r#"{"id":"a\"b\\c\n\u003cscript\u003e\u0026\u0001","n":-3,"x":null}"#
        );
        let list: Json = vec![Some(1u32), None].into();
        assert_eq!(list.with("ignored", 1u32).to_string(), "[1,null]");
    }
}
