//! Several schedules per job (issue #16 item 2), by outputs: the job fires
//! at the union of its schedules' occurrences, an instant matched by two
//! once; misfire walks, jitter's gap check and backfill see the union.

use super::*;
use crate::core::backfill;

/// `every 2s` (T0+2 s, +4 s, ...) and a cron every 3 seconds: T0 is at
/// second :20, so the cron matches T0+1 s, +4 s, +7 s, ...; both match
/// T0+4 s and T0+10 s.
fn two_schedules(id: &str) -> JobSpec {
    JobSpec {
        also: vec![every_three_seconds()],
        ..every(id, 2000)
    }
}

fn every_three_seconds() -> ScheduleInput {
    ScheduleInput::Cron {
        expr: "*/3 * * * * *".into(),
        tz: "UTC".into(),
    }
}

/// Union occurrences after T0 through T0+10 s, as offsets from T0.
const UNION_TO_10S: [i64; 7] = [1000, 2000, 4000, 6000, 7000, 8000, 10_000];

fn scheduled(sim: &Sim, job: &str) -> Vec<i64> {
    let runs = sim.runs_of(job);
    runs.iter().map(|r| r.id.scheduled_at_ms - T0).collect()
}

#[test]
fn a_job_fires_at_the_union_of_its_schedules_and_a_shared_instant_once() {
    let mut sim = sim_with(two_schedules("a"));
    assert_eq!(sim.occurrences("a"), vec![T0 + 1000]);
    let mut fired_runs = 0;
    for t in (T0..=T0 + 10_000).step_by(500) {
        if let Response::Fired { runs, .. } = sim.fire_due(t).response {
            fired_runs += runs;
        }
    }
    assert_eq!(scheduled(&sim, "a"), UNION_TO_10S);
    assert_eq!(fired_runs, 7, "T0+4 s and T0+10 s each fired one run");
    assert_eq!(sim.occurrences("a"), vec![T0 + 12_000]);
}

#[test]
fn union_preview_merges_and_keeps_a_shared_instant_once() {
    let s = two_schedules("a").resolve_schedule(T0);
    let got: Vec<i64> = s.preview(T0, 7).unwrap().iter().map(|t| t - T0).collect();
    assert_eq!(got, UNION_TO_10S);
    assert!(!s.is_one_shot());
    assert_eq!(s.members().len(), 2);
}

#[test]
fn misfire_fire_once_coalesces_the_missed_occurrences_of_all_schedules() {
    let mut sim = sim_with(with_misfire(two_schedules("a"), Misfire::FireOnce, 1000));
    sim.fire(T0 + 10_500, vec![occ("a", T0 + 1000)]);
    let runs = sim.runs_of("a");
    assert_eq!(scheduled(&sim, "a"), vec![10_000]);
    assert!(
        runs[0].note.contains("coalesced 7 missed"),
        "{}",
        runs[0].note
    );
    assert_eq!(sim.occurrences("a"), vec![T0 + 12_000]);
}

#[test]
fn misfire_skip_skips_the_union_occurrences_past_the_grace_window() {
    let mut sim = sim_with(with_misfire(two_schedules("a"), Misfire::Skip, 1000));
    sim.fire(T0 + 10_500, vec![occ("a", T0 + 1000)]);
    assert_eq!(
        sim.run(&rid("a", T0 + 1000)).note,
        format!(
            "misfire skip: 6 occurrence(s) from {} to {} not run",
            T0 + 1000,
            T0 + 8000
        )
    );
    // T0+10 s (500 ms late) is inside the window: it is still pending.
    assert_eq!(sim.occurrences("a"), vec![T0 + 10_000]);
}

#[test]
fn backfill_plans_the_union_of_a_past_range() {
    let s = two_schedules("a").resolve_schedule(T0);
    let plan = backfill::plan(&s, T0 + 1, T0 + 10_001, T0 + 20_000).unwrap();
    assert_eq!(plan, (T0 + 1000, 7));
}

#[test]
fn jitter_must_be_shorter_than_the_smallest_gap_of_the_union() {
    let mut s = two_schedules("a");
    s.jitter = Some(Jitter { ms: 1000, seed: 7 });
    let mut sim = Sim::default();
    let a = sim.exec(Command::create_job(s.clone(), T0));
    assert_eq!(
        invalid_msg(&a),
        "jitter: must be shorter than the schedule's gap between occurrences (1000 ms), got 1000 ms"
    );
    s.jitter = Some(Jitter { ms: 999, seed: 7 });
    sim.create(s, T0);
}

#[test]
fn a_union_is_stored_as_its_first_schedule_and_a_tail() {
    let sim = sim_with(two_schedules("a"));
    let job = sim.job("a");
    assert_eq!(job.schedule, two_schedules("a").resolve_schedule(T0));
    let record = job.to_record();
    assert!(Job::record_has_tail(&record));
    // The other schedules are in the second tail: format 4's.
    assert_eq!(Job::record_format(&record), 4);
    // What a format-8 reader sees: the first schedule alone.
    let head: Job = bincode::serde::decode_from_slice(&record, bincode::config::standard())
        .unwrap()
        .0;
    assert_eq!(head.schedule, every("a", 2000).schedule.resolve(T0));
    assert_eq!(Job::from_record(&record).unwrap(), job);
    assert_eq!(Command::create_job(two_schedules("a"), T0).min_format(), 4);
}

#[test]
fn an_update_keeping_the_schedules_keeps_the_pending_entry_and_dropping_one_reschedules() {
    let mut sim = sim_with(two_schedules("a"));
    sim.exec(update(two_schedules("a"), 1, T0 + 500));
    assert_eq!(sim.occurrences("a"), vec![T0 + 1000]);
    assert_eq!(sim.job("a").schedule.members().len(), 2);
    // Only `every 2s`, anchored at the update.
    sim.exec(update(every("a", 2000), 2, T0 + 500));
    assert_eq!(sim.occurrences("a"), vec![T0 + 2500]);
    assert_eq!(sim.job("a").schedule.members().len(), 1);
}

#[test]
fn each_invalid_set_of_schedules_is_refused_naming_its_field_with_no_writes() {
    let at = ScheduleInput::At { at_ms: T0 + 5000 };
    let cron = |expr: &str| ScheduleInput::Cron {
        expr: expr.into(),
        tz: "UTC".into(),
    };
    let eight: Vec<ScheduleInput> = (1..=8)
        .map(|n| ScheduleInput::Every { every_ms: n * 1000 })
        .collect();
    let cases = [
        (
            JobSpec {
                also: eight,
                ..every("a", 500)
            },
            "also: at most 7 more schedules (8 in all), got 8",
        ),
        (
            JobSpec {
                also: vec![at.clone()],
                ..every("a", 500)
            },
            "also[0]: must be a cron, Quartz or every schedule",
        ),
        (
            JobSpec {
                also: vec![every_three_seconds()],
                ..spec("a", at)
            },
            "also: only a cron, Quartz or every schedule may have more schedules",
        ),
        (
            JobSpec {
                also: vec![every_three_seconds(), every_three_seconds()],
                ..every("a", 500)
            },
            "also[1]: repeats another of the job's schedules",
        ),
        (
            JobSpec {
                also: vec![ScheduleInput::Every { every_ms: 500 }],
                ..every("a", 500)
            },
            "also[0]: repeats another of the job's schedules",
        ),
        (
            JobSpec {
                also: vec![cron("61 * * * *")],
                ..every("a", 500)
            },
            "also[0]: schedule.cron.expr:",
        ),
        (
            JobSpec {
                also: vec![ScheduleInput::Every { every_ms: 0 }],
                ..every("a", 500)
            },
            "also[0]: schedule.every: must be between 1 ms and 10 years",
        ),
    ];
    for (spec, want) in cases {
        let mut sim = Sim::default();
        let a = sim.exec(Command::create_job(spec, T0));
        assert!(invalid_msg(&a).starts_with(want), "{}", invalid_msg(&a));
        assert_nothing_done(&a);
    }
}
