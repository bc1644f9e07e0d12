//! Real processes, real shared memory: the `shm-loopback` harness (standing in for the dataplane's
//! routing), RDMATEST server apps and clients, kill -9, hostile apps and the C example.

mod common;

use common::{app, app_env, eventually, harness, settled, sock, stats, xdr_opaque, SERVER_RECVS};
use rpcrdma_shm::abi::status;
use rpcrdma_shm::client::Error;
use rpcrdma_shm::rdmatest::{self, pattern};
use rpcrdma_shm::{Client, WaitPolicy};
use std::io::{BufRead, BufReader};
use std::time::Duration;

const T: Option<Duration> = Some(Duration::from_secs(30));

fn client(path: &std::path::Path) -> (Client, u32) {
    let c = Client::connect(path).expect("attach");
    let peer = c.peer("loopback").expect("loopback peer");
    (c, peer)
}

#[test]
fn rdmatest_null_echo_read_write_through_loopback() {
    let path = sock("basic");
    let _h = harness(&path);
    let _s = app("server", &path, &[]);
    let (mut c, peer) = client(&path);

    let t = c
        .call(peer, rdmatest::PROG, 1, rdmatest::NULL)
        .submit()
        .unwrap();
    let r = c.wait(t, T).unwrap();
    assert_eq!((r.accept_stat, r.body.len()), (0, 0));

    // ECHO, short: no result buffer, so the result comes back inline.
    let data = pattern(5, 37);
    let mut b = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
    b.args().put_opaque(&data);
    let r = {
        let t = b.submit().unwrap();
        c.wait(t, T)
    }
    .unwrap();
    assert_eq!(r.body, xdr_opaque(&data));
    assert_eq!(r.ddp_bytes, 0);

    // ECHO, large: DDP-eligible argument piece out, result placed in the result buffer (Write-chunk path).
    let data = pattern(11, 9001);
    let mut b = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
    b.args().put_ddp_opaque(&data);
    b.result_buffer(16384);
    let r = {
        let t = b.submit().unwrap();
        c.wait(t, T)
    }
    .unwrap();
    assert_eq!(r.body, xdr_opaque(&data));
    assert_eq!(r.ddp_bytes, 9001);

    // READ: count bytes of pattern(seed) into the result buffer.
    let mut b = c.call(peer, rdmatest::PROG, 1, rdmatest::READ);
    b.args().put_u32(5000).put_u32(9);
    b.result_buffer(5000);
    let r = {
        let t = b.submit().unwrap();
        c.wait(t, T)
    }
    .unwrap();
    assert_eq!(r.body, xdr_opaque(&pattern(9, 5000)));
    assert_eq!(r.ddp_bytes, 5000);

    // WRITE: the server counts bytes matching pattern(seed); 10 are spoiled.
    let mut data = pattern(3, 3000);
    for b in &mut data[100..110] {
        *b = !*b;
    }
    let mut b = c.call(peer, rdmatest::PROG, 1, rdmatest::WRITE);
    b.args().put_u32(3).put_ddp_opaque(&data);
    let r = {
        let t = b.submit().unwrap();
        c.wait(t, T)
    }
    .unwrap();
    assert_eq!(r.body, 2990u32.to_be_bytes());

    // App-supplied XID is used as given.
    let mut b = c.call(peer, rdmatest::PROG, 1, rdmatest::NULL);
    b.xid(0xabcd_0123);
    assert_eq!(
        {
            let t = b.submit().unwrap();
            c.wait(t, T)
        }
        .unwrap()
        .xid,
        0xabcd_0123
    );
}

#[test]
fn yielding_waits_take_completions_that_arrive_while_they_spin() {
    let path = sock("yield");
    let _h = harness(&path);
    // Both apps yield-spin for a minute, far longer than any round trip: neither ever needs to sleep.
    let _s = app_env(
        "server",
        &path,
        &[],
        &[
            ("SHM_TESTAPP_SPIN_US", "60000000"),
            ("SHM_TESTAPP_YIELD", "1"),
        ],
    );
    let (mut c, peer) = client(&path);
    c.set_wait(WaitPolicy::yielding(Duration::from_secs(60)));
    for i in 0..200u32 {
        let data = pattern(i, 1 + i as usize % 64);
        let mut b = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
        b.args().put_opaque(&data);
        let t = b.submit().unwrap();
        let r = c.wait(t, T).unwrap();
        assert_eq!((r.accept_stat, r.body), (0, xdr_opaque(&data)));
    }
    assert_eq!(
        c.sleeps(),
        0,
        "every completion was taken from the ring while yield-spinning"
    );
}

#[test]
fn yielding_wait_ends_at_its_deadline_and_then_sleeps_past_its_window() {
    let path = sock("yield-deadline");
    let _h = harness(&path);
    let _hole = app("blackhole", &path, &[]);
    let (mut c, peer) = client(&path);
    // The call is never answered. A deadline inside the spin window ends the wait without sleeping.
    c.set_wait(WaitPolicy::yielding(Duration::from_secs(3600)));
    let t = c.call(peer, rdmatest::CB_PROG, 1, 1).submit().unwrap();
    assert!(matches!(
        c.wait(t, Some(Duration::from_millis(50))),
        Err(Error::Timeout)
    ));
    assert_eq!(c.sleeps(), 0);
    // A short window passes empty: the wait goes to sleep on its socket (and still times out).
    c.set_wait(WaitPolicy::yielding(Duration::from_micros(200)));
    assert!(matches!(
        c.wait(t, Some(Duration::from_millis(50))),
        Err(Error::Timeout)
    ));
    assert_eq!(c.sleeps(), 1);
}

/// A wait that sleeps ends at its deadline, not at the next whole millisecond: the best of 20
/// waits of 200 µs ends well before 1 ms (each lasted at least 1 ms when sleeps were rounded up to
/// milliseconds), and none ends before its deadline. The best of 20, not each, so a loaded
/// machine that runs the thread late now and then does not fail it.
#[test]
fn a_sleeping_wait_ends_at_a_sub_millisecond_deadline() {
    let path = sock("sleep-deadline");
    let _h = harness(&path);
    let _hole = app("blackhole", &path, &[]);
    let (mut c, peer) = client(&path);
    c.set_wait(WaitPolicy::spin(Duration::ZERO));
    let t = c.call(peer, rdmatest::CB_PROG, 1, 1).submit().unwrap();
    let deadline = Duration::from_micros(200);
    let mut best = Duration::MAX;
    for _ in 0..20 {
        let t0 = std::time::Instant::now();
        assert!(matches!(c.wait(t, Some(deadline)), Err(Error::Timeout)));
        let took = t0.elapsed();
        assert!(took >= deadline, "{took:?}");
        best = best.min(took);
    }
    assert!(best < Duration::from_micros(900), "best of 20: {best:?}");
    assert!(c.sleeps() >= 20);
}

#[test]
fn callback_program_registered_for_the_backward_direction_receives_calls() {
    let path = sock("callback");
    let _h = harness(&path);
    let _cb = app("callback", &path, &[]);
    let (mut c, peer) = client(&path);
    // A second backchannel registration of the same program is refused; a forward one is separate.
    let mut dup = rpcrdma_shm::Server::connect(&path).unwrap();
    assert!(matches!(
        dup.register(rdmatest::CB_PROG, 1, true),
        Err(Error::Status(status::ALREADY_REGISTERED))
    ));
    let mut b = c.call(peer, rdmatest::CB_PROG, 1, 1);
    b.args().put_opaque(b"ping!");
    let r = {
        let t = b.submit().unwrap();
        c.wait(t, T).unwrap()
    };
    assert_eq!(r.body, xdr_opaque(b"ping!"));
}

#[test]
fn unroutable_calls_fail_with_error_codes() {
    let path = sock("errors");
    let _h = harness(&path);
    let _s = app("server", &path, &[]);
    let (mut c, peer) = client(&path);

    let t = c.call(peer, 0x4000_0000, 1, 0).submit().unwrap();
    assert!(matches!(
        c.wait(t, T),
        Err(Error::Status(status::UNKNOWN_PROGRAM))
    ));

    let t = c.call(peer + 1, rdmatest::PROG, 1, 0).submit().unwrap();
    assert!(matches!(
        c.wait(t, T),
        Err(Error::Status(status::UNKNOWN_PEER))
    ));

    // Reply larger than the reply buffer, and no result buffer to take the data.
    let mut b = c.call(peer, rdmatest::PROG, 1, rdmatest::READ);
    b.args().put_u32(8000).put_u32(1);
    b.max_reply(1024);
    assert!(matches!(
        {
            let t = b.submit().unwrap();
            c.wait(t, T)
        },
        Err(Error::Status(status::REPLY_TOO_LARGE))
    ));

    // Arguments larger than every receive buffer the server posted (64 KiB).
    let mut b = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
    b.args().put_ddp_opaque(&vec![1u8; 100_000]);
    assert!(matches!(
        {
            let t = b.submit().unwrap();
            c.wait(t, T)
        },
        Err(Error::Status(status::NO_RECV_BUFFER))
    ));

    // Garbage arguments reach the server, which answers GARBAGE_ARGS; the call itself succeeds.
    let mut b = c.call(peer, rdmatest::PROG, 1, rdmatest::READ);
    b.args().put_u32(1);
    let r = {
        let t = b.submit().unwrap();
        c.wait(t, T)
    }
    .unwrap();
    assert_eq!(r.accept_stat, rdmatest::GARBAGE_ARGS);
}

#[test]
fn backpressure_many_outstanding_calls_all_complete_in_full() {
    let path = sock("backpressure");
    let _h = harness(&path);
    let _s = app("server", &path, &[]);
    let (mut c, peer) = client(&path);
    let total = 2000u32;
    let (mut sent, mut got, mut ring_full) = (0u32, 0u32, 0u32);
    let mut expect = std::collections::HashMap::new();
    while got < total {
        while sent < total {
            let data = pattern(sent, (sent % 200) as usize);
            let mut b = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
            b.args().put_opaque(&data);
            match b.submit() {
                Ok(t) => {
                    expect.insert(t, xdr_opaque(&data));
                    sent += 1;
                }
                Err(Error::RingFull) | Err(Error::ArenaFull) => {
                    ring_full += 1;
                    break;
                }
                Err(e) => panic!("submit: {e}"),
            }
        }
        let (t, r) = c.wait_any(T).unwrap();
        assert_eq!(r.unwrap().body, expect.remove(&t).unwrap());
        got += 1;
    }
    assert!(expect.is_empty());
    assert!(ring_full > 0, "the test never filled the ring");
}

#[test]
fn stalled_app_is_held_by_backpressure_while_others_keep_working() {
    let path = sock("stalled");
    let _h = harness(&path);
    let _s = app("server", &path, &[]);
    let (mut lazy, peer) = client(&path);
    // Keep submitting, never draining completions, until the daemon holds completions in its backlog and
    // the submission ring stays full.
    let mut n = 0u32;
    assert!(eventually(|| loop {
        let mut b = lazy.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
        b.args().put_opaque(&n.to_be_bytes());
        match b.submit() {
            Ok(_) => n += 1,
            Err(Error::RingFull) => break stats(&path)["backlog"] > 0,
            Err(e) => panic!("{e}"),
        }
    }));
    let (mut busy, _) = client(&path);
    for i in 0..50u32 {
        let mut b = busy.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
        b.args().put_opaque(&i.to_be_bytes());
        assert_eq!(
            {
                let t = b.submit().unwrap();
                busy.wait(t, T)
            }
            .unwrap()
            .body,
            xdr_opaque(&i.to_be_bytes())
        );
    }
    // Nothing was dropped: every one of the lazy app's calls completes once it drains.
    let mut done = 0;
    while done < n {
        let (_, r) = lazy.wait_any(T).unwrap();
        assert_eq!(r.unwrap().accept_stat, 0);
        done += 1;
    }
    assert!(eventually(|| stats(&path)["backlog"] == 0));
}

#[test]
fn app_that_stops_draining_is_evicted_and_its_memory_released() {
    let path = sock("evict");
    let _h = common::harness_with_stall_limit(&path, 300);
    let _s = app("server", &path, &[]);
    let base = settled(&path, SERVER_RECVS);
    let (mut lazy, peer) = client(&path);
    let mut n = 0u32;
    // Fill the completion ring and then some, never draining: the harness starts a backlog, then evicts.
    let evicted = eventually(|| loop {
        let mut b = lazy.call(peer, rdmatest::PROG, 1, rdmatest::NULL);
        b.xid(n);
        match b.submit() {
            Ok(_) => n += 1,
            Err(Error::RingFull) => break false,
            Err(Error::Detached) => break true,
            Err(e) => panic!("{e}"),
        }
    });
    assert!(evicted, "never evicted after {n} calls");
    assert!(eventually(|| {
        let s = stats(&path);
        s["apps"] == base["apps"] && s["regions"] == base["regions"] && s["ops"] == base["ops"]
    }));
    // The server and new clients are unaffected.
    let (mut c, _) = client(&path);
    let t = c
        .call(peer, rdmatest::PROG, 1, rdmatest::NULL)
        .submit()
        .unwrap();
    assert_eq!(c.wait(t, T).unwrap().accept_stat, 0);
}

#[test]
fn kill9_app_with_calls_in_flight_returns_counts_to_baseline() {
    let path = sock("kill9");
    let _h = harness(&path);
    let empty = stats(&path);
    let mut hole = app("blackhole", &path, &[]);
    let base = settled(&path, SERVER_RECVS);
    assert_eq!(base["apps"], empty["apps"] + 1);
    let mut victim = app("inflight", &path, &["16"]);
    assert!(eventually(|| {
        let s = stats(&path);
        s["apps"] == base["apps"] + 1 && s["ops"] == base["ops"] + 16
    }));
    victim.kill9();
    assert!(eventually(|| {
        let s = stats(&path);
        s["apps"] == base["apps"] && s["ops"] == base["ops"] && s["regions"] == base["regions"]
    }));
    // The server still holds the dead app's calls; when it dies too, their replies are dropped, counted.
    hole.kill9();
    assert!(eventually(|| {
        let s = stats(&path);
        s["apps"] == empty["apps"] && s["ops"] == empty["ops"] && s["regions"] == empty["regions"]
    }));
    assert!(stats(&path)["stale"] >= 16);
}

#[test]
fn kill9_server_mid_call_cancels_the_callers_call() {
    let path = sock("srvdie");
    let _h = harness(&path);
    let mut hole = app("blackhole", &path, &[]);
    settled(&path, SERVER_RECVS);
    let (mut c, peer) = client(&path);
    let mut b = c.call(peer, rdmatest::CB_PROG, 1, 1);
    b.args().put_opaque(b"ping");
    let t = b.submit().unwrap();
    // The blackhole's receive buffers plus our call, which is routed in the step that accepts it.
    assert!(eventually(|| stats(&path)["ops"] > SERVER_RECVS));
    hole.kill9();
    assert!(matches!(
        c.wait(t, T),
        Err(Error::Status(status::CANCELLED))
    ));
}

/// Calls the server never answers end when their app cancels them, or at their time limit,
/// each once, with its own status; the harness then holds nothing of the caller's.
#[test]
fn cancelled_and_timed_out_calls_end_once_with_their_status() {
    let path = sock("cancel");
    let _h = harness(&path);
    let _hole = app("blackhole", &path, &[]);
    let base = settled(&path, SERVER_RECVS);
    let (mut c, peer) = client(&path);
    let mut b = c.call(peer, rdmatest::CB_PROG, 1, 1);
    b.args().put_opaque(b"held");
    let held = b.submit().unwrap();
    let mut b = c.call(peer, rdmatest::CB_PROG, 1, 1);
    b.timeout(Duration::from_millis(100));
    let timed = b.submit().unwrap();
    let t0 = std::time::Instant::now();
    assert!(eventually(|| stats(&path)["ops"] == base["ops"] + 2));
    // A wait's own deadline leaves the call in flight.
    assert!(matches!(
        c.wait(held, Some(Duration::from_millis(20))),
        Err(Error::Timeout)
    ));
    c.cancel(held).unwrap();
    assert!(matches!(
        c.wait(held, T),
        Err(Error::Status(status::CANCELLED))
    ));
    assert!(matches!(
        c.wait(timed, T),
        Err(Error::Status(status::TIMEOUT))
    ));
    assert!(t0.elapsed() >= Duration::from_millis(100));
    assert!(matches!(c.cancel(held), Err(Error::UnknownTicket)));
    assert_eq!(c.in_flight(), 0);
    assert!(eventually(|| stats(&path)["ops"] == base["ops"]));
    assert_eq!(stats(&path)["bad"], base["bad"]);
}

#[test]
fn hostile_apps_cannot_crash_the_daemon_and_others_keep_working() {
    let path = sock("hostile");
    let mut h = harness(&path);
    let _s = app("server", &path, &[]);
    let (mut c, peer) = client(&path);
    let base = settled(&path, SERVER_RECVS);
    let hostiles: Vec<_> = (1..=3)
        .map(|seed| {
            std::process::Command::new(env!("CARGO_BIN_EXE_shm-testapp"))
                .args(["hostile", path.to_str().unwrap(), &seed.to_string(), "3"])
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut i = 0u32;
    let mut hostiles: Vec<common::Proc> = hostiles.into_iter().map(common::Proc).collect();
    while hostiles.iter_mut().any(|p| p.alive()) || i < 200 {
        let data = pattern(i, (i % 300) as usize);
        let mut b = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
        b.args().put_opaque(&data);
        assert_eq!(
            {
                let t = b.submit().unwrap();
                c.wait(t, T)
            }
            .unwrap()
            .body,
            xdr_opaque(&data)
        );
        i += 1;
    }
    for p in &mut hostiles {
        assert!(p.0.wait().unwrap().success());
    }
    assert!(h.alive());
    assert!(
        eventually(|| {
            let s = stats(&path);
            s["apps"] == base["apps"] && s["regions"] == base["regions"] && s["ops"] == base["ops"]
        }),
        "base {base:?} now {:?}",
        stats(&path)
    );
    assert!(stats(&path)["bad"] > 1000);
    let t = c
        .call(peer, rdmatest::PROG, 1, rdmatest::NULL)
        .submit()
        .unwrap();
    assert_eq!(c.wait(t, T).unwrap().accept_stat, 0);
}

/// Compiles `examples/c/NAME.c` as the C binding's users would (strict C11, every warning an
/// error) into a temporary executable.
fn compile_c_example(name: &str) -> std::path::PathBuf {
    let dir = env!("CARGO_MANIFEST_DIR");
    let exe = std::env::temp_dir().join(format!("rpcrdma-c-{name}-{}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = std::process::Command::new(cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-I"])
        .arg(format!("{dir}/include"))
        .arg(format!("{dir}/examples/c/{name}.c"))
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("run cc");
    assert!(st.success(), "C example {name} did not compile");
    exe
}

#[test]
fn c_example_client_runs_against_the_harness() {
    let path = sock("cexample");
    let _h = harness(&path);
    let _s = app("server", &path, &[]);
    let exe = compile_c_example("client");
    let out = std::process::Command::new(&exe)
        .arg(&path)
        .arg("loopback")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&exe);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "C client failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text == "NULL ok\nECHO ok\nREAD ok\nTIMEOUT ok\nCANCEL ok\n",
        "{text}"
    );
}

/// `examples/c/server.c` serves RDMATEST to a Rust client: every procedure, results marked
/// DDP-eligible reaching result buffers, hostile arguments answered GARBAGE_ARGS, an unknown
/// procedure PROC_UNAVAIL, 300 calls with more in flight than it has slots (its receive
/// buffers are lent again as their replies complete); when the daemon goes away it says how
/// many replies it sent and exits 0.
#[test]
fn c_example_server_serves_rdmatest() {
    let path = sock("cserver");
    let mut h = harness(&path);
    let exe = compile_c_example("server");
    // Its output is read to the end: it prints again when it stops.
    let mut child = std::process::Command::new(&exe)
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the C server");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut srv = common::Proc(child);
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("ready"));
    let _ = std::fs::remove_file(&exe);
    let (mut c, peer) = client(&path);
    let mut call = |proc_: u32, build: &dyn Fn(&mut rpcrdma_shm::client::CallBuilder<'_>)| {
        let mut b = c.call(peer, rdmatest::PROG, 1, proc_);
        build(&mut b);
        let t = b.submit().unwrap();
        c.wait(t, T).unwrap()
    };
    let mut replies = 0u32;
    let r = call(rdmatest::NULL, &|_| {});
    assert_eq!((r.accept_stat, r.body.len()), (0, 0));
    replies += 1;
    for n in [0usize, 1, 3000, 60_000] {
        let data = pattern(n as u32, n);
        let r = call(rdmatest::ECHO, &|b| {
            b.args().put_ddp_opaque(&data);
            b.result_buffer(n as u32);
        });
        assert_eq!(r.accept_stat, 0, "ECHO {n}");
        assert_eq!(r.body, xdr_opaque(&data), "ECHO {n}");
        assert_eq!(
            r.ddp_bytes, n as u32,
            "ECHO {n}: the marked result in the result buffer"
        );
        let r = call(rdmatest::ECHO, &|b| {
            b.args().put_opaque(&data);
            b.max_reply(n as u32 + 8);
        });
        assert_eq!(
            r.body,
            xdr_opaque(&data),
            "ECHO {n} with no result buffer: inline"
        );
        replies += 2;
    }
    let r = call(rdmatest::READ, &|b| {
        b.args().put_u32(200_000).put_u32(7);
        b.result_buffer(200_000);
    });
    assert_eq!(r.body, xdr_opaque(&pattern(7, 200_000)));
    assert_eq!(r.ddp_bytes, 200_000);
    let mut data = pattern(5, 5000);
    let r = call(rdmatest::WRITE, &|b| {
        b.args().put_u32(5).put_ddp_opaque(&data);
    });
    assert_eq!(r.body, 5000u32.to_be_bytes());
    data[10] ^= 1;
    data[4000] ^= 1;
    let r = call(rdmatest::WRITE, &|b| {
        b.args().put_u32(5).put_ddp_opaque(&data);
    });
    assert_eq!(r.body, 4998u32.to_be_bytes());
    let r = call(rdmatest::SLEEP, &|b| {
        b.args().put_u32(2000);
    });
    assert_eq!((r.accept_stat, r.body.len()), (0, 0));
    replies += 4;
    // Hostile arguments: lengths beyond what arrived, a READ beyond the server's limit, words
    // missing; then a procedure it does not have.
    let garbage: [(u32, &[u32]); 6] = [
        (rdmatest::ECHO, &[100, 0]),
        (rdmatest::ECHO, &[]),
        (rdmatest::READ, &[1 << 20, 1]),
        (rdmatest::READ, &[5]),
        (rdmatest::WRITE, &[1, 0xffff_fffc]),
        (rdmatest::SLEEP, &[]),
    ];
    for (proc_, words) in garbage {
        let r = call(proc_, &|b| {
            for w in words {
                b.args().put_u32(*w);
            }
        });
        assert_eq!(
            r.accept_stat,
            rdmatest::GARBAGE_ARGS,
            "proc {proc_} {words:?}"
        );
        assert!(r.body.is_empty());
    }
    let r = call(9, &|_| {});
    assert_eq!(r.accept_stat, rdmatest::PROC_UNAVAIL);
    replies += 7;
    // More calls in flight than the server has slots (8).
    let mut out = std::collections::HashMap::new();
    let (mut sent, mut done) = (0u32, 0u32);
    while done < 300 {
        while sent < 300 && out.len() < 24 {
            let d = pattern(sent, 1 + sent as usize * 41 % 5000);
            let mut b = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
            b.args().put_opaque(&d);
            b.max_reply(d.len() as u32 + 8);
            out.insert(b.submit().unwrap(), d);
            sent += 1;
        }
        let (t, r) = c.wait_any(T).unwrap();
        assert_eq!(r.unwrap().body, xdr_opaque(&out.remove(&t).unwrap()));
        done += 1;
    }
    replies += 300;
    // The daemon goes away: the server ends on its own, having counted its replies' completions
    // (the last few may not have reached it before the daemon died: at most one per slot).
    h.kill9();
    let last = lines.next().and_then(Result::ok).unwrap_or_default();
    let n: u32 = last
        .strip_prefix("detached after ")
        .and_then(|l| l.strip_suffix(" replies"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("last line {last:?}"));
    assert!(
        (replies - 8..=replies).contains(&n),
        "{n} of {replies} replies"
    );
    assert!(srv.0.wait().expect("wait").success());
}

/// Sleeps until one of `fds` is readable; false if 10 s pass first.
fn sleep_on(fds: &[std::os::fd::BorrowedFd<'_>]) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut p: Vec<PollFd<'_>> = fds.iter().map(|f| PollFd::new(f, PollFlags::IN)).collect();
    let ten_s = Timespec {
        tv_sec: 10,
        tv_nsec: 0,
    };
    poll(&mut p, Some(&ten_s)).unwrap() > 0
}

/// ABI.md §5 "Event loops": a client and a server in one thread, neither ever blocking in the
/// API, both asleep in the app's own poll(2) on their descriptors between completions. Fails
/// (a 10 s sleep with nothing) if `arm` does not make the harness write the wake-up byte.
#[test]
fn a_client_and_a_server_share_one_event_loop_on_their_descriptors() {
    use std::os::fd::AsFd;
    let path = sock("evloop");
    let _h = harness(&path);
    let mut srv = rpcrdma_shm::Server::connect(&path).unwrap();
    srv.receive_buffers(4, 4096);
    srv.start(rdmatest::PROG, 1).unwrap();
    let (mut c, peer) = client(&path);
    let (calls, in_flight) = (200u32, 8u32);
    let mut tickets = std::collections::HashMap::new();
    let submit = |c: &mut Client, i: u32, tickets: &mut std::collections::HashMap<_, _>| {
        let data = pattern(i, 100 + i as usize % 300);
        let mut b = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
        b.args().put_opaque(&data);
        tickets.insert(b.submit().unwrap(), data);
    };
    let mut sent = 0;
    while sent < in_flight {
        submit(&mut c, sent, &mut tickets);
        sent += 1;
    }
    let (mut done, mut served, mut sleeps) = (0u32, 0u64, 0u32);
    while done < calls {
        served += srv.serve_ready(rdmatest::handle).unwrap();
        while let Some((t, r)) = c.poll().unwrap() {
            let data = tickets.remove(&t).expect("a ticket of ours, once");
            assert_eq!(r.unwrap().body, xdr_opaque(&data));
            done += 1;
            if sent < calls {
                submit(&mut c, sent, &mut tickets);
                sent += 1;
            }
        }
        if done == calls {
            break;
        }
        // Both must be armed before either sleeps; one with work waiting skips the sleep.
        if srv.arm().unwrap() && c.arm().unwrap() {
            assert!(
                sleep_on(&[srv.as_fd(), c.as_fd()]),
                "no wake-up in 10 s: {done} of {calls} calls done, {served} served"
            );
            sleeps += 1;
        }
    }
    assert_eq!(served, u64::from(calls));
    assert!(tickets.is_empty());
    // The calls crossed a process boundary both ways: the loop slept while they did.
    assert!(sleeps > 0, "the loop never slept");
    // Armed and disarmed as often as it slept, the client's own waits still work.
    let t = c
        .call(peer, rdmatest::PROG, 1, rdmatest::NULL)
        .submit()
        .unwrap();
    let mut late = 0;
    while late == 0 {
        if srv.arm().unwrap() {
            assert!(sleep_on(&[srv.as_fd()]), "the server was not woken");
        }
        late += srv.serve_ready(rdmatest::handle).unwrap();
    }
    assert_eq!(late, 1);
    assert_eq!(c.wait(t, T).unwrap().accept_stat, 0);
}

/// A client asleep on its descriptor wakes when the daemon goes away, and its next poll says
/// so (instead of sleeping again on a dead socket).
#[test]
fn an_armed_client_wakes_and_learns_the_daemon_is_gone() {
    use std::os::fd::AsFd;
    let path = sock("evloop-gone");
    let mut h = harness(&path);
    let _s = app("blackhole", &path, &[]);
    let (mut c, peer) = client(&path);
    // A call the blackhole takes and never answers: the client has nothing to poll and sleeps.
    c.call(peer, rdmatest::CB_PROG, 1, 0).submit().unwrap();
    assert!(c.arm().unwrap());
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        h.kill9();
    });
    // A wake-up without a completion may come first (arm again); the loop must end with
    // Detached, not sleep on a dead socket.
    let gone = loop {
        assert!(sleep_on(&[c.as_fd()]), "no wake-up when the daemon died");
        match c.poll() {
            Err(Error::Detached) => break true,
            Ok(None) => {}
            other => panic!("{other:?}"),
        }
        if !c.arm().is_ok_and(|sleep| sleep) {
            break matches!(c.poll(), Err(Error::Detached));
        }
    };
    assert!(gone);
    killer.join().unwrap();
}

/// A server that registers more programs while calls for its first one are arriving: the
/// calls read while waiting for one registration's answer are kept for later, the next
/// registration still gets its answer (it once read its own stash forever), and the kept
/// calls are served.
#[test]
fn registering_while_calls_arrive_keeps_the_calls_and_gets_every_answer() {
    let path = sock("register-busy");
    let _h = harness(&path);
    let mut s = rpcrdma_shm::Server::connect(&path).expect("server attach");
    s.receive_buffers(4, 4096);
    s.start(rdmatest::PROG, 1).expect("register RDMATEST");
    let (mut c, peer) = client(&path);
    let tickets: Vec<_> = (0..2u32)
        .map(|i| {
            let mut b = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
            b.args().put_opaque(&pattern(i, 32));
            b.submit().expect("submit")
        })
        .collect();
    // Several registrations in a row: the calls come in while one of them waits, and the
    // registrations after it start with those calls kept aside.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for prog in 0x2000_6000..0x2000_6006 {
            s.register(prog, 1, false).expect("register");
        }
        let _ = tx.send(s);
    });
    let mut s = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("every registration answered");
    let mut served = 0;
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while served < 2 {
        served += s.serve_ready(rdmatest::handle).expect("serve");
        assert!(std::time::Instant::now() < end, "the calls were lost");
    }
    for (i, t) in tickets.into_iter().enumerate() {
        let r = c.wait(t, T).expect("reply");
        assert_eq!(r.body, xdr_opaque(&pattern(i as u32, 32)));
    }
}
