//! The application ABI of rpcrdmad: shared-memory rings, arena, client and server libraries.
//!
//! `ABI.md` (next to this crate's `Cargo.toml`) specifies the region layout, memory ordering and error
//! codes. The modules:
//!
//! - [`abi`]: the `#[repr(C)]` header, descriptors (`Sqe`, `Cqe`, 64 bytes each), piece records, opcodes,
//!   flags and status codes; [`ring`]: the SPSC ring protocol (loom-checked under `--cfg loom`).
//! - `region`: the sealed memfd mapping; `attach`: the Unix-socket handshake (`SCM_RIGHTS`) and wake-ups.
//! - `daemon`: what a poll thread uses — an `AppTable` of attached apps, validated `Submission`s,
//!   completions, receive buffers of serving apps, detach/reap/evict, parking, and what operators
//!   see of each app (`app_info`).
//! - `client`: the app libraries — `Client` (calls, tickets, wait/poll/iterate, arena allocator) and
//!   `Server` (`serve(prog, vers, handler)`, or `next_call` and `answer` to answer a call later),
//!   both also usable from the app's own event loop (`AsFd`, `arm`, `Server::serve_ready`);
//!   `include/rpcrdma.h` is the C binding (examples in `examples/c/`).
//! - `async_client` and `async_server` (feature `tokio`): `AsyncClient` and `AsyncServer`, whose
//!   waits park a tokio task on the app's descriptor; `AsyncServer::next_call` hands calls to
//!   handlers that await, to be answered in any order.
//! - `rdmatest`: the RDMATEST program (spec/TESTPROG.md) for examples, tests and benchmarks.
//! - `loopback`: the `shm-loopback` test harness, which stands in for the dataplane's routing by handing
//!   each call to the local app serving its program.

pub mod abi;
pub mod ring;
mod sync;

pub use sync::Slot;

#[cfg(not(loom))]
pub mod attach;
#[cfg(not(loom))]
pub mod client;
#[cfg(not(loom))]
pub mod daemon;
#[cfg(not(loom))]
pub mod loopback;
#[cfg(not(loom))]
pub mod rdmatest;
#[cfg(not(loom))]
pub mod region;
#[cfg(all(not(loom), any(test, feature = "sim")))]
#[doc(hidden)]
pub mod script;

#[cfg(all(not(loom), feature = "tokio"))]
pub mod async_client;
#[cfg(all(not(loom), feature = "tokio"))]
pub mod async_server;
#[cfg(all(not(loom), feature = "tokio"))]
mod parked;

#[cfg(not(loom))]
pub use client::{Client, PendingCall, Server, WaitPolicy};
