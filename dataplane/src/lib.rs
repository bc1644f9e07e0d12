//! The RPC-over-RDMA engine: a sans-IO state machine per connection ([`Connection`]) and a
//! thin [`Driver`] binding connections to an RDMA [`Provider`](rpcrdma_verbs::Provider).
//!
//! The poll thread owns one `Driver`: it creates queue pairs with
//! [`ConnTemplate::qp_init`], registers app arenas and the buffer pool with the provider
//! (registration is `unsafe` and happens outside this crate), adds connections, and loops:
//!
//! ```text
//! driver.poll(now, &mut memory);                       // completions -> engine -> posts
//! while let Some((conn, ev)) = driver.poll_event() {   // CallDone, IncomingCall, ...
//!     // complete app calls, hand incoming calls to serving apps
//! }
//! driver.submit_call(conn, &CallSpec { .. }, &mut memory)?;   // from an app's CALL
//! driver.accept_call(conn, id, app_buffer, &mut memory)?;      // for an IncomingCall
//! driver.submit_reply(conn, id, &ReplySpec { .. }, &mut memory)?;
//! ```
//!
//! Memory is named by [`MemRef`] (a registered region's `MrId`, an offset and a length) and
//! reached through the owner's [`Memory`]; the engine never holds a pointer.
//!
//! Buffers: [`Driver::new`] cuts one pool region into per-connection blocks of send and
//! receive buffers; [`Driver::new_shared`] gives all connections one shared receive queue
//! and, optionally, one shared send pool, so memory follows the messages in flight rather
//! than connections × credits. The poll thread uses the shared form, sized by
//! [`poll::PoolPlan`].
//!
//! How a poll loop that owns an `rpcrdma_shm::daemon::AppTable` maps onto this API (each app
//! arena registered once; `MemRef { mr: arena_mr, offset: arena_base + range.off(), len }`):
//!
//! | app side (`AppTable`)                      | engine side                                         |
//! |--------------------------------------------|-----------------------------------------------------|
//! | `Submission::Call(id)`, `c = call_request(id)` | `submit_call(conn, &CallSpec { user: c.id.to_u64(), xid: c.xid, msg, args: c.args as ArgPiece{mem, xdr_pos}, results, reply })` |
//! | `Submission::Cancel(id)`; ids from `expired(now, ..)` (the CALL's time limit) | `call_user(conn, c.xid)` is the call's `user` (not a later call under its XID) → `cancel_call(conn, c.xid)`: `Event::CallDone` at once with `CallStatus::Cancelled` (→ `CANCELLED` or `TIMEOUT`), `lent` if its chunks stay exposed |
//! | app gone (`Detached::calls`)               | each is cancelled as above; every `CallDone` is dropped; its arena stays registered until none is in flight or lent |
//! | `complete_call(id, CallOutcome { .. })`    | on `Event::CallDone(d)`: `status` from `d.status`, `rpc_stat`, `reply_len`, `results: d.results()`, `lent: d.lent` |
//! | `release_call(id)`                         | on `Event::CallReleased { user, .. }` (a lent call's late reply came, or its connection ended; its keys are invalidated) |
//! | `take_recv(app, args_len)`                 | on `Event::IncomingCall(ic)` (route by `ic.prog/vers`), then `accept_call(conn, ic.id, recvbuf_memref)`; no app: `reject_call(conn, ic.id, PROG_UNAVAIL)` |
//! | `deliver_call(rb, IncomingCall { tag: serve_tag(conn, id), .. })` | when `accept_call` answers `Accepted::Ready { args_len }` (inline calls), or on `Event::ArgsReady { id, args_len }` after `Accepted::Pulling` (Read chunks) |
//! | `Submission::Reply(id)`, `r = reply_request(id)` | `let (conn, id) = from_serve_tag(r.tag); submit_reply(conn, id, &ReplySpec { accept_stat: r.accept_stat, msg, results })` |
//! | `complete_reply(r.id, status)`             | on `Event::ReplyDone { id, status }`                 |
//! | `cancel_serving(id)`                       | on `Event::ServeAborted { id }`                      |
//!
//! `Event::Optional` goes to the control plane (xcharext); its answers come back through
//! `Driver::send_optional` / `reject_optional`; learned characteristics are applied with
//! `Driver::configure` (`set_peer_receive_size`, `set_peer_takes_invalidate`, `set_credits`).
//! `Event::Closed` means the queue pair was disconnected: call `Driver::remove` after the
//! provider reports it, and reconnect (with version 1 after `CloseReason::NoAnswer`).
#![forbid(unsafe_code)]

pub mod conn;
#[cfg(any(test, feature = "sim"))]
#[doc(hidden)]
pub mod drive;
pub mod driver;
pub mod mem;
pub mod rpcmsg;

pub use conn::reply_inline_room;
pub use conn::{
    Accepted, ArgPiece, CallDone, CallResults, CallSpec, CallStatus, CloseReason, Completion,
    ConfigError, ConnConfig, Connection, ErrorCounts, Event, IncomingCall, OptionalMsg, ReplySpec,
    ReplyStatus, ResultPiece, Role, ServeId, Stats, SubmitError, Tag, Work, WRITE_CHUNK_LEN,
};
pub use driver::{
    from_serve_tag, serve_tag, BufferCounts, ConnId, ConnTemplate, Driver, DriverError,
};
pub use mem::{Env, MemRef, Memory, RegisteredMem, SideMem, VecMemory, REGISTERED_ACCESS};
pub mod poll;
