//! An [`AppTable`] with a well-behaved app and a hostile one, scripted by bytes, for the
//! `table` fuzz target (`shm-api/fuzz`) and its property test. Built with the crate's `sim`
//! feature (not an API).
//!
//! Both apps are attached in process (their own mappings of real memfd regions, as an app's
//! process has). **G** keeps to the ABI: it registers a program, calls peers with argument
//! pieces and result buffers, posts receive buffers, answers the calls it is handed, and
//! drains its completion ring. **B** writes descriptors whose every field the bytes choose
//! (often near the valid: ranges at the arena's edge, piece tables it wrote or scribbled,
//! handles of real and stale served calls), scribbles its arena and its rings' indices, stops
//! draining its completions, and detaches (on its ring, by closing its socket, or by a ring
//! the table finds corrupt). The daemon's part is played as a poll thread plays it: polls the
//! submissions, holds the calls and completes them with outcomes the bytes choose (reply
//! lengths past the buffer, result records of any value; failed ones often *lent*, released
//! later), hands incoming calls to the registered server, completes replies, drops served
//! calls, reaps.
//!
//! [`run`] panics only if the table breaks its contract:
//! - nothing panics;
//! - every G submission is accepted, exactly as G wrote it, and completes exactly once with
//!   exactly the outcome the daemon gave it (a reply length clipped to G's buffer); G never
//!   sees a completion it did not cause, and is never detached; a call that completed
//!   `LENT` is followed by exactly one `RELEASED`, once the daemon released it, and holds
//!   its op until then;
//! - whatever B does costs only B: B's calls are reported in flight when it detaches, and
//!   completing them afterwards is refused;
//! - the table never owes an app more completions than its ring holds, plus one per lent call
//!   (so its backlog never grows past what it reserved), and once both apps are gone it holds
//!   no operation, no backlog and no app.

use std::collections::{BTreeMap, HashSet};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::abi::{cqe_flag, flag, op, status, Cqe, Geometry, Layout, Piece, Sqe};
use crate::attach::Attachment;
use crate::daemon::{AppId, AppTable, CallOutcome, IncomingCall, OpId, Submission, TableConfig};
use crate::region::{PeerInfo, Region};
use crate::ring::{Consumer, Producer};

/// Steps of one script at most.
const MAX_STEPS: usize = 300;
/// The program G serves, and one B may register.
const G_PROG: u32 = 0x2000_0100;
/// Ring and arena sizes: small, so that rings fill and ranges meet the arena's edge.
const SQ: u32 = 16;
const CQ: u32 = 8;
/// Operations per app.
const OPS: u16 = 12;
const ARENA: u32 = 1 << 14;
/// G's arena: piece tables at 0, messages at 4 KiB, reply buffers at 8 KiB, receives at 12 KiB.
const G_PIECES: u32 = 0;
const G_MSG: u32 = 4096;
const G_REPLY: u32 = 8192;
const G_RECV: u32 = 12288;

/// The script's bytes, read front to back; zeros once they run out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    fn bit(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A value for a field: zero, small, near `edge` (the arena's size), or any.
    fn field(&mut self, edge: u32) -> u32 {
        match self.u8() % 6 {
            0 => 0,
            1 => u32::from(self.u8()) * 4,
            2 => edge.wrapping_sub(u32::from(self.u8())),
            3 => edge.wrapping_add(u32::from(self.u8())),
            4 => u32::MAX - u32::from(self.u8()),
            _ => self.u32(),
        }
    }
}

/// The app's half of an attachment: its own mapping of the region, its ring ends, its socket.
struct App {
    id: AppId,
    region: Region,
    sq: Producer<Sqe>,
    cq: Consumer<Cqe>,
    sock: Option<UnixStream>,
}

impl App {
    fn attach(t: &mut AppTable, app_id: u32) -> App {
        let layout = Layout::new(Geometry {
            sq_entries: SQ,
            cq_entries: CQ,
            arena_size: ARENA,
            peers: 2,
        })
        .expect("layout");
        let region = Region::create(
            layout,
            app_id,
            &[PeerInfo::named("p0"), PeerInfo::named("p1")],
        )
        .expect("region");
        let fd = rustix::io::fcntl_dupfd_cloexec(region.fd(), 0).expect("dup");
        let app_region = Region::open(fd).expect("open");
        let (a, b) = UnixStream::pair().expect("socketpair");
        // Apps of user 1000 (AUTH_SYS as another identity is refused).
        let att = Attachment {
            region,
            sock: a,
            pid: None,
            ids: Some((1000, 100)),
            app_id,
        };
        let id = t.attach(att).expect("room for two apps");
        // SAFETY: one producer and one consumer for this app, made once; `app_region` lives in
        // the same struct, so the ring ends never outlive the mapping they point into.
        let (sq, cq) = unsafe { (app_region.sq_producer(), app_region.cq_consumer()) };
        App {
            id,
            region: app_region,
            sq,
            cq,
            sock: Some(b),
        }
    }

    fn write(&self, off: u32, bytes: &[u8]) {
        if let Some(r) = self.region.range(off, bytes.len() as u32) {
            self.region.write_arena(r, bytes);
        }
    }

    /// The ring index word at `off` of the region (SQ or CQ head or tail).
    fn index(&self, off: u32) -> &AtomicU32 {
        // SAFETY: `off` is one of the region's four ring index words (4-aligned, inside the
        // mapping), which both sides access only atomically; the reference lives no longer
        // than `self`, which owns the mapping.
        unsafe { &*(self.region.base().add(off as usize) as *const AtomicU32) }
    }
}

/// What G expects of a submission's completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Expect {
    kind: u8,
    status: u32,
    msg_len: u32,
    flags: u8,
}

/// A call or reply the daemon holds.
#[derive(Clone, Copy, Debug)]
struct Held {
    op: OpId,
    good: bool,
    /// G's: its submission's number (G writes it in the procedure field of its calls and
    /// the accept_stat of its replies, which the table carries through untouched).
    user: u64,
}

struct Run {
    t: AppTable,
    g: App,
    b: Option<App>,
    /// G's submissions by user data: `None` until the daemon decides their outcome.
    g_wait: BTreeMap<u64, Option<Expect>>,
    g_user: u64,
    /// G's receive buffers posted and not yet used.
    g_recvs: u32,
    /// G's served calls (the handle its REPLY carries), not yet answered.
    g_serving: Vec<u32>,
    /// G's call slots (message, pieces, reply buffer) free, and those in use by submission.
    g_free: Vec<u32>,
    g_slots: BTreeMap<u64, u32>,
    /// G's replies in flight, by submission, with the handle they answer.
    g_replying: BTreeMap<u64, u32>,
    /// Handles of G's served calls the daemon dropped: a REPLY to one fails with BAD_HANDLE.
    g_dropped: HashSet<u32>,
    g_registered: bool,
    /// G's calls that completed lent, by submission, their slots still lent (until their
    /// RELEASED), and those of them the daemon released (RELEASED owed, in order).
    g_lent: HashSet<u64>,
    g_releasing: HashSet<u64>,
    /// Calls, replies and served calls the daemon holds.
    calls: Vec<Held>,
    /// Calls that ended lent, not yet released.
    lent: Vec<Held>,
    replies: Vec<Held>,
    serving: Vec<(OpId, u64)>,
    /// Handles B was given for served calls (it may reply to them, or to stale ones).
    b_handles: Vec<u32>,
    next_tag: u64,
    /// B's calls in flight, for its detach report.
    b_calls: HashSet<OpId>,
    /// B's calls already detached: completing them must be refused.
    b_gone: Vec<OpId>,
    out: Vec<(AppId, Submission)>,
}

impl Run {
    fn new() -> Run {
        let mut t = AppTable::new(TableConfig {
            max_apps: 2,
            max_ops_per_app: OPS,
            peers: 2,
            ..TableConfig::default()
        })
        .expect("table");
        let g = App::attach(&mut t, 1);
        let b = App::attach(&mut t, 2);
        let mut r = Run {
            t,
            g,
            b: Some(b),
            g_wait: BTreeMap::new(),
            g_user: 1,
            g_recvs: 0,
            g_serving: Vec::new(),
            g_free: (0..8).collect(),
            g_slots: BTreeMap::new(),
            g_replying: BTreeMap::new(),
            g_dropped: HashSet::new(),
            g_registered: false,
            g_lent: HashSet::new(),
            g_releasing: HashSet::new(),
            calls: Vec::new(),
            lent: Vec::new(),
            replies: Vec::new(),
            serving: Vec::new(),
            b_handles: Vec::new(),
            next_tag: 1,
            b_calls: HashSet::new(),
            b_gone: Vec::new(),
            out: Vec::with_capacity(64),
        };
        r.g_submit(
            Sqe {
                opcode: op::REGISTER,
                prog: G_PROG,
                vers: 1,
                ..Sqe::default()
            },
            Some(Expect {
                kind: op::REGISTER,
                status: status::OK,
                msg_len: 0,
                flags: 0,
            }),
        );
        r
    }

    /// G submits `s` (if its ring has room), expecting `e` (or an outcome decided later).
    fn g_submit(&mut self, mut s: Sqe, e: Option<Expect>) -> bool {
        let user = self.g_user;
        s.user_data = user;
        if self.g.sq.push(s).is_err() {
            return false;
        }
        self.g_user += 1;
        self.g_wait.insert(user, e);
        true
    }

    /// G's calls, receive buffers and answers in flight: bounded by its operation slots.
    fn g_ops(&self) -> usize {
        self.g_wait.len() + self.g_serving.len() + self.g_lent.len()
    }

    /// G calls a peer: arguments in pieces, result buffers, a reply buffer.
    fn g_call(&mut self, b: &mut Bytes<'_>) {
        if self.g_ops() >= 10 {
            return;
        }
        // A slot of its own: its piece table is read when the table takes the call.
        let Some(slot) = self.g_free.pop() else {
            return;
        };
        let n_args = b.u8() % 3;
        let n_results = b.u8() % 2;
        let msg_len = 4 * u32::from(1 + b.u8() % 32);
        let table = G_PIECES + slot * 256;
        let mut pos = 0;
        for i in 0..u32::from(n_args + n_results) {
            let p = if i < u32::from(n_args) {
                pos = (pos + 4 * u32::from(b.u8() % 4)).min(msg_len);
                Piece {
                    off: G_MSG + slot * 512 + 128,
                    len: u32::from(b.u8()),
                    xdr_pos: pos & !3,
                    used: 0,
                }
            } else {
                Piece {
                    off: G_REPLY + slot * 512 + 256,
                    len: 256,
                    xdr_pos: 0,
                    used: 0,
                }
            };
            self.g.region.write_piece(table, i, p);
        }
        let s = Sqe {
            opcode: op::CALL,
            flags: if b.bit() { flag::XID_APP } else { 0 },
            n_args,
            n_results,
            target: u32::from(b.bit()),
            prog: G_PROG + 1,
            vers: 1,
            proc_: self.g_user as u32,
            xid: b.u32(),
            msg_off: G_MSG + slot * 512,
            msg_len,
            pieces_off: table,
            reply_off: G_REPLY + slot * 512,
            reply_len: 256,
            ..Sqe::default()
        };
        let user = self.g_user;
        if self.g_submit(s, None) {
            self.g_slots.insert(user, slot);
        } else {
            self.g_free.push(slot);
        }
    }

    /// G lends a receive buffer.
    fn g_post(&mut self) {
        if self.g_ops() >= 10 || self.g_recvs >= 4 {
            return;
        }
        let s = Sqe {
            opcode: op::POST_RECV,
            msg_off: G_RECV + 1024 * self.g_recvs,
            msg_len: 1024,
            ..Sqe::default()
        };
        if self.g_submit(s, None) {
            self.g_recvs += 1;
        }
    }

    /// G takes its completions, each checked against what it expects; answers served calls.
    fn g_drain(&mut self, b: &mut Bytes<'_>) {
        while let Some(c) = self
            .g
            .cq
            .pop()
            .expect("G's completion ring is never corrupt")
        {
            if c.kind == op::RELEASED {
                // Only after the call's own (LENT) completion, and once: its slot is G's again.
                assert!(
                    self.g_releasing.remove(&c.user_data) && self.g_lent.remove(&c.user_data),
                    "G got a RELEASED it was not owed: {c:?}"
                );
                assert_eq!((c.status, c.flags), (status::OK, 0), "{c:?}");
                if let Some(slot) = self.g_slots.remove(&c.user_data) {
                    self.g_free.push(slot);
                }
                continue;
            }
            let e = self
                .g_wait
                .remove(&c.user_data)
                .unwrap_or_else(|| panic!("G got a completion it did not cause: {c:?}"));
            if c.kind == op::POST_RECV {
                // A call was handed to it in this buffer.
                assert_eq!((c.status, e), (status::OK, None), "{c:?}");
                self.g_recvs -= 1;
                self.g_serving.push(c.handle);
                continue;
            }
            if c.flags & cqe_flag::LENT != 0 {
                // Its slot stays lent to the peer until its RELEASED.
                self.g_lent.insert(c.user_data);
            } else if let Some(slot) = self.g_slots.remove(&c.user_data) {
                self.g_free.push(slot);
            }
            let answered = self.g_replying.remove(&c.user_data);
            if c.kind == op::REPLY && e.is_none() {
                // Refused at once: only a reply to a call the daemon dropped.
                let h = answered.expect("a REPLY of G's");
                assert!(
                    c.status == status::BAD_HANDLE && self.g_dropped.contains(&h),
                    "G's reply refused: {c:?}"
                );
                continue;
            }
            let e = e.unwrap_or_else(|| panic!("G's submission completed too soon: {c:?}"));
            assert_eq!(
                Expect {
                    kind: c.kind,
                    status: c.status,
                    msg_len: c.msg_len,
                    flags: c.flags,
                },
                e,
                "G's completion differs from the daemon's outcome"
            );
        }
        // G answers one of its served calls.
        if let Some(h) = self.g_serving.pop() {
            let s = Sqe {
                opcode: op::REPLY,
                target: h,
                proc_: self.g_user as u32,
                msg_off: G_MSG + 4000,
                msg_len: 4 * u32::from(b.u8() % 8),
                ..Sqe::default()
            };
            let user = self.g_user;
            if self.g_submit(s, None) {
                self.g_replying.insert(user, h);
            } else {
                self.g_serving.push(h);
            }
        }
    }

    /// B submits a descriptor of its own making.
    fn b_submit(&mut self, b: &mut Bytes<'_>) {
        let handles = &self.b_handles;
        let target = match b.u8() % 8 {
            0 if !handles.is_empty() => handles[usize::from(b.u8()) % handles.len()],
            0..=3 => 0,
            4 | 5 => 1,
            _ => b.u32(),
        };
        let opcode = match b.u8() % 11 {
            0..=2 => op::CALL,
            3 => op::REPLY,
            4 => op::REGISTER,
            5 => op::UNREGISTER,
            6 => op::POST_RECV,
            7 => op::DETACH,
            8 => op::CANCEL,
            _ => b.u8(),
        };
        let s = Sqe {
            opcode,
            flags: match b.u8() % 8 {
                0 => b.u8(),
                1 => flag::XID_APP,
                _ => 0,
            },
            n_args: b.u8() % 10,
            n_results: b.u8() % 10,
            target,
            user_data: b.u32().into(),
            prog: if b.bit() { G_PROG } else { G_PROG + 1 },
            vers: u32::from(b.u8() % 3),
            proc_: b.u32(),
            xid: b.u32(),
            msg_off: b.field(ARENA),
            msg_len: b.field(ARENA),
            pieces_off: b.field(ARENA),
            reply_off: b.field(ARENA),
            reply_len: b.field(ARENA),
            timeout_ms: if b.u8() % 4 == 0 { b.u32() } else { 0 },
            auth_uid: if b.u8() % 16 == 0 { b.u32() } else { 0 },
            auth_gid: 0,
        };
        if let Some(app) = self.b.as_mut() {
            let _ = app.sq.push(s);
            // Now and then it takes its completions (often it lets them pile up).
            if b.u8() % 4 == 0 {
                while let Ok(Some(_)) = app.cq.pop() {}
            }
        }
    }

    /// B scribbles its arena (piece tables included) or one of its rings' indices.
    fn b_scribble(&mut self, b: &mut Bytes<'_>) {
        let Some(app) = self.b.as_ref() else { return };
        if b.u8() % 4 == 0 {
            let l = *app.region.layout();
            let off = match b.u8() % 4 {
                0 => l.sq_offset,
                1 => l.sq_offset + 64,
                2 => l.cq_offset,
                _ => l.cq_offset + 64,
            };
            let v = b.field(SQ);
            app.index(off).store(v, Ordering::Release);
        } else {
            let off = b.field(ARENA) % ARENA;
            let mut bytes = [0u8; 16];
            for (i, x) in bytes.iter_mut().enumerate() {
                *x = if i % 4 == 3 { b.u8() } else { 0 };
            }
            app.write(off & !3, &bytes);
        }
    }

    /// The daemon polls the submissions and takes each as a poll thread does.
    fn poll(&mut self, b: &mut Bytes<'_>) {
        let budget = 1 + usize::from(b.u8() % 8);
        let mut out = std::mem::take(&mut self.out);
        self.t.poll_submissions(&mut out, budget);
        for (app, sub) in out.drain(..) {
            let good = app == self.g.id;
            match sub {
                Submission::Call(id) => {
                    let c = *self.t.call_request(id).expect("a call's request is kept");
                    if good {
                        self.check_g_call(&c);
                    } else {
                        self.b_calls.insert(id);
                    }
                    self.calls.push(Held {
                        op: id,
                        good,
                        user: u64::from(c.proc_),
                    });
                }
                Submission::Reply(id) => {
                    let r = *self.t.reply_request(id).expect("a reply's request is kept");
                    self.serving.retain(|(op, _)| *op != id);
                    assert!(r.msg.len() <= ARENA);
                    self.replies.push(Held {
                        op: id,
                        good,
                        user: u64::from(r.accept_stat),
                    });
                }
                Submission::Registered { ack, .. } => {
                    assert!(!good || !self.g_registered, "G registers once");
                    self.g_registered |= good;
                    // As a daemon with one poll thread does: at once.
                    self.t.acknowledge(app, ack);
                }
                Submission::Unregistered { .. } => {
                    assert!(!good, "G never unregisters");
                }
                Submission::Detach => {
                    assert!(!good, "G never detaches");
                    self.b_detach("detached");
                }
                Submission::Cancel(id) => {
                    assert!(!good, "G never cancels");
                    assert!(
                        self.b_calls.contains(&id),
                        "only a call in flight is cancelled"
                    );
                }
            }
        }
        self.out = out;
        // Time runs out for every call with a limit: only B sets one, on a call in flight.
        if b.u8() % 8 == 0 {
            let mut late = Vec::new();
            self.t
                .expired(Instant::now() + Duration::from_secs(1 << 33), &mut late);
            for id in late {
                assert_ne!(id.app(), self.g.id, "G sets no time limit");
                assert!(self.b_calls.contains(&id), "only a call in flight expires");
            }
            assert!(self.t.next_deadline().is_none(), "every limit was reported");
        }
    }

    /// G's call reached the daemon exactly as G wrote it.
    fn check_g_call(&self, c: &crate::daemon::CallRequest) {
        assert_eq!(c.prog, G_PROG + 1);
        assert!(c.msg.off() >= G_MSG && c.msg.off() < G_REPLY, "{c:?}");
        assert_eq!(c.reply.len(), 256);
        assert_eq!(
            c.reply.off() - G_REPLY,
            c.msg.off() - G_MSG,
            "message and reply of one slot"
        );
        for p in c.results.as_slice() {
            assert_eq!((p.len, p.used), (256, 0));
        }
    }

    /// The daemon ends a call it holds, with an outcome of the script's choosing.
    fn complete_call(&mut self, b: &mut Bytes<'_>) {
        if self.calls.is_empty() {
            return;
        }
        let h = self.calls.remove(usize::from(b.u8()) % self.calls.len());
        let st = match b.u8() % 4 {
            0 => status::TRANSPORT,
            1 => status::TIMEOUT,
            _ => status::OK,
        };
        let reply_len = b.field(256);
        let results: Vec<(u32, u32)> = (0..b.u8() % 4)
            .map(|_| (b.field(64), b.field(256)))
            .collect();
        // A call that failed may have ended with its memory still lent to the peer.
        let lent = st != status::OK && b.bit();
        let outcome = CallOutcome {
            status: st,
            rpc_stat: u32::from(b.u8() % 3),
            reply_len,
            results: &results,
            lent,
        };
        let done = self.t.complete_call(h.op, outcome);
        if lent && done {
            self.lent.push(h);
        }
        if h.good {
            assert!(done, "G's call is known until completed");
            // The completion G will see: the reply length clipped to its 256-byte buffer.
            let e = Expect {
                kind: op::CALL,
                status: st,
                msg_len: if st == status::OK {
                    reply_len.min(256)
                } else {
                    0
                },
                flags: if lent { cqe_flag::LENT } else { 0 },
            };
            self.g_wait.insert(h.user, Some(e));
        } else {
            self.b_calls.remove(&h.op);
        }
    }

    /// The daemon releases a call that ended lent (its late reply came, or its connection
    /// ended).
    fn release_call(&mut self, b: &mut Bytes<'_>) {
        if self.lent.is_empty() {
            return;
        }
        let h = self.lent.remove(usize::from(b.u8()) % self.lent.len());
        let done = self.t.release_call(h.op);
        if h.good {
            assert!(done, "G's lent call is known until released");
            self.g_releasing.insert(h.user);
        }
        assert!(
            !self.t.release_call(h.op),
            "a call is released once, and only while lent"
        );
    }

    /// The daemon hands an incoming call to whoever serves `G_PROG` (G, or B if it took it).
    fn deliver(&mut self, b: &mut Bytes<'_>) {
        let prog = if b.u8() % 4 == 0 { G_PROG + 1 } else { G_PROG };
        let Some(app) = self.t.lookup(prog, 1) else {
            return;
        };
        let need = b.field(1024) % 2048;
        let Ok(rb) = self.t.take_recv(app, need) else {
            return;
        };
        if b.u8() % 5 == 0 {
            self.t.put_back_recv(rb);
            return;
        }
        let tag = self.next_tag;
        self.next_tag += 1;
        let call = IncomingCall {
            peer: u32::from(b.bit()),
            prog,
            vers: 1,
            proc_: u32::from(b.u8()),
            xid: b.u32(),
            args_len: need.min(rb.buf.len()),
            auth: b.bit().then_some((1000, 100)),
            tag,
        };
        if let Ok(id) = self.t.deliver_call(rb, call) {
            self.serving.push((id, tag));
            if app != self.g.id {
                self.b_handles.push(handle(id));
            }
        }
    }

    /// The daemon ends a reply (sent, or failed).
    fn complete_reply(&mut self, b: &mut Bytes<'_>) {
        if self.replies.is_empty() {
            return;
        }
        let h = self
            .replies
            .remove(usize::from(b.u8()) % self.replies.len());
        let code = if b.bit() {
            status::OK
        } else {
            status::TRANSPORT
        };
        let done = self.t.complete_reply(h.op, code);
        if h.good {
            assert!(done, "G's reply is known until completed");
            let e = Expect {
                kind: op::REPLY,
                status: code,
                msg_len: 0,
                flags: 0,
            };
            self.g_wait.insert(h.user, Some(e));
        }
    }

    /// The daemon drops a served call (its requester went away).
    fn cancel_serving(&mut self, b: &mut Bytes<'_>) {
        if self.serving.is_empty() {
            return;
        }
        let (id, _) = self
            .serving
            .remove(usize::from(b.u8()) % self.serving.len());
        if id.app() == self.g.id {
            self.g_dropped.insert(handle(id));
        }
        self.t.cancel_serving(id);
    }

    /// B goes: what it had in flight is reported, and nothing of it is taken after.
    fn b_detach(&mut self, why: &'static str) {
        let Some(app) = self.b.take() else { return };
        let d = self.t.detach(app.id, why);
        self.after_b_detached(
            d.as_ref()
                .map(|d| (d.calls.as_slice(), d.serving_tags.len())),
        );
    }

    fn after_b_detached(&mut self, d: Option<(&[OpId], usize)>) {
        let (calls, _) = d.expect("B was attached");
        let reported: HashSet<OpId> = calls.iter().copied().collect();
        assert_eq!(
            reported, self.b_calls,
            "B's calls in flight are those reported at its detach"
        );
        self.b_gone.extend(self.b_calls.drain());
    }

    /// The table reaps: B if it closed its socket or corrupted a ring; never G.
    fn reap(&mut self) {
        for d in self.t.reap() {
            assert_ne!(d.app, self.g.id, "G was reaped ({})", d.reason);
            if self.b.as_ref().is_some_and(|a| a.id == d.app) {
                self.b = None;
                self.after_b_detached(Some((&d.calls, d.serving_tags.len())));
            }
        }
    }

    fn check_owed(&self) {
        let s = self.t.stats();
        assert!(
            s.backlog <= 2 * (CQ as usize + usize::from(OPS)),
            "completions owed beyond the rings: {s:?}"
        );
    }

    fn step(&mut self, b: &mut Bytes<'_>) -> bool {
        if b.0.is_empty() {
            return false;
        }
        match b.u8() % 16 {
            0 | 1 => self.g_call(b),
            2 => self.g_post(),
            3 => self.g_drain(b),
            4..=6 => self.b_submit(b),
            7 => self.b_scribble(b),
            8 | 9 => self.poll(b),
            10 | 11 => self.complete_call(b),
            12 => self.deliver(b),
            13 if b.bit() => self.release_call(b),
            13 => self.complete_reply(b),
            14 => self.cancel_serving(b),
            _ => match b.u8() % 4 {
                0 => {
                    if let Some(app) = self.b.as_mut() {
                        app.sock = None;
                    }
                    self.reap();
                }
                1 => {
                    // B drains its completions at last (it may have let them pile up).
                    if let Some(app) = self.b.as_mut() {
                        while let Ok(Some(_)) = app.cq.pop() {}
                    }
                }
                _ => self.reap(),
            },
        }
        self.check_owed();
        true
    }

    /// The end: B goes, every call and reply is completed, G has seen each of its
    /// submissions end, then G goes and the table is empty.
    fn finish(mut self) {
        if let Some(app) = self.b.take() {
            let d = self.t.detach(app.id, "closed");
            self.after_b_detached(
                d.as_ref()
                    .map(|d| (d.calls.as_slice(), d.serving_tags.len())),
            );
        }
        for id in std::mem::take(&mut self.b_gone) {
            assert!(
                !self.t.complete_call(id, CallOutcome::default()),
                "a detached app's call was completed"
            );
        }
        let mut quiet = Bytes(&[]);
        for _ in 0..64 {
            self.poll(&mut quiet);
            while !self.calls.is_empty() {
                self.complete_call(&mut quiet);
            }
            while !self.replies.is_empty() {
                self.complete_reply(&mut quiet);
            }
            while !self.lent.is_empty() {
                self.release_call(&mut quiet);
            }
            self.g_drain(&mut quiet);
            // Receive buffers never handed a call stay lent until G goes.
            let lent = self.g_wait.values().filter(|e| e.is_none()).count();
            if lent == self.g_recvs as usize && self.g_serving.is_empty() && self.g_lent.is_empty()
            {
                break;
            }
        }
        let lent = self.g_wait.values().filter(|e| e.is_none()).count();
        assert_eq!(
            lent, self.g_recvs as usize,
            "G's submissions never completed: {:?}",
            self.g_wait
        );
        assert!(
            self.g_lent.is_empty(),
            "G's lent calls never released: {:?}",
            self.g_lent
        );
        let d = self.t.detach(self.g.id, "closed").expect("G attached");
        assert!(d.calls.is_empty(), "{d:?}");
        let s = self.t.stats();
        assert_eq!((s.apps, s.ops, s.backlog), (0, 0, 0), "{s:?}");
    }
}

/// The handle a served call's REPLY carries (slot and generation, as in its completion).
fn handle(id: OpId) -> u32 {
    let v = id.to_u64();
    ((v >> 16) as u32 & 0xffff) << 16 | (v as u32 & 0xffff)
}

/// Plays the script in `data` (see the module documentation); panics if the table breaks its
/// contract.
pub fn run(data: &[u8]) {
    let mut b = Bytes(data);
    let mut r = Run::new();
    for _ in 0..MAX_STEPS {
        if !r.step(&mut b) {
            break;
        }
    }
    r.finish();
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// The `table` fuzz target's contract, on random scripts (see the module docs).
        #[test]
        fn prop_scripted_apps_keep_the_table_contract(
            data in proptest::collection::vec(any::<u8>(), 0..800)
        ) {
            super::run(&data);
        }
    }
}
