//! The one binary encoding of replicated values (bincode 2, serde mode,
//! standard config). Used for state values, log entries, snapshots and peer
//! messages. Every decode is limited: bytes from the disk or the network
//! cannot make it allocate more than [`DECODE_LIMIT_BYTES`] (a 20-byte blob
//! announcing a terabyte string is an error, not an abort).
//!
//! What is stored or sent carries a format version (log entries, snapshot
//! files, the data directory); [`check_format`] is the one rule for
//! meeting one: a format newer than this binary's, or older than the oldest
//! it reads, is refused with both versions named, never guessed at.

use serde::{de::DeserializeOwned, Serialize};

pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    encode_parts(|out| append(out, v))
}

/// Appends `v`'s encoding to `out`.
fn append<T: Serialize>(out: &mut Vec<u8>, v: &T) {
    // Encoding plain data into a Vec cannot fail; a failure is a programming error.
    bincode::serde::encode_into_std_write(v, out, bincode::config::standard())
        .expect("bincode encode of plain data");
}

/// A buffer kept at most this large between encodes (a snapshot chunk or a
/// log entry is larger: its buffer is let go).
const SCRATCH_KEEP: usize = 64 << 10;

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// What `parts` appends to an empty buffer, as a `Vec` of exactly its
/// length. The parts are written into a buffer this thread keeps, then
/// copied out once: bincode writing into a fresh `Vec` grew it five or six
/// times for a record (8, 16, … 256 bytes), each a reallocation and a copy
/// (~6 % of apply's samples at saturation, BENCHMARKS.md twenty-sixth
/// pass); and a `Vec` kept in a window holds no spare capacity.
fn encode_parts(parts: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut buf) => {
            buf.clear();
            parts(&mut buf);
            let out = buf.to_vec();
            if buf.capacity() > SCRATCH_KEEP {
                *buf = Vec::new();
            }
            out
        }
        // Not re-entered today; if it ever is, a fresh buffer is still right.
        Err(_) => {
            let mut buf = Vec::new();
            parts(&mut buf);
            buf
        }
    })
}

/// The length of `encode(v)`, without building it.
pub fn encoded_len<T: Serialize>(v: &T) -> usize {
    let mut size = bincode::enc::write::SizeWriter::default();
    bincode::serde::encode_into_writer(v, &mut size, bincode::config::standard())
        .expect("bincode encode of plain data");
    size.bytes_written
}

/// Upper bound on what one decode may claim (and on a peer message's size):
/// an AppendEntries of 64 entries of at most `limits::ENTRY_MAX_BYTES` each,
/// with room to spare.
pub const DECODE_LIMIT_BYTES: usize = 96 << 20;

pub fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T, bincode::error::DecodeError> {
    decode_prefix(b).map(|(v, _)| v)
}

/// Decodes a value from the start of `b`, with the bytes it took.
pub fn decode_prefix<T: DeserializeOwned>(
    b: &[u8],
) -> Result<(T, usize), bincode::error::DecodeError> {
    let config = bincode::config::standard().with_limit::<DECODE_LIMIT_BYTES>();
    bincode::serde::decode_from_slice(b, config)
}

/// A record as stored: `head`'s encoding, followed by `tail`'s only when
/// the tail is not its default, so a record that uses none of the newer
/// fields keeps the older format's bytes exactly.
pub fn encode_with_tail<T: Serialize, E: Serialize + Default + PartialEq>(
    head: &T,
    tail: &E,
) -> Vec<u8> {
    encode_with_tails(head, tail, &())
}

/// A record with two tails, each from a later format than the one before
/// it: `tail` is written when either is set, `more` only when it is set.
/// So a record that uses nothing of `more`'s format is byte for byte what
/// the format before wrote (and reads there), and bincode, which is not
/// self-describing, never meets a field a reader does not know: a newer
/// format's fields go in a new tail, never appended to an older one.
pub fn encode_with_tails<T, E, M>(head: &T, tail: &E, more: &M) -> Vec<u8>
where
    T: Serialize,
    E: Serialize + Default + PartialEq,
    M: Serialize + Default + PartialEq,
{
    encode_with_three_tails(head, tail, more, &())
}

/// `encode_with_tails` with a third tail, from a format later still: each
/// tail is written when it or a later one is set.
pub fn encode_with_three_tails<T, E, M, L>(head: &T, tail: &E, more: &M, last: &L) -> Vec<u8>
where
    T: Serialize,
    E: Serialize + Default + PartialEq,
    M: Serialize + Default + PartialEq,
    L: Serialize + Default + PartialEq,
{
    let last_set = *last != L::default();
    let more_set = last_set || *more != M::default();
    let tail_set = more_set || *tail != E::default();
    encode_parts(|out| {
        append(out, head);
        if tail_set {
            append(out, tail);
        }
        if more_set {
            append(out, more);
        }
        if last_set {
            append(out, last);
        }
    })
}

/// Reads `encode_with_tail`'s bytes (or a record without a tail): the
/// tail, when present, must decode exactly to the end.
pub fn decode_with_tail<T: DeserializeOwned, E: DeserializeOwned + Default>(
    b: &[u8],
    what: &'static str,
) -> Result<(T, E), bincode::error::DecodeError> {
    let (head, tail, ()) = decode_with_tails(b, what)?;
    Ok((head, tail))
}

/// Reads `encode_with_tails`'s bytes, or a record of an older format with
/// fewer tails (their fields default); what is there must decode exactly
/// to the end.
pub fn decode_with_tails<T, E, M>(
    b: &[u8],
    what: &'static str,
) -> Result<(T, E, M), bincode::error::DecodeError>
where
    T: DeserializeOwned,
    E: DeserializeOwned + Default,
    M: DeserializeOwned + Default,
{
    let (head, tail, more, ()) = decode_with_three_tails(b, what)?;
    Ok((head, tail, more))
}

/// Reads `encode_with_three_tails`'s bytes, or a record with fewer tails.
pub fn decode_with_three_tails<T, E, M, L>(
    b: &[u8],
    what: &'static str,
) -> Result<(T, E, M, L), bincode::error::DecodeError>
where
    T: DeserializeOwned,
    E: DeserializeOwned + Default,
    M: DeserializeOwned + Default,
    L: DeserializeOwned + Default,
{
    let (head, mut used) = decode_prefix::<T>(b)?;
    let mut tail = E::default();
    let mut more = M::default();
    let mut last = L::default();
    if used < b.len() {
        let (t, n) = decode_prefix::<E>(&b[used..])?;
        (tail, used) = (t, used + n);
    }
    if used < b.len() {
        let (m, n) = decode_prefix::<M>(&b[used..])?;
        (more, used) = (m, used + n);
    }
    if used < b.len() {
        let (l, n) = decode_prefix::<L>(&b[used..])?;
        (last, used) = (l, used + n);
    }
    if used != b.len() {
        return Err(bincode::error::DecodeError::Other(what));
    }
    Ok((head, tail, more, last))
}

/// How many tails a stored record has after its `T` head, its first tail
/// `E` and its second `M`: 0 to 3 (a record that does not decode counts
/// as 0).
pub fn tails<T: DeserializeOwned, E: DeserializeOwned, M: DeserializeOwned>(b: &[u8]) -> usize {
    let Ok((_, mut used)) = decode_prefix::<T>(b) else {
        return 0;
    };
    if used == b.len() {
        return 0;
    }
    match decode_prefix::<E>(&b[used..]) {
        Ok((_, n)) if used + n < b.len() => used += n,
        _ => return 1,
    }
    match decode_prefix::<M>(&b[used..]) {
        Ok((_, n)) if used + n < b.len() => 3,
        _ => 2,
    }
}

/// Whether a stored record has bytes after its `T` head (a tail).
pub fn has_tail<T: DeserializeOwned>(b: &[u8]) -> bool {
    decode_prefix::<T>(b).is_ok_and(|(_, used)| used < b.len())
}

/// Something stored or received in a format this binary does not read.
/// `what` names it: "data directory /var/lib/kairos", "log entry 42".
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error(
        "{what} has format version {found}, newer than this binary's {known}: \
         it was written by a newer Kairos; run that release (or a newer one) on this node"
    )]
    Newer {
        what: String,
        found: u32,
        known: u32,
    },
    #[error(
        "{what} has format version {found}, older than {oldest}, the oldest this binary \
         (format {known}) reads; it cannot be migrated in place"
    )]
    Older {
        what: String,
        found: u32,
        oldest: u32,
        known: u32,
    },
    #[error("{what} (format version {found}) does not decode: {reason}")]
    Undecodable {
        what: String,
        found: u32,
        reason: String,
    },
}

/// Accepts `found` if this binary reads it: from `oldest` up to `known`.
pub fn check_format(what: &str, found: u32, oldest: u32, known: u32) -> Result<(), FormatError> {
    let what = what.to_string();
    if found > known {
        return Err(FormatError::Newer { what, found, known });
    }
    if found < oldest {
        return Err(FormatError::Older {
            what,
            found,
            oldest,
            known,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_through_the_kept_buffer_are_bincodes_exactly_and_own_no_spare_room() {
        fn same<T: Serialize>(v: &T) {
            let got = encode(v);
            let want = bincode::serde::encode_to_vec(v, bincode::config::standard()).unwrap();
            assert_eq!(got, want);
            assert_eq!(got.capacity(), got.len(), "no spare room in a kept value");
        }
        same(&5u64);
        same(&String::from("job-0001"));
        same(&vec![7u8; SCRATCH_KEEP * 2]);
        // After a value larger than the kept buffer, and a shorter one after a longer.
        same(&(1i64, String::from("x"), Some(vec![1u8, 2, 3])));
        same(&());
        SCRATCH.with(|s| assert!(s.borrow().capacity() <= SCRATCH_KEEP));
        // Tails are appended in one buffer, each only when it or a later one is set.
        let rec = encode_with_three_tails(&1u32, &0u8, &0u16, &9u64);
        let mut want = encode(&1u32);
        for part in [encode(&0u8), encode(&0u16), encode(&9u64)] {
            want.extend(part);
        }
        assert_eq!(rec, want);
        assert_eq!(
            encode_with_three_tails(&1u32, &0u8, &0u16, &0u64),
            encode(&1u32)
        );
        assert_eq!(
            decode_with_three_tails::<u32, u8, u16, u64>(&rec, "rec").unwrap(),
            (1, 0, 0, 9)
        );
    }

    #[test]
    fn a_length_bomb_is_an_error_not_an_allocation() {
        // A varint announcing a string of u64::MAX bytes, then nothing.
        let mut blob = vec![0xFF];
        blob.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode::<String>(&blob).is_err());
        assert!(decode::<Vec<u8>>(&blob).is_err());
        assert!(decode::<Vec<String>>(&blob).is_err());
        // Announcing 1 GiB (under u64::MAX, over the limit) in 5 bytes.
        let mut blob = vec![0xFC];
        blob.extend_from_slice(&(1u32 << 30).to_le_bytes());
        assert!(decode::<Vec<u8>>(&blob).is_err());
        assert!(decode::<String>(&blob).is_err());
    }

    #[test]
    fn a_format_outside_what_this_binary_reads_is_refused_naming_both_versions() {
        assert_eq!(check_format("x", 3, 2, 4), Ok(()));
        let newer = check_format("log entry 7", 5, 2, 4)
            .unwrap_err()
            .to_string();
        assert!(
            newer.starts_with("log entry 7 has format version 5, newer than this binary's 4"),
            "{newer}"
        );
        let older = check_format("data directory /d", 1, 2, 4)
            .unwrap_err()
            .to_string();
        assert!(
            older.starts_with("data directory /d has format version 1, older than 2"),
            "{older}"
        );
        assert!(older.contains("(format 4)"), "{older}");
    }

    #[test]
    fn values_round_trip_under_the_limit() {
        let v: Vec<String> = vec!["a".into(), "b".repeat(10_000)];
        assert_eq!(decode::<Vec<String>>(&encode(&v)).unwrap(), v);
        assert_eq!(encoded_len(&v), encode(&v).len());
    }
}
