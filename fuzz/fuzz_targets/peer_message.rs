//! Raft messages from peers (requests on the peer service, responses on the
//! dialing side) go through `core::codec::decode`: it must fail cleanly.

#![no_main]

use kairos_server::core::codec::decode;
use kairos_server::raft::{NodeId, TypeConfig};
use libfuzzer_sys::fuzz_target;
use openraft::error::{Infallible, InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};

fuzz_target!(|data: &[u8]| {
    let _ = decode::<AppendEntriesRequest<TypeConfig>>(data);
    let _ = decode::<VoteRequest<NodeId>>(data);
    let _ = decode::<InstallSnapshotRequest<TypeConfig>>(data);
    let _ = decode::<Result<AppendEntriesResponse<NodeId>, RaftError<NodeId, Infallible>>>(data);
    let _ = decode::<Result<VoteResponse<NodeId>, RaftError<NodeId, Infallible>>>(data);
    let _ = decode::<
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
    >(data);
});
