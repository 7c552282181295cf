//! The harness's own clock: unix milliseconds that never go backwards (a
//! monotonic offset from one wall-clock reading at start). Nodes may have
//! their clocks skewed by libfaketime; the harness never does, so receipt
//! times and operation times are comparable with true scheduled times.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, Copy)]
pub struct Clock {
    base_unix_ms: i64,
    base: Instant,
}

impl Clock {
    pub fn new() -> Clock {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        Clock {
            base_unix_ms: unix,
            base: Instant::now(),
        }
    }

    pub fn now_ms(&self) -> i64 {
        self.base_unix_ms + self.base.elapsed().as_millis() as i64
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}
