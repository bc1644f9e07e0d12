//! The responder half: taking calls in (credit check, chunk validation, RDMA Read pulls and
//! reassembly), and sending replies (Write chunks, Reply chunk, ERR_CHUNK, Send With
//! Invalidate).

use rpcrdma_proto::ulb::{binding, check_read_chunks, eligible_result, result_is_last};
use rpcrdma_proto::{
    rpc::CallHeader, v1, v2, Chunk, ChunkLists, MsgType, ReadList, Segment, WriteList,
};

use super::{
    emit_header, emit_plain, pad4, plain_header_len, round4, scatter, stream_len, tag, walk_stream,
    Accepted, CloseReason, Connection, Event, IncomingCall, ReplyStatus, SendOwner, ServeId, Src,
    SubmitError, Work, K_READ, K_WRITE, MAX_PIECES, MAX_RCHUNKS, MAX_WCHUNKS, TAIL_RPC, TAIL_ZERO,
};
use crate::mem::{Env, MemRef};
use crate::rpcmsg::{self, REPLY_HEADER_LEN};

/// A DDP-eligible result: `mem` belongs at `xdr_pos` of the reduced result XDR.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResultPiece {
    /// The item's data (without XDR pad).
    pub mem: MemRef,
    /// Position in the reduced result XDR (multiple of 4).
    pub xdr_pos: u32,
}

/// A reply to a served call.
#[derive(Clone, Copy, Debug)]
pub struct ReplySpec<'a> {
    /// accept_stat (0 = SUCCESS).
    pub accept_stat: u32,
    /// Reduced result XDR.
    pub msg: MemRef,
    /// DDP-eligible results, by ascending position. Empty, on a call that offered a Write
    /// chunk: the engine looks for the binding's eligible result in `msg` (at its end; in an
    /// NFSv4 COMPOUND, the first READ's or READLINK's data, wherever it is) and reduces it
    /// into the chunk (R8166-6.1).
    pub results: &'a [ResultPiece],
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    #[default]
    Free,
    PullingHead,
    Waiting,
    Pulling,
    Ready,
    Replying,
}

/// Whether the app has heard of a call the engine answers: only then is the call's end
/// reported to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Heard {
    /// Answered before it was delivered (a header error, a refused credential...).
    NotYet,
    /// Delivered as [`Event::IncomingCall`].
    ByApp,
}

#[derive(Clone, Copy, Debug, Default)]
struct DataChunk {
    position: u32,
    len: u32,
    first: u8,
    n: u8,
}

/// One call being served.
///
/// Laid out in declaration order (`repr(C)`): what every call touches comes first, the
/// segment array that only chunked calls fill last, so a plain call's record spans few
/// cache lines.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Serve {
    state: State,
    n_segs: u8,
    p0: u8,
    n_pzrc: u8,
    n_dchunk: u8,
    n_wchunk: u8,
    r0: u8,
    n_rseg: u8,
    has_reply: bool,
    counted: bool,
    silent: bool,
    gen: u32,
    xid: u32,
    vers: u32,
    prog: u32,
    prog_vers: u32,
    proc_: u32,
    s_off: u32,
    s_len: u32,
    s_local: u32,
    args_off: u32,
    args_len: u32,
    reads_pending: u32,
    inv_rkey: Option<u32>,
    status: Option<ReplyStatus>,
    /// The receive buffer still holding the inline payload (or the PZRC head).
    recv: Option<MemRef>,
    dest: MemRef,
    wchunk: [(u8, u8); MAX_WCHUNKS],
    dchunk: [DataChunk; MAX_RCHUNKS],
    /// Every segment of the call: PZRC, data chunks, Write chunks, Reply chunk (by range).
    segs: [Segment; CALL_SEGS],
}

impl Serve {
    fn id(&self, slot: u32) -> ServeId {
        ServeId {
            slot,
            gen: self.gen,
        }
    }

    /// Ends the call because the connection ended.
    pub(super) fn abort(&mut self, slot: u32) -> Option<Event> {
        let ev = match self.state {
            State::Free | State::PullingHead => None,
            State::Replying if self.silent => None,
            State::Replying => Some(Event::ReplyDone {
                id: self.id(slot),
                status: ReplyStatus::Closed,
            }),
            _ => Some(Event::ServeAborted { id: self.id(slot) }),
        };
        self.state = State::Free;
        ev
    }

    /// Prepares the slot for a new call in place (its segment arrays are only read up to
    /// their counts, so they are not cleared).
    fn reset(&mut self, xid: u32, vers: u32, recv: MemRef) {
        self.state = State::Waiting;
        self.gen = self.gen.wrapping_add(1) & 0xffff;
        self.xid = xid;
        self.vers = vers;
        self.prog = 0;
        self.prog_vers = 0;
        self.proc_ = 0;
        self.recv = Some(recv);
        self.s_off = 0;
        self.s_len = 0;
        self.s_local = 0;
        self.n_segs = 0;
        self.p0 = 0;
        self.n_pzrc = 0;
        self.r0 = 0;
        self.n_dchunk = 0;
        self.n_wchunk = 0;
        self.n_rseg = 0;
        self.has_reply = false;
        self.inv_rkey = None;
        self.args_off = 0;
        self.args_len = 0;
        self.dest = MemRef::default();
        self.reads_pending = 0;
        self.counted = true;
        self.silent = false;
        self.status = None;
    }

    /// Takes the held receive buffer (to release it).
    pub(super) fn take_recv(&mut self) -> Option<MemRef> {
        self.recv.take()
    }

    fn range(&self, first: u8, n: u8) -> &[Segment] {
        self.segs
            .get(usize::from(first)..usize::from(first) + usize::from(n))
            .unwrap_or(&[])
    }

    fn wchunk_segs(&self, k: usize) -> &[Segment] {
        let (f, n) = self.wchunk.get(k).copied().unwrap_or_default();
        self.range(f, n)
    }

    fn pzrc(&self) -> &[Segment] {
        self.range(self.p0, self.n_pzrc)
    }

    fn rsegs(&self) -> &[Segment] {
        self.range(self.r0, self.n_rseg)
    }
}

/// An RDMA Read waiting for room under the ORD limit.
#[derive(Clone, Copy, Debug)]
pub(super) struct PendingRead {
    serve: u32,
    local: MemRef,
    rkey: u32,
    addr: u64,
}

/// A piece of the reassembled call: part of the stream S, a data chunk, or zero pad.
#[derive(Clone, Copy, Debug)]
enum Piece {
    Stream { s: u32, u: u32, len: u32 },
    Chunk { k: usize, u: u32, len: u32 },
    Zero { u: u32, len: u32 },
}

const MAX_PLAN: usize = 3 * MAX_RCHUNKS + 1;
/// Segments one call may carry in all its chunks together (more is answered ERR_CHUNK).
const CALL_SEGS: usize = 32;

fn push<T: Copy>(arr: &mut [T], n: &mut usize, v: T) -> Option<()> {
    *arr.get_mut(*n)? = v;
    *n += 1;
    Some(())
}

/// Checks a call against its header and binding and records its shape in `s`: the
/// reassembled argument length, its generation and XID; `Err(Some(stat))` to answer with an
/// RPC reply of that accept_stat, `Err(None)` for a header error.
///
/// Inlined, like `prepare_call`, into the receive of every call; a call without data
/// chunks (nearly all) only compares and stores a few words here, and the checks and plan
/// of data chunks stay out of line.
#[inline(always)]
fn prepare_verdict(
    s: &mut Serve,
    call: &CallHeader,
    head: &[u8],
    reads: Option<&ReadList<'_>>,
) -> Result<(u32, u32, u32), Option<u32>> {
    if call.xid != s.xid {
        // R8166-4.2.1-a.
        return Err(None);
    }
    if s.n_dchunk > 0 && !data_chunks_allowed(s, call, head, reads) {
        // R8166-6.1-b with AMB-12: GARBAGE_ARGS, the call is not executed.
        return Err(Some(rpcmsg::GARBAGE_ARGS));
    }
    s.args_off = u32::try_from(call.args_offset).map_err(|_| Some(rpcmsg::GARBAGE_ARGS))?;
    let u_len = if s.n_dchunk == 0 {
        // No data chunk: the call is the stream S as it came.
        s.s_len
    } else {
        reassembled_len(s).ok_or(Some(rpcmsg::GARBAGE_ARGS))?
    };
    let args_len = u_len
        .checked_sub(s.args_off)
        .ok_or(Some(rpcmsg::GARBAGE_ARGS))?;
    s.args_len = args_len;
    s.prog = call.prog;
    s.prog_vers = call.vers;
    s.proc_ = call.proc;
    Ok((args_len, s.gen, s.xid))
}

/// Whether the binding lets the call's data chunks carry its arguments (R8166-6.1-b).
#[inline(never)]
fn data_chunks_allowed(
    s: &Serve,
    call: &CallHeader,
    head: &[u8],
    reads: Option<&ReadList<'_>>,
) -> bool {
    let b = binding(call.prog, call.vers, call.proc);
    match reads {
        Some(r) => check_read_chunks(head, r).is_ok(),
        None => b.arg_eligible && s.n_dchunk <= b.max_read_chunks,
    }
}

/// The length of a call with data chunks once reassembled (`None`: the chunks do not fit
/// together, see [`plan`]).
#[inline(never)]
fn reassembled_len(s: &Serve) -> Option<u32> {
    let mut pieces = [Piece::Zero { u: 0, len: 0 }; MAX_PLAN];
    Some(plan(s, &mut pieces)?.1)
}

/// How the call is put together (RFC 8166 §3.4.5, AMB-10): the stream S (inline payload,
/// or PZRC content) with each data chunk inserted at its position, pad zeroed.
fn plan(s: &Serve, out: &mut [Piece; MAX_PLAN]) -> Option<(usize, u32)> {
    let mut order = [0usize; MAX_RCHUNKS];
    let n = usize::from(s.n_dchunk);
    for (k, o) in order.iter_mut().enumerate() {
        *o = k;
    }
    let order = order.get_mut(..n)?;
    order.sort_unstable_by_key(|&k| s.dchunk.get(k).map_or(0, |c| c.position));
    let (mut u, mut sp, mut np) = (0u32, 0u32, 0usize);
    for &k in order.iter() {
        let c = s.dchunk.get(k)?;
        if c.position < u || c.position < s.args_off {
            return None;
        }
        let gap = c.position - u;
        let s_to = sp.checked_add(gap)?;
        if s_to > s.s_len {
            return None;
        }
        if gap > 0 {
            push(out, &mut np, Piece::Stream { s: sp, u, len: gap })?;
        }
        push(
            out,
            &mut np,
            Piece::Chunk {
                k,
                u: c.position,
                len: c.len,
            },
        )?;
        if pad4(c.len) > 0 {
            push(
                out,
                &mut np,
                Piece::Zero {
                    u: c.position.checked_add(c.len)?,
                    len: pad4(c.len),
                },
            )?;
        }
        u = c.position.checked_add(round4(c.len))?;
        sp = s_to;
    }
    let rest = s.s_len - sp;
    if rest > 0 {
        push(
            out,
            &mut np,
            Piece::Stream {
                s: sp,
                u,
                len: rest,
            },
        )?;
    }
    Some((np, u.checked_add(rest)?))
}

impl Connection {
    /// A received call; true if its receive buffer is kept for the serve slot. `lists`:
    /// its chunk lists, `None` when all three are empty (the router tells, where a Short
    /// message's empty lists are constants).
    ///
    /// Inlined where messages are routed, like `on_reply`: a Short call's receive, every
    /// RPC's on the responder, is then one call frame (`handle_completion`).
    #[inline(always)]
    pub(super) fn on_call(
        &mut self,
        slot: MemRef,
        vers: u32,
        xid: u32,
        lists: Option<&ChunkLists<'_>>,
        inline: Option<(usize, &[u8])>,
        env: &mut impl Env,
    ) -> bool {
        self.stats.calls_received += 1;
        self.learn_client_version(vers);
        // The peer may not have more calls outstanding than granted (R8166-3.3.1-b); after
        // a lowered grant it may still be using the higher one it last saw. The call is
        // not taken: its receive buffer goes back at once.
        if self.in_process >= self.grant_peak {
            self.close(CloseReason::CreditOverrun);
            return false;
        }
        let Some(i) = self.serve_free.pop() else {
            self.close(CloseReason::CreditOverrun);
            return false;
        };
        self.in_process += 1;
        match inline {
            Some((header_len, payload)) => {
                // The slot is filled, its stream set and the call judged in one look.
                let reads = lists.map_or(&ReadList::EMPTY, |l| &l.reads);
                let start = InlineStart {
                    xid,
                    vers,
                    recv: slot,
                    lists,
                    header_len: header_len as u32,
                };
                self.prepare_call(i, payload, Some(reads), Some(start), env);
            }
            None => {
                let filled = self
                    .serves
                    .get_mut(i as usize)
                    .is_some_and(|s| fill_slot(s, xid, vers, slot, lists));
                if filled {
                    self.pull_head(i, env);
                } else {
                    self.serve_fail_header(i, Heard::NotYet, env);
                }
            }
        }
        true
    }

    /// Starts pulling the first bytes of a PZRC into the call's receive buffer, to learn
    /// which program it is for.
    fn pull_head(&mut self, i: u32, env: &mut impl Env) {
        let Some(s) = self.serves.get(i as usize).copied() else {
            return;
        };
        let total = s
            .pzrc()
            .iter()
            .try_fold(0u32, |a, g| a.checked_add(g.length));
        let Some(total) = total.filter(|&t| t <= self.cfg.max_call_size.saturating_add(1024))
        else {
            // R8166-8.1.4-a: an unreasonably large chunk is refused without any Read.
            return self.serve_fail_header(i, Heard::NotYet, env);
        };
        let head = total.min(self.cfg.recv_size);
        let dest = s.recv.and_then(|b| b.prefix(head));
        let Some(dest) = dest else {
            return self.serve_fail_header(i, Heard::NotYet, env);
        };
        if let Some(d) = self.serves.get_mut(i as usize) {
            d.state = State::PullingHead;
            d.s_off = 0;
            d.s_len = total;
            d.s_local = head;
        }
        if self.queue_reads(i, s.pzrc(), 0, head, dest).is_none() {
            return self.serve_fail_header(i, Heard::NotYet, env);
        }
        self.pump_reads();
        if s.n_pzrc > 0 && head == 0 {
            self.on_head_ready(i, env);
        }
    }

    /// Queues RDMA Reads of bytes `from..from + len` of the chunk made of `segs` into `dest`.
    fn queue_reads(
        &mut self,
        i: u32,
        segs: &[Segment],
        from: u32,
        len: u32,
        dest: MemRef,
    ) -> Option<()> {
        let end = from.checked_add(len)?;
        let mut at = 0u32;
        let mut done = 0u32;
        for g in segs {
            let g_end = at.checked_add(g.length)?;
            let a = from.max(at);
            let b = end.min(g_end);
            if a < b {
                let n = b - a;
                self.reads.push_back(PendingRead {
                    serve: i,
                    local: dest.sub(done, n)?,
                    rkey: g.handle,
                    addr: g.offset.checked_add(u64::from(a - at))?,
                });
                done += n;
                if let Some(s) = self.serves.get_mut(i as usize) {
                    s.reads_pending += 1;
                }
            }
            at = g_end;
        }
        (done == len).then_some(())
    }

    /// Posts queued RDMA Reads up to the ORD limit (R8166-3.3.1-j).
    pub(super) fn pump_reads(&mut self) {
        while self.reads_out < self.cfg.max_reads {
            let Some(r) = self.reads.pop_front() else {
                break;
            };
            self.reads_out += 1;
            self.stats.read_bytes += u64::from(r.local.len);
            self.work.push_back(Work::Read {
                tag: tag(K_READ, r.serve),
                local: r.local,
                rkey: r.rkey,
                addr: r.addr,
            });
        }
    }

    pub(super) fn on_read_done(&mut self, i: u32, env: &mut impl Env) {
        self.reads_out = self.reads_out.saturating_sub(1);
        let Some(s) = self.serves.get_mut(i as usize) else {
            return;
        };
        s.reads_pending = s.reads_pending.saturating_sub(1);
        if s.reads_pending > 0 {
            return;
        }
        match s.state {
            State::PullingHead => self.on_head_ready(i, env),
            State::Pulling => {
                // R8166-3.4.5.1-a: every Read of the call is done before it is delivered.
                s.state = State::Ready;
                let ev = Event::ArgsReady {
                    id: s.id(i),
                    args_len: s.args_len,
                };
                self.events.push_back(ev);
            }
            _ => {}
        }
    }

    fn on_head_ready(&mut self, i: u32, env: &mut impl Env) {
        let Some(s) = self.serves.get(i as usize).copied() else {
            return;
        };
        let mut scratch = std::mem::take(&mut self.scratch);
        let n = s.s_local as usize;
        let src = s.recv.and_then(|b| b.prefix(s.s_local));
        let ok = match (src, scratch.get_mut(..n)) {
            (Some(src), Some(dst)) => env.read(src, dst),
            _ => false,
        };
        if ok {
            let head = scratch.get(..n).unwrap_or(&[]);
            self.prepare_call(i, head, None, None, env);
        } else {
            self.close(CloseReason::Local("receive buffer read"));
        }
        self.scratch = scratch;
    }

    /// Checks the call against its binding, computes its reassembled size and tells the
    /// owner (`head`: the first bytes of the stream; `reads`: the Read list of an
    /// RDMA_MSG call, for the ULB check; `start`: the received call an inline call's
    /// receive fills the slot with first, `head` being its whole stream).
    ///
    /// Inlined in its two callers (`on_call` for every inline call): as separate functions,
    /// it and `prepare_verdict` cost two call frames per call, the verdict returned through
    /// memory, and the serve slot looked up again.
    #[inline(always)]
    fn prepare_call(
        &mut self,
        i: u32,
        head: &[u8],
        reads: Option<&ReadList<'_>>,
        start: Option<InlineStart<'_>>,
        env: &mut impl Env,
    ) {
        // Borrowed where it was parsed: moved out, the header was copied word by word.
        let parsed = CallHeader::parse(head);
        // The serve slot is looked up once; it stays borrowed but for the answers that
        // end the call here. Checked in place: the slot is large, copying it per call costs.
        let Some(s) = self.serves.get_mut(i as usize) else {
            return;
        };
        // The receive of an inline call fills the slot in the same look; chunk lists that
        // do not fit are a header error, answered before the RPC header is looked at.
        if let Some(st) = start {
            if !fill_slot(s, st.xid, st.vers, st.recv, st.lists) {
                return self.serve_fail_header(i, Heard::NotYet, env);
            }
            s.s_off = st.header_len;
            s.s_len = head.len() as u32;
            s.s_local = s.s_len;
        }
        let Ok(call) = &parsed else {
            return self.serve_status_reply(i, rpcmsg::GARBAGE_ARGS, Heard::NotYet, env);
        };
        let bad_sys = call.cred_flavor == rpcrdma_proto::rpc::AUTH_SYS && call.auth_sys.is_none();
        if (call.cred_flavor == rpcrdma_proto::rpc::RPCSEC_GSS || bad_sys) && s.xid == call.xid {
            // Apps receive the arguments and an AUTH_SYS identity only, so no app could
            // verify a GSS call: refuse it as a server without GSS does, before anything of it
            // is pulled or reduced (R8166-8.2.2-a, -8.2.2.3-a); a malformed AUTH_SYS
            // credential likewise (RFC 5531 §9: AUTH_BADCRED).
            let hdr = rpcmsg::auth_error_reply(call.xid, rpcmsg::AUTH_BADCRED);
            return self.serve_rpc_reply(i, &hdr, Heard::NotYet, env);
        }
        let (args_len, id, xid) = match prepare_verdict(s, call, head, reads) {
            Ok(x) => x,
            Err(Some(stat)) => return self.serve_status_reply(i, stat, Heard::NotYet, env),
            Err(None) => return self.serve_fail_header(i, Heard::NotYet, env),
        };
        if args_len > self.cfg.max_call_size {
            return self.serve_fail_header(i, Heard::NotYet, env);
        }
        s.state = State::Waiting;
        self.events.push_back(Event::IncomingCall(IncomingCall {
            id: ServeId { slot: i, gen: id },
            xid,
            prog: call.prog,
            vers: call.vers,
            proc_: call.proc,
            args_len,
            auth: call.auth_sys,
        }));
    }

    fn serve_index(&self, id: ServeId, want: State) -> Result<u32, SubmitError> {
        if self.closed.is_some() {
            return Err(SubmitError::Closed);
        }
        match self.serves.get(id.slot as usize) {
            Some(s) if s.gen == id.gen && s.state == want => Ok(id.slot),
            _ => Err(SubmitError::BadId),
        }
    }

    /// Places the arguments of an [`IncomingCall`] in `dest` (at least `args_len` bytes):
    /// inline parts are copied at once, chunks pulled with RDMA Read. The answer says
    /// whether they are in place already ([`Accepted::Ready`]) or [`Event::ArgsReady`]
    /// follows ([`Accepted::Pulling`]).
    ///
    /// Inlined where it is called, with [`accept_inline`](Self::accept_inline): a call
    /// without chunks is a few checks and one copy, cheaper than the call frame, the answer
    /// returned through memory and the large frame the chunked case needs, which stays out
    /// of line.
    #[inline]
    pub fn accept_call(
        &mut self,
        id: ServeId,
        dest: MemRef,
        env: &mut impl Env,
    ) -> Result<Accepted, SubmitError> {
        let i = self.serve_index(id, State::Waiting)?;
        match self.accept_inline(i, dest, env) {
            Some(done) => done,
            None => self.accept_chunked(i, dest, env),
        }
    }

    /// [`accept_call`](Self::accept_call) for a call with chunks (slot `i`).
    #[inline(never)]
    fn accept_chunked(
        &mut self,
        i: u32,
        dest: MemRef,
        env: &mut impl Env,
    ) -> Result<Accepted, SubmitError> {
        let Some(s) = self.serves.get(i as usize).copied() else {
            return Err(SubmitError::BadId);
        };
        if dest.len < s.args_len {
            return Err(SubmitError::Invalid("buffer smaller than the arguments"));
        }
        let mut pieces = [Piece::Zero { u: 0, len: 0 }; MAX_PLAN];
        let Some((np, _)) = plan(&s, &mut pieces) else {
            return Err(SubmitError::BadId);
        };
        let recv = s.recv;
        let mut ok = true;
        for p in pieces.iter().take(np) {
            ok &= self.place_piece(i, &s, *p, recv, dest, env).is_some();
        }
        if let Some(r) = self.serves.get_mut(i as usize).and_then(|d| d.recv.take()) {
            self.release_recv(r);
        }
        if !ok {
            self.close(CloseReason::Local("argument placement"));
            return Err(SubmitError::Closed);
        }
        let Some(d) = self.serves.get_mut(i as usize) else {
            return Err(SubmitError::BadId);
        };
        d.dest = dest;
        if d.reads_pending == 0 {
            d.state = State::Ready;
            Ok(Accepted::Ready {
                args_len: d.args_len,
            })
        } else {
            d.state = State::Pulling;
            self.pump_reads();
            Ok(Accepted::Pulling)
        }
    }

    /// The common case without chunks: one copy from the receive buffer, no plan.
    #[inline]
    fn accept_inline(
        &mut self,
        i: u32,
        dest: MemRef,
        env: &mut impl Env,
    ) -> Option<Result<Accepted, SubmitError>> {
        let s = self.serves.get_mut(i as usize)?;
        if s.n_pzrc > 0 || s.n_dchunk > 0 {
            return None;
        }
        if dest.len < s.args_len {
            return Some(Err(SubmitError::Invalid(
                "buffer smaller than the arguments",
            )));
        }
        let from = s
            .recv
            .and_then(|r| r.sub(s.s_off.checked_add(s.args_off)?, s.args_len));
        let to = dest.prefix(s.args_len);
        let recv = s.recv.take();
        s.dest = dest;
        s.state = State::Ready;
        let args_len = s.args_len;
        let ok = match (from, to) {
            (Some(f), Some(t)) => args_len == 0 || env.copy(f, t),
            _ => false,
        };
        if let Some(r) = recv {
            self.release_recv(r);
        }
        if !ok {
            self.close(CloseReason::Local("argument placement"));
            return Some(Err(SubmitError::Closed));
        }
        Some(Ok(Accepted::Ready { args_len }))
    }

    fn place_piece(
        &mut self,
        i: u32,
        s: &Serve,
        p: Piece,
        recv: Option<MemRef>,
        dest: MemRef,
        env: &mut impl Env,
    ) -> Option<()> {
        match p {
            Piece::Stream { s: a, u, len } => {
                // Only the arguments go to the app, not the RPC header.
                let end = u.checked_add(len)?;
                if end <= s.args_off {
                    return Some(());
                }
                let skip = s.args_off.saturating_sub(u);
                let (a, u, len) = (a + skip, u + skip, len - skip);
                let d = dest.sub(u - s.args_off, len)?;
                let local = s.s_local.saturating_sub(a).min(len);
                if local > 0 && !env.copy(recv?.sub(s.s_off.checked_add(a)?, local)?, d) {
                    return None;
                }
                if local < len {
                    self.queue_reads(
                        i,
                        s.pzrc(),
                        a + local,
                        len - local,
                        d.sub(local, len - local)?,
                    )?;
                }
            }
            Piece::Chunk { k, u, len } => {
                let c = s.dchunk.get(k)?;
                let segs = s.segs;
                let segs =
                    segs.get(usize::from(c.first)..usize::from(c.first) + usize::from(c.n))?;
                self.queue_reads(i, segs, 0, len, dest.sub(u.checked_sub(s.args_off)?, len)?)?;
            }
            Piece::Zero { u, len } => {
                let d = dest.sub(u.checked_sub(s.args_off)?, len)?;
                if !env.write(d, &[0u8; 4][..len as usize % 4]) {
                    return None;
                }
            }
        }
        Some(())
    }

    /// Answers an [`IncomingCall`] without running it, with an RPC reply carrying
    /// `accept_stat` (PROG_UNAVAIL when no app serves the program, SYSTEM_ERR when no
    /// buffer is free); [`Event::ReplyDone`] follows.
    pub fn reject_call(
        &mut self,
        id: ServeId,
        accept_stat: u32,
        env: &mut impl Env,
    ) -> Result<(), SubmitError> {
        let i = self.serve_index(id, State::Waiting)?;
        self.serve_status_reply(i, accept_stat, Heard::ByApp, env);
        Ok(())
    }

    /// Sends reply `spec` to a call whose arguments are in place ([`Accepted::Ready`] or
    /// [`Event::ArgsReady`]);
    /// [`Event::ReplyDone`] follows once the RDMA Writes and the Send completed.
    pub fn submit_reply(
        &mut self,
        id: ServeId,
        spec: &ReplySpec<'_>,
        env: &mut impl Env,
    ) -> Result<(), SubmitError> {
        let i = self.serve_index(id, State::Ready)?;
        if spec.results.len() > MAX_PIECES {
            return Err(SubmitError::Invalid("too many results"));
        }
        let mut last = 0u32;
        for r in spec.results {
            if r.xdr_pos % 4 != 0 || r.xdr_pos < last || r.xdr_pos > spec.msg.len {
                return Err(SubmitError::Invalid("result positions"));
            }
            last = r.xdr_pos;
        }
        // No send buffer free (shared pool exhausted): the owner retries later.
        let slot = self
            .alloc_send(SendOwner::Serve(i), env)
            .ok_or(SubmitError::Busy)?;
        match self.build_reply(i, slot, spec, env) {
            Some(true) => {}
            // The requester's chunks cannot take this reply (R8166-4.5.3-b, R8166-8.1.4-b).
            Some(false) => {
                self.free_send(slot);
                self.serve_fail_header(i, Heard::ByApp, env);
            }
            None => self.close(CloseReason::Local("reply marshalling")),
        }
        Ok(())
    }

    /// Builds and queues the reply; `Some(false)` if it does not fit the chunks offered.
    fn build_reply(
        &mut self,
        i: u32,
        slot: u32,
        spec: &ReplySpec<'_>,
        env: &mut impl Env,
    ) -> Option<bool> {
        // The dominant case, no Write chunk and a reply that fits inline, reads the few
        // words it needs of the serve record and finds the record once more to mark it sent.
        let s = self.serves.get(i as usize)?;
        let plain = if s.n_wchunk == 0 {
            let (v2, xid) = (s.vers == v2::VERSION, s.xid);
            self.reply_plain(v2, xid, slot, spec, env)
        } else {
            None
        };
        let buf = match plain {
            Some(buf) => buf?,
            None => {
                // Built from the serve slot in place, not from a copy (the record is large):
                // the slots are lent out of `self` while `reply_from`, which touches no other
                // serve, runs.
                let mut serves = std::mem::take(&mut self.serves);
                let r = match serves.get_mut(i as usize) {
                    Some(s) => self.reply_from(s, i, slot, spec, env),
                    None => None,
                };
                self.serves = serves;
                match r? {
                    Some(buf) => buf,
                    None => return Some(false),
                }
            }
        };
        // The Send is queued here for both paths, and the serve marked sent: one copy of
        // this code in `submit_reply` instead of one per path.
        let s = self.serves.get_mut(i as usize)?;
        let inv_rkey = s.inv_rkey;
        s.state = State::Replying;
        s.status = Some(ReplyStatus::Sent);
        if s.counted {
            s.counted = false;
            self.in_process = self.in_process.saturating_sub(1);
        }
        self.queue_reply(slot, buf, inv_rkey);
        Some(true)
    }

    /// [`build_reply`](Self::build_reply) for serve `s` (slot `i`): the bytes to send, or
    /// `Some(None)` if the reply does not fit the chunks offered. The echoed chunk
    /// lengths are rewritten in `s.segs` itself: once the reply is built nothing reads the
    /// offered lengths again, and nothing is rewritten before the last `Some(None)`.
    ///
    /// Not inlined: the general path (Write chunks, Reply chunk) stays out of
    /// `submit_reply`, whose dominant case, the plain reply, is then less code.
    #[inline(never)]
    fn reply_from(
        &mut self,
        s: &mut Serve,
        i: u32,
        slot: u32,
        spec: &ReplySpec<'_>,
        env: &mut impl Env,
    ) -> Option<Option<MemRef>> {
        let mut found = [ResultPiece::default()];
        // What follows a result found inline in the stream (a COMPOUND's operations after
        // its READ): it travels after the result's place, as the reduced stream's last item.
        let mut rest = None;
        let reduced;
        let spec = match inline_result(s, spec, env) {
            Some((piece, after)) => {
                found[0] = piece;
                rest = after;
                reduced = ReplySpec {
                    msg: spec.msg.prefix(piece.xdr_pos)?,
                    results: &found,
                    ..*spec
                };
                &reduced
            }
            None => spec,
        };
        let v2 = s.vers == v2::VERSION;
        let fixed = if v2 { 20u32 } else { 16 };
        // R8166-3.5.3-e, R8166-4.3.2-a: DDP results go to the Write chunks, in order. A
        // chunk without segments asks for its result inline (RFC 8267 §5: a client that wants
        // one READ of a COMPOUND inline offers an empty chunk in its place).
        let mut to_chunk = [false; MAX_PIECES];
        for (k, r) in spec.results.iter().enumerate() {
            if k < usize::from(s.n_wchunk) && !s.wchunk_segs(k).is_empty() {
                let cap = s
                    .wchunk_segs(k)
                    .iter()
                    .map(|g| u64::from(g.length))
                    .sum::<u64>();
                if u64::from(r.mem.len) > cap {
                    return Some(None);
                }
                to_chunk[k] = true;
            }
        }
        let hdr24 = rpcmsg::reply_header(s.xid, spec.accept_stat);
        // The results that travel in the reduced reply stream R, after its RPC header.
        let items = || {
            spec.results
                .iter()
                .zip(to_chunk)
                .filter(|(_, c)| !c)
                .map(|(r, _)| (r.xdr_pos, r.mem))
                .chain(rest.map(|m| (spec.msg.len, m)))
        };
        let r_len = stream_len(spec.msg, items())?.checked_add(hdr24.len() as u32)?;
        let wlist_len: u32 = 4
            + (0..usize::from(s.n_wchunk))
                .map(|k| 8 + 16 * s.wchunk_segs(k).len() as u32)
                .sum::<u32>();
        let short = (fixed + 4 + wlist_len + 4).checked_add(r_len)? <= self.threshold();
        let reply_cap = s.rsegs().iter().map(|g| u64::from(g.length)).sum::<u64>();
        let fits_reply_chunk = s.has_reply && u64::from(r_len) <= reply_cap;
        if !short && !fits_reply_chunk {
            return Some(None);
        }

        // RDMA Writes first: they precede the reply's Send on the queue pair (R8166-2.3.2-c).
        for (k, r) in spec.results.iter().enumerate() {
            if !to_chunk[k] {
                continue;
            }
            let (first, n) = s.wchunk.get(k).copied()?;
            let segs = s.range(first, n);
            let work = &mut self.work;
            let used = scatter(&[r.mem], segs, |local, si, off| {
                if let Some(g) = segs.get(si) {
                    work.push_back(Work::Write {
                        tag: tag(K_WRITE, i),
                        local,
                        rkey: g.handle,
                        addr: g.offset.wrapping_add(u64::from(off)),
                        signaled: false,
                    });
                }
            })?;
            // R8166-3.4.6-c: the echo keeps every segment, lengths rewritten.
            for (j, e) in s
                .segs
                .iter_mut()
                .skip(usize::from(first))
                .take(usize::from(n))
                .enumerate()
            {
                e.length = used.get(j).copied().unwrap_or(0);
            }
            self.stats.write_bytes += u64::from(r.mem.len);
        }
        // R8166-4.3.2.2-a, AMB-7: unused chunks go back with every length 0.
        for k in spec.results.len()..usize::from(s.n_wchunk) {
            let (first, n) = s.wchunk.get(k).copied()?;
            for e in s
                .segs
                .iter_mut()
                .skip(usize::from(first))
                .take(usize::from(n))
            {
                e.length = 0;
            }
        }
        if !short {
            // R, in memory the RDMA Writes can read: the RPC header and the pad come from
            // the send buffer's tail.
            let rpc_tail = self.send_tail(slot, TAIL_RPC, REPLY_HEADER_LEN as u32)?;
            let zero_tail = self.send_tail(slot, TAIL_ZERO, 4)?;
            if !env.write(rpc_tail, &hdr24) || !env.write(zero_tail, &[0; 4]) {
                return None;
            }
            let mut src = [MemRef::default(); 2 + 3 * MAX_PIECES];
            let mut n_src = 0usize;
            push(&mut src, &mut n_src, rpc_tail)?;
            walk_stream(spec.msg, items(), |p| match p {
                Src::Mem(m) if m.len == 0 => Some(()),
                Src::Mem(m) => push(&mut src, &mut n_src, m),
                Src::Zero(z) => push(&mut src, &mut n_src, zero_tail.prefix(z)?),
            })?;
            let src = src.get(..n_src)?;
            let segs = s.rsegs();
            let work = &mut self.work;
            let used = scatter(src, segs, |local, si, off| {
                if let Some(g) = segs.get(si) {
                    work.push_back(Work::Write {
                        tag: tag(K_WRITE, i),
                        local,
                        rkey: g.handle,
                        addr: g.offset.wrapping_add(u64::from(off)),
                        signaled: false,
                    });
                }
            })?;
            let r0 = usize::from(s.r0);
            for (j, e) in s
                .segs
                .iter_mut()
                .skip(r0)
                .take(usize::from(s.n_rseg))
                .enumerate()
            {
                e.length = used.get(j).copied().unwrap_or(0);
            }
            self.stats.long_replies += 1;
        }
        let wchunks: [Chunk<'_>; MAX_WCHUNKS] = core::array::from_fn(|k| {
            let (f, n) = s.wchunk.get(k).copied().unwrap_or_default();
            Chunk::from_segments(
                s.segs
                    .get(usize::from(f)..usize::from(f) + usize::from(n))
                    .unwrap_or(&[]),
            )
        });
        let chunks = ChunkLists {
            reads: ReadList::EMPTY,
            writes: WriteList::from_chunks(wchunks.get(..usize::from(s.n_wchunk))?),
            // AMB-8: an inline reply marks the Reply chunk absent.
            reply: (!short).then(|| {
                Chunk::from_segments(
                    s.segs
                        .get(usize::from(s.r0)..usize::from(s.r0) + usize::from(s.n_rseg))
                        .unwrap_or(&[]),
                )
            }),
        };
        let credit = self.grant;
        let n = emit_header(
            &mut self.hdr,
            v2,
            short,
            MsgType::Reply,
            s.xid,
            credit,
            &chunks,
        )?;
        let total = if short { n.checked_add(r_len)? } else { n };
        let buf = self.send_buf(slot)?.prefix(total)?;
        if short {
            self.write_short(buf, n, &hdr24, spec.msg, items(), env)?;
        } else if !env.write(buf, self.hdr.get(..n as usize)?) {
            return None;
        }
        Some(Some(buf))
    }

    /// Queues the reply's Send (`inv_rkey`: the call's one offered key, if any).
    #[inline]
    fn queue_reply(&mut self, slot: u32, buf: MemRef, inv_rkey: Option<u32>) {
        // XCH-3.2-b, AMB-28: Send With Invalidate only if allowed and one key was offered.
        let invalidate = if self.peer_takes_inv { inv_rkey } else { None };
        self.queue_send(slot, buf, invalidate);
        self.stats.replies_sent += 1;
        self.stats.replies_with_invalidate += u64::from(invalidate.is_some());
    }

    /// The dominant case of [`build_reply`](Self::build_reply): the call (version two if
    /// `v2`, `xid`) offered no Write chunk and the reply fits inline, so it goes as a Short
    /// reply without chunks (an offered Reply chunk stays unused and is marked absent,
    /// AMB-8), written into send buffer `slot`. `None`: not this case (the reply needs the
    /// Reply chunk), nothing done; `Some(None)`: memory failed; else the bytes to send.
    fn reply_plain(
        &mut self,
        v2: bool,
        xid: u32,
        slot: u32,
        spec: &ReplySpec<'_>,
        env: &mut impl Env,
    ) -> Option<Option<MemRef>> {
        let items = || spec.results.iter().map(|r| (r.xdr_pos, r.mem));
        // The stream's length counted, not walked (the write walks it): the message and
        // each result with its pad, `submit_reply` having checked that the results lie
        // within the message in order. A message piece the walk cannot name fails the
        // write instead, which fails the reply as the general path's count would.
        let mut stream = spec.msg.len;
        for (_, m) in items() {
            stream = stream.checked_add(m.len)?.checked_add(pad4(m.len))?;
        }
        // The message's length: fixed words, three empty lists (a word each), RPC header,
        // payload.
        let len = plain_header_len(v2)
            .checked_add(u32::try_from(REPLY_HEADER_LEN).ok()?)?
            .checked_add(stream)?;
        // Too long to go inline: the general path uses the Reply chunk.
        if len > self.threshold() {
            return None;
        }
        Some(self.write_plain_reply(v2, xid, slot, len, spec, env))
    }

    /// Writes the plain reply of [`reply_plain`](Self::reply_plain) (`len` bytes in all)
    /// into send buffer `slot`: the RPC reply header is built in place after the transport
    /// header in the staging buffer (not built apart and copied in); the bytes to send,
    /// `None` if memory fails.
    fn write_plain_reply(
        &mut self,
        v2: bool,
        xid: u32,
        slot: u32,
        len: u32,
        spec: &ReplySpec<'_>,
        env: &mut impl Env,
    ) -> Option<MemRef> {
        let n = emit_plain(&mut self.hdr, v2, MsgType::Reply, xid, self.grant)? as usize;
        let buf = self.send_buf(slot)?.prefix(len)?;
        let head = n.checked_add(REPLY_HEADER_LEN)?;
        rpcmsg::put_reply_header(self.hdr.get_mut(n..head)?, xid, spec.accept_stat);
        let head = u32::try_from(head).ok()?;
        let items = spec.results.iter().map(|r| (r.xdr_pos, r.mem));
        self.write_short(buf, head, &[], spec.msg, items, env)?;
        Some(buf)
    }

    fn uncount(&mut self, i: u32) {
        if let Some(s) = self.serves.get_mut(i as usize) {
            if s.counted {
                s.counted = false;
                self.in_process = self.in_process.saturating_sub(1);
            }
        }
    }

    /// Answers the call with ERR_CHUNK (version 1) or BAD_HEADER (version 2).
    fn serve_fail_header(&mut self, i: u32, heard: Heard, env: &mut impl Env) {
        let Some(s) = self.serves.get(i as usize).copied() else {
            return;
        };
        let code = if s.vers == v2::VERSION {
            rpcrdma_proto::ErrorCode::BadHeader
        } else {
            rpcrdma_proto::ErrorCode::Chunk
        };
        let e = rpcrdma_proto::ErrorReply {
            xid: s.xid,
            vers: s.vers,
            credit: self.grant,
            code,
        };
        let mut b = [0u8; 28];
        let Ok(n) = e.emit(&mut b) else { return };
        self.stats.errors_sent += 1;
        self.stats.errors_sent_by.count(&e.code);
        self.serve_send(
            i,
            b.get(..n).unwrap_or(&[]),
            ReplyStatus::ErrChunk,
            heard,
            env,
        );
    }

    /// Answers the call with an inline RPC reply carrying only `accept_stat`.
    fn serve_status_reply(&mut self, i: u32, accept_stat: u32, heard: Heard, env: &mut impl Env) {
        let Some(s) = self.serves.get(i as usize) else {
            return;
        };
        let hdr = rpcmsg::reply_header(s.xid, accept_stat);
        self.serve_rpc_reply(i, &hdr, heard, env);
    }

    /// Answers call `i` with the RPC reply header `rpc` alone (no results), echoing its Write
    /// chunks as empty.
    fn serve_rpc_reply(&mut self, i: u32, rpc: &[u8], heard: Heard, env: &mut impl Env) {
        let Some(s) = self.serves.get(i as usize).copied() else {
            return;
        };
        let mut echo = s.segs;
        for e in echo.iter_mut() {
            e.length = 0;
        }
        let wchunks: [Chunk<'_>; MAX_WCHUNKS] = core::array::from_fn(|k| {
            let (f, n) = s.wchunk.get(k).copied().unwrap_or_default();
            Chunk::from_segments(
                echo.get(usize::from(f)..usize::from(f) + usize::from(n))
                    .unwrap_or(&[]),
            )
        });
        let chunks = ChunkLists {
            reads: ReadList::EMPTY,
            writes: WriteList::from_chunks(wchunks.get(..usize::from(s.n_wchunk)).unwrap_or(&[])),
            reply: None,
        };
        let mut b = [0u8; 1024];
        let n = if s.vers == v2::VERSION {
            v2::Header {
                xid: s.xid,
                credit: self.grant,
                body: v2::Body::Msg {
                    direction: MsgType::Reply,
                    chunks,
                },
            }
            .emit(&mut b)
        } else {
            v1::Header {
                xid: s.xid,
                credit: self.grant,
                body: v1::Body::Msg(chunks),
            }
            .emit(&mut b)
        };
        let Ok(n) = n else { return };
        let Some(dst) = b.get_mut(n..n + rpc.len()) else {
            return;
        };
        dst.copy_from_slice(rpc);
        self.stats.replies_sent += 1;
        self.serve_send(
            i,
            b.get(..n + rpc.len()).unwrap_or(&[]),
            ReplyStatus::Sent,
            heard,
            env,
        );
    }

    /// Sends `bytes` as the call's answer and releases its receive buffer. The app hears of
    /// the end ([`Event::ReplyDone`], or [`Event::ServeAborted`] if the connection ends
    /// first) only if it heard of the call; the answer is marked before it is sent, since
    /// a send that fails closes the connection at once.
    fn serve_send(
        &mut self,
        i: u32,
        bytes: &[u8],
        status: ReplyStatus,
        heard: Heard,
        env: &mut impl Env,
    ) {
        if let Some(r) = self.serves.get_mut(i as usize).and_then(|d| d.recv.take()) {
            self.release_recv(r);
        }
        self.uncount(i);
        if let Some(d) = self.serves.get_mut(i as usize) {
            d.state = State::Replying;
            d.silent = heard == Heard::NotYet;
            d.status = Some(status);
        }
        self.send_bytes(SendOwner::Serve(i), bytes, env);
    }

    /// The answer's Send completed (and with it the reply's Writes before it): the serve
    /// is done.
    pub(super) fn serve_sent(&mut self, i: u32) {
        let Some(s) = self.serves.get_mut(i as usize) else {
            return;
        };
        if s.state != State::Replying {
            return;
        }
        s.state = State::Free;
        let id = s.id(i);
        let (silent, status) = (s.silent, s.status.unwrap_or(ReplyStatus::Sent));
        self.serve_free.push(i);
        if !silent {
            self.events.push_back(Event::ReplyDone { id, status });
        }
    }
}

/// A call received with its stream inline, as [`Connection::prepare_call`] records it in
/// its serve slot (see [`fill_slot`]; `header_len`: where the stream starts).
struct InlineStart<'a> {
    xid: u32,
    vers: u32,
    recv: MemRef,
    lists: Option<&'a ChunkLists<'a>>,
    header_len: u32,
}

/// Prepares serve slot `s` for a received call (`lists`: its chunk lists, `None` when all
/// are empty); false if the lists exceed the slot's room (answered ERR_CHUNK).
#[inline(always)]
fn fill_slot(
    s: &mut Serve,
    xid: u32,
    vers: u32,
    recv: MemRef,
    lists: Option<&ChunkLists<'_>>,
) -> bool {
    s.reset(xid, vers, recv);
    // `reset` leaves a slot without segments, as an empty header describes.
    lists.is_none_or(|l| copy_lists(s, l).is_some())
}

/// Copies a received call's chunk lists into its serve slot; `None` if they exceed the
/// slot's room (answered ERR_CHUNK).
fn copy_lists(s: &mut Serve, l: &ChunkLists<'_>) -> Option<()> {
    let mut n = 0usize;
    for g in l.reads.iter().filter(|g| g.position == 0) {
        push(&mut s.segs, &mut n, g.target)?;
    }
    s.p0 = 0;
    s.n_pzrc = n as u8;
    let mut nc = 0usize;
    for c in l.reads.chunks().filter(|c| c.position != 0) {
        let first = n;
        for g in c.segments() {
            push(&mut s.segs, &mut n, g)?;
        }
        let chunk = DataChunk {
            position: c.position,
            len: c.length()?,
            first: first as u8,
            n: (n - first) as u8,
        };
        push(&mut s.dchunk, &mut nc, chunk)?;
    }
    s.n_dchunk = nc as u8;
    let mut nwc = 0usize;
    for c in l.writes.iter() {
        let first = n;
        for g in c.segments() {
            push(&mut s.segs, &mut n, g)?;
        }
        push(&mut s.wchunk, &mut nwc, (first as u8, (n - first) as u8))?;
    }
    s.n_wchunk = nwc as u8;
    s.r0 = n as u8;
    if let Some(r) = l.reply {
        s.has_reply = true;
        for g in r.segments() {
            push(&mut s.segs, &mut n, g)?;
        }
    }
    s.n_rseg = (n - usize::from(s.r0)) as u8;
    s.n_segs = n as u8;
    // AMB-28: the one distinct key of the call, if it offered exactly one.
    let mut key: Option<u32> = None;
    let mut many = false;
    let keys = s.segs.iter().take(n).map(|g| g.handle);
    for h in keys {
        match key {
            None => key = Some(h),
            Some(k) if k != h => many = true,
            _ => {}
        }
    }
    s.inv_rkey = if many { None } else { key };
    Some(())
}

/// The eligible result an app left in the stream of its reply to serve `s`, which offered
/// Write chunks: the responder reduces it into the first, as R8166-6.1 requires of it
/// whatever the app marked (a requester fails a reply whose eligible result came inline,
/// R8166-6.1-d). Only a successful reply that marks no result is looked at; its place is
/// read from a copy of the stream's start. In most bindings the result ends the stream
/// (with or without its pad); in a COMPOUND, operations may follow the READ: they are
/// returned too, the stream after the result's pad, to travel after the result's place.
fn inline_result(
    s: &Serve,
    spec: &ReplySpec<'_>,
    env: &impl Env,
) -> Option<(ResultPiece, Option<MemRef>)> {
    if s.n_wchunk == 0
        || !spec.results.is_empty()
        || spec.accept_stat != rpcmsg::SUCCESS
        || !binding(s.prog, s.prog_vers, s.proc_).result_eligible
    {
        return None;
    }
    let mut head = [0u8; super::requester::RESULT_HEAD];
    let n = spec.msg.len.min(head.len() as u32);
    let head = head.get_mut(..n as usize)?;
    if !env.read(spec.msg.prefix(n)?, head) {
        return None;
    }
    let item = eligible_result(s.prog, s.prog_vers, s.proc_, head).ok()??;
    let end = item.position.checked_add(item.length)?;
    let padded = round4(end);
    let rest = if spec.msg.len == end || spec.msg.len == padded {
        None
    } else if spec.msg.len > padded && !result_is_last(s.prog, s.prog_vers, s.proc_) {
        Some(spec.msg.sub(padded, spec.msg.len - padded)?)
    } else {
        return None;
    };
    if item.length == 0 {
        return None;
    }
    let piece = ResultPiece {
        mem: spec.msg.sub(item.position, item.length)?,
        xdr_pos: item.position,
    };
    Some((piece, rest))
}
