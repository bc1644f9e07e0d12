//! The hot path allocates nothing: once warm, two `Driver`s on the real soft provider (their
//! shared receive queue and shared send pool, as a poll thread runs them), in memory and over
//! TCP loopback, carry thousands of calls in every transfer mode (inline, Read chunk with Write
//! chunk, Read chunk with Reply chunk) without a single allocation or reallocation.
//!
//! The global allocator counts every allocation of the process (`stats_alloc`), so this binary
//! holds one test, and the measured loop itself keeps its lists in capacity reserved
//! beforehand: anything counted comes from the engine, the driver or the provider.
#![forbid(unsafe_code)]

use std::alloc::System;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rpcrdma_dataplane::{
    Accepted, ArgPiece, CallSpec, CallStatus, ConnConfig, ConnId, ConnTemplate, Driver, Event,
    MemRef, Memory, ReplySpec, ResultPiece, Role, ServeId, SideMem, REGISTERED_ACCESS,
};
use rpcrdma_proto::cm::PrivateData;
use rpcrdma_proto::ulb::{rdmatest, RDMATEST_PROG};
use rpcrdma_verbs::conformance::Side;
use rpcrdma_verbs::soft::link::MemFabric;
use rpcrdma_verbs::soft::{SoftConfig, SoftProvider};
use rpcrdma_verbs::{CmEvent, ConnParams, PdId, Provider};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const DEPTH: usize = 4;

struct Node<P: Provider> {
    drv: Driver<P>,
    mem: SideMem,
    pd: PdId,
    /// First byte after the pools: the calls' memory.
    base: u64,
}

fn node<P: Provider>(p: P) -> Node<P> {
    let Side {
        p, pd, cq, buf, mr, ..
    } = Side::with_access(p, REGISTERED_ACCESS);
    let tmpl = ConnTemplate {
        version: 1,
        credits: 8,
        max_calls: 16,
        send_size: 4096,
        recv_size: 4096,
        recv_slots: 10,
        ddp_threshold: 1024,
        max_reads: 8,
        max_call_size: 1 << 20,
    };
    let send = ConnConfig::send_pool_len(24, tmpl.send_size).expect("send pool");
    let pool = MemRef::new(mr.id, 0, send);
    let srq_pool = MemRef::new(mr.id, u64::from(send), 16 * tmpl.recv_size);
    let base = (u64::from(pool.len) + u64::from(srq_pool.len)).div_ceil(4096) * 4096;
    let drv = Driver::new_shared(p, cq, pd, mr, pool, true, srq_pool, 16, tmpl).expect("driver");
    let mem = SideMem {
        mr: mr.id,
        buf,
        len: mr.len,
    };
    Node { drv, mem, pd, base }
}

fn poll<P: Provider>(n: &mut Node<P>) {
    n.drv.poll(Instant::now(), &mut n.mem);
}

/// Connects `c` to `s` over their provider, with RFC 8797 private data both ways.
fn connect<P: Provider>(c: &mut Node<P>, s: &mut Node<P>, addr: SocketAddr) -> ConnId {
    let l = s.drv.provider_mut().listen(addr).expect("listen");
    let addr = s.drv.provider().listen_addr(l).expect("listen_addr");
    let init = c.drv.qp_init(c.pd);
    let qa = c.drv.provider_mut().create_qp(&init).expect("qp");
    let ca = c.drv.add_connection(qa, Role::Client, None).expect("add");
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
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(Instant::now() < end, "no connection");
        poll(c);
        poll(s);
        while let Some(e) = s.drv.provider_mut().poll_cm() {
            if let CmEvent::ConnectRequest {
                req, private_data, ..
            } = e
            {
                let init = s.drv.qp_init(s.pd);
                let qb = s.drv.provider_mut().create_qp(&init).expect("qp");
                let peer = PrivateData::parse(private_data.as_slice());
                s.drv.add_connection(qb, Role::Server, peer).expect("add");
                s.drv
                    .provider_mut()
                    .accept(req, qb, &params)
                    .expect("accept");
            }
        }
        while let Some(e) = c.drv.provider_mut().poll_cm() {
            if let CmEvent::Established { private_data, .. } = e {
                let peer = PrivateData::parse(private_data.as_slice());
                c.drv.set_peer(ca, peer).expect("peer");
                return ca;
            }
        }
    }
}

/// How a call's bulk travels.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// 64-byte ECHO, inline both ways.
    Inline,
    /// 64 KiB ECHO: the argument through a Read chunk, the result through a Write chunk.
    ReadWrite,
    /// 16 KiB ECHO: the argument through a Read chunk, the whole reply through a Reply chunk.
    ReadReply,
}

impl Mode {
    fn len(self) -> u32 {
        match self {
            Mode::Inline => 64,
            Mode::ReadWrite => 64 << 10,
            Mode::ReadReply => 16 << 10,
        }
    }
}

/// Each in-flight slot's memory: the client's length word, argument, result and reply
/// buffers; the server's argument buffer and reply word.
struct Slots {
    client: [(MemRef, MemRef, MemRef, MemRef); DEPTH],
    server: [(MemRef, MemRef); DEPTH],
}

fn slots<P: Provider>(c: &mut Node<P>, s: &mut Node<P>, len: u32) -> Slots {
    let stride = u64::from(len).div_ceil(64) * 64 + 128;
    let (cm, sm) = (c.mem.mr, s.mem.mr);
    let client = std::array::from_fn(|k| {
        let at = c.base + 3 * k as u64 * stride;
        let word = MemRef::new(cm, at, 4);
        assert!(c.mem.write(word, &len.to_be_bytes()));
        (
            word,
            MemRef::new(cm, at + 64, len),
            MemRef::new(cm, at + stride, len),
            MemRef::new(cm, at + 2 * stride, len + 128),
        )
    });
    let server = std::array::from_fn(|k| {
        let at = s.base + k as u64 * stride;
        let word = MemRef::new(sm, at, 4);
        assert!(s.mem.write(word, &len.to_be_bytes()));
        (MemRef::new(sm, at + 64, len + 8), word)
    });
    assert!(
        c.base + 3 * DEPTH as u64 * stride <= c.mem.len,
        "client memory"
    );
    Slots { client, server }
}

/// The loop's own lists, reserved before anything is measured.
struct Lists {
    /// Calls whose arguments are being pulled, and calls ready to answer this turn.
    serving: Vec<(ServeId, ConnId, usize)>,
    ready: Vec<(ServeId, ConnId, usize)>,
}

/// Runs `calls` ECHO calls with [`DEPTH`] in flight and checks each reply's status and
/// where its result went.
#[allow(clippy::too_many_arguments)]
fn run<P: Provider>(
    c: &mut Node<P>,
    s: &mut Node<P>,
    conn: ConnId,
    sl: &Slots,
    mode: Mode,
    calls: u64,
    xid: &mut u32,
    lists: &mut Lists,
) {
    let len = mode.len();
    let submit = |c: &mut Node<P>, k: usize, xid: u32| {
        let (msg, arg, result, reply) = sl.client[k];
        let results = [result];
        let spec = CallSpec {
            auth: None,
            user: k as u64,
            xid,
            prog: RDMATEST_PROG,
            vers: 1,
            proc_: rdmatest::ECHO,
            msg,
            args: &[ArgPiece {
                mem: arg,
                xdr_pos: 4,
            }],
            // The Reply-chunk mode offers no Write chunk: the whole reply comes back through
            // the Reply chunk the large reply buffer asks for.
            results: match mode {
                Mode::ReadReply => &[],
                _ => &results,
            },
            reply,
        };
        c.drv.submit_call(conn, &spec, &mut c.mem).expect("submit");
    };
    let Lists { serving, ready } = lists;
    let (mut next, mut sent, mut done) = (0usize, 0u64, 0u64);
    for k in 0..DEPTH {
        submit(c, k, *xid);
        *xid += 1;
        sent += 1;
    }
    let end = Instant::now() + Duration::from_secs(60);
    while done < calls {
        assert!(
            Instant::now() < end,
            "{mode:?}: {done} of {calls} calls done"
        );
        poll(c);
        poll(s);
        ready.clear();
        while let Some((sc, ev)) = s.drv.poll_event() {
            match ev {
                Event::IncomingCall(ic) => {
                    let k = next % DEPTH;
                    next += 1;
                    match s.drv.accept_call(sc, ic.id, sl.server[k].0, &mut s.mem) {
                        Ok(Accepted::Ready { .. }) => ready.push((ic.id, sc, k)),
                        Ok(Accepted::Pulling) => serving.push((ic.id, sc, k)),
                        Err(e) => panic!("accept: {e:?}"),
                    }
                }
                Event::ArgsReady { id, .. } => {
                    let i = serving.iter().position(|e| e.0 == id).expect("pulled");
                    ready.push(serving.swap_remove(i));
                }
                Event::ReplyDone {
                    status: rpcrdma_dataplane::ReplyStatus::Sent,
                    ..
                } => {}
                other => panic!("server: {other:?}"),
            }
        }
        for &(id, sc, k) in ready.iter() {
            let (args, word) = sl.server[k];
            let results = [ResultPiece {
                mem: args.sub(4, len).expect("echo"),
                xdr_pos: 4,
            }];
            let spec = ReplySpec {
                accept_stat: 0,
                msg: word,
                results: &results,
            };
            s.drv
                .submit_reply(sc, id, &spec, &mut s.mem)
                .expect("reply");
        }
        s.drv.post_pending();
        while let Some((_, ev)) = c.drv.poll_event() {
            let Event::CallDone(d) = ev else {
                panic!("client: {ev:?}");
            };
            // The result in place: inline, in the reply through the Reply chunk, or in
            // the result buffer through the Write chunk (4 bytes of length inline).
            let inline = match mode {
                Mode::ReadWrite => 4,
                Mode::Inline | Mode::ReadReply => 4 + len,
            };
            assert_eq!(
                (d.status, d.reply_len),
                (CallStatus::Ok, inline),
                "{mode:?}"
            );
            if let Mode::ReadWrite = mode {
                // Compared as they come: collecting them would allocate.
                assert!(d.results().eq([(4, len)]), "{mode:?} {d:?}");
            }
            done += 1;
            if sent < calls {
                submit(c, d.user as usize, *xid);
                *xid += 1;
                sent += 1;
            }
        }
        c.drv.post_pending();
    }
}

/// Warms `c` and `s` up in `mode` (pools, queues and maps reach their steady size), then
/// counts the allocations of 2 000 more calls.
fn allocations<P: Provider>(
    c: &mut Node<P>,
    s: &mut Node<P>,
    conn: ConnId,
    mode: Mode,
    xid: &mut u32,
) -> stats_alloc::Stats {
    let sl = slots(c, s, mode.len());
    let mut lists = Lists {
        serving: Vec::with_capacity(DEPTH),
        ready: Vec::with_capacity(DEPTH),
    };
    run(c, s, conn, &sl, mode, 200, xid, &mut lists);
    let region = Region::new(GLOBAL);
    run(c, s, conn, &sl, mode, 2_000, xid, &mut lists);
    region.change()
}

#[test]
fn steady_calls_allocate_nothing_in_every_transfer_mode() {
    let f = MemFabric::new();
    let mut xid = 1;
    let mut c = node(SoftProvider::memory(&f, SoftConfig::default()));
    let mut s = node(SoftProvider::memory(&f, SoftConfig::default()));
    no_allocation_in_any_mode(&mut c, &mut s, "10.9.0.1:20049", "memory", &mut xid);
    let mut c = node(SoftProvider::tcp(SoftConfig::default()).expect("tcp"));
    let mut s = node(SoftProvider::tcp(SoftConfig::default()).expect("tcp"));
    no_allocation_in_any_mode(&mut c, &mut s, "127.0.0.1:0", "TCP", &mut xid);
}

/// Connects `c` to `s` at `addr` and asserts that steady calls allocate nothing in each mode.
fn no_allocation_in_any_mode<P: Provider>(
    c: &mut Node<P>,
    s: &mut Node<P>,
    addr: &str,
    link: &str,
    xid: &mut u32,
) {
    let conn = connect(c, s, addr.parse().expect("addr"));
    for mode in [Mode::Inline, Mode::ReadWrite, Mode::ReadReply] {
        let st = allocations(c, s, conn, mode, xid);
        assert_eq!(
            (st.allocations, st.reallocations),
            (0, 0),
            "{link}, {mode:?}: {st:?}"
        );
    }
}
