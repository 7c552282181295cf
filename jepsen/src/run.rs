//! One bounded test run, start to verdict: set up the network (or loopback),
//! start the nodes, wait for a leader, record `meta`, run the workloads with
//! the nemesis for the time limit, heal everything, let the cluster settle,
//! write a probe, pause the interval jobs (closing the checking window), let
//! the replicas converge, record every node's final state, tear down, and
//! judge the history with `check::check_dir`.

use crate::check::{self, Summary, HISTORY_FILE};
use crate::client::{self, Node, FAR_FUTURE_MS};
use crate::clock::Clock;
use crate::cluster::{Cluster, NodeSpec, FAKETIME_LIB};
use crate::event::{Bounds, Event, FinalNode, Meta, NodeInfo, OpF, Outcome, Workload};
use crate::generator::{fault_plan, MEMBERSHIP, NETWORK_FAMILIES};
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
use std::collections::BTreeSet;
use std::path::PathBuf;
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
    let use_ns = !cfg.loopback && net::namespaces_available();
    let mut nemeses = cfg.nemeses.clone();
    if !use_ns {
        println!("NOTE: no network namespaces (not root, or --loopback): nodes run on 127.0.0.1 and the {NETWORK_FAMILIES:?} faults are disabled");
        nemeses.retain(|f| !NETWORK_FAMILIES.contains(&f.as_str()));
    }
    let faketime =
        nemeses.iter().any(|f| f == "clock") && std::path::Path::new(FAKETIME_LIB).exists();
    if nemeses.iter().any(|f| f == "clock") && !faketime {
        println!("NOTE: {FAKETIME_LIB} missing (apt-get install faketime): clock faults disabled");
        nemeses.retain(|f| f != "clock");
    }
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
    let mut cluster = Cluster::new(bin, id.clone(), specs, faketime)?;
    cluster.extra_args = cfg.node_args.clone();
    if !cfg.plain {
        cluster.secure(&cfg.out)?;
    }
    let cluster = Arc::new(cluster);
    let result = drive(&cfg, &id, &nemeses, cluster.clone(), net.clone()).await;
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
    nemeses: &[String],
    cluster: Arc<Cluster>,
    net: Option<Arc<Net>>,
) -> Result<()> {
    let clock = Clock::new();
    let rec = Recorder::create(&cfg.out.join(HISTORY_FILE), clock.clone())?;
    let nodes = start_nodes(cfg, id, &cluster).await?;
    let m = meta(cfg, id, nemeses, &nodes, net.is_some(), clock.now_ms());
    rec.record(Event::Meta(m)).await;
    let live = Live {
        rec,
        nodes,
        op_timeout: Duration::from_millis(cfg.op_timeout_ms),
        seed: cfg.seed,
    };
    let w = spawn_workloads(cfg, &live);
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let plan = fault_plan(&mut rng, nemeses, live.nodes.len(), cfg.time_limit_s * 1000);
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
    let mut nemesis = Nemesis::new(cluster, net, live.nodes.clone(), live.rec.clone(), rng);
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
    live.rec.sync().await;
    Ok(())
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
