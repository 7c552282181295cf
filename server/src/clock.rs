//! Time, and the only module that reads the wall clock. [`ClusterClock`]
//! is the leader's clock corrected by the median offset of a quorum's
//! clocks, so one node with a skewed clock cannot fire jobs early or late.
//! Everything else asks this module for the time; the state machine never
//! does (time travels inside commands).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in unix milliseconds. Injected so tests and
/// the fault harness can skew it.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> i64;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}

/// A clock shifted by a fixed offset (tests).
pub struct SkewedClock {
    pub skew_ms: i64,
}

impl Clock for SkewedClock {
    fn now_ms(&self) -> i64 {
        SystemClock.now_ms() + self.skew_ms
    }
}

/// Median of the offsets, self (0) included. With an even count the lower
/// middle is taken, which errs towards firing late rather than early.
pub fn median_offset(peer_offsets: &[i64]) -> i64 {
    let mut all: Vec<i64> = peer_offsets.to_vec();
    all.push(0);
    all.sort_unstable();
    all[(all.len() - 1) / 2]
}

/// Offset of a peer's clock from ours, from one round trip: the peer read
/// its clock somewhere between our `sent_ms` and `received_ms`.
pub fn probe_offset(sent_ms: i64, peer_ms: i64, received_ms: i64) -> i64 {
    peer_ms - (sent_ms + (received_ms - sent_ms) / 2)
}

pub struct ClusterClock {
    local: Arc<dyn Clock>,
    offset_ms: AtomicI64,
    calibrated: AtomicBool,
    last_ms: AtomicI64,
    peer_offsets: Mutex<Vec<(u64, i64)>>,
}

impl ClusterClock {
    pub fn new(local: Arc<dyn Clock>) -> Self {
        ClusterClock {
            local,
            offset_ms: AtomicI64::new(0),
            calibrated: AtomicBool::new(false),
            last_ms: AtomicI64::new(i64::MIN),
            peer_offsets: Mutex::new(Vec::new()),
        }
    }

    /// This node's own wall clock.
    pub fn local_ms(&self) -> i64 {
        self.local.now_ms()
    }

    /// Cluster time: local clock plus the quorum's median offset; never goes back on this node.
    pub fn now_ms(&self) -> i64 {
        let t = self.local.now_ms() + self.offset_ms.load(Ordering::Relaxed);
        let prev = self.last_ms.fetch_max(t, Ordering::Relaxed);
        prev.max(t)
    }

    /// True once offsets from a quorum have been measured (always for one node).
    pub fn is_calibrated(&self) -> bool {
        self.calibrated.load(Ordering::Relaxed)
    }

    /// Records a round of probes. `voters` counts the whole voting set,
    /// self included; fewer than a quorum of answers keeps the old offset.
    pub fn update(&self, offsets: &[(u64, i64)], voters: usize) {
        if offsets.len() + 1 < voters / 2 + 1 {
            return;
        }
        let values: Vec<i64> = offsets.iter().map(|(_, o)| *o).collect();
        self.offset_ms
            .store(median_offset(&values), Ordering::Relaxed);
        self.calibrated.store(true, Ordering::Relaxed);
        *self.peer_offsets.lock().unwrap_or_else(|e| e.into_inner()) = offsets.to_vec();
    }

    /// Leadership lost: the next leader term measures afresh.
    pub fn reset(&self) {
        self.calibrated.store(false, Ordering::Relaxed);
    }

    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }

    /// Last measured offset of each peer's clock from this node's (skew metric).
    pub fn peer_offsets(&self) -> Vec<(u64, i64)> {
        self.peer_offsets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_skewed_peer_cannot_move_the_median() {
        assert_eq!(median_offset(&[8000, 3]), 3);
        assert_eq!(median_offset(&[-8000, 2]), 0);
        // A leader 8 s fast sees both peers 8 s behind: cluster time is corrected.
        assert_eq!(median_offset(&[-8000, -7990]), -7990);
        assert_eq!(median_offset(&[]), 0);
        // Even count (4 values with self): lower middle.
        assert_eq!(median_offset(&[10, 20, 30]), 10);
    }

    #[test]
    fn probe_offset_uses_the_midpoint() {
        assert_eq!(probe_offset(1000, 6010, 1020), 5000);
    }

    #[test]
    fn needs_a_quorum_of_answers_and_never_goes_back() {
        let c = ClusterClock::new(Arc::new(SkewedClock { skew_ms: 0 }));
        c.update(&[], 3);
        assert!(!c.is_calibrated());
        c.update(&[(2, -5000)], 3);
        assert!(c.is_calibrated());
        let a = c.now_ms();
        c.update(&[(2, -9000), (3, -9000)], 3);
        assert!(c.now_ms() >= a);
    }
}
