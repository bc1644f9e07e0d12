//! xcharext bodies: the first 4 bytes pick `rdma_opttype`, the rest is `rdma_optinfo`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcrdma_proto::xchar::Operation;
use rpcrdma_proto::xdr::Writer;
use rpcrdma_proto::MsgType;

fuzz_target!(|data: &[u8]| {
    let Some((t, optinfo)) = data.split_first_chunk::<4>() else {
        return;
    };
    let opttype = u32::from_be_bytes(*t) % 6;
    if let Ok(op) = Operation::parse(opttype, optinfo) {
        let _ = op.to_string();
        let mut out = vec![0u8; op.buffer_len()];
        let mut w = Writer::new(&mut out);
        op.emit_body(&mut w).expect("re-encode");
        assert_eq!(w.position(), optinfo.len());
        assert_eq!(&out[..], optinfo);
        let mut msg = vec![0u8; 28 + op.buffer_len()];
        op.emit_message(1, 1, MsgType::Call, &mut msg).expect("message");
        if let Operation::InitXch { start: spec, .. } | Operation::ReqXch { want: spec } = op {
            // Every xcharval takes at least 8 bytes.
            assert!(spec.iter().count() <= optinfo.len() / 8);
        }
    }
});
