//! The one binary encoding of replicated values (bincode 2, serde mode,
//! standard config). Used for state values, log entries and snapshots.

use serde::{de::DeserializeOwned, Serialize};

pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Encoding plain data into a Vec cannot fail; a failure is a programming error.
    bincode::serde::encode_to_vec(v, bincode::config::standard())
        .expect("bincode encode of plain data")
}

pub fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T, bincode::error::DecodeError> {
    bincode::serde::decode_from_slice(b, bincode::config::standard()).map(|(v, _)| v)
}
