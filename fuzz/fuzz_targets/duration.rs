//! Human durations ("1h30m"): parse or refuse, never panic; an accepted one
//! is positive.

#![no_main]

use kairos_server::core::schedule::parse_duration_ms;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(ms) = parse_duration_ms(text) {
            assert!(ms > 0, "{text:?} parsed to 0 ms");
        }
    }
});
