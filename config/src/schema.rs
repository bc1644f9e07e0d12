//! The configuration types: one schema for the TOML file and the admin JSON (kebab-case keys).

use serde::{Deserialize, Serialize};

/// The RPC-over-RDMA well-known port (RFC 8166 §9 / RFC 5666), used when an address omits it.
pub const DEFAULT_PORT: u16 = 20049;

/// Largest size RFC 8797 private data can express: (255 + 1) KiB.
pub const RFC8797_MAX_SIZE: u32 = 256 * 1024;

/// Smallest inline size any RPC-over-RDMA peer must support (RFC 8166 §3.3.3).
pub const MIN_INLINE_SIZE: u32 = 1024;

/// The whole daemon configuration, as read from one TOML file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Config {
    /// Sockets, logging and metrics of the daemon process.
    pub daemon: Daemon,
    /// Which cores run the poll threads and the control thread, and how idle pollers wait.
    pub cpu: Cpu,
    /// The RDMA provider: a real NIC through rdma-core, or the user-space iWARP over TCP.
    pub provider: Provider,
    /// RPC-over-RDMA protocol parameters applied to every connection.
    pub transport: Transport,
    /// Pre-registered buffer pools of each poll thread.
    pub pools: Pools,
    /// Addresses the daemon accepts RPC-over-RDMA connections on.
    pub listeners: Vec<Listener>,
    /// Remote daemons or servers this daemon connects to.
    pub peers: Vec<Peer>,
    /// Limits and sizes of the shared-memory interface to applications.
    pub apps: Apps,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// One readable line per event.
    Human,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Lowest severity that is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogLevel {
    /// Failures only.
    Error,
    /// Failures and suspicious events.
    Warn,
    /// Connection and configuration events.
    Info,
    /// Per-connection detail (the hot path logs nothing above this level).
    Debug,
    /// Everything.
    Trace,
}

/// Daemon process settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Daemon {
    /// Unix socket applications connect to for attaching their shared-memory rings.
    pub app_socket: String,
    /// Unix socket `rpcrdmactl` talks JSON to.
    pub admin_socket: String,
    /// Log line format.
    pub log_format: LogFormat,
    /// Lowest severity that is logged.
    pub log_level: LogLevel,
    /// `ip:port` to serve metrics on; absent means no metrics endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<String>,
}

impl Default for Daemon {
    fn default() -> Self {
        Self {
            app_socket: "/tmp/rpcrdmad/app.sock".into(),
            admin_socket: "/tmp/rpcrdmad/admin.sock".into(),
            log_format: LogFormat::Human,
            log_level: LogLevel::Info,
            metrics_listen: None,
        }
    }
}

/// Core assignment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Cpu {
    /// One poll thread per listed core, pinned to it; empty means one unpinned poll thread.
    pub poll_cores: Vec<u32>,
    /// Core the control thread is pinned to; absent means not pinned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control_core: Option<u32>,
    /// How a poll thread waits when it finds no work.
    pub idle: Idle,
}

/// What a poll thread does when a poll finds nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IdlePolicy {
    /// Busy-poll forever: lowest latency, one core at 100 %.
    Spin,
    /// Spin briefly, then sleep with growing pauses, then park until work arrives.
    Backoff,
    /// Poll, yielding the CPU (`sched_yield`) after each empty poll, then park until work arrives: never
    /// sleeps while there is work nearby, yet gives its core to the apps on a host with few cores.
    Yield,
}

/// Idle policy and its thresholds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Idle {
    /// Spin or back off; `backoff` keeps tests and laptops from burning a core.
    pub policy: IdlePolicy,
    /// How long an idle thread spins before backing off, in microseconds (backoff only).
    pub spin_us: u32,
    /// Deprecated: empty polls before backing off (backoff only); when present it is used
    /// instead of `spin_us`. How long that lasts follows what an empty poll costs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spin_polls: Option<u32>,
    /// Longest pause between polls while backing off, in microseconds (backoff only).
    pub backoff_max_us: u32,
    /// Idle time after which the thread parks until woken by work, in microseconds (backoff and yield).
    pub park_after_us: u32,
}

impl Default for Idle {
    fn default() -> Self {
        Self {
            policy: IdlePolicy::Backoff,
            spin_us: 1000,
            spin_polls: None,
            backoff_max_us: 100,
            park_after_us: 10_000,
        }
    }
}

/// RDMA provider kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderKind {
    /// User-space iWARP (the Linux `siw` wire) over TCP; needs no RDMA hardware.
    Soft,
    /// An RDMA NIC through rdma-core (libibverbs).
    Ibv,
    /// The soft provider over an in-memory fabric inside the daemon: its peers connect to its
    /// own listeners through memory (no socket on the data path; for tests and benchmarks).
    Mem,
}

impl ProviderKind {
    /// The name used in the configuration file (`provider.kind`).
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::Soft => "soft",
            ProviderKind::Ibv => "ibv",
            ProviderKind::Mem => "mem",
        }
    }
}

/// Provider selection and per-provider settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Provider {
    /// Provider used by listeners and peers that do not name one.
    pub kind: ProviderKind,
    /// Settings of the `ibv` provider.
    pub ibv: Ibv,
    /// Settings of the `soft` provider.
    pub soft: Soft,
}

impl Default for Provider {
    fn default() -> Self {
        Self {
            kind: ProviderKind::Soft,
            ibv: Ibv::default(),
            soft: Soft::default(),
        }
    }
}

/// rdma-core device selection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Ibv {
    /// Device name as `ibv_devices` prints it (e.g. `mlx5_0`); absent means the first device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Port number on the device (ports count from 1).
    pub port: u32,
    /// Index in the port's GID table (selects RoCE version and IP address).
    pub gid_index: u32,
    /// Inbound RDMA Read depth offered to the peer (rdma_cm responder resources).
    pub ird: u32,
    /// Outbound RDMA Read depth asked of the peer (rdma_cm initiator depth).
    pub ord: u32,
    /// How the peer is given access to the memory of one RPC's chunks.
    pub exposure: IbvExposure,
}

impl Default for Ibv {
    fn default() -> Self {
        Self {
            device: None,
            port: 1,
            gid_index: 0,
            ird: 16,
            ord: 16,
            exposure: IbvExposure::Auto,
        }
    }
}

/// How the `ibv` provider exposes an RPC's chunks to the peer (`provider.ibv.exposure`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IbvExposure {
    /// Type 2 memory windows where the device has them and they keep the peer within the
    /// window; else a memory region per exposure.
    Auto,
    /// Type 2 memory windows, bound per RPC to its queue pair (the daemon does not start on a
    /// device without them). The peer may then invalidate them with Send With Invalidate.
    MemoryWindow,
    /// A memory region registered per exposure (a system call each), without remote
    /// invalidation.
    Region,
}

/// User-space iWARP (MPA/DDP/RDMAP over TCP) settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Soft {
    /// Largest MPA FPDU sent, in bytes (siw uses the TCP MSS: 1448 on Ethernet).
    pub fpdu_size: u32,
    /// Request MPA CRC-32C; it is used when either side asks for it (RFC 5044).
    pub crc: bool,
    /// MPA revision; 2 carries IRD/ORD (RFC 6581), which the Linux NFS server requires.
    pub mpa_revision: u32,
    /// Inbound RDMA Read depth advertised to the peer.
    pub ird: u32,
    /// Outbound RDMA Read depth requested from the peer.
    pub ord: u32,
    /// Accepted TCP streams whose MPA Request is not settled yet that a poll thread holds at
    /// once; beyond them new streams wait in the kernel's listen backlog.
    pub max_pending: u32,
}

impl Default for Soft {
    fn default() -> Self {
        Self {
            fpdu_size: 1448,
            crc: false,
            mpa_revision: 2,
            ird: 16,
            ord: 16,
            max_pending: 256,
        }
    }
}

/// RPC-over-RDMA protocol parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Transport {
    /// Highest RPC-over-RDMA version offered: 1 (RFC 8166) or 2 (falls back to 1 when the peer is v1-only).
    pub version: u32,
    /// Largest inline Send, in bytes; advertised in RFC 8797 private data.
    pub inline_send: u32,
    /// Size of each posted receive buffer, in bytes; advertised in RFC 8797 private data.
    pub inline_recv: u32,
    /// Forward-direction credits granted or requested per connection.
    pub credits: u32,
    /// Backward-direction (callback) credits per connection; 0 disables the backchannel.
    pub backchannel_credits: u32,
    /// Data items (DDP-eligible) at least this many bytes travel in chunks instead of inline.
    pub ddp_threshold: u32,
    /// Largest number of segments accepted or sent in one chunk.
    pub max_segments_per_chunk: u32,
    /// Largest number of chunks accepted or sent in one Read or Write list.
    pub max_chunks_per_list: u32,
    /// Offer and use Send With Invalidate (RFC 8797 flag; v2 REQREMINV).
    pub remote_invalidation: bool,
    /// Milliseconds to wait for an answer to the first v2 message before reconnecting with v1 (AMB-33).
    pub v2_first_message_timeout_ms: u32,
    /// Bounds on characteristic changes a v2 peer may request (xcharext REQXCH).
    pub xcharext: Xcharext,
}

impl Default for Transport {
    fn default() -> Self {
        Self {
            version: 1,
            inline_send: 4096,
            inline_recv: 4096,
            credits: 64,
            backchannel_credits: 8,
            ddp_threshold: 1024,
            max_segments_per_chunk: 16,
            max_chunks_per_list: 4,
            remote_invalidation: true,
            v2_first_message_timeout_ms: 3000,
            xcharext: Xcharext::default(),
        }
    }
}

/// Policy for xcharext change requests received from a peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Xcharext {
    /// Smallest receive buffer size (RBSIZ) a peer's REQXCH may ask for; smaller requests are rejected.
    pub min_rbsiz: u32,
    /// Largest receive buffer size (RBSIZ) a peer's REQXCH may ask for; larger requests are rejected.
    pub max_rbsiz: u32,
    /// Whether a REQXCH may change REQREMINV after INITXCH (XCH-3.2-c expects it not to).
    pub reqreminv_may_change: bool,
}

impl Default for Xcharext {
    fn default() -> Self {
        Self {
            min_rbsiz: 1024,
            max_rbsiz: 8192,
            reqreminv_may_change: false,
        }
    }
}

/// Buffer pools of each poll thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Pools {
    /// Connections the pools are sized for (each gets `recv-buffers / connections` receives).
    pub connections: u32,
    /// Registered send buffers, one pool shared by the thread's connections.
    pub send_buffers: u32,
    /// Bytes per send buffer; at least `transport.inline-send` (buffers are registered at
    /// `inline-send` plus a 128-byte engine tail).
    pub send_buffer_size: u32,
    /// Registered receive buffers, one shared receive queue for the thread's connections.
    pub recv_buffers: u32,
    /// Bytes per receive buffer; at least `transport.inline-recv` and `transport.xcharext.max-rbsiz`.
    pub recv_buffer_size: u32,
    /// Where connections take their receive buffers from.
    pub receive_queue: ReceiveQueue,
}

impl Default for Pools {
    fn default() -> Self {
        Self {
            connections: 4,
            send_buffers: 1024,
            send_buffer_size: 4096,
            recv_buffers: 512,
            recv_buffer_size: 8192,
            receive_queue: ReceiveQueue::Shared,
        }
    }
}

/// Where a poll thread's connections take their receive buffers from (`pools.receive-queue`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReceiveQueue {
    /// One shared receive queue per poll thread (`pools.recv-buffers`): receive memory does
    /// not grow with connections × credits. On iWARP a peer that sends far past its grant can
    /// empty the queue before the poll thread reposts, and another peer's Send arriving then
    /// ends that other connection.
    #[default]
    Shared,
    /// A receive queue of its own for each connection (its credits, backchannel credits and
    /// one spare) and its own send buffers: a burst past the grant reaches only the sender's
    /// queue. Memory grows with connections × credits; `recv-buffers` and `send-buffers` are
    /// not used.
    PerConnection,
}

/// One listening address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Listener {
    /// `ip:port` or `ip` (port 20049); `[v6]:port` for IPv6 with a port.
    pub address: String,
    /// Provider for this listener; absent means `provider.kind`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderKind>,
    /// Networks (`192.0.2.0/24`, `2001:db8::/32`) or addresses connections may come from;
    /// empty: any.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Most connections one host holds on this listener at once; 0: no cap.
    #[serde(default)]
    pub max_connections_per_host: u32,
    /// Most new connections one host opens per second on this listener (bursts up to
    /// `max(rate, max-connections-per-host)`); 0: no cap.
    #[serde(default)]
    pub connect_rate_per_host: u32,
    /// Whether admitted connections go to the poll thread with the fewest connections
    /// (true), or all stay on the listener's own thread.
    #[serde(default = "default_spread")]
    pub spread: bool,
}

fn default_spread() -> bool {
    true
}

/// One remote endpoint to keep connected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Peer {
    /// Unique name apps use to address this peer.
    pub name: String,
    /// `ip:port` or `ip` (port 20049) of the peer's listener.
    pub address: String,
    /// Provider for this peer; absent means `provider.kind`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderKind>,
    /// First reconnect delay after a failure, in milliseconds; doubles per failure.
    #[serde(default = "default_reconnect_initial_ms")]
    pub reconnect_initial_ms: u32,
    /// Longest reconnect delay, in milliseconds.
    #[serde(default = "default_reconnect_max_ms")]
    pub reconnect_max_ms: u32,
}

fn default_reconnect_initial_ms() -> u32 {
    100
}

fn default_reconnect_max_ms() -> u32 {
    30_000
}

/// Shared-memory interface to applications.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Apps {
    /// Largest number of attached applications.
    pub max_apps: u32,
    /// Entries in each app's submission ring; a power of two.
    pub sq_entries: u32,
    /// Entries in each app's completion ring; a power of two.
    pub cq_entries: u32,
    /// Bytes of each app's shared arena (messages and DDP buffers); a multiple of 4096.
    pub arena_size: u64,
}

impl Default for Apps {
    fn default() -> Self {
        Self {
            max_apps: 16,
            sq_entries: 256,
            cq_entries: 256,
            arena_size: 16 << 20,
        }
    }
}
