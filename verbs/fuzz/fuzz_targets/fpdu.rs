//! FPDU/DDP/RDMAP parser: never panics, never claims more bytes than it was given, and a
//! parsed segment's payload lies inside the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcrdma_verbs::soft::wire::{self, Segment};

fuzz_target!(|data: &[u8]| {
    for crc in [false, true] {
        let mut rest = data;
        while let Ok((seg, used)) = wire::parse_fpdu(rest, crc) {
            assert!(used >= 8 && used <= rest.len() && used % 4 == 0);
            let payload: &[u8] = match seg {
                Segment::Write { payload, .. }
                | Segment::ReadResponse { payload, .. }
                | Segment::Send { payload, .. } => payload,
                Segment::Terminate { rest, .. } => rest,
                Segment::ReadRequest(_) => &[],
            };
            assert!(payload.len() <= used);
            rest = &rest[used..];
        }
    }
    let _ = wire::parse_ulpdu(data);
});
