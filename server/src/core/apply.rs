//! `apply(view, command) -> Applied`: the deterministic heart of Kairos.
//!
//! Invariants kept here:
//! - each enabled job with a future occurrence has exactly one Occurrence
//!   entry in the wheel, at `job.next_fire_at_ms`;
//! - a run `(job, scheduled_at)` is created at most once, ever;
//! - nothing fires before its time: a key with `fire_at_ms > now` is skipped;
//! - the next occurrence is computed from the *scheduled* time (no drift);
//! - state-machine time (`META_TIME`) never goes backwards;
//! - a refused command produces no writes;
//! - apply is total: no command, however extreme its fields, panics
//!   (checked, saturating or i128 arithmetic on every command value).

use serde::{de::DeserializeOwned, Serialize};

use super::backfill;
use super::codec::{decode, encode};
use super::command::{Command, CommandError, FinishReport, Response};
use super::keys;
use super::query;
use super::types::*;
use super::validate;
use super::view::{Overlay, StateView, Write};
use super::workflow::{self, Decision};

/// Work for the leader that follows from a committed change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// A wheel entry was added; the leader loads it if inside its horizon.
    Scheduled(WheelKey),
    /// A run attempt waits for a worker.
    Ready(ReadyRun),
    /// A run attempt ended: release its worker slot and lease.
    Ended { run: RunId, attempt: u32 },
    /// Tell the worker holding this attempt to stop.
    Cancel { run: RunId, attempt: u32 },
    /// A restore finished: the leader rebuilds its wheel and queues from state.
    Restored,
    /// A run reached a terminal state (succeeded, failed, timed out,
    /// cancelled, or recorded skipped): the leader counts and logs it.
    Finished(Finished),
    /// An occurrence was due longer ago than its job's misfire grace and
    /// was handled by `policy`: the leader counts it.
    Misfired { group: String, policy: Misfire },
    /// Firing resumed cluster-wide: the leader reloads its wheel from state.
    FiringResumed,
    /// A backfill created the occurrence of this (shard-0) run: its
    /// lateness is chosen, not a delay, so the leader does not count it.
    Backfilled(RunId),
    /// A job was created, changed, deleted, paused or resumed (for watchers;
    /// `group` is the job's group after the change).
    JobChanged {
        job: String,
        group: String,
        change: JobChange,
    },
    /// An attempt was recorded as handed to `worker` (for watchers).
    Assigned {
        run: RunId,
        attempt: u32,
        group: String,
        worker: String,
    },
}

/// What happened to a job, as watchers see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobChange {
    Created,
    Updated,
    Deleted,
    Paused,
    Resumed,
}

/// A run's terminal state as apply decided it, with who ran its last attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finished {
    pub run: RunId,
    pub attempt: u32,
    pub group: String,
    /// Empty when no worker ran the attempt (skipped, cancelled while pending).
    pub worker: String,
    pub outcome: RunState,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    pub response: Response,
    pub writes: Vec<Write>,
    pub effects: Vec<Effect>,
}

/// Applies one command. Pure: the result depends only on `view` and `cmd`.
pub fn apply<V: StateView + ?Sized>(view: &V, cmd: &Command) -> Applied {
    let mut o = Overlay::new(view);
    let (response, effects) = apply_into(&mut o, cmd);
    Applied {
        response,
        writes: o.into_writes(),
        effects,
    }
}

/// [`apply`] into an overlay that may already hold writes (of the log
/// entries before it): the command reads them and leaves its own there,
/// or, when it fails, leaves none. The same result as [`apply`] over the
/// overlay as a view, without gathering the writes a second time.
pub fn apply_into<V: StateView + ?Sized>(
    o: &mut Overlay<'_, V>,
    cmd: &Command,
) -> (Response, Vec<Effect>) {
    match cmd {
        Command::Batch { commands } => apply_batch(o, commands),
        _ => {
            let (response, effects, _) = apply_one(o, cmd, Known::default());
            (response, effects)
        }
    }
}

/// The id of the job `cmd` creates, if it is a create (extended or not).
fn created_job(cmd: &Command) -> Option<&str> {
    match cmd {
        Command::CreateJob { spec, .. } => Some(&spec.id),
        Command::SpecExtended { command, .. } | Command::SpecExtendedMore { command, .. } => {
            created_job(command)
        }
        _ => None,
    }
}

/// What the commands of a batch learned of the state that the next one
/// may reuse instead of reading it again: for a batch of 250 creates, one
/// read of each instead of 250. Each fact is dropped as soon as a command
/// writes what it describes (`apply_batch`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Known {
    /// Whether the facts below are kept at all: only across a batch. A
    /// lone command reads the one key it needs instead of a key space.
    batch: bool,
    /// The active log format; only `ActivateLogFormat` changes it.
    format: Option<u32>,
    /// Whether the request-id table (`keys::DEDUP`) holds an entry.
    dedup_entries: Option<bool>,
    /// Whether a deleted job awaits housekeeping (`keys::DELETED_JOB`).
    deleted_jobs: Option<bool>,
}

impl Known {
    fn batch() -> Known {
        Known {
            batch: true,
            ..Known::default()
        }
    }

    /// What still holds after a command whose writes since `o`'s
    /// savepoint are there: a key put into a space may fill it; a
    /// deletion cannot fill one.
    fn after<V: StateView + ?Sized>(mut self, o: &Overlay<'_, V>) -> Known {
        let spaces = |k: &[u8]| matches!(k.first(), Some(&keys::DEDUP | &keys::DELETED_JOB));
        for k in o.put_since_begin(spaces) {
            match k.first() {
                Some(&keys::DEDUP) => self.dedup_entries = None,
                _ => self.deleted_jobs = None,
            }
        }
        self
    }
}

/// Applies one plain command into `o` with what the batch before it knew
/// (the format is known when a batch's earlier command read it): its
/// writes stay in `o` when it succeeds and are undone when it fails.
/// Returns what is known after it.
fn apply_one<V: StateView + ?Sized>(
    o: &mut Overlay<'_, V>,
    cmd: &Command,
    known: Known,
) -> (Response, Vec<Effect>, Known) {
    o.begin();
    let mut tx = Tx {
        o,
        effects: Vec::new(),
        now: 0,
        widths: &[],
        actor: "",
        ended: Vec::new(),
        create_request: None,
        absent_job: None,
        known: std::cell::Cell::new(known),
    };
    tx.now = tx.advance_time(command_time(cmd));
    match tx.run(cmd) {
        Ok(response) => {
            tx.follow_upstreams();
            let known = tx.known.get().after(tx.o);
            tx.o.commit();
            (response, tx.effects, known)
        }
        // Its writes are undone: what was known before it still holds.
        Err(e) => {
            tx.o.roll_back();
            (Response::Error(e), Vec::new(), known)
        }
    }
}

fn command_time(cmd: &Command) -> i64 {
    match cmd {
        Command::CreateJob { now_ms, .. }
        | Command::UpdateJob { now_ms, .. }
        | Command::DeleteJob { now_ms, .. }
        | Command::PauseJob { now_ms, .. }
        | Command::PauseJobNoted { now_ms, .. }
        | Command::ResumeJob { now_ms, .. }
        | Command::TriggerJob { now_ms, .. }
        | Command::Fire { now_ms, .. }
        | Command::Assign { now_ms, .. }
        | Command::Finish { now_ms, .. }
        | Command::Expire { now_ms, .. }
        | Command::RetryRun { now_ms, .. }
        | Command::PutToken { now_ms, .. }
        | Command::RevokeToken { now_ms, .. }
        | Command::RestorePairs { now_ms, .. }
        | Command::Housekeep { now_ms, .. }
        | Command::PauseFiring { now_ms, .. }
        | Command::ResumeFiring { now_ms }
        | Command::StartBackfill { now_ms, .. }
        | Command::CancelBackfill { now_ms, .. } => *now_ms,
        Command::Dedup { command, .. }
        | Command::Authored { command, .. }
        | Command::SpecExtended { command, .. }
        | Command::SpecExtendedMore { command, .. } => command_time(command),
        // Applied by `apply_batch`, never through a Tx of its own.
        Command::Batch { .. } => i64::MIN,
        // Carries no time: state-machine time stays where it is.
        Command::ActivateLogFormat { .. } => i64::MIN,
    }
}

/// Applies each command of a batch over the writes of the ones before it.
fn apply_batch<V: StateView + ?Sized>(
    o: &mut Overlay<'_, V>,
    commands: &[Command],
) -> (Response, Vec<Effect>) {
    let refuse = |msg: String| (Response::Error(CommandError::Invalid(msg)), Vec::new());
    if commands.len() > limits::PROPOSAL_BATCH_MAX {
        let max = limits::PROPOSAL_BATCH_MAX;
        return refuse(format!(
            "commands: at most {max} per batch, got {}",
            commands.len()
        ));
    }
    if commands.iter().any(|c| matches!(c, Command::Batch { .. })) {
        return refuse("commands: a batch cannot contain a batch".into());
    }
    let (mut effects, mut responses) = (Vec::new(), Vec::with_capacity(commands.len()));
    // Read from the state by the first command that asks, not by each
    // (for a batch of creates, a read of sled per create).
    let mut known = Known::batch();
    for c in commands {
        let (response, e, after) = apply_one(o, c, known);
        known = after;
        effects.extend(e);
        responses.push(response);
    }
    (Response::Many(responses), effects)
}

/// Reads the state-machine time from a view (0 before the first command).
pub fn state_time<V: StateView + ?Sized>(view: &V) -> i64 {
    view.get(keys::META_TIME)
        .and_then(|b| decode(&b).ok())
        .unwrap_or(0)
}

struct Tx<'a, 'v, V: StateView + ?Sized> {
    /// Where the command reads and writes, inside a savepoint.
    o: &'a mut Overlay<'v, V>,
    effects: Vec<Effect>,
    now: i64,
    /// Connected workers per group, from the Fire or Trigger command (for broadcast).
    widths: &'a [(String, u32)],
    /// Who made the client write being applied ("" when unknown).
    actor: &'a str,
    /// Runs that reached a terminal state in this command, for the
    /// workflows that follow their jobs (`follow_upstreams`).
    ended: Vec<(RunId, RunState)>,
    /// The request id of the create being applied, kept in the job it
    /// makes (log format 4; see `dedup`).
    create_request: Option<&'a str>,
    /// A job `dedup` looked up and found absent, so that its create does
    /// not look it up again (nothing is written between the two).
    absent_job: Option<&'a str>,
    /// What is known of the state without reading it again: the active
    /// log format, read once per command (a finish of 1,024 runs asks for
    /// it per run) or per batch, and within a batch whether two key spaces
    /// are empty (`Known`).
    known: std::cell::Cell<Known>,
}

fn get<T: DeserializeOwned, V: StateView + ?Sized>(v: &V, key: &[u8]) -> Option<T> {
    // A value that does not decode means the store is corrupt; continuing would diverge.
    v.get(key)
        .map(|b| decode(&b).expect("corrupt replicated state value"))
}

impl<'a, V: StateView + ?Sized> Tx<'a, '_, V> {
    fn advance_time(&mut self, cmd_now: i64) -> i64 {
        let prev = state_time(&*self.o);
        let now = prev.max(cmd_now);
        if now != prev {
            self.o.put(keys::META_TIME.to_vec(), encode(&now));
        }
        now
    }

    fn run(&mut self, cmd: &'a Command) -> Result<Response, CommandError> {
        match cmd {
            // A spec decoded from a log entry has no extension of its own;
            // one built in memory (tests, tools) is read the same way.
            Command::CreateJob { .. } | Command::UpdateJob { .. } => {
                self.put_spec(cmd, &SpecExt::default(), &SpecMore::default())
            }
            Command::SpecExtended { ext, command } => {
                self.put_spec(command, ext, &SpecMore::default())
            }
            Command::SpecExtendedMore { ext, more, command } => self.put_spec(command, ext, more),
            Command::DeleteJob { id, .. } => self.delete_job(id).map(Response::Deleted),
            Command::PauseJob { id, .. } => self.pause_job(id, "").map(Response::Job),
            Command::PauseJobNoted { id, note, .. } => self.pause_job(id, note).map(Response::Job),
            Command::ResumeJob { id, .. } => self.resume_job(id).map(Response::Job),
            Command::TriggerJob { id, widths, .. } => {
                self.set_widths(widths)?;
                self.trigger_job(id).map(Response::Run)
            }
            Command::Fire { keys, widths, .. } => {
                self.set_widths(widths)?;
                self.fire(keys)
            }
            Command::Assign { assignments, .. } => Ok(self.assign(assignments)),
            Command::Finish { reports, .. } => self.finish_all(reports),
            Command::Expire { expired, .. } => self.expire_all(expired),
            Command::RetryRun { run, .. } => self.retry_run(run).map(Response::Run),
            Command::PutToken { token, first, .. } => {
                self.put_token(token, *first).map(Response::Token)
            }
            Command::RevokeToken { name, .. } => self.revoke_token(name).map(Response::Deleted),
            Command::Dedup {
                request_id,
                command,
            } => self.dedup(request_id, command),
            Command::RestorePairs {
                pairs, first, last, ..
            } => self.restore_pairs(pairs, *first, *last),
            Command::Housekeep { max_deletes, .. } => self.housekeep(*max_deletes),
            Command::PauseFiring { note, .. } => self.pause_firing(note).map(Response::Firing),
            Command::ResumeFiring { .. } => Ok(Response::Firing(self.resume_firing())),
            Command::StartBackfill {
                id,
                from_ms,
                to_ms,
                overlap,
                ..
            } => self
                .start_backfill(id, *from_ms, *to_ms, *overlap)
                .map(Response::Job),
            Command::CancelBackfill { id, .. } => self.cancel_backfill(id).map(Response::Job),
            Command::Authored { actor, command } => {
                if matches!(
                    **command,
                    Command::Dedup { .. } | Command::Batch { .. } | Command::Authored { .. }
                ) {
                    return Err(CommandError::Invalid(
                        "command: an author wraps one plain command".into(),
                    ));
                }
                self.actor = actor;
                self.run(command)
            }
            Command::Batch { .. } => Err(CommandError::Invalid(
                "commands: batches do not nest".into(),
            )),
            Command::ActivateLogFormat { format } => self.activate_log_format(*format),
        }
    }

    /// Raises the active log format; a format at or below it changes nothing.
    fn activate_log_format(&mut self, format: u32) -> Result<Response, CommandError> {
        if format > super::command::LOG_FORMAT {
            // Unreachable through the log (the entry's own format is checked
            // first), kept so apply is total for any command value.
            return Err(CommandError::Invalid(format!(
                "format: {format} is newer than this binary's log format {}",
                super::command::LOG_FORMAT
            )));
        }
        if format > self.log_format() {
            self.o.put(keys::META_LOG_FORMAT.to_vec(), encode(&format));
            self.known.set(Known {
                format: Some(format),
                ..self.known.get()
            });
        }
        Ok(Response::Empty)
    }

    /// The cluster's active log format (`query::log_format`), read from the
    /// state once per command, or once per batch (`apply_batch`).
    fn log_format(&self) -> u32 {
        let mut known = self.known.get();
        match known.format {
            Some(f) => f,
            None => {
                let f = query::log_format(&*self.o);
                known.format = Some(f);
                self.known.set(known);
                f
            }
        }
    }

    /// Whether key space `space` (the request-id table or the deleted-job
    /// marks) may hold a key: a lone command does not know, so reads the
    /// key it needs; a batch's commands look once whether the space is
    /// empty, and skip their reads while it stays so.
    fn space_may_hold(&self, space: u8) -> bool {
        let mut known = self.known.get();
        if !known.batch {
            return true;
        }
        let slot = match space {
            keys::DEDUP => &mut known.dedup_entries,
            keys::DELETED_JOB => &mut known.deleted_jobs,
            _ => return true,
        };
        match *slot {
            Some(filled) => filled,
            None => {
                let filled = !self.o.range(&[space], &[space + 1], 1).is_empty();
                *slot = Some(filled);
                self.known.set(known);
                filled
            }
        }
    }

    fn set_widths(&mut self, widths: &'a [(String, u32)]) -> Result<(), CommandError> {
        if widths.len() > limits::WIDTHS_MAX {
            return Err(CommandError::Invalid(format!(
                "widths: at most {} groups, got {}",
                limits::WIDTHS_MAX,
                widths.len()
            )));
        }
        self.widths = widths;
        Ok(())
    }

    /// Runs one occurrence of `job` creates: its shards, or one per worker
    /// connected at fire time for broadcast (at least one, so the occurrence
    /// is recorded and waits for a worker).
    fn fanout(&self, job: &Job) -> u32 {
        match job.policy.fanout {
            Fanout::One => 1,
            Fanout::Shards(n) => n.clamp(1, limits::SHARDS_MAX),
            Fanout::Broadcast => self
                .widths
                .iter()
                .find(|(g, _)| *g == job.group)
                .map_or(1, |(_, n)| *n)
                .clamp(1, limits::BROADCAST_MAX),
        }
    }

    // ------------------------------------------------------------ restore

    fn restore_pairs(
        &mut self,
        pairs: &[(Vec<u8>, Vec<u8>)],
        first: bool,
        last: bool,
    ) -> Result<Response, CommandError> {
        let in_progress = self.o.get(keys::META_RESTORE).is_some();
        if first {
            let occupied = keys::RESTORED_SPACES
                .iter()
                .any(|p| !self.o.range(&[*p], &[*p + 1], 1).is_empty());
            if in_progress || occupied {
                return Err(CommandError::FailedPrecondition(
                    "restore: the cluster already holds jobs, runs or timers; restore into a new cluster".into(),
                ));
            }
        } else if !in_progress {
            return Err(CommandError::FailedPrecondition(
                "restore: no restore in progress (the first part was not applied)".into(),
            ));
        }
        if let Some((k, _)) = pairs
            .iter()
            .find(|(k, _)| !k.first().is_some_and(|p| keys::RESTORED_SPACES.contains(p)))
        {
            return Err(CommandError::Invalid(format!(
                "restore: key {:?} is not scheduling state",
                String::from_utf8_lossy(k)
            )));
        }
        // Apply later decodes these values: a pair that does not is refused here.
        for (k, v) in pairs {
            let ok = match k[0] {
                keys::JOB => Job::from_record(v).is_ok(),
                keys::RUN => Run::from_record(v).is_ok(),
                keys::ACTIVE => decode::<ActiveRun>(v).is_ok(),
                keys::JOB_HISTORY => decode::<JobRevision>(v).is_ok(),
                keys::DELETED_JOB => keys::deleted_job_from(k).is_some(),
                keys::RETENTION_DUE => keys::retention_job_from(k).is_some(),
                keys::DOWNSTREAM => keys::downstream_from(k).is_some(),
                keys::RUN_INPUTS => decode::<Vec<(String, RunId)>>(v).is_ok(),
                keys::RUN_BACKFILL => decode::<(i64, i64)>(v).is_ok(),
                _ => keys::wheel_from(k).is_some(),
            };
            if !ok {
                return Err(CommandError::Invalid(format!(
                    "restore: the value of key {:?} does not decode",
                    String::from_utf8_lossy(k)
                )));
            }
        }
        for (k, v) in pairs {
            self.o.put(k.clone(), v.clone());
        }
        if last {
            self.o.delete(keys::META_RESTORE.to_vec());
            // The leader reloads its wheel and queues from the restored state.
            self.effects.push(Effect::Restored);
        } else {
            self.o.put(keys::META_RESTORE.to_vec(), Vec::new());
        }
        Ok(Response::Deleted(true))
    }

    // ------------------------------------------------------------ request ids

    /// Applies `cmd` once per request id: a repeat gets the first response.
    /// Only successes are remembered (a refusal writes nothing, so a retry
    /// is simply judged again).
    ///
    /// From log format 4 a create is remembered in the job it makes
    /// (`Job::create_request`) rather than in the table, which would cost
    /// three more keys per create (response, order, an eviction): a repeat
    /// within `DEDUP_TTL_MS` of the creation gets the job as it is now. The
    /// table takes the id when such a job is deleted within that time, so
    /// a late repeat does not make it again.
    fn dedup(&mut self, id: &'a str, cmd: &'a Command) -> Result<Response, CommandError> {
        validate::request_id(id)?;
        let plain = match cmd {
            Command::Authored { command, .. } => command,
            other => other,
        };
        if matches!(plain, Command::Dedup { .. } | Command::Batch { .. }) {
            return Err(CommandError::Invalid(
                "command: a request id wraps one plain command".into(),
            ));
        }
        if let Some(first) = self
            .space_may_hold(keys::DEDUP)
            .then(|| get::<Response, _>(&*self.o, &keys::dedup(id)))
            .flatten()
        {
            return Ok(self.completed(first));
        }
        if let Some(job_id) = created_job(plain).filter(|_| self.log_format() >= 4) {
            match self.job(job_id) {
                Ok(job) if self.recent_create_request(&job) == Some(id) => {
                    return Ok(Response::Job(job));
                }
                Ok(_) => {}
                Err(_) => self.absent_job = Some(job_id),
            }
            self.create_request = Some(id);
            return self.run(cmd);
        }
        let response = self.run(cmd)?;
        self.remember(id, &response);
        Ok(response)
    }

    /// A job answer as the request-id table gives it back, completed. The
    /// table keeps a job without its payload, and its encoding has none of
    /// the fields a job record keeps in its tails (labels, bounds, pause
    /// note, workflow, jitter, a union's later schedules...). While the job
    /// is still the generation and revision the answer was, the answer is
    /// the job as it is now, as a retried create's is; once it changed or
    /// went, the kept answer is all there is.
    fn completed(&self, first: Response) -> Response {
        let Response::Job(kept) = first else {
            return first;
        };
        match self.job(&kept.id) {
            Ok(now) if now.revision == kept.revision && now.created_at_ms == kept.created_at_ms => {
                Response::Job(now)
            }
            _ => Response::Job(kept),
        }
    }

    /// The request id `job` was created by, while a repeat of that create
    /// is still a repeat (within `DEDUP_TTL_MS`).
    fn recent_create_request<'j>(&self, job: &'j Job) -> Option<&'j str> {
        let recent = job.created_at_ms >= self.now.saturating_sub(limits::DEDUP_TTL_MS);
        job.create_request.as_deref().filter(|_| recent)
    }

    /// Keeps `response` as the answer to request `id` in the table.
    fn remember(&mut self, id: &str, response: &Response) {
        self.put(keys::dedup(id), &response.kept());
        self.o.put(keys::dedup_order(self.now, id), Vec::new());
        let count: u64 = get(&*self.o, keys::META_DEDUP_COUNT).unwrap_or(0);
        let count = self.evict_dedup(count.saturating_add(1));
        self.put(keys::META_DEDUP_COUNT.to_vec(), &count);
    }

    /// Drops the oldest entries while over the count or past the TTL, a
    /// bounded number per command. Returns the new count.
    fn evict_dedup(&mut self, mut count: u64) -> u64 {
        let oldest = self.o.range(
            &[keys::DEDUP_ORDER],
            &[keys::DEDUP_ORDER + 1],
            limits::DEDUP_EVICT_PER_COMMAND,
        );
        for (k, _) in oldest {
            let at = keys::time_from(&k[1..]).unwrap_or(i64::MIN);
            let expired = at < self.now.saturating_sub(limits::DEDUP_TTL_MS);
            if count <= limits::DEDUP_MAX && !expired {
                break;
            }
            let id = String::from_utf8_lossy(&k[9..]).into_owned();
            self.o.delete(k);
            self.o.delete(keys::dedup(&id));
            count = count.saturating_sub(1);
        }
        count
    }

    // ------------------------------------------------------------ tokens

    fn put_token(&mut self, t: &Token, first: bool) -> Result<Token, CommandError> {
        validate::token(t)?;
        let existing = self
            .o
            .range(&[keys::TOKEN], &[keys::TOKEN + 1], limits::TOKENS_MAX)
            .len();
        if first && existing > 0 {
            return Err(CommandError::FailedPrecondition(
                "tokens: the cluster already has tokens; the first admin is made only on an empty cluster".into(),
            ));
        }
        if existing >= limits::TOKENS_MAX {
            return Err(CommandError::FailedPrecondition(format!(
                "tokens: at most {}; revoke one first",
                limits::TOKENS_MAX
            )));
        }
        if self.o.get(&keys::token(&t.name)).is_some() {
            return Err(CommandError::FailedPrecondition(format!(
                "token {:?} already exists",
                t.name
            )));
        }
        if self.o.get(&keys::token_hash(&t.hash)).is_some() {
            return Err(CommandError::Invalid(
                "token.hash: another token has this secret".into(),
            ));
        }
        let token = Token {
            created_at_ms: self.now,
            ..t.clone()
        };
        self.put(keys::token(&token.name), &token);
        self.put(keys::token_hash(&token.hash), &token.name);
        Ok(token)
    }

    fn revoke_token(&mut self, name: &str) -> Result<bool, CommandError> {
        let Some(t) = get::<Token, _>(&*self.o, &keys::token(name)) else {
            return Ok(false);
        };
        self.o.delete(keys::token(name));
        self.o.delete(keys::token_hash(&t.hash));
        Ok(true)
    }

    // ------------------------------------------------------------ storage helpers

    fn put<T: Serialize>(&mut self, key: Vec<u8>, v: &T) {
        self.o.put(key, encode(v));
    }

    fn put_job(&mut self, job: &Job) {
        self.o.put(keys::job(&job.id), job.to_record());
    }

    fn job(&self, id: &str) -> Result<Job, CommandError> {
        // A record that does not decode means the store is corrupt (or a
        // format slip): stop here rather than diverge by calling it absent.
        self.o
            .get(&keys::job(id))
            .map(|b| {
                Job::from_record(&b)
                    .unwrap_or_else(|e| panic!("corrupt replicated job {id:?}: {e}"))
            })
            .ok_or_else(|| CommandError::NotFound(id.to_string()))
    }

    fn run_rec(&self, id: &RunId) -> Option<Run> {
        // A record that does not decode means the store is corrupt.
        self.o
            .get(&keys::run(id))
            .map(|b| Run::from_record(&b).expect("corrupt replicated run"))
    }

    fn put_run(&mut self, run: &Run) {
        self.o.put(keys::run(&run.id), run.to_record());
    }

    /// The job's policy (the default for a job deleted meanwhile).
    fn policy(&self, job: &str) -> Policy {
        self.job(job).map(|j| j.policy).unwrap_or_default()
    }

    /// Writes the run record and keeps its active-index entry in step.
    fn save_run(&mut self, run: &Run) {
        if run.state.is_terminal() {
            self.put_run(run);
            self.o.delete(keys::active(&run.id));
        } else {
            let policy = self.policy(&run.id.job);
            self.save_live_run(run, &policy);
        }
    }

    /// `save_run` for a run that is not terminal, with its job's policy at hand.
    fn save_live_run(&mut self, run: &Run, policy: &Policy) {
        self.put_run(run);
        let active = ActiveRun {
            group: run.group.clone(),
            priority: run.priority,
            state: run.state,
            attempt: run.attempt,
            timeout_ms: policy.timeout_ms,
            route: policy.route.clone(),
            worker: run.worker.clone(),
            shard_count: run.shard_count,
        };
        self.put(keys::active(&run.id), &active);
    }

    fn schedule_entry(&mut self, key: WheelKey) {
        self.o.put(keys::wheel(&key), Vec::new());
        self.effects.push(Effect::Scheduled(key));
    }

    /// Sets the job's one pending occurrence (or none), keeping the wheel
    /// in step: its entry fires at the nominal time plus its jitter offset.
    fn set_next(&mut self, job: &mut Job, next: Option<i64>) {
        if let Some(old) = job.next_fire_at_ms.take() {
            let key = WheelKey::jittered(&job.id, old, job.next_offset_ms);
            self.o.delete(keys::wheel(&key));
        }
        job.next_offset_ms = 0;
        if let Some(at) = next.filter(|_| !job.paused) {
            job.next_fire_at_ms = Some(at);
            job.next_offset_ms = job.offset_ms(at);
            self.schedule_entry(WheelKey::jittered(&job.id, at, job.next_offset_ms));
        }
    }

    /// Whether creates are lean (log format 5): no revision record (the job
    /// implies it, `Job::created_by`) and no lookup of a new one-shot's run.
    fn lean_creates(&self) -> bool {
        self.log_format() >= 5
    }

    /// First occurrence of a freshly (re)scheduled job, strictly after
    /// `after` except for one-shots, and not before the job's start.
    ///
    /// `new`: the job is being created. It has no runs (they are keyed by
    /// its id, and an id whose runs remain cannot be created), so from log
    /// format 5 its one-shot's run is not looked up: for a job sled has not
    /// seen, that lookup scans sled for the job's run bound.
    fn first_occurrence(
        &self,
        job: &Job,
        after: i64,
        new: bool,
    ) -> Result<Option<i64>, CommandError> {
        let start = job.bounds.start_at_ms.unwrap_or(i64::MIN);
        if let Schedule::Once { at_ms } = job.schedule {
            let runless = new && self.lean_creates();
            let fired = !runless && self.run_rec(&RunId::new(&job.id, at_ms)).is_some();
            return Ok((!fired && at_ms >= start).then_some(at_ms));
        }
        next_after(&job.schedule, after.max(start.saturating_sub(1)))
    }

    /// Sets the job's next occurrence if its bounds allow one (not after
    /// its end, fewer than `max_runs` fired); with none left the job is
    /// finished: kept, with no wheel entry.
    fn schedule_next(&mut self, job: &mut Job, next: Option<i64>) {
        let b = &job.bounds;
        let runs_left = b.max_runs.is_none_or(|max| job.fired_count < max);
        let allowed = next.filter(|at| runs_left && b.end_at_ms.is_none_or(|end| *at <= end));
        if allowed.is_some() {
            job.finished_at_ms = None;
        } else if next.is_some() {
            job.finished_at_ms = job.finished_at_ms.or(Some(self.now));
        }
        self.set_next(job, allowed);
    }

    /// Counts a scheduled occurrence fired, for a job whose bounds count them.
    fn count_fire(job: &mut Job) {
        if job.bounds.max_runs.is_some() {
            job.fired_count = job.fired_count.saturating_add(1);
        }
    }

    // ------------------------------------------------------------ job commands

    /// A `CreateJob` or `UpdateJob` whose spec has `ext` and `more` as its
    /// extensions.
    fn put_spec(
        &mut self,
        cmd: &Command,
        ext: &SpecExt,
        more: &SpecMore,
    ) -> Result<Response, CommandError> {
        match cmd {
            Command::CreateJob { spec, .. } => self.create_job(&spec.with_ext(ext, more)),
            Command::UpdateJob {
                spec,
                expected_revision,
                ..
            } => self.update_job(&spec.with_ext(ext, more), *expected_revision),
            _ => Err(CommandError::Invalid(
                "command: an extended spec wraps one job create or update".into(),
            )),
        }
        .map(Response::Job)
    }

    fn create_job(&mut self, spec: &JobSpec) -> Result<Job, CommandError> {
        validate::job_spec(spec, self.now)?;
        validate::bounds_ahead(&spec.bounds, self.now)?;
        let known_absent = self.absent_job == Some(spec.id.as_str());
        if !known_absent && self.o.get(&keys::job(&spec.id)).is_some() {
            return Err(CommandError::AlreadyExists(spec.id.clone()));
        }
        // Runs are keyed by job id: a new job must not inherit the old one's.
        if self.space_may_hold(keys::DELETED_JOB)
            && self.o.get(&keys::deleted_job(&spec.id)).is_some()
        {
            return Err(CommandError::FailedPrecondition(format!(
                "job {:?} was deleted and housekeeping is still removing its runs; create it again shortly",
                spec.id
            )));
        }
        let mut job = Job {
            id: spec.id.clone(),
            schedule: spec.resolve_schedule(self.now),
            group: spec.group.clone(),
            payload: spec.payload.clone(),
            policy: spec.policy.clone(),
            revision: 1,
            paused: false,
            created_at_ms: self.now,
            updated_at_ms: self.now,
            next_fire_at_ms: None,
            active_runs: 0,
            buffered_at_ms: None,
            history_len: 0,
            retention_due_ms: None,
            bounds: spec.bounds.clone(),
            labels: spec.labels.clone(),
            fired_count: 0,
            finished_at_ms: None,
            pause: None,
            workflow: None,
            cycle: Cycle::default(),
            max_concurrent: spec.max_concurrent,
            queued: Vec::new(),
            backfill: None,
            jitter: spec.jitter,
            next_offset_ms: 0,
            catch_up_max: spec.catch_up_max,
            create_request: self.create_request.map(str::to_string),
            // The job implies its create's revision record.
            created_by: self.lean_creates().then(|| self.actor.to_string()),
        };
        self.set_workflow(&mut job, spec.workflow.clone())?;
        let first = self.first_occurrence(&job, self.now, true)?;
        self.schedule_next(&mut job, first);
        if job.created_by.is_none() {
            self.record_revision(&mut job, "create");
        }
        self.put_job(&job);
        self.job_changed(&job, JobChange::Created);
        Ok(job)
    }

    fn update_job(&mut self, spec: &JobSpec, expected: u64) -> Result<Job, CommandError> {
        let mut job = self.job(&spec.id)?;
        // An unchanged schedule is not re-validated: a past `at` stays acceptable.
        validate::job_spec_with(spec, self.now, !spec.schedule_matches(&job.schedule))?;
        if expected != 0 && expected != job.revision {
            return Err(CommandError::RevisionMismatch {
                id: job.id,
                expected,
                actual: job.revision,
            });
        }
        let bounds_changed = spec.bounds != job.bounds;
        if bounds_changed {
            validate::bounds_ahead(&spec.bounds, self.now)?;
        }
        if spec.policy.fanout != Fanout::One && self.has_downstreams(&job.id) {
            return Err(CommandError::FailedPrecondition(format!(
                "job {:?} is an upstream of a workflow, whose runs follow one run per \
                 occurrence: it cannot be sharded or broadcast",
                job.id
            )));
        }
        self.set_workflow(&mut job, spec.workflow.clone())?;
        let reschedule = !spec.schedule_matches(&job.schedule) || bounds_changed;
        let limits_changed = (job.policy.keep_runs, job.policy.keep_for_ms)
            != (spec.policy.keep_runs, spec.policy.keep_for_ms);
        job.group = spec.group.clone();
        job.payload = spec.payload.clone();
        job.policy = spec.policy.clone();
        job.labels = spec.labels.clone();
        job.max_concurrent = spec.max_concurrent;
        job.catch_up_max = spec.catch_up_max;
        let jitter_changed = set_jitter(&mut job, spec.jitter);
        if job.policy.overlap != Overlap::BufferAll {
            for b in std::mem::take(&mut job.queued) {
                let why = "overlap buffer-all: dropped (the overlap policy changed)";
                self.record_skipped(&mut job, b, why.into());
            }
        }
        job.bounds = spec.bounds.clone();
        if limits_changed {
            // Plans only: the deleting is housekeeping's, in bounded steps.
            self.prune(&mut job, 0);
        }
        job.revision = job.revision.saturating_add(1);
        job.updated_at_ms = self.now;
        if reschedule {
            if !spec.schedule_matches(&job.schedule) {
                job.schedule = spec.resolve_schedule(self.now);
            }
            let first = self.first_occurrence(&job, self.now, false)?;
            self.schedule_next(&mut job, first);
        } else if jitter_changed {
            // The pending occurrence stays, at its offset under the new jitter.
            let pending = job.next_fire_at_ms;
            self.set_next(&mut job, pending);
        }
        self.record_revision(&mut job, "update");
        self.put_job(&job);
        self.job_changed(&job, JobChange::Updated);
        Ok(job)
    }

    fn delete_job(&mut self, id: &str) -> Result<bool, CommandError> {
        let mut job = self.job(id)?;
        let prefix = keys::downstream_of(id);
        let below = self.o.range(&prefix, &keys::prefix_end(&prefix), 4);
        if !below.is_empty() {
            let names: Vec<String> = below
                .iter()
                .filter_map(|(k, _)| keys::downstream_from(k))
                .map(|d| format!("{d:?}"))
                .collect();
            return Err(CommandError::FailedPrecondition(format!(
                "job {id:?} is an upstream of {}{}: take it out of their upstream lists \
                 (or delete them) first",
                names.join(", "),
                if below.len() > 3 { " and more" } else { "" }
            )));
        }
        self.unlink_upstreams(&job);
        self.set_next(&mut job, None);
        self.set_backfill_step(&mut job, None);
        self.cancel_active_runs(&mut job, "job deleted");
        self.set_retention_due(&mut job, None);
        if job.history_len > 0 {
            // Housekeeping removes its runs, a bounded number per command.
            self.o.put(keys::deleted_job(id), Vec::new());
        }
        // A create repeated after this must not make the job again.
        if let Some(request) = self.recent_create_request(&job).map(str::to_string) {
            if self.o.get(&keys::dedup(&request)).is_none() {
                self.remember(&request, &Response::Job(job.clone()));
            }
        }
        self.o.delete(keys::job(id));
        // The deletion is the id's last revision of this generation.
        job.revision = job.revision.saturating_add(1);
        self.record_revision(&mut job, "delete");
        self.job_changed(&job, JobChange::Deleted);
        Ok(true)
    }

    fn job_changed(&mut self, job: &Job, change: JobChange) {
        self.effects.push(Effect::JobChanged {
            job: job.id.clone(),
            group: job.group.clone(),
            change,
        });
    }

    /// Appends `job.revision` to the job's revision history, keeping the
    /// newest `JOB_REVISIONS_MAX` records of this job id (over all its
    /// generations). The create's record, while the job only implies it, is
    /// written first: the caller stores the job after this, without it.
    fn record_revision(&mut self, job: &mut Job, action: &str) {
        let revision = job.revision;
        if let Some(create) = job.implied_revision() {
            self.put(
                keys::job_history(&job.id, job.created_at_ms, create.revision),
                &create,
            );
            job.created_by = None;
        }
        let rec = JobRevision {
            revision,
            at_ms: self.now,
            by: self.actor.to_string(),
            action: action.to_string(),
        };
        self.put(
            keys::job_history(&job.id, job.created_at_ms, revision),
            &rec,
        );
        let prefix = keys::job_history_prefix(&job.id);
        let end = keys::prefix_end(&prefix);
        let max = limits::JOB_REVISIONS_MAX;
        let rows = self.o.range(&prefix, &end, max + 2);
        for (k, _) in rows.iter().take(rows.len().saturating_sub(max)) {
            self.o.delete(k.clone());
        }
    }

    /// Pauses the job, recording the note with who and when; pausing a
    /// paused job again replaces its note.
    fn pause_job(&mut self, id: &str, note: &str) -> Result<Job, CommandError> {
        validate::pause_note(note)?;
        let mut job = self.job(id)?;
        if !job.paused || job.pause.as_ref().map_or("", |p| p.note.as_str()) != note {
            self.set_next(&mut job, None);
            job.paused = true;
            job.pause = (!note.is_empty()).then(|| PauseNote {
                note: note.to_string(),
                by: self.actor.to_string(),
                at_ms: self.now,
            });
            job.revision = job.revision.saturating_add(1);
            job.updated_at_ms = self.now;
            self.record_revision(&mut job, "pause");
            self.put_job(&job);
            self.job_changed(&job, JobChange::Paused);
        }
        Ok(job)
    }

    /// Occurrences that fell while paused are not fired: the next one after now is.
    fn resume_job(&mut self, id: &str) -> Result<Job, CommandError> {
        let mut job = self.job(id)?;
        if job.paused {
            job.paused = false;
            job.pause = None;
            job.revision = job.revision.saturating_add(1);
            job.updated_at_ms = self.now;
            if job.finished_at_ms.is_none() {
                let first = self.first_occurrence(&job, self.now, false)?;
                self.schedule_next(&mut job, first);
            }
            let parked = (job.backfill.as_ref())
                .is_some_and(|b| b.next_ms.is_some() && b.step_at_ms.is_none());
            if parked {
                self.set_backfill_step(&mut job, Some(self.now));
            }
            self.record_revision(&mut job, "resume");
            self.put_job(&job);
            self.job_changed(&job, JobChange::Resumed);
        }
        Ok(job)
    }

    fn trigger_job(&mut self, id: &str) -> Result<Run, CommandError> {
        let mut job = self.job(id)?;
        if self.firing_paused().is_some() {
            return Err(CommandError::FailedPrecondition(format!(
                "job {id:?}: firing is paused cluster-wide (kairosctl cluster resume); trigger refused"
            )));
        }
        let buffers = matches!(job.policy.overlap, Overlap::BufferOne | Overlap::BufferAll);
        if job.active_runs >= job.capacity() && buffers {
            return Err(CommandError::FailedPrecondition(format!(
                "job {id:?} is at its {} active run(s) and overlap {}; trigger refused",
                job.capacity(),
                if job.policy.overlap == Overlap::BufferOne {
                    "buffer-one"
                } else {
                    "buffer-all"
                }
            )));
        }
        let run_id = RunId::new(id, self.now);
        if self.run_rec(&run_id).is_some() {
            return Err(CommandError::FailedPrecondition(format!(
                "job {id:?} already has a run scheduled at {}; trigger again",
                self.now
            )));
        }
        self.start_run(&mut job, self.now, 0, "manual trigger".to_string());
        self.put_job(&job);
        if let Some(run) = self.run_rec(&run_id) {
            return Ok(run);
        }
        // Held by overlap `replace` until the runs it replaces stop: the run
        // it will be, not stored yet.
        let note = "manual trigger: starts once the replaced run(s) stop";
        Ok(self.new_run(&job, run_id, 1, RunState::Pending, note.into()))
    }

    // ------------------------------------------------------------ cluster firing pause

    fn firing_paused(&self) -> Option<PauseNote> {
        get(&*self.o, keys::META_FIRING_PAUSED)
    }

    /// Pausing while paused keeps the first pause's who and when.
    fn pause_firing(&mut self, note: &str) -> Result<Option<PauseNote>, CommandError> {
        validate::pause_note(note)?;
        if let Some(p) = self.firing_paused() {
            return Ok(Some(p));
        }
        let p = PauseNote {
            note: note.to_string(),
            by: self.actor.to_string(),
            at_ms: self.now,
        };
        self.put(keys::META_FIRING_PAUSED.to_vec(), &p);
        Ok(Some(p))
    }

    /// The leader reloads its wheel: keys it proposed while firing was
    /// paused were left in place by apply but taken out of its wheel.
    fn resume_firing(&mut self) -> Option<PauseNote> {
        if self.firing_paused().is_some() {
            self.o.delete(keys::META_FIRING_PAUSED.to_vec());
            self.effects.push(Effect::FiringResumed);
        }
        None
    }

    // ------------------------------------------------------------ firing

    fn fire(&mut self, wheel_keys: &[WheelKey]) -> Result<Response, CommandError> {
        if wheel_keys.len() > limits::FIRE_BATCH_MAX {
            return Err(CommandError::Invalid(format!(
                "keys: at most {} per fire, got {}",
                limits::FIRE_BATCH_MAX,
                wheel_keys.len()
            )));
        }
        let (mut runs, mut skipped) = (0u32, 0u32);
        if self.firing_paused().is_some() {
            // The entries stay: they fire, late, once firing resumes.
            skipped = u32::try_from(wheel_keys.len()).unwrap_or(u32::MAX);
            return Ok(Response::Fired {
                runs,
                skipped_keys: skipped,
            });
        }
        for key in wheel_keys {
            let fired = key.fire_at_ms <= self.now && self.fire_key(key)?;
            if fired {
                runs += 1;
            } else {
                skipped += 1;
            }
        }
        Ok(Response::Fired {
            runs,
            skipped_keys: skipped,
        })
    }

    /// Fires one due key; false when the entry no longer exists or is stale.
    fn fire_key(&mut self, key: &WheelKey) -> Result<bool, CommandError> {
        let wk = keys::wheel(key);
        if self.o.get(&wk).is_none() {
            return Ok(false);
        }
        self.o.delete(wk);
        match key.kind {
            EntryKind::Occurrence => {
                let Ok(mut job) = self.job(&key.job) else {
                    return Ok(false);
                };
                let pending = WheelKey::jittered(&job.id, key.scheduled_at_ms, job.next_offset_ms);
                if job.paused
                    || job.next_fire_at_ms != Some(key.scheduled_at_ms)
                    || pending.fire_at_ms != key.fire_at_ms
                {
                    return Ok(false);
                }
                job.next_fire_at_ms = None;
                job.next_offset_ms = 0;
                self.fire_occurrence(&mut job, key.scheduled_at_ms)?;
                self.put_job(&job);
                Ok(true)
            }
            EntryKind::Retry => Ok(self.fire_retry(&key.run_id(), key.fire_at_ms)),
            EntryKind::Backfill => Ok(self.backfill_step(&key.job, key.fire_at_ms)),
        }
    }

    /// Runs (or records) the occurrence nominally at `scheduled` per the
    /// misfire policy and schedules the next one from the nominal time, not
    /// from now. Lateness is counted from the occurrence's fire time (its
    /// nominal time plus its jitter offset).
    fn fire_occurrence(&mut self, job: &mut Job, scheduled: i64) -> Result<(), CommandError> {
        let late_ms = self.now.saturating_sub(job.fire_time(scheduled));
        let grace = i64::try_from(job.policy.misfire_grace_ms).unwrap_or(i64::MAX);
        let late = late_ms > grace;
        if late {
            self.effects.push(Effect::Misfired {
                group: job.group.clone(),
                policy: job.policy.misfire,
            });
        }
        let next = match (late, job.policy.misfire) {
            (false, _) => {
                self.start_occurrence(job, scheduled, String::new());
                Self::count_fire(job);
                next_after(&job.schedule, scheduled)?
            }
            (true, Misfire::FireAll) => self.catch_up(job, scheduled)?,
            (true, Misfire::Skip) => {
                // Skipped: the occurrences past the grace window. Those still
                // inside it are due, not late: the next one is due now and runs.
                let cutoff = self.now.saturating_sub(grace).saturating_sub(1);
                let walk = walk_missed(job, scheduled, cutoff, cutoff)?;
                let note = format!(
                    "misfire skip: {} occurrence(s) from {scheduled} to {} not run",
                    walk.count_text(),
                    walk.last
                );
                self.record_skipped(job, scheduled, note);
                walk.next
            }
            (true, Misfire::FireOnce) => {
                // The coalesced occurrence is the latest due one within the job's end.
                let end = job.bounds.end_at_ms.unwrap_or(i64::MAX);
                let walk = walk_missed(job, scheduled, end, self.now)?;
                let note = format!(
                    "misfire fire-once: coalesced {} missed occurrence(s) from {scheduled}, late by {} ms",
                    walk.count_text(),
                    self.now.saturating_sub(job.fire_time(walk.last))
                );
                self.start_occurrence(job, walk.last, note);
                Self::count_fire(job);
                walk.next
            }
        };
        self.schedule_next(job, next);
        Ok(())
    }

    /// A late occurrence of a `fire-all` job: it runs, unless more than the
    /// job's catch-up cap are due; then the older ones are recorded skipped
    /// in one note and the newest `cap` run in order, from the oldest of
    /// them. Returns the next occurrence to schedule.
    fn catch_up(&mut self, job: &mut Job, scheduled: i64) -> Result<Option<i64>, CommandError> {
        let mut at = scheduled;
        if let Some(cap) = self.catch_up_cap(job) {
            if let Some(c) = catch_up_limit(job, scheduled, self.now, cap)? {
                let note = format!(
                    "misfire fire-all: catch-up cap {cap}: {} missed occurrence(s) from {scheduled} to {} not run{}",
                    c.skipped,
                    c.last_skipped,
                    if c.more { "; more follow" } else { "" }
                );
                self.record_skipped(job, scheduled, note);
                if c.more {
                    // The next command goes on from there, checking the cap again.
                    return Ok(Some(c.resume_at));
                }
                at = c.resume_at;
            }
        }
        let late_ms = self.now.saturating_sub(job.fire_time(at));
        self.start_occurrence(job, at, format!("late by {late_ms} ms (misfire fire-all)"));
        Self::count_fire(job);
        next_after(&job.schedule, at)
    }

    /// The job's own cap, else the default once the cluster writes log
    /// format 4: a member of an older release runs every missed
    /// occurrence, and replicas must decide alike.
    fn catch_up_cap(&self, job: &Job) -> Option<u32> {
        let format_4 = self.log_format() >= 4;
        job.catch_up_max
            .or(format_4.then_some(limits::CATCH_UP_DEFAULT))
    }

    /// Only the run's current retry entry starts the next attempt; an entry
    /// left behind by a cancelled or manually retried attempt is stale.
    fn fire_retry(&mut self, id: &RunId, at_ms: i64) -> bool {
        let Some(mut run) = self.run_rec(id) else {
            return false;
        };
        if run.state != RunState::RetryWait || run.retry_at_ms != Some(at_ms) {
            return false;
        }
        run.retry_at_ms = None;
        // Cannot overflow: a run waits for a retry only below `max_attempts`.
        run.attempt += 1;
        run.state = RunState::Pending;
        run.worker.clear();
        let policy = self.policy(&id.job);
        self.ready(&run, &policy);
        self.save_live_run(&run, &policy);
        true
    }

    fn ready(&mut self, run: &Run, policy: &Policy) {
        self.effects.push(Effect::Ready(ReadyRun {
            run: run.id.clone(),
            attempt: run.attempt,
            fired_at_ms: Some(run.fired_at_ms),
            group: run.group.clone(),
            priority: run.priority,
            timeout_ms: policy.timeout_ms,
            route: policy.route.clone(),
            shard_count: run.shard_count,
            offset_ms: run.offset_ms,
        }));
    }

    fn new_run(&self, job: &Job, id: RunId, shards: u32, state: RunState, note: String) -> Run {
        Run {
            id,
            group: job.group.clone(),
            priority: job.policy.priority,
            fired_at_ms: self.now,
            state,
            attempt: 1,
            worker: String::new(),
            received_at_ms: 0,
            finished_at_ms: if state.is_terminal() { self.now } else { 0 },
            result: Vec::new(),
            error: String::new(),
            note,
            retry_at_ms: None,
            shard_count: shards,
            offset_ms: 0,
        }
    }

    /// One `skipped` record (shard 0) stands for the whole occurrence.
    fn record_skipped(&mut self, job: &mut Job, scheduled: i64, note: String) {
        let id = RunId::new(&job.id, scheduled);
        if self.run_rec(&id).is_none() {
            let run = self.new_run(job, id, 1, RunState::Skipped, note);
            self.finished(&run);
            self.save_run(&run);
            self.trim_history(job, 1);
            self.after_finish(job, false);
        }
    }

    /// Counts `added` new run records and, past the job's `keep_runs`,
    /// deletes up to `added` of its oldest finished ones (a larger excess,
    /// after a lowered limit, is housekeeping's, in bounded steps).
    fn trim_history(&mut self, job: &mut Job, added: u64) {
        job.history_len = job.history_len.saturating_add(added);
        if job.history_len > job.policy.keep_runs {
            self.prune(job, usize::try_from(added).unwrap_or(usize::MAX));
        }
    }

    /// Starts the runs of the occurrence (one per shard), honouring the
    /// overlap policy. The `(job, scheduled)` pair is unique: an existing
    /// record of shard 0 means the occurrence already happened, and wins.
    /// `offset_ms`: the jitter offset a scheduled occurrence fired at (0 otherwise).
    fn start_run(&mut self, job: &mut Job, scheduled: i64, offset_ms: u64, note: String) {
        if self.run_rec(&RunId::new(&job.id, scheduled)).is_some() {
            return;
        }
        if job.active_runs >= job.capacity() {
            match job.policy.overlap {
                Overlap::Allow => {
                    let note = format!(
                        "max-concurrent {}: {} runs still active",
                        job.capacity(),
                        job.active_runs
                    );
                    return self.record_skipped(job, scheduled, note);
                }
                Overlap::Forbid => {
                    return self.record_skipped(
                        job,
                        scheduled,
                        "overlap forbid: previous run still active".into(),
                    );
                }
                Overlap::BufferAll => {
                    if job.queued.len() >= limits::BUFFER_ALL_MAX {
                        let note = format!(
                            "overlap buffer-all: {} occurrences already wait",
                            limits::BUFFER_ALL_MAX
                        );
                        return self.record_skipped(job, scheduled, note);
                    }
                    job.queued.push(scheduled);
                    return;
                }
                Overlap::BufferOne => {
                    if let Some(older) = job.buffered_at_ms.replace(scheduled) {
                        self.record_skipped(
                            job,
                            older,
                            "overlap buffer-one: superseded by a newer occurrence".into(),
                        );
                    }
                    return;
                }
                Overlap::Replace => {
                    let why = format!("replaced by occurrence {scheduled}");
                    if !self.replace_waits() {
                        self.cancel_active_runs(job, &why);
                    } else if self.stop_for_replacement(job, &why) {
                        if let Some(older) = job.buffered_at_ms.replace(scheduled) {
                            let note = "overlap replace: superseded by a newer occurrence";
                            self.record_skipped(job, older, note.into());
                        }
                        return;
                    }
                }
            }
        }
        self.create_runs(job, scheduled, offset_ms, note);
    }

    /// Whether `replace` waits for the runs it cancels to stop (see
    /// `Job::being_replaced`).
    fn replace_waits(&self) -> bool {
        Job::replace_waits(self.log_format())
    }

    fn being_replaced(&self, job: &Job) -> bool {
        job.being_replaced(self.log_format())
    }

    /// Overlap `replace`: cancels at once the runs no worker holds, and asks
    /// the workers of running ones to stop. True while some still run: each
    /// ends when its worker's finish arrives or its lease runs out.
    fn stop_for_replacement(&mut self, job: &mut Job, why: &str) -> bool {
        let mut running = false;
        for run in self.active_runs_of(job) {
            if run.state != RunState::Running {
                self.cancel_run(run, why);
                job.active_runs = job.active_runs.saturating_sub(1);
                self.after_finish(job, true);
                continue;
            }
            self.effects.push(Effect::Cancel {
                run: run.id.clone(),
                attempt: run.attempt,
            });
            running = true;
        }
        running
    }

    /// Creates the occurrence's runs, one per shard, whatever else runs
    /// (the caller applied its overlap policy); past `ACTIVE_RUNS_MAX` the
    /// occurrence is recorded skipped instead. `offset_ms` as for `start_run`.
    fn create_runs(&mut self, job: &mut Job, scheduled: i64, offset_ms: u64, note: String) {
        let shards = self.fanout(job);
        if job.active_runs.saturating_add(shards) > limits::ACTIVE_RUNS_MAX {
            let note = format!(
                "too many active runs: {} of at most {} active, the occurrence needs {shards}",
                job.active_runs,
                limits::ACTIVE_RUNS_MAX
            );
            return self.record_skipped(job, scheduled, note);
        }
        for shard in 0..shards {
            let id = RunId::shard(&job.id, scheduled, shard);
            let run = Run {
                offset_ms,
                ..self.new_run(job, id, shards, RunState::Pending, note.clone())
            };
            self.ready(&run, &job.policy);
            self.save_live_run(&run, &job.policy);
        }
        job.active_runs = job.active_runs.saturating_add(shards);
        self.trim_history(job, shards as u64);
    }

    /// Cancels the job's active runs: at most `ACTIVE_RUNS_MAX`, since no
    /// more are ever started.
    fn cancel_active_runs(&mut self, job: &mut Job, why: &str) {
        for run in self.active_runs_of(job) {
            self.cancel_run(run, why);
        }
        if job.active_runs > 0 {
            self.after_finish(job, true);
        }
        job.active_runs = 0;
        if let Some(b) = job.buffered_at_ms.take() {
            self.record_skipped(job, b, format!("overlap buffer-one: dropped ({why})"));
        }
        for b in std::mem::take(&mut job.queued) {
            self.record_skipped(job, b, format!("overlap buffer-all: dropped ({why})"));
        }
    }

    /// The job's runs not yet terminal: at most `ACTIVE_RUNS_MAX`, since no
    /// more are ever started.
    fn active_runs_of(&self, job: &Job) -> Vec<Run> {
        let prefix = keys::active_of(&job.id);
        let limit = limits::ACTIVE_RUNS_MAX as usize;
        let active = self.o.range(&prefix, &keys::prefix_end(&prefix), limit);
        (active.iter())
            .filter_map(|(k, _)| self.run_rec(&keys::run_id_from(k)?))
            .collect()
    }

    /// Ends an active run as cancelled, telling its worker to stop. The
    /// caller keeps the job's count.
    fn cancel_run(&mut self, mut run: Run, why: &str) {
        self.effects.push(Effect::Cancel {
            run: run.id.clone(),
            attempt: run.attempt,
        });
        self.effects.push(Effect::Ended {
            run: run.id.clone(),
            attempt: run.attempt,
        });
        run.state = RunState::Cancelled;
        run.finished_at_ms = self.now;
        run.note = why.to_string();
        self.finished(&run);
        self.save_run(&run);
    }

    /// A run left the active set: update the job's count and start a buffered occurrence.
    fn end_run(&mut self, run: &Run) {
        self.effects.push(Effect::Ended {
            run: run.id.clone(),
            attempt: run.attempt,
        });
        let Ok(mut job) = self.job(&run.id.job) else {
            return;
        };
        let replacing = self.being_replaced(&job);
        job.active_runs = job.active_runs.saturating_sub(1);
        self.after_finish(&mut job, true);
        self.wake_backfill(&mut job);
        if replacing {
            // The replacement starts once every run it replaces has stopped.
            if let Some(b) = job.buffered_at_ms.filter(|_| job.active_runs == 0) {
                job.buffered_at_ms = None;
                let note = "overlap replace: started once the replaced run(s) stopped";
                let offset = job.offset_ms(b);
                self.start_run(&mut job, b, offset, note.into());
            }
        } else if job.active_runs < job.capacity() {
            if let Some(b) = job.buffered_at_ms.take() {
                let (why, offset) = (
                    "overlap buffer-one: started after the previous run",
                    job.offset_ms(b),
                );
                self.start_run(&mut job, b, offset, why.into());
            } else if !job.queued.is_empty() {
                let b = job.queued.remove(0);
                let (why, offset) = (
                    "overlap buffer-all: started in order after an earlier run",
                    job.offset_ms(b),
                );
                self.start_run(&mut job, b, offset, why.into());
            }
        }
        self.put_job(&job);
    }

    // ------------------------------------------------------------ backfill

    fn start_backfill(
        &mut self,
        id: &str,
        from_ms: i64,
        to_ms: i64,
        overlap: BackfillOverlap,
    ) -> Result<Job, CommandError> {
        let mut job = self.job(id)?;
        if let Some(b) = job.backfill.as_ref().filter(|b| b.in_progress()) {
            return Err(CommandError::FailedPrecondition(format!(
                "job {id:?} has a backfill in progress ({} of {} occurrences of [{}, {})): \
                 wait for it or cancel it (kairosctl job backfill {id} --cancel)",
                b.done(),
                b.total,
                b.from_ms,
                b.to_ms
            )));
        }
        if job.workflow.is_some() {
            return Err(CommandError::FailedPrecondition(format!(
                "job {id:?} runs on its upstreams' cycles; a backfill would run it without one"
            )));
        }
        let (first, total) = backfill::plan(&job.schedule, from_ms, to_ms, self.now)?;
        job.backfill = Some(Backfill {
            from_ms,
            to_ms,
            overlap,
            schedule: job.schedule.clone(),
            next_ms: Some(first),
            total,
            started: 0,
            existing: 0,
            skipped: 0,
            by: self.actor.to_string(),
            started_at_ms: self.now,
            ended_at_ms: None,
            cancelled: false,
            step_at_ms: None,
            waiting: false,
        });
        self.set_backfill_step(&mut job, Some(self.now));
        self.put_job(&job);
        Ok(job)
    }

    fn cancel_backfill(&mut self, id: &str) -> Result<Job, CommandError> {
        let mut job = self.job(id)?;
        if !job.backfill.as_ref().is_some_and(Backfill::in_progress) {
            return Err(CommandError::FailedPrecondition(format!(
                "job {id:?} has no backfill in progress"
            )));
        }
        self.set_backfill_step(&mut job, None);
        if let Some(b) = job.backfill.as_mut() {
            b.cancelled = true;
            b.ended_at_ms = Some(self.now);
        }
        self.put_job(&job);
        Ok(job)
    }

    /// Moves the backfill's one step entry to `at` (or removes it).
    fn set_backfill_step(&mut self, job: &mut Job, at: Option<i64>) {
        let Some(b) = job.backfill.as_mut() else {
            return;
        };
        if let Some(old) = b.step_at_ms.take() {
            self.o
                .delete(keys::wheel(&WheelKey::backfill(&job.id, old)));
        }
        if let Some(at) = at {
            b.step_at_ms = Some(at);
            self.schedule_entry(WheelKey::backfill(&job.id, at));
        }
    }

    /// One step: up to `BACKFILL_STEP_OCCURRENCES` occurrences from the
    /// cursor, in order; the next step follows `BACKFILL_STEP_MS` later
    /// until the range is done. A paused job's backfill parks without a
    /// step entry (no log entries while paused); resuming the job re-arms
    /// it. False for a stale entry.
    fn backfill_step(&mut self, id: &str, at_ms: i64) -> bool {
        let Ok(mut job) = self.job(id) else {
            return false;
        };
        let Some(mut b) = job.backfill.take().filter(|b| b.step_at_ms == Some(at_ms)) else {
            return false;
        };
        b.step_at_ms = None;
        b.waiting = false;
        let mut budget = if job.paused {
            0
        } else {
            limits::BACKFILL_STEP_OCCURRENCES
        };
        while let (Some(at), true) = (b.next_ms, budget > 0) {
            if !self.backfill_occurrence(&mut job, &mut b, at) {
                b.waiting = true;
                break;
            }
            // A schedule error (none is stored valid and then fails) ends the range.
            b.next_ms = backfill::next_in(&b.schedule, at, b.to_ms).unwrap_or(None);
            budget -= 1;
        }
        let more = b.next_ms.is_some();
        if !more {
            b.ended_at_ms = Some(self.now);
        }
        let delay = match b.waiting {
            true => limits::BACKFILL_WAIT_POLL_MS,
            false => limits::BACKFILL_STEP_MS,
        };
        job.backfill = Some(b);
        let step = (more && !job.paused).then(|| self.now.saturating_add(delay));
        self.set_backfill_step(&mut job, step);
        self.put_job(&job);
        true
    }

    /// A run of the job ended: a backfill waiting for room takes its next
    /// step now instead of at its slow poll.
    fn wake_backfill(&mut self, job: &mut Job) {
        let waiting = (job.backfill.as_mut()).filter(|b| b.waiting && b.step_at_ms.is_some());
        if let (Some(b), false) = (waiting, job.paused) {
            b.waiting = false;
            self.set_backfill_step(job, Some(self.now));
        }
    }

    /// Creates the backfilled occurrence at `at`, marking its runs; false
    /// when it must wait for room (overlap `buffer-all`).
    fn backfill_occurrence(&mut self, job: &mut Job, b: &mut Backfill, at: i64) -> bool {
        let id = RunId::new(&job.id, at);
        if self.run_rec(&id).is_some() {
            b.existing += 1;
            return true;
        }
        let full = job.active_runs >= job.capacity();
        if full && b.overlap == BackfillOverlap::BufferAll {
            return false;
        }
        let range = format!("backfill [{}, {})", b.from_ms, b.to_ms);
        if full && b.overlap == BackfillOverlap::Skip {
            self.record_skipped(job, at, format!("{range}: the job was busy (overlap skip)"));
        } else {
            // The past range's occurrences are run now: no jitter offset.
            self.create_runs(job, at, 0, range);
        }
        match self.run_rec(&id).map(|r| r.state) {
            Some(RunState::Skipped) => b.skipped += 1,
            _ => {
                b.started += 1;
                self.effects.push(Effect::Backfilled(id.clone()));
            }
        }
        self.put(keys::run_backfill(&id), &(b.from_ms, b.to_ms));
        true
    }

    // ------------------------------------------------------------ workflows

    /// Sets the job's upstream declaration (`None`: none), checking what the
    /// state decides (each upstream exists, runs once per occurrence, has
    /// room for another downstream, and no cycle closes) and keeping the
    /// downstream index. A changed upstream set starts a fresh cycle.
    fn set_workflow(&mut self, job: &mut Job, wf: Option<Workflow>) -> Result<(), CommandError> {
        let old: Vec<String> = job
            .workflow
            .iter()
            .flat_map(|w| w.upstream.clone())
            .collect();
        let new: Vec<String> = wf.iter().flat_map(|w| w.upstream.clone()).collect();
        for u in new.iter().filter(|u| !old.contains(u)) {
            let up = self
                .job(u)
                .map_err(|_| CommandError::Invalid(format!("upstream: job {u:?} not found")))?;
            if up.policy.fanout != Fanout::One {
                return Err(CommandError::Invalid(format!(
                    "upstream: job {u:?} is sharded or broadcast; a workflow follows one run per occurrence"
                )));
            }
            let prefix = keys::downstream_of(u);
            let max = limits::DOWNSTREAMS_MAX;
            if self.o.range(&prefix, &keys::prefix_end(&prefix), max).len() >= max {
                return Err(CommandError::Invalid(format!(
                    "upstream: job {u:?} already has {max} downstream jobs, the most allowed"
                )));
            }
        }
        if !new.is_empty() {
            let walk = workflow::cycle_path(&job.id, &new, limits::WORKFLOW_WALK_MAX, |j| {
                self.job(j)
                    .ok()
                    .and_then(|x| x.workflow)
                    .map(|w| w.upstream)
                    .unwrap_or_default()
            });
            match walk {
                Ok(None) => {}
                Ok(Some(path)) => {
                    return Err(CommandError::Invalid(format!(
                        "upstream: would close a cycle {}",
                        path.join(" -> ")
                    )))
                }
                Err(max) => {
                    return Err(CommandError::Invalid(format!(
                        "upstream: the upstream graph above this job has more than {max} jobs; \
                         the cycle check stops there"
                    )))
                }
            }
        }
        for u in old.iter().filter(|u| !new.contains(u)) {
            self.o.delete(keys::downstream(u, &job.id));
        }
        for u in new.iter().filter(|u| !old.contains(u)) {
            self.o.put(keys::downstream(u, &job.id), Vec::new());
        }
        if old != new {
            job.cycle = Cycle {
                last_run_ms: job.cycle.last_run_ms,
                ..Cycle::default()
            };
        }
        job.workflow = wf;
        Ok(())
    }

    fn has_downstreams(&self, id: &str) -> bool {
        let prefix = keys::downstream_of(id);
        !self
            .o
            .range(&prefix, &keys::prefix_end(&prefix), 1)
            .is_empty()
    }

    fn unlink_upstreams(&mut self, job: &Job) {
        for u in job.workflow.iter().flat_map(|w| &w.upstream) {
            self.o.delete(keys::downstream(u, &job.id));
        }
    }

    /// Hands each run that ended in this command to the workflows that
    /// follow its job; runs those start may end at once (skipped), and are
    /// followed in turn. The graph has no cycle, so this ends.
    fn follow_upstreams(&mut self) {
        // One look at the index spares every finish a lookup when no job
        // has upstreams.
        let any = !self.ended.is_empty()
            && !self
                .o
                .range(&[keys::DOWNSTREAM], &[keys::DOWNSTREAM + 1], 1)
                .is_empty();
        if !any {
            return;
        }
        let mut next = 0;
        while next < self.ended.len() {
            let (run, outcome) = self.ended[next].clone();
            next += 1;
            let prefix = keys::downstream_of(&run.job);
            let rows = self
                .o
                .range(&prefix, &keys::prefix_end(&prefix), limits::DOWNSTREAMS_MAX);
            for (k, _) in rows {
                if let Some(d) = keys::downstream_from(&k) {
                    let d = d.to_string();
                    self.upstream_ended(&d, &run, outcome);
                }
            }
        }
    }

    /// Records that an upstream run of job `id` ended and decides its cycle.
    /// A paused or finished job does not follow its upstreams meanwhile.
    fn upstream_ended(&mut self, id: &str, run: &RunId, outcome: RunState) {
        let Ok(mut job) = self.job(id) else { return };
        let Some(wf) = job.workflow.clone() else {
            return;
        };
        if job.paused || job.finished_at_ms.is_some() {
            return;
        }
        job.cycle.blocked = None;
        let seen = Seen {
            run: run.clone(),
            outcome,
        };
        job.cycle.seen.insert(run.job.clone(), seen);
        match workflow::decide(&wf, &job.cycle.seen) {
            Decision::Wait => {}
            Decision::Drop(why) => {
                job.cycle.seen.clear();
                job.cycle.blocked = Some(why);
            }
            Decision::Run(consumed) => {
                job.cycle.seen.clear();
                if job.schedule == Schedule::Upstream {
                    self.run_upstream_only(&mut job, consumed);
                } else if let Some(at) = job.cycle.held_at_ms.take() {
                    let offset = job.offset_ms(at);
                    self.start_workflow_run(&mut job, at, offset, consumed, String::new());
                } else {
                    job.cycle.ready = Some(consumed);
                }
            }
        }
        self.put_job(&job);
    }

    /// A cycle of a job without a schedule of its own runs now, within its
    /// bounds (a cycle before its start is dropped; its end or its
    /// `max_runs` finishes it).
    fn run_upstream_only(&mut self, job: &mut Job, consumed: Vec<(String, RunId)>) {
        let b = &job.bounds;
        if b.start_at_ms.is_some_and(|s| self.now < s) {
            job.cycle.blocked = Some(format!(
                "a cycle completed before the job's start at {}",
                b.start_at_ms.unwrap_or_default()
            ));
            return;
        }
        if b.end_at_ms.is_some_and(|e| self.now > e) {
            job.finished_at_ms = Some(self.now);
            return;
        }
        let mut at = self.now.max(job.cycle.last_run_ms.saturating_add(1));
        while self.run_rec(&RunId::new(&job.id, at)).is_some() {
            at = at.saturating_add(1);
        }
        self.start_workflow_run(job, at, 0, consumed, String::new());
        Self::count_fire(job);
        if job.bounds.max_runs.is_some_and(|m| job.fired_count >= m) {
            job.finished_at_ms = Some(self.now);
        }
    }

    /// An occurrence of the job's own schedule: a job of a workflow runs it
    /// only with a completed cycle, else the occurrence waits for one (the
    /// newest waits; an older waiting one is recorded as skipped).
    fn start_occurrence(&mut self, job: &mut Job, scheduled: i64, note: String) {
        let offset = job.offset_ms(scheduled);
        if job.workflow.is_none() {
            return self.start_run(job, scheduled, offset, note);
        }
        if let Some(consumed) = job.cycle.ready.take() {
            return self.start_workflow_run(job, scheduled, offset, consumed, note);
        }
        if let Some(older) = job.cycle.held_at_ms.replace(scheduled) {
            let why = "workflow: no upstream cycle completed before the next occurrence";
            self.record_skipped(job, older, why.into());
        }
    }

    /// Starts the job's run at `at` for a completed cycle, recording the
    /// upstream runs it consumed (for `runs get` and the results its workers get).
    fn start_workflow_run(
        &mut self,
        job: &mut Job,
        at: i64,
        offset_ms: u64,
        consumed: Vec<(String, RunId)>,
        note: String,
    ) {
        let after: Vec<String> = consumed.iter().map(|(_, r)| r.to_string()).collect();
        let mut text = format!("workflow: after {}", after.join(", "));
        if !note.is_empty() {
            text = format!("{note}; {text}");
        }
        job.cycle = Cycle {
            last_run_ms: at,
            ..Cycle::default()
        };
        self.start_run(job, at, offset_ms, text);
        let id = RunId::new(&job.id, at);
        if self.run_rec(&id).is_some() {
            self.put(keys::run_inputs(&id), &consumed);
        }
    }

    // ------------------------------------------------------------ retention

    /// Deletes the job's oldest run records while they may go (finished,
    /// and past `keep_runs` or `keep_for`), at most `limit` (0 only plans),
    /// then sets when housekeeping should look at the job next. Records go
    /// in key (scheduled) order: one that must stay, an active run or one
    /// finished within `keep_for`, holds back those after it. One read of
    /// `limit + 1` records, not one per record.
    fn prune(&mut self, job: &mut Job, limit: usize) -> usize {
        let prefix = keys::runs_of(&job.id);
        let end = keys::prefix_end(&prefix);
        let rows = self.o.range(&prefix, &end, limit.saturating_add(1));
        let (mut removed, mut oldest_kept) = (0, None);
        for (key, value) in rows {
            let run = Run::from_record(&value).expect("corrupt replicated run");
            if removed == limit || !self.may_go(job, &run) {
                oldest_kept = Some(run);
                break;
            }
            self.delete_run_extras(&run.id);
            self.o.delete(key);
            job.history_len = job.history_len.saturating_sub(1);
            removed += 1;
        }
        let due = oldest_kept.and_then(|r| self.retention_due(job, &r));
        self.set_retention_due(job, due);
        removed
    }

    /// Deletes the records a run may have beside its own: a workflow
    /// run's inputs, a backfilled run's range. Most runs have neither, and
    /// deleting a key the state does not hold still costs a write to the
    /// window and a lookup below it when the window is merged, so each is
    /// deleted only when present; the state that results is the same.
    fn delete_run_extras(&mut self, id: &RunId) {
        for key in [keys::run_inputs(id), keys::run_backfill(id)] {
            if self.o.get(&key).is_some() {
                self.o.delete(key);
            }
        }
    }

    fn may_go(&self, job: &Job, run: &Run) -> bool {
        let expired = expiry(&job.policy, run.finished_at_ms).is_some_and(|at| at <= self.now);
        run.state.is_terminal() && (job.history_len > job.policy.keep_runs || expired)
    }

    /// When the job's oldest record may go: now while the job holds more
    /// than `keep_runs`, else when it passes `keep_for`; an active run
    /// not before it ends.
    fn retention_due(&self, job: &Job, oldest: &Run) -> Option<i64> {
        if !oldest.state.is_terminal() {
            None
        } else if job.history_len > job.policy.keep_runs {
            Some(self.now)
        } else {
            expiry(&job.policy, oldest.finished_at_ms)
        }
    }

    /// Runs of `job` finished now: housekeeping must look at the job when
    /// they pass `keep_for`, and at once if a run that ended (`ended_active`)
    /// may have held back records past `keep_runs`.
    fn after_finish(&mut self, job: &mut Job, ended_active: bool) {
        let due = if ended_active && job.history_len > job.policy.keep_runs {
            Some(self.now)
        } else {
            expiry(&job.policy, self.now)
        };
        if let Some(due) = due.filter(|d| job.retention_due_ms.is_none_or(|cur| *d < cur)) {
            self.set_retention_due(job, Some(due));
        }
    }

    /// Sets when housekeeping looks at the job next (or never), keeping its
    /// one `RETENTION_DUE` entry in step. The caller saves the job.
    fn set_retention_due(&mut self, job: &mut Job, due: Option<i64>) {
        if job.retention_due_ms == due {
            return;
        }
        if let Some(old) = job.retention_due_ms.take() {
            self.o.delete(keys::retention_due(old, &job.id));
        }
        if let Some(at) = due {
            job.retention_due_ms = Some(at);
            self.o.put(keys::retention_due(at, &job.id), Vec::new());
        }
    }

    /// Deletes run records of deleted jobs first, then records past their
    /// job's limits: at most `max_deletes` in all, looking at no more than
    /// `HOUSEKEEP_JOBS_MAX` jobs.
    fn housekeep(&mut self, max_deletes: u32) -> Result<Response, CommandError> {
        if max_deletes == 0 || max_deletes > limits::HOUSEKEEP_DELETES_MAX {
            return Err(CommandError::Invalid(format!(
                "max_deletes: must be between 1 and {}, got {max_deletes}",
                limits::HOUSEKEEP_DELETES_MAX
            )));
        }
        let mut budget = max_deletes as usize;
        let space = [keys::DELETED_JOB];
        let end = [keys::DELETED_JOB + 1];
        let deleted = self.o.range(&space, &end, limits::HOUSEKEEP_JOBS_MAX);
        let jobs_left = limits::HOUSEKEEP_JOBS_MAX - deleted.len();
        for (key, _) in deleted {
            if budget == 0 {
                break;
            }
            budget -= self.remove_deleted_runs(key, budget);
        }
        let start = [keys::RETENTION_DUE];
        let due = self
            .o
            .range(&start, &keys::retention_due_upto(self.now), jobs_left);
        for (key, _) in due {
            if budget == 0 {
                break;
            }
            budget -= self.prune_due(&key, budget);
        }
        let removed = max_deletes - budget as u32;
        Ok(Response::Housekept { removed })
    }

    /// Deletes up to `limit` runs of the deleted job of a `DELETED_JOB`
    /// key, and the key with the last of them.
    fn remove_deleted_runs(&mut self, key: Vec<u8>, limit: usize) -> usize {
        let prefix = keys::runs_of(keys::deleted_job_from(&key).unwrap_or_default());
        let rows = self.o.range(&prefix, &keys::prefix_end(&prefix), limit);
        let removed = rows.len();
        for (k, _) in rows {
            if let Some(id) = keys::run_id_from(&k) {
                self.delete_run_extras(&id);
            }
            self.o.delete(k);
        }
        if removed < limit {
            self.o.delete(key);
        }
        removed
    }

    /// Prunes the job of a due `RETENTION_DUE` key, at most `limit` records.
    fn prune_due(&mut self, key: &[u8], limit: usize) -> usize {
        let id = keys::retention_job_from(key).unwrap_or_default();
        let Ok(mut job) = self.job(id) else {
            // A delete removes the job's entry, so none should be found;
            // one that is would name no job: drop it.
            self.o.delete(key.to_vec());
            return 0;
        };
        let removed = self.prune(&mut job, limit);
        self.put_job(&job);
        removed
    }

    // ------------------------------------------------------------ execution

    fn assign(&mut self, assignments: &[(RunId, u32, String)]) -> Response {
        for (id, attempt, worker) in assignments {
            let Some(mut run) = self.run_rec(id) else {
                continue;
            };
            if run.attempt == *attempt && matches!(run.state, RunState::Pending | RunState::Running)
            {
                // The active-index entry is not rewritten: it keeps what
                // dispatch needs, and a new leader reads state and worker
                // from the run record (`StateMachine::active_runs`).
                run.state = RunState::Running;
                run.worker = worker.clone();
                self.put_run(&run);
                self.effects.push(Effect::Assigned {
                    run: run.id,
                    attempt: run.attempt,
                    group: run.group,
                    worker: run.worker,
                });
            }
        }
        Response::Empty
    }

    fn finish_all(&mut self, reports: &[FinishReport]) -> Result<Response, CommandError> {
        if reports.len() > limits::FINISH_BATCH_MAX {
            return Err(CommandError::Invalid(format!(
                "reports: at most {} per batch",
                limits::FINISH_BATCH_MAX
            )));
        }
        Ok(Response::Batch(
            reports.iter().map(|r| self.finish(r)).collect(),
        ))
    }

    fn live_attempt(&self, id: &RunId, attempt: u32) -> Result<Option<Run>, CommandError> {
        let run = self
            .run_rec(id)
            .ok_or_else(|| CommandError::RunNotFound(id.to_string()))?;
        if run.attempt == attempt && run.state.is_terminal() {
            return Ok(None); // a duplicate report of an attempt already ended: accept, change nothing
        }
        if run.attempt != attempt || !matches!(run.state, RunState::Pending | RunState::Running) {
            return Err(CommandError::StaleAttempt {
                run: id.to_string(),
                current: run.attempt,
                reported: attempt,
                state: run.state.as_str().to_string(),
            });
        }
        Ok(Some(run))
    }

    fn finish(&mut self, r: &FinishReport) -> Result<(), CommandError> {
        if r.result.len() > limits::RESULT_MAX_BYTES {
            return Err(CommandError::Invalid(format!(
                "result: at most {} bytes, got {}; pass a reference (an object-storage path) \
                 to a bigger output",
                limits::RESULT_MAX_BYTES,
                r.result.len()
            )));
        }
        let Some(mut run) = self.live_attempt(&r.run, r.attempt)? else {
            return Ok(());
        };
        if run.state == RunState::Pending && self.log_format() >= 4 {
            // A fast worker's finish can commit before the leader's batched
            // Assign (which then finds the run ended and does nothing): the
            // finish is what shows the attempt was handed out. From log
            // format 4: watch events are numbered by their place among an
            // entry's effects, and a stream resumed on a member of an
            // older release must find the same numbering.
            self.effects.push(Effect::Assigned {
                run: run.id.clone(),
                attempt: run.attempt,
                group: run.group.clone(),
                worker: r.worker.clone(),
            });
        }
        run.worker = r.worker.clone();
        run.received_at_ms = r.received_at_ms;
        run.result = r.result.clone();
        run.error = truncate(&r.error, limits::ERROR_MAX_BYTES);
        if r.success {
            run.error.clear();
            self.conclude(run, RunState::Succeeded);
        } else {
            let last = if r.timed_out {
                RunState::TimedOut
            } else {
                RunState::Failed
            };
            self.fail_attempt(run, r.retryable, last, r.jitter_ms);
        }
        Ok(())
    }

    fn expire_all(&mut self, expired: &[(RunId, u32, u64)]) -> Result<Response, CommandError> {
        if expired.len() > limits::EXPIRE_BATCH_MAX {
            return Err(CommandError::Invalid(format!(
                "expired: at most {} per command, got {}",
                limits::EXPIRE_BATCH_MAX,
                expired.len()
            )));
        }
        let results = expired
            .iter()
            .map(|(id, attempt, jitter)| {
                let Some(mut run) = self.live_attempt(id, *attempt)? else {
                    return Ok(());
                };
                // The worker may still be running it: tell it to stop.
                self.effects.push(Effect::Cancel {
                    run: id.clone(),
                    attempt: *attempt,
                });
                run.error = format!(
                    "attempt {attempt} timed out (no finish or heartbeat within the lease)"
                );
                self.fail_attempt(run, true, RunState::TimedOut, *jitter);
                Ok(())
            })
            .collect();
        Ok(Response::Batch(results))
    }

    /// Retries with exponential backoff while attempts remain, else ends the run as `last`.
    fn fail_attempt(&mut self, mut run: Run, retryable: bool, last: RunState, jitter_ms: u64) {
        let job = self.job(&run.id.job).ok();
        if job.as_ref().is_some_and(|j| self.being_replaced(j)) {
            // Its worker stopped it (or its lease ran out) after a replace asked it to.
            run.note = format!(
                "replaced: attempt {} stopped ({})",
                run.attempt,
                last.as_str()
            );
            return self.conclude(run, RunState::Cancelled);
        }
        let policy = job.map(|j| j.policy).unwrap_or_default();
        if retryable && run.attempt < policy.max_attempts {
            let exp = run.attempt.saturating_sub(1).min(20);
            let backoff = policy
                .backoff_ms
                .saturating_mul(1 << exp)
                .min(limits::BACKOFF_MAX_MS);
            // Jitter of up to half the backoff; the leader drew it, so every replica agrees.
            let jitter = jitter_ms % (backoff / 2 + 1);
            let delay = i64::try_from(backoff.saturating_add(jitter)).unwrap_or(i64::MAX);
            let at = self.now.saturating_add(delay);
            run.state = RunState::RetryWait;
            run.retry_at_ms = Some(at);
            run.note = format!("attempt {} {}; retry at {at}", run.attempt, last.as_str());
            self.effects.push(Effect::Ended {
                run: run.id.clone(),
                attempt: run.attempt,
            });
            self.schedule_entry(WheelKey::retry(&run.id, at));
            self.save_live_run(&run, &policy);
        } else {
            self.conclude(run, last);
        }
    }

    fn conclude(&mut self, mut run: Run, state: RunState) {
        run.state = state;
        run.finished_at_ms = self.now;
        self.save_run(&run);
        self.finished(&run);
        self.end_run(&run);
    }

    fn finished(&mut self, run: &Run) {
        self.ended.push((run.id.clone(), run.state));
        self.effects.push(Effect::Finished(Finished {
            run: run.id.clone(),
            attempt: run.attempt,
            group: run.group.clone(),
            worker: run.worker.clone(),
            outcome: run.state,
        }));
    }

    fn retry_run(&mut self, id: &RunId) -> Result<Run, CommandError> {
        let mut run = self
            .run_rec(id)
            .ok_or_else(|| CommandError::RunNotFound(id.to_string()))?;
        if !matches!(
            run.state,
            RunState::Failed | RunState::TimedOut | RunState::Cancelled | RunState::Succeeded
        ) {
            return Err(CommandError::FailedPrecondition(format!(
                "run {id} is {}; only a finished run can be retried",
                run.state.as_str()
            )));
        }
        let mut job = self.job(&id.job)?;
        if job.active_runs >= limits::ACTIVE_RUNS_MAX {
            return Err(CommandError::FailedPrecondition(format!(
                "job {:?} has {} active runs, the most allowed",
                job.id, job.active_runs
            )));
        }
        if run.attempt == u32::MAX {
            return Err(CommandError::FailedPrecondition(format!(
                "run {id} is at its last possible attempt number"
            )));
        }
        run.attempt += 1;
        run.state = RunState::Pending;
        run.note = format!("manual retry as attempt {}", run.attempt);
        run.finished_at_ms = 0;
        // The record describes the current attempt: the old outcome no longer applies.
        run.worker.clear();
        run.result.clear();
        run.error.clear();
        run.received_at_ms = 0;
        job.active_runs = job.active_runs.saturating_add(1);
        self.ready(&run, &job.policy);
        self.save_live_run(&run, &job.policy);
        self.put_job(&job);
        Ok(run)
    }
}

/// Takes the spec's jitter for `job`, keeping the job's seed while it has
/// a jitter (the seed a later command carries is used only when the job
/// gets its first), so its offsets stay what they were. Whether it changed.
fn set_jitter(job: &mut Job, jitter: Option<Jitter>) -> bool {
    let kept = jitter.map(|j| Jitter {
        seed: job.jitter.map_or(j.seed, |old| old.seed),
        ..j
    });
    let changed = kept != job.jitter;
    job.jitter = kept;
    changed
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// When a run finished at `finished_at_ms` passes the policy's `keep_for`
/// (None: kept regardless of age).
fn expiry(policy: &Policy, finished_at_ms: i64) -> Option<i64> {
    let keep_for = i64::try_from(policy.keep_for_ms).unwrap_or(i64::MAX);
    (keep_for > 0).then(|| finished_at_ms.saturating_add(keep_for))
}

fn next_after(s: &Schedule, after: i64) -> Result<Option<i64>, CommandError> {
    s.next_after(after)
        .map_err(|e| CommandError::Invalid(e.to_string()))
}

struct Walk {
    /// Latest occurrence at or before now.
    last: i64,
    /// Occurrences from the first missed one up to `last`.
    count: u64,
    /// More than `MISFIRE_WALK_MAX` were missed: `count` stops there.
    capped: bool,
    /// First occurrence after now.
    next: Option<i64>,
}

impl Walk {
    fn count_text(&self) -> String {
        if self.capped {
            format!("more than {}", limits::MISFIRE_WALK_MAX)
        } else {
            self.count.to_string()
        }
    }
}

/// Where a `fire-all` catch-up goes on when more than its cap are due.
struct CatchUp {
    /// Occurrences recorded skipped, from the first due one to `last_skipped`.
    skipped: u64,
    last_skipped: i64,
    /// The oldest of the newest `cap` due occurrences (with `more`: where
    /// the next command goes on).
    resume_at: i64,
    /// More than `cap + MISFIRE_WALK_MAX` were due: only the oldest
    /// `MISFIRE_WALK_MAX` are skipped by this command.
    more: bool,
}

/// `None` when at most `cap` of `job`'s occurrences from `first` are due
/// at `now` (within its end). Closed form for `every`; a cron schedule is
/// walked, at most `cap + MISFIRE_WALK_MAX` occurrences, keeping the
/// newest `cap + 1`.
fn catch_up_limit(
    job: &Job,
    first: i64,
    now: i64,
    cap: u32,
) -> Result<Option<CatchUp>, CommandError> {
    let end = job.bounds.end_at_ms.unwrap_or(i64::MAX);
    let cap = u64::from(cap.max(1));
    if let Schedule::Every { every_ms, .. } = job.schedule {
        let walk = walk_missed(job, first, end, now)?;
        if walk.count <= cap {
            return Ok(None);
        }
        // In i128: nothing here can wrap, whatever the command's times.
        let resume = i128::from(walk.last) - i128::from(every_ms.max(1)) * i128::from(cap - 1);
        let last_skipped = resume - i128::from(every_ms.max(1));
        return Ok(Some(CatchUp {
            skipped: walk.count - cap,
            last_skipped: i64::try_from(last_skipped).unwrap_or(first),
            resume_at: i64::try_from(resume).unwrap_or(first),
            more: false,
        }));
    }
    let due = |n: i64| n <= end && job.fire_time(n) <= now;
    let visit_max = cap + u64::from(limits::MISFIRE_WALK_MAX);
    let mut newest = std::collections::VecDeque::from([first]);
    let (mut visited, mut cursor) = (1u64, first);
    let more = loop {
        match next_after(&job.schedule, cursor)? {
            Some(n) if due(n) && visited == visit_max => break true,
            Some(n) if due(n) => {
                newest.push_back(n);
                if newest.len() as u64 > cap + 1 {
                    newest.pop_front();
                }
                visited += 1;
                cursor = n;
            }
            _ => break false,
        }
    };
    if visited <= cap {
        return Ok(None);
    }
    // `newest` holds the last `cap + 1` visited: the last skipped, then the kept.
    Ok(Some(CatchUp {
        skipped: visited - cap,
        last_skipped: newest.front().copied().unwrap_or(first),
        resume_at: newest.get(1).copied().unwrap_or(first),
        more,
    }))
}

/// Walks `job`'s occurrences from `first` (due) through the last one due:
/// nominally at or before `nominal_upto` and firing (with its jitter
/// offset) at or before `fire_upto`. Visits at most `MISFIRE_WALK_MAX`;
/// past that the latest one is found by bisection. Fire times keep the
/// schedule's order (a jitter is shorter than the gap between
/// occurrences), so "due" holds for a prefix of the occurrences.
fn walk_missed(
    job: &Job,
    first: i64,
    nominal_upto: i64,
    fire_upto: i64,
) -> Result<Walk, CommandError> {
    let s = &job.schedule;
    let due = |n: i64| n <= nominal_upto && job.fire_time(n) <= fire_upto;
    // No occurrence after this is due (an offset is never negative).
    let upto = nominal_upto.min(fire_upto);
    if let Schedule::Every { every_ms, .. } = s {
        // In i128: `upto` may be i64::MAX, and the next occurrence past it
        // does not exist rather than wrap.
        let (every, first_w) = (i128::from((*every_ms).max(1)), i128::from(first));
        let mut count = (i128::from(upto) - first_w).max(0) / every + 1;
        let mut last = first_w + (count - 1) * every;
        if count > 1 && !i64::try_from(last).is_ok_and(due) {
            // Nominally due, but its offset puts it past `fire_upto`.
            count -= 1;
            last -= every;
        }
        return Ok(Walk {
            last: i64::try_from(last).unwrap_or(first),
            count: u64::try_from(count).unwrap_or(u64::MAX),
            capped: false,
            next: i64::try_from(last + every).ok(),
        });
    }
    let (mut last, mut count) = (first, 1u64);
    loop {
        let next = next_after(s, last)?;
        match next {
            Some(n) if due(n) && count < limits::MISFIRE_WALK_MAX as u64 => {
                last = n;
                count += 1;
            }
            Some(n) if due(n) => {
                let last = latest_due(s, last, upto, &due)?;
                return Ok(Walk {
                    last,
                    count,
                    capped: true,
                    next: next_after(s, last)?,
                });
            }
            _ => {
                return Ok(Walk {
                    last,
                    count,
                    capped: false,
                    next,
                })
            }
        }
    }
}

/// The latest due occurrence, given a due occurrence `lo` that is not the
/// latest and a time `hi` no due occurrence is after. Bisects on "the next
/// occurrence after `t` is due", true at `lo` and false at `hi`: at most
/// 64 searches, however many occurrences lie between.
fn latest_due(
    s: &Schedule,
    mut lo: i64,
    mut hi: i64,
    due: &dyn Fn(i64) -> bool,
) -> Result<i64, CommandError> {
    // In i128: `lo` may be before the year 1 and `hi` i64::MAX.
    while i128::from(hi) - i128::from(lo) > 1 {
        let mid = i64::try_from((i128::from(lo) + i128::from(hi)) / 2).unwrap_or(lo);
        if next_after(s, mid)?.is_some_and(due) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(next_after(s, lo)?.filter(|n| due(*n)).unwrap_or(lo))
}
