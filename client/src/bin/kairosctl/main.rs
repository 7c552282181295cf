//! `kairosctl`: the command line for everything the Kairos API does.
//! Human tables by default, `--output json` for scripts.

mod apply;
mod exec;
mod graph;
mod spec;
mod table;
mod watch;

use std::time::Duration;

use anyhow::{bail, Context};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use kairos_client::{pb, Client, Security};
use serde_json::{json, Value};
use spec::{spec, SpecArgs};

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
    /// Print a shell completion script (e.g. `kairosctl completion bash > /etc/bash_completion.d/kairosctl`).
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
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
    /// Change the flags given and keep the rest (read, change, write back
    /// as a compare-and-set on the revision read); --replace replaces the
    /// whole definition (flags as for create).
    Update {
        #[command(flatten)]
        spec: SpecArgs,
        /// Refuse the update unless the job is at this revision (0: the revision read).
        #[arg(long, default_value_t = 0)]
        revision: u64,
        /// Replace the whole definition: flags not given take their defaults.
        #[arg(long)]
        replace: bool,
    },
    /// Every field of a job: schedule, policies, routing, retries,
    /// timeouts, retention, state, revision, next fire.
    Get {
        id: String,
    },
    /// Create, update or leave as they are the jobs of a file (TOML, JSON
    /// or YAML by extension, `jobs = [...]`), one line per job.
    Apply(apply::ApplyArgs),
    /// Write jobs in the format `job apply` reads.
    Export(apply::ExportArgs),
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
    /// Run the job's occurrences of a past range [--from, --to) now, in
    /// order, at most 16 every 250 ms, each marked as a backfill; an
    /// occurrence that already ran is left alone. At most 1000 occurrences.
    /// Progress: `job get`.
    Backfill {
        id: String,
        /// Start of the range (included): an RFC 3339 time or a duration ago, e.g. 6h.
        #[arg(long, required_unless_present = "cancel")]
        from: Option<String>,
        /// End of the range (excluded, not in the future): as --from.
        #[arg(long, required_unless_present = "cancel")]
        to: Option<String>,
        /// When the job is at its active-run limit: wait for room, in
        /// order (buffer-all), record the occurrence skipped (skip), or
        /// start it anyway (allow).
        #[arg(long, default_value = "buffer-all", value_parser = ["buffer-all", "skip", "allow"])]
        overlap: String,
        /// Stop the backfill in progress instead (runs it started stay).
        #[arg(long, conflicts_with_all = ["from", "to"])]
        cancel: bool,
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
    /// The job's upstream and downstream jobs as trees, with each one's
    /// last run state and what a workflow's cycle waits for.
    Graph {
        id: String,
    },
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
    /// Runs of a job ordered by scheduled time; without --job, or with a
    /// filter, runs across jobs (in job, then scheduled time order).
    List {
        #[arg(long)]
        job: Option<String>,
        /// Only runs of jobs in this worker group.
        #[arg(long)]
        group: Option<String>,
        /// Only runs in these states (repeatable or comma-separated).
        #[arg(long, value_enum, value_delimiter = ',')]
        state: Vec<StateArg>,
        /// Only runs finished (or, still active, fired) at or after this:
        /// an RFC 3339 time or a duration ago, e.g. 1h.
        #[arg(long)]
        since: Option<String>,
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

#[derive(Clone, Copy, ValueEnum)]
enum StateArg {
    Pending,
    Running,
    Succeeded,
    Failed,
    TimedOut,
    Skipped,
    Cancelled,
}

impl StateArg {
    fn pb(self) -> pb::RunState {
        match self {
            StateArg::Pending => pb::RunState::Pending,
            StateArg::Running => pb::RunState::Running,
            StateArg::Succeeded => pb::RunState::Succeeded,
            StateArg::Failed => pb::RunState::Failed,
            StateArg::TimedOut => pb::RunState::TimedOut,
            StateArg::Skipped => pb::RunState::Skipped,
            StateArg::Cancelled => pb::RunState::Cancelled,
        }
    }
}

/// `--since`, `--from`, `--to`: an RFC 3339 time, or a duration before `now_ms`.
fn instant_ms(flag: &str, s: &str, now_ms: i64) -> anyhow::Result<i64> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.timestamp_millis());
    }
    let ago = duration_ms(s)
        .with_context(|| format!("{flag} {s:?}: expected an RFC 3339 time or a duration"))?;
    Ok(now_ms.saturating_sub(i64::try_from(ago).unwrap_or(i64::MAX)))
}

/// Runs across jobs matching the filter, page by page, at most `limit`.
async fn search_runs(
    c: &Client,
    mut req: pb::SearchRunsRequest,
    limit: usize,
) -> anyhow::Result<Vec<pb::Run>> {
    let mut runs = Vec::new();
    while runs.len() < limit {
        req.page_size = (limit - runs.len()).min(500) as u32;
        let page = c
            .runs(|mut r| {
                let q = req.clone();
                async move { r.search_runs(q).await }
            })
            .await?;
        runs.extend(page.runs);
        if page.next_page_token.is_empty() {
            break;
        }
        req.page_token = page.next_page_token;
    }
    Ok(runs)
}

async fn runs_list(
    c: &Client,
    out: Output,
    job: Option<String>,
    group: Option<String>,
    state: Vec<StateArg>,
    since: Option<String>,
    limit: usize,
) -> anyhow::Result<()> {
    let runs = match job {
        Some(job) if group.is_none() && state.is_empty() && since.is_none() => {
            c.list_runs(&job, limit).await?
        }
        job => {
            let now = chrono::Utc::now().timestamp_millis();
            let req = pb::SearchRunsRequest {
                job: job.unwrap_or_default(),
                group: group.unwrap_or_default(),
                states: state.iter().map(|s| s.pb() as i32).collect(),
                since_ms: since
                    .as_deref()
                    .map(|s| instant_ms("--since", s, now))
                    .transpose()?
                    .unwrap_or(0),
                page_size: 0,
                page_token: String::new(),
            };
            search_runs(c, req, limit).await?
        }
    };
    print_runs(out, &runs);
    Ok(())
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
    let note = |i: usize| r.dst_notes.get(i).filter(|n| !n.is_empty());
    let offset = |i: usize| r.offsets_ms.get(i).map(|o| format!("  +{}", ms_text(*o)));
    let mut text = (r.fire_at_ms.iter().enumerate())
        .map(|(i, t)| {
            let (offset, note) = (offset(i).unwrap_or_default(), note(i));
            format!(
                "{}{offset}{}",
                time_text(*t),
                note.map(|n| format!("  {n}")).unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    if r.jitter_ms > 0 {
        text.push_str(&format!(
            "\n(nominal times; jitter {}: each fires at its time plus the offset shown)",
            ms_text(r.jitter_ms)
        ));
    }
    // JSON stays the list of times it always was; the notes are the API's `dst_notes`.
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
    let print = |tokens: &[pb::TokenInfo]| {
        match out {
        Output::Json => tokens.iter().for_each(|t| {
            println!(
                "{}",
                json!({"name": t.name, "role": t.role, "groups": t.groups, "created_at_ms": t.created_at_ms})
            )
        }),
        Output::Table => {
            let rows = (tokens.iter())
                .map(|t| vec![t.name.clone(), t.role.clone(), t.groups.join(",")])
                .collect();
            table::print(&["NAME", "ROLE", "GROUPS"], &[], rows);
        }
    }
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
                print(std::slice::from_ref(t));
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
            print(&r.tokens);
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
        Some(Kind::UpstreamOnly(_)) => "upstream only".into(),
        None => "-".into(),
    }
}

/// All of a job's schedules: "every 2000ms; cron 0 * * * *".
fn schedules_text(s: &pb::JobSpec) -> String {
    let also = s
        .also_schedules
        .iter()
        .map(|a| schedule_text(&Some(a.clone())));
    std::iter::once(schedule_text(&s.schedule))
        .chain(also)
        .collect::<Vec<_>>()
        .join("; ")
}

/// A duration in its largest whole unit: 7d, 90m, 1500ms.
fn ms_text(ms: u64) -> String {
    let units = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1000, "s"),
    ];
    match units.iter().find(|(n, _)| ms > 0 && ms.is_multiple_of(*n)) {
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

/// Every field of a job: its spec as `job apply` reads it, and its state.
fn job_json(j: &pb::Job) -> Value {
    let s = j.spec.clone().unwrap_or_default();
    let mut v = json!(spec::args_of(&s));
    let state = json!({
        "schedule": schedules_text(&s), "revision": j.revision, "paused": j.paused,
        "created_at_ms": j.created_at_ms, "updated_at_ms": j.updated_at_ms, "next_fire_at_ms": j.next_fire_at_ms,
        // In the API's units, as earlier releases printed them.
        "misfire_grace_ms": s.misfire_grace_ms, "timeout_ms": s.timeout_ms, "backoff_ms": s.backoff_ms,
        "keep_for_ms": s.keep_for_ms, "start_at_ms": s.start_at_ms, "end_at_ms": s.end_at_ms,
        "state": j.state, "fired_count": j.fired_count, "finished_at_ms": j.finished_at_ms,
        "pause_note": j.pause_note, "paused_by": j.paused_by, "paused_at_ms": j.paused_at_ms,
        "workflow_state": j.workflow_state, "downstream": j.downstream, "queued_at_ms": j.queued_at_ms,
        "backfill": j.backfill.as_ref().map(|b| json!({
            "from_ms": b.from_ms, "to_ms": b.to_ms, "overlap": b.overlap, "state": b.state,
            "total": b.total, "started": b.started, "existing": b.existing, "skipped": b.skipped,
            "next_at_ms": b.next_at_ms, "started_by": b.started_by, "started_at_ms": b.started_at_ms,
            "ended_at_ms": b.ended_at_ms,
        })),
        "jitter_ms": s.jitter_ms, "next_offset_ms": j.next_offset_ms,
    });
    if let (Some(v), Value::Object(state)) = (v.as_object_mut(), state) {
        v.extend(state);
    }
    v
}

/// "paused AT by WHO: NOTE".
fn pause_text(j: &pb::Job) -> String {
    let by = if j.paused_by.is_empty() {
        "-"
    } else {
        &j.paused_by
    };
    format!(
        "paused {} by {by}: {}",
        time_text(j.paused_at_ms),
        j.pause_note
    )
}

/// The pending occurrence's nominal time, with its jitter offset when it has one.
fn next_fire_text(j: &pb::Job) -> String {
    match j.next_offset_ms {
        0 => time_text(j.next_fire_at_ms),
        off => format!(
            "{} +{} (jitter)",
            time_text(j.next_fire_at_ms),
            ms_text(off)
        ),
    }
}

/// A job field by field (`job get`).
fn print_job(out: Output, j: &pb::Job) {
    if out == Output::Json {
        println!("{}", Value::Array(vec![job_json(j)]));
        return;
    }
    let s = j.spec.clone().unwrap_or_default();
    let pairs = |m: &std::collections::HashMap<String, String>| {
        let m: std::collections::BTreeMap<_, _> = m.iter().collect();
        let kv: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
        kv.join(",")
    };
    let fanout = match (s.shards, s.broadcast) {
        (Some(n), _) => format!("{n} shards"),
        (None, true) => "broadcast".into(),
        (None, false) => "one run".into(),
    };
    let dash = |t: String| if t.is_empty() { "-".to_string() } else { t };
    table::print_fields(vec![
        ("id", s.id.clone()),
        ("group", s.group.clone()),
        ("schedule", schedules_text(&s)),
        ("next fire", next_fire_text(j)),
        (
            "jitter",
            s.jitter_ms
                .map_or("-".into(), |ms| format!("{} per occurrence", ms_text(ms))),
        ),
        ("paused", if j.paused { pause_text(j) } else { "no".into() }),
        ("revision", j.revision.to_string()),
        ("created", time_text(j.created_at_ms)),
        ("updated", time_text(j.updated_at_ms)),
        (
            "payload",
            dash(String::from_utf8_lossy(&s.payload).into_owned()),
        ),
        (
            "misfire",
            format!(
                "{} (grace {}{})",
                spec::misfire_text(s.misfire),
                ms_text(s.misfire_grace_ms),
                s.catch_up_max
                    .map(|n| format!(", catch-up at most {n}"))
                    .unwrap_or_default()
            ),
        ),
        (
            "overlap",
            match s.max_concurrent {
                Some(n) => format!("{} (max {n} concurrent)", spec::overlap_text(s.overlap)),
                None => spec::overlap_text(s.overlap).into(),
            },
        ),
        (
            "queued",
            dash(
                j.queued_at_ms
                    .iter()
                    .map(|t| time_text(*t))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        ),
        ("timeout", ms_text(s.timeout_ms)),
        (
            "retry",
            format!(
                "{} attempts, backoff {} doubling",
                s.max_attempts,
                ms_text(s.backoff_ms)
            ),
        ),
        ("priority", s.priority.to_string()),
        ("route", spec::route_text(s.route).into()),
        ("route labels", dash(pairs(&s.labels))),
        ("labels", dash(pairs(&s.job_labels))),
        ("state", j.state.clone()),
        ("start at", s.start_at_ms.map_or("-".into(), time_text)),
        ("end at", s.end_at_ms.map_or("-".into(), time_text)),
        ("max runs", s.max_runs.map_or("-".into(), |n| n.to_string())),
        ("fired", j.fired_count.to_string()),
        ("finished", time_text(j.finished_at_ms)),
        ("fanout", fanout),
        ("keep", keep_text(&s)),
        ("upstream", dash(s.upstream.join(","))),
        ("trigger rule", dash(s.trigger_rule.clone())),
        ("on upstream failure", dash(s.on_upstream_failure.clone())),
        ("workflow state", dash(j.workflow_state.clone())),
        ("downstream", dash(j.downstream.join(","))),
        (
            "backfill",
            j.backfill.as_ref().map_or("-".into(), backfill_text),
        ),
    ]);
}

/// "running [FROM, TO) buffer-all: 3 of 10 (started 2, already ran 1, skipped 0), next AT".
fn backfill_text(b: &pb::Backfill) -> String {
    let done = b.started + b.existing + b.skipped;
    let mut t = format!(
        "{} [{}, {}) {}: {done} of {} (started {}, already ran {}, skipped {})",
        b.state,
        time_text(b.from_ms),
        time_text(b.to_ms),
        b.overlap,
        b.total,
        b.started,
        b.existing,
        b.skipped
    );
    if b.next_at_ms != 0 {
        t.push_str(&format!(", next {}", time_text(b.next_at_ms)));
    }
    t
}

fn run_json(r: &pb::Run) -> Value {
    json!({
        "run_id": r.run_id, "job": r.job, "scheduled_at_ms": r.scheduled_at_ms, "fired_at_ms": r.fired_at_ms,
        "state": run_state(r.state), "attempt": r.attempt, "worker": r.worker, "received_at_ms": r.received_at_ms,
        "finished_at_ms": r.finished_at_ms, "result": String::from_utf8_lossy(&r.result), "error": r.error, "note": r.note,
        "shard": r.shard, "shard_count": r.shard_count, "upstream_runs": r.upstream_runs,
        "backfill": r.backfill,
        "offset_ms": r.offset_ms,
    })
}

fn print_jobs(out: Output, jobs: &[pb::Job]) {
    if out == Output::Json {
        println!("{}", Value::Array(jobs.iter().map(job_json).collect()));
        return;
    }
    let rows = jobs
        .iter()
        .map(|j| {
            let s = j.spec.clone().unwrap_or_default();
            vec![
                s.id.clone(),
                s.group.clone(),
                schedules_text(&s),
                j.revision.to_string(),
                j.state.clone(),
                keep_text(&s),
                time_text(j.next_fire_at_ms),
            ]
        })
        .collect();
    table::print(
        &[
            "ID",
            "GROUP",
            "SCHEDULE",
            "REV",
            "STATE",
            "KEEP",
            "NEXT FIRE",
        ],
        &["REV"],
        rows,
    );
    for j in jobs.iter().filter(|j| j.paused) {
        let id = j.spec.as_ref().map_or("", |s| s.id.as_str());
        println!("{id}: {}", pause_text(j));
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
    let rows = runs
        .iter()
        .map(|r| {
            let result = String::from_utf8_lossy(&r.result);
            // The note says so when the backfill started the run; a retry's does not.
            let backfill = match r.note.starts_with("backfill") || r.backfill.is_empty() {
                true => String::new(),
                false => format!("backfill {}", r.backfill),
            };
            let text: Vec<&str> = [&backfill, result.trim(), &r.note, &r.error]
                .into_iter()
                .filter(|t| !t.is_empty())
                .collect();
            let text = text.join(" | ").replace('\n', " ");
            let scheduled = match r.offset_ms {
                0 => time_text(r.scheduled_at_ms),
                off => format!("{} +{}", time_text(r.scheduled_at_ms), ms_text(off)),
            };
            vec![
                r.run_id.clone(),
                scheduled,
                run_state(r.state).to_string(),
                r.attempt.to_string(),
                r.worker.clone(),
                text.chars().take(120).collect(),
            ]
        })
        .collect();
    table::print(
        &[
            "RUN",
            "SCHEDULED",
            "STATE",
            "ATT",
            "WORKER",
            "RESULT / NOTE / ERROR",
        ],
        &["ATT"],
        rows,
    );
}

/// `update` holds the command line of `job update`, to tell the flags given.
async fn job_cmd(
    c: &Client,
    out: Output,
    cmd: JobCmd,
    update: Option<&clap::ArgMatches>,
) -> anyhow::Result<()> {
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
        JobCmd::Update {
            spec: a,
            revision,
            replace,
        } => {
            let (spec, expected_revision) = match (replace, update) {
                (false, Some(m)) => {
                    let j = c
                        .jobs(|mut j| {
                            let r = by_id(&a.id);
                            async move { j.get_job(r).await }
                        })
                        .await?;
                    anyhow::ensure!(
                        revision == 0 || revision == j.revision,
                        "job {} is at revision {}, not {revision}: it changed since",
                        a.id,
                        j.revision
                    );
                    let current = j.spec.unwrap_or_default();
                    (spec(&spec::patched(&current, &a, m)?)?, j.revision)
                }
                _ => (spec(&a)?, revision),
            };
            let req = pb::UpdateJobRequest {
                spec: Some(spec),
                expected_revision,
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
            print_job(out, &j);
        }
        JobCmd::Apply(a) => apply::apply(c, a).await?,
        JobCmd::Export(a) => apply::export(c, a).await?,
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
        JobCmd::Backfill {
            id,
            from,
            to,
            overlap,
            cancel,
        } => {
            let j = if cancel {
                let req = by_id(&id);
                c.jobs(|mut j| {
                    let r = req.clone();
                    async move { j.cancel_backfill(r).await }
                })
                .await?
            } else {
                let now = chrono::Utc::now().timestamp_millis();
                let at = |flag, t: Option<String>| instant_ms(flag, &t.unwrap_or_default(), now);
                let req = pb::BackfillJobRequest {
                    id,
                    from_ms: at("--from", from)?,
                    to_ms: at("--to", to)?,
                    overlap,
                };
                c.jobs(|mut j| {
                    let r = req.clone();
                    async move { j.backfill_job(r).await }
                })
                .await?
            };
            print_job(out, &j);
        }
        JobCmd::Next { id, count } => {
            let req = pb::NextFiresRequest {
                id,
                schedule: None,
                count,
            };
            next_fires(c, out, req).await?;
        }
        JobCmd::Graph { id } => graph::print(c, &id).await?,
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
            if out == Output::Json {
                println!("{}", json!(rows));
                return Ok(());
            }
            let rows = (r.revisions.iter())
                .map(|v| {
                    let by = if v.by.is_empty() { "-" } else { &v.by };
                    let at = time_text(v.at_ms);
                    vec![v.revision.to_string(), at, v.action.clone(), by.to_string()]
                })
                .collect();
            table::print(&["REV", "AT", "ACTION", "BY"], &["REV"], rows);
        }
    }
    Ok(())
}

/// Follows the server's pages (each may be short: a page scans a bounded
/// number of jobs) until `limit` jobs or the last page.
pub(crate) async fn list_jobs(
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
        let page = c.list_jobs(req).await?;
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

/// A node's digest, shortened; with its index when older than the one it
/// applied (a fresh digest was still hashing), "-" before its first.
fn digest_cell(n: &pb::NodeStatus) -> String {
    let d = n.state_digest.get(..16).unwrap_or(&n.state_digest);
    if d.is_empty() {
        "-".into()
    } else if n.digest_index != n.applied_index {
        format!("{d} (at {})", n.digest_index)
    } else {
        d.to_string()
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
                            "state_digest": n.state_digest, "digest_index": n.digest_index, "term": n.term, "clock_offset_ms": n.clock_offset_ms,
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
    let rows = (s.nodes.iter())
        .map(|n| {
            let d = digest_cell(n);
            let member = if n.voter { "voter" } else { "learner" };
            vec![
                n.id.to_string(),
                n.addr.clone(),
                n.peer_addr.clone(),
                member.to_string(),
                n.role.clone(),
                n.lag.to_string(),
                n.applied_index.to_string(),
                n.term.to_string(),
                n.clock_offset_ms.to_string(),
                d,
            ]
        })
        .collect();
    let header = [
        "ID", "ADDR", "PEER", "MEMBER", "ROLE", "LAG", "APPLIED", "TERM", "SKEW(ms)", "DIGEST",
    ];
    table::print(&header, &["LAG", "APPLIED", "TERM", "SKEW(ms)"], rows);
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
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Cmd::Completion { shell } = cli.cmd {
        clap_complete::generate(
            shell,
            &mut Cli::command(),
            "kairosctl",
            &mut std::io::stdout(),
        );
        return;
    }
    let update = (matches.subcommand_matches("job")).and_then(|m| m.subcommand_matches("update"));
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
        Cmd::Job(j) => job_cmd(&client, cli.output, j, update).await,
        Cmd::Runs(RunsCmd::List {
            job,
            group,
            state,
            since,
            limit,
        }) => runs_list(&client, cli.output, job, group, state, since, limit).await,
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
        Cmd::Completion { .. } => unreachable!("handled before connecting"),
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
