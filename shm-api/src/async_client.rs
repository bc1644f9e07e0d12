//! [`AsyncClient`]: a [`Client`] whose waits park the calling task instead of the thread, for
//! tokio applications (feature `tokio`).
//!
//! It is the event-loop handshake of `ABI.md` ("Event loops") done for tokio: before it sleeps
//! it drains what has finished and arms the client's descriptor ([`Client::arm`]), then awaits
//! the descriptor's readiness through [`AsyncFd`]. After every wake-up it drains and looks
//! again before it sleeps once more, so a wake-up it consumed early or a spurious one costs a
//! loop, never a lost completion. One task drives the client: calls are built and submitted
//! through [`AsyncClient::client`], and as many as the rings allow may be in flight while it
//! awaits one of them.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::client::{Client, Error, Finished, Reply, Ticket};

/// A [`Client`] for tokio: see the module docs.
#[derive(Debug)]
pub struct AsyncClient {
    fd: AsyncFd<Watched>,
    sleeps: u64,
}

/// The client as tokio's reactor watches it: by its attach socket.
#[derive(Debug)]
struct Watched(Client);

impl AsRawFd for Watched {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

impl AsyncClient {
    /// Wraps `client`. Must be called from within a tokio runtime with I/O enabled.
    pub fn new(client: Client) -> io::Result<AsyncClient> {
        // SAFETY: `Watched` owns the client, and with it the attach socket whose descriptor
        // it reports: the socket is opened with the client, never replaced, and closed only
        // when the client drops, after the `AsyncFd` (or once `into_inner` has taken it out).
        let fd = unsafe { AsyncFd::register_with_interest(Watched(client), Interest::READABLE) }?;
        Ok(AsyncClient { fd, sleeps: 0 })
    }

    /// The client, to build and submit calls ([`Client::call`]) or poll without waiting.
    pub fn client(&mut self) -> &mut Client {
        &mut self.fd.get_mut().0
    }

    /// The client back, for blocking use.
    pub fn into_inner(self) -> Client {
        self.fd.into_inner().0
    }

    /// How many times a wait armed the descriptor and parked its task on it.
    pub fn sleeps(&self) -> u64 {
        self.sleeps
    }

    /// Waits for call `t` to finish. Bound it with `tokio::time::timeout` if it may never
    /// come: the call then stays in flight, and a later wait can still take it.
    pub async fn wait(&mut self, t: Ticket) -> Result<Reply, Error> {
        loop {
            if let Some(r) = self.client().try_take(t)? {
                return r;
            }
            self.sleep().await?;
        }
    }

    /// Waits for any call to finish; calls come in the order they finished.
    pub async fn wait_any(&mut self) -> Result<Finished, Error> {
        loop {
            if let Some(f) = self.client().poll()? {
                return Ok(f);
            }
            self.sleep().await?;
        }
    }

    /// Parks the task until the daemon may have finished a call (or went away): returns at
    /// once if one finished after the caller last looked.
    async fn sleep(&mut self) -> Result<(), Error> {
        if !self.client().arm()? {
            return Ok(());
        }
        self.sleeps += 1;
        let mut ready = self.fd.readable_mut().await?;
        // The next look drains the descriptor; readiness is cleared before it, so a wake-up
        // that comes after that look is a new edge.
        ready.clear_ready();
        Ok(())
    }
}
