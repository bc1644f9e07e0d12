//! App side: [`Client`] for calls, [`Server`] for serving a program, [`Arena`] for the arena's space.

use crate::abi::{
    cqe_flag, flag, inline_room, op, status, ArenaRange, Cqe, Piece, Sqe, STATE_DETACHED,
};
use crate::attach::{connect, drain, wait_readable, wake, AppConn};
use crate::ring::{Consumer, Producer, RingError};
use crate::sync::{fence, Ordering};
use rustix::fd::{AsFd, BorrowedFd};
use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

/// Why an app-side operation failed.
#[derive(Debug)]
pub enum Error {
    /// The submission ring is full: drain completions and retry.
    RingFull,
    /// No arena space for the call's buffers.
    ArenaFull,
    /// The daemon detached this app (or its ring is corrupt).
    Detached,
    /// The operation completed with this [`status`] code.
    Status(u32),
    /// No such ticket (already taken, or never issued).
    UnknownTicket,
    /// Timed out waiting.
    Timeout,
    /// Socket or mapping failure.
    Io(io::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::RingFull => f.write_str("submission ring full"),
            Error::ArenaFull => f.write_str("arena full"),
            Error::Detached => f.write_str("detached by the daemon"),
            Error::Status(s) => write!(f, "completed with status {s} ({})", status::name(*s)),
            Error::UnknownTicket => f.write_str("unknown ticket"),
            Error::Timeout => f.write_str("timed out"),
            Error::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

/// A block of the arena owned by the app (until lent to the daemon in a submission).
#[derive(Debug, PartialEq, Eq)]
pub struct ArenaBuf {
    off: u32,
    len: u32,
    class: u8,
}

impl ArenaBuf {
    /// Offset in the arena (what descriptors carry).
    pub fn off(&self) -> u32 {
        self.off
    }

    /// Requested length.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// True if zero-length.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Power-of-two size-class allocator over the arena (64 B .. arena size); app-private bookkeeping.
#[derive(Debug)]
pub struct Arena {
    size: u32,
    bump: u32,
    free: Vec<Vec<u32>>,
}

const MIN_CLASS_SHIFT: u32 = 6;

impl Arena {
    /// An allocator for an arena of `size` bytes.
    pub fn new(size: u32) -> Arena {
        Arena {
            size,
            bump: 0,
            free: (0..32).map(|_| Vec::new()).collect(),
        }
    }

    /// Allocates `len` bytes (64-byte aligned); `None` when no space is left.
    pub fn alloc(&mut self, len: u32) -> Option<ArenaBuf> {
        let block = len.max(1 << MIN_CLASS_SHIFT).checked_next_power_of_two()?;
        let class = (block.trailing_zeros() - MIN_CLASS_SHIFT) as u8;
        if let Some(off) = self.free.get_mut(usize::from(class))?.pop() {
            return Some(ArenaBuf { off, len, class });
        }
        let off = self.bump.checked_next_multiple_of(block.min(4096))?;
        let end = off.checked_add(block)?;
        if end > self.size {
            return None;
        }
        self.bump = end;
        Some(ArenaBuf { off, len, class })
    }

    /// Returns a block.
    pub fn free(&mut self, b: ArenaBuf) {
        if let Some(l) = self.free.get_mut(usize::from(b.class)) {
            l.push(b.off);
        }
    }
}

/// The reply buffer a call gets when neither the app ([`CallBuilder::max_reply`]) nor the
/// daemon (its peer table's `reply_inline`) says how large the reply may be.
pub const DEFAULT_MAX_REPLY: u32 = 4096;

/// How long an app busy-polls its completion ring before sleeping on its socket, by default.
pub const SPIN: Duration = Duration::from_micros(50);

/// The longest single sleep of a wait (a bounded sleep also notices a detach that came without
/// a wake-up).
const MAX_SLEEP: Duration = Duration::from_millis(100);

/// How an app waits for a completion: poll its completion ring for `spin`, then sleep on its socket.
///
/// Between polls it either busy-waits (a CPU pause hint: lowest hand-off latency when it has a core to
/// itself) or, with `yield_cpu`, calls `sched_yield` so that on an oversubscribed host the daemon and the
/// peer app can run on the core this app would otherwise burn. Either way, once `spin` has passed without
/// a completion the app sleeps (waiter flag plus socket wake-up, see `ABI.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    /// How long to poll before sleeping; zero sleeps at once.
    pub spin: Duration,
    /// Yield the CPU (`sched_yield`) between polls instead of busy-waiting.
    pub yield_cpu: bool,
}

impl WaitPolicy {
    /// Busy-poll for `spin`, then sleep.
    pub const fn spin(spin: Duration) -> Self {
        WaitPolicy {
            spin,
            yield_cpu: false,
        }
    }

    /// Poll and yield the CPU between polls for `spin`, then sleep.
    pub const fn yielding(spin: Duration) -> Self {
        WaitPolicy {
            spin,
            yield_cpu: true,
        }
    }
}

impl From<Duration> for WaitPolicy {
    /// Busy-poll for the duration, then sleep (what [`Client::set_spin`] sets).
    fn from(spin: Duration) -> Self {
        WaitPolicy::spin(spin)
    }
}

impl Default for WaitPolicy {
    /// Busy-poll for [`SPIN`], then sleep.
    fn default() -> Self {
        WaitPolicy::spin(SPIN)
    }
}

/// The rings and region of one attached app.
#[derive(Debug)]
struct Endpoint {
    conn: AppConn,
    sq: Producer<Sqe>,
    cq: Consumer<Cqe>,
    arena: Arena,
    peers: Vec<String>,
    /// Each peer's [`crate::abi::PeerEntry::reply_inline`], by peer index.
    reply_inline: Vec<u32>,
    wait: WaitPolicy,
    /// Times a wait went to sleep on the socket (its spin window passed without a completion).
    sleeps: u64,
    /// [`arm`](Self::arm) asked the daemon for a wake-up byte: the next poll clears the ask
    /// and drains the socket.
    armed: bool,
}

impl Endpoint {
    fn connect(path: &Path) -> io::Result<Endpoint> {
        let conn = connect(path)?;
        // SAFETY: this endpoint is the app's only SQ producer and CQ consumer, and keeps the region alive.
        let (sq, cq) = unsafe { (conn.region.sq_producer(), conn.region.cq_consumer()) };
        let arena = Arena::new(conn.region.layout().geometry.arena_size);
        let (peers, reply_inline) = conn
            .region
            .peer_table()
            .into_iter()
            .map(|p| (p.name, p.reply_inline))
            .unzip();
        Ok(Endpoint {
            conn,
            sq,
            cq,
            arena,
            peers,
            reply_inline,
            wait: WaitPolicy::default(),
            sleeps: 0,
            armed: false,
        })
    }

    fn detached(&self) -> bool {
        self.conn
            .region
            .header()
            .state
            .value
            .load(Ordering::Acquire)
            == STATE_DETACHED
    }

    fn submit(&mut self, s: Sqe) -> Result<(), Error> {
        if self.detached() {
            return Err(Error::Detached);
        }
        match self.sq.push(s) {
            Ok(()) => {}
            Err(RingError::Full) => return Err(Error::RingFull),
            Err(RingError::Corrupt) => return Err(Error::Detached),
        }
        // SYNC POINT: SeqCst fence between our SQ tail store and the load of `daemon_waiting`; pairs with the
        // daemon's fence in `AppTable::park` (it stores the flag, fences, then re-reads our tail).
        fence(Ordering::SeqCst);
        let h = self.conn.region.header();
        if h.daemon_waiting.value.load(Ordering::Relaxed) != 0 {
            wake(self.conn.sock.as_fd());
        }
        Ok(())
    }

    fn poll(&mut self) -> Result<Option<Cqe>, Error> {
        if self.armed {
            self.disarm()?;
        }
        self.cq.pop().map_err(|_| Error::Detached)
    }

    /// The first half of the sleep handshake (ABI.md §5), for [`wait`](Self::wait) and for an
    /// app's own event loop: asks the daemon to write a byte on the socket with its next
    /// completion. False (and the ask taken back) if a completion is already waiting: poll
    /// instead of sleeping.
    fn arm(&mut self) -> Result<bool, Error> {
        if self.detached() {
            return Err(Error::Detached);
        }
        let h = self.conn.region.header();
        h.app_waiting.value.store(1, Ordering::Relaxed);
        self.armed = true;
        // SYNC POINT: SeqCst fence between our `app_waiting` store and the CQ tail load in `ready`; pairs
        // with the daemon's fence between its CQ tail store and its `app_waiting` load (`App::wake`).
        fence(Ordering::SeqCst);
        if self.cq.ready().map_err(|_| Error::Detached)? > 0 {
            self.disarm()?;
            return Ok(false);
        }
        Ok(true)
    }

    /// Takes back [`arm`](Self::arm)'s ask and discards the wake-up bytes; `Detached` if the
    /// daemon closed the socket.
    fn disarm(&mut self) -> Result<(), Error> {
        self.armed = false;
        self.conn
            .region
            .header()
            .app_waiting
            .value
            .store(0, Ordering::Relaxed);
        if drain(self.conn.sock.as_fd()) {
            Ok(())
        } else {
            Err(Error::Detached)
        }
    }

    /// Next completion: polls for `self.wait.spin` (busy or yielding), then sleeps on its socket; `None` at
    /// the deadline.
    fn wait(&mut self, deadline: Option<Instant>) -> Result<Option<Cqe>, Error> {
        let start = Instant::now();
        loop {
            if let Some(c) = self.poll()? {
                return Ok(Some(c));
            }
            let spent = start.elapsed();
            if spent >= self.wait.spin {
                break;
            }
            // A long spin window must not outlast the caller's deadline nor miss a detach.
            if deadline.is_some_and(|d| start + spent >= d) {
                return Ok(None);
            }
            if self.detached() {
                return Err(Error::Detached);
            }
            if self.wait.yield_cpu {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        self.sleeps = self.sleeps.wrapping_add(1);
        loop {
            if !self.arm()? {
                return self.poll();
            }
            let sleep = match deadline {
                None => MAX_SLEEP,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        self.disarm()?;
                        return Ok(None);
                    }
                    left.min(MAX_SLEEP)
                }
            };
            // A bounded sleep also notices a detach that happened without a wake-up.
            wait_readable(self.conn.sock.as_fd(), sleep);
            self.disarm()?;
        }
    }

    fn write(&self, b: &ArenaBuf, at: u32, data: &[u8]) {
        if let Some(r) = self.range(b).and_then(|r| narrow(r, at)) {
            self.conn.region.write_arena(r, data);
        }
    }

    fn read(&self, off: u32, len: u32) -> Vec<u8> {
        let mut v = vec![0u8; len as usize];
        if let Some(r) = self.conn.region.range(off, len) {
            self.conn.region.read_arena(r, &mut v);
        }
        v
    }

    fn range(&self, b: &ArenaBuf) -> Option<ArenaRange> {
        self.conn.region.range(b.off, b.len)
    }

    fn write_pieces(&self, table: &ArenaBuf, pieces: &[Piece]) {
        for (i, p) in pieces.iter().enumerate() {
            self.conn.region.write_piece(table.off, i as u32, *p);
        }
    }

    fn read_piece(&self, table: u32, i: u32) -> Option<Piece> {
        self.conn.region.read_piece(table, i)
    }
}

impl Drop for Endpoint {
    /// Says goodbye on the ring ([`op::DETACH`]) before the socket closes: the daemon frees the
    /// app's slot (and cancels what it had in flight) on its next poll rather than at its next
    /// look at the sockets. With the ring full it is skipped; the closed socket still does it.
    fn drop(&mut self) {
        if !self.detached() {
            let _ = self.submit(Sqe {
                opcode: op::DETACH,
                ..Sqe::default()
            });
        }
    }
}

/// The app's socket, for its own event loop: see [`Client::arm`].
impl AsFd for Client {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ep.conn.sock.as_fd()
    }
}

/// The app's socket, for its own event loop: see [`Server::arm`].
impl AsFd for Server {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ep.conn.sock.as_fd()
    }
}

fn narrow(r: ArenaRange, at: u32) -> Option<ArenaRange> {
    ArenaRange::new(r.off().checked_add(at)?, r.len().checked_sub(at)?, u32::MAX)
}

fn pad4(n: usize) -> usize {
    (4 - n % 4) % 4
}

/// An XDR stream with DDP-eligible pieces kept aside (the reduced stream plus (position, data) pairs).
#[derive(Debug, Default, Clone)]
pub struct XdrBuilder {
    msg: Vec<u8>,
    pieces: Vec<(u32, Vec<u8>)>,
}

impl XdrBuilder {
    /// Appends a big-endian `u32`.
    pub fn put_u32(&mut self, v: u32) -> &mut Self {
        self.msg.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// Appends variable-length opaque data inline (length, bytes, pad).
    pub fn put_opaque(&mut self, d: &[u8]) -> &mut Self {
        self.put_u32(d.len() as u32);
        self.msg.extend_from_slice(d);
        self.msg.extend(std::iter::repeat_n(0, pad4(d.len())));
        self
    }

    /// Appends opaque data as a DDP-eligible item: the length stays inline, the bytes become a piece.
    pub fn put_ddp_opaque(&mut self, d: &[u8]) -> &mut Self {
        self.put_u32(d.len() as u32);
        self.pieces.push((self.msg.len() as u32, d.to_vec()));
        self
    }

    /// Bytes of the reduced stream written so far (the position of the next item).
    pub fn len(&self) -> u32 {
        self.msg.len() as u32
    }

    /// Whether nothing has been written yet.
    pub fn is_empty(&self) -> bool {
        self.msg.is_empty() && self.pieces.is_empty()
    }

    /// Overwrites the word written at `at` (from [`len`](Self::len) before it was put), for a
    /// count known only once its list is written; `false` if no word was written there.
    pub fn set_u32(&mut self, at: u32, v: u32) -> bool {
        let at = at as usize;
        match self.msg.get_mut(at..at.saturating_add(4)) {
            Some(w) if at % 4 == 0 => {
                w.copy_from_slice(&v.to_be_bytes());
                true
            }
            _ => false,
        }
    }

    /// The reassembled stream (pieces put back in place with their pad).
    pub fn to_full(&self) -> Vec<u8> {
        reassemble(
            &self.msg,
            self.pieces.iter().map(|(p, d)| (*p, d.as_slice())),
        )
    }
}

fn reassemble<'a>(msg: &[u8], pieces: impl Iterator<Item = (u32, &'a [u8])>) -> Vec<u8> {
    let mut out = Vec::with_capacity(msg.len());
    let mut cur = 0usize;
    for (pos, d) in pieces {
        let pos = (pos as usize).clamp(cur, msg.len());
        out.extend_from_slice(&msg[cur..pos]);
        out.extend_from_slice(d);
        out.extend(std::iter::repeat_n(0, pad4(d.len())));
        cur = pos;
    }
    out.extend_from_slice(&msg[cur..]);
    out
}

/// A finished call: its ticket and its outcome.
pub type Finished = (Ticket, Result<Reply, Error>);

/// Identifies one call of a [`Client`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket(u64);

impl Ticket {
    /// The ticket of the call in client slot `slot`, generation `gen` (the CALL's `user_data`).
    fn new(slot: u32, gen: u32) -> Ticket {
        Ticket((u64::from(slot) << 32) | u64::from(gen))
    }

    /// Its client slot.
    fn slot(self) -> usize {
        (self.0 >> 32) as usize
    }

    /// Its slot's generation.
    fn gen(self) -> u32 {
        self.0 as u32
    }
}

/// A finished call.
#[derive(Debug)]
pub struct Reply {
    /// Which call.
    pub ticket: Ticket,
    /// The XID used.
    pub xid: u32,
    /// accept_stat (0 = SUCCESS).
    pub accept_stat: u32,
    /// The result XDR, reassembled (DDP results put back in place).
    pub body: Vec<u8>,
    /// Bytes of the body that arrived in result buffers (the Write-chunk path) rather than inline.
    pub ddp_bytes: u32,
}

#[derive(Debug)]
struct InFlight {
    bufs: Vec<ArenaBuf>,
    table: Option<u32>,
    n_args: u32,
    results: Vec<u32>,
}

#[derive(Debug)]
enum Slot {
    Free,
    InFlight(InFlight),
    Done(Result<Reply, Error>),
}

/// An app that makes calls through the daemon.
#[derive(Debug)]
pub struct Client {
    ep: Endpoint,
    slots: Vec<(u32, Slot)>,
    free: Vec<u32>,
    done: VecDeque<Ticket>,
    /// The arena buffers of calls that ended lent ([`cqe_flag::LENT`]), by `user_data`, held
    /// aside until their [`op::RELEASED`].
    lent: Vec<(u64, Vec<ArenaBuf>)>,
}

/// A call being built; [`CallBuilder::submit`] puts it on the ring.
#[derive(Debug)]
pub struct CallBuilder<'c> {
    client: &'c mut Client,
    peer: u32,
    prog: u32,
    vers: u32,
    proc_: u32,
    xid: Option<u32>,
    args: XdrBuilder,
    results: Vec<u32>,
    max_reply: Option<u32>,
    timeout_ms: u32,
    auth: Option<(u32, u32)>,
}

impl CallBuilder<'_> {
    /// The call's arguments (append XDR items to it).
    pub fn args(&mut self) -> &mut XdrBuilder {
        &mut self.args
    }

    /// Offers a buffer of `len` bytes for the next DDP-eligible result.
    pub fn result_buffer(&mut self, len: u32) -> &mut Self {
        self.results.push(len);
        self
    }

    /// Sets the maximum size of the (reduced) reply. The default is the largest reply the
    /// daemon receives inline from this peer ([`Client::reply_inline`], less
    /// [`WRITE_CHUNK_ROOM`](crate::abi::WRITE_CHUNK_ROOM) per result buffer), or
    /// [`DEFAULT_MAX_REPLY`] when the daemon does not say: a larger reply then ends the call
    /// with `REPLY_TOO_LARGE`. Size it to the procedure's largest reply: a buffer that may
    /// exceed the inline threshold costs a Reply chunk, exposed for the RPC (see ABI.md §4 on
    /// Linux servers and a Reply chunk next to a Write list).
    pub fn max_reply(&mut self, len: u32) -> &mut Self {
        self.max_reply = Some(len);
        self
    }

    /// Uses this XID instead of one the daemon assigns.
    pub fn xid(&mut self, xid: u32) -> &mut Self {
        self.xid = Some(xid);
        self
    }

    /// Sends the call with an AUTH_SYS credential naming `uid` and `gid` (RFC 5531; no
    /// supplementary groups, an empty machine name) instead of AUTH_NONE. The daemon lets an
    /// app not running as root name only its own uid and gid: another identity fails the call
    /// with [`status::AUTH_DENIED`].
    pub fn auth_sys(&mut self, uid: u32, gid: u32) -> &mut Self {
        self.auth = Some((uid, gid));
        self
    }

    /// Ends the call with [`status::TIMEOUT`] if no reply has come `limit` after the daemon
    /// took it (rounded up to whole milliseconds, at most `u32::MAX` of them; zero means no
    /// limit, the default). The daemon cancels it as [`Client::cancel`] does: the call
    /// finishes at once, and memory the peer may still reach comes back later, by itself.
    pub fn timeout(&mut self, limit: Duration) -> &mut Self {
        let ms = limit.as_nanos().div_ceil(1_000_000);
        self.timeout_ms = u32::try_from(ms).unwrap_or(u32::MAX);
        self
    }

    /// Copies the call into the arena and submits it.
    pub fn submit(self) -> Result<Ticket, Error> {
        let max_reply = self.max_reply.unwrap_or_else(|| {
            self.client
                .reply_inline(self.peer)
                .and_then(|n| inline_room(n, self.results.len()))
                .unwrap_or(DEFAULT_MAX_REPLY)
        });
        self.client.submit_call(
            self.peer,
            self.prog,
            self.vers,
            self.proc_,
            self.xid,
            &self.args,
            &self.results,
            max_reply,
            self.timeout_ms,
            self.auth,
        )
    }
}

impl Client {
    /// Attaches to the daemon listening at `path`.
    pub fn connect(path: impl AsRef<Path>) -> Result<Client, Error> {
        Ok(Client {
            ep: Endpoint::connect(path.as_ref())?,
            slots: Vec::new(),
            free: Vec::new(),
            done: VecDeque::new(),
            lent: Vec::new(),
        })
    }

    /// Sets how long waits busy-poll before sleeping (default [`SPIN`]; zero sleeps at once). Longer spins
    /// cut latency and burn a core. Same as `set_wait(WaitPolicy::spin(spin))`.
    pub fn set_spin(&mut self, spin: Duration) {
        self.ep.wait = WaitPolicy::spin(spin);
    }

    /// Sets how waits poll before sleeping (e.g. [`WaitPolicy::yielding`] on a host with fewer cores than
    /// busy threads).
    pub fn set_wait(&mut self, wait: WaitPolicy) {
        self.ep.wait = wait;
    }

    /// How many waits so far went to sleep on the socket because their spin window passed empty.
    pub fn sleeps(&self) -> u64 {
        self.ep.sleeps
    }

    /// Gets ready to sleep in the app's own event loop (epoll, mio, tokio's `AsyncFd`) on
    /// this client's descriptor ([`AsFd`]): asks the daemon to make it readable with its
    /// next completion. `Ok(true)`: sleep until it is readable, then [`poll`](Self::poll) or
    /// [`progress`](Self::progress) (which take the ask back and drain it); `Ok(false)`: a
    /// call has finished already, poll now instead. Waking without a finished call is
    /// possible (arm again); sleeping without arming may never wake. A daemon that goes
    /// away makes the descriptor readable and the next poll fail with [`Error::Detached`].
    pub fn arm(&mut self) -> Result<bool, Error> {
        if !self.done.is_empty() {
            return Ok(false);
        }
        self.ep.arm()
    }

    /// Peer names from the daemon's config; a name's position is its peer index.
    pub fn peers(&self) -> &[String] {
        &self.ep.peers
    }

    /// The largest reduced reply the daemon receives inline from peer index `peer` for a call
    /// without result buffers (its peer table's `reply_inline`), or `None` when the daemon
    /// does not say (an older daemon, or a peer index past the table: a connection's own peer
    /// for calls back). The default reply buffer ([`CallBuilder::max_reply`]) derives from it.
    pub fn reply_inline(&self, peer: u32) -> Option<u32> {
        let n = *self.ep.reply_inline.get(usize::try_from(peer).ok()?)?;
        (n > 0).then_some(n)
    }

    /// The index of the peer called `name`.
    pub fn peer(&self, name: &str) -> Option<u32> {
        self.ep
            .peers
            .iter()
            .position(|p| p == name)
            .map(|i| i as u32)
    }

    /// The arena allocator (to place data for zero-copy use).
    pub fn arena(&mut self) -> &mut Arena {
        &mut self.ep.arena
    }

    /// Starts a call of `prog`/`vers`/`proc_` to peer index `peer`.
    pub fn call(&mut self, peer: u32, prog: u32, vers: u32, proc_: u32) -> CallBuilder<'_> {
        CallBuilder {
            client: self,
            peer,
            prog,
            vers,
            proc_,
            xid: None,
            args: XdrBuilder::default(),
            results: Vec::new(),
            max_reply: None,
            timeout_ms: 0,
            auth: None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn submit_call(
        &mut self,
        peer: u32,
        prog: u32,
        vers: u32,
        proc_: u32,
        xid: Option<u32>,
        args: &XdrBuilder,
        results: &[u32],
        max_reply: u32,
        timeout_ms: u32,
        auth: Option<(u32, u32)>,
    ) -> Result<Ticket, Error> {
        let mut bufs: Vec<ArenaBuf> = Vec::new();
        let r = self.place_call(&mut bufs, args, results, max_reply);
        let (msg, reply, table, n_args) = match r {
            Ok(v) => v,
            Err(e) => {
                bufs.into_iter().for_each(|b| self.ep.arena.free(b));
                return Err(e);
            }
        };
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push((0, Slot::Free));
                (self.slots.len() - 1) as u32
            }
        };
        let gen = self.slots[slot as usize].0.wrapping_add(1);
        let ticket = Ticket::new(slot, gen);
        let sqe = Sqe {
            opcode: op::CALL,
            flags: if xid.is_some() { flag::XID_APP } else { 0 }
                | if auth.is_some() { flag::AUTH_SYS } else { 0 },
            n_args,
            n_results: results.len() as u8,
            target: peer,
            user_data: ticket.0,
            prog,
            vers,
            proc_,
            xid: xid.unwrap_or(0),
            msg_off: msg.0,
            msg_len: msg.1,
            pieces_off: table.unwrap_or(0),
            reply_off: reply.0,
            reply_len: reply.1,
            timeout_ms,
            auth_uid: auth.map_or(0, |a| a.0),
            auth_gid: auth.map_or(0, |a| a.1),
        };
        if let Err(e) = self.ep.submit(sqe) {
            bufs.into_iter().for_each(|b| self.ep.arena.free(b));
            self.free.push(slot);
            return Err(e);
        }
        self.slots[slot as usize] = (
            gen,
            Slot::InFlight(InFlight {
                bufs,
                table,
                n_args: u32::from(n_args),
                results: results.to_vec(),
            }),
        );
        Ok(ticket)
    }

    /// Allocates and fills the call's arena buffers: (msg off,len), (reply off,len), piece table, n_args.
    #[allow(clippy::type_complexity)]
    fn place_call(
        &mut self,
        bufs: &mut Vec<ArenaBuf>,
        args: &XdrBuilder,
        results: &[u32],
        max_reply: u32,
    ) -> Result<((u32, u32), (u32, u32), Option<u32>, u8), Error> {
        if args.pieces.len() > crate::abi::MAX_PIECES || results.len() > crate::abi::MAX_PIECES {
            return Err(Error::Status(status::BAD_PIECES));
        }
        let ep = &mut self.ep;
        let msg = ep
            .arena
            .alloc(args.msg.len() as u32)
            .ok_or(Error::ArenaFull)?;
        ep.write(&msg, 0, &args.msg);
        let m = (msg.off, msg.len);
        bufs.push(msg);
        let reply = ep.arena.alloc(max_reply).ok_or(Error::ArenaFull)?;
        let rp = (reply.off, reply.len);
        bufs.push(reply);
        let n = args.pieces.len() + results.len();
        let mut table = None;
        if n > 0 {
            let t = ep.arena.alloc(16 * n as u32).ok_or(Error::ArenaFull)?;
            let mut recs = Vec::with_capacity(n);
            for (pos, d) in &args.pieces {
                let b = ep.arena.alloc(d.len() as u32).ok_or(Error::ArenaFull)?;
                ep.write(&b, 0, d);
                recs.push(Piece {
                    off: b.off,
                    len: b.len,
                    xdr_pos: *pos,
                    used: 0,
                });
                bufs.push(b);
            }
            for &len in results {
                let b = ep.arena.alloc(len).ok_or(Error::ArenaFull)?;
                recs.push(Piece {
                    off: b.off,
                    len: b.len,
                    xdr_pos: 0,
                    used: 0,
                });
                bufs.push(b);
            }
            ep.write_pieces(&t, &recs);
            table = Some(t.off);
            bufs.push(t);
        }
        Ok((m, rp, table, args.pieces.len() as u8))
    }

    fn on_cqe(&mut self, c: Cqe) {
        if c.kind == op::RELEASED {
            if let Some(k) = self.lent.iter().position(|(u, _)| *u == c.user_data) {
                let (_, bufs) = self.lent.swap_remove(k);
                bufs.into_iter().for_each(|b| self.ep.arena.free(b));
            }
            return;
        }
        if c.kind != op::CALL {
            return;
        }
        let ticket = Ticket(c.user_data);
        let Some((g, s)) = self.slots.get_mut(ticket.slot()) else {
            return;
        };
        if *g != ticket.gen() {
            return;
        }
        let Slot::InFlight(f) = std::mem::replace(s, Slot::Free) else {
            return;
        };
        let res = if c.status != status::OK {
            Err(Error::Status(c.status))
        } else {
            let reply = self.ep.read(c.msg_off, c.msg_len);
            let mut pieces = Vec::new();
            if let Some(t) = f.table {
                for i in 0..u32::from(c.n_results).min(f.results.len() as u32) {
                    if let Some(p) = self.ep.read_piece(t, f.n_args + i) {
                        if p.used > 0 {
                            pieces.push((p.xdr_pos, self.ep.read(p.off, p.used.min(p.len))));
                        }
                    }
                }
            }
            Ok(Reply {
                ticket,
                xid: c.xid,
                accept_stat: c.rpc_stat,
                ddp_bytes: pieces.iter().map(|(_, d)| d.len() as u32).sum(),
                body: reassemble(&reply, pieces.iter().map(|(p, d)| (*p, d.as_slice()))),
            })
        };
        if c.flags & cqe_flag::LENT != 0 {
            // The peer may still write them: not reused before the call's RELEASED.
            self.lent.push((c.user_data, f.bufs));
        } else {
            f.bufs.into_iter().for_each(|b| self.ep.arena.free(b));
        }
        self.slots[ticket.slot()].1 = Slot::Done(res);
        self.done.push_back(ticket);
    }

    /// Moves every available completion into the finished set; returns how many.
    pub fn progress(&mut self) -> Result<usize, Error> {
        let mut n = 0;
        while let Some(c) = self.ep.poll()? {
            self.on_cqe(c);
            n += 1;
        }
        Ok(n)
    }

    /// Takes the result of `t` if it has finished.
    pub fn try_take(&mut self, t: Ticket) -> Result<Option<Result<Reply, Error>>, Error> {
        self.progress()?;
        let slot = t.slot();
        match self.slots.get_mut(slot) {
            Some((g, s)) if *g == t.gen() => match s {
                Slot::Done(_) => {
                    let Slot::Done(r) = std::mem::replace(s, Slot::Free) else {
                        return Err(Error::UnknownTicket);
                    };
                    self.free.push(slot as u32);
                    self.done.retain(|d| *d != t);
                    Ok(Some(r))
                }
                Slot::InFlight(_) => Ok(None),
                Slot::Free => Err(Error::UnknownTicket),
            },
            _ => Err(Error::UnknownTicket),
        }
    }

    /// The next finished call, in completion order, without waiting.
    pub fn poll(&mut self) -> Result<Option<Finished>, Error> {
        self.progress()?;
        match self.done.front().copied() {
            Some(t) => Ok(self.try_take(t)?.map(|r| (t, r))),
            None => Ok(None),
        }
    }

    /// Waits for `t` (spinning briefly, then sleeping on the socket) up to `timeout` (`None` = forever).
    pub fn wait(&mut self, t: Ticket, timeout: Option<Duration>) -> Result<Reply, Error> {
        let deadline = timeout.map(|d| Instant::now() + d);
        loop {
            if let Some(r) = self.try_take(t)? {
                return r;
            }
            match self.ep.wait(deadline)? {
                Some(c) => self.on_cqe(c),
                None => return Err(Error::Timeout),
            }
        }
    }

    /// Waits for any call to finish.
    pub fn wait_any(
        &mut self,
        timeout: Option<Duration>,
    ) -> Result<(Ticket, Result<Reply, Error>), Error> {
        let deadline = timeout.map(|d| Instant::now() + d);
        loop {
            if let Some(r) = self.poll()? {
                return Ok(r);
            }
            match self.ep.wait(deadline)? {
                Some(c) => self.on_cqe(c),
                None => return Err(Error::Timeout),
            }
        }
    }

    /// Iterates over calls that have already finished (drains them).
    pub fn completions(&mut self) -> impl Iterator<Item = (Ticket, Result<Reply, Error>)> + '_ {
        std::iter::from_fn(move || self.poll().ok().flatten())
    }

    /// Asks the daemon to cancel call `t`. The call still finishes once, as every call does:
    /// with `Error::Status(CANCELLED)` at once, or with its reply if that came first. If the
    /// peer may still reach the call's memory through a chunk (a large argument, a result
    /// buffer, a long reply), the client keeps those arena buffers aside until the daemon
    /// says the peer no longer can (after the late reply, or when the connection ends;
    /// [`lent`](Self::lent) counts them meanwhile); nothing else waits, and the connection
    /// is not put at risk (ABI.md §5).
    ///
    /// `UnknownTicket` if `t` is not in flight (never issued, taken already, or finished and
    /// waiting to be taken); `RingFull` if the request finds no room (retry after a poll).
    pub fn cancel(&mut self, t: Ticket) -> Result<(), Error> {
        match self.slots.get(t.slot()) {
            Some((g, Slot::InFlight(_))) if *g == t.gen() => {}
            _ => return Err(Error::UnknownTicket),
        }
        self.ep.submit(Sqe {
            opcode: op::CANCEL,
            user_data: t.0,
            ..Sqe::default()
        })
    }

    /// Calls that ended (cancelled, or past their time limit) while the peer could still
    /// reach their memory: their arena buffers come back, and their slots under the daemon's
    /// limit on calls in flight, once the daemon releases them.
    pub fn lent(&self) -> usize {
        self.lent.len()
    }

    /// Calls in flight.
    pub fn in_flight(&self) -> usize {
        self.slots
            .iter()
            .filter(|(_, s)| matches!(s, Slot::InFlight(_)))
            .count()
    }
}

/// An incoming call as the handler sees it.
#[derive(Debug)]
pub struct Call<'a> {
    /// Program version (a server may serve several, [`Server::start`] each).
    pub vers: u32,
    /// Procedure.
    pub proc_: u32,
    /// XID.
    pub xid: u32,
    /// Calling peer index.
    pub peer: u32,
    /// The argument XDR (reassembled: DDP pieces already in place).
    pub args: &'a [u8],
    /// The caller's AUTH_SYS identity (uid, gid); `None` for AUTH_NONE.
    pub auth: Option<(u32, u32)>,
}

/// A call taken to be answered later ([`Server::next_call`], [`Server::try_next_call`]): its
/// arguments are copied out and its receive buffer is posted again, so the app may answer it
/// whenever and in whatever order it likes, from another thread or task as well.
///
/// Every call taken must be answered with [`Server::answer`]: the daemon keeps the call open
/// until then (the calling peer's request waits, and the connection's slot for it stays
/// taken), or until the app detaches (then it answers SYSTEM_ERR itself). To refuse a call,
/// answer it with an `accept_stat` such as SYSTEM_ERR (5). A call held takes one of the app's
/// operation slots (`ABI.md` §5) until it is answered.
#[derive(Debug)]
#[must_use = "a call taken must be answered (Server::answer): its caller waits until then"]
pub struct PendingCall {
    /// Program.
    pub prog: u32,
    /// Program version.
    pub vers: u32,
    /// Procedure.
    pub proc_: u32,
    /// XID.
    pub xid: u32,
    /// Calling peer index.
    pub peer: u32,
    /// The argument XDR (reassembled: DDP pieces already in place).
    pub args: Vec<u8>,
    /// The caller's AUTH_SYS identity (uid, gid); `None` for AUTH_NONE.
    pub auth: Option<(u32, u32)>,
    /// The daemon's handle for the reply.
    handle: u32,
}

impl PendingCall {
    /// The call as a handler sees it.
    pub fn call(&self) -> Call<'_> {
        Call {
            vers: self.vers,
            proc_: self.proc_,
            xid: self.xid,
            peer: self.peer,
            args: &self.args,
            auth: self.auth,
        }
    }
}

/// The reply a handler builds: result XDR, DDP-eligible results marked with `put_ddp_opaque`.
#[derive(Debug, Default)]
pub struct ReplyBuilder {
    /// The results.
    pub xdr: XdrBuilder,
    /// accept_stat (0 = SUCCESS, 3 = PROC_UNAVAIL, 4 = GARBAGE_ARGS, 5 = SYSTEM_ERR).
    pub accept_stat: u32,
}

/// An app that serves programs.
#[derive(Debug)]
pub struct Server {
    ep: Endpoint,
    recv_count: u32,
    recv_size: u32,
    replies: Vec<Option<Vec<ArenaBuf>>>,
    stash: VecDeque<Cqe>,
    registered: Vec<(u32, u32, bool)>,
    posted: u32,
}

impl Server {
    /// Attaches to the daemon at `path`; posts 16 receive buffers of 64 KiB when serving.
    pub fn connect(path: impl AsRef<Path>) -> Result<Server, Error> {
        Ok(Server {
            ep: Endpoint::connect(path.as_ref())?,
            recv_count: 16,
            recv_size: 64 << 10,
            replies: Vec::new(),
            stash: VecDeque::new(),
            registered: Vec::new(),
            posted: 0,
        })
    }

    /// Sets how long waits busy-poll before sleeping (default [`SPIN`]). Same as
    /// `set_wait(WaitPolicy::spin(spin))`.
    pub fn set_spin(&mut self, spin: Duration) {
        self.ep.wait = WaitPolicy::spin(spin);
    }

    /// Sets how waits poll before sleeping (see [`WaitPolicy`]).
    pub fn set_wait(&mut self, wait: WaitPolicy) {
        self.ep.wait = wait;
    }

    /// How many waits so far went to sleep on the socket because their spin window passed empty.
    pub fn sleeps(&self) -> u64 {
        self.ep.sleeps
    }

    /// [`Client::arm`] for a server: `Ok(true)` sleep on its descriptor until readable, then
    /// [`serve_ready`](Self::serve_ready); `Ok(false)` something is waiting already.
    pub fn arm(&mut self) -> Result<bool, Error> {
        if !self.stash.is_empty() {
            return Ok(false);
        }
        self.ep.arm()
    }

    /// Sets how many receive buffers of what size to post (before `serve`).
    pub fn receive_buffers(&mut self, count: u32, size: u32) -> &mut Self {
        self.recv_count = count;
        self.recv_size = size;
        self
    }

    /// Submits, draining completions into the stash while the ring is full (never deadlocks on our own CQ).
    fn submit(&mut self, s: Sqe) -> Result<(), Error> {
        loop {
            match self.ep.submit(s) {
                Err(Error::RingFull) => match self
                    .ep
                    .wait(Some(Instant::now() + Duration::from_millis(10)))?
                {
                    Some(c) => self.stash.push_back(c),
                    None => continue,
                },
                r => return r,
            }
        }
    }

    fn next(&mut self) -> Result<Cqe, Error> {
        if let Some(c) = self.stash.pop_front() {
            return Ok(c);
        }
        loop {
            if let Some(c) = self.ep.wait(None)? {
                return Ok(c);
            }
        }
    }

    /// The next completion if there is one: the stash first, then the ring.
    fn try_next(&mut self) -> Result<Option<Cqe>, Error> {
        match self.stash.pop_front() {
            Some(c) => Ok(Some(c)),
            None => self.ep.poll(),
        }
    }

    fn post_recv(&mut self, off: u32, len: u32) -> Result<(), Error> {
        self.submit(Sqe {
            opcode: op::POST_RECV,
            user_data: u64::from(off) << 32 | u64::from(len),
            msg_off: off,
            msg_len: len,
            ..Sqe::default()
        })
    }

    /// Registers (`prog`, `vers`) (`backchannel`: as a callback program) and waits for the daemon's answer.
    pub fn register(&mut self, prog: u32, vers: u32, backchannel: bool) -> Result<(), Error> {
        self.submit(Sqe {
            opcode: op::REGISTER,
            flags: if backchannel { flag::BACKCHANNEL } else { 0 },
            user_data: u64::MAX,
            prog,
            vers,
            ..Sqe::default()
        })?;
        // The answer comes on the ring, after anything stashed already (calls of a program
        // registered before, replies' ends): read the ring, not the stash, and keep the rest.
        loop {
            let Some(c) = self.ep.wait(None)? else {
                continue;
            };
            if c.kind == op::REGISTER && c.user_data == u64::MAX {
                if c.status != status::OK {
                    return Err(Error::Status(c.status));
                }
                self.registered.push((prog, vers, backchannel));
                return Ok(());
            }
            self.stash.push_back(c);
        }
    }

    /// Registers (`prog`, `vers`) for forward calls unless already registered, and posts the receive buffers (once), without serving
    /// yet: calls that arrive before [`Server::serve`] wait in the completion ring.
    pub fn start(&mut self, prog: u32, vers: u32) -> Result<(), Error> {
        if !self.registered.iter().any(|r| r.0 == prog && r.1 == vers) {
            self.register(prog, vers, false)?;
        }
        while self.posted < self.recv_count {
            let b = self
                .ep
                .arena
                .alloc(self.recv_size)
                .ok_or(Error::ArenaFull)?;
            self.post_recv(b.off, b.len)?;
            // The buffer now belongs to the daemon; it comes back with each call and is reposted.
            self.posted += 1;
        }
        Ok(())
    }

    /// Serves (`prog`, `vers`) with `handler` until the daemon detaches this app (then `Err(Detached)`);
    /// registers the program first unless [`Server::register`] already did (to serve a callback program
    /// for backward-direction calls, call `register(prog, vers, true)` first).
    pub fn serve<F>(&mut self, prog: u32, vers: u32, handler: F) -> Result<(), Error>
    where
        F: FnMut(&Call<'_>, &mut ReplyBuilder),
    {
        self.serve_loop(prog, vers, u64::MAX, handler)
    }

    /// [`serve`](Self::serve) for `calls` calls, then returns once their replies are submitted
    /// (the server stays attached until dropped; dropping it right away is allowed: the
    /// daemon still sends the replies).
    pub fn serve_calls<F>(
        &mut self,
        prog: u32,
        vers: u32,
        calls: u64,
        handler: F,
    ) -> Result<(), Error>
    where
        F: FnMut(&Call<'_>, &mut ReplyBuilder),
    {
        self.serve_loop(prog, vers, calls, handler)
    }

    fn serve_loop<F>(
        &mut self,
        prog: u32,
        vers: u32,
        calls: u64,
        mut handler: F,
    ) -> Result<(), Error>
    where
        F: FnMut(&Call<'_>, &mut ReplyBuilder),
    {
        self.start(prog, vers)?;
        let mut served = 0u64;
        while served < calls {
            let c = self.next()?;
            // The last call's buffer is not posted again: the app is about to stop serving.
            if self.on_cqe(&c, served + 1 < calls, &mut handler)? {
                served += 1;
            }
        }
        Ok(())
    }

    /// Serves the calls that have arrived, without waiting (for an app's own event loop,
    /// with [`arm`](Self::arm)); returns how many. Call [`start`](Self::start) once first.
    pub fn serve_ready<F>(&mut self, mut handler: F) -> Result<u64, Error>
    where
        F: FnMut(&Call<'_>, &mut ReplyBuilder),
    {
        let mut served = 0u64;
        while let Some(c) = self.try_next()? {
            if self.on_cqe(&c, true, &mut handler)? {
                served += 1;
            }
        }
        Ok(served)
    }

    /// Waits for the next call and takes it, to be answered later with
    /// [`answer`](Self::answer) (see [`PendingCall`]). Call [`start`](Self::start) once first.
    pub fn next_call(&mut self) -> Result<PendingCall, Error> {
        loop {
            let c = self.next()?;
            if let Some(call) = self.take_and_repost(&c)? {
                return Ok(call);
            }
        }
    }

    /// [`next_call`](Self::next_call) without waiting (for an app's own event loop, with
    /// [`arm`](Self::arm)): `None` if no call has arrived.
    pub fn try_next_call(&mut self) -> Result<Option<PendingCall>, Error> {
        while let Some(c) = self.try_next()? {
            if let Some(call) = self.take_and_repost(&c)? {
                return Ok(Some(call));
            }
        }
        Ok(None)
    }

    /// Answers a call taken with [`next_call`](Self::next_call) or
    /// [`try_next_call`](Self::try_next_call).
    pub fn answer(&mut self, call: PendingCall, reply: &ReplyBuilder) -> Result<(), Error> {
        self.reply(call.handle, call.prog, call.vers, reply)
    }

    /// A call taken to be answered later: its buffer is posted again at once.
    fn take_and_repost(&mut self, c: &Cqe) -> Result<Option<PendingCall>, Error> {
        let Some((call, (off, len))) = self.take_call(c) else {
            return Ok(None);
        };
        self.post_recv(off, len)?;
        Ok(Some(call))
    }

    /// One completion of a serving app: a call (answered through `handler`, then its buffer
    /// posted again if `repost`; true) or a reply's end.
    fn on_cqe<F>(&mut self, c: &Cqe, repost: bool, handler: &mut F) -> Result<bool, Error>
    where
        F: FnMut(&Call<'_>, &mut ReplyBuilder),
    {
        let Some((call, (off, len))) = self.take_call(c) else {
            return Ok(false);
        };
        let mut rb = ReplyBuilder::default();
        handler(&call.call(), &mut rb);
        self.answer(call, &rb)?;
        if repost {
            self.post_recv(off, len)?;
        }
        Ok(true)
    }

    /// One completion of a serving app: a call, copied out of its receive buffer, with that
    /// buffer (offset, length) to post again; a reply's end frees the reply's buffers (`None`).
    fn take_call(&mut self, c: &Cqe) -> Option<(PendingCall, (u32, u32))> {
        match c.kind {
            op::POST_RECV if c.status == status::OK => {
                let buf_off = (c.user_data >> 32) as u32;
                let buf_len = c.user_data as u32;
                let call = PendingCall {
                    prog: c.prog,
                    vers: c.vers,
                    proc_: c.proc_,
                    xid: c.xid,
                    peer: c.peer,
                    args: self.ep.read(c.msg_off, c.msg_len.min(buf_len)),
                    auth: (c.auth_flavor == 1).then_some((c.auth_uid, c.auth_gid)),
                    handle: c.handle,
                };
                Some((call, (buf_off, buf_len)))
            }
            op::REPLY => {
                if let Some(bufs) = self
                    .replies
                    .get_mut(c.user_data as usize)
                    .and_then(Option::take)
                {
                    bufs.into_iter().for_each(|b| self.ep.arena.free(b));
                }
                None
            }
            _ => None,
        }
    }

    fn reply(&mut self, handle: u32, prog: u32, vers: u32, rb: &ReplyBuilder) -> Result<(), Error> {
        let ep = &mut self.ep;
        let mut bufs = Vec::new();
        let msg = ep
            .arena
            .alloc(rb.xdr.msg.len() as u32)
            .ok_or(Error::ArenaFull)?;
        ep.write(&msg, 0, &rb.xdr.msg);
        let (moff, mlen) = (msg.off, msg.len);
        bufs.push(msg);
        let mut table = 0;
        if !rb.xdr.pieces.is_empty() {
            let t = ep
                .arena
                .alloc(16 * rb.xdr.pieces.len() as u32)
                .ok_or(Error::ArenaFull)?;
            let mut recs = Vec::new();
            for (pos, d) in &rb.xdr.pieces {
                let b = ep.arena.alloc(d.len() as u32).ok_or(Error::ArenaFull)?;
                ep.write(&b, 0, d);
                recs.push(Piece {
                    off: b.off,
                    len: b.len,
                    xdr_pos: *pos,
                    used: 0,
                });
                bufs.push(b);
            }
            ep.write_pieces(&t, &recs);
            table = t.off;
            bufs.push(t);
        }
        let idx = match self.replies.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.replies.push(None);
                self.replies.len() - 1
            }
        };
        self.replies[idx] = Some(bufs);
        self.submit(Sqe {
            opcode: op::REPLY,
            n_args: rb.xdr.pieces.len() as u8,
            target: handle,
            user_data: idx as u64,
            prog,
            vers,
            proc_: rb.accept_stat,
            msg_off: moff,
            msg_len: mlen,
            pieces_off: table,
            ..Sqe::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_allocations_never_overlap_and_are_reused_after_free() {
        let mut a = Arena::new(1 << 16);
        let mut live: Vec<ArenaBuf> = (1..40).map(|i| a.alloc(i * 37).unwrap()).collect();
        let mut spans: Vec<(u32, u32)> =
            live.iter().map(|b| (b.off(), b.off() + b.len())).collect();
        spans.sort();
        assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0));
        assert!(live
            .iter()
            .all(|b| b.off() % 64 == 0 && b.off() + b.len() <= 1 << 16));
        let b = live.pop().unwrap();
        let off = b.off();
        a.free(b);
        assert_eq!(a.alloc(39 * 37).unwrap().off(), off);
        assert!(a.alloc(1 << 16).is_none());
        assert!(a.alloc(u32::MAX).is_none());
    }

    #[test]
    fn reduced_stream_with_pieces_reassembles_with_xdr_pad() {
        let mut x = XdrBuilder::default();
        x.put_u32(7).put_ddp_opaque(&[1, 2, 3, 4, 5]).put_u32(9);
        assert_eq!(x.msg.len(), 12);
        assert_eq!(x.pieces[0].0, 8);
        assert_eq!(
            x.to_full(),
            vec![0, 0, 0, 7, 0, 0, 0, 5, 1, 2, 3, 4, 5, 0, 0, 0, 0, 0, 0, 9]
        );
        // Positions beyond the stream are clamped rather than trusted.
        assert_eq!(
            reassemble(&[1, 2, 3, 4], [(400, &[9u8][..])].into_iter()),
            vec![1, 2, 3, 4, 9, 0, 0, 0]
        );
    }
}
