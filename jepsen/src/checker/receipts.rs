//! Checker `receipt-has-fire-record`: every run a worker received matches a
//! fire record (same job, scheduled time and run id) on the most-applied
//! replica, with an attempt no greater than the record's. A dispatch of
//! something the log never committed shows up here. A receipt of a job with a
//! delete that may have taken effect (acknowledged or unknown) is not judged
//! by a missing record: deleting a job removes its run records, and a delete
//! whose answer was lost can land after the fire.

use super::CheckResult;
use crate::event::{OpF, Outcome};
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
            None if maybe_deleted(h, &x.job) => r.add("deleted_job", 1),
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

/// Whether a delete of `job` was invoked and did not fail.
fn maybe_deleted(h: &History, job: &str) -> bool {
    (h.ops.iter())
        .any(|d| d.invoke.f == OpF::Delete && d.invoke.key == job && d.outcome() != Outcome::Fail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Workload;
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
    fn a_receipt_of_a_job_whose_delete_may_have_landed_is_not_judged_by_its_record() {
        let gone = |outcome| {
            let mut ev = healthy_history();
            edit_finals(&mut ev, |f| {
                f.runs.retain(|x| x.scheduled_at_ms != BASE_MS + 7_000)
            });
            let key = "int-0";
            ev.push(invoke(
                900,
                900,
                BASE_MS + 6_990,
                Workload::Timers,
                OpF::Delete,
                key,
            ));
            ev.push(done(900, 900, BASE_MS + 9_000, outcome));
            check(&History::from_events(ev).unwrap())
        };
        for outcome in [Outcome::Ok, Outcome::Unknown] {
            let r = gone(outcome);
            assert!(r.valid, "{outcome:?}: {r:?}");
            assert_eq!(r.counts["deleted_job"], 1);
        }
        // A delete that failed removed nothing: the missing record counts.
        assert_eq!(gone(Outcome::Fail).counts["without_record"], 1);
    }

    #[test]
    fn receipt_of_uncommitted_attempt_is_flagged() {
        let mut ev = healthy_history();
        ev.push(receipt("int-0", BASE_MS + 7_000, BASE_MS + 9_000, 2));
        let r = check(&History::from_events(ev).unwrap());
        assert_eq!(r.counts["mismatched_record"], 1);
    }
}
