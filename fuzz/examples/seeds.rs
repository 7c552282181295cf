//! Writes the checked-in seed corpus (`fuzz/corpus/<target>/seed-*`): a few
//! valid inputs per target, so the fuzzer starts from inputs that get past
//! the first decode. Run from the repository root:
//! `cargo +nightly run --manifest-path fuzz/Cargo.toml --example seeds`.

use std::collections::BTreeSet;
use std::path::Path;

use kairos_proto::v1 as pb;
use kairos_server::core::codec::encode;
use kairos_server::core::keys;
use kairos_server::core::{
    Bounds, Command, EntryKind, JobSpec, Labels, Policy, RunId, ScheduleInput, WheelKey,
};
use kairos_server::raft::{Entry, LogId, SnapshotMeta, TypeConfig, Vote};
use kairos_server::store::snapfile;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{CommittedLeaderId, EntryPayload, Membership, StoredMembership};
use prost::Message;

const NOW_MS: i64 = 1_700_000_000_000;

fn spec(id: &str, schedule: ScheduleInput) -> JobSpec {
    JobSpec {
        id: id.into(),
        schedule,
        group: "g".into(),
        payload: b"echo hi".to_vec(),
        policy: Policy::default(),
        bounds: Bounds::default(),
        labels: Labels::new(),
        workflow: None,
        max_concurrent: None,
        jitter: None,
        catch_up_max: None,
        also: Vec::new(),
    }
}

fn log_id(index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(2, 1), index)
}

fn entry(index: u64, cmd: Command) -> Entry {
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(cmd.into()),
    }
}

fn membership() -> Membership<u64, openraft::BasicNode> {
    Membership::new(vec![BTreeSet::from([1, 2, 3])], None)
}

fn histories() -> Vec<Vec<Command>> {
    let every = spec("every", ScheduleInput::Every { every_ms: 1000 });
    let cron = ScheduleInput::Cron {
        expr: "30 2 * * *".into(),
        tz: "America/New_York".into(),
    };
    let key = WheelKey {
        fire_at_ms: NOW_MS + 1000,
        kind: EntryKind::Occurrence,
        scheduled_at_ms: NOW_MS + 1000,
        shard: 0,
        job: "every".into(),
    };
    let run = RunId::new("every", NOW_MS + 1000);
    vec![
        vec![
            Command::CreateJob {
                spec: every.clone(),
                now_ms: NOW_MS,
            },
            Command::Fire {
                now_ms: NOW_MS + 1000,
                keys: vec![key],
                widths: vec![("g".into(), 2)],
            },
            Command::Assign {
                now_ms: NOW_MS + 1001,
                assignments: vec![(run.clone(), 1, "w1".into())],
            },
            Command::Expire {
                now_ms: NOW_MS + 70_000,
                expired: vec![(run.clone(), 1, 5)],
            },
            Command::RetryRun {
                run,
                now_ms: NOW_MS + 80_000,
            },
        ],
        vec![
            Command::CreateJob {
                spec: spec("cron", cron),
                now_ms: NOW_MS,
            },
            Command::pause_job("cron".into(), "deploy freeze".into(), NOW_MS + 1),
            Command::ResumeJob {
                id: "cron".into(),
                now_ms: NOW_MS + 2,
            },
            Command::TriggerJob {
                id: "cron".into(),
                now_ms: NOW_MS + 3,
                widths: vec![],
            },
            Command::DeleteJob {
                id: "cron".into(),
                now_ms: NOW_MS + 4,
            },
            Command::Housekeep {
                now_ms: NOW_MS + 5,
                max_deletes: 64,
            },
        ],
        vec![Command::Batch {
            commands: vec![
                Command::CreateJob {
                    spec: spec("once", ScheduleInput::After { after_ms: 5000 }),
                    now_ms: NOW_MS,
                },
                Command::UpdateJob {
                    spec: spec(
                        "once",
                        ScheduleInput::At {
                            at_ms: NOW_MS + 9000,
                        },
                    ),
                    expected_revision: 1,
                    now_ms: NOW_MS + 10,
                },
            ],
        }],
    ]
}

fn put(dir: &Path, target: &str, name: &str, bytes: &[u8]) {
    let dir = dir.join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
}

fn log_entry_seeds(out: &Path) {
    for (i, history) in histories().into_iter().enumerate() {
        put(out, "log_entry", &format!("history-{i}"), &encode(&history));
        let first = history.into_iter().next().unwrap();
        put(
            out,
            "log_entry",
            &format!("entry-{i}"),
            &encode(&entry(i as u64 + 1, first)),
        );
    }
    let member: Entry = Entry {
        log_id: log_id(9),
        payload: EntryPayload::Membership(membership()),
    };
    put(out, "log_entry", "membership", &encode(&member));
}

fn peer_message_seeds(out: &Path) {
    let vote = Vote::new_committed(2, 1);
    let entries: Vec<Entry> = histories()
        .remove(0)
        .into_iter()
        .enumerate()
        .map(|(i, c)| entry(i as u64 + 5, c))
        .collect();
    let append = AppendEntriesRequest::<TypeConfig> {
        vote,
        prev_log_id: Some(log_id(4)),
        entries,
        leader_commit: Some(log_id(4)),
    };
    put(out, "peer_message", "append", &encode(&append));
    let ask = VoteRequest::<u64> {
        vote: Vote::new(3, 2),
        last_log_id: Some(log_id(9)),
    };
    put(out, "peer_message", "vote", &encode(&ask));
    let snap = InstallSnapshotRequest::<TypeConfig> {
        vote,
        meta: snapshot_meta(),
        offset: 0,
        data: b"KAIROSNP".to_vec(),
        done: false,
    };
    put(out, "peer_message", "install-snapshot", &encode(&snap));
}

fn snapshot_meta() -> SnapshotMeta {
    SnapshotMeta {
        last_log_id: Some(log_id(7)),
        last_membership: StoredMembership::new(Some(log_id(1)), membership()),
        snapshot_id: "2-7".into(),
    }
}

fn snapshot_file_seeds(out: &Path) {
    let tmp = tempfile::tempdir().unwrap();
    let pairs: [&[(&[u8], &[u8])]; 2] = [
        &[],
        &[(b"mversion", b"\x07"), (b"jjob-1", b"spec"), (b"", b"")],
    ];
    for (i, pairs) in pairs.iter().enumerate() {
        let path = tmp.path().join("s");
        let mut w = snapfile::Writer::create(&path, keys::STATE_VERSION, &snapshot_meta()).unwrap();
        for (k, v) in pairs.iter() {
            w.pair(k, v).unwrap();
        }
        w.finish().unwrap();
        put(
            out,
            "snapshot_file",
            &format!("{i}"),
            &std::fs::read(&path).unwrap(),
        );
    }
}

fn text_seeds(out: &Path) {
    let crons = [
        "*/5 * * * *\nUTC\n1700000000000",
        "30 2 * * *\nAmerica/New_York\n1710054000000",
        "0 0 9 ? * MON-FRI *\nEurope/Berlin\n0",
        "0 12 L * *\nAsia/Kolkata",
        "@hourly\nAustralia/Lord_Howe\n-62135596800000",
        "0 0 29 2 1#5\nUTC",
    ];
    for (i, c) in crons.iter().enumerate() {
        put(out, "cron", &i.to_string(), c.as_bytes());
    }
    for (i, d) in ["200ms", "1h30m", "2d3h4m5s6ms", " 90s ", "0s"]
        .iter()
        .enumerate()
    {
        put(out, "duration", &i.to_string(), d.as_bytes());
    }
}

fn proto_spec_seeds(out: &Path) {
    use pb::schedule::Kind;
    let base = pb::JobSpec {
        id: "nightly".into(),
        schedule: Some(pb::Schedule {
            kind: Some(Kind::Cron(pb::Cron {
                expr: "0 3 * * *".into(),
                tz: "Europe/Paris".into(),
                dialect: String::new(),
            })),
        }),
        group: "batch".into(),
        payload: b"backup".to_vec(),
        ..Default::default()
    };
    let sharded = pb::JobSpec {
        id: "sharded".into(),
        schedule: Some(pb::Schedule {
            kind: Some(Kind::EveryMs(60_000)),
        }),
        shards: Some(4),
        max_attempts: 3,
        priority: 9,
        ..base.clone()
    };
    let labelled = pb::JobSpec {
        id: "labelled".into(),
        schedule: Some(pb::Schedule {
            kind: Some(Kind::AfterMs(5_000)),
        }),
        route: pb::RoutePolicy::Label as i32,
        labels: [("zone".to_string(), "a".to_string())].into(),
        ..base.clone()
    };
    for (name, s) in [("cron", base), ("sharded", sharded), ("labelled", labelled)] {
        put(out, "proto_spec", name, &s.encode_to_vec());
    }
}

fn main() {
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    log_entry_seeds(&out);
    peer_message_seeds(&out);
    snapshot_file_seeds(&out);
    text_seeds(&out);
    proto_spec_seeds(&out);
    println!("seeds written under {}", out.display());
}
