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
    ArgPiece, CallDone, CallSpec, CallStatus, CloseReason, ConnConfig, ConnId, ConnTemplate,
    Driver, Event, MemRef, Memory, ReplySpec, ResultPiece, Role, SubmitError,
};
use rpcrdma_proto::cm::PrivateData;
use rpcrdma_proto::ulb::{rdmatest, RDMATEST_PROG};
use rpcrdma_verbs::conformance::{Side, GUARD};
use rpcrdma_verbs::soft::link::MemFabric;
use rpcrdma_verbs::soft::{SoftConfig, SoftProvider};
use rpcrdma_verbs::{CmEvent, ConnParams, MrId, PdId, Provider, QpId, QpInit, SendOp};

const BULK_PROG: u32 = 0x4000_0000;

/// The registered bytes of a conformance `Side` (region = `buf[GUARD..GUARD + len]`).
#[derive(Debug)]
struct BufMem {
    mr: MrId,
    buf: Vec<u8>,
    len: u64,
}

impl BufMem {
    fn range(&self, at: MemRef) -> Option<std::ops::Range<usize>> {
        if at.mr != self.mr {
            return None;
        }
        let end = at.offset.checked_add(u64::from(at.len))?;
        if end > self.len {
            return None;
        }
        Some(GUARD + at.offset as usize..GUARD + end as usize)
    }
}

impl Memory for BufMem {
    fn read(&self, at: MemRef, dst: &mut [u8]) -> bool {
        match self
            .range(at)
            .and_then(|r| self.buf.get(r))
            .and_then(|s| s.get(..dst.len()))
        {
            Some(s) => {
                dst.copy_from_slice(s);
                true
            }
            None => false,
        }
    }
    fn write(&mut self, at: MemRef, src: &[u8]) -> bool {
        let Some(r) = self.range(at) else {
            return false;
        };
        match self.buf.get_mut(r).and_then(|d| d.get_mut(..src.len())) {
            Some(d) => {
                d.copy_from_slice(src);
                true
            }
            None => false,
        }
    }
    fn copy(&mut self, from: MemRef, to: MemRef) -> bool {
        let (Some(f), Some(t)) = (self.range(from), self.range(to)) else {
            return false;
        };
        if f.len() > t.len() {
            return false;
        }
        self.buf.copy_within(f, t.start);
        true
    }
}

struct Node<P: Provider> {
    drv: Driver<P>,
    mem: BufMem,
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
    let Side {
        p, pd, cq, buf, mr, ..
    } = Side::new(p);
    let tmpl = template();
    let pool = MemRef::new(mr.id, 0, tmpl.block_len().unwrap() * blocks);
    let base = u64::from(pool.len).div_ceil(4096) * 4096;
    let drv = Driver::new(p, cq, mr, pool, tmpl).expect("driver");
    Node {
        drv,
        mem: BufMem {
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
    } = Side::new(p);
    let tmpl = template();
    let _ = blocks;
    let send = ConnConfig::send_pool_len(24, tmpl.send_size).unwrap();
    let pool = MemRef::new(mr.id, 0, send);
    let srq_pool = MemRef::new(mr.id, u64::from(pool.len), 16 * tmpl.recv_size);
    let base = (u64::from(pool.len) + u64::from(srq_pool.len)).div_ceil(4096) * 4096;
    let drv = Driver::new_shared(p, cq, pd, mr, pool, true, srq_pool, 16, tmpl).expect("driver");
    Node {
        drv,
        mem: BufMem {
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
    let ca = c
        .drv
        .add_connection(qa, Role::Client, None, &mut c.mem)
        .expect("add a");
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
    let cb = s
        .drv
        .add_connection(qb, Role::Server, peer, &mut s.mem)
        .expect("add b");
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
                PEND.with(|m| m.borrow_mut().push((c.id, c.prog, c.proc_, buf)));
                s.drv
                    .accept_call(conn, c.id, buf, &mut s.mem)
                    .expect("accept");
            }
            Event::ArgsReady { id, args_len } => {
                let (prog, proc_, buf) = PEND.with(|m| {
                    let mut m = m.borrow_mut();
                    let i = m.iter().position(|e| e.0 == id).unwrap();
                    let e = m.remove(i);
                    (e.1, e.2, e.3)
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
                s.drv
                    .submit_reply(conn, id, &spec, &mut s.mem)
                    .expect("reply");
            }
            other => s.events.push((conn, other)),
        }
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

thread_local! {
    static PEND: std::cell::RefCell<Vec<(rpcrdma_dataplane::ServeId, u32, u32, MemRef)>> =
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
    let d = run_call(
        &mut c,
        &mut s,
        conn,
        &CallSpec {
            user: 1,
            xid: 1,
            prog: RDMATEST_PROG,
            vers: 1,
            proc_: rdmatest::NULL,
            msg,
            args: &[],
            results: &[],
            reply,
        },
    );
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
    assert_eq!((d.status, d.results()), (CallStatus::Ok, &[(4, big)][..]));
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
    let mut h = Side::new(SoftProvider::memory(&f, SoftConfig::default()));
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
    let pd = template().private_data().emit();
    let params = ConnParams {
        private_data: &pd,
        responder_resources: 16,
        initiator_depth: 16,
    };
    h.p.connect(qp, addr, &params).unwrap();
    let start = Instant::now();
    let mut hconn = None;
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
            hconn = Some(
                s.drv
                    .add_connection(qb, Role::Server, None, &mut s.mem)
                    .unwrap(),
            );
            s.drv.provider_mut().accept(req, qb, &params).unwrap();
        }
        assert!(start.elapsed() < Duration::from_secs(30));
    }
    let hconn = hconn.unwrap();
    assert_eq!(s.drv.free_blocks(), 0);
    let send = |h: &mut Side<rpcrdma_verbs::soft::SoftMem>, id: u64, bytes: &[u8]| {
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
    };
    // Malformed headers: answered with ERR_CHUNK, the connection stays.
    send(&mut h, 1, &be(&[7, 1, 1, 9, 0, 0, 0, 7, 0]));
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
        send(&mut h, 10 + u64::from(x), &m);
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
    assert_eq!((d.status, d.results()), (CallStatus::Ok, &[(4, 5000)][..]));
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
    let spec = CallSpec {
        user: 1,
        xid: 1,
        prog: RDMATEST_PROG,
        vers: 1,
        proc_: rdmatest::NULL,
        msg,
        args: &[],
        results: &[],
        reply,
    };
    c.drv.submit_call(conn, &spec, &mut c.mem).unwrap();
    c.poll();
    assert!(c
        .events
        .iter()
        .any(|(id, e)| *id == conn && *e == Event::Closed(CloseReason::Local("post failed"))));
    let d = take_done(&mut c, 1).expect("the call is reported");
    assert_eq!(d.status, CallStatus::Closed);
}
