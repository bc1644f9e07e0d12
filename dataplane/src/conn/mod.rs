//! The per-connection RPC-over-RDMA state machine (sans-IO, in the style of quinn-proto).
//!
//! A [`Connection`] is fed received messages and work completions
//! ([`handle_completion`](Connection::handle_completion)), app submissions
//! ([`submit_call`](Connection::submit_call), [`accept_call`](Connection::accept_call),
//! [`submit_reply`](Connection::submit_reply)), control-plane commands and `now`; it answers
//! with [`Work`] to post ([`poll_work`](Connection::poll_work)) and [`Event`]s
//! ([`poll_event`](Connection::poll_event)). It has no sockets, threads or clocks: memory is
//! reached through the [`Env`] passed to each input, so a test drives two connections with
//! plain vectors and can inject any byte.
//!
//! One connection is requester and responder at once: a received message carrying an RPC
//! CALL goes to the responder half, a REPLY (or RDMA_ERROR) to the requester half, each with
//! its own XIDs and credits (RFC 8167, V2-3.2-a), so the backward direction needs nothing
//! special beyond buffer sizing.
//!
//! ```
//! use rpcrdma_dataplane::{CallSpec, ConnConfig, Connection, MemRef, Role, VecMemory, Work};
//! use rpcrdma_verbs::MrId;
//!
//! let (pool, app) = (MrId(1), MrId(2));
//! let send_len = ConnConfig::send_pool_len(11, 4096).unwrap();
//! let recv_len = ConnConfig::recv_pool_len(6, 4096).unwrap();
//! let mut conn = Connection::new(ConnConfig {
//!     role: Role::Client,
//!     version: 1,
//!     credits: 4,
//!     send_pool: MemRef::new(pool, 0, send_len),
//!     send_slots: 11,
//!     send_size: 4096,
//!     recv_pool: MemRef::new(pool, u64::from(send_len), recv_len),
//!     recv_slots: 6,
//!     recv_size: 4096,
//!     shared_recv: false,
//!     shared_send: false,
//!     max_calls: 8,
//!     peer: None,
//!     ddp_threshold: 1024,
//!     max_reads: 8,
//!     max_call_size: 1 << 20,
//! })?;
//! // Receives first, before the peer can send.
//! assert!(matches!(conn.poll_work(), Some(Work::Recv { .. })));
//! # while conn.poll_work().is_some() {}
//! // A NULL call: one 68-byte Send (RFC 8166 §3.5.1).
//! let mut mem = VecMemory::new();
//! mem.add(pool, (send_len + recv_len) as usize);
//! mem.add(app, 4096);
//! # struct E<'a>(&'a mut VecMemory);
//! # impl rpcrdma_dataplane::Memory for E<'_> {
//! #     fn read(&self, a: MemRef, d: &mut [u8]) -> bool { self.0.read(a, d) }
//! #     fn write(&mut self, a: MemRef, s: &[u8]) -> bool { self.0.write(a, s) }
//! #     fn copy(&mut self, f: MemRef, t: MemRef) -> bool { self.0.copy(f, t) }
//! # }
//! # impl rpcrdma_dataplane::Env for E<'_> {
//! #     fn expose(&mut self, _: MemRef, _: rpcrdma_verbs::Access) -> Option<rpcrdma_proto::Segment> { None }
//! # }
//! # let mut env = E(&mut mem);
//! let spec = CallSpec {
//!     user: 1, xid: 7, prog: 100_003, vers: 3, proc_: 0,
//!     msg: MemRef::new(app, 0, 0), args: &[], results: &[], reply: MemRef::new(app, 0, 512),
//!     auth: None,
//! };
//! conn.submit_call(&spec, &mut env).unwrap();
//! match conn.poll_work() {
//!     Some(Work::Send { buf, .. }) => assert_eq!(buf.len, 68),
//!     other => panic!("{other:?}"),
//! }
//! # Ok::<(), rpcrdma_dataplane::ConfigError>(())
//! ```

mod requester;
mod responder;
mod xids;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rpcrdma_proto::cm::PrivateData;
use rpcrdma_proto::{self as proto, v1, v2, Limits, Message, MsgType, Received, Segment};
use rpcrdma_verbs::WcStatus;

use crate::mem::{Env, MemRef};

pub use requester::{reply_inline_room, ArgPiece, CallSpec, WRITE_CHUNK_LEN};
pub use responder::{ReplySpec, ResultPiece};

/// Most DDP pieces (arguments or result buffers) of one call or reply (as the app ABI).
pub const MAX_PIECES: usize = 8;
/// Most segments the engine accepts in one received chunk, and in its own read list.
pub const MAX_SEGS: usize = 16;
/// Most Write chunks in one call.
pub const MAX_WCHUNKS: usize = 4;
/// Most Read chunks (positions, the PZRC included) in one received call.
pub const MAX_RCHUNKS: usize = 4;
/// Most memory exposures of one call (PZRC pieces, Write chunks, Reply chunk).
pub const MAX_EXPOSE: usize = 32;
/// Bytes after each send buffer reserved for the engine (RPC header of a Long message,
/// zero pad, the landing area of a Reply chunk's RPC header).
pub const SLOT_TAIL: u32 = 128;
/// A Long call's RPC header (at most [`rpcmsg::MAX_CALL_HEADER_LEN`], 60 bytes).
const TAIL_RPC: u32 = 0;
const TAIL_ZERO: u32 = 64;
/// At most 48 bytes to [`SLOT_TAIL`].
const TAIL_LAND: u32 = 80;
const _: () = assert!(crate::rpcmsg::MAX_CALL_HEADER_LEN as u32 <= TAIL_ZERO);
/// Largest transport header the engine builds (caps of `MAX_SEGS` and friends).
const HDR_LEN: usize = 1536;
/// Inline size both ends assume without RFC 8797 private data (R8166-3.3.3-e).
pub const DEFAULT_INLINE: u32 = 1024;
/// Version-two inline size once both ends speak it (V2-2.3-b, AMB-20).
pub const V2_DEFAULT_INLINE: u32 = 4096;
/// How long a version-two requester waits for the first answer before giving up (AMB-33).
pub const V2_FIRST_REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Who opened the connection (fixed for its life; xcharext's client and server).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The initiator (RDMA-CM connect).
    Client,
    /// The listener's side.
    Server,
}

/// Settings of one connection, fixed at creation.
#[derive(Clone, Copy, Debug)]
pub struct ConnConfig {
    /// Client or server.
    pub role: Role,
    /// Highest RPC-over-RDMA version to speak (1, or 2 for version two).
    pub version: u32,
    /// Credits requested in calls and granted in replies (clamped to 1..=recv_slots).
    pub credits: u32,
    /// Send buffers: `send_slots` buffers of `send_size + SLOT_TAIL` bytes; the region must
    /// allow remote read and write (Long calls and Reply chunks expose parts of it).
    pub send_pool: MemRef,
    /// Send buffers come from a pool shared by connections ([`Env::take_send`]) and go back
    /// as [`Work::Release`]; `send_pool` is unused and `send_slots` caps this connection's
    /// share.
    pub shared_send: bool,
    /// Number of send buffers (at least `credits + recv_slots + 1`: calls in flight plus
    /// answers to calls in progress; queued calls hold none).
    pub send_slots: u32,
    /// Largest Send this side transmits.
    pub send_size: u32,
    /// Receive buffers: `recv_slots` buffers of `recv_size` bytes.
    pub recv_pool: MemRef,
    /// Number of receive buffers kept posted (at least `credits`).
    pub recv_slots: u32,
    /// Receive buffer size (at least 1024, R8166-3.3.3-d).
    pub recv_size: u32,
    /// Receives come from a shared receive queue the owner feeds (`recv_pool` unused,
    /// `recv_slots` is then this connection's share: its grant and its calls in progress);
    /// messages arrive through [`Connection::handle_recv`] and buffers go back with
    /// [`Work::Release`].
    pub shared_recv: bool,
    /// Calls this side may have outstanding or queued as requester.
    pub max_calls: u32,
    /// The peer's RFC 8797 private data (`None`: absent, 1024-byte inline both ways).
    pub peer: Option<PrivateData>,
    /// Eligible items and results shorter than this stay inline (TESTPROG.md: 1024).
    pub ddp_threshold: u32,
    /// RDMA Reads this side keeps outstanding (ORD, R8166-3.3.1-j).
    pub max_reads: u32,
    /// Largest call (arguments after reassembly) accepted as responder (R8166-8.1.4-a).
    pub max_call_size: u32,
}

impl ConnConfig {
    /// Bytes of send pool needed for `send_slots` buffers of `send_size`.
    pub fn send_pool_len(send_slots: u32, send_size: u32) -> Option<u32> {
        send_slots.checked_mul(send_size.checked_add(SLOT_TAIL)?)
    }

    /// Bytes of receive pool needed for `recv_slots` buffers of `recv_size`.
    pub fn recv_pool_len(recv_slots: u32, recv_size: u32) -> Option<u32> {
        recv_slots.checked_mul(recv_size)
    }

    fn check(&self) -> Result<(), ConfigError> {
        let bad = |what| Err(ConfigError(what));
        if self.version == 0 || self.version > 2 {
            return bad("version must be 1 or 2");
        }
        if self.recv_size < DEFAULT_INLINE || self.send_size < DEFAULT_INLINE {
            return bad("send and receive buffers must hold at least 1024 bytes");
        }
        if self.credits == 0 || self.recv_slots < self.credits.min(self.recv_slots).max(1) {
            return bad("credits must be at least 1");
        }
        if self.max_calls == 0
            || self.send_slots < self.credits.min(self.recv_slots) + self.recv_slots.max(1) + 1
        {
            return bad("send_slots must cover credits plus receive slots plus one");
        }
        if self.max_reads == 0 {
            return bad("max_reads must be at least 1");
        }
        if !self.shared_send
            && Self::send_pool_len(self.send_slots, self.send_size)
                .is_none_or(|n| n > self.send_pool.len)
        {
            return bad("send pool too small");
        }
        if !self.shared_recv
            && Self::recv_pool_len(self.recv_slots, self.recv_size)
                .is_none_or(|n| n > self.recv_pool.len)
        {
            return bad("receive pool too small");
        }
        if self.recv_slots >= 1 << 15 || self.send_slots >= 1 << 24 || self.max_calls >= 1 << 24 {
            return bad("too many slots");
        }
        Ok(())
    }
}

/// A configuration the engine cannot run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConfigError(pub &'static str);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Identifies a work request of one connection in its completion (the driver carries it in
/// the `wr_id`).
pub type Tag = u32;

const K_RECV: u32 = 0;
const K_SEND: u32 = 1;
const K_READ: u32 = 2;
const K_WRITE: u32 = 3;
const K_INV: u32 = 4;
const KIND_SHIFT: u32 = 28;

#[inline]
fn tag(kind: u32, idx: u32) -> Tag {
    (kind << KIND_SHIFT) | (idx & ((1 << KIND_SHIFT) - 1))
}

/// A work request the connection wants posted, in order, on its queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// Post `buf` as a receive buffer.
    Recv {
        /// Completion tag.
        tag: Tag,
        /// The buffer.
        buf: MemRef,
    },
    /// Send `buf` (header and inline payload, already written).
    Send {
        /// Completion tag.
        tag: Tag,
        /// The bytes to send.
        buf: MemRef,
        /// Send With Invalidate of this peer key.
        invalidate: Option<u32>,
        /// Ask for a completion (selective signalling). A Send handed out while another
        /// Send is still queued behind it is unsignaled: the completion of the last one
        /// stands for it too, as a queue pair's sends complete in order. The owner must
        /// post every Send it takes; a provider may still report an unsignaled Send (errors
        /// always are), and the engine takes that as well.
        signaled: bool,
    },
    /// RDMA Read `local.len` bytes from the peer's `addr` under `rkey` into `local`.
    Read {
        /// Completion tag.
        tag: Tag,
        /// Sink.
        local: MemRef,
        /// Peer key.
        rkey: u32,
        /// Peer address.
        addr: u64,
    },
    /// RDMA Write `local` to the peer's `addr` under `rkey`.
    Write {
        /// Completion tag.
        tag: Tag,
        /// Source.
        local: MemRef,
        /// Peer key.
        rkey: u32,
        /// Peer address.
        addr: u64,
        /// Ask for a completion. The engine sets it false: a reply's Writes go just ahead
        /// of its Send, whose completion retires them (a send queue completes in order), so
        /// they need none of their own. A failed Write is reported whatever this says, and
        /// ends the connection; a provider that reports a successful unsignaled one anyway
        /// is handled too (it changes nothing).
        signaled: bool,
    },
    /// Invalidate a key this side exposed.
    Invalidate {
        /// Completion tag.
        tag: Tag,
        /// The key.
        rkey: u32,
    },
    /// Give a shared buffer back: a receive buffer to the shared receive queue (post it
    /// again; [`ConnConfig::shared_recv`]) or a send buffer to the shared send pool
    /// ([`ConnConfig::shared_send`]).
    Release {
        /// The buffer handed in by [`Connection::handle_recv`] or [`Env::take_send`].
        buf: MemRef,
    },
}

/// A work completion, as the engine needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The tag of the completed [`Work`].
    pub tag: Tag,
    /// Outcome.
    pub status: WcStatus,
    /// Bytes received (receives).
    pub byte_len: u32,
    /// For a receive of a Send With Invalidate: the key the peer invalidated.
    pub invalidated_rkey: Option<u32>,
}

/// Names a call being served (slot and generation; a stale id is refused).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ServeId {
    slot: u32,
    gen: u32,
}

impl ServeId {
    /// Packs the id into 32 bits (16-bit slot, 16-bit generation).
    pub fn to_u32(self) -> u32 {
        ((self.slot & 0xffff) << 16) | (self.gen & 0xffff)
    }

    /// Unpacks [`ServeId::to_u32`].
    pub fn from_u32(v: u32) -> ServeId {
        ServeId {
            slot: v >> 16,
            gen: v & 0xffff,
        }
    }
}

/// How a call ended at the requester.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallStatus {
    /// A reply arrived; `rpc_stat` has its accept_stat.
    Ok,
    /// The RPC was denied (MSG_DENIED).
    Denied,
    /// The responder answered RDMA_ERROR / ERR_VERS (R8166-4.5-e: permanent).
    ErrVers,
    /// The responder answered ERR_CHUNK (version 1) or BAD_HEADER (version 2).
    ErrChunk,
    /// The reply was larger than the app's reply buffer.
    ReplyTooLarge,
    /// The reply broke the upper-layer binding or the chunk rules (R8166-6.1-c/d).
    BadReply,
    /// The call could not be built or posted (too large for any transfer, exposure refused).
    Local,
    /// The connection ended before a reply.
    Closed,
    /// The owner cancelled the call ([`CallDone::lent`] if the peer may still reach its
    /// memory).
    Cancelled,
}

/// A finished call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallDone {
    /// The submitter's token.
    pub user: u64,
    /// XID.
    pub xid: u32,
    /// Outcome.
    pub status: CallStatus,
    /// accept_stat of the reply (when `status` is `Ok`).
    pub rpc_stat: u32,
    /// Bytes of reduced reply XDR placed at the start of the reply buffer.
    pub reply_len: u32,
    /// A cancelled call ([`CallStatus::Cancelled`]) whose memory the peer may still read or
    /// write: keep it until [`Event::CallReleased`] (see [`Connection::cancel_call`]).
    pub lent: bool,
    /// The first result buffer's (position, bytes placed). Only it can differ from
    /// `(reply_len, 0)`: a call offers at most one Write chunk that may be used, its first
    /// (`place_reply`), and every other result is in the reply at its end, nothing placed.
    /// Kept as this pair and a count, not a pair per buffer, the record is 32 bytes instead
    /// of 88, and every event is smaller: each is copied into and out of the event queue.
    first: (u32, u32),
    n_results: u8,
}

impl CallDone {
    /// For each result buffer, in order: (position in the reduced reply, bytes placed).
    pub fn results(&self) -> CallResults {
        CallResults {
            first: self.first,
            rest: (self.reply_len, 0),
            at: 0,
            n: self.n_results,
        }
    }

    fn failed(user: u64, xid: u32, status: CallStatus) -> CallDone {
        CallDone {
            user,
            xid,
            status,
            rpc_stat: 0,
            reply_len: 0,
            lent: false,
            first: (0, 0),
            n_results: 0,
        }
    }

    /// Turns the record into [`failed`](Self::failed) with `status` (out of line: kept off
    /// the path of the calls that succeed).
    #[cold]
    #[inline(never)]
    fn fail(&mut self, status: CallStatus) {
        *self = CallDone::failed(self.user, self.xid, status);
    }
}

/// The results of a [`CallDone`] ([`CallDone::results`]): for each result buffer, in order,
/// (position in the reduced reply, bytes placed).
#[derive(Clone, Debug)]
pub struct CallResults {
    first: (u32, u32),
    rest: (u32, u32),
    at: u8,
    n: u8,
}

impl Iterator for CallResults {
    type Item = (u32, u32);

    fn next(&mut self) -> Option<(u32, u32)> {
        if self.at >= self.n {
            return None;
        }
        let r = if self.at == 0 { self.first } else { self.rest };
        self.at += 1;
        Some(r)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = usize::from(self.n - self.at);
        (left, Some(left))
    }
}

impl ExactSizeIterator for CallResults {}

/// A call that arrived for a local app; answer with [`Connection::accept_call`] (giving a
/// buffer of at least `args_len` bytes) or [`Connection::reject_call`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IncomingCall {
    /// Handle for the answers.
    pub id: ServeId,
    /// XID.
    pub xid: u32,
    /// Program.
    pub prog: u32,
    /// Version.
    pub vers: u32,
    /// Procedure.
    pub proc_: u32,
    /// Bytes of argument XDR after reassembly.
    pub args_len: u32,
    /// The caller's AUTH_SYS identity (`None`: AUTH_NONE; other flavors but RPCSEC_GSS,
    /// which is refused, arrive as `None` too).
    pub auth: Option<rpcrdma_proto::rpc::AuthSys>,
}

/// What [`Connection::accept_call`] did with a call's arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Accepted {
    /// They are in place, `args_len` bytes at the buffer's start: nothing was left to pull
    /// (an inline call, the common case), and no [`Event::ArgsReady`] follows.
    Ready {
        /// Bytes placed.
        args_len: u32,
    },
    /// RDMA Reads are pulling them; [`Event::ArgsReady`] follows.
    Pulling,
}

/// How sending a reply ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyStatus {
    /// Sent (all RDMA Writes and the Send completed).
    Sent,
    /// The requester's chunks could not hold the reply: ERR_CHUNK was sent instead.
    ErrChunk,
    /// The connection ended first.
    Closed,
}

/// Why a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// The peer sent more calls than the granted credits.
    CreditOverrun,
    /// A work request failed (protection error, peer gone, ...).
    WorkFailed(WcStatus),
    /// Local memory could not be read or written, or a buffer ran out.
    Local(&'static str),
    /// The owner closed it (disconnect, shutdown).
    Requested,
    /// A version-two peer never answered the first call (AMB-33): reconnect with version 1.
    NoAnswer,
}

/// What the connection reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A call of this side finished.
    CallDone(CallDone),
    /// The memory of a call that ended [`CallDone::lent`] is fenced: the peer can no longer
    /// reach it, and its owner may reuse it.
    CallReleased {
        /// The submitter's token.
        user: u64,
        /// XID.
        xid: u32,
    },
    /// A call arrived for a local app.
    IncomingCall(IncomingCall),
    /// The arguments of a call accepted with [`Accepted::Pulling`] are in place
    /// (`args_len` bytes at the buffer's start).
    ArgsReady {
        /// The call.
        id: ServeId,
        /// Bytes placed.
        args_len: u32,
    },
    /// A reply given to [`Connection::submit_reply`] finished.
    ReplyDone {
        /// The call.
        id: ServeId,
        /// Outcome.
        status: ReplyStatus,
    },
    /// A call being served can no longer be answered (connection lost).
    ServeAborted {
        /// The call.
        id: ServeId,
    },
    /// A version-two RDMA2_OPTIONAL message arrived (for the control plane); the body is
    /// copied out, `len` bytes of `optinfo`.
    Optional(Box<OptionalMsg>),
    /// The connection ended; every outstanding call has been reported.
    Closed(CloseReason),
}

/// Bytes of an RDMA2_OPTIONAL body the engine hands to the control plane.
pub const MAX_OPTINFO: usize = 256;

/// A received RDMA2_OPTIONAL message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionalMsg {
    /// `rdma_xid`.
    pub xid: u32,
    /// `rdma_optdir`.
    pub direction: MsgType,
    /// `rdma_opttype`.
    pub opttype: u32,
    len: u16,
    body: [u8; MAX_OPTINFO],
}

impl OptionalMsg {
    /// The `rdma_optinfo` bytes.
    pub fn optinfo(&self) -> &[u8] {
        self.body.get(..usize::from(self.len)).unwrap_or(&[])
    }
}

/// Why a submission was refused (the call or reply is not in the engine).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// Every call slot is in use: retry after a completion.
    Busy,
    /// The connection has ended.
    Closed,
    /// The request is malformed (too many pieces, ranges out of order).
    Invalid(&'static str),
    /// The id does not name a call in the state the operation needs.
    BadId,
}

/// Counters of one connection (read by the control plane through the poll thread).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Calls sent as requester.
    pub calls_sent: u64,
    /// Replies received as requester.
    pub replies_received: u64,
    /// Calls received as responder.
    pub calls_received: u64,
    /// Replies sent as responder.
    pub replies_sent: u64,
    /// Short (inline) messages sent.
    pub short_sent: u64,
    /// Long calls (RDMA_NOMSG with a PZRC) sent.
    pub long_calls: u64,
    /// Long replies (Reply chunk) sent.
    pub long_replies: u64,
    /// Read chunks offered.
    pub read_chunks: u64,
    /// Write chunks offered.
    pub write_chunks: u64,
    /// Reply chunks offered (a call whose reply buffer may not fit the reply threshold).
    pub reply_chunks: u64,
    /// Payload bytes moved by RDMA Read.
    pub read_bytes: u64,
    /// Payload bytes moved by RDMA Write.
    pub write_bytes: u64,
    /// Error messages sent (ERR_VERS, ERR_CHUNK, BAD_HEADER, INVAL_OPTION).
    pub errors_sent: u64,
    /// Error messages received.
    pub errors_received: u64,
    /// Error messages sent, by code (they add up to `errors_sent`).
    pub errors_sent_by: ErrorCounts,
    /// Error messages received, by code (they add up to `errors_received`).
    pub errors_received_by: ErrorCounts,
    /// Messages dropped silently (too short, header errors in replies, unknown XIDs).
    pub dropped: u64,
    /// Times a call waited for a credit.
    pub credit_stalls: u64,
    /// Replies refused for breaking the chunk rules or the program's binding (a chunk echoed
    /// wrongly, a result where the binding does not allow it, R8166-6.1-c/d): their calls end
    /// [`CallStatus::BadReply`].
    pub bad_replies: u64,
    /// Local invalidations posted.
    pub invalidations: u64,
    /// Local invalidations skipped because the peer used Send With Invalidate.
    pub remote_invalidations: u64,
    /// Replies sent with Send With Invalidate (the requester allowed it and offered one key).
    pub replies_with_invalidate: u64,
}

/// RDMA_ERROR / RDMA2_ERROR messages counted by error code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorCounts {
    /// ERR_VERS (version 1, or a bare ERR_VERS of an unknown version) and RDMA2_ERR_VERS.
    pub vers: u64,
    /// ERR_CHUNK (version 1).
    pub chunk: u64,
    /// RDMA2_ERR_BAD_HEADER (version two).
    pub bad_header: u64,
    /// RDMA2_ERR_INVAL_OPTION (version two).
    pub inval_option: u64,
}

impl ErrorCounts {
    /// Counts one error of `code`.
    #[inline]
    pub fn count(&mut self, code: &proto::ErrorCode) {
        let n = match code {
            proto::ErrorCode::Vers { .. } => &mut self.vers,
            proto::ErrorCode::Chunk => &mut self.chunk,
            proto::ErrorCode::BadHeader => &mut self.bad_header,
            proto::ErrorCode::InvalOption => &mut self.inval_option,
        };
        *n += 1;
    }

    /// All errors counted.
    pub fn total(&self) -> u64 {
        self.vers + self.chunk + self.bad_header + self.inval_option
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SendOwner {
    Free,
    /// Released by its owner while its Send is still in flight: freed on completion.
    Orphan,
    /// A call of the requester (held until the call ends).
    Call,
    /// A reply or error from the responder (freed when the Send completes).
    Serve(u32),
    /// An error or optional message owning nothing else.
    Bare,
}

/// One connection's state machine.
#[derive(Debug)]
pub struct Connection {
    cfg: ConnConfig,
    limits: Limits,
    /// Version used for this side's calls (falls back to 1 on ERR_VERS).
    vers: u32,
    /// Inline threshold for messages this side sends.
    send_threshold: u32,
    /// [`threshold`](Self::threshold), kept up to date by
    /// [`set_threshold`](Self::set_threshold) whenever what it depends on changes: every
    /// call and reply sent asks for it.
    threshold_now: u32,
    /// Inline threshold for messages the peer sends (decides the Reply chunk).
    recv_threshold: u32,
    /// [`reply_inline_room`]`(recv_threshold, vers)`, kept up to date by
    /// [`set_threshold`](Self::set_threshold), which runs after every change to either:
    /// every call sent asks for it.
    reply_room: u32,
    /// The receive size this side announced (RFC 8797; its receive buffers unless told
    /// otherwise) and the peer's largest Send: version one's `recv_threshold` is their
    /// minimum, the size the peer itself computes (R8166-3.3.2-a).
    own_recv: u32,
    peer_send: u32,
    /// The peer accepts Send With Invalidate (RFC 8797 flag).
    peer_takes_inv: bool,
    /// A version-two message from the peer has been seen (V2-5.1-a).
    v2_confirmed: bool,
    /// The peer's XCHAR_RBSIZ, once learned.
    peer_rbsiz: Option<u32>,
    /// Cap on what this side sends while its REQXCH lowering the peer's RBSIZ is
    /// outstanding (XCH-3.1-d); `u32::MAX` when none.
    peer_cap: u32,
    /// The XCHAR_RBSIZ this side announced, once set (version two).
    own_rbsiz: Option<u32>,
    /// When the first version-two call was seen going out (set at the next timer run).
    first_sent: Option<Instant>,
    first_pending: bool,
    first_timeout: Duration,
    closed: Option<CloseReason>,
    work: VecDeque<Work>,
    events: VecDeque<Event>,
    /// Where a received message is copied before it is read. A boxed slice, not a `Vec`:
    /// it is taken out and put back around every message's handling (which borrows the
    /// connection), and a slice moves as two words, not three.
    scratch: Box<[u8]>,
    /// Where transport headers are built (reused: no per-message zeroing).
    hdr: Vec<u8>,
    send_owner: Vec<SendOwner>,
    /// The buffer of each send slot (fixed, or taken from the shared pool while in use).
    send_bufs: Vec<MemRef>,
    /// The buffer of each receive slot of the own pool, computed once (every receive
    /// completion names its slot); empty with a shared receive queue.
    recv_bufs: Vec<MemRef>,
    /// Per send buffer: a Send from it has not completed yet.
    send_busy: Vec<bool>,
    /// Sends handed out by `poll_work` and not yet completed, by slot, in posting order
    /// (a slot is in it at most once: it is not reused before its Send completes).
    send_order: VecDeque<u32>,
    /// `Work::Send`s in `work`, not yet handed out.
    sends_queued: u32,
    send_free: Vec<u32>,
    /// Send buffers held by calls of the requester.
    call_sends: u32,
    recv_posted: u32,
    // Requester.
    calls: Vec<requester::Call>,
    /// Each call slot's credential (`CallSpec::auth`), beside the slots rather than in them:
    /// in the record, it made the record's copy in `Call::reset` cost more for every call.
    call_auth: Vec<Option<rpcrdma_proto::rpc::AuthSys>>,
    /// The calls sent and unanswered, by XID (what `find_call` looks up), cancelled ones
    /// included: each holds its XID and credit until its late reply.
    sent: xids::XidIndex,
    call_free: Vec<u32>,
    queued: VecDeque<u32>,
    granted: u32,
    in_flight: u32,
    // Responder.
    serves: Vec<responder::Serve>,
    serve_free: Vec<u32>,
    grant: u32,
    /// The highest grant this side has advertised: a peer may still act on it after a
    /// lowered grant, until it has seen a reply carrying the new one (R8166-3.3.1-f), and
    /// nothing tells the responder when that is; so the overrun check uses this.
    grant_peak: u32,
    in_process: u32,
    reads: VecDeque<responder::PendingRead>,
    reads_out: u32,
    stats: Stats,
}

impl Connection {
    /// A new connection; its receive buffers are queued as [`Work::Recv`] at once, so post
    /// them before the peer may send (before accepting or completing the connect).
    pub fn new(cfg: ConnConfig) -> Result<Connection, ConfigError> {
        cfg.check()?;
        let (peer_send, peer_recv, peer_inv) = match cfg.peer {
            Some(p) => (p.send_size, p.recv_size, p.remote_invalidate),
            None => (DEFAULT_INLINE, DEFAULT_INLINE, false),
        };
        let grant = Self::grant_for(&cfg);
        let mut c = Connection {
            limits: Limits {
                max_read_segments: MAX_SEGS,
                max_read_chunks: MAX_RCHUNKS,
                max_write_chunks: MAX_WCHUNKS,
                max_segments_per_chunk: MAX_SEGS,
                max_version: cfg.version,
            },
            vers: cfg.version,
            // R8166-3.3.2-a: min(own largest Send, peer's receive buffers); version two
            // starts at 1024 until the peer confirms (AMB-20).
            send_threshold: cfg.send_size.min(peer_recv),
            threshold_now: 0,
            recv_threshold: peer_send.min(cfg.recv_size),
            reply_room: 0,
            own_recv: cfg.recv_size,
            peer_send,
            peer_takes_inv: peer_inv,
            v2_confirmed: false,
            peer_rbsiz: None,
            peer_cap: u32::MAX,
            own_rbsiz: None,
            first_sent: None,
            first_pending: false,
            first_timeout: V2_FIRST_REPLY_TIMEOUT,
            closed: None,
            work: VecDeque::with_capacity(64),
            events: VecDeque::with_capacity(16),
            scratch: vec![0; cfg.recv_size as usize].into_boxed_slice(),
            hdr: vec![0; HDR_LEN],
            send_owner: vec![SendOwner::Free; cfg.send_slots as usize],
            send_busy: vec![false; cfg.send_slots as usize],
            send_order: VecDeque::with_capacity(cfg.send_slots as usize),
            sends_queued: 0,
            send_bufs: (0..cfg.send_slots)
                .map(|i| {
                    let stride = cfg.send_size + SLOT_TAIL;
                    i.checked_mul(stride)
                        .and_then(|o| cfg.send_pool.sub(o, stride))
                        .unwrap_or_default()
                })
                .collect(),
            send_free: (0..cfg.send_slots).rev().collect(),
            recv_bufs: if cfg.shared_recv {
                Vec::new()
            } else {
                (0..cfg.recv_slots)
                    .map_while(|slot| recv_slot_buf(&cfg, slot))
                    .collect()
            },
            call_sends: 0,
            recv_posted: 0,
            calls: (0..cfg.max_calls)
                .map(|_| requester::Call::default())
                .collect(),
            call_auth: vec![None; cfg.max_calls as usize],
            sent: xids::XidIndex::new(cfg.max_calls),
            call_free: (0..cfg.max_calls).rev().collect(),
            queued: VecDeque::with_capacity(cfg.max_calls as usize),
            granted: 1,
            in_flight: 0,
            // Calls in progress (up to the grant, at most recv_slots) plus replies posted and
            // not yet completed, whose slots the peer's next calls must not find taken.
            serves: (0..2 * cfg.recv_slots)
                .map(|_| responder::Serve::default())
                .collect(),
            serve_free: (0..2 * cfg.recv_slots).rev().collect(),
            grant,
            grant_peak: grant,
            in_process: 0,
            reads: VecDeque::with_capacity(32),
            reads_out: 0,
            stats: Stats::default(),
            cfg,
        };
        c.set_threshold();
        if !cfg.shared_recv {
            for slot in 0..cfg.recv_slots {
                c.post_recv(slot);
            }
        }
        Ok(c)
    }

    /// The grant this side gives as responder: its credits on a server; on a client, the
    /// receive buffers left after the forward replies, for backward calls (RFC 8167).
    fn grant_for(cfg: &ConnConfig) -> u32 {
        match cfg.role {
            Role::Server => cfg.credits.clamp(1, cfg.recv_slots),
            Role::Client => cfg.recv_slots.saturating_sub(cfg.credits).max(1),
        }
    }

    /// Changes the credits requested (and, on a server, granted) from the next message on
    /// (R8166-3.3.1-f). Every receive buffer stays posted, so a raised grant is always
    /// covered by posted receives (R8166-3.3.1-g); it never exceeds them. After a lowered
    /// grant the peer may keep as many calls outstanding as the highest grant it was ever
    /// sent (it cannot have seen the new one yet); only more than that is an overrun.
    pub fn set_credits(&mut self, credits: u32) {
        self.cfg.credits = credits.clamp(1, self.cfg.recv_slots);
        self.grant = Self::grant_for(&self.cfg);
        self.grant_peak = self.grant_peak.max(self.grant);
    }

    /// The grant this side sends as responder.
    pub fn grant(&self) -> u32 {
        self.grant
    }

    /// Lowers the caps on what a received header may carry: `segments` per chunk (and in the
    /// whole Read list), `chunks` per list. Beyond them a call is answered ERR_CHUNK
    /// (R8166-4.5.2-a); the engine's own capacity (`MAX_SEGS`, `MAX_RCHUNKS`, `MAX_WCHUNKS`)
    /// bounds both.
    pub fn set_chunk_caps(&mut self, segments: u32, chunks: u32) {
        let seg = (segments as usize).clamp(1, MAX_SEGS);
        let ch = chunks as usize;
        self.limits.max_read_segments = seg;
        self.limits.max_segments_per_chunk = seg;
        self.limits.max_read_chunks = ch.clamp(1, MAX_RCHUNKS);
        self.limits.max_write_chunks = ch.clamp(1, MAX_WCHUNKS);
    }

    /// Sets how long a version-two call waits for the first answer (AMB-33).
    pub fn set_first_reply_timeout(&mut self, t: Duration) {
        self.first_timeout = t;
    }

    /// Inline threshold for what this side sends now: 1024 until version two is confirmed
    /// (V2-5-b), then as learned.
    #[inline]
    fn threshold(&self) -> u32 {
        self.threshold_now
    }

    /// [`reply_inline_room`] at this connection's reply threshold and version, as kept by
    /// [`set_threshold`](Self::set_threshold).
    #[inline]
    fn reply_room(&self) -> u32 {
        debug_assert_eq!(
            self.reply_room,
            reply_inline_room(self.recv_threshold, self.vers)
        );
        self.reply_room
    }

    /// Recomputes [`threshold`](Self::threshold) and the reply room; called after every
    /// change to the send or receive threshold, the cap, the version or its confirmation.
    fn set_threshold(&mut self) {
        self.reply_room = reply_inline_room(self.recv_threshold, self.vers);
        let t = self.send_threshold.min(self.peer_cap);
        self.threshold_now = if self.vers == v2::VERSION && !self.v2_confirmed {
            t.min(DEFAULT_INLINE)
        } else {
            t
        };
    }

    /// The peer answered in version two: both sides now use its defaults (V2-5.1-a,
    /// AMB-20), or the receive size it announced.
    fn confirm_v2(&mut self) {
        if self.v2_confirmed {
            return;
        }
        self.v2_confirmed = true;
        self.first_pending = false;
        self.first_sent = None;
        self.send_threshold = self
            .cfg
            .send_size
            .min(self.peer_rbsiz.unwrap_or(V2_DEFAULT_INLINE));
        self.recv_threshold = self
            .cfg
            .recv_size
            .min(self.own_rbsiz.unwrap_or(V2_DEFAULT_INLINE));
        self.set_threshold();
    }

    /// A server offering version two learns the connection's version from the client's
    /// calls: a version-two client's first message is version two (V2-5-b), so a version-1
    /// call before any version-two message means a version-1 client, and this side's own
    /// calls on the connection (backward direction) go in version 1 from then on, as its
    /// replies already do (V2-5.3-a). Without this a backward call went in version two to a
    /// client that cannot read it.
    #[inline]
    fn learn_client_version(&mut self, vers: u32) {
        // Runs for every call received: the test that fails on any connection not (or no
        // longer) offering version two comes first.
        if self.vers == v2::VERSION
            && !self.v2_confirmed
            && vers == v1::VERSION
            && self.cfg.role == Role::Server
        {
            self.vers = v1::VERSION;
            self.set_threshold();
        }
    }

    /// Whether [`handle_timeout`](Self::handle_timeout) has anything to do.
    pub fn wants_timer(&self) -> bool {
        self.first_pending && self.closed.is_none()
    }

    /// The configuration.
    pub fn config(&self) -> &ConnConfig {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Inline thresholds in force: (messages this side sends, messages the peer sends).
    pub fn thresholds(&self) -> (u32, u32) {
        (self.threshold(), self.recv_threshold)
    }

    /// The credit limit this side's calls obey now (min of requested and granted).
    #[inline]
    pub fn credit_limit(&self) -> u32 {
        self.cfg.credits.min(self.granted).max(1)
    }

    /// Calls of this side sent and not yet answered.
    pub fn calls_in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Receive buffers currently posted.
    pub fn recv_posted(&self) -> u32 {
        self.recv_posted
    }

    /// Send slots free now (with a shared send pool, slots hold no buffer while free).
    pub fn send_free(&self) -> u32 {
        self.send_free.len() as u32
    }

    /// The RPC-over-RDMA version this side's calls use.
    pub fn version(&self) -> u32 {
        self.vers
    }

    /// Why the connection ended, if it has.
    pub fn closed(&self) -> Option<CloseReason> {
        self.closed
    }

    /// The next work request to post.
    #[inline]
    pub fn poll_work(&mut self) -> Option<Work> {
        let mut w = self.work.pop_front()?;
        hand_out(&mut w, &mut self.sends_queued, &mut self.send_order);
        Some(w)
    }

    /// Hands the queued work requests to `post`, in order, as [`poll_work`] until `None`
    /// would, and stops at the first that `post` refuses: that one and those before it
    /// are gone from the queue, the rest stay (the owner typically closes the connection
    /// then, and drains again what is left to give back). Walking the queue as one slice,
    /// then clearing it, spares each request the pop's own bookkeeping (head, length,
    /// wrap), which `poll_work` pays per request.
    ///
    /// [`poll_work`]: Self::poll_work
    #[inline]
    pub fn drain_work<E>(&mut self, mut post: impl FnMut(Work) -> Result<(), E>) -> Result<(), E> {
        let mut sends = self.sends_queued;
        // One slice: the queue is cleared after every drain, which puts its head back at
        // the start, so it is contiguous already but after a refusal (then this moves the
        // requests left into place, without allocating). Walking two halves as a chain
        // checked at every step which half it was in.
        let mut done = 0;
        let mut refused = None;
        for &w in self.work.make_contiguous().iter() {
            let mut w = w;
            hand_out(&mut w, &mut sends, &mut self.send_order);
            done += 1;
            if let Err(e) = post(w) {
                refused = Some(e);
                break;
            }
        }
        self.sends_queued = sends;
        match refused {
            None => {
                self.work.clear();
                Ok(())
            }
            Some(e) => {
                self.work.drain(..done);
                Err(e)
            }
        }
    }

    /// The next event.
    #[inline]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) wants to run next: the deadline of the
    /// first version-two call (AMB-33); none in version 1.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.first_sent
            .filter(|_| self.first_pending)
            .map(|t| t + self.first_timeout)
    }

    /// Runs timers at `now`: a version-two connection whose first call got no answer in
    /// time ends with [`CloseReason::NoAnswer`], and the owner reconnects speaking
    /// version 1 (V2-5.2-b).
    pub fn handle_timeout(&mut self, now: Instant) {
        if !self.wants_timer() {
            return;
        }
        match self.first_sent {
            None => self.first_sent = Some(now),
            Some(t) if now >= t + self.first_timeout => self.close(CloseReason::NoAnswer),
            Some(_) => {}
        }
    }

    /// Ends the connection (owner's decision, or the provider reported it lost): every
    /// outstanding call completes with [`CallStatus::Closed`].
    pub fn close(&mut self, reason: CloseReason) {
        if self.closed.is_some() {
            return;
        }
        self.closed = Some(reason);
        // Nothing more is posted, but buffers already on their way back to a shared pool
        // still go (dropping them would shrink the pool for every other connection).
        self.work.retain(|w| matches!(w, Work::Release { .. }));
        self.sends_queued = 0;
        self.reads.clear();
        if self.cfg.shared_recv {
            for s in &mut self.serves {
                if let Some(buf) = s.take_recv() {
                    self.work.push_back(Work::Release { buf });
                }
            }
        }
        // A buffer whose Send is still posted may yet be read by the device until the queue
        // pair is destroyed: it goes back at `teardown`, never to another connection's
        // message while this one's peer could still receive it.
        self.release_shared_sends(false);
        self.sent.clear();
        for i in 0..self.calls.len() {
            if let Some(ev) = self.calls.get_mut(i).and_then(requester::Call::abort) {
                self.events.push_back(ev);
            }
        }
        self.queued.clear();
        for i in 0..self.serves.len() {
            if let Some(ev) = self.serves.get_mut(i).and_then(|s| s.abort(i as u32)) {
                self.events.push_back(ev);
            }
        }
        self.events.push_back(Event::Closed(reason));
    }

    /// The closed connection's queue pair is destroyed: the shared send buffers its last
    /// Sends were reading go back (as [`Work::Release`]). Before that, nothing the device
    /// may still read is handed to another connection.
    pub fn teardown(&mut self) {
        if self.closed.is_some() {
            self.release_shared_sends(true);
        }
    }

    /// Gives back the shared send buffers this closed connection holds, those under a Send
    /// still posted only if `posted_too` (the queue pair is gone); the others stay orphans.
    fn release_shared_sends(&mut self, posted_too: bool) {
        if !self.cfg.shared_send {
            return;
        }
        let slots = self.send_owner.iter_mut().zip(self.send_bufs.iter_mut());
        for ((o, b), busy) in slots.zip(self.send_busy.iter_mut()) {
            match (*o, *busy && !posted_too) {
                (SendOwner::Free, _) => {}
                (_, true) => *o = SendOwner::Orphan,
                (_, false) => {
                    *o = SendOwner::Free;
                    *busy = false;
                    self.work.push_back(Work::Release {
                        buf: std::mem::take(b),
                    });
                }
            }
        }
    }

    /// Feeds one work completion (of a [`Work`] this connection asked for).
    pub fn handle_completion(&mut self, now: Instant, wc: &Completion, env: &mut impl Env) {
        self.complete(now, wc, env);
    }

    /// Feeds work completions in order, exactly as one [`handle_completion`] call for each
    /// would: the calls and Reads a completion lets go start before the next one is handled
    /// (left to the batch's end, they would be queued in another order, and a call could
    /// start under other credits). One call for a batch polled from a completion queue pays
    /// the entry point's frame and the caller's loop once.
    ///
    /// [`handle_completion`]: Self::handle_completion
    pub fn handle_completions(&mut self, now: Instant, wcs: &[Completion], env: &mut impl Env) {
        for wc in wcs {
            self.complete(now, wc, env);
        }
    }

    /// One completion, then the queued calls and Reads it may let go.
    #[inline(always)]
    fn complete(&mut self, now: Instant, wc: &Completion, env: &mut impl Env) {
        if self.closed.is_some() {
            return;
        }
        let idx = wc.tag & ((1 << KIND_SHIFT) - 1);
        let kind = wc.tag >> KIND_SHIFT;
        if wc.status != WcStatus::Success {
            self.close(CloseReason::WorkFailed(wc.status));
            return;
        }
        match kind {
            K_RECV => self.on_recv(now, idx, wc.byte_len, wc.invalidated_rkey, env),
            K_SEND => self.on_send_completion(idx),
            K_READ => self.on_read_done(idx, env),
            // Only a provider that reports unsignaled work sends this: the reply's Send,
            // which follows its Writes, says when the serve is done.
            K_WRITE => {}
            K_INV => self.on_invalidate_done(idx),
            _ => {}
        }
        self.pump(env);
    }

    /// Receive slot `slot`'s buffer: from the table; a slot past it (a completion for no
    /// receive this side posted) is computed, as the table's entries were.
    #[inline]
    fn recv_buf(&self, slot: u32) -> Option<MemRef> {
        match self.recv_bufs.get(slot as usize) {
            Some(&b) => Some(b),
            None => recv_slot_buf(&self.cfg, slot),
        }
    }

    #[inline]
    fn send_buf(&self, slot: u32) -> Option<MemRef> {
        self.send_bufs
            .get(slot as usize)
            .copied()
            .filter(|b| b.len == self.cfg.send_size + SLOT_TAIL)
    }

    #[inline]
    fn send_tail(&self, slot: u32, off: u32, len: u32) -> Option<MemRef> {
        self.send_buf(slot)?.sub(self.cfg.send_size + off, len)
    }

    #[inline]
    fn post_recv(&mut self, slot: u32) {
        if self.closed.is_some() {
            return;
        }
        if let Some(buf) = self.recv_buf(slot) {
            self.recv_posted += 1;
            self.work.push_back(Work::Recv {
                tag: tag(K_RECV, slot),
                buf,
            });
        }
    }

    fn alloc_send(&mut self, owner: SendOwner, env: &mut impl Env) -> Option<u32> {
        // Taken at once (one look at the free list); put back if no buffer comes with it.
        let s = self.send_free.pop()?;
        if self.cfg.shared_send {
            let buf = env
                .take_send()
                .filter(|b| b.len == self.cfg.send_size + SLOT_TAIL);
            match (buf, self.send_bufs.get_mut(s as usize)) {
                (Some(buf), Some(b)) => *b = buf,
                _ => {
                    self.send_free.push(s);
                    return None;
                }
            }
        }
        if let Some(o) = self.send_owner.get_mut(s as usize) {
            *o = owner;
        }
        Some(s)
    }

    /// Releases a send buffer; one whose Send has not completed is reused only after it has
    /// (a stale completion must never be taken for a later owner's).
    fn free_send(&mut self, slot: u32) {
        let busy = self.send_busy.get(slot as usize).copied().unwrap_or(false);
        if let Some(o) = self.send_owner.get_mut(slot as usize) {
            match (*o, busy) {
                (SendOwner::Free, _) => {}
                (_, true) => *o = SendOwner::Orphan,
                (_, false) => {
                    *o = SendOwner::Free;
                    self.send_free.push(slot);
                    if self.cfg.shared_send {
                        if let Some(b) = self.send_bufs.get_mut(slot as usize) {
                            let buf = std::mem::take(b);
                            self.work.push_back(Work::Release { buf });
                        }
                    }
                }
            }
        }
    }

    #[inline]
    fn queue_send(&mut self, slot: u32, buf: MemRef, invalidate: Option<u32>) {
        if let Some(b) = self.send_busy.get_mut(slot as usize) {
            *b = true;
        }
        self.sends_queued += 1;
        self.work.push_back(Work::Send {
            tag: tag(K_SEND, slot),
            buf,
            invalidate,
            signaled: true,
        });
    }

    /// The Send from `slot` completed, and with it every Send posted before it (those were
    /// unsignaled, or their completions came first). A completion for a slot with no Send
    /// in flight is stale and ignored.
    fn on_send_completion(&mut self, slot: u32) {
        if !self.send_busy.get(slot as usize).copied().unwrap_or(false) {
            return;
        }
        while let Some(s) = self.send_order.pop_front() {
            self.on_send_done(s);
            if s == slot {
                break;
            }
        }
    }

    fn on_send_done(&mut self, slot: u32) {
        if let Some(b) = self.send_busy.get_mut(slot as usize) {
            *b = false;
        }
        match self.send_owner.get(slot as usize).copied() {
            Some(SendOwner::Orphan) => self.free_send(slot),
            Some(SendOwner::Serve(i)) => {
                self.free_send(slot);
                self.serve_sent(i);
            }
            Some(SendOwner::Bare) => self.free_send(slot),
            // A call's buffer stays until the call ends (its tail holds the Reply chunk's
            // landing area and the Long call's RPC header).
            _ => {}
        }
    }

    /// Writes `hdr` (and nothing else) into a fresh send buffer and queues the Send.
    fn send_bytes(&mut self, owner: SendOwner, hdr: &[u8], env: &mut impl Env) -> bool {
        let Some(slot) = self.alloc_send(owner, env) else {
            self.close(CloseReason::Local("no send buffer"));
            return false;
        };
        let Some(buf) = self.send_buf(slot).and_then(|b| b.prefix(hdr.len() as u32)) else {
            self.close(CloseReason::Local("send buffer"));
            return false;
        };
        if !env.write(buf, hdr) {
            self.close(CloseReason::Local("send buffer write"));
            return false;
        }
        self.queue_send(slot, buf, None);
        true
    }

    fn send_error(&mut self, e: proto::ErrorReply, env: &mut impl Env) {
        let mut b = [0u8; 28];
        let Ok(n) = e.emit(&mut b) else { return };
        self.stats.errors_sent += 1;
        self.stats.errors_sent_by.count(&e.code);
        self.send_bytes(SendOwner::Bare, b.get(..n).unwrap_or(&[]), env);
    }

    /// Answers a call that failed header checks with the error its version calls for.
    fn send_chunk_error(&mut self, xid: u32, vers: u32, env: &mut impl Env) {
        let code = if vers == v2::VERSION {
            proto::ErrorCode::BadHeader
        } else {
            proto::ErrorCode::Chunk
        };
        self.send_error(
            proto::ErrorReply {
                xid,
                vers,
                credit: self.grant,
                code,
            },
            env,
        );
    }

    fn on_recv(
        &mut self,
        now: Instant,
        slot: u32,
        byte_len: u32,
        inv: Option<u32>,
        env: &mut impl Env,
    ) {
        self.recv_posted = self.recv_posted.saturating_sub(1);
        let Some(buf) = self.recv_buf(slot) else {
            return self.close(CloseReason::Local("receive buffer"));
        };
        if self.receive(now, buf, byte_len, inv, env) {
            // `release_recv` without finding the slot again from the buffer.
            if self.cfg.shared_recv {
                self.release_recv(buf);
            } else {
                self.repost_recv(slot, buf);
            }
        }
    }

    /// A message arrived in `buf`, a buffer of the shared receive queue
    /// ([`ConnConfig::shared_recv`]); the buffer comes back as [`Work::Release`], at once or
    /// once the call it holds has been placed.
    pub fn handle_recv(
        &mut self,
        now: Instant,
        buf: MemRef,
        byte_len: u32,
        invalidated_rkey: Option<u32>,
        env: &mut impl Env,
    ) {
        if self.closed.is_some() {
            self.work.push_back(Work::Release { buf });
            return;
        }
        if self.receive(now, buf, byte_len, invalidated_rkey, env) {
            self.release_recv(buf);
        }
        self.pump(env);
    }

    /// Returns a receive buffer: reposted if it is one of ours, released if shared.
    #[inline]
    pub(super) fn release_recv(&mut self, buf: MemRef) {
        if self.cfg.shared_recv {
            self.work.push_back(Work::Release { buf });
            return;
        }
        let off = buf.offset.saturating_sub(self.cfg.recv_pool.offset);
        let slot = off / u64::from(self.cfg.recv_size.max(1));
        self.repost_recv(slot as u32, buf);
    }

    /// Posts `buf`, the own receive buffer of `slot` (what `recv_buf(slot)` gave the
    /// receive), again: as it is, not rebuilt from the slot.
    fn repost_recv(&mut self, slot: u32, buf: MemRef) {
        if self.closed.is_some() {
            return;
        }
        self.recv_posted += 1;
        self.work.push_back(Work::Recv {
            tag: tag(K_RECV, slot),
            buf,
        });
    }

    /// Reads and routes one message received in `buf`; true if the buffer may go back now
    /// (its message is handled, and no call holds it).
    fn receive(
        &mut self,
        now: Instant,
        buf: MemRef,
        byte_len: u32,
        inv: Option<u32>,
        env: &mut impl Env,
    ) -> bool {
        let n = byte_len.min(self.cfg.recv_size).min(buf.len);
        let mut scratch = std::mem::take(&mut self.scratch);
        let ok = match (buf.prefix(n), scratch.get_mut(..n as usize)) {
            (Some(at), Some(dst)) => env.read(at, dst),
            _ => false,
        };
        let release = if ok {
            let msg = scratch.get(..n as usize).unwrap_or(&[]);
            !self.dispatch(now, buf, msg, inv, env)
        } else {
            self.close(CloseReason::Local("receive buffer read"));
            false
        };
        // Put back. What `take` left in its place is an empty slice, which owns no memory:
        // forgotten rather than dropped, which would test its length again.
        std::mem::forget(std::mem::replace(&mut self.scratch, scratch));
        release
    }

    /// Routes one received message; true if its receive buffer is kept (a call whose
    /// inline payload is copied later), false if it may be reposted now.
    fn dispatch(
        &mut self,
        now: Instant,
        slot: MemRef,
        msg: &[u8],
        inv: Option<u32>,
        env: &mut impl Env,
    ) -> bool {
        // The common case, a Short message without chunks, is read from its fixed layout
        // (what `decode` would return for it, without building the general header value).
        if let Some(s) = proto::decode_short(msg, &self.limits) {
            if s.vers == v2::VERSION {
                // `decode_short` has checked that the RPC message's direction matches.
                self.confirm_v2();
            }
            let payload = msg.get(s.header_len..).unwrap_or(&[]);
            // A promoted constant: no chunk lists are built per message.
            return self.on_msg(
                now,
                slot,
                s.vers,
                s.xid,
                s.credit,
                &proto::ChunkLists::EMPTY,
                s.header_len,
                payload,
                inv,
                env,
            );
        }
        self.dispatch_general(now, slot, msg, inv, env)
    }

    /// Routes a message that is not a Short one without chunks (`dispatch`'s other case).
    /// Not inlined: the completion handler then holds one inlined copy of the call's
    /// delivery (`prepare_call`, through `on_msg`) instead of three.
    #[inline(never)]
    fn dispatch_general(
        &mut self,
        now: Instant,
        slot: MemRef,
        msg: &[u8],
        inv: Option<u32>,
        env: &mut impl Env,
    ) -> bool {
        // Matched by reference: the decoded header is large, and only a few of its words
        // are read per message.
        let decoded = proto::decode_general(msg, &self.limits);
        let d = match &decoded {
            Ok(d) => d,
            Err(rej) => {
                // A header error in a reply is dropped; in a call it is answered. A message
                // whose XID matches a call of ours is taken as a reply.
                let received = match rej.fixed {
                    Some(f) if self.find_call(f.xid).is_some() => Received::Reply,
                    Some(_) => Received::Call,
                    None => Received::Reply,
                };
                match rej.reply(received, self.grant, &self.limits) {
                    Some(e) => self.send_error(e, env),
                    None => self.stats.dropped += 1,
                }
                return false;
            }
        };
        let payload = msg.get(d.header_len..).unwrap_or(&[]);
        match &d.message {
            Message::V1(h) => {
                let credit = h.credit;
                match &h.body {
                    v1::Body::Msg(c) => self.on_msg(
                        now,
                        slot,
                        1,
                        h.xid,
                        credit,
                        c,
                        d.header_len,
                        payload,
                        inv,
                        env,
                    ),
                    v1::Body::Nomsg(c) => self.on_nomsg(now, slot, 1, h.xid, credit, c, inv, env),
                    v1::Body::Error(e) => {
                        let (status, code) = match *e {
                            v1::ErrorBody::Vers { low, high } => {
                                (CallStatus::ErrVers, proto::ErrorCode::Vers { low, high })
                            }
                            v1::ErrorBody::Chunk => (CallStatus::ErrChunk, proto::ErrorCode::Chunk),
                        };
                        self.count_error_received(&code);
                        self.on_error_reply(h.xid, status, env);
                        false
                    }
                }
            }
            Message::V2(h) => match &h.body {
                v2::Body::Msg { direction, chunks } => {
                    let direction = *direction;
                    self.confirm_v2();
                    if proto::rpc::msg_type(payload) != Some(direction) {
                        self.reject_direction(h.xid, direction, env);
                        return false;
                    }
                    self.on_msg(
                        now,
                        slot,
                        2,
                        h.xid,
                        h.credit,
                        chunks,
                        d.header_len,
                        payload,
                        inv,
                        env,
                    )
                }
                v2::Body::Nomsg { direction, chunks } => {
                    let direction = *direction;
                    self.confirm_v2();
                    let call = chunks.reads.has_position_zero();
                    if call != (direction == MsgType::Call) {
                        self.reject_direction(h.xid, direction, env);
                        return false;
                    }
                    self.on_nomsg(now, slot, 2, h.xid, h.credit, chunks, inv, env)
                }
                v2::Body::Error(e) => {
                    let (status, code) = match *e {
                        v2::ErrorBody::Vers { low, high } => {
                            (CallStatus::ErrVers, proto::ErrorCode::Vers { low, high })
                        }
                        v2::ErrorBody::BadHeader => {
                            (CallStatus::ErrChunk, proto::ErrorCode::BadHeader)
                        }
                        v2::ErrorBody::InvalOption => {
                            (CallStatus::ErrChunk, proto::ErrorCode::InvalOption)
                        }
                    };
                    self.count_error_received(&code);
                    self.on_error_reply(h.xid, status, env);
                    false
                }
                v2::Body::Optional(o) => {
                    self.on_optional(h.xid, *o);
                    false
                }
            },
            Message::ErrVers(e) => {
                self.count_error_received(&proto::ErrorCode::Vers {
                    low: e.low,
                    high: e.high,
                });
                self.on_error_reply(e.xid, CallStatus::ErrVers, env);
                false
            }
        }
    }

    fn count_error_received(&mut self, code: &proto::ErrorCode) {
        self.stats.errors_received += 1;
        self.stats.errors_received_by.count(code);
    }

    fn reject_direction(&mut self, xid: u32, direction: MsgType, env: &mut impl Env) {
        if direction == MsgType::Call {
            self.send_chunk_error(xid, v2::VERSION, env);
        } else {
            self.stats.dropped += 1;
        }
    }

    fn on_optional(&mut self, xid: u32, o: v2::Optional<'_>) {
        let mut body = [0u8; MAX_OPTINFO];
        let n = o.optinfo.len().min(MAX_OPTINFO);
        if let (Some(d), Some(s)) = (body.get_mut(..n), o.optinfo.get(..n)) {
            d.copy_from_slice(s);
        }
        // Rare control-plane traffic: boxed so that every other event stays small.
        self.events.push_back(Event::Optional(Box::new(OptionalMsg {
            xid,
            direction: o.direction,
            opttype: o.opttype,
            len: n as u16,
            body,
        })));
    }

    /// Sends an RDMA2_OPTIONAL message the control plane built (`optinfo` is the XDR body);
    /// the client sends it in the CALL direction, the server in REPLY (AMB-24).
    pub fn send_optional(
        &mut self,
        xid: u32,
        opttype: u32,
        optinfo: &[u8],
        env: &mut impl Env,
    ) -> Result<(), SubmitError> {
        if self.closed.is_some() {
            return Err(SubmitError::Closed);
        }
        if self.vers != v2::VERSION {
            return Err(SubmitError::Invalid("optional messages need version two"));
        }
        let direction = match self.cfg.role {
            Role::Client => MsgType::Call,
            Role::Server => MsgType::Reply,
        };
        let h = v2::Header {
            xid,
            credit: self.grant,
            body: v2::Body::Optional(v2::Optional {
                direction,
                opttype,
                optinfo,
            }),
        };
        let mut b = [0u8; MAX_OPTINFO + 64];
        let n = h
            .emit(&mut b)
            .map_err(|_| SubmitError::Invalid("optional body too large"))?;
        if n as u32 > self.threshold() {
            return Err(SubmitError::Invalid(
                "optional message above the inline threshold",
            ));
        }
        if self.send_bytes(SendOwner::Bare, b.get(..n).unwrap_or(&[]), env) {
            Ok(())
        } else {
            Err(SubmitError::Closed)
        }
    }

    /// Answers a received RDMA2_OPTIONAL message whose type is not supported with
    /// RDMA2_ERR_INVAL_OPTION (V2-3.1-b); the control plane calls it for unknown types.
    pub fn reject_optional(&mut self, xid: u32, env: &mut impl Env) {
        if self.closed.is_some() {
            return;
        }
        self.send_error(
            proto::ErrorReply {
                xid,
                vers: v2::VERSION,
                credit: self.grant,
                code: proto::ErrorCode::InvalOption,
            },
            env,
        );
    }

    /// Applies a peer receive size learned from XCHAR_RBSIZ (version two, AMB-32):
    /// the threshold for messages this side sends becomes min(own send size, `rbsiz`).
    pub fn set_peer_receive_size(&mut self, rbsiz: u32) {
        self.send_threshold = self.cfg.send_size.min(rbsiz.max(DEFAULT_INLINE));
        self.set_threshold();
        if self.vers == v2::VERSION {
            self.peer_rbsiz = Some(rbsiz.max(DEFAULT_INLINE));
        }
    }

    /// Sets the receive size this side announces in XCHAR_RBSIZ (version two): the
    /// threshold for what the peer sends, which decides when calls offer a Reply chunk.
    /// Call it before the INITXCH, RESPXCH or UPDXCH announcing the size is sent, so that
    /// no call leaves expecting an inline reply larger than the peer may send (XCH-3-e).
    /// Receives are always posted at the configured receive size, which bounds the value:
    /// raising up to it needs no re-post (XCH-3.1-a, XCH-3.1-c hold by construction).
    pub fn set_own_receive_size(&mut self, rbsiz: u32) {
        let r = self.cfg.recv_size.min(rbsiz.max(DEFAULT_INLINE));
        self.recv_threshold = r;
        self.set_threshold();
        if self.vers == v2::VERSION {
            self.own_rbsiz = Some(r);
        }
    }

    /// Caps what this side sends at `cap` bytes while its REQXCH asking the peer to lower
    /// its XCHAR_RBSIZ is outstanding (XCH-3.1-d: from the moment it asks until the request
    /// is rejected or settled); `None` lifts the cap. The cap applies on top of the peer's
    /// announced size ([`set_peer_receive_size`](Self::set_peer_receive_size)), so an
    /// update above it changes nothing while the request is pending.
    pub fn set_peer_receive_cap(&mut self, cap: Option<u32>) {
        self.peer_cap = cap.map_or(u32::MAX, |c| c.max(DEFAULT_INLINE));
        self.set_threshold();
    }

    /// Applies the peer's largest Send (RFC 8797): the threshold for messages the peer
    /// sends, which decides when calls offer a Reply chunk.
    pub fn set_peer_send_size(&mut self, size: u32) {
        self.peer_send = size.max(DEFAULT_INLINE);
        self.recv_threshold = self.own_recv.min(self.peer_send);
        self.set_threshold();
    }

    /// Sets the receive size this side announces in its RFC 8797 private data, when it is
    /// smaller than the receive buffers posted (`ConnConfig::recv_size`, which bounds it):
    /// the peer sends inline no more than that, so a call whose reply may be larger offers
    /// a Reply chunk (R8166-3.3.2-a, R8166-4.3.3-a). Call it before any call is sent.
    pub fn set_announced_receive_size(&mut self, size: u32) {
        self.own_recv = size.clamp(DEFAULT_INLINE, self.cfg.recv_size);
        self.recv_threshold = self.own_recv.min(self.peer_send);
        self.set_threshold();
    }

    /// Applies the peer's XCHAR_REQREMINV (version two): whether replies may use Send With
    /// Invalidate.
    pub fn set_peer_takes_invalidate(&mut self, yes: bool) {
        self.peer_takes_inv = yes;
    }

    /// Routes an RDMA_MSG by the RPC msg_type of its payload.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn on_msg(
        &mut self,
        now: Instant,
        slot: MemRef,
        vers: u32,
        xid: u32,
        credit: u32,
        c: &proto::ChunkLists<'_>,
        header_len: usize,
        payload: &[u8],
        inv: Option<u32>,
        env: &mut impl Env,
    ) -> bool {
        match proto::rpc::msg_type(payload) {
            Some(MsgType::Call) => {
                // Empty lists passed as none: `dispatch`'s Short path (constant empty
                // lists) then tests nothing.
                let lists = (!c.is_empty()).then_some(c);
                self.on_call(slot, vers, xid, lists, Some((header_len, payload)), env)
            }
            Some(MsgType::Reply) => {
                let bad = requester::reply_chunks_bad(c, true);
                self.on_reply(now, vers, xid, credit, c, Some(payload), bad, inv, env);
                false
            }
            None => {
                // Not an RPC message at all: a header error for a call, dropped for a reply.
                if self.find_call(xid).is_some() {
                    self.stats.dropped += 1;
                } else {
                    self.send_chunk_error(xid, vers, env);
                }
                false
            }
        }
    }

    /// Routes an RDMA_NOMSG: a PZRC makes it a call, a Reply chunk alone a reply.
    #[allow(clippy::too_many_arguments)]
    fn on_nomsg(
        &mut self,
        now: Instant,
        slot: MemRef,
        vers: u32,
        xid: u32,
        credit: u32,
        c: &proto::ChunkLists<'_>,
        inv: Option<u32>,
        env: &mut impl Env,
    ) -> bool {
        if c.reads.has_position_zero() {
            self.on_call(slot, vers, xid, Some(c), None, env)
        } else if c.reply.is_some() && c.reads.is_empty() {
            let bad = requester::reply_chunks_bad(c, false);
            self.on_reply(now, vers, xid, credit, c, None, bad, inv, env);
            false
        } else {
            // R8166-4.2.4-b: the payload must be in a PZRC (call) or the Reply chunk.
            self.send_chunk_error(xid, vers, env);
            false
        }
    }

    /// Moves queued calls out while credits allow, and RDMA Reads while ORD allows.
    fn pump(&mut self, env: &mut impl Env) {
        // Nothing waits: the common case after most inputs.
        if self.queued.is_empty() && self.reads.is_empty() {
            return;
        }
        while self.may_start_call() {
            let Some(i) = self.queued.pop_front() else {
                break;
            };
            if !self.start_call(i, env) {
                break;
            }
        }
        self.pump_reads();
    }

    /// Whether one more call may be sent now: credits (R8166-3.3.1-b) and send buffers
    /// allow it.
    #[inline]
    fn may_start_call(&self) -> bool {
        self.closed.is_none()
            && self.in_flight < self.credit_limit()
            && self.call_sends < self.call_room()
    }

    /// Send buffers calls may hold: what the responder side's grant leaves free.
    #[inline]
    fn call_room(&self) -> u32 {
        self.cfg.send_slots.saturating_sub(self.grant_peak + 1)
    }
}

/// A work request leaving the queue (`poll_work`, `drain_work`): a Send counts down the Sends
/// queued (`sends_queued`), is signalled if it is the last of them, and joins the order of
/// Sends in flight by its slot.
#[inline]
fn hand_out(w: &mut Work, sends_queued: &mut u32, send_order: &mut VecDeque<u32>) {
    if let Work::Send { tag, signaled, .. } = w {
        *sends_queued = sends_queued.saturating_sub(1);
        *signaled = *sends_queued == 0;
        send_order.push_back(*tag & ((1 << KIND_SHIFT) - 1));
    }
}

/// Receive slot `slot`'s buffer in the own receive pool.
fn recv_slot_buf(cfg: &ConnConfig, slot: u32) -> Option<MemRef> {
    cfg.recv_pool
        .sub(slot.checked_mul(cfg.recv_size)?, cfg.recv_size)
}

impl Connection {
    /// Writes a Short message into `buf`: see [`write_short_in`].
    pub(super) fn write_short(
        &mut self,
        buf: MemRef,
        n: u32,
        rpc: &[u8],
        msg: MemRef,
        items: impl Iterator<Item = (u32, MemRef)>,
        env: &mut impl Env,
    ) -> Option<()> {
        write_short_in(&mut self.hdr, buf, n, rpc, msg, items, env)?;
        self.stats.short_sent += 1;
        Some(())
    }
}

/// Writes a Short message into `buf`: the transport header built in `hdr[..n]` and the RPC
/// header `rpc` after it, in one copy, then the payload stream (`msg` with `items` inline).
/// A function of the staging buffer alone, so that the requester can build a call while it
/// reads the call's slot.
pub(super) fn write_short_in(
    hdr: &mut [u8],
    buf: MemRef,
    n: u32,
    rpc: &[u8],
    msg: MemRef,
    items: impl Iterator<Item = (u32, MemRef)>,
    env: &mut impl Env,
) -> Option<()> {
    let at = n as usize;
    hdr.get_mut(at..at + rpc.len())?.copy_from_slice(rpc);
    let head = n.checked_add(u32::try_from(rpc.len()).ok()?)?;
    if !env.write(buf, hdr.get(..head as usize)?) {
        return None;
    }
    write_stream(env, buf, head, msg, items)
}

/// Pad of an XDR item of `len` bytes to a multiple of 4.
fn pad4(len: u32) -> u32 {
    len.wrapping_neg() & 3
}

/// `len` rounded up to a multiple of 4 (saturating).
fn round4(len: u32) -> u32 {
    len.saturating_add(pad4(len))
}

/// A piece of a Payload stream being sent: memory, or so many bytes of zero pad.
#[derive(Clone, Copy, Debug)]
enum Src {
    Mem(MemRef),
    Zero(u32),
}

/// Bytes of the Payload stream `msg` with `items` inline (see [`walk_stream`]); `None` if the
/// items do not fit `msg`'s positions or the length overflows.
fn stream_len(msg: MemRef, items: impl Iterator<Item = (u32, MemRef)>) -> Option<u32> {
    let mut len = 0u32;
    walk_stream(msg, items, |p| {
        let n = match p {
            Src::Mem(m) => m.len,
            Src::Zero(z) => z,
        };
        len = len.checked_add(n)?;
        Some(())
    })?;
    Some(len)
}

/// Walks a Payload stream as it travels, piece by piece: the RPC message `msg` around the
/// DDP items, and each item `(XDR position, memory)` that travels inline followed by its
/// XDR pad (items at non-decreasing positions within `msg`). Stops at the first `None`
/// from `f`. A walk, not a list: the pieces are used once, and building an array of them
/// per message cost more than using them.
#[inline]
fn walk_stream(
    msg: MemRef,
    items: impl Iterator<Item = (u32, MemRef)>,
    mut f: impl FnMut(Src) -> Option<()>,
) -> Option<()> {
    let mut cur = 0u32;
    for (xdr_pos, mem) in items {
        if xdr_pos > cur {
            f(Src::Mem(msg.sub(cur, xdr_pos - cur)?))?;
        }
        cur = xdr_pos;
        f(Src::Mem(mem))?;
        if pad4(mem.len) > 0 {
            f(Src::Zero(pad4(mem.len)))?;
        }
    }
    if msg.len > cur {
        f(Src::Mem(msg.sub(cur, msg.len - cur)?))?;
    }
    Some(())
}

/// Writes the pieces of a Payload stream ([`walk_stream`]) one after the other into `buf`
/// from offset `off`, copying memory and writing the pads; `None` if a piece does not fit
/// or a copy fails.
#[inline]
fn write_stream(
    env: &mut impl Env,
    buf: MemRef,
    mut off: u32,
    msg: MemRef,
    items: impl Iterator<Item = (u32, MemRef)>,
) -> Option<()> {
    walk_stream(msg, items, |p| {
        let len = match p {
            Src::Mem(m) => {
                if m.len > 0 && !env.copy(m, buf.sub(off, m.len)?) {
                    return None;
                }
                m.len
            }
            Src::Zero(z) => {
                if !env.write(buf.sub(off, z)?, &[0; 4][..z as usize % 4]) {
                    return None;
                }
                z
            }
        };
        off = off.checked_add(len)?;
        Some(())
    })
}

/// Splits the stream made of `sources` across the remote `segs`, calling
/// `f(local, segment index, offset in segment)` for each contiguous piece; returns the
/// bytes placed in each segment, or `None` if the stream does not fit.
fn scatter(
    sources: &[MemRef],
    segs: &[Segment],
    mut f: impl FnMut(MemRef, usize, u32),
) -> Option<[u32; MAX_SEGS]> {
    let mut used = [0u32; MAX_SEGS];
    let mut si = 0usize;
    for src in sources {
        let mut done = 0u32;
        while done < src.len {
            let seg = segs.get(si)?;
            let u = used.get_mut(si)?;
            let room = seg.length - *u;
            if room == 0 {
                si += 1;
                continue;
            }
            let n = room.min(src.len - done);
            f(src.sub(done, n)?, si, *u);
            *u += n;
            done += n;
        }
    }
    Some(used)
}

#[cfg(any(test, feature = "sim"))]
#[doc(hidden)]
pub mod script;
#[cfg(any(test, feature = "sim"))]
#[doc(hidden)]
pub mod sim;
#[cfg(test)]
mod tests;

/// Bytes of the transport header of a Short message without chunks (its fixed words and
/// three empty lists), in version 2 or 1: what [`emit_plain`] writes.
#[inline(always)]
fn plain_header_len(v2: bool) -> u32 {
    (if v2 {
        v2::MSG_HEADER_LEN
    } else {
        v1::MIN_HEADER_LEN
    }) as u32
}

/// Encodes the transport header of a Short message without chunks into `hdr`, in version 2
/// or 1; its length, or `None` if it does not fit.
#[inline(always)]
fn emit_plain(hdr: &mut [u8], v2: bool, direction: MsgType, xid: u32, credit: u32) -> Option<u32> {
    let n = if v2 {
        v2::emit_msg(hdr, xid, credit, direction)?
    } else {
        v1::emit_msg(hdr, xid, credit)?
    };
    u32::try_from(n).ok()
}

/// Encodes the transport header of a call or reply carrying an RPC message (RDMA_MSG when
/// `short`, else RDMA_NOMSG) into `hdr`, in version 2 or 1; its length, or `None` if it does not fit.
fn emit_header(
    hdr: &mut [u8],
    v2: bool,
    short: bool,
    direction: MsgType,
    xid: u32,
    credit: u32,
    chunks: &proto::ChunkLists<'_>,
) -> Option<u32> {
    // A Short message without chunks has a fixed layout: no header value is built.
    if short && chunks.is_empty() {
        return emit_plain(hdr, v2, direction, xid, credit);
    }
    let chunks = *chunks;
    let n = if v2 {
        let body = if short {
            v2::Body::Msg { direction, chunks }
        } else {
            v2::Body::Nomsg { direction, chunks }
        };
        v2::Header { xid, credit, body }.emit(hdr).ok()?
    } else {
        let body = if short {
            v1::Body::Msg(chunks)
        } else {
            v1::Body::Nomsg(chunks)
        };
        v1::Header { xid, credit, body }.emit(hdr).ok()?
    };
    u32::try_from(n).ok()
}
