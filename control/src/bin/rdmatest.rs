//! RDMATEST app (spec/TESTPROG.md) for demos and tests: `rdmatest serve APP_SOCKET` serves
//! the program through a daemon; `rdmatest call APP_SOCKET PEER [COUNT]` calls it through
//! another daemon (NULL, ECHO of several sizes, READ with DDP) and prints round-trip
//! percentiles; `rdmatest inflight APP_SOCKET PEER N` submits N one-second SLEEP calls, prints
//! "submitted" and waits to be killed.
#![forbid(unsafe_code)]

use hdrhistogram::Histogram;
use rpcrdma_shm::rdmatest::{self, pattern};
use rpcrdma_shm::{Client, Server};
use std::time::{Duration, Instant};

type Res = Result<(), Box<dyn std::error::Error>>;

fn serve(socket: &str) -> Res {
    let mut s = Server::connect(socket)?;
    // Room for the largest demo call (64 KiB ECHO) in each receive buffer.
    s.receive_buffers(8, 128 * 1024);
    s.start(rdmatest::PROG, rdmatest::VERS)?;
    println!("serving RDMATEST on {socket}");
    Ok(s.serve(rdmatest::PROG, rdmatest::VERS, rdmatest::handle)?)
}

fn call(socket: &str, peer_name: &str, count: u32) -> Res {
    let mut c = Client::connect(socket)?;
    let peer = c.peer(peer_name).ok_or_else(|| {
        format!(
            "the daemon has no peer named {peer_name:?}: {:?}",
            c.peers()
        )
    })?;
    let wait = Some(Duration::from_secs(10));
    let cases: [(&str, u32, usize); 5] = [
        ("NULL", rdmatest::NULL, 0),
        ("ECHO 64", rdmatest::ECHO, 64),
        ("ECHO 4000 (inline/long)", rdmatest::ECHO, 4000),
        ("ECHO 64K (read+write chunks)", rdmatest::ECHO, 65536),
        ("READ 256K (write chunk)", rdmatest::READ, 262_144),
    ];
    println!(
        "{:<30} {:>8} {:>10} {:>10} {:>10}",
        "CALL", "COUNT", "P50-US", "P99-US", "MAX-US"
    );
    for (name, proc_, len) in cases {
        let mut h = Histogram::<u64>::new(3)?;
        let data = pattern(7, len);
        for _ in 0..count {
            let mut b = c.call(peer, rdmatest::PROG, rdmatest::VERS, proc_);
            match proc_ {
                rdmatest::ECHO if len > 1024 => {
                    b.args().put_ddp_opaque(&data);
                    b.result_buffer(len as u32);
                }
                rdmatest::ECHO => {
                    b.args().put_opaque(&data);
                }
                rdmatest::READ => {
                    b.args().put_u32(len as u32).put_u32(7);
                    b.result_buffer(len as u32);
                }
                _ => {}
            }
            let t0 = Instant::now();
            let t = b.submit()?;
            let r = c.wait(t, wait)?;
            h.record(t0.elapsed().as_nanos() as u64)?;
            if r.accept_stat != 0 {
                return Err(format!("{name}: accept_stat {}", r.accept_stat).into());
            }
        }
        println!(
            "{:<30} {:>8} {:>10.1} {:>10.1} {:>10.1}",
            name,
            h.len(),
            h.value_at_quantile(0.5) as f64 / 1000.0,
            h.value_at_quantile(0.99) as f64 / 1000.0,
            h.max() as f64 / 1000.0
        );
    }
    Ok(())
}

fn inflight(socket: &str, peer_name: &str, n: u32) -> Res {
    let mut c = Client::connect(socket)?;
    let peer = c.peer(peer_name).ok_or("no such peer")?;
    for _ in 0..n {
        let mut b = c.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::SLEEP);
        b.args().put_u32(1_000_000);
        b.submit()?;
    }
    println!("submitted");
    use std::io::Write;
    std::io::stdout().flush()?;
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let r = match (a.get(1).map(String::as_str), a.get(2), a.get(3)) {
        (Some("serve"), Some(s), _) => serve(s),
        (Some("inflight"), Some(s), Some(p)) => {
            inflight(s, p, a.get(4).and_then(|n| n.parse().ok()).unwrap_or(4))
        }
        (Some("call"), Some(s), Some(p)) => {
            call(s, p, a.get(4).and_then(|n| n.parse().ok()).unwrap_or(1000))
        }
        _ => Err("usage: rdmatest serve APP_SOCKET | call APP_SOCKET PEER [COUNT] | inflight APP_SOCKET PEER N".into()),
    };
    if let Err(e) = r {
        eprintln!("rdmatest: {e}");
        std::process::exit(1);
    }
}
