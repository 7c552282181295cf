//! The harness's own clock: the host's wall clock in unix milliseconds,
//! held so that it never goes backwards. Nodes read the same wall clock
//! (plus whatever offset libfaketime adds to a skewed node); the harness is
//! never skewed, so receipt and operation times are comparable with the
//! scheduled times the cluster computes.
//!
//! It used to be one wall-clock reading at start advanced by the monotonic
//! clock. On a host whose wall clock is being disciplined the two drift
//! apart: in one CI run the wall clock gained 5 ms a second on the monotonic
//! one, the nodes (rightly) fired by the wall clock, and after two minutes
//! every receipt looked 0.6 s early. A scheduler's truth is the wall clock,
//! so the harness reads it too; only a backward step is held out, which can
//! make a receipt look later, never earlier.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Cheap to clone; clones share the floor, so every reading of one run is
/// ordered.
#[derive(Debug, Clone)]
pub struct Clock {
    source: fn() -> i64,
    last_ms: Arc<AtomicI64>,
}

fn system_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Clock {
    pub fn new() -> Clock {
        Clock::with_source(system_ms)
    }

    fn with_source(source: fn() -> i64) -> Clock {
        Clock {
            source,
            last_ms: Arc::new(AtomicI64::new(i64::MIN)),
        }
    }

    /// The wall clock, or the latest earlier reading if the wall clock has
    /// since stepped back.
    pub fn now_ms(&self) -> i64 {
        let t = (self.source)();
        self.last_ms.fetch_max(t, Ordering::Relaxed).max(t)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static WALL: AtomicI64 = AtomicI64::new(0);

    fn wall() -> i64 {
        WALL.load(Ordering::Relaxed)
    }

    #[test]
    fn follows_the_wall_clock_and_holds_back_steps() {
        WALL.store(1_000, Ordering::Relaxed);
        let c = Clock::with_source(wall);
        let shared = c.clone();
        assert_eq!(c.now_ms(), 1_000);
        // Gaining on real time (a disciplined host): followed, not smoothed.
        WALL.store(1_505, Ordering::Relaxed);
        assert_eq!(shared.now_ms(), 1_505);
        // A step back is held at the floor, for every clone.
        WALL.store(900, Ordering::Relaxed);
        assert_eq!(c.now_ms(), 1_505);
        assert_eq!(shared.now_ms(), 1_505);
        WALL.store(1_600, Ordering::Relaxed);
        assert_eq!(c.now_ms(), 1_600);
    }
}
