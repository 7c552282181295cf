//! The one mapping from Kairos errors to gRPC statuses. A redirect carries
//! the leader's address in the `x-kairos-leader` metadata; a write refused
//! by admission control carries its retry hint in `retry-after-ms`.

use tonic::{Code, Status};

use crate::core::CommandError;
use crate::node::ProposeError;

pub const LEADER_HEADER: &str = "x-kairos-leader";
pub use kairos_client::RETRY_AFTER_HEADER;

pub fn command(e: CommandError) -> Status {
    let code = match &e {
        CommandError::Invalid(_) => Code::InvalidArgument,
        CommandError::NotFound(_) | CommandError::RunNotFound(_) => Code::NotFound,
        CommandError::AlreadyExists(_) => Code::AlreadyExists,
        CommandError::RevisionMismatch { .. }
        | CommandError::StaleAttempt { .. }
        | CommandError::FailedPrecondition(_) => Code::FailedPrecondition,
    };
    Status::new(code, e.to_string())
}

pub fn not_leader(leader: Option<(u64, String)>) -> Status {
    let msg = match &leader {
        Some((id, addr)) => format!("not the leader; leader is node {id} at {addr}"),
        None => "no leader elected yet; retry shortly".to_string(),
    };
    let mut s = Status::unavailable(msg);
    if let Some((_, addr)) = leader {
        if let Ok(v) = addr.parse() {
            s.metadata_mut().insert(LEADER_HEADER, v);
        }
    }
    s
}

/// A write reached a new leader that has not measured a quorum's clocks
/// yet: it cannot stamp the command with cluster time. Retryable.
pub fn uncalibrated() -> Status {
    Status::unavailable(
        "the leader's clock is not calibrated yet (no quorum clock measurement since it was elected); retry shortly",
    )
}

pub fn propose(e: ProposeError) -> Status {
    match e {
        ProposeError::NotLeader { leader } => not_leader(leader),
        ProposeError::Timeout => Status::deadline_exceeded(e.to_string()),
        ProposeError::Raft(m) => Status::unavailable(format!("raft: {m}")),
        ProposeError::Format(f) => Status::failed_precondition(f.to_string()),
        ProposeError::Overloaded(o) => overloaded(&o),
        ProposeError::DiskFull(low) => Status::unavailable(low.to_string()),
    }
}

/// A write refused by admission control: `RESOURCE_EXHAUSTED`, with the
/// hint in the message and in the `retry-after-ms` metadata.
pub fn overloaded(o: &crate::admission::Overloaded) -> Status {
    let mut s = Status::resource_exhausted(o.to_string());
    s.metadata_mut()
        .insert(RETRY_AFTER_HEADER, o.retry_after_ms.into());
    s
}

pub fn membership(e: crate::membership::MembershipError) -> Status {
    use crate::membership::MembershipError as M;
    match e {
        M::Refused(msg) => Status::failed_precondition(msg),
        M::NotLeader { leader } => not_leader(leader),
        M::Raft(msg) => Status::unavailable(format!("raft: {msg}")),
    }
}

pub fn backup(e: crate::backup::BackupError) -> Status {
    use crate::backup::BackupError as B;
    match e {
        B::NotLeader { leader } => not_leader(leader),
        B::Refused(msg) => Status::failed_precondition(msg),
        B::Failed(msg) => Status::unavailable(msg),
    }
}

/// A handover that did not start is a refusal; one that started and was not
/// seen to finish is ABORTED, not retried: leadership may still move.
pub fn handover(e: crate::handover::HandoverError) -> Status {
    use crate::handover::HandoverError as H;
    match e {
        H::Refused(msg) => Status::failed_precondition(msg),
        H::NotLeader { leader } => not_leader(leader),
        H::Incomplete(msg) => Status::aborted(msg),
    }
}
