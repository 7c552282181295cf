//! The checkers: one invariant each, each a pure function from a recorded
//! `History` to a `CheckResult`. Nothing here talks to a cluster, so `check DIR`
//! re-judges any recorded run and tests feed small synthetic histories.
//! Unknown outcomes are never assumed absent: an unknown write may have taken
//! effect at any time after it was invoked.

pub mod cancelled;
pub mod early;
pub mod exactly_once;
pub mod execution;
pub mod leaders;
pub mod linearizable;
pub mod liveness;
pub mod lost;
pub mod membership;
pub mod missed;
pub mod receipts;
pub mod replicas;
pub mod undone;
pub mod wgl;
pub mod workflow;

use crate::history::History;
use serde::Serialize;
use std::collections::BTreeMap;

/// At most this many counterexamples are kept per checker.
pub const MAX_COUNTEREXAMPLES: usize = 10;

/// One checker's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct CheckResult {
    pub name: String,
    pub valid: bool,
    pub counts: BTreeMap<String, u64>,
    pub counterexamples: Vec<serde_json::Value>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Checker-specific context for the report (e.g. the bounds applied).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<serde_json::Value>,
}

impl CheckResult {
    pub fn new(name: &str) -> CheckResult {
        CheckResult {
            name: name.to_string(),
            valid: true,
            counts: BTreeMap::new(),
            counterexamples: Vec::new(),
            notes: Vec::new(),
            details: None,
        }
    }

    pub fn add(&mut self, counter: &str, n: u64) {
        *self.counts.entry(counter.to_string()).or_insert(0) += n;
    }

    /// Records a violation under `counter`, keeping the first few examples.
    pub fn flag(&mut self, counter: &str, example: serde_json::Value) {
        self.valid = false;
        self.add(counter, 1);
        if self.counterexamples.len() < MAX_COUNTEREXAMPLES {
            self.counterexamples.push(example);
        }
    }

    /// The checker could not judge: that is not a pass.
    pub fn inconclusive(&mut self, note: &str) {
        self.valid = false;
        self.notes.push(note.to_string());
    }

    pub fn note(&mut self, note: &str) {
        self.notes.push(note.to_string());
    }
}

/// Every checker, in report order.
pub fn check_all(h: &History) -> Vec<CheckResult> {
    vec![
        linearizable::check(h),
        lost::check(h),
        undone::check(h),
        exactly_once::check(h),
        replicas::check(h),
        missed::check(h),
        early::check(h),
        cancelled::check(h),
        receipts::check(h),
        execution::check(h),
        liveness::check(h),
        leaders::check(h),
        membership::check(h),
        workflow::check(h),
    ]
}

/// The latest time an occurrence due at `t_ms` may fire: `healthy` after it,
/// or, if a fault overlapped it, `recovery` after that fault healed.
pub fn deadline_ms(h: &History, t_ms: i64) -> i64 {
    let b = h.bounds();
    let mut d = t_ms.saturating_add(b.healthy_lateness_ms);
    for p in &h.faults {
        let healed = p.end_ms.saturating_add(b.recovery_ms);
        if p.start_ms <= t_ms.saturating_add(b.healthy_lateness_ms) && t_ms <= healed {
            d = d.max(healed);
        }
    }
    d
}
