//! `timeline.html`: the verdict table and, on one time axis, a row of fault
//! periods, one row per (workload, node) of client operations drawn from
//! invocation to completion coloured by outcome (unknown ones run to the end),
//! a row of worker receipts, and a row of leader claims (term and node, as
//! first seen by each source). Hovering shows each item's details.

use super::{esc, fault_color};
use crate::check::Summary;
use crate::event::Outcome;
use crate::generator::MEMBERSHIP;
use crate::history::History;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// Operations drawn, at most (the rest are counted, not drawn).
const MAX_OPS_DRAWN: usize = 6_000;
const MAX_RECEIPTS_DRAWN: usize = 6_000;
const MAX_CLAIMS_DRAWN: usize = 2_000;
const W: f64 = 1400.0;
const LEFT: f64 = 150.0;
const ROW: f64 = 18.0;

pub fn timeline_html(h: &History, s: &Summary) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>kairos-jepsen {}</title>\
         <style>body{{font-family:sans-serif;margin:20px}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}}\
         .ok{{color:#1b7837}}.fail{{color:#b2182b;font-weight:bold}}pre{{margin:0;font-size:11px;white-space:pre-wrap}}</style>\
         </head><body><h2>kairos-jepsen run {} — <span class=\"{}\">{}</span></h2>",
        esc(&h.meta.run_id),
        esc(&h.meta.run_id),
        if s.valid { "ok" } else { "fail" },
        if s.valid { "valid" } else { "INVALID" },
    );
    let _ = write!(
        out,
        "<p>seed {} · mode {} · nodes {} · nemeses {} · workloads {} · {} ops · {} receipts · {} faults</p>",
        h.meta.seed,
        esc(&h.meta.mode),
        h.meta.nodes.len(),
        esc(&h.meta.nemeses.join(",")),
        esc(&h.meta.workloads.join(",")),
        h.ops.len(),
        h.receipts.len(),
        h.faults.len()
    );
    if !h.meta.dropped_nemeses.is_empty() {
        let dropped: Vec<String> = h
            .meta
            .dropped_nemeses
            .iter()
            .map(|d| format!("{} ({})", d.family, d.reason))
            .collect();
        let _ = write!(
            out,
            "<p class=\"fail\">not injected: {}</p>",
            esc(&dropped.join("; "))
        );
    }
    verdict_table(&mut out, s);
    out.push_str("<h3>Lateness</h3><img src=\"lateness.svg\" alt=\"lateness plot\">");
    out.push_str("<h3>Timeline</h3>");
    timeline_svg(&mut out, h);
    out.push_str("</body></html>\n");
    out
}

fn verdict_table(out: &mut String, s: &Summary) {
    out.push_str("<table><tr><th>checker</th><th>verdict</th><th>counts</th><th>first counterexamples</th></tr>");
    for r in &s.results {
        let counts: Vec<String> = r.counts.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut ex: Vec<String> = r
            .counterexamples
            .iter()
            .take(3)
            .map(|c| c.to_string())
            .collect();
        ex.extend(r.notes.iter().map(|n| format!("note: {n}")));
        let _ = write!(
            out,
            "<tr><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td><pre>{}</pre></td></tr>",
            esc(&r.name),
            if r.valid { "ok" } else { "fail" },
            if r.valid { "valid" } else { "INVALID" },
            esc(&counts.join(" ")),
            esc(&ex.join("\n"))
        );
    }
    out.push_str("</table>");
}

/// Maps harness time onto the timeline's x axis.
struct Axis {
    start: i64,
    span: i64,
}

impl Axis {
    fn x(&self, t: i64) -> f64 {
        let t = t.clamp(self.start, self.start + self.span);
        LEFT + (t - self.start) as f64 / self.span as f64 * (W - LEFT - 10.0)
    }
}

fn row_y(i: usize) -> f64 {
    20.0 + i as f64 * ROW
}

fn timeline_svg(out: &mut String, h: &History) {
    let (start, span) = super::svg::time_span(h);
    let ax = Axis { start, span };
    let names: BTreeSet<String> = h.ops.iter().map(row_name).collect();
    // Membership changes overlap the other faults: they get a row of their own.
    let fault_rows = 1 + usize::from(h.faults.iter().any(|p| p.fault == MEMBERSHIP));
    let rows: BTreeMap<String, usize> = names
        .into_iter()
        .enumerate()
        .map(|(i, n)| (n, i + fault_rows))
        .collect();
    let receipts_y = row_y(rows.len() + fault_rows);
    let leaders_y = receipts_y + ROW;
    let axis_y = leaders_y + ROW + 4.0;
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{}" font-size="11">"#,
        axis_y + 40.0
    );
    time_grid(out, &ax, axis_y);
    fault_row(out, h, &ax);
    op_rows(out, h, &ax, &rows);
    receipt_row(out, h, &ax, receipts_y);
    leader_row(out, h, &ax, leaders_y);
    let _ = write!(
        out,
        r#"<text x="{LEFT}" y="{}">{} s total; {} of {} ops drawn; green ok, red fail, orange unknown</text></svg>"#,
        axis_y + 30.0,
        span / 1000,
        h.ops.len().min(MAX_OPS_DRAWN),
        h.ops.len()
    );
}

fn time_grid(out: &mut String, ax: &Axis, axis_y: f64) {
    let step_s = [1, 2, 5, 10, 20, 30, 60, 120, 300]
        .into_iter()
        .find(|st| ax.span / 1000 / st <= 20)
        .unwrap_or(600);
    for k in 0..=(ax.span / 1000 / step_s) {
        let px = ax.x(ax.start + k * step_s * 1000);
        let _ = write!(
            out,
            r##"<line x1="{px:.1}" y1="20" x2="{px:.1}" y2="{axis_y}" stroke="#ddd"/><text x="{px:.1}" y="{}" text-anchor="middle">{}s</text>"##,
            axis_y + 12.0,
            k * step_s
        );
    }
}

fn fault_row(out: &mut String, h: &History, ax: &Axis) {
    let _ = write!(out, r#"<text x="4" y="{}">faults</text>"#, row_y(0) + 12.0);
    if h.faults.iter().any(|p| p.fault == MEMBERSHIP) {
        let _ = write!(
            out,
            r#"<text x="4" y="{}">membership</text>"#,
            row_y(1) + 12.0
        );
    }
    for p in &h.faults {
        let row = usize::from(p.fault == MEMBERSHIP);
        let (x0, x1) = (ax.x(p.start_ms), ax.x(p.end_ms));
        let _ = write!(
            out,
            r#"<rect x="{x0:.1}" y="{}" width="{:.1}" height="{}" fill="{}"><title>{} {} nodes {:?}</title></rect><text x="{:.1}" y="{}" font-size="10">{} {:?}</text>"#,
            row_y(row),
            (x1 - x0).max(1.0),
            ROW - 2.0,
            fault_color(&p.fault),
            esc(&p.fault),
            esc(&p.kind),
            p.nodes,
            x0 + 2.0,
            row_y(row) + 12.0,
            esc(&p.kind),
            p.nodes
        );
    }
}

fn op_rows(out: &mut String, h: &History, ax: &Axis, rows: &BTreeMap<String, usize>) {
    for (name, i) in rows {
        let _ = write!(
            out,
            r#"<text x="4" y="{}">{}</text>"#,
            row_y(*i) + 12.0,
            esc(name)
        );
    }
    for o in h.ops.iter().take(MAX_OPS_DRAWN) {
        let color = match o.outcome() {
            Outcome::Ok => "#1b7837",
            Outcome::Fail => "#b2182b",
            Outcome::Unknown => "#f1a340",
        };
        let x0 = ax.x(o.invoke.time_ms);
        let x1 = ax.x(o.complete.as_ref().map_or(i64::MAX, |c| c.time_ms));
        let label = format!(
            "{:?} {:?} {} → {:?} {}",
            o.invoke.workload,
            o.invoke.f,
            o.invoke.key,
            o.outcome(),
            o.code().unwrap_or("")
        );
        let _ = write!(
            out,
            r#"<rect x="{x0:.1}" y="{}" width="{:.1}" height="{}" fill="{color}" opacity="0.5"><title>{}</title></rect>"#,
            row_y(rows[&row_name(o)]) + 2.0,
            (x1 - x0).max(1.0),
            ROW - 6.0,
            esc(&label)
        );
    }
}

fn receipt_row(out: &mut String, h: &History, ax: &Axis, y: f64) {
    let _ = write!(out, r#"<text x="4" y="{}">receipts</text>"#, y + 12.0);
    for r in h.receipts.iter().take(MAX_RECEIPTS_DRAWN) {
        let _ = write!(
            out,
            r##"<line x1="{0:.1}" y1="{1}" x2="{0:.1}" y2="{2}" stroke="#2166ac"><title>{3} attempt {4}</title></line>"##,
            ax.x(r.received_at_ms),
            y + 2.0,
            y + ROW - 4.0,
            esc(&r.run_id),
            r.attempt
        );
    }
}

/// A tick per first sighting of (term, node, source); log claims stand at
/// the node's own clock.
fn leader_row(out: &mut String, h: &History, ax: &Axis, y: f64) {
    let _ = write!(out, r#"<text x="4" y="{}">leaders</text>"#, y + 12.0);
    let mut seen = BTreeSet::new();
    let firsts = h
        .leaders
        .iter()
        .filter(|c| seen.insert((c.term, c.node, c.source.as_str())))
        .take(MAX_CLAIMS_DRAWN);
    for c in firsts {
        let px = ax.x(c.time_ms);
        let _ = write!(
            out,
            r##"<line x1="{px:.1}" y1="{}" x2="{px:.1}" y2="{}" stroke="#762a83"><title>term {} led by n{} ({} via n{}) {}</title></line><text x="{:.1}" y="{}" font-size="9" fill="#762a83">{}:{}</text>"##,
            y + 2.0,
            y + ROW - 4.0,
            c.term,
            c.node,
            esc(&c.source),
            c.reporter,
            esc(&c.node_time),
            px + 1.5,
            y + 11.0,
            c.term,
            c.node
        );
    }
}

fn row_name(o: &crate::history::Op) -> String {
    format!("{:?} → n{}", o.invoke.workload, o.invoke.node).to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::check_history;
    use crate::testkit::healthy_history;

    #[test]
    fn timeline_names_every_checker() {
        let h = History::from_events(healthy_history()).unwrap();
        let s = check_history(&h);
        let html = timeline_html(&h, &s);
        for r in &s.results {
            assert!(html.contains(&r.name), "{}", r.name);
        }
        assert!(html.contains("valid"));
        assert!(html.contains("receipts"));
        assert!(html.contains("leaders"));
    }
}
