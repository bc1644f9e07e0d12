//! Latency benchmarks (not tests): `cargo bench -p rpcrdma-shm --bench pingpong`.
//!
//! 1. Raw ring ping-pong between two processes over one shared region (SQ → echo → CQ, both sides spinning):
//!    the physical limit of the ABI.
//! 2. RDMATEST NULL from a `Client` through the `shm-loopback` harness to a `Server` app and back
//!    (three processes on however many cores there are; idle policies: harness parks at once / after
//!    200 µs idle; apps spin 50 µs before sleeping — on 2 cores, longer app spins only make it worse).
//! 3. With `--features tokio`: the same NULL from an `AsyncClient` (its waits park the task at once)
//!    against a blocking `Client` sleeping at once and spinning 50 µs, alternating in one harness
//!    session; ratios of the medians.
use hdrhistogram::Histogram;
use rpcrdma_shm::abi::{Cqe, Geometry, Layout, Sqe};
use rpcrdma_shm::region::Region;
use rpcrdma_shm::{rdmatest, Client};
use rustix::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "RPCRDMA_SHM_PINGPONG_FD";
const WARMUP: u32 = 20_000;
const ROUNDS: u32 = 200_000;

fn report(name: &str, h: &Histogram<u64>) {
    println!(
        "{name}: n={} p50={} ns p99={} ns p99.9={} ns max={} ns",
        h.len(),
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999),
        h.max()
    );
}

fn echo_child(fd: i32) {
    // SAFETY: the parent left this descriptor open across exec for us, and nothing else owns it.
    let region = Region::open(unsafe { OwnedFd::from_raw_fd(fd) }).expect("open region");
    // SAFETY: this process is the only SQ consumer and CQ producer of the region, which outlives both.
    let (mut sq, mut cq) = unsafe { (region.sq_consumer(), region.cq_producer()) };
    loop {
        if let Some(s) = sq.pop().expect("sq") {
            if s.opcode == 0xff {
                return;
            }
            while cq
                .push(Cqe {
                    user_data: s.user_data,
                    ..Cqe::default()
                })
                .is_err()
            {}
        }
    }
}

fn raw_ring() {
    let layout = Layout::new(Geometry::default()).unwrap();
    let region = Region::create(layout, 0, &[]).unwrap();
    let fd = rustix::io::fcntl_dupfd_cloexec(region.fd(), 0).unwrap();
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::empty()).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env(CHILD_ENV, fd.as_raw_fd().to_string())
        .spawn()
        .unwrap();
    drop(fd);
    // SAFETY: this process is the only SQ producer and CQ consumer; the region outlives both handles.
    let (mut sq, mut cq) = unsafe { (region.sq_producer(), region.cq_consumer()) };
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
    for i in 0..WARMUP + ROUNDS {
        let t0 = Instant::now();
        sq.push(Sqe {
            opcode: 1,
            user_data: u64::from(i),
            ..Sqe::default()
        })
        .unwrap();
        let c = loop {
            if let Some(c) = cq.pop().unwrap() {
                break c;
            }
            std::hint::spin_loop();
        };
        let dt = t0.elapsed().as_nanos() as u64;
        assert_eq!(c.user_data, u64::from(i));
        if i >= WARMUP {
            h.record(dt.max(1)).unwrap();
        }
    }
    sq.push(Sqe {
        opcode: 0xff,
        ..Sqe::default()
    })
    .unwrap();
    child.wait().unwrap();
    report("raw ring ping-pong (2 processes, 64-byte descriptors)", &h);
}

fn ready(cmd: &mut Command) -> std::process::Child {
    let mut c = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    c
}

/// Starts the harness (`spin_us`) and an RDMATEST server app (`app_spin_us`), runs `client`
/// against them, and stops them.
fn with_harness<T>(
    spin_us: u32,
    app_spin_us: u64,
    client: impl FnOnce(&std::path::Path) -> T,
) -> T {
    let path = std::env::temp_dir().join(format!("rpcrdma-shm-bench-{}.sock", std::process::id()));
    let mut harness = ready(
        Command::new(env!("CARGO_BIN_EXE_shm-loopback"))
            .arg(&path)
            .arg(spin_us.to_string()),
    );
    let mut server = ready(
        Command::new(env!("CARGO_BIN_EXE_shm-testapp"))
            .env("SHM_TESTAPP_SPIN_US", app_spin_us.to_string())
            .arg("server")
            .arg(&path),
    );
    let out = client(&path);
    let _ = server.kill();
    let _ = harness.kill();
    let _ = server.wait();
    let _ = harness.wait();
    let _ = std::fs::remove_file(&path);
    out
}

fn histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap()
}

/// NULL round trips from a blocking `Client` that looks for `app_spin_us` before it sleeps.
fn null_from_client(path: &std::path::Path, app_spin_us: u64) -> Histogram<u64> {
    let mut c = Client::connect(path).unwrap();
    c.set_spin(Duration::from_micros(app_spin_us));
    let peer = c.peer("loopback").unwrap();
    let mut h = histogram();
    for i in 0..WARMUP + ROUNDS / 4 {
        let t0 = Instant::now();
        let t = c
            .call(peer, rdmatest::PROG, 1, rdmatest::NULL)
            .submit()
            .unwrap();
        c.wait(t, Some(Duration::from_secs(10))).unwrap();
        if i >= WARMUP {
            h.record((t0.elapsed().as_nanos() as u64).max(1)).unwrap();
        }
    }
    h
}

/// NULL round trips from an `AsyncClient` on a single-threaded tokio runtime: every wait
/// parks the task on the descriptor (no spinning).
#[cfg(feature = "tokio")]
fn null_from_async_client(path: &std::path::Path) -> Histogram<u64> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c =
            rpcrdma_shm::async_client::AsyncClient::new(Client::connect(path).unwrap()).unwrap();
        let peer = c.client().peer("loopback").unwrap();
        let mut h = histogram();
        for i in 0..WARMUP + ROUNDS / 4 {
            let t0 = Instant::now();
            let t = c
                .client()
                .call(peer, rdmatest::PROG, 1, rdmatest::NULL)
                .submit()
                .unwrap();
            c.wait(t).await.unwrap();
            if i >= WARMUP {
                h.record((t0.elapsed().as_nanos() as u64).max(1)).unwrap();
            }
        }
        h
    })
}

fn null_through_harness(spin_us: u32, app_spin_us: u64) {
    let h = with_harness(spin_us, app_spin_us, |p| null_from_client(p, app_spin_us));
    report(
        &format!("NULL app -> shm-loopback -> app -> back (harness spins {spin_us} us, apps {app_spin_us} us)"),
        &h,
    );
}

/// `AsyncClient` against the blocking `Client` that also sleeps at once (spin 0), and the
/// default one (spin 50 us), in one harness session, alternating: the price of parking a
/// task instead of a thread, as ratios of medians.
#[cfg(feature = "tokio")]
fn async_against_blocking() {
    let (mut asy, mut zero, mut spin) = (histogram(), histogram(), histogram());
    with_harness(200, 50, |p| {
        for _ in 0..3 {
            asy.add(null_from_async_client(p)).unwrap();
            zero.add(null_from_client(p, 0)).unwrap();
            spin.add(null_from_client(p, 50)).unwrap();
        }
    });
    report("NULL from AsyncClient (tokio, parks at once)", &asy);
    report("NULL from Client, spin 0 (sleeps at once)", &zero);
    report("NULL from Client, spin 50 us (default)", &spin);
    let p50 = |h: &Histogram<u64>| h.value_at_quantile(0.5) as f64;
    println!(
        "AsyncClient / Client spin 0: p50 x{:.2}; AsyncClient / Client spin 50 us: p50 x{:.2}",
        p50(&asy) / p50(&zero),
        p50(&asy) / p50(&spin)
    );
}

fn main() {
    if let Ok(fd) = std::env::var(CHILD_ENV) {
        return echo_child(fd.parse().unwrap());
    }
    println!(
        "cores: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    raw_ring();
    null_through_harness(0, 50);
    null_through_harness(200, 50);
    #[cfg(feature = "tokio")]
    async_against_blocking();
    #[cfg(not(feature = "tokio"))]
    println!("(AsyncClient against Client: run with --features tokio)");
}
