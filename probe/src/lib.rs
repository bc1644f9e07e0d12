//! NFSv3 probe for rpcrdmad (issue 8 item 2): MOUNT v3 over TCP for the root handle, then NFSv3
//! (RFC 1813) through the daemon's shared-memory API, so that every call crosses RPC-over-RDMA.
//!
//! - [`xdr`]: bounds-checked XDR reader and writer; [`nfs3`]: the NFSv3 types and procedures used.
//! - [`tcprpc`]: ONC RPC over TCP (record marking) for PORTMAP GETPORT and MOUNT MNT.
//! - [`nfs`]: NFSv3 calls through `rpcrdma_shm::Client`; [`probe`]: the timed PASS/FAIL steps.
//! - [`miniserver`]: an in-memory NFSv3 subset and MOUNT responder for runs without a kernel server.
#![forbid(unsafe_code)]

pub mod callback;
pub mod miniserver;
pub mod nfs;
pub mod nfs3;
pub mod nfs4;
pub mod probe;
pub mod tcprpc;
pub mod xdr;
