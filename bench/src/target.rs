//! Where the bench sends its calls: a socket to attach to, and whatever processes it started to get one.
//!
//! Every target ends as an shm socket plus a peer name, because an app reaches the loopback harness and
//! `rpcrdmad` the same way; only how the socket comes to exist differs.

use anyhow::{bail, Context};
use rpcrdma_shm::WaitPolicy;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Arena of each app region the bench's own loopback harness hands out (room for 4 MiB cases in flight).
pub const LOOPBACK_ARENA: u32 = 256 << 20;

/// How to reach RDMATEST.
#[derive(Debug, Clone)]
pub enum Target {
    /// A daemon (or `shm-loopback`) already listening at `socket`, with an RDMATEST server behind `peer`.
    Attach {
        /// The app socket.
        socket: PathBuf,
        /// Peer name to call (`None`: the first peer the daemon lists).
        peer: Option<String>,
        /// The attached daemon's configuration file, read for the record of what the run ran on.
        config: Option<PathBuf>,
    },
    /// Start a loopback harness and an RDMATEST server here (no daemon involved).
    Loopback,
    /// Start `rpcrdmad --config FILE` for each file (the first one is the one the bench attaches to, the
    /// last one gets the RDMATEST server), then attach.
    Daemons {
        /// The `rpcrdmad` binary.
        rpcrdmad: PathBuf,
        /// Config files.
        configs: Vec<PathBuf>,
        /// Peer name to call (`None`: the first `[[peers]]` of the first config).
        peer: Option<String>,
    },
}

/// What the run's environment records about the target.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct TargetInfo {
    /// `attach`, `loopback` or `daemons`.
    pub kind: String,
    /// The app socket attached to.
    pub socket: String,
    /// The peer called.
    pub peer: String,
    /// RDMA provider (`soft`, `ibv`), when known.
    pub provider: Option<String>,
    /// `transport.inline-send`, when known.
    pub inline_send: Option<u32>,
    /// `transport.inline-recv`, when known.
    pub inline_recv: Option<u32>,
    /// `transport.ddp-threshold`, when known.
    pub ddp_threshold: Option<u32>,
    /// `transport.credits`, when known.
    pub credits: Option<u32>,
    /// `transport.version`, when known.
    pub rpcrdma_version: Option<u32>,
    /// `rpcrdmad --version`, when known.
    pub daemon_version: Option<String>,
    /// The daemon's `cpu.idle` policy, when known (e.g. `spin`, `backoff 1000/100us/10000us`).
    pub idle: Option<String>,
}

impl TargetInfo {
    /// A short name for tables: `rpcrdmad soft`, `rpcrdmad mem`, `loopback`, `attach`.
    pub fn label(&self) -> String {
        match (self.kind.as_str(), &self.provider) {
            ("daemons", Some(p)) => format!("rpcrdmad {p}"),
            ("daemons", None) => "rpcrdmad".into(),
            (k, _) => k.to_string(),
        }
    }
}

/// Records the provider, thresholds, credits, version and idle policy of the daemon `cfg`.
fn record_config(info: &mut TargetInfo, cfg: &rpcrdma_config::Config) {
    let t = &cfg.transport;
    info.provider = Some(cfg.provider.kind.name().into());
    info.inline_send = Some(t.inline_send);
    info.inline_recv = Some(t.inline_recv);
    info.ddp_threshold = Some(t.ddp_threshold);
    info.credits = Some(t.credits);
    info.rpcrdma_version = Some(t.version);
    info.idle = Some(idle_of(cfg));
}

/// The idle policy of a daemon config, as [`TargetInfo::idle`] records it.
pub fn idle_of(cfg: &rpcrdma_config::Config) -> String {
    let i = &cfg.cpu.idle;
    match i.policy {
        rpcrdma_config::IdlePolicy::Spin => "spin".into(),
        rpcrdma_config::IdlePolicy::Backoff => {
            let spin = match i.spin_polls {
                Some(n) => format!("{n} polls"),
                None => format!("{} us", i.spin_us),
            };
            format!(
                "backoff: spin {spin}, sleep <= {} us, park after {} us",
                i.backoff_max_us, i.park_after_us
            )
        }
        rpcrdma_config::IdlePolicy::Yield => {
            format!(
                "yield: sched_yield per empty poll, park after {} us",
                i.park_after_us
            )
        }
    }
}

/// A reachable target; stops the processes it started when dropped.
#[derive(Debug)]
pub struct Session {
    /// The socket to attach to.
    pub socket: PathBuf,
    /// What is known about it.
    pub info: TargetInfo,
    children: Vec<Child>,
    cleanup: Vec<PathBuf>,
}

impl Drop for Session {
    fn drop(&mut self) {
        for c in self.children.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for p in &self.cleanup {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Starts `cmd` and waits for it to print `ready` on its first line.
pub fn spawn_ready(cmd: &mut Command, what: &str) -> anyhow::Result<Child> {
    let mut c = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {what}"))?;
    let mut line = String::new();
    if let Some(out) = c.stdout.take() {
        BufReader::new(out).read_line(&mut line)?;
    }
    if line.trim() != "ready" {
        let _ = c.kill();
        let st = c.wait()?;
        bail!("{what} did not start ({st})");
    }
    Ok(c)
}

/// A fresh socket path for this process.
pub fn temp_socket(tag: &str) -> PathBuf {
    // Numbered too: two sessions of one process (tests run in parallel) must not share a path.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "rpcrdma-bench-{}-{n}-{tag}.sock",
        std::process::id()
    ))
}

fn wait_for_socket(path: &Path, child: &mut Child, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Ok(());
        }
        if let Some(st) = child.try_wait()? {
            bail!(
                "{what} exited ({st}) before listening on {}",
                path.display()
            );
        }
        if Instant::now() > deadline {
            bail!("{what} did not listen on {} within 15 s", path.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until a NULL call through the daemon at `socket` to `peer` succeeds, so calls made
/// while the daemons still connect to each other are not counted as errors.
fn wait_until_answering(socket: &Path, peer: &str) -> anyhow::Result<()> {
    use rpcrdma_shm::rdmatest;
    let (mut c, idx, name) = crate::attach(socket, peer, Duration::ZERO)?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let t = c
            .call(idx, rdmatest::PROG, rdmatest::VERS, rdmatest::NULL)
            .submit();
        let ok = t
            .ok()
            .and_then(|t| c.wait(t, Some(Duration::from_secs(2))).ok())
            .is_some_and(|r| r.accept_stat == 0);
        if ok {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "no NULL call through {} reached peer {name} within 15 s",
                socket.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Receive buffers (count, bytes each) for a server app whose arena is `arena` bytes: eight of
/// 4 MiB + 4 KiB when they fit in half the arena, else two power-of-two blocks of a quarter of it each (the
/// arena allocator rounds every buffer up to a power of two); the other half holds replies.
pub fn recv_buffers_for(arena: u64) -> (u32, u32) {
    let max = u64::from(crate::case::MAX_SIZE) + 4096;
    if arena >= 16 * max.next_power_of_two() {
        return (8, max as u32);
    }
    let quarter = (arena / 4).max(4096);
    let block = 1u64 << (63 - quarter.leading_zeros());
    (2, block.min(max) as u32)
}

/// Starts the bench's own RDMATEST server (`serve`) at `socket`.
fn spawn_server(me: &Path, socket: &Path, wait: WaitPolicy) -> anyhow::Result<Child> {
    spawn_ready(
        Command::new(me)
            .arg("serve")
            .arg(socket)
            .arg(if wait.yield_cpu {
                "--yield-us"
            } else {
                "--spin-us"
            })
            .arg(wait.spin.as_micros().to_string()),
        "rpcrdma-bench serve",
    )
}

impl Target {
    /// Makes the target reachable: starts what it needs (harness, daemons, RDMATEST server);
    /// `exe` is the `rpcrdma-bench` binary (for its `loopback` and `serve` subcommands).
    pub fn open(
        &self,
        exe: &Path,
        wait: impl Into<WaitPolicy>,
        harness_spin: Duration,
    ) -> anyhow::Result<Session> {
        let me = exe;
        let wait = wait.into();
        match self {
            Target::Attach {
                socket,
                peer,
                config,
            } => {
                let mut info = TargetInfo {
                    kind: "attach".into(),
                    socket: socket.display().to_string(),
                    peer: peer.clone().unwrap_or_default(),
                    ..TargetInfo::default()
                };
                if let Some(path) = config {
                    let cfg = rpcrdma_config::from_path(path)
                        .map_err(|e| anyhow::anyhow!("--daemon-config: {e}"))?;
                    record_config(&mut info, &cfg);
                }
                Ok(Session {
                    socket: socket.clone(),
                    info,
                    children: Vec::new(),
                    cleanup: Vec::new(),
                })
            }
            Target::Loopback => {
                let socket = temp_socket("loopback");
                let mut s = Session {
                    socket: socket.clone(),
                    info: TargetInfo {
                        kind: "loopback".into(),
                        socket: socket.display().to_string(),
                        peer: "loopback".into(),
                        ..TargetInfo::default()
                    },
                    children: Vec::new(),
                    cleanup: vec![socket.clone(), socket.with_extension("sock.ctl")],
                };
                s.children.push(spawn_ready(
                    Command::new(me)
                        .arg("loopback")
                        .arg(&socket)
                        .arg("--spin-us")
                        .arg(harness_spin.as_micros().to_string()),
                    "the loopback harness",
                )?);
                s.children.push(spawn_server(me, &socket, wait)?);
                Ok(s)
            }
            Target::Daemons {
                rpcrdmad,
                configs,
                peer,
            } => {
                let (Some(first), Some(last)) = (configs.first(), configs.last()) else {
                    bail!("--spawn-daemons needs at least one config file");
                };
                let version = Command::new(rpcrdmad).arg("--version").output();
                let version = match version {
                    Ok(o) if o.status.success() => {
                        Some(String::from_utf8_lossy(&o.stdout).trim().to_string())
                    }
                    Ok(_) => None,
                    Err(_) => bail!(
                        "cannot run the daemon binary {} (build it with `cargo build --release -p rpcrdma-control`, or pass --rpcrdmad PATH)",
                        rpcrdmad.display()
                    ),
                };
                let load =
                    |p: &PathBuf| rpcrdma_config::from_path(p).map_err(|e| anyhow::anyhow!("{e}"));
                let client = load(first)?;
                let server = load(last)?;
                let peer = match peer {
                    Some(p) => p.clone(),
                    None => match client.peers.first() {
                        Some(p) => p.name.clone(),
                        None => {
                            if configs.len() > 1 {
                                bail!("{} names no [[peers]]", first.display());
                            }
                            "loopback".into()
                        }
                    },
                };
                let mut info = TargetInfo {
                    kind: "daemons".into(),
                    socket: client.daemon.app_socket.clone(),
                    peer,
                    daemon_version: version,
                    ..TargetInfo::default()
                };
                record_config(&mut info, &client);
                let mut s = Session {
                    socket: PathBuf::from(&client.daemon.app_socket),
                    info,
                    children: Vec::new(),
                    cleanup: Vec::new(),
                };
                for cfg in configs {
                    let conf = load(cfg)?;
                    let mut child = Command::new(rpcrdmad)
                        .arg("--config")
                        .arg(cfg)
                        .stdout(Stdio::null())
                        .spawn()
                        .with_context(|| format!("cannot start {}", rpcrdmad.display()))?;
                    let res = wait_for_socket(
                        Path::new(&conf.daemon.app_socket),
                        &mut child,
                        &format!("rpcrdmad --config {}", cfg.display()),
                    );
                    s.children.push(child);
                    res?;
                }
                s.children.push(spawn_server(
                    me,
                    Path::new(&server.daemon.app_socket),
                    wait,
                )?);
                wait_until_answering(&s.socket, &s.info.peer)?;
                Ok(s)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receive_buffers_fit_in_half_the_arena_and_never_exceed_the_largest_case() {
        assert_eq!(
            recv_buffers_for(u64::from(LOOPBACK_ARENA)),
            (8, (4 << 20) + 4096)
        );
        for arena in [64u64 << 10, 4 << 20, 8 << 20, 16 << 20, 64 << 20, 1 << 30] {
            let (n, size) = recv_buffers_for(arena);
            let block = u64::from(size).next_power_of_two();
            assert!(u64::from(n) * block <= arena / 2, "{arena}");
            assert!((4096..=(4 << 20) + 4096).contains(&size));
        }
        // shm-loopback's 8 MiB arena: a 1 MiB call (plus its XDR words) still fits one buffer.
        assert_eq!(recv_buffers_for(8 << 20), (2, 2 << 20));
        assert_eq!(recv_buffers_for(4 << 20), (2, 1 << 20));
    }

    #[test]
    fn attach_with_daemon_config_records_what_the_run_ran_on() {
        let cfg = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/demo-mem.toml");
        let t = Target::Attach {
            socket: "/nonexistent/app.sock".into(),
            peer: Some("self".into()),
            config: Some(cfg),
        };
        let s = t
            .open(Path::new("rpcrdma-bench"), Duration::ZERO, Duration::ZERO)
            .expect("attach needs nothing started");
        let i = &s.info;
        assert_eq!((i.kind.as_str(), i.peer.as_str()), ("attach", "self"));
        assert_eq!(i.provider.as_deref(), Some("mem"));
        assert!(i.inline_send.is_some() && i.credits.is_some() && i.rpcrdma_version.is_some());
        assert!(i.idle.as_deref().is_some_and(|p| !p.is_empty()));
        let bad = Target::Attach {
            socket: "/nonexistent/app.sock".into(),
            peer: None,
            config: Some("/nonexistent/rpcrdmad.toml".into()),
        };
        let e = bad
            .open(Path::new("rpcrdma-bench"), Duration::ZERO, Duration::ZERO)
            .expect_err("a missing config is an error");
        assert!(e.to_string().contains("--daemon-config"), "{e}");
    }
}
