//! Workload `workflow`: a few diamonds `wf<k>-a` → (`wf<k>-b`, `wf<k>-c`) →
//! `wf<k>-d`. `a` runs every 2–3 s in the harness workers' group; `b`, `c`
//! and `d` are upstream-only jobs with the default all-success rule, so each
//! completed cycle fires the next level. The jobs are created once at the
//! start (each create retried, bounded); the nemeses then act on the running
//! graph and the `workflow` checker judges the runs read at the end.

use super::{execute, invocation, Ctx, Reply};
use crate::client::{self, WORKER_GROUP};
use crate::event::{OpF, Outcome, Workload};
use kairos_proto::v1::schedule::Kind;
use std::time::Duration;

/// Diamonds created.
pub const DIAMONDS: usize = 2;
/// Tries per create before the job is given up on.
const CREATE_ATTEMPTS: u64 = 20;
const PROCESS_BASE: u64 = 4_000;
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// The ids of diamond `k`'s jobs in creation order (upstreams first).
fn diamond(k: usize) -> [String; 4] {
    ["a", "b", "c", "d"].map(|x| format!("wf{k}-{x}"))
}

/// Creates the diamonds; returns the ids of their `a` jobs (the only ones
/// with a schedule of their own, paused when the run winds down) and every
/// id it tried.
pub async fn run(ctx: Ctx) -> (Vec<String>, Vec<String>) {
    let (mut roots, mut ids) = (Vec::new(), Vec::new());
    let mut process = PROCESS_BASE;
    for k in 0..DIAMONDS {
        let [a, b, c, d] = diamond(k);
        let every_ms = 2_000 + 500 * k as u64;
        let plan = [
            (&a, Kind::EveryMs(every_ms), vec![]),
            (&b, Kind::UpstreamOnly(true), vec![a.clone()]),
            (&c, Kind::UpstreamOnly(true), vec![a.clone()]),
            (&d, Kind::UpstreamOnly(true), vec![b.clone(), c.clone()]),
        ];
        for (id, kind, upstream) in plan {
            ids.push(id.clone());
            if !create(&ctx, &mut process, id, kind, upstream).await {
                return (roots, ids);
            }
        }
        roots.push(a);
    }
    (roots, ids)
}

/// Creates one job, retrying until it is known to exist (an ok, or
/// ALREADY_EXISTS after an unknown try). False if it never was, or on stop.
async fn create(ctx: &Ctx, process: &mut u64, id: &str, kind: Kind, upstream: Vec<String>) -> bool {
    for attempt in 0..CREATE_ATTEMPTS {
        if attempt > 0 && ctx.sleep_or_stop(RETRY_PAUSE).await {
            return false;
        }
        let node = ctx.node(attempt as usize).clone();
        let mut inv = invocation(*process, node.id(), Workload::Workflow, OpF::Create, id);
        if let Kind::EveryMs(ms) = kind {
            inv.every_ms = Some(ms);
        }
        let mut spec = client::spec(id, kind.clone(), Vec::new(), WORKER_GROUP);
        spec.upstream = upstream.clone();
        let t = ctx.op_timeout;
        let c = execute(ctx, inv, async {
            client::create(&node.channel, spec, t).await.map(Reply::Job)
        })
        .await;
        if c.outcome == Outcome::Unknown {
            *process += 1;
        }
        if c.outcome == Outcome::Ok || c.code.as_deref() == Some("ALREADY_EXISTS") {
            return true;
        }
    }
    false
}
