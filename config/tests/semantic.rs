//! Defaults, round trips, cross-field checks and the loading API.

mod common;

use common::{errors, full_sample, HOST};
use rpcrdma_config::*;

fn warnings(text: &str) -> Vec<Diagnostic> {
    check(text, "t.toml", &HOST)
        .diagnostics
        .iter()
        .filter(|d| !d.is_error())
        .cloned()
        .collect()
}

#[test]
fn empty_file_gives_laptop_defaults_without_findings() {
    for cores in [1, 2, 64] {
        let report = check("", "empty.toml", &HostFacts::with_cores(cores));
        assert!(
            report.diagnostics.0.is_empty(),
            "{cores} cores: {}",
            report.diagnostics
        );
        let cfg = report.config.expect("empty file parses");
        assert_eq!(cfg, Config::default());
        assert_eq!(cfg.provider.kind, ProviderKind::Soft);
        assert!(cfg.cpu.poll_cores.is_empty() && cfg.cpu.control_core.is_none());
        assert_eq!(cfg.cpu.idle.policy, IdlePolicy::Backoff);
        assert_eq!(cfg.transport.ddp_threshold, 1024);
    }
}

#[test]
fn default_config_validates_clean() {
    assert!(Config::default().validate("<default>", &HOST).0.is_empty());
}

/// The findings other than the deprecation of `cpu.idle.spin-polls`, which the full sample
/// sets because it sets every key.
fn besides_deprecation(d: &Diagnostics) -> Vec<&Diagnostic> {
    d.0.iter()
        .filter(|x| x.is_error() || x.path != "cpu.idle.spin-polls")
        .collect()
}

#[test]
fn full_sample_validates_clean() {
    let d = full_sample().validate("<sample>", &HOST);
    assert!(besides_deprecation(&d).is_empty(), "{d}");
    assert_eq!(d.0.len(), 1, "{d}");
}

#[test]
fn round_trip_toml() {
    for cfg in [Config::default(), full_sample()] {
        let text = toml::to_string(&cfg).expect("serializes");
        let report = check(&text, "rt.toml", &HOST);
        assert!(
            besides_deprecation(&report.diagnostics).is_empty(),
            "{}\n{text}",
            report.diagnostics
        );
        assert_eq!(report.config.as_ref(), Some(&cfg), "{text}");
    }
}

#[test]
fn round_trip_json_with_the_same_key_names() {
    for cfg in [Config::default(), full_sample()] {
        let json = serde_json::to_string(&cfg).expect("serializes");
        let back: Config = serde_json::from_str(&json).expect("parses");
        assert_eq!(back, cfg);
        // TOML and JSON name every key the same.
        let from_toml: serde_json::Value =
            serde_json::to_value(toml::Value::try_from(&cfg).expect("toml value")).expect("json");
        assert_eq!(from_toml, serde_json::to_value(&cfg).expect("json"));
    }
    let json = serde_json::json!({"transport": {"inline-send": 8192}});
    let cfg: Config = serde_json::from_value(json).expect("partial JSON takes defaults");
    assert_eq!(cfg.transport.inline_send, 8192);
    assert_eq!(cfg.transport.credits, Transport::default().credits);
}

#[test]
fn json_rejects_unknown_keys_too() {
    let err =
        serde_json::from_str::<Config>(r#"{"transport": {"inline_send": 8192}}"#).unwrap_err();
    assert!(
        err.to_string().contains("unknown field `inline_send`"),
        "{err}"
    );
}

#[test]
fn validate_without_text_has_no_position() {
    let mut cfg = Config::default();
    cfg.apps.cq_entries = 6;
    let d = cfg.validate("<admin>", &HOST);
    assert_eq!(d.0.len(), 1);
    assert_eq!((d.0[0].line, d.0[0].column), (0, 0));
    assert_eq!(d.0[0].path, "apps.cq-entries");
    assert!(d.0[0].to_string().contains(" --> <admin>\n"), "{}", d.0[0]);
}

#[test]
fn cross_field_error_on_an_unset_key_points_at_the_key_that_set_it_off() {
    // pools.recv-buffer-size keeps its default 8192; inline-recv (line 2) is what broke it.
    let errs = errors("[transport]\ninline-recv = 16384\n");
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].path, "pools.recv-buffer-size");
    assert_eq!((errs[0].line, errs[0].column), (2, 15));
    assert_eq!(errs[0].hint.as_deref(), Some("at least 16384"));
    // When the checked key itself is written, the error points at it.
    let errs = errors("[pools]\nrecv-buffer-size = 4096\n[transport]\ninline-recv = 16384\n");
    assert_eq!((errs[0].line, errs[0].column), (2, 20));
}

#[test]
fn pool_errors_from_raised_credits_point_at_credits() {
    // 200 credits on 4 connections with receives for all of them: the 1024 default send
    // buffers cannot cover 4 x (200 + 208 + 1) (an error located at the credits).
    let errs = errors("[pools]\nrecv-buffers = 99999\n[transport]\ncredits = 200\n");
    let got: Vec<_> = errs
        .iter()
        .map(|e| (e.path.as_str(), e.line, e.column))
        .collect();
    assert_eq!(got, [("pools.send-buffers", 4, 11)]);
    // With the 512 default receives the credits are capped instead (a warning), and the
    // default send pool covers the capped credits.
    assert!(errors("[transport]\ncredits = 200\n").is_empty());
    let w = warnings("[transport]\ncredits = 200\n");
    assert_eq!(w.len(), 1, "{w:#?}");
    assert_eq!(w[0].path, "pools.recv-buffers");
    // share 128: 1 spare, 127 split 200:8 -> 4 backchannel, 123 forward.
    assert!(
        w[0].message.contains("123 credits and 4 backchannel"),
        "{}",
        w[0]
    );
}

#[test]
fn rfc8797_sizes_not_a_multiple_of_1k_warn_with_the_advertised_value() {
    let w = warnings("[transport]\ninline-send = 4000\n");
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].severity, Severity::Warning);
    assert!(w[0].message.contains("advertised as 3072"), "{}", w[0]);
    assert_eq!((w[0].line, w[0].column), (2, 15));
    let report = check("[transport]\ninline-send = 4000\n", "t.toml", &HOST);
    assert!(report.is_ok(), "a warning alone does not fail the check");
}

#[test]
fn rfc8797_size_limits_are_1k_and_256k() {
    assert!(errors("[transport]\ninline-recv = 1024\n").is_empty());
    let ok = "[transport]\ninline-recv = 262144\n[pools]\nrecv-buffer-size = 262144\n";
    assert!(errors(ok).is_empty(), "{:#?}", errors(ok));
    assert_eq!(errors("[transport]\ninline-recv = 1023\n").len(), 1);
}

#[test]
fn v2_2_3_a_version_two_needs_4096_byte_receives() {
    let errs = errors("[transport]\nversion = 2\ninline-recv = 2048\n");
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].path, "transport.inline-recv");
    assert!(errs[0].message.contains("V2-2.3-a"));
    assert!(errors("[transport]\nversion = 1\ninline-recv = 2048\n").is_empty());
}

#[test]
fn v2_4_2_2_a_version_two_needs_a_backchannel() {
    let errs = errors("[transport]\nversion = 2\nbackchannel-credits = 0\n");
    assert_eq!(errs.len(), 1);
    assert_eq!((errs[0].line, errs[0].column), (3, 23));
    assert!(errors("[transport]\nversion = 1\nbackchannel-credits = 0\n").is_empty());
}

#[test]
fn r8166_3_3_1_g_shared_receives_cover_every_grant() {
    // 2 x (10 + 2 + 1) = 26 receives give full credits; 2 x (10 + 12 + 1) = 46 sends.
    let base = "[transport]\ncredits = 10\nbackchannel-credits = 2\n[pools]\nconnections = 2\n";
    let full = format!("{base}send-buffers = 46\nrecv-buffers = 26\n");
    assert!(errors(&full).is_empty() && warnings(&full).is_empty());
    // 25 receives: share 12, 11 after the spare split 10:2 -> 1 backchannel, 10 forward
    // (a warning); the sends needed shrink to 2 x (10 + 11 + 1) = 44.
    let capped = format!("{base}send-buffers = 44\nrecv-buffers = 25\n");
    assert!(errors(&capped).is_empty(), "{:#?}", errors(&capped));
    let w = warnings(&capped);
    assert!(
        w[0].message.contains("10 credits and 1 backchannel"),
        "{}",
        w[0]
    );
    // Sends short of what the capped credits may hold in flight: an error.
    let errs = errors(&format!("{base}send-buffers = 43\nrecv-buffers = 25\n"));
    let paths: Vec<_> = errs.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["pools.send-buffers"]);
    assert_eq!(errs[0].hint.as_deref(), Some("at least 44"));
    // Fewer than one credit, one backchannel credit and one spare each: an error.
    let errs = errors(&format!("{base}send-buffers = 46\nrecv-buffers = 5\n"));
    let paths: Vec<_> = errs.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["pools.recv-buffers"]);
    assert_eq!(errs[0].hint.as_deref(), Some("at least 6"));
}

/// `pools.receive-queue = "per-connection"`: every connection has receives of its own, so
/// nothing is divided and the shared pools' sizes are not checked (they are not used).
#[test]
fn receive_queues_of_their_own_skip_the_shared_pool_checks() {
    let base = "[transport]\ncredits = 10\nbackchannel-credits = 2\n[pools]\nconnections = 2\nsend-buffers = 1\nrecv-buffers = 1\n";
    let shared = errors(base);
    let paths: Vec<_> = shared.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["pools.recv-buffers"], "{shared:#?}");
    let own = format!("{base}receive-queue = \"per-connection\"\n");
    assert!(errors(&own).is_empty() && warnings(&own).is_empty());
    let cfg = from_str_named(&own, "t.toml").expect("valid");
    assert_eq!(cfg.pools.receive_queue, ReceiveQueue::PerConnection);
    assert_eq!(Config::default().pools.receive_queue, ReceiveQueue::Shared);
    let errs = errors(&format!("{base}receive-queue = \"per-qp\"\n"));
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].path, "pools.receive-queue");
}

#[test]
fn divide_share_never_gives_more_than_the_share() {
    for share in 0..200u32 {
        for (c, b) in [(1, 0), (32, 0), (32, 8), (64, 8), (200, 8), (4096, 4096)] {
            if let Some((f, k)) = rpcrdma_config::divide_share(c, b, share) {
                assert!(f + k < share, "{c} {b} {share}: spare kept");
                assert!(f >= 1 && f <= c && k <= b && (b == 0 || k >= 1));
            } else {
                assert!(share < 2 + u32::from(b > 0));
            }
        }
    }
}

#[test]
fn receive_buffers_must_hold_the_largest_rbsiz_a_peer_may_request() {
    let errs = errors("[transport.xcharext]\nmax-rbsiz = 65536\n");
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].path, "pools.recv-buffer-size");
    assert_eq!(errs[0].hint.as_deref(), Some("at least 65536"));
}

#[test]
fn control_core_may_share_a_poll_core_only_when_it_backs_off() {
    let text = "[cpu]\npoll-cores = [1]\ncontrol-core = 1\n";
    assert!(errors(text).is_empty());
    let errs = errors(&format!("{text}[cpu.idle]\npolicy = \"spin\"\n"));
    assert_eq!(errs.len(), 1);
    assert_eq!((errs[0].line, errs[0].column), (3, 16));
}

#[test]
fn spinning_on_every_core_warns() {
    let w = warnings("[cpu]\npoll-cores = [0, 1]\n[cpu.idle]\npolicy = \"spin\"\n");
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].path, "cpu.idle.policy");
    assert_eq!((w[0].line, w[0].column), (4, 10));
    // One unpinned spinner on one core also leaves nothing.
    let report = check(
        "[cpu.idle]\npolicy = \"spin\"\n",
        "t.toml",
        &HostFacts::with_cores(1),
    );
    assert_eq!(report.diagnostics.0.len(), 1);
    assert!(warnings("[cpu]\npoll-cores = [1]\n[cpu.idle]\npolicy = \"spin\"\n").is_empty());
}

#[test]
fn spin_is_a_time_and_the_old_poll_count_still_loads_with_a_warning() {
    let cfg = |text: &str| check(text, "t.toml", &HOST).config.expect("loads");
    let timed = cfg("[cpu.idle]\nspin-us = 250\n");
    assert_eq!(
        (timed.cpu.idle.spin_us, timed.cpu.idle.spin_polls),
        (250, None)
    );
    assert!(warnings("[cpu.idle]\nspin-us = 250\n").is_empty());
    let old = "[cpu.idle]\npolicy = \"backoff\"\nspin-polls = 1000\n";
    assert_eq!(cfg(old).cpu.idle.spin_polls, Some(1000));
    let w = warnings(old);
    assert_eq!(w.len(), 1, "{w:#?}");
    assert_eq!(w[0].path, "cpu.idle.spin-polls");
    assert_eq!(w[0].line, 3);
    assert!(w[0].message.contains("deprecated"), "{}", w[0].message);
}

#[test]
fn yield_policy_parses_and_needs_only_a_nonzero_park_after() {
    let text = "[cpu]\npoll-cores = [0, 1]\ncontrol-core = 1\n[cpu.idle]\npolicy = \"yield\"\n";
    let report = check(text, "t.toml", &HOST);
    // A yielding thread gives its core away, so yielding on every core, even the control core, is fine.
    assert!(report.diagnostics.0.is_empty(), "{}", report.diagnostics);
    let cfg = report.config.expect("parses");
    assert_eq!(cfg.cpu.idle.policy, IdlePolicy::Yield);
    // `backoff-max-us` means nothing to it: a park-after shorter than that is no error.
    assert!(errors("[cpu.idle]\npolicy = \"yield\"\npark-after-us = 10\n").is_empty());
    // Zero would park at the first empty poll.
    let errs = errors("[cpu.idle]\npolicy = \"yield\"\npark-after-us = 0\n");
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].path, "cpu.idle.park-after-us");
    assert_eq!((errs[0].line, errs[0].column), (3, 17));
    // Under `backoff` the same short park-after is still refused.
    assert_eq!(
        errors("[cpu.idle]\npolicy = \"backoff\"\npark-after-us = 10\n").len(),
        1
    );
}

#[test]
fn cores_come_from_the_affinity_mask_not_a_count() {
    // A cpuset of cores 4 and 5: core 0 does not exist, core 5 does.
    let host = HostFacts { cores: vec![4, 5] };
    let report = check(
        "[cpu]\npoll-cores = [0, 5]\ncontrol-core = 4\n",
        "t.toml",
        &host,
    );
    let errs: Vec<_> = report
        .diagnostics
        .iter()
        .map(|d| (d.path.as_str(), d.line, d.column))
        .collect();
    assert_eq!(errs, [("cpu.poll-cores[0]", 2, 15)]);
    assert_eq!(
        report.diagnostics.0[0].hint.as_deref(),
        Some("usable core ids: 4, 5")
    );
    assert!(!HostFacts::detect().cores.is_empty());
}

#[test]
fn chunk_caps_whose_full_header_exceeds_inline_send_warn() {
    // 4 chunks x 8 segments: 16 + (768 + 4) + (4 x 136 + 4) + 136 = 1472 bytes; the default
    // 16 segments: 16 + (1536 + 4) + (4 x 264 + 4) + 264 = 2880 bytes.
    assert!(warnings("[transport]\ninline-send = 2048\nmax-segments-per-chunk = 8\n").is_empty());
    assert!(warnings("[transport]\ninline-send = 4096\n").is_empty());
    let w = warnings("[transport]\ninline-send = 1024\n");
    assert_eq!(w.len(), 1, "{w:#?}");
    assert!(w[0].message.contains("2880 bytes"), "{}", w[0]);
    assert_eq!(w[0].path, "transport.max-segments-per-chunk");
    assert_eq!(
        (w[0].line, w[0].column),
        (2, 15),
        "points at inline-send, the key written"
    );
    assert!(warnings(
        "[transport]\ninline-send = 1024\nmax-chunks-per-list = 2\nmax-segments-per-chunk = 4\n"
    )
    .is_empty());
}

#[test]
fn inline_tables_and_dotted_keys_are_located_too() {
    let errs = errors("transport = { credits = 0 }\n");
    assert_eq!(
        (errs[0].path.as_str(), errs[0].line, errs[0].column),
        ("transport.credits", 1, 25)
    );
    let errs = errors("apps.sq-entries = 3\n");
    assert_eq!(
        (errs[0].path.as_str(), errs[0].line, errs[0].column),
        ("apps.sq-entries", 1, 19)
    );
    let errs = errors("[provider]\nsoft = { crc = 1 }\n");
    assert_eq!(
        (errs[0].path.as_str(), errs[0].line, errs[0].column),
        ("provider.soft.crc", 2, 16)
    );
}

#[test]
fn mpa_revision_one_warns_about_linux_servers() {
    let w = warnings("[provider.soft]\nmpa-revision = 1\n");
    assert_eq!(w.len(), 1);
    assert!(w[0].message.contains("Linux NFS server"));
}

#[test]
fn ring_sizes_must_be_powers_of_two() {
    for (v, ok) in [
        (2, true),
        (1024, true),
        (65536, true),
        (0, false),
        (3, false),
        (131072, false),
    ] {
        let errs = errors(&format!("[apps]\nsq-entries = {v}\ncq-entries = {v}\n"));
        assert_eq!(errs.len(), if ok { 0 } else { 2 }, "{v}: {errs:#?}");
    }
}

#[test]
fn listener_addresses_parse_with_default_port_and_are_unique() {
    assert_eq!(parse_address("192.0.2.1").map(|a| a.port()), Some(20049));
    assert_eq!(parse_address("::1").map(|a| a.port()), Some(20049));
    assert_eq!(parse_address("[::1]:7").map(|a| a.port()), Some(7));
    assert_eq!(parse_address("host.example:20049"), None);
    let text =
        "[[listeners]]\naddress = \"127.0.0.1\"\n[[listeners]]\naddress = \"127.0.0.1:20049\"\n";
    let errs = errors(text);
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].path, "listeners[1].address");
    assert_eq!((errs[0].line, errs[0].column), (4, 11));
}

#[test]
fn listener_allow_lists_take_networks_and_addresses_and_locate_the_bad_entry() {
    let n = |a: &str| parse_network(a).map(|n| n.to_string());
    assert_eq!(n("192.0.2.0/24").as_deref(), Some("192.0.2.0/24"));
    assert_eq!(n("192.0.2.7").as_deref(), Some("192.0.2.7/32"));
    assert_eq!(n("2001:db8::/32").as_deref(), Some("2001:db8::/32"));
    assert_eq!(n("192.0.2.7/24").as_deref(), Some("192.0.2.0/24"));
    assert_eq!(n("nfs.example"), None);
    assert_eq!(n("192.0.2.0/33"), None);

    let l = "[[listeners]]\naddress = \"127.0.0.1\"\n";
    let ok = format!(
        "{l}allow = [\"192.0.2.0/24\", \"::1\"]\nmax-connections-per-host = 16\nconnect-rate-per-host = 10\n"
    );
    let report = check(&ok, "t.toml", &HOST);
    assert!(report.diagnostics.0.is_empty(), "{}", report.diagnostics);
    let c = report.config.unwrap();
    assert_eq!(c.listeners[0].allow.len(), 2);
    assert_eq!(c.listeners[0].max_connections_per_host, 16);
    assert_eq!(c.listeners[0].connect_rate_per_host, 10);

    let errs = errors(&format!("{l}allow = [\"192.0.2.0/24\", \"nfs.example\"]\n"));
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].path, "listeners[0].allow[1]");
    assert!(errs[0].message.contains("nfs.example"), "{}", errs[0]);

    let w = warnings(&format!("{l}allow = [\"192.0.2.7/24\"]\n"));
    assert_eq!(w.len(), 1, "{w:#?}");
    assert!(w[0].message.contains("taken as 192.0.2.0/24"), "{}", w[0]);

    let errs = errors(&format!("{l}max-connections-per-host = 70000\n"));
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].path, "listeners[0].max-connections-per-host");

    // The in-memory fabric has no addresses: an allow list would refuse everything.
    let errs = errors("[provider]\nkind = \"mem\"\n[[listeners]]\naddress = \"127.0.0.1\"\nallow = [\"127.0.0.1\"]\n");
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].path, "listeners[0].allow");
}

#[test]
fn mem_provider_peers_must_name_one_of_the_daemons_own_listeners() {
    let mem = "[provider]\nkind = \"mem\"\n[[listeners]]\naddress = \"127.0.0.1:20049\"\n";
    let ok = format!("{mem}[[peers]]\nname = \"self\"\naddress = \"127.0.0.1\"\n");
    let report = check(&ok, "t.toml", &HOST);
    assert!(report.diagnostics.0.is_empty(), "{}", report.diagnostics);
    assert_eq!(report.config.unwrap().provider.kind, ProviderKind::Mem);

    let errs = errors(&format!(
        "{mem}[[peers]]\nname = \"far\"\naddress = \"127.0.0.1:20050\"\n"
    ));
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].path, "peers[0].address");
    assert!(errs[0].message.contains("names no listener"), "{}", errs[0]);
    assert!(
        errs[0].hint.as_deref().unwrap().contains("127.0.0.1:20049"),
        "{}",
        errs[0]
    );

    // No listener at all: the hint says to add one.
    let errs =
        errors("[provider]\nkind = \"mem\"\n[[peers]]\nname = \"p\"\naddress = \"127.0.0.1\"\n");
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(errs[0].hint.as_deref().unwrap().contains("[[listeners]]"));

    // The same peer is fine on the soft provider (the listener is on another host).
    assert!(errors("[[peers]]\nname = \"far\"\naddress = \"192.0.2.1\"\n").is_empty());
}

#[test]
fn mem_provider_cannot_be_mixed_with_another_provider() {
    let errs = errors(
        "[provider]\nkind = \"mem\"\n[[listeners]]\naddress = \"127.0.0.1\"\nprovider = \"soft\"\n",
    );
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].path, "listeners[0].provider");
    let errs = errors(
        "[[listeners]]\naddress = \"127.0.0.1\"\n[[peers]]\nname = \"p\"\naddress = \"127.0.0.1\"\nprovider = \"mem\"\n",
    );
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].path, "peers[0].provider");
}

#[test]
fn missing_required_peer_field_points_at_the_element() {
    let errs = errors("[[peers]]\nname = \"a\"\n");
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].message, "missing field `address`");
    assert_eq!((errs[0].line, errs[0].column), (1, 1));
}

#[test]
fn from_str_named_and_from_path() {
    assert_eq!(from_str_named("", "x.toml"), Ok(Config::default()));
    let err = from_str_named("[apps]\nmax-apps = 0\n", "x.toml").unwrap_err();
    assert_eq!(err.error_count(), 1);

    let dir = std::env::temp_dir().join(format!("rpcrdma-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let good = dir.join("good.toml");
    std::fs::write(&good, "[transport]\ncredits = 32\n").expect("write");
    assert_eq!(from_path(&good).expect("loads").transport.credits, 32);
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[transport]\ncredits = 0\n").expect("write");
    match from_path(&bad) {
        Err(LoadError::Invalid(d)) => {
            assert_eq!(d.0[0].file, bad.display().to_string());
            assert!(
                d.to_string().contains(&format!("{}:2:11", bad.display())),
                "{d}"
            );
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert!(matches!(
        from_path(dir.join("absent.toml")),
        Err(LoadError::Io { .. })
    ));
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
