//! The watch stream (`Jobs.Watch`, `kairosctl watch`) on 3-node clusters:
//! a job's whole story in log order; every node streams the same events, so
//! a stream dropped on one node and resumed on another from the position
//! after its last event misses nothing and repeats nothing, also when the
//! node it was on is the leader and is killed; filters by job and group; a
//! position the ring no longer holds is refused as compacted, naming the
//! oldest index; a watcher that does not read is dropped with that error
//! while apply and the other watchers go on.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_client::worker::{Outcome, Task, Worker};
use kairos_client::{pb, Client, OLDEST_INDEX_HEADER};
use kairos_server::core::command::LOG_FORMAT;
use kairos_tests::{create, every_job, kairosctl_bin, once_job, wait_for, Cluster};
use pb::WatchEventKind as K;
use tonic::Code;

const WAIT: Duration = Duration::from_secs(60);

/// What a test compares of an event.
type Seen = (u64, u32, i32, String, String);

fn seen(e: &pb::WatchEvent) -> Seen {
    (e.index, e.seq, e.kind, e.job.clone(), e.run_id.clone())
}

/// A stream being read into `events` by a task, until it ends; its end
/// (an error, or none) lands in `end`.
struct Watcher {
    events: Arc<Mutex<Vec<pb::WatchEvent>>>,
    end: Arc<Mutex<Option<Option<tonic::Status>>>>,
    task: tokio::task::JoinHandle<()>,
}

fn request(from: Option<(u64, u32)>, jobs: &[&str], groups: &[&str]) -> pb::WatchRequest {
    pb::WatchRequest {
        from_index: from.map(|p| p.0),
        from_seq: from.map_or(0, |p| p.1),
        jobs: jobs.iter().map(|s| s.to_string()).collect(),
        groups: groups.iter().map(|s| s.to_string()).collect(),
    }
}

async fn open(
    c: &Client,
    addr: &str,
    req: pb::WatchRequest,
) -> Result<tonic::Streaming<pb::WatchEvent>, tonic::Status> {
    let mut jobs = pb::jobs_client::JobsClient::new(c.channel_to(addr)?);
    Ok(jobs.watch(req).await?.into_inner())
}

impl Watcher {
    async fn start(c: &Client, addr: &str, req: pb::WatchRequest) -> Watcher {
        let mut stream = open(c, addr, req).await.expect("watch opens");
        let events: Arc<Mutex<Vec<_>>> = Arc::default();
        let end: Arc<Mutex<Option<_>>> = Arc::default();
        let (into, ended) = (Arc::clone(&events), Arc::clone(&end));
        let task = tokio::spawn(async move {
            let last = loop {
                match stream.message().await {
                    Ok(Some(e)) => into.lock().unwrap().push(e),
                    Ok(None) => break None,
                    Err(s) => break Some(s),
                }
            };
            *ended.lock().unwrap() = Some(last);
        });
        Watcher { events, end, task }
    }

    fn events(&self) -> Vec<pb::WatchEvent> {
        self.events.lock().unwrap().clone()
    }

    /// Waits until the events satisfy `done`; returns them.
    async fn until(
        &self,
        what: &str,
        done: impl Fn(&[pb::WatchEvent]) -> bool,
    ) -> Vec<pb::WatchEvent> {
        wait_for(what, WAIT, || async {
            let ev = self.events();
            done(&ev).then_some(ev)
        })
        .await
    }

    async fn ended(&self) -> Option<tonic::Status> {
        wait_for("the stream to end", WAIT, || async {
            self.end.lock().unwrap().clone()
        })
        .await
    }

    fn stop(self) -> Vec<pb::WatchEvent> {
        self.task.abort();
        self.events()
    }
}

fn kinds(events: &[pb::WatchEvent]) -> Vec<K> {
    events
        .iter()
        .map(|e| K::try_from(e.kind).unwrap())
        .collect()
}

fn count(events: &[pb::WatchEvent], kind: K) -> usize {
    events.iter().filter(|e| e.kind == kind as i32).count()
}

fn assert_in_log_order(events: &[pb::WatchEvent]) {
    for w in events.windows(2) {
        assert!(
            (w[0].index, w[0].seq) < (w[1].index, w[1].seq),
            "out of order or repeated: {:?} then {:?}",
            w[0],
            w[1]
        );
    }
}

fn after(e: &pb::WatchEvent) -> Option<(u64, u32)> {
    Some((e.index, e.seq + 1))
}

async fn job_call(c: &Client, id: &str, what: &str) {
    let r = pb::JobRef { id: id.into() };
    let what = what.to_string();
    c.jobs(|mut j| {
        let (r, what) = (r.clone(), what.clone());
        async move {
            match what.as_str() {
                "pause" => j
                    .pause_job(pb::PauseJobRequest {
                        id: r.id,
                        ..Default::default()
                    })
                    .await
                    .map(|_| tonic::Response::new(())),
                "resume" => j.resume_job(r).await.map(|_| tonic::Response::new(())),
                _ => j.delete_job(r).await.map(|_| tonic::Response::new(())),
            }
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{what} {id}: {e}"));
}

fn succeeding_worker(endpoints: Vec<String>, group: &str) -> tokio::task::JoinHandle<()> {
    let w = Worker::connect(endpoints, group)
        .capacity(8)
        .id(format!("w-{group}"));
    tokio::spawn(async move {
        let _ = w
            .run(|_t: Task| async { Outcome::Success(Vec::new()) })
            .await;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_story_in_log_order_filtered_and_resumed_on_another_node_without_gap_or_repeat() {
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader().await;
    // A finish committed before its batched Assign shows the assignment
    // from log format 4 on: the story below needs it either way.
    cluster.wait_log_format(leader, LOG_FORMAT).await;
    let c = cluster.client();
    let (n1, n2, n3) = (
        cluster.node(1).addr.clone(),
        cluster.node(2).addr.clone(),
        cluster.node(3).addr.clone(),
    );
    let all = Watcher::start(&c, &n1, request(Some((0, 0)), &[], &[])).await;
    let of_j = Watcher::start(&c, &n2, request(Some((0, 0)), &["j"], &[])).await;
    let of_g2 = Watcher::start(&c, &n3, request(Some((0, 0)), &[], &["g2"])).await;
    let moving = Watcher::start(&c, &n2, request(Some((0, 0)), &[], &[])).await;
    let _worker = succeeding_worker(cluster.endpoints(), "g1");

    create(&c, once_job("j", "g1")).await.unwrap();
    create(&c, every_job("other", "g2", 3_600_000))
        .await
        .unwrap();
    of_j.until("j's run to finish", |e| count(e, K::RunFinished) == 1)
        .await;
    for call in ["pause", "resume", "delete"] {
        job_call(&c, "j", call).await;
    }
    let story = of_j
        .until("j's deletion", |e| count(e, K::JobDeleted) == 1)
        .await;
    assert_eq!(
        kinds(&story),
        vec![
            K::JobCreated,
            K::RunFired,
            K::RunAssigned,
            K::RunFinished,
            K::JobPaused,
            K::JobResumed,
            K::JobDeleted
        ]
    );
    assert_in_log_order(&story);
    let finished = &story[3];
    assert_eq!(
        (finished.outcome, finished.worker.as_str()),
        (pb::RunState::Succeeded as i32, "w-g1")
    );
    assert!(story.iter().all(|e| e.job == "j" && e.group == "g1"));
    let by_group = of_g2.until("other's creation", |e| !e.is_empty()).await;
    assert_eq!(
        by_group.iter().map(seen).collect::<Vec<_>>(),
        vec![(
            by_group[0].index,
            0,
            K::JobCreated as i32,
            "other".into(),
            String::new()
        )]
    );

    // Dropped on node 2 after j's deletion, changes made meanwhile, resumed on node 3.
    moving
        .until("j's deletion on node 2", |e| count(e, K::JobDeleted) == 1)
        .await;
    let before = moving.stop();
    for id in ["k1", "k2", "k3"] {
        create(&c, every_job(id, "g3", 3_600_000)).await.unwrap();
    }
    let resumed = Watcher::start(&c, &n3, request(after(before.last().unwrap()), &[], &[])).await;
    let rest = resumed
        .until("k3's creation on node 3", |e| {
            e.iter().any(|e| e.job == "k3")
        })
        .await;
    let joined: Vec<Seen> = before.iter().chain(&rest).map(seen).collect();
    let reference = all
        .until("k3 on node 1", |e| e.iter().any(|e| e.job == "k3"))
        .await;
    assert_eq!(
        joined,
        reference.iter().map(seen).collect::<Vec<_>>(),
        "node 2 then node 3 = node 1"
    );
    assert_in_log_order(&reference);

    // kairosctl prints the same story as JSON lines.
    let mut ctl = Command::new(kairosctl_bin())
        .args([
            "--endpoints",
            &n3,
            "--output",
            "json",
            "watch",
            "--job",
            "j",
            "--from-index",
            "0",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("kairosctl watch");
    let lines: Vec<serde_json::Value> = BufReader::new(ctl.stdout.take().unwrap())
        .lines()
        .take(story.len())
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    let _ = ctl.kill();
    let _ = ctl.wait();
    let printed: Vec<(u64, &str)> = lines
        .iter()
        .map(|v| (v["index"].as_u64().unwrap(), v["event"].as_str().unwrap()))
        .collect();
    let want = [
        "job_created",
        "run_fired",
        "run_assigned",
        "run_finished",
        "job_paused",
        "job_resumed",
        "job_deleted",
    ];
    assert_eq!(
        printed,
        story.iter().map(|e| e.index).zip(want).collect::<Vec<_>>()
    );
    assert_eq!(lines[3]["outcome"], "succeeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_mid_stream_the_stream_resumes_on_the_new_leader_without_gap_or_repeat()
{
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader().await;
    let c = cluster.client();
    let follower = cluster
        .nodes
        .iter()
        .map(|n| n.id)
        .find(|id| *id != leader)
        .unwrap();
    let reference = Watcher::start(
        &c,
        &cluster.node(follower).addr,
        request(Some((0, 0)), &[], &[]),
    )
    .await;
    let on_leader = Watcher::start(
        &c,
        &cluster.node(leader).addr,
        request(Some((0, 0)), &[], &[]),
    )
    .await;
    let _worker = succeeding_worker(cluster.endpoints(), "tick");
    create(&c, every_job("tick", "tick", 200)).await.unwrap();
    on_leader
        .until("5 finished runs on the leader", |e| {
            count(e, K::RunFinished) >= 5
        })
        .await;

    cluster.kill(leader);
    let status = on_leader
        .ended()
        .await
        .expect("the stream fails when its node dies");
    assert_ne!(status.code(), Code::OutOfRange, "{status:?}");
    let before = on_leader.stop();
    let new_leader = wait_for("a new leader", WAIT, || async {
        let s = c.status().await.ok()?;
        s.nodes
            .iter()
            .find(|n| n.role == "leader" && n.id != leader)
            .map(|n| n.id)
    })
    .await;
    let resumed = Watcher::start(
        &c,
        &cluster.node(new_leader).addr,
        request(after(before.last().unwrap()), &[], &[]),
    )
    .await;
    let rest = resumed
        .until("5 more finished runs", |e| count(e, K::RunFinished) >= 5)
        .await;
    let joined: Vec<Seen> = before.iter().chain(&rest).map(seen).collect();
    let reference = reference
        .until("the reference to catch up", |e| e.len() >= joined.len())
        .await;
    assert_eq!(
        joined,
        reference[..joined.len()]
            .iter()
            .map(seen)
            .collect::<Vec<_>>()
    );
    assert_in_log_order(&reference);
}

/// Jobs of 100 shards each in the slow-watcher test: 808 events against a
/// 128-event ring and a 256-event watcher queue.
const JOBS: usize = 8;

fn small_window_client(addr: &str) -> pb::jobs_client::JobsClient<tonic::transport::Channel> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .initial_stream_window_size(Some(1024))
        .initial_connection_window_size(Some(1024))
        .connect_lazy();
    pb::jobs_client::JobsClient::new(ch)
}

fn sharded(id: &str, shards: u32) -> pb::JobSpec {
    pb::JobSpec {
        shards: Some(shards),
        ..once_job(id, "nobody")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_positions_are_refused_naming_the_oldest_and_a_watcher_that_does_not_read_is_dropped(
) {
    let cluster = Cluster::start(3, &["--watch-events", "128"]);
    cluster.wait_leader().await;
    let c = cluster.client();
    let n2 = cluster.node(2).addr.clone();

    // Bad filters are refused, naming the field and the rule.
    let too_many: Vec<String> = (0..65).map(|i| format!("j{i}")).collect();
    let mut req = request(None, &[], &[]);
    req.jobs = too_many;
    let e = open(&c, &n2, req).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().starts_with("jobs: at most 64"), "{e:?}");
    let e = open(&c, &n2, request(None, &[], &["bad group!"]))
        .await
        .unwrap_err();
    assert!(e.message().starts_with("groups[0]:"), "{e:?}");

    // Not read: a 1 KiB HTTP/2 window, so the node's queue for it fills.
    let mut slow_client = small_window_client(&n2);
    let mut slow = slow_client
        .watch(request(None, &[], &[]))
        .await
        .unwrap()
        .into_inner();
    let fast = Watcher::start(&c, &n2, request(None, &[], &[])).await;
    // One fire of 100 runs at a time, read by the fast watcher before the next.
    for i in 0..JOBS {
        create(&c, sharded(&format!("wide{i}"), 100)).await.unwrap();
        let fires = 100 * (i + 1);
        fast.until(&format!("{fires} fires"), |e| {
            count(e, K::RunFired) == fires
        })
        .await;
    }
    let mut received = 0;
    let end = loop {
        match slow.message().await {
            Ok(Some(_)) => received += 1,
            Ok(None) => panic!("the slow stream ended without an error"),
            Err(s) => break s,
        }
    };
    assert!(received < JOBS * 101, "received {received}");
    assert_eq!(end.code(), Code::OutOfRange, "{end:?}");
    assert!(end.message().starts_with("compacted — re-list"), "{end:?}");

    // Index 0 is long gone from a 128-event ring: refused, naming the oldest held.
    let e = open(&c, &n2, request(Some((0, 0)), &[], &[]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    let oldest: u64 = e
        .metadata()
        .get(OLDEST_INDEX_HEADER)
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        oldest > 0 && e.message().contains(&format!("from log index {oldest} on")),
        "{e:?}"
    );
    let from_oldest = Watcher::start(&c, &n2, request(Some((oldest, 0)), &[], &[])).await;
    assert_eq!(
        cluster.metric(2, "kairos_watch_oldest_index"),
        Some(oldest as f64)
    );
    let last = format!("wide{}", JOBS - 1);
    let held = from_oldest
        .until("the held events", |e| e.iter().any(|e| e.job == last))
        .await;
    assert!(
        held[0].index >= oldest && held.len() <= 128,
        "{} events from {}",
        held.len(),
        held[0].index
    );
    // The slow stream and the refused calls gave their slots back.
    wait_for("2 watchers on node 2", WAIT, || async {
        (cluster.metric(2, "kairos_watchers") == Some(2.0)).then_some(())
    })
    .await;
    let out = Command::new(kairosctl_bin())
        .args(["--endpoints", &n2, "watch", "--from-index", "0"])
        .output()
        .expect("kairosctl watch");
    let (ok, out) = kairos_tests::outcome(&out);
    let want = format!("oldest index held: {oldest})");
    assert!(
        !ok && out.contains("compacted — re-list") && out.contains(&want),
        "{out}"
    );
}
