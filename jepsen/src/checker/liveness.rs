//! Checker `liveness-after-heal`: once every fault healed and the cluster had
//! a quiet period, every node answered, exactly one node was leader and all
//! agreed on it, a probe write was acknowledged, and no harness job was left
//! with a next fire time more than `recovery_ms` in the past (a stuck wheel).

use super::CheckResult;
use crate::event::{Outcome, Workload};
use crate::history::History;
use serde_json::json;
use std::collections::BTreeSet;

pub const NAME: &str = "liveness-after-heal";

pub fn check(h: &History) -> CheckResult {
    let mut r = CheckResult::new(NAME);
    if h.finals.is_empty() {
        r.flag("no_final_state", json!("no final node state was recorded"));
        return r;
    }
    for f in h.finals.iter().filter(|f| !f.reachable) {
        r.flag(
            "unreachable_nodes",
            json!({"node": f.node, "error": f.error}),
        );
    }
    let leaders: Vec<u64> = h
        .finals
        .iter()
        .filter(|f| f.reachable && f.role == "leader")
        .map(|f| f.node)
        .collect();
    let believed: BTreeSet<u64> = h
        .finals
        .iter()
        .filter(|f| f.reachable)
        .map(|f| f.leader)
        .collect();
    if leaders.len() != 1 || believed.len() != 1 || !believed.contains(&leaders[0]) {
        r.flag(
            "leadership",
            json!({"leaders": leaders, "believed_leaders": believed}),
        );
    }
    let probes: Vec<_> = h
        .ops
        .iter()
        .filter(|o| o.invoke.workload == Workload::Probe)
        .collect();
    r.add("probe_attempts", probes.len() as u64);
    if !probes.iter().any(|o| o.outcome() == Outcome::Ok) {
        r.flag(
            "probe_write",
            json!({"attempts": probes.len(), "acknowledged": 0}),
        );
    }
    stuck_jobs(h, &mut r);
    r
}

fn stuck_jobs(h: &History, r: &mut CheckResult) {
    let Some(reference) = h.reference_final() else {
        return;
    };
    let ours: BTreeSet<&str> = h
        .ops
        .iter()
        .filter(|o| matches!(o.invoke.workload, Workload::Interval | Workload::Timers))
        .map(|o| o.invoke.key.as_str())
        .collect();
    let overdue_before = reference.time_ms - h.bounds().recovery_ms;
    for j in &reference.jobs {
        if ours.contains(j.id.as_str())
            && !j.paused
            && j.next_fire_at_ms != 0
            && j.next_fire_at_ms < overdue_before
        {
            r.flag(
                "stuck_jobs",
                json!({"job": j.id, "next_fire_at_ms": j.next_fire_at_ms, "read_at_ms": reference.time_ms}),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, FinalJob};
    use crate::testkit::*;

    fn check_events(ev: Vec<Event>) -> CheckResult {
        check(&History::from_events(ev).unwrap())
    }

    #[test]
    fn healthy_cluster_is_live() {
        let r = check_events(healthy_history());
        assert!(r.valid, "{r:?}");
    }

    #[test]
    fn two_leaders_or_none_is_flagged() {
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| f.role = "leader".into());
        assert_eq!(check_events(ev).counts["leadership"], 1);
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| f.role = "follower".into());
        assert_eq!(check_events(ev).counts["leadership"], 1);
    }

    #[test]
    fn failed_probe_and_stuck_timer_are_flagged() {
        let mut ev = healthy_history();
        ev.retain(|e| !matches!(e, Event::Complete(c) if c.op == 8));
        ev.extend(create_ok(
            80,
            BASE_MS + 1_000,
            Workload::Timers,
            "tmr-8",
            BASE_MS - 60_000,
        ));
        edit_finals(&mut ev, |f| {
            f.jobs.push(FinalJob {
                id: "tmr-8".into(),
                next_fire_at_ms: BASE_MS - 60_000,
                ..Default::default()
            })
        });
        let r = check_events(ev);
        assert_eq!(r.counts["probe_write"], 1, "{r:?}");
        assert_eq!(r.counts["stuck_jobs"], 1);
    }
}
