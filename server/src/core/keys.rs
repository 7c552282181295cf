//! Key spaces of the replicated state, all in one ordered key-value space so
//! one atomic batch covers any change. Each space has a one-byte prefix;
//! times are stored big-endian with the sign bit flipped so byte order is
//! time order.

use super::types::{EntryKind, RunId, WheelKey};

pub const META: u8 = b'm';
pub const JOB: u8 = b'j';
pub const WHEEL: u8 = b'w';
pub const RUN: u8 = b'r';
pub const ACTIVE: u8 = b'a';
/// Tokens by name, and the index from a secret's hash to the name.
pub const TOKEN: u8 = b't';
pub const TOKEN_HASH: u8 = b'k';
/// Job revision history: `h` job `/` generation (created_at) revision.
pub const JOB_HISTORY: u8 = b'h';
/// Responses of recent client writes by request id, and their expiry order.
pub const DEDUP: u8 = b'd';
pub const DEDUP_ORDER: u8 = b'e';
/// Deleted jobs whose run records housekeeping has not removed yet, by id.
pub const DELETED_JOB: u8 = b'g';
/// When housekeeping should look at a job's oldest runs: `x` time job.
pub const RETENTION_DUE: u8 = b'x';
/// Workflow edges: `u` upstream `/` downstream, for each declared upstream
/// (log format 3).
pub const DOWNSTREAM: u8 = b'u';
/// The upstream runs a workflow run consumed, by the run's shard-0 id
/// (log format 3).
pub const RUN_INPUTS: u8 = b'i';
/// The backfill range a run was created by, by the run's shard-0 id (log
/// format 4). Kept apart from the run record, whose encoding is format 8's.
pub const RUN_BACKFILL: u8 = b'b';
/// Present while a restore from a backup is being applied.
pub const META_RESTORE: &[u8] = b"mrestore_in_progress";
/// Key spaces a backup restores: the scheduling state and its housekeeping
/// indexes. Meta, tokens and the dedup table belong to the new cluster.
pub const RESTORED_SPACES: [u8; 10] = [
    JOB,
    RUN,
    WHEEL,
    ACTIVE,
    JOB_HISTORY,
    DELETED_JOB,
    RETENTION_DUE,
    DOWNSTREAM,
    RUN_INPUTS,
    RUN_BACKFILL,
];
/// Number of entries in the dedup table.
pub const META_DEDUP_COUNT: &[u8] = b"mdedup_count";

/// Meta keys.
pub const META_LAST_APPLIED: &[u8] = b"mlast_applied";
pub const META_MEMBERSHIP: &[u8] = b"mmembership";
/// Largest `now` any applied command carried: state-machine time never goes back.
pub const META_TIME: &[u8] = b"mtime";
/// Set while firing is paused cluster-wide (`PauseFiring`): its `PauseNote`.
pub const META_FIRING_PAUSED: &[u8] = b"mfiring_paused";
/// The cluster's active log format (`Command::ActivateLogFormat`); absent
/// means `command::LOG_FORMAT_INITIAL`. Written only at log format 2 and up,
/// so only ever seen by binaries that read it.
pub const META_LOG_FORMAT: &[u8] = b"mlog_format";
/// Present while a snapshot is being loaded into the state (see `store::sm`).
pub const META_RESTORING: &[u8] = b"mrestoring";
/// The IANA tzdata version of the binary that last opened the data
/// directory. Node-local: kept in the `local` tree, outside the replicated
/// state, its snapshots and its digest (see `store::sm`).
pub const META_TZDATA: &[u8] = b"mtzdata";

/// Format version of the state: its keys and values, the snapshot files
/// that carry them, and the data directory that holds them (recorded in
/// the directory's `format` file, see `store::format`). 2: run ids and
/// retry entries carry a shard; policies carry route and fan-out. 3:
/// retention counters. 4: streamed snapshot files (`store::snapfile`). 5:
/// finish reports in the log say whether the worker timed the attempt out.
/// 6: snapshot files end with a SHA-256 of all their bytes, and the install
/// marker is finished from `snapshot.recv` while that file still exists.
/// 7: API tokens (`t`, `k` key spaces; PutToken and RevokeToken commands),
/// and the request-id dedup table (`d`, `e`; the Dedup command).
/// 8: per-job history limits (`keep_runs`, `keep_for_ms` in the policy,
/// `retention_due_ms` in the job), the housekeeping indexes (`g`, `x`),
/// the version in a `format` file instead of the `mversion` key, and log
/// entries that carry their own format (`command::LOG_FORMAT`); also the
/// Quartz cron schedules, appended to the schedule enums.
/// Since log format 3 (still state format 8), a job record may end with an
/// extension (bounds, labels, fired count, finished time, pause note:
/// `Job::to_record`) and `mfiring_paused` may be set. Since log format 4,
/// a job record may have a second tail (jitter, catch-up cap, backfill,
/// more schedules) and a run record a tail (its jitter offset); backfills
/// add wheel entries of kind 3 and the `b` key space. Only commands of
/// that format write them, and the cluster activates a format only once
/// every member reads it, so a binary that would not read them never
/// meets them.
pub const STATE_VERSION: u32 = 8;
/// The oldest state format this binary reads. Older data directories and
/// snapshot files are refused, naming both versions: there is no in-place
/// migration from them (README, "Upgrades").
pub const STATE_VERSION_OLDEST: u32 = 8;

pub fn time_bytes(t: i64) -> [u8; 8] {
    ((t as u64) ^ (1 << 63)).to_be_bytes()
}

pub fn time_from(b: &[u8]) -> Option<i64> {
    let arr: [u8; 8] = b.get(..8)?.try_into().ok()?;
    Some((u64::from_be_bytes(arr) ^ (1 << 63)) as i64)
}

pub fn job(id: &str) -> Vec<u8> {
    named(JOB, id)
}

/// `space, name`.
fn named(space: u8, name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + name.len());
    k.push(space);
    k.extend_from_slice(name.as_bytes());
    k
}

/// `space, at (8, time order), name`: sorts by time, then name.
fn timed(space: u8, at_ms: i64, name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + name.len());
    k.push(space);
    k.extend_from_slice(&time_bytes(at_ms));
    k.extend_from_slice(name.as_bytes());
    k
}

pub fn token(name: &str) -> Vec<u8> {
    named(TOKEN, name)
}

pub fn token_hash(hash: &str) -> Vec<u8> {
    named(TOKEN_HASH, hash)
}

/// Prefix of one job id's revision records (job ids have no `/`).
pub fn job_history_prefix(job: &str) -> Vec<u8> {
    let mut k = vec![JOB_HISTORY];
    k.extend_from_slice(job.as_bytes());
    k.push(b'/');
    k
}

pub fn job_history(job: &str, created_at_ms: i64, revision: u64) -> Vec<u8> {
    let mut k = job_history_prefix(job);
    k.extend_from_slice(&time_bytes(created_at_ms));
    k.extend_from_slice(&revision.to_be_bytes());
    k
}

pub fn dedup(request_id: &str) -> Vec<u8> {
    named(DEDUP, request_id)
}

/// Expiry order: time the entry was written, then the request id.
pub fn dedup_order(at_ms: i64, request_id: &str) -> Vec<u8> {
    timed(DEDUP_ORDER, at_ms, request_id)
}

/// Prefix of the edges from `upstream` to its downstream jobs (job ids have no `/`).
pub fn downstream_of(upstream: &str) -> Vec<u8> {
    let mut k = vec![DOWNSTREAM];
    k.extend_from_slice(upstream.as_bytes());
    k.push(b'/');
    k
}

pub fn downstream(upstream: &str, job: &str) -> Vec<u8> {
    let mut k = downstream_of(upstream);
    k.extend_from_slice(job.as_bytes());
    k
}

/// The downstream job of a `downstream` key.
pub fn downstream_from(key: &[u8]) -> Option<&str> {
    let rest = key.strip_prefix(&[DOWNSTREAM])?;
    let slash = rest.iter().position(|b| *b == b'/')?;
    std::str::from_utf8(&rest[slash + 1..]).ok()
}

/// The upstream runs consumed by the occurrence of `job` at `scheduled_at_ms`.
pub fn run_inputs(run: &RunId) -> Vec<u8> {
    run_like(RUN_INPUTS, &RunId::new(&run.job, run.scheduled_at_ms))
}

/// The backfill that created the occurrence of `job` at `scheduled_at_ms`.
pub fn run_backfill(run: &RunId) -> Vec<u8> {
    run_like(RUN_BACKFILL, &RunId::new(&run.job, run.scheduled_at_ms))
}

pub fn deleted_job(id: &str) -> Vec<u8> {
    named(DELETED_JOB, id)
}

pub fn retention_due(at_ms: i64, job: &str) -> Vec<u8> {
    timed(RETENTION_DUE, at_ms, job)
}

/// The job of a `deleted_job` key.
pub fn deleted_job_from(key: &[u8]) -> Option<&str> {
    std::str::from_utf8(key.strip_prefix(&[DELETED_JOB])?).ok()
}

/// The job of a `retention_due` key.
pub fn retention_job_from(key: &[u8]) -> Option<&str> {
    std::str::from_utf8(key.strip_prefix(&[RETENTION_DUE])?.get(8..)?).ok()
}

/// Exclusive upper bound of `retention_due` keys due at or before `t`.
pub fn retention_due_upto(t: i64) -> Vec<u8> {
    time_upto(RETENTION_DUE, t)
}

/// Exclusive upper bound of the keys of a time-first space at or before `t`.
fn time_upto(space: u8, t: i64) -> Vec<u8> {
    let mut v = vec![space];
    v.extend_from_slice(&time_bytes(t.saturating_add(1)));
    v
}

pub fn job_id_from(key: &[u8]) -> Option<&str> {
    std::str::from_utf8(key.strip_prefix(&[JOB])?).ok()
}

pub fn wheel(k: &WheelKey) -> Vec<u8> {
    let mut v = Vec::with_capacity(22 + k.job.len());
    v.push(WHEEL);
    v.extend_from_slice(&time_bytes(k.fire_at_ms));
    v.push(k.kind as u8);
    v.extend_from_slice(&time_bytes(k.scheduled_at_ms));
    v.extend_from_slice(&k.shard.to_be_bytes());
    v.extend_from_slice(k.job.as_bytes());
    v
}

/// Whether `key` is in the wheel index's space.
pub fn is_wheel(key: &[u8]) -> bool {
    key.first() == Some(&WHEEL)
}

pub fn wheel_from(key: &[u8]) -> Option<WheelKey> {
    let rest = key.strip_prefix(&[WHEEL])?;
    let fire_at_ms = time_from(rest)?;
    let kind = match *rest.get(8)? {
        1 => EntryKind::Occurrence,
        2 => EntryKind::Retry,
        3 => EntryKind::Backfill,
        _ => return None,
    };
    let scheduled_at_ms = time_from(rest.get(9..)?)?;
    let shard = u32::from_be_bytes(rest.get(17..21)?.try_into().ok()?);
    let job = std::str::from_utf8(rest.get(21..)?).ok()?.to_string();
    Some(WheelKey {
        fire_at_ms,
        kind,
        job,
        scheduled_at_ms,
        shard,
    })
}

/// Exclusive upper bound of wheel keys due at or before `t`.
pub fn wheel_upto(t: i64) -> Vec<u8> {
    time_upto(WHEEL, t)
}

/// `prefix, len(job), job, scheduled_at (8, time order), shard (4, big-endian)`:
/// one job's runs sort by (scheduled_at, shard).
fn run_like(prefix: u8, id: &RunId) -> Vec<u8> {
    let mut v = run_prefix_with(prefix, &id.job);
    v.extend_from_slice(&time_bytes(id.scheduled_at_ms));
    v.extend_from_slice(&id.shard.to_be_bytes());
    v
}

fn run_prefix_with(prefix: u8, job: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(14 + job.len());
    v.push(prefix);
    // Ids are at most 128 bytes (validated), so the length fits one byte and
    // one job's runs form a contiguous range. A longer id (an unknown run
    // named in a command) gets 255, a length no stored key has: it finds
    // nothing and never aliases a stored key.
    v.push(u8::try_from(job.len()).unwrap_or(u8::MAX));
    v.extend_from_slice(job.as_bytes());
    v
}

pub fn run(id: &RunId) -> Vec<u8> {
    run_like(RUN, id)
}

pub fn active(id: &RunId) -> Vec<u8> {
    run_like(ACTIVE, id)
}

/// Prefix of all runs of `job`, in (scheduled time, shard) order.
pub fn runs_of(job: &str) -> Vec<u8> {
    run_prefix_with(RUN, job)
}

/// A run record's key split into its job's prefix ([`runs_of`]) and its
/// (scheduled time, shard) suffix, whose byte order is the keys' order.
pub fn split_run_key(key: &[u8]) -> Option<(&[u8], &[u8])> {
    split_run_side_key(key).filter(|_| key[0] == RUN)
}

/// [`split_run_key`] for a run record's key or either of the keys beside
/// it ([`run_inputs`], [`run_backfill`]): the prefix includes the key
/// space, so one job's keys of each space form their own range.
pub fn split_run_side_key(key: &[u8]) -> Option<(&[u8], &[u8])> {
    let at = 2 + *key.get(1)? as usize;
    let space = matches!(key[0], RUN | RUN_INPUTS | RUN_BACKFILL);
    (space && key.len() == at + 12).then(|| key.split_at(at))
}

/// Whether `prefix` is one job's [`runs_of`] prefix, whole.
pub fn is_runs_of(prefix: &[u8]) -> bool {
    matches!(prefix, [RUN, len, ..] if prefix.len() == 2 + *len as usize)
}

/// Prefix of the active runs of `job`.
pub fn active_of(job: &str) -> Vec<u8> {
    run_prefix_with(ACTIVE, job)
}

/// Exclusive upper bound of the keys under `prefix`, which is never all 0xff here
/// (it starts with a one-byte key space prefix below 0xff).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            break;
        }
    }
    end
}

/// Decodes a run or active-run key.
pub fn run_id_from(key: &[u8]) -> Option<RunId> {
    let len = *key.get(1)? as usize;
    let job = std::str::from_utf8(key.get(2..2 + len)?).ok()?;
    let t = time_from(key.get(2 + len..)?)?;
    let shard = u32::from_be_bytes(key.get(10 + len..14 + len)?.try_into().ok()?);
    Some(RunId::shard(job, t, shard))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_key_splits_into_its_jobs_prefix_and_an_ordered_suffix() {
        let (early, late) = (run(&RunId::new("a", 10)), run(&RunId::shard("a", 10, 2)));
        let (prefix, suffix) = split_run_key(&early).expect("a run key");
        assert_eq!(prefix, runs_of("a").as_slice());
        assert!(suffix < split_run_key(&late).expect("a run key").1);
        assert_eq!(split_run_key(&active(&RunId::new("a", 10))), None);
        assert_eq!(split_run_key(&runs_of("a")), None);
        assert_eq!(split_run_key(&job("a")), None);
    }

    #[test]
    fn time_order_is_byte_order() {
        let ts = [i64::MIN, -5, -1, 0, 1, 1_700_000_000_000, i64::MAX];
        for w in ts.windows(2) {
            assert!(time_bytes(w[0]) < time_bytes(w[1]), "{} vs {}", w[0], w[1]);
            assert_eq!(time_from(&time_bytes(w[0])), Some(w[0]));
        }
    }

    #[test]
    fn wheel_keys_round_trip_and_sort_by_time() {
        let a = WheelKey::occurrence("zz", 1000);
        let b = WheelKey::retry(&RunId::new("aa", 5), 2000);
        assert_eq!(wheel_from(&wheel(&a)), Some(a.clone()));
        assert_eq!(wheel_from(&wheel(&b)), Some(b.clone()));
        assert!(wheel(&a) < wheel(&b));
        assert!(wheel(&a) < wheel_upto(1000));
        assert!(wheel(&b) >= wheel_upto(1999));
    }

    #[test]
    fn runs_of_one_job_are_contiguous_and_time_ordered() {
        let r1 = run(&RunId::new("a", 10));
        let r2 = run(&RunId::new("a", 20));
        let other = run(&RunId::new("ab", 15));
        assert!(is_runs_of(&runs_of("ab")));
        let id = RunId::new("ab", 15);
        let inputs = run_inputs(&id);
        let (job, suffix) = split_run_side_key(&inputs).unwrap();
        assert_eq!(job, &run_prefix_with(RUN_INPUTS, "ab")[..]);
        assert_eq!(Some(suffix), split_run_key(&other).map(|(_, s)| s));
        assert!(split_run_side_key(&run_backfill(&id)).is_some());
        assert_eq!(split_run_side_key(&active(&id)), None);
        assert!(!is_runs_of(&r1) && !is_runs_of(&runs_of("ab")[..3]));
        assert!(!is_runs_of(&active_of("ab")));
        assert!(r1 < r2);
        assert!(r1.starts_with(&runs_of("a")) && r2.starts_with(&runs_of("a")));
        assert!(!other.starts_with(&runs_of("a")));
        assert_eq!(run_id_from(&r2), Some(RunId::new("a", 20)));
    }

    #[test]
    fn shards_sort_after_their_occurrence_and_before_the_next_one() {
        let keys: Vec<Vec<u8>> = [
            RunId::new("a", 10),
            RunId::shard("a", 10, 1),
            RunId::shard("a", 10, 300),
            RunId::new("a", 11),
        ]
        .iter()
        .map(run)
        .collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(run_id_from(&keys[2]), Some(RunId::shard("a", 10, 300)));
        let r = WheelKey::retry(&RunId::shard("a", 10, 7), 99);
        assert_eq!(wheel_from(&wheel(&r)), Some(r.clone()));
        assert_eq!(r.run_id(), RunId::shard("a", 10, 7));
        assert!(active(&RunId::shard("a", 10, 7)).starts_with(&active_of("a")));
        assert!(active(&RunId::new("ab", 1)) >= prefix_end(&active_of("a")));
    }

    #[test]
    fn run_ids_have_one_text_form() {
        let id = RunId::shard("job-1", 1_700_000_000_000, 3);
        assert_eq!(id.to_string(), "job-1@1700000000000/s3");
        assert_eq!(RunId::parse("job-1@1700000000000/s3"), Some(id));
        assert_eq!(
            RunId::parse("job-1@1700000000000"),
            Some(RunId::new("job-1", 1_700_000_000_000))
        );
        for bad in [
            "job-1@5/s0",
            "job-1@5/s",
            "job-1@5/s+1",
            "job-1@05",
            "@5",
            "job-1@5#2",
            "job-1",
        ] {
            assert_eq!(RunId::parse(bad), None, "{bad}");
        }
    }
}
