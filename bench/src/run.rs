//! The closed-loop driver: warm-up, then a duration or a call count, with `in_flight` calls outstanding,
//! recording every round trip in an HdrHistogram (one per case, plus one per one-second interval).

use crate::case::Case;
use crate::workload::Workload;
use anyhow::bail;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use rpcrdma_shm::client::{Client, Error, Ticket};
use std::time::{Duration, Instant};

/// Highest recordable round trip (ns): one minute.
pub const MAX_NS: u64 = 60_000_000_000;
/// Length of one `.hlog` interval.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// How long one call may take before the case is abandoned.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// When a case's measured phase ends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stop {
    /// After this long.
    Duration(Duration),
    /// After this many calls have finished (intact or not).
    Count(u64),
}

/// How each case is driven.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Warm-up before measuring (not recorded).
    pub warmup: Duration,
    /// End of the measured phase.
    pub stop: Stop,
    /// Calls outstanding (1: latency mode; more: throughput mode, recorded with coordinated-omission
    /// correction).
    pub in_flight: usize,
    /// Pause between a reply and the call that takes its slot (not part of the round trip):
    /// calls then reach a daemon that has gone idle, parked or asleep, as sporadic calls do.
    pub think: Duration,
    /// Draw a progress bar (only shown on a terminal).
    pub progress: bool,
}

/// One recorded interval of a case.
#[derive(Debug, Clone)]
pub struct Interval {
    /// Start, from the start of the run.
    pub start: Duration,
    /// Length.
    pub length: Duration,
    /// The round trips recorded in it (ns).
    pub hist: Histogram<u64>,
}

/// What one case measured.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// The case.
    pub case: Case,
    /// Calls outstanding.
    pub in_flight: usize,
    /// Whether the histogram holds coordinated-omission-corrected values.
    pub co_corrected: bool,
    /// The expected interval used for the correction (ns; 0 when not corrected).
    pub expected_interval_ns: u64,
    /// Calls completed with intact data in the measured phase.
    pub count: u64,
    /// Calls that failed or returned wrong data (warm-up included).
    pub errors: u64,
    /// The first failure, if any.
    pub first_error: Option<String>,
    /// Length of the measured phase.
    pub elapsed: Duration,
    /// Round trips in ns (corrected in throughput mode).
    pub hist: Histogram<u64>,
    /// One-second interval histograms, for the `.hlog`.
    pub intervals: Vec<Interval>,
}

impl CaseResult {
    /// Completed calls per second.
    pub fn rate(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.count as f64 / s
        } else {
            0.0
        }
    }

    /// Payload megabytes (10^6 B) per second, payload counted once per call.
    pub fn mb_per_s(&self) -> f64 {
        self.rate() * self.case.proc_.payload(self.case.size) as f64 / 1e6
    }
}

/// A new histogram with our bounds (1 ns .. one minute, 3 significant digits).
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_NS, 3).expect("constant bounds are valid")
}

struct Loop<'a> {
    client: &'a mut Client,
    peer: u32,
    w: &'a Workload,
    slots: Vec<Option<(Ticket, Instant, usize)>>,
    next: usize,
    think: Duration,
    errors: u64,
    first_error: Option<String>,
}

impl Loop<'_> {
    fn issue(&mut self, i: usize) -> anyhow::Result<()> {
        let k = self.next;
        self.next = self.next.wrapping_add(1);
        let t0 = Instant::now();
        match self.w.submit(self.client, self.peer, k) {
            Ok(t) => self.slots[i] = Some((t, t0, k)),
            Err(Error::ArenaFull) => bail!(
                "{}: arena full with {} calls in flight (the daemon's arena is too small for this case)",
                self.w.case(),
                self.slots.len()
            ),
            Err(e) => bail!("{}: submit: {e}", self.w.case()),
        }
        Ok(())
    }

    /// Waits for one call; returns its round trip in ns if it came back intact.
    fn complete(&mut self) -> anyhow::Result<Option<u64>> {
        let (t, res) = match self.client.wait_any(Some(CALL_TIMEOUT)) {
            Ok(r) => r,
            Err(e) => bail!("{}: waiting for a reply: {e}", self.w.case()),
        };
        let now = Instant::now();
        let Some(i) = self
            .slots
            .iter()
            .position(|s| s.is_some_and(|(st, _, _)| st == t))
        else {
            bail!("{}: a reply for a call never made", self.w.case());
        };
        let Some((_, t0, k)) = self.slots[i].take() else {
            bail!("{}: slot vanished", self.w.case());
        };
        let outcome = match res {
            Ok(r) => self.w.check(k, &r),
            Err(e) => Err(format!("{}: {e}", self.w.case())),
        };
        if !self.think.is_zero() {
            std::thread::sleep(self.think);
        }
        self.issue(i)?;
        match outcome {
            Ok(()) => Ok(Some(
                (now - t0).as_nanos().clamp(1, u128::from(MAX_NS)) as u64
            )),
            Err(msg) => {
                self.errors += 1;
                self.first_error.get_or_insert(msg);
                Ok(None)
            }
        }
    }

    fn drain(&mut self) {
        while self.slots.iter().any(Option::is_some) {
            match self.client.wait_any(Some(CALL_TIMEOUT)) {
                Ok((t, _)) => {
                    if let Some(s) = self
                        .slots
                        .iter_mut()
                        .find(|s| s.is_some_and(|(st, _, _)| st == t))
                    {
                        *s = None;
                    }
                }
                Err(_) => break,
            }
        }
    }
}

fn bar(opts: &RunOptions, case: &Case) -> ProgressBar {
    if !opts.progress {
        return ProgressBar::hidden();
    }
    let (len, unit) = match opts.stop {
        Stop::Count(n) => (n, "calls"),
        Stop::Duration(d) => (d.as_millis() as u64, "ms"),
    };
    let pb = ProgressBar::new(len);
    if let Ok(st) = ProgressStyle::with_template(&format!(
        "{{prefix:>28}} [{{bar:30}}] {{pos}}/{{len}} {unit} {{msg}}"
    )) {
        pb.set_style(st.progress_chars("=> "));
    }
    pb.set_prefix(case.name());
    pb
}

/// Runs one case to completion on `client` towards `peer`; `run_start` anchors the interval timestamps.
pub fn run_case(
    client: &mut Client,
    peer: u32,
    case: Case,
    opts: &RunOptions,
    run_start: Instant,
) -> anyhow::Result<CaseResult> {
    let w = Workload::new(case);
    let n = opts.in_flight.max(1);
    let mut l = Loop {
        client,
        peer,
        w: &w,
        slots: vec![None; n],
        next: 0,
        think: opts.think,
        errors: 0,
        first_error: None,
    };
    let pb = bar(opts, &case);
    pb.set_message("warm-up");
    // Warm-up: at least one round per slot; its mean round trip is the expected interval per slot.
    for i in 0..n {
        l.issue(i)?;
    }
    let warm_start = Instant::now();
    let (mut warm_done, mut warm_n, mut warm_sum) = (0usize, 0u64, 0u128);
    while warm_done < n || warm_start.elapsed() < opts.warmup {
        warm_done += 1;
        if let Some(ns) = l.complete()? {
            warm_n += 1;
            warm_sum += u128::from(ns);
        }
    }
    let co = n > 1;
    let expected = if co && warm_n > 0 {
        (warm_sum / u128::from(warm_n)) as u64
    } else {
        0
    };
    pb.set_message("");
    let mut hist = histogram();
    let mut ih = histogram();
    let mut intervals = Vec::new();
    let start = Instant::now();
    let mut istart = start;
    let (mut count, mut finished) = (0u64, 0u64);
    let mut last_draw = start;
    loop {
        let now = Instant::now();
        let done = match opts.stop {
            Stop::Count(c) => finished >= c,
            Stop::Duration(d) => now - start >= d,
        };
        if now - istart >= INTERVAL || done {
            intervals.push(Interval {
                start: istart - run_start,
                length: now - istart,
                hist: ih.clone(),
            });
            ih.reset();
            istart = now;
        }
        if done {
            break;
        }
        if now - last_draw >= Duration::from_millis(50) {
            pb.set_position(match opts.stop {
                Stop::Count(_) => finished,
                Stop::Duration(_) => (now - start).as_millis() as u64,
            });
            last_draw = now;
        }
        finished += 1;
        if let Some(ns) = l.complete()? {
            count += 1;
            if co {
                let _ = hist.record_correct(ns, expected);
                let _ = ih.record_correct(ns, expected);
            } else {
                let _ = hist.record(ns);
                let _ = ih.record(ns);
            }
        }
    }
    let elapsed = start.elapsed();
    l.drain();
    pb.finish_and_clear();
    Ok(CaseResult {
        case,
        in_flight: n,
        co_corrected: co,
        expected_interval_ns: expected,
        count,
        errors: l.errors,
        first_error: l.first_error,
        elapsed,
        hist,
        intervals,
    })
}
