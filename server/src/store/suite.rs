//! openraft's own storage conformance suite (`openraft::testing::Suite`)
//! run against Kairos' log store and state machine, each case on a fresh
//! data directory.
//!
//! Every case of the 0.9 suite applies to Kairos: the suite writes only
//! blank and membership entries (it cannot build a `C::D`), which Kairos
//! stores and applies like any other entry, and none is skipped.

use openraft::testing::{StoreBuilder, Suite};

use super::{LogStore, StateMachine};
use crate::raft::{StorageError, TypeConfig};

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError> {
        let dir = tempfile::tempdir().expect("temp dir");
        let (log, sm) = super::open(dir.path(), 8 << 20, Default::default())
            .expect("open a fresh data directory");
        Ok((dir, log, sm))
    }
}

/// Not a `#[tokio::test]`: the suite makes a runtime of its own per case.
#[test]
fn log_store_and_state_machine_pass_the_openraft_storage_suite() {
    Suite::test_all(Builder).unwrap();
}
