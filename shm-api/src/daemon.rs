//! Daemon side: the set of apps one poll thread owns, their validated submissions and their completions.
//!
//! A poll thread keeps one [`AppTable`]. The control thread accepts apps ([`crate::attach::Listener`]) and
//! hands each [`Attachment`] over; the poll thread calls [`AppTable::attach`], then loops:
//! [`AppTable::poll_submissions`] (each descriptor copied once, validated, turned into a [`Submission`] or
//! failed with a [`status`] code in a completion), the `complete_*`/[`AppTable::deliver_call`] calls as its
//! RPCs progress, [`AppTable::reap`] and [`AppTable::evict_stalled`] now and then, and [`AppTable::park`]
//! when idle. No method blocks on an app; only `attach`, `reap`, `evict_stalled`, `detach` and `park`
//! allocate or make system calls.
//!
//! ```no_run
//! use rpcrdma_shm::daemon::{AppTable, CallOutcome, Submission, TableConfig};
//! use rpcrdma_shm::abi::status;
//! # fn main() -> std::io::Result<()> {
//! let mut table = AppTable::new(TableConfig::default())?;
//! let mut subs = Vec::with_capacity(256); // reused: the loop itself never allocates
//! loop {
//!     subs.clear();
//!     table.poll_submissions(&mut subs, 32);
//!     for (app, sub) in subs.drain(..) {
//!         match sub {
//!             // Gather `c.msg` and `c.args` from `table.region(app)` and send them; when the reply has been
//!             // placed in `c.reply` / `c.results`, call `complete_call` with its length and results.
//!             Submission::Call(id) => {
//!                 let _ = (app, table.call_request(id).map(|c| c.peer));
//!                 table.complete_call(id, CallOutcome { status: status::TRANSPORT, ..Default::default() });
//!             }
//!             // Send the reply to the requester identified by its `tag`, then `complete_reply`.
//!             Submission::Reply(id) => {
//!                 let _ = table.reply_request(id).map(|r| r.tag);
//!                 table.complete_reply(id, status::OK);
//!             }
//!             // Tell the app once calls for the program reach it (at once, with one thread).
//!             Submission::Registered { ack, .. } => table.acknowledge(app, ack),
//!             Submission::Unregistered { .. } => {}
//!             // The app is closing: detach it now, as `reap` would once its socket closed.
//!             Submission::Detach => {
//!                 if let Some(gone) = table.detach(app, "closed") {
//!                     let _ = gone.calls; // as below
//!                 }
//!             }
//!             // The app gave up on call `id`: fence what the peer may reach, then complete it.
//!             Submission::Cancel(id) => {
//!                 table.complete_call(id, CallOutcome { status: status::CANCELLED, ..Default::default() });
//!             }
//!         }
//!     }
//!     // Calls past their time limit (`timeout_ms`): the same, with TIMEOUT.
//!     let mut late = Vec::new();
//!     table.expired(std::time::Instant::now(), &mut late);
//!     for id in late {
//!         table.complete_call(id, CallOutcome { status: status::TIMEOUT, ..Default::default() });
//!     }
//!     for gone in table.reap() {
//!         let _ = gone.calls; // cancel these RPCs; answer `gone.serving_tags` with errors
//!     }
//! #   break;
//! }
//! # Ok(())
//! # }
//! ```

use crate::abi::{
    cqe_flag, flag, op, status, ArenaRange, Cqe, Piece, Sqe, MAX_PIECES, STATE_DETACHED,
};
use crate::attach::{drain, wake, Attachment};
use crate::region::Region;
use crate::ring::{Consumer, Producer, RingError};
use crate::sync::{fence, Ordering};
use rustix::event::{PollFd, PollFlags};
use rustix::fd::{AsFd, AsRawFd, BorrowedFd};
use std::collections::VecDeque;
use std::io;
use std::time::{Duration, Instant};

/// Limits of one poll thread's table.
#[derive(Debug, Clone, Copy)]
pub struct TableConfig {
    /// Most apps attached at once.
    pub max_apps: u16,
    /// Most operations (calls, receive buffers, calls being served) one app may have in flight.
    pub max_ops_per_app: u16,
    /// Number of configured peers (a CALL's target must be below it).
    pub peers: u32,
    /// XIDs the table assigns: `xid_first`, then steps of `xid_step` (tables of several
    /// poll threads sharing a connection use the same step and different firsts, so their
    /// XIDs never meet).
    pub xid_first: u32,
    /// See `xid_first` (at least 1).
    pub xid_step: u32,
}

impl Default for TableConfig {
    fn default() -> Self {
        TableConfig {
            max_apps: 64,
            max_ops_per_app: 512,
            peers: 1,
            xid_first: 0x5348_0000,
            xid_step: 1,
        }
    }
}

/// An attached app (slot + generation: a stale id never reaches a newer app in the same slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AppId {
    slot: u16,
    gen: u16,
}

/// One in-flight operation of one app (a call, a receive buffer, a call being served, a reply being sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpId {
    app: AppId,
    slot: u16,
    gen: u16,
}

impl OpId {
    /// The owning app.
    pub fn app(&self) -> AppId {
        self.app
    }

    /// Packs the id into a `u64` (e.g. to carry it as a tag through another app's call).
    pub fn to_u64(self) -> u64 {
        (u64::from(self.app.slot) << 48)
            | (u64::from(self.app.gen) << 32)
            | (u64::from(self.slot) << 16)
            | u64::from(self.gen)
    }

    /// Unpacks [`OpId::to_u64`]; a stale or forged value is simply not found later.
    pub fn from_u64(v: u64) -> OpId {
        OpId {
            app: AppId {
                slot: (v >> 48) as u16,
                gen: (v >> 32) as u16,
            },
            slot: (v >> 16) as u16,
            gen: v as u16,
        }
    }

    fn handle(self) -> u32 {
        (u32::from(self.slot) << 16) | u32::from(self.gen)
    }
}

/// Up to [`MAX_PIECES`] validated piece records, copied out of the arena.
#[derive(Debug, Clone, Copy, Default)]
pub struct PieceList {
    n: u8,
    items: [Piece; MAX_PIECES],
}

impl PieceList {
    /// The pieces.
    pub fn as_slice(&self) -> &[Piece] {
        &self.items[..usize::from(self.n)]
    }
}

/// A validated CALL: every range lies in the caller's arena, pieces are ordered and 4-aligned.
#[derive(Debug, Clone, Copy)]
pub struct CallRequest {
    /// Handle for [`AppTable::complete_call`].
    pub id: OpId,
    /// Peer index (below [`TableConfig::peers`]).
    pub peer: u32,
    /// Program.
    pub prog: u32,
    /// Version.
    pub vers: u32,
    /// Procedure.
    pub proc_: u32,
    /// The XID to use (the app's, or one the table assigned).
    pub xid: u32,
    /// Reduced argument XDR.
    pub msg: ArenaRange,
    /// DDP-eligible argument pieces (inserted at their `xdr_pos` of `msg`).
    pub args: PieceList,
    /// Buffers for DDP-eligible results, in result order.
    pub results: PieceList,
    /// Buffer for the reduced reply (its length is the maximum reply size).
    pub reply: ArenaRange,
    /// The AUTH_SYS credential to send (uid, gid), or `None` for AUTH_NONE.
    pub auth: Option<(u32, u32)>,
    pieces_off: u32,
    user_data: u64,
}

/// A validated REPLY to a call this app was serving.
#[derive(Debug, Clone, Copy)]
pub struct ReplyRequest {
    /// Handle for [`AppTable::complete_reply`].
    pub id: OpId,
    /// The tag given to [`AppTable::deliver_call`].
    pub tag: u64,
    /// accept_stat (0 = SUCCESS).
    pub accept_stat: u32,
    /// The call's XID.
    pub xid: u32,
    /// Reduced result XDR.
    pub msg: ArenaRange,
    /// DDP-eligible results (inserted at their `xdr_pos` of `msg`).
    pub results: PieceList,
}

/// What an app asked for, after validation.
#[derive(Debug, Clone, Copy)]
pub enum Submission {
    /// Send a call to a peer: the validated request is [`AppTable::call_request`]`(id)`, kept
    /// in the table (not copied here: it is 328 bytes, and this value is moved several times).
    Call(OpId),
    /// Send a reply to a call delivered earlier: the validated reply is
    /// [`AppTable::reply_request`]`(id)`, kept in the table like a call's request.
    Reply(OpId),
    /// The app now serves (`prog`, `vers`) (already recorded for [`AppTable::lookup`]). The
    /// app is not told yet: [`AppTable::acknowledge`]`(app, ack)` tells it, once whoever routes
    /// calls to it knows (a daemon with several poll threads announces the program to the
    /// others first, or a call the app's peer sends at once could find no server).
    Registered {
        /// Program.
        prog: u32,
        /// Version.
        vers: u32,
        /// A callback program for backward-direction calls.
        backchannel: bool,
        /// The app's completion, for [`AppTable::acknowledge`].
        ack: RegisterAck,
    },
    /// The app stopped serving (`prog`, `vers`).
    Unregistered {
        /// Program.
        prog: u32,
        /// Version.
        vers: u32,
    },
    /// The app is closing ([`op::DETACH`]): detach it now ([`AppTable::detach`]). Nothing of
    /// this app's is taken after it.
    Detach,
    /// The app cancelled its call `id` ([`op::CANCEL`]), still in flight when the table took
    /// the request: end it with `CANCELLED`, lent if the peer may still reach its memory (or
    /// let its reply, if that wins the race, complete it).
    Cancel(OpId),
}

/// A registration's completion, held back until [`AppTable::acknowledge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisterAck {
    user_data: u64,
    prog: u32,
    vers: u32,
}

/// How a call ended, for [`AppTable::complete_call`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CallOutcome<'a> {
    /// [`status`] code.
    pub status: u32,
    /// accept_stat of the reply.
    pub rpc_stat: u32,
    /// Bytes written at the start of the reply buffer.
    pub reply_len: u32,
    /// (xdr_pos, used) for each result buffer the reply filled, in order.
    pub results: &'a [(u32, u32)],
    /// Cancelled (or timed out) while the peer may still reach the call's memory: the
    /// completion carries [`cqe_flag::LENT`], and the call stays the app's in flight until
    /// [`AppTable::release_call`].
    pub lent: bool,
}

/// An incoming call for a serving app, for [`AppTable::deliver_call`].
#[derive(Debug, Clone, Copy)]
pub struct IncomingCall {
    /// Calling peer's index.
    pub peer: u32,
    /// Program.
    pub prog: u32,
    /// Version.
    pub vers: u32,
    /// Procedure.
    pub proc_: u32,
    /// XID.
    pub xid: u32,
    /// Bytes of argument XDR already placed at the start of the receive buffer.
    pub args_len: u32,
    /// The caller's AUTH_SYS identity (uid, gid), `None` for AUTH_NONE.
    pub auth: Option<(u32, u32)>,
    /// The caller's token, returned in the [`ReplyRequest`].
    pub tag: u64,
}

/// A receive buffer taken from a serving app ([`AppTable::take_recv`]); fill it, then deliver or put it back.
#[derive(Debug)]
pub struct RecvBuf {
    id: OpId,
    /// Where the arguments go in the serving app's arena.
    pub buf: ArenaRange,
}

impl RecvBuf {
    /// The app whose buffer this is.
    pub fn app(&self) -> AppId {
        self.id.app
    }
}

/// What was left when an app went away; the dataplane cancels these RPCs.
#[derive(Debug)]
pub struct Detached {
    /// The app.
    pub app: AppId,
    /// Its pid, if known.
    pub pid: Option<i32>,
    /// Why: "closed" (socket gone), "corrupt ring", or "detached".
    pub reason: &'static str,
    /// Its calls still in flight (their completions will be dropped).
    pub calls: Vec<OpId>,
    /// Tags of calls it was serving (answer their callers with an error).
    pub serving_tags: Vec<u64>,
}

/// What one attached app has done, for operators (`rpcrdmactl apps`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AppCounters {
    /// Calls it submitted that passed validation.
    pub calls: u64,
    /// Of those, calls that ended (a reply, or an error completion).
    pub calls_done: u64,
    /// Calls delivered to it to serve.
    pub served: u64,
    /// Replies it submitted that passed validation.
    pub replies: u64,
    /// Its submissions refused by validation.
    pub bad: u64,
    /// Its CANCEL requests that named a call in flight.
    pub cancels: u64,
    /// Its calls that reached their time limit (reported by [`AppTable::expired`]).
    pub timeouts: u64,
}

/// How many of an app's registrations [`AppInfo`] lists.
pub const INFO_PROGRAMS: usize = 8;

/// One attached app, as [`AppTable::app_info`] describes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AppInfo {
    /// The app's slot in its table (with the generation: ids of apps that left are not reused
    /// for a while).
    pub slot: u16,
    /// See `slot`.
    pub gen: u16,
    /// Its pid (SO_PEERCRED), if the kernel reported one.
    pub pid: Option<i32>,
    /// Its operations in flight (calls, posted receive buffers, calls being served, replies).
    pub ops: usize,
    /// Of those, calls that ended cancelled or timed out whose memory the peer may still
    /// reach ([`cqe_flag::LENT`]; the app is owed their [`op::RELEASED`]).
    pub lent: usize,
    /// Its counters.
    pub counters: AppCounters,
    /// Its registrations (program, version, callback program), the first `n_programs`.
    pub programs: [(u32, u32, bool); INFO_PROGRAMS],
    /// Valid entries of `programs` (it may have more registrations than are listed).
    pub n_programs: u8,
}

/// Counters for tests and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Apps attached.
    pub apps: usize,
    /// Operations in flight, all apps.
    pub ops: usize,
    /// Completions waiting for room in completion rings.
    pub backlog: usize,
    /// Submissions failed by validation.
    pub bad_submissions: u64,
    /// Completions dropped because their app had gone.
    pub stale_completions: u64,
    /// Apps detached because they corrupted a ring.
    pub faults: u64,
    /// Apps detached in total.
    pub detached: u64,
}

// Ops live in a slab allocated at attach; boxing the large variant would allocate on the hot path.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy)]
enum OpState {
    Free,
    Call(CallRequest),
    /// A call that completed [`cqe_flag::LENT`]: its [`op::RELEASED`] is owed.
    Lent {
        user_data: u64,
        xid: u32,
    },
    Recv {
        user_data: u64,
        buf: ArenaRange,
    },
    Filling {
        user_data: u64,
        buf: ArenaRange,
    },
    Serving {
        tag: u64,
        prog: u32,
        vers: u32,
        proc_: u32,
        xid: u32,
    },
    Replying {
        user_data: u64,
        prog: u32,
        vers: u32,
        proc_: u32,
        /// The validated reply ([`AppTable::reply_request`]).
        req: ReplyRequest,
    },
}

#[derive(Debug)]
struct Op {
    gen: u16,
    state: OpState,
}

#[derive(Debug)]
struct App {
    id: AppId,
    att: Attachment,
    sq: Consumer<Sqe>,
    cq: Producer<Cqe>,
    ops: Vec<Op>,
    /// By op slot: a call's time limit, or that it was cancelled. Beside the slab, not in
    /// it: every op would carry it, and a larger op costs each call a copy.
    timing: Vec<Timing>,
    free: Vec<u16>,
    recvs: VecDeque<u16>,
    backlog: VecDeque<Cqe>,
    pending: u32,
    max_owed: u32,
    fault: Option<&'static str>,
    /// When the backlog last went from empty to non-empty (the app stopped draining its CQ).
    stalled_since: Option<Instant>,
    /// When its socket was first found closed with submissions still on its ring (see
    /// [`AppTable::reap`]).
    closed_at: Option<Instant>,
    counters: AppCounters,
}

#[derive(Debug, Clone, Copy)]
struct Registration {
    app: AppId,
    prog: u32,
    vers: u32,
    backchannel: bool,
}

/// How long an app whose socket closed keeps its attachment while its ring still holds
/// submissions (see [`AppTable::reap`]): many poll-thread turns, and short enough that a
/// process that closed its socket but goes on submitting does not stay attached.
pub const CLOSE_GRACE: Duration = Duration::from_millis(100);

/// The apps one poll thread owns.
#[derive(Debug)]
pub struct AppTable {
    cfg: TableConfig,
    apps: Vec<Option<App>>,
    gens: Vec<u16>,
    registry: Vec<Registration>,
    next_xid: u32,
    stats: TableStats,
    /// See [`AppTable::recv_epoch`].
    recv_epoch: u64,
    /// One look at the apps' sockets ([`AppTable::poll_sockets`]), kept between looks so that
    /// neither `reap` nor `park` allocates.
    polled: Polled,
    /// The earliest deadline of a call in flight, or later (see [`AppTable::expired`]).
    next_deadline: Option<Instant>,
}

/// What an op's call has of time limits and cancellation ([`App::timing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timing {
    /// No limit, not cancelled (and every op that is not a call).
    Open,
    /// Ends with `TIMEOUT` at this instant if still in flight.
    Until(Instant),
    /// Cancelled (by the app, or by its time limit): not again.
    Cancelled,
}

/// CANCELs taken from one app per poll of the submissions: each looks through the app's
/// slab, and a CANCEL has no completion to hold it back, so an app that floods its ring with
/// them only slows its own submissions.
pub const CANCELS_PER_POLL: usize = 4;

/// The time as one poll of the submissions sees it, read at most once, and the table's
/// earliest deadline, which a call's time limit may bring forward.
struct Clock<'a> {
    now: Option<Instant>,
    next: &'a mut Option<Instant>,
}

impl Clock<'_> {
    fn now(&mut self) -> Instant {
        *self.now.get_or_insert_with(Instant::now)
    }
}

/// The descriptors of one `poll(2)` of the apps' sockets, and what it found.
#[derive(Debug, Default)]
struct Polled {
    /// Empty between looks: its descriptors are borrowed for one look only.
    fds: Vec<PollFd<'static>>,
    /// The app slot of each socket polled, with what `poll` said of it.
    seen: Vec<(usize, PollFlags)>,
}

fn err_cqe(s: &Sqe, code: u32) -> Cqe {
    Cqe {
        kind: s.opcode,
        status: code,
        user_data: s.user_data,
        prog: s.prog,
        vers: s.vers,
        proc_: s.proc_,
        xid: s.xid,
        ..Cqe::default()
    }
}

impl App {
    fn region(&self) -> &Region {
        &self.att.region
    }

    /// Queues a completion: into the ring if there is room, else into the bounded backlog.
    fn push(&mut self, c: Cqe) {
        self.pending = self.pending.saturating_sub(1);
        if self.backlog.is_empty() {
            match self.cq.push(c) {
                Ok(()) => {
                    self.wake();
                    return;
                }
                Err(RingError::Corrupt) => self.fault = Some("corrupt ring"),
                Err(RingError::Full) => {}
            }
        }
        // Bounded: pending + backlog never exceeds max_owed (see `poll_submissions`) plus the
        // calls that completed lent (each owes a second completion), so this never reallocates.
        if self.backlog.is_empty() {
            self.stalled_since = Some(Instant::now());
        }
        self.backlog.push_back(c);
    }

    fn flush_backlog(&mut self) {
        let mut pushed = false;
        while let Some(c) = self.backlog.front().copied() {
            match self.cq.push(c) {
                Ok(()) => {
                    self.backlog.pop_front();
                    pushed = true;
                }
                Err(RingError::Full) => break,
                Err(RingError::Corrupt) => {
                    self.fault = Some("corrupt ring");
                    break;
                }
            }
        }
        if pushed {
            self.wake();
        }
        if self.backlog.is_empty() {
            self.stalled_since = None;
        }
    }

    /// Wakes the app if it sleeps (Dekker pair with the app's store of `app_waiting` then load of the CQ tail).
    fn wake(&self) {
        // SYNC POINT: SeqCst fence between our Release store of the CQ tail and this load; pairs with the app's
        // fence between its store of `app_waiting` and its load of the CQ tail (`Endpoint::wait`).
        fence(Ordering::SeqCst);
        if self
            .region()
            .header()
            .app_waiting
            .value
            .load(Ordering::Relaxed)
            != 0
        {
            wake(self.att.sock.as_fd());
        }
    }

    // Always inlined: a call's state is built in the slab, not built and then copied (about
    // 350 bytes, a `memcpy` per call when this was a call).
    #[inline(always)]
    fn alloc_op(&mut self, state: OpState) -> Option<OpId> {
        let slot = self.free.pop()?;
        let op = self.ops.get_mut(usize::from(slot))?;
        op.gen = op.gen.wrapping_add(1);
        op.state = state;
        Some(OpId {
            app: self.id,
            slot,
            gen: op.gen,
        })
    }

    fn op_mut(&mut self, id: OpId) -> Option<&mut Op> {
        let op = self.ops.get_mut(usize::from(id.slot))?;
        (op.gen == id.gen && !matches!(op.state, OpState::Free)).then_some(op)
    }

    fn free_op(&mut self, id: OpId) {
        if let Some(op) = self.op_mut(id) {
            op.state = OpState::Free;
            self.free.push(id.slot);
            if let Some(t) = self.timing.get_mut(usize::from(id.slot)) {
                *t = Timing::Open;
            }
        }
    }

    /// The call in flight that the app submitted with `user_data`, not cancelled yet, now
    /// cancelled (and so not timed out as well). The app's own calls only; at most its slab
    /// to look through (the table's bound on ops per app; [`CANCELS_PER_POLL`] bounds the
    /// looks per poll). Kept out of `validate`, which every submission runs.
    #[inline(never)]
    fn cancel(&mut self, user_data: u64) -> Option<OpId> {
        let slot = self.ops.iter().zip(&self.timing).position(|(op, t)| {
            *t != Timing::Cancelled
                && matches!(&op.state, OpState::Call(c) if c.user_data == user_data)
        })?;
        if let Some(t) = self.timing.get_mut(slot) {
            *t = Timing::Cancelled;
        }
        Some(OpId {
            app: self.id,
            slot: slot as u16,
            gen: self.ops[slot].gen,
        })
    }

    fn ops_in_use(&self) -> usize {
        self.ops.len() - self.free.len()
    }

    /// Validates `n` pieces starting at record `first` of the table at `off`; positions are checked against
    /// `msg_len` when `positions` is set.
    #[inline]
    fn read_pieces(
        &self,
        off: u32,
        first: u32,
        n: u8,
        msg_len: Option<u32>,
    ) -> Result<PieceList, u32> {
        let mut list = PieceList::default();
        if usize::from(n) > MAX_PIECES {
            return Err(status::BAD_PIECES);
        }
        if n > 0 && off % 4 != 0 {
            return Err(status::BAD_RANGE);
        }
        let mut last_pos = 0u32;
        let mut total = msg_len.unwrap_or(0);
        for i in 0..u32::from(n) {
            let idx = first.checked_add(i).ok_or(status::BAD_RANGE)?;
            let mut p = self
                .region()
                .read_piece(off, idx)
                .ok_or(status::BAD_RANGE)?;
            self.region().range(p.off, p.len).ok_or(status::BAD_RANGE)?;
            if let Some(ml) = msg_len {
                if p.xdr_pos % 4 != 0 || p.xdr_pos > ml || p.xdr_pos < last_pos {
                    return Err(status::BAD_PIECES);
                }
                last_pos = p.xdr_pos;
                let padded = crate::abi::xdr_pad(p.len).ok_or(status::BAD_PIECES)?;
                total = total.checked_add(padded).ok_or(status::BAD_PIECES)?;
            } else {
                p.xdr_pos = 0;
            }
            p.used = 0;
            list.items[i as usize] = p;
            list.n += 1;
        }
        Ok(list)
    }
}

impl AppTable {
    /// An empty table.
    pub fn new(cfg: TableConfig) -> io::Result<AppTable> {
        Ok(AppTable {
            cfg,
            apps: (0..cfg.max_apps).map(|_| None).collect(),
            gens: vec![0; usize::from(cfg.max_apps)],
            registry: Vec::new(),
            next_xid: cfg.xid_first.wrapping_sub(cfg.xid_step.max(1)),
            stats: TableStats::default(),
            recv_epoch: 0,
            next_deadline: None,
            polled: Polled {
                fds: Vec::with_capacity(usize::from(cfg.max_apps) + 4),
                seen: Vec::with_capacity(usize::from(cfg.max_apps)),
            },
        })
    }

    /// Takes ownership of an accepted app; gives it back when the table is full.
    pub fn attach(&mut self, att: Attachment) -> Result<AppId, Attachment> {
        let Some(slot) = self.apps.iter().position(Option::is_none) else {
            return Err(att);
        };
        let gen = self.gens[slot].wrapping_add(1);
        self.gens[slot] = gen;
        let id = AppId {
            slot: slot as u16,
            gen,
        };
        // SAFETY: this table is the only daemon-side user of the region: one SQ consumer and one CQ producer,
        // stored next to the region they point into (the mapping does not move), so they never outlive it.
        let (sq, cq) = unsafe { (att.region.sq_consumer(), att.region.cq_producer()) };
        let max_owed = att.region.layout().geometry.cq_entries;
        let n = self.cfg.max_ops_per_app;
        self.apps[slot] = Some(App {
            id,
            att,
            sq,
            cq,
            ops: (0..n)
                .map(|_| Op {
                    gen: 0,
                    state: OpState::Free,
                })
                .collect(),
            timing: vec![Timing::Open; usize::from(n)],
            free: (0..n).rev().collect(),
            recvs: VecDeque::with_capacity(usize::from(n)),
            // Each accepted submission owes one completion; a call that completes lent owes
            // one more (its RELEASED), at most one per op.
            backlog: VecDeque::with_capacity(max_owed as usize + usize::from(n)),
            pending: 0,
            max_owed,
            fault: None,
            stalled_since: None,
            closed_at: None,
            counters: AppCounters::default(),
        });
        self.stats.apps += 1;
        Ok(id)
    }

    fn app(&self, id: AppId) -> Option<&App> {
        self.apps
            .get(usize::from(id.slot))?
            .as_ref()
            .filter(|a| a.id == id)
    }

    fn app_mut(&mut self, id: AppId) -> Option<&mut App> {
        self.apps
            .get_mut(usize::from(id.slot))?
            .as_mut()
            .filter(|a| a.id == id)
    }

    /// The shared region of an attached app (to gather from / place into its arena, or to register it).
    pub fn region(&self, id: AppId) -> Option<&Region> {
        self.app(id).map(App::region)
    }

    /// Ids of all attached apps.
    /// What operators see of app `id` (`None` once it has gone).
    pub fn app_info(&self, id: AppId) -> Option<AppInfo> {
        let app = self.app(id)?;
        let mut info = AppInfo {
            slot: id.slot,
            gen: id.gen,
            pid: app.att.pid,
            ops: app.ops_in_use(),
            lent: app
                .ops
                .iter()
                .filter(|o| matches!(o.state, OpState::Lent { .. }))
                .count(),
            counters: app.counters,
            ..AppInfo::default()
        };
        for (dst, r) in info
            .programs
            .iter_mut()
            .zip(self.registry.iter().filter(|r| r.app == id))
        {
            *dst = (r.prog, r.vers, r.backchannel);
            info.n_programs += 1;
        }
        Some(info)
    }

    pub fn app_ids(&self) -> impl Iterator<Item = AppId> + '_ {
        self.apps.iter().flatten().map(|a| a.id)
    }

    /// The app serving (`prog`, `vers`) in the forward direction, if any.
    pub fn lookup(&self, prog: u32, vers: u32) -> Option<AppId> {
        self.registry
            .iter()
            .find(|r| r.prog == prog && r.vers == vers && !r.backchannel)
            .map(|r| r.app)
    }

    /// The app that registered the callback program (`prog`, `vers`), if any.
    pub fn lookup_backchannel(&self, prog: u32, vers: u32) -> Option<AppId> {
        self.registry
            .iter()
            .find(|r| r.prog == prog && r.vers == vers && r.backchannel)
            .map(|r| r.app)
    }

    /// A call still in flight (to route it or to place its reply); `None` once completed or cancelled.
    pub fn call_request(&self, id: OpId) -> Option<&CallRequest> {
        match self.op_state(id)? {
            OpState::Call(c) => Some(c),
            _ => None,
        }
    }

    /// A reply being sent (to route it); `None` once completed or cancelled.
    pub fn reply_request(&self, id: OpId) -> Option<&ReplyRequest> {
        match self.op_state(id)? {
            OpState::Replying { req, .. } => Some(req),
            _ => None,
        }
    }

    /// The state of op `id`, if the id is current (not a slot's earlier op).
    fn op_state(&self, id: OpId) -> Option<&OpState> {
        let op = self.app(id.app)?.ops.get(usize::from(id.slot))?;
        (op.gen == id.gen).then_some(&op.state)
    }

    /// Pops up to `budget` submissions per app, validates each and appends the good ones to `out`
    /// (reuse `out` across calls: it then never allocates). Bad ones complete with an error code here.
    pub fn poll_submissions(&mut self, out: &mut Vec<(AppId, Submission)>, budget: usize) {
        // The clock is read only for a call with a time limit, once per poll.
        let mut clock = Clock {
            now: None,
            next: &mut self.next_deadline,
        };
        for slot in 0..self.apps.len() {
            let Some(app) = self.apps[slot].as_mut() else {
                continue;
            };
            if app.fault.is_some() {
                continue;
            }
            app.flush_backlog();
            let mut cancels = 0;
            for _ in 0..budget {
                // Backpressure: accept a submission only if its completion is sure to find room.
                if app.pending as usize + app.backlog.len() >= app.max_owed as usize {
                    break;
                }
                let sqe = match app.sq.pop() {
                    Ok(Some(s)) => s,
                    Ok(None) => break,
                    Err(_) => {
                        app.fault = Some("corrupt ring");
                        break;
                    }
                };
                app.pending += 1;
                if sqe.opcode == op::CANCEL {
                    cancels += 1;
                }
                if matches!(sqe.opcode, op::POST_RECV | op::UNREGISTER) {
                    // A call held for want of a buffer (or of a server) may go now.
                    self.recv_epoch = self.recv_epoch.wrapping_add(1);
                }
                match Self::validate(
                    app,
                    &mut self.registry,
                    (&mut self.next_xid, self.cfg.xid_step.max(1)),
                    self.cfg.peers,
                    &sqe,
                    &mut clock,
                ) {
                    Ok(Some(Submission::Detach)) => {
                        out.push((app.id, Submission::Detach));
                        break;
                    }
                    Ok(Some(sub)) => {
                        match sub {
                            Submission::Call(_) => app.counters.calls += 1,
                            Submission::Cancel(_) => app.counters.cancels += 1,
                            Submission::Reply(_) => app.counters.replies += 1,
                            _ => {}
                        }
                        out.push((app.id, sub));
                    }
                    Ok(None) => {}
                    Err(code) => {
                        self.stats.bad_submissions += 1;
                        app.counters.bad += 1;
                        app.push(err_cqe(&sqe, code));
                    }
                }
                if cancels == CANCELS_PER_POLL {
                    break;
                }
            }
        }
    }

    /// Turns one copied descriptor into a submission, or an error code; never trusts it twice.
    fn validate(
        app: &mut App,
        registry: &mut Vec<Registration>,
        (next_xid, xid_step): (&mut u32, u32),
        peers: u32,
        s: &Sqe,
        clock: &mut Clock<'_>,
    ) -> Result<Option<Submission>, u32> {
        let auth_sys = s.flags & flag::AUTH_SYS != 0;
        if s.flags & !flag::ALL != 0
            || (auth_sys && s.opcode != op::CALL)
            || (!auth_sys && (s.auth_uid, s.auth_gid) != (0, 0))
        {
            return Err(status::BAD_FLAGS);
        }
        if s.timeout_ms != 0 && s.opcode != op::CALL {
            return Err(status::BAD_FLAGS);
        }
        match s.opcode {
            op::CALL => {
                if s.target >= peers {
                    return Err(status::UNKNOWN_PEER);
                }
                let msg = app
                    .region()
                    .range(s.msg_off, s.msg_len)
                    .ok_or(status::BAD_RANGE)?;
                let reply = app
                    .region()
                    .range(s.reply_off, s.reply_len)
                    .ok_or(status::BAD_RANGE)?;
                let args = app.read_pieces(s.pieces_off, 0, s.n_args, Some(s.msg_len))?;
                let results =
                    app.read_pieces(s.pieces_off, u32::from(s.n_args), s.n_results, None)?;
                // An app speaks for itself: only root may name another identity.
                let auth = auth_sys.then_some((s.auth_uid, s.auth_gid));
                if auth.is_some_and(|id| app.att.ids.is_none_or(|own| own.0 != 0 && own != id)) {
                    return Err(status::AUTH_DENIED);
                }
                let xid = if s.flags & flag::XID_APP != 0 {
                    s.xid
                } else {
                    *next_xid = next_xid.wrapping_add(xid_step);
                    *next_xid
                };
                let req = CallRequest {
                    id: OpId {
                        app: app.id,
                        slot: 0,
                        gen: 0,
                    },
                    peer: s.target,
                    prog: s.prog,
                    vers: s.vers,
                    proc_: s.proc_,
                    xid,
                    msg,
                    args,
                    results,
                    reply,
                    auth,
                    pieces_off: s.pieces_off,
                    user_data: s.user_data,
                };
                let id = app.alloc_op(OpState::Call(req)).ok_or(status::TOO_MANY)?;
                if let Some(Op {
                    state: OpState::Call(c),
                    ..
                }) = app.op_mut(id)
                {
                    c.id = id;
                }
                if s.timeout_ms != 0 {
                    let d = clock.now() + Duration::from_millis(u64::from(s.timeout_ms));
                    if let Some(t) = app.timing.get_mut(usize::from(id.slot)) {
                        *t = Timing::Until(d);
                    }
                    *clock.next = Some(clock.next.map_or(d, |n| n.min(d)));
                }
                Ok(Some(Submission::Call(id)))
            }
            op::DETACH => Ok(Some(Submission::Detach)),
            op::CANCEL => {
                if s.flags != 0 {
                    return Err(status::BAD_FLAGS);
                }
                // It has no completion of its own.
                app.pending = app.pending.saturating_sub(1);
                Ok(app.cancel(s.user_data).map(Submission::Cancel))
            }
            op::POST_RECV => {
                let buf = app
                    .region()
                    .range(s.msg_off, s.msg_len)
                    .ok_or(status::BAD_RANGE)?;
                let id = app
                    .alloc_op(OpState::Recv {
                        user_data: s.user_data,
                        buf,
                    })
                    .ok_or(status::TOO_MANY)?;
                app.recvs.push_back(id.slot);
                Ok(None)
            }
            op::REPLY => {
                let id = OpId {
                    app: app.id,
                    slot: (s.target >> 16) as u16,
                    gen: s.target as u16,
                };
                let msg = app
                    .region()
                    .range(s.msg_off, s.msg_len)
                    .ok_or(status::BAD_RANGE)?;
                let results = app.read_pieces(s.pieces_off, 0, s.n_args, Some(s.msg_len))?;
                let op = app.op_mut(id).ok_or(status::BAD_HANDLE)?;
                let OpState::Serving {
                    tag,
                    prog,
                    vers,
                    proc_,
                    xid,
                } = op.state
                else {
                    return Err(status::BAD_HANDLE);
                };
                op.state = OpState::Replying {
                    user_data: s.user_data,
                    prog,
                    vers,
                    proc_,
                    req: ReplyRequest {
                        id,
                        tag,
                        accept_stat: s.proc_,
                        xid,
                        msg,
                        results,
                    },
                };
                Ok(Some(Submission::Reply(id)))
            }
            op::REGISTER | op::UNREGISTER => {
                let backchannel = s.flags & flag::BACKCHANNEL != 0;
                let pos = registry.iter().position(|r| {
                    r.prog == s.prog && r.vers == s.vers && r.backchannel == backchannel
                });
                if s.opcode == op::REGISTER {
                    if pos.is_some() {
                        return Err(status::ALREADY_REGISTERED);
                    }
                    registry.push(Registration {
                        app: app.id,
                        prog: s.prog,
                        vers: s.vers,
                        backchannel,
                    });
                    // Not acknowledged here: the caller does (`acknowledge`) once calls for the
                    // program can be routed to the app.
                    return Ok(Some(Submission::Registered {
                        prog: s.prog,
                        vers: s.vers,
                        backchannel,
                        ack: RegisterAck {
                            user_data: s.user_data,
                            prog: s.prog,
                            vers: s.vers,
                        },
                    }));
                }
                match pos {
                    Some(p) if registry[p].app == app.id => {
                        registry.swap_remove(p);
                    }
                    _ => return Err(status::NOT_REGISTERED),
                }
                app.push(err_cqe(s, status::OK));
                Ok(Some(Submission::Unregistered {
                    prog: s.prog,
                    vers: s.vers,
                }))
            }
            _ => Err(status::BAD_OPCODE),
        }
    }

    /// The earliest time limit of a call in flight, if any (it may be one that has ended: then
    /// [`AppTable::expired`] finds nothing and moves it on).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.next_deadline
    }

    /// Appends to `out` the calls whose time limit has passed at `now`, each once (their
    /// deadline is cleared): the caller cancels them and ends them with `TIMEOUT`. Cheap while
    /// the earliest deadline is ahead; otherwise one look through the apps' slabs, which also
    /// finds the next earliest.
    pub fn expired(&mut self, now: Instant, out: &mut Vec<OpId>) {
        if self.next_deadline.is_none_or(|d| now < d) {
            return;
        }
        let mut next: Option<Instant> = None;
        for app in self.apps.iter_mut().flatten() {
            for (slot, (op, t)) in app.ops.iter().zip(&mut app.timing).enumerate() {
                match *t {
                    // Only a call in flight has one: `free_op` clears it.
                    Timing::Until(d) if d <= now => {
                        *t = Timing::Cancelled;
                        app.counters.timeouts += 1;
                        out.push(OpId {
                            app: app.id,
                            slot: slot as u16,
                            gen: op.gen,
                        });
                    }
                    Timing::Until(d) => next = Some(next.map_or(d, |n| n.min(d))),
                    Timing::Open | Timing::Cancelled => {}
                }
            }
        }
        self.next_deadline = next;
    }

    /// Tells `app` its registration succeeded (see [`Submission::Registered`]); nothing if the
    /// app has gone meanwhile.
    pub fn acknowledge(&mut self, app: AppId, ack: RegisterAck) {
        if let Some(a) = self.app_mut(app) {
            a.push(Cqe {
                kind: op::REGISTER,
                status: status::OK,
                user_data: ack.user_data,
                prog: ack.prog,
                vers: ack.vers,
                ..Cqe::default()
            });
        }
    }

    /// Ends a call: writes the result-buffer records and the completion. Returns false (and counts it) when
    /// the call is no longer known — its app went away — so the reply is dropped.
    pub fn complete_call(&mut self, id: OpId, out: CallOutcome<'_>) -> bool {
        let Some(app) = self.app_mut(id.app) else {
            self.stats.stale_completions += 1;
            return false;
        };
        let req = match app.op_mut(id) {
            Some(Op {
                state: OpState::Call(c),
                ..
            }) => *c,
            _ => {
                self.stats.stale_completions += 1;
                return false;
            }
        };
        let mut n_results = 0u8;
        if out.status == status::OK {
            for (i, (&(pos, used), p)) in out.results.iter().zip(req.results.as_slice()).enumerate()
            {
                let rec = Piece {
                    xdr_pos: pos,
                    used: used.min(p.len),
                    ..*p
                };
                let at = u32::from(req.args.n) + i as u32;
                app.region().write_piece(req.pieces_off, at, rec);
                n_results += 1;
            }
        }
        let ok = out.status == status::OK;
        let lent = out.lent && !ok;
        if lent {
            if let Some(op) = app.op_mut(id) {
                op.state = OpState::Lent {
                    user_data: req.user_data,
                    xid: req.xid,
                };
            }
            // Ended: neither cancelled nor timed out again while it waits for its release.
            if let Some(t) = app.timing.get_mut(usize::from(id.slot)) {
                *t = Timing::Cancelled;
            }
        } else {
            app.free_op(id);
        }
        app.counters.calls_done += 1;
        app.push(Cqe {
            kind: op::CALL,
            flags: if lent { cqe_flag::LENT } else { 0 },
            n_results,
            status: out.status,
            user_data: req.user_data,
            prog: req.prog,
            vers: req.vers,
            proc_: req.proc_,
            xid: req.xid,
            msg_off: req.reply.off(),
            msg_len: if ok {
                out.reply_len.min(req.reply.len())
            } else {
                0
            },
            rpc_stat: out.rpc_stat,
            ..Cqe::default()
        });
        if lent {
            // Its RELEASED is owed still (`push` took the call's completion off).
            app.pending += 1;
        }
        true
    }

    /// The peer can no longer reach the memory of call `id`, which completed lent
    /// ([`CallOutcome::lent`]): its app is told ([`op::RELEASED`]) and the call leaves its
    /// slab. False (and counted) if the app or the call is gone.
    pub fn release_call(&mut self, id: OpId) -> bool {
        let Some(app) = self.app_mut(id.app) else {
            self.stats.stale_completions += 1;
            return false;
        };
        let Some(&mut Op {
            state: OpState::Lent { user_data, xid },
            ..
        }) = app.op_mut(id)
        else {
            self.stats.stale_completions += 1;
            return false;
        };
        app.free_op(id);
        app.push(Cqe {
            kind: op::RELEASED,
            status: status::OK,
            user_data,
            xid,
            ..Cqe::default()
        });
        true
    }

    /// Takes the first posted receive buffer of `app` at least `need` bytes long.
    pub fn take_recv(&mut self, app: AppId, need: u32) -> Result<RecvBuf, u32> {
        let a = self.app_mut(app).ok_or(status::CANCELLED)?;
        let pos = a
            .recvs
            .iter()
            .position(|&s| matches!(a.ops[usize::from(s)].state, OpState::Recv { buf, .. } if buf.len() >= need))
            .ok_or(status::NO_RECV_BUFFER)?;
        let slot = a.recvs.remove(pos).ok_or(status::NO_RECV_BUFFER)?;
        let op = &mut a.ops[usize::from(slot)];
        let OpState::Recv { user_data, buf } = op.state else {
            return Err(status::NO_RECV_BUFFER);
        };
        op.state = OpState::Filling { user_data, buf };
        Ok(RecvBuf {
            id: OpId {
                app,
                slot,
                gen: op.gen,
            },
            buf,
        })
    }

    /// A count that changes whenever an incoming call [`take_recv`](Self::take_recv) or
    /// [`lookup`](Self::lookup) turned away might now fare differently: a receive buffer was
    /// posted or put back, a program was unregistered, an app detached. A caller holding such
    /// calls retries them when it changes, not on every poll.
    pub fn recv_epoch(&self) -> u64 {
        self.recv_epoch
    }

    /// How many receive buffers `app` has posted and not yet been handed a call in.
    pub fn recv_posted(&self, app: AppId) -> usize {
        self.app(app).map_or(0, |a| a.recvs.len())
    }

    /// Returns an unused receive buffer to its app's list.
    pub fn put_back_recv(&mut self, rb: RecvBuf) {
        if let Some(a) = self.app_mut(rb.id.app) {
            if let Some(op) = a.op_mut(rb.id) {
                if let OpState::Filling { user_data, buf } = op.state {
                    op.state = OpState::Recv { user_data, buf };
                    a.recvs.push_front(rb.id.slot);
                    self.recv_epoch = self.recv_epoch.wrapping_add(1);
                }
            }
        }
    }

    /// Hands a call (arguments already placed in `rb.buf`) to the serving app; returns the id the app's
    /// REPLY will carry.
    pub fn deliver_call(&mut self, rb: RecvBuf, call: IncomingCall) -> Result<OpId, u32> {
        let a = self.app_mut(rb.id.app).ok_or(status::CANCELLED)?;
        let op = a.op_mut(rb.id).ok_or(status::CANCELLED)?;
        let OpState::Filling { user_data, buf } = op.state else {
            return Err(status::CANCELLED);
        };
        if call.args_len > buf.len() {
            return Err(status::NO_RECV_BUFFER);
        }
        op.state = OpState::Serving {
            tag: call.tag,
            prog: call.prog,
            vers: call.vers,
            proc_: call.proc_,
            xid: call.xid,
        };
        a.counters.served += 1;
        a.push(Cqe {
            kind: op::POST_RECV,
            status: status::OK,
            user_data,
            prog: call.prog,
            vers: call.vers,
            proc_: call.proc_,
            xid: call.xid,
            msg_off: buf.off(),
            msg_len: call.args_len,
            handle: rb.id.handle(),
            peer: call.peer,
            auth_flavor: u32::from(call.auth.is_some()),
            auth_uid: call.auth.map_or(0, |a| a.0),
            auth_gid: call.auth.map_or(0, |a| a.1),
            ..Cqe::default()
        });
        Ok(rb.id)
    }

    /// Drops a call being served (its requester went away); a later REPLY to it fails with BAD_HANDLE.
    pub fn cancel_serving(&mut self, id: OpId) {
        if let Some(a) = self.app_mut(id.app) {
            if matches!(a.op_mut(id).map(|o| o.state), Some(OpState::Serving { .. })) {
                a.free_op(id);
            }
        }
    }

    /// Ends a REPLY (its memory is the app's again): writes its completion.
    pub fn complete_reply(&mut self, id: OpId, code: u32) -> bool {
        let Some(a) = self.app_mut(id.app) else {
            self.stats.stale_completions += 1;
            return false;
        };
        let Some(&mut Op {
            state:
                OpState::Replying {
                    user_data,
                    prog,
                    vers,
                    proc_,
                    req: ReplyRequest { xid, .. },
                },
            ..
        }) = a.op_mut(id)
        else {
            self.stats.stale_completions += 1;
            return false;
        };
        a.free_op(id);
        a.push(Cqe {
            kind: op::REPLY,
            status: code,
            user_data,
            prog,
            vers,
            proc_,
            xid,
            ..Cqe::default()
        });
        true
    }

    /// Detaches an app: marks its region detached, drops its registrations, unmaps its region, closes its
    /// fds, and reports what it had in flight.
    pub fn detach(&mut self, id: AppId, reason: &'static str) -> Option<Detached> {
        let app = self
            .apps
            .get_mut(usize::from(id.slot))?
            .take_if(|a| a.id == id)?;
        app.region()
            .header()
            .state
            .value
            .store(STATE_DETACHED, Ordering::Release);
        app.wake();
        self.registry.retain(|r| r.app != id);
        self.recv_epoch = self.recv_epoch.wrapping_add(1);
        let mut calls = Vec::new();
        let mut serving_tags = Vec::new();
        for (slot, op) in app.ops.iter().enumerate() {
            match op.state {
                OpState::Call(_) => calls.push(OpId {
                    app: id,
                    slot: slot as u16,
                    gen: op.gen,
                }),
                OpState::Serving { tag, .. } => serving_tags.push(tag),
                OpState::Replying { req, .. } => serving_tags.push(req.tag),
                _ => {}
            }
        }
        self.stats.apps -= 1;
        self.stats.detached += 1;
        if reason == "corrupt ring" {
            self.stats.faults += 1;
        }
        Some(Detached {
            app: id,
            pid: app.att.pid,
            reason,
            calls,
            serving_tags,
        })
    }

    /// Detaches every app whose completions have waited in its backlog (CQ full, app not draining) for
    /// longer than `limit`: its calls are reported for cancellation and its memory released.
    pub fn evict_stalled(&mut self, limit: Duration) -> Vec<Detached> {
        let now = Instant::now();
        let over = |a: &App| {
            a.stalled_since
                .is_some_and(|t| now.duration_since(t) > limit)
        };
        // The common case allocates nothing.
        if !self.apps.iter().flatten().any(over) {
            return Vec::new();
        }
        let stalled: Vec<AppId> = self
            .apps
            .iter()
            .flatten()
            .filter(|a| over(a))
            .map(|a| a.id)
            .collect();
        stalled
            .into_iter()
            .filter_map(|id| self.detach(id, "stalled"))
            .collect()
    }

    /// Detaches every app whose socket closed (it exited or was killed) or that corrupted a ring.
    /// Makes one `poll(2)`; call it every millisecond or so, not on every loop.
    ///
    /// An app that leaves right after its last submissions (a reply, then its socket closes)
    /// has them taken first: while its ring still holds submissions, for up to
    /// [`CLOSE_GRACE`], a closed socket does not detach it, so the [`poll_submissions`]
    /// that follow take them (a reply is sent, not answered SYSTEM_ERR).
    ///
    /// [`poll_submissions`]: Self::poll_submissions
    pub fn reap(&mut self) -> Vec<Detached> {
        let mut gone: Vec<(AppId, &'static str)> = Vec::new();
        self.poll_sockets(&[], Duration::ZERO);
        let now = Instant::now();
        for &(slot, r) in &self.polled.seen {
            let Some(a) = self.apps.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            if let Some(f) = a.fault {
                gone.push((a.id, f));
                continue;
            }
            let hung_up = r.intersects(PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL);
            if hung_up || (r.contains(PollFlags::IN) && !drain(a.att.sock.as_fd())) {
                let closed_at = *a.closed_at.get_or_insert(now);
                let left = a.sq.ready().unwrap_or(0) > 0;
                if left && now.duration_since(closed_at) < CLOSE_GRACE {
                    continue;
                }
                gone.push((a.id, "closed"));
            }
        }
        // Both empty (no allocation) unless an app has gone.
        gone.into_iter()
            .filter_map(|(id, why)| self.detach(id, why))
            .collect()
    }

    /// One `poll(2)` of every app's socket and of `extra`, waiting up to `timeout`; what it
    /// found of each app is left in `self.polled.seen`. Allocates nothing (the lists keep
    /// their room between looks).
    fn poll_sockets(&mut self, extra: &[BorrowedFd<'_>], timeout: Duration) {
        let Polled { fds, seen } = &mut self.polled;
        seen.clear();
        for (slot, a) in self.apps.iter().enumerate() {
            if let Some(a) = a {
                // SAFETY: the socket is owned by an app of `self.apps`, which this function
                // neither drops nor moves; `fds` is emptied before it returns, so the
                // descriptor is not used, nor kept, past this borrow.
                let fd = unsafe { BorrowedFd::borrow_raw(a.att.sock.as_raw_fd()) };
                fds.push(PollFd::from_borrowed_fd(fd, PollFlags::IN));
                seen.push((slot, PollFlags::empty()));
            }
        }
        for f in extra {
            // SAFETY: `extra` is borrowed for the whole of this function, and `fds` is emptied
            // before it returns.
            let fd = unsafe { BorrowedFd::borrow_raw(f.as_raw_fd()) };
            fds.push(PollFd::from_borrowed_fd(fd, PollFlags::IN));
        }
        let ts = rustix::event::Timespec {
            tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        if !fds.is_empty() {
            let _ = rustix::event::poll(fds, Some(&ts));
        }
        for (s, p) in seen.iter_mut().zip(fds.iter()) {
            s.1 = p.revents();
        }
        fds.clear();
    }

    /// Sleeps until an app sends a wake-up (or closes), an `extra` descriptor (e.g. a listening socket or a
    /// command-queue eventfd) becomes readable, or `timeout` passes — unless work is already waiting.
    ///
    /// Sets every app's `daemon_waiting` flag, re-checks the rings (the app's matching fence is in
    /// `Endpoint::submit`), then polls the app sockets; wake-up bytes are drained with `MSG_DONTWAIT`.
    pub fn park(&mut self, timeout: Duration, extra: &[BorrowedFd<'_>]) {
        let set = |t: &AppTable, v: u32| {
            for a in t.apps.iter().flatten() {
                a.region()
                    .header()
                    .daemon_waiting
                    .value
                    .store(v, Ordering::Relaxed);
            }
        };
        set(self, 1);
        // SYNC POINT: SeqCst fence between our store of `daemon_waiting` and our loads of the SQ tails; pairs
        // with the app's fence between its SQ tail store and its load of `daemon_waiting`.
        fence(Ordering::SeqCst);
        let mut busy = false;
        for a in self.apps.iter_mut().flatten() {
            let room = (a.pending as usize + a.backlog.len()) < a.max_owed as usize;
            if a.fault.is_some() || (room && a.sq.ready().map_or(true, |n| n > 0)) {
                busy = true;
            }
            if !a.backlog.is_empty() && a.cq.free().map_or(true, |n| n > 0) {
                busy = true;
            }
        }
        if !busy {
            self.poll_sockets(extra, timeout);
            // Wake-up bytes are read here; a closed socket is left to `reap`, which takes what
            // the app submitted before it closed (a fault here would skip that).
            for k in 0..self.polled.seen.len() {
                let (slot, r) = self.polled.seen[k];
                if let Some(a) = self.apps.get(slot).and_then(Option::as_ref) {
                    if !r.is_empty() {
                        let _ = drain(a.att.sock.as_fd());
                    }
                }
            }
        }
        set(self, 0);
    }

    /// Current counters (apps, ops in flight, backlog are live values).
    pub fn stats(&self) -> TableStats {
        let mut s = self.stats;
        s.ops = self.apps.iter().flatten().map(App::ops_in_use).sum();
        s.backlog = self.apps.iter().flatten().map(|a| a.backlog.len()).sum();
        s
    }
}

// The control thread accepts apps and hands them (and tables) to poll threads.
const _: () = {
    const fn send<T: Send>() {}
    send::<Attachment>();
    send::<AppTable>();
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{Geometry, Layout};
    use std::os::unix::net::UnixStream;

    /// The app's half of an in-process attachment: its own mapping of the same memfd.
    struct TestApp {
        region: Region,
        sq: Producer<Sqe>,
        cq: Consumer<Cqe>,
        _peer_sock: UnixStream,
    }

    impl TestApp {
        fn submit(&mut self, s: Sqe) {
            self.sq.push(s).unwrap();
        }

        fn drain(&mut self) -> Vec<Cqe> {
            std::iter::from_fn(|| self.cq.pop().unwrap()).collect()
        }
    }

    fn attach(t: &mut AppTable, g: Geometry) -> (AppId, TestApp) {
        let layout = Layout::new(g).unwrap();
        let region = Region::create(layout, 1, &[crate::region::PeerInfo::named("p0")]).unwrap();
        let fd = rustix::io::fcntl_dupfd_cloexec(region.fd(), 0).unwrap();
        let app_region = Region::open(fd).unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        // An app of user 1000, group 100.
        let att = Attachment {
            region,
            sock: a,
            pid: None,
            ids: Some((1000, 100)),
            app_id: 1,
        };
        let id = t.attach(att).unwrap();
        // SAFETY: one producer and one consumer for this test app; `app_region` lives in the same struct.
        let (sq, cq) = unsafe { (app_region.sq_producer(), app_region.cq_consumer()) };
        (
            id,
            TestApp {
                region: app_region,
                sq,
                cq,
                _peer_sock: b,
            },
        )
    }

    fn geometry() -> Geometry {
        Geometry {
            sq_entries: 64,
            cq_entries: 64,
            arena_size: 1 << 16,
            peers: 1,
        }
    }

    fn call(user_data: u64) -> Sqe {
        Sqe {
            opcode: op::CALL,
            user_data,
            prog: 100,
            vers: 1,
            msg_off: 0,
            msg_len: 8,
            reply_off: 4096,
            reply_len: 1024,
            ..Sqe::default()
        }
    }

    fn poll(t: &mut AppTable) -> Vec<(AppId, Submission)> {
        let mut v = Vec::new();
        t.poll_submissions(&mut v, 64);
        v
    }

    /// DETACH ends what the table takes from the app: it comes out as `Submission::Detach`
    /// after the app's earlier submissions and before nothing of its later ones; another app
    /// is served on as before; the detach itself frees the slot.
    #[test]
    fn detach_on_the_ring_ends_the_apps_submissions_and_frees_its_slot() {
        let mut t = AppTable::new(TableConfig::default()).unwrap();
        let (leaving, mut a) = attach(&mut t, geometry());
        let (staying, mut b) = attach(&mut t, geometry());
        a.submit(call(1));
        a.submit(Sqe {
            opcode: op::DETACH,
            ..Sqe::default()
        });
        a.submit(call(2));
        b.submit(call(3));
        let got = poll(&mut t);
        let kinds: Vec<(AppId, u64)> = got
            .iter()
            .map(|(id, s)| match s {
                Submission::Call(op) => (*id, t.call_request(*op).unwrap().user_data),
                Submission::Detach => (*id, 0),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(kinds, [(leaving, 1), (leaving, 0), (staying, 3)]);
        let d = t
            .detach(leaving, "closed")
            .expect("attached until detached");
        assert_eq!(d.calls.len(), 1, "its call in flight is reported");
        assert!(t.detach(leaving, "closed").is_none());
        assert_eq!(
            a.region.header().state.value.load(Ordering::Acquire),
            STATE_DETACHED
        );
        assert!(poll(&mut t).is_empty(), "nothing more from either app");
        assert!(t.region(staying).is_some());
    }

    #[test]
    fn an_app_calls_with_auth_sys_as_itself_and_the_request_carries_it() {
        let mut t = AppTable::new(TableConfig::default()).unwrap();
        let (_, mut app) = attach(&mut t, geometry());
        app.submit(Sqe {
            flags: flag::AUTH_SYS,
            auth_uid: 1000,
            auth_gid: 100,
            ..call(1)
        });
        app.submit(call(2));
        let subs = poll(&mut t);
        let auths: Vec<_> = subs
            .iter()
            .map(|(_, s)| match s {
                Submission::Call(id) => t.call_request(*id).map(|c| c.auth),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(auths, [Some(Some((1000, 100))), Some(None)]);
    }

    #[test]
    fn bad_descriptors_fail_with_their_error_code_and_good_ones_pass() {
        let mut t = AppTable::new(TableConfig::default()).unwrap();
        let (_, mut app) = attach(&mut t, geometry());
        let arena = geometry().arena_size;
        // Piece table at 8192: one argument piece at a misaligned position.
        app.region.write_piece(
            8192,
            0,
            Piece {
                off: 0,
                len: 4,
                xdr_pos: 2,
                used: 0,
            },
        );
        // Piece table at 8448: a piece that runs off the end of the arena.
        app.region.write_piece(
            8448,
            0,
            Piece {
                off: arena - 2,
                len: 4,
                xdr_pos: 0,
                used: 0,
            },
        );
        let cases: Vec<(Sqe, u32)> = vec![
            (
                Sqe {
                    opcode: 99,
                    ..call(1)
                },
                status::BAD_OPCODE,
            ),
            (
                Sqe {
                    auth_uid: 1,
                    ..call(2)
                },
                status::BAD_FLAGS,
            ),
            (
                // AUTH_SYS is for calls only.
                Sqe {
                    opcode: op::POST_RECV,
                    flags: flag::AUTH_SYS,
                    ..call(2)
                },
                status::BAD_FLAGS,
            ),
            (
                // The app (user 1000, group 100) may not call as root, nor in another group.
                Sqe {
                    flags: flag::AUTH_SYS,
                    ..call(2)
                },
                status::AUTH_DENIED,
            ),
            (
                Sqe {
                    flags: flag::AUTH_SYS,
                    auth_uid: 1000,
                    auth_gid: 0,
                    ..call(2)
                },
                status::AUTH_DENIED,
            ),
            (
                Sqe {
                    flags: 0x80,
                    ..call(3)
                },
                status::BAD_FLAGS,
            ),
            (
                Sqe {
                    msg_off: arena - 4,
                    ..call(4)
                },
                status::BAD_RANGE,
            ),
            (
                Sqe {
                    msg_off: u32::MAX - 2,
                    ..call(5)
                },
                status::BAD_RANGE,
            ),
            (
                Sqe {
                    reply_len: arena,
                    ..call(6)
                },
                status::BAD_RANGE,
            ),
            (
                Sqe {
                    target: 1,
                    ..call(7)
                },
                status::UNKNOWN_PEER,
            ),
            (
                Sqe {
                    n_args: 9,
                    pieces_off: 8192,
                    ..call(8)
                },
                status::BAD_PIECES,
            ),
            (
                Sqe {
                    n_args: 1,
                    pieces_off: 8192,
                    ..call(9)
                },
                status::BAD_PIECES,
            ),
            (
                Sqe {
                    n_args: 1,
                    pieces_off: 8448,
                    ..call(10)
                },
                status::BAD_RANGE,
            ),
            (
                Sqe {
                    n_results: 1,
                    pieces_off: arena - 8,
                    ..call(11)
                },
                status::BAD_RANGE,
            ),
            (
                Sqe {
                    n_args: 1,
                    pieces_off: 8194,
                    ..call(12)
                },
                status::BAD_RANGE,
            ),
            (
                Sqe {
                    opcode: op::REPLY,
                    target: 0x0001_0001,
                    ..call(13)
                },
                status::BAD_HANDLE,
            ),
            (
                Sqe {
                    opcode: op::UNREGISTER,
                    ..call(14)
                },
                status::NOT_REGISTERED,
            ),
            (
                Sqe {
                    opcode: op::POST_RECV,
                    msg_off: arena,
                    msg_len: 1,
                    ..call(15)
                },
                status::BAD_RANGE,
            ),
            // A completion kind only: never a submission.
            (
                Sqe {
                    opcode: op::RELEASED,
                    ..call(16)
                },
                status::BAD_OPCODE,
            ),
        ];
        for (s, _) in &cases {
            app.submit(*s);
        }
        app.submit(call(100));
        let subs = poll(&mut t);
        assert_eq!(subs.len(), 1, "only the good call passes");
        let Submission::Call(op) = subs[0].1 else {
            panic!("not a call")
        };
        let c = *t.call_request(op).unwrap();
        assert_eq!(
            (c.id, c.msg.off(), c.msg.len(), c.reply.len()),
            (op, 0, 8, 1024)
        );
        let got = app.drain();
        assert_eq!(got.len(), cases.len());
        for (cqe, (sqe, code)) in got.iter().zip(&cases) {
            assert_eq!((cqe.user_data, cqe.status), (sqe.user_data, *code));
        }
        assert_eq!(t.stats().bad_submissions, cases.len() as u64);
    }

    #[test]
    fn offsets_are_relative_to_each_apps_own_arena() {
        let mut t = AppTable::new(TableConfig::default()).unwrap();
        let small = Geometry {
            arena_size: 4096,
            ..geometry()
        };
        let (a, mut app_a) = attach(&mut t, small);
        let (b, _app_b) = attach(&mut t, geometry());
        // App A names an offset that exists only in B's (larger) arena: rejected, nothing written anywhere.
        app_a.submit(Sqe {
            msg_off: 8192,
            ..call(1)
        });
        assert!(poll(&mut t).is_empty());
        assert_eq!(app_a.drain()[0].status, status::BAD_RANGE);
        let (ra, rb) = (t.region(a).unwrap(), t.region(b).unwrap());
        assert_ne!(ra.base(), rb.base());
        assert!(ra.range(4095, 2).is_none());
    }

    /// A REPLY is validated once and kept in the table: the submission names it by id, and
    /// `reply_request` gives what was validated until the reply completes.
    #[test]
    fn a_reply_is_kept_in_the_table_until_it_completes() {
        let mut t = AppTable::new(TableConfig::default()).unwrap();
        let (aid, mut app) = attach(&mut t, geometry());
        app.submit(Sqe {
            opcode: op::POST_RECV,
            user_data: 1,
            msg_off: 16384,
            msg_len: 4096,
            ..Sqe::default()
        });
        assert!(poll(&mut t).is_empty(), "a posted buffer is no submission");
        let rb = t.take_recv(aid, 64).unwrap();
        let call = IncomingCall {
            tag: 77,
            peer: 0,
            prog: 100,
            vers: 1,
            proc_: 1,
            xid: 9,
            args_len: 64,
            auth: Some((1000, 100)),
        };
        let served = t.deliver_call(rb, call).unwrap();
        let delivered = app.drain();
        assert_eq!(delivered.len(), 1, "the delivered call");
        // The caller's AUTH_SYS identity travels with it.
        assert_eq!(
            (
                delivered[0].auth_flavor,
                delivered[0].auth_uid,
                delivered[0].auth_gid
            ),
            (1, 1000, 100)
        );
        let piece = Piece {
            off: 20480,
            len: 512,
            xdr_pos: 4,
            used: 0,
        };
        app.region.write_piece(8192, 0, piece);
        app.submit(Sqe {
            opcode: op::REPLY,
            user_data: 2,
            target: (u32::from(served.slot) << 16) | u32::from(served.gen),
            msg_off: 24576,
            msg_len: 8,
            n_args: 1,
            pieces_off: 8192,
            ..Sqe::default()
        });
        let subs = poll(&mut t);
        let Submission::Reply(id) = subs[0].1 else {
            panic!("not a reply: {subs:?}")
        };
        assert_eq!(id, served);
        let r = *t.reply_request(id).unwrap();
        assert_eq!(
            (r.id, r.tag, r.xid, r.accept_stat, r.msg.off(), r.msg.len()),
            (served, 77, 9, 0, 24576, 8)
        );
        assert_eq!(r.results.as_slice(), [piece]);
        assert!(t.call_request(id).is_none(), "a reply is no call");
        assert!(t.complete_reply(id, status::OK));
        assert!(t.reply_request(id).is_none(), "gone once completed");
        // What operators see: one call served, one reply; nothing called, nothing refused.
        let info = t.app_info(aid).expect("attached");
        assert_eq!(
            info.counters,
            AppCounters {
                served: 1,
                replies: 1,
                ..AppCounters::default()
            }
        );
        assert_eq!((info.ops, info.n_programs), (0, 0));
        let cqe = app.drain()[0];
        assert_eq!(
            (cqe.kind, cqe.user_data, cqe.status),
            (op::REPLY, 2, status::OK)
        );
    }

    /// R8166-8.1.4-c: a call that ends while the peer may still reach its memory completes at
    /// once, flagged LENT, keeps its op (it counts against the app's limit, and its app's
    /// operators see it) until the daemon releases it, then completes a second time, as
    /// RELEASED, exactly once; a lent call is neither cancelled nor timed out again.
    #[test]
    fn a_lent_call_completes_then_is_released_once() {
        let mut t = AppTable::new(TableConfig {
            max_ops_per_app: 2,
            ..TableConfig::default()
        })
        .unwrap();
        let (id, mut app) = attach(&mut t, geometry());
        app.submit(Sqe {
            timeout_ms: 1,
            ..call(5)
        });
        let Submission::Call(op) = poll(&mut t)[0].1 else {
            panic!("not a call")
        };
        // Its time limit passes; the engine ends it lent.
        let mut late = Vec::new();
        t.expired(Instant::now() + Duration::from_secs(1), &mut late);
        assert_eq!(late, [op]);
        let lent = CallOutcome {
            status: status::TIMEOUT,
            lent: true,
            ..CallOutcome::default()
        };
        assert!(t.complete_call(op, lent));
        let c = app.drain();
        assert_eq!(
            c.iter()
                .map(|c| (c.kind, c.flags, c.status, c.user_data))
                .collect::<Vec<_>>(),
            [(op::CALL, cqe_flag::LENT, status::TIMEOUT, 5)]
        );
        let xid = c[0].xid;
        // Still the app's: one op of two, counted as lent; its completion does not come again.
        let info = t.app_info(id).expect("attached");
        assert_eq!((info.ops, info.lent), (1, 1));
        assert!(!t.complete_call(op, CallOutcome::default()));
        app.submit(Sqe {
            opcode: op::CANCEL,
            user_data: 5,
            ..Sqe::default()
        });
        assert!(poll(&mut t).is_empty(), "a lent call is not cancelled");
        t.expired(Instant::now() + Duration::from_secs(2), &mut late);
        assert_eq!(late, [op], "nor timed out again");
        // Its op counts against the app's limit.
        app.submit(call(6));
        app.submit(call(7));
        let subs = poll(&mut t);
        let [(_, Submission::Call(other))] = subs[..] else {
            panic!("{subs:?}")
        };
        let refused = app.drain();
        assert_eq!(
            (refused[0].user_data, refused[0].status),
            (7, status::TOO_MANY)
        );
        // Released: the second completion, once.
        assert!(t.release_call(op));
        assert!(!t.release_call(op));
        let c = app.drain();
        assert_eq!(
            c.iter()
                .map(|c| (c.kind, c.flags, c.status, c.user_data, c.xid))
                .collect::<Vec<_>>(),
            [(op::RELEASED, 0, status::OK, 5, xid)]
        );
        let info = t.app_info(id).expect("attached");
        assert_eq!((info.ops, info.lent), (1, 0));
        // A call that did not end lent is not released.
        assert!(!t.release_call(other));
        assert!(app.drain().is_empty());
    }

    /// Found by the `table` fuzz target: a call with a time limit that completes lent (the
    /// engine ended it) must not expire afterwards, while it waits for its release.
    #[test]
    fn a_lent_call_does_not_time_out_while_it_waits_for_its_release() {
        let mut t = AppTable::new(TableConfig::default()).unwrap();
        let (_, mut app) = attach(&mut t, geometry());
        app.submit(Sqe {
            timeout_ms: 1000,
            ..call(5)
        });
        let Submission::Call(op) = poll(&mut t)[0].1 else {
            panic!("not a call")
        };
        let lent = CallOutcome {
            status: status::CANCELLED,
            lent: true,
            ..CallOutcome::default()
        };
        assert!(t.complete_call(op, lent));
        let mut late = Vec::new();
        t.expired(Instant::now() + Duration::from_secs(2), &mut late);
        assert!(late.is_empty(), "{late:?}");
        assert!(t.release_call(op));
        let kinds: Vec<u8> = app.drain().iter().map(|c| c.kind).collect();
        assert_eq!(kinds, [op::CALL, op::RELEASED]);
    }

    #[test]
    fn call_completes_with_results_and_a_stale_completion_is_dropped() {
        let mut t = AppTable::new(TableConfig::default()).unwrap();
        let (id, mut app) = attach(&mut t, geometry());
        app.region.write_piece(
            8192,
            0,
            Piece {
                off: 12288,
                len: 100,
                xdr_pos: 0,
                used: 0,
            },
        );
        app.submit(Sqe {
            n_results: 1,
            pieces_off: 8192,
            xid: 7,
            flags: flag::XID_APP,
            ..call(5)
        });
        let subs = poll(&mut t);
        let Submission::Call(op) = subs[0].1 else {
            panic!("not a call")
        };
        let c = *t.call_request(op).unwrap();
        assert_eq!((c.id, c.xid), (op, 7));
        assert_eq!(t.stats().ops, 1);
        assert!(t.complete_call(
            c.id,
            CallOutcome {
                status: 0,
                rpc_stat: 0,
                reply_len: 4,
                results: &[(4, 60)],
                lent: false,
            }
        ));
        let cqe = app.drain()[0];
        assert_eq!(
            (cqe.status, cqe.msg_len, cqe.n_results, cqe.xid),
            (0, 4, 1, 7)
        );
        assert_eq!(app.region.read_piece(8192, 0).unwrap().used, 60);
        assert_eq!(t.stats().ops, 0);
        // A second completion for the same call (or any after detach) is dropped and counted.
        assert!(!t.complete_call(c.id, CallOutcome::default()));
        // One call submitted and ended; a refused one counts as bad, not as a call.
        app.submit(Sqe {
            auth_gid: 1,
            ..call(9)
        });
        assert!(poll(&mut t).is_empty());
        let info = t.app_info(id).expect("attached");
        assert_eq!(
            info.counters,
            AppCounters {
                calls: 1,
                calls_done: 1,
                bad: 1,
                ..AppCounters::default()
            }
        );
        app.submit(call(6));
        let Submission::Call(c2) = poll(&mut t)[0].1 else {
            panic!("not a call")
        };
        let d = t.detach(id, "detached").unwrap();
        assert_eq!(d.calls, vec![c2]);
        assert!(
            t.call_request(c2).is_none(),
            "a detached app's call is gone"
        );
        assert!(!t.complete_call(c2, CallOutcome::default()));
        assert_eq!(t.stats().stale_completions, 2);
        assert_eq!(t.stats().apps, 0);
        assert_eq!(
            app.region.header().state.value.load(Ordering::Acquire),
            STATE_DETACHED
        );
    }

    /// An app that submits and closes its socket at once (a server's last reply, then its
    /// exit) has its submissions taken before it is detached: a reap that comes between the
    /// two leaves it attached. One that goes on submitting is detached after the grace.
    #[test]
    fn an_app_that_submits_and_leaves_at_once_is_detached_only_after_its_submissions_are_taken() {
        let mut t = AppTable::new(TableConfig::default()).unwrap();
        let (id, mut app) = attach(&mut t, geometry());
        app.submit(call(1));
        drop(std::mem::replace(
            &mut app._peer_sock,
            UnixStream::pair().unwrap().0,
        ));
        assert!(
            t.reap().is_empty(),
            "detached with a submission on its ring"
        );
        let subs = poll(&mut t);
        assert!(
            matches!(subs[..], [(a, Submission::Call(_))] if a == id),
            "{subs:?}"
        );
        let gone = t.reap();
        assert_eq!((gone.len(), gone[0].app, gone[0].reason), (1, id, "closed"));
        assert_eq!(
            gone[0].calls.len(),
            1,
            "its call is reported for cancellation"
        );

        let (id, mut app) = attach(&mut t, geometry());
        drop(std::mem::replace(
            &mut app._peer_sock,
            UnixStream::pair().unwrap().0,
        ));
        app.submit(call(2));
        assert!(t.reap().is_empty());
        app.submit(call(3));
        std::thread::sleep(CLOSE_GRACE);
        let gone = t.reap();
        assert_eq!((gone.len(), gone[0].app), (1, id), "kept past the grace");

        // A park that finds the socket closed (the app's last submissions came after the
        // park's look at the rings) leaves them to be taken too.
        let (id, mut app) = attach(&mut t, geometry());
        drop(std::mem::replace(
            &mut app._peer_sock,
            UnixStream::pair().unwrap().0,
        ));
        t.park(Duration::ZERO, &[]);
        app.submit(call(4));
        assert!(t.reap().is_empty(), "detached by the park");
        let subs = poll(&mut t);
        assert!(
            matches!(subs[..], [(a, Submission::Call(_))] if a == id),
            "{subs:?}"
        );
        assert_eq!(t.reap().len(), 1);
    }

    /// CANCEL names the app's own call in flight by its user_data; one that names nothing
    /// (an ended call, another app's) is dropped without a completion, and a CANCEL never
    /// counts against the app's outstanding limit.
    #[test]
    fn cancel_names_only_the_apps_own_call_in_flight_and_has_no_completion() {
        let mut t = AppTable::new(TableConfig {
            max_ops_per_app: 4,
            ..TableConfig::default()
        })
        .unwrap();
        let (a, mut app) = attach(&mut t, geometry());
        let (_, mut other) = attach(&mut t, geometry());
        app.submit(call(7));
        app.submit(call(8));
        let subs = poll(&mut t);
        let Submission::Call(id8) = subs[1].1 else {
            panic!("{subs:?}")
        };
        let cancel = |user_data| Sqe {
            opcode: op::CANCEL,
            user_data,
            ..Sqe::default()
        };
        // Far more CANCELs than the ring of completions holds: none is owed a completion.
        for _ in 0..300 {
            other.submit(cancel(8));
            while poll(&mut t).pop().is_some() {}
        }
        app.submit(cancel(99));
        app.submit(cancel(8));
        let subs = poll(&mut t);
        assert_eq!(subs.len(), 1, "{subs:?}");
        assert!(matches!(subs[0], (who, Submission::Cancel(id)) if who == a && id == id8));
        assert!(app.drain().is_empty() && other.drain().is_empty());
        assert_eq!(t.app_info(a).map(|i| i.counters.cancels), Some(1));
        // A call is cancelled once: a second CANCEL naming it finds nothing.
        app.submit(cancel(8));
        assert!(poll(&mut t).is_empty());
        // At most CANCELS_PER_POLL CANCELs of an app per poll: what follows them waits.
        for _ in 0..CANCELS_PER_POLL {
            app.submit(cancel(99));
        }
        app.submit(call(9));
        assert!(poll(&mut t).is_empty(), "the call waits behind the CANCELs");
        assert!(matches!(poll(&mut t)[..], [(_, Submission::Call(_))]));
        assert_eq!(t.app_info(a).map(|i| i.counters.calls), Some(3));
        // Once the call has ended, a CANCEL naming it finds nothing.
        t.complete_call(id8, CallOutcome::default());
        app.submit(cancel(8));
        assert!(poll(&mut t).is_empty());
        assert_eq!(app.drain().len(), 1, "only the call's own completion");
        // A time limit belongs to CALL only, and a CANCEL has no flags.
        for bad in [
            Sqe {
                timeout_ms: 5,
                ..cancel(7)
            },
            Sqe {
                flags: flag::XID_APP,
                ..cancel(7)
            },
        ] {
            app.submit(bad);
            assert!(poll(&mut t).is_empty());
            let c = app.drain();
            assert_eq!(
                (c.len(), c[0].kind, c[0].status),
                (1, op::CANCEL, status::BAD_FLAGS)
            );
        }
    }

    /// A call's time limit is reported once, when it has passed; a call that ended or was
    /// cancelled is never reported; the earliest limit left is what `next_deadline` says.
    #[test]
    fn expired_reports_each_call_past_its_limit_once() {
        let mut t = AppTable::new(TableConfig::default()).unwrap();
        let (a, mut app) = attach(&mut t, geometry());
        let t0 = Instant::now();
        for (user_data, ms) in [(1, 100), (2, 200), (3, 50), (4, 0), (5, 60)] {
            app.submit(Sqe {
                timeout_ms: ms,
                ..call(user_data)
            });
        }
        let ids: Vec<OpId> = poll(&mut t)
            .into_iter()
            .map(|(_, s)| match s {
                Submission::Call(id) => id,
                other => panic!("{other:?}"),
            })
            .collect();
        let first = t.next_deadline().expect("a limit");
        assert!(first >= t0 + Duration::from_millis(50) && first < t0 + Duration::from_millis(60));
        // Call 3 ends before its limit, call 5 is cancelled.
        t.complete_call(ids[2], CallOutcome::default());
        app.submit(Sqe {
            opcode: op::CANCEL,
            user_data: 5,
            ..Sqe::default()
        });
        assert_eq!(poll(&mut t).len(), 1);
        let mut out = Vec::new();
        t.expired(first - Duration::from_millis(1), &mut out);
        assert!(out.is_empty());
        let now = Instant::now().max(t0 + Duration::from_millis(150));
        t.expired(now, &mut out);
        assert_eq!(out, vec![ids[0]], "call 1 only");
        t.expired(now, &mut out);
        assert_eq!(out, vec![ids[0]], "once");
        let next = t.next_deadline().expect("call 2's");
        assert!(next >= t0 + Duration::from_millis(200));
        t.expired(next, &mut out);
        assert_eq!(out, vec![ids[0], ids[1]]);
        assert_eq!(t.next_deadline(), None);
        assert_eq!(t.app_info(a).map(|i| i.counters.timeouts), Some(2));
    }

    #[test]
    fn too_many_ops_fails_the_submission_with_too_many() {
        let mut t = AppTable::new(TableConfig {
            max_ops_per_app: 2,
            ..TableConfig::default()
        })
        .unwrap();
        let (_, mut app) = attach(&mut t, geometry());
        for i in 0..3 {
            app.submit(call(i));
        }
        assert_eq!(poll(&mut t).len(), 2);
        let c = app.drain();
        assert_eq!(
            (c.len(), c[0].user_data, c[0].status),
            (1, 2, status::TOO_MANY)
        );
    }

    #[test]
    fn a_full_completion_ring_backs_up_into_a_bounded_backlog_and_loses_nothing() {
        let mut t = AppTable::new(TableConfig::default()).unwrap();
        let g = Geometry {
            sq_entries: 32,
            cq_entries: 4,
            ..geometry()
        };
        let (_, mut app) = attach(&mut t, g);
        for i in 0..20 {
            app.submit(Sqe {
                opcode: 99,
                ..call(i)
            });
        }
        poll(&mut t);
        poll(&mut t);
        // 4 in the ring, 4 in the backlog, the rest still on the submission ring.
        assert_eq!(t.stats().backlog, 4);
        let mut seen = Vec::new();
        while seen.len() < 20 {
            seen.extend(app.drain().iter().map(|c| c.user_data));
            poll(&mut t);
            assert!(t.stats().backlog <= 4);
        }
        assert_eq!(seen, (0..20).collect::<Vec<_>>());
    }

    #[test]
    fn a_corrupt_ring_index_detaches_only_that_app() {
        let mut t = AppTable::new(TableConfig::default()).unwrap();
        let (bad, app_bad) = attach(&mut t, geometry());
        let (good, mut app_good) = attach(&mut t, geometry());
        // SAFETY: the SQ producer index word of the bad app's own mapping.
        let tail = unsafe {
            &*(app_bad
                .region
                .base()
                .add(app_bad.region.layout().sq_offset as usize)
                as *const std::sync::atomic::AtomicU32)
        };
        tail.store(1000, Ordering::Release);
        app_good.submit(call(1));
        assert_eq!(poll(&mut t).len(), 1);
        let gone = t.reap();
        assert_eq!(gone.len(), 1);
        assert_eq!((gone[0].app, gone[0].reason), (bad, "corrupt ring"));
        assert_eq!(t.app_ids().collect::<Vec<_>>(), vec![good]);
        assert_eq!(t.stats().faults, 1);
    }

    #[test]
    fn register_routes_and_a_second_registration_is_refused() {
        let mut t = AppTable::new(TableConfig::default()).unwrap();
        let (a, mut app_a) = attach(&mut t, geometry());
        let (_, mut app_b) = attach(&mut t, geometry());
        let reg = Sqe {
            opcode: op::REGISTER,
            prog: 9,
            vers: 1,
            ..Sqe::default()
        };
        app_a.submit(reg);
        app_b.submit(reg);
        let subs = poll(&mut t);
        assert_eq!(app_b.drain()[0].status, status::ALREADY_REGISTERED);
        // The app is told only when the caller acknowledges the registration.
        assert!(app_a.drain().is_empty());
        let [(app, Submission::Registered { ack, .. })] = subs[..] else {
            panic!("{subs:?}");
        };
        assert_eq!(app, a);
        t.acknowledge(a, ack);
        let done = app_a.drain();
        assert_eq!((done[0].kind, done[0].status), (op::REGISTER, status::OK));
        assert_eq!(t.lookup(9, 1), Some(a));
        assert_eq!(t.lookup_backchannel(9, 1), None);
        let info = t.app_info(a).expect("attached");
        assert_eq!(
            info.programs[..usize::from(info.n_programs)],
            [(9, 1, false)]
        );
        t.detach(a, "detached");
        assert_eq!(t.app_info(a), None);
        assert_eq!(t.lookup(9, 1), None);
    }
}
