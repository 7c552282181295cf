//! The snapshot file: the whole state key space streamed to disk pair by
//! pair, so neither building, sending nor installing a snapshot holds the
//! state in memory. The file is also the snapshot data sent to followers.
//!
//! Layout (integers little-endian):
//! `MAGIC (8) | format version u32 | meta length u32 | meta (bincode)`,
//! then per pair `key length u32 | key | value length u32 | value`,
//! then `END (u32::MAX) | pair count u64 | SHA-256 (32)` where the hash
//! covers every byte before it, and nothing follows. A file without the
//! trailer, with another count or hash, or with bytes after the trailer is
//! truncated or corrupt and is refused. [`verify`] reads a whole file this
//! way, so a received snapshot is checked before it replaces anything.
//!
//! `MAGIC | format version` is the part of the layout every format keeps:
//! a file of a format this binary does not read (`keys::STATE_VERSION`,
//! back to `keys::STATE_VERSION_OLDEST`) is refused right after it, with
//! both versions named, before anything else of it is read.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::core::codec::{check_format, decode, encode};
use crate::core::keys;
use crate::raft::SnapshotMeta;

const MAGIC: &[u8; 8] = b"KAIROSNP";
const END: u32 = u32::MAX;
/// Bound on the encoded meta (membership of a few nodes is far smaller).
const META_MAX_BYTES: u32 = 1 << 20;
const IO_BUF: usize = 1 << 20;

fn corrupt(what: impl Into<String>) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("snapshot file: {}", what.into()),
    )
}

const HASH_BYTES: usize = 32;

/// A writer that hashes what it writes.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// Writes a snapshot file; [`Writer::finish`] makes it durable.
pub struct Writer {
    w: Hashing<BufWriter<File>>,
    count: u64,
}

impl Writer {
    pub fn create(path: &Path, version: u32, meta: &SnapshotMeta) -> io::Result<Writer> {
        let mut w = Hashing {
            inner: BufWriter::with_capacity(IO_BUF, File::create(path)?),
            hash: Sha256::new(),
        };
        let meta = encode(meta);
        w.write_all(MAGIC)?;
        w.write_all(&version.to_le_bytes())?;
        w.write_all(&(meta.len() as u32).to_le_bytes())?;
        w.write_all(&meta)?;
        Ok(Writer { w, count: 0 })
    }

    pub fn pair(&mut self, key: &[u8], value: &[u8]) -> io::Result<()> {
        for part in [key, value] {
            let len = u32::try_from(part.len())
                .ok()
                .filter(|l| *l != END)
                .ok_or_else(|| corrupt("a key or value over 4 GiB"))?;
            self.w.write_all(&len.to_le_bytes())?;
            self.w.write_all(part)?;
        }
        self.count += 1;
        Ok(())
    }

    /// Writes the trailer and syncs the file. Returns the pair count.
    pub fn finish(mut self) -> io::Result<u64> {
        self.w.write_all(&END.to_le_bytes())?;
        self.w.write_all(&self.count.to_le_bytes())?;
        let Hashing { mut inner, hash } = self.w;
        inner.write_all(&hash.finalize())?;
        let f = inner.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        Ok(self.count)
    }
}

/// Reads a snapshot file pair by pair, checking the trailer at the end.
pub struct Reader {
    r: Hashing<BufReader<File>>,
    pub version: u32,
    pub meta: SnapshotMeta,
    count: u64,
    done: bool,
}

impl Reader {
    pub fn open(path: &Path) -> io::Result<Reader> {
        let mut r = Hashing {
            inner: BufReader::with_capacity(IO_BUF, File::open(path)?),
            hash: Sha256::new(),
        };
        let mut magic = [0u8; 8];
        r.read_exact(&mut magic)?;
        if &magic != MAGIC {
            return Err(corrupt("not a Kairos snapshot (bad magic)"));
        }
        let version = read_u32(&mut r)?;
        let (oldest, known) = (keys::STATE_VERSION_OLDEST, keys::STATE_VERSION);
        check_format("snapshot file", version, oldest, known).map_err(io::Error::other)?;
        let meta_len = read_u32(&mut r)?;
        if meta_len > META_MAX_BYTES {
            return Err(corrupt(format!("meta of {meta_len} bytes")));
        }
        let mut meta = vec![0u8; meta_len as usize];
        r.read_exact(&mut meta)?;
        let meta = decode(&meta).map_err(|e| corrupt(format!("meta: {e}")))?;
        Ok(Reader {
            r,
            version,
            meta,
            count: 0,
            done: false,
        })
    }

    /// The next pair, or `None` after a valid trailer.
    pub fn next_pair(&mut self) -> io::Result<Option<(Vec<u8>, Vec<u8>)>> {
        if self.done {
            return Ok(None);
        }
        let klen = read_u32(&mut self.r)?;
        if klen == END {
            let mut n = [0u8; 8];
            self.r.read_exact(&mut n)?;
            let n = u64::from_le_bytes(n);
            if n != self.count {
                return Err(corrupt(format!(
                    "trailer says {n} pairs, read {}",
                    self.count
                )));
            }
            let computed = std::mem::take(&mut self.r.hash).finalize();
            let mut stored = [0u8; HASH_BYTES];
            self.r.inner.read_exact(&mut stored)?;
            if computed[..] != stored[..] {
                return Err(corrupt("checksum mismatch"));
            }
            if self.r.inner.read(&mut [0u8; 1])? != 0 {
                return Err(corrupt("bytes after the trailer"));
            }
            self.done = true;
            return Ok(None);
        }
        let key = read_exact_vec(&mut self.r, klen)?;
        let vlen = read_u32(&mut self.r)?;
        if vlen == END {
            return Err(corrupt("value length marker"));
        }
        let value = read_exact_vec(&mut self.r, vlen)?;
        self.count += 1;
        Ok(Some((key, value)))
    }
}

/// Reads a whole snapshot file and checks its format, pair count and
/// checksum. Returns its header (version and meta).
pub fn verify(path: &Path) -> io::Result<(u32, SnapshotMeta)> {
    let mut r = Reader::open(path)?;
    while r.next_pair()?.is_some() {}
    Ok((r.version, r.meta))
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_exact_vec(r: &mut impl Read, len: u32) -> io::Result<Vec<u8>> {
    // Read through `take` so a corrupt length cannot allocate more than the file holds.
    let mut v = Vec::new();
    r.take(len as u64).read_to_end(&mut v)?;
    if v.len() != len as usize {
        return Err(corrupt("truncated pair"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: None,
            last_membership: Default::default(),
            snapshot_id: "t-1".into(),
        }
    }

    fn write(path: &Path, pairs: &[(&[u8], &[u8])]) {
        let mut w = Writer::create(path, keys::STATE_VERSION, &meta()).unwrap();
        for (k, v) in pairs {
            w.pair(k, v).unwrap();
        }
        assert_eq!(w.finish().unwrap(), pairs.len() as u64);
    }

    #[test]
    fn pairs_round_trip_with_meta_and_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        write(&path, &[(b"a", b"1"), (b"bb", b""), (b"", b"xyz")]);
        let mut r = Reader::open(&path).unwrap();
        let got = (r.version, r.meta.snapshot_id.as_str());
        assert_eq!(got, (keys::STATE_VERSION, "t-1"));
        let mut got = Vec::new();
        while let Some(p) = r.next_pair().unwrap() {
            got.push(p);
        }
        let want: Vec<(Vec<u8>, Vec<u8>)> = vec![
            (b"a".to_vec(), b"1".to_vec()),
            (b"bb".to_vec(), vec![]),
            (vec![], b"xyz".to_vec()),
        ];
        assert_eq!(got, want);
        assert!(r.next_pair().unwrap().is_none());
    }

    #[test]
    fn a_truncated_or_foreign_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        write(&path, &[(b"key", b"value"), (b"k2", b"v2")]);
        let full = std::fs::read(&path).unwrap();
        for cut in [full.len() - 1, full.len() - 12, full.len() - 20] {
            std::fs::write(&path, &full[..cut]).unwrap();
            let mut r = Reader::open(&path).unwrap();
            let res = (0..4).try_for_each(|_| r.next_pair().map(|_| ()));
            assert!(res.is_err(), "cut at {cut} must not read as complete");
        }
        std::fs::write(&path, b"NOTASNAPSHOTFILE").unwrap();
        assert!(Reader::open(&path).is_err());
    }

    #[test]
    fn a_file_of_another_format_is_refused_naming_both_versions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let newer = keys::STATE_VERSION + 1;
        let mut w = Writer::create(&path, newer, &meta()).unwrap();
        w.pair(b"k", b"v").unwrap();
        w.finish().unwrap();
        let e = verify(&path).unwrap_err().to_string();
        let want = format!(
            "snapshot file has format version {newer}, newer than this binary's {}",
            keys::STATE_VERSION
        );
        assert!(e.starts_with(&want), "{e}");
        // Refused on the version alone: what follows it is never read.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.truncate(MAGIC.len() + 4);
        std::fs::write(&path, &bytes).unwrap();
        assert!(verify(&path).unwrap_err().to_string().starts_with(&want));
        let older = keys::STATE_VERSION_OLDEST - 1;
        bytes[MAGIC.len()..].copy_from_slice(&older.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let e = verify(&path).unwrap_err().to_string();
        assert!(
            e.contains(&format!("format version {older}, older than")),
            "{e}"
        );
    }

    #[test]
    fn verify_refuses_any_flipped_byte_any_cut_and_any_extra_byte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        write(&path, &[(b"key", b"value"), (b"k2", b"v2"), (b"", b"")]);
        let full = std::fs::read(&path).unwrap();
        assert_eq!(verify(&path).unwrap().0, keys::STATE_VERSION);
        for i in 0..full.len() {
            let mut bad = full.clone();
            bad[i] ^= 0x10;
            std::fs::write(&path, &bad).unwrap();
            assert!(verify(&path).is_err(), "flipped byte {i} accepted");
        }
        for cut in 0..full.len() {
            std::fs::write(&path, &full[..cut]).unwrap();
            assert!(verify(&path).is_err(), "cut at {cut} accepted");
        }
        let mut longer = full.clone();
        longer.push(0);
        std::fs::write(&path, &longer).unwrap();
        assert!(verify(&path).is_err(), "a byte after the trailer accepted");
    }
}
