//! The poll loop: provider completions and CM events, app rings, hops from other poll
//! threads, commands, idle policy.
//!
//! A thread plays two parts, often for the same RPC: the *app side* (the apps the control
//! thread gave it: their rings, their calls in flight, the calls they serve) and the
//! *connection side* (its queue pairs and engines). The two talk only through [`Hop`]s, to
//! another thread or to this one (see `mesh.rs`), so an app's call travels the same path
//! whether its connection lives here or elsewhere.

use super::admit::{host_of, Gate, Refusal, Refused};
use super::held::HeldLines;
use super::idmap::IdMap;
use super::mesh::{Adoption, Hop, Port, Results, Spares};
use super::stats::{ConnInfo, ConnState, ConnStats, ListenerStats, Snapshot, ThreadStats};
use super::{
    Command, Event, IdleSpec, PollSpec, PoolPlan, Reason, SpinLimit, REFUSAL_REPORT_EVERY,
};
use crate::conn::{
    Accepted, CallStatus, CloseReason, Event as ConnEvent, ReplyStatus, Role, ServeId, SubmitError,
};
use crate::driver::{from_serve_tag, serve_tag, ConnId, Driver};
use crate::mem::{MemRef, RegisteredMem, REGISTERED_ACCESS};
use crate::{ArgPiece, CallSpec, ReplySpec, ResultPiece};
use crossbeam_queue::ArrayQueue;
use rpcrdma_proto::cm::PrivateData as CmData;
use rpcrdma_proto::rpc::AuthSys;
use rpcrdma_shm::abi::{status, ArenaRange, MAX_PIECES};
use rpcrdma_shm::attach::Attachment;
use rpcrdma_shm::daemon::{
    AppId, AppTable, CallOutcome, CallRequest, Detached, IncomingCall, OpId, PieceList, RecvBuf,
    RegisterAck, Submission, TableConfig,
};
use rpcrdma_verbs::mapped::{Mapped, Registered};
use rpcrdma_verbs::{
    CmEvent, ConnParams, ConnReqId, ListenerId, MrId, PdId, PrivateData, Provider, QpId,
};
use std::collections::VecDeque;
use std::io::Read;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn id_map<V>() -> IdMap<V> {
    IdMap::new(8192)
}

/// App submissions taken per poll.
const SUB_BATCH: usize = 32;
/// Hops taken from each other thread per poll.
const HOP_BATCH: usize = 256;
/// Loop iterations between chores while busy: connection-manager events, commands, app
/// reaping. Each may cost a system call (`rdma_get_cm_event` reads its channel, the doorbell
/// is read, app sockets are polled), which a busy turn must not pay every time.
const HOUSEKEEPING_EVERY: u32 = 256;
/// Shortest time between chores on idle turns. Run on every one, they made an idle thread's
/// spin a string of system calls (the connection manager's channel, the doorbell, the apps'
/// sockets), each delaying the thread's answer to the work that ends the spin.
const IDLE_CHORES_EVERY: Duration = Duration::from_micros(50);
/// Shortest time between looks at the apps' sockets for apps that went away (a `poll(2)`;
/// a parked thread hears of them at once anyway).
const REAP_EVERY: Duration = Duration::from_millis(1);
/// Longest park. The apps' sockets, the doorbell and the provider's event fd (the soft
/// provider's sockets; rdma_cm's channel and the completion channel of `ibv`) wake a parked
/// thread; this bounds the wait for the rest: the engine's timers (seconds: a first-message
/// timeout may fire this late), the drain's linger, an app's completion queue that was full.
/// It was 2 ms while provider sockets could not wake a park: 600 wake-ups a second, 1.7 % of
/// a core for an idle daemon.
const PARK_MAX: Duration = Duration::from_millis(20);
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
/// Bits of a call tag below the minting thread's index.
const TAG_THREAD_SHIFT: u32 = 56;

/// One connection slot (its index plus the thread's base is the connection id the control
/// thread sees).
#[derive(Debug, Default)]
struct Slot {
    qp: Option<QpId>,
    conn: Option<ConnId>,
    /// Whether the slot has had a connection (its next gets the next id, `Port::next_conn_id`).
    used: bool,
    stats: ConnStats,
    in_flight: u32,
    notify_idle: bool,
    v2_confirmed: bool,
    /// For a connection a listener admitted: the listener, and the host it counts against
    /// (released when the slot closes).
    admitted: Option<Admitted>,
}

/// A connection's place in its listener's admission count ([`Gate`]).
#[derive(Debug, Clone, Copy)]
struct Admitted {
    /// The thread of the listener (the connection may live on another: [`Hop::Adopt`]).
    owner: usize,
    /// The listener's configuration index.
    index: usize,
    /// The host it counts against.
    host: Option<std::net::IpAddr>,
}

/// Connection side: a call this thread sent for an app (of this thread or another).
#[derive(Debug, Clone, Copy)]
struct Pending {
    origin: usize,
    op: OpId,
    t0: Instant,
    slot: u32,
    /// The status a cancelled call ends with (`CANCELLED` or `TIMEOUT`); 0 until cancelled.
    cancel: u32,
}

/// Connection side: a call this thread received and handed to the thread of its serving app.
#[derive(Debug, Clone, Copy)]
struct Served {
    tag: u64,
    app_thread: usize,
}

/// The details of an incoming call the app side needs: what the serving app is told (its
/// `tag` minted by the connection side, whose top byte names that thread; `args_len` the
/// argument bytes to place), and whether to look up a callback program.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Inbound {
    pub ic: IncomingCall,
    pub backchannel: bool,
}

/// App side: a call being served, by tag: where its arguments go, then which app op answers it.
#[derive(Debug)]
enum Serving {
    Receiving { rb: RecvBuf, call: Inbound },
    Delivered(OpId),
    Replying(OpId),
}

/// An app's arena registered with this thread's provider (`owner`: the thread owning the app).
#[derive(Debug)]
struct AppMem {
    owner: usize,
    app: AppId,
    mr: MrId,
}

/// A poll thread's state; [`PollThread::run`] is its loop.
pub struct PollThread<P: Provider> {
    spec: PollSpec,
    drv: Driver<P>,
    mem: RegisteredMem,
    pd: PdId,
    commands: Arc<ArrayQueue<Command>>,
    events: Arc<ArrayQueue<Event>>,
    /// Events that found the control plane's queue full, handed on in order as it drains
    /// (500 connections coming up at once report 500 `Up`s; none may be lost).
    unsent: VecDeque<Event>,
    port: Port,
    /// Hops to this thread, handled in the same pass.
    local: VecDeque<Hop>,
    /// Hops another thread's full queue did not take yet, per thread, with their number in
    /// `stats.hops_out`.
    outbox: Vec<VecDeque<(u64, Hop)>>,
    /// Registrations of our apps not acknowledged yet, with the number of the last hop that
    /// announced them: an app is told once every thread's queue holds the announcement.
    unacked: Vec<(AppId, RegisterAck, u64)>,
    /// Incoming calls for a program no known app serves, decided once the hops that came
    /// before them have all been taken (an announcement may be among them).
    undecided: Vec<(ConnId, crate::IncomingCall)>,
    notify: Box<dyn Fn() + Send>,
    table: AppTable,
    app_mem: Vec<AppMem>,
    retired: Vec<(AppId, MrId)>,
    subs: Vec<(AppId, Submission)>,
    // App side.
    /// Calls of our apps in flight, by op: the thread and global id of their connection, and
    /// their XID.
    pending: IdMap<(usize, u32, u32)>,
    /// Calls whose time limit passed, from [`AppTable::expired`] (kept: no allocation a turn).
    expired: Vec<OpId>,
    serving: IdMap<Serving>,
    /// Incoming calls waiting for a receive buffer, one line per serving app (with the
    /// thread they came from).
    held_in: HeldLines<AppId, (usize, Inbound)>,
    /// The app table's [`AppTable::recv_epoch`] when `held_in` was last tried.
    held_epoch: u64,
    /// Programs our apps serve, as told to the other threads.
    announced: Vec<(u32, u32, bool, AppId)>,
    /// Boxes for the requests and result pieces hops carry (see [`Spares`]).
    call_boxes: Spares<CallRequest>,
    piece_boxes: Spares<PieceList>,
    // Connection side.
    waiting: VecDeque<(u32, usize, Box<CallRequest>)>,
    /// Slots where a call ended since the waiting calls were last tried (only their calls
    /// are tried again: a call waits because its connection had no free call slot).
    freed: Vec<u32>,
    calls: IdMap<Pending>,
    next_token: u64,
    served: IdMap<Served>,
    by_tag: IdMap<u64>,
    /// Programs served by apps of other threads: (prog, vers, backchannel, thread).
    servers: Vec<(u32, u32, bool, usize)>,
    args: [ArgPiece; MAX_PIECES],
    results: [MemRef; MAX_PIECES],
    rpieces: [ResultPiece; MAX_PIECES],
    listeners: Vec<Listening>,
    /// Connection requests refused since the last [`Event::Refused`], and when that was.
    refusals_unreported: u64,
    refusal_reported_at: Option<Instant>,
    slots: Vec<Slot>,
    /// The slot of each engine connection, by [`ConnId::index`] (checked against the slot's
    /// `conn`: an index is reused once its connection is removed).
    slot_by_conn: Vec<u32>,
    stats: ThreadStats,
    idle: IdleState,
    /// When the chores last ran, and the apps' sockets were last looked at.
    chores_at: Instant,
    reaped_at: Instant,
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

/// A listener of this thread.
#[derive(Debug)]
struct Listening {
    id: ListenerId,
    /// Its index in the configuration.
    index: usize,
    /// Its bound address.
    addr: Option<SocketAddr>,
    gate: Gate,
    /// Requests it admitted (the connections it holds now are its gate's).
    admitted: u64,
    /// Requests refused, by reason, wherever the refusal was made.
    refused: Refused,
}

#[derive(Debug, Default)]
struct IdleState {
    empty_polls: u32,
    since: Option<Instant>,
    pause: Duration,
    /// The provider's ready list was emptied for a park ([`PollThread::park`]).
    park_armed: bool,
}

type StartError = (String, Box<dyn Fn() + Send>);

/// The thread that minted call tag `tag` (the connection side of the call).
fn tag_thread(tag: u64) -> usize {
    (tag >> TAG_THREAD_SHIFT) as usize
}

impl<P: Provider> PollThread<P> {
    /// Registers the buffer pool and starts the engine's driver.
    pub fn new(
        spec: PollSpec,
        mut provider: P,
        port: Port,
        commands: Arc<ArrayQueue<Command>>,
        events: Arc<ArrayQueue<Event>>,
        notify: Box<dyn Fn() + Send>,
    ) -> Result<PollThread<P>, StartError> {
        // Connection ids name their thread by the mesh's connections per thread.
        if spec.max_conns != port.conns_per_thread() {
            let mesh = port.conns_per_thread();
            let e = format!(
                "{} connections in the spec, {mesh} per thread in the mesh: they must agree",
                spec.max_conns
            );
            return Err((e, notify));
        }
        // One shared receive queue and one shared send pool for every connection, each
        // connection's credits capped to its share of the queue; or a block of its own per
        // connection (see `PoolPlan`).
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
            let pd = provider
                .alloc_pd()
                .map_err(|e| format!("protection domain: {e}"))?;
            let depth = plan.cq_depth(&provider)?;
            if depth.clamped() {
                tracing::warn!(
                    thread = spec.index,
                    entries = depth.depth,
                    worst_case = depth.worst,
                    "the completion queue is as deep as the device allows, less than every \
                     connection failing with a full send queue at once would need; an \
                     overflow would end every connection of this thread (fewer connections \
                     per core avoid it)"
                );
            }
            let cq = provider
                .create_cq(depth.depth)
                .map_err(|e| format!("completion queue of {} entries: {e}", depth.depth))?;
            let pool = Mapped::anonymous(pool_len).map_err(|e| format!("buffer pool: {e}"))?;
            let pool = Registered::new(&mut provider, pd, pool, REGISTERED_ACCESS)
                .map_err(|e| format!("registering the buffer pool ({pool_len} bytes): {e}"))?;
            Ok((pd, cq, pool))
        })();
        let (pd, cq, pool) = match setup {
            Ok(x) => x,
            // Each step names itself (the completion queue's depth is the configuration's).
            Err(e) => return Err((e, notify)),
        };
        let drv = match plan.driver(provider, cq, pd, pool.mr()) {
            Ok(d) => d,
            Err(e) => return Err((format!("engine: {e}"), notify)),
        };
        tracing::info!(
            thread = spec.index,
            connections = plan.max_conns,
            receive_queues = ?plan.receive_queues,
            credits = tmpl.credits,
            receives_per_connection = plan.share(),
            recv_buffers = plan.recv_buffers,
            send_buffers = plan.send_buffers,
            registered_bytes = plan.registered_len(),
            "buffer pools registered"
        );
        let peers = u32::try_from(spec.peers.len()).unwrap_or(u32::MAX);
        let table = match AppTable::new(TableConfig {
            max_apps: spec.max_apps,
            // Peer indexes: the configured peers, then one per global connection id (the
            // `peer` of an incoming call, so a serving app can call back on that connection).
            peers: peers.saturating_add(port.conn_ids()).max(1),
            // XIDs this thread's apps get never equal another thread's on a shared connection.
            xid_first: TableConfig::default()
                .xid_first
                .wrapping_add(port.me() as u32),
            xid_step: port.threads() as u32,
            ..TableConfig::default()
        }) {
            Ok(t) => t,
            Err(e) => return Err((format!("app table: {e}"), notify)),
        };
        let base = port.conn_base();
        let slots: Vec<Slot> = (0..spec.max_conns)
            .map(|i| Slot {
                stats: ConnStats {
                    info: ConnInfo {
                        id: base.saturating_add(i),
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
        let threads = port.threads();
        Ok(PollThread {
            spec,
            drv,
            mem: RegisteredMem::new(vec![pool]),
            pd,
            commands,
            events,
            // Room for every slot's connection event at once, so that a burst does not
            // allocate.
            unsent: VecDeque::with_capacity(2 * slots.len() + 64),
            port,
            local: VecDeque::with_capacity(4096),
            outbox: (0..threads).map(|_| VecDeque::new()).collect(),
            unacked: Vec::new(),
            undecided: Vec::with_capacity(64),
            notify,
            table,
            app_mem: Vec::new(),
            retired: Vec::new(),
            subs: Vec::with_capacity(SUB_BATCH),
            pending: id_map(),
            expired: Vec::with_capacity(64),
            serving: id_map(),
            held_in: HeldLines::new(MAX_WAITING),
            held_epoch: 0,
            announced: Vec::new(),
            call_boxes: Spares::new(),
            piece_boxes: Spares::new(),
            waiting: VecDeque::with_capacity(MAX_WAITING),
            freed: Vec::with_capacity(slots.len()),
            calls: id_map(),
            next_token: 0,
            served: id_map(),
            by_tag: id_map(),
            servers: Vec::new(),
            args: [ArgPiece::default(); MAX_PIECES],
            results: [MemRef::default(); MAX_PIECES],
            rpieces: [ResultPiece::default(); MAX_PIECES],
            listeners: Vec::new(),
            refusals_unreported: 0,
            refusal_reported_at: None,
            slot_by_conn: vec![u32::MAX; slots.len()],
            slots,
            stats,
            idle: IdleState::default(),
            chores_at: Instant::now(),
            reaped_at: Instant::now(),
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
            // Chores run every few busy turns, and on idle turns every so often.
            if loops % HOUSEKEEPING_EVERY == 0
                || (!work && now.duration_since(self.chores_at) >= IDLE_CHORES_EVERY)
            {
                self.chores_at = now;
                work |= self.housekeeping(now);
                self.drv.post_pending();
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

    /// One pass over the hops, the completions, the engine and the apps; true if anything
    /// happened.
    fn poll_once(&mut self, now: Instant) -> bool {
        // Hops first: what another thread sent before a peer's message arrived is known when
        // the message is handled. A program an app of another thread registered is announced
        // before the app is told (`acknowledge_announced`); a call for it that arrives while
        // the announcement is still unread (a thread that runs late finds both waiting) must
        // not be answered PROG_UNAVAIL. One that comes in after this pass took the hops waits
        // for the next pass that empties the queues (`undecided`).
        let (mut work, drained) = self.poll_hops(now);
        if drained && !self.undecided.is_empty() {
            work = true;
            self.decide_undecided();
        }
        work |= self.drv.poll(now, &mut self.mem) > 0;
        while let Some((conn, ev)) = self.drv.poll_event() {
            self.on_engine(conn, ev, now);
            work = true;
        }
        if !self.freed.is_empty() {
            work |= self.retry_waiting(now);
        }
        // Calls held for want of a receive buffer are tried again only once something that
        // could place them has happened (retrying them every pass cost a quarter of the
        // thread's instructions when a busy server kept its buffers in use).
        let epoch = self.table.recv_epoch();
        if epoch != self.held_epoch {
            self.held_epoch = epoch;
            work |= self.place_held();
        }
        let mut subs = std::mem::take(&mut self.subs);
        subs.clear();
        self.table.poll_submissions(&mut subs, SUB_BATCH);
        work |= !subs.is_empty();
        for (app, s) in subs.drain(..) {
            self.on_submission(app, s);
        }
        self.subs = subs;
        if self.table.next_deadline().is_some_and(|d| now >= d) {
            work |= self.expire_calls(now);
        }
        // The turn's Sends go out together: only the last of each connection's asks for a
        // completion.
        self.drv.post_pending();
        work
    }

    /// Hops from the other threads and from this one: whether there were any, and whether
    /// every other thread's queue was found empty (all they had sent was taken).
    fn poll_hops(&mut self, now: Instant) -> (bool, bool) {
        let mut work = false;
        let me = self.port.me();
        for to in 0..self.outbox.len() {
            while let Some((n, h)) = self.outbox[to].pop_front() {
                if let Err(h) = self.port.push(to, h) {
                    self.outbox[to].push_front((n, h));
                    break;
                }
                work = true;
            }
        }
        if !self.unacked.is_empty() {
            self.acknowledge_announced();
        }
        let mut drained = true;
        for from in 0..self.port.threads() {
            if from == me {
                continue;
            }
            let mut taken = 0;
            while taken < HOP_BATCH {
                let Some(h) = self.port.pop(from) else {
                    break;
                };
                taken += 1;
                self.stats.hops_in += 1;
                self.on_hop(from, h, now);
            }
            work |= taken > 0;
            drained &= taken < HOP_BATCH;
        }
        while let Some(h) = self.local.pop_front() {
            work = true;
            self.on_hop(me, h, now);
        }
        (work, drained)
    }

    /// Sends `hop` to thread `to` (this one included); never drops it. An answer to another
    /// thread's call or reply takes a box back to it ([`Spares`]).
    fn hop(&mut self, to: usize, mut hop: Hop) {
        if to == self.port.me() {
            self.local.push_back(hop);
            return;
        }
        match &mut hop {
            Hop::CallDone { spare, .. } => *spare = self.call_boxes.give(),
            Hop::ReplyDone { spare, .. } => *spare = self.piece_boxes.give(),
            _ => {}
        }
        let Some(out) = self.outbox.get_mut(to) else {
            tracing::debug!(to, "hop to an unknown thread dropped");
            return;
        };
        self.stats.hops_out += 1;
        let n = self.stats.hops_out;
        if !out.is_empty() {
            self.stats.hops_deferred += 1;
            out.push_back((n, hop));
        } else if let Err(h) = self.port.push(to, hop) {
            // Bounded in practice: hops answer operations in flight, which are bounded.
            self.stats.hops_deferred += 1;
            out.push_back((n, h));
        }
    }

    /// Sends `hop` to every other thread.
    fn hop_others(&mut self, mut make: impl FnMut() -> Option<Hop>) {
        for to in 0..self.port.threads() {
            if to != self.port.me() {
                if let Some(h) = make() {
                    self.hop(to, h);
                }
            }
        }
    }

    fn on_hop(&mut self, from: usize, hop: Hop, now: Instant) {
        match hop {
            Hop::Call { conn, req } => self.conn_call(from, conn, req, now),
            Hop::Cancel {
                op,
                conn,
                xid,
                code,
            } => self.conn_cancel(from, op, conn, xid, code),
            Hop::CallDone {
                op,
                status: code,
                lent,
                rpc_stat,
                reply_len,
                n,
                results,
                spare,
            } => {
                if let Some(b) = spare {
                    self.call_boxes.keep(b);
                }
                // A call that lent its memory stays ours (and keeps its app's arena
                // registered, `app_busy`) until `Hop::Released`.
                if !lent {
                    self.pending.remove(&op.to_u64());
                }
                if code != status::OK {
                    self.stats.totals.call_errors += 1;
                }
                self.table.complete_call(
                    op,
                    CallOutcome {
                        status: code,
                        lent,
                        rpc_stat,
                        reply_len,
                        results: results.get(..usize::from(n)).unwrap_or(&[]),
                    },
                );
            }
            Hop::Released { op } => {
                self.pending.remove(&op.to_u64());
                self.table.release_call(op);
            }
            Hop::Incoming(call) => self.app_incoming(from, call),
            Hop::Accept { tag, app, buf } => self.conn_accept(from, tag, app, buf),
            Hop::Refuse { tag, accept_stat } => self.refuse_served(tag, accept_stat),
            Hop::ArgsReady { tag, args_len } => self.app_args_ready(from, tag, args_len),
            Hop::Reply {
                tag,
                app,
                accept_stat,
                msg,
                results,
            } => {
                self.conn_reply(from, tag, app, accept_stat, msg, &results);
                self.piece_boxes.keep(results);
            }
            Hop::ReplyDone { tag, code, spare } => {
                if let Some(b) = spare {
                    self.piece_boxes.keep(b);
                }
                if let Some(Serving::Replying(op)) = self.serving.remove(&tag) {
                    self.table.complete_reply(op, code);
                }
            }
            Hop::Aborted { tag } => match self.serving.remove(&tag) {
                Some(Serving::Delivered(op)) => self.table.cancel_serving(op),
                Some(Serving::Receiving { rb, .. }) => self.table.put_back_recv(rb),
                Some(Serving::Replying(op)) => {
                    self.table.complete_reply(op, status::TRANSPORT);
                }
                None => self.held_in.remove_where(|(_, c)| c.ic.tag == tag),
            },
            Hop::FailServed { tag } => {
                if let Some(&stag) = self.by_tag.get(&tag) {
                    let (conn, sid) = from_serve_tag(stag);
                    self.fail_served(conn, sid);
                }
            }
            Hop::Arena {
                app,
                fd,
                offset,
                len,
            } => {
                let reg = Mapped::shared_range(fd.as_fd(), offset, len)
                    .map_err(|e| e.to_string())
                    .and_then(|m| {
                        Registered::new(self.drv.provider_mut(), self.pd, m, REGISTERED_ACCESS)
                            .map_err(|e| e.to_string())
                    });
                match reg {
                    Ok(reg) => {
                        let mr = reg.mr();
                        self.drv.add_region(mr);
                        self.mem.insert(reg);
                        self.app_mem.push(AppMem {
                            owner: from,
                            app,
                            mr: mr.id,
                        });
                    }
                    Err(err) => tracing::warn!(
                        thread = self.spec.index,
                        owner = from,
                        %err,
                        len,
                        "cannot register another thread's app arena: its calls on this thread's connections will fail"
                    ),
                }
            }
            Hop::Adopt(a) => self.adopt(a, now),
            Hop::Unadmit {
                index,
                host,
                refused,
            } => self.release_admission(index, host, refused),
            Hop::ArenaGone { app } => {
                if let Some(k) = self
                    .app_mem
                    .iter()
                    .position(|m| m.owner == from && m.app == app)
                {
                    let m = self.app_mem.swap_remove(k);
                    self.deregister(m.mr);
                }
            }
            Hop::Serve {
                prog,
                vers,
                backchannel,
                on,
            } => {
                self.servers
                    .retain(|s| *s != (prog, vers, backchannel, from));
                if on {
                    self.servers.push((prog, vers, backchannel, from));
                }
            }
        }
    }

    fn deregister(&mut self, mr: MrId) {
        self.drv.remove_region(mr);
        if let Some(reg) = self.mem.remove(mr) {
            let _ = reg.deregister(self.drv.provider_mut());
        }
    }

    /// `range` of the arena of app `app` of thread `owner`, as registered here.
    fn app_ref(&self, owner: usize, app: AppId, r: ArenaRange) -> Option<MemRef> {
        self.app_piece(owner, app, r.off(), r.len())
    }

    fn app_piece(&self, owner: usize, app: AppId, off: u32, len: u32) -> Option<MemRef> {
        let m = self
            .app_mem
            .iter()
            .find(|m| m.app == app && m.owner == owner)?;
        // The arena is mapped from its first byte: arena offsets are mapping offsets.
        Some(MemRef::new(m.mr, u64::from(off), len))
    }

    /// The peer index apps use for global connection id `conn` (after the configured peers).
    fn conn_peer_index(&self, conn: u32) -> u32 {
        (self.spec.peers.len() as u32).saturating_add(conn)
    }

    /// This thread's slot of global connection id `conn`, if that connection is its own
    /// (not one the slot had before).
    fn local_slot(&self, conn: u32) -> Option<usize> {
        let i = self.port.slot_of(conn)?;
        (self.slots.get(i)?.stats.info.id == conn).then_some(i)
    }

    /// The slot of engine connection `conn`: every event of the engine asks, so it is a
    /// lookup by the connection's index, not a walk of the slots.
    fn slot_of_conn(&self, conn: ConnId) -> Option<usize> {
        let i = *self.slot_by_conn.get(conn.index())? as usize;
        (self.slots.get(i)?.conn == Some(conn)).then_some(i)
    }

    // ----- App side ---------------------------------------------------------------------

    fn on_submission(&mut self, app: AppId, s: Submission) {
        match s {
            Submission::Call(id) => {
                let Some(c) = self.table.call_request(id) else {
                    return;
                };
                let peer = c.peer;
                let configured = self.spec.peers.len() as u32;
                let conn = match peer.checked_sub(configured) {
                    // A connection addressed directly (backward-direction calls).
                    Some(i) => Some(i),
                    None => self.port.route(peer),
                };
                let to = conn.map(|g| (g, self.port.thread_of(g)));
                match to {
                    Some((conn, to)) if self.draining.is_none() && to < self.port.threads() => {
                        // Boxed straight from the table's copy, once.
                        let req = self.call_boxes.boxed(c);
                        self.pending.insert(id.to_u64(), (to, conn, c.xid));
                        self.hop(to, Hop::Call { conn, req });
                    }
                    _ => {
                        tracing::debug!(peer, "call failed: no connection up to the peer");
                        self.fail_call(id, status::TRANSPORT);
                    }
                }
            }
            Submission::Reply(id) => {
                let Some(r) = self.table.reply_request(id) else {
                    return;
                };
                let (tag, accept_stat, msg) = (r.tag, r.accept_stat, r.msg);
                // Only a call delivered to this very app may be answered (the tag is app data).
                let delivered = matches!(self.serving.get(&tag), Some(Serving::Delivered(op)) if op.app() == id.app());
                if !delivered {
                    self.table.complete_reply(id, status::BAD_HANDLE);
                    return;
                }
                // Boxed straight from the table's copy, once.
                let results = self.piece_boxes.boxed(&r.results);
                self.serving.insert(tag, Serving::Replying(id));
                self.hop(
                    tag_thread(tag),
                    Hop::Reply {
                        tag,
                        app: id.app(),
                        accept_stat,
                        msg,
                        results,
                    },
                );
            }
            Submission::Registered {
                prog,
                vers,
                backchannel,
                ack,
            } => {
                self.announced.push((prog, vers, backchannel, app));
                self.hop_others(|| {
                    Some(Hop::Serve {
                        prog,
                        vers,
                        backchannel,
                        on: true,
                    })
                });
                // The app may have its peers call as soon as it is told: only once the other
                // threads' queues hold the announcement (a full queue defers it).
                self.unacked.push((app, ack, self.stats.hops_out));
                self.acknowledge_announced();
            }
            Submission::Unregistered { .. } => self.sync_announced(),
            // An app closing says so on its ring: its slot is free for the next app now, not
            // at the next look at the sockets.
            Submission::Detach => {
                if let Some(d) = self.table.detach(app, "closed") {
                    self.on_detached(d);
                }
            }
            Submission::Cancel(id) => self.cancel_call(id, status::CANCELLED),
        }
    }

    /// App side: asks the connection side to end call `id` with `code`. A call that has not
    /// reached a connection is not in `pending` (it failed at once); one whose `CallDone` is
    /// on its way ends with that, and the request finds nothing.
    fn cancel_call(&mut self, id: OpId, code: u32) {
        let Some(&(to, conn, xid)) = self.pending.get(&id.to_u64()) else {
            return;
        };
        self.hop(
            to,
            Hop::Cancel {
                op: id,
                conn,
                xid,
                code,
            },
        );
    }

    /// App side: the calls whose time limit passed end with `TIMEOUT`; true if there were any.
    fn expire_calls(&mut self, now: Instant) -> bool {
        let mut late = std::mem::take(&mut self.expired);
        self.table.expired(now, &mut late);
        let any = !late.is_empty();
        for id in late.drain(..) {
            tracing::debug!(op = id.to_u64(), "call timed out");
            self.cancel_call(id, status::TIMEOUT);
        }
        self.expired = late;
        any
    }

    /// Connection side: ends call `op` of thread `origin` with `code` (see [`Hop::Cancel`]).
    fn conn_cancel(&mut self, origin: usize, op: OpId, conn: u32, xid: u32, code: u32) {
        if let Some(k) = self
            .waiting
            .iter()
            .position(|(_, o, c)| *o == origin && c.id == op)
        {
            if let Some((slot, _, c)) = self.waiting.remove(k) {
                self.call_failed(origin, op, code, Some(slot));
                self.call_boxes.keep(c);
            }
            return;
        }
        let Some(id) = self.local_slot(conn).and_then(|i| self.slots[i].conn) else {
            return;
        };
        // The engine's call under that XID must be this very call, not yet cancelled.
        let Some(token) = self.drv.call_user(id, xid) else {
            return;
        };
        match self.calls.get_mut(&token) {
            Some(p) if p.origin == origin && p.op == op && p.cancel == 0 => p.cancel = code,
            _ => return,
        }
        if let Err(e) = self.drv.cancel_call(id, xid, &mut self.mem) {
            tracing::debug!(conn, xid, error = ?e, "cancel refused by the engine");
        }
    }

    /// Acknowledges the registrations whose announcements every other thread's queue holds.
    fn acknowledge_announced(&mut self) {
        let mut k = 0;
        while let Some(&(app, ack, last)) = self.unacked.get(k) {
            let queued = self
                .outbox
                .iter()
                .all(|o| o.front().is_none_or(|&(n, _)| n > last));
            if queued {
                self.table.acknowledge(app, ack);
                self.unacked.remove(k);
            } else {
                k += 1;
            }
        }
    }

    /// Tells the other threads about programs our apps no longer serve.
    fn sync_announced(&mut self) {
        let mut k = 0;
        while let Some(&(prog, vers, backchannel, app)) = self.announced.get(k) {
            let now = if backchannel {
                self.table.lookup_backchannel(prog, vers)
            } else {
                self.table.lookup(prog, vers)
            };
            if now == Some(app) {
                k += 1;
                continue;
            }
            self.announced.swap_remove(k);
            self.hop_others(|| {
                Some(Hop::Serve {
                    prog,
                    vers,
                    backchannel,
                    on: false,
                })
            });
        }
    }

    /// Fails a call of one of our apps before it reached a connection.
    fn fail_call(&mut self, id: OpId, code: u32) {
        self.stats.totals.call_errors += 1;
        self.table.complete_call(
            id,
            CallOutcome {
                status: code,
                ..CallOutcome::default()
            },
        );
    }

    /// A call for a program our app serves: takes one of its receive buffers and asks the
    /// connection side to place the arguments there. While every buffer of that app is busy
    /// the call waits (bounded); without a serving app it gets PROG_UNAVAIL.
    fn app_incoming(&mut self, from: usize, call: Inbound) {
        self.route_incoming(from, call, true);
    }

    /// [`app_incoming`](Self::app_incoming) of a call that is `new` (counted if it waits), or
    /// of one held already whose program another app serves now (or none).
    fn route_incoming(&mut self, from: usize, call: Inbound, new: bool) {
        let Some(app) = self.server_app(&call) else {
            return self.hop(
                from,
                Hop::Refuse {
                    tag: call.ic.tag,
                    accept_stat: PROG_UNAVAIL,
                },
            );
        };
        // Behind the calls already waiting for this server, or waiting while every buffer
        // of it is in use. With every node of the lines in use, it tries for a buffer at once
        // (and is refused without one).
        let call = if self.held_in.line_len(app) > 0 || self.table.recv_posted(app) == 0 {
            match self.held_in.push(app, (from, call)) {
                Ok(()) => {
                    self.stats.calls_held_total += u64::from(new);
                    return;
                }
                Err((_, call)) => call,
            }
        } else {
            call
        };
        self.place_incoming(from, app, call);
    }

    /// The app of this thread serving `call`'s program (a callback program only on a
    /// connection this side opened).
    fn server_app(&self, call: &Inbound) -> Option<AppId> {
        let (p, v) = (call.ic.prog, call.ic.vers);
        self.table.lookup(p, v).or_else(|| {
            call.backchannel
                .then(|| self.table.lookup_backchannel(p, v))
                .flatten()
        })
    }

    /// Places held calls whose server has a buffer now, in order, each line until its
    /// server has none; a call whose program is served by another app now (or by none) is
    /// routed again. True if any call left the lines.
    fn place_held(&mut self) -> bool {
        let mut moved = false;
        let mut k = 0;
        while let Some((app, &(from, call))) = self.held_in.head(k) {
            let server = self.server_app(&call);
            if server == Some(app) && self.table.recv_posted(app) == 0 {
                k += 1;
                continue;
            }
            // Line `k` is looked at again: the same line, or, if it emptied and went, the
            // last line, which took its place unseen. A call routed again joins the line of
            // its new server (which has no buffer, or calls ahead of it) or is placed: the
            // table's registrations do not change in this pass, so no call moves twice.
            self.held_in.pop(k);
            moved = true;
            match server {
                Some(a) if a == app => self.place_incoming(from, app, call),
                _ => self.route_incoming(from, call, false),
            }
        }
        moved
    }

    /// Gives `call` a receive buffer of `app` and asks its connection side for the arguments.
    fn place_incoming(&mut self, from: usize, app: AppId, call: Inbound) {
        match self.table.take_recv(app, call.ic.args_len) {
            Ok(rb) => {
                let buf = rb.buf;
                self.serving
                    .insert(call.ic.tag, Serving::Receiving { rb, call });
                self.hop(
                    from,
                    Hop::Accept {
                        tag: call.ic.tag,
                        app,
                        buf,
                    },
                );
            }
            Err(_) => self.hop(
                from,
                Hop::Refuse {
                    tag: call.ic.tag,
                    accept_stat: SYSTEM_ERR,
                },
            ),
        }
    }

    fn app_args_ready(&mut self, from: usize, tag: u64, args_len: u32) {
        let Some(Serving::Receiving { rb, call }) = self.serving.remove(&tag) else {
            return;
        };
        let ic = IncomingCall {
            args_len,
            ..call.ic
        };
        match self.table.deliver_call(rb, ic) {
            Ok(op) => {
                self.serving.insert(tag, Serving::Delivered(op));
            }
            Err(_) => self.hop(from, Hop::FailServed { tag }),
        }
    }

    // ----- Connection side --------------------------------------------------------------

    /// A call from an app of thread `origin` for connection `conn` of this thread.
    fn conn_call(&mut self, origin: usize, conn: u32, c: Box<CallRequest>, now: Instant) {
        let up = self
            .local_slot(conn)
            .filter(|&i| self.slots[i].stats.info.state == ConnState::Up);
        match up {
            Some(i) if self.draining.is_none() => self.send_call(i as u32, origin, c, now),
            _ => {
                tracing::debug!(conn, "call failed: connection not up");
                self.call_failed(origin, c.id, status::TRANSPORT, None);
                self.call_boxes.keep(c);
            }
        }
    }

    /// Tries again, in order, the waiting calls of the slots where a call ended; a slot whose
    /// call does not fit again is not tried further. True if any call left the line.
    fn retry_waiting(&mut self, now: Instant) -> bool {
        let held = self.waiting.len();
        for _ in 0..held {
            let Some((slot, origin, c)) = self.waiting.pop_front() else {
                break;
            };
            if !self.freed.contains(&slot) {
                self.waiting.push_back((slot, origin, c));
                continue;
            }
            let before = self.waiting.len();
            self.send_call(slot, origin, c, now);
            if self.waiting.len() > before {
                // Its connection has no free call slot again: its later calls wait on.
                self.freed.retain(|&s| s != slot);
            }
        }
        self.freed.clear();
        self.waiting.len() < held
    }

    /// Hands a call to the engine of connection slot `i` (held if every call slot is busy).
    fn send_call(&mut self, i: u32, origin: usize, c: Box<CallRequest>, now: Instant) {
        match self.submit_call(i, origin, &c, now) {
            Err(()) if self.waiting.len() < MAX_WAITING => self.waiting.push_back((i, origin, c)),
            Err(()) => {
                tracing::debug!(conn = i, "call refused: too many calls waiting for a slot");
                self.call_failed(origin, c.id, status::TRANSPORT, Some(i));
                self.call_boxes.keep(c);
            }
            Ok(()) => self.call_boxes.keep(c),
        }
    }

    /// [`send_call`](Self::send_call) but for holding the call: `Err` if every call slot of the
    /// connection is busy (the call is not ended then); any other outcome is reported.
    fn submit_call(
        &mut self,
        i: u32,
        origin: usize,
        c: &CallRequest,
        now: Instant,
    ) -> Result<(), ()> {
        let Some(conn) = self.slots.get(i as usize).and_then(|s| s.conn) else {
            self.call_failed(origin, c.id, status::TRANSPORT, None);
            return Ok(());
        };
        let app = c.id.app();
        let (Some(msg), Some(reply)) = (
            self.app_ref(origin, app, c.msg),
            self.app_ref(origin, app, c.reply),
        ) else {
            self.call_failed(origin, c.id, status::BAD_RANGE, Some(i));
            return Ok(());
        };
        let mut na = 0;
        for p in c.args.as_slice() {
            let (Some(mem), Some(dst)) = (
                self.app_piece(origin, app, p.off, p.len),
                self.args.get_mut(na),
            ) else {
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
            let (Some(mem), Some(dst)) = (
                self.app_piece(origin, app, p.off, p.len),
                self.results.get_mut(nr),
            ) else {
                break;
            };
            *dst = mem;
            nr += 1;
        }
        let token = self.next_token;
        let spec = CallSpec {
            auth: c.auth.map(|(uid, gid)| AuthSys { uid, gid }),
            user: token,
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
                self.next_token = token.wrapping_add(1);
                self.calls.insert(
                    token,
                    Pending {
                        origin,
                        op: c.id,
                        t0: now,
                        slot: i,
                        cancel: 0,
                    },
                );
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
            Err(crate::SubmitError::Busy) => return Err(()),
            Err(e) => {
                // The shm ABI has one code for every transport failure; the reason goes to the log.
                tracing::debug!(conn = i, error = ?e, len = c.msg.len(), "call refused by the engine");
                self.call_failed(origin, c.id, status::TRANSPORT, Some(i))
            }
        }
        Ok(())
    }

    /// Ends a call of thread `origin`'s app on the connection side with `code`.
    fn call_failed(&mut self, origin: usize, op: OpId, code: u32, slot: Option<u32>) {
        self.hop_failed(origin, op, code, slot.map(|i| i as usize), false);
    }

    /// Tells thread `origin` that its app's call `op` ended without a reply, with `code`
    /// (`lent`: its memory is not the app's yet), counting it against connection slot `slot`.
    fn hop_failed(&mut self, origin: usize, op: OpId, code: u32, slot: Option<usize>, lent: bool) {
        if let Some(s) = slot.and_then(|i| self.slots.get_mut(i)) {
            s.stats.info.call_errors += 1;
        }
        self.hop(
            origin,
            Hop::CallDone {
                op,
                status: code,
                lent,
                rpc_stat: 0,
                reply_len: 0,
                n: 0,
                results: Results::default(),
                spare: None,
            },
        );
    }

    /// The thread whose app serves (`prog`, `vers`): forward programs first, then (on a
    /// connection we opened) callback programs; apps of this thread first.
    fn server_thread(&self, prog: u32, vers: u32, client: bool) -> Option<usize> {
        let me = self.port.me();
        let remote = |bc: bool| {
            self.servers
                .iter()
                .find(|s| s.0 == prog && s.1 == vers && s.2 == bc)
                .map(|s| s.3)
        };
        if self.table.lookup(prog, vers).is_some() {
            return Some(me);
        }
        if let Some(t) = remote(false) {
            return Some(t);
        }
        if !client {
            return None;
        }
        if self.table.lookup_backchannel(prog, vers).is_some() {
            return Some(me);
        }
        remote(true)
    }

    /// Incoming calls that found no server, once every hop sent before them has been taken:
    /// to the app that registered meanwhile, or PROG_UNAVAIL.
    fn decide_undecided(&mut self) {
        let mut calls = std::mem::take(&mut self.undecided);
        for (conn, ic) in calls.drain(..) {
            // The connection may have ended meanwhile (then the engine has let the call go).
            let slot = self.slot_of_conn(conn);
            self.conn_incoming(conn, slot, ic, true);
        }
        self.undecided = calls;
    }

    /// An incoming call: to the thread of the app serving its program, or PROG_UNAVAIL. A call
    /// that finds no server before its `last_look` waits for the hops already sent to this
    /// thread: an app of another thread may have registered the program, and its peer called
    /// as soon as it was told, before this thread took the announcement.
    fn conn_incoming(
        &mut self,
        conn: ConnId,
        slot: Option<usize>,
        ic: crate::IncomingCall,
        last_look: bool,
    ) {
        let Some(i) = slot else {
            let _ = self.drv.reject_call(conn, ic.id, SYSTEM_ERR, &mut self.mem);
            return;
        };
        let client = self.slots[i].stats.info.client;
        let Some(to) = self.server_thread(ic.prog, ic.vers, client) else {
            if !last_look && self.port.threads() > 1 {
                self.undecided.push((conn, ic));
                return;
            }
            let _ = self
                .drv
                .reject_call(conn, ic.id, PROG_UNAVAIL, &mut self.mem);
            return;
        };
        let tag = ((self.port.me() as u64) << TAG_THREAD_SHIFT)
            | (self.next_token & ((1 << TAG_THREAD_SHIFT) - 1));
        self.next_token = self.next_token.wrapping_add(1);
        let stag = serve_tag(conn, ic.id);
        self.served.insert(
            stag,
            Served {
                tag,
                app_thread: to,
            },
        );
        self.by_tag.insert(tag, stag);
        let call = Inbound {
            ic: IncomingCall {
                tag,
                peer: self.conn_peer_index(self.slots[i].stats.info.id),
                prog: ic.prog,
                vers: ic.vers,
                proc_: ic.proc_,
                xid: ic.xid,
                args_len: ic.args_len,
                auth: ic.auth.map(|a| (a.uid, a.gid)),
            },
            backchannel: client,
        };
        self.hop(to, Hop::Incoming(call));
    }

    /// The app side gave a buffer of `app` (of thread `from`) for the arguments of `tag`.
    fn conn_accept(&mut self, from: usize, tag: u64, app: AppId, buf: ArenaRange) {
        // Not found: the call ended meanwhile and the app side was told (`Aborted`).
        let Some(&stag) = self.by_tag.get(&tag) else {
            return;
        };
        let (conn, sid) = from_serve_tag(stag);
        let accepted = match self.app_ref(from, app, buf) {
            Some(dest) => self.drv.accept_call(conn, sid, dest, &mut self.mem),
            None => Err(SubmitError::Invalid("buffer outside the app's arena")),
        };
        match accepted {
            Ok(Accepted::Ready { args_len }) => self.args_ready(conn, sid, args_len),
            // `ConnEvent::ArgsReady` follows.
            Ok(Accepted::Pulling) => {}
            Err(_) => {
                self.refuse_served(tag, SYSTEM_ERR);
                self.hop(from, Hop::Aborted { tag });
            }
        }
    }

    /// The arguments of served call `id` are in place: the app side may deliver it.
    fn args_ready(&mut self, conn: ConnId, id: ServeId, args_len: u32) {
        if let Some(&s) = self.served.get(&serve_tag(conn, id)) {
            self.hop(
                s.app_thread,
                Hop::ArgsReady {
                    tag: s.tag,
                    args_len,
                },
            );
        }
    }

    /// Answers served call `tag` with `accept_stat` and forgets it (if it is still known).
    fn refuse_served(&mut self, tag: u64, accept_stat: u32) {
        if let Some(stag) = self.by_tag.remove(&tag) {
            self.served.remove(&stag);
            let (conn, sid) = from_serve_tag(stag);
            let _ = self.drv.reject_call(conn, sid, accept_stat, &mut self.mem);
        }
    }

    /// Forgets the served call `id` of `conn` (its engine part ended); where it went.
    fn forget_served(&mut self, conn: ConnId, id: ServeId) -> Option<Served> {
        let s = self.served.remove(&serve_tag(conn, id))?;
        self.by_tag.remove(&s.tag);
        Some(s)
    }

    /// The app side's reply to `tag`.
    fn conn_reply(
        &mut self,
        from: usize,
        tag: u64,
        app: AppId,
        accept_stat: u32,
        msg: ArenaRange,
        results: &PieceList,
    ) {
        let Some(&stag) = self.by_tag.get(&tag) else {
            return self.hop(
                from,
                Hop::ReplyDone {
                    tag,
                    code: status::TRANSPORT,
                    spare: None,
                },
            );
        };
        let (conn, sid) = from_serve_tag(stag);
        let Some(msg) = self.app_ref(from, app, msg) else {
            // The requester still gets an answer (SYSTEM_ERR), the app its error.
            self.fail_served(conn, sid);
            return self.hop(
                from,
                Hop::ReplyDone {
                    tag,
                    code: status::BAD_RANGE,
                    spare: None,
                },
            );
        };
        let mut n = 0;
        for p in results.as_slice() {
            let (Some(mem), Some(dst)) = (
                self.app_piece(from, app, p.off, p.len),
                self.rpieces.get_mut(n),
            ) else {
                break;
            };
            *dst = ResultPiece {
                mem,
                xdr_pos: p.xdr_pos,
            };
            n += 1;
        }
        let spec = ReplySpec {
            accept_stat,
            msg,
            results: &self.rpieces[..n],
        };
        if let Err(e) = self.drv.submit_reply(conn, sid, &spec, &mut self.mem) {
            tracing::debug!(error = ?e, "reply refused by the engine");
            self.fail_served(conn, sid);
            self.hop(
                from,
                Hop::ReplyDone {
                    tag,
                    code: status::TRANSPORT,
                    spare: None,
                },
            );
        }
    }

    /// Connection side: call `user` was cancelled while the peer may still reach its memory
    /// (`CallDone::lent`): its app hears now, with the flag that says so; the call stays ours
    /// (`calls`, its slot's count) until the engine releases it.
    fn call_lent(&mut self, user: u64, slot: Option<usize>) {
        let Some(&p) = self.calls.get(&user) else {
            return;
        };
        let code = if p.cancel != 0 {
            p.cancel
        } else {
            status::CANCELLED
        };
        self.hop_failed(p.origin, p.op, code, slot, true);
    }

    /// Connection side: call `p` no longer holds its connection's slot `slot` (of this
    /// event's connection; `None` if it has gone).
    fn call_left(&mut self, p: &Pending, slot: Option<usize>) {
        let i = p.slot as usize;
        if !self.waiting.is_empty() && !self.freed.contains(&p.slot) {
            self.freed.push(p.slot);
        }
        // The call's slot, unless a later connection took it while this one retired.
        let own = slot == Some(i) || self.slots.get(i).is_some_and(|s| s.conn.is_none());
        if let Some(sl) = self.slots.get_mut(i).filter(|_| own) {
            sl.in_flight = sl.in_flight.saturating_sub(1);
            if sl.in_flight == 0 && sl.notify_idle {
                sl.notify_idle = false;
                let id = sl.stats.info.id;
                self.emit(Event::Idle { conn: id });
            }
        }
    }

    fn on_engine(&mut self, conn: ConnId, ev: ConnEvent, now: Instant) {
        let slot = self.slot_of_conn(conn);
        match ev {
            ConnEvent::CallDone(d) if d.lent => self.call_lent(d.user, slot),
            ConnEvent::CallReleased { user, .. } => {
                if let Some(p) = self.calls.remove(&user) {
                    self.call_left(&p, slot);
                    self.hop(p.origin, Hop::Released { op: p.op });
                }
            }
            ConnEvent::CallDone(d) => {
                let Some(p) = self.calls.remove(&d.user) else {
                    return;
                };
                let code = match d.status {
                    CallStatus::Ok => status::OK,
                    CallStatus::ReplyTooLarge => status::REPLY_TOO_LARGE,
                    CallStatus::ErrChunk => status::CHUNK_REFUSED,
                    CallStatus::BadReply => status::BAD_REPLY,
                    CallStatus::Cancelled if p.cancel != 0 => p.cancel,
                    CallStatus::Closed if self.draining.is_some() => status::CANCELLED,
                    other => {
                        tracing::debug!(user = d.user, status = ?other, "call failed");
                        status::TRANSPORT
                    }
                };
                self.call_left(&p, slot);
                let i = p.slot as usize;
                if slot == Some(i) {
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
                        let ns = u64::try_from(now.saturating_duration_since(p.t0).as_nanos())
                            .unwrap_or(u64::MAX);
                        s.latency.record(ns);
                    } else {
                        s.info.call_errors += 1;
                    }
                    // The peer broke the protocol (and only this call pays for it).
                    if d.status == CallStatus::BadReply {
                        s.info.protocol_errors += 1;
                        self.stats.totals.protocol_errors += 1;
                    }
                }
                if code == status::OK {
                    self.stats.totals.replies_in += 1;
                    self.stats.totals.bytes_in = self
                        .stats
                        .totals
                        .bytes_in
                        .saturating_add(u64::from(d.reply_len));
                }
                let mut results = Results::default();
                let mut n = 0u8;
                if code == status::OK {
                    for (dst, src) in results.iter_mut().zip(d.results()) {
                        *dst = src;
                        n += 1;
                    }
                }
                self.hop(
                    p.origin,
                    Hop::CallDone {
                        op: p.op,
                        status: code,
                        lent: false,
                        rpc_stat: d.rpc_stat,
                        reply_len: if code == status::OK { d.reply_len } else { 0 },
                        n,
                        results,
                        spare: None,
                    },
                );
            }
            ConnEvent::IncomingCall(ic) => {
                self.count_incoming(slot, ic.args_len);
                self.conn_incoming(conn, slot, ic, false);
            }
            ConnEvent::ArgsReady { id, args_len } => self.args_ready(conn, id, args_len),
            ConnEvent::ReplyDone { id, status: st } => {
                if let Some(s) = self.forget_served(conn, id) {
                    let code = match st {
                        ReplyStatus::Sent => status::OK,
                        ReplyStatus::ErrChunk | ReplyStatus::Closed => status::TRANSPORT,
                    };
                    let done = Hop::ReplyDone {
                        tag: s.tag,
                        code,
                        spare: None,
                    };
                    self.hop(s.app_thread, done);
                }
                if st == ReplyStatus::Sent {
                    if let Some(i) = slot {
                        self.slots[i].stats.info.replies_out += 1;
                    }
                    self.stats.totals.replies_out += 1;
                }
            }
            ConnEvent::ServeAborted { id } => {
                if let Some(s) = self.forget_served(conn, id) {
                    self.hop(s.app_thread, Hop::Aborted { tag: s.tag });
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

    fn emit(&mut self, ev: Event) {
        if !self.unsent.is_empty() {
            self.unsent.push_back(ev);
        } else if let Err(ev) = self.events.push(ev) {
            self.unsent.push_back(ev);
        }
        (self.notify)();
    }

    /// Counts a refused connection request (for the thread, and for listener `at` when it is
    /// this thread's) and reports it, or counts it as unreported if the last report was under
    /// [`REFUSAL_REPORT_EVERY`] ago.
    fn refused(
        &mut self,
        at: Option<usize>,
        remote: Option<SocketAddr>,
        why: Refusal,
        now: Instant,
    ) {
        self.stats.connects_refused.add(why);
        if let Some(l) = at.and_then(|k| self.listeners.get_mut(k)) {
            l.refused.add(why);
        }
        let quiet = self
            .refusal_reported_at
            .is_none_or(|t| now.saturating_duration_since(t) >= REFUSAL_REPORT_EVERY);
        if !quiet {
            self.refusals_unreported += 1;
            return;
        }
        self.refusal_reported_at = Some(now);
        let unreported = std::mem::take(&mut self.refusals_unreported);
        let listener = at.and_then(|k| self.listeners.get(k)).and_then(|l| l.addr);
        self.emit(Event::Refused {
            listener,
            remote,
            reason: why,
            unreported,
        });
    }

    fn close_listeners(&mut self) {
        for l in std::mem::take(&mut self.listeners) {
            let _ = self.drv.provider_mut().close_listener(l.id);
        }
    }

    /// Hands on the events that found the control plane's queue full; true if any went.
    fn emit_unsent(&mut self) -> bool {
        let mut sent = false;
        while let Some(ev) = self.unsent.pop_front() {
            if let Err(ev) = self.events.push(ev) {
                self.unsent.push_front(ev);
                break;
            }
            sent = true;
        }
        if sent {
            (self.notify)();
        }
        sent
    }

    fn slot_of_qp(&self, qp: QpId) -> Option<usize> {
        self.slots.iter().position(|s| s.qp == Some(qp))
    }

    fn free_slot(&self) -> Option<usize> {
        self.slots.iter().position(|s| s.qp.is_none())
    }

    /// What this side announces in its RFC 8797 private data.
    fn local_cm(&self) -> CmData {
        let t = &self.spec.transport;
        CmData {
            remote_invalidate: t.remote_invalidation,
            send_size: t.inline_send,
            recv_size: t.inline_recv,
        }
        .normalized()
    }

    fn local_private(&self) -> [u8; rpcrdma_proto::cm::LEN] {
        self.local_cm().emit()
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
        let conn = match self.drv.add_connection_version(qp, role, pd, version) {
            Ok(c) => c,
            Err(e) => {
                let _ = self.drv.provider_mut().destroy_qp(qp);
                return Err(format!("engine: {e}"));
            }
        };
        let t = self.spec.transport;
        // The engine's receive buffers may be larger than the size announced to the peer
        // (pools.recv-buffer-size above transport.inline-recv): the peer sends by the latter.
        let announced = self.local_cm().recv_size;
        let _ = self.drv.configure(conn, |c| {
            c.set_first_reply_timeout(t.v2_first_reply_timeout);
            c.set_chunk_caps(t.max_segments_per_chunk, t.max_chunks_per_list);
            c.set_announced_receive_size(announced);
        });
        if self.slot_by_conn.len() <= conn.index() {
            self.slot_by_conn.resize(conn.index() + 1, u32::MAX);
        }
        self.slot_by_conn[conn.index()] = i as u32;
        let s = &mut self.slots[i];
        if s.used {
            s.stats.info.id = self.port.next_conn_id(s.stats.info.id);
        }
        s.used = true;
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
        self.port.load(self.port.me(), true);
        Ok(i)
    }

    /// The connection parameters this thread offers, with private data `pd`
    /// ([`local_private`](Self::local_private)): the configured RDMA Read depths.
    fn conn_params<'a>(&self, pd: &'a [u8]) -> ConnParams<'a> {
        let t = self.spec.transport;
        ConnParams {
            private_data: pd,
            responder_resources: t.ird,
            initiator_depth: t.ord,
        }
    }

    /// Gives connection `a`'s place back to its listener's admission count, on the
    /// listener's thread; `refused`: it was refused after all (no slot, the daemon stopping).
    fn unadmit(&mut self, a: Admitted, refused: Option<Refusal>) {
        if a.owner == self.port.me() {
            self.release_admission(a.index, a.host, refused);
        } else {
            let (index, host) = (a.index, a.host);
            self.hop(
                a.owner,
                Hop::Unadmit {
                    index,
                    host,
                    refused,
                },
            );
        }
    }

    /// [`unadmit`](Self::unadmit) on the listener's own thread.
    fn release_admission(
        &mut self,
        index: usize,
        host: Option<std::net::IpAddr>,
        refused: Option<Refusal>,
    ) {
        if let Some(l) = self.listeners.iter_mut().find(|l| l.index == index) {
            l.gate.release(host, Instant::now());
            if let Some(why) = refused {
                l.refused.add(why);
            }
        }
    }

    /// Ends slot `i`: its engine connection closes (calls fail) and is removed.
    fn close_slot(&mut self, i: usize) -> Option<u32> {
        let s = self.slots.get_mut(i)?;
        s.qp.take()?;
        let conn = s.conn.take();
        let admitted = s.admitted.take();
        let peer = s.stats.info.peer;
        let id = s.stats.info.id;
        s.stats.info.state = ConnState::Free;
        self.port.load(self.port.me(), false);
        if let Some(a) = admitted {
            self.unadmit(a, None);
        }
        if let Some(c) = conn {
            // Removed before its calls' ends are handed on: the driver holds them until the
            // device is done with the queue pair (at once, or at a later turn's poll), so the
            // device touches none of the memory those ends give back to the apps.
            self.drv.close(c, CloseReason::Requested, &mut self.mem);
            let _ = self.drv.remove(c);
            let now = Instant::now();
            while let Some((cid, ev)) = self.drv.poll_event() {
                self.on_engine(cid, ev, now);
            }
        }
        let held = std::mem::take(&mut self.waiting);
        for (slot, origin, c) in held {
            if slot as usize == i {
                self.call_failed(origin, c.id, status::TRANSPORT, None);
            } else {
                self.waiting.push_back((slot, origin, c));
            }
        }
        if let Some(p) = peer {
            self.port.set_route(p, id, false);
        }
        peer
    }

    /// Accepts admitted connection request `req` on a new connection of this thread, or
    /// refuses it (no free slot) and gives its admission back. `at`: the listener, when it is
    /// this thread's (for the refusal's report).
    fn answer_request(
        &mut self,
        req: ConnReqId,
        a: Admitted,
        remote: Option<SocketAddr>,
        private_data: PrivateData,
        at: Option<usize>,
        now: Instant,
    ) {
        let peer_pd = CmData::parse(private_data.as_slice());
        let version = self.spec.transport.version;
        let i = match self.open(Role::Server, None, remote, peer_pd, version) {
            Ok(i) => i,
            Err(_) => {
                let _ = self.drv.provider_mut().reject(req, &[]);
                // The listener counts the refusal: `refused` does on its own thread, the hop
                // back to its thread otherwise.
                self.unadmit(a, at.is_none().then_some(Refusal::Full));
                self.refused(at, remote, Refusal::Full, now);
                return;
            }
        };
        self.slots[i].admitted = Some(a);
        let pd = self.local_private();
        let params = self.conn_params(&pd);
        let Some(qp) = self.slots[i].qp else {
            return;
        };
        if let Err(e) = self.drv.provider_mut().accept(req, qp, &params) {
            tracing::debug!(error = %e, ?remote, "accepting a connection request failed");
            self.close_slot(i);
        }
    }

    /// A connection request another thread's listener admitted and handed to this thread.
    fn adopt(&mut self, a: Box<Adoption>, now: Instant) {
        let Adoption {
            request,
            owner,
            index,
            remote,
            private_data,
        } = *a;
        // The promise counted by the listener's thread becomes a connection (or nothing).
        self.port.load(self.port.me(), false);
        let a = Admitted {
            owner,
            index,
            host: host_of(remote),
        };
        let req = match self.drv.provider_mut().take_over(request) {
            Ok(req) => req,
            Err(e) => {
                // Abandoned: the peer's connect fails.
                tracing::debug!(error = %e, "a connection request handed over could not be taken");
                self.unadmit(a, None);
                return;
            }
        };
        if self.draining.is_some() {
            let _ = self.drv.provider_mut().reject(req, &[]);
            self.unadmit(a, Some(Refusal::Draining));
            self.refused(None, remote, Refusal::Draining, now);
            return;
        }
        self.answer_request(req, a, remote, private_data, None, now);
    }

    fn on_cm(&mut self, ev: CmEvent) {
        match ev {
            CmEvent::ConnectRequest {
                listener,
                req,
                private_data,
                remote,
                ..
            } => {
                let now = Instant::now();
                let host = host_of(remote);
                let at = self.listeners.iter().position(|l| l.id == listener);
                let admitted = match at {
                    _ if self.draining.is_some() => Err(Refusal::Draining),
                    // Its listener was closed meanwhile: the daemon is stopping.
                    None => Err(Refusal::Draining),
                    Some(k) => self.listeners[k].gate.admit(host, now).map(|()| k),
                };
                let k = match admitted {
                    Ok(k) => k,
                    Err(why) => {
                        let _ = self.drv.provider_mut().reject(req, &[]);
                        self.refused(at, remote, why, now);
                        return;
                    }
                };
                self.listeners[k].admitted += 1;
                let a = Admitted {
                    owner: self.port.me(),
                    index: self.listeners[k].index,
                    host,
                };
                if self.listeners[k].gate.spec().spread {
                    let to = self.port.least_loaded().unwrap_or(a.owner);
                    tracing::debug!(
                        ?remote,
                        to,
                        loads = ?self.port.loads(),
                        "connection request placed"
                    );
                    if to != a.owner {
                        // Its queue pair, its engine and its traffic go to the thread with
                        // the fewest connections; a provider whose requests cannot move
                        // (the in-memory fabric) keeps it here.
                        if let Ok(request) = self.drv.provider_mut().hand_over(req) {
                            self.port.load(to, true);
                            self.stats.conns_handed_over += 1;
                            let adoption = Adoption {
                                request,
                                owner: a.owner,
                                index: a.index,
                                remote,
                                private_data,
                            };
                            self.hop(to, Hop::Adopt(Box::new(adoption)));
                            return;
                        }
                    }
                }
                self.answer_request(req, a, remote, private_data, Some(k), now);
            }
            CmEvent::Filtered { listener, remote } => {
                let at = self.listeners.iter().position(|l| l.id == listener);
                self.refused(at, remote, Refusal::NotAllowed, Instant::now());
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
                    self.port.set_route(p, conn, true);
                }
                self.emit(Event::Up { conn, peer, remote });
            }
            CmEvent::Rejected { qp, .. } | CmEvent::ConnectError { qp, .. } => {
                let reason = match ev {
                    CmEvent::ConnectError { cause, .. } => Reason::ConnectError(cause),
                    _ => Reason::Rejected,
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
                    // Its counters as they end (the calls it failed on closing included).
                    let stats = &mut self.slots[i].stats;
                    let (remote, last) = (stats.info.remote, stats.info.totals());
                    let latency = std::mem::take(&mut stats.latency);
                    self.emit(Event::Down {
                        conn,
                        peer,
                        remote,
                        reason,
                        last,
                        latency,
                    });
                }
            }
        }
    }

    /// Says what the device reported since it was last looked at (the connections it ended
    /// have their own events; this is the operator's word on why).
    fn note_device_events(&mut self, now: rpcrdma_verbs::DeviceEvents) {
        let was = std::mem::replace(&mut self.stats.device, now);
        let thread = self.stats.index;
        if now.device_fatal > was.device_fatal {
            tracing::error!(
                thread,
                "the RDMA device reported a fatal error: its connections ended, and it serves no more until the daemon restarts"
            );
        }
        if now.cq_errors > was.cq_errors {
            tracing::error!(
                thread,
                "a completion queue of this poll thread failed (an overrun): its connections ended"
            );
        }
        if now.srq_errors > was.srq_errors {
            tracing::error!(
                thread,
                "a shared receive queue of this poll thread failed: its connections ended"
            );
        }
        if now.qp_errors > was.qp_errors {
            tracing::warn!(
                thread,
                failed = now.qp_errors - was.qp_errors,
                "the RDMA device failed queue pairs on its own: their connections ended"
            );
        }
        if now.port_down > was.port_down {
            tracing::warn!(thread, "the RDMA port went down");
        }
        if now.port_up > was.port_up {
            tracing::info!(thread, "the RDMA port is active again");
        }
    }

    /// The chores: connection-manager events, the device's events, commands, app reap,
    /// retired memory, drain; true if anything happened.
    fn housekeeping(&mut self, now: Instant) -> bool {
        let mut work = self.emit_unsent();
        while let Some(ev) = self.drv.provider_mut().poll_cm() {
            self.on_cm(ev);
            work = true;
        }
        let device = self.drv.provider().device_events();
        if device != self.stats.device {
            self.note_device_events(device);
        }
        // Each command rings the doorbell once: its bytes are read when commands were taken
        // (and before parking), not by a system call on every chore.
        if !self.commands.is_empty() {
            self.drain_bell();
            while let Some(cmd) = self.commands.pop() {
                work = true;
                self.on_command(cmd);
            }
        }
        if now.duration_since(self.reaped_at) >= REAP_EVERY {
            self.reaped_at = now;
            let mut gone = self.table.reap();
            gone.extend(self.table.evict_stalled(STALL_LIMIT));
            for d in gone {
                work = true;
                self.on_detached(d);
            }
        }
        // A gone app's memory stays registered (here and on every other thread) while an
        // engine may still touch it.
        let mut k = 0;
        while let Some(&(app, mr)) = self.retired.get(k) {
            if self.app_busy(app) {
                k += 1;
                continue;
            }
            self.retired.swap_remove(k);
            self.hop_others(|| Some(Hop::ArenaGone { app }));
            if let Some(i) = self
                .app_mem
                .iter()
                .position(|m| m.owner == self.port.me() && m.app == app)
            {
                self.app_mem.swap_remove(i);
            }
            self.deregister(mr);
        }
        if let Some(deadline) = self.draining {
            let in_flight = self.in_flight();
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

    /// RPCs this thread has a part in: its apps' calls and served calls, its connections' calls.
    fn in_flight(&self) -> usize {
        self.pending.len() + self.serving.len() + self.calls.len() + self.served.len()
    }

    /// Takes an app the control thread accepted: registers its arena here and on every other
    /// thread (which get a duplicate of its memfd), then attaches its rings.
    fn attach(&mut self, att: Attachment) {
        let pid = att.pid();
        if let Err(reason) = self.try_attach(att) {
            self.emit(Event::AppDetached { pid, reason });
        }
    }

    fn try_attach(&mut self, att: Attachment) -> Result<(), &'static str> {
        let pid = att.pid();
        if self.draining.is_some() {
            return Err("refused: draining");
        }
        // Only the arena is registered: the header and rings are never reachable by a peer.
        let layout = att.region().layout();
        let offset = u64::from(layout.arena_offset);
        let arena_len = att
            .region()
            .len()
            .saturating_sub(layout.arena_offset as usize);
        let reg = Mapped::shared_range(att.region().fd(), offset, arena_len)
            .map_err(|e| e.to_string())
            .and_then(|m| {
                Registered::new(self.drv.provider_mut(), self.pd, m, REGISTERED_ACCESS)
                    .map_err(|e| e.to_string())
            });
        let reg = match reg {
            Ok(reg) => reg,
            Err(err) => {
                // Dropping the attachment closes its socket: the app sees the refusal.
                tracing::warn!(?pid, %err, arena_len, "cannot register an app's arena (RLIMIT_MEMLOCK? see `ulimit -l`)");
                return Err("refused: arena registration failed");
            }
        };
        let mut fds = Vec::with_capacity(self.port.threads());
        for _ in 1..self.port.threads() {
            match att.region().fd().try_clone_to_owned() {
                Ok(fd) => fds.push(fd),
                Err(err) => {
                    tracing::warn!(?pid, %err, "cannot share an app's arena with the other poll threads");
                    let _ = reg.deregister(self.drv.provider_mut());
                    return Err("refused: cannot share the arena");
                }
            }
        }
        let mr = reg.mr();
        match self.table.attach(att) {
            Ok(app) => {
                self.drv.add_region(mr);
                self.mem.insert(reg);
                self.app_mem.push(AppMem {
                    owner: self.port.me(),
                    app,
                    mr: mr.id,
                });
                self.hop_others(|| {
                    fds.pop().map(|fd| Hop::Arena {
                        app,
                        fd,
                        offset,
                        len: arena_len,
                    })
                });
                self.emit(Event::AppAttached { pid });
                Ok(())
            }
            Err(_) => {
                let _ = reg.deregister(self.drv.provider_mut());
                Err("refused: app table full")
            }
        }
    }

    /// Whether an engine (here or on another thread) may still read or write memory of our
    /// app `app` (calls it made, calls whose arguments land in its buffers, its replies).
    fn app_busy(&self, app: AppId) -> bool {
        self.pending.keys().any(|&k| OpId::from_u64(k).app() == app)
            || self.serving.values().any(|s| match s {
                Serving::Receiving { rb, .. } => rb.app() == app,
                Serving::Delivered(op) | Serving::Replying(op) => op.app() == app,
            })
    }

    /// Answers a call being served with SYSTEM_ERR (its serving app went away).
    fn fail_served(&mut self, conn: ConnId, sid: ServeId) {
        let spec = ReplySpec {
            accept_stat: SYSTEM_ERR,
            // No result bytes: an empty range, which names no memory that is read.
            msg: MemRef::default(),
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
        // Its calls in flight end now. Those that lent the peer memory (chunks) keep its
        // arena registered (`app_busy`) until the engine releases them: after their late
        // reply, or when their connection ends.
        for &id in &d.calls {
            self.cancel_call(id, status::CANCELLED);
        }
        // Calls it was serving: their requesters get SYSTEM_ERR. A reply already submitted
        // stays in `serving` until it ends (`ReplyDone`): its RDMA Writes may still be reading
        // the app's arena, which `app_busy` keeps registered meanwhile.
        for tag in d.serving_tags {
            if let Some(Serving::Delivered(_)) = self.serving.get(&tag) {
                self.serving.remove(&tag);
                self.hop(tag_thread(tag), Hop::FailServed { tag });
            }
        }
        self.sync_announced();
        if let Some(k) = self
            .app_mem
            .iter()
            .position(|m| m.owner == self.port.me() && m.app == d.app)
        {
            let mr = self.app_mem[k].mr;
            self.retired.push((d.app, mr));
        }
        self.emit(Event::AppDetached {
            pid: d.pid,
            reason: d.reason,
        });
    }

    fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::Listen { addr, index, admit } => {
                let p = self.drv.provider_mut();
                let result = p
                    .listen(addr)
                    .and_then(|id| {
                        // Where the provider sees addresses first (soft: TCP), refused hosts'
                        // streams are closed at accept, before they hold anything.
                        p.filter_listener(id, admit.accept_filter())?;
                        let a = p.listen_addr(id);
                        self.listeners.push(Listening {
                            id,
                            index,
                            addr: a.as_ref().ok().copied(),
                            gate: Gate::new(admit),
                            admitted: 0,
                            refused: Refused::default(),
                        });
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
            Command::Admit { index, admit } => {
                if let Some(l) = self.listeners.iter_mut().find(|l| l.index == index) {
                    let _ = self
                        .drv
                        .provider_mut()
                        .filter_listener(l.id, admit.accept_filter());
                    l.gate.set_spec(admit);
                }
            }
            Command::CloseListeners => self.close_listeners(),
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
                let params = self.conn_params(&pd);
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
                if let Some(i) = self.local_slot(conn) {
                    if let Some(qp) = self.slots[i].qp {
                        self.slots[i].stats.info.state = ConnState::Closing;
                        let _ = self.drv.provider_mut().disconnect(qp);
                    }
                }
            }
            Command::Attach(att) => self.attach(*att),
            Command::Snapshot(mut snap) => {
                self.fill(&mut snap);
                self.emit(Event::Snapshot(snap));
            }
            Command::SetIdle(idle) => {
                self.spec.idle = idle;
            }
            Command::Drain { deadline } => {
                self.close_listeners();
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
                let c = self.engine_of(conn);
                let b = body.get(..usize::from(len)).unwrap_or(&[]);
                if let Some(c) = c {
                    let _ = self.drv.send_optional(c, xid, opttype, b, &mut self.mem);
                }
            }
            Command::RejectOptional { conn, xid } => {
                if let Some(c) = self.engine_of(conn) {
                    self.drv.reject_optional(c, xid, &mut self.mem);
                }
            }
            Command::ApplyPeer {
                conn,
                rbsiz,
                reqreminv,
            } => {
                if let Some(c) = self.engine_of(conn) {
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
                if let Some(c) = self.engine_of(conn) {
                    let _ = self.drv.configure(c, |c| c.set_own_receive_size(rbsiz));
                }
            }
            Command::CapPeer { conn, rbsiz } => {
                if let Some(c) = self.engine_of(conn) {
                    let _ = self.drv.configure(c, |c| c.set_peer_receive_cap(rbsiz));
                }
            }
            Command::NotifyIdle { conn } => {
                if let Some(s) = self.local_slot(conn).map(|i| &mut self.slots[i]) {
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

    /// The engine connection of global connection id `conn`, if it is on this thread.
    fn engine_of(&self, conn: u32) -> Option<ConnId> {
        self.local_slot(conn).and_then(|i| self.slots[i].conn)
    }

    fn fill(&mut self, snap: &mut Snapshot) {
        let t = self.table.stats();
        self.stats.apps = t.apps;
        self.stats.app_ops = t.ops;
        self.stats.bad_submissions = t.bad_submissions;
        self.stats.regions = self.mem.regions().len();
        self.stats.region_bytes = self.mem.regions().iter().map(|r| r.mr().len).sum();
        self.stats.rpcs_in_flight = self.pending.len() + self.serving.len();
        self.stats.calls_held = self.held_in.len();
        self.stats.calls_waiting_slot = self.waiting.len();
        self.stats.buffers = self.drv.buffer_counts();
        self.stats.completions = self.drv.completions();
        self.stats.drains_overdue = self.drv.drains_overdue();
        self.stats.conns_retiring = self.drv.retiring();
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
        snap.n_listeners = 0;
        for (dst, l) in snap.listeners.iter_mut().zip(&self.listeners) {
            *dst = ListenerStats {
                index: l.index,
                addr: l.addr,
                connections: l.gate.held(),
                admitted: l.admitted,
                refused: l.refused,
            };
            snap.n_listeners += 1;
        }
        snap.n_apps = 0;
        for id in self.table.app_ids() {
            let Some(dst) = snap.apps.get_mut(snap.n_apps) else {
                break;
            };
            if let Some(info) = self.table.app_info(id) {
                *dst = info;
                snap.n_apps += 1;
            }
        }
    }

    fn wait_idle(&mut self, now: Instant) {
        match self.spec.idle {
            IdleSpec::Spin => std::hint::spin_loop(),
            IdleSpec::Backoff {
                spin,
                backoff_max,
                park_after,
            } => {
                self.idle.empty_polls = self.idle.empty_polls.saturating_add(1);
                let since = *self.idle.since.get_or_insert(now);
                let spinning = match spin {
                    SpinLimit::For(t) => now.duration_since(since) < t,
                    SpinLimit::Polls(n) => self.idle.empty_polls < n,
                };
                if spinning {
                    std::hint::spin_loop();
                } else if now.duration_since(since) < park_after {
                    self.idle.pause = (self.idle.pause * 2)
                        .max(Duration::from_micros(1))
                        .min(backoff_max);
                    std::thread::sleep(self.idle.pause);
                } else {
                    self.park();
                }
            }
            IdleSpec::Yield { park_after } => {
                self.idle.empty_polls = self.idle.empty_polls.saturating_add(1);
                let since = *self.idle.since.get_or_insert(now);
                if now.duration_since(since) < park_after {
                    self.stats.yields += 1;
                    std::thread::yield_now();
                } else {
                    self.park();
                }
            }
        }
    }

    /// Reads the doorbell's pending rings (nonblocking).
    fn drain_bell(&mut self) {
        let mut buf = [0u8; 64];
        while matches!(self.port.bell().read(&mut buf), Ok(n) if n > 0) {}
    }

    /// Parks until an app's doorbell, a command, a hop or [`PARK_MAX`] (unless a hop is already waiting).
    fn park(&mut self) {
        // A ring left unread would end the park at once; a command whose ring this read takes
        // is served now, not after the park.
        self.drain_bell();
        // Nothing would wake the thread for work the provider has left for its next poll, nor
        // when another thread makes room for the hops its full queue held back.
        if !self.commands.is_empty()
            || self.drv.provider().busy()
            || self.outbox.iter().any(|o| !o.is_empty())
        {
            return;
        }
        // The provider's event fd (the soft provider's sockets, rdma_cm's channel) wakes a
        // parked thread, but only for what happens after its ready list is emptied: that is
        // done first, and the thread looks at everything once more before it parks.
        if !self.idle.park_armed {
            while let Some(ev) = self.drv.provider_mut().poll_cm() {
                self.on_cm(ev);
            }
            self.idle.park_armed = true;
            return;
        }
        self.idle.park_armed = false;
        if self.port.park() {
            self.stats.parks += 1;
            let bell = self.port.bell().as_fd();
            match self.drv.provider().event_fd() {
                Some(provider) => self.table.park(PARK_MAX, &[bell, provider]),
                None => self.table.park(PARK_MAX, &[bell]),
            }
            self.port.unpark();
        }
    }
}
