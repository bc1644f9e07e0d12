//! [`AsyncClient`]: a [`Client`] whose waits park the calling task instead of the thread, for
//! tokio applications (feature `tokio`).
//!
//! One task drives the client: calls are built and submitted through [`AsyncClient::client`],
//! and as many as the rings allow may be in flight while it awaits one of them. How a wait
//! sleeps is the event-loop handshake of `ABI.md` ("Event loops"): it drains and looks, arms
//! the descriptor, awaits its readiness, and looks again.

use std::io;

use crate::client::{Client, Error, Finished, Reply, Ticket};
use crate::parked::Parked;

/// A [`Client`] for tokio: see the module docs.
#[derive(Debug)]
pub struct AsyncClient(Parked<Client>);

impl AsyncClient {
    /// Wraps `client`. Must be called from within a tokio runtime with I/O enabled.
    pub fn new(client: Client) -> io::Result<AsyncClient> {
        Parked::new(client).map(AsyncClient)
    }

    /// The client, to build and submit calls ([`Client::call`]) or poll without waiting.
    pub fn client(&mut self) -> &mut Client {
        self.0.get_mut()
    }

    /// The client back, for blocking use.
    pub fn into_inner(self) -> Client {
        self.0.into_inner()
    }

    /// How many times a wait armed the descriptor and parked its task on it.
    pub fn sleeps(&self) -> u64 {
        self.0.sleeps()
    }

    /// Waits for call `t` to finish. If its reply may never come, give the call a time limit
    /// when building it ([`CallBuilder::timeout`](crate::client::CallBuilder::timeout)) or
    /// cancel it ([`Client::cancel`]): it then ends with `TIMEOUT` or `CANCELLED`. A
    /// `tokio::time::timeout` around this wait only ends the wait: the call stays in flight,
    /// and a later wait can still take it.
    pub async fn wait(&mut self, t: Ticket) -> Result<Reply, Error> {
        loop {
            if let Some(r) = self.client().try_take(t)? {
                return r;
            }
            self.0.sleep().await?;
        }
    }

    /// Waits for any call to finish; calls come in the order they finished.
    pub async fn wait_any(&mut self) -> Result<Finished, Error> {
        loop {
            if let Some(f) = self.client().poll()? {
                return Ok(f);
            }
            self.0.sleep().await?;
        }
    }
}
