//! The RDMA provider boundary and its providers (`soft`: user-space iWARP; `ibv`: rdma-core).
//!
//! The boundary is verbs semantics shaped for a poll-mode owner: a [`Provider`] is owned by one
//! thread (the poll thread), has no threads or callbacks of its own, and makes progress only
//! while that thread calls it ([`Provider::poll_cq`], [`Provider::poll_cm`]). Every resource is
//! named by a small `Copy` handle (`PdId`, `CqId`, ...) so the engine can be generic over
//! `P: Provider` (static dispatch) without lifetimes or reference counting, and so a hardware
//! provider can keep its objects in slabs indexed by the same handles.
//!
//! Addressing follows Linux/iWARP: an [`Sge`] and a remote address are *virtual addresses* inside
//! a registered region (`Mr::addr` + offset), never zero-based offsets. Keys are `u32`
//! (lkey/rkey/STag), work-request ids are `u64`, as in ibverbs.
//!
//! Nothing on the posting/polling path allocates: scatter/gather lists are borrowed slices,
//! completions are written into a caller-provided slice, connection-manager events carry their
//! private data inline.
#![deny(missing_docs)]

use std::fmt;
use std::net::SocketAddr;

pub mod conformance;
#[cfg(feature = "ibv")]
pub mod ibv;
pub mod mapped;
mod slab;
pub mod soft;

/// Largest scatter/gather list any provider of this crate accepts in one work request.
pub const MAX_SGE: usize = 8;

/// Largest ULP private data carried by a connect/accept/reject (siw: 256 minus the MPA rev-2
/// IRD/ORD prefix).
pub const MAX_PRIVATE_DATA: usize = 252;

macro_rules! handle {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(pub u32);
    };
}

handle!(
    /// A protection domain: memory keys are usable only by queue pairs of the same domain.
    PdId
);
handle!(
    /// A registered memory region.
    MrId
);
handle!(
    /// A completion queue.
    CqId
);
handle!(
    /// A shared receive queue: one pool of posted receives serving many queue pairs.
    SrqId
);
handle!(
    /// A reliable-connected queue pair.
    QpId
);
impl QpId {
    /// No queue pair: what a completion names when the provider no longer knows the queue
    /// pair it came from (a device that reports work of a queue pair long destroyed).
    pub const GONE: QpId = QpId(u32::MAX);
}
handle!(
    /// A listening endpoint created by [`Provider::listen`].
    ListenerId
);
handle!(
    /// An incoming connection request awaiting [`Provider::accept`] or [`Provider::reject`].
    ConnReqId
);

/// Which remote addresses a listener takes streams from ([`Provider::filter_listener`]).
pub struct AcceptFilter(Box<dyn Fn(std::net::IpAddr) -> bool + Send>);

impl AcceptFilter {
    /// A filter taking the addresses for which `admits` is true.
    pub fn new(admits: impl Fn(std::net::IpAddr) -> bool + Send + 'static) -> AcceptFilter {
        AcceptFilter(Box::new(admits))
    }

    /// Whether a stream from `remote` is taken (one without an address is not).
    pub fn admits(&self, remote: Option<SocketAddr>) -> bool {
        remote.is_some_and(|a| (self.0)(a.ip()))
    }
}

impl fmt::Debug for AcceptFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AcceptFilter")
    }
}

/// A connection request taken out of one provider with [`Provider::hand_over`], to be
/// answered by another provider of the same kind (another poll thread's): what lets one
/// listener's connections live on every poll thread. It owns the request's transport state
/// (the soft provider's TCP stream and MPA Request; `ibv`'s rdma_cm id); dropped, the request
/// is abandoned (its stream closed, its id destroyed) and the peer's connect fails.
pub struct Handover(Box<dyn std::any::Any + Send>);

impl Handover {
    /// Wraps a provider's own request state.
    pub(crate) fn new(state: impl std::any::Any + Send) -> Handover {
        Handover(Box::new(state))
    }

    /// The provider's state, if it is of type `T` (else the handover back).
    pub(crate) fn take<T: 'static>(self) -> std::result::Result<T, Handover> {
        self.0.downcast::<T>().map(|b| *b).map_err(Handover)
    }
}

impl fmt::Debug for Handover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Handover")
    }
}

/// Errors returned by provider calls (never by the data a peer sends: that becomes a work
/// completion status or a connection event).
#[derive(Debug)]
pub enum Error {
    /// The handle does not name a live object of this provider.
    BadHandle,
    /// A work queue, completion queue or table is full.
    QueueFull,
    /// More scatter/gather entries than the queue pair or [`MAX_SGE`] allows.
    TooManySge,
    /// An argument is out of range; the text says which.
    InvalidArgument(&'static str),
    /// The object is not in a state that allows the call (e.g. posting a send before connecting).
    BadState,
    /// The provider does not implement this operation.
    Unsupported(&'static str),
    /// No RDMA device is available (e.g. the kernel has no RDMA support).
    NoDevice,
    /// An operating-system error.
    Io(std::io::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BadHandle => f.write_str("unknown or destroyed handle"),
            Error::QueueFull => f.write_str("queue full"),
            Error::TooManySge => f.write_str("too many scatter/gather entries"),
            Error::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
            Error::BadState => f.write_str("object not in a state allowing this call"),
            Error::Unsupported(what) => write!(f, "unsupported: {what}"),
            Error::NoDevice => f.write_str("no RDMA device (use the soft provider)"),
            Error::Io(e) => write!(f, "I/O error: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

/// Result of a provider call.
pub type Result<T> = std::result::Result<T, Error>;

/// Access rights of a memory region or window (ibverbs `IBV_ACCESS_*` subset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Access(u8);

impl Access {
    /// No access beyond local read (always allowed).
    pub const NONE: Access = Access(0);
    /// The local HCA may write (receives, RDMA Read sinks).
    pub const LOCAL_WRITE: Access = Access(1);
    /// A peer may RDMA Read.
    pub const REMOTE_READ: Access = Access(2);
    /// A peer may RDMA Write.
    pub const REMOTE_WRITE: Access = Access(4);
    /// For regions: exposures ([`Provider::expose`]) of the region may grant peers remote
    /// rights that the region's own key does not carry (ibverbs `IBV_ACCESS_MW_BIND`).
    /// Memory registered for good (buffer pools, app arenas) takes this instead of remote
    /// rights, so that a peer reaches it only through the keys of one RPC's exposures, never
    /// under the region's key (RFC 8166 §8.1.2–8.1.3).
    pub const BIND: Access = Access(8);

    /// The raw bits (1 local write, 2 remote read, 4 remote write, 8 bind).
    pub const fn bits(self) -> u8 {
        self.0
    }
    /// Whether every right in `other` is present.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
    /// Whether a region with these rights may be exposed with `want` (remote rights only):
    /// the region has those rights itself, or it allows exposures ([`BIND`](Access::BIND))
    /// and, for a remote write, local write as well (what ibverbs asks of a memory window
    /// bind).
    pub const fn may_expose(self, want: Access) -> bool {
        let remote = Access::REMOTE_READ.union(Access::REMOTE_WRITE);
        if !remote.contains(want) {
            return false;
        }
        self.contains(want)
            || (self.contains(Access::BIND)
                && (!want.contains(Access::REMOTE_WRITE) || self.contains(Access::LOCAL_WRITE)))
    }
    /// Union of two sets of rights.
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        self.union(rhs)
    }
}

/// A registered memory region as returned by [`Provider::register`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mr {
    /// Handle for [`Provider::deregister`] and [`Provider::expose`].
    pub id: MrId,
    /// Key for local scatter/gather entries.
    pub lkey: u32,
    /// Key a peer may use if the region was registered with remote rights (prefer per-RPC
    /// windows from [`Provider::expose`]).
    pub rkey: u32,
    /// Virtual address of the first byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

impl Mr {
    /// Virtual address of `offset` within the region.
    pub const fn addr_at(&self, offset: u64) -> u64 {
        self.addr.wrapping_add(offset)
    }
}

/// One scatter/gather entry: `len` bytes at virtual address `addr` inside the region of `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Virtual address of the first byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key of the region holding the bytes.
    pub lkey: u32,
}

/// The operation of a send-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// Untagged Send into the peer's next posted receive.
    Send,
    /// Send that also invalidates `rkey` at the peer (the peer's receive completion reports it).
    SendWithInvalidate {
        /// The peer's key to invalidate.
        rkey: u32,
    },
    /// Write the gather list to the peer's memory at `remote_addr` (virtual address) under `rkey`.
    RdmaWrite {
        /// Peer virtual address of the first byte.
        remote_addr: u64,
        /// Peer key (region or window) with remote-write access.
        rkey: u32,
    },
    /// Read `sum(sg.len)` bytes from the peer's `remote_addr` under `rkey` into the scatter list.
    RdmaRead {
        /// Peer virtual address of the first byte.
        remote_addr: u64,
        /// Peer key (region or window) with remote-read access.
        rkey: u32,
    },
    /// Invalidate a local window key; ordered after earlier work requests on the same queue pair.
    LocalInvalidate {
        /// The local key (from [`Provider::expose`]) to invalidate.
        rkey: u32,
    },
}

/// A send-queue work request; the scatter/gather list is borrowed (copied or consumed by the
/// provider before [`Provider::post_send`] returns, so nothing is allocated per request).
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// Local buffers (gather for Send/Write, scatter for Read; empty for LocalInvalidate).
    pub sg: &'a [Sge],
    /// Whether a successful completion is reported (errors and flushes always are).
    pub signaled: bool,
}

/// Completion status (ibverbs `ibv_wc_status` subset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WcStatus {
    /// The work request completed.
    #[default]
    Success,
    /// A receive buffer was too small for the incoming message.
    LocalLengthError,
    /// A local key, address range or access right was refused.
    LocalProtectionError,
    /// An operation not allowed in the queue pair's state or configuration.
    LocalQpOperationError,
    /// The peer refused the key, range or access right of a one-sided operation.
    RemoteAccessError,
    /// The peer found the request invalid (e.g. message larger than its receive buffer).
    RemoteInvalidRequest,
    /// The peer failed the operation (e.g. no receive posted on iWARP, Terminate received).
    RemoteOperationError,
    /// The queue pair went to error before this work request executed.
    Flushed,
    /// Any other fatal error of the connection.
    Fatal,
}

/// The operation a completion reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WcOpcode {
    /// A Send or Send with Invalidate.
    #[default]
    Send,
    /// An RDMA Write.
    RdmaWrite,
    /// An RDMA Read (the data is in the scatter list).
    RdmaRead,
    /// A local invalidation.
    LocalInvalidate,
    /// A receive (the incoming Send's payload is in the posted buffers).
    Recv,
}

/// One work completion, written by [`Provider::poll_cq`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkCompletion {
    /// The work request's identifier.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Which operation completed (for errors: the operation of the request when known).
    pub opcode: WcOpcode,
    /// Bytes received (Recv) or transferred (RdmaRead); 0 where not meaningful.
    pub byte_len: u32,
    /// The queue pair the request belonged to (for SRQ receives: the one that consumed it),
    /// also after it was destroyed; [`QpId::GONE`] if the provider no longer knows it.
    pub qp: QpId,
    /// For a Recv of a Send with Invalidate: the local key the peer invalidated.
    pub invalidated_rkey: Option<u32>,
}

/// Queue pair state as seen by the owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    /// Created, not connected; receives may be posted.
    Init,
    /// Connection establishment in progress.
    Connecting,
    /// Connected: sends execute.
    ReadyToSend,
    /// Broken (Terminate, disconnect, protection error): outstanding work was flushed.
    Error,
}

/// Attributes of a new queue pair.
#[derive(Debug, Clone, Copy)]
pub struct QpInit {
    /// Protection domain of every key the queue pair uses.
    pub pd: PdId,
    /// Completions of send-queue work requests.
    pub send_cq: CqId,
    /// Completions of receives.
    pub recv_cq: CqId,
    /// Take receives from this shared receive queue instead of the queue pair's own.
    pub srq: Option<SrqId>,
    /// Send-queue depth (work requests posted and not yet completed).
    pub max_send_wr: u32,
    /// Receive-queue depth (ignored with `srq`).
    pub max_recv_wr: u32,
    /// Largest scatter/gather list (≤ [`MAX_SGE`]).
    pub max_sge: u32,
}

/// Connection parameters for [`Provider::connect`] and [`Provider::accept`] (rdma_cm
/// `rdma_conn_param`).
#[derive(Debug, Clone, Copy)]
pub struct ConnParams<'a> {
    /// ULP private data (≤ [`MAX_PRIVATE_DATA`]), e.g. RFC 8797's 8 bytes.
    pub private_data: &'a [u8],
    /// Inbound RDMA Reads this side accepts in flight (IRD, `responder_resources`).
    pub responder_resources: u16,
    /// Outbound RDMA Reads this side wants in flight (ORD, `initiator_depth`).
    pub initiator_depth: u16,
}

/// Private data carried inline in a connection event (no allocation).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PrivateData {
    len: u16,
    bytes: [u8; MAX_PRIVATE_DATA],
}

impl PrivateData {
    /// Empty private data.
    pub const EMPTY: PrivateData = PrivateData {
        len: 0,
        bytes: [0; MAX_PRIVATE_DATA],
    };

    /// Copy `data`, truncated to [`MAX_PRIVATE_DATA`].
    pub fn new(data: &[u8]) -> PrivateData {
        let mut pd = PrivateData::EMPTY;
        let n = data.len().min(MAX_PRIVATE_DATA);
        pd.bytes[..n].copy_from_slice(&data[..n]);
        pd.len = n as u16;
        pd
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl Default for PrivateData {
    fn default() -> Self {
        PrivateData::EMPTY
    }
}

impl fmt::Debug for PrivateData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrivateData(")?;
        for b in self.as_slice() {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

/// Why a connection could not be set up ([`CmEvent::ConnectError`]), for the operator's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectFailure {
    /// No route to the peer's address from this device (address or route resolution failed,
    /// or the address is reached through another device).
    NoRoute,
    /// The peer refused (nothing listens there), did not answer in time, or is unreachable.
    Unreachable,
    /// This host refused to start or carry it; the OS error number (a source port in use,
    /// out of resources).
    Local(i32),
    /// The set-up exchange broke down part way: a malformed or unexpected MPA or CM message,
    /// or the peer hung up during it.
    Handshake,
}

impl ConnectFailure {
    /// A socket or verbs error met while connecting: the peer's side when the error says
    /// refused, reset, timed out or unreachable, else this host's.
    pub fn from_io(e: &std::io::Error) -> Self {
        match e.raw_os_error() {
            Some(
                libc::ECONNREFUSED
                | libc::ECONNRESET
                | libc::ETIMEDOUT
                | libc::EHOSTUNREACH
                | libc::ENETUNREACH,
            ) => ConnectFailure::Unreachable,
            Some(n) => ConnectFailure::Local(n),
            None => ConnectFailure::Local(0),
        }
    }
}

impl fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectFailure::NoRoute => write!(f, "no route to the peer from this device"),
            ConnectFailure::Unreachable => write!(f, "the peer refused or did not answer"),
            ConnectFailure::Local(0) => write!(f, "refused by this host"),
            ConnectFailure::Local(n) => write!(
                f,
                "refused by this host: {}",
                std::io::Error::from_raw_os_error(*n)
            ),
            ConnectFailure::Handshake => write!(f, "the connection set-up exchange failed"),
        }
    }
}

/// The asynchronous events a device reported (`ibv_get_async_event`), counted since the
/// provider opened: see [`Provider::device_events`]. Each failure event has already ended the
/// connections it concerns (their queue pairs are in the error state and reported
/// [`CmEvent::Disconnected`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceEvents {
    /// Queue pairs the device failed on its own (a catastrophic error, an invalid request or
    /// an access violation it detected as responder): each ended its connection.
    pub qp_errors: u64,
    /// Completion queue errors (an overrun): every connection on that CQ ended, as
    /// completions may have been lost.
    pub cq_errors: u64,
    /// Shared receive queue errors: every connection on that SRQ ended.
    pub srq_errors: u64,
    /// Fatal device errors: every connection ended, and the device serves no more until it is
    /// opened again (the daemon restarted).
    pub device_fatal: u64,
    /// The port went down (link lost; connections end as their peers stop answering).
    pub port_down: u64,
    /// The port became active again.
    pub port_up: u64,
    /// Queue pairs on a shared receive queue that, in the error state, took their last
    /// buffer from it (IBTA's Last WQE Reached): each may be destroyed without losing one.
    pub last_wqe_reached: u64,
    /// Queue pairs destroyed before the device said it was done with them (`ibv`'s
    /// `RETIRE_WAIT`: Last WQE Reached on hardware, the last completion on rxe and siw):
    /// buffers they took may be lost to the pool.
    pub retire_timeouts: u64,
}

/// Connection-manager events, delivered by [`Provider::poll_cm`] (rdma_cm event subset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmEvent {
    /// A peer asks to connect to `listener`; answer with accept or reject.
    ConnectRequest {
        /// The listener it arrived on.
        listener: ListenerId,
        /// The request to accept or reject.
        req: ConnReqId,
        /// The peer's ULP private data (transport prefixes stripped).
        private_data: PrivateData,
        /// The connecting side's address, where the transport has one.
        remote: Option<SocketAddr>,
        /// The peer's IRD (its `responder_resources`).
        responder_resources: u16,
        /// The peer's ORD (its `initiator_depth`).
        initiator_depth: u16,
    },
    /// The queue pair is connected; sends may be posted.
    Established {
        /// The queue pair.
        qp: QpId,
        /// The peer's accept private data (empty on the accepting side).
        private_data: PrivateData,
    },
    /// The peer rejected the connection.
    Rejected {
        /// The queue pair passed to connect (now in error).
        qp: QpId,
        /// The peer's reject private data.
        private_data: PrivateData,
    },
    /// Connecting failed (unreachable, refused, protocol error during set-up).
    ConnectError {
        /// The queue pair passed to connect or accept (now in error).
        qp: QpId,
        /// Why, as far as the provider can tell.
        cause: ConnectFailure,
    },
    /// A stream from an address `listener`'s [filter](Provider::filter_listener) refuses was
    /// closed as it was accepted, before its connection request.
    Filtered {
        /// The listener it came to.
        listener: ListenerId,
        /// The address it came from.
        remote: Option<SocketAddr>,
    },
    /// The connection ended (either side disconnected, Terminate, transport loss); its
    /// outstanding work was flushed.
    Disconnected {
        /// The queue pair (now in error).
        qp: QpId,
    },
}

/// An RDMA provider: one device context owned by one poll thread.
///
/// Threading: a provider is driven by a single thread; it starts no threads and runs no
/// callbacks. The target side of one-sided operations (and, for software providers, all
/// transport work) happens inside [`poll_cq`](Provider::poll_cq) and
/// [`poll_cm`](Provider::poll_cm). Queue pairs, memory and queues belong to the provider
/// instance that created them.
pub trait Provider {
    /// Allocate a protection domain.
    fn alloc_pd(&mut self) -> Result<PdId>;

    /// Free a protection domain (its regions, windows and queue pairs must be gone).
    fn dealloc_pd(&mut self, pd: PdId) -> Result<()>;

    /// Register `len` bytes at `addr` with `access` rights; returns lkey and rkey.
    ///
    /// # Safety
    ///
    /// `addr..addr+len` must be valid for reads and writes for as long as the region stays
    /// registered (until [`deregister`](Provider::deregister) or the provider is dropped), and
    /// the caller must not rely on the contents of bytes a peer or the provider may write
    /// there (receives, RDMA Read sinks, RDMA Writes from a peer holding a key) while work or
    /// remote access is outstanding. The memory may be shared with other processes.
    unsafe fn register(
        &mut self,
        pd: PdId,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mr>;

    /// Deregister a region; every window bound to it is invalidated first.
    fn deregister(&mut self, mr: MrId) -> Result<()>;

    /// Expose `len` bytes at `offset` in `mr` to the peer of `qp` with `access` (rights the
    /// region [may expose](Access::may_expose)) and return a fresh rkey (memory window type
    /// 2 semantics).
    ///
    /// The peer addresses the bytes at `mr.addr + offset`. The key is valid for work
    /// requests posted on `qp` after this call, until invalidated locally
    /// ([`SendOp::LocalInvalidate`]) or remotely (Send with Invalidate); afterwards the peer's
    /// accesses with it are refused. Keys are not reused immediately and are hard to guess.
    fn expose(&mut self, qp: QpId, mr: MrId, offset: u64, len: u64, access: Access) -> Result<u32>;

    /// Create a completion queue holding up to `depth` completions (at most
    /// [`max_cq_depth`](Provider::max_cq_depth)).
    fn create_cq(&mut self, depth: u32) -> Result<CqId>;

    /// The deepest completion queue the device allows (unbounded by default: the soft
    /// provider's queues grow).
    fn max_cq_depth(&self) -> u32 {
        u32::MAX
    }

    /// Work requests the send queue of a queue pair created with `max_send_wr` holds, the
    /// provider's own included (memory window binds, invalidations): what a failed queue
    /// pair may flush to its completion queue at once, signalled or not. By default
    /// `max_send_wr`.
    fn send_queue_entries(&self, max_send_wr: u32) -> u32 {
        max_send_wr
    }

    /// Destroy a completion queue (no queue pair may use it).
    fn destroy_cq(&mut self, cq: CqId) -> Result<()>;

    /// Drive the provider and move up to `wcs.len()` completions of `cq` into `wcs`; returns
    /// how many were written.
    fn poll_cq(&mut self, cq: CqId, wcs: &mut [WorkCompletion]) -> Result<usize>;

    /// Create a shared receive queue of `depth` receives in `pd`.
    fn create_srq(&mut self, pd: PdId, depth: u32, max_sge: u32) -> Result<SrqId>;

    /// Destroy a shared receive queue (no queue pair may use it).
    fn destroy_srq(&mut self, srq: SrqId) -> Result<()>;

    /// Post a receive to a shared receive queue.
    fn post_srq_recv(&mut self, srq: SrqId, wr_id: u64, sg: &[Sge]) -> Result<()>;

    /// Create a reliable-connected queue pair.
    fn create_qp(&mut self, init: &QpInit) -> Result<QpId>;

    /// Destroy a queue pair (disconnecting it if needed; outstanding work is dropped, windows
    /// bound to it are invalidated). The handle is gone at once, but a queue pair on a
    /// shared receive queue still has every buffer it took from the queue reported by
    /// [`poll_cq`](Provider::poll_cq), under its name (never a later queue pair's): the
    /// owner gets its buffers back. (A device may drop a destroyed queue pair's completions
    /// and free, in its own books, the buffers it took, or give its number to the next queue
    /// pair while its completions are still to be polled: the provider keeps the queue pair
    /// until the device has reported all it will of it; IBTA 10.3.1.)
    fn destroy_qp(&mut self, qp: QpId) -> Result<()>;

    /// Whether the device is done with destroyed queue pair `qp`: it reports nothing more of
    /// it and moves no data for it (no RDMA Read response lands in local memory, no Send or
    /// Write reads it). Until then, memory the queue pair's work named must not be reused.
    /// Once [`destroy_qp`](Provider::destroy_qp) has returned, it becomes true within a
    /// bounded time of [`poll_cq`](Provider::poll_cq) calls, and stays true; while it is
    /// false, [`busy`](Provider::busy) is true. The default suits a provider whose
    /// `destroy_qp` ends the device's work on the queue pair before it returns.
    fn qp_retired(&self, qp: QpId) -> bool {
        let _ = qp;
        true
    }

    /// Current state of a queue pair.
    fn qp_state(&self, qp: QpId) -> Result<QpState>;

    /// Post a receive to the queue pair's own receive queue (not allowed with an SRQ).
    fn post_recv(&mut self, qp: QpId, wr_id: u64, sg: &[Sge]) -> Result<()>;

    /// Post a send-queue work request; in the error state it completes as [`WcStatus::Flushed`].
    fn post_send(&mut self, qp: QpId, wr: &SendWr<'_>) -> Result<()>;

    /// Start listening on `addr` (port 0 picks a free one).
    fn listen(&mut self, addr: SocketAddr) -> Result<ListenerId>;

    /// The address a listener is bound to.
    fn listen_addr(&self, listener: ListenerId) -> Result<SocketAddr>;

    /// Stop listening.
    fn close_listener(&mut self, listener: ListenerId) -> Result<()>;

    /// Where the transport sees a connecting side's address before its connection request
    /// (the soft provider's TCP), closes streams to `listener` from addresses `filter` refuses
    /// as they are accepted ([`CmEvent::Filtered`]), so that they hold nothing while a
    /// request would be awaited; `None` takes every stream. Providers whose requests come
    /// whole (rdma_cm) ignore it: the owner refuses such a request when it comes.
    fn filter_listener(
        &mut self,
        listener: ListenerId,
        filter: Option<AcceptFilter>,
    ) -> Result<()> {
        let _ = (listener, filter);
        Ok(())
    }

    /// Connect `qp` (in [`QpState::Init`]) to `addr`; completion is an `Established`,
    /// `Rejected` or `ConnectError` event.
    fn connect(&mut self, qp: QpId, addr: SocketAddr, params: &ConnParams<'_>) -> Result<()>;

    /// Accept a connection request onto `qp` (in [`QpState::Init`]); `Established` follows.
    fn accept(&mut self, req: ConnReqId, qp: QpId, params: &ConnParams<'_>) -> Result<()>;

    /// Refuse a connection request, sending `private_data` to the requester.
    fn reject(&mut self, req: ConnReqId, private_data: &[u8]) -> Result<()>;

    /// Takes connection request `req` (not answered yet) out of this provider, for
    /// [`take_over`](Provider::take_over) by another provider of the same kind; `req` is then
    /// unknown here. [`Error::Unsupported`] where requests cannot move (the in-memory fabric,
    /// whose streams belong to one thread): `req` stays here, to be answered here.
    fn hand_over(&mut self, req: ConnReqId) -> Result<Handover> {
        let _ = req;
        Err(Error::Unsupported("moving a connection request"))
    }

    /// Takes in a request another provider of the same kind handed over: answer it with
    /// [`accept`](Provider::accept) or [`reject`](Provider::reject) as if it had come here. On
    /// an error the request is abandoned (the peer's connect fails).
    fn take_over(&mut self, request: Handover) -> Result<ConnReqId> {
        drop(request);
        Err(Error::Unsupported("moving a connection request"))
    }

    /// Disconnect: outstanding work on both sides is flushed and both get `Disconnected`.
    fn disconnect(&mut self, qp: QpId) -> Result<()>;

    /// Drains the send queue of `qp`, which must be in the error state (after
    /// [`disconnect`](Provider::disconnect) or a failed work request; otherwise
    /// [`Error::BadState`]): posts a marker that the device completes as `wr_id`,
    /// [`WcStatus::Flushed`], only after every work request posted on `qp` before it, so that
    /// once the marker is reported no RDMA Read of that queue pair places data any more and no
    /// Send or Write reads its buffers (the kernel's `ib_drain_sq`). `Ok(false)`: no marker
    /// on this device, whose error transition itself ends its transfers (`ibv` on iWARP:
    /// kernel siw never completes a user queue pair's work posted in the error state).
    /// Unlike [`post_send`](Provider::post_send) in the error state, the marker is never
    /// completed ahead of work the device still holds.
    fn drain_send_queue(&mut self, qp: QpId, wr_id: u64) -> Result<bool>;

    /// Drive connection management and return the next event, if any.
    fn poll_cm(&mut self) -> Option<CmEvent>;

    /// A file descriptor that becomes readable when [`poll_cm`](Provider::poll_cm) or a
    /// completion queue may have work, where the provider has one: what a parked poll thread
    /// waits on besides its doorbell. A call to `poll_cm` consumes what made it readable and
    /// arms it for what comes next (the soft provider's sockets: new data too, as `poll_cm`
    /// also moves it; `ibv`: rdma_cm's events and the CQs' next completions), so an owner
    /// calls `poll_cm`, polls its CQs once more, then sleeps on it.
    fn event_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>>;

    /// Whether the provider has work it will do at its next poll without any new event (the
    /// soft provider: a queue pair stopped in the middle of a transfer so that others get
    /// their turn, in-memory wakeups not taken yet, or a listener's news that a completion
    /// poll took, left for the next `poll_cm`; any provider: a destroyed queue pair not
    /// retired yet, see [`qp_retired`](Provider::qp_retired)). An owner must not sleep on
    /// [`event_fd`](Provider::event_fd) while this is true: nothing would wake it.
    fn busy(&self) -> bool {
        false
    }

    /// The device's asynchronous events so far (none for a provider without a device: the
    /// soft provider's failures all show as completions and connection events).
    fn device_events(&self) -> DeviceEvents {
        DeviceEvents::default()
    }
}

#[cfg(test)]
mod tests {
    use super::Access;

    /// Which exposures a region's rights allow: its own remote rights, or any remote right
    /// through the bind right (a remote write only with local write); never a right that is
    /// not a remote one.
    #[test]
    fn exposures_a_region_allows() {
        let (lw, rr, rw, bind) = (
            Access::LOCAL_WRITE,
            Access::REMOTE_READ,
            Access::REMOTE_WRITE,
            Access::BIND,
        );
        let cases = [
            (lw | rr | rw, rr | rw, true),
            (lw | rr, rw, false),
            (lw, rr, false),
            (lw | bind, rr | rw, true),
            (bind, rr, true),
            (bind, rw, false),
            (lw | bind, bind, false),
            (lw | bind, lw, false),
        ];
        for (region, want, ok) in cases {
            assert_eq!(region.may_expose(want), ok, "{region:?} exposing {want:?}");
        }
    }
}
