//! Makes N RDMATEST SLEEP calls at once and times them, to see whether a server answers
//! calls side by side: `cargo run -p rpcrdma-shm --example sleep_calls -- /path/to/daemon.sock [N] [ms] [peer]`
//! (default 32 calls of 100 ms). A server that answers one call at a time takes N times as long.
use rpcrdma_shm::rdmatest;
use rpcrdma_shm::Client;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: sleep_calls <daemon-socket> [calls] [ms] [peer-name]")?;
    let calls: u32 = args.next().map_or(Ok(32), |a| a.parse())?;
    let ms: u32 = args.next().map_or(Ok(100), |a| a.parse())?;
    let name = args.next().unwrap_or_else(|| "loopback".into());
    let mut client = Client::connect(&path)?;
    let peer = client
        .peer(&name)
        .ok_or_else(|| format!("no peer {name:?}; known: {:?}", client.peers()))?;
    let start = Instant::now();
    for _ in 0..calls {
        let mut call = client.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::SLEEP);
        call.args().put_u32(ms.saturating_mul(1000));
        call.submit()?;
    }
    for _ in 0..calls {
        let (_, reply) = client.wait_any(Some(Duration::from_secs(60)))?;
        reply?;
    }
    println!(
        "{calls} SLEEP calls of {ms} ms, all at once: {:.3} s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
