//! An app table with a well-behaved app and a hostile one (`rpcrdma_shm::script`): descriptors
//! of every field's choosing, arena and ring-index scribbles, completions left to pile up,
//! detaches of every kind, against a daemon that completes calls with any outcome. Fails if
//! the good app's submissions are not taken as written and completed exactly once with the
//! daemon's outcome, if the hostile app's calls are misreported at its detach, or if the
//! table owes completions beyond the rings or keeps anything once both apps are gone.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcrdma_shm::script;

fuzz_target!(|data: &[u8]| script::run(data));
