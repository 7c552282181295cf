//! The one place where wire (protobuf) types and domain types meet.

use kairos_proto::v1 as pb;
use tonic::Status;

use crate::core::query::JobFilter;
use crate::core::stats::JobStats;
use crate::core::{
    limits, validate, Backfill, BackfillOverlap, Bounds, Fanout, Jitter, Job, JobSpec, JobState,
    Labels, Misfire, OnUpstreamFailure, Overlap, PauseNote, Policy, Route, Run, RunState,
    ScheduleInput, TriggerRule, Workflow,
};

fn invalid(msg: impl Into<String>) -> Status {
    Status::invalid_argument(msg.into())
}

pub fn schedule_in(s: Option<pb::Schedule>) -> Result<ScheduleInput, Status> {
    use pb::schedule::Kind;
    match s.and_then(|s| s.kind) {
        None => Err(invalid(
            "schedule: required (one of cron, every_ms, at_ms, after_ms)",
        )),
        Some(Kind::Cron(c)) => match c.dialect.as_str() {
            "quartz" => Ok(ScheduleInput::Quartz {
                expr: c.expr,
                tz: c.tz,
            }),
            "" if crate::core::schedule::looks_like_quartz(&c.expr) => Err(invalid(
                "schedule.cron.dialect: the expression has a '?' day field (Quartz syntax), whose \
                 weekday numbers differ from unix cron (Quartz 1-7 = SUN-SAT); set dialect \
                 \"quartz\" (or \"unix\" to read it as Vixie cron)",
            )),
            "" | "unix" => Ok(ScheduleInput::Cron {
                expr: c.expr,
                tz: c.tz,
            }),
            other => Err(invalid(format!(
                "schedule.cron.dialect: must be \"unix\" or \"quartz\", got {:?}",
                other.chars().take(32).collect::<String>()
            ))),
        },
        Some(Kind::EveryMs(ms)) => Ok(ScheduleInput::Every { every_ms: ms }),
        Some(Kind::AtMs(ms)) => Ok(ScheduleInput::At { at_ms: ms }),
        Some(Kind::AfterMs(ms)) => Ok(ScheduleInput::After { after_ms: ms }),
        Some(Kind::UpstreamOnly(_)) => Ok(ScheduleInput::Upstream),
    }
}

fn or_default<T: PartialEq + Default>(v: T, d: T) -> T {
    if v == T::default() {
        d
    } else {
        v
    }
}

pub fn policy_in(s: &pb::JobSpec) -> Result<Policy, Status> {
    let misfire = match pb::MisfirePolicy::try_from(s.misfire) {
        Ok(pb::MisfirePolicy::Unspecified | pb::MisfirePolicy::FireAll) => Misfire::FireAll,
        Ok(pb::MisfirePolicy::FireOnce) => Misfire::FireOnce,
        Ok(pb::MisfirePolicy::Skip) => Misfire::Skip,
        Err(_) => {
            return Err(invalid(format!(
                "misfire: unknown policy value {}",
                s.misfire
            )))
        }
    };
    let overlap = match pb::OverlapPolicy::try_from(s.overlap) {
        Ok(pb::OverlapPolicy::Unspecified | pb::OverlapPolicy::Allow) => Overlap::Allow,
        Ok(pb::OverlapPolicy::Forbid) => Overlap::Forbid,
        Ok(pb::OverlapPolicy::BufferOne) => Overlap::BufferOne,
        Ok(pb::OverlapPolicy::Replace) => Overlap::Replace,
        Ok(pb::OverlapPolicy::BufferAll) => Overlap::BufferAll,
        Err(_) => {
            return Err(invalid(format!(
                "overlap: unknown policy value {}",
                s.overlap
            )))
        }
    };
    let priority = or_default(s.priority, limits::DEFAULT_PRIORITY as u32);
    if priority > 10 {
        return Err(invalid(format!(
            "priority: must be between 1 and 10, got {priority}"
        )));
    }
    Ok(Policy {
        route: route_in(s)?,
        fanout: fanout_in(s)?,
        misfire,
        misfire_grace_ms: or_default(s.misfire_grace_ms, limits::DEFAULT_GRACE_MS),
        timeout_ms: or_default(s.timeout_ms, limits::DEFAULT_TIMEOUT_MS),
        max_attempts: or_default(s.max_attempts, 1),
        backoff_ms: or_default(s.backoff_ms, limits::DEFAULT_BACKOFF_MS),
        priority: priority as u8,
        overlap,
        keep_runs: or_default(s.keep_runs, limits::KEEP_RUNS_DEFAULT),
        keep_for_ms: s.keep_for_ms,
    })
}

fn route_in(s: &pb::JobSpec) -> Result<Route, Status> {
    let route = match pb::RoutePolicy::try_from(s.route) {
        Ok(pb::RoutePolicy::Unspecified | pb::RoutePolicy::LeastLoaded) => Route::LeastLoaded,
        Ok(pb::RoutePolicy::RoundRobin) => Route::RoundRobin,
        Ok(pb::RoutePolicy::ConsistentHash) => Route::ConsistentHash,
        Ok(pb::RoutePolicy::Label) => {
            return Ok(Route::Label(s.labels.clone().into_iter().collect()));
        }
        Err(_) => return Err(invalid(format!("route: unknown policy value {}", s.route))),
    };
    if !s.labels.is_empty() {
        return Err(invalid(format!(
            "labels: a label selector needs route label, got route {}",
            route.as_str()
        )));
    }
    Ok(route)
}

fn fanout_in(s: &pb::JobSpec) -> Result<Fanout, Status> {
    match (s.shards, s.broadcast) {
        (Some(_), true) => Err(invalid("shards: give either shards or broadcast, not both")),
        (Some(n), false) => Ok(Fanout::Shards(n)),
        (None, true) => Ok(Fanout::Broadcast),
        (None, false) => Ok(Fanout::One),
    }
}

pub fn spec_in(s: Option<pb::JobSpec>) -> Result<JobSpec, Status> {
    let s = s.ok_or_else(|| invalid("spec: required"))?;
    let policy = policy_in(&s)?;
    Ok(JobSpec {
        schedule: schedule_in(s.schedule)?,
        id: s.id,
        group: s.group,
        payload: s.payload,
        policy,
        bounds: Bounds {
            start_at_ms: s.start_at_ms,
            end_at_ms: s.end_at_ms,
            max_runs: s.max_runs,
        },
        labels: s.job_labels.into_iter().collect(),
        workflow: workflow_in(s.upstream, &s.trigger_rule, &s.on_upstream_failure)?,
        max_concurrent: s.max_concurrent,
        // The seed is the leader's to draw (`Api::with_seed`).
        jitter: s.jitter_ms.map(|ms| Jitter { ms, seed: 0 }),
        catch_up_max: s.catch_up_max,
        also: s
            .also_schedules
            .into_iter()
            .enumerate()
            .map(|(i, a)| {
                schedule_in(Some(a))
                    .map_err(|e| invalid(format!("also_schedules[{i}]: {}", e.message())))
            })
            .collect::<Result<_, _>>()?,
    })
}

fn workflow_in(
    upstream: Vec<String>,
    rule: &str,
    on_failure: &str,
) -> Result<Option<Workflow>, Status> {
    if upstream.is_empty() {
        return match (rule, on_failure) {
            ("", "") => Ok(None),
            ("", _) => Err(invalid(
                "on_upstream_failure: only for a job with upstream jobs",
            )),
            _ => Err(invalid("trigger_rule: only for a job with upstream jobs")),
        };
    }
    let names = |all: &[&str]| all.join(", ");
    let rule = match rule {
        "" => TriggerRule::default(),
        r => TriggerRule::parse(r).ok_or_else(|| {
            let all: Vec<&str> = TriggerRule::ALL.iter().map(|r| r.as_str()).collect();
            invalid(format!(
                "trigger_rule: must be one of {}, got {:?}",
                names(&all),
                r.chars().take(32).collect::<String>()
            ))
        })?,
    };
    let on_failure = match on_failure {
        "" => OnUpstreamFailure::default(),
        f => OnUpstreamFailure::parse(f).ok_or_else(|| {
            let all: Vec<&str> = OnUpstreamFailure::ALL.iter().map(|f| f.as_str()).collect();
            invalid(format!(
                "on_upstream_failure: must be one of {}, got {:?}",
                names(&all),
                f.chars().take(32).collect::<String>()
            ))
        })?,
    };
    Ok(Some(Workflow {
        upstream,
        rule,
        on_failure,
    }))
}

fn schedule_out(s: &crate::core::Schedule) -> pb::Schedule {
    use crate::core::Schedule as S;
    use pb::schedule::Kind;
    let kind = match s {
        S::Cron { expr, tz } => Kind::Cron(pb::Cron {
            expr: expr.clone(),
            tz: tz.clone(),
            dialect: "unix".into(),
        }),
        S::Quartz { expr, tz } => Kind::Cron(pb::Cron {
            expr: expr.clone(),
            tz: tz.clone(),
            dialect: "quartz".into(),
        }),
        S::Every { every_ms, .. } => Kind::EveryMs(*every_ms),
        S::Once { at_ms } => Kind::AtMs(*at_ms),
        S::Upstream => Kind::UpstreamOnly(true),
        // Its members travel one by one (`job_out`).
        S::Union(members) => return members.first().map_or_else(Default::default, schedule_out),
    };
    pb::Schedule { kind: Some(kind) }
}

pub fn job_out(j: &Job) -> pb::Job {
    let p = &j.policy;
    let misfire = match p.misfire {
        Misfire::FireAll => pb::MisfirePolicy::FireAll,
        Misfire::FireOnce => pb::MisfirePolicy::FireOnce,
        Misfire::Skip => pb::MisfirePolicy::Skip,
    };
    let overlap = match p.overlap {
        Overlap::Allow => pb::OverlapPolicy::Allow,
        Overlap::Forbid => pb::OverlapPolicy::Forbid,
        Overlap::BufferOne => pb::OverlapPolicy::BufferOne,
        Overlap::Replace => pb::OverlapPolicy::Replace,
        Overlap::BufferAll => pb::OverlapPolicy::BufferAll,
    };
    let spec = pb::JobSpec {
        id: j.id.clone(),
        schedule: Some(schedule_out(&j.schedule)),
        also_schedules: j
            .schedule
            .members()
            .iter()
            .skip(1)
            .map(schedule_out)
            .collect(),
        group: j.group.clone(),
        payload: j.payload.clone(),
        misfire: misfire as i32,
        misfire_grace_ms: p.misfire_grace_ms,
        timeout_ms: p.timeout_ms,
        max_attempts: p.max_attempts,
        backoff_ms: p.backoff_ms,
        priority: p.priority as u32,
        overlap: overlap as i32,
        route: route_out(&p.route) as i32,
        labels: match &p.route {
            Route::Label(sel) => sel.clone().into_iter().collect(),
            _ => Default::default(),
        },
        shards: match p.fanout {
            Fanout::Shards(n) => Some(n),
            _ => None,
        },
        broadcast: p.fanout == Fanout::Broadcast,
        keep_runs: p.keep_runs,
        keep_for_ms: p.keep_for_ms,
        start_at_ms: j.bounds.start_at_ms,
        end_at_ms: j.bounds.end_at_ms,
        max_runs: j.bounds.max_runs,
        job_labels: j.labels.clone().into_iter().collect(),
        upstream: j.workflow.iter().flat_map(|w| w.upstream.clone()).collect(),
        trigger_rule: j
            .workflow
            .as_ref()
            .map(|w| w.rule.as_str().into())
            .unwrap_or_default(),
        on_upstream_failure: j
            .workflow
            .as_ref()
            .map(|w| w.on_failure.as_str().into())
            .unwrap_or_default(),
        max_concurrent: j.max_concurrent,
        jitter_ms: j.jitter.map(|jt| jt.ms),
        catch_up_max: j.catch_up_max,
    };
    let pause = j.pause.clone().unwrap_or(PauseNote {
        note: String::new(),
        by: String::new(),
        at_ms: 0,
    });
    pb::Job {
        spec: Some(spec),
        revision: j.revision,
        paused: j.paused,
        created_at_ms: j.created_at_ms,
        updated_at_ms: j.updated_at_ms,
        next_fire_at_ms: j.next_fire_at_ms.unwrap_or(0),
        state: j.state().as_str().into(),
        fired_count: j.fired_count,
        finished_at_ms: j.finished_at_ms.unwrap_or(0),
        pause_note: pause.note,
        paused_by: pause.by,
        paused_at_ms: pause.at_ms,
        workflow_state: j
            .workflow
            .as_ref()
            .map(|w| j.cycle.describe(w))
            .unwrap_or_default(),
        downstream: Vec::new(),
        queued_at_ms: j.queued.clone(),
        backfill: j.backfill.as_ref().map(backfill_out),
        next_offset_ms: j.next_offset_ms,
    }
}

fn backfill_out(b: &Backfill) -> pb::Backfill {
    pb::Backfill {
        from_ms: b.from_ms,
        to_ms: b.to_ms,
        overlap: b.overlap.as_str().into(),
        state: b.state().into(),
        total: b.total,
        started: b.started,
        existing: b.existing,
        skipped: b.skipped,
        next_at_ms: b.next_ms.filter(|_| b.in_progress()).unwrap_or(0),
        started_by: b.by.clone(),
        started_at_ms: b.started_at_ms,
        ended_at_ms: b.ended_at_ms.unwrap_or(0),
    }
}

/// `BackfillJobRequest.overlap` (empty: buffer-all).
pub fn backfill_overlap_in(s: &str) -> Result<BackfillOverlap, Status> {
    if s.is_empty() {
        return Ok(BackfillOverlap::default());
    }
    BackfillOverlap::parse(s).ok_or_else(|| {
        let names: Vec<&str> = BackfillOverlap::ALL.iter().map(|o| o.as_str()).collect();
        invalid(format!("overlap: {s:?} is not one of {}", names.join(", ")))
    })
}

/// A run as the API shows it, with the range of the backfill that created it.
pub fn run_marked_out(r: &Run, backfill: Option<(i64, i64)>) -> pb::Run {
    pb::Run {
        backfill: backfill
            .map(|(from, to)| format!("[{from}, {to})"))
            .unwrap_or_default(),
        ..run_out(r)
    }
}

pub fn firing_out(p: Option<PauseNote>) -> pb::FiringStatus {
    match p {
        Some(p) => pb::FiringStatus {
            paused: true,
            note: p.note,
            by: p.by,
            at_ms: p.at_ms,
        },
        None => pb::FiringStatus::default(),
    }
}

/// The filters of a `ListJobs` request; each refusal names its field.
pub fn job_filter_in(r: &pb::ListJobsRequest) -> Result<JobFilter, Status> {
    let state = match r.state.as_str() {
        "" => None,
        s => Some(JobState::parse(s).ok_or_else(|| {
            invalid(format!(
                "state: must be active, paused or finished, got {:?}",
                s.chars().take(32).collect::<String>()
            ))
        })?),
    };
    if !r.group.is_empty() {
        validate::name("group", &r.group, limits::GROUP_MAX_BYTES)
            .map_err(super::error::command)?;
    }
    if !r.id_prefix.is_empty() {
        validate::name("id_prefix", &r.id_prefix, limits::ID_MAX_BYTES)
            .map_err(super::error::command)?;
    }
    Ok(JobFilter {
        group: (!r.group.is_empty()).then(|| r.group.clone()),
        selector: selector_in(&r.selector)?,
        state,
        id_prefix: r.id_prefix.clone(),
    })
}

/// `k=v,k2=v2`: at most `LIST_SELECTOR_MAX` pairs, in label syntax.
fn selector_in(text: &str) -> Result<Labels, Status> {
    let mut sel = Labels::new();
    if text.is_empty() {
        return Ok(sel);
    }
    for pair in text.split(',') {
        let (k, v) = pair.split_once('=').ok_or_else(|| {
            invalid(format!(
                "selector: {:?} is not key=value",
                pair.chars().take(64).collect::<String>()
            ))
        })?;
        validate::label_key("selector (key)", k).map_err(super::error::command)?;
        validate::label_value("selector (value)", v).map_err(super::error::command)?;
        sel.insert(k.to_string(), v.to_string());
        if sel.len() > limits::LIST_SELECTOR_MAX {
            return Err(invalid(format!(
                "selector: at most {} pairs",
                limits::LIST_SELECTOR_MAX
            )));
        }
    }
    Ok(sel)
}

fn route_out(r: &Route) -> pb::RoutePolicy {
    match r {
        Route::LeastLoaded => pb::RoutePolicy::LeastLoaded,
        Route::RoundRobin => pb::RoutePolicy::RoundRobin,
        Route::ConsistentHash => pb::RoutePolicy::ConsistentHash,
        Route::Label(_) => pb::RoutePolicy::Label,
    }
}

pub fn run_state_out(s: RunState) -> pb::RunState {
    match s {
        RunState::Pending | RunState::RetryWait => pb::RunState::Pending,
        RunState::Running => pb::RunState::Running,
        RunState::Succeeded => pb::RunState::Succeeded,
        RunState::Failed => pb::RunState::Failed,
        RunState::TimedOut => pb::RunState::TimedOut,
        RunState::Skipped => pb::RunState::Skipped,
        RunState::Cancelled => pb::RunState::Cancelled,
    }
}

pub fn run_out(r: &Run) -> pb::Run {
    pb::Run {
        run_id: r.id.to_string(),
        job: r.id.job.clone(),
        scheduled_at_ms: r.id.scheduled_at_ms,
        fired_at_ms: r.fired_at_ms,
        state: run_state_out(r.state) as i32,
        attempt: r.attempt,
        worker: r.worker.clone(),
        finished_at_ms: r.finished_at_ms,
        result: r.result.clone(),
        error: r.error.clone(),
        note: if r.state == RunState::RetryWait && r.note.is_empty() {
            "waiting to retry".into()
        } else {
            r.note.clone()
        },
        received_at_ms: r.received_at_ms,
        shard: r.id.shard,
        shard_count: r.shard_count,
        upstream_runs: Vec::new(),
        backfill: String::new(),
        offset_ms: r.offset_ms,
    }
}

/// Page size rule shared by every list call.
pub fn job_stats_out(job: &str, st: &JobStats) -> pb::JobStatsResponse {
    pb::JobStatsResponse {
        job: job.to_string(),
        runs: st.runs,
        fired: st.fired,
        succeeded: st.succeeded,
        failed: st.failed,
        timed_out: st.timed_out,
        cancelled: st.cancelled,
        skipped: st.skipped,
        active: st.active,
        lateness_runs: st.lateness_runs,
        lateness_ms_p50: st.lateness_ms_p50,
        lateness_ms_p99: st.lateness_ms_p99,
        oldest_scheduled_at_ms: st.oldest_scheduled_at_ms.unwrap_or(0),
        last_run: st.last_run.as_ref().map(run_out),
    }
}

pub fn page_size(requested: u32) -> Result<usize, Status> {
    match requested as usize {
        0 => Ok(limits::PAGE_SIZE_DEFAULT),
        n if n <= limits::PAGE_SIZE_MAX => Ok(n),
        n => Err(invalid(format!(
            "page_size: at most {}, got {n}",
            limits::PAGE_SIZE_MAX
        ))),
    }
}

pub fn watch_event_out(e: &crate::watch::Event) -> pb::WatchEvent {
    use crate::core::JobChange as J;
    use crate::watch::Change;
    use pb::WatchEventKind as K;
    let mut out = pb::WatchEvent {
        index: e.at.index,
        seq: e.at.seq,
        job: e.job.clone(),
        group: e.group.clone(),
        ..Default::default()
    };
    let (kind, run) = match &e.change {
        Change::Job(c) => {
            let kind = match c {
                J::Created => K::JobCreated,
                J::Updated => K::JobUpdated,
                J::Deleted => K::JobDeleted,
                J::Paused => K::JobPaused,
                J::Resumed => K::JobResumed,
            };
            (kind, None)
        }
        Change::Fired { run, attempt } => (K::RunFired, Some((run, *attempt))),
        Change::Assigned {
            run,
            attempt,
            worker,
        } => {
            out.worker = worker.clone();
            (K::RunAssigned, Some((run, *attempt)))
        }
        Change::Finished {
            run,
            attempt,
            worker,
            outcome,
        } => {
            out.worker = worker.clone();
            out.outcome = run_state_out(*outcome) as i32;
            (K::RunFinished, Some((run, *attempt)))
        }
    };
    out.kind = kind as i32;
    if let Some((run, attempt)) = run {
        out.run_id = run.to_string();
        out.attempt = attempt;
    }
    out
}
