//! The `soft` provider: iWARP (RDMAP/DDP/MPA, the Linux `siw` wire) in user space, over TCP
//! ([`SoftTcp`]) or over an in-memory fabric ([`SoftMem`]).
//!
//! Everything happens inside [`Provider::poll_cq`] and [`Provider::poll_cm`]: sockets are
//! nonblocking, the provider has no thread, and the target side of RDMA Write/Read is done
//! while it is polled. Buffers (per queue pair: one transmit and one receive buffer) are
//! allocated when the queue pair is created and reused; posting and polling allocate nothing.
//!
//! A poll visits only the queue pairs with news, so idle connections cost it nothing however
//! many there are: those whose links the transport reports ready (TCP: an `epoll_wait` without
//! waiting, edge-triggered, one token per link; in memory: the pipe a peer wrote to or drained
//! puts its reader's or writer's token on its provider's ready list), those with new send-queue
//! work, those still connecting, and those a visit stopped at its round limit (eight rounds of
//! framing, writing and reading, so that one busy connection cannot starve the others). A link
//! is read only after news and until a read comes back short or finds nothing, and written
//! until a write is refused; the refusal's end is news again. [`Provider::busy`] says when
//! work is left for the next poll without news (a parked owner must not sleep then),
//! including a listener's or pending connection's readiness that a completion poll's
//! `epoll_wait` took, kept for the next [`Provider::poll_cm`].
//!
//! Known simplifications: Sends and Writes complete once their last byte is framed (as siw
//! completes them once handed to TCP), so a Write the peer refuses completes successfully and
//! the refusal shows as the queue pair's error and flushed later work; peer-to-peer (RTR) mode
//! and markers are never used; a completion queue that overflows its depth grows (allocates)
//! instead of failing; a responder does not hold its first FPDU until the initiator's has
//! arrived (RFC 5044 leaves that to the ULP; RPC-over-RDMA clients speak first); RDMA Reads
//! may scatter into several entries (the wire carries the first entry's key and address as
//! the sink).

pub mod link;
mod mem;
pub mod wire;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::slab::Slab;
use crate::{
    AcceptFilter, Access, CmEvent, ConnParams, ConnReqId, ConnectFailure, CqId, Error, Handover,
    ListenerId, Mr, MrId, PdId, PrivateData, Provider, QpId, QpInit, QpState, Result, SendOp,
    SendWr, Sge, SrqId, WcOpcode, WcStatus, WorkCompletion, MAX_PRIVATE_DATA, MAX_SGE,
};
use link::{Link, MemFabric, MemPort, Tcp, Transport};
use mem::{Kind, Mem};
use wire::{Segment, TermCode, WireError};

/// Soft provider over TCP.
pub type SoftTcp = SoftProvider<Tcp>;
/// Soft provider over the in-memory fabric (single-threaded: see [`MemFabric`]).
pub type SoftMem = SoftProvider<MemPort>;

/// Largest IRD/ORD (siw's device maximum).
pub const MAX_IRD_ORD: u16 = 128;
/// Transmit bytes framed ahead of the socket before the send queue waits.
const TX_HIGH: usize = 256 << 10;
/// Receive buffer size (holds several maximum FPDUs).
const RX_CAP: usize = 512 << 10;
/// FPDU size when the transport has no MSS (in memory): siw's loopback value.
const DEFAULT_FPDU: usize = 65480;

/// Settings of a soft provider.
#[derive(Debug, Clone, Copy)]
pub struct SoftConfig {
    /// Ask for (as initiator) / grant (as responder) MPA CRC-32C. Linux siw asks for none but
    /// accepts a Reply that turns it on.
    pub crc: bool,
    /// MPA revision of our Requests: 2 (RFC 6581 IRD/ORD, siw's default) or 1.
    pub mpa_revision: u8,
    /// FPDU size in bytes (rounded down to a multiple of 8, 64..=65528); `None`: the TCP MSS
    /// like siw, or 65480 in memory.
    pub fpdu_size: Option<usize>,
    /// How long an initiator waits for the MPA Reply (siw: 10 s).
    pub connect_timeout: Duration,
    /// How long a responder waits for the MPA Request of an accepted stream (siw: 5 s).
    pub request_timeout: Duration,
    /// Accepted streams whose connection request is not settled yet (no MPA Request, or not
    /// yet accepted or rejected) held at most, over all listeners. At this many, no stream is
    /// accepted: the next ones wait in the kernel's listen backlog (TCP's own flow control
    /// beyond it) until one held is settled or times out, so a flood of silent TCP
    /// connections holds at most this many descriptors, and a burst of real ones is delayed,
    /// not refused.
    pub max_pending: usize,
    /// Polls of a completion queue a destroyed queue pair takes to retire
    /// ([`Provider::qp_retired`] false until then). The soft provider is done with a queue
    /// pair at [`Provider::destroy_qp`]; this models devices that are not (rxe until a
    /// marker's trip, siw until a poll empties the CQ, hardware on a shared receive queue
    /// until Last WQE Reached), so that owners can be tested against them. Default 0.
    pub retire_polls: u32,
}

impl Default for SoftConfig {
    fn default() -> Self {
        SoftConfig {
            crc: true,
            mpa_revision: 2,
            fpdu_size: None,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
            max_pending: 256,
            retire_polls: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct RecvWr {
    wr_id: u64,
    n: u8,
    sg: [Sge; MAX_SGE],
    total: u64,
}

impl RecvWr {
    // Inline: every Send's gather and every receive's scatter takes its list (out of line,
    // the call cost as much as the slice).
    #[inline]
    fn sg(&self) -> &[Sge] {
        &self.sg[..usize::from(self.n)]
    }
    /// Fill in place (copies only the used entries: these structs are large).
    #[inline]
    fn fill(&mut self, wr_id: u64, sg: &[Sge], max: u32) -> Result<()> {
        if sg.len() > MAX_SGE || sg.len() > max as usize {
            return Err(Error::TooManySge);
        }
        self.wr_id = wr_id;
        self.n = sg.len() as u8;
        copy_sg(&mut self.sg, sg);
        self.total = sg.iter().map(|s| u64::from(s.len)).sum();
        Ok(())
    }
    fn assign(&mut self, o: &RecvWr) {
        self.wr_id = o.wr_id;
        self.n = o.n;
        self.total = o.total;
        copy_sg(&mut self.sg, o.sg());
    }
}

/// Copy `src` (at most [`MAX_SGE`] entries) to the front of `dst`. Nearly every work request
/// has one entry, and a slice copy of a length known only at run time is a `memcpy` call
/// (with the registers saved around it): one per post and one per receive taken.
#[inline]
fn copy_sg(dst: &mut [Sge; MAX_SGE], src: &[Sge]) {
    match src {
        [one] => dst[0] = *one,
        _ => dst[..src.len()].copy_from_slice(src),
    }
}

/// A fixed-capacity FIFO whose slots are filled in place (no per-request moves of the large
/// work-request structs).
#[derive(Debug)]
struct Ring<T> {
    /// A power of two long (at least `cap`), so an entry's slot is a mask away.
    buf: Vec<T>,
    /// How many entries the ring takes (the queue's depth as created).
    cap: usize,
    head: usize,
    len: usize,
}

impl<T: Default + Clone> Ring<T> {
    fn new(cap: usize) -> Ring<T> {
        let cap = cap.max(1);
        Ring {
            buf: vec![T::default(); cap.next_power_of_two()],
            cap,
            head: 0,
            len: 0,
        }
    }
    fn len(&self) -> usize {
        self.len
    }
    /// The buffer index of entry `i`: a mask, as the buffer's length is a power of two (every
    /// post, framing step and completion looks entries up, so no compare and wrap here).
    fn slot(&self, i: usize) -> usize {
        (self.head + i) & (self.buf.len() - 1)
    }
    /// The next free slot (to fill) or `None` when full; [`Ring::commit`] makes it visible.
    fn next_free(&mut self) -> Option<&mut T> {
        if self.len == self.cap {
            return None;
        }
        let i = self.slot(self.len);
        self.buf.get_mut(i)
    }
    fn commit(&mut self) {
        self.len += 1;
    }
    fn get(&self, i: usize) -> Option<&T> {
        if i < self.len {
            self.buf.get(self.slot(i))
        } else {
            None
        }
    }
    fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        if i < self.len {
            let s = self.slot(i);
            self.buf.get_mut(s)
        } else {
            None
        }
    }
    fn front(&self) -> Option<&T> {
        self.get(0)
    }
    fn drop_front(&mut self) {
        if self.len > 0 {
            self.head = self.slot(1);
            self.len -= 1;
        }
    }
    /// Take the front entry off if `take` says so, and borrow it (its slot keeps it until it
    /// is filled again): one lookup where [`Ring::front`] and [`Ring::drop_front`] make two.
    #[inline]
    fn pop_front_if(&mut self, take: impl FnOnce(&T) -> bool) -> Option<&T> {
        let i = self.head;
        if self.len == 0 || !take(self.buf.get(i)?) {
            return None;
        }
        self.head = self.slot(1);
        self.len -= 1;
        self.buf.get(i)
    }
    fn position(&self, f: impl Fn(&T) -> bool) -> Option<usize> {
        (0..self.len).find(|&i| self.get(i).is_some_and(&f))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum WrState {
    #[default]
    Pending,
    WaitRead,
    Done,
}

#[derive(Debug, Clone, Copy)]
struct SqWr {
    wr_id: u64,
    op: SendOp,
    signaled: bool,
    state: WrState,
    /// Bytes framed (Send/Write) or received (Read).
    done: u64,
    sink_stag: u32,
    sink_to: u64,
    sg: RecvWr,
}

impl Default for SqWr {
    fn default() -> Self {
        SqWr {
            wr_id: 0,
            op: SendOp::Send,
            signaled: false,
            state: WrState::Pending,
            done: 0,
            sink_stag: 0,
            sink_to: 0,
            sg: RecvWr::default(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct InRead {
    req: wire::ReadRequest,
    sent: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    /// Initiator: Request queued, waiting for the Reply.
    Connecting,
    Rts,
    Dead,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxMsg {
    None,
    Sq,
    ReadResp,
}

/// A Terminate to send: code, the offending DDP header and segment length, Read body.
#[derive(Debug, Clone, Copy)]
struct Fault {
    code: TermCode,
    hdr: [u8; wire::UNTAGGED_HDR],
    hdr_len: usize,
    seg_len: u16,
    read_body: Option<[u8; wire::READ_REQ_BODY]>,
    /// Status for the work request the fault hit (receive in progress or oldest send).
    status: WcStatus,
}

impl Fault {
    fn bare(code: TermCode, status: WcStatus) -> Fault {
        Fault {
            code,
            hdr: [0; wire::UNTAGGED_HDR],
            hdr_len: 0,
            seg_len: 0,
            read_body: None,
            status,
        }
    }
    fn with_hdr(code: TermCode, status: WcStatus, ulpdu_hdr: &[u8], seg_len: usize) -> Fault {
        let mut f = Fault::bare(code, status);
        let n = ulpdu_hdr.len().min(wire::UNTAGGED_HDR);
        f.hdr[..n].copy_from_slice(&ulpdu_hdr[..n]);
        f.hdr_len = n;
        f.seg_len = seg_len.min(usize::from(u16::MAX)) as u16;
        f
    }
}

#[derive(Debug)]
struct Qp<L> {
    id: QpId,
    init: QpInit,
    state: QpState,
    phase: Phase,
    link: Option<L>,
    rq: Ring<RecvWr>,
    sq: Ring<SqWr>,
    exec: usize,
    tx: Vec<u8>,
    tx_off: usize,
    tx_msg: TxMsg,
    rx: Vec<u8>,
    rx_start: usize,
    rx_end: usize,
    crc: bool,
    seglen: usize,
    send_msn: u32,
    read_msn: u32,
    recv_msn: u32,
    rreq_msn: u32,
    ird: u16,
    ord: u16,
    reads_out: u16,
    /// The receive being filled by a multi-segment Send (copied out of the RQ/SRQ) and the
    /// bytes placed so far; `cur_active` says whether it is in use.
    cur_recv: RecvWr,
    cur_placed: u64,
    cur_active: bool,
    /// The peer closed its side; fail once the bytes before the close are handled.
    eof: bool,
    /// The link may have bytes to read: set when the transport reports its token (and when
    /// the link is attached), cleared when a read comes back short or finds nothing.
    io_ready: bool,
    /// In the provider's list of queue pairs to visit at its next poll.
    queued: bool,
    inbound: VecDeque<InRead>,
    /// Initiator: our IRD/ORD and whether we used the RFC 6581 prefix.
    want_ird_ord: (u16, u16, bool),
    /// Initiator: when to give up waiting for the MPA Reply.
    connect_deadline: Option<Instant>,
    /// Initiator: what a failure while connecting reports (the set-up exchange unless a
    /// socket error or the deadline says otherwise).
    connect_cause: ConnectFailure,
}

/// A completion queue: completions are appended to `q` and taken from `head` on. A `Vec`
/// rather than a `VecDeque`: its push is inlined (the deque's was a call per completion) and
/// a poll takes its completions as one slice. Emptied whenever a poll takes everything (the
/// usual case), compacted when the part taken is the larger half, so it never grows beyond
/// what is waiting.
#[derive(Debug)]
struct Cq {
    q: Vec<WorkCompletion>,
    head: usize,
}

impl Cq {
    /// Move up to `wcs.len()` completions, oldest first, into `wcs`; how many.
    fn take(&mut self, wcs: &mut [WorkCompletion]) -> usize {
        let waiting = self.q.get(self.head..).unwrap_or_default();
        let n = waiting.len().min(wcs.len());
        wcs[..n].copy_from_slice(&waiting[..n]);
        self.head += n;
        if self.head == self.q.len() {
            self.q.clear();
            self.head = 0;
        } else if self.head > self.q.len() / 2 {
            self.q.drain(..self.head);
            self.head = 0;
        }
        n
    }
}

#[derive(Debug)]
struct Srq {
    pd: PdId,
    q: Ring<RecvWr>,
    depth: u32,
    max_sge: u32,
}

/// A listening endpoint and the filter its streams pass as they are accepted
/// ([`Provider::filter_listener`]).
#[derive(Debug)]
struct Listening<L> {
    l: L,
    filter: Option<AcceptFilter>,
}

/// A ready connection request on its way to another soft provider ([`Provider::hand_over`]):
/// its stream, detached from this provider's transport, and its MPA Request as read.
struct MovedRequest {
    link: Box<dyn std::any::Any + Send>,
    buf: [u8; wire::MPA_HDR_LEN + wire::MPA_MAX_PD],
    len: usize,
}

#[derive(Debug)]
struct Pending<L> {
    listener: ListenerId,
    link: L,
    buf: [u8; wire::MPA_HDR_LEN + wire::MPA_MAX_PD],
    len: usize,
    ready: bool,
    since: Instant,
}

/// Shared state a queue pair touches while it progresses.
struct Ctx<'a> {
    mem: &'a mut Mem,
    cqs: &'a mut [Option<Cq>],
    srqs: &'a mut [Option<Srq>],
    events: &'a mut VecDeque<CmEvent>,
}

/// The queue a queue pair takes its receives from: its own `rq`, or shared receive queue
/// `srq` of `srqs` (`None` if that one is gone).
#[inline]
fn recv_queue<'a>(
    rq: &'a mut Ring<RecvWr>,
    srqs: &'a mut [Option<Srq>],
    srq: Option<SrqId>,
) -> Option<&'a mut Ring<RecvWr>> {
    match srq {
        Some(s) => srqs.get_mut(s.0 as usize)?.as_mut().map(|s| &mut s.q),
        None => Some(rq),
    }
}

#[inline]
fn push_wc(cqs: &mut [Option<Cq>], cq: CqId, wc: WorkCompletion) {
    if let Some(Some(c)) = cqs.get_mut(cq.0 as usize) {
        c.q.push(wc);
    }
}

/// The soft iWARP provider over transport `T`.
#[derive(Debug)]
pub struct SoftProvider<T: Transport> {
    cfg: SoftConfig,
    transport: T,
    pds: Vec<bool>,
    mem: Mem,
    cqs: Vec<Option<Cq>>,
    srqs: Vec<Option<Srq>>,
    qps: Slab<Qp<T::Link>>,
    /// Queue pairs to visit at the next poll (indices into `qps`), and the list being visited.
    active: Vec<u32>,
    visiting: Vec<u32>,
    /// Queue pair visits so far (see [`SoftProvider::visits`]).
    visits: u64,
    /// A listener or a pending connection had news that a queue pairs' poll took: connection
    /// management has work (cleared when it looks).
    cm_news: bool,
    listeners: Vec<Option<Listening<T::Listener>>>,
    pending: Vec<Option<Pending<T::Link>>>,
    events: VecDeque<CmEvent>,
    /// Destroyed queue pairs not retired yet, with the polls left ([`SoftConfig::retire_polls`]).
    retiring: Vec<(QpId, u32)>,
}

impl SoftProvider<Tcp> {
    /// A soft provider over TCP (fails only if the readiness descriptor cannot be created).
    pub fn tcp(cfg: SoftConfig) -> Result<SoftTcp> {
        Ok(SoftProvider::new(Tcp::new()?, cfg))
    }
}

impl SoftProvider<MemPort> {
    /// A soft provider attached to an in-memory fabric (through a port of its own).
    pub fn memory(fabric: &MemFabric, cfg: SoftConfig) -> SoftMem {
        SoftProvider::new(fabric.port(), cfg)
    }
}

fn slot<X>(v: &mut Vec<Option<X>>, x: X) -> u32 {
    if let Some(i) = v.iter().position(Option::is_none) {
        v[i] = Some(x);
        i as u32
    } else {
        v.push(Some(x));
        (v.len() - 1) as u32
    }
}

impl<T: Transport> SoftProvider<T> {
    /// A soft provider over `transport`.
    pub fn new(transport: T, cfg: SoftConfig) -> Self {
        SoftProvider {
            cfg,
            transport,
            pds: Vec::new(),
            mem: Mem::new(),
            cqs: Vec::new(),
            srqs: Vec::new(),
            qps: Slab::default(),
            active: Vec::new(),
            visiting: Vec::new(),
            visits: 0,
            cm_news: false,
            listeners: Vec::new(),
            pending: Vec::new(),
            events: VecDeque::with_capacity(64),
            retiring: Vec::new(),
        }
    }

    /// How many times a queue pair has been advanced so far: for tests and benchmarks (an
    /// idle queue pair is not, however many there are).
    pub fn visits(&self) -> u64 {
        self.visits
    }

    fn qp_mut(&mut self, qp: QpId) -> Result<&mut Qp<T::Link>> {
        self.qps.get_mut(qp.0).ok_or(Error::BadHandle)
    }

    fn pd_ok(&self, pd: PdId) -> Result<()> {
        if self.pds.get(pd.0 as usize).copied().unwrap_or(false) {
            Ok(())
        } else {
            Err(Error::BadHandle)
        }
    }

    fn seglen(&self, link: &T::Link) -> usize {
        let s = self
            .cfg
            .fpdu_size
            .or_else(|| link.mss())
            .unwrap_or(DEFAULT_FPDU);
        (s.clamp(64, 65528)) & !7
    }

    /// Advance the queue pairs that may have work: those whose links the transport reports
    /// ready, those with new send-queue work, and those a visit left unfinished. An idle
    /// queue pair costs nothing here, however many there are.
    fn progress(&mut self) {
        let (qps, active) = (&mut self.qps, &mut self.active);
        self.cm_news |= self.transport.take_ready(|token| {
            if let Some(q) = u32::try_from(token).ok().and_then(|h| qps.get_mut(h)) {
                q.io_ready = true;
                q.schedule(q.id.0, active);
            }
        });
        // No queue pair to visit (about a third of a busy in-memory pair's polls).
        if self.active.is_empty() {
            return;
        }
        std::mem::swap(&mut self.active, &mut self.visiting);
        let mut cx = Ctx {
            mem: &mut self.mem,
            cqs: &mut self.cqs,
            srqs: &mut self.srqs,
            events: &mut self.events,
        };
        for i in self.visiting.drain(..) {
            let Some(q) = self.qps.get_mut(i) else {
                continue;
            };
            q.queued = false;
            self.visits += 1;
            if matches!(q.phase, Phase::Connecting | Phase::Rts) && q.progress(&mut cx) {
                q.schedule(i, &mut self.active);
            }
        }
    }

    /// A connect that failed before anything went on the wire: the same event a refusal on
    /// the wire gives.
    fn connect_failed_at_once(&mut self, qp: QpId, e: &std::io::Error) -> Result<()> {
        let q = self.qp_mut(qp)?;
        q.state = QpState::Error;
        q.phase = Phase::Dead;
        self.events.push_back(CmEvent::ConnectError {
            qp,
            cause: ConnectFailure::from_io(e),
        });
        Ok(())
    }

    /// Give queue pair `qp` its link and visit it at the next poll (its first bytes may have
    /// come before the transport could report them).
    fn attach(&mut self, qp: QpId, mut link: T::Link) -> std::io::Result<()> {
        self.transport.attach(&mut link, qp.0 as usize)?;
        if let Some(q) = self.qps.get_mut(qp.0) {
            q.link = Some(link);
            q.io_ready = true;
            q.schedule(qp.0, &mut self.active);
        }
        Ok(())
    }

    fn progress_cm(&mut self) {
        self.cm_news = false;
        let mut held = self.pending.iter().flatten().count();
        for (i, l) in self.listeners.iter_mut().enumerate() {
            let Some(Listening { l, filter }) = l else {
                continue;
            };
            loop {
                if held >= self.cfg.max_pending {
                    // Streams left in the backlog: look again next time (readiness is
                    // edge-triggered, so no new event would say they are there).
                    self.cm_news = true;
                    break;
                }
                let Ok(Some(mut link)) = self.transport.accept(l) else {
                    break;
                };
                let remote = link.peer_addr();
                if filter.as_ref().is_some_and(|f| !f.admits(remote)) {
                    link.shutdown();
                    self.events.push_back(CmEvent::Filtered {
                        listener: ListenerId(i as u32),
                        remote,
                    });
                    continue;
                }
                held += 1;
                let p = Pending {
                    listener: ListenerId(i as u32),
                    link,
                    buf: [0; wire::MPA_HDR_LEN + wire::MPA_MAX_PD],
                    len: 0,
                    ready: false,
                    since: Instant::now(),
                };
                slot(&mut self.pending, p);
            }
        }
        for i in 0..self.pending.len() {
            let Some(p) = self.pending[i].as_mut() else {
                continue;
            };
            if p.ready {
                continue;
            }
            if p.since.elapsed() > self.cfg.request_timeout {
                p.link.shutdown();
                self.pending[i] = None;
                continue;
            }
            // Read exactly the frame: header first, then its private data.
            let mut gone = false;
            loop {
                let want = match wire::mpa_frame_len(&p.buf[..p.len]) {
                    Ok(n) => n,
                    Err(WireError::Incomplete) => wire::MPA_HDR_LEN,
                    Err(_) => {
                        gone = true;
                        break;
                    }
                };
                if p.len >= want {
                    break;
                }
                match p.link.read(&mut p.buf[p.len..want]) {
                    Ok(0) => {
                        gone = true;
                        break;
                    }
                    Ok(n) => p.len += n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        gone = true;
                        break;
                    }
                }
            }
            if gone {
                p.link.shutdown();
                self.pending[i] = None;
                continue;
            }
            let total = match wire::mpa_frame_len(&p.buf[..p.len]) {
                Ok(n) if n <= p.len => n,
                _ => continue,
            };
            match wire::parse_mpa(&p.buf[..total]) {
                Ok(f) if !f.reply && f.flags & wire::MPA_M == 0 => {
                    p.ready = true;
                    self.events.push_back(CmEvent::ConnectRequest {
                        listener: p.listener,
                        req: ConnReqId(i as u32),
                        private_data: PrivateData::new(f.private_data),
                        remote: p.link.peer_addr(),
                        responder_resources: f.ird().unwrap_or(0),
                        initiator_depth: f.ord().unwrap_or(0),
                    });
                }
                Ok(f) if !f.reply => {
                    // Markers requested: reject as siw does (M cleared, R set).
                    let mut out = Vec::with_capacity(wire::MPA_HDR_LEN + 4);
                    let flags = (f.flags & !wire::MPA_M) | wire::MPA_R;
                    wire::emit_mpa(
                        &mut out,
                        true,
                        flags,
                        f.revision,
                        f.ird_ord.map(|_| (0, 0)),
                        &[],
                    );
                    let _ = p.link.write(&out);
                    p.link.shutdown();
                    self.pending[i] = None;
                }
                _ => {
                    p.link.shutdown();
                    self.pending[i] = None;
                }
            }
        }
    }

    fn take_ready(&mut self, req: ConnReqId) -> Result<(Pending<T::Link>, usize)> {
        let p = self
            .pending
            .get_mut(req.0 as usize)
            .and_then(Option::take)
            .ok_or(Error::BadHandle)?;
        if !p.ready {
            self.pending[req.0 as usize] = Some(p);
            return Err(Error::BadState);
        }
        let total = wire::mpa_frame_len(&p.buf[..p.len]).map_err(|_| Error::BadState)?;
        Ok((p, total))
    }
}

impl<L: Link> Qp<L> {
    fn new(id: QpId, init: QpInit) -> Qp<L> {
        Qp {
            id,
            init,
            state: QpState::Init,
            phase: Phase::Idle,
            link: None,
            rq: Ring::new(init.max_recv_wr as usize),
            sq: Ring::new(init.max_send_wr as usize),
            exec: 0,
            tx: Vec::with_capacity(TX_HIGH + wire::MAX_FPDU),
            tx_off: 0,
            tx_msg: TxMsg::None,
            rx: vec![0; RX_CAP],
            rx_start: 0,
            rx_end: 0,
            crc: false,
            seglen: DEFAULT_FPDU,
            send_msn: 1,
            read_msn: 1,
            recv_msn: 1,
            rreq_msn: 1,
            ird: 0,
            ord: 0,
            reads_out: 0,
            cur_recv: RecvWr::default(),
            cur_placed: 0,
            cur_active: false,
            eof: false,
            io_ready: false,
            queued: false,
            inbound: VecDeque::new(),
            want_ird_ord: (0, 0, false),
            connect_deadline: None,
            connect_cause: ConnectFailure::Handshake,
        }
    }

    /// Put this queue pair (index `i`) on the provider's list to visit, once.
    fn schedule(&mut self, i: u32, active: &mut Vec<u32>) {
        if !self.queued {
            self.queued = true;
            active.push(i);
        }
    }

    /// Do what can be done now; true if the queue pair must be visited again without waiting
    /// for news from its link (still connecting, or stopped by the round limit with work
    /// left). Otherwise whatever it waits for wakes it: bytes to read or room to write (its
    /// link's token), a Read Response (bytes to read), new work (`post_send`).
    fn progress(&mut self, cx: &mut Ctx<'_>) -> bool {
        if self.phase == Phase::Connecting {
            // Visited on every poll until it is connected: the deadline and a TCP connect's
            // outcome are not reported as readiness.
            if self.connect_deadline.is_some_and(|d| Instant::now() > d) {
                self.connect_cause = ConnectFailure::Unreachable;
                self.fail(cx, None);
                return false;
            }
            match self.link.as_mut().map(|l| l.connected()) {
                Some(Ok(true)) => {}
                Some(Ok(false)) => return true,
                Some(Err(e)) => {
                    self.connect_cause = ConnectFailure::from_io(&e);
                    self.fail(cx, None);
                    return false;
                }
                None => {
                    self.fail(cx, None);
                    return false;
                }
            }
            if self.flush_tx(cx).is_none() || self.read_rx(cx).is_none() {
                return false;
            }
            self.handle_reply(cx);
            if self.phase == Phase::Connecting && self.eof {
                self.fail(cx, None);
            }
            match self.phase {
                Phase::Connecting => return true,
                Phase::Rts => {}
                Phase::Idle | Phase::Dead => return false,
            }
        }
        // Bounded rounds so one busy connection cannot starve the others.
        for _ in 0..8 {
            let framed = self.fill_tx(cx);
            if self.phase != Phase::Rts {
                return false;
            }
            let Some(wrote) = self.flush_tx(cx) else {
                return false;
            };
            let Some(got) = self.read_rx(cx) else {
                return false;
            };
            self.process_rx(cx);
            if self.phase == Phase::Rts && self.eof {
                self.fail(cx, None);
            }
            if self.phase != Phase::Rts {
                return false;
            }
            self.reap(cx);
            // Nothing left for another round (it would frame, write and read nothing, as
            // processing has taken every whole FPDU): end the visit now rather than after
            // an empty round.
            if self.exec == self.sq.len()
                && self.inbound.is_empty()
                && self.tx.is_empty()
                && !self.io_ready
            {
                return false;
            }
            if !framed && !wrote && !got {
                // Nothing more to frame, or framing waits for room (a refused write: the
                // link's token says when) or for a Read Response; nothing left to read
                // (unless the receive buffer is full, which processing has just undone).
                return self.io_ready;
            }
        }
        true
    }

    /// Write pending transmit bytes: `None` if the queue pair failed, else whether any went.
    fn flush_tx(&mut self, cx: &mut Ctx<'_>) -> Option<bool> {
        let link = self.link.as_mut()?;
        // An in-memory link takes the whole buffer without copying it when it can.
        if self.tx_off == 0 && !self.tx.is_empty() && link.take_all(&mut self.tx) {
            return Some(true);
        }
        let start = self.tx_off;
        while self.tx_off < self.tx.len() {
            match link.write(&self.tx[self.tx_off..]) {
                Ok(0) => break,
                Ok(n) => self.tx_off += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.connect_cause = ConnectFailure::from_io(&e);
                    self.fail(cx, None);
                    return None;
                }
            }
        }
        let wrote = self.tx_off != start;
        if self.tx_off == self.tx.len() {
            self.tx.clear();
            self.tx_off = 0;
        }
        Some(wrote)
    }

    /// Read what the link has: `None` if the queue pair failed, else whether bytes came.
    fn read_rx(&mut self, cx: &mut Ctx<'_>) -> Option<bool> {
        let link = self.link.as_mut()?;
        // Read only after news from the link: an empty read is a system call (on TCP) that
        // also contends for the socket lock with the kernel's delivery.
        if !self.io_ready {
            return Some(false);
        }
        if self.rx_start == self.rx_end {
            self.rx_start = 0;
            self.rx_end = 0;
        } else if self.rx.len() - self.rx_end < wire::MAX_FPDU {
            self.rx.copy_within(self.rx_start..self.rx_end, 0);
            self.rx_end -= self.rx_start;
            self.rx_start = 0;
        }
        let mut got = false;
        loop {
            if self.rx_end == self.rx.len() || self.eof {
                return Some(got);
            }
            match link.read(&mut self.rx[self.rx_end..]) {
                Ok(0) => {
                    self.eof = true;
                    return Some(got);
                }
                Ok(n) => {
                    got = true;
                    let full = self.rx_end + n == self.rx.len();
                    self.rx_end += n;
                    if !full {
                        // Short read: the link held no more when it was read, and whatever
                        // comes later is reported as new readiness.
                        self.io_ready = false;
                        return Some(true);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.io_ready = false;
                    return Some(got);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.connect_cause = ConnectFailure::from_io(&e);
                    self.fail(cx, None);
                    return None;
                }
            }
        }
    }

    /// Initiator: parse the MPA Reply once it is complete.
    fn handle_reply(&mut self, cx: &mut Ctx<'_>) {
        let buf = &self.rx[self.rx_start..self.rx_end];
        let total = match wire::mpa_frame_len(buf) {
            Ok(n) if n <= buf.len() => n,
            Ok(_) | Err(WireError::Incomplete) => return,
            Err(_) => return self.fail(cx, None),
        };
        let f = match wire::parse_mpa(&buf[..total]) {
            Ok(f) if f.reply => f,
            _ => return self.fail(cx, None),
        };
        let pdata = PrivateData::new(f.private_data);
        if f.flags & wire::MPA_R != 0 {
            self.state = QpState::Error;
            self.phase = Phase::Dead;
            self.flush_all(cx, WcStatus::Flushed);
            if let Some(l) = self.link.as_mut() {
                l.shutdown();
            }
            cx.events.push_back(CmEvent::Rejected {
                qp: self.id,
                private_data: pdata,
            });
            return;
        }
        let (ird, ord, enhanced) = self.want_ird_ord;
        if f.flags & wire::MPA_M != 0 || (enhanced && f.ird_ord.is_none()) {
            return self.fail(cx, None);
        }
        self.crc = f.flags & wire::MPA_C != 0;
        self.ird = ird;
        self.ord = ord;
        if let (Some(pi), Some(po)) = (f.ird(), f.ord()) {
            if po > ird {
                // The responder wants more Reads from us than we can take.
                let fault = Fault::bare(TermCode::new(wire::LAYER_LLP, 0, 6), WcStatus::Flushed);
                self.rx_start += total;
                return self.fail(cx, Some(fault));
            }
            self.ord = ord.min(pi);
        }
        self.rx_start += total;
        self.phase = Phase::Rts;
        self.state = QpState::ReadyToSend;
        cx.events.push_back(CmEvent::Established {
            qp: self.id,
            private_data: pdata,
        });
    }

    /// Frame more outgoing FPDUs while the transmit buffer has room; true if any were framed.
    fn fill_tx(&mut self, cx: &mut Ctx<'_>) -> bool {
        let mut framed = false;
        while self.phase == Phase::Rts && self.tx.len() - self.tx_off < TX_HIGH {
            if self.tx_msg == TxMsg::None {
                self.tx_msg = if !self.inbound.is_empty() {
                    TxMsg::ReadResp
                } else if self.exec < self.sq.len() {
                    TxMsg::Sq
                } else {
                    break;
                };
            }
            let progressed = match self.tx_msg {
                TxMsg::ReadResp => self.frame_read_response(cx),
                _ => self.frame_sq(cx),
            };
            if !progressed {
                break;
            }
            framed = true;
        }
        framed
    }

    fn frame_read_response(&mut self, cx: &mut Ctx<'_>) -> bool {
        let Some(r) = self.inbound.front().copied() else {
            self.tx_msg = TxMsg::None;
            return true;
        };
        let room = self.seglen - 2 - wire::TAGGED_HDR - 4;
        let n = ((r.req.size - r.sent) as usize).min(room);
        let src_to = r.req.src_to.wrapping_add(u64::from(r.sent));
        let src = match cx.mem.check_remote(
            self.init.pd,
            self.id,
            r.req.src_stag,
            src_to,
            n as u64,
            Access::REMOTE_READ,
        ) {
            Ok(p) => p,
            Err(why) => {
                let mut hdr = [0u8; wire::UNTAGGED_HDR];
                let mut h = Vec::new();
                wire::put_untagged(&mut h, wire::OP_READ_REQ, true, 0, 1, r.req.msn, 0);
                hdr.copy_from_slice(&h);
                let mut body = Vec::with_capacity(40);
                wire::emit_read_request(&mut body, &r.req, false);
                let mut rb = [0u8; wire::READ_REQ_BODY];
                rb.copy_from_slice(&body[2 + wire::UNTAGGED_HDR..2 + wire::UNTAGGED_HDR + 28]);
                let mut f = Fault::with_hdr(why.read_term(), WcStatus::Flushed, &hdr, 0);
                f.read_body = Some(rb);
                self.fail(cx, Some(f));
                return false;
            }
        };
        let last = r.sent as usize + n == r.req.size as usize;
        let s = wire::begin_tagged(
            &mut self.tx,
            wire::OP_READ_RESP,
            last,
            r.req.sink_stag,
            r.req.sink_to.wrapping_add(u64::from(r.sent)),
        );
        Mem::fetch(src, n, &mut self.tx);
        wire::finish_fpdu(&mut self.tx, s, self.crc);
        if last {
            self.inbound.pop_front();
            self.tx_msg = TxMsg::None;
        } else if let Some(f) = self.inbound.front_mut() {
            f.sent += n as u32;
        }
        true
    }

    fn frame_sq(&mut self, cx: &mut Ctx<'_>) -> bool {
        let pd = self.init.pd;
        // The entry is looked up once and borrowed (from `sq` alone) until its bytes are
        // gathered and its progress written back: every Send goes through here.
        let Some(w) = self.sq.get_mut(self.exec) else {
            self.tx_msg = TxMsg::None;
            return false;
        };
        let (op, total, done) = (w.op, w.sg.total, w.done);
        match op {
            SendOp::LocalInvalidate { rkey } => {
                if cx.mem.invalidate(pd, rkey).is_err() {
                    self.fail_local(cx, WcStatus::LocalQpOperationError);
                    return false;
                }
                self.finish_exec(WrState::Done);
                true
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                if self.reads_out >= self.ord {
                    // ORD reached: the send queue waits for a Read Response (siw fences).
                    return false;
                }
                let Some(sg) = self.sq.get(self.exec).map(|w| w.sg.sg()) else {
                    return false;
                };
                if !cx.mem.check_sg(pd, sg, true) || total > u64::from(u32::MAX) {
                    self.fail_local(cx, WcStatus::LocalProtectionError);
                    return false;
                }
                let (sink_stag, sink_to) = sg.first().map_or((0, 0), |s| (s.lkey, s.addr));
                let req = wire::ReadRequest {
                    msn: self.read_msn,
                    sink_stag,
                    sink_to,
                    size: total as u32,
                    src_stag: rkey,
                    src_to: remote_addr,
                };
                wire::emit_read_request(&mut self.tx, &req, self.crc);
                self.read_msn = self.read_msn.wrapping_add(1);
                self.reads_out += 1;
                if let Some(w) = self.sq.get_mut(self.exec) {
                    w.sink_stag = sink_stag;
                    w.sink_to = sink_to;
                }
                self.finish_exec(WrState::WaitRead);
                true
            }
            SendOp::Send | SendOp::SendWithInvalidate { .. } | SendOp::RdmaWrite { .. } => {
                let hdr = if matches!(op, SendOp::RdmaWrite { .. }) {
                    wire::TAGGED_HDR
                } else {
                    wire::UNTAGGED_HDR
                };
                let room = (self.seglen - 2 - hdr - 4) as u64;
                let n = (total - done).min(room);
                let last = done + n == total;
                if matches!(op, SendOp::Send | SendOp::SendWithInvalidate { .. })
                    && total > u64::from(u32::MAX)
                {
                    self.fail_local(cx, WcStatus::LocalLengthError);
                    return false;
                }
                let s = match op {
                    SendOp::RdmaWrite { remote_addr, rkey } => wire::begin_tagged(
                        &mut self.tx,
                        wire::OP_WRITE,
                        last,
                        rkey,
                        remote_addr.wrapping_add(done),
                    ),
                    SendOp::SendWithInvalidate { rkey } => wire::begin_untagged(
                        &mut self.tx,
                        wire::OP_SEND_INV,
                        last,
                        rkey,
                        0,
                        self.send_msn,
                        done as u32,
                    ),
                    _ => wire::begin_untagged(
                        &mut self.tx,
                        wire::OP_SEND,
                        last,
                        0,
                        0,
                        self.send_msn,
                        done as u32,
                    ),
                };
                if cx
                    .mem
                    .gather(pd, w.sg.sg(), done, n as usize, &mut self.tx)
                    .is_err()
                {
                    self.tx.truncate(s);
                    self.fail_local(cx, WcStatus::LocalProtectionError);
                    return false;
                }
                wire::finish_fpdu(&mut self.tx, s, self.crc);
                // One write-back of the entry's progress (and state, when it is done).
                w.done = done + n;
                if last {
                    w.state = WrState::Done;
                }
                if last {
                    if !matches!(op, SendOp::RdmaWrite { .. }) {
                        self.send_msn = self.send_msn.wrapping_add(1);
                    }
                    self.exec += 1;
                    self.tx_msg = TxMsg::None;
                }
                true
            }
        }
    }

    fn finish_exec(&mut self, st: WrState) {
        if let Some(w) = self.sq.get_mut(self.exec) {
            w.state = st;
        }
        self.exec += 1;
        self.tx_msg = TxMsg::None;
    }

    /// Report finished send-queue work in order.
    fn reap(&mut self, cx: &mut Ctx<'_>) {
        while let Some(w) = self.sq.pop_front_if(|w| w.state == WrState::Done) {
            let (wr_id, op, done, signaled) = (w.wr_id, w.op, w.done, w.signaled);
            self.exec -= 1;
            if signaled {
                push_wc(
                    cx.cqs,
                    self.init.send_cq,
                    WorkCompletion {
                        wr_id,
                        status: WcStatus::Success,
                        opcode: op_of(op),
                        byte_len: if matches!(op, SendOp::RdmaRead { .. }) {
                            done as u32
                        } else {
                            0
                        },
                        qp: self.id,
                        invalidated_rkey: None,
                    },
                );
            }
        }
    }

    fn process_rx(&mut self, cx: &mut Ctx<'_>) {
        let rx = std::mem::take(&mut self.rx);
        while self.phase == Phase::Rts {
            let buf = &rx[self.rx_start..self.rx_end];
            match wire::parse_fpdu(buf, self.crc) {
                Ok((seg, used)) => {
                    let hdr_end = buf.len().min(2 + wire::UNTAGGED_HDR).min(used);
                    let ulpdu_hdr = &buf[2.min(hdr_end)..hdr_end];
                    self.rx_start += used;
                    if let Err(f) = self.handle_segment(cx, seg, ulpdu_hdr) {
                        self.fail(cx, f);
                    }
                }
                Err(WireError::Incomplete) => break,
                Err(WireError::Term(code, _)) => {
                    self.fail(cx, Some(Fault::bare(code, WcStatus::Flushed)));
                }
                Err(WireError::BadMpa(_)) => self.fail(cx, None),
            }
        }
        self.rx = rx;
    }

    /// Move the next posted receive (own RQ or SRQ) into `cur_recv`; false if none.
    /// A message has arrived whole in receive `wr_id`: its completion (`byte_len` bytes,
    /// `invalidated_rkey` if it was a Send with Invalidate), and the next message is awaited.
    #[inline]
    fn recv_done(
        &mut self,
        cqs: &mut [Option<Cq>],
        wr_id: u64,
        byte_len: u32,
        invalidated_rkey: Option<u32>,
    ) {
        self.recv_msn = self.recv_msn.wrapping_add(1);
        push_wc(
            cqs,
            self.init.recv_cq,
            WorkCompletion {
                wr_id,
                status: WcStatus::Success,
                opcode: WcOpcode::Recv,
                byte_len,
                qp: self.id,
                invalidated_rkey,
            },
        );
    }

    fn take_recv(&mut self, cx: &mut Ctx<'_>) -> bool {
        let Some(q) = recv_queue(&mut self.rq, cx.srqs, self.init.srq) else {
            return false;
        };
        let Some(r) = q.front() else {
            return false;
        };
        self.cur_recv.assign(r);
        q.drop_front();
        self.cur_active = true;
        self.cur_placed = 0;
        true
    }

    /// Handle one segment; `Err(Some(fault))` sends a Terminate, `Err(None)` just fails.
    fn handle_segment(
        &mut self,
        cx: &mut Ctx<'_>,
        seg: Segment<'_>,
        hdr: &[u8],
    ) -> std::result::Result<(), Option<Fault>> {
        let pd = self.init.pd;
        match seg {
            Segment::Write {
                stag, to, payload, ..
            } => {
                let dst = cx
                    .mem
                    .check_remote(
                        pd,
                        self.id,
                        stag,
                        to,
                        payload.len() as u64,
                        Access::REMOTE_WRITE,
                    )
                    .map_err(|why| {
                        let h = &hdr[..hdr.len().min(wire::TAGGED_HDR)];
                        Some(Fault::with_hdr(
                            why.tagged_term(),
                            WcStatus::Flushed,
                            h,
                            payload.len(),
                        ))
                    })?;
                Mem::place(dst, payload);
                Ok(())
            }
            Segment::ReadResponse {
                stag,
                to,
                last,
                payload,
            } => {
                let h = &hdr[..hdr.len().min(wire::TAGGED_HDR)];
                let catastrophic = || {
                    Some(Fault::with_hdr(
                        TermCode::DDP_CATASTROPHIC,
                        WcStatus::Flushed,
                        h,
                        payload.len(),
                    ))
                };
                let idx = self
                    .sq
                    .position(|w| w.state == WrState::WaitRead)
                    .ok_or_else(catastrophic)?;
                let Some(&SqWr {
                    sink_stag,
                    sink_to,
                    done,
                    sg: RecvWr { total, .. },
                    ..
                }) = self.sq.get(idx)
                else {
                    return Err(catastrophic());
                };
                let bad = || {
                    Some(Fault::with_hdr(
                        TermCode::new(1, 1, 1),
                        WcStatus::Flushed,
                        h,
                        payload.len(),
                    ))
                };
                if stag != sink_stag {
                    return Err(Some(Fault::with_hdr(
                        TermCode::new(1, 1, 0),
                        WcStatus::Flushed,
                        h,
                        payload.len(),
                    )));
                }
                if to != sink_to.wrapping_add(done) {
                    return Err(bad());
                }
                let end = done.checked_add(payload.len() as u64).ok_or_else(bad)?;
                if end > total || (last && end != total) {
                    return Err(bad());
                }
                let sg = self.sq.get(idx).map_or(&[][..], |w| w.sg.sg());
                if cx.mem.scatter(pd, sg, done, payload).is_err() {
                    let mut f = Fault::with_hdr(
                        TermCode::DDP_CATASTROPHIC,
                        WcStatus::LocalProtectionError,
                        h,
                        payload.len(),
                    );
                    f.status = WcStatus::LocalProtectionError;
                    return Err(Some(f));
                }
                if let Some(w) = self.sq.get_mut(idx) {
                    w.done = end;
                    if last {
                        w.state = WrState::Done;
                        self.reads_out -= 1;
                    }
                }
                Ok(())
            }
            Segment::Send {
                invalidate,
                msn,
                mo,
                last,
                payload,
                ..
            } => {
                let fault = |code, st| Some(Fault::with_hdr(code, st, hdr, payload.len()));
                if msn != self.recv_msn {
                    return Err(fault(TermCode::DDP_MSN, WcStatus::Flushed));
                }
                if !self.cur_active {
                    if mo != 0 {
                        return Err(fault(TermCode::DDP_MO, WcStatus::Flushed));
                    }
                    // A whole message in one segment (nearly every Send) is placed from the
                    // receive at the queue's head, which is dropped once it is complete: no
                    // copy of it into `cur_recv`. A Send with Invalidate, and whatever fails
                    // here, takes the general path below, which takes the receive first and
                    // reports the failure (placing the same bytes again is harmless).
                    if last && invalidate.is_none() {
                        let no_buffer = || fault(TermCode::DDP_NO_BUFFER, WcStatus::Flushed);
                        let q = recv_queue(&mut self.rq, cx.srqs, self.init.srq)
                            .ok_or_else(no_buffer)?;
                        let r = q.front().ok_or_else(no_buffer)?;
                        let end = payload.len() as u64;
                        if end <= r.total && cx.mem.scatter(pd, r.sg(), 0, payload).is_ok() {
                            let wr_id = r.wr_id;
                            q.drop_front();
                            self.recv_done(cx.cqs, wr_id, end as u32, None);
                            return Ok(());
                        }
                    }
                    if !self.take_recv(cx) {
                        return Err(fault(TermCode::DDP_NO_BUFFER, WcStatus::Flushed));
                    }
                }
                // From here on a failure completes this receive with the fault's status.
                let r = &self.cur_recv;
                let placed = self.cur_placed;
                if u64::from(mo) != placed {
                    return Err(fault(TermCode::DDP_MO, WcStatus::Flushed));
                }
                let end = placed + payload.len() as u64;
                if end > r.total {
                    return Err(fault(TermCode::DDP_TOO_LONG, WcStatus::LocalLengthError));
                }
                if cx.mem.scatter(pd, r.sg(), placed, payload).is_err() {
                    return Err(fault(
                        TermCode::DDP_CATASTROPHIC,
                        WcStatus::LocalProtectionError,
                    ));
                }
                self.cur_placed = end;
                if !last {
                    return Ok(());
                }
                let wr_id = r.wr_id;
                if let Some(stag) = invalidate {
                    cx.mem
                        .invalidate_remote(pd, self.id, stag)
                        .map_err(|code| fault(code, WcStatus::Flushed))?;
                }
                self.cur_active = false;
                self.recv_done(cx.cqs, wr_id, end as u32, invalidate);
                Ok(())
            }
            Segment::ReadRequest(req) => {
                if req.msn != self.rreq_msn {
                    return Err(Some(Fault::with_hdr(
                        TermCode::DDP_MSN,
                        WcStatus::Flushed,
                        hdr,
                        0,
                    )));
                }
                if self.inbound.len() >= usize::from(self.ird) {
                    return Err(Some(Fault::with_hdr(
                        TermCode::RDMAP_IRD,
                        WcStatus::Flushed,
                        hdr,
                        0,
                    )));
                }
                self.rreq_msn = self.rreq_msn.wrapping_add(1);
                self.inbound.push_back(InRead { req, sent: 0 });
                Ok(())
            }
            Segment::Terminate { code, .. } => {
                let status = match (code.layer, code.etype, code.ecode) {
                    (wire::LAYER_RDMAP, 1, _) | (wire::LAYER_DDP, 1, _) => {
                        WcStatus::RemoteAccessError
                    }
                    (wire::LAYER_DDP, 2, 5) => WcStatus::RemoteInvalidRequest,
                    _ => WcStatus::RemoteOperationError,
                };
                self.state = QpState::Error;
                self.flush_all(cx, status);
                self.close(cx);
                Ok(())
            }
        }
    }

    /// A local error on the send-queue head: complete it with `status`, flush the rest.
    fn fail_local(&mut self, cx: &mut Ctx<'_>, status: WcStatus) {
        self.state = QpState::Error;
        // The failing request is the one at `exec`; finished ones before it succeed.
        if let Some(w) = self.sq.get_mut(self.exec) {
            w.state = WrState::Pending;
        }
        self.flush_sq_from(cx, self.exec, status);
        self.flush_all(cx, WcStatus::Flushed);
        self.close(cx);
    }

    /// Break the connection: optional Terminate, flush everything, report, close.
    fn fail(&mut self, cx: &mut Ctx<'_>, fault: Option<Fault>) {
        if matches!(self.phase, Phase::Dead | Phase::Idle) {
            return;
        }
        if let Some(f) = fault {
            wire::emit_terminate(
                &mut self.tx,
                f.code,
                f.seg_len,
                &f.hdr[..f.hdr_len],
                f.read_body.as_ref().map_or(&[][..], |b| &b[..]),
                self.crc,
            );
            if self.cur_active {
                self.cur_active = false;
                push_wc(
                    cx.cqs,
                    self.init.recv_cq,
                    WorkCompletion {
                        wr_id: self.cur_recv.wr_id,
                        status: f.status,
                        opcode: WcOpcode::Recv,
                        byte_len: 0,
                        qp: self.id,
                        invalidated_rkey: None,
                    },
                );
            }
        }
        let connecting = self.phase == Phase::Connecting;
        self.state = QpState::Error;
        self.flush_all(cx, WcStatus::Flushed);
        if connecting {
            if let Some(l) = self.link.as_mut() {
                let _ = l.write(&self.tx[self.tx_off..]);
                l.shutdown();
            }
            self.phase = Phase::Dead;
            cx.events.push_back(CmEvent::ConnectError {
                qp: self.id,
                cause: self.connect_cause,
            });
        } else {
            self.close(cx);
        }
    }

    /// Send what is pending (best effort), close the link, report `Disconnected` once.
    fn close(&mut self, cx: &mut Ctx<'_>) {
        if self.phase == Phase::Dead {
            return;
        }
        if let Some(l) = self.link.as_mut() {
            while self.tx_off < self.tx.len() {
                match l.write(&self.tx[self.tx_off..]) {
                    Ok(n) if n > 0 => self.tx_off += n,
                    _ => break,
                }
            }
            l.shutdown();
        }
        self.tx.clear();
        self.tx_off = 0;
        let was_idle = self.phase == Phase::Idle;
        self.phase = Phase::Dead;
        self.state = QpState::Error;
        if !was_idle {
            cx.events.push_back(CmEvent::Disconnected { qp: self.id });
        }
    }

    fn flush_sq_from(&mut self, cx: &mut Ctx<'_>, from: usize, first: WcStatus) {
        let mut status = first;
        let mut i = 0;
        while let Some(&w) = self.sq.front() {
            self.sq.drop_front();
            let st = if w.state == WrState::Done && i < from {
                WcStatus::Success
            } else {
                let s = status;
                status = WcStatus::Flushed;
                s
            };
            if st != WcStatus::Success || w.signaled {
                push_wc(
                    cx.cqs,
                    self.init.send_cq,
                    WorkCompletion {
                        wr_id: w.wr_id,
                        status: st,
                        opcode: op_of(w.op),
                        byte_len: 0,
                        qp: self.id,
                        invalidated_rkey: None,
                    },
                );
            }
            i += 1;
        }
        self.exec = 0;
        self.tx_msg = TxMsg::None;
        self.reads_out = 0;
        self.inbound.clear();
    }

    /// Flush all outstanding work: finished sends succeed, the first unfinished one gets
    /// `first`, the rest and every own receive are flushed.
    fn flush_all(&mut self, cx: &mut Ctx<'_>, first: WcStatus) {
        let done = self
            .sq
            .position(|w| w.state != WrState::Done)
            .unwrap_or(self.sq.len());
        self.flush_sq_from(cx, done, first);
        if self.cur_active {
            self.cur_active = false;
            push_wc(
                cx.cqs,
                self.init.recv_cq,
                WorkCompletion {
                    wr_id: self.cur_recv.wr_id,
                    status: WcStatus::Flushed,
                    opcode: WcOpcode::Recv,
                    byte_len: 0,
                    qp: self.id,
                    invalidated_rkey: None,
                },
            );
        }
        while let Some(&RecvWr { wr_id, .. }) = self.rq.front() {
            self.rq.drop_front();
            push_wc(
                cx.cqs,
                self.init.recv_cq,
                WorkCompletion {
                    wr_id,
                    status: WcStatus::Flushed,
                    opcode: WcOpcode::Recv,
                    byte_len: 0,
                    qp: self.id,
                    invalidated_rkey: None,
                },
            );
        }
    }
}

fn op_of(op: SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendWithInvalidate { .. } => WcOpcode::Send,
        SendOp::RdmaWrite { .. } => WcOpcode::RdmaWrite,
        SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
        SendOp::LocalInvalidate { .. } => WcOpcode::LocalInvalidate,
    }
}

impl<T: Transport> Provider for SoftProvider<T> {
    fn alloc_pd(&mut self) -> Result<PdId> {
        self.pds.push(true);
        Ok(PdId((self.pds.len() - 1) as u32))
    }

    fn dealloc_pd(&mut self, pd: PdId) -> Result<()> {
        self.pd_ok(pd)?;
        self.pds[pd.0 as usize] = false;
        Ok(())
    }

    unsafe fn register(
        &mut self,
        pd: PdId,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mr> {
        self.pd_ok(pd)?;
        let a = addr as usize as u64;
        if addr.is_null() || a.checked_add(len as u64).is_none() {
            return Err(Error::InvalidArgument("region address range"));
        }
        let stag = self
            .mem
            .alloc(Kind::Mr {
                pd: pd.0,
                addr: a,
                len: len as u64,
                access,
            })
            .ok_or(Error::QueueFull)?;
        Ok(Mr {
            id: MrId(stag),
            lkey: stag,
            rkey: stag,
            addr: a,
            len: len as u64,
        })
    }

    fn deregister(&mut self, mr: MrId) -> Result<()> {
        if self.mem.free_mr(mr.0) {
            Ok(())
        } else {
            Err(Error::BadHandle)
        }
    }

    fn expose(&mut self, qp: QpId, mr: MrId, offset: u64, len: u64, access: Access) -> Result<u32> {
        let qpd = self.qp_mut(qp)?.init.pd;
        let Some(Kind::Mr {
            pd,
            addr,
            len: rlen,
            access: racc,
        }) = self.mem.lookup(mr.0)
        else {
            return Err(Error::BadHandle);
        };
        if pd != qpd.0 {
            return Err(Error::InvalidArgument(
                "region and queue pair in different PDs",
            ));
        }
        match offset.checked_add(len) {
            Some(end) if end <= rlen => {}
            _ => return Err(Error::InvalidArgument("window outside the region")),
        }
        if !racc.may_expose(access) {
            return Err(Error::InvalidArgument("window rights exceed the region's"));
        }
        self.mem
            .alloc(Kind::Window {
                pd,
                qp: qp.0,
                mr: mr.0 >> 8,
                addr: addr + offset,
                len,
                access,
            })
            .ok_or(Error::QueueFull)
    }

    fn create_cq(&mut self, depth: u32) -> Result<CqId> {
        let c = Cq {
            q: Vec::with_capacity(depth as usize),
            head: 0,
        };
        Ok(CqId(slot(&mut self.cqs, c)))
    }

    fn destroy_cq(&mut self, cq: CqId) -> Result<()> {
        self.cqs
            .get_mut(cq.0 as usize)
            .and_then(Option::take)
            .map(|_| ())
            .ok_or(Error::BadHandle)
    }

    fn poll_cq(&mut self, cq: CqId, wcs: &mut [WorkCompletion]) -> Result<usize> {
        self.progress();
        if !self.retiring.is_empty() {
            self.retiring.retain_mut(|(_, left)| {
                *left -= 1;
                *left > 0
            });
        }
        let c = self
            .cqs
            .get_mut(cq.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(Error::BadHandle)?;
        Ok(c.take(wcs))
    }

    fn create_srq(&mut self, pd: PdId, depth: u32, max_sge: u32) -> Result<SrqId> {
        self.pd_ok(pd)?;
        if max_sge as usize > MAX_SGE {
            return Err(Error::TooManySge);
        }
        let s = Srq {
            pd,
            q: Ring::new(depth as usize),
            depth,
            max_sge,
        };
        Ok(SrqId(slot(&mut self.srqs, s)))
    }

    fn destroy_srq(&mut self, srq: SrqId) -> Result<()> {
        self.srqs
            .get_mut(srq.0 as usize)
            .and_then(Option::take)
            .map(|_| ())
            .ok_or(Error::BadHandle)
    }

    fn post_srq_recv(&mut self, srq: SrqId, wr_id: u64, sg: &[Sge]) -> Result<()> {
        let s = self
            .srqs
            .get_mut(srq.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(Error::BadHandle)?;
        let _ = s.pd;
        let _ = s.depth;
        s.q.next_free()
            .ok_or(Error::QueueFull)?
            .fill(wr_id, sg, s.max_sge)?;
        s.q.commit();
        Ok(())
    }

    fn create_qp(&mut self, init: &QpInit) -> Result<QpId> {
        self.pd_ok(init.pd)?;
        for cq in [init.send_cq, init.recv_cq] {
            if !matches!(self.cqs.get(cq.0 as usize), Some(Some(_))) {
                return Err(Error::BadHandle);
            }
        }
        if let Some(s) = init.srq {
            match self.srqs.get(s.0 as usize) {
                Some(Some(srq)) if srq.pd == init.pd => {}
                _ => return Err(Error::BadHandle),
            }
        }
        if init.max_sge as usize > MAX_SGE {
            return Err(Error::TooManySge);
        }
        let h = self
            .qps
            .insert_with(|h| Qp::new(QpId(h), *init))
            .ok_or(Error::QueueFull)?;
        // Room to list every queue pair for a visit, so that polling never allocates.
        let n = self.qps.capacity();
        self.active.reserve(n);
        self.visiting.reserve(n);
        Ok(QpId(h))
    }

    fn destroy_qp(&mut self, qp: QpId) -> Result<()> {
        let q = self.qp_mut(qp)?;
        if let Some(l) = q.link.as_mut() {
            l.shutdown();
        }
        self.qps.remove(qp.0);
        self.mem.free_qp_windows(qp.0);
        if self.cfg.retire_polls > 0 {
            self.retiring.push((qp, self.cfg.retire_polls));
        }
        Ok(())
    }

    fn qp_retired(&self, qp: QpId) -> bool {
        self.retiring.iter().all(|&(q, _)| q != qp)
    }

    fn qp_state(&self, qp: QpId) -> Result<QpState> {
        self.qps.get(qp.0).map(|q| q.state).ok_or(Error::BadHandle)
    }

    // Inline (as `post_send`): a poll thread's driver posts every work request through one
    // call site, and the call frame was a good part of the post.
    #[inline]
    fn post_recv(&mut self, qp: QpId, wr_id: u64, sg: &[Sge]) -> Result<()> {
        let mut cx_flush = false;
        // Errors built only where they are returned: `ok_or` builds one on every post and
        // then drops it, a `drop_in_place` call (Error holds an io::Error) once inlined.
        let Some(q) = self.qps.get_mut(qp.0) else {
            return Err(Error::BadHandle);
        };
        if q.init.srq.is_some() {
            return Err(Error::BadState);
        }
        let max = q.init.max_sge;
        let Some(slot) = q.rq.next_free() else {
            return Err(Error::QueueFull);
        };
        slot.fill(wr_id, sg, max)?;
        q.rq.commit();
        if q.state == QpState::Error {
            cx_flush = true;
        }
        if cx_flush {
            let mut cx = Ctx {
                mem: &mut self.mem,
                cqs: &mut self.cqs,
                srqs: &mut self.srqs,
                events: &mut self.events,
            };
            if let Some(q) = self.qps.get_mut(qp.0) {
                q.flush_all(&mut cx, WcStatus::Flushed);
            }
        }
        Ok(())
    }

    #[inline]
    fn post_send(&mut self, qp: QpId, wr: &SendWr<'_>) -> Result<()> {
        // Errors built only where they are returned (see `post_recv`).
        let Some(q) = self.qps.get_mut(qp.0) else {
            return Err(Error::BadHandle);
        };
        if q.state == QpState::Init || q.state == QpState::Connecting {
            return Err(Error::BadState);
        }
        let max = q.init.max_sge;
        let Some(slot) = q.sq.next_free() else {
            return Err(Error::QueueFull);
        };
        slot.sg.fill(wr.wr_id, wr.sg, max)?;
        slot.wr_id = wr.wr_id;
        slot.op = wr.op;
        slot.signaled = wr.signaled;
        slot.state = WrState::Pending;
        slot.done = 0;
        slot.sink_stag = 0;
        slot.sink_to = 0;
        q.sq.commit();
        if q.phase == Phase::Rts {
            q.schedule(qp.0, &mut self.active);
        }
        if q.state == QpState::Error {
            let mut cx = Ctx {
                mem: &mut self.mem,
                cqs: &mut self.cqs,
                srqs: &mut self.srqs,
                events: &mut self.events,
            };
            if let Some(q) = self.qps.get_mut(qp.0) {
                q.flush_all(&mut cx, WcStatus::Flushed);
            }
        }
        Ok(())
    }

    fn listen(&mut self, addr: SocketAddr) -> Result<ListenerId> {
        let l = self.transport.listen(addr)?;
        let listening = Listening { l, filter: None };
        Ok(ListenerId(slot(&mut self.listeners, listening)))
    }

    fn listen_addr(&self, listener: ListenerId) -> Result<SocketAddr> {
        let l = self
            .listeners
            .get(listener.0 as usize)
            .and_then(Option::as_ref)
            .ok_or(Error::BadHandle)?;
        Ok(self.transport.local_addr(&l.l)?)
    }

    fn filter_listener(
        &mut self,
        listener: ListenerId,
        filter: Option<AcceptFilter>,
    ) -> Result<()> {
        let l = self
            .listeners
            .get_mut(listener.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(Error::BadHandle)?;
        l.filter = filter;
        Ok(())
    }

    fn close_listener(&mut self, listener: ListenerId) -> Result<()> {
        self.listeners
            .get_mut(listener.0 as usize)
            .and_then(Option::take)
            .map(|_| ())
            .ok_or(Error::BadHandle)
    }

    fn connect(&mut self, qp: QpId, addr: SocketAddr, params: &ConnParams<'_>) -> Result<()> {
        if params.private_data.len() > MAX_PRIVATE_DATA {
            return Err(Error::InvalidArgument("private data too long"));
        }
        if self.qp_mut(qp)?.state != QpState::Init {
            return Err(Error::BadState);
        }
        let link = match self.transport.connect(addr) {
            Ok(link) => link,
            // Refused at once (nothing listens in memory; TCP's immediate errors).
            Err(e) => return self.connect_failed_at_once(qp, &e),
        };
        let seglen = self.seglen(&link);
        let cfg = self.cfg;
        let q = self.qp_mut(qp)?;
        let ird = params.responder_resources.min(MAX_IRD_ORD);
        let ord = params.initiator_depth.min(MAX_IRD_ORD);
        let enhanced = cfg.mpa_revision >= 2;
        let mut flags = if cfg.crc { wire::MPA_C } else { 0 };
        if enhanced {
            flags |= wire::MPA_ENHANCED;
        }
        wire::emit_mpa(
            &mut q.tx,
            false,
            flags,
            if enhanced { 2 } else { 1 },
            enhanced.then_some((ird, ord)),
            params.private_data,
        );
        q.want_ird_ord = (ird, ord, enhanced);
        q.connect_deadline = Instant::now().checked_add(cfg.connect_timeout);
        q.seglen = seglen;
        q.phase = Phase::Connecting;
        q.state = QpState::Connecting;
        match self.attach(qp, link) {
            Ok(()) => Ok(()),
            Err(e) => self.connect_failed_at_once(qp, &e),
        }
    }

    fn accept(&mut self, req: ConnReqId, qp: QpId, params: &ConnParams<'_>) -> Result<()> {
        if params.private_data.len() > MAX_PRIVATE_DATA {
            return Err(Error::InvalidArgument("private data too long"));
        }
        if self.qp_mut(qp)?.state != QpState::Init {
            return Err(Error::BadState);
        }
        let (p, total) = self.take_ready(req)?;
        let f = wire::parse_mpa(&p.buf[..total]).map_err(|_| Error::BadState)?;
        let seglen = self.seglen(&p.link);
        let crc = f.flags & wire::MPA_C != 0 || self.cfg.crc;
        let mut flags = if crc { wire::MPA_C } else { 0 };
        let (ird, ord, prefix) = match (f.ird(), f.ord()) {
            (Some(pi), Some(po)) => {
                flags |= wire::MPA_ENHANCED;
                // siw's relaxed negotiation: ORD no more than the peer's IRD, IRD at least
                // the peer's ORD.
                let ord = params.initiator_depth.min(pi).min(MAX_IRD_ORD);
                let ird = params.responder_resources.max(po).min(MAX_IRD_ORD);
                (ird, ord, Some((ird, ord)))
            }
            _ => (
                params.responder_resources.min(MAX_IRD_ORD),
                params.initiator_depth.min(MAX_IRD_ORD),
                None,
            ),
        };
        let revision = f.revision;
        let q = self.qp_mut(qp)?;
        wire::emit_mpa(
            &mut q.tx,
            true,
            flags,
            revision,
            prefix,
            params.private_data,
        );
        q.crc = crc;
        q.ird = ird;
        q.ord = ord;
        q.seglen = seglen;
        q.phase = Phase::Rts;
        q.state = QpState::ReadyToSend;
        self.attach(qp, p.link)?;
        self.events.push_back(CmEvent::Established {
            qp,
            private_data: PrivateData::EMPTY,
        });
        Ok(())
    }

    fn hand_over(&mut self, req: ConnReqId) -> Result<Handover> {
        let (p, _) = self.take_ready(req)?;
        match self.transport.detach(p.link) {
            Ok(link) => Ok(Handover::new(MovedRequest {
                link,
                buf: p.buf,
                len: p.len,
            })),
            Err(link) => {
                // This transport's streams stay with it: the request is answered here.
                self.pending[req.0 as usize] = Some(Pending { link, ..p });
                Err(Error::Unsupported("moving a connection request"))
            }
        }
    }

    fn take_over(&mut self, request: Handover) -> Result<ConnReqId> {
        let m: MovedRequest = request
            .take()
            .map_err(|_| Error::InvalidArgument("another provider's connection request"))?;
        let link = self.transport.adopt(m.link)?;
        let p = Pending {
            // Not one of this provider's listeners: nothing looks at it once it is ready.
            listener: ListenerId(u32::MAX),
            link,
            buf: m.buf,
            len: m.len,
            ready: true,
            since: Instant::now(),
        };
        Ok(ConnReqId(slot(&mut self.pending, p)))
    }

    fn reject(&mut self, req: ConnReqId, private_data: &[u8]) -> Result<()> {
        let (mut p, total) = self.take_ready(req)?;
        let f = wire::parse_mpa(&p.buf[..total]).map_err(|_| Error::BadState)?;
        let mut out = Vec::with_capacity(wire::MPA_HDR_LEN + wire::MPA_MAX_PD);
        let flags = (f.flags & !wire::MPA_M) | wire::MPA_R;
        wire::emit_mpa(
            &mut out,
            true,
            flags,
            f.revision,
            f.ird_ord.map(|_| (0, 0)),
            private_data,
        );
        let mut off = 0;
        while off < out.len() {
            match p.link.write(&out[off..]) {
                Ok(n) if n > 0 => off += n,
                _ => break,
            }
        }
        p.link.shutdown();
        Ok(())
    }

    fn drain_send_queue(&mut self, qp: QpId, wr_id: u64) -> Result<bool> {
        if self.qp_state(qp)? != QpState::Error {
            return Err(Error::BadState);
        }
        // In the error state a request is flushed as it is posted, after every request before
        // it (the send queue completes in order), and nothing of this queue pair is placed
        // any more: the marker is the last completion of its send queue.
        let wr = SendWr {
            wr_id,
            op: SendOp::Send,
            sg: &[],
            signaled: true,
        };
        self.post_send(qp, &wr)?;
        Ok(true)
    }

    fn disconnect(&mut self, qp: QpId) -> Result<()> {
        let mut cx = Ctx {
            mem: &mut self.mem,
            cqs: &mut self.cqs,
            srqs: &mut self.srqs,
            events: &mut self.events,
        };
        // Errors built only where they are returned (see `post_recv`).
        let Some(q) = self.qps.get_mut(qp.0) else {
            return Err(Error::BadHandle);
        };
        match q.phase {
            Phase::Rts => {
                let _ = q.flush_tx(&mut cx);
                q.state = QpState::Error;
                q.flush_all(&mut cx, WcStatus::Flushed);
                q.close(&mut cx);
            }
            Phase::Connecting => {
                q.connect_cause = ConnectFailure::Local(libc::ECANCELED);
                q.fail(&mut cx, None);
            }
            Phase::Idle | Phase::Dead => {}
        }
        Ok(())
    }

    fn poll_cm(&mut self) -> Option<CmEvent> {
        if self.events.is_empty() {
            self.progress_cm();
            self.progress();
        }
        self.events.pop_front()
    }

    fn busy(&self) -> bool {
        !self.active.is_empty()
            || self.cm_news
            || self.transport.has_ready()
            || !self.retiring.is_empty()
    }

    fn event_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.transport.event_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(wr_id: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            ..WorkCompletion::default()
        }
    }

    /// Completions come out oldest first across partial polls, through the compaction and
    /// the emptying, and the queue keeps only what is waiting.
    #[test]
    fn a_completion_queue_keeps_order_across_partial_polls() {
        let mut c = Cq {
            q: Vec::new(),
            head: 0,
        };
        let mut out = [WorkCompletion::default(); 3];
        let (mut next, mut seen) = (0u64, 0u64);
        for round in 0..50 {
            for _ in 0..round % 7 {
                c.q.push(wc(next));
                next += 1;
            }
            let n = c.take(&mut out[..1 + round % 3]);
            for w in &out[..n] {
                assert_eq!(w.wr_id, seen);
                seen += 1;
            }
            assert_eq!(c.q.len() - c.head, (next - seen) as usize);
            assert!(c.head <= c.q.len() / 2 || c.head == 0);
        }
        while c.take(&mut out) > 0 {}
        assert!(c.q.is_empty() && c.head == 0);
    }
}
