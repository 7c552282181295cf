//! Domain types of the replicated state. They derive serde for the bincode
//! encoding on disk and in the log; wire (protobuf) types are converted in
//! `grpc::convert` and never appear here. Maps are ordered so encodings are
//! deterministic.

use bincode::error::DecodeError;
use serde::{Deserialize, Serialize};

use super::codec::{
    decode_with_tail, decode_with_three_tails, encode_with_tail, encode_with_three_tails, has_tail,
    tails,
};
pub use super::workflow::{Cycle, OnUpstreamFailure, Seen, TriggerRule, Workflow};

pub use super::backfill::{Backfill, BackfillOverlap};
pub use super::schedule::Schedule;

/// Limits shared by validation and documentation (README "Limits").
pub mod limits {
    pub const ID_MAX_BYTES: usize = 128;
    pub const GROUP_MAX_BYTES: usize = 128;
    pub const PAYLOAD_MAX_BYTES: usize = 256 * 1024;
    pub const RESULT_MAX_BYTES: usize = 512 * 1024;
    pub const ERROR_MAX_BYTES: usize = 4 * 1024;
    pub const FIRE_BATCH_MAX: usize = 4096;
    pub const FINISH_BATCH_MAX: usize = 4096;
    /// Lease expiries in one Expire command.
    pub const EXPIRE_BATCH_MAX: usize = 4096;
    /// Client commands grouped into one log entry.
    pub const PROPOSAL_BATCH_MAX: usize = 1024;
    /// Bytes of one grouped log entry (client commands, finishes, assigns):
    /// a batch is cut when the next item would pass it. With openraft's 64
    /// entries per AppendEntries this keeps a peer message under its cap.
    pub const ENTRY_MAX_BYTES: usize = 1 << 20;
    pub const PAGE_SIZE_MAX: usize = 1000;
    /// Bytes of run results, errors and notes in one ListRuns page.
    pub const LIST_PAGE_MAX_BYTES: usize = 4 << 20;
    pub const PAGE_SIZE_DEFAULT: usize = 100;
    pub const PREVIEW_MAX: usize = 1000;
    pub const MAX_ATTEMPTS_MAX: u32 = 100;
    pub const TIMEOUT_MAX_MS: u64 = 7 * 24 * 3600 * 1000;
    pub const BACKOFF_MAX_MS: u64 = 24 * 3600 * 1000;
    /// One-shot timers further in the past than this are rejected.
    pub const ONE_SHOT_PAST_TOLERANCE_MS: i64 = 60_000;
    /// Bound on occurrences a misfire policy walks through in one apply.
    pub const MISFIRE_WALK_MAX: u32 = 10_000;
    pub const DEFAULT_GRACE_MS: u64 = 60_000;
    pub const DEFAULT_TIMEOUT_MS: u64 = 60_000;
    pub const DEFAULT_BACKOFF_MS: u64 = 1_000;
    pub const DEFAULT_PRIORITY: u8 = 5;
    /// Finished run records a job keeps unless its `keep_runs` says
    /// otherwise: creating one more deletes the oldest finished record
    /// (active runs are never deleted).
    pub const KEEP_RUNS_DEFAULT: u64 = 10_000;
    /// The most a job's `keep_runs` may be.
    pub const KEEP_RUNS_MAX: u64 = 100_000;
    /// The longest a job's `keep_for` may be (10 years).
    pub const KEEP_FOR_MAX_MS: u64 = 10 * 366 * 24 * 3600 * 1000;
    /// Run records one `Housekeep` command may delete (runs of deleted
    /// jobs, runs past their job's `keep_runs` or `keep_for`).
    pub const HOUSEKEEP_DELETES_MAX: u32 = 4096;
    /// Jobs one `Housekeep` command looks at.
    pub const HOUSEKEEP_JOBS_MAX: usize = 256;
    /// Runs of one job not yet terminal. An occurrence that would exceed it
    /// is recorded skipped, and a manual retry is refused; so cancelling a
    /// job's runs (delete, `replace`) touches at most this many.
    pub const ACTIVE_RUNS_MAX: u32 = 4096;
    /// Request ids remembered for deduplication: at most this many, and
    /// none older than `DEDUP_TTL_MS` of state time. Expired ones are
    /// removed `DEDUP_EVICT_PER_COMMAND` at a time as new ones arrive.
    pub const DEDUP_MAX: u64 = 10_000;
    pub const DEDUP_TTL_MS: i64 = 10 * 60 * 1000;
    pub const DEDUP_EVICT_PER_COMMAND: usize = 8;
    pub const REQUEST_ID_MAX_BYTES: usize = 64;
    /// Jobs one `CreateJobs` call creates.
    pub const CREATE_BATCH_MAX: usize = 1000;
    /// Revision records kept per job id (the oldest go first).
    pub const JOB_REVISIONS_MAX: usize = 100;
    /// Tokens the cluster holds.
    pub const TOKENS_MAX: usize = 1000;
    /// Groups a worker token may name.
    pub const TOKEN_GROUPS_MAX: usize = 64;
    /// Runs per occurrence of a sharded job.
    pub const SHARDS_MAX: u32 = 1024;
    /// Runs per occurrence of a broadcast job (one per connected worker).
    pub const BROADCAST_MAX: u32 = 1024;
    /// Label pairs in a job's selector.
    pub const SELECTOR_MAX: usize = 16;
    /// Bytes of one label key or value.
    pub const LABEL_MAX_BYTES: usize = 128;
    /// Groups listed with their worker counts in one Fire or Trigger command.
    pub const WIDTHS_MAX: usize = 65_536;
    /// The most a job's `max_runs` may be.
    pub const MAX_RUNS_MAX: u64 = 1_000_000_000;
    /// Bytes of a pause note.
    pub const PAUSE_NOTE_MAX_BYTES: usize = 1024;
    /// Labels a job carries (`JobSpec::labels`, not the routing selector).
    pub const JOB_LABELS_MAX: usize = 16;
    /// Characters of a label key's name part and of a label value (Kubernetes).
    pub const LABEL_NAME_MAX: usize = 63;
    /// Characters of a label key's prefix (a DNS subdomain, Kubernetes).
    pub const LABEL_PREFIX_MAX: usize = 253;
    /// Pairs in a `job list` label selector.
    pub const LIST_SELECTOR_MAX: usize = 16;
    /// Jobs one filtered `ListJobs` page looks at: a page that reaches it
    /// returns what matched so far and a token to continue from.
    pub const LIST_SCAN_MAX: usize = 10_000;
    /// Occurrences that may wait under `buffer-all`; one more is recorded skipped.
    pub const BUFFER_ALL_MAX: usize = 256;
    /// Upstream jobs one job may declare.
    pub const UPSTREAMS_MAX: usize = 32;
    /// Jobs that may declare one job as their upstream.
    pub const DOWNSTREAMS_MAX: usize = 1024;
    /// Jobs a cycle check looks at before it refuses the change.
    pub const WORKFLOW_WALK_MAX: usize = 10_000;
    /// Bytes of the merged upstream results handed to a workflow run; an
    /// upstream whose result would pass it is named instead.
    pub const UPSTREAM_RESULTS_MAX_BYTES: usize = 4 << 20;
    /// Occurrences one backfill may cover; a longer range is refused.
    pub const BACKFILL_OCCURRENCES_MAX: u32 = 1000;
    /// Occurrences one backfill step creates (or finds already run).
    pub const BACKFILL_STEP_OCCURRENCES: u32 = 16;
    /// Time between a backfill's steps: with the step size, at most 64
    /// occurrences a second.
    pub const BACKFILL_STEP_MS: i64 = 250;
    /// Time to a backfill's next step while it waits for room; a run of the
    /// job ending brings the step forward, so this is only a safety net.
    pub const BACKFILL_WAIT_POLL_MS: i64 = 10_000;
    /// The longest a job's jitter may be (systemd's `RandomizedDelaySec`).
    pub const JITTER_MAX_MS: u64 = 3600 * 1000;
    /// Consecutive occurrences of a cron or Quartz schedule whose gaps a
    /// jitter is checked against (it must be shorter than the smallest).
    pub const JITTER_GAPS_CHECKED: usize = 64;
    /// Missed occurrences a late `fire-all` job runs after an outage unless
    /// its `catch_up_max` says otherwise; older ones are recorded skipped.
    /// Applies once the cluster writes log format 4 (before that, every
    /// member must decide as older releases do: all of them run).
    pub const CATCH_UP_DEFAULT: u32 = 100;
    /// The most a job's `catch_up_max` may be.
    pub const CATCH_UP_MAX: u32 = 10_000;
    /// Schedules one job may carry: its `schedule` and up to 7 in `also`.
    pub const SCHEDULES_MAX: usize = 8;
}

/// How the dispatcher picks a worker of the job's group for each attempt.
/// Routing is leader-only work: it never changes what apply decides.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Route {
    /// The free worker with the fewest attempts in flight.
    #[default]
    LeastLoaded,
    /// Free workers in turn (per group, in connection order).
    RoundRobin,
    /// Rendezvous hashing of the job id (and shard) over the group's
    /// connected worker ids: a job keeps its worker while that worker is
    /// connected, and only the jobs of a worker that leaves move.
    ConsistentHash,
    /// Only workers whose Hello labels contain every pair; least loaded among them.
    Label(std::collections::BTreeMap<String, String>),
}

impl Route {
    pub fn as_str(&self) -> &'static str {
        match self {
            Route::LeastLoaded => "least-loaded",
            Route::RoundRobin => "round-robin",
            Route::ConsistentHash => "consistent-hash",
            Route::Label(_) => "label",
        }
    }
}

/// How many runs one occurrence creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Fanout {
    /// One run.
    #[default]
    One,
    /// `n` runs with shard indexes `0..n` (1 ≤ n ≤ 1024).
    Shards(u32),
    /// One run per worker of the group connected at fire time; the leader
    /// puts that count into the Fire command, so apply stays deterministic.
    Broadcast,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Misfire {
    /// Every missed occurrence fires, late, in order.
    #[default]
    FireAll,
    /// Missed occurrences are coalesced into one run.
    FireOnce,
    /// Missed occurrences are recorded as skipped; the next future one fires.
    Skip,
}

impl Misfire {
    pub fn as_str(self) -> &'static str {
        match self {
            Misfire::FireAll => "fire-all",
            Misfire::FireOnce => "fire-once",
            Misfire::Skip => "skip",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Overlap {
    #[default]
    Allow,
    Forbid,
    BufferOne,
    Replace,
    /// Every occurrence that finds the job full waits, in order, and starts
    /// as runs end (at most `limits::BUFFER_ALL_MAX` wait; log format 3).
    BufferAll,
}

/// A schedule as the client gave it; `After` and `Every` are anchored to the
/// cluster time of the command that stores them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScheduleInput {
    Cron {
        expr: String,
        tz: String,
    },
    Every {
        every_ms: u64,
    },
    At {
        at_ms: i64,
    },
    After {
        after_ms: u64,
    },
    /// A cron expression in Quartz's dialect (see `schedule`'s module doc).
    Quartz {
        expr: String,
        tz: String,
    },
    /// No schedule of its own: the job runs when its upstreams complete a
    /// cycle (log format 3).
    Upstream,
}

impl ScheduleInput {
    pub fn resolve(&self, now_ms: i64) -> Schedule {
        match self {
            ScheduleInput::Cron { expr, tz } => Schedule::Cron {
                expr: expr.clone(),
                tz: tz.clone(),
            },
            ScheduleInput::Every { every_ms } => Schedule::Every {
                every_ms: *every_ms,
                anchor_ms: now_ms,
            },
            ScheduleInput::Quartz { expr, tz } => Schedule::Quartz {
                expr: expr.clone(),
                tz: tz.clone(),
            },
            ScheduleInput::At { at_ms } => Schedule::Once { at_ms: *at_ms },
            ScheduleInput::Upstream => Schedule::Upstream,
            ScheduleInput::After { after_ms } => Schedule::Once {
                at_ms: now_ms.saturating_add(i64::try_from(*after_ms).unwrap_or(i64::MAX)),
            },
        }
    }

    /// Whether `stored` is what this input would keep (so an update leaves the pending entry alone).
    pub fn matches(&self, stored: &Schedule) -> bool {
        match (self, stored) {
            (ScheduleInput::Cron { expr, tz }, Schedule::Cron { expr: e, tz: t }) => {
                expr == e && tz == t
            }
            (ScheduleInput::Quartz { expr, tz }, Schedule::Quartz { expr: e, tz: t }) => {
                expr == e && tz == t
            }
            (ScheduleInput::Every { every_ms }, Schedule::Every { every_ms: e, .. }) => {
                every_ms == e
            }
            (ScheduleInput::At { at_ms }, Schedule::Once { at_ms: a }) => at_ms == a,
            (ScheduleInput::Upstream, Schedule::Upstream) => true,
            // A relative one-shot keeps its resolved instant; give `at` to move it.
            (ScheduleInput::After { .. }, Schedule::Once { .. }) => true,
            _ => false,
        }
    }
}

/// Execution settings of a job, all validated and defaulted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    pub misfire: Misfire,
    pub misfire_grace_ms: u64,
    pub timeout_ms: u64,
    pub max_attempts: u32,
    pub backoff_ms: u64,
    pub priority: u8,
    pub overlap: Overlap,
    pub route: Route,
    pub fanout: Fanout,
    /// Run records kept: beyond this the oldest finished ones are deleted.
    pub keep_runs: u64,
    /// Finished runs older than this (by finish time) are deleted; 0 keeps
    /// them regardless of age.
    pub keep_for_ms: u64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            misfire: Misfire::FireAll,
            misfire_grace_ms: limits::DEFAULT_GRACE_MS,
            timeout_ms: limits::DEFAULT_TIMEOUT_MS,
            max_attempts: 1,
            backoff_ms: limits::DEFAULT_BACKOFF_MS,
            priority: limits::DEFAULT_PRIORITY,
            overlap: Overlap::Allow,
            route: Route::LeastLoaded,
            fanout: Fanout::One,
            keep_runs: limits::KEEP_RUNS_DEFAULT,
            keep_for_ms: 0,
        }
    }
}

/// When a job may fire (APScheduler `start_date`/`end_date`, Temporal):
/// no occurrence before `start_at_ms` or after `end_at_ms`, and at most
/// `max_runs` scheduled occurrences fired. `None` is unbounded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bounds {
    pub start_at_ms: Option<i64>,
    pub end_at_ms: Option<i64>,
    pub max_runs: Option<u64>,
}

/// Occurrences of a job fire up to `ms` after their nominal time (systemd
/// `RandomizedDelaySec`, Temporal's jitter), each at its own offset. The
/// `seed` is the leader's random draw when the job first got a jitter; it
/// travels in the command, so apply computes every offset without
/// randomness, the same on every replica and after any change of leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jitter {
    pub ms: u64,
    pub seed: u64,
}

impl Jitter {
    /// The offset of `job`'s occurrence nominally at `at_ms`, in `[0, ms)`:
    /// a keyed hash (SHA-256 of seed, job id and nominal time) reduced
    /// modulo `ms`. A pure function: the same occurrence always gets the
    /// same offset.
    pub fn offset_ms(&self, job: &str, at_ms: i64) -> u64 {
        use sha2::{Digest, Sha256};
        if self.ms == 0 {
            return 0;
        }
        let mut h = Sha256::new();
        h.update(self.seed.to_le_bytes());
        h.update(job.as_bytes());
        h.update(at_ms.to_le_bytes());
        let mut word = [0u8; 8];
        word.copy_from_slice(&h.finalize()[..8]);
        u64::from_le_bytes(word) % self.ms
    }
}

/// Labels a job carries for search (`job list --selector`); they never
/// route (that is `Route::Label`).
pub type Labels = std::collections::BTreeMap<String, String>;

/// What a client submits to create or update a job. Encoded (in log
/// entries) as log formats 1 and 2 have it: what format 3 added travels in
/// `Command::SpecExtended` (`SpecExt`), what format 4 added in
/// `Command::SpecExtendedMore` (`SpecMore`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    pub id: String,
    pub schedule: ScheduleInput,
    pub group: String,
    pub payload: Vec<u8>,
    pub policy: Policy,
    #[serde(skip)]
    pub bounds: Bounds,
    #[serde(skip)]
    pub labels: Labels,
    #[serde(skip)]
    pub workflow: Option<Workflow>,
    /// Runs of the job active at once before an occurrence meets its overlap
    /// policy (`None`: unlimited for `allow`, 1 for the others).
    #[serde(skip)]
    pub max_concurrent: Option<u32>,
    /// Each occurrence fires at its nominal time plus an offset below the
    /// jitter. An update keeps the seed of a job that already has a jitter.
    #[serde(skip)]
    pub jitter: Option<Jitter>,
    /// Missed occurrences a late `fire-all` catch-up runs (the newest);
    /// `None`: `limits::CATCH_UP_DEFAULT`.
    #[serde(skip)]
    pub catch_up_max: Option<u32>,
    /// More recurring schedules: the job fires at the occurrences of all
    /// of them, an instant matched by several once.
    #[serde(skip)]
    pub also: Vec<ScheduleInput>,
}

/// What a job spec has beyond log format 2's: log format 3's encoding,
/// which must never change (entries of that format hold it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecExt {
    pub bounds: Bounds,
    pub labels: Labels,
    pub workflow: Option<Workflow>,
    pub max_concurrent: Option<u32>,
}

/// What a job spec has beyond log format 3's (format 4).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecMore {
    pub jitter: Option<Jitter>,
    pub catch_up_max: Option<u32>,
    pub also: Vec<ScheduleInput>,
}

impl JobSpec {
    /// The schedule a job with this spec keeps: `schedule` alone, or the
    /// union of it and `also`.
    pub fn resolve_schedule(&self, now_ms: i64) -> Schedule {
        if self.also.is_empty() {
            return self.schedule.resolve(now_ms);
        }
        Schedule::Union(
            std::iter::once(&self.schedule)
                .chain(&self.also)
                .map(|s| s.resolve(now_ms))
                .collect(),
        )
    }

    /// Whether `stored` is what `resolve_schedule` would keep (so an update
    /// leaves the pending entry alone).
    pub fn schedule_matches(&self, stored: &Schedule) -> bool {
        match stored {
            Schedule::Union(members) => {
                members.len() == 1 + self.also.len()
                    && std::iter::once(&self.schedule)
                        .chain(&self.also)
                        .zip(members)
                        .all(|(input, m)| input.matches(m))
            }
            single => self.also.is_empty() && self.schedule.matches(single),
        }
    }

    /// Moves the extensions out, leaving what format 1 has.
    pub fn take_ext(&mut self) -> (SpecExt, SpecMore) {
        let ext = SpecExt {
            bounds: std::mem::take(&mut self.bounds),
            labels: std::mem::take(&mut self.labels),
            workflow: self.workflow.take(),
            max_concurrent: self.max_concurrent.take(),
        };
        let more = SpecMore {
            jitter: self.jitter.take(),
            catch_up_max: self.catch_up_max.take(),
            also: std::mem::take(&mut self.also),
        };
        (ext, more)
    }

    /// This spec with `ext` and `more` in place of its own.
    pub fn with_ext(&self, ext: &SpecExt, more: &SpecMore) -> JobSpec {
        JobSpec {
            bounds: ext.bounds.clone(),
            labels: ext.labels.clone(),
            workflow: ext.workflow.clone(),
            max_concurrent: ext.max_concurrent,
            jitter: more.jitter,
            catch_up_max: more.catch_up_max,
            also: more.also.clone(),
            ..self.clone()
        }
    }
}

/// Why, by whom and when a job was paused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseNote {
    pub note: String,
    /// The token's name ("" on a cluster without tokens).
    pub by: String,
    pub at_ms: i64,
}

/// A job's state as `job list --state` filters it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobState {
    Active,
    Paused,
    /// Past its end, or its `max_runs` fired, or a one-shot that fired: no
    /// occurrence remains. Kept, not deleted.
    Finished,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Active => "active",
            JobState::Paused => "paused",
            JobState::Finished => "finished",
        }
    }

    pub fn parse(s: &str) -> Option<JobState> {
        [JobState::Active, JobState::Paused, JobState::Finished]
            .into_iter()
            .find(|st| st.as_str() == s)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub id: String,
    /// A union is stored as its first member here and the others in the
    /// record's tail (`JobExt::also`).
    #[serde(serialize_with = "first_schedule")]
    pub schedule: Schedule,
    pub group: String,
    pub payload: Vec<u8>,
    pub policy: Policy,
    pub revision: u64,
    pub paused: bool,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// Due time of the job's one pending occurrence entry, if any.
    pub next_fire_at_ms: Option<i64>,
    /// Runs of this job not yet terminal (for the overlap policy).
    pub active_runs: u32,
    /// An occurrence held back by `buffer-one`, started when the active run ends.
    pub buffered_at_ms: Option<i64>,
    /// Run records of this job currently stored (for history retention).
    pub history_len: u64,
    /// When housekeeping should next look at this job's oldest runs (its
    /// one `RETENTION_DUE` entry): never later than the moment one of them
    /// may be deleted (`keep_runs` exceeded, or `keep_for` passed).
    pub retention_due_ms: Option<i64>,
    // What state format 8's record has not: kept in the record's tail
    // (`Job::to_record`), so a job that uses none of it is stored byte for
    // byte as before.
    #[serde(skip)]
    pub bounds: Bounds,
    #[serde(skip)]
    pub labels: Labels,
    /// Scheduled occurrences fired, counted only for a job with
    /// `bounds.max_runs` (manual triggers and misfire-skipped occurrences
    /// do not count).
    #[serde(skip)]
    pub fired_count: u64,
    /// When the job's bounds ended its occurrences (state "finished").
    #[serde(skip)]
    pub finished_at_ms: Option<i64>,
    /// Set while paused with a note: the note, who and when.
    #[serde(skip)]
    pub pause: Option<PauseNote>,
    /// Its upstream jobs, for a job of a workflow.
    #[serde(skip)]
    pub workflow: Option<Workflow>,
    /// Its open cycle (a job with a workflow).
    #[serde(skip)]
    pub cycle: Cycle,
    #[serde(skip)]
    pub max_concurrent: Option<u32>,
    /// Occurrences waiting under `buffer-all`, oldest first.
    #[serde(skip)]
    pub queued: Vec<i64>,
    /// The job's latest backfill: in progress, or how it ended.
    #[serde(skip)]
    pub backfill: Option<Backfill>,
    #[serde(skip)]
    pub jitter: Option<Jitter>,
    /// The jitter offset of the pending occurrence: its wheel entry fires
    /// at `next_fire_at_ms` plus this (0 without jitter).
    #[serde(skip)]
    pub next_offset_ms: u64,
    #[serde(skip)]
    pub catch_up_max: Option<u32>,
    /// The request id of the create that made the job (log format 4): a
    /// retried create finds it here instead of in the request-id table.
    #[serde(skip)]
    pub create_request: Option<String>,
    /// Who created the job (the token's name, "" without tokens), while its
    /// create's revision record is not yet written (log format 5): the job
    /// implies that record (revision 1 at `created_at_ms`) until it first
    /// changes, when the record is written and this cleared. So a create
    /// writes two keys (the job and its wheel entry), not three.
    #[serde(skip)]
    pub created_by: Option<String>,
}

/// A job's schedule as state format 8 holds it: a union's first member.
fn first_schedule<S: serde::Serializer>(s: &Schedule, ser: S) -> Result<S::Ok, S::Error> {
    match s {
        Schedule::Union(members) if !members.is_empty() => members[0].serialize(ser),
        single => single.serialize(ser),
    }
}

/// A job record's tail: the fields state format 8's record lacks, as log
/// format 3's releases write them. Never extended: what is newer goes in
/// `JobMore`, a second tail.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct JobExt {
    bounds: Bounds,
    labels: Labels,
    fired_count: u64,
    finished_at_ms: Option<i64>,
    pause: Option<PauseNote>,
    workflow: Option<Workflow>,
    cycle: Cycle,
    max_concurrent: Option<u32>,
    queued: Vec<i64>,
}

/// A job record's second tail: what log format 4 added (written only when
/// set, so a record without any of it reads on format-3 releases).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct JobMore {
    backfill: Option<Backfill>,
    jitter: Option<Jitter>,
    next_offset_ms: u64,
    catch_up_max: Option<u32>,
    /// A union schedule's members after the first.
    also: Vec<Schedule>,
    create_request: Option<String>,
}

/// A job record's third tail: what log format 5 added (written only when
/// set, so a record without it reads on format-4 releases).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct JobFormat5 {
    created_by: Option<String>,
}

impl Job {
    /// Whether `replace` waits for the runs it cancels to stop: since log
    /// format 4, so every member of a cluster decides it the same way.
    pub fn replace_waits(log_format: u32) -> bool {
        log_format >= 4
    }

    /// Whether the job's active runs are being replaced (under the
    /// cluster's active `log_format`): a `replace` occurrence waits in
    /// `buffered_at_ms` for them to stop.
    pub fn being_replaced(&self, log_format: u32) -> bool {
        self.policy.overlap == Overlap::Replace
            && self.buffered_at_ms.is_some()
            && Job::replace_waits(log_format)
    }

    /// Runs active at once before an occurrence meets the overlap policy.
    pub fn capacity(&self) -> u32 {
        match (self.max_concurrent, self.policy.overlap) {
            (Some(n), _) => n,
            (None, Overlap::Allow) => u32::MAX,
            (None, _) => 1,
        }
    }

    /// The stored record: the format-8 record, followed by the extension
    /// fields only when one of them is set.
    pub fn to_record(&self) -> Vec<u8> {
        let ext = JobExt {
            bounds: self.bounds.clone(),
            labels: self.labels.clone(),
            fired_count: self.fired_count,
            finished_at_ms: self.finished_at_ms,
            pause: self.pause.clone(),
            workflow: self.workflow.clone(),
            cycle: self.cycle.clone(),
            max_concurrent: self.max_concurrent,
            queued: self.queued.clone(),
        };
        let more = JobMore {
            backfill: self.backfill.clone(),
            jitter: self.jitter,
            next_offset_ms: self.next_offset_ms,
            catch_up_max: self.catch_up_max,
            also: match &self.schedule {
                Schedule::Union(members) => members.iter().skip(1).cloned().collect(),
                _ => Vec::new(),
            },
            create_request: self.create_request.clone(),
        };
        let format5 = JobFormat5 {
            created_by: self.created_by.clone(),
        };
        encode_with_three_tails(self, &ext, &more, &format5)
    }

    /// Whether a stored record has an extension tail (bytes after the
    /// format-8 record).
    pub fn record_has_tail(b: &[u8]) -> bool {
        has_tail::<Job>(b)
    }

    /// The oldest log format whose releases read a stored record: 1 for
    /// state format 8's record, 3 with the first tail, 4 with the second,
    /// 5 with the third.
    pub fn record_format(b: &[u8]) -> u32 {
        match tails::<Job, JobExt, JobMore>(b) {
            0 => 1,
            1 => 3,
            2 => 4,
            _ => 5,
        }
    }

    /// Reads `to_record`'s bytes (or a format-8 record): the tail, when
    /// present, must decode exactly to its end.
    pub fn from_record(b: &[u8]) -> Result<Job, DecodeError> {
        let (mut job, ext, more, format5) =
            decode_with_three_tails::<Job, JobExt, JobMore, JobFormat5>(
                b,
                "job record: bytes after its extensions",
            )?;
        if !more.also.is_empty() {
            let first = std::mem::replace(&mut job.schedule, Schedule::Upstream);
            job.schedule = Schedule::Union(std::iter::once(first).chain(more.also).collect());
        }
        Ok(Job {
            bounds: ext.bounds,
            labels: ext.labels,
            fired_count: ext.fired_count,
            finished_at_ms: ext.finished_at_ms,
            pause: ext.pause,
            workflow: ext.workflow,
            cycle: ext.cycle,
            max_concurrent: ext.max_concurrent,
            queued: ext.queued,
            jitter: more.jitter,
            next_offset_ms: more.next_offset_ms,
            catch_up_max: more.catch_up_max,
            backfill: more.backfill,
            create_request: more.create_request,
            created_by: format5.created_by,
            ..job
        })
    }

    /// The create's revision record while the job implies it (`created_by`).
    pub fn implied_revision(&self) -> Option<JobRevision> {
        let by = self.created_by.as_ref()?;
        Some(JobRevision {
            revision: 1,
            at_ms: self.created_at_ms,
            by: by.clone(),
            action: "create".to_string(),
        })
    }

    /// The jitter offset of the occurrence nominally at `at_ms` (0 without jitter).
    pub fn offset_ms(&self, at_ms: i64) -> u64 {
        self.jitter.map_or(0, |j| j.offset_ms(&self.id, at_ms))
    }

    /// When the occurrence nominally at `at_ms` fires: with its offset.
    pub fn fire_time(&self, at_ms: i64) -> i64 {
        at_ms.saturating_add(i64::try_from(self.offset_ms(at_ms)).unwrap_or(i64::MAX))
    }

    /// Active (it has a next occurrence or may get one), paused, or
    /// finished: its bounds ended it, or its schedule has no occurrence
    /// left (a one-shot that fired).
    pub fn state(&self) -> JobState {
        let spent = self.next_fire_at_ms.is_none() && self.schedule != Schedule::Upstream;
        if self.finished_at_ms.is_some() || (!self.paused && spent) {
            JobState::Finished
        } else if self.paused {
            JobState::Paused
        } else {
            JobState::Active
        }
    }
}

/// Identity of a run: one shard of one occurrence of a job. The triple is
/// unique, so a second fire of the same occurrence is impossible by
/// construction. Unsharded jobs only have shard 0.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RunId {
    pub job: String,
    pub scheduled_at_ms: i64,
    pub shard: u32,
}

impl RunId {
    pub fn new(job: &str, scheduled_at_ms: i64) -> Self {
        Self::shard(job, scheduled_at_ms, 0)
    }

    pub fn shard(job: &str, scheduled_at_ms: i64, shard: u32) -> Self {
        RunId {
            job: job.to_string(),
            scheduled_at_ms,
            shard,
        }
    }

    /// Parses the text form `<job>@<scheduled_at_ms>` (shard 0) or
    /// `<job>@<scheduled_at_ms>/s<shard>`. Job ids cannot contain `@` or `/`,
    /// and the fencing token appends `#<attempt>`, so all three stay unambiguous.
    /// Only the canonical form parses (no `/s0`, `+1` or leading zeros), so
    /// one run has one name.
    pub fn parse(s: &str) -> Option<RunId> {
        let (job, rest) = s.rsplit_once('@')?;
        let (at, shard) = match rest.split_once("/s") {
            Some((at, shard)) => (at, shard.parse().ok()?),
            None => (rest, 0),
        };
        let id = RunId::shard(job, at.parse().ok()?, shard);
        (!job.is_empty() && id.to_string() == s).then_some(id)
    }
}

impl std::fmt::Display for RunId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.job, self.scheduled_at_ms)?;
        if self.shard != 0 {
            write!(f, "/s{}", self.shard)?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunState {
    /// Fired, waiting for a worker.
    Pending,
    /// Assigned to a worker.
    Running,
    /// Failed or timed out; the next attempt waits for its backoff.
    RetryWait,
    Succeeded,
    Failed,
    TimedOut,
    /// An occurrence a policy decided not to run (see the note).
    Skipped,
    Cancelled,
}

impl RunState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunState::Succeeded
                | RunState::Failed
                | RunState::TimedOut
                | RunState::Skipped
                | RunState::Cancelled
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Pending => "pending",
            RunState::Running => "running",
            RunState::RetryWait => "retry-wait",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::TimedOut => "timed-out",
            RunState::Skipped => "skipped",
            RunState::Cancelled => "cancelled",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    pub id: RunId,
    pub group: String,
    pub priority: u8,
    /// Cluster time in the Fire command that created the run.
    pub fired_at_ms: i64,
    pub state: RunState,
    pub attempt: u32,
    pub worker: String,
    /// The worker's clock when it received the current attempt (reported with the finish).
    pub received_at_ms: i64,
    pub finished_at_ms: i64,
    pub result: Vec<u8>,
    pub error: String,
    pub note: String,
    /// When a RetryWait run's next attempt is due (its one live Retry entry).
    pub retry_at_ms: Option<i64>,
    /// Runs of this occurrence (1 unless sharded or broadcast); `id.shard` is below it.
    pub shard_count: u32,
    /// The occurrence's jitter offset: it fired at `id.scheduled_at_ms`
    /// plus this. Kept in the record's tail (`Run::to_record`), so a run
    /// without one is stored as before.
    #[serde(skip)]
    pub offset_ms: u64,
}

/// A run record's tail: the fields state format 8's record lacks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct RunExt {
    offset_ms: u64,
}

impl Run {
    /// The stored record: state format 8's, with the tail only when set.
    pub fn to_record(&self) -> Vec<u8> {
        encode_with_tail(
            self,
            &RunExt {
                offset_ms: self.offset_ms,
            },
        )
    }

    pub fn record_has_tail(b: &[u8]) -> bool {
        has_tail::<Run>(b)
    }

    pub fn from_record(b: &[u8]) -> Result<Run, DecodeError> {
        let (run, ext) =
            decode_with_tail::<Run, RunExt>(b, "run record: bytes after its extension")?;
        Ok(Run {
            offset_ms: ext.offset_ms,
            ..run
        })
    }
}

/// What kind of timer a wheel entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum EntryKind {
    /// A job's next scheduled occurrence.
    Occurrence = 1,
    /// The next attempt of a run after its backoff.
    Retry = 2,
    /// The next step of a job's backfill (log format 4).
    Backfill = 3,
}

/// Key of a wheel entry; the durable index sorts by `fire_at_ms` first.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WheelKey {
    pub fire_at_ms: i64,
    pub kind: EntryKind,
    /// The run's (retries) or the occurrence's nominal scheduled time; an
    /// occurrence fires at it plus the job's jitter offset (`fire_at_ms`).
    pub scheduled_at_ms: i64,
    /// For retries: the run's shard. For occurrences: 0.
    pub shard: u32,
    /// Last, so the derived order equals the byte order of the encoded key.
    pub job: String,
}

impl WheelKey {
    pub fn occurrence(job: &str, at_ms: i64) -> Self {
        Self::jittered(job, at_ms, 0)
    }

    /// The occurrence nominally at `at_ms`, firing `offset_ms` later.
    pub fn jittered(job: &str, at_ms: i64, offset_ms: u64) -> Self {
        WheelKey {
            fire_at_ms: at_ms.saturating_add(i64::try_from(offset_ms).unwrap_or(i64::MAX)),
            kind: EntryKind::Occurrence,
            job: job.to_string(),
            scheduled_at_ms: at_ms,
            shard: 0,
        }
    }

    pub fn retry(run: &RunId, at_ms: i64) -> Self {
        WheelKey {
            fire_at_ms: at_ms,
            kind: EntryKind::Retry,
            job: run.job.clone(),
            scheduled_at_ms: run.scheduled_at_ms,
            shard: run.shard,
        }
    }

    pub fn backfill(job: &str, at_ms: i64) -> Self {
        WheelKey {
            kind: EntryKind::Backfill,
            ..Self::occurrence(job, at_ms)
        }
    }

    /// The run a retry entry belongs to.
    pub fn run_id(&self) -> RunId {
        RunId::shard(&self.job, self.scheduled_at_ms, self.shard)
    }
}

/// The leader's dispatch view of a run that is not terminal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActiveRun {
    pub group: String,
    pub priority: u8,
    pub state: RunState,
    pub attempt: u32,
    pub timeout_ms: u64,
    pub route: Route,
    /// Worker of the attempt when the entry was written. `Assign` does not
    /// rewrite the entry: readers take state, attempt and worker from the
    /// run record (so a new leader can steer a retry away from that worker).
    pub worker: String,
    pub shard_count: u32,
}

/// A run attempt that waits for a worker: what the dispatcher needs to queue and route it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadyRun {
    pub run: RunId,
    pub attempt: u32,
    /// The run's fire time, when apply made the attempt ready; `None` when
    /// the leader rebuilt it from the active-run table (the dispatcher then
    /// reads it from the run record when it hands the attempt out).
    pub fired_at_ms: Option<i64>,
    pub group: String,
    pub priority: u8,
    pub timeout_ms: u64,
    pub route: Route,
    /// Runs of the occurrence: above 1 the dispatcher spreads them over workers.
    pub shard_count: u32,
    /// The occurrence's jitter offset (lateness is counted from its scheduled time plus this).
    pub offset_ms: u64,
}

/// What a token may do. `Admin` everything (tokens and membership
/// included); `Operator` jobs and runs; `Reader` get, list and status;
/// `Worker` a worker session for its token's groups only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    Admin,
    Operator,
    Reader,
    Worker,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Operator => "operator",
            Role::Reader => "reader",
            Role::Worker => "worker",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        [Role::Admin, Role::Operator, Role::Reader, Role::Worker]
            .into_iter()
            .find(|r| r.as_str() == s)
    }
}

/// A named API token. Only the SHA-256 of its secret is stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    pub name: String,
    pub role: Role,
    /// For `Worker`: the groups it may serve (at least one). Empty otherwise.
    pub groups: Vec<String>,
    /// Lowercase hex SHA-256 of the secret.
    pub hash: String,
    pub created_at_ms: i64,
}

/// One change of a job's definition, and who made it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRevision {
    pub revision: u64,
    pub at_ms: i64,
    /// The token's name ("" on a cluster without tokens).
    pub by: String,
    /// create | update | pause | resume | delete
    pub action: String,
}
