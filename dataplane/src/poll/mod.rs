//! The pinned poll threads: each has one provider (its CQs and its connection manager), the
//! rings of the apps given to it and the engines of the connections it opened or accepted,
//! driven by one busy-polling loop (SPDK's reactor). Threads hand calls to each other as
//! messages through a [`Mesh`] of lock-free queues, never through a lock.
//!
//! The control thread talks to it only through two bounded lock-free queues: [`Command`]s in,
//! [`Event`]s out (followed by a call of the `notify` hook so the control thread's `mio` loop
//! wakes). Counters and latency histograms live on the poll thread; the control thread reads
//! them by sending a [`Snapshot`] buffer it allocated, which the poll thread fills and returns
//! (no lock; the only allocation is a latency histogram for a connection the buffer has none
//! for yet, at snapshot time, never per message).
//!
//! Buffers: one shared receive queue and one shared send pool per thread, sized by
//! [`PoolPlan`] from [`PoolSpec`]; each connection's credits are capped to its share of the
//! receive queue (see `dataplane/README.md`).

mod admit;
mod held;
mod idmap;
mod mesh;
mod pools;
mod stats;
mod thread;

pub use admit::{host_of, AdmitSpec, Refusal, Refused};
pub use mesh::{Mesh, Port};

pub use pools::{divide_share, CqDepth, PoolPlan, SPARE_RECEIVES};
pub use stats::{
    ConnInfo, ConnState, ConnStats, Histo, ListenerStats, Snapshot, ThreadStats, Totals,
    LATENCY_MAX_NS, LATENCY_RESOLUTION_NS, LATENCY_SIGFIG,
};
pub use thread::PollThread;

use crossbeam_queue::ArrayQueue;
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How an idle poll thread waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleSpec {
    /// Busy-poll forever.
    Spin,
    /// Spin (see [`SpinLimit`]), sleep with growing pauses up to `backoff_max`, and park
    /// (wake on app doorbells and commands) once idle for `park_after`.
    Backoff {
        /// How long the thread spins before its first pause.
        spin: SpinLimit,
        /// Longest pause.
        backoff_max: Duration,
        /// Idle time before parking.
        park_after: Duration,
    },
    /// Poll, and after each empty poll hand the CPU to any other runnable thread (`sched_yield`) instead
    /// of busy-waiting or sleeping; park (as `Backoff` does) once idle for `park_after`. For hosts with
    /// fewer cores than busy threads, where the apps this thread serves need its core.
    Yield {
        /// Idle time before parking.
        park_after: Duration,
    },
}

/// How long a backing-off thread spins before its first pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpinLimit {
    /// This long after its last work (`cpu.idle.spin-us`).
    For(Duration),
    /// This many empty polls (`cpu.idle.spin-polls`, deprecated): how long that lasts follows
    /// what an empty poll costs, which changes with the provider, the apps attached and every
    /// change to the loop.
    Polls(u32),
}

/// Transport settings every connection of the thread starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportSpec {
    /// Highest RPC-over-RDMA version offered (1 or 2).
    pub version: u32,
    /// Largest Send this side transmits (advertised in RFC 8797 private data).
    pub inline_send: u32,
    /// Receive buffer size (advertised in RFC 8797 private data).
    pub inline_recv: u32,
    /// Forward-direction credits.
    pub credits: u32,
    /// Backward-direction credits.
    pub backchannel_credits: u32,
    /// DDP-eligible items shorter than this go inline.
    pub ddp_threshold: u32,
    /// Whether we accept Send With Invalidate.
    pub remote_invalidation: bool,
    /// Bytes per posted receive buffer (at least `inline_recv`; room for a larger RBSIZ).
    pub recv_buffer_size: u32,
    /// RDMA Reads this side accepts in flight (IRD).
    pub ird: u16,
    /// RDMA Reads this side issues in flight (ORD).
    pub ord: u16,
    /// How long a version-two connection waits for the answer to its first call before it
    /// ends with [`Reason::NoAnswer`] (AMB-33).
    pub v2_first_reply_timeout: Duration,
    /// Most segments a received chunk may carry (`transport.max-segments-per-chunk`).
    pub max_segments_per_chunk: u32,
    /// Most chunks a received list may carry (`transport.max-chunks-per-list`).
    pub max_chunks_per_list: u32,
}

/// Buffer pools of a poll thread (see [`PoolPlan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSpec {
    /// Buffers of the shared receive queue (`TransportSpec::recv_buffer_size` bytes each).
    pub recv_buffers: u32,
    /// Buffers of the shared send pool (`TransportSpec::inline_send` bytes plus the engine's
    /// 128-byte tail each).
    pub send_buffers: u32,
    /// Where connections take their receives from ([`recv_buffers`](Self::recv_buffers) and
    /// [`send_buffers`](Self::send_buffers) are for [`ReceiveQueues::Shared`] only).
    pub receive_queues: ReceiveQueues,
}

/// Where a poll thread's connections take their receive buffers from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReceiveQueues {
    /// One shared receive queue for the thread, and one shared send pool: memory does not grow
    /// with connections × credits. On iWARP a peer sending far past its grant can empty the
    /// queue before the thread reposts, which ends another connection whose Send arrives then
    /// (see the crate README).
    #[default]
    Shared,
    /// Each connection its own receive queue (credits, backchannel credits and one spare) and
    /// its own send buffers: a burst past the grant reaches only the sender's queue; memory
    /// grows with connections × credits.
    PerConnection,
}

/// Everything a poll thread needs to start.
#[derive(Debug, Clone)]
pub struct PollSpec {
    /// Thread index (for names and metrics labels).
    pub index: usize,
    /// Core to pin to; `None` runs unpinned.
    pub core: Option<usize>,
    /// Idle policy.
    pub idle: IdleSpec,
    /// Connection settings.
    pub transport: TransportSpec,
    /// Most connections (bounds every table; each gets `recv_buffers / max_conns` receives).
    /// Must equal the [`Mesh`]'s connections per thread (connection ids name their thread by
    /// it): a thread whose spec disagrees fails to start.
    pub max_conns: u32,
    /// Shared receive queue and send pool sizes.
    pub pools: PoolSpec,
    /// Most apps attached to this thread at once.
    pub max_apps: u16,
    /// App region geometry (the peer table is filled from `peers`).
    pub geometry: rpcrdma_shm::abi::Geometry,
    /// Names of the configured peers, in the order apps address them.
    pub peers: Vec<String>,
    /// Depth of the command and event queues.
    pub queue_depth: usize,
}

/// A request from the control thread.
#[derive(Debug)]
pub enum Command {
    /// Listen for RPC-over-RDMA connections on `addr` (port 0 picks one).
    Listen {
        /// Address to bind.
        addr: SocketAddr,
        /// The listener's index in the configuration (names it in [`Command::Admit`]).
        index: usize,
        /// Who may connect, how often, how many times at once.
        admit: AdmitSpec,
    },
    /// Apply new admission rules to listener `index` (a reload).
    Admit {
        /// The listener's index in the configuration.
        index: usize,
        /// The rules.
        admit: AdmitSpec,
    },
    /// Stop listening on every address.
    CloseListeners,
    /// Take an app the control thread accepted (boxed: a rare, large message).
    Attach(Box<rpcrdma_shm::attach::Attachment>),
    /// Connect configured peer `peer` (its index) to `addr` (from this thread).
    Connect {
        /// Peer index.
        peer: u32,
        /// Address of the peer's listener.
        addr: SocketAddr,
        /// RPC-over-RDMA version to speak (at most [`TransportSpec::version`]; 1 for a peer
        /// that never answered version two, AMB-33).
        version: u32,
    },
    /// Disconnect connection `conn`.
    Close {
        /// Connection id.
        conn: u32,
    },
    /// Fill the snapshot and send it back as [`Event::Snapshot`].
    Snapshot(Box<Snapshot>),
    /// Change the idle policy.
    SetIdle(IdleSpec),
    /// Fail new calls, wait for RPCs in flight until `deadline`, then disconnect everything
    /// and answer [`Event::Drained`].
    Drain {
        /// When to give up waiting.
        deadline: Instant,
    },
    /// Send an RDMA2_OPTIONAL message (xcharext) built by the control plane.
    SendOptional {
        /// Connection id.
        conn: u32,
        /// `rdma_xid`.
        xid: u32,
        /// `rdma_opttype`.
        opttype: u32,
        /// Bytes of `body` used.
        len: u16,
        /// `rdma_optinfo`.
        body: Box<[u8; MAX_OPTINFO]>,
    },
    /// Answer an RDMA2_OPTIONAL message with RDMA2_ERR_INVAL_OPTION.
    RejectOptional {
        /// Connection id.
        conn: u32,
        /// Its `rdma_xid`.
        xid: u32,
    },
    /// Apply characteristics the peer announced.
    ApplyPeer {
        /// Connection id.
        conn: u32,
        /// The peer's receive buffer size (our inline threshold follows).
        rbsiz: Option<u32>,
        /// Whether the peer takes Send With Invalidate on our replies.
        reqreminv: Option<bool>,
    },
    /// Apply the XCHAR_RBSIZ we are about to announce (before the message announcing it is
    /// sent: queue this command first).
    ApplyOwn {
        /// Connection id.
        conn: u32,
        /// Our receive size (the threshold for what the peer sends).
        rbsiz: u32,
    },
    /// Cap what we send while our REQXCH lowering the peer's RBSIZ is outstanding
    /// (XCH-3.1-d); `None` lifts it.
    CapPeer {
        /// Connection id.
        conn: u32,
        /// The cap.
        rbsiz: Option<u32>,
    },
    /// Send [`Event::Idle`] once no call of `conn` is in flight.
    NotifyIdle {
        /// Connection id.
        conn: u32,
    },
    /// Exit the loop (after [`Command::Drain`], or at once).
    Stop,
}

/// Refused connection requests are reported ([`Event::Refused`]) at most this often per
/// thread.
pub const REFUSAL_REPORT_EVERY: Duration = Duration::from_secs(1);

/// Largest `rdma_optinfo` carried between the threads.
pub const MAX_OPTINFO: usize = crate::conn::MAX_OPTINFO;

/// Why a connection attempt or a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// The peer rejected the connection.
    Rejected,
    /// Unreachable, refused, or set-up failed: the provider's word on why.
    ConnectError(rpcrdma_verbs::ConnectFailure),
    /// The connection ended (either side, or transport loss).
    Disconnected,
    /// A version-two connection got no answer to its first call in time (AMB-33): the
    /// peer may be a version-1 server that drops version-two messages silently.
    NoAnswer,
    /// The engine terminated it (protocol error); the text says why.
    Protocol(&'static str),
    /// A local resource could not be created; the text says which.
    Local(String),
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::Rejected => write!(f, "the peer rejected it"),
            Reason::ConnectError(cause) => write!(f, "{cause}"),
            Reason::Disconnected => write!(f, "disconnected"),
            Reason::NoAnswer => write!(f, "no answer to version 2 (AMB-33)"),
            Reason::Protocol(why) => write!(f, "protocol error: {why}"),
            Reason::Local(why) => write!(f, "local error: {why}"),
        }
    }
}

/// Something the control thread should know.
#[derive(Debug)]
pub enum Event {
    /// The poll thread is running (its provider and attach socket are open).
    Started {
        /// Whether it offers peers Send With Invalidate: `transport.remote-invalidation` and
        /// the device's ability to honour it on our exposures (the RFC 8797 flag, and our
        /// XCHAR_REQREMINV in version two).
        remote_invalidation: bool,
    },
    /// A listener is bound (`Ok(actual address)`) or failed.
    Listening {
        /// Requested address.
        addr: SocketAddr,
        /// Bound address, or why not.
        result: Result<SocketAddr, String>,
    },
    /// A connection is established.
    Up {
        /// Connection id.
        conn: u32,
        /// Peer index for outgoing connections, `None` for accepted ones.
        peer: Option<u32>,
        /// Remote address, where known.
        remote: Option<SocketAddr>,
    },
    /// An outgoing connection attempt failed.
    ConnectFailed {
        /// Peer index.
        peer: u32,
        /// Why.
        reason: Reason,
    },
    /// A connection ended.
    Down {
        /// Connection id.
        conn: u32,
        /// Peer index for outgoing connections.
        peer: Option<u32>,
        /// Remote address, where known.
        remote: Option<SocketAddr>,
        /// Why.
        reason: Reason,
        /// Its counters at the end (`conns_*` zero), for totals that outlive it.
        last: Totals,
        /// Its calls' round-trip histogram, handed over (the slot takes a new one when it
        /// is next used).
        latency: Histo,
    },
    /// A connection request was refused. Sent for the first refusal and then at most once a
    /// second per thread ([`REFUSAL_REPORT_EVERY`]), so a flood costs the control thread
    /// nothing; every refusal is counted in [`ThreadStats::connects_refused`].
    Refused {
        /// The listener's bound address.
        listener: Option<SocketAddr>,
        /// The refused side's address, where known.
        remote: Option<SocketAddr>,
        /// Why.
        reason: Refusal,
        /// Refusals since the previous report not reported themselves.
        unreported: u64,
    },
    /// An app attached.
    AppAttached {
        /// Its pid, when known.
        pid: Option<i32>,
    },
    /// An app went away.
    AppDetached {
        /// Its pid, when known.
        pid: Option<i32>,
        /// Why.
        reason: &'static str,
    },
    /// A filled snapshot.
    Snapshot(Box<Snapshot>),
    /// Version two is confirmed on `conn` (a version-two reply arrived for one of our calls).
    V2Confirmed {
        /// Connection id.
        conn: u32,
    },
    /// An RDMA2_OPTIONAL message arrived.
    Optional {
        /// Connection id.
        conn: u32,
        /// `rdma_xid`.
        xid: u32,
        /// `rdma_opttype`.
        opttype: u32,
        /// Bytes of `body` used.
        len: u16,
        /// `rdma_optinfo` (truncated to [`MAX_OPTINFO`]; boxed: a rare control-plane message).
        body: Box<[u8; MAX_OPTINFO]>,
        /// Calls of this connection were in flight.
        busy: bool,
    },
    /// No call of `conn` is in flight (after [`Command::NotifyIdle`]).
    Idle {
        /// Connection id.
        conn: u32,
    },
    /// Draining finished (`in_flight` RPCs were still open at the deadline).
    Drained {
        /// RPCs abandoned at the deadline.
        in_flight: usize,
    },
    /// The thread failed to start or stopped on an error.
    Failed(String),
}

/// The control thread's end of one poll thread.
#[derive(Debug)]
pub struct PollHandle {
    commands: Arc<ArrayQueue<Command>>,
    events: Arc<ArrayQueue<Event>>,
    doorbell: UnixStream,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PollHandle {
    /// Queues `cmd` and rings the thread's doorbell; gives the command back if the queue is full.
    pub fn send(&self, cmd: Command) -> Result<(), Command> {
        self.commands.push(cmd)?;
        use std::io::Write;
        let _ = (&self.doorbell).write(&[1]);
        Ok(())
    }

    /// The next event, if any.
    pub fn recv(&self) -> Option<Event> {
        self.events.pop()
    }

    /// Whether the thread has exited.
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Waits for the thread to exit.
    pub fn join(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts a poll thread with the soft (TCP) provider; `notify` is called after events are queued.
pub fn spawn_soft(
    spec: PollSpec,
    port: Port,
    soft: rpcrdma_verbs::soft::SoftConfig,
    notify: Box<dyn Fn() + Send>,
) -> std::io::Result<PollHandle> {
    spawn_with(spec, port, notify, move |_| {
        rpcrdma_verbs::soft::SoftTcp::tcp(soft).map_err(|e| format!("soft provider: {e}"))
    })
}

/// Starts a poll thread with the soft provider on a fresh in-memory fabric of its own: its
/// listeners and its connections to them are both ends of the same connection, so one daemon
/// connects to itself with no socket on the data path (for tests and benchmarks). The fabric
/// is the thread's alone: only its own connections reach its listeners.
pub fn spawn_mem(
    spec: PollSpec,
    port: Port,
    soft: rpcrdma_verbs::soft::SoftConfig,
    notify: Box<dyn Fn() + Send>,
) -> std::io::Result<PollHandle> {
    spawn_with(spec, port, notify, move |_| {
        let fabric = rpcrdma_verbs::soft::link::MemFabric::new();
        Ok(rpcrdma_verbs::soft::SoftMem::memory(&fabric, soft))
    })
}

/// Starts a poll thread with the rdma-core provider (an RDMA NIC, rxe or siw). The device
/// decides what the configuration only asks for: Send With Invalidate is offered to peers
/// (RFC 8797) only when the device can honour it on our exposures.
#[cfg(feature = "ibv")]
pub fn spawn_ibv(
    spec: PollSpec,
    port: Port,
    ibv: rpcrdma_verbs::ibv::IbvConfig,
    notify: Box<dyn Fn() + Send>,
) -> std::io::Result<PollHandle> {
    spawn_with(spec, port, notify, move |spec| {
        let p =
            rpcrdma_verbs::ibv::IbvProvider::open(ibv).map_err(|e| format!("ibv provider: {e}"))?;
        spec.transport.remote_invalidation &= p.remote_invalidation();
        tracing::info!(
            device = p.device_name(),
            iwarp = p.is_iwarp(),
            memory_windows = p.uses_memory_windows(),
            remote_invalidation = spec.transport.remote_invalidation,
            "ibv provider open"
        );
        if p.windows_unbounded() {
            tracing::warn!(
                device = p.device_name(),
                "provider.ibv.exposure = \"memory-window\" on rxe: its windows do not keep a peer within them (a peer may reach all of an app's arena); for tests only"
            );
        }
        Ok(p)
    })
}

/// Starts a poll thread whose provider `open` makes on the thread itself (providers need not
/// be `Send`); `open` may adjust the spec to what the provider can do.
fn spawn_with<P: rpcrdma_verbs::Provider + 'static>(
    mut spec: PollSpec,
    port: Port,
    notify: Box<dyn Fn() + Send>,
    open: impl FnOnce(&mut PollSpec) -> Result<P, String> + Send + 'static,
) -> std::io::Result<PollHandle> {
    let commands = Arc::new(ArrayQueue::new(spec.queue_depth.max(4)));
    let events = Arc::new(ArrayQueue::new(spec.queue_depth.max(4)));
    let doorbell = port.doorbell()?;
    let (c, e) = (commands.clone(), events.clone());
    let name = format!("rpcrdma-poll{}", spec.index);
    let thread = std::thread::Builder::new().name(name).spawn(move || {
        let fail = |err: String, notify: Box<dyn Fn() + Send>| {
            let _ = e.push(Event::Failed(err));
            notify();
        };
        if let Some(core) = spec.core {
            if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
                return fail(format!("cannot pin the poll thread to core {core}"), notify);
            }
        }
        let provider = match open(&mut spec) {
            Ok(p) => p,
            Err(err) => return fail(err, notify),
        };
        match PollThread::new(spec, provider, port, c, e.clone(), notify) {
            Ok(mut t) => t.run(),
            Err((err, notify)) => fail(err, notify),
        }
    })?;
    Ok(PollHandle {
        commands,
        events,
        doorbell,
        thread: Some(thread),
    })
}
