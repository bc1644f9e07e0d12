//! The provider conformance suite on the rdma-core provider over a real device. It needs an
//! RDMA device: `tests/vm/run` runs it inside a VM on rxe0 and siw0, naming the device and the
//! address of its interface in `RPCRDMA_IBV_DEVICE` and `RPCRDMA_IBV_ADDR`, and the exposure
//! mechanism in `RPCRDMA_IBV_EXPOSURE` (`mw`, `mr`, default automatic). Without a device every
//! test fails (this suite never passes by skipping).
#![cfg(feature = "ibv")]

use std::net::{IpAddr, SocketAddr};

use rpcrdma_verbs::conformance::Harness;
use rpcrdma_verbs::ibv::{Exposure, IbvConfig, IbvProvider};

struct Ibv {
    device: String,
    addr: IpAddr,
    exposure: Exposure,
}

fn harness() -> Ibv {
    let device = std::env::var("RPCRDMA_IBV_DEVICE")
        .expect("RPCRDMA_IBV_DEVICE names the RDMA device (this suite runs in tests/vm/run)");
    let addr = std::env::var("RPCRDMA_IBV_ADDR")
        .expect("RPCRDMA_IBV_ADDR is the device's IP address")
        .parse()
        .expect("RPCRDMA_IBV_ADDR is an IP address");
    let exposure = match std::env::var("RPCRDMA_IBV_EXPOSURE").as_deref() {
        Ok("mw") => Exposure::MemoryWindow,
        Ok("mr") => Exposure::RegionPerExposure,
        Ok("auto") | Err(_) => Exposure::Auto,
        Ok(other) => panic!("RPCRDMA_IBV_EXPOSURE={other}: want mw, mr or auto"),
    };
    Ibv {
        device,
        addr,
        exposure,
    }
}

impl Harness for Ibv {
    type P = IbvProvider;
    fn pair(&mut self) -> (IbvProvider, IbvProvider) {
        let open = || {
            IbvProvider::open(IbvConfig {
                device: Some(self.device.clone()),
                // The suite checks private data byte for byte; IB CM pads it with zeros.
                strip_cm_padding: true,
                exposure: self.exposure,
                ..IbvConfig::default()
            })
            .unwrap_or_else(|e| panic!("open {}: {e}", self.device))
        };
        (open(), open())
    }
    fn listen_addr(&self) -> SocketAddr {
        SocketAddr::new(self.addr, 0)
    }
}

rpcrdma_verbs::conformance_tests!(harness(), event_fd);

/// A completion queue overrun (an asynchronous event of the device) ends the connections on
/// that CQ only.
#[test]
fn cq_overrun_ends_the_connections_on_that_cq() {
    rpcrdma_verbs::conformance::cq_overrun_ends_the_connections_on_that_cq(&mut harness());
}
