//! Checker `no-lost-jobs`: a job or timer whose create was acknowledged is in
//! the final state of every caught-up replica, unless some delete of it may
//! have taken effect (acknowledged or unknown, completing after the create was
//! invoked). A one-shot timer that already fired counts as present through its
//! fire record, in case the server retires fired timers. Each loss names
//! the create (op id, times) and the node that acknowledged it.

use super::CheckResult;
use crate::event::{OpF, Outcome, Workload};
use crate::history::{History, Op};
use serde_json::json;
use std::collections::BTreeSet;

pub const NAME: &str = "no-lost-jobs";

/// Workloads whose creates are tracked.
const TRACKED: [Workload; 5] = [
    Workload::Register,
    Workload::Interval,
    Workload::Timers,
    Workload::Probe,
    Workload::Workflow,
];

pub fn check(h: &History) -> CheckResult {
    let mut r = CheckResult::new(NAME);
    let finals = h.caught_up_finals();
    if finals.is_empty() {
        if h.ops
            .iter()
            .any(|o| o.invoke.f == OpF::Create && o.ok().is_some())
        {
            r.inconclusive("no reachable final state to look in");
        }
        return r;
    }
    r.add("replicas", finals.len() as u64);
    for o in must_exist(h) {
        r.add("acknowledged", 1);
        let (key, workload) = (&o.invoke.key, o.invoke.workload);
        for f in &finals {
            let has_job = f.jobs.iter().any(|j| j.id == *key);
            let fired = workload == Workload::Timers && f.runs.iter().any(|x| x.job == *key);
            if !has_job && !fired {
                r.flag(
                    "lost",
                    json!({"key": key, "workload": workload, "op": o.invoke.op,
                           "invoked_at_ms": o.invoke.time_ms,
                           "acknowledged_at_ms": o.complete_ms(),
                           "acknowledged_by": o.invoke.node,
                           "node": f.node, "applied_index": f.applied_index}),
                );
            }
        }
    }
    r
}

/// The first acknowledged create of each key that no delete may have undone.
pub fn must_exist(h: &History) -> Vec<&Op> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for o in &h.ops {
        let w = o.invoke.workload;
        if o.invoke.f != OpF::Create || !TRACKED.contains(&w) || o.ok().is_none() {
            continue;
        }
        let key = &o.invoke.key;
        let created_ms = o.invoke.time_ms;
        let maybe_deleted = h.ops.iter().any(|d| {
            d.invoke.key == *key
                && d.invoke.f == OpF::Delete
                && d.outcome() != Outcome::Fail
                && d.complete_ms() > created_ms
        });
        if !maybe_deleted && seen.insert(key.clone()) {
            out.push(o);
        }
    }
    out
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
    fn healthy_history_loses_nothing() {
        let r = check_events(healthy_history());
        assert!(r.valid, "{r:?}");
        // int-0, tmr-0, reg-0, probe; tmr-1 was deleted.
        assert_eq!(r.counts["acknowledged"], 4);
    }

    #[test]
    fn dropped_job_is_flagged_on_every_replica() {
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| f.jobs.retain(|j| j.id != "int-0"));
        let r = check_events(ev);
        assert!(!r.valid);
        assert_eq!(r.counts["lost"], 3);
        let ex = &r.counterexamples[0];
        assert_eq!(ex["op"], 1);
        assert_eq!(ex["acknowledged_by"], 1);
        assert_eq!(ex["invoked_at_ms"], BASE_MS + 1_000);
        assert_eq!(ex["acknowledged_at_ms"], BASE_MS + 1_010);
    }

    #[test]
    fn lost_workflow_job_is_flagged() {
        let mut ev = healthy_history();
        ev.extend(create_ok(40, BASE_MS + 500, Workload::Workflow, "wf0-b", 0));
        assert_eq!(check_events(ev.clone()).counts["lost"], 3);
        edit_finals(&mut ev, |f| {
            f.jobs.push(crate::event::FinalJob {
                id: "wf0-b".into(),
                ..Default::default()
            })
        });
        assert!(check_events(ev).valid);
    }

    #[test]
    fn fired_timer_may_be_retired() {
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| f.jobs.retain(|j| j.id != "tmr-0"));
        assert!(check_events(ev).valid);
    }

    #[test]
    fn unknown_delete_excuses_absence() {
        let mut ev = healthy_history();
        ev.push(invoke(
            50,
            9,
            BASE_MS + 3_000,
            Workload::Register,
            OpF::Delete,
            "reg-0",
        ));
        edit_finals(&mut ev, |f| f.jobs.retain(|j| j.id != "reg-0"));
        assert!(check_events(ev).valid);
    }

    #[test]
    fn lagging_replica_is_not_judged() {
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| {
            if f.node == 3 {
                f.applied_index = 50;
                f.jobs.clear();
            }
        });
        let r = check_events(ev);
        assert!(r.valid, "{r:?}");
        assert_eq!(r.counts["replicas"], 2);
    }
}
