//! Property test of apply's totality: arbitrary sequences of commands, with
//! extreme integers, empty and oversized strings, unknown ids, every schedule
//! kind, cron expressions and zones, are applied to two in-memory replicas.
//! It checks that apply never panics (the dev profile has overflow checks
//! on), that a refused command writes nothing and has no effects, that a
//! batch gives what its commands give one by one, that state-machine time
//! never goes back, that the housekeeping indexes agree with the jobs and
//! runs, and that both replicas end with the same digest.
//!
//! Some steps are not fixed commands but ask the state for their target (fire
//! what is due, finish or expire an active attempt, retry a finished run),
//! the way the leader builds them, so sequences reach deep states. Both
//! replicas receive the one command built from the first replica's state.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use sha2::{Digest, Sha256};

use super::apply::state_time;
use super::codec::decode;
use super::schedule::MAX_EVERY_MS;
use super::*;

const T0: i64 = 1_700_000_000_000;
const TEN_YEARS_MS: u64 = 10 * 366 * 24 * 3600 * 1000;

/// One step of a generated history.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
enum Op {
    Raw(Command),
    FireDue {
        now_ms: i64,
        widths: Vec<(String, u32)>,
    },
    /// Finishes the `pick`-th active attempt (`attempt_delta` 0 is the live one).
    FinishActive {
        now_ms: i64,
        pick: usize,
        attempt_delta: u32,
        success: bool,
        retryable: bool,
        timed_out: bool,
        jitter_ms: u64,
        error: String,
    },
    ExpireActive {
        now_ms: i64,
        pick: usize,
        attempt_delta: u32,
        jitter_ms: u64,
    },
    AssignActive {
        now_ms: i64,
        pick: usize,
        worker: String,
    },
    RetryAny {
        now_ms: i64,
        pick: usize,
    },
}

// ------------------------------------------------------------------ strategies

fn time() -> impl Strategy<Value = i64> {
    prop_oneof![
        95 => (0i64..120_000).prop_map(|d| T0 + d),
        4 => (0i64..100_000_000).prop_map(|d| T0 + d),
        1 => prop_oneof![
            Just(i64::MIN),
            Just(-1i64),
            Just(0i64),
            Just(i64::MAX),
            Just(i64::MAX - 1000),
            any::<i64>(),
        ],
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("w1".to_string()),
        Just("é".repeat(limits::ERROR_MAX_BYTES)),
        Just("x".repeat(limits::ID_MAX_BYTES)),
        Just("x".repeat(limits::ID_MAX_BYTES + 1)),
        Just("a@b/s1#2".to_string()),
    ]
}

fn job_id() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop_oneof![Just("a"), Just("b"), Just("c")].prop_map(String::from),
        1 => text(),
    ]
}

fn group() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => Just("g".to_string()),
        1 => Just("h".to_string()),
        1 => text(),
    ]
}

fn run_id() -> impl Strategy<Value = RunId> {
    (
        job_id(),
        time(),
        prop_oneof![Just(0u32), Just(1), Just(u32::MAX)],
    )
        .prop_map(|(job, at, shard)| RunId::shard(&job, at, shard))
}

fn cron_expr() -> impl Strategy<Value = String> {
    let mut exprs: Vec<String> = [
        "* * * * *",
        "*/2 * * * * *",
        "30 2 * * *",
        "0 30 1,13 * * *",
        "@hourly",
        "@midnight",
        "@every",
        "0 0 29 2 *",
        "0 0 * * 1#5",
        "0 0 L * *",
        "1-5/2 * * * *",
        "0 0 */2 * 1",
        "0 0 1 1 * 2020",
        "0 0 30 2 *",
        "+0 * * * *",
        "not a cron",
        "",
        "é * * * *",
    ]
    .map(String::from)
    .to_vec();
    exprs.push("1".repeat(super::schedule::MAX_CRON_EXPR_BYTES + 1));
    prop::sample::select(exprs)
}

fn tz() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(""),
        Just("UTC"),
        Just("America/New_York"),
        Just("Europe/Berlin"),
        Just("Australia/Lord_Howe"),
        Just("Mars/Olympus"),
    ]
    .prop_map(String::from)
}

fn schedule() -> impl Strategy<Value = ScheduleInput> {
    let every = prop_oneof![
        Just(0u64),
        Just(1),
        Just(1000),
        Just(60_000),
        Just(MAX_EVERY_MS),
        Just(MAX_EVERY_MS + 1),
        Just(u64::MAX),
        1u64..10_000,
    ];
    let after = prop_oneof![Just(0u64), Just(1000), Just(TEN_YEARS_MS), Just(u64::MAX)];
    prop_oneof![
        (cron_expr(), tz()).prop_map(|(expr, tz)| ScheduleInput::Cron { expr, tz }),
        every.prop_map(|every_ms| ScheduleInput::Every { every_ms }),
        time().prop_map(|at_ms| ScheduleInput::At { at_ms }),
        after.prop_map(|after_ms| ScheduleInput::After { after_ms }),
    ]
}

fn policy() -> impl Strategy<Value = Policy> {
    let misfire = prop_oneof![
        Just(Misfire::FireAll),
        Just(Misfire::FireOnce),
        Just(Misfire::Skip)
    ];
    let overlap = prop_oneof![
        Just(Overlap::Allow),
        Just(Overlap::Forbid),
        Just(Overlap::BufferOne),
        Just(Overlap::Replace)
    ];
    let route = prop_oneof![
        Just(Route::LeastLoaded),
        Just(Route::RoundRobin),
        Just(Route::ConsistentHash),
        Just(Route::Label(Default::default())),
        Just(Route::Label([("zone".into(), "eu".into())].into())),
    ];
    let fanout = prop_oneof![
        4 => Just(Fanout::One),
        1 => prop_oneof![
            Just(Fanout::Shards(0)),
            Just(Fanout::Shards(3)),
            Just(Fanout::Shards(limits::SHARDS_MAX)),
            Just(Fanout::Shards(limits::SHARDS_MAX + 1)),
            Just(Fanout::Shards(u32::MAX)),
        ],
        1 => Just(Fanout::Broadcast),
    ];
    let grace = prop_oneof![Just(0u64), Just(1000), Just(TEN_YEARS_MS), Just(u64::MAX)];
    let timeout = prop_oneof![
        Just(0u64),
        Just(60_000),
        Just(limits::TIMEOUT_MAX_MS),
        Just(u64::MAX)
    ];
    let attempts = prop_oneof![
        Just(0u32),
        Just(1),
        Just(3),
        Just(limits::MAX_ATTEMPTS_MAX),
        Just(u32::MAX)
    ];
    let backoff = prop_oneof![
        Just(0u64),
        Just(1000),
        Just(limits::BACKOFF_MAX_MS),
        Just(u64::MAX)
    ];
    let priority = prop_oneof![4 => Just(5u8), 1 => any::<u8>()];
    let keep_runs = prop::sample::select(vec![
        0,
        1,
        3,
        limits::KEEP_RUNS_MAX,
        limits::KEEP_RUNS_MAX + 1,
        u64::MAX,
    ]);
    let keep_for = prop::sample::select(vec![
        0,
        1000,
        limits::KEEP_FOR_MAX_MS,
        limits::KEEP_FOR_MAX_MS + 1,
        u64::MAX,
    ]);
    (
        (misfire, grace, timeout, attempts, backoff),
        (priority, overlap, route, fanout),
        (keep_runs, keep_for),
    )
        .prop_map(
            |(
                (misfire, misfire_grace_ms, timeout_ms, max_attempts, backoff_ms),
                (priority, overlap, route, fanout),
                (keep_runs, keep_for_ms),
            )| Policy {
                misfire,
                misfire_grace_ms,
                timeout_ms,
                max_attempts,
                backoff_ms,
                priority,
                overlap,
                route,
                fanout,
                keep_runs,
                keep_for_ms,
            },
        )
}

/// Mostly specs that validate (so histories reach runs, retries and
/// overlaps), sometimes anything.
fn job_spec() -> BoxedStrategy<JobSpec> {
    let spec = prop_oneof![3 => sane_job_spec(), 1 => wild_job_spec()];
    (spec, bounds(), labels())
        .prop_map(|(spec, bounds, labels)| JobSpec {
            bounds,
            labels,
            ..spec
        })
        .boxed()
}

/// Mostly unbounded; else a start, an end and a run cap near the test's
/// times, or extreme ones.
fn bounds() -> impl Strategy<Value = Bounds> {
    let at = prop_oneof![3 => Just(None), 2 => time().prop_map(Some), 1 => Just(Some(i64::MIN)), 1 => Just(Some(i64::MAX))];
    let max_runs = prop_oneof![3 => Just(None), 2 => (1u64..4).prop_map(Some), 1 => Just(Some(0)), 1 => Just(Some(u64::MAX))];
    prop_oneof![
        8 => Just(Bounds::default()),
        1 => (at.clone(), at, max_runs).prop_map(|(start_at_ms, end_at_ms, max_runs)| Bounds {
            start_at_ms,
            end_at_ms,
            max_runs,
        }),
    ]
}

fn labels() -> impl Strategy<Value = Labels> {
    prop_oneof![
        4 => Just(Labels::new()),
        1 => prop::collection::btree_map(
            prop::sample::select(vec!["team", "example.com/tier", "-bad", ""]).prop_map(String::from),
            text(),
            0..3,
        ),
    ]
}

fn sane_job_spec() -> impl Strategy<Value = JobSpec> {
    let schedule = prop_oneof![
        3 => (500u64..30_000).prop_map(|every_ms| ScheduleInput::Every { every_ms }),
        1 => prop::sample::select(vec!["*/2 * * * * *", "* * * * *", "*/5 * * * * *", "@hourly"])
            .prop_map(|e| ScheduleInput::Cron { expr: e.into(), tz: "Europe/Berlin".into() }),
        1 => (0i64..60_000).prop_map(|d| ScheduleInput::At { at_ms: T0 + d }),
        1 => (0u64..60_000).prop_map(|after_ms| ScheduleInput::After { after_ms }),
    ];
    let misfire = prop_oneof![
        Just(Misfire::FireAll),
        Just(Misfire::FireOnce),
        Just(Misfire::Skip)
    ];
    let overlap = prop_oneof![
        Just(Overlap::Allow),
        Just(Overlap::Forbid),
        Just(Overlap::BufferOne),
        Just(Overlap::Replace)
    ];
    let fanout = prop_oneof![4 => Just(Fanout::One), 1 => Just(Fanout::Shards(3)), 1 => Just(Fanout::Broadcast)];
    (
        prop::sample::select(vec!["a", "b", "c"]),
        schedule,
        (
            misfire,
            prop::sample::select(vec![0u64, 1000, 60_000]),
            1u32..4,
        ),
        (prop::sample::select(vec![0u64, 1000]), overlap, fanout),
        (
            prop::sample::select(vec![1u64, 2, limits::KEEP_RUNS_DEFAULT]),
            prop::sample::select(vec![0u64, 1000, 60_000]),
        ),
    )
        .prop_map(
            |(
                id,
                schedule,
                (misfire, misfire_grace_ms, max_attempts),
                (backoff_ms, overlap, fanout),
                (keep_runs, keep_for_ms),
            )| {
                let overlap = match (fanout, overlap) {
                    (Fanout::Broadcast, Overlap::BufferOne) => Overlap::Allow,
                    (_, o) => o,
                };
                JobSpec {
                    id: id.into(),
                    schedule,
                    group: "g".into(),
                    payload: b"p".to_vec(),
                    policy: Policy {
                        misfire,
                        misfire_grace_ms,
                        max_attempts,
                        backoff_ms,
                        overlap,
                        fanout,
                        keep_runs,
                        keep_for_ms,
                        ..Policy::default()
                    },
                    bounds: Bounds::default(),
                    labels: Labels::new(),
                    workflow: None,
                    max_concurrent: None,
                    // Derived, not drawn, so the fixed-seed stream (and the
                    // depth `run_histories` checks) stays as it was.
                    jitter: (id == "c").then_some(Jitter {
                        ms: 400,
                        seed: keep_for_ms ^ backoff_ms,
                    }),
                    catch_up_max: None,
                    also: Vec::new(),
                }
            },
        )
}

fn wild_job_spec() -> impl Strategy<Value = JobSpec> {
    let payload = prop_oneof![
        8 => Just(Vec::new()),
        1 => Just(vec![7u8; limits::PAYLOAD_MAX_BYTES]),
        1 => Just(vec![7u8; limits::PAYLOAD_MAX_BYTES + 1]),
    ];
    (job_id(), schedule(), group(), payload, policy()).prop_map(
        |(id, schedule, group, payload, policy)| {
            // Derived, not drawn, as in `sane_job_spec`.
            let jitter = (id == "b").then(|| Jitter {
                ms: [0, 1, limits::JITTER_MAX_MS + 1, u64::MAX][usize::from(policy.priority) % 4],
                seed: policy.backoff_ms,
            });
            JobSpec {
                id,
                schedule,
                group,
                payload,
                policy,
                bounds: Bounds::default(),
                labels: Labels::new(),
                workflow: None,
                max_concurrent: None,
                jitter,
                catch_up_max: None,
                also: Vec::new(),
            }
        },
    )
}

fn widths() -> impl Strategy<Value = Vec<(String, u32)>> {
    prop::collection::vec(
        (group(), prop_oneof![Just(0u32), Just(2), Just(u32::MAX)]),
        0..3,
    )
}

fn wheel_key() -> impl Strategy<Value = WheelKey> {
    (run_id(), time(), any::<bool>()).prop_map(|(id, at, occurrence)| {
        if occurrence {
            WheelKey::occurrence(&id.job, at)
        } else {
            WheelKey::retry(&id, at)
        }
    })
}

fn finish_report() -> impl Strategy<Value = FinishReport> {
    let result = prop_oneof![
        8 => Just(Vec::new()),
        1 => Just(vec![1u8; limits::RESULT_MAX_BYTES + 1]),
    ];
    (
        run_id(),
        any::<u32>(),
        any::<[bool; 3]>(),
        result,
        text(),
        any::<u64>(),
        time(),
    )
        .prop_map(
            |(run, attempt, [success, retryable, timed_out], result, error, jitter_ms, at)| {
                FinishReport {
                    run,
                    attempt,
                    success,
                    result,
                    error: error.clone(),
                    retryable,
                    worker: error,
                    received_at_ms: at,
                    jitter_ms,
                    timed_out,
                }
            },
        )
}

/// A single command of any kind but a batch, with arbitrary arguments.
fn raw_command() -> BoxedStrategy<Command> {
    prop_oneof![
        4 => (job_spec(), time()).prop_map(|(spec, now_ms)| Command::create_job(spec, now_ms)),
        2 => (job_spec(), prop_oneof![Just(0u64), Just(1), Just(2), Just(u64::MAX)], time())
            .prop_map(|(spec, expected_revision, now_ms)| Command::update_job(spec, expected_revision, now_ms)),
        1 => (job_id(), time()).prop_map(|(id, now_ms)| Command::DeleteJob { id, now_ms }),
        1 => (job_id(), text(), time()).prop_map(|(id, note, now_ms)| Command::pause_job(id, note, now_ms)),
        1 => (job_id(), time()).prop_map(|(id, now_ms)| Command::ResumeJob { id, now_ms }),
        2 => (job_id(), time(), widths())
            .prop_map(|(id, now_ms, widths)| Command::TriggerJob { id, now_ms, widths }),
        1 => (time(), prop::collection::vec(wheel_key(), 0..3), widths())
            .prop_map(|(now_ms, keys, widths)| Command::Fire { now_ms, keys, widths }),
        1 => (time(), prop::collection::vec((run_id(), any::<u32>(), text()), 0..3))
            .prop_map(|(now_ms, assignments)| Command::Assign { now_ms, assignments }),
        1 => (time(), prop::collection::vec(finish_report(), 0..3))
            .prop_map(|(now_ms, reports)| Command::Finish { now_ms, reports }),
        1 => (time(), prop::collection::vec((run_id(), any::<u32>(), any::<u64>()), 0..3))
            .prop_map(|(now_ms, expired)| Command::Expire { now_ms, expired }),
        1 => (run_id(), time()).prop_map(|(run, now_ms)| Command::RetryRun { run, now_ms }),
        2 => (time(), prop::sample::select(vec![0, 1, 3, limits::HOUSEKEEP_DELETES_MAX, u32::MAX]))
            .prop_map(|(now_ms, max_deletes)| Command::Housekeep { now_ms, max_deletes }),
    ]
    .boxed()
}

/// The cluster-wide firing switch, resumed more often than paused: a
/// history paused for good would fire nothing after the pause.
fn firing_switch() -> impl Strategy<Value = Command> {
    prop_oneof![
        1 => (text(), time()).prop_map(|(note, now_ms)| Command::PauseFiring { note, now_ms }),
        4 => time().prop_map(|now_ms| Command::ResumeFiring { now_ms }),
        // Paused around one command: a fire or trigger in between is refused.
        4 => (text(), raw_command(), time()).prop_map(|(note, cmd, now_ms)| Command::Batch {
            commands: vec![
                Command::PauseFiring { note, now_ms },
                cmd,
                Command::ResumeFiring { now_ms },
            ],
        }),
    ]
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        1 => firing_switch(),
        10 => raw_command(),
        1 => prop::collection::vec(raw_command(), 0..5)
            .prop_map(|commands| Command::Batch { commands }),
        1 => Just(Command::Batch {
            commands: vec![Command::Batch { commands: vec![] }],
        }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let delta = prop_oneof![6 => Just(0u32), 1 => Just(1), 1 => Just(u32::MAX)];
    prop_oneof![
        5 => command().prop_map(Op::Raw),
        4 => (time(), widths()).prop_map(|(now_ms, widths)| Op::FireDue { now_ms, widths }),
        3 => (time(), any::<usize>(), delta.clone(), any::<[bool; 3]>(), any::<u64>(), text())
            .prop_map(|(now_ms, pick, attempt_delta, [success, retryable, timed_out], jitter_ms, error)| {
                Op::FinishActive { now_ms, pick, attempt_delta, success, retryable, timed_out, jitter_ms, error }
            }),
        1 => (time(), any::<usize>(), delta, any::<u64>()).prop_map(
            |(now_ms, pick, attempt_delta, jitter_ms)| Op::ExpireActive { now_ms, pick, attempt_delta, jitter_ms }
        ),
        1 => (time(), any::<usize>(), text())
            .prop_map(|(now_ms, pick, worker)| Op::AssignActive { now_ms, pick, worker }),
        1 => (time(), any::<usize>()).prop_map(|(now_ms, pick)| Op::RetryAny { now_ms, pick }),
    ]
}

/// Backfills of a recent range (most are taken), and their cancels.
fn backfill() -> impl Strategy<Value = Command> {
    let overlap = prop::sample::select(BackfillOverlap::ALL.to_vec());
    let start = (job_id(), time(), 0i64..30_000, 0i64..60_000, overlap).prop_map(
        |(id, now_ms, ago_ms, len_ms, overlap)| {
            let to_ms = now_ms.saturating_sub(ago_ms);
            Command::StartBackfill {
                id,
                from_ms: to_ms.saturating_sub(len_ms),
                to_ms,
                overlap,
                now_ms,
            }
        },
    );
    let cancel = (job_id(), time()).prop_map(|(id, now_ms)| Command::CancelBackfill { id, now_ms });
    prop_oneof![3 => start, 1 => cancel]
}

// ------------------------------------------------------------------ replica

/// SHA-256 over every pair, framed as `StateMachine::digest` frames them.
fn digest(view: &MemView) -> Vec<u8> {
    let mut h = Sha256::new();
    for (k, v) in &view.map {
        h.update((k.len() as u64).to_be_bytes());
        h.update(k);
        h.update((v.len() as u64).to_be_bytes());
        h.update(v);
    }
    h.finalize().to_vec()
}

fn rows(view: &MemView, space: u8) -> Vec<(Vec<u8>, Vec<u8>)> {
    view.range(&[space], &[space + 1], usize::MAX)
}

/// The `pick`-th run (of the active table, or of all runs), with its record.
fn pick_run(view: &MemView, space: u8, pick: usize) -> Option<Run> {
    let rows = rows(view, space);
    let (k, _) = rows.get(pick % rows.len().max(1))?;
    let id = keys::run_id_from(k)?;
    view.get(&keys::run(&id)).map(|b| decode(&b).unwrap())
}

/// The command an op stands for, built from the state as the leader would.
fn concrete(view: &MemView, op: Op) -> Command {
    match op {
        Op::Raw(c) => c,
        Op::FireDue { now_ms, widths } => {
            let due = view.range(
                &[keys::WHEEL],
                &keys::wheel_upto(now_ms),
                limits::FIRE_BATCH_MAX,
            );
            let keys = due
                .iter()
                .filter_map(|(k, _)| keys::wheel_from(k))
                .collect();
            Command::Fire {
                now_ms,
                keys,
                widths,
            }
        }
        Op::FinishActive {
            now_ms,
            pick,
            attempt_delta,
            success,
            retryable,
            timed_out,
            jitter_ms,
            error,
        } => {
            let Some(run) = pick_run(view, keys::ACTIVE, pick) else {
                return Command::Finish {
                    now_ms,
                    reports: vec![],
                };
            };
            Command::Finish {
                now_ms,
                reports: vec![FinishReport {
                    run: run.id,
                    attempt: run.attempt.wrapping_add(attempt_delta),
                    success,
                    result: b"r".to_vec(),
                    error,
                    retryable,
                    worker: "w1".into(),
                    received_at_ms: now_ms,
                    jitter_ms,
                    timed_out,
                }],
            }
        }
        Op::ExpireActive {
            now_ms,
            pick,
            attempt_delta,
            jitter_ms,
        } => Command::Expire {
            now_ms,
            expired: pick_run(view, keys::ACTIVE, pick)
                .map(|r| (r.id, r.attempt.wrapping_add(attempt_delta), jitter_ms))
                .into_iter()
                .collect(),
        },
        Op::AssignActive {
            now_ms,
            pick,
            worker,
        } => Command::Assign {
            now_ms,
            assignments: pick_run(view, keys::ACTIVE, pick)
                .map(|r| (r.id, r.attempt, worker))
                .into_iter()
                .collect(),
        },
        Op::RetryAny { now_ms, pick } => match pick_run(view, keys::RUN, pick) {
            Some(r) => Command::RetryRun { run: r.id, now_ms },
            None => Command::RetryRun {
                run: RunId::new("a", now_ms),
                now_ms,
            },
        },
    }
}

/// Applies `cmd` to `view` and checks the per-command properties.
fn step(view: &mut MemView, cmd: &Command) -> Result<Applied, TestCaseError> {
    let before = state_time(view);
    let a = apply(view, cmd);
    if let Response::Error(e) = &a.response {
        prop_assert!(
            a.writes.is_empty(),
            "refused ({e}) but wrote {:?}",
            a.writes
        );
        prop_assert!(a.effects.is_empty(), "refused ({e}) but had effects");
    }
    if let (Command::Batch { commands }, Response::Many(responses)) = (cmd, &a.response) {
        // One by one over a copy: the same responses and the same state.
        let mut alone = view.clone();
        for (c, r) in commands.iter().zip(responses) {
            let one = apply(&alone, c);
            prop_assert_eq!(&one.response, r);
            alone.write(&one.writes);
        }
        prop_assert_eq!(responses.len(), commands.len());
        let mut batched = view.clone();
        batched.write(&a.writes);
        prop_assert!(
            alone == batched,
            "a batch must equal its commands one by one"
        );
    }
    view.write(&a.writes);
    prop_assert!(state_time(view) >= before, "state time went back");
    Ok(a)
}

/// The housekeeping indexes agree with the jobs and runs: a job's
/// `retention_due_ms` is its one `RETENTION_DUE` entry, its `history_len`
/// counts its run records, and every run record belongs to a job or to a
/// deleted job (not created again) whose runs housekeeping still removes.
fn check_housekeeping_indexes(view: &MemView) -> Result<(), TestCaseError> {
    let jobs: BTreeMap<String, Job> = rows(view, keys::JOB)
        .iter()
        .map(|(_, v)| Job::from_record(v).unwrap())
        .map(|j| (j.id.clone(), j))
        .collect();
    let entries: BTreeSet<(i64, String)> = rows(view, keys::RETENTION_DUE)
        .iter()
        .map(|(k, _)| {
            let at = keys::time_from(&k[1..]).unwrap();
            (at, keys::retention_job_from(k).unwrap().to_string())
        })
        .collect();
    let wanted: BTreeSet<(i64, String)> = jobs
        .values()
        .filter_map(|j| Some((j.retention_due_ms?, j.id.clone())))
        .collect();
    prop_assert_eq!(entries, wanted);
    let deleted: BTreeSet<String> = rows(view, keys::DELETED_JOB)
        .iter()
        .map(|(k, _)| keys::deleted_job_from(k).unwrap().to_string())
        .collect();
    let mut records: BTreeMap<String, u64> = BTreeMap::new();
    for (k, _) in rows(view, keys::RUN) {
        *records
            .entry(keys::run_id_from(&k).unwrap().job)
            .or_default() += 1;
    }
    for (id, job) in &jobs {
        let n = records.get(id).copied().unwrap_or(0);
        prop_assert_eq!(job.history_len, n, "history_len of job {}", id);
        prop_assert!(!deleted.contains(id), "job {} is live and deleted", id);
    }
    for id in records.keys().filter(|id| !jobs.contains_key(*id)) {
        prop_assert!(deleted.contains(id), "runs of {} belong to no job", id);
    }
    Ok(())
}

/// What the generated histories reached, so a generator that only produces
/// refusals fails the test instead of passing it vacuously.
#[derive(Debug, Default)]
struct Reached {
    accepted: u64,
    refused: u64,
    jobs_created: u64,
    runs_started: u64,
    attempts_ended: u64,
    retries_scheduled: u64,
    housekept_runs: u64,
    /// Occurrences a backfill started.
    backfilled: u64,
}

impl Reached {
    fn count(&mut self, cmd: &Command, a: &Applied) {
        match &a.response {
            Response::Error(_) => self.refused += 1,
            _ => self.accepted += 1,
        }
        if matches!(cmd, Command::CreateJob { .. }) && matches!(a.response, Response::Job(_)) {
            self.jobs_created += 1;
        }
        if let Response::Housekept { removed } = a.response {
            self.housekept_runs += u64::from(removed);
        }
        for e in &a.effects {
            match e {
                Effect::Ready(r) if r.attempt == 1 => self.runs_started += 1,
                Effect::Ended { .. } => self.attempts_ended += 1,
                Effect::Backfilled(_) => self.backfilled += 1,
                Effect::Scheduled(k) if k.kind == EntryKind::Retry => self.retries_scheduled += 1,
                _ => {}
            }
        }
    }
}

fn check_history(ops: Vec<Op>, reached: &mut Reached) -> Result<(), TestCaseError> {
    let (mut one, mut two) = (MemView::default(), MemView::default());
    for op in ops {
        let cmd = concrete(&one, op);
        let a = step(&mut one, &cmd)?;
        let b = step(&mut two, &cmd)?;
        reached.count(&cmd, &a);
        prop_assert_eq!(a, b, "replicas diverged on {:?}", cmd);
        check_housekeeping_indexes(&one)?;
    }
    prop_assert_eq!(digest(&one), digest(&two));
    Ok(())
}

/// Histories of backfills over sane jobs: fires (their steps among the
/// due keys), assignments and finishes in between, in format 4 or not, and now and then one with arbitrary
/// times (which may move state time out of the others' reach). Kept apart from
/// `op()`, whose fixed-seed depth thresholds any new arm reshuffles.
fn backfill_op() -> impl Strategy<Value = Op> {
    let finish = (time(), any::<usize>(), any::<bool>()).prop_map(|(now_ms, pick, success)| {
        Op::FinishActive {
            now_ms,
            pick,
            attempt_delta: 0,
            success,
            retryable: false,
            timed_out: false,
            jitter_ms: 0,
            error: String::new(),
        }
    });
    // Jobs made early, backfilled later over ranges after their creation.
    let created =
        (sane_job_spec(), 0i64..1000).prop_map(|(s, d)| Op::Raw(Command::create_job(s, T0 + d)));
    let start = (
        prop::sample::select(vec!["a", "b", "c"]),
        later_again(),
        0i64..30_000,
        0i64..60_000,
    )
        .prop_flat_map(|t| {
            // Mostly `allow`: the others wait for, or skip past, busy jobs.
            let o = [
                BackfillOverlap::Allow,
                BackfillOverlap::Allow,
                BackfillOverlap::Skip,
                BackfillOverlap::BufferAll,
            ];
            (Just(t), prop::sample::select(o.to_vec()))
        })
        .prop_map(|((id, now_ms, ago_ms, len_ms), overlap)| {
            let to_ms = now_ms - ago_ms;
            let (from_ms, id) = (to_ms - len_ms, id.to_string());
            Op::Raw(Command::StartBackfill {
                id,
                from_ms,
                to_ms,
                overlap,
                now_ms,
            })
        });
    prop_oneof![
        2 => created,
        3 => start,
        1 => backfill().prop_map(Op::Raw),
        // Fires come later still: state time is the largest seen, and a
        // step falls due at it.
        4 => ((120_000i64..1_000_000).prop_map(|d| T0 + d), widths())
            .prop_map(|(now_ms, widths)| Op::FireDue { now_ms, widths }),
        3 => finish,
        // Format 4 makes overlap `replace` wait for assigned runs to stop.
        1 => Just(Op::Raw(Command::ActivateLogFormat { format: 4 })),
        2 => (later_again(), any::<usize>()).prop_map(|(now_ms, pick)| Op::AssignActive {
            now_ms,
            pick,
            worker: "w1".into(),
        }),
    ]
}

/// A time after `backfill_op`'s jobs were made.
fn later_again() -> impl Strategy<Value = i64> {
    (60_000i64..120_000).prop_map(|d| T0 + d)
}

#[test]
fn backfills_are_total_refusals_write_nothing_and_replicas_agree() {
    on_big_stack(run_backfill_histories);
}

fn run_backfill_histories() {
    let histories = prop::collection::vec(backfill_op(), 1..40);
    let reached = std::cell::RefCell::new(Reached::default());
    let mut runner = proptest::test_runner::TestRunner::new(fixed_seed(128));
    let result = runner.run(&histories, |ops| {
        check_history(ops, &mut reached.borrow_mut())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let r = reached.into_inner();
    eprintln!("{r:?}");
    assert!(r.backfilled > 10, "backfills rarely ran: {r:?}");
}

/// Runs `f` on a thread with room for the strategies' value trees: they
/// are large stack values in debug builds.
fn on_big_stack(f: fn()) {
    std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(f)
        .expect("spawn the property test thread")
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
}

/// `cases` histories from a fixed seed, so coverage floors cannot flake in
/// CI; set PROPTEST_RNG_SEED to explore other histories.
fn fixed_seed(cases: u32) -> ProptestConfig {
    let defaults = ProptestConfig::default();
    let rng_seed = match std::env::var_os("PROPTEST_RNG_SEED") {
        Some(_) => defaults.rng_seed,
        None => proptest::test_runner::RngSeed::Fixed(5),
    };
    ProptestConfig {
        cases,
        failure_persistence: None,
        rng_seed,
        ..defaults
    }
}

#[test]
fn apply_is_total_refusals_write_nothing_and_replicas_agree() {
    on_big_stack(run_histories);
}

fn run_histories() {
    // Housekeeping depth is heavy-tailed over seeds (most reach ~10
    // removals, some 1,000+): this seed reaches every floor with the
    // firing switch and bounds generated.
    let mut runner = proptest::test_runner::TestRunner::new(fixed_seed(512));
    let reached = std::cell::RefCell::new(Reached::default());
    let histories = prop::collection::vec(op(), 1..60);
    if let Err(e) = runner.run(&histories, |ops| {
        check_history(ops, &mut reached.borrow_mut())
    }) {
        panic!("{e}");
    }
    let r = reached.into_inner();
    eprintln!("{r:?}");
    assert!(
        r.accepted > 5000
            && r.refused > 1000
            && r.jobs_created > 200
            && r.runs_started > 1000
            && r.attempts_ended > 300
            && r.retries_scheduled > 20
            && r.housekept_runs > 200,
        "the generated histories stayed shallow: {r:?}"
    );
}

/// A single command, sometimes under one of two request ids, so that
/// repeats, ids reused by another command and a batch's own ids occur.
fn maybe_with_request_id() -> impl Strategy<Value = Command> {
    prop_oneof![
        3 => raw_command(),
        2 => (prop::sample::select(vec!["r1", "r2"]), raw_command()).prop_map(|(id, cmd)| {
            Command::Dedup {
                request_id: id.to_string(),
                command: Box::new(cmd),
            }
        }),
    ]
}

/// Histories of batches whose commands carry request ids, over states
/// where those ids and deleted jobs exist: every batch answers and writes
/// what its commands do one by one (`step`), whatever a batch knows of the
/// request-id table and the deleted-job marks (`apply::Known`).
#[test]
fn batches_with_request_ids_equal_their_commands_one_by_one() {
    on_big_stack(|| {
        let mut runner = proptest::test_runner::TestRunner::new(fixed_seed(256));
        let one = || {
            prop_oneof![
                2 => maybe_with_request_id(),
                1 => Just(trigger_a()),
            ]
        };
        let history = prop::collection::vec(
            prop_oneof![
                1 => one(),
                2 => prop::collection::vec(one(), 1..8)
                    .prop_map(|commands| Command::Batch { commands }),
            ],
            1..40,
        );
        let deleted_refusals = std::cell::Cell::new(0u32);
        let result = runner.run(&history, |cmds| {
            let mut view = MemView::default();
            for format in [3, 5] {
                step(&mut view, &Command::ActivateLogFormat { format })?;
            }
            for cmd in &cmds {
                let a = step(&mut view, cmd)?;
                if let Response::Many(answers) = &a.response {
                    let refused = answers.iter().filter(|r| {
                        matches!(r, Response::Error(CommandError::FailedPrecondition(m)) if m.contains("was deleted"))
                    });
                    deleted_refusals.set(deleted_refusals.get() + refused.count() as u32);
                }
            }
            Ok(())
        });
        if let Err(e) = result {
            panic!("{e}");
        }
        assert!(
            deleted_refusals.get() > 0,
            "no batch met a job deleted with runs left"
        );
    });
}

/// A trigger of job "a": gives it runs, so its delete leaves a mark.
fn trigger_a() -> Command {
    Command::TriggerJob {
        id: "a".into(),
        now_ms: T0,
        widths: Vec::new(),
    }
}
