//! Checker `never-early`: no worker received a run before its scheduled time
//! minus `early_epsilon_ms` by the harness's own (unskewed) clock, and no fire
//! record on any replica has `fired_at_ms` before `scheduled_at_ms`. This is
//! the guarantee a skewed node clock must not break.

use super::CheckResult;
use crate::history::History;
use serde_json::json;

pub const NAME: &str = "never-early";

pub fn check(h: &History) -> CheckResult {
    let mut r = CheckResult::new(NAME);
    let eps = h.bounds().early_epsilon_ms;
    let mut max_early_ms = 0;
    for x in &h.receipts {
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
        for run in &f.runs {
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
}
