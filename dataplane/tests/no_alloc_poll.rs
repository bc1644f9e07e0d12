//! A busy poll thread allocates nothing and logs nothing above debug: the daemon's loop (apps'
//! rings, the hops between the app side and the connection side, the maps of calls in flight,
//! the engine, the soft provider in memory and over TCP, its idle turns and chores) serves
//! thousands of calls, inline and through Read and Write chunks, without a single allocation
//! or an event at INFO or above once warm (a subscriber that counts them, and records nothing,
//! is the process's for the whole test, so even debug events are built and passed to it).
//!
//! The global allocator counts every allocation of the process (`stats_alloc`), so the apps
//! run in a process of their own (this binary again, running only [`app_process`]), and this
//! process does nothing else but wait for the apps' word on a pipe while the count runs.
#![forbid(unsafe_code)]

#[path = "support/poll.rs"]
mod support;

use std::alloc::System;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command as Process, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use rpcrdma_dataplane::poll::{self, Command, Event, Mesh};
use rpcrdma_shm::attach::Listener;
use rpcrdma_shm::rdmatest::{self, pattern};
use rpcrdma_shm::{Client, Server};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use support::{attach_next, expect, self_connection, spec, T};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Names the app socket for [`app_process`].
const APP_ENV: &str = "RPCRDMA_NO_ALLOC_APP";

/// Events at INFO, WARN or ERROR so far.
static LOUD: AtomicU64 = AtomicU64::new(0);

/// The process's `tracing` subscriber: every event is enabled (so the hot path's debug events
/// are built too), those at INFO or above are counted, nothing is recorded.
struct CountLoud;

impl tracing::Subscriber for CountLoud {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        // Levels order by verbosity: ERROR < WARN < INFO < DEBUG < TRACE.
        if *e.metadata().level() <= tracing::Level::INFO {
            LOUD.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn a_busy_poll_thread_allocates_nothing_and_logs_nothing_above_debug() {
    tracing::subscriber::set_global_default(CountLoud).expect("the only subscriber");
    // One after the other: the counts are the whole process's.
    for tcp in [false, true] {
        let (st, loud) = serve_and_count(tcp);
        let on = if tcp { "TCP" } else { "memory" };
        assert_eq!(
            (st.allocations, st.reallocations),
            (0, 0),
            "the poll thread ({on}) allocated while serving: {st:?}"
        );
        assert_eq!(loud, 0, "events at INFO or above while serving ({on})");
    }
    // The counter counts: starting a poll thread says so at INFO.
    assert!(
        LOUD.load(Ordering::Relaxed) > 0,
        "no INFO event counted at all"
    );
}

/// Runs a poll thread (soft provider in memory, or over TCP loopback) for the apps of
/// [`app_process`] and counts the process's allocations, and its events at INFO or above,
/// while it serves them, once warm.
fn serve_and_count(tcp: bool) -> (stats_alloc::Stats, u64) {
    let dir = std::env::temp_dir().join(format!("rpcrdma-noalloc-{}-{tcp}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("app.sock");
    let mut mesh = Mesh::new(1, 2, 1, 64).expect("mesh");
    let port = mesh.port(0).expect("port");
    let soft = rpcrdma_verbs::soft::SoftConfig::default();
    let h = if tcp {
        poll::spawn_soft(spec(0), port, soft, Box::new(|| {}))
    } else {
        poll::spawn_mem(spec(0), port, soft, Box::new(|| {}))
    }
    .expect("thread");
    expect(&h, "Started", |e| {
        matches!(e, Event::Started { .. }).then_some(())
    });
    let _conn = self_connection(&h);
    let mut apps = Listener::bind(&path, spec(0).geometry, vec!["self".into()]).expect("bind");
    let mut app = Process::new(std::env::current_exe().expect("this test binary"))
        .args([
            "--exact",
            "app_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(APP_ENV, &path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the app process");
    // Its server, then its client.
    for _ in 0..2 {
        attach_next(&mut apps, &h);
    }
    let mut out = BufReader::new(app.stdout.take().expect("stdout"));
    // Everything it says, kept for a failure's message, in room reserved beforehand.
    let mut said = String::with_capacity(1 << 16);
    let mut until = |word: &str, said: &mut String| loop {
        let from = said.len();
        let n = out.read_line(said).expect("the app's output");
        assert!(
            n > 0,
            "the app process ended before saying {word:?}:\n{said}"
        );
        // libtest writes "test app_process ... " before the first word, on its line.
        if said[from..].trim_end().ends_with(word) {
            return;
        }
    };
    until("warm", &mut said);
    let (region, loud) = (Region::new(GLOBAL), LOUD.load(Ordering::Relaxed));
    measuring();
    until("done", &mut said);
    let (st, loud) = (region.change(), LOUD.load(Ordering::Relaxed) - loud);
    measured();
    // Only now may the apps go (their going is the thread's business, not the count's).
    drop(app.stdin.take());
    assert!(
        app.wait().expect("wait").success(),
        "the app process failed"
    );
    let stats = support::stats(&h);
    assert!(
        stats.totals.calls_out >= 22_000 && stats.totals.replies_out >= 22_000,
        "{stats:?}"
    );
    let _ = h.send(Command::Stop);
    let _ = std::fs::remove_dir_all(&dir);
    (st, loud)
}

/// The apps of [`a_busy_poll_thread_allocates_nothing_and_logs_nothing_above_debug`], which runs this in a process of its
/// own: an RDMATEST server and a client keeping ECHOs in flight over the poll thread's
/// connection to itself, 32 of 64 bytes inline, 8 of 64 KiB through Read and Write chunks. It says
/// "warm" once the thread has seen every kind of call, and "done" after 20 000 more inline
/// calls and 2 000 more chunked ones.
#[test]
#[ignore = "the app side of a_busy_poll_thread_allocates_nothing_and_logs_nothing_above_debug, which runs it"]
fn app_process() {
    let path = std::env::var_os(APP_ENV).expect(
        "run by a_busy_poll_thread_allocates_nothing_and_logs_nothing_above_debug (socket)",
    );
    let mut s = Server::connect(&path).expect("server");
    s.receive_buffers(16, 80 * 1024);
    s.start(rdmatest::PROG, rdmatest::VERS).expect("register");
    std::thread::spawn(move || {
        let _ = s.serve(rdmatest::PROG, rdmatest::VERS, rdmatest::handle);
    });
    let mut c = Client::connect(&path).expect("client");
    let peer = c.peer("self").expect("peer");
    let small = pattern(1, 64);
    let big = pattern(2, 64 << 10);
    // 32 small calls in flight, 8 large ones (each holds 128 KiB of the 4 MiB arena).
    let echo = |c: &mut Client, calls: u32, data: &[u8]| {
        let submit = |c: &mut Client| {
            let mut call = c.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::ECHO);
            if data.len() > 1024 {
                call.args().put_ddp_opaque(data);
                call.result_buffer(data.len() as u32);
            } else {
                call.args().put_opaque(data);
                call.max_reply(data.len() as u32 + 64);
            }
            call.submit().expect("submit")
        };
        let depth = if data.len() > 1024 { 8 } else { 32 }.min(calls);
        for _ in 0..depth {
            submit(c);
        }
        let mut sent = depth;
        for _ in 0..calls {
            let (_, r) = c.wait_any(T).expect("a reply");
            let r = r.expect("the call");
            assert_eq!((r.accept_stat, r.body.len()), (0, 4 + data.len()));
            if sent < calls {
                submit(c);
                sent += 1;
            }
        }
    };
    echo(&mut c, 5_000, &small);
    echo(&mut c, 500, &big);
    echo(&mut c, 1_000, &small);
    say("warm");
    echo(&mut c, 20_000, &small);
    echo(&mut c, 2_000, &big);
    say("done");
    // Attached until the count is taken: the test closes our input then.
    let _ = std::io::stdin().read_line(&mut String::new());
}

fn say(word: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{word}").expect("stdout");
    out.flush().expect("stdout");
}

/// Where the count starts and ends, for a debugger: with breakpoints on `malloc` and
/// `realloc` set once `measuring` is hit and removed at `measured`, their backtraces show
/// what was counted.
#[inline(never)]
fn measuring() {
    std::hint::black_box(());
}

/// See [`measuring`].
#[inline(never)]
fn measured() {
    std::hint::black_box(());
}
