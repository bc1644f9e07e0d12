//! The rdma-core provider: real verbs devices (NICs, `rdma_rxe`, `siw`) through `sideway`.
//!
//! `sideway` opens the device (its device list reports a kernel without RDMA cleanly), and
//! owns protection domains and memory regions; queue pairs, shared receive queues, memory
//! windows, posting, polling and rdma_cm go through `rdma-mummy-sys`, the raw bindings under
//! `sideway`, because `sideway` 0.4 wraps none of SRQ, memory windows, Send with Invalidate,
//! or rdma_cm private data and reject. Both load libibverbs and librdmacm at run time.
//!
//! Queue pairs are created by the provider (not by rdma_cm) so they can share CQs and SRQs;
//! rdma_cm only carries the connection (`qp_num` in the connection parameters), and the
//! provider moves the queue pair through its states itself on InfiniBand/RoCE (iWARP's
//! connection manager does that in the kernel).
//!
//! Exposure ([`Provider::expose`]) binds a type 2 memory window per call where the device has
//! windows that keep the peer inside them; otherwise (siw has no windows; rxe's let the peer
//! reach the whole region; user space has no fast registration) it registers a memory region
//! per exposure and deregisters it on local invalidation: the same protection, at the cost of
//! a system call per exposure, and without remote invalidation (verbs refuse Send with
//! Invalidate on an ordinary region), which [`IbvProvider::remote_invalidation`] reports.
//! See [`Exposure`].
//!
//! Every error completion of a connected queue pair ends its connection (queue pair to error,
//! `rdma_disconnect`), so both sides see `Disconnected` as they would on iWARP.
//!
//! The device's asynchronous events are read with rdma_cm's (their descriptor is part of the
//! event fd): a queue pair the device failed ends its connection; a completion queue error
//! (an overrun: completions may be lost) or a shared receive queue error ends every connection
//! on that queue; a fatal device error ends every connection. Each is counted, with the port
//! going down and coming back, in [`Provider::device_events`].

mod sys;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sideway::ibverbs::device::{DeviceInfo, DeviceList, TransportType};
use sideway::ibverbs::device_context::{DeviceCapabilityFlags, DeviceContext};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::AccessFlags;

use crate::slab::Slab;
use crate::{
    Access, CmEvent, ConnParams, ConnReqId, ConnectFailure, CqId, DeviceEvents, Error, Handover,
    ListenerId, Mr, MrId, PdId, PrivateData, Provider, QpId, QpInit, QpState, Result, SendOp,
    SendWr, Sge, SrqId, WcOpcode, WcStatus, WorkCompletion, MAX_SGE,
};

use sys::{AsyncEvent, CmId, RawCq, RawMw, RawQp, RawSrq};

/// Where to find the device: name (e.g. `rxe0`; first device if `None`), port, GID index.
#[derive(Debug, Clone)]
pub struct IbvConfig {
    /// Device name as in `ibv_devices`; `None` takes the first device.
    pub device: Option<String>,
    /// Port number (1-based).
    pub port: u8,
    /// GID index that must exist on the port (rdma_cm picks the GID of the address used).
    pub gid_index: u32,
    /// Address and route resolution timeout in milliseconds.
    pub resolve_timeout_ms: i32,
    /// RNR retries (0: a Send without a posted receive fails at once, as on iWARP).
    pub rnr_retry: u8,
    /// Transport retries before a queue pair fails.
    pub retry_count: u8,
    /// Drop trailing zero bytes of received private data. InfiniBand/RoCE's CM pads it with
    /// zeros to a fixed size (56 bytes in a request, 196 in a reply, 148 in a reject); with
    /// this set the owner sees what the peer sent unless that ended in zero bytes. iWARP
    /// delivers exact lengths either way.
    pub strip_cm_padding: bool,
    /// How [`Provider::expose`] gives a peer access.
    pub exposure: Exposure,
    /// Whether a destroyed queue pair on a shared receive queue is kept until the device has
    /// reported what it took from the queue (`Retiring`, IBTA 10.3.1).
    pub srq_teardown: SrqTeardown,
}

/// How a destroyed queue pair on a shared receive queue is let go ([`Retiring`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SrqTeardown {
    /// Kept until Last WQE Reached and a marker behind it (at most [`RETIRE_WAIT`]), except
    /// on rxe and siw, which raise no such event: there every destroyed queue pair is kept
    /// until a marker (rxe) or a poll that empties its CQ (siw).
    Auto,
    /// Kept until Last WQE Reached on every device (rxe and siw then wait [`RETIRE_WAIT`]
    /// for each unless a test simulates the event).
    Wait,
}

/// How remote exposures are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposure {
    /// Memory windows where the device has type 2 windows that enforce their bounds; else a
    /// region per exposure. rxe (Linux 6.1) has type 2 windows but lets a peer reach the whole
    /// underlying region through one (observed in `tests/vm`), so it gets regions.
    Auto,
    /// Type 2 memory windows, bound per exposure (fails to open without them).
    MemoryWindow,
    /// A memory region registered per exposure, deregistered on invalidation. Its key is
    /// good on every queue pair of the protection domain, not only the one it was exposed
    /// for (windows are bound to their queue pair).
    RegionPerExposure,
}

impl Default for IbvConfig {
    fn default() -> Self {
        IbvConfig {
            device: None,
            port: 1,
            gid_index: 0,
            resolve_timeout_ms: 2000,
            rnr_retry: 0,
            retry_count: 7,
            strip_cm_padding: false,
            exposure: Exposure::Auto,
            srq_teardown: SrqTeardown::Auto,
        }
    }
}

/// Why [`IbvProvider::open`] failed.
#[derive(Debug)]
pub enum OpenError {
    /// The kernel has no RDMA support (`ibv_get_device_list` fails, e.g. with ENOSYS).
    NoKernelSupport(io::Error),
    /// The kernel has RDMA but no device is registered.
    NoDevices,
    /// No device of that name; the names that exist.
    NoSuchDevice {
        /// The name asked for.
        wanted: String,
        /// The devices present.
        present: Vec<String>,
    },
    /// The configuration asks for something the device lacks; the text says what.
    Unsupported(&'static str),
    /// The device exists but opening or querying it failed; the text says which step.
    Device(&'static str, io::Error),
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::NoKernelSupport(e) => write!(
                f,
                "no RDMA devices (kernel has no RDMA support: {e}); use the soft provider"
            ),
            OpenError::NoDevices => f.write_str("no RDMA devices; use the soft provider"),
            OpenError::NoSuchDevice { wanted, present } => {
                write!(f, "no RDMA device {wanted:?} (present: {present:?})")
            }
            OpenError::Unsupported(what) => write!(f, "RDMA device lacks {what}"),
            OpenError::Device(step, e) => write!(f, "RDMA device: {step}: {e}"),
        }
    }
}

impl std::error::Error for OpenError {}

impl From<OpenError> for Error {
    fn from(e: OpenError) -> Error {
        match e {
            OpenError::Device(_, io) => Error::Io(io),
            _ => Error::NoDevice,
        }
    }
}

/// Work-request id of the provider's own (unsignaled) window binds; never reported.
const INTERNAL_WR_ID: u64 = u64::MAX - 0x5157;

/// Work-request id of the marker a retiring queue pair posts once it has reached its last
/// shared receive ([`Retiring`]); never reported.
const RETIRE_WR_ID: u64 = u64::MAX - 0x5158;

/// Longest a destroyed queue pair is kept for the device to finish with it ([`Retiring`]). A
/// device that raises Last WQE Reached does so as soon as the queue pair is in error
/// (microseconds); one that never does is not waited for longer.
pub const RETIRE_WAIT: Duration = Duration::from_secs(1);

struct MrEntry {
    mr: Arc<MemoryRegion>,
    pd: PdId,
    addr: u64,
    len: u64,
    access: Access,
}

struct CqEntry {
    cq: RawCq,
    /// Completions the provider made itself (work posted to a queue pair in error).
    synthetic: VecDeque<WorkCompletion>,
    /// Entries the CQ holds, and entries polled from it while a queue pair retired
    /// ([`Retiring`]'s bound: only differences since a mark count, and a mark is taken while
    /// one retires).
    capacity: u64,
    polled: u64,
}

/// A live remote exposure: a bound window, or a region registered for it (fallback).
enum Window {
    Mw {
        mw: RawMw,
        qp: QpId,
    },
    /// A region per exposure (no usable windows): valid on every queue pair of the domain,
    /// so it is deregistered when the queue pair it was made for fails or goes.
    Mr {
        mr: Arc<MemoryRegion>,
        qp: QpId,
    },
}

struct QpEntry {
    qp: RawQp,
    pd: PdId,
    send_cq: CqId,
    recv_cq: CqId,
    srq: Option<SrqId>,
    max_sge: u32,
    state: QpState,
    /// Accepted (the passive side): [`Provider::accept`] moved the queue pair to RTS before it
    /// answered, so it may send while `Connecting`. The peer may send as soon as it has our
    /// answer, and its first message can be polled before rdma_cm's ESTABLISHED (the IB RTU,
    /// or the MPA exchange's end, reaches the connection manager later): the reply to it must
    /// not fail. Seen in the VM on rxe and siw, most often on a connection handed to another
    /// poll thread, whose provider polls its completions before its rdma_cm channel.
    accepted: bool,
    id: Option<CmId>,
    disconnect_reported: bool,
    /// Windows invalidated on this queue pair, ready to be bound again.
    free_mws: Vec<(RawMw, u32)>,
    /// Ids of posted, uncompleted receives (own receive queue only), oldest first.
    recvs: VecDeque<u64>,
    /// The device raised Last WQE Reached for it (on a shared receive queue, in error).
    last_wqe: bool,
}

/// A queue pair its owner destroyed, kept (in the error state, its handle gone) until the
/// device has reported all it will report of it: a completion that came after would name it
/// by a number the device may have given to a new queue pair by then (siw does, at once),
/// and an owner routes shared receives by the queue pair. On hardware it is kept only if it
/// is on a shared receive queue, as IBTA 10.3.1 asks: a device may drop a destroyed queue
/// pair's completions from the CQ and free, in its own books, the buffers it took from the
/// queue (mlx5 cleans its CQ), so it goes after Last WQE Reached (it takes no more) and a
/// marker posted then (the completions of what it took come first). rxe and siw raise no
/// such event and keep a destroyed queue pair's completions: every queue pair is kept there
/// until a marker (rxe) or a poll that empties its CQ (siw, which completes what it holds
/// when it enters the error state and takes no marker).
struct Retiring {
    id: QpId,
    entry: QpEntry,
    stage: Stage,
    deadline: Instant,
    /// Its send and receive CQs, with the entries polled from each when it was destroyed.
    marks: [(CqId, u64); 2],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Until Last WQE Reached (then a marker, or on iWARP a poll that empties the CQ).
    Event,
    /// Until the marker (`RETIRE_WR_ID`) completes.
    Marker,
    /// Until a poll of its CQ that comes back not full, or until its CQs have given up as
    /// many entries as they hold since it was destroyed (a CQ is first in, first out: all it
    /// had there is gone then, though every poll came back full).
    EmptyPoll,
    /// Destroyed at the end of this poll.
    Done,
}

struct PdEntry {
    pd: Arc<ProtectionDomain>,
}

/// Pending outbound connection steps on the active side.
struct Connecting {
    private_data: PrivateData,
    responder_resources: u16,
    initiator_depth: u16,
    /// Where to (a fresh id resolves it again, see [`IbvProvider::connect_from_another_port`]).
    addr: SocketAddr,
    /// Ids whose connect the local TCP stack refused for their source port, kept (and so
    /// their ports held in rdma_cm's port space) until the attempt ends.
    spent: Vec<CmId>,
}

/// Source ports an iWARP connect tries before it reports the failure.
const CONNECT_PORT_TRIES: usize = 4;

/// One opened RDMA device driven by one poll thread.
pub struct IbvProvider {
    cfg: IbvConfig,
    ctx: Arc<DeviceContext>,
    name: String,
    iwarp: bool,
    has_mw2: bool,
    /// rdma_rxe: its legacy completions carry the kernel's `ib_wc_flags` bits, where
    /// "with invalidate" is bit 2 (libibverbs' `IBV_WC_IP_CSUM_OK`), not bit 3.
    rxe: bool,
    /// A kernel software device (rdma_rxe, siw), unless [`SrqTeardown::Wait`]: it raises no
    /// Last WQE Reached (Debian's 6.1 kernel: none within 5 s of the error) and leaves a
    /// destroyed queue pair's completions in the CQ ([`Retiring`]).
    kernel_soft: bool,
    /// Scatter entries an RDMA Read sink may have (siw: 1).
    max_sge_rd: usize,
    /// The deepest completion queue the device allows (rxe: 32 767).
    max_cqe: u32,
    channel: sys::EventChannel,
    /// The CQs' completion channel, and the epoll descriptor over it, `channel` and the
    /// device's asynchronous events that [`Provider::event_fd`] offers. Dropped after the CQs
    /// (`Drop` clears them first).
    comp: sys::CompChannel,
    wake: sys::Wake,
    pds: Slab<PdEntry>,
    mrs: Slab<MrEntry>,
    cqs: Slab<CqEntry>,
    srqs: Slab<RawSrq>,
    qps: Slab<QpEntry>,
    /// Destroyed queue pairs the device may still owe completions ([`Retiring`]).
    retiring: Vec<Retiring>,
    qp_by_num: HashMap<u32, QpId>,
    connecting: HashMap<u32, Connecting>,
    listeners: Slab<(CmId, SocketAddr)>,
    reqs: Slab<CmId>,
    windows: HashMap<u32, Window>,
    events: VecDeque<CmEvent>,
    /// The device's asynchronous events so far.
    device_events: DeviceEvents,
}

impl fmt::Debug for IbvProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IbvProvider")
            .field("device", &self.name)
            .field("iwarp", &self.iwarp)
            .field("memory_windows", &self.has_mw2)
            .finish_non_exhaustive()
    }
}

fn slot<T>(v: &Slab<T>, h: u32) -> Result<&T> {
    v.get(h).ok_or(Error::BadHandle)
}

fn slot_mut<T>(v: &mut Slab<T>, h: u32) -> Result<&mut T> {
    v.get_mut(h).ok_or(Error::BadHandle)
}

fn push<T>(v: &mut Slab<T>, t: T) -> Result<u32> {
    v.insert(t).ok_or(Error::QueueFull)
}

/// A connect the local stack refused for its source port: in use by a TCP socket
/// (`EADDRINUSE`), or the same four-tuple as one (`EADDRNOTAVAIL`).
fn source_port_taken(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EADDRINUSE | libc::EADDRNOTAVAIL)
    )
}

/// Private data without its trailing zero bytes (IB CM pads to a fixed size).
fn strip_zero_padding(pd: &PrivateData) -> PrivateData {
    let d = pd.as_slice();
    let n = d.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    PrivateData::new(&d[..n])
}

fn access_flags(a: Access, mw_bind: bool) -> AccessFlags {
    let mut f = AccessFlags::none();
    if a.contains(Access::LOCAL_WRITE) {
        f |= AccessFlags::LocalWrite;
    }
    if a.contains(Access::REMOTE_READ) {
        f |= AccessFlags::RemoteRead;
    }
    if a.contains(Access::REMOTE_WRITE) {
        f |= AccessFlags::RemoteWrite | AccessFlags::LocalWrite;
    }
    if mw_bind {
        f |= AccessFlags::MemoryWindowBind;
    }
    f
}

impl IbvProvider {
    /// Open a device; fails with [`OpenError::NoKernelSupport`] on kernels without RDMA.
    pub fn open(cfg: IbvConfig) -> std::result::Result<IbvProvider, OpenError> {
        let list = DeviceList::new().map_err(|e| {
            let io = match e.0 {
                sideway::ibverbs::device::GetDeviceListErrorKind::Ibverbs(io) => io,
                other => io::Error::other(other.to_string()),
            };
            OpenError::NoKernelSupport(io)
        })?;
        if list.is_empty() {
            return Err(OpenError::NoDevices);
        }
        let present: Vec<String> = list.iter().map(|d| d.name()).collect();
        let dev = match &cfg.device {
            None => list.get(0),
            Some(want) => list.iter().find(|d| &d.name() == want),
        }
        .ok_or_else(|| OpenError::NoSuchDevice {
            wanted: cfg.device.clone().unwrap_or_default(),
            present,
        })?;
        let name = dev.name();
        let iwarp = matches!(dev.transport_type(), TransportType::IWarp);
        let ctx = dev
            .open()
            .map_err(|e| OpenError::Device("open", io::Error::other(e.to_string())))?;
        let attr = ctx
            .query_device()
            .map_err(|e| OpenError::Device("query device", io::Error::other(e.to_string())))?;
        ctx.query_port(cfg.port)
            .map_err(|e| OpenError::Device("query port", io::Error::other(e.to_string())))?;
        ctx.query_gid(cfg.port, cfg.gid_index)
            .map_err(|e| OpenError::Device("query GID", io::Error::other(e.to_string())))?;
        let caps = attr.device_cap_flags();
        let mw2 = attr.max_mw() > 0
            && (caps.contains(DeviceCapabilityFlags::MemoryWindowType2A)
                || caps.contains(DeviceCapabilityFlags::MemoryWindowType2B));
        // rdma_rxe reports vendor 0xffffff.
        let rxe = attr.vendor_id() == 0x00ff_ffff;
        // siw's vendor id is ASCII "bmt".
        let kernel_soft =
            (rxe || attr.vendor_id() == 0x0062_6d74) && cfg.srq_teardown == SrqTeardown::Auto;
        let has_mw2 = match cfg.exposure {
            Exposure::Auto => mw2 && !rxe,
            Exposure::MemoryWindow if !mw2 => {
                return Err(OpenError::Unsupported("type 2 memory windows"))
            }
            Exposure::MemoryWindow => true,
            Exposure::RegionPerExposure => false,
        };
        let channel = sys::EventChannel::new().map_err(|e| OpenError::Device("rdma_cm", e))?;
        // SAFETY: the pointer is used only to create the channel, while `ctx` lives.
        let raw_ctx = unsafe { ctx.context().as_ptr() };
        let comp = sys::CompChannel::new(raw_ctx)
            .map_err(|e| OpenError::Device("completion channel", e))?;
        let async_fd = sys::async_fd(raw_ctx).map_err(|e| OpenError::Device("async events", e))?;
        let wake = sys::Wake::new(&[channel.fd(), comp.fd(), async_fd])
            .map_err(|e| OpenError::Device("epoll", e))?;
        Ok(IbvProvider {
            cfg,
            ctx,
            name,
            iwarp,
            has_mw2,
            rxe,
            kernel_soft,
            max_cqe: u32::try_from(attr.max_cqe()).unwrap_or(0),
            max_sge_rd: usize::try_from(attr.max_sge_rd())
                .unwrap_or(1)
                .clamp(1, MAX_SGE),
            channel,
            comp,
            wake,
            pds: Slab::default(),
            mrs: Slab::default(),
            cqs: Slab::default(),
            srqs: Slab::default(),
            qps: Slab::default(),
            retiring: Vec::new(),
            qp_by_num: HashMap::with_capacity(64),
            connecting: HashMap::with_capacity(16),
            listeners: Slab::default(),
            reqs: Slab::default(),
            windows: HashMap::with_capacity(1024),
            events: VecDeque::with_capacity(64),
            device_events: DeviceEvents::default(),
        })
    }

    /// The device's name.
    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// Whether the device speaks iWARP (else InfiniBand or RoCE).
    pub fn is_iwarp(&self) -> bool {
        self.iwarp
    }

    /// Whether exposures are type 2 memory windows (else one memory region per exposure).
    pub fn uses_memory_windows(&self) -> bool {
        self.has_mw2
    }

    /// Whether windows are in use on a device known not to keep a peer within them (rxe on
    /// Linux 6.1 lets a peer reach the whole underlying region): only when asked for with
    /// [`Exposure::MemoryWindow`], never under [`Exposure::Auto`].
    pub fn windows_unbounded(&self) -> bool {
        self.has_mw2 && self.rxe
    }

    /// Whether a peer may invalidate an exposure with Send with Invalidate: only windows
    /// (verbs refuse remote invalidation of an ordinary region), so an owner must not offer
    /// it (RFC 8797's flag) otherwise.
    pub fn remote_invalidation(&self) -> bool {
        self.has_mw2
    }

    /// Largest scatter list of an RDMA Read (the device's `max_sge_rd`; siw has 1): longer
    /// ones are refused with [`Error::TooManySge`] (siw would silently read only the first).
    pub fn max_read_sge(&self) -> usize {
        self.max_sge_rd
    }

    fn ctx_ptr(&self) -> *mut sys::ibv_context {
        // SAFETY: the pointer is only used while `self.ctx` (which owns the context) lives.
        unsafe { self.ctx.context().as_ptr() }
    }

    fn pd_ptr(&self, pd: PdId) -> Result<*mut sys::ibv_pd> {
        let e = slot(&self.pds, pd.0)?;
        // SAFETY: the pointer is only used while the entry (which owns the PD) lives.
        Ok(unsafe { e.pd.pd().as_ptr() })
    }

    /// Queue pair to error (flushing its work) and the connection closed; idempotent.
    fn fail_qp(&mut self, qp: QpId) {
        let Ok(e) = slot_mut(&mut self.qps, qp.0) else {
            return;
        };
        if e.state == QpState::Error {
            return;
        }
        e.state = QpState::Error;
        e.qp.to_error();
        if let Some(id) = &e.id {
            id.disconnect();
        }
        self.drop_region_exposures(qp);
    }

    /// The exposures made as regions for `qp`, which no longer carries an RPC, are
    /// deregistered: their keys would otherwise stay good on every other queue pair of the
    /// domain (a reconnecting peer could write with a key of its dead connection).
    fn drop_region_exposures(&mut self, qp: QpId) {
        self.windows
            .retain(|_, w| !matches!(w, Window::Mr { qp: q, .. } if *q == qp));
    }

    /// One asynchronous event of the device: what failed ends the connections it carried.
    fn on_async_event(&mut self, ev: AsyncEvent) {
        let d = &mut self.device_events;
        let failed: Vec<QpId> = match ev {
            AsyncEvent::QpFailed(num) => {
                d.qp_errors += 1;
                self.qp_by_num.get(&num).copied().into_iter().collect()
            }
            AsyncEvent::CqFailed(cq) => {
                d.cq_errors += 1;
                let on = |c: CqId| slot(&self.cqs, c.0).is_ok_and(|e| e.cq.ptr() == cq);
                self.qps_where(|e| on(e.send_cq) || on(e.recv_cq))
            }
            AsyncEvent::SrqFailed(srq) => {
                d.srq_errors += 1;
                let on = |s: SrqId| slot(&self.srqs, s.0).is_ok_and(|e| e.ptr() == srq);
                self.qps_where(|e| e.srq.is_some_and(on))
            }
            AsyncEvent::DeviceFatal => {
                d.device_fatal += 1;
                self.qps_where(|_| true)
            }
            AsyncEvent::PortDown(_) => {
                d.port_down += 1;
                Vec::new()
            }
            AsyncEvent::PortUp(_) => {
                d.port_up += 1;
                Vec::new()
            }
            AsyncEvent::QpLastWqe(num) => {
                self.last_wqe_reached(num);
                Vec::new()
            }
            AsyncEvent::Other(_) => Vec::new(),
        };
        for qp in failed {
            // An established connection is reported ended now (the connection manager may
            // never say so after a device failure); one still connecting ends through the
            // connection manager's error, as any failed connect does.
            let up = slot(&self.qps, qp.0).is_ok_and(|e| e.state == QpState::ReadyToSend);
            self.fail_qp(qp);
            if up {
                self.report_disconnect(qp);
            }
        }
    }

    /// The device's Last WQE Reached for queue pair number `num`: it takes no more buffers
    /// from its shared receive queue.
    fn last_wqe_reached(&mut self, num: u32) {
        self.device_events.last_wqe_reached += 1;
        let Some(&qp) = self.qp_by_num.get(&num) else {
            return;
        };
        if let Ok(e) = slot_mut(&mut self.qps, qp.0) {
            e.last_wqe = true;
        } else if let Some(r) = self.retiring.iter_mut().find(|r| r.id == qp) {
            r.entry.last_wqe = true;
        }
        self.advance_retiring();
    }

    /// What the device's Last WQE Reached for `qp` (live or retiring) does, counted as one:
    /// for tests on devices that never raise it.
    #[doc(hidden)]
    pub fn simulate_last_wqe_reached(&mut self, qp: QpId) {
        let num = match (
            slot(&self.qps, qp.0),
            self.retiring.iter().find(|r| r.id == qp),
        ) {
            (Ok(e), _) => e.qp.num(),
            (_, Some(r)) => r.entry.qp.num(),
            _ => return,
        };
        self.last_wqe_reached(num);
    }

    /// Moves the retiring queue pairs on: past the event once it came (a marker behind what
    /// they took, or on iWARP a poll that empties the CQ), and to their end past
    /// [`RETIRE_WAIT`].
    fn advance_retiring(&mut self) {
        if self.retiring.is_empty() {
            return;
        }
        let now = Instant::now();
        let iwarp = self.iwarp;
        let cqs = &self.cqs;
        for r in &mut self.retiring {
            if r.stage == Stage::Event && r.entry.last_wqe {
                r.stage = if iwarp {
                    r.marks = marks(cqs, &r.entry);
                    Stage::EmptyPoll
                } else {
                    post_marker(&r.entry)
                };
            }
            if now >= r.deadline && r.stage != Stage::Done {
                r.stage = Stage::Done;
                self.device_events.retire_timeouts += 1;
            }
        }
        self.finish_retiring();
    }

    /// Destroys the retiring queue pairs that are done; their numbers name nothing any more.
    fn finish_retiring(&mut self) {
        let by_num = &mut self.qp_by_num;
        self.retiring.retain_mut(|r| {
            if r.stage != Stage::Done {
                return true;
            }
            // The connection id before the queue pair.
            drop(r.entry.id.take());
            let num = r.entry.qp.num();
            if by_num.get(&num) == Some(&r.id) {
                by_num.remove(&num);
            }
            false
        });
    }

    /// The queue pairs whose entry satisfies `f` (a failure's victims: not a hot path).
    fn qps_where(&self, f: impl Fn(&QpEntry) -> bool) -> Vec<QpId> {
        self.qps
            .iter()
            .filter(|(_, e)| f(e))
            .map(|(h, _)| QpId(h))
            .collect()
    }

    fn report_disconnect(&mut self, qp: QpId) {
        if let Ok(e) = slot_mut(&mut self.qps, qp.0) {
            if !e.disconnect_reported {
                e.disconnect_reported = true;
                self.events.push_back(CmEvent::Disconnected { qp });
            }
        }
    }

    fn synth(&mut self, cq: CqId, wc: WorkCompletion) -> Result<()> {
        let c = slot_mut(&mut self.cqs, cq.0)?;
        c.synthetic.push_back(wc);
        Ok(())
    }

    fn qp_for_id(&self, id: *mut sys::rdma_cm_id) -> Option<QpId> {
        self.qps
            .iter()
            .find_map(|(h, e)| e.id.as_ref().filter(|c| c.raw() == id).map(|_| QpId(h)))
    }

    /// Move an InfiniBand/RoCE queue pair to `state` with the attributes rdma_cm computed.
    fn cm_modify(&self, qp: &QpEntry, id: &CmId, state: sys::QpTarget) -> io::Result<()> {
        if self.iwarp && state != sys::QpTarget::Init {
            return Ok(());
        }
        id.modify_qp(&qp.qp, state)
    }

    fn on_cm_event(&mut self, mut ev: sys::CmEventData) {
        use sys::CmEventKind as K;
        if self.cfg.strip_cm_padding && !self.iwarp {
            ev.private_data = strip_zero_padding(&ev.private_data);
        }
        match ev.kind {
            K::ConnectRequest => {
                let Some(listener) = self
                    .listeners
                    .iter()
                    .find_map(|(h, (id, _))| (id.raw() == ev.listen_id).then_some(h))
                else {
                    ev.reject_and_destroy();
                    return;
                };
                let Some(id) = ev.take_new_id() else { return };
                let remote = id.peer_addr();
                let Ok(req) = push(&mut self.reqs, id) else {
                    return;
                };
                self.events.push_back(CmEvent::ConnectRequest {
                    listener: ListenerId(listener),
                    req: ConnReqId(req),
                    private_data: ev.private_data,
                    remote,
                    responder_resources: ev.responder_resources,
                    initiator_depth: ev.initiator_depth,
                });
            }
            K::AddrResolved => {
                let Some(qp) = self.qp_for_id(ev.id) else {
                    return;
                };
                let route = match self.check_device(qp) {
                    Ok(()) => slot(&self.qps, qp.0)
                        .ok()
                        .and_then(|e| e.id.as_ref())
                        .map_or(Err(ConnectFailure::Local(0)), |id| {
                            id.resolve_route(self.cfg.resolve_timeout_ms)
                                .map_err(|e| ConnectFailure::from_io(&e))
                        }),
                    Err(()) => Err(ConnectFailure::NoRoute),
                };
                if let Err(cause) = route {
                    self.connect_failed(qp, cause);
                }
            }
            K::RouteResolved => {
                let Some(qp) = self.qp_for_id(ev.id) else {
                    return;
                };
                match self.send_connect(qp) {
                    Ok(()) => {}
                    Err(e) if self.iwarp && source_port_taken(&e) => {
                        if !self.connect_from_another_port(qp) {
                            self.connect_failed(qp, ConnectFailure::from_io(&e));
                        }
                    }
                    Err(e) => self.connect_failed(qp, ConnectFailure::from_io(&e)),
                }
            }
            K::ConnectResponse => {
                // InfiniBand/RoCE with a provider-owned queue pair: RTR, RTS, then RTU.
                let Some(qp) = self.qp_for_id(ev.id) else {
                    return;
                };
                let ok = (|| -> io::Result<()> {
                    let e = slot(&self.qps, qp.0).map_err(|_| io::Error::other("qp"))?;
                    let id = e.id.as_ref().ok_or_else(|| io::Error::other("id"))?;
                    self.cm_modify(e, id, sys::QpTarget::Rtr)?;
                    self.cm_modify(e, id, sys::QpTarget::Rts)?;
                    id.establish()
                })();
                match ok {
                    Ok(()) => self.established(qp, ev.private_data),
                    Err(e) => self.connect_failed(qp, ConnectFailure::from_io(&e)),
                }
            }
            K::Established => {
                let Some(qp) = self.qp_for_id(ev.id) else {
                    return;
                };
                let pd = if self.connecting.contains_key(&qp.0) {
                    ev.private_data
                } else {
                    PrivateData::EMPTY
                };
                self.established(qp, pd);
            }
            K::Rejected => {
                let Some(qp) = self.qp_for_id(ev.id) else {
                    return;
                };
                self.connecting.remove(&qp.0);
                // IB CM reason 28 is "consumer defined": the peer's reject. Anything else
                // (no listener, timeout) is a failure to connect. iWARP reports every MPA
                // reject the same way.
                let consumer = self.iwarp || ev.status == 28;
                if let Ok(e) = slot_mut(&mut self.qps, qp.0) {
                    e.state = QpState::Error;
                    e.qp.to_error();
                }
                if consumer {
                    self.events.push_back(CmEvent::Rejected {
                        qp,
                        private_data: ev.private_data,
                    });
                } else {
                    self.events.push_back(CmEvent::ConnectError {
                        qp,
                        cause: ConnectFailure::Unreachable,
                    });
                }
            }
            K::Failed(cause) => {
                if let Some(qp) = self.qp_for_id(ev.id) {
                    self.connect_failed(qp, cause);
                }
            }
            K::Disconnected => {
                let Some(qp) = self.qp_for_id(ev.id) else {
                    return;
                };
                self.fail_qp(qp);
                if let Ok(e) = slot(&self.qps, qp.0) {
                    if let Some(id) = &e.id {
                        // Answer the peer's request (DREP) so it is not left to time out.
                        id.disconnect();
                    }
                }
                self.report_disconnect(qp);
            }
            K::Other => {}
        }
    }

    fn check_device(&self, qp: QpId) -> std::result::Result<(), ()> {
        let e = slot(&self.qps, qp.0).map_err(|_| ())?;
        let id = e.id.as_ref().ok_or(())?;
        match id.device_name() {
            Some(n) if n == self.name => Ok(()),
            _ => Err(()),
        }
    }

    fn send_connect(&mut self, qp: QpId) -> io::Result<()> {
        let c = self
            .connecting
            .get(&qp.0)
            .ok_or_else(|| io::Error::other("not connecting"))?;
        let e = slot(&self.qps, qp.0).map_err(|_| io::Error::other("qp"))?;
        let id = e.id.as_ref().ok_or_else(|| io::Error::other("id"))?;
        self.cm_modify(e, id, sys::QpTarget::Init)?;
        id.connect(&sys::ConnParam {
            private_data: c.private_data.as_slice(),
            responder_resources: c.responder_resources,
            initiator_depth: c.initiator_depth,
            retry_count: self.cfg.retry_count,
            rnr_retry: self.cfg.rnr_retry,
            qp_num: e.qp.num(),
        })
    }

    /// iWARP: rdma_cm takes the source port from its own port space, blind to TCP's, and the
    /// device's TCP stack (siw: the kernel's) then binds a socket to it, which fails when a
    /// TCP socket holds the port (a listener in the ephemeral range: mountd, statd, any
    /// application). Start over from address resolution on a fresh id, keeping the spent one
    /// so that rdma_cm picks another port. False when the tries are used up or the fresh id
    /// cannot start.
    fn connect_from_another_port(&mut self, qp: QpId) -> bool {
        let Some(c) = self.connecting.get_mut(&qp.0) else {
            return false;
        };
        if c.spent.len() + 1 >= CONNECT_PORT_TRIES {
            return false;
        }
        let Ok(id) = self.channel.create_id() else {
            return false;
        };
        if id
            .resolve_addr(None, c.addr, self.cfg.resolve_timeout_ms)
            .is_err()
        {
            return false;
        }
        let Ok(e) = slot_mut(&mut self.qps, qp.0) else {
            return false;
        };
        if let Some(spent) = e.id.replace(id) {
            c.spent.push(spent);
        }
        true
    }

    fn connect_failed(&mut self, qp: QpId, cause: ConnectFailure) {
        self.connecting.remove(&qp.0);
        if let Ok(e) = slot_mut(&mut self.qps, qp.0) {
            if e.state == QpState::Error {
                return;
            }
            e.state = QpState::Error;
            e.qp.to_error();
        }
        self.events.push_back(CmEvent::ConnectError { qp, cause });
    }

    fn established(&mut self, qp: QpId, private_data: PrivateData) {
        self.connecting.remove(&qp.0);
        if let Ok(e) = slot_mut(&mut self.qps, qp.0) {
            if e.state != QpState::Connecting {
                return;
            }
            e.state = QpState::ReadyToSend;
            self.events
                .push_back(CmEvent::Established { qp, private_data });
        }
    }

    fn convert(&mut self, w: &sys::ibv_wc, out: &mut WorkCompletion) -> bool {
        use sys::ibv_wc_status as S;
        let qp = self.qp_by_num.get(&w.qp_num).copied().unwrap_or(QpId::GONE);
        let status = match w.status {
            S::IBV_WC_SUCCESS => WcStatus::Success,
            S::IBV_WC_LOC_LEN_ERR => WcStatus::LocalLengthError,
            S::IBV_WC_LOC_QP_OP_ERR => WcStatus::LocalQpOperationError,
            S::IBV_WC_LOC_PROT_ERR | S::IBV_WC_MW_BIND_ERR | S::IBV_WC_LOC_ACCESS_ERR => {
                WcStatus::LocalProtectionError
            }
            S::IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
            S::IBV_WC_REM_INV_REQ_ERR => WcStatus::RemoteInvalidRequest,
            S::IBV_WC_REM_ACCESS_ERR => WcStatus::RemoteAccessError,
            S::IBV_WC_REM_OP_ERR | S::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RemoteOperationError,
            _ => WcStatus::Fatal,
        };
        if status != WcStatus::Success && status != WcStatus::Flushed {
            self.fail_qp(qp);
        }
        if w.wr_id == INTERNAL_WR_ID {
            return false;
        }
        if w.wr_id == RETIRE_WR_ID {
            if let Some(r) = self.retiring.iter_mut().find(|r| r.id == qp) {
                r.stage = Stage::Done;
            }
            return false;
        }
        use sys::ibv_wc_opcode as O;
        let mut opcode = match w.opcode {
            O::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
            O::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
            O::IBV_WC_LOCAL_INV => WcOpcode::LocalInvalidate,
            o if o & O::IBV_WC_RECV != 0 => WcOpcode::Recv,
            _ => WcOpcode::Send,
        };
        // The opcode of an error completion is undefined in verbs (rxe leaves receive
        // flushes at 0, "send"): the queue pair's oldest outstanding receive tells.
        if let Ok(e) = slot_mut(&mut self.qps, qp.0) {
            if opcode == WcOpcode::Recv
                || (status != WcStatus::Success && e.recvs.front() == Some(&w.wr_id))
            {
                if e.recvs.front() == Some(&w.wr_id) {
                    e.recvs.pop_front();
                }
                opcode = WcOpcode::Recv;
            }
        }
        let mut invalidated_rkey = None;
        let inv_bits = if self.rxe {
            sys::IBV_WC_WITH_INV | sys::IB_WC_WITH_INVALIDATE_KERNEL
        } else {
            sys::IBV_WC_WITH_INV
        };
        if status == WcStatus::Success && opcode == WcOpcode::Recv && w.wc_flags & inv_bits != 0 {
            // SAFETY: IBV_WC_WITH_INV says the union holds the invalidated rkey.
            let rkey = unsafe { w.imm_data_invalidated_rkey_union.invalidated_rkey };
            invalidated_rkey = Some(rkey);
            self.retire_window(rkey);
        }
        *out = WorkCompletion {
            wr_id: w.wr_id,
            status,
            opcode,
            byte_len: if opcode == WcOpcode::Recv || opcode == WcOpcode::RdmaRead {
                w.byte_len
            } else {
                0
            },
            qp,
            invalidated_rkey,
        };
        true
    }

    /// The exposure under `rkey` is dead: its window goes back to its queue pair's pool, a
    /// fallback region is deregistered.
    fn retire_window(&mut self, rkey: u32) {
        match self.windows.remove(&rkey) {
            Some(Window::Mw { mw, qp }) => {
                if let Ok(e) = slot_mut(&mut self.qps, qp.0) {
                    e.free_mws.push((mw, rkey));
                }
            }
            Some(Window::Mr { mr, .. }) => drop(mr),
            None => {}
        }
    }

    fn sges(&self, sg: &[Sge], max: u32, buf: &mut [sys::ibv_sge; MAX_SGE]) -> Result<i32> {
        if sg.len() > MAX_SGE || sg.len() > max as usize {
            return Err(Error::TooManySge);
        }
        for (d, s) in buf.iter_mut().zip(sg) {
            *d = sys::ibv_sge {
                addr: s.addr,
                length: s.len,
                lkey: s.lkey,
            };
        }
        Ok(sg.len() as i32)
    }
}

/// A retiring queue pair's send and receive CQs, with the entries polled from each so far
/// ([`Stage::EmptyPoll`]'s bound counts from there).
fn marks(cqs: &Slab<CqEntry>, e: &QpEntry) -> [(CqId, u64); 2] {
    let mark = |c: CqId| (c, slot(cqs, c.0).map_or(0, |x| x.polled));
    [mark(e.send_cq), mark(e.recv_cq)]
}

/// Posts a retiring queue pair's marker ([`Retiring`]): the stage it is in then (done at once
/// if the device refuses it).
fn post_marker(e: &QpEntry) -> Stage {
    let wr = SendWr {
        wr_id: RETIRE_WR_ID,
        op: SendOp::Send,
        sg: &[],
        signaled: true,
    };
    match e.qp.post_send(&wr, &[]) {
        Ok(()) => Stage::Marker,
        Err(_) => Stage::Done,
    }
}

impl Provider for IbvProvider {
    fn alloc_pd(&mut self) -> Result<PdId> {
        let pd = self
            .ctx
            .alloc_pd()
            .map_err(|e| Error::Io(io::Error::other(e.to_string())))?;
        Ok(PdId(push(&mut self.pds, PdEntry { pd })?))
    }

    fn dealloc_pd(&mut self, pd: PdId) -> Result<()> {
        slot(&self.pds, pd.0)?;
        let busy =
            self.mrs.iter().any(|(_, m)| m.pd == pd) || self.qps.iter().any(|(_, q)| q.pd == pd);
        if busy {
            return Err(Error::BadState);
        }
        self.pds.remove(pd.0);
        Ok(())
    }

    unsafe fn register(
        &mut self,
        pd: PdId,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mr> {
        let e = slot(&self.pds, pd.0)?;
        let remote = access.contains(Access::REMOTE_READ)
            || access.contains(Access::REMOTE_WRITE)
            || access.contains(Access::BIND);
        // Windows need the bind right on their region; without windows each exposure is a
        // region of its own (`expose`), and this one keeps only the rights asked for.
        let flags = access_flags(access, remote && self.has_mw2);
        // SAFETY: the caller guarantees the range stays valid while registered (trait contract).
        let mr = unsafe { e.pd.reg_mr(addr as usize, len, flags) }
            .map_err(|e| Error::Io(io::Error::other(e.to_string())))?;
        let out = Mr {
            id: MrId(0),
            lkey: mr.lkey(),
            rkey: mr.rkey(),
            addr: addr as u64,
            len: len as u64,
        };
        let id = push(
            &mut self.mrs,
            MrEntry {
                mr,
                pd,
                addr: addr as u64,
                len: len as u64,
                access,
            },
        )?;
        Ok(Mr {
            id: MrId(id),
            ..out
        })
    }

    fn deregister(&mut self, mr: MrId) -> Result<()> {
        let e = slot(&self.mrs, mr.0)?;
        let (lo, hi) = (e.addr, e.addr.saturating_add(e.len));
        // Fallback exposures of this region die with it; bound windows are invalidated by
        // the device when their region goes.
        let dead: Vec<u32> = self
            .windows
            .iter()
            .filter_map(|(k, w)| match w {
                Window::Mr { mr, .. } => {
                    let a = mr.get_ptr() as u64;
                    (a >= lo && a < hi).then_some(*k)
                }
                Window::Mw { .. } => None,
            })
            .collect();
        for k in dead {
            self.windows.remove(&k);
        }
        self.mrs.remove(mr.0);
        Ok(())
    }

    fn expose(&mut self, qp: QpId, mr: MrId, offset: u64, len: u64, access: Access) -> Result<u32> {
        let m = slot(&self.mrs, mr.0)?;
        let end = offset
            .checked_add(len)
            .ok_or(Error::InvalidArgument("offset + len overflows"))?;
        if end > m.len || len == 0 {
            return Err(Error::InvalidArgument("exposure outside the region"));
        }
        if !m.access.may_expose(access) {
            return Err(Error::InvalidArgument(
                "exposure wider than the region's rights",
            ));
        }
        let addr = m.addr + offset;
        let q = slot(&self.qps, qp.0)?;
        if q.pd != m.pd {
            return Err(Error::InvalidArgument(
                "queue pair and region in different domains",
            ));
        }
        if !self.has_mw2 {
            let pd = slot(&self.pds, q.pd.0)?;
            // SAFETY: the bytes lie inside a registered region, whose memory the caller of
            // `register` keeps valid until it is deregistered, which drops this one first.
            let r = unsafe {
                pd.pd
                    .reg_mr(addr as usize, len as usize, access_flags(access, false))
            }
            .map_err(|e| Error::Io(io::Error::other(e.to_string())))?;
            let rkey = r.rkey();
            self.windows.insert(rkey, Window::Mr { mr: r, qp });
            return Ok(rkey);
        }
        if q.state != QpState::ReadyToSend {
            return Err(Error::BadState);
        }
        let mr_ptr = {
            // SAFETY: used only for this bind, while the region entry lives.
            unsafe { m.mr.mr().as_ptr() }
        };
        let pd_ptr = self.pd_ptr(q.pd)?;
        let q = slot_mut(&mut self.qps, qp.0)?;
        let (mw, old) = match q.free_mws.pop() {
            Some(x) => x,
            None => {
                let mw = RawMw::alloc(pd_ptr)?;
                let k = mw.rkey();
                (mw, k)
            }
        };
        let rkey = sys::inc_rkey(old);
        if let Err(e) =
            q.qp.bind_mw(INTERNAL_WR_ID, &mw, rkey, mr_ptr, addr, len, access)
        {
            q.free_mws.push((mw, old));
            return Err(e);
        }
        self.windows.insert(rkey, Window::Mw { mw, qp });
        Ok(rkey)
    }

    fn max_cq_depth(&self) -> u32 {
        self.max_cqe
    }

    // Room for a window bind and an invalidation per request.
    fn send_queue_entries(&self, max_send_wr: u32) -> u32 {
        max_send_wr.saturating_mul(3)
    }

    fn create_cq(&mut self, depth: u32) -> Result<CqId> {
        let cq = RawCq::new(self.ctx_ptr(), depth, &self.comp)?;
        let capacity = u64::from(cq.capacity().max(depth));
        Ok(CqId(push(
            &mut self.cqs,
            CqEntry {
                cq,
                synthetic: VecDeque::with_capacity(depth as usize),
                capacity,
                polled: 0,
            },
        )?))
    }

    fn destroy_cq(&mut self, cq: CqId) -> Result<()> {
        slot(&self.cqs, cq.0)?;
        if self
            .qps
            .iter()
            .any(|(_, q)| q.send_cq == cq || q.recv_cq == cq)
        {
            return Err(Error::BadState);
        }
        // Events already queued are taken and acknowledged while every CQ still lives.
        self.comp.drain();
        self.cqs.remove(cq.0);
        Ok(())
    }

    fn poll_cq(&mut self, cq: CqId, wcs: &mut [WorkCompletion]) -> Result<usize> {
        let mut n = 0;
        {
            let c = slot_mut(&mut self.cqs, cq.0)?;
            while n < wcs.len() {
                match c.synthetic.pop_front() {
                    Some(w) => {
                        wcs[n] = w;
                        n += 1;
                    }
                    None => break,
                }
            }
        }
        let mut raw = [sys::zero_wc(); 32];
        let mut taken = 0u64;
        while n < wcs.len() {
            let want = (wcs.len() - n).min(raw.len());
            let got = slot(&self.cqs, cq.0)?.cq.poll(&mut raw[..want])?;
            taken += got as u64;
            for w in &raw[..got] {
                if self.convert(w, &mut wcs[n]) {
                    n += 1;
                }
            }
            if got < want {
                break;
            }
        }
        if !self.retiring.is_empty() {
            if let Ok(c) = slot_mut(&mut self.cqs, cq.0) {
                c.polled += taken;
            }
            // What waited for a poll that empties this CQ has had it if this one came back
            // not full (a queue pair is retired outside a poll, so all it had was here), or
            // once its CQs have given up all they held when it was retired.
            let drained = n < wcs.len();
            let cqs = &self.cqs;
            let through = |&(c, at): &(CqId, u64)| {
                slot(cqs, c.0).map_or(true, |e| e.polled.saturating_sub(at) >= e.capacity)
            };
            for r in &mut self.retiring {
                if r.stage != Stage::EmptyPoll {
                    continue;
                }
                let on = r.entry.send_cq == cq || r.entry.recv_cq == cq;
                if (drained && on) || r.marks.iter().all(through) {
                    r.stage = Stage::Done;
                }
            }
            // Also past `RETIRE_WAIT`: `qp_retired` comes true within bounded polls.
            self.advance_retiring();
        }
        Ok(n)
    }

    fn create_srq(&mut self, pd: PdId, depth: u32, max_sge: u32) -> Result<SrqId> {
        let srq = RawSrq::new(self.pd_ptr(pd)?, depth, max_sge.min(MAX_SGE as u32))?;
        Ok(SrqId(push(&mut self.srqs, srq)?))
    }

    fn destroy_srq(&mut self, srq: SrqId) -> Result<()> {
        slot(&self.srqs, srq.0)?;
        self.srqs.remove(srq.0);
        Ok(())
    }

    fn post_srq_recv(&mut self, srq: SrqId, wr_id: u64, sg: &[Sge]) -> Result<()> {
        let mut buf = [sys::zero_sge(); MAX_SGE];
        let n = self.sges(sg, MAX_SGE as u32, &mut buf)?;
        slot(&self.srqs, srq.0)?.post_recv(wr_id, &buf[..n as usize])
    }

    fn create_qp(&mut self, init: &QpInit) -> Result<QpId> {
        if init.max_sge as usize > MAX_SGE {
            return Err(Error::TooManySge);
        }
        let pd = self.pd_ptr(init.pd)?;
        let send_cq = slot(&self.cqs, init.send_cq.0)?.cq.ptr();
        let recv_cq = slot(&self.cqs, init.recv_cq.0)?.cq.ptr();
        let srq = match init.srq {
            Some(s) => slot(&self.srqs, s.0)?.ptr(),
            None => std::ptr::null_mut(),
        };
        let qp = RawQp::new(
            pd,
            send_cq,
            recv_cq,
            srq,
            self.send_queue_entries(init.max_send_wr),
            init.max_recv_wr,
            init.max_sge.max(1),
        )?;
        qp.to_init(self.cfg.port)?;
        let num = qp.num();
        let id = push(
            &mut self.qps,
            QpEntry {
                qp,
                pd: init.pd,
                send_cq: init.send_cq,
                recv_cq: init.recv_cq,
                srq: init.srq,
                max_sge: init.max_sge.max(1),
                state: QpState::Init,
                accepted: false,
                id: None,
                disconnect_reported: false,
                free_mws: Vec::with_capacity(64),
                recvs: VecDeque::with_capacity(init.max_recv_wr as usize),
                last_wqe: false,
            },
        )?;
        self.qp_by_num.insert(num, QpId(id));
        Ok(QpId(id))
    }

    fn destroy_qp(&mut self, qp: QpId) -> Result<()> {
        let e = slot_mut(&mut self.qps, qp.0)?;
        if let Some(id) = &e.id {
            id.disconnect();
        }
        let (num, on_srq) = (e.qp.num(), e.srq.is_some());
        self.windows.retain(
            |_, w| !matches!(w, Window::Mw { qp: q, .. } | Window::Mr { qp: q, .. } if *q == qp),
        );
        self.connecting.remove(&qp.0);
        // Drop order: windows, then the cm id, then the queue pair.
        let Some(mut e) = self.qps.remove(qp.0) else {
            return Ok(());
        };
        e.free_mws.clear();
        // Kept, in the error state and with its connection id (siw gives the queue pair's
        // number to the next one once the id is gone), while the device may still report it
        // ([`Retiring`]).
        let stage = match (self.kernel_soft, on_srq) {
            (false, false) => {
                drop(e.id.take());
                self.qp_by_num.remove(&num);
                return Ok(());
            }
            (false, true) => Stage::Event,
            (true, _) if self.iwarp => Stage::EmptyPoll,
            (true, _) => Stage::Marker,
        };
        e.state = QpState::Error;
        e.qp.to_error();
        let stage = if stage == Stage::Marker {
            post_marker(&e)
        } else {
            stage
        };
        // Taken after the error transition, which on siw completes all the queue pair holds.
        let marks = marks(&self.cqs, &e);
        self.retiring.push(Retiring {
            id: qp,
            entry: e,
            stage,
            deadline: Instant::now() + RETIRE_WAIT,
            marks,
        });
        self.advance_retiring();
        Ok(())
    }

    fn qp_retired(&self, qp: QpId) -> bool {
        self.retiring.iter().all(|r| r.id != qp)
    }

    fn qp_state(&self, qp: QpId) -> Result<QpState> {
        Ok(slot(&self.qps, qp.0)?.state)
    }

    fn post_recv(&mut self, qp: QpId, wr_id: u64, sg: &[Sge]) -> Result<()> {
        let e = slot(&self.qps, qp.0)?;
        if e.srq.is_some() {
            return Err(Error::BadState);
        }
        let mut buf = [sys::zero_sge(); MAX_SGE];
        let n = self.sges(sg, e.max_sge, &mut buf)?;
        if e.state == QpState::Error {
            let cq = e.recv_cq;
            return self.synth(
                cq,
                WorkCompletion {
                    wr_id,
                    status: WcStatus::Flushed,
                    opcode: WcOpcode::Recv,
                    qp,
                    ..WorkCompletion::default()
                },
            );
        }
        e.qp.post_recv(wr_id, &buf[..n as usize])?;
        if let Ok(e) = slot_mut(&mut self.qps, qp.0) {
            e.recvs.push_back(wr_id);
        }
        Ok(())
    }

    fn post_send(&mut self, qp: QpId, wr: &SendWr<'_>) -> Result<()> {
        let e = slot(&self.qps, qp.0)?;
        if matches!(wr.op, SendOp::RdmaRead { .. }) && wr.sg.len() > self.max_sge_rd {
            return Err(Error::TooManySge);
        }
        let mut buf = [sys::zero_sge(); MAX_SGE];
        let n = self.sges(wr.sg, e.max_sge, &mut buf)?;
        match e.state {
            QpState::ReadyToSend => {}
            QpState::Connecting if e.accepted => {}
            QpState::Error => {
                let cq = e.send_cq;
                let opcode = match wr.op {
                    SendOp::Send | SendOp::SendWithInvalidate { .. } => WcOpcode::Send,
                    SendOp::RdmaWrite { .. } => WcOpcode::RdmaWrite,
                    SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
                    SendOp::LocalInvalidate { .. } => WcOpcode::LocalInvalidate,
                };
                return self.synth(
                    cq,
                    WorkCompletion {
                        wr_id: wr.wr_id,
                        status: WcStatus::Flushed,
                        opcode,
                        qp,
                        ..WorkCompletion::default()
                    },
                );
            }
            _ => return Err(Error::BadState),
        }
        if let SendOp::LocalInvalidate { rkey } = wr.op {
            if matches!(self.windows.get(&rkey), Some(Window::Mr { .. })) {
                // Fallback exposure: deregistering is the invalidation.
                let cq = e.send_cq;
                self.windows.remove(&rkey);
                if wr.signaled {
                    return self.synth(
                        cq,
                        WorkCompletion {
                            wr_id: wr.wr_id,
                            opcode: WcOpcode::LocalInvalidate,
                            qp,
                            ..WorkCompletion::default()
                        },
                    );
                }
                return Ok(());
            }
            e.qp.post_send(wr, &buf[..n as usize])?;
            self.retire_window(rkey);
            return Ok(());
        }
        e.qp.post_send(wr, &buf[..n as usize])
    }

    fn listen(&mut self, addr: SocketAddr) -> Result<ListenerId> {
        let id = self.channel.create_id()?;
        id.bind(addr)?;
        id.listen(64)?;
        let port = id.src_port();
        let bound = SocketAddr::new(addr.ip(), port);
        Ok(ListenerId(push(&mut self.listeners, (id, bound))?))
    }

    fn listen_addr(&self, listener: ListenerId) -> Result<SocketAddr> {
        Ok(slot(&self.listeners, listener.0)?.1)
    }

    fn close_listener(&mut self, listener: ListenerId) -> Result<()> {
        slot(&self.listeners, listener.0)?;
        self.listeners.remove(listener.0);
        Ok(())
    }

    fn connect(&mut self, qp: QpId, addr: SocketAddr, params: &ConnParams<'_>) -> Result<()> {
        if params.private_data.len() > crate::MAX_PRIVATE_DATA {
            return Err(Error::InvalidArgument("private data too long"));
        }
        let e = slot(&self.qps, qp.0)?;
        if e.state != QpState::Init || e.id.is_some() {
            return Err(Error::BadState);
        }
        let id = self.channel.create_id()?;
        id.resolve_addr(None, addr, self.cfg.resolve_timeout_ms)?;
        let e = slot_mut(&mut self.qps, qp.0)?;
        e.id = Some(id);
        e.state = QpState::Connecting;
        self.connecting.insert(
            qp.0,
            Connecting {
                private_data: PrivateData::new(params.private_data),
                responder_resources: params.responder_resources,
                initiator_depth: params.initiator_depth,
                addr,
                spent: Vec::new(),
            },
        );
        Ok(())
    }

    fn accept(&mut self, req: ConnReqId, qp: QpId, params: &ConnParams<'_>) -> Result<()> {
        let id = self.reqs.remove(req.0).ok_or(Error::BadHandle)?;
        let e = slot(&self.qps, qp.0)?;
        if e.state != QpState::Init || e.id.is_some() {
            return Err(Error::BadState);
        }
        let run = || -> io::Result<()> {
            self.cm_modify(e, &id, sys::QpTarget::Init)?;
            self.cm_modify(e, &id, sys::QpTarget::Rtr)?;
            self.cm_modify(e, &id, sys::QpTarget::Rts)?;
            id.accept(&sys::ConnParam {
                private_data: params.private_data,
                responder_resources: params.responder_resources,
                initiator_depth: params.initiator_depth,
                retry_count: self.cfg.retry_count,
                rnr_retry: self.cfg.rnr_retry,
                qp_num: e.qp.num(),
            })
        };
        run()?;
        let e = slot_mut(&mut self.qps, qp.0)?;
        e.id = Some(id);
        e.state = QpState::Connecting;
        e.accepted = true;
        Ok(())
    }

    fn hand_over(&mut self, req: ConnReqId) -> Result<Handover> {
        let id = self.reqs.remove(req.0).ok_or(Error::BadHandle)?;
        Ok(Handover::new(sys::MovingId(id)))
    }

    fn take_over(&mut self, request: Handover) -> Result<ConnReqId> {
        let sys::MovingId(id) = request
            .take()
            .map_err(|_| Error::InvalidArgument("another provider's connection request"))?;
        id.migrate(&self.channel)?;
        push(&mut self.reqs, id).map(ConnReqId)
    }

    fn reject(&mut self, req: ConnReqId, private_data: &[u8]) -> Result<()> {
        let id = self.reqs.remove(req.0).ok_or(Error::BadHandle)?;
        id.reject(private_data)?;
        Ok(())
    }

    fn drain_send_queue(&mut self, qp: QpId, wr_id: u64) -> Result<bool> {
        let e = slot(&self.qps, qp.0)?;
        if e.state != QpState::Error {
            return Err(Error::BadState);
        }
        // iWARP devices take no marker. Kernel siw accepts a user queue pair's post in the
        // error state (the work goes into the mapped ring, and the doorbell flushes an empty
        // list) and never completes it: the VM saw no completion in 20 s. It needs none:
        // siw's receive and send paths place and send only in RTS under the queue pair's
        // state lock, which the error transition holds. The kernel drains iWARP devices with
        // their own callbacks for the same reason.
        if self.iwarp {
            return Ok(false);
        }
        // Posted to the device itself, not made up as `post_send` does in the error state: a
        // made-up completion would be reported ahead of the flushes the device still owes.
        let wr = SendWr {
            wr_id,
            op: SendOp::Send,
            sg: &[],
            signaled: true,
        };
        Ok(e.qp.post_send(&wr, &[]).is_ok())
    }

    fn disconnect(&mut self, qp: QpId) -> Result<()> {
        slot(&self.qps, qp.0)?;
        self.fail_qp(qp);
        Ok(())
    }

    fn poll_cm(&mut self) -> Option<CmEvent> {
        // Completions: the channel's events are taken and every CQ is armed again, so the
        // event fd wakes a sleeper at the next completion (its owner polls the CQs once more
        // before it sleeps: what completed before the arming is found that way).
        self.comp.drain();
        for (_, c) in self.cqs.iter() {
            let _ = c.cq.arm();
        }
        while let Some(ev) = sys::next_async_event(self.ctx_ptr()) {
            self.on_async_event(ev);
        }
        self.advance_retiring();
        if self.events.is_empty() {
            while let Some(ev) = self.channel.next_event() {
                self.on_cm_event(ev);
            }
        }
        self.events.pop_front()
    }

    fn busy(&self) -> bool {
        // A retiring queue pair moves on at polls (a marker, an empty CQ, `RETIRE_WAIT`).
        !self.retiring.is_empty()
    }

    fn event_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(self.wake.fd())
    }

    fn device_events(&self) -> DeviceEvents {
        self.device_events
    }
}

impl Drop for IbvProvider {
    fn drop(&mut self) {
        // rdma_cm ids first, then windows, queue pairs, SRQs, CQs, regions, domains.
        self.reqs.clear();
        self.listeners.clear();
        for q in self.qps.values_mut() {
            drop(q.id.take());
        }
        for r in &mut self.retiring {
            drop(r.entry.id.take());
        }
        self.windows.clear();
        for q in self.qps.values_mut() {
            q.free_mws.clear();
        }
        self.qps.clear();
        self.retiring.clear();
        self.srqs.clear();
        self.comp.drain();
        self.cqs.clear();
        self.mrs.clear();
        self.pds.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cm_padding_stripped_to_what_the_peer_sent() {
        let mut padded = [0u8; 56];
        padded[..8].copy_from_slice(&[0xf6, 0xab, 0x0e, 0x18, 0x01, 0x01, 0x03, 0x03]);
        let s = strip_zero_padding(&PrivateData::new(&padded));
        assert_eq!(s.as_slice(), &padded[..8]);
        assert!(strip_zero_padding(&PrivateData::new(&[0; 148]))
            .as_slice()
            .is_empty());
    }

    #[test]
    fn remote_write_implies_local_write_and_windows_need_bind() {
        let f = access_flags(Access::REMOTE_WRITE, false);
        assert!(f.contains(AccessFlags::RemoteWrite) && f.contains(AccessFlags::LocalWrite));
        assert!(!f.contains(AccessFlags::MemoryWindowBind));
        let f = access_flags(Access::REMOTE_READ, true);
        assert!(f.contains(AccessFlags::RemoteRead) && f.contains(AccessFlags::MemoryWindowBind));
        assert!(!f.contains(AccessFlags::LocalWrite));
    }
}
