//! A node's Prometheus metrics, kept and encoded by `prometheus-client`
//! (base units, HELP text, `_total` counters). Events are counted where they
//! happen (the leader's fire and dispatch paths, the state machine's apply);
//! levels (Raft indexes, queues, clock offsets) are read from the node when
//! `/metrics` is scraped. Label sets are bounded: no job ids, groups capped
//! at [`GROUP_LABELS_MAX`] distinct values (the rest count as `_other`),
//! peers are members (at most 9 voters plus learners).

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::core::{Misfire, RunState};
use crate::node::Node;

/// The `outcome` label: Prometheus style (`timed_out`) where the API says `timed-out`.
fn outcome_label(state: RunState) -> &'static str {
    match state {
        RunState::TimedOut => "timed_out",
        RunState::RetryWait => "retry_wait",
        other => other.as_str(),
    }
}

fn policy_label(policy: Misfire) -> &'static str {
    match policy {
        Misfire::FireAll => "fire_all",
        Misfire::FireOnce => "fire_once",
        Misfire::Skip => "skip",
    }
}

/// Distinct `group` label values per node; later groups are `_other`.
pub const GROUP_LABELS_MAX: usize = 256;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupLabel {
    group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    group: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MisfireLabels {
    group: String,
    policy: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabel {
    peer: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// One node's metrics. Cheap to update from any task.
pub struct Metrics {
    registry: Registry,
    groups: Mutex<HashSet<String>>,
    fires: Family<GroupLabel, Counter>,
    runs_finished: Family<OutcomeLabels, Counter>,
    misfires: Family<MisfireLabels, Counter>,
    fire_lateness: Histogram,
    dispatch_latency: Histogram,
    apply: Histogram,
    log_append: Histogram,
    disk_sync: Histogram,
    disk_sync_waiters: Counter,
    disk_free: Gauge,
    disk_reserve: Gauge,
    state_flush: Histogram,
    snapshot_build: Histogram,
    /// CPU seconds of the threads that applied entries and wrote windows.
    apply_cpu: Counter<f64, AtomicU64>,
    flush_cpu: Counter<f64, AtomicU64>,
    runtime_lag: Histogram,
    leader_changes: Counter,
    wheel_entries: Gauge,
    fire_allowance: Gauge,
    raft_commit_index: Gauge,
    // Read from the node at scrape time.
    pending_timers: Gauge,
    raft_term: Gauge,
    raft_last_log_index: Gauge,
    raft_applied_index: Gauge,
    raft_is_leader: Gauge,
    log_first_index: Gauge,
    snapshot_bytes: Gauge,
    cluster_time_offset: FloatGauge,
    clock_skew: Family<PeerLabel, FloatGauge>,
    queue_depth: Family<GroupLabel, Gauge>,
    workers: Family<GroupLabel, Gauge>,
    in_flight: Family<GroupLabel, Gauge>,
    admitted_writes: Gauge,
    admitted_write_bytes: Gauge,
    admitted_writes_limit: Gauge,
    refused_writes: Counter,
    state_writes: Counter,
    unflushed_keys: Gauge,
    watchers: Gauge,
    watch_oldest_index: Gauge,
    otel_spans_dropped: Counter,
    log_lines_dropped: Counter,
    apply_snapshot_waits: Counter,
    shared_entries: Counter,
    shared_proposals: Counter,
    /// One scrape at a time: levels are cleared and re-read, counters kept
    /// elsewhere are caught up.
    rendering: Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        // 1 ms to ~65 s, doubling.
        let seconds = || Histogram::new(exponential_buckets(0.001, 2.0, 17));
        let m = Metrics {
            registry: Registry::default(),
            groups: Mutex::new(HashSet::new()),
            fires: Family::default(),
            runs_finished: Family::default(),
            misfires: Family::default(),
            fire_lateness: seconds(),
            dispatch_latency: seconds(),
            apply: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            log_append: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            disk_sync: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            disk_sync_waiters: Counter::default(),
            disk_free: Gauge::default(),
            disk_reserve: Gauge::default(),
            state_flush: Histogram::new(exponential_buckets(0.000_1, 2.0, 16)),
            snapshot_build: seconds(),
            apply_cpu: Counter::default(),
            flush_cpu: Counter::default(),
            runtime_lag: seconds(),
            leader_changes: Counter::default(),
            wheel_entries: Gauge::default(),
            fire_allowance: Gauge::default(),
            raft_commit_index: Gauge::default(),
            pending_timers: Gauge::default(),
            raft_term: Gauge::default(),
            raft_last_log_index: Gauge::default(),
            raft_applied_index: Gauge::default(),
            raft_is_leader: Gauge::default(),
            log_first_index: Gauge::default(),
            snapshot_bytes: Gauge::default(),
            cluster_time_offset: FloatGauge::default(),
            clock_skew: Family::default(),
            queue_depth: Family::default(),
            workers: Family::default(),
            in_flight: Family::default(),
            admitted_writes: Gauge::default(),
            admitted_write_bytes: Gauge::default(),
            admitted_writes_limit: Gauge::default(),
            refused_writes: Counter::default(),
            state_writes: Counter::default(),
            unflushed_keys: Gauge::default(),
            watchers: Gauge::default(),
            watch_oldest_index: Gauge::default(),
            otel_spans_dropped: Counter::default(),
            log_lines_dropped: Counter::default(),
            apply_snapshot_waits: Counter::default(),
            shared_entries: Counter::default(),
            shared_proposals: Counter::default(),
            rendering: Mutex::new(()),
        };
        m.register()
    }

    fn register(mut self) -> Self {
        let r = &mut self.registry;
        r.register(
            "kairos_fires",
            "Occurrences fired by this node while it led (first attempts of runs)",
            self.fires.clone(),
        );
        r.register(
            "kairos_runs_finished",
            "Runs that reached a terminal state while this node led, by outcome \
             (succeeded, failed, timed_out, cancelled, skipped)",
            self.runs_finished.clone(),
        );
        r.register(
            "kairos_misfires",
            "Occurrences found due past their misfire grace while this node led, \
             by the policy that handled them (fire_all, fire_once, skip)",
            self.misfires.clone(),
        );
        r.register_with_unit(
            "kairos_fire_lateness",
            "Scheduled time to the fire's commit on the leader",
            Unit::Seconds,
            self.fire_lateness.clone(),
        );
        r.register_with_unit(
            "kairos_dispatch_latency",
            "An attempt's fire (or retry) on the leader to its hand-off to a worker",
            Unit::Seconds,
            self.dispatch_latency.clone(),
        );
        r.register_with_unit(
            "kairos_apply",
            "Time to apply one batch of committed log entries to the state machine",
            Unit::Seconds,
            self.apply.clone(),
        );
        r.register_with_unit(
            "kairos_log_append",
            "Time to append a batch of entries to the Raft log, fsync included",
            Unit::Seconds,
            self.log_append.clone(),
        );
        r.register_with_unit(
            "kairos_disk_sync",
            "Time of one group commit: sled's flush, then fdatasync of its data \
             file (and fsync of new blob files and changed directories)",
            Unit::Seconds,
            self.disk_sync.clone(),
        );
        r.register(
            "kairos_disk_sync_requests",
            "Durable-write requests answered by group commits (with \
             kairos_disk_sync_seconds_count: requests per fsync)",
            self.disk_sync_waiters.clone(),
        );
        r.register_with_unit(
            "kairos_disk_free",
            "Bytes free to this node in its data directory's filesystem \
             (statvfs f_bavail), read every second",
            Unit::Bytes,
            self.disk_free.clone(),
        );
        r.register_with_unit(
            "kairos_disk_reserve",
            "Bytes the node keeps free in its data directory (--disk-reserve-mb): \
             below it, it refuses writes and hands leadership over",
            Unit::Bytes,
            self.disk_reserve.clone(),
        );
        r.register_with_unit(
            "kairos_runtime_lag",
            "How late a task that asks to wake every 10 ms is woken: time every \
             async runtime worker was busy with other work (or the process was \
             not scheduled), which delays Raft messages and answers alike",
            Unit::Seconds,
            self.runtime_lag.clone(),
        );
        r.register_with_unit(
            "kairos_state_flush",
            "Time to write one flush window of applied state to the store \
             (one batch, or through its redo record past 4,096 keys)",
            Unit::Seconds,
            self.state_flush.clone(),
        );
        r.register_with_unit(
            "kairos_apply_cpu",
            "CPU time the threads applying committed entries spent on it \
             (a window apply writes itself, past its memory bounds, included)",
            Unit::Seconds,
            self.apply_cpu.clone(),
        );
        r.register_with_unit(
            "kairos_state_flush_cpu",
            "CPU time spent writing flush windows of applied state to the store",
            Unit::Seconds,
            self.flush_cpu.clone(),
        );
        r.register(
            "kairos_raft_leader_changes",
            "Times this node saw the cluster's leader change",
            self.leader_changes.clone(),
        );
        r.register(
            "kairos_wheel_entries",
            "Timers in the leader's in-memory wheel (0 on followers)",
            self.wheel_entries.clone(),
        );
        r.register(
            "kairos_fire_allowance_keys",
            "Due timers the leader lets into the log at once, paced by how fast fires apply (0 before the first fire)",
            self.fire_allowance.clone(),
        );
        r.register(
            "kairos_pending_timers",
            "Timers in the durable wheel index: next occurrences and retries",
            self.pending_timers.clone(),
        );
        r.register(
            "kairos_raft_commit_index",
            "Index of the last entry this node knows to be committed",
            self.raft_commit_index.clone(),
        );
        r.register(
            "kairos_raft_term",
            "Current Raft term",
            self.raft_term.clone(),
        );
        r.register(
            "kairos_raft_last_log_index",
            "Index of the last entry in this node's log",
            self.raft_last_log_index.clone(),
        );
        r.register(
            "kairos_raft_applied_index",
            "Index of the last entry applied to the state machine",
            self.raft_applied_index.clone(),
        );
        r.register(
            "kairos_raft_is_leader",
            "1 on the leader, 0 elsewhere",
            self.raft_is_leader.clone(),
        );
        r.register(
            "kairos_log_first_index",
            "Index of the first entry still in the log (after purges)",
            self.log_first_index.clone(),
        );
        r.register_with_unit(
            "kairos_snapshot",
            "Size of this node's current snapshot file",
            Unit::Bytes,
            self.snapshot_bytes.clone(),
        );
        r.register_with_unit(
            "kairos_snapshot_build",
            "Time this node took to build each snapshot (read the state pinned, write and sync the file)",
            Unit::Seconds,
            self.snapshot_build.clone(),
        );
        r.register_with_unit(
            "kairos_cluster_time_offset",
            "Offset this node applies to its clock to follow cluster time",
            Unit::Seconds,
            self.cluster_time_offset.clone(),
        );
        r.register_with_unit(
            "kairos_clock_skew",
            "Measured offset of a peer's clock from this node's",
            Unit::Seconds,
            self.clock_skew.clone(),
        );
        r.register(
            "kairos_queue_depth",
            "Attempts ready and waiting for a worker, per group (leader)",
            self.queue_depth.clone(),
        );
        r.register(
            "kairos_workers",
            "Connected workers serving a group (leader)",
            self.workers.clone(),
        );
        r.register(
            "kairos_in_flight",
            "Attempts handed to workers and not yet finished, per group (leader)",
            self.in_flight.clone(),
        );
        r.register(
            "kairos_admitted_writes",
            "Client write commands admitted and not yet answered (leader)",
            self.admitted_writes.clone(),
        );
        r.register_with_unit(
            "kairos_admitted_write",
            "Encoded size of the client write commands admitted and not yet answered (leader)",
            Unit::Bytes,
            self.admitted_write_bytes.clone(),
        );
        r.register(
            "kairos_admitted_writes_limit",
            "Client write commands admission lets in flight now (adapts to apply speed)",
            self.admitted_writes_limit.clone(),
        );
        r.register(
            "kairos_refused_writes",
            "Client writes refused with RESOURCE_EXHAUSTED by admission control",
            self.refused_writes.clone(),
        );
        r.register(
            "kairos_state_writes",
            "State keys written to or deleted from the store since this node started (net of keys rewritten within a flush window)",
            self.state_writes.clone(),
        );
        r.register(
            "kairos_state_unflushed_keys",
            "Applied state keys held in memory and not yet written to the store (the log holds them)",
            self.unflushed_keys.clone(),
        );
        r.register(
            "kairos_watchers",
            "Watch streams this node serves",
            self.watchers.clone(),
        );
        r.register(
            "kairos_watch_oldest_index",
            "Oldest log index whose events this node's watch ring holds (older positions are compacted)",
            self.watch_oldest_index.clone(),
        );
        r.register(
            "kairos_otel_spans_dropped",
            "Spans this process dropped instead of exporting over OTLP (queue full or export failed)",
            self.otel_spans_dropped.clone(),
        );
        r.register(
            "kairos_log_lines_dropped",
            "Log lines this process dropped because its log writer fell behind (stderr not draining)",
            self.log_lines_dropped.clone(),
        );
        r.register(
            "kairos_apply_snapshot_waits",
            "Times apply waited for a snapshot or digest to finish reading the state, having held its limit in memory meanwhile",
            self.apply_snapshot_waits.clone(),
        );
        r.register(
            "kairos_shared_entries",
            "Log entries this node proposed that carried several proposals (group commit of fires, assignments, finishes, expiries and client batches)",
            self.shared_entries.clone(),
        );
        r.register(
            "kairos_shared_proposals",
            "Proposals that went out in a shared entry",
            self.shared_proposals.clone(),
        );
        self
    }

    /// The label for `group`, or `_other` once [`GROUP_LABELS_MAX`] are in use.
    fn group(&self, group: &str) -> GroupLabel {
        let mut seen = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        let known = seen.contains(group) || seen.len() < GROUP_LABELS_MAX;
        if known {
            seen.insert(group.to_string());
        }
        GroupLabel {
            group: if known { group.into() } else { "_other".into() },
        }
    }

    /// A run's first attempt became ready on the leader, `late_ms` after its time.
    pub fn fired(&self, group: &str, late_ms: i64) {
        self.fires.get_or_create(&self.group(group)).inc();
        self.fire_lateness.observe(late_ms.max(0) as f64 / 1000.0);
    }

    /// A run reached a terminal state (counted on the leader, from apply's effects).
    pub fn finished(&self, group: &str, outcome: RunState) {
        let labels = OutcomeLabels {
            group: self.group(group).group,
            outcome: outcome_label(outcome),
        };
        self.runs_finished.get_or_create(&labels).inc();
    }

    pub fn misfired(&self, group: &str, policy: Misfire) {
        let labels = MisfireLabels {
            group: self.group(group).group,
            policy: policy_label(policy),
        };
        self.misfires.get_or_create(&labels).inc();
    }

    pub fn log_appended(&self, took: Duration) {
        self.log_append.observe(took.as_secs_f64());
    }

    /// One group commit took `took` and answered `waiters` requests.
    pub fn synced(&self, took: Duration, waiters: usize) {
        self.disk_sync.observe(took.as_secs_f64());
        self.disk_sync_waiters.inc_by(waiters as u64);
    }

    pub fn set_disk_free(&self, free: u64, reserve: u64) {
        self.disk_free.set(i64::try_from(free).unwrap_or(i64::MAX));
        self.disk_reserve
            .set(i64::try_from(reserve).unwrap_or(i64::MAX));
    }

    pub fn runtime_lagged(&self, late: Duration) {
        self.runtime_lag.observe(late.as_secs_f64());
    }

    /// This node built a snapshot in `took`.
    pub fn snapshot_built(&self, took: Duration) {
        self.snapshot_build.observe(took.as_secs_f64());
    }

    pub fn state_flushed(&self, took: Duration, cpu: Duration) {
        self.state_flush.observe(took.as_secs_f64());
        self.flush_cpu.inc_by(cpu.as_secs_f64());
    }

    pub fn set_commit_index(&self, index: u64) {
        self.raft_commit_index
            .set(i64::try_from(index).unwrap_or(i64::MAX));
    }

    /// A log entry went out carrying `proposals` proposals.
    pub fn entry_shared(&self, proposals: usize) {
        self.shared_entries.inc();
        self.shared_proposals.inc_by(proposals as u64);
    }

    pub fn dispatched(&self, waited: Duration) {
        self.dispatch_latency.observe(waited.as_secs_f64());
    }

    pub fn applied(&self, took: Duration, cpu: Duration) {
        self.apply.observe(took.as_secs_f64());
        self.apply_cpu.inc_by(cpu.as_secs_f64());
    }

    /// CPU seconds spent applying entries so far (`kairos_apply_cpu`).
    pub fn apply_cpu_seconds(&self) -> f64 {
        self.apply_cpu.get()
    }

    /// CPU seconds spent writing flush windows so far (`kairos_state_flush_cpu`).
    pub fn flush_cpu_seconds(&self) -> f64 {
        self.flush_cpu.get()
    }

    pub fn leader_changed(&self) {
        self.leader_changes.inc();
    }

    pub fn set_wheel_entries(&self, n: usize) {
        self.wheel_entries.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn set_fire_allowance(&self, n: usize) {
        self.fire_allowance
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The Prometheus text exposition, levels read from `node` now.
    pub fn render(&self, node: &Node) -> String {
        let _one = self.rendering.lock().unwrap_or_else(|e| e.into_inner());
        let m = node.raft.metrics().borrow().clone();
        let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        if let Some(n) = node.sm.pending_timers() {
            self.pending_timers.set(int(n));
        }
        self.raft_term.set(int(m.current_term));
        self.raft_last_log_index
            .set(int(m.last_log_index.unwrap_or(0)));
        self.raft_applied_index
            .set(int(m.last_applied.map_or(0, |l| l.index)));
        self.raft_is_leader
            .set(i64::from(m.current_leader == Some(node.id)));
        self.log_first_index
            .set(int(node.log.first_index().unwrap_or(0)));
        let snapshot = std::fs::metadata(node.sm.snapshot_file()).map_or(0, |f| f.len());
        self.snapshot_bytes.set(int(snapshot));
        self.cluster_time_offset
            .set(node.clock.offset_ms() as f64 / 1000.0);
        self.clock_skew.clear();
        for (peer, off_ms) in node.clock.peer_offsets() {
            let label = PeerLabel {
                peer: peer.to_string(),
            };
            self.clock_skew
                .get_or_create(&label)
                .set(off_ms as f64 / 1000.0);
        }
        for family in [&self.queue_depth, &self.workers, &self.in_flight] {
            family.clear();
        }
        for (g, st) in node.dispatcher.stats() {
            let label = self.group(&g);
            let n = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
            self.queue_depth.get_or_create(&label).inc_by(n(st.queued));
            self.workers.get_or_create(&label).inc_by(n(st.workers));
            self.in_flight.get_or_create(&label).inc_by(n(st.in_flight));
        }
        let (writes, write_bytes) = node.admission.load();
        self.admitted_writes.set(int(writes as u64));
        self.admitted_write_bytes.set(int(write_bytes as u64));
        self.admitted_writes_limit
            .set(int(node.admission.limit() as u64));
        catch_up(&self.refused_writes, node.admission.refused_total());
        catch_up(&self.state_writes, node.sm.writes_total());
        catch_up(&self.otel_spans_dropped, crate::otel::spans_dropped());
        catch_up(&self.log_lines_dropped, crate::logsink::dropped_total());
        catch_up(&self.apply_snapshot_waits, node.sm.frozen_waits());
        self.unflushed_keys
            .set(int(node.sm.unflushed_keys() as u64));
        let watch = node.sm.watch();
        self.watchers.set(int(watch.watchers() as u64));
        self.watch_oldest_index.set(int(watch.bounds().0));
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &self.registry) {
            tracing::error!("encoding metrics: {e}");
        }
        prometheus_text(&out)
    }
}

/// The library's OpenMetrics text as the Prometheus text format (0.0.4)
/// that `/metrics` declares: a counter's HELP and TYPE name its `_total`
/// samples, and the OpenMetrics-only `# UNIT` and `# EOF` lines go (units
/// stay in the names). `promtool check metrics` reads this format.
fn prometheus_text(open_metrics: &str) -> String {
    let mut out = String::with_capacity(open_metrics.len());
    let mut help: Option<&str> = None;
    for line in open_metrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest);
            continue;
        }
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        if let Some((name, kind)) = line.strip_prefix("# TYPE ").and_then(|r| r.split_once(' ')) {
            let family = match kind {
                "counter" => format!("{name}_total"),
                _ => name.to_string(),
            };
            if let Some(text) = help.take().and_then(|h| h.split_once(' ')).map(|(_, t)| t) {
                out.push_str(&format!("# HELP {family} {text}\n"));
            }
            out.push_str(&format!("# TYPE {family} {kind}\n"));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Raises `counter` to `total`, a count kept by the part that owns it.
fn catch_up(counter: &Counter, total: u64) {
    let seen = counter.get();
    if total > seen {
        counter.inc_by(total - seen);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_past_the_cap_share_one_label() {
        let m = Metrics::new();
        for i in 0..GROUP_LABELS_MAX + 5 {
            m.fired(&format!("g{i}"), 10);
        }
        m.fired("g0", -5);
        let mut out = String::new();
        encode(&mut out, &m.registry).unwrap();
        let series = out
            .lines()
            .filter(|l| l.starts_with("kairos_fires_total{"))
            .count();
        assert_eq!(series, GROUP_LABELS_MAX + 1, "{out}");
        assert!(
            out.contains("kairos_fires_total{group=\"_other\"} 5"),
            "{out}"
        );
        assert!(out.contains("kairos_fires_total{group=\"g0\"} 2"), "{out}");
        assert!(out.contains("# HELP kairos_fire_lateness_seconds"), "{out}");
        let text = prometheus_text(&out);
        assert!(text.contains("# HELP kairos_fires_total "), "{text}");
        assert!(text.contains("# TYPE kairos_fires_total counter"), "{text}");
        assert!(
            text.contains("# TYPE kairos_fire_lateness_seconds histogram"),
            "{text}"
        );
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        assert!(
            out.contains("kairos_fire_lateness_seconds_count 262"),
            "{out}"
        );
    }
}
