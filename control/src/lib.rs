//! The control plane: connection manager, transport-characteristic policy, admin socket, metrics.
#![forbid(unsafe_code)]
