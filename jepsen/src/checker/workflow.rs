//! Checker `workflow` (all-success diamonds), on the most-applied replica:
//! 1. every run of a job with upstreams consumed exactly one run of each of
//!    its upstreams, and each was SUCCEEDED and finished no later than the
//!    downstream run fired;
//! 2. an upstream run is consumed by at most one run of each downstream job
//!    (a cycle triggers once);
//! 3. no completed cycle is left untriggered: if, since a downstream job's
//!    last run fired, every upstream has terminal runs and all of them
//!    succeeded, and each upstream's first one finished more than
//!    `workflow_settle_ms` before the final read, the cycle completed then and
//!    should have fired a newer run. (Any other outcome in that window may
//!    legitimately block the cycle, so it is not judged.) Cluster time is
//!    monotonic in log order, so "finished after fired" is log order.

use super::CheckResult;
use crate::event::FinalRun;
use crate::history::History;
use serde_json::json;
use std::collections::BTreeMap;

pub const NAME: &str = "workflow";

pub fn check(h: &History) -> CheckResult {
    let mut r = CheckResult::new(NAME);
    if !h.meta.workloads.iter().any(|w| w == NAME) {
        r.note("workflow workload not enabled: nothing to judge");
        return r;
    }
    let Some(reference) = h.reference_final() else {
        r.inconclusive("no reachable final state to look in");
        return r;
    };
    let runs: BTreeMap<&str, &FinalRun> = (reference.runs.iter())
        .map(|x| (x.run_id.as_str(), x))
        .collect();
    let mut by_job: BTreeMap<&str, Vec<&FinalRun>> = BTreeMap::new();
    for x in &reference.runs {
        by_job.entry(x.job.as_str()).or_default().push(x);
    }
    let settled_before = h.final_read_ms() - h.bounds().workflow_settle_ms;
    for job in reference.jobs.iter().filter(|j| !j.upstream.is_empty()) {
        let mine = by_job.get(job.id.as_str()).cloned().unwrap_or_default();
        r.add("downstream_runs", mine.len() as u64);
        let mut consumers: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for run in &mine {
            check_inputs(&mut r, run, &job.upstream, &runs);
            for input in &run.upstream_runs {
                consumers.entry(input).or_default().push(&run.run_id);
            }
        }
        for (input, by) in consumers.into_iter().filter(|(_, by)| by.len() > 1) {
            r.flag(
                "double_trigger",
                json!({"upstream_run": input, "consumed_by": by}),
            );
        }
        let last_fired = mine.iter().map(|x| x.fired_at_ms).max().unwrap_or(i64::MIN);
        let cycle = job.upstream.iter().map(|u| {
            let done: Vec<&FinalRun> = (by_job.get(u.as_str()).into_iter().flatten())
                .filter(|x| x.finished_at_ms > 0 && x.finished_at_ms > last_fired)
                .copied()
                .collect();
            let all_ok = !done.is_empty() && done.iter().all(|x| x.state == "SUCCEEDED");
            let first = done.iter().map(|x| x.finished_at_ms).min();
            (all_ok, first)
        });
        let mut complete_at = Some(i64::MIN);
        for (all_ok, first) in cycle {
            complete_at = match (all_ok, first, complete_at) {
                (true, Some(f), Some(c)) => Some(c.max(f)),
                _ => None,
            };
        }
        if let Some(at) = complete_at.filter(|at| *at <= settled_before) {
            r.flag(
                "missed_cycle",
                json!({"job": job.id, "last_fired_at_ms": last_fired, "cycle_complete_at_ms": at}),
            );
        }
    }
    r
}

/// Rule 1 for one downstream run.
fn check_inputs(
    r: &mut CheckResult,
    run: &FinalRun,
    upstream: &[String],
    runs: &BTreeMap<&str, &FinalRun>,
) {
    for u in upstream {
        let of_u: Vec<&String> = (run.upstream_runs.iter())
            .filter(|x| x.split_once('@').is_some_and(|(job, _)| job == u))
            .collect();
        let [input] = of_u[..] else {
            r.flag(
                "inputs_not_one_per_upstream",
                json!({"run_id": run.run_id, "upstream": u, "upstream_runs": run.upstream_runs}),
            );
            continue;
        };
        match runs.get(input.as_str()) {
            None => r.flag(
                "input_not_found",
                json!({"run_id": run.run_id, "upstream_run": input}),
            ),
            Some(x) if x.state != "SUCCEEDED" => r.flag(
                "input_not_succeeded",
                json!({"run_id": run.run_id, "upstream_run": input, "state": x.state}),
            ),
            Some(x) if x.finished_at_ms > run.fired_at_ms => r.flag(
                "input_finished_after_fire",
                json!({"run_id": run.run_id, "fired_at_ms": run.fired_at_ms,
                       "upstream_run": input, "finished_at_ms": x.finished_at_ms}),
            ),
            Some(_) => r.add("inputs_ok", 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, FinalJob, Meta};
    use crate::testkit::{final_node, BASE_MS};

    /// A run of `job` scheduled and fired at +`at` ms, finished 100 ms later.
    fn run(job: &str, at: i64, state: &str, inputs: &[&str]) -> FinalRun {
        FinalRun {
            run_id: format!("{job}@{}", BASE_MS + at),
            job: job.to_string(),
            scheduled_at_ms: BASE_MS + at,
            fired_at_ms: BASE_MS + at,
            state: state.to_string(),
            attempt: 1,
            finished_at_ms: BASE_MS + at + 100,
            upstream_runs: inputs.iter().map(|i| i.to_string()).collect(),
        }
    }

    fn id(job: &str, at: i64) -> String {
        format!("{job}@{}", BASE_MS + at)
    }

    /// `a` at +`at` ms, then `b` at +100 and `c` at +`c_after` following it.
    fn upper(at: i64, c_after: i64, c_state: &str) -> Vec<FinalRun> {
        let a = id("a", at);
        vec![
            run("a", at, "SUCCEEDED", &[]),
            run("b", at + 100, "SUCCEEDED", &[&a]),
            run("c", at + c_after, c_state, &[&a]),
        ]
    }

    /// One diamond, one complete cycle: a@1000 → b@1100, c@1100 → d@1200.
    fn diamond_runs() -> Vec<FinalRun> {
        let mut runs = upper(1_000, 100, "SUCCEEDED");
        runs.push(run(
            "d",
            1_200,
            "SUCCEEDED",
            &[&id("b", 1_100), &id("c", 1_100)],
        ));
        runs
    }

    fn check_runs(runs: Vec<FinalRun>) -> CheckResult {
        let job = |id: &str, upstream: &[&str]| FinalJob {
            id: id.to_string(),
            upstream: upstream.iter().map(|u| u.to_string()).collect(),
            ..Default::default()
        };
        let mut f = final_node(1, 10, runs);
        f.jobs = vec![
            job("a", &[]),
            job("b", &["a"]),
            job("c", &["a"]),
            job("d", &["b", "c"]),
        ];
        let meta = Meta {
            workloads: vec![NAME.to_string()],
            ..Default::default()
        };
        check(&History::from_events(vec![Event::Meta(meta), Event::Final(f)]).unwrap())
    }

    #[test]
    fn complete_cycles_each_triggered_once_are_valid() {
        let r = check_runs(diamond_runs());
        assert!(r.valid, "{r:?}");
        assert_eq!(r.counts["downstream_runs"], 3);
        assert_eq!(r.counts["inputs_ok"], 4);
    }

    #[test]
    fn a_cycle_triggering_twice_is_flagged() {
        let mut runs = diamond_runs();
        let (b, c) = (id("b", 1_100), id("c", 1_100));
        runs.push(run("d", 1_300, "SUCCEEDED", &[&b, &c]));
        let r = check_runs(runs);
        assert!(!r.valid);
        assert_eq!(r.counts["double_trigger"], 2, "{r:?}");
    }

    #[test]
    fn a_completed_cycle_left_untriggered_is_flagged() {
        let mut runs = diamond_runs();
        runs.extend(upper(2_000, 100, "SUCCEEDED"));
        let r = check_runs(runs);
        assert_eq!(r.counts["missed_cycle"], 1, "{r:?}");
    }

    #[test]
    fn an_open_cycle_is_not_judged_while_settling_or_after_a_failure() {
        // c finishing inside the settle time; c failing (the cycle blocks).
        for (c_after, c_state) in [(13_000, "SUCCEEDED"), (100, "FAILED")] {
            let mut runs = diamond_runs();
            runs.extend(upper(2_000, c_after, c_state));
            let r = check_runs(runs);
            assert!(r.valid, "{c_state} after {c_after}: {r:?}");
        }
    }

    #[test]
    fn consuming_a_failed_or_later_upstream_run_is_flagged() {
        let mut runs = diamond_runs();
        runs[2].state = "FAILED".into();
        runs[1].finished_at_ms = BASE_MS + 1_500;
        let r = check_runs(runs);
        assert_eq!(r.counts["input_not_succeeded"], 1, "{r:?}");
        assert_eq!(r.counts["input_finished_after_fire"], 1, "{r:?}");
    }

    #[test]
    fn inputs_missing_or_doubled_for_an_upstream_are_flagged() {
        let mut runs = diamond_runs();
        let b = id("b", 1_100);
        runs[3].upstream_runs = vec![b.clone(), b];
        let r = check_runs(runs);
        assert_eq!(r.counts["inputs_not_one_per_upstream"], 2, "{r:?}");
    }
}
