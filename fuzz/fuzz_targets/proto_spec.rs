//! A client's `JobSpec` from the wire: prost decode, the one wire → domain
//! conversion, validation, then apply as a CreateJob and an UpdateJob.
//! Nothing on the way may panic; a refused command writes nothing.

#![no_main]

use kairos_fuzz::apply_all;
use kairos_proto::v1 as pb;
use kairos_server::core::{validate, Command, MemView};
use kairos_server::grpc::convert::spec_in;
use libfuzzer_sys::fuzz_target;
use prost::Message;

const NOW_MS: i64 = 1_700_000_000_000;

fuzz_target!(|data: &[u8]| {
    let Ok(wire) = pb::JobSpec::decode(data) else {
        return;
    };
    let Ok(spec) = spec_in(Some(wire)) else {
        return;
    };
    let _ = validate::job_spec(&spec, NOW_MS);
    let create = Command::CreateJob {
        spec: spec.clone(),
        now_ms: NOW_MS,
    };
    let update = Command::UpdateJob {
        spec,
        expected_revision: 0,
        now_ms: NOW_MS + 1,
    };
    apply_all(&mut MemView::default(), &[create, update]);
});
