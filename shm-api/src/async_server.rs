//! [`AsyncServer`]: a [`Server`] whose waits park the calling task instead of the thread, for
//! tokio applications (feature `tokio`).
//!
//! Register the programs first, with the blocking [`Server::start`] (it waits for the
//! daemon's answer, once), then wrap the server. Two ways to serve:
//!
//! - [`AsyncServer::serve`] answers each call at once through a plain handler, like
//!   [`Server::serve`], and parks the task while no call is waiting.
//! - [`AsyncServer::next_call`] takes a call to be answered later with
//!   [`AsyncServer::answer`]: a handler that must await something (a database, another RPC)
//!   runs in a task of its own and hands its reply back, and calls are answered in whatever
//!   order they finish. `next_call` is cancel-safe, so it can sit in a `tokio::select!` beside
//!   the channel the handlers answer on (`examples/async_server.rs`).
//!
//! One task drives the server, as one thread drives a [`Server`].

use std::io;

use crate::client::{Call, Error, PendingCall, ReplyBuilder, Server};
use crate::parked::Parked;

/// A [`Server`] for tokio: see the module docs.
#[derive(Debug)]
pub struct AsyncServer(Parked<Server>);

impl AsyncServer {
    /// Wraps `server`, whose programs [`Server::start`] has registered. Must be called from
    /// within a tokio runtime with I/O enabled.
    pub fn new(server: Server) -> io::Result<AsyncServer> {
        Parked::new(server).map(AsyncServer)
    }

    /// The server, to register more programs or serve without waiting.
    pub fn server(&mut self) -> &mut Server {
        self.0.get_mut()
    }

    /// The server back, for blocking use.
    pub fn into_inner(self) -> Server {
        self.0.into_inner()
    }

    /// How many times a wait armed the descriptor and parked its task on it.
    pub fn sleeps(&self) -> u64 {
        self.0.sleeps()
    }

    /// Serves the started programs with `handler`, each call answered as it comes, until the
    /// daemon detaches this app (`Err(Detached)`).
    pub async fn serve<F>(&mut self, mut handler: F) -> Result<(), Error>
    where
        F: FnMut(&Call<'_>, &mut ReplyBuilder),
    {
        loop {
            self.server().serve_ready(&mut handler)?;
            self.0.sleep().await?;
        }
    }

    /// Waits for the next call and takes it, to be answered with [`answer`](Self::answer)
    /// (see [`PendingCall`]). Cancel-safe: dropped before it returns, it has taken no call.
    pub async fn next_call(&mut self) -> Result<PendingCall, Error> {
        loop {
            if let Some(c) = self.server().try_next_call()? {
                return Ok(c);
            }
            self.0.sleep().await?;
        }
    }

    /// Answers a call taken with [`next_call`](Self::next_call). Never waits, unless the
    /// submission ring is full (then for the daemon to take a descriptor, as
    /// [`Server::answer`] does).
    pub fn answer(&mut self, call: PendingCall, reply: &ReplyBuilder) -> Result<(), Error> {
        self.server().answer(call, reply)
    }
}
