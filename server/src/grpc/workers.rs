//! The worker stream. A worker says hello (id, groups, capacity); the
//! leader pushes assignments, each with `(run, attempt)` as its fencing
//! token, and acknowledges a finish only once it is committed. A node that
//! is not the leader answers hello with a redirect and closes the stream.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use kairos_proto::v1::{self as pb, server_message::Msg as Out, worker_message::Msg as In};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::auth;
use crate::core::{limits, validate, FinishReport, RunId};
use crate::leader::dispatch::{ToWorker, WorkerInfo, STOP_GRACE_MAX_MS};
use crate::node::Node;

/// Most runs one worker may hold at once.
pub const CAPACITY_MAX: u32 = 10_000;
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// A worker stream with nothing from the worker (the SDK heartbeats every
/// second) for this long is closed. Its host died or dropped off the network
/// without the connection failing, which TCP alone notices only after many
/// minutes; by now its attempts' leases have run out, and without this its
/// free slots would go on taking new attempts that nobody runs. (A stream
/// the leader is stuck writing to, its window full, is ended by the port's
/// keepalive instead: `grpc::KEEPALIVE`, within 25 s.)
pub const SESSION_SILENCE_MS: i64 = crate::leader::dispatch::LEASE_MS;
/// A stream whose node stopped leading waits up to this many polls of
/// `NEW_LEADER_POLL` to learn the new leader before redirecting the worker:
/// an empty redirect sends it through the endpoints 200 ms apart.
const NEW_LEADER_POLLS: u32 = 200;
const NEW_LEADER_POLL: Duration = Duration::from_millis(10);

pub struct WorkerService {
    pub node: Arc<Node>,
}

type Outbound = mpsc::Sender<Result<pb::ServerMessage, Status>>;

fn msg(m: Out) -> Result<pb::ServerMessage, Status> {
    Ok(pb::ServerMessage { msg: Some(m) })
}

#[tonic::async_trait]
impl pb::workers_server::Workers for WorkerService {
    type SessionStream =
        Pin<Box<dyn Stream<Item = Result<pb::ServerMessage, Status>> + Send + 'static>>;

    async fn session(
        &self,
        req: Request<Streaming<pb::WorkerMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let metadata = req.metadata().clone();
        let mut inbound = req.into_inner();
        let hello = match tokio::time::timeout(HELLO_TIMEOUT, inbound.message()).await {
            Ok(Ok(Some(pb::WorkerMessage {
                msg: Some(In::Hello(h)),
            }))) => h,
            Ok(Err(s)) => return Err(s),
            Err(_) => return Err(Status::deadline_exceeded("hello: not received within 10 s")),
            Ok(_) => {
                return Err(Status::invalid_argument(
                    "hello: the first message must be a Hello",
                ))
            }
        };
        validate_hello(&hello)?;
        auth::authorize_worker(&self.node, &metadata, &hello.groups)?;
        let (out, rx) = mpsc::channel(256);
        if !self.node.is_leader() {
            let leader_addr = self.node.leader().map(|(_, a)| a).unwrap_or_default();
            let _ = out
                .send(msg(Out::Redirect(pb::Redirect { leader_addr })))
                .await;
        } else {
            tokio::spawn(run_session(self.node.clone(), hello, inbound, out));
        }
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

fn validate_hello(h: &pb::Hello) -> Result<(), Status> {
    let bad = |e: crate::core::CommandError| Status::invalid_argument(e.to_string());
    validate::name("hello.worker_id", &h.worker_id, limits::ID_MAX_BYTES).map_err(bad)?;
    if h.groups.is_empty() {
        return Err(Status::invalid_argument(
            "hello.groups: at least one group is required",
        ));
    }
    if h.groups.len() > 64 {
        return Err(Status::invalid_argument(format!(
            "hello.groups: at most 64, got {}",
            h.groups.len()
        )));
    }
    for g in &h.groups {
        validate::name("hello.groups", g, limits::GROUP_MAX_BYTES).map_err(bad)?;
    }
    validate::worker_labels(h.labels.iter()).map_err(bad)?;
    if i64::from(h.stop_grace_ms) > STOP_GRACE_MAX_MS {
        return Err(Status::invalid_argument(format!(
            "hello.stop_grace_ms: at most {STOP_GRACE_MAX_MS}, got {}",
            h.stop_grace_ms
        )));
    }
    if h.capacity == 0 || h.capacity > CAPACITY_MAX {
        return Err(Status::invalid_argument(format!(
            "hello.capacity: must be between 1 and {CAPACITY_MAX}, got {}",
            h.capacity
        )));
    }
    Ok(())
}

async fn run_session(
    node: Arc<Node>,
    hello: pb::Hello,
    mut inbound: Streaming<pb::WorkerMessage>,
    out: Outbound,
) {
    let (tx, mut to_worker) = mpsc::channel(hello.capacity as usize + 16);
    let info = WorkerInfo {
        id: hello.worker_id.clone(),
        groups: hello.groups.clone(),
        labels: hello.labels.clone().into_iter().collect(),
        capacity: hello.capacity as usize,
        stop_grace_ms: i64::from(hello.stop_grace_ms),
    };
    let conn = node.dispatcher.register(info, tx);
    tracing::info!(worker = %hello.worker_id, groups = ?hello.groups, capacity = hello.capacity, "worker connected");
    if out
        .send(msg(Out::Welcome(pb::Welcome { leader_id: node.id })))
        .await
        .is_ok()
    {
        node.dispatch_now();
        let silence = Duration::from_millis(SESSION_SILENCE_MS as u64);
        let mut heard = tokio::time::Instant::now();
        loop {
            tokio::select! {
                m = to_worker.recv() => match m {
                    Some(m) => {
                        if !send_to_worker(&node, &out, m).await {
                            break;
                        }
                    }
                    None => {
                        // Leadership moved: point the worker at the new leader.
                        let leader_addr = new_leader_addr(&node).await;
                        let _ = out.send(msg(Out::Redirect(pb::Redirect { leader_addr }))).await;
                        break;
                    }
                },
                // A message already received wins over the deadline
                // (`timeout_at` polls it first), so a loop held up sending
                // does not count as the worker's silence.
                m = tokio::time::timeout_at(heard + silence, inbound.message()) => match m {
                    Ok(Ok(Some(m))) => {
                        heard = tokio::time::Instant::now();
                        on_message(&node, conn, &hello.worker_id, m, &out);
                    }
                    Ok(_) => break,
                    Err(_) => {
                        tracing::warn!(worker = %hello.worker_id, silent_ms = SESSION_SILENCE_MS, "worker sent nothing: closing its stream");
                        let _ = out.try_send(Err(Status::unavailable(format!(
                            "worker stream closed: nothing received for {SESSION_SILENCE_MS} ms (heartbeat every second)"
                        ))));
                        break;
                    }
                },
            }
        }
    }
    node.dispatcher.unregister(conn);
    tracing::info!(worker = %hello.worker_id, "worker disconnected");
}

/// The public address of the leader after this node, once known (empty if
/// none is known within `NEW_LEADER_POLLS`; after a handover it is at once).
async fn new_leader_addr(node: &Node) -> String {
    for _ in 0..NEW_LEADER_POLLS {
        if let Some((_, addr)) = node.leader().filter(|(id, _)| *id != node.id) {
            return addr;
        }
        tokio::time::sleep(NEW_LEADER_POLL).await;
    }
    String::new()
}

/// Builds the assignment from committed state; false when the stream is gone.
async fn send_to_worker(node: &Node, out: &Outbound, m: ToWorker) -> bool {
    let m = match m {
        ToWorker::Cancel { run, attempt } => Out::Cancel(pb::Cancel {
            run_id: run.to_string(),
            attempt,
        }),
        ToWorker::Assign {
            run,
            attempt,
            deadline_ms,
            fired_at_ms,
            shard_count,
        } => {
            let Some(job) = node.sm.get_job(&run.job) else {
                return true; // deleted since: nothing to run
            };
            // Known from the fire that made the attempt ready, except after
            // a leader change (rebuilt from the active-run table).
            let known = fired_at_ms.map(|f| (f, shard_count));
            let Some((fired_at_ms, shard_count)) = known.or_else(|| {
                let r = node.sm.get_run(&run)?;
                Some((r.fired_at_ms, r.shard_count))
            }) else {
                return true;
            };
            Out::Assignment(pb::Assignment {
                run_id: run.to_string(),
                job: run.job.clone(),
                scheduled_at_ms: run.scheduled_at_ms,
                fired_at_ms,
                attempt,
                payload: job.payload,
                deadline_ms,
                fencing_token: format!("{run}#{attempt}"),
                shard: run.shard,
                shard_count,
                upstream_results: node.sm.upstream_results(&run),
            })
        }
    };
    out.send(msg(m)).await.is_ok()
}

fn on_message(node: &Arc<Node>, conn: u64, worker: &str, m: pb::WorkerMessage, out: &Outbound) {
    match m.msg {
        Some(In::Finish(f)) => {
            if let Some(run) = RunId::parse(&f.run_id) {
                if node.dispatcher.held_by_other(conn, worker, &run) {
                    let _ = out.try_send(msg(Out::FinishAck(pb::FinishAck {
                        run_id: f.run_id.clone(),
                        attempt: f.attempt,
                        accepted: false,
                        error: format!(
                            "finish refused: run {} is leased to another worker session",
                            f.run_id
                        ),
                    })));
                    return;
                }
            }
            // The worker is done with it: free its slot now, not after the commit.
            if let Some(run) = RunId::parse(&f.run_id) {
                if node.dispatcher.finishing(conn, &run, f.attempt) {
                    node.dispatch_now();
                }
            }
            let node = node.clone();
            let out = out.clone();
            let worker = worker.to_string();
            tokio::spawn(async move {
                let ack = finish(&node, &worker, &f).await;
                let _ = out.send(msg(Out::FinishAck(ack))).await;
            });
        }
        Some(In::Drain(_)) => {
            node.dispatcher.drain(conn);
            tracing::info!(worker, "worker draining: no new attempts");
        }
        Some(In::Heartbeat(h)) => {
            let runs: Vec<RunId> = h.run_ids.iter().filter_map(|s| RunId::parse(s)).collect();
            node.dispatcher.heartbeat(conn, &runs, node.clock.now_ms());
        }
        Some(In::Hello(_)) | None => {
            let _ = out.try_send(Err(Status::invalid_argument(
                "hello: only the first message may be a Hello",
            )));
        }
    }
}

async fn finish(node: &Node, worker: &str, f: &pb::Finish) -> pb::FinishAck {
    let refuse = |error: String| pb::FinishAck {
        run_id: f.run_id.clone(),
        attempt: f.attempt,
        accepted: false,
        error,
    };
    let Some(run) = RunId::parse(&f.run_id) else {
        return refuse(format!(
            "finish.run_id: expected <job>@<scheduled_at_ms>[/s<shard>], got {:?}",
            f.run_id
        ));
    };
    if f.result.len() > limits::RESULT_MAX_BYTES {
        return refuse(format!(
            "finish.result: at most {} bytes, got {}; pass a reference (an object-storage \
             path) to a bigger output",
            limits::RESULT_MAX_BYTES,
            f.result.len()
        ));
    }
    let report = FinishReport {
        run,
        attempt: f.attempt,
        success: f.success,
        result: f.result.clone(),
        // Trimmed here, so an oversized error never reaches the log.
        error: trim_utf8(&f.error, limits::ERROR_MAX_BYTES).to_string(),
        retryable: f.retryable,
        worker: worker.to_string(),
        received_at_ms: f.received_at_ms,
        jitter_ms: 0,
        timed_out: f.timed_out && !f.success,
    };
    match node.finish(report).await {
        Ok(()) => pb::FinishAck {
            run_id: f.run_id.clone(),
            attempt: f.attempt,
            accepted: true,
            error: String::new(),
        },
        Err(e) => refuse(e.to_string()),
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn trim_utf8(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::trim_utf8;

    #[test]
    fn worker_errors_are_trimmed_on_a_character_boundary() {
        assert_eq!(trim_utf8("abc", 10), "abc");
        assert_eq!(trim_utf8("abcdef", 4), "abcd");
        // "é" is two bytes: cutting inside it keeps the character out.
        assert_eq!(trim_utf8("aé", 2), "a");
        assert_eq!(trim_utf8(&"x".repeat(100_000), 4096).len(), 4096);
    }
}
