//! `rpcrdma-bench`: RDMATEST latency/throughput runs, the RDMATEST server, and side-by-side comparisons.
#![forbid(unsafe_code)]

use clap::{Args, Parser, Subcommand};
use rpcrdma_bench::case::{self, Case, Proc};
use rpcrdma_bench::compare::{self, CompareOptions};
use rpcrdma_bench::report::{self, Environment};
use rpcrdma_bench::run::{RunOptions, Stop};
use rpcrdma_bench::serve::{self, ServeOptions};
use rpcrdma_bench::target::{Session, Target, TargetInfo, LOOPBACK_ARENA};
use rpcrdma_bench::workload::ReplyBuffer;
use rpcrdma_bench::{attach, run_cases, OutFiles};
use rpcrdma_shm::WaitPolicy;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "RDMATEST benchmarks through rpcrdmad's shared-memory API"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Runs cases (closed loop) and prints a table; writes .json, .hlog and .svg to --out.
    Run(RunArgs),
    /// Attaches to a daemon socket and serves RDMATEST (every procedure) until stopped.
    Serve(ServeArgs),
    /// Raw ring vs libtirpc TCP vs each of our targets: NULL, ECHO 64 B / 1 MiB, READ 1 MiB; ratios and goals.
    Compare(CompareArgs),
    /// Test harness standing in for the daemon (routes calls between local apps).
    #[command(hide = true)]
    Loopback {
        socket: PathBuf,
        #[arg(long, default_value_t = 200)]
        spin_us: u64,
        /// Arena bytes per app.
        #[arg(long, default_value_t = LOOPBACK_ARENA)]
        arena: u32,
    },
    /// Completes every call at once: the raw-ring peer of `compare`.
    #[command(hide = true)]
    RingEcho {
        socket: PathBuf,
        #[arg(long, default_value_t = 200)]
        spin_us: u64,
    },
}

#[derive(Args, Debug)]
struct TargetArgs {
    /// Attach to a running daemon (or shm-loopback) listening at this app socket.
    #[arg(long, value_name = "SOCKET", conflicts_with = "spawn_daemons")]
    attach: Option<PathBuf>,
    /// Start `rpcrdmad --config FILE` for each file (comma-separated; the bench attaches to the first, the
    /// RDMATEST server to the last). `compare` takes it more than once: one target per occurrence.
    #[arg(long, value_name = "CFG[,CFG]", value_parser = parse_configs)]
    spawn_daemons: Vec<Configs>,
    /// The daemon binary for --spawn-daemons.
    #[arg(long, default_value = "rpcrdmad")]
    rpcrdmad: PathBuf,
    /// Peer name to call (default: the daemon's first peer).
    #[arg(long)]
    peer: Option<String>,
    /// With --attach: the attached daemon's configuration file, so the results record the
    /// provider, thresholds, credits, version and idle policy the run ran with.
    #[arg(long, value_name = "FILE", requires = "attach")]
    daemon_config: Option<PathBuf>,
    /// How long apps busy-poll before sleeping (µs). 0 is fastest on 2 cores, where a spinning app takes
    /// the core the harness or daemon needs.
    #[arg(long, default_value_t = 0)]
    spin_us: u64,
    /// Instead of --spin-us: apps poll for this long (µs) calling `sched_yield` between polls, then sleep.
    /// On a host with fewer cores than busy threads the daemon and the other app get the core at once.
    #[arg(long, value_name = "US", conflicts_with = "spin_us")]
    yield_us: Option<u64>,
    /// How long the loopback harness busy-polls before parking (µs; loopback target only).
    #[arg(long, default_value_t = 200)]
    harness_spin_us: u64,
}

/// `--yield-us` when given, else `--spin-us`.
fn app_wait(spin_us: u64, yield_us: Option<u64>) -> WaitPolicy {
    match yield_us {
        Some(us) => WaitPolicy::yielding(Duration::from_micros(us)),
        None => WaitPolicy::spin(Duration::from_micros(spin_us)),
    }
}

/// "app spin N µs" or "app yield-spin N µs".
fn app_wait_text(e: &Environment) -> String {
    let how = if e.app_yield { "yield-spin" } else { "spin" };
    format!("app {how} {} µs", e.app_spin_us)
}

/// One `--spawn-daemons` value: the config files of one target.
#[derive(Debug, Clone)]
struct Configs(Vec<PathBuf>);

/// Parses one `--spawn-daemons` value: comma-separated config files.
fn parse_configs(s: &str) -> Result<Configs, String> {
    let v: Vec<PathBuf> = s
        .split(',')
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect();
    if v.is_empty() {
        return Err("no config file".into());
    }
    Ok(Configs(v))
}

impl TargetArgs {
    /// Every target named: one per `--spawn-daemons`, or the attached socket, or the loopback harness.
    fn targets(&self) -> Vec<Target> {
        if let Some(s) = &self.attach {
            vec![Target::Attach {
                socket: s.clone(),
                peer: self.peer.clone(),
                config: self.daemon_config.clone(),
            }]
        } else if !self.spawn_daemons.is_empty() {
            self.spawn_daemons
                .iter()
                .map(|configs| Target::Daemons {
                    rpcrdmad: self.rpcrdmad.clone(),
                    configs: configs.0.clone(),
                    peer: self.peer.clone(),
                })
                .collect()
        } else {
            vec![Target::Loopback]
        }
    }

    /// The one target of `run`.
    fn target(&self) -> anyhow::Result<Target> {
        let mut t = self.targets();
        if t.len() != 1 {
            anyhow::bail!("`run` takes one --spawn-daemons (`compare` takes several)");
        }
        Ok(t.remove(0))
    }

    /// How the apps wait: `--yield-us` or `--spin-us`.
    fn wait(&self) -> WaitPolicy {
        app_wait(self.spin_us, self.yield_us)
    }

    /// This host's facts and how the apps wait.
    fn environment(&self, target: TargetInfo, harness: Option<u64>) -> Environment {
        let w = self.wait();
        let mut env = Environment::here(target, w.spin.as_micros() as u64, harness);
        env.app_yield = w.yield_cpu;
        env
    }

    fn open(&self) -> anyhow::Result<(Session, Environment)> {
        let t = self.target()?;
        let s = t.open(
            &std::env::current_exe()?,
            self.wait(),
            Duration::from_micros(self.harness_spin_us),
        )?;
        let harness = matches!(t, Target::Loopback).then_some(self.harness_spin_us);
        let env = self.environment(s.info.clone(), harness);
        Ok((s, env))
    }
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// A case PROC/MODE/SIZE (repeatable), e.g. echo/inline/64, read/write-chunk/1MiB.
    #[arg(long = "case", value_name = "CASE")]
    cases: Vec<Case>,
    /// A named case list: quick, default, full (used when no --case is given).
    #[arg(long, default_value = "default")]
    matrix: String,
    /// Warm-up per case.
    #[arg(long, default_value = "1s", value_parser = case::parse_duration)]
    warmup: Duration,
    /// Measured phase per case.
    #[arg(long, default_value = "5s", value_parser = case::parse_duration)]
    duration: Duration,
    /// Measured calls per case (instead of --duration).
    #[arg(long)]
    count: Option<u64>,
    /// Calls in flight (1 = latency; more = throughput, coordinated-omission corrected). With
    /// --rate: the most calls outstanding (default 32).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    in_flight: Option<u32>,
    /// Pause (µs) between a reply and the next call in its slot, outside the measured round trip:
    /// with more than the daemon's `cpu.idle.park-after-us`, every call meets a parked daemon.
    #[arg(long, default_value_t = 0, value_name = "US", conflicts_with = "rate")]
    think_us: u64,
    /// Open loop: offer this many calls per second (e.g. 50000, 200k, 1.5M) on a fixed schedule,
    /// whatever the replies; round trips count from each call's due time, so a target that falls
    /// behind shows it in its latencies. Without it, the loop is closed.
    #[arg(long, value_name = "PER_S", value_parser = case::parse_rate)]
    rate: Option<f64>,
    /// Reply buffers: `sized` (each procedure's largest reply, as the Linux client sizes
    /// them), `default` (what the shm Client gives a call that does not say: the daemon's
    /// inline room), or a number of bytes for every call (above the inline room, every call
    /// offers a Reply chunk: what an unsized buffer costs).
    #[arg(long, default_value = "sized", value_name = "sized|default|BYTES")]
    reply_buffer: ReplyBuffer,
    /// Print the JSON document (schema rpcrdma-bench/run/1) on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Directory for the .json, .hlog and .svg files.
    #[arg(long, default_value = "rpcrdma-bench-results")]
    out: PathBuf,
    /// No progress bar (it is also off when stderr is not a terminal).
    #[arg(long)]
    no_progress: bool,
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// The daemon's app socket.
    socket: PathBuf,
    /// How long the app busy-polls before sleeping (µs).
    #[arg(long, default_value_t = 0)]
    spin_us: u64,
    /// Instead of --spin-us: poll for this long (µs) calling `sched_yield` between polls, then sleep.
    #[arg(long, value_name = "US", conflicts_with = "spin_us")]
    yield_us: Option<u64>,
    /// Receive buffers posted (default: sized from the daemon's arena, with --recv-size).
    #[arg(long, requires = "recv_size")]
    recv_buffers: Option<u32>,
    /// Bytes per receive buffer: the largest call served (the arena must hold them all and the replies).
    #[arg(long, requires = "recv_buffers")]
    recv_size: Option<u32>,
}

#[derive(Args, Debug)]
struct CompareArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Warm-up per row.
    #[arg(long, default_value = "1s", value_parser = case::parse_duration)]
    warmup: Duration,
    /// Measured phase per row.
    #[arg(long, default_value = "5s", value_parser = case::parse_duration)]
    duration: Duration,
    /// Raw ring: how long the client busy-polls before sleeping (µs).
    #[arg(long, default_value_t = 50)]
    ring_spin_us: u64,
    /// Raw ring: how long the echo side busy-polls before parking (µs).
    #[arg(long, default_value_t = 200)]
    ring_echo_spin_us: u64,
    /// Print the JSON document (schema rpcrdma-bench/compare/1) instead of the table.
    #[arg(long)]
    json: bool,
    /// Directory for the .json and .svg files and the libtirpc build.
    #[arg(long, default_value = "rpcrdma-bench-results")]
    out: PathBuf,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
}

/// The most calls outstanding in an open loop when `--in-flight` is not given.
const OPEN_LOOP_IN_FLIGHT: u32 = 32;

fn ready() {
    println!("ready");
    let _ = std::io::stdout().flush();
}

fn run(a: RunArgs) -> anyhow::Result<()> {
    let cases = if a.cases.is_empty() {
        case::matrix(&a.matrix)?
    } else {
        a.cases.clone()
    };
    let (session, env) = a.target.open()?;
    let spin = a.target.wait();
    let (mut client, peer, name) = attach(&session.socket, &env.target.peer, spin)?;
    let mut env = env;
    env.target.peer = name;
    if cases.iter().any(|c| c.proc_ == Proc::Callback) {
        serve::start_callbacks(session.socket.clone(), spin)?;
    }
    let opts = RunOptions {
        warmup: a.warmup,
        stop: a.count.map_or(Stop::Duration(a.duration), Stop::Count),
        in_flight: a.in_flight.unwrap_or(if a.rate.is_some() {
            OPEN_LOOP_IN_FLIGHT
        } else {
            1
        }) as usize,
        think: Duration::from_micros(a.think_us),
        rate: a.rate,
        reply: a.reply_buffer,
        progress: !a.no_progress && std::io::stderr().is_terminal(),
    };
    let out = OutFiles::new(&a.out, "run", SystemTime::now())?;
    let (doc, _) = run_cases(
        &mut client,
        peer,
        &cases,
        &opts,
        env,
        &out,
        std::env::args().collect(),
    )?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", report::table(&doc.cases));
        for c in doc.cases.iter().filter(|c| c.errors > 0) {
            println!(
                "{}: first failure: {}",
                c.name,
                c.first_error.as_deref().unwrap_or("?")
            );
        }
        let e = &doc.environment;
        println!(
            "target {} ({}), peer {}, {} cores, {}{}",
            e.target.kind,
            e.target.socket,
            e.target.peer,
            e.cores,
            app_wait_text(e),
            e.harness_spin_us
                .map_or(String::new(), |s| format!(", harness spin {s} µs"))
        );
        println!(
            "plot: {}\nhlog: {}\njson: {}",
            out.with("svg").display(),
            out.with("hlog").display(),
            out.with("json").display()
        );
    }
    let bad: u64 = doc.cases.iter().map(|c| c.errors).sum();
    if bad > 0 {
        anyhow::bail!("{bad} calls failed or returned wrong data");
    }
    Ok(())
}

fn compare_cmd(a: CompareArgs) -> anyhow::Result<()> {
    let targets = a.target.targets();
    let harness = targets
        .iter()
        .any(|t| matches!(t, Target::Loopback))
        .then_some(a.target.harness_spin_us);
    let env = a.target.environment(Default::default(), harness);
    let out = OutFiles::new(&a.out, "compare", SystemTime::now())?;
    let opts = CompareOptions {
        warmup: a.warmup,
        duration: a.duration,
        build_dir: a.out.join("tirpc-build"),
        progress: !a.no_progress && std::io::stderr().is_terminal(),
        ring_spin: Duration::from_micros(a.ring_spin_us),
        ring_echo_spin: Duration::from_micros(a.ring_echo_spin_us),
        exe: std::env::current_exe()?,
        app_wait: a.target.wait(),
        harness_spin: Duration::from_micros(a.target.harness_spin_us),
    };
    let (mut doc, hists) = compare::compare(&opts, env, &targets)?;
    let svg = out.with("svg");
    let series: Vec<(String, &hdrhistogram::Histogram<u64>)> =
        hists.iter().map(|(n, h)| (n.clone(), h)).collect();
    std::fs::write(
        &svg,
        report::svg("rpcrdma-bench compare: round trips by percentile", &series),
    )?;
    doc.svg = Some(svg.display().to_string());
    std::fs::write(out.with("json"), serde_json::to_string_pretty(&doc)?)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", compare::table(&doc));
        println!(
            "{} cores; {}; plot: {}",
            doc.environment.cores,
            app_wait_text(&doc.environment),
            svg.display()
        );
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Run(a) => run(a),
        Cmd::Compare(a) => compare_cmd(a),
        Cmd::Serve(a) => serve::serve(
            &a.socket,
            &ServeOptions {
                recv: a.recv_buffers.zip(a.recv_size),
                wait: app_wait(a.spin_us, a.yield_us),
            },
            ready,
        ),
        Cmd::Loopback {
            socket,
            spin_us,
            arena,
        } => {
            let mut lb = rpcrdma_shm::loopback::Loopback::bind(
                &socket,
                rpcrdma_shm::abi::Geometry {
                    arena_size: arena,
                    ..Default::default()
                },
            )?;
            ready();
            Ok(lb.run(Duration::from_micros(spin_us))?)
        }
        Cmd::RingEcho { socket, spin_us } => {
            compare::ring_echo(&socket, Duration::from_micros(spin_us))
        }
    }
}
