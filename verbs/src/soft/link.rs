//! Byte-stream transports under the soft provider: nonblocking TCP, and an in-memory fabric
//! whose endpoints live in one process and are driven by one thread.

use std::any::Any;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::rc::Rc;

/// A connected, nonblocking byte stream.
pub trait Link {
    /// Read what is available: `Ok(0)` is end of stream, `WouldBlock` means nothing yet.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Write what fits: `WouldBlock` means nothing fitted.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize>;
    /// Take every byte of `buf` at once without copying them, if the link can (true: they
    /// are written and `buf` is left empty, with an allocation of the link's); otherwise take
    /// nothing (false), and [`Link::write`] is the way. None can by default.
    fn take_all(&mut self, buf: &mut Vec<u8>) -> bool {
        let _ = buf;
        false
    }
    /// Whether a nonblocking connect has finished (`Err` if it failed).
    fn connected(&mut self) -> io::Result<bool>;
    /// Close both directions.
    fn shutdown(&mut self);
    /// The path's maximum segment size, if the transport has one.
    fn mss(&self) -> Option<usize>;
    /// The other end's address, if the transport has one.
    fn peer_addr(&self) -> Option<SocketAddr>;
}

/// A way to listen for and make [`Link`]s.
pub trait Transport {
    /// A connected stream.
    type Link: Link;
    /// A listening endpoint.
    type Listener;
    /// Listen on `addr`.
    fn listen(&mut self, addr: SocketAddr) -> io::Result<Self::Listener>;
    /// The address a listener is bound to.
    fn local_addr(&self, l: &Self::Listener) -> io::Result<SocketAddr>;
    /// Take one pending connection, if any.
    fn accept(&mut self, l: &mut Self::Listener) -> io::Result<Option<Self::Link>>;
    /// Start connecting to `addr` (finishes later; see [`Link::connected`]).
    fn connect(&mut self, addr: SocketAddr) -> io::Result<Self::Link>;
    /// Give `link` the readiness token `token` (the owner's name for it, e.g. a queue pair's
    /// index). From then on [`Transport::take_ready`] reports `token` whenever the link may
    /// have become readable or writable: edge-triggered, so the owner reads until a read comes
    /// back short or `WouldBlock`, and writes until one is refused, before it waits again.
    fn attach(&mut self, link: &mut Self::Link, token: usize) -> io::Result<()>;
    /// Call `ready` with the token of each attached link that may have become readable or
    /// writable since the last call (a token may come more than once, or for a link that
    /// turns out to have nothing; a link that has closed reports its token too). True if a
    /// listener or a link not attached yet had news too (the owner's connection management
    /// has work: the news was taken here and will not be reported again).
    fn take_ready(&mut self, ready: impl FnMut(usize)) -> bool;
    /// Stops watching `link`, not attached yet, so that another transport of the same kind may
    /// [`adopt`](Transport::adopt) it; gives it back where links cannot move (the in-memory
    /// fabric's belong to the thread that drives it).
    fn detach(&mut self, link: Self::Link) -> Result<Box<dyn Any + Send>, Self::Link> {
        Err(link)
    }
    /// Watches a link another transport of the same kind [detached](Transport::detach), as
    /// not attached yet.
    fn adopt(&mut self, link: Box<dyn Any + Send>) -> io::Result<Self::Link> {
        drop(link);
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Whether [`Transport::take_ready`] has tokens to report already (in-memory wakeups not
    /// taken yet): the owner must not sleep on [`Transport::event_fd`] then.
    fn has_ready(&self) -> bool {
        false
    }
    /// A descriptor that becomes readable when any listener or link may have work.
    fn event_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
}

/// TCP through nonblocking `mio` sockets, registered (edge-triggered) with one `mio::Poll`:
/// [`Transport::take_ready`] asks it (`epoll_wait` without waiting) which links have news, and
/// its epoll descriptor is the provider's [`event_fd`](crate::Provider::event_fd). Listeners
/// and links not attached yet share token 0 (the provider looks at all of those on every
/// connection-management poll); an attached link carries its token plus one.
#[derive(Debug)]
pub struct Tcp {
    poll: mio::Poll,
    events: mio::Events,
}

impl Tcp {
    /// A TCP transport with its readiness descriptor.
    pub fn new() -> io::Result<Tcp> {
        Ok(Tcp {
            poll: mio::Poll::new()?,
            events: mio::Events::with_capacity(64),
        })
    }

    fn watch(&self, s: &mut impl mio::event::Source) -> io::Result<()> {
        self.poll.registry().register(s, UNATTACHED, BOTH)
    }
}

/// The token of listeners and links no queue pair owns yet.
const UNATTACHED: mio::Token = mio::Token(0);
const BOTH: mio::Interest = mio::Interest::READABLE.add(mio::Interest::WRITABLE);

/// A TCP connection.
#[derive(Debug)]
pub struct TcpLink(mio::net::TcpStream);

impl Link for TcpLink {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.0.write(buf) {
            Err(e) if e.kind() == io::ErrorKind::NotConnected => {
                Err(io::ErrorKind::WouldBlock.into())
            }
            r => r,
        }
    }
    fn connected(&mut self) -> io::Result<bool> {
        if let Some(e) = self.0.take_error()? {
            return Err(e);
        }
        match self.0.peer_addr() {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(e),
        }
    }
    fn shutdown(&mut self) {
        let _ = self.0.shutdown(Shutdown::Both);
    }
    fn mss(&self) -> Option<usize> {
        use std::os::fd::AsRawFd;
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: the fd is a live socket owned by `self.0`; `v` and `len` are valid,
        // correctly sized out-parameters for TCP_MAXSEG (an int).
        let rc = unsafe {
            libc::getsockopt(
                self.0.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_MAXSEG,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        (rc == 0 && v > 0).then_some(v as usize)
    }
    fn peer_addr(&self) -> Option<SocketAddr> {
        self.0.peer_addr().ok()
    }
}

impl Transport for Tcp {
    type Link = TcpLink;
    type Listener = mio::net::TcpListener;
    fn listen(&mut self, addr: SocketAddr) -> io::Result<Self::Listener> {
        let mut l = mio::net::TcpListener::bind(addr)?;
        self.watch(&mut l)?;
        Ok(l)
    }
    fn local_addr(&self, l: &Self::Listener) -> io::Result<SocketAddr> {
        l.local_addr()
    }
    fn accept(&mut self, l: &mut Self::Listener) -> io::Result<Option<TcpLink>> {
        match l.accept() {
            Ok((mut s, _)) => {
                s.set_nodelay(true)?;
                self.watch(&mut s)?;
                Ok(Some(TcpLink(s)))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }
    fn connect(&mut self, addr: SocketAddr) -> io::Result<TcpLink> {
        let mut s = mio::net::TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        self.watch(&mut s)?;
        Ok(TcpLink(s))
    }
    fn detach(&mut self, mut link: TcpLink) -> Result<Box<dyn Any + Send>, TcpLink> {
        match self.poll.registry().deregister(&mut link.0) {
            Ok(()) => Ok(Box::new(link)),
            Err(_) => Err(link),
        }
    }
    fn adopt(&mut self, link: Box<dyn Any + Send>) -> io::Result<TcpLink> {
        let mut link = *link
            .downcast::<TcpLink>()
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        self.watch(&mut link.0)?;
        Ok(link)
    }
    fn attach(&mut self, link: &mut TcpLink, token: usize) -> io::Result<()> {
        // Re-registering also reports the link at once if it is ready now (epoll checks on
        // EPOLL_CTL_MOD), so bytes that came before the token are not left unannounced.
        let token = token.checked_add(1).ok_or(io::ErrorKind::InvalidInput)?;
        self.poll
            .registry()
            .reregister(&mut link.0, mio::Token(token), BOTH)
    }
    fn take_ready(&mut self, mut ready: impl FnMut(usize)) -> bool {
        // One `epoll_wait` without waiting; again only if the event list came back full.
        let mut unattached = false;
        loop {
            if self
                .poll
                .poll(&mut self.events, Some(std::time::Duration::ZERO))
                .is_err()
            {
                return unattached;
            }
            let mut n = 0;
            for e in self.events.iter() {
                n += 1;
                match e.token().0.checked_sub(1) {
                    Some(token) => ready(token),
                    None => unattached = true,
                }
            }
            if n < self.events.capacity() {
                return unattached;
            }
        }
    }
    fn event_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsRawFd;
        // SAFETY: the epoll descriptor is owned by `self.poll` and stays open for as long as
        // `self` is borrowed (mio's `Poll` offers `AsRawFd` only).
        Some(unsafe { std::os::fd::BorrowedFd::borrow_raw(self.poll.as_raw_fd()) })
    }
}

/// Where a pipe's reader or writer wants to hear that the pipe has news: its provider's ready
/// list, and its token there.
#[derive(Debug, Clone)]
struct Waker {
    list: ReadyList,
    token: usize,
}

impl Waker {
    fn wake(&self) {
        self.list.borrow_mut().push(self.token);
    }
}

/// The tokens a [`MemPort`] has to report (shared with the pipes of its attached links).
type ReadyList = Rc<RefCell<Vec<usize>>>;

/// One direction of an in-memory stream.
#[derive(Debug, Default)]
struct Pipe {
    /// Bytes written, of which the first `off` have been read (emptied when all are). A
    /// write that would not fit the allocation first moves the unread bytes (at most
    /// [`PIPE_LIMIT`]) to the front, so a pipe that is never empty when read does not grow
    /// without end, and a busy one stops allocating once it has reached its high-water mark.
    buf: Vec<u8>,
    off: usize,
    closed: bool,
    /// The reading end's waker, once attached, and whether it has been woken since its last
    /// read (so a burst of writes wakes it once).
    reader: Option<Waker>,
    reader_woken: bool,
    /// The writing end's waker, once attached, and whether a write found the pipe full.
    writer: Option<Waker>,
    writer_waiting: bool,
}

impl Pipe {
    /// An empty pipe with [`PIPE_RESERVE`] bytes reserved: a busy link does not allocate
    /// while what it holds unread stays under that.
    fn new() -> Pipe {
        Pipe {
            buf: Vec::with_capacity(PIPE_RESERVE),
            ..Pipe::default()
        }
    }

    fn wake_reader(&mut self) {
        if let Some(w) = self.reader.as_ref().filter(|_| !self.reader_woken) {
            w.wake();
            self.reader_woken = true;
        }
    }
}

/// Bytes a pipe holds before writes see back-pressure.
const PIPE_LIMIT: usize = 4 << 20;

/// Bytes a pipe reserves when its link is made (address space: the system maps the pages as
/// they are first written, and the unread bytes stay at the front, so a link that never holds
/// much costs little memory). Beyond it the pipe grows, up to [`PIPE_LIMIT`].
const PIPE_RESERVE: usize = 1 << 20;

/// An in-memory fabric: listeners keyed by address, streams as pairs of byte pipes.
///
/// Single-threaded by design (`Rc`): every provider built on one fabric must be driven by the
/// same thread, which polls both ends of each connection in turn. Deterministic: no sockets,
/// no timing. Each provider reaches the fabric through a [`MemPort`] of its own.
#[derive(Debug, Default, Clone)]
pub struct MemFabric(Rc<RefCell<FabricInner>>);

#[derive(Debug, Default)]
struct FabricInner {
    listeners: HashMap<SocketAddr, VecDeque<MemLink>>,
    next_port: u16,
}

impl MemFabric {
    /// A new, empty fabric.
    pub fn new() -> MemFabric {
        MemFabric::default()
    }

    /// A transport on this fabric with a ready list of its own: one per provider (two
    /// providers sharing a port would take each other's wakeups).
    pub fn port(&self) -> MemPort {
        MemPort {
            fabric: self.clone(),
            ready: ReadyList::default(),
        }
    }
}

/// A provider's way onto a [`MemFabric`]: it listens and connects there, and its attached
/// links' pipes tell it, through its ready list, when they have news.
#[derive(Debug)]
pub struct MemPort {
    fabric: MemFabric,
    ready: ReadyList,
}

/// An in-memory listener (its address on the fabric).
#[derive(Debug)]
pub struct MemListener {
    addr: SocketAddr,
    fabric: MemFabric,
}

impl Drop for MemListener {
    fn drop(&mut self) {
        self.fabric.0.borrow_mut().listeners.remove(&self.addr);
    }
}

/// One end of an in-memory stream.
#[derive(Debug)]
pub struct MemLink {
    rx: Rc<RefCell<Pipe>>,
    tx: Rc<RefCell<Pipe>>,
}

impl Link for MemLink {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut p = self.rx.borrow_mut();
        // Whatever is written from now on is news for this reader.
        p.reader_woken = false;
        let avail = p.buf.len() - p.off;
        if avail == 0 {
            return if p.closed {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        let n = avail.min(buf.len());
        let off = p.off;
        buf[..n].copy_from_slice(&p.buf[off..off + n]);
        p.off += n;
        if p.off == p.buf.len() {
            p.buf.clear();
            p.off = 0;
        }
        if std::mem::take(&mut p.writer_waiting) {
            if let Some(w) = &p.writer {
                w.wake();
            }
        }
        Ok(n)
    }
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut p = self.tx.borrow_mut();
        if p.closed {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let room = PIPE_LIMIT.saturating_sub(p.buf.len() - p.off);
        if room == 0 {
            p.writer_waiting = true;
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = room.min(buf.len());
        // (A read that takes the last byte empties the buffer, so `off` > 0 means unread
        // bytes behind the read ones.)
        if p.off > 0 && p.buf.len() + n > p.buf.capacity() {
            let off = p.off;
            p.buf.drain(..off);
            p.off = 0;
        }
        p.buf.extend_from_slice(&buf[..n]);
        if n > 0 {
            p.wake_reader();
        }
        Ok(n)
    }
    /// A pipe that holds nothing unread takes the writer's buffer as it is, and gives the
    /// writer its own (empty) allocation in exchange: the bytes are not copied. (The two
    /// allocations go back and forth, each no larger than what it has held, so a busy link
    /// still stops allocating at its high-water mark.)
    fn take_all(&mut self, buf: &mut Vec<u8>) -> bool {
        let mut p = self.tx.borrow_mut();
        if p.closed || !p.buf.is_empty() || buf.len() > PIPE_LIMIT {
            return false;
        }
        std::mem::swap(&mut p.buf, buf);
        p.off = 0;
        if !p.buf.is_empty() {
            p.wake_reader();
        }
        true
    }
    fn connected(&mut self) -> io::Result<bool> {
        Ok(true)
    }
    fn shutdown(&mut self) {
        // The other end is woken to read the end of the stream (its writes fail from now on;
        // its reader and writer share one token).
        let mut tx = self.tx.borrow_mut();
        tx.closed = true;
        tx.wake_reader();
        self.rx.borrow_mut().closed = true;
    }
    fn mss(&self) -> Option<usize> {
        None
    }
    /// A memory link's ends have no addresses (only listeners do).
    fn peer_addr(&self) -> Option<SocketAddr> {
        None
    }
}

impl Transport for MemPort {
    type Link = MemLink;
    type Listener = MemListener;
    fn listen(&mut self, mut addr: SocketAddr) -> io::Result<MemListener> {
        let mut f = self.fabric.0.borrow_mut();
        if addr.port() == 0 {
            loop {
                f.next_port = f.next_port.wrapping_add(1).max(1024);
                addr.set_port(f.next_port);
                if !f.listeners.contains_key(&addr) {
                    break;
                }
            }
        }
        if f.listeners.contains_key(&addr) {
            return Err(io::ErrorKind::AddrInUse.into());
        }
        f.listeners.insert(addr, VecDeque::new());
        Ok(MemListener {
            addr,
            fabric: self.fabric.clone(),
        })
    }
    fn local_addr(&self, l: &MemListener) -> io::Result<SocketAddr> {
        Ok(l.addr)
    }
    fn accept(&mut self, l: &mut MemListener) -> io::Result<Option<MemLink>> {
        Ok(self
            .fabric
            .0
            .borrow_mut()
            .listeners
            .get_mut(&l.addr)
            .and_then(|q| q.pop_front()))
    }
    fn connect(&mut self, addr: SocketAddr) -> io::Result<MemLink> {
        let mut f = self.fabric.0.borrow_mut();
        let q = f
            .listeners
            .get_mut(&addr)
            .ok_or(io::Error::from_raw_os_error(libc::ECONNREFUSED))?;
        let a = Rc::new(RefCell::new(Pipe::new()));
        let b = Rc::new(RefCell::new(Pipe::new()));
        q.push_back(MemLink {
            rx: a.clone(),
            tx: b.clone(),
        });
        Ok(MemLink { rx: b, tx: a })
    }
    fn attach(&mut self, link: &mut MemLink, token: usize) -> io::Result<()> {
        let w = Waker {
            list: self.ready.clone(),
            token,
        };
        // Each attached link wakes this port at most twice before the port takes its tokens
        // (as reader once per read, as writer once per refused write), and each holds two
        // clones of the list: room for as many tokens as there are clones means waking never
        // allocates.
        let room = Rc::strong_count(&self.ready) + 2;
        let mut list = self.ready.borrow_mut();
        let len = list.len();
        list.reserve(room.saturating_sub(len));
        drop(list);
        let mut rx = link.rx.borrow_mut();
        rx.reader = Some(w.clone());
        rx.reader_woken = false;
        link.tx.borrow_mut().writer = Some(w);
        Ok(())
    }
    fn take_ready(&mut self, mut ready: impl FnMut(usize)) -> bool {
        let mut list = self.ready.borrow_mut();
        // Most polls of a busy pair find no news: skip building and dropping a drain.
        if list.is_empty() {
            return false;
        }
        for token in list.drain(..) {
            ready(token);
        }
        // Listeners and pending links in memory announce nothing: connection management looks
        // at them on every poll of it.
        false
    }
    fn has_ready(&self) -> bool {
        !self.ready.borrow().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipe that always holds a byte or so when it is read (a busy link: the writer keeps
    /// ahead of the reader) keeps a small allocation: the unread bytes move to the front
    /// instead of the buffer growing with everything ever written.
    #[test]
    fn a_pipe_never_empty_when_read_stays_small() {
        let pipe = Rc::new(RefCell::new(Pipe::default()));
        let mut link = MemLink {
            rx: pipe.clone(),
            tx: pipe.clone(),
        };
        let (chunk, mut out) = ([7u8; 1000], [0u8; 1000]);
        assert_eq!(link.write(&[1]).expect("write"), 1);
        for _ in 0..20_000 {
            assert_eq!(link.write(&chunk).expect("write"), chunk.len());
            assert_eq!(link.read(&mut out).expect("read"), out.len());
        }
        let p = pipe.borrow();
        assert_eq!(p.buf.len() - p.off, 1, "one byte unread");
        assert!(
            p.buf.capacity() <= 4096,
            "20 MB went through a pipe of {} bytes",
            p.buf.capacity()
        );
    }

    /// A pipe takes a writer's whole buffer only when it holds nothing unread (bytes written
    /// before stay first), and not once it is closed; the bytes read are the bytes written.
    #[test]
    fn a_pipe_takes_a_whole_buffer_only_when_empty() {
        let pipe = Rc::new(RefCell::new(Pipe::new()));
        let mut link = MemLink {
            rx: pipe.clone(),
            tx: pipe.clone(),
        };
        let mut out = [0u8; 16];
        let mut buf = vec![1, 2, 3];
        assert!(link.take_all(&mut buf));
        assert!(buf.is_empty());
        assert!(
            buf.capacity() >= PIPE_RESERVE,
            "the pipe's allocation in exchange"
        );
        buf.extend_from_slice(&[4, 5]);
        assert!(!link.take_all(&mut buf), "three bytes unread");
        assert_eq!(buf, [4, 5]);
        assert_eq!(link.write(&buf).expect("write"), 2);
        assert_eq!(link.read(&mut out).expect("read"), 5);
        assert_eq!(out[..5], [1, 2, 3, 4, 5]);
        pipe.borrow_mut().closed = true;
        let mut buf = vec![6];
        assert!(!link.take_all(&mut buf), "closed");
        assert_eq!(buf, [6]);
    }
}
