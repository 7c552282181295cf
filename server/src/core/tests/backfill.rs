//! Backfill (issue #16 item 5), by outputs: a past range created in order,
//! a bounded step at a time, each run marked; occurrences that already ran
//! left alone; the overlap modes; refusals; the cursor going on after a
//! change of leader; cancel.

use super::*;

const RANGE_END: i64 = T0 + 41_000;
const NOW: i64 = T0 + 100_000;

fn start(id: &str, from_ms: i64, to_ms: i64, overlap: BackfillOverlap, now_ms: i64) -> Command {
    Command::StartBackfill {
        id: id.into(),
        from_ms,
        to_ms,
        overlap,
        now_ms,
    }
}

fn step_key(sim: &Sim, job: &str) -> Option<WheelKey> {
    (sim.wheel().into_iter()).find(|k| k.job == job && k.kind == EntryKind::Backfill)
}

/// Fires the job's backfill step entry at its time, as the leader would.
fn step(sim: &mut Sim, job: &str) -> Applied {
    let key = step_key(sim, job).expect("a step entry");
    let at = key.fire_at_ms;
    sim.fire(at, vec![key])
}

fn backfill(sim: &Sim, job: &str) -> Backfill {
    sim.job(job).backfill.expect("a backfill")
}

fn mark(sim: &Sim, run: &RunId) -> Option<(i64, i64)> {
    sim.view
        .get(&keys::run_backfill(run))
        .map(|b| decode(&b).unwrap())
}

fn times(sim: &Sim, job: &str) -> Vec<i64> {
    sim.runs_of(job)
        .iter()
        .map(|r| r.id.scheduled_at_ms - T0)
        .collect()
}

fn end(sim: &mut Sim, run: &RunId, now_ms: i64) {
    let mut r = report(run, 1, true, 0);
    r.retryable = false;
    let a = sim.finish(now_ms, r);
    assert_eq!(a.response, Response::Batch(vec![Ok(())]));
}

/// Job "a" (every second from `T0`) with a backfill of
/// `[T0 + 1000, RANGE_END)` (40 occurrences) started at `NOW` under `allow`.
fn backfilling() -> Sim {
    let mut sim = sim_with(every("a", 1000));
    let a = sim.exec(start(
        "a",
        T0 + 1000,
        RANGE_END,
        BackfillOverlap::Allow,
        NOW,
    ));
    assert!(matches!(a.response, Response::Job(_)), "{:?}", a.response);
    sim
}

#[test]
fn a_backfill_creates_the_range_in_order_a_step_at_a_time_and_marks_each_run() {
    let mut sim = sim_with(every("a", 1000));
    let now = T0 + 100_000;
    let a = sim.exec(start(
        "a",
        T0 + 1000,
        RANGE_END,
        BackfillOverlap::Allow,
        now,
    ));
    let Response::Job(job) = &a.response else {
        panic!("{:?}", a.response)
    };
    let b = job.backfill.clone().unwrap();
    assert_eq!(
        (b.total, b.next_ms, b.state()),
        (40, Some(T0 + 1000), "running")
    );
    assert_eq!(
        a.effects,
        vec![Effect::Scheduled(WheelKey::backfill("a", now))]
    );
    assert_eq!(sim.runs_of("a"), vec![], "runs are created by the steps");

    let first = step(&mut sim, "a");
    assert_eq!(first.response, fired(1, 0));
    let made: Vec<i64> = (1..=16).map(|k| k * 1000).collect();
    assert_eq!(times(&sim, "a"), made, "the first 16 occurrences, in order");
    let backfilled = |a: &Applied| {
        (a.effects.iter())
            .filter_map(|e| match e {
                Effect::Backfilled(r) => Some(r.scheduled_at_ms - T0),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(backfilled(&first), made);
    assert_eq!(
        step_key(&sim, "a"),
        Some(WheelKey::backfill("a", now + limits::BACKFILL_STEP_MS)),
        "the next step waits BACKFILL_STEP_MS"
    );
    let run = sim.run(&rid("a", T0 + 1000));
    assert_eq!(run.state, RunState::Pending);
    assert_eq!(run.note, format!("backfill [{}, {RANGE_END})", T0 + 1000));
    assert_eq!(mark(&sim, &run.id), Some((T0 + 1000, RANGE_END)));

    step(&mut sim, "a");
    step(&mut sim, "a");
    let all: Vec<i64> = (1..=40).map(|k| k * 1000).collect();
    assert_eq!(
        times(&sim, "a"),
        all,
        "every occurrence of [from, to), once"
    );
    let b = backfill(&sim, "a");
    assert_eq!(
        (b.started, b.existing, b.skipped, b.state()),
        (40, 0, 0, "done")
    );
    assert_eq!(b.ended_at_ms, Some(now + 2 * limits::BACKFILL_STEP_MS));
    assert_eq!(step_key(&sim, "a"), None, "a done backfill keeps no entry");
    assert_eq!(sim.job("a").active_runs, 40);
    // The job's own schedule goes on untouched.
    assert_eq!(sim.occurrences("a"), vec![T0 + 1000]);
}

#[test]
fn occurrences_that_ran_are_left_alone_buffer_all_waits_for_room_and_skip_records() {
    let mut sim = sim_with(with_overlap(every("a", 1000), Overlap::Forbid));
    sim.fire_due(T0 + 1000);
    end(&mut sim, &rid("a", T0 + 1000), T0 + 1500);
    let now = T0 + 10_000;
    sim.exec(start(
        "a",
        T0 + 1000,
        T0 + 4000,
        BackfillOverlap::BufferAll,
        now,
    ));
    step(&mut sim, "a");
    assert_eq!(
        times(&sim, "a"),
        vec![1000, 2000],
        "1000 ran already, 3000 waits"
    );
    let b = backfill(&sim, "a");
    assert_eq!((b.started, b.existing, b.next_ms), (1, 1, Some(T0 + 3000)));
    assert_eq!(
        mark(&sim, &rid("a", T0 + 1000)),
        None,
        "a run it found is not marked"
    );
    // Waiting for room, it looks again only at the slow poll...
    let poll = step_key(&sim, "a").expect("a step entry").fire_at_ms;
    assert_eq!(poll, now + limits::BACKFILL_WAIT_POLL_MS);
    assert!(backfill(&sim, "a").waiting);
    step(&mut sim, "a");
    assert_eq!(times(&sim, "a"), vec![1000, 2000], "no room: still waiting");
    let again = step_key(&sim, "a").expect("a step entry").fire_at_ms;
    assert_eq!(again, poll + limits::BACKFILL_WAIT_POLL_MS);
    // ...and at once when a run of the job ends.
    let ended_at = poll + 600;
    end(&mut sim, &rid("a", T0 + 2000), ended_at);
    assert_eq!(step_key(&sim, "a").map(|k| k.fire_at_ms), Some(ended_at));
    assert!(!backfill(&sim, "a").waiting);
    step(&mut sim, "a");
    assert_eq!(times(&sim, "a"), vec![1000, 2000, 3000]);
    assert_eq!(backfill(&sim, "a").state(), "done");
    // The job's own occurrence 2000, due now, finds its run and adds none.
    let own = sim.fire(now + 1000, vec![occ("a", T0 + 2000)]);
    assert_eq!(own.response, fired(1, 0));
    assert_eq!(sim.runs_of("a").len(), 3);

    let mut sim = sim_with(with_overlap(every("s", 1000), Overlap::Forbid));
    sim.exec(start("s", T0 + 1000, T0 + 3000, BackfillOverlap::Skip, now));
    step(&mut sim, "s");
    let skipped = sim.run(&rid("s", T0 + 2000));
    assert_eq!(skipped.state, RunState::Skipped);
    assert_eq!(
        skipped.note,
        format!(
            "backfill [{}, {}): the job was busy (overlap skip)",
            T0 + 1000,
            T0 + 3000
        )
    );
    assert_eq!(mark(&sim, &skipped.id), Some((T0 + 1000, T0 + 3000)));
    let b = backfill(&sim, "s");
    assert_eq!((b.started, b.skipped, b.state()), (1, 1, "done"));
}

#[test]
fn refusals_name_the_field_and_the_rule_and_write_nothing() {
    let mut sim = sim_with(every("a", 1000));
    let now = T0 + 2_000_000;
    let allow = BackfillOverlap::Allow;
    let cases = [
        (
            start("a", T0 + 5000, T0 + 5000, allow, now),
            "from: must be before to",
        ),
        (
            start("a", T0, now + 1, allow, now),
            "to: a backfill covers the past",
        ),
        (
            start("a", T0 - 10_000, T0, allow, now),
            "from, to: the job's schedule has no occurrence",
        ),
    ];
    for (cmd, want) in cases {
        let a = sim.exec(cmd);
        assert!(invalid_msg(&a).starts_with(want), "{}", invalid_msg(&a));
        assert_nothing_done(&a);
    }
    let a = sim.exec(start("a", T0 + 1, T0 + 1_001_001, allow, now));
    assert!(invalid_msg(&a).contains("more than 1000 occurrences"));
    let a = sim.exec(start("nope", T0, T0 + 1000, allow, now));
    assert_refused(&a, CommandError::NotFound("nope".into()));
    let a = sim.exec(Command::CancelBackfill {
        id: "a".into(),
        now_ms: now,
    });
    let none = "job \"a\" has no backfill in progress";
    assert_refused(&a, CommandError::FailedPrecondition(none.into()));
    // Exactly 1000 is taken; a second one while it runs is refused.
    let ok = sim.exec(start("a", T0 + 1000, T0 + 1_001_000, allow, now));
    assert_eq!(backfill(&sim, "a").total, 1000, "{:?}", ok.response);
    let a = sim.exec(start("a", T0 + 1000, T0 + 2000, allow, now));
    let Response::Error(CommandError::FailedPrecondition(msg)) = &a.response else {
        panic!("{:?}", a.response)
    };
    assert!(
        msg.contains("has a backfill in progress (0 of 1000"),
        "{msg}"
    );
    assert_nothing_done(&a);
}

#[test]
fn the_cursor_goes_on_after_a_leader_change_with_nothing_doubled_or_lost() {
    let run_all = |failover: bool| {
        let (mut sim, now) = (backfilling(), NOW);
        let old_key = step_key(&sim, "a").unwrap();
        step(&mut sim, "a");
        if failover {
            // The old leader's proposal of the same step, committed after
            // the new leader took over, is stale and creates nothing.
            let stale = sim.fire(now + 10, vec![old_key]);
            assert_eq!(stale.response, fired(0, 1));
            assert_eq!(state_writes(&stale), Vec::<&Write>::new());
        }
        // The new leader loads the wheel from the durable state and fires
        // what is due, late.
        let mut t = now + 5_000;
        while step_key(&sim, "a").is_some() {
            sim.fire(
                t,
                sim.due(t)
                    .into_iter()
                    .filter(|k| k.kind == EntryKind::Backfill)
                    .collect(),
            );
            t += 1000;
        }
        sim
    };
    let (calm, failed_over) = (run_all(false), run_all(true));
    let all: Vec<i64> = (1..=40).map(|k| k * 1000).collect();
    assert_eq!(times(&failed_over, "a"), all);
    assert_eq!(backfill(&failed_over, "a").started, 40);
    let runs = |s: &Sim| -> Vec<RunId> { s.runs_of("a").into_iter().map(|r| r.id).collect() };
    assert_eq!(runs(&calm), runs(&failed_over));
}

#[test]
fn cancel_stops_the_steps_keeps_the_runs_and_a_new_backfill_may_start() {
    let (mut sim, now) = (backfilling(), NOW);
    step(&mut sim, "a");
    let a = sim.exec(Command::CancelBackfill {
        id: "a".into(),
        now_ms: now + 100,
    });
    assert!(matches!(a.response, Response::Job(_)));
    let b = backfill(&sim, "a");
    assert_eq!(
        (b.state(), b.started, b.ended_at_ms),
        ("cancelled", 16, Some(now + 100))
    );
    assert_eq!(step_key(&sim, "a"), None);
    assert_eq!(sim.runs_of("a").len(), 16, "its runs stay");
    sim.exec(start(
        "a",
        T0 + 1000,
        RANGE_END,
        BackfillOverlap::Allow,
        now + 200,
    ));
    step(&mut sim, "a");
    assert_eq!(backfill(&sim, "a").existing, 16, "the first 16 ran already");
    // Deleting the job takes its step entry with it.
    sim.exec(Command::DeleteJob {
        id: "a".into(),
        now_ms: now + 300,
    });
    assert_eq!(sim.wheel(), vec![]);
}

#[test]
fn a_paused_jobs_backfill_waits_and_backfills_need_log_format_4() {
    let mut sim = sim_with(every("a", 1000));
    let now = T0 + 100_000;
    sim.exec(start(
        "a",
        T0 + 1000,
        T0 + 3000,
        BackfillOverlap::BufferAll,
        now,
    ));
    sim.exec(Command::pause_job("a".into(), String::new(), now));
    step(&mut sim, "a");
    assert_eq!(sim.runs_of("a").len(), 0);
    assert_eq!(backfill(&sim, "a").state(), "running");
    // Parked: no step entry, so no log entries while the job stays paused.
    assert_eq!(step_key(&sim, "a"), None);
    assert_eq!(backfill(&sim, "a").step_at_ms, None);
    sim.exec(Command::ResumeJob {
        id: "a".into(),
        now_ms: now + 300,
    });
    assert_eq!(step_key(&sim, "a").map(|k| k.fire_at_ms), Some(now + 300));
    step(&mut sim, "a");
    assert_eq!(times(&sim, "a"), vec![1000, 2000]);

    let bf = start("a", T0, T0 + 1, BackfillOverlap::Allow, now);
    let cancel = Command::CancelBackfill {
        id: "a".into(),
        now_ms: now,
    };
    let fire_step = Command::Fire {
        now_ms: now,
        keys: vec![WheelKey::backfill("a", now)],
        widths: vec![],
    };
    for cmd in [bf, cancel, fire_step] {
        assert_eq!(cmd.min_format(), 4, "{cmd:?}");
    }
    let plain_fire = Command::Fire {
        now_ms: now,
        keys: vec![occ("a", now)],
        widths: vec![],
    };
    assert_eq!(plain_fire.min_format(), 1);
}
