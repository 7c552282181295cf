//! How many due keys the leader lets into the log at once.
//!
//! Every log entry applies in order, so the fire work appended ahead of a
//! client write is time that write waits for its answer. Past saturation
//! the wheel always has more due keys than the cluster applies, and a full
//! pipeline of Fire proposals (10 × 1,024 keys) is most of a second of work
//! on a two-core box that applies 13,000-15,000 fires/s: an admitted write would
//! wait that long. Fewer keys in flight
//! cost fire throughput, though (smaller entries, more of them), so the
//! pipeline shrinks only for the writes: when a client batch comes back
//! slower than `--admit-write-target-ms`, the allowance halves (once per
//! round of proposals); a fire proposal that returns after client batches
//! came back in time, or while none is in flight, grows it back by a
//! quarter of one full proposal, up to the full pipeline; one that returns
//! while writes are in flight and none has come back leaves it. Growth is
//! additive and cuts are halvings, so the allowance stays near what the
//! writes tolerate: a lull between bursts of writes (refused clients come
//! back together, when their hint runs out) does not refill the pipeline
//! before the next burst arrives. With no client writes the allowance
//! fills, a quarter proposal per returning entry. Keys beyond it wait in the wheel, where nothing
//! queues behind them. Pacing decides when a due key is proposed, never
//! whether, and never below one full proposal: slow writes (a slow disk
//! slows them as much as fires) must not starve the fires the cluster owes.

use crate::admission::WritePace;

/// The allowance of keys in flight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FirePace {
    min_keys: usize,
    max_keys: usize,
    /// Keys a returning proposal adds back, when writes were fast.
    step: usize,
    limit: usize,
    in_flight: usize,
    /// Proposals sent up to this sequence number were in flight at the last
    /// cut: a slow write seen when one of them returns says nothing new.
    cut_seq: u64,
    next_seq: u64,
}

/// One proposal's share of the allowance, returned to [`FirePace::done`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    keys: usize,
    seq: u64,
}

impl FirePace {
    /// Starts with the full pipeline of `max_keys` allowed; the allowance
    /// stays between `min_keys` (at least 1) and `max_keys`.
    #[must_use]
    pub fn new(min_keys: usize, max_keys: usize) -> Self {
        let min_keys = min_keys.max(1);
        let max_keys = max_keys.max(min_keys);
        FirePace {
            min_keys,
            max_keys,
            step: (min_keys / 4).max(1),
            limit: max_keys,
            in_flight: 0,
            cut_seq: 0,
            next_seq: 0,
        }
    }

    /// Keys that may be proposed now. While proposals are in flight, a
    /// sliver of room is not worth a proposal of its own: it waits until a
    /// quarter of the allowance is free, or one full proposal (`min_keys`)
    /// if that is less. A large allowance so proposes all of a burst at
    /// once: the last 808 of 9,000 keys once waited 170 ms for 2,560 keys
    /// of room while a full proposal's 2,048 were free.
    #[must_use]
    pub fn room(&self) -> usize {
        let free = self.limit.saturating_sub(self.in_flight);
        match self.in_flight > 0 && free < (self.limit / 4).min(self.min_keys) {
            true => 0,
            false => free,
        }
    }

    /// Records a proposal of `keys` going out.
    pub fn sent(&mut self, keys: usize) -> Sent {
        self.in_flight += keys;
        self.next_seq += 1;
        Sent {
            keys,
            seq: self.next_seq,
        }
    }

    /// Records a proposal back, with what client writes said since the
    /// last one: slow halves the allowance once per round, fast adds a
    /// quarter of the floor (at most the proposal's keys), unknown leaves it.
    pub fn done(&mut self, sent: Sent, writes: WritePace) {
        self.in_flight = self.in_flight.saturating_sub(sent.keys);
        match writes {
            WritePace::Fast => {
                self.limit = (self.limit + self.step.min(sent.keys)).min(self.max_keys);
            }
            WritePace::Slow if sent.seq > self.cut_seq => {
                self.limit = (self.limit / 2).max(self.min_keys);
                self.cut_seq = self.next_seq;
            }
            WritePace::Slow | WritePace::Unknown => {}
        }
    }

    /// Keys allowed in flight now.
    #[must_use]
    pub fn limit(&self) -> usize {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use WritePace::{Fast, Slow, Unknown};

    #[test]
    fn without_slow_writes_the_whole_pipeline_is_allowed() {
        let mut p = FirePace::new(64, 4096);
        for _ in 0..100 {
            let s = p.sent(1024);
            assert_eq!(p.room(), 3072);
            p.done(s, Fast);
        }
        assert_eq!((p.limit(), p.room()), (4096, 4096));
    }

    #[test]
    fn slow_writes_halve_the_allowance_once_per_round_and_it_grows_back() {
        let mut p = FirePace::new(64, 4096);
        let a = p.sent(1024);
        let b = p.sent(1024);
        let c = p.sent(1024);
        // Slow writes seen as each of one round returns: one cut, not three.
        p.done(a, Slow);
        assert_eq!(p.limit(), 2048);
        p.done(b, Slow);
        p.done(c, Slow);
        assert_eq!(p.limit(), 2048);
        assert_eq!(p.room(), 2048);
        // Still slow after a proposal sent since the cut: cut again.
        let d = p.sent(512);
        p.done(d, Slow);
        assert_eq!(p.limit(), 1024);
        // Writes in flight and none back: held where it is.
        let e = p.sent(512);
        p.done(e, Unknown);
        assert_eq!(p.limit(), 1024);
        // Writes answered in time again: it grows a quarter of the floor
        // (16 keys here) per returning proposal, back to the full pipeline.
        let s = p.sent(1024);
        p.done(s, Fast);
        assert_eq!(p.limit(), 1040);
        for _ in 0..200 {
            let s = p.sent(1024);
            p.done(s, Fast);
        }
        assert_eq!(p.limit(), 4096);
    }

    #[test]
    fn with_proposals_in_flight_a_sliver_of_room_waits_for_a_quarter() {
        let mut p = FirePace::new(1024, 4000);
        let a = p.sent(3200);
        assert_eq!(p.room(), 0, "800 free of 4,000 is under a quarter");
        p.done(a, Fast);
        assert_eq!(p.room(), 4000);
        let _b = p.sent(2800);
        assert_eq!(p.room(), 1200);
    }

    #[test]
    fn with_a_large_allowance_one_full_proposal_of_room_is_not_a_sliver() {
        // Eight proposals of 1,024 in flight under 10,240: 2,048 free is
        // under a quarter of the allowance but two full proposals.
        let mut p = FirePace::new(1024, 10_240);
        let sent: Vec<Sent> = (0..8).map(|_| p.sent(1024)).collect();
        assert_eq!(p.room(), 2048);
        let _ninth = p.sent(1024);
        assert_eq!(p.room(), 1024);
        let _tenth = p.sent(1000);
        assert_eq!(p.room(), 0, "24 free is a sliver");
        for s in sent {
            p.done(s, Fast);
        }
        assert_eq!(p.room(), 8216);
    }

    #[test]
    fn growth_is_additive_so_a_lull_between_write_bursts_does_not_refill_the_pipeline() {
        let mut p = FirePace::new(1024, 4096);
        let s = p.sent(1024);
        p.done(s, Slow);
        assert_eq!(p.limit(), 2048);
        let s = p.sent(1024);
        p.done(s, Slow);
        assert_eq!(p.limit(), 1024);
        // A lull: no write in flight for three proposals.
        for _ in 0..3 {
            let s = p.sent(1024);
            p.done(s, Fast);
        }
        assert_eq!(p.limit(), 1024 + 3 * 256, "not the full 4,096");
        // The next burst is slow again: one halving, not below the floor.
        let s = p.sent(1024);
        p.done(s, Slow);
        assert_eq!(p.limit(), 1024);
    }

    #[test]
    fn the_allowance_has_a_floor_and_keys_in_flight_count_against_it() {
        let mut p = FirePace::new(64, 4096);
        for _ in 0..20 {
            let s = p.sent(10);
            p.done(s, Slow);
        }
        assert_eq!(p.limit(), 64);
        let s = p.sent(64);
        assert_eq!(p.room(), 0, "the floor is in flight");
        p.done(s, Fast);
        assert_eq!(p.room(), 80, "the floor of 64 plus a quarter of it");
        // A proposal smaller than the step adds back only its keys.
        let s = p.sent(5);
        p.done(s, Fast);
        assert_eq!(p.limit(), 85);
        // One full proposal as the floor: slow writes never hold fires below it.
        let mut q = FirePace::new(1024, 4096);
        for _ in 0..5 {
            let s = q.sent(1024);
            q.done(s, Slow);
        }
        assert_eq!(q.room(), 1024);
    }
}
