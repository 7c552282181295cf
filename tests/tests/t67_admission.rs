//! Admission control on a real 3-node cluster started with a tiny bound
//! (`--admit-max-commands 2`): a flood of concurrent creates, straight to
//! the leader and through a follower, gets some `RESOURCE_EXHAUSTED`
//! answers carrying a `retry-after-ms` hint; every call is answered, a
//! refused create wrote nothing, the leader keeps its term, and afterwards
//! the refused creates succeed. And the fire-lag bound: while the leader
//! holds due timers back (more are due than it lets into the log at once),
//! writes past the reserve are refused naming that bound, and admitted
//! again once it has caught up; timers held by a cluster-wide firing pause
//! do not count. And the write-age bound: while a client write in the log
//! cannot commit (both followers stall), later writes are refused at once
//! naming it, the reserve included, instead of joining the stuck queue.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use kairos_client::pb::{self, cluster_client::ClusterClient, jobs_client::JobsClient};
use kairos_client::RETRY_AFTER_HEADER;
use kairos_server::admission::{RETRY_AFTER_MAX_MS, RETRY_AFTER_MIN_MS};
use kairos_server::core::command::LOG_FORMAT;
use kairos_tests::{
    applied_index, create, every_job, job_ids, once_job, restart_with_failpoint, wait_for, Cluster,
};
use tonic::Code;

const FLOOD: usize = 300;
/// Channels the flood is spread over (HTTP/2 connections).
const CHANNELS: usize = 8;
/// Refused creates sent again after the flood.
const RETRIED: usize = 20;

/// The leader's id and term, as the leader reports them.
async fn leader_term(cluster: &Cluster) -> (u64, u64) {
    let s = cluster.client().status().await.expect("status");
    let l = s
        .nodes
        .iter()
        .find(|n| n.role == "leader")
        .expect("a leader");
    (l.id, l.term)
}

/// `FLOOD` concurrent creates to `addr` without any retry; returns each
/// job id with the raw answer.
async fn flood(addr: &str, prefix: &str) -> Vec<(String, Result<(), tonic::Status>)> {
    let channels: Vec<_> = (0..CHANNELS)
        .map(|_| kairos_client::channel(addr).expect("channel"))
        .collect();
    let calls = (0..FLOOD).map(|i| {
        let id = format!("{prefix}-{i}");
        let mut jobs = JobsClient::new(channels[i % CHANNELS].clone());
        let spec = every_job(&id, "adm", 60_000);
        async move {
            let req = pb::CreateJobRequest { spec: Some(spec) };
            (id, jobs.create_job(req).await.map(drop))
        }
    });
    join_all(calls).await
}

/// Every answer is a success or a refusal with a hint; returns the refused ids.
fn refused_ids(answers: &[(String, Result<(), tonic::Status>)]) -> Vec<String> {
    let mut refused = Vec::new();
    for (id, r) in answers {
        let Err(s) = r else { continue };
        assert_eq!(s.code(), Code::ResourceExhausted, "{id}: {s:?}");
        let hint: u64 = (s.metadata().get(RETRY_AFTER_HEADER))
            .unwrap_or_else(|| panic!("{id}: refusal without {RETRY_AFTER_HEADER}: {s:?}"))
            .to_str()
            .expect("ascii hint")
            .parse()
            .expect("a number of ms");
        assert!(
            (RETRY_AFTER_MIN_MS..=RETRY_AFTER_MAX_MS).contains(&hint),
            "{id}: hint {hint} ms"
        );
        assert!(s.message().contains("retry after"), "{id}: {}", s.message());
        assert!(
            s.message().contains("nothing was written"),
            "{id}: {}",
            s.message()
        );
        refused.push(id.clone());
    }
    refused
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_past_the_bound_is_refused_with_a_hint_and_nothing_else_changes() {
    let cluster = Cluster::start(3, &["--admit-max-commands", "2"]);
    let leader = cluster.wait_leader().await;
    let before = leader_term(&cluster).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    // The follower forwards once it has learned the leader's public address.
    let via_follower = cluster.client_of(follower);
    wait_for(
        "the follower to forward",
        Duration::from_secs(30),
        || async {
            let req = pb::JobRef { id: "none".into() };
            let got = via_follower
                .jobs(|mut j| {
                    let r = req.clone();
                    async move { j.get_job(r).await }
                })
                .await;
            (got.map(drop).unwrap_err().code() == Code::NotFound).then_some(())
        },
    )
    .await;

    let mut answers = flood(&cluster.node(leader).addr, "direct").await;
    answers.extend(flood(&cluster.node(follower).addr, "forwarded").await);
    assert_eq!(answers.len(), 2 * FLOOD, "every call is answered");
    let refused = refused_ids(&answers);
    let admitted = answers.len() - refused.len();
    assert!(!refused.is_empty(), "no refusal past a bound of 2");
    assert!(admitted > 0, "nothing admitted");
    assert!(
        refused.iter().any(|id| id.starts_with("forwarded")),
        "a refusal forwarded from the leader keeps its code and hint"
    );

    // A refused create wrote nothing; an admitted one was written once.
    let c = cluster.client();
    let listed: BTreeSet<String> = job_ids(&c, "").await;
    let written: BTreeSet<String> = (answers.iter())
        .filter(|(_, r)| r.is_ok())
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(listed, written, "the jobs are exactly the admitted creates");
    let counted = cluster.metric(leader, "kairos_refused_writes_total");
    assert!(counted >= Some(refused.len() as f64), "{counted:?}");

    // No election, and writes are admitted again once the flood is over.
    assert_eq!(
        leader_term(&cluster).await,
        before,
        "leader or term changed"
    );
    for id in refused.iter().take(RETRIED) {
        create(&c, every_job(id, "adm", 60_000))
            .await
            .unwrap_or_else(|e| panic!("{id} after the flood: {e:?}"));
    }
    assert_eq!(
        job_ids(&c, "").await.len(),
        written.len() + RETRIED.min(refused.len())
    );
    assert_eq!(
        leader_term(&cluster).await,
        before,
        "leader or term changed"
    );
}

/// `Client::create_jobs` keeps many creates in flight on one client; the
/// answers come back in the order of the specs, and a bad spec or an id that
/// exists fails alone, in its own place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_client_gets_every_answer_in_its_place() {
    const N: usize = 400;
    const BAD: usize = 137;
    const EXISTING: usize = 271;
    let cluster = Cluster::start(3, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    create(&c, every_job(&format!("p-{EXISTING}"), "pipe", 60_000))
        .await
        .expect("create the job that will exist");
    let specs: Vec<pb::JobSpec> = (0..N)
        .map(|i| {
            let mut spec = every_job(&format!("p-{i}"), "pipe", 60_000);
            if i == BAD {
                spec.group = "no spaces allowed".into();
            }
            spec
        })
        .collect();
    let answers = c.create_jobs(specs, 64).await;
    assert_eq!(answers.len(), N, "one answer per spec");
    for (i, answer) in answers.iter().enumerate() {
        match (i, answer) {
            (BAD, Err(s)) => {
                assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
                assert!(s.message().contains("group"), "{s:?}");
            }
            (EXISTING, Err(s)) => assert_eq!(s.code(), Code::AlreadyExists, "{s:?}"),
            (_, Ok(job)) => {
                let id = job.spec.as_ref().map(|s| s.id.as_str());
                assert_eq!(
                    id,
                    Some(format!("p-{i}").as_str()),
                    "answer {i} out of place"
                );
            }
            (_, Err(s)) => panic!("p-{i}: {s:?}"),
        }
    }
    let listed = job_ids(&c, "").await;
    assert_eq!(listed.len(), N - 1, "every spec but the bad one is a job");
    assert!(!listed.contains(&format!("p-{BAD}")));
}

/// Due one-shots released at once by a resume of firing: more than the
/// leader's fire allowance (10 proposals of 1,024 keys in flight).
const BURST: usize = 16_000;
/// Concurrent creates sent while the burst drains.
const PROBES: usize = 4;

async fn set_firing(c: &kairos_client::Client, paused: bool) {
    c.call(|ch| async move {
        let mut cluster = ClusterClient::new(ch);
        match paused {
            true => {
                let req = pb::PauseFiringRequest { note: "t67".into() };
                cluster.pause_firing(req).await
            }
            false => {
                cluster
                    .resume_firing(pb::ResumeFiringRequest::default())
                    .await
            }
        }
    })
    .await
    .expect("pause or resume firing");
}

/// Creates hourly jobs `late-N` straight to `addr`, without retries, on
/// `PROBES` channels until `stop`; returns each id with its answer.
async fn probe_creates(
    addr: String,
    stop: Arc<AtomicBool>,
) -> Vec<(String, Result<(), tonic::Status>)> {
    let each = (0..PROBES).map(|p| {
        let (addr, stop) = (addr.clone(), stop.clone());
        async move {
            let mut jobs = JobsClient::new(kairos_client::channel(&addr).expect("channel"));
            let mut answers = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let id = format!("late-{p}-{}", answers.len());
                let req = pb::CreateJobRequest {
                    spec: Some(every_job(&id, "late", 3_600_000)),
                };
                answers.push((id, jobs.create_job(req).await.map(drop)));
            }
            answers
        }
    });
    join_all(each).await.into_iter().flatten().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_get_only_the_reserve_while_due_timers_wait_and_a_firing_pause_is_not_lag() {
    let flags = ["--admit-max-fire-lag-ms", "1", "--admit-reserve", "0"];
    let cluster = Cluster::start(3, &flags);
    let leader = cluster.wait_leader().await;
    // Pausing firing needs log format 3: a fresh cluster raises it just after electing.
    cluster.wait_log_format(leader, LOG_FORMAT).await;
    let c = cluster.client();
    // Paused: the one-shots fall due and stay due, held by the pause.
    set_firing(&c, true).await;
    let specs: Vec<pb::JobSpec> = (0..BURST)
        .map(|i| once_job(&format!("burst-{i}"), "burst"))
        .collect();
    let made = c.create_jobs(specs, 16).await;
    assert!(made.iter().all(Result::is_ok), "every burst timer created");
    let due_by = (made.iter())
        .filter_map(|j| Some(j.as_ref().ok()?.next_fire_at_ms))
        .max()
        .expect("a due time");
    wait_for("the burst to fall due", Duration::from_secs(30), || async {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as i64;
        (now > due_by + 50).then_some(())
    })
    .await;
    // Overdue timers held by a pause are not work the cluster is behind on.
    create(&c, every_job("while-paused", "late", 3_600_000))
        .await
        .expect("a write while firing is paused with timers due");

    // Resumed: more keys are due than the leader lets in flight at once.
    let stop = Arc::new(AtomicBool::new(false));
    let probes = tokio::spawn(probe_creates(
        cluster.node(leader).addr.clone(),
        stop.clone(),
    ));
    set_firing(&c, false).await;
    let fired = r#"kairos_fires_total{group="burst"}"#;
    wait_for("the burst to fire", Duration::from_secs(120), || async {
        (cluster.metric(leader, fired) == Some(BURST as f64)).then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let answers = probes.await.expect("probes");
    let refused = refused_ids(&answers);
    let lagging = (answers.iter())
        .filter_map(|(_, r)| r.as_ref().err())
        .filter(|s| {
            s.message()
                .contains("ms the oldest due timer waits to fire")
        })
        .count();
    assert!(
        lagging > 0,
        "no write refused for the fire lag while {BURST} timers drained: {} answers, {} refused",
        answers.len(),
        refused.len()
    );

    // Refused writes wrote nothing; admitted ones are there; caught up, writes get in again.
    let admitted: BTreeSet<String> = (answers.iter())
        .filter(|(_, r)| r.is_ok())
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(job_ids(&c, "late-").await, admitted);
    assert_eq!(job_ids(&c, "burst-").await.len(), BURST);
    create(&c, every_job("after", "late", 3_600_000))
        .await
        .expect("a write once the burst has fired");
}

/// One create straight to `addr`, without the SDK's retries, given up
/// (unanswered: `None`) after `patience`.
async fn create_once(
    addr: &str,
    id: &str,
    patience: Duration,
) -> Option<Result<(), tonic::Status>> {
    let mut jobs = JobsClient::new(kairos_client::channel(addr).expect("channel"));
    let req = pb::CreateJobRequest {
        spec: Some(every_job(id, "age", 60_000)),
    };
    let call = jobs.create_job(req);
    tokio::time::timeout(patience, call)
        .await
        .ok()
        .map(|r| r.map(drop))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_a_write_in_the_log_cannot_commit_later_writes_are_refused_naming_its_age() {
    let mut cluster = Cluster::start(3, &["--admit-max-write-age-ms", "300"]);
    let leader = cluster.wait_leader().await;
    let c = cluster.client();
    create(&c, every_job("before", "age", 60_000))
        .await
        .expect("a write");
    // Both followers stop taking entries: from now on nothing commits.
    let stall = applied_index(&cluster).await;
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    for id in &followers {
        restart_with_failpoint(&mut cluster, *id, &format!("stall-log-after={stall}")).await;
    }
    let addr = cluster.node(leader).addr.clone();
    let stuck = {
        let addr = addr.clone();
        tokio::spawn(async move { create_once(&addr, "stuck", Duration::from_secs(600)).await })
    };
    wait_for("the write in the log", Duration::from_secs(30), || async {
        let last = cluster.metric(leader, "kairos_raft_last_log_index")?;
        let applied = cluster.metric(leader, "kairos_raft_applied_index")?;
        (last > applied).then_some(())
    })
    .await;
    // Later writes find it waiting: once it has waited past the bound they
    // are refused (a probe sent before that joins it, unanswered).
    let mut probes = 0;
    let refusal = wait_for(
        "a refusal for the write age",
        Duration::from_secs(60),
        || {
            probes += 1;
            let (addr, id) = (addr.clone(), format!("probe-{probes}"));
            async move {
                match create_once(&addr, &id, Duration::from_secs(2)).await? {
                    Err(s) if s.code() == Code::ResourceExhausted => Some((id, s)),
                    _ => None,
                }
            }
        },
    )
    .await;
    let (refused_id, status) = refusal;
    let age = "ms the oldest client write in the log waits for its answer";
    assert!(status.message().contains(age), "{status:?}");
    // Refused whatever the reserve (16, and one or two writes in flight).
    let hint = status.metadata().get(RETRY_AFTER_HEADER);
    assert!(hint.is_some(), "{status:?}");

    // The followers take entries again: the refused write wrote nothing,
    // and writes are admitted again. (The stuck one was answered with a
    // timeout after 5 s; its entry commits now.)
    for id in &followers {
        restart_with_failpoint(&mut cluster, *id, "").await;
    }
    create(&c, every_job("after", "age", 60_000))
        .await
        .expect("a write once unstuck");
    assert!(
        stuck.await.expect("task").is_some(),
        "the stuck write was answered"
    );
    let ids = job_ids(&c, "").await;
    assert!(ids.contains("stuck") && ids.contains("after"), "{ids:?}");
    assert!(!ids.contains(&refused_id), "{ids:?}");
}
