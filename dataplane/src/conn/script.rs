//! A session between two engines scripted by bytes, for the engine's fuzz target
//! (`dataplane/fuzz`, target `engine`) and its property test.
//!
//! The bytes choose the two connections' settings (versions, credits, shared pools, sizes,
//! thresholds), then a sequence of steps: legitimate calls of every RDMATEST kind and NFSv4
//! COMPOUNDs in both directions, a server app that accepts, answers, rejects or ignores what
//! reaches it (its answers sometimes malformed), a hostile peer injecting raw or plausible
//! messages into either side, control-plane changes (credits, sizes learned from the peer),
//! time passing, cancellations, provider faults and closes.
//!
//! The COMPOUNDs exercise the NFSv4 Upper-Layer Binding (RFC 8267 §5): PUTFH (after SEQUENCE
//! in minor version 1), one or two WRITEs or READs of sizes the script chooses, and maybe a
//! GETATTR after them. The requester may move a WRITE's data into the Read chunk (the first
//! one past the DDP threshold) and offers the first READ's buffer as the Write chunk; the
//! server app decodes the arguments, answers only a COMPOUND that encodes back to exactly
//! what arrived (anything else gets NFS4ERR_BADXDR), every operation NFS4_OK, each READ's
//! data a pattern seeded by its offset, and marks the READ data as results or, as the script
//! says, leaves it in its stream for the engine to find.
//!
//! Whatever the bytes, [`run`] panics only if the engine breaks its contract:
//! - nothing panics, and the simulation always settles (no livelock);
//! - every call submitted ends exactly once ([`Event::CallDone`]), and no call ends that was
//!   not submitted; one that ends lent (cancelled, its memory still exposed) is released
//!   exactly once ([`Event::CallReleased`]), by the close at the latest, and no other is;
//! - when a call's memory is its app's again (it ended, not lent, or it was released), no
//!   valid key lets the peer reach its reply or result buffer;
//! - every call delivered to the app ([`Event::IncomingCall`]) ends exactly once
//!   ([`Event::ReplyDone`] or [`Event::ServeAborted`]), [`Event::ArgsReady`] comes only for a
//!   call whose arguments are being pulled, and nothing ends that was not delivered;
//! - every header either side sends requests or grants at least one credit;
//! - each side reports its close once, and after both close (and their queue pairs are torn
//!   down) every shared send buffer and every shared receive buffer is back in its pool;
//! - until something hostile happens (a message injected, a botched reply), every call that
//!   succeeds brings back exactly the bytes the server sent (a COMPOUND's first READ data,
//!   from the Write chunk, at its place in the reply, operations after it intact);
//! - in sessions of calls, answers, cancels, timeouts and closes alone, no Send finds the
//!   peer without a posted receive.

use std::collections::BTreeMap;
use std::time::Duration;

use rpcrdma_proto::cm::PrivateData;
use rpcrdma_proto::nfs4::{self, op};
use rpcrdma_proto::ulb::{rdmatest, NFS_PROG, RDMATEST_PROG};
use rpcrdma_proto::xdr::{pad, Reader};
use rpcrdma_proto::Error;

use super::sim::{config, pattern, sized, Pair, Side, BULK_PROG, SEND_COUNT};
use super::{
    Accepted, ArgPiece, CallSpec, CloseReason, Event, IncomingCall, ReplySpec, ResultPiece, Role,
    ServeId,
};
use crate::mem::{MemRef, Memory};
use crate::rpcmsg;

/// App memory of each side: enough for a script's calls, small enough to set up quickly.
const APP_LEN: usize = 1 << 20;
/// Steps of one script at most (each step is at least one byte).
const MAX_STEPS: usize = 256;
/// Buffers of a side's shared receive queue in the simulator.
const SHARED_RECEIVES: usize = 16;

/// The big-endian word at `at` of `b`, if it is there.
pub(crate) fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

/// The script's bytes, read front to back; zeros once they run out.
#[derive(Debug)]
pub(crate) struct Bytes<'a>(pub(crate) &'a [u8]);

impl<'a> Bytes<'a> {
    pub(crate) fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    pub(crate) fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub(crate) fn bit(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// Up to `n` bytes (fewer if the script ends).
    pub(crate) fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }
}

/// Changes up to three words of `m` (at word offsets up to 255): to zero, small, huge or any.
pub(crate) fn mutate(m: &mut [u8], b: &mut Bytes<'_>) {
    for _ in 0..b.u8() % 4 {
        let at = 4 * usize::from(b.u8());
        let w = match b.u8() % 4 {
            0 => 0,
            1 => u32::from(b.u8()),
            2 => u32::MAX - u32::from(b.u8()),
            _ => b.u32(),
        };
        if let Some(d) = m.get_mut(at..at + 4) {
            d.copy_from_slice(&w.to_be_bytes());
        }
    }
}

/// Where a call delivered to the app stands, as the app sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Delivered, not accepted yet.
    Delivered,
    /// Accepted with [`Accepted::Pulling`]: waiting for [`Event::ArgsReady`].
    Pulling,
    /// Arguments in place (`args_len` bytes): the app may answer.
    Ready(u32),
    /// Answered (reply submitted or call rejected): waiting for its end.
    Answered,
}

/// A call delivered to the app and not yet ended.
#[derive(Clone, Copy, Debug)]
struct Held {
    call: IncomingCall,
    buf: MemRef,
    stage: Stage,
}

/// The calls an app makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    Null,
    Echo,
    Read,
    Write,
    /// `BULK_PROG`: the arguments echoed inline, nothing DDP-eligible.
    Bulk,
    /// A program nobody serves.
    Other,
    /// An NFSv4 COMPOUND with one or two WRITEs ([`script_compound`]): their data DDP-eligible
    /// (RFC 8267 §5; the first one the threshold lets go into the Read chunk).
    Nfs4Write,
    /// An NFSv4 COMPOUND with one or two READs ([`script_compound`]): the first READ's data
    /// DDP-eligible, for the call's Write chunk, operations possibly after it.
    Nfs4Read,
}

impl Kind {
    fn from_byte(b: u8) -> Kind {
        [
            Kind::Null,
            Kind::Echo,
            Kind::Read,
            Kind::Write,
            Kind::Bulk,
            Kind::Other,
            Kind::Nfs4Write,
            Kind::Nfs4Read,
        ][usize::from(b % 8)]
    }
}

// NFSv4 COMPOUNDs (RFC 8267 §5): the few operations the script's calls use, encoded by the
// client, decoded and answered by the server, and expected back by the client.

/// The tag of the script's COMPOUNDs (six bytes: its pad is not empty).
const TAG: &[u8] = b"script";
/// The session of the script's SEQUENCEs.
const SESSION: [u8; 16] = [0x5e; 16];
/// The file handle of its PUTFHs.
const FH: [u8; 8] = [0xfa; 8];
/// The stateid of its READs and WRITEs.
const STATEID: [u8; 16] = [0x57; 16];
/// The verifier of its server's WRITE results.
const VERIFIER: [u8; 8] = [0x7e; 8];
/// `FILE_SYNC4`, how the script's WRITEs are to be committed.
const FILE_SYNC4: u32 = 2;
/// `FATTR4_SIZE`, the attribute its GETATTRs ask for (bit 4 of the bitmap's first word).
const SIZE_ATTR: u32 = 1 << 4;
/// `NFS4_OK`.
const NFS4_OK: u32 = 0;
/// `NFS4ERR_BADXDR`: the server's answer to arguments that are not a COMPOUND of the script.
const NFS4ERR_BADXDR: u32 = 10036;
/// Operations of a COMPOUND the script makes, at most.
const MAX_OPS: u32 = 8;

/// An operation of the script's COMPOUNDs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op4 {
    /// SEQUENCE in the script's session (minor version 1), with this sequence id.
    Sequence(u32),
    /// PUTFH of the script's file handle.
    Putfh,
    /// WRITE (`FILE_SYNC4`) of the [`file_data`] at `offset`, `len` bytes.
    Write { offset: u64, len: u32 },
    /// READ of `count` bytes at `offset`, which the server answers with the [`file_data`].
    Read { offset: u64, count: u32 },
    /// GETATTR of the size.
    Getattr,
}

/// A COMPOUND of the script: its minor version and its operations.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Compound {
    minor: u32,
    ops: Vec<Op4>,
}

/// The bytes of the script's file at `offset`, `len` of them: a pattern seeded by both words
/// of the offset, so that each READ or WRITE of a call has its own (the script puts the XID in
/// the low word and the operation's rank in the high one).
fn file_data(offset: u64, len: u32) -> Vec<u8> {
    pattern((offset >> 32) as u32 ^ offset as u32, len as usize)
}

/// The COMPOUND of a call of kind [`Kind::Nfs4Write`] (`write`) or [`Kind::Nfs4Read`] with
/// XID `xid`: PUTFH (after a SEQUENCE in minor version 1), one or two WRITEs or READs, the
/// first of `n` bytes, and a GETATTR, as the script's next byte says: bit 0, minor version 0
/// (no SEQUENCE); bit 1, a second WRITE or READ, its size in the next two bytes; bit 2, no
/// GETATTR (the last data ends the arguments or the results).
fn script_compound(write: bool, n: u32, xid: u32, b: &mut Bytes<'_>) -> Compound {
    let shape = b.u8();
    let minor = u32::from(shape & 1 == 0);
    let mut ops = Vec::new();
    if minor == 1 {
        ops.push(Op4::Sequence(xid));
    }
    ops.push(Op4::Putfh);
    let second = (shape & 2 != 0).then(|| u32::from(b.u16()) % 9000);
    for (rank, len) in [Some(n), second].into_iter().flatten().enumerate() {
        let offset = (rank as u64) << 32 | u64::from(xid);
        ops.push(if write {
            Op4::Write { offset, len }
        } else {
            Op4::Read { offset, count: len }
        });
    }
    if shape & 4 == 0 {
        ops.push(Op4::Getattr);
    }
    Compound { minor, ops }
}

/// XDR, built an item at a time.
#[derive(Default)]
struct Xdr(Vec<u8>);

impl Xdr {
    fn u32(&mut self, w: u32) {
        self.0.extend(w.to_be_bytes());
    }

    fn u64(&mut self, w: u64) {
        self.0.extend(w.to_be_bytes());
    }

    fn fixed(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
    }

    /// An `opaque<>` (length word, bytes, pad); returns where its bytes start.
    fn opaque(&mut self, b: &[u8]) -> u32 {
        self.u32(b.len() as u32);
        let at = self.0.len() as u32;
        self.0.extend_from_slice(b);
        self.0.resize(self.0.len() + pad(b.len()), 0);
        at
    }
}

/// `COMPOUND4args` of `c`, whole (every WRITE's data inline), and where each WRITE's data
/// sits in it (position, length).
fn compound_args(c: &Compound) -> (Vec<u8>, Vec<(u32, u32)>) {
    let mut x = Xdr::default();
    let mut items = Vec::new();
    x.opaque(TAG);
    x.u32(c.minor);
    x.u32(c.ops.len() as u32);
    for o in &c.ops {
        match *o {
            Op4::Sequence(seq) => {
                x.u32(op::SEQUENCE);
                x.fixed(&SESSION);
                // Sequence id, slot id, highest slot id, cachethis.
                for w in [seq, 0, 0, 0] {
                    x.u32(w);
                }
            }
            Op4::Putfh => {
                x.u32(op::PUTFH);
                x.opaque(&FH);
            }
            Op4::Write { offset, len } => {
                x.u32(op::WRITE);
                x.fixed(&STATEID);
                x.u64(offset);
                x.u32(FILE_SYNC4);
                items.push((x.opaque(&file_data(offset, len)), len));
            }
            Op4::Read { offset, count } => {
                x.u32(op::READ);
                x.fixed(&STATEID);
                x.u64(offset);
                x.u32(count);
            }
            Op4::Getattr => {
                x.u32(op::GETATTR);
                x.u32(1);
                x.u32(SIZE_ATTR);
            }
        }
    }
    (x.0, items)
}

/// The COMPOUND the script's server reads in `args` (whole, as `accept_call` placed them). It
/// reads only what varies between the script's COMPOUNDs: arguments that are not one of them
/// may still decode, and the server tells them apart by encoding the result again.
fn parse_compound(args: &[u8]) -> Result<Compound, Error> {
    let mut r = Reader::new(args);
    r.opaque("tag")?;
    let minor = r.u32("minorversion")?;
    let n = r.u32("COMPOUND operation count")?;
    if n > MAX_OPS {
        return Err(Error::BadValue("COMPOUND operation count", n));
    }
    let mut ops = Vec::new();
    for _ in 0..n {
        let o = match r.u32("nfs_opnum4")? {
            op::SEQUENCE => {
                r.take(SESSION.len(), "sessionid")?;
                let seq = r.u32("sequenceid")?;
                r.take(12, "SEQUENCE4args")?;
                Op4::Sequence(seq)
            }
            op::PUTFH => {
                r.opaque("nfs_fh4")?;
                Op4::Putfh
            }
            op::WRITE => {
                r.take(STATEID.len(), "stateid")?;
                let offset = r.u64("offset")?;
                r.u32("stable")?;
                let len = r.opaque("WRITE4args data")?.len() as u32;
                Op4::Write { offset, len }
            }
            op::READ => {
                r.take(STATEID.len(), "stateid")?;
                let offset = r.u64("offset")?;
                let count = r.u32("count")?;
                Op4::Read { offset, count }
            }
            op::GETATTR => {
                r.take(8, "bitmap4")?;
                Op4::Getattr
            }
            v => return Err(Error::BadValue("nfs_opnum4", v)),
        };
        ops.push(o);
    }
    Ok(Compound { minor, ops })
}

/// The `COMPOUND4res` the script's server answers `c` with, whole (every READ's data inline),
/// and where each READ's data sits in it (position, length). Every operation succeeds: a READ
/// returns the [`file_data`] at its offset (eof set), a WRITE all its bytes, a GETATTR the size
/// of a file that ends where the last READ or WRITE before it ended. Arguments that were not a
/// COMPOUND of the script (`None`) get `NFS4ERR_BADXDR` and no results.
fn compound_res(c: Option<&Compound>) -> (Vec<u8>, Vec<(u32, u32)>) {
    let mut x = Xdr::default();
    let mut items = Vec::new();
    let Some(c) = c else {
        x.u32(NFS4ERR_BADXDR);
        x.opaque(TAG);
        x.u32(0);
        return (x.0, items);
    };
    x.u32(NFS4_OK);
    x.opaque(TAG);
    x.u32(c.ops.len() as u32);
    let mut size = 0u64;
    for o in &c.ops {
        match *o {
            Op4::Sequence(seq) => {
                x.u32(op::SEQUENCE);
                x.u32(NFS4_OK);
                x.fixed(&SESSION);
                // Sequence id, slot id, highest and target highest slot ids, status flags.
                for w in [seq, 0, 0, 0, 0] {
                    x.u32(w);
                }
            }
            Op4::Putfh => {
                x.u32(op::PUTFH);
                x.u32(NFS4_OK);
            }
            Op4::Write { offset, len } => {
                x.u32(op::WRITE);
                x.u32(NFS4_OK);
                x.u32(len);
                x.u32(FILE_SYNC4);
                x.fixed(&VERIFIER);
                size = offset.saturating_add(u64::from(len));
            }
            Op4::Read { offset, count } => {
                x.u32(op::READ);
                x.u32(NFS4_OK);
                x.u32(1);
                items.push((x.opaque(&file_data(offset, count)), count));
                size = offset.saturating_add(u64::from(count));
            }
            Op4::Getattr => {
                x.u32(op::GETATTR);
                x.u32(NFS4_OK);
                x.u32(1);
                x.u32(SIZE_ATTR);
                x.u32(8);
                x.u64(size);
            }
        }
    }
    (x.0, items)
}

/// `xdr` without the items at `items` (position, length; in order), their data and pad, as an
/// app reduces a message (the length words stay); and each item's position in what is left.
fn cut(xdr: &[u8], items: &[(u32, u32)]) -> (Vec<u8>, Vec<u32>) {
    let mut left = Vec::new();
    let mut at = Vec::new();
    let mut from = 0usize;
    for &(pos, len) in items {
        let pos = pos as usize;
        left.extend_from_slice(xdr.get(from..pos).unwrap_or_default());
        at.push(left.len() as u32);
        from = pos + len as usize + pad(len as usize);
    }
    left.extend_from_slice(xdr.get(from..).unwrap_or_default());
    (left, at)
}

/// App memory of side `s` holding `bytes`.
fn stored(s: &mut Side, bytes: &[u8]) -> Option<MemRef> {
    let at = s.try_alloc(bytes.len() as u32)?;
    s.env.write(at, bytes).then_some(at)
}

/// The pieces of a call of COMPOUND `c` in side `s`'s memory: its reduced arguments, each
/// WRITE's data (DDP-eligible), and a buffer for each READ's data (for Write chunks).
fn compound_call(s: &mut Side, c: &Compound) -> Option<(MemRef, Vec<ArgPiece>, Vec<MemRef>)> {
    let (whole, items) = compound_args(c);
    let (reduced, at) = cut(&whole, &items);
    let mut args = Vec::new();
    for (&(pos, len), xdr_pos) in items.iter().zip(at) {
        let data = whole.get(pos as usize..(pos + len) as usize)?;
        args.push(ArgPiece {
            mem: stored(s, data)?,
            xdr_pos,
        });
    }
    let mut results = Vec::new();
    for o in &c.ops {
        if let Op4::Read { count, .. } = *o {
            results.push(s.try_alloc(count)?);
        }
    }
    Some((stored(s, &reduced)?, args, results))
}

/// What a call's reply must hold if it succeeds (RDMATEST or NFSv4, as `answer` serves it).
#[derive(Clone, Debug)]
struct Expect {
    kind: Kind,
    xid: u32,
    n: u32,
    reply: MemRef,
    /// The buffer of the first DDP-eligible result (the one a Write chunk may be offered for).
    result: Option<MemRef>,
    /// The call's COMPOUND (kinds [`Kind::Nfs4Write`] and [`Kind::Nfs4Read`]).
    compound: Option<Compound>,
}

impl Expect {
    /// Panics if `d`, a successful call, did not bring back what the server sent.
    fn check(&self, who: &str, s: &Side, d: &super::CallDone) {
        let reply = s.get(self.reply.prefix(d.reply_len).unwrap_or_default());
        let word = be32(&reply, 0);
        let data = || pattern(self.xid, self.n as usize);
        // The DDP result, from its Write chunk or inline after the length word.
        let result = || match (d.results().next(), self.result) {
            (Some((_, used)), Some(buf)) if used > 0 => {
                assert_eq!(used, self.n, "{who}: Write chunk length, {d:?}");
                s.get(buf.prefix(used).unwrap_or_default())
            }
            _ => reply
                .get(4..4 + self.n as usize)
                .unwrap_or_default()
                .to_vec(),
        };
        // A COMPOUND's reply, whole: the first READ's data, if it came in the Write chunk, at
        // its place after its length word (operations may follow it), with its pad.
        let whole = || match (d.results().next(), self.result) {
            (Some((at, used)), Some(buf)) if used > 0 => {
                let (head, tail) = reply.split_at((at as usize).min(reply.len()));
                let mut whole = head.to_vec();
                whole.extend(s.get(buf.prefix(used).unwrap_or_default()));
                whole.resize(whole.len() + pad(used as usize), 0);
                whole.extend_from_slice(tail);
                whole
            }
            _ => reply.clone(),
        };
        let ok = match self.kind {
            Kind::Null => d.reply_len == 0,
            Kind::Echo | Kind::Read => word == Some(self.n) && result() == data(),
            Kind::Write => word == Some(self.n),
            Kind::Bulk => reply == data(),
            Kind::Other => true,
            Kind::Nfs4Write | Kind::Nfs4Read => whole() == compound_res(self.compound.as_ref()).0,
        };
        assert!(
            ok,
            "{who}: the reply to {self:?} is not what was sent: {d:?}"
        );
    }
}

/// What one side's app knows: its calls in flight and the calls it serves.
#[derive(Debug, Default)]
struct App {
    /// Submitted calls not yet ended, by user token, with what their replies must hold.
    calls: BTreeMap<u64, Expect>,
    /// Calls that ended cancelled with their memory lent to the peer, not yet released.
    lent: BTreeMap<u64, Expect>,
    /// XIDs of calls submitted (for plausible replies and cancellations).
    xids: Vec<u32>,
    next_xid: u32,
    next_user: u64,
    served: Vec<Held>,
    closes: u32,
}

impl App {
    /// Takes one event of this side's engine; panics if it breaks the contract.
    fn event(&mut self, who: &str, ev: Event) {
        match ev {
            Event::CallDone(d) => {
                let e = self.calls.remove(&d.user);
                let e =
                    e.unwrap_or_else(|| panic!("{who}: CallDone for a call not in flight: {d:?}"));
                if d.lent {
                    assert_eq!(d.status, super::CallStatus::Cancelled, "{who}: lent {d:?}");
                    self.lent.insert(d.user, e);
                }
            }
            Event::CallReleased { user, .. } => {
                assert!(
                    self.lent.remove(&user).is_some(),
                    "{who}: CallReleased for a call that did not end lent: {ev:?}"
                );
            }
            Event::IncomingCall(call) => {
                assert!(
                    !self.served.iter().any(|h| h.call.id == call.id),
                    "{who}: IncomingCall reuses the id of a call still held: {call:?}"
                );
                self.served.push(Held {
                    call,
                    buf: MemRef::default(),
                    stage: Stage::Delivered,
                });
            }
            Event::ArgsReady { id, args_len } => {
                let h = self.served.iter_mut().find(|h| h.call.id == id);
                let h = h.unwrap_or_else(|| panic!("{who}: ArgsReady for an unknown call {id:?}"));
                assert_eq!(h.stage, Stage::Pulling, "{who}: ArgsReady out of turn");
                assert!(args_len <= h.buf.len, "{who}: ArgsReady beyond the buffer");
                h.stage = Stage::Ready(args_len);
            }
            Event::ReplyDone { id, .. } | Event::ServeAborted { id } => {
                let i = self.served.iter().position(|h| h.call.id == id);
                let i = i.unwrap_or_else(|| panic!("{who}: end of a call not held: {ev:?}"));
                self.served.swap_remove(i);
            }
            Event::Optional(_) => {}
            Event::Closed(_) => {
                self.closes += 1;
                assert_eq!(self.closes, 1, "{who}: closed twice");
            }
        }
    }
}

/// The two engines and their apps.
#[derive(Debug)]
struct Session {
    p: Pair,
    apps: [App; 2],
    /// Print each step, each event and, at the end, what each side posted and sent.
    trace: bool,
    /// Nothing hostile has happened yet (no message injected, no botched reply): every call
    /// that succeeds must bring back exactly what the server sent.
    clean: bool,
    /// Nothing but calls, answers, cancels, timeouts and closes (no control change, fault or
    /// optional message either): no Send may find the peer without a posted receive
    /// (R8166-3.3.1-g/h: credits and grants stay covered by receives).
    honest: bool,
    /// Calls whose replies were checked against what the server sent, by kind.
    checked: BTreeMap<Kind, u32>,
}

/// Side 0 is the client (`a`), side 1 the server (`b`).
fn side(p: &mut Pair, k: usize) -> &mut Side {
    if k == 0 {
        &mut p.a
    } else {
        &mut p.b
    }
}

const NAMES: [&str; 2] = ["client", "server"];

impl Session {
    /// Moves every event of both engines to the apps.
    fn events(&mut self) {
        for (k, who) in NAMES.iter().enumerate() {
            let s = side(&mut self.p, k);
            s.drain_events();
            while let Some(ev) = s.events.pop_front() {
                if self.trace {
                    eprintln!("{who} event {ev:?}");
                }
                if let (Event::CallDone(d), true) = (&ev, self.clean) {
                    let ok = d.status == super::CallStatus::Ok && d.rpc_stat == rpcmsg::SUCCESS;
                    if let (Some(e), true) = (self.apps[k].calls.get(&d.user), ok) {
                        e.check(who, s, d);
                        *self.checked.entry(e.kind).or_default() += 1;
                    }
                }
                // R8166-4.4-b/c: when a call's memory is the app's again (it ended, not
                // lent; or it is released), the peer can no longer reach it: its keys are
                // invalidated, unless the connection ended (its queue pair reaches nothing).
                let open = s.conn.closed().is_none();
                let back = match &ev {
                    _ if !open => None,
                    Event::CallDone(d) if !d.lent => self.apps[k].calls.get(&d.user),
                    Event::CallReleased { user, .. } => self.apps[k].lent.get(user),
                    _ => None,
                };
                if let Some(e) = back {
                    for m in std::iter::once(e.reply).chain(e.result) {
                        assert!(
                            !s.env.reachable(m),
                            "{who}: {ev:?} while the peer can still reach {m:?}"
                        );
                    }
                }
                self.apps[k].event(who, ev);
            }
        }
    }

    fn run(&mut self) {
        self.p.run();
        self.events();
    }

    /// Looks at the messages each side sent since the last look (from `seen[k]` on): every
    /// header requests or grants at least one credit (R8166-3.3.1-a). Traces them.
    fn sends(&mut self, seen: &mut [usize; 2]) {
        for (k, who) in NAMES.iter().enumerate() {
            let sent = &side(&mut self.p, k).sent;
            for m in sent.iter().skip(seen[k]) {
                if self.trace {
                    eprintln!("{who} sent {:02x?}", &m[..m.len().min(96)]);
                }
                let credit = be32(m, 8);
                assert!(
                    credit.is_some_and(|c| c >= 1),
                    "{who} sent a header without a credit: {:02x?}",
                    &m[..m.len().min(32)]
                );
            }
            seen[k] = sent.len();
        }
    }

    /// A call from side `k`'s app, its kind and sizes chosen by the script.
    fn call(&mut self, k: usize, b: &mut Bytes<'_>) {
        let kind = Kind::from_byte(b.u8());
        let n = u32::from(b.u16()) % 9000;
        let small_room = (b.u8() % 4 == 0).then(|| u32::from(b.u8()));
        let app = &mut self.apps[k];
        let xid = if b.u8() % 16 == 0 {
            // Sometimes an XID already in use, which the engine must refuse.
            app.xids.last().copied().unwrap_or(1)
        } else {
            app.next_xid = app.next_xid.wrapping_add(1);
            app.next_xid | ((k as u32) << 31)
        };
        let compound = matches!(kind, Kind::Nfs4Write | Kind::Nfs4Read)
            .then(|| script_compound(kind == Kind::Nfs4Write, n, xid, b));
        // Room for the whole reply (a COMPOUND's exactly), or sometimes too little.
        let reply_room = small_room.unwrap_or_else(|| match &compound {
            Some(c) => compound_res(Some(c)).0.len() as u32,
            None => n + 128,
        });
        let s = side(&mut self.p, k);
        let Some(reply) = s.try_alloc(reply_room) else {
            return;
        };
        let words = |s: &mut Side, w: &[u32]| {
            let bytes: Vec<u8> = w.iter().flat_map(|x| x.to_be_bytes()).collect();
            let at = s.try_alloc(bytes.len() as u32)?;
            s.env.write(at, &bytes).then_some(at)
        };
        let data = |s: &mut Side, len: u32| {
            let at = s.try_alloc(len)?;
            s.env.write(at, &pattern(xid, len as usize)).then_some(at)
        };
        let (prog, vers, proc_, msg, args, results) = match kind {
            Kind::Null => (
                RDMATEST_PROG,
                1,
                rdmatest::NULL,
                words(s, &[]),
                vec![],
                vec![],
            ),
            Kind::Echo => {
                let arg = data(s, n).map(|mem| ArgPiece { mem, xdr_pos: 4 });
                let result = s.try_alloc(n);
                let msg = words(s, &[n]);
                (
                    RDMATEST_PROG,
                    1,
                    rdmatest::ECHO,
                    msg,
                    Vec::from_iter(arg),
                    Vec::from_iter(result),
                )
            }
            Kind::Read => {
                let result = s.try_alloc(n);
                let msg = words(s, &[n, xid]);
                (
                    RDMATEST_PROG,
                    1,
                    rdmatest::READ,
                    msg,
                    vec![],
                    Vec::from_iter(result),
                )
            }
            Kind::Write => {
                let arg = data(s, n).map(|mem| ArgPiece { mem, xdr_pos: 8 });
                let msg = words(s, &[xid, n]);
                (
                    RDMATEST_PROG,
                    1,
                    rdmatest::WRITE,
                    msg,
                    Vec::from_iter(arg),
                    vec![],
                )
            }
            Kind::Bulk => (BULK_PROG, 1, 1, data(s, n), vec![], vec![]),
            Kind::Other => (b.u32(), 1, b.u32(), data(s, n % 64), vec![], vec![]),
            Kind::Nfs4Write | Kind::Nfs4Read => {
                let Some((msg, args, results)) =
                    compound.as_ref().and_then(|c| compound_call(s, c))
                else {
                    return;
                };
                (
                    NFS_PROG,
                    nfs4::VERSION,
                    nfs4::COMPOUND,
                    Some(msg),
                    args,
                    results,
                )
            }
        };
        let Some(msg) = msg else {
            return;
        };
        let user = self.apps[k].next_user;
        // Now and then an AUTH_SYS identity: a 20-byte longer RPC header.
        let auth = (b.u8() % 4 == 0).then(|| rpcrdma_proto::rpc::AuthSys {
            uid: b.u32(),
            gid: b.u32(),
        });
        let spec = CallSpec {
            auth,
            user,
            xid,
            prog,
            vers,
            proc_,
            msg,
            args: &args,
            results: &results,
            reply,
        };
        if s.conn.submit_call(&spec, &mut s.env).is_ok() {
            let app = &mut self.apps[k];
            app.next_user += 1;
            let expect = Expect {
                kind,
                xid,
                n,
                reply,
                result: results.first().copied(),
                compound,
            };
            app.calls.insert(user, expect);
            app.xids.push(xid);
        }
    }

    /// Side `k`'s app acts on each call it holds, as the script says: a byte each, whose
    /// low two bits choose the act and whose bit 2, in an answer, leaves a COMPOUND's READ
    /// data unmarked in the reply stream (for the engine to find, R8166-6.1).
    fn serve(&mut self, k: usize, b: &mut Bytes<'_>) {
        for i in 0..self.apps[k].served.len() {
            let Some(h) = self.apps[k].served.get(i).copied() else {
                break;
            };
            let choice = b.u8();
            let s = side(&mut self.p, k);
            let next = match (h.stage, choice % 4) {
                (Stage::Delivered, 0) => {
                    let Some(buf) = s.try_alloc(h.call.args_len.max(4)) else {
                        continue;
                    };
                    match s.conn.accept_call(h.call.id, buf, &mut s.env) {
                        Ok(Accepted::Ready { args_len }) => {
                            assert!(args_len <= buf.len, "Ready beyond the buffer");
                            Some((buf, Stage::Ready(args_len)))
                        }
                        Ok(Accepted::Pulling) => Some((buf, Stage::Pulling)),
                        Err(_) => None,
                    }
                }
                (Stage::Delivered, 1) => s
                    .conn
                    .reject_call(h.call.id, rpcmsg::PROG_UNAVAIL, &mut s.env)
                    .ok()
                    .map(|()| (h.buf, Stage::Answered)),
                (Stage::Ready(args_len), 0) => {
                    let mark = choice & 4 == 0;
                    answer(s, &h, args_len, mark).map(|()| (h.buf, Stage::Answered))
                }
                (Stage::Ready(_), 1) => {
                    self.clean = false;
                    self.honest = false;
                    odd_answer(s, &h, b).map(|()| (h.buf, Stage::Answered))
                }
                _ => None,
            };
            if let (Some((buf, stage)), Some(h)) = (next, self.apps[k].served.get_mut(i)) {
                h.buf = buf;
                h.stage = stage;
            }
        }
    }

    /// Delivers a message to side `k` as if its peer had sent it: raw bytes; a plausible
    /// header (an XID of the side's own calls, small words a decoder takes for lists and
    /// segments, an RPC header) followed by raw bytes; or one of the last messages the peer
    /// sent, with words changed, followed by raw bytes.
    fn inject(&mut self, k: usize, b: &mut Bytes<'_>) {
        self.clean = false;
        self.honest = false;
        let mode = b.u8() % 3;
        let mut msg = Vec::new();
        if mode == 2 {
            // A message the peer really sent (keys of live exposures, real positions), again,
            // with some of its words changed.
            let sent = &side(&mut self.p, 1 - k).sent;
            if let Some(m) = sent.len().checked_sub(1 + usize::from(b.u8() % 4)) {
                msg.extend_from_slice(&sent[m]);
            }
            mutate(&mut msg, b);
        }
        if mode == 1 {
            let xids = &self.apps[k].xids;
            let xid = match xids.len() {
                0 => b.u32(),
                n => xids[usize::from(b.u8()) % n],
            };
            let vers = match b.u8() % 4 {
                0 | 1 => 1,
                2 => 2,
                _ => b.u32(),
            };
            let credit = u32::from(b.u8() % 40);
            let proc_ = u32::from(b.u8() % 8);
            for w in [xid, vers, credit, proc_] {
                msg.extend(w.to_be_bytes());
            }
            for _ in 0..b.u8() % 24 {
                let w = match b.u8() % 4 {
                    0 => 0,
                    1 => 1,
                    2 => u32::from(b.u8()),
                    _ => b.u32(),
                };
                msg.extend(w.to_be_bytes());
            }
            match b.u8() % 4 {
                0 => msg.extend(rpcmsg::call_header(xid, RDMATEST_PROG, 1, b.u32() % 5)),
                1 => msg.extend(rpcmsg::reply_header(xid, b.u32() % 6)),
                _ => {}
            }
        }
        let raw = usize::from(b.u16()) % 600;
        msg.extend_from_slice(b.take(raw));
        let s = side(&mut self.p, k);
        let room = s.conn.config().recv_size as usize;
        msg.truncate(room);
        if s.conn.closed().is_none() && s.posted_len() > 0 {
            self.p.inject(k == 1, &msg);
            self.events();
        }
    }

    /// Settings the control plane applies on side `k` (the values partly come from the
    /// peer: sizes it announced; the chunk caps from the configuration).
    fn control(&mut self, k: usize, b: &mut Bytes<'_>) {
        self.honest = false;
        let c = &mut side(&mut self.p, k).conn;
        match b.u8() % 7 {
            0 => c.set_credits(u32::from(b.u8() % 10)),
            1 => c.set_peer_receive_size(b.u32()),
            2 => c.set_own_receive_size(b.u32()),
            3 => c.set_peer_send_size(b.u32()),
            4 => c.set_peer_takes_invalidate(b.bit()),
            5 => c.set_chunk_caps(u32::from(b.u8() % 20), u32::from(b.u8() % 6)),
            _ => c.set_peer_receive_cap(b.bit().then(|| b.u32())),
        }
    }

    /// An RDMA2_OPTIONAL message from side `k` (refused unless it speaks version two), or
    /// an answer rejecting one.
    fn optional(&mut self, k: usize, b: &mut Bytes<'_>) {
        self.honest = false;
        let s = side(&mut self.p, k);
        let xid = b.u32();
        if b.bit() {
            s.conn.reject_optional(xid, &mut s.env);
        } else {
            let (opttype, len) = (b.u32(), usize::from(b.u8()));
            let _ = s.conn.send_optional(xid, opttype, b.take(len), &mut s.env);
        }
    }

    /// Provider faults: Send completions held back (or let go), exposures or
    /// invalidations refused.
    fn faults(&mut self, k: usize, b: &mut Bytes<'_>) {
        self.honest = false;
        let s = side(&mut self.p, k);
        match b.u8() % 4 {
            0 => s.hold_sends = true,
            1 => s.release_sends(),
            2 => s.env.refuse_expose = b.bit(),
            _ => s.env.refuse_invalidate = b.bit(),
        }
    }

    /// Closes both sides, lets everything settle, and checks that nothing is left over.
    fn finish(mut self) -> Pair {
        if self.honest {
            assert_eq!(self.p.rnr, 0, "a Send found no receive posted");
        }
        for k in 0..2 {
            let s = side(&mut self.p, k);
            s.conn.close(CloseReason::Requested);
            s.release_sends();
        }
        self.run();
        // The queue pairs are destroyed: buffers under Sends still posted come back too.
        for k in 0..2 {
            side(&mut self.p, k).conn.teardown();
        }
        self.run();
        if self.trace {
            for (k, who) in NAMES.iter().enumerate() {
                eprintln!("{who} posted, in order: {:?}", side(&mut self.p, k).log);
            }
        }
        for (k, who) in NAMES.iter().enumerate() {
            let app = &self.apps[k];
            assert_eq!(app.closes, 1, "{who}: the close was not reported once");
            assert!(
                app.calls.is_empty(),
                "{who}: calls never ended: {:?}",
                app.calls.keys()
            );
            assert!(
                app.lent.is_empty(),
                "{who}: lent calls never released: {:?}",
                app.lent.keys()
            );
            assert!(
                app.served.is_empty(),
                "{who}: served calls never ended: {:?}",
                app.served
            );
            let s = side(&mut self.p, k);
            let cfg = *s.conn.config();
            if cfg.shared_send {
                assert_eq!(
                    s.env.sends.len(),
                    SEND_COUNT,
                    "{who}: shared send buffers lost"
                );
            }
            if cfg.shared_recv {
                assert_eq!(
                    s.posted_len(),
                    SHARED_RECEIVES,
                    "{who}: shared receive buffers lost"
                );
            }
        }
        self.p
    }
}

/// The RDMATEST or NFSv4 answer to a call whose arguments are in place (PROG_UNAVAIL for
/// another program, GARBAGE_ARGS when RDMATEST arguments do not parse). A COMPOUND gets
/// [`compound_res`]: of the COMPOUND it holds if it is one of the script's, else
/// `NFS4ERR_BADXDR`; the data of its READs marked as results if `mark`, else left inline.
fn answer(s: &mut Side, h: &Held, args_len: u32, mark: bool) -> Option<()> {
    let args = s.get(h.buf.prefix(args_len)?);
    let word = |at: usize| be32(&args, at);
    let mut msg: Vec<u8> = Vec::new();
    let mut result = None;
    let mut results = Vec::new();
    let stat = match (h.call.prog, h.call.proc_) {
        (RDMATEST_PROG, rdmatest::NULL) => rpcmsg::SUCCESS,
        (RDMATEST_PROG, rdmatest::ECHO) => match word(0) {
            Some(n) if n <= args_len.saturating_sub(4) => {
                msg.extend(n.to_be_bytes());
                result = Some((h.buf.sub(4, n)?, 4));
                rpcmsg::SUCCESS
            }
            _ => rpcmsg::GARBAGE_ARGS,
        },
        (RDMATEST_PROG, rdmatest::READ) => match (word(0), word(4)) {
            (Some(count), Some(seed)) if count <= 65536 => {
                let data = s.try_alloc(count)?;
                if !s.env.write(data, &pattern(seed, count as usize)) {
                    return None;
                }
                msg.extend(count.to_be_bytes());
                result = Some((data, 4));
                rpcmsg::SUCCESS
            }
            _ => rpcmsg::GARBAGE_ARGS,
        },
        (RDMATEST_PROG, rdmatest::WRITE) => match word(4) {
            Some(n) if n <= args_len.saturating_sub(8) => {
                msg.extend(n.to_be_bytes());
                rpcmsg::SUCCESS
            }
            _ => rpcmsg::GARBAGE_ARGS,
        },
        (BULK_PROG, 1) => {
            msg = args.clone();
            rpcmsg::SUCCESS
        }
        (NFS_PROG, nfs4::COMPOUND) if h.call.vers == nfs4::VERSION => {
            // Only the script's own COMPOUNDs encode back to exactly their arguments.
            let c = parse_compound(&args)
                .ok()
                .filter(|c| compound_args(c).0 == args);
            let (whole, items) = compound_res(c.as_ref());
            if mark {
                let (reduced, at) = cut(&whole, &items);
                for (&(pos, len), xdr_pos) in items.iter().zip(at) {
                    let data = whole.get(pos as usize..(pos + len) as usize)?;
                    let mem = stored(s, data)?;
                    results.push(ResultPiece { mem, xdr_pos });
                }
                msg = reduced;
            } else {
                msg = whole;
            }
            rpcmsg::SUCCESS
        }
        _ => rpcmsg::PROG_UNAVAIL,
    };
    results.extend(result.map(|(mem, xdr_pos)| ResultPiece { mem, xdr_pos }));
    reply(s, h.call.id, stat, &msg, &results)
}

/// An answer the app got wrong or pushed to the limits: a message of any length, results
/// at any positions and of any size.
fn odd_answer(s: &mut Side, h: &Held, b: &mut Bytes<'_>) -> Option<()> {
    let msg = pattern(b.u32(), usize::from(b.u16()) % 9000);
    let mut results = Vec::new();
    for _ in 0..b.u8() % 4 {
        let len = u32::from(b.u16()) % 9000;
        let mem = s.try_alloc(len)?;
        results.push(ResultPiece {
            mem,
            xdr_pos: u32::from(b.u16()),
        });
    }
    reply(s, h.call.id, b.u32() % 6, &msg, &results)
}

fn reply(s: &mut Side, id: ServeId, stat: u32, msg: &[u8], results: &[ResultPiece]) -> Option<()> {
    let at = s.try_alloc(msg.len() as u32)?;
    if !s.env.write(at, msg) {
        return None;
    }
    let spec = ReplySpec {
        accept_stat: stat,
        msg: at,
        results,
    };
    s.conn.submit_reply(id, &spec, &mut s.env).ok()
}

/// Runs the session `data` describes; panics if an engine breaks its contract (see the
/// module documentation). With `SCRIPT_TRACE` set in the environment it prints what
/// happens, to read a failing input: `SCRIPT_TRACE=1 target/fuzz/.../engine ARTIFACT`.
pub fn run(data: &[u8]) {
    play(data);
}

/// [`run`], telling how many calls of each kind succeeded with their replies checked
/// against what the server sent (for tests of the seeds).
pub(crate) fn play(data: &[u8]) -> BTreeMap<Kind, u32> {
    play_fed(data, false).0
}

/// [`play`] with each side's completions fed in batches (`Connection::handle_completions`,
/// a simulator step's at once) if `batched`, else one at a time; gives back the pair too,
/// with what each side posted, sent and reported, to compare the two ways.
pub(crate) fn play_fed(data: &[u8], batched: bool) -> (BTreeMap<Kind, u32>, Pair) {
    let mut b = Bytes(data);
    let setup = b.u8();
    let mut cfgs = [Role::Client, Role::Server].map(|role| {
        let mut c = config(role, 1 + u32::from(b.u8() % 8));
        c.version = if b.bit() { 2 } else { 1 };
        c.shared_recv = setup & 1 != 0;
        c.shared_send = setup & 2 != 0;
        c.recv_size = [1024, 4096][usize::from(b.u8() % 2)];
        c.send_size = [1024, 4096][usize::from(b.u8() % 2)];
        c.ddp_threshold = [64, 1024, 4096][usize::from(b.u8() % 3)];
        c.max_reads = 1 + u32::from(b.u8() % 4);
        sized(c)
    });
    if setup & 4 != 0 {
        // Both learned the other's sizes from RFC 8797 private data.
        let [a, s] = cfgs;
        let pd = |c: &super::ConnConfig| PrivateData {
            remote_invalidate: setup & 8 != 0,
            send_size: c.send_size,
            recv_size: c.recv_size,
        };
        cfgs[0].peer = Some(pd(&s));
        cfgs[1].peer = Some(pd(&a));
    }
    let [a, s] = cfgs;
    let mut session = Session {
        p: Pair::with_app_len(a, s, APP_LEN),
        apps: [App::default(), App::default()],
        trace: std::env::var_os("SCRIPT_TRACE").is_some(),
        clean: true,
        honest: true,
        checked: BTreeMap::new(),
    };
    session.p.a.report_unsignaled = setup & 16 != 0;
    session.p.b.report_unsignaled = setup & 32 != 0;
    session.p.a.batched = batched;
    session.p.b.batched = batched;
    session.events();
    let mut seen = [0; 2];
    for _ in 0..MAX_STEPS {
        if b.0.is_empty() {
            break;
        }
        // The top bit picks the side, the rest the step.
        let op = b.u8();
        let k = usize::from(op >> 7);
        let op = op & 0x7f;
        if session.trace {
            eprintln!("step {} on the {}", op % 12, NAMES[k]);
        }
        match op % 12 {
            0 | 1 => session.call(k, &mut b),
            2 => {
                for _ in 0..=b.u8() % 4 {
                    session.p.step();
                }
                session.events();
            }
            3 => session.run(),
            4 | 5 => {
                session.run();
                session.serve(k, &mut b);
            }
            6 => session.inject(k, &mut b),
            7 => session.control(k, &mut b),
            8 => {
                session.p.now += Duration::from_millis(u64::from(b.u16()) * 8);
                let now = session.p.now;
                session.p.a.conn.handle_timeout(now);
                session.p.b.conn.handle_timeout(now);
            }
            9 => {
                let xids = &session.apps[k].xids;
                if let Some(&xid) = xids.get(usize::from(b.u8()) % xids.len().max(1)) {
                    let _ = side(&mut session.p, k).conn.cancel_call(xid);
                }
            }
            10 => match b.u8() % 4 {
                0 => side(&mut session.p, k).conn.close(CloseReason::Requested),
                1 => session.optional(k, &mut b),
                _ => session.faults(k, &mut b),
            },
            _ => session.run(),
        }
        session.events();
        session.sends(&mut seen);
    }
    session.run();
    let checked = std::mem::take(&mut session.checked);
    (checked, session.finish())
}
