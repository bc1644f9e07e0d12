//! The control loop's local clients: admin-socket and `/metrics` connections as non-blocking
//! state machines, so a client that sends nothing, half a request, or never reads its answer
//! never stalls the loop (peer reconnects, xcharext answers, poll-thread events, other admins).
//!
//! Each accepted stream gets its own [`Token`] (from [`FIRST_TOKEN`] up, never reused) and
//! goes through three phases: *reading* its request into a bounded buffer (an admin line up to
//! [`admin::MAX_REQUEST`] bytes, an HTTP request head up to [`MAX_HTTP_HEAD`] bytes) within
//! [`REQUEST_TIMEOUT`]; *handling*, while the daemon prepares the answer (fresh snapshots, a
//! peer's RESPXCH; bounded by [`HANDLING_TIMEOUT`] as a backstop); *writing* the answer from a
//! buffer, flushed on WRITABLE, within [`ANSWER_TIMEOUT`]. The connection is closed when the
//! answer is written, on any error, and when a deadline passes; the daemon enforces deadlines
//! by calling [`Clients::expire`] after each poll, whose timeout includes
//! [`Clients::next_deadline`].

use crate::admin::{self, Request, Response};
use mio::net::{TcpStream, UnixStream};
use mio::{Interest, Registry, Token};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// Tokens below this are the control loop's own (listeners, signals, waker, ...).
pub const FIRST_TOKEN: usize = 1 << 20;
/// Concurrent clients of each kind; more are closed at once.
pub const MAX_CLIENTS: usize = 64;
/// How long a client may take to send its request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a client may take to read its answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Backstop for a request the daemon holds (snapshots wait 1 s, RESPXCH 3 s).
pub const HANDLING_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest HTTP request head read from a metrics client.
pub const MAX_HTTP_HEAD: usize = 8 * 1024;
/// At most one warning about refused clients per this interval.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// What a client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The admin socket: one JSON request line, one JSON answer line.
    Admin,
    /// `/metrics`: one HTTP request head, one HTTP response.
    Metrics,
}

/// An accepted, non-blocking stream.
#[derive(Debug)]
pub enum Stream {
    /// An admin-socket client.
    Unix(UnixStream),
    /// A metrics client.
    Tcp(TcpStream),
}

impl Stream {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(b),
            Stream::Tcp(s) => s.read(b),
        }
    }

    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(b),
            Stream::Tcp(s) => s.write(b),
        }
    }

    fn register(&mut self, reg: &Registry, t: Token, i: Interest) -> io::Result<()> {
        match self {
            Stream::Unix(s) => reg.register(s, t, i),
            Stream::Tcp(s) => reg.register(s, t, i),
        }
    }

    fn reregister(&mut self, reg: &Registry, t: Token, i: Interest) -> io::Result<()> {
        match self {
            Stream::Unix(s) => reg.reregister(s, t, i),
            Stream::Tcp(s) => reg.reregister(s, t, i),
        }
    }

    fn deregister(&mut self, reg: &Registry) {
        let _ = match self {
            Stream::Unix(s) => reg.deregister(s),
            Stream::Tcp(s) => reg.deregister(s),
        };
    }
}

/// A complete request read from a client.
#[derive(Debug, PartialEq)]
pub enum Input {
    /// An admin request, or why it is not one (bad JSON, line too long).
    Admin(Result<Request, String>),
    /// The head of an HTTP request (lossy UTF-8).
    Http(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Reading,
    Handling,
    Writing,
}

#[derive(Debug)]
struct Client {
    stream: Stream,
    kind: Kind,
    phase: Phase,
    /// The request while reading, the answer while writing.
    buf: Vec<u8>,
    written: usize,
    writable: bool,
    deadline: Instant,
}

/// Every open admin and metrics client.
#[derive(Debug)]
pub struct Clients {
    open: HashMap<Token, Client>,
    next: usize,
    max: usize,
    refused: u64,
    refusal_logged: Option<Instant>,
}

impl Default for Clients {
    fn default() -> Self {
        Clients::new(MAX_CLIENTS)
    }
}

/// The end of an HTTP request head in `b`, if complete.
fn head_end(b: &[u8]) -> Option<usize> {
    let crlf = b.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4);
    let lf = b.windows(2).position(|w| w == b"\n\n").map(|p| p + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// An HTTP/1.1 response that closes the connection.
pub fn http_response(status: &str, content_type: Option<&str>, body: &str) -> Vec<u8> {
    let ct = content_type
        .map(|c| format!("Content-Type: {c}\r\n"))
        .unwrap_or_default();
    format!(
        "HTTP/1.1 {status}\r\n{ct}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// `resp` as one JSON line.
pub fn admin_line(resp: &Response) -> Vec<u8> {
    let mut line = serde_json::to_vec(resp).unwrap_or_default();
    line.push(b'\n');
    line
}

impl Clients {
    /// No clients; at most `max` of each kind at a time.
    pub fn new(max: usize) -> Clients {
        Clients {
            open: HashMap::new(),
            next: FIRST_TOKEN,
            max,
            refused: 0,
            refusal_logged: None,
        }
    }

    /// Open clients.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// Whether no client is open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Whether `t` is an open client.
    pub fn contains(&self, t: Token) -> bool {
        self.open.contains_key(&t)
    }

    /// Clients refused because too many were open.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Takes a freshly accepted client, registered for READABLE under a new token; beyond the
    /// bound it is closed at once (`None`).
    pub fn add(&mut self, reg: &Registry, mut stream: Stream, kind: Kind) -> Option<Token> {
        let now = Instant::now();
        if self.open.values().filter(|c| c.kind == kind).count() >= self.max {
            self.refused += 1;
            let quiet = self
                .refusal_logged
                .is_some_and(|at| now.duration_since(at) < REFUSAL_LOG_EVERY);
            if !quiet {
                warn!(
                    ?kind,
                    max = self.max,
                    refused_total = self.refused,
                    "too many local clients: closing new ones at once"
                );
                self.refusal_logged = Some(now);
            }
            return None;
        }
        let t = Token(self.next);
        self.next = self.next.checked_add(1).unwrap_or(FIRST_TOKEN);
        if let Err(e) = stream.register(reg, t, Interest::READABLE) {
            debug!(error = %e, "cannot register a local client");
            return None;
        }
        self.open.insert(
            t,
            Client {
                stream,
                kind,
                phase: Phase::Reading,
                buf: Vec::new(),
                written: 0,
                writable: false,
                deadline: now + REQUEST_TIMEOUT,
            },
        );
        Some(t)
    }

    /// Makes progress on client `t` after a readiness event: its request once complete
    /// (the client is then *handling* until [`Clients::respond`]).
    pub fn ready(&mut self, reg: &Registry, t: Token) -> Option<Input> {
        let phase = self.open.get(&t)?.phase;
        match phase {
            Phase::Reading => self.read(reg, t),
            Phase::Handling => None,
            Phase::Writing => {
                self.flush(reg, t);
                None
            }
        }
    }

    fn read(&mut self, reg: &Registry, t: Token) -> Option<Input> {
        let c = self.open.get_mut(&t)?;
        let limit = match c.kind {
            Kind::Admin => admin::MAX_REQUEST,
            Kind::Metrics => MAX_HTTP_HEAD,
        };
        let mut chunk = [0u8; 4096];
        loop {
            // Never buffer more than the limit plus one byte (which proves the overflow).
            let room = (limit + 1).saturating_sub(c.buf.len()).min(chunk.len());
            let n = match c.stream.read(chunk.get_mut(..room).unwrap_or(&mut [])) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    debug!(token = t.0, error = %e, "local client read failed");
                    self.close(reg, t);
                    return None;
                }
            };
            let eof = n == 0;
            let start = c.buf.len().saturating_sub(3);
            c.buf.extend_from_slice(chunk.get(..n).unwrap_or(&[]));
            let input = match c.kind {
                Kind::Admin => {
                    let nl = c.buf.iter().position(|&b| b == b'\n');
                    match nl {
                        Some(p) => Some(Input::Admin(parse(c.buf.get(..p).unwrap_or(&[])))),
                        None if c.buf.len() > limit => Some(Input::Admin(Err(format!(
                            "request line longer than {limit} bytes"
                        )))),
                        // The old protocol took a last line without its newline.
                        None if eof && !c.buf.is_empty() => Some(Input::Admin(parse(&c.buf))),
                        None => None,
                    }
                }
                Kind::Metrics => match head_end(c.buf.get(start..).unwrap_or(&[])) {
                    Some(e) => {
                        let head = c.buf.get(..start + e).unwrap_or(&[]);
                        Some(Input::Http(String::from_utf8_lossy(head).into_owned()))
                    }
                    None if c.buf.len() > limit => {
                        let resp = http_response("431 Request Header Fields Too Large", None, "");
                        c.phase = Phase::Handling;
                        self.respond(reg, t, resp);
                        return None;
                    }
                    None => None,
                },
            };
            if let Some(i) = input {
                c.phase = Phase::Handling;
                c.buf = Vec::new();
                c.deadline = Instant::now() + HANDLING_TIMEOUT;
                return Some(i);
            }
            if eof {
                debug!(token = t.0, "local client closed before its request ended");
                self.close(reg, t);
                return None;
            }
        }
    }

    /// Sends `answer` to client `t` (non-blocking; the rest on WRITABLE), then closes it.
    /// False if the client is gone (closed, timed out).
    pub fn respond(&mut self, reg: &Registry, t: Token, answer: Vec<u8>) -> bool {
        let Some(c) = self.open.get_mut(&t) else {
            return false;
        };
        c.phase = Phase::Writing;
        c.buf = answer;
        c.written = 0;
        c.deadline = Instant::now() + ANSWER_TIMEOUT;
        self.flush(reg, t);
        true
    }

    fn flush(&mut self, reg: &Registry, t: Token) {
        let Some(c) = self.open.get_mut(&t) else {
            return;
        };
        loop {
            let rest = c.buf.get(c.written..).unwrap_or(&[]);
            if rest.is_empty() {
                self.close(reg, t);
                return;
            }
            match c.stream.write(rest) {
                Ok(0) => {
                    self.close(reg, t);
                    return;
                }
                Ok(n) => c.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if !c.writable {
                        c.writable = true;
                        if c.stream.reregister(reg, t, Interest::WRITABLE).is_err() {
                            self.close(reg, t);
                        }
                    }
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    debug!(token = t.0, error = %e, "local client write failed");
                    self.close(reg, t);
                    return;
                }
            }
        }
    }

    /// Closes client `t` (no answer).
    pub fn close(&mut self, reg: &Registry, t: Token) {
        if let Some(mut c) = self.open.remove(&t) {
            c.stream.deregister(reg);
        }
    }

    /// Closes every client whose deadline passed by `now`.
    pub fn expire(&mut self, reg: &Registry, now: Instant) {
        let late: Vec<Token> = self
            .open
            .iter()
            .filter(|(_, c)| c.deadline <= now)
            .map(|(t, _)| *t)
            .collect();
        for t in late {
            if let Some(c) = self.open.get(&t) {
                debug!(token = t.0, kind = ?c.kind, phase = ?c.phase, "local client too slow: closed");
            }
            self.close(reg, t);
        }
    }

    /// The earliest client deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.open.values().map(|c| c.deadline).min()
    }
}

fn parse(line: &[u8]) -> Result<Request, String> {
    serde_json::from_slice(line).map_err(|e| format!("bad request: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::{Events, Poll};
    use std::os::unix::net::UnixStream as StdUnix;

    /// A connected pair: the daemon's end (mio, non-blocking) and the client's (blocking).
    fn pair() -> (Stream, StdUnix) {
        let (a, b) = StdUnix::pair().expect("socketpair");
        a.set_nonblocking(true).expect("nonblocking");
        (Stream::Unix(UnixStream::from_std(a)), b)
    }

    /// Polls until client `t` yields a request or `n` rounds pass.
    fn pump(poll: &mut Poll, cl: &mut Clients, t: Token) -> Option<Input> {
        let mut events = Events::with_capacity(8);
        for _ in 0..50 {
            poll.poll(&mut events, Some(Duration::from_millis(20)))
                .expect("poll");
            for ev in events.iter() {
                if ev.token() == t {
                    if let Some(i) = cl.ready(poll.registry(), t) {
                        return Some(i);
                    }
                }
            }
            if !cl.contains(t) {
                return None;
            }
        }
        None
    }

    #[test]
    fn admin_request_is_read_across_partial_writes_and_answered() {
        let mut poll = Poll::new().expect("poll");
        let mut cl = Clients::new(4);
        let (s, mut c) = pair();
        let t = cl.add(poll.registry(), s, Kind::Admin).expect("added");
        assert!(t.0 >= FIRST_TOKEN);
        c.write_all(b"{\"cmd\":").expect("write");
        assert_eq!(
            pump(&mut poll, &mut cl, t),
            None,
            "half a line is no request"
        );
        assert!(cl.contains(t));
        c.write_all(b"\"status\"}\n").expect("write");
        assert_eq!(
            pump(&mut poll, &mut cl, t),
            Some(Input::Admin(Ok(Request::Status)))
        );
        assert!(cl.respond(poll.registry(), t, admin_line(&Response::ok(1))));
        assert!(!cl.contains(t), "closed once the answer is written");
        let mut out = String::new();
        c.read_to_string(&mut out).expect("read");
        assert_eq!(out, "{\"ok\":true,\"result\":1}\n");
    }

    #[test]
    fn an_over_long_admin_line_is_an_error_input() {
        let mut poll = Poll::new().expect("poll");
        let mut cl = Clients::new(4);
        let (s, c) = pair();
        let t = cl.add(poll.registry(), s, Kind::Admin).expect("added");
        let w = std::thread::spawn(move || {
            let mut c = c;
            let _ = c.write_all(&vec![b' '; admin::MAX_REQUEST + 10]);
            c
        });
        let got = pump(&mut poll, &mut cl, t);
        assert!(
            matches!(&got, Some(Input::Admin(Err(e))) if e.contains("longer than")),
            "{got:?}"
        );
        drop(w.join());
    }

    #[test]
    fn clients_beyond_the_bound_are_closed_at_once() {
        let poll = Poll::new().expect("poll");
        let mut cl = Clients::new(2);
        let mut held = Vec::new();
        for _ in 0..2 {
            let (s, c) = pair();
            assert!(cl.add(poll.registry(), s, Kind::Admin).is_some());
            held.push(c);
        }
        let (s, mut c) = pair();
        assert!(cl.add(poll.registry(), s, Kind::Admin).is_none());
        assert_eq!(cl.refused(), 1);
        let mut b = [0u8; 1];
        assert_eq!(c.read(&mut b).expect("eof"), 0, "refused client sees EOF");
        // The bound is per kind: a metrics client still gets in.
        let (s, _m) = pair();
        assert!(cl.add(poll.registry(), s, Kind::Metrics).is_some());
    }

    #[test]
    fn silent_clients_expire_at_their_deadline() {
        let poll = Poll::new().expect("poll");
        let mut cl = Clients::new(4);
        let (s, mut c) = pair();
        let t = cl.add(poll.registry(), s, Kind::Admin).expect("added");
        let d = cl.next_deadline().expect("deadline");
        cl.expire(poll.registry(), d - Duration::from_millis(1));
        assert!(cl.contains(t));
        cl.expire(poll.registry(), d);
        assert!(!cl.contains(t));
        let mut b = [0u8; 1];
        assert_eq!(c.read(&mut b).expect("eof"), 0);
    }

    #[test]
    fn http_head_ends_at_the_blank_line() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), Some(27));
        assert_eq!(head_end(b"GET / HTTP/1.0\n\n"), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
    }
}
