//! Checker `final-membership`: after healing (and, with the membership
//! nemesis, restoring one voter per slot) the cluster's membership is the
//! nodes the harness runs. Every slot was read (one final state per node in
//! `meta`), no two slots claim one node id, and every reachable node knows
//! the same settled membership: exactly those nodes as voters, no learner,
//! no joint configuration. A removed node left a voter, a fresh node never
//! promoted, or a change nobody finished all show up here. (Equal digests at
//! equal applied indexes are `replicas-agree`'s.)

use super::CheckResult;
use crate::generator::MEMBERSHIP;
use crate::history::History;
use serde_json::json;
use std::collections::BTreeSet;

pub const NAME: &str = "final-membership";

pub fn check(h: &History) -> CheckResult {
    let mut r = CheckResult::new(NAME);
    let recorded = h.finals.iter().any(|f| !f.voters.is_empty());
    if !recorded && !h.meta.nemeses.iter().any(|f| f == MEMBERSHIP) {
        r.note("no final state records a membership (a history older than the membership reads)");
        return r;
    }
    let slots: BTreeSet<u64> = h.finals.iter().map(|f| f.node).collect();
    r.add("voters_expected", h.meta.nodes.len() as u64);
    if slots.len() != h.finals.len() || slots.len() != h.meta.nodes.len() {
        r.flag(
            "slots",
            json!({"expected_nodes": h.meta.nodes.len(), "final_states": h.finals.len(),
                   "distinct_ids": slots}),
        );
    }
    for f in h.finals.iter().filter(|f| f.reachable) {
        r.add("nodes_read", 1);
        let voters: BTreeSet<u64> = f.voters.iter().copied().collect();
        if voters != slots {
            r.flag(
                "voters_differ",
                json!({"node": f.node, "voters": f.voters, "slots_hold": slots}),
            );
        }
        if !f.learners.is_empty() {
            r.flag(
                "learners_left",
                json!({"node": f.node, "learners": f.learners}),
            );
        }
        if f.membership_changing {
            r.flag(
                "change_in_progress",
                json!({"node": f.node, "voters": f.voters}),
            );
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
    fn slots_holding_the_voters_pass() {
        let r = check_events(healthy_history());
        assert!(r.valid, "{r:?}");
        assert_eq!(r.counts["nodes_read"], 3);
    }

    #[test]
    fn replaced_nodes_are_judged_by_their_new_ids() {
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| {
            if f.node == 2 {
                f.node = 5;
            }
            f.voters = vec![1, 3, 5];
        });
        assert!(check_events(ev).valid);
    }

    #[test]
    fn a_removed_voter_left_behind_is_flagged() {
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| {
            if f.node == 2 {
                f.node = 5;
            }
        });
        let r = check_events(ev);
        assert_eq!(r.counts["voters_differ"], 3, "{r:?}");
    }

    #[test]
    fn disagreement_learners_and_joint_configs_are_flagged() {
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| {
            if f.node == 3 {
                f.voters = vec![1, 2];
                f.learners = vec![3];
                f.membership_changing = true;
            }
        });
        let r = check_events(ev);
        assert_eq!(r.counts["voters_differ"], 1, "{r:?}");
        assert_eq!(r.counts["learners_left"], 1);
        assert_eq!(r.counts["change_in_progress"], 1);
    }

    #[test]
    fn a_missing_slot_or_a_shared_id_is_flagged() {
        let mut ev = healthy_history();
        let last = ev
            .iter()
            .rposition(|e| matches!(e, Event::Final(_)))
            .unwrap();
        ev.remove(last);
        edit_finals(&mut ev, |f| f.voters = vec![1, 2]);
        assert_eq!(check_events(ev).counts["slots"], 1);
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| f.node = 1);
        assert_eq!(check_events(ev).counts["slots"], 1);
    }

    #[test]
    fn old_histories_without_membership_are_not_judged() {
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| f.voters.clear());
        let r = check_events(ev.clone());
        assert!(r.valid && !r.notes.is_empty(), "{r:?}");
        if let Event::Meta(m) = &mut ev[0] {
            m.nemeses.push(MEMBERSHIP.into());
        }
        assert!(!check_events(ev).valid);
    }
}
