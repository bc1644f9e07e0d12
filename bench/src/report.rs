//! Output of a run: the table, the versioned JSON document (`SCHEMA.md`), the `.hlog` interval log and the
//! SVG percentile plot.

use crate::run::{CaseResult, RunOptions, Stop};
use crate::target::TargetInfo;
use crate::workload::ReplyBuffer;
use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
use hdrhistogram::serialization::V2DeflateSerializer;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;

/// The JSON document's schema identifier; bump the number on any incompatible change.
pub const SCHEMA: &str = "rpcrdma-bench/run/1";

/// Where the run happened.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Environment {
    /// The bench's version.
    pub tool_version: String,
    /// `uname -n`.
    pub host: String,
    /// `uname -sr`.
    pub kernel: String,
    /// CPUs this process may run on.
    pub cores: u32,
    /// How long apps poll before sleeping (µs).
    pub app_spin_us: u64,
    /// Whether apps yield the CPU between those polls (`--yield-us`) instead of busy-waiting.
    #[serde(default)]
    pub app_yield: bool,
    /// How long the loopback harness busy-polls before parking (µs; loopback targets only).
    pub harness_spin_us: Option<u64>,
    /// The target.
    pub target: TargetInfo,
}

impl Environment {
    /// Reads this host's facts.
    pub fn here(target: TargetInfo, app_spin_us: u64, harness_spin_us: Option<u64>) -> Self {
        let u = rustix::system::uname();
        Environment {
            tool_version: env!("CARGO_PKG_VERSION").into(),
            host: u.nodename().to_string_lossy().into_owned(),
            kernel: format!(
                "{} {}",
                u.sysname().to_string_lossy(),
                u.release().to_string_lossy()
            ),
            cores: std::thread::available_parallelism().map_or(0, |n| n.get() as u32),
            app_spin_us,
            app_yield: false,
            harness_spin_us,
            target,
        }
    }
}

/// How the cases were driven.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Settings {
    /// Warm-up per case (s).
    pub warmup_s: f64,
    /// Measured phase per case (s), when bounded by time.
    pub duration_s: Option<f64>,
    /// Measured calls per case, when bounded by count.
    pub count: Option<u64>,
    /// Calls outstanding.
    pub in_flight: u32,
    /// Pause before each call takes a freed slot (µs; 0: none).
    #[serde(default)]
    pub think_us: u64,
    /// Open loop: calls offered per second (`None`: closed loop).
    #[serde(default)]
    pub rate_per_s: Option<f64>,
    /// How reply buffers were sized: `sized`, `default` or a number of bytes.
    #[serde(default = "sized")]
    pub reply_buffer: String,
}

fn sized() -> String {
    ReplyBuffer::Sized.to_string()
}

impl Settings {
    /// From the run options.
    pub fn from(o: &RunOptions) -> Self {
        let (duration_s, count) = match o.stop {
            Stop::Duration(d) => (Some(d.as_secs_f64()), None),
            Stop::Count(n) => (None, Some(n)),
        };
        Settings {
            warmup_s: o.warmup.as_secs_f64(),
            duration_s,
            count,
            in_flight: o.in_flight as u32,
            think_us: u64::try_from(o.think.as_micros()).unwrap_or(u64::MAX),
            rate_per_s: o.rate,
            reply_buffer: o.reply.to_string(),
        }
    }
}

/// Round-trip percentiles of one case, in nanoseconds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Default)]
pub struct Percentiles {
    /// Smallest.
    pub min: u64,
    /// Mean.
    pub mean: f64,
    /// 50th percentile.
    pub p50: u64,
    /// 90th.
    pub p90: u64,
    /// 99th.
    pub p99: u64,
    /// 99.9th.
    pub p99_9: u64,
    /// 99.99th.
    pub p99_99: u64,
    /// Largest.
    pub max: u64,
}

impl Percentiles {
    /// Reads them off a histogram (all zero when it is empty).
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            min: h.min(),
            mean: h.mean(),
            p50: h.value_at_quantile(0.5),
            p90: h.value_at_quantile(0.9),
            p99: h.value_at_quantile(0.99),
            p99_9: h.value_at_quantile(0.999),
            p99_99: h.value_at_quantile(0.9999),
            max: h.max(),
        }
    }
}

/// One case in the JSON document.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CaseSummary {
    /// `proc/mode/size`.
    pub name: String,
    /// Procedure name (upper case).
    pub procedure: String,
    /// Transfer mode.
    pub mode: String,
    /// Payload bytes (µs for SLEEP).
    pub size: u32,
    /// Calls outstanding.
    pub in_flight: u32,
    /// Whether latencies are coordinated-omission corrected.
    pub co_corrected: bool,
    /// The correction's expected interval (ns).
    pub expected_interval_ns: u64,
    /// Open loop: calls offered per second (`None`: closed loop).
    #[serde(default)]
    pub offered_per_s: Option<f64>,
    /// Open loop: measured calls that found every slot busy when due and went out late.
    #[serde(default)]
    pub late: u64,
    /// Open loop: how late the calls that found a slot free went out after their due time
    /// (the generator's own delay; ns, 99th percentile and largest).
    #[serde(default)]
    pub send_lag_p99_ns: Option<u64>,
    /// See `send_lag_p99_ns`.
    #[serde(default)]
    pub send_lag_max_ns: Option<u64>,
    /// Calls completed intact in the measured phase.
    pub count: u64,
    /// Failed calls or wrong data.
    pub errors: u64,
    /// The first failure.
    pub first_error: Option<String>,
    /// Length of the measured phase (s).
    pub elapsed_s: f64,
    /// Calls per second.
    pub calls_per_s: f64,
    /// Payload MB (10^6 B) per second.
    pub mb_per_s: f64,
    /// Round trips (ns).
    pub round_trip_ns: Percentiles,
}

impl CaseSummary {
    /// Summarises a result.
    pub fn of(r: &CaseResult) -> Self {
        let lag = r.send_lag.as_ref().filter(|h| !h.is_empty());
        CaseSummary {
            name: r.case.name(),
            procedure: r.case.proc_.name().to_uppercase(),
            mode: r.case.mode.name().into(),
            size: r.case.size,
            in_flight: r.in_flight as u32,
            co_corrected: r.co_corrected,
            expected_interval_ns: r.expected_interval_ns,
            offered_per_s: r.offered_per_s,
            late: r.late,
            send_lag_p99_ns: lag.map(|h| h.value_at_quantile(0.99)),
            send_lag_max_ns: lag.map(|h| h.max()),
            count: r.count,
            errors: r.errors,
            first_error: r.first_error.clone(),
            elapsed_s: r.elapsed.as_secs_f64(),
            calls_per_s: r.rate(),
            mb_per_s: r.mb_per_s(),
            round_trip_ns: Percentiles::of(&r.hist),
        }
    }
}

/// The files a run wrote.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Files {
    /// The `.hlog` interval log.
    pub hlog: Option<String>,
    /// The SVG percentile plot.
    pub svg: Option<String>,
}

/// The whole JSON document of a run (`SCHEMA.md`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunDoc {
    /// [`SCHEMA`].
    pub schema: String,
    /// Start of the run, milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// The command line.
    pub command: Vec<String>,
    /// Where it ran.
    pub environment: Environment,
    /// How it ran.
    pub settings: Settings,
    /// The cases, in run order.
    pub cases: Vec<CaseSummary>,
    /// The files written.
    pub files: Files,
}

fn us(ns: u64) -> String {
    let v = ns as f64 / 1e3;
    if v < 100.0 {
        format!("{v:.2}")
    } else if v < 10_000.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

/// The per-case table (times are round trips in µs).
pub fn table(cases: &[CaseSummary]) -> String {
    let mut s = String::new();
    let in_flight = cases.first().map_or(1, |c| c.in_flight);
    let offered = cases.first().and_then(|c| c.offered_per_s);
    let _ = writeln!(
        s,
        "{}",
        match offered {
            Some(rate) => format!(
                "Round-trip times in µs (call due -> reply received), open loop: {rate:.0} calls/s offered, at most {in_flight} in flight"
            ),
            None if in_flight > 1 => format!(
                "Round-trip times in µs (call submitted -> reply received), {in_flight} calls in flight, coordinated-omission corrected"
            ),
            None => "Round-trip times in µs (call submitted -> reply received), one call in flight".into(),
        }
    );
    let w = cases.iter().map(|c| c.name.len()).max().unwrap_or(4).max(4);
    let head = [
        "count", "calls/s", "MB/s", "min", "p50", "p90", "p99", "p99.9", "p99.99", "max",
    ];
    let _ = write!(s, "{:<w$}", "case");
    for h in head {
        let _ = write!(s, " {h:>9}");
    }
    s.push('\n');
    for c in cases {
        let p = &c.round_trip_ns;
        let _ = write!(
            s,
            "{:<w$} {:>9} {:>9.0} {:>9.1}",
            c.name, c.count, c.calls_per_s, c.mb_per_s
        );
        for v in [p.min, p.p50, p.p90, p.p99, p.p99_9, p.p99_99, p.max] {
            let _ = write!(s, " {:>9}", us(v));
        }
        if c.errors > 0 {
            let _ = write!(s, "  {} ERRORS", c.errors);
        }
        if c.late > 0 {
            let _ = write!(s, "  {} late", c.late);
        }
        s.push('\n');
    }
    for c in cases {
        if let (Some(p99), Some(max)) = (c.send_lag_p99_ns, c.send_lag_max_ns) {
            let _ = writeln!(
                s,
                "{}: {} calls found every slot busy when due (late); the others went out {} µs (p99), {} µs (max) after their due time",
                c.name,
                c.late,
                us(p99),
                us(max)
            );
        }
    }
    s
}

/// Writes every case's interval histograms as an HdrHistogram interval log (tag = case name, values in ns,
/// max column in ms).
pub fn write_hlog(
    path: &Path,
    started: std::time::SystemTime,
    results: &[CaseResult],
) -> anyhow::Result<()> {
    let mut out = Vec::new();
    let mut ser = V2DeflateSerializer::new();
    {
        let mut w = IntervalLogWriterBuilder::new()
            .add_comment("rpcrdma-bench round trips in nanoseconds, tagged by case")
            .with_start_time(started)
            .with_base_time(started)
            .with_max_value_divisor(1e6)
            .begin_log_with(&mut out, &mut ser)?;
        for r in results {
            let name = r.case.name();
            for i in &r.intervals {
                w.write_histogram(&i.hist, i.start, i.length, Tag::new(&name))
                    .map_err(|e| anyhow::anyhow!("hlog: {e:?}"))?;
            }
        }
    }
    std::fs::write(path, out)?;
    Ok(())
}

const COLOURS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Percentile-distribution points `(x = log10(1/(1-q)), round trip ns)` up to the histogram's resolution.
pub fn curve(h: &Histogram<u64>) -> Vec<(f64, u64)> {
    if h.is_empty() {
        return Vec::new();
    }
    let x_max = (h.len() as f64).log10().clamp(0.0, 6.0);
    let mut v = Vec::new();
    let mut x = 0.0f64;
    while x <= x_max + 1e-9 {
        let q = 1.0 - 10f64.powf(-x);
        v.push((x, h.value_at_quantile(q)));
        x += 0.05;
    }
    v.push((x_max, h.max()));
    v
}

/// An SVG plot of round trip by percentile: x log-scaled by 1/(1−q) (0 %, 90 %, 99 %, …), y log-scaled in
/// µs, one line per case.
pub fn svg(title: &str, series: &[(String, &Histogram<u64>)]) -> String {
    let (w, h, l, r, t, b) = (900.0, 560.0, 70.0, 250.0, 40.0, 50.0);
    let (pw, ph) = (w - l - r, h - t - b);
    let curves: Vec<(&String, Vec<(f64, u64)>)> =
        series.iter().map(|(n, hist)| (n, curve(hist))).collect();
    let all = curves.iter().flat_map(|(_, c)| c.iter());
    let (lo, hi) = all.fold((u64::MAX, 1u64), |(lo, hi), (_, v)| {
        (lo.min(*v), hi.max(*v))
    });
    let y0 = ((lo.max(1) as f64 / 1e3).log10()).floor();
    let y1 = ((hi as f64 / 1e3).log10()).ceil().max(y0 + 1.0);
    let x1 = curves
        .iter()
        .flat_map(|(_, c)| c.last())
        .map(|p| p.0.ceil())
        .fold(1.0f64, f64::max);
    let px = |x: f64| l + x / x1 * pw;
    let py = |ns: u64| t + ph - ((ns.max(1) as f64 / 1e3).log10() - y0) / (y1 - y0) * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="{w}" height="{h}" fill="white"/><text x="{l}" y="24" font-size="15">{}</text>"#,
        esc(title)
    );
    let labels = ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%", "99.9999%"];
    for i in 0..=(x1 as usize) {
        let x = px(i as f64);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{t}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            t + ph,
            t + ph + 18.0,
            labels.get(i).copied().unwrap_or("")
        );
    }
    let mut d = y0;
    while d <= y1 + 1e-9 {
        let ns = (10f64.powf(d) * 1e3).round() as u64;
        let y = py(ns);
        let label = if d >= 0.0 {
            format!("{}", 10f64.powf(d).round())
        } else {
            format!("{:.*}", (-d) as usize, 10f64.powf(d))
        };
        let _ = writeln!(
            s,
            r##"<line x1="{l}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            l + pw,
            l - 6.0,
            y + 4.0,
            label
        );
        d += 1.0;
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">percentile</text><text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">round trip (µs, log scale)</text>"#,
        l + pw / 2.0,
        h - 10.0,
        t + ph / 2.0
    );
    for (i, (name, c)) in curves.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let pts: Vec<String> = c
            .iter()
            .map(|(x, v)| format!("{:.1},{:.1}", px(*x), py(*v)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/>"#,
            pts.join(" ")
        );
        let ly = t + 10.0 + i as f64 * 18.0;
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{colour}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            w - r + 15.0,
            w - r + 35.0,
            w - r + 40.0,
            ly + 4.0,
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::Case;
    use crate::run::{histogram, CaseResult, Interval};
    use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
    use hdrhistogram::serialization::Deserializer;
    use std::time::{Duration, SystemTime};

    fn hist_1_to(n: u64) -> Histogram<u64> {
        let mut h = histogram();
        for v in 1..=n {
            h.record(v).unwrap();
        }
        h
    }

    fn summary(name: &str, p50_ns: u64, errors: u64, in_flight: u32) -> CaseSummary {
        CaseSummary {
            name: name.into(),
            procedure: "ECHO".into(),
            mode: "inline".into(),
            size: 64,
            in_flight,
            co_corrected: in_flight > 1,
            expected_interval_ns: 0,
            offered_per_s: None,
            late: 0,
            send_lag_p99_ns: None,
            send_lag_max_ns: None,
            count: 1234,
            errors,
            first_error: None,
            elapsed_s: 1.0,
            calls_per_s: 1234.0,
            mb_per_s: 0.079,
            round_trip_ns: Percentiles {
                min: 1_000,
                mean: 2_000.0,
                p50: p50_ns,
                p90: 3_000,
                p99: 45_678,
                p99_9: 123_456,
                p99_99: 12_345_678,
                max: 20_000_000,
            },
        }
    }

    #[test]
    fn percentiles_are_read_off_the_histogram_and_zero_when_empty() {
        let p = Percentiles::of(&hist_1_to(1000));
        assert_eq!((p.min, p.p50, p.p90, p.p99), (1, 500, 900, 990));
        assert_eq!((p.p99_9, p.p99_99, p.max), (999, 1000, 1000));
        assert!((p.mean - 500.5).abs() < 0.01);
        assert_eq!(Percentiles::of(&histogram()), Percentiles::default());
    }

    #[test]
    fn table_has_a_row_per_case_in_microseconds_and_says_they_are_round_trips() {
        let t = table(&[
            summary("echo/inline/64", 1_500, 0, 1),
            summary("null/inline/0", 250_000, 3, 1),
        ]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("Round-trip times in µs"));
        assert!(lines[0].contains("one call in flight"));
        let head: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            head,
            [
                "case", "count", "calls/s", "MB/s", "min", "p50", "p90", "p99", "p99.9", "p99.99",
                "max"
            ]
        );
        let row: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            row,
            [
                "echo/inline/64",
                "1234",
                "1234",
                "0.1",
                "1.00",
                "1.50",
                "3.00",
                "45.68",
                "123.5",
                "12346",
                "20000"
            ]
        );
        assert!(lines[3].starts_with("null/inline/0"));
        assert!(lines[3].contains("250.0"));
        assert!(lines[3].ends_with("3 ERRORS"));
        assert!(!lines[2].contains("ERRORS"));
        assert_eq!(lines.len(), 4);
    }

    #[test]
    fn table_header_says_when_several_calls_are_in_flight_and_corrected() {
        let t = table(&[summary("null/inline/0", 1, 0, 16)]);
        assert!(t
            .lines()
            .next()
            .unwrap()
            .contains("16 calls in flight, coordinated-omission corrected"));
    }

    #[test]
    fn table_says_open_loop_with_its_offered_rate_and_marks_late_calls() {
        let open = CaseSummary {
            offered_per_s: Some(50_000.0),
            late: 7,
            send_lag_p99_ns: Some(12_000),
            send_lag_max_ns: Some(2_500_000),
            co_corrected: false,
            ..summary("echo/inline/64", 1, 0, 32)
        };
        let t = table(&[open]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].contains("call due -> reply received")
                && lines[0].contains("open loop: 50000 calls/s offered, at most 32 in flight"),
            "{t}"
        );
        assert!(lines[2].ends_with("  7 late"), "{t}");
        assert_eq!(
            lines[3],
            "echo/inline/64: 7 calls found every slot busy when due (late); the others went out 12.00 µs (p99), 2500.0 µs (max) after their due time"
        );
        // A closed loop has no such line.
        assert_eq!(
            table(&[summary("null/inline/0", 1, 0, 1)]).lines().count(),
            3
        );
    }

    #[test]
    fn curve_is_non_decreasing_and_ends_at_the_histograms_resolution() {
        let h = hist_1_to(10_000);
        let c = curve(&h);
        assert_eq!(c.first().unwrap(), &(0.0, 1));
        assert!(c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        let last = c.last().unwrap();
        assert_eq!(last.0, 4.0);
        assert!(h.equivalent(last.1, 10_000), "{}", last.1);
        assert!(curve(&histogram()).is_empty());
    }

    #[test]
    fn svg_has_one_line_and_one_legend_entry_per_case_with_escaped_names() {
        let (a, b) = (hist_1_to(100), hist_1_to(5000));
        let s = svg(
            "t<1>",
            &[
                ("a<b".to_string(), &a),
                ("read/write-chunk/1MiB".to_string(), &b),
            ],
        );
        assert!(s.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<polyline").count(), 2);
        assert!(s.contains(">a&lt;b</text>") && !s.contains("a<b"));
        assert!(s.contains("t&lt;1&gt;"));
        for l in ["0%", "90%", "99%", "99.9%"] {
            assert!(s.contains(&format!(">{l}</text>")), "{l}");
        }
        assert!(!s.contains("NaN") && !s.contains("inf"));
    }

    #[test]
    fn hlog_holds_every_interval_tagged_by_case_and_decodes_to_the_same_counts() {
        let case: Case = "echo/inline/64".parse().unwrap();
        let mk = |n| Interval {
            start: Duration::from_secs(n),
            length: Duration::from_secs(1),
            hist: hist_1_to(100 * n),
        };
        let r = CaseResult {
            case,
            in_flight: 1,
            co_corrected: false,
            expected_interval_ns: 0,
            offered_per_s: None,
            late: 0,
            send_lag: None,
            count: 300,
            errors: 0,
            first_error: None,
            elapsed: Duration::from_secs(2),
            hist: hist_1_to(300),
            intervals: vec![mk(1), mk(2)],
        };
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.hlog");
        write_hlog(&p, SystemTime::UNIX_EPOCH + Duration::from_secs(1000), &[r]).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        let mut seen = Vec::new();
        for e in IntervalLogIterator::new(&bytes) {
            if let Ok(LogEntry::Interval(i)) = e {
                assert_eq!(i.tag().unwrap().as_str(), "echo/inline/64");
                let raw = base64_decode(i.encoded_histogram());
                let h: Histogram<u64> = Deserializer::new()
                    .deserialize(&mut std::io::Cursor::new(raw))
                    .unwrap();
                seen.push((i.start_timestamp().as_secs(), h.len()));
            }
        }
        assert_eq!(seen, vec![(1, 100), (2, 200)]);
    }

    /// Standard base64 (the `.hlog` encoding), decoded here to keep it out of the dependencies.
    fn base64_decode(s: &str) -> Vec<u8> {
        let val = |c: u8| match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            _ => 63,
        };
        let b: Vec<u8> = s.bytes().filter(|c| *c != b'=').map(val).collect();
        let mut out = Vec::new();
        for ch in b.chunks(4) {
            let mut n = 0u32;
            for (i, v) in ch.iter().enumerate() {
                n |= u32::from(*v) << (18 - 6 * i);
            }
            out.extend_from_slice(&n.to_be_bytes()[1..ch.len()]);
        }
        out
    }
}
