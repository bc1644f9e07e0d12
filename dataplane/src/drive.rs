//! Two [`Driver`]s and a hostile peer scripted by bytes, for the `driver` fuzz target
//! (`dataplane/fuzz`) and its property test: the engine as a poll thread runs it, over the
//! soft provider's in-memory fabric (real iWARP framing, real memory placement), where
//! [`conn::script`](crate::conn::script) plays two bare engines over the simulator.
//!
//! Three parties share one fabric:
//! - **C**, a requester `Driver`, with an honest connection to S and a victim connection to H;
//! - **S**, a responder `Driver` serving RDMATEST ECHO, with the honest connection from C and an
//!   attacker connection from H;
//! - **H**, raw verbs (no engine), hostile to both: its connect private data, raw bytes,
//!   plausible calls whose chunks point at its own memory, replies to C's calls built on the
//!   keys those calls carry (echoed, altered, after RDMA Writes of any offset and length, with
//!   Send With Invalidate of any key), RDMA Reads and Writes under keys it saw or guessed, and
//!   disconnects.
//!
//! The bytes choose the settings (per-connection or shared pools on each node, credits, a
//! provider that retires a destroyed queue pair only a few polls later, as rxe and siw do), then
//! steps: calls of every transfer mode on either of C's connections, cancels, closes, H's moves
//! and poll turns. Time is a counter, so a run replays exactly. [`run`] panics only if a
//! `Driver` breaks its contract:
//! - nothing panics, and every loop is bounded;
//! - every call C submits ends exactly once, and nothing ends that was not submitted; one
//!   that ends lent (cancelled while its chunks are exposed) is released exactly once, and
//!   its memory is not written after;
//! - every call S's server is handed ends exactly once ([`Event::ReplyDone`] or
//!   [`Event::ServeAborted`]), and arguments come only for a call being pulled;
//! - the honest connection is never ended by what H does nor by C's cancels, and each of its
//!   calls that was not cancelled brings back exactly the bytes it sent; the one exception is
//!   the one
//!   `dataplane/README.md` documents: H bursting past its grant into a node's *shared*
//!   receive queue, which iWARP cannot survive (the check is then off for that run);
//! - after every connection is closed and removed, every send and receive buffer of both nodes
//!   is back in its pool.
//!
//! `DRIVE_TRACE=1` prints each step as it runs (for replaying a failing input).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rpcrdma_proto::cm::PrivateData;
use rpcrdma_proto::ulb::{rdmatest, RDMATEST_PROG};
use rpcrdma_proto::v2::RDMA2_OPTIONAL;
use rpcrdma_proto::{ChunkLists, Limits, Message, Segment};
use rpcrdma_verbs::conformance::Side;
use rpcrdma_verbs::soft::link::MemFabric;
use rpcrdma_verbs::soft::{SoftConfig, SoftMem, SoftProvider};
use rpcrdma_verbs::{
    CmEvent, ConnParams, PdId, Provider, QpId, QpInit, SendOp, SendWr, WcStatus, WorkCompletion,
};

use crate::conn::script::{mutate, Bytes};
use crate::conn::sim::pattern;
use crate::conn::SLOT_TAIL;
use crate::{
    Accepted, ArgPiece, BufferCounts, CallDone, CallSpec, CallStatus, CloseReason, ConnConfig,
    ConnId, ConnTemplate, Driver, Event, MemRef, Memory, ReplySpec, ResultPiece, Role, ServeId,
    SideMem, SubmitError, REGISTERED_ACCESS,
};

/// Steps of one script at most.
const MAX_STEPS: usize = 160;
/// Poll turns the end of a run may take to settle (a hang guard, never reached honestly).
const SETTLE_TURNS: usize = 4000;
/// Call slots of C's app memory: a message word, arguments, a result buffer, a reply buffer.
const C_SLOTS: usize = 16;
const C_SLOT: u64 = 3 * 8192 + 256;
/// Largest ECHO a call makes (so that it fits its slot).
const MAX_ECHO: u32 = 8000;
/// Serve slots of S's app memory: the arguments, then the reply's message word.
const S_SLOTS: usize = 24;
const S_ARGS: u32 = 12 << 10;
const S_SLOT: u64 = S_ARGS as u64 + 64;
/// Receive buffers of a shared receive queue (each node).
const SRQ_COUNT: u32 = 40;
/// The DDP threshold of both nodes.
const DDP: u32 = 1024;
/// H's memory: 8 Send staging buffers, 16 receives per queue pair, then data.
const H_STAGE: usize = 0;
const H_RECV_S: usize = 32 << 10;
const H_RECV_C: usize = 96 << 10;
const H_DATA: usize = 160 << 10;
const H_DATA_LEN: usize = 512 << 10;
/// Receive ids of H: `base + k` for its 16 receives on each queue pair.
const FROM_S: u64 = 1000;
const FROM_C: u64 = 2000;

fn trace() -> bool {
    std::env::var_os("DRIVE_TRACE").is_some()
}

/// A node: a `Driver` on the soft provider, its memory and what it reported.
struct Node {
    name: &'static str,
    drv: Driver<SoftMem>,
    mem: SideMem,
    pd: PdId,
    cm: Vec<CmEvent>,
    events: Vec<(ConnId, Event)>,
    /// Where the app memory starts (after the pools).
    app: u64,
    /// The pools at start, every buffer free.
    start: BufferCounts,
    blocks: usize,
}

fn template(version: u32, credits: u32) -> ConnTemplate {
    ConnTemplate {
        version,
        credits,
        max_calls: 8,
        send_size: 4096,
        recv_size: 4096,
        recv_slots: credits + 2,
        ddp_threshold: DDP,
        max_reads: 8,
        max_call_size: S_ARGS,
    }
}

impl Node {
    /// A node for two connections: per-connection blocks, or a shared receive queue (and,
    /// with `shared_send`, one shared send pool).
    fn new(
        name: &'static str,
        f: &MemFabric,
        tmpl: ConnTemplate,
        shared: bool,
        shared_send: bool,
        retire_polls: u32,
    ) -> Node {
        let soft = SoftConfig {
            retire_polls,
            ..SoftConfig::default()
        };
        let Side {
            p, pd, cq, buf, mr, ..
        } = Side::with_access(SoftProvider::memory(f, soft), REGISTERED_ACCESS);
        let region = mr.id;
        let (drv, used) = if shared {
            let send_len = if shared_send {
                // Two connections' worth: calls, answers and a spare each.
                2 * (3 * tmpl.credits + 4) * (SLOT_TAIL + tmpl.send_size)
            } else {
                2 * ConnConfig::send_pool_len(tmpl.send_slots(), tmpl.send_size).expect("send pool")
            };
            let pool = MemRef::new(region, 0, send_len);
            let srq = MemRef::new(region, u64::from(send_len), SRQ_COUNT * tmpl.recv_size);
            let drv = Driver::new_shared(p, cq, pd, mr, pool, shared_send, srq, SRQ_COUNT, tmpl)
                .expect("driver");
            (drv, u64::from(send_len) + u64::from(srq.len))
        } else {
            let len = 2 * tmpl.block_len().expect("block");
            let drv = Driver::new(p, cq, mr, MemRef::new(region, 0, len), tmpl).expect("driver");
            (drv, u64::from(len))
        };
        let start = drv.buffer_counts();
        let blocks = drv.free_blocks();
        Node {
            name,
            drv,
            mem: SideMem {
                mr: region,
                len: mr.len,
                buf,
            },
            pd,
            cm: Vec::new(),
            events: Vec::new(),
            app: used.div_ceil(4096) * 4096,
            start,
            blocks,
        }
    }

    fn poll(&mut self, now: Instant) {
        self.drv.poll(now, &mut self.mem);
        while let Some(e) = self.drv.provider_mut().poll_cm() {
            // As the poll thread does: a connection whose queue pair is disconnected goes.
            if trace() {
                eprintln!("  {} {e:?}", self.name);
            }
            if let CmEvent::Disconnected { qp } = e {
                if let Some(id) = self.drv.by_qp(qp) {
                    let _ = self.drv.remove(id);
                }
            }
            self.cm.push(e);
        }
        while let Some(e) = self.drv.poll_event() {
            if trace() {
                eprintln!("  {} {e:?}", self.name);
            }
            self.events.push(e);
        }
    }

    fn qp(&mut self) -> QpId {
        let init = self.drv.qp_init(self.pd);
        self.drv.provider_mut().create_qp(&init).expect("create_qp")
    }

    /// The first connection-manager event `want` picks, taken out.
    fn take_cm<T>(&mut self, want: impl Fn(&CmEvent) -> Option<T>) -> Option<T> {
        let i = self.cm.iter().position(|e| want(e).is_some())?;
        want(&self.cm.remove(i))
    }
}

/// H: raw verbs, hostile to both nodes.
struct Hostile {
    side: Side<SoftMem>,
    /// Its queue pair connected to S, and the one C connected to.
    to_s: Option<QpId>,
    to_c: Option<QpId>,
    /// The last messages C sent it (calls), and S sent it (replies, errors).
    from_c: Vec<Vec<u8>>,
    from_s: Vec<Vec<u8>>,
    /// Sends it made to each node since the last poll turn.
    burst_s: u32,
    burst_c: u32,
    stage: usize,
    /// The last segments (keys and addresses of C's memory) C's calls showed it, kept after
    /// the calls end: H's Reads and Writes under them must find nothing.
    seen: Vec<Segment>,
}

impl Hostile {
    fn qp(&mut self, recv_base: u64, at: usize) -> QpId {
        let h = &mut self.side;
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
            .expect("raw qp");
        for k in 0..16 {
            let sge = h.sge(at + 4096 * k, 4096);
            h.p.post_recv(qp, recv_base + k as u64, &[sge])
                .expect("raw recv");
        }
        qp
    }

    /// Takes what arrived: messages are kept (the last 16 of each kind), receives reposted.
    fn step(&mut self) {
        while let Some(e) = self.side.p.poll_cm() {
            self.side.events.push(e);
        }
        let mut w = [WorkCompletion::default(); 16];
        loop {
            let n = self.side.p.poll_cq(self.side.cq, &mut w).unwrap_or(0);
            for wc in w.iter().take(n) {
                let (base, at, qp) = match wc.wr_id {
                    id if (FROM_S..FROM_S + 16).contains(&id) => (FROM_S, H_RECV_S, self.to_s),
                    id if (FROM_C..FROM_C + 16).contains(&id) => (FROM_C, H_RECV_C, self.to_c),
                    _ => continue,
                };
                if wc.status != WcStatus::Success {
                    continue;
                }
                let off = at + 4096 * (wc.wr_id - base) as usize;
                let len = (wc.byte_len as usize).min(4096);
                let msg = self.side.mem(off, len).to_vec();
                let keep = if base == FROM_S {
                    &mut self.from_s
                } else {
                    &mut self.from_c
                };
                if keep.len() == 16 {
                    keep.remove(0);
                }
                keep.push(msg);
                if let Some(qp) = qp {
                    let sge = self.side.sge(off, 4096);
                    let _ = self.side.p.post_recv(qp, wc.wr_id, &[sge]);
                }
            }
            if n < w.len() {
                break;
            }
        }
    }

    /// Posts `op` with `bytes` (a Send's message, or an RDMA Write's data) from a staging
    /// buffer; an RDMA Read lands in H's data area.
    fn post(&mut self, to_s: bool, op: SendOp, bytes: &[u8]) {
        let Some(qp) = (if to_s { self.to_s } else { self.to_c }) else {
            return;
        };
        let len = bytes.len().min(4096);
        let sge = if let SendOp::RdmaRead { .. } = op {
            self.side.sge(H_DATA, len)
        } else {
            let at = H_STAGE + 4096 * (self.stage % 8);
            self.stage += 1;
            self.side.fill(at, &bytes[..len]);
            self.side.sge(at, len)
        };
        if matches!(op, SendOp::Send | SendOp::SendWithInvalidate { .. }) {
            if to_s {
                self.burst_s += 1;
            } else {
                self.burst_c += 1;
            }
        }
        let wr = SendWr {
            wr_id: 1,
            op,
            sg: &[sge],
            signaled: true,
        };
        let _ = self.side.p.post_send(qp, &wr);
    }

    /// A segment of H's own data area: `len` bytes at `off` (within the area).
    fn own(&self, off: u32, len: u32) -> Segment {
        let off = off as usize % (H_DATA_LEN / 2);
        Segment {
            handle: self.side.mr.rkey,
            length: len,
            offset: self.side.mr.addr_at((H_DATA + off) as u64),
        }
    }
}

/// A call C made.
#[derive(Clone, Copy, Debug)]
struct Call {
    xid: u32,
    honest: bool,
    slot: usize,
    n: u32,
    /// A result buffer was given (Write chunk when the echo reaches the DDP threshold).
    result: bool,
    cancelled: bool,
    ended: bool,
    /// Ended cancelled with its memory lent to the peer: its slot is C's again only once
    /// `released`.
    lent: bool,
    released: bool,
}

impl Call {
    /// Ended, and its memory C's again.
    fn settled(&self) -> bool {
        self.ended && (!self.lent || self.released)
    }
}

/// A call S's server holds: its slot, and whether its arguments are in place.
#[derive(Clone, Copy, Debug)]
struct Serve {
    slot: usize,
    ready: bool,
}

/// A run in progress.
struct Run {
    c: Node,
    s: Node,
    h: Hostile,
    /// C's connection to S, and to H.
    honest: Option<ConnId>,
    victim: Option<ConnId>,
    /// S's connection from C, and from H.
    s_honest: Option<ConnId>,
    calls: BTreeMap<u64, Call>,
    c_free: Vec<usize>,
    /// Each free call slot's bytes, as its call left them: nothing may write a slot whose
    /// call is over (its keys are gone, or its connection).
    fenced: HashMap<usize, Vec<u8>>,
    next_user: u64,
    xid: u32,
    serves: HashMap<(ConnId, ServeId), Serve>,
    s_free: Vec<usize>,
    /// Answers S's server could not send yet (no send buffer free).
    retry: Vec<(ConnId, ServeId)>,
    /// Whether the honest connection must survive this run.
    guard: bool,
    shared_c: bool,
    shared_s: bool,
    credits: u32,
    clock: Instant,
    turn: u64,
}

fn be(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_be_bytes()).collect()
}

/// The chunk lists of a message, if it decodes.
fn lists(msg: &[u8]) -> Option<(u32, ChunkLists<'_>)> {
    let d = rpcrdma_proto::decode(msg, &Limits::DEFAULT).ok()?;
    let xid = d.message.xid();
    match d.message {
        Message::V1(h) => match h.body {
            rpcrdma_proto::v1::Body::Msg(l) | rpcrdma_proto::v1::Body::Nomsg(l) => Some((xid, l)),
            rpcrdma_proto::v1::Body::Error(_) => None,
        },
        Message::V2(h) => match h.body {
            rpcrdma_proto::v2::Body::Msg { chunks, .. }
            | rpcrdma_proto::v2::Body::Nomsg { chunks, .. } => Some((xid, chunks)),
            _ => None,
        },
        Message::ErrVers(_) => None,
    }
}

/// Every segment of a message's chunks: Read, Write, Reply.
fn segments(l: &ChunkLists<'_>) -> Vec<Segment> {
    let mut v: Vec<Segment> = l.reads.iter().map(|r| r.target).collect();
    for w in l.writes.iter() {
        v.extend(w.segments());
    }
    if let Some(r) = l.reply {
        v.extend(r.segments());
    }
    v
}

impl Run {
    fn new(b: &mut Bytes<'_>) -> Run {
        let f = MemFabric::new();
        let cfg = b.u8();
        let credits = 1 + u32::from(b.u8() % 8);
        // Version two on every connection the nodes make, or version one.
        let tmpl = template(if cfg & 16 == 16 { 2 } else { 1 }, credits);
        let (shared_c, shared_s) = (cfg & 1 == 1, cfg & 2 == 2);
        // Removed connections' events wait for their queue pair to retire.
        let retire = if cfg & 32 == 32 { 3 } else { 0 };
        let c = Node::new("C", &f, tmpl, shared_c, cfg & 4 == 4, retire);
        let s = Node::new("S", &f, tmpl, shared_s, cfg & 8 == 8, retire);
        let side = Side::new(SoftProvider::memory(&f, SoftConfig::default()));
        let h = Hostile {
            side,
            to_s: None,
            to_c: None,
            from_c: Vec::new(),
            from_s: Vec::new(),
            burst_s: 0,
            burst_c: 0,
            stage: 0,
            seen: Vec::new(),
        };
        let mut r = Run {
            c,
            s,
            h,
            honest: None,
            victim: None,
            s_honest: None,
            calls: BTreeMap::new(),
            c_free: (0..C_SLOTS).rev().collect(),
            fenced: HashMap::new(),
            next_user: 1,
            xid: 1,
            serves: HashMap::new(),
            s_free: (0..S_SLOTS).rev().collect(),
            retry: Vec::new(),
            guard: true,
            shared_c,
            shared_s,
            credits,
            clock: Instant::now(),
            turn: 0,
        };
        r.connect(b);
        r
    }

    /// One poll turn of everyone; time moves by a millisecond.
    fn turn(&mut self) {
        self.turn += 1;
        let now = self.clock + Duration::from_millis(self.turn);
        self.c.poll(now);
        self.s.poll(now);
        self.h.step();
        self.serve();
        self.c_events();
        // H may burst past its grant into a node's shared receive queue: the honest
        // connection's survival is then not promised (dataplane/README.md, iWARP).
        if (self.shared_s && self.h.burst_s > self.credits)
            || (self.shared_c && self.h.burst_c > self.credits)
        {
            self.guard = false;
        }
        (self.h.burst_s, self.h.burst_c) = (0, 0);
    }

    fn params(pd: &[u8]) -> ConnParams<'_> {
        ConnParams {
            private_data: pd,
            responder_resources: 16,
            initiator_depth: 16,
        }
    }

    /// Turns until `done` holds (the set-up is deterministic: it always connects).
    fn until(&mut self, what: &str, done: impl Fn(&mut Run) -> bool) {
        for _ in 0..1000 {
            if done(self) {
                return;
            }
            self.turn();
        }
        panic!("set-up hangs: {what}");
    }

    /// C adds a client connection and connects it to `addr` with its private data `pd`.
    fn c_dial(&mut self, addr: SocketAddr, pd: &[u8]) -> (QpId, ConnId) {
        let qp = self.c.qp();
        let id = self
            .c
            .drv
            .add_connection(qp, Role::Client, None)
            .expect("add");
        self.c
            .drv
            .provider_mut()
            .connect(qp, addr, &Self::params(pd))
            .expect("connect");
        (qp, id)
    }

    /// S accepts the next connection request with its private data `pd`.
    fn s_accept(&mut self, what: &str, pd: &[u8]) -> ConnId {
        self.until(what, |r| {
            r.s.cm
                .iter()
                .any(|e| matches!(e, CmEvent::ConnectRequest { .. }))
        });
        let (req, peer) = self
            .s
            .take_cm(|e| match e {
                CmEvent::ConnectRequest {
                    req, private_data, ..
                } => Some((*req, PrivateData::parse(private_data.as_slice()))),
                _ => None,
            })
            .expect("request");
        let qs = self.s.qp();
        let id = self
            .s
            .drv
            .add_connection(qs, Role::Server, peer)
            .expect("add");
        self.s
            .drv
            .provider_mut()
            .accept(req, qs, &Self::params(pd))
            .expect("accept");
        id
    }

    /// Connects C to S (honest), H to S, and C to H (victim); H's private data from the
    /// script.
    fn connect(&mut self, b: &mut Bytes<'_>) {
        let s_addr: SocketAddr = "10.0.0.2:20049".parse().unwrap();
        let h_addr: SocketAddr = "10.0.0.3:20049".parse().unwrap();
        let sl = self.s.drv.provider_mut().listen(s_addr).expect("listen");
        let s_addr = self.s.drv.provider().listen_addr(sl).expect("addr");
        let hl = self.h.side.p.listen(h_addr).expect("listen");
        let h_addr = self.h.side.p.listen_addr(hl).expect("addr");
        let c_pd = self.c.drv.template().private_data().emit();
        let s_pd = self.s.drv.template().private_data().emit();
        // H's private data: none, well formed with sizes of its choice, or bytes.
        let h_pd: Vec<u8> = match b.u8() % 3 {
            0 => Vec::new(),
            1 => PrivateData {
                remote_invalidate: b.bit(),
                send_size: 1024 * u32::from(1 + b.u8() % 8),
                recv_size: 1024 * u32::from(1 + b.u8() % 8),
            }
            .emit()
            .to_vec(),
            _ => {
                let n = usize::from(b.u8() % 40);
                b.take(n).to_vec()
            }
        };

        // C to S.
        let (_, ca) = self.c_dial(s_addr, &c_pd);
        let sb = self.s_accept("S hears C", &s_pd);
        self.until("C established", |r| {
            r.c.cm
                .iter()
                .any(|e| matches!(e, CmEvent::Established { .. }))
        });
        let pd = self
            .c
            .take_cm(|e| match e {
                CmEvent::Established { private_data, .. } => {
                    Some(PrivateData::parse(private_data.as_slice()))
                }
                _ => None,
            })
            .expect("established");
        self.c.drv.set_peer(ca, pd).expect("set_peer");
        self.honest = Some(ca);
        self.s_honest = Some(sb);

        // H to S.
        let hq = self.h.qp(FROM_S, H_RECV_S);
        self.h
            .side
            .p
            .connect(hq, s_addr, &Self::params(&h_pd))
            .expect("connect");
        self.s_accept("S hears H", &s_pd);
        self.h.to_s = Some(hq);

        // C to H.
        let (qc, cv) = self.c_dial(h_addr, &c_pd);
        let mut accepted = false;
        for _ in 0..1000 {
            self.turn();
            if !accepted {
                let at = self
                    .h
                    .side
                    .events
                    .iter()
                    .position(|e| matches!(e, CmEvent::ConnectRequest { .. }));
                if let Some(CmEvent::ConnectRequest { req, .. }) =
                    at.map(|i| self.h.side.events.remove(i))
                {
                    let q = self.h.qp(FROM_C, H_RECV_C);
                    self.h
                        .side
                        .p
                        .accept(req, q, &Self::params(&h_pd))
                        .expect("accept");
                    self.h.to_c = Some(q);
                    accepted = true;
                }
            }
            let est = self.c.take_cm(|e| match e {
                CmEvent::Established { qp, private_data } if *qp == qc => {
                    Some(PrivateData::parse(private_data.as_slice()))
                }
                _ => None,
            });
            if let Some(pd) = est {
                self.c.drv.set_peer(cv, pd).expect("set_peer");
                self.victim = Some(cv);
                return;
            }
        }
        panic!("set-up hangs: C to H");
    }

    /// S's server: accepts what it is handed into a slot of its own, answers ECHO with the
    /// echo (what H sends is served the same way), anything else with an empty reply.
    fn serve(&mut self) {
        let evs = std::mem::take(&mut self.s.events);
        for (conn, ev) in evs {
            match ev {
                Event::IncomingCall(ic) => {
                    let key = (conn, ic.id);
                    assert!(!self.serves.contains_key(&key), "a call delivered twice");
                    let slot = match self.s_free.pop() {
                        Some(slot) if ic.args_len <= S_ARGS => slot,
                        other => {
                            self.s_free.extend(other);
                            // Too large, or no room: refused (GARBAGE_ARGS / SYSTEM_ERR).
                            let st = if ic.args_len > S_ARGS { 4 } else { 5 };
                            self.serves.insert(
                                key,
                                Serve {
                                    slot: usize::MAX,
                                    ready: true,
                                },
                            );
                            let _ = self.s.drv.reject_call(conn, ic.id, st, &mut self.s.mem);
                            self.s_events();
                            continue;
                        }
                    };
                    self.serves.insert(key, Serve { slot, ready: false });
                    let dest = MemRef::new(self.s.mem.mr, self.s_slot(slot), ic.args_len);
                    match self.s.drv.accept_call(conn, ic.id, dest, &mut self.s.mem) {
                        Ok(Accepted::Ready { args_len }) => self.answer(conn, ic.id, args_len),
                        Ok(Accepted::Pulling) | Err(_) => {}
                    }
                    self.s_events();
                }
                Event::ArgsReady { id, args_len } => {
                    match self.serves.get(&(conn, id)) {
                        Some(sv) if !sv.ready => {}
                        _ => panic!("ArgsReady for a call not being pulled"),
                    }
                    self.answer(conn, id, args_len);
                }
                Event::Optional(o) => {
                    // What the control plane does with an operation it does not take.
                    self.s.drv.reject_optional(conn, o.xid, &mut self.s.mem);
                    self.s_events();
                }
                Event::ReplyDone { id, .. } | Event::ServeAborted { id } => {
                    let sv = self
                        .serves
                        .remove(&(conn, id))
                        .expect("a served call ended twice, or was never delivered");
                    if sv.slot != usize::MAX {
                        self.s_free.push(sv.slot);
                    }
                    self.retry.retain(|k| *k != (conn, id));
                }
                _ => {}
            }
        }
        // Answers refused for want of a send buffer go again.
        for (conn, id) in std::mem::take(&mut self.retry) {
            self.send_answer(conn, id);
        }
    }

    /// Events S's driver queued while the server worked: handled on the next turn.
    fn s_events(&mut self) {
        while let Some(e) = self.s.drv.poll_event() {
            self.s.events.push(e);
        }
    }

    fn s_slot(&self, slot: usize) -> u64 {
        self.s.app + slot as u64 * S_SLOT
    }

    fn answer(&mut self, conn: ConnId, id: ServeId, args_len: u32) {
        if let Some(sv) = self.serves.get_mut(&(conn, id)) {
            sv.ready = true;
            // The arguments' length: the echo never reaches past them.
            let slot = sv.slot;
            let base = self.s_slot(slot);
            let args = self
                .s
                .mem
                .get(MemRef::new(self.s.mem.mr, base, args_len.min(4)));
            let n = match args.get(..4) {
                Some(w) => u32::from_be_bytes([w[0], w[1], w[2], w[3]]),
                None => 0,
            };
            let n = n.min(args_len.saturating_sub(4));
            let word = MemRef::new(self.s.mem.mr, base + u64::from(S_ARGS), 4);
            self.s.mem.write(word, &n.to_be_bytes());
        }
        self.send_answer(conn, id);
    }

    fn send_answer(&mut self, conn: ConnId, id: ServeId) {
        let Some(sv) = self.serves.get(&(conn, id)).copied() else {
            return;
        };
        let base = self.s_slot(sv.slot);
        let word = MemRef::new(self.s.mem.mr, base + u64::from(S_ARGS), 4);
        let n = {
            let w = self.s.mem.get(word);
            u32::from_be_bytes([w[0], w[1], w[2], w[3]])
        };
        let results = [ResultPiece {
            mem: MemRef::new(self.s.mem.mr, base + 4, n),
            xdr_pos: 4,
        }];
        let spec = ReplySpec {
            accept_stat: 0,
            msg: word,
            results: &results,
        };
        // Refused for want of a send buffer: again on the next turn. Any other refusal
        // (closed, or an answer too large for the call) ends the call through the engine.
        if let Err(SubmitError::Busy) = self.s.drv.submit_reply(conn, id, &spec, &mut self.s.mem) {
            self.retry.push((conn, id));
        }
        self.s_events();
    }

    /// C's events: calls ending, and the memory of those that ended lent coming back.
    fn c_events(&mut self) {
        for (conn, ev) in std::mem::take(&mut self.c.events) {
            let d = match ev {
                Event::CallDone(d) => d,
                Event::CallReleased { user, .. } => {
                    let call = self.calls.get_mut(&user);
                    let call = call.unwrap_or_else(|| panic!("released, never submitted: {user}"));
                    assert!(
                        call.ended && call.lent && !call.released,
                        "released, not lent or twice: {call:?}"
                    );
                    call.released = true;
                    let slot = call.slot;
                    self.fenced.insert(slot, self.slot_bytes(slot));
                    self.c_free.push(slot);
                    continue;
                }
                _ => continue,
            };
            let Some(call) = self.calls.get_mut(&d.user) else {
                panic!("a call ended that was never submitted: {d:?}");
            };
            assert!(!call.ended, "a call ended twice: {d:?}");
            call.ended = true;
            call.lent = d.lent;
            let call = *call;
            if call.honest {
                assert_eq!(
                    Some(conn),
                    self.honest,
                    "an honest call ended on another connection"
                );
                self.check_honest(&call, &d);
            }
            if d.lent {
                // The peer may still write it: not C's until released.
                continue;
            }
            self.fenced.insert(call.slot, self.slot_bytes(call.slot));
            self.c_free.push(call.slot);
        }
    }

    fn c_slot(&self, slot: usize) -> u64 {
        self.c.app + slot as u64 * C_SLOT
    }

    /// Call slot `slot`'s bytes.
    fn slot_bytes(&self, slot: usize) -> Vec<u8> {
        let at = MemRef::new(self.c.mem.mr, self.c_slot(slot), C_SLOT as u32);
        self.c.mem.get(at)
    }

    /// Free call slot `slot` is as its last call left it.
    fn check_fenced(&self, slot: usize) {
        if let Some(was) = self.fenced.get(&slot) {
            assert!(
                *was == self.slot_bytes(slot),
                "memory of an ended call (slot {slot}) was written"
            );
        }
    }

    /// An honest call that ends: with its echo, or cancelled as asked; anything else only
    /// when the guard is off (H flooded a shared receive queue).
    fn check_honest(&self, call: &Call, d: &CallDone) {
        if !self.guard {
            return;
        }
        if call.cancelled {
            assert!(
                matches!(d.status, CallStatus::Cancelled | CallStatus::Ok),
                "a cancelled honest call ended {d:?}"
            );
            return;
        }
        assert_eq!(d.status, CallStatus::Ok, "an honest call failed: {d:?}");
        let base = self.c_slot(call.slot);
        let data = pattern(d.xid, call.n as usize);
        let mr = self.c.mem.mr;
        if call.result && call.n >= DDP {
            assert_eq!(d.results().collect::<Vec<_>>(), &[(4, call.n)][..], "{d:?}");
            let got = self.c.mem.get(MemRef::new(mr, base + 64 + 8192, call.n));
            assert!(got == data, "honest echo bytes differ (Write chunk)");
        } else {
            assert!(d.reply_len >= 4 + call.n, "{d:?}");
            let got = self
                .c
                .mem
                .get(MemRef::new(mr, base + 64 + 2 * 8192 + 4, call.n));
            assert!(
                got == data,
                "honest echo bytes differ (inline or Reply chunk)"
            );
        }
    }

    /// C calls ECHO on the honest or the victim connection.
    fn call(&mut self, b: &mut Bytes<'_>) {
        let honest = b.bit();
        let n = match b.u8() % 8 {
            0 => 0,
            1 => 13,
            2 => 100,
            3 => DDP - 4,
            4 => DDP,
            5 => 3000,
            6 => 4090,
            _ => MAX_ECHO,
        };
        let result = b.bit();
        let Some(conn) = (if honest { self.honest } else { self.victim }) else {
            return;
        };
        let Some(slot) = self.c_free.pop() else {
            return;
        };
        self.check_fenced(slot);
        let (user, xid) = (self.next_user, self.xid);
        let base = self.c_slot(slot);
        let mr = self.c.mem.mr;
        let at = |off: u64, len: u32| MemRef::new(mr, base + off, len);
        self.c.mem.write(at(0, 4), &n.to_be_bytes());
        self.c.mem.write(at(64, n), &pattern(xid, n as usize));
        // The reply buffers are cleared, so that a stale echo is never taken for a new one.
        self.c.mem.write(at(64 + 8192, 8192), &[0; 8192]);
        self.c.mem.write(at(64 + 2 * 8192, 8192), &[0; 8192]);
        let results = [at(64 + 8192, n)];
        let spec = CallSpec {
            auth: None,
            user,
            xid,
            prog: RDMATEST_PROG,
            vers: 1,
            proc_: rdmatest::ECHO,
            msg: at(0, 4),
            args: &[ArgPiece {
                mem: at(64, n),
                xdr_pos: 4,
            }],
            results: if result { &results } else { &[] },
            reply: at(64 + 2 * 8192, n + 8),
        };
        match self.c.drv.submit_call(conn, &spec, &mut self.c.mem) {
            Ok(()) => {
                if trace() {
                    eprintln!("  call {user} honest={honest} n={n} result={result}");
                }
                self.next_user += 1;
                self.xid = self.xid.wrapping_add(1).max(1);
                self.calls.insert(
                    user,
                    Call {
                        xid,
                        honest,
                        slot,
                        n,
                        result,
                        cancelled: false,
                        ended: false,
                        lent: false,
                        released: false,
                    },
                );
            }
            Err(e) => {
                self.fenced.insert(slot, self.slot_bytes(slot));
                self.c_free.push(slot);
                // The honest connection takes every call while it is open (the script makes
                // at most `C_SLOTS` calls at once, and the engine queues what credits hold).
                assert!(
                    !honest || !self.guard || matches!(e, SubmitError::Busy),
                    "the honest connection refused a call: {e:?}"
                );
            }
        }
        self.c_drain();
    }

    fn c_drain(&mut self) {
        while let Some(e) = self.c.drv.poll_event() {
            self.c.events.push(e);
        }
    }

    /// C cancels one of its calls (its app went away).
    fn cancel(&mut self, b: &mut Bytes<'_>) {
        let open: Vec<u64> = self
            .calls
            .iter()
            .filter(|(_, c)| !c.ended && !c.cancelled)
            .map(|(u, _)| *u)
            .collect();
        let Some(&user) = open.get(usize::from(b.u8()) % open.len().max(1)) else {
            return;
        };
        let call = self.calls[&user];
        let conn = if call.honest {
            self.honest
        } else {
            self.victim
        };
        if let Some(conn) = conn {
            if self
                .c
                .drv
                .cancel_call(conn, call.xid, &mut self.c.mem)
                .is_ok()
            {
                // Its chunks stay valid until its late reply (R8166-8.1.4-c): the
                // responder's RDMA Read or Write still finds them, and the honest connection
                // survives C's own cancels.
                if let Some(c) = self.calls.get_mut(&user) {
                    c.cancelled = true;
                }
            }
        }
        self.c_drain();
    }

    /// H sends S something: raw bytes, a plausible call whose chunks point at H's memory,
    /// or one of S's own messages back with words changed.
    fn h_to_s(&mut self, b: &mut Bytes<'_>) {
        let msg = match b.u8() % 3 {
            0 => {
                let n = usize::from(b.u16()) % 300;
                b.take(n).to_vec()
            }
            1 => self.plausible_call(b),
            _ => {
                let from = &self.h.from_s;
                let Some(m) = from.len().checked_sub(1 + usize::from(b.u8() % 4)) else {
                    return;
                };
                let mut m = from[m].clone();
                mutate(&mut m, b);
                m
            }
        };
        let op = if b.bit() {
            let key = self.h.own(0, 0).handle.wrapping_add(u32::from(b.u8() % 3));
            SendOp::SendWithInvalidate { rkey: key }
        } else {
            SendOp::Send
        };
        // Once, or in a burst past the grant (the connection must end, and nothing leak).
        let times = if b.u8() % 8 == 0 { self.credits + 2 } else { 1 };
        for _ in 0..times {
            self.h.post(true, op, &msg);
        }
    }

    /// A version-one call of RDMATEST ECHO whose Read, Write and Reply chunks (any of them)
    /// point at H's memory, under its region key or a wrong one.
    fn plausible_call(&mut self, b: &mut Bytes<'_>) -> Vec<u8> {
        let xid = 0x4800_0000 | u32::from(b.u16());
        let n = u32::from(b.u16()) % 6000;
        let nomsg = b.u8() % 4 == 0;
        let mut m = be(&[xid, 1, 1 + u32::from(b.u8() % 40), u32::from(nomsg)]);
        let seg = |h: &Hostile, b: &mut Bytes<'_>| -> Segment {
            let mut s = h.own(u32::from(b.u16()) * 4, u32::from(b.u16()) % 9000);
            if b.u8() % 8 == 0 {
                s.handle ^= 1 + u32::from(b.u8());
            }
            s
        };
        let push = |m: &mut Vec<u8>, s: Segment| {
            m.extend(be(&[
                s.handle,
                s.length,
                (s.offset >> 32) as u32,
                s.offset as u32,
            ]));
        };
        // Read list: the echoed bytes at position 44 (after the call header and the
        // length word), or the whole call at position zero.
        for _ in 0..b.u8() % 3 {
            let pos = if b.bit() { 0 } else { 44 };
            let s = seg(&self.h, b);
            // The source bytes: an ECHO call of the chunk's length.
            let src = H_DATA + (s.offset - self.h.own(0, 0).offset) as usize;
            let fill = pattern(xid, (s.length as usize).min(H_DATA_LEN - (src - H_DATA)));
            self.h.side.fill(src, &fill);
            m.extend(be(&[1, pos]));
            push(&mut m, s);
        }
        m.extend(be(&[0]));
        for _ in 0..b.u8() % 3 {
            m.extend(be(&[1, 1]));
            push(&mut m, seg(&self.h, b));
        }
        m.extend(be(&[0]));
        if b.u8() % 3 == 0 {
            m.extend(be(&[1, 1]));
            push(&mut m, seg(&self.h, b));
        } else {
            m.extend(be(&[0]));
        }
        if !nomsg {
            m.extend(crate::rpcmsg::call_header(
                xid,
                RDMATEST_PROG,
                1,
                rdmatest::ECHO,
            ));
            m.extend(be(&[n]));
            let inline = (n as usize).min(3000);
            m.extend(pattern(xid, inline));
            m.resize(m.len().next_multiple_of(4), 0);
        }
        m
    }

    /// H answers one of C's calls (or sends C anything): built on the call's own chunks,
    /// after RDMA Writes into them at offsets and lengths of its choice.
    fn h_to_c(&mut self, b: &mut Bytes<'_>) {
        let pick = usize::from(b.u8());
        let call = match self.h.from_c.len() {
            0 => None,
            k => Some(self.h.from_c[k - 1 - pick % k].clone()),
        };
        let parsed = call.as_deref().and_then(lists);
        let segs = parsed
            .as_ref()
            .map(|(_, l)| segments(l))
            .unwrap_or_default();
        self.h.seen.extend(segs.iter().copied());
        if self.h.seen.len() > 32 {
            let cut = self.h.seen.len() - 32;
            self.h.seen.drain(..cut);
        }
        match b.u8() % 6 {
            0 => {
                let n = usize::from(b.u16()) % 300;
                let m = b.take(n).to_vec();
                self.h.post(false, SendOp::Send, &m);
            }
            1 => {
                let Some(m) = call else { return };
                self.answer_call(b, &m);
            }
            2 => {
                // RDMA Writes into the call's Write or Reply chunk segments first.
                for s in &segs {
                    if b.bit() {
                        let off = u64::from(b.u16() % 64) * 4 * u64::from(b.bit());
                        let len = match b.u8() % 4 {
                            0 => s.length,
                            1 => s.length.saturating_add(1 + u32::from(b.u8() % 64)),
                            _ => u32::from(b.u16()) % 4096,
                        } as usize;
                        let data = pattern(0x77, len.min(4096));
                        let op = SendOp::RdmaWrite {
                            remote_addr: s.offset.wrapping_add(off),
                            rkey: s.handle,
                        };
                        self.h.post(false, op, &data);
                    }
                }
                let Some((xid, l)) = parsed else {
                    return;
                };
                let m = self.reply_to(b, xid, &l);
                let op = if b.u8() % 4 == 0 {
                    let k = segs.get(usize::from(b.u8()) % segs.len().max(1));
                    SendOp::SendWithInvalidate {
                        rkey: k.map_or(b.u32(), |s| s.handle),
                    }
                } else {
                    SendOp::Send
                };
                self.h.post(false, op, &m);
            }
            3 => {
                // A call's own bytes back, words changed.
                let Some(mut m) = call else { return };
                mutate(&mut m, b);
                self.h.post(false, SendOp::Send, &m);
            }
            4 => {
                // An RDMA Read of a segment it saw (a Read chunk), at any offset and length.
                let seen = &self.h.seen;
                let Some(s) = seen.get(usize::from(b.u8()) % seen.len().max(1)).copied() else {
                    return;
                };
                let off = u64::from(b.u16() % 512) * 8 * u64::from(b.bit());
                let len = (u32::from(b.u16()) % 4096).max(1) as usize;
                let op = SendOp::RdmaRead {
                    remote_addr: s.offset.wrapping_add(off),
                    rkey: s.handle,
                };
                self.h.post(false, op, &vec![0; len]);
            }
            _ => {
                // A Write under a key it saw (maybe of a call long ended) or guessed.
                let seen = &self.h.seen;
                let s = seen
                    .get(usize::from(b.u8()) % seen.len().max(1))
                    .copied()
                    .unwrap_or_default();
                let rkey = if b.bit() { s.handle } else { b.u32() };
                let op = SendOp::RdmaWrite {
                    remote_addr: s.offset.wrapping_add(u64::from(b.u16())),
                    rkey,
                };
                let len = usize::from(b.u16()) % 4096;
                self.h.post(false, op, &pattern(0x55, len.max(1)));
            }
        }
    }

    /// Answers C's call `m` as an echo server would (the echo in the Write chunk, or the
    /// whole reply in the Reply chunk, or inline), then with at most one twist: lengths
    /// claimed past what was written, Send With Invalidate of the call's key or of another,
    /// a grant of zero, or bytes written past a segment's end.
    fn answer_call(&mut self, b: &mut Bytes<'_>, m: &[u8]) {
        let Some((xid, l)) = lists(m) else { return };
        let twist = b.u8() % 10;
        let credit = if twist == 6 {
            0
        } else {
            1 + u32::from(b.u8() % 8)
        };
        // The echoed length: the call's own, when it came inline.
        let n = rpcrdma_proto::decode(m, &Limits::DEFAULT)
            .ok()
            .and_then(|d| crate::conn::script::be32(m, d.header_len + 40))
            .unwrap_or(0)
            .min(MAX_ECHO);
        let data = pattern(xid, n as usize);
        // Writes `bytes` across `segs` in order; the lengths written, per segment.
        let place = |h: &mut Hostile, segs: &[Segment], bytes: &[u8]| -> Vec<u32> {
            let mut at = 0usize;
            segs.iter()
                .map(|s| {
                    let k = (s.length as usize).min(bytes.len() - at).min(4096);
                    let over = if twist == 7 { 64 } else { 0 };
                    if k > 0 {
                        let op = SendOp::RdmaWrite {
                            remote_addr: s.offset,
                            rkey: s.handle,
                        };
                        let end = (at + k + over).min(bytes.len());
                        let mut chunk = bytes[at..end].to_vec();
                        chunk.resize(k + over, 0x99);
                        h.post(false, op, &chunk);
                    }
                    at += k;
                    k as u32
                })
                .collect()
        };
        let mut rpc = crate::rpcmsg::reply_header(xid, 0).to_vec();
        rpc.extend(be(&[n]));
        let wchunk: Option<Vec<Segment>> = l.writes.iter().next().map(|c| c.segments().collect());
        let rchunk: Option<Vec<Segment>> = l.reply.map(|c| c.segments().collect());
        let mut hdr = be(&[xid, 1, credit]);
        let claim = |k: u32| if twist == 3 { k + 4 } else { k };
        let seg_words =
            |s: &Segment, k: u32| be(&[s.handle, k, (s.offset >> 32) as u32, s.offset as u32]);
        match (wchunk, rchunk) {
            (Some(w), _) if n >= DDP => {
                // The echo in the Write chunk; the reply's XDR inline.
                let written = place(&mut self.h, &w, &data);
                hdr.extend(be(&[0, 0, 1, w.len() as u32]));
                for (s, k) in w.iter().zip(written) {
                    hdr.extend(seg_words(s, claim(k)));
                }
                hdr.extend(be(&[0, 0]));
                hdr.extend(rpc);
            }
            (_, Some(r)) if rpc.len() + data.len() > 1000 => {
                // The whole reply through the Reply chunk (RDMA_NOMSG).
                rpc.extend(&data);
                rpc.resize(rpc.len().next_multiple_of(4), 0);
                let written = place(&mut self.h, &r, &rpc);
                hdr.extend(be(&[1, 0, 0, 1, r.len() as u32]));
                for (s, k) in r.iter().zip(written) {
                    hdr.extend(seg_words(s, claim(k)));
                }
            }
            _ => {
                hdr.extend(be(&[0, 0, 0, 0]));
                hdr.extend(rpc);
                hdr.extend(&data);
                hdr.resize(hdr.len().next_multiple_of(4), 0);
            }
        }
        let first = segments(&l).first().map(|s| s.handle);
        let op = match (twist, first) {
            (4, Some(k)) => SendOp::SendWithInvalidate { rkey: k },
            (5, _) => SendOp::SendWithInvalidate { rkey: b.u32() },
            _ => SendOp::Send,
        };
        self.h.post(false, op, &hdr);
    }

    /// A reply to `xid` echoing the call's Write and Reply chunks with lengths of H's choice
    /// (RDMA_NOMSG when it uses the Reply chunk), then an ECHO reply inline.
    fn reply_to(&self, b: &mut Bytes<'_>, xid: u32, l: &ChunkLists<'_>) -> Vec<u8> {
        let credit = u32::from(b.u8() % 10);
        let use_reply = l.reply.is_some() && b.bit();
        let mut m = be(&[xid, 1, credit, u32::from(use_reply), 0]);
        let len = |s: &Segment, b: &mut Bytes<'_>| match b.u8() % 4 {
            0 | 1 => s.length,
            2 => s.length.saturating_add(4),
            _ => u32::from(b.u16()),
        };
        let push = |m: &mut Vec<u8>, s: Segment, n: u32| {
            m.extend(be(&[s.handle, n, (s.offset >> 32) as u32, s.offset as u32]));
        };
        for w in l.writes.iter() {
            let segs: Vec<Segment> = w.segments().collect();
            m.extend(be(&[1, segs.len() as u32]));
            for s in segs {
                let n = len(&s, b);
                push(&mut m, s, n);
            }
        }
        m.extend(be(&[0]));
        match l.reply {
            Some(r) if use_reply => {
                let segs: Vec<Segment> = r.segments().collect();
                m.extend(be(&[1, segs.len() as u32]));
                for s in segs {
                    let n = len(&s, b);
                    push(&mut m, s, n);
                }
            }
            _ => m.extend(be(&[0])),
        }
        if !use_reply {
            m.extend(crate::rpcmsg::reply_header(xid, u32::from(b.u8() % 8 == 0)));
            let n = u32::from(b.u16()) % 200;
            m.extend(be(&[n]));
            m.extend(pattern(0x33, n as usize));
            m.resize(m.len().next_multiple_of(4), 0);
        }
        m
    }

    /// S's side of H's connection: found by elimination.
    fn attacker(&self) -> Option<ConnId> {
        (0..8)
            .map(QpId)
            .filter_map(|q| self.s.drv.by_qp(q))
            .find(|id| Some(*id) != self.s_honest)
    }

    /// The control plane changes a hostile connection's settings, as it does on what a peer
    /// announces (xcharext, private data) or on an operator's command: C's victim or S's
    /// attacker.
    fn control(&mut self, b: &mut Bytes<'_>) {
        let (node, id) = if b.bit() {
            (&mut self.c, self.victim)
        } else {
            let id = self.attacker();
            (&mut self.s, id)
        };
        let Some(id) = id else { return };
        let v = b.u32();
        let _ = match b.u8() % 7 {
            0 => node.drv.configure(id, |c| c.set_credits(v % 12)),
            1 => node.drv.configure(id, |c| c.set_peer_receive_size(v)),
            2 => node.drv.configure(id, |c| c.set_own_receive_size(v)),
            3 => node.drv.configure(id, |c| c.set_peer_send_size(v)),
            4 => node
                .drv
                .configure(id, |c| c.set_peer_takes_invalidate(v & 1 == 1)),
            5 => node
                .drv
                .configure(id, |c| c.set_chunk_caps(v % 20, (v >> 8) % 6)),
            _ => node
                .drv
                .configure(id, |c| c.set_peer_receive_cap((v & 1 == 1).then_some(v))),
        };
    }

    /// H sends S an RDMA2_OPTIONAL message: a transport-characteristics operation of any
    /// type with any body (S speaks version two in some runs; else it is refused).
    fn h_optional(&mut self, b: &mut Bytes<'_>) {
        let opttype = match b.u8() % 6 {
            k @ 0..=3 => k as u32 + 1,
            4 => 0,
            _ => b.u32(),
        };
        let xid = b.u32();
        let mut m = be(&[xid, 2, 1 + u32::from(b.u8() % 8), RDMA2_OPTIONAL]);
        m.extend(be(&[u32::from(b.bit()), opttype]));
        let n = usize::from(b.u8() % 64);
        let info = b.take(n).to_vec();
        m.extend(be(&[info.len() as u32]));
        m.extend(&info);
        m.resize(m.len().next_multiple_of(4), 0);
        self.h.post(true, SendOp::Send, &m);
    }

    /// One step of the script; false when it ends.
    fn step(&mut self, b: &mut Bytes<'_>) -> bool {
        if b.0.is_empty() {
            return false;
        }
        let op = b.u8();
        if trace() {
            eprintln!("step {op:#04x} (turn {})", self.turn);
        }
        match op % 14 {
            0..=2 => self.call(b),
            3 => self.cancel(b),
            4 | 5 => self.h_to_s(b),
            6 | 7 => self.h_to_c(b),
            8 => {
                // H drops a connection.
                let qp = if b.bit() { self.h.to_s } else { self.h.to_c };
                if let Some(qp) = qp {
                    let _ = self.h.side.p.disconnect(qp);
                }
            }
            9 => {
                // C's owner ends the victim connection, or S's the attacker's.
                if b.bit() {
                    if let Some(v) = self.victim {
                        self.c.drv.close(v, CloseReason::Requested, &mut self.c.mem);
                        self.c_drain();
                    }
                } else {
                    if let Some(id) = self.attacker() {
                        self.s
                            .drv
                            .close(id, CloseReason::Requested, &mut self.s.mem);
                        self.s_events();
                    }
                }
            }
            11 => self.control(b),
            12 => self.h_optional(b),
            _ => {
                for _ in 0..1 + b.u8() % 8 {
                    self.turn();
                }
            }
        }
        self.turn();
        true
    }

    /// The end: the honest calls finish; then every connection closes and goes, and the
    /// pools are whole again.
    fn finish(mut self) {
        let open = |r: &Run| r.calls.values().any(|c| c.honest && !c.ended);
        for _ in 0..SETTLE_TURNS {
            if !open(&self) {
                break;
            }
            self.turn();
        }
        assert!(
            !self.guard || !open(&self),
            "honest calls never ended: {:?}",
            self.calls
                .values()
                .filter(|c| c.honest && !c.ended)
                .collect::<Vec<_>>()
        );
        if self.guard {
            let h = self.honest.expect("honest");
            assert!(
                self.c
                    .drv
                    .connection(h)
                    .is_some_and(|c| c.closed().is_none()),
                "the honest connection ended"
            );
        }
        // Everyone closes; the nodes remove what the provider reports disconnected.
        if let Some(qp) = self.h.to_s.take() {
            let _ = self.h.side.p.disconnect(qp);
        }
        if let Some(qp) = self.h.to_c.take() {
            let _ = self.h.side.p.disconnect(qp);
        }
        for id in [self.honest, self.victim].into_iter().flatten() {
            self.c
                .drv
                .close(id, CloseReason::Requested, &mut self.c.mem);
        }
        for _ in 0..SETTLE_TURNS {
            let live = |n: &Node| n.drv.connection_ids().next().is_some();
            if !live(&self.c) && !live(&self.s) && self.calls.values().all(Call::settled) {
                break;
            }
            self.turn();
        }
        // What the provider never reported is removed by hand.
        for n in [&mut self.c, &mut self.s] {
            let left: Vec<ConnId> = n.drv.connection_ids().collect();
            for id in left {
                let _ = n.drv.remove(id);
            }
            // A provider that retires queue pairs late does so within a few polls.
            for _ in 0..SETTLE_TURNS {
                if n.drv.retiring() == 0 {
                    break;
                }
                n.drv.poll(self.clock, &mut n.mem);
            }
            assert_eq!(n.drv.retiring(), 0, "{}: queue pairs never retired", n.name);
            while let Some(e) = n.drv.poll_event() {
                n.events.push(e);
            }
        }
        self.serve();
        self.c_events();
        for &slot in &self.c_free {
            self.check_fenced(slot);
        }
        let unended: Vec<&Call> = self.calls.values().filter(|c| !c.settled()).collect();
        assert!(
            unended.is_empty(),
            "calls never ended, or never released: {unended:?}"
        );
        assert!(
            self.serves.is_empty(),
            "served calls never ended: {}",
            self.serves.len()
        );
        for (name, n) in [("C", &self.c), ("S", &self.s)] {
            assert_eq!(
                n.drv.buffer_counts(),
                n.start,
                "{name}'s pools are not whole"
            );
            assert_eq!(
                n.drv.free_blocks(),
                n.blocks,
                "{name}'s blocks are not all back"
            );
        }
    }
}

/// Plays the script in `data` (see the module documentation); panics if a `Driver` breaks
/// its contract.
pub fn run(data: &[u8]) {
    let mut b = Bytes(data);
    let mut r = Run::new(&mut b);
    for _ in 0..MAX_STEPS {
        if !r.step(&mut b) {
            break;
        }
    }
    r.finish();
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// The `driver` fuzz target's contract, on random scripts (see the module docs).
        #[test]
        fn prop_scripted_drivers_keep_their_contract(
            data in proptest::collection::vec(any::<u8>(), 0..600)
        ) {
            super::run(&data);
        }
    }
}
