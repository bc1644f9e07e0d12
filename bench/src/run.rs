//! The drivers: closed loop (warm-up, then a duration or a call count, with `in_flight` calls
//! outstanding, each reply sending the next call) and open loop (calls sent on a fixed schedule of
//! `rate` per second whatever the replies, at most `in_flight` outstanding). Every round trip goes
//! into an HdrHistogram (one per case, plus one per one-second interval).

use crate::case::Case;
use crate::workload::{ReplyBuffer, Workload};
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
    /// Open loop: calls offered per second, on a fixed schedule (call `k` is due `k / rate`
    /// after the case starts); `in_flight` caps the calls outstanding. Each round trip counts
    /// from the call's due time, so time spent waiting for a free slot is in it. `None`:
    /// closed loop.
    pub rate: Option<f64>,
    /// How each call's reply buffer is sized.
    pub reply: ReplyBuffer,
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
    /// Open loop: the calls per second offered.
    pub offered_per_s: Option<f64>,
    /// Open loop: measured calls that found all `in_flight` slots busy when due, and went out
    /// late (their round trips include the wait).
    pub late: u64,
    /// Open loop: how late (ns) the other measured calls went out after their due time, which
    /// is the generator's own delay (its thread not running, or busy with replies).
    pub send_lag: Option<Histogram<u64>>,
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

/// A call that finished.
struct Finished {
    /// Its slot, free again.
    slot: usize,
    /// When its reply was seen.
    at: Instant,
    /// Whether it belongs to the measured phase.
    measured: bool,
    /// Its round trip (ns), if it came back intact.
    round_trip: Option<u64>,
}

struct Loop<'a> {
    client: &'a mut Client,
    peer: u32,
    w: &'a Workload,
    /// Per slot: the call's ticket, when its round trip started, its number, and whether it
    /// is measured (open loop: due after the warm-up).
    slots: Vec<Option<(Ticket, Instant, usize, bool)>>,
    next: usize,
    think: Duration,
    errors: u64,
    first_error: Option<String>,
}

impl Loop<'_> {
    fn issue(&mut self, i: usize) -> anyhow::Result<()> {
        self.issue_at(i, Instant::now(), true)
    }

    /// Sends the next call in slot `i`, its round trip counted from `t0`.
    fn issue_at(&mut self, i: usize, t0: Instant, measured: bool) -> anyhow::Result<()> {
        let k = self.next;
        self.next = self.next.wrapping_add(1);
        match self.w.submit(self.client, self.peer, k) {
            Ok(t) => self.slots[i] = Some((t, t0, k, measured)),
            Err(Error::ArenaFull) => bail!(
                "{}: arena full with {} calls in flight (the daemon's arena is too small for this case)",
                self.w.case(),
                self.slots.len()
            ),
            Err(e) => bail!("{}: submit: {e}", self.w.case()),
        }
        Ok(())
    }

    /// Waits for one call; returns its round trip in ns if it came back intact, and sends the
    /// next call in its slot.
    fn complete(&mut self) -> anyhow::Result<Option<u64>> {
        let Some(r) = self.reply(CALL_TIMEOUT)? else {
            bail!("{}: waiting for a reply: timed out", self.w.case());
        };
        if !self.think.is_zero() {
            std::thread::sleep(self.think);
        }
        self.issue(r.slot)?;
        Ok(r.round_trip)
    }

    /// Waits up to `timeout` for one call to finish and frees its slot (`None`: none did).
    fn reply(&mut self, timeout: Duration) -> anyhow::Result<Option<Finished>> {
        match self.client.wait_any(Some(timeout)) {
            Ok((t, res)) => self.finished(t, res).map(Some),
            Err(Error::Timeout) => Ok(None),
            Err(e) => bail!("{}: waiting for a reply: {e}", self.w.case()),
        }
    }

    /// Frees the slot of call `t`, which finished with `res`, and checks its data.
    fn finished(
        &mut self,
        t: Ticket,
        res: Result<rpcrdma_shm::client::Reply, Error>,
    ) -> anyhow::Result<Finished> {
        let now = Instant::now();
        let Some(i) = self
            .slots
            .iter()
            .position(|s| s.is_some_and(|(st, ..)| st == t))
        else {
            bail!("{}: a reply for a call never made", self.w.case());
        };
        let Some((_, t0, k, measured)) = self.slots[i].take() else {
            bail!("{}: slot vanished", self.w.case());
        };
        let outcome = match res {
            Ok(r) => self.w.check(k, &r),
            Err(e) => Err(format!("{}: {e}", self.w.case())),
        };
        let round_trip = match outcome {
            Ok(()) => Some((now - t0).as_nanos().clamp(1, u128::from(MAX_NS)) as u64),
            Err(msg) => {
                self.errors += 1;
                self.first_error.get_or_insert(msg);
                None
            }
        };
        Ok(Finished {
            slot: i,
            at: now,
            measured,
            round_trip,
        })
    }

    fn drain(&mut self) {
        while self.slots.iter().any(Option::is_some) {
            match self.client.wait_any(Some(CALL_TIMEOUT)) {
                Ok((t, _)) => {
                    if let Some(s) = self
                        .slots
                        .iter_mut()
                        .find(|s| s.is_some_and(|(st, ..)| st == t))
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

/// The histograms of a case's measured phase: the whole, and one per [`INTERVAL`].
struct Recorder {
    hist: Histogram<u64>,
    ih: Histogram<u64>,
    intervals: Vec<Interval>,
    istart: Instant,
    run_start: Instant,
}

impl Recorder {
    fn new(start: Instant, run_start: Instant) -> Recorder {
        Recorder {
            hist: histogram(),
            ih: histogram(),
            intervals: Vec::new(),
            istart: start,
            run_start,
        }
    }

    /// Records a round trip; with `expected` > 0, corrected for coordinated omission.
    fn record(&mut self, ns: u64, expected: u64) {
        if expected > 0 {
            let _ = self.hist.record_correct(ns, expected);
            let _ = self.ih.record_correct(ns, expected);
        } else {
            let _ = self.hist.record(ns);
            let _ = self.ih.record(ns);
        }
    }

    /// Closes the current interval if it is [`INTERVAL`] long, or if `last`.
    fn tick(&mut self, now: Instant, last: bool) {
        if now - self.istart >= INTERVAL || last {
            self.intervals.push(Interval {
                start: self.istart - self.run_start,
                length: now - self.istart,
                hist: self.ih.clone(),
            });
            self.ih.reset();
            self.istart = now;
        }
    }
}

/// Runs one case to completion on `client` towards `peer`; `run_start` anchors the interval timestamps.
pub fn run_case(
    client: &mut Client,
    peer: u32,
    case: Case,
    opts: &RunOptions,
    run_start: Instant,
) -> anyhow::Result<CaseResult> {
    let w = Workload::new(case, opts.reply);
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
    if let Some(rate) = opts.rate {
        let r = open_loop(&mut l, opts, rate, &pb, run_start);
        pb.finish_and_clear();
        return r;
    }
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
    let start = Instant::now();
    let mut rec = Recorder::new(start, run_start);
    let (mut count, mut finished) = (0u64, 0u64);
    let mut last_draw = start;
    loop {
        let now = Instant::now();
        let done = match opts.stop {
            Stop::Count(c) => finished >= c,
            Stop::Duration(d) => now - start >= d,
        };
        rec.tick(now, done);
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
            rec.record(ns, expected);
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
        offered_per_s: None,
        late: 0,
        send_lag: None,
        count,
        errors: l.errors,
        first_error: l.first_error,
        elapsed,
        hist: rec.hist,
        intervals: rec.intervals,
    })
}

/// When call `k` of an open loop at `rate` per second is due, from `base`.
fn due(base: Instant, rate: f64, k: u64) -> Instant {
    base + Duration::from_secs_f64(k as f64 / rate)
}

/// The open loop: calls go out when due (call `k` at `k / rate` after the start), whatever the
/// replies, while a slot is free; the warm-up's calls are sent but not recorded, the measured
/// phase's are recorded from their due time, and every measured call is waited for.
fn open_loop(
    l: &mut Loop<'_>,
    opts: &RunOptions,
    rate: f64,
    pb: &ProgressBar,
    run_start: Instant,
) -> anyhow::Result<CaseResult> {
    if !(rate.is_finite() && rate > 0.0) {
        bail!("--rate must be a positive number of calls per second, not {rate}");
    }
    let case = l.w.case();
    // Waits end when the next call is due: with the default timer slack (50 µs) they would
    // overshoot, and the call would go out late.
    let slack = rustix::thread::current_timer_slack().ok();
    let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1));
    let r = open_loop_run(l, opts, rate, pb, run_start, case);
    if let Some(s) = slack {
        let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(s));
    }
    r
}

fn open_loop_run(
    l: &mut Loop<'_>,
    opts: &RunOptions,
    rate: f64,
    pb: &ProgressBar,
    run_start: Instant,
    case: Case,
) -> anyhow::Result<CaseResult> {
    let base = Instant::now();
    let start = base + opts.warmup;
    // Calls due before `first` are the warm-up's.
    let first = (opts.warmup.as_secs_f64() * rate).ceil() as u64;
    let last = match opts.stop {
        Stop::Count(c) => first.saturating_add(c),
        // The calls due in [start, start + d).
        Stop::Duration(d) => (((opts.warmup + d).as_secs_f64() * rate).ceil() as u64).max(first),
    };
    let mut free: Vec<usize> = (0..l.slots.len()).rev().collect();
    let mut rec = Recorder::new(start, run_start);
    let (mut k, mut count, mut late, mut finished) = (0u64, 0u64, 0u64, 0u64);
    // The due call found every slot busy (it counts as late when it goes).
    let mut blocked = false;
    // How late the calls that found a slot free went out: the generator's own delay.
    let mut send_lag = histogram();
    let mut end = start;
    let mut last_draw = base;
    pb.set_message("warm-up");
    while k < last || free.len() < l.slots.len() {
        let now = Instant::now();
        if now >= start {
            rec.tick(now, false);
            if now - last_draw >= Duration::from_millis(50) {
                pb.set_message("");
                pb.set_position(match opts.stop {
                    Stop::Count(_) => finished,
                    Stop::Duration(_) => (now - start).as_millis() as u64,
                });
                last_draw = now;
            }
        }
        while k < last && due(base, rate, k) <= now {
            let Some(i) = free.pop() else {
                blocked = true;
                break;
            };
            let measured = k >= first;
            let at = due(base, rate, k);
            if measured {
                if blocked {
                    late += 1;
                } else {
                    let ns = Instant::now().saturating_duration_since(at).as_nanos();
                    let _ = send_lag.record(ns.clamp(1, u128::from(MAX_NS)) as u64);
                }
            }
            blocked = false;
            l.issue_at(i, at, measured)?;
            k += 1;
        }
        // Wait for a reply until the next call is due, and no longer (or, all slots busy,
        // for a reply).
        let f = if k < last && !free.is_empty() {
            l.reply(due(base, rate, k).saturating_duration_since(Instant::now()))?
        } else {
            let f = l.reply(CALL_TIMEOUT)?;
            if f.is_none() {
                bail!("{case}: waiting for a reply: timed out");
            }
            f
        };
        let Some(f) = f else {
            continue;
        };
        free.push(f.slot);
        if f.measured {
            finished += 1;
            end = end.max(f.at);
            if let Some(ns) = f.round_trip {
                count += 1;
                rec.record(ns, 0);
            }
        }
    }
    rec.tick(Instant::now().max(start), true);
    Ok(CaseResult {
        case,
        in_flight: l.slots.len(),
        co_corrected: false,
        expected_interval_ns: 0,
        offered_per_s: Some(rate),
        late,
        send_lag: Some(send_lag),
        count,
        errors: l.errors,
        first_error: l.first_error.take(),
        elapsed: end.saturating_duration_since(start),
        hist: rec.hist,
        intervals: rec.intervals,
    })
}
