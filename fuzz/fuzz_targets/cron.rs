//! Cron expressions and time zones from clients, checked at validation and
//! searched inside apply, in both dialects (unix and Quartz): every path
//! must return, never panic.
//!
//! Input: `expr \n tz \n after_ms (decimal)`; missing parts default.

#![no_main]

use kairos_server::core::{validate, Schedule, ScheduleInput};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut parts = text.splitn(3, '\n');
    let expr = parts.next().unwrap_or_default().to_string();
    let tz = parts.next().unwrap_or("UTC").to_string();
    let after_ms: i64 = parts
        .next()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1_700_000_000_000);
    // Both dialects read the same text.
    let (e, z) = (expr.clone(), tz.clone());
    let inputs = [
        ScheduleInput::Cron { expr: e, tz: z },
        ScheduleInput::Quartz { expr, tz },
    ];
    for input in inputs {
        let _ = validate::schedule(&input, after_ms);
        let schedule: Schedule = input.resolve(after_ms);
        if schedule.validate().is_ok() {
            if let Ok(list) = schedule.preview(after_ms, 5) {
                let mut prev = after_ms;
                for t in list {
                    assert!(t > prev, "occurrences must increase: {t} after {prev}");
                    prev = t;
                }
            }
        }
    }
});
