//! Two engines in a scripted session (`conn::script`): calls of every kind in both
//! directions, an app that answers, rejects or botches, a hostile peer injecting messages,
//! control changes, provider faults and closes. Fails if an engine panics, a call or a
//! served call does not end exactly once, or a shared buffer is lost.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcrdma_dataplane::conn::script;

fuzz_target!(|data: &[u8]| script::run(data));
