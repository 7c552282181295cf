//! Checker `no-undone-writes`: an acknowledged delete or pause is still in
//! force in the final state of every caught-up replica, unless an operation
//! that could undo it may have taken effect after it.
//!
//! - A job whose delete was acknowledged is absent, unless a create of it
//!   that did not fail completed after the delete was invoked (it may have
//!   landed after the delete).
//! - A job whose pause was acknowledged (the pause workload's and the
//!   harness's quiesce pauses alike) is paused if present, unless a resume or
//!   create of it that did not fail completed after the pause was invoked.
//!   An update keeps a job paused, so it excuses nothing; an absent job is
//!   `no-lost-jobs`' business.
//!
//! Only the last acknowledged delete (pause) of each job is judged: any
//! operation excusing it excuses the earlier ones too. Lost acknowledged
//! creates are `no-lost-jobs`; lost register writes are
//! `linearizable-register`'s.

use super::CheckResult;
use crate::event::{FinalNode, OpF, Outcome};
use crate::history::{History, Op};
use serde_json::json;
use std::collections::BTreeMap;

pub const NAME: &str = "no-undone-writes";

pub fn check(h: &History) -> CheckResult {
    let mut r = CheckResult::new(NAME);
    let finals = h.caught_up_finals();
    let deletes = last_acknowledged(h, OpF::Delete);
    let pauses = last_acknowledged(h, OpF::Pause);
    r.add("deletes_judged", 0);
    r.add("pauses_judged", 0);
    if finals.is_empty() {
        if !deletes.is_empty() || !pauses.is_empty() {
            r.inconclusive("no reachable final state to look in");
        }
        return r;
    }
    for (key, d) in deletes {
        if may_follow(h, key, d, &[OpF::Create]) {
            r.add("deletes_excused", 1);
            continue;
        }
        r.add("deletes_judged", 1);
        for f in finals.iter().filter(|f| f.jobs.iter().any(|j| j.id == key)) {
            r.flag("resurrected", example(d, f));
        }
    }
    for (key, p) in pauses {
        if may_follow(h, key, p, &[OpF::Resume, OpF::Create]) {
            r.add("pauses_excused", 1);
            continue;
        }
        r.add("pauses_judged", 1);
        for f in &finals {
            if f.jobs.iter().any(|j| j.id == key && !j.paused) {
                r.flag("unpaused", example(p, f));
            }
        }
    }
    r
}

/// Per job, its acknowledged `f` invoked last.
fn last_acknowledged(h: &History, f: OpF) -> BTreeMap<&str, &Op> {
    let mut m: BTreeMap<&str, &Op> = BTreeMap::new();
    for o in h.ops.iter().filter(|o| o.invoke.f == f && o.ok().is_some()) {
        let e = m.entry(o.invoke.key.as_str()).or_insert(o);
        if o.invoke.time_ms >= e.invoke.time_ms {
            *e = o;
        }
    }
    m
}

/// Some operation in `undo` on `key`, not failed, may have taken effect
/// after `op`: it completed (or never did) after `op` was invoked.
fn may_follow(h: &History, key: &str, op: &Op, undo: &[OpF]) -> bool {
    h.ops.iter().any(|o| {
        o.invoke.key == key
            && undo.contains(&o.invoke.f)
            && o.outcome() != Outcome::Fail
            && o.complete_ms() > op.invoke.time_ms
    })
}

/// Names the operation, who acknowledged it, and the replica that lost it.
fn example(o: &Op, f: &FinalNode) -> serde_json::Value {
    json!({"op": o.invoke.op, "f": o.invoke.f, "job": o.invoke.key,
           "workload": o.invoke.workload, "invoked_at_ms": o.invoke.time_ms,
           "acknowledged_at_ms": o.complete_ms(), "acknowledged_by": o.invoke.node,
           "replica": f.node, "applied_index": f.applied_index})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, FinalJob, Workload};
    use crate::testkit::*;

    fn check_events(ev: Vec<Event>) -> CheckResult {
        check(&History::from_events(ev).unwrap())
    }

    fn with_job(ev: &mut [Event], id: &str, paused: bool) {
        edit_finals(ev, |f| {
            f.jobs.retain(|j| j.id != id);
            f.jobs.push(FinalJob {
                id: id.into(),
                paused,
                ..Default::default()
            });
        });
    }

    #[test]
    fn healthy_history_keeps_its_delete_and_pause() {
        let r = check_events(healthy_history());
        assert!(r.valid, "{r:?}");
        // tmr-1's cancel and int-0's quiesce pause.
        assert_eq!(r.counts["deletes_judged"], 1);
        assert_eq!(r.counts["pauses_judged"], 1);
    }

    #[test]
    fn deleted_job_present_again_is_flagged() {
        let mut ev = healthy_history();
        with_job(&mut ev, "tmr-1", false);
        let r = check_events(ev);
        assert!(!r.valid);
        assert_eq!(r.counts["resurrected"], 3);
        let ex = &r.counterexamples[0];
        assert_eq!(ex["op"], 4);
        assert_eq!(ex["job"], "tmr-1");
        assert_eq!(ex["acknowledged_by"], 1);
        assert_eq!(ex["invoked_at_ms"], BASE_MS + 2_000);
        assert_eq!(ex["acknowledged_at_ms"], BASE_MS + 2_010);
    }

    #[test]
    fn create_after_the_delete_excuses_presence() {
        let mut ev = healthy_history();
        // reg-0: deleted, then created again (unknown: it may have landed).
        ev.extend(simple_ok(
            60,
            BASE_MS + 3_000,
            Workload::Register,
            OpF::Delete,
            "reg-0",
        ));
        ev.push(invoke(
            61,
            7,
            BASE_MS + 3_500,
            Workload::Register,
            OpF::Create,
            "reg-0",
        ));
        let r = check_events(ev.clone());
        assert!(r.valid, "{r:?}");
        assert_eq!(r.counts["deletes_excused"], 1);
        // A create that finished before the delete was invoked excuses nothing.
        let mut ev = healthy_history();
        ev.extend(simple_ok(
            60,
            BASE_MS + 3_000,
            Workload::Register,
            OpF::Delete,
            "reg-0",
        ));
        let r = check_events(ev);
        assert_eq!(r.counts["resurrected"], 3, "{r:?}");
        assert_eq!(r.counterexamples[0]["op"], 60);
    }

    #[test]
    fn paused_job_running_again_is_flagged() {
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| {
            if f.node == 3 {
                for j in f.jobs.iter_mut().filter(|j| j.id == "int-0") {
                    j.paused = false;
                }
            }
        });
        let r = check_events(ev);
        assert!(!r.valid);
        assert_eq!(r.counts["unpaused"], 1);
        let ex = &r.counterexamples[0];
        assert_eq!(
            (ex["op"].as_u64(), ex["replica"].as_u64()),
            (Some(9), Some(3))
        );
        assert_eq!(ex["workload"], "quiesce");
    }

    #[test]
    fn later_resume_excuses_an_unpaused_job_and_a_failed_one_does_not() {
        let pause_resume = |resume: Outcome| {
            let mut ev = healthy_history();
            ev.extend(simple_ok(
                70,
                BASE_MS + 3_000,
                Workload::Interval,
                OpF::Pause,
                "int-p0",
            ));
            ev.push(invoke(
                71,
                9,
                BASE_MS + 4_000,
                Workload::Interval,
                OpF::Resume,
                "int-p0",
            ));
            ev.push(done(71, 9, BASE_MS + 4_010, resume));
            with_job(&mut ev, "int-p0", false);
            check_events(ev)
        };
        let r = pause_resume(Outcome::Ok);
        assert!(r.valid, "{r:?}");
        assert_eq!(r.counts["pauses_excused"], 1);
        assert!(pause_resume(Outcome::Unknown).valid);
        let r = pause_resume(Outcome::Fail);
        assert_eq!(r.counts["unpaused"], 3, "{r:?}");
    }

    #[test]
    fn an_unacknowledged_pause_or_delete_is_not_judged() {
        let mut ev = healthy_history();
        ev.push(invoke(
            80,
            9,
            BASE_MS + 3_000,
            Workload::Interval,
            OpF::Pause,
            "int-p1",
        ));
        ev.push(invoke(
            81,
            9,
            BASE_MS + 3_000,
            Workload::Register,
            OpF::Delete,
            "reg-0",
        ));
        with_job(&mut ev, "int-p1", false);
        assert!(check_events(ev).valid);
    }
}
