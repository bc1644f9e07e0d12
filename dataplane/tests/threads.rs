//! Two real poll threads (soft provider over their in-memory fabric), real shared-memory apps:
//! the apps are on thread 0, the connection (both of its ends) on thread 1, so every call and
//! every served call crosses between the threads as hops. The queues between the threads are
//! made tiny (16 hops), so a burst of calls overflows them: the hops held back must still
//! arrive, in order, and every call get exactly its reply.
#![forbid(unsafe_code)]

#[path = "support/poll.rs"]
mod support;

use rpcrdma_dataplane::poll::{self, Command, ConnState, Event, Mesh, PollHandle, Snapshot};
use rpcrdma_shm::attach::Listener;
use rpcrdma_shm::client::{Error, Ticket};
use rpcrdma_shm::rdmatest::{self, pattern};
use rpcrdma_shm::{abi::status, Client, Server};
use rpcrdma_verbs::soft::SoftConfig;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::{attach_next, expect, self_connection, spec, stats, T};

fn attach<A: Send + 'static>(
    apps: &mut Listener,
    to: &PollHandle,
    app: impl FnOnce() -> A + Send + 'static,
) -> std::thread::JoinHandle<A> {
    let t = std::thread::spawn(app);
    attach_next(apps, to);
    t
}

/// `n` started poll threads on one mesh (hop queues `queue` deep), and an app socket path in
/// a fresh directory named after `name` (removed by the caller).
fn threads(name: &str, n: usize, queue: usize) -> (PathBuf, PathBuf, Mesh, Vec<PollHandle>) {
    threads_on(name, n, queue, SoftConfig::default())
}

/// [`threads`] on soft providers configured `soft`.
fn threads_on(
    name: &str,
    n: usize,
    queue: usize,
    soft: SoftConfig,
) -> (PathBuf, PathBuf, Mesh, Vec<PollHandle>) {
    let dir = std::env::temp_dir().join(format!("rpcrdma-dp-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("app.sock");
    let mut mesh = Mesh::new(n, 2, 1, queue).expect("mesh");
    let handles: Vec<PollHandle> = (0..n)
        .map(|i| {
            let port = mesh.port(i).expect("port");
            poll::spawn_mem(spec(i), port, soft, Box::new(|| {})).expect("thread")
        })
        .collect();
    for h in &handles {
        expect(h, "Started", |e| {
            matches!(e, Event::Started { .. }).then_some(())
        });
    }
    (dir, path, mesh, handles)
}

fn server(path: &Path) -> Server {
    let mut s = Server::connect(path).expect("server attach");
    s.receive_buffers(8, 64 * 1024);
    s
}

/// A server app of RDMATEST attached to `to`, running `serve` in a thread of its own once it
/// has registered; returns then.
fn serve_on(
    apps: &mut Listener,
    to: &PollHandle,
    path: &Path,
    serve: impl FnOnce(Server) + Send + 'static,
) {
    let p = path.to_path_buf();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let _server = attach(apps, to, move || {
        let mut s = server(&p);
        s.start(rdmatest::PROG, rdmatest::VERS).expect("register");
        let _ = ready_tx.send(());
        serve(s);
    });
    ready_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("server registered");
}

/// An RDMATEST server attached to `to`, serving in a thread of its own; returns once it has
/// registered.
fn rdmatest_server(apps: &mut Listener, to: &PollHandle, path: &Path) {
    serve_on(apps, to, path, |mut s| {
        let _ = s.serve(rdmatest::PROG, rdmatest::VERS, rdmatest::handle);
    });
}

/// A client app attached to `to`, and its peer "self".
fn client(apps: &mut Listener, to: &PollHandle, path: &Path) -> (Client, u32) {
    let p = path.to_path_buf();
    let c = attach(apps, to, move || Client::connect(&p).expect("client"))
        .join()
        .expect("client thread");
    let peer = c.peer("self").expect("peer");
    (c, peer)
}

/// Submits an RDMATEST ECHO of eight bytes `i` to version `vers` of the program at `peer`.
fn echo(c: &mut Client, peer: u32, vers: u32, i: u8) -> Ticket {
    let mut call = c.call(peer, rdmatest::PROG, vers, rdmatest::ECHO);
    call.args().put_opaque(&[i; 8]);
    call.max_reply(64);
    call.submit().expect("submit")
}

#[test]
fn calls_and_served_calls_cross_threads_through_overflowing_queues() {
    let (dir, path, mesh, mut handles) = threads("threads", 2, 16);
    let (t1, t0) = (handles.pop().expect("t1"), handles.pop().expect("t0"));
    // Thread 1 listens and connects to itself: both ends of the connection are its own.
    let conn = self_connection(&t1);
    assert_eq!(mesh.thread_of(conn), 1, "connection ids name their thread");

    // Both apps on thread 0.
    let geometry = spec(0).geometry;
    let mut apps = Listener::bind(&path, geometry, vec!["self".into()]).expect("app socket");
    rdmatest_server(&mut apps, &t0, &path);
    let p = path.clone();
    let client = attach(&mut apps, &t0, move || Client::connect(&p).expect("client"));
    let mut c = client.join().expect("client thread");
    let peer = c.peer("self").expect("peer");

    // A burst of 200 ECHOs, sizes across the inline threshold, with DDP arguments and results
    // for some: far more hops at once than the 16-deep queues hold.
    let mut tickets = Vec::new();
    for i in 0..200u32 {
        let len = [0usize, 40, 700, 3000, 9000][i as usize % 5];
        let data = pattern(i, len);
        let mut call = c.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::ECHO);
        if len >= 3000 && i % 2 == 0 {
            call.args().put_ddp_opaque(&data);
            call.result_buffer(len as u32);
        } else {
            call.args().put_opaque(&data);
            call.max_reply(len as u32 + 512);
        }
        tickets.push((data, call.submit().expect("submit")));
    }
    for (i, (data, t)) in tickets.into_iter().enumerate() {
        let r = c.wait(t, T).unwrap_or_else(|e| panic!("call {i}: {e:?}"));
        assert_eq!(r.accept_stat, 0, "call {i}");
        let mut want = (data.len() as u32).to_be_bytes().to_vec();
        want.extend_from_slice(&data);
        want.resize(4 + data.len().div_ceil(4) * 4, 0);
        assert_eq!(r.body, want, "call {i}");
    }

    // Answers to the server's replies (ReplyDone) may still be on their way: wait until every
    // hop sent has been received.
    let end = Instant::now() + Duration::from_secs(20);
    let (s0, s1) = loop {
        let (s0, s1) = (stats(&t0), stats(&t1));
        if (s0.hops_in, s1.hops_in) == (s1.hops_out, s0.hops_out) || Instant::now() > end {
            break (s0, s1);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(s1.totals.calls_out, 200, "{s1:?}");
    assert_eq!(s1.totals.replies_out, 200, "{s1:?}");
    assert_eq!((s0.totals.calls_out, s0.apps, s1.apps), (0, 2, 0));
    // Calls and replies went 0 → 1, their answers and the served calls 1 → 0.
    assert!(s0.hops_out >= 400 && s1.hops_out >= 400, "{s0:?} {s1:?}");
    assert_eq!((s0.hops_in, s1.hops_in), (s1.hops_out, s0.hops_out));
    assert!(
        s0.hops_deferred + s1.hops_deferred > 0,
        "the 16-deep queues never overflowed: {s0:?} {s1:?}"
    );
    // The apps' arenas are registered on both threads (plus each thread's pool).
    assert_eq!((s0.regions, s1.regions), (3, 3));
    for h in [t0, t1] {
        let _ = h.send(Command::Stop);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Incoming calls wait for a receive buffer in one line per serving app: a server with every
/// buffer in use holds up only its own calls, not another app's (whose own waiting calls are
/// placed as its buffers come back), and its calls reach it in the order they came.
#[test]
fn a_server_out_of_buffers_holds_up_only_its_own_calls_which_keep_their_order() {
    let (dir, path, _mesh, mut handles) = threads("held", 1, 64);
    let t0 = handles.pop().expect("thread");
    self_connection(&t0);
    let mut apps = Listener::bind(&path, spec(0).geometry, vec!["self".into()]).expect("apps");

    // A: two buffers, and it serves only when told to; it tells the order of its calls.
    let (a_ready, a_registered) = std::sync::mpsc::channel();
    let (go, a_go) = std::sync::mpsc::channel::<()>();
    let (a_saw, seen) = std::sync::mpsc::channel();
    let p = path.clone();
    let _a = attach(&mut apps, &t0, move || {
        let mut s = Server::connect(&p).expect("server a");
        s.receive_buffers(2, 4096);
        s.start(rdmatest::PROG, rdmatest::VERS).expect("register a");
        let _ = a_ready.send(());
        let _ = a_go.recv();
        let _ = s.serve(rdmatest::PROG, rdmatest::VERS, |call, reply| {
            let _ = a_saw.send(call.args.get(4).copied().unwrap_or(u8::MAX));
            rdmatest::handle(call, reply);
        });
    });
    a_registered
        .recv_timeout(Duration::from_secs(20))
        .expect("a registered");
    // B: version 2 of the program, one buffer, serving at once.
    let (b_ready, b_registered) = std::sync::mpsc::channel();
    let p = path.clone();
    let _b = attach(&mut apps, &t0, move || {
        let mut s = Server::connect(&p).expect("server b");
        s.receive_buffers(1, 4096);
        s.start(rdmatest::PROG, 2).expect("register b");
        let _ = b_ready.send(());
        let _ = s.serve(rdmatest::PROG, 2, rdmatest::handle);
    });
    b_registered
        .recv_timeout(Duration::from_secs(20))
        .expect("b registered");
    let (mut c, peer) = client(&mut apps, &t0, &path);
    let echo = |c: &mut Client, vers: u32, i: u8| echo(c, peer, vers, i);
    // A fresh connection's requester has one credit until a reply grants more: one call
    // answered by B first, or A's unanswered first call would hold up everything after it.
    let warm = echo(&mut c, 2, 99);
    c.wait(warm, T).expect("first call");
    // Six calls for A (two take its buffers, four wait), then four for B (three wait for its
    // one buffer, behind A's line).
    let for_a: Vec<_> = (0..6u8).map(|i| echo(&mut c, rdmatest::VERS, i)).collect();
    let for_b: Vec<_> = (0..4u8).map(|i| echo(&mut c, 2, 100 + i)).collect();
    let short = Some(Duration::from_secs(10));
    for (i, t) in for_b.into_iter().enumerate() {
        let r = c
            .wait(t, short)
            .unwrap_or_else(|e| panic!("B's call {i} held up behind A: {e:?}"));
        assert_eq!(r.body[4..], [100 + i as u8; 8], "B's call {i}");
    }
    // A's calls came before B's, which are answered: two are in A's buffers, four wait.
    let held = stats(&t0);
    assert_eq!(held.calls_held, 4, "{held:?}");
    assert!(held.calls_held_total >= 4, "{held:?}");
    go.send(()).expect("go");
    for (i, t) in for_a.into_iter().enumerate() {
        let r = c
            .wait(t, T)
            .unwrap_or_else(|e| panic!("A's call {i}: {e:?}"));
        assert_eq!(r.body[4..], [i as u8; 8], "A's call {i}");
    }
    let after = stats(&t0);
    assert_eq!(after.calls_held, 0, "{after:?}");
    assert!(after.calls_held_total >= held.calls_held_total);
    let order: Vec<u8> = seen.try_iter().collect();
    assert_eq!(
        order,
        [0, 1, 2, 3, 4, 5],
        "A's calls in the order they came"
    );
    let _ = t0.send(Command::Stop);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server that answers and leaves at once (it drops right after submitting its reply, so
/// its REPLY and DETACH reach the poll thread together) still has its reply sent whole: the
/// reply's RDMA Writes read the server's arena, so the arena stays registered, on both
/// threads, until the reply has ended. Only then does it go.
#[test]
fn a_server_that_replies_and_leaves_at_once_still_sends_its_whole_reply() {
    let (dir, path, _mesh, mut handles) = threads("leaving", 2, 64);
    let (t1, t0) = (handles.pop().expect("t1"), handles.pop().expect("t0"));
    let _conn = self_connection(&t1);
    let geometry = spec(0).geometry;
    let mut apps = Listener::bind(&path, geometry, vec!["self".into()]).expect("app socket");
    let len = 512 * 1024;
    let p = path.clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = attach(&mut apps, &t0, move || {
        let mut s = Server::connect(&p).expect("server attach");
        s.receive_buffers(1, len as u32 + 4096);
        s.start(rdmatest::PROG, rdmatest::VERS).expect("register");
        let _ = ready_tx.send(());
        s.serve_calls(rdmatest::PROG, rdmatest::VERS, 1, rdmatest::handle)
            .expect("serve one call");
        // Dropped here: DETACH follows the REPLY on the ring.
    });
    ready_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("server registered");
    let p = path.clone();
    let client = attach(&mut apps, &t0, move || Client::connect(&p).expect("client"));
    let mut c = client.join().expect("client thread");
    let peer = c.peer("self").expect("peer");
    let base = stats(&t1).regions;

    // ECHO of 512 KiB: the arguments through a Read chunk, the result through a Write chunk
    // that thread 1 fills from the server's arena with RDMA Writes.
    let data = pattern(7, len);
    let mut call = c.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::ECHO);
    call.args().put_ddp_opaque(&data);
    call.result_buffer(len as u32);
    let t = call.submit().expect("submit");
    let r = c.wait(t, T).expect("the reply of a server that left");
    assert_eq!(r.accept_stat, 0);
    let mut want = (len as u32).to_be_bytes().to_vec();
    want.extend_from_slice(&data);
    assert_eq!(r.body, want, "the whole echo");
    server.join().expect("server thread");

    // The server's arena goes once its reply has ended, from both threads.
    let end = Instant::now() + Duration::from_secs(20);
    while stats(&t1).regions != base - 1 || stats(&t0).regions != 2 {
        assert!(
            Instant::now() < end,
            "the leaving server's arena stays registered"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    for h in [t0, t1] {
        let _ = h.send(Command::Stop);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// An app that registers a program is told so only once every poll thread can route calls
/// for it to the app: its peers may call the moment it is told. Here the registering server
/// is on thread 0 and the connection on thread 1, and the announcement reaches thread 1 as a
/// hop behind a burst of calls that overflowed the 2-deep queue between them; a client on
/// thread 1 calls the new program as soon as the server's registration returns, and must be
/// served, never answered PROG_UNAVAIL.
#[test]
fn a_program_registered_on_another_thread_is_served_as_soon_as_its_app_is_told() {
    let (dir, path, _mesh, mut handles) = threads("announce", 2, 2);
    let (t1, t0) = (handles.pop().expect("t1"), handles.pop().expect("t0"));
    let _conn = self_connection(&t1);
    let geometry = spec(0).geometry;
    let mut apps = Listener::bind(&path, geometry, vec!["self".into()]).expect("app socket");
    // Thread 0: the burst's caller first (its submissions are taken before the registration
    // that follows them), the RDMATEST server answering the burst, and the new server.
    let p = path.clone();
    let burst = attach(&mut apps, &t0, move || Client::connect(&p).expect("client"));
    let mut a = burst.join().expect("client thread");
    rdmatest_server(&mut apps, &t0, &path);
    let p = path.clone();
    let fresh = attach(&mut apps, &t0, move || server(&p));
    let mut s = fresh.join().expect("server thread");
    // Thread 1: the caller of the new program.
    let p = path.clone();
    let caller = attach(&mut apps, &t1, move || Client::connect(&p).expect("client"));
    let mut c = caller.join().expect("client thread");
    let (pa, pc) = (a.peer("self").expect("peer"), c.peer("self").expect("peer"));

    let deferred = stats(&t0).hops_deferred;
    for round in 0..8u32 {
        let burst: Vec<_> = (0..64u32)
            .map(|i| {
                let mut call = a.call(pa, rdmatest::PROG, rdmatest::VERS, rdmatest::ECHO);
                call.args().put_opaque(&pattern(i, 40));
                call.max_reply(512);
                call.submit().expect("submit")
            })
            .collect();
        let prog = 0x2000_5000 + round;
        s.start(prog, 1).expect("register the new program");
        let mut call = c.call(pc, prog, 1, rdmatest::ECHO);
        call.args().put_opaque(&pattern(round, 24));
        call.max_reply(512);
        let t = call.submit().expect("submit");
        let end = Instant::now() + Duration::from_secs(20);
        let r = loop {
            s.serve_ready(rdmatest::handle).expect("serve");
            if let Some(r) = c.try_take(t).expect("take") {
                break r.expect("the call of the new program");
            }
            assert!(Instant::now() < end, "round {round}: no reply");
        };
        assert_eq!(
            r.accept_stat, 0,
            "round {round}: the new program was not found"
        );
        for t in burst {
            assert_eq!(a.wait(t, T).expect("burst call").accept_stat, 0);
        }
    }
    // A program nobody serves is still refused, once the hops before the call are taken.
    let t = c
        .call(pc, 0x2000_5fff, 1, rdmatest::NULL)
        .submit()
        .expect("submit");
    assert_eq!(
        c.wait(t, T).expect("refused").accept_stat,
        1,
        "PROG_UNAVAIL"
    );
    // The announcements did wait behind deferred hops (else this test proves nothing).
    assert!(
        stats(&t0).hops_deferred > deferred,
        "the 2-deep queue never overflowed"
    );
    for h in [t0, t1] {
        let _ = h.send(Command::Stop);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A connection closed with a call in flight, on a provider that is done with a destroyed
/// queue pair only some polls later (as rxe and siw are; `SoftConfig::retire_polls`): the
/// call still ends, with TRANSPORT, once the device is done (the driver holds the end until
/// then, and the thread keeps polling meanwhile instead of parking), and a new connection in
/// the freed slot serves calls.
#[test]
fn a_call_on_a_closed_connection_ends_once_its_queue_pair_retires() {
    let late = SoftConfig {
        retire_polls: 3,
        ..SoftConfig::default()
    };
    let (dir, path, _mesh, mut handles) = threads_on("retire", 1, 64, late);
    let t0 = handles.pop().expect("thread");
    let conn = self_connection(&t0);
    let mut apps = Listener::bind(&path, spec(0).geometry, vec!["self".into()]).expect("apps");
    // A server that takes its calls and answers only when told.
    let (ready, registered) = std::sync::mpsc::channel();
    let (go, told) = std::sync::mpsc::channel::<()>();
    let p = path.clone();
    let _server = attach(&mut apps, &t0, move || {
        let mut s = server(&p);
        s.start(rdmatest::PROG, rdmatest::VERS).expect("register");
        let _ = ready.send(());
        let _ = told.recv();
        let _ = s.serve(rdmatest::PROG, rdmatest::VERS, rdmatest::handle);
    });
    registered
        .recv_timeout(Duration::from_secs(20))
        .expect("registered");
    let (mut c, peer) = client(&mut apps, &t0, &path);
    let t = echo(&mut c, peer, rdmatest::VERS, 1);
    // Until the call has reached the server's end of the connection: it is in flight.
    let end = Instant::now() + Duration::from_secs(20);
    while stats(&t0).totals.calls_in == 0 {
        assert!(Instant::now() < end, "the call never arrived");
        std::thread::sleep(Duration::from_millis(5));
    }
    t0.send(Command::Close { conn }).expect("close");
    match c.wait(t, T) {
        Err(Error::Status(status::TRANSPORT)) => {}
        other => panic!("the call on the closed connection: {other:?}"),
    }
    self_connection(&t0);
    go.send(()).expect("go");
    let t = echo(&mut c, peer, rdmatest::VERS, 2);
    let r = c.wait(t, T).expect("a call on the new connection");
    assert_eq!(r.body[4..], [2u8; 8]);
    let _ = t0.send(Command::Stop);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A connection id names one connection, not its slot: the next connection in a closed
/// connection's slot gets an id of its own, so a stale id reaches nothing. A call addressed to
/// it (as a serving app's call back to a client that has left would be) fails TRANSPORT
/// instead of going out on the new connection, and a `close` of it closes nothing.
#[test]
fn a_closed_connection_s_id_never_names_the_next_connection_in_its_slot() {
    let (dir, path, _mesh, mut handles) = threads("ids", 1, 64);
    let t0 = handles.pop().expect("thread");
    let old = self_connection(&t0);
    let mut apps = Listener::bind(&path, spec(0).geometry, vec!["self".into()]).expect("apps");
    let (mut c, peer) = client(&mut apps, &t0, &path);
    // A connection addressed by its id: peer index = the configured peers + the id.
    let direct = |c: &mut Client, conn: u32| {
        let t = c
            .call(
                peer + 1 + conn,
                rdmatest::PROG,
                rdmatest::VERS,
                rdmatest::NULL,
            )
            .submit()
            .expect("submit");
        c.wait(t, T)
    };
    // Nobody serves the program: PROG_UNAVAIL, from the other end of the connection.
    assert_eq!(
        direct(&mut c, old)
            .expect("the first connection")
            .accept_stat,
        1
    );
    t0.send(Command::Close { conn: old }).expect("close");
    expect(&t0, "Down", |e| {
        matches!(e, Event::Down { conn, .. } if conn == old).then_some(())
    });
    let new = self_connection(&t0);
    assert_ne!(new, old, "the slot's next connection has the same id");
    assert_eq!(
        mesh_slot(new),
        mesh_slot(old),
        "not the same slot: proves nothing"
    );
    match direct(&mut c, old) {
        Err(Error::Status(status::TRANSPORT)) => {}
        other => panic!("a call to the closed connection's id: {other:?}"),
    }
    t0.send(Command::Close { conn: old }).expect("close");
    assert_eq!(
        direct(&mut c, new).expect("the new connection").accept_stat,
        1
    );
    t0.send(Command::Snapshot(Box::new(Snapshot::with_capacity(2))))
        .expect("snapshot");
    let s = expect(&t0, "Snapshot", |e| match e {
        Event::Snapshot(s) => Some(s),
        _ => None,
    });
    assert_eq!(
        s.thread.totals.calls_out, 2,
        "the stale call went out: {s:?}"
    );
    assert!(
        s.conns()
            .iter()
            .any(|k| k.info.id == new && k.info.state == ConnState::Up),
        "closed by its slot's old id: {s:?}"
    );
    let _ = t0.send(Command::Stop);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The slot of a global connection id (one thread of two slots here: ids go round by 2).
fn mesh_slot(conn: u32) -> u32 {
    conn % 2
}

/// Connection ids name their thread by the mesh's connections per thread, so a poll thread
/// whose spec has room for another number of connections refuses to start (it would name
/// connections of another thread).
#[test]
fn a_poll_thread_whose_connections_disagree_with_its_mesh_does_not_start() {
    let mut mesh = Mesh::new(1, 3, 1, 16).expect("mesh");
    let port = mesh.port(0).expect("port");
    let h = poll::spawn_mem(spec(0), port, SoftConfig::default(), Box::new(|| {})).expect("spawn");
    let end = Instant::now() + Duration::from_secs(20);
    let why = loop {
        match h.recv() {
            Some(Event::Failed(e)) => break e,
            Some(Event::Started { .. }) => panic!("started with 2 connections in a mesh of 3"),
            Some(_) => {}
            None => {
                assert!(Instant::now() < end, "neither started nor failed");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    };
    assert!(
        why.contains("2 connections in the spec, 3 per thread"),
        "{why}"
    );
}

/// The full snapshot of thread `h` (its connections too).
fn snapshot(h: &PollHandle) -> Snapshot {
    h.send(Command::Snapshot(Box::new(Snapshot::with_capacity(2))))
        .expect("snapshot");
    expect(h, "Snapshot", |e| match e {
        Event::Snapshot(s) => Some(*s),
        _ => None,
    })
}

/// A server app on `to` that answers every RDMATEST ECHO with its argument, except those
/// whose argument starts with 0xEE: it holds them, says so on `held`, and answers them all
/// when `release` says so.
fn holding_server(
    apps: &mut Listener,
    to: &PollHandle,
    path: &Path,
    held: std::sync::mpsc::Sender<u32>,
    release: std::sync::mpsc::Receiver<()>,
) {
    serve_on(apps, to, path, move |mut s| {
        let mut holding = Vec::new();
        while let Ok(call) = s.next_call() {
            let mut reply = rpcrdma_shm::client::ReplyBuilder::default();
            rdmatest::handle(&call.call(), &mut reply);
            if call.args.get(4) == Some(&0xEE) {
                let _ = held.send(call.xid);
                holding.push((call, reply));
                continue;
            }
            if s.answer(call, &reply).is_err() {
                return;
            }
            if release.try_recv().is_ok() {
                for (c, r) in holding.drain(..) {
                    let _ = s.answer(c, &r);
                }
            }
        }
    });
}

/// Two poll threads, the connection (both ends) on thread 1, and on thread 0 a
/// [`holding_server`] and a client app that has made its first call (a requester starts
/// with one credit: the first reply brings the grant).
struct Held {
    dir: PathBuf,
    path: PathBuf,
    apps: Listener,
    t0: PollHandle,
    t1: PollHandle,
    conn: u32,
    c: Client,
    peer: u32,
    held: std::sync::mpsc::Receiver<u32>,
    release: std::sync::mpsc::Sender<()>,
    _mesh: Mesh,
}

impl Held {
    fn new(name: &str) -> Held {
        let (dir, path, mesh, mut handles) = threads(name, 2, 64);
        let (t1, t0) = (handles.pop().expect("t1"), handles.pop().expect("t0"));
        let conn = self_connection(&t1);
        let geometry = spec(0).geometry;
        let mut apps = Listener::bind(&path, geometry, vec!["self".into()]).expect("app socket");
        let (held_tx, held) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        holding_server(&mut apps, &t0, &path, held_tx, release_rx);
        let (mut c, peer) = client(&mut apps, &t0, &path);
        let t = echo(&mut c, peer, rdmatest::VERS, 0);
        c.wait(t, T).expect("first call");
        Held {
            dir,
            path,
            apps,
            t0,
            t1,
            conn,
            c,
            peer,
            held,
            release,
            _mesh: mesh,
        }
    }

    /// Waits until the server holds one more call.
    fn wait_held(&self) {
        self.held
            .recv_timeout(Duration::from_secs(20))
            .expect("the server holds the call");
    }

    /// The counters of the connection's client end, if it is up.
    fn client_end(&self) -> Option<rpcrdma_dataplane::poll::ConnInfo> {
        let s = snapshot(&self.t1);
        s.conns[..s.n]
            .iter()
            .find(|x| x.info.id == self.conn)
            .map(|x| x.info)
    }

    /// Lets the server answer the calls it holds (once it has answered another call, which
    /// this makes), then waits until the client end has dropped `n` late replies in all.
    fn release_and_wait_dropped(&mut self, n: u64) -> rpcrdma_dataplane::poll::ConnInfo {
        self.release.send(()).expect("release");
        let t = echo(&mut self.c, self.peer, rdmatest::VERS, 1);
        self.c
            .wait(t, T)
            .expect("the call that releases the held ones");
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let info = self.client_end().expect("the connection is up");
            if info.engine.dropped == n || Instant::now() > end {
                assert_eq!(info.engine.dropped, n, "late replies dropped: {info:?}");
                return info;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn stop(self) {
        for h in [self.t0, self.t1] {
            let _ = h.send(Command::Stop);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An app cancels one of its calls and lets another reach its time limit, both held by the
/// server, with the app on thread 0 and the connection on thread 1 (the requests cross as
/// hops). Each ends once, with its own status, at once (inline: nothing to fence); the
/// server's late replies are taken only for their credits and dropped; the connection stays
/// up and serves calls after them; nothing stays in flight.
#[test]
fn r8166_4_4_c_an_app_cancels_or_times_out_its_calls_and_late_replies_only_return_credit() {
    let mut h = Held::new("cancel");
    let peer = h.peer;
    let hold = |c: &mut Client, limit: Option<Duration>| {
        let mut call = c.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::ECHO);
        call.args().put_opaque(&[0xEE; 8]);
        call.max_reply(64);
        if let Some(l) = limit {
            call.timeout(l);
        }
        call.submit().expect("submit")
    };
    let a = hold(&mut h.c, None);
    let b = hold(&mut h.c, Some(Duration::from_millis(150)));
    let t_b = Instant::now();
    // A call with a limit that its reply beats ends with the reply.
    let mut quick =
        h.c.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::ECHO);
    quick.args().put_opaque(&[7; 8]);
    quick.max_reply(64).timeout(Duration::from_secs(30));
    let quick = quick.submit().expect("submit");
    h.wait_held();
    h.wait_held();
    assert_eq!(h.c.wait(quick, T).expect("quick").accept_stat, 0);

    h.c.cancel(a).expect("cancel");
    match h.c.wait(a, T) {
        Err(Error::Status(s)) => assert_eq!(s, status::CANCELLED),
        other => panic!("a cancelled call ended {other:?}"),
    }
    match h.c.wait(b, T) {
        Err(Error::Status(s)) => assert_eq!(s, status::TIMEOUT),
        other => panic!("a call past its limit ended {other:?}"),
    }
    assert!(t_b.elapsed() >= Duration::from_millis(150), "ended early");
    // Each ended once: nothing more for them, and neither can be cancelled again.
    assert!(matches!(h.c.cancel(a), Err(Error::UnknownTicket)));
    assert!(matches!(h.c.try_take(b), Err(Error::UnknownTicket)));
    // Inline calls: nothing lent, nothing to wait for.
    assert_eq!((h.c.in_flight(), h.c.lent()), (0, 0));

    // The server answers them now: the engine takes the replies for their credits only.
    let info = h.release_and_wait_dropped(2);
    assert_eq!(info.state, ConnState::Up);
    // The two that did not get their reply count as failed calls of the connection.
    assert_eq!(info.call_errors, 2, "{info:?}");
    // Every credit came back: more calls than the grant go through, in flight at once.
    let tickets: Vec<_> = (0..64u8)
        .map(|i| echo(&mut h.c, peer, rdmatest::VERS, i))
        .collect();
    for (i, t) in tickets.into_iter().enumerate() {
        let r = h.c.wait(t, T).unwrap_or_else(|e| panic!("call {i}: {e:?}"));
        assert_eq!(r.accept_stat, 0);
    }
    let (s0, s1) = (stats(&h.t0), stats(&h.t1));
    assert_eq!(
        (s0.rpcs_in_flight, s1.rpcs_in_flight),
        (0, 0),
        "{s0:?} {s1:?}"
    );
    h.stop();
}

impl Held {
    /// Submits a READ of 8 KiB into a result buffer (a Write chunk) that the server holds, from
    /// `c`, and waits until the server holds it.
    fn held_read(&self, c: &mut Client) -> rpcrdma_shm::client::Ticket {
        // The seed's first byte (the argument's fifth) makes the server hold it.
        let mut call = c.call(self.peer, rdmatest::PROG, rdmatest::VERS, rdmatest::READ);
        call.args().put_u32(8192).put_u32(0xEE00_0001);
        call.result_buffer(8192).max_reply(64);
        let r = call.submit().expect("submit");
        self.wait_held();
        r
    }

    /// Waits (up to 20 s) until the two threads' memory regions number `n`; what they are.
    fn regions(&self, n: [usize; 2]) -> [usize; 2] {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let now = [stats(&self.t0).regions, stats(&self.t1).regions];
            if now == n || Instant::now() > end {
                return now;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// A cancelled call whose result the peer would place with RDMA Write ends for its app at once,
/// *lent* (R8166-8.1.4-c): nothing is invalidated under the server's feet, so its late Write
/// lands in the buffer the client holds aside, and the connection lives. Once the late reply
/// is in, the chunk is fenced (R8166-4.4-c) and only then is the buffer the client's again.
#[test]
fn r8166_8_1_4_c_a_cancelled_chunked_call_ends_lent_and_is_released_after_its_late_reply() {
    let mut h = Held::new("cancel-chunk");
    let before = h.client_end().expect("up").engine.invalidations;
    // A second app (the first makes the call that lets the server answer).
    let (mut c, _) = client(&mut h.apps, &h.t0, &h.path);
    let r = h.held_read(&mut c);
    c.cancel(r).expect("cancel");
    match c.wait(r, T) {
        Err(Error::Status(s)) => assert_eq!(s, status::CANCELLED),
        other => panic!("the cancelled READ ended {other:?}"),
    }
    assert_eq!((c.in_flight(), c.lent()), (0, 1));
    let info = h.client_end().expect("up");
    assert_eq!(
        info.engine.invalidations, before,
        "not fenced under the server's feet: {info:?}"
    );
    // Its op stays the app's until released: its thread still counts it in flight, beside
    // the call the server holds.
    assert_eq!(stats(&h.t0).rpcs_in_flight, 2);

    // The server answers now: its Write lands, the reply is dropped, the chunk fenced.
    let info = h.release_and_wait_dropped(1);
    assert_eq!(info.state, ConnState::Up, "the late Write cost nothing");
    assert_eq!(info.engine.invalidations, before + 1, "{info:?}");
    let end = Instant::now() + Duration::from_secs(20);
    while c.lent() > 0 && Instant::now() < end {
        c.progress().expect("progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(c.lent(), 0, "released");
    let (s0, s1) = (stats(&h.t0), stats(&h.t1));
    assert_eq!(
        (s0.rpcs_in_flight, s1.rpcs_in_flight),
        (0, 0),
        "{s0:?} {s1:?}"
    );
    let t = echo(&mut c, h.peer, rdmatest::VERS, 2);
    assert_eq!(c.wait(t, T).expect("after").accept_stat, 0);
    h.stop();
}

/// An app that leaves with a chunked call in flight: the call is cancelled, lent, and the app's
/// arena stays registered on both threads while the server may still write it; its late reply
/// releases the call, and only then is the arena deregistered.
#[test]
fn a_gone_app_s_lent_call_keeps_its_arena_registered_until_released() {
    let mut h = Held::new("gone-lent");
    let (mut gone, _) = client(&mut h.apps, &h.t0, &h.path);
    assert_eq!(h.regions([4, 4]), [4, 4]);
    h.held_read(&mut gone);
    drop(gone);
    // Its call ended lent at once (one call of the poll threads in flight still) ...
    let end = Instant::now() + Duration::from_secs(20);
    while stats(&h.t0).apps_detached == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        [stats(&h.t0).regions, stats(&h.t1).regions],
        [4, 4],
        "the gone app's arena stays while its memory is lent"
    );
    // ... and its late reply releases it, with the arena.
    h.release_and_wait_dropped(1);
    assert_eq!(h.regions([3, 3]), [3, 3]);
    h.stop();
}

/// An app that leaves with a call in flight which offered the peer no memory: the call ends
/// at once (nothing to fence), so the app's arena is deregistered on both threads while the
/// server still holds the call; the server's late reply only returns its credit. Without this
/// a peer that never answers kept a gone app's arena registered for good.
#[test]
fn a_gone_app_s_inline_calls_end_at_once_and_its_arena_is_released() {
    let mut h = Held::new("gone-app");
    // The pool and two arenas on each thread.
    assert_eq!((stats(&h.t0).regions, stats(&h.t1).regions), (3, 3));
    let (mut gone, _) = client(&mut h.apps, &h.t0, &h.path);
    assert_eq!((stats(&h.t0).regions, stats(&h.t1).regions), (4, 4));
    let mut call = gone.call(h.peer, rdmatest::PROG, rdmatest::VERS, rdmatest::ECHO);
    call.args().put_opaque(&[0xEE; 8]);
    call.max_reply(64);
    let _ = call.submit().expect("submit");
    h.wait_held();
    drop(gone);
    let end = Instant::now() + Duration::from_secs(20);
    while (stats(&h.t0).regions, stats(&h.t1).regions) != (3, 3) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (s0, s1) = (stats(&h.t0), stats(&h.t1));
    assert_eq!(
        (s0.regions, s1.regions),
        (3, 3),
        "the gone app's arena is released while its call is held: {s0:?} {s1:?}"
    );
    assert_eq!(
        (s0.rpcs_in_flight, s1.rpcs_in_flight),
        (1, 0),
        "only the call its server app holds"
    );

    // The server answers: the reply is dropped, and the connection serves on.
    h.release_and_wait_dropped(1);
    let t = echo(&mut h.c, h.peer, rdmatest::VERS, 2);
    assert_eq!(h.c.wait(t, T).expect("after").accept_stat, 0);
    h.stop();
}
