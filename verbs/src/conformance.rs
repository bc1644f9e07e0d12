//! Provider conformance suite, written once and run against every provider.
//!
//! A [`Harness`] makes two providers that can reach each other; each check builds a fresh
//! connected pair through the boundary only (listen, connect with private data, accept),
//! drives both providers from the calling thread, and panics with a message when the
//! provider misbehaves. [`conformance_tests!`](crate::conformance_tests) turns the checks
//! into `#[test]` functions for one harness.
//!
//! What a NIC may legitimately do differently is allowed where it matters: a refused RDMA
//! Write shows either as an error completion of that Write or as the requester's queue pair
//! going to error (iWARP completes a Write before the peer checked it).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::{
    Access, CmEvent, ConnParams, ConnReqId, ConnectFailure, CqId, DeviceEvents, Error, Mr, PdId,
    Provider, QpId, QpInit, QpState, SendOp, SendWr, Sge, SrqId, WcOpcode, WcStatus,
    WorkCompletion,
};

/// Makes providers for the suite.
pub trait Harness {
    /// The provider under test.
    type P: Provider;
    /// Two fresh providers that can connect to each other (the second listens).
    fn pair(&mut self) -> (Self::P, Self::P);
    /// Where the listening provider listens (port 0 allowed).
    fn listen_addr(&self) -> SocketAddr;
}

/// Bytes of each side's test buffer, guards included.
pub const BUF_LEN: usize = 1 << 20;
/// Unregistered guard bytes at each end of the buffer; they must never change.
pub const GUARD: usize = 4096;
const GUARD_BYTE: u8 = 0xee;
/// RFC 8797 private data as Linux xprtrdma sends it.
pub const CLIENT_PD: [u8; 8] = [0xf6, 0xab, 0x0e, 0x18, 0x01, 0x01, 0x03, 0x03];
/// RFC 8797 private data as Linux svcrdma sends it.
pub const SERVER_PD: [u8; 8] = [0xf6, 0xab, 0x0e, 0x18, 0x01, 0x00, 0x03, 0x03];

/// One endpoint: provider, resources, its buffer, and what it has seen.
#[derive(Debug)]
pub struct Side<P> {
    /// The provider.
    pub p: P,
    /// Protection domain.
    pub pd: PdId,
    /// Completion queue for sends and receives.
    pub cq: CqId,
    /// Connected queue pairs (the first one is the pair's main connection).
    pub qps: Vec<QpId>,
    /// Shared receive queue, if the side uses one.
    pub srq: Option<SrqId>,
    /// Test memory; the registered region excludes the guards.
    pub buf: Vec<u8>,
    /// The registered region (all rights, unless made [`with_access`](Side::with_access)).
    pub mr: Mr,
    /// Completions seen so far.
    pub wcs: Vec<WorkCompletion>,
    /// Connection events seen so far.
    pub events: Vec<CmEvent>,
}

impl<P: Provider> Side<P> {
    /// Set up a side on `p`: PD, one CQ, a guarded buffer registered with all rights.
    pub fn new(p: P) -> Side<P> {
        Side::with_access(
            p,
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
        )
    }

    /// [`new`](Side::new), with the buffer registered with `access` (for instance
    /// `LOCAL_WRITE | BIND`, as the daemon registers its memory: reached remotely only
    /// through exposures).
    pub fn with_access(mut p: P, access: Access) -> Side<P> {
        let pd = p.alloc_pd().expect("alloc_pd");
        let cq = p.create_cq(1024).expect("create_cq");
        let mut buf = vec![GUARD_BYTE; BUF_LEN];
        let len = BUF_LEN - 2 * GUARD;
        // SAFETY: the region lies inside `buf`, which is never resized or dropped while the
        // side (and so the provider) lives; the side is dropped with its provider.
        let mr =
            unsafe { p.register(pd, buf.as_mut_ptr().add(GUARD), len, access) }.expect("register");
        for b in &mut buf[GUARD..BUF_LEN - GUARD] {
            *b = 0;
        }
        Side {
            p,
            pd,
            cq,
            qps: Vec::new(),
            srq: None,
            buf,
            mr,
            wcs: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Main queue pair.
    pub fn qp(&self) -> QpId {
        self.qps[0]
    }

    /// An SGE for `len` bytes at region offset `off`.
    pub fn sge(&self, off: usize, len: usize) -> Sge {
        Sge {
            addr: self.mr.addr_at(off as u64),
            len: len as u32,
            lkey: self.mr.lkey,
        }
    }

    /// Region bytes at `off`.
    pub fn mem(&self, off: usize, len: usize) -> &[u8] {
        &self.buf[GUARD + off..GUARD + off + len]
    }

    /// Fill region bytes at `off`.
    pub fn fill(&mut self, off: usize, data: &[u8]) {
        self.buf[GUARD + off..GUARD + off + data.len()].copy_from_slice(data);
    }

    fn guards_intact(&self) -> bool {
        self.buf[..GUARD].iter().all(|&b| b == GUARD_BYTE)
            && self.buf[BUF_LEN - GUARD..].iter().all(|&b| b == GUARD_BYTE)
    }

    /// What the side's queue pairs are created with (its CQ for both queues, its SRQ).
    pub fn qp_init(&self) -> QpInit {
        QpInit {
            pd: self.pd,
            send_cq: self.cq,
            recv_cq: self.cq,
            srq: self.srq,
            max_send_wr: 64,
            max_recv_wr: 64,
            max_sge: 4,
        }
    }

    /// Start connecting `qp` to `addr` as xprtrdma would (its private data, depths of 16).
    fn start_connect(&mut self, qp: QpId, addr: SocketAddr) {
        let params = ConnParams {
            private_data: &CLIENT_PD,
            responder_resources: 16,
            initiator_depth: 16,
        };
        self.p.connect(qp, addr, &params).expect("connect");
    }

    fn step(&mut self) {
        while let Some(e) = self.p.poll_cm() {
            self.events.push(e);
        }
        let mut w = [WorkCompletion::default(); 16];
        let n = self.p.poll_cq(self.cq, &mut w).expect("poll_cq");
        self.wcs.extend_from_slice(&w[..n]);
    }

    /// Receive completions seen so far.
    pub fn recvs_seen(&self) -> usize {
        self.wcs
            .iter()
            .filter(|w| w.opcode == WcOpcode::Recv)
            .count()
    }

    /// The completion of `wr_id`, if seen.
    pub fn wc(&self, wr_id: u64) -> Option<WorkCompletion> {
        self.wcs.iter().copied().find(|w| w.wr_id == wr_id)
    }

    fn disconnected(&self, qp: QpId) -> bool {
        self.events
            .iter()
            .any(|e| matches!(e, CmEvent::Disconnected { qp: q } if *q == qp))
    }

    /// Post on the main queue pair.
    pub fn post(&mut self, wr_id: u64, op: SendOp, sg: &[Sge], signaled: bool) {
        let qp = self.qp();
        self.p
            .post_send(
                qp,
                &SendWr {
                    wr_id,
                    op,
                    sg,
                    signaled,
                },
            )
            .expect("post_send");
    }

    /// Post a signaled Send of `len` bytes at region offset `off` on queue pair `qp`.
    pub fn send_on(&mut self, qp: QpId, wr_id: u64, off: usize, len: usize) {
        self.try_send_on(qp, wr_id, off, len).expect("post_send");
    }

    /// [`send_on`](Self::send_on), returning the provider's answer to the post.
    pub fn try_send_on(
        &mut self,
        qp: QpId,
        wr_id: u64,
        off: usize,
        len: usize,
    ) -> crate::Result<()> {
        let s = [self.sge(off, len)];
        let wr = SendWr {
            wr_id,
            op: SendOp::Send,
            sg: &s,
            signaled: true,
        };
        self.p.post_send(qp, &wr)
    }

    /// Post a receive (to the SRQ if the side has one).
    pub fn recv(&mut self, wr_id: u64, sg: &[Sge]) {
        match self.srq {
            Some(s) => self.p.post_srq_recv(s, wr_id, sg).expect("post_srq_recv"),
            None => {
                let qp = self.qp();
                self.p.post_recv(qp, wr_id, sg).expect("post_recv")
            }
        }
    }
}

/// Two connected sides: `a` connected to `b` (which listened and accepted).
#[derive(Debug)]
pub struct Pair<P> {
    /// The connecting side.
    pub a: Side<P>,
    /// The accepting side.
    pub b: Side<P>,
    /// Where `b` listens.
    pub addr: SocketAddr,
}

const DEADLINE: Duration = Duration::from_secs(20);

impl<P: Provider> Pair<P> {
    /// Drive both providers until `done` holds (panics with `what` after a generous deadline,
    /// a hang guard, not a timing assertion).
    pub fn wait(&mut self, what: &str, done: impl Fn(&Pair<P>) -> bool) {
        let start = Instant::now();
        loop {
            self.a.step();
            self.b.step();
            if done(self) {
                return;
            }
            if start.elapsed() > DEADLINE {
                panic!(
                    "timed out waiting for {what}\n a events {:?}\n a wcs {:?}\n b events {:?}\n b wcs {:?}",
                    self.a.events, self.a.wcs, self.b.events, self.b.wcs
                );
            }
            std::thread::yield_now();
        }
    }

    /// Drive both providers a while (to let anything that would happen, happen).
    pub fn settle(&mut self) {
        for _ in 0..2000 {
            self.a.step();
            self.b.step();
        }
    }
}

/// Two connections onto one SRQ on `b` (the first connected first), with four 256-byte
/// receives posted to it (`wr_id` 100..104 at region offsets 0, 256, 512, 768).
pub fn connect_two_on_srq<H: Harness>(h: &mut H) -> Pair<H::P> {
    let mut p = connect(h, true);
    let addr = p.addr;
    connect_one(&mut p, addr);
    for i in 0..4 {
        p.b.recv(100 + i, &[p.b.sge(i as usize * 256, 256)]);
    }
    p
}

/// Build two sides and connect them (with an SRQ on `b` if `srq`), checking private data.
pub fn connect<H: Harness>(h: &mut H, srq: bool) -> Pair<H::P> {
    let (pa, pb) = h.pair();
    let a = Side::new(pa);
    let mut b = Side::new(pb);
    if srq {
        b.srq = Some(b.p.create_srq(b.pd, 256, 4).expect("create_srq"));
    }
    let l = b.p.listen(h.listen_addr()).expect("listen");
    let addr = b.p.listen_addr(l).expect("listen_addr");
    let mut pair = Pair { a, b, addr };
    connect_one(&mut pair, addr);
    pair
}

fn connect_one<P: Provider>(pair: &mut Pair<P>, addr: SocketAddr) {
    let cq = pair.a.cq;
    connect_one_on(pair, addr, cq);
}

/// [`connect_one`], with the connecting side's new queue pair on completion queue `cq`.
fn connect_one_on<P: Provider>(pair: &mut Pair<P>, addr: SocketAddr, cq: CqId) {
    let init = QpInit {
        send_cq: cq,
        recv_cq: cq,
        ..pair.a.qp_init()
    };
    let qa = pair.a.p.create_qp(&init).expect("create_qp a");
    assert_eq!(pair.a.p.qp_state(qa).unwrap(), QpState::Init);
    pair.a.start_connect(qa, addr);
    let seen = pair.b.events.len();
    pair.wait("connect request", |p| {
        p.b.events[seen..]
            .iter()
            .any(|e| matches!(e, CmEvent::ConnectRequest { .. }))
    });
    let (req, pd, remote) = pair.b.events[seen..]
        .iter()
        .find_map(|e| match e {
            CmEvent::ConnectRequest {
                req,
                private_data,
                remote,
                ..
            } => Some((*req, *private_data, *remote)),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        pd.as_slice(),
        &CLIENT_PD,
        "connect private data arrives intact"
    );
    // A transport with addresses names the connecting side: another port than the
    // listener's own (the two ends may share an IP address, on loopback or in one host).
    if let Some(r) = remote {
        assert!(
            r.port() != 0 && r.port() != addr.port(),
            "connect request from {r}, listener {addr}"
        );
    }
    accept_onto_b(pair, req, qa);
}

/// `b` accepts request `req` onto a new queue pair (with [`SERVER_PD`]); both sides come up,
/// `a`'s queue pair `qa` with that private data intact, and each side keeps its queue pair.
fn accept_onto_b<P: Provider>(pair: &mut Pair<P>, req: ConnReqId, qa: QpId) {
    let init = pair.b.qp_init();
    let qb = pair.b.p.create_qp(&init).expect("create_qp b");
    pair.b
        .p
        .accept(
            req,
            qb,
            &ConnParams {
                private_data: &SERVER_PD,
                responder_resources: 16,
                initiator_depth: 16,
            },
        )
        .expect("accept");
    pair.wait("established on both sides", |p| {
        p.a.events
            .iter()
            .any(|e| matches!(e, CmEvent::Established { qp, .. } if *qp == qa))
            && p.b
                .events
                .iter()
                .any(|e| matches!(e, CmEvent::Established { qp, .. } if *qp == qb))
    });
    let apd = pair
        .a
        .events
        .iter()
        .find_map(|e| match e {
            CmEvent::Established { qp, private_data } if *qp == qa => Some(*private_data),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        apd.as_slice(),
        &SERVER_PD,
        "accept private data arrives intact"
    );
    assert_eq!(pair.a.p.qp_state(qa).unwrap(), QpState::ReadyToSend);
    pair.a.qps.push(qa);
    pair.b.qps.push(qb);
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Connect and exchange private data both ways (checked inside [`connect`]); reject too.
pub fn cm_private_data_and_reject<H: Harness>(h: &mut H) {
    let pair = connect(h, false);
    drop(pair);
    let (pa, pb) = h.pair();
    let mut b = Side::new(pb);
    let l = b.p.listen(h.listen_addr()).unwrap();
    let addr = b.p.listen_addr(l).unwrap();
    let mut pair = Pair {
        a: Side::new(pa),
        b,
        addr,
    };
    let init = pair.a.qp_init();
    let qa = pair.a.p.create_qp(&init).unwrap();
    pair.a
        .p
        .connect(
            qa,
            addr,
            &ConnParams {
                private_data: &CLIENT_PD,
                responder_resources: 1,
                initiator_depth: 0,
            },
        )
        .unwrap();
    pair.wait("connect request", |p| {
        p.b.events
            .iter()
            .any(|e| matches!(e, CmEvent::ConnectRequest { .. }))
    });
    let req = pair
        .b
        .events
        .iter()
        .find_map(|e| match e {
            CmEvent::ConnectRequest { req, .. } => Some(*req),
            _ => None,
        })
        .unwrap();
    pair.b.p.reject(req, b"no thanks").unwrap();
    pair.wait("rejected", |p| {
        p.a.events
            .iter()
            .any(|e| matches!(e, CmEvent::Rejected { .. }))
    });
    let rpd = pair
        .a
        .events
        .iter()
        .find_map(|e| match e {
            CmEvent::Rejected { qp, private_data } if *qp == qa => Some(*private_data),
            _ => None,
        })
        .expect("Rejected names the queue pair");
    assert_eq!(rpd.as_slice(), b"no thanks");
    assert_eq!(pair.a.p.qp_state(qa).unwrap(), QpState::Error);
}

/// Connecting where nothing listens (any more) fails as unreachable, naming the queue pair,
/// which is then in error.
pub fn connect_where_nothing_listens_is_unreachable<H: Harness>(h: &mut H) {
    let (pa, pb) = h.pair();
    let mut b = Side::new(pb);
    let l = b.p.listen(h.listen_addr()).unwrap();
    let addr = b.p.listen_addr(l).unwrap();
    b.p.close_listener(l).unwrap();
    let mut pair = Pair {
        a: Side::new(pa),
        b,
        addr,
    };
    let init = pair.a.qp_init();
    let qa = pair.a.p.create_qp(&init).unwrap();
    let params = ConnParams {
        private_data: &CLIENT_PD,
        responder_resources: 1,
        initiator_depth: 1,
    };
    pair.a.p.connect(qa, addr, &params).unwrap();
    pair.wait("connect error", |p| {
        p.a.events
            .iter()
            .any(|e| matches!(e, CmEvent::ConnectError { .. }))
    });
    assert_eq!(
        pair.a.events,
        [CmEvent::ConnectError {
            qp: qa,
            cause: ConnectFailure::Unreachable
        }]
    );
    assert_eq!(pair.a.p.qp_state(qa).unwrap(), QpState::Error);
    assert!(
        !pair
            .b
            .events
            .iter()
            .any(|e| matches!(e, CmEvent::ConnectRequest { .. })),
        "a closed listener hears nothing"
    );
}

/// Sends land in posted receives in order, with their lengths and bytes; sends complete in order.
pub fn send_recv_matching_and_ordering<H: Harness>(h: &mut H) {
    let mut p = connect(h, false);
    for i in 0..4u64 {
        let s = p.b.sge(i as usize * 1024, 1024);
        p.b.recv(100 + i, &[s]);
    }
    let mut sent = Vec::new();
    for i in 0..4u64 {
        let len = 10 + 100 * i as usize;
        let data = pattern(i as u8, len);
        p.a.fill(i as usize * 1024, &data);
        let s = p.a.sge(i as usize * 1024, len);
        p.a.post(i, SendOp::Send, &[s], true);
        sent.push(data);
    }
    p.wait("4 receives and 4 send completions", |p| {
        p.b.wcs.len() >= 4 && p.a.wcs.len() >= 4
    });
    for (i, data) in sent.iter().enumerate() {
        let r = p.b.wcs[i];
        assert_eq!(
            r.wr_id,
            100 + i as u64,
            "receives consumed in posting order"
        );
        assert_eq!(r.status, WcStatus::Success);
        assert_eq!(r.opcode, WcOpcode::Recv);
        assert_eq!(r.byte_len as usize, data.len());
        assert_eq!(r.qp, p.b.qp());
        assert_eq!(r.invalidated_rkey, None);
        assert_eq!(p.b.mem(i * 1024, data.len()), &data[..]);
        let s = p.a.wcs[i];
        assert_eq!(
            (s.wr_id, s.status, s.opcode),
            (i as u64, WcStatus::Success, WcOpcode::Send)
        );
    }
}

/// A gather list of several entries arrives as one message; a multi-FPDU Send is reassembled.
pub fn send_gather_and_large_message<H: Harness>(h: &mut H) {
    let mut p = connect(h, false);
    let big = pattern(7, 200_000);
    p.a.fill(0, &big[..100_000]);
    p.a.fill(300_000, &big[100_000..]);
    let sg = [p.a.sge(0, 100_000), p.a.sge(300_000, 100_000)];
    let r = [p.b.sge(0, 150_000), p.b.sge(500_000, 60_000)];
    p.b.recv(1, &r);
    p.a.post(9, SendOp::Send, &sg, true);
    p.wait("large receive", |p| {
        p.b.wc(1).is_some() && p.a.wc(9).is_some()
    });
    let w = p.b.wc(1).unwrap();
    assert_eq!((w.status, w.byte_len), (WcStatus::Success, 200_000));
    assert_eq!(p.b.mem(0, 150_000), &big[..150_000]);
    assert_eq!(p.b.mem(500_000, 50_000), &big[150_000..]);
    assert_eq!(
        p.b.mem(550_000, 10_000),
        &[0u8; 10_000][..],
        "nothing beyond the message"
    );
}

/// Data of an RDMA Write is visible at the target when a later Send's receive completes.
pub fn write_then_send_visibility<H: Harness>(h: &mut H) {
    let mut p = connect(h, false);
    let qb = p.b.qp();
    let rkey =
        p.b.p
            .expose(qb, p.b.mr.id, 65536, 300_000, Access::REMOTE_WRITE)
            .expect("expose");
    let data = pattern(3, 300_000);
    p.a.fill(0, &data);
    p.b.recv(7, &[p.b.sge(0, 64)]);
    let sg = [p.a.sge(0, 300_000)];
    p.a.post(
        1,
        SendOp::RdmaWrite {
            remote_addr: p.b.mr.addr_at(65536),
            rkey,
        },
        &sg,
        false,
    );
    let s = [p.a.sge(400_000, 16)];
    p.a.post(2, SendOp::Send, &s, true);
    p.wait("receive after write", |p| p.b.wc(7).is_some());
    assert_eq!(p.b.wc(7).unwrap().status, WcStatus::Success);
    assert_eq!(
        p.b.mem(65536, 300_000),
        &data[..],
        "write visible before the send"
    );
    assert!(
        p.b.wcs.iter().all(|w| w.wr_id == 7),
        "a Write completes nothing at the target"
    );
    p.wait("send completion", |p| p.a.wc(2).is_some());
    assert!(p.a.wc(1).is_none(), "unsignaled Write reports nothing");
}

/// RDMA Read fetches remote bytes into a scatter list; byte_len is the size read.
pub fn rdma_read<H: Harness>(h: &mut H) {
    let mut p = connect(h, false);
    let data = pattern(9, 150_000);
    p.b.fill(10_000, &data);
    let qb = p.b.qp();
    let rkey =
        p.b.p
            .expose(qb, p.b.mr.id, 10_000, 150_000, Access::REMOTE_READ)
            .unwrap();
    let sg = [p.a.sge(0, 50_000), p.a.sge(200_000, 100_000)];
    p.a.post(
        5,
        SendOp::RdmaRead {
            remote_addr: p.b.mr.addr_at(10_000),
            rkey,
        },
        &sg,
        true,
    );
    // A second, small Read right behind the first.
    let sg2 = [p.a.sge(500_000, 8)];
    p.a.post(
        6,
        SendOp::RdmaRead {
            remote_addr: p.b.mr.addr_at(10_000 + 100),
            rkey,
        },
        &sg2,
        true,
    );
    p.wait("read completions", |p| {
        p.a.wc(5).is_some() && p.a.wc(6).is_some()
    });
    let w = p.a.wc(5).unwrap();
    assert_eq!(
        (w.status, w.opcode, w.byte_len),
        (WcStatus::Success, WcOpcode::RdmaRead, 150_000)
    );
    assert_eq!(p.a.wcs[0].wr_id, 5, "completions in posting order");
    assert_eq!(p.a.mem(0, 50_000), &data[..50_000]);
    assert_eq!(p.a.mem(200_000, 100_000), &data[50_000..]);
    assert_eq!(p.a.mem(500_000, 8), &data[100..108]);
    assert_eq!(p.a.wc(6).unwrap().status, WcStatus::Success);
    assert!(p.b.wcs.is_empty(), "a Read completes nothing at the target");
}

/// The accepting side writes into and reads from the connecting side's exposures: what an
/// RPC-over-RDMA server does to its client (Write chunks, Read chunks). A queue pair must allow
/// remote access whichever side opened the connection.
pub fn rdma_toward_the_connecting_side<H: Harness>(h: &mut H) {
    let mut p = connect(h, false);
    let qa = p.a.qp();
    let wkey =
        p.a.p
            .expose(qa, p.a.mr.id, 4096, 100_000, Access::REMOTE_WRITE)
            .expect("expose for write");
    let data = pattern(5, 100_000);
    p.b.fill(0, &data);
    p.a.recv(9, &[p.a.sge(150_000, 64)]);
    let sg = [p.b.sge(0, 100_000)];
    p.b.post(
        1,
        SendOp::RdmaWrite {
            remote_addr: p.a.mr.addr_at(4096),
            rkey: wkey,
        },
        &sg,
        true,
    );
    // A Write's completion at its sender says nothing of placement (iWARP completes it once
    // sent); a Send behind it does.
    let s = [p.b.sge(400_000, 16)];
    p.b.post(2, SendOp::Send, &s, true);
    p.wait("write, then send", |p| {
        p.b.wc(1).is_some() && p.a.wc(9).is_some()
    });
    assert_eq!(p.b.wc(1).unwrap().status, WcStatus::Success);
    assert_eq!(p.a.wc(9).unwrap().status, WcStatus::Success);
    assert!(p.a.mem(4096, 100_000) == &data[..], "written bytes placed");
    let back = pattern(6, 60_000);
    p.a.fill(200_000, &back);
    let rkey =
        p.a.p
            .expose(qa, p.a.mr.id, 200_000, 60_000, Access::REMOTE_READ)
            .expect("expose for read");
    let sg = [p.b.sge(300_000, 60_000)];
    p.b.post(
        3,
        SendOp::RdmaRead {
            remote_addr: p.a.mr.addr_at(200_000),
            rkey,
        },
        &sg,
        true,
    );
    p.wait("read from the connecting side", |p| p.b.wc(3).is_some());
    let w = p.b.wc(3).unwrap();
    assert_eq!((w.status, w.byte_len), (WcStatus::Success, 60_000));
    assert!(p.b.mem(300_000, 60_000) == &back[..], "read bytes intact");
    assert!(
        p.a.wcs.iter().all(|w| w.wr_id == 9),
        "RDMA completes nothing at the target"
    );
}

/// A peer's RDMA Read of a large exposure that starts mid-page: every byte arrives, in
/// order (an NFS server reading a WRITE's data from a client's buffer: hundreds of KiB, at
/// whatever offset the application's buffer has).
pub fn rdma_read_of_a_large_unaligned_exposure<H: Harness>(h: &mut H) {
    read_one_exposure(h, 600_003, 400_000, 11);
}

/// One RDMA Read of 900 000 bytes from a page-aligned exposure, in one request, as the Linux
/// NFS server reads a large Read chunk: every byte arrives.
pub fn rdma_read_of_a_large_aligned_exposure<H: Harness>(h: &mut H) {
    read_one_exposure(h, 4096, 900_000, 13);
}

/// `b` reads `len` bytes of pattern `seed` that `a` exposes at region offset `off`, in one RDMA
/// Read into its region at 100 000, and checks every byte.
fn read_one_exposure<H: Harness>(h: &mut H, off: usize, len: usize, seed: u8) {
    let mut p = connect(h, false);
    let data = pattern(seed, len);
    p.a.fill(off, &data);
    let qa = p.a.qp();
    let rkey =
        p.a.p
            .expose(qa, p.a.mr.id, off as u64, len as u64, Access::REMOTE_READ)
            .expect("expose");
    let sg = [p.b.sge(100_000, len)];
    p.b.post(
        4,
        SendOp::RdmaRead {
            remote_addr: p.a.mr.addr_at(off as u64),
            rkey,
        },
        &sg,
        true,
    );
    p.wait("large read", |p| p.b.wc(4).is_some());
    let w = p.b.wc(4).unwrap();
    assert_eq!((w.status, w.byte_len), (WcStatus::Success, len as u32));
    let got = p.b.mem(100_000, len);
    if let Some(i) = (0..len).find(|&i| got[i] != data[i]) {
        panic!("read bytes differ from byte {i} of {len} (exposure at region offset {off})");
    }
}

/// What the daemon does with an app's buffer, on a shared file mapping (an app's arena is a
/// memfd; tmpfs here): the peer RDMA-Writes into an exposure of it, the key is invalidated, the
/// "app" writes new bytes through its own mapping of the file, and the peer RDMA-Reads them
/// through a fresh exposure of the same bytes. The Read must return the new bytes (an NFS
/// READ into a buffer, then a WRITE from it).
pub fn rdma_on_a_shared_file_mapping_sees_the_apps_writes<H: Harness>(h: &mut H) {
    use crate::mapped::{Mapped, Registered};
    let mut p = connect(h, false);
    let dir = ["/dev/shm", "/run"]
        .iter()
        .map(std::path::Path::new)
        .find(|d| d.is_dir())
        .map_or_else(std::env::temp_dir, |d| d.to_path_buf());
    let path = dir.join(format!("rpcrdma-conformance-{}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .expect("arena file");
    let _ = std::fs::remove_file(&path);
    let size = 2usize << 20;
    file.set_len(size as u64).expect("size");
    let fd = std::os::fd::AsFd::as_fd(&file);
    let app = Mapped::shared(fd, size).expect("the app's mapping");
    let ours = Mapped::shared(fd, size).expect("the daemon's mapping");
    let arena = Registered::new(
        &mut p.a.p,
        p.a.pd,
        ours,
        Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
    )
    .expect("register the arena");
    let mr = arena.mr();
    let qa = p.a.qp();
    let (off, len) = (5_000usize, 1_000_000usize);
    // 1. The peer writes P1 into the buffer (a READ's Write chunk); a Send behind it.
    let p1 = pattern(21, len);
    p.b.fill(0, &p1);
    let wkey =
        p.a.p
            .expose(qa, mr.id, off as u64, len as u64, Access::REMOTE_WRITE)
            .expect("expose for write");
    p.a.recv(60, &[p.a.sge(0, 64)]);
    p.b.post(
        61,
        SendOp::RdmaWrite {
            remote_addr: mr.addr_at(off as u64),
            rkey: wkey,
        },
        &[p.b.sge(0, len)],
        false,
    );
    p.b.post(62, SendOp::Send, &[p.b.sge(len, 16)], true);
    p.wait("write, then send", |p| p.a.wc(60).is_some());
    let mut got = vec![0u8; len];
    assert!(app.read(off as u64, &mut got));
    assert!(got == p1, "the app sees the peer's write");
    p.a.post(63, SendOp::LocalInvalidate { rkey: wkey }, &[], true);
    p.wait("invalidate", |p| p.a.wc(63).is_some());
    // 2. The app writes P2 into the same bytes through its own mapping.
    let p2 = pattern(22, len);
    assert!(app.write(off as u64, &p2));
    // 3. The peer reads them through a fresh exposure.
    let rkey =
        p.a.p
            .expose(qa, mr.id, off as u64, len as u64, Access::REMOTE_READ)
            .expect("expose for read");
    p.b.post(
        64,
        SendOp::RdmaRead {
            remote_addr: mr.addr_at(off as u64),
            rkey,
        },
        &[p.b.sge(0, len)],
        true,
    );
    p.wait("read", |p| p.b.wc(64).is_some());
    assert_eq!(p.b.wc(64).unwrap().status, WcStatus::Success);
    let read = p.b.mem(0, len);
    if let Some(i) = (0..len).find(|&i| read[i] != p2[i]) {
        let stale = read[i] == p1[i];
        panic!(
            "the peer read other bytes than the app wrote, from byte {i} of {len} (stale: {stale})"
        );
    }
    p.a.post(65, SendOp::LocalInvalidate { rkey }, &[], true);
    p.wait("invalidate", |p| p.a.wc(65).is_some());
    let _ = arena.deregister(&mut p.a.p);
}

/// Send with Invalidate reports the key at the receiver and the key is dead afterwards.
pub fn send_with_invalidate<H: Harness>(h: &mut H) {
    let mut p = connect(h, false);
    let qa = p.a.qp();
    let rkey =
        p.a.p
            .expose(qa, p.a.mr.id, 0, 4096, Access::REMOTE_WRITE)
            .unwrap();
    p.a.recv(1, &[p.a.sge(8192, 256)]);
    let msg = pattern(1, 40);
    p.b.fill(0, &msg);
    let s = [p.b.sge(0, 40)];
    p.b.post(2, SendOp::SendWithInvalidate { rkey }, &s, true);
    p.wait("receive with invalidate", |p| p.a.wc(1).is_some());
    let w = p.a.wc(1).unwrap();
    assert_eq!(w.status, WcStatus::Success);
    assert_eq!(w.invalidated_rkey, Some(rkey));
    assert_eq!(p.a.mem(8192, 40), &msg[..]);
    // The peer's access with the invalidated key is refused.
    p.b.fill(1000, &[0x55; 64]);
    let s = [p.b.sge(1000, 64)];
    p.b.post(
        3,
        SendOp::RdmaWrite {
            remote_addr: p.a.mr.addr_at(0),
            rkey,
        },
        &s,
        true,
    );
    expect_write_refused(&mut p, 3);
    assert_eq!(
        p.a.mem(0, 64),
        &[0u8; 64][..],
        "invalidated window not written"
    );
}

/// A locally invalidated window refuses the peer afterwards.
pub fn window_invalidation_then_refused<H: Harness>(h: &mut H) {
    let mut p = connect(h, false);
    let qb = p.b.qp();
    let rkey =
        p.b.p
            .expose(
                qb,
                p.b.mr.id,
                0,
                4096,
                Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
    p.a.fill(0, &[0x11; 64]);
    let s = [p.a.sge(0, 64)];
    p.a.post(
        1,
        SendOp::RdmaWrite {
            remote_addr: p.b.mr.addr_at(0),
            rkey,
        },
        &s,
        true,
    );
    p.wait("first write", |p| p.a.wc(1).is_some());
    p.wait("first write visible", |p| p.b.mem(0, 64) == [0x11; 64]);
    p.b.post(50, SendOp::LocalInvalidate { rkey }, &[], true);
    p.wait("local invalidate", |p| p.b.wc(50).is_some());
    let w = p.b.wc(50).unwrap();
    assert_eq!(
        (w.status, w.opcode),
        (WcStatus::Success, WcOpcode::LocalInvalidate)
    );
    let rkey2 =
        p.b.p
            .expose(qb, p.b.mr.id, 0, 4096, Access::REMOTE_WRITE)
            .unwrap();
    assert_ne!(
        rkey2, rkey,
        "a fresh window never reuses the invalidated key at once"
    );
    p.a.fill(0, &[0x22; 64]);
    p.a.post(
        2,
        SendOp::RdmaWrite {
            remote_addr: p.b.mr.addr_at(0),
            rkey,
        },
        &s,
        true,
    );
    expect_write_refused(&mut p, 2);
    assert_eq!(
        p.b.mem(0, 64),
        &[0x11; 64][..],
        "refused write placed nothing"
    );
}

/// Offset and length, in side `b`'s test region, of the second region that
/// [`region_without_remote_rights_is_reached_only_through_exposures`] registers there.
const PLAIN_OFF: usize = 512 << 10;
const PLAIN_LEN: usize = 64 << 10;

/// Registers `b`'s bytes `PLAIN_OFF..PLAIN_OFF + PLAIN_LEN` again, as a region of their own
/// with `access`.
fn register_plain<P: Provider>(b: &mut Side<P>, access: Access) -> Mr {
    let base = b.buf.as_mut_ptr();
    // SAFETY: the bytes lie inside `b.buf` (inside its registered part, away from the
    // guards), which is never resized or dropped while the side, and so its provider, lives.
    unsafe {
        b.p.register(b.pd, base.add(GUARD + PLAIN_OFF), PLAIN_LEN, access)
    }
    .expect("register")
}

/// Memory registered for good with [`Access::BIND`] and no remote right, as the daemon
/// registers its buffer pool and the apps' arenas: the rules of exposure on it, a peer's
/// Write through an exposure landing, and a peer's Write or Read under the region's own
/// key refused: nothing placed, nothing read, the connection ended (R8166-8.1.3-a).
pub fn region_without_remote_rights_is_reached_only_through_exposures<H: Harness>(h: &mut H) {
    // Which exposures such a region allows, and a region without the bind right.
    let mut p = connect(h, false);
    let qb = p.b.qp();
    let bind_only = register_plain(&mut p.b, Access::BIND);
    assert!(p
        .b
        .p
        .expose(qb, bind_only.id, 0, 4096, Access::REMOTE_READ)
        .is_ok());
    assert!(
        p.b.p
            .expose(qb, bind_only.id, 0, 4096, Access::REMOTE_WRITE)
            .is_err(),
        "a remotely writable exposure needs local write on its region"
    );
    let local = register_plain(&mut p.b, Access::LOCAL_WRITE);
    assert!(
        p.b.p
            .expose(qb, local.id, 0, 4096, Access::REMOTE_READ)
            .is_err(),
        "a region without the bind right is not exposed"
    );

    // Through an exposure, a peer's Write lands.
    let plain = register_plain(&mut p.b, Access::LOCAL_WRITE | Access::BIND);
    let win =
        p.b.p
            .expose(qb, plain.id, 0, 4096, Access::REMOTE_WRITE)
            .unwrap();
    p.a.fill(0, &[0x31; 64]);
    let s = [p.a.sge(0, 64)];
    let op = SendOp::RdmaWrite {
        remote_addr: plain.addr_at(0),
        rkey: win,
    };
    p.a.post(1, op, &s, true);
    p.wait("write through the exposure", |p| p.a.wc(1).is_some());
    assert_eq!(p.a.wc(1).unwrap().status, WcStatus::Success);
    p.wait("write visible", |p| p.b.mem(PLAIN_OFF, 64) == [0x31; 64]);

    // Under the region's own keys (a peer may guess them): refused. Each refusal ends its
    // connection, so each attempt has a pair, and a region, of its own.
    let keys: [fn(&Mr) -> u32; 2] = [|m| m.lkey, |m| m.rkey];
    for key_of in keys {
        let mut p = connect(h, false);
        let plain = register_plain(&mut p.b, Access::LOCAL_WRITE | Access::BIND);
        let key = key_of(&plain);
        p.a.fill(0, &[0x77; 64]);
        let s = [p.a.sge(0, 64)];
        let op = SendOp::RdmaWrite {
            remote_addr: plain.addr_at(4096),
            rkey: key,
        };
        p.a.post(1, op, &s, true);
        expect_refused(&mut p, 1, false);
        assert!(
            p.b.buf.iter().all(|&b| b != 0x77),
            "a Write under the region's key {key:#x} placed nothing"
        );

        let mut p = connect(h, false);
        let plain = register_plain(&mut p.b, Access::LOCAL_WRITE | Access::BIND);
        let key = key_of(&plain);
        p.b.fill(PLAIN_OFF, &[0x99; 4096]);
        let s = [p.a.sge(0, 64)];
        let op = SendOp::RdmaRead {
            remote_addr: plain.addr_at(0),
            rkey: key,
        };
        p.a.post(1, op, &s, true);
        expect_refused(&mut p, 1, true);
        assert!(
            p.a.mem(0, 64).iter().all(|&b| b == 0),
            "a Read under the region's key {key:#x} read nothing"
        );
    }
}

/// `n` connections to the same peer, and a plain region of `b` (no remote right) whose
/// first 4 KiB are exposed for reading and writing on the first connection: the pair, the
/// region and the key.
fn exposed_on_the_first_of<H: Harness>(h: &mut H, n: usize) -> (Pair<H::P>, Mr, u32) {
    let mut p = connect(h, false);
    let addr = p.addr;
    for _ in 1..n {
        connect_one(&mut p, addr);
    }
    let plain = register_plain(&mut p.b, Access::LOCAL_WRITE | Access::BIND);
    let key =
        p.b.p
            .expose(
                p.b.qps[0],
                plain.id,
                0,
                4096,
                Access::REMOTE_READ | Access::REMOTE_WRITE,
            )
            .expect("expose");
    (p, plain, key)
}

/// An exposure bound on one connection is refused on another connection between the same two
/// sides, in the same protection domain (R8166-8.1.1-a: a handle from another connection
/// fails at once). A peer's Write and its Read on the second and third connections under
/// the first connection's exposure key are refused, each ending only its own connection;
/// the same key still works on the connection it was exposed on.
///
/// Providers that expose by binding a window to the queue pair pass; a provider whose
/// exposures are regions of the protection domain (the `ibv` provider without type 2
/// windows) cannot, and fails here by design (see `tests/vm/expected-fail`).
pub fn exposure_is_refused_on_another_connection<H: Harness>(h: &mut H) {
    let (mut p, plain, key) = exposed_on_the_first_of(h, 3);
    p.b.fill(PLAIN_OFF + 1024, &[0x99; 64]);
    p.a.fill(0, &[0x77; 64]);
    let attempts = [
        (
            1usize,
            SendOp::RdmaWrite {
                remote_addr: plain.addr_at(0),
                rkey: key,
            },
        ),
        (
            2,
            SendOp::RdmaRead {
                remote_addr: plain.addr_at(1024),
                rkey: key,
            },
        ),
    ];
    for (k, op) in attempts {
        let read = matches!(op, SendOp::RdmaRead { .. });
        let (qa, qb) = (p.a.qps[k], p.b.qps[k]);
        let sink = 8192 * k;
        let s = [if read {
            p.a.sge(sink, 64)
        } else {
            p.a.sge(0, 64)
        }];
        let wr = SendWr {
            wr_id: k as u64,
            op,
            sg: &s,
            signaled: true,
        };
        p.a.p.post_send(qa, &wr).expect("post_send");
        p.wait("the request on the other connection completed", |p| {
            p.a.wc(k as u64).is_some()
        });
        assert!(
            !read || p.a.wc(k as u64).map(|w| w.status) != Some(WcStatus::Success),
            "a Read under another connection's exposure key {key:#x} was served"
        );
        p.wait("the other connection ended", |p| {
            p.a.disconnected(qa) && p.b.disconnected(qb)
        });
        assert!(
            p.a.mem(sink, 64).iter().all(|&b| b != 0x99),
            "nothing read through connection {k}"
        );
        assert!(
            p.b.mem(PLAIN_OFF, 64).iter().all(|&b| b != 0x77),
            "nothing written through connection {k}"
        );
    }
    // The connection the key was exposed on lives, and the key works there.
    let (qa0, qb0) = (p.a.qps[0], p.b.qps[0]);
    assert!(!p.a.disconnected(qa0) && !p.b.disconnected(qb0));
    let s = [p.a.sge(0, 64)];
    let op = SendOp::RdmaWrite {
        remote_addr: plain.addr_at(0),
        rkey: key,
    };
    p.a.post(9, op, &s, true);
    p.wait("the Write on its own connection", |p| p.a.wc(9).is_some());
    assert_eq!(p.a.wc(9).unwrap().status, WcStatus::Success);
    p.wait("the Write landed", |p| p.b.mem(PLAIN_OFF, 64) == [0x77; 64]);
    assert!(
        p.a.guards_intact() && p.b.guards_intact(),
        "guards untouched"
    );
}

/// A peer's Send with Invalidate naming an exposure bound on another connection (its key seen
/// before, or guessed) does not invalidate it: the sender's own connection ends (RDMAP
/// remote protection error, STag not associated with the stream) and the exposure keeps
/// working on its connection. Found by the `driver` fuzz target: the soft provider checked
/// only the protection domain, so a hostile connection that hit the 8-bit key of a window
/// lent on another connection (1 in 256 for a stale key whose index was reused) invalidated
/// it and the honest peer's RDMA Write into it ended the honest connection. Linux 6.1's rxe
/// (windows) and siw (regions) take such a Send and invalidate the other connection's
/// exposure (`tests/vm/expected-fail`); rxe with regions refuses it.
pub fn send_with_invalidate_of_another_connections_exposure_is_refused<H: Harness>(h: &mut H) {
    let (mut p, plain, key) = exposed_on_the_first_of(h, 2);
    let (qa1, qb1) = (p.a.qps[1], p.b.qps[1]);
    p.b.p
        .post_recv(qb1, 1, &[p.b.sge(8192, 256)])
        .expect("post_recv");
    p.a.fill(0, &pattern(3, 40));
    let s = [p.a.sge(0, 40)];
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::SendWithInvalidate { rkey: key },
        sg: &s,
        signaled: true,
    };
    p.a.p.post_send(qa1, &wr).expect("post_send");
    p.wait("the Send with Invalidate taken or refused", |p| {
        p.b.wc(1).is_some_and(|w| w.status == WcStatus::Success)
            || (p.a.disconnected(qa1) && p.b.disconnected(qb1))
    });
    let taken = p.b.wc(1).filter(|w| w.status == WcStatus::Success);
    // The exposure still works on its own connection.
    let (qa0, qb0) = (p.a.qps[0], p.b.qps[0]);
    assert!(!p.a.disconnected(qa0) && !p.b.disconnected(qb0));
    p.a.fill(1000, &[0x66; 64]);
    let s = [p.a.sge(1000, 64)];
    let op = SendOp::RdmaWrite {
        remote_addr: plain.addr_at(0),
        rkey: key,
    };
    p.a.post(9, op, &s, true);
    p.wait("the Write on its own connection", |p| p.a.wc(9).is_some());
    assert_eq!(
        p.a.wc(9).unwrap().status,
        WcStatus::Success,
        "the exposure was invalidated from another connection (its receive: {taken:?})"
    );
    p.wait("the Write landed", |p| p.b.mem(PLAIN_OFF, 64) == [0x66; 64]);
    assert!(
        taken.is_none(),
        "the receive on the other connection completed ({taken:?}): its stream should end"
    );
}

/// A connection request handed over ([`Provider::hand_over`]) to another provider of the same
/// kind (another poll thread's) is answered there: the giver no longer knows it, the taker
/// accepts it, the connection comes up with the private data intact and carries a Send each
/// way. A provider whose requests cannot move says so (`Unsupported`) and keeps the request,
/// which it then answers itself.
pub fn connection_request_handed_over_is_answered_by_the_taker<H: Harness>(h: &mut H) {
    let (pa, giver) = h.pair();
    let (_, taker) = h.pair();
    let mut giver = Side::new(giver);
    let l = giver.p.listen(h.listen_addr()).expect("listen");
    let addr = giver.p.listen_addr(l).expect("listen_addr");
    let mut p = Pair {
        a: Side::new(pa),
        b: Side::new(taker),
        addr,
    };
    let (qa, req) = request_to(&mut p.a, &mut giver, addr);
    let req = match giver.p.hand_over(req) {
        Ok(moved) => {
            assert!(
                matches!(giver.p.hand_over(req), Err(Error::BadHandle)),
                "the giver still knows the request it handed over"
            );
            p.b.p.take_over(moved).expect("take_over")
        }
        Err(Error::Unsupported(_)) => {
            // The request stays with the giver, which answers it.
            std::mem::swap(&mut p.b, &mut giver);
            req
        }
        Err(e) => panic!("hand_over: {e}"),
    };
    accept_onto_b(&mut p, req, qa);
    let qb = p.b.qps[0];
    let (there, back) = (pattern(5, 100), pattern(6, 60));
    p.b.recv(1, &[p.b.sge(0, 256)]);
    p.a.recv(1, &[p.a.sge(0, 256)]);
    p.a.fill(4096, &there);
    p.b.fill(4096, &back);
    p.a.send_on(qa, 2, 4096, there.len());
    p.wait("the Send reached the taker", |p| p.b.wc(1).is_some());
    p.b.send_on(qb, 2, 4096, back.len());
    p.wait("the Send came back", |p| p.a.wc(1).is_some());
    for (side, want) in [(&p.b, &there), (&p.a, &back)] {
        let w = side.wc(1).unwrap();
        assert_eq!(
            (w.status, w.byte_len as usize),
            (WcStatus::Success, want.len())
        );
        assert_eq!(side.mem(0, want.len()), &want[..]);
    }
    drop(giver);
}

/// The accepting side may answer as soon as it has accepted: the peer sends once it has the
/// answer, and that first message can be polled before the accepting side's provider reports
/// `Established` (rdma_cm's event comes later than the data on rxe and siw). A Send posted
/// then, in reply, goes out; the accepting side's connection-manager events are not polled
/// until the exchange is done.
pub fn the_accepting_side_answers_before_its_established_event<H: Harness>(h: &mut H) {
    let (pa, pb) = h.pair();
    let (mut a, mut b) = (Side::new(pa), Side::new(pb));
    let l = b.p.listen(h.listen_addr()).expect("listen");
    let addr = b.p.listen_addr(l).expect("listen_addr");
    let (qa, req) = request_to(&mut a, &mut b, addr);
    let qb = b.p.create_qp(&b.qp_init()).expect("create_qp b");
    let params = ConnParams {
        private_data: &SERVER_PD,
        responder_resources: 16,
        initiator_depth: 16,
    };
    b.p.accept(req, qb, &params).expect("accept");
    b.qps.push(qb);
    a.qps.push(qa);
    b.recv(1, &[b.sge(0, 256)]);
    a.recv(1, &[a.sge(0, 256)]);
    drive_a_and_b_cq(&mut a, &mut b, "a established", |a, _| {
        a.events
            .iter()
            .any(|e| matches!(e, CmEvent::Established { qp, .. } if *qp == qa))
    });
    let (call, reply) = (pattern(7, 80), pattern(8, 40));
    a.fill(4096, &call);
    a.send_on(qa, 2, 4096, call.len());
    drive_a_and_b_cq(&mut a, &mut b, "the first message at b", |_, b| {
        b.wc(1).is_some()
    });
    assert_eq!(b.wc(1).map(|w| w.status), Some(WcStatus::Success));
    b.fill(4096, &reply);
    b.try_send_on(qb, 2, 4096, reply.len())
        .expect("a Send on an accepted queue pair before its Established event");
    drive_a_and_b_cq(&mut a, &mut b, "the reply at a", |a, _| a.wc(1).is_some());
    let w = a.wc(1).unwrap();
    assert_eq!(
        (w.status, w.byte_len as usize),
        (WcStatus::Success, reply.len())
    );
    assert_eq!(a.mem(0, reply.len()), &reply[..]);
}

/// `a` connects a new queue pair to `addr`, where `listener` listens; drives both until the
/// request arrives there. The queue pair and the request.
fn request_to<P: Provider>(
    a: &mut Side<P>,
    listener: &mut Side<P>,
    addr: SocketAddr,
) -> (QpId, ConnReqId) {
    let qa = a.p.create_qp(&a.qp_init()).expect("create_qp a");
    a.start_connect(qa, addr);
    let start = Instant::now();
    loop {
        a.step();
        listener.step();
        let req = listener.events.iter().find_map(|e| match e {
            CmEvent::ConnectRequest { req, .. } => Some(*req),
            _ => None,
        });
        if let Some(req) = req {
            return (qa, req);
        }
        assert!(start.elapsed() < DEADLINE, "no connection request");
        std::thread::yield_now();
    }
}

/// Drives `a` fully and only `b`'s completion queue (not its connection-manager events) until
/// `done` holds.
fn drive_a_and_b_cq<P: Provider>(
    a: &mut Side<P>,
    b: &mut Side<P>,
    what: &str,
    done: impl Fn(&Side<P>, &Side<P>) -> bool,
) {
    let start = Instant::now();
    while !done(a, b) {
        a.step();
        let mut w = [WorkCompletion::default(); 16];
        let n = b.p.poll_cq(b.cq, &mut w).expect("poll_cq");
        b.wcs.extend_from_slice(&w[..n]);
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

/// An exposure's key dies with the connection it was made for: once that queue pair is
/// disconnected (as the daemon does when a connection ends with RPCs in flight, whose
/// exposures are then never invalidated one by one), a Write under the key from another
/// connection to the same peer is refused and lands nothing. Exposures that are memory
/// regions (rxe and siw without usable windows) are valid on every queue pair of the domain,
/// so a reconnecting peer could otherwise write into memory its dead connection was lent.
pub fn exposure_dies_with_its_connection<H: Harness>(h: &mut H) {
    let (mut p, plain, key) = exposed_on_the_first_of(h, 2);
    let (qa0, qb0) = (p.a.qps[0], p.b.qps[0]);
    p.b.p.disconnect(qb0).expect("disconnect");
    p.wait("the exposing connection ended", |p| {
        p.a.disconnected(qa0) && p.b.disconnected(qb0)
    });
    p.a.fill(0, &[0x77; 64]);
    let (qa, qb) = (p.a.qps[1], p.b.qps[1]);
    let s = [p.a.sge(0, 64)];
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::RdmaWrite {
            remote_addr: plain.addr_at(0),
            rkey: key,
        },
        sg: &s,
        signaled: true,
    };
    p.a.p.post_send(qa, &wr).expect("post_send");
    p.wait("the Write completed", |p| p.a.wc(1).is_some());
    p.wait("the connection that used a dead key ended", |p| {
        p.a.disconnected(qa) && p.b.disconnected(qb)
    });
    assert!(
        p.b.mem(PLAIN_OFF, 64).iter().all(|&b| b != 0x77),
        "a Write under key {key:#x} of a disconnected queue pair landed"
    );
    assert!(
        p.a.guards_intact() && p.b.guards_intact(),
        "guards untouched"
    );
}

/// After a refused Read or Write (id `wr`): the connection ends (both queue pairs in error,
/// both sides told), and the guards are untouched. How the request itself completes is left
/// to the provider (iWARP completes a Write before the peer checks it; siw completes a
/// refused Read as flushed), except that a Read must not succeed; what was placed or read
/// the caller checks.
fn expect_refused<P: Provider>(p: &mut Pair<P>, wr: u64, read: bool) {
    let (qa, qb) = (p.a.qp(), p.b.qp());
    p.wait("the refused request completed", |p| p.a.wc(wr).is_some());
    let status = p.a.wc(wr).map(|w| w.status);
    assert!(
        !read || status != Some(WcStatus::Success),
        "the peer served the Read"
    );
    p.wait("both sides disconnected", |p| {
        p.a.disconnected(qa) && p.b.disconnected(qb)
    });
    assert_eq!(p.a.p.qp_state(qa).unwrap(), QpState::Error);
    assert_eq!(p.b.p.qp_state(qb).unwrap(), QpState::Error);
    assert!(
        p.a.guards_intact() && p.b.guards_intact(),
        "guards untouched"
    );
}

/// After a refused Write (id `wr`): both queue pairs end in error (on iWARP the Write itself
/// may already have completed successfully; on InfiniBand it fails), later work is flushed,
/// and nothing outside the regions changed.
fn expect_write_refused<P: Provider>(p: &mut Pair<P>, wr: u64) {
    let qa = p.a.qp();
    let qb = p.b.qp();
    p.wait("both sides disconnected", |p| {
        p.a.disconnected(qa) && p.b.disconnected(qb)
    });
    if let Some(w) = p.a.wc(wr) {
        assert!(
            matches!(w.status, WcStatus::Success | WcStatus::RemoteAccessError),
            "refused write: {w:?}"
        );
    }
    let s = [p.a.sge(900_000, 8)];
    p.a.post(wr + 1000, SendOp::Send, &s, true);
    p.wait("later send flushed", |p| p.a.wc(wr + 1000).is_some());
    assert_eq!(p.a.wc(wr + 1000).unwrap().status, WcStatus::Flushed);
    assert_eq!(p.a.p.qp_state(qa).unwrap(), QpState::Error);
    assert_eq!(p.b.p.qp_state(qb).unwrap(), QpState::Error);
    assert!(
        p.a.guards_intact() && p.b.guards_intact(),
        "guards untouched"
    );
}

fn write_refused_case<H: Harness>(
    h: &mut H,
    access: Access,
    win_len: u64,
    off: u64,
    len: usize,
    bad_key: bool,
) {
    let mut p = connect(h, false);
    let qb = p.b.qp();
    let mut rkey = p.b.p.expose(qb, p.b.mr.id, 4096, win_len, access).unwrap();
    if bad_key {
        rkey ^= 0x5a5a_5a00;
    }
    p.a.fill(0, &vec![0x77; len]);
    let s = [p.a.sge(0, len)];
    p.a.post(
        1,
        SendOp::RdmaWrite {
            remote_addr: p.b.mr.addr_at(4096).wrapping_add(off),
            rkey,
        },
        &s,
        true,
    );
    expect_write_refused(&mut p, 1);
    assert!(
        p.b.buf.iter().all(|&b| b != 0x77),
        "nothing of the refused write landed anywhere"
    );
}

/// Every protection error of an RDMA Write: unknown key, out of bounds (after and before),
/// missing remote-write right.
pub fn protection_errors_write<H: Harness>(h: &mut H) {
    write_refused_case(h, Access::REMOTE_WRITE, 4096, 0, 64, true);
    write_refused_case(h, Access::REMOTE_WRITE, 4096, 4096 - 32, 64, false);
    write_refused_case(h, Access::REMOTE_WRITE, 4096, u64::MAX - 4095, 64, false);
    write_refused_case(h, Access::REMOTE_READ, 4096, 0, 64, false);
}

fn read_refused_case<H: Harness>(h: &mut H, access: Access, off: u64, len: usize, bad_key: bool) {
    let mut p = connect(h, false);
    let qb = p.b.qp();
    let mut rkey = p.b.p.expose(qb, p.b.mr.id, 4096, 4096, access).unwrap();
    if bad_key {
        rkey = rkey.wrapping_add(0x100);
    }
    p.b.fill(0, &vec![0x99; 16384]);
    let s = [p.a.sge(0, len)];
    p.a.post(
        1,
        SendOp::RdmaRead {
            remote_addr: p.b.mr.addr_at(4096).wrapping_add(off),
            rkey,
        },
        &s,
        true,
    );
    p.wait("read refused", |p| p.a.wc(1).is_some());
    assert_eq!(p.a.wc(1).unwrap().status, WcStatus::RemoteAccessError);
    let (qa, qb) = (p.a.qp(), p.b.qp());
    p.wait("both sides disconnected", |p| {
        p.a.disconnected(qa) && p.b.disconnected(qb)
    });
    assert!(p.a.mem(0, len).iter().all(|&b| b == 0), "nothing read");
    assert!(p.a.guards_intact() && p.b.guards_intact());
}

/// Every protection error of an RDMA Read: unknown key, out of bounds, missing remote-read right.
pub fn protection_errors_read<H: Harness>(h: &mut H) {
    read_refused_case(h, Access::REMOTE_READ, 0, 64, true);
    read_refused_case(h, Access::REMOTE_READ, 4000, 200, false);
    read_refused_case(h, Access::REMOTE_WRITE, 0, 64, false);
}

/// Local protection: a gather entry with an unknown lkey or outside its region fails the
/// request with a local protection error and flushes what follows.
pub fn protection_errors_local<H: Harness>(h: &mut H) {
    for bad in [true, false] {
        let mut p = connect(h, false);
        p.b.recv(1, &[p.b.sge(0, 1024)]);
        let mut s = p.a.sge(0, 64);
        if bad {
            s.lkey ^= 0xffff_ff00;
        } else {
            s.addr = p.a.mr.addr_at((BUF_LEN - 2 * GUARD - 32) as u64);
        }
        p.a.post(1, SendOp::Send, &[s], true);
        let ok = [p.a.sge(0, 8)];
        p.a.post(2, SendOp::Send, &ok, true);
        p.wait("local protection error", |p| {
            p.a.wc(1).is_some() && p.a.wc(2).is_some()
        });
        assert_eq!(p.a.wc(1).unwrap().status, WcStatus::LocalProtectionError);
        assert_eq!(p.a.wc(2).unwrap().status, WcStatus::Flushed);
        assert!(p.b.wcs.iter().all(|w| w.status != WcStatus::Success));
    }
}

/// A Send larger than the posted receive: the receive fails with a length error, nothing is
/// written past it, both queue pairs go to error.
pub fn receive_too_small<H: Harness>(h: &mut H) {
    let mut p = connect(h, false);
    p.b.recv(1, &[p.b.sge(0, 16)]);
    p.a.fill(0, &[0x42; 64]);
    let s = [p.a.sge(0, 64)];
    p.a.post(1, SendOp::Send, &s, true);
    p.wait("receive fails", |p| p.b.wc(1).is_some());
    assert_eq!(p.b.wc(1).unwrap().status, WcStatus::LocalLengthError);
    assert!(p.b.mem(16, 1024).iter().all(|&b| b == 0), "no overrun");
    let (qa, qb) = (p.a.qp(), p.b.qp());
    p.wait("both sides disconnected", |p| {
        p.a.disconnected(qa) && p.b.disconnected(qb)
    });
    assert!(p.a.guards_intact() && p.b.guards_intact());
}

/// A Send with no receive posted: both queue pairs go to error (no RNR retry on iWARP).
pub fn no_receive_posted<H: Harness>(h: &mut H) {
    let mut p = connect(h, false);
    let s = [p.a.sge(0, 64)];
    p.a.post(1, SendOp::Send, &s, true);
    let (qa, qb) = (p.a.qp(), p.b.qp());
    p.wait("both sides disconnected", |p| {
        p.a.disconnected(qa) && p.b.disconnected(qb)
    });
    assert!(p.b.wcs.is_empty(), "nothing completes at the receiver");
    p.a.post(2, SendOp::Send, &s, true);
    p.wait("later send flushed", |p| p.a.wc(2).is_some());
    assert_eq!(p.a.wc(2).unwrap().status, WcStatus::Flushed);
    assert!(p.b.mem(0, 1024).iter().all(|&b| b == 0));
}

/// Disconnect flushes outstanding receives on both sides; later work is flushed too.
pub fn disconnect_flushes<H: Harness>(h: &mut H) {
    let mut p = connect(h, false);
    for i in 0..3 {
        p.b.recv(10 + i, &[p.b.sge(i as usize * 64, 64)]);
        p.a.recv(20 + i, &[p.a.sge(i as usize * 64, 64)]);
    }
    let qa = p.a.qp();
    p.a.p.disconnect(qa).unwrap();
    let qb = p.b.qp();
    p.wait("flushes and events", |p| {
        (10..13).all(|i| p.b.wc(i).is_some())
            && (20..23).all(|i| p.a.wc(i).is_some())
            && p.a.disconnected(qa)
            && p.b.disconnected(qb)
    });
    for w in p.a.wcs.iter().chain(p.b.wcs.iter()) {
        assert_eq!((w.status, w.opcode), (WcStatus::Flushed, WcOpcode::Recv));
    }
    let s = [p.b.sge(0, 8)];
    p.b.post(30, SendOp::Send, &s, true);
    p.wait("post after disconnect flushed", |p| p.b.wc(30).is_some());
    assert_eq!(p.b.wc(30).unwrap().status, WcStatus::Flushed);
}

/// A drain marker ([`Provider::drain_send_queue`]) is refused while the queue pair is live;
/// once it is in the error state, the marker is reported (flushed) after every request posted
/// before it: Sends, an unsignaled Send, and a large RDMA Read still in flight when the queue
/// pair failed. What the daemon waits for before it hands a closed connection's memory back.
pub fn drain_reports_after_the_work_posted_before<H: Harness>(h: &mut H) {
    let mut p = connect(h, false);
    let qa = p.a.qp();
    assert!(
        matches!(p.a.p.drain_send_queue(qa, 99), Err(crate::Error::BadState)),
        "a drain marker on a live queue pair is refused"
    );
    for i in 0..4 {
        p.b.recv(10 + i, &[p.b.sge(i as usize * 64, 64)]);
    }
    let qb = p.b.qp();
    let len = 600_000;
    let rkey =
        p.b.p
            .expose(qb, p.b.mr.id, 0, len as u64, Access::REMOTE_READ)
            .unwrap();
    let s = [p.a.sge(0, 64)];
    p.a.post(1, SendOp::Send, &s, true);
    p.a.post(2, SendOp::Send, &s, false);
    let sink = [p.a.sge(100_000, len)];
    let remote_addr = p.b.mr.addr_at(0);
    p.a.post(3, SendOp::RdmaRead { remote_addr, rkey }, &sink, true);
    p.a.post(4, SendOp::Send, &s, true);
    p.a.p.disconnect(qa).unwrap();
    let took =
        p.a.p
            .drain_send_queue(qa, 99)
            .expect("drain in the error state");
    assert!(took, "the device took no drain marker");
    p.wait("the drain marker", |p| p.a.wc(99).is_some());
    let at = |wcs: &[WorkCompletion], id: u64| wcs.iter().position(|w| w.wr_id == id);
    let marker = at(&p.a.wcs, 99).unwrap();
    assert_eq!(
        p.a.wcs[marker].status,
        WcStatus::Flushed,
        "the marker is flushed"
    );
    for id in [1, 3, 4] {
        assert!(
            at(&p.a.wcs, id).is_some_and(|i| i < marker),
            "request {id} is reported before the marker: {:?}",
            p.a.wcs
        );
    }
    p.settle();
    assert_eq!(
        p.a.wcs.iter().filter(|w| w.wr_id == 99).count(),
        1,
        "the marker is reported once"
    );
    let send_side = |w: &&WorkCompletion| w.opcode != WcOpcode::Recv;
    assert_eq!(
        p.a.wcs.iter().rfind(send_side).map(|w| w.wr_id),
        Some(99),
        "the marker is the send queue's last completion: {:?}",
        p.a.wcs
    );
}

/// One shared receive queue serves two queue pairs; completions name the consuming one.
pub fn shared_receive_queue<H: Harness>(h: &mut H) {
    let mut p = connect(h, true);
    // A second connection between the same providers onto the same SRQ.
    let addr = p.addr;
    connect_one(&mut p, addr);
    assert!(
        p.b.p.post_recv(p.b.qps[0], 1, &[]).is_err(),
        "no own receives with an SRQ"
    );
    for i in 0..4 {
        p.b.recv(100 + i, &[p.b.sge(i as usize * 256, 256)]);
    }
    for (n, &qa) in p.a.qps.clone().iter().enumerate() {
        let s = [p.a.sge(n * 64, 8)];
        p.a.fill(n * 64, &[n as u8 + 1; 8]);
        p.a.p
            .post_send(
                qa,
                &SendWr {
                    wr_id: n as u64,
                    op: SendOp::Send,
                    sg: &s,
                    signaled: true,
                },
            )
            .unwrap();
    }
    p.wait("two receives from the SRQ", |p| p.b.recvs_seen() >= 2);
    let mut qps: Vec<QpId> = p.b.wcs.iter().map(|w| w.qp).collect();
    qps.sort();
    let mut want = p.b.qps.clone();
    want.sort();
    assert_eq!(qps, want, "one receive consumed by each queue pair");
    for w in &p.b.wcs {
        assert_eq!(w.status, WcStatus::Success);
        let off = (w.wr_id - 100) as usize * 256;
        let n = if w.qp == p.b.qps[0] { 1 } else { 2 };
        assert_eq!(p.b.mem(off, 8), &[n; 8][..]);
    }
}

/// A queue pair on a shared receive queue, disconnected and destroyed before its receive
/// completions were polled: every buffer it took from the queue is still reported, under its
/// name (not another queue pair's, not even one created since in its place: the owner gives a
/// shared buffer back by the completion's queue pair), and the queue's other buffers serve
/// the next connection. A device may drop a destroyed queue pair's completions from its CQ
/// (mlx5 does, and frees the buffers it took in its own books): the provider keeps such a
/// queue pair until it has reported every buffer it took (IBTA 10.3.1: Last WQE Reached, then
/// a marker through the CQ).
pub fn destroyed_queue_pair_reports_the_shared_receives_it_took<H: Harness>(h: &mut H) {
    // The second connection's queue pair is destroyed, the first one's created before it on
    // `b`'s side: a completion named after the wrong queue pair would name a live one.
    let mut p = connect_two_on_srq(h);
    let (qa, qb) = (p.a.qps[1], p.b.qps[1]);
    for k in 0..2u8 {
        let off = 4096 + usize::from(k) * 64;
        p.a.fill(off, &[k + 1; 8]);
        p.a.send_on(qa, u64::from(k), off, 8);
    }
    // Until both Sends are acknowledged, without polling `b`'s CQ (its connection events are
    // taken: the soft provider moves data there).
    let start = Instant::now();
    while p.a.wcs.iter().filter(|w| w.qp == qa).count() < 2 {
        p.a.step();
        while let Some(e) = p.b.p.poll_cm() {
            p.b.events.push(e);
        }
        assert!(
            start.elapsed() < DEADLINE,
            "sends not acknowledged: {:?}",
            p.a.wcs
        );
        std::thread::yield_now();
    }
    assert!(p.a.wcs.iter().all(|w| w.status == WcStatus::Success));
    assert!(p.b.wcs.is_empty(), "nothing of b's polled yet");
    p.b.p.disconnect(qb).expect("disconnect");
    p.b.p.destroy_qp(qb).expect("destroy_qp");
    assert!(p.b.p.qp_state(qb).is_err(), "destroyed: the handle is gone");
    // A queue pair created now, before those completions are polled, has another name.
    let init = p.b.qp_init();
    let fresh = p.b.p.create_qp(&init).expect("create_qp");
    assert_ne!(
        fresh, qb,
        "a destroyed queue pair's name is not given to the next one"
    );
    p.wait("both receives reported", |p| p.b.recvs_seen() >= 2);
    // And the device lets it go within a few polls (at once on the soft provider; rxe after
    // a marker's trip, siw after a poll that empties the CQ): its memory may be reused then.
    p.wait("retired", |p| p.b.p.qp_retired(qb));
    assert!(p.b.p.qp_retired(qb), "retired stays retired");
    p.settle();
    let recvs: Vec<WorkCompletion> = p.b.wcs.iter().filter(|w| w.wr_id >= 100).copied().collect();
    assert_eq!(
        recvs.len(),
        2,
        "each buffer taken reported once: {:?}",
        p.b.wcs
    );
    for (k, w) in recvs.iter().enumerate() {
        assert_eq!(
            (w.qp, w.status, w.byte_len),
            (qb, WcStatus::Success, 8),
            "a receive of the destroyed queue pair, named after it"
        );
        let off = (w.wr_id - 100) as usize * 256;
        assert_eq!(p.b.mem(off, 8), &[k as u8 + 1; 8][..]);
    }
    // The two buffers it did not take serve the first connection.
    let (qa0, qb0) = (p.a.qps[0], p.b.qps[0]);
    let seen = p.b.wcs.len();
    for k in 0..2u64 {
        p.a.send_on(qa0, 10 + k, 8192, 8);
    }
    p.wait("the other connection's receives", |p| {
        p.b.wcs.len() >= seen + 2
    });
    let mut rest: Vec<u64> = p.b.wcs[seen..].iter().map(|w| w.wr_id).collect();
    rest.sort_unstable();
    let mut want: Vec<u64> = (100..104)
        .filter(|i| recvs.iter().all(|w| w.wr_id != *i))
        .collect();
    want.sort_unstable();
    assert_eq!(rest, want, "the buffers left in the queue, and only those");
    assert!(p.b.wcs[seen..]
        .iter()
        .all(|w| w.qp == qb0 && w.status == WcStatus::Success));
    p.b.p
        .destroy_qp(fresh)
        .expect("destroy the fresh queue pair");
}

/// iWARP semantics of a shared receive queue (not in [`conformance_tests!`]: InfiniBand and
/// RoCE retry a Send that finds no receive, Receiver Not Ready, instead): one connection's
/// burst takes every receive of the queue, and the next Send on another connection, arriving
/// before any receive is posted again, finds none and ends that other connection.
pub fn shared_receive_queue_emptied_by_one_connection_ends_the_next_sender<H: Harness>(h: &mut H) {
    let mut p = connect_two_on_srq(h);
    let (burst, other) = (p.a.qps[0], p.a.qps[1]);
    for k in 0..8 {
        p.a.send_on(burst, k, 0, 8);
    }
    p.wait("the queue emptied by the burst", |p| p.b.recvs_seen() == 4);
    assert!(p.b.wcs.iter().all(|w| w.qp == p.b.qps[0]));
    let (qa1, qb1) = (p.a.qps[1], p.b.qps[1]);
    p.settle();
    assert!(
        !p.a.disconnected(qa1) && !p.b.disconnected(qb1),
        "the other connection lives until it sends"
    );
    p.a.send_on(other, 99, 0, 8);
    p.wait("the other connection ended", |p| {
        p.a.disconnected(qa1) && p.b.disconnected(qb1)
    });
}

/// Whether `fd` is readable now (`wait_ms` 0) or within `wait_ms` (poll(2)).
pub fn readable(fd: std::os::fd::BorrowedFd<'_>, wait_ms: i32) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `p` is one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut p, 1, wait_ms) };
    n == 1 && p.revents & libc::POLLIN != 0
}

/// A side that has called `poll_cm` and found its CQ empty may sleep on its event fd: the
/// next completion (a Send arriving in a posted receive) makes the descriptor readable, and
/// after `poll_cm` the completion is in the CQ. What a parked poll thread relies on.
pub fn event_fd_wakes_a_sleeper_at_the_next_completion<H: Harness>(h: &mut H) {
    let mut p = connect(h, false);
    let s = p.b.sge(0, 1024);
    p.b.recv(7, &[s]);
    p.settle();
    for round in 0..3u64 {
        // The sleeper's side: readiness consumed and the CQs armed, nothing left to take.
        while p.b.p.poll_cm().is_some() {}
        let mut w = [WorkCompletion::default(); 4];
        assert_eq!(p.b.p.poll_cq(p.b.cq, &mut w).expect("poll_cq"), 0);
        let fd = p.b.p.event_fd().expect("this provider has an event fd");
        assert!(
            !readable(fd, 0),
            "round {round}: quiet before anything is sent"
        );
        let data = pattern(round as u8, 100);
        p.a.fill(0, &data);
        let s = p.a.sge(0, data.len());
        p.a.post(round, SendOp::Send, &[s], true);
        // Only the sender is driven; the sleeper waits on its descriptor (a hang guard of
        // DEADLINE, not a timing assertion).
        let start = Instant::now();
        while !readable(p.b.p.event_fd().expect("event fd"), 1) {
            p.a.step();
            assert!(
                start.elapsed() < DEADLINE,
                "round {round}: the event fd never woke"
            );
        }
        while p.b.p.poll_cm().is_some() {}
        let n = p.b.p.poll_cq(p.b.cq, &mut w).expect("poll_cq");
        assert_eq!(n, 1, "round {round}: the completion that woke the sleeper");
        assert_eq!((w[0].wr_id, w[0].status), (7 + round, WcStatus::Success));
        assert_eq!(p.b.mem(0, data.len()), &data[..]);
        let s = p.b.sge(0, 1024);
        p.b.recv(8 + round, &[s]);
        p.wait("the send completion", |p| p.a.wc(round).is_some());
    }
}

/// A connected pair, and `conns` more connections whose connecting side's queue pairs share a
/// completion queue of `depth` entries (returned), created for them.
fn connected_on_a_cq_of<H: Harness>(h: &mut H, depth: u32, conns: usize) -> (Pair<H::P>, CqId) {
    let mut p = connect(h, false);
    let addr = p.addr;
    let cq = p.a.p.create_cq(depth).expect("create_cq");
    for _ in 0..conns {
        connect_one_on(&mut p, addr, cq);
    }
    (p, cq)
}

/// A destroyed queue pair retires ([`Provider::qp_retired`]) within bounded polls even on a
/// busy completion queue, whose every poll comes back full: siw retires one at a poll that
/// comes back not full, and a poll thread whose every turn fills its batch never makes one;
/// the CQ is first in, first out, so once it has given up as many entries as it holds, what
/// the queue pair had there is gone. Here: two queue pairs on a CQ of 16, the first with a
/// Send completed and not polled when it is destroyed, the second kept sending so that the
/// CQ, polled one entry at a time, never comes back empty. It must retire well before
/// `RETIRE_WAIT` (no retire timeout counted), its Send reported under its name.
pub fn a_destroyed_queue_pair_retires_though_no_poll_comes_back_empty<H: Harness>(h: &mut H) {
    const BACKLOG: u64 = 3;
    let (mut p, small) = connected_on_a_cq_of(h, 16, 2);
    let (gone, busy) = (p.a.qps[1], p.a.qps[2]);
    let (b_gone, b_busy) = (p.b.qps[1], p.b.qps[2]);
    let sg = p.b.sge(0, 64);
    p.b.p.post_recv(b_gone, 900, &[sg]).expect("post_recv");
    for i in 0..64 {
        let sg = p.b.sge(4096 + i as usize * 64, 64);
        p.b.p.post_recv(b_busy, 1000 + i, &[sg]).expect("post_recv");
    }
    // One Send of the queue pair to destroy, then a backlog of the busy one's, all received.
    p.a.send_on(gone, 1, 0, 8);
    for k in 0..BACKLOG {
        p.a.send_on(busy, 100 + k, 0, 8);
    }
    p.wait("the Sends received", |p| p.b.recvs_seen() as u64 > BACKLOG);
    p.a.p.disconnect(gone).expect("disconnect");
    p.a.p.destroy_qp(gone).expect("destroy_qp");
    let start = Instant::now();
    let mut seen = Vec::new();
    let (mut next, mut empty) = (100 + BACKLOG, 0);
    while !p.a.p.qp_retired(gone) {
        // One more entry in, one out: the CQ never runs dry.
        p.a.send_on(busy, next, 0, 8);
        next += 1;
        let want = p.b.recvs_seen() + 1;
        p.wait("the Send received", |p| p.b.recvs_seen() >= want);
        let mut w = [WorkCompletion::default(); 1];
        match p.a.p.poll_cq(small, &mut w).expect("poll_cq") {
            0 => empty += 1,
            _ => seen.push(w[0]),
        }
        assert!(
            next < 100 + 64,
            "not retired after {} entries polled from a CQ of 16 ({empty} polls empty)",
            seen.len()
        );
    }
    let took = start.elapsed();
    assert_eq!(
        p.a.p.device_events().retire_timeouts,
        0,
        "retired by RETIRE_WAIT, not by the bound ({took:?}, {} polled, {empty} empty)",
        seen.len()
    );
    // Where it was kept for polls, the first entry polled was its Send, under its name.
    if let Some(w) = seen.first() {
        assert_eq!((w.wr_id, w.qp), (1, gone), "{seen:?}");
    }
}

/// A completion queue that overruns ends the connections on it, and only those (not in
/// [`conformance_tests!`]: the soft provider's CQs grow instead). On a device, the overrun is
/// an asynchronous event (`IBV_EVENT_CQ_ERR`): completions may have been lost, so no owner
/// could account for its work any more; the provider ends the connection and counts the
/// event in [`Provider::device_events`]. A connection on another CQ carries on.
pub fn cq_overrun_ends_the_connections_on_that_cq<H: Harness>(h: &mut H) {
    const SENDS: u64 = 48;
    let (mut p, _) = connected_on_a_cq_of(h, 1, 1);
    let (qa, qb) = (p.a.qps[1], p.b.qps[1]);
    for i in 0..SENDS {
        let s = [p.b.sge(i as usize * 64, 64)];
        p.b.p.post_recv(qb, 100 + i, &s).expect("post_recv");
    }
    assert_eq!(p.a.p.device_events(), DeviceEvents::default());
    // Signalled Sends whose completions go to a CQ of depth 1 that nobody polls.
    for i in 0..SENDS {
        let s = [p.a.sge(0, 8)];
        let wr = SendWr {
            wr_id: i,
            op: SendOp::Send,
            sg: &s,
            signaled: true,
        };
        if p.a.p.post_send(qa, &wr).is_err() {
            break;
        }
    }
    p.wait("the connection on the overrun CQ ended", |p| {
        p.a.disconnected(qa)
    });
    let d = p.a.p.device_events();
    assert!(d.cq_errors >= 1, "the overrun is counted: {d:?}");
    assert_eq!(
        (d.qp_errors, d.srq_errors, d.device_fatal),
        (0, 0, 0),
        "nothing else failed: {d:?}"
    );
    assert_ne!(p.a.p.qp_state(qa).unwrap(), QpState::ReadyToSend);
    p.wait("the peer sees the end", |p| p.b.disconnected(qb));
    // The main connection, on another CQ, carries on.
    let s = p.b.sge(200_000, 64);
    p.b.recv(500, &[s]);
    p.a.fill(1000, &[3; 16]);
    let s = p.a.sge(1000, 16);
    p.a.post(501, SendOp::Send, &[s], true);
    p.wait("a Send on the other connection", |p| {
        p.a.wc(501).is_some() && p.b.wc(500).is_some()
    });
    assert_eq!(p.a.wc(501).unwrap().status, WcStatus::Success);
    assert_eq!(p.b.mem(200_000, 16), &[3; 16]);
    assert!(!p.a.disconnected(p.a.qp()) && !p.b.disconnected(p.b.qp()));
}

/// Whether `side` has news to act on: work its provider left for the next poll, or its event
/// fd readable.
fn has_news<P: Provider>(side: &Side<P>) -> bool {
    side.p.busy() || side.p.event_fd().is_some_and(|fd| readable(fd, 0))
}

/// Sleep until either side's event fd is readable; false if neither became readable within
/// [`DEADLINE`] (or neither has one: then nothing could ever wake a sleeper).
fn sleep_on_both<P: Provider>(p: &Pair<P>) -> bool {
    use std::os::fd::AsRawFd;
    let mut fds: Vec<libc::pollfd> = [p.a.p.event_fd(), p.b.p.event_fd()]
        .into_iter()
        .flatten()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    if fds.is_empty() {
        return false;
    }
    // SAFETY: `fds` is a valid array of `fds.len()` pollfds for the duration of the call.
    let n = unsafe {
        libc::poll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            DEADLINE.as_millis() as i32,
        )
    };
    n > 0
}

/// A soft provider visits a queue pair only when there is news for it (not in
/// [`conformance_tests!`]: it is about how the soft provider schedules its work). Two sides
/// are driven the way a parked poll thread is: a side is polled only while it is
/// [`busy`](Provider::busy) or its event fd is readable, and when neither side is, the test
/// sleeps on the event fds. First only the sender is driven, until its 20 MiB of Writes have
/// filled what the link buffers and it waits; from then on every refused write must be woken
/// by the receiver's reads, every read by the sender's writes, a Read Response held up by the
/// requester's full link by its reads, and a queue pair stopped by the round limit must say
/// so through `busy`. A wakeup lost anywhere stalls the transfer and fails the test.
pub fn a_side_polled_only_on_news_completes_every_transfer<H: Harness>(h: &mut H) {
    const HALF: usize = 512 << 10;
    const WRITES: u64 = 40;
    const READ: usize = 500_000;
    let mut p = connect(h, false);
    let (qa, qb) = (p.a.qp(), p.b.qp());
    let data = pattern(21, HALF);
    p.a.fill(0, &data);
    let back = pattern(22, READ);
    p.b.fill(HALF, &back);
    let wkey =
        p.b.p
            .expose(qb, p.b.mr.id, 0, HALF as u64, Access::REMOTE_WRITE)
            .expect("expose for writes");
    let rkey =
        p.b.p
            .expose(qb, p.b.mr.id, HALF as u64, READ as u64, Access::REMOTE_READ)
            .expect("expose for the read");
    let s = p.b.sge(HALF + READ, 256);
    p.b.recv(900, &[s]);
    for i in 0..WRITES {
        let sg = [p.a.sge(0, HALF)];
        p.a.post(
            i,
            SendOp::RdmaWrite {
                remote_addr: p.b.mr.addr_at(0),
                rkey: wkey,
            },
            &sg,
            true,
        );
    }
    let sg = [p.a.sge(100, 64)];
    p.a.post(WRITES, SendOp::Send, &sg, true);
    let sg = [p.a.sge(HALF, READ)];
    p.a.post(
        WRITES + 1,
        SendOp::RdmaRead {
            remote_addr: p.b.mr.addr_at(HALF as u64),
            rkey,
        },
        &sg,
        true,
    );
    let start = Instant::now();
    while has_news(&p.a) {
        p.a.step();
        assert!(start.elapsed() < DEADLINE, "the sender never came to rest");
    }
    assert!(
        p.a.wcs.len() < WRITES as usize,
        "the sender came to rest with the receiver not polled: the link holds back most of \
         the Writes ({} of {WRITES} done)",
        p.a.wcs.len()
    );
    let done = |p: &Pair<H::P>| p.a.wcs.len() == WRITES as usize + 2 && p.b.wc(900).is_some();
    while !done(&p) {
        let mut polled = false;
        if has_news(&p.a) {
            p.a.step();
            polled = true;
        }
        if has_news(&p.b) {
            p.b.step();
            polled = true;
        }
        if !polled {
            assert!(
                sleep_on_both(&p),
                "stalled with no side busy and no event fd readable: a {} completions, b {}",
                p.a.wcs.len(),
                p.b.wcs.len()
            );
        }
        assert!(start.elapsed() < DEADLINE, "hang guard");
    }
    assert!(
        p.a.wcs.iter().all(|w| w.status == WcStatus::Success),
        "{:?}",
        p.a.wcs
    );
    let ids: Vec<u64> = p.a.wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..WRITES + 2).collect::<Vec<_>>(), "in posting order");
    assert_eq!(p.b.mem(0, HALF), &data[..], "the Writes' bytes");
    assert_eq!(p.a.mem(HALF, READ), &back[..], "the Read's bytes");
    assert_eq!(
        p.b.mem(HALF + READ, 64),
        &data[100..164],
        "the Send's bytes"
    );
    let _ = qa;
}

/// However many connections a soft provider holds, a poll visits only the queue pairs with
/// news: idle ones cost nothing (not in [`conformance_tests!`]: `visits` counts the soft
/// provider's queue pair visits). With 40 connections up, polls with nothing to do visit no
/// queue pair, and a Send and its completion visit only the two ends of its connection, a
/// few times each.
pub fn idle_connections_cost_a_poll_nothing<H: Harness>(h: &mut H, visits: impl Fn(&H::P) -> u64) {
    let mut p = connect(h, false);
    let addr = p.addr;
    for _ in 0..39 {
        connect_one(&mut p, addr);
    }
    p.settle();
    let (a0, b0) = (visits(&p.a.p), visits(&p.b.p));
    for _ in 0..1000 {
        p.a.step();
        p.b.step();
    }
    assert_eq!(
        (visits(&p.a.p) - a0, visits(&p.b.p) - b0),
        (0, 0),
        "polls with nothing to do visit no queue pair"
    );
    let (qa, qb) = (p.a.qps[17], p.b.qps[17]);
    let s = p.b.sge(0, 256);
    p.b.p.post_recv(qb, 1, &[s]).expect("post_recv");
    p.a.fill(0, &[5; 64]);
    let s = p.a.sge(0, 64);
    p.a.p
        .post_send(
            qa,
            &SendWr {
                wr_id: 2,
                op: SendOp::Send,
                sg: &[s],
                signaled: true,
            },
        )
        .expect("post_send");
    let (a0, b0) = (visits(&p.a.p), visits(&p.b.p));
    p.wait("the send and its receive", |p| {
        p.a.wc(2).is_some() && p.b.wc(1).is_some()
    });
    p.settle();
    let (da, db) = (visits(&p.a.p) - a0, visits(&p.b.p) - b0);
    assert!(
        (1..=4).contains(&da) && (1..=4).contains(&db),
        "one Send on one of 40 connections: {da} visits on the sender, {db} on the receiver"
    );
    assert_eq!(p.b.mem(0, 64), &[5; 64]);
}

/// News for connection management that a completion poll takes is not lost to a sleeper. A
/// side that has armed its event fd (`poll_cm`) polls its completion queue, as a poll
/// thread's turn does before it parks, just as a connection request reaches its listener:
/// it must still see work, [`busy`](Provider::busy) or its event fd readable, and its next
/// `poll_cm` must bring the request. (The soft provider over TCP takes its listener's
/// readiness in the same `epoll_wait` as its links'.)
pub fn a_connection_request_is_news_after_a_completion_poll<H: Harness>(h: &mut H) {
    let (pa, pb) = h.pair();
    let mut a = Side::new(pa);
    let mut b = Side::new(pb);
    let l = b.p.listen(h.listen_addr()).expect("listen");
    let addr = b.p.listen_addr(l).expect("listen_addr");
    while b.p.poll_cm().is_some() {}
    assert!(
        !readable(b.p.event_fd().expect("event fd"), 0),
        "quiet before the request"
    );
    let qa = a.p.create_qp(&a.qp_init()).expect("create_qp");
    a.start_connect(qa, addr);
    let start = Instant::now();
    while !readable(b.p.event_fd().expect("event fd"), 10) {
        a.step();
        assert!(
            start.elapsed() < DEADLINE,
            "the listener never became readable"
        );
    }
    let mut w = [WorkCompletion::default(); 4];
    assert_eq!(b.p.poll_cq(b.cq, &mut w).expect("poll_cq"), 0);
    assert!(
        b.p.busy() || readable(b.p.event_fd().expect("event fd"), 0),
        "a completion poll took the listener's news and nothing says so: a sleeper would miss \
         the connection request"
    );
    let start = Instant::now();
    while !b
        .events
        .iter()
        .any(|e| matches!(e, CmEvent::ConnectRequest { .. }))
    {
        a.step();
        b.step();
        assert!(start.elapsed() < DEADLINE, "no connection request");
    }
}

/// The same burst against receive queues of their own (not in [`conformance_tests!`]: on
/// InfiniBand and RoCE the burst is retried, Receiver Not Ready, rather than ending its
/// connection): it ends only the connection that sent it, and the other's Send lands.
pub fn receive_queues_of_their_own_contain_a_burst<H: Harness>(h: &mut H) {
    let mut p = connect(h, false);
    let addr = p.addr;
    connect_one(&mut p, addr);
    let (qb0, qb1) = (p.b.qps[0], p.b.qps[1]);
    for i in 0..4u64 {
        let s = [p.b.sge(i as usize * 256, 256)];
        p.b.p.post_recv(qb0, 100 + i, &s).expect("post_recv");
        let s = [p.b.sge(2048 + i as usize * 256, 256)];
        p.b.p.post_recv(qb1, 200 + i, &s).expect("post_recv");
    }
    let (burst, other) = (p.a.qps[0], p.a.qps[1]);
    p.a.fill(0, &[7; 8]);
    for k in 0..8 {
        let s = [p.a.sge(0, 8)];
        let wr = SendWr {
            wr_id: k,
            op: SendOp::Send,
            sg: &s,
            signaled: true,
        };
        p.a.p.post_send(burst, &wr).expect("post_send");
    }
    p.wait("the burst's connection ended", |p| {
        p.a.disconnected(burst) && p.b.disconnected(qb0)
    });
    p.a.fill(64, &[9; 8]);
    let s = [p.a.sge(64, 8)];
    let wr = SendWr {
        wr_id: 99,
        op: SendOp::Send,
        sg: &s,
        signaled: true,
    };
    p.a.p.post_send(other, &wr).expect("post_send");
    p.wait("the other connection's Send landed", |p| {
        p.b.wcs
            .iter()
            .any(|w| w.qp == qb1 && w.opcode == WcOpcode::Recv)
    });
    let w = p.b.wcs.iter().find(|w| w.qp == qb1).copied().unwrap();
    assert_eq!((w.status, w.wr_id, w.byte_len), (WcStatus::Success, 200, 8));
    assert_eq!(p.b.mem(2048, 8), &[9; 8][..]);
    p.settle();
    assert!(!p.a.disconnected(other) && !p.b.disconnected(qb1));
}

/// Generate one `#[test]` per conformance check for a harness expression.
#[macro_export]
macro_rules! conformance_tests {
    // For providers with an event fd (`Provider::event_fd`): the suite, and its wake-up test.
    ($harness:expr, event_fd) => {
        $crate::conformance_tests!($harness);
        $crate::conformance_tests!(@t $harness; event_fd_wakes_a_sleeper_at_the_next_completion,
            a_connection_request_is_news_after_a_completion_poll);
    };
    ($harness:expr) => {
        $crate::conformance_tests!(@t $harness;
            cm_private_data_and_reject, connect_where_nothing_listens_is_unreachable,
            send_recv_matching_and_ordering,
            send_gather_and_large_message, write_then_send_visibility, rdma_read,
            rdma_toward_the_connecting_side, rdma_read_of_a_large_unaligned_exposure,
            rdma_read_of_a_large_aligned_exposure,
            rdma_on_a_shared_file_mapping_sees_the_apps_writes,
            send_with_invalidate, window_invalidation_then_refused, protection_errors_write,
            protection_errors_read, protection_errors_local, receive_too_small,
            no_receive_posted, disconnect_flushes, drain_reports_after_the_work_posted_before,
            shared_receive_queue, destroyed_queue_pair_reports_the_shared_receives_it_took,
            a_destroyed_queue_pair_retires_though_no_poll_comes_back_empty,
            region_without_remote_rights_is_reached_only_through_exposures,
            exposure_is_refused_on_another_connection, exposure_dies_with_its_connection,
            send_with_invalidate_of_another_connections_exposure_is_refused,
            connection_request_handed_over_is_answered_by_the_taker,
            the_accepting_side_answers_before_its_established_event);
    };
    (@t $harness:expr; $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                let mut h = $harness;
                $crate::conformance::$name(&mut h);
            }
        )*
    };
}
