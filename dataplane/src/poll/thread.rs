//! The poll loop: provider completions and CM events, app rings, commands, idle policy.

use super::stats::{ConnInfo, ConnState, ConnStats, Snapshot, ThreadStats};
use super::{Command, Event, IdleSpec, PollSpec, Reason};
use crossbeam_queue::ArrayQueue;
use rpcrdma_proto::cm::PrivateData as CmData;
use rpcrdma_shm::abi::status;
use rpcrdma_shm::attach::Listener as AppListener;
use rpcrdma_shm::daemon::{AppId, AppTable, CallOutcome, Detached, OpId, Submission, TableConfig};
use rpcrdma_verbs::{
    CmEvent, ConnParams, CqId, ListenerId, PdId, Provider, QpId, QpInit, WorkCompletion,
};
use std::io::Read;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Completions taken from the CQ per poll.
const WC_BATCH: usize = 32;
/// App submissions taken per poll.
const SUB_BATCH: usize = 32;
/// Loop iterations between housekeeping rounds (app attach and reap, commands).
const HOUSEKEEPING_EVERY: u32 = 1024;
/// Longest park: the provider's sockets cannot wake a parked thread, so it looks again this often.
const PARK_MAX: Duration = Duration::from_millis(2);
/// Apps that leave completions undrained this long are detached.
const STALL_LIMIT: Duration = Duration::from_secs(10);

/// One connection slot.
#[derive(Debug, Default)]
struct Slot {
    qp: Option<QpId>,
    stats: ConnStats,
}

/// A poll thread's state; [`PollThread::run`] is its loop.
pub struct PollThread<P: Provider> {
    spec: PollSpec,
    provider: P,
    commands: Arc<ArrayQueue<Command>>,
    events: Arc<ArrayQueue<Event>>,
    bell: UnixStream,
    notify: Box<dyn Fn() + Send>,
    table: AppTable,
    apps: AppListener,
    subs: Vec<(AppId, Submission)>,
    pd: PdId,
    cq: CqId,
    wcs: [WorkCompletion; WC_BATCH],
    listeners: Vec<ListenerId>,
    slots: Vec<Slot>,
    by_peer: Vec<Option<u32>>,
    stats: ThreadStats,
    idle: IdleState,
    draining: Option<Instant>,
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

impl<P: Provider> PollThread<P> {
    /// Opens the attach socket and the provider's protection domain and completion queue.
    pub fn new(
        spec: PollSpec,
        mut provider: P,
        commands: Arc<ArrayQueue<Command>>,
        events: Arc<ArrayQueue<Event>>,
        bell: UnixStream,
        notify: Box<dyn Fn() + Send>,
    ) -> Result<PollThread<P>, StartError> {
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
            peers: peers.max(1),
            ..TableConfig::default()
        }) {
            Ok(t) => t,
            Err(e) => return Err((format!("app table: {e}"), notify)),
        };
        let depth = spec.max_conns.saturating_mul(4 * (spec.transport.credits + 8)).max(64);
        let (pd, cq) = match provider
            .alloc_pd()
            .and_then(|pd| Ok((pd, provider.create_cq(depth)?)))
        {
            Ok(x) => x,
            Err(e) => return Err((format!("provider: {e}"), notify)),
        };
        let slots = (0..spec.max_conns)
            .map(|id| Slot {
                qp: None,
                stats: ConnStats {
                    info: ConnInfo {
                        id,
                        ..ConnInfo::default()
                    },
                    ..ConnStats::default()
                },
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
            provider,
            commands,
            events,
            bell,
            notify,
            table,
            apps,
            subs: Vec::with_capacity(SUB_BATCH),
            pd,
            cq,
            wcs: [WorkCompletion::default(); WC_BATCH],
            listeners: Vec::new(),
            slots,
            stats,
            idle: IdleState::default(),
            draining: None,
            stop: false,
        })
    }

    /// Runs until [`Command::Stop`].
    pub fn run(&mut self) {
        self.emit(Event::Started);
        let mut loops = 0u32;
        let mut last = Instant::now();
        while !self.stop {
            let mut work = self.poll_once();
            loops = loops.wrapping_add(1);
            if loops % HOUSEKEEPING_EVERY == 0 || self.idle.empty_polls > 0 {
                work |= self.housekeeping();
            }
            let now = Instant::now();
            let spent = u64::try_from(now.duration_since(last).as_nanos()).unwrap_or(u64::MAX);
            last = now;
            if work {
                self.stats.busy_polls += 1;
                self.stats.busy_ns = self.stats.busy_ns.saturating_add(spent);
                self.idle = IdleState::default();
            } else {
                self.stats.idle_polls += 1;
                self.stats.idle_ns = self.stats.idle_ns.saturating_add(spent);
                self.wait_idle(now);
            }
        }
        for i in 0..self.slots.len() {
            if let Some(qp) = self.slots[i].qp.take() {
                let _ = self.provider.disconnect(qp);
                let _ = self.provider.destroy_qp(qp);
            }
        }
    }

    /// One pass over the provider and the apps; true if anything happened.
    fn poll_once(&mut self) -> bool {
        let mut work = false;
        let n = self.provider.poll_cq(self.cq, &mut self.wcs).unwrap_or(0);
        for i in 0..n.min(WC_BATCH) {
            let wc = self.wcs[i];
            self.on_completion(wc);
            work = true;
        }
        while let Some(ev) = self.provider.poll_cm() {
            self.on_cm(ev);
            work = true;
        }
        let mut subs = std::mem::take(&mut self.subs);
        subs.clear();
        self.table.poll_submissions(&mut subs, SUB_BATCH);
        work |= !subs.is_empty();
        for (app, s) in subs.drain(..) {
            self.on_submission(app, s);
        }
        self.subs = subs;
        work
    }

    fn on_completion(&mut self, _wc: WorkCompletion) {}

    fn on_submission(&mut self, _app: AppId, s: Submission) {
        match s {
            Submission::Call(c) => {
                let up = self
                    .by_peer
                    .get(c.peer as usize)
                    .copied()
                    .flatten()
                    .and_then(|id| self.slots.get(id as usize))
                    .is_some_and(|s| s.stats.info.state == ConnState::Up);
                let _ = up;
                self.fail_call(c.id, status::TRANSPORT);
            }
            Submission::Reply(r) => {
                self.table.complete_reply(r.id, status::TRANSPORT);
            }
            Submission::Registered { .. } | Submission::Unregistered { .. } => {}
        }
    }

    fn fail_call(&mut self, id: OpId, code: u32) {
        self.table.complete_call(
            id,
            CallOutcome {
                status: code,
                ..CallOutcome::default()
            },
        );
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
        .emit()
    }

    fn new_qp(&mut self) -> Result<QpId, String> {
        let t = self.spec.transport;
        let depth = (t.credits + t.backchannel_credits) * 4 + 16;
        self.provider
            .create_qp(&QpInit {
                pd: self.pd,
                send_cq: self.cq,
                recv_cq: self.cq,
                srq: None,
                max_send_wr: depth,
                max_recv_wr: t.credits + t.backchannel_credits + 4,
                max_sge: rpcrdma_verbs::MAX_SGE as u32,
            })
            .map_err(|e| format!("create queue pair: {e}"))
    }

    fn open_slot(&mut self, qp: QpId, peer: Option<u32>, remote: Option<SocketAddr>) -> usize {
        let i = self.free_slot().unwrap_or(0);
        let t = self.spec.transport;
        let s = &mut self.slots[i];
        s.qp = Some(qp);
        let id = s.stats.info.id;
        s.stats.info = ConnInfo {
            id,
            state: ConnState::Connecting,
            peer,
            remote,
            client: peer.is_some(),
            inline_send: t.inline_send,
            inline_recv: t.inline_recv,
            credits_offered: t.credits,
            ..ConnInfo::default()
        };
        s.stats.latency.0.reset();
        i
    }

    fn close_slot(&mut self, i: usize) -> Option<u32> {
        let s = self.slots.get_mut(i)?;
        let qp = s.qp.take()?;
        let peer = s.stats.info.peer;
        s.stats.info.state = ConnState::Free;
        let _ = self.provider.destroy_qp(qp);
        if let Some(p) = peer {
            if let Some(b) = self.by_peer.get_mut(p as usize) {
                if *b == Some(s.stats.info.id) {
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
                if self.draining.is_some() || self.free_slot().is_none() {
                    let _ = self.provider.reject(req, &[]);
                    return;
                }
                let qp = match self.new_qp() {
                    Ok(qp) => qp,
                    Err(_) => {
                        let _ = self.provider.reject(req, &[]);
                        return;
                    }
                };
                let i = self.open_slot(qp, None, None);
                self.slots[i].stats.info.peer_private = parse_private(private_data.as_slice());
                let pd = self.local_private();
                let t = self.spec.transport;
                let params = ConnParams {
                    private_data: &pd,
                    responder_resources: t.ird,
                    initiator_depth: t.ord,
                };
                if self.provider.accept(req, qp, &params).is_err() {
                    self.close_slot(i);
                }
            }
            CmEvent::Established { qp, private_data } => {
                let Some(i) = self.slot_of_qp(qp) else {
                    return;
                };
                let s = &mut self.slots[i];
                if s.stats.info.client {
                    s.stats.info.peer_private = parse_private(private_data.as_slice());
                }
                s.stats.info.state = ConnState::Up;
                s.stats.info.version = self.spec.transport.version.min(1).max(1);
                let (conn, peer, remote) = (s.stats.info.id, s.stats.info.peer, s.stats.info.remote);
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
                let was_up = self.slots[i].stats.info.state == ConnState::Up;
                let peer = self.close_slot(i);
                if was_up {
                    self.emit(Event::Down {
                        conn,
                        peer,
                        reason: Reason::Disconnected,
                    });
                } else if let Some(peer) = peer {
                    self.emit(Event::ConnectFailed {
                        peer,
                        reason: Reason::Disconnected,
                    });
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
            if self.draining.is_none() && self.table.attach(att).is_ok() {
                self.emit(Event::AppAttached { pid });
            }
        }
        let mut gone = self.table.reap();
        gone.extend(self.table.evict_stalled(STALL_LIMIT));
        for d in gone {
            work = true;
            self.on_detached(d);
        }
        if let Some(deadline) = self.draining {
            let in_flight = self.table.stats().ops;
            if in_flight == 0 || Instant::now() >= deadline {
                self.draining = None;
                for i in 0..self.slots.len() {
                    if let Some(qp) = self.slots[i].qp {
                        let _ = self.provider.disconnect(qp);
                        self.slots[i].stats.info.state = ConnState::Closing;
                    }
                }
                self.emit(Event::Drained { in_flight });
            }
        }
        work
    }

    fn on_detached(&mut self, d: Detached) {
        self.stats.apps_detached += 1;
        for tag in d.serving_tags {
            let _ = tag;
        }
        self.emit(Event::AppDetached {
            pid: d.pid,
            reason: d.reason,
        });
    }

    fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::Listen { addr } => {
                let result = self
                    .provider
                    .listen(addr)
                    .and_then(|l| {
                        self.listeners.push(l);
                        self.provider.listen_addr(l)
                    })
                    .map_err(|e| match e {
                        rpcrdma_verbs::Error::Io(io) if io.kind() == std::io::ErrorKind::AddrInUse => {
                            format!("address {addr} already in use (another rpcrdmad, or the kernel's NFS/RDMA server?)")
                        }
                        e => e.to_string(),
                    });
                self.emit(Event::Listening { addr, result });
            }
            Command::CloseListeners => {
                for l in self.listeners.drain(..) {
                    let _ = self.provider.close_listener(l);
                }
            }
            Command::Connect { peer, addr } => {
                if self.free_slot().is_none() || self.draining.is_some() {
                    self.emit(Event::ConnectFailed {
                        peer,
                        reason: Reason::Local("no free connection slot".into()),
                    });
                    return;
                }
                let qp = match self.new_qp() {
                    Ok(qp) => qp,
                    Err(e) => {
                        self.emit(Event::ConnectFailed {
                            peer,
                            reason: Reason::Local(e),
                        });
                        return;
                    }
                };
                let i = self.open_slot(qp, Some(peer), Some(addr));
                let pd = self.local_private();
                let t = self.spec.transport;
                let params = ConnParams {
                    private_data: &pd,
                    responder_resources: t.ird,
                    initiator_depth: t.ord,
                };
                if let Err(e) = self.provider.connect(qp, addr, &params) {
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
                    let _ = self.provider.disconnect(qp);
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
                for l in self.listeners.drain(..) {
                    let _ = self.provider.close_listener(l);
                }
                self.draining = Some(deadline);
            }
            Command::Stop => self.stop = true,
        }
    }

    fn fill(&mut self, snap: &mut Snapshot) {
        let t = self.table.stats();
        self.stats.apps = t.apps;
        self.stats.app_ops = t.ops;
        self.stats.bad_submissions = t.bad_submissions;
        snap.thread = self.stats;
        snap.n = 0;
        for s in &self.slots {
            if s.qp.is_none() {
                continue;
            }
            let Some(dst) = snap.conns.get_mut(snap.n) else {
                break;
            };
            dst.info = s.stats.info;
            dst.latency.copy_from(&s.stats.latency);
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
                    self.table.park(PARK_MAX.min(park_after.max(Duration::from_micros(100))), &fds);
                }
            }
        }
    }
}

fn parse_private(b: &[u8]) -> Option<(u32, u32, bool)> {
    CmData::parse(b).map(|p| (p.send_size, p.recv_size, p.remote_invalidate))
}

