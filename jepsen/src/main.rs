//! The `kairos-jepsen` command line: `run` a test against a fresh cluster,
//! `check` a recorded run directory again, or `clean` leftovers of earlier
//! runs. Exit status: 0 when every checker is valid, 1 when some checker is
//! not, 2 on a harness error, 3 when the watchdog ended a run, 130 on Ctrl-C.

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use kairos_jepsen::check::{check_dir, print_summary};
use kairos_jepsen::clean;
use kairos_jepsen::event::Bounds;
use kairos_jepsen::generator::FAMILIES;
use kairos_jepsen::run::{run, RunConfig, OVERHEAD_S};
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
    /// Re-run every checker on DIR/history.jsonl and rewrite the reports.
    Check { dir: PathBuf },
    /// Remove namespaces, links and node processes left by earlier runs.
    Clean,
    /// Print one node's Cluster.Status (its local view) as JSON.
    Status { addr: String },
}

#[derive(clap::Args)]
struct RunArgs {
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
    /// Seed for the fault schedule and workload choices; random if absent.
    #[arg(long)]
    seed: Option<u64>,
    /// Output directory; default jepsen-runs/<unix time>-seed<seed>.
    #[arg(long)]
    out: Option<PathBuf>,
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
    /// Run nodes on loopback even as root (network faults disabled).
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
    };
    std::process::exit(code);
}

fn fail(e: anyhow::Error) -> i32 {
    eprintln!("kairos-jepsen: {e:#}");
    2
}

fn run_cmd(a: RunArgs) -> Result<i32> {
    let cfg = config(a)?;
    println!("seed {} · out {}", cfg.seed, cfg.out.display());
    clean::install_panic_hook();
    let hard_limit = Duration::from_secs(cfg.time_limit_s + cfg.quiet_s + OVERHEAD_S);
    std::thread::spawn(move || {
        std::thread::sleep(hard_limit);
        eprintln!("kairos-jepsen: watchdog: run exceeded {hard_limit:?}, tearing down");
        clean::cleanup_registered();
        std::process::exit(3);
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let out = cfg.out.clone();
    let result = rt.block_on(async move {
        tokio::select! {
            r = run(cfg) => Some(r),
            _ = interrupted() => None,
        }
    });
    let Some(result) = result else {
        eprintln!("kairos-jepsen: interrupted, tearing down");
        clean::cleanup_registered();
        return Ok(130);
    };
    clean::cleanup_registered();
    let summary = result?;
    print_summary(&summary);
    println!(
        "reports: {}/{{results.json,lateness.svg,timeline.html}}",
        out.display()
    );
    Ok(i32::from(!summary.valid))
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

async fn interrupted() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
}

fn config(a: RunArgs) -> Result<RunConfig> {
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
    let seed = a.seed.unwrap_or_else(rand::random);
    let out = a.out.unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        PathBuf::from(format!("jepsen-runs/{t}-seed{seed}"))
    });
    let bin = match a.bin {
        Some(b) => b,
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
    let node_args = match a.node_args {
        Some(s) => s.split_whitespace().map(String::from).collect(),
        None if a.nemesis.iter().any(|f| f == "snapshot") => {
            SNAPSHOT_NODE_ARGS.iter().map(|s| s.to_string()).collect()
        }
        None => Vec::new(),
    };
    Ok(RunConfig {
        nodes: a.nodes,
        time_limit_s: a.time_limit,
        nemeses: a.nemesis.into_iter().filter(|f| f != "none").collect(),
        workloads: a.workload,
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
