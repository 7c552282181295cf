//! Tests of the scheduling state machine through its one entry point,
//! `apply`. Each test drives a [`MemView`] with commands, writes back what
//! apply returned and asserts on outputs only: responses, the writes and
//! effects a command produced, and state read back through the view. Time is
//! the `now_ms` inside each command; nothing here reads a clock.

use super::apply::state_time;
use super::codec::decode;
use super::*;

/// An arbitrary cluster time far from zero, so "in the past" checks are real.
const T0: i64 = 1_700_000_000_000;

// ------------------------------------------------------------------ helpers

fn spec(id: &str, schedule: ScheduleInput) -> JobSpec {
    JobSpec {
        id: id.into(),
        schedule,
        group: "g".into(),
        payload: b"p".to_vec(),
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

fn every(id: &str, every_ms: u64) -> JobSpec {
    spec(id, ScheduleInput::Every { every_ms })
}

fn with_overlap(mut s: JobSpec, overlap: Overlap) -> JobSpec {
    s.policy.overlap = overlap;
    s
}

fn with_misfire(mut s: JobSpec, misfire: Misfire, grace_ms: u64) -> JobSpec {
    s.policy.misfire = misfire;
    s.policy.misfire_grace_ms = grace_ms;
    s
}

fn occ(job: &str, at_ms: i64) -> WheelKey {
    WheelKey::occurrence(job, at_ms)
}

fn rid(job: &str, at_ms: i64) -> RunId {
    RunId::new(job, at_ms)
}

fn report(run: &RunId, attempt: u32, success: bool, jitter_ms: u64) -> FinishReport {
    FinishReport {
        run: run.clone(),
        attempt,
        success,
        result: b"r".to_vec(),
        error: if success { "" } else { "boom" }.into(),
        retryable: true,
        worker: "w1".into(),
        received_at_ms: 0,
        jitter_ms,
        timed_out: false,
    }
}

fn fired(runs: u32, skipped_keys: u32) -> Response {
    Response::Fired { runs, skipped_keys }
}

fn ended(run: &RunId, attempt: u32) -> Effect {
    Effect::Ended {
        run: run.clone(),
        attempt,
    }
}

fn finished(run: &RunId, attempt: u32, worker: &str, outcome: RunState) -> Effect {
    Effect::Finished(Finished {
        run: run.clone(),
        attempt,
        group: "g".into(),
        worker: worker.into(),
        outcome,
    })
}

fn assigned(run: &RunId, attempt: u32, worker: &str) -> Effect {
    Effect::Assigned {
        run: run.clone(),
        attempt,
        group: "g".into(),
        worker: worker.into(),
    }
}

fn job_changed(job: &str, change: JobChange) -> Effect {
    Effect::JobChanged {
        job: job.into(),
        group: "g".into(),
        change,
    }
}

fn misfired(policy: Misfire) -> Effect {
    Effect::Misfired {
        group: "g".into(),
        policy,
    }
}

fn trigger(id: &str, now_ms: i64) -> Command {
    Command::TriggerJob {
        id: id.into(),
        now_ms,
        widths: vec![],
    }
}

fn update(spec: JobSpec, expected_revision: u64, now_ms: i64) -> Command {
    Command::update_job(spec, expected_revision, now_ms)
}

fn ready(run: &RunId, attempt: u32, timeout_ms: u64, fired_at_ms: i64) -> Effect {
    Effect::Ready(ReadyRun {
        run: run.clone(),
        attempt,
        fired_at_ms: Some(fired_at_ms),
        group: "g".into(),
        priority: limits::DEFAULT_PRIORITY,
        timeout_ms,
        route: Route::LeastLoaded,
        shard_count: 1,
        offset_ms: 0,
    })
}

fn invalid_msg(a: &Applied) -> &str {
    match &a.response {
        Response::Error(CommandError::Invalid(msg)) => msg,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

fn assert_refused(a: &Applied, want: CommandError) {
    assert_eq!(a.response, Response::Error(want));
    assert_nothing_done(a);
}

fn assert_nothing_done(a: &Applied) {
    assert_eq!(
        a.writes,
        vec![],
        "a refused or no-op command must not write"
    );
    assert_eq!(
        a.effects,
        vec![],
        "a refused or no-op command has no effects"
    );
}

/// Writes other than the state-machine clock.
fn state_writes(a: &Applied) -> Vec<&Write> {
    let is_time = |w: &&Write| matches!(w, Write::Put(k, _) if k == keys::META_TIME);
    a.writes.iter().filter(|w| !is_time(w)).collect()
}

/// A replica in a box: applies commands and keeps their writes.
#[derive(Default)]
struct Sim {
    view: MemView,
}

impl Sim {
    /// Applies `cmd` as a replica would: decoded from its log entry.
    fn exec(&mut self, cmd: Command) -> Applied {
        let cmd = VersionedCommand::new(&cmd).command(0).expect("decodes");
        let a = apply(&self.view, &cmd);
        self.view.write(&a.writes);
        a
    }

    fn create(&mut self, spec: JobSpec, now_ms: i64) -> Applied {
        let a = self.exec(Command::create_job(spec, now_ms));
        assert!(matches!(a.response, Response::Job(_)), "{:?}", a.response);
        a
    }

    fn fire(&mut self, now_ms: i64, keys: Vec<WheelKey>) -> Applied {
        self.exec(Command::Fire {
            now_ms,
            keys,
            widths: vec![],
        })
    }

    /// Proposes everything due, as the leader would.
    fn fire_due(&mut self, now_ms: i64) -> Applied {
        let due = self.due(now_ms);
        self.fire(now_ms, due)
    }

    fn finish(&mut self, now_ms: i64, r: FinishReport) -> Applied {
        self.exec(Command::Finish {
            now_ms,
            reports: vec![r],
        })
    }

    fn job(&self, id: &str) -> Job {
        self.try_job(id).expect("job exists")
    }

    fn try_job(&self, id: &str) -> Option<Job> {
        self.view
            .get(&keys::job(id))
            .map(|b| Job::from_record(&b).unwrap())
    }

    fn run(&self, id: &RunId) -> Run {
        self.try_run(id)
            .unwrap_or_else(|| panic!("run {id} exists"))
    }

    fn try_run(&self, id: &RunId) -> Option<Run> {
        self.view
            .get(&keys::run(id))
            .map(|b| Run::from_record(&b).unwrap())
    }

    fn runs_of(&self, job: &str) -> Vec<Run> {
        let start = keys::runs_of(job);
        let end = keys::run(&rid(job, i64::MAX));
        let rows = self.view.range(&start, &end, usize::MAX);
        rows.into_iter()
            .map(|(_, v)| Run::from_record(&v).unwrap())
            .collect()
    }

    fn wheel(&self) -> Vec<WheelKey> {
        let rows = self
            .view
            .range(&[keys::WHEEL], &[keys::WHEEL + 1], usize::MAX);
        rows.iter()
            .map(|(k, _)| keys::wheel_from(k).unwrap())
            .collect()
    }

    fn has_entry(&self, k: &WheelKey) -> bool {
        self.view.get(&keys::wheel(k)).is_some()
    }

    fn occurrences(&self, job: &str) -> Vec<i64> {
        self.wheel()
            .into_iter()
            .filter(|k| k.job == job && k.kind == EntryKind::Occurrence)
            .map(|k| k.fire_at_ms)
            .collect()
    }

    fn due(&self, now_ms: i64) -> Vec<WheelKey> {
        let rows = self
            .view
            .range(&[keys::WHEEL], &keys::wheel_upto(now_ms), usize::MAX);
        rows.iter()
            .map(|(k, _)| keys::wheel_from(k).unwrap())
            .collect()
    }

    fn active_runs(&self, job: &str) -> Vec<Run> {
        let active = |r: &Run| !r.state.is_terminal();
        self.runs_of(job).into_iter().filter(active).collect()
    }
}

/// A sim with `spec` created at `T0`.
fn sim_with(spec: JobSpec) -> Sim {
    let mut sim = Sim::default();
    sim.create(spec, T0);
    sim
}

// ------------------------------------------------------------------ create and fire

#[test]
fn create_every_schedules_exactly_one_occurrence_at_now_plus_every() {
    let mut sim = Sim::default();
    let a = sim.create(every("a", 1000), T0);

    let created = job_changed("a", JobChange::Created);
    assert_eq!(
        a.effects,
        vec![Effect::Scheduled(occ("a", T0 + 1000)), created]
    );
    assert_eq!(sim.wheel(), vec![occ("a", T0 + 1000)]);
    assert_eq!(sim.job("a").next_fire_at_ms, Some(T0 + 1000));
    assert_eq!(a.response, Response::Job(sim.job("a")));
}

#[test]
fn fire_creates_pending_run_and_schedules_next_from_scheduled_time_not_now() {
    let mut sim = sim_with(every("a", 1000));
    let now = T0 + 1000 + 130; // 130 ms late, inside the default grace
    let a = sim.fire(now, vec![occ("a", T0 + 1000)]);

    assert_eq!(a.response, fired(1, 0));
    let run = sim.run(&rid("a", T0 + 1000));
    assert_eq!(
        (run.state, run.attempt, run.fired_at_ms),
        (RunState::Pending, 1, now)
    );
    assert_eq!(run.note, "");
    assert!(a
        .writes
        .contains(&Write::Delete(keys::wheel(&occ("a", T0 + 1000)))));
    assert!(a
        .writes
        .contains(&Write::Put(keys::wheel(&occ("a", T0 + 2000)), vec![])));
    assert_eq!(sim.wheel(), vec![occ("a", T0 + 2000)]);
    assert_eq!(sim.job("a").next_fire_at_ms, Some(T0 + 2000));
    let ready = ready(&run.id, 1, limits::DEFAULT_TIMEOUT_MS, now);
    assert_eq!(
        a.effects,
        vec![ready, Effect::Scheduled(occ("a", T0 + 2000))]
    );
}

#[test]
fn fire_of_key_not_yet_due_is_skipped_and_never_early() {
    let mut sim = sim_with(every("a", 1000));
    let a = sim.fire(T0 + 999, vec![occ("a", T0 + 1000)]);

    assert_eq!(a.response, fired(0, 1));
    assert_eq!(state_writes(&a), Vec::<&Write>::new());
    assert_eq!(a.effects, vec![]);
    assert_eq!(sim.try_run(&rid("a", T0 + 1000)), None);
    assert!(sim.has_entry(&occ("a", T0 + 1000)));
}

#[test]
fn duplicate_fire_of_the_same_key_creates_the_run_once() {
    let mut sim = sim_with(every("a", 1000));
    let first = sim.fire(T0 + 1000, vec![occ("a", T0 + 1000)]);
    let second = sim.fire(T0 + 1000, vec![occ("a", T0 + 1000)]);

    assert_eq!(first.response, fired(1, 0));
    assert_eq!(second.response, fired(0, 1));
    assert_nothing_done(&second);
    assert_eq!(sim.runs_of("a").len(), 1);
    assert_eq!(sim.job("a").active_runs, 1);
    assert_eq!(sim.occurrences("a"), vec![T0 + 2000]);
}

// ------------------------------------------------------------------ watch effects

#[test]
fn each_job_change_is_an_effect_and_a_repeated_pause_or_resume_is_none() {
    let mut sim = sim_with(every("a", 1000));
    let job_effects = |a: &Applied| -> Vec<Effect> {
        let watched = |e: &&Effect| matches!(e, Effect::JobChanged { .. });
        a.effects.iter().filter(watched).cloned().collect()
    };
    let at = T0 + 10;
    let pause = || Command::PauseJob {
        id: "a".into(),
        now_ms: at,
    };
    let resume = || Command::ResumeJob {
        id: "a".into(),
        now_ms: at,
    };
    let cases = [
        (update(every("a", 700), 0, at), Some(JobChange::Updated)),
        (pause(), Some(JobChange::Paused)),
        (pause(), None),
        (resume(), Some(JobChange::Resumed)),
        (resume(), None),
    ];
    for (cmd, want) in cases {
        let a = sim.exec(cmd.clone());
        let want: Vec<_> = want.map(|c| job_changed("a", c)).into_iter().collect();
        assert_eq!(job_effects(&a), want, "{cmd:?}");
    }
    let a = sim.exec(Command::DeleteJob {
        id: "a".into(),
        now_ms: at,
    });
    assert_eq!(job_effects(&a), vec![job_changed("a", JobChange::Deleted)]);
    let again = sim.exec(Command::DeleteJob {
        id: "a".into(),
        now_ms: at,
    });
    assert_nothing_done(&again);
}

#[test]
fn an_assignment_of_the_current_attempt_is_an_effect_and_a_stale_one_is_not() {
    let mut sim = sim_with(every("a", 1000));
    sim.fire_due(T0 + 1000);
    let run = rid("a", T0 + 1000);
    let assign = |attempt| Command::Assign {
        now_ms: T0 + 1001,
        assignments: vec![(run.clone(), attempt, "w1".to_string())],
    };
    let a = sim.exec(assign(1));
    assert_eq!(a.effects, vec![assigned(&run, 1, "w1")]);
    assert_eq!(sim.exec(assign(2)).effects, vec![]);
}

#[test]
fn a_finish_committed_before_its_assign_shows_the_assignment_once() {
    let run = rid("a", T0 + 1000);
    let succeeded = finished(&run, 1, "w1", RunState::Succeeded);
    // Before log format 4, as older releases number an entry's events.
    let mut old = sim_with(every("a", 1000));
    old.fire_due(T0 + 1000);
    let a = old.finish(T0 + 1001, report(&run, 1, true, 0));
    assert_eq!(a.effects, vec![succeeded.clone(), ended(&run, 1)]);

    let mut sim = Sim::default();
    sim.exec(Command::ActivateLogFormat { format: 4 });
    sim.create(every("a", 1000), T0);
    sim.fire_due(T0 + 1000);
    let a = sim.finish(T0 + 1001, report(&run, 1, true, 0));
    assert_eq!(
        a.effects,
        vec![assigned(&run, 1, "w1"), succeeded, ended(&run, 1)]
    );
    let late = sim.exec(Command::Assign {
        now_ms: T0 + 1002,
        assignments: vec![(run.clone(), 1, "w1".to_string())],
    });
    assert_eq!(late.effects, vec![], "the assignment was shown already");
    assert_eq!(sim.run(&run).state, RunState::Succeeded);
}

#[test]
fn stale_fire_after_update_delete_or_pause_creates_no_run() {
    let change = update(every("a", 700), 1, T0 + 500);
    let delete = Command::DeleteJob {
        id: "a".into(),
        now_ms: T0 + 500,
    };
    let pause = Command::PauseJob {
        id: "a".into(),
        now_ms: T0 + 500,
    };
    for racer in [change, delete, pause] {
        let mut sim = sim_with(every("a", 1000));
        sim.exec(racer.clone());
        let a = sim.fire(T0 + 1000, vec![occ("a", T0 + 1000)]);

        assert_eq!(a.response, fired(0, 1), "{racer:?}");
        assert_eq!(state_writes(&a), Vec::<&Write>::new(), "{racer:?}");
        assert_eq!(sim.runs_of("a"), vec![], "{racer:?}");
    }
    // The update's own occurrence (re-anchored at the update) is still pending.
    let mut sim = sim_with(every("a", 1000));
    sim.exec(update(every("a", 700), 1, T0 + 500));
    sim.fire(T0 + 1000, vec![occ("a", T0 + 1000)]);
    assert_eq!(sim.occurrences("a"), vec![T0 + 1200]);
}

// ------------------------------------------------------------------ misfire

/// Job "a" every 1 s with a 1 s grace, fired 5.5 s after its first occurrence (T0+1000).
fn late_fire(misfire: Misfire) -> (Sim, Applied) {
    let mut sim = sim_with(with_misfire(every("a", 1000), misfire, 1000));
    let a = sim.fire(T0 + 6500, vec![occ("a", T0 + 1000)]);
    (sim, a)
}

#[test]
fn misfire_fire_all_runs_first_missed_and_catches_up_in_order() {
    let (mut sim, a) = late_fire(Misfire::FireAll);
    assert_eq!(a.response, fired(1, 0));
    let first = sim.run(&rid("a", T0 + 1000));
    assert_eq!(first.state, RunState::Pending);
    assert!(first.note.contains("late by 5500 ms"), "{}", first.note);
    assert_eq!(a.effects.first(), Some(&misfired(Misfire::FireAll)));
    assert_eq!(
        sim.occurrences("a"),
        vec![T0 + 2000],
        "the next *missed* occurrence"
    );

    // The leader keeps proposing what is due: one occurrence per fire, in order.
    for at in [2000, 3000, 4000, 5000, 6000] {
        let a = sim.fire_due(T0 + 6500);
        assert_eq!(a.response, fired(1, 0));
        assert_eq!(sim.occurrences("a"), vec![T0 + at + 1000]);
        let late = at < 6000;
        let counted = a.effects.contains(&misfired(Misfire::FireAll));
        assert_eq!(counted, late, "a misfire is counted only past the grace");
    }
    let scheduled: Vec<i64> = sim
        .runs_of("a")
        .iter()
        .map(|r| r.id.scheduled_at_ms - T0)
        .collect();
    assert_eq!(scheduled, vec![1000, 2000, 3000, 4000, 5000, 6000]);
    assert_eq!(
        sim.run(&rid("a", T0 + 6000)).note,
        "",
        "500 ms late is inside the grace"
    );
    assert_eq!(sim.due(T0 + 6500), vec![]);
}

#[test]
fn misfire_fire_once_coalesces_into_one_run_for_the_latest_due_occurrence() {
    let (sim, a) = late_fire(Misfire::FireOnce);
    assert_eq!(a.response, fired(1, 0));
    assert_eq!(a.effects.first(), Some(&misfired(Misfire::FireOnce)));
    let runs = sim.runs_of("a");
    assert_eq!(runs.len(), 1);
    assert_eq!(
        (runs[0].id.scheduled_at_ms, runs[0].state),
        (T0 + 6000, RunState::Pending)
    );
    assert!(
        runs[0].note.contains("coalesced 6 missed"),
        "{}",
        runs[0].note
    );
    assert_eq!(sim.occurrences("a"), vec![T0 + 7000]);
    assert_eq!(sim.job("a").next_fire_at_ms, Some(T0 + 7000));
}

#[test]
fn misfire_skip_skips_only_what_is_past_the_grace_window() {
    // Due: 1000..=6000 at 6500 with a 1000 ms grace. 1000..=5000 are past
    // the window and skipped; 6000 (500 ms late) is inside it and runs.
    let (mut sim, a) = late_fire(Misfire::Skip);
    let runs = sim.runs_of("a");
    assert_eq!(runs.len(), 1);
    assert_eq!(
        (runs[0].id.scheduled_at_ms, runs[0].state),
        (T0 + 1000, RunState::Skipped)
    );
    assert_eq!(
        runs[0].note,
        format!(
            "misfire skip: 5 occurrence(s) from {} to {} not run",
            T0 + 1000,
            T0 + 5000
        )
    );
    assert!(!a.effects.iter().any(|e| matches!(e, Effect::Ready { .. })));
    let skipped = finished(&rid("a", T0 + 1000), 1, "", RunState::Skipped);
    assert_eq!(
        a.effects,
        vec![
            misfired(Misfire::Skip),
            skipped,
            Effect::Scheduled(occ("a", T0 + 6000))
        ]
    );
    assert_eq!(sim.job("a").active_runs, 0);
    assert_eq!(sim.occurrences("a"), vec![T0 + 6000]);

    let b = sim.fire(T0 + 6500, vec![occ("a", T0 + 6000)]);
    assert_eq!(b.response, fired(1, 0));
    let inside = sim.run(&rid("a", T0 + 6000));
    assert_eq!(
        (inside.state, inside.note.as_str()),
        (RunState::Pending, "")
    );
    assert_eq!(sim.occurrences("a"), vec![T0 + 7000]);
}

#[test]
fn misfire_skip_with_nothing_inside_the_window_moves_to_the_future() {
    let mut sim = sim_with(with_misfire(every("a", 1000), Misfire::Skip, 100));
    sim.fire(T0 + 6500, vec![occ("a", T0 + 1000)]);
    let runs = sim.runs_of("a");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].state, RunState::Skipped);
    assert!(runs[0].note.contains("6 occurrence(s)"), "{}", runs[0].note);
    assert_eq!(sim.occurrences("a"), vec![T0 + 7000]);
}

#[test]
fn late_fire_inside_the_grace_window_runs_normally_under_every_policy() {
    for misfire in [Misfire::FireAll, Misfire::FireOnce, Misfire::Skip] {
        let mut sim = sim_with(with_misfire(every("a", 1000), misfire, 1000));
        sim.fire(T0 + 1900, vec![occ("a", T0 + 1000)]);

        let runs = sim.runs_of("a");
        assert_eq!(runs.len(), 1, "{misfire:?}");
        assert_eq!(
            (runs[0].id.scheduled_at_ms, runs[0].state),
            (T0 + 1000, RunState::Pending)
        );
        assert_eq!(runs[0].note, "", "{misfire:?}");
        assert_eq!(sim.occurrences("a"), vec![T0 + 2000], "{misfire:?}");
    }
}

// ------------------------------------------------------------------ one-shots

#[test]
fn one_shot_at_fires_once_and_leaves_no_next_entry() {
    let mut sim = sim_with(spec("a", ScheduleInput::At { at_ms: T0 + 5000 }));
    assert_eq!(sim.occurrences("a"), vec![T0 + 5000]);

    let a = sim.fire(T0 + 5000, vec![occ("a", T0 + 5000)]);
    assert_eq!(a.response, fired(1, 0));
    assert_eq!(sim.run(&rid("a", T0 + 5000)).state, RunState::Pending);
    assert_eq!(sim.wheel(), vec![]);
    assert_eq!(sim.job("a").next_fire_at_ms, None);
    assert!(!a.effects.iter().any(|e| matches!(e, Effect::Scheduled(_))));
}

#[test]
fn one_shot_after_resolves_from_command_now() {
    let mut sim = Sim::default();
    sim.create(spec("a", ScheduleInput::After { after_ms: 3000 }), T0 + 100);
    assert_eq!(sim.job("a").schedule, Schedule::Once { at_ms: T0 + 3100 });
    assert_eq!(sim.occurrences("a"), vec![T0 + 3100]);

    sim.fire_due(T0 + 3100);
    assert_eq!(sim.runs_of("a").len(), 1);
    assert_eq!(sim.wheel(), vec![]);
    assert_eq!(sim.job("a").next_fire_at_ms, None);
}

// ------------------------------------------------------------------ validation

#[test]
fn each_invalid_spec_is_refused_naming_its_field_with_no_writes() {
    type Breaker = fn(&mut JobSpec);
    let cases: Vec<(&str, Breaker)> = vec![
        ("id:", |s| s.id = String::new()),
        ("id:", |s| s.id = "a@b".into()),
        ("id:", |s| s.id = "x".repeat(limits::ID_MAX_BYTES + 1)),
        ("group:", |s| s.group = String::new()),
        ("payload:", |s| {
            s.payload = vec![0; limits::PAYLOAD_MAX_BYTES + 1]
        }),
        ("schedule.every", |s| {
            s.schedule = ScheduleInput::Every { every_ms: 0 }
        }),
        ("schedule.at", |s| {
            s.schedule = ScheduleInput::At {
                at_ms: T0 + 5000 - 61_000,
            }
        }),
        ("schedule.cron.expr", |s| {
            s.schedule = ScheduleInput::Cron {
                expr: "not a cron".into(),
                tz: String::new(),
            }
        }),
        ("schedule.cron.tz", |s| {
            s.schedule = ScheduleInput::Cron {
                expr: "* * * * *".into(),
                tz: "Mars/Olympus".into(),
            }
        }),
        ("priority:", |s| s.policy.priority = 0),
        ("priority:", |s| s.policy.priority = 11),
        ("max_attempts:", |s| s.policy.max_attempts = 0),
    ];
    let mut sim = Sim::default();
    for (field, breaker) in cases {
        let mut bad = every("a", 1000);
        breaker(&mut bad);
        // A later now, so even the state-machine clock must stay put.
        let a = sim.exec(Command::CreateJob {
            spec: bad,
            now_ms: T0 + 5000,
        });
        let msg = invalid_msg(&a);
        assert!(msg.starts_with(field), "{field} not named first in {msg:?}");
        assert_nothing_done(&a);
    }
    assert_eq!(sim.view, MemView::default());
}

#[test]
fn duplicate_create_is_refused_without_writes() {
    let mut sim = sim_with(every("a", 1000));
    let a = sim.exec(Command::CreateJob {
        spec: every("a", 5),
        now_ms: T0 + 1,
    });
    assert_refused(&a, CommandError::AlreadyExists("a".into()));
}

#[test]
fn update_with_wrong_revision_is_refused_without_writes() {
    let mut sim = sim_with(every("a", 1000));
    let a = sim.exec(update(every("a", 5), 7, T0 + 1));
    let want = CommandError::RevisionMismatch {
        id: "a".into(),
        expected: 7,
        actual: 1,
    };
    assert_refused(&a, want);
}

#[test]
fn commands_on_an_unknown_job_are_not_found_without_writes() {
    let mut sim = sim_with(every("a", 1000));
    let (id, now_ms) = ("nope".to_string(), T0 + 1);
    for cmd in [
        Command::DeleteJob {
            id: id.clone(),
            now_ms,
        },
        Command::PauseJob {
            id: id.clone(),
            now_ms,
        },
        Command::ResumeJob {
            id: id.clone(),
            now_ms,
        },
        Command::TriggerJob {
            id: id.clone(),
            now_ms,
            widths: vec![],
        },
    ] {
        assert_refused(&sim.exec(cmd), CommandError::NotFound(id.clone()));
    }
}

// ------------------------------------------------------------------ determinism and time

/// A long mixed history: four jobs of different shapes, fires of whatever
/// is due, finishes of every ready attempt (some failing), an update, a
/// pause/resume, a trigger, a delete and a command carrying an old `now`.
fn history(sim: &mut Sim) -> Vec<Applied> {
    let mut forbid_retry = with_overlap(every("b", 700), Overlap::Forbid);
    forbid_retry.policy.max_attempts = 2;
    let mut out = vec![
        sim.create(every("a", 1000), T0),
        sim.create(forbid_retry, T0),
        sim.create(spec("c", ScheduleInput::At { at_ms: T0 + 2500 }), T0),
        sim.create(
            spec(
                "d",
                ScheduleInput::Cron {
                    expr: "*/2 * * * * *".into(),
                    tz: "Europe/Paris".into(),
                },
            ),
            T0,
        ),
    ];
    let mut ready: Vec<(RunId, u32)> = Vec::new();
    for step in 1..=60i64 {
        let now = T0 + step * 250;
        let from = out.len();
        for (i, (run, attempt)) in std::mem::take(&mut ready).into_iter().enumerate() {
            let ok = (step + i as i64) % 3 != 0;
            out.push(sim.finish(now, report(&run, attempt, ok, step as u64 * 37)));
        }
        out.push(sim.fire_due(now));
        let extra = match step {
            10 => update(every("a", 1500), 0, now),
            20 => Command::PauseJob {
                id: "d".into(),
                now_ms: now,
            },
            25 => Command::ResumeJob {
                id: "d".into(),
                now_ms: now,
            },
            30 => trigger("a", now),
            40 => Command::DeleteJob {
                id: "b".into(),
                now_ms: now,
            },
            // An old now must not make the next step's keys fire early.
            45 => Command::Fire {
                now_ms: T0,
                keys: sim.due(now + 250),
                widths: vec![],
            },
            _ => Command::Fire {
                now_ms: now,
                keys: vec![],
                widths: vec![],
            },
        };
        out.push(sim.exec(extra));
        for a in &out[from..] {
            for e in &a.effects {
                if let Effect::Ready(r) = e {
                    ready.push((r.run.clone(), r.attempt));
                }
            }
        }
    }
    out
}

#[test]
fn same_commands_on_two_replicas_give_byte_identical_state() {
    let (mut one, mut two) = (Sim::default(), Sim::default());
    let (out_one, out_two) = (history(&mut one), history(&mut two));

    assert_eq!(out_one, out_two, "responses, writes and effects");
    assert_eq!(one.view.map, two.view.map);
    let runs = ["a", "b", "c", "d"].map(|j| one.runs_of(j).len());
    assert!(
        runs.iter().all(|&n| n > 0) && runs.iter().sum::<usize>() > 30,
        "{runs:?}"
    );
    // The wheel invariant survived: one occurrence per live job, at next_fire_at_ms.
    for id in ["a", "d"] {
        let next = one.job(id).next_fire_at_ms;
        assert_eq!(
            one.occurrences(id),
            next.into_iter().collect::<Vec<_>>(),
            "{id}"
        );
        assert!(next.is_some(), "{id}");
    }
    assert_eq!(one.try_job("b"), None);
    assert_eq!(one.occurrences("b"), Vec::<i64>::new());
    assert_eq!(one.job("c").next_fire_at_ms, None);
}

#[test]
fn state_time_never_goes_back_when_a_command_carries_an_older_now() {
    let mut sim = sim_with(every("a", 60_000));
    let a = sim.exec(trigger("a", T0 + 5000));
    assert_eq!(state_time(&sim.view), T0 + 5000);
    assert!(a
        .writes
        .iter()
        .any(|w| matches!(w, Write::Put(k, _) if k == keys::META_TIME)));

    let older = sim.exec(trigger("a", T0 + 1000));
    assert_eq!(state_time(&sim.view), T0 + 5000);
    assert!(!older
        .writes
        .iter()
        .any(|w| matches!(w, Write::Put(k, _) | Write::Delete(k) if k == keys::META_TIME)));
    // The older command runs at state-machine time, not at its own stale now.
    assert!(matches!(
        older.response,
        Response::Error(CommandError::FailedPrecondition(_))
    ));
    assert_eq!(sim.try_run(&rid("a", T0 + 1000)), None);

    sim.fire(T0, vec![]);
    assert_eq!(state_time(&sim.view), T0 + 5000);
}

// ------------------------------------------------------------------ execution

/// Job "a" (every 60 s, `max_attempts` 3, backoff 1 s) with its first run pending at T0+60s.
fn retrying_job() -> (Sim, RunId) {
    let mut s = every("a", 60_000);
    s.policy.max_attempts = 3;
    s.policy.backoff_ms = 1000;
    let mut sim = sim_with(s);
    sim.fire(T0 + 60_000, vec![occ("a", T0 + 60_000)]);
    (sim, rid("a", T0 + 60_000))
}

#[test]
fn finish_success_ends_the_run_and_frees_the_job() {
    let (mut sim, r) = retrying_job();
    let now = T0 + 60_500;
    let a = sim.finish(now, report(&r, 1, true, 0));

    assert_eq!(a.response, Response::Batch(vec![Ok(())]));
    let succeeded = finished(&r, 1, "w1", RunState::Succeeded);
    assert_eq!(a.effects, vec![succeeded, ended(&r, 1)]);
    let run = sim.run(&r);
    assert_eq!(
        (run.state, run.finished_at_ms, run.result),
        (RunState::Succeeded, now, b"r".to_vec())
    );
    assert_eq!(sim.job("a").active_runs, 0);
    assert_eq!(sim.view.get(&keys::active(&r)), None);
}

/// The one Retry entry in the wheel.
fn retry_entry(sim: &Sim) -> WheelKey {
    let mut retries = sim
        .wheel()
        .into_iter()
        .filter(|k| k.kind == EntryKind::Retry);
    let key = retries.next().expect("a retry entry");
    assert_eq!(retries.next(), None, "one retry entry per waiting run");
    key
}

/// Attempts 1 and 2 end by `fail` and are retried after their backoff
/// (1 s, then 2 s, plus at most half again of jitter); attempt 3 ends the run as `last`.
fn retries_until(last: RunState, fail: fn(&mut Sim, &RunId, u32, i64) -> Applied) {
    let (mut sim, r) = retrying_job();
    let mut now = T0 + 60_500;
    for attempt in 1..=2 {
        let a = fail(&mut sim, &r, attempt, now);
        let retry = retry_entry(&sim);
        assert_eq!(retry, WheelKey::retry(&r, retry.fire_at_ms));
        let backoff = 1000i64 << (attempt - 1);
        let window = now + backoff..=now + backoff + backoff / 2;
        assert!(
            window.contains(&retry.fire_at_ms),
            "{retry:?} outside {window:?}"
        );
        let scheduled = Effect::Scheduled(retry.clone());
        assert_eq!(a.effects, vec![ended(&r, attempt), scheduled]);
        assert_eq!(sim.run(&r).state, RunState::RetryWait);
        assert_eq!(
            sim.job("a").active_runs,
            1,
            "a run waiting to retry is active"
        );

        let early = sim.fire(retry.fire_at_ms - 1, vec![retry.clone()]);
        assert_eq!(early.response, fired(0, 1));
        now = retry.fire_at_ms;
        let a = sim.fire(now, vec![retry.clone()]);
        assert_eq!(a.response, fired(1, 0));
        assert_eq!(
            a.effects,
            vec![ready(
                &r,
                attempt + 1,
                limits::DEFAULT_TIMEOUT_MS,
                sim.run(&r).fired_at_ms
            )]
        );
        let run = sim.run(&r);
        assert_eq!((run.state, run.attempt), (RunState::Pending, attempt + 1));
        assert!(!sim.has_entry(&retry));
        now += 300;
    }
    let a = fail(&mut sim, &r, 3, now);
    let run = sim.run(&r);
    // The finish names its worker; an expired attempt never assigned has none.
    let ended_as = finished(&r, 3, &run.worker, last);
    assert_eq!(a.effects, vec![ended_as, ended(&r, 3)]);
    assert_eq!((run.state, run.attempt, run.finished_at_ms), (last, 3, now));
    assert_eq!(sim.job("a").active_runs, 0);
    assert!(sim.wheel().iter().all(|k| k.kind == EntryKind::Occurrence));
}

#[test]
fn retryable_failures_back_off_retry_and_end_failed_after_the_last_attempt() {
    retries_until(RunState::Failed, |sim, r, attempt, now| {
        let a = sim.finish(now, report(r, attempt, false, 12_345));
        assert_eq!(a.response, Response::Batch(vec![Ok(())]));
        a
    });
}

#[test]
fn attempts_the_worker_timed_out_retry_and_end_timed_out_not_failed() {
    retries_until(RunState::TimedOut, |sim, r, attempt, now| {
        let mut rep = report(r, attempt, false, 12_345);
        rep.timed_out = true;
        let a = sim.finish(now, rep);
        assert_eq!(a.response, Response::Batch(vec![Ok(())]));
        a
    });
}

#[test]
fn expired_attempts_retry_the_same_way_and_end_timed_out() {
    retries_until(RunState::TimedOut, |sim, r, attempt, now| {
        let mut a = sim.exec(Command::Expire {
            now_ms: now,
            expired: vec![(r.clone(), attempt, 999_999)],
        });
        assert_eq!(a.response, Response::Batch(vec![Ok(())]));
        // An expired attempt is first cancelled on whatever worker still holds it.
        let cancel = Effect::Cancel {
            run: r.clone(),
            attempt,
        };
        assert_eq!(a.effects.first(), Some(&cancel));
        a.effects.remove(0);
        a
    });
}

#[test]
fn finish_of_a_stale_attempt_is_refused_without_writes() {
    let (mut sim, r) = retrying_job();
    sim.finish(T0 + 60_100, report(&r, 1, false, 0));
    let retry = retry_entry(&sim);
    sim.fire(retry.fire_at_ms, vec![retry.clone()]);

    let a = sim.finish(retry.fire_at_ms, report(&r, 1, true, 0));
    let stale = CommandError::StaleAttempt {
        run: r.to_string(),
        current: 2,
        reported: 1,
        state: "pending".into(),
    };
    assert_eq!(a.response, Response::Batch(vec![Err(stale)]));
    assert_nothing_done(&a);
}

#[test]
fn finish_of_an_unknown_run_is_run_not_found() {
    let (mut sim, _) = retrying_job();
    let ghost = rid("a", T0 + 1);
    let a = sim.finish(T0 + 60_000, report(&ghost, 1, true, 0));
    assert_eq!(
        a.response,
        Response::Batch(vec![Err(CommandError::RunNotFound(ghost.to_string()))])
    );
    assert_nothing_done(&a);
}

#[test]
fn duplicate_finish_of_an_ended_attempt_is_ok_and_changes_nothing() {
    let (mut sim, r) = retrying_job();
    sim.finish(T0 + 60_500, report(&r, 1, true, 0));
    let before = sim.view.clone();

    let a = sim.finish(T0 + 60_500, report(&r, 1, false, 0));
    assert_eq!(a.response, Response::Batch(vec![Ok(())]));
    assert_nothing_done(&a);
    assert_eq!(sim.view, before);
}

// ------------------------------------------------------------------ overlap

/// Job "a" every 1 s under `overlap`, with its first occurrence (T0+1000) fired and still active.
fn busy_job(overlap: Overlap) -> Sim {
    let mut sim = sim_with(with_overlap(every("a", 1000), overlap));
    sim.fire(T0 + 1000, vec![occ("a", T0 + 1000)]);
    sim
}

#[test]
fn overlap_forbid_records_the_next_occurrence_skipped_while_a_run_is_active() {
    let mut sim = busy_job(Overlap::Forbid);
    let a = sim.fire(T0 + 2000, vec![occ("a", T0 + 2000)]);

    let skipped = sim.run(&rid("a", T0 + 2000));
    assert_eq!(skipped.state, RunState::Skipped);
    assert!(skipped.note.contains("overlap forbid"), "{}", skipped.note);
    let recorded = finished(&skipped.id, 1, "", RunState::Skipped);
    assert_eq!(
        a.effects,
        vec![recorded, Effect::Scheduled(occ("a", T0 + 3000))]
    );
    assert_eq!(sim.active_runs("a").len(), 1);
    assert_eq!(sim.job("a").active_runs, 1);
}

#[test]
fn overlap_buffer_one_starts_the_held_occurrence_when_the_active_run_ends() {
    let mut sim = busy_job(Overlap::BufferOne);
    sim.fire(T0 + 2000, vec![occ("a", T0 + 2000)]);
    assert_eq!(sim.try_run(&rid("a", T0 + 2000)), None);
    assert_eq!(sim.job("a").buffered_at_ms, Some(T0 + 2000));

    let a = sim.finish(T0 + 2500, report(&rid("a", T0 + 1000), 1, true, 0));
    let started = rid("a", T0 + 2000);
    let first = rid("a", T0 + 1000);
    let first_ended = ended(&first, 1);
    let started_ready = ready(&started, 1, limits::DEFAULT_TIMEOUT_MS, T0 + 2500);
    let succeeded = finished(&first, 1, "w1", RunState::Succeeded);
    assert_eq!(a.effects, vec![succeeded, first_ended, started_ready]);
    let run = sim.run(&started);
    assert_eq!((run.state, run.fired_at_ms), (RunState::Pending, T0 + 2500));
    assert!(run.note.contains("buffer-one"), "{}", run.note);
    let job = sim.job("a");
    assert_eq!((job.active_runs, job.buffered_at_ms), (1, None));
    assert_eq!(sim.active_runs("a").len(), 1);
}

#[test]
fn overlap_replace_before_log_format_4_cancels_the_active_run_and_starts_the_new_one_at_once() {
    let mut sim = busy_job(Overlap::Replace);
    let a = sim.fire(T0 + 2000, vec![occ("a", T0 + 2000)]);

    let (old, new) = (rid("a", T0 + 1000), rid("a", T0 + 2000));
    assert_eq!(
        a.effects,
        vec![
            Effect::Cancel {
                run: old.clone(),
                attempt: 1
            },
            ended(&old, 1),
            finished(&old, 1, "", RunState::Cancelled),
            ready(&new, 1, limits::DEFAULT_TIMEOUT_MS, T0 + 2000),
            Effect::Scheduled(occ("a", T0 + 3000)),
        ]
    );
    assert_eq!(sim.run(&old).state, RunState::Cancelled);
    assert_eq!(sim.run(&new).state, RunState::Pending);
    assert_eq!(sim.active_runs("a").len(), 1);
    assert_eq!(sim.job("a").active_runs, 1);
}

// ------------------------------------------------------------------ manual trigger

#[test]
fn trigger_runs_now_with_a_note_and_keeps_next_fire() {
    let mut sim = sim_with(every("a", 60_000));
    let a = sim.exec(trigger("a", T0 + 5000));

    let run = sim.run(&rid("a", T0 + 5000));
    assert_eq!(a.response, Response::Run(run.clone()));
    assert_eq!(
        (run.state, run.fired_at_ms, run.note.as_str()),
        (RunState::Pending, T0 + 5000, "manual trigger")
    );
    assert_eq!(
        a.effects,
        vec![ready(&run.id, 1, limits::DEFAULT_TIMEOUT_MS, T0 + 5000)]
    );
    assert_eq!(sim.job("a").next_fire_at_ms, Some(T0 + 60_000));
    assert_eq!(sim.wheel(), vec![occ("a", T0 + 60_000)]);
}

// ------------------------------------------------------------------ regressions

#[test]
fn retry_entry_orphaned_by_a_cancel_does_not_fire_a_later_attempt_early() {
    let mut s = with_overlap(every("a", 3_600_000), Overlap::Replace);
    s.policy.max_attempts = 3;
    s.policy.backoff_ms = 10_000;
    let mut sim = sim_with(s);
    let first = rid("a", T0 + 1000);
    sim.exec(trigger("a", T0 + 1000));
    sim.finish(T0 + 1100, report(&first, 1, false, 0)); // retry at T0+11_100
    let orphan = WheelKey::retry(&first, T0 + 11_100);
    assert!(sim.has_entry(&orphan));
    // Replace cancels the waiting run; its retry entry stays in the wheel.
    sim.exec(trigger("a", T0 + 2000));
    assert_eq!(sim.run(&first).state, RunState::Cancelled);
    // A manual retry, failing again, waits 20 s this time: until T0+22_200.
    sim.exec(Command::RetryRun {
        run: first.clone(),
        now_ms: T0 + 2100,
    });
    sim.finish(T0 + 2200, report(&first, 2, false, 0));
    assert!(sim.has_entry(&WheelKey::retry(&first, T0 + 22_200)));

    let a = sim.fire(T0 + 11_100, vec![orphan]);
    assert_eq!(a.response, fired(0, 1));
    let run = sim.run(&first);
    assert_eq!(
        (run.state, run.attempt),
        (RunState::RetryWait, 2),
        "attempt 3 started 11.1 s early"
    );
}

#[test]
fn update_of_a_fired_after_job_without_a_new_schedule_does_not_fire_it_again() {
    let mut sim = sim_with(spec("a", ScheduleInput::After { after_ms: 1000 }));
    sim.fire_due(T0 + 1000);
    let mut s = spec("a", ScheduleInput::After { after_ms: 1000 });
    s.payload = b"new".to_vec();
    sim.exec(update(s, 0, T0 + 100_000));

    assert_eq!(
        sim.job("a").next_fire_at_ms,
        None,
        "the one-shot was re-armed"
    );
    assert_eq!(sim.wheel(), vec![]);
}

#[test]
fn update_keeping_a_past_at_schedule_is_accepted() {
    let mut sim = sim_with(spec("a", ScheduleInput::At { at_ms: T0 + 5000 }));
    sim.fire_due(T0 + 5000);
    let mut s = spec("a", ScheduleInput::At { at_ms: T0 + 5000 });
    s.payload = b"new".to_vec();
    let a = sim.exec(update(s, 0, T0 + 100_000));

    assert!(matches!(a.response, Response::Job(_)), "{:?}", a.response);
    assert_eq!(sim.job("a").payload, b"new".to_vec());
    assert_eq!(sim.job("a").next_fire_at_ms, None);
}

// ------------------------------------------------------------------ shards and broadcast

fn with_fanout(mut s: JobSpec, fanout: Fanout) -> JobSpec {
    s.policy.fanout = fanout;
    s
}

fn ready_runs(a: &Applied) -> Vec<RunId> {
    a.effects
        .iter()
        .filter_map(|e| match e {
            Effect::Ready(r) => Some(r.run.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_sharded_occurrence_creates_one_run_per_shard_each_retried_alone() {
    let mut s = with_fanout(every("sh", 1000), Fanout::Shards(4));
    s.policy.max_attempts = 2;
    let mut sim = sim_with(s);
    let a = sim.fire_due(T0 + 1000);
    assert_eq!(a.response, fired(1, 0));
    let want: Vec<RunId> = (0..4).map(|i| RunId::shard("sh", T0 + 1000, i)).collect();
    assert_eq!(ready_runs(&a), want);
    for id in &want {
        let r = sim.run(id);
        assert_eq!((r.state, r.shard_count), (RunState::Pending, 4), "{id}");
    }
    assert_eq!(sim.job("sh").active_runs, 4);
    // Shard 2 fails: only it waits for a retry; the others are untouched.
    let a = sim.finish(T0 + 1100, report(&want[2], 1, false, 0));
    assert_eq!(a.response, Response::Batch(vec![Ok(())]));
    let retry = retry_entry(&sim);
    assert_eq!(retry.run_id(), want[2]);
    let a = sim.fire(retry.fire_at_ms, vec![retry.clone()]);
    assert_eq!(ready_runs(&a), vec![want[2].clone()]);
    assert_eq!(sim.run(&want[2]).attempt, 2);
    assert_eq!(sim.run(&want[1]).attempt, 1);
    // Deleting the job cancels every active shard.
    sim.exec(Command::DeleteJob {
        id: "sh".into(),
        now_ms: T0 + 1200,
    });
    for id in &want {
        assert_eq!(sim.run(id).state, RunState::Cancelled, "{id}");
    }
    assert!(sim.active_runs("sh").is_empty());
}

#[test]
fn broadcast_width_comes_from_the_fire_command_so_replicas_agree() {
    let spec = with_fanout(every("bc", 1000), Fanout::Broadcast);
    let fire = |widths: Vec<(String, u32)>| Command::Fire {
        now_ms: T0 + 1000,
        keys: vec![occ("bc", T0 + 1000)],
        widths,
    };
    let mut a = sim_with(spec.clone());
    let mut b = sim_with(spec.clone());
    let widths = vec![("g".to_string(), 3), ("other".to_string(), 9)];
    let ra = a.exec(fire(widths.clone()));
    let rb = b.exec(fire(widths));
    assert_eq!(ra, rb);
    assert_eq!(a.view, b.view);
    assert_eq!(ready_runs(&ra).len(), 3);
    assert_eq!(a.run(&RunId::shard("bc", T0 + 1000, 2)).shard_count, 3);
    // No connected worker: one run still records the occurrence and waits.
    let mut c = sim_with(spec);
    assert_eq!(
        ready_runs(&c.exec(fire(vec![]))),
        vec![rid("bc", T0 + 1000)]
    );
}

#[test]
fn forbid_skips_the_next_occurrence_while_any_shard_is_active() {
    let spec = with_overlap(
        with_fanout(every("f", 1000), Fanout::Shards(2)),
        Overlap::Forbid,
    );
    let mut sim = sim_with(spec);
    sim.fire_due(T0 + 1000);
    sim.finish(
        T0 + 1500,
        report(&RunId::shard("f", T0 + 1000, 0), 1, true, 0),
    );
    let a = sim.fire_due(T0 + 2000);
    assert!(ready_runs(&a).is_empty(), "shard 1 is still active");
    let skipped = sim.run(&rid("f", T0 + 2000));
    assert_eq!(skipped.state, RunState::Skipped);
    assert!(skipped.note.contains("overlap forbid"), "{skipped:?}");
    sim.finish(
        T0 + 2500,
        report(&RunId::shard("f", T0 + 1000, 1), 1, true, 0),
    );
    assert_eq!(ready_runs(&sim.fire_due(T0 + 3000)).len(), 2);
}

#[test]
fn runs_after_pages_through_shards_without_skipping_any() {
    let mut sim = sim_with(with_fanout(every("p", 1000), Fanout::Shards(3)));
    sim.fire_due(T0 + 1000);
    sim.fire_due(T0 + 2000);
    let mut seen = Vec::new();
    let mut after: Option<RunId> = None;
    loop {
        let page = query::runs_after(&sim.view, "p", after.as_ref(), 2);
        seen.extend(page.iter().map(|r| r.id.clone()));
        match page.last() {
            Some(last) if page.len() == 2 => after = Some(last.id.clone()),
            _ => break,
        }
    }
    let want: Vec<RunId> = [T0 + 1000, T0 + 2000]
        .iter()
        .flat_map(|t| (0..3).map(move |i| RunId::shard("p", *t, i)))
        .collect();
    assert_eq!(seen, want);
}

#[test]
fn manual_retry_of_a_finished_run_starts_its_next_attempt_and_refuses_an_active_one() {
    let mut sim = sim_with(every("m", 1000));
    sim.fire_due(T0 + 1000);
    let id = rid("m", T0 + 1000);
    let retry = || Command::RetryRun {
        run: rid("m", T0 + 1000),
        now_ms: T0 + 1500,
    };
    let a = sim.exec(retry());
    assert!(
        matches!(&a.response, Response::Error(CommandError::FailedPrecondition(m)) if m.contains("only a finished run")),
        "{:?}",
        a.response
    );
    assert_nothing_done(&a);
    sim.finish(T0 + 1200, report(&id, 1, true, 0));
    let a = sim.exec(retry());
    assert_eq!(ready_runs(&a), vec![id.clone()]);
    let r = sim.run(&id);
    assert_eq!((r.state, r.attempt), (RunState::Pending, 2));
    assert!(
        r.result.is_empty() && r.worker.is_empty(),
        "old outcome cleared: {r:?}"
    );
}

#[test]
fn history_keeps_the_newest_records_per_job_and_never_an_active_run() {
    let mut sim = Sim::default();
    // Grace 0 with misfire skip: every late fire records one skipped (finished) run.
    sim.create(with_misfire(every("h", 1000), Misfire::Skip, 0), T0);
    let max = limits::KEEP_RUNS_DEFAULT;
    for _ in 0..max + 5 {
        let at = sim.job("h").next_fire_at_ms.unwrap();
        sim.fire(at + 1, vec![occ("h", at)]);
    }
    let runs = sim.runs_of("h");
    assert_eq!(runs.len() as u64, max);
    assert_eq!(sim.job("h").history_len, max);
    assert_eq!(
        runs[0].id.scheduled_at_ms,
        T0 + 6 * 1000,
        "the five oldest records went"
    );
    // An active oldest run pins the history: nothing older than it is deleted past it.
    let mut sim = Sim::default();
    sim.create(every("p", 1000), T0);
    sim.fire(T0 + 1000, vec![occ("p", T0 + 1000)]);
    let first = rid("p", T0 + 1000);
    assert_eq!(sim.run(&first).state, RunState::Pending);
    for _ in 0..max + 2 {
        let at = sim.job("p").next_fire_at_ms.unwrap();
        sim.fire(at, vec![occ("p", at)]);
    }
    assert_eq!(
        sim.run(&first).state,
        RunState::Pending,
        "an active run is never trimmed"
    );
}

#[test]
fn a_batch_applies_each_command_as_if_alone() {
    let mut sim = Sim::default();
    let create = |id: &str| Command::CreateJob {
        spec: every(id, 1000),
        now_ms: T0,
    };
    let a = sim.exec(Command::Batch {
        commands: vec![create("a"), create("a"), create("b")],
    });
    let Response::Many(rs) = &a.response else {
        panic!("{:?}", a.response)
    };
    assert!(matches!(rs[0], Response::Job(_)));
    assert_eq!(
        rs[1],
        Response::Error(CommandError::AlreadyExists("a".into()))
    );
    assert!(matches!(rs[2], Response::Job(_)));
    assert_eq!((sim.job("a").revision, sim.job("b").revision), (1, 1));
    // The same commands one by one give the same state.
    let mut alone = Sim::default();
    for c in [create("a"), create("a"), create("b")] {
        alone.exec(c);
    }
    assert_eq!(alone.view, sim.view);
    let nested = Command::Batch {
        commands: vec![Command::Batch { commands: vec![] }],
    };
    let a = sim.exec(nested);
    assert!(invalid_msg(&a).contains("a batch cannot contain a batch"));
    assert_nothing_done(&a);
}

// ------------------------------------------------------------------ totality

#[test]
fn an_at_schedule_at_the_start_of_time_is_refused_not_a_panic() {
    let mut sim = sim_with(every("a", 1000));
    let far_past = spec("a", ScheduleInput::At { at_ms: i64::MIN });
    let a = sim.exec(update(far_past.clone(), 0, T0));
    assert!(
        invalid_msg(&a).starts_with("schedule.at: -9223372036854775808 is "),
        "{}",
        invalid_msg(&a)
    );
    assert_nothing_done(&a);
    let mut fresh = Sim::default();
    let a = fresh.exec(Command::CreateJob {
        spec: far_past,
        now_ms: i64::MAX,
    });
    assert!(invalid_msg(&a).starts_with("schedule.at:"));
    assert_nothing_done(&a);
}

#[test]
fn a_misfire_walk_at_the_end_of_time_coalesces_without_overflow() {
    let mut sim = sim_with(with_misfire(every("a", 1000), Misfire::FireOnce, 0));
    let a = sim.fire(i64::MAX, vec![occ("a", T0 + 1000)]);
    assert_eq!(a.response, fired(1, 0));
    let ran = ready_runs(&a);
    assert_eq!(ran.len(), 1);
    let last = T0 + 1000 + (i64::MAX - T0 - 1000) / 1000 * 1000;
    assert_eq!(ran[0], rid("a", last), "the latest due occurrence runs");
    assert_eq!(
        sim.job("a").next_fire_at_ms,
        None,
        "no occurrence fits after the end of time"
    );
    assert_eq!(sim.occurrences("a"), Vec::<i64>::new());
}

// ------------------------------------------------------------------ bounded work per command

#[test]
fn an_expire_of_more_attempts_than_the_cap_is_refused_without_writes() {
    let (mut sim, run) = retrying_job();
    let expired = vec![(run.clone(), 1, 0); limits::EXPIRE_BATCH_MAX + 1];
    let a = sim.exec(Command::Expire {
        now_ms: T0 + 61_000,
        expired,
    });
    assert_eq!(
        invalid_msg(&a),
        format!(
            "expired: at most {} per command, got {}",
            limits::EXPIRE_BATCH_MAX,
            limits::EXPIRE_BATCH_MAX + 1
        )
    );
    assert_nothing_done(&a);
    assert_eq!(sim.run(&run).state, RunState::Pending);
}

#[test]
fn a_cron_expression_that_never_matches_is_refused_at_validation() {
    for expr in ["0 0 30 2 *", "0 0 31 4 *", "0 0 0 1 1 * 2020"] {
        let mut sim = Sim::default();
        let cron = ScheduleInput::Cron {
            expr: expr.into(),
            tz: "Europe/Berlin".into(),
        };
        let a = sim.exec(Command::CreateJob {
            spec: spec("a", cron),
            now_ms: T0,
        });
        assert!(
            invalid_msg(&a).starts_with("schedule.cron.expr: never matches"),
            "{expr}: {}",
            invalid_msg(&a)
        );
        assert_nothing_done(&a);
    }
    // Rare is not never: February 29 comes back.
    let mut sim = Sim::default();
    let leap = ScheduleInput::Cron {
        expr: "0 0 29 2 *".into(),
        tz: String::new(),
    };
    sim.create(spec("a", leap), T0);
    assert!(sim.job("a").next_fire_at_ms.is_some());
}

#[test]
fn fire_once_past_the_walk_cap_runs_the_latest_due_occurrence() {
    let cron = ScheduleInput::Cron {
        expr: "* * * * * *".into(),
        tz: String::new(),
    };
    let mut sim = sim_with(with_misfire(spec("s", cron), Misfire::FireOnce, 0));
    let first = sim.job("s").next_fire_at_ms.unwrap();
    let missed = 2 * limits::MISFIRE_WALK_MAX as i64;
    let now = first + missed * 1000 + 400;
    let a = sim.fire(now, vec![occ("s", first)]);
    let latest = first + missed * 1000;
    assert_eq!(ready_runs(&a), vec![rid("s", latest)]);
    assert!(
        sim.run(&rid("s", latest))
            .note
            .contains(&format!("more than {}", limits::MISFIRE_WALK_MAX)),
        "{}",
        sim.run(&rid("s", latest)).note
    );
    assert_eq!(sim.job("s").next_fire_at_ms, Some(latest + 1000));
}

#[test]
fn a_job_never_has_more_active_runs_than_the_cap_and_a_delete_cancels_them_all() {
    let sharded = with_fanout(every("x", 1000), Fanout::Shards(limits::SHARDS_MAX));
    let mut sim = sim_with(sharded);
    let full = (limits::ACTIVE_RUNS_MAX / limits::SHARDS_MAX) as i64;
    for k in 1..=full {
        let a = sim.fire(T0 + k * 1000, vec![occ("x", T0 + k * 1000)]);
        assert_eq!(ready_runs(&a).len(), limits::SHARDS_MAX as usize);
    }
    assert_eq!(sim.job("x").active_runs, limits::ACTIVE_RUNS_MAX);
    let over = T0 + (full + 1) * 1000;
    let a = sim.fire(over, vec![occ("x", over)]);
    assert_eq!(ready_runs(&a).len(), 0, "no run over the cap");
    let skipped = sim.run(&rid("x", over));
    assert_eq!(skipped.state, RunState::Skipped);
    assert!(skipped.note.contains("active runs"), "{}", skipped.note);
    assert_eq!(sim.job("x").active_runs, limits::ACTIVE_RUNS_MAX);

    let a = sim.exec(Command::DeleteJob {
        id: "x".into(),
        now_ms: over,
    });
    let cancels = a
        .effects
        .iter()
        .filter(|e| matches!(e, Effect::Cancel { .. }))
        .count();
    assert_eq!(cancels, limits::ACTIVE_RUNS_MAX as usize);
    assert_eq!(sim.active_runs("x"), vec![]);
}

// ------------------------------------------------------------------ tokens

fn token(name: &str, role: Role, groups: &[&str], hash_byte: char) -> Token {
    Token {
        name: name.into(),
        role,
        groups: groups.iter().map(|g| g.to_string()).collect(),
        hash: hash_byte.to_string().repeat(64),
        created_at_ms: 0,
    }
}

fn put_token(sim: &mut Sim, t: Token, first: bool) -> Applied {
    sim.exec(Command::PutToken {
        token: t,
        first,
        now_ms: T0,
    })
}

#[test]
fn the_first_admin_is_made_only_on_a_cluster_without_tokens() {
    let mut sim = Sim::default();
    let a = put_token(&mut sim, token("admin", Role::Admin, &[], 'a'), true);
    assert!(
        matches!(&a.response, Response::Token(t) if t.created_at_ms == T0),
        "{:?}",
        a.response
    );
    // A second node's bootstrap (another file, or a retry) changes nothing.
    let again = put_token(&mut sim, token("admin2", Role::Admin, &[], 'b'), true);
    assert!(matches!(
        &again.response,
        Response::Error(CommandError::FailedPrecondition(m)) if m.contains("already has tokens")
    ));
    assert_nothing_done(&again);
}

#[test]
fn bad_tokens_are_refused_naming_the_field_and_write_nothing() {
    let mut sim = Sim::default();
    put_token(&mut sim, token("ops", Role::Operator, &[], 'a'), false);
    let cases = [
        (
            token("ops", Role::Reader, &[], 'c'),
            "token \"ops\" already exists",
        ),
        (
            token("dup-secret", Role::Reader, &[], 'a'),
            "token.hash: another token has this secret",
        ),
        (
            token("w", Role::Worker, &[], 'd'),
            "token.groups: a worker token needs at least one group",
        ),
        (
            token("r", Role::Reader, &["g"], 'e'),
            "token.groups: only worker tokens have groups",
        ),
        (
            token("bad name", Role::Reader, &[], 'f'),
            "token.name: character ' ' not allowed",
        ),
        (
            Token {
                hash: "Z".repeat(64),
                ..token("h", Role::Reader, &[], '0')
            },
            "token.hash: must be 64 lowercase hex digits",
        ),
    ];
    for (t, want) in cases {
        let a = put_token(&mut sim, t, false);
        let msg = match &a.response {
            Response::Error(e) => e.to_string(),
            other => panic!("accepted; wanted {want:?}: {other:?}"),
        };
        assert!(msg.starts_with(want), "{msg:?} vs {want:?}");
        assert_nothing_done(&a);
    }
}

#[test]
fn revoking_a_token_removes_it_and_its_secret_index() {
    let mut sim = Sim::default();
    put_token(&mut sim, token("w", Role::Worker, &["g"], '1'), false);
    assert!(sim.view.get(&keys::token_hash(&"1".repeat(64))).is_some());
    let a = sim.exec(Command::RevokeToken {
        name: "w".into(),
        now_ms: T0,
    });
    assert_eq!(a.response, Response::Deleted(true));
    assert!(sim.view.get(&keys::token("w")).is_none());
    assert!(sim.view.get(&keys::token_hash(&"1".repeat(64))).is_none());
    let none = sim.exec(Command::RevokeToken {
        name: "w".into(),
        now_ms: T0,
    });
    assert_eq!(none.response, Response::Deleted(false));
    assert_nothing_done(&none);
}

// ------------------------------------------------------------------ request ids

fn dedup(id: &str, cmd: Command) -> Command {
    Command::Dedup {
        request_id: id.into(),
        command: Box::new(cmd),
    }
}

fn run_count(sim: &Sim, job: &str) -> usize {
    query::runs_after(&sim.view, job, None, 1000).len()
}

#[test]
fn a_retried_write_returns_the_first_response_and_acts_once() {
    let mut sim = Sim::default();
    sim.create(every("a", 3_600_000), T0);
    let first = sim.exec(dedup("req-1", trigger("a", T0 + 10)));
    assert!(
        matches!(first.response, Response::Run(_)),
        "{:?}",
        first.response
    );
    // The response was lost; the client retries with the same id, later.
    let again = sim.exec(dedup("req-1", trigger("a", T0 + 500)));
    assert_eq!(again.response, first.response.kept());
    assert_eq!(
        state_writes(&again),
        Vec::<&Write>::new(),
        "nothing applied twice"
    );
    assert_eq!(run_count(&sim, "a"), 1);
    // Another request is another trigger.
    sim.exec(dedup("req-2", trigger("a", T0 + 600)));
    assert_eq!(run_count(&sim, "a"), 2);
}

#[test]
fn a_refused_write_is_not_remembered_and_bad_ids_are_refused() {
    let mut sim = Sim::default();
    let refused = sim.exec(dedup("req-1", trigger("later", T0)));
    assert!(matches!(
        refused.response,
        Response::Error(CommandError::NotFound(_))
    ));
    assert_nothing_done(&refused);
    sim.create(every("later", 3_600_000), T0);
    let ok = sim.exec(dedup("req-1", trigger("later", T0 + 1)));
    assert!(
        matches!(ok.response, Response::Run(_)),
        "judged again: {:?}",
        ok.response
    );

    for (id, want) in [
        ("", "request_id: 1 to 64 bytes, got 0"),
        ("has space", "request_id: character ' ' not allowed"),
    ] {
        let a = sim.exec(dedup(id, trigger("later", T0 + 2)));
        assert!(invalid_msg(&a).starts_with(want), "{:?}", a.response);
        assert_nothing_done(&a);
    }
    let nested = sim.exec(dedup("x", dedup("y", trigger("later", T0 + 3))));
    assert!(invalid_msg(&nested).contains("wraps one plain command"));
}

#[test]
fn remembered_ids_expire_by_age_a_few_per_command() {
    let mut sim = Sim::default();
    sim.create(every("a", 3_600_000), T0);
    for i in 0..20 {
        sim.exec(dedup(&format!("old-{i}"), trigger("a", T0 + i)));
    }
    let count = |sim: &Sim| -> u64 {
        decode(&sim.view.get(keys::META_DEDUP_COUNT).expect("a count")).unwrap()
    };
    assert_eq!(count(&sim), 20);
    // Past the TTL each new id removes up to DEDUP_EVICT_PER_COMMAND old ones.
    let later = T0 + limits::DEDUP_TTL_MS + 1_000;
    sim.exec(dedup("new-1", trigger("a", later)));
    assert_eq!(count(&sim), 20 + 1 - limits::DEDUP_EVICT_PER_COMMAND as u64);
    sim.exec(dedup("new-2", trigger("a", later + 1)));
    sim.exec(dedup("new-3", trigger("a", later + 2)));
    assert_eq!(count(&sim), 3, "all 20 old ids are gone");
    assert!(sim.view.get(&keys::dedup("old-0")).is_none());
    // An expired id is a new request again.
    let a = sim.exec(dedup("old-0", trigger("a", later + 3)));
    assert!(!state_writes(&a).is_empty());
}

/// Keys of the request-id table and its order index among `a`'s writes.
fn table_writes(a: &Applied) -> usize {
    a.writes
        .iter()
        .filter(|w| {
            let k = match w {
                Write::Put(k, _) | Write::Delete(k) => k,
            };
            k.first() == Some(&keys::DEDUP) || k.first() == Some(&keys::DEDUP_ORDER)
        })
        .count()
}

/// Job "a" created under request id `id`.
fn created_once(id: &str, now_ms: i64) -> Command {
    dedup(
        id,
        Command::CreateJob {
            spec: every("a", 3_600_000),
            now_ms,
        },
    )
}

#[test]
fn from_log_format_4_a_create_is_remembered_in_its_job_not_in_the_table() {
    let create = created_once;
    // Before format 4 (older members): the table, as they keep it.
    let mut old = Sim::default();
    let first = old.exec(create("req-1", T0));
    assert_eq!(table_writes(&first), 2);
    assert_eq!(old.job("a").create_request, None);

    let mut sim = Sim::default();
    sim.exec(Command::ActivateLogFormat { format: 4 });
    let first = sim.exec(create("req-1", T0));
    assert_eq!(table_writes(&first), 0, "{:?}", first.writes);
    assert!(sim.view.get(keys::META_DEDUP_COUNT).is_none());
    let job = sim.job("a");
    assert_eq!(job.create_request.as_deref(), Some("req-1"));
    assert_eq!(Job::record_format(&job.to_record()), 4);
    // A repeat gets the job and writes nothing; so does one after a change.
    let again = sim.exec(create("req-1", T0 + 500));
    assert_eq!(again.response, Response::Job(job.clone()));
    assert_eq!(state_writes(&again), Vec::<&Write>::new());
    sim.exec(Command::pause_job("a".into(), String::new(), T0 + 600));
    let again = sim.exec(create("req-1", T0 + 700));
    assert_eq!(again.response, Response::Job(sim.job("a")));
    assert_eq!(state_writes(&again), Vec::<&Write>::new());
    // Another request for the same id is refused as before.
    let other = sim.exec(create("req-2", T0 + 800));
    assert_eq!(
        other.response,
        Response::Error(CommandError::AlreadyExists("a".into()))
    );
    // Past the TTL the id is a new request again (and finds the job there).
    let late = T0 + limits::DEDUP_TTL_MS + 1;
    let again = sim.exec(create("req-1", late));
    assert_eq!(
        again.response,
        Response::Error(CommandError::AlreadyExists("a".into()))
    );
}

#[test]
fn a_job_deleted_soon_after_its_create_leaves_the_id_in_the_table_so_a_repeat_does_not_make_it_again(
) {
    let create = created_once;
    let delete = |now_ms| Command::DeleteJob {
        id: "a".into(),
        now_ms,
    };
    let mut sim = Sim::default();
    sim.exec(Command::ActivateLogFormat { format: 4 });
    sim.exec(create("req-1", T0));
    let created = sim.job("a");
    let gone = sim.exec(delete(T0 + 100));
    assert_eq!(table_writes(&gone), 2);
    let again = sim.exec(create("req-1", T0 + 200));
    // The job as the delete left it (no next fire); the table keeps a
    // response's record head, as it always did.
    let kept = Job {
        create_request: None,
        next_fire_at_ms: None,
        ..created
    };
    assert_eq!(again.response, Response::Job(kept).kept());
    assert_eq!(state_writes(&again), Vec::<&Write>::new());
    assert!(sim.view.get(&keys::job("a")).is_none(), "not made again");
    // A new request makes it again; deleted past the TTL it leaves nothing.
    sim.exec(create("req-2", T0 + 300));
    let gone = sim.exec(delete(T0 + 300 + limits::DEDUP_TTL_MS + 1));
    assert_eq!(table_writes(&gone), 0);
}

// ------------------------------------------------------------------ job history

fn authored(actor: &str, cmd: Command) -> Command {
    Command::Authored {
        actor: actor.into(),
        command: Box::new(cmd),
    }
}

fn revisions(sim: &Sim, job: &str) -> Vec<JobRevision> {
    let prefix = keys::job_history_prefix(job);
    sim.view
        .range(&prefix, &keys::prefix_end(&prefix), 1000)
        .iter()
        .map(|(_, v)| decode(v).unwrap())
        .collect()
}

#[test]
fn job_changes_record_who_made_them_and_the_history_is_bounded() {
    let mut sim = Sim::default();
    sim.exec(authored(
        "ops",
        Command::CreateJob {
            spec: every("a", 60_000),
            now_ms: T0,
        },
    ));
    sim.exec(authored(
        "ci",
        Command::PauseJob {
            id: "a".into(),
            now_ms: T0 + 1,
        },
    ));
    sim.exec(Command::ResumeJob {
        id: "a".into(),
        now_ms: T0 + 2,
    });
    sim.exec(authored(
        "ops",
        Command::DeleteJob {
            id: "a".into(),
            now_ms: T0 + 3,
        },
    ));
    let h = revisions(&sim, "a");
    let seen: Vec<(u64, &str, &str)> = h
        .iter()
        .map(|r| (r.revision, r.action.as_str(), r.by.as_str()))
        .collect();
    assert_eq!(
        seen,
        vec![
            (1, "create", "ops"),
            (2, "pause", "ci"),
            (3, "resume", ""),
            (4, "delete", "ops")
        ]
    );
    assert_eq!(h[1].at_ms, T0 + 1);

    // A refused change records nothing; many changes keep the newest 100.
    let refused = sim.exec(authored(
        "ops",
        Command::PauseJob {
            id: "a".into(),
            now_ms: T0 + 4,
        },
    ));
    assert_nothing_done(&refused);
    sim.exec(Command::CreateJob {
        spec: every("a", 60_000),
        now_ms: T0 + 5,
    });
    for i in 0..150 {
        let now_ms = T0 + 10 + i;
        let cmd = if i % 2 == 0 {
            Command::PauseJob {
                id: "a".into(),
                now_ms,
            }
        } else {
            Command::ResumeJob {
                id: "a".into(),
                now_ms,
            }
        };
        sim.exec(cmd);
    }
    let h = revisions(&sim, "a");
    assert_eq!(h.len(), limits::JOB_REVISIONS_MAX);
    assert_eq!(h.last().map(|r| r.revision), Some(151), "newest kept");
}

fn history_of(sim: &Sim, job: &str) -> Vec<(u64, String, String, i64)> {
    query::job_history(&sim.view, job)
        .into_iter()
        .map(|r| (r.revision, r.action, r.by, r.at_ms))
        .collect()
}

fn row(revision: u64, action: &str, by: &str, at_ms: i64) -> (u64, String, String, i64) {
    (revision, action.into(), by.into(), at_ms)
}

#[test]
fn from_log_format_5_a_job_implies_its_create_record_until_it_first_changes() {
    let create = |now_ms| {
        authored(
            "ops",
            Command::CreateJob {
                spec: every("a", 60_000),
                now_ms,
            },
        )
    };
    // Before format 5 a create writes its record (and the job record
    // stays readable by format-4 releases).
    let mut old = Sim::default();
    old.exec(Command::ActivateLogFormat { format: 4 });
    old.exec(create(T0));
    assert_eq!(revisions(&old, "a").len(), 1);
    assert!(Job::record_format(&old.view.get(&keys::job("a")).unwrap()) <= 4);

    let mut sim = Sim::default();
    sim.exec(Command::ActivateLogFormat { format: 5 });
    let made = sim.exec(create(T0));
    let history_keys = (state_writes(&made).iter())
        .filter(|w| matches!(w, Write::Put(k, _) if k.first() == Some(&keys::JOB_HISTORY)))
        .count();
    assert_eq!(history_keys, 0, "no revision record at create");
    assert_eq!(state_writes(&made).len(), 2, "the job and its wheel entry");
    let record = sim.view.get(&keys::job("a")).unwrap();
    assert_eq!(Job::record_format(&record), 5);
    assert_eq!(history_of(&sim, "a"), vec![row(1, "create", "ops", T0)]);
    assert_eq!(
        history_of(&sim, "a"),
        history_of(&old, "a"),
        "reads as before"
    );

    // A fire rewrites the job; its create stays implied.
    sim.fire(T0 + 60_000, vec![occ("a", T0 + 60_000)]);
    assert!(revisions(&sim, "a").is_empty());
    assert_eq!(history_of(&sim, "a"), vec![row(1, "create", "ops", T0)]);

    // The first change writes the create's record, then its own.
    sim.exec(authored(
        "ci",
        Command::PauseJob {
            id: "a".into(),
            now_ms: T0 + 70_000,
        },
    ));
    let stored: Vec<(u64, String, String, i64)> = (revisions(&sim, "a").into_iter())
        .map(|r| (r.revision, r.action, r.by, r.at_ms))
        .collect();
    let want = vec![
        row(1, "create", "ops", T0),
        row(2, "pause", "ci", T0 + 70_000),
    ];
    assert_eq!(stored, want);
    assert_eq!(history_of(&sim, "a"), want);
    assert_eq!(sim.job("a").created_by, None);
    assert!(Job::record_format(&sim.view.get(&keys::job("a")).unwrap()) <= 4);
}

/// Records the keys read through it.
struct ReadLog<'a> {
    view: &'a MemView,
    keys: std::cell::RefCell<Vec<Vec<u8>>>,
}

impl StateView for ReadLog<'_> {
    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.keys.borrow_mut().push(key.to_vec());
        self.view.get(key)
    }

    fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.keys.borrow_mut().push(start.to_vec());
        self.view.range(start, end, limit)
    }
}

#[test]
fn from_log_format_5_a_new_one_shot_does_not_look_up_its_run() {
    let reads_a_run = |format: u32| {
        let mut sim = Sim::default();
        sim.exec(Command::ActivateLogFormat { format });
        let log = ReadLog {
            view: &sim.view,
            keys: Default::default(),
        };
        let cmd = Command::create_job(spec("a", ScheduleInput::At { at_ms: T0 + 5000 }), T0);
        let a = apply(&log, &cmd);
        let Response::Job(job) = &a.response else {
            panic!("{:?}", a.response);
        };
        assert_eq!(job.next_fire_at_ms, Some(T0 + 5000));
        let keys_read = log.keys.into_inner();
        keys_read.iter().any(|k| k.first() == Some(&keys::RUN))
    };
    assert!(reads_a_run(4), "format 4 looks it up, as its releases do");
    assert!(!reads_a_run(5));
}

/// A create with a request id looks its job up once: the lookup that
/// answers a repeat also tells the create the id is free. An id taken by
/// another request is still refused.
#[test]
fn a_create_with_a_request_id_looks_its_job_up_once() {
    let mut sim = Sim::default();
    sim.exec(Command::ActivateLogFormat { format: 5 });
    let create = |id: &str, request: &str| Command::Dedup {
        request_id: request.into(),
        command: Box::new(Command::create_job(every(id, 60_000), T0)),
    };
    let log = ReadLog {
        view: &sim.view,
        keys: Default::default(),
    };
    let a = apply(&log, &create("a", "r1"));
    assert!(matches!(a.response, Response::Job(_)), "{:?}", a.response);
    let job_reads = |keys: Vec<Vec<u8>>| keys.iter().filter(|k| **k == keys::job("a")).count();
    assert_eq!(job_reads(log.keys.into_inner()), 1);

    sim.exec(create("a", "r1"));
    let again = apply(&sim.view, &create("a", "r1"));
    assert!(
        matches!(again.response, Response::Job(_)),
        "a repeat: {:?}",
        again.response
    );
    let taken = apply(&sim.view, &create("a", "r2"));
    assert!(
        matches!(taken.response, Response::Error(CommandError::AlreadyExists(ref id)) if id == "a"),
        "{:?}",
        taken.response
    );
    assert!(taken.writes.is_empty());
}

/// A retried write answered from the request-id table gets the job as it
/// is, with its labels, bounds and pause note, while the job is still at
/// the revision the first answer was; after a later change, the kept
/// answer (without payload and those fields).
#[test]
fn a_retried_write_gets_the_whole_job_while_it_is_unchanged() {
    let mut sim = Sim::default();
    sim.exec(Command::ActivateLogFormat { format: 5 });
    let mut s = every("a", 60_000);
    s.labels = [("team".to_string(), "ops".to_string())].into();
    s.bounds.max_runs = Some(7);
    let created = sim.exec(Command::create_job(s, T0));
    assert!(
        matches!(created.response, Response::Job(_)),
        "{:?}",
        created.response
    );
    let pause = |now_ms| Command::Dedup {
        request_id: "r1".into(),
        command: Box::new(Command::PauseJobNoted {
            id: "a".into(),
            note: "disk full".into(),
            now_ms,
        }),
    };
    let Response::Job(first) = sim.exec(pause(T0 + 1)).response else {
        panic!("the pause answers with the job");
    };
    assert_eq!(first.labels.get("team").map(String::as_str), Some("ops"));
    let Response::Job(again) = sim.exec(pause(T0 + 2)).response else {
        panic!("the retry answers with the job");
    };
    assert_eq!(again, first, "the retry's answer is the first one");
    assert_eq!(again.bounds.max_runs, Some(7));
    assert_eq!(
        again.pause.as_ref().map(|p| p.note.as_str()),
        Some("disk full")
    );

    sim.exec(Command::ResumeJob {
        id: "a".into(),
        now_ms: T0 + 3,
    });
    let Response::Job(late) = sim.exec(pause(T0 + 4)).response else {
        panic!("the retry answers with the job");
    };
    assert_eq!(late.revision, first.revision, "not paused again");
    assert!(late.paused && late.labels.is_empty() && late.payload.is_empty());
    assert!(!sim.job("a").paused, "the retry changed nothing");
}

/// A batch reads the active log format once, not per command, and a
/// format activated inside it holds for the commands after it.
#[test]
fn a_batch_reads_the_log_format_once_and_sees_one_activated_inside_it() {
    let mut sim = Sim::default();
    sim.exec(Command::ActivateLogFormat { format: 4 });
    let create = |id: &str| Command::create_job(every(id, 60_000), T0);
    let log = ReadLog {
        view: &sim.view,
        keys: Default::default(),
    };
    let batch = Command::Batch {
        commands: vec![
            create("a"),
            create("b"),
            Command::ActivateLogFormat { format: 5 },
            create("c"),
            create("d"),
        ],
    };
    let a = apply(&log, &batch);
    let Response::Many(answers) = &a.response else {
        panic!("{:?}", a.response);
    };
    assert!(
        answers.iter().all(|r| !matches!(r, Response::Error(_))),
        "{answers:?}"
    );
    let format_reads = log
        .keys
        .borrow()
        .iter()
        .filter(|k| *k == keys::META_LOG_FORMAT)
        .count();
    assert_eq!(format_reads, 1);
    sim.view.write(&a.writes);
    // Format 4 writes each create's revision record; format 5 implies it.
    let lean = |id: &str| sim.job(id).created_by.is_some();
    assert_eq!(["a", "b", "c", "d"].map(lean), [false, false, true, true]);
}

/// A batch of creates with request ids looks once whether the request-id
/// table and the deleted-job marks are empty, instead of reading its key
/// in each for every create.
#[test]
fn a_batch_of_creates_looks_once_at_the_request_ids_and_the_deleted_jobs() {
    let mut sim = Sim::default();
    sim.exec(Command::ActivateLogFormat { format: 5 });
    let log = ReadLog {
        view: &sim.view,
        keys: Default::default(),
    };
    let commands = (0..4)
        .map(|i| Command::Dedup {
            request_id: format!("r{i}"),
            command: Box::new(Command::create_job(every(&format!("j{i}"), 60_000), T0)),
        })
        .collect();
    let a = apply(&log, &Command::Batch { commands });
    let Response::Many(answers) = &a.response else {
        panic!("{:?}", a.response);
    };
    assert!(
        answers.iter().all(|r| matches!(r, Response::Job(_))),
        "{answers:?}"
    );
    let reads = log.keys.into_inner();
    let in_space = |space: u8| reads.iter().filter(|k| k.first() == Some(&space)).count();
    assert_eq!(in_space(keys::DEDUP), 1, "{reads:?}");
    assert_eq!(in_space(keys::DELETED_JOB), 1, "{reads:?}");
    assert!(
        reads.iter().any(|k| *k == [keys::DEDUP]),
        "a look at the whole table"
    );

    // A lone create reads its own keys, not the key spaces.
    let log = ReadLog {
        view: &sim.view,
        keys: Default::default(),
    };
    let lone = Command::Dedup {
        request_id: "r9".into(),
        command: Box::new(Command::create_job(every("j9", 60_000), T0)),
    };
    assert!(matches!(apply(&log, &lone).response, Response::Job(_)));
    let reads = log.keys.into_inner();
    assert!(reads.contains(&keys::dedup("r9")), "{reads:?}");
    assert!(reads.contains(&keys::deleted_job("j9")), "{reads:?}");
}

/// What a batch knew of an empty key space no longer holds once one of
/// its commands writes into it: a job deleted with runs left cannot be
/// created again, and a request id taken earlier in the batch answers
/// with its first response, in the same batch as in separate entries.
#[test]
fn a_batch_sees_the_request_ids_and_deleted_jobs_its_own_commands_write() {
    let mut sim = Sim::default();
    sim.exec(Command::ActivateLogFormat { format: 5 });
    sim.exec(Command::create_job(every("a", 60_000), T0));
    sim.exec(trigger("a", T0 + 1));
    assert!(sim.job("a").history_len > 0, "the delete must leave a mark");
    let with_id = |request: &str, command: Command| Command::Dedup {
        request_id: request.into(),
        command: Box::new(command),
    };
    let commands = vec![
        with_id("r0", Command::create_job(every("x", 60_000), T0 + 2)),
        Command::DeleteJob {
            id: "a".into(),
            now_ms: T0 + 2,
        },
        Command::create_job(every("a", 60_000), T0 + 2),
        with_id(
            "r1",
            Command::PauseJob {
                id: "x".into(),
                now_ms: T0 + 2,
            },
        ),
        with_id("r1", Command::create_job(every("y", 60_000), T0 + 2)),
    ];
    let a = sim.exec(Command::Batch { commands });
    let Response::Many(answers) = &a.response else {
        panic!("{:?}", a.response);
    };
    assert!(matches!(answers[0], Response::Job(_)), "{:?}", answers[0]);
    assert!(
        matches!(&answers[2], Response::Error(CommandError::FailedPrecondition(m)) if m.contains("was deleted")),
        "{:?}",
        answers[2]
    );
    assert!(
        matches!(&answers[4], Response::Job(j) if j.id == "x" && j.paused && j.revision == 2),
        "the first answer to r1: {:?}",
        answers[4]
    );
    assert!(sim.view.get(&keys::job("y")).is_none(), "r1 made no job");
}

#[test]
fn an_implied_create_counts_in_the_history_bound_and_sorts_after_older_generations() {
    let mut sim = Sim::default();
    sim.exec(Command::ActivateLogFormat { format: 5 });
    let create = |now_ms| Command::CreateJob {
        spec: every("a", 60_000),
        now_ms,
    };
    // A deleted job never changed: its create is written by the delete.
    sim.exec(create(T0));
    sim.exec(Command::DeleteJob {
        id: "a".into(),
        now_ms: T0 + 1,
    });
    let first = vec![row(1, "create", "", T0), row(2, "delete", "", T0 + 1)];
    assert_eq!(history_of(&sim, "a"), first);

    // A second generation with a long history, deleted, then a third.
    sim.exec(create(T0 + 10));
    for i in 0..(limits::JOB_REVISIONS_MAX as i64) {
        let now_ms = T0 + 20 + i;
        let id = "a".to_string();
        sim.exec(if i % 2 == 0 {
            Command::PauseJob { id, now_ms }
        } else {
            Command::ResumeJob { id, now_ms }
        });
    }
    sim.exec(Command::DeleteJob {
        id: "a".into(),
        now_ms: T0 + 500,
    });
    assert_eq!(revisions(&sim, "a").len(), limits::JOB_REVISIONS_MAX);
    sim.exec(create(T0 + 600));
    let h = history_of(&sim, "a");
    assert_eq!(
        h.len(),
        limits::JOB_REVISIONS_MAX,
        "stored and implied, bounded"
    );
    assert_eq!(
        h.last(),
        Some(&row(1, "create", "", T0 + 600)),
        "newest last"
    );
    assert_eq!(h[h.len() - 2], row(102, "delete", "", T0 + 500));
    assert_eq!(h.first().map(|r| r.0), Some(4), "the oldest fell out");
}

#[test]
fn an_author_wraps_one_plain_command() {
    let mut sim = Sim::default();
    let nested = sim.exec(authored(
        "x",
        authored(
            "y",
            Command::DeleteJob {
                id: "a".into(),
                now_ms: T0,
            },
        ),
    ));
    assert!(invalid_msg(&nested).contains("an author wraps one plain command"));
    assert_nothing_done(&nested);
}

// ------------------------------------------------------------------ restore

fn restore(pairs: Vec<(Vec<u8>, Vec<u8>)>, first: bool, last: bool) -> Command {
    Command::RestorePairs {
        pairs,
        first,
        last,
        now_ms: T0,
    }
}

#[test]
fn a_restore_needs_an_empty_cluster_goes_in_order_and_refuses_foreign_or_corrupt_pairs() {
    // The scheduling state of one cluster...
    let mut source = Sim::default();
    source.create(every("a", 60_000), T0);
    let state: Vec<(Vec<u8>, Vec<u8>)> = source
        .view
        .range(&[0], &[0xff], 1000)
        .into_iter()
        .filter(|(k, _)| keys::RESTORED_SPACES.contains(&k[0]))
        .collect();
    assert!(!state.is_empty());

    let mut sim = Sim::default();
    let orphan = sim.exec(restore(state.clone(), false, true));
    assert!(
        matches!(&orphan.response, Response::Error(CommandError::FailedPrecondition(m)) if m.contains("no restore in progress"))
    );
    let foreign = sim.exec(restore(
        vec![(keys::META_TIME.to_vec(), vec![1])],
        true,
        true,
    ));
    assert!(invalid_msg(&foreign).contains("is not scheduling state"));
    let corrupt = sim.exec(restore(vec![(keys::job("x"), vec![0xff; 3])], true, true));
    assert!(invalid_msg(&corrupt).contains("does not decode"));
    for a in [&orphan, &foreign, &corrupt] {
        assert_nothing_done(a);
    }

    // ...restored in two parts: the mark holds between them.
    let (one, two) = state.split_at(1);
    sim.exec(restore(one.to_vec(), true, false));
    assert!(sim.view.get(keys::META_RESTORE).is_some());
    let done = sim.exec(restore(two.to_vec(), false, true));
    assert_eq!(done.effects, vec![Effect::Restored]);
    assert!(sim.view.get(keys::META_RESTORE).is_none());
    assert_eq!(sim.job("a"), source.job("a"));
    // A cluster that holds jobs takes no second restore.
    let again = sim.exec(restore(state, true, true));
    assert!(
        matches!(&again.response, Response::Error(CommandError::FailedPrecondition(m)) if m.contains("already holds"))
    );
}

// ------------------------------------------------------------------ history limits and housekeeping

fn keeping(mut s: JobSpec, keep_runs: u64, keep_for_ms: u64) -> JobSpec {
    s.policy.keep_runs = keep_runs;
    s.policy.keep_for_ms = keep_for_ms;
    s
}

fn housekeep(now_ms: i64, max_deletes: u32) -> Command {
    Command::Housekeep {
        now_ms,
        max_deletes,
    }
}

fn housekept(removed: u32) -> Response {
    Response::Housekept { removed }
}

fn due(sim: &Sim, now_ms: i64) -> bool {
    query::housekeeping_due(&sim.view, now_ms)
}

fn scheduled(runs: &[Run]) -> Vec<i64> {
    runs.iter().map(|r| r.id.scheduled_at_ms).collect()
}

/// Fires the job's next occurrence at its time and finishes the run `ms` later.
fn fire_and_finish(sim: &mut Sim, job: &str, ms: i64) -> i64 {
    let at = sim
        .job(job)
        .next_fire_at_ms
        .expect("an occurrence is pending");
    sim.fire(at, vec![occ(job, at)]);
    sim.finish(at + ms, report(&rid(job, at), 1, true, 0));
    at
}

/// Deletes in `RUN` writes of an applied command.
fn run_deletes(a: &Applied) -> usize {
    let is_run_delete = |w: &&Write| matches!(w, Write::Delete(k) if k[0] == keys::RUN);
    a.writes.iter().filter(is_run_delete).count()
}

#[test]
fn keep_runs_keeps_the_newest_finished_runs_as_new_ones_are_created() {
    let mut sim = sim_with(keeping(every("k", 1000), 3, 0));
    let fired: Vec<i64> = (0..6).map(|_| fire_and_finish(&mut sim, "k", 10)).collect();
    assert_eq!(scheduled(&sim.runs_of("k")), fired[3..].to_vec());
    assert_eq!(sim.job("k").history_len, 3);
    // Creating the next run deletes exactly one, the oldest.
    let at = sim.job("k").next_fire_at_ms.unwrap();
    let a = sim.fire(at, vec![occ("k", at)]);
    assert_eq!(run_deletes(&a), 1);
    assert!(a
        .writes
        .contains(&Write::Delete(keys::run(&rid("k", fired[3])))));
    assert!(!due(&sim, at + 1_000_000), "nothing left for housekeeping");
}

#[test]
fn active_runs_are_never_removed_and_their_end_lets_housekeeping_trim() {
    let mut sim = sim_with(keeping(every("a", 1000), 1, 0));
    let times: Vec<i64> = (1..=3).map(|i| T0 + i * 1000).collect();
    for at in &times {
        sim.fire(*at, vec![occ("a", *at)]);
    }
    assert_eq!(sim.active_runs("a").len(), 3, "all three active runs kept");
    assert!(
        !due(&sim, T0 + 3000),
        "nothing may go while the oldest is active"
    );
    let last = T0 + 3000;
    for at in &times {
        sim.finish(last + 5, report(&rid("a", *at), 1, true, 0));
    }
    assert!(
        due(&sim, last + 5),
        "finished runs past keep_runs are due at once"
    );
    let a = sim.exec(housekeep(last + 5, 100));
    assert_eq!(a.response, housekept(2));
    assert_eq!(scheduled(&sim.runs_of("a")), vec![last]);
    assert_eq!(sim.job("a").history_len, 1);
    assert!(!due(&sim, i64::MAX - 1));
}

#[test]
fn keep_for_removes_finished_runs_by_finish_time_through_housekeeping() {
    let day = 86_400_000;
    let mut sim = sim_with(keeping(every("f", 1000), 100, day as u64));
    let first = fire_and_finish(&mut sim, "f", 10);
    let second = fire_and_finish(&mut sim, "f", 500);
    let (first_done, second_done) = (first + 10, second + 500);
    assert!(
        !due(&sim, first_done + day - 1),
        "not before keep_for has passed"
    );
    assert!(due(&sim, first_done + day));
    let a = sim.exec(housekeep(first_done + day, 100));
    assert_eq!(a.response, housekept(1));
    assert_eq!(scheduled(&sim.runs_of("f")), vec![second]);
    assert!(!due(&sim, second_done + day - 1));
    sim.exec(housekeep(second_done + day, 100));
    assert_eq!(sim.runs_of("f"), vec![]);
    assert_eq!(sim.job("f").history_len, 0);
    assert_eq!(sim.job("f").retention_due_ms, None);
}

#[test]
fn lowering_keep_runs_deletes_in_bounded_housekeeping_steps() {
    let mut sim = sim_with(every("l", 1000));
    let fired: Vec<i64> = (0..20).map(|_| fire_and_finish(&mut sim, "l", 1)).collect();
    let now = fired[19] + 10;
    let a = sim.exec(update(keeping(every("l", 1000), 5, 0), 0, now));
    assert_eq!(run_deletes(&a), 0, "an update only plans the deleting");
    assert!(due(&sim, now));
    for removed in [6, 6, 3] {
        let a = sim.exec(housekeep(now, 6));
        assert_eq!(a.response, housekept(removed));
        assert_eq!(run_deletes(&a), removed as usize);
    }
    assert_eq!(scheduled(&sim.runs_of("l")), fired[15..].to_vec());
    assert!(!due(&sim, now));
    let idle = sim.exec(housekeep(now, 6));
    assert_eq!(idle.response, housekept(0));
    assert_eq!(state_writes(&idle), Vec::<&Write>::new());
}

#[test]
fn runs_of_a_deleted_job_go_in_bounded_steps_and_block_its_id_until_then() {
    let mut sim = sim_with(every("d", 1000));
    (0..10).for_each(|_| {
        fire_and_finish(&mut sim, "d", 1);
    });
    let now = T0 + 60_000;
    sim.exec(Command::DeleteJob {
        id: "d".into(),
        now_ms: now,
    });
    assert_eq!(sim.runs_of("d").len(), 10, "a delete removes no run itself");
    assert!(due(&sim, now));
    let again = sim.exec(Command::CreateJob {
        spec: every("d", 1000),
        now_ms: now,
    });
    assert!(
        matches!(&again.response, Response::Error(CommandError::FailedPrecondition(m))
            if m.contains("still removing its runs")),
        "{:?}",
        again.response
    );
    assert_nothing_done(&again);
    for (removed, left) in [(4, 6), (4, 2), (2, 0)] {
        let a = sim.exec(housekeep(now, 4));
        assert_eq!(a.response, housekept(removed));
        assert_eq!(sim.runs_of("d").len(), left);
    }
    assert!(!due(&sim, now), "nothing left to do");
    sim.create(every("d", 1000), now);
    assert_eq!(sim.job("d").history_len, 0);
}

#[test]
fn a_job_deleted_without_runs_leaves_no_housekeeping() {
    let mut sim = sim_with(every("n", 1000));
    sim.exec(Command::DeleteJob {
        id: "n".into(),
        now_ms: T0,
    });
    assert!(!due(&sim, T0));
    sim.create(every("n", 1000), T0 + 1);
}

#[test]
fn a_housekeep_outside_its_limits_is_refused_naming_the_field() {
    let mut sim = sim_with(every("h", 1000));
    for max in [0, limits::HOUSEKEEP_DELETES_MAX + 1] {
        let a = sim.exec(housekeep(T0 + 5, max));
        assert_eq!(
            invalid_msg(&a),
            format!("max_deletes: must be between 1 and 4096, got {max}")
        );
        assert_nothing_done(&a);
    }
}

#[test]
fn a_log_entry_of_a_newer_format_is_refused_naming_both_versions() {
    let cmd = Command::DeleteJob {
        id: "a".into(),
        now_ms: T0,
    };
    let current = VersionedCommand::new(&cmd);
    assert_eq!(current.command(7), Ok(cmd.clone()));
    let newer = VersionedCommand {
        format: command::LOG_FORMAT + 1,
        ..current
    };
    let e = newer.command(7).unwrap_err().to_string();
    let want = format!(
        "log entry 7 has format version {}, newer than this binary's {}",
        command::LOG_FORMAT + 1,
        command::LOG_FORMAT
    );
    assert!(e.starts_with(&want), "{e}");
    let garbled = VersionedCommand {
        format: command::LOG_FORMAT,
        bytes: vec![0xff; 3],
    };
    assert!(garbled
        .command(8)
        .unwrap_err()
        .to_string()
        .contains("does not decode"));
}

#[test]
fn entries_are_written_at_the_active_format_and_a_newer_command_is_refused() {
    let plain = Command::DeleteJob {
        id: "a".into(),
        now_ms: T0,
    };
    let at_initial = VersionedCommand::at(&plain, command::LOG_FORMAT_INITIAL).unwrap();
    assert_eq!(at_initial.format, command::LOG_FORMAT_INITIAL);
    assert_eq!(at_initial.command(1), Ok(plain.clone()));
    // Never labelled newer than this binary writes.
    let at_future = VersionedCommand::at(&plain, command::LOG_FORMAT + 1).unwrap();
    assert_eq!(at_future.format, command::LOG_FORMAT);

    // A command of format 2, even inside a batch or a dedup wrapper, needs format 2.
    let activate = Command::ActivateLogFormat { format: 2 };
    let wrapped = Command::Batch {
        commands: vec![
            plain.clone(),
            Command::Dedup {
                request_id: "r".into(),
                command: Box::new(activate.clone()),
            },
        ],
    };
    assert_eq!(plain.min_format(), 1);
    assert_eq!(wrapped.min_format(), 2);
    let e = VersionedCommand::at(&wrapped, 1).unwrap_err();
    assert_eq!(
        e,
        command::FormatTooNew {
            needs: 2,
            active: 1
        }
    );
    let msg = e.to_string();
    assert!(
        msg.starts_with("this needs log format 2, but the cluster's active log format is 1: upgrade every member"),
        "{msg}"
    );
    assert_eq!(VersionedCommand::at(&activate, 2).unwrap().format, 2);
}

#[test]
fn the_active_log_format_only_rises_and_never_past_this_binary() {
    let mut sim = Sim {
        view: MemView::default(),
    };
    assert_eq!(query::log_format(&sim.view), command::LOG_FORMAT_INITIAL);
    let a = sim.exec(Command::ActivateLogFormat { format: 2 });
    assert_eq!(a.response, Response::Empty);
    assert_eq!(query::log_format(&sim.view), 2);
    // Lower or equal: nothing changes.
    for format in [1, 2] {
        let a = sim.exec(Command::ActivateLogFormat { format });
        assert_eq!(a.response, Response::Empty);
        assert_nothing_done(&a);
    }
    let a = sim.exec(Command::ActivateLogFormat {
        format: command::LOG_FORMAT + 1,
    });
    assert!(invalid_msg(&a).contains("newer than this binary's log format"));
    assert_nothing_done(&a);
    assert_eq!(query::log_format(&sim.view), 2);
    assert_eq!(state_time(&sim.view), 0, "activation carries no time");
}

// ------------------------------------------------------------------ statistics

#[test]
fn job_stats_count_the_kept_history_by_state_with_lateness_percentiles() {
    let mut sim = sim_with(with_overlap(every("a", 1000), Overlap::Forbid));
    // 1000 fires 200 ms late and succeeds; 2000 is skipped while it runs;
    // 3000 fires on time and fails; 4000 is still pending.
    sim.fire(T0 + 1200, vec![occ("a", T0 + 1000)]);
    sim.fire(T0 + 2000, vec![occ("a", T0 + 2000)]);
    sim.finish(T0 + 2500, report(&rid("a", T0 + 1000), 1, true, 0));
    sim.fire(T0 + 3000, vec![occ("a", T0 + 3000)]);
    let mut failure = report(&rid("a", T0 + 3000), 1, false, 0);
    failure.retryable = false;
    sim.finish(T0 + 3500, failure);
    sim.fire(T0 + 4000, vec![occ("a", T0 + 4000)]);

    let st = stats::job_stats(&sim.view, "a");
    let counts = (
        st.runs,
        st.fired,
        st.succeeded,
        st.failed,
        st.skipped,
        st.active,
    );
    assert_eq!(counts, (4, 3, 1, 1, 1, 1));
    assert_eq!((st.timed_out, st.cancelled), (0, 0));
    let lateness = (st.lateness_runs, st.lateness_ms_p50, st.lateness_ms_p99);
    assert_eq!(lateness, (3, 0, 200), "skipped runs have no lateness");
    assert_eq!(st.oldest_scheduled_at_ms, Some(T0 + 1000));
    let last = st.last_run.expect("a last run");
    assert_eq!(
        (last.id, last.state),
        (rid("a", T0 + 4000), RunState::Pending)
    );
    assert_eq!(stats::job_stats(&sim.view, "b"), stats::JobStats::default());
}

#[test]
fn job_stats_page_through_a_long_history_and_keep_the_latest_lateness() {
    let mut sim = sim_with(every("a", 3_600_000));
    let n = stats::PAGE_RUNS + 500;
    for i in 0..n as i64 {
        sim.exec(trigger("a", T0 + 1000 + i));
    }
    let st = stats::job_stats(&sim.view, "a");
    assert_eq!(
        (st.runs, st.fired, st.active),
        (n as u64, n as u64, n as u64)
    );
    assert_eq!(st.lateness_runs as usize, stats::LATENESS_RUNS);
    let last = st.last_run.expect("a last run");
    assert_eq!(last.id, rid("a", T0 + 1000 + n as i64 - 1));
}

mod backfill;
mod catch_up;
mod jitter;
mod multi_schedules;
mod schedules;
mod workflows;
