//! `seed-10k`: `--count` (default 10,000) cron jobs, 90% firing at second 0
//! of every minute (`0 * * * * *`) and 10% every 30 s at seconds spread over
//! the half-minute (`s,s+30 * * * * *`, s in 1..=29), run for `--duration`
//! (default 3 min). Reports lateness p50/p99/max over every fire scheduled
//! in the window, the burst of each minute boundary (boundary until the last
//! of its fires reached a worker), and CPU and RSS per node. `--period-s`
//! shrinks the minute to a shorter period (smoke: 10 s) and says so.

use std::time::{Duration, Instant};

use kairos_client::pb::{schedule::Kind, Cron};
use serde_json::json;

use super::{report_costs, report_lateness, report_nodes, Target};
use crate::load::{self, create_jobs, spec, wall_ms, Workers};
use crate::stats::{summarize, Report};
use crate::Opts;

const GROUP: &str = "seed";
const BOUNDARY_SHARE: u64 = 90;
const CREATE_LIMIT: Duration = Duration::from_secs(300);
/// Time after the window for its last fires to arrive.
const DRAIN: Duration = Duration::from_secs(3);
const COUNT_MAX: u64 = 1_000_000;

fn cron(expr: String) -> Kind {
    Kind::Cron(Cron {
        expr,
        ..Default::default()
    })
}

/// Boundary group: second 0 of every `period` seconds.
fn boundary_expr(period: u64) -> String {
    if period == 60 {
        "0 * * * * *".into()
    } else {
        format!("*/{period} * * * * *")
    }
}

/// Half group: every `period/2` seconds at offset `1 + i % (half - 1)`.
fn half_expr(i: u64, period: u64) -> String {
    let half = period / 2;
    let s = 1 + i % (half - 1);
    let secs: Vec<String> = (0..60 / half).map(|k| (s + k * half).to_string()).collect();
    format!("{} * * * * *", secs.join(","))
}

pub async fn run(o: &Opts) -> anyhow::Result<Report> {
    let dur = o.duration.unwrap_or(Duration::from_secs(180));
    let count = o.count.unwrap_or(10_000).clamp(2, COUNT_MAX);
    let period = o.period_s;
    anyhow::ensure!(
        period >= 4 && 60 % period == 0 && period & 1 == 0,
        "--period-s: an even divisor of 60, at least 4"
    );
    let n_b = count * BOUNDARY_SHARE / 100;
    let t = Target::new(o).await?;
    let workers = Workers::start(&t.endpoints, GROUP, o.workers, o.capacity);
    let clients = load::clients(&t.endpoints, o.clients).await?;
    eprintln!(
        "seed-10k: creating {n_b} boundary jobs and {} half-period jobs",
        count - n_b
    );
    let specs = (0..count).map(|i| {
        let mut s = match i < n_b {
            true => spec(format!("seed-b-{i}"), GROUP, cron(boundary_expr(period))),
            false => spec(format!("seed-h-{i}"), GROUP, cron(half_expr(i, period))),
        };
        s.keep_runs = o.keep_runs.unwrap_or_default();
        s
    });
    let cs = create_jobs(
        &clients,
        specs,
        o.in_flight(),
        Instant::now() + CREATE_LIMIT,
    )
    .await;
    eprintln!(
        "seed-10k: {} created in {:?}; measuring for {dur:?}",
        cs.ok, cs.elapsed
    );
    let costs0 = t.costs().await;
    let (before, w0) = (t.samples(), wall_ms());
    tokio::time::sleep(dur).await;
    let (after, w1) = (t.samples(), wall_ms());
    let costs1 = t.costs().await;
    tokio::time::sleep(DRAIN).await;
    let recs = workers.rec.snapshot();
    let win: Vec<_> = (recs.iter())
        .filter(|x| x.scheduled_at_ms >= w0 && x.scheduled_at_ms < w1)
        .collect();
    let mut r = Report::new("seed-10k");
    r.set("jobs", count);
    r.set("boundary_jobs", n_b);
    r.set("period_s", period);
    r.set("keep_runs", o.keep_runs.unwrap_or(0));
    r.set("duration_s", dur.as_secs_f64());
    r.set("jobs_created_per_s", cs.per_s());
    r.set("create_failures", cs.failed);
    r.set("fires_in_window", win.len() as u64);
    report_lateness(&mut r, &win);
    report_bursts(&mut r, &win, n_b, period, (w0, w1));
    report_nodes(&mut r, &before, &after);
    report_costs(&mut r, &costs0, &costs1, win.len());
    if period != 60 {
        r.note(format!(
            "boundary period shortened to {period} s (not a minute)"
        ));
    }
    if let Some(e) = cs.first_error {
        r.note(format!("job create error: {e}"));
    }
    workers.stop().await;
    Ok(r)
}

/// Burst per boundary: from the boundary until the last of its `n_b` fires reached a worker.
fn report_bursts(r: &mut Report, win: &[&load::Rec], n_b: u64, period: u64, w: (i64, i64)) {
    let p_ms = period as i64 * 1000;
    let first = (w.0 + p_ms - 1) / p_ms * p_ms;
    let (mut bursts, mut per) = (Vec::new(), Vec::new());
    for b in (first..w.1).step_by(p_ms as usize) {
        let fires: Vec<i64> = (win.iter())
            .filter(|x| x.scheduled_at_ms == b && x.job.starts_with("seed-b-") && x.attempt <= 1)
            .map(|x| x.received_at_ms)
            .collect();
        let last = fires.iter().max().map(|m| m - b);
        let complete = fires.len() as u64 >= n_b;
        per.push(
            json!({"boundary_ms": b, "fires": fires.len(), "complete": complete, "burst_ms": last}),
        );
        if let (true, Some(l)) = (complete, last) {
            bursts.push(l);
        }
    }
    r.set("boundaries", per.len() as u64);
    r.set("boundaries_complete", bursts.len() as u64);
    let s = summarize(&mut bursts);
    r.set("burst_ms_p50", json!(s.map(|s| s.p50)));
    r.set("burst_ms_max", json!(s.map(|s| s.max)));
    r.set("per_boundary", json!(per));
    if per.is_empty() {
        r.note("no boundary inside the window: use a longer --duration");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cron_expressions() {
        assert_eq!(boundary_expr(60), "0 * * * * *");
        assert_eq!(boundary_expr(10), "*/10 * * * * *");
        assert_eq!(half_expr(0, 60), "1,31 * * * * *");
        assert_eq!(half_expr(28, 60), "29,59 * * * * *");
        assert_eq!(half_expr(29, 60), "1,31 * * * * *");
        assert_eq!(
            half_expr(3, 10),
            "4,9,14,19,24,29,34,39,44,49,54,59 * * * * *"
        );
    }
}
