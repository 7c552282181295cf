//! `kairosctl`: the command line for everything the Kairos API does.
//! Human tables by default, `--output json` for scripts.

mod exec;
mod watch;

use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand, ValueEnum};
use kairos_client::{pb, Client, Security};
use serde_json::{json, Value};

#[derive(Parser)]
#[command(
    name = "kairosctl",
    version,
    about = "Command line for a Kairos cluster"
)]
struct Cli {
    /// Cluster endpoints, host:port,... (any node; the client follows the leader).
    #[arg(
        long,
        env = "KAIROS_ENDPOINTS",
        default_value = "127.0.0.1:7070",
        value_delimiter = ',',
        global = true
    )]
    endpoints: Vec<String>,
    /// The cluster CA (ca.crt from `kairos certs init`): connect over TLS.
    #[arg(long, env = "KAIROS_CA", global = true)]
    ca: Option<std::path::PathBuf>,
    /// Token to present (from `kairosctl token create`, or the first admin's).
    #[arg(long, env = "KAIROS_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    #[arg(long, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum Output {
    Table,
    Json,
}

// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Create, inspect and control jobs.
    #[command(subcommand)]
    Job(JobCmd),
    /// Inspect runs.
    #[command(subcommand)]
    Runs(RunsCmd),
    /// Cluster administration.
    #[command(subcommand)]
    Cluster(ClusterCmd),
    /// API tokens and their roles (admin token required).
    #[command(subcommand)]
    Token(TokenCmd),
    /// Backups (admin token required).
    #[command(subcommand)]
    Snapshot(SnapshotCmd),
    /// Schedules without a job.
    #[command(subcommand)]
    Schedule(ScheduleCmd),
    /// Follow job changes and run transitions as they are applied (resumes
    /// on the next endpoint if the node goes away).
    Watch(watch::WatchArgs),
    /// Run a ready worker for a group. WARNING: it EXECUTES whatever the jobs
    /// of that group send it (`--exec shell` runs the payload with `sh -c`).
    Worker(exec::WorkerArgs),
}

#[derive(Subcommand)]
enum ScheduleCmd {
    /// The next fire times of a cron expression, computed by the cluster as
    /// for a job (nothing is stored).
    Preview {
        expr: String,
        /// IANA time zone (default UTC).
        #[arg(long)]
        tz: Option<String>,
        /// unix or quartz (see `job create --dialect`).
        #[arg(long, value_parser = ["unix", "quartz"])]
        dialect: Option<String>,
        #[arg(long, default_value_t = 5)]
        count: u32,
    },
}

#[derive(Subcommand)]
enum JobCmd {
    Create(SpecArgs),
    /// Replace a job's definition (flags as for create); --revision makes it a compare-and-set.
    Update {
        #[command(flatten)]
        spec: SpecArgs,
        #[arg(long, default_value_t = 0)]
        revision: u64,
    },
    Get {
        id: String,
    },
    /// Jobs in id order, filtered on the server (filters are AND-ed).
    List {
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        /// Only jobs of this worker group.
        #[arg(long)]
        group: Option<String>,
        /// Label selector over the jobs' --label labels: k=v[,k2=v2...].
        #[arg(long)]
        selector: Option<String>,
        #[arg(long, value_parser = ["active", "paused", "finished"])]
        state: Option<String>,
        /// Only ids starting with this.
        #[arg(long)]
        prefix: Option<String>,
        /// Jobs asked for per request (1 to 1000); pages are followed up to --limit.
        #[arg(long, default_value_t = 1000)]
        page_size: u32,
    },
    Delete {
        id: String,
    },
    /// Stop the job firing; --note (at most 1 KiB) is kept with who and when until resume.
    Pause {
        id: String,
        #[arg(long, default_value = "")]
        note: String,
    },
    Resume {
        id: String,
    },
    /// Fire the job once now.
    Trigger {
        id: String,
    },
    /// The next fire times of a job.
    Next {
        id: String,
        #[arg(long, default_value_t = 5)]
        count: u32,
    },
    /// Who changed the job and when (create, update, pause, resume, delete).
    History {
        id: String,
    },
    /// Runs by outcome, lateness p50/p99 of the latest 100 fires, and the
    /// last run, over the job's kept run history.
    Stats {
        id: String,
    },
}

#[derive(Args)]
struct SpecArgs {
    id: String,
    /// Cron expression: 5 fields, 6 (seconds first) or 7 (with year).
    #[arg(long, group = "schedule")]
    cron: Option<String>,
    /// IANA time zone for --cron (default UTC).
    #[arg(long, requires = "cron")]
    tz: Option<String>,
    /// How --cron is read: unix (Vixie cron, weekdays 0-7 from Sunday=0) or
    /// quartz (6/7 fields, weekdays 1-7 from Sunday=1, one day field '?').
    #[arg(long, requires = "cron", value_parser = ["unix", "quartz"])]
    dialect: Option<String>,
    /// Fixed rate, e.g. 200ms, 30s, 1m, 1h30m.
    #[arg(long, group = "schedule")]
    every: Option<String>,
    /// One-shot at an RFC 3339 time, e.g. 2026-12-01T09:00:00Z.
    #[arg(long, group = "schedule")]
    at: Option<String>,
    /// One-shot after a delay, e.g. 30m.
    #[arg(long, group = "schedule")]
    after: Option<String>,
    #[arg(long)]
    group: String,
    #[arg(long, default_value = "")]
    payload: String,
    #[arg(long, value_parser = ["fire-all", "fire-once", "skip"], default_value = "fire-all")]
    misfire: String,
    /// Lateness beyond which the misfire policy applies (default 60s).
    #[arg(long)]
    grace: Option<String>,
    /// Attempt deadline (default 60s).
    #[arg(long)]
    timeout: Option<String>,
    #[arg(long, default_value_t = 1)]
    max_attempts: u32,
    /// Base retry backoff, doubled per attempt (default 1s).
    #[arg(long)]
    backoff: Option<String>,
    /// 1 (lowest) to 10 (highest).
    #[arg(long, default_value_t = 5)]
    priority: u32,
    #[arg(long, value_parser = ["allow", "forbid", "buffer-one", "replace"], default_value = "allow")]
    overlap: String,
    /// How the leader picks a worker of the group for each attempt.
    #[arg(long, value_parser = ["least-loaded", "round-robin", "consistent-hash", "label"], default_value = "least-loaded")]
    route: String,
    /// With --route label: only workers started with this label key=value (repeatable).
    #[arg(long = "route-label", value_parser = label_pair)]
    route_labels: Vec<(String, String)>,
    /// A label of the job, key=value, for `job list --selector` (repeatable,
    /// at most 16; Kubernetes label syntax). Not used for routing.
    #[arg(long = "label", value_parser = label_pair)]
    labels: Vec<(String, String)>,
    /// No occurrence before this RFC 3339 time.
    #[arg(long)]
    start_at: Option<String>,
    /// No occurrence after this RFC 3339 time; past it the job is finished.
    #[arg(long)]
    end_at: Option<String>,
    /// Finish the job after this many scheduled occurrences fired (1 to 1000000000).
    #[arg(long)]
    max_runs: Option<u64>,
    /// Runs per occurrence with shard indexes 0..N-1 (1 to 1024).
    #[arg(long, conflicts_with = "broadcast")]
    shards: Option<u32>,
    /// One run per worker of the group connected when the occurrence fires.
    #[arg(long)]
    broadcast: bool,
    /// Finished run records kept, 1 to 100000 (default 10000); the oldest
    /// finished ones beyond it are deleted. Active runs are always kept.
    #[arg(long)]
    keep_runs: Option<u64>,
    /// Delete finished runs older than this, e.g. 7d (default: keep them
    /// regardless of age).
    #[arg(long)]
    keep_for: Option<String>,
}

/// Parses `key=value` for `--label`.
pub(crate) fn label_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?}: expected key=value")),
    }
}

#[derive(Subcommand)]
enum RunsCmd {
    /// Runs of a job ordered by scheduled time.
    List {
        #[arg(long)]
        job: String,
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    Get {
        run: String,
    },
    /// Run a finished run (succeeded, failed, timed out, cancelled) again as its next attempt.
    Retry {
        /// Run id as listed: <job>@<scheduled_at_ms>[/s<shard>].
        run: String,
    },
}

#[derive(Subcommand)]
enum ClusterCmd {
    /// Leader, and per node: addresses, voter or learner, lag, applied index, digest.
    Status,
    /// Add a node started with `kairos serve --join` as a learner.
    AddLearner { id: u64, peer_addr: String },
    /// Make a learner a voter.
    Promote { id: u64 },
    /// Remove a voter or learner from the cluster (the leader's own node:
    /// leadership is handed over first and the new leader removes it).
    Remove { id: u64 },
    /// Stop all firing cluster-wide (incidents; admin). Replicated: holds
    /// across leader changes. --note (at most 1 KiB) is shown by status.
    Pause {
        #[arg(long, default_value = "")]
        note: String,
    },
    /// Fire again: what fell due meanwhile follows each job's misfire policy.
    Resume,
    /// Hand leadership to voter ID (default: the most up-to-date other
    /// voter) without an election timeout; prints the new leader.
    TransferLeader { id: Option<u64> },
    /// Replace voter OLD by a new node NEW (started with --join): add it as
    /// a learner, wait until it has caught up, promote it, remove OLD. Each
    /// step is skipped when already done, so an interrupted replace is
    /// resumed by running the same command again.
    Replace {
        old_id: u64,
        new_id: u64,
        peer_addr: String,
        /// How long the new node may take to catch up.
        #[arg(long, default_value = "5m", value_parser = duration_ms)]
        catch_up_timeout: u64,
    },
}

/// Entries a learner may still be behind when it is promoted.
const PROMOTE_LAG_MAX: u64 = 100;

async fn cluster_cmd(c: &Client, out: Output, cmd: ClusterCmd) -> anyhow::Result<()> {
    let print = |m: &pb::MembershipResponse| {
        let v = json!({"voters": m.voters, "learners": m.learners});
        print_value(
            out,
            v,
            &format!("voters {:?}, learners {:?}", m.voters, m.learners),
        );
    };
    match cmd {
        ClusterCmd::Status => cluster_status(c, out).await?,
        ClusterCmd::AddLearner { id, peer_addr } => print(&add_learner(c, id, &peer_addr).await?),
        ClusterCmd::Promote { id } => print(&promote(c, id).await?),
        ClusterCmd::Remove { id } => print(&remove_node(c, id).await?),
        ClusterCmd::TransferLeader { id } => transfer_leader(c, out, id).await?,
        ClusterCmd::Pause { note } => set_firing(c, out, Some(note)).await?,
        ClusterCmd::Resume => set_firing(c, out, None).await?,
        ClusterCmd::Replace {
            old_id,
            new_id,
            peer_addr,
            catch_up_timeout,
        } => {
            let s = c.status().await?;
            let member = |id: u64| s.nodes.iter().find(|n| n.id == id).map(|n| n.voter);
            match member(new_id) {
                None => {
                    println!("adding node {new_id} at {peer_addr} as a learner");
                    add_learner(c, new_id, &peer_addr).await?;
                }
                Some(_) => println!("node {new_id} is already a member"),
            }
            if member(new_id) != Some(true) {
                wait_caught_up(c, new_id, Duration::from_millis(catch_up_timeout)).await?;
                println!("promoting node {new_id}");
                promote(c, new_id).await?;
            }
            if member(old_id).is_some() {
                println!("removing node {old_id}");
                print(&remove_node(c, old_id).await?);
            } else {
                println!("node {old_id} is not a member (already removed)");
            }
        }
    }
    Ok(())
}

/// Asks the cluster for fire times and prints them.
async fn next_fires(c: &Client, out: Output, req: pb::NextFiresRequest) -> anyhow::Result<()> {
    let r = c
        .jobs(|mut j| {
            let r = req.clone();
            async move { j.next_fires(r).await }
        })
        .await?;
    let text = r
        .fire_at_ms
        .iter()
        .map(|t| time_text(*t))
        .collect::<Vec<_>>()
        .join("\n");
    print_value(out, json!(r.fire_at_ms), &text);
    Ok(())
}

async fn add_learner(
    c: &Client,
    id: u64,
    peer_addr: &str,
) -> anyhow::Result<pb::MembershipResponse> {
    use pb::cluster_client::ClusterClient;
    let req = pb::AddLearnerRequest {
        id,
        peer_addr: peer_addr.to_string(),
    };
    Ok(c.call(|ch| {
        let req = req.clone();
        async move { ClusterClient::new(ch).add_learner(req).await }
    })
    .await?)
}

async fn remove_node(c: &Client, id: u64) -> anyhow::Result<pb::MembershipResponse> {
    use pb::cluster_client::ClusterClient;
    let req = pb::NodeRef { id };
    Ok(
        c.call(|ch| async move { ClusterClient::new(ch).remove_node(req).await })
            .await?,
    )
}

async fn transfer_leader(c: &Client, out: Output, id: Option<u64>) -> anyhow::Result<()> {
    use pb::cluster_client::ClusterClient;
    let req = pb::TransferLeaderRequest {
        id: id.unwrap_or(0),
    };
    let r = c
        .call(|ch| async move { ClusterClient::new(ch).transfer_leader(req).await })
        .await?;
    let text = format!(
        "leader: node {} (was node {}, handed over in {} ms)",
        r.leader, r.previous, r.took_ms
    );
    let v = json!({"leader": r.leader, "previous": r.previous, "took_ms": r.took_ms});
    print_value(out, v, &text);
    Ok(())
}

/// Pauses firing cluster-wide (`Some(note)`) or resumes it.
async fn set_firing(c: &Client, out: Output, pause: Option<String>) -> anyhow::Result<()> {
    use pb::cluster_client::ClusterClient;
    let f = match pause {
        Some(note) => {
            let req = pb::PauseFiringRequest { note };
            c.call(|ch| {
                let r = req.clone();
                async move { ClusterClient::new(ch).pause_firing(r).await }
            })
            .await?
        }
        None => {
            c.call(|ch| async move {
                ClusterClient::new(ch)
                    .resume_firing(pb::ResumeFiringRequest {})
                    .await
            })
            .await?
        }
    };
    print_value(out, firing_json(&f), &firing_text(&f));
    Ok(())
}

fn firing_json(f: &pb::FiringStatus) -> Value {
    json!({"paused": f.paused, "note": f.note, "by": f.by, "at_ms": f.at_ms})
}

fn firing_text(f: &pb::FiringStatus) -> String {
    if !f.paused {
        return "firing: on".into();
    }
    let by = if f.by.is_empty() { "-" } else { &f.by };
    format!(
        "firing: PAUSED since {} by {by}: {}",
        time_text(f.at_ms),
        f.note
    )
}

async fn promote(c: &Client, id: u64) -> anyhow::Result<pb::MembershipResponse> {
    use pb::cluster_client::ClusterClient;
    let req = pb::NodeRef { id };
    Ok(
        c.call(|ch| async move { ClusterClient::new(ch).promote(req).await })
            .await?,
    )
}

/// Waits until learner `id` answers and is at most `PROMOTE_LAG_MAX` entries behind.
async fn wait_caught_up(c: &Client, id: u64, timeout: Duration) -> anyhow::Result<()> {
    let start = std::time::Instant::now();
    loop {
        let s = c.status().await?;
        let n = s.nodes.iter().find(|n| n.id == id);
        match n {
            Some(n)
                if n.role != "unreachable" && n.lag <= PROMOTE_LAG_MAX && n.applied_index > 0 =>
            {
                println!("node {id} caught up (lag {} entries)", n.lag);
                return Ok(());
            }
            Some(n) => eprintln!(
                "node {id}: {} lag {} entries, applied {}",
                n.role, n.lag, n.applied_index
            ),
            None => anyhow::bail!("node {id} is not a member"),
        }
        anyhow::ensure!(
            start.elapsed() < timeout,
            "node {id} did not catch up within {timeout:?}; run the same command again to resume"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[derive(Subcommand)]
enum SnapshotCmd {
    /// Stream a fresh point-in-time snapshot from the leader into FILE
    /// (`kairos snapshot inspect FILE` shows its index, counts and checksum).
    Save { file: std::path::PathBuf },
    /// Restore FILE's jobs, runs and timers into this cluster, which must
    /// hold none (a new cluster). The file is verified before anything is written.
    Restore { file: std::path::PathBuf },
}

async fn snapshot_cmd(c: &Client, cmd: SnapshotCmd) -> anyhow::Result<()> {
    use pb::cluster_client::ClusterClient;
    use tokio::io::AsyncWriteExt;
    match cmd {
        SnapshotCmd::Save { file } => {
            let mut chunks = c
                .call(|ch| async move {
                    ClusterClient::new(ch)
                        .save_snapshot(pb::SaveSnapshotRequest {})
                        .await
                })
                .await?;
            let tmp = file.with_extension("partial");
            let mut f = tokio::fs::File::create(&tmp)
                .await
                .with_context(|| format!("creating {}", tmp.display()))?;
            let mut bytes = 0u64;
            while let Some(chunk) = chunks.message().await? {
                bytes += chunk.data.len() as u64;
                f.write_all(&chunk.data).await?;
            }
            f.sync_all().await?;
            // Only a complete stream becomes FILE.
            tokio::fs::rename(&tmp, &file).await?;
            println!("saved {} bytes to {}", bytes, file.display());
        }
        SnapshotCmd::Restore { file } => {
            std::fs::File::open(&file).with_context(|| format!("{}", file.display()))?;
            let r = c
                .call(|ch| {
                    let chunks = file_chunks(file.clone());
                    async move { ClusterClient::new(ch).restore_snapshot(chunks).await }
                })
                .await?;
            println!(
                "restored {} records from the backup taken at log index {}",
                r.pairs, r.backup_index
            );
        }
    }
    Ok(())
}

/// A file's bytes as 1 MiB chunks, read as they are sent.
fn file_chunks(path: std::path::PathBuf) -> impl futures::Stream<Item = pb::SnapshotChunk> + Send {
    use tokio::io::AsyncReadExt;
    futures::stream::unfold(None, move |open: Option<tokio::fs::File>| {
        let path = path.clone();
        async move {
            let mut f = match open {
                Some(f) => f,
                None => tokio::fs::File::open(&path).await.ok()?,
            };
            let mut buf = vec![0u8; 1 << 20];
            let n = f.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.truncate(n);
            Some((pb::SnapshotChunk { data: buf }, Some(f)))
        }
    })
}

#[derive(Subcommand)]
enum TokenCmd {
    /// Create a token; its secret is printed once (only a hash is stored).
    Create {
        name: String,
        /// admin | operator | reader | worker
        #[arg(long)]
        role: String,
        /// For --role worker: the groups it may serve.
        #[arg(long, value_delimiter = ',')]
        groups: Vec<String>,
    },
    /// List tokens (names, roles, groups; never secrets).
    List,
    /// Revoke a token on every node.
    Revoke { name: String },
}

async fn token_cmd(c: &Client, out: Output, cmd: TokenCmd) -> anyhow::Result<()> {
    use pb::cluster_client::ClusterClient;
    let print = |t: &pb::TokenInfo| match out {
        Output::Json => println!(
            "{}",
            serde_json::json!({"name": t.name, "role": t.role, "groups": t.groups, "created_at_ms": t.created_at_ms})
        ),
        Output::Table => println!("{:<24} {:<9} {}", t.name, t.role, t.groups.join(",")),
    };
    match cmd {
        TokenCmd::Create { name, role, groups } => {
            let req = pb::CreateTokenRequest { name, role, groups };
            let r = c
                .call(|ch| {
                    let req = req.clone();
                    async move { ClusterClient::new(ch).create_token(req).await }
                })
                .await?;
            if let Some(t) = &r.token {
                print(t);
            }
            // The secret on its own line, so scripts can take the last line.
            eprintln!("secret (shown once; present it with --token or KAIROS_TOKEN):");
            println!("{}", r.secret);
        }
        TokenCmd::List => {
            let r = c
                .call(|ch| async move {
                    ClusterClient::new(ch)
                        .list_tokens(pb::ListTokensRequest {})
                        .await
                })
                .await?;
            r.tokens.iter().for_each(print);
        }
        TokenCmd::Revoke { name } => {
            let req = pb::RevokeTokenRequest { name: name.clone() };
            let r = c
                .call(|ch| {
                    let req = req.clone();
                    async move { ClusterClient::new(ch).revoke_token(req).await }
                })
                .await?;
            anyhow::ensure!(r.revoked, "token {name:?} not found");
            println!("revoked {name}");
        }
    }
    Ok(())
}

/// Parses "200ms", "30s", "1m", "1h30m", "2d" into milliseconds.
pub(crate) fn duration_ms(s: &str) -> anyhow::Result<u64> {
    let mut total: u64 = 0;
    let mut rest = s.trim();
    anyhow::ensure!(!rest.is_empty(), "duration: empty");
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        anyhow::ensure!(
            digits > 0,
            "duration {s:?}: expected a number before the unit"
        );
        let n: u64 = rest[..digits]
            .parse()
            .with_context(|| format!("duration {s:?}"))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let mult = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            u => bail!("duration {s:?}: unknown unit {u:?} (use ms, s, m, h, d)"),
        };
        total = n
            .checked_mul(mult)
            .and_then(|v| total.checked_add(v))
            .context("duration: too large")?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

fn opt_ms(s: &Option<String>) -> anyhow::Result<u64> {
    s.as_deref()
        .map(duration_ms)
        .transpose()
        .map(|v| v.unwrap_or(0))
}

fn spec(a: &SpecArgs) -> anyhow::Result<pb::JobSpec> {
    use pb::schedule::Kind;
    let kind = if let Some(c) = &a.cron {
        Kind::Cron(pb::Cron {
            expr: c.clone(),
            tz: a.tz.clone().unwrap_or_default(),
            dialect: a.dialect.clone().unwrap_or_default(),
        })
    } else if let Some(e) = &a.every {
        Kind::EveryMs(duration_ms(e)?)
    } else if let Some(t) = &a.at {
        let t = chrono::DateTime::parse_from_rfc3339(t)
            .with_context(|| format!("--at {t:?}: expected RFC 3339"))?;
        Kind::AtMs(t.timestamp_millis())
    } else if let Some(d) = &a.after {
        Kind::AfterMs(duration_ms(d)?)
    } else {
        bail!("schedule: give one of --cron, --every, --at, --after");
    };
    let misfire = match a.misfire.as_str() {
        "fire-once" => pb::MisfirePolicy::FireOnce,
        "skip" => pb::MisfirePolicy::Skip,
        _ => pb::MisfirePolicy::FireAll,
    };
    let overlap = match a.overlap.as_str() {
        "forbid" => pb::OverlapPolicy::Forbid,
        "buffer-one" => pb::OverlapPolicy::BufferOne,
        "replace" => pb::OverlapPolicy::Replace,
        _ => pb::OverlapPolicy::Allow,
    };
    let route = match a.route.as_str() {
        "round-robin" => pb::RoutePolicy::RoundRobin,
        "consistent-hash" => pb::RoutePolicy::ConsistentHash,
        "label" => pb::RoutePolicy::Label,
        _ => pb::RoutePolicy::LeastLoaded,
    };
    Ok(pb::JobSpec {
        id: a.id.clone(),
        schedule: Some(pb::Schedule { kind: Some(kind) }),
        group: a.group.clone(),
        payload: a.payload.clone().into_bytes(),
        misfire: misfire as i32,
        misfire_grace_ms: opt_ms(&a.grace)?,
        timeout_ms: opt_ms(&a.timeout)?,
        max_attempts: a.max_attempts,
        backoff_ms: opt_ms(&a.backoff)?,
        priority: a.priority,
        overlap: overlap as i32,
        route: route as i32,
        labels: a.route_labels.iter().cloned().collect(),
        shards: a.shards,
        broadcast: a.broadcast,
        keep_runs: a.keep_runs.unwrap_or(0),
        keep_for_ms: opt_ms(&a.keep_for)?,
        start_at_ms: opt_time_ms("--start-at", &a.start_at)?,
        end_at_ms: opt_time_ms("--end-at", &a.end_at)?,
        max_runs: a.max_runs,
        job_labels: a.labels.iter().cloned().collect(),
    })
}

fn opt_time_ms(flag: &str, t: &Option<String>) -> anyhow::Result<Option<i64>> {
    t.as_ref()
        .map(|t| {
            chrono::DateTime::parse_from_rfc3339(t)
                .map(|t| t.timestamp_millis())
                .with_context(|| format!("{flag} {t:?}: expected RFC 3339"))
        })
        .transpose()
}

fn run_state(s: i32) -> &'static str {
    match pb::RunState::try_from(s).unwrap_or(pb::RunState::Unspecified) {
        pb::RunState::Pending => "pending",
        pb::RunState::Running => "running",
        pb::RunState::Succeeded => "succeeded",
        pb::RunState::Failed => "failed",
        pb::RunState::TimedOut => "timed-out",
        pb::RunState::Skipped => "skipped",
        pb::RunState::Cancelled => "cancelled",
        pb::RunState::Unspecified => "unknown",
    }
}

fn schedule_text(s: &Option<pb::Schedule>) -> String {
    use pb::schedule::Kind;
    match s.as_ref().and_then(|s| s.kind.as_ref()) {
        Some(Kind::Cron(c)) => {
            let mut text = format!("cron {}", c.expr);
            if c.dialect == "quartz" {
                text.push_str(" [quartz]");
            }
            if !c.tz.is_empty() {
                text.push_str(&format!(" ({})", c.tz));
            }
            text
        }
        Some(Kind::EveryMs(ms)) => format!("every {ms}ms"),
        Some(Kind::AtMs(ms)) => format!("at {}", time_text(*ms)),
        Some(Kind::AfterMs(ms)) => format!("after {ms}ms"),
        None => "-".into(),
    }
}

/// A duration in its largest whole unit: 7d, 90m, 1500ms.
fn ms_text(ms: u64) -> String {
    let units = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1000, "s"),
    ];
    match units.iter().find(|(n, _)| ms > 0 && ms % n == 0) {
        Some((n, unit)) => format!("{}{unit}", ms / n),
        None => format!("{ms}ms"),
    }
}

/// History limits: "3 runs", or "3 runs/7d" with an age limit.
fn keep_text(s: &pb::JobSpec) -> String {
    match s.keep_for_ms {
        0 => format!("{} runs", s.keep_runs),
        ms => format!("{} runs/{}", s.keep_runs, ms_text(ms)),
    }
}

fn time_text(ms: i64) -> String {
    if ms == 0 {
        return "-".into();
    }
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_default()
}

fn job_json(j: &pb::Job) -> Value {
    let s = j.spec.clone().unwrap_or_default();
    json!({
        "id": s.id, "group": s.group, "schedule": schedule_text(&s.schedule),
        "payload": String::from_utf8_lossy(&s.payload), "revision": j.revision, "paused": j.paused,
        "created_at_ms": j.created_at_ms, "updated_at_ms": j.updated_at_ms, "next_fire_at_ms": j.next_fire_at_ms,
        "priority": s.priority, "max_attempts": s.max_attempts, "timeout_ms": s.timeout_ms,
        "route": route_text(s.route), "route_labels": s.labels, "shards": s.shards, "broadcast": s.broadcast,
        "keep_runs": s.keep_runs, "keep_for_ms": s.keep_for_ms, "labels": s.job_labels,
        "state": j.state, "fired_count": j.fired_count, "finished_at_ms": j.finished_at_ms,
        "start_at_ms": s.start_at_ms, "end_at_ms": s.end_at_ms, "max_runs": s.max_runs,
        "pause_note": j.pause_note, "paused_by": j.paused_by, "paused_at_ms": j.paused_at_ms,
    })
}

fn route_text(r: i32) -> &'static str {
    match pb::RoutePolicy::try_from(r).unwrap_or(pb::RoutePolicy::Unspecified) {
        pb::RoutePolicy::RoundRobin => "round-robin",
        pb::RoutePolicy::ConsistentHash => "consistent-hash",
        pb::RoutePolicy::Label => "label",
        pb::RoutePolicy::LeastLoaded | pb::RoutePolicy::Unspecified => "least-loaded",
    }
}

fn run_json(r: &pb::Run) -> Value {
    json!({
        "run_id": r.run_id, "job": r.job, "scheduled_at_ms": r.scheduled_at_ms, "fired_at_ms": r.fired_at_ms,
        "state": run_state(r.state), "attempt": r.attempt, "worker": r.worker, "received_at_ms": r.received_at_ms,
        "finished_at_ms": r.finished_at_ms, "result": String::from_utf8_lossy(&r.result), "error": r.error, "note": r.note,
        "shard": r.shard, "shard_count": r.shard_count,
    })
}

fn print_jobs(out: Output, jobs: &[pb::Job]) {
    if out == Output::Json {
        println!("{}", Value::Array(jobs.iter().map(job_json).collect()));
        return;
    }
    println!(
        "{:<24} {:<12} {:<32} {:>4} {:<9} {:<18} NEXT FIRE",
        "ID", "GROUP", "SCHEDULE", "REV", "STATE", "KEEP"
    );
    for j in jobs {
        let s = j.spec.clone().unwrap_or_default();
        let sched = schedule_text(&s.schedule);
        println!(
            "{:<24} {:<12} {:<32} {:>4} {:<9} {:<18} {}",
            s.id,
            s.group,
            sched,
            j.revision,
            j.state,
            keep_text(&s),
            time_text(j.next_fire_at_ms)
        );
        if j.paused {
            let by = if j.paused_by.is_empty() {
                "-"
            } else {
                &j.paused_by
            };
            println!(
                "  paused {} by {by}: {}",
                time_text(j.paused_at_ms),
                j.pause_note
            );
        }
    }
}

fn print_job_stats(out: Output, st: &pb::JobStatsResponse) {
    let v = json!({
        "job": st.job, "runs": st.runs, "fired": st.fired, "succeeded": st.succeeded,
        "failed": st.failed, "timed_out": st.timed_out, "cancelled": st.cancelled,
        "skipped": st.skipped, "active": st.active, "lateness_runs": st.lateness_runs,
        "lateness_ms_p50": st.lateness_ms_p50, "lateness_ms_p99": st.lateness_ms_p99,
        "oldest_scheduled_at_ms": st.oldest_scheduled_at_ms,
        "last_run": st.last_run.as_ref().map(run_json),
    });
    let last = match &st.last_run {
        Some(r) => format!(
            "{} {} (attempt {})",
            r.run_id,
            run_state(r.state),
            r.attempt
        ),
        None => "-".into(),
    };
    let text = format!(
        "job        {}\nruns       {} kept since {}\nfired      {}\nsucceeded  {}\n\
         failed     {}\ntimed out  {}\ncancelled  {}\nskipped    {}\nactive     {}\n\
         late       p50 {} ms, p99 {} ms (latest {} fires)\nlast run   {last}",
        st.job,
        st.runs,
        time_text(st.oldest_scheduled_at_ms),
        st.fired,
        st.succeeded,
        st.failed,
        st.timed_out,
        st.cancelled,
        st.skipped,
        st.active,
        st.lateness_ms_p50,
        st.lateness_ms_p99,
        st.lateness_runs
    );
    print_value(out, v, &text);
}

fn print_runs(out: Output, runs: &[pb::Run]) {
    if out == Output::Json {
        println!("{}", Value::Array(runs.iter().map(run_json).collect()));
        return;
    }
    println!(
        "{:<36} {:<26} {:<10} {:>3} {:<14} RESULT / NOTE / ERROR",
        "RUN", "SCHEDULED", "STATE", "ATT", "WORKER"
    );
    for r in runs {
        let result = String::from_utf8_lossy(&r.result);
        let result = result.trim();
        let text: Vec<&str> = [result, r.note.as_str(), r.error.as_str()]
            .into_iter()
            .filter(|t| !t.is_empty())
            .collect();
        let text = text.join(" | ").replace('\n', " ");
        let text: String = text.chars().take(120).collect();
        println!(
            "{:<36} {:<26} {:<10} {:>3} {:<14} {text}",
            r.run_id,
            time_text(r.scheduled_at_ms),
            run_state(r.state),
            r.attempt,
            r.worker
        );
    }
}

async fn job_cmd(c: &Client, out: Output, cmd: JobCmd) -> anyhow::Result<()> {
    let by_id = |id: &str| pb::JobRef { id: id.to_string() };
    match cmd {
        JobCmd::Create(a) => {
            let req = pb::CreateJobRequest {
                spec: Some(spec(&a)?),
            };
            let j = c
                .jobs(|mut j| {
                    let r = req.clone();
                    async move { j.create_job(r).await }
                })
                .await?;
            print_jobs(out, &[j]);
        }
        JobCmd::Update { spec: a, revision } => {
            let req = pb::UpdateJobRequest {
                spec: Some(spec(&a)?),
                expected_revision: revision,
            };
            let j = c
                .jobs(|mut j| {
                    let r = req.clone();
                    async move { j.update_job(r).await }
                })
                .await?;
            print_jobs(out, &[j]);
        }
        JobCmd::Get { id } => {
            let j = c
                .jobs(|mut j| {
                    let r = by_id(&id);
                    async move { j.get_job(r).await }
                })
                .await?;
            print_jobs(out, &[j]);
        }
        JobCmd::List {
            limit,
            group,
            selector,
            state,
            prefix,
            page_size,
        } => {
            let filter = pb::ListJobsRequest {
                page_size,
                page_token: String::new(),
                group: group.unwrap_or_default(),
                selector: selector.unwrap_or_default(),
                state: state.unwrap_or_default(),
                id_prefix: prefix.unwrap_or_default(),
            };
            print_jobs(out, &list_jobs(c, limit, filter).await?)
        }
        JobCmd::Delete { id } => {
            let r = c
                .jobs(|mut j| {
                    let r = by_id(&id);
                    async move { j.delete_job(r).await }
                })
                .await?;
            print_value(
                out,
                json!({ "id": id, "deleted": r.deleted }),
                &format!("deleted {id}"),
            );
        }
        JobCmd::Pause { id, note } => {
            let req = pb::PauseJobRequest { id, note };
            let j = c
                .jobs(|mut j| {
                    let r = req.clone();
                    async move { j.pause_job(r).await }
                })
                .await?;
            print_jobs(out, &[j]);
        }
        JobCmd::Resume { id } => {
            let j = c
                .jobs(|mut j| {
                    let r = by_id(&id);
                    async move { j.resume_job(r).await }
                })
                .await?;
            print_jobs(out, &[j]);
        }
        JobCmd::Trigger { id } => {
            let r = c
                .jobs(|mut j| {
                    let r = by_id(&id);
                    async move { j.trigger_job(r).await }
                })
                .await?;
            print_runs(out, &[r]);
        }
        JobCmd::Next { id, count } => {
            let req = pb::NextFiresRequest {
                id,
                schedule: None,
                count,
            };
            next_fires(c, out, req).await?;
        }
        JobCmd::Stats { id } => {
            let req = by_id(&id);
            let st = c
                .jobs(|mut j| {
                    let r = req.clone();
                    async move { j.job_stats(r).await }
                })
                .await?;
            print_job_stats(out, &st);
        }
        JobCmd::History { id } => {
            let req = pb::JobRef { id };
            let r = c
                .jobs(|mut j| {
                    let r = req.clone();
                    async move { j.job_history(r).await }
                })
                .await?;
            let rows: Vec<Value> = (r.revisions.iter())
                .map(|v| json!({"revision": v.revision, "at_ms": v.at_ms, "by": v.by, "action": v.action}))
                .collect();
            let text = (r.revisions.iter())
                .map(|v| {
                    let by = if v.by.is_empty() { "-" } else { &v.by };
                    format!(
                        "{:>4}  {}  {:<7} {by}",
                        v.revision,
                        time_text(v.at_ms),
                        v.action
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            print_value(out, json!(rows), &text);
        }
    }
    Ok(())
}

/// Follows the server's pages (each may be short: a page scans a bounded
/// number of jobs) until `limit` jobs or the last page.
async fn list_jobs(
    c: &Client,
    limit: usize,
    filter: pb::ListJobsRequest,
) -> anyhow::Result<Vec<pb::Job>> {
    let mut jobs = Vec::new();
    let mut token = String::new();
    while jobs.len() < limit {
        let req = pb::ListJobsRequest {
            page_size: (limit - jobs.len()).min(filter.page_size as usize) as u32,
            page_token: token.clone(),
            ..filter.clone()
        };
        let page = c
            .jobs(|mut j| {
                let r = req.clone();
                async move { j.list_jobs(r).await }
            })
            .await?;
        jobs.extend(page.jobs);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    Ok(jobs)
}

fn print_value(out: Output, v: Value, text: &str) {
    if out == Output::Json {
        println!("{v}");
    } else {
        println!("{text}");
    }
}

async fn cluster_status(c: &Client, out: Output) -> anyhow::Result<()> {
    let s = c.status().await?;
    if out == Output::Json {
        let nodes: Vec<Value> = s
            .nodes
            .iter()
            .map(|n| json!({"id": n.id, "addr": n.addr, "peer_addr": n.peer_addr, "role": n.role,
                            "voter": n.voter, "lag": n.lag, "applied_index": n.applied_index,
                            "state_digest": n.state_digest, "term": n.term, "clock_offset_ms": n.clock_offset_ms,
                            "tzdata": n.tzdata, "log_format_max": n.log_format_max, "refusal": n.refusal}))
            .collect();
        println!(
            "{}",
            json!({ "leader": s.leader, "membership_changing": s.membership_changing,
                    "log_format": s.log_format, "nodes": nodes,
                    "firing": s.firing.as_ref().map(firing_json) })
        );
        return Ok(());
    }
    println!("leader: node {}", s.leader);
    if let Some(f) = &s.firing {
        println!("{}", firing_text(f));
    }
    if s.membership_changing {
        println!("membership: a change is in progress (joint configuration)");
    }
    println!(
        "{:<4} {:<22} {:<22} {:<8} {:<12} {:>6} {:>8} {:>6} {:>10} DIGEST",
        "ID", "ADDR", "PEER", "MEMBER", "ROLE", "LAG", "APPLIED", "TERM", "SKEW(ms)"
    );
    for n in &s.nodes {
        let d = n.state_digest.get(..16).unwrap_or(&n.state_digest);
        let member = if n.voter { "voter" } else { "learner" };
        println!(
            "{:<4} {:<22} {:<22} {:<8} {:<12} {:>6} {:>8} {:>6} {:>10} {d}",
            n.id,
            n.addr,
            n.peer_addr,
            member,
            n.role,
            n.lag,
            n.applied_index,
            n.term,
            n.clock_offset_ms
        );
    }
    if let Some(w) = tzdata_warning(&s.nodes) {
        println!("{w}");
    }
    let reads: Vec<String> = s
        .nodes
        .iter()
        .filter(|n| n.log_format_max > 0)
        .map(|n| format!("node {} reads {}", n.id, n.log_format_max))
        .collect();
    // A node of a release before log format 2 reports none: format 1 is active.
    let active = s.log_format.max(1);
    println!("log format: {active} active ({})", reads.join(", "));
    for n in s.nodes.iter().filter(|n| !n.refusal.is_empty()) {
        println!("ERROR: node {} stopped applying: {}", n.id, n.refusal);
    }
    Ok(())
}

/// A warning when the reachable nodes run different IANA tzdata: cron fire
/// times are computed in apply, so such replicas may diverge.
fn tzdata_warning(nodes: &[pb::NodeStatus]) -> Option<String> {
    let mut seen: Vec<String> = Vec::new();
    for n in nodes.iter().filter(|n| !n.tzdata.is_empty()) {
        seen.push(format!("node {}: {}", n.id, n.tzdata));
    }
    let first = nodes.iter().find(|n| !n.tzdata.is_empty())?;
    if nodes
        .iter()
        .all(|n| n.tzdata.is_empty() || n.tzdata == first.tzdata)
    {
        return None;
    }
    Some(format!(
        "WARNING: nodes run different tzdata ({}); cron fire times may diverge, run the same build everywhere",
        seen.join(", ")
    ))
}

#[cfg(test)]
mod tzdata_tests {
    use super::{pb, tzdata_warning};

    fn node(id: u64, tzdata: &str) -> pb::NodeStatus {
        pb::NodeStatus {
            id,
            tzdata: tzdata.into(),
            ..Default::default()
        }
    }

    #[test]
    fn warns_only_when_reachable_nodes_report_different_tzdata() {
        let same = [node(1, "2025b"), node(2, "2025b"), node(3, "")];
        assert_eq!(tzdata_warning(&same), None);
        let w = tzdata_warning(&[node(1, "2025b"), node(2, "2024a")]).unwrap();
        assert!(
            w.contains("node 1: 2025b") && w.contains("node 2: 2024a"),
            "{w}"
        );
    }
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let security = match Security::load(cli.ca.as_deref(), cli.token.clone()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {}", e.message());
            std::process::exit(2);
        }
    };
    let client = Client::new(cli.endpoints.clone())
        .with_retry_for(Duration::from_secs(15))
        .with_security(security.clone());
    let res = match cli.cmd {
        Cmd::Job(j) => job_cmd(&client, cli.output, j).await,
        Cmd::Runs(RunsCmd::List { job, limit }) => client
            .list_runs(&job, limit)
            .await
            .map(|r| print_runs(cli.output, &r))
            .map_err(Into::into),
        Cmd::Runs(RunsCmd::Get { run }) => {
            let req = pb::RunRef { run_id: run };
            client
                .runs(|mut c| {
                    let r = req.clone();
                    async move { c.get_run(r).await }
                })
                .await
                .map(|r| print_runs(cli.output, &[r]))
                .map_err(Into::into)
        }
        Cmd::Runs(RunsCmd::Retry { run }) => client
            .retry_run(&run)
            .await
            .map(|r| print_runs(cli.output, &[r]))
            .map_err(Into::into),
        Cmd::Cluster(m) => cluster_cmd(&client, cli.output, m).await,
        Cmd::Token(t) => token_cmd(&client, cli.output, t).await,
        Cmd::Snapshot(s) => snapshot_cmd(&client, s).await,
        Cmd::Schedule(ScheduleCmd::Preview {
            expr,
            tz,
            dialect,
            count,
        }) => {
            let cron = pb::Cron {
                expr,
                tz: tz.unwrap_or_default(),
                dialect: dialect.unwrap_or_default(),
            };
            let req = pb::NextFiresRequest {
                id: String::new(),
                schedule: Some(pb::Schedule {
                    kind: Some(pb::schedule::Kind::Cron(cron)),
                }),
                count,
            };
            next_fires(&client, cli.output, req).await
        }
        Cmd::Worker(w) => exec::run(cli.endpoints, security, w).await,
        Cmd::Watch(w) => watch::run(&client, cli.output == Output::Json, w).await,
    };
    if let Err(e) = res {
        match e.downcast_ref::<tonic::Status>() {
            Some(s) => eprintln!("error: {} ({:?})", s.message(), s.code()),
            None => eprintln!("error: {e:#}"),
        }
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::{duration_ms, label_pair};

    #[test]
    fn labels() {
        assert_eq!(label_pair("zone=eu").unwrap(), ("zone".into(), "eu".into()));
        assert_eq!(label_pair("k=a=b").unwrap(), ("k".into(), "a=b".into()));
        for bad in ["zone", "=eu", "zone=", ""] {
            assert!(
                label_pair(bad).unwrap_err().contains("expected key=value"),
                "{bad}"
            );
        }
    }

    #[test]
    fn durations() {
        assert_eq!(super::ms_text(7 * 86_400_000), "7d");
        assert_eq!(super::ms_text(90 * 60_000), "90m");
        assert_eq!(super::ms_text(1500), "1500ms");
        assert_eq!(duration_ms("200ms").unwrap(), 200);
        assert_eq!(duration_ms("1h30m").unwrap(), 5_400_000);
        assert_eq!(duration_ms("2d").unwrap(), 172_800_000);
        assert!(duration_ms("").is_err());
        assert!(duration_ms("5x").is_err());
        assert!(duration_ms("ms").is_err());
    }
}
