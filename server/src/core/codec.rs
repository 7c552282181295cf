//! The one binary encoding of replicated values (bincode 2, serde mode,
//! standard config). Used for state values, log entries, snapshots and peer
//! messages. Every decode is limited: bytes from the disk or the network
//! cannot make it allocate more than [`DECODE_LIMIT_BYTES`] (a 20-byte blob
//! announcing a terabyte string is an error, not an abort).

use serde::{de::DeserializeOwned, Serialize};

pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Encoding plain data into a Vec cannot fail; a failure is a programming error.
    bincode::serde::encode_to_vec(v, bincode::config::standard())
        .expect("bincode encode of plain data")
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
    let config = bincode::config::standard().with_limit::<DECODE_LIMIT_BYTES>();
    bincode::serde::decode_from_slice(b, config).map(|(v, _)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn values_round_trip_under_the_limit() {
        let v: Vec<String> = vec!["a".into(), "b".repeat(10_000)];
        assert_eq!(decode::<Vec<String>>(&encode(&v)).unwrap(), v);
        assert_eq!(encoded_len(&v), encode(&v).len());
    }
}
