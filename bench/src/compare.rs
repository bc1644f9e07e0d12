//! `rpcrdma-bench compare`: the same workloads over the raw rings (the physical limit), over ONC RPC/TCP
//! with libtirpc (what a user would pick instead) and over our path, with ratios and the goals.

use crate::case::{Case, Mode, Proc};
use crate::report::{CaseSummary, Environment, Percentiles};
use crate::run::{self, CaseResult, RunOptions, Stop};
use crate::target::Target;
use crate::workload::ReplyBuffer;
use anyhow::Context;
use hdrhistogram::Histogram;
use rpcrdma_shm::abi::{status, Geometry};
use rpcrdma_shm::attach::Listener;
use rpcrdma_shm::client::{Client, WaitPolicy};
use rpcrdma_shm::daemon::{AppTable, CallOutcome, Submission, TableConfig};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

/// The compare document's schema identifier.
pub const SCHEMA: &str = "rpcrdma-bench/compare/1";

/// A minimal poll thread for the raw-ring measurement: attaches apps and completes every CALL at once
/// (status OK, empty reply), so a NULL round trip is one SQ descriptor and one CQ descriptor between two
/// processes plus the daemon side's validation of the copy.
pub fn ring_echo(socket: &Path, spin: Duration) -> anyhow::Result<()> {
    let mut listener = Listener::bind(socket, Geometry::default(), vec!["echo".into()])?;
    let mut table = AppTable::new(TableConfig {
        peers: 1,
        ..TableConfig::default()
    })?;
    println!("ready");
    std::io::stdout().flush()?;
    let mut subs = Vec::with_capacity(64);
    let mut idle = Instant::now();
    loop {
        subs.clear();
        table.poll_submissions(&mut subs, 32);
        let work = !subs.is_empty();
        for (_, s) in subs.drain(..) {
            if let Submission::Call(id) = s {
                table.complete_call(
                    id,
                    CallOutcome {
                        status: status::OK,
                        ..CallOutcome::default()
                    },
                );
            }
        }
        if work {
            idle = Instant::now();
        } else if idle.elapsed() >= spin {
            while let Ok(Some(att)) = listener.accept() {
                let _ = table.attach(att);
            }
            table.reap();
            table.park(Duration::from_millis(20), &[listener.as_fd()]);
            idle = Instant::now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// The raw ring is measured in this many slices of the row's duration, keeping the one with the lowest p50:
/// on a shared 2-core host one slice can be all preemption.
pub const RING_SLICES: u32 = 5;

/// Which implementation a row measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Impl {
    /// App ↔ echoing poll thread over one region's rings.
    RawRing,
    /// ONC RPC over TCP loopback, libtirpc.
    Libtirpc,
    /// Our app → daemon (or loopback harness) → app path.
    Ours,
}

impl Impl {
    fn label(self) -> &'static str {
        match self {
            Impl::RawRing => "raw ring",
            Impl::Libtirpc => "libtirpc TCP",
            Impl::Ours => "ours",
        }
    }
}

/// One measured row.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Row {
    /// The workload (`NULL`, `ECHO 64`, …).
    pub workload: String,
    /// The implementation.
    pub path: Impl,
    /// Which of our targets (its [`OursTarget::label`]) for `ours` rows; `None` otherwise.
    pub target: Option<String>,
    /// Our case name (for `ours` and `raw-ring`).
    pub case: Option<String>,
    /// Calls completed intact.
    pub count: u64,
    /// Calls per second.
    pub calls_per_s: f64,
    /// Payload MB/s.
    pub mb_per_s: f64,
    /// Round trips (ns).
    pub round_trip_ns: Percentiles,
}

/// Ours divided by another path, per percentile.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Ratio {
    /// The workload.
    pub workload: String,
    /// Our target (the numerator).
    pub target: String,
    /// The denominator.
    pub versus: Impl,
    /// p50 ratio.
    pub p50: f64,
    /// p90 ratio.
    pub p90: f64,
    /// p99 ratio.
    pub p99: f64,
    /// p99.9 ratio.
    pub p99_9: f64,
    /// Throughput ratio (MB/s, or calls/s when no payload).
    pub throughput: f64,
}

/// One of the goals.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Goal {
    /// The goal as the issue states it.
    pub goal: String,
    /// What was measured.
    pub measured: String,
    /// `Some(true)` met, `Some(false)` not met, `None` not measurable in this run.
    pub met: Option<bool>,
    /// The target judged, when the goal is about one.
    pub target: Option<String>,
}

/// One of our targets measured in the run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OursTarget {
    /// Its name in rows, ratios and goals (`rpcrdmad soft`, `rpcrdmad mem`, `loopback`, …).
    pub label: String,
    /// What is known about it.
    pub info: crate::target::TargetInfo,
}

/// The compare document.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CompareDoc {
    /// [`SCHEMA`].
    pub schema: String,
    /// Where it ran (its target is the first of `targets`).
    pub environment: Environment,
    /// Our targets, in the order they were measured.
    pub targets: Vec<OursTarget>,
    /// Measured phase per row (s).
    pub duration_s: f64,
    /// Rows.
    pub rows: Vec<Row>,
    /// Ratios.
    pub ratios: Vec<Ratio>,
    /// Goals.
    pub goals: Vec<Goal>,
    /// Rows of this list that could not be measured, with why.
    pub skipped: Vec<String>,
    /// The plot.
    pub svg: Option<String>,
}

/// The workloads compared: label, our case, libtirpc procedure and size.
pub fn workloads() -> Vec<(&'static str, Case, &'static str, u32)> {
    let c = |p, m, s| Case {
        proc_: p,
        mode: m,
        size: s,
    };
    vec![
        ("NULL", c(Proc::Null, Mode::Inline, 0), "null", 0),
        ("ECHO 64 B", c(Proc::Echo, Mode::Inline, 64), "echo", 64),
        (
            "ECHO 1 MiB",
            c(Proc::Echo, Mode::Inline, 1 << 20),
            "echo",
            1 << 20,
        ),
        (
            "READ 1 MiB",
            c(Proc::Read, Mode::WriteChunk, 1 << 20),
            "read",
            1 << 20,
        ),
    ]
}

/// A row from one of our runs (`target`: which of ours, `None` for the raw ring).
pub fn row_of(workload: &str, path: Impl, target: Option<&str>, r: &CaseResult) -> Row {
    let s = CaseSummary::of(r);
    Row {
        workload: workload.into(),
        path,
        target: target.map(str::to_string),
        case: Some(s.name),
        count: s.count,
        calls_per_s: s.calls_per_s,
        mb_per_s: s.mb_per_s,
        round_trip_ns: s.round_trip_ns,
    }
}

/// A row from libtirpc's per-call round trips.
pub fn row_of_samples(
    workload: &str,
    payload: u32,
    samples: &[u64],
    elapsed: Duration,
) -> (Row, Histogram<u64>) {
    let mut h = run::histogram();
    for &s in samples {
        let _ = h.record(s.clamp(1, run::MAX_NS));
    }
    let rate = samples.len() as f64 / elapsed.as_secs_f64().max(1e-9);
    (
        Row {
            workload: workload.into(),
            path: Impl::Libtirpc,
            target: None,
            case: None,
            count: samples.len() as u64,
            calls_per_s: rate,
            mb_per_s: rate * f64::from(payload) / 1e6,
            round_trip_ns: Percentiles::of(&h),
        },
        h,
    )
}

fn div(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::NAN
    }
}

/// Ours / `other` for the same workload.
pub fn ratio(ours: &Row, other: &Row) -> Ratio {
    let (a, b) = (&ours.round_trip_ns, &other.round_trip_ns);
    let tp = if ours.mb_per_s > 0.0 {
        div(ours.mb_per_s, other.mb_per_s)
    } else {
        div(ours.calls_per_s, other.calls_per_s)
    };
    Ratio {
        workload: ours.workload.clone(),
        target: ours.target.clone().unwrap_or_else(|| "ours".into()),
        versus: other.path,
        p50: div(a.p50 as f64, b.p50 as f64),
        p90: div(a.p90 as f64, b.p90 as f64),
        p99: div(a.p99 as f64, b.p99 as f64),
        p99_9: div(a.p99_9 as f64, b.p99_9 as f64),
        throughput: tp,
    }
}

fn find<'a>(rows: &'a [Row], w: &str, p: Impl) -> Option<&'a Row> {
    rows.iter().find(|r| r.workload == w && r.path == p)
}

fn find_ours<'a>(rows: &'a [Row], w: &str, target: &str) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.workload == w && r.path == Impl::Ours && r.target.as_deref() == Some(target))
}

const GOAL_RING: &str = "app<->app NULL p50 <= 3x the raw ring";
const GOAL_SOFT: &str = "soft-iWARP NULL p50 <= 0.7x libtirpc TCP";
const GOAL_READ: &str = "1 MiB READ GB/s >= libtirpc TCP";

fn goal(goal: &str, target: Option<&str>, measured: String, met: Option<bool>) -> Goal {
    Goal {
        goal: goal.into(),
        measured,
        met,
        target: target.map(str::to_string),
    }
}

/// Whether a target is rpcrdmad on the soft provider (the soft-iWARP goal's subject).
fn is_soft(t: &OursTarget) -> bool {
    t.info.kind == "daemons" && t.info.provider.as_deref() == Some("soft")
}

/// The three goals, judged on `rows` for each of `targets`: the raw-ring and READ goals
/// per target, the soft-iWARP goal for each soft-provider daemon target (n/a without one).
pub fn goals(rows: &[Row], targets: &[OursTarget]) -> Vec<Goal> {
    let mut g = Vec::new();
    let ring = find(rows, "NULL", Impl::RawRing);
    let tirpc_null = find(rows, "NULL", Impl::Libtirpc);
    let tirpc_read = find(rows, "READ 1 MiB", Impl::Libtirpc);
    for t in targets {
        let l = t.label.as_str();
        let ours_null = find_ours(rows, "NULL", l);
        g.push(match (ring, ours_null) {
            (Some(r), Some(o)) => {
                let x = div(o.round_trip_ns.p50 as f64, r.round_trip_ns.p50 as f64);
                // Our path includes a ring round trip, so a ratio below 1 means the limit was not measured.
                let bogus = x < 1.0;
                let measured = if bogus {
                    format!("{x:.2}x ({l}): the raw ring measured slower than ours, the host is too busy; rerun")
                } else {
                    format!("{x:.2}x ({l})")
                };
                goal(GOAL_RING, Some(l), measured, (!bogus).then_some(x <= 3.0))
            }
            _ => goal(GOAL_RING, Some(l), format!("not measured ({l})"), None),
        });
    }
    let mut soft_judged = false;
    for t in targets.iter().filter(|t| is_soft(t)) {
        soft_judged = true;
        let l = t.label.as_str();
        g.push(match (find_ours(rows, "NULL", l), tirpc_null) {
            (Some(o), Some(tt)) => {
                let x = div(o.round_trip_ns.p50 as f64, tt.round_trip_ns.p50 as f64);
                goal(GOAL_SOFT, Some(l), format!("{x:.2}x ({l})"), Some(x <= 0.7))
            }
            _ => goal(GOAL_SOFT, Some(l), format!("not measured ({l})"), None),
        });
    }
    if !soft_judged {
        let kinds: Vec<String> = targets.iter().map(|t| t.label.clone()).collect();
        g.push(goal(
            GOAL_SOFT,
            None,
            format!(
                "not measured: needs rpcrdmad on the soft provider (this run: {})",
                kinds.join(", ")
            ),
            None,
        ));
    }
    for t in targets {
        let l = t.label.as_str();
        g.push(match (find_ours(rows, "READ 1 MiB", l), tirpc_read) {
            (Some(o), Some(tt)) => goal(
                GOAL_READ,
                Some(l),
                format!(
                    "{:.2} GB/s vs {:.2} GB/s ({l})",
                    o.mb_per_s / 1e3,
                    tt.mb_per_s / 1e3
                ),
                Some(o.mb_per_s >= tt.mb_per_s),
            ),
            _ => goal(GOAL_READ, Some(l), format!("not measured ({l})"), None),
        });
    }
    g
}

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e3)
}

/// The name of a row's path in the table: the target's label for ours.
fn path_label(r: &Row) -> &str {
    match (r.path, &r.target) {
        (Impl::Ours, Some(t)) => t,
        (p, _) => p.label(),
    }
}

/// The compare table: rows grouped by workload, then ratios, then goals.
pub fn table(doc: &CompareDoc) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Round-trip times in µs, one call in flight, {:.1} s per row",
        doc.duration_s
    );
    for t in &doc.targets {
        let i = &t.info;
        let _ = writeln!(
            s,
            "  {}: {} ({}), peer {}{}",
            t.label,
            i.kind,
            i.socket,
            i.peer,
            i.idle
                .as_ref()
                .map_or(String::new(), |x| format!(", idle {x}"))
        );
    }
    let _ = writeln!(
        s,
        "{:<12} {:<16} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9}",
        "workload", "path", "count", "calls/s", "MB/s", "min", "p50", "p90", "p99", "p99.9", "max"
    );
    for r in &doc.rows {
        let p = &r.round_trip_ns;
        let _ = writeln!(
            s,
            "{:<12} {:<16} {:>8} {:>9.0} {:>8.1} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9}",
            r.workload,
            path_label(r),
            r.count,
            r.calls_per_s,
            r.mb_per_s,
            us(p.min),
            us(p.p50),
            us(p.p90),
            us(p.p99),
            us(p.p99_9),
            us(p.max)
        );
    }
    let _ = writeln!(
        s,
        "\nRatios ours / theirs (latency: lower is better; throughput: higher is better)"
    );
    let _ = writeln!(
        s,
        "{:<12} {:<16} {:<14} {:>8} {:>8} {:>8} {:>8} {:>11}",
        "workload", "ours", "versus", "p50", "p90", "p99", "p99.9", "throughput"
    );
    for r in &doc.ratios {
        let _ = writeln!(
            s,
            "{:<12} {:<16} {:<14} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>11.2}",
            r.workload,
            r.target,
            r.versus.label(),
            r.p50,
            r.p90,
            r.p99,
            r.p99_9,
            r.throughput
        );
    }
    let _ = writeln!(s, "\nGoals (issues 5 and 7)");
    for g in &doc.goals {
        let verdict = match g.met {
            Some(true) => "MET",
            Some(false) => "NOT MET",
            None => "n/a",
        };
        let _ = writeln!(s, "  [{verdict:^7}] {} — {}", g.goal, g.measured);
    }
    for k in &doc.skipped {
        let _ = writeln!(s, "  skipped: {k}");
    }
    s
}

/// Options of `compare`.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// Warm-up per row.
    pub warmup: Duration,
    /// Measured phase per row.
    pub duration: Duration,
    /// Where the libtirpc programs are built.
    pub build_dir: std::path::PathBuf,
    /// Progress bars.
    pub progress: bool,
    /// How long the raw-ring client busy-polls before sleeping.
    pub ring_spin: Duration,
    /// How long the raw-ring echo side busy-polls before parking.
    pub ring_echo_spin: Duration,
    /// The `rpcrdma-bench` binary (for its `ring-echo`, `loopback` and `serve` subcommands).
    pub exe: std::path::PathBuf,
    /// How our apps poll before sleeping (busy or yielding, for how long).
    pub app_wait: WaitPolicy,
    /// How long the loopback harness busy-polls before parking (loopback targets).
    pub harness_spin: Duration,
}

/// How a target is named in `skipped` when it could not be measured.
fn describe(t: &Target) -> String {
    match t {
        Target::Attach { socket, .. } => format!("attach {}", socket.display()),
        Target::Loopback => "loopback".into(),
        Target::Daemons { configs, .. } => format!(
            "rpcrdmad --config {}",
            configs
                .iter()
                .map(|c| c.display().to_string())
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}

/// `label`, or `label #n` when an earlier target already has it.
fn unique_label(label: String, taken: &[OursTarget]) -> String {
    let n = taken
        .iter()
        .filter(|t| t.label == label || t.label.starts_with(&format!("{label} #")))
        .count();
    if n == 0 {
        label
    } else {
        format!("{label} #{}", n + 1)
    }
}

/// Measures every workload on one target (opened here and stopped before returning, so the
/// next target runs alone).
fn measure_target(
    opts: &CompareOptions,
    ro: &RunOptions,
    t0: Instant,
    target: &Target,
    taken: &[OursTarget],
) -> anyhow::Result<(OursTarget, Vec<Row>, Vec<Series>)> {
    let session = target.open(&opts.exe, opts.app_wait, opts.harness_spin)?;
    let (mut client, peer, name) =
        crate::attach(&session.socket, &session.info.peer, opts.app_wait)?;
    let mut info = session.info.clone();
    info.peer = name;
    let label = unique_label(info.label(), taken);
    let (mut rows, mut hists) = (Vec::new(), Vec::new());
    for (w, case, _, _) in workloads() {
        let r = run::run_case(&mut client, peer, case, ro, t0)?;
        if r.errors > 0 {
            anyhow::bail!(
                "{label} {w}: {} calls failed: {}",
                r.errors,
                r.first_error.unwrap_or_default()
            );
        }
        rows.push(row_of(w, Impl::Ours, Some(&label), &r));
        hists.push((format!("{label} {w}"), r.hist));
    }
    drop(client);
    drop(session);
    Ok((OursTarget { label, info }, rows, hists))
}

/// A named round-trip histogram for the plot.
pub type Series = (String, Histogram<u64>);

/// Runs everything: the raw ring, libtirpc, then each of `targets` in turn (each started,
/// measured and stopped before the next). A target that cannot be measured is listed under
/// `skipped`; the run fails only when none could be. `env.target` becomes the first target's.
pub fn compare(
    opts: &CompareOptions,
    mut env: Environment,
    targets: &[Target],
) -> anyhow::Result<(CompareDoc, Vec<Series>)> {
    let ro = RunOptions {
        warmup: opts.warmup,
        stop: Stop::Duration(opts.duration),
        in_flight: 1,
        think: Duration::ZERO,
        rate: None,
        reply: ReplyBuffer::Sized,
        progress: opts.progress,
    };
    let t0 = Instant::now();
    let mut rows = Vec::new();
    let mut hists = Vec::new();
    let mut skipped = Vec::new();
    let wl = workloads();

    // 1. The raw ring.
    {
        let sock = crate::target::temp_socket("ring");
        let mut child = crate::target::spawn_ready(
            std::process::Command::new(&opts.exe)
                .arg("ring-echo")
                .arg(&sock)
                .arg("--spin-us")
                .arg(opts.ring_echo_spin.as_micros().to_string()),
            "ring-echo",
        )?;
        let res = (|| -> anyhow::Result<CaseResult> {
            let mut c = Client::connect(&sock).map_err(|e| anyhow::anyhow!("ring-echo: {e}"))?;
            c.set_spin(opts.ring_spin);
            // The limit is the best the host allows: keep the slice with the lowest p50.
            let mut best: Option<CaseResult> = None;
            for i in 0..RING_SLICES {
                let o = RunOptions {
                    warmup: if i == 0 { opts.warmup } else { Duration::ZERO },
                    stop: Stop::Duration(opts.duration / RING_SLICES),
                    ..ro.clone()
                };
                let r = run::run_case(&mut c, 0, wl[0].1, &o, t0)?;
                let p50 = |r: &CaseResult| r.hist.value_at_quantile(0.5);
                if best.as_ref().is_none_or(|b| p50(&r) < p50(b)) {
                    best = Some(r);
                }
            }
            best.ok_or_else(|| anyhow::anyhow!("no raw-ring slice ran"))
        })();
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_file(&sock);
        let r = res?;
        rows.push(row_of("NULL", Impl::RawRing, None, &r));
        hists.push(("raw ring NULL".to_string(), r.hist));
    }

    // 2. libtirpc.
    let tirpc = crate::tirpc::build(&opts.build_dir).and_then(|t| {
        let srv = t.start()?;
        Ok((t, srv))
    });
    match tirpc {
        Ok((t, srv)) => {
            for (label, _, proc_, size) in &wl {
                let samples = t
                    .measure(&srv, proc_, *size, opts.warmup, opts.duration)
                    .with_context(|| format!("libtirpc {label}"))?;
                let (row, h) = row_of_samples(label, *size, &samples, opts.duration);
                rows.push(row);
                hists.push((format!("libtirpc {label}"), h));
            }
        }
        Err(e) => skipped.push(format!("libtirpc: {e:#}")),
    }

    // 3. Ours, one target at a time.
    let mut ours = Vec::new();
    let mut first_err = None;
    for t in targets {
        match measure_target(opts, &ro, t0, t, &ours) {
            Ok((target, r, h)) => {
                ours.push(target);
                rows.extend(r);
                hists.extend(h);
            }
            Err(e) => {
                skipped.push(format!("{}: {e:#}", describe(t)));
                first_err.get_or_insert(e);
            }
        }
    }
    if ours.is_empty() {
        return Err(first_err.unwrap_or_else(|| anyhow::anyhow!("no target to compare")));
    }
    env.target = ours[0].info.clone();

    let mut ratios = Vec::new();
    for (label, _, _, _) in &wl {
        for t in &ours {
            if let Some(o) = find_ours(&rows, label, &t.label) {
                for p in [Impl::RawRing, Impl::Libtirpc] {
                    if let Some(theirs) = find(&rows, label, p) {
                        ratios.push(ratio(o, theirs));
                    }
                }
            }
        }
    }
    let goals = goals(&rows, &ours);
    rows.sort_by_key(|r| wl.iter().position(|w| w.0 == r.workload));
    Ok((
        CompareDoc {
            schema: SCHEMA.into(),
            environment: env,
            targets: ours,
            duration_s: opts.duration.as_secs_f64(),
            rows,
            ratios,
            goals,
            skipped,
            svg: None,
        },
        hists,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::TargetInfo;

    fn row(w: &str, path: Impl, p50: u64, mb: f64) -> Row {
        Row {
            workload: w.into(),
            path,
            target: (path == Impl::Ours).then(|| "rpcrdmad soft".to_string()),
            case: None,
            count: 10,
            calls_per_s: 100.0,
            mb_per_s: mb,
            round_trip_ns: Percentiles {
                p50,
                p90: p50 * 2,
                p99: p50 * 4,
                p99_9: p50 * 8,
                ..Percentiles::default()
            },
        }
    }

    fn ours_row(target: &str, w: &str, p50: u64, mb: f64) -> Row {
        Row {
            target: Some(target.into()),
            ..row(w, Impl::Ours, p50, mb)
        }
    }

    fn target(kind: &str, provider: Option<&str>) -> OursTarget {
        let info = TargetInfo {
            kind: kind.into(),
            provider: provider.map(str::to_string),
            ..TargetInfo::default()
        };
        OursTarget {
            label: info.label(),
            info,
        }
    }

    #[test]
    fn ratios_divide_ours_by_theirs_per_percentile() {
        let r = ratio(
            &row("READ 1 MiB", Impl::Ours, 300, 500.0),
            &row("READ 1 MiB", Impl::Libtirpc, 100, 1000.0),
        );
        assert_eq!((r.p50, r.p90, r.p99, r.p99_9), (3.0, 3.0, 3.0, 3.0));
        assert_eq!(r.throughput, 0.5);
        assert_eq!(r.versus, Impl::Libtirpc);
        assert_eq!(r.target, "rpcrdmad soft");
        let null = ratio(
            &row("NULL", Impl::Ours, 10, 0.0),
            &row("NULL", Impl::RawRing, 0, 0.0),
        );
        assert!(
            null.p50.is_nan(),
            "division by a zero percentile is not a number, not infinity"
        );
        assert_eq!(null.throughput, 1.0, "calls/s when there is no payload");
    }

    #[test]
    fn goals_are_met_not_met_or_not_measured() {
        let rows = vec![
            row("NULL", Impl::RawRing, 1_000, 0.0),
            row("NULL", Impl::Ours, 3_000, 0.0),
            row("NULL", Impl::Libtirpc, 10_000, 0.0),
            row("READ 1 MiB", Impl::Ours, 1, 900.0),
            row("READ 1 MiB", Impl::Libtirpc, 1, 1000.0),
        ];
        let soft = [target("daemons", Some("soft"))];
        let g = goals(&rows, &soft);
        assert_eq!(g.len(), 3);
        assert_eq!(g[0].met, Some(true), "3.00x is within 3x");
        assert_eq!(g[1].met, Some(true), "0.30x is within 0.7x");
        assert_eq!(g[2].met, Some(false), "0.9 GB/s < 1.0 GB/s");
        assert!(g
            .iter()
            .all(|g| g.target.as_deref() == Some("rpcrdmad soft")));
        let lb = [target("loopback", None)];
        let l = goals(&rows, &lb);
        assert_eq!(l[0].met, None, "no loopback rows");
        assert_eq!(l[1].met, None, "the soft-iWARP goal needs a soft daemon");
        assert!(l[1].measured.contains("loopback"));
        let inverted = goals(
            &[
                row("NULL", Impl::RawRing, 5_000, 0.0),
                row("NULL", Impl::Ours, 3_000, 0.0),
            ],
            &soft,
        );
        assert_eq!(
            inverted[0].met, None,
            "a ring slower than our path is a failed measurement"
        );
        assert!(inverted[0].measured.contains("rerun"));
        let none = goals(&rows[2..3], &soft);
        assert_eq!(none[0].met, None);
        assert_eq!(none[2].met, None);
    }

    #[test]
    fn goals_are_judged_per_target_and_soft_only_on_soft_daemons() {
        let rows = vec![
            row("NULL", Impl::RawRing, 1_000, 0.0),
            row("NULL", Impl::Libtirpc, 10_000, 0.0),
            row("READ 1 MiB", Impl::Libtirpc, 1, 1000.0),
            ours_row("rpcrdmad soft", "NULL", 5_000, 0.0),
            ours_row("rpcrdmad soft", "READ 1 MiB", 1, 1200.0),
            ours_row("rpcrdmad mem", "NULL", 2_000, 0.0),
            ours_row("rpcrdmad mem", "READ 1 MiB", 1, 800.0),
        ];
        let ts = [
            target("daemons", Some("soft")),
            target("daemons", Some("mem")),
        ];
        let g = goals(&rows, &ts);
        let verdict = |goal: &str, t: &str| {
            g.iter()
                .find(|x| x.goal == goal && x.target.as_deref() == Some(t))
                .unwrap_or_else(|| panic!("{goal} for {t}: {g:#?}"))
                .met
        };
        assert_eq!(verdict(GOAL_RING, "rpcrdmad soft"), Some(false), "5x");
        assert_eq!(verdict(GOAL_RING, "rpcrdmad mem"), Some(true), "2x");
        assert_eq!(verdict(GOAL_SOFT, "rpcrdmad soft"), Some(true), "0.5x");
        assert!(
            !g.iter()
                .any(|x| x.goal == GOAL_SOFT && x.target.as_deref() == Some("rpcrdmad mem")),
            "the soft-iWARP goal is not judged on the mem provider"
        );
        assert_eq!(verdict(GOAL_READ, "rpcrdmad soft"), Some(true));
        assert_eq!(verdict(GOAL_READ, "rpcrdmad mem"), Some(false));
        assert_eq!(g.len(), 5);
    }

    #[test]
    fn equal_target_labels_are_numbered() {
        let mut taken = vec![target("daemons", Some("soft"))];
        let l = unique_label("rpcrdmad soft".into(), &taken);
        assert_eq!(l, "rpcrdmad soft #2");
        taken.push(OursTarget {
            label: l,
            info: TargetInfo::default(),
        });
        assert_eq!(
            unique_label("rpcrdmad soft".into(), &taken),
            "rpcrdmad soft #3"
        );
        assert_eq!(unique_label("rpcrdmad mem".into(), &taken), "rpcrdmad mem");
    }

    #[test]
    fn the_table_prints_rows_ratios_and_goal_verdicts() {
        let rows = vec![
            row("NULL", Impl::RawRing, 1_000, 0.0),
            row("NULL", Impl::Ours, 4_000, 0.0),
        ];
        let ts = vec![target("daemons", Some("soft"))];
        let doc = CompareDoc {
            schema: SCHEMA.into(),
            environment: Environment::here(Default::default(), 0, None),
            duration_s: 1.0,
            ratios: vec![ratio(&rows[1], &rows[0])],
            goals: goals(&rows, &ts),
            targets: ts,
            rows,
            skipped: vec!["libtirpc: no rpcgen".into()],
            svg: None,
        };
        let t = table(&doc);
        assert!(t.contains("NULL         raw ring"), "{t}");
        assert!(t.contains("NULL         rpcrdmad soft"), "{t}");
        assert!(t.contains("    4.00"), "{t}");
        assert!(t.contains("[NOT MET] app<->app NULL p50 <= 3x the raw ring — 4.00x"));
        assert!(t.contains("[  n/a  ]"));
        assert!(t.contains("skipped: libtirpc: no rpcgen"));
    }
}
