//! Raft wiring: the openraft type configuration, the peer network over
//! gRPC, and when a node builds its snapshots.

pub mod network;
pub mod snapshots;

use crate::core::{Response, VersionedCommand};

openraft::declare_raft_types!(
    /// Kairos' Raft types: commands (with their log format) in, responses
    /// out, u64 node ids.
    pub TypeConfig:
        D = VersionedCommand,
        R = Response,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;
pub type Snapshot = openraft::storage::Snapshot<TypeConfig>;
pub type StorageError = openraft::StorageError<NodeId>;
