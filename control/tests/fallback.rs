//! V2-5.2-b / AMB-33 through a real `rpcrdmad`: a version-2 daemon connects to a peer that,
//! like deployed version-1 servers (implementation-experience §4.6), drops version-two
//! messages silently. The first call ends once, with an error, when the configured
//! `transport.v2-first-message-timeout-ms` passes; the daemon marks the peer version-1-only,
//! reconnects speaking version 1, and the next call is answered. `rpcrdmactl peer retry-v2`
//! clears the mark and reconnects offering version 2.
//!
//! The peer runs in the test process on the soft provider over TCP: its first connection is
//! a bare queue pair with receives posted on a completion queue of its own, which the peer
//! reads and never answers; later connections are served by a version-1 `Driver` (RDMATEST
//! NULL).
//!
//! The same peer, as a version-2 `Driver` that answers calls but never the optional messages
//! (xcharext unsupported), shows `rpcrdmactl xchar request` giving up after its wait, while the
//! daemon's control loop keeps answering other admin requests.
#![forbid(unsafe_code)]

mod common;

use common::Daemon;
use rpcrdma_dataplane::{
    Accepted, ConnId, ConnTemplate, Driver, Event, MemRef, Memory, ReplySpec, Role,
};
use rpcrdma_proto::cm::PrivateData;
use rpcrdma_shm::rdmatest;
use rpcrdma_shm::Client;
use rpcrdma_verbs::conformance::{Side, GUARD};
use rpcrdma_verbs::soft::{SoftConfig, SoftProvider};
use rpcrdma_verbs::{CmEvent, ConnParams, CqId, MrId, Provider, QpId, Sge, WorkCompletion};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const T: Option<Duration> = Some(Duration::from_secs(20));
/// Where the silent connection's receive buffers live in the peer's region.
const SILENT_BASE: u64 = 512 << 10;
const SILENT_BUFS: u64 = 8;
const SILENT_LEN: u32 = 4096;
/// App memory of the version-1 server (call arguments, replies).
const APP_BASE: u64 = 768 << 10;

/// The registered bytes of the peer (region = `buf[GUARD..]`).
struct BufMem {
    mr: MrId,
    buf: Vec<u8>,
    len: u64,
}

impl BufMem {
    fn range(&self, at: MemRef, n: usize) -> Option<std::ops::Range<usize>> {
        let end = at.offset.checked_add(n as u64)?;
        (at.mr == self.mr && n <= at.len as usize && end <= self.len)
            .then(|| GUARD + at.offset as usize..GUARD + end as usize)
    }
}

impl Memory for BufMem {
    fn read(&self, at: MemRef, dst: &mut [u8]) -> bool {
        match self.range(at, dst.len()).and_then(|r| self.buf.get(r)) {
            Some(s) => {
                dst.copy_from_slice(s);
                true
            }
            None => false,
        }
    }
    fn write(&mut self, at: MemRef, src: &[u8]) -> bool {
        match self.range(at, src.len()) {
            Some(r) => {
                self.buf[r].copy_from_slice(src);
                true
            }
            None => false,
        }
    }
    fn copy(&mut self, from: MemRef, to: MemRef) -> bool {
        match (
            self.range(from, from.len as usize),
            self.range(to, from.len as usize),
        ) {
            (Some(f), Some(t)) => {
                self.buf.copy_within(f, t.start);
                true
            }
            _ => false,
        }
    }
}

/// What the peer saw.
#[derive(Debug, Default)]
struct Report {
    /// Connection requests accepted.
    accepted: u32,
    /// RPC-over-RDMA version word of each message swallowed on the silent connection.
    swallowed: Vec<u32>,
    /// RDMATEST NULL calls answered in version 1.
    served: u32,
}

/// How the test peer treats connections.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The first connection is silent; later ones are served in version 1.
    SilentThenV1,
    /// Every connection is served in version 2; optional messages (INITXCH, REQXCH) are
    /// never answered.
    V2WithoutXcharext,
}

fn peer(stop: Arc<AtomicBool>, port: std::sync::mpsc::Sender<u16>, mode: Mode) -> Report {
    let p = SoftProvider::tcp(SoftConfig::default()).expect("soft provider");
    let Side {
        p, pd, cq, buf, mr, ..
    } = Side::with_access(p, rpcrdma_dataplane::REGISTERED_ACCESS);
    let tmpl = ConnTemplate {
        version: if mode == Mode::V2WithoutXcharext {
            2
        } else {
            1
        },
        credits: 4,
        max_calls: 8,
        send_size: 4096,
        recv_size: 4096,
        recv_slots: 6,
        ddp_threshold: 1024,
        max_reads: 8,
        max_call_size: 1 << 16,
    };
    let pool = MemRef::new(mr.id, 0, tmpl.block_len().expect("block") * 4);
    assert!(u64::from(pool.len) <= SILENT_BASE);
    let mut drv = Driver::new(p, cq, mr, pool, tmpl).expect("driver");
    let mut mem = BufMem {
        mr: mr.id,
        buf,
        len: mr.len,
    };
    let listener = drv
        .provider_mut()
        .listen("127.0.0.1:0".parse().expect("addr"))
        .expect("listen");
    let addr = drv.provider().listen_addr(listener).expect("addr");
    port.send(addr.port()).expect("port");
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
    let mut report = Report::default();
    let mut silent: Option<(QpId, CqId)> = None;
    let mut wcs = vec![WorkCompletion::default(); 16];
    let mut args_at: Vec<(ConnId, rpcrdma_dataplane::ServeId)> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        drv.poll(Instant::now(), &mut mem);
        while let Some(ev) = drv.provider_mut().poll_cm() {
            let CmEvent::ConnectRequest {
                req, private_data, ..
            } = ev
            else {
                continue;
            };
            report.accepted += 1;
            if report.accepted == 1 && mode == Mode::SilentThenV1 {
                // The silent connection: receives posted, completions read, never answered.
                let scq = drv.provider_mut().create_cq(64).expect("cq");
                let mut init = drv.qp_init(pd);
                init.send_cq = scq;
                init.recv_cq = scq;
                init.max_recv_wr = SILENT_BUFS as u32;
                let qp = drv.provider_mut().create_qp(&init).expect("qp");
                for i in 0..SILENT_BUFS {
                    let sge = Sge {
                        addr: mr.addr_at(SILENT_BASE + i * u64::from(SILENT_LEN)),
                        len: SILENT_LEN,
                        lkey: mr.lkey,
                    };
                    drv.provider_mut().post_recv(qp, i, &[sge]).expect("recv");
                }
                drv.provider_mut().accept(req, qp, &params).expect("accept");
                silent = Some((qp, scq));
            } else {
                let init = drv.qp_init(pd);
                let qp = drv.provider_mut().create_qp(&init).expect("qp");
                let pd8797 = PrivateData::parse(private_data.as_slice());
                drv.add_connection(qp, Role::Server, pd8797)
                    .expect("engine");
                drv.provider_mut().accept(req, qp, &params).expect("accept");
            }
        }
        if let Some((_, scq)) = silent {
            let n = drv.provider_mut().poll_cq(scq, &mut wcs).unwrap_or(0);
            for wc in wcs.iter().take(n) {
                if wc.status != rpcrdma_verbs::WcStatus::Success || wc.byte_len < 8 {
                    continue;
                }
                let at = MemRef::new(mr.id, SILENT_BASE + wc.wr_id * u64::from(SILENT_LEN), 8);
                let mut head = [0u8; 8];
                assert!(mem.read(at, &mut head));
                report
                    .swallowed
                    .push(u32::from_be_bytes([head[4], head[5], head[6], head[7]]));
            }
        }
        let mut ready = Vec::new();
        while let Some((conn, ev)) = drv.poll_event() {
            match ev {
                Event::IncomingCall(c) => {
                    if (c.prog, c.proc_) == (rdmatest::PROG, rdmatest::NULL) {
                        let dest = MemRef::new(mr.id, APP_BASE, c.args_len.max(4));
                        match drv
                            .accept_call(conn, c.id, dest, &mut mem)
                            .expect("accept call")
                        {
                            Accepted::Ready { .. } => ready.push((conn, c.id)),
                            Accepted::Pulling => args_at.push((conn, c.id)),
                        }
                    } else {
                        let _ = drv.reject_call(conn, c.id, 1, &mut mem);
                    }
                }
                Event::ArgsReady { id, .. } => {
                    if let Some(k) = args_at.iter().position(|&(c, i)| c == conn && i == id) {
                        args_at.swap_remove(k);
                        ready.push((conn, id));
                    }
                }
                _ => {}
            }
        }
        for (conn, id) in ready {
            let spec = ReplySpec {
                accept_stat: 0,
                msg: MemRef::new(mr.id, APP_BASE + 4096, 0),
                results: &[],
            };
            drv.submit_reply(conn, id, &spec, &mut mem).expect("reply");
            report.served += 1;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    report
}

/// Starts the test peer in `mode` on its own thread: its stop flag, the thread (its report)
/// and the port it listens on.
fn start_peer(mode: Mode) -> (Arc<AtomicBool>, std::thread::JoinHandle<Report>, u16) {
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let s = stop.clone();
    let thread = std::thread::spawn(move || peer(s, tx, mode));
    let port = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("peer listening");
    (stop, thread, port)
}

/// A NULL call to `server` answered within 20 s (calls racing a reconnect may find no
/// connection and are tried again).
fn null_answered(c: &mut Client, server: u32) -> Option<rpcrdma_shm::client::Reply> {
    common::eventually(20, || {
        let t = c
            .call(server, rdmatest::PROG, 1, rdmatest::NULL)
            .submit()
            .ok()?;
        c.wait(t, T).ok()
    })
}

#[test]
fn amb_33_silent_peer_gets_version_1_after_the_first_message_timeout() {
    let (stop, peer_thread, port) = start_peer(Mode::SilentThenV1);

    let dir = common::tmpdir("fallback-a");
    let own = common::free_port();
    let extra = "[transport]\nversion = 2\nv2-first-message-timeout-ms = 400\n";
    let text = common::config(&dir, own, Some(("server", port)), extra);
    let a = Daemon::start_with(dir, own, &text);
    a.wait_peer_up("server");
    let conns = a.ctl_json(&["conns"]);
    assert_eq!(conns[0]["version"], 2, "{conns}");
    assert_eq!(a.ctl_json(&["status"])["peers"][0]["version"], 2);

    // The first call goes out in version 2 and is swallowed: it ends once, with an error,
    // when the first-message timeout closes the connection.
    let mut c = Client::connect(&a.app).expect("attach");
    let server = c.peer("server").expect("peer");
    let t = c
        .call(server, rdmatest::PROG, 1, rdmatest::NULL)
        .submit()
        .expect("submit");
    let r = c.wait(t, T);
    assert!(
        matches!(r, Err(rpcrdma_shm::client::Error::Status(14))),
        "TRANSPORT expected, got {r:?}\n{}",
        a.log()
    );
    assert!(
        matches!(
            c.try_take(t),
            Err(rpcrdma_shm::client::Error::UnknownTicket)
        ),
        "the call ended exactly once"
    );

    // The daemon reconnects speaking version 1 to this peer.
    let v1 = common::eventually(20, || {
        let s = a.ctl_json(&["status"]);
        let p = &s["peers"][0];
        let conns = a.ctl_json(&["conns"]);
        (p["state"] == "up" && p["version"] == 1 && conns[0]["version"] == 1).then_some(())
    });
    assert!(v1.is_some(), "no version-1 reconnect:\n{}", a.log());
    let table = String::from_utf8_lossy(&a.ctl(&["conns"]).stdout).into_owned();
    assert!(table.contains("VERS"), "{table}");
    assert!(
        a.log().contains("reconnecting with version 1"),
        "{}",
        a.log()
    );

    // Served in version 1 now (a call racing the reconnect may still find no connection).
    let r = null_answered(&mut c, server)
        .unwrap_or_else(|| panic!("no version-1 answer:\n{}", a.log()));
    assert_eq!((r.accept_stat, r.body.len()), (0, 0));

    // The operator clears the mark (`rpcrdmactl peer retry-v2`): the up connection is closed
    // and the next one offers version 2 again. This peer answers that with ERR_VERS, so the
    // engine falls back to 1 on the connection and the call is answered; ERR_VERS is an
    // answer, so the peer is not marked again.
    let old = a.ctl_json(&["status"])["peers"][0]["conn"].clone();
    assert!(old.is_u64(), "{old}");
    // Connection ids are reused: the new connection is told by the daemon's log.
    let ups = || a.log().matches("connection up").count();
    let before = ups();
    let cleared = a.ctl_json(&["peer", "retry-v2", "server"]);
    assert_eq!(cleared["was-v1-only"], true, "{cleared}");
    assert_eq!(cleared["closing"], old, "{cleared}");
    let anew = common::eventually(20, || {
        let p = &a.ctl_json(&["status"])["peers"][0];
        (p["state"] == "up" && p["version"] == 2 && ups() > before).then_some(())
    });
    assert!(
        anew.is_some(),
        "no reconnect offering version 2:\n{}",
        a.log()
    );
    assert!(
        a.log()
            .contains("version-1-only mark cleared by the operator"),
        "{}",
        a.log()
    );
    assert!(
        null_answered(&mut c, server).is_some(),
        "no answer after retry-v2:\n{}",
        a.log()
    );
    let conns = a.ctl_json(&["conns"]);
    assert_eq!(conns[0]["version"], 1, "fell back on ERR_VERS: {conns}");
    assert_eq!(a.ctl_json(&["status"])["peers"][0]["version"], 2);
    // Asked again, nothing to clear; an unknown peer is refused.
    let again = a.ctl(&["peer", "retry-v2", "server"]);
    let text = String::from_utf8_lossy(&again.stdout);
    assert!(again.status.success(), "{again:?}");
    assert!(text.contains("not marked version-1-only"), "{text}");
    let unknown = a.ctl(&["peer", "retry-v2", "nobody"]);
    assert_eq!(unknown.status.code(), Some(1), "{unknown:?}");
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("no peer \"nobody\""),
        "{unknown:?}"
    );

    stop.store(true, Ordering::Relaxed);
    let report = peer_thread.join().expect("peer thread");
    assert!(report.accepted >= 3, "{report:?}");
    assert!(
        !report.swallowed.is_empty() && report.swallowed.iter().all(|&v| v == 2),
        "the silent connection saw version-2 messages only: {report:?}"
    );
    assert!(report.served >= 1, "{report:?}");
}

#[test]
fn xch_3_d_unanswered_reqxch_gives_up_and_the_control_loop_keeps_serving() {
    let (stop, peer_thread, port) = start_peer(Mode::V2WithoutXcharext);
    let dir = common::tmpdir("noxch-a");
    let own = common::free_port();
    let text = common::config(
        &dir,
        own,
        Some(("server", port)),
        "[transport]\nversion = 2\n",
    );
    let a = Daemon::start_with(dir, own, &text);
    a.wait_peer_up("server");
    // A version-two call confirms version two (the peer answers calls, not INITXCH).
    let mut c = Client::connect(&a.app).expect("attach");
    let server = c.peer("server").expect("peer");
    let t = c
        .call(server, rdmatest::PROG, 1, rdmatest::NULL)
        .submit()
        .expect("submit");
    c.wait(t, T).expect("NULL in version 2");
    let id = a.ctl_json(&["conns"])[0]["id"].to_string();
    assert_eq!(a.ctl_json(&["conns"])[0]["version"], 2);

    // The REQXCH is never answered; while its client waits, other admin requests are served.
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (o, sock) = (order.clone(), a.admin.clone());
    let waiter = std::thread::spawn(move || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_rpcrdmactl"))
            .arg("--socket")
            .arg(sock)
            .args(["--json", "xchar", "request", &id, "rbsiz=8192"])
            .output()
            .expect("rpcrdmactl");
        o.lock().expect("order").push("xchar");
        out
    });
    let sent = common::eventually(10, || {
        a.log().contains("awaiting the RESPXCH").then_some(())
    });
    assert!(sent.is_some(), "no REQXCH went out:\n{}", a.log());
    assert_eq!(a.ctl_json(&["status"])["state"], "running");
    order.lock().expect("order").push("status");
    let out = waiter.join().expect("waiter");
    assert_eq!(
        *order.lock().expect("order"),
        vec!["status", "xchar"],
        "status answered while the REQXCH waited"
    );
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("no RESPXCH"), "{text}");
    // XCH-3-d: the request is effectively rejected; nothing is left pending.
    let x = &a.ctl_json(&["conns"])[0]["xchar"];
    assert!(
        x["pending-peer"].as_array().is_some_and(Vec::is_empty),
        "{x}"
    );
    // XCH-3-b: a peer that never sent INITXCH keeps the default RBSIZ in our records.
    assert_eq!(x["peer"]["rbsiz"], 4096, "{x}");
    stop.store(true, Ordering::Relaxed);
    let report = peer_thread.join().expect("peer thread");
    assert!(report.served >= 1, "{report:?}");
}
