//! Checker `cancelled-timers-silent`: a timer whose create was acknowledged
//! and whose delete was invoked after that and acknowledged at least
//! `cancel_margin_ms` before its fire time never fires: no fire record on any
//! replica and no receipt. (A delete racing the fire time may lose the race;
//! an unknown create may still land after the delete; neither is judged.)

use super::CheckResult;
use crate::event::{OpF, Workload};
use crate::history::History;
use serde_json::json;

pub const NAME: &str = "cancelled-timers-silent";

pub fn check(h: &History) -> CheckResult {
    let mut r = CheckResult::new(NAME);
    let margin = h.bounds().cancel_margin_ms;
    for (key, fire_at) in cancelled(h, margin) {
        r.add("cancelled", 1);
        for f in h.finals.iter().filter(|f| f.reachable) {
            if let Some(run) = f.runs.iter().find(|x| x.job == key) {
                r.flag(
                    "fire_records",
                    json!({"job": key, "fire_at_ms": fire_at, "node": f.node, "run_id": run.run_id}),
                );
            }
        }
        if let Some(x) = h.receipts.iter().find(|x| x.job == key) {
            r.flag(
                "receipts",
                json!({"job": key, "fire_at_ms": fire_at, "received_at_ms": x.received_at_ms}),
            );
        }
    }
    r
}

/// (timer, fire time) pairs whose cancellation was acknowledged in time.
fn cancelled(h: &History, margin_ms: i64) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for c in h.ops.iter().filter(|o| o.is(Workload::Timers, OpF::Create)) {
        let Some(fire_at) = c.ok().and_then(|x| x.next_fire_at_ms).or(c.invoke.at_ms) else {
            continue;
        };
        if c.ok().is_none() {
            continue;
        }
        let acked_ms = c.complete_ms();
        let in_time = h.ops.iter().any(|d| {
            d.invoke.key == c.invoke.key
                && d.invoke.f == OpF::Delete
                && d.ok().is_some()
                && d.invoke.time_ms >= acked_ms
                && d.complete_ms() + margin_ms <= fire_at
        });
        if in_time {
            out.push((c.invoke.key.clone(), fire_at));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::*;

    fn check_events(ev: Vec<crate::event::Event>) -> CheckResult {
        check(&History::from_events(ev).unwrap())
    }

    #[test]
    fn healthy_cancelled_timer_stays_silent() {
        let r = check_events(healthy_history());
        assert!(r.valid, "{r:?}");
        assert_eq!(r.counts["cancelled"], 1);
    }

    #[test]
    fn cancelled_timer_that_fired_is_flagged() {
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| {
            if f.node == 1 {
                f.runs
                    .push(fire("tmr-1", BASE_MS + 20_000, BASE_MS + 20_001));
            }
        });
        ev.push(receipt("tmr-1", BASE_MS + 20_000, BASE_MS + 20_002, 1));
        let r = check_events(ev);
        assert_eq!(r.counts["fire_records"], 1);
        assert_eq!(r.counts["receipts"], 1);
    }

    #[test]
    fn late_cancel_is_not_judged() {
        let mut ev = healthy_history();
        ev.extend(create_ok(
            70,
            BASE_MS + 1_000,
            Workload::Timers,
            "tmr-7",
            BASE_MS + 3_000,
        ));
        ev.extend(simple_ok(
            71,
            BASE_MS + 2_900,
            Workload::Timers,
            OpF::Delete,
            "tmr-7",
        ));
        edit_finals(&mut ev, |f| {
            f.runs.push(fire("tmr-7", BASE_MS + 3_000, BASE_MS + 3_001))
        });
        assert!(check_events(ev).valid);
    }
}
