//! One bounded test run, start to verdict: set up the network (or loopback),
//! start the nodes, wait for a leader, record `meta`, run the workloads with
//! the nemesis for the time limit, heal everything, let the cluster settle,
//! write a probe, pause the interval jobs (closing the checking window), let
//! the replicas converge, record every node's final state, tear down, and
//! judge the history with `check::check_dir`. Beside the workloads a poller
//! records who claims to lead which term (`leader` events), and at the end
//! the nodes' logs add their own "leading" lines.
//!
//! A run injects every fault family it was asked for or fails before it
//! starts (`Unsupported`, exit code 4): only `--loopback` asks for fewer,
//! and the families it drops are stated in the history's `meta`.

use crate::check::{self, Summary, HISTORY_FILE};
use crate::checker::leaders;
use crate::client::{self, Node, FAR_FUTURE_MS};
use crate::clock::Clock;
use crate::cluster::{Cluster, NodeSpec, FAKETIME_LIB};
use crate::event::{
    Bounds, DroppedNemesis, Event, FinalNode, LeaderClaim, Meta, NodeInfo, OpF, Outcome, Workload,
};
use crate::generator::{fault_plan_every, MEMBERSHIP, NETWORK_FAMILIES};
use crate::membership::Membership;
use crate::nemesis::Nemesis;
use crate::net::{self, Net};
use crate::recorder::Recorder;
use crate::workload::{self, execute, invocation, Ctx, Reply};
use crate::{clean, final_state};
use anyhow::{bail, Context, Result};
use kairos_proto::v1::schedule::Kind;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeSet, HashSet};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Debug, Clone)]
pub struct RunConfig {
    pub nodes: usize,
    pub time_limit_s: u64,
    pub nemeses: Vec<String>,
    pub workloads: Vec<String>,
    /// Client operations per second (register and timers together).
    pub rate: f64,
    pub seed: u64,
    pub out: PathBuf,
    pub bin: PathBuf,
    /// Settling time after the final heal.
    pub quiet_s: u64,
    pub op_timeout_ms: u64,
    pub bounds: Bounds,
    /// Use loopback even when namespaces are available.
    pub loopback: bool,
    /// Extra arguments for every `kairos serve`.
    pub node_args: Vec<String>,
    /// Without TLS and tokens (the default runs with both).
    pub plain: bool,
    /// Mean spacing between fault starts (`generator::density`).
    pub fault_every_ms: u64,
    /// `KAIROS_FAILPOINT` for every node (empty: none).
    pub failpoint: String,
    /// Every power fault cuts every node, whatever scope the plan drew.
    pub power_all: bool,
}

/// Exit code of a run that could not inject a fault family it was asked for.
pub const EXIT_UNSUPPORTED: i32 = 4;
/// Exit code of any other harness error.
pub const EXIT_HARNESS_ERROR: i32 = 2;
/// Families that run their nodes on a FUSE filesystem (`cluster.rs`).
pub const FUSE_FAMILIES: [&str; 4] = ["power", "disk-full", "disk-error", "slow-disk"];
/// Leader claims recorded per run, at most (first sightings only).
const MAX_LEADER_CLAIMS: usize = 100_000;
/// How often the leader poller asks one slot (round robin) for its status.
const LEADER_POLL: Duration = Duration::from_secs(1);

/// What this host can inject; `Err` says why not.
#[derive(Debug, Clone)]
pub struct Caps {
    pub namespaces: Result<(), String>,
    pub faketime: Result<(), String>,
    pub fuse: Result<(), String>,
}

impl Caps {
    /// Probes the host (creating and deleting a namespace as root).
    pub fn probe() -> Caps {
        Caps {
            namespaces: namespaces_status(),
            faketime: if Path::new(FAKETIME_LIB).exists() {
                Ok(())
            } else {
                Err(format!("{FAKETIME_LIB} missing (apt-get install faketime)"))
            },
            fuse: fuse_status(),
        }
    }
}

/// The fault families a run injects, and those `--loopback` dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct NemesisChoice {
    pub nemeses: Vec<String>,
    pub dropped: Vec<DroppedNemesis>,
}

/// A run was asked for fault families this host cannot inject.
#[derive(Debug, Clone, PartialEq)]
pub struct Unsupported(pub Vec<DroppedNemesis>);

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let each: Vec<String> = self
            .0
            .iter()
            .map(|d| format!("{}: {}", d.family, d.reason))
            .collect();
        write!(
            f,
            "cannot inject the requested nemesis ({}); fix the host, drop the family from --nemesis, \
             or pass --loopback to run without the network faults",
            each.join("; ")
        )
    }
}

impl std::error::Error for Unsupported {}

/// What a family needs from the host, if anything.
fn need<'a>(family: &str, caps: &'a Caps) -> Option<&'a Result<(), String>> {
    if NETWORK_FAMILIES.contains(&family) {
        Some(&caps.namespaces)
    } else if family == "clock" {
        Some(&caps.faketime)
    } else if FUSE_FAMILIES.contains(&family) {
        Some(&caps.fuse)
    } else {
        None
    }
}

/// Decides which requested families a run injects. `--loopback` drops the
/// network families (and says so); any other family the host cannot
/// inject — or a network family without `--loopback` — fails the run.
pub fn choose_nemeses(
    requested: &[String],
    caps: &Caps,
    loopback: bool,
) -> Result<NemesisChoice, Unsupported> {
    let mut choice = NemesisChoice {
        nemeses: Vec::new(),
        dropped: Vec::new(),
    };
    let mut missing = Vec::new();
    for f in requested {
        if loopback && NETWORK_FAMILIES.contains(&f.as_str()) {
            choice.dropped.push(DroppedNemesis {
                family: f.clone(),
                reason: "--loopback: nodes share 127.0.0.1, no network faults".into(),
            });
            continue;
        }
        match need(f, caps) {
            Some(Err(why)) => missing.push(DroppedNemesis {
                family: f.clone(),
                reason: why.clone(),
            }),
            _ => choice.nemeses.push(f.clone()),
        }
    }
    if missing.is_empty() {
        Ok(choice)
    } else {
        Err(Unsupported(missing))
    }
}

/// Exit code for a run that ended in `e`.
pub fn error_code(e: &anyhow::Error) -> i32 {
    if e.downcast_ref::<Unsupported>().is_some() {
        EXIT_UNSUPPORTED
    } else {
        EXIT_HARNESS_ERROR
    }
}

/// Writes `results.json` for a run that ended without a verdict.
pub fn record_error(out: &Path, e: &anyhow::Error, code: i32) {
    let unsupported = e
        .downcast_ref::<Unsupported>()
        .map(|u| u.0.clone())
        .unwrap_or_default();
    if let Err(w) = crate::report::write_error(out, &format!("{e:#}"), code, &unsupported) {
        eprintln!("kairos-jepsen: could not write results.json: {w:#}");
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

fn namespaces_status() -> Result<(), String> {
    if !is_root() {
        return Err("network namespaces need root".into());
    }
    for (cmd, arg, pkg) in [
        ("ip", "-V", "iproute2"),
        ("iptables", "--version", "iptables"),
    ] {
        if !clean::quiet(cmd, &[arg]) {
            return Err(format!("`{cmd}` not found (apt-get install {pkg})"));
        }
    }
    if !net::namespaces_available() {
        return Err("could not create a network namespace with iptables in it".into());
    }
    Ok(())
}

fn fuse_status() -> Result<(), String> {
    if !Path::new("/dev/fuse").exists() {
        return Err("/dev/fuse missing (FUSE not available)".into());
    }
    let fusermount = ["fusermount3", "fusermount"]
        .iter()
        .any(|c| clean::quiet(c, &["-V"]));
    if !is_root() && !fusermount {
        return Err("mounting FUSE needs root or fusermount3".into());
    }
    Ok(())
}

/// Upper bound on a run's wall time beyond its time limit.
pub const OVERHEAD_S: u64 = 240;
/// Restoring one voter per slot after the faults (membership nemesis) may
/// take this long; part of `OVERHEAD_S`.
const RESTORE_LIMIT: Duration = Duration::from_secs(60);
/// Salt for the membership nemesis' own random stream, so adding it leaves
/// the fault plan of a seed unchanged.
const MEMBERSHIP_SALT: u64 = 0x6d65_6d62;
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const WORKERS: usize = 2;
/// Timers are due at most this long after their create.
const MAX_TIMER_DELAY_S: u64 = 31;
/// Rounds of final reads, until every node's lists were read at one index.
const FINAL_READ_ROUNDS: usize = 3;
/// Tries per interval job to pause it, each on the next node.
const QUIESCE_ATTEMPTS: u64 = 5;

pub fn run_id() -> String {
    let mut rng = rand::thread_rng();
    (0..4)
        .map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.gen_range(0..36)]))
        .collect()
}

/// Runs the test and checks it. Everything it creates is registered with
/// `clean`, so the caller can tear down on Ctrl-C or panic.
pub async fn run(cfg: RunConfig) -> Result<Summary> {
    for line in clean::reap_stale() {
        println!("clean: {line}");
    }
    std::fs::create_dir_all(&cfg.out)?;
    let id = run_id();
    clean::claim_run(&id);
    let result = run_claimed(cfg, id.clone()).await;
    clean::release_run(&id);
    result
}

async fn run_claimed(cfg: RunConfig, id: String) -> Result<Summary> {
    let caps = Caps::probe();
    let choice = choose_nemeses(&cfg.nemeses, &caps, cfg.loopback)?;
    for d in &choice.dropped {
        println!("NOTE: {} faults not injected: {}", d.family, d.reason);
    }
    let use_ns = !cfg.loopback && caps.namespaces.is_ok();
    if !use_ns {
        let why = match &caps.namespaces {
            _ if cfg.loopback => "--loopback".to_string(),
            Err(e) => e.clone(),
            Ok(()) => String::new(),
        };
        println!("NOTE: nodes run on 127.0.0.1 ({why})");
    }
    let faketime = choice.nemeses.iter().any(|f| f == "clock");
    let net = if use_ns {
        Some(Arc::new(Net::create(
            &id,
            cfg.nodes,
            cfg.seed ^ std::process::id() as u64,
        )?))
    } else {
        None
    };
    let specs = node_specs(&cfg, &id, net.as_deref())?;
    let bin = pin_binary(&cfg)?;
    let disks = crate::disk::DiskConfig::for_run(&choice.nemeses, &cfg.bin, cfg.seed)?;
    let mut cluster = Cluster::with_disks(bin, id.clone(), specs, faketime, disks)?;
    cluster.extra_args = cfg.node_args.clone();
    if !cfg.failpoint.is_empty() {
        println!(
            "NOTE: every node runs with KAIROS_FAILPOINT={}",
            cfg.failpoint
        );
        cluster
            .env
            .push(("KAIROS_FAILPOINT".into(), cfg.failpoint.clone()));
    }
    if !cfg.plain {
        cluster.secure(&cfg.out)?;
    }
    let cluster = Arc::new(cluster);
    let result = drive(&cfg, &id, &choice, cluster.clone(), net.clone()).await;
    cluster.shutdown();
    if let Some(n) = &net {
        n.destroy();
    }
    result?;
    check::check_dir(&cfg.out)
}

/// Copies the kairos binary into the run directory so every start and
/// restart runs the same build, even if the shared target dir is rebuilt
/// mid-run (a node restarted on a newer build may not read its own data).
fn pin_binary(cfg: &RunConfig) -> Result<PathBuf> {
    let dir = cfg.out.join("bin");
    std::fs::create_dir_all(&dir)?;
    let pinned = dir.join("kairos");
    std::fs::copy(&cfg.bin, &pinned)
        .with_context(|| format!("copy {} to {}", cfg.bin.display(), pinned.display()))?;
    Ok(pinned)
}

fn node_specs(cfg: &RunConfig, id: &str, net: Option<&Net>) -> Result<Vec<NodeSpec>> {
    let base = if net.is_none() {
        free_port_base(cfg.nodes)?
    } else {
        0
    };
    Ok((1..=cfg.nodes as u64)
        .map(|i| {
            let (listen, peer, http, netns) = match net {
                Some(n) => {
                    let ip = n.ip(i as usize - 1);
                    (
                        format!("{ip}:{}", net::GRPC_PORT),
                        format!("{ip}:{}", net::PEER_PORT),
                        format!("{ip}:{}", net::HTTP_PORT),
                        Some(n.nodes[i as usize - 1].ns.clone()),
                    )
                }
                None => (
                    format!("127.0.0.1:{}", base + i as u16),
                    format!("127.0.0.1:{}", base + 200 + i as u16),
                    format!("127.0.0.1:{}", base + 100 + i as u16),
                    None,
                ),
            };
            NodeSpec {
                id: i,
                listen,
                peer,
                http,
                netns,
                dir: cfg.out.join("nodes").join(format!("{id}-n{i}")),
            }
        })
        .collect())
}

/// A base port whose next 300 ports look free on loopback.
fn free_port_base(n: usize) -> Result<u16> {
    let mut rng = rand::thread_rng();
    for _ in 0..50 {
        let base: u16 = rng.gen_range(20_000..40_000);
        let free = (1..=n as u16)
            .flat_map(|i| [base + i, base + 100 + i, base + 200 + i])
            .all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok());
        if free {
            return Ok(base);
        }
    }
    bail!("no free loopback ports")
}

/// What the live phases share.
struct Live {
    rec: Recorder,
    nodes: Arc<Vec<Node>>,
    op_timeout: Duration,
    seed: u64,
}

impl Live {
    fn ctx(&self, stop: watch::Receiver<bool>) -> Ctx {
        Ctx {
            rec: self.rec.clone(),
            nodes: self.nodes.clone(),
            op_timeout: self.op_timeout,
            stop,
            seed: self.seed,
        }
    }
}

/// Running workload tasks and their stop signals.
struct Workloads {
    stop_clients: watch::Sender<bool>,
    clients_rx: watch::Receiver<bool>,
    stop_workers: watch::Sender<bool>,
    workers: Option<JoinHandle<()>>,
    interval: Option<JoinHandle<Vec<String>>>,
    timers: Option<JoinHandle<Vec<String>>>,
    register: Option<JoinHandle<()>>,
    /// The workflow diamonds: (root job ids, every job id).
    workflow: Option<JoinHandle<(Vec<String>, Vec<String>)>>,
}

async fn drive(
    cfg: &RunConfig,
    id: &str,
    choice: &NemesisChoice,
    cluster: Arc<Cluster>,
    net: Option<Arc<Net>>,
) -> Result<()> {
    let nemeses = &choice.nemeses;
    let clock = Clock::new();
    let rec = Recorder::create(&cfg.out.join(HISTORY_FILE), clock.clone())?;
    let nodes = start_nodes(cfg, id, &cluster).await?;
    let mut m = meta(cfg, id, nemeses, &nodes, net.is_some(), clock.now_ms());
    m.dropped_nemeses = choice.dropped.clone();
    rec.record(Event::Meta(m)).await;
    let (stop_poller, poller_rx) = watch::channel(false);
    let poller = tokio::spawn(poll_leaders(rec.clone(), nodes.clone(), poller_rx));
    let live = Live {
        rec,
        nodes,
        op_timeout: Duration::from_millis(cfg.op_timeout_ms),
        seed: cfg.seed,
    };
    let w = spawn_workloads(cfg, &live);
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let plan = fault_plan_every(
        &mut rng,
        nemeses,
        live.nodes.len(),
        cfg.time_limit_s * 1000,
        cfg.fault_every_ms,
    );
    let plan = if cfg.power_all {
        crate::generator::power_all(plan)
    } else {
        plan
    };
    println!("nemesis plan: {} faults", plan.len());
    let membership = nemeses.iter().any(|f| f == MEMBERSHIP).then(|| {
        let rng = StdRng::seed_from_u64(cfg.seed ^ MEMBERSHIP_SALT);
        let mut m = Membership::new(cluster.clone(), live.nodes.clone(), live.rec.clone(), rng);
        let stop = w.clients_rx.clone();
        tokio::spawn(async move {
            m.run(stop).await;
            m
        })
    });
    let mut nemesis = Nemesis::new(
        cluster.clone(),
        net,
        live.nodes.clone(),
        live.rec.clone(),
        rng,
    );
    let (t0, stop) = (tokio::time::Instant::now(), w.clients_rx.clone());
    let nemesis_task = tokio::spawn(async move {
        nemesis.run_plan(plan, t0, stop).await;
        nemesis
    });
    tokio::time::sleep(Duration::from_secs(cfg.time_limit_s)).await;
    println!("time limit reached: healing and settling");
    let _ = w.stop_clients.send(true);
    let nemesis = nemesis_task.await?;
    nemesis.heal_everything().await;
    if let Some(task) = membership {
        let whole = task.await?.restore(RESTORE_LIMIT).await;
        println!("membership restored to one voter per slot: {whole}");
    }
    let ids = settle(cfg, id, &live, &nemesis, w).await;
    let converged = final_state::wait_converged(&live.nodes, Duration::from_secs(30)).await;
    println!("replicas converged: {converged}");
    for f in final_reads(&live.rec, &live.nodes, &ids).await {
        live.rec.record(Event::Final(f)).await;
    }
    let _ = stop_poller.send(true);
    let _ = poller.await;
    for c in log_claims(&cluster) {
        live.rec.record(Event::Leader(c)).await;
    }
    live.rec.sync().await;
    Ok(())
}

/// Asks one slot a second (round robin) for its `Cluster.Status` — its own
/// view and each peer's, each node reporting its role and term — and
/// records every node that says it leads, the first time each (reporter,
/// node, term) is seen. One call a second, since every status makes each
/// node hash its state.
async fn poll_leaders(rec: Recorder, nodes: Arc<Vec<Node>>, mut stop: watch::Receiver<bool>) {
    let mut seen: HashSet<(u64, u64, u64)> = HashSet::new();
    let mut slot = 0usize;
    loop {
        let node = &nodes[slot % nodes.len()];
        slot += 1;
        let reporter = node.id();
        if let Ok(s) = client::status(&node.channel, Duration::from_millis(800)).await {
            let time_ms = rec.now_ms();
            for n in s.nodes.iter().filter(|n| n.role == "leader") {
                if seen.len() < MAX_LEADER_CLAIMS && seen.insert((reporter, n.id, n.term)) {
                    let claim = LeaderClaim {
                        time_ms,
                        term: n.term,
                        node: n.id,
                        source: "status".into(),
                        reporter,
                        node_time: String::new(),
                    };
                    rec.record(Event::Leader(claim)).await;
                }
            }
        }
        let next = tokio::time::Instant::now() + LEADER_POLL;
        if crate::nemesis::stopped_during(&mut stop, next).await {
            return;
        }
    }
}

/// The "leading" lines of every slot's log, as leader claims.
fn log_claims(cluster: &Cluster) -> Vec<LeaderClaim> {
    let mut out = Vec::new();
    for spec in &cluster.nodes {
        let Ok(f) = std::fs::File::open(spec.log_path()) else {
            continue;
        };
        let mut relevant = String::new();
        for line in std::io::BufReader::new(f)
            .lines()
            .take(leaders::MAX_LOG_LINES)
            .map_while(|l| l.ok())
        {
            if line.starts_with(leaders::START_MARKER) || line.contains(leaders::LEADING_LOG) {
                relevant.push_str(&line);
                relevant.push('\n');
            }
        }
        let mut seen = HashSet::new();
        for c in leaders::parse_log(&relevant) {
            if seen.insert((c.node, c.term)) && out.len() < MAX_LEADER_CLAIMS {
                out.push(LeaderClaim {
                    time_ms: c.time_ms,
                    term: c.term,
                    node: c.node,
                    source: "log".into(),
                    reporter: c.node,
                    node_time: c.node_time,
                });
            }
        }
    }
    out
}

/// Starts every node and waits for a leader.
async fn start_nodes(cfg: &RunConfig, id: &str, cluster: &Cluster) -> Result<Arc<Vec<Node>>> {
    cluster.start_all()?;
    let nodes: Vec<Node> = cluster
        .nodes
        .iter()
        .enumerate()
        .map(|(slot, s)| {
            Ok(Node::new(
                slot,
                s.id,
                s.listen.clone(),
                client::channel(&s.listen, &cluster.security)?,
            ))
        })
        .collect::<Result<_>>()?;
    let addrs: Vec<&str> = nodes.iter().map(|n| n.addr.as_str()).collect();
    println!(
        "run {id}: nodes {addrs:?}, args {:?}, out {}",
        cluster.extra_args,
        cfg.out.display()
    );
    if !wait_leader(&nodes, READY_TIMEOUT).await {
        bail!(
            "no leader within {READY_TIMEOUT:?}; node 1 log tail:\n{}",
            cluster.log_tail(0, 20)
        );
    }
    Ok(Arc::new(nodes))
}

fn spawn_workloads(cfg: &RunConfig, live: &Live) -> Workloads {
    let (stop_clients, clients_rx) = watch::channel(false);
    let (stop_workers, workers_rx) = watch::channel(false);
    let has = |w: &str| cfg.workloads.iter().any(|x| x == w);
    let timers_cfg = workload::timers::Config {
        rate: (cfg.rate * 0.3).max(0.2),
        max_timers: 20_000,
        create_until: tokio::time::Instant::now()
            + Duration::from_secs(
                cfg.time_limit_s
                    .saturating_sub(MAX_TIMER_DELAY_S)
                    .max(cfg.time_limit_s / 2),
            ),
    };
    let reg_cfg = workload::register::Config {
        rate: (cfg.rate * 0.7).max(0.2),
        ..Default::default()
    };
    let clients = || live.ctx(clients_rx.clone());
    Workloads {
        workers: (has("execution") || has("workflow")).then(|| {
            tokio::spawn(workload::execution::run(
                live.ctx(workers_rx.clone()),
                WORKERS,
            ))
        }),
        interval: has("interval")
            .then(|| tokio::spawn(workload::interval::run(clients(), Default::default()))),
        timers: has("timers").then(|| tokio::spawn(workload::timers::run(clients(), timers_cfg))),
        register: has("register")
            .then(|| tokio::spawn(workload::register::run(clients(), reg_cfg))),
        workflow: has("workflow").then(|| tokio::spawn(workload::workflow::run(clients()))),
        stop_clients,
        clients_rx: clients_rx.clone(),
        stop_workers,
    }
}

/// After the faults: collect the client workloads, settle, probe, quiesce,
/// stop the workers. Returns every job id the harness touched.
async fn settle(
    cfg: &RunConfig,
    id: &str,
    live: &Live,
    nemesis: &Nemesis,
    w: Workloads,
) -> BTreeSet<String> {
    let mut ids: BTreeSet<String> = BTreeSet::new();
    let mut scheduled = match w.interval {
        Some(t) => t.await.unwrap_or_default(),
        None => Vec::new(),
    };
    ids.extend(scheduled.iter().cloned());
    if let Some(t) = w.workflow {
        let (roots, all) = t.await.unwrap_or_default();
        ids.extend(all);
        scheduled.extend(roots);
    }
    if let Some(t) = w.timers {
        ids.extend(t.await.unwrap_or_default());
    }
    if let Some(t) = w.register {
        let _ = t.await;
    }
    tokio::time::sleep(Duration::from_secs(cfg.quiet_s)).await;
    nemesis.heal_everything().await;
    wait_leader(&live.nodes, Duration::from_secs(30)).await;
    let (_admin_stop, admin_rx) = watch::channel(false);
    let admin = live.ctx(admin_rx);
    ids.insert(probe(&admin, id).await);
    quiesce(&admin, &scheduled).await;
    // Fires stopped: let the last assignments and finishes commit (the log
    // goes quiet and every node applied it) before the workers stop.
    final_state::wait_converged(&live.nodes, Duration::from_secs(10)).await;
    let _ = w.stop_workers.send(true);
    if let Some(t) = w.workers {
        let _ = t.await;
    }
    ids
}

/// Reads every node, again (bounded) while some node's state moved during
/// its read or the nodes disagree on the applied index.
async fn final_reads(rec: &Recorder, nodes: &[Node], ids: &BTreeSet<String>) -> Vec<FinalNode> {
    let mut finals = Vec::new();
    for round in 0..FINAL_READ_ROUNDS {
        if round > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let now = rec.now_ms();
        let reads = nodes.iter().map(|n| {
            let (n, ids) = (n.clone(), ids.clone());
            async move { final_state::read_node(&n, &ids, now).await }
        });
        finals = client::join_all(reads).await;
        let indexes: BTreeSet<(u64, u64)> = finals
            .iter()
            .filter(|f| f.reachable)
            .map(|f| (f.applied_index, f.applied_index_after))
            .collect();
        let stable = indexes.len() == 1 && indexes.iter().all(|(a, b)| a == b);
        if stable {
            break;
        }
        println!("final read round {round}: replicas moved while being read, reading again");
    }
    finals
}

fn meta(
    cfg: &RunConfig,
    id: &str,
    nemeses: &[String],
    nodes: &[Node],
    ns: bool,
    start_ms: i64,
) -> Meta {
    Meta {
        run_id: id.to_string(),
        seed: cfg.seed,
        mode: if ns { "netns" } else { "loopback" }.to_string(),
        nodes: nodes
            .iter()
            .map(|n| NodeInfo {
                id: n.id(),
                addr: n.addr.clone(),
            })
            .collect(),
        start_ms,
        time_limit_s: cfg.time_limit_s,
        nemeses: nemeses.to_vec(),
        workloads: cfg.workloads.clone(),
        bounds: cfg.bounds,
        dropped_nemeses: Vec::new(),
        failpoint: cfg.failpoint.clone(),
        power_all: cfg.power_all,
    }
}

async fn wait_leader(nodes: &[Node], limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if client::find_leader(nodes).await.is_some() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    false
}

/// The liveness write: a fresh job, retried a bounded number of times.
async fn probe(ctx: &Ctx, run_id: &str) -> String {
    let key = format!("probe-{run_id}");
    for attempt in 0..10u64 {
        let node = ctx.node(attempt as usize).clone();
        let inv = invocation(
            9_000 + attempt,
            node.id(),
            Workload::Probe,
            OpF::Create,
            &key,
        );
        let spec = client::spec(&key, Kind::AtMs(FAR_FUTURE_MS), Vec::new(), "jepsen-probe");
        let t = ctx.op_timeout;
        let c = execute(ctx, inv, async {
            client::create(&node.channel, spec, t).await.map(Reply::Job)
        })
        .await;
        if c.outcome == Outcome::Ok || c.code.as_deref() == Some("ALREADY_EXISTS") {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    key
}

/// Pauses every interval job and workflow root so fires stop and replicas
/// can converge.
async fn quiesce(ctx: &Ctx, ids: &[String]) {
    for (k, id) in ids.iter().enumerate() {
        for attempt in 0..QUIESCE_ATTEMPTS {
            let node = ctx.node(k + attempt as usize).clone();
            let inv = invocation(
                9_100 + k as u64 * QUIESCE_ATTEMPTS + attempt,
                node.id(),
                Workload::Quiesce,
                OpF::Pause,
                id,
            );
            let t = ctx.op_timeout;
            let c = execute(ctx, inv, async {
                client::pause(&node.channel, id, t).await.map(Reply::Job)
            })
            .await;
            if c.outcome == Outcome::Ok || c.code.as_deref() == Some("NOT_FOUND") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fams(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn caps(namespaces: bool, faketime: bool, fuse: bool) -> Caps {
        let why = |ok: bool, r: &str| if ok { Ok(()) } else { Err(r.to_string()) };
        Caps {
            namespaces: why(namespaces, "network namespaces need root"),
            faketime: why(faketime, "libfaketime missing"),
            fuse: why(fuse, "/dev/fuse missing"),
        }
    }

    #[test]
    fn a_family_the_host_cannot_inject_fails_the_run() {
        let asked = fams(&["partition", "kill", "pause", "clock", "membership"]);
        let err = choose_nemeses(&asked, &caps(false, true, true), false).unwrap_err();
        assert_eq!(err.0.len(), 1);
        assert_eq!(err.0[0].family, "partition");
        assert_eq!(err.0[0].reason, "network namespaces need root");
        let text = err.to_string();
        assert!(
            text.contains("partition: network namespaces need root"),
            "{text}"
        );
        // Every missing family is named, whatever it needs.
        let asked = fams(&["loss", "clock", "power", "kill"]);
        let err = choose_nemeses(&asked, &caps(false, false, false), false).unwrap_err();
        let named: Vec<&str> = err.0.iter().map(|d| d.family.as_str()).collect();
        assert_eq!(named, vec!["loss", "clock", "power"]);
        let e = anyhow::Error::new(err);
        assert_eq!(error_code(&e), EXIT_UNSUPPORTED);
        assert_eq!(
            error_code(&anyhow::anyhow!("no leader")),
            EXIT_HARNESS_ERROR
        );
    }

    #[test]
    fn only_loopback_drops_the_network_families_and_says_so() {
        let asked = fams(&["partition", "kill", "snapshot", "clock"]);
        let c = choose_nemeses(&asked, &caps(false, true, false), true).unwrap();
        assert_eq!(c.nemeses, fams(&["kill", "clock"]));
        let dropped: Vec<&str> = c.dropped.iter().map(|d| d.family.as_str()).collect();
        assert_eq!(dropped, vec!["partition", "snapshot"]);
        assert!(c.dropped[0].reason.contains("--loopback"));
        // --loopback excuses only the network: a missing libfaketime still fails.
        assert!(choose_nemeses(&asked, &caps(true, false, true), true).is_err());
    }

    #[test]
    fn a_capable_host_injects_everything_asked() {
        let asked = fams(&[
            "partition",
            "kill",
            "pause",
            "clock",
            "loss",
            "bandwidth",
            "snapshot",
            "membership",
            "disk-full",
        ]);
        let c = choose_nemeses(&asked, &caps(true, true, true), false).unwrap();
        assert_eq!(c.nemeses, asked);
        assert!(c.dropped.is_empty());
        // Without namespaces, families that need none still run.
        let asked = fams(&["kill", "pause", "membership"]);
        let c = choose_nemeses(&asked, &caps(false, true, false), false).unwrap();
        assert_eq!(c.nemeses, asked);
    }
}
