//! Workload `timers`: one-shot timers (`tmr-<n>`) due 1–30 s out, half as
//! `after_ms` (relative to cluster time at commit), half as `at_ms` (harness
//! clock + delay). About a third are cancelled (deleted) at a random point
//! before they are due, by a separate canceller so cancels stay on time.
//! Bounded: at most `max_timers` creates and `MAX_PENDING_CANCELS` queued cancels.

use super::{execute, invocation, Ctx, Reply};
use crate::client::{self, WORKER_GROUP};
use crate::event::{OpF, Outcome, Workload};
use crate::generator::timer_plan;
use kairos_proto::v1::schedule::Kind;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;
use tokio::sync::mpsc;

pub const MAX_PENDING_CANCELS: usize = 1_024;
const CREATOR_BASE: u64 = 2_000;
const CANCELLER_BASE: u64 = 3_000;
/// The canceller's wait with nothing queued (a new cancel or stop wakes it).
const IDLE_WAIT: Duration = Duration::from_secs(3_600);

#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Creates per second.
    pub rate: f64,
    pub max_timers: u64,
    /// No creates after this, so every timer is due before the run settles.
    pub create_until: tokio::time::Instant,
}

/// Creates timers until stopped; returns every id it tried.
pub async fn run(ctx: Ctx, cfg: Config) -> Vec<String> {
    let (tx, rx) = mpsc::channel(MAX_PENDING_CANCELS);
    let canceller = tokio::spawn(cancel_loop(ctx.clone(), rx));
    let ids = create_loop(&ctx, cfg, tx).await;
    let _ = canceller.await;
    ids
}

async fn create_loop(ctx: &Ctx, cfg: Config, cancels: mpsc::Sender<(i64, String)>) -> Vec<String> {
    let mut rng = StdRng::seed_from_u64(ctx.seed ^ 0x7133);
    let gap_ms = (1000.0 / cfg.rate.max(0.01)) as u64;
    let mut process = CREATOR_BASE;
    let mut ids = Vec::new();
    for n in 0..cfg.max_timers {
        let pause = rng.gen_range(gap_ms / 2..=gap_ms * 3 / 2 + 1);
        if ctx.sleep_or_stop(Duration::from_millis(pause)).await {
            break;
        }
        if tokio::time::Instant::now() >= cfg.create_until {
            break;
        }
        let id = format!("tmr-{n}");
        let plan = timer_plan(&mut rng);
        let node = ctx.node(n as usize).clone();
        let mut inv = invocation(process, node.id(), Workload::Timers, OpF::Create, &id);
        let kind = if plan.absolute {
            let at = ctx.rec.now_ms() + plan.delay_ms as i64;
            inv.at_ms = Some(at);
            Kind::AtMs(at)
        } else {
            inv.after_ms = Some(plan.delay_ms);
            Kind::AfterMs(plan.delay_ms)
        };
        let spec = client::spec(&id, kind, id.clone().into_bytes(), WORKER_GROUP);
        let t = ctx.op_timeout;
        let c = execute(ctx, inv, async {
            client::create(&node.channel, spec, t).await.map(Reply::Job)
        })
        .await;
        if c.outcome == Outcome::Unknown {
            process += 1;
        }
        if let (Outcome::Ok, Some(after)) = (c.outcome, plan.cancel_after_ms) {
            let _ = cancels.try_send((ctx.rec.now_ms() + after as i64, id.clone()));
        }
        ids.push(id);
    }
    ids
}

async fn cancel_loop(ctx: Ctx, mut rx: mpsc::Receiver<(i64, String)>) {
    let mut due: BinaryHeap<Reverse<(i64, String)>> = BinaryHeap::new();
    let mut process = CANCELLER_BASE;
    let mut open = true;
    let mut n = 0usize;
    while open || !due.is_empty() {
        // Wake at the next cancel's time, on a new cancel, or on stop.
        let wait = due.peek().map_or(IDLE_WAIT, |Reverse((at, _))| {
            Duration::from_millis((at - ctx.rec.now_ms()).max(0) as u64)
        });
        tokio::select! {
            m = rx.recv(), if open => match m {
                Some(x) if due.len() < MAX_PENDING_CANCELS => due.push(Reverse(x)),
                Some(_) => {}
                None => open = false,
            },
            _ = ctx.sleep_or_stop(wait) => {}
        }
        if ctx.stopped() {
            return;
        }
        while due
            .peek()
            .is_some_and(|Reverse((at, _))| *at <= ctx.rec.now_ms())
        {
            let Some(Reverse((_, id))) = due.pop() else {
                break;
            };
            let node = ctx.node(n).clone();
            n += 1;
            let inv = invocation(process, node.id(), Workload::Timers, OpF::Delete, &id);
            let t = ctx.op_timeout;
            let c = execute(&ctx, inv, async {
                client::delete(&node.channel, &id, t)
                    .await
                    .map(Reply::Deleted)
            })
            .await;
            if c.outcome == Outcome::Unknown {
                process += 1;
            }
        }
    }
}
