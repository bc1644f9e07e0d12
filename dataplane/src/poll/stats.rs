//! Counters and latency histograms kept by a poll thread, and the snapshot that carries a
//! copy of them to the control thread.

use hdrhistogram::Histogram;
use std::net::SocketAddr;

/// Largest latency a histogram records (longer ones saturate): 60 s in nanoseconds.
pub const LATENCY_MAX_NS: u64 = 60_000_000_000;

/// A fixed-range latency histogram in nanoseconds (3 significant digits, never resizes).
#[derive(Debug, Clone)]
pub struct Histo(pub Histogram<u64>);

impl Histo {
    /// An empty histogram of 1 ns..=[`LATENCY_MAX_NS`].
    pub fn new() -> Histo {
        // Constant bounds that hdrhistogram accepts (low >= 1, high >= 2 * low, sigfig <= 5).
        Histo(Histogram::new_with_bounds(1, LATENCY_MAX_NS, 3).expect("valid constant bounds"))
    }

    /// Records one latency (clamped to the range; never allocates).
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.0.saturating_record(ns.clamp(1, LATENCY_MAX_NS));
    }

    /// Replaces the contents with `other`'s (same bounds: no allocation).
    pub fn copy_from(&mut self, other: &Histo) {
        self.0.reset();
        let _ = self.0.add(&other.0);
    }
}

impl Default for Histo {
    fn default() -> Self {
        Histo::new()
    }
}

/// Connection life cycle as reported to operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConnState {
    /// Free slot.
    #[default]
    Free,
    /// Connection establishment in progress.
    Connecting,
    /// Carrying RPCs.
    Up,
    /// Draining or disconnecting.
    Closing,
}

impl ConnState {
    /// Lower-case name for tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnState::Free => "free",
            ConnState::Connecting => "connecting",
            ConnState::Up => "up",
            ConnState::Closing => "closing",
        }
    }
}

/// One connection's counters and latency histogram.
#[derive(Debug, Clone, Default)]
pub struct ConnStats {
    /// Counters and settings (plain data: copied without allocation).
    pub info: ConnInfo,
    /// Round-trip latency of our calls (submission to reply), nanoseconds.
    pub latency: Histo,
}

/// One connection's counters and settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnInfo {
    /// Connection id.
    pub id: u32,
    /// State.
    pub state: ConnState,
    /// Peer index (outgoing connections).
    pub peer: Option<u32>,
    /// Remote address.
    pub remote: Option<SocketAddr>,
    /// Whether we initiated it.
    pub client: bool,
    /// Protocol version in use (0 until known).
    pub version: u32,
    /// Credits granted to us by the peer (requester side).
    pub credits_granted: u32,
    /// Credits we grant.
    pub credits_offered: u32,
    /// Our inline send / receive sizes.
    pub inline_send: u32,
    /// Our receive size.
    pub inline_recv: u32,
    /// The peer's RFC 8797 private data: send size, receive size, remote invalidation.
    pub peer_private: Option<(u32, u32, bool)>,
    /// Calls we sent as requester.
    pub calls_out: u64,
    /// Replies we received for them.
    pub replies_in: u64,
    /// Calls we received as responder.
    pub calls_in: u64,
    /// Replies we sent.
    pub replies_out: u64,
    /// Calls that failed (transport error, cancelled, refused).
    pub call_errors: u64,
    /// Payload bytes sent (Sends and RDMA Writes).
    pub bytes_out: u64,
    /// Payload bytes received (receives and RDMA Reads).
    pub bytes_in: u64,
    /// RPC-over-RDMA errors sent or received (RDMA_ERROR, protocol violations).
    pub protocol_errors: u64,
    /// The engine's own counters for this connection (chunks, RDMA bytes, errors, stalls).
    pub engine: crate::conn::Stats,
}

/// Per-thread loop accounting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadStats {
    /// Thread index.
    pub index: usize,
    /// Core it is pinned to.
    pub core: Option<usize>,
    /// Loop iterations that found work.
    pub busy_polls: u64,
    /// Loop iterations that found none.
    pub idle_polls: u64,
    /// Nanoseconds spent in iterations that found work.
    pub busy_ns: u64,
    /// Nanoseconds spent idle (empty polls, pauses, parking).
    pub idle_ns: u64,
    /// Times the thread parked.
    pub parks: u64,
    /// Apps attached now.
    pub apps: usize,
    /// RPC operations of apps in flight now.
    pub app_ops: usize,
    /// App submissions refused by validation.
    pub bad_submissions: u64,
    /// Apps detached (closed, crashed, stalled).
    pub apps_detached: u64,
    /// Memory regions registered with the provider now (the buffer pool, the apps' arenas,
    /// and the arenas of gone apps the engine may still touch).
    pub regions: usize,
    /// Bytes of those regions.
    pub region_bytes: u64,
    /// RPCs the engine carries for apps now: calls sent and not yet answered, plus calls
    /// received and not yet answered.
    pub rpcs_in_flight: usize,
    /// Free and total buffers of the send and receive pools.
    pub buffers: crate::driver::BufferCounts,
    /// Totals over every connection this thread has had (closed ones included).
    pub totals: Totals,
}

/// Monotonic totals of a thread, summed by the control thread across threads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Calls sent.
    pub calls_out: u64,
    /// Replies received.
    pub replies_in: u64,
    /// Calls received.
    pub calls_in: u64,
    /// Replies sent.
    pub replies_out: u64,
    /// Failed calls.
    pub call_errors: u64,
    /// Protocol errors.
    pub protocol_errors: u64,
    /// Payload bytes sent.
    pub bytes_out: u64,
    /// Payload bytes received.
    pub bytes_in: u64,
    /// Connections established.
    pub conns_opened: u64,
    /// Connections ended.
    pub conns_closed: u64,
}

/// A copy of one poll thread's statistics, allocated by the control thread and filled by
/// the poll thread in place.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Thread-wide counters.
    pub thread: ThreadStats,
    /// Connection slots (`conns[..n]` are valid).
    pub conns: Vec<ConnStats>,
    /// Valid entries of `conns`.
    pub n: usize,
}

impl Snapshot {
    /// A snapshot with room for `max_conns` connections.
    pub fn with_capacity(max_conns: usize) -> Snapshot {
        Snapshot {
            thread: ThreadStats::default(),
            conns: (0..max_conns).map(|_| ConnStats::default()).collect(),
            n: 0,
        }
    }

    /// The valid connection entries.
    pub fn conns(&self) -> &[ConnStats] {
        self.conns.get(..self.n).unwrap_or(&[])
    }
}
