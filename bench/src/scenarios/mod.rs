//! The scenarios and what they share: the [`Target`] cluster (a local one
//! started from `--bin`, or `--endpoints`), per-node CPU/RSS/disk readings
//! of a local cluster, lateness and writes-per-fire reporting, and `smoke`,
//! which runs all five scenarios with small settings in about two and a half minutes.

mod failover;
mod overload;
mod rolling;
mod seed;
mod throughput;
mod timers;

use std::time::Duration;

use crate::cluster::LocalCluster;
use crate::load::Rec;
use crate::procfs::{self, ProcSample};
use crate::stats::{summarize, Report};
use crate::{Opts, Scenario};

/// The cluster under test.
pub struct Target {
    pub endpoints: Vec<String>,
    pub local: Option<LocalCluster>,
}

impl Target {
    pub async fn new(o: &Opts) -> anyhow::Result<Self> {
        if !o.endpoints.is_empty() {
            return Ok(Target {
                endpoints: o.endpoints.clone(),
                local: None,
            });
        }
        eprintln!(
            "starting a local {}-node cluster from {}",
            o.nodes,
            o.bin.display()
        );
        let c = LocalCluster::start(&o.bin, o.nodes, o.node_args.clone(), o.keep_data).await?;
        Ok(Target {
            endpoints: c.endpoints(),
            local: Some(c),
        })
    }

    pub fn require_local(&self, what: &str) -> anyhow::Result<&LocalCluster> {
        self.local.as_ref().ok_or_else(|| {
            anyhow::anyhow!(
                "{what} needs the local cluster (kills/restarts nodes); omit --endpoints"
            )
        })
    }

    /// One /proc reading per running local node.
    pub fn samples(&self) -> Vec<(u64, ProcSample)> {
        let Some(c) = &self.local else {
            return Vec::new();
        };
        (1..=c.size())
            .filter_map(|id| Some((id, procfs::sample(c.pid(id)?)?)))
            .collect()
    }

    /// Metric `name` of each running local node (from its /metrics).
    pub async fn metric(&self, name: &str) -> Vec<(u64, f64)> {
        let Some(c) = &self.local else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for id in 1..=c.size() {
            let Ok(http) = c.http(id) else { continue };
            if let Some(v) = crate::cluster::http_metric(&http, name).await {
                out.push((id, v));
            }
        }
        out
    }

    /// Each local node's cost counters so far ([`COSTS`]), for
    /// [`report_costs`].
    pub async fn costs(&self) -> Costs {
        let mut out = Vec::new();
        for (metric, _, _) in COSTS {
            out.push(self.metric(metric).await);
        }
        out
    }

    /// On-disk bytes of each local node's data directory.
    pub fn disk(&self) -> Vec<(u64, u64)> {
        let Some(c) = &self.local else {
            return Vec::new();
        };
        (1..=c.size())
            .filter_map(|id| Some((id, procfs::dir_bytes(&c.data_dir(id).ok()?))))
            .collect()
    }
}

/// Per-node CPU % (average between the two readings) and RSS at the second.
/// The highest term any node reports (from /metrics on a local cluster,
/// else from `status`): term changes between two readings are elections.
pub async fn max_term(t: &Target, status: &kairos_client::Client) -> Option<u64> {
    let local = t.metric("kairos_raft_term").await;
    if !local.is_empty() {
        return local.iter().map(|(_, term)| *term as u64).max();
    }
    let s = status.status().await.ok()?;
    s.nodes.iter().map(|n| n.term).max()
}

/// Term changes between two [`max_term`] readings (an unknown reading counts none).
pub fn elections(before: Option<u64>, after: Option<u64>) -> u64 {
    after.zip(before).map_or(0, |(b, a)| b.saturating_sub(a))
}

pub fn report_nodes(r: &mut Report, before: &[(u64, ProcSample)], after: &[(u64, ProcSample)]) {
    for (id, b) in after {
        if let Some((_, a)) = before.iter().find(|(i, _)| i == id) {
            r.set(&format!("node{id}_cpu_pct"), procfs::cpu_percent(a, b));
        }
        r.set(&format!("node{id}_rss_mb"), b.rss_bytes as f64 / 1048576.0);
        r.set(
            &format!("node{id}_rss_peak_mb"),
            b.hwm_bytes as f64 / 1048576.0,
        );
    }
    if after.is_empty() {
        r.note("no per-node CPU/RSS: not a local cluster");
    }
}

/// What a node's work costs, per fire delivered: the counter read from its
/// /metrics, the report key's suffix, and the factor to the reported unit.
pub const COSTS: [(&str, &str, f64); 3] = [
    // State keys apply wrote to sled.
    ("kairos_state_writes_total", "writes_per_fire", 1.0),
    // CPU of the threads applying committed entries.
    (
        "kairos_apply_cpu_seconds_total",
        "apply_cpu_us_per_fire",
        1e6,
    ),
    // CPU of writing the applied state's windows to sled.
    (
        "kairos_state_flush_cpu_seconds_total",
        "flush_cpu_us_per_fire",
        1e6,
    ),
];

/// Per [`COSTS`] counter, each local node's reading.
pub type Costs = Vec<Vec<(u64, f64)>>;

/// `nodeN_writes_per_fire`, `nodeN_apply_cpu_us_per_fire` and
/// `nodeN_flush_cpu_us_per_fire`: what each node's counters grew by
/// between two readings of [`Target::costs`], per fire delivered meanwhile.
pub fn report_costs(r: &mut Report, before: &Costs, after: &Costs, fires: usize) {
    let mut any = false;
    for ((_, suffix, unit), (before, after)) in COSTS.iter().zip(before.iter().zip(after)) {
        for (id, b) in after {
            if let Some((_, a)) = before.iter().find(|(i, _)| i == id) {
                let per_fire = (b - a) * unit / fires.max(1) as f64;
                r.set(&format!("node{id}_{suffix}"), per_fire);
                any = true;
            }
        }
    }
    if !any {
        r.note("no costs per fire: not a local cluster, or a server without the cost counters");
    }
}

/// `lateness_ms_*` of the receipts (first attempts only), split into
/// `fire_delay_ms_*` (scheduled to fired_at, the Fire command's cluster time)
/// and `dispatch_ms_*` (fired_at to worker receipt).
pub fn report_lateness(r: &mut Report, recs: &[&Rec]) {
    report_lateness_as(r, "", recs)
}

/// [`report_lateness`] with every field name starting with `prefix`.
pub fn report_lateness_as(r: &mut Report, prefix: &str, recs: &[&Rec]) {
    let first: Vec<&&Rec> = recs.iter().filter(|x| x.attempt <= 1).collect();
    let mut late: Vec<i64> = first.iter().map(|x| x.lateness_ms()).collect();
    r.summary(&format!("{prefix}lateness_ms"), summarize(&mut late));
    let by_due: Vec<(i64, i64)> = (first.iter())
        .map(|x| (x.scheduled_at_ms, x.lateness_ms()))
        .collect();
    // The steady state (the median second) and the worst second.
    let per_s = crate::stats::per_second_p99(&by_due);
    let mut as_f: Vec<f64> = per_s.iter().map(|&v| v as f64).collect();
    let (steady, worst) = (crate::stats::median(&mut as_f), per_s.iter().max());
    r.set(
        &format!("{prefix}lateness_ms_p99_per_s_median"),
        serde_json::json!(steady),
    );
    r.set(
        &format!("{prefix}lateness_ms_p99_per_s_max"),
        serde_json::json!(worst),
    );
    let mut fire: Vec<i64> = (first.iter())
        .map(|x| x.fired_at_ms - x.scheduled_at_ms)
        .collect();
    let mut dispatch: Vec<i64> = (first.iter())
        .map(|x| x.received_at_ms - x.fired_at_ms)
        .collect();
    let (f, d) = (summarize(&mut fire), summarize(&mut dispatch));
    for (name, s) in [("fire_delay_ms", f), ("dispatch_ms", d)] {
        r.set(
            &format!("{prefix}{name}_p50"),
            serde_json::json!(s.map(|s| s.p50)),
        );
        r.set(
            &format!("{prefix}{name}_p99"),
            serde_json::json!(s.map(|s| s.p99)),
        );
        r.set(
            &format!("{prefix}{name}_max"),
            serde_json::json!(s.map(|s| s.max)),
        );
    }
}

pub async fn run_one(o: &Opts) -> anyhow::Result<Report> {
    match o.scenario {
        Scenario::Throughput => throughput::run(o).await,
        Scenario::Seed10k => seed::run(o).await,
        Scenario::Timers1m => timers::run(o).await,
        Scenario::Failover => failover::run(o).await,
        Scenario::Overload => overload::run(o).await,
        Scenario::RollingRestart => rolling::run(o).await,
        Scenario::Smoke => anyhow::bail!("smoke runs the other scenarios"),
    }
}

/// Short settings of each scenario for CI (about 2 minutes on 2 cores).
fn smoke_opts(o: &Opts, s: Scenario) -> Opts {
    let mut x = o.clone();
    x.scenario = s;
    x.repeat = 1;
    match s {
        Scenario::Throughput => {
            x.duration = Some(Duration::from_secs(5));
            x.rate = Some(2_000);
            // Histories full from the third fire: every fire after it
            // also deletes its job's oldest run (the steady state).
            x.keep_runs = Some(2);
        }
        Scenario::Seed10k => {
            x.duration = Some(Duration::from_secs(15));
            x.count = Some(2_000);
            x.period_s = 10;
        }
        Scenario::Timers1m => {
            // The other scenarios create one job per call; this one batches.
            x.count = Some(5_000);
            x.batch = 100;
        }
        Scenario::Failover => {
            x.duration = Some(Duration::from_secs(8));
            x.count = None;
            x.kills = 1;
        }
        Scenario::Overload => {
            x.duration = Some(Duration::from_secs(8));
            x.rate = Some(1_000);
        }
        Scenario::RollingRestart | Scenario::Smoke => {}
    }
    x
}

/// Runs all five scenarios with their smoke settings.
pub async fn smoke(o: &Opts) -> anyhow::Result<Vec<Report>> {
    let mut out = Vec::new();
    for s in [
        Scenario::Throughput,
        Scenario::Seed10k,
        Scenario::Timers1m,
        Scenario::Failover,
        Scenario::Overload,
    ] {
        eprintln!("smoke: {s:?}");
        let start = std::time::Instant::now();
        let mut r = run_one(&smoke_opts(o, s)).await?;
        r.set("wall_s", start.elapsed().as_secs_f64());
        out.push(r);
    }
    Ok(out)
}
