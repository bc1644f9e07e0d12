//! A short real run: real processes (loopback harness, `serve`), real shared memory; every case of every
//! transfer mode completes with intact data. Timings are not checked.

use rpcrdma_bench::case::{self, Case, Mode, Proc};
use rpcrdma_bench::run::{run_case, RunOptions, Stop};
use rpcrdma_bench::target::{spawn_ready, temp_socket, Session, Target};
use rpcrdma_bench::workload::ReplyBuffer;
use rpcrdma_bench::{attach, serve};
use rpcrdma_shm::Client;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_rpcrdma-bench");

fn opts(count: u64, in_flight: usize) -> RunOptions {
    RunOptions {
        warmup: Duration::ZERO,
        stop: Stop::Count(count),
        in_flight,
        think: Duration::ZERO,
        rate: None,
        reply: ReplyBuffer::Sized,
        progress: false,
    }
}

/// The loopback harness (kept running while the session lives) and a client attached to it:
/// the client, the peer index and its name.
fn loopback() -> (Session, Client, u32, String) {
    let session = Target::Loopback
        .open(Path::new(EXE), Duration::ZERO, Duration::from_micros(200))
        .unwrap();
    let (c, peer, name) = attach(&session.socket, "", Duration::ZERO).unwrap();
    (session, c, peer, name)
}

#[test]
fn every_mode_and_size_end_completes_with_intact_data_through_loopback_and_serve() {
    let (session, mut c, peer, name) = loopback();
    assert_eq!(name, "loopback");
    serve::start_callbacks(session.socket.clone(), Duration::ZERO).unwrap();
    let mut cases = case::matrix("quick").unwrap();
    for s in [
        "echo/inline/0",
        "echo/read-chunk/4MiB",
        "echo/write-chunk/4MiB",
        "read/write-chunk/4MiB",
        "write/read-chunk/4MiB",
        "write/long-call/4MiB",
        "read/long-reply/4MiB",
        "echo/long-reply/1MiB",
        "echo/long-call/1MiB",
        "echo/inline/1000",
        "callback/inline/0",
    ] {
        cases.push(s.parse().unwrap());
    }
    for m in Mode::ALL {
        assert!(cases.iter().any(|c| c.mode == m));
    }
    for p in Proc::ALL {
        assert!(cases.iter().any(|c| c.proc_ == p));
    }
    let t0 = Instant::now();
    for case in cases {
        let n = if case.size >= 1 << 20 { 3 } else { 20 };
        let r = run_case(&mut c, peer, case, &opts(n, 1), t0).unwrap();
        assert_eq!(r.errors, 0, "{case}: {:?}", r.first_error);
        assert_eq!(r.count, n, "{case}");
        assert_eq!(r.hist.len(), n, "{case}: one recorded round trip per call");
        assert!(!r.co_corrected);
    }
}

#[test]
fn throughput_mode_keeps_calls_in_flight_and_records_corrected_latencies() {
    let (_session, mut c, peer, _) = loopback();
    for s in ["null", "echo/read-chunk/64KiB", "read/write-chunk/1MiB"] {
        let case: Case = s.parse().unwrap();
        let r = run_case(&mut c, peer, case, &opts(50, 8), Instant::now()).unwrap();
        assert_eq!(r.errors, 0, "{s}: {:?}", r.first_error);
        assert_eq!(r.count, 50);
        assert_eq!(r.in_flight, 8);
        assert!(r.co_corrected && r.expected_interval_ns > 0);
        // Corrected recording only ever adds samples.
        assert!(r.hist.len() >= 50);
        assert_eq!(c.in_flight(), 0, "{s}: calls left in flight after the case");
    }
}

/// A think time spaces the calls out but stays outside the round trips: the measured phase
/// lasts at least one pause per call, and every call is still recorded once.
#[test]
fn think_time_spaces_the_calls_and_is_not_counted_in_round_trips() {
    let (_session, mut c, peer, _) = loopback();
    let think = Duration::from_millis(20);
    let o = RunOptions {
        think,
        ..opts(5, 1)
    };
    let r = run_case(&mut c, peer, "null".parse().unwrap(), &o, Instant::now()).unwrap();
    assert_eq!((r.count, r.errors, r.hist.len()), (5, 0, 5));
    assert!(r.elapsed >= think * 5, "{:?}", r.elapsed);
    assert_eq!(rpcrdma_bench::report::Settings::from(&o).think_us, 20_000);
}

/// `--reply-buffer` reaches every call: a buffer smaller than ECHO's reply fails each call
/// (REPLY_TOO_LARGE), the sized one and the Client's default do not; the choice is recorded.
#[test]
fn the_reply_buffer_option_sizes_every_call_and_is_recorded() {
    let (_session, mut c, peer, _) = loopback();
    let case: Case = "echo/inline/256".parse().unwrap();
    for (reply, fits) in [
        (ReplyBuffer::Bytes(64), false),
        (ReplyBuffer::Sized, true),
        (ReplyBuffer::Default, true),
    ] {
        let o = RunOptions {
            reply,
            ..opts(6, 1)
        };
        let r = run_case(&mut c, peer, case, &o, Instant::now()).unwrap();
        if fits {
            assert_eq!((r.count, r.errors), (6, 0), "{reply}");
        } else {
            assert_eq!(r.count, 0, "{reply}");
            let e = r.first_error.unwrap_or_default();
            assert!(e.contains("status 11 (REPLY_TOO_LARGE)"), "{e}");
        }
        let recorded = rpcrdma_bench::report::Settings::from(&o).reply_buffer;
        assert_eq!(recorded.parse::<ReplyBuffer>(), Ok(reply));
    }
    assert!("lots".parse::<ReplyBuffer>().is_err());
}

/// An open loop sends on its schedule, whatever the replies: every measured call is recorded
/// once (no correction), none goes out before it is due, and nothing is left in flight.
#[test]
fn open_loop_sends_on_schedule_and_records_every_measured_call_once() {
    let (_session, mut c, peer, _) = loopback();
    let o = RunOptions {
        warmup: Duration::from_millis(20),
        rate: Some(2000.0),
        ..opts(100, 8)
    };
    let r = run_case(
        &mut c,
        peer,
        "echo/inline/64".parse().unwrap(),
        &o,
        Instant::now(),
    )
    .unwrap();
    assert_eq!(
        (r.count, r.errors, r.hist.len()),
        (100, 0, 100),
        "{:?}",
        r.first_error
    );
    assert_eq!(
        (r.offered_per_s, r.in_flight, r.co_corrected),
        (Some(2000.0), 8, false)
    );
    // The 100th measured call is due 99 periods after the first.
    assert!(
        r.elapsed >= Duration::from_micros(99 * 500),
        "{:?}",
        r.elapsed
    );
    // Every measured call either waited for a slot or has its send lag recorded.
    let lags = r.send_lag.as_ref().map_or(0, |h| h.len());
    assert_eq!(r.late + lags, 100, "late {}, lags {lags}", r.late);
    assert_eq!(c.in_flight(), 0);
}

/// With one slot and a call due every microsecond, calls wait for the slot: they are counted
/// late, and their round trips run from their due time, so the last call's is the whole
/// backlog (the time from its due time to the end), not one round trip.
#[test]
fn open_loop_counts_calls_that_wait_for_a_slot_and_their_wait() {
    let (_session, mut c, peer, _) = loopback();
    let o = RunOptions {
        rate: Some(1e6),
        ..opts(200, 1)
    };
    let r = run_case(&mut c, peer, "null".parse().unwrap(), &o, Instant::now()).unwrap();
    assert_eq!((r.count, r.errors), (200, 0), "{:?}", r.first_error);
    assert!(r.late >= 100, "late {}", r.late);
    let backlog = r.elapsed.saturating_sub(Duration::from_micros(199));
    assert!(
        r.hist.max() as f64 >= backlog.as_nanos() as f64 * 0.99,
        "max {} ns, backlog {backlog:?}",
        r.hist.max()
    );
}

#[test]
fn wrong_reply_data_is_counted_as_errors_not_as_round_trips() {
    // ring-echo completes every call with an empty reply: right for NULL, wrong for ECHO.
    let sock = temp_socket("wrong-data");
    let mut child =
        spawn_ready(Command::new(EXE).arg("ring-echo").arg(&sock), "ring-echo").unwrap();
    let (mut c, peer, _) = attach(&sock, "", Duration::ZERO).unwrap();
    let null = run_case(
        &mut c,
        peer,
        "null".parse().unwrap(),
        &opts(10, 1),
        Instant::now(),
    )
    .unwrap();
    assert_eq!((null.count, null.errors), (10, 0));
    let echo: Case = "echo/inline/64".parse().unwrap();
    let o = RunOptions {
        stop: Stop::Duration(Duration::from_millis(100)),
        ..opts(0, 1)
    };
    let r = run_case(&mut c, peer, echo, &o, Instant::now()).unwrap();
    assert_eq!(r.count, 0);
    assert!(r.errors > 0);
    assert!(r.first_error.unwrap().contains("expected data"));
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&sock);
}

#[test]
fn spawn_daemons_without_the_binary_says_how_to_get_it() {
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/demo-client.toml");
    let t = Target::Daemons {
        rpcrdmad: "/nonexistent/rpcrdmad".into(),
        configs: vec![cfg],
        peer: None,
    };
    let e = t
        .open(Path::new(EXE), Duration::ZERO, Duration::ZERO)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cannot run the daemon binary /nonexistent/rpcrdmad"),
        "{e}"
    );
    assert!(e.contains("--rpcrdmad"), "{e}");
}

#[test]
fn attach_to_a_socket_nobody_listens_on_fails_with_the_path() {
    let e = attach(Path::new("/nonexistent/app.sock"), "", Duration::ZERO)
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/app.sock"), "{e}");
}

#[test]
fn the_cli_table_names_round_trips_and_every_case() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(EXE)
        .args([
            "run",
            "--matrix",
            "quick",
            "--warmup",
            "0s",
            "--count",
            "5",
            "--no-progress",
            "--out",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("Round-trip times in µs"));
    for c in case::matrix("quick").unwrap() {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{c} "))),
            "{c} missing:\n{text}"
        );
    }
    assert!(text.contains("plot: "));
}

#[test]
fn spawn_daemons_starts_rpcrdmad_per_config_serves_behind_it_and_records_the_transport() {
    // A stand-in for rpcrdmad with its documented CLI (`--version`, `--config FILE`) that plays the daemon
    // with the loopback harness on the config's app socket.
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("app.sock");
    let cfg = dir.path().join("d.toml");
    std::fs::write(
        &cfg,
        format!(
            "[daemon]\napp-socket = \"{}\"\nadmin-socket = \"{}\"\n\n[transport]\ncredits = 17\n",
            sock.display(),
            dir.path().join("admin.sock").display()
        ),
    )
    .unwrap();
    let fake = dir.path().join("rpcrdmad");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\n[ \"$1\" = --version ] && {{ echo 'rpcrdmad stand-in 0.0'; exit 0; }}\n\
             sock=$(sed -n 's/^app-socket *= *\"\\(.*\\)\"/\\1/p' \"$2\")\nexec {EXE} loopback \"$sock\"\n"
        ),
    )
    .unwrap();
    let mut perm = std::fs::metadata(&fake).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    std::fs::set_permissions(&fake, perm).unwrap();
    let t = Target::Daemons {
        rpcrdmad: fake,
        configs: vec![cfg],
        peer: None,
    };
    let session = t
        .open(Path::new(EXE), Duration::ZERO, Duration::ZERO)
        .unwrap();
    assert_eq!(session.socket, sock);
    let i = &session.info;
    assert_eq!(i.kind, "daemons");
    assert_eq!(i.daemon_version.as_deref(), Some("rpcrdmad stand-in 0.0"));
    assert_eq!(i.provider.as_deref(), Some("soft"));
    assert_eq!(i.credits, Some(17));
    assert_eq!(
        (i.inline_send, i.inline_recv, i.ddp_threshold),
        (Some(4096), Some(4096), Some(1024))
    );
    let (mut c, peer, _) = attach(&session.socket, &i.peer, Duration::ZERO).unwrap();
    let r = run_case(
        &mut c,
        peer,
        "echo/read-chunk/64KiB".parse().unwrap(),
        &opts(10, 1),
        Instant::now(),
    )
    .unwrap();
    assert_eq!((r.count, r.errors), (10, 0));
    drop(c);
    drop(session);
    assert!(
        std::os::unix::net::UnixStream::connect(&sock).is_err(),
        "the daemon was not stopped"
    );
}

#[test]
fn run_attach_reaches_a_running_harness_with_serve_sized_for_its_small_arena() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("lb.sock");
    // shm-loopback's default geometry: an 8 MiB arena per app.
    let mut lb = spawn_ready(
        Command::new(EXE)
            .arg("loopback")
            .arg(&sock)
            .args(["--arena", "8388608"]),
        "loopback",
    )
    .unwrap();
    let mut srv = spawn_ready(Command::new(EXE).arg("serve").arg(&sock), "serve").unwrap();
    let out = Command::new(EXE)
        .args([
            "run",
            "--json",
            "--warmup",
            "0s",
            "--count",
            "10",
            "--no-progress",
        ])
        .args([
            "--case",
            "echo/read-chunk/1KiB",
            "--case",
            "read/write-chunk/512KiB",
            "--attach",
        ])
        .arg(&sock)
        .arg("--out")
        .arg(dir.path())
        .output()
        .unwrap();
    let _ = (srv.kill(), lb.kill(), srv.wait(), lb.wait());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["environment"]["target"]["kind"], "attach");
    assert_eq!(doc["environment"]["target"]["peer"], "loopback");
    for c in doc["cases"].as_array().unwrap() {
        assert_eq!(
            (c["count"].as_u64(), c["errors"].as_u64()),
            (Some(10), Some(0)),
            "{c}"
        );
    }
}

#[test]
fn a_count_bounded_case_ends_even_when_every_call_fails() {
    // A harness with no RDMATEST server: every call completes with UNKNOWN_PROGRAM.
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("empty.sock");
    let mut lb = spawn_ready(Command::new(EXE).arg("loopback").arg(&sock), "loopback").unwrap();
    let (mut c, peer, _) = attach(&sock, "", Duration::ZERO).unwrap();
    let r = run_case(
        &mut c,
        peer,
        "null".parse().unwrap(),
        &opts(25, 2),
        Instant::now(),
    )
    .unwrap();
    let _ = (lb.kill(), lb.wait());
    assert_eq!(r.count, 0);
    assert!(r.errors >= 25);
    assert!(
        r.first_error.unwrap().contains("status 6"),
        "UNKNOWN_PROGRAM"
    );
}

#[test]
fn yield_us_makes_the_caller_and_the_served_app_yield_spin_and_is_recorded() {
    // The loopback target starts `serve` with `--yield-us` too: the run only succeeds if it accepts it.
    let out = Command::new(EXE)
        .args([
            "run",
            "--json",
            "--case",
            "null",
            "--case",
            "echo/inline/64",
            "--warmup",
            "0s",
            "--count",
            "20",
            "--no-progress",
            "--yield-us",
            "300",
        ])
        .arg("--out")
        .arg(tempfile::tempdir().unwrap().path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["environment"]["app_spin_us"], 300);
    assert_eq!(doc["environment"]["app_yield"], true);
    for c in doc["cases"].as_array().unwrap() {
        assert_eq!(
            (c["count"].as_u64(), c["errors"].as_u64()),
            (Some(20), Some(0)),
            "{c}"
        );
    }
    // Busy or yielding: one or the other.
    let out = Command::new(EXE)
        .args(["run", "--spin-us", "5", "--yield-us", "5"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
}
