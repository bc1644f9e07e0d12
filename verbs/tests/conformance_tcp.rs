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

/// Polled only on news (a parked poll thread's way), every transfer completes.
#[test]
fn a_side_polled_only_on_news_completes_every_transfer() {
    rpcrdma_verbs::conformance::a_side_polled_only_on_news_completes_every_transfer(&mut Tcp);
}

/// Idle connections cost a poll nothing.
#[test]
fn idle_connections_cost_a_poll_nothing() {
    rpcrdma_verbs::conformance::idle_connections_cost_a_poll_nothing(&mut Tcp, |p| p.visits());
}
