//! Workload `register`: several client processes run create / revision-CAS
//! update / get / delete on a sliding window of a few keys (`reg-<n>`), each
//! key retiring after a bounded number of operations so the linearizability
//! search per key stays small. Each process talks to one node. Written values
//! are unique integers (the job payload). As in Jepsen, a process whose
//! operation came back unknown is retired and replaced by a fresh process id,
//! since its operation may still be in flight.

use super::{execute, invocation, Ctx, Reply};
use crate::client::{self, FAR_FUTURE_MS};
use crate::event::{OpF, Outcome, Workload};
use crate::generator::register_choice;
use kairos_proto::v1::schedule::Kind;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub processes: usize,
    /// Operations per second across all processes.
    pub rate: f64,
    /// Keys in use at once.
    pub active_keys: u64,
    /// Operations before the window slides one key on.
    pub ops_per_slide: u64,
    pub max_ops: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            processes: 4,
            rate: 10.0,
            active_keys: 3,
            ops_per_slide: 30,
            max_ops: 200_000,
        }
    }
}

/// Shared counters: operations issued (drives the key window) and values.
struct Shared {
    ops: AtomicU64,
    values: AtomicU64,
}

pub async fn run(ctx: Ctx, cfg: Config) {
    let shared = Arc::new(Shared {
        ops: AtomicU64::new(0),
        values: AtomicU64::new(1),
    });
    let tasks: Vec<_> = (0..cfg.processes)
        .map(|p| tokio::spawn(process(ctx.clone(), cfg, shared.clone(), p)))
        .collect();
    for t in tasks {
        let _ = t.await;
    }
}

/// The key for the `n`-th operation: one of the `active` newest keys.
pub fn key_for(n: u64, cfg: &Config, pick: u64) -> String {
    let newest = n / cfg.ops_per_slide + cfg.active_keys - 1;
    format!("reg-{}", newest - pick % cfg.active_keys)
}

async fn process(ctx: Ctx, cfg: Config, shared: Arc<Shared>, slot: usize) {
    let mut rng = StdRng::seed_from_u64(ctx.seed ^ (0x5eed_0000 + slot as u64));
    let mut process = slot as u64;
    let node = ctx.node(slot).clone();
    let mut known: HashMap<String, u64> = HashMap::new();
    let gap_ms = (cfg.processes as f64 * 1000.0 / cfg.rate.max(0.01)) as u64;
    loop {
        let pause = rng.gen_range(gap_ms / 2..=gap_ms * 3 / 2 + 1);
        if ctx.sleep_or_stop(Duration::from_millis(pause)).await {
            return;
        }
        let n = shared.ops.fetch_add(1, Ordering::Relaxed);
        if n >= cfg.max_ops {
            return;
        }
        let key = key_for(n, &cfg, rng.gen());
        let choice = register_choice(&mut rng, known.get(&key).copied());
        let value = shared.values.fetch_add(1, Ordering::Relaxed);
        let mut inv = invocation(process, node.id(), Workload::Register, choice.f, &key);
        let t = ctx.op_timeout;
        let ch = &node.channel;
        let spec = || {
            client::spec(
                &key,
                Kind::AtMs(FAR_FUTURE_MS),
                value.to_string().into_bytes(),
                "jepsen-register",
            )
        };
        let c = match choice.f {
            OpF::Create => {
                inv.value = Some(value);
                execute(&ctx, inv, async {
                    client::create(ch, spec(), t).await.map(Reply::Job)
                })
                .await
            }
            OpF::Update => {
                inv.value = Some(value);
                inv.expected_revision = Some(choice.expected_revision);
                let e = choice.expected_revision;
                execute(&ctx, inv, async {
                    client::update(ch, spec(), e, t).await.map(Reply::Job)
                })
                .await
            }
            OpF::Get => {
                execute(&ctx, inv, async {
                    client::get(ch, &key, t).await.map(Reply::Job)
                })
                .await
            }
            _ => {
                execute(&ctx, inv, async {
                    client::delete(ch, &key, t).await.map(Reply::Deleted)
                })
                .await
            }
        };
        match (c.outcome, c.revision) {
            (Outcome::Ok, Some(r)) => {
                known.insert(key, r);
            }
            (Outcome::Unknown, _) => process += cfg.processes as u64,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_window_slides_and_bounds_ops_per_key() {
        let cfg = Config::default();
        assert_eq!(key_for(0, &cfg, 0), "reg-2");
        assert_eq!(key_for(0, &cfg, 2), "reg-0");
        assert_eq!(key_for(30, &cfg, 0), "reg-3");
        let mut per_key: HashMap<String, u64> = HashMap::new();
        for n in 0..3_000 {
            *per_key.entry(key_for(n, &cfg, n * 7919)).or_default() += 1;
        }
        assert!(per_key
            .values()
            .all(|c| *c <= cfg.ops_per_slide * cfg.active_keys));
    }
}
