//! Two `Driver`s on the soft provider's in-memory fabric and a raw hostile peer
//! (`rpcrdma_dataplane::drive`): calls of every transfer mode, an echo server, and a peer
//! sending raw, plausible and altered messages, RDMA Reads and Writes under keys it saw or
//! guessed, and disconnects. Fails if a call or served call does not end exactly once, the
//! honest connection is hurt, or a buffer does not come back to its pool.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcrdma_dataplane::drive;

fuzz_target!(|data: &[u8]| drive::run(data));
