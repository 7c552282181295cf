//! Hierarchical timing wheel holding the leader's near horizon of due timers.
//!
//! The replicated state keeps every timer on disk, ordered by due time. The
//! leader only needs the ones that fall due soon, so it loads those into this
//! wheel and leaves the rest on disk until the horizon reaches them. Memory is
//! therefore bounded by how many timers fall inside the horizon (plus a fixed
//! number of slots), not by how many timers exist: `insert` refuses anything
//! beyond [`TimingWheel::horizon_ms`].
//!
//! Layout. Level 0 has one slot per tick; each slot of level `l + 1` spans a
//! whole turn of level `l`. A timer lives in exactly one slot: the lowest level
//! whose turn still reaches its due tick. As time passes, slots of upper levels
//! are emptied and their timers re-placed relative to the new time, so they
//! cascade down until they are due. Due timers move to a small ordered `ready`
//! set so `advance` can return them in `(due_ms, key)` order and in batches.
//! A side index maps each key to its exact due time and location, which makes
//! `remove` and re-scheduling O(1) and keeps a key from being held twice.
//!
//! Time only moves forward: an `advance` to an earlier instant returns the
//! already-due keys up to that instant but does not rewind the wheel.
//! All tick arithmetic runs in `i128`, so no `i64` input can overflow it.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;

/// Upper bound on slots per level, so a silly configuration cannot ask for an
/// allocation that aborts the process.
const MAX_SLOTS_PER_LEVEL: usize = 1 << 16;

/// Once a single slot spans this many ticks, one slot already covers every
/// representable `i64` instant, so further levels could never be used.
const MAX_SLOT_WIDTH_TICKS: i128 = 1 << 64;

/// Where a held key currently lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// Due (due_ms <= current time) and waiting in `ready` to be returned.
    Ready,
    /// In `levels[level].slots[slot][pos]`.
    Slot {
        level: usize,
        slot: usize,
        pos: usize,
    },
}

/// Side-index entry: the exact due time and the key's single location.
#[derive(Clone, Copy, Debug)]
struct Entry {
    due_ms: i64,
    place: Place,
}

#[derive(Debug)]
struct Level<K> {
    /// Ticks covered by one slot of this level.
    width: i128,
    /// Each bucket stores the due time next to the key so scans for the
    /// earliest due time need no index lookups.
    slots: Vec<Vec<(K, i64)>>,
}

/// A hierarchical timing wheel over keys `K`; see the module documentation.
#[derive(Debug)]
pub struct TimingWheel<K> {
    /// Resolution in milliseconds, at least 1.
    tick_ms: i128,
    /// The latest instant the wheel has advanced to; never decreases.
    now_ms: i64,
    levels: Vec<Level<K>>,
    index: HashMap<K, Entry>,
    /// Keys already due, in return order.
    ready: BTreeSet<(i64, K)>,
}

impl<K: Clone + Eq + Hash + Ord> TimingWheel<K> {
    /// `tick_ms`: resolution (e.g. 10); `slots_per_level`: e.g. 256 and 64 for two levels
    /// (tick 10 ms * 256 = 2.56 s, level 1 = 2.56 s * 64 ≈ 164 s). `start_ms`: current time.
    ///
    /// Degenerate arguments are clamped rather than rejected: a zero tick
    /// becomes 1 ms, a zero slot count becomes 1, a slot count above 65536 is
    /// capped, an empty level list means a single one-slot level, and levels
    /// beyond the one whose slot already spans all of `i64` are ignored.
    #[must_use]
    pub fn new(tick_ms: u64, slots_per_level: &[usize], start_ms: i64) -> Self {
        let tick_ms = i128::from(tick_ms.max(1));
        TimingWheel {
            tick_ms,
            now_ms: start_ms,
            levels: build_levels(slots_per_level),
            index: HashMap::new(),
            ready: BTreeSet::new(),
        }
    }

    /// The furthest instant the wheel can hold: keys beyond it are refused (the caller keeps them on disk and loads them later).
    ///
    /// It is the last millisecond of the top level's last slot. The top level
    /// is aligned to its own slot width, so the horizon grows in steps of one
    /// top-level slot (2.56 s with the example configuration) and is always at
    /// least `(top slots - 1)` top-level slots ahead of the current time.
    #[must_use]
    pub fn horizon_ms(&self) -> i64 {
        let Some(top) = self.levels.last() else {
            return self.now_ms;
        };
        let now_tick = self.tick_of(self.now_ms);
        let unit = now_tick.div_euclid(top.width);
        // First tick the top level can no longer distinguish from `unit`.
        let end_tick = (unit + top.slots.len() as i128).saturating_mul(top.width);
        let last_ms = end_tick.saturating_mul(self.tick_ms).saturating_sub(1);
        clamp_i64(last_ms)
    }

    /// Inserts `key` due at `due_ms`. Returns false (and stores nothing) when due_ms > horizon; a key already due (due_ms <= current time) is accepted and returned by the next advance. Inserting a key that is already present with a different due time moves it (no duplicates).
    ///
    /// A refused insert of a key that is already held also drops the held
    /// entry: its old due time has been superseded, and firing it at the old
    /// time would be wrong. The caller keeps the new due time on disk.
    pub fn insert(&mut self, key: K, due_ms: i64) -> bool {
        if due_ms > self.horizon_ms() {
            self.remove(&key);
            return false;
        }
        if let Some(entry) = self.index.get(&key) {
            if entry.due_ms == due_ms {
                // Already held at that time and in the right place.
                return true;
            }
        }
        self.remove(&key);
        self.place(key, due_ms)
    }

    /// Removes a key if present; returns whether it was present.
    pub fn remove(&mut self, key: &K) -> bool {
        match self.index.remove(key) {
            Some(entry) => {
                self.detach(key, entry);
                true
            }
            None => false,
        }
    }

    /// Advances the wheel to `now_ms` and returns every key with due_ms <= now_ms, ordered by (due_ms, key); at most `max` keys per call (the rest stay and come out on the next call, still in order). Never returns a key whose due_ms > now_ms (this is the "never early" guarantee — test it at tick boundaries where due_ms is not a multiple of tick_ms). Cascading from upper levels happens as time passes.
    ///
    /// An earlier `now_ms` than a previous call does not rewind the wheel; it
    /// only limits what is returned to keys due at or before `now_ms`.
    #[must_use = "dropping the returned keys loses due timers"]
    pub fn advance(&mut self, now_ms: i64, max: usize) -> Vec<(K, i64)> {
        if now_ms > self.now_ms {
            self.move_time_to(now_ms);
        }
        self.pop_ready(now_ms, max)
    }

    /// The earliest due time held, if any (used to decide how long to sleep). May be computed lazily but must be exact, not rounded to a tick.
    ///
    /// Cost: one pass over the slots plus the keys of at most one slot per
    /// level; computed on demand so mutations stay O(1).
    #[must_use]
    pub fn next_due_ms(&self) -> Option<i64> {
        if let Some((due, _)) = self.ready.first() {
            // Everything outside `ready` is due later than the current time,
            // and everything in `ready` is due no later than it.
            return Some(*due);
        }
        let now_tick = self.tick_of(self.now_ms);
        let mut best: Option<i64> = None;
        for (li, level) in self.levels.iter().enumerate() {
            if let Some(due) = self.level_min_due(li, level, now_tick, best) {
                best = Some(best.map_or(due, |b| b.min(due)));
            }
        }
        best
    }

    /// Number of keys held, due or not.
    #[must_use]
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether no key is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Drops everything (leadership lost).
    ///
    /// Buffers are released, not just emptied, so a former leader does not
    /// keep the memory of its peak load. The current time is kept.
    pub fn clear(&mut self) {
        for level in &mut self.levels {
            for bucket in &mut level.slots {
                *bucket = Vec::new();
            }
        }
        self.index = HashMap::new();
        self.ready = BTreeSet::new();
    }

    /// Tick number containing `ms`; floor division so negative times work.
    fn tick_of(&self, ms: i64) -> i128 {
        i128::from(ms).div_euclid(self.tick_ms)
    }

    /// Stores `key` (already absent from every slot) relative to the current
    /// time and records it in the index. Returns false only if no level
    /// reaches `due_ms`, which callers rule out by checking the horizon first.
    fn place(&mut self, key: K, due_ms: i64) -> bool {
        if due_ms <= self.now_ms {
            self.ready.insert((due_ms, key.clone()));
            self.index.insert(
                key,
                Entry {
                    due_ms,
                    place: Place::Ready,
                },
            );
            return true;
        }
        let due_tick = self.tick_of(due_ms);
        let now_tick = self.tick_of(self.now_ms);
        for (level_no, level) in self.levels.iter_mut().enumerate() {
            let n = level.slots.len() as i128;
            let due_unit = due_tick.div_euclid(level.width);
            // The lowest level whose current turn still reaches the due tick;
            // "less than n units ahead" guarantees no two live units share a slot.
            if due_unit - now_tick.div_euclid(level.width) >= n {
                continue;
            }
            let slot = due_unit.rem_euclid(n) as usize;
            let Some(bucket) = level.slots.get_mut(slot) else {
                break;
            };
            let place = Place::Slot {
                level: level_no,
                slot,
                pos: bucket.len(),
            };
            bucket.push((key.clone(), due_ms));
            self.index.insert(key, Entry { due_ms, place });
            return true;
        }
        false
    }

    /// Takes a key (already removed from the index) out of its location.
    fn detach(&mut self, key: &K, entry: Entry) {
        match entry.place {
            Place::Ready => {
                self.ready.remove(&(entry.due_ms, key.clone()));
            }
            Place::Slot { level, slot, pos } => {
                let bucket = self
                    .levels
                    .get_mut(level)
                    .and_then(|l| l.slots.get_mut(slot));
                let Some(bucket) = bucket else { return };
                if pos >= bucket.len() {
                    return;
                }
                // swap_remove keeps removal O(1); the key that fills the hole
                // must have its recorded position fixed.
                bucket.swap_remove(pos);
                if let Some((moved, _)) = bucket.get(pos) {
                    if let Some(e) = self.index.get_mut(moved) {
                        e.place = Place::Slot { level, slot, pos };
                    }
                }
            }
        }
    }

    /// Moves the current time forward to `now_ms` (> self.now_ms), emptying
    /// every slot whose span time has reached and re-placing its keys: the due
    /// ones go to `ready`, the rest cascade to a lower level.
    ///
    /// Only slots that can hold keys due by `now_ms` are visited, at most one
    /// full turn per level, so even a jump of years costs O(slots + keys
    /// moved) instead of one step per tick.
    fn move_time_to(&mut self, now_ms: i64) {
        let old_tick = self.tick_of(self.now_ms);
        let new_tick = self.tick_of(now_ms);
        let mut drained: Vec<(K, i64)> = Vec::new();
        for (level_no, level) in self.levels.iter_mut().enumerate() {
            let n = level.slots.len() as i128;
            let old_unit = old_tick.div_euclid(level.width);
            let new_unit = new_tick.div_euclid(level.width);
            // Level 0 also holds keys due later within the current tick, so
            // its current slot is revisited. Upper levels never hold keys of
            // their current unit: those always fit a lower level.
            let first = if level_no == 0 {
                old_unit
            } else {
                old_unit + 1
            };
            let count = (new_unit - first + 1).clamp(0, n);
            for i in 0..count {
                let slot = (first + i).rem_euclid(n) as usize;
                if let Some(bucket) = level.slots.get_mut(slot) {
                    // take() frees the slot's buffer, keeping memory tied to
                    // what is currently held rather than to past peaks.
                    let taken = std::mem::take(bucket);
                    if drained.is_empty() {
                        drained = taken;
                    } else {
                        drained.extend(taken);
                    }
                }
            }
        }
        self.now_ms = now_ms;
        for (key, due_ms) in drained {
            // Cannot fail: the horizon never shrinks as time moves forward,
            // and these keys were within it. Dropping from the index keeps
            // `len` honest if that reasoning were ever broken.
            if !self.place(key.clone(), due_ms) {
                self.index.remove(&key);
            }
        }
    }

    /// Returns up to `max` ready keys due at or before `limit_ms`, in order.
    fn pop_ready(&mut self, limit_ms: i64, max: usize) -> Vec<(K, i64)> {
        let mut out = Vec::with_capacity(max.min(self.ready.len()));
        while out.len() < max {
            match self.ready.first() {
                Some((due, _)) if *due <= limit_ms => {}
                _ => break,
            }
            let Some((due, key)) = self.ready.pop_first() else {
                break;
            };
            self.index.remove(&key);
            out.push((key, due));
        }
        out
    }

    /// Earliest due time on one level, skipping the scan when the level's
    /// first occupied slot cannot beat `best`.
    fn level_min_due(
        &self,
        level_no: usize,
        level: &Level<K>,
        now_tick: i128,
        best: Option<i64>,
    ) -> Option<i64> {
        let n = level.slots.len() as i128;
        let now_unit = now_tick.div_euclid(level.width);
        // Same ranges as in move_time_to: level 0 starts at the current tick,
        // upper levels at the unit after the current one.
        let first = if level_no == 0 {
            now_unit
        } else {
            now_unit + 1
        };
        for i in 0..n {
            let unit = first + i;
            let Some(bucket) = level.slots.get(unit.rem_euclid(n) as usize) else {
                continue;
            };
            if bucket.is_empty() {
                continue;
            }
            // Slots are visited in time order, so the first occupied one holds
            // this level's earliest keys; all share one unit, so take the min.
            let slot_start_ms = clamp_i64(
                unit.saturating_mul(level.width)
                    .saturating_mul(self.tick_ms),
            );
            if best.is_some_and(|b| b <= slot_start_ms) {
                return None;
            }
            return bucket.iter().map(|(_, due)| *due).min();
        }
        None
    }
}

fn build_levels<K>(slots_per_level: &[usize]) -> Vec<Level<K>> {
    let mut levels = Vec::new();
    let mut width: i128 = 1;
    for &n in slots_per_level {
        if width > MAX_SLOT_WIDTH_TICKS {
            break;
        }
        let n = n.clamp(1, MAX_SLOTS_PER_LEVEL);
        levels.push(Level {
            width,
            slots: (0..n).map(|_| Vec::new()).collect(),
        });
        width = width.saturating_mul(n as i128);
    }
    if levels.is_empty() {
        levels.push(Level {
            width: 1,
            slots: vec![Vec::new()],
        });
    }
    levels
}

fn clamp_i64(v: i128) -> i64 {
    v.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Checks the structural invariants: every held key is in exactly one
    /// place, the index records that place and due time, slots hold only keys
    /// not yet due, and `ready` holds only keys already due.
    fn check_invariants<K: Clone + Eq + Hash + Ord + std::fmt::Debug>(w: &TimingWheel<K>) {
        let mut seen = 0usize;
        for (li, level) in w.levels.iter().enumerate() {
            for (si, bucket) in level.slots.iter().enumerate() {
                for (pos, (k, due)) in bucket.iter().enumerate() {
                    let e = w.index.get(k).expect("slot key missing from index");
                    assert_eq!(e.due_ms, *due);
                    assert_eq!(
                        e.place,
                        Place::Slot {
                            level: li,
                            slot: si,
                            pos
                        }
                    );
                    assert!(*due > w.now_ms, "not-yet-due slot holds a due key");
                    seen += 1;
                }
            }
        }
        for (due, k) in &w.ready {
            let e = w.index.get(k).expect("ready key missing from index");
            assert_eq!((e.due_ms, e.place), (*due, Place::Ready));
            assert!(*due <= w.now_ms);
            seen += 1;
        }
        assert_eq!(seen, w.index.len(), "a key is held twice or lost");
    }

    fn keys(v: &[(u32, i64)]) -> Vec<u32> {
        v.iter().map(|(k, _)| *k).collect()
    }

    #[test]
    fn ordering_across_levels() {
        // tick 10, 4 x 4 x 4: level 0 = 40 ms, level 1 = 160 ms, level 2 = 640 ms.
        let mut w = TimingWheel::new(10, &[4, 4, 4], 0);
        let dues = [
            (1, 5),
            (2, 35),
            (3, 41),
            (4, 159),
            (5, 160),
            (6, 333),
            (7, 639),
            (8, 0),
            (9, 333),
        ];
        for (k, due) in dues {
            assert!(w.insert(k, due));
        }
        check_invariants(&w);
        // Keys really are spread over several levels.
        let used: Vec<bool> = w
            .levels
            .iter()
            .map(|l| l.slots.iter().any(|s| !s.is_empty()))
            .collect();
        assert_eq!(used, vec![true, true, true]);

        let mut out = Vec::new();
        let mut now = 0;
        while now <= 700 {
            out.extend(w.advance(now, usize::MAX));
            check_invariants(&w);
            now += 7;
        }
        let mut expected: Vec<(u32, i64)> = dues.to_vec();
        expected.sort_by_key(|&(k, d)| (d, k));
        assert_eq!(out, expected);
        assert!(w.is_empty());
    }

    #[test]
    fn ordering_in_one_call_with_realistic_config() {
        let mut w = TimingWheel::new(10, &[256, 64], 1_000);
        let mut expected = Vec::new();
        for k in 0..500u32 {
            let due = 1_000 + i64::from(k.wrapping_mul(7919) % 160_000);
            assert!(w.insert(k, due));
            expected.push((k, due));
        }
        expected.sort_by_key(|&(k, d)| (d, k));
        assert_eq!(w.next_due_ms(), Some(expected[0].1));
        assert_eq!(w.advance(170_000, usize::MAX), expected);
    }

    #[test]
    fn never_early_at_sub_tick_due_times() {
        let mut w = TimingWheel::new(10, &[4, 4], 0);
        // 15 and 19 share tick 1 with instants that are not yet due.
        for (k, due) in [(1, 15), (2, 19), (3, 20), (4, 21), (5, 95), (6, 101)] {
            assert!(w.insert(k, due));
        }
        assert_eq!(w.next_due_ms(), Some(15));
        assert!(w.advance(10, 100).is_empty(), "tick boundary before 15");
        assert!(w.advance(14, 100).is_empty());
        assert_eq!(w.advance(15, 100), vec![(1, 15)]);
        assert_eq!(w.next_due_ms(), Some(19));
        assert!(w.advance(18, 100).is_empty());
        assert_eq!(w.advance(19, 100), vec![(2, 19)]);
        assert_eq!(w.advance(20, 100), vec![(3, 20)]);
        assert_eq!(w.next_due_ms(), Some(21));
        assert_eq!(w.advance(21, 100), vec![(4, 21)]);
        // 95 and 101 started on level 1 and cascade down mid-tick.
        assert!(w.advance(90, 100).is_empty());
        assert_eq!(w.next_due_ms(), Some(95));
        assert!(w.advance(94, 100).is_empty());
        assert_eq!(w.advance(95, 100), vec![(5, 95)]);
        assert!(w.advance(100, 100).is_empty(), "tick boundary before 101");
        assert_eq!(w.next_due_ms(), Some(101));
        assert_eq!(w.advance(101, 100), vec![(6, 101)]);
        check_invariants(&w);
    }

    #[test]
    fn never_early_after_a_jump_into_the_middle_of_a_tick() {
        let mut w = TimingWheel::new(10, &[4, 4], 0);
        assert!(w.insert(1, 127));
        assert!(w.insert(2, 123));
        // Jump straight into tick 12 from level 1 without stepping.
        assert_eq!(w.advance(124, 10), vec![(2, 123)]);
        assert_eq!(w.next_due_ms(), Some(127));
        assert!(w.advance(126, 10).is_empty());
        assert_eq!(w.advance(127, 10), vec![(1, 127)]);
    }

    #[test]
    fn remove_and_move() {
        let mut w = TimingWheel::new(10, &[8, 8], 0);
        for k in 0..6u32 {
            assert!(w.insert(k, 100 + i64::from(k)));
        }
        assert!(w.remove(&2));
        assert!(!w.remove(&2));
        assert!(!w.remove(&99));
        assert_eq!(w.len(), 5);
        // Move earlier (to another level), later, and re-insert at the same time.
        assert!(w.insert(4, 7));
        assert!(w.insert(0, 300));
        assert!(w.insert(1, 101));
        assert_eq!(w.len(), 5, "moves must not duplicate");
        check_invariants(&w);
        assert_eq!(w.next_due_ms(), Some(7));
        assert_eq!(keys(&w.advance(200, 100)), vec![4, 1, 3, 5]);
        assert_eq!(w.advance(300, 100), vec![(0, 300)]);
        assert!(w.is_empty());

        // A key that is already due (in `ready`) can be removed or moved too.
        assert!(w.insert(7, 250));
        assert!(w.insert(8, 260));
        assert!(w.remove(&7));
        assert!(w.insert(8, 400));
        assert!(w.advance(300, 100).is_empty());
        assert_eq!(w.advance(400, 100), vec![(8, 400)]);
        check_invariants(&w);
    }

    #[test]
    fn horizon_refusal() {
        let mut w = TimingWheel::new(10, &[256, 64], 0);
        // 10 ms * 256 * 64 = 163 840 ms.
        assert_eq!(w.horizon_ms(), 163_839);
        assert!(w.insert(1, 163_839));
        assert!(!w.insert(2, 163_840));
        assert!(!w.insert(3, i64::MAX));
        assert_eq!(w.len(), 1);
        assert!(!w.index.contains_key(&2));

        // Moving a held key beyond the horizon drops it rather than firing it
        // at its old time.
        assert!(w.insert(4, 50));
        assert!(!w.insert(4, 200_000));
        assert!(!w.remove(&4));
        assert_eq!(w.len(), 1);

        // The horizon grows with time, in steps of one top-level slot.
        assert!(w.advance(2_559, 10).is_empty());
        assert_eq!(w.horizon_ms(), 163_839);
        assert!(w.advance(2_560, 10).is_empty());
        assert_eq!(w.horizon_ms(), 163_839 + 2_560);
        assert!(w.insert(2, 163_840));
        check_invariants(&w);
        assert_eq!(w.advance(170_000, 10), vec![(1, 163_839), (2, 163_840)]);
    }

    #[test]
    fn max_per_call_batching_keeps_order() {
        let mut w = TimingWheel::new(10, &[16, 16], 0);
        let mut expected = Vec::new();
        for k in 0..50u32 {
            let due = i64::from((k * 37) % 1000);
            assert!(w.insert(k, due));
            expected.push((k, due));
        }
        expected.sort_by_key(|&(k, d)| (d, k));
        let mut out = Vec::new();
        loop {
            let batch = w.advance(1_000, 7);
            assert!(batch.len() <= 7);
            if batch.is_empty() {
                break;
            }
            out.extend(batch);
        }
        assert_eq!(out, expected);
        assert!(w.advance(1_000, 0).is_empty());

        // Keys left over from a capped batch come out first next time, even
        // though later keys have become due since.
        assert!(w.insert(1, 1_010));
        assert!(w.insert(2, 1_020));
        assert!(w.insert(3, 1_030));
        assert_eq!(w.advance(1_020, 1), vec![(1, 1_010)]);
        assert_eq!(w.advance(1_030, 2), vec![(2, 1_020), (3, 1_030)]);
    }

    #[test]
    fn big_jump_forward() {
        let mut w = TimingWheel::new(1, &[256, 64, 64], 0);
        let horizon = w.horizon_ms();
        let mut expected = Vec::new();
        for k in 0..1_000u32 {
            let due = (i64::from(k) * 1_048_573) % horizon;
            assert!(w.insert(k, due));
            expected.push((k, due));
        }
        expected.sort_by_key(|&(k, d)| (d, k));
        // A per-tick loop would take ~2^63 steps here; this must be instant.
        let out = w.advance(i64::MAX, usize::MAX);
        assert_eq!(out, expected);
        assert!(w.is_empty());
        assert_eq!(w.next_due_ms(), None);
        assert_eq!(w.horizon_ms(), i64::MAX);
        // The wheel stays usable at the end of time.
        assert!(w.insert(1, i64::MAX));
        assert_eq!(w.advance(i64::MAX, 1), vec![(1, i64::MAX)]);

        // A jump that lands inside the horizon keeps the later keys in place.
        let mut w = TimingWheel::new(10, &[8, 8], 0);
        for (k, due) in [(1, 5), (2, 300), (3, 601), (4, 639)] {
            assert!(w.insert(k, due));
        }
        assert_eq!(keys(&w.advance(600, 10)), vec![1, 2]);
        check_invariants(&w);
        assert_eq!(w.next_due_ms(), Some(601));
        assert_eq!(keys(&w.advance(1_000_000, 10)), vec![3, 4]);
    }

    #[test]
    fn backwards_time_is_ignored() {
        let mut w = TimingWheel::new(10, &[8, 8], 1_000);
        assert!(w.insert(1, 1_005));
        assert!(w.insert(2, 1_200));
        assert_eq!(w.advance(1_100, 10), vec![(1, 1_005)]);
        assert!(w.advance(500, 10).is_empty());
        assert!(w.advance(i64::MIN, 10).is_empty());
        // Time did not go back: the horizon and placement still use 1 100.
        assert_eq!(w.now_ms, 1_100);
        // A key due between the backward instant and the real time is already
        // due; it is not returned early for the earlier instant.
        assert!(w.insert(3, 900));
        assert!(w.advance(800, 10).is_empty());
        assert_eq!(w.advance(900, 10), vec![(3, 900)]);
        assert!(w.advance(1_199, 10).is_empty());
        assert_eq!(w.advance(1_200, 10), vec![(2, 1_200)]);
        check_invariants(&w);
    }

    #[test]
    fn already_due_keys_come_out_on_next_advance() {
        let mut w = TimingWheel::new(10, &[8, 8], 1_000);
        assert!(w.insert(2, 999));
        assert!(w.insert(1, i64::MIN));
        assert!(w.insert(3, 1_000));
        assert_eq!(w.next_due_ms(), Some(i64::MIN));
        assert_eq!(
            w.advance(1_000, 10),
            vec![(1, i64::MIN), (2, 999), (3, 1_000)]
        );
    }

    #[test]
    fn extreme_and_degenerate_inputs_do_not_panic() {
        let configs: [(u64, &[usize]); 6] = [
            (0, &[]),
            (1, &[0, 0]),
            (u64::MAX, &[3]),
            (
                1,
                &[usize::MAX, usize::MAX, usize::MAX, usize::MAX, usize::MAX],
            ),
            (7, &[1, 1, 1]),
            (10, &[256, 64]),
        ];
        let times = [i64::MIN, i64::MIN + 1, -1, 0, 1, i64::MAX - 1, i64::MAX];
        for (tick, slots) in configs {
            for start in times {
                let mut w = TimingWheel::new(tick, slots, start);
                for (k, due) in times.iter().enumerate() {
                    w.insert(k, *due);
                }
                w.remove(&0);
                let _ = w.next_due_ms();
                let _ = w.horizon_ms();
                check_invariants(&w);
                let mut last = None;
                for now in times {
                    for (k, due) in w.advance(now, usize::MAX) {
                        assert!(due <= now, "key {k} early");
                        assert!(last <= Some(due), "out of order");
                        last = Some(due);
                    }
                    check_invariants(&w);
                }
                assert!(w.is_empty());
                w.insert(1, 0);
                w.clear();
                assert!(w.is_empty() && w.next_due_ms().is_none());
            }
        }
    }

    #[test]
    fn clear_drops_everything() {
        let mut w = TimingWheel::new(10, &[8, 8], 0);
        for k in 0..20u32 {
            w.insert(k, i64::from(k) * 30);
        }
        assert!(w.advance(100, 0).is_empty(), "max 0 returns nothing");
        w.clear();
        assert_eq!(w.len(), 0);
        assert!(w.is_empty());
        assert_eq!(w.next_due_ms(), None);
        assert!(w.advance(10_000, 100).is_empty());
        assert!(w.insert(1, 10_050));
        assert_eq!(w.advance(10_050, 100), vec![(1, 10_050)]);
    }

    /// Tiny deterministic PRNG so the model test needs no crates.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
        fn range(&mut self, lo: i64, hi: i64) -> i64 {
            lo + self.below((hi - lo + 1) as u64) as i64
        }
    }

    /// Reference model: ordered set of (due, key) plus key -> due.
    struct Model {
        by_time: BTreeMap<(i64, u32), ()>,
        by_key: HashMap<u32, i64>,
    }

    impl Model {
        fn remove(&mut self, k: u32) -> bool {
            match self.by_key.remove(&k) {
                Some(due) => self.by_time.remove(&(due, k)).is_some(),
                None => false,
            }
        }
        fn insert(&mut self, k: u32, due: i64) {
            self.remove(k);
            self.by_key.insert(k, due);
            self.by_time.insert((due, k), ());
        }
        fn take_due(&mut self, now: i64, max: usize) -> Vec<(u32, i64)> {
            let due: Vec<(i64, u32)> = self
                .by_time
                .keys()
                .take_while(|(d, _)| *d <= now)
                .take(max)
                .copied()
                .collect();
            for &(d, k) in &due {
                self.by_time.remove(&(d, k));
                self.by_key.remove(&k);
            }
            due.into_iter().map(|(d, k)| (k, d)).collect()
        }
    }

    fn run_model(seed: u64, tick: u64, slots: &[usize], steps: usize) {
        let mut rng = XorShift(seed);
        let start = rng.range(-1_000_000, 1_000_000);
        let mut w = TimingWheel::new(tick, slots, start);
        let mut m = Model {
            by_time: BTreeMap::new(),
            by_key: HashMap::new(),
        };
        let mut now = start;
        let mut last_horizon = w.horizon_ms();
        let span: i64 = slots.iter().map(|&s| s as i64).product::<i64>() * tick as i64;
        let top_slot = span / *slots.last().unwrap() as i64;
        for step in 0..steps {
            let horizon = w.horizon_ms();
            assert!(horizon >= last_horizon, "horizon shrank");
            assert!(horizon >= now + span - top_slot, "horizon too short");
            assert!(horizon < now + span, "horizon too long");
            last_horizon = horizon;
            let key = rng.below(64) as u32;
            match rng.below(10) {
                0..=4 => {
                    // Mostly inside the horizon, sometimes past it or already due.
                    let due = rng.range(now - 3 * tick as i64, horizon + 2 * tick as i64);
                    let accepted = w.insert(key, due);
                    assert_eq!(accepted, due <= horizon, "step {step}");
                    if accepted {
                        m.insert(key, due);
                    } else {
                        m.remove(key);
                    }
                }
                5 => assert_eq!(w.remove(&key), m.remove(key), "step {step}"),
                _ => {
                    let target = match rng.below(20) {
                        0 => now - rng.range(0, span),         // backwards
                        1 => now + rng.range(span, 10 * span), // jump past the horizon
                        2..=9 => now + rng.range(0, 2 * tick as i64),
                        _ => now + rng.range(0, span / 4),
                    };
                    let max = if rng.below(4) == 0 {
                        rng.below(4) as usize
                    } else {
                        usize::MAX
                    };
                    let got = w.advance(target, max);
                    let expected = m.take_due(target, max);
                    assert_eq!(got, expected, "step {step} advance({target}, {max})");
                    now = now.max(target);
                }
            }
            assert_eq!(w.len(), m.by_key.len(), "step {step}");
            assert_eq!(
                w.next_due_ms(),
                m.by_time.keys().next().map(|(d, _)| *d),
                "step {step}"
            );
            if step % 64 == 0 {
                check_invariants(&w);
            }
        }
        check_invariants(&w);
    }

    #[test]
    fn randomized_against_btreemap_model() {
        // Tiny wheels cascade constantly; the realistic one checks big slots.
        run_model(0x9E37_79B9_7F4A_7C15, 1, &[2], 20_000);
        run_model(0xDEAD_BEEF_CAFE_F00D, 3, &[4, 3, 2], 40_000);
        run_model(0x0123_4567_89AB_CDEF, 10, &[8, 8], 40_000);
        run_model(0x2545_F491_4F6C_DD1D, 7, &[5, 1, 3, 4], 40_000);
        run_model(0x5851_F42D_4C95_7F2D, 10, &[256, 64], 20_000);
    }
}
