//! Durable storage: the only module that touches sled. The Raft log, vote
//! and the replicated state live in separate trees of one sled database;
//! `kv` puts them behind the project's own [`kv::KvTree`] trait.

pub mod durable;
pub mod format;
pub mod kv;
pub mod log;
pub mod pin;
pub mod sm;
pub mod snapfile;
#[cfg(test)]
mod suite;

use std::path::Path;
use std::sync::Arc;

pub use log::LogStore;
pub use sm::StateMachine;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("storage: {0}")]
    Sled(#[from] sled::Error),
    #[error("storage: {0}")]
    Format(#[from] crate::core::codec::FormatError),
    #[error("storage: corrupt value: {0}")]
    Corrupt(String),
}

/// Opens (or creates) the database in `dir` and returns its log and state-machine stores.
/// `cache_bytes` bounds sled's page cache; the rest of the state stays on disk.
pub fn open(
    dir: &Path,
    cache_bytes: u64,
    sm_opts: sm::Options,
) -> Result<(LogStore, StateMachine), StoreError> {
    std::fs::create_dir_all(dir).map_err(|e| StoreError::Sled(e.into()))?;
    format::check_or_create(dir)?;
    let start = std::time::Instant::now();
    let db = Arc::new(durable::Db::open(
        &dir.join("db"),
        cache_bytes,
        sm_opts.metrics.clone(),
        sm_opts.on_sync_failure.clone(),
    )?);
    let sled_ms = start.elapsed().as_millis() as u64;
    let log = LogStore::open(db.clone(), sm_opts.metrics.clone())?;
    let sm = StateMachine::open(db, dir, sm_opts)?;
    tracing::info!(
        sled_ms,
        took_ms = start.elapsed().as_millis() as u64,
        "store opened"
    );
    Ok((log, sm))
}
