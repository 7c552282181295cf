//! Job schedules as stored in the replicated state: their validation, the
//! computation of their occurrences, and the parsing of human durations.
//!
//! Everything here is a pure function of its arguments (no clock, no
//! randomness, no I/O), because it runs inside the state machine's apply and
//! every replica must reach the same answer. The one outside input is the time
//! zone database compiled into `chrono-tz`: all replicas must run a build with
//! the same `chrono-tz` data, or they may disagree about local times.
//!
//! # Cron dialect
//!
//! Parsing and wall-clock matching are done by the `croner` crate. Accepted:
//! 5 fields (`min hour dom month dow`, seconds = 0), 6 fields (seconds first)
//! and 7 fields (seconds first, year last); `*`, `,`, `-`, `*/n`, `a-b/n`,
//! month and weekday names, `?` (same as `*` in dom/dow), `L` (last day of
//! month), `nW` / `LW` (nearest weekday), `d#n` (nth weekday), `dL` / `d#L`
//! (last weekday `d` of the month), and the nicknames `@yearly`, `@annually`,
//! `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly` (expanded here,
//! since `croner` does not know `@midnight`). Day of month and day of week
//! combine as in Vixie cron: with OR when both are restricted, with AND when
//! either starts with `*` or `?` (so `0 0 */2 * 1` means odd days that are
//! Mondays). `croner`'s `+` (dom AND dow) prefix is rejected so that the
//! dialect has a single day rule.
//!
//! # Quartz dialect
//!
//! A job says which dialect its expression is in; nothing is guessed. The
//! `Quartz` schedule reads an expression as Quartz's `CronTrigger` does: 6
//! fields (seconds first) or 7 (year last), never 5; exactly one of day of
//! month and day of week is `?`; weekdays are numbered 1-7 from Sunday
//! (`SUN`=1 ... `SAT`=7), so `6L` is the last Friday and `6#3` the third
//! Friday; `a/b` means every `b` starting at `a` (`0/5` in seconds is
//! 0,5,...,55); `L`, `W`, `LW` in day of month as above. Quartz's `L-n`
//! (n days before the last) is not supported and is refused. The API refuses a
//! 6- or 7-field expression with `?` when the dialect is not given, since
//! that is Quartz syntax the Vixie reading above would silently shift by a day.
//!
//! # Daylight saving time
//!
//! Occurrences are whole seconds, and `next_after(x) > x` always holds. Jobs
//! fall in two classes, decided by the hour field:
//!
//! * Time-of-day jobs (the hour field does not start with `*`, e.g.
//!   `30 2 * * *`, `30 2,14 * * *`, `*/20 1 * * *`): every matching local
//!   wall-clock time fires exactly once. A time repeated by a fall-back fires
//!   at its first instant only. A time skipped by a spring-forward fires at
//!   the first instant after the gap (03:00 local for a 02:30 job in
//!   `America/New_York`); all skipped times of one gap collapse into that single
//!   instant, together with a regular match at that same instant. `croner`
//!   applies this rule only to patterns whose second, minute and hour are
//!   single values (it skips `30 2,14 * * *` in the gap and fires
//!   `30 1,13 * * *` twice in the overlap), so this module searches wall-clock
//!   time with `croner` over `NaiveDateTime` and maps each match to an
//!   instant itself.
//! * Interval jobs (the hour field is `*` or `*/n`, and `@hourly`): real-time
//!   semantics, delegated to `croner`'s search over `DateTime<Tz>`. Every
//!   instant whose local time matches fires: a repeated hour runs in both of
//!   its passes and a skipped hour does not run. `0 * * * *` thus fires every
//!   real hour: 00:00 EDT, 01:00 EDT, 01:00 EST, 02:00 EST on a New York
//!   fall-back day, and 01:00 EST, 03:00 EDT (one hour apart) on a
//!   spring-forward day.
//!
//! # Search horizon
//!
//! `croner` searches up to the year 4999; `after_ms` before the year 1 is
//! treated as the start of the year 1, and at or after the year 5000 there is
//! no occurrence (`None`). A pattern that never matches (`0 0 30 2 *`, a past
//! year) yields `None` after a bounded search (about 10 to 30 ms in a release
//! build, as `croner` walks to the year 4999); callers should treat a `None`
//! at creation time as a dead schedule rather than ask again.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use chrono::{DateTime, LocalResult, NaiveDateTime, TimeZone};
use chrono_tz::Tz;
use croner::errors::CronError;
use croner::parser::{CronParser, Seconds, Year};
use croner::{Cron, CronDateTime};
use serde::{Deserialize, Serialize};

/// The IANA time zone database compiled into this binary (through the
/// pinned `chrono-tz`). Replicas with different tzdata may compute different
/// local fire times, so each node records it and reports it in its status.
pub const TZDATA_VERSION: &str = chrono_tz::IANA_TZDB_VERSION;

/// Longest accepted cron expression, in bytes.
pub const MAX_CRON_EXPR_BYTES: usize = 256;
/// Longest accepted fixed-rate period: 10 years of 365 days, in ms.
pub const MAX_EVERY_MS: u64 = 10 * 365 * 24 * 60 * 60 * 1000;
/// Most occurrences one `preview` call may return.
pub const MAX_PREVIEW: usize = 1000;

/// 0001-01-01T00:00:00Z: earlier `after_ms` values start the search here.
const HORIZON_START_MS: i64 = -62_135_596_800_000;
/// 5000-01-01T00:00:00Z: `croner` does not search past the year 4999.
const HORIZON_END_MS: i64 = 95_617_584_000_000;
/// Wider than any UTC offset (at most 26 h), so a window of this half-width
/// around a wall-clock time always contains the instants that bracket it.
const OFFSET_SPAN_S: i64 = 27 * 3600;
/// Bound on repeated wall-clock matches skipped in one search; an overlap
/// holds at most one match per second of its length (a day, historically).
const MAX_WALL_SKIPS: u32 = 200_000;
/// Longest user text echoed in an error message.
const ECHO_CHARS: usize = 64;

/// A job's schedule as stored in replicated state (serde + bincode 2 serde encoding: no `#[serde(flatten)]`, no untagged enums, no `skip_serializing_if`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Schedule {
    /// Cron expression in an IANA time zone ("" means UTC).
    Cron { expr: String, tz: String },
    /// Fixed rate: occurrences are `anchor_ms + k*every_ms` for `k >= 1` (anchored at creation, never at "now").
    Every { every_ms: u64, anchor_ms: i64 },
    /// One-shot at an absolute unix-ms instant.
    Once { at_ms: i64 },
    /// Cron expression in Quartz's dialect (see the module doc), in an IANA
    /// time zone ("" means UTC).
    Quartz { expr: String, tz: String },
    /// No occurrences: the job runs when its upstreams complete a cycle.
    Upstream,
    /// Several recurring schedules (2 to `limits::SCHEDULES_MAX`, no
    /// `Once`, `Upstream` or nested union): the occurrences of all of them,
    /// an instant matched by several counted once. A job record keeps the
    /// first in its format-8 bytes and the others in its tail.
    Union(Vec<Schedule>),
}

/// Why a schedule, a preview request or a duration was rejected. Each message
/// starts with the field it is about and states the rule that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("schedule.cron.expr: must not be empty")]
    CronEmpty,
    #[error("schedule.cron.expr: must be at most {MAX_CRON_EXPR_BYTES} bytes, got {len}")]
    CronTooLong { len: usize },
    #[error("schedule.cron.expr: must contain only ASCII characters")]
    CronNotAscii,
    #[error("schedule.cron.expr: must not contain control characters (fields are separated by spaces or tabs)")]
    CronControlChar,
    #[error("schedule.cron.expr: expected 5, 6 or 7 fields, got {got}")]
    CronFieldCount { got: usize },
    #[error("schedule.cron.expr: unknown nickname \"{name}\" (expected @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly)")]
    CronUnknownNickname { name: String },
    #[error("schedule.cron.expr: the '+' (day-of-month AND day-of-week) modifier is not supported; the two fields combine as in Vixie cron")]
    CronPlusModifier,
    #[error("schedule.cron.expr: {reason}")]
    CronSyntax { reason: String },
    #[error("schedule.cron.expr: a Quartz expression has 6 fields (seconds first) or 7 (year last), got {got}")]
    QuartzFieldCount { got: usize },
    #[error("schedule.cron.expr: in Quartz exactly one of day-of-month and day-of-week must be '?', got \"{dom}\" and \"{dow}\"")]
    QuartzQuestionMark { dom: String, dow: String },
    #[error("schedule.cron.expr: Quartz's \"L-n\" (n days before the last day of the month) is not supported, got \"{field}\"")]
    QuartzLastOffset { field: String },
    #[error("schedule.cron.tz: unknown IANA time zone \"{tz}\"")]
    UnknownTimeZone { tz: String },
    #[error("schedule.cron: occurrence search failed: {reason}")]
    CronSearch { reason: String },
    #[error("schedule.every_ms: must be at least 1 ms")]
    EveryTooSmall,
    #[error("schedule.every_ms: must be at most {MAX_EVERY_MS} ms (10 years), got {every_ms}")]
    EveryTooLarge { every_ms: u64 },
    #[error("schedule.at_ms: must be greater than 0, got {at_ms}")]
    OnceNotPositive { at_ms: i64 },
    #[error("preview.count: must be at most {MAX_PREVIEW}, got {count}")]
    PreviewTooMany { count: usize },
    #[error("schedule: next occurrence {next_ms} is not after {after_ms} (internal invariant)")]
    NotIncreasing { after_ms: i64, next_ms: i64 },
    #[error("duration: must not be empty")]
    DurationEmpty,
    #[error("duration \"{input}\": must not be negative")]
    DurationNegative { input: String },
    #[error("duration \"{input}\": must be greater than zero")]
    DurationZero { input: String },
    #[error("duration \"{input}\": exceeds the maximum of {max} ms", max = u64::MAX)]
    DurationOverflow { input: String },
    #[error("duration \"{input}\": {reason}")]
    DurationSyntax { input: String, reason: String },
}

impl Schedule {
    /// Validates limits and syntax. Limits: cron expr <= 256 bytes; tz must parse with chrono-tz; `every_ms` in [1, 10 years in ms]; `at_ms` must be > 0.
    ///
    /// # Errors
    /// The first rule the schedule breaks, naming its field.
    pub fn validate(&self) -> Result<(), ScheduleError> {
        self.compile().map(|_| ())
    }

    /// The first occurrence strictly after `after_ms` (unix ms), or None if there is none (a Once already past, a cron with no future match such as a past year).
    ///
    /// # Errors
    /// The schedule is invalid (see [`Schedule::validate`]), or the search
    /// failed in a way that cannot be read as "no occurrence".
    pub fn next_after(&self, after_ms: i64) -> Result<Option<i64>, ScheduleError> {
        self.compile()?.next_after(after_ms)
    }

    /// Up to `count` consecutive occurrences strictly after `after_ms`.
    /// Fewer are returned when the schedule runs out of occurrences.
    ///
    /// # Errors
    /// `count` is above [`MAX_PREVIEW`], or as for [`Schedule::next_after`].
    pub fn preview(&self, after_ms: i64, count: usize) -> Result<Vec<i64>, ScheduleError> {
        if count > MAX_PREVIEW {
            return Err(ScheduleError::PreviewTooMany { count });
        }
        // Compiled once so a long preview does not re-parse the expression.
        let compiled = self.compile()?;
        let mut out = Vec::with_capacity(count);
        let mut cursor = after_ms;
        while out.len() < count {
            match compiled.next_after(cursor)? {
                Some(next) => {
                    out.push(next);
                    cursor = next;
                }
                None => break,
            }
        }
        Ok(out)
    }

    /// The schedules it is the union of: itself unless a union.
    #[must_use]
    pub fn members(&self) -> &[Schedule] {
        match self {
            Schedule::Union(members) => members,
            single => std::slice::from_ref(single),
        }
    }

    /// True for Once.
    #[must_use]
    pub fn is_one_shot(&self) -> bool {
        matches!(self, Schedule::Once { .. })
    }

    /// For a time-of-day cron job, how a daylight-saving change moves the
    /// occurrence at `at_ms` (one `next_after` returned): the local time it
    /// matches does not exist that day and it fires at the end of the gap
    /// (several such times merge into that one firing), or the local time
    /// occurs twice and it fires once, at the first. `None` otherwise.
    pub fn dst_note(&self, at_ms: i64) -> Option<String> {
        if let Schedule::Union(members) = self {
            // The note of a member whose own occurrence this is.
            let after = at_ms.checked_sub(1)?;
            return members
                .iter()
                .filter(|m| m.next_after(after) == Ok(Some(at_ms)))
                .find_map(|m| m.dst_note(at_ms));
        }
        let Ok(Compiled::Cron(parsed)) = self.compile() else {
            return None;
        };
        if !parsed.wall_clock {
            return None;
        }
        let local = parsed.tz.timestamp_millis_opt(at_ms).single()?;
        let wall = local.naive_local();
        if !parsed.cron.is_time_matching(&wall).unwrap_or(true) {
            return Some(format!(
                "DST: the matching local time does not exist on {} ({} skips ahead); \
                 fires at {} instead, once for all times in the gap",
                wall.date(),
                parsed.tz,
                wall.format("%H:%M:%S")
            ));
        }
        match parsed.tz.from_local_datetime(&wall) {
            LocalResult::Ambiguous(..) => Some(format!(
                "DST: {} occurs twice on {} ({} repeats it); fires once, at the first",
                wall.format("%H:%M:%S"),
                wall.date(),
                parsed.tz
            )),
            _ => None,
        }
    }

    /// Checks every rule and prepares the schedule for occurrence searches.
    fn compile(&self) -> Result<Compiled, ScheduleError> {
        match self {
            Schedule::Cron { expr, tz } => {
                Ok(Compiled::Cron(cached_cron(expr, tz, Dialect::Unix)?))
            }
            Schedule::Quartz { expr, tz } => {
                Ok(Compiled::Cron(cached_cron(expr, tz, Dialect::Quartz)?))
            }
            Schedule::Every {
                every_ms,
                anchor_ms,
            } => {
                if *every_ms == 0 {
                    return Err(ScheduleError::EveryTooSmall);
                }
                if *every_ms > MAX_EVERY_MS {
                    return Err(ScheduleError::EveryTooLarge {
                        every_ms: *every_ms,
                    });
                }
                Ok(Compiled::Every {
                    every_ms: *every_ms,
                    anchor_ms: *anchor_ms,
                })
            }
            Schedule::Once { at_ms } if *at_ms <= 0 => {
                Err(ScheduleError::OnceNotPositive { at_ms: *at_ms })
            }
            Schedule::Once { at_ms } => Ok(Compiled::Once { at_ms: *at_ms }),
            Schedule::Upstream => Ok(Compiled::Never),
            Schedule::Union(members) => Ok(Compiled::Union(
                members
                    .iter()
                    .map(Schedule::compile)
                    .collect::<Result<_, _>>()?,
            )),
        }
    }
}

/// A validated schedule, ready to search.
enum Compiled {
    // Shared with the parse cache; the other variants are tiny.
    Cron(Rc<ParsedCron>),
    Every { every_ms: u64, anchor_ms: i64 },
    Once { at_ms: i64 },
    Never,
    Union(Vec<Compiled>),
}

impl Compiled {
    fn next_after(&self, after_ms: i64) -> Result<Option<i64>, ScheduleError> {
        let next = match self {
            Compiled::Cron(cron) => cron.next_after(after_ms)?,
            Compiled::Every {
                every_ms,
                anchor_ms,
            } => every_next(*every_ms, *anchor_ms, after_ms),
            Compiled::Once { at_ms } => (*at_ms > after_ms).then_some(*at_ms),
            Compiled::Never => None,
            Compiled::Union(members) => {
                let mut earliest = None;
                for m in members {
                    earliest = match (earliest, m.next_after(after_ms)?) {
                        (Some(a), Some(b)) => Some(std::cmp::min(a, b)),
                        (a, b) => a.or(b),
                    };
                }
                earliest
            }
        };
        // The scheduler relies on strict progress; a violation must surface
        // as an error rather than as a job firing twice or a stuck preview.
        match next {
            Some(next_ms) if next_ms <= after_ms => {
                Err(ScheduleError::NotIncreasing { after_ms, next_ms })
            }
            _ => Ok(next),
        }
    }
}

/// Smallest `anchor + k * every` with `k >= 1` that is after `after_ms`.
/// Computed from the anchor, never from the previous firing, so it cannot
/// drift; i128 keeps every intermediate value exact. `None` past i64 range.
fn every_next(every_ms: u64, anchor_ms: i64, after_ms: i64) -> Option<i64> {
    let (every, anchor, after) = (
        i128::from(every_ms),
        i128::from(anchor_ms),
        i128::from(after_ms),
    );
    let k = if after < anchor {
        1
    } else {
        (after - anchor) / every + 1
    };
    i64::try_from(anchor + k * every).ok()
}

/// A parsed cron expression with its zone and DST class.
struct ParsedCron {
    cron: Cron,
    tz: Tz,
    /// Time-of-day job (see the module doc); false for interval jobs.
    wall_clock: bool,
}

impl ParsedCron {
    fn next_after(&self, after_ms: i64) -> Result<Option<i64>, ScheduleError> {
        if after_ms >= HORIZON_END_MS {
            return Ok(None);
        }
        // Occurrences are whole seconds, so the first one after `after_ms` is
        // the first one after its whole second (rounded towards the past).
        let after_s = after_ms.max(HORIZON_START_MS).div_euclid(1000);
        let next_s = if self.wall_clock {
            self.next_wall_clock(after_s)?
        } else {
            self.next_interval(after_s)?
        };
        Ok(next_s.and_then(|s| s.checked_mul(1000)))
    }

    /// Real-time search: `croner`'s zoned search already fires both passes of
    /// a repeated time and skips a time that does not exist.
    fn next_interval(&self, after_s: i64) -> Result<Option<i64>, ScheduleError> {
        let origin = utc_instant(after_s)?.with_timezone(&self.tz);
        Ok(croner_next(&self.cron, &origin)?.map(|found| found.timestamp()))
    }

    /// Wall-clock search: find the next matching local time, then map it to
    /// its firing instant. Instants grow with wall-clock time, except that
    /// the first pass of a repeated time lies before `after_s` when `after_s`
    /// is in the second pass; those matches already fired and are skipped.
    fn next_wall_clock(&self, after_s: i64) -> Result<Option<i64>, ScheduleError> {
        let mut cursor = local_wall_clock(self.tz, after_s)?;
        for _ in 0..MAX_WALL_SKIPS {
            let Some(wall) = croner_next(&self.cron, &cursor)? else {
                return Ok(None);
            };
            let fire_s = first_instant(self.tz, wall)?;
            if fire_s > after_s {
                return Ok(Some(fire_s));
            }
            cursor = wall;
        }
        Err(ScheduleError::CronSearch {
            reason: "too many repeated wall-clock times".into(),
        })
    }
}

/// Runs one `croner` search. Running out of the year range means there is no
/// occurrence; `croner` reports it as a search limit or, at the very edge of
/// its calendar, as an invalid date or time.
fn croner_next<T: CronDateTime>(cron: &Cron, from: &T) -> Result<Option<T>, ScheduleError> {
    match cron.find_next_occurrence(from, false) {
        Ok(found) => Ok(Some(found)),
        Err(
            CronError::TimeSearchLimitExceeded | CronError::InvalidDate | CronError::InvalidTime,
        ) => Ok(None),
        Err(other) => Err(ScheduleError::CronSearch {
            reason: other.to_string(),
        }),
    }
}

/// The instant at which a matching wall-clock time fires: its only instant,
/// the first of two in a fall-back overlap, or the end of a spring-forward gap.
fn first_instant(tz: Tz, wall: NaiveDateTime) -> Result<i64, ScheduleError> {
    match tz.from_local_datetime(&wall) {
        LocalResult::Single(instant) => Ok(instant.timestamp()),
        LocalResult::Ambiguous(earlier, _) => Ok(earlier.timestamp()),
        LocalResult::None => gap_end(tz, wall),
    }
}

/// First instant after the gap that swallowed `wall`: the first second whose
/// local time is past `wall`. Binary search, because `chrono-tz` does not
/// expose transitions and gaps vary in length (30 min, 1 h, a whole day).
fn gap_end(tz: Tz, wall: NaiveDateTime) -> Result<i64, ScheduleError> {
    let pivot = wall.and_utc().timestamp();
    let (mut before, mut after) = (pivot - OFFSET_SPAN_S, pivot + OFFSET_SPAN_S);
    let is_past = |s: i64| local_wall_clock(tz, s).map(|local| local > wall);
    if is_past(before)? || !is_past(after)? {
        return Err(ScheduleError::CronSearch {
            reason: format!("no gap end found around {wall}"),
        });
    }
    while after - before > 1 {
        let mid = before + (after - before) / 2;
        if is_past(mid)? {
            after = mid;
        } else {
            before = mid;
        }
    }
    Ok(after)
}

fn utc_instant(unix_s: i64) -> Result<DateTime<chrono::Utc>, ScheduleError> {
    DateTime::from_timestamp(unix_s, 0).ok_or_else(|| ScheduleError::CronSearch {
        reason: format!("instant {unix_s} s out of range"),
    })
}

/// Local wall-clock time of an instant. Callers stay within the search
/// horizon (plus a day), far inside the range where this cannot overflow.
fn local_wall_clock(tz: Tz, unix_s: i64) -> Result<NaiveDateTime, ScheduleError> {
    Ok(utc_instant(unix_s)?.with_timezone(&tz).naive_local())
}

/// Validates and parses a cron expression and its zone.
/// Parsed patterns per thread, by zone and then expression, at most this many.
const CRON_CACHE_MAX: usize = 4096;

thread_local! {
    static CRON_CACHE: RefCell<HashMap<String, HashMap<(Dialect, String), Rc<ParsedCron>>>> =
        RefCell::new(HashMap::new());
}

/// `parse_cron` through a small per-thread cache. Parsing costs far more
/// than an occurrence search and every fire of a cron job searches, mostly
/// over the same few patterns. Parsing is pure, so the cache cannot change a
/// result; failures are not cached. When full it is simply emptied.
/// How an expression's fields are read (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Dialect {
    Unix,
    Quartz,
}

fn cached_cron(expr: &str, tz: &str, dialect: Dialect) -> Result<Rc<ParsedCron>, ScheduleError> {
    let key = (dialect, expr.to_string());
    let hit = CRON_CACHE.with(|c| c.borrow().get(tz).and_then(|m| m.get(&key)).cloned());
    if let Some(parsed) = hit {
        return Ok(parsed);
    }
    let parsed = Rc::new(match dialect {
        Dialect::Unix => parse_cron(expr, tz)?,
        Dialect::Quartz => parse_quartz(expr, tz)?,
    });
    CRON_CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.values().map(HashMap::len).sum::<usize>() >= CRON_CACHE_MAX {
            c.clear();
        }
        c.entry(tz.to_string())
            .or_default()
            .insert(key, parsed.clone());
    });
    Ok(parsed)
}

/// Is this 6- or 7-field expression written in Quartz's syntax (a `?` in a
/// day field)? The API asks such a job to name its dialect.
#[must_use]
pub fn looks_like_quartz(expr: &str) -> bool {
    let fields: Vec<&str> = expr.split_ascii_whitespace().collect();
    matches!(fields.len(), 6 | 7) && (fields[3].contains('?') || fields[5].contains('?'))
}

/// Checks shared by both dialects: length, ASCII, no `+`, no empty list item.
fn check_text(expr: &str) -> Result<(), ScheduleError> {
    if expr.len() > MAX_CRON_EXPR_BYTES {
        return Err(ScheduleError::CronTooLong { len: expr.len() });
    }
    if !expr.is_ascii() {
        return Err(ScheduleError::CronNotAscii);
    }
    // croner splits fields on every whitespace character, the checks here on
    // ASCII whitespace, which leaves out \x0b: a vertical tab could hide an
    // empty list item from the check below. Only spaces and tabs separate.
    if expr.chars().any(|c| c.is_ascii_control() && c != '\t') {
        return Err(ScheduleError::CronControlChar);
    }
    if expr.contains('+') {
        return Err(ScheduleError::CronPlusModifier);
    }
    // croner reads `,` or `1,,2` as a list with an empty item (an empty
    // field that never matches), and searching for it walks to the year 4999.
    if let Some(f) = expr
        .split_ascii_whitespace()
        .find(|f| f.split(',').any(str::is_empty))
    {
        return Err(ScheduleError::CronSyntax {
            reason: format!("field \"{}\" has an empty list item", echo(f)),
        });
    }
    Ok(())
}

fn parse_quartz(expr: &str, tz: &str) -> Result<ParsedCron, ScheduleError> {
    check_text(expr)?;
    let tz = parse_tz(tz)?;
    let fields: Vec<&str> = expr.split_ascii_whitespace().collect();
    let (hour, dom, dow) = match fields.as_slice() {
        [] => return Err(ScheduleError::CronEmpty),
        [_, _, hour, dom, _, dow] | [_, _, hour, dom, _, dow, _] => (*hour, *dom, *dow),
        other => return Err(ScheduleError::QuartzFieldCount { got: other.len() }),
    };
    if (dom == "?") == (dow == "?") {
        return Err(ScheduleError::QuartzQuestionMark {
            dom: echo(dom),
            dow: echo(dow),
        });
    }
    if dom.starts_with("L-") {
        return Err(ScheduleError::QuartzLastOffset { field: echo(dom) });
    }
    // Quartz's lone `L` in day of week is Saturday (7).
    let dow_text = if dow == "L" { "7" } else { dow };
    let mut text: Vec<&str> = fields.clone();
    text[5] = dow_text;
    let parser = CronParser::builder()
        .seconds(Seconds::Required)
        .year(Year::Optional)
        .alternative_weekdays(true)
        .sloppy_ranges(true)
        // One of the day fields is `?` (every day): AND is Quartz's rule.
        .dom_and_dow(true)
        .build();
    let cron = parser
        .parse(&text.join(" "))
        .map_err(|e| ScheduleError::CronSyntax {
            reason: format!("(Quartz dialect) {e}"),
        })?;
    Ok(ParsedCron {
        cron,
        tz,
        wall_clock: !hour.starts_with('*'),
    })
}

fn parse_cron(expr: &str, tz: &str) -> Result<ParsedCron, ScheduleError> {
    check_text(expr)?;
    let tz = parse_tz(tz)?;
    let text = expand_nickname(expr.trim())?;
    let fields: Vec<&str> = text.split_ascii_whitespace().collect();
    let (hour, dom, dow) = match fields.as_slice() {
        [] => return Err(ScheduleError::CronEmpty),
        [_, hour, dom, _, dow] => (*hour, *dom, *dow),
        [_, _, hour, dom, _, dow] | [_, _, hour, dom, _, dow, _] => (*hour, *dom, *dow),
        other => return Err(ScheduleError::CronFieldCount { got: other.len() }),
    };
    // `croner` ORs the day fields unless one is exactly `*`; Vixie cron
    // ANDs them as soon as one starts with `*` (e.g. `*/2`). Asking croner
    // for AND in that case gives the Vixie rule, since a bare `*` matches all.
    let vixie_and = [dom, dow]
        .iter()
        .any(|f| f.starts_with('*') || f.starts_with('?'));
    let parser = CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Optional)
        .dom_and_dow(vixie_and)
        .build();
    let cron = parser.parse(text).map_err(|e| ScheduleError::CronSyntax {
        reason: e.to_string(),
    })?;
    Ok(ParsedCron {
        cron,
        tz,
        wall_clock: !hour.starts_with('*'),
    })
}

/// Replaces a nickname by its five-field form; other text is returned as is.
fn expand_nickname(text: &str) -> Result<&str, ScheduleError> {
    if !text.starts_with('@') {
        return Ok(text);
    }
    let expanded = match text.to_ascii_lowercase().as_str() {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        _ => return Err(ScheduleError::CronUnknownNickname { name: echo(text) }),
    };
    Ok(expanded)
}

/// Parses an IANA zone name; the empty string means UTC.
fn parse_tz(tz: &str) -> Result<Tz, ScheduleError> {
    if tz.is_empty() {
        return Ok(Tz::UTC);
    }
    tz.parse::<Tz>()
        .map_err(|_| ScheduleError::UnknownTimeZone { tz: echo(tz) })
}

/// Bounds user text quoted in errors, so messages stay short in logs.
fn echo(text: &str) -> String {
    text.chars().take(ECHO_CHARS).collect()
}

/// Parses a human duration: "200ms", "5s", "1m", "1h30m", "2d", also combinations like "1m30s"; rejects zero, negatives, empty, overflow, unknown units. Returns milliseconds. Error message names the rule.
///
/// Grammar: one or more `<digits><unit>` groups with units `d`, `h`, `m`,
/// `s`, `ms`, each at most once and in that (descending) order, so that a
/// typo such as `1h1h` or `30s1m` is reported instead of silently summed.
/// Surrounding whitespace is ignored.
///
/// # Errors
/// The rule the text breaks: empty, negative, zero, overflow, syntax or unit.
pub fn parse_duration_ms(s: &str) -> Result<u64, ScheduleError> {
    let text = s.trim();
    if text.is_empty() {
        return Err(ScheduleError::DurationEmpty);
    }
    if text.starts_with('-') {
        return Err(ScheduleError::DurationNegative { input: echo(text) });
    }
    let syntax = |reason: String| ScheduleError::DurationSyntax {
        input: echo(text),
        reason,
    };
    let overflow = || ScheduleError::DurationOverflow { input: echo(text) };
    let (mut rest, mut total, mut last_rank) = (text, 0u64, usize::MAX);
    while !rest.is_empty() {
        // Digits and unit letters are ASCII, so these byte counts are char
        // boundaries and the splits cannot panic.
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(syntax(format!("expected a number at \"{}\"", echo(rest))));
        }
        let (number, tail) = rest.split_at(digits);
        let letters = tail.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, tail) = tail.split_at(letters);
        let (rank, unit_ms) = duration_unit(unit).ok_or_else(|| {
            syntax(format!(
                "unknown or missing unit \"{}\" after {number} (expected d, h, m, s or ms)",
                echo(unit)
            ))
        })?;
        if rank >= last_rank {
            return Err(syntax(
                "units must appear once each, in the order d, h, m, s, ms".into(),
            ));
        }
        let value: u64 = number.parse().map_err(|_| overflow())?;
        total = value
            .checked_mul(unit_ms)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(overflow)?;
        (rest, last_rank) = (tail, rank);
    }
    if total == 0 {
        return Err(ScheduleError::DurationZero { input: echo(text) });
    }
    Ok(total)
}

/// A unit's rank (larger units rank higher) and its length in ms.
fn duration_unit(unit: &str) -> Option<(usize, u64)> {
    match unit {
        "ms" => Some((0, 1)),
        "s" => Some((1, 1_000)),
        "m" => Some((2, 60_000)),
        "h" => Some((3, 3_600_000)),
        "d" => Some((4, 86_400_000)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{NaiveDate, Utc};
    use std::collections::BTreeSet;

    #[test]
    fn a_union_marks_the_dst_shift_of_its_cron_member_even_at_a_shared_instant() {
        let utc = |d, h| {
            Utc.with_ymd_and_hms(2026, 3, d, h, 0, 0)
                .unwrap()
                .timestamp_millis()
        };
        // The cron's 02:30 shifts to 03:00 EDT = 07:00 UTC on 2026-03-08,
        // which the hourly schedule (anchored at 12:00 UTC) also matches.
        let union = Schedule::Union(vec![
            Schedule::Every {
                every_ms: 3_600_000,
                anchor_ms: utc(7, 12),
            },
            Schedule::Cron {
                expr: "30 2 * * *".into(),
                tz: "America/New_York".into(),
            },
        ]);
        let next = union.preview(utc(8, 5), 3).unwrap();
        assert_eq!(next, vec![utc(8, 6), utc(8, 7), utc(8, 8)], "07:00 once");
        let note = union
            .dst_note(utc(8, 7))
            .expect("the shifted cron occurrence");
        assert!(note.contains("does not exist on 2026-03-08"), "{note}");
        assert_eq!(union.dst_note(utc(8, 8)), None, "the hourly one alone");
    }

    #[test]
    fn dst_notes_mark_occurrences_a_gap_shifts_and_a_repeat_fires_once() {
        let ny = |expr: &str| Schedule::Cron {
            expr: expr.into(),
            tz: "America/New_York".into(),
        };
        let utc = |y, m, d, h, min| {
            Utc.with_ymd_and_hms(y, m, d, h, min, 0)
                .unwrap()
                .timestamp_millis()
        };
        // 2026-03-08: 02:00 EST jumps to 03:00 EDT. 02:30 fires at 03:00 EDT = 07:00 UTC.
        let daily = ny("30 2 * * *");
        let gap = daily.next_after(utc(2026, 3, 7, 12, 0)).unwrap().unwrap();
        assert_eq!(gap, utc(2026, 3, 8, 7, 0));
        let note = daily.dst_note(gap).expect("the gap is marked");
        assert!(
            note.contains("does not exist on 2026-03-08") && note.contains("03:00:00"),
            "{note}"
        );
        let next_day = daily.next_after(gap).unwrap().unwrap();
        assert_eq!(
            daily.dst_note(next_day),
            None,
            "an ordinary day is not marked"
        );
        // 2026-11-01: 02:00 EDT falls back to 01:00 EST; 01:30 happens twice, fires once.
        let repeat = ny("30 1 * * *");
        let once = repeat
            .next_after(utc(2026, 10, 31, 12, 0))
            .unwrap()
            .unwrap();
        assert_eq!(once, utc(2026, 11, 1, 5, 30), "the first pass, EDT");
        let note = repeat.dst_note(once).expect("the repeat is marked");
        assert!(
            note.contains("01:30:00 occurs twice on 2026-11-01"),
            "{note}"
        );
        // Interval jobs fire by real time: nothing to mark.
        let every = ny("*/30 * * * *");
        let t = every.next_after(utc(2026, 3, 8, 6, 50)).unwrap().unwrap();
        assert_eq!(every.dst_note(t), None);
        assert_eq!(
            Schedule::Every {
                every_ms: 1000,
                anchor_ms: 0
            }
            .dst_note(1000),
            None
        );
    }

    #[test]
    fn the_parse_cache_changes_no_result_and_keeps_no_error() {
        let cron = |expr: &str, tz: &str| Schedule::Cron {
            expr: expr.into(),
            tz: tz.into(),
        };
        let a = cron("0 30 2 * * *", "Europe/Berlin");
        let first = a.preview(0, 5).unwrap();
        for _ in 0..3 {
            assert_eq!(a.preview(0, 5).unwrap(), first);
        }
        // Same expression, other zone: its own entry, other instants.
        let b = cron("0 30 2 * * *", "UTC");
        assert_ne!(b.preview(0, 5).unwrap(), first);
        assert!(cron("61 * * * * *", "UTC").next_after(0).is_err());
        assert!(cron("61 * * * * *", "UTC").next_after(0).is_err());
        // Past the bound the cache empties and refills with the same answers.
        for i in 0..CRON_CACHE_MAX + 10 {
            let expr = format!("{} {} {} * * *", i % 60, (i / 60) % 60, i / 3600);
            cron(&expr, "UTC").next_after(0).unwrap();
        }
        assert_eq!(a.preview(0, 5).unwrap(), first);
    }

    /// Unix ms of a UTC calendar time.
    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> i64 {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s)
            .unwrap()
            .timestamp_millis()
    }

    fn cron(expr: &str, tz: &str) -> Schedule {
        Schedule::Cron {
            expr: expr.into(),
            tz: tz.into(),
        }
    }

    fn preview(expr: &str, tz: &str, after: i64, n: usize) -> Vec<i64> {
        cron(expr, tz).preview(after, n).unwrap()
    }

    fn err(s: &Schedule) -> String {
        s.validate().unwrap_err().to_string()
    }

    // ---- Quartz dialect -----------------------------------------------

    fn quartz(expr: &str) -> Schedule {
        Schedule::Quartz {
            expr: expr.into(),
            tz: String::new(),
        }
    }

    fn quartz_preview(expr: &str, after: i64, n: usize) -> Vec<i64> {
        quartz(expr).preview(after, n).unwrap()
    }

    /// The examples of Quartz's CronTrigger tutorial, read as Quartz reads
    /// them (2026-01-01 is a Thursday).
    #[test]
    fn quartz_tutorial_examples() {
        let t0 = utc(2026, 1, 1, 0, 0, 0);
        let at = |mo, d, h, mi| utc(2026, mo, d, h, mi, 0);
        // 12 pm every day.
        assert_eq!(
            quartz_preview("0 0 12 * * ?", t0, 2),
            vec![at(1, 1, 12, 0), at(1, 2, 12, 0)]
        );
        // 10:15 every day, day of week given with '?' in day of month.
        assert_eq!(
            quartz_preview("0 15 10 ? * *", t0, 1),
            vec![at(1, 1, 10, 15)]
        );
        // Every 5 minutes from 14:00 to 14:55 ("0/5" starts at 0).
        let every5 = quartz_preview("0 0/5 14 * * ?", t0, 13);
        assert_eq!(every5[0], at(1, 1, 14, 0));
        assert_eq!(every5[11], at(1, 1, 14, 55));
        assert_eq!(every5[12], at(1, 2, 14, 0));
        // 14:10 and 14:44 every Wednesday in March.
        assert_eq!(
            quartz_preview("0 10,44 14 ? 3 WED", t0, 3),
            vec![at(3, 4, 14, 10), at(3, 4, 14, 44), at(3, 11, 14, 10)]
        );
        // 10:15 Monday to Friday: Thursday 1st, Friday 2nd, Monday 5th.
        assert_eq!(
            quartz_preview("0 15 10 ? * MON-FRI", t0, 3),
            vec![at(1, 1, 10, 15), at(1, 2, 10, 15), at(1, 5, 10, 15)]
        );
        // The last day of the month.
        assert_eq!(
            quartz_preview("0 15 10 L * ?", t0, 2),
            vec![at(1, 31, 10, 15), at(2, 28, 10, 15)]
        );
        // 6 is Friday in Quartz: the last Friday, the third Friday.
        assert_eq!(
            quartz_preview("0 15 10 ? * 6L", t0, 3),
            vec![at(1, 30, 10, 15), at(2, 27, 10, 15), at(3, 27, 10, 15)]
        );
        assert_eq!(
            quartz_preview("0 15 10 ? * 6#3", t0, 2),
            vec![at(1, 16, 10, 15), at(2, 20, 10, 15)]
        );
        // Every 5 days from the 1st of the month.
        assert_eq!(
            quartz_preview("0 0 12 1/5 * ?", t0, 3),
            vec![at(1, 1, 12, 0), at(1, 6, 12, 0), at(1, 11, 12, 0)]
        );
        // Every November 11th at 11:11.
        assert_eq!(
            quartz_preview("0 11 11 11 11 ?", t0, 1),
            vec![at(11, 11, 11, 11)]
        );
        // With a year: only in 2027.
        assert_eq!(
            quartz_preview("0 15 10 * * ? 2027", t0, 1),
            vec![utc(2027, 1, 1, 10, 15, 0)]
        );
        // Weekday numbers: 1 is Sunday, 7 Saturday; a lone L is Saturday.
        assert_eq!(quartz_preview("0 0 9 ? * 1", t0, 1), vec![at(1, 4, 9, 0)]);
        assert_eq!(quartz_preview("0 0 9 ? * 7", t0, 1), vec![at(1, 3, 9, 0)]);
        assert_eq!(quartz_preview("0 0 9 ? * L", t0, 1), vec![at(1, 3, 9, 0)]);
        // The seed's ElasticJob example: every 5 seconds.
        assert_eq!(
            quartz_preview("0/5 * * * * ?", t0, 2),
            vec![t0 + 5_000, t0 + 10_000]
        );
    }

    #[test]
    fn the_same_text_means_other_days_in_the_two_dialects() {
        let t0 = utc(2026, 1, 1, 0, 0, 0);
        // Unix reads 6 as Saturday: the last Saturday of January is the 31st.
        assert_eq!(
            preview("0 15 10 * * 6L", "", t0, 1),
            vec![utc(2026, 1, 31, 10, 15, 0)]
        );
        assert_eq!(
            quartz_preview("0 15 10 ? * 6L", t0, 1),
            vec![utc(2026, 1, 30, 10, 15, 0)]
        );
        assert!(looks_like_quartz("0 15 10 ? * 6L"));
        assert!(looks_like_quartz("0 15 10 1 * ? 2027"));
        assert!(!looks_like_quartz("15 10 * * 5"));
        assert!(!looks_like_quartz("0 15 10 * * 5"));
    }

    #[test]
    fn a_vertical_tab_cannot_hide_an_empty_list_item() {
        // Found by the cron fuzz target: croner splits on \x0b, which ASCII
        // whitespace does not include, and then searched to the year 4999.
        let expr = " \x0b5 \x0b\x0b,\x0b* * * *\x0b";
        for s in [cron(expr, "UTC"), quartz(expr)] {
            assert_eq!(err(&s), ScheduleError::CronControlChar.to_string());
        }
        assert!(cron("0\t9 * * *", "UTC").validate().is_ok());
    }

    #[test]
    fn quartz_refusals_name_the_rule() {
        let e = err(&quartz("15 10 * * ?"));
        assert!(e.contains("6 fields") && e.contains("got 5"), "{e}");
        let e = err(&quartz("0 15 10 * * 6"));
        assert!(
            e.contains("exactly one of day-of-month and day-of-week must be '?'"),
            "{e}"
        );
        let e = err(&quartz("0 15 10 ? * ?"));
        assert!(e.contains("exactly one"), "{e}");
        let e = err(&quartz("0 15 10 L-2 * ?"));
        assert!(e.contains("L-n"), "{e}");
        let e = err(&quartz("0 15 10 ? * 0"));
        assert!(e.contains("Quartz dialect"), "{e}");
        assert_eq!(err(&quartz("")), ScheduleError::CronEmpty.to_string());
    }

    // ---- cron dialect -------------------------------------------------

    #[test]
    fn five_six_and_seven_field_forms() {
        let t0 = utc(2026, 1, 1, 0, 0, 0);
        assert_eq!(
            preview("15 10 * * *", "", t0, 1),
            vec![utc(2026, 1, 1, 10, 15, 0)]
        );
        assert_eq!(
            preview("5 15 10 * * *", "", t0, 1),
            vec![utc(2026, 1, 1, 10, 15, 5)]
        );
        assert_eq!(
            preview("5 15 10 1 1 * 2028", "", t0, 2),
            vec![utc(2028, 1, 1, 10, 15, 5)]
        );
        assert_eq!(
            preview("*/20 * * * * *", "", t0, 3),
            vec![t0 + 20_000, t0 + 40_000, t0 + 60_000]
        );
        assert_eq!(
            preview("0 9 * JAN MON-FRI", "", t0, 2),
            vec![utc(2026, 1, 1, 9, 0, 0), utc(2026, 1, 2, 9, 0, 0)]
        );
    }

    #[test]
    fn field_count_and_syntax_errors_are_clear() {
        assert_eq!(
            err(&cron("0 0 * *", "")),
            "schedule.cron.expr: expected 5, 6 or 7 fields, got 4"
        );
        assert_eq!(
            err(&cron("0 0 0 * * * * *", "")),
            "schedule.cron.expr: expected 5, 6 or 7 fields, got 8"
        );
        assert_eq!(
            err(&cron("   ", "")),
            "schedule.cron.expr: must not be empty"
        );
        assert_eq!(err(&cron("", "")), "schedule.cron.expr: must not be empty");
        assert!(err(&cron("61 * * * *", "")).starts_with("schedule.cron.expr: "));
        assert!(err(&cron("0 0 * * 1#6", "")).starts_with("schedule.cron.expr: "));
        assert!(err(&cron("0/5 * * * *", "")).starts_with("schedule.cron.expr: "));
        assert_eq!(
            err(&cron("0 0 * * +1", "")),
            ScheduleError::CronPlusModifier.to_string()
        );
        assert_eq!(
            err(&cron("0 0 * * é", "")),
            "schedule.cron.expr: must contain only ASCII characters"
        );
        let long = format!("0 0 * * {}", "1,".repeat(130));
        assert_eq!(
            err(&cron(&long, "")),
            format!(
                "schedule.cron.expr: must be at most 256 bytes, got {}",
                long.len()
            )
        );
    }

    #[test]
    fn nicknames() {
        let t0 = utc(2026, 1, 1, 0, 30, 0); // a Thursday
        assert_eq!(
            preview("@hourly", "", t0, 1),
            vec![utc(2026, 1, 1, 1, 0, 0)]
        );
        assert_eq!(preview("@daily", "", t0, 1), vec![utc(2026, 1, 2, 0, 0, 0)]);
        assert_eq!(
            preview("@midnight", "", t0, 1),
            vec![utc(2026, 1, 2, 0, 0, 0)]
        );
        assert_eq!(
            preview("@weekly", "", t0, 1),
            vec![utc(2026, 1, 4, 0, 0, 0)]
        );
        assert_eq!(
            preview("@monthly", "", t0, 1),
            vec![utc(2026, 2, 1, 0, 0, 0)]
        );
        assert_eq!(
            preview("@yearly", "", t0, 1),
            vec![utc(2027, 1, 1, 0, 0, 0)]
        );
        assert_eq!(
            preview("@ANNUALLY", "", t0, 1),
            vec![utc(2027, 1, 1, 0, 0, 0)]
        );
        assert!(err(&cron("@fortnightly", "")).contains("unknown nickname \"@fortnightly\""));
    }

    #[test]
    fn last_day_of_month() {
        let got = preview("0 0 L * *", "", utc(2026, 1, 1, 0, 0, 0), 3);
        assert_eq!(
            got,
            vec![
                utc(2026, 1, 31, 0, 0, 0),
                utc(2026, 2, 28, 0, 0, 0),
                utc(2026, 3, 31, 0, 0, 0)
            ]
        );
        let leap = preview("0 0 L 2 *", "", utc(2027, 6, 1, 0, 0, 0), 1);
        assert_eq!(leap, vec![utc(2028, 2, 29, 0, 0, 0)]);
    }

    #[test]
    fn nearest_weekday() {
        // 2026-01-15 is a Thursday; 2026-02-15 and 2026-03-15 are Sundays.
        let got = preview("0 0 15W * *", "", utc(2026, 1, 1, 0, 0, 0), 3);
        assert_eq!(
            got,
            vec![
                utc(2026, 1, 15, 0, 0, 0),
                utc(2026, 2, 16, 0, 0, 0),
                utc(2026, 3, 16, 0, 0, 0)
            ]
        );
        // 2026-08-15 is a Saturday: the Friday before.
        assert_eq!(
            preview("0 0 15W * *", "", utc(2026, 8, 1, 0, 0, 0), 1),
            vec![utc(2026, 8, 14, 0, 0, 0)]
        );
        // Last weekday: 2026-01-31 is a Saturday, 2026-02-27 a Friday.
        assert_eq!(
            preview("0 0 LW * *", "", utc(2026, 1, 1, 0, 0, 0), 2),
            vec![utc(2026, 1, 30, 0, 0, 0), utc(2026, 2, 27, 0, 0, 0)]
        );
    }

    #[test]
    fn nth_and_last_weekday() {
        let t0 = utc(2026, 1, 1, 0, 0, 0);
        let third_friday = preview("0 0 * * 5#3", "", t0, 3);
        assert_eq!(
            third_friday,
            vec![
                utc(2026, 1, 16, 0, 0, 0),
                utc(2026, 2, 20, 0, 0, 0),
                utc(2026, 3, 20, 0, 0, 0)
            ]
        );
        let last_friday = preview("0 0 * * 5L", "", t0, 3);
        assert_eq!(
            last_friday,
            vec![
                utc(2026, 1, 30, 0, 0, 0),
                utc(2026, 2, 27, 0, 0, 0),
                utc(2026, 3, 27, 0, 0, 0)
            ]
        );
        assert_eq!(
            preview("0 0 * * FRI#L", "", t0, 1),
            vec![utc(2026, 1, 30, 0, 0, 0)]
        );
    }

    #[test]
    fn dom_and_dow_combine_with_or() {
        // Every 13th and every Friday: Fri 2, Fri 9, Tue 13, Fri 16, ..., Fri 13 Feb once.
        let got = preview("0 0 13 * 5", "", utc(2026, 1, 1, 0, 0, 0), 8);
        let days = [
            (1, 2),
            (1, 9),
            (1, 13),
            (1, 16),
            (1, 23),
            (1, 30),
            (2, 6),
            (2, 13),
        ];
        let want: Vec<i64> = days
            .iter()
            .map(|&(m, d)| utc(2026, m, d, 0, 0, 0))
            .collect();
        assert_eq!(got, want);
        assert_eq!(
            preview("0 0 13 * 5", "", utc(2026, 2, 13, 0, 0, 0), 1),
            vec![utc(2026, 2, 20, 0, 0, 0)]
        );
    }

    #[test]
    fn star_prefixed_day_field_means_and_as_in_vixie() {
        // Odd days that are Mondays: Jan 5 (odd, Monday) is the first in 2026.
        let got = preview("0 0 */2 * 1", "", utc(2026, 1, 1, 0, 0, 0), 3);
        assert_eq!(
            got,
            vec![
                utc(2026, 1, 5, 0, 0, 0),
                utc(2026, 1, 19, 0, 0, 0),
                utc(2026, 2, 9, 0, 0, 0)
            ]
        );
        let q = preview("0 0 ? * 1", "", utc(2026, 1, 1, 0, 0, 0), 1);
        assert_eq!(q, vec![utc(2026, 1, 5, 0, 0, 0)]);
    }

    #[test]
    fn time_zones() {
        let t0 = utc(2026, 1, 1, 0, 0, 0);
        assert_eq!(
            preview("0 9 * * *", "", t0, 1),
            preview("0 9 * * *", "UTC", t0, 1)
        );
        assert_eq!(
            preview("0 9 * * *", "America/New_York", t0, 1),
            vec![utc(2026, 1, 1, 14, 0, 0)]
        );
        assert_eq!(
            preview("0 9 * * *", "Asia/Kolkata", t0, 1),
            vec![utc(2026, 1, 1, 3, 30, 0)]
        );
        assert_eq!(
            err(&cron("0 9 * * *", "Mars/Olympus")),
            "schedule.cron.tz: unknown IANA time zone \"Mars/Olympus\""
        );
        assert!(cron("0 9 * * *", "america/new_york").validate().is_err());
    }

    // ---- daylight saving time -----------------------------------------

    #[test]
    fn new_york_spring_forward_fires_once_after_the_gap() {
        // 2026-03-08: 02:00 EST -> 03:00 EDT at 07:00Z; 02:30 does not exist.
        let got = preview(
            "30 2 * * *",
            "America/New_York",
            utc(2026, 3, 7, 12, 0, 0),
            3,
        );
        assert_eq!(
            got,
            vec![
                utc(2026, 3, 8, 7, 0, 0),
                utc(2026, 3, 9, 6, 30, 0),
                utc(2026, 3, 10, 6, 30, 0)
            ]
        );
        // Several skipped times collapse into one firing at 03:00 EDT, which
        // is also where the regular 03:00 match falls.
        let got = preview(
            "0,30 2,3 * * *",
            "America/New_York",
            utc(2026, 3, 8, 5, 0, 0),
            3,
        );
        assert_eq!(
            got,
            vec![
                utc(2026, 3, 8, 7, 0, 0),
                utc(2026, 3, 8, 7, 30, 0),
                utc(2026, 3, 9, 6, 0, 0)
            ]
        );
        // A multi-valued hour field gets the same rule (croner alone skips it).
        let got = preview(
            "30 2,14 * * *",
            "America/New_York",
            utc(2026, 3, 8, 0, 0, 0),
            2,
        );
        assert_eq!(
            got,
            vec![utc(2026, 3, 8, 7, 0, 0), utc(2026, 3, 8, 18, 30, 0)]
        );
        let got = preview(
            "*/20 2 * * *",
            "America/New_York",
            utc(2026, 3, 8, 0, 0, 0),
            2,
        );
        assert_eq!(
            got,
            vec![utc(2026, 3, 8, 7, 0, 0), utc(2026, 3, 9, 6, 0, 0)]
        );
    }

    #[test]
    fn new_york_fall_back_fires_once_at_first_pass() {
        // 2026-11-01: 02:00 EDT -> 01:00 EST at 06:00Z; 01:30 is 05:30Z and 06:30Z.
        let got = preview(
            "30 1 * * *",
            "America/New_York",
            utc(2026, 10, 31, 12, 0, 0),
            3,
        );
        assert_eq!(
            got,
            vec![
                utc(2026, 11, 1, 5, 30, 0),
                utc(2026, 11, 2, 6, 30, 0),
                utc(2026, 11, 3, 6, 30, 0)
            ]
        );
        let got = preview(
            "30 1,13 * * *",
            "America/New_York",
            utc(2026, 11, 1, 0, 0, 0),
            2,
        );
        assert_eq!(
            got,
            vec![utc(2026, 11, 1, 5, 30, 0), utc(2026, 11, 1, 18, 30, 0)]
        );
        // Asked from inside the second pass, the repeated time is not re-fired.
        let ny = |e: &str, t| cron(e, "America/New_York").next_after(t).unwrap();
        assert_eq!(
            ny("30 1 * * *", utc(2026, 11, 1, 6, 10, 0)),
            Some(utc(2026, 11, 2, 6, 30, 0))
        );
        assert_eq!(
            ny("50 1 * * *", utc(2026, 11, 1, 6, 10, 0)),
            Some(utc(2026, 11, 2, 6, 50, 0))
        );
        assert_eq!(
            ny("0 2 * * *", utc(2026, 11, 1, 6, 10, 0)),
            Some(utc(2026, 11, 1, 7, 0, 0))
        );
        assert_eq!(
            ny("50 1 * * *", utc(2026, 11, 1, 5, 40, 0)),
            Some(utc(2026, 11, 1, 5, 50, 0))
        );
    }

    #[test]
    fn berlin_transitions() {
        // 2026-03-29 02:00 CET -> 03:00 CEST at 01:00Z.
        let got = preview("30 2 * * *", "Europe/Berlin", utc(2026, 3, 28, 12, 0, 0), 2);
        assert_eq!(
            got,
            vec![utc(2026, 3, 29, 1, 0, 0), utc(2026, 3, 30, 0, 30, 0)]
        );
        // 2026-10-25 03:00 CEST -> 02:00 CET at 01:00Z; 02:30 is 00:30Z and 01:30Z.
        let got = preview(
            "30 2 * * *",
            "Europe/Berlin",
            utc(2026, 10, 24, 12, 0, 0),
            2,
        );
        assert_eq!(
            got,
            vec![utc(2026, 10, 25, 0, 30, 0), utc(2026, 10, 26, 1, 30, 0)]
        );
        let got = cron("30 2 * * *", "Europe/Berlin")
            .next_after(utc(2026, 10, 25, 1, 0, 0))
            .unwrap();
        assert_eq!(got, Some(utc(2026, 10, 26, 1, 30, 0)));
    }

    #[test]
    fn hourly_fires_every_real_hour_across_transitions() {
        let hours = |from: i64, n: usize| {
            (0..n as i64)
                .map(|k| from + k * 3_600_000)
                .collect::<Vec<_>>()
        };
        // New York fall-back: 00:00 EDT, 01:00 EDT, 01:00 EST, 02:00 EST, ...
        let got = preview(
            "0 * * * *",
            "America/New_York",
            utc(2026, 11, 1, 3, 30, 0),
            5,
        );
        assert_eq!(got, hours(utc(2026, 11, 1, 4, 0, 0), 5));
        // New York spring-forward: 01:00 EST then 03:00 EDT, one real hour apart.
        let got = preview(
            "0 * * * *",
            "America/New_York",
            utc(2026, 3, 8, 5, 30, 0),
            3,
        );
        assert_eq!(got, hours(utc(2026, 3, 8, 6, 0, 0), 3));
        let got = preview(
            "0 * * * *",
            "Europe/Berlin",
            utc(2026, 10, 24, 22, 30, 0),
            5,
        );
        assert_eq!(got, hours(utc(2026, 10, 24, 23, 0, 0), 5));
        let got = preview(
            "*/15 * * * *",
            "America/New_York",
            utc(2026, 11, 1, 5, 50, 0),
            6,
        );
        let quarter: Vec<i64> = (0..6)
            .map(|k| utc(2026, 11, 1, 6, 0, 0) + k * 900_000)
            .collect();
        assert_eq!(got, quarter);
    }

    #[test]
    fn a_skipped_day_fires_once_after_it() {
        // Pacific/Apia skipped 2011-12-30 entirely (UTC-10 -> UTC+14 at 10:00Z).
        let got = preview("0 9 * * *", "Pacific/Apia", utc(2011, 12, 29, 0, 0, 0), 3);
        assert_eq!(
            got,
            vec![
                utc(2011, 12, 29, 19, 0, 0),
                utc(2011, 12, 30, 10, 0, 0),
                utc(2011, 12, 30, 19, 0, 0)
            ]
        );
    }

    /// Reference model by brute force over every second, with a linear (not
    /// binary) search for gap ends: the firing instants in `[from_s, to_s]`.
    fn brute_force(expr: &str, tz_name: &str, from_s: i64, to_s: i64) -> Vec<i64> {
        let p = parse_cron(expr, tz_name).unwrap();
        let mut fired = BTreeSet::new();
        if p.wall_clock {
            // Offsets change by at most 3 h around these windows.
            let start = local_wall_clock(p.tz, from_s).unwrap() - chrono::TimeDelta::hours(3);
            for k in 0..(to_s - from_s + 6 * 3600) {
                let wall = start + chrono::TimeDelta::seconds(k);
                if p.cron.is_time_matching(&wall).unwrap() {
                    fired.insert(reference_instant(p.tz, wall));
                }
            }
        } else {
            for s in from_s..=to_s {
                let local = utc_instant(s).unwrap().with_timezone(&p.tz);
                if p.cron.is_time_matching(&local).unwrap() {
                    fired.insert(s);
                }
            }
        }
        fired
            .into_iter()
            .filter(|s| (from_s..=to_s).contains(s))
            .collect()
    }

    fn reference_instant(tz: Tz, wall: NaiveDateTime) -> i64 {
        let mut probe = wall;
        loop {
            match tz.from_local_datetime(&probe) {
                LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => return t.timestamp(),
                LocalResult::None => probe += chrono::TimeDelta::seconds(1),
            }
        }
    }

    #[test]
    fn matches_brute_force_reference_around_transitions() {
        let windows = [
            ("America/New_York", utc(2026, 3, 8, 4, 0, 0)),
            ("America/New_York", utc(2026, 11, 1, 3, 0, 0)),
            ("Europe/Berlin", utc(2026, 3, 28, 22, 0, 0)),
            ("Europe/Berlin", utc(2026, 10, 24, 22, 0, 0)),
            ("Australia/Lord_Howe", utc(2026, 4, 4, 12, 0, 0)), // 30-minute fall-back
            ("Australia/Lord_Howe", utc(2026, 10, 3, 13, 0, 0)), // 30-minute gap
        ];
        let exprs = [
            "30 2 * * *",
            "30 1 * * *",
            "0 * * * *",
            "*/15 * * * *",
            "30 2,14 * * *",
            "*/20 1,2 * * *",
            "15,45 1-3 * * *",
            "0 */2 * * *",
            "*/30 * * * * *",
            "10 30 2 * * *",
            "* 1 * * *",
        ];
        for (tz, from) in windows {
            let (from_s, to_s) = (from / 1000, from / 1000 + 6 * 3600);
            for expr in exprs {
                check_against_reference(expr, tz, from_s, to_s);
            }
        }
    }

    fn check_against_reference(expr: &str, tz: &str, from_s: i64, to_s: i64) {
        let reference = brute_force(expr, tz, from_s, to_s);
        let schedule = cron(expr, tz);
        let mut t = from_s;
        while t < to_s {
            for offset_ms in [0, 1, 999] {
                let after = t * 1000 + offset_ms;
                let want = reference.iter().find(|&&s| s * 1000 > after);
                let Some(&want) = want else { continue };
                let got = schedule.next_after(after).unwrap();
                assert_eq!(got, Some(want * 1000), "{expr} in {tz} after {after}");
            }
            t += 97; // co-prime with minutes, so starts sample every second offset
        }
    }

    #[test]
    fn occurrences_strictly_increase_across_transitions() {
        let exprs = [
            "30 1 * * *",
            "0 * * * *",
            "*/7 * * * *",
            "30 2 * * *",
            "* 1,2 * * *",
            "@daily",
        ];
        for tz in ["America/New_York", "Europe/Berlin", "Australia/Lord_Howe"] {
            for expr in exprs {
                for (m, d) in [(3, 7), (3, 28), (4, 4), (10, 3), (10, 24), (10, 31)] {
                    let got = preview(expr, tz, utc(2026, m, d, 0, 0, 0), 300);
                    assert!(got.windows(2).all(|w| w[0] < w[1]), "{expr} in {tz}");
                }
            }
        }
    }

    #[test]
    fn sub_second_and_negative_inputs() {
        let s = cron("* * * * * *", "");
        assert_eq!(s.next_after(1_500).unwrap(), Some(2_000));
        assert_eq!(s.next_after(1_000).unwrap(), Some(2_000));
        assert_eq!(s.next_after(-1_500).unwrap(), Some(-1_000));
        assert_eq!(s.next_after(-1).unwrap(), Some(0));
        let daily = cron("0 0 * * *", "");
        assert_eq!(daily.next_after(-1).unwrap(), Some(0));
        assert_eq!(
            daily.next_after(utc(1900, 6, 1, 12, 0, 0)).unwrap(),
            Some(utc(1900, 6, 2, 0, 0, 0))
        );
    }

    #[test]
    fn impossible_and_past_patterns_terminate_with_none() {
        let t0 = utc(2026, 1, 1, 0, 0, 0);
        for expr in [
            "0 0 30 2 *",
            "0 0 31 4 *",
            "* * 30 2 *",
            "0 0 0 1 1 * 2020",
            "0 0 * * L",
        ] {
            assert_eq!(
                cron(expr, "America/New_York").next_after(t0).unwrap(),
                None,
                "{expr}"
            );
            assert_eq!(
                cron(expr, "").preview(t0, 5).unwrap(),
                Vec::<i64>::new(),
                "{expr}"
            );
        }
        assert_eq!(
            preview("0 0 0 1 1 * 2020-2027", "", t0, 5),
            vec![utc(2027, 1, 1, 0, 0, 0)]
        );
    }

    #[test]
    fn horizon_edges_do_not_panic() {
        let edges = [
            i64::MIN,
            i64::MIN + 1,
            HORIZON_START_MS - 1,
            HORIZON_START_MS,
            -1,
            0,
            1,
            HORIZON_END_MS - 1,
            HORIZON_END_MS,
            i64::MAX - 1,
            i64::MAX,
        ];
        let schedules = [
            cron("0 0 * * *", "Pacific/Kiritimati"),
            cron("*/5 * * * *", "America/Adak"),
            cron("30 2 * * *", "America/New_York"),
            cron("0 0 0 29 2 * 4999", ""),
            Schedule::Every {
                every_ms: MAX_EVERY_MS,
                anchor_ms: i64::MAX,
            },
            Schedule::Every {
                every_ms: 1,
                anchor_ms: i64::MIN,
            },
            Schedule::Once { at_ms: i64::MAX },
        ];
        for s in &schedules {
            for after in edges {
                if let Some(next) = s.next_after(after).unwrap() {
                    assert!(next > after);
                }
            }
        }
        assert_eq!(cron("0 0 * * *", "").next_after(i64::MAX).unwrap(), None);
        assert_eq!(
            cron("0 0 * * *", "").next_after(i64::MIN).unwrap(),
            Some(HORIZON_START_MS + 86_400_000)
        );
    }

    #[test]
    fn horizon_constants_match_their_dates() {
        assert_eq!(HORIZON_START_MS, utc(1, 1, 1, 0, 0, 0));
        assert_eq!(HORIZON_END_MS, utc(5000, 1, 1, 0, 0, 0));
        assert_eq!(MAX_EVERY_MS, 315_360_000_000);
        let wall = NaiveDate::from_ymd_opt(2026, 3, 8)
            .unwrap()
            .and_hms_opt(2, 30, 0)
            .unwrap();
        assert_eq!(
            gap_end(chrono_tz::America::New_York, wall).unwrap() * 1000,
            utc(2026, 3, 8, 7, 0, 0)
        );
    }

    // ---- fixed rate and one-shot ----------------------------------------

    #[test]
    fn every_is_anchored_and_does_not_drift() {
        let (anchor, every) = (1_700_000_000_123_i64, 90_000_u64);
        let s = Schedule::Every {
            every_ms: every,
            anchor_ms: anchor,
        };
        let e = every as i64;
        assert_eq!(s.next_after(anchor + 3 * e).unwrap(), Some(anchor + 4 * e));
        assert_eq!(s.next_after(anchor).unwrap(), Some(anchor + e));
        assert_eq!(s.next_after(anchor - 1_000_000).unwrap(), Some(anchor + e));
        assert_eq!(s.next_after(anchor + e - 1).unwrap(), Some(anchor + e));
        assert_eq!(
            s.next_after(anchor + 1_000_000 * e + 1).unwrap(),
            Some(anchor + 1_000_001 * e)
        );
        let got = s.preview(anchor + 10, 3).unwrap();
        assert_eq!(got, vec![anchor + e, anchor + 2 * e, anchor + 3 * e]);
        let near_end = Schedule::Every {
            every_ms: 10,
            anchor_ms: i64::MAX - 15,
        };
        assert_eq!(
            near_end.next_after(i64::MAX - 15).unwrap(),
            Some(i64::MAX - 5)
        );
        assert_eq!(near_end.next_after(i64::MAX - 5).unwrap(), None);
    }

    #[test]
    fn every_limits() {
        let every = |every_ms| Schedule::Every {
            every_ms,
            anchor_ms: 0,
        };
        assert_eq!(err(&every(0)), "schedule.every_ms: must be at least 1 ms");
        assert!(every(1).validate().is_ok());
        assert!(every(MAX_EVERY_MS).validate().is_ok());
        assert_eq!(
            err(&every(MAX_EVERY_MS + 1)),
            "schedule.every_ms: must be at most 315360000000 ms (10 years), got 315360000001"
        );
        assert!(every(0).next_after(0).is_err());
        assert!(every(0).preview(0, 1).is_err());
    }

    #[test]
    fn once() {
        let s = Schedule::Once { at_ms: 5_000 };
        assert!(s.is_one_shot());
        assert!(!cron("* * * * *", "").is_one_shot());
        assert!(!Schedule::Every {
            every_ms: 1,
            anchor_ms: 0
        }
        .is_one_shot());
        assert_eq!(s.next_after(4_999).unwrap(), Some(5_000));
        assert_eq!(s.next_after(5_000).unwrap(), None);
        assert_eq!(s.next_after(9_000).unwrap(), None);
        assert_eq!(s.preview(0, 10).unwrap(), vec![5_000]);
        assert_eq!(
            err(&Schedule::Once { at_ms: 0 }),
            "schedule.at_ms: must be greater than 0, got 0"
        );
        assert!(Schedule::Once { at_ms: -1 }.validate().is_err());
    }

    #[test]
    fn preview_count_limits() {
        let s = cron("* * * * * *", "");
        assert_eq!(s.preview(0, 0).unwrap(), Vec::<i64>::new());
        let got = s.preview(0, MAX_PREVIEW).unwrap();
        assert_eq!(got.len(), MAX_PREVIEW);
        assert!(got.windows(2).all(|w| w[0] < w[1]));
        let e = s.preview(0, MAX_PREVIEW + 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            "preview.count: must be at most 1000, got 1001"
        );
    }

    // ---- durations ------------------------------------------------------

    #[test]
    fn durations_parse() {
        let cases = [
            ("200ms", 200),
            ("5s", 5_000),
            ("1m", 60_000),
            ("1h30m", 5_400_000),
            ("2d", 172_800_000),
            ("1m30s", 90_000),
            ("1d2h3m4s5ms", 93_784_005),
            (" 90s ", 90_000),
            ("0h5m", 300_000),
            ("18446744073709551615ms", u64::MAX),
        ];
        for (text, ms) in cases {
            assert_eq!(parse_duration_ms(text), Ok(ms), "{text}");
        }
    }

    #[test]
    fn durations_reject_with_the_rule() {
        assert_eq!(
            parse_duration_ms("").unwrap_err().to_string(),
            "duration: must not be empty"
        );
        assert_eq!(
            parse_duration_ms(" ").unwrap_err(),
            ScheduleError::DurationEmpty
        );
        assert_eq!(
            parse_duration_ms("0s").unwrap_err().to_string(),
            "duration \"0s\": must be greater than zero"
        );
        assert_eq!(
            parse_duration_ms("-5s").unwrap_err().to_string(),
            "duration \"-5s\": must not be negative"
        );
        let over = parse_duration_ms("18446744073709551616ms").unwrap_err();
        assert!(matches!(over, ScheduleError::DurationOverflow { .. }));
        assert!(matches!(
            parse_duration_ms("9999999999999999d"),
            Err(ScheduleError::DurationOverflow { .. })
        ));
        let unit = parse_duration_ms("5y").unwrap_err().to_string();
        assert!(unit.contains("unknown or missing unit \"y\""), "{unit}");
        assert!(parse_duration_ms("5")
            .unwrap_err()
            .to_string()
            .contains("unknown or missing unit \"\""));
        assert!(parse_duration_ms("30s1m")
            .unwrap_err()
            .to_string()
            .contains("in the order d, h, m, s, ms"));
        assert!(parse_duration_ms("1h1h").is_err());
        assert!(parse_duration_ms("1.5h").is_err());
        assert!(parse_duration_ms("h")
            .unwrap_err()
            .to_string()
            .contains("expected a number"));
        assert!(parse_duration_ms("+5s").is_err());
        assert!(parse_duration_ms("5 s").is_err());
    }

    // ---- robustness -----------------------------------------------------

    /// Found by the `proto_spec` fuzz target: croner takes `,` as an empty
    /// minute list, and the never-matching check at validation then searched
    /// wall-clock time to the year 4999 (over 20 s per command).
    #[test]
    fn an_empty_list_item_is_a_syntax_error_not_a_search() {
        for expr in [
            ", 1 * * ?",
            ", * * * *",
            "1, 1 * * *",
            "0 ,1 * * *",
            "0 1,,2 * * *",
            "0 1 * * 1,",
            "0 0 1 1 * * ,",
        ] {
            let err = cron(expr, "UTC").validate().unwrap_err();
            assert!(
                matches!(&err, ScheduleError::CronSyntax { reason } if reason.contains("empty list item")),
                "{expr}: {err}"
            );
        }
        assert!(cron("0 1,2 * * 1-5", "UTC").validate().is_ok());
    }

    #[test]
    fn odd_inputs_never_panic() {
        let odd = [
            "*",
            "* *",
            "@",
            "@@daily",
            "L",
            "W",
            "#",
            "0 0 L-3 * *",
            "0 0 * * 5#",
            "0 0 * * #5",
            "0 0 LW * *",
            "0 0 W * *",
            "0 0 32W * *",
            "0 0 * * 8",
            "0 0 * * 7",
            "*/0 * * * *",
            "*/ * * * *",
            "1-/2 * * * *",
            "-1 * * * *",
            "0 0 * * 1-7#5",
            "0 0 * * L#L",
            "0 0 0 1 1 * 0",
            "0 0 0 1 1 * 5001",
            "0 0 0 1 1 * 99999999999999999999",
            "65535 * * * *",
            "0 0 1,,2 * *",
            "0 0 , * *",
            "\t0\n0 * * *",
            "0 0 * * MON-SUN",
            "0 0 * * SUN-MON",
            "0 0 ?? * *",
            "0 0 * * ?L",
            "0 0 * * 5L#2",
            "\0",
            "0 0 * * 1/0",
        ];
        for expr in odd {
            for tz in [
                "",
                "UTC",
                "Pacific/Apia",
                "\0",
                "../../etc/passwd",
                "America/New_York ",
            ] {
                let s = cron(expr, tz);
                let _ = s.validate();
                let _ = s.next_after(utc(2026, 1, 1, 0, 0, 0));
            }
            let _ = parse_duration_ms(expr);
        }
    }

    #[test]
    fn random_inputs_never_panic() {
        // Deterministic pseudo-random strings (xorshift) over the cron alphabet.
        let alphabet: Vec<char> = "0123456789*/,-LW#? @+ MONFRIJANSUN".chars().collect();
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..400 {
            let text: String = (0..(state % 24) as usize)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    alphabet[(state % alphabet.len() as u64) as usize]
                })
                .collect();
            let _ = cron(&text, "Europe/Berlin").next_after(utc(2026, 10, 25, 0, 0, 0));
            let _ = parse_duration_ms(&text);
        }
    }

    #[test]
    fn results_are_deterministic() {
        let s = cron("*/7 1,2 * * *", "Europe/Berlin");
        let t0 = utc(2026, 10, 24, 0, 0, 0);
        assert_eq!(s.preview(t0, 200).unwrap(), s.preview(t0, 200).unwrap());
    }
}
