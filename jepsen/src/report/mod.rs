//! Reports written into the run directory: `results.json` (overall verdict and
//! each checker's counts and first counterexamples), `lateness.svg` (fire and
//! receipt lateness over time, fault periods shaded) and `timeline.html`
//! (operations, receipts, faults and leader claims on one time axis).
//! Hand-written SVG/HTML. A run that ended without a verdict gets a
//! `results.json` saying why (`write_error`).

mod html;
mod svg;

use crate::check::Summary;
use crate::history::History;
use anyhow::{Context, Result};
use serde_json::json;
use std::path::Path;

pub use svg::{fault_color, lateness_svg};

pub fn write_all(dir: &Path, h: &History, s: &Summary) -> Result<()> {
    let checkers: serde_json::Map<String, serde_json::Value> = s
        .results
        .iter()
        .map(|r| (r.name.clone(), serde_json::to_value(r).unwrap_or_default()))
        .collect();
    let results = json!({
        "valid": s.valid,
        "run_id": h.meta.run_id,
        "seed": h.meta.seed,
        "mode": h.meta.mode,
        "nemeses": h.meta.nemeses,
        "dropped_nemeses": h.meta.dropped_nemeses,
        "failpoint": h.meta.failpoint,
        "power_all": h.meta.power_all,
        "failed": s.failed(),
        "checkers": checkers,
    });
    write(
        dir,
        "results.json",
        &serde_json::to_string_pretty(&results)?,
    )?;
    write(dir, "lateness.svg", &lateness_svg(h))?;
    write(dir, "timeline.html", &html::timeline_html(h, s))?;
    Ok(())
}

/// `results.json` for a run that ended without a verdict: a harness error
/// (exit `code`), with the fault families it could not inject if that was
/// why. Never valid.
pub fn write_error(
    dir: &Path,
    error: &str,
    code: i32,
    unsupported: &[crate::event::DroppedNemesis],
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let results = json!({
        "valid": false,
        "error": error,
        "exit_code": code,
        "unsupported_nemeses": unsupported,
        "failed": [],
        "checkers": {},
    });
    write(
        dir,
        "results.json",
        &serde_json::to_string_pretty(&results)?,
    )
}

fn write(dir: &Path, name: &str, text: &str) -> Result<()> {
    let p = dir.join(name);
    std::fs::write(&p, text).with_context(|| format!("write {}", p.display()))
}

/// Escapes text for SVG/HTML element content and attributes.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
