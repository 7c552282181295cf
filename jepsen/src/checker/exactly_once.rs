//! Checker `exactly-once-fires`: in every reachable node's final state, each
//! (job, scheduled_at) occurrence has at most one fire record, and no run id
//! is recorded twice. A second record of an occurrence is a double fire.

use super::CheckResult;
use crate::history::History;
use serde_json::json;
use std::collections::BTreeMap;

pub const NAME: &str = "exactly-once-fires";

pub fn check(h: &History) -> CheckResult {
    let mut r = CheckResult::new(NAME);
    for f in h.finals.iter().filter(|f| f.reachable) {
        r.add("nodes", 1);
        r.add("records", f.runs.len() as u64);
        let mut by_occurrence: BTreeMap<(&str, i64), Vec<&str>> = BTreeMap::new();
        let mut by_run_id: BTreeMap<&str, u64> = BTreeMap::new();
        for run in &f.runs {
            by_occurrence
                .entry((run.job.as_str(), run.scheduled_at_ms))
                .or_default()
                .push(run.run_id.as_str());
            *by_run_id.entry(run.run_id.as_str()).or_insert(0) += 1;
        }
        for ((job, at), ids) in by_occurrence.iter().filter(|(_, ids)| ids.len() > 1) {
            r.flag(
                "duplicate_occurrences",
                json!({"node": f.node, "job": job, "scheduled_at_ms": at,
                       "records": ids.len(), "run_ids": ids}),
            );
        }
        for (id, n) in by_run_id.iter().filter(|(_, n)| **n > 1) {
            r.flag(
                "duplicate_run_ids",
                json!({"node": f.node, "run_id": id, "records": n}),
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

    #[test]
    fn healthy_history_has_single_fires() {
        let r = check(&History::from_events(healthy_history()).unwrap());
        assert!(r.valid, "{r:?}");
        assert_eq!(r.counts["nodes"], 3);
    }

    #[test]
    fn duplicated_record_on_one_node_is_flagged() {
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| {
            if f.node == 2 {
                let dup = f.runs[3].clone();
                f.runs.push(dup);
            }
        });
        let r = check(&History::from_events(ev).unwrap());
        assert!(!r.valid);
        assert_eq!(r.counts["duplicate_occurrences"], 1);
        assert_eq!(r.counts["duplicate_run_ids"], 1);
    }

    #[test]
    fn second_fire_under_a_new_run_id_is_flagged() {
        let ev = vec![Event::Final(final_node(
            1,
            5,
            vec![fire("j", 10, 11), {
                let mut x = fire("j", 10, 12);
                x.run_id = "other".into();
                x
            }],
        ))];
        let r = check(&History::from_events(ev).unwrap());
        assert_eq!(r.counts["duplicate_occurrences"], 1);
        assert!(!r.counts.contains_key("duplicate_run_ids"));
    }
}
