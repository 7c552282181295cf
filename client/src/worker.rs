//! Worker SDK: `Worker::connect(endpoints, group).capacity(n).run(handler)`.
//!
//! The worker keeps one stream to the leader, follows redirects across
//! leader changes, runs each assignment with the handler, heartbeats the
//! attempts it holds and reports their finish until the server
//! acknowledges it (re-sending unacknowledged finishes after a reconnect).
//! Execution is at-least-once: a task may arrive again after a failover;
//! deduplicate on [`Task::fencing_token`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kairos_proto::v1::{self as pb, server_message::Msg as In, worker_message::Msg as Out};
use tokio::sync::{mpsc, Mutex};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

use crate::pb::workers_client::WorkersClient;

/// One run attempt handed to this worker.
#[derive(Clone, Debug)]
pub struct Task {
    pub run_id: String,
    pub job: String,
    pub scheduled_at_ms: i64,
    pub fired_at_ms: i64,
    pub attempt: u32,
    pub payload: Vec<u8>,
    pub deadline_ms: i64,
    /// `<run_id>#<attempt>`: stable across leaders.
    pub fencing_token: String,
    /// Shard index, `0..shard_count` (0 and 1 for an unsharded job).
    pub shard: u32,
    pub shard_count: u32,
    /// This worker's clock when the assignment arrived.
    pub received_at_ms: i64,
    /// A workflow run: the results of the upstream runs it follows, as a
    /// JSON object keyed by upstream job id (empty for other runs).
    pub upstream_results: Vec<u8>,
}

#[derive(Clone, Debug)]
pub enum Outcome {
    Success(Vec<u8>),
    Failure {
        error: String,
        retryable: bool,
    },
    /// The handler stopped the task at its deadline (retried like any
    /// retryable failure, but the run ends as timed-out, not failed).
    TimedOut {
        error: String,
    },
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub struct Worker {
    endpoints: Vec<String>,
    groups: Vec<String>,
    capacity: u32,
    id: String,
    labels: std::collections::HashMap<String, String>,
    heartbeat: Duration,
    stop_grace: Duration,
    security: crate::Security,
}

#[derive(Default)]
struct Shared {
    /// Attempts being executed, by run id.
    running: HashMap<String, (u32, JoinHandle<()>)>,
    /// Finished attempts not yet acknowledged, by (run id, attempt).
    unacked: HashMap<(String, u32), pb::Finish>,
}

enum SessionEnd {
    Redirect(String),
    Closed,
}

impl Worker {
    pub fn connect<S: Into<String>>(endpoints: impl IntoIterator<Item = S>, group: &str) -> Self {
        Worker {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            groups: vec![group.to_string()],
            capacity: 1,
            id: format!("worker-{}-{}", std::process::id(), now_ms() % 100_000),
            labels: Default::default(),
            heartbeat: Duration::from_secs(1),
            stop_grace: Duration::ZERO,
            security: crate::Security::default(),
        }
    }

    pub fn capacity(mut self, n: u32) -> Self {
        self.capacity = n;
        self
    }

    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    pub fn group(mut self, g: &str) -> Self {
        self.groups.push(g.to_string());
        self
    }

    /// Announces that the handler enforces each task's deadline itself and
    /// reports within `grace` after it (e.g. after stopping the task's
    /// processes gracefully): the leader then waits that long past the
    /// deadline before it expires the attempt. At most 60 s.
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace.min(Duration::from_secs(60));
        self
    }

    /// TLS trust and token (a `worker` token for this worker's groups).
    pub fn security(mut self, sec: crate::Security) -> Self {
        self.security = sec;
        self
    }

    /// A label announced in Hello, matched by jobs with route `label`.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_string(), value.to_string());
        self
    }

    /// Runs until the process ends.
    pub async fn run<H, Fut>(self, handler: H) -> anyhow::Result<()>
    where
        H: Fn(Task) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        self.run_until(handler, std::future::pending()).await
    }

    /// Runs until `shutdown` resolves, then waits for in-flight tasks (up
    /// to their deadlines) and for their finishes to be acknowledged.
    pub async fn run_until<H, Fut>(
        self,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> anyhow::Result<()>
    where
        H: Fn(Task) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        anyhow::ensure!(
            !self.endpoints.is_empty(),
            "endpoints: at least one is required"
        );
        let handler = Arc::new(handler);
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let this = Arc::new(self);
        let main = {
            let (this, shared) = (this.clone(), shared.clone());
            async move { this.reconnect_loop(handler, shared, stop_rx).await }
        };
        tokio::pin!(main);
        tokio::select! {
            r = &mut main => return r,
            _ = shutdown => {}
        }
        let _ = stop_tx.send(true);
        main.await
    }

    async fn reconnect_loop<H, Fut>(
        &self,
        handler: Arc<H>,
        shared: Arc<Mutex<Shared>>,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> anyhow::Result<()>
    where
        H: Fn(Task) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        let mut next = 0usize;
        let mut target = self.endpoints[0].clone();
        loop {
            let res = self
                .session(&target, handler.clone(), shared.clone(), stop.clone())
                .await;
            if *stop.borrow() {
                let s = shared.lock().await;
                if s.running.is_empty() && s.unacked.is_empty() {
                    return Ok(());
                }
            }
            match res {
                Ok(SessionEnd::Redirect(addr)) if !addr.is_empty() => target = addr,
                Ok(SessionEnd::Closed) if *stop.borrow() => return Ok(()),
                other => {
                    if let Err(e) = other {
                        tracing::debug!("worker session to {target} ended: {e}");
                    }
                    next = (next + 1) % self.endpoints.len();
                    target = self.endpoints[next].clone();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    async fn session<H, Fut>(
        &self,
        addr: &str,
        handler: Arc<H>,
        shared: Arc<Mutex<Shared>>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> anyhow::Result<SessionEnd>
    where
        H: Fn(Task) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel::<pb::WorkerMessage>(1024);
        let hello = pb::Hello {
            worker_id: self.id.clone(),
            groups: self.groups.clone(),
            capacity: self.capacity,
            labels: self.labels.clone(),
            stop_grace_ms: self.stop_grace.as_millis() as u32,
        };
        tx.send(pb::WorkerMessage {
            msg: Some(Out::Hello(hello)),
        })
        .await?;
        let ch = crate::channel_with(addr, &self.security)?;
        let mut client = WorkersClient::with_interceptor(ch, self.security.auth()?)
            .max_decoding_message_size(8 << 20);
        let mut inbound = client.session(ReceiverStream::new(rx)).await?.into_inner();
        // Finishes the previous leader never acknowledged: report them again.
        for f in shared.lock().await.unacked.values() {
            tx.send(pb::WorkerMessage {
                msg: Some(Out::Finish(f.clone())),
            })
            .await?;
        }
        let mut beat = tokio::time::interval(self.heartbeat);
        let mut drained = false;
        loop {
            if *stop.borrow() && !drained {
                // Stopping: take no more attempts, finish (or release) the ones held.
                drained = true;
                tx.send(pb::WorkerMessage {
                    msg: Some(Out::Drain(pb::Drain {})),
                })
                .await?;
            }
            tokio::select! {
                m = inbound.message() => match m? {
                    None => return Ok(SessionEnd::Closed),
                    Some(pb::ServerMessage { msg: Some(In::Redirect(r)) }) => return Ok(SessionEnd::Redirect(r.leader_addr)),
                    Some(pb::ServerMessage { msg: Some(m) }) => {
                        let stopping = *stop.borrow();
                        on_server_message(m, &handler, &shared, &tx, stopping).await
                    }
                    Some(_) => {}
                },
                _ = beat.tick() => {
                    let s = shared.lock().await;
                    if *stop.borrow() && s.running.is_empty() && s.unacked.is_empty() {
                        return Ok(SessionEnd::Closed);
                    }
                    let run_ids = s.running.keys().cloned().collect();
                    drop(s);
                    tx.send(pb::WorkerMessage { msg: Some(Out::Heartbeat(pb::Heartbeat { run_ids })) }).await?;
                }
                _ = stop.changed() => {}
            }
        }
    }
}

async fn on_server_message<H, Fut>(
    m: In,
    handler: &Arc<H>,
    shared: &Arc<Mutex<Shared>>,
    tx: &mpsc::Sender<pb::WorkerMessage>,
    stopping: bool,
) where
    H: Fn(Task) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    match m {
        In::Assignment(a) => {
            let mut s = shared.lock().await;
            if stopping
                || s.running
                    .get(&a.run_id)
                    .is_some_and(|(att, _)| *att >= a.attempt)
            {
                return; // shutting down (the lease runs out and it is retried), or already running
            }
            // A newer attempt means the server ended the older one (its
            // Cancel may have been lost): stop it rather than run both.
            if let Some((_, old)) = s.running.remove(&a.run_id) {
                old.abort();
            }
            let task = Task {
                run_id: a.run_id.clone(),
                job: a.job,
                scheduled_at_ms: a.scheduled_at_ms,
                fired_at_ms: a.fired_at_ms,
                attempt: a.attempt,
                payload: a.payload,
                deadline_ms: a.deadline_ms,
                fencing_token: a.fencing_token,
                received_at_ms: now_ms(),
                shard: a.shard,
                shard_count: a.shard_count.max(1),
                upstream_results: a.upstream_results,
            };
            let h = tokio::spawn(execute(handler.clone(), task, shared.clone(), tx.clone()));
            s.running.insert(a.run_id, (a.attempt, h));
        }
        In::FinishAck(ack) => {
            if !ack.accepted {
                tracing::warn!(run = %ack.run_id, attempt = ack.attempt, "finish refused: {}", ack.error);
            }
            // A refusal is final too (stale attempt, unknown run): stop re-sending it.
            let retry = !ack.accepted && ack.error.contains("not committed");
            if !retry {
                shared
                    .lock()
                    .await
                    .unacked
                    .remove(&(ack.run_id, ack.attempt));
            }
        }
        In::Cancel(c) => {
            let mut s = shared.lock().await;
            let Some((att, h)) = s.running.remove(&c.run_id) else {
                return;
            };
            if att != c.attempt {
                s.running.insert(c.run_id, (att, h));
                return;
            }
            h.abort();
            // The acknowledgement overlap `replace` waits for before it
            // starts the next run (a server that already ended the
            // attempt takes it as a duplicate).
            let finish = pb::Finish {
                run_id: c.run_id.clone(),
                attempt: att,
                error: "stopped: cancelled by the server".into(),
                ..Default::default()
            };
            s.unacked.insert((c.run_id, att), finish.clone());
            drop(s);
            let _ = tx
                .send(pb::WorkerMessage {
                    msg: Some(Out::Finish(finish)),
                })
                .await;
        }
        In::Welcome(_) | In::Redirect(_) => {}
    }
}

async fn execute<H, Fut>(
    handler: Arc<H>,
    task: Task,
    shared: Arc<Mutex<Shared>>,
    tx: mpsc::Sender<pb::WorkerMessage>,
) where
    H: Fn(Task) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    let (run_id, attempt, received_at_ms) =
        (task.run_id.clone(), task.attempt, task.received_at_ms);
    let outcome = handler(task).await;
    let (success, result, error, retryable, timed_out) = match outcome {
        Outcome::Success(r) => (true, r, String::new(), false, false),
        Outcome::Failure { error, retryable } => (false, Vec::new(), error, retryable, false),
        Outcome::TimedOut { error } => (false, Vec::new(), error, true, true),
    };
    let finish = pb::Finish {
        run_id: run_id.clone(),
        attempt,
        success,
        result,
        error,
        retryable,
        received_at_ms,
        timed_out,
    };
    {
        let mut s = shared.lock().await;
        // Only this attempt's own entry: a newer attempt of the run may hold the slot now.
        if s.running.get(&run_id).is_some_and(|(a, _)| *a == attempt) {
            s.running.remove(&run_id);
        }
        s.unacked.insert((run_id, attempt), finish.clone());
    }
    // If the stream is gone the finish stays unacked and is re-sent on reconnect.
    let _ = tx
        .send(pb::WorkerMessage {
            msg: Some(Out::Finish(finish)),
        })
        .await;
}
