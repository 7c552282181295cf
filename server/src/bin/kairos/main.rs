//! The `kairos` binary: `serve` runs one node, `playground` runs a local
//! cluster with a demo job and prints every fire.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use kairos_server::admission::Bounds;
use kairos_server::{logsink, otel, run, Config};

mod config;
mod playground;

/// mimalloc instead of the system allocator: under load the state machine
/// allocates a key and a value per read and write, and glibc's malloc and
/// free were a quarter of a leader's CPU (BENCHMARKS.md, seventh pass).
/// Transparent huge pages are off: mimalloc is built with `no_thp` so it
/// does not ask for them, and `main` turns them off for the process so the
/// kernel does not give them unasked where THP is `always`. Otherwise every
/// 2 MiB region of mimalloc's arenas that is touched becomes resident whole
/// (an idle node: 72 MB of RSS instead of 20; BENCHMARKS.md, seventeenth pass).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

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

// Parsed once at start; boxing `serve`'s flags would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Run one node. With no flags: a single-node cluster on 127.0.0.1:7070.
    Serve(ServeArgs),
    /// Start a local cluster of child processes, a demo job and a worker; print each fire until Ctrl-C.
    Playground(playground::PlaygroundArgs),
    /// Cluster certificates.
    #[command(subcommand)]
    Certs(CertsCmd),
    /// Configuration files.
    #[command(subcommand)]
    Config(ConfigCmd),
    /// Backup files (from `kairosctl snapshot save`).
    #[command(subcommand)]
    Snapshot(SnapshotCmd),
    /// Prepare a new node's data directory from a backup file, offline (run
    /// it for every node of the new cluster, with the same file, then start
    /// them with `kairos serve --peers ...`).
    Restore {
        /// The backup file (verified whole before anything is written).
        #[arg(long)]
        from: PathBuf,
        /// The node's data directory: absent or empty.
        #[arg(long)]
        data_dir: PathBuf,
    },
}

#[derive(Subcommand)]
enum SnapshotCmd {
    /// Verify a backup file whole and print its format, log index, SHA-256
    /// and the records per key space.
    Inspect { file: PathBuf },
}

/// Prints what a backup file holds, after verifying it whole.
fn inspect(file: &std::path::Path) -> anyhow::Result<()> {
    use kairos_server::store::snapfile;
    use sha2::Digest;
    let (version, meta) = snapfile::verify(file).with_context(|| format!("{}", file.display()))?;
    let mut reader = snapfile::Reader::open(file)?;
    let mut counts: BTreeMap<char, u64> = BTreeMap::new();
    while let Some((k, _)) = reader.next_pair()? {
        *counts
            .entry(k.first().map_or('?', |b| *b as char))
            .or_default() += 1;
    }
    let sha = sha2::Sha256::digest(std::fs::read(file)?);
    let hex: String = sha.iter().map(|b| format!("{b:02x}")).collect();
    let name = |c: char| match c {
        'j' => "jobs",
        'r' => "runs",
        'w' => "timers (wheel entries)",
        'a' => "active runs",
        'h' => "job history records",
        't' => "tokens (not restored)",
        'k' => "token index (not restored)",
        'd' | 'e' => "request ids (not restored)",
        'g' => "deleted jobs whose runs housekeeping still removes",
        'x' => "history-limit checks (housekeeping)",
        'm' => "meta (not restored)",
        _ => "other",
    };
    println!("file      {}", file.display());
    println!("format    {version}");
    println!("index     {}", meta.last_log_id.map_or(0, |l| l.index));
    println!("sha256    {hex}");
    for (c, n) in counts {
        println!("{n:>9} {}", name(c));
    }
    Ok(())
}

#[derive(Subcommand)]
enum ConfigCmd {
    /// Validate a `serve --config` file (keys, values, addresses, TLS
    /// files, token file) without starting or binding anything.
    Check { file: PathBuf },
}

#[derive(Subcommand)]
enum CertsCmd {
    /// Write a new cluster CA, a certificate and key per node (ids 1..=N) and
    /// a client certificate into a new directory, for `serve --tls-dir`.
    Init {
        /// Directory to create the files in (refuses one that holds a CA).
        #[arg(long)]
        out: PathBuf,
        /// Number of node certificates (node ids 1..=N).
        #[arg(long)]
        nodes: u64,
        /// A DNS name or IP address clients and peers use for the nodes
        /// (repeatable); localhost and the loopback addresses are always included.
        #[arg(long = "host")]
        hosts: Vec<String>,
    },
}

#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    /// TOML file with any of these flags as keys (`peer_listen = "..."`);
    /// flags and KAIROS_* environment variables override it.
    #[arg(long, env = "KAIROS_CONFIG")]
    config: Option<PathBuf>,
    /// This node's id (1..), unique in the cluster.
    #[arg(long, env = "KAIROS_ID", default_value_t = 1)]
    id: u64,
    /// Public gRPC listen address: clients and workers (no peer RPC).
    #[arg(long, env = "KAIROS_LISTEN", default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// Public address clients and workers should use; defaults to --listen.
    #[arg(long, env = "KAIROS_ADVERTISE")]
    advertise: Option<String>,
    /// Peer (Raft) listen address; defaults to the public port + 100.
    #[arg(long, env = "KAIROS_PEER_LISTEN")]
    peer_listen: Option<SocketAddr>,
    /// Directory from `kairos certs init`: ca.crt, node-<id>.crt and
    /// node-<id>.key. Both listeners then use TLS; peers must present a
    /// certificate from the CA naming their node.
    #[arg(long, env = "KAIROS_TLS_DIR")]
    tls_dir: Option<PathBuf>,
    /// File holding a token secret (one line, at least 16 characters).
    /// Public calls then need a token, and on a cluster without tokens this
    /// one becomes the first admin (named "admin"). Give every node the same file.
    #[arg(long, env = "KAIROS_AUTH_TOKEN_FILE")]
    auth_token_file: Option<PathBuf>,
    /// Allow non-loopback addresses without TLS and tokens (logs a warning).
    #[arg(long, env = "KAIROS_INSECURE")]
    insecure: bool,
    /// HTTP address for /healthz, /readyz, /metrics and the dashboard.
    #[arg(long, env = "KAIROS_HTTP", default_value = "127.0.0.1:7080")]
    http: SocketAddr,
    /// Data directory (created if missing).
    #[arg(long, env = "KAIROS_DATA_DIR", default_value = "./kairos-data")]
    data_dir: PathBuf,
    /// Voters of the cluster as ID=PEER_ADDR,... (their peer listeners);
    /// defaults to this node alone.
    #[arg(long, env = "KAIROS_PEERS", value_delimiter = ',')]
    peers: Vec<String>,
    /// Join an existing cluster (its public endpoints, ADDR,...): start
    /// empty and wait to be added with `kairosctl cluster add-learner` or
    /// `cluster replace`. Not with --peers.
    #[arg(
        long,
        env = "KAIROS_JOIN",
        value_delimiter = ',',
        conflicts_with = "peers"
    )]
    join: Vec<String>,
    /// Build a snapshot after this many log entries; no sooner than 4 times
    /// the last build's duration after it, unless 10 times as many wait.
    #[arg(long, env = "KAIROS_SNAPSHOT_LOGS", default_value_t = 10_000)]
    snapshot_logs: u64,
    /// Log entries kept behind a snapshot for lagging followers.
    #[arg(long, env = "KAIROS_KEEP_LOGS", default_value_t = 1_000)]
    keep_logs: u64,
    /// Leader heartbeat; also openraft's AppendEntries timeout.
    #[arg(long, env = "KAIROS_HEARTBEAT_MS", default_value_t = 100)]
    heartbeat_ms: u64,
    /// Election timeout range. openraft 0.9 also holds a leader lease of
    /// election-max after the last heartbeat, so a dead leader is replaced
    /// after lease + timeout (800–1000 ms with the defaults).
    #[arg(long, env = "KAIROS_ELECTION_MIN_MS", default_value_t = 300)]
    election_min_ms: u64,
    /// sled page cache in MiB (1..65536). Not a bound on memory: at 1M
    /// timers 64 MiB gave a larger RSS than the default (BENCHMARKS.md).
    #[arg(long, env = "KAIROS_CACHE_MB", default_value_t = 1024)]
    cache_mb: u64,
    /// MiB the data directory's disk keeps free (0..1048576): below it the
    /// node refuses writes with UNAVAILABLE, hands leadership over, and does
    /// not open its store until space returns.
    #[arg(long, env = "KAIROS_DISK_RESERVE_MB", default_value_t = kairos_server::disk::RESERVE_MB_DEFAULT, value_parser = clap::value_parser!(u64).range(0..=1 << 20))]
    disk_reserve_mb: u64,
    #[arg(long, env = "KAIROS_ELECTION_MAX_MS", default_value_t = 500)]
    election_max_ms: u64,
    /// Most ready attempts the leader holds in memory per worker group
    /// (1..100000); the rest wait on disk and are paged in as the queue drains.
    #[arg(long, default_value_t = kairos_server::leader::dispatch::QUEUE_MAX)]
    queue_max: usize,
    /// Client writes the leader holds admitted and not yet answered
    /// (1..65536); past it a write is refused with RESOURCE_EXHAUSTED and a
    /// retry-after hint.
    #[arg(long, env = "KAIROS_ADMIT_MAX_COMMANDS", default_value_t = Bounds::default().max_commands)]
    admit_max_commands: usize,
    /// The encoded size of those writes, in KiB (1..1048576).
    #[arg(long, env = "KAIROS_ADMIT_MAX_KB", default_value_t = Bounds::default().max_bytes >> 10)]
    admit_max_kb: usize,
    /// Log entries the leader has appended but not applied (1..1000000);
    /// past it client writes are refused.
    #[arg(long, env = "KAIROS_ADMIT_MAX_BACKLOG", default_value_t = Bounds::default().max_backlog)]
    admit_max_backlog: u64,
    /// How long applying those entries may take at the leader's recent
    /// apply rate (1..60000 ms); past it client writes are refused.
    #[arg(long, env = "KAIROS_ADMIT_MAX_BACKLOG_MS", default_value_t = Bounds::default().max_backlog_ms)]
    admit_max_backlog_ms: u64,
    /// Longest an admitted write waits to be proposed (1..60000 ms); then
    /// it is refused, unwritten.
    #[arg(long, env = "KAIROS_ADMIT_MAX_WAIT_MS", default_value_t = Bounds::default().max_wait_ms)]
    admit_max_wait_ms: u64,
    /// How long the oldest client write batch in the log may wait for its
    /// answer (1..60000 ms); past it every client write is refused, the
    /// reserve included, until that batch is answered.
    #[arg(long, env = "KAIROS_ADMIT_MAX_WRITE_AGE_MS", default_value_t = Bounds::default().max_write_age_ms)]
    admit_max_write_age_ms: u64,
    /// How late the leader's oldest due timer not yet proposed may be
    /// (1..3600000 ms); past it the cluster is behind on fires it owes and
    /// client writes get only the reserve.
    #[arg(long, env = "KAIROS_ADMIT_MAX_FIRE_LAG_MS", default_value_t = Bounds::default().max_fire_lag_ms)]
    admit_max_fire_lag_ms: u64,
    /// A client write batch slower than this from proposal to answer makes
    /// the leader let less fire work into the log ahead of writes
    /// (0..60000 ms; 0: fires never yield, for the most fires/s).
    #[arg(long, env = "KAIROS_ADMIT_WRITE_TARGET_MS", default_value_t = Bounds::default().write_target_ms)]
    admit_write_target_ms: u64,
    /// Client writes admitted whatever the log backlog while fewer are in
    /// flight (0..admit-max-commands; default 16, or admit-max-commands if
    /// smaller), so writes keep a share of the log when committed fires alone
    /// keep it past the bounds.
    #[arg(long, env = "KAIROS_ADMIT_RESERVE")]
    admit_reserve: Option<usize>,
    /// Log lines as `text` (human) or `json` (one object per line, with the
    /// run step's span and its fields: run, attempt, job, group, worker).
    #[arg(long, env = "KAIROS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Export spans (fire, retry, dispatch, finish of each run; client
    /// writes) over OTLP/gRPC to this `http://HOST:PORT` (a collector).
    /// Unset: no exporter. Spans that cannot be sent are dropped and counted
    /// (`kairos_otel_spans_dropped_total`); scheduling never waits for them.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// The exported spans' `service.name` (the node id is `kairos.node.id`).
    #[arg(long, env = "OTEL_SERVICE_NAME", default_value = "kairos")]
    otlp_service_name: String,
    /// Applied state is written to the store at least this often (0..60000
    /// ms; 0 writes after every applied batch). The log is what makes it
    /// durable: after a crash the node applies the log again from what was
    /// written.
    #[arg(long, env = "KAIROS_FLUSH_MS", default_value_t = kairos_server::store::sm::FLUSH_MS_DEFAULT)]
    flush_ms: u64,
    /// Watch events this node keeps in memory for `Jobs.Watch` (16..10000000);
    /// a watch asking for an older position gets "compacted — re-list".
    #[arg(long, env = "KAIROS_WATCH_EVENTS", default_value_t = kairos_server::watch::RING_EVENTS_DEFAULT)]
    watch_events: usize,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

/// Logs go to stderr; `RUST_LOG` overrides the default filter. With an
/// OTLP export, kairos' own info spans go to it too, whatever `RUST_LOG`
/// says (the exporter's own traffic is never traced); without one no
/// exporter layer is installed. Call inside the runtime (the exporter's
/// channel lives there).
fn init_logging(
    format: LogFormat,
    otlp: Option<&otel::Export>,
    sink: logsink::Sink,
) -> anyhow::Result<Option<otel::Flush>> {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{filter, fmt, Layer};

    let filter = filter::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,openraft=warn,sled=warn,h2=warn,tower=warn".into());
    // Colours for a person at a terminal, never escape codes in a log file.
    let logs = fmt::layer()
        .with_writer(sink)
        .with_ansi(std::io::stderr().is_terminal());
    let logs = match format {
        LogFormat::Text => logs.with_filter(filter).boxed(),
        LogFormat::Json => logs
            .json()
            .with_current_span(true)
            .with_filter(filter)
            .boxed(),
    };
    let logging = tracing_subscriber::registry().with(logs);
    let Some(export) = otlp else {
        logging.init();
        return Ok(None);
    };
    let (spans, flush) = export.start()?;
    let ours = filter::Targets::new().with_target("kairos_server", tracing::Level::INFO);
    logging.with(spans.with_filter(ours)).init();
    tracing::info!(endpoint = %export.endpoint, "exporting spans over OTLP");
    Ok(Some(flush))
}

/// The OTLP export `serve` asked for, validated (None: no endpoint).
fn otlp_export(a: &ServeArgs) -> anyhow::Result<Option<otel::Export>> {
    let Some(endpoint) = a.otlp_endpoint.clone().filter(|e| !e.is_empty()) else {
        return Ok(None);
    };
    let export = otel::Export {
        endpoint,
        service_name: a.otlp_service_name.clone(),
        node_id: a.id,
    };
    export.validate().map_err(anyhow::Error::msg)?;
    Ok(Some(export))
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

/// The default peer listener: the public port + 100 on the same host.
fn default_peer_listen(listen: SocketAddr) -> anyhow::Result<SocketAddr> {
    let port = listen
        .port()
        .checked_add(100)
        .filter(|_| listen.port() != 0);
    let port = port.with_context(|| {
        format!("--peer-listen: required when --listen {listen} has no port + 100")
    })?;
    Ok(SocketAddr::new(listen.ip(), port))
}

/// Without TLS, every address must be loopback unless --insecure was given.
fn check_transport(
    a: &ServeArgs,
    peer_listen: SocketAddr,
    peers: &BTreeMap<u64, String>,
) -> anyhow::Result<()> {
    let loopback = |addr: &str| {
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    };
    let mut open: Vec<String> = [a.listen, peer_listen, a.http]
        .iter()
        .map(|s| s.to_string())
        .chain(peers.values().cloned())
        .filter(|addr| !loopback(addr))
        .collect();
    open.dedup();
    let (tls, auth) = (a.tls_dir.is_some(), a.auth_token_file.is_some());
    match (tls, auth) {
        (true, true) => tracing::info!("secure mode: TLS on both listeners, tokens required"),
        (false, false) if open.is_empty() => {
            tracing::info!("development mode: loopback only, no TLS, no tokens")
        }
        _ if open.is_empty() => tracing::info!(tls, tokens = auth, "loopback only"),
        _ => {
            let missing = match (tls, auth) {
                (false, false) => "TLS (--tls-dir) and tokens (--auth-token-file)",
                (false, true) => "TLS (--tls-dir)",
                _ => "tokens (--auth-token-file)",
            };
            anyhow::ensure!(
                a.insecure,
                "refusing to serve on non-loopback addresses {} without {missing}: give --insecure to accept that anyone who reaches them can use the cluster",
                open.join(", ")
            );
            tracing::warn!(addresses = %open.join(", "), "INSECURE: serving on non-loopback addresses without {missing}");
        }
    }
    Ok(())
}

/// The node configuration and its peer listen address, from validated
/// arguments (files are read; nothing is bound).
fn node_config(a: &ServeArgs) -> anyhow::Result<(Config, SocketAddr)> {
    let advertise = a.advertise.clone().unwrap_or_else(|| a.listen.to_string());
    let peer_listen = match a.peer_listen {
        Some(p) => p,
        None => default_peer_listen(a.listen)?,
    };
    let mut peers = parse_peers(&a.peers)?;
    if peers.is_empty() {
        peers.insert(a.id, peer_listen.to_string());
    }
    check_transport(a, peer_listen, &peers)?;
    let mut config = Config::new(a.id, advertise, a.data_dir.clone(), peers);
    config.snapshot_logs = a.snapshot_logs;
    config.keep_logs = a.keep_logs;
    config.cache_bytes = a.cache_mb.saturating_mul(1 << 20);
    config.disk_reserve_bytes = a.disk_reserve_mb << 20;
    config.heartbeat_ms = a.heartbeat_ms;
    config.election_min_ms = a.election_min_ms;
    config.election_max_ms = a.election_max_ms;
    config.join = a.join.clone();
    config.queue_max = a.queue_max;
    config.flush_ms = a.flush_ms;
    config.watch_events = a.watch_events;
    config.admission = Bounds {
        max_commands: a.admit_max_commands,
        max_bytes: a.admit_max_kb.saturating_mul(1024),
        max_backlog: a.admit_max_backlog,
        max_backlog_ms: a.admit_max_backlog_ms,
        max_wait_ms: a.admit_max_wait_ms,
        max_write_age_ms: a.admit_max_write_age_ms,
        max_fire_lag_ms: a.admit_max_fire_lag_ms,
        write_target_ms: a.admit_write_target_ms,
        reserve: (a.admit_reserve)
            .unwrap_or_else(|| Bounds::default().reserve.min(a.admit_max_commands)),
    };
    if let Some(f) = &a.auth_token_file {
        let secret = std::fs::read_to_string(f)
            .with_context(|| format!("--auth-token-file {}", f.display()))?
            .trim()
            .to_string();
        anyhow::ensure!(
            secret.len() >= 16 && secret.bytes().all(|b| b.is_ascii_graphic()),
            "--auth-token-file {}: the token must be one line of at least 16 printable characters",
            f.display()
        );
        config.auth_token = Some(secret);
    }
    if let Some(dir) = &a.tls_dir {
        config.tls = Some(std::sync::Arc::new(kairos_server::tls::NodeTls::load(
            dir, a.id,
        )?));
    }
    config.validate()?;
    Ok((config, peer_listen))
}

/// The `serve` arguments with the `--config` file under them.
fn with_config_file(a: ServeArgs) -> anyhow::Result<ServeArgs> {
    match &a.config {
        Some(path) => config::with_file(path, config::serve_cli_args()),
        None => Ok(a),
    }
}

async fn serve(a: ServeArgs) -> anyhow::Result<()> {
    let (config, peer_listen) = node_config(&a)?;
    let grpc = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("--listen {}", a.listen))?;
    let peer = tokio::net::TcpListener::bind(peer_listen)
        .await
        .with_context(|| format!("--peer-listen {peer_listen}"))?;
    let http = tokio::net::TcpListener::bind(a.http)
        .await
        .with_context(|| format!("--http {}", a.http))?;
    // SIGINT or SIGTERM: stop serving and shut raft down cleanly.
    let mut stop = kairos_client::process::StopSignals::new();
    let shutdown = async move { stop.next().await };
    run(config, grpc, peer, Some(http), shutdown).await
}

fn main() -> anyhow::Result<()> {
    // No huge pages (see `ALLOC`); a refusal is logged once logging is up.
    let thp_off = rustix::thread::disable_transparent_huge_pages(true);
    let cli = Cli::parse();
    let cmd = match cli.cmd {
        Some(cmd) => cmd,
        None => Cli::parse_from(["kairos", "serve"])
            .cmd
            .expect("`kairos serve` parses as Serve"),
    };
    // The config file may set the log format, so it is read first.
    let cmd = match cmd {
        Cmd::Serve(a) => Cmd::Serve(with_config_file(a)?),
        other => other,
    };
    let (format, otlp) = match &cmd {
        Cmd::Serve(a) => (a.log_format, otlp_export(a)?),
        _ => (LogFormat::Text, None),
    };
    // Dropped last, after the runtime: what was logged is written before the process exits.
    let (sink, _log_flush) = logsink::start(std::io::stderr());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let _in_rt = rt.enter();
    let flush = init_logging(format, otlp.as_ref(), sink)?;
    if let Err(e) = thp_off {
        tracing::warn!(error = %e, "could not turn transparent huge pages off for this process");
    }
    let done = run_cmd(&rt, cmd);
    // Queued spans are sent while the runtime still runs.
    if let Some(flush) = flush {
        flush.shutdown();
    }
    done
}

fn run_cmd(rt: &tokio::runtime::Runtime, cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Serve(a) => rt.block_on(serve(a)),
        Cmd::Playground(p) => rt.block_on(playground::run(p)),
        Cmd::Snapshot(SnapshotCmd::Inspect { file }) => inspect(&file),
        Cmd::Restore { from, data_dir } => {
            let r = kairos_server::backup::restore_offline(&from, &data_dir)?;
            println!(
                "{}: {} records restored from {} (backup of log index {})",
                data_dir.display(),
                r.pairs,
                from.display(),
                r.backup_index
            );
            Ok(())
        }
        Cmd::Config(ConfigCmd::Check { file }) => {
            let a = config::with_file(&file, Vec::new())?;
            node_config(&a)?;
            otlp_export(&a)?;
            println!("{}: ok", file.display());
            Ok(())
        }
        Cmd::Certs(CertsCmd::Init { out, nodes, hosts }) => {
            for f in kairos_server::tls::init(&out, nodes, &hosts)? {
                println!("{}", f.display());
            }
            Ok(())
        }
    }
}
