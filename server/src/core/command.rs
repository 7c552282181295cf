//! Commands that go through the Raft log and the responses apply returns.
//! Every time value a command needs travels inside it (`now_ms` is the
//! leader's cluster time at proposal), so apply stays deterministic.
//!
//! A log entry carries its command as a [`VersionedCommand`]: encoded, with
//! the log format it was encoded in. New variants go at the end of an enum,
//! so the ones before keep their encoding; any change of the encoding bumps
//! [`LOG_FORMAT`], and a binary decodes every format from
//! [`LOG_FORMAT_OLDEST`] up.

use serde::{Deserialize, Serialize};

use super::codec::{check_format, decode, encode, FormatError};
use super::keys;
use super::types::{
    BackfillOverlap, EntryKind, Job, JobSpec, Overlap, PauseNote, Run, RunId, ScheduleInput,
    SpecExt, SpecMore, Token, WheelKey,
};

/// The newest log format this binary reads and can write. A leader writes
/// entries at the cluster's *active* format (replicated, `query::log_format`),
/// which rises only once every member reads the newer one (`upgrade`).
/// 1: the first versioned format (state format 8, with `Housekeep` and
/// Quartz schedules); what a node that does not report its format reads.
/// 2: the `ActivateLogFormat` command.
/// 3: job bounds and labels (`SpecExtended`), pause notes (`PauseJobNoted`),
/// the cluster firing switch (`PauseFiring`, `ResumeFiring`), workflows,
/// `buffer-all`, and job and run records with their first tail.
/// 4: jitter, the fire-all catch-up cap and several schedules per job
/// (`SpecExtendedMore`), backfills (`StartBackfill`, `CancelBackfill`,
/// `Backfill` wheel keys in `Fire`, the run's backfill mark), overlap
/// `replace` waiting for the runs it replaces, a create's request id kept
/// in its job instead of the request-id table, and job records' second
/// tail and run records' tail.
/// 5: a create's revision record implied by its job until the job first
/// changes (`Job::created_by`, in job records' third tail), so a create
/// writes two keys instead of three, and a new one-shot's run not looked
/// up (a job being created has none). bincode is not self-describing: what older
/// formats lack travels in appended variants, never in fields added to
/// existing ones (nor to a struct an existing variant holds, such as
/// `SpecExt`), so entries of every older format keep decoding as they
/// were written.
pub const LOG_FORMAT: u32 = 5;
/// The oldest log format this binary decodes.
pub const LOG_FORMAT_OLDEST: u32 = 1;
/// The format of a cluster that never activated one, and the newest format
/// a node reads that does not report one (releases before format 2).
pub const LOG_FORMAT_INITIAL: u32 = 1;

/// A command as a log entry holds it: encoded in the log format of the
/// binary that proposed it. The entry itself decodes whatever that format
/// is (so the log store and the peer network never misread it); the
/// command is decoded in apply, which refuses a format this binary does not
/// read, naming both versions, so the node stops applying rather than
/// misapply (`store::sm`).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionedCommand {
    pub format: u32,
    pub bytes: Vec<u8>,
}

/// A command that needs a newer log format than the cluster's active one:
/// some member could not read it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "this needs log format {needs}, but the cluster's active log format is {active}: \
     upgrade every member (voters and learners) to a release that reads format {needs}; \
     the leader then raises the active format by itself (see `kairosctl cluster status`)"
)]
pub struct FormatTooNew {
    pub needs: u32,
    pub active: u32,
}

impl VersionedCommand {
    /// `cmd` as an entry of this binary's newest format (tests, tools).
    pub fn new(cmd: &Command) -> Self {
        VersionedCommand {
            format: LOG_FORMAT,
            bytes: encode(cmd),
        }
    }

    /// `cmd` as an entry every member of a cluster whose active log format
    /// is `active` reads: labelled with that format, refused if the command
    /// needs a newer one. A format-N entry holds only commands of format N
    /// or older (variants are only appended), so its bytes are what any
    /// reader of N decodes.
    pub fn at(cmd: &Command, active: u32) -> Result<Self, FormatTooNew> {
        let needs = cmd.min_format();
        if needs > active {
            return Err(FormatTooNew { needs, active });
        }
        Ok(VersionedCommand {
            format: active.min(LOG_FORMAT),
            bytes: encode(cmd),
        })
    }

    /// The command of the entry at log index `index`, if this binary reads its format.
    pub fn command(&self, index: u64) -> Result<Command, FormatError> {
        let what = format!("log entry {index}");
        check_format(&what, self.format, LOG_FORMAT_OLDEST, LOG_FORMAT)?;
        decode(&self.bytes).map_err(|e| FormatError::Undecodable {
            what,
            found: self.format,
            reason: e.to_string(),
        })
    }
}

impl From<Command> for VersionedCommand {
    fn from(cmd: Command) -> Self {
        VersionedCommand::new(&cmd)
    }
}

/// Shows the command rather than its bytes (openraft logs entries).
impl std::fmt::Debug for VersionedCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match decode::<Command>(&self.bytes) {
            Ok(cmd) if self.format == LOG_FORMAT => write!(f, "{cmd:?}"),
            _ => write!(f, "<format {}, {} bytes>", self.format, self.bytes.len()),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    CreateJob {
        spec: JobSpec,
        now_ms: i64,
    },
    /// `expected_revision` 0 skips the compare-and-set.
    UpdateJob {
        spec: JobSpec,
        expected_revision: u64,
        now_ms: i64,
    },
    DeleteJob {
        id: String,
        now_ms: i64,
    },
    PauseJob {
        id: String,
        now_ms: i64,
    },
    ResumeJob {
        id: String,
        now_ms: i64,
    },
    /// Fires the job once at `now_ms`, outside its schedule. `widths` as in `Fire`.
    TriggerJob {
        id: String,
        now_ms: i64,
        widths: Vec<(String, u32)>,
    },
    /// A batch of due wheel keys. Keys not due at `now_ms` or no longer present are skipped.
    /// `widths`: workers of each group connected to the leader at proposal,
    /// the run count of a broadcast occurrence (apply cannot know who is connected).
    Fire {
        now_ms: i64,
        keys: Vec<WheelKey>,
        widths: Vec<(String, u32)>,
    },
    /// Records that the leader handed attempts to workers.
    Assign {
        now_ms: i64,
        assignments: Vec<(RunId, u32, String)>,
    },
    /// Worker reports, batched.
    Finish {
        now_ms: i64,
        reports: Vec<FinishReport>,
    },
    /// Attempts whose lease ran out without a finish. `jitter_ms` is the
    /// leader's random draw for the retry backoff, one per run.
    Expire {
        now_ms: i64,
        expired: Vec<(RunId, u32, u64)>,
    },
    /// Retries a terminal run by hand as a new attempt.
    RetryRun {
        run: RunId,
        now_ms: i64,
    },
    /// Adds a token. `first`: the bootstrap admin, taken only while the
    /// cluster has no token at all.
    PutToken {
        token: Token,
        first: bool,
        now_ms: i64,
    },
    RevokeToken {
        name: String,
        now_ms: i64,
    },
    /// A client write with its client-chosen request id: if a command with
    /// this id already succeeded (within the dedup window), its first
    /// response is returned and nothing is applied again, so a retried
    /// write after a lost response does not act twice.
    Dedup {
        request_id: String,
        command: Box<Command>,
    },
    /// A client write made by the token named `actor` ("" without tokens):
    /// job changes record it in the job's revision history.
    Authored {
        actor: String,
        command: Box<Command>,
    },
    /// One part of a restore from a backup: key-value pairs of the
    /// scheduling state (jobs, runs, wheel, active runs, job history) written
    /// as they are. `first` needs a cluster with no such state and marks a
    /// restore in progress; later parts need that mark; `last` clears it.
    RestorePairs {
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
        first: bool,
        last: bool,
        now_ms: i64,
    },
    /// Client commands grouped into one log entry (group commit). Each is
    /// applied in order as if alone: one refused command changes nothing and
    /// does not affect the others. Batches do not nest.
    Batch {
        commands: Vec<Command>,
    },
    /// The leader's housekeeping: deletes run records of deleted jobs and
    /// runs past their job's `keep_runs` or `keep_for`, at most
    /// `max_deletes` of them (and `limits::HOUSEKEEP_JOBS_MAX` jobs looked
    /// at), so every entry's work is bounded. Proposed only when the state
    /// says there is such work (`query::housekeeping_due`).
    Housekeep {
        now_ms: i64,
        max_deletes: u32,
    },
    /// Raises the cluster's active log format to `format` (never lowers
    /// it). Proposed by a leader once every member reports it reads
    /// `format` (`upgrade`); from then on entries are written at it.
    ActivateLogFormat {
        format: u32,
    },
    /// A `CreateJob` or `UpdateJob` whose spec carries what a format 1 or 2
    /// spec cannot: `ext` (bounds, labels) replaces the inner spec's.
    SpecExtended {
        ext: SpecExt,
        command: Box<Command>,
    },
    /// `PauseJob` with a note (at most `limits::PAUSE_NOTE_MAX_BYTES`), kept
    /// with who paused and when until the job is resumed.
    PauseJobNoted {
        id: String,
        note: String,
        now_ms: i64,
    },
    /// Stops all firing (an incident switch): while set, no occurrence or
    /// retry entry fires and no trigger is taken; the entries stay.
    PauseFiring {
        note: String,
        now_ms: i64,
    },
    /// Fires again: entries that fell due meanwhile fire late, each job's
    /// misfire policy deciding.
    ResumeFiring {
        now_ms: i64,
    },
    /// Starts a backfill of job `id`: its occurrences in `[from_ms, to_ms)`
    /// (a past range of at most `limits::BACKFILL_OCCURRENCES_MAX`) created
    /// as runs in order, a step at a time (`core::backfill`).
    StartBackfill {
        id: String,
        from_ms: i64,
        to_ms: i64,
        overlap: BackfillOverlap,
        now_ms: i64,
    },
    /// Stops job `id`'s backfill in progress; runs it created stay.
    CancelBackfill {
        id: String,
        now_ms: i64,
    },
    /// `SpecExtended` with what a format 3 spec cannot carry either: `more`
    /// (jitter, catch-up cap, more schedules) replaces the inner spec's.
    SpecExtendedMore {
        ext: SpecExt,
        more: SpecMore,
        command: Box<Command>,
    },
}

/// The oldest log format whose readers take a restored key-value pair:
/// 3 for a workflow index or input key and a job record with its first
/// tail; 4 for a run's backfill mark, a backfill step entry, a jittered
/// occurrence entry (it fires after its nominal time), a job record with
/// its second tail and a run record with a tail; 5 for a job record with
/// its third tail (a create it implies).
fn restored_format(k: &[u8], v: &[u8]) -> u32 {
    let newer_entry = |w: WheelKey| {
        w.kind == EntryKind::Backfill
            || (w.kind == EntryKind::Occurrence && w.fire_at_ms != w.scheduled_at_ms)
    };
    match k.first() {
        Some(&keys::DOWNSTREAM | &keys::RUN_INPUTS) => 3,
        Some(&keys::RUN_BACKFILL) => 4,
        Some(&keys::JOB) => Job::record_format(v),
        Some(&keys::WHEEL) if keys::wheel_from(k).is_some_and(newer_entry) => 4,
        Some(&keys::RUN) if Run::record_has_tail(v) => 4,
        _ => LOG_FORMAT_INITIAL,
    }
}

impl Command {
    /// The oldest log format that has this command (and everything inside it).
    pub fn min_format(&self) -> u32 {
        match self {
            Command::ActivateLogFormat { format } => (*format).max(2),
            Command::CreateJob { spec, .. } | Command::UpdateJob { spec, .. }
                if spec.schedule == ScheduleInput::Upstream
                    || spec.policy.overlap == Overlap::BufferAll =>
            {
                3
            }
            // Pairs of a backup taken after format 3 or 4: what older
            // members would refuse or misread.
            Command::RestorePairs { pairs, .. } => pairs
                .iter()
                .map(|(k, v)| restored_format(k, v))
                .max()
                .unwrap_or(LOG_FORMAT_INITIAL),
            Command::Fire { keys, .. } if keys.iter().any(|k| k.kind == EntryKind::Backfill) => 4,
            Command::SpecExtended { .. }
            | Command::PauseJobNoted { .. }
            | Command::PauseFiring { .. }
            | Command::ResumeFiring { .. } => 3,
            Command::SpecExtendedMore { .. }
            | Command::StartBackfill { .. }
            | Command::CancelBackfill { .. } => 4,
            Command::Dedup { command, .. } | Command::Authored { command, .. } => {
                command.min_format()
            }
            Command::Batch { commands } => commands
                .iter()
                .map(Command::min_format)
                .max()
                .unwrap_or(LOG_FORMAT_INITIAL),
            _ => LOG_FORMAT_INITIAL,
        }
    }

    /// Creates `spec`: in the plain variant every format has when the spec
    /// uses nothing newer, else wrapped with its extension.
    pub fn create_job(mut spec: JobSpec, now_ms: i64) -> Command {
        let (ext, more) = spec.take_ext();
        Self::extended(ext, more, Command::CreateJob { spec, now_ms })
    }

    /// Updates to `spec` (`expected_revision` 0 skips the compare-and-set), as `create_job`.
    pub fn update_job(mut spec: JobSpec, expected_revision: u64, now_ms: i64) -> Command {
        let (ext, more) = spec.take_ext();
        Self::extended(
            ext,
            more,
            Command::UpdateJob {
                spec,
                expected_revision,
                now_ms,
            },
        )
    }

    /// Wraps `command` in the oldest variant that carries `ext` and `more`.
    fn extended(ext: SpecExt, more: SpecMore, command: Command) -> Command {
        let command = Box::new(command);
        if more != SpecMore::default() {
            Command::SpecExtendedMore { ext, more, command }
        } else if ext != SpecExt::default() {
            Command::SpecExtended { ext, command }
        } else {
            *command
        }
    }

    /// Pauses job `id`; a note needs `PauseJobNoted` (format 3).
    pub fn pause_job(id: String, note: String, now_ms: i64) -> Command {
        if note.is_empty() {
            Command::PauseJob { id, now_ms }
        } else {
            Command::PauseJobNoted { id, note, now_ms }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishReport {
    pub run: RunId,
    pub attempt: u32,
    pub success: bool,
    pub result: Vec<u8>,
    pub error: String,
    pub retryable: bool,
    pub worker: String,
    pub received_at_ms: i64,
    /// Leader's random draw for this run's retry backoff.
    pub jitter_ms: u64,
    /// The worker stopped the attempt at its deadline (ends as timed-out, not failed).
    pub timed_out: bool,
}

/// A deterministic refusal. Apply returns it as a response; state is untouched.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum CommandError {
    #[error("{0}")]
    Invalid(String),
    #[error("job {0:?} not found")]
    NotFound(String),
    #[error("job {0:?} already exists")]
    AlreadyExists(String),
    #[error("job {id:?} is at revision {actual}, not the expected {expected}")]
    RevisionMismatch {
        id: String,
        expected: u64,
        actual: u64,
    },
    #[error("run {0} not found")]
    RunNotFound(String),
    #[error("run {run} is at attempt {current} ({state}); attempt {reported} is stale")]
    StaleAttempt {
        run: String,
        current: u32,
        reported: u32,
        state: String,
    },
    #[error("{0}")]
    FailedPrecondition(String),
}

impl Response {
    /// The response as the dedup table keeps it: without job payloads and
    /// run results (up to 256 and 512 KiB), so the table stays small.
    pub fn kept(&self) -> Response {
        match self {
            Response::Job(j) => Response::Job(Job {
                payload: Vec::new(),
                ..j.clone()
            }),
            Response::Run(r) => Response::Run(Run {
                result: Vec::new(),
                ..r.clone()
            }),
            other => other.clone(),
        }
    }
}

// One per applied command and short-lived; the job variant is the common answer.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    Job(Job),
    Deleted(bool),
    Run(Run),
    Token(Token),
    Fired {
        runs: u32,
        skipped_keys: u32,
    },
    /// One result per report or expiry, in order.
    Batch(Vec<Result<(), CommandError>>),
    Error(CommandError),
    /// Blank and membership entries.
    Empty,
    /// One response per command of a `Batch`, in order.
    Many(Vec<Response>),
    /// Run records a `Housekeep` deleted.
    Housekept {
        removed: u32,
    },
    /// The cluster-wide firing pause after `PauseFiring`/`ResumeFiring`
    /// (`None`: firing).
    Firing(Option<PauseNote>),
}
