//! The poll loop: provider completions and CM events, app rings, commands, idle policy.

use super::stats::{ConnInfo, ConnState, ConnStats, Snapshot, ThreadStats};
use super::{Command, Event, IdleSpec, PollSpec, PoolPlan, Reason};
use crate::conn::{CallStatus, CloseReason, Event as ConnEvent, ReplyStatus, Role, ServeId};
use crate::driver::{from_serve_tag, serve_tag, ConnId, Driver};
use crate::mem::{MemRef, RegisteredMem};
use crate::{ArgPiece, CallSpec, ReplySpec, ResultPiece};
use crossbeam_queue::ArrayQueue;
use rpcrdma_proto::cm::PrivateData as CmData;
use rpcrdma_shm::abi::{status, ArenaRange, MAX_PIECES};
use rpcrdma_shm::attach::Listener as AppListener;
use rpcrdma_shm::daemon::{
    AppId, AppTable, CallOutcome, CallRequest, Detached, IncomingCall, OpId, RecvBuf, Submission,
    TableConfig,
};
use rpcrdma_verbs::mapped::{Mapped, Registered};
use rpcrdma_verbs::{Access, CmEvent, ConnParams, ListenerId, MrId, PdId, Provider, QpId};
use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// App submissions taken per poll.
const SUB_BATCH: usize = 32;
/// Loop iterations between housekeeping rounds while busy (app attach and reap, commands).
const HOUSEKEEPING_EVERY: u32 = 256;
/// Longest park: the provider's sockets cannot wake a parked thread, so it looks again this often.
const PARK_MAX: Duration = Duration::from_millis(2);
/// Apps that leave completions undrained this long are detached.
const STALL_LIMIT: Duration = Duration::from_secs(10);
/// Calls held while their connection has no free call slot.
const MAX_WAITING: usize = 4096;
/// accept_stat PROG_UNAVAIL.
const PROG_UNAVAIL: u32 = 1;
/// accept_stat SYSTEM_ERR.
const SYSTEM_ERR: u32 = 5;
/// How long a drained thread keeps its apps attached so they can read their last completions.
const DRAIN_LINGER: Duration = Duration::from_millis(200);

/// One connection slot (its index is the connection id the control thread sees).
#[derive(Debug, Default)]
struct Slot {
    qp: Option<QpId>,
    conn: Option<ConnId>,
    stats: ConnStats,
    in_flight: u32,
    notify_idle: bool,
    v2_confirmed: bool,
}

/// A call being served: where its arguments go, then which app op answers it.
#[derive(Debug)]
enum Serving {
    Receiving {
        app: AppId,
        rb: RecvBuf,
        prog: u32,
        vers: u32,
        proc_: u32,
        xid: u32,
    },
    Delivered(OpId),
    Replying(OpId),
}

/// An app's registered region.
#[derive(Debug)]
struct AppMem {
    app: AppId,
    mr: MrId,
    arena: u64,
}

/// A poll thread's state; [`PollThread::run`] is its loop.
pub struct PollThread<P: Provider> {
    spec: PollSpec,
    drv: Driver<P>,
    mem: RegisteredMem,
    pd: PdId,
    commands: Arc<ArrayQueue<Command>>,
    events: Arc<ArrayQueue<Event>>,
    bell: UnixStream,
    notify: Box<dyn Fn() + Send>,
    table: AppTable,
    apps: AppListener,
    app_mem: Vec<AppMem>,
    retired: Vec<(AppId, MrId)>,
    subs: Vec<(AppId, Submission)>,
    waiting: VecDeque<(u32, CallRequest)>,
    held_in: VecDeque<(ConnId, crate::IncomingCall)>,
    started: HashMap<u64, (Instant, u32)>,
    serving: HashMap<u64, Serving>,
    args: [ArgPiece; MAX_PIECES],
    results: [MemRef; MAX_PIECES],
    rpieces: [ResultPiece; MAX_PIECES],
    listeners: Vec<ListenerId>,
    slots: Vec<Slot>,
    by_peer: Vec<Option<u32>>,
    stats: ThreadStats,
    idle: IdleState,
    draining: Option<Instant>,
    quiet_since: Option<Instant>,
    stop: bool,
}

impl<P: Provider> std::fmt::Debug for PollThread<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PollThread")
            .field("index", &self.spec.index)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct IdleState {
    empty_polls: u32,
    since: Option<Instant>,
    pause: Duration,
}

type StartError = (String, Box<dyn Fn() + Send>);

fn rw() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE
}

impl<P: Provider> PollThread<P> {
    /// Opens the attach socket, registers the buffer pool and starts the engine's driver.
    pub fn new(
        spec: PollSpec,
        mut provider: P,
        commands: Arc<ArrayQueue<Command>>,
        events: Arc<ArrayQueue<Event>>,
        bell: UnixStream,
        notify: Box<dyn Fn() + Send>,
    ) -> Result<PollThread<P>, StartError> {
        // One shared receive queue and one shared send pool for every connection, each
        // connection's credits capped to its share of the queue (see `PoolPlan`).
        let plan = match PoolPlan::new(
            &spec.transport,
            spec.pools,
            spec.max_conns,
            // A call is delivered into one receive buffer of the serving app's arena, so the
            // arena bounds the largest call (a fixed 1 MiB refused a 1 MiB WRITE's args).
            spec.geometry.arena_size,
        ) {
            Ok(p) => p,
            Err(e) => return Err((format!("buffer pools: {e}"), notify)),
        };
        let tmpl = plan.tmpl;
        let Ok(pool_len) = usize::try_from(plan.registered_len()) else {
            return Err(("buffer pool too large".into(), notify));
        };
        let setup = (|| -> Result<_, String> {
            let pd = provider.alloc_pd().map_err(|e| e.to_string())?;
            let cq = provider
                .create_cq(plan.cq_depth(pd))
                .map_err(|e| e.to_string())?;
            let pool = Mapped::anonymous(pool_len).map_err(|e| format!("buffer pool: {e}"))?;
            let pool = Registered::new(&mut provider, pd, pool, rw()).map_err(|e| e.to_string())?;
            Ok((pd, cq, pool))
        })();
        let (pd, cq, pool) = match setup {
            Ok(x) => x,
            Err(e) => return Err((format!("provider: {e}"), notify)),
        };
        let drv = match plan.driver(provider, cq, pd, pool.mr()) {
            Ok(d) => d,
            Err(e) => return Err((format!("engine: {e}"), notify)),
        };
        tracing::info!(
            connections = plan.max_conns,
            credits = tmpl.credits,
            receives_per_connection = plan.share(),
            recv_buffers = plan.recv_buffers,
            send_buffers = plan.send_buffers,
            registered_bytes = plan.registered_len(),
            "buffer pools registered"
        );
        let peers = u32::try_from(spec.peers.len()).unwrap_or(u32::MAX);
        let apps = match AppListener::bind(&spec.app_socket, spec.geometry, spec.peers.clone()) {
            Ok(l) => l,
            Err(e) => {
                return Err((
                    format!("app socket {}: {e}", spec.app_socket.display()),
                    notify,
                ))
            }
        };
        let table = match AppTable::new(TableConfig {
            max_apps: spec.max_apps,
            // Peer indexes: the configured peers, then one per connection slot (the `peer` of
            // an incoming call, so a serving app can call back on that connection).
            peers: peers.saturating_add(spec.max_conns).max(1),
            ..TableConfig::default()
        }) {
            Ok(t) => t,
            Err(e) => return Err((format!("app table: {e}"), notify)),
        };
        let slots = (0..spec.max_conns)
            .map(|id| Slot {
                stats: ConnStats {
                    info: ConnInfo {
                        id,
                        ..ConnInfo::default()
                    },
                    ..ConnStats::default()
                },
                ..Slot::default()
            })
            .collect();
        let stats = ThreadStats {
            index: spec.index,
            core: spec.core,
            ..ThreadStats::default()
        };
        Ok(PollThread {
            by_peer: vec![None; spec.peers.len()],
            spec,
            drv,
            mem: RegisteredMem { regs: vec![pool] },
            pd,
            commands,
            events,
            bell,
            notify,
            table,
            apps,
            app_mem: Vec::new(),
            retired: Vec::new(),
            subs: Vec::with_capacity(SUB_BATCH),
            waiting: VecDeque::with_capacity(MAX_WAITING),
            held_in: VecDeque::with_capacity(MAX_WAITING),
            started: HashMap::with_capacity(8192),
            serving: HashMap::with_capacity(8192),
            args: [ArgPiece::default(); MAX_PIECES],
            results: [MemRef::default(); MAX_PIECES],
            rpieces: [ResultPiece::default(); MAX_PIECES],
            listeners: Vec::new(),
            slots,
            stats,
            idle: IdleState::default(),
            draining: None,
            quiet_since: None,
            stop: false,
        })
    }

    /// Runs until [`Command::Stop`].
    pub fn run(&mut self) {
        self.emit(Event::Started {
            remote_invalidation: self.spec.transport.remote_invalidation,
        });
        let mut loops = 0u32;
        while !self.stop {
            let now = Instant::now();
            let mut work = self.poll_once(now);
            loops = loops.wrapping_add(1);
            if loops % HOUSEKEEPING_EVERY == 0 || self.idle.empty_polls > 0 {
                work |= self.housekeeping();
            }
            if work {
                self.stats.busy_polls += 1;
                self.idle = IdleState::default();
            } else {
                self.stats.idle_polls += 1;
                self.wait_idle(now);
            }
            let spent = u64::try_from(now.elapsed().as_nanos()).unwrap_or(u64::MAX);
            let t = if work {
                &mut self.stats.busy_ns
            } else {
                &mut self.stats.idle_ns
            };
            *t = t.saturating_add(spent);
        }
        for i in 0..self.slots.len() {
            if let Some(qp) = self.slots[i].qp {
                let _ = self.drv.provider_mut().disconnect(qp);
            }
        }
    }

    /// One pass over the provider, the engine and the apps; true if anything happened.
    fn poll_once(&mut self, now: Instant) -> bool {
        let mut work = self.drv.poll(now, &mut self.mem) > 0;
        while let Some(ev) = self.drv.provider_mut().poll_cm() {
            self.on_cm(ev);
            work = true;
        }
        while let Some((conn, ev)) = self.drv.poll_event() {
            self.on_engine(conn, ev, now);
            work = true;
        }
        let held = self.waiting.len();
        for _ in 0..held {
            let Some((slot, c)) = self.waiting.pop_front() else {
                break;
            };
            if self.table.call_request(c.id).is_some() {
                self.send_call(slot, c, now);
            }
        }
        work |= self.waiting.len() < held;
        let held = self.held_in.len();
        for _ in 0..held {
            let Some((conn, ic)) = self.held_in.pop_front() else {
                break;
            };
            if let Some(slot) = self.slot_of_conn(conn) {
                self.dispatch_incoming(conn, Some(slot), ic);
            }
        }
        work |= self.held_in.len() < held;
        let mut subs = std::mem::take(&mut self.subs);
        subs.clear();
        self.table.poll_submissions(&mut subs, SUB_BATCH);
        work |= !subs.is_empty();
        for (app, s) in subs.drain(..) {
            self.on_submission(app, s, now);
        }
        self.subs = subs;
        work
    }

    fn app_ref(&self, app: AppId, r: ArenaRange) -> Option<MemRef> {
        let m = self.app_mem.iter().find(|m| m.app == app)?;
        Some(MemRef::new(
            m.mr,
            m.arena.checked_add(u64::from(r.off()))?,
            r.len(),
        ))
    }

    fn app_piece(&self, app: AppId, off: u32, len: u32) -> Option<MemRef> {
        let m = self.app_mem.iter().find(|m| m.app == app)?;
        Some(MemRef::new(m.mr, m.arena.checked_add(u64::from(off))?, len))
    }

    /// The peer index apps use for connection slot `i` (after the configured peers).
    fn conn_peer_index(&self, i: u32) -> u32 {
        (self.by_peer.len() as u32).saturating_add(i)
    }

    fn slot_of_conn(&self, conn: ConnId) -> Option<usize> {
        self.slots.iter().position(|s| s.conn == Some(conn))
    }

    fn on_submission(&mut self, app: AppId, s: Submission, now: Instant) {
        match s {
            Submission::Call(c) => {
                let configured = self.by_peer.len() as u32;
                let slot = match c.peer.checked_sub(configured) {
                    // A connection addressed directly (backward-direction calls).
                    Some(i) => Some(i),
                    None => self.by_peer.get(c.peer as usize).copied().flatten(),
                }
                .filter(|&i| {
                    self.slots
                        .get(i as usize)
                        .is_some_and(|s| s.stats.info.state == ConnState::Up)
                });
                match slot {
                    Some(i) if self.draining.is_none() => self.send_call(i, c, now),
                    _ => {
                        tracing::debug!(peer = c.peer, "call failed: no connection up to the peer");
                        self.fail_call(c.id, status::TRANSPORT, None)
                    }
                }
                let _ = app;
            }
            Submission::Reply(r) => {
                // Only a call delivered to this very app may be answered (the tag is app data).
                let delivered = matches!(self.serving.get(&r.tag), Some(Serving::Delivered(op)) if op.app() == r.id.app());
                if !delivered {
                    self.table.complete_reply(r.id, status::BAD_HANDLE);
                    return;
                }
                self.serving.remove(&r.tag);
                let (conn, sid) = from_serve_tag(r.tag);
                let rapp = r.id.app();
                let Some(msg) = self.app_ref(rapp, r.msg) else {
                    self.table.complete_reply(r.id, status::BAD_RANGE);
                    return;
                };
                let mut n = 0;
                for p in r.results.as_slice() {
                    let (Some(mem), Some(dst)) =
                        (self.app_piece(rapp, p.off, p.len), self.rpieces.get_mut(n))
                    else {
                        break;
                    };
                    *dst = ResultPiece {
                        mem,
                        xdr_pos: p.xdr_pos,
                    };
                    n += 1;
                }
                let spec = ReplySpec {
                    accept_stat: r.accept_stat,
                    msg,
                    results: &self.rpieces[..n],
                };
                match self.drv.submit_reply(conn, sid, &spec, &mut self.mem) {
                    Ok(()) => {
                        self.serving.insert(r.tag, Serving::Replying(r.id));
                    }
                    Err(e) => {
                        tracing::debug!(error = ?e, "reply refused by the engine");
                        self.table.complete_reply(r.id, status::TRANSPORT);
                    }
                }
            }
            Submission::Registered { .. } | Submission::Unregistered { .. } => {}
        }
    }

    /// Hands an app's call to the engine of connection slot `i` (held if every call slot is busy).
    fn send_call(&mut self, i: u32, c: CallRequest, now: Instant) {
        let Some(conn) = self.slots.get(i as usize).and_then(|s| s.conn) else {
            return self.fail_call(c.id, status::TRANSPORT, None);
        };
        let app = c.id.app();
        let (Some(msg), Some(reply)) = (self.app_ref(app, c.msg), self.app_ref(app, c.reply))
        else {
            return self.fail_call(c.id, status::BAD_RANGE, Some(i));
        };
        let mut na = 0;
        for p in c.args.as_slice() {
            let (Some(mem), Some(dst)) = (self.app_piece(app, p.off, p.len), self.args.get_mut(na))
            else {
                break;
            };
            *dst = ArgPiece {
                mem,
                xdr_pos: p.xdr_pos,
            };
            na += 1;
        }
        let mut nr = 0;
        for p in c.results.as_slice() {
            let (Some(mem), Some(dst)) =
                (self.app_piece(app, p.off, p.len), self.results.get_mut(nr))
            else {
                break;
            };
            *dst = mem;
            nr += 1;
        }
        let spec = CallSpec {
            user: c.id.to_u64(),
            xid: c.xid,
            prog: c.prog,
            vers: c.vers,
            proc_: c.proc_,
            msg,
            args: &self.args[..na],
            results: &self.results[..nr],
            reply,
        };
        match self.drv.submit_call(conn, &spec, &mut self.mem) {
            Ok(()) => {
                self.started.insert(c.id.to_u64(), (now, i));
                self.slots[i as usize].in_flight += 1;
                let s = &mut self.slots[i as usize].stats.info;
                s.calls_out += 1;
                s.bytes_out = s.bytes_out.saturating_add(u64::from(c.msg.len()));
                self.stats.totals.calls_out += 1;
                self.stats.totals.bytes_out = self
                    .stats
                    .totals
                    .bytes_out
                    .saturating_add(u64::from(c.msg.len()));
            }
            Err(crate::SubmitError::Busy) if self.waiting.len() < MAX_WAITING => {
                self.waiting.push_back((i, c));
            }
            Err(e) => {
                // The shm ABI has one code for every transport failure; the reason goes to the log.
                tracing::debug!(conn = i, error = ?e, len = c.msg.len(), "call refused by the engine");
                self.fail_call(c.id, status::TRANSPORT, Some(i))
            }
        }
    }

    fn fail_call(&mut self, id: OpId, code: u32, slot: Option<u32>) {
        if let Some(s) = slot.and_then(|i| self.slots.get_mut(i as usize)) {
            s.stats.info.call_errors += 1;
        }
        self.stats.totals.call_errors += 1;
        self.table.complete_call(
            id,
            CallOutcome {
                status: code,
                ..CallOutcome::default()
            },
        );
    }

    fn on_engine(&mut self, conn: ConnId, ev: ConnEvent, now: Instant) {
        let slot = self.slot_of_conn(conn);
        match ev {
            ConnEvent::CallDone(d) => {
                let id = OpId::from_u64(d.user);
                let started = self.started.remove(&d.user);
                let code = match d.status {
                    CallStatus::Ok => status::OK,
                    CallStatus::ReplyTooLarge => status::REPLY_TOO_LARGE,
                    CallStatus::Closed if self.draining.is_some() => status::CANCELLED,
                    other => {
                        tracing::debug!(user = d.user, status = ?other, "call failed");
                        status::TRANSPORT
                    }
                };
                if let Some(i) = slot.filter(|_| started.is_some()) {
                    let sl = &mut self.slots[i];
                    sl.in_flight = sl.in_flight.saturating_sub(1);
                    if sl.in_flight == 0 && sl.notify_idle {
                        sl.notify_idle = false;
                        let id = sl.stats.info.id;
                        self.emit(Event::Idle { conn: id });
                    }
                }
                if let Some(i) = slot {
                    let v2 = self.drv.connection(conn).is_some_and(|c| c.version() == 2);
                    let sl = &mut self.slots[i];
                    if code == status::OK && v2 && sl.stats.info.client && !sl.v2_confirmed {
                        sl.v2_confirmed = true;
                        let id = sl.stats.info.id;
                        self.emit(Event::V2Confirmed { conn: id });
                    }
                    let s = &mut self.slots[i].stats;
                    if code == status::OK {
                        s.info.replies_in += 1;
                        s.info.bytes_in = s.info.bytes_in.saturating_add(u64::from(d.reply_len));
                        if let Some((t0, _)) = started {
                            let ns = u64::try_from(now.saturating_duration_since(t0).as_nanos())
                                .unwrap_or(u64::MAX);
                            s.latency.record(ns);
                        }
                    } else {
                        s.info.call_errors += 1;
                    }
                }
                if code == status::OK {
                    self.stats.totals.replies_in += 1;
                    self.stats.totals.bytes_in = self
                        .stats
                        .totals
                        .bytes_in
                        .saturating_add(u64::from(d.reply_len));
                } else {
                    self.stats.totals.call_errors += 1;
                }
                self.table.complete_call(
                    id,
                    CallOutcome {
                        status: code,
                        rpc_stat: d.rpc_stat,
                        reply_len: if code == status::OK { d.reply_len } else { 0 },
                        results: if code == status::OK { d.results() } else { &[] },
                    },
                );
            }
            ConnEvent::IncomingCall(ic) => {
                self.count_incoming(slot, ic.args_len);
                self.dispatch_incoming(conn, slot, ic);
            }
            ConnEvent::ArgsReady { id, args_len } => {
                let tag = serve_tag(conn, id);
                let Some(Serving::Receiving {
                    app,
                    rb,
                    prog,
                    vers,
                    proc_,
                    xid,
                }) = self.serving.remove(&tag)
                else {
                    return;
                };
                let _ = app;
                let call = IncomingCall {
                    peer: slot.map_or(u32::MAX, |i| self.conn_peer_index(i as u32)),
                    prog,
                    vers,
                    proc_,
                    xid,
                    args_len,
                    tag,
                };
                match self.table.deliver_call(rb, call) {
                    Ok(op) => {
                        self.serving.insert(tag, Serving::Delivered(op));
                    }
                    Err(_) => self.fail_served(conn, id),
                }
            }
            ConnEvent::ReplyDone { id, status: st } => {
                let tag = serve_tag(conn, id);
                if let Some(Serving::Replying(op)) = self.serving.remove(&tag) {
                    let code = match st {
                        ReplyStatus::Sent => status::OK,
                        ReplyStatus::ErrChunk | ReplyStatus::Closed => status::TRANSPORT,
                    };
                    self.table.complete_reply(op, code);
                }
                if st == ReplyStatus::Sent {
                    if let Some(i) = slot {
                        self.slots[i].stats.info.replies_out += 1;
                    }
                    self.stats.totals.replies_out += 1;
                }
            }
            ConnEvent::ServeAborted { id } => {
                let tag = serve_tag(conn, id);
                match self.serving.remove(&tag) {
                    Some(Serving::Delivered(op)) => self.table.cancel_serving(op),
                    Some(Serving::Receiving { rb, .. }) => self.table.put_back_recv(rb),
                    Some(Serving::Replying(op)) => {
                        self.table.complete_reply(op, status::TRANSPORT);
                    }
                    None => {}
                }
            }
            ConnEvent::Optional(m) => match slot {
                Some(i) => {
                    let mut body = Box::new([0u8; super::MAX_OPTINFO]);
                    let src = m.optinfo();
                    let n = src.len().min(body.len());
                    if let (Some(d), Some(s)) = (body.get_mut(..n), src.get(..n)) {
                        d.copy_from_slice(s);
                    }
                    let sl = &self.slots[i];
                    let ev = Event::Optional {
                        conn: sl.stats.info.id,
                        xid: m.xid,
                        opttype: m.opttype,
                        len: n as u16,
                        body,
                        busy: sl.in_flight > 0,
                    };
                    self.emit(ev);
                }
                None => self.drv.reject_optional(conn, m.xid, &mut self.mem),
            },
            ConnEvent::Closed(reason) => {
                tracing::debug!(?reason, "connection closed by the engine");
                if let Some(i) = slot {
                    let s = &mut self.slots[i].stats.info;
                    if matches!(reason, CloseReason::CreditOverrun) {
                        s.protocol_errors += 1;
                        self.stats.totals.protocol_errors += 1;
                    }
                    s.state = ConnState::Closing;
                }
            }
        }
    }

    fn count_incoming(&mut self, slot: Option<usize>, args_len: u32) {
        if let Some(i) = slot {
            let s = &mut self.slots[i].stats.info;
            s.calls_in += 1;
            s.bytes_in = s.bytes_in.saturating_add(u64::from(args_len));
        }
        self.stats.totals.calls_in += 1;
        self.stats.totals.bytes_in = self
            .stats
            .totals
            .bytes_in
            .saturating_add(u64::from(args_len));
    }

    /// Hands an incoming call to the app serving its program: takes one of its receive
    /// buffers and lets the engine place the arguments there. While every buffer of that app
    /// is busy the call waits (bounded); without a serving app it gets PROG_UNAVAIL.
    fn dispatch_incoming(&mut self, conn: ConnId, slot: Option<usize>, ic: crate::IncomingCall) {
        let server = self.table.lookup(ic.prog, ic.vers).or_else(|| {
            // A call arriving on a connection we opened is a backward-direction call.
            slot.filter(|&i| self.slots[i].stats.info.client)
                .and_then(|_| self.table.lookup_backchannel(ic.prog, ic.vers))
        });
        let Some(app) = server else {
            let _ = self
                .drv
                .reject_call(conn, ic.id, PROG_UNAVAIL, &mut self.mem);
            return;
        };
        let rb = match self.table.take_recv(app, ic.args_len) {
            Ok(rb) => rb,
            Err(_) if self.table.recv_posted(app) == 0 && self.held_in.len() < MAX_WAITING => {
                self.held_in.push_back((conn, ic));
                return;
            }
            Err(_) => {
                let _ = self.drv.reject_call(conn, ic.id, SYSTEM_ERR, &mut self.mem);
                return;
            }
        };
        let Some(dest) = self.app_ref(app, rb.buf) else {
            self.table.put_back_recv(rb);
            let _ = self.drv.reject_call(conn, ic.id, SYSTEM_ERR, &mut self.mem);
            return;
        };
        let tag = serve_tag(conn, ic.id);
        self.serving.insert(
            tag,
            Serving::Receiving {
                app,
                rb,
                prog: ic.prog,
                vers: ic.vers,
                proc_: ic.proc_,
                xid: ic.xid,
            },
        );
        if self
            .drv
            .accept_call(conn, ic.id, dest, &mut self.mem)
            .is_err()
        {
            if let Some(Serving::Receiving { rb, .. }) = self.serving.remove(&tag) {
                self.table.put_back_recv(rb);
            }
            let _ = self.drv.reject_call(conn, ic.id, SYSTEM_ERR, &mut self.mem);
        }
    }

    fn emit(&mut self, ev: Event) {
        let _ = self.events.push(ev);
        (self.notify)();
    }

    fn slot_of_qp(&self, qp: QpId) -> Option<usize> {
        self.slots.iter().position(|s| s.qp == Some(qp))
    }

    fn free_slot(&self) -> Option<usize> {
        self.slots.iter().position(|s| s.qp.is_none())
    }

    fn local_private(&self) -> [u8; rpcrdma_proto::cm::LEN] {
        let t = &self.spec.transport;
        CmData {
            remote_invalidate: t.remote_invalidation,
            send_size: t.inline_send,
            recv_size: t.inline_recv,
        }
        .normalized()
        .emit()
    }

    /// A queue pair with its engine connection (receives posted, speaking at most
    /// `version`) in a free slot.
    fn open(
        &mut self,
        role: Role,
        peer: Option<u32>,
        remote: Option<SocketAddr>,
        pd: Option<CmData>,
        version: u32,
    ) -> Result<usize, String> {
        let i = self.free_slot().ok_or("no free connection slot")?;
        // With the thread's shared receive queue attached.
        let init = self.drv.qp_init(self.pd);
        let qp = self
            .drv
            .provider_mut()
            .create_qp(&init)
            .map_err(|e| format!("create queue pair: {e}"))?;
        let version = version.clamp(1, self.spec.transport.version.max(1));
        let conn = match self
            .drv
            .add_connection_version(qp, role, pd, version, &mut self.mem)
        {
            Ok(c) => c,
            Err(e) => {
                let _ = self.drv.provider_mut().destroy_qp(qp);
                return Err(format!("engine: {e}"));
            }
        };
        let t = self.spec.transport;
        let _ = self.drv.configure(conn, |c| {
            c.set_first_reply_timeout(t.v2_first_reply_timeout);
            c.set_chunk_caps(t.max_segments_per_chunk, t.max_chunks_per_list);
        });
        let s = &mut self.slots[i];
        s.qp = Some(qp);
        s.conn = Some(conn);
        s.in_flight = 0;
        s.notify_idle = false;
        s.v2_confirmed = false;
        let id = s.stats.info.id;
        s.stats.info = ConnInfo {
            id,
            state: ConnState::Connecting,
            peer,
            remote,
            client: role == Role::Client,
            inline_send: t.inline_send,
            inline_recv: t.inline_recv,
            credits_offered: self.drv.connection(conn).map_or(0, |c| c.grant()),
            peer_private: pd.map(|p| (p.send_size, p.recv_size, p.remote_invalidate)),
            ..ConnInfo::default()
        };
        s.stats.latency.ensure_empty();
        Ok(i)
    }

    /// Ends slot `i`: its engine connection closes (calls fail) and is removed.
    fn close_slot(&mut self, i: usize) -> Option<u32> {
        let s = self.slots.get_mut(i)?;
        s.qp.take()?;
        let conn = s.conn.take();
        let peer = s.stats.info.peer;
        let id = s.stats.info.id;
        s.stats.info.state = ConnState::Free;
        if let Some(c) = conn {
            self.drv.close(c, CloseReason::Requested, &mut self.mem);
            let now = Instant::now();
            while let Some((cid, ev)) = self.drv.poll_event() {
                self.on_engine(cid, ev, now);
            }
            let _ = self.drv.remove(c);
        }
        let held = std::mem::take(&mut self.waiting);
        for (slot, c) in held {
            if slot == id {
                self.fail_call(c.id, status::TRANSPORT, None);
            } else {
                self.waiting.push_back((slot, c));
            }
        }
        if let Some(p) = peer {
            if let Some(b) = self.by_peer.get_mut(p as usize) {
                if *b == Some(id) {
                    *b = None;
                }
            }
        }
        peer
    }

    fn on_cm(&mut self, ev: CmEvent) {
        match ev {
            CmEvent::ConnectRequest {
                req, private_data, ..
            } => {
                let peer_pd = CmData::parse(private_data.as_slice());
                if self.draining.is_some() {
                    let _ = self.drv.provider_mut().reject(req, &[]);
                    return;
                }
                let version = self.spec.transport.version;
                let i = match self.open(Role::Server, None, None, peer_pd, version) {
                    Ok(i) => i,
                    Err(_) => {
                        let _ = self.drv.provider_mut().reject(req, &[]);
                        return;
                    }
                };
                let pd = self.local_private();
                let t = self.spec.transport;
                let params = ConnParams {
                    private_data: &pd,
                    responder_resources: t.ird,
                    initiator_depth: t.ord,
                };
                let Some(qp) = self.slots[i].qp else {
                    return;
                };
                if self.drv.provider_mut().accept(req, qp, &params).is_err() {
                    self.close_slot(i);
                }
            }
            CmEvent::Established { qp, private_data } => {
                let Some(i) = self.slot_of_qp(qp) else {
                    return;
                };
                if self.slots[i].stats.info.client {
                    let peer_pd = CmData::parse(private_data.as_slice());
                    if let Some(c) = self.slots[i].conn {
                        let _ = self.drv.set_peer(c, peer_pd);
                    }
                    self.slots[i].stats.info.peer_private =
                        peer_pd.map(|p| (p.send_size, p.recv_size, p.remote_invalidate));
                }
                let s = &mut self.slots[i].stats.info;
                s.state = ConnState::Up;
                let (conn, peer, remote) = (s.id, s.peer, s.remote);
                self.stats.totals.conns_opened += 1;
                if let Some(p) = peer {
                    if let Some(b) = self.by_peer.get_mut(p as usize) {
                        *b = Some(conn);
                    }
                }
                self.emit(Event::Up { conn, peer, remote });
            }
            CmEvent::Rejected { qp, .. } | CmEvent::ConnectError { qp } => {
                let reason = if matches!(ev, CmEvent::Rejected { .. }) {
                    Reason::Rejected
                } else {
                    Reason::ConnectError
                };
                let Some(i) = self.slot_of_qp(qp) else {
                    return;
                };
                if let Some(peer) = self.close_slot(i) {
                    self.emit(Event::ConnectFailed { peer, reason });
                }
            }
            CmEvent::Disconnected { qp } => {
                let Some(i) = self.slot_of_qp(qp) else {
                    return;
                };
                let conn = self.slots[i].stats.info.id;
                let was = self.slots[i].stats.info.state;
                // The engine may have ended it (its Closed event can still be queued).
                let ended = self.slots[i]
                    .conn
                    .and_then(|c| self.drv.connection(c)?.closed());
                let reason = match ended {
                    Some(CloseReason::NoAnswer) => Reason::NoAnswer,
                    _ => Reason::Disconnected,
                };
                let peer = self.close_slot(i);
                if was == ConnState::Connecting {
                    if let Some(peer) = peer {
                        self.emit(Event::ConnectFailed {
                            peer,
                            reason: Reason::Disconnected,
                        });
                    }
                } else {
                    self.stats.totals.conns_closed += 1;
                    self.emit(Event::Down { conn, peer, reason });
                }
            }
        }
    }

    /// Commands, app attach/reap; true if anything happened.
    fn housekeeping(&mut self) -> bool {
        let mut work = false;
        let mut buf = [0u8; 64];
        while matches!((&self.bell).read(&mut buf), Ok(n) if n > 0) {}
        while let Some(cmd) = self.commands.pop() {
            work = true;
            self.on_command(cmd);
        }
        while let Ok(Some(att)) = self.apps.accept() {
            work = true;
            let pid = att.pid();
            if self.draining.is_some() {
                continue;
            }
            // Only the arena is registered: the header and rings are never reachable by a peer.
            let layout = att.region().layout();
            let arena_len = att
                .region()
                .len()
                .saturating_sub(layout.arena_offset as usize);
            let mapped =
                Mapped::shared_range(att.region().fd(), u64::from(layout.arena_offset), arena_len);
            let arena = 0u64;
            let reg = mapped.map_err(|e| e.to_string()).and_then(|m| {
                Registered::new(self.drv.provider_mut(), self.pd, m, rw())
                    .map_err(|e| e.to_string())
            });
            let reg = match reg {
                Ok(reg) => reg,
                Err(err) => {
                    // Dropping the attachment closes its socket: the app sees the refusal.
                    tracing::warn!(?pid, %err, arena_len, "cannot register an app's arena (RLIMIT_MEMLOCK? see `ulimit -l`)");
                    continue;
                }
            };
            let mr = reg.mr();
            match self.table.attach(att) {
                Ok(app) => {
                    self.drv.add_region(mr);
                    self.mem.regs.push(reg);
                    self.app_mem.push(AppMem {
                        app,
                        mr: mr.id,
                        arena,
                    });
                    self.emit(Event::AppAttached { pid });
                }
                Err(_) => {
                    let _ = reg.deregister(self.drv.provider_mut());
                }
            }
        }
        let mut gone = self.table.reap();
        gone.extend(self.table.evict_stalled(STALL_LIMIT));
        for d in gone {
            work = true;
            self.on_detached(d);
        }
        let now = Instant::now();
        // A gone app's memory stays registered while the engine may still touch it.
        let mut k = 0;
        while let Some(&(app, mr)) = self.retired.get(k) {
            if self.app_busy(app) {
                k += 1;
                continue;
            }
            self.retired.swap_remove(k);
            self.drv.remove_region(mr);
            if let Some(i) = self.mem.regs.iter().position(|r| r.mr().id == mr) {
                let reg = self.mem.regs.swap_remove(i);
                let _ = reg.deregister(self.drv.provider_mut());
            }
        }
        if let Some(deadline) = self.draining {
            let in_flight = self.started.len() + self.serving.len();
            if in_flight > 0 {
                self.quiet_since = None;
            }
            let quiet = *self.quiet_since.get_or_insert(now);
            // Once nothing is in flight, apps get a moment to read their last completions.
            let lingered = in_flight == 0 && now.duration_since(quiet) >= DRAIN_LINGER;
            if lingered || now >= deadline {
                self.draining = None;
                for i in 0..self.slots.len() {
                    if let Some(qp) = self.slots[i].qp {
                        let _ = self.drv.provider_mut().disconnect(qp);
                        self.slots[i].stats.info.state = ConnState::Closing;
                    }
                }
                self.emit(Event::Drained { in_flight });
            }
        }
        work
    }

    /// Whether the engine may still read or write memory of `app` (calls it made, calls
    /// whose arguments land in its buffers, replies from its arena).
    fn app_busy(&self, app: AppId) -> bool {
        self.started.keys().any(|&k| OpId::from_u64(k).app() == app)
            || self.serving.values().any(|s| match s {
                Serving::Receiving { app: a, .. } => *a == app,
                Serving::Delivered(op) | Serving::Replying(op) => op.app() == app,
            })
    }

    /// Answers a call being served with SYSTEM_ERR (its serving app went away).
    fn fail_served(&mut self, conn: ConnId, sid: ServeId) {
        let empty = MemRef::new(
            self.mem.regs.first().map(|r| r.mr().id).unwrap_or_default(),
            0,
            0,
        );
        let spec = ReplySpec {
            accept_stat: SYSTEM_ERR,
            msg: empty,
            results: &[],
        };
        if self
            .drv
            .submit_reply(conn, sid, &spec, &mut self.mem)
            .is_err()
        {
            let _ = self.drv.reject_call(conn, sid, SYSTEM_ERR, &mut self.mem);
        }
    }

    fn on_detached(&mut self, d: Detached) {
        self.stats.apps_detached += 1;
        // Calls it was serving: their requesters get SYSTEM_ERR.
        for tag in d.serving_tags {
            if let Some(Serving::Delivered(_)) = self.serving.remove(&tag) {
                let (conn, sid): (ConnId, ServeId) = from_serve_tag(tag);
                self.fail_served(conn, sid);
            }
        }
        if let Some(k) = self.app_mem.iter().position(|m| m.app == d.app) {
            let m = self.app_mem.swap_remove(k);
            self.retired.push((d.app, m.mr));
        }
        self.emit(Event::AppDetached {
            pid: d.pid,
            reason: d.reason,
        });
    }

    fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::Listen { addr } => {
                let p = self.drv.provider_mut();
                let result = p
                    .listen(addr)
                    .and_then(|l| {
                        let a = p.listen_addr(l);
                        self.listeners.push(l);
                        a
                    })
                    .map_err(|e| match e {
                        rpcrdma_verbs::Error::Io(io)
                            if io.kind() == std::io::ErrorKind::AddrInUse =>
                        {
                            format!("address {addr} already in use (another rpcrdmad, or the kernel's NFS/RDMA server?)")
                        }
                        e => e.to_string(),
                    });
                self.emit(Event::Listening { addr, result });
            }
            Command::CloseListeners => {
                for l in std::mem::take(&mut self.listeners) {
                    let _ = self.drv.provider_mut().close_listener(l);
                }
            }
            Command::Connect {
                peer,
                addr,
                version,
            } => {
                if self.draining.is_some() {
                    return;
                }
                let i = match self.open(Role::Client, Some(peer), Some(addr), None, version) {
                    Ok(i) => i,
                    Err(e) => {
                        self.emit(Event::ConnectFailed {
                            peer,
                            reason: Reason::Local(e),
                        });
                        return;
                    }
                };
                let pd = self.local_private();
                let t = self.spec.transport;
                let params = ConnParams {
                    private_data: &pd,
                    responder_resources: t.ird,
                    initiator_depth: t.ord,
                };
                let Some(qp) = self.slots[i].qp else {
                    return;
                };
                if let Err(e) = self.drv.provider_mut().connect(qp, addr, &params) {
                    self.close_slot(i);
                    self.emit(Event::ConnectFailed {
                        peer,
                        reason: Reason::Local(e.to_string()),
                    });
                }
            }
            Command::Close { conn } => {
                if let Some(qp) = self.slots.get(conn as usize).and_then(|s| s.qp) {
                    self.slots[conn as usize].stats.info.state = ConnState::Closing;
                    let _ = self.drv.provider_mut().disconnect(qp);
                }
            }
            Command::Snapshot(mut snap) => {
                self.fill(&mut snap);
                self.emit(Event::Snapshot(snap));
            }
            Command::SetIdle(idle) => {
                self.spec.idle = idle;
            }
            Command::Drain { deadline } => {
                for l in std::mem::take(&mut self.listeners) {
                    let _ = self.drv.provider_mut().close_listener(l);
                }
                self.draining = Some(deadline);
                self.quiet_since = None;
            }
            Command::SendOptional {
                conn,
                xid,
                opttype,
                len,
                body,
            } => {
                let c = self.slots.get(conn as usize).and_then(|s| s.conn);
                let b = body.get(..usize::from(len)).unwrap_or(&[]);
                if let Some(c) = c {
                    let _ = self.drv.send_optional(c, xid, opttype, b, &mut self.mem);
                }
            }
            Command::RejectOptional { conn, xid } => {
                if let Some(c) = self.slots.get(conn as usize).and_then(|s| s.conn) {
                    self.drv.reject_optional(c, xid, &mut self.mem);
                }
            }
            Command::ApplyPeer {
                conn,
                rbsiz,
                reqreminv,
            } => {
                if let Some(c) = self.slots.get(conn as usize).and_then(|s| s.conn) {
                    let _ = self.drv.configure(c, |c| {
                        if let Some(r) = rbsiz {
                            c.set_peer_receive_size(r);
                        }
                        if let Some(b) = reqreminv {
                            c.set_peer_takes_invalidate(b);
                        }
                    });
                }
            }
            Command::ApplyOwn { conn, rbsiz } => {
                if let Some(c) = self.slots.get(conn as usize).and_then(|s| s.conn) {
                    let _ = self.drv.configure(c, |c| c.set_own_receive_size(rbsiz));
                }
            }
            Command::CapPeer { conn, rbsiz } => {
                if let Some(c) = self.slots.get(conn as usize).and_then(|s| s.conn) {
                    let _ = self.drv.configure(c, |c| c.set_peer_receive_cap(rbsiz));
                }
            }
            Command::NotifyIdle { conn } => {
                if let Some(s) = self.slots.get_mut(conn as usize) {
                    if s.in_flight == 0 {
                        self.emit(Event::Idle { conn });
                    } else {
                        s.notify_idle = true;
                    }
                }
            }
            Command::Stop => self.stop = true,
        }
    }

    fn fill(&mut self, snap: &mut Snapshot) {
        let t = self.table.stats();
        self.stats.apps = t.apps;
        self.stats.app_ops = t.ops;
        self.stats.bad_submissions = t.bad_submissions;
        self.stats.regions = self.mem.regs.len();
        self.stats.region_bytes = self.mem.regs.iter().map(|r| r.mr().len).sum();
        self.stats.rpcs_in_flight = self.started.len() + self.serving.len();
        self.stats.buffers = self.drv.buffer_counts();
        snap.thread = self.stats;
        snap.n = 0;
        for i in 0..self.slots.len() {
            if self.slots[i].qp.is_none() {
                continue;
            }
            if let Some(c) = self.slots[i].conn.and_then(|c| self.drv.connection(c)) {
                let info = &mut self.slots[i].stats.info;
                info.version = c.version();
                info.credits_granted = c.credit_limit();
                let (send, recv) = c.thresholds();
                info.inline_send = send;
                info.inline_recv = recv;
                info.engine = c.stats();
            }
            let s = &self.slots[i].stats;
            let Some(dst) = snap.conns.get_mut(snap.n) else {
                break;
            };
            dst.info = s.info;
            dst.latency.copy_from(&s.latency);
            snap.n += 1;
        }
    }

    fn wait_idle(&mut self, now: Instant) {
        match self.spec.idle {
            IdleSpec::Spin => std::hint::spin_loop(),
            IdleSpec::Backoff {
                spin_polls,
                backoff_max,
                park_after,
            } => {
                self.idle.empty_polls = self.idle.empty_polls.saturating_add(1);
                let since = *self.idle.since.get_or_insert(now);
                if self.idle.empty_polls < spin_polls {
                    std::hint::spin_loop();
                } else if now.duration_since(since) < park_after {
                    self.idle.pause = (self.idle.pause * 2)
                        .max(Duration::from_micros(1))
                        .min(backoff_max);
                    std::thread::sleep(self.idle.pause);
                } else {
                    self.stats.parks += 1;
                    let fds = [self.apps.as_fd(), self.bell.as_fd()];
                    self.table.park(PARK_MAX, &fds);
                }
            }
        }
    }
}
