//! A recorded history parsed and indexed for the checkers: invocations joined
//! with their completions into operations, nemesis start/stop pairs joined into
//! fault periods, receipts, leader claims and final node states kept as
//! recorded. Building a
//! `History` is pure; reading and writing `history.jsonl` lives here too.

use crate::event::{
    Bounds, Complete, Event, FinalNode, FinalRun, Invoke, LeaderClaim, Meta, NemesisEvent, OpF,
    Outcome, Phase, Receipt, Workload,
};
use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Write};
use std::path::Path;

/// Upper bound on lines read from a history file.
pub const MAX_HISTORY_LINES: usize = 5_000_000;

/// Stands in for "never completed" in time comparisons.
pub const FOREVER_MS: i64 = i64::MAX / 4;

/// An invocation and, if it came back, its completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Op {
    pub invoke: Invoke,
    pub complete: Option<Complete>,
}

impl Op {
    /// An invocation with no completion is unknown: the run ended while it was in flight.
    pub fn outcome(&self) -> Outcome {
        self.complete
            .as_ref()
            .map_or(Outcome::Unknown, |c| c.outcome)
    }

    /// Completion time, or `FOREVER_MS` when the outcome is unknown: an unknown
    /// write may take effect at any later point.
    pub fn complete_ms(&self) -> i64 {
        match (&self.complete, self.outcome()) {
            (Some(c), Outcome::Ok | Outcome::Fail) => c.time_ms,
            _ => FOREVER_MS,
        }
    }

    pub fn is(&self, workload: Workload, f: OpF) -> bool {
        self.invoke.workload == workload && self.invoke.f == f
    }

    pub fn ok(&self) -> Option<&Complete> {
        self.complete.as_ref().filter(|c| c.outcome == Outcome::Ok)
    }

    pub fn code(&self) -> Option<&str> {
        self.complete.as_ref().and_then(|c| c.code.as_deref())
    }
}

/// A fault held between a nemesis `start` and its `stop`.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultPeriod {
    pub start_ms: i64,
    /// `FOREVER_MS` if the stop was never recorded.
    pub end_ms: i64,
    pub fault: String,
    pub kind: String,
    pub nodes: Vec<u64>,
}

/// The whole history, indexed.
#[derive(Debug, Clone, Default)]
pub struct History {
    pub meta: Meta,
    pub ops: Vec<Op>,
    pub receipts: Vec<Receipt>,
    pub nemesis: Vec<NemesisEvent>,
    pub faults: Vec<FaultPeriod>,
    /// Leader claims from status polls and node logs, as recorded.
    pub leaders: Vec<LeaderClaim>,
    pub finals: Vec<FinalNode>,
}

impl History {
    /// Joins events; a completion without an invocation is an error.
    pub fn from_events(events: Vec<Event>) -> Result<History> {
        let mut h = History::default();
        let mut by_op: HashMap<u64, usize> = HashMap::new();
        for e in events {
            match e {
                Event::Meta(m) => h.meta = m,
                Event::Invoke(i) => {
                    if by_op.insert(i.op, h.ops.len()).is_some() {
                        bail!("op {} invoked twice", i.op);
                    }
                    h.ops.push(Op {
                        invoke: i,
                        complete: None,
                    });
                }
                Event::Complete(c) => {
                    let Some(&at) = by_op.get(&c.op) else {
                        bail!("op {} completed but never invoked", c.op);
                    };
                    if h.ops[at].complete.is_some() {
                        bail!("op {} completed twice", c.op);
                    }
                    h.ops[at].complete = Some(c);
                }
                Event::Receipt(r) => h.receipts.push(r),
                Event::Nemesis(n) => h.nemesis.push(n),
                Event::Leader(l) => h.leaders.push(l),
                Event::Final(f) => h.finals.push(f),
            }
        }
        h.faults = fault_periods(&h.nemesis);
        Ok(h)
    }

    pub fn bounds(&self) -> Bounds {
        self.meta.bounds
    }

    /// When the first final state was read; `FOREVER_MS` if none was.
    pub fn final_read_ms(&self) -> i64 {
        self.finals
            .iter()
            .map(|f| f.time_ms)
            .min()
            .unwrap_or(FOREVER_MS)
    }

    /// The checking window closes when the harness starts pausing interval
    /// jobs (or at the final read when it never did).
    pub fn window_end_ms(&self) -> i64 {
        self.ops
            .iter()
            .filter(|o| o.invoke.workload == Workload::Quiesce)
            .map(|o| o.invoke.time_ms)
            .min()
            .unwrap_or_else(|| self.final_read_ms())
    }

    /// The reachable node with the highest applied index: the most complete
    /// replica, which the run-record checkers read.
    pub fn reference_final(&self) -> Option<&FinalNode> {
        self.finals
            .iter()
            .filter(|f| f.reachable)
            .max_by_key(|f| (f.applied_index, std::cmp::Reverse(f.node)))
    }

    /// Reachable final states as complete as the reference one.
    pub fn caught_up_finals(&self) -> Vec<&FinalNode> {
        let Some(r) = self.reference_final() else {
            return Vec::new();
        };
        self.finals
            .iter()
            .filter(|f| f.reachable && f.applied_index == r.applied_index)
            .collect()
    }

    /// Fire records of the reference node keyed by (job, scheduled_at_ms).
    pub fn reference_runs(&self) -> BTreeMap<(String, i64), &FinalRun> {
        let mut m = BTreeMap::new();
        if let Some(f) = self.reference_final() {
            for r in &f.runs {
                m.entry((r.job.clone(), r.scheduled_at_ms)).or_insert(r);
            }
        }
        m
    }

    /// Operations grouped by key, in invocation order.
    pub fn ops_by_key(&self, workload: Workload) -> BTreeMap<&str, Vec<&Op>> {
        let mut m: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
        for o in self.ops.iter().filter(|o| o.invoke.workload == workload) {
            m.entry(o.invoke.key.as_str()).or_default().push(o);
        }
        m
    }
}

/// Pairs `start`/`stop` nemesis events by id, in start order.
pub fn fault_periods(events: &[NemesisEvent]) -> Vec<FaultPeriod> {
    let stops: HashMap<u64, i64> = events
        .iter()
        .filter(|e| e.phase == Phase::Stop)
        .map(|e| (e.id, e.time_ms))
        .collect();
    let mut v: Vec<FaultPeriod> = events
        .iter()
        .filter(|e| e.phase == Phase::Start)
        .map(|e| FaultPeriod {
            start_ms: e.time_ms,
            end_ms: stops.get(&e.id).copied().unwrap_or(FOREVER_MS),
            fault: e.fault.clone(),
            kind: e.kind.clone(),
            nodes: e.nodes.clone(),
        })
        .collect();
    v.sort_by_key(|p| p.start_ms);
    v
}

/// Parses JSON lines; blank lines are skipped, errors name the line.
pub fn parse_jsonl(text: &str) -> Result<Vec<Event>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if out.len() >= MAX_HISTORY_LINES {
            bail!("history longer than {MAX_HISTORY_LINES} lines");
        }
        let e = serde_json::from_str(line).with_context(|| format!("history line {}", i + 1))?;
        out.push(e);
    }
    Ok(out)
}

/// Reads `path` (a history.jsonl) line by line.
pub fn read_history(path: &Path) -> Result<History> {
    let f = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut events = Vec::new();
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.with_context(|| format!("read {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        if events.len() >= MAX_HISTORY_LINES {
            bail!("history longer than {MAX_HISTORY_LINES} lines");
        }
        let e = serde_json::from_str(&line)
            .with_context(|| format!("{} line {}", path.display(), i + 1))?;
        events.push(e);
    }
    History::from_events(events)
}

/// Writes events as JSON lines (used by tests and doctoring tools).
pub fn write_history(path: &Path, events: &[Event]) -> Result<()> {
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    for e in events {
        serde_json::to_writer(&mut w, e)?;
        w.write_all(b"\n")?;
    }
    w.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::*;

    #[test]
    fn joins_ops_and_faults() {
        let events = vec![
            invoke(1, 0, 10, Workload::Register, OpF::Get, "k"),
            nemesis(7, 15, Phase::Start, "kill"),
            done(1, 0, 20, Outcome::Ok),
            invoke(2, 1, 30, Workload::Register, OpF::Get, "k"),
            nemesis(7, 40, Phase::Stop, "kill"),
            nemesis(8, 50, Phase::Start, "pause"),
        ];
        let h = History::from_events(events).unwrap();
        assert_eq!(h.ops.len(), 2);
        assert_eq!(h.ops[0].complete_ms(), 20);
        assert_eq!(h.ops[1].outcome(), Outcome::Unknown);
        assert_eq!(h.ops[1].complete_ms(), FOREVER_MS);
        assert_eq!(h.faults.len(), 2);
        assert_eq!((h.faults[0].start_ms, h.faults[0].end_ms), (15, 40));
        assert_eq!(h.faults[1].end_ms, FOREVER_MS);
    }

    #[test]
    fn rejects_orphan_completion_and_bad_lines() {
        assert!(History::from_events(vec![done(9, 0, 1, Outcome::Ok)]).is_err());
        let err = parse_jsonl("{\"type\":\"meta\"}\n\nnot json\n").unwrap_err();
        assert!(format!("{err:#}").contains("line 3"), "{err:#}");
    }

    #[test]
    fn reference_is_most_applied_reachable_node() {
        let mut a = final_node(1, 10, vec![]);
        let b = final_node(2, 12, vec![]);
        let mut c = final_node(3, 99, vec![]);
        c.reachable = false;
        a.reachable = true;
        let h =
            History::from_events(vec![Event::Final(a), Event::Final(b), Event::Final(c)]).unwrap();
        assert_eq!(h.reference_final().unwrap().node, 2);
        assert_eq!(h.caught_up_finals().len(), 1);
    }
}
