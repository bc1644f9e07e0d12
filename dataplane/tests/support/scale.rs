//! Many connections on one poll thread's buffer plan: a server `Driver` and a client `Driver`,
//! each built by `PoolPlan` exactly as the poll thread builds its own (one registered region:
//! shared send pool + shared receive queue), over the in-memory soft provider. Every client
//! connection makes calls that the server answers; the figures say what was registered and
//! what the process holds. Shared by `tests/pool_scaling.rs` and `examples/pool_scaling.rs`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rpcrdma_dataplane::poll::{ConnStats, PoolPlan, PoolSpec, TransportSpec};
use rpcrdma_dataplane::{
    Accepted, CallSpec, CallStatus, CloseReason, ConnId, Driver, Event, MemRef, Memory,
    RegisteredMem, ReplySpec, Role,
};
use rpcrdma_proto::cm::PrivateData;
use rpcrdma_verbs::mapped::{Mapped, Registered};
use rpcrdma_verbs::soft::link::MemFabric;
use rpcrdma_verbs::soft::{SoftConfig, SoftMem, SoftProvider};
use rpcrdma_verbs::{Access, CmEvent, ConnParams, MrId, PdId, Provider};

/// Program the server answers (echo of the argument bytes).
const ECHO_PROG: u32 = 0x4000_0001;
/// Bytes of each call's arguments (and of its reply).
const CALL_LEN: u32 = 64;

/// The scenario: `conns` connections, `credits` credits each, `inline` bytes inline both
/// ways, a shared receive queue of `recv_buffers` buffers, `calls` calls per connection.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    pub conns: u32,
    pub credits: u32,
    pub inline: u32,
    pub recv_buffers: u32,
    pub calls: u32,
    /// Negative control: grant this many credits per connection whatever the share (the
    /// queue over-committed); `None` follows the plan.
    pub overcommit: Option<u32>,
    /// Seconds before a run is declared hung.
    pub guard_secs: u64,
}

/// What one run measured.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// Credits each connection got (its share of the shared receive queue, less the spare).
    pub credits: u32,
    /// Receive memory registered by the server's poll-thread plan (the shared receive queue).
    pub recv_registered: u64,
    /// All pool memory the server's plan registers (send pool + receive queue).
    pub registered: u64,
    /// What per-connection receive blocks would register for the same credits
    /// (`conns × (credits + 1) × inline`, the poll thread before the shared queue).
    pub recv_per_connection_blocks: u64,
    /// Heap of the latency histograms of `conns` used connection slots.
    pub histograms: u64,
    /// Connections whose every call completed with its reply, bytes intact.
    pub served: u32,
    /// Calls answered.
    pub replies: u64,
    /// Calls that failed (their connection closed).
    pub failed: u64,
    /// Connections closed (either end).
    pub closed: u32,
    /// Process resident set before building anything and at the end (bytes; both ends,
    /// two drivers of the same plan, live in this process).
    pub rss_before: u64,
    /// After both drivers exist (pools registered, queues created).
    pub rss_drivers: u64,
    /// After every connection is up.
    pub rss_connected: u64,
    /// After the client's queue pairs and engine connections exist (not yet connected).
    pub rss_client_qps: u64,
    pub rss_after: u64,
}

struct Node {
    drv: Driver<SoftMem>,
    mem: RegisteredMem,
    pd: PdId,
    /// App memory: one `slot`-byte range per (connection, call).
    app: MrId,
    plan: PoolPlan,
}

fn transport(s: &Scenario) -> TransportSpec {
    TransportSpec {
        version: 1,
        inline_send: s.inline,
        inline_recv: s.inline,
        credits: s.credits,
        backchannel_credits: 0,
        ddp_threshold: 1024,
        remote_invalidation: true,
        recv_buffer_size: s.inline,
        ird: 16,
        ord: 16,
        v2_first_reply_timeout: rpcrdma_dataplane::conn::V2_FIRST_REPLY_TIMEOUT,
        max_segments_per_chunk: 16,
        max_chunks_per_list: 4,
    }
}

/// As the daemon registers its memory: peers reach it through exposures only.
fn rw() -> Access {
    rpcrdma_dataplane::REGISTERED_ACCESS
}

fn node(f: &MemFabric, s: &Scenario, app_len: usize) -> Node {
    let mut p = SoftProvider::memory(f, SoftConfig::default());
    let t = transport(s);
    // The smallest send pool the plan accepts: what every connection may hold at once.
    let tmpl = PoolPlan::template_for(&t, s.recv_buffers, s.conns, 1 << 20).expect("receives");
    let plan = PoolPlan::new(
        &t,
        PoolSpec {
            recv_buffers: s.recv_buffers,
            send_buffers: tmpl.send_slots() * s.conns,
            receive_queues: rpcrdma_dataplane::poll::ReceiveQueues::Shared,
        },
        s.conns,
        1 << 20,
    )
    .expect("plan");
    let mut plan = plan;
    if let Some(c) = s.overcommit {
        plan.tmpl.credits = c;
        plan.tmpl.recv_slots = c;
        plan.tmpl.max_calls = 2 * c;
        plan.send_buffers = plan.tmpl.send_slots() * s.conns;
    }
    let pd = p.alloc_pd().expect("pd");
    let cq = p
        .create_cq(plan.cq_depth(&p).expect("cq depth").depth)
        .expect("cq");
    let pool = Mapped::anonymous(plan.registered_len() as usize).expect("map pool");
    let pool = Registered::new(&mut p, pd, pool, rw()).expect("register pool");
    let app = Mapped::anonymous(app_len).expect("map app");
    let app = Registered::new(&mut p, pd, app, rw()).expect("register app");
    let mut drv = plan.driver(p, cq, pd, pool.mr()).expect("driver");
    drv.add_region(app.mr());
    Node {
        drv,
        pd,
        app: app.mr().id,
        mem: RegisteredMem::new(vec![pool, app]),
        plan,
    }
}

fn pump(n: &mut Node, cm: &mut Vec<CmEvent>, ev: &mut Vec<(ConnId, Event)>) {
    n.drv.poll(Instant::now(), &mut n.mem);
    while let Some(e) = n.drv.provider_mut().poll_cm() {
        cm.push(e);
    }
    while let Some(e) = n.drv.poll_event() {
        ev.push(e);
    }
}

/// Resident set size of this process, bytes (0 where /proc is missing).
pub fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn pattern(conn: u32, call: u32) -> Vec<u8> {
    (0..CALL_LEN)
        .map(|i| (conn.wrapping_mul(31) ^ call.wrapping_mul(7) ^ i) as u8)
        .collect()
}

/// Runs the scenario; panics (with what hung) after a generous guard.
pub fn run(s: Scenario) -> Figures {
    let rss_before = rss();
    let f = MemFabric::new();
    let slot = 2 * CALL_LEN as usize;
    let app_len = (s.conns as usize * s.calls as usize * slot).div_ceil(4096) * 4096 + 4096;
    let mut srv = node(&f, &s, app_len);
    let mut cli = node(&f, &s, app_len);
    let l = srv
        .drv
        .provider_mut()
        .listen("10.9.0.1:20049".parse().expect("addr"))
        .expect("listen");
    let addr = srv.drv.provider().listen_addr(l).expect("listen addr");
    let rss_drivers = rss();
    let guard = Instant::now();
    let hang = |what: &str| {
        assert!(
            guard.elapsed() < Duration::from_secs(s.guard_secs),
            "hang: {what} ({} connections)",
            s.conns
        )
    };

    // Connect every client connection; the server accepts each with a queue pair on its
    // shared receive queue.
    let (mut ccm, mut scm) = (Vec::new(), Vec::new());
    let (mut cev, mut sev) = (Vec::new(), Vec::new());
    let cpd = cli.drv.template().private_data().emit();
    let spd = srv.drv.template().private_data().emit();
    let mut by_qp = HashMap::new();
    let mut client_conns = Vec::new();
    for i in 0..s.conns {
        let init = cli.drv.qp_init(cli.pd);
        let qp = cli.drv.provider_mut().create_qp(&init).expect("client qp");
        let id = cli
            .drv
            .add_connection(qp, Role::Client, None)
            .expect("client connection");
        by_qp.insert(qp, (i, id));
        client_conns.push(id);
    }
    // Client queue pairs and engine connections exist; nothing is linked yet.
    let rss_client_qps = rss();
    for &qp in by_qp.keys() {
        let params = ConnParams {
            private_data: &cpd,
            responder_resources: 16,
            initiator_depth: 16,
        };
        cli.drv
            .provider_mut()
            .connect(qp, addr, &params)
            .expect("connect");
    }
    let mut up = 0;
    while up < s.conns {
        pump(&mut cli, &mut ccm, &mut cev);
        pump(&mut srv, &mut scm, &mut sev);
        for e in scm.drain(..) {
            if let CmEvent::ConnectRequest {
                req, private_data, ..
            } = e
            {
                let init = srv.drv.qp_init(srv.pd);
                let qp = srv.drv.provider_mut().create_qp(&init).expect("server qp");
                let peer = PrivateData::parse(private_data.as_slice());
                srv.drv
                    .add_connection(qp, Role::Server, peer)
                    .expect("server connection");
                let params = ConnParams {
                    private_data: &spd,
                    responder_resources: 16,
                    initiator_depth: 16,
                };
                srv.drv
                    .provider_mut()
                    .accept(req, qp, &params)
                    .expect("accept");
            }
        }
        for e in ccm.drain(..) {
            match e {
                CmEvent::Established {
                    qp, private_data, ..
                } => {
                    let (_, id) = by_qp[&qp];
                    cli.drv
                        .set_peer(id, PrivateData::parse(private_data.as_slice()))
                        .expect("set peer");
                    up += 1;
                }
                CmEvent::Rejected { .. } | CmEvent::ConnectError { .. } => {
                    panic!("connection refused: {e:?}")
                }
                _ => {}
            }
        }
        hang("connections up");
    }

    let rss_connected = rss();
    // Every connection submits its calls at once (the engine queues beyond the grant).
    let at = |n: &Node, conn: u32, call: u32, half: usize| {
        let off =
            (conn as usize * s.calls as usize + call as usize) * slot + half * CALL_LEN as usize;
        MemRef::new(n.app, off as u64, CALL_LEN)
    };
    for (i, &id) in client_conns.iter().enumerate() {
        let i = i as u32;
        for k in 0..s.calls {
            let msg = at(&cli, i, k, 0);
            assert!(cli.mem.write(msg, &pattern(i, k)));
            let spec = CallSpec {
                auth: None,
                user: (u64::from(i) << 32) | u64::from(k),
                xid: k + 1,
                prog: ECHO_PROG,
                vers: 1,
                proc_: 1,
                msg,
                args: &[],
                results: &[],
                reply: at(&cli, i, k, 1),
            };
            cli.drv
                .submit_call(id, &spec, &mut cli.mem)
                .expect("submit call");
        }
    }
    // The server echoes each call's arguments; its buffers for them come from one range per
    // call, released when the reply is sent.
    let mut done = vec![0u32; s.conns as usize];
    let mut replies = 0u64;
    let total = u64::from(s.conns) * u64::from(s.calls);
    let mut next = 0usize;
    let slots = s.conns as usize * s.calls as usize;
    let mut pending: HashMap<(ConnId, u32), MemRef> = HashMap::new();
    let (mut failed, mut closed) = (0u64, 0u32);
    while replies + failed < total {
        pump(&mut cli, &mut ccm, &mut cev);
        pump(&mut srv, &mut scm, &mut sev);
        // A connection the provider ended: its engine closes (its calls fail), as the poll
        // thread does on the connection manager's event.
        for (n, cm) in [(&mut cli, &mut ccm), (&mut srv, &mut scm)] {
            for e in cm.drain(..) {
                if let CmEvent::Disconnected { qp, .. } = e {
                    if let Some(id) = n.drv.by_qp(qp) {
                        n.drv
                            .close(id, CloseReason::Local("disconnected"), &mut n.mem);
                    }
                }
            }
        }
        let mut ready = Vec::new();
        for (conn, e) in std::mem::take(&mut sev) {
            match e {
                Event::IncomingCall(ic) => {
                    assert_eq!(ic.prog, ECHO_PROG);
                    let buf = MemRef::new(srv.app, ((next % slots) * slot) as u64, CALL_LEN);
                    next += 1;
                    pending.insert((conn, ic.id.to_u32()), buf);
                    // Refused only on a connection that is closing (counted below).
                    if let Ok(Accepted::Ready { args_len }) =
                        srv.drv.accept_call(conn, ic.id, buf, &mut srv.mem)
                    {
                        ready.push((conn, ic.id, args_len));
                    }
                }
                Event::ArgsReady { id, args_len } => ready.push((conn, id, args_len)),
                Event::Closed(_) => closed += 1,
                _ => {}
            }
        }
        for (conn, id, args_len) in ready {
            let buf = pending.remove(&(conn, id.to_u32())).expect("pending");
            let spec = ReplySpec {
                accept_stat: 0,
                msg: buf.prefix(args_len).expect("args"),
                results: &[],
            };
            let _ = srv.drv.submit_reply(conn, id, &spec, &mut srv.mem);
        }
        for (_, e) in std::mem::take(&mut cev) {
            match e {
                Event::CallDone(d) if d.status != CallStatus::Ok => failed += 1,
                Event::CallDone(d) => {
                    let (i, k) = ((d.user >> 32) as u32, d.user as u32);
                    let mut got = vec![0u8; d.reply_len as usize];
                    assert!(cli.mem.read(at(&cli, i, k, 1), &mut got));
                    assert_eq!(
                        got,
                        pattern(i, k),
                        "reply bytes of call {k} on connection {i}"
                    );
                    done[i as usize] += 1;
                    replies += 1;
                }
                Event::Closed(_) => closed += 1,
                _ => {}
            }
        }
        assert!(
            guard.elapsed() < Duration::from_secs(s.guard_secs),
            "hang: replies ({} connections): {replies} answered, {failed} failed, {closed} connections closed",
            s.conns
        );
    }
    // The poll thread keeps one latency histogram per used connection slot.
    let mut hist_bytes = 0u64;
    let mut stats: Vec<ConnStats> = (0..s.conns).map(|_| ConnStats::default()).collect();
    for st in &mut stats {
        st.latency.ensure_empty();
        st.latency.record(20_000);
        hist_bytes += st.latency.heap_bytes() as u64;
    }
    let rss_after = rss();
    let p = srv.plan;
    Figures {
        credits: p.tmpl.credits,
        recv_registered: p.recv_len(),
        registered: p.registered_len(),
        recv_per_connection_blocks: u64::from(s.conns)
            * u64::from(s.credits + 1)
            * u64::from(s.inline),
        histograms: hist_bytes,
        served: done.iter().filter(|&&n| n == s.calls).count() as u32,
        replies,
        failed,
        closed,
        rss_before,
        rss_drivers,
        rss_connected,
        rss_client_qps,
        rss_after,
    }
}
