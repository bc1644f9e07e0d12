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
#![forbid(unsafe_code)]

pub mod conn;
pub mod driver;
pub mod mem;
pub mod rpcmsg;

pub use conn::{
    ArgPiece, CallDone, CallSpec, CallStatus, CloseReason, Completion, ConfigError, ConnConfig,
    Connection, Event, IncomingCall, OptionalMsg, ReplySpec, ReplyStatus, ResultPiece, Role,
    ServeId, Stats, SubmitError, Tag, Work,
};
pub use driver::{from_serve_tag, serve_tag, ConnId, ConnTemplate, Driver, DriverError};
pub use mem::{Env, MemRef, Memory, VecMemory};
pub mod poll;
