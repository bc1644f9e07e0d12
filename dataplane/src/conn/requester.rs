//! The requester half: marshalling calls (short, chunked, long), credits, reply placement
//! and per-RPC invalidation.

use std::time::Instant;

use rpcrdma_proto::chunk::SEGMENT_LEN;
use rpcrdma_proto::ulb::binding;
use rpcrdma_proto::{
    v1, v2, Chunk, ChunkLists, MsgType, ReadList, ReadSegment, Segment, WriteList,
};
use rpcrdma_verbs::Access;

use super::{
    emit_header, emit_plain, plain_header_len, round4, tag, walk_stream, write_short_in, CallDone,
    CallStatus, Connection, Event, Role, SendOwner, Src, SubmitError, Work, K_INV, MAX_EXPOSE,
    MAX_PIECES, MAX_WCHUNKS, TAIL_LAND, TAIL_RPC, TAIL_ZERO,
};
use crate::mem::{Env, MemRef};
use crate::rpcmsg::{self, ReplyStat, CALL_HEADER_LEN, MAX_CALL_HEADER_LEN, REPLY_HEADER_LEN};
use rpcrdma_proto::rpc::AuthSys;

/// A DDP-eligible argument: `mem` belongs at `xdr_pos` of the reduced argument XDR.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArgPiece {
    /// The item's data (without XDR pad).
    pub mem: MemRef,
    /// Position in the reduced argument XDR (multiple of 4).
    pub xdr_pos: u32,
}

/// A call to send: the shape of an app's CALL descriptor, with memory named by [`MemRef`].
#[derive(Clone, Copy, Debug)]
pub struct CallSpec<'a> {
    /// Token returned in [`CallDone::user`].
    pub user: u64,
    /// XID (unique among this connection's outstanding calls).
    pub xid: u32,
    /// Program.
    pub prog: u32,
    /// Program version.
    pub vers: u32,
    /// Procedure.
    pub proc_: u32,
    /// Reduced argument XDR (DDP-eligible items removed, their length words kept).
    pub msg: MemRef,
    /// DDP-eligible arguments, by ascending position.
    pub args: &'a [ArgPiece],
    /// Buffers for DDP-eligible results, in result order.
    pub results: &'a [MemRef],
    /// Buffer for the reduced reply XDR; its length is the largest reply expected.
    pub reply: MemRef,
    /// The call's credential: AUTH_SYS with this identity, or AUTH_NONE (`None`).
    pub auth: Option<AuthSys>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    #[default]
    Free,
    Queued,
    Sent,
    Invalidating,
}

/// One call slot of the requester.
///
/// Laid out in declaration order (`repr(C)`): what every call touches comes first, the
/// arrays that only chunked calls fill last, so a plain call's record spans few cache lines.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Call {
    // The state and the seven bytes after it, which a new call clears, fill one word:
    // `reset` writes them together (three stores instead of five).
    state: State,
    n_rkeys: u8,
    inv_pending: u8,
    n_w: u8,
    n_reply: u8,
    /// Resend as version 1 once invalidation ends (ERR_VERS to a version-two call).
    requeue: bool,
    retried: bool,
    /// Cancelled while sent, its owner told: it stays sent, under its XID, until its late
    /// reply (or the connection's end) returns its credit; then it ends silently, or, if it
    /// is [`lent`](Call::lent), its memory is fenced and it ends with [`Event::CallReleased`].
    cancelled: bool,
    n_args: u8,
    n_results: u8,
    xid: u32,
    prog: u32,
    vers: u32,
    proc_: u32,
    slot: Option<u32>,
    user: u64,
    msg: MemRef,
    reply: MemRef,
    args: [ArgPiece; MAX_PIECES],
    results: [MemRef; MAX_PIECES],
    done: Option<CallDone>,
    wseg: [Segment; MAX_WCHUNKS],
    reply_segs: [Segment; 2],
    rkeys: [u32; MAX_EXPOSE],
}

impl Call {
    /// Cancelled with memory exposed to the peer: the owner must not reuse it before
    /// [`Event::CallReleased`]. (A sent call's keys do not change until it ends.)
    fn lent(&self) -> bool {
        self.cancelled && self.n_rkeys > 0
    }

    /// Ends the call because the connection ended: what its owner is told, if anything
    /// (nothing for a free slot or for a cancelled call that lent no memory). The queue pair
    /// is gone, so the peer can no longer reach what the call exposed.
    pub(super) fn abort(&mut self) -> Option<Event> {
        if self.state == State::Free {
            return None;
        }
        self.state = State::Free;
        if self.cancelled {
            return self.lent().then_some(Event::CallReleased {
                user: self.user,
                xid: self.xid,
            });
        }
        Some(Event::CallDone(CallDone::failed(
            self.user,
            self.xid,
            CallStatus::Closed,
        )))
    }

    /// Fills the free slot with a new queued call, in place (the slot is large: building a
    /// fresh one and moving it in costs a copy per call). Its arrays are only read up to
    /// their counts, so only the counts are cleared. Inlined in `submit_call`, its one
    /// caller.
    #[inline]
    fn reset(&mut self, spec: &CallSpec<'_>) {
        self.user = spec.user;
        self.xid = spec.xid;
        self.prog = spec.prog;
        self.vers = spec.vers;
        self.proc_ = spec.proc_;
        self.msg = spec.msg;
        self.n_args = copy_pieces(&mut self.args, spec.args);
        self.n_results = copy_pieces(&mut self.results, spec.results);
        self.reply = spec.reply;
        self.slot = None;
        self.done = None;
        // Together, in field order (the first word of the record).
        self.state = State::Queued;
        self.n_rkeys = 0;
        self.inv_pending = 0;
        self.n_w = 0;
        self.n_reply = 0;
        self.requeue = false;
        self.retried = false;
        self.cancelled = false;
    }

    /// Ends the call in its slot, its memory fenced: queued again if it goes again as
    /// version 1, else free. What [`Connection::finished`] must do besides.
    #[inline(always)]
    fn finish(&mut self) -> Finish {
        let released = self.lent().then_some((self.user, self.xid));
        self.n_rkeys = 0;
        let requeued = self.requeue;
        if requeued {
            self.requeue = false;
            self.state = State::Queued;
        } else {
            self.state = State::Free;
        }
        Finish {
            slot: self.slot.take(),
            requeued,
            released,
        }
    }

    fn args(&self) -> &[ArgPiece] {
        self.args.get(..usize::from(self.n_args)).unwrap_or(&[])
    }

    fn expose(&mut self, env: &mut impl Env, at: MemRef, access: Access) -> Option<Segment> {
        let slot = self.rkeys.get_mut(usize::from(self.n_rkeys))?;
        let seg = env.expose(at, access)?;
        *slot = seg.handle;
        self.n_rkeys += 1;
        Some(seg)
    }
}

/// How a call ended in its slot ([`Call::finish`]).
struct Finish {
    /// Its send buffer, to free.
    slot: Option<u32>,
    /// It goes again (as version 1): back to the head of the queue.
    requeued: bool,
    /// Cancelled with memory lent: `(user, xid)` of its [`Event::CallReleased`].
    released: Option<(u64, u32)>,
}

/// Copies the first pieces of `src` that fit into `dst`; how many. The first is copied on
/// its own: most calls have at most one, and a copy loop becomes a `memcpy` call, dearer
/// than the copy of one piece.
fn copy_pieces<T: Copy>(dst: &mut [T; MAX_PIECES], src: &[T]) -> u8 {
    let (Some((d0, dst)), Some((s0, src))) = (dst.split_first_mut(), src.split_first()) else {
        return 0;
    };
    *d0 = *s0;
    if !src.is_empty() {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = *s;
        }
    }
    (1 + src.len().min(MAX_PIECES - 1)) as u8
}

const MAX_READ_OUT: usize = 2 + 3 * MAX_PIECES;

/// The arguments of a call that travel in its Payload stream (not marked in `skip`), as
/// `(XDR position, memory)`.
fn items<'a>(
    args: &'a [ArgPiece],
    skip: &'a [bool; MAX_PIECES],
) -> impl Iterator<Item = (u32, MemRef)> + 'a {
    args.iter()
        .zip(skip)
        .filter(|(_, &s)| !s)
        .map(|(a, _)| (a.xdr_pos, a.mem))
}

impl Connection {
    /// Queues a call; it is sent as soon as the credit limit allows (R8166-3.3.1-b). Its
    /// end is reported once as [`Event::CallDone`] with `spec.user`.
    pub fn submit_call(
        &mut self,
        spec: &CallSpec<'_>,
        env: &mut impl Env,
    ) -> Result<(), SubmitError> {
        if self.closed.is_some() {
            return Err(SubmitError::Closed);
        }
        if spec.args.len() > MAX_PIECES || spec.results.len() > MAX_PIECES {
            return Err(SubmitError::Invalid("too many pieces"));
        }
        let mut last = 0u32;
        for a in spec.args {
            if a.xdr_pos % 4 != 0 || a.xdr_pos < last || a.xdr_pos > spec.msg.len {
                return Err(SubmitError::Invalid("argument positions"));
            }
            last = a.xdr_pos;
        }
        // A cancelled call stays sent, its XID taken, until its late reply comes: replies
        // are matched by XID alone, so a new call under it would take the old call's reply,
        // and the old call's credit would take the new one's. (The queue is mostly empty:
        // then its walk is not called at all.)
        if self.find_call(spec.xid).is_some()
            || (!self.queued.is_empty() && self.queued_xid(spec.xid))
        {
            return Err(SubmitError::Invalid("xid already outstanding"));
        }
        let i = self.call_free.pop().ok_or(SubmitError::Busy)?;
        if let Some(c) = self.calls.get_mut(i as usize) {
            c.reset(spec);
        }
        if let Some(a) = self.call_auth.get_mut(i as usize) {
            *a = spec.auth;
        }
        // `may_start_call`, the connection known open (checked above, and nothing since
        // closes it) and the credit limit at hand.
        let credited = self.in_flight < self.credit_limit();
        if !credited {
            self.stats.credit_stalls += 1;
        }
        if self.queued.is_empty() && credited && self.call_sends < self.call_room() {
            // Nothing ahead of it: sent at once (or queued by `start_call` if no send
            // buffer is free).
            self.start_call(i, env);
        } else {
            self.queued.push_back(i);
            self.pump(env);
        }
        Ok(())
    }

    fn queued_xid(&self, xid: u32) -> bool {
        self.queued
            .iter()
            .any(|&i| self.calls.get(i as usize).is_some_and(|c| c.xid == xid))
    }

    /// The slot of the sent call with `xid`.
    #[inline]
    pub(super) fn find_call(&self, xid: u32) -> Option<u32> {
        self.sent.get(xid)
    }

    /// A late reply (or error) to cancelled call `i`: it returns the call's credit (a reply
    /// also its grant) and is dropped; what the call lent the peer is fenced, then released.
    fn take_cancelled(&mut self, i: u32, credit: Option<u32>, remote_inv: Option<u32>) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(cr) = credit {
            self.granted = cr.max(1);
        }
        self.stats.dropped += 1;
        self.end_call(i, None, remote_inv);
    }

    /// Cancels the call with `xid`. A queued call ends at once with
    /// [`CallStatus::Cancelled`]. A sent one ends at once too, but stays sent until its late
    /// reply returns its credit; if it exposed memory to the peer (chunks), its
    /// [`CallDone::lent`] is set: the peer may still read or write that memory, so the owner
    /// keeps it until [`Event::CallReleased`], which follows once the reply (or the
    /// connection's end) has come and the memory is fenced (R8166-4.4-c). Nothing is
    /// invalidated under the peer's feet, so its late access costs no connection
    /// (R8166-8.1.4-c). A call whose reply already came, ending now, is not cancelled
    /// (`BadId`): it ends with that reply.
    pub fn cancel_call(&mut self, xid: u32) -> Result<(), SubmitError> {
        if self.closed.is_some() {
            return Err(SubmitError::Closed);
        }
        if let Some(q) = self
            .queued
            .iter()
            .position(|&i| self.calls.get(i as usize).is_some_and(|c| c.xid == xid))
        {
            let i = self.queued.remove(q).ok_or(SubmitError::BadId)?;
            let c = self.calls.get_mut(i as usize).ok_or(SubmitError::BadId)?;
            c.state = State::Free;
            let done = CallDone::failed(c.user, c.xid, CallStatus::Cancelled);
            self.call_free.push(i);
            self.events.push_back(Event::CallDone(done));
            return Ok(());
        }
        if let Some(c) = self.requeuing(xid).and_then(|i| self.calls.get_mut(i)) {
            // Answered ERR_VERS, to go again as version 1 once fenced: it ends then instead.
            c.requeue = false;
            c.done = Some(CallDone::failed(c.user, c.xid, CallStatus::Cancelled));
            return Ok(());
        }
        let i = self.find_call(xid).ok_or(SubmitError::BadId)?;
        let c = self.calls.get_mut(i as usize).ok_or(SubmitError::BadId)?;
        if c.cancelled {
            return Err(SubmitError::BadId);
        }
        c.cancelled = true;
        let mut done = CallDone::failed(c.user, c.xid, CallStatus::Cancelled);
        done.lent = c.lent();
        self.events.push_back(Event::CallDone(done));
        Ok(())
    }

    /// The slot of the call with `xid` that was answered ERR_VERS and goes again as version 1
    /// once its memory is fenced (rare: a scan is fine).
    fn requeuing(&self, xid: u32) -> Option<usize> {
        self.calls
            .iter()
            .position(|c| c.xid == xid && c.state == State::Invalidating && c.requeue)
    }

    /// The `user` value of the call with `xid` that is queued, sent or about to be sent again,
    /// and not yet ended or cancelled. Lets an owner check that the call it means to cancel is
    /// its own before [`cancel_call`](Self::cancel_call): a later call may have taken the XID
    /// of one that ended.
    pub fn call_user(&self, xid: u32) -> Option<u64> {
        let sent = self.find_call(xid).and_then(|i| self.calls.get(i as usize));
        sent.filter(|c| !c.cancelled)
            .or_else(|| {
                self.queued
                    .iter()
                    .filter_map(|&i| self.calls.get(i as usize))
                    .find(|c| c.xid == xid)
            })
            .or_else(|| self.requeuing(xid).and_then(|i| self.calls.get(i)))
            .map(|c| c.user)
    }

    /// Sends queued call `i`; false (and the call stays first in the queue) if no send
    /// buffer is free.
    pub(super) fn start_call(&mut self, i: u32, env: &mut impl Env) -> bool {
        let Some(c) = self.calls.get(i as usize) else {
            return true;
        };
        // The dominant case is recognised first, reading the call where it is; only an
        // AUTH_NONE call can be one (the credential itself is read only if it is not).
        let auth_none = self.call_auth.get(i as usize).is_none_or(|a| a.is_none());
        let plain = if auth_none { self.plain_len(c) } else { None };
        let (user, xid) = (c.user, c.xid);
        let Some(slot) = self.alloc_send(SendOwner::Call, env) else {
            self.queued.push_front(i);
            return false;
        };
        self.call_sends += 1;
        // The Send is queued here for both paths (one place in this function).
        let built = match plain {
            Some(inline_len) => self.marshal_plain(i, slot, inline_len, env),
            None => {
                // The call is built in its slot, not in a copy of it (the record is large):
                // the slots are lent out of `self` while `marshal`, which touches no other
                // call, runs.
                let auth = self.call_auth.get(i as usize).copied().flatten();
                let mut calls = std::mem::take(&mut self.calls);
                let built = calls.get_mut(i as usize).map(|c| {
                    c.slot = Some(slot);
                    self.marshal(c, slot, auth, env)
                });
                self.calls = calls;
                let Some(built) = built else {
                    return true;
                };
                built
            }
        };
        if let Some(buf) = built {
            self.queue_send(slot, buf, None);
            self.sent.insert(xid, i);
            self.in_flight += 1;
            self.stats.calls_sent += 1;
            if self.vers == v2::VERSION && !self.v2_confirmed && self.first_sent.is_none() {
                self.first_pending = true;
            }
        } else {
            self.end_call(
                i,
                Some(&CallDone::failed(user, xid, CallStatus::Local)),
                None,
            );
        }
        true
    }

    /// Whether call `c`, an AUTH_NONE call, is the dominant case that
    /// [`marshal_plain`](Self::marshal_plain) sends: a Short call without chunks (no argument
    /// reduced, no Write chunk, no Reply chunk). If so, the length of its RPC header and
    /// payload, as [`marshal`](Self::marshal) measures them; `None` sends it through
    /// `marshal`, which decides the same way and handles every other case (its failures
    /// included). Inlined in its one caller, every call's path.
    #[inline(always)]
    fn plain_len(&self, c: &Call) -> Option<u32> {
        let backward = self.cfg.role == Role::Server;
        let b = if backward {
            rpcrdma_proto::ulb::Binding::NONE
        } else {
            binding(c.prog, c.vers, c.proc_)
        };
        let ddp = self.cfg.ddp_threshold;
        // No Write chunk: the first result buffer is not one.
        let first_result = c.results.first().filter(|_| c.n_results > 0);
        if b.result_eligible
            && b.max_write_chunks > 0
            && MAX_WCHUNKS > 0
            && first_result.is_some_and(|r| r.len >= ddp)
        {
            return None;
        }
        // No Reply chunk: the largest reply fits inline.
        if !backward && c.reply.len > self.reply_room() {
            return None;
        }
        // No argument reduced, and the length of what travels inline.
        let reducing = b.arg_eligible && b.max_read_chunks > 0;
        let mut inline_len = (CALL_HEADER_LEN as u32).checked_add(c.msg.len)?;
        for a in c.args() {
            if reducing && a.mem.len >= ddp {
                return None;
            }
            inline_len = inline_len.checked_add(round4(a.mem.len))?;
        }
        // Short: the fixed words and three empty lists, then the RPC message.
        let short =
            plain_header_len(self.vers == v2::VERSION).checked_add(inline_len)? <= self.threshold();
        short.then_some(inline_len)
    }

    /// Builds the header and payload of call `c` (credential `auth`: AUTH_SYS, or AUTH_NONE
    /// when `None`) in send buffer `slot`; the bytes to send (`start_call` queues the Send),
    /// or `None` if it cannot be built (the call then fails, R8166-4.5.4-a). The dominant
    /// case, a Short call without chunks and AUTH_NONE, goes through
    /// [`marshal_plain`](Self::marshal_plain) instead.
    fn marshal(
        &mut self,
        c: &mut Call,
        slot: u32,
        auth: Option<AuthSys>,
        env: &mut impl Env,
    ) -> Option<MemRef> {
        c.state = State::Sent;
        // R8166-7.1-c: backward-direction calls (from the server) use no chunks at all.
        let backward = self.cfg.role == Role::Server;
        let b = if backward {
            rpcrdma_proto::ulb::Binding::NONE
        } else {
            binding(c.prog, c.vers, c.proc_)
        };
        let v2 = self.vers == v2::VERSION;
        let fixed = if v2 { 20 } else { 16 };
        let hdr_rpc = if auth.is_some() {
            MAX_CALL_HEADER_LEN
        } else {
            CALL_HEADER_LEN
        } as u32;
        // Which eligible arguments move to Read chunks (R8166-3.4.2-a, IMPL-6.2.1-a), and
        // the length of what stays inline: the RPC header, the message, the other arguments.
        let mut reduce = [false; MAX_PIECES];
        let mut n_red = 0u32;
        let mut inline_len = hdr_rpc.checked_add(c.msg.len)?;
        for (k, a) in c.args().iter().enumerate() {
            if b.arg_eligible
                && a.mem.len >= self.cfg.ddp_threshold
                && n_red < u32::from(b.max_read_chunks)
            {
                reduce[k] = true;
                n_red += 1;
            } else {
                inline_len = inline_len.checked_add(round4(a.mem.len))?;
            }
        }
        // Write chunks for eligible results, a prefix of the result buffers (R8166-4.3.2.1-a).
        let mut n_w = 0usize;
        if b.result_eligible {
            for r in c.results.iter().take(usize::from(c.n_results)) {
                if n_w >= usize::from(b.max_write_chunks)
                    || n_w >= MAX_WCHUNKS
                    || r.len < self.cfg.ddp_threshold
                {
                    break;
                }
                n_w += 1;
            }
        }
        let wlist_len = 4 + n_w * WRITE_CHUNK_LEN as usize;
        // A Reply chunk whenever the largest reply may exceed the reply threshold (R8166-4.3.3-a).
        let want_reply_chunk = !backward
            && self
                .reply_room()
                .checked_sub(n_w as u32 * WRITE_CHUNK_LEN)
                .is_none_or(|room| c.reply.len > room);
        let n_reply = match (want_reply_chunk, c.reply.len) {
            (false, _) => 0,
            (true, 0) => 1,
            (true, _) => 2,
        };
        let reply_len = if n_reply > 0 {
            4 + 4 + n_reply * SEGMENT_LEN
        } else {
            4
        };
        let msg_hdr = fixed + 4 + 24 * n_red as usize + wlist_len + reply_len;
        let short = (msg_hdr as u32).checked_add(inline_len)? <= self.threshold();
        if backward && !short {
            return None;
        }
        // Where each argument sits in the unreduced call, as a Read chunk position.
        let mut upos = [0u32; MAX_PIECES];
        let mut shift = 0u32;
        for (k, a) in c.args().iter().enumerate() {
            upos[k] = hdr_rpc.checked_add(a.xdr_pos)?.checked_add(shift)?;
            shift = shift.checked_add(round4(a.mem.len))?;
        }
        // A Short message leaves its reduced arguments out of the stream; a Long one sends all.
        let skip = if short { reduce } else { [false; MAX_PIECES] };

        // Expose what the peer will touch, for this RPC only (R8166-8.1.3-a).
        let mut reads = [ReadSegment::default(); MAX_READ_OUT];
        let mut n_reads = 0usize;
        let rpc_tail = self.send_tail(slot, TAIL_RPC, hdr_rpc)?;
        let zero_tail = self.send_tail(slot, TAIL_ZERO, 4)?;
        if short {
            for k in 0..usize::from(c.n_args) {
                if reduce[k] {
                    let mem = c.args.get(k)?.mem;
                    let seg = c.expose(env, mem, Access::REMOTE_READ)?;
                    *reads.get_mut(n_reads)? = ReadSegment::new(upos[k], seg);
                    n_reads += 1;
                    self.stats.read_chunks += 1;
                }
            }
        } else {
            // Long call: the whole unreduced message in the PZRC (R8166-3.5.3-a/b), its RPC
            // header (AUTH_NONE's or AUTH_SYS's) first.
            let (none, sys);
            let rpc: &[u8] = match auth {
                None => {
                    none = rpcmsg::call_header(c.xid, c.prog, c.vers, c.proc_);
                    &none
                }
                Some(a) => {
                    sys = rpcmsg::call_header_sys(c.xid, c.prog, c.vers, c.proc_, a);
                    &sys
                }
            };
            if !env.write(rpc_tail, rpc) || !env.write(zero_tail, &[0; 4]) {
                return None;
            }
            let seg = c.expose(env, rpc_tail, Access::REMOTE_READ)?;
            *reads.get_mut(n_reads)? = ReadSegment::new(0, seg);
            n_reads += 1;
            // The walk reads a copy of the pieces: `expose` records each key in the call.
            let (msg, args) = (c.msg, c.args);
            let args = args.get(..usize::from(c.n_args))?;
            walk_stream(msg, items(args, &skip), |s| {
                let at = match s {
                    Src::Mem(m) if m.len > 0 => m,
                    Src::Zero(n) if n > 0 => zero_tail.prefix(n)?,
                    _ => return Some(()),
                };
                let seg = c.expose(env, at, Access::REMOTE_READ)?;
                *reads.get_mut(n_reads)? = ReadSegment::new(0, seg);
                n_reads += 1;
                Some(())
            })?;
            self.stats.long_calls += 1;
        }
        for k in 0..n_w {
            let r = *c.results.get(k)?;
            *c.wseg.get_mut(k)? = c.expose(env, r, Access::REMOTE_WRITE)?;
            self.stats.write_chunks += 1;
        }
        c.n_w = n_w as u8;
        if n_reply > 0 {
            self.stats.reply_chunks += 1;
            let land = self.send_tail(slot, TAIL_LAND, REPLY_HEADER_LEN as u32)?;
            c.reply_segs[0] = c.expose(env, land, Access::REMOTE_WRITE)?;
            if n_reply > 1 {
                c.reply_segs[1] = c.expose(env, c.reply, Access::REMOTE_WRITE)?;
            }
        }
        c.n_reply = n_reply as u8;

        // The transport header.
        let wchunks: [Chunk<'_>; MAX_WCHUNKS] =
            core::array::from_fn(|k| Chunk::from_segments(c.wseg.get(k..k + 1).unwrap_or(&[])));
        let chunks = ChunkLists {
            reads: ReadList::from_segments(reads.get(..n_reads)?),
            writes: WriteList::from_chunks(wchunks.get(..n_w)?),
            reply: (n_reply > 0)
                .then(|| Chunk::from_segments(c.reply_segs.get(..n_reply).unwrap_or(&[]))),
        };
        let credit = self.cfg.credits;
        let n = emit_header(
            &mut self.hdr,
            v2,
            short,
            MsgType::Call,
            c.xid,
            credit,
            &chunks,
        )?;
        let total = if short { n.checked_add(inline_len)? } else { n };
        if total > self.threshold() {
            return None;
        }
        let buf = self.send_buf(slot)?.prefix(total)?;
        if short {
            // Each header at its own size (a copy of a length known here).
            let items = items(c.args(), &skip);
            let (xid, prog, vers, proc_) = (c.xid, c.prog, c.vers, c.proc_);
            match auth {
                None => {
                    let rpc = rpcmsg::call_header(xid, prog, vers, proc_);
                    self.write_short(buf, n, &rpc, c.msg, items, env)?;
                }
                Some(a) => {
                    let rpc = rpcmsg::call_header_sys(xid, prog, vers, proc_, a);
                    self.write_short(buf, n, &rpc, c.msg, items, env)?;
                }
            }
        } else if !env.write(buf, self.hdr.get(..n as usize)?) {
            return None;
        }
        Some(buf)
    }

    /// Builds call `i` in send buffer `slot`, the dominant case ([`plain_len`](Self::plain_len)
    /// found it so and measured `inline_len`, the RPC header and payload): the header has a
    /// fixed layout, so none of the chunk bookkeeping runs. The call is read in its slot. The
    /// bytes to send, as [`marshal`](Self::marshal).
    fn marshal_plain(
        &mut self,
        i: u32,
        slot: u32,
        inline_len: u32,
        env: &mut impl Env,
    ) -> Option<MemRef> {
        let v2 = self.vers == v2::VERSION;
        let buf = plain_header_len(v2)
            .checked_add(inline_len)
            .and_then(|len| self.send_buf(slot)?.prefix(len));
        let c = self.calls.get_mut(i as usize)?;
        // Set before anything may fail: `end_call` frees the buffer of a call that fails.
        c.slot = Some(slot);
        c.state = State::Sent;
        let buf = buf?;
        let rpc = rpcmsg::call_header(c.xid, c.prog, c.vers, c.proc_);
        let n = emit_plain(&mut self.hdr, v2, MsgType::Call, c.xid, self.cfg.credits)?;
        // Every argument travels inline (none was reduced): no skip list to consult.
        let items = c.args().iter().map(|a| (a.xdr_pos, a.mem));
        write_short_in(&mut self.hdr, buf, n, &rpc, c.msg, items, env)?;
        self.stats.short_sent += 1;
        Some(buf)
    }

    /// Starts the end of call `i`: invalidate what it exposed (except the key the peer
    /// already invalidated), then report `done` (R8166-4.4-b); `None` for a cancelled call,
    /// whose owner was told already.
    fn end_call(&mut self, i: u32, done: Option<&CallDone>, remote_inv: Option<u32>) {
        let Some(c) = self.calls.get_mut(i as usize) else {
            return;
        };
        c.state = State::Invalidating;
        self.sent.remove(c.xid, i);
        c.inv_pending = 0;
        // A call without chunks (most) exposed nothing: nothing to invalidate or count.
        if c.n_rkeys > 0 {
            let mut skipped = 0;
            for &rkey in c.rkeys.get(..usize::from(c.n_rkeys)).unwrap_or(&[]) {
                if Some(rkey) == remote_inv {
                    skipped += 1;
                    continue;
                }
                c.inv_pending += 1;
                self.work.push_back(Work::Invalidate {
                    tag: tag(K_INV, i),
                    rkey,
                });
            }
            self.stats.remote_invalidations += skipped;
            self.stats.invalidations += u64::from(c.inv_pending);
        }
        if c.inv_pending == 0 {
            // Ended here, with the slot at hand (not looked up again).
            let end = c.finish();
            self.finished(i, end, done);
        } else {
            // Reported once the invalidations complete.
            c.done = done.copied();
        }
    }

    pub(super) fn on_invalidate_done(&mut self, i: u32) {
        let Some(c) = self.calls.get_mut(i as usize) else {
            return;
        };
        if c.state != State::Invalidating {
            return;
        }
        c.inv_pending = c.inv_pending.saturating_sub(1);
        if c.inv_pending == 0 {
            let done = c.done.take();
            let end = c.finish();
            self.finished(i, end, done.as_ref());
        }
    }

    /// Call `i` has ended, its memory fenced, and its slot said how ([`Call::finish`]):
    /// reports `done` (unless the call goes again), or, if it was cancelled with memory
    /// lent, that the memory is released; frees its slot and send buffer.
    ///
    /// Inlined in its two callers: `end_call` ends nearly every call with it (nothing to
    /// invalidate), and a separate function cost a call frame per call.
    #[inline(always)]
    fn finished(&mut self, i: u32, end: Finish, done: Option<&CallDone>) {
        if end.requeued {
            self.queued.push_front(i);
        } else {
            self.call_free.push(i);
            if let Some(d) = done {
                self.events.push_back(Event::CallDone(*d));
            } else if let Some((user, xid)) = end.released {
                self.events.push_back(Event::CallReleased { user, xid });
            }
        }
        if let Some(s) = end.slot {
            self.call_sends = self.call_sends.saturating_sub(1);
            self.free_send(s);
        }
    }

    /// An RDMA_ERROR for one of our calls: a permanent error (R8166-4.5-e), except that a
    /// version-two call answered ERR_VERS is resent as version 1 (V2-5.2-a).
    /// The caller has counted the error (by code) in the statistics.
    pub(super) fn on_error_reply(&mut self, xid: u32, status: CallStatus, _env: &mut impl Env) {
        let Some(i) = self.find_call(xid) else {
            // R8166-4.2.4-c: nothing of ours; a responder discards errors.
            self.stats.dropped += 1;
            return;
        };
        let Some(c) = self.calls.get_mut(i as usize) else {
            return;
        };
        if c.cancelled {
            return self.take_cancelled(i, None, None);
        }
        self.in_flight = self.in_flight.saturating_sub(1);
        let (user, cxid) = (c.user, c.xid);
        if status == CallStatus::ErrVers && self.vers == v2::VERSION && !c.retried {
            c.retried = true;
            c.requeue = true;
            self.vers = v1::VERSION;
            self.limits.max_version = v1::VERSION;
            self.set_threshold();
        }
        // AMB-5: an error never raises the credit limit.
        self.end_call(i, Some(&CallDone::failed(user, cxid, status)), None);
    }

    /// A reply (RDMA_MSG with `payload`, or RDMA_NOMSG using the Reply chunk);
    /// `bad_chunks`: its chunk lists break R8166-4.3.1-b (see [`reply_chunks_bad`]).
    ///
    /// Inlined where messages are routed, as are `place_reply` and `parse_reply` in it: a
    /// Short reply's handling, every RPC's on the requester, was three call frames, and is
    /// now part of `dispatch` (the Long reply's path, `take_reply_chunk`, stays apart).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn on_reply(
        &mut self,
        _now: Instant,
        vers: u32,
        xid: u32,
        credit: u32,
        lists: &ChunkLists<'_>,
        payload: Option<&[u8]>,
        bad_chunks: bool,
        inv: Option<u32>,
        env: &mut impl Env,
    ) {
        let Some(i) = self.find_call(xid) else {
            self.stats.dropped += 1;
            return;
        };
        // Its slot, looked up once (a sent call's slot is always there).
        let Some(c) = self.calls.get(i as usize) else {
            return;
        };
        if c.cancelled {
            return self.take_cancelled(i, Some(credit), inv);
        }
        // R8166-4.3.1-b, AMB-9: header errors in a reply are dropped silently.
        if bad_chunks || vers != self.vers {
            self.stats.dropped += 1;
            return;
        }
        self.stats.replies_received += 1;
        self.in_flight = self.in_flight.saturating_sub(1);
        // R8166-3.3.1-f/AMB-4: the grant of every non-error reply, 0 read as 1.
        self.granted = credit.max(1);
        // Filled in place, not returned: a returned record was built, then copied out.
        let mut done = CallDone::failed(c.user, c.xid, CallStatus::Ok);
        if let Err(s) = self.place_reply(c, lists, payload, env, &mut done) {
            // Only a reply's placement ends a call so.
            self.stats.bad_replies += u64::from(s == CallStatus::BadReply);
            done.fail(s);
        }
        self.end_call(i, Some(&done), inv);
    }

    /// Puts the reply's results where the app wants them and checks the echoed chunks;
    /// sets the outcome in `done` (the call's record, its `user` and `xid` set), or fails
    /// with the status the call ends with. Inlined: see [`on_reply`](Self::on_reply).
    #[inline(always)]
    fn place_reply(
        &self,
        c: &Call,
        lists: &ChunkLists<'_>,
        payload: Option<&[u8]>,
        env: &mut impl Env,
        done: &mut CallDone,
    ) -> Result<(), CallStatus> {
        // The start of a Long reply's results, where the binding's checks look
        // (R8166-6.1-c/d); set only on that path.
        let mut head;
        let (stat, reply_len, results) = match payload {
            Some(p) => {
                let Some(h) = rpcmsg::parse_reply(p) else {
                    return Err(CallStatus::BadReply);
                };
                let body = p.get(h.len..).unwrap_or(&[]);
                let Some(dst) = c.reply.prefix(body.len() as u32) else {
                    return Err(CallStatus::ReplyTooLarge);
                };
                if !body.is_empty() && !env.write(dst, body) {
                    return Err(CallStatus::Local);
                }
                (h.stat, body.len() as u32, body)
            }
            None => match self.take_reply_chunk(c, lists, env) {
                Ok((stat, len)) => {
                    head = [0u8; RESULT_HEAD];
                    let n = if c.n_w > 0 {
                        len.min(RESULT_HEAD as u32)
                    } else {
                        0
                    };
                    let (Some(at), Some(to)) = (c.reply.prefix(n), head.get_mut(..n as usize))
                    else {
                        return Err(CallStatus::Local);
                    };
                    if n > 0 && !env.read(at, to) {
                        return Err(CallStatus::Local);
                    }
                    (stat, len, &*to)
                }
                Err(s) => return Err(s),
            },
        };
        let rpc_stat = match stat {
            ReplyStat::Accepted(s) => s,
            ReplyStat::Denied => return Err(CallStatus::Denied),
        };
        done.status = CallStatus::Ok;
        done.rpc_stat = rpc_stat;
        done.reply_len = reply_len;
        done.n_results = c.n_results;
        done.first = (reply_len, 0);
        if c.n_w == 0 {
            return Ok(());
        }
        let mut echoed = lists.writes.iter();
        for k in 0..usize::from(c.n_w) {
            let e = echoed.next();
            // IMPL-3.9.1-a: no result expected, the Write list is ignored (AMB-7).
            if rpc_stat != rpcmsg::SUCCESS {
                continue;
            }
            let used = match e {
                None => 0,
                Some(ch) if ch.is_empty() => 0,
                Some(ch) => {
                    // R8166-3.4.6-c: same segment, length rewritten to what was written.
                    let mut segs = ch.segments();
                    let (Some(s), None, Some(ours)) = (segs.next(), segs.next(), c.wseg.get(k))
                    else {
                        return Err(CallStatus::BadReply);
                    };
                    if s.handle != ours.handle || s.offset != ours.offset || s.length > ours.length
                    {
                        return Err(CallStatus::BadReply);
                    }
                    s.length
                }
            };
            // Every binding here lets a call offer one Write chunk (in a COMPOUND, for its
            // first READ or READLINK), so only the first may be used.
            let placed = if k == 0 {
                result_placed(c, results, reply_len, used)
            } else {
                (used == 0).then_some(reply_len)
            };
            let Some(at) = placed else {
                return Err(CallStatus::BadReply);
            };
            // Only the first can be other than (reply_len, 0) (`CallDone::first`).
            if k == 0 {
                done.first = (at, used);
            }
        }
        Ok(())
    }

    /// Reads the RPC reply header of a Long reply from the landing area and moves the
    /// results to the start of the app's buffer if the header was longer than expected.
    fn take_reply_chunk(
        &self,
        c: &Call,
        lists: &ChunkLists<'_>,
        env: &mut impl Env,
    ) -> Result<(ReplyStat, u32), CallStatus> {
        let rc = lists.reply.ok_or(CallStatus::BadReply)?;
        let n = usize::from(c.n_reply);
        if n == 0 || rc.len() != n {
            return Err(CallStatus::BadReply);
        }
        let mut used = [0u32; 2];
        for (k, s) in rc.segments().enumerate() {
            let ours = c.reply_segs.get(k).ok_or(CallStatus::BadReply)?;
            if s.handle != ours.handle || s.offset != ours.offset || s.length > ours.length {
                return Err(CallStatus::BadReply);
            }
            *used.get_mut(k).ok_or(CallStatus::BadReply)? = s.length;
        }
        // The responder fills segments in order (R8166-3.4.6-b).
        if used[1] > 0 && used[0] != REPLY_HEADER_LEN as u32 {
            return Err(CallStatus::BadReply);
        }
        let slot = c.slot.ok_or(CallStatus::Local)?;
        let land = self
            .send_tail(slot, TAIL_LAND, used[0])
            .ok_or(CallStatus::Local)?;
        let mut hb = [0u8; rpcmsg::MAX_REPLY_HEADER_LEN];
        let (h0, h1) = hb.split_at_mut(REPLY_HEADER_LEN);
        let n0 = used[0] as usize;
        let n1 = (used[1] as usize).min(h1.len());
        if !env.read(land, h0.get_mut(..n0).ok_or(CallStatus::BadReply)?) {
            return Err(CallStatus::Local);
        }
        if n1 > 0 {
            let at = c.reply.prefix(n1 as u32).ok_or(CallStatus::BadReply)?;
            if !env.read(at, h1.get_mut(..n1).ok_or(CallStatus::BadReply)?) {
                return Err(CallStatus::Local);
            }
        }
        let h =
            rpcmsg::parse_reply(hb.get(..n0 + n1).unwrap_or(&[])).ok_or(CallStatus::BadReply)?;
        // R8166-4.2.1-a: the RPC XID in the Reply chunk is the call's.
        if h.xid != c.xid {
            return Err(CallStatus::BadReply);
        }
        let total = used[0].saturating_add(used[1]);
        let body = total.saturating_sub(h.len as u32);
        if h.len > REPLY_HEADER_LEN && body > 0 {
            let shift = (h.len - REPLY_HEADER_LEN) as u32;
            let from = c.reply.sub(shift, body).ok_or(CallStatus::BadReply)?;
            if !env.copy(from, c.reply) {
                return Err(CallStatus::Local);
            }
        }
        Ok((h.stat, body))
    }
}

/// Whether a reply's chunk lists are a header error (R8166-4.3.1-b): a reply carries no Read
/// list, and one with an inline payload (RDMA_MSG) no Reply chunk holding data. Checked by
/// the router before `on_reply`: for a Short message, routed inline in `dispatch` with the
/// constant empty lists, it folds away.
#[inline(always)]
pub(super) fn reply_chunks_bad(lists: &ChunkLists<'_>, inline_payload: bool) -> bool {
    !lists.reads.is_empty() || (inline_payload && lists.reply.is_some_and(|r| r.length() != 0))
}

/// How much of a reply's results the binding's checks read (a Long reply's on the
/// requester, an app's reply stream on the responder). NFSv3 READ's eligible result, the
/// deepest of a fixed layout, starts at 108; a COMPOUND's first READ starts after the results
/// of the operations before it (about 80 bytes for SEQUENCE, PUTFH, READ). One that starts
/// later is treated as unparsable: the responder does not reduce it, and the requester ends a
/// call whose Write chunk was used with such a Long reply (BAD_REPLY).
pub(super) const RESULT_HEAD: usize = 1024;

/// Whether a reply to call `c`, which offered a Write chunk, put the binding's eligible
/// result there and nothing else (`results`: the start of the reduced results, `reply_len`
/// bytes in all; `used`: the bytes the echoed chunk says were written), and if so where in
/// the reduced reply the chunk's bytes belong (`reply_len` when it is unused):
/// - R8166-6.1-d: an eligible result that came inline (its length word not zero and no
///   bytes in the chunk) ends the call with a permanent error;
/// - R8166-6.1-c: so does a chunk holding anything but the eligible result: a reply that
///   has none (an NFS error status) or an unparsable one;
/// - R8166-3.4.6.2-c: the returned length equals the item's length word, which ends the
///   reduced reply where the binding's eligible result is its last item (in a COMPOUND,
///   operations may follow the READ, and the bytes belong after its length word).
fn result_placed(c: &Call, results: &[u8], reply_len: u32, used: u32) -> Option<u32> {
    use rpcrdma_proto::ulb::{eligible_result, result_is_last};
    match eligible_result(c.prog, c.vers, c.proc_, results) {
        Ok(Some(item)) if used > 0 => {
            let in_place = if result_is_last(c.prog, c.vers, c.proc_) {
                item.position == reply_len
            } else {
                item.position <= reply_len
            };
            (in_place && item.length == used).then_some(item.position)
        }
        Ok(Some(item)) => (item.length == 0).then_some(reply_len),
        // Nothing for the chunk: an unparsable reply reaches the app (it is the judge of its
        // own results) unless the chunk claims a place in it.
        Ok(None) | Err(_) => (used == 0).then_some(reply_len),
    }
}

/// Bytes one Write chunk of one segment adds to a reply's header: its discriminator, its
/// segment count and the segment (RFC 8166 §4.2.1).
pub const WRITE_CHUNK_LEN: u32 = 4 + 4 + SEGMENT_LEN as u32;

/// The largest reduced reply (the results, not the RPC reply header) that a call without
/// Write chunks receives inline on a connection of `version` whose reply threshold is
/// `recv_threshold`; each Write chunk takes [`WRITE_CHUNK_LEN`] more. A call whose reply
/// buffer is larger carries a Reply chunk (R8166-4.3.3-a). The daemon tells apps this room
/// for their default reply buffer (the shm ABI's peer table, `reply_inline`).
pub fn reply_inline_room(recv_threshold: u32, version: u32) -> u32 {
    // The fixed words (version two adds one), an empty Read list, an empty Write list, no
    // Reply chunk, then the accepted RPC reply header.
    let fixed = if version == v2::VERSION { 20 } else { 16 };
    recv_threshold.saturating_sub(fixed + 4 + 4 + 4 + REPLY_HEADER_LEN as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_pieces_copies_what_fits() {
        for n in 0..=MAX_PIECES + 2 {
            let src: Vec<u32> = (1..=n as u32).collect();
            let mut dst = [0u32; MAX_PIECES];
            let k = copy_pieces(&mut dst, &src);
            let fit = n.min(MAX_PIECES);
            assert_eq!(usize::from(k), fit);
            assert_eq!(&dst[..fit], &src[..fit]);
            assert!(dst[fit..].iter().all(|&x| x == 0));
        }
    }
}
