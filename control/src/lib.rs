//! The control plane of rpcrdmad: start-up checks, the control thread (admin socket, metrics,
//! signals, connection manager, reload) and the admin protocol shared with `rpcrdmactl`.
#![forbid(unsafe_code)]

pub mod admin;
pub mod clients;
pub mod daemon;
pub mod metrics;
pub mod reload;
pub mod startup;
pub mod table;
pub mod top;
pub mod xchar;
