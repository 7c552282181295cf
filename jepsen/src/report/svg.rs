//! `lateness.svg`: for each fire record of the most-applied replica, fire
//! lateness (`fired_at_ms - scheduled_at_ms`, cluster time) and for each
//! receipt, receive lateness (harness clock), plotted against the scheduled
//! time, with every fault period shaded in its family's colour.

use super::esc;
use crate::history::{History, FOREVER_MS};
use std::fmt::Write;

const W: f64 = 1000.0;
const H: f64 = 434.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 44.0;
const BOTTOM: f64 = 50.0;
/// Points per series, at most (longer series are strided).
const MAX_POINTS: usize = 20_000;
/// The y axis never extends past this lateness.
const Y_CAP_MS: i64 = 60_000;

pub fn fault_color(fault: &str) -> &'static str {
    match fault {
        "partition" => "#f4a582",
        "kill" => "#d6604d",
        "pause" => "#92c5de",
        "clock" => "#b2abd2",
        "loss" => "#fddbc7",
        "bandwidth" => "#e0e0e0",
        "snapshot" => "#a6dba0",
        "membership" => "#fee08b",
        "power" => "#b2182b",
        "disk-full" => "#bf812d",
        "disk-error" => "#8c510a",
        "slow-disk" => "#dfc27d",
        _ => "#dddddd",
    }
}

/// The plot's time origin and span in ms.
pub fn time_span(h: &History) -> (i64, i64) {
    let start = if h.meta.start_ms > 0 {
        h.meta.start_ms
    } else {
        h.ops.iter().map(|o| o.invoke.time_ms).min().unwrap_or(0)
    };
    let end = h
        .finals
        .iter()
        .map(|f| f.time_ms)
        .chain(h.receipts.iter().map(|r| r.received_at_ms))
        .chain(h.ops.iter().map(|o| o.invoke.time_ms))
        .max()
        .unwrap_or(start + 1_000);
    (start, (end - start).max(1_000))
}

pub fn lateness_svg(h: &History) -> String {
    let (start, span) = time_span(h);
    let fires: Vec<(i64, i64)> = h
        .reference_final()
        .map(|f| {
            f.runs
                .iter()
                .map(|r| (r.scheduled_at_ms, r.fired_at_ms - r.scheduled_at_ms))
                .collect()
        })
        .unwrap_or_default();
    let receipts: Vec<(i64, i64)> = h
        .receipts
        .iter()
        .map(|r| (r.scheduled_at_ms, r.received_at_ms - r.scheduled_at_ms))
        .collect();
    let y_max = fires
        .iter()
        .chain(&receipts)
        .map(|p| p.1)
        .max()
        .unwrap_or(0)
        .clamp(1_000, Y_CAP_MS);
    let y_min = fires
        .iter()
        .chain(&receipts)
        .map(|p| p.1)
        .min()
        .unwrap_or(0)
        .clamp(-5_000, -100);
    let x = |t: i64| LEFT + (t - start) as f64 / span as f64 * (W - LEFT - RIGHT);
    let y = |l: i64| {
        TOP + (y_max - l.clamp(y_min, y_max)) as f64 / (y_max - y_min) as f64 * (H - TOP - BOTTOM)
    };
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        s,
        r#"<text x="{LEFT}" y="18" font-size="13">Fire lateness (ms) vs scheduled time (s) — run {}</text>"#,
        esc(&h.meta.run_id)
    );
    for p in &h.faults {
        let (x0, x1) = (x(p.start_ms), x(p.end_ms.min(start + span)));
        let _ = write!(
            s,
            r#"<rect x="{x0:.1}" y="{TOP}" width="{:.1}" height="{}" fill="{}" opacity="0.6"><title>{} {} nodes {:?}</title></rect>"#,
            (x1 - x0).max(1.0),
            H - TOP - BOTTOM,
            fault_color(&p.fault),
            esc(&p.fault),
            esc(&p.kind),
            p.nodes,
        );
        if p.end_ms == FOREVER_MS {
            let _ = write!(
                s,
                r#"<text x="{x0:.1}" y="{}" fill="red">unhealed</text>"#,
                TOP + 12.0
            );
        }
    }
    axes(&mut s, span, y_min, y_max, &x, &y, start);
    series(&mut s, &fires, "#2166ac", &x, &y);
    series(&mut s, &receipts, "#1b7837", &x, &y);
    legend(&mut s, h);
    s.push_str("</svg>\n");
    s
}

fn axes(
    s: &mut String,
    span: i64,
    y_min: i64,
    y_max: i64,
    x: &dyn Fn(i64) -> f64,
    y: &dyn Fn(i64) -> f64,
    start: i64,
) {
    let (x0, x1, y0, y1) = (LEFT, W - RIGHT, TOP, H - BOTTOM);
    let _ = write!(
        s,
        r##"<line x1="{x0}" y1="{y1}" x2="{x1}" y2="{y1}" stroke="#333"/><line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="#333"/>"##
    );
    let step_s = [1, 2, 5, 10, 20, 30, 60, 120, 300]
        .into_iter()
        .find(|st| span / 1000 / st <= 12)
        .unwrap_or(600);
    for k in 0..=(span / 1000 / step_s) {
        let px = x(start + k * step_s * 1000);
        let _ = write!(
            s,
            r##"<line x1="{px:.1}" y1="{y1}" x2="{px:.1}" y2="{}" stroke="#333"/><text x="{px:.1}" y="{}" text-anchor="middle">{}</text>"##,
            y1 + 4.0,
            y1 + 16.0,
            k * step_s
        );
    }
    for v in ticks(y_min, y_max) {
        let py = y(v);
        let _ = write!(
            s,
            r##"<line x1="{}" y1="{py:.1}" x2="{x1}" y2="{py:.1}" stroke="#ccc" stroke-dasharray="2,3"/><text x="{}" y="{:.1}" text-anchor="end">{v}</text>"##,
            x0 - 4.0,
            x0 - 6.0,
            py + 4.0
        );
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">seconds since start (scheduled time)</text>"#,
        (x0 + x1) / 2.0,
        H - 12.0
    );
}

/// About six round tick values covering [lo, hi], always including 0.
fn ticks(lo: i64, hi: i64) -> Vec<i64> {
    let raw = (hi - lo) / 6;
    let step = [100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000]
        .into_iter()
        .find(|s| *s >= raw)
        .unwrap_or(20_000);
    let mut v: Vec<i64> = (lo / step..=hi / step).map(|k| k * step).collect();
    if !v.contains(&0) {
        v.push(0);
    }
    v
}

fn series(
    s: &mut String,
    pts: &[(i64, i64)],
    color: &str,
    x: &dyn Fn(i64) -> f64,
    y: &dyn Fn(i64) -> f64,
) {
    let stride = pts.len().div_ceil(MAX_POINTS).max(1);
    for (t, l) in pts.iter().step_by(stride) {
        let shape = if *l > Y_CAP_MS {
            "2.5\" stroke=\"red"
        } else {
            "1.6"
        };
        let _ = write!(
            s,
            r#"<circle cx="{:.1}" cy="{:.1}" r="{shape}" fill="{color}" fill-opacity="0.7"/>"#,
            x(*t),
            y(*l)
        );
    }
}

fn legend(s: &mut String, h: &History) {
    let mut fams: Vec<&str> = h.faults.iter().map(|p| p.fault.as_str()).collect();
    fams.sort();
    fams.dedup();
    let mut lx = LEFT;
    let items = [
        ("fire (record)", "#2166ac"),
        ("receipt (worker)", "#1b7837"),
    ];
    for (name, c) in items {
        let _ = write!(
            s,
            r#"<circle cx="{lx}" cy="30" r="4" fill="{c}"/><text x="{}" y="34">{name}</text>"#,
            lx + 8.0
        );
        lx += 115.0;
    }
    for f in fams {
        let _ = write!(
            s,
            r#"<rect x="{lx}" y="25" width="10" height="10" fill="{}"/><text x="{}" y="34">{}</text>"#,
            fault_color(f),
            lx + 13.0,
            esc(f)
        );
        lx += 22.0 + 7.0 * f.len() as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::healthy_history;

    #[test]
    fn plot_has_points_and_fault_shading() {
        let h = History::from_events(healthy_history()).unwrap();
        let svg = lateness_svg(&h);
        assert!(svg.starts_with("<svg"));
        assert!(svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<circle").count(), 14 + 14 + 2);
        assert!(svg.contains(fault_color("kill")));
    }

    #[test]
    fn ticks_include_zero() {
        assert!(ticks(-100, 1_000).contains(&0));
        assert!(ticks(-5_000, 60_000).len() <= 16);
    }
}
