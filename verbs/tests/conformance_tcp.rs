//! The provider conformance suite on the soft provider over real loopback TCP.

use std::net::SocketAddr;

use rpcrdma_verbs::conformance::Harness;
use rpcrdma_verbs::soft::{SoftConfig, SoftProvider, SoftTcp};

struct Tcp;

impl Harness for Tcp {
    type P = SoftTcp;
    fn pair(&mut self) -> (SoftTcp, SoftTcp) {
        (
            SoftProvider::tcp(SoftConfig::default()).unwrap(),
            SoftProvider::tcp(SoftConfig::default()).unwrap(),
        )
    }
    fn listen_addr(&self) -> SocketAddr {
        "127.0.0.1:0".parse().unwrap()
    }
}

rpcrdma_verbs::conformance_tests!(Tcp, event_fd);
