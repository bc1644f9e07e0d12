//! What a reload may change live: compares two configurations key by key.

use crate::admin::{Refused, ReloadOutcome};
use rpcrdma_config::Config;
use serde_json::Value;

/// Keys (dotted, `peers[]` for any peer) that apply without a restart.
const LIVE: &[&str] = &[
    "daemon.log-level",
    "cpu.idle.policy",
    "cpu.idle.spin-us",
    "cpu.idle.spin-polls",
    "cpu.idle.backoff-max-us",
    "cpu.idle.park-after-us",
    "listeners[].allow",
    "listeners[].max-connections-per-host",
    "listeners[].connect-rate-per-host",
    "listeners[].spread",
    "peers[].reconnect-initial-ms",
    "peers[].reconnect-max-ms",
];

fn flatten(prefix: &str, generic: &str, v: &Value, out: &mut Vec<(String, String, Value)>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                let g = if generic.is_empty() {
                    k.clone()
                } else {
                    format!("{generic}.{k}")
                };
                flatten(&p, &g, v, out);
            }
        }
        // Peers and listeners are matched by position; a list of another length is one change.
        Value::Array(a) if a.iter().all(Value::is_object) && !a.is_empty() => {
            for (i, v) in a.iter().enumerate() {
                flatten(&format!("{prefix}[{i}]"), &format!("{generic}[]"), v, out);
            }
        }
        v => out.push((prefix.to_string(), generic.to_string(), v.clone())),
    }
}

fn why(key: &str) -> String {
    let section = key.split(['.', '[']).next().unwrap_or(key);
    let what = match section {
        "daemon" => "sockets and the metrics address are bound at start",
        "cpu" => "poll threads are pinned at start",
        "provider" => "the RDMA provider is opened at start",
        "transport" => "connection parameters are fixed when each connection is made",
        "pools" => "buffer pools are registered at start",
        "listeners" => "listeners are opened at start",
        "peers" => "apps address peers by their position in the table given at attach",
        "apps" => "app regions are sized when the app socket is bound",
        _ => "not a live setting",
    };
    format!("needs a restart: {what}")
}

/// Compares `old` and `new`: changed keys that are live go to `applied`, the others to
/// `refused` with the reason.
pub fn diff(old: &Config, new: &Config) -> ReloadOutcome {
    let (Ok(a), Ok(b)) = (serde_json::to_value(old), serde_json::to_value(new)) else {
        return ReloadOutcome::default();
    };
    let (mut fa, mut fb) = (Vec::new(), Vec::new());
    flatten("", "", &a, &mut fa);
    flatten("", "", &b, &mut fb);
    let mut out = ReloadOutcome::default();
    let mut seen = std::collections::BTreeSet::new();
    // A table list of another length (a peer or listener added or removed) is one change.
    let mut resized = Vec::new();
    for list in ["peers", "listeners"] {
        if a.get(list).and_then(Value::as_array).map(Vec::len)
            != b.get(list).and_then(Value::as_array).map(Vec::len)
        {
            resized.push(list);
            out.refused.push(Refused {
                key: list.to_string(),
                reason: why(list),
            });
        }
    }
    for (key, generic, v) in fa.iter().chain(fb.iter()) {
        if resized.iter().any(|l| key.starts_with(l)) || !seen.insert(key.clone()) {
            continue;
        }
        let before = fa.iter().find(|(k, ..)| k == key).map(|x| &x.2);
        let after = fb.iter().find(|(k, ..)| k == key).map(|x| &x.2);
        if before == after {
            continue;
        }
        let _ = v;
        let live = before.is_some() && after.is_some() && LIVE.contains(&generic.as_str());
        if live {
            out.applied.push(key.clone());
        } else {
            out.refused.push(Refused {
                key: key.clone(),
                reason: why(key),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        rpcrdma_config::from_str_named(text, "t.toml").expect("valid")
    }

    #[test]
    fn live_keys_apply_and_others_are_refused_with_a_reason() {
        let old = cfg("[[peers]]\nname = \"a\"\naddress = \"127.0.0.1:1\"\n");
        let new = cfg(
            "[daemon]\nlog-level = \"debug\"\n[transport]\ncredits = 16\n\
             [[peers]]\nname = \"a\"\naddress = \"127.0.0.1:1\"\nreconnect-max-ms = 900\n",
        );
        let d = diff(&old, &new);
        assert_eq!(
            d.applied,
            vec!["daemon.log-level", "peers[0].reconnect-max-ms"]
        );
        assert_eq!(d.refused.len(), 1);
        assert_eq!(d.refused[0].key, "transport.credits");
        assert!(d.refused[0].reason.contains("restart"));
    }

    #[test]
    fn unchanged_config_changes_nothing() {
        let c = cfg("");
        assert_eq!(diff(&c, &c), ReloadOutcome::default());
    }

    #[test]
    fn a_new_peer_is_refused() {
        let old = cfg("");
        let new = cfg("[[peers]]\nname = \"b\"\naddress = \"127.0.0.1:2\"\n");
        let d = diff(&old, &new);
        assert!(d.applied.is_empty());
        assert_eq!(d.refused.len(), 1);
        assert_eq!(d.refused[0].key, "peers");
    }
}
