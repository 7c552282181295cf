//! `overload`: graceful saturation, on one cluster in two phases. The peak
//! phase offers the saturating load (`--rate`, default 5,000 fires/s: 90 %
//! from interval jobs every `--every-ms`, 10 % from one-shot timers created
//! one second ahead) for `PEAK_PHASE` (20 s, or `--duration` if shorter) and
//! measures delivered fires/s. The
//! overload phase then offers `OVERLOAD_FACTOR` times that for `--duration`
//! (default 60 s), the load of `throughput` at 25,000 offered: the missing
//! interval jobs are created by `--clients` concurrent clients (as in
//! `throughput`) while one-shots are fed open loop (each tick's creates
//! start whether or not earlier ones were answered, up to `IN_FLIGHT_MAX`). Every create goes through
//! the SDK, which waits out `RESOURCE_EXHAUSTED` refusals as hinted.
//! Reported: delivered fires/s of both phases and their ratio, elections
//! (term changes), the answer time of every create attempt (p50/p99/max and
//! the share answered within 1 s), refusals, and state writes per fire.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kairos_client::pb::schedule::Kind;
use kairos_client::Client;
use tonic::Code;

use super::{elections, max_term, report_costs, report_lateness, report_nodes, Target};
use crate::load::{self, create_jobs, spec, wall_ms, Attempts, CreateStats, Workers};
use crate::stats::{summarize, Report};
use crate::Opts;

const GROUP: &str = "ov";
const OVERLOAD_FACTOR: u64 = 5;
const ONESHOT_SHARE: f64 = 0.1;
const ONESHOT_LEAD_MS: i64 = 1000;
const FEED_TICK: Duration = Duration::from_millis(100);
const PEAK_PHASE: Duration = Duration::from_secs(20);
const WARM: Duration = Duration::from_secs(3);
/// One-shot creates the open-loop feed keeps in flight at most.
const IN_FLIGHT_MAX: usize = 4096;
/// Every create attempt should be answered (ok or refused) within this.
const ANSWER_TARGET_MS: i64 = 1000;
/// How many slow create attempts the report lists by when they started.
const SLOW_LISTED: usize = 50;
/// How long creates still in flight at the end of a phase may take.
const SETTLE: Duration = Duration::from_secs(15);
const SETUP_LIMIT: Duration = Duration::from_secs(300);
/// How often the apply backlog is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// What one phase offered and got.
struct Phase {
    fires_per_s: f64,
    elections: u64,
    /// Log entries appended but not applied, the most of any node, sampled.
    backlog: Vec<i64>,
    /// The leader's fire allowance (due keys let into the log at once), sampled.
    allowance: Vec<i64>,
    /// Entries applied per second (by the node that applied the most).
    applied_per_s: f64,
    /// This load generator's own CPU (workers included), % of one core.
    bench_cpu_pct: Option<f64>,
    creates: CreateStats,
    oneshots: CreateStats,
    attempts: Arc<Attempts>,
}

pub async fn run(o: &Opts) -> anyhow::Result<Report> {
    let dur = o.duration.unwrap_or(Duration::from_secs(60));
    let rate = o.rate.unwrap_or(5_000).max(1);
    let every = o.every_ms.unwrap_or(1000).max(1);
    let jobs_for = |rate: u64| {
        ((rate as f64 * (1.0 - ONESHOT_SHARE) * every as f64 / 1000.0).round() as u64).max(1)
    };
    let (n_peak, n_over) = (jobs_for(rate), jobs_for(rate * OVERLOAD_FACTOR));
    let oneshots = |rate: u64| (rate as f64 * ONESHOT_SHARE).round() as u64;
    let t = Target::new(o).await?;
    let workers = Workers::start(&t.endpoints, GROUP, o.workers, o.capacity);
    let setup = load::clients(&t.endpoints, o.clients).await?;
    eprintln!("overload: creating {n_peak} interval jobs every {every} ms");
    let cs = create_jobs(&setup, interval_specs(0..n_peak, every), o.in_flight(), {
        Instant::now() + SETUP_LIMIT
    })
    .await;
    let setup_note = (cs.ok + cs.existed < n_peak).then(|| {
        let made = cs.ok + cs.existed;
        format!(
            "setup created {made} of {n_peak} interval jobs; first error: {:?}",
            cs.first_error
        )
    });
    tokio::time::sleep(WARM).await;
    let peak_dur = dur.min(PEAK_PHASE);
    eprintln!("overload: peak phase, {rate} fires/s offered for {peak_dur:?}");
    let peak_jobs = n_peak..n_peak;
    let peak = phase(o, &t, &workers, peak_jobs, oneshots(rate), peak_dur).await?;
    let offered = rate * OVERLOAD_FACTOR;
    eprintln!("overload: {offered} fires/s offered for {dur:?}");
    let (before, w0) = (t.samples(), wall_ms());
    let costs0 = t.costs().await;
    let over = phase(o, &t, &workers, n_peak..n_over, oneshots(offered), dur).await?;
    let (after, w1) = (t.samples(), wall_ms());
    let costs1 = t.costs().await;
    let recs = workers.rec.snapshot();
    let win: Vec<_> = (recs.iter())
        .filter(|x| x.received_at_ms >= w0 && x.received_at_ms < w1)
        .collect();
    let mut r = Report::new("overload");
    r.set("peak_offered_fires_per_s", rate);
    r.set("peak_fires_per_s", peak.fires_per_s);
    r.set("peak_elections", peak.elections);
    r.set("peak_bench_cpu_pct", serde_json::json!(peak.bench_cpu_pct));
    r.set("duration_s", dur.as_secs_f64());
    r.set("offered_fires_per_s", offered);
    r.set("interval_jobs", n_over);
    r.set("fires_per_s", over.fires_per_s);
    r.set(
        "fires_vs_peak",
        over.fires_per_s / peak.fires_per_s.max(1e-9),
    );
    r.set("elections", over.elections);
    r.set("bench_cpu_pct", serde_json::json!(over.bench_cpu_pct));
    report_creates(&mut r, &over);
    r.summary(
        "apply_backlog_entries",
        summarize(&mut over.backlog.clone()),
    );
    r.set("applied_entries_per_s", over.applied_per_s);
    r.summary(
        "fire_allowance_keys",
        summarize(&mut over.allowance.clone()),
    );
    report_lateness(&mut r, &win);
    report_nodes(&mut r, &before, &after);
    report_costs(&mut r, &costs0, &costs1, win.len());
    if let Some(n) = setup_note {
        r.note(n);
    }
    if let Some(e) = over.creates.first_error.as_ref() {
        r.note(format!("interval create error: {e}"));
    }
    workers.stop().await;
    Ok(r)
}

fn interval_specs(ids: Range<u64>, every: u64) -> impl Iterator<Item = kairos_client::pb::JobSpec> {
    ids.map(move |i| spec(format!("ov-{i}"), GROUP, Kind::EveryMs(every)))
}

/// Offers `jobs` (closed loop) and `oneshot_rate` one-shots per second
/// (open loop) for `dur`; measures delivered fires/s and term changes.
async fn phase(
    o: &Opts,
    t: &Target,
    workers: &Workers,
    jobs: Range<u64>,
    oneshot_rate: u64,
    dur: Duration,
) -> anyhow::Result<Phase> {
    let attempts = Arc::new(Attempts::default());
    let clients = Arc::new(load::observed_clients(&t.endpoints, o.clients, &attempts).await?);
    let status = Client::new(t.endpoints.clone());
    let term0 = max_term(t, &status).await;
    let applied0 = t.metric("kairos_raft_applied_index").await;
    let (w0, start) = (wall_ms(), Instant::now());
    let me0 = crate::procfs::sample(std::process::id());
    let burst = {
        let (clients, every) = (clients.clone(), o.every_ms.unwrap_or(1000).max(1));
        let (specs, concurrency) = (interval_specs(jobs, every), o.clients);
        tokio::spawn(async move { create_jobs(&clients, specs, concurrency, start + dur).await })
    };
    let prefix = format!("ov-once-{w0}");
    let feed = tokio::spawn(feed_open_loop(clients.clone(), prefix, oneshot_rate, dur));
    let (mut backlog, mut allowance) = (Vec::new(), Vec::new());
    while start.elapsed() < dur {
        tokio::time::sleep(SAMPLE_EVERY.min(dur.saturating_sub(start.elapsed()))).await;
        backlog.extend(apply_backlog(t).await);
        let keys = t.metric("kairos_fire_allowance_keys").await;
        allowance.extend(keys.iter().map(|(_, v)| *v as i64).max().filter(|v| *v > 0));
    }
    let w1 = wall_ms();
    let me1 = crate::procfs::sample(std::process::id());
    let term1 = max_term(t, &status).await;
    let applied1 = t.metric("kairos_raft_applied_index").await;
    let applied = (applied1.iter())
        .filter_map(|(id, b)| Some(b - applied0.iter().find(|(i, _)| i == id)?.1))
        .fold(0.0, f64::max);
    let received = (workers.rec.snapshot().iter())
        .filter(|x| x.received_at_ms >= w0 && x.received_at_ms < w1)
        .count();
    let creates = tokio::time::timeout(SETTLE, burst).await;
    let oneshots = tokio::time::timeout(SETTLE, feed).await;
    Ok(Phase {
        fires_per_s: received as f64 * 1000.0 / (w1 - w0).max(1) as f64,
        elections: elections(term0, term1),
        backlog,
        allowance,
        applied_per_s: applied / dur.as_secs_f64(),
        bench_cpu_pct: me0
            .zip(me1)
            .map(|(a, b)| crate::procfs::cpu_percent(&a, &b)),
        creates: creates.ok().and_then(Result::ok).unwrap_or_default(),
        oneshots: oneshots.ok().and_then(Result::ok).unwrap_or_default(),
        attempts,
    })
}

/// The largest apply backlog (last log index minus applied index) of the
/// local nodes, if any node answered.
async fn apply_backlog(t: &Target) -> Option<i64> {
    let last = t.metric("kairos_raft_last_log_index").await;
    let applied = t.metric("kairos_raft_applied_index").await;
    (last.iter())
        .filter_map(|(id, l)| Some(*l as i64 - applied.iter().find(|(i, _)| i == id)?.1 as i64))
        .max()
}

/// Creates one-shot timers due `ONESHOT_LEAD_MS` ahead at `rate`/s for
/// `dur`, starting each tick's creates without waiting for earlier ones
/// (at most `IN_FLIGHT_MAX` in flight; the rest count as `skipped`).
async fn feed_open_loop(
    clients: Arc<Vec<Client>>,
    prefix: String,
    rate: u64,
    dur: Duration,
) -> CreateStats {
    let per_tick = (rate as f64 * FEED_TICK.as_secs_f64()).round() as u64;
    let (start, mut next_id) = (Instant::now(), 0u64);
    let tally = Arc::new(Tally::default());
    let mut tick = tokio::time::interval(FEED_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while per_tick > 0 && start.elapsed() < dur {
        tick.tick().await;
        let at = wall_ms() + ONESHOT_LEAD_MS;
        for _ in 0..per_tick {
            next_id += 1;
            if tally.in_flight.load(Ordering::Relaxed) >= IN_FLIGHT_MAX {
                tally.skipped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let c = clients[next_id as usize % clients.len()].clone();
            let spec = spec(format!("{prefix}-{next_id}"), GROUP, Kind::AtMs(at));
            tally.in_flight.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(tally.clone().create(c, spec));
        }
    }
    let settle = Instant::now() + SETTLE;
    while tally.in_flight.load(Ordering::Relaxed) > 0 && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut st = tally.stats();
    st.elapsed = start.elapsed();
    st
}

/// Outcomes of open-loop creates.
#[derive(Default)]
struct Tally {
    in_flight: AtomicUsize,
    ok: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    skipped: AtomicU64,
}

impl Tally {
    async fn create(self: Arc<Self>, c: Client, spec: kairos_client::pb::JobSpec) {
        let req = kairos_client::pb::CreateJobRequest { spec: Some(spec) };
        let res = c
            .jobs(|mut j| {
                let r = req.clone();
                async move { j.create_job(r).await }
            })
            .await;
        let counter = match res {
            Ok(_) => &self.ok,
            Err(e) if e.code() == Code::ResourceExhausted => &self.refused,
            Err(_) => &self.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    fn stats(&self) -> CreateStats {
        CreateStats {
            ok: self.ok.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            ..Default::default()
        }
    }
}

/// Create calls (interval burst and one-shots) and their attempts.
fn report_creates(r: &mut Report, p: &Phase) {
    let (c, s) = (&p.creates, &p.oneshots);
    r.set("interval_jobs_created", c.ok + c.existed);
    r.set("interval_create_s", c.elapsed.as_secs_f64());
    r.set("oneshots_created", s.ok);
    r.set("creates_refused_after_retries", c.refused + s.refused);
    r.set("create_failures", c.failed + s.failed);
    r.set("creates_not_sent", c.skipped + s.skipped);
    let a = &p.attempts;
    r.set("create_attempts_ok", a.ok.load(Ordering::Relaxed));
    r.set("create_attempts_refused", a.refused.load(Ordering::Relaxed));
    r.set("create_attempts_other", a.other.load(Ordering::Relaxed));
    let codes = a.other_codes();
    if !codes.is_empty() {
        r.note(format!("create attempts with other codes: {codes}"));
    }
    let mut answers = a.answer_ms(|_| true);
    let late = answers.iter().filter(|ms| **ms > ANSWER_TARGET_MS).count();
    r.set("create_attempts_over_1s", late as u64);
    if late > 0 {
        let slow = a.slow(ANSWER_TARGET_MS, SLOW_LISTED);
        let slow: Vec<String> = slow.iter().map(|(at, ms)| format!("{at}+{ms}")).collect();
        r.note(format!(
            "create attempts over 1 s (wall-clock start ms + answer ms): {}",
            slow.join(" ")
        ));
    }
    r.summary("create_answer_ms", summarize(&mut answers));
    let mut ok = a.answer_ms(|c| c == Code::Ok);
    r.summary("create_ok_answer_ms", summarize(&mut ok));
    let mut refused = a.answer_ms(|c| c == Code::ResourceExhausted);
    r.summary("create_refusal_answer_ms", summarize(&mut refused));
}
