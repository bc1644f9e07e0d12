//! Prometheus text exposition (format 0.0.4) of the poll threads' snapshots.

use rpcrdma_dataplane::poll::{
    ConnInfo, ConnStats, Histo, ListenerStats, Refusal, Snapshot, Totals,
};
use std::collections::{BTreeMap, HashSet};
use std::fmt::Write;

/// Per-peer totals, by peer key: a configured peer's name, or for a connection the daemon
/// accepted, the remote host's address (its port changes with every connection).
pub type PeerTotals = BTreeMap<String, Totals>;

/// What a peer's ended connections counted, so that its `rpcrdmad_peer_*` counters go on
/// across reconnects (a connection's own series ends with it; the next one has a new `conn`).
/// Also the connections that ended since their thread's last snapshot: the snapshot kept
/// until the next one still lists them, and their counts are here now.
#[derive(Debug, Default)]
pub struct PeerLedger {
    ended: PeerTotals,
    /// The ended connections' round-trip histograms, merged per peer.
    ended_rtt: BTreeMap<String, Histo>,
    gone: HashSet<(usize, u32)>,
}

impl PeerLedger {
    /// A connection to or from `peer` is established.
    pub fn opened(&mut self, peer: &str) {
        let t = self.ended.entry(peer.to_owned()).or_default();
        t.conns_opened = t.conns_opened.saturating_add(1);
    }

    /// Connection `conn` of `thread`, with `peer`, ended having counted `last` and
    /// recorded `rtt`.
    pub fn ended(&mut self, thread: usize, conn: u32, peer: &str, last: Totals, rtt: &Histo) {
        let t = self.ended.entry(peer.to_owned()).or_default();
        *t += last;
        t.conns_closed = t.conns_closed.saturating_add(1);
        self.ended_rtt.entry(peer.to_owned()).or_default().add(rtt);
        self.gone.insert((thread, conn));
    }

    /// A fresh snapshot of `thread` arrived: it lists none of the connections that ended
    /// before it was filled (the thread's events come in order).
    pub fn snapshot_arrived(&mut self, thread: usize) {
        self.gone.retain(|&(t, _)| t != thread);
    }

    /// Each peer's totals: its ended connections' counts and its live connections' in
    /// `snaps`; `key` names a live connection's peer.
    pub fn totals(&self, snaps: &[&Snapshot], key: impl Fn(&ConnInfo) -> String) -> PeerTotals {
        let mut all = self.ended.clone();
        for c in self.live(snaps) {
            *all.entry(key(&c.info)).or_default() += c.info.totals();
        }
        all
    }

    /// Each peer's round-trip histogram, its ended and live connections' merged.
    pub fn rtt(
        &self,
        snaps: &[&Snapshot],
        key: impl Fn(&ConnInfo) -> String,
    ) -> BTreeMap<String, Histo> {
        let mut all = self.ended_rtt.clone();
        for c in self.live(snaps) {
            all.entry(key(&c.info)).or_default().add(&c.latency);
        }
        all
    }

    /// The connections of `snaps` that have not ended since.
    fn live<'a>(&'a self, snaps: &'a [&'a Snapshot]) -> impl Iterator<Item = &'a ConnStats> {
        snaps.iter().flat_map(move |s| {
            s.conns()
                .iter()
                .filter(move |c| !self.gone.contains(&(s.thread.index, c.info.id)))
        })
    }
}

/// Histogram bucket upper bounds, in seconds.
pub const BUCKETS: [f64; 14] = [
    5e-6, 10e-6, 20e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 100e-3, 1.0, 10.0,
];

/// Escapes a label value (backslash, double quote, newline).
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The labels of an attached app's series: its thread, slot.generation and pid.
fn app_labels(s: &Snapshot, a: &rpcrdma_shm::daemon::AppInfo) -> String {
    let pid = a.pid.map_or_else(|| "-".to_string(), |p| p.to_string());
    format!(
        "{{thread=\"{}\",app=\"{}.{}\",pid=\"{pid}\"}}",
        s.thread.index, a.slot, a.gen
    )
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Writes one histogram (`_bucket`, `_sum`, `_count`) of nanosecond samples as seconds.
fn histogram(out: &mut String, name: &str, labels: &str, h: &Histo) {
    // A connection slot that never carried a call has no histogram: all zeros.
    let h = h.get();
    for le in BUCKETS {
        let ns = (le * 1e9) as u64;
        let n = h.map_or(0, |h| h.count_between(0, ns));
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {n}");
    }
    let total = h.map_or(0, |h| h.len());
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {total}");
    let sum_ns: f64 = h.map_or(0.0, |h| {
        h.iter_recorded()
            .map(|v| v.value_iterated_to() as f64 * v.count_at_value() as f64)
            .sum()
    });
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", sum_ns / 1e9);
    let _ = writeln!(out, "{name}_count{{{labels}}} {total}");
}

/// Renders every thread's snapshot; `peer_of(thread, conn)` names a connection's peer;
/// `peers` are the per-peer totals ([`PeerLedger::totals`]); `configured` lists the
/// configured peers by name with whether each has a connection up.
pub fn render(
    snaps: &[&Snapshot],
    peer_of: impl Fn(usize, u32) -> String,
    peers: &PeerTotals,
    peer_rtt: &BTreeMap<String, Histo>,
    configured: &[(&str, bool)],
) -> String {
    let mut out = String::with_capacity(4096);
    type Pick = fn(&Totals) -> u64;
    let totals: [(&str, &str, Pick); 10] = [
        ("calls_out", "RPC calls sent as requester", |t| t.calls_out),
        ("replies_in", "RPC replies received", |t| t.replies_in),
        ("calls_in", "RPC calls received as responder", |t| {
            t.calls_in
        }),
        ("replies_out", "RPC replies sent", |t| t.replies_out),
        ("call_errors", "RPC calls that failed", |t| t.call_errors),
        ("protocol_errors", "RPC-over-RDMA protocol errors", |t| {
            t.protocol_errors
        }),
        ("bytes_out", "payload bytes sent", |t| t.bytes_out),
        ("bytes_in", "payload bytes received", |t| t.bytes_in),
        ("conns_opened", "connections established", |t| {
            t.conns_opened
        }),
        ("conns_closed", "connections ended", |t| t.conns_closed),
    ];
    for (name, help, pick) in totals {
        let metric = format!("rpcrdmad_{name}_total");
        header(
            &mut out,
            &metric,
            "counter",
            &format!("{help}, all connections"),
        );
        let sum: u64 = snaps.iter().map(|s| pick(&s.thread.totals)).sum();
        let _ = writeln!(out, "{metric} {sum}");
    }
    for (name, help, pick) in totals {
        let metric = format!("rpcrdmad_peer_{name}_total");
        header(
            &mut out,
            &metric,
            "counter",
            &format!("{help}, with this peer (its ended connections included)"),
        );
        for (peer, t) in peers {
            let _ = writeln!(out, "{metric}{{peer=\"{}\"}} {}", esc(peer), pick(t));
        }
    }
    header(
        &mut out,
        "rpcrdmad_peer_up",
        "gauge",
        "1 while this configured peer has a connection up, else 0 (connecting, backing off, stopped)",
    );
    for (peer, up) in configured {
        let _ = writeln!(
            out,
            "rpcrdmad_peer_up{{peer=\"{}\"}} {}",
            esc(peer),
            u8::from(*up)
        );
    }
    header(
        &mut out,
        "rpcrdmad_thread_busy_seconds_total",
        "counter",
        "time poll threads spent on iterations that found work",
    );
    for s in snaps {
        let t = &s.thread;
        let _ = writeln!(
            out,
            "rpcrdmad_thread_busy_seconds_total{{thread=\"{}\"}} {}",
            t.index,
            t.busy_ns as f64 / 1e9
        );
    }
    header(
        &mut out,
        "rpcrdmad_thread_idle_seconds_total",
        "counter",
        "time poll threads spent idle (empty polls, pauses, parked)",
    );
    for s in snaps {
        let t = &s.thread;
        let _ = writeln!(
            out,
            "rpcrdmad_thread_idle_seconds_total{{thread=\"{}\"}} {}",
            t.index,
            t.idle_ns as f64 / 1e9
        );
    }
    type PerThread = fn(&rpcrdma_dataplane::poll::ThreadStats) -> u64;
    type PerListener = fn(&ListenerStats) -> u64;
    let per_thread: [(&str, &str, &str, PerThread); 15] = [
        (
            "rpcrdmad_thread_hops_sent_total",
            "counter",
            "hops (calls, answers, served calls) sent to other poll threads",
            |t| t.hops_out,
        ),
        (
            "rpcrdmad_thread_hops_received_total",
            "counter",
            "hops received from other poll threads",
            |t| t.hops_in,
        ),
        (
            "rpcrdmad_thread_hops_deferred_total",
            "counter",
            "hops held back because the queue to another poll thread was full",
            |t| t.hops_deferred,
        ),
        (
            "rpcrdmad_thread_drains_overdue_total",
            "counter",
            "closed connections whose calls ended before the device reported their send queue drained",
            |t| t.drains_overdue,
        ),
        (
            "rpcrdmad_thread_conns_handed_over_total",
            "counter",
            "connection requests its listeners admitted and handed to the poll thread with the fewest connections (listeners[].spread)",
            |t| t.conns_handed_over,
        ),
        (
            "rpcrdmad_thread_completions_total",
            "counter",
            "work completions polled (receives, and work posted signalled)",
            |t| t.completions,
        ),
        ("rpcrdmad_apps", "gauge", "apps attached", |t| t.apps as u64),
        (
            "rpcrdmad_app_ops",
            "gauge",
            "app operations in flight (calls, replies, posted receive buffers)",
            |t| t.app_ops as u64,
        ),
        (
            "rpcrdmad_rpcs_in_flight",
            "gauge",
            "RPCs the engine carries for apps (sent or being served)",
            |t| t.rpcs_in_flight as u64,
        ),
        (
            "rpcrdmad_conns_retiring",
            "gauge",
            "closed connections whose queue pair the device still holds (their calls' ends wait for it)",
            |t| t.conns_retiring as u64,
        ),
        (
            "rpcrdmad_calls_held",
            "gauge",
            "incoming calls waiting for a receive buffer of their serving app",
            |t| t.calls_held as u64,
        ),
        (
            "rpcrdmad_calls_held_total",
            "counter",
            "incoming calls that had to wait for a receive buffer of their serving app",
            |t| t.calls_held_total,
        ),
        (
            "rpcrdmad_calls_waiting_slot",
            "gauge",
            "calls waiting for a free call slot of their connection",
            |t| t.calls_waiting_slot as u64,
        ),
        (
            "rpcrdmad_regions",
            "gauge",
            "memory regions registered (buffer pool, app arenas)",
            |t| t.regions as u64,
        ),
        (
            "rpcrdmad_region_bytes",
            "gauge",
            "bytes of registered memory regions",
            |t| t.region_bytes,
        ),
    ];
    for (metric, kind, help, pick) in per_thread {
        header(&mut out, metric, kind, help);
        for s in snaps {
            let _ = writeln!(
                out,
                "{metric}{{thread=\"{}\"}} {}",
                s.thread.index,
                pick(&s.thread)
            );
        }
    }
    type AppPick = fn(&rpcrdma_shm::daemon::AppCounters) -> u64;
    let per_app: [(&str, &str, AppPick); 7] = [
        ("calls", "calls the app submitted", |c| c.calls),
        ("calls_done", "of those, calls that ended", |c| c.calls_done),
        ("served", "calls delivered to the app to serve", |c| {
            c.served
        }),
        ("replies", "replies the app submitted", |c| c.replies),
        ("bad_submissions", "the app's submissions refused", |c| {
            c.bad
        }),
        ("cancels", "calls the app cancelled in flight", |c| {
            c.cancels
        }),
        (
            "timeouts",
            "the app's calls that reached their time limit",
            |c| c.timeouts,
        ),
    ];
    for (name, help, pick) in per_app {
        let metric = format!("rpcrdmad_app_{name}_total");
        header(
            &mut out,
            &metric,
            "counter",
            &format!("{help} (per attached app: thread, slot.generation, pid; the series ends with the app)"),
        );
        for s in snaps {
            for a in s.apps() {
                let _ = writeln!(out, "{metric}{} {}", app_labels(s, a), pick(&a.counters));
            }
        }
    }
    header(
        &mut out,
        "rpcrdmad_app_lent_calls",
        "gauge",
        "the app's calls that ended while the peer could still reach their memory, not yet released (per attached app)",
    );
    for s in snaps {
        for a in s.apps() {
            let _ = writeln!(
                out,
                "rpcrdmad_app_lent_calls{} {}",
                app_labels(s, a),
                a.lent
            );
        }
    }
    header(
        &mut out,
        "rpcrdmad_connects_refused_total",
        "counter",
        "connection requests refused, by reason: not-allowed, host-limit, rate (listener rules), full (no slot), draining",
    );
    for why in Refusal::ALL {
        let n: u64 = snaps
            .iter()
            .map(|s| s.thread.connects_refused.get(why))
            .sum();
        let _ = writeln!(
            out,
            "rpcrdmad_connects_refused_total{{reason=\"{}\"}} {n}",
            why.label()
        );
    }
    let listeners = || snaps.iter().flat_map(|s| s.listeners());
    let per_listener: [(&str, &str, &str, PerListener); 2] = [
        (
            "rpcrdmad_listener_connections",
            "gauge",
            "connections a listener admitted that are not over yet, on any poll thread",
            |l| l.connections,
        ),
        (
            "rpcrdmad_listener_connects_admitted_total",
            "counter",
            "connection requests a listener admitted",
            |l| l.admitted,
        ),
    ];
    for (name, kind, help, value) in per_listener {
        header(&mut out, name, kind, help);
        for l in listeners() {
            let _ = writeln!(
                out,
                "{name}{{listener=\"{}\"}} {}",
                listener_name(l),
                value(l)
            );
        }
    }
    header(
        &mut out,
        "rpcrdmad_listener_connects_refused_total",
        "counter",
        "connection requests a listener refused, by reason (as rpcrdmad_connects_refused_total)",
    );
    for l in listeners() {
        for why in Refusal::ALL {
            let _ = writeln!(
                out,
                "rpcrdmad_listener_connects_refused_total{{listener=\"{}\",reason=\"{}\"}} {}",
                listener_name(l),
                why.label(),
                l.refused.get(why)
            );
        }
    }
    header(
        &mut out,
        "rpcrdmad_thread_device_events_total",
        "counter",
        "the RDMA device's asynchronous events (ibv), by kind; each failure ended the connections it concerned",
    );
    for s in snaps {
        let d = &s.thread.device;
        for (kind, n) in [
            ("qp_error", d.qp_errors),
            ("cq_error", d.cq_errors),
            ("srq_error", d.srq_errors),
            ("device_fatal", d.device_fatal),
            ("port_down", d.port_down),
            ("port_up", d.port_up),
            ("last_wqe_reached", d.last_wqe_reached),
            ("retire_timeout", d.retire_timeouts),
        ] {
            let _ = writeln!(
                out,
                "rpcrdmad_thread_device_events_total{{thread=\"{}\",kind=\"{kind}\"}} {n}",
                s.thread.index
            );
        }
    }
    header(
        &mut out,
        "rpcrdmad_buffers",
        "gauge",
        "buffers in the poll thread's send and receive pools",
    );
    header(
        &mut out,
        "rpcrdmad_buffers_free",
        "gauge",
        "free buffers (receive: posted) of the send and receive pools",
    );
    for s in snaps {
        let b = &s.thread.buffers;
        for (pool, free, total) in [
            ("send", b.send_free, b.send_total),
            ("recv", b.recv_free, b.recv_total),
        ] {
            let i = s.thread.index;
            let _ = writeln!(
                out,
                "rpcrdmad_buffers{{thread=\"{i}\",pool=\"{pool}\"}} {total}"
            );
            let _ = writeln!(
                out,
                "rpcrdmad_buffers_free{{thread=\"{i}\",pool=\"{pool}\"}} {free}"
            );
        }
    }
    type Conn = fn(&rpcrdma_dataplane::poll::ConnInfo) -> u64;
    let per_conn: [(&str, &str, Conn); 22] = [
        ("calls_out", "RPC calls sent", |c| c.calls_out),
        ("replies_in", "RPC replies received", |c| c.replies_in),
        ("calls_in", "RPC calls received", |c| c.calls_in),
        ("replies_out", "RPC replies sent", |c| c.replies_out),
        ("call_errors", "failed RPC calls", |c| c.call_errors),
        ("protocol_errors", "protocol errors", |c| c.protocol_errors),
        ("bytes_out", "payload bytes sent", |c| c.bytes_out),
        ("bytes_in", "payload bytes received", |c| c.bytes_in),
        ("rdma_read_bytes", "bytes pulled with RDMA Read", |c| {
            c.engine.read_bytes
        }),
        ("rdma_write_bytes", "bytes pushed with RDMA Write", |c| {
            c.engine.write_bytes
        }),
        ("credit_stalls", "calls that waited for a credit", |c| {
            c.engine.credit_stalls
        }),
        ("short_sent", "short (inline) messages sent", |c| {
            c.engine.short_sent
        }),
        (
            "long_calls",
            "long calls sent (Position-zero Read chunk)",
            |c| c.engine.long_calls,
        ),
        ("long_replies", "long replies sent (Reply chunk)", |c| {
            c.engine.long_replies
        }),
        ("read_chunks", "Read chunks offered", |c| {
            c.engine.read_chunks
        }),
        ("write_chunks", "Write chunks offered", |c| {
            c.engine.write_chunks
        }),
        ("reply_chunks", "Reply chunks offered", |c| {
            c.engine.reply_chunks
        }),
        ("invalidations", "local invalidations posted", |c| {
            c.engine.invalidations
        }),
        (
            "remote_invalidations",
            "invalidations done by the peer's Send With Invalidate",
            |c| c.engine.remote_invalidations,
        ),
        (
            "replies_with_invalidate",
            "replies sent with Send With Invalidate (the caller allowed it and offered one key)",
            |c| c.engine.replies_with_invalidate,
        ),
        (
            "dropped",
            "messages dropped (too short, header errors in replies, unknown XIDs)",
            |c| c.engine.dropped,
        ),
        (
            "bad_replies",
            "replies refused for breaking the chunk rules or the program's binding (calls failed BAD_REPLY)",
            |c| c.engine.bad_replies,
        ),
    ];
    for (name, help, pick) in per_conn {
        let metric = format!("rpcrdmad_conn_{name}_total");
        header(
            &mut out,
            &metric,
            "counter",
            &format!("{help} on this connection"),
        );
        for s in snaps {
            for c in s.conns() {
                let peer = esc(&peer_of(s.thread.index, c.info.id));
                let _ = writeln!(
                    out,
                    "{metric}{{thread=\"{}\",conn=\"{}\",peer=\"{peer}\"}} {}",
                    s.thread.index,
                    c.info.id,
                    pick(&c.info)
                );
            }
        }
    }
    type Codes = fn(&rpcrdma_dataplane::poll::ConnInfo) -> rpcrdma_dataplane::ErrorCounts;
    let errors: [(&str, &str, Codes); 2] = [
        ("sent", "RDMA_ERROR messages sent", |c| {
            c.engine.errors_sent_by
        }),
        ("received", "RDMA_ERROR messages received", |c| {
            c.engine.errors_received_by
        }),
    ];
    for (dir, help, pick) in errors {
        let metric = format!("rpcrdmad_conn_errors_{dir}_total");
        header(
            &mut out,
            &metric,
            "counter",
            &format!("{help} on this connection, by error code"),
        );
        for s in snaps {
            for c in s.conns() {
                let peer = esc(&peer_of(s.thread.index, c.info.id));
                let e = pick(&c.info);
                for (code, n) in [
                    ("err_vers", e.vers),
                    ("err_chunk", e.chunk),
                    ("bad_header", e.bad_header),
                    ("inval_option", e.inval_option),
                ] {
                    let _ = writeln!(
                        out,
                        "{metric}{{thread=\"{}\",conn=\"{}\",peer=\"{peer}\",code=\"{code}\"}} {n}",
                        s.thread.index, c.info.id,
                    );
                }
            }
        }
    }
    header(
        &mut out,
        "rpcrdmad_conn_rtt_seconds",
        "histogram",
        "round-trip time of calls from submission to reply",
    );
    for s in snaps {
        for c in s.conns() {
            let peer = esc(&peer_of(s.thread.index, c.info.id));
            let labels = format!(
                "thread=\"{}\",conn=\"{}\",peer=\"{peer}\"",
                s.thread.index, c.info.id
            );
            histogram(&mut out, "rpcrdmad_conn_rtt_seconds", &labels, &c.latency);
        }
    }
    header(
        &mut out,
        "rpcrdmad_peer_rtt_seconds",
        "histogram",
        "round-trip time of calls to this peer, over all its connections (ended ones included)",
    );
    for (peer, h) in peer_rtt {
        let labels = format!("peer=\"{}\"", esc(peer));
        histogram(&mut out, "rpcrdmad_peer_rtt_seconds", &labels, h);
    }
    out
}

/// A listener's name in metrics and `rpcrdmactl stats`: its bound address (the port a
/// configured bare IP got included), or its configuration index when unknown.
pub(crate) fn listener_name(l: &ListenerStats) -> String {
    l.addr
        .map_or_else(|| format!("#{}", l.index), |a| a.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpcrdma_dataplane::poll::{ConnInfo, ConnState};

    fn snap() -> Snapshot {
        let mut s = Snapshot::with_capacity(2);
        s.thread.totals.calls_out = 7;
        s.thread.busy_ns = 1_500_000_000;
        s.thread.regions = 3;
        s.thread.buffers.recv_free = 60;
        s.thread.device.cq_errors = 1;
        s.thread.device.retire_timeouts = 3;
        s.thread.buffers.recv_total = 64;
        s.n = 1;
        s.conns[0].info = ConnInfo {
            id: 3,
            state: ConnState::Up,
            calls_out: 7,
            ..ConnInfo::default()
        };
        s.conns[0].info.engine.errors_sent_by.chunk = 2;
        s.conns[0].latency.ensure_empty();
        for ns in [4_000, 15_000, 15_000, 3_000_000] {
            s.conns[0].latency.record(ns);
        }
        s = s.with_apps(2);
        s.apps[0] = rpcrdma_shm::daemon::AppInfo {
            slot: 1,
            gen: 4,
            pid: Some(4242),
            lent: 2,
            counters: rpcrdma_shm::daemon::AppCounters {
                calls: 9,
                served: 5,
                ..Default::default()
            },
            ..Default::default()
        };
        s.n_apps = 1;
        s
    }

    /// A peer's counters go on across its connections: an ended connection's last counts
    /// replace what the kept snapshot still says of it, and the next connection adds its own.
    #[test]
    fn peer_totals_outlive_connections_and_never_count_one_twice() {
        let key = |_: &ConnInfo| "srv1".to_owned();
        let calls = |p: &PeerTotals| {
            p.get("srv1")
                .map(|t| (t.calls_out, t.conns_opened, t.conns_closed))
        };
        let mut ledger = PeerLedger::default();
        let first = snap();
        ledger.opened("srv1");
        assert_eq!(calls(&ledger.totals(&[&first], key)), Some((7, 1, 0)));
        // Connection 3 ends having sent 9 calls; the snapshot kept still says 7.
        let last = Totals {
            calls_out: 9,
            ..Totals::default()
        };
        // It had timed 5 calls by then (the snapshot says 4).
        let mut rtt = Histo::new();
        for ns in [4_000, 15_000, 15_000, 3_000_000, 7_000] {
            rtt.record(ns);
        }
        ledger.ended(0, 3, "srv1", last, &rtt);
        assert_eq!(calls(&ledger.totals(&[&first], key)), Some((9, 1, 1)));
        let timed =
            |l: &PeerLedger, snaps: &[&Snapshot]| l.rtt(snaps, key).get("srv1").map(Histo::len);
        assert_eq!(timed(&ledger, &[&first]), Some(5));
        // The next connection (id 4) has sent 2 when the thread's next snapshot comes.
        ledger.opened("srv1");
        ledger.snapshot_arrived(0);
        let mut next = snap();
        next.conns[0].info.id = 4;
        next.conns[0].info.calls_out = 2;
        let peers = ledger.totals(&[&next], key);
        assert_eq!(calls(&peers), Some((11, 2, 1)));
        assert_eq!(timed(&ledger, &[&next]), Some(9));
        let text = render(
            &[&next],
            |_, _| "srv1".into(),
            &peers,
            &ledger.rtt(&[&next], key),
            &[("srv1", true), ("down", false)],
        );
        let lines = text.lines().map(|l| Ok(l.to_string()));
        let parsed = prometheus_parse::Scrape::parse(lines).expect("valid exposition");
        let peer = |name: &str| {
            parsed
                .samples
                .iter()
                .find(|m| m.metric == name && m.labels.get("peer") == Some("srv1"))
                .map(|m| m.value.clone())
        };
        assert!(matches!(
            peer("rpcrdmad_peer_calls_out_total"),
            Some(prometheus_parse::Value::Counter(v)) if v == 11.0
        ));
        assert!(matches!(
            peer("rpcrdmad_peer_conns_opened_total"),
            Some(prometheus_parse::Value::Counter(v)) if v == 2.0
        ));
        let Some(prometheus_parse::Value::Histogram(buckets)) = peer("rpcrdmad_peer_rtt_seconds")
        else {
            panic!("no peer histogram")
        };
        let inf = buckets
            .iter()
            .find(|b| b.less_than.is_infinite())
            .map(|b| b.count);
        assert_eq!(inf, Some(9.0));
        let up = |name: &str| {
            parsed
                .samples
                .iter()
                .find(|m| m.metric == "rpcrdmad_peer_up" && m.labels.get("peer") == Some(name))
                .map(|m| m.value.clone())
        };
        assert_eq!(up("srv1"), Some(prometheus_parse::Value::Gauge(1.0)));
        assert_eq!(up("down"), Some(prometheus_parse::Value::Gauge(0.0)));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(esc("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
    }

    #[test]
    fn exposition_parses_and_carries_counters_and_histogram() {
        let s = snap();
        let text = render(
            &[&s],
            |_, _| "srv1".into(),
            &PeerTotals::new(),
            &BTreeMap::new(),
            &[],
        );
        let lines = text.lines().map(|l| Ok(l.to_string()));
        let parsed = prometheus_parse::Scrape::parse(lines).expect("valid exposition");
        let total = parsed
            .samples
            .iter()
            .find(|m| m.metric == "rpcrdmad_calls_out_total")
            .expect("daemon total");
        assert!(matches!(total.value, prometheus_parse::Value::Counter(v) if v == 7.0));
        let rtt = parsed
            .samples
            .iter()
            .find(|m| m.metric == "rpcrdmad_conn_rtt_seconds")
            .expect("histogram");
        assert_eq!(rtt.labels.get("peer"), Some("srv1"));
        let prometheus_parse::Value::Histogram(buckets) = &rtt.value else {
            panic!("not a histogram: {:?}", rtt.value)
        };
        let at = |le: f64| {
            buckets
                .iter()
                .find(|b| (b.less_than - le).abs() < 1e-12)
                .map(|b| b.count)
        };
        assert_eq!(at(5e-6), Some(1.0));
        assert_eq!(at(20e-6), Some(3.0));
        assert_eq!(at(1e-3), Some(3.0));
        assert_eq!(at(5e-3), Some(4.0));
        let gauge = |name: &str, label: Option<(&str, &str)>| {
            parsed
                .samples
                .iter()
                .find(|m| m.metric == name && label.is_none_or(|(k, v)| m.labels.get(k) == Some(v)))
                .map(|m| m.value.clone())
        };
        assert!(matches!(
            gauge("rpcrdmad_regions", None),
            Some(prometheus_parse::Value::Gauge(v)) if v == 3.0
        ));
        assert!(matches!(
            gauge("rpcrdmad_buffers_free", Some(("pool", "recv"))),
            Some(prometheus_parse::Value::Gauge(v)) if v == 60.0
        ));
        assert!(matches!(
            gauge("rpcrdmad_buffers", Some(("pool", "recv"))),
            Some(prometheus_parse::Value::Gauge(v)) if v == 64.0
        ));
        assert!(matches!(
            gauge("rpcrdmad_conn_errors_sent_total", Some(("code", "err_chunk"))),
            Some(prometheus_parse::Value::Counter(v)) if v == 2.0
        ));
        assert!(matches!(
            gauge("rpcrdmad_conn_errors_sent_total", Some(("code", "err_vers"))),
            Some(prometheus_parse::Value::Counter(v)) if v == 0.0
        ));
        assert!(matches!(
            gauge("rpcrdmad_app_calls_total", Some(("pid", "4242"))),
            Some(prometheus_parse::Value::Counter(v)) if v == 9.0
        ));
        assert!(matches!(
            gauge("rpcrdmad_app_served_total", Some(("app", "1.4"))),
            Some(prometheus_parse::Value::Counter(v)) if v == 5.0
        ));
        assert!(matches!(
            gauge("rpcrdmad_app_lent_calls", Some(("pid", "4242"))),
            Some(prometheus_parse::Value::Gauge(v)) if v == 2.0
        ));
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("rpcrdmad_app_calls_total{"))
                .count(),
            1,
            "only the valid app entries"
        );
        assert!(matches!(
            gauge("rpcrdmad_thread_device_events_total", Some(("kind", "cq_error"))),
            Some(prometheus_parse::Value::Counter(v)) if v == 1.0
        ));
        assert!(matches!(
            gauge("rpcrdmad_thread_device_events_total", Some(("kind", "retire_timeout"))),
            Some(prometheus_parse::Value::Counter(v)) if v == 3.0
        ));
        assert!(matches!(
            gauge("rpcrdmad_thread_device_events_total", Some(("kind", "port_down"))),
            Some(prometheus_parse::Value::Counter(v)) if v == 0.0
        ));
        let busy = parsed
            .samples
            .iter()
            .find(|m| m.metric == "rpcrdmad_thread_busy_seconds_total")
            .expect("busy");
        assert!(
            matches!(busy.value, prometheus_parse::Value::Counter(v) if (v - 1.5).abs() < 1e-9)
        );
    }
}
