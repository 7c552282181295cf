//! A worker dies mid-run (its task is dropped: no finish, no heartbeat).
//! Also: connections whose other end vanished without closing them: a
//! silent worker is dropped by the leader, a client that answers no ping
//! is disconnected, and a worker whose leader connection goes dead
//! reconnects elsewhere.
//! Its attempt keeps its lease for `LEASE_MS` without a heartbeat, then it
//! is expired through the log and retried on another worker, which succeeds.

use std::time::{Duration, Instant};

use kairos_client::pb;
use kairos_client::worker::{Outcome, Task, Worker};
use kairos_server::grpc::workers::SESSION_SILENCE_MS;
use kairos_server::leader::dispatch::LEASE_MS;
use kairos_tests::{create, once_job, wait_for, worker_session, Cluster};
use tokio::sync::watch;

/// A one-shot due in 100 ms with `attempts` attempts 100 ms apart and a
/// deadline ten minutes away (only a lost worker can end an attempt early).
fn retried(id: &str, group: &str, attempts: u32) -> pb::JobSpec {
    pb::JobSpec {
        timeout_ms: 600_000,
        max_attempts: attempts,
        backoff_ms: 100,
        ..once_job(id, group)
    }
}

/// Waits until node 1 counts `n` workers in `group`.
async fn workers_become(cluster: &Cluster, group: &str, n: u32) {
    let metric = format!("kairos_workers{{group=\"{group}\"}}");
    wait_for(
        &format!("{n} workers in {group}"),
        Duration::from_secs(60),
        || async { (cluster.metric(1, &metric)? == f64::from(n)).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_worker_s_run_is_retried_elsewhere_after_the_lease() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    let doomed = Worker::connect(cluster.endpoints(), "die").id("doomed");
    let doomed = tokio::spawn(doomed.run(|_t: Task| async move {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Outcome::Success(Vec::new())
    }));
    // A deadline far away: only the missing heartbeat can end the attempt.
    let spec = retried("orphan", "die", 2);
    create(&c, spec).await.unwrap();
    let run_of = || async { c.list_runs("orphan", 1).await.ok()?.into_iter().next() };
    wait_for(
        "attempt 1 on the doomed worker",
        Duration::from_secs(60),
        || async {
            let r = run_of().await?;
            (r.worker == "doomed" && r.state == pb::RunState::Running as i32).then_some(())
        },
    )
    .await;
    let survivor = Worker::connect(cluster.endpoints(), "die").id("survivor");
    let survivor = tokio::spawn(survivor.run(|t: Task| async move {
        Outcome::Success(format!("attempt {}", t.attempt).into_bytes())
    }));
    workers_become(&cluster, "die", 2).await;
    doomed.abort();
    let killed = Instant::now();
    let run = wait_for(
        "the run to succeed elsewhere",
        Duration::from_secs(60),
        || async {
            let r = run_of().await?;
            (r.state == pb::RunState::Succeeded as i32).then_some(r)
        },
    )
    .await;
    assert_eq!(
        (run.attempt, run.worker.as_str()),
        (2, "survivor"),
        "{run:?}"
    );
    assert_eq!(run.result, b"attempt 2");
    // The last heartbeat came at most 1 s before the kill, so the lease
    // cannot have run out sooner than LEASE_MS - 1 s after it.
    let waited = killed.elapsed();
    assert!(
        waited >= Duration::from_millis(LEASE_MS as u64 - 1000),
        "retried after only {waited:?}"
    );
    survivor.abort();
}

/// A worker whose host vanishes without closing its connection (here: a
/// raw stream that says hello and then nothing, its connection open) is
/// dropped by the leader once it has been silent for `SESSION_SILENCE_MS`:
/// its stream ends with `UNAVAILABLE` saying why, it no longer counts as a
/// worker, and the attempt it was handed runs on a live worker instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_worker_s_stream_is_closed_and_its_attempt_runs_elsewhere() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    let hello = pb::Hello {
        worker_id: "mute".into(),
        groups: vec!["quiet".into()],
        capacity: 4,
        ..Default::default()
    };
    let (_keep_open, mut inbound) = worker_session(&cluster.node(1).addr, hello).await.unwrap();
    let opened = Instant::now();
    workers_become(&cluster, "quiet", 1).await;
    create(&c, retried("hushed", "quiet", 3)).await.unwrap();
    // The stream carries the welcome and the assignment, then ends.
    let mut assigned = false;
    let ended = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match inbound.message().await {
                Ok(Some(pb::ServerMessage {
                    msg: Some(pb::server_message::Msg::Assignment(a)),
                })) => assigned |= a.job == "hushed",
                Ok(Some(_)) => {}
                Ok(None) => return None,
                Err(s) => return Some(s),
            }
        }
    })
    .await
    .expect("the silent worker's stream was never closed");
    let closed_after = opened.elapsed();
    assert!(assigned, "the job's attempt never reached the mute worker");
    let status = ended.expect("the stream ended without saying why");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("nothing received"), "{status:?}");
    assert!(
        closed_after >= Duration::from_millis(SESSION_SILENCE_MS as u64 - 1000),
        "closed after only {closed_after:?}"
    );
    workers_become(&cluster, "quiet", 0).await;
    let live = Worker::connect(cluster.endpoints(), "quiet").id("live");
    let live = tokio::spawn(live.run(|_t: Task| async move { Outcome::Success(b"ran".to_vec()) }));
    let run = wait_for(
        "the run to succeed on the live worker",
        Duration::from_secs(60),
        || async {
            let r = c.list_runs("hushed", 1).await.ok()?.into_iter().next()?;
            (r.state == pb::RunState::Succeeded as i32).then_some(r)
        },
    )
    .await;
    assert_eq!(run.worker, "live", "{run:?}");
    assert!(run.attempt >= 2, "{run:?}");
    live.abort();
}

/// A client whose host vanished without closing its connection (here: a
/// raw HTTP/2 connection that sends its preface and settings, then never
/// reads or answers again) is disconnected by the public port's keepalive
/// pings, within their interval and timeout (15 s + 10 s), not after TCP's
/// many minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_answers_no_ping_is_disconnected() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let mut conn = tokio::net::TcpStream::connect(&cluster.node(1).addr)
        .await
        .unwrap();
    // The client preface, then an empty SETTINGS frame (length 0, type 4).
    conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let opened = Instant::now();
    let mut buf = vec![0u8; 4096];
    let closed = tokio::time::timeout(Duration::from_secs(90), async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {} // the server's settings and pings, unanswered
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the connection stayed open for 90 s");
    assert!(
        opened.elapsed() >= Duration::from_secs(20),
        "closed after only {:?}: not by the keepalive",
        opened.elapsed()
    );
}

/// A TCP relay to `upstream` that can be frozen: its connections stay open
/// but carry nothing more either way, and new ones are refused, which is
/// what a host that drops off the network looks like to both ends.
struct Relay {
    addr: String,
    frozen: watch::Sender<bool>,
}

impl Relay {
    async fn start(upstream: String) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (frozen, gate) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                if *gate.borrow() {
                    continue; // dropped: refused
                }
                let Ok(up) = tokio::net::TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (dr, dw) = down.into_split();
                let (ur, uw) = up.into_split();
                tokio::spawn(pump(dr, uw, gate.clone()));
                tokio::spawn(pump(ur, dw, gate.clone()));
            }
        });
        Relay { addr, frozen }
    }
}

/// Copies `from` to `to` until either closes; once `frozen`, carries
/// nothing more and keeps both halves open.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 << 10];
    loop {
        tokio::select! {
            biased;
            _ = async { drop(frozen.wait_for(|f| *f).await) } => break,
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if to.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            },
        }
    }
    std::future::pending::<()>().await;
}

/// A worker (the SDK) whose connection to the leader goes dead without
/// closing (the relay freezes) notices through its keepalive pings,
/// reconnects through its other endpoint and runs what is due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_leader_connection_goes_dead_reconnects_elsewhere() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    let direct = cluster.node(1).addr.clone();
    let relay = Relay::start(direct.clone()).await;
    // The relay first, so the worker's first session goes through it.
    let w = Worker::connect(vec![relay.addr.clone(), direct], "stranded").id("stranded");
    let w = tokio::spawn(w.run(|_t: Task| async move { Outcome::Success(b"ran".to_vec()) }));
    workers_become(&cluster, "stranded", 1).await;
    relay.frozen.send_replace(true);
    create(&c, retried("after-freeze", "stranded", 5))
        .await
        .unwrap();
    let run = wait_for("the run to succeed", Duration::from_secs(90), || async {
        let r = c
            .list_runs("after-freeze", 1)
            .await
            .ok()?
            .into_iter()
            .next()?;
        (r.state == pb::RunState::Succeeded as i32).then_some(r)
    })
    .await;
    assert_eq!(
        (run.worker.as_str(), run.result.as_slice()),
        ("stranded", &b"ran"[..])
    );
    w.abort();
}
