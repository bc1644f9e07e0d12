//! What [`AsyncClient`](crate::async_client::AsyncClient) and
//! [`AsyncServer`](crate::async_server::AsyncServer) share (feature `tokio`): an app end whose
//! waits park a tokio task on its attach socket.
//!
//! It is the event-loop handshake of `ABI.md` ("Event loops") done for tokio: before it sleeps
//! the caller has drained what has finished; [`Parked::sleep`] arms the descriptor (the app's
//! `arm`: if something finished meanwhile it does not sleep), then awaits the descriptor's
//! readiness through [`AsyncFd`] and clears it. The caller drains and looks again after every
//! wake-up before it sleeps once more, so a wake-up consumed early or a spurious one costs a
//! loop, never a lost completion.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::client::{Client, Error, Server};

/// An app end that can arm its descriptor ([`Client::arm`], [`Server::arm`]).
pub(crate) trait Arm: AsFd {
    /// `Ok(true)`: armed, sleep until the descriptor is readable; `Ok(false)`: something
    /// is waiting already.
    fn arm(&mut self) -> Result<bool, Error>;
}

impl Arm for Client {
    fn arm(&mut self) -> Result<bool, Error> {
        Client::arm(self)
    }
}

impl Arm for Server {
    fn arm(&mut self) -> Result<bool, Error> {
        Server::arm(self)
    }
}

/// `T` registered with tokio's reactor by its attach socket.
#[derive(Debug)]
pub(crate) struct Parked<T: Arm> {
    fd: AsyncFd<Watched<T>>,
    sleeps: u64,
}

/// The app end as the reactor watches it: by its attach socket.
#[derive(Debug)]
struct Watched<T>(T);

impl<T: AsFd> AsRawFd for Watched<T> {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

impl<T: Arm> Parked<T> {
    /// Registers `app`. Must be called from within a tokio runtime with I/O enabled.
    pub(crate) fn new(app: T) -> io::Result<Parked<T>> {
        // SAFETY: `Watched` owns the app end, and with it the attach socket whose descriptor
        // it reports: the socket is opened with the `Client` or `Server`, private to it, never
        // replaced, and closed only when it drops, after the `AsyncFd` (or once `into_inner`
        // has taken it out).
        let fd = unsafe { AsyncFd::register_with_interest(Watched(app), Interest::READABLE) }?;
        Ok(Parked { fd, sleeps: 0 })
    }

    pub(crate) fn get_mut(&mut self) -> &mut T {
        &mut self.fd.get_mut().0
    }

    pub(crate) fn into_inner(self) -> T {
        self.fd.into_inner().0
    }

    pub(crate) fn sleeps(&self) -> u64 {
        self.sleeps
    }

    /// Parks the task until the daemon may have news (or went away): returns at once if
    /// something arrived after the caller last looked. Cancel-safe: dropped while parked, it
    /// has taken nothing.
    pub(crate) async fn sleep(&mut self) -> Result<(), Error> {
        if !self.get_mut().arm()? {
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
