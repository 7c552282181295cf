//! A Wing–Gong–Lowe style linearizability search over one key's operations:
//! depth-first, trying every operation that may take effect next (one invoked
//! before the earliest pending completion), memoising (linearized set, model
//! state) pairs already shown to lead nowhere. Operations with unknown outcome
//! are optional: they may be linearized at any point after their invocation,
//! or never. The search is bounded by a budget of explored states.

use std::collections::HashSet;
use std::hash::Hash;

/// A sequential specification.
pub trait Model: Clone + Eq + Hash {
    type Op;
    /// The state after `op` took effect with its recorded result, or `None`
    /// if the result is impossible in this state.
    fn step(&self, op: &Self::Op) -> Option<Self>;
}

/// One operation of the history.
#[derive(Debug, Clone)]
pub struct Entry<O> {
    pub invoke_ms: i64,
    /// `history::FOREVER_MS` for unknown outcomes.
    pub complete_ms: i64,
    /// Definite outcome: must be linearized. Unknown ones may be skipped.
    pub required: bool,
    pub op: O,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// No order exists. `stuck` indexes a required entry that could not be
    /// placed after the longest linearizable prefix found (`prefix` entries).
    Violation {
        stuck: usize,
        prefix: usize,
    },
    /// The budget ran out first.
    Inconclusive {
        explored: u64,
    },
}

/// Searches for a linearization of `entries`, which must be sorted by `invoke_ms`.
pub fn search<M: Model>(init: &M, entries: &[Entry<M::Op>], budget: u64) -> Verdict {
    let mut s = Search {
        entries,
        done: vec![0u64; entries.len().div_ceil(64)],
        memo: HashSet::new(),
        explored: 0,
        budget,
        required_left: entries.iter().filter(|e| e.required).count(),
        best: (0, None),
    };
    match s.go(init, 0) {
        Ok(true) => Verdict::Linearizable,
        Ok(false) => Verdict::Violation {
            stuck: s.best.1.unwrap_or(0),
            prefix: s.best.0,
        },
        Err(OutOfBudget) => Verdict::Inconclusive {
            explored: s.explored,
        },
    }
}

struct OutOfBudget;

struct Search<'a, M: Model> {
    entries: &'a [Entry<M::Op>],
    done: Vec<u64>,
    memo: HashSet<(Vec<u64>, M)>,
    explored: u64,
    budget: u64,
    required_left: usize,
    /// Deepest prefix reached and the required entry that blocked it.
    best: (usize, Option<usize>),
}

impl<M: Model> Search<'_, M> {
    fn is_done(&self, i: usize) -> bool {
        self.done[i / 64] & (1 << (i % 64)) != 0
    }

    fn toggle(&mut self, i: usize) {
        self.done[i / 64] ^= 1 << (i % 64);
    }

    /// The earliest completion among entries not yet linearized, and the
    /// required entry that has it.
    fn frontier(&self) -> (i64, Option<usize>) {
        let mut best = (i64::MAX, None);
        for (i, e) in self.entries.iter().enumerate() {
            if !self.is_done(i) && e.complete_ms < best.0 {
                best = (e.complete_ms, e.required.then_some(i));
            }
        }
        best
    }

    fn go(&mut self, state: &M, depth: usize) -> Result<bool, OutOfBudget> {
        if self.required_left == 0 {
            return Ok(true);
        }
        self.explored += 1;
        if self.explored > self.budget {
            return Err(OutOfBudget);
        }
        let (min_complete, blocker) = self.frontier();
        for i in 0..self.entries.len() {
            let e = &self.entries[i];
            if e.invoke_ms > min_complete {
                break;
            }
            if self.is_done(i) {
                continue;
            }
            let Some(next) = state.step(&e.op) else {
                continue;
            };
            let required = e.required;
            self.toggle(i);
            self.required_left -= usize::from(required);
            if self.memo.insert((self.done.clone(), next.clone())) && self.go(&next, depth + 1)? {
                return Ok(true);
            }
            self.toggle(i);
            self.required_left += usize::from(required);
        }
        if depth >= self.best.0 {
            self.best = (depth, blocker.or(self.best.1));
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain integer register: write(v) or read(v).
    #[derive(Clone, PartialEq, Eq, Hash, Debug)]
    struct Reg(u64);
    enum Op {
        W(u64),
        R(u64),
    }
    impl Model for Reg {
        type Op = Op;
        fn step(&self, op: &Op) -> Option<Reg> {
            match op {
                Op::W(v) => Some(Reg(*v)),
                Op::R(v) => (self.0 == *v).then_some(self.clone()),
            }
        }
    }

    fn e(invoke_ms: i64, complete_ms: i64, op: Op) -> Entry<Op> {
        Entry {
            invoke_ms,
            complete_ms,
            required: complete_ms < i64::MAX / 4,
            op,
        }
    }

    const NEVER: i64 = i64::MAX / 4;

    #[test]
    fn sequential_reads_see_writes() {
        let h = [e(0, 1, Op::W(1)), e(2, 3, Op::R(1))];
        assert_eq!(search(&Reg(0), &h, 1000), Verdict::Linearizable);
    }

    #[test]
    fn stale_read_is_a_violation() {
        let h = [e(0, 1, Op::W(1)), e(2, 3, Op::W(2)), e(4, 5, Op::R(1))];
        assert!(matches!(
            search(&Reg(0), &h, 1000),
            Verdict::Violation { stuck: 2, .. }
        ));
    }

    #[test]
    fn concurrent_ops_may_reorder() {
        // The read overlaps the write of 2, so it may see 1.
        let h = [e(0, 1, Op::W(1)), e(2, 6, Op::W(2)), e(3, 5, Op::R(1))];
        assert_eq!(search(&Reg(0), &h, 1000), Verdict::Linearizable);
    }

    #[test]
    fn unknown_write_may_land_late_or_never() {
        let late = [e(0, NEVER, Op::W(7)), e(5, 6, Op::R(0)), e(8, 9, Op::R(7))];
        assert_eq!(search(&Reg(0), &late, 1000), Verdict::Linearizable);
        let never = [e(0, NEVER, Op::W(7)), e(5, 6, Op::R(0))];
        assert_eq!(search(&Reg(0), &never, 1000), Verdict::Linearizable);
        // But it cannot take effect before it was invoked.
        let early = [e(0, 1, Op::R(7)), e(5, NEVER, Op::W(7))];
        assert!(matches!(
            search(&Reg(0), &early, 1000),
            Verdict::Violation { .. }
        ));
    }

    #[test]
    fn budget_is_respected() {
        let h: Vec<_> = (0..40)
            .map(|i| e(0, NEVER, Op::W(i)))
            .chain([e(1, 2, Op::R(99))])
            .collect();
        assert!(matches!(
            search(&Reg(0), &h, 50),
            Verdict::Inconclusive { .. }
        ));
    }
}
