//! The provider conformance suite on the soft provider over the in-memory fabric.

use std::net::SocketAddr;

use rpcrdma_verbs::conformance::Harness;
use rpcrdma_verbs::soft::link::MemFabric;
use rpcrdma_verbs::soft::{SoftConfig, SoftMem, SoftProvider};

struct Mem {
    cfg: SoftConfig,
}

impl Harness for Mem {
    type P = SoftMem;
    fn pair(&mut self) -> (SoftMem, SoftMem) {
        let f = MemFabric::new();
        (
            SoftProvider::memory(&f, self.cfg),
            SoftProvider::memory(&f, self.cfg),
        )
    }
    fn listen_addr(&self) -> SocketAddr {
        "10.0.0.1:20049".parse().unwrap()
    }
}

mod crc_on {
    use super::*;
    rpcrdma_verbs::conformance_tests!(Mem {
        cfg: SoftConfig::default()
    });
}

/// Small FPDUs, no CRC, MPA revision 1: segmentation and reassembly everywhere.
mod small_fpdu_rev1 {
    use super::*;
    rpcrdma_verbs::conformance_tests!(Mem {
        cfg: SoftConfig {
            crc: false,
            mpa_revision: 1,
            fpdu_size: Some(256),
            ..SoftConfig::default()
        }
    });
}

/// iWARP's answer to a Send that finds the shared receive queue empty, whoever emptied it (see
/// `dataplane/README.md`, "What the shared receive queue cannot promise on iWARP").
#[test]
fn shared_receive_queue_emptied_by_one_connection_ends_the_next_sender() {
    rpcrdma_verbs::conformance::shared_receive_queue_emptied_by_one_connection_ends_the_next_sender(
        &mut Mem {
            cfg: SoftConfig::default(),
        },
    );
}

/// The same burst against receive queues of their own ends only the connection that sent it.
#[test]
fn receive_queues_of_their_own_contain_a_burst() {
    rpcrdma_verbs::conformance::receive_queues_of_their_own_contain_a_burst(&mut Mem {
        cfg: SoftConfig::default(),
    });
}

/// Polled only on news (a parked poll thread's way), every transfer completes.
#[test]
fn a_side_polled_only_on_news_completes_every_transfer() {
    rpcrdma_verbs::conformance::a_side_polled_only_on_news_completes_every_transfer(&mut Mem {
        cfg: SoftConfig::default(),
    });
}

/// Idle connections cost a poll nothing.
#[test]
fn idle_connections_cost_a_poll_nothing() {
    rpcrdma_verbs::conformance::idle_connections_cost_a_poll_nothing(
        &mut Mem {
            cfg: SoftConfig::default(),
        },
        |p| p.visits(),
    );
}
