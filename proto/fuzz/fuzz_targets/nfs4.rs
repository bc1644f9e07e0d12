//! The NFSv4 COMPOUND walk: never panics on any bytes, an item it finds lies within them,
//! and asking for a found item by its position finds the same item.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcrdma_proto::nfs4;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(first)) = nfs4::argument(data, |_| true) {
        assert!(first.position as usize <= data.len());
        let again = nfs4::argument(data, |it| it.position == first.position);
        assert_eq!(again, Ok(Some(first)));
    }
    // Every item declined: the walk steps over each one's data and goes on to the end.
    let _ = nfs4::argument(data, |_| false);
    if let Ok(Some(item)) = nfs4::result(data) {
        assert!(item.position as usize <= data.len());
    }
});
