//! Hostile peers against a real `rpcrdmad`.
//!
//! A host beyond a listener's admission rules (config/CONFIG.md, "Admission"): its connection
//! requests past `max-connections-per-host`, or from outside `allow`, are refused while
//! another host is served.
//!
//! A peer whose reply breaks the program's binding (R8166-6.1-d): a READ's result sent
//! inline although the daemon's call offered a Write chunk fails that call `BAD_REPLY`, and
//! the connection carries the next call.
//!
//! A peer that overruns its credits (R8166-3.3.1-b): from the test
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

/// RFC 8797 private data of a peer with 4 KiB buffers each way.
fn private_4k() -> [u8; rpcrdma_proto::cm::LEN] {
    PrivateData {
        remote_invalidate: false,
        send_size: 4096,
        recv_size: 4096,
    }
    .normalized()
    .emit()
}

/// Connection parameters carrying `private_data`, 8 RDMA Reads each way.
fn params(private_data: &[u8]) -> ConnParams<'_> {
    ConnParams {
        private_data,
        responder_resources: 8,
        initiator_depth: 8,
    }
}

type TcpSide = Side<SoftProvider<rpcrdma_verbs::soft::link::Tcp>>;

/// A soft provider on TCP in this process with one queue pair of `depth` work requests each
/// way (not connected yet).
fn bare_qp(depth: u32) -> (TcpSide, rpcrdma_verbs::QpId) {
    let mut h = Side::new(SoftProvider::tcp(SoftConfig::default()).expect("soft provider"));
    let qp =
        h.p.create_qp(&QpInit {
            pd: h.pd,
            send_cq: h.cq,
            recv_cq: h.cq,
            srq: None,
            max_send_wr: depth,
            max_recv_wr: depth,
            max_sge: 1,
        })
        .expect("qp");
    h.qps.push(qp);
    (h, qp)
}

/// One overrunning peer: connects, posts receives, sends `BURST` calls back to back without
/// waiting for a reply, and waits until the daemon disconnects it.
fn overrun(port: u16) {
    let (mut h, qp) = bare_qp(64);
    for k in 0..16u64 {
        let sge = h.sge(4096 * (k as usize + 1), 4096);
        h.p.post_recv(qp, 1000 + k, &[sge]).expect("recv");
    }
    let private = private_4k();
    let params = params(&private);
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

/// A server peer, raw verbs on the soft provider over TCP, listening on `port`: it accepts one
/// connection and answers two RDMATEST READs of `READ_LEN` bytes that offer a Write chunk.
/// The first gets its result inline (breaking R8166-6.1-d), the chunk echoed unused; the
/// second the right way, the result written into the chunk. Returns the connections it
/// accepted once `stop` says so.
fn binding_breaker(port: u16, stop: std::sync::mpsc::Receiver<()>) -> u32 {
    use rpcrdma_proto::{decode, v1, Limits, Message};
    let mut h = Side::new(SoftProvider::tcp(SoftConfig::default()).expect("soft provider"));
    let addr = format!("127.0.0.1:{port}").parse().expect("addr");
    h.p.listen(addr).expect("listen");
    let private = private_4k();
    let params = params(&private);
    let (mut accepted, mut answered) = (0u32, 0u32);
    let mut wcs = [rpcrdma_verbs::WorkCompletion::default(); 16];
    let start = Instant::now();
    // Until told, or until the test is gone.
    while let Err(std::sync::mpsc::TryRecvError::Empty) = stop.try_recv() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never told to stop"
        );
        while let Some(e) = h.p.poll_cm() {
            if let CmEvent::ConnectRequest { req, .. } = e {
                let qp = h.p.create_qp(&h.qp_init()).expect("qp");
                h.qps.push(qp);
                for k in 0..16u64 {
                    let sge = h.sge(4096 * k as usize, 4096);
                    h.recv(k, &[sge]);
                }
                h.p.accept(req, qp, &params).expect("accept");
                accepted += 1;
            }
        }
        let n = h.p.poll_cq(h.cq, &mut wcs).expect("poll_cq");
        for wc in &wcs[..n] {
            if wc.wr_id >= 16 {
                continue; // a Send's completion
            }
            let off = 4096 * wc.wr_id as usize;
            let msg = h.mem(off, wc.byte_len as usize).to_vec();
            let Ok(d) = decode(&msg, &Limits::DEFAULT) else {
                continue;
            };
            let Message::V1(v1::Header {
                xid,
                body: v1::Body::Msg(c),
                ..
            }) = d.message
            else {
                continue;
            };
            let seg = c
                .writes
                .iter()
                .next()
                .expect("a Write chunk")
                .segments()
                .next()
                .expect("a segment");
            let data = read_data();
            let inline = answered == 0;
            let used = if inline { 0 } else { READ_LEN };
            let mut r = be(&[xid, 1, 2, 0, 0, 1, 1, seg.handle, used]);
            r.extend(seg.offset.to_be_bytes());
            r.extend(be(&[0, 0]));
            r.extend(rpcmsg::reply_header(xid, 0));
            r.extend(be(&[READ_LEN]));
            let out = 16 * 4096 + 8192 * (answered as usize % 8);
            if inline {
                r.extend(&data);
            } else {
                h.fill(out + 4096, &data);
                let sge = h.sge(out + 4096, data.len());
                let op = SendOp::RdmaWrite {
                    remote_addr: seg.offset,
                    rkey: seg.handle,
                };
                h.post(100, op, &[sge], false);
            }
            h.fill(out, &r);
            let sge = h.sge(out, r.len());
            h.post(200 + u64::from(answered), SendOp::Send, &[sge], true);
            answered += 1;
            let again = h.sge(off, 4096);
            h.recv(wc.wr_id, &[again]);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    accepted
}

/// Bytes each READ of `a_peer_whose_reply_breaks_the_binding_fails_that_call_only` asks for.
const READ_LEN: u32 = 2000;

/// The result `binding_breaker` answers each READ with.
fn read_data() -> Vec<u8> {
    (0..READ_LEN).map(|i| (i * 7 + 3) as u8).collect()
}

#[test]
fn a_peer_whose_reply_breaks_the_binding_fails_that_call_only() {
    use rpcrdma_shm::abi::status;
    use rpcrdma_shm::rdmatest;
    // R8166-6.1-d through a real daemon: its app's READ offers a Write chunk and the peer
    // sends the result inline. The call fails BAD_REPLY (permanent); the connection stays and
    // the next READ, answered the right way, succeeds on it.
    let hport = free_port();
    let (tell, stop) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || binding_breaker(hport, stop));
    let dir = tmpdir("bad-reply");
    let (port, mport) = (free_port(), free_port());
    let text = config(&dir, port, Some(("srv", hport)), "").replace(
        "log-level",
        &format!("metrics-listen = \"127.0.0.1:{mport}\"\nlog-level"),
    );
    let d = Daemon::start_with(dir, port, &text);
    d.wait_peer_up("srv");
    let mut c = rpcrdma_shm::Client::connect(&d.app).expect("attach");
    let peer = c.peer("srv").expect("peer");
    let read = |c: &mut rpcrdma_shm::Client| {
        let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::READ);
        call.args().put_u32(READ_LEN).put_u32(1);
        call.result_buffer(READ_LEN);
        let t = call.submit().expect("submit");
        c.wait(t, Some(Duration::from_secs(20)))
    };
    match read(&mut c) {
        Err(rpcrdma_shm::client::Error::Status(s)) => assert_eq!(status::name(s), "BAD_REPLY"),
        other => panic!("{:?}", other.map(|r| (r.accept_stat, r.ddp_bytes))),
    }
    let r = read(&mut c).expect("the second READ");
    assert_eq!(r.body, common::xdr_opaque(&read_data()));
    assert_eq!(r.ddp_bytes, READ_LEN);
    // Operators see it: one bad reply and one protocol error on that connection.
    let s = d.ctl_json(&["stats"]);
    let conn = &s["conns"][0];
    assert_eq!(
        (
            conn["bad-replies"].as_u64(),
            conn["protocol-errors"].as_u64()
        ),
        (Some(1), Some(1)),
        "{s}"
    );
    let (_, body) = common::scrape_response(mport, None);
    assert!(
        body.lines()
            .any(|l| l.starts_with("rpcrdmad_conn_bad_replies_total{")
                && l.contains("peer=\"srv\"")
                && l.ends_with(" 1")),
        "{body}"
    );
    tell.send(()).expect("stop");
    assert_eq!(
        server.join().expect("server"),
        1,
        "one connection all along"
    );
}

/// How a bare connection attempt ended.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    Up,
    /// An MPA reject: refused at the request.
    Refused,
    /// The stream closed before any answer: refused at TCP accept (`allow`).
    Closed,
}

/// A bare queue pair on the soft provider connecting from this host to `addr`: kept while up
/// (dropping the `Side` closes its TCP stream, which ends the connection at the daemon).
fn attempt(addr: &str) -> (TcpSide, Attempt) {
    let (mut h, qp) = bare_qp(8);
    let private = private_4k();
    h.p.connect(qp, addr.parse().expect("addr"), &params(&private))
        .expect("connect");
    let start = Instant::now();
    loop {
        match h.p.poll_cm() {
            Some(CmEvent::Established { .. }) => return (h, Attempt::Up),
            Some(CmEvent::Rejected { .. }) => return (h, Attempt::Refused),
            Some(CmEvent::ConnectError { .. }) => return (h, Attempt::Closed),
            Some(other) => panic!("connecting to {addr}: {other:?}"),
            None => {}
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no answer from {addr}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The poll threads of the daemon's connections, in order.
fn conn_threads(d: &Daemon) -> Vec<u64> {
    let mut on: Vec<u64> = d
        .ctl_json(&["conns"])
        .as_array()
        .expect("conns")
        .iter()
        .filter_map(|c| c["thread"].as_u64())
        .collect();
    on.sort_unstable();
    on
}

/// The daemon's first listener, from `stats`: connections it holds, requests admitted, and
/// refused for the host's limit and for not being allowed.
fn listener(d: &Daemon) -> (u64, u64, u64, u64) {
    let s = d.ctl_json(&["stats"]);
    let l = &s["listeners"][0];
    let n = |k: &str| {
        l.pointer(&format!("/{k}"))
            .and_then(serde_json::Value::as_u64)
            .unwrap_or_else(|| panic!("{k}: {s}"))
    };
    (
        n("connections"),
        n("admitted"),
        n("connects-refused/host-limit"),
        n("connects-refused/not-allowed"),
    )
}

/// The daemon's refused connection requests, summed over its poll threads, by reason.
fn refused(d: &Daemon, reason: &str) -> u64 {
    common::thread_sum(
        &d.ctl_json(&["stats"]),
        &format!("connects-refused/{reason}"),
    )
}

/// A listener's admission rules (config/CONFIG.md, "Admission"), on a dual-stack listener so
/// that the test has two hosts: 127.0.0.1 (seen as `::ffff:127.0.0.1`) and `::1`. The first
/// host opens connections up to `max-connections-per-host` and its next is refused (an MPA
/// reject, before any queue pair is made); the other host, a daemon whose peer is this
/// listener, is served all along; a connection that ends gives its host its place back; a
/// reload narrowing `allow` to `::1` refuses the first host from then on and leaves the
/// connection up alone. Each refusal is counted by reason and logged.
#[test]
fn a_host_beyond_its_listeners_rules_is_refused_and_another_host_is_served() {
    let dir = tmpdir("admission");
    let (port, mport) = (free_port(), free_port());
    let text = config(&dir, port, None, "")
        .replace(
            &format!("address = \"127.0.0.1:{port}\"\n"),
            &format!("address = \"[::]:{port}\"\nmax-connections-per-host = 2\n"),
        )
        .replace(
            "log-level",
            &format!("metrics-listen = \"127.0.0.1:{mport}\"\nlog-level"),
        );
    assert!(text.contains("[::]"), "{text}");
    let d = Daemon::start_with(dir, port, &text);
    let v4 = format!("127.0.0.1:{port}");
    let (_first, a1) = attempt(&v4);
    let (second, a2) = attempt(&v4);
    let (_third, a3) = attempt(&v4);
    assert_eq!((a1, a2, a3), (Attempt::Up, Attempt::Up, Attempt::Refused));
    assert_eq!(refused(&d, "host-limit"), 1);
    assert_eq!(listener(&d), (2, 2, 1, 0));
    let (_, m) = common::scrape_response(mport, Some(Duration::from_secs(10)));
    let l = format!("listener=\"[::]:{port}\"");
    assert!(
        m.contains("rpcrdmad_connects_refused_total{reason=\"host-limit\"} 1\n")
            && m.contains("rpcrdmad_connects_refused_total{reason=\"full\"} 0\n")
            && m.contains(&format!(
                "rpcrdmad_listener_connects_refused_total{{{l},reason=\"host-limit\"}} 1\n"
            ))
            && m.contains(&format!("rpcrdmad_listener_connections{{{l}}} 2\n"))
            && m.contains(&format!(
                "rpcrdmad_listener_connects_admitted_total{{{l}}} 2\n"
            )),
        "{m}"
    );
    let logged = eventually(10, || {
        d.log()
            .contains("connection refused: the host holds its most connections")
            .then_some(())
    });
    assert!(logged.is_some(), "{}", d.log());

    // Another host (::1): a daemon whose peer is this listener, and its calls, are served.
    let dir2 = tmpdir("admission-client");
    let port2 = free_port();
    let client_text = config(&dir2, port2, Some(("srv", port)), "").replace(
        &format!("address = \"127.0.0.1:{port}\"\nreconnect"),
        &format!("address = \"[::1]:{port}\"\nreconnect"),
    );
    assert!(client_text.contains("[::1]"), "{client_text}");
    let client = Daemon::start_with(dir2, port2, &client_text);
    client.wait_peer_up("srv");
    let mut c = rpcrdma_shm::Client::connect(&client.app).expect("attach");
    let peer = c.peer("srv").expect("peer");
    common::null_unserved(&mut c, peer, Some(Duration::from_secs(20)));
    let remotes: Vec<String> = d
        .ctl_json(&["conns"])
        .as_array()
        .expect("conns")
        .iter()
        .filter_map(|c| c["remote"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(remotes.len(), 3, "{remotes:?}");
    assert_eq!(remotes.iter().filter(|r| r.starts_with("[::1]")).count(), 1);

    // The first host's ended connection gives its place back. The second lives on poll
    // thread 1 (`spread`: the listener's thread 0 held the first), so its place goes back to
    // the listener's thread as a message.
    let on = conn_threads(&d);
    assert!(on.contains(&1), "{on:?}");
    assert_eq!(listener(&d), (3, 3, 1, 0));
    drop(second);
    let released = eventually(20, || (listener(&d).0 == 2).then_some(()));
    assert!(released.is_some(), "{:?}", listener(&d));
    let freed = eventually(20, || {
        let (h, a) = attempt(&v4);
        (a == Attempt::Up).then_some(h)
    });
    assert!(freed.is_some(), "{}", d.log());

    // A reload narrowing the allow list refuses 127.0.0.1 from then on; ::1 stays up.
    let narrowed = text.replace(
        "max-connections-per-host = 2\n",
        "max-connections-per-host = 2\nallow = [\"::1\"]\n",
    );
    std::fs::write(&d.config, narrowed).expect("write");
    let r = d.ctl_json(&["reload"]);
    assert_eq!(r["applied"][0], "listeners[0].allow", "{r}");
    // The soft provider applies the list as it accepts the TCP stream: closed before its MPA
    // Request is even read.
    let before = refused(&d, "not-allowed");
    let (_h, a) = attempt(&v4);
    assert_eq!(a, Attempt::Closed);
    let counted = eventually(10, || {
        (refused(&d, "not-allowed") == before + 1).then_some(())
    });
    assert!(counted.is_some(), "{}", d.log());
    assert_eq!(listener(&d).3, 1, "the listener counts it too");
    common::null_unserved(&mut c, peer, Some(Duration::from_secs(20)));
    let m = String::from_utf8_lossy(&d.ctl(&["stats"]).stdout).into_owned();
    assert!(m.contains("CONNS-REFUSED"), "{m}");
    assert!(
        m.contains(&format!("[::]:{port}")) && m.contains("NOT-ALLOWED"),
        "{m}"
    );
}

/// A request when no poll thread has a free connection slot is refused at once (it was,
/// before, uncounted and unlogged) and counted as `full`. With one slot per thread, the
/// listener's thread takes the first connection and hands the second to the other thread
/// (`listeners[].spread`); the third finds no room anywhere.
#[test]
fn a_request_beyond_the_threads_connection_slots_is_refused_and_counted() {
    let dir = tmpdir("admission-full");
    let port = free_port();
    let text = config(&dir, port, None, "").replace("connections = 4\n", "connections = 1\n");
    assert!(text.contains("connections = 1\n"), "{text}");
    let d = Daemon::start_with(dir, port, &text);
    let v4 = format!("127.0.0.1:{port}");
    let (_first, a1) = attempt(&v4);
    let (_second, a2) = attempt(&v4);
    let (_third, a3) = attempt(&v4);
    assert_eq!((a1, a2, a3), (Attempt::Up, Attempt::Up, Attempt::Refused));
    assert_eq!(conn_threads(&d), [0, 1]);
    assert_eq!(refused(&d, "full"), 1);
    let l = &d.ctl_json(&["stats"])["listeners"][0];
    assert_eq!(
        (
            &l["connections"],
            &l["admitted"],
            &l["connects-refused"]["full"]
        ),
        (&2.into(), &3.into(), &1.into()),
        "{l}"
    );
    assert_eq!(refused(&d, "host-limit"), 0);
    let logged = eventually(10, || {
        d.log()
            .contains("connection refused: no free connection slot")
            .then_some(())
    });
    assert!(logged.is_some(), "{}", d.log());
}

/// `provider.soft.max-pending` reaches the soft provider: with it at 2, two silent TCP
/// connections to the listener hold both places, and a third stream's MPA Request is not read
/// (it waits in the listen backlog) until one of the silent ones goes; then it is answered.
#[test]
fn soft_max_pending_bounds_the_streams_waiting_for_their_mpa_request() {
    use std::io::{Read, Write};
    let dir = tmpdir("max-pending");
    let port = free_port();
    let text = config(&dir, port, None, "").replace(
        "[provider]\nkind = \"soft\"\n",
        "[provider]\nkind = \"soft\"\n[provider.soft]\nmax-pending = 2\n",
    );
    assert!(text.contains("max-pending = 2"), "{text}");
    let d = Daemon::start_with(dir, port, &text);
    let addr = format!("127.0.0.1:{port}");
    let connect = || std::net::TcpStream::connect(&addr).expect("connect");
    let (first, _second) = (connect(), connect());
    std::thread::sleep(Duration::from_millis(300));
    let mut third = connect();
    let mut req = Vec::new();
    rpcrdma_verbs::soft::wire::emit_mpa(&mut req, false, 0, 2, Some((16, 16)), &private_4k());
    third.write_all(&req).expect("request");
    third
        .set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    let mut reply = [0u8; 20];
    assert!(
        third.read_exact(&mut reply).is_err(),
        "a stream beyond max-pending was answered:\n{}",
        d.log()
    );
    drop(first);
    third
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    third
        .read_exact(&mut reply)
        .expect("the MPA Reply once a place freed");
    assert_eq!(&reply[..16], &rpcrdma_verbs::soft::wire::MPA_REP_KEY[..]);
}
