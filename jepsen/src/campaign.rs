//! Bounded runs and campaigns. `run_one` drives one `run::run` on a
//! runtime of its own (so nothing of it outlives it), bounded by a timeout
//! and, behind that, a watchdog thread; whatever happens it tears the
//! cluster down and leaves a `results.json` saying what happened. A
//! campaign runs seeds one after another, each on a fresh cluster in
//! `DIR/seed-<n>/`, and keeps one table — per seed the faults the nemesis
//! actually applied (by kind), operations, verdict and worst lateness — as
//! `DIR/campaign.md` and `DIR/campaign.json`, rewritten after every seed.

use crate::check::{self, Summary, HISTORY_FILE};
use crate::clean;
use crate::event::Phase;
use crate::history::{self, History};
use crate::run::{self, RunConfig, EXIT_HARNESS_ERROR, EXIT_UNSUPPORTED, OVERHEAD_S};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Seeds in one campaign, at most.
pub const MAX_SEEDS: usize = 10_000;
/// The watchdog thread ends the process this long after a run's own
/// timeout should have ended it (a wedged runtime).
const BACKSTOP: Duration = Duration::from_secs(60);
/// Error messages in the Markdown table are cut to this many characters.
const MAX_ERROR_CHARS: usize = 160;
pub const EXIT_WATCHDOG: i32 = 3;
pub const EXIT_INTERRUPTED: i32 = 130;

/// How one run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Valid,
    Invalid,
    /// A harness error: not a verdict, and not "valid".
    Error,
    /// The host cannot inject a requested fault family.
    Unsupported,
    /// The run overran its bound and was torn down.
    Watchdog,
    Interrupted,
}

impl Verdict {
    pub fn exit_code(self) -> i32 {
        match self {
            Verdict::Valid => 0,
            Verdict::Invalid => 1,
            Verdict::Error => EXIT_HARNESS_ERROR,
            Verdict::Watchdog => EXIT_WATCHDOG,
            Verdict::Unsupported => EXIT_UNSUPPORTED,
            Verdict::Interrupted => EXIT_INTERRUPTED,
        }
    }
}

/// One run's outcome.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub verdict: Verdict,
    pub summary: Option<Summary>,
    pub error: Option<String>,
    pub wall_s: u64,
}

/// A watchdog thread: re-armed per run, it tears down and exits with
/// `EXIT_WATCHDOG` if a deadline passes (0 = disarmed).
#[derive(Clone)]
pub struct Watchdog {
    deadline_ms: Arc<AtomicI64>,
}

impl Watchdog {
    pub fn start() -> Watchdog {
        let deadline_ms = Arc::new(AtomicI64::new(0));
        let d = deadline_ms.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(500));
            let at = d.load(Ordering::Relaxed);
            if at != 0 && now_ms() > at {
                eprintln!("kairos-jepsen: watchdog: run overran its bound, tearing down");
                clean::cleanup_registered();
                std::process::exit(EXIT_WATCHDOG);
            }
        });
        Watchdog { deadline_ms }
    }

    fn arm(&self, after: Duration) {
        let at = now_ms() + after.as_millis() as i64;
        self.deadline_ms.store(at, Ordering::Relaxed);
    }

    fn disarm(&self) {
        self.deadline_ms.store(0, Ordering::Relaxed);
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A run's bound: its time limit, settling, and every later phase's limit.
pub fn hard_limit(cfg: &RunConfig) -> Duration {
    Duration::from_secs(cfg.time_limit_s + cfg.quiet_s + OVERHEAD_S)
}

/// Runs `cfg` to a verdict, an error, the bound or Ctrl-C, then tears down.
/// A run without a verdict gets a `results.json` with its error and code.
pub fn run_one(cfg: RunConfig, dog: &Watchdog) -> Outcome {
    let started = Instant::now();
    let limit = hard_limit(&cfg);
    let out = cfg.out.clone();
    dog.arm(limit + BACKSTOP);
    let ended = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => {
            let r = rt.block_on(async move {
                tokio::select! {
                    r = run::run(cfg) => Some(r),
                    _ = interrupted() => None,
                    _ = tokio::time::sleep(limit) => Some(Err(anyhow::anyhow!(Overran(limit)))),
                }
            });
            clean::cleanup_registered();
            rt.shutdown_timeout(Duration::from_secs(5));
            r
        }
        Err(e) => Some(Err(e.into())),
    };
    clean::cleanup_registered();
    dog.disarm();
    let wall_s = started.elapsed().as_secs();
    let (verdict, summary, error) = match ended {
        None => {
            let e = anyhow::anyhow!("interrupted");
            run::record_error(&out, &e, EXIT_INTERRUPTED);
            (Verdict::Interrupted, None, Some("interrupted".into()))
        }
        Some(Ok(s)) => {
            let v = if s.valid {
                Verdict::Valid
            } else {
                Verdict::Invalid
            };
            (v, Some(s), None)
        }
        Some(Err(e)) => {
            let verdict = if e.downcast_ref::<Overran>().is_some() {
                Verdict::Watchdog
            } else if run::error_code(&e) == EXIT_UNSUPPORTED {
                Verdict::Unsupported
            } else {
                Verdict::Error
            };
            run::record_error(&out, &e, verdict.exit_code());
            (verdict, None, Some(format!("{e:#}")))
        }
    };
    Outcome {
        verdict,
        summary,
        error,
        wall_s,
    }
}

#[derive(Debug)]
struct Overran(Duration);

impl std::fmt::Display for Overran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "watchdog: run exceeded {:?}, torn down", self.0)
    }
}

impl std::error::Error for Overran {}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn interrupted() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async {
            match term.as_mut() {
                Some(t) => { t.recv().await; }
                None => std::future::pending().await,
            }
        } => {}
    }
}

/// `A..B` (both included; `A..=B` too), a comma list, or one seed.
pub fn parse_seeds(s: &str) -> Result<Vec<u64>> {
    let num = |x: &str| {
        x.trim()
            .parse::<u64>()
            .with_context(|| format!("--seeds: {x:?} is not a seed"))
    };
    let seeds: Vec<u64> = if let Some((a, b)) = s.split_once("..") {
        let (a, b) = (num(a)?, num(b.trim_start_matches('='))?);
        if b < a {
            bail!("--seeds {s}: the range is empty");
        }
        if b - a >= MAX_SEEDS as u64 {
            bail!("--seeds {s}: at most {MAX_SEEDS} seeds");
        }
        (a..=b).collect()
    } else {
        s.split(',').map(num).collect::<Result<_>>()?
    };
    let distinct: BTreeSet<u64> = seeds.iter().copied().collect();
    if seeds.is_empty() || seeds.len() > MAX_SEEDS || distinct.len() != seeds.len() {
        bail!("--seeds {s}: give 1..={MAX_SEEDS} distinct seeds");
    }
    Ok(seeds)
}

/// One line of the campaign table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub seed: u64,
    pub dir: PathBuf,
    pub verdict: Verdict,
    /// Failing checkers of an invalid run.
    pub failed: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `netns` or `loopback` (empty without a history).
    pub mode: String,
    /// Faults applied (nemesis `start` events, membership steps included), by kind.
    pub faults: BTreeMap<String, u64>,
    /// Planned faults the nemesis could not apply (`info` "not applied").
    pub faults_not_applied: u64,
    pub operations: u64,
    pub receipts: u64,
    /// Worst `fired_at − scheduled_at` on the most-applied replica, and
    /// worst `received_at − scheduled_at`, over scheduled harness jobs.
    pub max_fire_lateness_ms: Option<i64>,
    pub max_receipt_lateness_ms: Option<i64>,
    pub wall_s: u64,
}

/// The table line for a finished run, from its history if it left one.
pub fn row(seed: u64, dir: &Path, o: &Outcome) -> Row {
    let mut r = Row {
        seed,
        dir: dir.to_path_buf(),
        verdict: o.verdict,
        failed: o
            .summary
            .as_ref()
            .map(|s| s.failed().into_iter().map(String::from).collect())
            .unwrap_or_default(),
        error: o.error.clone(),
        mode: String::new(),
        faults: BTreeMap::new(),
        faults_not_applied: 0,
        operations: 0,
        receipts: 0,
        max_fire_lateness_ms: None,
        max_receipt_lateness_ms: None,
        wall_s: o.wall_s,
    };
    if let Ok(h) = history::read_history(&dir.join(HISTORY_FILE)) {
        fill_from_history(&mut r, &h);
    }
    r
}

/// Counts and worst lateness from a history.
pub fn fill_from_history(r: &mut Row, h: &History) {
    r.mode = h.meta.mode.clone();
    for e in &h.nemesis {
        match e.phase {
            Phase::Start => *r.faults.entry(e.kind.clone()).or_insert(0) += 1,
            Phase::Info if e.detail.starts_with("not applied") => r.faults_not_applied += 1,
            _ => {}
        }
    }
    r.operations = h.ops.len() as u64;
    r.receipts = h.receipts.len() as u64;
    let Some(reference) = h.reference_final() else {
        return;
    };
    // Upstream-only workflow runs have no schedule: their lateness means nothing.
    let downstream: BTreeSet<&str> = reference
        .jobs
        .iter()
        .filter(|j| !j.upstream.is_empty())
        .map(|j| j.id.as_str())
        .collect();
    r.max_fire_lateness_ms = reference
        .runs
        .iter()
        .filter(|x| !downstream.contains(x.job.as_str()))
        .map(|x| x.fired_at_ms - x.scheduled_at_ms)
        .max();
    r.max_receipt_lateness_ms = h
        .receipts
        .iter()
        .filter(|x| !downstream.contains(x.job.as_str()))
        .map(|x| x.received_at_ms - x.scheduled_at_ms)
        .max();
}

fn verdict_text(r: &Row) -> String {
    let cut = |e: &str| {
        let one_line = e.replace('\n', " ");
        let mut s: String = one_line.chars().take(MAX_ERROR_CHARS).collect();
        if one_line.chars().count() > MAX_ERROR_CHARS {
            s.push('…');
        }
        s
    };
    let err = r.error.as_deref().map(cut).unwrap_or_default();
    match r.verdict {
        Verdict::Valid => "valid".into(),
        Verdict::Invalid => format!("**INVALID** ({})", r.failed.join(", ")),
        Verdict::Error => format!("**ERROR**: {err}"),
        Verdict::Unsupported => format!("**UNSUPPORTED**: {err}"),
        Verdict::Watchdog => "**WATCHDOG** (overran)".into(),
        Verdict::Interrupted => "interrupted".into(),
    }
}

/// The campaign table in Markdown (pipes in cells escaped).
pub fn markdown(title: &str, rows: &[Row]) -> String {
    let mut s = format!("# {title}\n\n");
    s.push_str("| seed | mode | faults applied | ops | verdict | max lateness ms (fire / receipt) | wall s |\n");
    s.push_str("| --- | --- | --- | --- | --- | --- | --- |\n");
    let ms = |v: Option<i64>| v.map_or("–".to_string(), |x| x.to_string());
    for r in rows {
        let mut faults: Vec<String> = r.faults.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
        if r.faults_not_applied > 0 {
            faults.push(format!("({} not applied)", r.faults_not_applied));
        }
        let faults = if faults.is_empty() {
            "none".into()
        } else {
            faults.join(", ")
        };
        let cells = [
            r.seed.to_string(),
            if r.mode.is_empty() {
                "–".into()
            } else {
                r.mode.clone()
            },
            faults,
            r.operations.to_string(),
            verdict_text(r),
            format!(
                "{} / {}",
                ms(r.max_fire_lateness_ms),
                ms(r.max_receipt_lateness_ms)
            ),
            r.wall_s.to_string(),
        ];
        let cells: Vec<String> = cells.iter().map(|c| c.replace('|', "\\|")).collect();
        s.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    let valid = rows.iter().filter(|r| r.verdict == Verdict::Valid).count();
    s.push_str(&format!(
        "\n{valid} of {} runs valid; exit status {}.\n",
        rows.len(),
        exit_code(rows)
    ));
    s
}

/// 0 if every run is valid; else 4 if the host could not inject what was
/// asked, 2 if any run erred or overran, 1 if some run is invalid; 130
/// if interrupted.
pub fn exit_code(rows: &[Row]) -> i32 {
    let any = |v: Verdict| rows.iter().any(|r| r.verdict == v);
    if any(Verdict::Interrupted) {
        EXIT_INTERRUPTED
    } else if any(Verdict::Unsupported) {
        EXIT_UNSUPPORTED
    } else if any(Verdict::Error) || any(Verdict::Watchdog) {
        EXIT_HARNESS_ERROR
    } else if any(Verdict::Invalid) || rows.is_empty() {
        1
    } else {
        0
    }
}

/// What the campaign table's header and JSON state about the runs.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub seeds: Vec<u64>,
    pub nodes: usize,
    pub time_limit_s: u64,
    pub nemeses: Vec<String>,
    pub workloads: Vec<String>,
    pub fault_every_ms: u64,
    pub loopback: bool,
}

fn write_tables(dir: &Path, plan: &Plan, rows: &[Row]) -> Result<String> {
    let title = format!(
        "kairos-jepsen campaign: {} nodes, {} s, nemesis {}, workload {}, a fault every {:.1} s",
        plan.nodes,
        plan.time_limit_s,
        plan.nemeses.join(","),
        plan.workloads.join(","),
        plan.fault_every_ms as f64 / 1000.0
    );
    let md = markdown(&title, rows);
    std::fs::write(dir.join("campaign.md"), &md).context("write campaign.md")?;
    let json = serde_json::json!({
        "plan": plan,
        "valid": exit_code(rows) == 0,
        "exit_code": exit_code(rows),
        "runs": rows,
    });
    std::fs::write(
        dir.join("campaign.json"),
        serde_json::to_string_pretty(&json)?,
    )
    .context("write campaign.json")?;
    Ok(md)
}

/// Runs `config(seed, dir)` for every seed of the plan in `dir/seed-<n>/`,
/// rewriting the tables after each; stops early on Ctrl-C or when the host
/// cannot inject the nemesis (every seed would fail alike). Prints the
/// Markdown table and returns the exit status.
pub fn run_campaign(
    dir: &Path,
    plan: &Plan,
    config: impl Fn(u64, PathBuf) -> Result<RunConfig>,
) -> Result<i32> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let dog = Watchdog::start();
    let mut rows = Vec::new();
    for (k, &seed) in plan.seeds.iter().enumerate() {
        let out = dir.join(format!("seed-{seed}"));
        println!(
            "campaign: seed {seed} ({} of {}) · out {}",
            k + 1,
            plan.seeds.len(),
            out.display()
        );
        let outcome = match config(seed, out.clone()) {
            Ok(cfg) => run_one(cfg, &dog),
            Err(e) => {
                run::record_error(&out, &e, EXIT_HARNESS_ERROR);
                Outcome {
                    verdict: Verdict::Error,
                    summary: None,
                    error: Some(format!("{e:#}")),
                    wall_s: 0,
                }
            }
        };
        if let Some(s) = &outcome.summary {
            check::print_summary(s);
        }
        let r = row(seed, &out, &outcome);
        println!("campaign: seed {seed}: {}", verdict_text(&r));
        let stop = matches!(r.verdict, Verdict::Interrupted | Verdict::Unsupported);
        rows.push(r);
        write_tables(dir, plan, &rows)?;
        if stop {
            break;
        }
    }
    let md = write_tables(dir, plan, &rows)?;
    println!("\n{md}");
    println!(
        "campaign tables: {}/{{campaign.md,campaign.json}}",
        dir.display()
    );
    Ok(exit_code(&rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, NemesisEvent};
    use crate::testkit::*;

    #[test]
    fn seeds_parse_as_inclusive_ranges_and_lists() {
        assert_eq!(parse_seeds("1..3").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_seeds("4..=5").unwrap(), vec![4, 5]);
        assert_eq!(parse_seeds("7").unwrap(), vec![7]);
        assert_eq!(parse_seeds("9, 2,5").unwrap(), vec![9, 2, 5]);
        for bad in ["3..1", "a..b", "", "1,1", "0..20000"] {
            assert!(parse_seeds(bad).is_err(), "{bad}");
        }
    }

    fn row_of(ev: Vec<Event>, verdict: Verdict) -> Row {
        let h = History::from_events(ev).unwrap();
        let mut r = row(
            1,
            Path::new("/nonexistent"),
            &Outcome {
                verdict,
                summary: None,
                error: None,
                wall_s: 3,
            },
        );
        fill_from_history(&mut r, &h);
        r
    }

    #[test]
    fn row_counts_applied_faults_by_kind_and_worst_lateness() {
        let mut ev = healthy_history();
        ev.push(Event::Nemesis(NemesisEvent {
            id: 5,
            time_ms: BASE_MS + 9_000,
            phase: Phase::Info,
            fault: "partition".into(),
            kind: "isolate-leader".into(),
            nodes: vec![],
            detail: "not applied: needs network namespaces".into(),
        }));
        let r = row_of(ev, Verdict::Valid);
        assert_eq!(r.faults, BTreeMap::from([("kill".to_string(), 1)]));
        assert_eq!(r.faults_not_applied, 1);
        // 7 ops in healthy_ops plus the probe and the quiesce pause.
        assert_eq!(r.operations, 9);
        assert_eq!(r.max_fire_lateness_ms, Some(20));
        assert_eq!(r.max_receipt_lateness_ms, Some(40));
        let md = markdown("t", &[r]);
        assert!(
            md.contains("| 1 | netns | kill ×1, (1 not applied) | 9 | valid | 20 / 40 | 3 |"),
            "{md}"
        );
    }

    #[test]
    fn errors_are_not_valid_and_set_the_exit_status() {
        let mk = |v| row_of(healthy_history(), v);
        assert_eq!(exit_code(&[mk(Verdict::Valid), mk(Verdict::Valid)]), 0);
        assert_eq!(exit_code(&[mk(Verdict::Valid), mk(Verdict::Invalid)]), 1);
        assert_eq!(exit_code(&[mk(Verdict::Invalid), mk(Verdict::Error)]), 2);
        assert_eq!(exit_code(&[mk(Verdict::Watchdog)]), 2);
        assert_eq!(exit_code(&[mk(Verdict::Unsupported)]), 4);
        assert_eq!(exit_code(&[]), 1);
        let mut e = mk(Verdict::Error);
        e.error = Some("no leader | within 60s".into());
        let md = markdown("t", &[e]);
        assert!(md.contains("**ERROR**: no leader \\| within 60s"), "{md}");
        assert!(md.contains("0 of 1 runs valid; exit status 2."), "{md}");
    }
}
