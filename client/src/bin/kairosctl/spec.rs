//! A job's definition as `kairosctl` takes it: the flags of `job create`
//! and `job update`, and one entry of a `job apply` file, are the same
//! struct ([`SpecArgs`]), so a new job field is added here once.

use std::collections::BTreeMap;

use anyhow::{bail, Context};
use clap::parser::ValueSource;
use clap::{ArgMatches, Args};
use kairos_client::pb;
use serde::{Deserialize, Serialize};

use crate::{duration_ms, label_pair, ms_text, time_text};

/// Fields that together name the schedule: giving one replaces the others.
const SCHEDULE_FIELDS: [&str; 8] = [
    "cron",
    "tz",
    "dialect",
    "every",
    "at",
    "after",
    "also_cron",
    "also_every",
];

#[derive(Args, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SpecArgs {
    pub id: String,
    /// Cron expression: 5 fields, 6 (seconds first) or 7 (with year).
    #[arg(long, group = "schedule")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// IANA time zone for --cron (default UTC).
    #[arg(long, requires = "cron")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
    /// How --cron is read: unix (Vixie cron, weekdays 0-7 from Sunday=0) or
    /// quartz (6/7 fields, weekdays 1-7 from Sunday=1, one day field '?').
    #[arg(long, requires = "cron", value_parser = ["unix", "quartz"])]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dialect: Option<String>,
    /// Fixed rate, e.g. 200ms, 30s, 1m, 1h30m.
    #[arg(long, group = "schedule")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    /// One-shot at an RFC 3339 time, e.g. 2026-12-01T09:00:00Z.
    #[arg(long, group = "schedule")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// One-shot after a delay, e.g. 30m (not in an apply file: use `at`).
    #[arg(long, group = "schedule")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// One more cron schedule (repeatable; up to 7 more schedules in all),
    /// read in --tz and --dialect (UTC, unix without --cron). The job fires
    /// at the occurrences of all its schedules; an instant matched by
    /// several fires once.
    #[arg(long)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub also_cron: Vec<String>,
    /// One more fixed-rate schedule, e.g. 90s (repeatable, as --also-cron).
    #[arg(long)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub also_every: Vec<String>,
    /// Worker group (required on create).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Sent to the worker with each attempt (default empty).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// What to do with occurrences later than --grace (default fire-all).
    #[arg(long, value_parser = ["fire-all", "fire-once", "skip"])]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub misfire: Option<String>,
    /// Lateness beyond which the misfire policy applies (default 60s).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grace: Option<String>,
    /// Attempt deadline (default 60s).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Attempts including the first (default 1).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Base retry backoff, doubled per attempt (default 1s).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff: Option<String>,
    /// 1 (lowest) to 10 (highest) (default 5).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// When an occurrence is due while the previous runs (default allow).
    #[arg(long, value_parser = ["allow", "forbid", "buffer-one", "replace", "buffer-all"])]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlap: Option<String>,
    /// How the leader picks a worker of the group for each attempt (default least-loaded).
    #[arg(long, value_parser = ["least-loaded", "round-robin", "consistent-hash", "label"])]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// With --route label: only workers started with this label key=value (repeatable).
    #[arg(long = "route-label", value_parser = label_pair)]
    #[serde(with = "pairs_as_map", skip_serializing_if = "Vec::is_empty")]
    pub route_labels: Vec<(String, String)>,
    /// A label of the job, key=value, for `job list --selector` (repeatable,
    /// at most 16; Kubernetes label syntax). Not used for routing.
    #[arg(long = "label", value_parser = label_pair)]
    #[serde(with = "pairs_as_map", skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<(String, String)>,
    /// No occurrence before this RFC 3339 time.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_at: Option<String>,
    /// No occurrence after this RFC 3339 time; past it the job is finished.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_at: Option<String>,
    /// Finish the job after this many scheduled occurrences fired (1 to 1000000000).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_runs: Option<u64>,
    /// Runs active at once before an occurrence meets --overlap (1 to 4096;
    /// default unlimited for allow, 1 for the others). With allow, an
    /// occurrence past it is recorded skipped.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
    /// Delay each occurrence by its own offset below this, e.g. 30s
    /// (systemd RandomizedDelaySec; 1 ms to 1 h, shorter than the gap
    /// between occurrences). Stable per occurrence across failovers; 0 = none.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jitter: Option<String>,
    /// With misfire fire-all: at most this many missed occurrences run after
    /// an outage (the newest, in order); older ones are recorded skipped in
    /// one note (1 to 10000; default 100).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub catch_up_max: Option<u32>,
    /// Upstream jobs (comma-separated ids, 1 to 32): the job runs when they
    /// complete a cycle (docs/workflows.md). Without a schedule it has no
    /// schedule of its own.
    #[arg(long, value_delimiter = ',')]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub upstream: Vec<String>,
    /// With --upstream: when a cycle is complete (all-success, all-done,
    /// one-success, one-failed, none-failed; default all-success).
    #[arg(long, requires = "upstream", value_parser = ["all-success", "all-done", "one-success", "one-failed", "none-failed"])]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trigger_rule: Option<String>,
    /// With --upstream: what a failed upstream does to a cycle that needs
    /// it (block, skip, wait-for-retry; default block).
    #[arg(long, requires = "upstream", value_parser = ["block", "skip", "wait-for-retry"])]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_upstream_failure: Option<String>,
    /// Runs per occurrence with shard indexes 0..N-1 (1 to 1024).
    #[arg(long, conflicts_with = "broadcast")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shards: Option<u32>,
    /// One run per worker of the group connected when the occurrence fires.
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub broadcast: bool,
    /// Finished run records kept, 1 to 100000 (default 10000); the oldest
    /// finished ones beyond it are deleted. Active runs are always kept.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_runs: Option<u64>,
    /// Delete finished runs older than this, e.g. 7d (default: keep them
    /// regardless of age).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_for: Option<String>,
}

/// `key=value` pairs as a map in files (`route_labels = { zone = "eu" }`).
mod pairs_as_map {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
        v.iter().cloned().collect::<BTreeMap<_, _>>().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, String)>, D::Error> {
        Ok(BTreeMap::<String, String>::deserialize(d)?
            .into_iter()
            .collect())
    }
}

fn opt_ms(field: &str, s: &Option<String>) -> anyhow::Result<u64> {
    let ms = s.as_deref().map(duration_ms).transpose();
    Ok(ms.with_context(|| field.to_string())?.unwrap_or(0))
}

/// The API's job spec for `a`; fields not given are 0 (the server's default).
pub fn spec(a: &SpecArgs) -> anyhow::Result<pb::JobSpec> {
    use pb::schedule::Kind;
    let kind = if let Some(c) = &a.cron {
        Kind::Cron(pb::Cron {
            expr: c.clone(),
            tz: a.tz.clone().unwrap_or_default(),
            dialect: a.dialect.clone().unwrap_or_default(),
        })
    } else if let Some(e) = &a.every {
        Kind::EveryMs(duration_ms(e).context("every")?)
    } else if let Some(t) = a.at.as_ref().map(|t| time_ms("at", t)) {
        Kind::AtMs(t?)
    } else if let Some(d) = &a.after {
        Kind::AfterMs(duration_ms(d).context("after")?)
    } else if !a.upstream.is_empty() {
        Kind::UpstreamOnly(true)
    } else {
        bail!("schedule: give one of cron, every, at, after (or upstream)");
    };
    let also_cron = a.also_cron.iter().map(|expr| {
        Ok(Kind::Cron(pb::Cron {
            expr: expr.clone(),
            tz: a.tz.clone().unwrap_or_default(),
            dialect: a.dialect.clone().unwrap_or_default(),
        }))
    });
    let also_every =
        (a.also_every.iter()).map(|e| Ok(Kind::EveryMs(duration_ms(e).context("also_every")?)));
    let also_schedules = also_cron
        .chain(also_every)
        .map(|k| k.map(|k| pb::Schedule { kind: Some(k) }))
        .collect::<anyhow::Result<_>>()?;
    let misfire = match a.misfire.as_deref() {
        None | Some("fire-all") => pb::MisfirePolicy::FireAll,
        Some("fire-once") => pb::MisfirePolicy::FireOnce,
        Some("skip") => pb::MisfirePolicy::Skip,
        Some(m) => bail!("misfire {m:?}: expected fire-all, fire-once or skip"),
    };
    let overlap = match a.overlap.as_deref() {
        None | Some("allow") => pb::OverlapPolicy::Allow,
        Some("forbid") => pb::OverlapPolicy::Forbid,
        Some("buffer-one") => pb::OverlapPolicy::BufferOne,
        Some("replace") => pb::OverlapPolicy::Replace,
        Some("buffer-all") => pb::OverlapPolicy::BufferAll,
        Some(o) => {
            bail!("overlap {o:?}: expected allow, forbid, buffer-one, buffer-all or replace")
        }
    };
    let route = match a.route.as_deref() {
        None | Some("least-loaded") => pb::RoutePolicy::LeastLoaded,
        Some("round-robin") => pb::RoutePolicy::RoundRobin,
        Some("consistent-hash") => pb::RoutePolicy::ConsistentHash,
        Some("label") => pb::RoutePolicy::Label,
        Some(r) => {
            bail!("route {r:?}: expected least-loaded, round-robin, consistent-hash or label")
        }
    };
    Ok(pb::JobSpec {
        id: a.id.clone(),
        schedule: Some(pb::Schedule { kind: Some(kind) }),
        group: a.group.clone().unwrap_or_default(),
        payload: a.payload.clone().unwrap_or_default().into_bytes(),
        misfire: misfire as i32,
        misfire_grace_ms: opt_ms("grace", &a.grace)?,
        timeout_ms: opt_ms("timeout", &a.timeout)?,
        max_attempts: a.max_attempts.unwrap_or(0),
        backoff_ms: opt_ms("backoff", &a.backoff)?,
        priority: a.priority.unwrap_or(0),
        overlap: overlap as i32,
        route: route as i32,
        labels: a.route_labels.iter().cloned().collect(),
        shards: a.shards,
        broadcast: a.broadcast,
        keep_runs: a.keep_runs.unwrap_or(0),
        keep_for_ms: opt_ms("keep_for", &a.keep_for)?,
        start_at_ms: a
            .start_at
            .as_ref()
            .map(|t| time_ms("start_at", t))
            .transpose()?,
        end_at_ms: a
            .end_at
            .as_ref()
            .map(|t| time_ms("end_at", t))
            .transpose()?,
        max_runs: a.max_runs,
        job_labels: a.labels.iter().cloned().collect(),
        upstream: a.upstream.clone(),
        trigger_rule: a.trigger_rule.clone().unwrap_or_default(),
        on_upstream_failure: a.on_upstream_failure.clone().unwrap_or_default(),
        max_concurrent: a.max_concurrent,
        jitter_ms: Some(opt_ms("jitter", &a.jitter)?).filter(|ms| *ms > 0),
        catch_up_max: a.catch_up_max,
        also_schedules,
    })
}

/// An RFC 3339 time as unix ms; the error names `field`.
fn time_ms(field: &str, t: &str) -> anyhow::Result<i64> {
    let t = chrono::DateTime::parse_from_rfc3339(t)
        .with_context(|| format!("{field} {t:?}: expected RFC 3339"))?;
    Ok(t.timestamp_millis())
}

/// Pairs in key order.
fn sorted(m: &std::collections::HashMap<String, String>) -> Vec<(String, String)> {
    let m: BTreeMap<_, _> = m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    m.into_iter().collect()
}

/// A stored job's spec as flags, every field explicit: what `job export`
/// writes and what `job update` starts from.
pub fn args_of(s: &pb::JobSpec) -> SpecArgs {
    use pb::schedule::Kind;
    let some_ms = |ms: u64| (ms > 0).then(|| ms_text(ms));
    let mut a = SpecArgs {
        id: s.id.clone(),
        group: Some(s.group.clone()),
        payload: (!s.payload.is_empty()).then(|| String::from_utf8_lossy(&s.payload).into_owned()),
        misfire: Some(misfire_text(s.misfire).to_string()),
        grace: some_ms(s.misfire_grace_ms),
        timeout: some_ms(s.timeout_ms),
        max_attempts: Some(s.max_attempts),
        backoff: some_ms(s.backoff_ms),
        priority: Some(s.priority),
        overlap: Some(overlap_text(s.overlap).to_string()),
        route: Some(route_text(s.route).to_string()),
        route_labels: sorted(&s.labels),
        labels: sorted(&s.job_labels),
        start_at: s.start_at_ms.map(time_text),
        end_at: s.end_at_ms.map(time_text),
        max_runs: s.max_runs,
        upstream: s.upstream.clone(),
        max_concurrent: s.max_concurrent,
        jitter: s.jitter_ms.map(ms_text),
        catch_up_max: s.catch_up_max,
        trigger_rule: (!s.trigger_rule.is_empty()).then(|| s.trigger_rule.clone()),
        on_upstream_failure: (!s.on_upstream_failure.is_empty())
            .then(|| s.on_upstream_failure.clone()),
        shards: s.shards,
        broadcast: s.broadcast,
        keep_runs: Some(s.keep_runs),
        keep_for: some_ms(s.keep_for_ms),
        ..Default::default()
    };
    match s.schedule.as_ref().and_then(|s| s.kind.as_ref()) {
        Some(Kind::Cron(c)) => {
            a.cron = Some(c.expr.clone());
            a.tz = (!c.tz.is_empty()).then(|| c.tz.clone());
            a.dialect = (!c.dialect.is_empty()).then(|| c.dialect.clone());
        }
        Some(Kind::EveryMs(ms)) => a.every = Some(ms_text(*ms)),
        Some(Kind::AtMs(ms)) => a.at = Some(time_text(*ms)),
        Some(Kind::AfterMs(ms)) => a.after = Some(ms_text(*ms)),
        Some(Kind::UpstreamOnly(_)) | None => {}
    }
    for also in s.also_schedules.iter().filter_map(|s| s.kind.as_ref()) {
        match also {
            Kind::Cron(c) => a.also_cron.push(c.expr.clone()),
            Kind::EveryMs(ms) => a.also_every.push(ms_text(*ms)),
            Kind::AtMs(_) | Kind::AfterMs(_) | Kind::UpstreamOnly(_) => {}
        }
    }
    a
}

/// `current` with the fields given on the command line (per `m`) taken
/// from `given`; giving any schedule flag replaces the whole schedule.
pub fn patched(
    current: &pb::JobSpec,
    given: &SpecArgs,
    m: &ArgMatches,
) -> anyhow::Result<SpecArgs> {
    let from_cli = |id: &str| m.value_source(id) == Some(ValueSource::CommandLine);
    let serde_json::Value::Object(mut out) = serde_json::to_value(args_of(current))? else {
        bail!("a job spec is an object");
    };
    let serde_json::Value::Object(new) = serde_json::to_value(given)? else {
        bail!("a job spec is an object");
    };
    if SCHEDULE_FIELDS.iter().any(|f| from_cli(f)) {
        SCHEDULE_FIELDS.iter().for_each(|f| {
            out.remove(*f);
        });
    }
    for (k, v) in new {
        if from_cli(&k) {
            out.insert(k, v);
        }
    }
    Ok(serde_json::from_value(serde_json::Value::Object(out))?)
}

/// `s` with the server's defaults (documented in the proto) written out,
/// so a spec that leaves them 0 compares equal to the stored one.
pub fn with_defaults(mut s: pb::JobSpec) -> pb::JobSpec {
    fn or<T: Default + PartialEq>(v: &mut T, default: T) {
        if *v == T::default() {
            *v = default;
        }
    }
    or(&mut s.misfire_grace_ms, 60_000);
    or(&mut s.timeout_ms, 60_000);
    or(&mut s.max_attempts, 1);
    or(&mut s.backoff_ms, 1000);
    or(&mut s.priority, 5);
    or(&mut s.keep_runs, 10_000);
    or(&mut s.misfire, pb::MisfirePolicy::FireAll as i32);
    or(&mut s.overlap, pb::OverlapPolicy::Allow as i32);
    or(&mut s.route, pb::RoutePolicy::LeastLoaded as i32);
    let schedules = s.schedule.iter_mut().chain(s.also_schedules.iter_mut());
    for kind in schedules.filter_map(|s| s.kind.as_mut()) {
        if let pb::schedule::Kind::Cron(c) = kind {
            or(&mut c.dialect, "unix".to_string());
        }
    }
    s
}

pub fn misfire_text(m: i32) -> &'static str {
    match pb::MisfirePolicy::try_from(m).unwrap_or(pb::MisfirePolicy::Unspecified) {
        pb::MisfirePolicy::FireOnce => "fire-once",
        pb::MisfirePolicy::Skip => "skip",
        pb::MisfirePolicy::FireAll | pb::MisfirePolicy::Unspecified => "fire-all",
    }
}

pub fn overlap_text(o: i32) -> &'static str {
    match pb::OverlapPolicy::try_from(o).unwrap_or(pb::OverlapPolicy::Unspecified) {
        pb::OverlapPolicy::Forbid => "forbid",
        pb::OverlapPolicy::BufferOne => "buffer-one",
        pb::OverlapPolicy::Replace => "replace",
        pb::OverlapPolicy::BufferAll => "buffer-all",
        pb::OverlapPolicy::Allow | pb::OverlapPolicy::Unspecified => "allow",
    }
}

pub fn route_text(r: i32) -> &'static str {
    match pb::RoutePolicy::try_from(r).unwrap_or(pb::RoutePolicy::Unspecified) {
        pb::RoutePolicy::RoundRobin => "round-robin",
        pb::RoutePolicy::ConsistentHash => "consistent-hash",
        pb::RoutePolicy::Label => "label",
        pb::RoutePolicy::LeastLoaded | pb::RoutePolicy::Unspecified => "least-loaded",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches, Parser};

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        spec: SpecArgs,
    }

    fn stored() -> pb::JobSpec {
        let a = SpecArgs {
            id: "j".into(),
            cron: Some("*/5 * * * *".into()),
            tz: Some("Europe/Paris".into()),
            group: Some("g".into()),
            priority: Some(7),
            route: Some("label".into()),
            route_labels: vec![("zone".into(), "eu".into())],
            keep_for: Some("7d".into()),
            ..Default::default()
        };
        with_defaults(spec(&a).unwrap())
    }

    fn patch(args: &[&str]) -> SpecArgs {
        let m = Cmd::command().get_matches_from(args);
        let given = Cmd::from_arg_matches(&m).unwrap().spec;
        patched(&stored(), &given, &m).unwrap()
    }

    #[test]
    fn a_stored_spec_round_trips_through_args() {
        assert_eq!(with_defaults(spec(&args_of(&stored())).unwrap()), stored());
    }

    #[test]
    fn update_changes_only_the_flags_given() {
        let p = patch(&["x", "j", "--priority", "2"]);
        let want = pb::JobSpec {
            priority: 2,
            ..stored()
        };
        assert_eq!(with_defaults(spec(&p).unwrap()), want);
        // A schedule flag replaces the schedule (the cron's tz goes with it).
        let p = patch(&["x", "j", "--every", "30s"]);
        assert_eq!((p.cron, p.tz, p.every), (None, None, Some("30s".into())));
        assert_eq!(p.route_labels, vec![("zone".to_string(), "eu".to_string())]);
    }

    #[test]
    fn more_schedules_round_trip_and_a_schedule_flag_replaces_them_all() {
        let m = Cmd::command().get_matches_from([
            "x",
            "j",
            "--cron",
            "0 * * * *",
            "--tz",
            "Europe/Paris",
            "--also-every",
            "90s",
            "--also-cron",
            "30 * * * *",
            "--also-cron",
            "45 * * * *",
        ]);
        let a = Cmd::from_arg_matches(&m).unwrap().spec;
        let s = with_defaults(spec(&a).unwrap());
        let kinds: Vec<_> = s.also_schedules.iter().map(|s| s.kind.clone()).collect();
        let cron = |expr: &str| {
            Some(pb::schedule::Kind::Cron(pb::Cron {
                expr: expr.into(),
                tz: "Europe/Paris".into(),
                dialect: "unix".into(),
            }))
        };
        let every = Some(pb::schedule::Kind::EveryMs(90_000));
        assert_eq!(kinds, vec![cron("30 * * * *"), cron("45 * * * *"), every]);
        assert_eq!(with_defaults(spec(&args_of(&s)).unwrap()), s);
        // An apply file lists them the same way.
        let file: SpecArgs = toml::from_str(
            "id = \"j\"\nevery = \"1m\"\nalso_cron = [\"30 * * * *\"]\nalso_every = [\"90s\"]",
        )
        .unwrap();
        assert_eq!(spec(&file).unwrap().also_schedules.len(), 2);
        let p = patch(&["x", "j", "--also-every", "1h"]);
        assert_eq!(
            (p.cron, p.also_cron, p.also_every),
            (None, vec![], vec!["1h".into()])
        );
    }
}
