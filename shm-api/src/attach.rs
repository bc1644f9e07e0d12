//! The attach handshake over a Unix stream socket, and the socket's later use for wake-ups.
//!
//! Message (daemon → app, once): 16 bytes = [`crate::abi::MAGIC`] (u64 LE) + region size (u64 LE), with
//! SCM_RIGHTS `[memfd]`. Afterwards either side may send single bytes as wake-ups (only when the other
//! side's waiting flag is set); both send and drain them with `MSG_DONTWAIT`, so no file-status flag an app
//! could change on a shared file description (as it could on a passed eventfd) can make the daemon block.
//! The socket stays open for the app's lifetime; its closing tells the daemon the app is gone.

use crate::abi::{Geometry, Layout, MAGIC};
use crate::region::{PeerInfo, Region};
use rustix::event::{PollFd, PollFlags};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

/// Daemon side: the listening socket and the region geometry handed to each new app.
#[derive(Debug)]
pub struct Listener {
    sock: UnixListener,
    layout: Layout,
    peers: Vec<PeerInfo>,
    next_app_id: u32,
}

/// An accepted app: its region and its socket; hand it to the owning poll thread's
/// [`crate::daemon::AppTable::attach`].
#[derive(Debug)]
pub struct Attachment {
    pub(crate) region: Region,
    pub(crate) sock: UnixStream,
    pub(crate) pid: Option<i32>,
    /// The app's uid and gid (SO_PEERCRED), when the kernel reported them.
    pub(crate) ids: Option<(u32, u32)>,
    pub(crate) app_id: u32,
}

impl Attachment {
    /// The app's pid (SO_PEERCRED), when the kernel reported one.
    pub fn pid(&self) -> Option<i32> {
        self.pid
    }

    /// The daemon's id for the app.
    pub fn app_id(&self) -> u32 {
        self.app_id
    }

    /// The shared region (base and length for RDMA registration).
    pub fn region(&self) -> &Region {
        &self.region
    }
}

impl Listener {
    /// Binds `path` (removing a stale socket file first); each app gets a region of `geometry`
    /// whose peer table is `peers`.
    pub fn bind(path: &Path, geometry: Geometry, peers: Vec<PeerInfo>) -> io::Result<Listener> {
        let _ = std::fs::remove_file(path);
        let sock = UnixListener::bind(path)?;
        sock.set_nonblocking(true)?;
        let g = Geometry {
            peers: u32::try_from(peers.len()).unwrap_or(u32::MAX),
            ..geometry
        };
        let layout = Layout::new(g)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "bad region geometry"))?;
        Ok(Listener {
            sock,
            layout,
            peers,
            next_app_id: 1,
        })
    }

    /// The listening socket (to poll it for readiness).
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Accepts one pending app, creates its region and sends it; `Ok(None)` when nobody is waiting.
    pub fn accept(&mut self) -> io::Result<Option<Attachment>> {
        let (sock, _) = match self.sock.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(e),
        };
        let cred = rustix::net::sockopt::socket_peercred(&sock).ok();
        let pid = cred.as_ref().map(|c| c.pid.as_raw_nonzero().get());
        let ids = cred.as_ref().map(|c| (c.uid.as_raw(), c.gid.as_raw()));
        let app_id = self.next_app_id;
        self.next_app_id = self.next_app_id.wrapping_add(1);
        let region = Region::create(self.layout, app_id, &self.peers)?;
        let mut msg = [0u8; 16];
        msg[..8].copy_from_slice(&MAGIC.to_le_bytes());
        msg[8..].copy_from_slice(&self.layout.region_size.to_le_bytes());
        let fds = [region.fd()];
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        control.push(SendAncillaryMessage::ScmRights(&fds));
        let n = rustix::net::sendmsg(
            &sock,
            &[IoSlice::new(&msg)],
            &mut control,
            SendFlags::NOSIGNAL,
        )?;
        if n != msg.len() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short handshake"));
        }
        sock.set_nonblocking(true)?;
        Ok(Some(Attachment {
            region,
            sock,
            pid,
            ids,
            app_id,
        }))
    }
}

/// App side of an attachment: the mapped region and the socket (kept open while attached; carries wake-ups).
///
/// [`crate::Client`] and [`crate::Server`] wrap this; it is public for tools that speak the ring protocol
/// themselves (benchmarks, the hostile-app test).
#[derive(Debug)]
pub struct AppConn {
    /// The mapped region.
    pub region: Region,
    /// The attach socket: readable when the daemon wakes this app; closing it detaches.
    pub sock: UnixStream,
}

/// Connects to the daemon at `path` and maps the region it sends.
pub fn connect(path: &Path) -> io::Result<AppConn> {
    let sock = UnixStream::connect(path)?;
    let mut msg = [0u8; 16];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let r = rustix::net::recvmsg(
        &sock,
        &mut [IoSliceMut::new(&mut msg)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC | RecvFlags::WAITALL,
    )?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = m {
            fds.extend(it);
        }
    }
    let bad = |w| io::Error::new(io::ErrorKind::InvalidData, w);
    if r.bytes != 16 || msg[..8] != MAGIC.to_le_bytes() {
        return Err(bad("not an rpcrdma-shm daemon"));
    }
    if fds.len() != 1 {
        return Err(bad("handshake without exactly one descriptor"));
    }
    let memfd = fds.pop().ok_or_else(|| bad("fd"))?;
    let region = Region::open(memfd)?;
    if (region.len() as u64).to_le_bytes() != msg[8..] {
        return Err(bad("region size differs from handshake"));
    }
    Ok(AppConn { region, sock })
}

/// Sends a one-byte wake-up without ever blocking (a full socket buffer already means "wake up").
pub(crate) fn wake(sock: BorrowedFd<'_>) {
    let _ = rustix::net::send(sock, &[1], SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
}

/// Discards pending wake-up bytes without blocking; false once the other side has closed the socket.
pub(crate) fn drain(sock: BorrowedFd<'_>) -> bool {
    let mut b = [0u8; 64];
    for _ in 0..16 {
        match rustix::net::recv(sock, &mut b, RecvFlags::DONTWAIT) {
            Ok((0, _)) => return false,
            Ok(_) => {}
            Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => return true,
            Err(_) => return false,
        }
    }
    true
}

/// Waits until `fd` is readable or `timeout` passes.
pub(crate) fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) {
    let mut p = [PollFd::new(&fd, PollFlags::IN)];
    // To the nanosecond (whole milliseconds made a 50 µs wait last 1 ms).
    let ts = rustix::event::Timespec {
        tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    let _ = rustix::event::poll(&mut p, Some(&ts));
}
