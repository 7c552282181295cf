//! Checker `leaders`: election safety, judged from every claim a node made
//! to lead a term — its own `Cluster.Status` entry saying `role: leader`
//! (status polls during the run, the final reads) and the `leading: …
//! term=N` line it logs when it starts leading.
//!
//! Kairos runs openraft in its default ("advanced") mode, where a leader is
//! `(term, node id)` and votes are ordered by that pair: a node that voted
//! for `(T, 1)` still grants `(T, 3)`, so one term may see several leaders,
//! in rising node-id order, the last one the valid one (openraft's
//! `docs/data/leader_id.md`). Under that rule two leaders of a term are a
//! violation only when the lower id provably *started* leading after the
//! higher id already led: its log line comes more than `ORDER_MARGIN_MS`
//! after the higher id was seen leading, by clocks no clock fault skewed,
//! with no pause or slow disk on the lower node in between (either can hold
//! a log line back). Terms with several leaders are counted and listed in the
//! details either way. With openraft's `single-term-leader` feature the
//! server would promise one leader per term; `Rule::OnePerTerm` judges that
//! (set `RULE` to it if the server ever enables the feature).

use super::CheckResult;
use crate::event::LeaderClaim;
use crate::history::{FaultPeriod, History};
use serde_json::json;
use std::collections::BTreeMap;

pub const NAME: &str = "leaders";

/// What a term may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Standard Raft: at most one leader per term.
    OnePerTerm,
    /// openraft's default: several leaders per term, each elected after
    /// every lower id (the server's build today).
    AscendingIds,
}

/// The rule the server is built with (openraft without `single-term-leader`).
pub const RULE: Rule = Rule::AscendingIds;
/// A log line may trail the moment its node became leader by this much
/// (the supervising task reacts to Raft metrics on a loaded host).
pub const ORDER_MARGIN_MS: i64 = 2_000;
/// A node's log clock is not trusted this close to a clock fault on it:
/// offsets reach 30 s, and only the node's own time is on the line.
pub const CLOCK_DOUBT_MS: i64 = 60_000;
/// Fault families that can hold a node's log lines back: SIGSTOP, and a
/// disk slow enough to stall its threads.
pub const STALLING_FAMILIES: [&str; 2] = ["pause", "slow-disk"];
/// The text kairos logs when a node starts leading (`server/src/leader`).
pub const LEADING_LOG: &str = "leading: starting firing and dispatch";
/// The line the harness writes into a slot's log before each node start.
pub const START_MARKER: &str = "=== kairos-jepsen: starting node ";
/// Log lines read per slot, at most.
pub const MAX_LOG_LINES: usize = 5_000_000;

pub fn check(h: &History) -> CheckResult {
    check_with(h, RULE)
}

pub fn check_with(h: &History, rule: Rule) -> CheckResult {
    let mut r = CheckResult::new(NAME);
    let claims = all_claims(h);
    r.add("claims", claims.len() as u64);
    let terms = by_term(&claims);
    r.add("terms", terms.len() as u64);
    let mut several = Vec::new();
    for (term, leaders) in &terms {
        if leaders.len() < 2 {
            continue;
        }
        r.add("terms_with_several_leaders", 1);
        let named: Vec<_> = leaders.values().map(|c| sighting(c)).collect();
        several.push(json!({"term": term, "leaders": named}));
        match rule {
            Rule::OnePerTerm => r.flag(
                "two_leaders_one_term",
                json!({"term": term, "leaders": named}),
            ),
            Rule::AscendingIds => judge_order(h, *term, leaders, &mut r),
        }
    }
    if claims.is_empty() {
        r.note("no leader claims recorded: nothing to judge");
    }
    r.details = Some(json!({"rule": format!("{rule:?}"), "several_leaders": several}));
    r
}

/// The earliest claim of every (term, node), with the final reads'
/// leaders as claims too.
fn all_claims(h: &History) -> Vec<LeaderClaim> {
    let finals = h
        .finals
        .iter()
        .filter(|f| f.reachable && f.role == "leader")
        .map(|f| LeaderClaim {
            time_ms: f.time_ms,
            term: f.term,
            node: f.node,
            source: "final".into(),
            reporter: f.node,
            node_time: String::new(),
        });
    h.leaders.iter().cloned().chain(finals).collect()
}

/// term → leader id → its earliest claim.
fn by_term(claims: &[LeaderClaim]) -> BTreeMap<u64, BTreeMap<u64, &LeaderClaim>> {
    let mut m: BTreeMap<u64, BTreeMap<u64, &LeaderClaim>> = BTreeMap::new();
    for c in claims.iter().filter(|c| c.node != 0) {
        let e = m.entry(c.term).or_default().entry(c.node).or_insert(c);
        if c.time_ms < e.time_ms {
            *e = c;
        }
    }
    m
}

fn sighting(c: &LeaderClaim) -> serde_json::Value {
    json!({"node": c.node, "first_seen_ms": c.time_ms, "source": c.source,
           "reported_by": c.reporter, "node_time": c.node_time})
}

/// Flags every pair of `term`'s leaders where the lower id began leading
/// after the higher id was already seen leading.
fn judge_order(h: &History, term: u64, leaders: &BTreeMap<u64, &LeaderClaim>, r: &mut CheckResult) {
    let ids: Vec<u64> = leaders.keys().copied().collect();
    for (i, &lo) in ids.iter().enumerate() {
        for &hi in &ids[i + 1..] {
            let (Some(hi_led), Some(lo_began)) = (led_by(h, term, hi), began_leading(h, term, lo))
            else {
                r.add("several_leaders_unordered", 1);
                continue;
            };
            let stalled = paused_between(&h.faults, lo, hi_led.time_ms, lo_began.time_ms);
            if lo_began.time_ms > hi_led.time_ms + ORDER_MARGIN_MS && !stalled {
                r.flag(
                    "lower_id_led_after_higher",
                    json!({"term": term, "earlier_leader": sighting(hi_led),
                           "later_leader": sighting(lo_began),
                           "gap_ms": lo_began.time_ms - hi_led.time_ms}),
                );
            } else {
                r.add("several_leaders_in_order", 1);
            }
        }
    }
}

/// The earliest claim proving `node` led `term` by its time: a status or
/// final read (harness clock), or a log line by an unskewed clock.
fn led_by(h: &History, term: u64, node: u64) -> Option<&LeaderClaim> {
    h.leaders
        .iter()
        .filter(|c| c.term == term && c.node == node)
        .filter(|c| c.source != "log" || clock_trusted(&h.faults, node, c.time_ms))
        .min_by_key(|c| c.time_ms)
}

/// `node`'s first "leading" log line for `term`, if its clock was unskewed.
fn began_leading(h: &History, term: u64, node: u64) -> Option<&LeaderClaim> {
    h.leaders
        .iter()
        .filter(|c| c.term == term && c.node == node && c.source == "log")
        .min_by_key(|c| c.time_ms)
        .filter(|c| clock_trusted(&h.faults, node, c.time_ms))
}

fn clock_trusted(faults: &[FaultPeriod], node: u64, t_ms: i64) -> bool {
    !faults.iter().any(|p| {
        p.fault == "clock"
            && p.nodes.contains(&node)
            && p.start_ms.saturating_sub(CLOCK_DOUBT_MS) <= t_ms
            && t_ms <= p.end_ms.saturating_add(CLOCK_DOUBT_MS)
    })
}

/// Whether a fault that can stall `node`'s process overlapped
/// `[from_ms - margin, to_ms]`.
fn paused_between(faults: &[FaultPeriod], node: u64, from_ms: i64, to_ms: i64) -> bool {
    faults.iter().any(|p| {
        STALLING_FAMILIES.contains(&p.fault.as_str())
            && p.nodes.contains(&node)
            && p.start_ms <= to_ms
            && p.end_ms >= from_ms - ORDER_MARGIN_MS
    })
}

/// One "leading" line of a slot's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogClaim {
    pub node: u64,
    pub term: u64,
    /// The line's timestamp as written, and in unix ms (0 if unparsed).
    pub node_time: String,
    pub time_ms: i64,
}

/// The leadership starts in a slot's `kairos.log` (text or JSON lines),
/// each attributed to the node the last start marker names.
pub fn parse_log(text: &str) -> Vec<LogClaim> {
    let mut node = 0u64;
    let mut out = Vec::new();
    for line in text.lines().take(MAX_LOG_LINES) {
        if let Some(rest) = line.strip_prefix(START_MARKER) {
            node = leading_number(rest).unwrap_or(0);
            continue;
        }
        if node == 0 || !line.contains(LEADING_LOG) {
            continue;
        }
        let Some(term) = field_number(line, "term") else {
            continue;
        };
        let node_time = timestamp(line).to_string();
        let time_ms = parse_rfc3339_ms(&node_time).unwrap_or(0);
        out.push(LogClaim {
            node,
            term,
            node_time,
            time_ms,
        });
    }
    out
}

fn leading_number(s: &str) -> Option<u64> {
    let digits: String = s.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// `term=5` (text format) or `"term":5` (JSON format).
fn field_number(line: &str, name: &str) -> Option<u64> {
    [format!("{name}="), format!("\"{name}\":")]
        .iter()
        .find_map(|p| line.find(p.as_str()).map(|i| &line[i + p.len()..]))
        .and_then(leading_number)
}

/// The text format's first token, or the JSON format's `timestamp`.
fn timestamp(line: &str) -> &str {
    const KEY: &str = "\"timestamp\":\"";
    if let Some(i) = line.find(KEY) {
        let rest = &line[i + KEY.len()..];
        return rest.split('"').next().unwrap_or("");
    }
    line.split_whitespace().next().unwrap_or("")
}

/// `2026-12-07T13:20:01.123456Z` (UTC, as tracing writes it) in unix ms.
pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|x| x.parse::<i64>().ok());
    let (y, mo, da) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.splitn(3, ':').map(|x| x.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    let frac_ms: i64 = format!("{frac:0<3}")[..3].parse().ok()?;
    if !(1..=12).contains(&mo) || !(1..=31).contains(&da) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    let days = days_from_civil(y, mo, da);
    Some(((days * 24 + hh) * 60 + mm) * 60_000 + ss * 1_000 + frac_ms)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, Phase};
    use crate::testkit::*;

    fn judged(ev: Vec<Event>, rule: Rule) -> CheckResult {
        check_with(&History::from_events(ev).unwrap(), rule)
    }

    fn log_claim(t: i64, term: u64, node: u64) -> Event {
        leader_claim(t, term, node, node, "log")
    }

    #[test]
    fn one_leader_per_term_is_valid_under_both_rules() {
        let mut ev = healthy_history();
        ev.push(leader_claim(BASE_MS + 100, 1, 2, 3, "status"));
        ev.push(log_claim(BASE_MS + 90, 1, 2));
        ev.push(leader_claim(BASE_MS + 6_000, 2, 1, 1, "status"));
        for rule in [Rule::OnePerTerm, Rule::AscendingIds] {
            let r = judged(ev.clone(), rule);
            assert!(r.valid, "{rule:?}: {r:?}");
            // Terms 1 and 2 (the final reads name node 1 in term 2 too).
            assert_eq!(r.counts["terms"], 2);
            assert!(!r.counts.contains_key("terms_with_several_leaders"));
        }
    }

    #[test]
    fn two_leaders_of_one_term_break_the_standard_rule() {
        let mut ev = healthy_history();
        ev.push(leader_claim(BASE_MS + 100, 3, 1, 2, "status"));
        ev.push(leader_claim(BASE_MS + 900, 3, 2, 3, "status"));
        let r = judged(ev, Rule::OnePerTerm);
        assert!(!r.valid);
        assert_eq!(r.counts["two_leaders_one_term"], 1);
        let ex = &r.counterexamples[0];
        assert_eq!(ex["term"], 3);
        assert_eq!(ex["leaders"][0]["node"], 1);
        assert_eq!(ex["leaders"][0]["reported_by"], 2);
        assert_eq!(ex["leaders"][1]["node"], 2);
        assert_eq!(ex["leaders"][1]["first_seen_ms"], BASE_MS + 900);
    }

    #[test]
    fn final_reads_count_as_claims() {
        let mut ev = healthy_history();
        // Node 2 also says it leads term 2 at the end, beside node 1.
        edit_finals(&mut ev, |f| {
            if f.node == 2 {
                f.role = "leader".into();
            }
        });
        let r = judged(ev, Rule::OnePerTerm);
        assert_eq!(r.counts["two_leaders_one_term"], 1, "{r:?}");
    }

    #[test]
    fn rising_ids_in_one_term_are_openrafts_default() {
        let mut ev = healthy_history();
        // Node 1 led term 3, then node 3 won term 3 too (votes rise with the id).
        ev.push(log_claim(BASE_MS + 1_000, 3, 1));
        ev.push(log_claim(BASE_MS + 1_400, 3, 3));
        ev.push(leader_claim(BASE_MS + 1_500, 3, 3, 2, "status"));
        let r = judged(ev, Rule::AscendingIds);
        assert!(r.valid, "{r:?}");
        assert_eq!(r.counts["terms_with_several_leaders"], 1);
        assert_eq!(r.counts["several_leaders_in_order"], 1);
        let d = r.details.unwrap();
        assert_eq!(d["several_leaders"][0]["term"], 3);
    }

    #[test]
    fn lower_id_starting_after_a_higher_one_is_flagged() {
        let mut ev = healthy_history();
        ev.push(leader_claim(BASE_MS + 1_000, 3, 3, 2, "status"));
        ev.push(log_claim(BASE_MS + 9_000, 3, 1));
        let r = judged(ev, Rule::AscendingIds);
        assert!(!r.valid);
        assert_eq!(r.counts["lower_id_led_after_higher"], 1);
        let ex = &r.counterexamples[0];
        assert_eq!(ex["earlier_leader"]["node"], 3);
        assert_eq!(ex["later_leader"]["node"], 1);
        assert_eq!(ex["gap_ms"], 8_000);
    }

    #[test]
    fn skewed_or_paused_lower_node_proves_nothing() {
        let base = {
            let mut ev = healthy_history();
            ev.push(leader_claim(BASE_MS + 1_000, 3, 3, 2, "status"));
            ev.push(log_claim(BASE_MS + 9_000, 3, 1));
            ev
        };
        // The kill fault in the healthy history hits node 2; put node 1
        // under a clock fault, then under a pause.
        for fault in ["clock", "pause"] {
            let mut ev = base.clone();
            for (phase, t) in [(Phase::Start, 500), (Phase::Stop, 8_500)] {
                if let Event::Nemesis(mut n) = nemesis(40, BASE_MS + t, phase, fault) {
                    n.nodes = vec![1];
                    ev.push(Event::Nemesis(n));
                }
            }
            let r = judged(ev, Rule::AscendingIds);
            assert!(r.valid, "{fault}: {r:?}");
            assert_eq!(r.counts["terms_with_several_leaders"], 1);
        }
        // Status claims only: the order is not known.
        let mut ev = healthy_history();
        ev.push(leader_claim(BASE_MS + 1_000, 3, 3, 2, "status"));
        ev.push(leader_claim(BASE_MS + 9_000, 3, 1, 2, "status"));
        let r = judged(ev, Rule::AscendingIds);
        assert!(r.valid, "{r:?}");
        assert_eq!(r.counts["several_leaders_unordered"], 1);
    }

    #[test]
    fn log_lines_are_attributed_to_the_node_started_last() {
        let log = "=== kairos-jepsen: starting node 1 ===\n\
            2026-12-07T13:20:01.123456Z  INFO kairos_server::leader: leading: starting firing and dispatch term=2\n\
            2026-12-07T13:20:09.000001Z  INFO kairos_server::leader: no longer leading: stopping firing and dispatch term=2\n\
            === kairos-jepsen: starting node 4 ===\n\
            {\"timestamp\":\"2026-12-07T13:21:00.5Z\",\"level\":\"INFO\",\"fields\":{\"message\":\"leading: starting firing and dispatch\",\"term\":7}}\n";
        let claims = parse_log(log);
        assert_eq!(claims.len(), 2, "{claims:?}");
        assert_eq!((claims[0].node, claims[0].term), (1, 2));
        assert_eq!(claims[0].node_time, "2026-12-07T13:20:01.123456Z");
        assert_eq!((claims[1].node, claims[1].term), (4, 7));
        assert_eq!(claims[1].time_ms - claims[0].time_ms, 59_377);
    }

    #[test]
    fn timestamps_parse_to_unix_ms() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_ms("2023-11-14T22:13:20.250Z"),
            Some(1_700_000_000_250)
        );
        assert_eq!(
            parse_rfc3339_ms("2024-02-29T00:00:00.9Z"),
            Some(1_709_164_800_900)
        );
        assert_eq!(parse_rfc3339_ms("not a time"), None);
        assert_eq!(parse_rfc3339_ms("2024-13-01T00:00:00Z"), None);
    }
}
