//! The `kairos-jepsen` command line: `run` a test against a fresh cluster,
//! `campaign` many seeds one after another, `check` a recorded run
//! directory again, or `clean` leftovers of earlier runs.
//!
//! Exit status of `run` (and of `check`, which knows only 0 and 1):
//! - 0: every checker is valid;
//! - 1: some checker is not;
//! - 2: a harness error (the run has no verdict; `results.json` says why);
//! - 3: the watchdog ended a run that overran its bound;
//! - 4: the host cannot inject a requested fault family (no namespaces,
//!   iproute2 or iptables for partition/loss/bandwidth/snapshot, no
//!   libfaketime for clock, no FUSE for power/disk-*); `results.json`
//!   names each with the reason. Only `--loopback` asks for fewer faults;
//! - 130: interrupted (Ctrl-C, SIGTERM).
//!
//! `campaign`: 0 when every run is valid, else 4 if the nemesis cannot be
//! injected, 2 if any run erred or overran, 1 if some run is invalid, 130
//! when interrupted.

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use kairos_jepsen::campaign::{self, Plan, Verdict, Watchdog};
use kairos_jepsen::check::{check_dir, print_summary};
use kairos_jepsen::clean;
use kairos_jepsen::event::Bounds;
use kairos_jepsen::generator::{
    DEFAULT_FAULT_EVERY_MS, FAMILIES, MAX_FAULT_EVERY_MS, MIN_FAULT_EVERY_MS,
};
use kairos_jepsen::run::RunConfig;
use std::path::PathBuf;
use std::time::Duration;

/// Node flags used with the snapshot nemesis unless --node-args is given:
/// a snapshot every 500 entries, 100 kept behind it.
const SNAPSHOT_NODE_ARGS: [&str; 4] = ["--snapshot-logs", "500", "--keep-logs", "100"];
const WORKLOADS: [&str; 5] = ["register", "interval", "timers", "execution", "workflow"];

#[derive(Parser)]
#[command(name = "kairos-jepsen", about = "Fault-injection harness for Kairos")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a cluster, inject faults under load, record and check the history.
    Run(RunArgs),
    /// Run seeds one after another, each on a fresh cluster, and tabulate them.
    Campaign(CampaignArgs),
    /// Re-run every checker on DIR/history.jsonl and rewrite the reports.
    Check { dir: PathBuf },
    /// Remove namespaces, links and node processes left by earlier runs.
    Clean,
    /// Print one node's Cluster.Status (its local view) as JSON.
    Status { addr: String },
}

#[derive(clap::Args)]
struct RunArgs {
    #[command(flatten)]
    common: Common,
    /// Seed for the fault schedule and workload choices; random if absent.
    #[arg(long)]
    seed: Option<u64>,
    /// Output directory; default jepsen-runs/<unix time>-seed<seed>.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(clap::Args)]
struct CampaignArgs {
    #[command(flatten)]
    common: Common,
    /// Seeds: A..B (both included), or a comma list.
    #[arg(long)]
    seeds: String,
    /// Directory for seed-<n>/ and campaign.{md,json}; default
    /// jepsen-runs/campaign-<unix time>.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The flags `run` and `campaign` share.
#[derive(clap::Args)]
struct Common {
    /// Cluster size: 3 or 5.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Seconds of workload and faults (healing, settling and checks come after).
    #[arg(long, default_value_t = 60)]
    time_limit: u64,
    /// Comma-separated fault families.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "partition,kill,pause,clock"
    )]
    nemesis: Vec<String>,
    /// Comma-separated workloads.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "register,interval,timers,execution"
    )]
    workload: Vec<String>,
    /// Client operations per second (register and timers together).
    #[arg(long, default_value_t = 10.0)]
    rate: f64,
    /// Mean seconds between fault starts (default 17.5: a 5–10 s gap, then
    /// a fault held 5–15 s).
    #[arg(long, value_name = "SECS")]
    fault_every: Option<f64>,
    /// The kairos binary; default: next to this binary, else target/{release,debug}/kairos.
    #[arg(long, env = "KAIROS_BIN")]
    bin: Option<PathBuf>,
    /// Settling time after the final heal, seconds.
    #[arg(long, default_value_t = 10)]
    quiet: u64,
    #[arg(long, default_value_t = 3_000)]
    op_timeout_ms: u64,
    /// Allowed fire lateness while no fault is active.
    #[arg(long, default_value_t = Bounds::default().healthy_lateness_ms)]
    healthy_lateness_ms: i64,
    /// Extra lateness allowed after a fault heals.
    #[arg(long, default_value_t = Bounds::default().recovery_ms)]
    recovery_ms: i64,
    /// Tolerance for a receipt before its scheduled time.
    #[arg(long, default_value_t = Bounds::default().early_epsilon_ms)]
    early_epsilon_ms: i64,
    /// Run nodes on loopback even as root: the network fault families
    /// (partition, loss, bandwidth, snapshot) are dropped, and results.json
    /// lists them. Without it, a run that cannot inject every requested
    /// family fails (exit 4).
    #[arg(long)]
    loopback: bool,
    /// Extra arguments for every `kairos serve`, whitespace-separated. With
    /// the snapshot nemesis the default makes snapshots frequent enough that a
    /// blackholed follower must install one to catch up.
    #[arg(long, allow_hyphen_values = true)]
    node_args: Option<String>,
    /// Run the cluster without TLS and tokens (by default the harness
    /// generates certificates and an admin token and uses both).
    #[arg(long)]
    plain: bool,
    /// `KAIROS_FAILPOINT` for every node, e.g. `skip-log-sync` (no fdatasync
    /// of the Raft log: a power cut can then lose acknowledged writes, which
    /// the run must report). Recorded in the history and results.json.
    #[arg(long, default_value = "")]
    failpoint: String,
    /// Every power fault cuts every node at once (otherwise its scope is
    /// drawn: one node, a minority, a majority or all).
    #[arg(long)]
    power_all: bool,
}

fn main() {
    let code = match Cli::parse().cmd {
        Cmd::Check { dir } => match check_dir(&dir) {
            Ok(s) => {
                print_summary(&s);
                i32::from(!s.valid)
            }
            Err(e) => fail(e),
        },
        Cmd::Clean => {
            for line in clean::reap_stale() {
                println!("{line}");
            }
            0
        }
        Cmd::Status { addr } => match status_cmd(&addr) {
            Ok(()) => 0,
            Err(e) => fail(e),
        },
        Cmd::Run(args) => match run_cmd(args) {
            Ok(code) => code,
            Err(e) => fail(e),
        },
        Cmd::Campaign(args) => match campaign_cmd(args) {
            Ok(code) => code,
            Err(e) => fail(e),
        },
    };
    std::process::exit(code);
}

fn fail(e: anyhow::Error) -> i32 {
    eprintln!("kairos-jepsen: {e:#}");
    2
}

fn run_cmd(a: RunArgs) -> Result<i32> {
    let seed = a.seed.unwrap_or_else(rand::random);
    let out = a
        .out
        .unwrap_or_else(|| PathBuf::from(format!("jepsen-runs/{}-seed{seed}", unix_s())));
    let cfg = config(&a.common, seed, out)?;
    println!("seed {} · out {}", cfg.seed, cfg.out.display());
    clean::install_panic_hook();
    let out = cfg.out.clone();
    let o = campaign::run_one(cfg, &Watchdog::start());
    match (&o.summary, &o.error) {
        (Some(s), _) => {
            print_summary(s);
            println!(
                "reports: {}/{{results.json,lateness.svg,timeline.html}}",
                out.display()
            );
        }
        (None, Some(e)) => eprintln!("kairos-jepsen: {e}"),
        (None, None) => {}
    }
    if o.verdict == Verdict::Interrupted {
        eprintln!("kairos-jepsen: interrupted, torn down");
    }
    Ok(o.verdict.exit_code())
}

fn campaign_cmd(a: CampaignArgs) -> Result<i32> {
    let seeds = campaign::parse_seeds(&a.seeds)?;
    let dir = a
        .out
        .unwrap_or_else(|| PathBuf::from(format!("jepsen-runs/campaign-{}", unix_s())));
    // Validate the flags once, before the first cluster starts.
    let first = config(&a.common, seeds[0], dir.join("seed-check"))?;
    let plan = Plan {
        seeds,
        nodes: first.nodes,
        time_limit_s: first.time_limit_s,
        nemeses: first.nemeses.clone(),
        workloads: first.workloads.clone(),
        fault_every_ms: first.fault_every_ms,
        loopback: first.loopback,
    };
    clean::install_panic_hook();
    campaign::run_campaign(&dir, &plan, |seed, out| config(&a.common, seed, out))
}

fn unix_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn status_cmd(addr: &str) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let ch = kairos_jepsen::client::channel(addr, &Default::default())?;
        let s = kairos_jepsen::client::status(&ch, Duration::from_secs(3)).await?;
        let nodes: Vec<_> = s
            .nodes
            .iter()
            .map(|n| {
                serde_json::json!({"id": n.id, "addr": n.addr, "role": n.role, "term": n.term,
                    "applied_index": n.applied_index, "state_digest": n.state_digest,
                    "digest_index": n.digest_index,
                    "clock_offset_ms": n.clock_offset_ms})
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({"leader": s.leader, "nodes": nodes})
        );
        Ok(())
    })
}

fn config(a: &Common, seed: u64, out: PathBuf) -> Result<RunConfig> {
    if a.nodes != 3 && a.nodes != 5 {
        bail!("--nodes must be 3 or 5");
    }
    for f in &a.nemesis {
        if !FAMILIES.contains(&f.as_str()) && f != "none" {
            bail!("unknown nemesis {f:?}; choose from {FAMILIES:?}");
        }
    }
    for w in &a.workload {
        if !WORKLOADS.contains(&w.as_str()) {
            bail!("unknown workload {w:?}; choose from {WORKLOADS:?}");
        }
    }
    if !(0.1..=1_000.0).contains(&a.rate) || a.time_limit == 0 || a.time_limit > 24 * 3600 {
        bail!("--rate must be in 0.1..=1000 and --time-limit in 1..=86400");
    }
    if a.power_all && !a.nemesis.iter().any(|f| f == "power") {
        bail!("--power-all needs the power nemesis (--nemesis power,...)");
    }
    if !a.failpoint.split(',').all(|f| {
        f.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-=".contains(&b))
    }) {
        bail!("--failpoint takes the server's failpoint list: NAME or NAME=N, comma-separated");
    }
    let fault_every_ms = match a.fault_every {
        None => DEFAULT_FAULT_EVERY_MS,
        Some(s) => {
            let ms = (s * 1000.0).round();
            let range = MIN_FAULT_EVERY_MS as f64..=MAX_FAULT_EVERY_MS as f64;
            if !range.contains(&ms) {
                bail!(
                    "--fault-every must be in {}..={} seconds",
                    MIN_FAULT_EVERY_MS / 1000,
                    MAX_FAULT_EVERY_MS / 1000
                );
            }
            ms as u64
        }
    };
    let bin = match &a.bin {
        Some(b) => b.clone(),
        None => default_bin()?,
    };
    if !bin.exists() {
        bail!(
            "kairos binary {} not found (cargo build -p kairos-server, or pass --bin)",
            bin.display()
        );
    }
    let bounds = Bounds {
        healthy_lateness_ms: a.healthy_lateness_ms,
        recovery_ms: a.recovery_ms,
        early_epsilon_ms: a.early_epsilon_ms,
        ..Bounds::default()
    };
    let node_args = match &a.node_args {
        Some(s) => s.split_whitespace().map(String::from).collect(),
        None if a.nemesis.iter().any(|f| f == "snapshot") => {
            SNAPSHOT_NODE_ARGS.iter().map(|s| s.to_string()).collect()
        }
        None => Vec::new(),
    };
    Ok(RunConfig {
        nodes: a.nodes,
        time_limit_s: a.time_limit,
        nemeses: a.nemesis.iter().filter(|f| *f != "none").cloned().collect(),
        workloads: a.workload.clone(),
        rate: a.rate,
        seed,
        out,
        bin: std::fs::canonicalize(&bin)?,
        quiet_s: a.quiet,
        op_timeout_ms: a.op_timeout_ms,
        bounds,
        loopback: a.loopback,
        node_args,
        plain: a.plain,
        fault_every_ms,
        failpoint: a.failpoint.clone(),
        power_all: a.power_all,
    })
}

/// `kairos` next to this executable (same cargo profile), else
/// target/release/kairos or target/debug/kairos under the working directory.
fn default_bin() -> Result<PathBuf> {
    let beside = std::env::current_exe()?.with_file_name("kairos");
    let candidates = [
        beside,
        PathBuf::from("target/release/kairos"),
        PathBuf::from("target/debug/kairos"),
    ];
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no kairos binary found; build it (cargo build -p kairos-server) or pass --bin / KAIROS_BIN"))
}
