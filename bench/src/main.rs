//! `kairos-bench`: the load tool of Kairos. It starts a local 3-node
//! cluster from the release binary (or uses `--endpoints`), drives it with
//! real workers and clients over gRPC, and prints a table or JSON per
//! scenario: `throughput`, `seed-10k`, `timers-1m`, `failover`, `overload`,
//! `rolling-restart`, and `smoke` (all but `rolling-restart`, short, for CI). The exit status is non-zero when a scenario
//! errs or finds a correctness violation (lost or doubled fires); missed
//! performance targets are reported, not failed.

mod cluster;
mod load;
mod procfs;
mod scenarios;
mod stats;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use serde_json::{json, Value};

use stats::Report;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Sustained end-to-end fires/s and lateness with many interval and one-shot timers.
    Throughput,
    /// 10,000 cron jobs (90% at each minute boundary, 10% every 30 s): lateness, burst, CPU, RSS.
    #[value(name = "seed-10k")]
    Seed10k,
    /// N pending one-shot timers far in the future: create rate, RSS and disk per timer, restart time.
    #[value(name = "timers-1m")]
    Timers1m,
    /// SIGKILL the leader repeatedly under interval load: gap to the next fire, lost and doubled fires.
    Failover,
    /// The saturating load (`--rate`), then 5x it for `--duration` (60 s): delivered fires/s,
    /// elections, create answer times and refusals.
    Overload,
    /// Restart every node in turn under interval load, first gracefully (SIGTERM: the leader
    /// hands over), then with SIGKILL: fire delay and lateness, elections, lost and doubled fires.
    #[value(name = "rolling-restart")]
    RollingRestart,
    /// Every scenario but `rolling-restart`, short (for CI).
    Smoke,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

#[derive(Parser, Debug, Clone)]
#[command(name = "kairos-bench", version, about = "Load tool for Kairos")]
pub struct Opts {
    #[arg(value_enum)]
    pub scenario: Scenario,
    /// Measurement length, e.g. 5s, 90s, 3m, 500ms (default depends on the scenario).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Use a running cluster (host:port,...) instead of starting one; no kills, restarts or /proc stats.
    #[arg(long, value_delimiter = ',')]
    pub endpoints: Vec<String>,
    #[arg(long, value_enum, default_value = "table")]
    pub output: OutputFormat,
    /// Voters of the local cluster (1 to 9).
    #[arg(long, default_value_t = cluster::NODES)]
    pub nodes: u64,
    /// The kairos server binary for the local cluster.
    #[arg(long, default_value = "target/release/kairos")]
    pub bin: PathBuf,
    /// Number of jobs/timers (seed-10k: 10000, timers-1m: 1000000, failover: 50, rolling-restart: 10).
    #[arg(long)]
    pub count: Option<u64>,
    /// Leader kills in `failover`.
    #[arg(long, default_value_t = 3)]
    pub kills: u32,
    /// Worker processes' streams (SDK workers) per scenario.
    #[arg(long, default_value_t = 4)]
    pub workers: u32,
    /// Capacity of each worker (1..=10000).
    #[arg(long, default_value_t = 2000)]
    pub capacity: u32,
    /// Concurrent clients (connections) creating jobs.
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Create calls each client keeps in flight on its connection (1..=256;
    /// HTTP/2 multiplexes them).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub pipeline: u16,
    /// timers-1m: jobs per `Jobs.CreateJobs` call (1..=1000); 1 creates each
    /// with its own `CreateJob` call.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub batch: u16,
    /// throughput: offered fires/s (jobs x 1000 / every-ms); overload: the saturating
    /// load of its first phase (default 5000), 5x that in the second.
    #[arg(long)]
    pub rate: Option<u64>,
    /// Interval of the interval jobs in `throughput`, `failover` and `rolling-restart` (ms).
    #[arg(long)]
    pub every_ms: Option<u64>,
    /// throughput, seed-10k: each job's `keep_runs` (1..=100000; the
    /// server's default, 10,000, if unset). Below the run's fires per job,
    /// every fire past it also deletes the job's oldest run, as on a
    /// cluster that has run for hours: the steady state.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub keep_runs: Option<u64>,
    /// seed-10k: period of the boundary group in seconds (60 = every minute; must divide 60).
    #[arg(long, default_value_t = 60)]
    pub period_s: u64,
    /// Run the scenario this many times (fresh cluster each) and report medians.
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    /// Keep the local cluster's data directories and logs.
    #[arg(long)]
    pub keep_data: bool,
    /// Extra flags for every `kairos serve`, e.g. --node-arg=--snapshot-logs=50000.
    #[arg(long = "node-arg", allow_hyphen_values = true)]
    pub node_args: Vec<String>,
}

impl Opts {
    /// Create calls outstanding at once while a scenario sets up its jobs.
    pub fn in_flight(&self) -> usize {
        self.clients.max(1) * usize::from(self.pipeline)
    }
}

/// Parses `500ms`, `5s`, `3m`, `1h` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.');
    let (num, unit) = s.split_at(split.unwrap_or(s.len()));
    let n: f64 = num
        .parse()
        .map_err(|_| format!("duration {s:?}: expected e.g. 500ms, 5s, 3m, 1h"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("duration {s:?}: unit must be ms, s, m or h")),
    };
    if !(secs > 0.0 && secs <= 24.0 * 3600.0) {
        return Err(format!("duration {s:?}: must be above 0 and at most 24h"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Merges repeated runs: numeric fields become their median, others come from the last run.
fn merge_medians(runs: Vec<Report>) -> Report {
    let n = runs.len();
    let mut out = runs.last().cloned().expect("at least one run");
    if n < 2 {
        return out;
    }
    let keys: Vec<String> = match out.to_json() {
        Value::Object(m) => m.keys().cloned().collect(),
        _ => Vec::new(),
    };
    for k in keys {
        let mut vals: Vec<f64> = runs
            .iter()
            .filter_map(|r| r.get(&k).and_then(Value::as_f64))
            .collect();
        if vals.len() == n {
            out.set(&k, json!(stats::median(&mut vals)));
        }
    }
    out.set("runs", n as u64);
    for (i, r) in runs.iter().enumerate() {
        out.failures
            .extend(r.failures.iter().map(|f| format!("run {}: {f}", i + 1)));
    }
    out.note(format!("numeric values are medians of {n} runs"));
    out
}

async fn run(o: &Opts) -> anyhow::Result<Vec<Report>> {
    if o.scenario == Scenario::Smoke {
        return scenarios::smoke(o).await;
    }
    let mut runs = Vec::new();
    for i in 0..o.repeat.clamp(1, 20) {
        if o.repeat > 1 {
            eprintln!("[{:?}] run {}/{}", o.scenario, i + 1, o.repeat);
        }
        runs.push(scenarios::run_one(o).await?);
    }
    Ok(vec![merge_medians(runs)])
}

fn main() -> anyhow::Result<()> {
    let o = Opts::parse();
    anyhow::ensure!((1..=10_000).contains(&o.capacity), "--capacity: 1 to 10000");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let reports = rt.block_on(async {
        cluster::install_signal_cleanup();
        run(&o).await
    })?;
    match o.output {
        OutputFormat::Table => reports.iter().for_each(Report::print_table),
        OutputFormat::Json if reports.len() == 1 => {
            println!("{}", serde_json::to_string_pretty(&reports[0].to_json())?)
        }
        OutputFormat::Json => {
            let all: Vec<Value> = reports.iter().map(Report::to_json).collect();
            println!(
                "{}",
                serde_json::to_string_pretty(&json!({ "smoke": all }))?
            )
        }
    }
    let failed: Vec<&String> = reports.iter().flat_map(|r| &r.failures).collect();
    anyhow::ensure!(failed.is_empty(), "correctness failures: {failed:?}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("3m"), Ok(Duration::from_secs(180)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("0s").is_err());
    }
}
