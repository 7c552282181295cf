//! Time, and the only module that reads the wall clock. [`ClusterClock`]
//! is the leader's clock corrected by the median offset of a quorum's
//! clocks, so one node with a skewed clock cannot fire jobs early or late.
//! Everything else asks this module for the time; the state machine never
//! does (time travels inside commands).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// How long a write waits for a new leader's first clock measurement
/// before it is refused as unavailable (the client retries).
pub const CALIBRATION_WAIT_MS: i64 = 2_000;
const CALIBRATION_POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// A source of wall-clock time in unix milliseconds. Injected so tests and
/// the fault harness can skew it.
pub trait Clock: Send + Sync + 'static {
    /// Wall-clock time (may jump when the system clock is set).
    fn now_ms(&self) -> i64;
    /// A monotonic count of milliseconds from an arbitrary origin; never jumps.
    fn mono_ms(&self) -> i64 {
        static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed().as_millis() as i64
    }
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

/// The lower median: with an even count the lower middle is taken, which
/// errs towards firing late rather than early. `None` when empty.
pub fn lower_median(values: &[i64]) -> Option<i64> {
    let mut all = values.to_vec();
    all.sort_unstable();
    all.get(all.len().checked_sub(1)? / 2).copied()
}

/// One clock probe of a peer: its wall clock, read somewhere in our round
/// trip, and the midpoint of that round trip on our monotonic clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub peer: u64,
    pub peer_ms: i64,
    pub mono_mid_ms: i64,
}

/// Cluster time at one monotonic instant, fixed by the last probe round.
#[derive(Clone, Copy, Debug)]
struct Base {
    cluster_ms: i64,
    mono_ms: i64,
}

/// Cluster time. Each probe round fixes a base: the lower median of every
/// voter's clock (this node's included), each projected to the same
/// monotonic instant. Between rounds time advances on the monotonic clock,
/// so a step or strobe of this node's wall clock cannot move cluster time;
/// it is one sample of the median at the next round.
pub struct ClusterClock {
    local: Arc<dyn Clock>,
    offset_ms: AtomicI64,
    calibrated: AtomicBool,
    last_ms: AtomicI64,
    base: Mutex<Option<Base>>,
    peer_offsets: Mutex<Vec<(u64, i64)>>,
}

impl ClusterClock {
    pub fn new(local: Arc<dyn Clock>) -> Self {
        ClusterClock {
            local,
            offset_ms: AtomicI64::new(0),
            calibrated: AtomicBool::new(false),
            last_ms: AtomicI64::new(i64::MIN),
            base: Mutex::new(None),
            peer_offsets: Mutex::new(Vec::new()),
        }
    }

    /// This node's own wall clock.
    pub fn local_ms(&self) -> i64 {
        self.local.now_ms()
    }

    /// This node's monotonic clock (for probe round trips).
    pub fn mono_ms(&self) -> i64 {
        self.local.mono_ms()
    }

    /// Cluster time: the last measured base advanced by the monotonic clock
    /// (before any measurement: the wall clock); never goes back on this node.
    pub fn now_ms(&self) -> i64 {
        let base = *self.base.lock().unwrap_or_else(|e| e.into_inner());
        let t = match base {
            Some(b) => b.cluster_ms + (self.local.mono_ms() - b.mono_ms),
            None => self.local.now_ms(),
        };
        let prev = self.last_ms.fetch_max(t, Ordering::Relaxed);
        prev.max(t)
    }

    /// True once a quorum's clocks have been measured (always for one node).
    pub fn is_calibrated(&self) -> bool {
        self.calibrated.load(Ordering::Relaxed)
    }

    /// Cluster time, if a quorum's clocks have been measured in this
    /// leader term; None before (then [`Self::now_ms`] is only this node's
    /// wall clock, which must not be stamped into a command: state-machine
    /// time never goes back, so one skewed stamp would stay for good).
    pub fn calibrated_now_ms(&self) -> Option<i64> {
        self.is_calibrated().then(|| self.now_ms())
    }

    /// [`Self::calibrated_now_ms`], waiting up to `wait_ms` (on the
    /// monotonic clock) for the first measurement of a new leader term.
    pub async fn wait_calibrated_ms(&self, wait_ms: i64) -> Option<i64> {
        let until = self.mono_ms().saturating_add(wait_ms);
        loop {
            if let Some(t) = self.calibrated_now_ms() {
                return Some(t);
            }
            if self.mono_ms() >= until {
                return None;
            }
            tokio::time::sleep(CALIBRATION_POLL).await;
        }
    }

    /// Records a round of probes. `voters` counts the whole voting set, self
    /// included; fewer than a quorum of samples keeps the previous base.
    pub fn update(&self, samples: &[Sample], voters: usize) {
        if samples.len() + 1 < voters / 2 + 1 {
            return;
        }
        let mono = self.local.mono_ms();
        let own = self.local.now_ms();
        let projected: Vec<(u64, i64)> = samples
            .iter()
            .map(|s| (s.peer, s.peer_ms + (mono - s.mono_mid_ms)))
            .collect();
        let mut all: Vec<i64> = projected.iter().map(|(_, t)| *t).collect();
        all.push(own);
        let Some(cluster_ms) = lower_median(&all) else {
            return;
        };
        self.offset_ms.store(cluster_ms - own, Ordering::Relaxed);
        *self.base.lock().unwrap_or_else(|e| e.into_inner()) = Some(Base {
            cluster_ms,
            mono_ms: mono,
        });
        // Readings taken before a quorum was measured (the plain wall clock,
        // possibly skewed ahead) must not hold cluster time up as a floor.
        if !self.calibrated.swap(true, Ordering::Relaxed) {
            self.last_ms.store(i64::MIN, Ordering::Relaxed);
        }
        let offsets = projected.into_iter().map(|(p, t)| (p, t - own)).collect();
        *self.peer_offsets.lock().unwrap_or_else(|e| e.into_inner()) = offsets;
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

    /// A wall clock a test can step, with a monotonic clock it cannot.
    struct StepClock {
        wall: AtomicI64,
        mono: AtomicI64,
    }

    impl Clock for StepClock {
        fn now_ms(&self) -> i64 {
            self.wall.load(Ordering::Relaxed)
        }
        fn mono_ms(&self) -> i64 {
            self.mono.load(Ordering::Relaxed)
        }
    }

    fn step_clock(wall: i64) -> Arc<StepClock> {
        Arc::new(StepClock {
            wall: AtomicI64::new(wall),
            mono: AtomicI64::new(0),
        })
    }

    fn set(c: &StepClock, wall: i64, mono: i64) {
        c.wall.store(wall, Ordering::Relaxed);
        c.mono.store(mono, Ordering::Relaxed);
    }

    fn sample(peer: u64, peer_ms: i64, mono_mid_ms: i64) -> Sample {
        Sample {
            peer,
            peer_ms,
            mono_mid_ms,
        }
    }

    #[test]
    fn lower_median_errs_late() {
        assert_eq!(lower_median(&[3, 8000, 0]), Some(3));
        assert_eq!(lower_median(&[10, 20, 30, 40]), Some(20));
        assert_eq!(lower_median(&[]), None);
    }

    #[test]
    fn one_skewed_node_cannot_move_cluster_time() {
        // This node (the leader) is 8 s fast; both peers agree on the truth.
        let local = step_clock(108_000);
        let c = ClusterClock::new(local.clone());
        c.update(&[sample(2, 100_000, 0), sample(3, 100_002, 0)], 3);
        assert_eq!(c.now_ms(), 100_002);
        assert_eq!(c.offset_ms(), -7_998);
        // One peer 8 s fast instead: the median ignores it.
        let c = ClusterClock::new(step_clock(100_000));
        c.update(&[sample(2, 108_000, 0), sample(3, 100_001, 0)], 3);
        assert_eq!(c.now_ms(), 100_001);
    }

    #[test]
    fn a_wall_clock_step_does_not_move_cluster_time_until_remeasured() {
        let local = step_clock(100_000);
        let c = ClusterClock::new(local.clone());
        c.update(&[sample(2, 100_000, 0), sample(3, 100_000, 0)], 3);
        assert_eq!(c.now_ms(), 100_000);
        // The leader's wall clock jumps 10 s ahead while 1 s really passes.
        set(&local, 111_000, 1_000);
        assert_eq!(
            c.now_ms(),
            101_000,
            "the jump is invisible between probe rounds"
        );
        // The next round: the peers were measured mid-round, 200 ms ago.
        set(&local, 111_200, 1_200);
        c.update(&[sample(2, 101_000, 1_000), sample(3, 101_000, 1_000)], 3);
        assert_eq!(c.now_ms(), 101_200, "corrected, not early");
        // A jump back is held by the monotonic floor and corrected the same way.
        set(&local, 91_500, 1_500);
        c.update(&[sample(2, 101_500, 1_500), sample(3, 101_500, 1_500)], 3);
        assert_eq!(c.now_ms(), 101_500);
    }

    #[test]
    fn an_uncalibrated_reading_skewed_ahead_is_not_a_floor() {
        let local = step_clock(130_000);
        let c = ClusterClock::new(local.clone());
        assert_eq!(c.now_ms(), 130_000, "before any probe: the wall clock");
        set(&local, 100_100, 100);
        c.update(&[sample(2, 100_100, 100), sample(3, 100_100, 100)], 3);
        assert_eq!(c.now_ms(), 100_100);
    }

    #[test]
    fn needs_a_quorum_of_samples() {
        let c = ClusterClock::new(step_clock(5_000));
        c.update(&[], 3);
        assert!(!c.is_calibrated());
        c.update(&[sample(2, 5_000, 0)], 3);
        assert!(c.is_calibrated());
        let single = ClusterClock::new(step_clock(7));
        single.update(&[], 1);
        assert!(single.is_calibrated());
        assert_eq!(single.now_ms(), 7);
    }

    #[test]
    fn writes_get_no_time_before_a_quorum_was_measured() {
        // A new leader 60 s fast: before the first probe round it has only its own clock.
        let local = step_clock(160_000);
        let c = ClusterClock::new(local.clone());
        assert_eq!(c.calibrated_now_ms(), None);
        c.update(&[sample(2, 100_000, 0)], 3);
        assert_eq!(c.calibrated_now_ms(), Some(100_000));
        // Leadership lost: the next term measures again before it stamps.
        c.reset();
        assert_eq!(c.calibrated_now_ms(), None);
        let single = ClusterClock::new(step_clock(7));
        single.update(&[], 1);
        assert_eq!(single.calibrated_now_ms(), Some(7), "a quorum of one");
    }

    // Driven by the injected monotonic clock; real waits are a few polls.
    #[tokio::test]
    async fn a_write_waits_briefly_for_calibration_then_gives_up() {
        let local = step_clock(160_000);
        let c = Arc::new(ClusterClock::new(local.clone()));
        let waiter = tokio::spawn({
            let c = c.clone();
            async move { c.wait_calibrated_ms(CALIBRATION_WAIT_MS).await }
        });
        tokio::time::sleep(CALIBRATION_POLL).await;
        c.update(&[sample(2, 100_000, 0)], 3);
        assert_eq!(waiter.await.unwrap(), Some(100_000));
        // Never calibrated: the wait ends once the monotonic clock passed it.
        let c = Arc::new(ClusterClock::new(local.clone()));
        let waiter = tokio::spawn({
            let c = c.clone();
            async move { c.wait_calibrated_ms(CALIBRATION_WAIT_MS).await }
        });
        tokio::time::sleep(CALIBRATION_POLL * 3).await;
        assert!(!waiter.is_finished(), "gave up before the wait passed");
        set(&local, 162_000, CALIBRATION_WAIT_MS);
        tokio::time::sleep(CALIBRATION_POLL * 2).await;
        assert_eq!(waiter.await.unwrap(), None);
    }
}
