//! Client workloads. Each runs as tokio tasks until told to stop, spacing its
//! operations to a rate and never exceeding an operation budget. Every call
//! goes through `execute`, which records the invocation, bounds the call by a
//! timeout, classifies the answer (ok / fail / unknown) and records the
//! completion, so no workload can forget to write its history.

pub mod execution;
pub mod interval;
pub mod register;
pub mod timers;
pub mod workflow;

use crate::client::{self, code_name, Node};
use crate::event::{Complete, Event, Invoke, OpF, Outcome, Workload};
use crate::recorder::Recorder;
use kairos_proto::v1::Job;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Longest error message kept in the history.
const MAX_ERROR_LEN: usize = 200;

/// What every workload task needs.
#[derive(Clone)]
pub struct Ctx {
    pub rec: Recorder,
    pub nodes: Arc<Vec<Node>>,
    pub op_timeout: Duration,
    pub stop: watch::Receiver<bool>,
    pub seed: u64,
}

impl Ctx {
    pub fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    /// Sleeps `d`, returning early (true) if stop was signalled.
    pub async fn sleep_or_stop(&self, d: Duration) -> bool {
        let mut stop = self.stop.clone();
        if *stop.borrow() {
            return true;
        }
        tokio::select! {
            _ = tokio::time::sleep(d) => self.stopped(),
            _ = stop.changed() => true,
        }
    }

    pub fn node(&self, idx: usize) -> &Node {
        &self.nodes[idx % self.nodes.len()]
    }
}

/// A successful answer (short-lived, one per operation).
#[allow(clippy::large_enum_variant)]
pub enum Reply {
    Job(Job),
    Deleted(bool),
}

/// A fresh invocation; `execute` fills in op id and time.
pub fn invocation(process: u64, node: u64, workload: Workload, f: OpF, key: &str) -> Invoke {
    Invoke::new(0, process, node, 0, workload, f, key)
}

/// Records `inv`, runs `call` under the context's timeout, records and
/// returns the completion. A get answered NOT_FOUND is an ok read of nothing.
pub async fn execute<F>(ctx: &Ctx, mut inv: Invoke, call: F) -> Complete
where
    F: Future<Output = Result<Reply, tonic::Status>>,
{
    inv.op = ctx.rec.next_op_id();
    inv.time_ms = ctx.rec.now_ms();
    let (op, process, f) = (inv.op, inv.process, inv.f);
    ctx.rec.record(Event::Invoke(inv)).await;
    let answer = tokio::time::timeout(ctx.op_timeout + Duration::from_millis(500), call).await;
    let mut c = Complete::bare(op, process, ctx.rec.now_ms(), Outcome::Unknown);
    match answer {
        Err(_) => c.code = Some("DEADLINE_EXCEEDED".into()),
        Ok(Ok(Reply::Job(job))) => {
            c.outcome = Outcome::Ok;
            c.revision = Some(job.revision);
            c.value = client::payload_value(&job);
            c.created_at_ms = Some(job.created_at_ms);
            c.next_fire_at_ms = Some(job.next_fire_at_ms);
            if f == OpF::Get {
                c.found = Some(true);
            }
        }
        Ok(Ok(Reply::Deleted(d))) => {
            c.outcome = Outcome::Ok;
            c.deleted = Some(d);
        }
        Ok(Err(s)) if f == OpF::Get && s.code() == tonic::Code::NotFound => {
            c.outcome = Outcome::Ok;
            c.found = Some(false);
        }
        Ok(Err(s)) => {
            c.outcome = client::classify(&s);
            c.code = Some(code_name(s.code()).to_string());
            c.error = Some(s.message().chars().take(MAX_ERROR_LEN).collect());
        }
    }
    ctx.rec.record(Event::Complete(c.clone())).await;
    c
}
