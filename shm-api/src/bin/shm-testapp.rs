//! Test apps for the multi-process tests: `shm-testapp <role> <socket-path> [args]`.
//!
//! Roles: `server` (serves RDMATEST; env `SHM_TESTAPP_SPIN_US` sets its busy-poll time, with `SHM_TESTAPP_YIELD` set it
//! yields the CPU between polls, `SHM_TESTAPP_DELAY_MS` makes it answer each call that much later),
//! `lent-read PEER` (a READ into a result buffer whose time limit passes before a slow server
//! answers: prints "timeout ok", "lent N" (calls whose memory the peer may still write),
//! "released ok" once the daemon hands the buffer back, and "after ok" when a READ after it comes
//! back whole), `callback` (serves RDMATEST_CB PING as a backchannel program),
//! `call-back CONN N` (a server-side app's N backward-direction PING calls of 8 to 1024 bytes over
//! the accepted connection CONN, the peer index its daemon gives it: prints "backward N ok"),
//! `echo PEER LEN` (one ECHO of LEN bytes carried in the call's body, not as a DDP piece, so
//! the daemon sends it inline or as a Long call by the peer's receive size: prints "echo LEN ok"),
//! `blackhole` (registers RDMATEST_CB v1 and never replies),
//! `inflight N` (submits N calls to the blackhole, prints "submitted", then waits to be killed),
//! `hostile SEED ROUNDS` (scribbles on its rings, indices, header and arena, and races the daemon;
//! some of its calls are well-formed and reach the peer, so it leaves with calls in flight).
use rpcrdma_shm::abi::{op, Cqe, Sqe};
use rpcrdma_shm::attach::connect;
use rpcrdma_shm::client::ReplyBuilder;
use rpcrdma_shm::rdmatest;
use rpcrdma_shm::{Client, Server, WaitPolicy};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (role, path) = match (a.get(1), a.get(2)) {
        (Some(r), Some(p)) => (r.as_str(), Path::new(p)),
        _ => {
            eprintln!("usage: shm-testapp <server|callback|call-back CONN N|echo PEER LEN|blackhole|inflight N|lent-read PEER|hostile SEED ROUNDS> <socket-path>");
            std::process::exit(2)
        }
    };
    let num = |i: usize, d: u64| a.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let r = match role {
        "server" => server(path),
        "blackhole" => blackhole(path),
        "callback" => callback(path),
        "call-back" => call_back(path, num(3, 0) as u32, num(4, 1) as u32),
        "echo" => echo(
            path,
            a.get(3).map_or("loopback", String::as_str),
            num(4, 64),
        ),
        "inflight" => inflight(path, num(3, 16) as usize),
        "lent-read" => lent_read(path, a.get(3).map_or("loopback", String::as_str)),
        "hostile" => hostile(path, num(3, 1), num(4, 4) as u32),
        _ => Err("unknown role".into()),
    };
    if let Err(e) = r {
        eprintln!("shm-testapp {role}: {e}");
        std::process::exit(1);
    }
}

type Res = Result<(), Box<dyn std::error::Error>>;

fn ready() {
    println!("ready");
    let _ = std::io::stdout().flush();
}

fn server(path: &Path) -> Res {
    let mut s = Server::connect(path)?;
    if let Some(us) = std::env::var("SHM_TESTAPP_SPIN_US")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        let spin = std::time::Duration::from_micros(us);
        s.set_wait(if std::env::var_os("SHM_TESTAPP_YIELD").is_some() {
            WaitPolicy::yielding(spin)
        } else {
            WaitPolicy::spin(spin)
        });
    }
    let delay = std::time::Duration::from_millis(
        std::env::var("SHM_TESTAPP_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    );
    s.start(rdmatest::PROG, rdmatest::VERS)?;
    ready();
    Ok(s.serve(rdmatest::PROG, rdmatest::VERS, |c, r| {
        std::thread::sleep(delay);
        rdmatest::handle(c, r)
    })?)
}

/// A READ of 64 KiB into a result buffer (the daemon offers a Write chunk) with a 50 ms time
/// limit, to a server slower than that: it ends TIMEOUT at once, its buffer lent; the server's
/// late RDMA Write lands in it; then the daemon releases it. A READ after it must come back
/// whole on the same connection.
fn lent_read(path: &Path, peer: &str) -> Res {
    const LEN: u32 = 65536;
    let mut c = Client::connect(path)?;
    let peer = c.peer(peer).ok_or("no such peer")?;
    let read = |c: &mut Client, seed: u32, limit: Option<std::time::Duration>| {
        let mut b = c.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::READ);
        b.args().put_u32(LEN).put_u32(seed);
        b.result_buffer(LEN);
        if let Some(l) = limit {
            b.timeout(l);
        }
        b.submit()
    };
    let t = read(&mut c, 7, Some(std::time::Duration::from_millis(50)))?;
    let wait = Some(std::time::Duration::from_secs(30));
    match c.wait(t, wait) {
        Err(rpcrdma_shm::client::Error::Status(rpcrdma_shm::abi::status::TIMEOUT)) => {
            println!("timeout ok")
        }
        other => return Err(format!("the READ with a time limit ended {other:?}").into()),
    }
    println!("lent {}", c.lent());
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while c.lent() > 0 {
        if std::time::Instant::now() > end {
            return Err("never released".into());
        }
        c.progress()?;
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    println!("released ok");
    let t = read(&mut c, 9, None)?;
    let r = c.wait(t, wait)?;
    if r.body.get(4..) != Some(&rdmatest::pattern(9, LEN as usize)[..]) {
        return Err("the READ after it came back wrong".into());
    }
    println!("after ok");
    Ok(())
}

/// Serves RDMATEST_CB PING (echo) as a callback program, the way a client app takes backward calls.
fn callback(path: &Path) -> Res {
    let mut s = Server::connect(path)?;
    s.register(rdmatest::CB_PROG, 1, true)?;
    s.start(rdmatest::CB_PROG, 1)?;
    ready();
    s.serve(
        rdmatest::CB_PROG,
        1,
        |c, r: &mut ReplyBuilder| match rdmatest::XdrReader::new(c.args).opaque() {
            Some(d) if c.proc_ == 1 => {
                r.xdr.put_opaque(d);
            }
            _ => r.accept_stat = rdmatest::GARBAGE_ARGS,
        },
    )?;
    Ok(())
}

/// `n` backward-direction PING calls (RDMATEST_CB proc 1) from a server-side app over the
/// accepted connection at peer index `conn`, sizes cycling from 8 to 1024 bytes, each answered
/// with its own bytes by the client side's `callback` app.
fn call_back(path: &Path, conn: u32, n: u32) -> Res {
    let mut c = Client::connect(path)?;
    for i in 0..n {
        let len = 8usize << (i % 8);
        if !echoed(
            &mut c,
            conn,
            (rdmatest::CB_PROG, 1, 1),
            &rdmatest::pattern(i, len),
        )? {
            return Err(format!("backward call {i} ({len} bytes) came back wrong").into());
        }
    }
    println!("backward {n} ok");
    Ok(())
}

/// One ECHO of `len` bytes in the call's body (no DDP piece), checked byte for byte.
fn echo(path: &Path, peer: &str, len: u64) -> Res {
    let mut c = Client::connect(path)?;
    let peer = c.peer(peer).ok_or("no such peer")?;
    let len = usize::try_from(len)?;
    let echo = (rdmatest::PROG, rdmatest::VERS, rdmatest::ECHO);
    if !echoed(&mut c, peer, echo, &rdmatest::pattern(len as u32, len))? {
        return Err("the ECHO came back wrong".into());
    }
    println!("echo {len} ok");
    Ok(())
}

/// Calls `(prog, vers, proc)` at `peer` with `data` as an opaque in the call's body (room for
/// it in the reply), within 20 s; whether it came back accepted with those very bytes.
fn echoed(
    c: &mut Client,
    peer: u32,
    (prog, vers, proc_): (u32, u32, u32),
    data: &[u8],
) -> Result<bool, Box<dyn std::error::Error>> {
    let mut b = c.call(peer, prog, vers, proc_);
    b.args().put_opaque(data);
    b.max_reply(u32::try_from(data.len())? + 256);
    let t = b.submit()?;
    let r = c.wait(t, Some(std::time::Duration::from_secs(20)))?;
    Ok(r.accept_stat == 0 && rdmatest::XdrReader::new(&r.body).opaque() == Some(data))
}

fn blackhole(path: &Path) -> Res {
    let mut s = Server::connect(path)?;
    s.start(rdmatest::CB_PROG, 1)?;
    ready();
    // The first call's handler never returns, so every later call stays delivered and unanswered.
    s.serve(rdmatest::CB_PROG, 1, |_c, _r: &mut ReplyBuilder| loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    })?;
    Ok(())
}

fn inflight(path: &Path, n: usize) -> Res {
    let mut c = Client::connect(path)?;
    let peer = c.peer("loopback").ok_or("no loopback peer")?;
    for i in 0..n {
        let mut b = c.call(peer, rdmatest::CB_PROG, 1, 1);
        b.args().put_opaque(&rdmatest::pattern(i as u32, 100));
        b.submit()?;
    }
    ready();
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One hostile attachment per round: valid-index random descriptors (a quarter of them
/// well-formed calls of unserved programs with garbage messages), then random indices and
/// scribbles.
fn hostile(path: &Path, seed: u64, rounds: u32) -> Res {
    let mut rng = Rng(seed | 1);
    // Every opcode, and an unknown one; DETACH seldom, as it ends the attachment.
    let hostile_opcode = |rng: &mut Rng| match rng.below(9) as u8 {
        op::DETACH if rng.below(1024) != 0 => op::CANCEL + 1,
        o => o,
    };
    // The user_data of a recent call, for CANCELs that name a call in flight.
    let mut last_call = 0u64;
    for _ in 0..rounds {
        let conn = connect(path)?;
        let g = conn.region.layout().geometry;
        let l = *conn.region.layout();
        let base = conn.region.base();
        let arena = g.arena_size as u64;
        // SAFETY: offsets come from this region's own layout; we only ever touch our own mapping.
        let word = |off: u32| unsafe { &*(base.add(off as usize) as *const AtomicU32) };
        let sq_tail = word(l.sq_offset);
        let sq_head = word(l.sq_offset + 64);
        let cq_tail = word(l.cq_offset);
        let cq_head = word(l.cq_offset + 64);
        let mut tail = 0u32;
        for _ in 0..3000 {
            let free = g.sq_entries - tail.wrapping_sub(sq_head.load(Ordering::Acquire));
            if free == 0 || free > g.sq_entries {
                std::thread::yield_now();
                cq_head.store(cq_tail.load(Ordering::Acquire), Ordering::Release);
                continue;
            }
            let mut d: Sqe = Sqe {
                opcode: hostile_opcode(&mut rng),
                flags: if rng.below(4) == 0 {
                    rng.next() as u8
                } else {
                    0
                },
                n_args: rng.below(10) as u8,
                n_results: rng.below(10) as u8,
                target: if rng.below(2) == 0 {
                    0
                } else {
                    rng.next() as u32
                },
                user_data: rng.next(),
                prog: rdmatest::CB_PROG + 1 + rng.below(3) as u32,
                vers: rng.below(3) as u32,
                proc_: rng.next() as u32,
                xid: rng.next() as u32,
                msg_off: rng.below(arena * 2) as u32,
                msg_len: if rng.below(2) == 0 {
                    rng.below(256) as u32
                } else {
                    rng.next() as u32
                },
                pieces_off: rng.below(arena + 64) as u32,
                reply_off: rng.below(arena) as u32,
                reply_len: rng.below(arena) as u32,
                timeout_ms: if rng.below(4) == 0 {
                    rng.next() as u32
                } else {
                    0
                },
                // Sometimes an identity with or without the flag (random flags above).
                auth_uid: if rng.below(8) == 0 {
                    rng.next() as u32
                } else {
                    0
                },
                auth_gid: 0,
            };
            if d.opcode == op::REPLY {
                d.target = rng.below(1 << 20) as u32;
            }
            if d.opcode == op::CANCEL && rng.below(2) == 0 {
                d.user_data = last_call;
            }
            if rng.below(4) == 0 {
                // A well-formed call to peer 0 of an unserved program whose message is
                // arena garbage: it passes validation and crosses the wire (a daemon's peer
                // answers it), so the app may die or scribble with calls in flight.
                d = Sqe {
                    opcode: op::CALL,
                    flags: (rng.below(2) as u8) * rpcrdma_shm::abi::flag::XID_APP,
                    n_args: 0,
                    n_results: 0,
                    target: 0,
                    msg_off: rng.below(arena - 4096) as u32,
                    msg_len: rng.below(2048) as u32,
                    reply_off: rng.below(arena - 8192) as u32,
                    reply_len: 4096,
                    // Some of them time out, in the daemon, while the peer may still answer.
                    timeout_ms: if rng.below(4) == 0 {
                        1 + rng.below(20) as u32
                    } else {
                        0
                    },
                    auth_uid: 0,
                    auth_gid: 0,
                    ..d
                };
            }
            if d.opcode == op::CALL {
                last_call = d.user_data;
            }
            let slot = l.sq_offset as usize + 128 + (tail & (g.sq_entries - 1)) as usize * 64;
            // SAFETY: the slot lies in our mapping's submission ring.
            unsafe { (base.add(slot) as *mut Sqe).write_volatile(d) };
            // Scribble piece tables in the arena too.
            let at = rng.below(arena - 64) & !7;
            // SAFETY: `at + 64 ≤ arena`, inside our mapping.
            unsafe {
                (base.add(l.arena_offset as usize + at as usize) as *mut [u64; 8])
                    .write_volatile([rng.next(); 8])
            };
            tail = tail.wrapping_add(1);
            sq_tail.store(tail, Ordering::Release);
            if rng.below(4) == 0 {
                // Rewrite the slot just published, racing the daemon's single copy of it.
                let junk = Sqe {
                    opcode: hostile_opcode(&mut rng),
                    msg_len: rng.next() as u32,
                    ..d
                };
                // SAFETY: the same slot as above, inside our mapping.
                unsafe { (base.add(slot) as *mut Sqe).write_volatile(junk) };
            }
            if rng.below(16) == 0 {
                // Drain our completion ring the lazy way: claim everything is read.
                let t = cq_tail.load(Ordering::Acquire);
                let mut last = Cqe::default();
                if t != cq_head.load(Ordering::Relaxed) {
                    let s = l.cq_offset as usize
                        + 128
                        + (t.wrapping_sub(1) & (g.cq_entries - 1)) as usize * 64;
                    // SAFETY: slot inside our completion ring.
                    last = unsafe { (base.add(s) as *const Cqe).read_volatile() };
                }
                std::hint::black_box(last);
                cq_head.store(t, Ordering::Release);
            }
            if rng.below(64) == 0 {
                let _ = rustix::net::send(&conn.sock, &[1], rustix::net::SendFlags::DONTWAIT);
            }
        }
        // Phase 2: impossible indices and header scribbles, racing the daemon.
        for _ in 0..200 {
            match rng.below(5) {
                0 => sq_tail.store(rng.next() as u32, Ordering::Release),
                1 => cq_head.store(rng.next() as u32, Ordering::Release),
                2 => sq_head.store(rng.next() as u32, Ordering::Release),
                3 => cq_tail.store(rng.next() as u32, Ordering::Release),
                _ => {
                    let at = rng.below(l.sq_offset as u64) as u32 & !3;
                    word(at).store(rng.next() as u32, Ordering::Relaxed);
                }
            }
            let _ = rustix::net::send(&conn.sock, &[1], rustix::net::SendFlags::DONTWAIT);
            std::thread::yield_now();
        }
        drop(conn);
    }
    ready();
    Ok(())
}
