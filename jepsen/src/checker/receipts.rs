//! Checker `receipt-has-fire-record`: every run a worker received matches a
//! fire record (same job, scheduled time and run id) on the most-applied
//! replica, with an attempt no greater than the record's. A dispatch of
//! something the log never committed shows up here.

use super::CheckResult;
use crate::history::History;
use serde_json::json;

pub const NAME: &str = "receipt-has-fire-record";

pub fn check(h: &History) -> CheckResult {
    let mut r = CheckResult::new(NAME);
    if h.receipts.is_empty() {
        return r;
    }
    if h.reference_final().is_none() {
        r.inconclusive("no reachable final state to look in");
        return r;
    }
    let runs = h.reference_runs();
    for x in &h.receipts {
        r.add("receipts", 1);
        match runs.get(&(x.job.clone(), x.scheduled_at_ms)) {
            None => r.flag(
                "without_record",
                json!({"run_id": x.run_id, "job": x.job, "scheduled_at_ms": x.scheduled_at_ms,
                       "attempt": x.attempt, "worker": x.worker}),
            ),
            Some(run) if run.run_id != x.run_id || x.attempt > run.attempt => r.flag(
                "mismatched_record",
                json!({"receipt": {"run_id": x.run_id, "attempt": x.attempt},
                       "record": {"run_id": run.run_id, "attempt": run.attempt}}),
            ),
            Some(_) => {}
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::*;

    #[test]
    fn healthy_receipts_have_records() {
        let r = check(&History::from_events(healthy_history()).unwrap());
        assert!(r.valid, "{r:?}");
    }

    #[test]
    fn receipt_without_record_is_flagged() {
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| {
            f.runs.retain(|x| x.scheduled_at_ms != BASE_MS + 7_000)
        });
        let r = check(&History::from_events(ev).unwrap());
        assert_eq!(r.counts["without_record"], 1);
    }

    #[test]
    fn receipt_of_uncommitted_attempt_is_flagged() {
        let mut ev = healthy_history();
        ev.push(receipt("int-0", BASE_MS + 7_000, BASE_MS + 9_000, 2));
        let r = check(&History::from_events(ev).unwrap());
        assert_eq!(r.counts["mismatched_record"], 1);
    }
}
