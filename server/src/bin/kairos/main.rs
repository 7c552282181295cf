//! The `kairos` binary: `serve` runs one node, `playground` runs a local
//! cluster with a demo job and prints every fire.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use kairos_server::{run, Config};

mod playground;

#[derive(Parser)]
#[command(
    name = "kairos",
    version,
    about = "Kairos: a Raft-replicated scheduling server"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one node. With no flags: a single-node cluster on 127.0.0.1:7070.
    Serve(ServeArgs),
    /// Start a local cluster of child processes, a demo job and a worker; print each fire until Ctrl-C.
    Playground(playground::PlaygroundArgs),
}

#[derive(Args, Clone)]
pub struct ServeArgs {
    /// This node's id (1..), unique in the cluster.
    #[arg(long, default_value_t = 1)]
    id: u64,
    /// gRPC listen address (public API and peer traffic).
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// Address other nodes and clients should use; defaults to --listen.
    #[arg(long)]
    advertise: Option<String>,
    /// HTTP address for /healthz, /readyz, /metrics and the dashboard.
    #[arg(long, default_value = "127.0.0.1:7080")]
    http: SocketAddr,
    /// Data directory (created if missing).
    #[arg(long, default_value = "./kairos-data")]
    data_dir: PathBuf,
    /// Voters of the cluster as ID=ADDR,...; defaults to this node alone.
    #[arg(long, value_delimiter = ',')]
    peers: Vec<String>,
    /// Build a snapshot after this many log entries.
    #[arg(long, default_value_t = 10_000)]
    snapshot_logs: u64,
    /// Log entries kept behind a snapshot for lagging followers.
    #[arg(long, default_value_t = 1_000)]
    keep_logs: u64,
    /// Leader heartbeat; also openraft's AppendEntries timeout.
    #[arg(long, default_value_t = 100)]
    heartbeat_ms: u64,
    /// Election timeout range. openraft 0.9 also holds a leader lease of
    /// election-max after the last heartbeat, so a dead leader is replaced
    /// after lease + timeout (800–1000 ms with the defaults).
    #[arg(long, default_value_t = 300)]
    election_min_ms: u64,
    /// sled page cache in MiB (1..65536). Not a bound on memory: at 1M
    /// timers 64 MiB gave a larger RSS than the default (BENCHMARKS.md).
    #[arg(long, default_value_t = 1024)]
    cache_mb: u64,
    #[arg(long, default_value_t = 500)]
    election_max_ms: u64,
}

fn parse_peers(list: &[String]) -> anyhow::Result<BTreeMap<u64, String>> {
    let mut peers = BTreeMap::new();
    for p in list {
        let (id, addr) = p
            .split_once('=')
            .with_context(|| format!("--peers: expected ID=ADDR, got {p:?}"))?;
        let id: u64 = id
            .trim()
            .parse()
            .with_context(|| format!("--peers: id {id:?} is not a number"))?;
        anyhow::ensure!(
            peers.insert(id, addr.trim().to_string()).is_none(),
            "--peers: id {id} given twice"
        );
    }
    Ok(peers)
}

async fn serve(a: ServeArgs) -> anyhow::Result<()> {
    let advertise = a.advertise.clone().unwrap_or_else(|| a.listen.to_string());
    let mut peers = parse_peers(&a.peers)?;
    if peers.is_empty() {
        peers.insert(a.id, advertise.clone());
    }
    let mut config = Config::new(a.id, advertise, a.data_dir.clone(), peers);
    config.snapshot_logs = a.snapshot_logs;
    config.keep_logs = a.keep_logs;
    config.cache_bytes = a.cache_mb.saturating_mul(1 << 20);
    config.heartbeat_ms = a.heartbeat_ms;
    config.election_min_ms = a.election_min_ms;
    config.election_max_ms = a.election_max_ms;
    config.validate()?;
    let grpc = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("--listen {}", a.listen))?;
    let http = tokio::net::TcpListener::bind(a.http)
        .await
        .with_context(|| format!("--http {}", a.http))?;
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    run(config, grpc, Some(http), shutdown).await
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,openraft=warn,sled=warn,h2=warn,tower=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cli.cmd {
        None => match Cli::parse_from(["kairos", "serve"]).cmd {
            Some(Cmd::Serve(a)) => rt.block_on(serve(a)),
            _ => unreachable!("`kairos serve` parses as Serve"),
        },
        Some(Cmd::Serve(a)) => rt.block_on(serve(a)),
        Some(Cmd::Playground(p)) => rt.block_on(playground::run(p)),
    }
}
