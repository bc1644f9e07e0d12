//! A two-engine simulator for tests: executes each side's [`Work`] against the other's
//! memory (windows with keys, access rights and bounds, Send into posted receives only),
//! feeds completions back, records every posted work request, and lets a test inject raw
//! messages as the peer. Built for the crate's tests and, with the `sim` feature, for the
//! fuzz target (`fuzz/`, through [`script`](super::script)); not part of the API.

use std::collections::VecDeque;
use std::time::Instant;

use rpcrdma_proto::Segment;
use rpcrdma_verbs::{Access, MrId, WcStatus};

use super::{
    Accepted, CallSpec, Completion, ConnConfig, Connection, Event, ReplySpec, ResultPiece, Role,
    ServeId, Work,
};
use crate::mem::{Env, MemRef, Memory, VecMemory};
use crate::rpcmsg;

pub const POOL: MrId = MrId(1);
/// Region of a side's shared receive buffers (when its config says `shared_recv`).
pub const SRQ: MrId = MrId(3);
const SHARED: u32 = u32::MAX;
/// Region of a side's shared send buffers (when its config says `shared_send`).
pub const SENDS: MrId = MrId(4);
/// Shared send buffers of a side.
pub const SEND_COUNT: usize = 24;

#[derive(Debug)]
enum Cqe {
    Wc(Completion),
    Shared {
        buf: MemRef,
        len: u32,
        inv: Option<u32>,
    },
}
pub const APP: MrId = MrId(2);
pub const APP_LEN: usize = 8 << 20;

#[derive(Clone, Copy, Debug)]
struct Window {
    key: u32,
    at: MemRef,
    access: Access,
    valid: bool,
}

/// One side's memory and windows: the [`Env`] the engine sees.
#[derive(Debug)]
pub struct SimMem {
    pub mem: VecMemory,
    windows: Vec<Window>,
    next_key: u32,
    /// When set, `expose` fails (provider refusal).
    pub refuse_expose: bool,
    /// Free shared send buffers.
    pub sends: Vec<MemRef>,
    /// When set, local invalidations fail.
    pub refuse_invalidate: bool,
}

fn addr(at: MemRef) -> u64 {
    (u64::from(at.mr.0) << 40) | at.offset
}

impl Memory for SimMem {
    fn read(&self, at: MemRef, dst: &mut [u8]) -> bool {
        self.mem.read(at, dst)
    }
    fn write(&mut self, at: MemRef, src: &[u8]) -> bool {
        self.mem.write(at, src)
    }
    fn copy(&mut self, from: MemRef, to: MemRef) -> bool {
        self.mem.copy(from, to)
    }
}

impl Env for SimMem {
    fn expose(&mut self, at: MemRef, access: Access) -> Option<Segment> {
        if self.refuse_expose {
            return None;
        }
        self.next_key = self
            .next_key
            .wrapping_mul(2_654_435_761)
            .wrapping_add(0x9e37);
        let key = self.next_key;
        self.windows.push(Window {
            key,
            at,
            access,
            valid: true,
        });
        Some(Segment::new(key, at.len, addr(at)))
    }

    fn take_send(&mut self) -> Option<MemRef> {
        self.sends.pop()
    }
}

impl SimMem {
    /// Resolves a peer's remote access to a local range, checking key, rights and bounds.
    pub(crate) fn resolve(&self, rkey: u32, a: u64, len: u32, need: Access) -> Option<MemRef> {
        let w = self.windows.iter().rev().find(|w| w.key == rkey)?;
        if !w.valid || !w.access.contains(need) {
            return None;
        }
        let base = addr(w.at);
        let off = a.checked_sub(base)?;
        let end = off.checked_add(u64::from(len))?;
        if end > u64::from(w.at.len) {
            return None;
        }
        w.at.sub(off as u32, len)
    }

    fn invalidate(&mut self, rkey: u32) -> bool {
        match self
            .windows
            .iter_mut()
            .rev()
            .find(|w| w.key == rkey && w.valid)
        {
            Some(w) => {
                w.valid = false;
                true
            }
            None => false,
        }
    }

    /// Keys ever exposed.
    pub fn exposed_total(&self) -> usize {
        self.windows.len()
    }

    /// Whether a valid key still lets the peer reach any byte of `at`.
    pub fn reachable(&self, at: MemRef) -> bool {
        let end = |m: MemRef| m.offset + u64::from(m.len);
        self.windows.iter().any(|w| {
            w.valid
                && w.at.mr == at.mr
                && w.at.len > 0
                && at.len > 0
                && w.at.offset < end(at)
                && at.offset < end(w.at)
        })
    }

    /// Keys still valid (exposed and not invalidated).
    pub fn live_windows(&self) -> usize {
        self.windows.iter().filter(|w| w.valid).count()
    }
}

/// One endpoint of the simulation.
#[derive(Debug)]
pub struct Side {
    pub conn: Connection,
    pub env: SimMem,
    posted: VecDeque<(u32, MemRef)>,
    cq: VecDeque<Cqe>,
    /// Every work request posted, in order.
    pub log: Vec<Work>,
    /// The bytes of every Send, in order.
    pub sent: Vec<Vec<u8>>,
    /// When set, Send completions are held back (delivered by `release_sends`).
    pub hold_sends: bool,
    /// When set, unsignaled Sends are reported too (a provider may; the engine must take
    /// either).
    pub report_unsignaled: bool,
    held: Vec<Completion>,
    /// When set, the completions of a step go to the engine as batches
    /// (`handle_completions`), each run of them between shared receives as one.
    pub batched: bool,
    /// Events not yet taken by the test.
    pub events: VecDeque<Event>,
    /// Every event the engine gave, in order.
    pub event_log: Vec<Event>,
    bump: u64,
    app_len: u64,
    /// Largest number of RDMA Reads seen in flight at once.
    pub max_reads_in_flight: u32,
    reads_in_flight: u32,
}

impl Side {
    pub fn new(cfg: ConnConfig) -> Side {
        Side::with_app_len(cfg, APP_LEN)
    }

    /// A side whose app memory is `app_len` bytes (the fuzz target keeps it small).
    pub fn with_app_len(cfg: ConnConfig, app_len: usize) -> Side {
        let mut mem = VecMemory::new();
        mem.add(
            POOL,
            cfg.send_pool.len as usize + cfg.recv_pool.len as usize + 64,
        );
        mem.add(APP, app_len);
        let shared = cfg.shared_recv;
        mem.add(SRQ, 16 * cfg.recv_size as usize);
        let mut side = Side {
            conn: Connection::new(cfg).expect("config"),
            env: SimMem {
                mem,
                windows: Vec::new(),
                next_key: 0x1234,
                refuse_expose: false,
                sends: Vec::new(),
                refuse_invalidate: false,
            },
            posted: VecDeque::new(),
            cq: VecDeque::new(),
            log: Vec::new(),
            sent: Vec::new(),
            hold_sends: false,
            report_unsignaled: false,
            held: Vec::new(),
            batched: false,
            events: VecDeque::new(),
            event_log: Vec::new(),
            bump: 0,
            app_len: app_len as u64,
            max_reads_in_flight: 0,
            reads_in_flight: 0,
        };
        if cfg.shared_send {
            let stride = cfg.send_size + super::SLOT_TAIL;
            side.env.mem.add(SENDS, SEND_COUNT * stride as usize);
            for k in 0..SEND_COUNT as u64 {
                side.env
                    .sends
                    .push(MemRef::new(SENDS, k * u64::from(stride), stride));
            }
        }
        if shared {
            for k in 0..16u64 {
                let buf = MemRef::new(SRQ, k * u64::from(cfg.recv_size), cfg.recv_size);
                side.posted.push_back((SHARED, buf));
            }
        }
        side
    }

    /// Delivers the Send completions held back by `hold_sends`.
    pub fn release_sends(&mut self) {
        self.hold_sends = false;
        for c in self.held.drain(..) {
            self.cq.push_back(Cqe::Wc(c));
        }
    }

    /// Receive buffers posted now (own or shared).
    pub fn posted_len(&self) -> usize {
        self.posted.len()
    }

    /// Allocates `len` bytes of app memory (zeroed).
    pub fn alloc(&mut self, len: u32) -> MemRef {
        self.try_alloc(len).expect("sim app memory exhausted")
    }

    /// Allocates `len` bytes of app memory (zeroed on creation, not on reuse); `None` once
    /// the app memory is used up.
    pub fn try_alloc(&mut self, len: u32) -> Option<MemRef> {
        let at = MemRef::new(APP, self.bump, len);
        let bump = self.bump + u64::from(len).div_ceil(64) * 64 + 64;
        (bump <= self.app_len).then(|| {
            self.bump = bump;
            at
        })
    }

    /// A peer's RDMA Write of `bytes` at `addr` under `rkey` into this side's memory,
    /// checked as the executor checks one (key, rights, bounds); false if refused.
    pub fn remote_write(&mut self, rkey: u32, addr: u64, bytes: &[u8]) -> bool {
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        match self.env.resolve(rkey, addr, len, Access::REMOTE_WRITE) {
            Some(at) => self.env.write(at, bytes),
            None => false,
        }
    }

    /// Allocates app memory holding `data`.
    pub fn put(&mut self, data: &[u8]) -> MemRef {
        let at = self.alloc(data.len() as u32);
        assert!(self.env.write(at, data));
        at
    }

    pub fn get(&self, at: MemRef) -> Vec<u8> {
        self.env.mem.slice(at).expect("range").to_vec()
    }

    /// Moves the engine's events into `events`.
    pub fn drain_events(&mut self) {
        while let Some(e) = self.conn.poll_event() {
            self.event_log.push(e.clone());
            self.events.push_back(e);
        }
    }
}

pub fn config(role: Role, credits: u32) -> ConnConfig {
    let send_slots = 2 * credits + 3;
    let send_size = 4096;
    let recv_slots = credits + 2;
    let recv_size = 4096;
    let send_len = ConnConfig::send_pool_len(send_slots, send_size).unwrap();
    let recv_len = ConnConfig::recv_pool_len(recv_slots, recv_size).unwrap();
    ConnConfig {
        role,
        version: 1,
        credits,
        send_pool: MemRef::new(POOL, 0, send_len),
        send_slots,
        send_size,
        recv_pool: MemRef::new(POOL, u64::from(send_len), recv_len),
        recv_slots,
        recv_size,
        max_calls: credits + 8,
        peer: None,
        ddp_threshold: 1024,
        max_reads: 4,
        max_call_size: 4 << 20,
        shared_recv: false,
        shared_send: false,
    }
}

/// `cfg` with its pools laid out again for its current sizes.
pub fn sized(mut cfg: ConnConfig) -> ConnConfig {
    let send_len = ConnConfig::send_pool_len(cfg.send_slots, cfg.send_size).unwrap();
    let recv_len = ConnConfig::recv_pool_len(cfg.recv_slots, cfg.recv_size).unwrap();
    cfg.send_pool = MemRef::new(POOL, 0, send_len);
    cfg.recv_pool = MemRef::new(POOL, u64::from(send_len), recv_len);
    cfg
}

/// Two connected engines: `a` (client) and `b` (server).
#[derive(Debug)]
pub struct Pair {
    pub a: Side,
    pub b: Side,
    pub now: Instant,
    /// Sends that found no posted receive (R8166-2.3.2-b).
    pub rnr: u32,
    /// Calls `b` accepted whose arguments are still being placed.
    pending: Vec<(ServeId, super::IncomingCall, MemRef)>,
    /// Calls `b` holds with their arguments in place, not yet answered.
    ready: Vec<(ServeId, u32)>,
}

impl Pair {
    pub fn new(a: ConnConfig, b: ConnConfig) -> Pair {
        Pair::with_app_len(a, b, APP_LEN)
    }

    /// Two sides with `app_len` bytes of app memory each.
    pub fn with_app_len(a: ConnConfig, b: ConnConfig, app_len: usize) -> Pair {
        let mut p = Pair {
            a: Side::with_app_len(a, app_len),
            b: Side::with_app_len(b, app_len),
            now: Instant::now(),
            rnr: 0,
            pending: Vec::new(),
            ready: Vec::new(),
        };
        p.run();
        p
    }

    pub fn default_pair() -> Pair {
        Pair::new(config(Role::Client, 8), config(Role::Server, 8))
    }

    /// Runs both sides until nothing moves.
    pub fn run(&mut self) {
        for _ in 0..1_000_000 {
            if !self.step() {
                return;
            }
        }
        panic!("simulation did not settle");
    }

    /// Executes pending work and delivers one round of completions; false if idle.
    pub fn step(&mut self) -> bool {
        let mut moved = false;
        moved |= Self::exec(&mut self.a, &mut self.b, &mut self.rnr);
        moved |= Self::exec(&mut self.b, &mut self.a, &mut self.rnr);
        moved |= Self::complete(&mut self.a, self.now);
        moved |= Self::complete(&mut self.b, self.now);
        self.a.drain_events();
        self.b.drain_events();
        moved
    }

    fn complete(s: &mut Side, now: Instant) -> bool {
        let mut moved = false;
        let mut batch = Vec::new();
        while let Some(c) = s.cq.pop_front() {
            moved = true;
            match c {
                Cqe::Wc(c) => {
                    if c.tag >> 28 == 2 {
                        s.reads_in_flight -= 1;
                    }
                    if s.batched {
                        batch.push(c);
                    } else {
                        s.conn.handle_completion(now, &c, &mut s.env);
                    }
                }
                Cqe::Shared { buf, len, inv } => {
                    s.conn.handle_completions(now, &batch, &mut s.env);
                    batch.clear();
                    s.conn.handle_recv(now, buf, len, inv, &mut s.env)
                }
            }
        }
        s.conn.handle_completions(now, &batch, &mut s.env);
        moved
    }

    fn exec(me: &mut Side, peer: &mut Side, rnr: &mut u32) -> bool {
        let mut moved = false;
        let ok = |tag| Completion {
            tag,
            status: WcStatus::Success,
            byte_len: 0,
            invalidated_rkey: None,
        };
        let err = |tag, status| Completion {
            tag,
            status,
            byte_len: 0,
            invalidated_rkey: None,
        };
        while let Some(w) = me.conn.poll_work() {
            moved = true;
            me.log.push(w);
            match w {
                Work::Recv { tag, buf } => me.posted.push_back((tag, buf)),
                Work::Send {
                    tag,
                    buf,
                    invalidate,
                    signaled,
                } => {
                    let bytes = me.get(buf);
                    me.sent.push(bytes.clone());
                    let Some((rtag, rbuf)) = peer.posted.pop_front() else {
                        *rnr += 1;
                        me.cq
                            .push_back(Cqe::Wc(err(tag, WcStatus::RemoteOperationError)));
                        continue;
                    };
                    if bytes.len() > rbuf.len as usize {
                        me.cq
                            .push_back(Cqe::Wc(err(tag, WcStatus::RemoteInvalidRequest)));
                        peer.cq
                            .push_back(Cqe::Wc(err(rtag, WcStatus::LocalLengthError)));
                        if rtag == SHARED {
                            // As the driver does: the failed receive's buffer goes back to
                            // the shared queue.
                            peer.posted.push_back((rtag, rbuf));
                        }
                        continue;
                    }
                    assert!(peer.env.write(rbuf, &bytes));
                    let inv = invalidate.filter(|k| peer.env.invalidate(*k));
                    // As a provider does: nothing for an unsignaled Send that succeeded.
                    let reported = signaled || me.report_unsignaled;
                    if reported && me.hold_sends {
                        me.held.push(ok(tag));
                    } else if reported {
                        me.cq.push_back(Cqe::Wc(ok(tag)));
                    }
                    if rtag == SHARED {
                        peer.cq.push_back(Cqe::Shared {
                            buf: rbuf,
                            len: bytes.len() as u32,
                            inv,
                        });
                    } else {
                        peer.cq.push_back(Cqe::Wc(Completion {
                            tag: rtag,
                            status: WcStatus::Success,
                            byte_len: bytes.len() as u32,
                            invalidated_rkey: inv,
                        }));
                    }
                }
                Work::Read {
                    tag,
                    local,
                    rkey,
                    addr,
                } => {
                    me.reads_in_flight += 1;
                    me.max_reads_in_flight = me.max_reads_in_flight.max(me.reads_in_flight);
                    match peer.env.resolve(rkey, addr, local.len, Access::REMOTE_READ) {
                        Some(src) => {
                            let data = peer.get(src);
                            assert!(me.env.write(local, &data));
                            me.cq.push_back(Cqe::Wc(ok(tag)));
                        }
                        None => me
                            .cq
                            .push_back(Cqe::Wc(err(tag, WcStatus::RemoteAccessError))),
                    }
                }
                Work::Write {
                    tag,
                    local,
                    rkey,
                    addr,
                    signaled,
                } => match peer
                    .env
                    .resolve(rkey, addr, local.len, Access::REMOTE_WRITE)
                {
                    Some(dst) => {
                        let data = me.get(local);
                        assert!(peer.env.write(dst, &data));
                        if signaled {
                            me.cq.push_back(Cqe::Wc(ok(tag)));
                        }
                    }
                    None => me
                        .cq
                        .push_back(Cqe::Wc(err(tag, WcStatus::RemoteAccessError))),
                },
                Work::Release { buf } if buf.mr == SENDS => me.env.sends.push(buf),
                Work::Release { buf } => me.posted.push_back((SHARED, buf)),
                Work::Invalidate { tag, rkey } => {
                    if me.env.refuse_invalidate {
                        me.cq
                            .push_back(Cqe::Wc(err(tag, WcStatus::LocalQpOperationError)));
                    } else {
                        me.env.invalidate(rkey);
                        me.cq.push_back(Cqe::Wc(ok(tag)));
                    }
                }
            }
        }
        moved
    }

    /// Delivers `bytes` to `to`'s next posted receive as if the peer had sent them.
    pub fn inject(&mut self, to_b: bool, bytes: &[u8]) {
        let s = if to_b { &mut self.b } else { &mut self.a };
        let (rtag, rbuf) = s.posted.pop_front().expect("a posted receive");
        assert!(s.env.write(rbuf, bytes));
        if rtag == SHARED {
            s.cq.push_back(Cqe::Shared {
                buf: rbuf,
                len: bytes.len() as u32,
                inv: None,
            });
        } else {
            s.cq.push_back(Cqe::Wc(Completion {
                tag: rtag,
                status: WcStatus::Success,
                byte_len: bytes.len() as u32,
                invalidated_rkey: None,
            }));
        }
        self.run();
    }
}

/// An RDMATEST-style server for the `b` side: ECHO/READ/WRITE/NULL with DDP results, and
/// program 0x40000000 ("bulk") whose procedure 1 echoes without any DDP. Answers every call
/// as soon as its arguments are in place, until nothing moves.
pub fn serve(p: &mut Pair) {
    for _ in 0..100_000 {
        if intake(p) == 0 {
            return;
        }
        while answer_ready(p, 0) {}
    }
    panic!("serve did not settle");
}

/// Runs both sides and takes in every call that reached `b` (accepting it into fresh app
/// memory), without answering; returns how many calls have their arguments in place.
pub fn intake(p: &mut Pair) -> usize {
    for _ in 0..100_000 {
        p.run();
        let Some(pos) =
            p.b.events
                .iter()
                .position(|e| matches!(e, Event::IncomingCall(_) | Event::ArgsReady { .. }))
        else {
            return p.ready.len();
        };
        match p.b.events.remove(pos) {
            Some(Event::IncomingCall(c)) => {
                let buf = p.b.alloc(c.args_len.max(4));
                p.pending.push((c.id, c, buf));
                match p.b.conn.accept_call(c.id, buf, &mut p.b.env) {
                    Ok(Accepted::Ready { args_len }) => p.ready.push((c.id, args_len)),
                    Ok(Accepted::Pulling) => {}
                    Err(e) => panic!("accept: {e:?} (server closed: {:?})", p.b.conn.closed()),
                }
            }
            Some(Event::ArgsReady { id, args_len }) => p.ready.push((id, args_len)),
            _ => {}
        }
    }
    panic!("intake did not settle");
}

/// Answers the `k`-th (modulo their number) of the calls `b` holds ready; false if none.
pub fn answer_ready(p: &mut Pair, k: usize) -> bool {
    if !answer_ready_quietly(p, k) {
        return false;
    }
    p.run();
    true
}

/// Answers every call `b` holds ready, then runs both sides: the replies go out together.
pub fn answer_all_ready(p: &mut Pair) {
    while answer_ready_quietly(p, 0) {}
    p.run();
}

/// [`answer_ready`] without running the sides after.
fn answer_ready_quietly(p: &mut Pair, k: usize) -> bool {
    if p.ready.is_empty() {
        return false;
    }
    let (id, args_len) = p.ready.remove(k % p.ready.len());
    let i = p
        .pending
        .iter()
        .position(|e| e.0 == id)
        .expect("known call");
    let (_, c, buf) = p.pending.remove(i);
    let args = p.b.get(buf.prefix(args_len).unwrap());
    answer(p, id, c.prog, c.proc_, &args, buf);
    true
}

pub const BULK_PROG: u32 = 0x4000_0000;

fn word(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

pub fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (seed as usize)
                .wrapping_add(i.wrapping_mul(31))
                .wrapping_add(i >> 8) as u8
        })
        .collect()
}

fn answer(p: &mut Pair, id: ServeId, prog: u32, proc_: u32, args: &[u8], buf: MemRef) {
    use rpcrdma_proto::ulb::{rdmatest, RDMATEST_PROG};
    let reply = |p: &mut Pair, msg: &[u8], results: &[(MemRef, u32)]| {
        let m = p.b.put(msg);
        let r: Vec<ResultPiece> = results
            .iter()
            .map(|&(mem, xdr_pos)| ResultPiece { mem, xdr_pos })
            .collect();
        p.b.conn
            .submit_reply(
                id,
                &ReplySpec {
                    accept_stat: rpcmsg::SUCCESS,
                    msg: m,
                    results: &r,
                },
                &mut p.b.env,
            )
            .expect("reply");
    };
    match (prog, proc_) {
        (RDMATEST_PROG, rdmatest::NULL) => reply(p, &[], &[]),
        (RDMATEST_PROG, rdmatest::ECHO) => {
            let n = word(args, 0);
            reply(p, &n.to_be_bytes(), &[(buf.sub(4, n).unwrap(), 4)]);
        }
        (RDMATEST_PROG, rdmatest::READ) => {
            let (count, seed) = (word(args, 0), word(args, 4));
            let data = p.b.put(&pattern(seed, count as usize));
            reply(p, &count.to_be_bytes(), &[(data, 4)]);
        }
        (RDMATEST_PROG, rdmatest::WRITE) => {
            let seed = word(args, 0);
            let n = word(args, 4) as usize;
            let ok = args[8..8 + n] == pattern(seed, n)[..];
            reply(p, &(if ok { n as u32 } else { 0 }).to_be_bytes(), &[]);
        }
        (BULK_PROG, 1) => reply(p, args, &[]),
        _ => {
            p.b.conn
                .reject_call(id, rpcmsg::PROG_UNAVAIL, &mut p.b.env)
                .expect("reject")
        }
    }
}

/// Submits a call from `a`.
pub fn call(p: &mut Pair, spec: &CallSpec<'_>) {
    p.a.conn.submit_call(spec, &mut p.a.env).expect("submit");
    p.run();
}

/// Takes `a`'s calls released after ending lent: (user, xid).
pub fn released(p: &mut Pair) -> Vec<(u64, u32)> {
    let mut out = Vec::new();
    p.a.events.retain(|e| match e {
        Event::CallReleased { user, xid } => {
            out.push((*user, *xid));
            false
        }
        _ => true,
    });
    out
}

/// Takes `a`'s finished calls.
pub fn done(p: &mut Pair) -> Vec<super::CallDone> {
    let mut out = Vec::new();
    p.a.events.retain(|e| match e {
        Event::CallDone(d) => {
            out.push(*d);
            false
        }
        _ => true,
    });
    out
}
