//! `kairosctl watch`: prints a node's watch stream, and when that node goes
//! away resumes on the next endpoint from the position after the last event
//! printed, so the output has no gap and no repeat.

use std::time::{Duration, Instant};

use anyhow::bail;
use kairos_client::{pb, Client, OLDEST_INDEX_HEADER, WATCH_FROM_INDEX_HEADER};
use serde_json::json;
use tonic::{Code, Status};

#[derive(clap::Args)]
pub struct WatchArgs {
    /// Only events of this job (repeatable).
    #[arg(long = "job", value_name = "ID")]
    jobs: Vec<String>,
    /// Only events of jobs in this group (repeatable).
    #[arg(long = "group", value_name = "G")]
    groups: Vec<String>,
    /// First log index to print events of (default: from now).
    #[arg(long)]
    from_index: Option<u64>,
    /// Within --from-index, the first event sequence to print.
    #[arg(long, default_value_t = 0, requires = "from_index")]
    from_seq: u32,
}

/// How long to keep trying other endpoints without receiving anything.
const RESUME_FOR: Duration = Duration::from_secs(15);

/// Where to resume: the position after the last event printed.
type Position = Option<(u64, u32)>;

pub async fn run(c: &Client, json: bool, a: WatchArgs) -> anyhow::Result<()> {
    let endpoints = c.endpoints();
    let mut at: Position = a.from_index.map(|i| (i, a.from_seq));
    let (mut next, mut progress) = (0usize, Instant::now());
    if !json {
        println!(
            "{:<14} {:<13} {:<24} {:<12} {:<36} {:>3} {:<14} OUTCOME",
            "INDEX.SEQ", "EVENT", "JOB", "GROUP", "RUN", "ATT", "WORKER"
        );
    }
    loop {
        let addr = &endpoints[next % endpoints.len()];
        let err = match stream(c, addr, &a, &mut at, &mut progress, json).await {
            Ok(()) => Status::unavailable("the stream ended"),
            Err(e) => e,
        };
        let resumable = matches!(
            err.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::ResourceExhausted
        );
        if err.code() == Code::OutOfRange {
            let oldest = err
                .metadata()
                .get(OLDEST_INDEX_HEADER)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("?");
            bail!("{} (oldest index held: {oldest})", err.message());
        }
        if !resumable || progress.elapsed() > RESUME_FOR {
            bail!("{addr}: {}", err.message());
        }
        eprintln!(
            "watch: {addr}: {}; resuming on the next endpoint",
            err.message()
        );
        next += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn stream(
    c: &Client,
    addr: &str,
    a: &WatchArgs,
    at: &mut Position,
    progress: &mut Instant,
    json: bool,
) -> Result<(), Status> {
    let req = pb::WatchRequest {
        from_index: at.map(|p| p.0),
        from_seq: at.map_or(0, |p| p.1),
        jobs: a.jobs.clone(),
        groups: a.groups.clone(),
    };
    let mut jobs = pb::jobs_client::JobsClient::new(c.channel_to(addr)?);
    let res = jobs.watch(req).await?;
    if at.is_none() {
        // Asked "from now": this node's now is where a resume must start.
        let from = res.metadata().get(WATCH_FROM_INDEX_HEADER);
        let from = from.and_then(|v| v.to_str().ok()?.parse().ok());
        *at = from.map(|i| (i, 0));
    }
    *progress = Instant::now();
    let mut events = res.into_inner();
    while let Some(e) = events.message().await? {
        print_event(&e, json);
        *at = Some((e.index, e.seq + 1));
        *progress = Instant::now();
    }
    Ok(())
}

fn print_event(e: &pb::WatchEvent, json: bool) {
    let kind = pb::WatchEventKind::try_from(e.kind)
        .map(|k| {
            k.as_str_name()
                .trim_start_matches("WATCH_EVENT_KIND_")
                .to_lowercase()
        })
        .unwrap_or_else(|_| e.kind.to_string());
    let outcome = match e.outcome {
        0 => String::new(),
        n => pb::RunState::try_from(n)
            .map(|s| {
                s.as_str_name()
                    .trim_start_matches("RUN_STATE_")
                    .to_lowercase()
            })
            .unwrap_or_else(|_| n.to_string()),
    };
    if json {
        let v = json!({
            "index": e.index, "seq": e.seq, "event": kind, "job": e.job, "group": e.group,
            "run_id": e.run_id, "attempt": e.attempt, "worker": e.worker, "outcome": outcome,
        });
        println!("{v}");
        return;
    }
    let attempt = if e.run_id.is_empty() {
        String::new()
    } else {
        e.attempt.to_string()
    };
    println!(
        "{:<14} {:<13} {:<24} {:<12} {:<36} {:>3} {:<14} {outcome}",
        format!("{}.{}", e.index, e.seq),
        kind,
        e.job,
        e.group,
        e.run_id,
        attempt,
        e.worker
    );
}
