//! Two real `rpcrdmad` processes on loopback (soft provider): an app calls through daemon A,
//! daemon B delivers to an RDMATEST server app.

mod common;

use common::{rdmatest_server, xdr_opaque, Daemon};
use rpcrdma_shm::rdmatest::{self, pattern};
use rpcrdma_shm::Client;
use std::time::Duration;

const T: Option<Duration> = Some(Duration::from_secs(20));

#[test]
fn null_and_echo_through_two_daemons() {
    let b = Daemon::start("echo-b", None);
    let a = Daemon::start("echo-a", Some(("server", b.port)));
    a.wait_peer_up("server");
    rdmatest_server(&b.app);

    let mut c = Client::connect(&a.app).expect("client attach");
    let peer = c
        .peer("server")
        .expect("peer table names the configured peer");

    let t = c
        .call(peer, rdmatest::PROG, 1, rdmatest::NULL)
        .submit()
        .expect("submit");
    let r = c.wait(t, T).expect("NULL reply");
    assert_eq!((r.accept_stat, r.body.len()), (0, 0));

    for len in [0usize, 1, 37, 1000, 3000] {
        let data = pattern(len as u32, len);
        let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
        call.args().put_opaque(&data);
        let t = call.submit().expect("submit");
        let r = c
            .wait(t, T)
            .unwrap_or_else(|e| panic!("ECHO {len}: {e:?}\nA:\n{}\nB:\n{}", a.log(), b.log()));
        assert_eq!(r.accept_stat, 0);
        assert_eq!(r.body, xdr_opaque(&data), "ECHO of {len} bytes");
    }

    // The requester's counters moved, seen through rpcrdmactl.
    let stats = a.ctl_json(&["stats"]);
    let conn = &stats["conns"][0];
    assert_eq!(conn["peer"], "server");
    assert_eq!(conn["calls-out"], 6);
    assert_eq!(conn["replies-in"], 6);
    let lat = a.ctl_json(&["latency"]);
    assert_eq!(lat[0]["count"], 6);
    let bstats = b.ctl_json(&["stats"]);
    assert_eq!(bstats["conns"][0]["calls-in"], 6);
    assert_eq!(bstats["conns"][0]["replies-out"], 6);
}

#[test]
fn large_echo_read_and_write_use_chunks_end_to_end() {
    let b = Daemon::start("chunks-b", None);
    let a = Daemon::start("chunks-a", Some(("server", b.port)));
    a.wait_peer_up("server");
    rdmatest_server(&b.app);
    let mut c = Client::connect(&a.app).expect("client attach");
    let peer = c.peer("server").expect("peer");

    // ECHO with a DDP-eligible argument (Read chunk) and a result buffer (Write chunk).
    let data = pattern(11, 9001);
    let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
    call.args().put_ddp_opaque(&data);
    call.result_buffer(16384);
    let t = call.submit().expect("submit");
    let r = c
        .wait(t, T)
        .unwrap_or_else(|e| panic!("{e:?}\nA:\n{}\nB:\n{}", a.log(), b.log()));
    assert_eq!(r.body, xdr_opaque(&data));
    assert_eq!(r.ddp_bytes, 9001);
    // The responder pulled the argument (RDMA Read) and pushed the result (RDMA Write).
    let s = b.ctl_json(&["stats"]);
    assert!(
        s["conns"][0]["rdma-read-bytes"].as_u64() >= Some(9001),
        "{s}"
    );
    assert!(
        s["conns"][0]["rdma-write-bytes"].as_u64() >= Some(9001),
        "{s}"
    );

    // READ into a result buffer (Write chunk).
    let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::READ);
    call.args().put_u32(50_000).put_u32(9);
    call.result_buffer(50_000);
    let t = call.submit().expect("submit");
    let r = c.wait(t, T).expect("READ");
    assert_eq!(r.body, xdr_opaque(&pattern(9, 50_000)));

    // WRITE with a large DDP argument (Read chunk); 10 bytes spoiled.
    let mut data = pattern(3, 30_000);
    for x in &mut data[100..110] {
        *x = !*x;
    }
    let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::WRITE);
    call.args().put_u32(3).put_ddp_opaque(&data);
    let t = call.submit().expect("submit");
    let r = c.wait(t, T).expect("WRITE");
    assert_eq!(r.body, 29_990u32.to_be_bytes());

    // A long inline ECHO (no DDP marks) larger than the inline threshold: Position-zero
    // Read chunk out, Reply chunk back.
    let data = pattern(5, 20_000);
    let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
    call.args().put_opaque(&data);
    call.max_reply(32_768);
    let t = call.submit().expect("submit");
    let r = c.wait(t, T).expect("long ECHO");
    assert_eq!(r.body, xdr_opaque(&data));
}
