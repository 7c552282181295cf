//! Bad input over gRPC gets a clear error naming the field, and changes
//! nothing: job specs (priority, shards, labels), worker hellos (capacity,
//! groups) and finishes (oversized result, unknown run, stale attempt), the
//! last of which are refused in a FinishAck while the stream stays usable.

use std::time::Duration;

use kairos_client::pb::{self, server_message::Msg as In, worker_message::Msg as Out};
use kairos_client::Client;
use kairos_tests::{create, every_job, wait_for, worker_session, Cluster};
use tokio::sync::mpsc;
use tonic::{Code, Streaming};

async fn applied_index(c: &Client) -> u64 {
    let s = c.status().await.expect("status");
    s.nodes.iter().map(|n| n.applied_index).max().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_job_specs_are_refused_naming_the_field_and_write_nothing() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    let before = applied_index(&c).await;
    let cases: Vec<(pb::JobSpec, &str)> = vec![
        (
            pb::JobSpec {
                priority: 11,
                ..every_job("p", "g", 1000)
            },
            "priority: must be between 1 and 10, got 11",
        ),
        (
            pb::JobSpec {
                shards: Some(0),
                ..every_job("s0", "g", 1000)
            },
            "shards: must be between 1 and 1024, got 0",
        ),
        (
            pb::JobSpec {
                shards: Some(1025),
                ..every_job("s1025", "g", 1000)
            },
            "shards: must be between 1 and 1024, got 1025",
        ),
        (
            pb::JobSpec {
                shards: Some(2),
                broadcast: true,
                ..every_job("both", "g", 1000)
            },
            "shards: give either shards or broadcast, not both",
        ),
        (
            pb::JobSpec {
                route: pb::RoutePolicy::Label as i32,
                ..every_job("nolabels", "g", 1000)
            },
            "labels: route label needs 1 to 16 key=value pairs, got 0",
        ),
        (
            pb::JobSpec {
                labels: [("zone".to_string(), "eu".to_string())].into(),
                ..every_job("stray", "g", 1000)
            },
            "labels: a label selector needs route label, got route least-loaded",
        ),
    ];
    for (spec, want) in cases {
        let id = spec.id.clone();
        let err = create(&c, spec).await.expect_err(&id);
        assert_eq!(err.code(), Code::InvalidArgument, "{id}: {err:?}");
        assert_eq!(err.message(), want, "{id}");
    }
    let jobs = c
        .jobs(|mut j| async move { j.list_jobs(pb::ListJobsRequest::default()).await })
        .await
        .unwrap();
    assert!(jobs.jobs.is_empty(), "nothing created: {:?}", jobs.jobs);
    assert_eq!(
        applied_index(&c).await,
        before,
        "no log entry for bad input"
    );
}

fn hello(id: &str, groups: &[&str], capacity: u32) -> pb::Hello {
    pb::Hello {
        worker_id: id.into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
        capacity,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_hellos_are_refused_naming_the_field() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let addr = cluster.node(1).addr.clone();
    let bad_label = pb::Hello {
        labels: [("zone".to_string(), "eu west".to_string())].into(),
        ..hello("w", &["g"], 1)
    };
    let cases = [
        (
            hello("w", &["g"], 0),
            "hello.capacity: must be between 1 and 10000, got 0",
        ),
        (
            hello("w", &[], 1),
            "hello.groups: at least one group is required",
        ),
        (bad_label, "hello.labels (value): character ' ' not allowed"),
        (
            pb::Hello {
                stop_grace_ms: 60_001,
                ..hello("w", &["g"], 1)
            },
            "hello.stop_grace_ms: at most 60000, got 60001",
        ),
    ];
    for (h, want) in cases {
        let Err(err) = worker_session(&addr, h).await else {
            panic!("hello accepted; wanted {want:?}");
        };
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(
            err.message().starts_with(want),
            "{:?} vs {want:?}",
            err.message()
        );
    }
    assert_eq!(cluster.metric(1, "kairos_workers{group=\"g\"}"), None);
}

async fn next_msg(inbound: &mut Streaming<pb::ServerMessage>) -> In {
    let m = tokio::time::timeout(Duration::from_secs(30), inbound.message())
        .await
        .expect("a server message within 30 s")
        .expect("stream healthy")
        .expect("stream open");
    m.msg.expect("message body")
}

async fn finish_ack(
    tx: &mpsc::Sender<pb::WorkerMessage>,
    inbound: &mut Streaming<pb::ServerMessage>,
    f: pb::Finish,
) -> pb::FinishAck {
    tx.send(pb::WorkerMessage {
        msg: Some(Out::Finish(f)),
    })
    .await
    .unwrap();
    loop {
        if let In::FinishAck(a) = next_msg(inbound).await {
            return a;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_finishes_are_refused_in_the_ack_and_the_stream_stays_healthy() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    let (tx, mut inbound) = worker_session(&cluster.node(1).addr, hello("raw", &["fin"], 1))
        .await
        .unwrap();
    assert!(matches!(next_msg(&mut inbound).await, In::Welcome(_)));
    let spec = pb::JobSpec {
        schedule: Some(pb::Schedule {
            kind: Some(pb::schedule::Kind::AfterMs(100)),
        }),
        ..every_job("fin-job", "fin", 1)
    };
    create(&c, spec).await.unwrap();
    let In::Assignment(a) = next_msg(&mut inbound).await else {
        panic!("expected an assignment");
    };
    // The handover is recorded through the log; wait for it so the run's state is known.
    wait_for(
        "the assignment to be recorded",
        Duration::from_secs(30),
        || async {
            let r = c.list_runs("fin-job", 10).await.ok()?.into_iter().next()?;
            (r.state == pb::RunState::Running as i32).then_some(())
        },
    )
    .await;
    let finish = |run_id: &str, attempt: u32, result: Vec<u8>| pb::Finish {
        run_id: run_id.into(),
        attempt,
        success: true,
        result,
        ..Default::default()
    };
    let big = vec![b'x'; 512 * 1024 + 1];
    let cases = [
        (
            finish(&a.run_id, a.attempt, big),
            "finish.result: at most 524288 bytes, got 524289; pass a reference (an \
             object-storage path) to a bigger output"
                .to_string(),
        ),
        (
            finish("nope@123", 1, vec![]),
            "run nope@123 not found".to_string(),
        ),
        (
            finish(&a.run_id, 7, vec![]),
            format!(
                "run {} is at attempt 1 (running); attempt 7 is stale",
                a.run_id
            ),
        ),
    ];
    for (f, want) in cases {
        let ack = finish_ack(&tx, &mut inbound, f).await;
        assert!(!ack.accepted, "{ack:?}");
        assert_eq!(ack.error, want);
    }
    let run = c.list_runs("fin-job", 10).await.unwrap().remove(0);
    assert_eq!(
        (run.state, run.attempt),
        (pb::RunState::Running as i32, 1),
        "untouched: {run:?}"
    );
    assert!(run.result.is_empty(), "{run:?}");
    // The same stream still works: the real finish is accepted and committed.
    let ack = finish_ack(
        &tx,
        &mut inbound,
        finish(&a.run_id, a.attempt, b"ok".to_vec()),
    )
    .await;
    assert!(ack.accepted, "{ack:?}");
    wait_for("the run to succeed", Duration::from_secs(30), || async {
        let r = c.list_runs("fin-job", 10).await.ok()?.into_iter().next()?;
        (r.state == pb::RunState::Succeeded as i32 && r.result == b"ok").then_some(())
    })
    .await;
}
