//! `Jobs.CreateJobs` on a real 3-node cluster: many creates in one call.
//! Each item is answered in order as a CreateJob of its own would be
//! (created, or ALREADY_EXISTS); a call through a follower is forwarded; a
//! bad item refuses the whole call, naming it, and creates nothing; an item
//! sent again with its request id (its own, or the call's with its index)
//! answers with the job it made instead of a second one. Under a tiny
//! admission bound some items are refused with a retry hint, wrote nothing,
//! and are created when sent again; the SDK's `create_job_batch` does that
//! sending again itself.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kairos_client::pb::{self, jobs_client::JobsClient};
use kairos_client::REQUEST_ID_HEADER;
use kairos_tests::{create, every_job, job_ids, once_job, wait_for, Cluster};
use tonic::Code;

fn item(spec: pb::JobSpec, request_id: &str) -> pb::CreateJobsItem {
    pb::CreateJobsItem {
        spec: Some(spec),
        request_id: request_id.into(),
    }
}

/// One raw `CreateJobs` call to `addr` (no SDK retries), with the call's
/// request id header if given.
async fn create_jobs(
    addr: &str,
    items: Vec<pb::CreateJobsItem>,
    call_id: Option<&str>,
) -> Result<Vec<pb::CreateJobsResult>, tonic::Status> {
    let mut c = JobsClient::new(kairos_client::channel(addr)?);
    let mut req = tonic::Request::new(pb::CreateJobsRequest { items });
    if let Some(id) = call_id {
        req.metadata_mut()
            .insert(REQUEST_ID_HEADER, id.parse().unwrap());
    }
    c.create_jobs(req).await.map(|r| r.into_inner().results)
}

fn code(r: &pb::CreateJobsResult) -> Code {
    Code::from_i32(r.code)
}

/// The call is refused INVALID_ARGUMENT with `needle` in its message.
async fn refused(addr: &str, items: Vec<pb::CreateJobsItem>, needle: &str) {
    let e = create_jobs(addr, items, None)
        .await
        .expect_err("an invalid batch was accepted");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains(needle), "{needle:?} not in {e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_creates_each_job_in_order_and_a_bad_item_creates_nothing() {
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader().await;
    let c = cluster.client();
    create(&c, every_job("b-taken", "none", 3_600_000))
        .await
        .unwrap();
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let via = cluster.node(follower).addr.clone();
    // The raw calls below do not retry: first the follower must know the
    // leader (a forwarded read answers once it does).
    wait_for(
        "the follower to forward",
        Duration::from_secs(30),
        || async {
            let mut j = JobsClient::new(kairos_client::channel(&via).ok()?);
            let req = pb::JobRef {
                id: "b-taken".into(),
            };
            j.get_job(req).await.ok().map(drop)
        },
    )
    .await;

    // Through a follower: 300 items, one of them a job that already exists.
    let mut items: Vec<_> = (0..300)
        .map(|i| item(every_job(&format!("b-{i:03}"), "none", 3_600_000), ""))
        .collect();
    items[150] = item(every_job("b-taken", "none", 60_000), "");
    items[299] = item(once_job("b-once", "none"), "");
    let results = create_jobs(&via, items, None).await.unwrap();
    assert_eq!(results.len(), 300);
    for (i, r) in results.iter().enumerate() {
        if i == 150 {
            assert_eq!(code(r), Code::AlreadyExists, "{r:?}");
            assert!(r.job.is_none() && r.message.contains("b-taken"), "{r:?}");
            continue;
        }
        let want = if i == 299 {
            "b-once".to_string()
        } else {
            format!("b-{i:03}")
        };
        let job = r.job.as_ref().unwrap_or_else(|| panic!("item {i}: {r:?}"));
        assert_eq!(
            (code(r), job.spec.as_ref().unwrap().id.clone()),
            (Code::Ok, want)
        );
        assert_eq!(job.revision, 1, "{job:?}");
    }
    let made = job_ids(&c, "b-").await;
    assert_eq!(made.len(), 300, "299 created and the one there before");
    // The existing job is untouched: still hourly.
    let taken = kairos_tests::get_job(&c, "b-taken").await;
    assert_eq!(taken.revision, 1);
    // A job made in a batch is scheduled like any other: the one-shot fires.
    wait_for("b-once to fire", Duration::from_secs(30), || async {
        let runs = c.list_runs("b-once", 10).await.ok()?;
        (runs.len() == 1).then_some(())
    })
    .await;

    // Bad input: the call is refused naming the item, and nothing is created.
    let good = |id: &str| item(every_job(id, "none", 60_000), "");
    let bad_schedule = every_job("x-1", "none", 0);
    let addr = cluster.node(leader).addr.clone();
    refused(
        &addr,
        vec![good("x-0"), item(bad_schedule, "")],
        "items[1].spec.schedule.every: must be between",
    )
    .await;
    refused(
        &addr,
        vec![good("x-0"), good("x-1"), good("x-0")],
        "items[2].spec.id",
    )
    .await;
    refused(
        &addr,
        vec![good("x-0"), pb::CreateJobsItem::default()],
        "items[1].spec: required",
    )
    .await;
    refused(
        &addr,
        vec![item(every_job("x-0", "none", 60_000), "bad id!")],
        "items[0].request_id",
    )
    .await;
    refused(
        &addr,
        vec![
            item(every_job("x-0", "none", 60_000), "r-1"),
            item(every_job("x-1", "none", 60_000), "r-1"),
        ],
        "items[1].request_id",
    )
    .await;
    refused(&addr, Vec::new(), "items: 1 to 1000 per call, got 0").await;
    let too_many = (0..1001).map(|i| good(&format!("x-{i}"))).collect();
    refused(&addr, too_many, "items: 1 to 1000 per call, got 1001").await;
    assert_eq!(
        job_ids(&c, "x-").await,
        BTreeSet::new(),
        "a refused batch created jobs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_sent_again_with_its_request_ids_answers_with_the_jobs_it_made() {
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader().await;
    let addr = cluster.node(leader).addr.clone();
    let c = cluster.client();

    // Items with ids of their own: sent again, each gets its first answer.
    let items: Vec<_> = (0..20)
        .map(|i| {
            item(
                every_job(&format!("own-{i}"), "none", 3_600_000),
                &format!("rid-{i}"),
            )
        })
        .collect();
    let first = create_jobs(&addr, items.clone(), None).await.unwrap();
    let again = create_jobs(&addr, items, None).await.unwrap();
    for (a, b) in first.iter().zip(&again) {
        assert_eq!(code(a), Code::Ok, "{a:?}");
        assert_eq!(code(b), Code::Ok, "sent again: {b:?}");
        let (a, b) = (a.job.as_ref().unwrap(), b.job.as_ref().unwrap());
        assert_eq!((a.created_at_ms, a.revision), (b.created_at_ms, b.revision));
    }
    // Without them, the same job ids are another request: ALREADY_EXISTS.
    let plain: Vec<_> = (0..20)
        .map(|i| item(every_job(&format!("own-{i}"), "none", 3_600_000), ""))
        .collect();
    let third = create_jobs(&addr, plain, None).await.unwrap();
    assert!(
        third.iter().all(|r| code(r) == Code::AlreadyExists),
        "{third:?}"
    );

    // Items without ids in a call with one: `<call id>-<index>`.
    let items: Vec<_> = (0..20)
        .map(|i| item(every_job(&format!("call-{i}"), "none", 3_600_000), ""))
        .collect();
    let first = create_jobs(&addr, items.clone(), Some("batch-77"))
        .await
        .unwrap();
    let again = create_jobs(&addr, items, Some("batch-77")).await.unwrap();
    assert!(
        first.iter().chain(&again).all(|r| code(r) == Code::Ok),
        "{again:?}"
    );
    assert_eq!(job_ids(&c, "call-").await.len(), 20);

    // The SDK: one result per spec, in order.
    let specs: Vec<_> = (0..50)
        .map(|i| every_job(&format!("sdk-{i:02}"), "none", 3_600_000))
        .collect();
    let mut with_taken = specs.clone();
    with_taken.push(every_job("own-0", "none", 3_600_000));
    let results = c.create_job_batch(with_taken).await.unwrap();
    assert_eq!(results.len(), 51);
    for (spec, r) in specs.iter().zip(&results) {
        let job = r.as_ref().unwrap();
        assert_eq!(job.spec.as_ref().unwrap().id, spec.id);
    }
    assert_eq!(
        results[50].as_ref().unwrap_err().code(),
        Code::AlreadyExists
    );
    assert_eq!(job_ids(&c, "sdk-").await.len(), 50);
    // Nothing to create is no call (the server refuses an empty one).
    assert!(c.create_job_batch(Vec::new()).await.unwrap().is_empty());

    // More than one call holds: 2,500 specs go in calls of 1,000 ...
    let many: Vec<_> = (0..2500)
        .map(|i| every_job(&format!("many-{i:04}"), "none", 3_600_000))
        .collect();
    let results = c.create_job_batch(many.clone()).await.unwrap();
    let ids: Vec<String> = (results.iter())
        .map(|r| r.as_ref().unwrap().spec.as_ref().unwrap().id.clone())
        .collect();
    let want: Vec<String> = many.iter().map(|s| s.id.clone()).collect();
    assert_eq!(ids, want);
    assert_eq!(job_ids(&c, "many-").await.len(), 2500);
    // ... and 4.7 MiB of payloads in calls under the 4 MiB message cap.
    let heavy: Vec<_> = (0..24)
        .map(|i| {
            let mut s = every_job(&format!("heavy-{i:02}"), "none", 3_600_000);
            s.payload = vec![b'x'; 200 * 1024];
            s
        })
        .collect();
    let results = c.create_job_batch(heavy).await.unwrap();
    let failed = results.iter().find(|r| r.is_err());
    assert!(failed.is_none(), "{failed:?}");
    assert_eq!(job_ids(&c, "heavy-").await.len(), 24);
    // A call refused whole ends the batch, naming its specs; those before stand.
    let mut bad: Vec<_> = (0..1500)
        .map(|i| every_job(&format!("part-{i:04}"), "none", 3_600_000))
        .collect();
    bad[1200] = every_job("part-1200", "none", 0);
    let e = c.create_job_batch(bad).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let want = "specs[1000..1500] of 1500: items[200].spec.schedule";
    assert!(e.message().starts_with(want), "{e:?}");
    assert_eq!(job_ids(&c, "part-").await.len(), 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_tiny_admission_bound_refused_items_write_nothing_and_are_created_when_sent_again()
{
    let cluster = Cluster::start(3, &["--admit-max-commands", "2"]);
    let leader = cluster.wait_leader().await;
    let addr = cluster.node(leader).addr.clone();
    let c = cluster.client();
    let ids: Vec<String> = (0..40).map(|i| format!("adm-{i:03}")).collect();
    let mut pending: Vec<pb::CreateJobsItem> = (ids.iter())
        .map(|id| item(every_job(id, "none", 3_600_000), &format!("r-{id}")))
        .collect();

    // One call: some items are admitted, the rest refused with a hint.
    let results = create_jobs(&addr, pending.clone(), None).await.unwrap();
    let created: BTreeSet<String> = (results.iter())
        .filter_map(|r| r.job.as_ref().map(|j| j.spec.as_ref().unwrap().id.clone()))
        .collect();
    let refused: Vec<_> = results
        .iter()
        .filter(|r| code(r) == Code::ResourceExhausted)
        .collect();
    assert!(
        !created.is_empty(),
        "nothing admitted: {:?}",
        results.first()
    );
    assert!(!refused.is_empty(), "nothing refused under a bound of 2");
    assert_eq!(created.len() + refused.len(), 40, "{results:?}");
    assert!(refused.iter().all(|r| r.retry_after_ms > 0), "{refused:?}");
    assert_eq!(
        job_ids(&c, "adm-").await,
        created,
        "a refused item wrote its job"
    );

    // Sent again with their request ids, after the hint each time, until
    // every item answers with its job (those created first included).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let results = create_jobs(&addr, pending.clone(), None).await.unwrap();
        let wait = results.iter().map(|r| r.retry_after_ms).max().unwrap_or(0);
        pending = (pending.into_iter().zip(&results))
            .filter(|(_, r)| code(r) != Code::Ok)
            .map(|(item, _)| item)
            .collect();
        if pending.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} items still refused",
            pending.len()
        );
        tokio::time::sleep(Duration::from_millis(wait.clamp(10, 1000))).await;
    }
    assert_eq!(job_ids(&c, "adm-").await.len(), 40);
}
