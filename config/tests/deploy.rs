//! Every `deploy/*.toml` passes the checker; the demo pair is wired to each other.

use std::path::PathBuf;

use rpcrdma_config::*;

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn load(name: &str) -> Config {
    let path = deploy_dir().join(name);
    let text = std::fs::read_to_string(&path).expect("deploy file exists");
    let report = check(&text, &path.display().to_string(), &HostFacts::detect());
    assert!(report.diagnostics.0.is_empty(), "{}", report.diagnostics);
    report.config.expect("config")
}

#[test]
fn every_deploy_toml_passes_the_checker_without_findings() {
    let mut names: Vec<_> = std::fs::read_dir(deploy_dir())
        .expect("deploy/ exists")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "demo-client.toml",
            "demo-mem-yield.toml",
            "demo-mem.toml",
            "demo-server.toml",
            "rpcrdmad.toml"
        ]
    );
    for name in names {
        load(&name);
    }
}

#[test]
fn demo_pair_uses_soft_provider_distinct_sockets_and_client_peer_reaches_server() {
    let server = load("demo-server.toml");
    let client = load("demo-client.toml");
    for c in [&server, &client] {
        assert_eq!(c.provider.kind, ProviderKind::Soft);
        // Two daemons and their apps on two cores: a spinning poll thread starves the others.
        assert_eq!(c.cpu.idle.policy, IdlePolicy::Yield);
        assert!(c.cpu.poll_cores.is_empty());
    }
    assert_ne!(server.daemon.app_socket, client.daemon.app_socket);
    assert_ne!(server.daemon.admin_socket, client.daemon.admin_socket);
    assert_ne!(server.daemon.metrics_listen, client.daemon.metrics_listen);
    let addrs = |c: &Config| -> Vec<_> {
        c.listeners
            .iter()
            .filter_map(|l| parse_address(&l.address))
            .collect()
    };
    let (s, c) = (addrs(&server), addrs(&client));
    assert!(
        s.iter().all(|a| !c.contains(a)),
        "listener ports differ: {s:?} {c:?}"
    );
    let peer = client
        .peers
        .iter()
        .find(|p| p.name == "server")
        .expect("peer `server`");
    let target = parse_address(&peer.address).expect("peer address");
    assert!(s.contains(&target), "{target} is a server listener {s:?}");
    assert!(target.ip().is_loopback());
}

#[test]
fn mem_demo_is_one_daemon_whose_peer_is_its_own_listener() {
    let c = load("demo-mem.toml");
    assert_eq!(c.provider.kind, ProviderKind::Mem);
    let own: Vec<_> = c
        .listeners
        .iter()
        .filter_map(|l| parse_address(&l.address))
        .collect();
    let peer = c
        .peers
        .iter()
        .find(|p| p.name == "self")
        .expect("peer `self`");
    assert!(own.contains(&parse_address(&peer.address).expect("address")));
    let server = load("demo-server.toml");
    assert_ne!(c.daemon.app_socket, server.daemon.app_socket);
    assert_ne!(c.daemon.metrics_listen, server.daemon.metrics_listen);
}

#[test]
fn mem_yield_demo_is_the_mem_demo_with_the_yield_idle_policy_on_its_own_sockets() {
    let c = load("demo-mem-yield.toml");
    let mem = load("demo-mem.toml");
    assert_eq!(c.cpu.idle.policy, IdlePolicy::Yield);
    assert_eq!(c.cpu.idle.park_after_us, mem.cpu.idle.park_after_us);
    // Everything but the idle policy and the daemon's own addresses is the mem demo's.
    assert_eq!(
        (
            &c.provider,
            &c.transport,
            &c.pools,
            &c.apps,
            &c.listeners,
            &c.peers
        ),
        (
            &mem.provider,
            &mem.transport,
            &mem.pools,
            &mem.apps,
            &mem.listeners,
            &mem.peers
        )
    );
    for (a, b) in [
        (&c.daemon.app_socket, &mem.daemon.app_socket),
        (&c.daemon.admin_socket, &mem.daemon.admin_socket),
    ] {
        assert_ne!(a, b, "both demos can run at once");
    }
    assert_ne!(c.daemon.metrics_listen, mem.daemon.metrics_listen);
}

#[test]
fn nic_example_uses_ibv_and_pinned_cores() {
    let c = load("rpcrdmad.toml");
    assert_eq!(c.provider.kind, ProviderKind::Ibv);
    assert!(!c.cpu.poll_cores.is_empty());
    assert!(c.cpu.control_core.is_some());
}
