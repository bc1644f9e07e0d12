//! Slow and hostile local clients (admin socket, `/metrics`) against a real `rpcrdmad`: the
//! control thread serves them as non-blocking state machines, so a client that sends nothing,
//! half a request, an over-long line, or never reads its answer does not stall anyone else.

mod common;

use common::{config, echo, eventually, free_port, rdmatest_server, tmpdir, Daemon};
use rpcrdma_control::admin::{self, Request};
use rpcrdma_shm::Client;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// The behavioural bound of the stall tests (not a performance figure). Each round opens one
/// more silent client before its request; a control loop that reads a client's request
/// synchronously (with its 2 s read timeout) spends at least 2 s per round, so 10 rounds need
/// at least 20 s there. Served non-blocking, the rounds take milliseconds; 8 s leaves ample
/// room for a loaded machine.
const ROUNDS_WITHIN: Duration = Duration::from_secs(8);

fn status(d: &Daemon) -> admin::Response {
    admin::call(&d.admin, &Request::Status, Duration::from_secs(5)).expect("status answered")
}

/// Whether the daemon closed `s` (EOF or reset) within 5 s, discarding what it sent.
fn closed_by_daemon(mut s: impl Read) -> bool {
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[test]
fn silent_and_half_line_admin_clients_do_not_stall_the_control_loop() {
    let b = Daemon::start("lc-stall-b", None);
    let a = Daemon::start("lc-stall-a", Some(("server", b.port)));
    a.wait_peer_up("server");
    rdmatest_server(&b.app);
    let mut app = Client::connect(&a.app).expect("attach");
    let peer = app.peer("server").expect("peer");

    // Half a request line, never finished.
    let mut half = UnixStream::connect(&a.admin).expect("connect");
    half.write_all(b"{\"cmd\":\"sta").expect("half a line");
    let mut held = vec![half];
    let start = Instant::now();
    for round in 0..10 {
        // One more client that connects and sends nothing, held open.
        held.push(UnixStream::connect(&a.admin).expect("connect"));
        let r = status(&a);
        assert!(r.ok, "round {round}: {r:?}");
        assert_eq!(r.result.expect("status")["state"], "running");
        echo(&mut app, peer, 100 + round);
    }
    let took = start.elapsed();
    assert!(
        took < ROUNDS_WITHIN,
        "10 status requests beside silent admin clients took {took:?}\n{}",
        a.log()
    );

    // The loop still handles poll-thread events while more silent clients are held: a closed
    // connection is noticed and the peer reconnected.
    for _ in 0..5 {
        held.push(UnixStream::connect(&a.admin).expect("connect"));
    }
    let id = a.ctl_json(&["conns"])[0]["id"]
        .as_u64()
        .expect("conn id")
        .to_string();
    assert!(a.ctl(&["conn", "close", &id]).status.success());
    let down = eventually(20, || a.log().contains("connection down").then_some(()));
    assert!(down.is_some(), "{}", a.log());
    a.wait_peer_up("server");
    let mut app = Client::connect(&a.app).expect("attach again");
    let peer = app.peer("server").expect("peer");
    echo(&mut app, peer, 1000);

    // Every held client is closed by the daemon once its 2 s to send a request pass.
    for (i, s) in held.into_iter().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        assert!(closed_by_daemon(s), "held client {i} never closed");
    }
}

#[test]
fn over_long_admin_line_gets_an_error_and_the_connection_is_closed() {
    let a = Daemon::start("lc-long", None);
    let s = UnixStream::connect(&a.admin).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    // No newline within the limit: the line is refused without reading it all.
    let w = s.try_clone().expect("clone");
    let writer = std::thread::spawn(move || {
        let mut w = w;
        let _ = w.write_all(&vec![b'x'; admin::MAX_REQUEST + 100]);
    });
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).expect("an answer");
    let resp: admin::Response = serde_json::from_str(&line).expect("a JSON answer");
    assert!(!resp.ok, "{line}");
    let err = resp.error.expect("error text");
    assert!(err.contains("longer than 65536 bytes"), "{err}");
    assert!(closed_by_daemon(r), "connection closed after the answer");
    let _ = writer.join();

    // A bad line within the limit is answered as before.
    let mut s = UnixStream::connect(&a.admin).expect("connect");
    s.write_all(b"{\"cmd\":\"nonsense\"}\n").expect("write");
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).expect("answer");
    let resp: admin::Response = serde_json::from_str(&line).expect("json");
    assert!(
        resp.error
            .as_deref()
            .is_some_and(|e| e.contains("bad request")),
        "{line}"
    );
    // The daemon is unharmed.
    assert!(status(&a).ok);
}

/// One `/metrics` scrape: the response body.
fn scrape(port: u16) -> String {
    let (head, body) = common::scrape_response(port, Some(Duration::from_secs(10)));
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .expect("Content-Length")
        .parse()
        .expect("a length");
    assert_eq!(len, body.len(), "the whole body arrived");
    body
}

#[test]
fn metrics_clients_that_stall_or_never_read_do_not_block_other_scrapes() {
    let dir = tmpdir("lc-metrics");
    let (port, mport) = (free_port(), free_port());
    let text = config(&dir, port, None, "").replace(
        "log-level",
        &format!("metrics-listen = \"127.0.0.1:{mport}\"\nlog-level"),
    );
    let a = Daemon::start_with(dir, port, &text);

    // A scraper that sends its request and never reads the response.
    let mut deaf = TcpStream::connect(("127.0.0.1", mport)).expect("connect");
    deaf.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("send");
    // One that sends half a request head.
    let mut half = TcpStream::connect(("127.0.0.1", mport)).expect("connect");
    half.write_all(b"GET /metrics HTTP/1.1\r\nHo")
        .expect("send");
    let mut held = vec![deaf, half];
    let start = Instant::now();
    for round in 0..10 {
        // One more that connects and sends nothing.
        held.push(TcpStream::connect(("127.0.0.1", mport)).expect("connect"));
        let body = scrape(mport);
        assert!(body.contains("rpcrdmad_calls_out_total"), "round {round}");
        assert!(status(&a).ok, "round {round}");
    }
    let took = start.elapsed();
    assert!(
        took < ROUNDS_WITHIN,
        "10 scrapes beside stalled metrics clients took {took:?}\n{}",
        a.log()
    );
    // An unknown path is a 404, not a stall.
    let mut s = TcpStream::connect(("127.0.0.1", mport)).expect("connect");
    s.write_all(b"GET /nope HTTP/1.0\r\n\r\n").expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    assert!(out.starts_with("HTTP/1.1 404"), "{out}");

    // The stalled ones are closed by the daemon (the deaf one after its answer was written
    // or its time to read it passed); the deaf one's answer is complete if it fit.
    for (i, s) in held.into_iter().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(15)))
            .expect("timeout");
        assert!(closed_by_daemon(s), "held metrics client {i} never closed");
    }
}
