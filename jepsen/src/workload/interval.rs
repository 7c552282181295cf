//! Workload `interval`: fixed-rate jobs (`int-<n>`, every 200 ms–2 s) whose
//! runs go to the harness workers. A few are created at the start and one
//! more now and then, up to a cap; they are never modified, so every
//! occurrence after an acknowledged create must fire exactly once. A create
//! that fails or comes back unknown is not retried under the same id.
//! Beside them a pauser owns two more (`int-p0`, `int-p1`): every 4–10 s
//! (seeded) it pauses or resumes one, so acknowledged pauses and resumes
//! meet the faults (`no-undone-writes` judges them; `no-missed-occurrence`
//! leaves jobs that were paused alone, which is why they are separate).
//! Returns every id it tried, for quiesce and the final reads.

use super::{execute, invocation, Ctx, Reply};
use crate::client::{self, WORKER_GROUP};
use crate::event::{OpF, Outcome, Workload};
use crate::generator::interval_every_ms;
use kairos_proto::v1::{jobs_client::JobsClient, schedule::Kind, Job, JobRef};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
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
/// The pauser's process ids start here (a new one after an unknown answer).
const PAUSER_BASE: u64 = 1_100;
/// The jobs only the pauser touches, with their periods.
pub const PAUSABLE: [(&str, u64); 2] = [("int-p0", 1_000), ("int-p1", 1_500)];

pub async fn run(ctx: Ctx, cfg: Config) -> Vec<String> {
    let pauser = tokio::spawn(pauser(ctx.clone()));
    let mut ids = create_loop(&ctx, cfg).await;
    ids.extend(pauser.await.unwrap_or_default());
    ids
}

async fn create_loop(ctx: &Ctx, cfg: Config) -> Vec<String> {
    let ctx = ctx.clone();
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

/// The pauser's next step: wait `gap_ms`, then pause or resume PAUSABLE[job].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PauseStep {
    pub gap_ms: u64,
    pub job: usize,
}

pub fn pause_step(rng: &mut StdRng) -> PauseStep {
    PauseStep {
        gap_ms: rng.gen_range(4_000..=10_000),
        job: rng.gen_range(0..PAUSABLE.len()),
    }
}

/// Creates the pausable jobs, then toggles one at a time until stopped:
/// a job last acknowledged paused is resumed, one last acknowledged running
/// is paused, one whose last answer was unknown gets either (seeded).
async fn pauser(ctx: Ctx) -> Vec<String> {
    let mut rng = StdRng::seed_from_u64(ctx.seed ^ 0x9a05e);
    let mut process = PAUSER_BASE;
    let mut created: Vec<bool> = Vec::new();
    // Per job: paused as last acknowledged; None after an unknown answer.
    let mut paused: Vec<Option<bool>> = Vec::new();
    for (k, (id, every_ms)) in PAUSABLE.iter().enumerate() {
        let node = ctx.node(k).clone();
        let mut inv = invocation(process, node.id(), Workload::Interval, OpF::Create, id);
        inv.every_ms = Some(*every_ms);
        let spec = client::spec(
            id,
            Kind::EveryMs(*every_ms),
            id.as_bytes().to_vec(),
            WORKER_GROUP,
        );
        let t = ctx.op_timeout;
        let c = execute(&ctx, inv, async {
            client::create(&node.channel, spec, t).await.map(Reply::Job)
        })
        .await;
        if c.outcome == Outcome::Unknown {
            process += 1;
        }
        // Only acknowledged jobs are toggled.
        created.push(c.outcome == Outcome::Ok);
        paused.push(Some(false));
    }
    let mut n = 0usize;
    while !ctx.stopped() {
        let step = pause_step(&mut rng);
        if ctx.sleep_or_stop(Duration::from_millis(step.gap_ms)).await {
            break;
        }
        if !created.get(step.job).copied().unwrap_or(false) {
            continue;
        }
        let pause = match paused[step.job] {
            Some(p) => !p,
            None => rng.gen_bool(0.5),
        };
        let id = PAUSABLE[step.job].0;
        let node = ctx.node(n).clone();
        n += 1;
        let f = if pause { OpF::Pause } else { OpF::Resume };
        let inv = invocation(process, node.id(), Workload::Interval, f, id);
        let t = ctx.op_timeout;
        let c = execute(&ctx, inv, async {
            let r = if pause {
                client::pause(&node.channel, id, t).await
            } else {
                resume(&node.channel, id, t).await
            };
            r.map(Reply::Job)
        })
        .await;
        match c.outcome {
            Outcome::Ok => paused[step.job] = Some(pause),
            Outcome::Unknown => {
                paused[step.job] = None;
                process += 1;
            }
            Outcome::Fail => {}
        }
    }
    PAUSABLE.iter().map(|(id, _)| id.to_string()).collect()
}

async fn resume(ch: &client::NodeChannel, id: &str, t: Duration) -> Result<Job, tonic::Status> {
    let req = client::request(JobRef { id: id.to_string() }, t);
    Ok(JobsClient::new(ch.clone())
        .resume_job(req)
        .await?
        .into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauser_steps_are_seeded_spaced_and_cover_both_jobs() {
        let steps = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..200).map(|_| pause_step(&mut rng)).collect::<Vec<_>>()
        };
        let a = steps(5);
        assert_eq!(a, steps(5));
        assert_ne!(a, steps(6));
        assert!(a.iter().all(|s| (4_000..=10_000).contains(&s.gap_ms)));
        for job in 0..PAUSABLE.len() {
            assert!(a.iter().filter(|s| s.job == job).count() > 50, "{job}");
        }
    }
}
