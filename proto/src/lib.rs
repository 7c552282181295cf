//! Wire types for Kairos, generated from `proto/`. Domain types live in
//! `kairos-server`; conversion happens in one place there (`grpc::convert`).

pub mod v1 {
    tonic::include_proto!("kairos.v1");
}

pub mod peer {
    tonic::include_proto!("kairos.peer.v1");
}

/// Encoded `FileDescriptorSet` of every proto, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptor.bin"));
