//! The RPC-over-RDMA engine (sans-IO per-connection state machine) and the pinned poll loop.
#![forbid(unsafe_code)]
pub mod poll;
