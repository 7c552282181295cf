//! Checker `linearizable-register`: the register workload's job operations
//! (create, revision-CAS update, get, delete on a few keys) admit a
//! linearization per key. The model is a register holding a job's revision
//! and payload value. Revisions are opaque server numbers: an unknown write
//! leaves the revision unknown until a read or a write result binds it.
//! Definite rejections (ALREADY_EXISTS, FAILED_PRECONDITION, NOT_FOUND) are
//! observations of the state and must linearize too; other failures are
//! dropped, unknown writes are optional, unknown reads carry no information.

use super::wgl::{self, Entry, Model, Verdict};
use super::CheckResult;
use crate::event::{OpF, Outcome, Workload};
use crate::history::{History, Op};
use serde_json::json;

pub const NAME: &str = "linearizable-register";

/// Keys with more operations than this are not searched (the workload rotates
/// keys well below it).
pub const MAX_OPS_PER_KEY: usize = 600;
/// Explored states per key before giving up as inconclusive.
pub const SEARCH_BUDGET: u64 = 2_000_000;

/// `None`: the job does not exist. Otherwise (revision if known, value).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reg(pub Option<(Option<u64>, u64)>);

/// An operation with the result it recorded; `Unknown` results are optional
/// and, if linearized, took effect successfully.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RegOp {
    Created {
        value: u64,
        revision: Option<u64>,
    },
    CreateExists,
    Updated {
        value: u64,
        expected: u64,
        revision: Option<u64>,
    },
    UpdateMismatch {
        expected: u64,
    },
    UpdateMissing,
    Found {
        value: u64,
        revision: u64,
    },
    Missing,
    Deleted {
        deleted: Option<bool>,
    },
}

fn rev_matches(known: Option<u64>, r: u64) -> bool {
    known.is_none_or(|k| k == r)
}

impl Model for Reg {
    type Op = RegOp;

    fn step(&self, op: &RegOp) -> Option<Reg> {
        let cur = self.0;
        match (*op, cur) {
            (RegOp::Created { value, revision }, None) => Some(Reg(Some((revision, value)))),
            (RegOp::CreateExists, Some(_)) => Some(self.clone()),
            (
                RegOp::Updated {
                    value,
                    expected,
                    revision,
                },
                Some((r, _)),
            ) => {
                let cas_ok = expected == 0 || rev_matches(r, expected);
                // A successful write must move the revision.
                let moved = match (r, revision) {
                    (Some(old), Some(new)) => old != new,
                    _ => true,
                };
                (cas_ok && moved).then_some(Reg(Some((revision, value))))
            }
            (RegOp::UpdateMismatch { expected }, Some((r, _))) => {
                (expected != 0 && r != Some(expected)).then_some(self.clone())
            }
            (RegOp::UpdateMissing, None) => Some(self.clone()),
            (RegOp::Found { value, revision }, Some((r, v))) => {
                (v == value && rev_matches(r, revision)).then_some(Reg(Some((Some(revision), v))))
            }
            (RegOp::Missing, None) => Some(self.clone()),
            (
                RegOp::Deleted {
                    deleted: Some(true),
                },
                Some(_),
            ) => Some(Reg(None)),
            (
                RegOp::Deleted {
                    deleted: Some(false),
                },
                None,
            ) => Some(Reg(None)),
            (RegOp::Deleted { deleted: None }, _) => Some(Reg(None)),
            _ => None,
        }
    }
}

/// Converts one recorded operation into a search entry, or drops it when it
/// says nothing about the register.
pub fn entry(o: &Op) -> Option<Entry<RegOp>> {
    let inv = &o.invoke;
    let c = o.complete.as_ref();
    let outcome = o.outcome();
    let code = o.code().unwrap_or("");
    let value = inv.value.unwrap_or(0);
    let rev = c.and_then(|c| c.revision);
    let op = match (inv.f, outcome) {
        (OpF::Get, Outcome::Ok) if c.and_then(|c| c.found) == Some(false) => RegOp::Missing,
        (OpF::Get, Outcome::Ok) => RegOp::Found {
            // An unparsable payload matches no written value.
            value: c.and_then(|c| c.value).unwrap_or(u64::MAX),
            revision: rev.unwrap_or(0),
        },
        (OpF::Get, Outcome::Fail) if code == "NOT_FOUND" => RegOp::Missing,
        (OpF::Get, _) => return None,
        (OpF::Create, Outcome::Ok | Outcome::Unknown) => RegOp::Created {
            value,
            revision: rev,
        },
        (OpF::Create, Outcome::Fail) if code == "ALREADY_EXISTS" => RegOp::CreateExists,
        (OpF::Update, Outcome::Ok | Outcome::Unknown) => RegOp::Updated {
            value,
            expected: inv.expected_revision.unwrap_or(0),
            revision: rev,
        },
        (OpF::Update, Outcome::Fail) if code == "FAILED_PRECONDITION" => RegOp::UpdateMismatch {
            expected: inv.expected_revision.unwrap_or(0),
        },
        (OpF::Update, Outcome::Fail) if code == "NOT_FOUND" => RegOp::UpdateMissing,
        (OpF::Delete, Outcome::Ok) => RegOp::Deleted {
            deleted: c.and_then(|c| c.deleted),
        },
        (OpF::Delete, Outcome::Unknown) => RegOp::Deleted { deleted: None },
        (OpF::Delete, Outcome::Fail) if code == "NOT_FOUND" => RegOp::Missing,
        _ => return None,
    };
    Some(Entry {
        invoke_ms: inv.time_ms,
        complete_ms: o.complete_ms(),
        required: outcome != Outcome::Unknown,
        op,
    })
}

pub fn check(h: &History) -> CheckResult {
    let mut r = CheckResult::new(NAME);
    for (key, ops) in h.ops_by_key(Workload::Register) {
        let mut pairs: Vec<(&Op, Entry<RegOp>)> = ops
            .iter()
            .filter_map(|o| entry(o).map(|e| (*o, e)))
            .collect();
        pairs.sort_by_key(|(_, e)| e.invoke_ms);
        r.add("keys", 1);
        r.add("ops", pairs.len() as u64);
        if pairs.len() > MAX_OPS_PER_KEY {
            r.inconclusive(&format!(
                "key {key}: {} ops exceed {MAX_OPS_PER_KEY}",
                pairs.len()
            ));
            continue;
        }
        let entries: Vec<_> = pairs.iter().map(|(_, e)| e.clone()).collect();
        match wgl::search(&Reg(None), &entries, SEARCH_BUDGET) {
            Verdict::Linearizable => {}
            Verdict::Violation { stuck, prefix } => {
                let (op, _) = &pairs[stuck];
                let concurrent: Vec<_> = pairs
                    .iter()
                    .filter(|(o, _)| {
                        o.invoke.time_ms <= op.complete_ms()
                            && o.complete_ms() >= op.invoke.time_ms - 1_000
                    })
                    .take(12)
                    .map(|(o, _)| op_json(o))
                    .collect();
                r.flag(
                    "violations",
                    json!({"key": key, "linearizable_prefix": prefix,
                           "stuck_op": op_json(op), "around": concurrent}),
                );
            }
            Verdict::Inconclusive { explored } => {
                r.add("inconclusive_keys", 1);
                r.inconclusive(&format!(
                    "key {key}: search budget exhausted after {explored} states"
                ));
            }
        }
    }
    r
}

fn op_json(o: &Op) -> serde_json::Value {
    json!({"invoke": o.invoke, "complete": o.complete})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::*;

    const CREATE: OpF = OpF::Create;
    const UPDATE: OpF = OpF::Update;
    const GET: OpF = OpF::Get;
    const DELETE: OpF = OpF::Delete;
    const OK: Outcome = Outcome::Ok;
    const FAIL: Outcome = Outcome::Fail;
    const UNKNOWN: Outcome = Outcome::Unknown;

    /// (op, process, t, f, value, expected_revision, outcome, revision, read_value)
    type Row = (
        u64,
        u64,
        i64,
        OpF,
        Option<u64>,
        Option<u64>,
        Outcome,
        Option<u64>,
        Option<u64>,
    );

    fn events(rows: &[Row]) -> Vec<crate::event::Event> {
        rows.iter()
            .flat_map(|&(op, p, t, f, v, exp, o, rev, read)| {
                reg_op(op, p, t, f, v, exp, o, rev, read)
            })
            .collect()
    }

    fn run(rows: &[Row]) -> CheckResult {
        check(&History::from_events(events(rows)).unwrap())
    }

    #[test]
    fn create_update_get_delete_sequence_is_valid() {
        let mut e = events(&[
            (1, 0, 10, CREATE, Some(1), None, OK, Some(1), None),
            (2, 0, 30, UPDATE, Some(2), Some(1), OK, Some(2), None),
            (3, 1, 50, GET, None, None, OK, Some(2), Some(2)),
            (4, 1, 70, UPDATE, Some(3), Some(1), FAIL, None, None),
            (5, 0, 90, DELETE, None, None, OK, None, None),
        ]);
        e.extend(reg_get_missing(6, 1, 110));
        let r = check(&History::from_events(e).unwrap());
        assert!(r.valid, "{r:?}");
        assert_eq!(r.counts["ops"], 6);
    }

    #[test]
    fn stale_read_is_flagged() {
        let r = run(&[
            (1, 0, 10, CREATE, Some(1), None, OK, Some(1), None),
            (2, 0, 30, UPDATE, Some(2), Some(1), OK, Some(2), None),
            (3, 1, 50, GET, None, None, OK, Some(1), Some(1)),
        ]);
        assert!(!r.valid);
        assert_eq!(r.counts["violations"], 1);
    }

    #[test]
    fn two_cas_on_one_revision_cannot_both_win() {
        let r = run(&[
            (1, 0, 10, CREATE, Some(1), None, OK, Some(1), None),
            (2, 0, 30, UPDATE, Some(2), Some(1), OK, Some(2), None),
            (3, 1, 31, UPDATE, Some(3), Some(1), OK, Some(3), None),
        ]);
        assert!(!r.valid, "{r:?}");
    }

    #[test]
    fn unknown_write_may_be_seen_later() {
        let r = run(&[
            (1, 0, 10, CREATE, Some(1), None, OK, Some(1), None),
            (2, 0, 30, UPDATE, Some(2), Some(1), UNKNOWN, None, None),
            (3, 1, 50, GET, None, None, OK, Some(1), Some(1)),
            (4, 1, 70, GET, None, None, OK, Some(7), Some(2)),
            (5, 1, 90, UPDATE, Some(5), Some(7), OK, Some(8), None),
        ]);
        assert!(r.valid, "{r:?}");
    }

    #[test]
    fn duplicate_create_must_see_existing_job() {
        let ok = run(&[
            (1, 0, 10, CREATE, Some(1), None, OK, Some(1), None),
            (2, 1, 30, CREATE, Some(2), None, FAIL, None, None),
        ]);
        assert!(ok.valid, "{ok:?}");
        let bad = run(&[
            (2, 1, 30, CREATE, Some(2), None, FAIL, None, None),
            (1, 0, 60, CREATE, Some(1), None, OK, Some(1), None),
        ]);
        assert!(!bad.valid, "ALREADY_EXISTS on an absent job: {bad:?}");
    }
}
