//! The deployment files in `deploy/` stay consistent with the daemon.

use std::path::Path;

fn deploy(p: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(p);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn kubernetes_configmap_holds_a_valid_config() {
    let yaml = deploy("kubernetes/rpcrdmad-daemonset.yaml");
    let start = yaml.find("rpcrdmad.toml: |").expect("config key") + "rpcrdmad.toml: |".len();
    let end = start + yaml[start..].find("\n---").expect("document end");
    let toml: String = yaml[start..end]
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let report = rpcrdma_config::check(
        &toml,
        "rpcrdmad-daemonset.yaml",
        &rpcrdma_config::HostFacts::with_cores(4),
    );
    assert!(report.is_ok(), "{}", report.diagnostics);
    let cfg = report.config.expect("config");
    assert_eq!(cfg.daemon.admin_socket, "/run/rpcrdmad/admin.sock");
}

#[test]
fn systemd_unit_runs_the_daemon_with_memlock_runtime_dir_and_restart() {
    let unit = deploy("systemd/rpcrdmad.service");
    for line in [
        "LimitMEMLOCK=infinity",
        "RuntimeDirectory=rpcrdmad",
        "Restart=on-failure",
        "ExecReload=/bin/kill -HUP $MAINPID",
    ] {
        assert!(unit.lines().any(|l| l == line), "missing {line}");
    }
    // The sockets of the NIC example config live in the unit's runtime directory.
    let cfg = rpcrdma_config::check(
        &deploy("rpcrdmad.toml"),
        "rpcrdmad.toml",
        &rpcrdma_config::HostFacts::with_cores(4),
    )
    .config
    .expect("example config parses");
    assert!(cfg.daemon.app_socket.starts_with("/run/rpcrdmad/"));
    assert!(cfg.daemon.admin_socket.starts_with("/run/rpcrdmad/"));
}
