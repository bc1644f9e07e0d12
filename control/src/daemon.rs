//! The control thread: a `mio` loop over the admin socket, the metrics listener, signals and
//! the poll threads' event queues; the connection manager (peers, backoff) and reload.

use crate::admin::{self, ConnCounters, ConnView, LatencyRow, PeerStatus, Request, Response};
use crate::clients::{self, Clients, Input, Kind};
use crate::reload;
use crate::startup::{self, StartError};
use crate::xchar::{Action, ConnXchar, Policy, Value};
use mio::net::{TcpListener, UnixListener};
use mio::{Events, Interest, Poll, Token, Waker};
use rpcrdma_config::{Config, IdlePolicy, LogLevel, ProviderKind};
use rpcrdma_dataplane::poll::{
    self, Command, ConnInfo, ConnState, Event, IdleSpec, PollHandle, PollSpec, Snapshot, SpinLimit,
};
use rpcrdma_shm::attach::Attachment;
use rpcrdma_shm::region::PeerInfo;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook_mio::v1_0::Signals;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, error, info, warn};

const ADMIN: Token = Token(0);
const METRICS: Token = Token(1);
const SIGNALS: Token = Token(2);
const WAKER: Token = Token(3);
/// The app attach socket (admin and metrics clients' tokens start at `clients::FIRST_TOKEN`).
const APPS: Token = Token(4);

/// How long start-up waits for the poll thread and its listeners.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request waits for the poll threads' snapshots.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(1);

/// Settings of a daemon run that do not come from the config file.
pub struct Options {
    /// The config file (re-read on reload).
    pub config_path: PathBuf,
    /// How long SIGTERM waits for RPCs in flight.
    pub drain_timeout: Duration,
    /// Applies a new log level (reload).
    pub set_log_level: Box<dyn Fn(LogLevel) + Send>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("config_path", &self.config_path)
            .field("drain_timeout", &self.drain_timeout)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
enum PeerPhase {
    Connecting,
    Up(u32),
    Backoff(Instant),
    Stopped,
}

#[derive(Debug)]
struct PeerState {
    name: String,
    address: String,
    addr: Option<SocketAddr>,
    initial: Duration,
    max: Duration,
    delay: Duration,
    failures: u32,
    /// Why the last attempt failed or the last connection ended (cleared once up).
    last_error: Option<String>,
    phase: PeerPhase,
    /// The peer never answered our first version-two call: it is spoken to in version 1
    /// until the daemon restarts or the operator clears it (`rpcrdmactl peer retry-v2`;
    /// AMB-33, V2-5.2-b).
    v1_only: bool,
    /// The poll thread that connects to it.
    thread: usize,
}

/// The running daemon's control-thread state.
pub struct Daemon {
    cfg: Config,
    opts: Options,
    poll: Poll,
    admin: UnixListener,
    admin_path: PathBuf,
    metrics: Option<TcpListener>,
    signals: Signals,
    /// Accepts apps; each goes to the poll thread with the fewest apps.
    apps: rpcrdma_shm::attach::Listener,
    threads: Vec<PollHandle>,
    /// Per poll thread, commands that found its queue full, sent in order as it drains (a
    /// daemon with more peers than the queue holds sends that many connects at start-up).
    backlog: Vec<VecDeque<Command>>,
    /// Apps attached to each poll thread (from its events).
    apps_on: Vec<usize>,
    /// Apps that found `apps.max-apps` reached, waiting (until the instant) for a slot.
    held_apps: VecDeque<(Attachment, Instant)>,
    /// Routes global connection ids to their poll thread.
    mesh: poll::Mesh,
    latest: Vec<Snapshot>,
    pending_snaps: usize,
    max_conns: usize,
    listeners: Vec<SocketAddr>,
    peers: Vec<PeerState>,
    /// Peer name (or remote address) of each connection, by global connection id.
    remote_of: HashMap<u32, String>,
    /// Per-peer counters across connections, for `/metrics`.
    ledger: crate::metrics::PeerLedger,
    started: Instant,
    draining: Option<Instant>,
    drained: usize,
    failed: Option<String>,
    apps_attached: u64,
    xchar: HashMap<u32, ConnXchar>,
    /// `rpcrdmactl xchar request`s waiting for the peer's RESPXCH: answered from the control
    /// loop when it arrives or the deadline passes, so the loop never blocks on a peer.
    awaiting: Vec<AwaitingRespxch>,
    /// Our XCHAR_REQREMINV: what the poll thread offers (configuration and device).
    remote_invalidation: bool,
    /// Admin and metrics clients, non-blocking (`clients.rs`).
    clients: Clients,
    /// Requests waiting for fresh snapshots from every poll thread.
    parked: Vec<Parked>,
    /// The snapshot round in flight: its number and deadline.
    snap_round: Option<(u64, Instant)>,
    /// Snapshot rounds started so far.
    snap_rounds: u64,
}

/// A request answered once snapshot round `round` is complete.
struct Parked {
    client: Token,
    round: u64,
    job: Job,
}

/// What a parked request needs.
enum Job {
    Admin(Request),
    Metrics,
}

/// An admin client waiting for the RESPXCH to its REQXCH.
struct AwaitingRespxch {
    client: Token,
    conn: u32,
    xid: u32,
    deadline: Instant,
}

/// How long an app that finds `apps.max-apps` reached waits for a slot before it is refused.
/// An app that closed without saying so on its ring is noticed by its poll thread within about a
/// millisecond; until then it still counts, and the app that replaces it must not be refused
/// for it.
const ATTACH_HOLD: Duration = Duration::from_millis(200);
/// How soon the control loop tries again to send commands that found a poll thread's queue
/// full.
const BACKLOG_RETRY: Duration = Duration::from_millis(1);
/// Apps held so at most; more are refused at once.
const MAX_HELD_APPS: usize = 16;

/// How long `xchar request` waits for the peer's RESPXCH.
const RESPXCH_WAIT: Duration = Duration::from_secs(3);

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("admin", &self.admin_path)
            .field("listeners", &self.listeners)
            .finish_non_exhaustive()
    }
}

/// A listener's admission rules as its poll thread applies them; `None` if an `allow` entry
/// does not parse (the checker refuses such a file; dropping the entry would widen the list).
fn admit_spec(l: &rpcrdma_config::Listener) -> Option<poll::AdmitSpec> {
    Some(poll::AdmitSpec {
        allow: l
            .allow
            .iter()
            .map(|a| rpcrdma_config::parse_network(a))
            .collect::<Option<_>>()?,
        per_host: l.max_connections_per_host,
        rate: l.connect_rate_per_host,
        spread: l.spread,
    })
}

fn idle_spec(cfg: &Config) -> IdleSpec {
    let i = &cfg.cpu.idle;
    match i.policy {
        IdlePolicy::Spin => IdleSpec::Spin,
        IdlePolicy::Backoff => IdleSpec::Backoff {
            spin: match i.spin_polls {
                Some(n) => SpinLimit::Polls(n),
                None => SpinLimit::For(Duration::from_micros(u64::from(i.spin_us))),
            },
            backoff_max: Duration::from_micros(u64::from(i.backoff_max_us)),
            park_after: Duration::from_micros(u64::from(i.park_after_us)),
        },
        IdlePolicy::Yield => IdleSpec::Yield {
            park_after: Duration::from_micros(u64::from(i.park_after_us)),
        },
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StartError {
    let what = what.into();
    move |source| StartError::Io { what, source }
}

/// Starts one poll thread on the configured provider.
fn spawn_poll(
    cfg: &Config,
    spec: PollSpec,
    port: poll::Port,
    waker: Arc<Waker>,
) -> Result<PollHandle, StartError> {
    let s = &cfg.provider.soft;
    let notify: Box<dyn Fn() + Send> = Box::new(move || {
        let _ = waker.wake();
    });
    let soft = |fpdu_size| rpcrdma_verbs::soft::SoftConfig {
        crc: s.crc,
        mpa_revision: u8::try_from(s.mpa_revision).unwrap_or(2),
        fpdu_size,
        max_pending: s.max_pending as usize,
        ..rpcrdma_verbs::soft::SoftConfig::default()
    };
    match cfg.provider.kind {
        ProviderKind::Soft => {
            poll::spawn_soft(spec, port, soft(Some(s.fpdu_size as usize)), notify)
        }
        ProviderKind::Mem => poll::spawn_mem(spec, port, soft(None), notify),
        #[cfg(feature = "ibv")]
        ProviderKind::Ibv => {
            let i = &cfg.provider.ibv;
            poll::spawn_ibv(
                spec,
                port,
                rpcrdma_verbs::ibv::IbvConfig {
                    device: i.device.clone(),
                    port: u8::try_from(i.port).unwrap_or(1),
                    gid_index: i.gid_index,
                    exposure: match i.exposure {
                        rpcrdma_config::IbvExposure::Auto => rpcrdma_verbs::ibv::Exposure::Auto,
                        rpcrdma_config::IbvExposure::MemoryWindow => {
                            rpcrdma_verbs::ibv::Exposure::MemoryWindow
                        }
                        rpcrdma_config::IbvExposure::Region => {
                            rpcrdma_verbs::ibv::Exposure::RegionPerExposure
                        }
                    },
                    ..rpcrdma_verbs::ibv::IbvConfig::default()
                },
                notify,
            )
        }
        #[cfg(not(feature = "ibv"))]
        ProviderKind::Ibv => return Err(StartError::NotBuilt(String::new())),
    }
    .map_err(io_err("spawn poll thread"))
}

impl Daemon {
    /// Checks the host, binds every socket, starts the poll threads, opens listeners and
    /// starts connecting to peers.
    pub fn start(cfg: Config, opts: Options) -> Result<Daemon, StartError> {
        startup::check_provider(&cfg)?;
        if let Some(core) = cfg.cpu.control_core {
            if !core_affinity::set_for_current(core_affinity::CoreId { id: core as usize }) {
                return Err(StartError::PollThread(format!(
                    "cannot pin the control thread to core {core} (not in this process's CPU set?)"
                )));
            }
        }
        let app_path = PathBuf::from(&cfg.daemon.app_socket);
        startup::free_socket_path(&app_path, "app")?;
        let admin_path = PathBuf::from(&cfg.daemon.admin_socket);
        let admin_std = startup::bind_admin(&admin_path)?;
        let mut admin = UnixListener::from_std(admin_std);
        let mut metrics = match &cfg.daemon.metrics_listen {
            Some(a) => {
                let addr = rpcrdma_config::parse_address(a).ok_or_else(|| StartError::Io {
                    what: format!("metrics address {a}"),
                    source: std::io::ErrorKind::InvalidInput.into(),
                })?;
                let l = std::net::TcpListener::bind(addr).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::AddrInUse {
                        StartError::Io {
                            what: format!("metrics address {addr} is already in use (another rpcrdmad? set daemon.metrics-listen)"),
                            source: e,
                        }
                    } else {
                        StartError::Io {
                            what: format!("bind metrics {addr}"),
                            source: e,
                        }
                    }
                })?;
                l.set_nonblocking(true).map_err(io_err("metrics"))?;
                Some(TcpListener::from_std(l))
            }
            None => None,
        };
        let poll = Poll::new().map_err(io_err("epoll"))?;
        let reg = poll.registry();
        reg.register(&mut admin, ADMIN, Interest::READABLE)
            .map_err(io_err("register admin"))?;
        if let Some(m) = metrics.as_mut() {
            reg.register(m, METRICS, Interest::READABLE)
                .map_err(io_err("register metrics"))?;
        }
        let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP]).map_err(io_err("signals"))?;
        reg.register(&mut signals, SIGNALS, Interest::READABLE)
            .map_err(io_err("register signals"))?;
        let waker = Arc::new(Waker::new(reg, WAKER).map_err(io_err("waker"))?);

        let max_conns = cfg.pools.connections.max(1);
        let cores: Vec<Option<usize>> = if cfg.cpu.poll_cores.is_empty() {
            vec![None]
        } else {
            cfg.cpu
                .poll_cores
                .iter()
                .map(|&c| Some(c as usize))
                .collect()
        };
        let mut mesh = poll::Mesh::new(cores.len(), max_conns, cfg.peers.len(), 4096)
            .map_err(io_err("poll thread queues"))?;
        let geometry = rpcrdma_shm::abi::Geometry {
            sq_entries: cfg.apps.sq_entries,
            cq_entries: cfg.apps.cq_entries,
            arena_size: u32::try_from(cfg.apps.arena_size).unwrap_or(u32::MAX),
            peers: 0,
        };
        let peer_names: Vec<String> = cfg.peers.iter().map(|p| p.name.clone()).collect();
        // Every peer's replies arrive in receive buffers of `inline-recv`: a reply buffer that
        // fits there needs no Reply chunk, so apps size their default to it.
        let t = &cfg.transport;
        let reply_inline = rpcrdma_dataplane::reply_inline_room(t.inline_recv, t.version);
        let table = peer_names
            .iter()
            .map(|name| PeerInfo {
                name: name.clone(),
                reply_inline,
            })
            .collect();
        let apps = rpcrdma_shm::attach::Listener::bind(&app_path, geometry, table)
            .map_err(io_err(format!("app socket {}", app_path.display())))?;
        reg.register(
            &mut mio::unix::SourceFd(&std::os::fd::AsRawFd::as_raw_fd(&apps.as_fd())),
            APPS,
            Interest::READABLE,
        )
        .map_err(io_err("register app socket"))?;
        let base = PollSpec {
            index: 0,
            core: None,
            idle: idle_spec(&cfg),
            transport: crate::startup::transport_spec(&cfg),
            max_conns,
            pools: crate::startup::pool_spec(&cfg),
            max_apps: u16::try_from(cfg.apps.max_apps).unwrap_or(u16::MAX),
            geometry,
            peers: peer_names,
            queue_depth: 256,
        };
        let mut threads = Vec::with_capacity(cores.len());
        for (index, core) in cores.into_iter().enumerate() {
            let spec = PollSpec {
                index,
                core,
                ..base.clone()
            };
            let port = mesh
                .port(index)
                .ok_or_else(|| StartError::PollThread("poll thread queues".into()))?;
            threads.push(spawn_poll(&cfg, spec, port, waker.clone())?);
        }
        let threads_n = threads.len();
        let n_listeners = cfg.listeners.len();
        let mem = cfg.provider.kind == ProviderKind::Mem;
        let peers = cfg
            .peers
            .iter()
            .enumerate()
            .map(|(i, p)| PeerState {
                name: p.name.clone(),
                address: p.address.clone(),
                addr: rpcrdma_config::parse_address(&p.address),
                initial: Duration::from_millis(u64::from(p.reconnect_initial_ms)),
                max: Duration::from_millis(u64::from(p.reconnect_max_ms)),
                delay: Duration::from_millis(u64::from(p.reconnect_initial_ms)),
                failures: 0,
                phase: PeerPhase::Stopped,
                v1_only: false,
                last_error: None,
                // Peers after the listeners, round robin; the in-memory provider's fabric is
                // its thread's alone, so there everything stays on thread 0.
                thread: if mem {
                    0
                } else {
                    (n_listeners + i) % threads_n
                },
            })
            .collect();
        let mut d = Daemon {
            cfg,
            opts,
            poll,
            admin,
            admin_path,
            metrics,
            signals,
            apps_on: vec![0; threads_n],
            backlog: (0..threads_n).map(|_| VecDeque::new()).collect(),
            held_apps: VecDeque::new(),
            apps,
            latest: (0..threads_n)
                .map(|_| Snapshot::with_capacity(max_conns as usize))
                .collect(),
            threads,
            mesh,
            pending_snaps: 0,
            awaiting: Vec::new(),
            remote_invalidation: true,
            clients: Clients::default(),
            parked: Vec::new(),
            snap_round: None,
            snap_rounds: 0,
            max_conns: max_conns as usize,
            listeners: Vec::new(),
            peers,
            remote_of: HashMap::new(),
            ledger: crate::metrics::PeerLedger::default(),
            started: Instant::now(),
            draining: None,
            drained: 0,
            failed: None,
            apps_attached: 0,
            xchar: HashMap::new(),
        };
        d.await_start()?;
        Ok(d)
    }

    /// Sends `cmd` to poll thread `t`: at once, or after the commands already waiting for
    /// room in its queue ([`flush_backlog`](Self::flush_backlog)); never dropped.
    fn send_to(&mut self, t: usize, cmd: Command) {
        let (Some(h), Some(wait)) = (self.threads.get(t), self.backlog.get_mut(t)) else {
            return;
        };
        if !wait.is_empty() {
            wait.push_back(cmd);
            return;
        }
        if let Err(cmd) = h.send(cmd) {
            debug!(
                thread = t,
                "poll thread command queue full; the command waits"
            );
            wait.push_back(cmd);
        }
    }

    /// Sends what waits for room in the poll threads' command queues, in order.
    fn flush_backlog(&mut self) {
        for (h, wait) in self.threads.iter().zip(self.backlog.iter_mut()) {
            while let Some(cmd) = wait.pop_front() {
                if let Err(cmd) = h.send(cmd) {
                    wait.push_front(cmd);
                    break;
                }
            }
        }
    }

    /// Sends a command about connection `conn` to the poll thread owning it.
    fn send(&mut self, conn: u32, cmd: Command) {
        self.send_to(self.mesh.thread_of(conn), cmd);
    }

    /// Waits for every poll thread to start and every listener to bind.
    fn await_start(&mut self) -> Result<(), StartError> {
        let deadline = Instant::now() + START_TIMEOUT;
        for t in 0..self.threads.len() {
            loop {
                match self.threads[t].recv() {
                    Some(Event::Started {
                        remote_invalidation,
                    }) => {
                        self.remote_invalidation &= remote_invalidation;
                        break;
                    }
                    Some(Event::Failed(e)) => {
                        return Err(StartError::PollThread(format!("poll thread {t}: {e}")))
                    }
                    Some(other) => self.on_event(t, other),
                    None if Instant::now() > deadline => {
                        return Err(StartError::PollThread(format!(
                            "poll thread {t} did not start"
                        )))
                    }
                    None if self.threads[t].is_finished() => {
                        return Err(StartError::PollThread(format!("poll thread {t} exited")))
                    }
                    None => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        }
        let addrs: Vec<(String, Option<SocketAddr>, Option<poll::AdmitSpec>)> = self
            .cfg
            .listeners
            .iter()
            .map(|l| {
                let addr = rpcrdma_config::parse_address(&l.address);
                (l.address.clone(), addr, admit_spec(l))
            })
            .collect();
        for (k, (text, addr, admit)) in addrs.into_iter().enumerate() {
            let (Some(addr), Some(admit)) = (addr, admit) else {
                return Err(StartError::PollThread(format!(
                    "bad listener {text}: its address or allow list does not parse"
                )));
            };
            let t = self.listener_thread(k);
            self.send_to(
                t,
                Command::Listen {
                    addr,
                    index: k,
                    admit,
                },
            );
            loop {
                match self.threads[t].recv() {
                    Some(Event::Listening { result: Ok(a), .. }) => {
                        info!(address = %a, thread = t, "listening");
                        self.listeners.push(a);
                        break;
                    }
                    Some(Event::Listening { result: Err(e), .. }) => {
                        return Err(StartError::PollThread(format!("listener {addr}: {e}")))
                    }
                    Some(Event::Failed(e)) => {
                        return Err(StartError::PollThread(format!("poll thread {t}: {e}")))
                    }
                    Some(other) => self.on_event(t, other),
                    None if Instant::now() > deadline => {
                        return Err(StartError::PollThread(format!(
                            "listener {addr}: no answer"
                        )))
                    }
                    None => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        }
        for i in 0..self.peers.len() {
            self.connect_peer(i);
        }
        info!(
            admin = %self.admin_path.display(),
            app = %self.cfg.daemon.app_socket,
            metrics = ?self.cfg.daemon.metrics_listen,
            poll_threads = self.threads.len(),
            "rpcrdmad started"
        );
        Ok(())
    }

    /// Bound listener addresses (port 0 in the config becomes the real port).
    pub fn listeners(&self) -> &[SocketAddr] {
        &self.listeners
    }

    fn connect_peer(&mut self, i: usize) {
        let Some(p) = self.peers.get_mut(i) else {
            return;
        };
        let Some(addr) = p.addr else {
            p.phase = PeerPhase::Stopped;
            return;
        };
        p.phase = PeerPhase::Connecting;
        let version = if p.v1_only {
            1
        } else {
            self.cfg.transport.version
        };
        debug!(peer = %p.name, %addr, version, "connecting");
        let peer = i as u32;
        let t = p.thread;
        self.send_to(
            t,
            Command::Connect {
                peer,
                addr,
                version,
            },
        );
    }

    /// Forgets that peer `name` is version-1-only (AMB-33): its next connection offers
    /// version 2 again, and an up connection is closed so that the next one comes now (the
    /// calls in flight on it end with a transport error). A connection being set up keeps
    /// the version it offered.
    fn retry_v2(&mut self, name: &str) -> Response {
        if self.cfg.transport.version != 2 {
            return Response::err(
                "transport.version is 1: no peer is offered version 2".to_string(),
            );
        }
        let Some(p) = self.peers.iter_mut().find(|p| p.name == name) else {
            return Response::err(format!("no peer {name:?} (rpcrdmactl status lists them)"));
        };
        let was = std::mem::take(&mut p.v1_only);
        let closing = match p.phase {
            PeerPhase::Up(conn) if was => Some(conn),
            _ => None,
        };
        if was {
            info!(peer = %p.name, conn = ?closing, "version-1-only mark cleared by the operator: the next connection offers version 2");
        }
        if let Some(conn) = closing {
            self.send(conn, Command::Close { conn });
        }
        Response::ok(serde_json::json!({
            "peer": name,
            "was-v1-only": was,
            "closing": closing,
        }))
    }

    fn peer_failed(&mut self, i: usize, why: &str) {
        let draining = self.draining.is_some();
        let Some(p) = self.peers.get_mut(i) else {
            return;
        };
        if draining {
            p.phase = PeerPhase::Stopped;
            return;
        }
        p.failures = p.failures.saturating_add(1);
        if p.last_error.as_deref() != Some(why) {
            p.last_error = Some(why.to_owned());
        }
        let delay = p.delay;
        p.phase = PeerPhase::Backoff(Instant::now() + delay);
        p.delay = (p.delay * 2).min(p.max).max(p.initial);
        if p.failures == 1 || p.failures.is_power_of_two() {
            warn!(peer = %p.name, address = %p.address, failures = p.failures, retry_in_ms = delay.as_millis() as u64, "{why}");
        }
    }

    fn on_event(&mut self, thread: usize, ev: Event) {
        match ev {
            Event::Started { .. } => {}
            Event::Listening { .. } => {}
            Event::Up { conn, peer, remote } => {
                let name = match peer.and_then(|p| self.peers.get_mut(p as usize)) {
                    Some(p) => {
                        p.phase = PeerPhase::Up(conn);
                        p.failures = 0;
                        p.last_error = None;
                        p.delay = p.initial;
                        p.name.clone()
                    }
                    None => remote.map(|r| r.to_string()).unwrap_or_else(|| "-".into()),
                };
                info!(conn, peer = %name, thread, "connection up");
                self.remote_of.insert(conn, name);
                let key = self.peer_key(peer, remote);
                self.ledger.opened(&key);
                let v1_only = peer
                    .and_then(|p| self.peers.get(p as usize))
                    .is_some_and(|p| p.v1_only);
                if self.cfg.transport.version == 2 && !v1_only {
                    let t = &self.cfg.transport;
                    let policy = Policy {
                        rbsiz: t.inline_recv,
                        buffer_size: t.inline_recv.max(self.cfg.pools.recv_buffer_size),
                        min_rbsiz: t.xcharext.min_rbsiz,
                        max_rbsiz: t.xcharext.max_rbsiz,
                        reqreminv: self.remote_invalidation,
                        reqreminv_may_change: t.xcharext.reqreminv_may_change,
                    };
                    self.xchar
                        .insert(conn, ConnXchar::new(policy, peer.is_some()));
                }
            }
            Event::ConnectFailed { peer, reason } => {
                self.peer_failed(peer as usize, &format!("connect failed: {reason}"));
            }
            Event::Refused {
                listener,
                remote,
                reason,
                unreported,
            } => {
                let at =
                    |a: Option<SocketAddr>| a.map_or_else(|| "-".to_string(), |a| a.to_string());
                warn!(
                    listener = %at(listener),
                    remote = %at(remote),
                    reason = reason.label(),
                    also_refused = unreported,
                    thread,
                    "connection refused: {reason}"
                );
            }
            Event::Down {
                conn,
                peer,
                remote,
                reason,
                last,
                latency,
            } => {
                let name = self.remote_of.remove(&conn).unwrap_or_default();
                let key = self.peer_key(peer, remote);
                self.ledger.ended(thread, conn, &key, last, &latency);
                self.xchar.remove(&conn);
                info!(conn, peer = %name, %reason, "connection down");
                match (peer, reason) {
                    (Some(p), poll::Reason::NoAnswer) if self.draining.is_none() => {
                        // AMB-33: a deployed v1 server drops version-two messages silently.
                        // Reconnect at once, speaking version 1 to this peer from now on.
                        if let Some(ps) = self.peers.get_mut(p as usize) {
                            ps.v1_only = true;
                            warn!(
                                peer = %ps.name,
                                timeout_ms = self.cfg.transport.v2_first_message_timeout_ms,
                                "no answer to version 2: reconnecting with version 1 (AMB-33)"
                            );
                        }
                        self.connect_peer(p as usize);
                    }
                    (Some(p), reason) => {
                        self.peer_failed(p as usize, &format!("connection lost: {reason}"))
                    }
                    (None, _) => {}
                }
            }
            Event::AppAttached { pid } => {
                self.apps_attached += 1;
                info!(?pid, thread, "app attached");
            }
            Event::AppDetached { pid, reason } => {
                if let Some(n) = self.apps_on.get_mut(thread) {
                    *n = n.saturating_sub(1);
                }
                info!(?pid, thread, reason, "app detached");
            }
            Event::Snapshot(s) => {
                if let Some(slot) = self.latest.get_mut(thread) {
                    *slot = *s;
                }
                self.ledger.snapshot_arrived(thread);
                self.pending_snaps = self.pending_snaps.saturating_sub(1);
            }
            Event::Drained { in_flight } => {
                if in_flight > 0 {
                    warn!(in_flight, "drain deadline passed with RPCs in flight");
                } else {
                    info!("drained");
                }
                self.drained += 1;
            }
            Event::V2Confirmed { conn } => {
                if let Some(x) = self.xchar.get_mut(&conn) {
                    if !x.view().initxch_sent {
                        let a = x.initxch();
                        debug!(conn, "version two confirmed: sending INITXCH");
                        self.act(conn, 0, a);
                    }
                }
            }
            Event::Optional {
                conn,
                xid,
                opttype,
                len,
                body,
                busy,
            } => {
                let b = body.get(..usize::from(len)).unwrap_or(&[]);
                let acts = match self.xchar.get_mut(&conn) {
                    Some(x) => x.on_message(xid, opttype, b, busy),
                    None => vec![Action::Reject],
                };
                debug!(
                    conn,
                    xid,
                    opttype = rpcrdma_proto::xchar::opttype_name(opttype),
                    ?acts,
                    "xcharext message"
                );
                self.act(conn, xid, acts);
            }
            Event::Idle { conn } => {
                let acts = self
                    .xchar
                    .get_mut(&conn)
                    .map(ConnXchar::on_idle)
                    .unwrap_or_default();
                self.act(conn, 0, acts);
            }
            Event::Failed(e) => {
                error!(error = %e, "poll thread failed");
                self.failed = Some(e);
            }
        }
    }

    /// Carries out xcharext actions on connection `conn` (`xid`: the message they answer).
    fn act(&mut self, conn: u32, xid: u32, acts: Vec<Action>) {
        for a in acts {
            let cmd = match a {
                Action::Send { xid, opttype, body } => {
                    let mut b = Box::new([0u8; poll::MAX_OPTINFO]);
                    let Some(dst) = b.get_mut(..body.len()) else {
                        warn!(conn, "xcharext message too large; not sent");
                        continue;
                    };
                    dst.copy_from_slice(&body);
                    Command::SendOptional {
                        conn,
                        xid,
                        opttype,
                        len: body.len() as u16,
                        body: b,
                    }
                }
                Action::PeerRbsiz(r) => Command::ApplyPeer {
                    conn,
                    rbsiz: Some(r),
                    reqreminv: None,
                },
                Action::OwnRbsiz(rbsiz) => Command::ApplyOwn { conn, rbsiz },
                Action::PeerRbsizCap(rbsiz) => Command::CapPeer { conn, rbsiz },
                Action::PeerReqRemInv(v) => Command::ApplyPeer {
                    conn,
                    rbsiz: None,
                    reqreminv: Some(v),
                },
                Action::Reject => Command::RejectOptional { conn, xid },
                Action::NotifyWhenIdle => Command::NotifyIdle { conn },
            };
            self.send(conn, cmd);
        }
    }

    /// The values of an `xchar` command and the connection's characteristics.
    fn xchar_target(
        &mut self,
        conn: u32,
        set: &[String],
    ) -> Result<(Vec<Value>, &mut ConnXchar), Response> {
        let vals: Result<Vec<Value>, String> = set.iter().map(|s| Value::parse(s)).collect();
        let vals = match vals {
            Ok(v) if !v.is_empty() => v,
            Ok(_) => return Err(Response::err("nothing to change")),
            Err(e) => return Err(Response::err(e)),
        };
        match self.xchar.get_mut(&conn) {
            Some(x) => Ok((vals, x)),
            None => Err(Response::err(format!(
                "connection {conn} does not speak version two (transport.version = 2 on both sides)"
            ))),
        }
    }

    /// `rpcrdmactl xchar set`: changes our characteristics and tells the peer (UPDXCH).
    fn xchar_set(&mut self, conn: u32, set: &[String]) -> Response {
        let (vals, x) = match self.xchar_target(conn, set) {
            Ok(t) => t,
            Err(r) => return r,
        };
        let mut acts = Vec::new();
        for v in vals {
            match x.set(v) {
                Ok(a) => acts.extend(a),
                Err(e) => return Response::err(e),
            }
        }
        let view = x.view().clone();
        self.act(conn, 0, acts);
        Response::ok(view)
    }

    /// `rpcrdmactl xchar request`: sends a REQXCH; its XID (the admin loop answers the client
    /// when the RESPXCH arrives), or the error to answer at once.
    fn send_reqxch(&mut self, conn: u32, set: &[String]) -> Result<u32, Response> {
        let (vals, x) = self.xchar_target(conn, set)?;
        let (xid, a) = x.request(vals);
        self.act(conn, 0, a);
        Ok(xid)
    }

    fn drain_events(&mut self) {
        for t in 0..self.threads.len() {
            while let Some(ev) = self.threads[t].recv() {
                self.on_event(t, ev);
            }
        }
    }

    /// Parks client `t`'s request until a snapshot round that started after it completes.
    fn park(&mut self, t: Token, job: Job) {
        let round = match self.snap_round {
            // The round in flight asked before this request came: wait for the next one.
            Some(_) => self.snap_rounds + 1,
            None => {
                self.start_snapshot_round();
                self.snap_rounds
            }
        };
        self.parked.push(Parked {
            client: t,
            round,
            job,
        });
    }

    /// Asks every poll thread for a fresh snapshot (`Event::Snapshot` brings it back).
    fn start_snapshot_round(&mut self) {
        self.snap_rounds += 1;
        self.pending_snaps = 0;
        for t in 0..self.threads.len() {
            let buf = Box::new(
                Snapshot::with_capacity(self.max_conns)
                    .with_apps(self.cfg.apps.max_apps as usize)
                    .with_listeners(self.cfg.listeners.len()),
            );
            // Behind the commands waiting for room, if any: the round waits for it (at most
            // SNAPSHOT_WAIT) rather than answering without this thread.
            self.send_to(t, Command::Snapshot(buf));
            self.pending_snaps += 1;
        }
        self.snap_round = Some((self.snap_rounds, Instant::now() + SNAPSHOT_WAIT));
    }

    /// Once every poll thread's snapshot of the round in flight has arrived (or the wait
    /// passed), answers the requests parked for it, and starts the next round if others wait.
    fn serve_parked(&mut self) {
        let Some((round, deadline)) = self.snap_round else {
            return;
        };
        if self.pending_snaps > 0 && Instant::now() < deadline {
            return;
        }
        if self.pending_snaps > 0 {
            debug!(
                missing = self.pending_snaps,
                "snapshots late: answering from older ones"
            );
        }
        self.snap_round = None;
        self.pending_snaps = 0;
        let (ready, later): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| p.round <= round);
        self.parked = later;
        for p in ready {
            match p.job {
                Job::Admin(req) => {
                    let r = self.handle(req);
                    self.answer(p.client, &r);
                }
                Job::Metrics => {
                    let body = self.render_metrics();
                    let r =
                        clients::http_response("200 OK", Some("text/plain; version=0.0.4"), &body);
                    self.clients.respond(self.poll.registry(), p.client, r);
                }
            }
        }
        if !self.parked.is_empty() {
            self.start_snapshot_round();
        }
    }

    /// Runs the control loop until drained (SIGTERM/SIGINT) or a poll thread fails.
    pub fn run(mut self) -> Result<(), StartError> {
        let mut events = Events::with_capacity(64);
        loop {
            let timeout = self.next_timeout();
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(StartError::Io {
                        what: "epoll".into(),
                        source: e,
                    });
                }
            }
            for ev in events.iter() {
                match ev.token() {
                    ADMIN => self.accept_admin(),
                    // Accepted below, every turn (see `accept_apps`).
                    APPS => {}
                    METRICS => self.accept_metrics(),
                    SIGNALS => self.on_signals(),
                    t if t.0 >= clients::FIRST_TOKEN => self.on_client(t),
                    _ => {}
                }
            }
            // Events first: an app that detached frees its slot for one waiting to attach.
            self.drain_events();
            self.flush_backlog();
            self.accept_apps();
            self.serve_parked();
            self.answer_awaiting();
            self.clients.expire(self.poll.registry(), Instant::now());
            self.retry_peers();
            if let Some(e) = self.failed.take() {
                self.shutdown();
                return Err(StartError::PollThread(e));
            }
            if self.draining.is_some() && self.drained >= self.threads.len() {
                self.shutdown();
                info!("rpcrdmad stopped");
                return Ok(());
            }
            if self.draining.is_none() && self.threads.iter().any(PollHandle::is_finished) {
                self.shutdown();
                return Err(StartError::PollThread("poll thread exited".into()));
            }
        }
    }

    fn shutdown(&mut self) {
        for t in 0..self.threads.len() {
            self.send_to(t, Command::Stop);
        }
        // Joined only once its Stop is in its queue (a running thread drains the queue).
        let waiting = |d: &Self| {
            d.threads
                .iter()
                .zip(&d.backlog)
                .any(|(h, w)| !w.is_empty() && !h.is_finished())
        };
        while waiting(self) {
            self.flush_backlog();
            std::thread::sleep(BACKLOG_RETRY);
        }
        for t in &mut self.threads {
            t.join();
        }
        let _ = std::fs::remove_file(&self.admin_path);
        let _ = std::fs::remove_file(&self.cfg.daemon.app_socket);
    }

    fn next_timeout(&self) -> Duration {
        let now = Instant::now();
        let mut t = Duration::from_millis(500);
        if self.backlog.iter().any(|w| !w.is_empty()) {
            // A poll thread takes its commands within its chores' period (50 µs busy or
            // idle, 20 ms parked; a command wakes it).
            t = t.min(BACKLOG_RETRY);
        }
        for w in &self.awaiting {
            t = t.min(w.deadline.saturating_duration_since(now));
        }
        if let Some(d) = self.clients.next_deadline() {
            t = t.min(d.saturating_duration_since(now));
        }
        if let Some((_, d)) = self.snap_round {
            t = t.min(d.saturating_duration_since(now));
        }
        if let Some((_, d)) = self.held_apps.front() {
            // Retried on every turn (a detach wakes the loop); refused at the deadline.
            t = t.min(d.saturating_duration_since(now));
        }
        for p in &self.peers {
            if let PeerPhase::Backoff(at) = p.phase {
                t = t.min(at.saturating_duration_since(now));
            }
        }
        t
    }

    fn retry_peers(&mut self) {
        if self.draining.is_some() {
            return;
        }
        let now = Instant::now();
        for i in 0..self.peers.len() {
            if matches!(self.peers[i].phase, PeerPhase::Backoff(at) if at <= now) {
                self.connect_peer(i);
            }
        }
    }

    fn on_signals(&mut self) {
        let sigs: Vec<i32> = self.signals.pending().collect();
        for sig in sigs {
            match sig {
                SIGHUP => {
                    let r = self.reload();
                    info!(result = %serde_json::to_string(&r).unwrap_or_default(), "SIGHUP reload");
                }
                _ if self.draining.is_some() => {
                    warn!("second termination signal: stopping now");
                    self.drained = self.threads.len();
                }
                _ => self.begin_drain(),
            }
        }
    }

    fn begin_drain(&mut self) {
        let deadline = Instant::now() + self.opts.drain_timeout;
        info!(
            timeout_ms = self.opts.drain_timeout.as_millis() as u64,
            "draining"
        );
        self.draining = Some(deadline);
        for p in &mut self.peers {
            if !matches!(p.phase, PeerPhase::Up(_)) {
                p.phase = PeerPhase::Stopped;
            }
        }
        for t in 0..self.threads.len() {
            self.send_to(t, Command::Drain { deadline });
        }
    }

    /// The poll thread of listener `k`: round robin over the threads (connections stay
    /// where accepted); the in-memory provider's fabric is thread 0's alone.
    fn listener_thread(&self, k: usize) -> usize {
        if self.cfg.provider.kind == ProviderKind::Mem {
            0
        } else {
            k % self.threads.len().max(1)
        }
    }

    fn reload(&mut self) -> Response {
        let path = self.opts.config_path.clone();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => return Response::err(format!("cannot read {}: {e}", path.display())),
        };
        let report = rpcrdma_config::check(
            &text,
            &path.display().to_string(),
            &rpcrdma_config::HostFacts::detect(),
        );
        let new = match report.config {
            Some(c) if !report.diagnostics.has_errors() => c,
            _ => {
                return Response::err(format!(
                    "new configuration refused, nothing changed:\n{}",
                    report.diagnostics
                ))
            }
        };
        let outcome = reload::diff(&self.cfg, &new);
        for key in &outcome.applied {
            if key == "daemon.log-level" {
                (self.opts.set_log_level)(new.daemon.log_level);
                self.cfg.daemon.log_level = new.daemon.log_level;
            } else if key.starts_with("cpu.idle") {
                self.cfg.cpu.idle = new.cpu.idle.clone();
            } else if key.starts_with("listeners[") {
                for (o, n) in self.cfg.listeners.iter_mut().zip(&new.listeners) {
                    o.allow = n.allow.clone();
                    o.max_connections_per_host = n.max_connections_per_host;
                    o.connect_rate_per_host = n.connect_rate_per_host;
                    o.spread = n.spread;
                }
            } else if key.starts_with("peers[") {
                for (p, n) in self.peers.iter_mut().zip(&new.peers) {
                    p.initial = Duration::from_millis(u64::from(n.reconnect_initial_ms));
                    p.max = Duration::from_millis(u64::from(n.reconnect_max_ms));
                    p.delay = p.delay.clamp(p.initial, p.max.max(p.initial));
                }
                for (o, n) in self.cfg.peers.iter_mut().zip(&new.peers) {
                    o.reconnect_initial_ms = n.reconnect_initial_ms;
                    o.reconnect_max_ms = n.reconnect_max_ms;
                }
            }
        }
        if outcome.applied.iter().any(|k| k.starts_with("listeners[")) {
            for index in 0..self.cfg.listeners.len() {
                if let Some(admit) = admit_spec(&self.cfg.listeners[index]) {
                    self.send_to(self.listener_thread(index), Command::Admit { index, admit });
                }
            }
        }
        if outcome.applied.iter().any(|k| k.starts_with("cpu.idle")) {
            let idle = idle_spec(&self.cfg);
            for t in 0..self.threads.len() {
                self.send_to(t, Command::SetIdle(idle));
            }
        }
        info!(applied = ?outcome.applied, refused = outcome.refused.len(), "reload");
        Response::ok(outcome)
    }

    /// Accepts waiting apps, each to the poll thread with the fewest. `apps.max-apps` is the
    /// daemon's limit: an app beyond it waits up to [`ATTACH_HOLD`] for a slot (in arrival
    /// order), then its socket is closed.
    fn accept_apps(&mut self) {
        let now = Instant::now();
        let full = |d: &Daemon| d.apps_on.iter().sum::<usize>() >= d.cfg.apps.max_apps as usize;
        while let Some((att, until)) = self.held_apps.pop_front() {
            if self.draining.is_some() || now >= until {
                warn!(pid = ?att.pid(), "app refused: draining or apps.max-apps reached");
                continue;
            }
            if full(self) {
                self.held_apps.push_front((att, until));
                break;
            }
            self.place_app(att);
        }
        // Bounded: an accept error that repeats (no fd left) must not spin the control loop;
        // the loop calls this again on its next turn (at least every 500 ms).
        for _ in 0..64 {
            let att = match self.apps.accept() {
                Ok(Some(a)) => a,
                Ok(None) => return,
                Err(e) => {
                    debug!(error = %e, "app attach failed");
                    continue;
                }
            };
            if self.draining.is_some() {
                warn!(pid = ?att.pid(), "app refused: draining");
            } else if !full(self) && self.held_apps.is_empty() {
                self.place_app(att);
            } else if self.held_apps.len() < MAX_HELD_APPS {
                debug!(pid = ?att.pid(), "apps.max-apps reached: the app waits for a slot");
                self.held_apps.push_back((att, now + ATTACH_HOLD));
            } else {
                warn!(pid = ?att.pid(), "app refused: apps.max-apps reached");
            }
        }
    }

    /// Hands `att` to the poll thread with the fewest apps.
    fn place_app(&mut self, att: Attachment) {
        let t = (0..self.apps_on.len())
            .min_by_key(|&t| self.apps_on[t])
            .unwrap_or(0);
        // Counted now, so a burst of attaches spreads before the threads report; a thread
        // that cannot take the app answers `AppDetached`.
        self.apps_on[t] += 1;
        self.send_to(t, Command::Attach(Box::new(att)));
    }

    /// Takes every pending admin client into the non-blocking client set.
    fn accept_admin(&mut self) {
        while let Ok((s, _)) = self.admin.accept() {
            self.clients
                .add(self.poll.registry(), clients::Stream::Unix(s), Kind::Admin);
        }
    }

    /// Makes progress on client `t` (readable or writable) and serves its request once read.
    fn on_client(&mut self, t: Token) {
        match self.clients.ready(self.poll.registry(), t) {
            Some(Input::Admin(r)) => self.admin_request(t, r),
            Some(Input::Http(head)) => {
                if head.starts_with("GET /metrics ") || head.starts_with("GET / ") {
                    self.park(t, Job::Metrics);
                } else {
                    let r = clients::http_response("404 Not Found", None, "");
                    self.clients.respond(self.poll.registry(), t, r);
                }
            }
            None => {}
        }
    }

    /// Serves one admin request: at once, parked until fresh snapshots arrive, or (`xchar
    /// request`) deferred until the peer's RESPXCH (`answer_awaiting`).
    fn admin_request(&mut self, t: Token, req: Result<Request, String>) {
        let resp = match req {
            Ok(Request::XcharRequest { conn, set }) => match self.send_reqxch(conn, &set) {
                Ok(xid) => {
                    debug!(conn, xid, "REQXCH sent, awaiting the RESPXCH");
                    self.awaiting.push(AwaitingRespxch {
                        client: t,
                        conn,
                        xid,
                        deadline: Instant::now() + RESPXCH_WAIT,
                    });
                    return;
                }
                Err(resp) => resp,
            },
            Ok(req) if needs_snapshots(&req) => {
                debug!(?req, "admin request");
                self.park(t, Job::Admin(req));
                return;
            }
            Ok(req) => {
                debug!(?req, "admin request");
                self.handle(req)
            }
            Err(e) => Response::err(e),
        };
        self.answer(t, &resp);
    }

    /// Writes `resp` to admin client `t` (non-blocking), which is then closed.
    fn answer(&mut self, t: Token, resp: &Response) {
        let line = clients::admin_line(resp);
        self.clients.respond(self.poll.registry(), t, line);
    }

    /// Answers the `xchar request`s whose RESPXCH arrived, and those that waited too long (the
    /// request is then abandoned: the peer may not support REQXCH and keeps its values).
    fn answer_awaiting(&mut self) {
        let now = Instant::now();
        let mut k = 0;
        while let Some(w) = self.awaiting.get(k) {
            let (conn, xid, late) = (w.conn, w.xid, now > w.deadline);
            let x = self.xchar.get_mut(&conn);
            let resp = match x {
                None => Some(Response::err(format!("connection {conn} went away"))),
                Some(x) => match x.take_answer(xid) {
                    Some(o) => Some(Response::ok(o)),
                    None if late => {
                        let acts = x.abandon(xid);
                        self.act(conn, 0, acts);
                        Some(Response::err(
                            "no RESPXCH within 3 s (the peer may not support REQXCH: it keeps its values)",
                        ))
                    }
                    None => None,
                },
            };
            match resp {
                Some(r) => {
                    let w = self.awaiting.swap_remove(k);
                    self.answer(w.client, &r);
                }
                None => k += 1,
            }
        }
    }

    /// Takes every pending metrics client into the non-blocking client set.
    fn accept_metrics(&mut self) {
        let Some(l) = self.metrics.as_ref() else {
            return;
        };
        while let Ok((s, _)) = l.accept() {
            self.clients
                .add(self.poll.registry(), clients::Stream::Tcp(s), Kind::Metrics);
        }
    }

    /// The Prometheus exposition of the latest snapshots.
    fn render_metrics(&self) -> String {
        let snaps: Vec<&Snapshot> = self.latest.iter().collect();
        let configured: Vec<(&str, bool)> = self
            .peers
            .iter()
            .map(|p| (p.name.as_str(), matches!(p.phase, PeerPhase::Up(_))))
            .collect();
        crate::metrics::render(
            &snaps,
            |t, c| self.name_of(t, c),
            &self.peer_totals(&snaps),
            &self.peer_rtt(&snaps),
            &configured,
        )
    }

    /// Each peer's round-trip histogram over all its connections.
    fn peer_rtt(
        &self,
        snaps: &[&Snapshot],
    ) -> std::collections::BTreeMap<String, rpcrdma_dataplane::poll::Histo> {
        self.ledger.rtt(snaps, |c| self.peer_key(c.peer, c.remote))
    }

    /// Each peer's counters over all its connections ([`crate::metrics::PeerLedger`]).
    fn peer_totals(&self, snaps: &[&Snapshot]) -> crate::metrics::PeerTotals {
        self.ledger
            .totals(snaps, |c| self.peer_key(c.peer, c.remote))
    }

    /// The `peer` label of per-peer metrics: a configured peer's name; for an accepted
    /// connection, the remote host's address without the port, which changes every time.
    fn peer_key(&self, peer: Option<u32>, remote: Option<std::net::SocketAddr>) -> String {
        match (peer.and_then(|p| self.peers.get(p as usize)), remote) {
            (Some(p), _) => p.name.clone(),
            (None, Some(r)) => r.ip().to_string(),
            (None, None) => "-".into(),
        }
    }

    fn name_of(&self, _thread: usize, conn: u32) -> String {
        self.remote_of
            .get(&conn)
            .cloned()
            .unwrap_or_else(|| format!("conn{conn}"))
    }

    fn conn_view(&self, thread: usize, c: &ConnInfo) -> ConnView {
        ConnView {
            id: c.id,
            thread,
            peer: c
                .peer
                .and_then(|p| self.peers.get(p as usize))
                .map(|p| p.name.clone()),
            remote: c.remote.map(|r| r.to_string()),
            role: if c.client { "client" } else { "server" }.into(),
            state: c.state.as_str().into(),
            version: c.version,
            credits_granted: c.credits_granted,
            credits_offered: c.credits_offered,
            inline_send: c.inline_send,
            inline_recv: c.inline_recv,
            peer_inline_send: c.peer_private.map(|p| p.0),
            peer_inline_recv: c.peer_private.map(|p| p.1),
            peer_remote_invalidate: c.peer_private.map(|p| p.2),
            xchar: self.xchar.get(&c.id).map(|x| x.view().clone()),
        }
    }

    fn all_conns(&self) -> impl Iterator<Item = (usize, &rpcrdma_dataplane::poll::ConnStats)> {
        self.latest
            .iter()
            .enumerate()
            .flat_map(|(t, s)| s.conns().iter().map(move |c| (t, c)))
    }

    /// Every listener's admissions, from the latest snapshots, in configuration order.
    fn listener_counters(&self) -> Vec<admin::ListenerCounters> {
        let mut rows: Vec<(usize, admin::ListenerCounters)> = self
            .latest
            .iter()
            .enumerate()
            .flat_map(|(t, s)| s.listeners().iter().map(move |l| (t, l)))
            .map(|(thread, l)| {
                let row = admin::ListenerCounters {
                    listener: crate::metrics::listener_name(l),
                    thread,
                    connections: l.connections,
                    admitted: l.admitted,
                    connects_refused: l.refused.into(),
                };
                (l.index, row)
            })
            .collect();
        rows.sort_by_key(|(index, _)| *index);
        rows.into_iter().map(|(_, row)| row).collect()
    }

    fn thread_status(&self) -> Vec<admin::ThreadStatus> {
        self.latest
            .iter()
            .map(|s| {
                let t = &s.thread;
                let total = t.busy_ns.saturating_add(t.idle_ns);
                admin::ThreadStatus {
                    index: t.index,
                    core: t.core,
                    busy_ratio: if total == 0 {
                        0.0
                    } else {
                        t.busy_ns as f64 / total as f64
                    },
                    busy_ns: t.busy_ns,
                    idle_ns: t.idle_ns,
                    busy_polls: t.busy_polls,
                    idle_polls: t.idle_polls,
                    parks: t.parks,
                    hops_out: t.hops_out,
                    hops_in: t.hops_in,
                    hops_deferred: t.hops_deferred,
                    yields: t.yields,
                    completions: t.completions,
                    drains_overdue: t.drains_overdue,
                    device_events: t.device.into(),
                    apps: t.apps,
                    app_ops: t.app_ops,
                    bad_submissions: t.bad_submissions,
                    connects_refused: t.connects_refused.into(),
                    conns_handed_over: t.conns_handed_over,
                    apps_detached: t.apps_detached,
                    regions: t.regions,
                    region_bytes: t.region_bytes,
                    rpcs_in_flight: t.rpcs_in_flight,
                    conns_retiring: t.conns_retiring,
                    calls_held: t.calls_held,
                    calls_held_total: t.calls_held_total,
                    calls_waiting_slot: t.calls_waiting_slot,
                    send_buffers_free: t.buffers.send_free,
                    send_buffers: t.buffers.send_total,
                    recv_buffers_free: t.buffers.recv_free,
                    recv_buffers: t.buffers.recv_total,
                }
            })
            .collect()
    }

    /// Answers one admin request from the latest snapshots (the control loop first parks the
    /// requests that need fresh ones until they arrive: `needs_snapshots`).
    pub fn handle(&mut self, req: Request) -> Response {
        match req {
            Request::Reload => return self.reload(),
            Request::ConnClose { conn } => {
                if !self.all_conns().any(|(_, c)| c.info.id == conn) {
                    return Response::err(format!("no connection {conn}"));
                }
                self.send(conn, Command::Close { conn });
                return Response::ok(serde_json::json!({ "closing": conn }));
            }
            Request::XcharRequest { conn, set } => {
                // The admin loop defers these (`accept_admin`); a request reaching here is only
                // sent, and its outcome shows in `conns`.
                return match self.send_reqxch(conn, &set) {
                    Ok(xid) => Response::ok(serde_json::json!({ "sent-xid": xid })),
                    Err(r) => r,
                };
            }
            Request::XcharSet { conn, set } => return self.xchar_set(conn, &set),
            Request::PeerRetryV2 { peer } => return self.retry_v2(&peer),
            _ => {}
        }
        match req {
            Request::Status => {
                let now = Instant::now();
                let peers = self
                    .peers
                    .iter()
                    .map(|p| {
                        let (state, conn, retry) = match p.phase {
                            PeerPhase::Connecting => ("connecting", None, None),
                            PeerPhase::Up(c) => ("up", Some(c), None),
                            PeerPhase::Backoff(at) => (
                                "backoff",
                                None,
                                Some(at.saturating_duration_since(now).as_millis() as u64),
                            ),
                            PeerPhase::Stopped => ("stopped", None, None),
                        };
                        PeerStatus {
                            version: if p.v1_only {
                                1
                            } else {
                                self.cfg.transport.version
                            },
                            name: p.name.clone(),
                            address: p.address.clone(),
                            state: state.into(),
                            conn,
                            failures: p.failures,
                            retry_in_ms: retry,
                            last_error: p.last_error.clone(),
                        }
                    })
                    .collect();
                let threads = self.thread_status();
                Response::ok(admin::Status {
                    version: env!("CARGO_PKG_VERSION").into(),
                    pid: std::process::id(),
                    uptime_s: self.started.elapsed().as_secs(),
                    config: self.opts.config_path.display().to_string(),
                    provider: self.cfg.provider.kind.name().into(),
                    state: if self.draining.is_some() {
                        "draining"
                    } else {
                        "running"
                    }
                    .into(),
                    listeners: self.listeners.iter().map(|a| a.to_string()).collect(),
                    peers,
                    conns_up: self
                        .all_conns()
                        .filter(|(_, c)| c.info.state == ConnState::Up)
                        .count(),
                    apps: threads.iter().map(|t| t.apps).sum(),
                    threads,
                })
            }
            Request::Conns => {
                let v: Vec<ConnView> = self
                    .all_conns()
                    .map(|(t, c)| self.conn_view(t, &c.info))
                    .collect();
                Response::ok(v)
            }
            Request::ConnShow { conn } => match self.all_conns().find(|(_, c)| c.info.id == conn) {
                Some((t, c)) => Response::ok(serde_json::json!({
                    "conn": self.conn_view(t, &c.info),
                    "counters": self.counters(t, &c.info),
                    "latency": self.latency_row(t, c),
                })),
                None => Response::err(format!("no connection {conn}")),
            },
            Request::Stats => {
                let conns = self
                    .all_conns()
                    .map(|(t, c)| self.counters(t, &c.info))
                    .collect();
                let snaps: Vec<&Snapshot> = self.latest.iter().collect();
                let peers = self
                    .peer_totals(&snaps)
                    .into_iter()
                    .map(|(peer, t)| admin::PeerCounters {
                        peer,
                        calls_out: t.calls_out,
                        replies_in: t.replies_in,
                        calls_in: t.calls_in,
                        replies_out: t.replies_out,
                        call_errors: t.call_errors,
                        protocol_errors: t.protocol_errors,
                        bytes_out: t.bytes_out,
                        bytes_in: t.bytes_in,
                        conns_opened: t.conns_opened,
                        conns_closed: t.conns_closed,
                    })
                    .collect();
                Response::ok(admin::Stats {
                    threads: self.thread_status(),
                    conns,
                    peers,
                    listeners: self.listener_counters(),
                })
            }
            Request::Latency => {
                let rows: Vec<LatencyRow> = self
                    .all_conns()
                    .map(|(t, c)| self.latency_row(t, c))
                    .collect();
                Response::ok(rows)
            }
            Request::PeerLatency => {
                let snaps: Vec<&Snapshot> = self.latest.iter().collect();
                let rows: Vec<admin::PeerLatencyRow> = self
                    .peer_rtt(&snaps)
                    .into_iter()
                    .map(|(peer, h)| admin::PeerLatencyRow {
                        peer,
                        latency: percentiles(&h),
                    })
                    .collect();
                Response::ok(rows)
            }
            Request::Apps => {
                let rows: Vec<admin::AppStatus> = self
                    .latest
                    .iter()
                    .enumerate()
                    .flat_map(|(t, s)| s.apps().iter().map(move |a| app_status(t, a)))
                    .collect();
                Response::ok(rows)
            }
            _ => Response::err("unhandled request"),
        }
    }

    fn counters(&self, t: usize, c: &ConnInfo) -> ConnCounters {
        ConnCounters {
            id: c.id,
            peer: self.name_of(t, c.id),
            calls_out: c.calls_out,
            replies_in: c.replies_in,
            calls_in: c.calls_in,
            replies_out: c.replies_out,
            call_errors: c.call_errors,
            protocol_errors: c.protocol_errors,
            bytes_out: c.bytes_out,
            bytes_in: c.bytes_in,
            rdma_read_bytes: c.engine.read_bytes,
            rdma_write_bytes: c.engine.write_bytes,
            long_calls: c.engine.long_calls,
            long_replies: c.engine.long_replies,
            short_sent: c.engine.short_sent,
            read_chunks: c.engine.read_chunks,
            write_chunks: c.engine.write_chunks,
            reply_chunks: c.engine.reply_chunks,
            invalidations: c.engine.invalidations,
            remote_invalidations: c.engine.remote_invalidations,
            replies_with_invalidate: c.engine.replies_with_invalidate,
            dropped: c.engine.dropped,
            errors_sent: c.engine.errors_sent,
            errors_received: c.engine.errors_received,
            errors_sent_by_code: c.engine.errors_sent_by.into(),
            errors_received_by_code: c.engine.errors_received_by.into(),
            credit_stalls: c.engine.credit_stalls,
            bad_replies: c.engine.bad_replies,
        }
    }

    fn latency_row(&self, t: usize, c: &rpcrdma_dataplane::poll::ConnStats) -> LatencyRow {
        LatencyRow {
            id: c.info.id,
            peer: self.name_of(t, c.info.id),
            latency: percentiles(&c.latency),
        }
    }
}

/// The percentiles of a histogram of nanoseconds, in microseconds (zeros when empty).
fn percentiles(histo: &rpcrdma_dataplane::poll::Histo) -> admin::Percentiles {
    let h = histo.get().filter(|h| !h.is_empty());
    let us = |ns: u64| ns as f64 / 1000.0;
    let q = |p: f64| h.map_or(0.0, |h| us(h.value_at_quantile(p)));
    admin::Percentiles {
        count: histo.len(),
        mean_us: h.map_or(0.0, |h| h.mean() / 1000.0),
        p50_us: q(0.5),
        p90_us: q(0.9),
        p99_us: q(0.99),
        p999_us: q(0.999),
        max_us: h.map_or(0.0, |h| us(h.max())),
    }
}

/// An app as `rpcrdmactl apps` shows it.
fn app_status(thread: usize, a: &rpcrdma_shm::daemon::AppInfo) -> admin::AppStatus {
    let listed = a.programs.get(..usize::from(a.n_programs)).unwrap_or(&[]);
    admin::AppStatus {
        thread,
        app: format!("{}.{}", a.slot, a.gen),
        pid: a.pid,
        programs: listed
            .iter()
            .map(|&(prog, vers, callback)| {
                format!(
                    "{prog:#x}/{vers}{}",
                    if callback { " (callback)" } else { "" }
                )
            })
            .collect(),
        ops: a.ops,
        lent: a.lent,
        calls: a.counters.calls,
        calls_done: a.counters.calls_done,
        served: a.counters.served,
        replies: a.counters.replies,
        bad_submissions: a.counters.bad,
        cancels: a.counters.cancels,
        timeouts: a.counters.timeouts,
    }
}

/// Whether `req` is answered from fresh snapshots of every poll thread.
fn needs_snapshots(req: &Request) -> bool {
    matches!(
        req,
        Request::Status
            | Request::Conns
            | Request::ConnShow { .. }
            | Request::ConnClose { .. }
            | Request::Stats
            | Request::Latency
            | Request::PeerLatency
            | Request::Apps
    )
}

/// Loads the configuration for `rpcrdmad`: the report's diagnostics are printed by the caller.
pub fn load(path: &Path) -> Result<(Config, rpcrdma_config::Diagnostics), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let report = rpcrdma_config::check(
        &text,
        &path.display().to_string(),
        &rpcrdma_config::HostFacts::detect(),
    );
    match report.config {
        Some(c) if !report.diagnostics.has_errors() => Ok((c, report.diagnostics)),
        _ => Err(report.diagnostics.to_string()),
    }
}
