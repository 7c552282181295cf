//! Log entries and commands as they come off the disk or a leader: decoding
//! must fail cleanly, and whatever decodes must apply without a panic.

#![no_main]

use kairos_fuzz::apply_all;
use kairos_server::core::codec::decode;
use kairos_server::core::{Command, MemView};
use kairos_server::raft::Entry;
use libfuzzer_sys::fuzz_target;
use openraft::EntryPayload;

fuzz_target!(|data: &[u8]| {
    if let Ok(entry) = decode::<Entry>(data) {
        if let EntryPayload::Normal(logged) = entry.payload {
            // A format this binary does not read is refused, not applied.
            if let Ok(cmd) = logged.command(entry.log_id.index) {
                apply_all(&mut MemView::default(), &[cmd]);
            }
        }
    }
    // A history: a job created by an earlier command is seen by later ones.
    if let Ok(cmds) = decode::<Vec<Command>>(data) {
        apply_all(&mut MemView::default(), &cmds);
    }
});
