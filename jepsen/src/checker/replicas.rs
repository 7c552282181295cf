//! Checker `replicas-agree`: reachable replicas' state digests of the same
//! applied index are equal, and a replica's fire records are a subset of
//! those of any replica read at a later-or-equal state, with the same fire
//! time (runs are only ever added, by applying the one shared log). Each node's
//! records were listed between two status reads (`applied_index` ..
//! `applied_index_after`); two nodes whose read windows overlap cannot be
//! ordered and their record sets are not compared.

use super::CheckResult;
use crate::event::FinalNode;
use crate::history::History;
use serde_json::json;
use std::collections::BTreeMap;

pub const NAME: &str = "replicas-agree";

pub fn check(h: &History) -> CheckResult {
    let mut r = CheckResult::new(NAME);
    let nodes: Vec<&FinalNode> = h.finals.iter().filter(|f| f.reachable).collect();
    if nodes.len() < 2 {
        r.note("fewer than two reachable replicas: nothing to compare");
    }
    for (i, a) in nodes.iter().enumerate() {
        for b in &nodes[i + 1..] {
            let (lo, hi) = if a.applied_index <= b.applied_index {
                (a, b)
            } else {
                (b, a)
            };
            r.add("pairs", 1);
            compare_digests(&mut r, lo, hi);
            let (a_lo, a_hi) = window(lo);
            let (b_lo, b_hi) = window(hi);
            if a_hi <= b_lo {
                compare_runs(&mut r, lo, hi, a_lo == a_hi && a_hi == b_lo && b_lo == b_hi);
            } else {
                r.add("overlapping_reads", 1);
            }
        }
    }
    r
}

/// The index `f`'s digest reflects (a history from before `digest_index`
/// has its digests at `applied_index`).
fn digest_index(f: &FinalNode) -> u64 {
    if f.digest_index == 0 {
        f.applied_index
    } else {
        f.digest_index
    }
}

/// Two digests of one index must be equal. A node without a digest yet
/// (its first still hashing when its status was read) is counted, not
/// compared.
fn compare_digests(r: &mut CheckResult, a: &FinalNode, b: &FinalNode) {
    if a.state_digest.is_empty() || b.state_digest.is_empty() {
        r.add("digests_missing", 1);
        return;
    }
    if digest_index(a) != digest_index(b) {
        return;
    }
    r.add("digest_pairs", 1);
    if a.state_digest != b.state_digest {
        r.flag(
            "digest_mismatches",
            json!({"digest_index": digest_index(a),
                   "nodes": [a.node, b.node],
                   "digests": [a.state_digest, b.state_digest]}),
        );
    }
}

/// The applied indexes between which a node's lists were read.
fn window(f: &FinalNode) -> (u64, u64) {
    (f.applied_index, f.applied_index_after.max(f.applied_index))
}

/// Every record of `lo` is in `hi` with the same fire time; when both were
/// read at one and the same index the sets are equal.
fn compare_runs(r: &mut CheckResult, lo: &FinalNode, hi: &FinalNode, same_state: bool) {
    let index = |n: &FinalNode| -> BTreeMap<(String, i64), i64> {
        n.runs
            .iter()
            .map(|x| ((x.job.clone(), x.scheduled_at_ms), x.fired_at_ms))
            .collect()
    };
    let (lo_runs, hi_runs) = (index(lo), index(hi));
    for ((job, at), fired) in &lo_runs {
        match hi_runs.get(&(job.clone(), *at)) {
            None => r.flag(
                "records_missing_on_replica",
                json!({"job": job, "scheduled_at_ms": at, "present_on": lo.node,
                       "missing_on": hi.node, "applied": [lo.applied_index, hi.applied_index]}),
            ),
            Some(f2) if f2 != fired => r.flag(
                "fire_time_disagreements",
                json!({"job": job, "scheduled_at_ms": at, "nodes": [lo.node, hi.node],
                       "fired_at_ms": [fired, f2]}),
            ),
            Some(_) => {}
        }
    }
    if same_state {
        for (job, at) in hi_runs.keys().filter(|k| !lo_runs.contains_key(*k)) {
            r.flag(
                "records_missing_on_replica",
                json!({"job": job, "scheduled_at_ms": at, "present_on": hi.node,
                       "missing_on": lo.node, "applied": [lo.applied_index, hi.applied_index]}),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::*;

    fn check_events(ev: Vec<crate::event::Event>) -> CheckResult {
        check(&History::from_events(ev).unwrap())
    }

    #[test]
    fn healthy_replicas_agree() {
        let r = check_events(healthy_history());
        assert!(r.valid, "{r:?}");
        assert_eq!(r.counts["digest_pairs"], 3);
    }

    #[test]
    fn record_removed_from_one_replica_is_flagged() {
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| {
            if f.node == 3 {
                f.runs.remove(4);
            }
        });
        let r = check_events(ev);
        assert!(!r.valid);
        assert_eq!(r.counts["records_missing_on_replica"], 2);
    }

    #[test]
    fn digest_mismatch_at_equal_index_is_flagged() {
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| {
            if f.node == 2 {
                f.state_digest = "something-else".into();
            }
        });
        assert_eq!(check_events(ev).counts["digest_mismatches"], 2);
    }

    #[test]
    fn digests_are_compared_at_their_own_index_not_the_applied_one() {
        let mut ev = healthy_history();
        // Node 3 answered with the digest of an older index than it applied.
        edit_finals(&mut ev, |f| {
            if f.node == 3 {
                f.digest_index = 90;
                f.state_digest = "older".into();
            }
        });
        let r = check_events(ev.clone());
        assert!(r.valid, "{r:?}");
        assert_eq!(r.counts["digest_pairs"], 1);
        // Node 2's digest of that same older index differs: flagged.
        edit_finals(&mut ev, |f| {
            if f.node == 2 {
                f.digest_index = 90;
                f.state_digest = "other".into();
            }
        });
        let r = check_events(ev);
        assert_eq!(r.counts["digest_mismatches"], 1, "{r:?}");
    }

    #[test]
    fn a_node_without_a_digest_yet_is_not_compared() {
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| {
            if f.node == 2 {
                f.state_digest.clear();
            }
        });
        let r = check_events(ev);
        assert!(r.valid, "{r:?}");
        assert_eq!(r.counts["digests_missing"], 2);
        assert_eq!(r.counts["digest_pairs"], 1);
    }

    #[test]
    fn records_read_while_the_state_moved_are_not_compared() {
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| {
            f.applied_index_after = 105;
            if f.node == 3 {
                f.runs.pop();
            }
        });
        let r = check_events(ev);
        assert!(r.valid, "{r:?}");
        assert_eq!(r.counts["overlapping_reads"], 3);
    }

    #[test]
    fn lagging_replica_may_miss_recent_records_only() {
        let mut ev = healthy_history();
        edit_finals(&mut ev, |f| {
            if f.node == 3 {
                f.applied_index = 90;
                f.digest_index = 90;
                f.state_digest = "older".into();
                f.runs.pop();
            }
        });
        assert!(check_events(ev.clone()).valid);
        edit_finals(&mut ev, |f| {
            if f.node == 3 {
                f.runs[0].fired_at_ms += 1;
            }
        });
        assert!(!check_events(ev).valid);
    }
}
