//! The rpcrdmad TOML configuration: schema, defaults, validation.
#![forbid(unsafe_code)]
