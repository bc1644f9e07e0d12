//! The admin protocol: one JSON request per line on the admin Unix socket, one JSON response
//! per line back. `rpcrdmactl` and the daemon share these types.

use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Largest request line the daemon reads.
pub const MAX_REQUEST: usize = 64 * 1024;

/// A request from `rpcrdmactl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    /// Daemon, threads, listeners, peers.
    Status,
    /// Every connection.
    Conns,
    /// One connection in detail.
    ConnShow {
        /// Connection id.
        conn: u32,
    },
    /// Disconnect one connection (a configured peer is reconnected after its backoff).
    ConnClose {
        /// Connection id.
        conn: u32,
    },
    /// Forget that a configured peer is version-1-only (AMB-33) and reconnect it offering
    /// version 2.
    PeerRetryV2 {
        /// Peer name (from the config, as `status` lists it).
        peer: String,
    },
    /// Counters per connection and per thread.
    Stats,
    /// Latency percentiles per connection.
    Latency,
    /// Latency percentiles per peer, over all its connections (ended ones included).
    PeerLatency,
    /// The attached apps: pid, programs served, operations and counters.
    Apps,
    /// Re-read the config file: apply what can change live, refuse the rest.
    Reload,
    /// Ask the peer to change characteristics (ROPT_REQXCH).
    XcharRequest {
        /// Connection id.
        conn: u32,
        /// `name=value` pairs, e.g. `rbsize=8192`.
        set: Vec<String>,
    },
    /// Announce our characteristics changed (unsolicited ROPT_UPDXCH).
    XcharSet {
        /// Connection id.
        conn: u32,
        /// `name=value` pairs.
        set: Vec<String>,
    },
}

/// The daemon's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Response {
    /// Whether the request succeeded.
    pub ok: bool,
    /// Why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The result (shape depends on the request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
}

impl Response {
    /// A success carrying `v`.
    pub fn ok(v: impl Serialize) -> Response {
        match serde_json::to_value(v) {
            Ok(result) => Response {
                ok: true,
                error: None,
                result: Some(result),
            },
            Err(e) => Response::err(format!("cannot encode the result: {e}")),
        }
    }

    /// A failure.
    pub fn err(msg: impl Into<String>) -> Response {
        Response {
            ok: false,
            error: Some(msg.into()),
            result: None,
        }
    }
}

/// `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Status {
    /// Daemon version.
    pub version: String,
    /// Process id.
    pub pid: u32,
    /// Seconds since start.
    pub uptime_s: u64,
    /// Config file.
    pub config: String,
    /// Provider kind.
    pub provider: String,
    /// "running" or "draining".
    pub state: String,
    /// Bound listener addresses.
    pub listeners: Vec<String>,
    /// Configured peers.
    pub peers: Vec<PeerStatus>,
    /// Poll threads.
    pub threads: Vec<ThreadStatus>,
    /// Connections up.
    pub conns_up: usize,
    /// Apps attached.
    pub apps: usize,
}

/// One configured peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PeerStatus {
    /// Name apps use.
    pub name: String,
    /// Address.
    pub address: String,
    /// "up", "connecting", "backoff" or "stopped".
    pub state: String,
    /// Connection id when up.
    pub conn: Option<u32>,
    /// Failed attempts since the last success.
    pub failures: u32,
    /// Milliseconds until the next attempt (backoff).
    pub retry_in_ms: Option<u64>,
    /// Why the last attempt failed or the last connection ended, until the peer is up again
    /// ("connect failed: the peer refused or did not answer").
    #[serde(default)]
    pub last_error: Option<String>,
    /// RPC-over-RDMA version offered to this peer: 1 once it is marked version-1-only
    /// because it never answered version two (AMB-33).
    pub version: u32,
}

/// One poll thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ThreadStatus {
    /// Index.
    pub index: usize,
    /// Pinned core.
    pub core: Option<usize>,
    /// Share of time spent on iterations that found work (0..=1).
    pub busy_ratio: f64,
    /// Time spent on iterations that found work, since the thread started (ns).
    #[serde(default)]
    pub busy_ns: u64,
    /// Time spent on iterations that found none, parked included (ns).
    #[serde(default)]
    pub idle_ns: u64,
    /// Loop iterations with work.
    pub busy_polls: u64,
    /// Loop iterations without.
    pub idle_polls: u64,
    /// Times parked.
    pub parks: u64,
    /// Hops sent to other poll threads (calls and answers between an app and a connection
    /// on different threads).
    pub hops_out: u64,
    /// Hops received from other poll threads.
    pub hops_in: u64,
    /// Hops held back because the queue to another thread was full.
    pub hops_deferred: u64,
    /// Empty polls that yielded the CPU (`cpu.idle.policy = "yield"`).
    #[serde(default)]
    pub yields: u64,
    /// Work completions polled (receives, and Sends, Reads, Writes and invalidations posted
    /// signalled).
    #[serde(default)]
    pub completions: u64,
    /// Closed connections whose calls ended without waiting longer for their send queue's
    /// drain marker (the device did not report it in time; zero on a sound device).
    #[serde(default)]
    pub drains_overdue: u64,
    /// Apps attached.
    pub apps: usize,
    /// App operations in flight.
    pub app_ops: usize,
    /// Submissions refused.
    pub bad_submissions: u64,
    /// Connection requests refused, by reason.
    #[serde(default)]
    pub connects_refused: ConnectsRefused,
    /// Connection requests its listeners admitted and handed to another poll thread
    /// (`listeners[].spread`).
    #[serde(default)]
    pub conns_handed_over: u64,
    /// Apps detached so far.
    pub apps_detached: u64,
    /// Memory regions registered with the provider (buffer pool, app arenas).
    pub regions: usize,
    /// Bytes of those regions.
    pub region_bytes: u64,
    /// RPCs the engine carries for apps (calls awaiting replies, calls being served).
    pub rpcs_in_flight: usize,
    /// Closed connections whose queue pair the device still holds (their calls' ends wait
    /// for it; see dataplane/README.md "Closing a connection").
    #[serde(default)]
    pub conns_retiring: usize,
    /// Incoming calls waiting now for a receive buffer of their serving app.
    #[serde(default)]
    pub calls_held: usize,
    /// Incoming calls that had to wait for a receive buffer of their serving app.
    #[serde(default)]
    pub calls_held_total: u64,
    /// Calls waiting now for a free call slot of their connection.
    #[serde(default)]
    pub calls_waiting_slot: usize,
    /// The RDMA device's asynchronous events so far (zero on the soft provider).
    #[serde(default)]
    pub device_events: DeviceEventCounts,
    /// Send buffers free.
    pub send_buffers_free: u64,
    /// Send buffers in the pool.
    pub send_buffers: u64,
    /// Receive buffers free (posted, or in unused pool blocks).
    pub recv_buffers_free: u64,
    /// Receive buffers in the pool.
    pub recv_buffers: u64,
}

/// A poll thread's RDMA device events (`ibv_get_async_event`), counted since it opened the
/// device; every failure among them ended the connections it concerned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct DeviceEventCounts {
    /// Queue pairs the device failed on its own.
    pub qp_errors: u64,
    /// Completion queue errors (overruns).
    pub cq_errors: u64,
    /// Shared receive queue errors.
    pub srq_errors: u64,
    /// Fatal device errors.
    pub device_fatal: u64,
    /// The port going down.
    pub port_down: u64,
    /// The port becoming active again.
    pub port_up: u64,
    /// Queue pairs on the shared receive queue that reached their last receive after an
    /// error (IBTA's Last WQE Reached; none on rxe and siw).
    #[serde(default)]
    pub last_wqe_reached: u64,
    /// Closed queue pairs destroyed before the device said it was done with them (Last WQE
    /// Reached on hardware; rxe and siw: their last completion) within 1 s: buffers they
    /// took may be lost to the pool.
    #[serde(default)]
    pub retire_timeouts: u64,
}

impl From<rpcrdma_verbs::DeviceEvents> for DeviceEventCounts {
    fn from(d: rpcrdma_verbs::DeviceEvents) -> Self {
        DeviceEventCounts {
            qp_errors: d.qp_errors,
            cq_errors: d.cq_errors,
            srq_errors: d.srq_errors,
            device_fatal: d.device_fatal,
            port_down: d.port_down,
            port_up: d.port_up,
            last_wqe_reached: d.last_wqe_reached,
            retire_timeouts: d.retire_timeouts,
        }
    }
}

/// Connection requests a poll thread refused, by reason (config/CONFIG.md, "Admission").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ConnectsRefused {
    /// Not in the listener's allow list.
    pub not_allowed: u64,
    /// The host held `max-connections-per-host`.
    pub host_limit: u64,
    /// The host connected faster than `connect-rate-per-host`.
    pub rate: u64,
    /// No free connection slot.
    pub full: u64,
    /// The daemon was stopping.
    pub draining: u64,
}

impl From<rpcrdma_dataplane::poll::Refused> for ConnectsRefused {
    fn from(r: rpcrdma_dataplane::poll::Refused) -> Self {
        use rpcrdma_dataplane::poll::Refusal;
        ConnectsRefused {
            not_allowed: r.get(Refusal::NotAllowed),
            host_limit: r.get(Refusal::HostLimit),
            rate: r.get(Refusal::Rate),
            full: r.get(Refusal::Full),
            draining: r.get(Refusal::Draining),
        }
    }
}

/// RDMA_ERROR messages of one direction, by error code.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ErrorsByCode {
    /// ERR_VERS and RDMA2_ERR_VERS.
    pub err_vers: u64,
    /// ERR_CHUNK (version 1).
    pub err_chunk: u64,
    /// RDMA2_ERR_BAD_HEADER.
    pub bad_header: u64,
    /// RDMA2_ERR_INVAL_OPTION.
    pub inval_option: u64,
}

impl From<rpcrdma_dataplane::ErrorCounts> for ErrorsByCode {
    fn from(e: rpcrdma_dataplane::ErrorCounts) -> Self {
        ErrorsByCode {
            err_vers: e.vers,
            err_chunk: e.chunk,
            bad_header: e.bad_header,
            inval_option: e.inval_option,
        }
    }
}

/// One connection (`conns`, `conn show`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ConnView {
    /// Connection id.
    pub id: u32,
    /// Poll thread.
    pub thread: usize,
    /// Configured peer name (outgoing connections).
    pub peer: Option<String>,
    /// Remote address, where known.
    pub remote: Option<String>,
    /// "client" (we connected) or "server" (we accepted).
    pub role: String,
    /// State.
    pub state: String,
    /// RPC-over-RDMA version in use.
    pub version: u32,
    /// Credits the peer grants us.
    pub credits_granted: u32,
    /// Credits we grant.
    pub credits_offered: u32,
    /// Our inline send size.
    pub inline_send: u32,
    /// Our inline receive size.
    pub inline_recv: u32,
    /// The peer's RFC 8797 data: inline send size.
    pub peer_inline_send: Option<u32>,
    /// The peer's RFC 8797 data: inline receive size.
    pub peer_inline_recv: Option<u32>,
    /// The peer accepts Send With Invalidate.
    pub peer_remote_invalidate: Option<bool>,
    /// Transport characteristics both ways (version-two connections).
    pub xchar: Option<crate::xchar::XcharView>,
}

/// Counters of one connection (`stats`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ConnCounters {
    /// Connection id.
    pub id: u32,
    /// Peer name or remote address.
    pub peer: String,
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
    /// Bytes sent.
    pub bytes_out: u64,
    /// Bytes received.
    pub bytes_in: u64,
    /// Bytes moved by RDMA Read (chunks pulled).
    pub rdma_read_bytes: u64,
    /// Bytes moved by RDMA Write (results pushed).
    pub rdma_write_bytes: u64,
    /// Long calls sent (Position-zero Read chunk).
    pub long_calls: u64,
    /// Long replies sent (Reply chunk).
    pub long_replies: u64,
    /// Short (inline) messages sent.
    pub short_sent: u64,
    /// Read chunks offered.
    pub read_chunks: u64,
    /// Write chunks offered.
    pub write_chunks: u64,
    /// Reply chunks offered (calls whose reply buffer may exceed the inline threshold).
    #[serde(default)]
    pub reply_chunks: u64,
    /// Local invalidations posted.
    pub invalidations: u64,
    /// Local invalidations skipped: the peer used Send With Invalidate.
    pub remote_invalidations: u64,
    /// Replies sent with Send With Invalidate.
    #[serde(default)]
    pub replies_with_invalidate: u64,
    /// Messages dropped (too short, header errors in replies, unknown XIDs).
    pub dropped: u64,
    /// RDMA_ERROR messages sent.
    pub errors_sent: u64,
    /// RDMA_ERROR messages received.
    pub errors_received: u64,
    /// RDMA_ERROR messages sent, by code.
    pub errors_sent_by_code: ErrorsByCode,
    /// RDMA_ERROR messages received, by code.
    pub errors_received_by_code: ErrorsByCode,
    /// Times a call waited for a credit.
    pub credit_stalls: u64,
    /// Replies refused for breaking the chunk rules or the program's binding (their calls
    /// failed `BAD_REPLY`).
    #[serde(default)]
    pub bad_replies: u64,
}

/// Counters of one peer over all its connections, ended ones included (`stats`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PeerCounters {
    /// Configured peer name, or the remote host's address for accepted connections.
    pub peer: String,
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
    /// Bytes sent.
    pub bytes_out: u64,
    /// Bytes received.
    pub bytes_in: u64,
    /// Connections established.
    pub conns_opened: u64,
    /// Connections ended.
    pub conns_closed: u64,
}

/// One attached app (`apps`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct AppStatus {
    /// The poll thread that owns its rings.
    pub thread: usize,
    /// Its slot on that thread (`slot.generation`: a slot's next app has another generation).
    pub app: String,
    /// Its pid (from the attach socket's credentials), if known.
    pub pid: Option<i32>,
    /// Programs it serves, `PROG/VERS` in hex and decimal, `(callback)` for a backward-direction
    /// program.
    pub programs: Vec<String>,
    /// Operations in flight: calls, posted receive buffers, calls being served, replies.
    pub ops: usize,
    /// Of those, its calls that ended (cancelled, timed out) while the peer could still reach
    /// their memory, not yet released (ABI.md §3, LENT).
    #[serde(default)]
    pub lent: usize,
    /// Calls it submitted.
    pub calls: u64,
    /// Of those, calls that ended.
    pub calls_done: u64,
    /// Calls delivered to it to serve.
    pub served: u64,
    /// Replies it submitted.
    pub replies: u64,
    /// Submissions refused.
    pub bad_submissions: u64,
    /// Its calls it cancelled while they were in flight (CANCEL).
    pub cancels: u64,
    /// Its calls that reached their time limit (and ended `TIMEOUT`).
    pub timeouts: u64,
}

/// `stats`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Stats {
    /// Per poll thread.
    pub threads: Vec<ThreadStatus>,
    /// Per connection (connections that closed are gone).
    pub conns: Vec<ConnCounters>,
    /// Per peer, by name (connections that closed still count).
    #[serde(default)]
    pub peers: Vec<PeerCounters>,
    /// Per listener: its admissions, wherever its connections live.
    #[serde(default)]
    pub listeners: Vec<ListenerCounters>,
}

/// One listener's admissions (`stats`), counted by the poll thread it listens on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ListenerCounters {
    /// Its bound address (a configured bare IP with its port), or `#index` if unknown.
    pub listener: String,
    /// The poll thread it listens on.
    pub thread: usize,
    /// Connections it admitted that are not over yet (on any poll thread).
    pub connections: u64,
    /// Connection requests it admitted.
    pub admitted: u64,
    /// Connection requests refused, by reason.
    pub connects_refused: ConnectsRefused,
}

/// Round-trip latency percentiles, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Percentiles {
    /// Samples.
    pub count: u64,
    /// Mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest.
    pub max_us: f64,
}

/// Latency percentiles of one connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct LatencyRow {
    /// Connection id.
    pub id: u32,
    /// Peer name or remote address.
    pub peer: String,
    /// Its calls' round trips.
    #[serde(flatten)]
    pub latency: Percentiles,
}

/// Latency percentiles of one peer over all its connections (`peer latency`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PeerLatencyRow {
    /// Configured peer name, or the remote host's address for accepted connections.
    pub peer: String,
    /// Its calls' round trips, ended connections' included.
    #[serde(flatten)]
    pub latency: Percentiles,
}

/// `reload`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub struct ReloadOutcome {
    /// Keys applied live.
    pub applied: Vec<String>,
    /// Keys that changed but need a restart, with the reason.
    pub refused: Vec<Refused>,
}

/// A setting reload could not apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Refused {
    /// Dotted key, e.g. `transport.credits`.
    pub key: String,
    /// Why.
    pub reason: String,
}

/// Sends `req` to the daemon at `socket` and returns its response.
pub fn call(socket: &Path, req: &Request, timeout: Duration) -> std::io::Result<Response> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    s.write_all(&line)?;
    let mut reader = BufReader::new(s);
    let mut out = String::new();
    reader.read_line(&mut out)?;
    Ok(serde_json::from_str(&out)?)
}
