//! MPA Request/Reply parser: never panics; what parses re-emits to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcrdma_verbs::soft::wire;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = wire::parse_mpa(data) {
        let total = wire::mpa_frame_len(data).unwrap();
        let mut out = Vec::new();
        wire::emit_mpa(&mut out, f.reply, f.flags, f.revision, f.ird_ord, f.private_data);
        assert_eq!(&out[..], &data[..total]);
    }
});
