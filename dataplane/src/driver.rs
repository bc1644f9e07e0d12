//! Binds [`Connection`]s to a [`Provider`]: one completion queue, pre-registered send and
//! receive buffers carved per connection from one pool region, engine work turned into
//! posts and completions fed back. A poll thread calls [`Driver::poll`] and reads
//! [`Driver::poll_event`]; the provider's connection manager stays with its owner.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use rpcrdma_proto::cm::PrivateData;
use rpcrdma_proto::Segment;
use rpcrdma_verbs::{
    Access, CqId, Mr, MrId, PdId, Provider, QpId, QpInit, SendOp, SendWr, Sge, SrqId,
    WorkCompletion,
};

use crate::conn::{
    Accepted, CloseReason, Completion, ConfigError, ConnConfig, Connection, Event, Role, ServeId,
    SubmitError, Work, SLOT_TAIL,
};
use crate::mem::{Env, MemRef, Memory, RegionIndex};
use crate::{CallSpec, ReplySpec};

/// Per-connection settings the driver applies to every connection it creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnTemplate {
    /// Highest RPC-over-RDMA version (1 or 2).
    pub version: u32,
    /// Credits requested and granted.
    pub credits: u32,
    /// Calls outstanding or queued per connection as requester.
    pub max_calls: u32,
    /// Largest Send (and inline threshold this side offers).
    pub send_size: u32,
    /// Receive buffer size. It is also the receive size a connection takes as announced
    /// in RFC 8797 private data, unless the owner announces a smaller one
    /// ([`Connection::set_announced_receive_size`](crate::conn::Connection::set_announced_receive_size)).
    pub recv_size: u32,
    /// Receive buffers per connection (credits plus room for backward calls).
    pub recv_slots: u32,
    /// Items shorter than this stay inline.
    pub ddp_threshold: u32,
    /// RDMA Reads outstanding per connection (ORD).
    pub max_reads: u32,
    /// Largest call accepted as responder.
    pub max_call_size: u32,
}

impl Default for ConnTemplate {
    fn default() -> Self {
        ConnTemplate {
            version: 1,
            credits: 32,
            max_calls: 32,
            send_size: 4096,
            recv_size: 4096,
            recv_slots: 34,
            ddp_threshold: 1024,
            max_reads: 16,
            max_call_size: 1 << 20,
        }
    }
}

impl ConnTemplate {
    /// Send buffers per connection: calls in flight (credits) plus answers to calls in
    /// progress (receive slots) plus one; queued calls hold none.
    pub fn send_slots(&self) -> u32 {
        self.credits.min(self.recv_slots) + self.recv_slots.max(1) + 1
    }

    /// Bytes of pool one connection uses (send buffers, then receive buffers).
    pub fn block_len(&self) -> Option<u32> {
        ConnConfig::send_pool_len(self.send_slots(), self.send_size)?
            .checked_add(ConnConfig::recv_pool_len(self.recv_slots, self.recv_size)?)
    }

    /// Queue-pair attributes fitting this template (`srq`: none; receives are per queue pair).
    pub fn qp_init(&self, pd: PdId, cq: CqId) -> QpInit {
        QpInit {
            pd,
            send_cq: cq,
            recv_cq: cq,
            srq: None::<SrqId>,
            // Calls, replies, Writes, Reads and invalidations share the send queue.
            max_send_wr: (self.send_slots() * 4 + self.max_reads + 64).max(256),
            max_recv_wr: self.recv_slots,
            max_sge: 1,
        }
    }

    /// The RFC 8797 private data describing this side.
    pub fn private_data(&self) -> PrivateData {
        PrivateData {
            remote_invalidate: true,
            send_size: self.send_size,
            recv_size: self.recv_size,
        }
        .normalized()
    }
}

/// A connection of a driver (slot and generation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId {
    idx: u32,
    gen: u32,
}

impl ConnId {
    /// Its slot among the driver's connections (a slot is reused, with a new generation,
    /// once the connection is removed): for tables indexed by connection.
    pub fn index(self) -> usize {
        self.idx as usize
    }

    /// Packs the id into 32 bits (16-bit index, 16-bit generation).
    pub fn to_u32(self) -> u32 {
        (self.idx << 16) | (self.gen & 0xffff)
    }

    /// Unpacks [`ConnId::to_u32`].
    pub fn from_u32(v: u32) -> ConnId {
        ConnId {
            idx: v >> 16,
            gen: v & 0xffff,
        }
    }
}

/// Packs a connection and a served call into one `u64` (e.g. the tag an app returns with
/// its reply).
pub fn serve_tag(conn: ConnId, id: ServeId) -> u64 {
    (u64::from(conn.to_u32()) << 32) | u64::from(id.to_u32())
}

/// Unpacks [`serve_tag`].
pub fn from_serve_tag(tag: u64) -> (ConnId, ServeId) {
    (
        ConnId::from_u32((tag >> 32) as u32),
        ServeId::from_u32(tag as u32),
    )
}

/// Errors of driver set-up calls.
#[derive(Debug)]
pub enum DriverError {
    /// The provider refused.
    Provider(rpcrdma_verbs::Error),
    /// The connection settings are unusable.
    Config(ConfigError),
    /// Every pool block is in use.
    NoBuffers,
    /// The id does not name a live connection.
    BadId,
}

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DriverError::Provider(e) => write!(f, "provider: {e}"),
            DriverError::Config(e) => write!(f, "configuration: {e}"),
            DriverError::NoBuffers => f.write_str("no buffer block free for another connection"),
            DriverError::BadId => f.write_str("no such connection"),
        }
    }
}

impl std::error::Error for DriverError {}

impl From<rpcrdma_verbs::Error> for DriverError {
    fn from(e: rpcrdma_verbs::Error) -> Self {
        DriverError::Provider(e)
    }
}

#[derive(Debug)]
struct Entry {
    conn: Connection,
    qp: QpId,
    block: u32,
    /// Disconnected (closed by its engine, or by [`Driver::close`]): its work is not posted.
    dead: bool,
    /// Until when its events wait for the drain marker of its send queue (`None`: they go
    /// out as they come). See [`Driver::flush`].
    held: Option<Instant>,
    /// Listed in the driver's `pending` (cleared only by [`Driver::post_pending`], so that a
    /// connection is listed once).
    pending: bool,
    /// Listed in the driver's `timed` (a timer or a drain deadline to watch).
    timed: bool,
    /// Removed, its queue pair destroyed but not retired yet ([`Provider::qp_retired`]):
    /// listed in the driver's `retiring`, its events held, unknown to every other call.
    retiring: bool,
}

/// One connection slot: the generation of the connection that took it last (kept when it
/// is freed, so that a stale [`ConnId`] never names the next one), and that connection's
/// entry while it lives. One lookup checks both (one bounds check, one load).
#[derive(Debug)]
struct Slot {
    gen: u32,
    entry: Option<Entry>,
}

/// The entry of connection `id` in `conns`, if its slot still holds that connection.
#[inline]
fn slot_entry(conns: &mut [Slot], id: ConnId) -> Option<&mut Entry> {
    let s = conns.get_mut(id.idx as usize)?;
    if s.gen != id.gen {
        return None;
    }
    s.entry.as_mut()
}

impl Entry {
    /// Lists connection `id` (this entry) in the driver's `timed`, once.
    fn watch(&mut self, id: ConnId, timed: &mut Vec<ConnId>) {
        if !self.timed {
            self.timed = true;
            timed.push(id);
        }
    }
}

/// A shared receive queue and the buffers posted to it.
#[derive(Debug, Clone, Copy)]
struct Shared {
    srq: SrqId,
    pool: MemRef,
    size: u32,
    count: u32,
}

/// Send buffers shared by all connections.
#[derive(Debug)]
struct SendShared {
    pool: MemRef,
    stride: u32,
    free: Vec<u32>,
}

/// Free and total buffers of a driver's send and receive pools (see
/// [`Driver::buffer_counts`]); a quiet driver has every buffer free.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BufferCounts {
    /// Send buffers not holding a message.
    pub send_free: u64,
    /// Send buffers in the pool.
    pub send_total: u64,
    /// Receive buffers posted (waiting for a message) or in unused pool blocks.
    pub recv_free: u64,
    /// Receive buffers in the pool.
    pub recv_total: u64,
}

/// Pool block of a connection whose buffers are all shared.
const NO_BLOCK: u32 = u32::MAX;

/// `wr_id` connection field marking a shared-receive-queue buffer.
const SRQ_CONN: u64 = 0xffff;

/// The completion tag of a closed connection's drain marker ([`Provider::drain_send_queue`]);
/// the engine's own tags have a kind below 15 in their top bits.
const DRAIN_TAG: u32 = u32::MAX;

/// Longest wait for a drain marker. A device reports it as soon as it has flushed what it
/// held (microseconds); one that took the marker and never reports it must not keep a closed
/// connection's calls from ending: they end after this, as they would without a marker.
pub const DRAIN_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// A provider, its completion queue, a buffer pool and the connections using them.
#[derive(Debug)]
pub struct Driver<P: Provider> {
    p: P,
    cq: CqId,
    shared: Option<Shared>,
    send_shared: Option<SendShared>,
    by_qp: HashMap<QpId, ConnId>,
    /// The pool's region and the apps' arenas (scatter/gather entries and exposures).
    regions: RegionIndex<Mr>,
    pool: MemRef,
    tmpl: ConnTemplate,
    block_len: u32,
    free_blocks: Vec<u32>,
    /// Buffers posted to the shared receive queue now.
    srq_posted: u32,
    /// Drain markers not reported within [`DRAIN_WAIT`].
    drain_overdue: u64,
    conns: Vec<Slot>,
    wcs: Vec<WorkCompletion>,
    /// One connection's consecutive completions of a poll, fed to it as one batch.
    run: Vec<Completion>,
    events: VecDeque<(ConnId, Event)>,
    /// Connections whose work waits for [`post_pending`](Driver::post_pending).
    pending: Vec<ConnId>,
    /// Connections with a timer running or events held for a drain: what [`Driver::poll`]
    /// looks at besides the completions, so that a turn does not walk every connection.
    timed: Vec<ConnId>,
    /// Removed connections whose queue pair the device is not done with yet, and that queue
    /// pair ([`Driver::remove`]).
    retiring: Vec<(ConnId, QpId)>,
    /// Work completions polled so far.
    completions: u64,
}

/// The [`Env`] of one connection: memory through the owner's [`Memory`], exposure through
/// the provider on the connection's queue pair.
struct DrvEnv<'a, P, M> {
    p: &'a mut P,
    mem: &'a mut M,
    regions: &'a RegionIndex<Mr>,
    qp: QpId,
    sends: Option<&'a mut SendShared>,
}

impl<P: Provider, M: Memory> Memory for DrvEnv<'_, P, M> {
    fn read(&self, at: MemRef, dst: &mut [u8]) -> bool {
        self.mem.read(at, dst)
    }
    fn write(&mut self, at: MemRef, src: &[u8]) -> bool {
        self.mem.write(at, src)
    }
    fn copy(&mut self, from: MemRef, to: MemRef) -> bool {
        self.mem.copy(from, to)
    }
}

impl<P: Provider, M: Memory> Env for DrvEnv<'_, P, M> {
    fn expose(&mut self, at: MemRef, access: Access) -> Option<Segment> {
        let mr = self.regions.find(at.mr)?;
        let end = at.offset.checked_add(u64::from(at.len))?;
        if end > mr.len {
            return None;
        }
        let rkey = self
            .p
            .expose(self.qp, at.mr, at.offset, u64::from(at.len), access)
            .ok()?;
        Some(Segment::new(rkey, at.len, mr.addr_at(at.offset)))
    }

    fn take_send(&mut self) -> Option<MemRef> {
        let s = self.sends.as_mut()?;
        let i = s.free.pop()?;
        s.pool.sub(i * s.stride, s.stride)
    }
}

#[inline]
fn sge(regions: &RegionIndex<Mr>, at: MemRef) -> Option<Sge> {
    let mr = regions.find(at.mr)?;
    let end = at.offset.checked_add(u64::from(at.len))?;
    (end <= mr.len).then(|| Sge {
        addr: mr.addr_at(at.offset),
        len: at.len,
        lkey: mr.lkey,
    })
}

#[inline]
fn wr_id(c: ConnId, tag: u32) -> u64 {
    (u64::from(c.idx & 0xffff) << 48) | (u64::from(c.gen & 0xffff) << 32) | u64::from(tag)
}

impl<P: Provider> Driver<P> {
    /// A driver over `provider` polling `cq`; `pool`, a range of `region` (registered with
    /// local write and [`Access::BIND`], so that calls may expose their Reply chunk landing
    /// areas; added as with
    /// [`add_region`](Self::add_region)), is cut into one block per connection.
    pub fn new(
        provider: P,
        cq: CqId,
        region: Mr,
        pool: MemRef,
        tmpl: ConnTemplate,
    ) -> Result<Self, DriverError> {
        let block_len = tmpl
            .block_len()
            .ok_or(DriverError::Config(ConfigError("pool block too large")))?;
        Self::build(provider, cq, region, pool, tmpl, block_len)
    }

    fn build(
        provider: P,
        cq: CqId,
        region: Mr,
        pool: MemRef,
        tmpl: ConnTemplate,
        block_len: u32,
    ) -> Result<Self, DriverError> {
        let inside = pool.mr == region.id
            && pool
                .offset
                .checked_add(u64::from(pool.len))
                .is_some_and(|e| e <= region.len);
        if !inside {
            return Err(DriverError::Config(ConfigError("pool outside its region")));
        }
        let blocks = pool.len / block_len.max(1);
        if blocks == 0 {
            return Err(DriverError::Config(ConfigError(
                "pool smaller than one connection",
            )));
        }
        Ok(Driver {
            p: provider,
            cq,
            shared: None,
            send_shared: None,
            by_qp: HashMap::new(),
            regions: RegionIndex::new(vec![region]),
            pool,
            tmpl,
            block_len,
            free_blocks: (0..blocks).rev().collect(),
            srq_posted: 0,
            drain_overdue: 0,
            conns: Vec::new(),
            wcs: vec![WorkCompletion::default(); 64],
            run: Vec::with_capacity(64),
            events: VecDeque::with_capacity(256),
            pending: Vec::with_capacity(64),
            timed: Vec::with_capacity(64),
            retiring: Vec::new(),
            completions: 0,
        })
    }

    /// A driver whose connections take their receives from one shared receive queue of
    /// `count` buffers of the template's `recv_size`, cut from `srq_pool` (a range of
    /// `region` too): receive memory then does not grow with connections × credits.
    /// With `shared_send`, `pool` is likewise one pool of send buffers
    /// (`send_size + SLOT_TAIL` bytes each) for all connections; otherwise it is cut into
    /// per-connection blocks of send buffers. Each connection's grant stays the template's
    /// credits: size the pools for the calls expected in flight across connections (a reply
    /// finding no send buffer is refused with `SubmitError::Busy`, to be retried).
    #[allow(clippy::too_many_arguments)]
    pub fn new_shared(
        provider: P,
        cq: CqId,
        pd: PdId,
        region: Mr,
        pool: MemRef,
        shared_send: bool,
        srq_pool: MemRef,
        count: u32,
        tmpl: ConnTemplate,
    ) -> Result<Self, DriverError> {
        let send_len = if shared_send {
            crate::conn::SLOT_TAIL + tmpl.send_size
        } else {
            ConnConfig::send_pool_len(tmpl.send_slots(), tmpl.send_size)
                .ok_or(DriverError::Config(ConfigError("pool block too large")))?
        };
        let need = count
            .checked_mul(tmpl.recv_size)
            .ok_or(DriverError::Config(ConfigError(
                "shared receive pool too large",
            )))?;
        let inside = srq_pool
            .offset
            .checked_add(u64::from(srq_pool.len))
            .is_some_and(|e| e <= region.len);
        if srq_pool.mr != region.id || need > srq_pool.len || !inside {
            return Err(DriverError::Config(ConfigError(
                "shared receive pool outside its region",
            )));
        }
        let mut d = Self::build(provider, cq, region, pool, tmpl, send_len)?;
        if shared_send {
            let n = pool.len / send_len;
            d.send_shared = Some(SendShared {
                pool,
                stride: send_len,
                free: (0..n).rev().collect(),
            });
            d.free_blocks.clear();
        }
        let srq = d.p.create_srq(pd, count, 1)?;
        let sh = Shared {
            srq,
            pool: srq_pool,
            size: tmpl.recv_size,
            count,
        };
        d.shared = Some(sh);
        for i in 0..count {
            d.repost_shared(i)?;
        }
        Ok(d)
    }

    fn repost_shared(&mut self, i: u32) -> Result<(), DriverError> {
        let sh = self.shared.ok_or(DriverError::BadId)?;
        let buf = sh
            .pool
            .sub(i * sh.size, sh.size)
            .ok_or(DriverError::BadId)?;
        let sge = sge(&self.regions, buf).ok_or(DriverError::BadId)?;
        self.p
            .post_srq_recv(sh.srq, (SRQ_CONN << 48) | u64::from(i), &[sge])?;
        self.srq_posted += 1;
        Ok(())
    }

    /// Queue-pair attributes for a new connection of this driver (with its shared receive
    /// queue, if it has one).
    pub fn qp_init(&self, pd: PdId) -> QpInit {
        let mut q = self.tmpl.qp_init(pd, self.cq);
        q.srq = self.shared.map(|s| s.srq);
        q
    }

    /// Makes a registered region (an app arena) usable in [`MemRef`]s.
    pub fn add_region(&mut self, mr: Mr) {
        self.regions.insert(mr);
    }

    /// Forgets a region (after the connections that used it have finished with it).
    pub fn remove_region(&mut self, mr: MrId) {
        self.regions.remove(mr);
    }

    /// The connection template.
    pub fn template(&self) -> &ConnTemplate {
        &self.tmpl
    }

    /// The completion queue new queue pairs must use.
    pub fn cq(&self) -> CqId {
        self.cq
    }

    /// Connections the pool can still take (with a shared send pool: as many as ids allow).
    pub fn free_blocks(&self) -> usize {
        if self.send_shared.is_some() {
            0xffff - self.by_qp.len()
        } else {
            self.free_blocks.len()
        }
    }

    /// Shared send buffers free now (none without a shared send pool).
    pub fn free_send_buffers(&self) -> usize {
        self.send_shared.as_ref().map_or(0, |s| s.free.len())
    }

    /// Work completions polled from the completion queue so far (receives, and the Sends,
    /// Reads, Writes and invalidations posted signalled).
    pub fn completions(&self) -> u64 {
        self.completions
    }

    /// Closed connections whose events stopped waiting for their drain marker after
    /// [`DRAIN_WAIT`] (the device took the marker but did not report it in time).
    pub fn drains_overdue(&self) -> u64 {
        self.drain_overdue
    }

    /// Free and total buffers of the send and receive pools (for statistics: walks the
    /// connections). Per-connection blocks count whole: an unused block's buffers are free.
    pub fn buffer_counts(&self) -> BufferCounts {
        let t = &self.tmpl;
        let blocks = u64::from(self.pool.len / self.block_len.max(1));
        let free_blocks = self.free_blocks.len() as u64;
        let live = || {
            self.conns
                .iter()
                .filter_map(|s| s.entry.as_ref())
                .map(|e| &e.conn)
        };
        let (send_free, send_total) = match &self.send_shared {
            Some(s) => (s.free.len() as u64, u64::from(s.pool.len / s.stride.max(1))),
            None => (
                free_blocks * u64::from(t.send_slots())
                    + live().map(|c| u64::from(c.send_free())).sum::<u64>(),
                blocks * u64::from(t.send_slots()),
            ),
        };
        let (recv_free, recv_total) = match &self.shared {
            Some(sh) => (u64::from(self.srq_posted), u64::from(sh.count)),
            None => (
                free_blocks * u64::from(t.recv_slots)
                    + live().map(|c| u64::from(c.recv_posted())).sum::<u64>(),
                blocks * u64::from(t.recv_slots),
            ),
        };
        BufferCounts {
            send_free,
            send_total,
            recv_free,
            recv_total,
        }
    }

    /// The provider (for connection management: listen, connect, accept, poll_cm).
    pub fn provider(&self) -> &P {
        &self.p
    }

    /// The provider, mutable.
    pub fn provider_mut(&mut self) -> &mut P {
        &mut self.p
    }

    /// Adds a connection on `qp` (created with [`Driver::qp_init`], not yet connected) and
    /// posts its receives: call before accept / before the connect ends, and submit calls
    /// only once the provider reports the connection established.
    /// `peer` is the peer's RFC 8797 private data, if any (it may be set later with
    /// [`set_peer`](Self::set_peer) before the first message).
    pub fn add_connection(
        &mut self,
        qp: QpId,
        role: Role,
        peer: Option<PrivateData>,
    ) -> Result<ConnId, DriverError> {
        let version = self.tmpl.version;
        self.add_connection_version(qp, role, peer, version)
    }

    /// [`add_connection`](Self::add_connection) speaking at most `version` (1 or 2) instead
    /// of the template's: the owner reconnects with version 1 to a peer that never answered
    /// version two (AMB-33, V2-5.2-b).
    pub fn add_connection_version(
        &mut self,
        qp: QpId,
        role: Role,
        peer: Option<PrivateData>,
        version: u32,
    ) -> Result<ConnId, DriverError> {
        let shared_send = self.send_shared.is_some();
        let block = if shared_send {
            NO_BLOCK
        } else {
            self.free_blocks.pop().ok_or(DriverError::NoBuffers)?
        };
        let t = self.tmpl;
        let base = if shared_send {
            0
        } else {
            block * self.block_len
        };
        let send_len = ConnConfig::send_pool_len(t.send_slots(), t.send_size).unwrap_or(0);
        let shared = self.shared.is_some();
        let recv_pool = if shared {
            MemRef::new(self.pool.mr, self.pool.offset, 0)
        } else {
            self.pool
                .sub(base + send_len, self.block_len - send_len)
                .ok_or(DriverError::NoBuffers)?
        };
        let cfg = ConnConfig {
            role,
            version,
            credits: t.credits,
            send_pool: if shared_send {
                MemRef::new(self.pool.mr, self.pool.offset, 0)
            } else {
                self.pool
                    .sub(base, send_len)
                    .ok_or(DriverError::NoBuffers)?
            },
            send_slots: t.send_slots(),
            send_size: t.send_size,
            recv_pool,
            recv_slots: t.recv_slots,
            recv_size: t.recv_size,
            shared_recv: shared,
            shared_send,
            max_calls: t.max_calls,
            peer,
            ddp_threshold: t.ddp_threshold,
            max_reads: t.max_reads,
            max_call_size: t.max_call_size,
        };
        let conn = match Connection::new(cfg) {
            Ok(c) => c,
            Err(e) => {
                if block != NO_BLOCK {
                    self.free_blocks.push(block);
                }
                return Err(DriverError::Config(e));
            }
        };
        let idx = match self.conns.iter().position(|s| s.entry.is_none()) {
            Some(i) => i,
            None if self.conns.len() >= 0xffff => {
                if block != NO_BLOCK {
                    self.free_blocks.push(block);
                }
                return Err(DriverError::NoBuffers);
            }
            None => {
                self.conns.push(Slot {
                    gen: 0,
                    entry: None,
                });
                self.conns.len() - 1
            }
        };
        let mut gen = 0;
        if let Some(s) = self.conns.get_mut(idx) {
            gen = s.gen.wrapping_add(1) & 0xffff;
            s.gen = gen;
            s.entry = Some(Entry {
                conn,
                qp,
                block,
                dead: false,
                held: None,
                pending: false,
                timed: false,
                retiring: false,
            });
        }
        let id = ConnId {
            idx: idx as u32,
            gen,
        };
        self.by_qp.insert(qp, id);
        // Room for every connection slot in the pending list, twice (a slot's old
        // connection may still be listed when a new one takes it), so that listing never
        // allocates on the data path.
        let room = 2 * self.conns.len();
        if self.pending.capacity() < room {
            self.pending.reserve(room - self.pending.len());
        }
        self.flush(id);
        Ok(id)
    }

    /// Replaces the peer's RFC 8797 data of a connection that has not exchanged messages
    /// (the connect's reply arrives after the receives were posted).
    pub fn set_peer(&mut self, id: ConnId, peer: Option<PrivateData>) -> Result<(), DriverError> {
        let e = self.entry_mut(id).ok_or(DriverError::BadId)?;
        let (send, recv, inv) = match peer {
            Some(p) => (p.send_size, p.recv_size, p.remote_invalidate),
            None => (1024, 1024, false),
        };
        e.conn.set_peer_receive_size(recv);
        e.conn.set_peer_send_size(send);
        e.conn.set_peer_takes_invalidate(inv);
        Ok(())
    }

    /// Connection `id`'s entry, unless it was removed.
    fn entry_mut(&mut self, id: ConnId) -> Option<&mut Entry> {
        self.any_entry_mut(id).filter(|e| !e.retiring)
    }

    /// Connection `id`'s entry, also while it retires.
    fn any_entry_mut(&mut self, id: ConnId) -> Option<&mut Entry> {
        slot_entry(&mut self.conns, id)
    }

    /// The connection `id`.
    pub fn connection(&self, id: ConnId) -> Option<&Connection> {
        let s = self.conns.get(id.idx as usize)?;
        if s.gen != id.gen {
            return None;
        }
        s.entry.as_ref().filter(|e| !e.retiring).map(|e| &e.conn)
    }

    /// The connection using queue pair `qp` (to route connection-manager events).
    pub fn by_qp(&self, qp: QpId) -> Option<ConnId> {
        self.by_qp.get(&qp).copied()
    }

    /// The connections not removed yet, in no particular order.
    pub fn connection_ids(&self) -> impl Iterator<Item = ConnId> + '_ {
        self.by_qp.values().copied()
    }

    /// Runs `f` on connection `id` with its environment, then posts its work and collects
    /// its events.
    // Always inline: every input and every completion goes through it (five times per RPC
    // over both ends), each caller with its own closure; out of line, its frame (saving
    // six registers and building the environment at a distance) was a third of its cost.
    #[inline(always)]
    fn with<M: Memory, R>(
        &mut self,
        id: ConnId,
        mem: &mut M,
        f: impl FnOnce(&mut Connection, &mut DrvEnv<'_, P, M>) -> R,
    ) -> Option<R> {
        let e = slot_entry(&mut self.conns, id)?;
        if e.retiring {
            return None;
        }
        let mut env = DrvEnv {
            p: &mut self.p,
            mem,
            regions: &self.regions,
            qp: e.qp,
            sends: self.send_shared.as_mut(),
        };
        let r = f(&mut e.conn, &mut env);
        // Settles the connection (its entry is still at hand): its events are collected at
        // once; its work waits for [`post_pending`](Self::post_pending), so that the Sends
        // one batch of inputs makes are posted together and only the last asks for a
        // completion (selective signalling). A connection that has closed is flushed at
        // once (what it queued before closing goes out before the disconnect). (A dead one
        // has closed: `dead` is set only once `closed()` is, which is never undone.)
        if e.conn.closed().is_some() {
            self.flush(id);
            return Some(r);
        }
        while let Some(ev) = e.conn.poll_event() {
            self.events.push_back((id, ev));
        }
        if !e.pending {
            e.pending = true;
            self.pending.push(id);
        }
        if e.conn.wants_timer() {
            e.watch(id, &mut self.timed);
        }
        Some(r)
    }

    /// Posts the work the connections queued since the last call (the poll loop calls it
    /// once per turn, after feeding the apps' submissions; [`poll`](Self::poll) calls it
    /// before and after the completions it feeds).
    pub fn post_pending(&mut self) {
        let mut list = std::mem::take(&mut self.pending);
        for id in list.drain(..) {
            if let Some(e) = self.entry_mut(id) {
                e.pending = false;
            }
            self.flush(id);
        }
        // Keeps the list's capacity (no allocation per turn); `flush` queues nothing here.
        self.pending = list;
    }

    /// Queues a call on connection `id` (see [`Connection::submit_call`]).
    pub fn submit_call(
        &mut self,
        id: ConnId,
        spec: &CallSpec<'_>,
        mem: &mut impl Memory,
    ) -> Result<(), SubmitError> {
        self.with(id, mem, |c, env| c.submit_call(spec, env))
            .unwrap_or(Err(SubmitError::Closed))
    }

    /// Places an incoming call's arguments (see [`Connection::accept_call`]).
    pub fn accept_call(
        &mut self,
        id: ConnId,
        call: ServeId,
        dest: MemRef,
        mem: &mut impl Memory,
    ) -> Result<Accepted, SubmitError> {
        self.with(id, mem, |c, env| c.accept_call(call, dest, env))
            .unwrap_or(Err(SubmitError::Closed))
    }

    /// Answers an incoming call with `accept_stat` only (see [`Connection::reject_call`]).
    pub fn reject_call(
        &mut self,
        id: ConnId,
        call: ServeId,
        accept_stat: u32,
        mem: &mut impl Memory,
    ) -> Result<(), SubmitError> {
        self.with(id, mem, |c, env| c.reject_call(call, accept_stat, env))
            .unwrap_or(Err(SubmitError::Closed))
    }

    /// Cancels a call (see [`Connection::cancel_call`]).
    pub fn cancel_call(
        &mut self,
        id: ConnId,
        xid: u32,
        mem: &mut impl Memory,
    ) -> Result<(), SubmitError> {
        self.with(id, mem, |c, _| c.cancel_call(xid))
            .unwrap_or(Err(SubmitError::Closed))
    }

    /// The `user` value of a call in flight (see [`Connection::call_user`]).
    pub fn call_user(&self, id: ConnId, xid: u32) -> Option<u64> {
        self.connection(id)?.call_user(xid)
    }

    /// Sends a reply (see [`Connection::submit_reply`]).
    pub fn submit_reply(
        &mut self,
        id: ConnId,
        call: ServeId,
        spec: &ReplySpec<'_>,
        mem: &mut impl Memory,
    ) -> Result<(), SubmitError> {
        self.with(id, mem, |c, env| c.submit_reply(call, spec, env))
            .unwrap_or(Err(SubmitError::Closed))
    }

    /// Sends an RDMA2_OPTIONAL message (see [`Connection::send_optional`]).
    pub fn send_optional(
        &mut self,
        id: ConnId,
        xid: u32,
        opttype: u32,
        optinfo: &[u8],
        mem: &mut impl Memory,
    ) -> Result<(), SubmitError> {
        self.with(id, mem, |c, env| {
            c.send_optional(xid, opttype, optinfo, env)
        })
        .unwrap_or(Err(SubmitError::Closed))
    }

    /// Answers an optional message with RDMA2_ERR_INVAL_OPTION.
    pub fn reject_optional(&mut self, id: ConnId, xid: u32, mem: &mut impl Memory) {
        self.with(id, mem, |c, env| c.reject_optional(xid, env));
    }

    /// Applies a control-plane decision to connection `id` (thresholds, invalidation).
    pub fn configure(
        &mut self,
        id: ConnId,
        f: impl FnOnce(&mut Connection),
    ) -> Result<(), DriverError> {
        let e = self.entry_mut(id).ok_or(DriverError::BadId)?;
        f(&mut e.conn);
        Ok(())
    }

    /// Ends connection `id`: its queue pair is disconnected and its calls complete with
    /// [`crate::CallStatus::Closed`]. Those events wait until the device has drained its send
    /// queue ([`Provider::drain_send_queue`]; at most [`DRAIN_WAIT`], or until
    /// [`remove`](Self::remove)), so that no Read of the connection still places data into
    /// memory that an app has been given back.
    pub fn close(&mut self, id: ConnId, reason: CloseReason, mem: &mut impl Memory) {
        self.with(id, mem, |c, _| c.close(reason));
    }

    /// Frees a connection's buffers and destroys its queue pair (closing it first if it is
    /// still open: its outstanding calls end with [`CallStatus::Closed`](crate::CallStatus)).
    /// The connection is unknown to every other call from now on. Its events (the ends of its
    /// calls, which give memory back to the apps) wait until the device is done with its
    /// queue pair ([`Provider::qp_retired`]): they are in [`poll_event`](Self::poll_event)'s
    /// queue when this returns if the device was done at once, or after the
    /// [`poll`](Self::poll) that sees it done ([`retiring`](Self::retiring) counts those
    /// still waiting). If the queue pair cannot be destroyed, its events go at once, its
    /// shared send buffers stay out, and the error is returned.
    pub fn remove(&mut self, id: ConnId) -> Result<(), DriverError> {
        // Closed first if it was not (its calls end, its shared buffers are released), then
        // the shared buffers it still has to give back go back now.
        let e = self.entry_mut(id).ok_or(DriverError::BadId)?;
        e.conn.close(CloseReason::Requested);
        let qp = e.qp;
        self.flush(id);
        self.by_qp.remove(&qp);
        let destroyed = self.p.destroy_qp(qp);
        if destroyed.is_ok() && !self.p.qp_retired(qp) {
            // An RDMA Read the device was placing may still land, a Send still read its
            // buffer: nothing goes back until it is done (`retired`).
            if let Some(e) = self.entry_mut(id) {
                e.retiring = true;
            }
            self.retiring.push((id, qp));
            return Ok(());
        }
        self.retired(id, destroyed.is_ok());
        destroyed?;
        Ok(())
    }

    /// Removed connections whose queue pair the device is not done with yet: their events
    /// come at a later [`poll`](Self::poll) (the provider is [`busy`](Provider::busy) until
    /// then, so an owner that polls while it is keeps them coming).
    pub fn retiring(&self) -> usize {
        self.retiring.len()
    }

    /// Removed connection `id`'s queue pair is gone (`destroyed`) or could not be destroyed:
    /// its events go out, its buffers back, its entry is freed.
    fn retired(&mut self, id: ConnId, destroyed: bool) {
        if let Some(e) = self.any_entry_mut(id) {
            e.retiring = false;
            if destroyed {
                // The device reads none of its buffers any more: those its last Sends were
                // reading go back too (if the queue pair could not be destroyed, they stay out).
                e.conn.teardown();
            }
            // Its events go now, whatever became of the drain marker: the calls they end
            // would otherwise never end.
            e.held = None;
        }
        self.flush(id);
        let Some(e) = self
            .conns
            .get_mut(id.idx as usize)
            .filter(|s| s.gen == id.gen)
            .and_then(|s| s.entry.take())
        else {
            return;
        };
        if e.block != NO_BLOCK {
            self.free_blocks.push(e.block);
        }
    }

    /// Retires the removed connections whose queue pair the device is done with.
    fn reap_retired(&mut self) {
        let mut i = 0;
        while let Some(&(id, qp)) = self.retiring.get(i) {
            if self.p.qp_retired(qp) {
                self.retiring.swap_remove(i);
                self.retired(id, true);
            } else {
                i += 1;
            }
        }
    }

    /// Posts the work waiting since the last call, polls the completion queue once and runs
    /// timers: completions go to their connections, whose follow-up work is posted before
    /// it returns; returns the completions handled.
    pub fn poll(&mut self, now: Instant, mem: &mut impl Memory) -> usize {
        self.post_pending();
        let mut wcs = std::mem::take(&mut self.wcs);
        let n = self.p.poll_cq(self.cq, &mut wcs).unwrap_or(0);
        self.completions += n as u64;
        // A connection's completions polled in a row go to it in one call (one settling of
        // the connection instead of one per completion), in the order polled.
        let mut run = std::mem::take(&mut self.run);
        let polled = &wcs[..n.min(wcs.len())];
        let mut i = 0;
        while let Some(wc) = polled.get(i) {
            i += 1;
            if wc.wr_id >> 48 == SRQ_CONN {
                self.on_shared_recv(now, wc, mem);
                continue;
            }
            let id = ConnId {
                idx: (wc.wr_id >> 48) as u32,
                gen: ((wc.wr_id >> 32) & 0xffff) as u32,
            };
            if wc.wr_id as u32 == DRAIN_TAG {
                self.drained(id);
                continue;
            }
            run.clear();
            run.push(completion(wc));
            // The same connection (index and generation), and not its drain marker.
            while let Some(next) = polled
                .get(i)
                .filter(|w| w.wr_id >> 32 == wc.wr_id >> 32 && w.wr_id as u32 != DRAIN_TAG)
            {
                run.push(completion(next));
                i += 1;
            }
            self.with(id, mem, |conn, env| conn.handle_completions(now, &run, env));
        }
        self.run = run;
        self.wcs = wcs;
        if !self.retiring.is_empty() {
            self.reap_retired();
        }
        let mut i = 0;
        while let Some(&id) = self.timed.get(i) {
            let (due, overdue) = self.entry_mut(id).map_or((false, false), |e| {
                (e.conn.wants_timer(), e.held.is_some_and(|t| now >= t))
            });
            if due {
                self.with(id, mem, |conn, _| conn.handle_timeout(now));
            }
            if overdue {
                self.drain_overdue += 1;
                self.drained(id);
            }
            match self.entry_mut(id) {
                Some(e) if e.conn.wants_timer() || e.held.is_some() => i += 1,
                gone_or_done => {
                    if let Some(e) = gone_or_done {
                        e.timed = false;
                    }
                    self.timed.swap_remove(i);
                }
            }
        }
        self.post_pending();
        n
    }

    /// A receive completion of the shared receive queue: routed by queue pair.
    fn on_shared_recv(&mut self, now: Instant, wc: &WorkCompletion, mem: &mut impl Memory) {
        let i = wc.wr_id as u32;
        let Some(sh) = self.shared else { return };
        if i < sh.count {
            self.srq_posted = self.srq_posted.saturating_sub(1);
        }
        let buf = sh.pool.sub(i.saturating_mul(sh.size), sh.size);
        let conn = self.by_qp.get(&wc.qp).copied();
        match (buf, conn) {
            (Some(buf), Some(id)) if i < sh.count => {
                if wc.status == rpcrdma_verbs::WcStatus::Success {
                    let (len, inv) = (wc.byte_len, wc.invalidated_rkey);
                    if self
                        .with(id, mem, |c, env| c.handle_recv(now, buf, len, inv, env))
                        .is_none()
                    {
                        let _ = self.repost_shared(i);
                    }
                } else {
                    let st = wc.status;
                    self.with(id, mem, |c, _| c.close(CloseReason::WorkFailed(st)));
                    let _ = self.repost_shared(i);
                }
            }
            _ if i < sh.count => {
                let _ = self.repost_shared(i);
            }
            _ => {}
        }
    }

    /// The next event of any connection.
    pub fn poll_event(&mut self) -> Option<(ConnId, Event)> {
        self.events.pop_front()
    }

    /// Posts connection `id`'s work and collects its events.
    fn flush(&mut self, id: ConnId) {
        let Some(e) = slot_entry(&mut self.conns, id) else {
            return;
        };
        let mut pools = Pools {
            send_shared: self.send_shared.as_mut(),
            shared: self.shared,
            srq_posted: &mut self.srq_posted,
        };
        if e.dead {
            // A dead connection's work is not posted; its buffers still go back.
            while let Some(w) = e.conn.poll_work() {
                if let Work::Release { buf } = w {
                    if let Err(why) = release(&mut self.p, &self.regions, &mut pools, buf) {
                        e.conn.close(CloseReason::Local(why));
                    }
                }
            }
        } else {
            // In one walk of the connection's queue; a failure stops it and closes the
            // connection (which keeps only the buffers to give back), and the walk resumes.
            let qp = e.qp;
            while let Err(why) = e.conn.drain_work(|w| match w {
                Work::Release { buf } => release(&mut self.p, &self.regions, &mut pools, buf),
                // R8166-4.5.4-c: what cannot be posted ends the connection.
                _ => post(&mut self.p, &self.regions, qp, id, &w),
            }) {
                e.conn.close(CloseReason::Local(why));
            }
        }
        if !e.dead && e.conn.closed().is_some() {
            e.dead = true;
            let _ = self.p.disconnect(e.qp);
            // Until the device is done with the work the connection posted, an RDMA Read may
            // still place data into an app's memory, and a Send or Write still read it. The
            // connection's events end its calls, which gives that memory back to the apps:
            // they wait for the drain marker (or for `remove`, or `DRAIN_WAIT`). A device that
            // takes no marker stopped at the error transition; its events go at once.
            if let Ok(true) = self.p.drain_send_queue(e.qp, wr_id(id, DRAIN_TAG)) {
                e.held = Some(Instant::now() + DRAIN_WAIT);
                e.watch(id, &mut self.timed);
            }
        }
        if e.held.is_some() || e.retiring {
            return;
        }
        while let Some(ev) = e.conn.poll_event() {
            self.events.push_back((id, ev));
        }
    }

    /// Connection `id`'s send queue is drained (or will never be, or its queue pair is gone):
    /// the events it held go out.
    fn drained(&mut self, id: ConnId) {
        if let Some(e) = self.entry_mut(id) {
            e.held = None;
        }
        self.flush(id);
    }
}

/// A polled work completion as its connection takes it.
#[inline]
fn completion(wc: &WorkCompletion) -> Completion {
    Completion {
        tag: wc.wr_id as u32,
        status: wc.status,
        byte_len: wc.byte_len,
        invalidated_rkey: wc.invalidated_rkey,
    }
}

/// The shared pools a released buffer goes back to.
struct Pools<'a> {
    send_shared: Option<&'a mut SendShared>,
    shared: Option<Shared>,
    srq_posted: &'a mut u32,
}

/// Gives a buffer back to its shared pool (dead connection or not); the error says why the
/// connection ends.
#[inline]
fn release<P: Provider>(
    p: &mut P,
    regions: &RegionIndex<Mr>,
    pools: &mut Pools<'_>,
    buf: MemRef,
) -> Result<(), &'static str> {
    // A shared send buffer goes back to its pool.
    if let Some(ss) = pools.send_shared.as_mut() {
        let inside = buf.mr == ss.pool.mr
            && buf.offset >= ss.pool.offset
            && buf.offset < ss.pool.offset + u64::from(ss.pool.len);
        if inside {
            let i = (buf.offset - ss.pool.offset) / u64::from(ss.stride.max(1));
            ss.free.push(i as u32);
            return Ok(());
        }
    }
    // A shared receive buffer goes back to the queue.
    if let Some(sh) = pools.shared {
        let i = buf.offset.saturating_sub(sh.pool.offset) / u64::from(sh.size.max(1));
        let wr = (SRQ_CONN << 48) | i;
        let ok = sge(regions, buf).is_some_and(|s| p.post_srq_recv(sh.srq, wr, &[s]).is_ok());
        if !ok {
            return Err("shared receive repost failed");
        }
        *pools.srq_posted += 1;
    }
    Ok(())
}

/// Posts one work request on `qp` (inline: once per work request, on the hot path); the
/// error says why the connection ends.
#[inline]
fn post<P: Provider>(
    p: &mut P,
    regions: &RegionIndex<Mr>,
    qp: QpId,
    id: ConnId,
    w: &Work,
) -> Result<(), &'static str> {
    const FAILED: &str = "post failed";
    let (tag, op, at, signaled) = match *w {
        Work::Recv { tag, buf } => {
            let s = sge(regions, buf).ok_or(FAILED)?;
            return p.post_recv(qp, wr_id(id, tag), &[s]).map_err(|_| FAILED);
        }
        Work::Send {
            tag,
            buf,
            invalidate,
            signaled,
        } => {
            let op = match invalidate {
                Some(rkey) => SendOp::SendWithInvalidate { rkey },
                None => SendOp::Send,
            };
            (tag, op, Some(buf), signaled)
        }
        Work::Read {
            tag,
            local,
            rkey,
            addr,
        } => (
            tag,
            SendOp::RdmaRead {
                remote_addr: addr,
                rkey,
            },
            Some(local),
            true,
        ),
        Work::Write {
            tag,
            local,
            rkey,
            addr,
            signaled,
        } => (
            tag,
            SendOp::RdmaWrite {
                remote_addr: addr,
                rkey,
            },
            Some(local),
            signaled,
        ),
        Work::Invalidate { tag, rkey } => (tag, SendOp::LocalInvalidate { rkey }, None, true),
        Work::Release { .. } => return Ok(()),
    };
    let one;
    let sg: &[Sge] = match at {
        Some(at) => {
            one = [sge(regions, at).ok_or(FAILED)?];
            &one
        }
        None => &[],
    };
    p.post_send(
        qp,
        &SendWr {
            wr_id: wr_id(id, tag),
            op,
            sg,
            signaled,
        },
    )
    .map_err(|_| FAILED)
}

/// Bytes each send buffer occupies in the pool (the buffer plus the engine's tail).
pub const fn send_stride(send_size: u32) -> u32 {
    send_size + SLOT_TAIL
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_tag_round_trips_connection_and_call() {
        let conn = ConnId {
            idx: 0x1234,
            gen: 0xbeef,
        };
        let id = ServeId::from_u32(0x00ab_cdef);
        assert_eq!(from_serve_tag(serve_tag(conn, id)), (conn, id));
        assert_eq!(ConnId::from_u32(conn.to_u32()), conn);
    }
}
