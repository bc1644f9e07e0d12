//! Semantic checks: ranges, cross-field rules and host facts that serde cannot express.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use crate::diag::{Diagnostic, Severity};
use crate::load::Doc;
use crate::schema::*;

/// Facts about the host the configuration is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// Ids of the cores the daemon may run on (its affinity mask, which a cpuset may restrict).
    pub cores: Vec<u32>,
}

impl HostFacts {
    /// Facts of the running host: `core_affinity::get_core_ids()` (the process's affinity
    /// mask), else `0..available_parallelism`.
    pub fn detect() -> Self {
        let ids = core_affinity::get_core_ids()
            .map(|ids| {
                ids.iter()
                    .filter_map(|c| u32::try_from(c.id).ok())
                    .collect::<Vec<_>>()
            })
            .filter(|ids| !ids.is_empty());
        match ids {
            Some(cores) => Self { cores },
            None => Self::with_cores(std::thread::available_parallelism().map_or(1, |n| n.get())),
        }
    }

    /// A host whose cores are `0..n`.
    pub fn with_cores(n: usize) -> Self {
        Self {
            cores: (0..u32::try_from(n).unwrap_or(u32::MAX)).collect(),
        }
    }

    fn has_core(&self, id: u32) -> bool {
        self.cores.contains(&id)
    }

    fn describe_cores(&self) -> String {
        let list: Vec<String> = self.cores.iter().map(u32::to_string).collect();
        format!("usable core ids: {}", list.join(", "))
    }
}

/// One step in a key path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seg {
    Key(&'static str),
    Index(usize),
}

/// A key path such as `peers[1].name`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Path(Vec<Seg>);

impl Path {
    pub(crate) fn segs(&self) -> &[Seg] {
        &self.0
    }

    fn render(&self) -> String {
        let mut s = String::new();
        for seg in &self.0 {
            match seg {
                Seg::Key(k) => {
                    if !s.is_empty() {
                        s.push('.');
                    }
                    s.push_str(k);
                }
                Seg::Index(i) => s.push_str(&format!("[{i}]")),
            }
        }
        s
    }
}

/// `p!("a", "b")` or `p!("peers", [i], "name")` builds a [`Path`].
macro_rules! p {
    ($($seg:tt),* $(,)?) => { Path(vec![$(p!(@seg $seg)),*]) };
    (@seg [$i:expr]) => { Seg::Index($i) };
    (@seg $k:expr) => { Seg::Key($k) };
}

/// Collects findings, locating each in the source document when there is one.
struct Sink<'a, 'i> {
    doc: Option<&'a Doc<'i>>,
    file: &'a str,
    out: Vec<Diagnostic>,
}

impl Sink<'_, '_> {
    fn emit(&mut self, severity: Severity, path: Path, message: String, hint: Option<String>) {
        self.emit_cross(severity, path, &[], message, hint);
    }

    /// Reports at `path`, positioned at the first of `path` and `also` written in the file (a
    /// cross-field error about a defaulted key points at the key that made it wrong).
    fn emit_cross(
        &mut self,
        severity: Severity,
        path: Path,
        also: &[Path],
        message: String,
        hint: Option<String>,
    ) {
        let (line, column) = self.doc.map_or((0, 0), |d| {
            std::iter::once(&path)
                .chain(also)
                .find_map(|p| d.locate_exact(p))
                .unwrap_or_else(|| d.locate(&path))
        });
        self.out.push(Diagnostic {
            severity,
            file: self.file.to_owned(),
            line,
            column,
            path: path.render(),
            message,
            hint,
        });
    }

    fn error(&mut self, path: Path, message: String, hint: impl Into<Option<String>>) {
        self.emit(Severity::Error, path, message, hint.into());
    }

    fn cross(
        &mut self,
        path: Path,
        also: &[Path],
        message: String,
        hint: impl Into<Option<String>>,
    ) {
        self.emit_cross(Severity::Error, path, also, message, hint.into());
    }

    fn warn(&mut self, path: Path, message: String, hint: impl Into<Option<String>>) {
        self.emit(Severity::Warning, path, message, hint.into());
    }

    /// Error unless `lo <= v <= hi`.
    fn range(&mut self, path: Path, v: u64, lo: u64, hi: u64) -> bool {
        if (lo..=hi).contains(&v) {
            return true;
        }
        let name = path.render();
        self.error(
            path,
            format!("`{name}` = {v} is out of range"),
            format!("allowed: {lo}..={hi}"),
        );
        false
    }
}

/// Runs every semantic check on `cfg`; `doc` supplies positions when the config came from text.
pub(crate) fn run(
    cfg: &Config,
    host: &HostFacts,
    doc: Option<&Doc<'_>>,
    file: &str,
) -> Vec<Diagnostic> {
    let mut s = Sink {
        doc,
        file,
        out: Vec::new(),
    };
    daemon(&mut s, &cfg.daemon);
    cpu(&mut s, &cfg.cpu, host);
    provider(&mut s, &cfg.provider);
    transport(&mut s, &cfg.transport);
    pools(&mut s, &cfg.pools, &cfg.transport);
    listeners(
        &mut s,
        &cfg.listeners,
        cfg.provider.kind == ProviderKind::Mem,
    );
    peers(&mut s, &cfg.peers);
    mem_wiring(&mut s, cfg);
    apps(&mut s, &cfg.apps);
    s.out
}

fn daemon(s: &mut Sink<'_, '_>, d: &Daemon) {
    if d.app_socket.is_empty() {
        s.error(
            p!("daemon", "app-socket"),
            "`daemon.app-socket` is empty".into(),
            "a Unix socket path".to_string(),
        );
    }
    if d.admin_socket.is_empty() {
        s.error(
            p!("daemon", "admin-socket"),
            "`daemon.admin-socket` is empty".into(),
            "a Unix socket path".to_string(),
        );
    }
    if !d.app_socket.is_empty() && d.app_socket == d.admin_socket {
        s.error(
            p!("daemon", "admin-socket"),
            format!(
                "`daemon.admin-socket` is the same path as `daemon.app-socket` ({})",
                d.app_socket
            ),
            "use two different socket paths".to_string(),
        );
    }
    if let Some(m) = &d.metrics_listen {
        if m.parse::<SocketAddr>().is_err() {
            s.error(
                p!("daemon", "metrics-listen"),
                format!("`daemon.metrics-listen` = {m:?} is not an address"),
                "ip:port, e.g. \"127.0.0.1:9464\" or \"[::1]:9464\"".to_string(),
            );
        }
    }
}

fn cpu(s: &mut Sink<'_, '_>, c: &Cpu, host: &HostFacts) {
    let cores_hint = || host.describe_cores();
    let mut seen = HashSet::new();
    for (i, &core) in c.poll_cores.iter().enumerate() {
        if !host.has_core(core) {
            s.error(
                p!("cpu", "poll-cores", [i]),
                format!("core {core} does not exist"),
                cores_hint(),
            );
        } else if !seen.insert(core) {
            s.error(
                p!("cpu", "poll-cores", [i]),
                format!("core {core} is listed twice in `cpu.poll-cores`"),
                "one poll thread per core".to_string(),
            );
        }
    }
    if let Some(core) = c.control_core {
        if !host.has_core(core) {
            s.error(
                p!("cpu", "control-core"),
                format!("core {core} does not exist"),
                cores_hint(),
            );
        } else if seen.contains(&core) && c.idle.policy == IdlePolicy::Spin {
            s.cross(
                p!("cpu", "control-core"),
                &[p!("cpu", "idle", "policy")],
                format!("control core {core} is also a spinning poll core: the control thread would starve"),
                "pick a core not in `cpu.poll-cores`, or use `cpu.idle.policy = \"backoff\"`".to_string(),
            );
        }
    }
    let idle = &c.idle;
    if let Some(n) = idle.spin_polls {
        s.warn(
            p!("cpu", "idle", "spin-polls"),
            format!("`cpu.idle.spin-polls` is deprecated: {n} empty polls last as long as an empty poll takes, which changes with the provider, the apps attached and the daemon's version"),
            "use `spin-us` (how long to spin, in microseconds) and remove `spin-polls`".to_string(),
        );
    }
    s.range(
        p!("cpu", "idle", "backoff-max-us"),
        idle.backoff_max_us.into(),
        1,
        1_000_000,
    );
    if idle.policy == IdlePolicy::Yield {
        // Zero would park at the first empty poll: the policy would be a slower `backoff`.
        s.range(
            p!("cpu", "idle", "park-after-us"),
            idle.park_after_us.into(),
            1,
            u32::MAX.into(),
        );
    } else if idle.policy == IdlePolicy::Backoff && idle.park_after_us < idle.backoff_max_us {
        s.cross(
            p!("cpu", "idle", "park-after-us"),
            &[p!("cpu", "idle", "backoff-max-us")],
            format!(
                "`cpu.idle.park-after-us` ({}) is shorter than `cpu.idle.backoff-max-us` ({})",
                idle.park_after_us, idle.backoff_max_us
            ),
            format!("at least {}", idle.backoff_max_us),
        );
    }
    let spinners = c.poll_cores.len().max(1);
    if idle.policy == IdlePolicy::Spin && spinners >= host.cores.len() {
        s.warn(
            p!("cpu", "idle", "policy"),
            format!("{spinners} spinning poll thread(s) on {} usable core(s) leave none for the control thread and apps", host.cores.len()),
            "use `policy = \"backoff\"` on laptops, CI and shared hosts".to_string(),
        );
    }
}

fn provider(s: &mut Sink<'_, '_>, p: &Provider) {
    s.range(p!("provider", "ibv", "port"), p.ibv.port.into(), 1, 255);
    s.range(
        p!("provider", "ibv", "gid-index"),
        p.ibv.gid_index.into(),
        0,
        255,
    );
    s.range(p!("provider", "ibv", "ird"), p.ibv.ird.into(), 1, 255);
    s.range(p!("provider", "ibv", "ord"), p.ibv.ord.into(), 1, 255);
    if let Some(dev) = &p.ibv.device {
        if dev.is_empty() {
            s.error(
                p!("provider", "ibv", "device"),
                "`provider.ibv.device` is empty".into(),
                "a device name such as \"mlx5_0\", or omit the key for the first device"
                    .to_string(),
            );
        }
    }
    let soft = &p.soft;
    // An FPDU carries a 2-byte length, at least a 14-byte DDP/RDMAP header and a 4-byte CRC;
    // ULPDU_Length is 16 bits (RFC 5044).
    s.range(
        p!("provider", "soft", "fpdu-size"),
        soft.fpdu_size.into(),
        256,
        65_535,
    );
    if !matches!(soft.mpa_revision, 1 | 2) {
        s.error(
            p!("provider", "soft", "mpa-revision"),
            format!("MPA revision {} does not exist", soft.mpa_revision),
            "allowed: 1, 2".to_string(),
        );
    } else if soft.mpa_revision == 1 {
        s.warn(
            p!("provider", "soft", "mpa-revision"),
            "MPA revision 1 carries no IRD/ORD: the Linux NFS server refuses such clients".into(),
            "use 2 unless the peer only speaks revision 1".to_string(),
        );
    }
    s.range(p!("provider", "soft", "ird"), soft.ird.into(), 1, 128);
    s.range(p!("provider", "soft", "ord"), soft.ord.into(), 1, 128);
    s.range(
        p!("provider", "soft", "max-pending"),
        soft.max_pending.into(),
        1,
        65_536,
    );
}

/// Checks a size advertised in RFC 8797 private data: 1 KiB..=256 KiB, exact only in whole KiB.
fn rfc8797_size(s: &mut Sink<'_, '_>, path: Path, v: u32) {
    let name = path.render();
    if !(MIN_INLINE_SIZE..=RFC8797_MAX_SIZE).contains(&v) {
        s.error(
            path,
            format!("`{name}` = {v} cannot be advertised (RFC 8797 expresses 1 KiB to 256 KiB)"),
            format!("allowed: {MIN_INLINE_SIZE}..={RFC8797_MAX_SIZE}, a multiple of 1024"),
        );
    } else if v % 1024 != 0 {
        let down = v / 1024 * 1024;
        s.warn(
            path,
            format!("`{name}` = {v} is not a multiple of 1024 and will be advertised as {down}"),
            format!("use {down} or {}", down + 1024),
        );
    }
}

fn transport(s: &mut Sink<'_, '_>, t: &Transport) {
    if !matches!(t.version, 1 | 2) {
        s.error(
            p!("transport", "version"),
            format!("RPC-over-RDMA version {} is not supported", t.version),
            "allowed: 1, 2".to_string(),
        );
    }
    rfc8797_size(s, p!("transport", "inline-send"), t.inline_send);
    rfc8797_size(s, p!("transport", "inline-recv"), t.inline_recv);
    if t.version == 2 && t.inline_recv < 4096 {
        s.cross(
            p!("transport", "inline-recv"),
            &[p!("transport", "version")],
            format!(
                "version 2 receivers must post receives of at least 4096 bytes (V2-2.3-a), not {}",
                t.inline_recv
            ),
            "at least 4096 with `transport.version = 2`".to_string(),
        );
    }
    s.range(p!("transport", "credits"), t.credits.into(), 1, 4096);
    if s.range(
        p!("transport", "backchannel-credits"),
        t.backchannel_credits.into(),
        0,
        4096,
    ) && t.version == 2
        && t.backchannel_credits == 0
    {
        s.cross(
            p!("transport", "backchannel-credits"),
            &[p!("transport", "version")],
            "version 2 requires backward-direction support (V2-4.2.2-a), so it needs backchannel credits".into(),
            "at least 1 with `transport.version = 2`".to_string(),
        );
    }
    s.range(
        p!("transport", "ddp-threshold"),
        t.ddp_threshold.into(),
        1,
        RFC8797_MAX_SIZE.into(),
    );
    s.range(
        p!("transport", "max-segments-per-chunk"),
        t.max_segments_per_chunk.into(),
        1,
        16,
    );
    s.range(
        p!("transport", "max-chunks-per-list"),
        t.max_chunks_per_list.into(),
        1,
        4,
    );
    let header = max_header_size(t.max_chunks_per_list, t.max_segments_per_chunk);
    if t.inline_send >= MIN_INLINE_SIZE && header > u64::from(t.inline_send) {
        s.emit_cross(
            Severity::Warning,
            p!("transport", "max-segments-per-chunk"),
            &[
                p!("transport", "max-chunks-per-list"),
                p!("transport", "inline-send"),
            ],
            format!(
                "a call header using every allowed chunk and segment takes {header} bytes, more than `transport.inline-send` ({})",
                t.inline_send
            ),
            Some("lower `max-chunks-per-list` / `max-segments-per-chunk`, or raise `inline-send`".to_string()),
        );
    }
    s.range(
        p!("transport", "v2-first-message-timeout-ms"),
        t.v2_first_message_timeout_ms.into(),
        1,
        600_000,
    );
    let x = &t.xcharext;
    // XCH-7-a: sanity-check what a peer may request; below 1024 no RPC-over-RDMA peer works.
    s.range(
        p!("transport", "xcharext", "min-rbsiz"),
        x.min_rbsiz.into(),
        MIN_INLINE_SIZE.into(),
        u32::MAX.into(),
    );
    if x.max_rbsiz < x.min_rbsiz {
        s.cross(
            p!("transport", "xcharext", "max-rbsiz"),
            &[p!("transport", "xcharext", "min-rbsiz")],
            format!(
                "`transport.xcharext.max-rbsiz` ({}) is below `min-rbsiz` ({})",
                x.max_rbsiz, x.min_rbsiz
            ),
            format!("at least {}", x.min_rbsiz),
        );
    }
}

/// Bytes of an RPC-over-RDMA v1 call header with full Read and Write lists and a Reply chunk
/// (RFC 8166 §4: 16 fixed; read segment 24 with its list discriminator and position; write chunk
/// 8 plus 16 per segment; 4 per list terminator).
fn max_header_size(chunks: u32, segs: u32) -> u64 {
    let (chunks, segs) = (u64::from(chunks), u64::from(segs));
    let reads = chunks * segs * 24 + 4;
    let writes = chunks * (8 + segs * 16) + 4;
    let reply = 8 + segs * 16;
    16 + reads + writes + reply
}

fn pools(s: &mut Sink<'_, '_>, p: &Pools, t: &Transport) {
    s.range(p!("pools", "connections"), p.connections.into(), 1, 65_536);
    if p.send_buffer_size < t.inline_send {
        s.cross(
            p!("pools", "send-buffer-size"),
            &[p!("transport", "inline-send")],
            format!("send buffers of {} bytes cannot hold an inline Send of `transport.inline-send` = {}", p.send_buffer_size, t.inline_send),
            format!("at least {}", t.inline_send),
        );
    }
    let need_recv = t.inline_recv.max(t.xcharext.max_rbsiz);
    if p.recv_buffer_size < need_recv {
        s.cross(
            p!("pools", "recv-buffer-size"),
            &[p!("transport", "inline-recv"), p!("transport", "xcharext", "max-rbsiz")],
            format!(
                "receive buffers of {} bytes are smaller than `transport.inline-recv` ({}) or `transport.xcharext.max-rbsiz` ({})",
                p.recv_buffer_size, t.inline_recv, t.xcharext.max_rbsiz
            ),
            format!("at least {need_recv}"),
        );
    }
    // Buffers of their own per connection: full credits, nothing shared to divide (the
    // poll thread refuses to start if the blocks pass 4 GiB).
    if p.receive_queue == ReceiveQueue::PerConnection {
        return;
    }
    // One shared receive queue per poll thread: each connection slot owns
    // `recv-buffers / connections` of its buffers, one kept spare for one-way v2 optional
    // messages (AMB-19), the rest its credits and backchannel credits, scaled down to fit
    // (the grant never exceeds the receives posted, R8166-3.3.1-g/h).
    let conns = p.connections.max(1);
    let share = p.recv_buffers / conns;
    let also = [
        p!("pools", "connections"),
        p!("transport", "credits"),
        p!("transport", "backchannel-credits"),
    ];
    let Some((credits, bc)) = divide_share(t.credits, t.backchannel_credits, share) else {
        let min = 2 + u64::from(t.backchannel_credits > 0);
        s.cross(
            p!("pools", "recv-buffers"),
            &also,
            format!(
                "`pools.recv-buffers` = {} cannot give each of {} connection(s) one credit{} and one spare receive",
                p.recv_buffers,
                p.connections,
                if t.backchannel_credits > 0 { ", one backchannel credit" } else { "" }
            ),
            format!("at least {}", min * u64::from(conns)),
        );
        return;
    };
    if (credits, bc) != (t.credits, t.backchannel_credits) {
        let full = (u64::from(t.credits) + u64::from(t.backchannel_credits) + 1) * u64::from(conns);
        s.warn(
            p!("pools", "recv-buffers"),
            format!(
                "`pools.recv-buffers` = {} shared by {} connection(s) caps each connection at {credits} credits and {bc} backchannel credits (configured {} and {})",
                p.recv_buffers, p.connections, t.credits, t.backchannel_credits
            ),
            format!("{full} buffers give every connection its full credits"),
        );
    }
    // The shared send pool covers what every connection may have in flight at once: calls up
    // to its credits plus answers to calls in progress, plus one.
    let per_conn = u64::from(credits) + u64::from(credits + bc) + 1;
    let need = per_conn * u64::from(conns);
    if u64::from(p.send_buffers) < need {
        s.cross(
            p!("pools", "send-buffers"),
            &also,
            format!(
                "`pools.send-buffers` = {} is too few for {} connection(s) x ({credits} calls in flight + {} calls in progress + 1)",
                p.send_buffers, p.connections, credits + bc
            ),
            format!("at least {need}"),
        );
    }
}

/// The poll thread's own rule for the credits a share of receives holds (one definition, in
/// `rpcrdma-proto`, for the checker and the poll thread).
pub use rpcrdma_proto::credits::divide_share;

/// Parses `ip:port`, `[v6]:port` or a bare IP (port 20049).
pub fn parse_address(a: &str) -> Option<SocketAddr> {
    a.parse::<SocketAddr>().ok().or_else(|| {
        a.parse::<IpAddr>()
            .ok()
            .map(|ip| SocketAddr::new(ip, DEFAULT_PORT))
    })
}

const ADDRESS_HINT: &str =
    "ip:port, [ipv6]:port, or a bare ip (port 20049), e.g. \"192.0.2.1:20049\"";

/// A network of a listener's allow list: CIDR (`192.0.2.0/24`, `2001:db8::/32`) or a bare
/// address (one host). Host bits are cleared (`192.0.2.7/24` is `192.0.2.0/24`).
pub fn parse_network(a: &str) -> Option<IpNet> {
    a.parse::<IpNet>()
        .ok()
        .or_else(|| a.parse::<IpAddr>().ok().map(IpNet::from))
        .map(|n| n.trunc())
}

const NETWORK_HINT: &str = "a network in CIDR notation or an address, e.g. \"192.0.2.0/24\", \"2001:db8::/32\", \"192.0.2.7\"";

fn listeners(s: &mut Sink<'_, '_>, ls: &[Listener], mem: bool) {
    let mut seen = HashSet::new();
    for (i, l) in ls.iter().enumerate() {
        for (j, a) in l.allow.iter().enumerate() {
            match parse_network(a) {
                None => s.error(
                    p!("listeners", [i], "allow", [j]),
                    format!("{a:?} is not a network or an address"),
                    NETWORK_HINT.to_string(),
                ),
                Some(n) if a.contains('/') && a.parse::<IpNet>().is_ok_and(|m| m != n) => s.warn(
                    p!("listeners", [i], "allow", [j]),
                    format!("{a} has host bits set: it is taken as {n}"),
                    format!("write \"{n}\""),
                ),
                Some(_) => {}
            }
        }
        if mem && !l.allow.is_empty() {
            s.error(
                p!("listeners", [i], "allow"),
                "the in-memory provider's connections have no address: this allow list would refuse every one".to_string(),
                "remove `allow`, or use the soft or ibv provider".to_string(),
            );
        }
        s.range(
            p!("listeners", [i], "max-connections-per-host"),
            u64::from(l.max_connections_per_host),
            0,
            65536,
        );
        s.range(
            p!("listeners", [i], "connect-rate-per-host"),
            u64::from(l.connect_rate_per_host),
            0,
            1_000_000,
        );
        match parse_address(&l.address) {
            None => s.error(
                p!("listeners", [i], "address"),
                format!("listener address {:?} does not parse", l.address),
                ADDRESS_HINT.to_string(),
            ),
            Some(addr) if !seen.insert(addr) => s.error(
                p!("listeners", [i], "address"),
                format!("listener address {addr} is configured twice"),
                "one listener per address".to_string(),
            ),
            Some(_) => {}
        }
    }
}

fn peers(s: &mut Sink<'_, '_>, ps: &[Peer]) {
    let mut names = HashSet::new();
    for (i, p) in ps.iter().enumerate() {
        if p.name.is_empty() {
            s.error(
                p!("peers", [i], "name"),
                "peer name is empty".into(),
                "a unique non-empty name".to_string(),
            );
        } else if !names.insert(p.name.as_str()) {
            s.error(
                p!("peers", [i], "name"),
                format!("peer name {:?} is used twice", p.name),
                "peer names must be unique".to_string(),
            );
        }
        if parse_address(&p.address).is_none() {
            s.error(
                p!("peers", [i], "address"),
                format!("peer address {:?} does not parse", p.address),
                ADDRESS_HINT.to_string(),
            );
        }
        s.range(
            p!("peers", [i], "reconnect-initial-ms"),
            p.reconnect_initial_ms.into(),
            1,
            3_600_000,
        );
        if p.reconnect_max_ms < p.reconnect_initial_ms {
            s.cross(
                p!("peers", [i], "reconnect-max-ms"),
                &[p!("peers", [i], "reconnect-initial-ms")],
                format!(
                    "`reconnect-max-ms` ({}) is below `reconnect-initial-ms` ({})",
                    p.reconnect_max_ms, p.reconnect_initial_ms
                ),
                format!("at least {}", p.reconnect_initial_ms),
            );
        }
    }
}

/// The in-memory provider's fabric lives inside one daemon: it cannot be mixed with another
/// provider, and each peer must be one of the daemon's own listeners.
fn mem_wiring(s: &mut Sink<'_, '_>, cfg: &Config) {
    let mem = cfg.provider.kind == ProviderKind::Mem;
    let mixed = |p: Option<ProviderKind>| p.is_some_and(|p| (p == ProviderKind::Mem) != mem);
    const MIXED: &str =
        "the in-memory provider cannot be mixed with another provider in one daemon";
    let hint = "leave `provider` out here (it then follows `provider.kind`)".to_string();
    for (i, l) in cfg.listeners.iter().enumerate() {
        if mixed(l.provider) {
            s.error(p!("listeners", [i], "provider"), MIXED.into(), hint.clone());
        }
    }
    for (i, p) in cfg.peers.iter().enumerate() {
        if mixed(p.provider) {
            s.error(p!("peers", [i], "provider"), MIXED.into(), hint.clone());
        }
    }
    if !mem {
        return;
    }
    let own: Vec<SocketAddr> = cfg
        .listeners
        .iter()
        .filter_map(|l| parse_address(&l.address))
        .filter(|a| a.port() != 0)
        .collect();
    for (i, p) in cfg.peers.iter().enumerate() {
        let Some(addr) = parse_address(&p.address) else {
            continue; // already reported
        };
        if own.contains(&addr) {
            continue;
        }
        let hint = match own.first() {
            None => "add a [[listeners]] entry with a fixed port and name it here".to_string(),
            Some(_) => format!(
                "one of this daemon's listeners: {}",
                own.iter()
                    .map(|a| a.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        s.cross(
            p!("peers", [i], "address"),
            &[p!("provider", "kind")],
            format!(
                "peer {:?} at {addr} names no listener of this daemon; with provider.kind = \"mem\" \
                 peers connect through memory to the daemon's own listeners",
                p.name
            ),
            hint,
        );
    }
}

fn apps(s: &mut Sink<'_, '_>, a: &Apps) {
    s.range(p!("apps", "max-apps"), a.max_apps.into(), 1, 4096);
    for (key, v) in [("sq-entries", a.sq_entries), ("cq-entries", a.cq_entries)] {
        if !v.is_power_of_two() || !(2..=65_536).contains(&v) {
            s.error(
                p!("apps", key),
                format!("`apps.{key}` = {v} is not a power of two between 2 and 65536"),
                "allowed: 2, 4, 8, ..., 65536".to_string(),
            );
        }
    }
    if a.arena_size % 4096 != 0 || !(64 * 1024..=1 << 32).contains(&a.arena_size) {
        s.error(
            p!("apps", "arena-size"),
            format!(
                "`apps.arena-size` = {} is not a multiple of 4096 between 64 KiB and 4 GiB",
                a.arena_size
            ),
            "allowed: 65536..=4294967296, a multiple of 4096".to_string(),
        );
    }
}
