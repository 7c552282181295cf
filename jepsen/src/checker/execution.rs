//! Checker `at-least-once-execution`: when harness workers were running, every
//! fire record of a harness-created job on the most-applied replica that fired
//! more than `execution_grace_ms` before the window end was received by a
//! worker at least once, and a run recorded as succeeded was received in the
//! attempt that succeeded (only harness workers can finish it).

use super::CheckResult;
use crate::event::{OpF, Workload};
use crate::history::History;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};

pub const NAME: &str = "at-least-once-execution";

const FINISHED_WITHOUT_WORK: [&str; 2] = ["SKIPPED", "CANCELLED"];

pub fn check(h: &History) -> CheckResult {
    let mut r = CheckResult::new(NAME);
    let enabled = h.meta.workloads.iter().any(|w| w == "execution")
        || (h.meta.workloads.is_empty() && !h.receipts.is_empty());
    if !enabled {
        r.note("execution workload not enabled: nothing to judge");
        return r;
    }
    let Some(reference) = h.reference_final() else {
        r.inconclusive("no reachable final state to look in");
        return r;
    };
    let harness_jobs: BTreeSet<&str> = h
        .ops
        .iter()
        .filter(|o| {
            o.invoke.f == OpF::Create
                && matches!(o.invoke.workload, Workload::Interval | Workload::Timers)
        })
        .map(|o| o.invoke.key.as_str())
        .collect();
    let mut received: BTreeMap<(&str, i64), BTreeSet<u32>> = BTreeMap::new();
    for x in &h.receipts {
        received
            .entry((x.job.as_str(), x.scheduled_at_ms))
            .or_default()
            .insert(x.attempt);
    }
    let due_before = h.window_end_ms() - h.bounds().execution_grace_ms;
    for run in &reference.runs {
        if !harness_jobs.contains(run.job.as_str())
            || FINISHED_WITHOUT_WORK.contains(&run.state.as_str())
        {
            continue;
        }
        let attempts = received.get(&(run.job.as_str(), run.scheduled_at_ms));
        if run.state == "SUCCEEDED" && !attempts.is_some_and(|a| a.contains(&run.attempt)) {
            r.flag(
                "succeeded_unreceived",
                json!({"run_id": run.run_id, "attempt": run.attempt, "received_attempts": attempts}),
            );
        } else if run.fired_at_ms < due_before {
            r.add("due", 1);
            if attempts.is_none() {
                r.flag(
                    "never_received",
                    json!({"run_id": run.run_id, "fired_at_ms": run.fired_at_ms, "state": run.state}),
                );
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Event;
    use crate::testkit::*;

    fn check_events(ev: Vec<Event>) -> CheckResult {
        check(&History::from_events(ev).unwrap())
    }

    #[test]
    fn healthy_runs_were_all_received() {
        let r = check_events(healthy_history());
        assert!(r.valid, "{r:?}");
    }

    #[test]
    fn pending_run_nobody_received_is_flagged() {
        let mut ev: Vec<Event> = healthy_history();
        ev.retain(|e| !matches!(e, Event::Receipt(x) if x.scheduled_at_ms == BASE_MS + 3_000));
        edit_finals(&mut ev, |f| {
            for x in f
                .runs
                .iter_mut()
                .filter(|x| x.scheduled_at_ms == BASE_MS + 3_000)
            {
                x.state = "PENDING".into();
            }
        });
        assert_eq!(check_events(ev).counts["never_received"], 1);
    }

    #[test]
    fn success_without_receipt_is_flagged() {
        let mut ev: Vec<Event> = healthy_history();
        ev.retain(|e| !matches!(e, Event::Receipt(x) if x.scheduled_at_ms == BASE_MS + 12_000));
        assert_eq!(check_events(ev).counts["succeeded_unreceived"], 1);
    }
}
