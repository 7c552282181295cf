//! Jitter (issue #16 item 3), by outputs: each occurrence fires at its
//! nominal time plus an offset drawn from the job's seed, never earlier;
//! runs keep the nominal time and record the offset; lateness counts from
//! the jittered time; offsets survive a change of leader.

use super::*;

const MINUTE: i64 = 60_000;

fn jittered(id: &str, every_ms: u64, jitter_ms: u64, seed: u64) -> JobSpec {
    JobSpec {
        jitter: Some(Jitter {
            ms: jitter_ms,
            seed,
        }),
        ..every(id, every_ms)
    }
}

fn offset(sim: &Sim, job: &str, at_ms: i64) -> i64 {
    i64::try_from(sim.job(job).offset_ms(at_ms)).unwrap()
}

/// The job's one pending occurrence entry.
fn pending(sim: &Sim, job: &str) -> WheelKey {
    let keys: Vec<WheelKey> = (sim.wheel().into_iter())
        .filter(|k| k.job == job && k.kind == EntryKind::Occurrence)
        .collect();
    assert_eq!(keys.len(), 1, "{keys:?}");
    keys[0].clone()
}

#[test]
fn an_occurrence_fires_at_its_offset_never_before_and_its_run_keeps_the_nominal_time() {
    let mut sim = sim_with(jittered("a", MINUTE as u64, 30_000, 7));
    let nominal = T0 + MINUTE;
    let off = offset(&sim, "a", nominal);
    assert!((0..30_000).contains(&off), "{off}");
    let key = pending(&sim, "a");
    assert_eq!(
        (key.scheduled_at_ms, key.fire_at_ms),
        (nominal, nominal + off)
    );
    assert_eq!(sim.job("a").next_offset_ms, off as u64);

    // At the nominal time the entry is not due yet: nothing fires.
    if off > 0 {
        let early = sim.fire(nominal + off - 1, vec![key.clone()]);
        assert_eq!(early.response, fired(0, 1));
        assert!(sim.try_run(&rid("a", nominal)).is_none());
    }
    let a = sim.fire(nominal + off + 5, vec![key]);
    assert_eq!(a.response, fired(1, 0));
    let run = sim.run(&rid("a", nominal));
    assert_eq!((run.offset_ms, run.note.as_str()), (off as u64, ""));
    assert!(a.effects.contains(&Effect::Ready(ReadyRun {
        offset_ms: off as u64,
        ..match ready(
            &rid("a", nominal),
            1,
            limits::DEFAULT_TIMEOUT_MS,
            nominal + off + 5,
        ) {
            Effect::Ready(r) => r,
            _ => unreachable!(),
        }
    })));
    // The next one is computed from the nominal time, with its own offset.
    let next = pending(&sim, "a");
    let next_nominal = nominal + MINUTE;
    assert_eq!(
        (next.scheduled_at_ms, next.fire_at_ms),
        (next_nominal, next_nominal + offset(&sim, "a", next_nominal))
    );
    // The run record carries the offset in a tail; a run without one has none.
    let bytes = sim.view.get(&keys::run(&rid("a", nominal))).unwrap();
    assert_eq!(Run::record_has_tail(&bytes), off > 0);
    let restore = Command::RestorePairs {
        pairs: vec![(keys::run(&rid("a", nominal)), bytes)],
        first: true,
        last: true,
        now_ms: T0,
    };
    assert_eq!(restore.min_format(), if off > 0 { 4 } else { 1 });
    // So does its pending entry, which fires after its nominal time.
    let restore = Command::RestorePairs {
        pairs: vec![(keys::wheel(&next), Vec::new())],
        first: true,
        last: true,
        now_ms: T0,
    };
    let next_off = next.fire_at_ms - next.scheduled_at_ms;
    assert_eq!(restore.min_format(), if next_off > 0 { 4 } else { 1 });
}

#[test]
fn offsets_spread_over_the_window_and_differ_by_seed() {
    let (j1, j2) = (
        Jitter {
            ms: 10_000,
            seed: 1,
        },
        Jitter {
            ms: 10_000,
            seed: 2,
        },
    );
    let times: Vec<i64> = (0..2000).map(|i| T0 + i * MINUTE).collect();
    let offs: Vec<u64> = times.iter().map(|t| j1.offset_ms("a", *t)).collect();
    assert!(offs.iter().all(|o| *o < 10_000));
    // Every tenth of the window is hit (2000 draws: each decile ~200 times).
    for decile in 0..10 {
        let hits = offs.iter().filter(|o| **o / 1000 == decile).count();
        assert!((100..300).contains(&hits), "decile {decile}: {hits}");
    }
    let same = (times.iter()).filter(|t| j1.offset_ms("a", **t) == j2.offset_ms("a", **t));
    assert!(same.count() < 10, "another seed gives other offsets");
    assert_ne!(j1.offset_ms("a", T0), j1.offset_ms("b", T0));
    // A pure function: the same occurrence gets the same offset every time.
    assert_eq!(offs[17], j1.offset_ms("a", times[17]));
    assert_eq!(Jitter { ms: 1, seed: 9 }.offset_ms("a", T0), 0);
}

#[test]
fn a_new_leader_fires_each_occurrence_at_the_offset_the_old_one_scheduled() {
    // Two replicas apply the create the first leader proposed (its seed).
    let create = Command::create_job(jittered("a", MINUTE as u64, 20_000, 0xfeed), T0);
    let (mut old, mut new) = (Sim::default(), Sim::default());
    old.exec(create.clone());
    new.exec(create);
    let before = pending(&old, "a");
    assert_eq!(pending(&new, "a"), before);
    // The old leader dies before the fire; the new one proposes what its
    // own state says is due, when it is due.
    let a = new.fire_due(before.fire_at_ms);
    assert_eq!(a.response, fired(1, 0));
    let run = new.run(&rid("a", before.scheduled_at_ms));
    assert_eq!(
        run.offset_ms,
        (before.fire_at_ms - before.scheduled_at_ms) as u64
    );
    // An update through the new leader draws another seed: the job keeps
    // its own, so later offsets stay what they were.
    let later = pending(&new, "a");
    let mut changed = jittered("a", MINUTE as u64, 20_000, 0xbeef);
    changed.payload = b"other".to_vec();
    new.exec(update(changed, 0, before.fire_at_ms + 1));
    assert_eq!(pending(&new, "a"), later);
    assert_eq!(new.job("a").jitter.map(|j| j.seed), Some(0xfeed));
}

#[test]
fn lateness_and_misfire_grace_count_from_the_jittered_time() {
    let spec = with_misfire(jittered("a", MINUTE as u64, 30_000, 3), Misfire::Skip, 1000);
    let mut sim = sim_with(spec);
    let key = pending(&sim, "a");
    // Inside the grace of the jittered time: runs, though long after the nominal.
    let a = sim.fire(key.fire_at_ms + 900, vec![key.clone()]);
    assert_eq!(a.response, fired(1, 0));
    assert_eq!(sim.run(&rid("a", key.scheduled_at_ms)).note, "");

    // Past it: late, and fire-all says by how much from the jittered time.
    let spec = with_misfire(
        jittered("b", MINUTE as u64, 30_000, 3),
        Misfire::FireAll,
        1000,
    );
    let mut sim = sim_with(spec);
    let key = pending(&sim, "b");
    sim.fire(key.fire_at_ms + 1500, vec![key.clone()]);
    let run = sim.run(&rid("b", key.scheduled_at_ms));
    assert_eq!(run.note, "late by 1500 ms (misfire fire-all)");
}

/// Job "a" every minute with a 50 s jitter, its first pending entry, and
/// the first occurrence two or more after it with an offset of at least
/// `min_offset` (for an outage that ends around that one).
fn before_outage(
    misfire: Misfire,
    grace_ms: u64,
    seed: u64,
    min_offset: i64,
) -> (Sim, WheelKey, i64) {
    let spec = with_misfire(
        jittered("a", MINUTE as u64, 50_000, seed),
        misfire,
        grace_ms,
    );
    let sim = sim_with(spec);
    let first = pending(&sim, "a");
    let k = (2..100)
        .map(|i| first.scheduled_at_ms + i * MINUTE)
        .find(|t| offset(&sim, "a", *t) >= min_offset)
        .expect("an offset that large among 100");
    (sim, first, k)
}

#[test]
fn skip_runs_an_occurrence_whose_jittered_time_is_inside_the_grace() {
    // An outage: the leader comes back inside the grace of occurrence `k`'s
    // jittered time, though `k` is nominally older than the grace.
    let (mut sim, first, k) = before_outage(Misfire::Skip, 5000, 11, 20_000);
    let now = k + offset(&sim, "a", k) + 4000;
    let a = sim.fire(now, vec![first.clone()]);
    assert_eq!(a.response, fired(1, 0));
    let skipped = sim.run(&rid("a", first.scheduled_at_ms));
    let missed = (k - first.scheduled_at_ms) / MINUTE;
    assert_eq!(skipped.state, RunState::Skipped);
    assert_eq!(
        skipped.note,
        format!(
            "misfire skip: {missed} occurrence(s) from {} to {} not run",
            first.scheduled_at_ms,
            k - MINUTE
        )
    );
    // `k` is due now and is not late: it runs.
    assert_eq!(pending(&sim, "a").scheduled_at_ms, k);
    sim.fire_due(now);
    let run = sim.run(&rid("a", k));
    assert_eq!((run.state, run.note.as_str()), (RunState::Pending, ""));
}

#[test]
fn fire_once_coalesces_into_the_latest_occurrence_whose_jittered_time_has_come() {
    let (mut sim, first, k) = before_outage(Misfire::FireOnce, 1000, 5, 1000);
    // `k` is nominally past but its jittered time is not yet: it waits.
    let now = k + offset(&sim, "a", k) - 1;
    sim.fire(now, vec![first.clone()]);
    let run = sim.run(&rid("a", k - MINUTE));
    assert!(
        run.note.starts_with("misfire fire-once: coalesced"),
        "{}",
        run.note
    );
    assert_eq!(run.offset_ms, offset(&sim, "a", k - MINUTE) as u64);
    assert_eq!(pending(&sim, "a").scheduled_at_ms, k);
}

#[test]
fn a_jitter_change_moves_the_pending_entry_and_removing_it_leaves_no_tail() {
    let mut sim = sim_with(jittered("a", MINUTE as u64, 30_000, 1));
    let nominal = T0 + MINUTE;
    let old = pending(&sim, "a");
    sim.exec(update(jittered("a", MINUTE as u64, 10_000, 0), 0, T0 + 1));
    let moved = pending(&sim, "a");
    assert_eq!(moved.scheduled_at_ms, nominal);
    assert_eq!(moved.fire_at_ms, nominal + offset(&sim, "a", nominal));
    assert!(moved.fire_at_ms < nominal + 10_000);
    assert!(!sim.has_entry(&old) || old == moved);

    sim.exec(update(every("a", MINUTE as u64), 0, T0 + 2));
    assert_eq!(pending(&sim, "a"), occ("a", nominal));
    let record = sim.view.get(&keys::job("a")).unwrap();
    assert!(
        !Job::record_has_tail(&record),
        "a job without jitter is stored as before"
    );
}

#[test]
fn a_bad_jitter_is_refused_naming_the_rule() {
    let mut sim = Sim::default();
    let refused = |sim: &mut Sim, spec: JobSpec| {
        let a = sim.exec(Command::create_job(spec, T0));
        assert_nothing_done(&a);
        invalid_msg(&a).to_string()
    };
    let cron = |expr: &str, ms: u64| JobSpec {
        jitter: Some(Jitter { ms, seed: 1 }),
        ..spec(
            "c",
            ScheduleInput::Cron {
                expr: expr.into(),
                tz: "UTC".into(),
            },
        )
    };
    assert_eq!(
        refused(&mut sim, jittered("a", 60_000, 0, 1)),
        "jitter: must be between 1 ms and 1 h (3600000 ms), got 0 ms"
    );
    assert_eq!(
        refused(&mut sim, jittered("a", 24 * 3_600_000, 3_600_001, 1)),
        "jitter: must be between 1 ms and 1 h (3600000 ms), got 3600001 ms"
    );
    assert_eq!(
        refused(&mut sim, jittered("a", 60_000, 60_000, 1)),
        "jitter: must be shorter than the schedule's gap between occurrences (60000 ms), got 60000 ms"
    );
    // `0,50 * * * *`: gaps of 50 and 10 minutes; the smallest counts.
    assert_eq!(
        refused(&mut sim, cron("0,50 * * * *", 600_000)),
        "jitter: must be shorter than the schedule's gap between occurrences (600000 ms), got 600000 ms"
    );
    let mut upstream = spec("u", ScheduleInput::Upstream);
    upstream.workflow = Some(Workflow {
        upstream: vec!["x".into()],
        rule: TriggerRule::default(),
        on_failure: OnUpstreamFailure::default(),
    });
    upstream.jitter = Some(Jitter { ms: 5, seed: 1 });
    assert_eq!(
        refused(&mut sim, upstream),
        "jitter: a job without a schedule of its own has no occurrence to delay"
    );
    sim.create(cron("0,50 * * * *", 599_999), T0);
    sim.create(jittered("a", 60_000, 59_999, 1), T0);
}
