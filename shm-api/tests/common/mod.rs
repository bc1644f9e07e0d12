//! Process helpers for the multi-process tests: the harness, test apps, stats.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed (SIGKILL) and reaped on drop.
pub struct Proc(pub Child);

impl Proc {
    pub fn kill9(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn spawn_ready(cmd: &mut Command) -> Proc {
    let mut child = cmd.stdout(Stdio::piped()).spawn().expect("spawn");
    let out = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(out)
        .read_line(&mut line)
        .expect("read ready line");
    assert_eq!(line.trim(), "ready", "child did not start");
    Proc(child)
}

/// A fresh socket path for one test.
pub fn sock(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rpcrdma-shm-{name}-{}.sock", std::process::id()))
}

/// Starts `shm-loopback` on `path`.
pub fn harness(path: &Path) -> Proc {
    spawn_ready(Command::new(env!("CARGO_BIN_EXE_shm-loopback")).arg(path))
}

/// Starts `shm-loopback` on `path`, evicting apps that leave completions undrained for `stall_ms`.
pub fn harness_with_stall_limit(path: &Path, stall_ms: u64) -> Proc {
    spawn_ready(
        Command::new(env!("CARGO_BIN_EXE_shm-loopback"))
            .arg(path)
            .arg("200")
            .arg(stall_ms.to_string()),
    )
}

/// Starts `shm-testapp role path args…` and waits for its "ready".
pub fn app(role: &str, path: &Path, args: &[&str]) -> Proc {
    spawn_ready(
        Command::new(env!("CARGO_BIN_EXE_shm-testapp"))
            .arg(role)
            .arg(path)
            .args(args),
    )
}

/// Starts `shm-testapp role path args…` with extra environment variables and waits for its "ready".
pub fn app_env(role: &str, path: &Path, args: &[&str], env: &[(&str, &str)]) -> Proc {
    spawn_ready(
        Command::new(env!("CARGO_BIN_EXE_shm-testapp"))
            .arg(role)
            .arg(path)
            .args(args)
            .envs(env.iter().copied()),
    )
}

/// The harness's counters (one line from `<path>.ctl`).
pub fn stats(path: &Path) -> HashMap<String, u64> {
    let mut p = path.as_os_str().to_owned();
    p.push(".ctl");
    let mut s = String::new();
    UnixStream::connect(PathBuf::from(p))
        .expect("ctl connect")
        .read_to_string(&mut s)
        .expect("ctl read");
    s.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().expect("number")))
        .collect()
}

/// Polls `cond` until it holds or 30 s pass (a bound against hangs, not a timing assertion).
pub fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// XDR opaque encoding of `d`.
pub fn xdr_opaque(d: &[u8]) -> Vec<u8> {
    let mut v = (d.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(d);
    v.resize(v.len() + (4 - d.len() % 4) % 4, 0);
    v
}

/// Receive buffers each `shm-testapp` server or blackhole posts (the `Server` default).
pub const SERVER_RECVS: u64 = 16;

/// Waits until the harness holds exactly `ops` operations (e.g. the servers' posted receive buffers, which
/// the harness takes off the ring asynchronously), then returns its counters.
pub fn settled(path: &Path, ops: u64) -> HashMap<String, u64> {
    assert!(
        eventually(|| stats(path)["ops"] == ops),
        "ops never settled at {ops}: {:?}",
        stats(path)
    );
    stats(path)
}

/// A single-threaded runtime: a wait that blocked the thread would stall everything on it.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Runs `f` on a thread of its own and fails if it has not finished in 30 s: a wait that
/// never hands the thread back would otherwise hang the test instead of failing it.
pub fn within_30s(f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(()) => t.join().expect("test thread"),
        // The thread panicked (its panic is the failure) or never finished.
        Err(_) if t.is_finished() => t.join().expect("test thread"),
        Err(_) => panic!("not finished in 30 s: a wait kept the thread"),
    }
}
