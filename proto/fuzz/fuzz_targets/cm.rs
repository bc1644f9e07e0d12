//! RFC 8797 private data: never panics; a valid message re-encodes to its first 8 bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcrdma_proto::cm::PrivateData;

fuzz_target!(|data: &[u8]| {
    if let Some(p) = PrivateData::parse(data) {
        let _ = p.to_string();
        let out = p.emit();
        // Flag bits other than bit 0 are not kept.
        let mut want = [0u8; 8];
        want.copy_from_slice(&data[..8]);
        want[5] &= 1;
        assert_eq!(out, want);
        assert_eq!(PrivateData::parse(&out), Some(p));
    }
});
