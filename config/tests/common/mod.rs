//! Helpers shared by the integration tests.
#![allow(dead_code)]

use rpcrdma_config::*;

/// A 2-core host, like this machine and CI.
pub static HOST: std::sync::LazyLock<HostFacts> =
    std::sync::LazyLock::new(|| HostFacts::with_cores(2));

/// A config where every optional key is present and most values differ from their defaults.
pub fn full_sample() -> Config {
    let mut c = Config::default();
    c.daemon.app_socket = "/run/x/app.sock".into();
    c.daemon.admin_socket = "/run/x/admin.sock".into();
    c.daemon.log_format = LogFormat::Json;
    c.daemon.log_level = LogLevel::Debug;
    c.daemon.metrics_listen = Some("127.0.0.1:9100".into());
    c.cpu.poll_cores = vec![1];
    c.cpu.control_core = Some(0);
    c.cpu.idle = Idle {
        policy: IdlePolicy::Spin,
        spin_us: 70,
        spin_polls: Some(7),
        backoff_max_us: 50,
        park_after_us: 500,
    };
    c.provider.kind = ProviderKind::Ibv;
    c.provider.ibv = Ibv {
        device: Some("mlx5_1".into()),
        port: 2,
        gid_index: 3,
        ird: 12,
        ord: 6,
        exposure: IbvExposure::MemoryWindow,
    };
    c.provider.soft = Soft {
        fpdu_size: 9000,
        crc: true,
        mpa_revision: 2,
        ird: 8,
        ord: 4,
        max_pending: 64,
    };
    c.transport = Transport {
        version: 2,
        inline_send: 8192,
        inline_recv: 16384,
        credits: 16,
        backchannel_credits: 2,
        ddp_threshold: 2048,
        max_segments_per_chunk: 4,
        max_chunks_per_list: 2,
        remote_invalidation: false,
        v2_first_message_timeout_ms: 1500,
        xcharext: Xcharext {
            min_rbsiz: 2048,
            max_rbsiz: 16384,
            reqreminv_may_change: true,
        },
    };
    c.pools = Pools {
        connections: 2,
        send_buffers: 72,
        send_buffer_size: 8192,
        recv_buffers: 64,
        recv_buffer_size: 16384,
        receive_queue: ReceiveQueue::PerConnection,
    };
    c.listeners = vec![Listener {
        address: "[::1]:20051".into(),
        provider: Some(ProviderKind::Soft),
        allow: vec!["192.0.2.0/24".into(), "2001:db8::7".into()],
        max_connections_per_host: 8,
        connect_rate_per_host: 20,
        spread: false,
    }];
    c.peers = vec![Peer {
        name: "far".into(),
        address: "192.0.2.7".into(),
        provider: Some(ProviderKind::Ibv),
        reconnect_initial_ms: 10,
        reconnect_max_ms: 1000,
    }];
    c.apps = Apps {
        max_apps: 3,
        sq_entries: 64,
        cq_entries: 128,
        arena_size: 1 << 20,
    };
    c
}

/// Every leaf key of `cfg` as (dotted path with `[]` for array elements, TOML value).
pub fn leaves(cfg: &Config) -> Vec<(String, toml::Value)> {
    fn walk(prefix: &str, v: &toml::Value, out: &mut Vec<(String, toml::Value)>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let p = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&p, v, out);
                }
            }
            toml::Value::Array(a) if a.first().is_some_and(toml::Value::is_table) => {
                walk(&format!("{prefix}[]"), &a[0], out);
            }
            other => out.push((prefix.to_owned(), other.clone())),
        }
    }
    let mut out = Vec::new();
    walk(
        "",
        &toml::Value::try_from(cfg).expect("config serializes"),
        &mut out,
    );
    out
}

/// Every table of the schema as a TOML header (`""` for the root, `[[x]]` for arrays).
pub fn tables() -> Vec<String> {
    let mut out = vec![String::new()];
    for (path, _) in leaves(&full_sample()) {
        let Some((table, _)) = path.rsplit_once('.') else {
            continue;
        };
        let header = match table.strip_suffix("[]") {
            Some(arr) => format!("[[{arr}]]"),
            None => format!("[{table}]"),
        };
        if !out.contains(&header) {
            out.push(header);
        }
    }
    out
}

/// Errors (not warnings) of checking `text` on [`HOST`].
pub fn errors(text: &str) -> Vec<Diagnostic> {
    check(text, "t.toml", &HOST)
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .cloned()
        .collect()
}
