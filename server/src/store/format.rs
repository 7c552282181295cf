//! The data directory's format version: a `format` file holding the state
//! format (`keys::STATE_VERSION`) the directory was created with, written
//! before the storage engine creates anything. A binary reads it before it
//! opens sled, so a directory it does not read is refused, naming both
//! versions, before anything touches the data. Node-local: not replicated,
//! not in snapshots, not in the digest.

use std::io::Write;
use std::path::Path;

use super::StoreError;
use crate::core::codec::{check_format, decode, FormatError};
use crate::core::keys;

const FILE: &str = "format";
/// Where releases before the `format` file (state format 7 and older) kept
/// the version: a key of the state tree.
const LEGACY_TREE: &str = "state";
const LEGACY_KEY: &[u8] = b"mversion";

/// Accepts a data directory this binary reads, or records this binary's
/// format in a new one. `dir` exists.
pub fn check_or_create(dir: &Path) -> Result<(), StoreError> {
    let what = format!("data directory {}", dir.display());
    let path = dir.join(FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let found = text.trim().parse().map_err(|_| {
                StoreError::Corrupt(format!(
                    "{}: expected a format version number, got {:?}",
                    path.display(),
                    text.trim()
                ))
            })?;
            check_format(
                &what,
                found,
                keys::STATE_VERSION_OLDEST,
                keys::STATE_VERSION,
            )?;
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if dir.join("db").exists() {
                return Err(legacy(dir, what)?.into());
            }
            write(dir, &path).map_err(|e| StoreError::Sled(e.into()))
        }
        Err(e) => Err(StoreError::Sled(e.into())),
    }
}

/// The refusal for a directory written before format files (so older than
/// format 8): it names the version its state recorded.
fn legacy(dir: &Path, what: String) -> Result<FormatError, StoreError> {
    let db = sled::open(dir.join("db"))?;
    let found = match db.open_tree(LEGACY_TREE)?.get(LEGACY_KEY)? {
        Some(b) => decode(&b).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        None => 0,
    };
    Ok(FormatError::Older {
        what,
        found,
        oldest: keys::STATE_VERSION_OLDEST,
        known: keys::STATE_VERSION,
    })
}

/// Writes the file durably: a temporary file, synced, renamed, and the directory synced.
fn write(dir: &Path, path: &Path) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    writeln!(f, "{}", keys::STATE_VERSION)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::codec::encode;

    #[test]
    fn a_new_directory_records_its_format_and_opens_again() {
        let dir = tempfile::tempdir().unwrap();
        check_or_create(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert_eq!(text, format!("{}\n", keys::STATE_VERSION));
        check_or_create(dir.path()).unwrap();
    }

    #[test]
    fn a_newer_or_unreadable_format_is_refused_naming_both_versions() {
        let dir = tempfile::tempdir().unwrap();
        let newer = keys::STATE_VERSION + 1;
        std::fs::write(dir.path().join(FILE), format!("{newer}\n")).unwrap();
        let e = check_or_create(dir.path()).unwrap_err().to_string();
        let want = format!(
            "has format version {newer}, newer than this binary's {}",
            keys::STATE_VERSION
        );
        assert!(e.contains(&want), "{e}");
        std::fs::write(dir.path().join(FILE), "eight").unwrap();
        let e = check_or_create(dir.path()).unwrap_err().to_string();
        assert!(e.contains("expected a format version number"), "{e}");
    }

    #[test]
    fn a_directory_from_before_format_files_is_refused_naming_its_version() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path().join("db")).unwrap();
        let state = db.open_tree(LEGACY_TREE).unwrap();
        state.insert(LEGACY_KEY, encode(&7u32)).unwrap();
        db.flush().unwrap();
        drop((state, db));
        // sled's flusher thread may hold the directory's lock a moment after
        // the last handle went (a process that exits releases it at once).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let e = loop {
            let e = check_or_create(dir.path()).unwrap_err().to_string();
            if !e.contains("could not acquire lock") || std::time::Instant::now() > deadline {
                break e;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let want = format!(
            "has format version 7, older than {}",
            keys::STATE_VERSION_OLDEST
        );
        assert!(e.contains(&want), "{e}");
        assert!(!dir.path().join(FILE).exists(), "nothing recorded");
    }
}
