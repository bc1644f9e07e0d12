//! One real `rpcrdmad` on the in-memory provider (`provider.kind = "mem"`): its peer "self" is
//! its own listener, so an app calling "self" reaches an RDMATEST server app behind the
//! listener as app → daemon → in-memory RDMA → daemon → app, with no socket on the data path.

mod common;

use common::{eventually, rdmatest_server, thread_sum, tmpdir, xdr_opaque, Daemon};
use rpcrdma_shm::rdmatest::{self, pattern};
use rpcrdma_shm::{Client, WaitPolicy};
use std::process::Command;
use std::time::Duration;

const T: Option<Duration> = Some(Duration::from_secs(20));

/// A name on the daemon's in-memory fabric; nothing binds it, so any port will do.
const PORT: u16 = 20049;

fn mem_config(dir: &std::path::Path, peer_port: u16) -> String {
    mem_config_idle(
        dir,
        peer_port,
        "policy = \"backoff\"\nspin-us = 100\nbackoff-max-us = 50\npark-after-us = 2000\n",
    )
}

/// The mem daemon's config with these `[cpu.idle]` lines.
fn mem_config_idle(dir: &std::path::Path, peer_port: u16, idle: &str) -> String {
    format!(
        "[daemon]\napp-socket = \"{d}/app.sock\"\nadmin-socket = \"{d}/admin.sock\"\nlog-level = \"debug\"\n\
         [cpu.idle]\n{idle}\
         [provider]\nkind = \"mem\"\n\
         [pools]\nconnections = 4\n\
         [apps]\nmax-apps = 4\narena-size = 4194304\n\
         [[listeners]]\naddress = \"127.0.0.1:{PORT}\"\n\
         [[peers]]\nname = \"self\"\naddress = \"127.0.0.1:{peer_port}\"\nreconnect-initial-ms = 50\nreconnect-max-ms = 400\n",
        d = dir.display()
    )
}

#[test]
fn mem_provider_carries_null_echo_and_every_chunk_mode_through_one_daemon() {
    let dir = tmpdir("mem");
    let text = mem_config(&dir, PORT);
    let d = every_mode_through_one_daemon(dir, &text);
    assert!(d.log().contains("receive_queues=Shared"), "{}", d.log());
}

/// The same with `pools.receive-queue = "per-connection"`: each connection has receives and
/// send buffers of its own, at full credits, and every transfer mode works the same.
#[test]
fn receive_queues_of_their_own_carry_every_chunk_mode_too() {
    let dir = tmpdir("mem-own");
    let text = mem_config(&dir, PORT).replace(
        "[pools]\nconnections = 4\n",
        "[pools]\nconnections = 4\nreceive-queue = \"per-connection\"\n",
    );
    assert!(text.contains("per-connection"));
    let d = every_mode_through_one_daemon(dir, &text);
    let log = d.log();
    assert!(log.contains("receive_queues=PerConnection"), "{log}");
    // 64 credits, 8 backchannel credits, 1 spare (the defaults): the configured credits.
    assert!(
        log.contains("credits=64 receives_per_connection=73"),
        "{log}"
    );
}

/// NULL, ECHO, a Read chunk, a Write chunk, a long call and a long reply through the one
/// daemon of `text` (peer "self"), checked in the connection statistics; the daemon, still
/// running, for more checks.
fn every_mode_through_one_daemon(dir: std::path::PathBuf, text: &str) -> Daemon {
    let d = Daemon::start_with(dir, PORT, text);
    d.wait_peer_up("self");
    let status = d.ctl_json(&["status"]);
    assert_eq!(status["provider"], "mem", "{status}");
    rdmatest_server(&d.app);

    let mut c = Client::connect(&d.app).expect("client attach");
    let peer = c.peer("self").expect("peer table names `self`");
    let fail = |what: &str, e: &dyn std::fmt::Debug| -> ! { panic!("{what}: {e:?}\n{}", d.log()) };
    // The peer table says how large a reply arrives inline (`inline-recv` 4096 less the
    // transport and RPC reply headers): the calls below that leave their reply buffer to the
    // default offer no Reply chunk.
    assert_eq!(c.reply_inline(peer), Some(4096 - 28 - 24));

    // NULL.
    let t = c
        .call(peer, rdmatest::PROG, 1, rdmatest::NULL)
        .submit()
        .expect("submit");
    let r = c.wait(t, T).unwrap_or_else(|e| fail("NULL", &e));
    assert_eq!((r.accept_stat, r.body.len()), (0, 0));

    // ECHO 64 B inline.
    let data = pattern(64, 64);
    let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
    call.args().put_opaque(&data);
    let t = call.submit().expect("submit");
    let r = c.wait(t, T).unwrap_or_else(|e| fail("ECHO 64", &e));
    assert_eq!(r.accept_stat, 0);
    assert_eq!(r.body, xdr_opaque(&data), "ECHO 64 B");

    // Read chunk: WRITE with a DDP-eligible argument the responder pulls by RDMA Read; ten
    // bytes spoiled, so the count proves the data arrived byte for byte.
    let mut data = pattern(3, 30_000);
    for x in &mut data[100..110] {
        *x = !*x;
    }
    let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::WRITE);
    call.args().put_u32(3).put_ddp_opaque(&data);
    let t = call.submit().expect("submit");
    let r = c
        .wait(t, T)
        .unwrap_or_else(|e| fail("WRITE (read chunk)", &e));
    assert_eq!(r.body, 29_990u32.to_be_bytes());

    // Write chunk: READ into a result buffer the responder fills by RDMA Write.
    let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::READ);
    call.args().put_u32(50_000).put_u32(9);
    call.result_buffer(50_000);
    let t = call.submit().expect("submit");
    let r = c
        .wait(t, T)
        .unwrap_or_else(|e| fail("READ (write chunk)", &e));
    assert_eq!(r.body, xdr_opaque(&pattern(9, 50_000)));
    assert_eq!(r.ddp_bytes, 50_000);

    // Long call: a WRITE whose inline arguments exceed the inline threshold (Position-zero
    // Read chunk).
    let data = pattern(5, 20_000);
    let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::WRITE);
    call.args().put_u32(5).put_opaque(&data);
    let t = call.submit().expect("submit");
    let r = c.wait(t, T).unwrap_or_else(|e| fail("long call", &e));
    assert_eq!(r.body, 20_000u32.to_be_bytes());

    // Long reply: a READ whose inline reply exceeds the inline threshold (Reply chunk).
    let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::READ);
    call.args().put_u32(40_000).put_u32(11);
    call.max_reply(48 << 10);
    let t = call.submit().expect("submit");
    let r = c.wait(t, T).unwrap_or_else(|e| fail("long reply", &e));
    assert_eq!(r.body, xdr_opaque(&pattern(11, 40_000)));

    // An ECHO whose reply fills the default reply buffer to the byte comes inline; one word
    // more does not fit the default: the app must ask for a larger buffer.
    for (len, fits) in [(4096 - 52 - 4, true), (4096 - 52, false)] {
        let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
        call.args().put_opaque(&pattern(7, len));
        let t = call.submit().expect("submit");
        match c.wait(t, T) {
            Ok(r) if fits => assert_eq!(r.body, xdr_opaque(&pattern(7, len))),
            Err(rpcrdma_shm::client::Error::Status(s)) if !fits => {
                assert_eq!(s, rpcrdma_shm::abi::status::CHUNK_REFUSED)
            }
            other => fail(&format!("ECHO {len} B, default reply buffer"), &other),
        }
    }

    // Both ends of the one connection are this daemon's: the caller's side sent eight calls,
    // the listener's side answered them and moved the chunk data by RDMA Read and Write.
    let stats = d.ctl_json(&["stats"]);
    let conns = stats["conns"].as_array().expect("conns");
    let out = conns
        .iter()
        .find(|c| c["peer"] == "self")
        .unwrap_or_else(|| panic!("no outgoing conn: {stats}"));
    assert_eq!(out["calls-out"], 8, "{stats}");
    assert_eq!(out["replies-in"], 7, "{stats}");
    let inc = conns
        .iter()
        .find(|c| c["calls-in"] == 8)
        .unwrap_or_else(|| panic!("no accepted conn answering: {stats}"));
    assert_eq!(inc["replies-out"], 7, "{stats}");
    assert!(
        inc["rdma-read-bytes"].as_u64() >= Some(50_000),
        "read chunk and long call pulled by RDMA Read: {stats}"
    );
    assert!(
        inc["rdma-write-bytes"].as_u64() >= Some(50_000),
        "write chunk pushed by RDMA Write: {stats}"
    );
    // The long call, and the two ECHOs of about 4 KiB (their arguments exceed the inline
    // threshold; their replies do not).
    assert_eq!(out["long-calls"], 3, "{stats}");
    assert_eq!(inc["long-replies"], 1, "{stats}");
    // Only the call that asked for a 48 KiB reply buffer offered a Reply chunk.
    assert_eq!(out["reply-chunks"], 1, "{stats}");
    d
}

#[test]
fn check_config_refuses_a_mem_peer_that_names_no_own_listener() {
    let dir = tmpdir("mem-check");
    let cfg = dir.join("bad.toml");
    std::fs::write(&cfg, mem_config(&dir, PORT + 1)).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_rpcrdmad"))
        .arg("--check-config")
        .arg(&cfg)
        .output()
        .expect("run rpcrdmad");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("peers[0].address"), "{text}");
    assert!(text.contains("names no listener of this daemon"), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{PORT}")), "hint: {text}");

    std::fs::write(&cfg, mem_config(&dir, PORT)).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_rpcrdmad"))
        .arg("--check-config")
        .arg(&cfg)
        .output()
        .expect("run rpcrdmad");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// NULL calls from a yield-spinning client app; panics with the daemon's log on a failure.
fn nulls(d: &Daemon, n: usize) {
    let mut c = Client::connect(&d.app).expect("client attach");
    c.set_wait(WaitPolicy::yielding(Duration::from_millis(20)));
    let peer = c.peer("self").expect("peer table names `self`");
    for _ in 0..n {
        let t = c
            .call(peer, rdmatest::PROG, 1, rdmatest::NULL)
            .submit()
            .expect("submit");
        let r = c
            .wait(t, T)
            .unwrap_or_else(|e| panic!("NULL: {e:?}\n{}", d.log()));
        assert_eq!((r.accept_stat, r.body.len()), (0, 0));
    }
}

/// A mem daemon with these `[cpu.idle]` lines, its peer up and an RDMATEST server attached.
fn idle_daemon(name: &str, idle: &str) -> Daemon {
    let dir = tmpdir(name);
    let text = mem_config_idle(&dir, PORT, idle);
    let d = Daemon::start_with(dir, PORT, &text);
    d.wait_peer_up("self");
    rdmatest_server(&d.app);
    d
}

/// `apps.max-apps` counts an app until its poll thread sees it gone. An app that closes without
/// a word (no DETACH on its ring, as after a crash) is noticed within about a millisecond; the
/// app that takes its place at once waits for the slot instead of being refused. With every
/// slot held by a live app, a newcomer is still refused.
#[test]
fn an_app_replacing_one_that_just_closed_at_max_apps_is_not_refused() {
    let d = idle_daemon(
        "mem-max-apps",
        "policy = \"backoff\"\nspin-us = 100\nbackoff-max-us = 50\npark-after-us = 2000\n",
    );
    // The RDMATEST server holds one slot of the four the config allows; three raw
    // attachments (no DETACH when dropped, as after a crash) take the others.
    let fill = || {
        let raw: Vec<_> = (0..3)
            .map(|_| rpcrdma_shm::attach::connect(&d.app).expect("attach"))
            .collect();
        let four = || (thread_sum(&d.ctl_json(&["stats"]), "apps") == 4).then_some(());
        assert!(eventually(20, four).is_some(), "{}", d.log());
        raw
    };
    for (i, closed) in fill().into_iter().enumerate() {
        // Closed silently; the replacement attaches in the same instant.
        drop(closed);
        nulls(&d, 1);
        assert!(
            !d.log().contains("app refused"),
            "replacement {i}:\n{}",
            d.log()
        );
    }
    let full = fill();
    let mut extra = Client::connect(&d.app).expect("the socket handshake still completes");
    let peer = extra.peer("self").expect("peer");
    let t = extra.call(peer, rdmatest::PROG, 1, rdmatest::NULL).submit();
    let refused = t.and_then(|t| extra.wait(t, T)).is_err();
    assert!(refused, "a fifth app is refused\n{}", d.log());
    assert!(d.log().contains("app refused"), "{}", d.log());
    drop(full);
}

/// The backoff policy spins for `spin-us` of time, however many empty polls that takes: with
/// an hour to spin, an idle thread polls on (far more than the 1000 polls the old count
/// defaulted to) and never sleeps or parks; with no spin at all, it parks, and a doorbell
/// still wakes it.
#[test]
fn backoff_spins_for_spin_us_of_time_not_a_count_of_polls() {
    let d = idle_daemon(
        "mem-spin-hour",
        "policy = \"backoff\"\nspin-us = 3600000000\nbackoff-max-us = 50\npark-after-us = 1000\n",
    );
    nulls(&d, 20);
    let polls = |s: &serde_json::Value| thread_sum(s, "idle-polls");
    let before = polls(&d.ctl_json(&["stats"]));
    let spun = stats_until(&d, |s| polls(s) > before + 200_000)
        .unwrap_or_else(|| panic!("an idle thread keeps polling\n{}", d.log()));
    assert_eq!(thread_sum(&spun, "parks"), 0, "{spun}");
    nulls(&d, 5);
    drop(d);

    parks_and_wakes(
        "mem-spin-none",
        "policy = \"backoff\"\nspin-us = 0\nbackoff-max-us = 50\npark-after-us = 1000\n",
    );
}

/// The daemon's stats once `ready` holds of them (within a minute).
fn stats_until(
    d: &Daemon,
    ready: impl Fn(&serde_json::Value) -> bool,
) -> Option<serde_json::Value> {
    eventually(60, || Some(d.ctl_json(&["stats"])).filter(|s| ready(s)))
}

/// A daemon with these idle lines serves calls, parks once idle, and an app's doorbell still
/// wakes it for the next calls.
fn parks_and_wakes(name: &str, idle: &str) -> Daemon {
    let d = idle_daemon(name, idle);
    nulls(&d, 5);
    let parked = stats_until(&d, |s| thread_sum(s, "parks") > 0);
    assert!(parked.is_some(), "an idle thread parks\n{}", d.log());
    nulls(&d, 5);
    d
}

#[test]
fn yield_idle_policy_yields_while_idle_and_parks_only_after_park_after() {
    // Parking after an hour: every empty poll yields, the thread never parks, calls are served.
    let d = idle_daemon(
        "mem-yield",
        "policy = \"yield\"\npark-after-us = 3600000000\n",
    );
    nulls(&d, 50);
    let stats = d.ctl_json(&["stats"]);
    assert!(thread_sum(&stats, "yields") > 0, "{stats}");
    assert_eq!(thread_sum(&stats, "parks"), 0, "{stats}");
    drop(d);

    // Parking after 1 ms: an idle thread parks, and an app's doorbell still wakes it for the next call.
    let d = parks_and_wakes(
        "mem-yield-park",
        "policy = \"yield\"\npark-after-us = 1000\n",
    );
    let stats = d.ctl_json(&["stats"]);
    assert!(thread_sum(&stats, "yields") > 0, "{stats}");
}

/// More peers than a poll thread's command queue holds (256), all on one thread: every
/// connect reaches the thread, every peer comes up and both ends of every connection are in
/// the table. A command or an event that found its queue full used to be dropped: 231 of 500
/// peers stayed "connecting" for good.
#[test]
fn more_peers_than_a_command_queue_holds_all_come_up() {
    const PEERS: usize = 300;
    let dir = tmpdir("mem-many");
    let mut text = format!(
        "[daemon]\napp-socket = \"{d}/app.sock\"\nadmin-socket = \"{d}/admin.sock\"\nlog-level = \"info\"\n\
         [cpu.idle]\npolicy = \"backoff\"\nspin-us = 100\nbackoff-max-us = 50\npark-after-us = 2000\n\
         [provider]\nkind = \"mem\"\n\
         [transport]\ninline-send = 1024\ninline-recv = 1024\ncredits = 4\nbackchannel-credits = 1\n\
         [pools]\nconnections = {conns}\nsend-buffers = {send}\nrecv-buffers = {recv}\n\
         [apps]\nmax-apps = 4\narena-size = 4194304\n\
         [[listeners]]\naddress = \"127.0.0.1:{PORT}\"\n",
        d = dir.display(),
        conns = 2 * PEERS,
        send = 2 * PEERS * 12,
        recv = 2 * PEERS * 8,
    );
    for i in 0..PEERS {
        text += &format!("[[peers]]\nname = \"p{i}\"\naddress = \"127.0.0.1:{PORT}\"\n");
    }
    let d = Daemon::start_with(dir, PORT, &text);
    let states = |d: &Daemon| -> Vec<String> {
        d.ctl_json(&["status"])["peers"]
            .as_array()
            .map(|ps| {
                ps.iter()
                    .map(|p| p["state"].as_str().unwrap_or("?").to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let all_up = eventually(30, || {
        let s = states(&d);
        (s.len() == PEERS && s.iter().all(|x| x == "up")).then_some(())
    });
    let s = states(&d);
    let up = s.iter().filter(|x| *x == "up").count();
    assert!(all_up.is_some(), "{up} of {PEERS} peers up:\n{}", d.log());
    // Both ends of every connection are in the connection table.
    let conns = d.ctl_json(&["conns"]);
    let up = |role: &str| {
        conns.as_array().map_or(0, |cs| {
            cs.iter()
                .filter(|c| c["role"] == role && c["state"] == "up")
                .count()
        })
    };
    assert_eq!((up("client"), up("server")), (PEERS, PEERS));
}
