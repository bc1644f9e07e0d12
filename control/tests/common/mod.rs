//! Real daemons for the integration tests: each test starts `rpcrdmad` processes on loopback
//! with the soft provider, in their own temporary directory, and kills them when dropped.
#![allow(dead_code)]

use rpcrdma_shm::rdmatest;
use rpcrdma_shm::Server;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A loopback TCP port nobody listens on right now, for a daemon to bind a moment later.
///
/// Taken below the kernel's ephemeral range (32768 and up by default), never from it: a port
/// the kernel handed out for `bind(0)` goes back into the pool that outgoing connections draw
/// their source ports from, and the daemons of concurrent tests connect to each other all the
/// time. One of those connections took such a port between this function and the daemon's
/// bind, once, in CI. Below the range only another caller of this function competes: each
/// test process walks its own stretch (from its pid) and skips ports something holds.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(97);
    for _ in 0..SPAN {
        let port = (FIRST + start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}..{}", FIRST + SPAN);
}

/// A fresh directory for one daemon.
pub fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rpcrdmad-it-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("mkdir");
    d
}

/// Polls `f` every 20 ms until it returns `Some`, for at most `secs` seconds.
pub fn eventually<T>(secs: u64, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One running `rpcrdmad`.
#[derive(Debug)]
pub struct Daemon {
    pub dir: PathBuf,
    pub config: PathBuf,
    pub admin: PathBuf,
    pub app: PathBuf,
    pub port: u16,
    pub child: Option<Child>,
}

/// The config text of a test daemon listening on `port`, with `peer` ("name", port) if any.
pub fn config(dir: &Path, port: u16, peer: Option<(&str, u16)>, extra: &str) -> String {
    let mut c = format!(
        "[daemon]\napp-socket = \"{d}/app.sock\"\nadmin-socket = \"{d}/admin.sock\"\nlog-level = \"debug\"\n\
         [cpu]\npoll-cores = [0, 1]\n\
         [cpu.idle]\npolicy = \"backoff\"\nspin-us = 100\nbackoff-max-us = 50\npark-after-us = 2000\n\
         [provider]\nkind = \"soft\"\n\
         [pools]\nconnections = 4\n\
         [apps]\nmax-apps = 4\narena-size = 4194304\n\
         [[listeners]]\naddress = \"127.0.0.1:{port}\"\n",
        d = dir.display()
    );
    if let Some((name, p)) = peer {
        c += &format!(
            "[[peers]]\nname = \"{name}\"\naddress = \"127.0.0.1:{p}\"\nreconnect-initial-ms = 50\nreconnect-max-ms = 400\n"
        );
    }
    c += extra;
    c
}

impl Daemon {
    /// Writes `text` as the config in `dir` and starts `rpcrdmad` on it, waiting until its
    /// admin socket answers.
    pub fn start_with(dir: PathBuf, port: u16, text: &str) -> Daemon {
        let config = dir.join("rpcrdmad.toml");
        std::fs::write(&config, text).expect("write config");
        let log = std::fs::File::create(dir.join("rpcrdmad.log")).expect("log");
        let child = Command::new(env!("CARGO_BIN_EXE_rpcrdmad"))
            .arg("--config")
            .arg(&config)
            .arg("--drain-timeout-ms")
            .arg("3000")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn rpcrdmad");
        let d = Daemon {
            admin: dir.join("admin.sock"),
            app: dir.join("app.sock"),
            dir,
            config,
            port,
            child: Some(child),
        };
        let up = eventually(20, || {
            rpcrdma_control::admin::call(
                &d.admin,
                &rpcrdma_control::admin::Request::Status,
                Duration::from_secs(2),
            )
            .ok()
            .filter(|r| r.ok)
        });
        assert!(up.is_some(), "daemon did not start:\n{}", d.log());
        d
    }

    /// A daemon listening on a free port, connecting to `peer` if given.
    pub fn start(name: &str, peer: Option<(&str, u16)>) -> Daemon {
        let dir = tmpdir(name);
        let port = free_port();
        let text = config(&dir, port, peer, "");
        Daemon::start_with(dir, port, &text)
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("rpcrdmad.log")).unwrap_or_default()
    }

    /// Runs `rpcrdmactl --socket <admin> args...`.
    pub fn ctl(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_rpcrdmactl"))
            .arg("--socket")
            .arg(&self.admin)
            .args(args)
            .output()
            .expect("run rpcrdmactl")
    }

    /// `rpcrdmactl --json args...` parsed.
    pub fn ctl_json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        let out = self.ctl(&a);
        assert!(
            out.status.success(),
            "rpcrdmactl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("json")
    }

    /// Waits until configured peer `name` is up.
    pub fn wait_peer_up(&self, name: &str) {
        let ok = eventually(20, || {
            let s = self.ctl_json(&["status"]);
            s["peers"]
                .as_array()?
                .iter()
                .find(|p| p["name"] == name && p["state"] == "up")
                .map(|_| ())
        });
        assert!(ok.is_some(), "peer {name} never came up:\n{}", self.log());
    }

    /// Sends `sig` ("TERM", "INT", "HUP" or "KILL") to the daemon.
    pub fn signal(&self, sig: &str) {
        let id = self.child.as_ref().expect("running").id();
        signal_pid(id, sig);
    }

    /// Waits for the daemon to exit (at most `secs`), returning its exit code.
    pub fn wait_exit(&mut self, secs: u64) -> Option<i32> {
        let mut child = self.child.take()?;
        let r = eventually(secs, || child.try_wait().ok().flatten());
        match r {
            Some(st) => st.code(),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                None
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Serves RDMATEST on `app_socket` from a thread (it ends when the daemon detaches it).
pub fn rdmatest_server(app_socket: &Path) {
    serve_app(
        app_socket,
        (rdmatest::PROG, rdmatest::VERS),
        rdmatest::handle,
    );
}

/// Serves `prog`/`vers` on `app_socket` with `handler` from a thread (it ends when the daemon
/// detaches it); returns once the program is registered.
pub fn serve_app<F>(app_socket: &Path, (prog, vers): (u32, u32), handler: F)
where
    F: FnMut(&rpcrdma_shm::client::Call<'_>, &mut rpcrdma_shm::client::ReplyBuilder)
        + Send
        + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    let p = app_socket.to_path_buf();
    std::thread::spawn(move || {
        let mut s = Server::connect(&p).expect("server attach");
        s.start(prog, vers).expect("register");
        let _ = tx.send(());
        let _ = s.serve(prog, vers, handler);
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("server app registered");
}

/// A NULL to `peer` that nobody there serves yet: it is answered PROG_UNAVAIL within `t`, and
/// that first reply brings the peer's full credit grant, so later calls go out together
/// rather than one at a time.
pub fn null_unserved(c: &mut rpcrdma_shm::Client, peer: u32, t: Option<Duration>) {
    let ticket = c
        .call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::NULL)
        .submit()
        .expect("submit");
    assert_eq!(c.wait(ticket, t).expect("NULL").accept_stat, 1);
}

/// Starts an app on `app_socket` that registers the callback program for backward-direction
/// calls and serves it (PING returns its argument, like RDMATEST ECHO); returns once it is
/// registered.
pub fn callback_app(app_socket: &Path) {
    let (tx, rx) = std::sync::mpsc::channel();
    let path = app_socket.to_path_buf();
    std::thread::spawn(move || {
        let mut s = Server::connect(&path).expect("attach");
        s.register(rdmatest::CB_PROG, 1, true)
            .expect("register callback program");
        let _ = tx.send(());
        let _ = s.serve(rdmatest::CB_PROG, 1, rdmatest::handle);
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("callback app ready");
}

/// A backward-direction PING of `len` bytes (`pattern(seed, len)`) from `c` on connection
/// `conn` (its peer index), answered within `t` with the same bytes; on a failure the logs of
/// the daemons `a` and `b` say why.
pub fn backward_ping(
    c: &mut rpcrdma_shm::Client,
    conn: u32,
    (seed, len): (u32, usize),
    t: Option<Duration>,
    (a, b): (&Daemon, &Daemon),
) {
    let data = rdmatest::pattern(seed, len);
    let mut call = c.call(conn, rdmatest::CB_PROG, 1, 1);
    call.args().put_opaque(&data);
    let ticket = call.submit().expect("submit");
    let r = c
        .wait(ticket, t)
        .unwrap_or_else(|e| panic!("{e:?}\nA:\n{}\nB:\n{}", a.log(), b.log()));
    assert_eq!(r.accept_stat, 0);
    assert_eq!(r.body, xdr_opaque(&data));
}

/// One `/metrics` scrape on `port` (reads time out after `read_timeout`, if given): the head
/// and body of a 200 response in the Prometheus text format.
pub fn scrape_response(port: u16, read_timeout: Option<Duration>) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect metrics");
    s.set_read_timeout(read_timeout).expect("timeout");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    let (head, body) = out.split_once("\r\n\r\n").expect("http response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    (head.to_string(), body.to_string())
}

/// An ECHO of `len` bytes (`pattern(len, len)`) from `c` to `peer`, answered within 20 s with
/// the same bytes.
pub fn echo(c: &mut rpcrdma_shm::Client, peer: u32, len: usize) {
    let data = rdmatest::pattern(len as u32, len);
    let mut call = c.call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
    call.args().put_opaque(&data);
    let t = call.submit().expect("submit");
    let r = c
        .wait(t, Some(Duration::from_secs(20)))
        .expect("ECHO reply");
    assert_eq!(r.body, xdr_opaque(&data));
}

/// XDR `opaque<>` of `d`.
pub fn xdr_opaque(d: &[u8]) -> Vec<u8> {
    let mut v = (d.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(d);
    v.resize(4 + d.len().div_ceil(4) * 4, 0);
    v
}

/// Sends `sig` ("TERM", "INT", "HUP" or "KILL") to process `id` (one we started).
pub fn signal_pid(id: u32, sig: &str) {
    use rustix::process::{kill_process, Pid, Signal};
    let sig = match sig {
        "TERM" => Signal::TERM,
        "INT" => Signal::INT,
        "HUP" => Signal::HUP,
        "KILL" => Signal::KILL,
        other => panic!("unknown signal {other}"),
    };
    let pid = Pid::from_raw(i32::try_from(id).expect("pid")).expect("non-zero pid");
    kill_process(pid, sig).expect("kill");
}

/// The resource counts of a daemon (summed over its poll threads) that must return to a
/// baseline when an app goes away (`rpcrdmactl stats --json`, `threads`).
pub const RESOURCE_KEYS: [&str; 9] = [
    "apps",
    "app-ops",
    "rpcs-in-flight",
    "regions",
    "region-bytes",
    "send-buffers-free",
    "send-buffers",
    "recv-buffers-free",
    "recv-buffers",
];

/// The daemon's resource counts now.
pub fn counts(d: &Daemon) -> std::collections::BTreeMap<&'static str, u64> {
    let s = d.ctl_json(&["stats"]);
    RESOURCE_KEYS
        .iter()
        .map(|&k| (k, thread_sum(&s, k)))
        .collect()
}

/// The daemon's number of poll threads.
pub fn threads(d: &Daemon) -> u64 {
    let s = d.ctl_json(&["stats"]);
    s["threads"].as_array().map_or(0, |t| t.len() as u64)
}

/// `key` of `rpcrdmactl stats --json` summed over the poll threads; `a/b` names `b` inside
/// the object `a` (a JSON pointer below each thread).
pub fn thread_sum(stats: &serde_json::Value, key: &str) -> u64 {
    let threads = stats["threads"]
        .as_array()
        .unwrap_or_else(|| panic!("stats has no threads: {stats}"));
    threads
        .iter()
        .map(|t| {
            t.pointer(&format!("/{key}"))
                .and_then(serde_json::Value::as_u64)
                .unwrap_or_else(|| panic!("stats has no {key}: {stats}"))
        })
        .sum()
}

/// The counts once the daemon is quiet: nothing in flight, every pool buffer free.
pub fn settled(d: &Daemon) -> std::collections::BTreeMap<&'static str, u64> {
    let c = eventually(30, || {
        let c = counts(d);
        (c["rpcs-in-flight"] == 0
            && c["send-buffers-free"] == c["send-buffers"]
            && c["recv-buffers-free"] == c["recv-buffers"])
            .then_some(c)
    });
    c.unwrap_or_else(|| panic!("never quiet: {:?}\n{}", counts(d), d.log()))
}

/// Waits until the counts equal `base` again (at most `secs`); panics with both otherwise.
pub fn back_to(d: &Daemon, base: &std::collections::BTreeMap<&'static str, u64>, secs: u64) {
    let ok = eventually(secs, || (counts(d) == *base).then_some(()));
    assert!(
        ok.is_some(),
        "counts did not return to the baseline\nbase {base:?}\nnow  {:?}\n{}",
        counts(d),
        d.log()
    );
}

/// A child process we started, killed (SIGKILL) and reaped on drop.
#[derive(Debug)]
pub struct App(pub Child);

impl App {
    /// Starts `cmd` with its stdout piped and waits for its first line, which must start
    /// with `ready` (it is returned).
    pub fn start(cmd: &mut Command, ready: &str) -> (App, String) {
        let mut child = cmd.stdout(Stdio::piped()).spawn().expect("spawn app");
        let out = child.stdout.take().expect("stdout");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line)
            .expect("read the app's first line");
        let app = App(child);
        assert!(line.starts_with(ready), "app said {line:?}, not {ready:?}");
        (app, line)
    }

    /// SIGKILL, then reap.
    pub fn kill9(&mut self) {
        signal_pid(self.0.id(), "KILL");
        let _ = self.0.wait();
    }

    /// Whether it still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }
}

impl Drop for App {
    fn drop(&mut self) {
        if self.alive() {
            self.kill9();
        }
    }
}

/// An `rdmatest serve` process on `app_socket` (an RDMATEST server app).
pub fn rdmatest_serve(app_socket: &Path) -> App {
    App::start(
        Command::new(env!("CARGO_BIN_EXE_rdmatest"))
            .arg("serve")
            .arg(app_socket),
        "serving",
    )
    .0
}

/// The path of shm-api's `shm-testapp` (hostile and other test roles), built on first use.
pub fn shm_testapp() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| build_bin("rpcrdma-shm", "shm-testapp"))
        .clone()
}

/// The path of the NFS probe's `nfs-probe` (`serve`: the miniserver as a server app; `run`:
/// the probe as a client app), built on first use.
pub fn nfs_probe() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| build_bin("rpcrdma-nfsprobe", "nfs-probe"))
        .clone()
}

/// Builds binary `bin` of workspace package `package` with the cargo that builds these tests,
/// into their profile directory (a binary of another package is not an artifact of this one).
fn build_bin(package: &str, bin: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_rpcrdmad"))
        .parent()
        .expect("profile directory")
        .to_path_buf();
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "-q", "-p", package, "--bin", bin])
        .arg("--manifest-path")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml"))
        .arg("--target-dir")
        .arg(dir.parent().expect("target directory"));
    if dir.ends_with("release") {
        cmd.arg("--release");
    }
    let st = cmd.status().expect("run cargo build");
    assert!(st.success(), "cargo build of {bin} failed");
    let exe = dir.join(bin);
    assert!(exe.exists(), "{} missing", exe.display());
    exe
}

/// Submits `n` RDMATEST SLEEPs of one second to `peer` (calls a server app will hold).
pub fn submit_sleeps(
    c: &mut rpcrdma_shm::Client,
    peer: u32,
    n: usize,
) -> Vec<rpcrdma_shm::client::Ticket> {
    (0..n)
        .map(|_| {
            let mut call = c.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::SLEEP);
            call.args().put_u32(1_000_000);
            call.submit().expect("submit")
        })
        .collect()
}

/// Waits for every ticket after the server app died: each must be answered, OK or SYSTEM_ERR,
/// none may hang; returns how many got SYSTEM_ERR.
pub fn answers_after_server_death(
    c: &mut rpcrdma_shm::Client,
    tickets: Vec<rpcrdma_shm::client::Ticket>,
    a: &Daemon,
    b: &Daemon,
) -> u32 {
    let mut failed = 0;
    for t in tickets {
        let r = c
            .wait(t, Some(Duration::from_secs(30)))
            .unwrap_or_else(|e| panic!("{e:?}\nA:\n{}\nB:\n{}", a.log(), b.log()));
        assert!(matches!(r.accept_stat, 0 | 5), "{}", r.accept_stat);
        failed += u32::from(r.accept_stat == 5);
    }
    failed
}
