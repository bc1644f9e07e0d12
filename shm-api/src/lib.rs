//! The application ABI: shared-memory rings, arena, client and server libraries.
//!
//! The layout and protocol are specified in `ABI.md`; [`abi`] holds the `#[repr(C)]` types, [`ring`] the
//! SPSC ring protocol, `daemon` the daemon-side attach/validate/complete API and `client` the app libraries.

pub mod ring;
mod sync;

pub use sync::Slot;
