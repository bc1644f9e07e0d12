//! Version-1 decoder: never panics; whatever decodes re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcrdma_proto::{v1, Limits, Received};

fuzz_target!(|data: &[u8]| {
    let tight = Limits {
        max_read_segments: 4,
        max_read_chunks: 2,
        max_write_chunks: 2,
        max_segments_per_chunk: 3,
        max_version: 1,
    };
    for limits in [Limits::DEFAULT, tight] {
        match v1::Header::parse(data, &limits) {
            Ok((h, n)) => {
                let _ = h.to_string();
                let _ = h.check_reply();
                let mut out = vec![0u8; h.buffer_len()];
                let m = h.emit(&mut out).expect("re-encode");
                assert_eq!(m, n);
                assert_eq!(m, h.buffer_len());
                assert_eq!(&out[..m], &data[..n]);
            }
            Err(e) => {
                let _ = e.answer(1, Received::Call);
                let _ = e.to_string();
            }
        }
    }
    if let Err(r) = rpcrdma_proto::decode(data, &Limits::DEFAULT) {
        if let Some(reply) = r.reply(Received::Call, 1, &Limits::DEFAULT) {
            let mut out = [0u8; 28];
            let n = reply.emit(&mut out).expect("error reply fits 28 bytes");
            rpcrdma_proto::decode(&out[..n], &Limits::DEFAULT).expect("error reply decodes");
        }
    }
});
