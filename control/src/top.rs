//! `rpcrdmactl top`: traffic rates between two `stats` snapshots, per peer and per connection,
//! and how busy each poll thread was.
//!
//! The daemon keeps counters since it started (per connection while it lives, per peer for
//! the daemon's life); rates are the differences between two snapshots over the time between
//! them, worked out here, on the operator's side, so the daemon keeps no history.

use serde_json::{Map, Value};

/// The counters `top` follows per connection and per peer, as `stats` names them in its JSON.
pub const COUNTERS: [&str; 8] = [
    "calls-out",
    "replies-in",
    "calls-in",
    "replies-out",
    "call-errors",
    "protocol-errors",
    "bytes-out",
    "bytes-in",
];

/// The counters `top` follows per app (`apps`, merged into the snapshot under `apps`).
pub const APP_COUNTERS: [&str; 7] = [
    "calls",
    "calls-done",
    "served",
    "replies",
    "bad-submissions",
    "cancels",
    "timeouts",
];

/// The counters `top` follows per poll thread.
pub const THREAD_COUNTERS: [&str; 6] = [
    "busy-ns",
    "idle-ns",
    "completions",
    "parks",
    "hops-out",
    "hops-in",
];

/// One interval between snapshots `before` and `after` (`stats` results) taken `seconds`
/// apart: `{"seconds", "peers": [...], "conns": [...], "threads": [...], "apps": [...]}` (apps
/// when the snapshots carry the `apps` answer under `apps`), each row with its key (`peer`;
/// `id` and `peer` for a connection; `index` for a thread; `thread`, `app` and `pid` for an
/// app, with its `ops` now), each counter's
/// difference under its own name and its rate under `NAME-per-s`. A connection that is new
/// since `before` counts from zero; one that has ended is left out (its counts stay in its
/// peer's row, which covers ended connections). Peers and connections come busiest first
/// (calls each way, per second), then by key; threads by index, each with `busy`, the share
/// of the interval it spent on loop turns that found work (0 to 1).
pub fn interval(before: &Value, after: &Value, seconds: f64) -> Value {
    let table = |name: &str, keys: &[&str], now: &[&str], counters: &[&str], load: &[&str]| {
        let mut r = rows(&before[name], &after[name], keys, now, counters, seconds);
        busiest_first(&mut r, load, keys);
        r
    };
    let traffic =
        |name: &str, keys: &[&str]| table(name, keys, &[], &COUNTERS, &["calls-out", "calls-in"]);
    let mut threads = table("threads", &["index"], &[], &THREAD_COUNTERS, &[]);
    for t in &mut threads {
        let count = |k: &str| t.get(k).and_then(Value::as_u64).unwrap_or(0);
        let (busy, idle) = (count("busy-ns"), count("idle-ns"));
        let share = if busy + idle == 0 {
            0.0
        } else {
            busy as f64 / (busy + idle) as f64
        };
        t.insert("busy".into(), share.into());
    }
    // Apps: matched on thread, slot and pid (a slot's next app has another generation and
    // pid); their operations in flight as they are now.
    let apps = table(
        "apps",
        &["thread", "app", "pid"],
        &["ops"],
        &APP_COUNTERS,
        &["calls", "served"],
    );
    let array =
        |r: Vec<Map<String, Value>>| Value::Array(r.into_iter().map(Value::Object).collect());
    let mut out = Map::new();
    out.insert("seconds".into(), seconds.into());
    out.insert("peers".into(), array(traffic("peers", &["peer"])));
    out.insert("conns".into(), array(traffic("conns", &["id", "peer"])));
    out.insert("threads".into(), array(threads));
    out.insert("apps".into(), array(apps));
    Value::Object(out)
}

/// Sorts `rows` by the sum of the `load` counters' rates, highest first, then by `keys`.
fn busiest_first(rows: &mut [Map<String, Value>], load: &[&str], keys: &[&str]) {
    let load_of = |r: &Map<String, Value>| -> f64 {
        load.iter()
            .map(|c| {
                r.get(&format!("{c}-per-s"))
                    .and_then(Value::as_f64)
                    .unwrap_or(0.0)
            })
            .sum()
    };
    rows.sort_by(|a, b| {
        keys.iter().fold(load_of(b).total_cmp(&load_of(a)), |o, k| {
            o.then_with(|| key_order(&a[*k], &b[*k]))
        })
    });
}

/// The rows of array `after` against array `before`, matched on all of `keys`: the keys and
/// the `now` fields as `after` has them, and each of `counters`' difference and rate.
fn rows(
    before: &Value,
    after: &Value,
    keys: &[&str],
    now_fields: &[&str],
    counters: &[&str],
    seconds: f64,
) -> Vec<Map<String, Value>> {
    let empty = Vec::new();
    let old = before.as_array().unwrap_or(&empty);
    after
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|now| {
            let was = old.iter().find(|o| keys.iter().all(|k| o[*k] == now[*k]));
            let mut row = Map::new();
            for k in keys.iter().chain(now_fields) {
                row.insert((*k).into(), now[*k].clone());
            }
            for c in counters {
                let count = |v: Option<&Value>| v.and_then(|v| v[c].as_u64()).unwrap_or(0);
                // Counters only grow; a smaller one would be another object under a reused
                // key, and then counts from zero.
                let (n, b) = (count(Some(now)), count(was));
                let d = if n >= b { n - b } else { n };
                row.insert((*c).into(), d.into());
                row.insert(format!("{c}-per-s"), per_second(d, seconds).into());
            }
            row
        })
        .collect()
}

fn key_order(a: &Value, b: &Value) -> std::cmp::Ordering {
    match (a.as_u64(), b.as_u64()) {
        (Some(x), Some(y)) => x.cmp(&y),
        _ => a.to_string().cmp(&b.to_string()),
    }
}

fn per_second(d: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        d as f64 / seconds
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conn(id: u32, peer: &str, calls: u64, bytes: u64) -> Value {
        json!({"id": id, "peer": peer, "calls-out": calls, "replies-in": calls,
               "calls-in": 0, "replies-out": 0, "call-errors": 0, "protocol-errors": 0,
               "bytes-out": bytes, "bytes-in": bytes, "rdma-read-bytes": 7})
    }

    fn peer(name: &str, calls: u64, opened: u64) -> Value {
        json!({"peer": name, "calls-out": calls, "replies-in": calls, "calls-in": 0,
               "replies-out": 0, "call-errors": 0, "protocol-errors": 0,
               "bytes-out": 0, "bytes-in": 0, "conns-opened": opened})
    }

    /// Differences and rates per peer and connection: a connection that ended is left out
    /// and its peer's row still counts it; a new one counts from zero; a peer seen for the
    /// first time counts from zero; busiest first.
    #[test]
    fn rates_are_differences_over_the_interval_and_survive_a_reconnect() {
        let before = json!({
            "conns": [conn(1, "server", 100, 1000), conn(2, "other", 10, 10)],
            "peers": [peer("server", 100, 1), peer("other", 10, 1)],
        });
        // Connection 1 ended after 20 more calls; its successor 3 made 30; "other" made 5;
        // a client "10.0.0.9" showed up with 4.
        let after = json!({
            "conns": [conn(2, "other", 15, 10), conn(3, "server", 30, 600),
                      conn(4, "10.0.0.9", 4, 0)],
            "peers": [peer("server", 150, 2), peer("other", 15, 1), peer("10.0.0.9", 4, 1)],
        });
        let r = interval(&before, &after, 2.0);
        assert_eq!(r["seconds"], 2.0);
        let peers = r["peers"].as_array().unwrap();
        let names: Vec<&str> = peers.iter().map(|p| p["peer"].as_str().unwrap()).collect();
        assert_eq!(names, ["server", "other", "10.0.0.9"]);
        assert_eq!(peers[0]["calls-out"], 50);
        assert_eq!(peers[0]["calls-out-per-s"], 25.0);
        assert_eq!(peers[1]["calls-out"], 5);
        assert_eq!(peers[2]["replies-in"], 4);
        assert!(peers[0].get("conns-opened").is_none(), "only COUNTERS");
        let conns = r["conns"].as_array().unwrap();
        let ids: Vec<u64> = conns.iter().map(|c| c["id"].as_u64().unwrap()).collect();
        assert_eq!(ids, [3, 2, 4]);
        assert_eq!(conns[0]["peer"], "server");
        assert_eq!(conns[0]["calls-out"], 30);
        assert_eq!(conns[0]["bytes-out-per-s"], 300.0);
        assert_eq!(conns[1]["calls-out"], 5);
        assert_eq!(conns[1]["bytes-in"], 0);
        assert!(conns[0].get("rdma-read-bytes").is_none());
    }

    /// A thread's busy share is its busy time over all its time in the interval, not since it
    /// started; its other counters are differences and rates like the rest.
    #[test]
    fn a_thread_is_as_busy_as_it_was_in_the_interval() {
        let t = |busy: u64, idle: u64, completions: u64| {
            json!({"index": 0, "busy-ns": busy, "idle-ns": idle, "completions": completions,
                   "parks": 3, "hops-out": 0, "hops-in": 0, "busy-ratio": 0.01})
        };
        // Idle for its first 99 s, then busy for 3 s of the next 4.
        let before = json!({"threads": [t(1_000_000_000, 99_000_000_000, 10)]});
        let after = json!({"threads": [t(4_000_000_000, 100_000_000_000, 410)]});
        let r = interval(&before, &after, 4.0);
        let th = &r["threads"][0];
        assert_eq!(th["index"], 0);
        assert_eq!(th["busy"], 0.75);
        assert_eq!(th["completions"], 400);
        assert_eq!(th["completions-per-s"], 100.0);
        assert_eq!(th["parks"], 0);
        assert!(th.get("busy-ratio").is_none());
    }

    /// Apps are matched on thread, slot and pid: an app that left and the next one in its slot
    /// (another generation and pid) do not mix; the busiest first.
    #[test]
    fn apps_are_rated_by_what_they_called_and_served() {
        let app = |thread: u32, app: &str, pid: u32, calls: u64, served: u64| {
            json!({"thread": thread, "app": app, "pid": pid, "ops": 16, "calls": calls,
                   "calls-done": calls, "served": served, "replies": served,
                   "bad-submissions": 0})
        };
        let before = json!({"apps": [app(0, "0.1", 100, 50, 0), app(1, "0.1", 200, 0, 10)]});
        let after = json!({"apps": [app(0, "0.2", 101, 5, 0), app(1, "0.1", 200, 0, 90)]});
        let r = interval(&before, &after, 2.0);
        let apps = r["apps"].as_array().unwrap();
        assert_eq!(apps.len(), 2);
        assert_eq!(
            (&apps[0]["pid"], &apps[0]["served"]),
            (&json!(200), &json!(80))
        );
        assert_eq!(apps[0]["served-per-s"], 40.0);
        assert_eq!(
            (&apps[1]["pid"], &apps[1]["calls"]),
            (&json!(101), &json!(5))
        );
        assert_eq!(apps[1]["ops"], 16);
    }

    /// A counter smaller than before (another object under a reused key) counts from zero;
    /// a zero interval gives rates of zero, never infinities; missing arrays give no rows.
    #[test]
    fn odd_snapshots_give_sane_rows() {
        let before = json!({"conns": [conn(1, "a", 500, 0)], "peers": []});
        let after = json!({"conns": [conn(1, "a", 7, 0)]});
        let r = interval(&before, &after, 0.0);
        assert_eq!(r["conns"][0]["calls-out"], 7);
        assert_eq!(r["conns"][0]["calls-out-per-s"], 0.0);
        assert_eq!(r["peers"], json!([]));
        assert_eq!(r["threads"], json!([]));
        assert_eq!(r["apps"], json!([]));
    }
}
