//! A peer that overruns its credits, against a real `rpcrdmad` (R8166-3.3.1-b): from the test
//! process, a bare queue pair on the soft provider over TCP connects to the daemon's listener
//! and sends more calls than the daemon granted, all at once. The daemon ends that connection
//! and nothing else: after several such peers, every send buffer and every buffer of the poll
//! threads' shared receive queues is back (`rpcrdmactl stats`), and a well-behaved client is
//! still answered. Before the engine gave the overrunning call's shared receive buffer back,
//! each such peer took one receive buffer from its poll thread for good.
#![forbid(unsafe_code)]

mod common;

use common::{back_to, config, eventually, free_port, settled, tmpdir, Daemon};
use rpcrdma_dataplane::rpcmsg;
use rpcrdma_proto::cm::PrivateData;
use rpcrdma_verbs::conformance::Side;
use rpcrdma_verbs::soft::{SoftConfig, SoftProvider};
use rpcrdma_verbs::{CmEvent, ConnParams, Provider, QpInit, SendOp};
use std::time::{Duration, Instant};

/// Credits the daemon grants in this test: a burst of `BURST` calls overruns them.
const CREDITS: u32 = 2;
const BURST: u32 = 12;
/// Rounds of overrunning peers.
const ROUNDS: u32 = 3;

fn be(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_be_bytes()).collect()
}

/// One overrunning peer: connects, posts receives, sends `BURST` calls back to back without
/// waiting for a reply, and waits until the daemon disconnects it.
fn overrun(port: u16) {
    let mut h = Side::new(SoftProvider::tcp(SoftConfig::default()).expect("soft provider"));
    let qp =
        h.p.create_qp(&QpInit {
            pd: h.pd,
            send_cq: h.cq,
            recv_cq: h.cq,
            srq: None,
            max_send_wr: 64,
            max_recv_wr: 64,
            max_sge: 1,
        })
        .expect("qp");
    h.qps.push(qp);
    for k in 0..16u64 {
        let sge = h.sge(4096 * (k as usize + 1), 4096);
        h.p.post_recv(qp, 1000 + k, &[sge]).expect("recv");
    }
    let private = PrivateData {
        remote_invalidate: false,
        send_size: 4096,
        recv_size: 4096,
    }
    .normalized()
    .emit();
    let params = ConnParams {
        private_data: &private,
        responder_resources: 8,
        initiator_depth: 8,
    };
    let addr = format!("127.0.0.1:{port}").parse().expect("addr");
    h.p.connect(qp, addr, &params).expect("connect");
    let start = Instant::now();
    let mut up = false;
    while !up {
        while let Some(e) = h.p.poll_cm() {
            up |= matches!(e, CmEvent::Established { .. });
        }
        assert!(start.elapsed() < Duration::from_secs(20), "never connected");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Calls to a program nobody serves, each in its own send buffer, all posted at once.
    for x in 0..BURST {
        let mut m = be(&[x + 1, 1, 32, 0, 0, 0, 0]);
        m.extend(rpcmsg::call_header(x + 1, 0x4000_0000, 1, 1));
        let off = 4096 * (17 + x as usize);
        h.fill(off, &m);
        let sge = h.sge(off, m.len());
        h.post(u64::from(x), SendOp::Send, &[sge], true);
    }
    let start = Instant::now();
    loop {
        let gone =
            std::iter::from_fn(|| h.p.poll_cm()).any(|e| matches!(e, CmEvent::Disconnected { .. }));
        if gone {
            break;
        }
        let mut w = [rpcrdma_verbs::WorkCompletion::default(); 16];
        let _ = h.p.poll_cq(h.cq, &mut w);
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the daemon kept a connection that overran its credits"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_peer_overrunning_its_credits_loses_its_connection_and_no_buffer() {
    let dir = tmpdir("hostile-peer");
    let port = free_port();
    let text = config(
        &dir,
        port,
        None,
        &format!("[transport]\ncredits = {CREDITS}\n"),
    );
    let d = Daemon::start_with(dir, port, &text);
    let base = settled(&d);
    for _ in 0..ROUNDS {
        overrun(port);
    }
    // The engine ended each for the overrun (logged at debug, the test daemons' level).
    let said = eventually(20, || {
        (d.log().matches("CreditOverrun").count() >= ROUNDS as usize).then_some(())
    });
    assert!(said.is_some(), "{}", d.log());
    back_to(&d, &base, 30);
    // A well-behaved client is still served: the daemon talking to itself through its listener.
    let dir2 = tmpdir("hostile-peer-client");
    let port2 = free_port();
    let client = Daemon::start_with(
        dir2.clone(),
        port2,
        &config(&dir2, port2, Some(("srv", port)), ""),
    );
    client.wait_peer_up("srv");
    let mut c = rpcrdma_shm::Client::connect(&client.app).expect("attach");
    let peer = c.peer("srv").expect("peer");
    common::null_unserved(&mut c, peer, Some(Duration::from_secs(20)));
}
