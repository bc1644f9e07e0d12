//! The RPC-over-RDMA wire: XDR primitives, version 1 (RFC 8166), version 2
//! (draft-cel-nfsv4-rpcrdma-version-two-01), the transport-characteristics extension
//! (draft-dnoveck-nfsv4-rpcrdma-xcharext-02) and RDMA-CM private data (RFC 8797).
#![forbid(unsafe_code)]
