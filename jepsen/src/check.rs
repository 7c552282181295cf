//! The `check` entry point: read `history.jsonl` from a run directory, run
//! every checker, write `results.json` and the plots, and say whether the
//! history is valid. `run` ends by calling the same function, so a live run
//! and a later re-check judge identically.

use crate::checker::{self, CheckResult};
use crate::history::{self, History};
use crate::report;
use anyhow::Result;
use std::path::Path;

pub const HISTORY_FILE: &str = "history.jsonl";

/// Every checker's verdict on one history.
#[derive(Debug, Clone)]
pub struct Summary {
    pub valid: bool,
    pub results: Vec<CheckResult>,
}

impl Summary {
    pub fn failed(&self) -> Vec<&str> {
        self.results
            .iter()
            .filter(|r| !r.valid)
            .map(|r| r.name.as_str())
            .collect()
    }
}

pub fn check_history(h: &History) -> Summary {
    let results = checker::check_all(h);
    Summary {
        valid: results.iter().all(|r| r.valid),
        results,
    }
}

/// Checks `dir/history.jsonl` and (re)writes the reports next to it.
pub fn check_dir(dir: &Path) -> Result<Summary> {
    let h = history::read_history(&dir.join(HISTORY_FILE))?;
    let summary = check_history(&h);
    report::write_all(dir, &h, &summary)?;
    Ok(summary)
}

/// One line per checker on stdout.
pub fn print_summary(s: &Summary) {
    for r in &s.results {
        let counts: Vec<String> = r.counts.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!(
            "{:<26} {:<5} {}",
            r.name,
            if r.valid { "ok" } else { "FAIL" },
            counts.join(" ")
        );
        for n in &r.notes {
            println!("{:<26}       note: {n}", "");
        }
        for c in r.counterexamples.iter().take(3) {
            println!("{:<26}       e.g. {c}", "");
        }
    }
    println!("valid: {}", s.valid);
}
