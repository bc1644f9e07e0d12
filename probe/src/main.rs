//! `nfs-probe`: runs the NFSv3 probe steps through rpcrdmad; see README.md for the flags.
#![forbid(unsafe_code)]

use rpcrdma_nfsprobe::nfs::{pattern_at, Nfs};
use rpcrdma_nfsprobe::probe::{self, Expect};
use rpcrdma_nfsprobe::tcprpc;
use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

const USAGE: &str = "usage:
  nfs-probe run --socket PATH --peer NAME (--mount-server HOST[:PORT] --export PATH | --root-fh HEX)
                [--mount-port N] [--read-file NAME] [--read-size N] [--read-seed N] [--write-file NAME]
                [--dir NAME] [--dir-entries N] [--random-seed N] [--random-rounds N] [--long-size N]
                [--inflight N] [--rdp-maxcount N] [--timeout-ms N] [--nfs4] [--deleg-file NAME]
                [--auth-sys | --auth-as UID:GID] [--json]
  nfs-probe gen --seed N --size N        (writes the pattern file content to stdout)
  nfs-probe serve --socket PATH --mount-listen ADDR [--dir-entries N] [--read-size N] [--read-seed N]
                                         (serves the in-memory NFSv3 subset behind a daemon)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("run") => match run(&args[1..]) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                eprintln!("nfs-probe: {e}");
                ExitCode::from(2)
            }
        },
        Some("serve") => match serve(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("nfs-probe: {e}");
                ExitCode::from(2)
            }
        },
        Some("gen") => match gen(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("nfs-probe: {e}\n{USAGE}");
                ExitCode::from(2)
            }
        },
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// Parsed `--flag value` pairs and bare `--flag`s.
struct Flags(Vec<(String, Option<String>)>);

impl Flags {
    fn parse(a: &[String], bare: &[&str]) -> Result<Flags, String> {
        let mut v = Vec::new();
        let mut it = a.iter();
        while let Some(k) = it.next() {
            let name = k
                .strip_prefix("--")
                .ok_or_else(|| format!("unexpected argument {k:?}\n{USAGE}"))?;
            if bare.contains(&name) {
                v.push((name.to_string(), None));
            } else {
                let val = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
                v.push((name.to_string(), Some(val.clone())));
            }
        }
        Ok(Flags(v))
    }

    fn str(&self, k: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(n, _)| n == k)
            .and_then(|(_, v)| v.as_deref())
    }

    fn has(&self, k: &str) -> bool {
        self.0.iter().any(|(n, _)| n == k)
    }

    fn num<T: std::str::FromStr>(&self, k: &str, d: T) -> Result<T, String> {
        match self.str(k) {
            None => Ok(d),
            Some(s) => s.parse().map_err(|_| format!("--{k}: bad number {s:?}")),
        }
    }

    fn need(&self, k: &str) -> Result<&str, String> {
        self.str(k)
            .ok_or_else(|| format!("--{k} is required\n{USAGE}"))
    }
}

fn gen(a: &[String]) -> Result<(), String> {
    let f = Flags::parse(a, &[])?;
    let seed: u32 = f.num("seed", 7)?;
    let size: u64 = f.num("size", 2 << 20)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut off = 0u64;
    while off < size {
        let n = (size - off).min(1 << 20);
        out.write_all(&pattern_at(seed, off, n as usize))
            .map_err(|e| e.to_string())?;
        off += n;
    }
    out.flush().map_err(|e| e.to_string())
}

/// `nfs-probe serve`: the in-memory NFSv3 subset (`miniserver`) as an app of the daemon at
/// `--socket`, NFSv4.1 for the probe's `--nfs4` steps too, with MOUNT on TCP at `--mount-listen`
/// (port 0: any); prints "ready, MOUNT on ADDR" once registered, and serves until the daemon
/// goes away.
fn serve(a: &[String]) -> Result<(), String> {
    use rpcrdma_nfsprobe::miniserver::{mountd, Fs, MAX_IO};
    use rpcrdma_nfsprobe::nfs3;
    let f = Flags::parse(a, &[])?;
    let socket = f.need("socket")?;
    let l = std::net::TcpListener::bind(f.need("mount-listen")?)
        .map_err(|e| format!("--mount-listen: {e}"))?;
    let mount_addr = l.local_addr().map_err(|e| e.to_string())?;
    // Callbacks (a session's back channel) go out through an attachment of their own: the
    // serving one is busy with the call that makes them.
    let mut calls = rpcrdma_shm::Client::connect(socket).map_err(|e| format!("{socket}: {e}"))?;
    let mut fs = Fs::new(
        f.num("read-seed", 7)?,
        f.num("read-size", 2 << 20)?,
        f.num("dir-entries", 2000)?,
    )
    .with_callbacks(Box::new(move |peer, prog, proc_, auth, args| {
        let mut b = calls.call(peer, prog, rpcrdma_nfsprobe::callback::VERS, proc_);
        if let Some((uid, gid)) = auth {
            b.auth_sys(uid, gid);
        }
        rpcrdma_nfsprobe::nfs4::put_fixed(b.args(), args);
        b.max_reply(1024);
        let r = b
            .submit()
            .and_then(|t| calls.wait(t, Some(Duration::from_secs(10))));
        match r {
            Ok(r) if r.accept_stat == 0 => Some(r.body.to_vec()),
            Ok(r) => {
                eprintln!(
                    "callback {proc_} to peer {peer}: accept_stat {}",
                    r.accept_stat
                );
                None
            }
            Err(e) => {
                eprintln!("callback {proc_} to peer {peer}: {e}");
                None
            }
        }
    }));
    let mut server = rpcrdma_shm::Server::connect(socket).map_err(|e| format!("{socket}: {e}"))?;
    // Two calls of the largest READ or WRITE FSINFO offers, with their headers.
    server.receive_buffers(2, MAX_IO + 8192);
    // Both versions registered before "ready": a call that came first would be refused.
    for vers in [nfs3::VERS, 4] {
        server
            .start(nfs3::PROG, vers)
            .map_err(|e| format!("register NFS version {vers}: {e}"))?;
    }
    std::thread::spawn(move || mountd(l));
    println!("ready, MOUNT on {mount_addr}");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    server
        .serve(nfs3::PROG, nfs3::VERS, |c, r| fs.serve(c, r))
        .map_err(|e| e.to_string())
}

fn hex(s: &str) -> Result<Vec<u8>, String> {
    if s.len() % 2 != 0 || s.len() > 128 {
        return Err("--root-fh: even number of hex digits, at most 64 bytes".into());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            s.get(i..i + 2)
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .ok_or_else(|| "--root-fh: not hex".to_string())
        })
        .collect()
}

fn resolve(host: &str, default_port: u16) -> Result<SocketAddr, String> {
    let with_port = if host.parse::<SocketAddr>().is_ok()
        || host
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.contains(':') && p.parse::<u16>().is_ok())
    {
        host.to_string()
    } else {
        format!("{host}:{default_port}")
    };
    with_port
        .to_socket_addrs()
        .map_err(|e| format!("{host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host}: no address"))
}

fn root_handle(f: &Flags, timeout: Duration) -> Result<(Vec<u8>, String), String> {
    if let Some(h) = f.str("root-fh") {
        return Ok((hex(h)?, "root handle from --root-fh".into()));
    }
    let server = f.need("mount-server")?;
    let export = f.need("export")?;
    let mut addr = resolve(server, 111)?;
    if let Some(p) = f.str("mount-port") {
        addr.set_port(p.parse().map_err(|_| "--mount-port: bad port")?);
    } else {
        let port = tcprpc::getport(addr, tcprpc::MOUNT_PROG, tcprpc::MOUNT_VERS, timeout)
            .map_err(|e| format!("portmapper at {addr}: {e}"))?;
        if port == 0 {
            return Err(format!(
                "MOUNT v3/TCP not registered with the portmapper at {addr}"
            ));
        }
        addr.set_port(port);
    }
    let (fh, flavors) =
        tcprpc::mount(addr, export, timeout).map_err(|e| format!("MNT {export} at {addr}: {e}"))?;
    Ok((
        fh,
        format!("MNT {export} at {addr}: auth flavors {flavors:?}"),
    ))
}

/// The AUTH_SYS identity of `--auth-sys` (this process's own uid and gid) or `--auth-as
/// UID:GID` (root only: the daemon refuses another identity to other users); `None`: AUTH_NONE.
fn auth(f: &Flags) -> Result<Option<(u32, u32)>, String> {
    if let Some(v) = f.str("auth-as") {
        let bad = || format!("--auth-as: want UID:GID, got {v:?}");
        let (u, g) = v.split_once(':').ok_or_else(bad)?;
        return Ok(Some((
            u.parse().map_err(|_| bad())?,
            g.parse().map_err(|_| bad())?,
        )));
    }
    if !f.has("auth-sys") {
        return Ok(None);
    }
    // The owner of /proc/self is the process's effective uid and gid.
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata("/proc/self").map_err(|e| format!("--auth-sys: /proc/self: {e}"))?;
    Ok(Some((m.uid(), m.gid())))
}

fn run(a: &[String]) -> Result<bool, String> {
    let f = Flags::parse(a, &["json", "nfs4", "auth-sys"])?;
    let auth = auth(&f)?;
    let timeout = Duration::from_millis(f.num("timeout-ms", 30_000)?);
    let ex = Expect {
        read_file: f.str("read-file").unwrap_or("read.bin").into(),
        read_size: f.num("read-size", 2 << 20)?,
        read_seed: f.num("read-seed", 7)?,
        write_file: f.str("write-file").unwrap_or("write.bin").into(),
        dir: f.str("dir").unwrap_or("dir").into(),
        dir_entries: f.num("dir-entries", 2000)?,
        random_seed: f.num("random-seed", 1)?,
        random_rounds: f.num("random-rounds", 100)?,
        long_size: f.num("long-size", 64 << 10)?,
        inflight: f.num("inflight", 64)?,
        rdp_maxcount: f.num("rdp-maxcount", 256 << 10)?,
        nfs4: f.has("nfs4"),
        deleg_file: f.str("deleg-file").unwrap_or("deleg.bin").into(),
    };
    if ex.read_size < 1 << 20 {
        return Err("--read-size must be at least 1 MiB".into());
    }
    let json = f.has("json");
    let t0 = Instant::now();
    let mount = root_handle(&f, timeout);
    let mount_ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut steps = vec![probe::StepResult {
        name: "mount",
        pass: mount.is_ok(),
        ms: mount_ms,
        detail: match &mount {
            Ok((_, d)) => match auth {
                Some((uid, gid)) => format!("{d}; NFS calls as AUTH_SYS uid {uid} gid {gid}"),
                None => format!("{d}; NFS calls as AUTH_NONE"),
            },
            Err(e) => e.clone(),
        },
    }];
    if let Ok((root, _)) = &mount {
        match Nfs::connect(f.need("socket")?, f.need("peer")?, timeout) {
            Ok(mut nfs) => {
                nfs.auth = auth;
                steps.extend(probe::run(&mut nfs, root, &ex))
            }
            Err(e) => steps.push(probe::StepResult {
                name: "attach",
                pass: false,
                ms: 0.0,
                detail: e,
            }),
        }
    }
    let failed = steps.iter().filter(|s| !s.pass).count();
    if json {
        let v = serde_json::json!({
            "passed": steps.len() - failed,
            "failed": failed,
            "steps": steps.iter().map(|s| serde_json::json!({
                "name": s.name, "pass": s.pass, "ms": s.ms, "detail": s.detail,
            })).collect::<Vec<_>>(),
        });
        println!("{v}");
    } else {
        for s in &steps {
            println!(
                "{} {:<24} {:>10.3} ms  {}",
                if s.pass { "PASS" } else { "FAIL" },
                s.name,
                s.ms,
                s.detail
            );
        }
        println!("{} passed, {failed} failed", steps.len() - failed);
    }
    Ok(failed == 0)
}
