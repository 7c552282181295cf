//! Workload `execution`: harness workers. Each opens a Workers.Session to a
//! node, says Hello for group `jepsen`, and for every assignment records a
//! receipt stamped with the harness clock, then finishes it successfully.
//! A redirect is followed to the named node (only if it is one of ours); a
//! broken or silent stream moves on to the next node. Runs until stopped.

use super::Ctx;
use crate::client::{Node, WORKER_GROUP};
use crate::event::{Event, Receipt};
use kairos_proto::v1::{
    server_message, worker_message, workers_client::WorkersClient, Assignment, Finish, Hello,
    WorkerMessage,
};
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;

/// Runs in flight per worker.
pub const CAPACITY: u32 = 64;
/// A stream silent this long is abandoned.
const IDLE: Duration = Duration::from_secs(4);
const BACKOFF: Duration = Duration::from_millis(300);

pub async fn run(ctx: Ctx, workers: usize) {
    let tasks: Vec<_> = (0..workers)
        .map(|w| tokio::spawn(worker(ctx.clone(), format!("jw{w}"), w)))
        .collect();
    for t in tasks {
        let _ = t.await;
    }
}

/// Where a session ended up.
enum Next {
    Node(usize),
    Rotate,
    Stop,
}

async fn worker(ctx: Ctx, id: String, first: usize) {
    let mut target = first % ctx.nodes.len();
    while !ctx.stopped() {
        let node = ctx.nodes[target].clone();
        let stop = ctx.stop.clone();
        let next = tokio::select! {
            n = session(&ctx, &id, &node) => n,
            _ = wait_stop(stop) => Next::Stop,
        };
        target = match next {
            Next::Stop => return,
            Next::Node(i) => {
                if ctx.sleep_or_stop(BACKOFF / 3).await {
                    return;
                }
                i
            }
            Next::Rotate => {
                if ctx.sleep_or_stop(BACKOFF).await {
                    return;
                }
                (target + 1) % ctx.nodes.len()
            }
        };
    }
}

async fn wait_stop(mut stop: tokio::sync::watch::Receiver<bool>) {
    while !*stop.borrow() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}

async fn session(ctx: &Ctx, id: &str, node: &Node) -> Next {
    let (tx, rx) = mpsc::channel::<WorkerMessage>(CAPACITY as usize * 2);
    let hello = Hello {
        worker_id: id.to_string(),
        groups: vec![WORKER_GROUP.to_string()],
        capacity: CAPACITY,
        ..Default::default()
    };
    let _ = tx.try_send(WorkerMessage {
        msg: Some(worker_message::Msg::Hello(hello)),
    });
    let mut client = WorkersClient::new(node.channel.clone());
    let open = tokio::time::timeout(IDLE, client.session(ReceiverStream::new(rx))).await;
    let Ok(Ok(resp)) = open else {
        return Next::Rotate;
    };
    let mut stream = resp.into_inner();
    loop {
        let msg = match tokio::time::timeout(IDLE, stream.message()).await {
            Ok(Ok(Some(m))) => m,
            _ => return Next::Rotate,
        };
        match msg.msg {
            Some(server_message::Msg::Assignment(a)) => {
                let received_at_ms = ctx.rec.now_ms();
                ctx.rec
                    .record(Event::Receipt(receipt(id, node.id(), &a, received_at_ms)))
                    .await;
                let finish = Finish {
                    run_id: a.run_id.clone(),
                    attempt: a.attempt,
                    success: true,
                    received_at_ms,
                    ..Default::default()
                };
                let m = WorkerMessage {
                    msg: Some(worker_message::Msg::Finish(finish)),
                };
                if tx.send(m).await.is_err() {
                    return Next::Rotate;
                }
            }
            Some(server_message::Msg::Redirect(r)) => {
                let to = ctx.nodes.iter().position(|n| n.addr == r.leader_addr);
                return to.map_or(Next::Rotate, Next::Node);
            }
            _ => {}
        }
    }
}

fn receipt(worker: &str, node: u64, a: &Assignment, received_at_ms: i64) -> Receipt {
    Receipt {
        worker: worker.to_string(),
        node,
        run_id: a.run_id.clone(),
        job: a.job.clone(),
        scheduled_at_ms: a.scheduled_at_ms,
        fired_at_ms: a.fired_at_ms,
        received_at_ms,
        attempt: a.attempt,
    }
}
