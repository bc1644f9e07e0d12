//! Engine figures (plain timing loops, median of 5 runs; not a test), RDMATEST ECHO with a
//! fixed number of calls in flight, both ends driven by this one thread, pinned to one core
//! with `core_affinity` (so "per core" means both ends on one core). Each part also prints
//! the calls actually in flight (the requester's count, sampled at the top of every loop
//! turn while calls remain to submit: mean, min, max), so the depth claimed is the depth
//! measured, and the time the thread spent on a CPU (`/proc/thread-self/schedstat`), the
//! useful cost on a shared machine:
//! 0. the engine alone: two `Connection`s on the daemon's `RegisteredMem`, a minimal
//!    in-process executor moving the Sends between them (no provider, no NIC), 64 bytes
//!    inline, 32 in flight; with each end's share of the time, the work requests,
//!    completions, events and `Memory` operations per RPC, and its baseline measured in the
//!    same run: the floor, the same RPCs done by hand with only the header coding and copies
//!    no implementation can avoid (`floor`);
//! 1. two `Driver`s on the soft provider's in-memory fabric, 64 bytes inline, 32 in flight:
//!    RPCs per second and ns per RPC;
//! 2. the same, 64 KiB through a Read chunk and a Write chunk, 4 in flight: GB/s.
//!
//! Run: `cargo bench -p rpcrdma-dataplane --bench engine` (release profile; MPA CRC off, as a
//! NIC would offload it). `ENGINE_BENCH_CALLS` overrides the calls per run of parts 0 and 1
//! (default 1 000 000: the on-CPU clock advances by scheduler ticks, so a run must last well
//! over 4 ms × 20 for a 5 % resolution);
//! `ENGINE_BENCH_PARTS` picks parts (default `012`); `ENGINE_BENCH_CORE` picks the core to
//! pin (default: the last one); `ENGINE_BENCH_REGIONS` registers that many idle regions
//! besides part 0's own (a poll thread holds one per attached app; default 0);
//! `ENGINE_BENCH_FLOOR=0` shrinks the floor's runs to a token (to profile the engine).
#![forbid(unsafe_code)]

use std::convert::Infallible;
use std::time::{Duration, Instant};

use std::collections::VecDeque;

use rpcrdma_dataplane::{
    Accepted, ArgPiece, CallSpec, Completion, ConnConfig, ConnId, ConnTemplate, Connection, Driver,
    Env, Event, MemRef, Memory, RegisteredMem, ReplySpec, ResultPiece, Role, ServeId, SideMem,
    SubmitError, Work,
};
use rpcrdma_proto::cm::PrivateData;
use rpcrdma_proto::ulb::{rdmatest, RDMATEST_PROG};
use rpcrdma_verbs::conformance::Side;
use rpcrdma_verbs::mapped::{Mapped, Registered};
use rpcrdma_verbs::soft::link::MemFabric;
use rpcrdma_verbs::soft::{SoftConfig, SoftMem, SoftProvider};
use rpcrdma_verbs::{Access, WcStatus};
use rpcrdma_verbs::{CmEvent, ConnParams, MrId, PdId, Provider};

struct Node {
    drv: Driver<SoftMem>,
    mem: SideMem,
    pd: PdId,
    base: u64,
}

fn node(f: &MemFabric, tmpl: ConnTemplate) -> Node {
    let cfg = SoftConfig {
        crc: false,
        ..SoftConfig::default()
    };
    let Side {
        p, pd, cq, buf, mr, ..
    } = Side::with_access(
        SoftProvider::memory(f, cfg),
        rpcrdma_dataplane::REGISTERED_ACCESS,
    );
    let pool = MemRef::new(mr.id, 0, tmpl.block_len().unwrap());
    let base = u64::from(pool.len).div_ceil(4096) * 4096;
    let drv = Driver::new(p, cq, mr, pool, tmpl).unwrap();
    Node {
        drv,
        mem: SideMem {
            mr: mr.id,
            buf,
            len: mr.len,
        },
        pd,
        base,
    }
}

fn connect(c: &mut Node, s: &mut Node) -> ConnId {
    let now = Instant::now();
    let l = s
        .drv
        .provider_mut()
        .listen("10.9.0.1:20049".parse().unwrap())
        .unwrap();
    let addr = s.drv.provider().listen_addr(l).unwrap();
    let init = c.drv.template().qp_init(c.pd, c.drv.cq());
    let qa = c.drv.provider_mut().create_qp(&init).unwrap();
    let ca = c.drv.add_connection(qa, Role::Client, None).unwrap();
    let pd = c.drv.template().private_data().emit();
    let params = ConnParams {
        private_data: &pd,
        responder_resources: 16,
        initiator_depth: 16,
    };
    c.drv.provider_mut().connect(qa, addr, &params).unwrap();
    let mut accepted = false;
    loop {
        c.drv.poll(now, &mut c.mem);
        s.drv.poll(now, &mut s.mem);
        while let Some(e) = s.drv.provider_mut().poll_cm() {
            if let CmEvent::ConnectRequest {
                req, private_data, ..
            } = e
            {
                let init = s.drv.template().qp_init(s.pd, s.drv.cq());
                let qb = s.drv.provider_mut().create_qp(&init).unwrap();
                let peer = PrivateData::parse(private_data.as_slice());
                s.drv.add_connection(qb, Role::Server, peer).unwrap();
                s.drv.provider_mut().accept(req, qb, &params).unwrap();
                accepted = true;
            }
        }
        while let Some(e) = c.drv.provider_mut().poll_cm() {
            if let CmEvent::Established { private_data, .. } = e {
                assert!(accepted);
                c.drv
                    .set_peer(ca, PrivateData::parse(private_data.as_slice()))
                    .unwrap();
                return ca;
            }
        }
    }
}

/// Per in-flight slot: argument piece, result buffer and reply buffer of the client; the
/// server's argument buffer and reply word of the same slot index.
struct Slots {
    len: u32,
    client: Vec<(MemRef, MemRef, MemRef, MemRef)>,
    server: Vec<(MemRef, MemRef)>,
}

fn slots(c: &mut Node, s: &mut Node, n: usize, len: u32) -> Slots {
    let stride = u64::from(len).div_ceil(64) * 64 + 64;
    let mut client = Vec::new();
    let mut server = Vec::new();
    for k in 0..n as u64 {
        // Big pieces first (argument, result), then the small message and reply words.
        let big = |i: u64| MemRef::new(c.mem.mr, c.base + (2 * k + i) * stride, len);
        let small = |i: u64| {
            MemRef::new(
                c.mem.mr,
                c.base + 2 * n as u64 * stride + (2 * k + i) * 128,
                120,
            )
        };
        let (piece, result, msg, reply) = (big(0), big(1), small(0).prefix(4).unwrap(), small(1));
        assert!(c.mem.write(msg, &len.to_be_bytes()));
        // 120 bytes: room for a 64-byte result inline; a large one takes the Write chunk.
        client.push((msg, piece, result, reply));
        let sat = |i: u64| MemRef::new(s.mem.mr, s.base + (2 * k + i) * stride, len + 8);
        let (args, word) = (sat(0), sat(1));
        assert!(s.mem.write(word.prefix(4).unwrap(), &len.to_be_bytes()));
        server.push((args, word.prefix(4).unwrap()));
    }
    Slots {
        len,
        client,
        server,
    }
}

/// Nanoseconds this thread has spent on a CPU (Linux `/proc/thread-self/schedstat`), so
/// that a run on a shared, loaded machine still tells what one RPC costs in CPU time.
fn cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Calls in flight at the requester, sampled once per loop turn.
#[derive(Default, Clone, Copy)]
struct Depth {
    /// On-CPU nanoseconds of the run (0 if unknown).
    cpu: u64,
    /// Part 0 only: wall time spent in the requester's entry points, the responder's, and
    /// the executor standing in for the NIC (moving Sends, making completions).
    split: [Duration; 3],
    /// Part 0 only, both ends together: work requests taken, completions fed, events taken,
    /// `Memory` operations.
    tally: [u64; 4],
    samples: u64,
    sum: u64,
    min: u32,
    max: u32,
}

impl Depth {
    fn new() -> Depth {
        Depth {
            min: u32::MAX,
            ..Depth::default()
        }
    }
    fn add(&mut self, n: u32) {
        self.samples += 1;
        self.sum += u64::from(n);
        self.min = self.min.min(n);
        self.max = self.max.max(n);
    }
    fn show(&self) -> String {
        format!(
            "in flight per loop turn: mean {:.1}, min {}, max {}",
            self.sum as f64 / self.samples.max(1) as f64,
            self.min,
            self.max
        )
    }
}

/// Runs `calls` ECHO calls of `sl.len` bytes with `sl.client.len()` in flight; returns the
/// elapsed time and the depth seen while every call was submitted.
fn run(c: &mut Node, s: &mut Node, conn: ConnId, sl: &Slots, calls: u64) -> (Duration, Depth) {
    let mut depth_seen = Depth::new();
    let cpu0 = cpu_ns();
    let depth = sl.client.len();
    // Calls whose arguments are still being pulled, and calls ready to answer this turn.
    let mut serving: Vec<(ServeId, ConnId, usize)> = Vec::with_capacity(depth);
    let mut ready: Vec<(ServeId, ConnId, usize)> = Vec::with_capacity(depth);
    let mut next_slot = 0usize;
    let submit = |c: &mut Node, k: usize, xid: u32| {
        let (msg, piece, result, reply) = sl.client[k];
        let spec = CallSpec {
            auth: None,
            user: k as u64,
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
        };
        match c.drv.submit_call(conn, &spec, &mut c.mem) {
            Ok(()) => {}
            Err(SubmitError::Busy) => panic!("busy"),
            Err(e) => panic!("{e:?}"),
        }
    };
    let start = Instant::now();
    let mut xid = 1u32;
    for k in 0..depth {
        submit(c, k, xid);
        xid += 1;
    }
    let (mut done, mut sent) = (0u64, depth as u64);
    let now = Instant::now();
    while done < calls {
        if sent < calls {
            // Sampled at the top of each turn, while the pipeline is meant to be full.
            depth_seen.add(c.drv.connection(conn).map_or(0, |k| k.calls_in_flight()));
        }
        c.drv.poll(now, &mut c.mem);
        s.drv.poll(now, &mut s.mem);
        ready.clear();
        while let Some((sc, ev)) = s.drv.poll_event() {
            match ev {
                Event::IncomingCall(ic) => {
                    let k = next_slot % depth;
                    next_slot += 1;
                    // Inline (64 B): the arguments are in place at once. Read chunk (64 KiB):
                    // they are once `ArgsReady` comes.
                    match s.drv.accept_call(sc, ic.id, sl.server[k].0, &mut s.mem) {
                        Ok(Accepted::Ready { .. }) => ready.push((ic.id, sc, k)),
                        Ok(Accepted::Pulling) => serving.push((ic.id, sc, k)),
                        Err(e) => panic!("{e:?}"),
                    }
                }
                Event::ArgsReady { id, .. } => {
                    let i = serving.iter().position(|e| e.0 == id).unwrap();
                    ready.push(serving.swap_remove(i));
                }
                _ => {}
            }
        }
        for &(id, sc, k) in &ready {
            let (args, word) = sl.server[k];
            let results = [ResultPiece {
                mem: args.sub(4, sl.len).unwrap(),
                xdr_pos: 4,
            }];
            let spec = ReplySpec {
                accept_stat: 0,
                msg: word,
                results: &results,
            };
            s.drv.submit_reply(sc, id, &spec, &mut s.mem).unwrap();
        }
        // As a poll thread ends its turn: the turn's work goes out together.
        s.drv.post_pending();
        while let Some((_, ev)) = c.drv.poll_event() {
            if let Event::CallDone(d) = ev {
                assert_eq!(d.status, rpcrdma_dataplane::CallStatus::Ok);
                done += 1;
                if sent < calls {
                    submit(c, d.user as usize, xid);
                    xid = xid.wrapping_add(1).max(1);
                    sent += 1;
                }
            }
        }
        c.drv.post_pending();
    }
    let t = start.elapsed();
    depth_seen.cpu = cpu_ns().zip(cpu0).map_or(0, |(b, a)| b - a);
    (t, depth_seen)
}

/// One side of the engine-alone loop: a connection, its memory and its posted receives.
struct Lean {
    conn: Connection,
    env: LeanEnv,
    posted: VecDeque<(u32, MemRef)>,
    cq: Vec<Completion>,
    /// Work requests taken from the engine.
    work: u64,
}

/// Part 0's memory: the daemon's own [`RegisteredMem`] (bounds-checked copies into
/// mappings registered with a provider; here two anonymous mappings, the buffer pool and an
/// app's arena, registered with a soft provider that is otherwise unused), counting the
/// engine's `Memory` operations (reads, writes, copies).
struct LeanEnv {
    p: SoftMem,
    mem: RegisteredMem,
    pool: MrId,
    /// Where the pool is among the regions (sorted by id, fixed once built).
    pool_at: usize,
    app: MrId,
    ops: std::cell::Cell<u64>,
}

impl LeanEnv {
    /// The pool, `extra` idle regions standing for other apps' arenas (a poll thread holds
    /// one per attached app; `ENGINE_BENCH_REGIONS`), and the app's arena, registered in that
    /// order.
    fn new(pool_len: usize, app_len: usize, extra: usize) -> LeanEnv {
        let mut p = SoftProvider::memory(&MemFabric::new(), SoftConfig::default());
        let pd = p.alloc_pd().unwrap();
        let rw = rpcrdma_dataplane::REGISTERED_ACCESS;
        let mut reg = |len| Registered::new(&mut p, pd, Mapped::anonymous(len).unwrap(), rw);
        let mut regs = vec![reg(pool_len).unwrap()];
        for _ in 0..extra {
            regs.push(reg(4096).unwrap());
        }
        regs.push(reg(app_len).unwrap());
        let (pool, app) = (regs[0].mr().id, regs[extra + 1].mr().id);
        let mem = RegisteredMem::new(regs);
        let pool_at = mem
            .regions()
            .iter()
            .position(|r| r.mr().id == pool)
            .unwrap();
        LeanEnv {
            pool,
            pool_at,
            app,
            mem,
            p,
            ops: std::cell::Cell::new(0),
        }
    }

    /// The pool's mapping (what the executor standing in for the NIC moves Sends from and to).
    fn pool_mem(&self) -> &Mapped {
        self.mem.regions()[self.pool_at].mem()
    }
}

impl Drop for LeanEnv {
    fn drop(&mut self) {
        for r in self.mem.take_all() {
            r.deregister(&mut self.p).unwrap();
        }
    }
}

impl Memory for LeanEnv {
    fn read(&self, at: MemRef, dst: &mut [u8]) -> bool {
        self.ops.set(self.ops.get() + 1);
        self.mem.read(at, dst)
    }
    fn write(&mut self, at: MemRef, src: &[u8]) -> bool {
        self.ops.set(self.ops.get() + 1);
        self.mem.write(at, src)
    }
    fn copy(&mut self, from: MemRef, to: MemRef) -> bool {
        self.ops.set(self.ops.get() + 1);
        self.mem.copy(from, to)
    }
}

impl Env for LeanEnv {
    fn expose(&mut self, _: MemRef, _: Access) -> Option<rpcrdma_proto::Segment> {
        None
    }
}

/// Idle regions registered besides part 0's pool and app arena (`ENGINE_BENCH_REGIONS`,
/// default 0): a daemon's poll thread holds one per attached app, and every `Memory`
/// operation looks its region up among them.
fn extra_regions() -> usize {
    std::env::var("ENGINE_BENCH_REGIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn lean(role: Role) -> Lean {
    let (credits, recv_slots, size) = (32u32, 34u32, 4096u32);
    let send_slots = credits + recv_slots + 1;
    let send_len = ConnConfig::send_pool_len(send_slots, size).unwrap();
    let recv_len = ConnConfig::recv_pool_len(recv_slots, size).unwrap();
    let env = LeanEnv::new((send_len + recv_len) as usize, 1 << 20, extra_regions());
    let pool = env.pool;
    let cfg = ConnConfig {
        role,
        version: 1,
        credits,
        send_pool: MemRef::new(pool, 0, send_len),
        send_slots,
        send_size: size,
        recv_pool: MemRef::new(pool, u64::from(send_len), recv_len),
        recv_slots,
        recv_size: size,
        shared_recv: false,
        shared_send: false,
        max_calls: 32,
        peer: Some(PrivateData {
            remote_invalidate: true,
            send_size: size,
            recv_size: size,
        }),
        ddp_threshold: 1024,
        max_reads: 16,
        max_call_size: 1 << 20,
    };
    Lean {
        conn: Connection::new(cfg).unwrap(),
        env,
        posted: VecDeque::new(),
        cq: Vec::new(),
        work: 0,
    }
}

/// Posts `me`'s work: receives are queued, Sends land in `peer`'s next receive.
fn exec(me: &mut Lean, peer: &mut Lean) {
    let ok = |tag, byte_len| Completion {
        tag,
        status: WcStatus::Success,
        byte_len,
        invalidated_rkey: None,
    };
    // Every request is taken, in order, as with `poll_work` one at a time.
    let Ok(()) = me.conn.drain_work(|w| {
        me.work += 1;
        match w {
            Work::Recv { tag, buf } => me.posted.push_back((tag, buf)),
            Work::Send {
                tag, buf, signaled, ..
            } => {
                let (rtag, rbuf) = peer.posted.pop_front().expect("posted receive");
                assert!(buf.len <= rbuf.len);
                let n = buf.len as usize;
                let (from, to) = (me.env.pool_mem(), peer.env.pool_mem());
                assert!(from.copy_to(buf.offset, to, rbuf.offset, n));
                // As a provider does: no completion for an unsignaled Send.
                if signaled {
                    me.cq.push(ok(tag, 0));
                }
                peer.cq.push(ok(rtag, buf.len));
            }
            other => panic!("unexpected work in the inline bench: {other:?}"),
        }
        Ok::<(), Infallible>(())
    });
}

fn engine_alone(calls: u64) -> (Duration, Depth) {
    let mut depth_seen = Depth::new();
    let cpu0 = cpu_ns();
    let (mut c, mut s) = (lean(Role::Client), lean(Role::Server));
    // The server's receives are posted before anything is sent.
    exec(&mut s, &mut c);
    let now = Instant::now();
    let (capp, sapp) = (c.env.app, s.env.app);
    let k = |i: u64| MemRef::new(capp, i * 512, 64);
    for i in 0..32u64 {
        assert!(c.env.write(k(i).prefix(4).unwrap(), &64u32.to_be_bytes()));
        assert!(s
            .env
            .write(MemRef::new(sapp, 65536 + i * 256, 4), &64u32.to_be_bytes()));
    }
    let submit = |c: &mut Lean, i: u64, xid: u32| {
        let base = k(i);
        let spec = CallSpec {
            auth: None,
            user: i,
            xid,
            prog: RDMATEST_PROG,
            vers: 1,
            proc_: rdmatest::ECHO,
            msg: base.prefix(4).unwrap(),
            args: &[ArgPiece {
                mem: MemRef::new(capp, base.offset + 64, 64),
                xdr_pos: 4,
            }],
            results: &[MemRef::new(capp, base.offset + 128, 64)],
            reply: MemRef::new(capp, base.offset + 256, 128),
        };
        c.conn.submit_call(&spec, &mut c.env).unwrap();
    };
    let start = Instant::now();
    let mut xid = 1u32;
    for i in 0..32 {
        submit(&mut c, i, xid);
        xid += 1;
    }
    let (mut done, mut sent) = (0u64, 32u64);
    let mut next = 0u64;
    // Each loop turn moves about 32 RPCs through both ends; four clock reads a turn split
    // its time between the two ends and the executor (≈ 3 ns per RPC of clock reads).
    let (requester, responder, executor) = (0, 1, 2);
    let mut mark = Instant::now();
    let mut lap = |split: &mut [Duration; 3], part: usize| {
        let t = Instant::now();
        split[part] += t - mark;
        mark = t;
    };
    while done < calls {
        if sent < calls {
            depth_seen.add(c.conn.calls_in_flight());
        }
        exec(&mut c, &mut s);
        exec(&mut s, &mut c);
        lap(&mut depth_seen.split, executor);
        // The turn's completions as one batch, as a poll of a completion queue gives them.
        depth_seen.tally[1] += s.cq.len() as u64;
        s.conn.handle_completions(now, &s.cq, &mut s.env);
        s.cq.clear();
        while let Some(ev) = s.conn.poll_event() {
            depth_seen.tally[2] += 1;
            // Every event here is an IncomingCall or a ReplyDone (nothing to do).
            if let Event::IncomingCall(ic) = ev {
                let slot = next % 32;
                next += 1;
                let got = s
                    .conn
                    .accept_call(
                        ic.id,
                        MemRef::new(sapp, 131072 + slot * 256, 128),
                        &mut s.env,
                    )
                    .unwrap();
                // An inline call's arguments are in place as soon as it is accepted.
                assert!(matches!(got, Accepted::Ready { .. }), "{got:?}");
                let results = [ResultPiece {
                    mem: MemRef::new(sapp, 131072 + slot * 256 + 4, 64),
                    xdr_pos: 4,
                }];
                let spec = ReplySpec {
                    accept_stat: 0,
                    msg: MemRef::new(sapp, 65536 + slot * 256, 4),
                    results: &results,
                };
                s.conn.submit_reply(ic.id, &spec, &mut s.env).unwrap();
            }
        }
        lap(&mut depth_seen.split, responder);
        exec(&mut s, &mut c);
        lap(&mut depth_seen.split, executor);
        // The turn's completions as one batch, as a poll of a completion queue gives them.
        depth_seen.tally[1] += c.cq.len() as u64;
        c.conn.handle_completions(now, &c.cq, &mut c.env);
        c.cq.clear();
        while let Some(ev) = c.conn.poll_event() {
            depth_seen.tally[2] += 1;
            if let Event::CallDone(d) = ev {
                assert_eq!(
                    (d.status, d.reply_len),
                    (rpcrdma_dataplane::CallStatus::Ok, 68)
                );
                done += 1;
                if sent < calls {
                    submit(&mut c, d.user, xid);
                    xid = xid.wrapping_add(1).max(1);
                    sent += 1;
                }
            }
        }
        lap(&mut depth_seen.split, requester);
    }
    let t = start.elapsed();
    depth_seen.cpu = cpu_ns().zip(cpu0).map_or(0, |(b, a)| b - a);
    depth_seen.tally[0] = c.work + s.work;
    depth_seen.tally[3] = c.env.ops.get() + s.env.ops.get();
    (t, depth_seen)
}

/// The median run of five (by time), with its depth.
fn median(mut v: Vec<(Duration, Depth)>) -> (Duration, Depth) {
    v.sort_by_key(|r| r.0);
    v[v.len() / 2]
}

/// Pins this thread to one core (`ENGINE_BENCH_CORE`, default the last); says which.
fn pin() {
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let want: Option<usize> = std::env::var("ENGINE_BENCH_CORE")
        .ok()
        .and_then(|v| v.parse().ok());
    let core = match want {
        Some(i) => cores.iter().copied().find(|c| c.id == i),
        None => cores.last().copied(),
    };
    match core {
        Some(c) if core_affinity::set_for_current(c) => {
            println!(
                "pinned to core {} of {} (both ends on this one thread)",
                c.id,
                cores.len()
            )
        }
        _ => println!("NOT pinned (core_affinity refused): figures are for a floating thread"),
    }
}

fn main() {
    let calls: u64 = std::env::var("ENGINE_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let parts = std::env::var("ENGINE_BENCH_PARTS").unwrap_or_else(|_| "012".into());
    pin();
    if parts.contains('0') {
        engine_part(calls);
    }
    if parts.contains('1') || parts.contains('2') {
        provider_parts(calls, &parts);
    }
}

fn engine_part(calls: u64) {
    // 0. The engine alone, alternating with its floor (same process, same minutes).
    engine_alone(20_000);
    floor(20_000);
    let mut runs = Vec::new();
    let mut floors = Vec::new();
    let mut ratios = Vec::new();
    // The floor runs ten times the calls: its runs are otherwise too short for the on-CPU
    // clock, which advances by scheduler ticks (4 ms at HZ=250).
    // `ENGINE_BENCH_FLOOR=0` keeps the floor's runs token-sized (for profiling the engine).
    let floor_calls = match std::env::var("ENGINE_BENCH_FLOOR").as_deref() {
        Ok("0") => 1000,
        _ => calls * 10,
    };
    for _ in 0..5 {
        let f = floor(floor_calls);
        let r = engine_alone(calls);
        if f.cpu > 0 && r.1.cpu > 0 {
            ratios.push((r.1.cpu as f64 / calls as f64) / (f.cpu as f64 / floor_calls as f64));
        }
        floors.push(f);
        runs.push(r);
    }
    let (t, d) = median(runs);
    let ns = t.as_nanos() as f64 / calls as f64;
    let cpu = d.cpu as f64 / calls as f64;
    println!(
        "engine alone (no provider), echo 64 B, 32 in flight, both ends: {:.0} ns/RPC wall ({:.2} M RPC/s), {:.0} ns/RPC on CPU ({:.2} M RPC/s per core); {}",
        ns,
        1e3 / ns,
        cpu,
        1e3 / cpu,
        d.show()
    );
    // Each end's share, comparable with figures for one end per core (a server handling
    // calls from clients elsewhere).
    let per = |part: usize| d.split[part].as_nanos() as f64 / calls as f64;
    let (req, resp, exe) = (per(0), per(1), per(2));
    println!(
        "  of which (wall, same run): requester {req:.0} ns/RPC ({:.2} M RPC/s per core), responder {resp:.0} ns/RPC ({:.2} M RPC/s per core), executor standing in for the NIC {exe:.0} ns/RPC",
        1e3 / req,
        1e3 / resp,
    );
    let each = |k: usize| d.tally[k] as f64 / calls as f64;
    println!(
        "  per RPC, both ends: {:.2} work requests, {:.2} completions, {:.2} events, {:.2} Memory operations",
        each(0),
        each(1),
        each(2),
        each(3)
    );
    floors.sort_by_key(|f| f.cpu);
    let f = floors[floors.len() / 2].cpu as f64 / floor_calls as f64;
    ratios.sort_by(f64::total_cmp);
    let ratio = ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN);
    println!(
        "  floor (the same RPCs by hand, headers and copies only): {f:.0} ns/RPC on CPU ({:.2} M RPC/s per core); engine / floor, median of paired runs: {ratio:.2}",
        1e3 / f
    );
}

/// Part 0's floor: the same ECHO of 64 bytes, 32 in flight, both ends on this thread, doing
/// only what any RPC-over-RDMA version 1 implementation must do per RPC on the CPU: build the
/// transport header, the RPC header and the inline payload in a send buffer; decode them
/// from the receive buffer; copy the arguments into the server's memory and the result into
/// the caller's; find the call by XID. None of the engine's bookkeeping (credits, buffer
/// ownership, completions, events, exposure, bounds-checked `Memory`), and the loop moves
/// each Send into its receive buffer itself, as part 0's executor stands in for the NIC. The
/// engine's cost over this floor is what its generality and safety cost; the floor is what
/// no implementation can avoid on this core.
fn floor(calls: u64) -> Depth {
    use rpcrdma_proto::rpc::CallHeader;
    use rpcrdma_proto::{decode_short, v1, Limits};
    use std::hint::black_box;
    const D: usize = 32;
    const CALL: usize = 28 + 40 + 4 + 64;
    const REPLY: usize = 28 + 24 + 4 + 64;
    let put = |b: &mut [u8], at: usize, words: &[u32]| {
        for (k, w) in words.iter().enumerate() {
            b[at + 4 * k..at + 4 * k + 4].copy_from_slice(&w.to_be_bytes());
        }
    };
    let word = |b: &[u8], k: usize| u32::from_be_bytes(b[4 * k..4 * k + 4].try_into().unwrap());
    let limits = Limits::DEFAULT;
    let mut args = [[0u8; 64]; D];
    for (k, a) in args.iter_mut().enumerate() {
        a.fill(k as u8);
    }
    let mut replies = [[0u8; 68]; D];
    let (mut c_send, mut s_recv) = ([[0u8; 256]; D], [[0u8; 256]; D]);
    let (mut s_send, mut c_recv) = ([[0u8; 256]; D], [[0u8; 256]; D]);
    let mut s_app = [[0u8; 68]; D];
    let mut xid_of = [0u32; D];
    let mut next_xid = 1u32;
    let mut depth = Depth::new();
    let cpu0 = cpu_ns();
    let mut done = 0u64;
    while done < calls {
        // Requester: one Short call per free slot, XIDs minted so that `xid % D` is the slot.
        for (k, b) in c_send.iter_mut().enumerate() {
            let xid = next_xid.wrapping_mul(D as u32).wrapping_add(k as u32);
            xid_of[k] = xid;
            v1::emit_msg(b, xid, D as u32).unwrap();
            put(
                b,
                28,
                &[xid, 0, 2, RDMATEST_PROG, 1, rdmatest::ECHO, 0, 0, 0, 0, 64],
            );
            b[72..CALL].copy_from_slice(&args[k]);
        }
        next_xid = next_xid.wrapping_add(1);
        depth.add(D as u32);
        for (r, s) in s_recv.iter_mut().zip(&c_send) {
            r[..CALL].copy_from_slice(&s[..CALL]);
        }
        black_box(&mut s_recv);
        // Responder: decode, check the call, place the arguments, answer.
        for k in 0..D {
            let m = &s_recv[k][..CALL];
            let h = decode_short(m, &limits).unwrap();
            let call = CallHeader::parse(&m[h.header_len..]).unwrap();
            assert!(call.prog == RDMATEST_PROG && call.proc == rdmatest::ECHO);
            let at = h.header_len + call.args_offset;
            s_app[k].copy_from_slice(&m[at..at + 68]);
            let b = &mut s_send[k];
            v1::emit_msg(b, call.xid, D as u32).unwrap();
            put(b, 28, &[call.xid, 1, 0, 0, 0, 0]);
            b[52..REPLY].copy_from_slice(&s_app[k]);
        }
        for (r, s) in c_recv.iter_mut().zip(&s_send) {
            r[..REPLY].copy_from_slice(&s[..REPLY]);
        }
        black_box(&mut c_recv);
        // Requester: decode, find the call, check the reply, place the result.
        for r in &c_recv {
            let m = &r[..REPLY];
            let h = decode_short(m, &limits).unwrap();
            let body = &m[h.header_len..];
            let k = h.xid as usize % D;
            assert!(xid_of[k] == h.xid && word(body, 1) == 1 && word(body, 2) == 0);
            assert!(word(body, 5) == 0);
            replies[k].copy_from_slice(&body[24..92]);
            done += 1;
        }
        black_box(&mut replies);
    }
    // Every slot got its own arguments back.
    for (k, r) in replies.iter().enumerate() {
        assert!(r[..4] == 64u32.to_be_bytes() && r[4..].iter().all(|b| *b == k as u8));
    }
    depth.cpu = cpu_ns().zip(cpu0).map_or(0, |(b, a)| b - a);
    depth
}

fn provider_parts(calls: u64, parts: &str) {
    if parts.contains('1') {
        provider_small(calls);
    }
    if parts.contains('2') {
        provider_large(calls);
    }
}

/// Work completions both nodes' drivers have polled.
fn polled(c: &Node, s: &Node) -> u64 {
    c.drv.completions() + s.drv.completions()
}

fn provider_small(calls: u64) {
    // 1. ECHO 64 bytes, 32 in flight.
    let tmpl = ConnTemplate {
        credits: 32,
        max_calls: 32,
        recv_slots: 34,
        ..ConnTemplate::default()
    };
    let f = MemFabric::new();
    let (mut c, mut s) = (node(&f, tmpl), node(&f, tmpl));
    let conn = connect(&mut c, &mut s);
    let sl = slots(&mut c, &mut s, 32, 64);
    run(&mut c, &mut s, conn, &sl, 20_000);
    let before = polled(&c, &s);
    let (t, d) = median(
        (0..5)
            .map(|_| run(&mut c, &mut s, conn, &sl, calls))
            .collect(),
    );
    let wcs = (polled(&c, &s) - before) as f64 / (5 * calls) as f64;
    let ns = t.as_nanos() as f64 / calls as f64;
    let cpu = d.cpu as f64 / calls as f64;
    println!(
        "soft provider (in-memory fabric), echo 64 B, 32 in flight, both ends on one thread: {:.0} ns/RPC wall ({:.2} M RPC/s), {:.0} ns/RPC on CPU ({:.2} M RPC/s per core) ({calls} calls, median of 5); {}; work completions per RPC, both ends: {wcs:.2}",
        ns,
        1e3 / ns,
        cpu,
        1e3 / cpu,
        d.show()
    );
}

fn provider_large(calls: u64) {
    // 2. ECHO 64 KiB through a Read chunk and a Write chunk, 4 in flight.
    let tmpl = ConnTemplate {
        credits: 4,
        max_calls: 4,
        recv_slots: 6,
        ..ConnTemplate::default()
    };
    let f = MemFabric::new();
    let (mut c, mut s) = (node(&f, tmpl), node(&f, tmpl));
    let conn = connect(&mut c, &mut s);
    let sl = slots(&mut c, &mut s, 4, 64 << 10);
    let n = (calls / 50).max(100);
    run(&mut c, &mut s, conn, &sl, n / 10);
    let before = polled(&c, &s);
    let (t, d) = median((0..5).map(|_| run(&mut c, &mut s, conn, &sl, n)).collect());
    let wcs = (polled(&c, &s) - before) as f64 / (5 * n) as f64;
    let bytes = n as f64 * f64::from(64u32 << 10);
    let cpu_s = d.cpu as f64 / 1e9;
    println!(
        "soft provider (in-memory fabric), echo 64 KiB via read + write chunks, 4 in flight: {:.2} GB/s wall, {:.2} GB/s per core on CPU, of echoed data each way; {:.1} us/RPC wall ({n} calls, median of 5); {}; work completions per RPC, both ends: {wcs:.2}",
        bytes / t.as_secs_f64() / 1e9,
        if cpu_s > 0.0 { bytes / cpu_s / 1e9 } else { 0.0 },
        t.as_micros() as f64 / n as f64,
        d.show()
    );
}
