//! The RDMA provider boundary and its providers (`soft`: user-space iWARP; `ibv`: rdma-core).
