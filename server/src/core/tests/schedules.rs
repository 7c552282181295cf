//! Bounds (start, end, max runs, the finished state), pause notes, the
//! cluster-wide firing pause, and job labels with filtered job pages
//! (issue #16 items 4, 7, 8), by outputs.

use super::*;
use crate::core::codec::encode;
use crate::core::command::{FormatTooNew, VersionedCommand};
use crate::core::query::{jobs_page, JobFilter};

fn bounded(id: &str, every_ms: u64, bounds: Bounds) -> JobSpec {
    JobSpec {
        bounds,
        ..every(id, every_ms)
    }
}

fn max_runs(n: u64) -> Bounds {
    Bounds {
        max_runs: Some(n),
        ..Bounds::default()
    }
}

fn pause(id: &str, note: &str, now_ms: i64) -> Command {
    Command::pause_job(id.into(), note.into(), now_ms)
}

/// Scheduled times of the job's run records.
fn run_times(sim: &Sim, job: &str) -> Vec<i64> {
    sim.runs_of(job)
        .iter()
        .map(|r| r.id.scheduled_at_ms)
        .collect()
}

fn by(actor: &str, command: Command) -> Command {
    Command::Authored {
        actor: actor.into(),
        command: Box::new(command),
    }
}

#[test]
fn max_runs_fires_exactly_that_many_then_the_job_is_finished_with_no_entry() {
    let mut sim = Sim::default();
    sim.create(bounded("a", 1000, max_runs(3)), T0);
    for k in 1..=3 {
        assert_eq!(sim.fire_due(T0 + k * 1000).response, fired(1, 0));
    }
    let job = sim.job("a");
    assert_eq!(job.state(), JobState::Finished);
    assert_eq!(job.fired_count, 3);
    assert_eq!(job.finished_at_ms, Some(T0 + 3000));
    assert_eq!(job.next_fire_at_ms, None);
    assert_eq!(sim.wheel(), vec![], "a finished job keeps no wheel entry");
    assert_eq!(sim.fire_due(T0 + 60_000).response, fired(0, 0));
    assert_eq!(run_times(&sim, "a"), vec![T0 + 1000, T0 + 2000, T0 + 3000]);
}

#[test]
fn nothing_fires_before_the_start_or_after_the_end() {
    let mut sim = Sim::default();
    let b = Bounds {
        start_at_ms: Some(T0 + 5500),
        end_at_ms: Some(T0 + 7500),
        max_runs: None,
    };
    let a = sim.create(bounded("a", 1000, b), T0);
    assert_eq!(
        a.effects,
        vec![
            Effect::Scheduled(occ("a", T0 + 6000)),
            Effect::JobChanged {
                job: "a".into(),
                group: "g".into(),
                change: JobChange::Created
            }
        ],
        "the first occurrence is the first at or after the start"
    );
    sim.fire_due(T0 + 6000);
    sim.fire_due(T0 + 7000);
    let job = sim.job("a");
    assert_eq!(job.state(), JobState::Finished, "8000 is past the end");
    assert_eq!(job.finished_at_ms, Some(T0 + 7000));
    assert_eq!(sim.wheel(), vec![]);
    assert_eq!(run_times(&sim, "a"), vec![T0 + 6000, T0 + 7000]);
}

#[test]
fn fire_once_after_an_outage_coalesces_only_up_to_the_end() {
    let mut sim = Sim::default();
    let b = Bounds {
        end_at_ms: Some(T0 + 3500),
        ..Bounds::default()
    };
    sim.create(
        with_misfire(bounded("a", 1000, b), Misfire::FireOnce, 0),
        T0,
    );
    sim.fire(T0 + 10_000, vec![occ("a", T0 + 1000)]);
    assert_eq!(run_times(&sim, "a"), vec![T0 + 3000]);
    assert_eq!(sim.job("a").state(), JobState::Finished);
    assert_eq!(sim.wheel(), vec![]);
}

#[test]
fn raising_max_runs_makes_a_finished_job_active_again() {
    let mut sim = Sim::default();
    sim.create(bounded("a", 1000, max_runs(1)), T0);
    sim.fire_due(T0 + 1000);
    assert_eq!(sim.job("a").state(), JobState::Finished);
    let a = sim.exec(update(bounded("a", 1000, max_runs(2)), 0, T0 + 1500));
    assert!(matches!(a.response, Response::Job(_)), "{:?}", a.response);
    let job = sim.job("a");
    assert_eq!(job.state(), JobState::Active);
    assert_eq!(job.finished_at_ms, None);
    assert_eq!(sim.wheel(), vec![occ("a", T0 + 2000)]);
}

#[test]
fn bad_bounds_and_labels_are_refused_naming_field_and_rule() {
    let mut sim = Sim::default();
    let cases: Vec<(JobSpec, &str)> = vec![
        (
            bounded(
                "a",
                1000,
                Bounds {
                    start_at_ms: Some(T0 + 10),
                    end_at_ms: Some(T0 + 10),
                    max_runs: None,
                },
            ),
            "end_at_ms: must be after start_at_ms",
        ),
        (
            bounded("a", 1000, max_runs(0)),
            "max_runs: must be between 1 and 1000000000",
        ),
        (
            bounded("a", 1000, max_runs(limits::MAX_RUNS_MAX + 1)),
            "max_runs: must be between 1 and",
        ),
        (
            bounded(
                "a",
                1000,
                Bounds {
                    end_at_ms: Some(T0 - 1),
                    ..Bounds::default()
                },
            ),
            "end_at_ms: must be in the future",
        ),
        (
            JobSpec {
                labels: (0..17).map(|i| (format!("k{i}"), "v".into())).collect(),
                ..every("a", 1000)
            },
            "job_labels: at most 16, got 17",
        ),
        (
            JobSpec {
                labels: [("-team".to_string(), "x".to_string())].into(),
                ..every("a", 1000)
            },
            "job_labels (key)",
        ),
        (
            JobSpec {
                labels: [("Example.com/team".to_string(), "x".to_string())].into(),
                ..every("a", 1000)
            },
            "job_labels (key): prefix \"Example.com\" must be a DNS subdomain",
        ),
        (
            JobSpec {
                labels: [("team".to_string(), "x".repeat(64))].into(),
                ..every("a", 1000)
            },
            "job_labels (value): at most 63 characters",
        ),
    ];
    for (spec, want) in cases {
        let a = sim.exec(Command::create_job(spec, T0));
        assert!(invalid_msg(&a).starts_with(want), "{}", invalid_msg(&a));
        assert_nothing_done(&a);
    }
    assert!(sim.try_job("a").is_none());
    // An update that moves the end into the past is refused too.
    sim.create(every("b", 1000), T0);
    let past_end = bounded(
        "b",
        1000,
        Bounds {
            end_at_ms: Some(T0),
            ..Bounds::default()
        },
    );
    let a = sim.exec(update(past_end, 0, T0 + 10));
    assert!(invalid_msg(&a).starts_with("end_at_ms: must be in the future"));
    assert_nothing_done(&a);
}

#[test]
fn a_pause_note_records_who_and_when_and_resume_clears_it() {
    let mut sim = Sim::default();
    sim.create(every("a", 1000), T0);
    sim.exec(by("ops", pause("a", "db migration", T0 + 10)));
    let job = sim.job("a");
    assert_eq!(job.state(), JobState::Paused);
    assert_eq!(
        job.pause,
        Some(PauseNote {
            note: "db migration".into(),
            by: "ops".into(),
            at_ms: T0 + 10,
        })
    );
    // Pausing again with another note replaces it.
    sim.exec(by("lead", pause("a", "still migrating", T0 + 20)));
    assert_eq!(sim.job("a").pause.unwrap().by, "lead");
    let too_long = "x".repeat(limits::PAUSE_NOTE_MAX_BYTES + 1);
    let a = sim.exec(pause("a", &too_long, T0 + 30));
    assert_eq!(invalid_msg(&a), "note: at most 1024 bytes, got 1025");
    assert_nothing_done(&a);
    sim.exec(Command::ResumeJob {
        id: "a".into(),
        now_ms: T0 + 40,
    });
    let job = sim.job("a");
    assert_eq!((job.state(), job.pause), (JobState::Active, None));
}

#[test]
fn while_firing_is_paused_nothing_fires_and_resume_applies_the_misfire_policy() {
    let mut sim = Sim::default();
    sim.create(with_misfire(every("a", 1000), Misfire::Skip, 0), T0);
    let a = sim.exec(by(
        "admin",
        Command::PauseFiring {
            note: "incident 42".into(),
            now_ms: T0 + 500,
        },
    ));
    let note = PauseNote {
        note: "incident 42".into(),
        by: "admin".into(),
        at_ms: T0 + 500,
    };
    assert_eq!(a.response, Response::Firing(Some(note.clone())));
    // A due key is not fired, and stays for later.
    let a = sim.fire(T0 + 1000, vec![occ("a", T0 + 1000)]);
    assert_eq!(a.response, fired(0, 1));
    assert_eq!(state_writes(&a), Vec::<&Write>::new());
    assert!(sim.has_entry(&occ("a", T0 + 1000)));
    let a = sim.exec(trigger("a", T0 + 1100));
    assert!(
        matches!(&a.response, Response::Error(CommandError::FailedPrecondition(m)) if m.contains("firing is paused")),
        "{:?}",
        a.response
    );
    assert_nothing_done(&a);
    // Pausing again keeps the first pause.
    let a = sim.exec(Command::PauseFiring {
        note: "other".into(),
        now_ms: T0 + 1200,
    });
    assert_eq!(a.response, Response::Firing(Some(note)));
    let a = sim.exec(Command::ResumeFiring { now_ms: T0 + 5500 });
    assert_eq!(a.response, Response::Firing(None));
    assert_eq!(a.effects, vec![Effect::FiringResumed]);
    // The missed occurrences are handled by the job's policy (skip).
    let a = sim.fire_due(T0 + 5500);
    assert!(
        a.effects.contains(&misfired(Misfire::Skip)),
        "{:?}",
        a.effects
    );
    assert_eq!(sim.run(&rid("a", T0 + 1000)).state, RunState::Skipped);
    assert_eq!(sim.wheel(), vec![occ("a", T0 + 6000)]);
}

fn labelled(id: &str, group: &str, team: &str) -> JobSpec {
    JobSpec {
        group: group.into(),
        labels: [("team".to_string(), team.to_string())].into(),
        ..every(id, 1000)
    }
}

fn ids(jobs: &[Job]) -> Vec<&str> {
    jobs.iter().map(|j| j.id.as_str()).collect()
}

#[test]
fn job_pages_filter_by_group_labels_state_and_prefix() {
    let mut sim = Sim::default();
    for (id, group, team) in [
        ("api-1", "g", "web"),
        ("api-2", "h", "web"),
        ("db-1", "g", "data"),
        ("db-2", "g", "web"),
    ] {
        sim.create(labelled(id, group, team), T0);
    }
    sim.exec(pause("db-2", "", T0 + 1));
    let page = |f: JobFilter| jobs_page(&sim.view, &f, "", 100, 1000).jobs;
    let web: Labels = [("team".to_string(), "web".to_string())].into();
    let f = JobFilter {
        selector: web.clone(),
        ..JobFilter::default()
    };
    assert_eq!(ids(&page(f)), vec!["api-1", "api-2", "db-2"]);
    let f = JobFilter {
        selector: web,
        group: Some("g".into()),
        ..JobFilter::default()
    };
    assert_eq!(ids(&page(f)), vec!["api-1", "db-2"]);
    let f = JobFilter {
        state: Some(JobState::Paused),
        ..JobFilter::default()
    };
    assert_eq!(ids(&page(f)), vec!["db-2"]);
    let f = JobFilter {
        id_prefix: "db-".into(),
        state: Some(JobState::Active),
        ..JobFilter::default()
    };
    assert_eq!(ids(&page(f)), vec!["db-1"]);
}

#[test]
fn a_job_page_scans_a_bounded_number_of_jobs_and_continues_from_its_token() {
    let mut sim = Sim::default();
    for i in 0..10 {
        let team = if i % 3 == 0 { "web" } else { "data" };
        sim.create(labelled(&format!("j{i}"), "g", team), T0);
    }
    let f = JobFilter {
        selector: [("team".to_string(), "web".to_string())].into(),
        ..JobFilter::default()
    };
    // At most 4 jobs looked at per page: short pages, each with a token.
    let mut seen = Vec::new();
    let mut after = String::new();
    let mut pages = 0;
    loop {
        let p = jobs_page(&sim.view, &f, &after, 2, 4);
        assert!(p.jobs.len() <= 2);
        seen.extend(p.jobs.iter().map(|j| j.id.clone()));
        pages += 1;
        if p.next_after.is_empty() {
            break;
        }
        after = p.next_after;
    }
    assert_eq!(seen, vec!["j0", "j3", "j6", "j9"]);
    assert!(pages >= 3, "10 jobs at 4 per page take at least 3 pages");
}

// ------------------------------------------------------------ formats

/// A job record as state format 8 (the previous release) declares it.
#[derive(serde::Serialize)]
struct JobV8<'a> {
    id: &'a str,
    schedule: &'a Schedule,
    group: &'a str,
    payload: &'a [u8],
    policy: &'a Policy,
    revision: u64,
    paused: bool,
    created_at_ms: i64,
    updated_at_ms: i64,
    next_fire_at_ms: Option<i64>,
    active_runs: u32,
    buffered_at_ms: Option<i64>,
    history_len: u64,
    retention_due_ms: Option<i64>,
}

fn as_v8(j: &Job) -> Vec<u8> {
    encode(&JobV8 {
        id: &j.id,
        schedule: &j.schedule,
        group: &j.group,
        payload: &j.payload,
        policy: &j.policy,
        revision: j.revision,
        paused: j.paused,
        created_at_ms: j.created_at_ms,
        updated_at_ms: j.updated_at_ms,
        next_fire_at_ms: j.next_fire_at_ms,
        active_runs: j.active_runs,
        buffered_at_ms: j.buffered_at_ms,
        history_len: j.history_len,
        retention_due_ms: j.retention_due_ms,
    })
}

#[test]
fn a_job_using_nothing_new_is_stored_byte_for_byte_as_state_format_8_and_read_back() {
    let mut sim = Sim::default();
    sim.create(every("a", 1000), T0);
    sim.create(spec("once", ScheduleInput::At { at_ms: T0 + 500 }), T0);
    for k in 1..=3 {
        sim.fire_due(T0 + k * 1000);
    }
    sim.exec(pause("a", "", T0 + 3500));
    for id in ["a", "once"] {
        let stored = sim.view.get(&keys::job(id)).unwrap();
        let job = sim.job(id);
        assert_eq!(stored, as_v8(&job), "{id}: no tail, the format-8 layout");
        assert_eq!(Job::from_record(&as_v8(&job)).unwrap(), job);
    }
    assert_eq!(sim.job("once").state(), JobState::Finished);
    assert_eq!(sim.job("a").state(), JobState::Paused);
}

#[test]
fn a_job_record_carries_its_extension_as_a_tail_that_must_decode_to_its_end() {
    let mut sim = Sim::default();
    let mut s = bounded("a", 1000, max_runs(5));
    s.labels.insert("team".into(), "pay".into());
    sim.create(s, T0);
    sim.fire_due(T0 + 1000);
    sim.exec(pause("a", "db migration", T0 + 1500));
    let job = sim.job("a");
    let stored = sim.view.get(&keys::job("a")).unwrap();
    assert!(stored.len() > as_v8(&job).len() && stored.starts_with(&as_v8(&job)));
    assert_eq!(job.fired_count, 1);
    assert_eq!(job.labels.get("team").map(String::as_str), Some("pay"));
    assert_eq!(
        job.pause.as_ref().map(|p| p.note.as_str()),
        Some("db migration")
    );
    let mut trailing = stored.clone();
    trailing.push(7);
    assert!(Job::from_record(&trailing).is_err(), "bytes after the tail");
    assert!(
        Job::from_record(&stored[..stored.len() - 1]).is_err(),
        "a cut tail"
    );
}

/// The job record tail of log format 3's releases (61b0083), copied here
/// so a change to the live one cannot pass unnoticed: nine fields.
#[derive(serde::Serialize)]
struct JobExtV3<'a> {
    bounds: &'a Bounds,
    labels: &'a Labels,
    fired_count: u64,
    finished_at_ms: Option<i64>,
    pause: &'a Option<PauseNote>,
    workflow: &'a Option<Workflow>,
    cycle: &'a Cycle,
    max_concurrent: Option<u32>,
    queued: &'a Vec<i64>,
}

#[test]
fn what_format_3_releases_wrote_reads_back_and_format_4_adds_only_new_tails_and_variants() {
    // A format-3 entry as that release encoded it: `SpecExtended` (variant
    // 19) holding the four-field `SpecExt`, then the boxed create.
    let mut labelled = bounded("a", 1000, max_runs(3));
    labelled.labels.insert("team".into(), "pay".into());
    labelled.max_concurrent = Some(2);
    let mut inner = labelled.clone();
    let (ext, more) = inner.take_ext();
    assert_eq!(more, SpecMore::default());
    let entry = encode(&(
        19u32,
        (&ext.bounds, &ext.labels, &ext.workflow, ext.max_concurrent),
        Command::CreateJob {
            spec: inner,
            now_ms: T0,
        },
    ));
    let cmd = Command::create_job(labelled.clone(), T0);
    assert_eq!(encode(&cmd), entry, "format 3's bytes, unchanged");
    assert_eq!(cmd.min_format(), 3);
    let versioned = VersionedCommand {
        format: 3,
        bytes: entry,
    };
    assert_eq!(versioned.command(1).unwrap(), cmd);

    // Its job record as that release stored it: the state-format-8 head
    // and the nine-field tail; read back whole.
    let mut sim = Sim::default();
    sim.create(labelled, T0);
    sim.fire_due(T0 + 1000);
    let job = sim.job("a");
    let v3 = [
        as_v8(&job),
        encode(&JobExtV3 {
            bounds: &job.bounds,
            labels: &job.labels,
            fired_count: job.fired_count,
            finished_at_ms: job.finished_at_ms,
            pause: &job.pause,
            workflow: &job.workflow,
            cycle: &job.cycle,
            max_concurrent: job.max_concurrent,
            queued: &job.queued,
        }),
    ]
    .concat();
    assert_eq!(sim.view.get(&keys::job("a")).unwrap(), v3);
    assert_eq!(Job::from_record(&v3).unwrap(), job);
    assert_eq!(Job::record_format(&v3), 3);

    // What format 4 added travels in a new variant and a second tail,
    // which format 3's readers refuse rather than misread.
    let mut jittered = every("j", 60_000);
    jittered.jitter = Some(Jitter { ms: 500, seed: 7 });
    let cmd = Command::create_job(jittered.clone(), T0);
    assert!(matches!(cmd, Command::SpecExtendedMore { .. }), "{cmd:?}");
    assert_eq!(
        VersionedCommand::at(&cmd, 3).err(),
        Some(FormatTooNew {
            needs: 4,
            active: 3
        })
    );
    sim.exec(Command::ActivateLogFormat { format: 4 });
    sim.create(jittered, T0);
    let record = sim.view.get(&keys::job("j")).unwrap();
    assert_eq!(Job::record_format(&record), 4);
    assert!(record.starts_with(&as_v8(&sim.job("j"))));
    assert_eq!(Job::from_record(&record).unwrap(), sim.job("j"));
}

#[test]
fn what_older_log_formats_lack_needs_format_3_and_the_rest_keeps_its_old_encoding() {
    let plain = every("a", 1000);
    let mut labelled = every("a", 1000);
    labelled.labels.insert("k".into(), "v".into());
    let needs_3 = [
        Command::create_job(labelled.clone(), T0),
        Command::update_job(bounded("a", 1000, max_runs(2)), 0, T0),
        pause("a", "note", T0),
        Command::PauseFiring {
            note: String::new(),
            now_ms: T0,
        },
        Command::ResumeFiring { now_ms: T0 },
        by("ops", Command::create_job(labelled, T0)),
    ];
    for cmd in needs_3 {
        assert_eq!(
            VersionedCommand::at(&cmd, 2).err(),
            Some(FormatTooNew {
                needs: 3,
                active: 2
            }),
            "{cmd:?}"
        );
        let entry = VersionedCommand::at(&cmd, 3).unwrap();
        assert_eq!(entry.command(1).unwrap(), cmd);
    }
    for cmd in [
        Command::create_job(plain.clone(), T0),
        Command::update_job(plain.clone(), 4, T0),
        pause("a", "", T0),
    ] {
        assert_eq!(cmd.min_format(), 1, "{cmd:?}");
    }
    // CreateJob is variant 0, its spec the five fields format 1 has.
    let v1 = encode(&(
        0u8,
        (
            &plain.id,
            &plain.schedule,
            &plain.group,
            &plain.payload,
            &plain.policy,
        ),
        T0,
    ));
    assert_eq!(encode(&Command::create_job(plain, T0)), v1);
}

// ------------------------------------------------------------ concurrency

fn concurrent(id: &str, overlap: Overlap, max: Option<u32>) -> JobSpec {
    JobSpec {
        max_concurrent: max,
        ..with_overlap(every(id, 1000), overlap)
    }
}

fn states(sim: &Sim, job: &str) -> Vec<(i64, RunState)> {
    sim.runs_of(job)
        .iter()
        .map(|r| (r.id.scheduled_at_ms - T0, r.state))
        .collect()
}

#[test]
fn max_concurrent_with_allow_runs_that_many_at_once_and_records_the_rest_skipped() {
    let mut sim = Sim::default();
    sim.create(concurrent("a", Overlap::Allow, Some(2)), T0);
    for k in 1..=3 {
        sim.fire_due(T0 + k * 1000);
    }
    use RunState::*;
    assert_eq!(
        states(&sim, "a"),
        vec![(1000, Pending), (2000, Pending), (3000, Skipped)]
    );
    assert!(sim
        .run(&rid("a", T0 + 3000))
        .note
        .starts_with("max-concurrent 2: 2 runs still active"));
    // One ends: the next occurrence runs again.
    let mut r = report(&rid("a", T0 + 1000), 1, true, 0);
    r.retryable = false;
    sim.finish(T0 + 3500, r);
    sim.fire_due(T0 + 4000);
    assert_eq!(sim.run(&rid("a", T0 + 4000)).state, Pending);
}

/// A format-4 cluster whose job "a" (every second, overlap `replace`) has
/// its run of `T0 + 1000` held by worker w1.
fn replacing_job() -> Sim {
    let mut sim = Sim::default();
    sim.exec(Command::ActivateLogFormat { format: 4 });
    sim.create(concurrent("a", Overlap::Replace, None), T0);
    sim.fire_due(T0 + 1000);
    assign(&mut sim, T0 + 1000, T0 + 1100);
    sim
}

fn assign(sim: &mut Sim, at: i64, now_ms: i64) {
    sim.exec(Command::Assign {
        now_ms,
        assignments: vec![(rid("a", at), 1, "w1".into())],
    });
}

#[test]
fn replace_waits_for_the_replaced_run_to_stop_and_then_starts_the_newest() {
    let mut sim = replacing_job();
    let (old, new) = (rid("a", T0 + 1000), rid("a", T0 + 3000));
    let a = sim.fire_due(T0 + 2000);
    let cancel = Effect::Cancel {
        run: old.clone(),
        attempt: 1,
    };
    assert_eq!(
        a.effects,
        vec![cancel.clone(), Effect::Scheduled(occ("a", T0 + 3000))],
        "the worker is asked to stop; nothing ends or starts yet"
    );
    assert_eq!(sim.run(&old).state, RunState::Running);
    assert_eq!(sim.job("a").buffered_at_ms, Some(T0 + 2000));
    // Still running at the next occurrence: the newest waits, the older is skipped.
    sim.fire_due(T0 + 3000);
    let older = sim.run(&rid("a", T0 + 2000));
    assert_eq!(older.state, RunState::Skipped);
    assert_eq!(
        older.note,
        "overlap replace: superseded by a newer occurrence"
    );
    assert_eq!(sim.job("a").buffered_at_ms, Some(T0 + 3000));
    let trig = sim.exec(trigger("a", T0 + 3100));
    let Response::Run(held) = &trig.response else {
        panic!("{:?}", trig.response)
    };
    assert_eq!(
        held.note,
        "manual trigger: starts once the replaced run(s) stop"
    );
    assert!(sim.try_run(&held.id).is_none(), "held, not stored");
    assert!(sim.try_run(&new).is_some(), "superseded by the trigger");

    // The worker acknowledges: its failure ends the run cancelled, no retry.
    let ack = sim.finish(T0 + 3200, report(&old, 1, false, 0));
    let old_run = sim.run(&old);
    assert_eq!(old_run.state, RunState::Cancelled);
    assert_eq!(old_run.note, "replaced: attempt 1 stopped (failed)");
    let started = rid("a", T0 + 3100);
    assert!(ack.effects.contains(&ended(&old, 1)));
    assert!(ack
        .effects
        .contains(&ready(&started, 1, limits::DEFAULT_TIMEOUT_MS, T0 + 3200)));
    assert_eq!(
        sim.run(&started).note,
        "overlap replace: started once the replaced run(s) stopped"
    );
    assert_eq!(
        (sim.job("a").active_runs, sim.job("a").buffered_at_ms),
        (1, None)
    );
}

#[test]
fn replace_starts_the_new_run_when_the_replaced_ones_lease_ends_or_none_was_held() {
    let mut sim = replacing_job();
    let old = rid("a", T0 + 1000);
    sim.fire_due(T0 + 2000);
    let expired = sim.exec(Command::Expire {
        now_ms: T0 + 61_100,
        expired: vec![(old.clone(), 1, 0)],
    });
    assert_eq!(expired.response, Response::Batch(vec![Ok(())]));
    assert_eq!(sim.run(&old).state, RunState::Cancelled);
    assert_eq!(
        sim.run(&old).note,
        "replaced: attempt 1 stopped (timed-out)"
    );
    let retries = sim
        .wheel()
        .into_iter()
        .filter(|k| k.kind == EntryKind::Retry);
    assert_eq!(retries.count(), 0, "a replaced run is not retried");
    let new = rid("a", T0 + 2000);
    assert_eq!(sim.run(&new).state, RunState::Pending);
    // Not yet assigned: the next occurrence replaces it at once.
    let a = sim.fire(T0 + 61_200, vec![occ("a", T0 + 3000)]);
    assert!(a.effects.contains(&ended(&new, 1)), "{:?}", a.effects);
    assert_eq!(sim.run(&new).state, RunState::Cancelled);
    assert_eq!(sim.run(&rid("a", T0 + 3000)).state, RunState::Pending);
    assert_eq!(sim.job("a").active_runs, 1);
}

#[test]
fn buffer_all_queues_every_overlapping_occurrence_and_starts_them_in_order() {
    let mut sim = Sim::default();
    sim.create(concurrent("a", Overlap::BufferAll, None), T0);
    for k in 1..=4 {
        sim.fire_due(T0 + k * 1000);
    }
    assert_eq!(sim.job("a").queued, vec![T0 + 2000, T0 + 3000, T0 + 4000]);
    assert_eq!(
        sim.runs_of("a").len(),
        1,
        "the others wait, not recorded yet"
    );
    let trig = sim.exec(trigger("a", T0 + 4100));
    assert!(matches!(
        trig.response,
        Response::Error(CommandError::FailedPrecondition(_))
    ));
    for (k, at) in [(1, 1000), (2, 2000), (3, 3000)] {
        let mut r = report(&rid("a", T0 + at), 1, true, 0);
        r.retryable = false;
        sim.finish(T0 + 5000 + k, r);
        let next = rid("a", T0 + at + 1000);
        assert_eq!(
            sim.run(&next).state,
            RunState::Pending,
            "{next} started after {at}"
        );
        assert!(sim
            .run(&next)
            .note
            .starts_with("overlap buffer-all: started in order"));
    }
    assert!(sim.job("a").queued.is_empty());
}

#[test]
fn buffer_all_is_bounded_and_the_bounds_need_format_3() {
    let mut sim = Sim::default();
    sim.create(concurrent("a", Overlap::BufferAll, Some(1)), T0);
    let n = limits::BUFFER_ALL_MAX as i64 + 2;
    for k in 1..=n {
        sim.fire_due(T0 + k * 1000);
    }
    assert_eq!(sim.job("a").queued.len(), limits::BUFFER_ALL_MAX);
    let last = sim.run(&rid("a", T0 + n * 1000));
    assert_eq!(last.state, RunState::Skipped);
    assert!(last.note.contains("already wait"), "{}", last.note);
    // Changing the policy away from buffer-all drops the queue, recorded.
    sim.exec(update(
        concurrent("a", Overlap::Forbid, None),
        0,
        T0 + n * 1000 + 1,
    ));
    assert!(sim.job("a").queued.is_empty());
    assert_eq!(sim.run(&rid("a", T0 + 2000)).state, RunState::Skipped);
    let refused = sim.exec(Command::create_job(
        concurrent("b", Overlap::Allow, Some(0)),
        T0,
    ));
    assert_eq!(
        invalid_msg(&refused),
        "max_concurrent: must be between 1 and 4096, got 0"
    );
    for cmd in [
        Command::create_job(concurrent("c", Overlap::BufferAll, None), T0),
        Command::create_job(concurrent("c", Overlap::Allow, Some(3)), T0),
    ] {
        assert_eq!(cmd.min_format(), 3, "{cmd:?}");
    }
}
