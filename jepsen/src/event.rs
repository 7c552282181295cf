//! The history's wire format: one JSON object per line of `history.jsonl`,
//! tagged by `type` (`meta`, `invoke`, `complete`, `receipt`, `nemesis`,
//! `leader`, `final`). These types are the only contract between the live harness that
//! writes a history and the checkers that read it back, so a recorded run can
//! be re-checked (or doctored in a test) without a cluster.

use serde::{Deserialize, Serialize};

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Event {
    Meta(Meta),
    Invoke(Invoke),
    Complete(Complete),
    Receipt(Receipt),
    Nemesis(NemesisEvent),
    Leader(LeaderClaim),
    Final(FinalNode),
}

/// Run configuration and the bounds the checkers judge by; written first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Meta {
    pub run_id: String,
    pub seed: u64,
    /// `netns` (nodes in network namespaces) or `loopback` (no root).
    pub mode: String,
    pub nodes: Vec<NodeInfo>,
    pub start_ms: i64,
    pub time_limit_s: u64,
    pub nemeses: Vec<String>,
    pub workloads: Vec<String>,
    pub bounds: Bounds,
    /// Fault families asked for but not injected, each with why: only a
    /// `--loopback` run drops any (a run that cannot inject what it was
    /// asked for fails instead).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dropped_nemeses: Vec<DroppedNemesis>,
    /// `KAIROS_FAILPOINT` of every node (`--failpoint`): a run meant to
    /// break a guarantee on purpose says so in its history.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub failpoint: String,
    /// Every power fault cut every node (`--power-all`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub power_all: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DroppedNemesis {
    pub family: String,
    pub reason: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: u64,
    pub addr: String,
}

/// Tolerances, stated in the history so `check` judges exactly as `run` did.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Bounds {
    /// A receipt may precede `scheduled_at_ms` by this much (clock read jitter).
    pub early_epsilon_ms: i64,
    /// Lateness allowed for an occurrence due while no fault is active.
    pub healthy_lateness_ms: i64,
    /// After a fault heals, occurrences due during it may fire this much later.
    pub recovery_ms: i64,
    /// A delete acknowledged at least this long before the fire time cancels it.
    pub cancel_margin_ms: i64,
    /// A fire record older than this (before the window end) must have a receipt.
    pub execution_grace_ms: i64,
    /// Upstream runs that finished at least this long before the final read
    /// must have triggered their downstream job by then.
    pub workflow_settle_ms: i64,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            early_epsilon_ms: 100,
            healthy_lateness_ms: 2_000,
            recovery_ms: 20_000,
            cancel_margin_ms: 500,
            execution_grace_ms: 20_000,
            workflow_settle_ms: 10_000,
        }
    }
}

/// Which workload issued an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    Register,
    Interval,
    Timers,
    /// The liveness write after the final heal.
    Probe,
    /// Pausing interval jobs once the checking window closed.
    Quiesce,
    /// Creating the workflow diamonds.
    Workflow,
}

/// The operation's function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpF {
    Create,
    Update,
    Get,
    Delete,
    Pause,
    Resume,
}

/// A client operation as sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Invoke {
    pub op: u64,
    pub process: u64,
    /// The node the request was sent to.
    pub node: u64,
    pub time_ms: i64,
    pub workload: Workload,
    pub f: OpF,
    pub key: String,
    /// Register value written (the job payload, a unique integer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_revision: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_ms: Option<u64>,
}

impl Invoke {
    /// An invocation with no value, revision or schedule fields set.
    pub fn new(
        op: u64,
        process: u64,
        node: u64,
        time_ms: i64,
        workload: Workload,
        f: OpF,
        key: &str,
    ) -> Invoke {
        Invoke {
            op,
            process,
            node,
            time_ms,
            workload,
            f,
            key: key.to_string(),
            value: None,
            expected_revision: None,
            every_ms: None,
            at_ms: None,
            after_ms: None,
        }
    }
}

/// `fail` means the operation certainly took no effect; `unknown` that it may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Ok,
    Fail,
    Unknown,
}

/// The answer to an invoked operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Complete {
    pub op: u64,
    pub process: u64,
    pub time_ms: i64,
    pub outcome: Outcome,
    /// gRPC code name of a failed or unknown call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A read found nothing (get answered NOT_FOUND).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// The value read, or written back by the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_fire_at_ms: Option<i64>,
}

impl Complete {
    /// A completion with only the outcome set.
    pub fn bare(op: u64, process: u64, time_ms: i64, outcome: Outcome) -> Complete {
        Complete {
            op,
            process,
            time_ms,
            outcome,
            code: None,
            error: None,
            found: None,
            revision: None,
            value: None,
            deleted: None,
            created_at_ms: None,
            next_fire_at_ms: None,
        }
    }
}

/// A harness worker received an assignment; stamped with the harness clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub worker: String,
    pub node: u64,
    pub run_id: String,
    pub job: String,
    pub scheduled_at_ms: i64,
    pub fired_at_ms: i64,
    pub received_at_ms: i64,
    pub attempt: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Start,
    Stop,
    /// Something the nemesis observed or skipped; not a fault period.
    Info,
}

/// A fault starting or healing. A `start` and its `stop` share `id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NemesisEvent {
    pub id: u64,
    pub time_ms: i64,
    pub phase: Phase,
    /// Family: partition, kill, pause, clock, loss, bandwidth, snapshot.
    pub fault: String,
    /// The concrete fault, e.g. `isolate-leader`, `majorities-ring`.
    pub kind: String,
    #[serde(default)]
    pub nodes: Vec<u64>,
    #[serde(default)]
    pub detail: String,
}

/// A node's claim to lead a term: its own `Cluster.Status` entry said
/// `role: leader` at `term` (`source: status`, seen through `reporter`'s
/// answer, or `final` in the final read), or its log said it started
/// leading `term` (`source: log`; `node_time` is the log line's timestamp,
/// by the node's own, possibly skewed, clock). Recorded the first time each
/// (source, reporter, node, term) is seen.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LeaderClaim {
    /// Harness clock when it was seen (for `log`: when the log was read).
    pub time_ms: i64,
    pub term: u64,
    /// The node that claims to lead `term`.
    pub node: u64,
    pub source: String,
    /// The node whose answer (or log) carried the claim.
    pub reporter: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub node_time: String,
}

/// One node's state read locally at the end of the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FinalNode {
    pub time_ms: i64,
    pub node: u64,
    pub reachable: bool,
    pub role: String,
    /// The leader this node believes in; 0 = none.
    pub leader: u64,
    pub term: u64,
    /// Applied index and digest from the status read before the jobs and runs.
    pub applied_index: u64,
    pub state_digest: String,
    /// The applied index `state_digest` reflects (a node answers with an
    /// older digest while a fresh one takes longer than its bound); 0 in a
    /// history written before it, whose digests were at `applied_index`.
    pub digest_index: u64,
    /// Applied index from a status read after them (0 = not read): the lists
    /// reflect some state between the two.
    pub applied_index_after: u64,
    /// The membership this node knows: voters and learners (ids, sorted),
    /// and whether it is a joint configuration (a change between its steps).
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
    pub membership_changing: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub jobs: Vec<FinalJob>,
    pub runs: Vec<FinalRun>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FinalJob {
    pub id: String,
    pub revision: u64,
    pub paused: bool,
    pub created_at_ms: i64,
    pub next_fire_at_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<u64>,
    /// Workflow: the jobs this one follows.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub upstream: Vec<String>,
}

/// A fire record: the run created when an occurrence fired.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FinalRun {
    pub run_id: String,
    pub job: String,
    pub scheduled_at_ms: i64,
    pub fired_at_ms: i64,
    pub state: String,
    pub attempt: u32,
    /// Cluster time the run ended; 0 while it has not.
    pub finished_at_ms: i64,
    /// A workflow run: the upstream run ids it consumed (read with GetRun).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub upstream_runs: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipt_line_has_type_and_fields() {
        let e = Event::Receipt(Receipt {
            worker: "w1".into(),
            node: 2,
            run_id: "j@5".into(),
            job: "j".into(),
            scheduled_at_ms: 5,
            fired_at_ms: 6,
            received_at_ms: 7,
            attempt: 1,
        });
        let line = serde_json::to_string(&e).unwrap();
        assert!(line.starts_with("{\"type\":\"receipt\""), "{line}");
        assert_eq!(serde_json::from_str::<Event>(&line).unwrap(), e);
    }

    #[test]
    fn optional_fields_are_omitted_and_defaulted() {
        let c = Event::Complete(Complete::bare(1, 2, 3, Outcome::Unknown));
        let line = serde_json::to_string(&c).unwrap();
        assert_eq!(
            line,
            r#"{"type":"complete","op":1,"process":2,"time_ms":3,"outcome":"unknown"}"#
        );
        let f: Event = serde_json::from_str(r#"{"type":"final","node":3}"#).unwrap();
        match f {
            Event::Final(n) => assert!(n.node == 3 && n.runs.is_empty()),
            other => panic!("{other:?}"),
        }
    }
}
