//! Start-up checks that turn the usual deployment mistakes into one clear message each.

use rpcrdma_config::{Config, ProviderKind, ReceiveQueue};
use rpcrdma_dataplane::poll::{PoolPlan, PoolSpec, ReceiveQueues, TransportSpec};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

/// Why the daemon cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The provider needs an RDMA device and there is none.
    #[error("no RDMA device: {0}\n  hint: on a host without an RDMA NIC (or in a container without the device) use the user-space provider:\n        [provider]\n        kind = \"soft\"")]
    NoDevice(String),
    /// The locked-memory limit is below what the pools and arenas need.
    #[error("locked-memory limit (RLIMIT_MEMLOCK) is {have} bytes, rpcrdmad registers up to {need} bytes\n  raise it: `ulimit -l unlimited` in the starting shell, `LimitMEMLOCK=infinity` in the systemd unit,\n            `* - memlock unlimited` in /etc/security/limits.conf, or `--ulimit memlock=-1` for docker")]
    Memlock {
        /// Current soft limit.
        have: u64,
        /// What the configuration needs.
        need: u64,
    },
    /// The configuration asks for a provider this binary was built without.
    #[error("provider kind = \"ibv\" needs an rpcrdmad built with the rdma-core provider{0}\n  build it: cargo build -p rpcrdma-control --features ibv (needs libibverbs-dev, librdmacm-dev, cmake, clang, libclang-dev)")]
    NotBuilt(String),
    /// A socket path is held by a running process.
    #[error("{what} socket {path} is in use by a running process (another rpcrdmad?); stop it or choose another path")]
    SocketInUse {
        /// "admin" or "app".
        what: &'static str,
        /// The path.
        path: String,
    },
    /// Any other I/O failure, with what was being done.
    #[error("{what}: {source}")]
    Io {
        /// What failed.
        what: String,
        /// The error.
        source: io::Error,
    },
    /// A poll thread could not start (core, provider, app socket).
    #[error("{0}")]
    PollThread(String),
}

/// What a poll thread is told of the transport, from `cfg`.
pub fn transport_spec(cfg: &Config) -> TransportSpec {
    let t = &cfg.transport;
    let s = &cfg.provider.soft;
    let (ird, ord) = match cfg.provider.kind {
        ProviderKind::Soft | ProviderKind::Mem => (s.ird, s.ord),
        ProviderKind::Ibv => (cfg.provider.ibv.ird, cfg.provider.ibv.ord),
    };
    TransportSpec {
        version: t.version,
        inline_send: t.inline_send,
        inline_recv: t.inline_recv,
        credits: t.credits,
        backchannel_credits: t.backchannel_credits,
        ddp_threshold: t.ddp_threshold,
        remote_invalidation: t.remote_invalidation,
        recv_buffer_size: cfg.pools.recv_buffer_size,
        ird: u16::try_from(ird).unwrap_or(u16::MAX),
        ord: u16::try_from(ord).unwrap_or(u16::MAX),
        v2_first_reply_timeout: Duration::from_millis(u64::from(t.v2_first_message_timeout_ms)),
        max_segments_per_chunk: t.max_segments_per_chunk,
        max_chunks_per_list: t.max_chunks_per_list,
    }
}

/// A poll thread's buffer pools, from `cfg`.
pub fn pool_spec(cfg: &Config) -> PoolSpec {
    PoolSpec {
        recv_buffers: cfg.pools.recv_buffers,
        send_buffers: cfg.pools.send_buffers,
        receive_queues: match cfg.pools.receive_queue {
            ReceiveQueue::Shared => ReceiveQueues::Shared,
            ReceiveQueue::PerConnection => ReceiveQueues::PerConnection,
        },
    }
}

/// Bytes of memory the daemon registers with an RDMA provider for `cfg`: what each poll
/// thread's [`PoolPlan`] registers (0 for pools that cannot work: the poll threads then
/// refuse to start, with the reason), and every app's arena once per poll thread (a thread
/// serves the connections of apps of any thread).
pub fn registered_bytes(cfg: &Config) -> u64 {
    let threads = cfg.cpu.poll_cores.len().max(1) as u64;
    let pools = PoolPlan::new(
        &transport_spec(cfg),
        pool_spec(cfg),
        cfg.pools.connections,
        u32::try_from(cfg.apps.arena_size).unwrap_or(u32::MAX),
    )
    .map_or(0, |p| p.registered_len());
    (pools + u64::from(cfg.apps.max_apps) * cfg.apps.arena_size) * threads
}

/// The memlock problem for a soft limit `limit` (`None`: unlimited) and `need` bytes, if any.
pub fn memlock_problem(limit: Option<u64>, need: u64) -> Option<StartError> {
    match limit {
        Some(have) if have < need => Some(StartError::Memlock { have, need }),
        _ => None,
    }
}

fn memlock_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Memlock).current
}

/// Whether `dir` (normally /sys/class/infiniband) lists at least one device.
pub fn rdma_devices(dir: &Path) -> Result<Vec<String>, String> {
    match std::fs::read_dir(dir) {
        Ok(rd) => Ok(rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()),
        Err(e) => Err(format!(
            "{} is missing ({e}): this kernel has no RDMA support loaded",
            dir.display()
        )),
    }
}

/// Checks the provider: built in, devices present and enough locked memory (the soft provider
/// pins nothing and needs neither). The kernel's umem code lets a process with CAP_IPC_LOCK
/// (root, or a container granted it) register past RLIMIT_MEMLOCK, but Linux `siw` counts every
/// registration against the limit for everyone: with CAP_IPC_LOCK the limit is checked only
/// when the device used is a siw device.
pub fn check_provider(cfg: &Config) -> Result<(), StartError> {
    if cfg.provider.kind != ProviderKind::Ibv {
        return Ok(());
    }
    let devs = rdma_devices(Path::new("/sys/class/infiniband")).map_err(StartError::NoDevice)?;
    if devs.is_empty() {
        return Err(StartError::NoDevice(
            "/sys/class/infiniband lists no device".into(),
        ));
    }
    if !cfg!(feature = "ibv") {
        return Err(StartError::NotBuilt(format!(" (this host has {devs:?})")));
    }
    if let Some(want) = cfg.provider.ibv.device.as_deref() {
        if !devs.iter().any(|d| d == want) {
            return Err(StartError::NoDevice(format!(
                "provider.ibv.device = {want:?} is not among {devs:?}"
            )));
        }
    }
    let dev = cfg
        .provider
        .ibv
        .device
        .as_deref()
        .or(devs.first().map(String::as_str))
        .unwrap_or("");
    if has_ipc_lock(&std::fs::read_to_string("/proc/self/status").unwrap_or_default())
        && !is_siw(Path::new("/sys/class/infiniband"), dev)
    {
        return Ok(());
    }
    match memlock_problem(memlock_limit(), registered_bytes(cfg)) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Whether the effective capabilities in `/proc/self/status` text include CAP_IPC_LOCK (14).
fn has_ipc_lock(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 14) != 0)
}

/// Whether RDMA device `dev` (in `dir`, normally `/sys/class/infiniband`) is a `siw` device:
/// an iWARP RNIC with no PCI device behind it. Hardware iWARP NICs have one; rxe has none but is
/// InfiniBand-typed, and its pins go through the umem code, which honours CAP_IPC_LOCK.
fn is_siw(dir: &Path, dev: &str) -> bool {
    let pci = dir.join(dev).join("device/vendor").exists();
    !pci && std::fs::read_to_string(dir.join(dev).join("node_type"))
        .is_ok_and(|t| t.contains("RNIC"))
}

/// Makes `path` free for a new socket: refuses if a process accepts on it, removes a stale
/// file, creates the parent directory.
pub fn free_socket_path(path: &Path, what: &'static str) -> Result<(), StartError> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(StartError::SocketInUse {
                what,
                path: path.display().to_string(),
            });
        }
        std::fs::remove_file(path).map_err(|source| StartError::Io {
            what: format!("remove stale {what} socket {}", path.display()),
            source,
        })?;
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| StartError::Io {
            what: format!("create {}", dir.display()),
            source,
        })?;
    }
    Ok(())
}

/// Binds the admin socket with mode 0600 (only the daemon's user may administer it).
pub fn bind_admin(path: &Path) -> Result<UnixListener, StartError> {
    free_socket_path(path, "admin")?;
    let io = |what: &str| {
        let what = format!("{what} {}", path.display());
        move |source| StartError::Io { what, source }
    };
    let l = UnixListener::bind(path).map_err(io("bind admin socket"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io("chmod 0600"))?;
    l.set_nonblocking(true).map_err(io("admin socket"))?;
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memlock_counts_the_pools() {
        let mut cfg = Config::default();
        cfg.apps.max_apps = 1;
        let (t, p) = (cfg.transport.clone(), cfg.pools.clone());
        let arena = cfg.apps.arena_size;
        let tail = u64::from(t.inline_send) + 128;
        let recv_size = u64::from(p.recv_buffer_size.max(t.inline_recv));
        // Shared pools: the send pool (page aligned), then the shared receive queue.
        let shared = (u64::from(p.send_buffers) * tail).div_ceil(4096) * 4096
            + u64::from(p.recv_buffers) * recv_size;
        assert_eq!(registered_bytes(&cfg), shared + arena);
        // Three poll threads: three pools, and every arena registered on each of them.
        cfg.cpu.poll_cores = vec![0, 1, 2];
        assert_eq!(registered_bytes(&cfg), 3 * (shared + arena));
        // Buffers of their own: per connection, its full credits, backchannel credits and a
        // spare as receives, and send buffers for calls in flight plus answers.
        cfg.pools.receive_queue = ReceiveQueue::PerConnection;
        let recv_slots = u64::from(t.credits + t.backchannel_credits + 1);
        let send_slots = u64::from(t.credits) + recv_slots + 1;
        let own = u64::from(p.connections) * (send_slots * tail + recv_slots * recv_size);
        assert_eq!(registered_bytes(&cfg), 3 * (own + arena));
    }

    #[test]
    fn ipc_lock_read_from_effective_capabilities() {
        assert!(has_ipc_lock("Name:\tx\nCapEff:\t000001ffffffffff\n"));
        assert!(has_ipc_lock("CapEff:\t0000000000004000\n"));
        assert!(!has_ipc_lock("CapEff:\t0000000000000000\n"));
        assert!(!has_ipc_lock("CapPrm:\t0000000000004000\n"));
        assert!(!has_ipc_lock("CapEff:\tzz\n"));
    }

    #[test]
    fn siw_is_an_rnic_without_a_pci_device() {
        let dir = std::env::temp_dir().join(format!("rpcrdmad-ib-{}", std::process::id()));
        let mk = |dev: &str, node: &str, pci: bool| {
            std::fs::create_dir_all(dir.join(dev).join("device")).unwrap();
            std::fs::write(dir.join(dev).join("node_type"), node).unwrap();
            if pci {
                std::fs::write(dir.join(dev).join("device/vendor"), "0x8086\n").unwrap();
            }
        };
        mk("siw0", "4: RNIC\n", false);
        mk("rxe0", "1: CA\n", false);
        mk("iwp1", "4: RNIC\n", true);
        assert!(is_siw(&dir, "siw0"));
        assert!(!is_siw(&dir, "rxe0"), "rxe pins through umem");
        assert!(!is_siw(&dir, "iwp1"), "a PCI iWARP NIC");
        assert!(!is_siw(&dir, "none"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn memlock_below_need_says_how_to_raise_it() {
        let e = memlock_problem(Some(65536), 1 << 20).expect("too low");
        let text = e.to_string();
        assert!(text.contains("65536"), "{text}");
        assert!(text.contains("LimitMEMLOCK=infinity"), "{text}");
        assert!(text.contains("ulimit -l"), "{text}");
        assert!(memlock_problem(None, u64::MAX).is_none());
        assert!(memlock_problem(Some(1 << 20), 1 << 20).is_none());
    }

    #[test]
    fn missing_rdma_class_dir_is_reported_with_soft_hint() {
        let dir = std::env::temp_dir().join(format!("rpcrdmad-nodev-{}", std::process::id()));
        let e = rdma_devices(&dir)
            .map_err(StartError::NoDevice)
            .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("no RDMA device"), "{text}");
        assert!(text.contains("kind = \"soft\""), "{text}");
    }

    #[test]
    fn socket_held_by_a_listener_is_in_use_and_a_stale_one_is_replaced() {
        let dir = std::env::temp_dir().join(format!("rpcrdmad-sock-{}", std::process::id()));
        let path = dir.join("a.sock");
        let held = bind_admin(&path).expect("bind");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(matches!(
            free_socket_path(&path, "admin"),
            Err(StartError::SocketInUse { .. })
        ));
        drop(held);
        // The file stays behind, nobody accepts: stale, so it is removed and rebound.
        assert!(path.exists());
        let again = bind_admin(&path);
        assert!(again.is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
