//! Counters and latency histograms kept by a poll thread, and the snapshot that carries a
//! copy of them to the control thread.

use hdrhistogram::Histogram;
use std::net::SocketAddr;

/// Largest latency a histogram records (longer ones saturate): 60 s in nanoseconds.
pub const LATENCY_MAX_NS: u64 = 60_000_000_000;

/// Smallest latency the histogram records (values are nanoseconds).
pub const LATENCY_RESOLUTION_NS: u64 = 1;

/// Significant decimal digits kept (2: every value within 1 %, at every magnitude).
pub const LATENCY_SIGFIG: u8 = 2;

/// Counts per bucket (32 bits: saturate at 4 billion samples of one value).
pub type Count = u32;

/// A fixed-range latency histogram in nanoseconds (1 ns..=60 s, 2 significant digits,
/// 32-bit counts: about 15 KiB; never resizes), allocated only for connection slots that are
/// used: a poll thread sized for 1000 connections does not hold 1000 histograms before they
/// connect. `None` reads as empty.
#[derive(Debug, Clone, Default)]
pub struct Histo(Option<Box<Histogram<Count>>>);

impl Histo {
    /// An allocated, empty histogram of [`LATENCY_RESOLUTION_NS`]..=[`LATENCY_MAX_NS`].
    pub fn new() -> Histo {
        Histo(Some(Box::new(Self::fresh())))
    }

    fn fresh() -> Histogram<Count> {
        // Constant bounds that hdrhistogram accepts (low >= 1, high >= 2 * low, sigfig <= 5).
        Histogram::new_with_bounds(LATENCY_RESOLUTION_NS, LATENCY_MAX_NS, LATENCY_SIGFIG)
            .expect("valid constant bounds")
    }

    /// Allocates the histogram if this slot has none yet, and empties it (call when a
    /// connection is set up, never per message).
    pub fn ensure_empty(&mut self) {
        match self.0.as_mut() {
            Some(h) => h.reset(),
            None => self.0 = Some(Box::new(Self::fresh())),
        }
    }

    /// The histogram, if allocated.
    pub fn get(&self) -> Option<&Histogram<Count>> {
        self.0.as_deref()
    }

    /// Samples recorded.
    pub fn len(&self) -> u64 {
        self.get().map_or(0, Histogram::len)
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records one latency (clamped to the range, counts saturate; never allocates: a slot without a
    /// histogram drops the sample).
    #[inline]
    pub fn record(&mut self, ns: u64) {
        if let Some(h) = self.0.as_mut() {
            h.saturating_record(ns.clamp(1, LATENCY_MAX_NS));
        }
    }

    /// Adds `other`'s samples to these (an empty histogram takes a copy of `other`'s;
    /// control path).
    pub fn add(&mut self, other: &Histo) {
        match (self.0.as_mut(), other.get()) {
            // Same constant bounds on both sides: `add` cannot fail on range.
            (Some(d), Some(s)) => {
                let _ = d.add(s);
            }
            (None, Some(s)) => self.0 = Some(Box::new(s.clone())),
            (_, None) => {}
        }
    }

    /// Replaces the contents with `other`'s: no allocation when this one is allocated
    /// already (same bounds); otherwise allocates once (snapshot buffers, control path).
    pub fn copy_from(&mut self, other: &Histo) {
        match (self.0.as_mut(), other.get()) {
            (Some(d), Some(s)) => {
                d.reset();
                let _ = d.add(s);
            }
            (Some(d), None) => d.reset(),
            (None, Some(s)) => self.0 = Some(Box::new(s.clone())),
            (None, None) => {}
        }
    }

    /// Bytes the histogram holds on the heap (0 when not allocated).
    pub fn heap_bytes(&self) -> usize {
        self.get().map_or(0, |h| {
            std::mem::size_of::<Histogram<Count>>()
                + h.distinct_values() * std::mem::size_of::<Count>()
        })
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
    /// Hops (calls, answers, served calls) sent to other poll threads.
    pub hops_out: u64,
    /// Hops received from other poll threads.
    pub hops_in: u64,
    /// Hops kept back because the queue to another thread was full (sent later, in order).
    pub hops_deferred: u64,
    /// Times an empty poll handed the CPU away (`sched_yield`; `IdleSpec::Yield` only).
    pub yields: u64,
    /// Work completions polled (receives, and the Sends, Reads, Writes and invalidations
    /// posted signalled): per RPC, what selective signalling leaves.
    pub completions: u64,
    /// Closed connections whose calls ended without their send queue's drain marker, after
    /// waiting [`DRAIN_WAIT`](crate::driver::DRAIN_WAIT) for it (the device took the marker
    /// and did not report it; see [`Driver::close`](crate::Driver::close)). Zero on a sound
    /// device.
    pub drains_overdue: u64,
    /// The RDMA device's asynchronous events so far (the `ibv` provider; each failure has
    /// ended the connections it concerned, see [`Provider::device_events`]).
    ///
    /// [`Provider::device_events`]: rpcrdma_verbs::Provider::device_events
    pub device: rpcrdma_verbs::DeviceEvents,
    /// Apps attached now.
    pub apps: usize,
    /// RPC operations of apps in flight now.
    pub app_ops: usize,
    /// App submissions refused by validation.
    pub bad_submissions: u64,
    /// Connection requests refused, by reason (listener rules, no slot, draining).
    pub connects_refused: super::Refused,
    /// Connection requests its listeners admitted and handed to another poll thread, the one
    /// with the fewest connections (`listeners[].spread`).
    pub conns_handed_over: u64,
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
    /// Connections closed and removed whose queue pair the device is not done with yet
    /// ([`Driver::retiring`](crate::Driver::retiring)): their calls' ends wait for it. Zero
    /// or a few at a time on a sound device (rxe and siw: a turn or two; hardware: until
    /// Last WQE Reached, at most a second).
    pub conns_retiring: usize,
    /// Incoming calls waiting now for a receive buffer of the app that serves them (it has
    /// every buffer it posted in use: it posts too few for the calls it is sent, or is slow).
    pub calls_held: usize,
    /// Incoming calls that had to wait for a receive buffer of their serving app.
    pub calls_held_total: u64,
    /// Calls of apps waiting now for a free call slot of their connection.
    pub calls_waiting_slot: usize,
    /// Free and total buffers of the send and receive pools.
    pub buffers: crate::driver::BufferCounts,
    /// Totals over every connection this thread has had (closed ones included).
    pub totals: Totals,
}

impl ConnInfo {
    /// This connection's share of its thread's [`Totals`] (the connection counts zero).
    pub fn totals(&self) -> Totals {
        Totals {
            calls_out: self.calls_out,
            replies_in: self.replies_in,
            calls_in: self.calls_in,
            replies_out: self.replies_out,
            call_errors: self.call_errors,
            protocol_errors: self.protocol_errors,
            bytes_out: self.bytes_out,
            bytes_in: self.bytes_in,
            conns_opened: 0,
            conns_closed: 0,
        }
    }
}

impl std::ops::AddAssign for Totals {
    fn add_assign(&mut self, o: Totals) {
        self.calls_out = self.calls_out.saturating_add(o.calls_out);
        self.replies_in = self.replies_in.saturating_add(o.replies_in);
        self.calls_in = self.calls_in.saturating_add(o.calls_in);
        self.replies_out = self.replies_out.saturating_add(o.replies_out);
        self.call_errors = self.call_errors.saturating_add(o.call_errors);
        self.protocol_errors = self.protocol_errors.saturating_add(o.protocol_errors);
        self.bytes_out = self.bytes_out.saturating_add(o.bytes_out);
        self.bytes_in = self.bytes_in.saturating_add(o.bytes_in);
        self.conns_opened = self.conns_opened.saturating_add(o.conns_opened);
        self.conns_closed = self.conns_closed.saturating_add(o.conns_closed);
    }
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
    /// App slots (`apps[..n_apps]` are valid); none unless [`Snapshot::with_apps`] made room.
    pub apps: Vec<rpcrdma_shm::daemon::AppInfo>,
    /// Valid entries of `apps`.
    pub n_apps: usize,
    /// The thread's listeners (`listeners[..n_listeners]` are valid); none unless
    /// [`Snapshot::with_listeners`] made room.
    pub listeners: Vec<ListenerStats>,
    /// Valid entries of `listeners`.
    pub n_listeners: usize,
}

/// One listener's admissions, kept by the poll thread it listens on (its connections may
/// live on any thread: `listeners[].spread`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListenerStats {
    /// Its index in the configuration.
    pub index: usize,
    /// Its bound address.
    pub addr: Option<std::net::SocketAddr>,
    /// Connections it admitted that are not over yet (on any thread).
    pub connections: u64,
    /// Connection requests it admitted.
    pub admitted: u64,
    /// Connection requests refused, by reason (at the listener, or by the thread it handed
    /// the request to).
    pub refused: super::Refused,
}

impl Snapshot {
    /// A snapshot with room for `max_conns` connections.
    pub fn with_capacity(max_conns: usize) -> Snapshot {
        Snapshot {
            thread: ThreadStats::default(),
            conns: (0..max_conns).map(|_| ConnStats::default()).collect(),
            n: 0,
            apps: Vec::new(),
            n_apps: 0,
            listeners: Vec::new(),
            n_listeners: 0,
        }
    }

    /// Makes room for `n` listeners' entries.
    pub fn with_listeners(mut self, n: usize) -> Snapshot {
        self.listeners = vec![ListenerStats::default(); n];
        self
    }

    /// The valid listener entries.
    pub fn listeners(&self) -> &[ListenerStats] {
        self.listeners.get(..self.n_listeners).unwrap_or(&[])
    }

    /// Makes room for `max_apps` attached apps (the poll thread fills what there is room for).
    pub fn with_apps(mut self, max_apps: usize) -> Snapshot {
        self.apps = vec![rpcrdma_shm::daemon::AppInfo::default(); max_apps];
        self
    }

    /// The valid connection entries.
    pub fn conns(&self) -> &[ConnStats] {
        self.conns.get(..self.n).unwrap_or(&[])
    }

    /// The valid app entries.
    pub fn apps(&self) -> &[rpcrdma_shm::daemon::AppInfo] {
        self.apps.get(..self.n_apps).unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_lazy_small_and_within_one_percent() {
        let mut unused = Histo::default();
        unused.record(5_000);
        assert!(
            unused.is_empty() && unused.heap_bytes() == 0,
            "no slot, no sample"
        );
        let mut h = Histo::default();
        h.ensure_empty();
        for ns in [800, 4_000, 15_000, 15_000, 3_000_000, 120_000_000_000] {
            h.record(ns);
        }
        let g = h.get().expect("allocated");
        assert_eq!(g.len(), 6);
        let p50 = g.value_at_quantile(0.5) as f64;
        assert!((p50 - 15_000.0).abs() / 15_000.0 < 0.01, "{p50}");
        assert!(
            g.max() as f64 >= LATENCY_MAX_NS as f64 * 0.99,
            "saturates at 60 s"
        );
        assert!(h.heap_bytes() < 16 << 10, "{} bytes", h.heap_bytes());
        let mut copy = Histo::default();
        copy.copy_from(&h);
        assert_eq!(copy.len(), 6);
        h.ensure_empty();
        copy.copy_from(&h);
        assert!(copy.is_empty());
    }
}
