//! Prints how a poll thread's memory scales with connections on the shared receive queue:
//! 10, 100 and 1000 connections, 32 credits and 4 KiB inline each, 2 calls per connection
//! over the in-memory soft provider (both ends, a client and a server driver of the same
//! plan, in one process; each size runs in a fresh child process so RSS figures are clean).
//!
//! `cargo run --release -p rpcrdma-dataplane --example pool_scaling [recv-buffers]`
#![forbid(unsafe_code)]

#[path = "../tests/support/scale.rs"]
mod scale;

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn row(conns: u32, recv_buffers: u32) {
    let f = scale::run(scale::Scenario {
        conns,
        credits: 32,
        inline: 4096,
        recv_buffers,
        calls: 2,
        overcommit: None,
        guard_secs: 600,
    });
    assert_eq!(
        (f.failed, f.closed),
        (0, 0),
        "every connection kept and served"
    );
    let d = |a: u64, b: u64| mib(a.saturating_sub(b));
    println!(
        "| {conns} | {} | {:.1} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} / {:.1} / {:.1} / {:.1} | {}/{conns} ({}) |",
        f.credits,
        mib(f.recv_registered),
        mib(f.recv_per_connection_blocks),
        mib(f.registered),
        mib(f.histograms),
        d(f.rss_after, f.rss_before),
        d(f.rss_drivers, f.rss_before),
        d(f.rss_client_qps, f.rss_drivers),
        d(f.rss_connected, f.rss_client_qps),
        d(f.rss_after, f.rss_connected),
        f.served,
        f.replies,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("row") {
        let n = |i: usize| {
            args.get(i)
                .and_then(|a| a.parse().ok())
                .expect("row CONNS RECV")
        };
        return row(n(2), n(3));
    }
    let recv_buffers: u32 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(12288);
    println!(
        "shared receive queue: {recv_buffers} x 4 KiB = {:.1} MiB; 32 credits requested, 4 KiB inline, 2 calls per connection",
        mib(u64::from(recv_buffers) * 4096)
    );
    println!(
        "| connections | credits each | receive MiB (shared queue) | receive MiB if per-connection blocks | registered MiB (send + receive) | histograms MiB | RSS growth MiB (both ends) | RSS: drivers / client QPs+engines / connected / calls | served (replies) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---|---:|");
    let me = std::env::current_exe().expect("own path");
    for conns in [10u32, 100, 1000] {
        let out = std::process::Command::new(&me)
            .args(["row", &conns.to_string(), &recv_buffers.to_string()])
            .output()
            .expect("run a row");
        print!("{}", String::from_utf8_lossy(&out.stdout));
        if !out.status.success() {
            eprint!("{}", String::from_utf8_lossy(&out.stderr));
            std::process::exit(1);
        }
    }
}
