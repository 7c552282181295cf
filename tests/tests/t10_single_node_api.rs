//! API behaviour on a real single-node cluster: every bad input gets a
//! precise error naming the field and writes nothing; CAS, pause/resume,
//! trigger, previews and pagination work.

use kairos_client::pb;
use kairos_tests::{create, every_job, Cluster};
use tonic::Code;

fn with_schedule(id: &str, kind: pb::schedule::Kind) -> pb::JobSpec {
    pb::JobSpec {
        id: id.into(),
        schedule: Some(pb::Schedule { kind: Some(kind) }),
        group: "g".into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_the_field_named_and_writes_nothing() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    let before = cluster.status_digested(1).await.nodes[0].clone();
    use pb::schedule::Kind;
    let cases: Vec<(pb::JobSpec, Code, &str)> = vec![
        (
            with_schedule(
                "bad-cron",
                Kind::Cron(pb::Cron {
                    expr: "61 * * * *".into(),
                    tz: String::new(),
                    ..Default::default()
                }),
            ),
            Code::InvalidArgument,
            "schedule.cron",
        ),
        (
            with_schedule(
                "bad-fields",
                Kind::Cron(pb::Cron {
                    expr: "* * * *".into(),
                    tz: String::new(),
                    ..Default::default()
                }),
            ),
            Code::InvalidArgument,
            "expected 5, 6 or 7 fields",
        ),
        (
            with_schedule(
                "bad-tz",
                Kind::Cron(pb::Cron {
                    expr: "0 * * * *".into(),
                    tz: "Mars/Olympus".into(),
                    ..Default::default()
                }),
            ),
            Code::InvalidArgument,
            "Mars/Olympus",
        ),
        (
            with_schedule(
                "quartz-unnamed",
                Kind::Cron(pb::Cron {
                    expr: "0 15 10 ? * 6L".into(),
                    ..Default::default()
                }),
            ),
            Code::InvalidArgument,
            "schedule.cron.dialect: the expression has a '?' day field",
        ),
        (
            with_schedule(
                "bad-dialect",
                Kind::Cron(pb::Cron {
                    expr: "0 0 * * *".into(),
                    dialect: "spring".into(),
                    ..Default::default()
                }),
            ),
            Code::InvalidArgument,
            "schedule.cron.dialect: must be",
        ),
        (
            with_schedule(
                "quartz-no-question-mark",
                Kind::Cron(pb::Cron {
                    expr: "0 15 10 * * 6".into(),
                    dialect: "quartz".into(),
                    ..Default::default()
                }),
            ),
            Code::InvalidArgument,
            "exactly one of day-of-month and day-of-week must be '?'",
        ),
        (
            with_schedule("zero", Kind::EveryMs(0)),
            Code::InvalidArgument,
            "schedule.every",
        ),
        (
            with_schedule("past", Kind::AtMs(1_000_000)),
            Code::InvalidArgument,
            "schedule.at",
        ),
        (
            with_schedule("", Kind::EveryMs(1000)),
            Code::InvalidArgument,
            "id: must not be empty",
        ),
        (
            with_schedule(&"x".repeat(129), Kind::EveryMs(1000)),
            Code::InvalidArgument,
            "id: at most 128",
        ),
        (
            with_schedule("a@b", Kind::EveryMs(1000)),
            Code::InvalidArgument,
            "id: character '@'",
        ),
        (
            pb::JobSpec {
                payload: vec![0; 256 * 1024 + 1],
                ..every_job("big", "g", 1000)
            },
            Code::InvalidArgument,
            "payload: at most 262144",
        ),
        (
            pb::JobSpec {
                group: String::new(),
                ..every_job("nogroup", "g", 1000)
            },
            Code::InvalidArgument,
            "group: must not be empty",
        ),
        (
            pb::JobSpec {
                priority: 11,
                ..every_job("prio", "g", 1000)
            },
            Code::InvalidArgument,
            "priority",
        ),
        (
            pb::JobSpec {
                schedule: None,
                ..every_job("nosched", "g", 1000)
            },
            Code::InvalidArgument,
            "schedule: required",
        ),
    ];
    for (spec, code, needle) in cases {
        let id = spec.id.clone();
        let err = create(&c, spec)
            .await
            .expect_err(&format!("{id} must be refused"));
        assert_eq!(err.code(), code, "{id}: {}", err.message());
        assert!(
            err.message().contains(needle),
            "{id}: message {:?} lacks {needle:?}",
            err.message()
        );
    }
    // Duplicate create and unknown ids.
    create(&c, every_job("dup", "g", 60_000)).await.unwrap();
    let after_create = cluster.status_digested(1).await.nodes[0].clone();
    let err = create(&c, every_job("dup", "g", 60_000)).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    for call in ["get", "delete", "pause", "trigger"] {
        let r = pb::JobRef { id: "nope".into() };
        let err = match call {
            "get" => c
                .jobs(|mut j| {
                    let r = r.clone();
                    async move { j.get_job(r).await }
                })
                .await
                .map(|_| ()),
            "delete" => c
                .jobs(|mut j| {
                    let r = r.clone();
                    async move { j.delete_job(r).await }
                })
                .await
                .map(|_| ()),
            "pause" => c
                .jobs(|mut j| {
                    let r = r.clone();
                    async move {
                        j.pause_job(pb::PauseJobRequest {
                            id: r.id,
                            ..Default::default()
                        })
                        .await
                    }
                })
                .await
                .map(|_| ()),
            _ => c
                .jobs(|mut j| {
                    let r = r.clone();
                    async move { j.trigger_job(r).await }
                })
                .await
                .map(|_| ()),
        }
        .unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{call}: {}", err.message());
        assert!(err.message().contains("nope"), "{call}: {}", err.message());
    }
    // Refusals changed no state: only the one good create moved the digest.
    assert_ne!(before.state_digest, after_create.state_digest);
    let end = cluster.status_via(1).await.unwrap().nodes[0].clone();
    let list = c
        .jobs(|mut j| async move { j.list_jobs(pb::ListJobsRequest::default()).await })
        .await
        .unwrap();
    assert_eq!(list.jobs.len(), 1, "only the valid job exists");
    // Refused writes that reached the log changed nothing but last_applied; nothing else is stored.
    assert!(end.applied_index >= after_create.applied_index);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cas_pause_resume_trigger_preview_and_pages() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    let job = create(&c, every_job("j", "g", 3_600_000)).await.unwrap();
    assert_eq!(job.revision, 1);
    let upd = |rev| pb::UpdateJobRequest {
        spec: Some(pb::JobSpec {
            payload: b"v2".to_vec(),
            ..every_job("j", "g", 3_600_000)
        }),
        expected_revision: rev,
    };
    let err = c
        .jobs(|mut j| async move { j.update_job(upd(7)).await })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let j2 = c
        .jobs(|mut j| async move { j.update_job(upd(1)).await })
        .await
        .unwrap();
    assert_eq!(
        (j2.revision, j2.next_fire_at_ms),
        (2, job.next_fire_at_ms),
        "same schedule keeps the pending fire"
    );
    let r = pb::JobRef { id: "j".into() };
    let paused = c
        .jobs(|mut j| {
            let r = r.clone();
            async move {
                j.pause_job(pb::PauseJobRequest {
                    id: r.id,
                    ..Default::default()
                })
                .await
            }
        })
        .await
        .unwrap();
    assert!(paused.paused && paused.next_fire_at_ms == 0);
    let resumed = c
        .jobs(|mut j| {
            let r = r.clone();
            async move { j.resume_job(r).await }
        })
        .await
        .unwrap();
    assert!(!resumed.paused && resumed.next_fire_at_ms > 0);
    let run = c
        .jobs(|mut j| {
            let r = r.clone();
            async move { j.trigger_job(r).await }
        })
        .await
        .unwrap();
    assert_eq!(run.note, "manual trigger");
    let runs = c.list_runs("j", 10).await.unwrap();
    assert_eq!(runs.len(), 1);
    let preview = pb::NextFiresRequest {
        id: String::new(),
        schedule: Some(pb::Schedule {
            kind: Some(pb::schedule::Kind::Cron(pb::Cron {
                expr: "0 0 * * 5#3".into(),
                tz: "Europe/Berlin".into(),
                ..Default::default()
            })),
        }),
        count: 3,
    };
    let p = c
        .jobs(|mut j| {
            let r = preview.clone();
            async move { j.next_fires(r).await }
        })
        .await
        .unwrap();
    assert_eq!(p.fire_at_ms.len(), 3);
    assert!(p.fire_at_ms.windows(2).all(|w| w[0] < w[1]));

    // A Quartz job: stored with its dialect, fire times read as Quartz reads
    // them (6L = the last Friday, 10:15 UTC).
    let last_friday = with_schedule(
        "last-friday",
        pb::schedule::Kind::Cron(pb::Cron {
            expr: "0 15 10 ? * 6L".into(),
            dialect: "quartz".into(),
            ..Default::default()
        }),
    );
    let job = create(&c, last_friday).await.unwrap();
    let Some(pb::schedule::Kind::Cron(cron)) = job.spec.unwrap().schedule.unwrap().kind else {
        panic!("not a cron schedule");
    };
    assert_eq!(cron.dialect, "quartz");
    let next = chrono::DateTime::from_timestamp_millis(job.next_fire_at_ms).unwrap();
    use chrono::{Datelike, Timelike};
    assert_eq!(next.weekday(), chrono::Weekday::Fri, "{next}");
    assert!(
        next.day() + 7 > days_in_month(next.year(), next.month()),
        "{next}"
    );
    assert_eq!((next.hour(), next.minute()), (10, 15));
    for i in 0..25 {
        create(&c, every_job(&format!("p{i:02}"), "g", 3_600_000))
            .await
            .unwrap();
    }
    let mut ids = Vec::new();
    let mut token = String::new();
    loop {
        let req = pb::ListJobsRequest {
            page_size: 10,
            page_token: token.clone(),
            ..Default::default()
        };
        let page = c.list_jobs(req).await.unwrap();
        ids.extend(page.jobs.iter().map(|j| j.spec.clone().unwrap().id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(ids.len(), 27); // j, last-friday and p00..p24
    let err = c
        .jobs(|mut j| async move {
            j.list_jobs(pb::ListJobsRequest {
                page_size: 5000,
                ..Default::default()
            })
            .await
        })
        .await
        .unwrap_err();
    assert!(err.message().contains("page_size"));
}

fn days_in_month(year: i32, month: u32) -> u32 {
    use chrono::Datelike;
    let (y, m) = if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    };
    let first_next = chrono::NaiveDate::from_ymd_opt(y, m, 1).unwrap();
    first_next.pred_opt().unwrap().day()
}
