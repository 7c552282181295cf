//! Workload `interval`: fixed-rate jobs (`int-<n>`, every 200 ms–2 s) whose
//! runs go to the harness workers. A few are created at the start and one
//! more now and then, up to a cap; they are never modified, so every
//! occurrence after an acknowledged create must fire exactly once. A create
//! that fails or comes back unknown is not retried under the same id.
//! Returns every id it tried, for quiesce and the final reads.

use super::{execute, invocation, Ctx, Reply};
use crate::client::{self, WORKER_GROUP};
use crate::event::{OpF, Workload};
use crate::generator::interval_every_ms;
use kairos_proto::v1::schedule::Kind;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::time::Duration;

#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub initial: usize,
    pub max_jobs: usize,
    pub add_every: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            initial: 4,
            max_jobs: 8,
            add_every: Duration::from_secs(15),
        }
    }
}

/// Process ids of this workload start here.
const PROCESS_BASE: u64 = 1_000;

pub async fn run(ctx: Ctx, cfg: Config) -> Vec<String> {
    let mut rng = StdRng::seed_from_u64(ctx.seed ^ 0x1_7e_u64);
    let mut ids = Vec::new();
    for k in 0..cfg.max_jobs {
        if k >= cfg.initial && ctx.sleep_or_stop(cfg.add_every).await {
            break;
        }
        if ctx.stopped() {
            break;
        }
        let id = format!("int-{k}");
        let every_ms = interval_every_ms(&mut rng, k);
        let node = ctx.node(k).clone();
        let mut inv = invocation(
            PROCESS_BASE + k as u64,
            node.id(),
            Workload::Interval,
            OpF::Create,
            &id,
        );
        inv.every_ms = Some(every_ms);
        let spec = client::spec(
            &id,
            Kind::EveryMs(every_ms),
            id.clone().into_bytes(),
            WORKER_GROUP,
        );
        let t = ctx.op_timeout;
        execute(&ctx, inv, async {
            client::create(&node.channel, spec, t).await.map(Reply::Job)
        })
        .await;
        ids.push(id);
    }
    ids
}
