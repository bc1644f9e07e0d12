//! `rpcrdmad` and `rpcrdmactl` as an operator meets them: config errors, start-up errors,
//! admin commands, metrics, signals, reconnects, version fallback.

mod common;

use common::{config, echo, eventually, free_port, rdmatest_server, tmpdir, Daemon};
use rpcrdma_shm::rdmatest;
use rpcrdma_shm::Client;
use std::process::Command;
use std::time::Duration;

const T: Option<Duration> = Some(Duration::from_secs(20));

fn rpcrdmad(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rpcrdmad"))
        .args(args)
        .output()
        .expect("run rpcrdmad")
}

#[test]
fn check_config_prints_located_errors_and_exits_1() {
    let dir = tmpdir("check");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[transport]\ncredits = \"many\"\nbogus = 1\n").expect("write");
    let out = rpcrdmad(&["--check-config", bad.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml:2:"), "{err}");
    assert!(err.contains("bad.toml:3:"), "{err}");
    assert!(err.contains("bogus"), "{err}");

    let good = dir.join("good.toml");
    std::fs::write(&good, config(&dir, 20049, None, "")).expect("write");
    let out = rpcrdmad(&["--check-config", good.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn invalid_config_refuses_to_start_with_exit_1() {
    let dir = tmpdir("badstart");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[pools]\nconnections = -1\n").expect("write");
    let out = rpcrdmad(&["--config", bad.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing started"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ibv_provider_without_a_device_exits_3_with_a_soft_hint() {
    let dir = tmpdir("ibv");
    let text = config(&dir, free_port(), None, "")
        .replace("[provider]\nkind = \"soft\"", "[provider]\nkind = \"ibv\"");
    let path = dir.join("ibv.toml");
    std::fs::write(&path, text).expect("write");
    let out = rpcrdmad(&["--config", path.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no RDMA device"), "{err}");
    assert!(err.contains("kind = \"soft\""), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn admin_socket_in_use_exits_3() {
    let a = Daemon::start("inuse-a", None);
    // Same directory (same sockets), another listener port.
    let text = config(&a.dir, free_port(), None, "");
    let path = a.dir.join("second.toml");
    std::fs::write(&path, text).expect("write");
    let out = rpcrdmad(&["--config", path.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use"), "{err}");
    // The first daemon is unharmed.
    assert!(a.ctl(&["status"]).status.success());
}

#[test]
fn listener_port_in_use_exits_3() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = held.local_addr().expect("addr").port();
    let dir = tmpdir("portinuse");
    let path = dir.join("p.toml");
    std::fs::write(&path, config(&dir, port, None, "")).expect("write");
    let out = rpcrdmad(&["--config", path.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already in use"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rpcrdmactl_status_conns_and_conn_show_against_running_daemons() {
    let b = Daemon::start("ctl-b", None);
    let a = Daemon::start("ctl-a", Some(("server", b.port)));
    a.wait_peer_up("server");

    let human = a.ctl(&["status"]);
    assert!(human.status.success());
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("PEER"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("server") && l.contains(" up ")),
        "{text}"
    );

    let conns = a.ctl_json(&["conns"]);
    let c = &conns[0];
    assert_eq!(c["peer"], "server");
    assert_eq!(c["role"], "client");
    assert_eq!(c["state"], "up");
    // RFC 8797 private data from the server's accept: its inline sizes.
    assert_eq!(c["peer-inline-send"], 4096);
    assert_eq!(c["peer-inline-recv"], 4096);
    let bconns = b.ctl_json(&["conns"]);
    assert_eq!(bconns[0]["role"], "server");
    assert_eq!(bconns[0]["peer-inline-recv"], 4096);

    let id = c["id"].as_u64().expect("id").to_string();
    let show = a.ctl_json(&["conn", "show", &id]);
    assert_eq!(show["conn"]["peer"], "server");
    assert!(show["counters"].is_object());
    let missing = a.ctl(&["conn", "show", "999"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no connection 999"));

    let nobody = Command::new(env!("CARGO_BIN_EXE_rpcrdmactl"))
        .args(["--socket", "/nonexistent/admin.sock", "status"])
        .output()
        .expect("run");
    assert_eq!(nobody.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&nobody.stderr).contains("is the daemon running"));
}

fn scrape(port: u16) -> String {
    common::scrape_response(port, None).1
}

#[test]
fn metrics_endpoint_serves_prometheus_text_with_counters_and_histograms() {
    let b = Daemon::start("metrics-b", None);
    let dir = tmpdir("metrics-a");
    let (port, mport) = (free_port(), free_port());
    let text = config(&dir, port, Some(("server", b.port)), "").replace(
        "log-level",
        &format!("metrics-listen = \"127.0.0.1:{mport}\"\nlog-level"),
    );
    let a = Daemon::start_with(dir, port, &text);
    a.wait_peer_up("server");
    rdmatest_server(&b.app);
    let mut c = Client::connect(&a.app).expect("attach");
    let peer = c.peer("server").expect("peer");
    for len in [10, 100, 1000] {
        echo(&mut c, peer, len);
    }
    let body = scrape(mport);
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("Prometheus text format");
    let value = |name: &str| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name)
            .map(|s| s.value.clone())
    };
    assert!(
        matches!(value("rpcrdmad_calls_out_total"), Some(prometheus_parse::Value::Counter(v)) if v == 3.0)
    );
    assert!(
        matches!(value("rpcrdmad_replies_in_total"), Some(prometheus_parse::Value::Counter(v)) if v == 3.0)
    );
    let rtt = scrape
        .samples
        .iter()
        .find(|s| s.metric == "rpcrdmad_conn_rtt_seconds")
        .expect("rtt histogram");
    assert_eq!(rtt.labels.get("peer"), Some("server"));
    let prometheus_parse::Value::Histogram(buckets) = &rtt.value else {
        panic!("rtt is not a histogram: {:?}", rtt.value);
    };
    let inf = buckets
        .iter()
        .find(|b| b.less_than.is_infinite())
        .expect("+Inf");
    assert_eq!(inf.count, 3.0);
    assert!(scrape
        .samples
        .iter()
        .any(|s| s.metric == "rpcrdmad_thread_busy_seconds_total"));
    // At least the three replies' receive completions were polled, on one thread or another.
    let completions: f64 = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "rpcrdmad_thread_completions_total")
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) => v,
            _ => panic!("not a counter: {s:?}"),
        })
        .sum();
    assert!(completions >= 3.0, "{completions}");
    // Resource gauges: the buffer pool and this client's arena are registered.
    assert!(
        matches!(value("rpcrdmad_regions"), Some(prometheus_parse::Value::Gauge(v)) if v == 2.0)
    );
    assert!(matches!(value("rpcrdmad_apps"), Some(prometheus_parse::Value::Gauge(v)) if v == 1.0));
    // Nothing is served on the calling side: no call waits for a server's buffer or a slot.
    assert!(
        matches!(value("rpcrdmad_calls_held"), Some(prometheus_parse::Value::Gauge(v)) if v == 0.0)
    );
    assert!(
        matches!(value("rpcrdmad_calls_held_total"), Some(prometheus_parse::Value::Counter(v)) if v == 0.0)
    );
    assert!(
        matches!(value("rpcrdmad_calls_waiting_slot"), Some(prometheus_parse::Value::Gauge(v)) if v == 0.0)
    );
    // No connection closed: none retires.
    assert!(
        matches!(value("rpcrdmad_conns_retiring"), Some(prometheus_parse::Value::Gauge(v)) if v == 0.0)
    );
    for pool in ["send", "recv"] {
        let total = scrape
            .samples
            .iter()
            .find(|s| s.metric == "rpcrdmad_buffers" && s.labels.get("pool") == Some(pool));
        assert!(
            matches!(total.map(|s| &s.value), Some(prometheus_parse::Value::Gauge(v)) if *v > 0.0),
            "{pool}: {total:?}"
        );
    }
    // Errors by code: one series per code, none sent on a healthy connection.
    let chunk = scrape.samples.iter().find(|s| {
        s.metric == "rpcrdmad_conn_errors_sent_total" && s.labels.get("code") == Some("err_chunk")
    });
    assert!(
        matches!(chunk.map(|s| &s.value), Some(prometheus_parse::Value::Counter(v)) if *v == 0.0),
        "{chunk:?}"
    );
}

#[test]
fn sigterm_drains_the_call_in_flight_then_exits_0() {
    let b = Daemon::start("drain-b", None);
    let mut a = Daemon::start("drain-a", Some(("server", b.port)));
    a.wait_peer_up("server");
    rdmatest_server(&b.app);
    let mut c = Client::connect(&a.app).expect("attach");
    let peer = c.peer("server").expect("peer");
    let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::SLEEP);
    call.args().put_u32(400_000);
    let t = call.submit().expect("submit");
    // The call is in the engine (counted) before the signal.
    let counted = eventually(10, || {
        (a.ctl_json(&["stats"])["conns"][0]["calls-out"] == 1).then_some(())
    });
    assert!(counted.is_some());
    a.signal("TERM");
    let r = c
        .wait(t, T)
        .expect("the call in flight completes during the drain");
    assert_eq!(r.accept_stat, 0);
    assert_eq!(a.wait_exit(20), Some(0), "{}", a.log());
    assert!(a.log().contains("drained"));
    assert!(!a.admin.exists(), "admin socket removed on exit");
}

#[test]
fn client_reconnects_after_the_peer_restarts() {
    let dir_b = tmpdir("restart-b");
    let port_b = free_port();
    let text_b = config(&dir_b, port_b, None, "");
    let mut b = Daemon::start_with(dir_b.clone(), port_b, &text_b);
    let a = Daemon::start("restart-a", Some(("server", port_b)));
    a.wait_peer_up("server");
    b.signal("KILL");
    let _ = b.wait_exit(10);
    std::mem::forget(b);
    let down = eventually(20, || {
        let s = a.ctl_json(&["status"]);
        (s["peers"][0]["state"] != "up").then_some(())
    });
    assert!(down.is_some(), "A noticed the loss");
    let said = eventually(20, || {
        a.log()
            .contains("connect failed: the peer refused or did not answer")
            .then_some(())
    });
    assert!(
        said.is_some(),
        "A says why reconnecting fails:\n{}",
        a.log()
    );
    let why = eventually(10, || {
        let s = a.ctl_json(&["status"]);
        let e = s["peers"][0]["last-error"].as_str().map(str::to_owned);
        e.filter(|e| e.starts_with("connect failed"))
    });
    assert_eq!(
        why.as_deref(),
        Some("connect failed: the peer refused or did not answer"),
        "status says why the peer is down"
    );
    let table = String::from_utf8_lossy(&a.ctl(&["status"]).stdout).into_owned();
    assert!(
        table.contains("LAST-ERROR") && table.contains("the peer refused or did not answer"),
        "{table}"
    );
    let b2 = Daemon::start_with(dir_b, port_b, &text_b);
    a.wait_peer_up("server");
    rdmatest_server(&b2.app);
    let mut c = Client::connect(&a.app).expect("attach");
    let peer = c.peer("server").expect("peer");
    echo(&mut c, peer, 500);
    let s = a.ctl_json(&["status"]);
    assert_eq!(s["peers"][0]["failures"], 0, "failures reset once up");
    assert!(s["peers"][0]["last-error"].is_null(), "and the last error");
}

#[test]
fn conn_close_disconnects_and_the_peer_is_reconnected() {
    let b = Daemon::start("close-b", None);
    let a = Daemon::start("close-a", Some(("server", b.port)));
    a.wait_peer_up("server");
    rdmatest_server(&b.app);
    let id = a.ctl_json(&["conns"])[0]["id"].as_u64().expect("id");
    let out = a.ctl(&["conn", "close", &id.to_string()]);
    assert!(out.status.success());
    let again = eventually(20, || {
        let s = a.ctl_json(&["status"]);
        let p = &s["peers"][0];
        (p["state"] == "up").then_some(())
    });
    assert!(again.is_some(), "{}", a.log());
    let mut c = Client::connect(&a.app).expect("attach");
    let peer = c.peer("server").expect("peer");
    echo(&mut c, peer, 64);
    assert!(a.log().contains("connection down"));
}

/// A daemon whose `/metrics` listens on a port of its own: the daemon and that port.
fn with_metrics(name: &str, peer: Option<(&str, u16)>) -> (Daemon, u16) {
    let dir = tmpdir(name);
    let (port, mport) = (free_port(), free_port());
    let text = config(&dir, port, peer, "").replace(
        "log-level",
        &format!("metrics-listen = \"127.0.0.1:{mport}\"\nlog-level"),
    );
    (Daemon::start_with(dir, port, &text), mport)
}

/// The value of counter `metric` with every label of `labels`, in one scrape of `port`.
fn counter(port: u16, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let body = scrape(port);
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("Prometheus text format");
    scrape
        .samples
        .iter()
        .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
        .and_then(|s| match s.value {
            prometheus_parse::Value::Counter(v) => Some(v),
            _ => None,
        })
}

/// How many calls the `rpcrdmad_peer_rtt_seconds` histogram of `peer` holds, in one scrape.
fn peer_rtt_count(port: u16, peer: &str) -> Option<f64> {
    let body = scrape(port);
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("Prometheus text format");
    let s = scrape
        .samples
        .iter()
        .find(|s| s.metric == "rpcrdmad_peer_rtt_seconds" && s.labels.get("peer") == Some(peer))?;
    match &s.value {
        prometheus_parse::Value::Histogram(b) => b
            .iter()
            .find(|b| b.less_than.is_infinite())
            .map(|b| b.count),
        _ => None,
    }
}

/// `rpcrdmad_peer_*_total` and `rpcrdmad_peer_rtt_seconds` go on across a reconnect, while
/// the connection's own series ends with it (the next connection has a new `conn`): on the
/// connecting side under the peer's configured name, on the accepting side under the remote
/// host's address.
#[test]
fn peer_counters_in_metrics_go_on_across_a_reconnect() {
    let (b, bm) = with_metrics("peerm-b", None);
    let (a, am) = with_metrics("peerm-a", Some(("server", b.port)));
    a.wait_peer_up("server");
    rdmatest_server(&b.app);
    let calls = |c: &mut Client, n: usize| {
        let peer = c.peer("server").expect("peer");
        for _ in 0..n {
            echo(c, peer, 100);
        }
    };
    calls(&mut Client::connect(&a.app).expect("attach"), 3);
    let first = a.ctl_json(&["conns"])[0]["id"].as_u64().expect("id");
    let conn = first.to_string();
    let server = [("peer", "server")];
    assert_eq!(
        counter(am, "rpcrdmad_peer_calls_out_total", &server),
        Some(3.0)
    );
    assert_eq!(
        counter(am, "rpcrdmad_conn_calls_out_total", &[("conn", &conn)]),
        Some(3.0)
    );
    assert!(a.ctl(&["conn", "close", &conn]).status.success());
    let again = eventually(20, || {
        let s = a.ctl_json(&["status"]);
        (s["peers"][0]["state"] == "up").then_some(())
    });
    assert!(again.is_some(), "{}", a.log());
    calls(&mut Client::connect(&a.app).expect("attach"), 2);
    let next = a.ctl_json(&["conns"])[0]["id"].as_u64().expect("id");
    assert_ne!(next, first);
    assert_eq!(
        counter(am, "rpcrdmad_peer_calls_out_total", &server),
        Some(5.0)
    );
    assert_eq!(
        counter(am, "rpcrdmad_peer_replies_in_total", &server),
        Some(5.0)
    );
    assert_eq!(
        counter(am, "rpcrdmad_peer_conns_opened_total", &server),
        Some(2.0)
    );
    assert_eq!(
        counter(am, "rpcrdmad_peer_conns_closed_total", &server),
        Some(1.0)
    );
    assert_eq!(
        counter(am, "rpcrdmad_conn_calls_out_total", &[("conn", &conn)]),
        None,
        "the ended connection's own series is gone"
    );
    assert_eq!(
        counter(
            am,
            "rpcrdmad_conn_calls_out_total",
            &[("conn", &next.to_string())]
        ),
        Some(2.0)
    );
    assert_eq!(
        peer_rtt_count(am, "server"),
        Some(5.0),
        "the peer's round trips, both connections'"
    );
    let lat = a.ctl_json(&["peer", "latency"]);
    assert_eq!(
        (&lat[0]["peer"], &lat[0]["count"]),
        (&"server".into(), &5.into()),
        "{lat}"
    );
    assert!(lat[0]["p50-us"].as_f64().is_some_and(|v| v > 0.0), "{lat}");
    // `rpcrdmactl stats` says the same per peer.
    let stats = a.ctl_json(&["stats"]);
    let p = &stats["peers"][0];
    assert_eq!(
        (
            &p["peer"],
            &p["calls-out"],
            &p["conns-opened"],
            &p["conns-closed"]
        ),
        (&"server".into(), &5.into(), &2.into(), &1.into()),
        "{stats}"
    );
    let human = String::from_utf8_lossy(&a.ctl(&["stats"]).stdout).into_owned();
    assert!(
        human
            .lines()
            .any(|l| l.starts_with("server") && l.split_whitespace().nth(1) == Some("5")),
        "{human}"
    );
    // B accepted both connections from 127.0.0.1 (each from another port).
    let client = [("peer", "127.0.0.1")];
    let b_seen = eventually(10, || {
        let n = counter(bm, "rpcrdmad_peer_conns_closed_total", &client)?;
        (n == 1.0).then_some(())
    });
    assert!(b_seen.is_some(), "{}", b.log());
    assert_eq!(
        counter(bm, "rpcrdmad_peer_calls_in_total", &client),
        Some(5.0)
    );
    assert_eq!(
        counter(bm, "rpcrdmad_peer_replies_out_total", &client),
        Some(5.0)
    );
    assert_eq!(
        counter(bm, "rpcrdmad_peer_conns_opened_total", &client),
        Some(2.0)
    );
}

#[test]
fn reload_applies_live_settings_and_refuses_the_rest() {
    let a = Daemon::start("reload", None);
    let text = std::fs::read_to_string(&a.config).expect("read");
    let new = text.replace("log-level = \"debug\"", "log-level = \"info\"")
        + "[transport]\ncredits = 16\n";
    std::fs::write(&a.config, new).expect("write");
    let r = a.ctl_json(&["reload"]);
    assert_eq!(r["applied"][0], "daemon.log-level");
    assert_eq!(r["refused"][0]["key"], "transport.credits");
    assert!(r["refused"][0]["reason"]
        .as_str()
        .expect("reason")
        .contains("restart"));
    let human = a.ctl(&["reload"]);
    assert!(String::from_utf8_lossy(&human.stdout).contains("refused  transport.credits"));

    // A broken file is refused as a whole, with its diagnostics.
    std::fs::write(&a.config, "[transport]\ncredits = \"x\"\n").expect("write");
    let bad = a.ctl(&["reload"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("nothing changed"));

    // SIGHUP does the same as `rpcrdmactl reload`.
    a.signal("HUP");
    let logged = eventually(10, || a.log().contains("SIGHUP reload").then_some(()));
    assert!(logged.is_some(), "{}", a.log());
    assert!(a.ctl(&["status"]).status.success());
}

/// R8166-3.3.2-b: version 1 has no way to change a live connection's inline thresholds, and a
/// configuration change does not try. A's connection is made with 2048-byte inline sizes; a
/// reload raising them to 4096 is refused, the connection still shows 2048 (and so does B's
/// view of A's RFC 8797 data), and a 3000-byte call that would fit 4096 still goes as a Long call.
/// It also checks R8166-3.3.2-a in the daemon: A's receive buffers are 8192 bytes, yet the
/// threshold for B's replies is the 2048 A announced (it was 4096 before that was fixed).
#[test]
fn r8166_3_3_2_b_a_reload_leaves_a_live_connections_thresholds_alone() {
    let b = Daemon::start("thresholds-b", None);
    let dir = tmpdir("thresholds-a");
    let port = free_port();
    let small = "[transport]\ninline-send = 2048\ninline-recv = 2048\n";
    let text = config(&dir, port, Some(("server", b.port)), small);
    let a = Daemon::start_with(dir, port, &text);
    a.wait_peer_up("server");
    rdmatest_server(&b.app);
    let mut c = Client::connect(&a.app).expect("attach");
    let peer = c.peer("server").expect("peer");
    // ECHO of 3000 bytes, not marked DDP-eligible: inline if the call threshold allows it,
    // else a Long call; the reply comes back through a Reply chunk.
    let echo_3000 = |c: &mut Client| {
        let data = rdmatest::pattern(3000, 3000);
        let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
        call.args().put_opaque(&data);
        call.max_reply(8192);
        let t = call.submit().expect("submit");
        let r = c
            .wait(t, Some(Duration::from_secs(20)))
            .expect("ECHO reply");
        assert_eq!(r.body, common::xdr_opaque(&data));
    };
    // The connection's thresholds: A's calls, B's replies (both 2048).
    let thresholds = |a: &Daemon| {
        let c = a.ctl_json(&["conns"])[0].clone();
        (c["inline-send"].clone(), c["inline-recv"].clone())
    };
    assert_eq!(thresholds(&a), (2048.into(), 2048.into()));
    echo_3000(&mut c);
    let long_calls = |a: &Daemon| a.ctl_json(&["stats"])["conns"][0]["long-calls"].clone();
    assert_eq!(long_calls(&a), 1, "{}", a.ctl_json(&["stats"]));

    std::fs::write(&a.config, text.replace("= 2048", "= 4096")).expect("write");
    let r = a.ctl_json(&["reload"]);
    let refused: Vec<_> = r["refused"]
        .as_array()
        .expect("refused")
        .iter()
        .map(|k| k["key"].as_str().expect("key").to_string())
        .collect();
    assert_eq!(
        refused,
        ["transport.inline-recv", "transport.inline-send"],
        "{r}"
    );

    assert_eq!(thresholds(&a), (2048.into(), 2048.into()));
    let seen = &b.ctl_json(&["conns"])[0];
    assert_eq!(seen["peer-inline-recv"], 2048, "{seen}");
    echo_3000(&mut c);
    assert_eq!(
        long_calls(&a),
        2,
        "still a Long call: {}",
        a.ctl_json(&["stats"])
    );
}

#[test]
fn v2_client_falls_back_to_v1_against_a_v1_only_server() {
    let dir_b = tmpdir("v1-b");
    let port_b = free_port();
    let b = Daemon::start_with(
        dir_b.clone(),
        port_b,
        &config(&dir_b, port_b, None, "[transport]\nversion = 1\n"),
    );
    let dir_a = tmpdir("v2-a");
    let port_a = free_port();
    let a = Daemon::start_with(
        dir_a.clone(),
        port_a,
        &config(
            &dir_a,
            port_a,
            Some(("server", port_b)),
            "[transport]\nversion = 2\n",
        ),
    );
    a.wait_peer_up("server");
    rdmatest_server(&b.app);
    let mut c = Client::connect(&a.app).expect("attach");
    let peer = c.peer("server").expect("peer");
    echo(&mut c, peer, 100);
    echo(&mut c, peer, 2000);
    let conns = a.ctl_json(&["conns"]);
    assert_eq!(conns[0]["version"], 1, "{}", a.log());
}

#[test]
fn v2_both_sides_speak_version_2() {
    let extra = "[transport]\nversion = 2\n";
    let dir_b = tmpdir("v2b");
    let port_b = free_port();
    let b = Daemon::start_with(dir_b.clone(), port_b, &config(&dir_b, port_b, None, extra));
    let dir_a = tmpdir("v2a");
    let port_a = free_port();
    let a = Daemon::start_with(
        dir_a.clone(),
        port_a,
        &config(&dir_a, port_a, Some(("server", port_b)), extra),
    );
    a.wait_peer_up("server");
    rdmatest_server(&b.app);
    let mut c = Client::connect(&a.app).expect("attach");
    let peer = c.peer("server").expect("peer");
    echo(&mut c, peer, 100);
    assert_eq!(a.ctl_json(&["conns"])[0]["version"], 2);
}

#[test]
fn call_to_an_unserved_program_gets_prog_unavail() {
    let b = Daemon::start("unserved-b", None);
    let a = Daemon::start("unserved-a", Some(("server", b.port)));
    a.wait_peer_up("server");
    let mut c = Client::connect(&a.app).expect("attach");
    let peer = c.peer("server").expect("peer");
    let t = c.call(peer, 0x2000_0001, 1, 0).submit().expect("submit");
    let r = c.wait(t, T).expect("a reply, not a transport error");
    assert_eq!(r.accept_stat, 1, "PROG_UNAVAIL");
}

#[test]
fn json_log_format_writes_one_object_per_line() {
    let dir = tmpdir("jsonlog");
    let port = free_port();
    let text =
        config(&dir, port, None, "").replace("log-level", "log-format = \"json\"\nlog-level");
    let d = Daemon::start_with(dir, port, &text);
    let log = d.log();
    let first = log.lines().next().expect("a log line");
    let v: serde_json::Value = serde_json::from_str(first).expect("JSON log line");
    assert!(v["level"].is_string(), "{first}");
    assert!(log
        .lines()
        .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()));
    assert!(log.contains("rpcrdmad started"));
}

#[test]
fn sigint_stops_like_sigterm_and_human_tables_print() {
    let b = Daemon::start("int-b", None);
    let mut a = Daemon::start("int-a", Some(("server", b.port)));
    a.wait_peer_up("server");
    let id = a.ctl_json(&["conns"])[0]["id"].to_string();
    for (args, header) in [
        (&["conns"][..], "PEER-INLINE(S/R)"),
        (&["stats"][..], "CALLS-OUT"),
        (&["stats"][..], "RECV-BUFS(FREE/ALL)"),
        (&["stats"][..], "SENT-CHUNK"),
        (&["stats"][..], "OPENED"),
        (&["latency"][..], "P99-US"),
        (&["peer", "latency"][..], "P99.9-US"),
        (&["conn", "show", id.as_str()][..], "counters:"),
    ] {
        let out = a.ctl(args);
        assert!(out.status.success(), "{args:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(header), "{args:?}: {text}");
    }
    a.signal("INT");
    assert_eq!(a.wait_exit(20), Some(0), "{}", a.log());
}

/// Receive queues of their own (`pools.receive-queue = "per-connection"`) over the soft
/// provider on TCP, one connection block per poll thread: a connection closed three times is
/// reconnected each time into the block its predecessor gave back, and calls go through.
#[test]
fn receive_queues_of_their_own_survive_reconnects_into_the_same_block() {
    let own = |text: String| {
        text.replace(
            "[pools]\nconnections = 4\n",
            "[pools]\nconnections = 1\nreceive-queue = \"per-connection\"\n",
        )
    };
    let dir_b = tmpdir("own-b");
    let port_b = free_port();
    let b = Daemon::start_with(
        dir_b.clone(),
        port_b,
        &own(config(&dir_b, port_b, None, "")),
    );
    let dir_a = tmpdir("own-a");
    let port_a = free_port();
    let text_a = own(config(&dir_a, port_a, Some(("server", port_b)), ""));
    assert!(text_a.contains("per-connection"));
    let a = Daemon::start_with(dir_a, port_a, &text_a);
    a.wait_peer_up("server");
    rdmatest_server(&b.app);
    let mut c = Client::connect(&a.app).expect("attach");
    let peer = c.peer("server").expect("peer");
    echo(&mut c, peer, 64);
    // Connection ids name slots, so the reconnected connection has the same one: count the
    // connections that came up instead.
    let ups = |d: &Daemon| d.log().matches("connection up").count();
    for round in 0..3 {
        let before = ups(&a);
        let id = a.ctl_json(&["conns"])[0]["id"].as_u64().expect("id");
        assert!(a.ctl(&["conn", "close", &id.to_string()]).status.success());
        let again = eventually(20, || {
            let s = a.ctl_json(&["status"]);
            (ups(&a) > before && s["peers"][0]["state"] == "up").then_some(())
        });
        assert!(
            again.is_some(),
            "round {round}: not reconnected\n{}",
            a.log()
        );
        echo(&mut c, peer, 3000);
    }
    assert!(
        a.log().contains("receive_queues=PerConnection"),
        "{}",
        a.log()
    );
    assert!(
        b.log().contains("receive_queues=PerConnection"),
        "{}",
        b.log()
    );
}

/// `rpcrdmactl top` while an app calls without pause: each interval's difference per peer
/// and per connection is what was called in it (above zero in every interval, the
/// connection's equal to its peer's, all of them together no more than `stats` counted over
/// the whole run), each rate is that difference over the interval's seconds, each poll thread
/// has a busy share of the interval, and the human view lists the peer with its rate columns
/// and the threads.
#[test]
fn rpcrdmactl_top_reports_what_was_called_in_each_interval() {
    let b = Daemon::start("top-b", None);
    let a = Daemon::start("top-a", Some(("server", b.port)));
    a.wait_peer_up("server");
    rdmatest_server(&b.app);
    let calls_out = |stats: &serde_json::Value| stats["peers"][0]["calls-out"].as_u64();
    let start = calls_out(&a.ctl_json(&["stats"])).unwrap_or(0);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let caller = std::thread::spawn({
        let (app, stop) = (a.app.clone(), stop.clone());
        move || {
            let mut c = Client::connect(&app).expect("attach");
            let peer = c.peer("server").expect("peer");
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                echo(&mut c, peer, 100);
                n += 1;
            }
            n
        }
    });
    // Calls are under way before the first snapshot.
    assert!(
        eventually(20, || (calls_out(&a.ctl_json(&["stats"]))? > start)
            .then_some(()))
        .is_some()
    );
    let out = a.ctl(&["--json", "top", "--interval", "0.5", "--count", "3"]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let made = caller.join().expect("caller");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let end = calls_out(&a.ctl_json(&["stats"])).expect("calls-out");
    assert_eq!(end - start, made);
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 3);
    let mut sum = 0;
    for r in &lines {
        let secs = r["seconds"].as_f64().expect("seconds");
        assert!(secs >= 0.5, "{r}");
        let p = &r["peers"][0];
        assert_eq!(p["peer"], "server", "{r}");
        let d = p["calls-out"].as_u64().expect("calls-out");
        assert!(
            d > 0,
            "no calls counted in an interval of a busy connection: {r}"
        );
        let rate = p["calls-out-per-s"].as_f64().expect("rate");
        assert!((rate - d as f64 / secs).abs() < 1e-6, "{r}");
        // One call in flight at a time: a snapshot may fall between a call and its reply.
        let replies = p["replies-in"].as_u64().expect("replies-in");
        assert!(replies.abs_diff(d) <= 1, "{r}");
        let c = &r["conns"][0];
        assert_eq!(
            (&c["peer"], &c["calls-out"]),
            (&p["peer"], &p["calls-out"]),
            "{r}"
        );
        assert!(c["id"].is_u64(), "{r}");
        // Two poll threads (the tests' config), each with its share of the interval's time
        // spent busy, and the work completions of the calls on one of them.
        let threads = r["threads"].as_array().expect("threads");
        assert_eq!(threads.len(), 2, "{r}");
        for t in threads {
            assert!(
                (0.0..=1.0).contains(&t["busy"].as_f64().expect("busy")),
                "{r}"
            );
            let (busy, idle) = (t["busy-ns"].as_u64(), t["idle-ns"].as_u64());
            let spent = busy
                .zip(idle)
                .map(|(b, i)| b + i)
                .expect("busy-ns, idle-ns");
            // Each thread's loop accounted for most of the interval (its turns are short).
            assert!(spent as f64 >= 0.5 * secs * 1e9, "{r}");
        }
        let completions: u64 = threads
            .iter()
            .filter_map(|t| t["completions"].as_u64())
            .sum();
        assert!(completions >= d, "{r}");
        // The calling app (this process) and its calls ended in the interval (its snapshot is
        // taken just after the traffic's, so the counts are close, not equal).
        let apps = r["apps"].as_array().expect("apps");
        let me = apps
            .iter()
            .find(|a| a["pid"] == std::process::id())
            .unwrap_or_else(|| panic!("this process's app: {r}"));
        assert!(me["calls-done"].as_u64() > Some(0), "{r}");
        sum += d;
    }
    assert!(
        sum <= made,
        "{sum} counted in the intervals, {made} made in all"
    );

    let human = a.ctl(&["top", "--interval", "0.1", "--count", "1"]);
    assert!(human.status.success());
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains("CALLS-OUT/S") && text.contains("MB-IN/S"),
        "{text}"
    );
    assert!(text.lines().any(|l| l.starts_with("server ")), "{text}");
    // A daemon that is not there: exit 2, as every command.
    let gone = Command::new(env!("CARGO_BIN_EXE_rpcrdmactl"))
        .args(["--socket", "/nonexistent/admin.sock", "top", "--count", "1"])
        .output()
        .expect("run rpcrdmactl");
    assert_eq!(gone.status.code(), Some(2));
}

/// The names `text` gives metrics of ours (`rpcrdmad_...`), each once.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("rpcrdmad_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// `deploy/prometheus/rpcrdmad-rules.yaml` and `deploy/grafana/rpcrdmad-dashboard.json`:
/// promtool accepts the rules and every query of the dashboard (checked as recording rules,
/// Grafana's variables filled in); every metric either names is one that two daemons with
/// traffic between them export; `rpcrdmad_peer_up`, which the peer-down alert reads, goes
/// from 1 to 0 when the peer dies.
#[test]
fn alert_rules_and_dashboard_parse_and_name_only_exported_metrics() {
    let deploy = |p: &str| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy")
            .join(p);
        (std::fs::read_to_string(&path).expect("deploy file"), path)
    };
    let (rules, rules_path) = deploy("prometheus/rpcrdmad-rules.yaml");
    let (dash_text, _) = deploy("grafana/rpcrdmad-dashboard.json");
    let dash: serde_json::Value = serde_json::from_str(&dash_text).expect("dashboard JSON");

    // Every panel placed, with its own id, and queries.
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10);
    let mut ids = std::collections::BTreeSet::new();
    let mut queries = Vec::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().expect("panel id")), "{p}");
        assert!(p["gridPos"]["w"].as_u64().is_some_and(|w| w > 0), "{p}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{p}");
        for t in targets {
            queries.push(t["expr"].as_str().expect("expr").to_string());
        }
    }
    // promtool judges the PromQL: the rules as they are, the queries as recording rules.
    let dir = tmpdir("dash-promtool");
    let as_rules = dir.join("dashboard-queries.yaml");
    let mut text = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, q) in queries.iter().enumerate() {
        let q = q
            .replace("$__rate_interval", "5m")
            .replace("$instance", ".*");
        text += &format!(
            "      - record: dashboard_query_{i}\n        expr: '{}'\n",
            q.replace('\'', "''")
        );
    }
    std::fs::write(&as_rules, text).expect("write");
    let out = Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&rules_path)
        .arg(&as_rules)
        .output()
        .expect("run promtool (scripts/setup installs it: Debian package prometheus)");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // The metrics both name, against what a client daemon and a server daemon export.
    let (b, bm) = with_metrics("dash-b", None);
    let (a, am) = with_metrics("dash-a", Some(("server", b.port)));
    a.wait_peer_up("server");
    rdmatest_server(&b.app);
    let mut c = Client::connect(&a.app).expect("attach");
    let peer = c.peer("server").expect("peer");
    for n in [100, 3000] {
        echo(&mut c, peer, n);
    }
    let exported: std::collections::BTreeSet<String> = [am, bm]
        .iter()
        .flat_map(|p| {
            scrape(*p)
                .lines()
                .filter_map(|l| l.strip_prefix("# TYPE "))
                .filter_map(|l| l.split(' ').next())
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect();
    let named = metric_names(&rules)
        .into_iter()
        .chain(metric_names(&queries.join("\n")));
    for name in named {
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|b| exported.contains(*b)))
            .unwrap_or(&name);
        assert!(
            exported.contains(base),
            "{name} is not exported: {exported:?}"
        );
    }

    let up = |port: u16| {
        let body = scrape(port);
        let line = body
            .lines()
            .find(|l| l.starts_with("rpcrdmad_peer_up{peer=\"server\"}"))
            .map(String::from);
        line.and_then(|l| l.rsplit(' ').next().map(String::from))
    };
    assert_eq!(up(am).as_deref(), Some("1"));
    drop(b);
    assert!(
        eventually(20, || (up(am).as_deref() == Some("0")).then_some(())).is_some(),
        "{}",
        scrape(am)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `rpcrdmactl completions SHELL` needs no daemon; bash, given its script, completes
/// subcommands and their subcommands; an unknown shell is refused with clap's usage error.
#[test]
fn rpcrdmactl_completions_complete_subcommands_in_bash() {
    let ctl = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_rpcrdmactl"))
            .args(["--socket", "/nonexistent/admin.sock"])
            .args(args)
            .output()
            .expect("run rpcrdmactl")
    };
    let script = ctl(&["completions", "bash"]);
    assert!(script.status.success());
    let dir = tmpdir("completions");
    let file = dir.join("rpcrdmactl.bash");
    std::fs::write(&file, &script.stdout).expect("write");
    // The completion function's answer for the words typed so far (the last one unfinished).
    let complete = |words: &[&str]| {
        let cword = words.len() - 1;
        let prev = if cword > 0 { words[cword - 1] } else { "" };
        let line = format!(
            "source {}; COMP_WORDS=({}); COMP_CWORD={cword}; _rpcrdmactl rpcrdmactl '{}' '{prev}'; echo \"${{COMPREPLY[@]}}\"",
            file.display(),
            words.iter().map(|w| format!("'{w}'")).collect::<Vec<_>>().join(" "),
            words[cword],
        );
        let out = Command::new("bash")
            .arg("-c")
            .arg(line)
            .output()
            .expect("bash");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(complete(&["rpcrdmactl", "xc"]), "xchar");
    assert_eq!(complete(&["rpcrdmactl", "to"]), "top");
    let peer = complete(&["rpcrdmactl", "peer", ""]);
    assert!(
        peer.contains("retry-v2") && peer.contains("latency"),
        "{peer}"
    );
    for shell in ["zsh", "fish"] {
        let out = ctl(&["completions", shell]);
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("rpcrdmactl")
        );
    }
    assert_eq!(ctl(&["completions", "tcsh"]).status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}
