//! Apps as real separate processes against real `rpcrdmad` processes (soft provider on
//! loopback): apps killed with `kill -9` mid-call, hostile apps scribbling on their rings, and
//! the C example client and server. The daemon's resource counts (`rpcrdmactl stats`: apps, app
//! operations, RPCs in flight, registered regions and bytes, free pool buffers) must return
//! to their baseline, and other apps must keep working.

mod common;

use common::{back_to, counts, eventually, rdmatest_serve, settled, xdr_opaque, App, Daemon};
use rpcrdma_shm::abi::status;
use rpcrdma_shm::client::Error;
use rpcrdma_shm::rdmatest::{self, pattern};
use rpcrdma_shm::Client;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Generous: calls may queue behind one-second SLEEPs in a single-threaded server app.
const T: Option<Duration> = Some(Duration::from_secs(60));

/// Daemon B (serving side) and daemon A with B as its peer "server", connected.
fn pair(name: &str) -> (Daemon, Daemon) {
    pair_with(name, "max-apps = 16\narena-size = 4194304")
}

/// [`pair`] with `apps` as the `[apps]` settings of both daemons.
fn pair_with(name: &str, apps: &str) -> (Daemon, Daemon) {
    let start = |n: String, peer: Option<(&str, u16)>| {
        let dir = common::tmpdir(&n);
        let port = common::free_port();
        let text = common::config(&dir, port, peer, "")
            .replace("max-apps = 4\narena-size = 4194304", apps);
        Daemon::start_with(dir, port, &text)
    };
    let b = start(format!("{name}-b"), None);
    let a = start(format!("{name}-a"), Some(("server", b.port)));
    a.wait_peer_up("server");
    (a, b)
}

/// One RDMATEST ECHO through A to B's server app, checked.
fn echo(c: &mut Client, peer: u32, i: u32, a: &Daemon, b: &Daemon) {
    let data = pattern(i, 1 + (i as usize * 37) % 3000);
    let mut call = c.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::ECHO);
    call.args().put_opaque(&data);
    let t = call.submit().expect("submit");
    let r = c
        .wait(t, T)
        .unwrap_or_else(|e| panic!("ECHO {i}: {e:?}\nA:\n{}\nB:\n{}", a.log(), b.log()));
    assert_eq!(r.accept_stat, 0, "ECHO {i}");
    assert_eq!(r.body, xdr_opaque(&data), "ECHO {i}");
}

fn daemon_alive(d: &mut Daemon) -> bool {
    d.child
        .as_mut()
        .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
}

#[test]
fn kill9_calling_app_with_calls_in_flight_returns_regions_ops_and_buffers_to_baseline() {
    let (a, b) = pair("k9call");
    let _server = rdmatest_serve(&b.app);
    let mut c = Client::connect(&a.app).expect("attach");
    let peer = c.peer("server").expect("peer");
    echo(&mut c, peer, 0, &a, &b);
    let base_a = settled(&a);
    let base_b = settled(&b);
    // Each poll thread's buffer pool, and this client's arena registered on every thread.
    let threads = common::threads(&a);
    assert_eq!(
        (base_a["apps"], base_a["regions"]),
        (1, 2 * threads),
        "{base_a:?}"
    );

    // Another app submits four one-second SLEEPs and is killed while they are in flight.
    let (mut victim, _) = App::start(
        Command::new(env!("CARGO_BIN_EXE_rdmatest"))
            .arg("inflight")
            .arg(&a.app)
            .args(["server", "4"]),
        "submitted",
    );
    let busy = eventually(30, || {
        let n = counts(&a);
        (n["apps"] == 2 && n["rpcs-in-flight"] == 4).then_some(n)
    })
    .unwrap_or_else(|| panic!("the calls never showed: {:?}\n{}", counts(&a), a.log()));
    assert_eq!(busy["regions"], base_a["regions"] + threads);
    assert_eq!(
        busy["region-bytes"],
        base_a["region-bytes"] + threads * 4 * 1024 * 1024
    );
    // Each call in flight holds a send buffer (its tail is the reply's landing area).
    assert_eq!(
        busy["send-buffers"] - busy["send-buffers-free"],
        4,
        "{busy:?}"
    );
    victim.kill9();

    // The other app keeps working while the dead app's calls finish at B.
    for i in 1..=5 {
        echo(&mut c, peer, i, &a, &b);
    }
    back_to(&a, &base_a, 60);
    back_to(&b, &base_b, 60);
    let s = a.ctl_json(&["stats"]);
    assert_eq!(common::thread_sum(&s, "apps-detached"), 1);
    echo(&mut c, peer, 6, &a, &b);
}

#[test]
fn kill9_serving_app_with_calls_delivered_returns_regions_ops_and_buffers_to_baseline() {
    let (a, b) = pair("k9serve");
    let threads = common::threads(&b);
    assert_eq!((counts(&b)["apps"], counts(&b)["regions"]), (0, threads));
    let mut c = Client::connect(&a.app).expect("attach");
    let peer = c.peer("server").expect("peer");
    common::null_unserved(&mut c, peer, T);
    let base_a = settled(&a);
    let base_b = settled(&b);

    // Four one-second SLEEPs: the server app handles one and holds the others delivered.
    let mut server = rdmatest_serve(&b.app);
    let tickets = common::submit_sleeps(&mut c, peer, 4);
    let busy = eventually(30, || {
        let n = counts(&b);
        (n["rpcs-in-flight"] == 4).then_some(n)
    })
    .unwrap_or_else(|| {
        panic!(
            "calls never delivered: {:?}\nB: {}\nA: {}",
            counts(&b),
            b.ctl_json(&["stats"]),
            a.ctl_json(&["stats"])
        )
    });
    assert_eq!(busy["apps"], 1);
    assert_eq!(busy["regions"], base_b["regions"] + threads);
    assert!(busy["app-ops"] > base_b["app-ops"], "{busy:?}");
    server.kill9();

    // Every call is answered (SYSTEM_ERR for those the dead server held), none hangs.
    let failed = common::answers_after_server_death(&mut c, tickets, &a, &b);
    assert!(failed >= 1, "the server died with calls delivered");
    back_to(&b, &base_b, 60);
    back_to(&a, &base_a, 60);

    // A new server app: calls work again.
    let _server = rdmatest_serve(&b.app);
    echo(&mut c, peer, 1, &a, &b);
}

#[test]
fn hostile_apps_cannot_crash_the_real_daemon_counts_return_and_others_keep_working() {
    let (mut a, b) = pair("hostile");
    let _server = rdmatest_serve(&b.app);
    let mut c = Client::connect(&a.app).expect("attach");
    let peer = c.peer("server").expect("peer");
    echo(&mut c, peer, 0, &a, &b);
    let base_a = settled(&a);
    let base_b = settled(&b);
    let exe = common::shm_testapp();

    // Three hostile apps, three attachments each: random descriptors (some reach B as calls
    // of unknown programs), racing slot rewrites, random ring indices, header scribbles.
    let mut hostiles: Vec<App> = (1..=3)
        .map(|seed: u32| {
            let child = Command::new(&exe)
                .arg("hostile")
                .arg(&a.app)
                .args([seed.to_string(), "3".into()])
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn hostile app");
            App(child)
        })
        .collect();
    let bound = Instant::now() + Duration::from_secs(300);
    let mut i = 1;
    while hostiles.iter_mut().any(App::alive) || i < 100 {
        assert!(
            Instant::now() < bound,
            "hostile apps still running after 300 s"
        );
        echo(&mut c, peer, i, &a, &b);
        i += 1;
    }
    for h in &mut hostiles {
        assert!(h.0.wait().expect("wait").success(), "a hostile app failed");
    }
    assert!(daemon_alive(&mut a), "the daemon died:\n{}", a.log());
    back_to(&a, &base_a, 60);
    back_to(&b, &base_b, 60);
    let s = a.ctl_json(&["stats"]);
    assert!(common::thread_sum(&s, "bad-submissions") > 1000, "{s}");
    assert!(common::thread_sum(&s, "apps-detached") >= 9, "{s}");
    // Some hostile calls were well-formed and crossed the wire (B answered PROG_UNAVAIL).
    let calls_in = b.ctl_json(&["stats"])["conns"][0]["calls-in"].as_u64();
    assert!(calls_in > Some(u64::from(i)), "B saw {calls_in:?} calls");
    echo(&mut c, peer, i, &a, &b);
}

/// Builds `shm-api/examples/c/NAME.c` with the strictest flags the README gives; its path.
/// Runs `cmd` (an app calling through daemon `a` to daemon `b`) to its end and asserts it
/// printed exactly `want`, showing its stderr and both daemons' logs otherwise.
fn assert_prints(cmd: &mut Command, want: &str, (a, b): (&Daemon, &Daemon)) {
    let out = cmd.output().expect("run the app");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        want,
        "{}\nA:\n{}\nB:\n{}",
        String::from_utf8_lossy(&out.stderr),
        a.log(),
        b.log()
    );
}

fn compile_c_example(name: &str) -> std::path::PathBuf {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../shm-api");
    // One file per compilation: tests that run at once each remove their own.
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let exe = std::env::temp_dir().join(format!("rpcrdma-c-{name}-e2e-{}-{n}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-I"])
        .arg(format!("{dir}/include"))
        .arg(format!("{dir}/examples/c/{name}.c"))
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("run cc");
    assert!(st.success(), "the C example {name}.c did not compile");
    exe
}

/// The C binding's event-loop calls (rr_fd, rr_arm, rr_disarm; ABI.md §5): the example keeps
/// 8 ECHO calls in flight through two daemons and sleeps in its own poll(2) between
/// completions; it exits 3 if a sleep lasts 10 s (the descriptor was never woken).
#[test]
fn c_event_loop_example_sleeps_on_its_descriptor_and_is_woken() {
    let (a, b) = pair("cevloop");
    let _server = rdmatest_serve(&b.app);
    let base_a = settled(&a);
    let exe = compile_c_example("event_loop");
    let out = Command::new(&exe)
        .arg(&a.app)
        .args(["server", "300"])
        .output()
        .expect("run");
    let _ = std::fs::remove_file(&exe);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "C event loop failed ({:?}): {text}{}\nA:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr),
        a.log()
    );
    let slept: u64 = text
        .strip_prefix("300 ECHO ok, slept ")
        .and_then(|t| t.trim_end().strip_suffix(" times"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected output: {text}"));
    // Calls cross two daemons over TCP: the loop must have slept on the descriptor.
    assert!(slept > 0, "{text}");
    assert_eq!(a.ctl_json(&["stats"])["conns"][0]["replies-in"], 300);
    back_to(&a, &base_a, 60);
}

#[test]
fn c_example_client_runs_against_real_daemons() {
    let (a, b) = pair("cexample");
    let _server = rdmatest_serve(&b.app);
    let base_a = settled(&a);
    let exe = compile_c_example("client");
    let run = |args: &[&str]| {
        Command::new(&exe)
            .arg(&a.app)
            .args(args)
            .output()
            .expect("run")
    };
    let out = run(&["server"]);
    // The same with waits that yield-spin 300 µs before sleeping (rr_set_wait).
    let yielding = run(&["server", "300"]);
    let wrong = run(&["nobody"]);
    let usage = Command::new(&exe).arg(&a.app).output().expect("run");
    let _ = std::fs::remove_file(&exe);

    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "C client failed: {text}{}\nA:\n{}\nB:\n{}",
        String::from_utf8_lossy(&out.stderr),
        a.log(),
        b.log()
    );
    // Through a daemon the cancelled call's reply buffer (beyond the inline room: a Reply chunk)
    // is lent, then released once B's late reply is in (R8166-8.1.4-c).
    assert_eq!(
        text,
        "NULL ok\nECHO ok\nREAD ok\nTIMEOUT ok\nCANCEL ok\nRELEASED ok\n"
    );
    assert_eq!(
        String::from_utf8_lossy(&yielding.stdout),
        text,
        "{}",
        String::from_utf8_lossy(&yielding.stderr)
    );
    assert_eq!(wrong.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("no peer named \"nobody\""));
    assert_eq!(usage.status.code(), Some(2));
    // Twice three calls went through A and B, and twice two SLEEPs that ended without their
    // reply (one timed out, one cancelled): B answers them late, and A drops those answers;
    // the C app's attachments are gone again.
    let late = eventually(30, || {
        let s = a.ctl_json(&["stats"]);
        (s["conns"][0]["dropped"] == 4).then_some(s)
    });
    let s = late.unwrap_or_else(|| panic!("{}\n{}", a.ctl_json(&["stats"]), a.log()));
    assert_eq!(s["conns"][0]["replies-in"], 6);
    assert_eq!(s["conns"][0]["call-errors"], 4, "{s}");
    assert_eq!(b.ctl_json(&["stats"])["conns"][0]["replies-out"], 10);
    // Its reply buffers are what rr_reply_inline says: only the cancelled call's, larger on
    // purpose, offered a Reply chunk (twice two runs); the late Send that answered it did not
    // cost the connection.
    assert_eq!(s["conns"][0]["reply-chunks"], 2, "{s}");
    assert_eq!(s["peers"][0]["conns-closed"], 0, "{s}");
    back_to(&a, &base_a, 60);
}

/// `examples/c/server.c` behind daemon B, over the soft provider's real wire: the C client
/// example through A gets its three answers; a Rust client's READ of 200 000 bytes comes back
/// through its result buffer (the C server marked the data DDP-eligible, and B wrote it into
/// the Write chunk), and its WRITE of 100 000 bytes reaches the C server whole (B pulled the
/// Read chunk). Killed, the C server leaves B's counts where they were before it attached.
#[test]
fn c_example_server_serves_through_real_daemons() {
    let (a, b) = pair("cserver");
    let base_b = settled(&b);
    let server_exe = compile_c_example("server");
    let mut server = App::start(Command::new(&server_exe).arg(&b.app), "ready").0;
    let client_exe = compile_c_example("client");
    assert_prints(
        Command::new(&client_exe).arg(&a.app).arg("server"),
        "NULL ok\nECHO ok\nREAD ok\nTIMEOUT ok\nCANCEL ok\nRELEASED ok\n",
        (&a, &b),
    );
    let _ = std::fs::remove_file(&server_exe);
    let _ = std::fs::remove_file(&client_exe);

    let mut c = Client::connect(&a.app).expect("attach");
    let peer = c.peer("server").expect("peer");
    let mut call = c.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::READ);
    call.args().put_u32(200_000).put_u32(7);
    call.result_buffer(200_000);
    let t = call.submit().expect("submit");
    let r = c.wait(t, T).expect("READ");
    assert_eq!(r.body, xdr_opaque(&pattern(7, 200_000)));
    assert_eq!(r.ddp_bytes, 200_000);
    let mut write = |n: usize| {
        let mut call = c.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::WRITE);
        call.args().put_u32(3).put_ddp_opaque(&pattern(3, n));
        let t = call.submit().expect("submit");
        c.wait(t, T).expect("WRITE")
    };
    assert_eq!(write(60_000).body, 60_000u32.to_be_bytes());
    // Arguments larger than the C server's receive buffers (64 KiB): B never delivers the call
    // to it and answers SYSTEM_ERR itself.
    let big = write(100_000);
    assert_eq!((big.accept_stat, big.body.len()), (5, 0));
    let s = &b.ctl_json(&["stats"])["conns"][0];
    assert!(s["rdma-write-bytes"].as_u64() >= Some(200_000), "{s}");
    assert!(s["rdma-read-bytes"].as_u64() >= Some(60_000), "{s}");
    // Three for the C client's calls and two for its SLEEPs (answered after it gave up on
    // them, before the READ: the C server answers one call at a time), then READ and WRITEs.
    assert_eq!(s["replies-out"], 8, "{s}");
    drop(c);

    server.kill9();
    back_to(&b, &base_b, 60);
}

/// `rpcrdmactl apps`: each daemon lists the apps attached to it with their pid, the programs
/// they serve and what they did: A's calling app (this test process) made 3 calls and got 3
/// replies; B's RDMATEST server app (its own process) serves RDMATEST v1 and served and
/// answered 3 calls. Once the server app is killed, B lists no app.
#[test]
fn rpcrdmactl_apps_lists_pids_programs_and_counts() {
    let (a, b) = pair("appslist");
    let mut server = rdmatest_serve(&b.app);
    let mut c = Client::connect(&a.app).expect("attach");
    let peer = c.peer("server").expect("peer");
    for i in 0..3 {
        echo(&mut c, peer, i, &a, &b);
    }
    let apps_a = a.ctl_json(&["apps"]);
    let [me] = apps_a.as_array().expect("array").as_slice() else {
        panic!("A lists {apps_a}");
    };
    assert_eq!(me["pid"], std::process::id(), "{me}");
    assert_eq!(
        (&me["calls"], &me["calls-done"]),
        (&3.into(), &3.into()),
        "{me}"
    );
    assert_eq!(
        (&me["served"], &me["programs"]),
        (&0.into(), &serde_json::json!([])),
        "{me}"
    );
    assert_eq!(me["ops"], 0, "{me}");

    let apps_b = b.ctl_json(&["apps"]);
    let [srv] = apps_b.as_array().expect("array").as_slice() else {
        panic!("B lists {apps_b}");
    };
    assert_eq!(srv["pid"], server.0.id(), "{srv}");
    assert_eq!(
        srv["programs"],
        serde_json::json!([format!("{:#x}/1", rdmatest::PROG)])
    );
    assert_eq!(
        (&srv["served"], &srv["replies"]),
        (&3.into(), &3.into()),
        "{srv}"
    );
    assert_eq!(
        (&srv["calls"], &srv["bad-submissions"]),
        (&0.into(), &0.into()),
        "{srv}"
    );
    assert!(
        srv["ops"].as_u64() > Some(0),
        "its posted receive buffers: {srv}"
    );
    let human = b.ctl(&["apps"]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.starts_with("THREAD  APP"), "{text}");
    assert!(
        text.contains(&server.0.id().to_string()) && text.contains("0x20524454/1"),
        "{text}"
    );

    // A SLEEP that reaches its time limit and one cancelled: A counts them for the app.
    let sleep = |c: &mut Client, limit: Option<Duration>| {
        let mut call = c.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::SLEEP);
        call.args().put_u32(300_000);
        if let Some(l) = limit {
            call.timeout(l);
        }
        call.submit().expect("submit")
    };
    let t = sleep(&mut c, Some(Duration::from_millis(20)));
    assert!(matches!(c.wait(t, T), Err(Error::Status(status::TIMEOUT))));
    let t = sleep(&mut c, None);
    c.cancel(t).expect("cancel");
    assert!(matches!(
        c.wait(t, T),
        Err(Error::Status(status::CANCELLED))
    ));
    let apps_a = a.ctl_json(&["apps"]);
    let me = &apps_a[0];
    assert_eq!(
        (
            &me["calls"],
            &me["calls-done"],
            &me["timeouts"],
            &me["cancels"]
        ),
        (&5.into(), &5.into(), &1.into(), &1.into()),
        "{me}"
    );
    let text = String::from_utf8_lossy(&a.ctl(&["apps"]).stdout).into_owned();
    assert!(
        text.lines()
            .next()
            .is_some_and(|h| h.ends_with("CANCELS  TIMEOUTS")),
        "{text}"
    );

    server.kill9();
    assert!(
        eventually(20, || b
            .ctl_json(&["apps"])
            .as_array()?
            .is_empty()
            .then_some(()))
        .is_some(),
        "{}",
        b.ctl_json(&["apps"])
    );
}

/// R8166-8.1.4-c through two real daemons: a READ into a result buffer (a Write chunk) whose
/// time limit passes while B's server app sleeps on it ends for the client at once, its buffer
/// lent; B's late RDMA Write lands in it without costing the connection; A then releases the
/// buffer, and the next READ comes back whole on the same connection.
#[test]
fn a_late_write_into_a_lent_chunk_costs_no_connection() {
    let (a, b) = pair("lent");
    let exe = common::shm_testapp();
    let _server = App::start(
        Command::new(&exe)
            .arg("server")
            .arg(&b.app)
            .env("SHM_TESTAPP_DELAY_MS", "500"),
        "ready",
    );
    assert_prints(
        Command::new(&exe)
            .arg("lent-read")
            .arg(&a.app)
            .arg("server"),
        "timeout ok\nlent 1\nreleased ok\nafter ok\n",
        (&a, &b),
    );
    let s = a.ctl_json(&["stats"]);
    let (conn, peer) = (&s["conns"][0], &s["peers"][0]);
    // B wrote 64 KiB into the lent chunk, then twice in all; A dropped the late reply.
    assert_eq!(conn["dropped"], 1, "{s}");
    assert_eq!(conn["write-chunks"], 2, "{s}");
    assert_eq!(
        (&peer["conns-opened"], &peer["conns-closed"]),
        (&1.into(), &0.into()),
        "{s}"
    );
    assert_eq!(
        b.ctl_json(&["stats"])["conns"][0]["rdma-write-bytes"],
        131072
    );
}

/// The NFS probe through two daemons (RFC 8167 with NFSv4.1's callbacks, R8166-7.1-d): `nfs-probe
/// serve` behind B, `nfs-probe run --nfs4` through A. Every step passes, `nfs4_backchannel`
/// among them: the miniserver's recall of the probe's read delegation goes from B's app to B,
/// back over B's accepted connection as a backward-direction call, to the probe's callback
/// server attached to A, and its answer comes back the same way (the server then reports the
/// back channel up), as does its probe of the back channel when the session is complete. A
/// counts the calls in and the replies out, B the calls out and the replies in.
#[test]
fn nfs_probe_with_nfsv4_callbacks_passes_through_two_daemons() {
    // The probe's 1 MiB READ and WRITE pieces and the miniserver's 1 MiB receive buffers.
    let (a, b) = pair_with("nfs4cb", "max-apps = 4\narena-size = 33554432");
    let exe = common::nfs_probe();
    let (_served, line) = App::start(
        Command::new(&exe)
            .args(["serve", "--socket"])
            .arg(&b.app)
            .args(["--mount-listen", "127.0.0.1:0", "--dir-entries", "300"]),
        "ready, MOUNT on ",
    );
    let mount = line
        .trim()
        .rsplit(':')
        .next()
        .expect("MOUNT port")
        .to_string();
    let out = Command::new(&exe)
        .args(["run", "--socket"])
        .arg(&a.app)
        .args([
            "--peer",
            "server",
            "--mount-server",
            "127.0.0.1",
            "--mount-port",
        ])
        .arg(&mount)
        .args([
            "--export",
            "/export",
            "--dir-entries",
            "300",
            "--random-rounds",
            "4",
        ])
        .args(["--inflight", "16", "--nfs4", "--json"])
        .output()
        .expect("run nfs-probe");
    let text = String::from_utf8_lossy(&out.stdout);
    let logs = || format!("{text}\nA:\n{}\nB:\n{}", a.log(), b.log());
    assert!(out.status.success(), "{}", logs());
    let v: serde_json::Value = serde_json::from_str(text.trim()).expect("--json output");
    let cb = v["steps"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "nfs4_backchannel"))
        .unwrap_or_else(|| panic!("no nfs4_backchannel step: {}", logs()));
    assert_eq!(cb["pass"], true, "{}", logs());
    let detail = cb["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("CB_RECALL of it") && detail.contains("sr_status_flags 0x0"),
        "{detail}"
    );
    // The miniserver's probe of the back channel (CB_SEQUENCE alone, once the session is
    // complete) and the recall: two calls each way.
    assert!(
        detail.ends_with("back-channel probes answered before the recall: 1"),
        "{detail}"
    );
    let (sa, sb) = (a.ctl_json(&["stats"]), b.ctl_json(&["stats"]));
    assert_eq!(
        (&sa["conns"][0]["calls-in"], &sa["conns"][0]["replies-out"]),
        (&2.into(), &2.into()),
        "{sa}"
    );
    assert_eq!(
        (&sb["conns"][0]["calls-out"], &sb["conns"][0]["replies-in"]),
        (&2.into(), &2.into()),
        "{sb}"
    );
}
