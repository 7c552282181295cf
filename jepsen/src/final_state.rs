//! The end-of-run reads: wait until the replicas' applied indexes agree
//! (bounded), then read each node's own state with local reads — its status
//! entry (role, leader, applied index, digest), the membership it knows,
//! every job, and the run records of every job the harness ever touched —
//! into `final` events. Each slot is read as the node living there now
//! (membership changes give slots new node ids).

use crate::client::{local, status, Node};
use crate::event::{FinalJob, FinalNode, FinalRun};
use kairos_proto::v1::{
    jobs_client::JobsClient, runs_client::RunsClient, ListJobsRequest, ListRunsRequest, RunRef,
    RunState,
};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::time::Instant;

const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Page size for ListJobs and ListRuns (the API maximum).
const PAGE: u32 = 1_000;
/// Pages read per list, at most.
const MAX_PAGES: usize = 500;
/// Workflow runs whose consumed upstream runs are read, per node.
const MAX_WORKFLOW_RUNS: usize = 5_000;

/// Each node's (applied_index) as it reports itself; `None` if unreachable.
pub async fn applied_indexes(nodes: &[Node]) -> Vec<Option<u64>> {
    let mut out = Vec::new();
    for n in nodes {
        let own = status(&n.channel, Duration::from_secs(1))
            .await
            .ok()
            .and_then(|s| s.nodes.into_iter().find(|x| x.id == n.id()))
            .map(|x| x.applied_index);
        out.push(own);
    }
    out
}

/// Waits until every node answers with the same applied index twice in a
/// row, or `limit` passes. Returns whether they converged.
pub async fn wait_converged(nodes: &[Node], limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let mut last: Option<u64> = None;
    while Instant::now() < deadline {
        let idx = applied_indexes(nodes).await;
        let first = idx[0];
        let same = first.is_some() && idx.iter().all(|i| *i == first);
        if same && last == first {
            return true;
        }
        last = if same { first } else { None };
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    false
}

/// Reads node `n`'s local state; `ids` are job ids whose runs to list.
pub async fn read_node(n: &Node, ids: &BTreeSet<String>, now_ms: i64) -> FinalNode {
    let mut f = FinalNode {
        time_ms: now_ms,
        node: n.id(),
        ..Default::default()
    };
    match status(&n.channel, CALL_TIMEOUT).await {
        Ok(s) => {
            f.leader = s.leader;
            let own = s
                .nodes
                .iter()
                .find(|x| x.id == f.node)
                .cloned()
                .unwrap_or_default();
            let (voters, learners) = s.nodes.iter().partition::<Vec<_>, _>(|x| x.voter);
            f.voters = sorted_ids(&voters);
            f.learners = sorted_ids(&learners);
            f.membership_changing = s.membership_changing;
            f.role = own.role;
            f.term = own.term;
            f.applied_index = own.applied_index;
            f.state_digest = own.state_digest;
            f.digest_index = own.digest_index;
        }
        Err(e) => {
            f.error = Some(format!("status: {e}"));
            return f;
        }
    }
    match read_jobs(n).await {
        Ok(jobs) => f.jobs = jobs,
        Err(e) => {
            f.error = Some(format!("list jobs: {e}"));
            return f;
        }
    }
    let all: BTreeSet<String> = ids
        .iter()
        .cloned()
        .chain(f.jobs.iter().map(|j| j.id.clone()))
        .collect();
    for id in &all {
        match read_runs(n, id).await {
            Ok(mut runs) => f.runs.append(&mut runs),
            Err(e) => {
                f.error = Some(format!("list runs of {id}: {e}"));
                return f;
            }
        }
    }
    if let Err(e) = read_upstream_runs(n, &mut f).await {
        f.error = Some(format!("get run: {e}"));
        return f;
    }
    f.applied_index_after = status(&n.channel, CALL_TIMEOUT)
        .await
        .ok()
        .and_then(|s| s.nodes.into_iter().find(|x| x.id == f.node))
        .map_or(0, |x| x.applied_index);
    f.reachable = true;
    f
}

fn sorted_ids(nodes: &[&kairos_proto::v1::NodeStatus]) -> Vec<u64> {
    let mut ids: Vec<u64> = nodes.iter().map(|x| x.id).collect();
    ids.sort_unstable();
    ids
}

async fn read_jobs(n: &Node) -> Result<Vec<FinalJob>, tonic::Status> {
    let mut client = JobsClient::new(n.channel.clone());
    let mut out = Vec::new();
    let mut token = String::new();
    for _ in 0..MAX_PAGES {
        let req = ListJobsRequest {
            page_size: PAGE,
            page_token: token.clone(),
            ..Default::default()
        };
        let page = client
            .list_jobs(local(req, CALL_TIMEOUT))
            .await?
            .into_inner();
        for j in page.jobs {
            let value = crate::client::payload_value(&j);
            out.push(FinalJob {
                id: j.spec.as_ref().map(|s| s.id.clone()).unwrap_or_default(),
                revision: j.revision,
                paused: j.paused,
                created_at_ms: j.created_at_ms,
                next_fire_at_ms: j.next_fire_at_ms,
                value,
                upstream: j.spec.map(|s| s.upstream).unwrap_or_default(),
            });
        }
        if page.next_page_token.is_empty() || page.next_page_token == token {
            break;
        }
        token = page.next_page_token;
    }
    Ok(out)
}

/// Fills in the consumed upstream runs of every run of a job that has
/// upstreams (ListRuns leaves them out), at most `MAX_WORKFLOW_RUNS`.
async fn read_upstream_runs(n: &Node, f: &mut FinalNode) -> Result<(), tonic::Status> {
    let downstream: BTreeSet<&str> = (f.jobs.iter())
        .filter(|j| !j.upstream.is_empty())
        .map(|j| j.id.as_str())
        .collect();
    let mut client = RunsClient::new(n.channel.clone());
    let runs = (f.runs.iter_mut()).filter(|r| downstream.contains(r.job.as_str()));
    for run in runs.take(MAX_WORKFLOW_RUNS) {
        let req = RunRef {
            run_id: run.run_id.clone(),
        };
        let got = client.get_run(local(req, CALL_TIMEOUT)).await?.into_inner();
        run.upstream_runs = got.upstream_runs;
    }
    Ok(())
}

async fn read_runs(n: &Node, job: &str) -> Result<Vec<FinalRun>, tonic::Status> {
    let mut client = RunsClient::new(n.channel.clone());
    let mut out = Vec::new();
    let mut after = (0i64, 0u32);
    for _ in 0..MAX_PAGES {
        let req = ListRunsRequest {
            job: job.to_string(),
            page_size: PAGE,
            after_scheduled_at_ms: after.0,
            after_shard: after.1,
        };
        let page = match client.list_runs(local(req, CALL_TIMEOUT)).await {
            Ok(p) => p.into_inner(),
            // A deleted job may have no runs to list.
            Err(s) if s.code() == tonic::Code::NotFound => break,
            Err(s) => return Err(s),
        };
        out.extend(page.runs.into_iter().map(|r| {
            FinalRun {
                state: RunState::try_from(r.state)
                    .map(|s| s.as_str_name().trim_start_matches("RUN_STATE_").to_string())
                    .unwrap_or_else(|_| r.state.to_string()),
                run_id: r.run_id,
                job: r.job,
                scheduled_at_ms: r.scheduled_at_ms,
                fired_at_ms: r.fired_at_ms,
                attempt: r.attempt,
                finished_at_ms: r.finished_at_ms,
                upstream_runs: Vec::new(),
            }
        }));
        let next = (page.next_after_scheduled_at_ms, page.next_after_shard);
        if next == (0, 0) || next <= after {
            break;
        }
        after = next;
    }
    Ok(out)
}
