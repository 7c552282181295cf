//! Leader-only work: firing due wheel entries, dispatching ready runs to
//! workers, expiring leases and measuring clock offsets. It runs only
//! while this node leads, and is rebuilt from replicated state at every
//! new term. Nothing here decides a fire: it proposes `Fire`, and apply
//! decides; dispatch follows only from committed effects.

pub mod dispatch;
pub mod housekeep;
pub mod pace;
pub mod wheel;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use openraft::ServerState;
use rand::Rng;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::time::sleep;

use crate::core::{
    limits, ActiveRun, Command, Effect, ReadyRun, Response, RunId, RunState, WheelKey,
};
use crate::node::Node;
use crate::runlog;
use pace::{FirePace, Sent};
use wheel::TimingWheel;

/// How far ahead the in-memory wheel holds entries.
pub const HORIZON_MS: i64 = 60_000;
/// Most keys held in memory; beyond this the durable index is read later.
pub const WHEEL_MAX_KEYS: usize = 1_000_000;
/// Most active runs loaded when leadership starts.
pub const ACTIVE_LOAD_MAX: usize = 1_000_000;
/// Pages of the active-runs table read per pass of the leader's loop.
const PAGES_PER_PASS: usize = 16;
const LEASE_CHECK: Duration = Duration::from_millis(100);
const CLOCK_PROBE: Duration = Duration::from_millis(1000);
const QUORUM_CHECK: Duration = Duration::from_millis(1000);
const QUORUM_LOST: Duration = Duration::from_millis(2000);
/// Fire proposals in flight at once: the next batch replicates while the
/// previous one applies, and keys due meanwhile gather into the next batch.
/// How many keys they hold together is paced (`pace`). Ten hold a minute
/// boundary of 10,000 cron jobs at once, so its fires go into the log
/// together, ahead of the assignment records and finishes they cause; with
/// four, the last of 9,000 waited behind those (BENCHMARKS.md, nineteenth
/// pass).
const FIRES_IN_FLIGHT: usize = 10;
/// Keys per Fire proposal. Applying a key writes about five state keys, in
/// one sled batch that holds sled's process-wide write lock, which this
/// node's Raft log appends wait on: ~5,000 writes keep that wait short.
const FIRE_PROPOSAL_KEYS: usize = 1024;

/// Watches Raft metrics and runs the leader's tasks for as long as this node leads.
pub async fn supervise(node: Arc<Node>) {
    let mut metrics = node.raft.metrics();
    let mut current: Option<(u64, tokio::task::JoinHandle<()>)> = None;
    let mut leader_seen = None;
    loop {
        let (leading, term, leader) = {
            let m = metrics.borrow_and_update();
            (
                m.state == ServerState::Leader && m.current_leader == Some(node.id),
                m.current_term,
                m.current_leader,
            )
        };
        if leader.is_some() && leader != leader_seen {
            if leader_seen.is_some() {
                node.metrics.leader_changed();
            }
            leader_seen = leader;
        }
        match (&current, leading) {
            (Some((t, _)), true) if *t == term => {}
            (_, true) => {
                stop(&node, current.take());
                tracing::info!(term, "leading: starting firing and dispatch");
                current = Some((term, tokio::spawn(lead(node.clone()))));
            }
            (Some(_), false) => {
                tracing::info!(term, "no longer leading: stopping firing and dispatch");
                stop(&node, current.take());
            }
            (None, false) => {}
        }
        if metrics.changed().await.is_err() {
            stop(&node, current.take());
            return;
        }
    }
}

fn stop(node: &Node, task: Option<(u64, tokio::task::JoinHandle<()>)>) {
    if let Some((_, h)) = task {
        h.abort();
        node.dispatcher.clear();
        node.clock.reset();
        node.admission.set_fire_lag(0);
    }
}

/// Runs the leader's work; if it stops (a proposal failed, or a quorum no
/// longer answers) it drops every worker stream, so workers go looking for
/// the real leader, and starts again while this node still leads.
async fn lead(node: Arc<Node>) {
    // Aborted with this task when leadership ends.
    let _prober = AbortOnDrop(tokio::spawn(probe_clocks(node.clone())));
    let _housekeeper = AbortOnDrop(tokio::spawn(housekeep::run(node.clone())));
    let mut backoff = Duration::from_millis(250);
    loop {
        let started_ms = node.clock.mono_ms();
        let res = tokio::select! {
            r = Term::start(node.clone()) => r,
            r = watch_quorum(&node) => r,
        };
        node.dispatcher.clear();
        node.metrics.set_wheel_entries(0);
        node.admission.set_fire_lag(0);
        // A leader cut off from its quorum fails fast and repeatedly: back
        // off (up to 2 s) and say so once per attempt, not twice a second.
        backoff = if node.clock.mono_ms() - started_ms > 10_000 {
            Duration::from_millis(500)
        } else {
            (backoff * 2).min(Duration::from_secs(2))
        };
        if let Err(e) = res {
            tracing::warn!(
                "leader work stopped: {e}; dropping worker streams, retrying in {backoff:?}"
            );
        }
        sleep(backoff).await;
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Fails once a quorum has not confirmed this leader for `QUORUM_LOST`:
/// openraft keeps an isolated leader in the Leader state for a while. Under
/// load one round can miss its heartbeat deadline (100 ms) while the quorum
/// is there, so a failed round only counts once the last confirmation is
/// `QUORUM_LOST` old; and the check does not wait for apply (a backlog is
/// not a lost quorum).
async fn watch_quorum(node: &Node) -> anyhow::Result<()> {
    let lost_ms = QUORUM_LOST.as_millis() as i64;
    let mut confirmed_ms = node.clock.mono_ms();
    loop {
        sleep(QUORUM_CHECK).await;
        let round = tokio::time::timeout(QUORUM_LOST, node.confirm_leadership()).await;
        let since_ms = node.clock.mono_ms() - confirmed_ms;
        match round {
            Ok(Ok(_)) => confirmed_ms = node.clock.mono_ms(),
            Ok(Err(e)) if since_ms < lost_ms => tracing::debug!("a quorum round failed: {e}"),
            Ok(Err(e)) => anyhow::bail!("not confirmed by a quorum for {since_ms} ms: {e}"),
            Err(_) => anyhow::bail!("no quorum answered within {QUORUM_LOST:?}"),
        }
    }
}

/// Keys loaded from the durable index: everything due at or before
/// `complete_upto`, plus keys up to `partial` when a load was cut short.
struct Term {
    node: Arc<Node>,
    wheel: TimingWheel<WheelKey>,
    complete_upto: i64,
    partial: Option<WheelKey>,
}

impl Term {
    async fn start(node: Arc<Node>) -> anyhow::Result<()> {
        // Subscribe before reading state so no effect falls in between.
        let mut effects = node.sm.subscribe();
        node.ensure_linearizable().await?;
        let now = loop {
            if let Some(now) = node.clock.calibrated_now_ms() {
                break now;
            }
            sleep(Duration::from_millis(10)).await;
        };
        let mut term = Term {
            wheel: TimingWheel::new(10, &[256, 64], now),
            complete_upto: i64::MIN,
            partial: None,
            node,
        };
        term.resync(now);
        let mut lease_tick = tokio::time::interval(LEASE_CHECK);
        let mut firing = FuturesUnordered::new();
        // Never below one full proposal: writes must not starve the fires.
        let mut pace = FirePace::new(FIRE_PROPOSAL_KEYS, FIRES_IN_FLIGHT * FIRE_PROPOSAL_KEYS);
        loop {
            // Effects first: under steady load there is always something due,
            // and dispatch must not wait for a quiet moment.
            loop {
                match effects.try_recv() {
                    Ok(batch) => term.on_effects(&batch),
                    Err(TryRecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "effect channel lagged; resyncing from state");
                        term.resync(term.node.clock.now_ms());
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Closed) => return Ok(()),
                }
            }
            term.page_in();
            let now = term.node.clock.now_ms();
            term.refill(now);
            term.node.metrics.set_wheel_entries(term.wheel.len());
            // While firing is paused cluster-wide the due keys stay in the
            // wheel (apply would not fire them either).
            let paused = term.node.sm.firing_paused().is_some();
            let room = pace
                .room()
                .min(FIRE_PROPOSAL_KEYS.min(limits::FIRE_BATCH_MAX));
            let can_fire = firing.len() < FIRES_IN_FLIGHT && room > 0 && !paused;
            if can_fire {
                let due: Vec<WheelKey> = term
                    .wheel
                    .advance(now, room)
                    .into_iter()
                    .map(|(k, _)| k)
                    .collect();
                if !due.is_empty() {
                    let sent = pace.sent(due.len());
                    term.node.metrics.set_fire_allowance(pace.limit());
                    firing.push(propose_fire(term.node.clone(), now, due, sent));
                    continue;
                }
            }
            // Due keys held back (the pipeline is full, or paced) tell
            // admission how far behind the cluster is on work it accepted;
            // those a pause holds are not.
            let next_due = term.wheel.next_due_ms();
            let held_back = match paused {
                true => 0,
                false => next_due.map_or(0, |at| (now - at).max(0) as u64),
            };
            term.node.admission.set_fire_lag(held_back);
            // With the pipeline full, a finished proposal is what wakes us.
            let wake_ms = match next_due {
                Some(at) if can_fire => at.min(now + 1000),
                _ => now + 1000,
            };
            let wake = Duration::from_millis((wake_ms - now).max(0) as u64);
            tokio::select! {
                // A fire that did not commit ends the term; the next one
                // rebuilds the wheel from replicated state, keys included.
                Some((sent, r)) = firing.next(), if !firing.is_empty() => {
                    r?;
                    pace.done(sent, term.node.admission.take_write_pace());
                }
                r = effects.recv() => match r {
                    Ok(batch) => term.on_effects(&batch),
                    Err(RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "effect channel lagged; resyncing from state");
                        term.resync(term.node.clock.now_ms());
                    }
                    Err(RecvError::Closed) => return Ok(()),
                },
                _ = sleep(wake) => {}
                _ = term.node.dispatcher.page_needed() => {}
                _ = lease_tick.tick() => term.expire_leases(),
            }
        }
    }

    /// Rebuilds the in-memory wheel and dispatch state from replicated state.
    fn resync(&mut self, now: i64) {
        self.reload_wheel();
        let active = self.node.sm.active_runs(ACTIVE_LOAD_MAX);
        let stopping = self.being_replaced(&active);
        self.node.dispatcher.rebuild(active, now);
        // The previous leader's stop request may never have reached these
        // workers: asked again as each claims its attempt here.
        for (run, attempt) in stopping {
            self.node.dispatcher.cancel(&run, attempt);
        }
        self.node.dispatch_now();
    }

    /// Running attempts of jobs whose overlap `replace` waits for them to stop.
    fn being_replaced(&self, active: &[(RunId, ActiveRun)]) -> Vec<(RunId, u32)> {
        let format = self.node.sm.log_format();
        let mut jobs: HashMap<&str, bool> = HashMap::new();
        let mut out = Vec::new();
        for (run, a) in active.iter().filter(|(_, a)| a.state == RunState::Running) {
            let replaced = *jobs.entry(run.job.as_str()).or_insert_with(|| {
                (self.node.sm.get_job(&run.job)).is_some_and(|j| j.being_replaced(format))
            });
            if replaced {
                out.push((run.clone(), a.attempt));
            }
        }
        out
    }

    /// Empties the in-memory wheel; `refill` loads it again from the durable index.
    fn reload_wheel(&mut self) {
        self.wheel.clear();
        self.complete_upto = i64::MIN;
        self.partial = None;
    }

    /// Pages attempts that did not fit a group's queue back in from the
    /// active-runs table, at most `PAGES_PER_PASS` pages per pass (the
    /// dispatcher signals again if more are wanted).
    fn page_in(&self) {
        let d = &self.node.dispatcher;
        let mut paged = false;
        for _ in 0..PAGES_PER_PASS {
            let Some((group, cursor)) = d.page_wanted() else {
                break;
            };
            let rows = self
                .node
                .sm
                .active_runs_after(cursor.as_ref(), dispatch::PAGE_ROWS);
            let end = rows.len() < dispatch::PAGE_ROWS;
            d.page_in(&group, rows, end);
            paged = true;
        }
        if paged {
            self.node.dispatch_now();
            d.signal_if_page_wanted();
        }
    }

    fn is_loaded(&self, k: &WheelKey) -> bool {
        k.fire_at_ms <= self.complete_upto || self.partial.as_ref().is_some_and(|p| k <= p)
    }

    /// Loads durable keys up to the horizon, bounded by `WHEEL_MAX_KEYS`.
    fn refill(&mut self, now: i64) {
        let target = (now + HORIZON_MS).min(self.wheel.horizon_ms());
        if self.complete_upto >= now + HORIZON_MS / 2 || self.complete_upto >= target {
            return;
        }
        let room = WHEEL_MAX_KEYS.saturating_sub(self.wheel.len());
        if room == 0 {
            return;
        }
        let keys =
            self.node
                .sm
                .wheel_range(self.partial.as_ref(), self.complete_upto, target, room);
        let full = keys.len() == room;
        for k in &keys {
            let at = k.fire_at_ms;
            self.wheel.insert(k.clone(), at);
        }
        if full {
            self.partial = keys.last().cloned();
        } else {
            self.complete_upto = target;
            self.partial = None;
        }
    }

    fn on_effects(&mut self, batch: &[Effect]) {
        if batch.iter().any(|e| matches!(e, Effect::Restored)) {
            self.resync(self.node.clock.now_ms());
        }
        if batch.iter().any(|e| matches!(e, Effect::FiringResumed)) {
            self.reload_wheel();
        }
        let d = &self.node.dispatcher;
        let backfilled: Vec<&RunId> = batch
            .iter()
            .filter_map(|e| match e {
                Effect::Backfilled(run) => Some(run),
                _ => None,
            })
            .collect();
        // The run log's lines are written after the dispatch: at a minute
        // boundary thousands of attempts become ready in one batch, and their
        // workers need not wait for as many lines to be formatted.
        let mut lines = Vec::new();
        for e in batch {
            match e {
                Effect::Restored | Effect::FiringResumed | Effect::Backfilled(_) => {}
                Effect::Scheduled(k) => {
                    if self.is_loaded(k) {
                        self.wheel.insert(k.clone(), k.fire_at_ms);
                    }
                }
                Effect::Ready(r) => {
                    let chosen = backfilled.iter().any(|b| {
                        (&b.job, b.scheduled_at_ms) == (&r.run.job, r.run.scheduled_at_ms)
                    });
                    lines.push(Line::Ready(r, self.on_ready(r, chosen)));
                    d.ready(r.clone())
                }
                Effect::Ended { run, attempt } => d.ended(run, *attempt),
                Effect::Cancel { run, attempt } => d.cancel(run, *attempt),
                Effect::Finished(f) => {
                    self.node.metrics.finished(&f.group, f.outcome);
                    lines.push(Line::Finished(f));
                }
                Effect::Misfired { group, policy } => self.node.metrics.misfired(group, *policy),
                // For watchers only (`watch.rs`).
                Effect::JobChanged { .. } | Effect::Assigned { .. } => {}
            }
        }
        self.node.dispatch_now();
        for line in lines {
            match line {
                Line::Ready(r, late_ms) => runlog::ready(r, late_ms),
                Line::Finished(f) => runlog::finished(f),
            }
        }
    }

    /// Counts an attempt that became ready (the fire, or a retry) and
    /// returns how late it is; a backfilled occurrence is late by choice
    /// and not counted as a fire.
    fn on_ready(&self, r: &ReadyRun, backfilled: bool) -> i64 {
        // From the occurrence's fire time: its jitter offset is not lateness.
        let due_ms = WheelKey::jittered(&r.run.job, r.run.scheduled_at_ms, r.offset_ms).fire_at_ms;
        let late_ms = self.node.clock.now_ms() - due_ms;
        if r.attempt == 1 && !backfilled {
            self.node.metrics.fired(&r.group, late_ms);
        }
        late_ms
    }

    fn expire_leases(&self) {
        let now = self.node.clock.now_ms();
        let expired = self.node.dispatcher.expired(now);
        if expired.is_empty() {
            return;
        }
        // Apply refuses an Expire over the cap: propose in chunks it takes.
        for chunk in expired.chunks(limits::EXPIRE_BATCH_MAX) {
            let mut rng = rand::thread_rng();
            let with_jitter = chunk
                .iter()
                .map(|(r, a)| (r.clone(), *a, rng.gen_range(0..10_000u64)))
                .collect();
            let (node, chunk) = (self.node.clone(), chunk.to_vec());
            tokio::spawn(async move {
                let cmd = Command::Expire {
                    now_ms: now,
                    expired: with_jitter,
                };
                let failed = match node.propose(cmd).await {
                    Ok(Response::Error(e)) => Some(e.to_string()),
                    Ok(_) => None,
                    Err(e) => Some(e.to_string()),
                };
                if let Some(e) = failed {
                    tracing::warn!("lease expiry not committed: {e}");
                    node.dispatcher.expire_failed(&chunk);
                }
            });
        }
    }
}

/// A run-log line an effect batch writes once its attempts are dispatched.
enum Line<'a> {
    /// An attempt became ready, this late (ms).
    Ready(&'a ReadyRun, i64),
    Finished(&'a crate::core::apply::Finished),
}

/// Proposes one batch of due keys; apply decides which of them fire.
async fn propose_fire(
    node: Arc<Node>,
    now: i64,
    keys: Vec<WheelKey>,
    sent: Sent,
) -> (Sent, anyhow::Result<()>) {
    let cmd = Command::Fire {
        now_ms: now,
        keys,
        widths: node.dispatcher.widths(),
    };
    (sent, node.propose(cmd).await.map(drop).map_err(Into::into))
}

/// Measures every voter's clock (concurrently) and updates cluster time.
async fn probe_clocks(node: Arc<Node>) {
    loop {
        let voters = node.voters();
        let probes = voters
            .iter()
            .filter(|(id, _)| *id != node.id)
            .map(|(id, addr)| node.probe_clock(*id, addr));
        let samples: Vec<_> = futures::future::join_all(probes)
            .await
            .into_iter()
            .flatten()
            .collect();
        node.clock.update(&samples, voters.len());
        sleep(CLOCK_PROBE).await;
    }
}
