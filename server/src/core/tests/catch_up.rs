//! The `fire-all` catch-up cap (issue #16 item 9), by outputs: after an
//! outage at most `catch_up_max` missed occurrences run, the newest, in
//! order; the older ones are one skipped record with one note.

use super::*;

fn capped(id: &str, every_ms: u64, cap: Option<u32>) -> JobSpec {
    JobSpec {
        catch_up_max: cap,
        ..with_misfire(every(id, every_ms), Misfire::FireAll, 1000)
    }
}

fn every_second_cron(id: &str, cap: u32) -> JobSpec {
    let cron = ScheduleInput::Cron {
        expr: "* * * * * *".into(),
        tz: "UTC".into(),
    };
    JobSpec {
        catch_up_max: Some(cap),
        ..with_misfire(spec(id, cron), Misfire::FireAll, 1000)
    }
}

/// Fires whatever is due at `now` until nothing is, as the leader does.
fn fire_until_idle(sim: &mut Sim, now: i64) {
    while !sim.due(now).is_empty() {
        sim.fire_due(now);
    }
}

fn states(sim: &Sim, job: &str) -> Vec<(i64, RunState)> {
    let runs = sim.runs_of(job);
    runs.iter()
        .map(|r| (r.id.scheduled_at_ms - T0, r.state))
        .collect()
}

#[test]
fn past_the_cap_the_older_missed_occurrences_are_one_skipped_note_and_the_newest_run_in_order() {
    let mut sim = sim_with(capped("a", 1000, Some(5)));
    // 21 occurrences (T0+1 s .. T0+21 s) fall due during an outage.
    let now = T0 + 21_500;
    fire_until_idle(&mut sim, now);
    let mut want = vec![(1000, RunState::Skipped)];
    want.extend((17..=21).map(|s| (s * 1000, RunState::Pending)));
    assert_eq!(states(&sim, "a"), want);
    assert_eq!(
        sim.run(&rid("a", T0 + 1000)).note,
        format!(
            "misfire fire-all: catch-up cap 5: 16 missed occurrence(s) from {} to {} not run",
            T0 + 1000,
            T0 + 16_000
        )
    );
    assert_eq!(
        sim.run(&rid("a", T0 + 17_000)).note,
        "late by 4500 ms (misfire fire-all)"
    );
    assert_eq!(sim.job("a").next_fire_at_ms, Some(T0 + 22_000));
}

#[test]
fn the_default_cap_applies_once_the_cluster_writes_log_format_4() {
    // Formats 1 to 3 (a cluster with members of older releases, which
    // have no cap): every missed occurrence runs.
    for format in [1, 3] {
        let mut old = Sim::default();
        old.exec(Command::ActivateLogFormat { format });
        old.create(capped("a", 1000, None), T0);
        fire_until_idle(&mut old, T0 + 150_500);
        assert_eq!(old.runs_of("a").len(), 150, "format {format}");
    }

    let mut new = Sim::default();
    new.exec(Command::ActivateLogFormat { format: 4 });
    new.create(capped("a", 1000, None), T0);
    fire_until_idle(&mut new, T0 + 150_500);
    let runs = new.runs_of("a");
    assert_eq!(runs.len(), 1 + limits::CATCH_UP_DEFAULT as usize);
    assert!(runs[0]
        .note
        .starts_with("misfire fire-all: catch-up cap 100: 50 missed occurrence(s)"));
    assert_eq!(runs[1].id.scheduled_at_ms, T0 + 51_000);
}

#[test]
fn a_cron_catch_up_keeps_the_newest_occurrences() {
    let mut sim = sim_with(every_second_cron("c", 3));
    fire_until_idle(&mut sim, T0 + 10_500);
    assert_eq!(
        states(&sim, "c"),
        vec![
            (1000, RunState::Skipped),
            (8000, RunState::Pending),
            (9000, RunState::Pending),
            (10_000, RunState::Pending),
        ]
    );
    assert!(sim
        .run(&rid("c", T0 + 1000))
        .note
        .contains("7 missed occurrence(s)"));
}

#[test]
fn a_cron_outage_past_the_walk_bound_is_skipped_a_bounded_walk_at_a_time() {
    // Three hours of an every-second job: 10,800 due, more than one
    // command walks (cap + 10,000).
    let mut sim = sim_with(every_second_cron("c", 1));
    let now = T0 + 10_800_500;
    let first = sim.fire_due(now);
    assert_eq!(first.response, fired(1, 0));
    assert_eq!(
        sim.run(&rid("c", T0 + 1000)).note,
        format!(
            "misfire fire-all: catch-up cap 1: 10000 missed occurrence(s) from {} to {} not run; more follow",
            T0 + 1000,
            T0 + 10_000_000
        )
    );
    assert_eq!(sim.job("c").next_fire_at_ms, Some(T0 + 10_001_000));
    fire_until_idle(&mut sim, now);
    assert_eq!(
        states(&sim, "c"),
        vec![
            (1000, RunState::Skipped),
            (10_001_000, RunState::Skipped),
            (10_800_000, RunState::Pending),
        ]
    );
    assert!(sim
        .run(&rid("c", T0 + 10_001_000))
        .note
        .contains(": 799 missed occurrence(s)"));
}

#[test]
fn a_catch_up_cap_outside_its_range_is_refused() {
    let mut sim = Sim::default();
    for (cap, got) in [(0, "0"), (10_001, "10001")] {
        let a = sim.exec(Command::create_job(capped("a", 1000, Some(cap)), T0));
        assert_eq!(
            invalid_msg(&a),
            format!("catch_up_max: must be between 1 and 10000, got {got}")
        );
        assert_nothing_done(&a);
    }
}
