//! Checker `never-early`: no worker received a run before its scheduled time
//! minus `early_epsilon_ms` by the harness's own (unskewed) clock, and no fire
//! record on any replica has `fired_at_ms` before `scheduled_at_ms`. This is
//! the guarantee a skewed node clock must not break. Runs of upstream-only
//! workflow jobs are not judged: they have no schedule, and their
//! `scheduled_at_ms` only names the run (several cycles completing in one
//! millisecond get the next free milliseconds, after the fire time).

use super::CheckResult;
use crate::event::{OpF, Workload};
use crate::history::History;
use serde_json::json;
use std::collections::BTreeSet;

pub const NAME: &str = "never-early";

pub fn check(h: &History) -> CheckResult {
    let mut r = CheckResult::new(NAME);
    let eps = h.bounds().early_epsilon_ms;
    let unscheduled: BTreeSet<&str> = (h.ops.iter())
        .filter(|o| o.is(Workload::Workflow, OpF::Create) && o.invoke.every_ms.is_none())
        .map(|o| o.invoke.key.as_str())
        .collect();
    let judged = |job: &str| !unscheduled.contains(job);
    let mut max_early_ms = 0;
    for x in h.receipts.iter().filter(|x| judged(&x.job)) {
        r.add("receipts", 1);
        if x.received_at_ms < x.scheduled_at_ms - eps {
            max_early_ms = max_early_ms.max(x.scheduled_at_ms - x.received_at_ms);
            r.flag(
                "early_receipts",
                json!({"run_id": x.run_id, "job": x.job, "scheduled_at_ms": x.scheduled_at_ms,
                       "received_at_ms": x.received_at_ms, "attempt": x.attempt,
                       "early_by_ms": x.scheduled_at_ms - x.received_at_ms, "worker": x.worker}),
            );
        }
    }
    if max_early_ms > 0 {
        r.add("max_early_by_ms", max_early_ms as u64);
    }
    for f in h.finals.iter().filter(|f| f.reachable) {
        for run in f.runs.iter().filter(|x| judged(&x.job)) {
            r.add("records", 1);
            if run.fired_at_ms < run.scheduled_at_ms {
                r.flag(
                    "early_records",
                    json!({"node": f.node, "run_id": run.run_id, "job": run.job,
                           "scheduled_at_ms": run.scheduled_at_ms, "fired_at_ms": run.fired_at_ms}),
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

    #[test]
    fn healthy_history_is_never_early() {
        let r = check(&History::from_events(healthy_history()).unwrap());
        assert!(r.valid, "{r:?}");
        assert_eq!(r.counts["receipts"], 14);
    }

    #[test]
    fn receipt_before_schedule_is_flagged_beyond_epsilon_only() {
        let mut ev = healthy_history();
        ev.push(receipt("int-0", BASE_MS + 3_000, BASE_MS + 2_950, 2));
        assert!(check(&History::from_events(ev.clone()).unwrap()).valid);
        ev.push(receipt("int-0", BASE_MS + 3_000, BASE_MS + 2_000, 2));
        let r = check(&History::from_events(ev).unwrap());
        assert_eq!(r.counts["early_receipts"], 1);
    }

    #[test]
    fn early_fire_record_is_flagged() {
        let ev = vec![Event::Final(final_node(1, 3, vec![fire("j", 100, 99)]))];
        let r = check(&History::from_events(ev).unwrap());
        assert_eq!(r.counts["early_records"], 1);
    }

    #[test]
    fn upstream_only_runs_named_after_their_fire_are_not_judged() {
        let runs = vec![fire("wf0-b", 101, 100), fire("wf0-a", 100, 99)];
        let mut ev = simple_ok(1, 0, Workload::Workflow, OpF::Create, "wf0-b");
        ev.push(Event::Final(final_node(1, 3, runs)));
        let r = check(&History::from_events(ev).unwrap());
        assert_eq!(r.counts["records"], 1, "{r:?}");
        assert_eq!(r.counts["early_records"], 1, "{r:?}");
    }
}
