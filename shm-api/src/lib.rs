//! The application ABI: shared-memory rings, arena, client and server libraries.
//!
//! The layout and protocol are specified in `ABI.md`; [`abi`] holds the `#[repr(C)]` types, [`ring`] the
//! SPSC ring protocol, `daemon` the daemon-side attach/validate/complete API and `client` the app libraries.

pub mod ring;
mod sync;

pub use sync::Slot;
pub mod abi;
#[cfg(not(loom))]
pub mod attach;
#[cfg(not(loom))]
pub mod client;
#[cfg(not(loom))]
pub mod daemon;
#[cfg(not(loom))]
pub mod region;
#[cfg(not(loom))]
pub use client::{Client, Server};
#[cfg(not(loom))]
pub mod loopback;
#[cfg(not(loom))]
pub mod rdmatest;
