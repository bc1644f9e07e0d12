//! Byte-stream transports under the soft provider: nonblocking TCP, and an in-memory fabric
//! whose endpoints live in one process and are driven by one thread.

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
    /// Whether a nonblocking connect has finished (`Err` if it failed).
    fn connected(&mut self) -> io::Result<bool>;
    /// Close both directions.
    fn shutdown(&mut self);
    /// The path's maximum segment size, if the transport has one.
    fn mss(&self) -> Option<usize>;
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
    /// A descriptor that becomes readable when any listener or link may have work.
    fn event_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
    /// Consume the readiness behind [`Transport::event_fd`]; true if there was any (the caller
    /// then polls everything, and must read every link: the readiness it consumed is gone).
    fn clear_events(&mut self) -> bool {
        false
    }
}

/// TCP through nonblocking `mio` sockets. The provider busy-polls them; they are also
/// registered (edge-triggered) with one `mio::Poll` whose epoll descriptor is the provider's
/// [`event_fd`](crate::Provider::event_fd).
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
        self.poll.registry().register(
            s,
            mio::Token(0),
            mio::Interest::READABLE | mio::Interest::WRITABLE,
        )
    }
}

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
    fn event_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsRawFd;
        // SAFETY: the epoll descriptor is owned by `self.poll` and stays open for as long as
        // `self` is borrowed (mio's `Poll` offers `AsRawFd` only).
        Some(unsafe { std::os::fd::BorrowedFd::borrow_raw(self.poll.as_raw_fd()) })
    }
    fn clear_events(&mut self) -> bool {
        // Edge-triggered: fetching the events empties the ready list, so the descriptor
        // stops being readable until something new happens.
        let mut any = false;
        while self
            .poll
            .poll(&mut self.events, Some(std::time::Duration::ZERO))
            .is_ok()
            && !self.events.is_empty()
        {
            any = true;
        }
        any
    }
}

/// One direction of an in-memory stream.
#[derive(Debug, Default)]
struct Pipe {
    buf: Vec<u8>,
    off: usize,
    closed: bool,
}

/// Bytes a pipe holds before writes see back-pressure.
const PIPE_LIMIT: usize = 4 << 20;

/// An in-memory fabric: listeners keyed by address, streams as pairs of byte pipes.
///
/// Single-threaded by design (`Rc`): every provider built on one fabric must be driven by the
/// same thread, which polls both ends of each connection in turn. Deterministic: no sockets,
/// no timing.
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
        Ok(n)
    }
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut p = self.tx.borrow_mut();
        if p.closed {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let room = PIPE_LIMIT.saturating_sub(p.buf.len() - p.off);
        if room == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        if p.off > 0 && p.off == p.buf.len() {
            p.buf.clear();
            p.off = 0;
        }
        let n = room.min(buf.len());
        p.buf.extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn connected(&mut self) -> io::Result<bool> {
        Ok(true)
    }
    fn shutdown(&mut self) {
        self.tx.borrow_mut().closed = true;
        self.rx.borrow_mut().closed = true;
    }
    fn mss(&self) -> Option<usize> {
        None
    }
}

impl Transport for MemFabric {
    type Link = MemLink;
    type Listener = MemListener;
    fn listen(&mut self, mut addr: SocketAddr) -> io::Result<MemListener> {
        let mut f = self.0.borrow_mut();
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
            fabric: self.clone(),
        })
    }
    fn local_addr(&self, l: &MemListener) -> io::Result<SocketAddr> {
        Ok(l.addr)
    }
    fn accept(&mut self, l: &mut MemListener) -> io::Result<Option<MemLink>> {
        Ok(self
            .0
            .borrow_mut()
            .listeners
            .get_mut(&l.addr)
            .and_then(|q| q.pop_front()))
    }
    fn connect(&mut self, addr: SocketAddr) -> io::Result<MemLink> {
        let mut f = self.0.borrow_mut();
        let q = f
            .listeners
            .get_mut(&addr)
            .ok_or(io::Error::from_raw_os_error(libc::ECONNREFUSED))?;
        let a = Rc::new(RefCell::new(Pipe::default()));
        let b = Rc::new(RefCell::new(Pipe::default()));
        q.push_back(MemLink {
            rx: a.clone(),
            tx: b.clone(),
        });
        Ok(MemLink { rx: b, tx: a })
    }
}
