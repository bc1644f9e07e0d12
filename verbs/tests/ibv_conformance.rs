//! The provider conformance suite on the rdma-core provider over a real device. It needs an
//! RDMA device: `tests/vm/run` runs it inside a VM on rxe0 and siw0, naming the device and the
//! address of its interface in `RPCRDMA_IBV_DEVICE` and `RPCRDMA_IBV_ADDR`, and the exposure
//! mechanism in `RPCRDMA_IBV_EXPOSURE` (`mw`, `mr`, default automatic). Without a device every
//! test fails (this suite never passes by skipping).
#![cfg(feature = "ibv")]

use std::net::{IpAddr, SocketAddr};

use rpcrdma_verbs::conformance::Harness;
use rpcrdma_verbs::ibv::{Exposure, IbvConfig, IbvProvider, SrqTeardown};

struct Ibv {
    device: String,
    addr: IpAddr,
    exposure: Exposure,
    srq_teardown: SrqTeardown,
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
        srq_teardown: SrqTeardown::Auto,
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
                srq_teardown: self.srq_teardown,
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

/// How hardware lets a destroyed queue pair on a shared receive queue go ([`SrqTeardown`]'s
/// `Auto` off rxe and siw; forced here): it is kept, its handle gone, while its receives are
/// reported under its name; after Last WQE Reached (rxe and siw never raise it: simulated) a
/// marker goes behind them, never reported, and the queue pair goes once it completes (iWARP
/// takes no marker: at the event). One whose event never comes goes after `RETIRE_WAIT`,
/// counted in `retire_timeouts`.
#[test]
fn a_destroyed_queue_pair_on_a_shared_receive_queue_is_kept_until_the_device_is_done() {
    use rpcrdma_verbs::{Provider, SendOp, WcOpcode, WcStatus, WorkCompletion};
    use std::time::{Duration, Instant};
    let mut h = harness();
    h.srq_teardown = SrqTeardown::Wait;
    let mut p = rpcrdma_verbs::conformance::connect(&mut h, true);
    let qb = p.b.qp();
    for i in 0..4u64 {
        let s = [p.b.sge(i as usize * 256, 256)];
        p.b.recv(100 + i, &s);
    }
    for k in 0..2u64 {
        let s = [p.a.sge(0, 8)];
        p.a.post(k, SendOp::Send, &s, true);
    }
    // Both Sends acknowledged, `b`'s CQ not polled.
    let start = Instant::now();
    let mut wcs = [WorkCompletion::default(); 8];
    let mut acked = 0;
    while acked < 2 {
        acked += p.a.p.poll_cq(p.a.cq, &mut wcs).unwrap();
        while p.b.p.poll_cm().is_some() {}
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "sends not acknowledged"
        );
    }
    p.b.p.disconnect(qb).unwrap();
    p.b.p.destroy_qp(qb).unwrap();
    assert!(!p.b.p.qp_retired(qb), "kept");
    p.wait("its receives", |p| p.b.recvs_seen() >= 2);
    for w in p.b.wcs.iter().filter(|w| w.opcode == WcOpcode::Recv) {
        assert_eq!((w.qp, w.status), (qb, WcStatus::Success), "named after it");
    }
    assert!(!p.b.p.qp_retired(qb), "kept until its last receive");
    p.b.p.simulate_last_wqe_reached(qb);
    p.wait("the marker", |p| p.b.p.qp_retired(qb));
    p.settle();
    assert!(
        p.b.wcs.iter().all(|w| (100..104).contains(&w.wr_id)),
        "the marker is never reported: {:?}",
        p.b.wcs
    );
    let d = p.b.p.device_events();
    assert_eq!((d.last_wqe_reached, d.retire_timeouts), (1, 0));
    // A queue pair whose event never comes goes after RETIRE_WAIT.
    let init = p.b.qp_init();
    let lone = p.b.p.create_qp(&init).unwrap();
    p.b.p.destroy_qp(lone).unwrap();
    assert!(!p.b.p.qp_retired(lone) && p.b.p.busy());
    let start = Instant::now();
    while !p.b.p.qp_retired(lone) {
        // `RETIRE_WAIT` is watched by completion polls too.
        p.b.p.poll_cq(p.b.cq, &mut wcs).unwrap();
        assert!(start.elapsed() < Duration::from_secs(20), "never let go");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(p.b.p.device_events().retire_timeouts, 1);
}
