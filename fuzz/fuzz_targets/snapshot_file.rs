//! A received or stored snapshot file: `verify` and the pair reader must
//! refuse anything malformed with an error, never a panic or an abort.

#![no_main]

use std::io::Write;

use kairos_server::store::snapfile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(data).expect("write temp file");
    file.flush().expect("flush temp file");
    let verified = snapfile::verify(file.path());
    // The streaming reader must agree with verify: it reads to a valid
    // trailer exactly when verify accepts the file.
    let read_whole = snapfile::Reader::open(file.path()).and_then(|mut r| {
        while r.next_pair()?.is_some() {}
        Ok(())
    });
    assert_eq!(
        verified.is_ok(),
        read_whole.is_ok(),
        "verify and reader disagree"
    );
});
