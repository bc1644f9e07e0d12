//! Two real `rpcrdmad` processes on loopback (soft provider): an app calls through daemon A,
//! daemon B delivers to an RDMATEST server app.

mod common;

use common::{rdmatest_server, xdr_opaque, Daemon};
use rpcrdma_shm::rdmatest::{self, pattern};
use rpcrdma_shm::Client;
use std::time::Duration;

const T: Option<Duration> = Some(Duration::from_secs(20));

#[test]
fn null_and_echo_through_two_daemons() {
    let b = Daemon::start("echo-b", None);
    let a = Daemon::start("echo-a", Some(("server", b.port)));
    a.wait_peer_up("server");
    rdmatest_server(&b.app);

    let mut c = Client::connect(&a.app).expect("client attach");
    let peer = c
        .peer("server")
        .expect("peer table names the configured peer");

    let t = c
        .call(peer, rdmatest::PROG, 1, rdmatest::NULL)
        .submit()
        .expect("submit");
    let r = c.wait(t, T).expect("NULL reply");
    assert_eq!((r.accept_stat, r.body.len()), (0, 0));

    for len in [0usize, 1, 37, 1000, 3000] {
        let data = pattern(len as u32, len);
        let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
        call.args().put_opaque(&data);
        let t = call.submit().expect("submit");
        let r = c
            .wait(t, T)
            .unwrap_or_else(|e| panic!("ECHO {len}: {e:?}\nA:\n{}\nB:\n{}", a.log(), b.log()));
        assert_eq!(r.accept_stat, 0);
        assert_eq!(r.body, xdr_opaque(&data), "ECHO of {len} bytes");
    }

    // The requester's counters moved, seen through rpcrdmactl.
    let stats = a.ctl_json(&["stats"]);
    let conn = &stats["conns"][0];
    assert_eq!(conn["peer"], "server");
    assert_eq!(conn["calls-out"], 6);
    assert_eq!(conn["replies-in"], 6);
    let lat = a.ctl_json(&["latency"]);
    assert_eq!(lat[0]["count"], 6);
    let bstats = b.ctl_json(&["stats"]);
    assert_eq!(bstats["conns"][0]["calls-in"], 6);
    assert_eq!(bstats["conns"][0]["replies-out"], 6);
}

#[test]
fn large_echo_read_and_write_use_chunks_end_to_end() {
    let b = Daemon::start("chunks-b", None);
    let a = Daemon::start("chunks-a", Some(("server", b.port)));
    a.wait_peer_up("server");
    rdmatest_server(&b.app);
    let mut c = Client::connect(&a.app).expect("client attach");
    let peer = c.peer("server").expect("peer");

    // ECHO with a DDP-eligible argument (Read chunk) and a result buffer (Write chunk).
    let data = pattern(11, 9001);
    let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
    call.args().put_ddp_opaque(&data);
    call.result_buffer(16384);
    let t = call.submit().expect("submit");
    let r = c
        .wait(t, T)
        .unwrap_or_else(|e| panic!("{e:?}\nA:\n{}\nB:\n{}", a.log(), b.log()));
    assert_eq!(r.body, xdr_opaque(&data));
    assert_eq!(r.ddp_bytes, 9001);
    // The responder pulled the argument (RDMA Read) and pushed the result (RDMA Write).
    let s = b.ctl_json(&["stats"]);
    assert!(
        s["conns"][0]["rdma-read-bytes"].as_u64() >= Some(9001),
        "{s}"
    );
    assert!(
        s["conns"][0]["rdma-write-bytes"].as_u64() >= Some(9001),
        "{s}"
    );

    // READ into a result buffer (Write chunk).
    let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::READ);
    call.args().put_u32(50_000).put_u32(9);
    call.result_buffer(50_000);
    let t = call.submit().expect("submit");
    let r = c.wait(t, T).expect("READ");
    assert_eq!(r.body, xdr_opaque(&pattern(9, 50_000)));

    // WRITE with a large DDP argument (Read chunk); 10 bytes spoiled.
    let mut data = pattern(3, 30_000);
    for x in &mut data[100..110] {
        *x = !*x;
    }
    let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::WRITE);
    call.args().put_u32(3).put_ddp_opaque(&data);
    let t = call.submit().expect("submit");
    let r = c.wait(t, T).expect("WRITE");
    assert_eq!(r.body, 29_990u32.to_be_bytes());

    // A long inline ECHO (no DDP marks) larger than the inline threshold: Position-zero
    // Read chunk out, Reply chunk back.
    let data = pattern(5, 20_000);
    let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
    call.args().put_opaque(&data);
    call.max_reply(32_768);
    let t = call.submit().expect("submit");
    let r = c.wait(t, T).expect("long ECHO");
    assert_eq!(r.body, xdr_opaque(&data));
    // Each transfer mode is counted on the requester.
    let s = a.ctl_json(&["stats"]);
    let c0 = &s["conns"][0];
    assert!(c0["read-chunks"].as_u64() >= Some(2), "{c0}");
    assert!(c0["write-chunks"].as_u64() >= Some(2), "{c0}");
    assert!(c0["long-calls"].as_u64() >= Some(1), "{c0}");
    assert!(c0["short-sent"].as_u64() >= Some(3), "{c0}");
}

fn start_v2_with(name: &str, peer: Option<(&str, u16)>, transport: &str) -> Daemon {
    let dir = common::tmpdir(name);
    let port = common::free_port();
    let extra = format!(
        "[transport]\nversion = 2\n{transport}[transport.xcharext]\nreqreminv-may-change = true\n"
    );
    let text = common::config(&dir, port, peer, &extra);
    Daemon::start_with(dir, port, &text)
}

/// Two version-two daemons (`transport` added to both), A calling B's RDMATEST server, version
/// two confirmed by a NULL call and INITXCH seen both ways: `(a, b, client, peer, A's and B's
/// characteristics)`.
fn v2_pair(
    name: &str,
    transport: &str,
) -> (
    Daemon,
    Daemon,
    Client,
    u32,
    serde_json::Value,
    serde_json::Value,
) {
    let b = start_v2_with(&format!("{name}-b"), None, transport);
    let a = start_v2_with(&format!("{name}-a"), Some(("server", b.port)), transport);
    a.wait_peer_up("server");
    rdmatest_server(&b.app);
    let mut c = Client::connect(&a.app).expect("attach");
    let peer = c.peer("server").expect("peer");
    let t = c
        .call(peer, rdmatest::PROG, 1, rdmatest::NULL)
        .submit()
        .expect("submit");
    c.wait(t, T).expect("NULL");
    // INITXCH both ways once version two is confirmed by a reply.
    let exchanged = common::eventually(10, || {
        let (xa, xb) = (xchar_of(&a), xchar_of(&b));
        (xa["initxch-received"] == true && xb["initxch-received"] == true).then_some((xa, xb))
    });
    let (xa, xb) =
        exchanged.unwrap_or_else(|| panic!("no INITXCH\nA:\n{}\nB:\n{}", a.log(), b.log()));
    (a, b, c, peer, xa, xb)
}

#[test]
fn xch_3_2_initxch_announces_reqreminv_from_configuration_and_device() {
    // Defaults: remote invalidation on, and the soft provider honours it.
    let (_a, _b, _c, _peer, xa, xb) = v2_pair("reqreminv", "");
    assert_eq!(xa["local"]["reqreminv"], true, "{xa}");
    assert_eq!(
        xb["peer"]["reqreminv"], true,
        "B recorded A's INITXCH: {xb}"
    );
}

fn xchar_of(d: &Daemon) -> serde_json::Value {
    d.ctl_json(&["conns"])[0]["xchar"].clone()
}

#[test]
fn xch_four_operations_end_to_end_between_two_daemons() {
    // REQREMINV starts FALSE (`remote-invalidation = false`) so a REQXCH can raise it through a
    // pending change.
    let (a, b, mut c, peer, xa, xb) = v2_pair("xch", "remote-invalidation = false\n");
    assert_eq!(xa["initxch-sent"], true);
    assert_eq!(xb["initxch-sent"], true);
    // `remote-invalidation = false`: REQREMINV announced FALSE (XCH-3.2-a).
    assert_eq!(xb["peer"]["reqreminv"], false, "{xb}");
    assert_eq!(xa["peer"]["rbsiz"], 4096);
    assert_eq!(xb["peer"]["brs"], "inline");
    // BRS never changes: marked in nochg.
    assert!(xa["peer-nochg"]
        .as_array()
        .expect("nochg")
        .contains(&3.into()));

    // REQXCH done: B lowers its RBSIZ, A uses it.
    let a_id = a.ctl_json(&["conns"])[0]["id"].to_string();
    let o = a.ctl_json(&["xchar", "request", &a_id, "rbsiz=2048"]);
    assert_eq!(o["done"], serde_json::json!(["rbsiz=2048"]));
    assert_eq!(xchar_of(&b)["local"]["rbsiz"], 2048);
    assert_eq!(xchar_of(&a)["peer"]["rbsiz"], 2048);
    // Calls still work with the smaller threshold (larger ones go as long messages).
    for len in [100, 3000] {
        let data = pattern(1, len);
        let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
        call.args().put_opaque(&data);
        let t = call.submit().expect("submit");
        assert_eq!(c.wait(t, T).expect("ECHO").body, xdr_opaque(&data));
    }

    // REQXCH rejected: beyond B's buffers, and a fixed characteristic.
    let o = a.ctl_json(&["xchar", "request", &a_id, "rbsiz=1048576", "brs=genl"]);
    assert_eq!(
        o["rejected"],
        serde_json::json!(["rbsiz=1048576", "brs=genl"])
    );
    assert_eq!(xchar_of(&b)["local"]["rbsiz"], 2048);

    // Pending then UPDXCH with pendclr: B asks A to change REQREMINV while A has a call in
    // flight; A answers pend and completes the change once the call is done.
    let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::SLEEP);
    call.args().put_u32(1_000_000);
    let slow = call.submit().expect("submit");
    let counted = common::eventually(10, || {
        (a.ctl_json(&["stats"])["conns"][0]["calls-out"] == 4).then_some(())
    });
    assert!(counted.is_some());
    let b_id = b.ctl_json(&["conns"])[0]["id"].to_string();
    let o = b.ctl_json(&["xchar", "request", &b_id, "reqreminv=true"]);
    assert_eq!(o["pending"], serde_json::json!(["reqreminv=true"]), "{o}");
    assert_eq!(
        xchar_of(&b)["pending-peer"],
        serde_json::json!(["reqreminv=true"])
    );
    c.wait(slow, T).expect("SLEEP");
    let cleared = common::eventually(10, || {
        let x = xchar_of(&b);
        (x["pending-peer"].as_array()?.is_empty() && x["peer"]["reqreminv"] == true).then_some(())
    });
    assert!(cleared.is_some(), "{}", xchar_of(&b));
    assert_eq!(xchar_of(&a)["local"]["reqreminv"], true);

    // Unknown characteristic in an unsolicited UPDXCH: ignored, the connection carries on.
    a.ctl_json(&["xchar", "set", &a_id, "id:4294967056=00000001"]);
    let ignored = common::eventually(10, || (xchar_of(&b)["unknown-ignored"] == 1).then_some(()));
    assert!(ignored.is_some());
    let t = c
        .call(peer, rdmatest::PROG, 1, rdmatest::NULL)
        .submit()
        .expect("submit");
    c.wait(t, T).expect("NULL after the unknown characteristic");
}

#[test]
fn many_calls_in_flight_beyond_the_credits_all_complete() {
    let b = Daemon::start("many-b", None);
    let a = Daemon::start("many-a", Some(("server", b.port)));
    a.wait_peer_up("server");
    rdmatest_server(&b.app);
    let mut c = Client::connect(&a.app).expect("attach");
    let peer = c.peer("server").expect("peer");
    // The test config grants 64 credits per connection; 200 calls queue in the engine.
    let mut tickets = Vec::new();
    for i in 0..200u32 {
        let data = pattern(i, 64 + (i as usize % 7) * 300);
        let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
        call.args().put_opaque(&data);
        tickets.push((call.submit().expect("submit"), data));
    }
    for (i, (t, data)) in tickets.into_iter().enumerate() {
        let r = c
            .wait(t, T)
            .unwrap_or_else(|e| panic!("{e:?}\nA:\n{}\nB:\n{}", a.log(), b.log()));
        assert_eq!(r.accept_stat, 0, "call {i}");
        assert_eq!(r.body, xdr_opaque(&data), "call {i}");
    }
    let s = a.ctl_json(&["stats"]);
    assert_eq!(s["conns"][0]["replies-in"], 200);
    assert_eq!(s["conns"][0]["call-errors"], 0);
}

#[test]
fn app_killed_with_calls_in_flight_leaves_the_daemon_and_other_apps_working() {
    let b = Daemon::start("kill-b", None);
    let a = Daemon::start("kill-a", Some(("server", b.port)));
    a.wait_peer_up("server");
    rdmatest_server(&b.app);
    let mut victim = std::process::Command::new(env!("CARGO_BIN_EXE_rdmatest"))
        .arg("inflight")
        .arg(&a.app)
        .args(["server", "3"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn app");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(victim.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("read");
    assert_eq!(line.trim(), "submitted");
    common::signal_pid(victim.id(), "KILL");
    let _ = victim.wait();
    let detached = common::eventually(20, || {
        (common::thread_sum(&a.ctl_json(&["stats"]), "apps-detached") == 1).then_some(())
    });
    assert!(detached.is_some(), "{}", a.log());
    // Its calls finish at B and their replies are dropped; another app works meanwhile.
    let mut c = Client::connect(&a.app).expect("attach");
    let peer = c.peer("server").expect("peer");
    let data = pattern(3, 200);
    let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
    call.args().put_opaque(&data);
    let t = call.submit().expect("submit");
    let r = c
        .wait(t, T)
        .unwrap_or_else(|e| panic!("{e:?}\nA:\n{}\nB:\n{}", a.log(), b.log()));
    assert_eq!(r.body, xdr_opaque(&data));
    assert!(a.ctl(&["status"]).status.success());
}

#[test]
fn serving_app_killed_mid_call_answers_the_caller_with_an_error() {
    let b = Daemon::start("srvkill-b", None);
    let a = Daemon::start("srvkill-a", Some(("server", b.port)));
    a.wait_peer_up("server");
    let mut server = std::process::Command::new(env!("CARGO_BIN_EXE_rdmatest"))
        .arg("serve")
        .arg(&b.app)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn server app");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("read");
    assert!(line.starts_with("serving"), "{line}");
    let mut c = Client::connect(&a.app).expect("attach");
    let peer = c.peer("server").expect("peer");
    let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::SLEEP);
    call.args().put_u32(1_000_000);
    let t = call.submit().expect("submit");
    let delivered = common::eventually(10, || {
        (b.ctl_json(&["stats"])["conns"][0]["calls-in"] == 1).then_some(())
    });
    assert!(delivered.is_some());
    common::signal_pid(server.id(), "KILL");
    let _ = server.wait();
    let r = c.wait(t, T).expect("a reply, not a hang");
    assert_eq!(r.accept_stat, 5, "SYSTEM_ERR for a call whose server died");
}

#[test]
fn r8166_7_1_a_backward_call_from_the_server_side_reaches_the_clients_callback_app() {
    let b = Daemon::start("bc-b", None);
    let a = Daemon::start("bc-a", Some(("server", b.port)));
    a.wait_peer_up("server");
    // The client side serves the callback program for backward-direction calls.
    common::callback_app(&a.app);
    // A server-side app calls back on the accepted connection: peer index = configured
    // peers (none on B) + the connection id.
    let conn = b.ctl_json(&["conns"])[0]["id"].as_u64().expect("id") as u32;
    let mut c = Client::connect(&b.app).expect("attach");
    common::backward_ping(&mut c, conn, (9, 300), T, (&a, &b));
    let sa = a.ctl_json(&["stats"]);
    assert_eq!(
        sa["conns"][0]["calls-in"], 1,
        "A received the backward call"
    );
    let sb = b.ctl_json(&["stats"]);
    assert_eq!(sb["conns"][0]["calls-out"], 1, "B sent it");
}

/// Starts an RDMATEST server app on `app_socket` with two receive buffers of 4 MiB + 4 KiB.
fn rdmatest_server_large(app_socket: &std::path::Path) {
    let (tx, rx) = std::sync::mpsc::channel();
    let p = app_socket.to_path_buf();
    std::thread::spawn(move || {
        let mut s = rpcrdma_shm::Server::connect(&p).expect("server attach");
        s.receive_buffers(2, (4 << 20) + 4096);
        s.start(rdmatest::PROG, rdmatest::VERS).expect("register");
        let _ = tx.send(());
        let _ = s.serve(rdmatest::PROG, rdmatest::VERS, rdmatest::handle);
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("server app registered");
}

#[test]
fn write_of_1_and_4_mib_through_a_read_chunk_between_two_daemons() {
    // Arenas of 32 MiB: the server app's receive buffers round up to 8 MiB each.
    let start = |name: &str, peer: Option<(&str, u16)>| {
        let dir = common::tmpdir(name);
        let port = common::free_port();
        let text = common::config(&dir, port, peer, "")
            .replace("arena-size = 4194304", "arena-size = 33554432");
        Daemon::start_with(dir, port, &text)
    };
    let b = start("bigwrite-b", None);
    let a = start("bigwrite-a", Some(("server", b.port)));
    a.wait_peer_up("server");
    rdmatest_server_large(&b.app);
    let mut c = Client::connect(&a.app).expect("client attach");
    let peer = c.peer("server").expect("peer");

    // The call's arguments (seed, opaque length, data) exceed the payload: a 1 MiB payload
    // makes a call just over 1 MiB, which a fixed 1 MiB call limit used to refuse.
    for len in [1usize << 20, 4 << 20] {
        let mut data = pattern(7, len);
        for x in &mut data[len - 5..] {
            *x = !*x;
        }
        let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::WRITE);
        call.args().put_u32(7).put_ddp_opaque(&data);
        let t = call.submit().expect("submit");
        let r = c
            .wait(t, T)
            .unwrap_or_else(|e| panic!("WRITE {len}: {e:?}\nA:\n{}\nB:\n{}", a.log(), b.log()));
        assert_eq!(r.accept_stat, 0, "WRITE {len}");
        assert_eq!(r.body, (len as u32 - 5).to_be_bytes(), "WRITE {len}");
    }
}

/// ECHO of 3000 bytes (a reply between the lowered 2048 and the default 4096), data intact.
fn echo_3000(c: &mut Client, peer: u32, seed: u32, a: &Daemon, b: &Daemon) {
    let data = pattern(seed, 3000);
    let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
    call.args().put_opaque(&data);
    call.max_reply(3200);
    let t = call.submit().expect("submit");
    let r = c
        .wait(t, T)
        .unwrap_or_else(|e| panic!("ECHO {seed}: {e:?}\nA:\n{}\nB:\n{}", a.log(), b.log()));
    assert_eq!(r.accept_stat, 0);
    assert_eq!(r.body, xdr_opaque(&data), "ECHO {seed} intact");
}

/// The counts once both daemons' statistics show `want` (snapshots from the poll threads are
/// refreshed asynchronously, so a count may trail the call that made it by a refresh).
fn long_counts_reach(a: &Daemon, b: &Daemon, want: (u64, u64)) -> (u64, u64) {
    common::eventually(10, || {
        let c = long_counts(a, b);
        (c == want).then_some(c)
    })
    .unwrap_or_else(|| long_counts(a, b))
}

fn long_counts(a: &Daemon, b: &Daemon) -> (u64, u64) {
    let sa = a.ctl_json(&["stats"]);
    let sb = b.ctl_json(&["stats"]);
    (
        sa["conns"][0]["long-calls"].as_u64().expect("long-calls"),
        sb["conns"][0]["long-replies"]
            .as_u64()
            .expect("long-replies"),
    )
}

#[test]
fn xch_3_e_lowered_rbsiz_reaches_the_engines_between_two_daemons() {
    let (a, b, mut c, peer, _, _) = v2_pair("rbsiz", "remote-invalidation = false\n");

    // RBSIZ 4096 both ways: the call and its reply go inline.
    echo_3000(&mut c, peer, 1, &a, &b);
    assert_eq!(long_counts_reach(&a, &b, (0, 0)), (0, 0));

    // The operator lowers A's RBSIZ to 2048 (UPDXCH): A's engine offers a Reply chunk for
    // replies that may exceed 2048, and B, told, uses it.
    let a_id = a.ctl_json(&["conns"])[0]["id"].to_string();
    let v = a.ctl_json(&["xchar", "set", &a_id, "rbsiz=2048"]);
    assert_eq!(v["local"]["rbsiz"], 2048);
    let told = common::eventually(10, || (xchar_of(&b)["peer"]["rbsiz"] == 2048).then_some(()));
    assert!(told.is_some());
    echo_3000(&mut c, peer, 2, &a, &b);
    assert_eq!(
        long_counts_reach(&a, &b, (0, 1)),
        (0, 1),
        "reply through the Reply chunk"
    );

    // A asks B to lower its RBSIZ to 2048 (REQXCH, done): A's 3000-byte call now goes as a
    // Long call.
    let o = a.ctl_json(&["xchar", "request", &a_id, "rbsiz=2048"]);
    assert_eq!(o["done"], serde_json::json!(["rbsiz=2048"]));
    let x = xchar_of(&a);
    assert_eq!(x["peer"]["rbsiz"], 2048);
    assert!(x["peer-rbsiz-cap"].is_null(), "{x}");
    echo_3000(&mut c, peer, 3, &a, &b);
    assert_eq!(
        long_counts_reach(&a, &b, (1, 2)),
        (1, 2),
        "Long call and Reply chunk"
    );
    let conn = &a.ctl_json(&["conns"])[0];
    assert_eq!(
        (conn["inline-send"].as_u64(), conn["inline-recv"].as_u64()),
        (Some(2048), Some(2048))
    );
}

/// R8166-6.1-d on the responder's side, between real processes: B's server app answers READ
/// with the result written into its reply stream, not marked as a DDP piece. Daemon B still
/// reduces it into the Write chunk A's call offered (the RFC asks it of a responder, and A
/// would refuse the result inline as `BAD_REPLY`).
#[test]
fn a_read_result_its_server_app_left_unmarked_still_goes_through_the_write_chunk() {
    let b = Daemon::start("unmarked-b", None);
    let a = Daemon::start("unmarked-a", Some(("server", b.port)));
    a.wait_peer_up("server");
    common::serve_app(
        &b.app,
        (rdmatest::PROG, rdmatest::VERS),
        move |call, reply| {
            let w = |i: usize| u32::from_be_bytes(call.args[i..i + 4].try_into().unwrap());
            // READ(count, seed): the pattern, as a plain opaque.
            reply.xdr.put_opaque(&pattern(w(4), w(0) as usize));
        },
    );
    let mut c = Client::connect(&a.app).expect("client attach");
    let peer = c.peer("server").expect("peer");
    for len in [2000u32, 3001] {
        let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::READ);
        call.args().put_u32(len).put_u32(len);
        call.result_buffer(len);
        let t = call.submit().expect("submit");
        let r = c
            .wait(t, T)
            .unwrap_or_else(|e| panic!("READ {len}: {e:?}\nB:\n{}", b.log()));
        assert_eq!(r.body, xdr_opaque(&pattern(len, len as usize)));
        assert_eq!(r.ddp_bytes, len, "the result came through the Write chunk");
    }
    let bstats = b.ctl_json(&["stats"]);
    assert_eq!(bstats["conns"][0]["rdma-write-bytes"], 5001, "{bstats}");
    let astats = a.ctl_json(&["stats"]);
    assert_eq!(astats["conns"][0]["bad-replies"], 0, "{astats}");
}

/// The words of an NFSv4 COMPOUND4res: status, empty tag, `n` results, then SEQUENCE and
/// PUTFH succeeded (the first two).
fn nfs4_res_head(x: &mut rpcrdma_shm::client::XdrBuilder, n: u32) {
    x.put_u32(0).put_u32(0).put_u32(n);
    x.put_u32(53).put_u32(0);
    for w in [0x5e5e_5e5e; 4] {
        x.put_u32(w);
    }
    for w in [5, 0, 63, 63, 0] {
        x.put_u32(w);
    }
    x.put_u32(22).put_u32(0);
}

/// The NFSv4 binding (RFC 8267 §5) between real processes: a COMPOUND's WRITE data goes in
/// a Read chunk (not a Long call) and reaches B's server app with the GETATTR after it intact
/// (IMPL-3.7-a); a COMPOUND's READ data comes back through the Write chunk with a GETATTR
/// after it in the reply, which A's requester accepts (R8166-6.1-c/d), whether B's app marks
/// the data or leaves it in its stream for daemon B to reduce (R8166-6.1-d, responder).
#[test]
fn an_nfsv4_compound_moves_its_write_and_read_data_through_chunks() {
    const NFS: u32 = 100_003;
    let b = Daemon::start("nfs4-b", None);
    let a = Daemon::start("nfs4-a", Some(("server", b.port)));
    a.wait_peer_up("server");
    let data = pattern(7, 6000);
    let want = data.clone();
    common::serve_app(&b.app, (NFS, 4), move |call, reply| {
        let w = |i: usize| u32::from_be_bytes(call.args[i..i + 4].try_into().unwrap());
        // tag (empty), minor version, count, SEQUENCE (opcode and 32 bytes), PUTFH
        // (opcode and an 8-byte handle), then WRITE or READ.
        let op = w(64);
        let x = &mut reply.xdr;
        if op == 38 {
            // stateid, offset, stable, then the data and the GETATTR after it.
            let len = w(96) as usize;
            let ok = call.args[100..100 + len] == want[..]
                && w(100 + len) == 9
                && w(104 + len) == 1
                && w(108 + len) == 1 << 4;
            nfs4_res_head(x, 4);
            x.put_u32(38).put_u32(if ok { 0 } else { 5 });
            x.put_u32(len as u32)
                .put_u32(2)
                .put_u32(0x7777_7777)
                .put_u32(0x7777_7777);
            x.put_u32(9).put_u32(0).put_u32(0).put_u32(0);
        } else {
            // READ: stateid, offset, count. Answer the data, eof, then GETATTR (size).
            // A READ at offset 1 has its data left unmarked, for daemon B to find.
            let count = w(92) as usize;
            nfs4_res_head(x, 4);
            x.put_u32(25).put_u32(0).put_u32(1);
            if w(88) == 1 {
                x.put_opaque(&pattern(9, count));
            } else {
                x.put_ddp_opaque(&pattern(9, count));
            }
            x.put_u32(9).put_u32(0).put_u32(1).put_u32(1 << 4);
            x.put_opaque(&(count as u64).to_be_bytes());
        }
    });
    let mut c = Client::connect(&a.app).expect("client attach");
    let peer = c.peer("server").expect("peer");
    // SEQUENCE, PUTFH, then `op`'s stateid and offset (`offset` its low word).
    let head = |call: &mut rpcrdma_shm::client::XdrBuilder, op: u32, offset: u32| {
        call.put_u32(0).put_u32(1).put_u32(4);
        call.put_u32(53);
        for w in [
            0x5e5e_5e5e,
            0x5e5e_5e5e,
            0x5e5e_5e5e,
            0x5e5e_5e5e,
            5,
            0,
            0,
            1,
        ] {
            call.put_u32(w);
        }
        call.put_u32(22).put_opaque(&[0xfa; 8]);
        call.put_u32(op);
        for w in [1, 7, 7, 7, 0, offset] {
            call.put_u32(w);
        }
    };
    // WRITE (offset 0, FILE_SYNC4), its data as the DDP piece, then GETATTR.
    let mut call = c.call(peer, NFS, 4, 1);
    head(call.args(), 38, 0);
    call.args().put_u32(2).put_ddp_opaque(&data);
    call.args().put_u32(9).put_u32(1).put_u32(1 << 4);
    let t = call.submit().expect("submit");
    let r = c
        .wait(t, T)
        .unwrap_or_else(|e| panic!("WRITE: {e:?}\nB:\n{}", b.log()));
    let w = |i: usize| u32::from_be_bytes(r.body[i..i + 4].try_into().unwrap());
    assert_eq!((w(0), w(64), w(68)), (0, 38, 0), "WRITE4res: {:?}", r.body);
    let astats = a.ctl_json(&["stats"]);
    let conn = &astats["conns"][0];
    assert_eq!(
        (&conn["read-chunks"], &conn["long-calls"]),
        (&1.into(), &0.into()),
        "a Read chunk, not a Long call: {astats}"
    );
    // READs into a result buffer, a GETATTR after them: 5000 bytes at offset 0, which B's
    // app marks; 4000 at offset 1, which it leaves in its stream (daemon B reduces it all
    // the same, R8166-6.1-d).
    for (offset, count) in [(0, 5000u32), (1, 4000)] {
        let mut call = c.call(peer, NFS, 4, 1);
        head(call.args(), 25, offset);
        call.args()
            .put_u32(count)
            .put_u32(9)
            .put_u32(1)
            .put_u32(1 << 4);
        call.result_buffer(count);
        let t = call.submit().expect("submit");
        let r = c
            .wait(t, T)
            .unwrap_or_else(|e| panic!("READ at {offset}: {e:?}\nB:\n{}", b.log()));
        assert_eq!(
            r.ddp_bytes, count,
            "the READ data at {offset} came through the Write chunk"
        );
        let mut want = rpcrdma_shm::client::XdrBuilder::default();
        nfs4_res_head(&mut want, 4);
        want.put_u32(25)
            .put_u32(0)
            .put_u32(1)
            .put_opaque(&pattern(9, count as usize));
        want.put_u32(9).put_u32(0).put_u32(1).put_u32(1 << 4);
        want.put_opaque(&u64::from(count).to_be_bytes());
        assert_eq!(r.body, want.to_full(), "READ at {offset}");
    }
    let astats = a.ctl_json(&["stats"]);
    assert_eq!(astats["conns"][0]["bad-replies"], 0, "{astats}");
    let bstats = b.ctl_json(&["stats"]);
    assert_eq!(bstats["conns"][0]["rdma-read-bytes"], 6000, "{bstats}");
    assert_eq!(bstats["conns"][0]["rdma-write-bytes"], 9000, "{bstats}");
}

/// An app's AUTH_SYS identity through two daemons (ABI `flag::AUTH_SYS`): A puts it in the
/// call's RPC header, B hands it to the serving app with the call (`Call::auth`); a call
/// without one arrives as AUTH_NONE. An app not running as root may name only its own uid
/// and gid: A refuses another identity with `AUTH_DENIED` before anything is sent; root may
/// name any.
#[test]
fn auth_sys_identity_reaches_the_server_app_and_only_root_may_borrow_one() {
    use std::os::unix::fs::MetadataExt;
    let b = Daemon::start("authsys-b", None);
    let a = Daemon::start("authsys-a", Some(("server", b.port)));
    a.wait_peer_up("server");
    // A server app that answers each call with the identity it came with (flavor, uid, gid).
    common::serve_app(&b.app, (rdmatest::PROG, rdmatest::VERS), move |c, r| {
        let (flavor, (uid, gid)) = c.auth.map_or((0, (0, 0)), |id| (1, id));
        r.xdr.put_u32(flavor).put_u32(uid).put_u32(gid);
    });
    let me = std::fs::metadata("/proc/self").expect("/proc/self");
    let (uid, gid) = (me.uid(), me.gid());
    let mut c = Client::connect(&a.app).expect("client attach");
    let peer = c.peer("server").expect("peer");
    let ask = |c: &mut Client, id: Option<(u32, u32)>| {
        let mut call = c.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::NULL);
        if let Some((u, g)) = id {
            call.auth_sys(u, g);
        }
        let t = call.submit().expect("submit");
        c.wait(t, T).map(|r| {
            let w: Vec<u32> = r
                .body
                .chunks(4)
                .map(|w| u32::from_be_bytes(w.try_into().unwrap()))
                .collect();
            w
        })
    };
    assert_eq!(ask(&mut c, None).expect("AUTH_NONE"), [0, 0, 0]);
    assert_eq!(
        ask(&mut c, Some((uid, gid))).expect("as itself"),
        [1, uid, gid]
    );
    let other = (uid.wrapping_add(1), gid);
    match ask(&mut c, Some(other)) {
        Ok(w) => {
            assert_eq!(uid, 0, "only root may name another identity");
            assert_eq!(w, [1, other.0, other.1]);
        }
        Err(e) => {
            assert_ne!(uid, 0, "root may name any identity: {e:?}");
            assert!(
                matches!(e, rpcrdma_shm::client::Error::Status(s) if s == rpcrdma_shm::abi::status::AUTH_DENIED),
                "{e:?}"
            );
        }
    }
}
