//! Validation of client input. Pure; runs at the edge before proposing and
//! again in apply, so a bad command is refused with a message naming the
//! field and the rule, and writes nothing.

use super::command::CommandError;
use super::schedule::Schedule;
use super::types::{
    limits, Bounds, Fanout, Jitter, JobSpec, Labels, Overlap, Policy, Role, Route, ScheduleInput,
    Token,
};
use super::workflow::Workflow;

const TEN_YEARS_MS: u64 = 10 * 366 * 24 * 3600 * 1000;

fn invalid(msg: String) -> CommandError {
    CommandError::Invalid(msg)
}

/// Ids: 1 to 128 bytes of `[A-Za-z0-9._:-]`.
pub fn name(field: &str, s: &str, max: usize) -> Result<(), CommandError> {
    if s.is_empty() {
        return Err(invalid(format!("{field}: must not be empty")));
    }
    if s.len() > max {
        return Err(invalid(format!(
            "{field}: at most {max} bytes, got {}",
            s.len()
        )));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
    {
        return Err(invalid(format!(
            "{field}: character {c:?} not allowed (use A-Z a-z 0-9 . _ : -)"
        )));
    }
    Ok(())
}

pub fn job_id(id: &str) -> Result<(), CommandError> {
    name("id", id, limits::ID_MAX_BYTES)
}

/// Validates a schedule as given; `now_ms` is the cluster time, for one-shots in the past.
pub fn schedule(s: &ScheduleInput, now_ms: i64) -> Result<(), CommandError> {
    match s {
        ScheduleInput::Every { every_ms } => {
            if *every_ms == 0 || *every_ms > TEN_YEARS_MS {
                return Err(invalid(format!(
                    "schedule.every: must be between 1 ms and 10 years, got {every_ms} ms"
                )));
            }
        }
        ScheduleInput::After { after_ms } => {
            if *after_ms > TEN_YEARS_MS {
                return Err(invalid(format!(
                    "schedule.after: at most 10 years, got {after_ms} ms"
                )));
            }
        }
        ScheduleInput::At { at_ms } => {
            if *at_ms < now_ms.saturating_sub(limits::ONE_SHOT_PAST_TOLERANCE_MS) {
                return Err(invalid(format!(
                    "schedule.at: {at_ms} is {} ms in the past (at most {} ms allowed)",
                    // Exact in i128: `at_ms` may be as far back as i64::MIN.
                    i128::from(now_ms) - i128::from(*at_ms),
                    limits::ONE_SHOT_PAST_TOLERANCE_MS
                )));
            }
        }
        ScheduleInput::Cron { .. } | ScheduleInput::Quartz { .. } | ScheduleInput::Upstream => {}
    }
    let resolved: Schedule = s.resolve(now_ms);
    resolved.validate().map_err(|e| invalid(e.to_string()))?;
    if let Schedule::Cron { .. } | Schedule::Quartz { .. } = resolved {
        // A pattern that never matches would cost a search to the end of
        // the calendar on every later look; refuse it once, here.
        let next = resolved
            .next_after(now_ms)
            .map_err(|e| invalid(e.to_string()))?;
        if next.is_none() {
            return Err(invalid(format!(
                "schedule.cron.expr: never matches after {now_ms} (a date that does not exist, such as February 30, or a past year)"
            )));
        }
    }
    Ok(())
}

pub fn job_spec(spec: &JobSpec, now_ms: i64) -> Result<(), CommandError> {
    job_spec_with(spec, now_ms, true)
}

/// As [`job_spec`], optionally leaving the schedule unchecked (an update that keeps it).
pub fn job_spec_with(
    spec: &JobSpec,
    now_ms: i64,
    check_schedule: bool,
) -> Result<(), CommandError> {
    job_id(&spec.id)?;
    name("group", &spec.group, limits::GROUP_MAX_BYTES)?;
    if spec.payload.len() > limits::PAYLOAD_MAX_BYTES {
        return Err(invalid(format!(
            "payload: at most {} bytes, got {}",
            limits::PAYLOAD_MAX_BYTES,
            spec.payload.len()
        )));
    }
    if check_schedule {
        schedule(&spec.schedule, now_ms)?;
        also(spec, now_ms)?;
    }
    policy(&spec.policy)?;
    bounds(&spec.bounds)?;
    job_labels(&spec.labels)?;
    if let Some(n) = spec.max_concurrent {
        if n == 0 || n > limits::ACTIVE_RUNS_MAX {
            return Err(invalid(format!(
                "max_concurrent: must be between 1 and {}, got {n}",
                limits::ACTIVE_RUNS_MAX
            )));
        }
    }
    if let Some(j) = spec.jitter {
        jitter(j, &spec.resolve_schedule(now_ms), now_ms)?;
    }
    if let Some(n) = spec.catch_up_max {
        if n == 0 || n > limits::CATCH_UP_MAX {
            return Err(invalid(format!(
                "catch_up_max: must be between 1 and {}, got {n}",
                limits::CATCH_UP_MAX
            )));
        }
    }
    workflow(&spec.id, &spec.schedule, spec.workflow.as_ref())
}

/// A job's schedules after the first: at most `SCHEDULES_MAX - 1`, each a
/// valid recurring schedule (cron, Quartz or `every`) and none a repeat;
/// the first must then be recurring too (a one-shot or upstream-only job
/// has one schedule).
pub fn also(spec: &JobSpec, now_ms: i64) -> Result<(), CommandError> {
    if spec.also.is_empty() {
        return Ok(());
    }
    if spec.also.len() >= limits::SCHEDULES_MAX {
        return Err(invalid(format!(
            "also: at most {} more schedules ({} in all), got {}",
            limits::SCHEDULES_MAX - 1,
            limits::SCHEDULES_MAX,
            spec.also.len()
        )));
    }
    let recurring = |s: &ScheduleInput| {
        matches!(
            s,
            ScheduleInput::Cron { .. } | ScheduleInput::Quartz { .. } | ScheduleInput::Every { .. }
        )
    };
    if !recurring(&spec.schedule) {
        return Err(invalid(
            "also: only a cron, Quartz or every schedule may have more schedules \
             (a one-shot or upstream-only job has one)"
                .into(),
        ));
    }
    for (i, s) in spec.also.iter().enumerate() {
        if !recurring(s) {
            return Err(invalid(format!(
                "also[{i}]: must be a cron, Quartz or every schedule (a one-shot or \
                 upstream-only schedule cannot be one of several)"
            )));
        }
        schedule(s, now_ms).map_err(|e| invalid(format!("also[{i}]: {e}")))?;
        if *s == spec.schedule || spec.also[..i].contains(s) {
            return Err(invalid(format!(
                "also[{i}]: repeats another of the job's schedules"
            )));
        }
    }
    Ok(())
}

/// A jitter is 1 ms to `JITTER_MAX_MS`, and shorter than the gap between
/// consecutive occurrences: the `every` interval, or for cron, Quartz and
/// several schedules the smallest gap among the next `JITTER_GAPS_CHECKED` occurrences after
/// `now_ms`. So an occurrence always fires before the next one's nominal
/// time, and fire times keep the schedule's order.
pub fn jitter(j: Jitter, s: &Schedule, now_ms: i64) -> Result<(), CommandError> {
    if j.ms == 0 || j.ms > limits::JITTER_MAX_MS {
        return Err(invalid(format!(
            "jitter: must be between 1 ms and 1 h ({} ms), got {} ms",
            limits::JITTER_MAX_MS,
            j.ms
        )));
    }
    let gap = match s {
        Schedule::Upstream => {
            return Err(invalid(
                "jitter: a job without a schedule of its own has no occurrence to delay".into(),
            ))
        }
        Schedule::Once { .. } => return Ok(()),
        Schedule::Every { every_ms, .. } => *every_ms,
        cron_or_union => smallest_gap(cron_or_union, now_ms)?,
    };
    if j.ms >= gap {
        return Err(invalid(format!(
            "jitter: must be shorter than the schedule's gap between occurrences ({gap} ms), got {} ms",
            j.ms
        )));
    }
    Ok(())
}

/// The smallest gap between the next `JITTER_GAPS_CHECKED` occurrences of
/// a cron schedule or a union (`u64::MAX` when fewer than two remain).
fn smallest_gap(s: &Schedule, now_ms: i64) -> Result<u64, CommandError> {
    let next = s
        .preview(now_ms, limits::JITTER_GAPS_CHECKED)
        .map_err(|e| invalid(e.to_string()))?;
    Ok(next
        .windows(2)
        .map(|w| u64::try_from(i128::from(w[1]) - i128::from(w[0])).unwrap_or(u64::MAX))
        .min()
        .unwrap_or(u64::MAX))
}

/// Upstreams: 1 to `UPSTREAMS_MAX` valid job ids, distinct, not the job
/// itself; a job without a schedule of its own needs them. What the state
/// decides (they exist, no cycle) is apply's.
pub fn workflow(
    id: &str,
    schedule: &ScheduleInput,
    wf: Option<&Workflow>,
) -> Result<(), CommandError> {
    let Some(wf) = wf else {
        if *schedule == ScheduleInput::Upstream {
            return Err(invalid(format!(
                "upstream: a job without a schedule of its own needs 1 to {} upstream jobs",
                limits::UPSTREAMS_MAX
            )));
        }
        return Ok(());
    };
    let n = wf.upstream.len();
    if n == 0 || n > limits::UPSTREAMS_MAX {
        return Err(invalid(format!(
            "upstream: must list 1 to {} job ids, got {n}",
            limits::UPSTREAMS_MAX
        )));
    }
    for (i, u) in wf.upstream.iter().enumerate() {
        job_id(u).map_err(|e| invalid(format!("upstream[{i}]: {e}")))?;
        if u == id {
            return Err(invalid(format!(
                "upstream: a job cannot be its own upstream ({id:?})"
            )));
        }
        if wf.upstream[..i].contains(u) {
            return Err(invalid(format!("upstream: {u:?} is listed twice")));
        }
    }
    Ok(())
}

/// `end_at` after `start_at`, `max_runs` from 1 to `MAX_RUNS_MAX`.
/// Whether the end is still ahead is checked where the bounds change
/// ([`bounds_ahead`]): a finished job keeps its past end.
pub fn bounds(b: &Bounds) -> Result<(), CommandError> {
    if let (Some(start), Some(end)) = (b.start_at_ms, b.end_at_ms) {
        if end <= start {
            return Err(invalid(format!(
                "end_at_ms: must be after start_at_ms ({start}), got {end}"
            )));
        }
    }
    match b.max_runs {
        Some(n) if n == 0 || n > limits::MAX_RUNS_MAX => Err(invalid(format!(
            "max_runs: must be between 1 and {}, got {n}",
            limits::MAX_RUNS_MAX
        ))),
        _ => Ok(()),
    }
}

/// New or changed bounds: an end already past would finish the job at once.
pub fn bounds_ahead(b: &Bounds, now_ms: i64) -> Result<(), CommandError> {
    match b.end_at_ms {
        Some(end) if end <= now_ms => Err(invalid(format!(
            "end_at_ms: must be in the future (cluster time {now_ms}), got {end}"
        ))),
        _ => Ok(()),
    }
}

/// A job's labels: at most `JOB_LABELS_MAX`, keys and values in
/// Kubernetes' syntax (`[prefix/]name`, value empty or a name).
pub fn job_labels(labels: &Labels) -> Result<(), CommandError> {
    if labels.len() > limits::JOB_LABELS_MAX {
        return Err(invalid(format!(
            "job_labels: at most {}, got {}",
            limits::JOB_LABELS_MAX,
            labels.len()
        )));
    }
    for (k, v) in labels {
        label_key("job_labels (key)", k)?;
        label_value("job_labels (value)", v)?;
    }
    Ok(())
}

/// `[prefix/]name`: prefix a DNS subdomain of at most 253 characters,
/// name as [`label_value`] but not empty.
pub fn label_key(field: &str, k: &str) -> Result<(), CommandError> {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= limits::LABEL_PREFIX_MAX
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            });
        if !ok {
            return Err(invalid(format!(
                "{field}: prefix {p:?} must be a DNS subdomain of at most {} characters (a-z 0-9 - .)",
                limits::LABEL_PREFIX_MAX
            )));
        }
    }
    if name.is_empty() {
        return Err(invalid(format!("{field}: name of {k:?} must not be empty")));
    }
    label_value(field, name)
}

/// Empty, or at most 63 characters of `[A-Za-z0-9._-]` that begin and end
/// with a letter or digit.
pub fn label_value(field: &str, v: &str) -> Result<(), CommandError> {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if v.len() > limits::LABEL_NAME_MAX {
        return Err(invalid(format!(
            "{field}: at most {} characters, got {}",
            limits::LABEL_NAME_MAX,
            v.len()
        )));
    }
    let chars_ok = v
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    let well_formed = chars_ok && alnum(v.chars().next()) && alnum(v.chars().last());
    if !(v.is_empty() || well_formed) {
        return Err(invalid(format!(
            "{field}: {v:?} must be A-Z a-z 0-9 . _ - and begin and end with a letter or digit"
        )));
    }
    Ok(())
}

/// A pause note: at most `PAUSE_NOTE_MAX_BYTES`.
pub fn pause_note(note: &str) -> Result<(), CommandError> {
    if note.len() > limits::PAUSE_NOTE_MAX_BYTES {
        return Err(invalid(format!(
            "note: at most {} bytes, got {}",
            limits::PAUSE_NOTE_MAX_BYTES,
            note.len()
        )));
    }
    Ok(())
}

fn policy(p: &Policy) -> Result<(), CommandError> {
    priority_and_retries(p)?;
    route(&p.route)?;
    fanout(p)?;
    history_limits(p)
}

fn history_limits(p: &Policy) -> Result<(), CommandError> {
    if p.keep_runs == 0 || p.keep_runs > limits::KEEP_RUNS_MAX {
        return Err(invalid(format!(
            "keep_runs: must be between 1 and {}, got {}",
            limits::KEEP_RUNS_MAX,
            p.keep_runs
        )));
    }
    if p.keep_for_ms > limits::KEEP_FOR_MAX_MS {
        return Err(invalid(format!(
            "keep_for: at most 10 years, got {} ms",
            p.keep_for_ms
        )));
    }
    Ok(())
}

fn priority_and_retries(p: &Policy) -> Result<(), CommandError> {
    if !(1..=10).contains(&p.priority) {
        return Err(invalid(format!(
            "priority: must be between 1 and 10, got {}",
            p.priority
        )));
    }
    if p.max_attempts == 0 || p.max_attempts > limits::MAX_ATTEMPTS_MAX {
        return Err(invalid(format!(
            "max_attempts: must be between 1 and {}, got {}",
            limits::MAX_ATTEMPTS_MAX,
            p.max_attempts
        )));
    }
    if p.timeout_ms == 0 || p.timeout_ms > limits::TIMEOUT_MAX_MS {
        return Err(invalid(format!(
            "timeout: must be between 1 ms and 7 days, got {} ms",
            p.timeout_ms
        )));
    }
    if p.backoff_ms > limits::BACKOFF_MAX_MS {
        return Err(invalid(format!(
            "backoff: at most 1 day, got {} ms",
            p.backoff_ms
        )));
    }
    if p.misfire_grace_ms > TEN_YEARS_MS {
        return Err(invalid(format!(
            "misfire_grace: at most 10 years, got {} ms",
            p.misfire_grace_ms
        )));
    }
    Ok(())
}

/// A label selector: 1 to 16 pairs, each key and value a name of at most 128 bytes.
fn route(r: &Route) -> Result<(), CommandError> {
    let Route::Label(selector) = r else {
        return Ok(());
    };
    if selector.is_empty() || selector.len() > limits::SELECTOR_MAX {
        return Err(invalid(format!(
            "labels: route label needs 1 to {} key=value pairs, got {}",
            limits::SELECTOR_MAX,
            selector.len()
        )));
    }
    for (k, v) in selector {
        name("labels (key)", k, limits::LABEL_MAX_BYTES)?;
        name("labels (value)", v, limits::LABEL_MAX_BYTES)?;
    }
    Ok(())
}

fn fanout(p: &Policy) -> Result<(), CommandError> {
    match p.fanout {
        Fanout::Shards(n) if n == 0 || n > limits::SHARDS_MAX => Err(invalid(format!(
            "shards: must be between 1 and {}, got {n}",
            limits::SHARDS_MAX
        ))),
        // The buffered occurrence starts when a Finish is applied, which
        // carries no worker count: broadcast cannot know its width then.
        Fanout::Broadcast if matches!(p.overlap, Overlap::BufferOne | Overlap::BufferAll) => {
            Err(invalid(
                "overlap: buffer-one and buffer-all cannot be combined with broadcast; use forbid, \
                 replace or allow"
                    .to_string(),
            ))
        }
        // The width the leader reports is per group; a label-filtered
        // broadcast would create more runs than there are matching workers.
        Fanout::Broadcast if matches!(p.route, Route::Label(_)) => Err(invalid(
            "route: label cannot be combined with broadcast (the worker count is per group); use a group per label".to_string(),
        )),
        _ => Ok(()),
    }
}

/// Labels a worker announces in its Hello: at most 16, names of at most 128 bytes.
pub fn worker_labels<'a>(
    labels: impl ExactSizeIterator<Item = (&'a String, &'a String)>,
) -> Result<(), CommandError> {
    if labels.len() > limits::SELECTOR_MAX {
        return Err(invalid(format!(
            "hello.labels: at most {}, got {}",
            limits::SELECTOR_MAX,
            labels.len()
        )));
    }
    for (k, v) in labels {
        name("hello.labels (key)", k, limits::LABEL_MAX_BYTES)?;
        name("hello.labels (value)", v, limits::LABEL_MAX_BYTES)?;
    }
    Ok(())
}

/// A token as PutToken carries it: a valid name, a SHA-256 hex hash, and
/// groups exactly when the role is `worker`.
pub fn token(t: &Token) -> Result<(), CommandError> {
    name("token.name", &t.name, limits::ID_MAX_BYTES)?;
    if t.hash.len() != 64
        || !t
            .hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(invalid(
            "token.hash: must be 64 lowercase hex digits (SHA-256)".into(),
        ));
    }
    match (t.role, t.groups.len()) {
        (Role::Worker, 0) => {
            return Err(invalid(
                "token.groups: a worker token needs at least one group".into(),
            ))
        }
        (Role::Worker, n) if n > limits::TOKEN_GROUPS_MAX => {
            return Err(invalid(format!(
                "token.groups: at most {}, got {n}",
                limits::TOKEN_GROUPS_MAX
            )))
        }
        (Role::Worker, _) => {}
        (role, n) if n > 0 => {
            return Err(invalid(format!(
                "token.groups: only worker tokens have groups, this one is {}",
                role.as_str()
            )))
        }
        _ => {}
    }
    for g in &t.groups {
        name("token.groups", g, limits::GROUP_MAX_BYTES)?;
    }
    Ok(())
}

/// A client request id: 1 to 64 bytes of `A-Z a-z 0-9 - _`.
pub fn request_id(id: &str) -> Result<(), CommandError> {
    if id.is_empty() || id.len() > limits::REQUEST_ID_MAX_BYTES {
        return Err(invalid(format!(
            "request_id: 1 to {} bytes, got {}",
            limits::REQUEST_ID_MAX_BYTES,
            id.len()
        )));
    }
    match id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
    {
        Some(c) => Err(invalid(format!(
            "request_id: character {c:?} not allowed (use A-Z a-z 0-9 - _)"
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::types::Policy;

    fn spec() -> JobSpec {
        JobSpec {
            id: "job-1".into(),
            schedule: ScheduleInput::Every { every_ms: 1000 },
            group: "g".into(),
            payload: vec![],
            policy: Policy::default(),
            bounds: Bounds::default(),
            labels: Labels::new(),
            workflow: None,
            max_concurrent: None,
            jitter: None,
            catch_up_max: None,
            also: Vec::new(),
        }
    }

    fn err(spec: &JobSpec) -> String {
        job_spec(spec, 1_000_000).unwrap_err().to_string()
    }

    #[test]
    fn each_rule_names_its_field() {
        assert!(job_spec(&spec(), 1_000_000).is_ok());
        let mut s = spec();
        s.id = String::new();
        assert!(err(&s).starts_with("id: must not be empty"));
        s.id = "x".repeat(129);
        assert!(err(&s).starts_with("id: at most 128"));
        s.id = "a@b".into();
        assert!(err(&s).contains("'@' not allowed"));
        let mut s = spec();
        s.group = String::new();
        assert!(err(&s).starts_with("group:"));
        let mut s = spec();
        s.payload = vec![0; limits::PAYLOAD_MAX_BYTES + 1];
        assert!(err(&s).starts_with("payload: at most 262144"));
        let mut s = spec();
        s.schedule = ScheduleInput::Every { every_ms: 0 };
        assert!(err(&s).starts_with("schedule.every"));
        s.schedule = ScheduleInput::At {
            at_ms: 1_000_000 - 61_000,
        };
        assert!(err(&s).starts_with("schedule.at:"));
        s.schedule = ScheduleInput::Cron {
            expr: "not a cron".into(),
            tz: String::new(),
        };
        assert!(err(&s).contains("schedule.cron"));
        s.schedule = ScheduleInput::Cron {
            expr: "* * * * *".into(),
            tz: "Mars/Olympus".into(),
        };
        assert!(err(&s).contains("Mars/Olympus"));
        let mut s = spec();
        s.policy.priority = 11;
        assert!(err(&s).starts_with("priority:"));
        s.policy.priority = 5;
        s.policy.max_attempts = 0;
        assert!(err(&s).starts_with("max_attempts:"));
    }

    #[test]
    fn history_limits_name_their_field_and_rule() {
        let mut s = spec();
        s.policy.keep_runs = 0;
        assert_eq!(err(&s), "keep_runs: must be between 1 and 100000, got 0");
        s.policy.keep_runs = limits::KEEP_RUNS_MAX + 1;
        assert_eq!(
            err(&s),
            "keep_runs: must be between 1 and 100000, got 100001"
        );
        s.policy.keep_runs = limits::KEEP_RUNS_MAX;
        s.policy.keep_for_ms = limits::KEEP_FOR_MAX_MS;
        assert!(job_spec(&s, 1_000_000).is_ok());
        s.policy.keep_for_ms = limits::KEEP_FOR_MAX_MS + 1;
        assert_eq!(err(&s), "keep_for: at most 10 years, got 316224000001 ms");
    }

    #[test]
    fn routing_and_fanout_rules_name_their_field() {
        let mut s = spec();
        s.policy.fanout = Fanout::Shards(0);
        assert_eq!(err(&s), "shards: must be between 1 and 1024, got 0");
        s.policy.fanout = Fanout::Shards(1025);
        assert_eq!(err(&s), "shards: must be between 1 and 1024, got 1025");
        s.policy.fanout = Fanout::Shards(1024);
        assert!(job_spec(&s, 1_000_000).is_ok());
        s.policy.fanout = Fanout::Broadcast;
        s.policy.overlap = Overlap::BufferOne;
        assert!(err(&s)
            .starts_with("overlap: buffer-one and buffer-all cannot be combined with broadcast"));
        s.policy.overlap = Overlap::Allow;
        s.policy.route = Route::Label([("zone".to_string(), "eu".to_string())].into());
        assert!(err(&s).starts_with("route: label cannot be combined with broadcast"));
        let mut s = spec();
        s.policy.route = Route::Label(Default::default());
        assert!(err(&s).starts_with("labels: route label needs 1 to 16"));
        s.policy.route = Route::Label([("zone".to_string(), "eu west".to_string())].into());
        assert!(err(&s).starts_with("labels (value): character ' '"));
        s.policy.route = Route::Label([("zone".to_string(), "eu-west".to_string())].into());
        assert!(job_spec(&s, 1_000_000).is_ok());
    }
}
