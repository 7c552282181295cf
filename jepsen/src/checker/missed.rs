//! Checker `no-missed-occurrence`: every occurrence of an acknowledged,
//! never-modified interval job, and every acknowledged timer nobody tried to
//! cancel, fired within [t, deadline(t)], where the deadline is
//! `healthy_lateness_ms` after t, or `recovery_ms` after the end of a fault
//! that overlapped t. Occurrences are taken from the create's answer
//! (`next_fire_at_ms`, then every `every_ms`) up to the window end (when the
//! harness began pausing jobs) minus the healthy bound. An occurrence whose
//! deadline had not passed when the final state was read is not required.
//! Fire records come from the most-applied replica.

use super::{deadline_ms, CheckResult};
use crate::event::{OpF, Outcome, Workload};
use crate::history::{History, Op};
use serde_json::json;

pub const NAME: &str = "no-missed-occurrence";

/// Occurrences examined per job, at most.
pub const MAX_OCCURRENCES_PER_JOB: usize = 1_000_000;

pub fn check(h: &History) -> CheckResult {
    let mut r = CheckResult::new(NAME);
    let runs = h.reference_runs();
    if h.reference_final().is_none() {
        r.inconclusive("no reachable final state to look in");
        return r;
    }
    let window_end = h.window_end_ms() - h.bounds().healthy_lateness_ms;
    r.details = Some(bounds_stated(h, window_end));
    let read_ms = h.final_read_ms();
    for (key, occurrences) in expected(h, window_end) {
        for t in occurrences {
            let deadline = deadline_ms(h, t);
            match runs.get(&(key.clone(), t)) {
                Some(run) if run.fired_at_ms > deadline => r.flag(
                    "late",
                    json!({"job": key, "scheduled_at_ms": t, "fired_at_ms": run.fired_at_ms,
                           "lateness_ms": run.fired_at_ms - t, "allowed_ms": deadline - t}),
                ),
                Some(run) => {
                    r.add("fired_in_time", 1);
                    let late = (run.fired_at_ms - t).max(0) as u64;
                    let max = r.counts.entry("max_lateness_ms".into()).or_insert(0);
                    *max = (*max).max(late);
                }
                None if deadline >= read_ms => r.add("not_yet_due", 1),
                None => r.flag(
                    "missing",
                    json!({"job": key, "scheduled_at_ms": t, "deadline_ms": deadline}),
                ),
            }
        }
    }
    r
}

/// The lateness bound L in force in each period, for the report.
fn bounds_stated(h: &History, window_end: i64) -> serde_json::Value {
    let b = h.bounds();
    let periods: Vec<_> = h
        .faults
        .iter()
        .map(|p| {
            json!({"fault": p.kind, "nodes": p.nodes, "start_ms": p.start_ms, "end_ms": p.end_ms,
                   "due_from_ms": p.start_ms - b.healthy_lateness_ms,
                   "may_fire_until_ms": p.end_ms.saturating_add(b.recovery_ms)})
        })
        .collect();
    json!({"healthy_lateness_ms": b.healthy_lateness_ms, "recovery_ms": b.recovery_ms,
           "window_end_ms": window_end, "fault_periods": periods})
}

/// (job, occurrence times) that must have fired.
fn expected(h: &History, window_end: i64) -> Vec<(String, Vec<i64>)> {
    let mut out = Vec::new();
    for o in &h.ops {
        let (Some(c), Workload::Interval | Workload::Timers) = (o.ok(), o.invoke.workload) else {
            continue;
        };
        if o.invoke.f != OpF::Create || modified(h, o) {
            continue;
        }
        let first = match c.next_fire_at_ms.filter(|t| *t > 0) {
            Some(t) => t,
            None => match (o.invoke.every_ms, c.created_at_ms, o.invoke.at_ms) {
                (Some(e), Some(c), _) => c + e as i64,
                (None, _, Some(at)) => at,
                _ => continue,
            },
        };
        let times: Vec<i64> = match o.invoke.every_ms.filter(|e| *e > 0) {
            Some(every) => (0..MAX_OCCURRENCES_PER_JOB as i64)
                .map(|k| first + k * every as i64)
                .take_while(|t| *t < window_end)
                .collect(),
            None => vec![first]
                .into_iter()
                .filter(|t| *t < window_end)
                .collect(),
        };
        out.push((o.invoke.key.clone(), times));
    }
    out
}

/// Any update, delete, pause or resume that may have touched the job (a
/// paused job skips occurrences; pausing for quiesce happens after the
/// window and does not count).
fn modified(h: &History, create: &Op) -> bool {
    h.ops.iter().any(|o| {
        let touches = match o.invoke.f {
            OpF::Update | OpF::Delete | OpF::Resume => true,
            OpF::Pause => o.invoke.workload != Workload::Quiesce,
            OpF::Create | OpF::Get => false,
        };
        o.invoke.key == create.invoke.key && touches && o.outcome() != Outcome::Fail
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Phase;
    use crate::testkit::*;

    fn check_events(ev: Vec<crate::event::Event>) -> CheckResult {
        check(&History::from_events(ev).unwrap())
    }

    #[test]
    fn healthy_history_misses_nothing() {
        let r = check_events(healthy_history());
        assert!(r.valid, "{r:?}");
        // int-0 from +2 s up to the window end (+14.5 s - 2 s), and tmr-0.
        assert_eq!(r.counts["fired_in_time"], 11 + 1);
    }

    #[test]
    fn removed_record_is_missing() {
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| {
            f.runs.retain(|x| x.scheduled_at_ms != BASE_MS + 2_000)
        });
        let r = check_events(ev);
        assert_eq!(r.counts["missing"], 1, "{r:?}");
    }

    #[test]
    fn lateness_is_judged_against_fault_periods() {
        let mut ev = healthy_history();
        // +2 s fired 3 s late with no fault around it: late.
        edit_finals(&mut ev, |f| {
            for x in f
                .runs
                .iter_mut()
                .filter(|x| x.scheduled_at_ms == BASE_MS + 2_000)
            {
                x.fired_at_ms += 3_000;
            }
        });
        assert_eq!(check_events(ev.clone()).counts["late"], 1);
        // +6 s (inside the kill fault +5..+8 s) may fire up to recovery after +8 s.
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| {
            for x in f
                .runs
                .iter_mut()
                .filter(|x| x.scheduled_at_ms == BASE_MS + 6_000)
            {
                x.fired_at_ms = BASE_MS + 8_000 + 19_000;
            }
        });
        assert!(check_events(ev).valid);
    }

    #[test]
    fn unhealed_fault_excuses_everything_after_it() {
        let mut ev = healthy_history();
        ev.push(nemesis(9, BASE_MS + 9_000, Phase::Start, "partition"));
        edit_finals(&mut ev, |f| {
            f.runs.retain(|x| x.scheduled_at_ms < BASE_MS + 9_000)
        });
        let r = check_events(ev);
        assert!(r.valid, "{r:?}");
        assert!(r.counts["not_yet_due"] >= 3);
    }

    #[test]
    fn paused_interval_job_is_not_expected() {
        let mut ev = healthy_history();
        ev.extend(create_ok(
            60,
            BASE_MS + 1_000,
            Workload::Interval,
            "int-p0",
            BASE_MS + 2_000,
        ));
        // No fire records at all: only its pause excuses that.
        assert!(check_events(ev.clone()).counts["missing"] > 0);
        ev.extend(simple_ok(
            61,
            BASE_MS + 1_100,
            Workload::Interval,
            OpF::Pause,
            "int-p0",
        ));
        assert!(check_events(ev).valid);
    }

    #[test]
    fn cancelled_timer_is_not_expected() {
        let mut ev = healthy_history();
        ev.extend(create_ok(
            60,
            BASE_MS + 1_000,
            Workload::Timers,
            "tmr-9",
            BASE_MS + 3_000,
        ));
        ev.extend(simple_ok(
            61,
            BASE_MS + 1_100,
            Workload::Timers,
            OpF::Delete,
            "tmr-9",
        ));
        assert!(check_events(ev).valid);
    }
}
