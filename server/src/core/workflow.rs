//! Workflows: a job that declares upstream jobs runs when they complete a
//! cycle (see docs/workflows.md for the model with a diagram).
//!
//! A downstream job keeps, per upstream, the latest terminal run of that
//! upstream since its own last workflow run (`Cycle::seen`). Every time an
//! upstream run reaches a terminal state, apply records it there and asks
//! [`decide`] whether the cycle is complete under the job's trigger rule and
//! failure strategy. A complete cycle starts the downstream's run in the same
//! apply (so no leader change can lose or repeat it) and is consumed: the
//! run records which upstream runs it took (`keys::run_inputs`) and the
//! next cycle starts empty.
//!
//! Pure: the outcome depends only on the arguments.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::types::{RunId, RunState};

/// When a downstream's cycle is complete (Airflow's trigger-rule names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum TriggerRule {
    /// Every upstream succeeded.
    #[default]
    AllSuccess,
    /// Every upstream finished, whatever the outcome.
    AllDone,
    /// One upstream succeeded (the others are not waited for).
    OneSuccess,
    /// One upstream failed (a failure handler).
    OneFailed,
    /// Every upstream finished and none failed (succeeded or skipped).
    NoneFailed,
}

impl TriggerRule {
    pub const ALL: [TriggerRule; 5] = [
        TriggerRule::AllSuccess,
        TriggerRule::AllDone,
        TriggerRule::OneSuccess,
        TriggerRule::OneFailed,
        TriggerRule::NoneFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TriggerRule::AllSuccess => "all-success",
            TriggerRule::AllDone => "all-done",
            TriggerRule::OneSuccess => "one-success",
            TriggerRule::OneFailed => "one-failed",
            TriggerRule::NoneFailed => "none-failed",
        }
    }

    pub fn parse(s: &str) -> Option<TriggerRule> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// What a failed upstream does to a cycle that needs it to succeed
/// (`all-success`, `none-failed`; the other rules decide on failures
/// themselves).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OnUpstreamFailure {
    /// The cycle ends without running the downstream; the next starts empty.
    #[default]
    Block,
    /// The failed upstream counts as succeeded: the downstream runs (its
    /// result is what the failed run left, usually nothing).
    Skip,
    /// The cycle stays open until the failed upstream's next terminal run
    /// (a manual `runs retry`, or its next occurrence) succeeds.
    WaitForRetry,
}

impl OnUpstreamFailure {
    pub const ALL: [OnUpstreamFailure; 3] = [
        OnUpstreamFailure::Block,
        OnUpstreamFailure::Skip,
        OnUpstreamFailure::WaitForRetry,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OnUpstreamFailure::Block => "block",
            OnUpstreamFailure::Skip => "skip",
            OnUpstreamFailure::WaitForRetry => "wait-for-retry",
        }
    }

    pub fn parse(s: &str) -> Option<OnUpstreamFailure> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// A job's upstream declaration (part of its spec).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workflow {
    /// Job ids, `1..=limits::UPSTREAMS_MAX`, distinct, in the order given.
    pub upstream: Vec<String>,
    pub rule: TriggerRule,
    pub on_failure: OnUpstreamFailure,
}

/// The terminal run of an upstream a cycle holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    pub run: RunId,
    pub outcome: RunState,
}

/// A downstream's open cycle (replicated, in the job record).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cycle {
    /// Latest terminal run of each upstream since the last workflow run.
    pub seen: BTreeMap<String, Seen>,
    /// A job with its own schedule: an occurrence that came before its
    /// cycle completed waits here (the newest one).
    pub held_at_ms: Option<i64>,
    /// A job with its own schedule: a cycle that completed before its
    /// occurrence came, with the runs it consumes.
    pub ready: Option<Vec<(String, RunId)>>,
    /// The scheduled time of the last workflow run (runs of an upstream-only
    /// job are keyed by it, so each is later than the one before).
    pub last_run_ms: i64,
    /// Why the last cycle ended without a run (`block`), until the next one runs.
    pub blocked: Option<String>,
}

impl Cycle {
    /// What the job waits for, in words (`job get`).
    pub fn describe(&self, wf: &Workflow) -> String {
        if let Some(b) = &self.blocked {
            return format!("blocked: {b}");
        }
        if self.ready.is_some() {
            return "cycle complete: runs at its next occurrence".into();
        }
        if let Some(failed) = wf
            .upstream
            .iter()
            .find(|u| self.seen.get(*u).is_some_and(|s| is_failure(s.outcome)))
        {
            if wf.on_failure == OnUpstreamFailure::WaitForRetry {
                return format!(
                    "waiting for a retry of upstream {failed:?} (run {} {})",
                    self.seen[failed].run,
                    self.seen[failed].outcome.as_str()
                );
            }
        }
        let missing: Vec<&str> = wf
            .upstream
            .iter()
            .filter(|u| !self.seen.contains_key(*u))
            .map(String::as_str)
            .collect();
        if missing.is_empty() {
            "waiting".into()
        } else {
            format!("waiting for upstream {}", missing.join(", "))
        }
    }
}

/// What a cycle comes to after an upstream run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Not complete yet.
    Wait,
    /// Complete: run, consuming these upstream runs (in upstream order).
    Run(Vec<(String, RunId)>),
    /// Ended without a run, for this reason; the next cycle starts empty.
    Drop(String),
}

fn is_failure(s: RunState) -> bool {
    matches!(
        s,
        RunState::Failed | RunState::TimedOut | RunState::Cancelled
    )
}

/// Decides a cycle: `seen` holds the upstreams' latest terminal runs.
pub fn decide(wf: &Workflow, seen: &BTreeMap<String, Seen>) -> Decision {
    let held: Vec<(String, RunId)> = wf
        .upstream
        .iter()
        .filter_map(|u| seen.get(u).map(|s| (u.clone(), s.run.clone())))
        .collect();
    let all_present = held.len() == wf.upstream.len();
    let outcomes = || {
        wf.upstream
            .iter()
            .filter_map(|u| seen.get(u).map(|s| (u, s)))
    };
    let first = |f: fn(RunState) -> bool| outcomes().find(|(_, s)| f(s.outcome));
    let success = |s: RunState| s == RunState::Succeeded;
    let skipped = |s: RunState| s == RunState::Skipped;
    match wf.rule {
        TriggerRule::AllDone if all_present => Decision::Run(held),
        TriggerRule::AllDone => Decision::Wait,
        TriggerRule::OneSuccess => match first(success) {
            Some((u, s)) => Decision::Run(vec![(u.clone(), s.run.clone())]),
            None => Decision::Wait,
        },
        TriggerRule::OneFailed => match first(is_failure) {
            Some((u, s)) => Decision::Run(vec![(u.clone(), s.run.clone())]),
            None => Decision::Wait,
        },
        TriggerRule::AllSuccess | TriggerRule::NoneFailed => {
            let failed = first(is_failure);
            if let Some((u, s)) = failed {
                match wf.on_failure {
                    OnUpstreamFailure::Block => {
                        return Decision::Drop(format!(
                            "upstream {u:?} run {} {} (on-upstream-failure block)",
                            s.run,
                            s.outcome.as_str()
                        ))
                    }
                    OnUpstreamFailure::WaitForRetry => return Decision::Wait,
                    OnUpstreamFailure::Skip => {}
                }
            }
            if wf.rule == TriggerRule::AllSuccess {
                if let Some((u, s)) = first(skipped) {
                    return Decision::Drop(format!(
                        "upstream {u:?} run {} skipped (all-success needs a success)",
                        s.run
                    ));
                }
            }
            if all_present {
                Decision::Run(held)
            } else {
                Decision::Wait
            }
        }
    }
}

/// A cycle in the upstream graph that `job` taking `upstream` would close:
/// the path from `job` back to itself (`job → … → job`, each arrow pointing
/// downstream), or `Err` when the walk looked at more than `max` jobs.
/// `upstream_of` gives a job's declared upstreams (empty for none).
pub fn cycle_path(
    job: &str,
    upstream: &[String],
    max: usize,
    mut upstream_of: impl FnMut(&str) -> Vec<String>,
) -> Result<Option<Vec<String>>, usize> {
    // Depth-first from each upstream, following upstream edges; `via`
    // remembers through which job each was reached, to name the path.
    let mut via: BTreeMap<String, String> = BTreeMap::new();
    let mut stack: Vec<String> = Vec::new();
    for u in upstream {
        if via.insert(u.clone(), job.to_string()).is_none() {
            stack.push(u.clone());
        }
    }
    let mut looked = 0usize;
    while let Some(cur) = stack.pop() {
        if cur == job {
            // Walk back from `job` (reached as someone's upstream) to `job`.
            let mut path = vec![job.to_string()];
            let mut at = via[job].clone();
            while at != job {
                path.push(at.clone());
                at = via[&at].clone();
            }
            path.push(job.to_string());
            return Ok(Some(path));
        }
        looked += 1;
        if looked > max {
            return Err(max);
        }
        for u in upstream_of(&cur) {
            if !via.contains_key(&u) {
                via.insert(u.clone(), cur.clone());
                stack.push(u);
            }
        }
    }
    Ok(None)
}

/// The upstream results a workflow run's workers get: a JSON object keyed
/// by upstream job id. A result that is JSON goes in as it is, other UTF-8
/// as a string, other bytes as `{"base64": …}`; a run no longer stored as
/// `null`. Past `max_bytes` in all, an upstream is given as
/// `{"omitted": why}` so the whole stays bounded.
pub fn merge_results(results: &[(String, Option<Vec<u8>>)], max_bytes: usize) -> Vec<u8> {
    use serde_json::{json, Map, Value};
    let mut out = Map::new();
    let mut used = 2usize;
    for (job, result) in results {
        let value = match result {
            None => Value::Null,
            Some(b) => match serde_json::from_slice::<Value>(b) {
                Ok(v) => v,
                Err(_) => match std::str::from_utf8(b) {
                    Ok(s) => Value::String(s.to_string()),
                    Err(_) => json!({ "base64": base64(b) }),
                },
            },
        };
        let size = value.to_string().len() + job.len() + 4;
        let value = if used + size > max_bytes {
            json!({ "omitted": format!("the merged results would pass {max_bytes} bytes; pass a reference (an object-storage path) instead") })
        } else {
            value
        };
        used += size.min(max_bytes);
        out.insert(job.clone(), value);
    }
    Value::Object(out).to_string().into_bytes()
}

/// Standard base64 with padding.
fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                s.push(A[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wf(ups: &[&str], rule: TriggerRule, on_failure: OnUpstreamFailure) -> Workflow {
        Workflow {
            upstream: ups.iter().map(|s| s.to_string()).collect(),
            rule,
            on_failure,
        }
    }

    fn seen(list: &[(&str, RunState)]) -> BTreeMap<String, Seen> {
        list.iter()
            .map(|(u, st)| {
                (
                    u.to_string(),
                    Seen {
                        run: RunId::new(u, 1000),
                        outcome: *st,
                    },
                )
            })
            .collect()
    }

    fn runs(ups: &[&str]) -> Decision {
        Decision::Run(
            ups.iter()
                .map(|u| (u.to_string(), RunId::new(u, 1000)))
                .collect(),
        )
    }

    use OnUpstreamFailure::*;
    use RunState::*;
    use TriggerRule::*;

    #[test]
    fn all_success_runs_once_every_upstream_succeeded_and_a_failure_follows_the_strategy() {
        let w = wf(&["a", "b"], AllSuccess, Block);
        assert_eq!(decide(&w, &seen(&[])), Decision::Wait);
        assert_eq!(decide(&w, &seen(&[("a", Succeeded)])), Decision::Wait);
        assert_eq!(
            decide(&w, &seen(&[("a", Succeeded), ("b", Succeeded)])),
            runs(&["a", "b"])
        );
        let failed = seen(&[("a", Failed)]);
        match decide(&w, &failed) {
            Decision::Drop(why) => {
                assert!(why.contains("\"a\"") && why.contains("failed"), "{why}")
            }
            other => panic!("block drops the cycle, got {other:?}"),
        }
        let w_skip = wf(&["a", "b"], AllSuccess, Skip);
        assert_eq!(decide(&w_skip, &failed), Decision::Wait, "b still missing");
        assert_eq!(
            decide(&w_skip, &seen(&[("a", TimedOut), ("b", Succeeded)])),
            runs(&["a", "b"])
        );
        let w_wait = wf(&["a", "b"], AllSuccess, WaitForRetry);
        assert_eq!(
            decide(&w_wait, &seen(&[("a", Failed), ("b", Succeeded)])),
            Decision::Wait
        );
        assert_eq!(
            decide(&w_wait, &seen(&[("a", Succeeded), ("b", Succeeded)])),
            runs(&["a", "b"]),
            "the retry succeeded"
        );
        match decide(&w_wait, &seen(&[("a", Skipped), ("b", Succeeded)])) {
            Decision::Drop(why) => assert!(why.contains("skipped"), "{why}"),
            other => panic!("a skipped upstream ends an all-success cycle, got {other:?}"),
        }
    }

    #[test]
    fn all_done_waits_for_every_outcome_whatever_it_is() {
        let w = wf(&["a", "b"], AllDone, Block);
        assert_eq!(decide(&w, &seen(&[("a", Failed)])), Decision::Wait);
        assert_eq!(
            decide(&w, &seen(&[("a", Failed), ("b", Cancelled)])),
            runs(&["a", "b"])
        );
    }

    #[test]
    fn one_success_and_one_failed_run_on_the_first_such_upstream() {
        let w = wf(&["a", "b"], OneSuccess, Block);
        assert_eq!(decide(&w, &seen(&[("a", Failed)])), Decision::Wait);
        assert_eq!(
            decide(&w, &seen(&[("a", Failed), ("b", Succeeded)])),
            runs(&["b"])
        );
        let w = wf(&["a", "b"], OneFailed, Block);
        assert_eq!(decide(&w, &seen(&[("a", Succeeded)])), Decision::Wait);
        assert_eq!(
            decide(&w, &seen(&[("a", Succeeded), ("b", TimedOut)])),
            runs(&["b"])
        );
    }

    #[test]
    fn none_failed_takes_skipped_upstreams_and_consults_the_strategy_on_failures() {
        let w = wf(&["a", "b"], NoneFailed, Block);
        assert_eq!(
            decide(&w, &seen(&[("a", Skipped), ("b", Succeeded)])),
            runs(&["a", "b"])
        );
        assert!(matches!(
            decide(&w, &seen(&[("a", Succeeded), ("b", Failed)])),
            Decision::Drop(_)
        ));
        let w = wf(&["a", "b"], NoneFailed, Skip);
        assert_eq!(
            decide(&w, &seen(&[("a", Succeeded), ("b", Failed)])),
            runs(&["a", "b"])
        );
    }

    #[test]
    fn a_cycle_is_named_by_its_path_and_the_walk_is_bounded() {
        // a → b → c (c's upstream is b, b's is a); making a depend on c closes it.
        let graph = |j: &str| match j {
            "b" => vec!["a".to_string()],
            "c" => vec!["b".to_string()],
            _ => vec![],
        };
        assert_eq!(
            cycle_path("a", &["c".into()], 100, graph),
            Ok(Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]))
        );
        assert_eq!(
            cycle_path("a", &["a".into()], 100, graph),
            Ok(Some(vec!["a".into(), "a".into()]))
        );
        assert_eq!(cycle_path("d", &["c".into()], 100, graph), Ok(None));
        assert_eq!(cycle_path("d", &["c".into()], 1, graph), Err(1));
    }

    #[test]
    fn results_merge_as_json_strings_or_base64_and_stay_bounded() {
        let r = |j: &str, b: Option<&[u8]>| (j.to_string(), b.map(<[u8]>::to_vec));
        let merged = merge_results(
            &[
                r("a", Some(br#"{"rows": 3}"#)),
                r("b", Some(b"plain text")),
                r("c", Some(&[0xff, 0x00, 0x10])),
                r("d", None),
            ],
            1 << 20,
        );
        let v: serde_json::Value = serde_json::from_slice(&merged).unwrap();
        assert_eq!(v["a"]["rows"], 3);
        assert_eq!(v["b"], "plain text");
        assert_eq!(v["c"]["base64"], "/wAQ");
        assert!(v["d"].is_null());
        let big = vec![b'x'; 3000];
        let merged = merge_results(&[r("a", Some(&big)), r("b", Some(&big))], 4000);
        let v: serde_json::Value = serde_json::from_slice(&merged).unwrap();
        assert_eq!(v["a"].as_str().map(str::len), Some(3000));
        assert!(v["b"]["omitted"].as_str().unwrap().contains("reference"));
        assert!(merged.len() < 4000 + 200);
        assert_eq!(base64(b"Ma"), "TWE=");
        assert_eq!(base64(b"M"), "TQ==");
    }

    #[test]
    fn names_parse_back() {
        for r in TriggerRule::ALL {
            assert_eq!(TriggerRule::parse(r.as_str()), Some(r));
        }
        for f in OnUpstreamFailure::ALL {
            assert_eq!(OnUpstreamFailure::parse(f.as_str()), Some(f));
        }
        assert_eq!(TriggerRule::parse("all_success"), None);
    }
}
