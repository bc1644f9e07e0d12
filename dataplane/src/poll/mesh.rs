//! Hand-offs between poll threads (SPDK's `spdk_thread_send_msg`, without the allocation).
//!
//! Each thread owns the apps the control thread gave it (their rings stay single-producer,
//! single-consumer) and the connections it opened or accepted. A call from an app on thread A
//! to a connection on thread B, and an incoming call on B for a program an app on A serves,
//! travel as [`Hop`] messages through one bounded lock-free queue per ordered pair of threads.
//! A thread sends hops to itself too (through a local queue), so one code path serves both.
//!
//! Every thread registers every app's arena with its own provider (the owning thread sends the
//! memfd in [`Hop::Arena`]), so B reads and writes A's app memory directly: data never moves
//! between threads, only these small records do.
//!
//! Routes from a configured peer to the connection that reaches it are one atomic word per
//! peer, written by the thread owning the connection and read by every thread.

use crossbeam_queue::ArrayQueue;
use rpcrdma_shm::abi::ArenaRange;
use rpcrdma_shm::daemon::{AppId, CallRequest, OpId, PieceList};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

/// Results of a call as [`Hop::CallDone`] carries them (offset, length of each DDP result).
pub(crate) type Results = [(u32, u32); rpcrdma_shm::abi::MAX_PIECES];

/// Boxes of the two large things hops carry (a call's request, a reply's result pieces), kept
/// for reuse.
///
/// A hop is as large as its largest kind and is moved into a queue and out again: with a
/// call's request inline (328 bytes) every hop, even a 16-byte answer, was a `memcpy` call of
/// 336 bytes, about a tenth of a daemon's instructions per RPC. Boxed, a hop is small enough to
/// move in registers. The thread that sends a call or a reply takes a box here; the thread that
/// receives it keeps the box once it has read it, and the hop answering it (`CallDone`,
/// `ReplyDone`) brings a box back when it crosses threads. So boxes stay with the threads that
/// use them, and a thread allocates only when it has more in flight at once than it ever had:
/// then [`Self::BATCH`] boxes at once, so a busier moment than the first calls after a start
/// (up to a batch more hops in flight) finds them ready (the stack itself is sized once).
#[derive(Debug)]
pub(crate) struct Spares<T> {
    free: Vec<Box<T>>,
}

impl<T: Copy> Spares<T> {
    /// Boxes kept at most (more are freed).
    const MAX: usize = 4096;

    /// Boxes made at once when none is kept: two turns' worth of one app's submissions (a turn
    /// takes 32), so that one busy app's calls and replies, which come back within a turn on
    /// the thread's own queue, never find the stack empty once it has been filled.
    pub(crate) const BATCH: usize = 64;

    /// No box yet, room for [`Self::MAX`].
    pub(crate) fn new() -> Spares<T> {
        Spares {
            free: Vec::with_capacity(Self::MAX),
        }
    }

    /// A copy of `v` in a box (a kept one when there is one), copied once.
    pub(crate) fn boxed(&mut self, v: &T) -> Box<T> {
        match self.free.pop() {
            Some(mut b) => {
                *b = *v;
                b
            }
            None => {
                self.free.extend((1..Self::BATCH).map(|_| Box::new(*v)));
                Box::new(*v)
            }
        }
    }

    /// Keeps `b` for reuse.
    pub(crate) fn keep(&mut self, b: Box<T>) {
        if self.free.len() < Self::MAX {
            self.free.push(b);
        }
    }

    /// A kept box to send back to the thread a request came from.
    pub(crate) fn give(&mut self) -> Option<Box<T>> {
        self.free.pop()
    }

    /// Boxes kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.free.len()
    }
}

/// A message from one poll thread to another (or to itself). "App side" is the thread owning
/// the app, "connection side" the thread owning the connection.
#[derive(Debug)]
pub(crate) enum Hop {
    /// App side → connection side: send `req` on connection `conn` (a global id).
    Call {
        /// Global connection id.
        conn: u32,
        /// The validated call (its `id` names the app on the sending thread), boxed
        /// ([`Spares`]).
        req: Box<CallRequest>,
    },
    /// Connection side → app side: how call `op` ended.
    CallDone {
        /// The call.
        op: OpId,
        /// ABI status.
        status: u32,
        /// Cancelled while the peer may still reach its memory: [`Hop::Released`] follows.
        lent: bool,
        /// RPC `accept_stat` of the reply.
        rpc_stat: u32,
        /// Reply length.
        reply_len: u32,
        /// DDP results used.
        n: u8,
        /// DDP results (offset, length) in the app's arena.
        results: Results,
        /// A box for the app side's next call, when the call came from another thread.
        spare: Option<Box<CallRequest>>,
    },
    /// Connection side → app side: an incoming call for a program this thread's app serves.
    Incoming(super::thread::Inbound),
    /// App side → connection side: pull the arguments of `tag` into `buf` of `app`.
    Accept {
        /// Call tag.
        tag: u64,
        /// Serving app (on the sending thread).
        app: AppId,
        /// Its receive buffer.
        buf: ArenaRange,
    },
    /// App side → connection side: answer `tag` with `accept_stat` (no server, no buffer).
    Refuse {
        /// Call tag.
        tag: u64,
        /// RPC `accept_stat`.
        accept_stat: u32,
    },
    /// Connection side → app side: the arguments of `tag` are in place.
    ArgsReady {
        /// Call tag.
        tag: u64,
        /// Argument bytes.
        args_len: u32,
    },
    /// App side → connection side: send the reply the app wrote.
    Reply {
        /// Call tag.
        tag: u64,
        /// Serving app.
        app: AppId,
        /// RPC `accept_stat`.
        accept_stat: u32,
        /// Reply message in the arena.
        msg: ArenaRange,
        /// DDP-eligible results, boxed ([`Spares`]).
        results: Box<PieceList>,
    },
    /// Connection side → app side: the reply of `tag` went out (`code` OK) or failed.
    ReplyDone {
        /// Call tag.
        tag: u64,
        /// ABI status.
        code: u32,
        /// A box for the app side's next reply, when the reply came from another thread.
        spare: Option<Box<PieceList>>,
    },
    /// Connection side → app side: the call `tag` ended before its reply (connection lost).
    Aborted {
        /// Call tag.
        tag: u64,
    },
    /// App side → connection side: end call `op` with `code` (`CANCELLED`: its app asked or
    /// went away; `TIMEOUT`: its time limit passed), if it has not ended yet: at once, lent
    /// (see [`Hop::CallDone`]) if the peer may still reach its memory.
    Cancel {
        /// The call.
        op: OpId,
        /// Global connection id it was sent to.
        conn: u32,
        /// Its XID.
        xid: u32,
        /// ABI status to end it with.
        code: u32,
    },
    /// Connection side → app side: call `op`, which ended lent ([`Hop::CallDone`]), is
    /// released: the peer can no longer reach its memory.
    Released {
        /// The call.
        op: OpId,
    },
    /// App side → connection side: the app serving `tag` went away; answer SYSTEM_ERR.
    FailServed {
        /// Call tag.
        tag: u64,
    },
    /// App side → every other thread: register `app`'s arena (`len` bytes of `fd` at `offset`).
    Arena {
        /// The app.
        app: AppId,
        /// Its region's memfd (a duplicate).
        fd: OwnedFd,
        /// Arena offset in the file.
        offset: u64,
        /// Arena length.
        len: usize,
    },
    /// Listener side → connection side: answer this admitted connection request (handed
    /// over by the listener's provider) and keep its connection.
    Adopt(Box<Adoption>),
    /// Connection side → listener side: a connection listener `index` admitted for `host`
    /// ended (or was never made): the host holds one fewer.
    Unadmit {
        /// The listener's configuration index.
        index: usize,
        /// The host it counted against.
        host: Option<std::net::IpAddr>,
        /// Why it was refused after all (no slot, the daemon stopping), if it was.
        refused: Option<super::Refusal>,
    },
    /// App side → every other thread: `app` is gone and nothing uses its memory any more.
    ArenaGone {
        /// The app.
        app: AppId,
    },
    /// App side → every other thread: an app of the sender serves (or stopped serving) a program.
    Serve {
        /// Program.
        prog: u32,
        /// Version.
        vers: u32,
        /// A callback program (backward direction).
        backchannel: bool,
        /// Serving (true) or stopped.
        on: bool,
    },
}

/// A connection request a listener's thread admitted and handed to another thread
/// ([`Hop::Adopt`]), with what that thread needs to answer it and to release its admission.
#[derive(Debug)]
pub(crate) struct Adoption {
    /// The request, out of the listener's provider.
    pub request: rpcrdma_verbs::Handover,
    /// The thread of the listener that admitted it.
    pub owner: usize,
    /// That listener's configuration index.
    pub index: usize,
    /// The connecting side's address.
    pub remote: Option<std::net::SocketAddr>,
    /// The connecting side's private data (RFC 8797).
    pub private_data: rpcrdma_verbs::PrivateData,
}

/// What the threads of one daemon share: the queues between them, their doorbells and park
/// flags, and the peer routes.
#[derive(Debug)]
struct Shared {
    threads: usize,
    /// `queues[from * threads + to]`; the diagonal is unused (a thread's own hops stay local).
    queues: Vec<ArrayQueue<Hop>>,
    parked: Vec<AtomicBool>,
    bells: Vec<UnixStream>,
    /// Per configured peer: the global id of its connection plus one, or 0.
    routes: Vec<AtomicU32>,
    conns_per_thread: u32,
    /// Per thread: its connections, plus those handed to it and not taken in yet (what a
    /// listener's thread weighs to place an accepted connection).
    loads: Vec<AtomicU32>,
}

/// The set of poll threads of one daemon, before they start: hand each its [`Port`].
#[derive(Debug)]
pub struct Mesh {
    shared: Arc<Shared>,
    bells: Vec<Option<UnixStream>>,
}

impl Mesh {
    /// `threads` poll threads, each with room for `conns_per_thread` connections, `peers`
    /// configured peers, and `depth` hops queued from one thread to another.
    pub fn new(
        threads: usize,
        conns_per_thread: u32,
        peers: usize,
        depth: usize,
    ) -> std::io::Result<Mesh> {
        let threads = threads.clamp(1, 256);
        let mut writers = Vec::with_capacity(threads);
        let mut readers = Vec::with_capacity(threads);
        for _ in 0..threads {
            let (w, r) = UnixStream::pair()?;
            w.set_nonblocking(true)?;
            r.set_nonblocking(true)?;
            writers.push(w);
            readers.push(Some(r));
        }
        let shared = Shared {
            threads,
            queues: (0..threads * threads)
                .map(|_| ArrayQueue::new(depth.max(16)))
                .collect(),
            parked: (0..threads).map(|_| AtomicBool::new(false)).collect(),
            bells: writers,
            routes: (0..peers).map(|_| AtomicU32::new(0)).collect(),
            conns_per_thread: conns_per_thread.max(1),
            loads: (0..threads).map(|_| AtomicU32::new(0)).collect(),
        };
        Ok(Mesh {
            shared: Arc::new(shared),
            bells: readers,
        })
    }

    /// Thread `index`'s end (once: `None` after the first time or out of range).
    pub fn port(&mut self, index: usize) -> Option<Port> {
        let bell = self.bells.get_mut(index)?.take()?;
        Some(Port {
            shared: self.shared.clone(),
            me: index,
            bell,
        })
    }

    /// The thread owning global connection id `conn`.
    pub fn thread_of(&self, conn: u32) -> usize {
        self.shared.thread_of(conn)
    }
}

/// Global connection ids. Slot `s` of thread `t` names its connections
/// `t × conns_per_thread + s + k × slots` (`slots` = every thread's slots), `k` counting the
/// connections the slot has had (modulo [`Shared::generations`]): an id names one connection,
/// not its slot, so a stale id (a `close` typed after the connection went, a serving app's
/// call back to a client that has left) never reaches the next connection in the slot.
impl Shared {
    /// Slots of every thread.
    fn slots(&self) -> u32 {
        u32::try_from(self.threads)
            .unwrap_or(u32::MAX)
            .saturating_mul(self.conns_per_thread)
            .max(1)
    }

    /// Connections a slot names before its ids come round again: as many as keep every id
    /// below 2^31 (apps address connections by peer index, the configured peers first).
    fn generations(&self) -> u32 {
        ((1u32 << 31) / self.slots()).max(1)
    }

    fn thread_of(&self, conn: u32) -> usize {
        ((conn % self.slots()) / self.conns_per_thread) as usize
    }
}

/// One poll thread's end of the [`Mesh`].
#[derive(Debug)]
pub struct Port {
    shared: Arc<Shared>,
    me: usize,
    bell: UnixStream,
}

impl Port {
    /// This thread's index.
    pub(crate) fn me(&self) -> usize {
        self.me
    }

    /// Number of threads.
    pub(crate) fn threads(&self) -> usize {
        self.shared.threads
    }

    /// The first global connection id of this thread.
    pub(crate) fn conn_base(&self) -> u32 {
        (self.me as u32).saturating_mul(self.shared.conns_per_thread)
    }

    /// The thread owning global connection id `conn`.
    pub(crate) fn thread_of(&self, conn: u32) -> usize {
        self.shared.thread_of(conn)
    }

    /// Counts one more connection (`up`) or one fewer on thread `t`'s load.
    pub(crate) fn load(&self, t: usize, up: bool) {
        if let Some(l) = self.shared.loads.get(t) {
            // Relaxed: a load is a hint for placing connections, read by no one for ordering.
            if up {
                l.fetch_add(1, Ordering::Relaxed);
            } else {
                let _ = l.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            }
        }
    }

    /// The thread a new accepted connection should live on: the one with the fewest
    /// connections (this one on a tie, so that a request moves only for a real difference);
    /// `None` when every thread is full.
    pub(crate) fn least_loaded(&self) -> Option<usize> {
        let room = self.shared.conns_per_thread;
        let load = |t: usize| self.shared.loads[t].load(Ordering::Relaxed);
        let mut best = (load(self.me) < room).then_some(self.me);
        for t in 0..self.shared.threads {
            let n = load(t);
            if n < room && best.is_none_or(|b| n < load(b)) {
                best = Some(t);
            }
        }
        best
    }

    /// Every thread's load (for the log).
    pub(crate) fn loads(&self) -> Vec<u32> {
        self.shared
            .loads
            .iter()
            .map(|l| l.load(Ordering::Relaxed))
            .collect()
    }

    /// Connections each thread of the mesh has room for.
    pub(crate) fn conns_per_thread(&self) -> u32 {
        self.shared.conns_per_thread
    }

    /// This thread's slot that global connection id `conn` names (the id may be one of the
    /// slot's earlier connections: compare it with the slot's own).
    pub(crate) fn slot_of(&self, conn: u32) -> Option<usize> {
        let i = (conn % self.shared.slots()).checked_sub(self.conn_base())?;
        (i < self.shared.conns_per_thread).then_some(i as usize)
    }

    /// The id of the next connection in the slot whose last connection was `conn`.
    pub(crate) fn next_conn_id(&self, conn: u32) -> u32 {
        let slots = self.shared.slots();
        let k = (conn / slots + 1) % self.shared.generations();
        conn % slots + k * slots
    }

    /// Global connection ids in all (every id is below it).
    pub(crate) fn conn_ids(&self) -> u32 {
        self.shared
            .slots()
            .saturating_mul(self.shared.generations())
    }

    /// A writer of this thread's doorbell (for the control thread's [`super::PollHandle`]).
    pub(crate) fn doorbell(&self) -> std::io::Result<UnixStream> {
        match self.shared.bells.get(self.me) {
            Some(b) => b.try_clone(),
            None => Err(std::io::ErrorKind::NotFound.into()),
        }
    }

    /// The doorbell this thread drains and parks on.
    pub(crate) fn bell(&self) -> &UnixStream {
        &self.bell
    }

    /// Queues `hop` for thread `to` (not this one); gives it back when that queue is full.
    // Giving the hop back by value is `ArrayQueue::push`'s own contract; boxing it would
    // allocate on the hot path.
    #[allow(clippy::result_large_err)]
    pub(crate) fn push(&self, to: usize, hop: Hop) -> Result<(), Hop> {
        let Some(q) = self.shared.queues.get(self.me * self.shared.threads + to) else {
            return Err(hop);
        };
        q.push(hop)?;
        // SYNC POINT: SeqCst fence between the push and the load of `parked`; pairs with the
        // fence in `park` between its store of `parked` and its look at the queues.
        fence(Ordering::SeqCst);
        if self
            .shared
            .parked
            .get(to)
            .is_some_and(|p| p.load(Ordering::Relaxed))
        {
            if let Some(b) = self.shared.bells.get(to) {
                let _ = (&*b).write(&[1]);
            }
        }
        Ok(())
    }

    /// The next hop queued for this thread by thread `from`.
    pub(crate) fn pop(&self, from: usize) -> Option<Hop> {
        self.shared
            .queues
            .get(from * self.shared.threads + self.me)?
            .pop()
    }

    /// Marks this thread parked (senders then ring its doorbell); false if a hop is already
    /// waiting, in which case the thread must not park.
    pub(crate) fn park(&self) -> bool {
        let Some(p) = self.shared.parked.get(self.me) else {
            return false;
        };
        p.store(true, Ordering::Relaxed);
        // SYNC POINT: see `push`.
        fence(Ordering::SeqCst);
        let waiting = (0..self.shared.threads).any(|from| {
            from != self.me
                && self
                    .shared
                    .queues
                    .get(from * self.shared.threads + self.me)
                    .is_some_and(|q| !q.is_empty())
        });
        if waiting {
            p.store(false, Ordering::Relaxed);
        }
        !waiting
    }

    /// Clears the park mark.
    pub(crate) fn unpark(&self) {
        if let Some(p) = self.shared.parked.get(self.me) {
            p.store(false, Ordering::Relaxed);
        }
    }

    /// The connection currently reaching configured peer `peer`, if up.
    pub(crate) fn route(&self, peer: u32) -> Option<u32> {
        let r = self.shared.routes.get(peer as usize)?;
        r.load(Ordering::Acquire).checked_sub(1)
    }

    /// Records that connection `conn` reaches `peer` (`Some`), or no longer does (`None`:
    /// cleared only if it still names `conn`).
    pub(crate) fn set_route(&self, peer: u32, conn: u32, up: bool) {
        let Some(r) = self.shared.routes.get(peer as usize) else {
            return;
        };
        let v = conn.saturating_add(1);
        if up {
            r.store(v, Ordering::Release);
        } else {
            let _ = r.compare_exchange(v, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hops_go_from_one_thread_to_the_other_in_order() {
        let mut mesh = Mesh::new(2, 8, 1, 16).unwrap();
        let (a, b) = (mesh.port(0).unwrap(), mesh.port(1).unwrap());
        assert!(mesh.port(0).is_none(), "a port is handed out once");
        for tag in 0..3 {
            a.push(1, Hop::Aborted { tag }).unwrap();
        }
        assert!(a.pop(1).is_none() && b.pop(1).is_none());
        for want in 0..3 {
            assert!(matches!(b.pop(0), Some(Hop::Aborted { tag }) if tag == want));
        }
        assert!(b.pop(0).is_none());
    }

    #[test]
    fn a_parked_thread_is_rung_and_a_waiting_hop_prevents_parking() {
        use std::io::Read;
        let mut mesh = Mesh::new(2, 8, 1, 16).unwrap();
        let (a, b) = (mesh.port(0).unwrap(), mesh.port(1).unwrap());
        assert!(b.park());
        a.push(1, Hop::Aborted { tag: 7 }).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(b.bell().read(&mut buf).unwrap(), 1, "the sender rang");
        b.unpark();
        assert!(!b.park(), "a queued hop keeps the thread awake");
    }

    /// A hop is moved into a queue and out again, whatever its kind: it must stay small
    /// enough to move without a `memcpy` call (the large payloads travel boxed).
    #[test]
    fn a_hop_is_small() {
        assert!(
            std::mem::size_of::<Hop>() <= 128,
            "{}",
            std::mem::size_of::<Hop>()
        );
    }

    /// Boxes are reused: taking and keeping them allocates nothing new, and a box given back
    /// to another thread leaves this one's spares.
    #[test]
    fn spare_boxes_are_reused_and_bounded() {
        let mut sp = Spares::new();
        let a = sp.boxed(&1u64);
        let b = sp.boxed(&2);
        let (pa, pb) = (&*a as *const u64, &*b as *const u64);
        let batch = Spares::<u64>::BATCH;
        assert_eq!(
            (sp.len(), *a, *b),
            (batch - 2, 1, 2),
            "an empty stack makes a batch"
        );
        sp.keep(a);
        sp.keep(b);
        let again = sp.boxed(&4);
        assert!(std::ptr::eq(&*again, pb), "the last kept box serves next");
        assert_eq!(*again, 4);
        assert!(sp.give().is_some_and(|g| std::ptr::eq(&*g, pa)));
        for _ in 2..batch {
            assert!(sp.give().is_some());
        }
        assert!(sp.give().is_none());
        let mut full = Spares::new();
        for k in 0..Spares::<u8>::MAX + 5 {
            full.keep(Box::new(k as u8));
        }
        assert_eq!(full.len(), Spares::<u8>::MAX, "kept boxes are bounded");
    }

    #[test]
    fn routes_name_the_connection_of_a_peer_until_it_goes_down() {
        let mut mesh = Mesh::new(2, 100, 2, 16).unwrap();
        let (a, b) = (mesh.port(0).unwrap(), mesh.port(1).unwrap());
        assert_eq!(a.route(0), None);
        b.set_route(0, 103, true);
        assert_eq!(a.route(0), Some(103));
        assert_eq!(a.thread_of(103), 1);
        assert_eq!(b.conn_base(), 100);
        a.set_route(0, 5, false);
        assert_eq!(a.route(0), Some(103), "a stale clear leaves a newer route");
        b.set_route(0, 103, false);
        assert_eq!(a.route(0), None);
        assert_eq!(a.route(9), None, "unknown peer");
    }

    /// A slot's successive connections get ids of their own, which still name the slot's
    /// thread and slot, and come round only after as many as fit below 2^31.
    #[test]
    fn a_slot_s_next_connection_gets_an_id_of_its_own() {
        let mut mesh = Mesh::new(2, 100, 0, 16).unwrap();
        let (a, b) = (mesh.port(0).unwrap(), mesh.port(1).unwrap());
        let first = b.conn_base() + 7;
        let second = b.next_conn_id(first);
        assert_eq!(second, 307, "one slot per thread and connection further on");
        for id in [first, second] {
            assert_eq!((mesh.thread_of(id), a.thread_of(id)), (1, 1));
            assert_eq!((b.slot_of(id), a.slot_of(id)), (Some(7), None));
        }
        assert_eq!(b.conn_ids(), 200 * ((1 << 31) / 200));
        let last = b.conn_ids() - 200 + first;
        assert!(last < 1 << 31);
        assert_eq!(b.next_conn_id(last), first, "ids come round");
        let mut id = first;
        let seen: std::collections::HashSet<u32> = (0..1000)
            .map(|_| {
                id = b.next_conn_id(id);
                id
            })
            .collect();
        assert_eq!(seen.len(), 1000);
    }
}
