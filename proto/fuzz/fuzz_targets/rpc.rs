//! The RPC call header: never panics, and the fixed-layout read of AUTH_NONE calls gives what
//! the general decoder gives; a header that parses re-parses the same from its own bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcrdma_proto::rpc::{msg_type, CallHeader};

fuzz_target!(|data: &[u8]| {
    let _ = msg_type(data);
    let fast = CallHeader::parse(data);
    assert_eq!(fast, CallHeader::parse_general(data));
    if let Ok(h) = fast {
        assert!(h.args_offset <= data.len());
        assert_eq!(CallHeader::parse(&data[..h.args_offset]), Ok(h));
    }
});
