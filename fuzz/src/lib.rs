//! What the fuzz targets share: applying commands to an in-memory replica
//! and checking the invariants apply promises for every input.

use kairos_server::core::{apply, Command, MemView, Response};

/// Applies `cmds` in order to `view`, as a replica would. Panics (a fuzz
/// crash) if apply panics or a refused command writes anything.
pub fn apply_all(view: &mut MemView, cmds: &[Command]) {
    for cmd in cmds {
        let applied = apply(view, cmd);
        if matches!(applied.response, Response::Error(_)) {
            assert!(
                applied.writes.is_empty() && applied.effects.is_empty(),
                "a refused command wrote {:?} / {:?}",
                applied.writes,
                applied.effects
            );
        }
        view.write(&applied.writes);
    }
}
