//! End to end: two `Driver`s (requester and responder) over the real soft provider, in
//! memory (`MemFabric`) and over TCP loopback, moving real bytes through every transfer mode;
//! and a hostile peer that loses only its own connection.
//!
//! Memory comes from `rpcrdma_verbs::conformance::Side`, which registers a 1 MiB buffer
//! (this crate has no `unsafe`); so "large" transfers here are 768 KiB, the sans-IO tests
//! in `src/conn/tests.rs` cover 1 MiB.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rpcrdma_dataplane::{
    Accepted, ArgPiece, CallDone, CallSpec, CallStatus, CloseReason, ConnConfig, ConnId,
    ConnTemplate, Driver, DriverError, Event, MemRef, Memory, ReplySpec, ResultPiece, Role,
    ServeId, SideMem, SubmitError, REGISTERED_ACCESS,
};
use rpcrdma_proto::cm::PrivateData;
use rpcrdma_proto::ulb::{rdmatest, RDMATEST_PROG};
use rpcrdma_verbs::conformance::Side;
use rpcrdma_verbs::soft::link::MemFabric;
use rpcrdma_verbs::soft::{SoftConfig, SoftProvider};
use rpcrdma_verbs::{CmEvent, ConnParams, PdId, Provider, QpId, QpInit, SendOp};

const BULK_PROG: u32 = 0x4000_0000;

struct Node<P: Provider> {
    drv: Driver<P>,
    mem: SideMem,
    pd: PdId,
    bump: u64,
    base: u64,
    events: Vec<(ConnId, Event)>,
    cm: Vec<CmEvent>,
}

fn template() -> ConnTemplate {
    ConnTemplate {
        version: 1,
        credits: 4,
        max_calls: 8,
        send_size: 4096,
        recv_size: 4096,
        recv_slots: 6,
        ddp_threshold: 1024,
        max_reads: 8,
        max_call_size: 1 << 20,
    }
}

fn node<P: Provider>(p: P, blocks: u32) -> Node<P> {
    // Memory registered as the daemon's is: peers reach it through exposures only.
    let Side {
        p, pd, cq, buf, mr, ..
    } = Side::with_access(p, REGISTERED_ACCESS);
    let tmpl = template();
    let pool = MemRef::new(mr.id, 0, tmpl.block_len().unwrap() * blocks);
    let base = u64::from(pool.len).div_ceil(4096) * 4096;
    let drv = Driver::new(p, cq, mr, pool, tmpl).expect("driver");
    Node {
        drv,
        mem: SideMem {
            mr: mr.id,
            buf,
            len: mr.len,
        },
        pd,
        bump: base,
        base,
        events: Vec::new(),
        cm: Vec::new(),
    }
}

/// A node whose connections share one receive queue of 16 buffers and 24 send buffers.
fn node_shared<P: Provider>(p: P, blocks: u32) -> Node<P> {
    let Side {
        p, pd, cq, buf, mr, ..
    } = Side::with_access(p, REGISTERED_ACCESS);
    let tmpl = template();
    let _ = blocks;
    let send = ConnConfig::send_pool_len(24, tmpl.send_size).unwrap();
    let pool = MemRef::new(mr.id, 0, send);
    let srq_pool = MemRef::new(mr.id, u64::from(pool.len), 16 * tmpl.recv_size);
    let base = (u64::from(pool.len) + u64::from(srq_pool.len)).div_ceil(4096) * 4096;
    let drv = Driver::new_shared(p, cq, pd, mr, pool, true, srq_pool, 16, tmpl).expect("driver");
    Node {
        drv,
        mem: SideMem {
            mr: mr.id,
            buf,
            len: mr.len,
        },
        pd,
        bump: base,
        base,
        events: Vec::new(),
        cm: Vec::new(),
    }
}

impl<P: Provider> Node<P> {
    fn alloc(&mut self, len: u32) -> MemRef {
        if self.bump + u64::from(len) > self.mem.len {
            self.bump = self.base;
        }
        let at = MemRef::new(self.mem.mr, self.bump, len);
        self.bump += u64::from(len).div_ceil(64) * 64 + 64;
        assert!(self.bump <= self.mem.len, "test memory exhausted");
        at
    }

    fn put(&mut self, data: &[u8]) -> MemRef {
        let at = self.alloc(data.len() as u32);
        assert!(self.mem.write(at, data));
        at
    }

    fn get(&self, at: MemRef) -> Vec<u8> {
        let mut v = vec![0; at.len as usize];
        assert!(self.mem.read(at, &mut v));
        v
    }

    fn poll(&mut self) {
        self.drv.poll(Instant::now(), &mut self.mem);
        while let Some(e) = self.drv.provider_mut().poll_cm() {
            self.cm.push(e);
        }
        while let Some(e) = self.drv.poll_event() {
            self.events.push(e);
        }
    }

    fn qp(&mut self) -> QpId {
        let init = self.drv.qp_init(self.pd);
        self.drv.provider_mut().create_qp(&init).expect("create_qp")
    }
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (seed as usize)
                .wrapping_add(i.wrapping_mul(31))
                .wrapping_add(i >> 8) as u8
        })
        .collect()
}

fn be(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_be_bytes()).collect()
}

/// Drives both nodes until `done` holds; panics after a generous hang guard.
fn drive<P: Provider>(
    c: &mut Node<P>,
    s: &mut Node<P>,
    what: &str,
    done: impl Fn(&Node<P>, &Node<P>) -> bool,
) {
    let start = Instant::now();
    while !done(c, s) {
        c.poll();
        s.poll();
        serve(s);
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "hang waiting for {what}"
        );
    }
}

/// Connects `c` to `s` (listening on `addr`) with RFC 8797 private data both ways.
fn connect<P: Provider>(c: &mut Node<P>, s: &mut Node<P>, addr: SocketAddr) -> (ConnId, ConnId) {
    let l = s.drv.provider_mut().listen(addr).expect("listen");
    let addr = s.drv.provider().listen_addr(l).expect("listen_addr");
    let qa = c.qp();
    let ca = c.drv.add_connection(qa, Role::Client, None).expect("add a");
    let pd = c.drv.template().private_data().emit();
    let params = ConnParams {
        private_data: &pd,
        responder_resources: 16,
        initiator_depth: 16,
    };
    c.drv
        .provider_mut()
        .connect(qa, addr, &params)
        .expect("connect");
    drive(c, s, "connect request", |_, s| {
        s.cm.iter()
            .any(|e| matches!(e, CmEvent::ConnectRequest { .. }))
    });
    let pos =
        s.cm.iter()
            .position(|e| matches!(e, CmEvent::ConnectRequest { .. }))
            .unwrap();
    let CmEvent::ConnectRequest {
        req, private_data, ..
    } = s.cm.remove(pos)
    else {
        unreachable!()
    };
    let qb = s.qp();
    let peer = PrivateData::parse(private_data.as_slice());
    assert!(peer.is_some(), "client private data parses");
    let cb = s.drv.add_connection(qb, Role::Server, peer).expect("add b");
    let spd = s.drv.template().private_data().emit();
    s.drv
        .provider_mut()
        .accept(
            req,
            qb,
            &ConnParams {
                private_data: &spd,
                ..params
            },
        )
        .expect("accept");
    drive(c, s, "established", |c, _| {
        c.cm.iter()
            .any(|e| matches!(e, CmEvent::Established { .. }))
    });
    let pos =
        c.cm.iter()
            .position(|e| matches!(e, CmEvent::Established { .. }))
            .unwrap();
    let CmEvent::Established { private_data, .. } = c.cm.remove(pos) else {
        unreachable!()
    };
    c.drv
        .set_peer(ca, PrivateData::parse(private_data.as_slice()))
        .unwrap();
    (ca, cb)
}

/// The RDMATEST server: answers every incoming call of node `s`.
fn serve<P: Provider>(s: &mut Node<P>) {
    let evs = std::mem::take(&mut s.events);
    for (conn, ev) in evs {
        match ev {
            Event::IncomingCall(c) => {
                let buf = s.alloc(c.args_len.max(4));
                PEND.with(|m| m.borrow_mut().push((conn, c.id, c.prog, c.proc_, buf)));
                match s.drv.accept_call(conn, c.id, buf, &mut s.mem) {
                    Ok(Accepted::Ready { args_len }) => answer(s, conn, c.id, args_len),
                    // The connection ended meanwhile: its end is reported separately.
                    Ok(Accepted::Pulling) | Err(SubmitError::Closed) => {}
                    Err(e) => panic!("accept: {e:?}"),
                }
            }
            Event::ArgsReady { id, args_len } => answer(s, conn, id, args_len),
            Event::ServeAborted { id } => {
                // A call of a connection that ended: forget it.
                PEND.with(|m| m.borrow_mut().retain(|e| (e.0, e.1) != (conn, id)));
                s.events.push((conn, ev));
            }
            other => s.events.push((conn, other)),
        }
    }
}

/// Answers served call `id` of `conn`, whose `args_len` bytes of arguments are in place.
fn answer<P: Provider>(s: &mut Node<P>, conn: ConnId, id: ServeId, args_len: u32) {
    let (prog, proc_, buf) = PEND.with(|m| {
        let mut m = m.borrow_mut();
        let i = m.iter().position(|e| (e.0, e.1) == (conn, id)).unwrap();
        let e = m.remove(i);
        (e.2, e.3, e.4)
    });
    let args = s.get(buf.prefix(args_len).unwrap());
    let w = |at: usize| u32::from_be_bytes(args[at..at + 4].try_into().unwrap());
    let (msg, results): (Vec<u8>, Vec<ResultPiece>) = match (prog, proc_) {
        (RDMATEST_PROG, rdmatest::ECHO) => {
            let n = w(0);
            (
                be(&[n]),
                vec![ResultPiece {
                    mem: buf.sub(4, n).unwrap(),
                    xdr_pos: 4,
                }],
            )
        }
        (RDMATEST_PROG, rdmatest::READ) => {
            let data = s.put(&pattern(w(4), w(0) as usize));
            (
                be(&[w(0)]),
                vec![ResultPiece {
                    mem: data,
                    xdr_pos: 4,
                }],
            )
        }
        (RDMATEST_PROG, rdmatest::WRITE) => {
            let n = w(4) as usize;
            let ok = args[8..8 + n] == pattern(w(0), n)[..];
            (be(&[if ok { n as u32 } else { 0 }]), vec![])
        }
        (BULK_PROG, 1) => (args.clone(), vec![]),
        _ => (vec![], vec![]),
    };
    let m = s.put(&msg);
    let spec = ReplySpec {
        accept_stat: 0,
        msg: m,
        results: &results,
    };
    match s.drv.submit_reply(conn, id, &spec, &mut s.mem) {
        Ok(()) | Err(SubmitError::Closed) => {}
        Err(e) => panic!("reply: {e:?}"),
    }
}

/// Drives a raw side (what `Side::step` does, which is private).
fn hstep<P: Provider>(h: &mut Side<P>) {
    while let Some(e) = h.p.poll_cm() {
        h.events.push(e);
    }
    let mut w = [rpcrdma_verbs::WorkCompletion::default(); 16];
    let n = h.p.poll_cq(h.cq, &mut w).expect("poll_cq");
    h.wcs.extend_from_slice(&w[..n]);
}

/// A call being served: its connection, id, program, procedure and argument buffer.
type Pending = (ConnId, ServeId, u32, u32, MemRef);

thread_local! {
    static PEND: std::cell::RefCell<Vec<Pending>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

fn take_done<P: Provider>(c: &mut Node<P>, xid: u32) -> Option<CallDone> {
    let pos = c
        .events
        .iter()
        .position(|(_, e)| matches!(e, Event::CallDone(d) if d.xid == xid))?;
    match c.events.remove(pos).1 {
        Event::CallDone(d) => Some(d),
        _ => None,
    }
}

fn run_call<P: Provider>(
    c: &mut Node<P>,
    s: &mut Node<P>,
    conn: ConnId,
    spec: &CallSpec<'_>,
) -> CallDone {
    c.drv.submit_call(conn, spec, &mut c.mem).expect("submit");
    let xid = spec.xid;
    drive(c, s, "call done", |c, _| {
        c.events
            .iter()
            .any(|(_, e)| matches!(e, Event::CallDone(d) if d.xid == xid))
    });
    take_done(c, xid).unwrap()
}

/// NULL, ECHO 64 B, READ 768 KiB via a Write chunk, WRITE 768 KiB via a Read chunk, a Long
/// call and a Long reply, with every byte checked.
fn all_modes<P: Provider>(mut c: Node<P>, mut s: Node<P>, addr: SocketAddr) {
    let (conn, _) = connect(&mut c, &mut s, addr);
    let big = 768u32 << 10;

    // NULL.
    let (msg, reply) = (c.alloc(0), c.alloc(16));
    let d = run_call(&mut c, &mut s, conn, &null_call(msg, reply, 1));
    assert_eq!((d.status, d.reply_len), (CallStatus::Ok, 0));

    // ECHO 64 bytes (inline both ways).
    let data = pattern(64, 64);
    let msg = c.put(&be(&[64]));
    let piece = c.put(&data);
    let (result, reply) = (c.alloc(64), c.alloc(128));
    let d = run_call(
        &mut c,
        &mut s,
        conn,
        &CallSpec {
            auth: None,
            user: 2,
            xid: 2,
            prog: RDMATEST_PROG,
            vers: 1,
            proc_: rdmatest::ECHO,
            msg,
            args: &[ArgPiece {
                mem: piece,
                xdr_pos: 4,
            }],
            results: &[result],
            reply,
        },
    );
    assert_eq!((d.status, d.reply_len), (CallStatus::Ok, 68));
    assert_eq!(c.get(reply.prefix(68).unwrap()), [be(&[64]), data].concat());

    // READ via a Write chunk.
    let msg = c.put(&be(&[big, 9]));
    let (result, reply) = (c.alloc(big), c.alloc(64));
    let d = run_call(
        &mut c,
        &mut s,
        conn,
        &CallSpec {
            auth: None,
            user: 3,
            xid: 3,
            prog: RDMATEST_PROG,
            vers: 1,
            proc_: rdmatest::READ,
            msg,
            args: &[],
            results: &[result],
            reply,
        },
    );
    assert_eq!(
        (d.status, &d.results().collect::<Vec<_>>()[..]),
        (CallStatus::Ok, &[(4, big)][..])
    );
    assert!(
        c.get(result) == pattern(9, big as usize),
        "READ data intact"
    );

    // WRITE via a Read chunk.
    c.bump = c.base;
    let msg = c.put(&be(&[11, big]));
    let piece = c.put(&pattern(11, big as usize));
    let reply = c.alloc(64);
    let d = run_call(
        &mut c,
        &mut s,
        conn,
        &CallSpec {
            auth: None,
            user: 4,
            xid: 4,
            prog: RDMATEST_PROG,
            vers: 1,
            proc_: rdmatest::WRITE,
            msg,
            args: &[ArgPiece {
                mem: piece,
                xdr_pos: 8,
            }],
            results: &[],
            reply,
        },
    );
    assert_eq!(d.status, CallStatus::Ok);
    assert_eq!(
        c.get(reply.prefix(4).unwrap()),
        be(&[big]),
        "server saw every byte"
    );

    // Long call and Long reply: 100 KiB of non-eligible arguments echoed back.
    c.bump = c.base;
    let data = pattern(5, 100 << 10);
    let msg = c.put(&data);
    let reply = c.alloc(data.len() as u32);
    let d = run_call(
        &mut c,
        &mut s,
        conn,
        &CallSpec {
            auth: None,
            user: 5,
            xid: 5,
            prog: BULK_PROG,
            vers: 1,
            proc_: 1,
            msg,
            args: &[],
            results: &[],
            reply,
        },
    );
    assert_eq!((d.status, d.reply_len), (CallStatus::Ok, data.len() as u32));
    assert!(c.get(reply) == data, "long reply intact");
    let st = c.drv.connection(conn).unwrap().stats();
    assert_eq!((st.long_calls, st.write_chunks, st.read_chunks), (1, 1, 1));
    // Many calls in flight under the credit limit.
    c.bump = c.base;
    for x in 0..32u32 {
        let msg = c.put(&be(&[16]));
        let piece = c.put(&pattern(x, 16));
        let (result, reply) = (c.alloc(16), c.alloc(32));
        let spec = CallSpec {
            auth: None,
            user: 100 + u64::from(x),
            xid: 100 + x,
            prog: RDMATEST_PROG,
            vers: 1,
            proc_: rdmatest::ECHO,
            msg,
            args: &[ArgPiece {
                mem: piece,
                xdr_pos: 4,
            }],
            results: &[result],
            reply,
        };
        loop {
            match c.drv.submit_call(conn, &spec, &mut c.mem) {
                Ok(()) => break,
                // Every call slot is taken: let replies come back, then retry.
                Err(SubmitError::Busy) => {
                    c.poll();
                    s.poll();
                    serve(&mut s);
                }
                Err(e) => panic!("submit: {e:?}"),
            }
        }
        assert!(c.drv.connection(conn).unwrap().calls_in_flight() <= 4);
    }
    drive(&mut c, &mut s, "all echo calls", |c, _| {
        c.drv.connection(conn).unwrap().calls_in_flight() == 0
    });
    let oks = c
        .events
        .iter()
        .filter(|(_, e)| matches!(e, Event::CallDone(d) if d.status == CallStatus::Ok))
        .count();
    assert_eq!(oks, 32);
}

#[test]
fn e2e_mem_fabric_every_transfer_mode() {
    let f = MemFabric::new();
    let c = node(SoftProvider::memory(&f, SoftConfig::default()), 1);
    let s = node(SoftProvider::memory(&f, SoftConfig::default()), 1);
    all_modes(c, s, "10.0.0.1:20049".parse().unwrap());
}

#[test]
fn e2e_mem_fabric_shared_receive_queue_every_transfer_mode() {
    let f = MemFabric::new();
    let c = node_shared(SoftProvider::memory(&f, SoftConfig::default()), 1);
    let s = node_shared(SoftProvider::memory(&f, SoftConfig::default()), 2);
    all_modes(c, s, "10.0.0.3:20049".parse().unwrap());
}

#[test]
fn e2e_shared_pools_return_every_buffer() {
    let f = MemFabric::new();
    let mut c = node_shared(SoftProvider::memory(&f, SoftConfig::default()), 1);
    let mut s = node_shared(SoftProvider::memory(&f, SoftConfig::default()), 1);
    let (conn, sconn) = connect(&mut c, &mut s, "10.0.0.4:20049".parse().unwrap());
    for x in 0..40u32 {
        let data = pattern(x, 3000);
        let msg = c.put(&be(&[3000]));
        let piece = c.put(&data);
        let (result, reply) = (c.alloc(3000), c.alloc(64));
        let d = run_call(
            &mut c,
            &mut s,
            conn,
            &CallSpec {
                auth: None,
                user: 1,
                xid: 1000 + x,
                prog: RDMATEST_PROG,
                vers: 1,
                proc_: rdmatest::ECHO,
                msg,
                args: &[ArgPiece {
                    mem: piece,
                    xdr_pos: 4,
                }],
                results: &[result],
                reply,
            },
        );
        assert_eq!(d.status, CallStatus::Ok);
        assert_eq!(c.get(result), data);
    }
    drive(&mut c, &mut s, "send completions", |c, s| {
        c.drv.free_send_buffers() == 24 && s.drv.free_send_buffers() == 24
    });
    // The statistics say the same: every send buffer free, every shared receive posted.
    drive(&mut c, &mut s, "receives reposted", |c, s| {
        [c.drv.buffer_counts(), s.drv.buffer_counts()]
            .iter()
            .all(|b| b.send_free == b.send_total && b.recv_free == b.recv_total)
    });
    let b = s.drv.buffer_counts();
    assert_eq!((b.send_total, b.recv_total), (24, 16));
    s.drv.close(sconn, CloseReason::Requested, &mut s.mem);
    assert_eq!(s.drv.free_send_buffers(), 24);
}

/// A peer that overruns its grant on a poll thread's shared pools loses its connection and
/// nothing else: once it is gone every shared buffer is back, and the other connection works.
/// (Before the fix the overrunning call's receive buffer was lost for good.)
#[test]
fn e2e_hostile_peer_on_shared_pools_costs_no_buffer() {
    let f = MemFabric::new();
    let mut good = node_shared(SoftProvider::memory(&f, SoftConfig::default()), 1);
    let mut s = node_shared(SoftProvider::memory(&f, SoftConfig::default()), 2);
    let addr: SocketAddr = "10.0.0.5:20049".parse().unwrap();
    let (gconn, _) = connect(&mut good, &mut s, addr);
    let (mut h, qp, hconn) = connect_raw_client(&f, &mut s, addr);
    // More calls than the grant of 4, without waiting.
    for x in 0..6u32 {
        let mut m = be(&[x, 1, 4, 0, 0, 0, 0, x, 0, 2, BULK_PROG, 1, 1, 0, 0, 0, 0]);
        m.extend(be(&[x]));
        raw_send(&mut h, qp, 10 + u64::from(x), &m);
    }
    let start = Instant::now();
    while !s
        .events
        .iter()
        .any(|(c, e)| *c == hconn && *e == Event::Closed(CloseReason::CreditOverrun))
    {
        hstep(&mut h);
        s.poll();
        assert!(start.elapsed() < Duration::from_secs(30));
    }
    s.drv.remove(hconn).unwrap();
    drive(&mut good, &mut s, "every shared buffer back", |_, s| {
        let b = s.drv.buffer_counts();
        b.send_free == b.send_total && b.recv_free == b.recv_total
    });
    assert_eq!(s.drv.buffer_counts().recv_total, 16);
    let spec = bulk_spec(&mut good, 1, 77, &be(&[4]));
    let d = run_call(&mut good, &mut s, gconn, &spec);
    assert_eq!(d.status, CallStatus::Ok);
}

/// A call to the bulk program echoing `data` inline, from node `c` (not submitted).
fn bulk_spec<P: Provider>(c: &mut Node<P>, user: u64, xid: u32, data: &[u8]) -> CallSpec<'static> {
    CallSpec {
        auth: None,
        user,
        xid,
        prog: BULK_PROG,
        vers: 1,
        proc_: 1,
        msg: c.put(data),
        args: &[],
        results: &[],
        reply: c.alloc(64),
    }
}

/// Two nodes on shared pools (the client's provider configured `client`) connected at
/// `addr`, and a call from the client (`user`) posted on the connection, its Send's
/// completion not polled yet (its shared send buffer out).
fn shared_pair_with_a_posted_call(
    client: SoftConfig,
    addr: &str,
    user: u64,
) -> (Node<Soft>, Node<Soft>, ConnId) {
    let f = MemFabric::new();
    let mut c = node_shared(SoftProvider::memory(&f, client), 1);
    let mut s = node_shared(SoftProvider::memory(&f, SoftConfig::default()), 1);
    let (conn, _) = connect(&mut c, &mut s, addr.parse().unwrap());
    drive(&mut c, &mut s, "send completions", |c, _| {
        c.drv.free_send_buffers() == 24
    });
    let spec = bulk_spec(&mut c, user, 5, &be(&[4]));
    c.drv.submit_call(conn, &spec, &mut c.mem).unwrap();
    c.drv.post_pending();
    assert_eq!(c.drv.free_send_buffers(), 23);
    (c, s, conn)
}

/// A shared send buffer under a Send still posted when its connection closes stays out of the
/// pool until the queue pair is destroyed (`Driver::remove`): the device may still be sending
/// from it, and another connection's message must not be written there meanwhile.
#[test]
fn e2e_a_send_still_posted_keeps_its_shared_buffer_until_the_queue_pair_is_gone() {
    let (mut c, _s, conn) =
        shared_pair_with_a_posted_call(SoftConfig::default(), "10.0.0.6:20049", 1);
    c.drv.close(conn, CloseReason::Requested, &mut c.mem);
    c.drv.post_pending();
    assert_eq!(
        c.drv.free_send_buffers(),
        23,
        "released while the Send is posted"
    );
    c.drv.remove(conn).unwrap();
    assert_eq!(c.drv.free_send_buffers(), 24);
}

/// Removing a connection that is still open closes it first: its call ends once, with
/// `Closed`, and every shared buffer it held is back.
#[test]
fn e2e_removing_an_open_connection_ends_its_calls_and_frees_its_buffers() {
    let f = MemFabric::new();
    let mut c = node_shared(SoftProvider::memory(&f, SoftConfig::default()), 1);
    let mut s = node_shared(SoftProvider::memory(&f, SoftConfig::default()), 1);
    let (conn, _) = connect(&mut c, &mut s, "10.0.0.7:20049".parse().unwrap());
    let spec = bulk_spec(&mut c, 9, 6, &be(&[4]));
    c.drv.submit_call(conn, &spec, &mut c.mem).unwrap();
    c.drv.post_pending();
    c.drv.remove(conn).unwrap();
    let b = c.drv.buffer_counts();
    assert_eq!((b.send_free, b.recv_free), (b.send_total, b.recv_total));
    let ends: Vec<CallDone> = std::iter::from_fn(|| c.drv.poll_event())
        .filter_map(|(_, e)| match e {
            Event::CallDone(d) => Some(d),
            _ => None,
        })
        .collect();
    assert_eq!(ends.len(), 1);
    assert_eq!((ends[0].user, ends[0].status), (9, CallStatus::Closed));
}

/// On a device that is not done with a destroyed queue pair at once (rxe until a marker's
/// trip, siw until a poll empties the CQ; modelled here by `SoftConfig::retire_polls`), a
/// removed connection's call ends, which give the apps their memory back, wait until it is
/// (`Provider::qp_retired`), and so do the shared buffers its Sends were reading. Meanwhile
/// the connection is unknown to every call, and afterwards the node serves new connections.
#[test]
fn e2e_a_removed_connection_s_calls_end_once_the_device_is_done_with_its_queue_pair() {
    let late = SoftConfig {
        retire_polls: 3,
        ..SoftConfig::default()
    };
    let (mut c, mut s, conn) = shared_pair_with_a_posted_call(late, "10.0.0.8:20049", 11);
    c.drv.remove(conn).unwrap();
    assert_eq!(c.drv.retiring(), 1);
    assert!(c.drv.provider().busy(), "an owner must keep polling");
    assert!(c.drv.connection(conn).is_none(), "removed");
    let again = bulk_spec(&mut c, 12, 8, &be(&[4]));
    assert_eq!(
        c.drv.submit_call(conn, &again, &mut c.mem),
        Err(SubmitError::Closed)
    );
    assert!(matches!(c.drv.remove(conn), Err(DriverError::BadId)));
    let mut ends = Vec::new();
    let mut polls = 0;
    while c.drv.retiring() > 0 {
        assert!(
            std::iter::from_fn(|| c.drv.poll_event()).next().is_none(),
            "an event before the device is done"
        );
        assert_eq!(
            c.drv.free_send_buffers(),
            23,
            "the Send's buffer is still out"
        );
        c.drv.poll(Instant::now(), &mut c.mem);
        polls += 1;
        assert!(polls <= 3, "retired within the polls the provider takes");
    }
    ends.extend(
        std::iter::from_fn(|| c.drv.poll_event()).filter_map(|(id, e)| match e {
            Event::CallDone(d) => Some((id, d.user, d.status)),
            _ => None,
        }),
    );
    assert_eq!(ends, [(conn, 11, CallStatus::Closed)], "ended once, then");
    let b = c.drv.buffer_counts();
    assert_eq!((b.send_free, b.recv_free), (b.send_total, b.recv_total));
    assert!(!c.drv.provider().busy());
    // The node goes on: a new connection gets another id and serves calls.
    let (fresh, _) = connect(&mut c, &mut s, "10.0.0.9:20049".parse().unwrap());
    assert_ne!(fresh, conn);
    let spec = bulk_spec(&mut c, 13, 9, &be(&[4]));
    let d = run_call(&mut c, &mut s, fresh, &spec);
    assert_eq!(d.status, CallStatus::Ok);
}

#[test]
fn e2e_tcp_loopback_every_transfer_mode() {
    let c = node(SoftProvider::tcp(SoftConfig::default()).unwrap(), 1);
    let s = node(SoftProvider::tcp(SoftConfig::default()).unwrap(), 1);
    all_modes(c, s, "127.0.0.1:0".parse().unwrap());
}

#[test]
fn e2e_hostile_peer_loses_only_its_connection() {
    let f = MemFabric::new();
    let mut good = node(SoftProvider::memory(&f, SoftConfig::default()), 1);
    let mut s = node(SoftProvider::memory(&f, SoftConfig::default()), 2);
    let addr: SocketAddr = "10.0.0.2:20049".parse().unwrap();
    let (gconn, _) = connect(&mut good, &mut s, addr);

    // The hostile client talks raw verbs.
    let (mut h, qp, hconn) = connect_raw_client(&f, &mut s, addr);
    assert_eq!(s.drv.free_blocks(), 0);
    // Malformed headers: answered with ERR_CHUNK, the connection stays.
    raw_send(&mut h, qp, 1, &be(&[7, 1, 1, 9, 0, 0, 0, 7, 0]));
    let start = Instant::now();
    while !h.wcs.iter().any(|w| w.wr_id >= 1000) {
        hstep(&mut h);
        s.poll();
        assert!(start.elapsed() < Duration::from_secs(30));
    }
    let got = h.wcs.iter().find(|w| w.wr_id >= 1000).unwrap();
    let off = 4096 * (got.wr_id - 1000 + 1) as usize;
    assert_eq!(h.mem(off, got.byte_len as usize), &be(&[7, 1, 4, 4, 2])[..]);
    assert!(s.drv.connection(hconn).unwrap().closed().is_none());

    // Credit overrun: more calls than the grant of 4, without waiting.
    for x in 0..6u32 {
        let mut m = be(&[x, 1, 4, 0, 0, 0, 0, x, 0, 2, BULK_PROG, 1, 1, 0, 0, 0, 0]);
        m.extend(be(&[x]));
        raw_send(&mut h, qp, 10 + u64::from(x), &m);
    }
    let start = Instant::now();
    while !s
        .events
        .iter()
        .any(|(c, e)| *c == hconn && matches!(e, Event::Closed(_)))
    {
        hstep(&mut h);
        s.poll();
        assert!(start.elapsed() < Duration::from_secs(30));
    }
    assert!(s
        .events
        .iter()
        .any(|(c, e)| *c == hconn && *e == Event::Closed(CloseReason::CreditOverrun)));
    // Calls it had in progress are answered nowhere; the driver reports each once.
    let aborted = s
        .events
        .iter()
        .filter(|(c, e)| *c == hconn && matches!(e, Event::ServeAborted { .. }))
        .count();
    assert!(aborted <= 4);
    s.drv.remove(hconn).unwrap();
    assert_eq!(s.drv.free_blocks(), 1, "the pool block came back");

    // The good connection still works.
    s.events.clear();
    let data = pattern(3, 5000);
    let msg = good.put(&be(&[5000]));
    let piece = good.put(&data);
    let (result, reply) = (good.alloc(5000), good.alloc(64));
    let d = run_call(
        &mut good,
        &mut s,
        gconn,
        &CallSpec {
            auth: None,
            user: 1,
            xid: 77,
            prog: RDMATEST_PROG,
            vers: 1,
            proc_: rdmatest::ECHO,
            msg,
            args: &[ArgPiece {
                mem: piece,
                xdr_pos: 4,
            }],
            results: &[result],
            reply,
        },
    );
    assert_eq!(
        (d.status, &d.results().collect::<Vec<_>>()[..]),
        (CallStatus::Ok, &[(4, 5000)][..])
    );
    assert_eq!(good.get(result), data);
}

#[test]
fn r8166_4_5_4_c_post_failure_closes_the_connection() {
    let f = MemFabric::new();
    let mut c = node(SoftProvider::memory(&f, SoftConfig::default()), 1);
    let mut s = node(SoftProvider::memory(&f, SoftConfig::default()), 1);
    let (conn, _) = connect(&mut c, &mut s, "10.0.0.5:20049".parse().unwrap());
    // The queue pair vanishes under the driver: the next post fails.
    let qid = (0..16)
        .map(QpId)
        .find(|q| c.drv.by_qp(*q) == Some(conn))
        .unwrap();
    c.drv.provider_mut().destroy_qp(qid).unwrap();
    let (msg, reply) = (c.alloc(0), c.alloc(16));
    let spec = null_call(msg, reply, 1);
    c.drv.submit_call(conn, &spec, &mut c.mem).unwrap();
    c.poll();
    assert!(c
        .events
        .iter()
        .any(|(id, e)| *id == conn && *e == Event::Closed(CloseReason::Local("post failed"))));
    let d = take_done(&mut c, 1).expect("the call is reported");
    assert_eq!(d.status, CallStatus::Closed);
}

// ---------------------------------------------------------------------------------------
// Fault injection: a faulty connection ends, its outstanding calls complete exactly once
// with an error, another connection of the same nodes keeps working, and the buffer pools
// come back to their starting counts.

type Soft = rpcrdma_verbs::soft::SoftMem;

fn soft(f: &MemFabric) -> Soft {
    SoftProvider::memory(f, SoftConfig::default())
}

/// A raw queue pair (no engine) with 16 receives of 4096 bytes at `4096 * (k + 1)`.
fn raw_qp(h: &mut Side<Soft>) -> QpId {
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
        .unwrap();
    for k in 0..16u64 {
        let sge = h.sge(4096 * (k as usize + 1), 4096);
        h.p.post_recv(qp, 1000 + k, &[sge]).unwrap();
    }
    qp
}

/// Connects node `c` to a raw verbs server `h` listening on `addr`.
fn connect_raw_server(c: &mut Node<Soft>, h: &mut Side<Soft>, addr: SocketAddr) -> (ConnId, QpId) {
    let l = h.p.listen(addr).unwrap();
    let addr = h.p.listen_addr(l).unwrap();
    let qa = c.qp();
    let ca = c.drv.add_connection(qa, Role::Client, None).unwrap();
    let pd = c.drv.template().private_data().emit();
    let params = ConnParams {
        private_data: &pd,
        responder_resources: 16,
        initiator_depth: 16,
    };
    c.drv.provider_mut().connect(qa, addr, &params).unwrap();
    let start = Instant::now();
    let mut hq = None;
    loop {
        c.poll();
        hstep(h);
        if let Some(pos) = h
            .events
            .iter()
            .position(|e| matches!(e, CmEvent::ConnectRequest { .. }))
        {
            let CmEvent::ConnectRequest { req, .. } = h.events.remove(pos) else {
                unreachable!()
            };
            let qp = raw_qp(h);
            h.p.accept(req, qp, &params).unwrap();
            hq = Some(qp);
        }
        if let Some(pos) =
            c.cm.iter()
                .position(|e| matches!(e, CmEvent::Established { .. }))
        {
            let CmEvent::Established { private_data, .. } = c.cm.remove(pos) else {
                unreachable!()
            };
            c.drv
                .set_peer(ca, PrivateData::parse(private_data.as_slice()))
                .unwrap();
            return (ca, hq.unwrap());
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "raw connect hangs"
        );
    }
}

/// Connects a raw verbs client to server node `s` listening on `addr`; returns the raw side,
/// its queue pair and the server's connection.
fn connect_raw_client(
    f: &MemFabric,
    s: &mut Node<Soft>,
    addr: SocketAddr,
) -> (Side<Soft>, QpId, ConnId) {
    let mut h = Side::new(soft(f));
    let qp = raw_qp(&mut h);
    let pd = template().private_data().emit();
    let params = ConnParams {
        private_data: &pd,
        responder_resources: 16,
        initiator_depth: 16,
    };
    h.p.connect(qp, addr, &params).unwrap();
    let start = Instant::now();
    let mut sconn = None;
    while !h
        .events
        .iter()
        .any(|e| matches!(e, CmEvent::Established { .. }))
    {
        hstep(&mut h);
        s.poll();
        if let Some(pos) =
            s.cm.iter()
                .position(|e| matches!(e, CmEvent::ConnectRequest { .. }))
        {
            let CmEvent::ConnectRequest { req, .. } = s.cm.remove(pos) else {
                unreachable!()
            };
            let qb = s.qp();
            sconn = Some(s.drv.add_connection(qb, Role::Server, None).unwrap());
            s.drv.provider_mut().accept(req, qb, &params).unwrap();
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "raw connect hangs"
        );
    }
    (h, qp, sconn.unwrap())
}

/// Sends `bytes` from the raw side's offset 0.
fn raw_send(h: &mut Side<Soft>, qp: QpId, id: u64, bytes: &[u8]) {
    h.fill(0, bytes);
    let sge = h.sge(0, bytes.len());
    h.p.post_send(
        qp,
        &rpcrdma_verbs::SendWr {
            wr_id: id,
            op: SendOp::Send,
            sg: &[sge],
            signaled: true,
        },
    )
    .unwrap();
}

/// The next message the raw side received (and its receive id), if any.
fn raw_take_recv(h: &mut Side<Soft>) -> Option<Vec<u8>> {
    let pos = h
        .wcs
        .iter()
        .position(|w| w.wr_id >= 1000 && w.status == rpcrdma_verbs::WcStatus::Success)?;
    let w = h.wcs.remove(pos);
    let off = 4096 * (w.wr_id - 1000 + 1) as usize;
    Some(h.mem(off, w.byte_len as usize).to_vec())
}

/// The queue pair of connection `conn` of node `c`.
/// Polls both nodes, the server serving, until `done(server)` (at most 30 s); never a step
/// more, so a test can cut the link at that very point.
fn serve_until<P: Provider>(c: &mut Node<P>, s: &mut Node<P>, done: impl Fn(&Node<P>) -> bool) {
    let start = Instant::now();
    while !done(s) {
        c.poll();
        s.poll();
        serve(s);
        assert!(start.elapsed() < Duration::from_secs(30));
    }
}

fn qp_of<P: Provider>(c: &Node<P>, conn: ConnId) -> QpId {
    (0..64)
        .map(QpId)
        .find(|q| c.drv.by_qp(*q) == Some(conn))
        .unwrap()
}

/// The CallDone events of `conn`, taken out of `c`'s events.
fn take_conn_done<P: Provider>(c: &mut Node<P>, conn: ConnId) -> Vec<CallDone> {
    let mut out = Vec::new();
    c.events.retain(|(id, e)| match e {
        Event::CallDone(d) if *id == conn => {
            out.push(*d);
            false
        }
        _ => true,
    });
    out
}

fn closed<P: Provider>(n: &Node<P>, conn: ConnId) -> bool {
    n.events
        .iter()
        .any(|(id, e)| *id == conn && matches!(e, Event::Closed(_)))
}

/// Each of `xids` completed exactly once on `conn`, never successfully.
fn assert_failed_once<P: Provider>(c: &mut Node<P>, conn: ConnId, xids: &[u32]) {
    let d = take_conn_done(c, conn);
    assert_eq!(d.len(), xids.len(), "{d:?}");
    for x in xids {
        let mine: Vec<&CallDone> = d.iter().filter(|d| d.xid == *x).collect();
        assert_eq!(mine.len(), 1, "xid {x}: {d:?}");
        assert_eq!(mine[0].status, CallStatus::Closed, "xid {x}");
    }
}

/// Submits a call of node `c` on `conn`, queued or sent.
fn submit<P: Provider>(c: &mut Node<P>, conn: ConnId, spec: &CallSpec<'_>) {
    c.drv.submit_call(conn, spec, &mut c.mem).expect("submit");
}

/// An ECHO of `n` bytes through a Read chunk and a Write chunk; checks the bytes.
fn echo_works<P: Provider>(c: &mut Node<P>, s: &mut Node<P>, conn: ConnId, xid: u32, n: u32) {
    let data = pattern(xid, n as usize);
    let msg = c.put(&be(&[n]));
    let piece = c.put(&data);
    let (result, reply) = (c.alloc(n), c.alloc(n + 8));
    let d = run_call(
        c,
        s,
        conn,
        &CallSpec {
            auth: None,
            user: u64::from(xid),
            xid,
            prog: RDMATEST_PROG,
            vers: 1,
            proc_: rdmatest::ECHO,
            msg,
            args: &[ArgPiece {
                mem: piece,
                xdr_pos: 4,
            }],
            results: &[result],
            reply,
        },
    );
    assert_eq!(d.status, CallStatus::Ok);
    if n >= 1024 {
        assert_eq!(d.results().collect::<Vec<_>>(), &[(4, n)][..]);
        assert!(c.get(result) == data, "echo bytes intact");
    } else {
        let r = c.get(reply.prefix(d.reply_len).unwrap());
        assert!(r[4..4 + n as usize] == data[..], "echo bytes intact");
    }
}

/// Submits a WRITE of `data` (at least 1024 bytes: it travels in a Read chunk) at offset 4
/// on `conn`; returns where `data` lies (what the chunk exposes).
fn submit_write<P: Provider>(c: &mut Node<P>, conn: ConnId, xid: u32, data: &[u8]) -> MemRef {
    let msg = c.put(&be(&[4, data.len() as u32]));
    let piece = c.put(data);
    let reply = c.alloc(64);
    submit(
        c,
        conn,
        &CallSpec {
            auth: None,
            user: u64::from(xid),
            xid,
            prog: RDMATEST_PROG,
            vers: 1,
            proc_: rdmatest::WRITE,
            msg,
            args: &[ArgPiece {
                mem: piece,
                xdr_pos: 8,
            }],
            results: &[],
            reply,
        },
    );
    piece
}

/// READ of `count` bytes into a Write chunk.
fn read_spec<P: Provider>(c: &mut Node<P>, count: u32) -> (MemRef, MemRef, MemRef) {
    let msg = c.put(&be(&[count, 3]));
    let result = c.alloc(count);
    let reply = c.alloc(64);
    (msg, result, reply)
}

/// Submits, on `conn`, a READ (`xid`) of `count` bytes into a Write chunk; its result buffer.
fn submit_read<P: Provider>(c: &mut Node<P>, conn: ConnId, xid: u32, count: u32) -> MemRef {
    let (msg, result, reply) = read_spec(c, count);
    submit(
        c,
        conn,
        &CallSpec {
            auth: None,
            user: u64::from(xid),
            xid,
            prog: RDMATEST_PROG,
            vers: 1,
            proc_: rdmatest::READ,
            msg,
            args: &[],
            results: &[result],
            reply,
        },
    );
    result
}

fn null_spec<P: Provider>(c: &mut Node<P>) -> (MemRef, MemRef) {
    (c.alloc(0), c.alloc(16))
}

/// A NULL call (`user` = `xid`) whose message and reply are at `msg` and `reply`.
fn null_call(msg: MemRef, reply: MemRef, xid: u32) -> CallSpec<'static> {
    CallSpec {
        auth: None,
        user: u64::from(xid),
        xid,
        prog: RDMATEST_PROG,
        vers: 1,
        proc_: rdmatest::NULL,
        msg,
        args: &[],
        results: &[],
        reply,
    }
}

#[test]
fn e2e_fault_malformed_header_then_protection_error_ends_only_that_connection() {
    for shared in [false, true] {
        let f = MemFabric::new();
        let mut good = node(soft(&f), 1);
        let mut s = if shared {
            node_shared(soft(&f), 1)
        } else {
            node(soft(&f), 2)
        };
        let addr: SocketAddr = if shared {
            "10.0.1.2:20049"
        } else {
            "10.0.1.1:20049"
        }
        .parse()
        .unwrap();
        let (gconn, gs) = connect(&mut good, &mut s, addr);
        echo_works(&mut good, &mut s, gconn, 1, 5000);
        let blocks = s.drv.free_blocks();
        let sends = s.drv.free_send_buffers();
        let (mut h, hq, hs) = connect_raw_client(&f, &mut s, addr);

        // A malformed header is answered with ERR_CHUNK; the connection stays (R8166-4.5.2-a).
        raw_send(&mut h, hq, 1, &be(&[7, 1, 1, 9, 0, 0, 0, 7, 0]));
        let start = Instant::now();
        let answer = loop {
            hstep(&mut h);
            s.poll();
            if let Some(m) = raw_take_recv(&mut h) {
                break m;
            }
            assert!(start.elapsed() < Duration::from_secs(30));
        };
        assert_eq!(answer, be(&[7, 1, 4, 4, 2]));
        assert!(s.drv.connection(hs).unwrap().closed().is_none());

        // A call whose Read chunk names a key the raw client never exposed: the server's
        // RDMA Read fails at the client's provider, and that connection ends.
        let mut m = be(&[3, 1, 4, 0, 1, 48, 0xbad0_0001, 1500, 0, 0x1000, 0, 0, 0]);
        m.extend(be(&[
            3,
            0,
            2,
            RDMATEST_PROG,
            1,
            rdmatest::WRITE,
            0,
            0,
            0,
            0,
        ]));
        m.extend(be(&[5, 1500]));
        raw_send(&mut h, hq, 2, &m);
        // Meanwhile the good client has a call in flight.
        let data = pattern(9, 3000);
        let gmsg = good.put(&be(&[3000]));
        let gpiece = good.put(&data);
        let (gres, grep) = (good.alloc(3000), good.alloc(64));
        submit(
            &mut good,
            gconn,
            &CallSpec {
                auth: None,
                user: 2,
                xid: 2,
                prog: RDMATEST_PROG,
                vers: 1,
                proc_: rdmatest::ECHO,
                msg: gmsg,
                args: &[ArgPiece {
                    mem: gpiece,
                    xdr_pos: 4,
                }],
                results: &[gres],
                reply: grep,
            },
        );
        let start = Instant::now();
        loop {
            hstep(&mut h);
            good.poll();
            s.poll();
            serve(&mut s);
            let good_done = good
                .events
                .iter()
                .any(|(_, e)| matches!(e, Event::CallDone(d) if d.xid == 2));
            if closed(&s, hs) && good_done {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(60), "fault hangs");
        }
        assert!(s
            .events
            .iter()
            .any(|(id, e)| *id == hs && matches!(e, Event::Closed(CloseReason::WorkFailed(_)))));
        let aborted = s
            .events
            .iter()
            .filter(|(id, e)| *id == hs && matches!(e, Event::ServeAborted { .. }))
            .count();
        assert_eq!(aborted, 1, "the call being pulled is reported once");
        let d = take_done(&mut good, 2).expect("the good call completed");
        assert_eq!(d.status, CallStatus::Ok);
        assert!(good.get(gres) == data);
        // Pools back to their starting counts once the connection is removed.
        s.drv.remove(hs).unwrap();
        assert_eq!(s.drv.free_blocks(), blocks);
        drive(&mut good, &mut s, "send buffers back", |_, s| {
            s.drv.free_send_buffers() == sends
        });
        if shared {
            assert_srq_posted(&f, &mut s, addr, 16);
        }
        echo_works(&mut good, &mut s, gconn, 3, 20_000);
        if !shared {
            assert_eq!(s.drv.connection(gs).unwrap().recv_posted(), 6);
        }
        assert_eq!(good.drv.connection(gconn).unwrap().recv_posted(), 6);
    }
}

/// Node `c` with a connection to server node `s` (the good one) and one to a raw verbs
/// server that misbehaves; returns (c, s, raw side, raw queue pair, good, bad).
fn rig_raw_server(
    f: &MemFabric,
    port: u16,
) -> (Node<Soft>, Node<Soft>, Side<Soft>, QpId, ConnId, ConnId) {
    let mut c = node(soft(f), 2);
    let mut s = node(soft(f), 1);
    let (good, _) = connect(&mut c, &mut s, SocketAddr::from(([10, 0, 2, 1], port)));
    let mut h = Side::new(soft(f));
    let (bad, hq) = connect_raw_server(&mut c, &mut h, SocketAddr::from(([10, 0, 2, 2], port)));
    (c, s, h, hq, good, bad)
}

/// Waits until the raw server got a call; returns its chunk lists' first Write segment and
/// first Read segment.
fn raw_server_call(
    c: &mut Node<Soft>,
    h: &mut Side<Soft>,
) -> (
    Option<rpcrdma_proto::Segment>,
    Option<rpcrdma_proto::Segment>,
) {
    let start = Instant::now();
    let m = loop {
        c.poll();
        hstep(h);
        if let Some(m) = raw_take_recv(h) {
            break m;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no call at the raw server"
        );
    };
    let d = rpcrdma_proto::decode(&m, &rpcrdma_proto::Limits::DEFAULT).expect("our call decodes");
    let rpcrdma_proto::Message::V1(hdr) = d.message else {
        panic!("not v1")
    };
    let rpcrdma_proto::v1::Body::Msg(lists) = hdr.body else {
        panic!("not RDMA_MSG")
    };
    let w = lists
        .writes
        .iter()
        .next()
        .and_then(|ch| ch.segments().next());
    let r = lists.reads.iter().next().map(|r| r.target);
    (w, r)
}

/// The raw peer RDMA-Reads 64 bytes at `addr` under `rkey` into its bytes at `sink`, or
/// RDMA-Writes its 64 bytes at `sink` there, on `qp` (request 78, signalled).
fn raw_access(h: &mut Side<Soft>, qp: QpId, read: bool, addr: u64, rkey: u32, sink: usize) {
    let op = if read {
        SendOp::RdmaRead {
            remote_addr: addr,
            rkey,
        }
    } else {
        SendOp::RdmaWrite {
            remote_addr: addr,
            rkey,
        }
    };
    let sge = h.sge(sink, 64);
    let wr = rpcrdma_verbs::SendWr {
        wr_id: 78,
        op,
        sg: &[sge],
        signaled: true,
    };
    h.p.post_send(qp, &wr).unwrap();
}

/// The raw server RDMA-Writes `len` bytes of 0xee into `seg` (whatever its length).
fn raw_write(h: &mut Side<Soft>, qp: QpId, seg: rpcrdma_proto::Segment, len: usize) {
    h.fill(200_000, &vec![0xee; len]);
    let sge = h.sge(200_000, len);
    h.p.post_send(
        qp,
        &rpcrdma_verbs::SendWr {
            wr_id: 77,
            op: SendOp::RdmaWrite {
                remote_addr: seg.offset,
                rkey: seg.handle,
            },
            sg: &[sge],
            signaled: true,
        },
    )
    .unwrap();
}

/// Drives `c`, `s` and the raw side until `c`'s connection `bad` has closed.
fn until_closed(c: &mut Node<Soft>, s: &mut Node<Soft>, h: &mut Side<Soft>, bad: ConnId) {
    let start = Instant::now();
    while !closed(c, bad) {
        c.poll();
        s.poll();
        serve(s);
        hstep(h);
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the faulty connection never ends"
        );
    }
}

/// After a fault on `bad`: its calls `xids` failed once, the pool block comes back, the
/// good connection still works with its receives all posted.
fn after_fault(
    c: &mut Node<Soft>,
    s: &mut Node<Soft>,
    h: &mut Side<Soft>,
    good: ConnId,
    bad: ConnId,
    xids: &[u32],
) {
    // A few more rounds: nothing is reported twice.
    for _ in 0..50 {
        c.poll();
        s.poll();
        serve(s);
        hstep(h);
    }
    assert_failed_once(c, bad, xids);
    assert_eq!(c.drv.free_blocks(), 0);
    c.drv.remove(bad).unwrap();
    assert_eq!(
        c.drv.free_blocks(),
        1,
        "the faulty connection's block came back"
    );
    echo_works(c, s, good, 900, 40_000);
    assert_eq!(c.drv.connection(good).unwrap().recv_posted(), 6);
    assert_eq!(c.drv.connection(good).unwrap().calls_in_flight(), 0);
}

#[test]
fn e2e_fault_write_chunk_overrun_by_the_peer_ends_the_connection() {
    let f = MemFabric::new();
    let (mut c, mut s, mut h, hq, good, bad) = rig_raw_server(&f, 20049);
    // A READ of 4096 bytes into a Write chunk, then two NULLs queued behind it (one credit
    // until the first reply).
    let result = submit_read(&mut c, bad, 1, 4096);
    // The bytes after the result buffer must never change.
    let after = MemRef::new(result.mr, result.offset + 4096, 4096);
    assert!(c.mem.write(after, &[0x5a; 4096]));
    for x in 2..4 {
        let (msg, reply) = null_spec(&mut c);
        submit(&mut c, bad, &null_call(msg, reply, x));
    }
    let (w, _) = raw_server_call(&mut c, &mut h);
    let seg = w.expect("a Write chunk offered");
    assert_eq!(seg.length, 4096);
    raw_write(&mut h, hq, seg, 8192);
    until_closed(&mut c, &mut s, &mut h, bad);
    assert_eq!(
        c.get(after),
        vec![0x5a; 4096],
        "nothing written past the chunk"
    );
    after_fault(&mut c, &mut s, &mut h, good, bad, &[1, 2, 3]);
}

/// A peer that knows where our memory lies (the Write chunk it was offered says) and has
/// guessed the key of the region around it, not the chunk's: its RDMA Write there and its
/// RDMA Read of our other bytes are refused at the provider, because the memory is
/// registered as the daemon registers it, with no remote right (R8166-8.1.3-a). Nothing of
/// ours is written or read, and only its connection ends.
#[test]
fn e2e_fault_access_under_a_region_key_is_refused() {
    for (k, read) in [(0u16, false), (1, true)] {
        let f = MemFabric::new();
        let (mut c, mut s, mut h, hq, good, bad) = rig_raw_server(&f, 20051 + k);
        let result = submit_read(&mut c, bad, 1, 4096);
        // Bytes of ours near the chunk, which the peer was never offered (what its Read
        // aims at).
        let secret = MemRef::new(result.mr, result.offset + 8192, 4096);
        assert!(c.mem.write(secret, &[0x5a; 4096]));
        let (w, _) = raw_server_call(&mut c, &mut h);
        let seg = w.expect("a Write chunk offered");
        // The soft provider's region key (its lkey and rkey alike).
        let key = c.mem.mr.0;
        assert_ne!(key, seg.handle, "the chunk has a key of its own");
        let sink = 300_000;
        if read {
            raw_access(&mut h, hq, true, seg.offset + 8192, key, sink);
        } else {
            h.fill(sink, &[0xee; 64]);
            raw_access(&mut h, hq, false, seg.offset, key, sink);
        }
        until_closed(&mut c, &mut s, &mut h, bad);
        if read {
            assert!(h.mem(sink, 64).iter().all(|&b| b == 0), "nothing read");
        } else {
            assert_eq!(c.get(result), vec![0; 4096], "nothing written");
        }
        assert_eq!(c.get(secret), vec![0x5a; 4096], "nothing else written");
        after_fault(&mut c, &mut s, &mut h, good, bad, &[1]);
    }
}

/// Selective signalling through the driver: the Sends one batch of inputs makes are posted
/// together at the next poll, and only the last asks for a completion. Four calls (the
/// grant) submitted at once on a warm connection cost the client five completions (four
/// replies and one Send), not eight.
#[test]
fn e2e_a_batch_of_calls_is_posted_with_one_signalled_send() {
    let f = MemFabric::new();
    let (mut c, mut s, g, _) = rig_two(&f, false, 20071);
    let before = c.drv.completions();
    for x in 0..4u32 {
        let (msg, reply) = null_spec(&mut c);
        submit(&mut c, g.0, &null_call(msg, reply, 100 + x));
    }
    let done = |c: &Node<Soft>| {
        c.events
            .iter()
            .filter(|(id, e)| *id == g.0 && matches!(e, Event::CallDone(_)))
            .count()
    };
    drive(&mut c, &mut s, "four replies", |c, _| done(c) == 4);
    for (_, e) in &c.events {
        if let Event::CallDone(d) = e {
            assert_eq!(d.status, CallStatus::Ok);
        }
    }
    assert_eq!(
        c.drv.completions() - before,
        5,
        "four receives and one Send completion"
    );
}

/// R8166-8.1.1-a: a chunk offered on one connection is reached from no other. Our client
/// has two connections to the same raw peer (one protection domain on our side, as a poll
/// thread has); the peer takes the Write chunk offered on the first and RDMA-Writes into it,
/// then the Read chunk and RDMA-Reads it, each from the second connection. Both are refused
/// at the provider: nothing of ours is written or read, only the second connection ends, and
/// the first still owns its chunks: the Write there lands.
#[test]
fn r8166_8_1_1_a_a_chunk_is_refused_on_another_connection() {
    for (k, read) in [(0u16, false), (1, true)] {
        let f = MemFabric::new();
        let mut c = node(soft(&f), 3);
        let mut s = node(soft(&f), 1);
        let port = 20061 + k;
        let (good, _) = connect(&mut c, &mut s, SocketAddr::from(([10, 0, 4, 1], port)));
        let mut h = Side::new(soft(&f));
        let (own, hq_own) =
            connect_raw_server(&mut c, &mut h, SocketAddr::from(([10, 0, 4, 2], port)));
        let (bad, hq_bad) =
            connect_raw_server(&mut c, &mut h, SocketAddr::from(([10, 0, 4, 3], port)));
        let (seg, target) = if read {
            let piece = submit_write(&mut c, own, 1, &[0x5a; 4000]);
            let (_, r) = raw_server_call(&mut c, &mut h);
            (r.expect("a Read chunk offered"), piece)
        } else {
            let result = submit_read(&mut c, own, 1, 4096);
            let (w, _) = raw_server_call(&mut c, &mut h);
            (w.expect("a Write chunk offered"), result)
        };
        let sink = 300_000;
        h.fill(sink, &[0xee; 64]);
        raw_access(&mut h, hq_bad, read, seg.offset, seg.handle, sink);
        until_closed(&mut c, &mut s, &mut h, bad);
        if read {
            assert!(h.mem(sink, 64).iter().all(|&b| b == 0xee), "nothing read");
            assert_eq!(c.get(target), vec![0x5a; 4000], "the chunk is unchanged");
        } else {
            assert_eq!(c.get(target), vec![0; 4096], "nothing written");
        }
        assert!(!closed(&c, own), "the chunk's own connection lives");
        if !read {
            // The key still works on the connection it was offered on.
            raw_write(&mut h, hq_own, seg, 16);
            let start = Instant::now();
            while c.get(target.prefix(16).unwrap()) != vec![0xee; 16] {
                c.poll();
                hstep(&mut h);
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "the Write on the chunk's own connection never landed"
                );
            }
            assert!(!closed(&c, own));
        }
        for _ in 0..50 {
            c.poll();
            s.poll();
            serve(&mut s);
            hstep(&mut h);
        }
        assert_failed_once(&mut c, bad, &[]);
        assert!(!closed(&c, own), "the chunk's own connection still lives");
        echo_works(&mut c, &mut s, good, 900, 40_000);
    }
}

#[test]
fn e2e_fault_write_into_a_read_only_chunk_is_a_protection_error() {
    let f = MemFabric::new();
    let (mut c, mut s, mut h, hq, good, bad) = rig_raw_server(&f, 20050);
    // A WRITE whose 4000 data bytes travel in a Read chunk (remote read only).
    let data = pattern(4, 4000);
    let piece = submit_write(&mut c, bad, 1, &data);
    let (_, r) = raw_server_call(&mut c, &mut h);
    let seg = r.expect("a Read chunk offered");
    raw_write(&mut h, hq, seg, 16);
    until_closed(&mut c, &mut s, &mut h, bad);
    assert!(c.get(piece) == data, "the read-only chunk is untouched");
    let _ = hq;
    after_fault(&mut c, &mut s, &mut h, good, bad, &[1]);
}

/// A client node, a server node, and two connections between them, each as (client's id,
/// server's id): the good one and the one that will fail.
type Rig = (Node<Soft>, Node<Soft>, (ConnId, ConnId), (ConnId, ConnId));

/// Client node `c` with two connections to server node `s`: (good, bad) on each side.
fn rig_two(f: &MemFabric, shared: bool, port: u16) -> Rig {
    let mut c = node(soft(f), 2);
    let mut s = if shared {
        node_shared(soft(f), 1)
    } else {
        node(soft(f), 2)
    };
    let g = connect(&mut c, &mut s, SocketAddr::from(([10, 0, 3, 1], port)));
    let b = connect(&mut c, &mut s, SocketAddr::from(([10, 0, 3, 2], port)));
    // One call each first: both connections have their real credits.
    echo_works(&mut c, &mut s, g.0, 1, 64);
    echo_works(&mut c, &mut s, b.0, 2, 64);
    drive(&mut c, &mut s, "warm-up replies done", |_, s| {
        s.events
            .iter()
            .filter(|(_, e)| matches!(e, Event::ReplyDone { .. }))
            .count()
            == 2
    });
    c.events.clear();
    s.events.clear();
    (c, s, g, b)
}

/// Drives until both ends of `bad` have ended; then checks the calls `xids` of `bad` failed
/// once, the good call `gxid` succeeded, every pool count is back, and `good` still works.
#[allow(clippy::too_many_arguments)]
fn after_disconnect(
    f: &MemFabric,
    port: u16,
    c: &mut Node<Soft>,
    s: &mut Node<Soft>,
    good: (ConnId, ConnId),
    bad: (ConnId, ConnId),
    xids: &[u32],
    gxid: u32,
    sends: usize,
) -> usize {
    drive(c, s, "both ends of the faulty connection end", |c, s| {
        closed(c, bad.0) && closed(s, bad.1)
    });
    drive(c, s, "the good call", |c, _| {
        c.events
            .iter()
            .any(|(_, e)| matches!(e, Event::CallDone(d) if d.xid == gxid))
    });
    for _ in 0..50 {
        c.poll();
        s.poll();
        serve(s);
    }
    assert_failed_once(c, bad.0, xids);
    let d = take_done(c, gxid).unwrap();
    assert_eq!(d.status, CallStatus::Ok);
    // The server reports each call it took in exactly once: aborted (before its reply)
    // or a reply outcome, never both (the warm-up call's report was cleared).
    let mut ends: Vec<rpcrdma_dataplane::ServeId> = s
        .events
        .iter()
        .filter(|(id, _)| *id == bad.1)
        .filter_map(|(_, e)| match e {
            Event::ServeAborted { id } | Event::ReplyDone { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    let n = ends.len();
    ends.sort_by_key(|id| id.to_u32());
    ends.dedup();
    assert_eq!(ends.len(), n, "a call reported twice: {:?}", s.events);
    let received = s.drv.connection(bad.1).unwrap().stats().calls_received;
    assert_eq!(n as u64, received - 1, "every call taken in is reported");
    let aborted = s
        .events
        .iter()
        .filter(|(id, e)| *id == bad.1 && matches!(e, Event::ServeAborted { .. }))
        .count();
    let c_blocks = c.drv.free_blocks();
    let s_blocks = s.drv.free_blocks();
    c.drv.remove(bad.0).unwrap();
    s.drv.remove(bad.1).unwrap();
    assert_eq!(c.drv.free_blocks(), c_blocks + 1);
    assert_eq!(s.drv.free_blocks(), s_blocks + 1);
    drive(c, s, "shared send buffers back", |_, s| {
        s.drv.free_send_buffers() == sends
    });
    if sends > 0 {
        assert_srq_posted(f, s, SocketAddr::from(([10, 0, 3, 1], port)), 16);
    }
    echo_works(c, s, good.0, 950, 40_000);
    assert_eq!(c.drv.connection(good.0).unwrap().recv_posted(), 6);
    if sends == 0 {
        assert_eq!(s.drv.connection(good.1).unwrap().recv_posted(), 6);
    }
    aborted
}

/// The good connection's call, in flight while the fault happens.
fn good_call(c: &mut Node<Soft>, good: ConnId, xid: u32) {
    let data = pattern(xid, 3000);
    let msg = c.put(&be(&[3000]));
    let piece = c.put(&data);
    let (result, reply) = (c.alloc(3000), c.alloc(64));
    submit(
        c,
        good,
        &CallSpec {
            auth: None,
            user: u64::from(xid),
            xid,
            prog: RDMATEST_PROG,
            vers: 1,
            proc_: rdmatest::ECHO,
            msg,
            args: &[ArgPiece {
                mem: piece,
                xdr_pos: 4,
            }],
            results: &[result],
            reply,
        },
    );
}

#[test]
fn e2e_fault_disconnect_during_rdma_read() {
    for shared in [false, true] {
        let f = MemFabric::new();
        let (mut c, mut s, good, bad) = rig_two(&f, shared, 20051);
        let sends = s.drv.free_send_buffers();
        // WRITE of 768 KiB: the server pulls it with RDMA Read.
        let big = 768u32 << 10;
        c.bump = c.base;
        let msg = c.put(&be(&[11, big]));
        let piece = c.put(&pattern(11, big as usize));
        let reply = c.alloc(64);
        submit(
            &mut c,
            bad.0,
            &CallSpec {
                auth: None,
                user: 10,
                xid: 10,
                prog: RDMATEST_PROG,
                vers: 1,
                proc_: rdmatest::WRITE,
                msg,
                args: &[ArgPiece {
                    mem: piece,
                    xdr_pos: 8,
                }],
                results: &[],
                reply,
            },
        );
        let (nmsg, nreply) = null_spec(&mut c);
        let null = null_call(nmsg, nreply, 11);
        submit(&mut c, bad.0, &null);
        good_call(&mut c, good.0, 12);
        // Run until the server has posted its RDMA Read, and not a step further on the
        // client (which would answer it).
        serve_until(&mut c, &mut s, |s| {
            s.drv.connection(bad.1).unwrap().stats().read_bytes > 0
        });
        // The link drops under the client's queue pair.
        let qp = qp_of(&c, bad.0);
        c.drv.provider_mut().disconnect(qp).unwrap();
        let aborted = after_disconnect(&f, 20051, &mut c, &mut s, good, bad, &[10, 11], 12, sends);
        // The WRITE was cut off while its arguments were being pulled (the NULL behind it
        // may have been aborted too, or answered).
        assert!((1..=2).contains(&aborted), "shared {shared}");
    }
}

#[test]
fn e2e_fault_disconnect_during_rdma_write() {
    for shared in [false, true] {
        let f = MemFabric::new();
        let (mut c, mut s, good, bad) = rig_two(&f, shared, 20052);
        let sends = s.drv.free_send_buffers();
        // READ of 768 KiB: the server pushes it with RDMA Write into the Write chunk.
        let big = 768u32 << 10;
        c.bump = c.base;
        let (msg, result, reply) = read_spec(&mut c, big);
        submit(
            &mut c,
            bad.0,
            &CallSpec {
                auth: None,
                user: 20,
                xid: 20,
                prog: RDMATEST_PROG,
                vers: 1,
                proc_: rdmatest::READ,
                msg,
                args: &[],
                results: &[result],
                reply,
            },
        );
        good_call(&mut c, good.0, 21);
        // Run until the server has posted its RDMA Writes and the reply, and not a step
        // further on the client (which would take them in).
        serve_until(&mut c, &mut s, |s| {
            s.drv.connection(bad.1).unwrap().stats().write_bytes > 0
        });
        let qp = qp_of(&c, bad.0);
        c.drv.provider_mut().disconnect(qp).unwrap();
        let aborted = after_disconnect(&f, 20052, &mut c, &mut s, good, bad, &[20], 21, sends);
        // The READ was cut off after its reply was posted: a reply outcome, not an abort.
        assert_eq!(aborted, 0, "shared {shared}");
    }
}

/// Proves the shared receive queue of server node `s` has exactly `n` buffers posted: raw
/// clients send `n + 1` calls that are never accepted, so each one that arrives keeps its
/// buffer; exactly `n` arrive, and the last call finds no buffer (its connection ends). The
/// raw connections are then closed, which gives the buffers back.
fn assert_srq_posted(f: &MemFabric, s: &mut Node<Soft>, addr: SocketAddr, n: usize) {
    let per = template().credits as usize;
    let mut raws = Vec::new();
    let mut left = n + 1;
    let mut xid = 5000u32;
    while left > 0 {
        let k = left.min(per);
        let (mut h, qp, sc) = connect_raw_client(f, s, addr);
        for i in 0..k {
            let mut m = be(&[xid, 1, 4, 0, 0, 0, 0]);
            m.extend(be(&[xid, 0, 2, BULK_PROG, 1, 1, 0, 0, 0, 0]));
            let off = 100_000 + 4096 * i;
            h.fill(off, &m);
            let sge = h.sge(off, m.len());
            h.p.post_send(
                qp,
                &rpcrdma_verbs::SendWr {
                    wr_id: u64::from(xid),
                    op: SendOp::Send,
                    sg: &[sge],
                    signaled: true,
                },
            )
            .unwrap();
            xid += 1;
        }
        raws.push((h, sc));
        left -= k;
    }
    let ids: Vec<ConnId> = raws.iter().map(|r| r.1).collect();
    let arrived = |s: &Node<Soft>| {
        s.events
            .iter()
            .filter(|(id, e)| ids.contains(id) && matches!(e, Event::IncomingCall(_)))
            .count()
    };
    let start = Instant::now();
    while arrived(s) < n {
        for (h, _) in &mut raws {
            hstep(h);
        }
        s.poll();
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "only {} of {n} calls found a posted receive",
            arrived(s)
        );
    }
    // Let the last call land if a buffer were there for it (a counted number of rounds).
    for _ in 0..200 {
        for (h, _) in &mut raws {
            hstep(h);
        }
        s.poll();
    }
    assert_eq!(arrived(s), n, "exactly {n} receives were posted");
    for &id in &ids {
        s.drv.close(id, CloseReason::Requested, &mut s.mem);
        s.drv.remove(id).unwrap();
    }
    s.events.retain(|(id, _)| !ids.contains(id));
}

/// A NULL call of `c` on `conn` with XID `xid`, left in flight (its Send posted).
fn null_in_flight(c: &mut Node<Soft>, conn: ConnId, xid: u32) {
    let (msg, reply) = null_spec(c);
    submit(c, conn, &null_call(msg, reply, xid));
    c.drv.post_pending();
}

/// Moves the driver's events to `c.events`; true if one of them is `conn`'s.
fn take_events(c: &mut Node<Soft>, conn: ConnId) -> bool {
    let before = c.events.len();
    while let Some(e) = c.drv.poll_event() {
        c.events.push(e);
    }
    c.events[before..].iter().any(|(id, _)| *id == conn)
}

/// A closed connection's calls end only once the device is done with its send queue: their
/// ends give the apps their memory back, which a Read still in the device could write. The
/// driver drains the send queue after the disconnect (a marker that the device reports after
/// everything posted before it) and holds the connection's events until the marker is
/// reported; if it never is, until `DRAIN_WAIT` has passed; `remove` (the queue pair is
/// destroyed) hands them over at once. Each way, every call ends exactly once.
#[test]
fn e2e_a_closed_connections_calls_end_once_its_send_queue_is_drained() {
    use rpcrdma_dataplane::driver::DRAIN_WAIT;
    let f = MemFabric::new();
    let mut c = node(soft(&f), 3);
    let mut s = node(soft(&f), 3);
    let [g, b, t] = [1u8, 2, 3].map(|k| {
        let conn = connect(&mut c, &mut s, SocketAddr::from(([10, 0, 3, k], 20081))).0;
        echo_works(&mut c, &mut s, conn, u32::from(k), 64);
        conn
    });
    c.events.clear();

    // The marker is reported (the soft provider flushes it as it is posted, so at the next
    // poll of the completion queue).
    null_in_flight(&mut c, g, 11);
    c.drv.close(g, CloseReason::Requested, &mut c.mem);
    assert!(!take_events(&mut c, g), "no end before the drain marker");
    c.poll();
    assert!(closed(&c, g));
    assert_failed_once(&mut c, g, &[11]);

    // The marker is never reported (taken from the completion queue behind the driver's
    // back, as by a device that loses it): the events go once DRAIN_WAIT has passed.
    null_in_flight(&mut c, b, 12);
    c.drv.close(b, CloseReason::Requested, &mut c.mem);
    let cq = c.drv.cq();
    let mut wcs = [rpcrdma_verbs::WorkCompletion::default(); 64];
    let n = c.drv.provider_mut().poll_cq(cq, &mut wcs).unwrap();
    assert!(
        wcs[..n].iter().any(|w| w.wr_id as u32 == u32::MAX),
        "the drain marker: {:?}",
        &wcs[..n]
    );
    let now = Instant::now();
    c.drv.poll(now, &mut c.mem);
    assert!(!take_events(&mut c, b), "held while the marker may come");
    assert_eq!(c.drv.drains_overdue(), 0);
    c.drv.poll(now + DRAIN_WAIT, &mut c.mem);
    assert!(take_events(&mut c, b));
    assert_eq!(c.drv.drains_overdue(), 1);
    assert_failed_once(&mut c, b, &[12]);

    // Removed before the marker is polled: the events come with `remove`, and the marker's
    // late completion (of a connection that is gone) changes nothing.
    null_in_flight(&mut c, t, 13);
    c.drv.close(t, CloseReason::Requested, &mut c.mem);
    c.drv.remove(t).unwrap();
    assert!(take_events(&mut c, t));
    c.poll();
    assert_failed_once(&mut c, t, &[13]);
    assert!(closed(&c, t));
    assert_eq!(c.drv.drains_overdue(), 1);
}
