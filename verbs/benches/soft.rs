//! Soft provider figures (plain timing loops, not a test):
//! 1. soft over TCP, RDMA Write of 1 MiB: GB/s against a plain TCP loopback stream in the same
//!    run (two threads each: one per endpoint);
//! 2. soft in memory, SEND+RECV of 64 bytes: ns per message (one thread drives both ends).
//!
//! Run: `cargo bench -p rpcrdma-verbs --bench soft` (release profile). The TCP endpoints spin
//! and yield when a poll finds nothing (`SOFT_BENCH_SPIN=1`: pure spin); the in-memory loop
//! spins. `SOFT_BENCH=tcp` or `SOFT_BENCH=mem` runs one half.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rpcrdma_verbs::soft::link::MemFabric;
use rpcrdma_verbs::soft::{SoftConfig, SoftMem, SoftProvider};
use rpcrdma_verbs::{
    Access, CmEvent, ConnParams, CqId, Mr, Provider, QpId, QpInit, SendOp, SendWr, Sge,
    WorkCompletion,
};

const MIB: usize = 1 << 20;

/// Whether idle polls yield (TCP part only; the in-memory part spins).
static YIELD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

struct End<P> {
    p: P,
    cq: CqId,
    qp: QpId,
    mr: Mr,
    init: QpInit,
    _buf: Vec<u8>,
}

fn end<P: Provider>(mut p: P, len: usize) -> End<P> {
    let pd = p.alloc_pd().unwrap();
    let cq = p.create_cq(4096).unwrap();
    let mut buf = vec![1u8; len];
    // SAFETY: `buf` lives in the returned `End` together with the provider and is never resized.
    let mr = unsafe {
        p.register(
            pd,
            buf.as_mut_ptr(),
            len,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
    }
    .unwrap();
    let init = QpInit {
        pd,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        max_send_wr: 1024,
        max_recv_wr: 1024,
        max_sge: 1,
    };
    End {
        p,
        cq,
        qp: QpId(0),
        mr,
        init,
        _buf: buf,
    }
}

fn params() -> ConnParams<'static> {
    ConnParams {
        private_data: &[],
        responder_resources: 16,
        initiator_depth: 16,
    }
}

fn sge<P>(e: &End<P>, off: usize, len: usize) -> Sge {
    Sge {
        addr: e.mr.addr_at(off as u64),
        len: len as u32,
        lkey: e.mr.lkey,
    }
}

/// Poll once; when nothing completed, yield the core (idle policy: spin + sched_yield, so two
/// busy endpoints on a shared 2-core machine do not starve the kernel's TCP work).
fn poll<P: Provider>(e: &mut End<P>, wcs: &mut [WorkCompletion]) -> usize {
    let n = e.p.poll_cq(e.cq, wcs).unwrap();
    if n == 0 && YIELD.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::yield_now();
    }
    for w in &wcs[..n] {
        assert_eq!(w.status, rpcrdma_verbs::WcStatus::Success, "{w:?}");
    }
    n
}

/// Plain TCP: one thread writes `total` bytes in 1 MiB writes, the other reads them and
/// answers one byte.
fn plain_tcp(total: usize) -> f64 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = vec![0u8; MIB];
        let mut got = 0;
        while got < total {
            got += s.read(&mut buf).unwrap();
        }
        s.write_all(&[1]).unwrap();
    });
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_nodelay(true).unwrap();
    let buf = vec![7u8; MIB];
    let t = Instant::now();
    for _ in 0..total / MIB {
        c.write_all(&buf).unwrap();
    }
    let mut b = [0u8; 1];
    c.read_exact(&mut b).unwrap();
    let dt = t.elapsed();
    server.join().unwrap();
    total as f64 / dt.as_secs_f64() / 1e9
}

/// Soft over TCP: the client posts `total / 1 MiB` RDMA Writes of 1 MiB then a Send; the
/// server (own thread, polling) answers with a Send once the first Send arrived.
fn soft_tcp_write(total: usize, cfg: SoftConfig) -> f64 {
    let (tx, rx) = mpsc::channel();
    let server = std::thread::spawn(move || {
        let mut s = end(SoftProvider::tcp(cfg).unwrap(), 2 * MIB);
        let l = s.p.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        tx.send((s.p.listen_addr(l).unwrap(), s.mr.rkey, s.mr.addr))
            .unwrap();
        let req = loop {
            if let Some(CmEvent::ConnectRequest { req, .. }) = s.p.poll_cm() {
                break req;
            }
        };
        s.qp = s.p.create_qp(&s.init).unwrap();
        let r = sge(&s, MIB, 64);
        s.p.post_recv(s.qp, 1, &[r]).unwrap();
        s.p.accept(req, s.qp, &params()).unwrap();
        let mut wcs = [WorkCompletion::default(); 16];
        loop {
            let n = poll(&mut s, &mut wcs);
            if wcs[..n].iter().any(|w| w.wr_id == 1) {
                break;
            }
        }
        let g = sge(&s, MIB, 8);
        s.p.post_send(
            s.qp,
            &SendWr {
                wr_id: 2,
                op: SendOp::Send,
                sg: &[g],
                signaled: true,
            },
        )
        .unwrap();
        loop {
            let n = poll(&mut s, &mut wcs);
            if wcs[..n].iter().any(|w| w.wr_id == 2) {
                break;
            }
        }
        // Keep polling briefly so the last bytes leave before the socket closes.
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(50) {
            poll(&mut s, &mut wcs);
        }
    });
    let (addr, rkey, raddr) = rx.recv().unwrap();
    let mut c = end(SoftProvider::tcp(cfg).unwrap(), 2 * MIB);
    c.qp = c.p.create_qp(&c.init).unwrap();
    c.p.connect(c.qp, addr, &params()).unwrap();
    loop {
        match c.p.poll_cm() {
            Some(CmEvent::Established { .. }) => break,
            Some(e) => panic!("{e:?}"),
            None => {}
        }
    }
    let r = sge(&c, MIB, 64);
    c.p.post_recv(c.qp, 9, &[r]).unwrap();
    let mut wcs = [WorkCompletion::default(); 16];
    let w = sge(&c, 0, MIB);
    let n = total / MIB;
    let t = Instant::now();
    let mut posted = 0;
    let mut done = 0;
    while done < n {
        while posted < n && posted - done < 8 {
            c.p.post_send(
                c.qp,
                &SendWr {
                    wr_id: 100 + posted as u64,
                    op: SendOp::RdmaWrite {
                        remote_addr: raddr,
                        rkey,
                    },
                    sg: &[w],
                    signaled: true,
                },
            )
            .unwrap();
            posted += 1;
        }
        done += poll(&mut c, &mut wcs);
    }
    let g = sge(&c, 0, 8);
    c.p.post_send(
        c.qp,
        &SendWr {
            wr_id: 3,
            op: SendOp::Send,
            sg: &[g],
            signaled: false,
        },
    )
    .unwrap();
    loop {
        let k = poll(&mut c, &mut wcs);
        if wcs[..k].iter().any(|w| w.wr_id == 9) {
            break;
        }
    }
    let dt = t.elapsed();
    server.join().unwrap();
    total as f64 / dt.as_secs_f64() / 1e9
}

/// In memory, one thread: batches of 64-byte SEND into pre-posted receives; ns per message.
fn mem_send_recv(msgs: usize, cfg: SoftConfig) -> f64 {
    let f = MemFabric::new();
    let mut a = end(SoftProvider::memory(&f, cfg), MIB);
    let mut b = end(SoftProvider::memory(&f, cfg), MIB);
    let l = b.p.listen("10.0.0.1:1".parse().unwrap()).unwrap();
    let addr = b.p.listen_addr(l).unwrap();
    a.qp = a.p.create_qp(&a.init).unwrap();
    a.p.connect(a.qp, addr, &params()).unwrap();
    let req = loop {
        let _ = a.p.poll_cm();
        if let Some(CmEvent::ConnectRequest { req, .. }) = b.p.poll_cm() {
            break req;
        }
    };
    b.qp = b.p.create_qp(&b.init).unwrap();
    b.p.accept(req, b.qp, &params()).unwrap();
    while !matches!(a.p.poll_cm(), Some(CmEvent::Established { .. })) {
        let _ = b.p.poll_cm();
    }
    const BATCH: usize = 32;
    let mut wcs = [WorkCompletion::default(); BATCH];
    let run =
        |a: &mut End<SoftMem>, b: &mut End<SoftMem>, wcs: &mut [WorkCompletion], rounds: usize| {
            for _ in 0..rounds {
                for i in 0..BATCH {
                    let r = sge(b, i * 64, 64);
                    b.p.post_recv(b.qp, i as u64, &[r]).unwrap();
                }
                for i in 0..BATCH {
                    let g = sge(a, i * 64, 64);
                    a.p.post_send(
                        a.qp,
                        &SendWr {
                            wr_id: i as u64,
                            op: SendOp::Send,
                            sg: &[g],
                            signaled: i == BATCH - 1,
                        },
                    )
                    .unwrap();
                }
                let mut sent = 0;
                let mut got = 0;
                while got < BATCH || sent < 1 {
                    sent += poll(a, wcs);
                    got += poll(b, wcs);
                }
            }
        };
    run(&mut a, &mut b, &mut wcs, 1000);
    let rounds = msgs / BATCH;
    let t = Instant::now();
    run(&mut a, &mut b, &mut wcs, rounds);
    t.elapsed().as_nanos() as f64 / (rounds * BATCH) as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let crc_on = SoftConfig::default();
    let crc_off = SoftConfig {
        crc: false,
        ..SoftConfig::default()
    };
    // SOFT_BENCH=tcp or SOFT_BENCH=mem runs one half (e.g. under a profiler).
    let only = std::env::var("SOFT_BENCH").unwrap_or_default();
    let total = 2048 * MIB;
    if only != "mem" {
        let _ = plain_tcp(256 * MIB);
    }
    let rounds = 5;
    YIELD.store(
        std::env::var("SOFT_BENCH_SPIN").is_err(),
        std::sync::atomic::Ordering::Relaxed,
    );
    let (mut plain, mut on, mut off) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        if only == "mem" {
            break;
        }
        let p = plain_tcp(total);
        let c = soft_tcp_write(total, crc_on);
        let n = soft_tcp_write(total, crc_off);
        println!(
            "round {round}: TCP loopback 1 MiB: plain {p:.2} GB/s | soft RDMA Write CRC on {c:.2} GB/s (ratio {:.2}) | CRC off {n:.2} GB/s (ratio {:.2})",
            c / p,
            n / p
        );
        plain.push(p);
        on.push(c);
        off.push(n);
    }
    if !plain.is_empty() {
        let (p, c, n) = (median(&mut plain), median(&mut on), median(&mut off));
        println!(
            "median of {rounds}: plain {p:.2} GB/s | soft CRC on {c:.2} GB/s (ratio {:.2}) | soft CRC off {n:.2} GB/s (ratio {:.2})",
            c / p,
            n / p
        );
    }
    YIELD.store(false, std::sync::atomic::Ordering::Relaxed);
    for round in 0..3 {
        if only == "tcp" {
            break;
        }
        let off = mem_send_recv(2_000_000, crc_off);
        let on = mem_send_recv(2_000_000, crc_on);
        println!("round {round}: in-memory SEND+RECV 64 B: {off:.0} ns/msg (CRC off), {on:.0} ns/msg (CRC on)");
    }
}
