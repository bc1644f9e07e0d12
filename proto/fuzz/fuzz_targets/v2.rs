//! Version-two decoder: never panics; whatever decodes re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcrdma_proto::{v2, xchar, Limits, Received};

fuzz_target!(|data: &[u8]| {
    match v2::Header::parse(data, &Limits::DEFAULT) {
        Ok((h, n)) => {
            let _ = h.to_string();
            let _ = h.check_reply();
            let mut out = vec![0u8; h.buffer_len()];
            let m = h.emit(&mut out).expect("re-encode");
            assert_eq!(m, n);
            assert_eq!(&out[..], &data[..n]);
            if let v2::Body::Optional(o) = h.body {
                let _ = xchar::Operation::parse(o.opttype, o.optinfo);
            }
        }
        Err(e) => {
            let _ = e.answer(2, Received::Call);
        }
    }
});
