//! Fault injection for the crash and refusal tests, off unless the
//! environment says so: `KAIROS_FAILPOINT` is a comma-separated list of
//! names, some with a value (`name=N`), read once per process.
//!
//! - `crash-on-joint`: SIGKILL right after applying a joint configuration
//!   (`store::sm`), so a membership change is cut between its two steps.
//! - `leave-joint`: this node, leading, does not finish a membership change
//!   interrupted in its joint configuration (`membership::finish_interrupted`).
//! - `stall-log-after=N`: appending a log entry past index N never
//!   completes (`store::log`): the node answers status but stops taking
//!   entries, as a follower too slow to catch up.
//! - `crash-mid-flush`: SIGKILL halfway through writing the pairs of a
//!   flush larger than one sled batch (`store::sm`), its redo record written.
//! - `ignore-elect`: a handover's `Elect` request is answered but no
//!   election is started (`grpc::peer`).
//! - `slow-snapshot=MS`: each snapshot build takes MS milliseconds longer
//!   (`store::sm`), as a large state's would (`raft::snapshots` spaces
//!   builds by their duration).
//! - `slow-digest=MS`: each state digest takes MS milliseconds longer
//!   (`store::sm`), as hashing a large state would.
//! - `skip-log-sync`: no `fdatasync` or `fsync` after sled's flush, and
//!   sled's periodic flusher on (`store::durable`): the behaviour before
//!   durable syncs, for the harness to show a power cut losing writes.

use std::sync::OnceLock;

fn list() -> &'static [(String, Option<u64>)] {
    static LIST: OnceLock<Vec<(String, Option<u64>)>> = OnceLock::new();
    LIST.get_or_init(|| parse(&std::env::var("KAIROS_FAILPOINT").unwrap_or_default()))
}

fn parse(spec: &str) -> Vec<(String, Option<u64>)> {
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| match s.split_once('=') {
            Some((name, v)) => (name.to_string(), v.parse().ok()),
            None => (s.to_string(), None),
        })
        .collect()
}

/// Whether failpoint `name` is set.
pub fn on(name: &str) -> bool {
    list().iter().any(|(n, _)| n == name)
}

/// The value of failpoint `name=N`, if set with a number.
pub fn value(name: &str) -> Option<u64> {
    list().iter().find(|(n, _)| n == name).and_then(|(_, v)| *v)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_list_of_names_some_with_values() {
        let got = parse("crash-on-joint, stall-log-after=12,,x=y");
        let want = vec![
            ("crash-on-joint".to_string(), None),
            ("stall-log-after".to_string(), Some(12)),
            ("x".to_string(), None),
        ];
        assert_eq!(got, want);
        assert!(parse("").is_empty());
    }
}
