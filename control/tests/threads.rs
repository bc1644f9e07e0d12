//! Several poll threads in one daemon: apps and connections on different threads, calls
//! and served calls handed between them as messages (`dataplane/src/poll/mesh.rs`).
//!
//! The common test config runs two poll threads (`cpu.poll-cores = [0, 1]`). Placement is
//! deterministic: listeners go to threads round robin from 0, peers after them, and each app
//! to the thread with the fewest apps (the first to thread 0). These tests arrange each
//! crossing on purpose and check from `rpcrdmactl` that it really crosses.

mod common;

use common::{back_to, eventually, rdmatest_serve, settled, xdr_opaque, Daemon};
use rpcrdma_shm::rdmatest::{self, pattern};
use rpcrdma_shm::Client;
use std::time::Duration;

const T: Option<Duration> = Some(Duration::from_secs(30));

/// Two daemons of two poll threads each, A connected to B.
fn pair(name: &str) -> (Daemon, Daemon) {
    let b = Daemon::start(&format!("{name}-b"), None);
    let a = Daemon::start(&format!("{name}-a"), Some(("server", b.port)));
    a.wait_peer_up("server");
    assert_eq!(common::threads(&a), 2);
    (a, b)
}

/// The poll thread of the daemon's only connection.
fn conn_thread(d: &Daemon) -> u64 {
    let c = d.ctl_json(&["conns"]);
    c[0]["thread"].as_u64().unwrap_or_else(|| panic!("{c}"))
}

/// Apps attached to each poll thread.
fn apps_per_thread(d: &Daemon) -> Vec<u64> {
    let s = d.ctl_json(&["stats"]);
    s["threads"]
        .as_array()
        .expect("threads")
        .iter()
        .map(|t| t["apps"].as_u64().expect("apps"))
        .collect()
}

/// ECHO of `len` bytes: with `ddp`, a DDP-eligible argument (Read chunk) and a result buffer
/// (Write chunk); without, a plain message (long ones go as a Position-zero Read chunk and
/// come back in a Reply chunk).
fn echo(c: &mut Client, peer: u32, seed: u32, len: usize, ddp: bool, a: &Daemon, b: &Daemon) {
    let data = pattern(seed, len);
    let mut call = c.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::ECHO);
    if ddp {
        call.args().put_ddp_opaque(&data);
        call.result_buffer(len as u32);
    } else {
        call.args().put_opaque(&data);
        call.max_reply(len as u32 + 1024);
    }
    let t = call.submit().expect("submit");
    let r = c
        .wait(t, T)
        .unwrap_or_else(|e| panic!("ECHO {len}: {e:?}\nA:\n{}\nB:\n{}", a.log(), b.log()));
    assert_eq!(r.accept_stat, 0, "ECHO {len}");
    assert_eq!(r.body, xdr_opaque(&data), "ECHO of {len} bytes");
}

#[test]
fn calls_and_served_calls_cross_poll_threads_in_every_transfer_mode() {
    let (a, b) = pair("xthread");
    // B accepted on its thread 0; a first (idle) app takes B's thread 0, so the server app
    // lands on thread 1: every served call crosses from the connection's thread to the app's.
    let _idle = Client::connect(&b.app).expect("attach");
    let _server = rdmatest_serve(&b.app);
    assert_eq!(conn_thread(&b), 0);
    assert_eq!(apps_per_thread(&b), vec![1, 1]);
    // A's connection is on its thread 1 (after the listener); two caller apps, one per thread.
    assert_eq!(conn_thread(&a), 1);
    let mut c0 = Client::connect(&a.app).expect("attach");
    let mut c1 = Client::connect(&a.app).expect("attach");
    let ok = eventually(20, || (apps_per_thread(&a) == vec![1, 1]).then_some(()));
    assert!(ok.is_some(), "{:?}", apps_per_thread(&a));
    let peer = c0.peer("server").expect("peer");
    // Inline, Read chunk (long call), Write chunk / Reply chunk (long reply), both apps
    // interleaved so the two threads' XIDs share the connection.
    // The server app's receive buffers take calls up to 128 KiB.
    for (i, len) in [0usize, 100, 3000, 20_000, 60_000, 120_000]
        .into_iter()
        .enumerate()
    {
        for ddp in [false, true] {
            echo(&mut c0, peer, i as u32, len, ddp, &a, &b);
            echo(&mut c1, peer, 100 + i as u32, len, ddp, &a, &b);
        }
    }
    // Many calls in flight from both apps at once.
    let mut tickets = Vec::new();
    for i in 0..64u32 {
        let c = if i % 2 == 0 { &mut c0 } else { &mut c1 };
        let mut call = c.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::ECHO);
        call.args().put_opaque(&pattern(i, 500));
        tickets.push((i, call.submit().expect("submit")));
    }
    for (i, t) in tickets {
        let c = if i % 2 == 0 { &mut c0 } else { &mut c1 };
        let r = c.wait(t, T).expect("reply");
        assert_eq!(r.body, xdr_opaque(&pattern(i, 500)));
    }
    let sa = a.ctl_json(&["stats"]);
    assert_eq!(sa["conns"][0]["replies-in"], 24 + 64, "{sa}");
    // The crossings really happened: on both daemons each thread sent hops to the other
    // (calls one way, their answers back; served calls and replies on B).
    for (d, s) in [("A", &sa), ("B", &b.ctl_json(&["stats"]))] {
        for t in s["threads"].as_array().expect("threads") {
            assert!(t["hops-out"].as_u64() > Some(0), "{d}: {t}");
            assert!(t["hops-in"].as_u64() > Some(0), "{d}: {t}");
        }
    }
    // B counts a reply when its Send completes, which may trail the caller's receipt.
    let sb = eventually(20, || {
        let s = b.ctl_json(&["stats"]);
        (s["conns"][0]["replies-out"] == 24 + 64).then_some(s)
    })
    .unwrap_or_else(|| panic!("B: {}", b.ctl_json(&["stats"])));
    // Every transfer mode was used (counted on the requester).
    let c = &sa["conns"][0];
    for k in ["read-chunks", "write-chunks", "long-calls", "short-sent"] {
        assert!(c[k].as_u64() > Some(0), "{k}: {c}");
    }
    assert!(sb["conns"][0]["long-replies"].as_u64() > Some(0), "{sb}");
}

#[test]
fn serving_app_on_another_thread_killed_mid_call_answers_and_frees_everything() {
    let (a, b) = pair("xkill");
    let _idle = Client::connect(&b.app).expect("attach");
    let mut c = Client::connect(&a.app).expect("attach");
    let peer = c.peer("server").expect("peer");
    common::null_unserved(&mut c, peer, T);
    let base_a = settled(&a);
    let base_b = settled(&b);
    let mut server = rdmatest_serve(&b.app);
    assert_eq!(apps_per_thread(&b), vec![1, 1], "the server is on thread 1");
    assert_eq!(conn_thread(&b), 0);
    let tickets = common::submit_sleeps(&mut c, peer, 4);
    let busy = eventually(30, || {
        let n = common::counts(&b);
        (n["rpcs-in-flight"] >= 4).then_some(n)
    });
    assert!(busy.is_some(), "calls never delivered: {}", b.log());
    server.kill9();
    let failed = common::answers_after_server_death(&mut c, tickets, &a, &b);
    assert!(failed >= 1, "the server died with calls delivered");
    // Its arena was registered on both of B's threads; both registrations go.
    back_to(&b, &base_b, 60);
    back_to(&a, &base_a, 60);
    let _server = rdmatest_serve(&b.app);
    echo(&mut c, peer, 1, 2000, false, &a, &b);
}

#[test]
fn r8166_7_1_a_backward_call_crosses_threads_on_both_daemons() {
    let (a, b) = pair("xback");
    // A's connection is on its thread 1; its callback app (the first app) on thread 0.
    assert_eq!(conn_thread(&a), 1);
    common::callback_app(&a.app);
    assert_eq!(apps_per_thread(&a), vec![1, 0]);
    // B's connection is on its thread 0; its calling app on thread 1.
    let _idle = Client::connect(&b.app).expect("attach");
    let mut c = Client::connect(&b.app).expect("attach");
    assert_eq!(apps_per_thread(&b), vec![1, 1]);
    let conn = b.ctl_json(&["conns"])[0]["id"].as_u64().expect("id") as u32;
    // Backward-direction calls travel inline only (no chunks in the backchannel).
    for (i, len) in [10usize, 500, 1000].into_iter().enumerate() {
        common::backward_ping(&mut c, conn, (i as u32, len), T, (&a, &b));
    }
    assert_eq!(a.ctl_json(&["stats"])["conns"][0]["calls-in"], 3);
}

/// One listener's connections spread over the poll threads (`listeners[].spread`, the
/// default): B's listener is on its thread 0; A opens two connections to it (two peers at B's
/// address), and B hands the second request to its thread 1, the one with fewer connections,
/// which accepts it and carries its calls. With `spread = false` both stay on thread 0.
#[test]
fn one_listeners_connections_spread_over_the_poll_threads() {
    for spread in [true, false] {
        let name = if spread { "spread" } else { "no-spread" };
        let (dir, port) = (common::tmpdir(&format!("{name}-b")), common::free_port());
        let extra = if spread { "" } else { "spread = false\n" };
        let b = Daemon::start_with(dir.clone(), port, &common::config(&dir, port, None, extra));
        let _server = rdmatest_serve(&b.app);
        let (dir, port) = (common::tmpdir(&format!("{name}-a")), common::free_port());
        let second = format!(
            "[[peers]]\nname = \"s2\"\naddress = \"127.0.0.1:{}\"\nreconnect-initial-ms = 50\n",
            b.port
        );
        let text = common::config(&dir, port, Some(("s1", b.port)), &second);
        let a = Daemon::start_with(dir, port, &text);
        a.wait_peer_up("s1");
        a.wait_peer_up("s2");
        let mut c = Client::connect(&a.app).expect("attach");
        for p in ["s1", "s2"] {
            let peer = c.peer(p).expect("peer");
            // Inline, and through Read and Write chunks (long call, long reply; DDP).
            for (len, ddp) in [(100, false), (20_000, false), (20_000, true)] {
                echo(&mut c, peer, len as u32, len, ddp, &a, &b);
            }
        }
        let s = b.ctl_json(&["stats"]);
        let conns = b.ctl_json(&["conns"]);
        let calls_in = |id: &serde_json::Value| {
            s["conns"]
                .as_array()
                .expect("stats conns")
                .iter()
                .find(|c| &c["id"] == id)
                .map(|c| c["calls-in"].as_u64())
        };
        let mut threads: Vec<(u64, Option<Option<u64>>)> = conns
            .as_array()
            .expect("conns")
            .iter()
            .map(|c| (c["thread"].as_u64().expect("thread"), calls_in(&c["id"])))
            .collect();
        threads.sort_unstable();
        let want = if spread { [0, 1] } else { [0, 0] };
        assert_eq!(threads.len(), 2, "{name}: {s}");
        for ((t, calls), w) in threads.iter().zip(want) {
            assert_eq!(*t, w, "{name}: {s}");
            assert_eq!(
                *calls,
                Some(Some(3)),
                "{name}: each connection carried its calls: {s}"
            );
        }
        let table = String::from_utf8_lossy(&b.ctl(&["conns"]).stdout).into_owned();
        assert!(
            table.lines().next().is_some_and(|h| h.contains("THREAD")),
            "{table}"
        );
        let moved = common::thread_sum(&s, "conns-handed-over");
        assert_eq!(moved, u64::from(spread), "{name}: {s}");
    }
}
