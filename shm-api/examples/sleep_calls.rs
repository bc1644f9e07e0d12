//! Makes N RDMATEST SLEEP calls at once and times them, to see whether a server answers
//! calls side by side: `cargo run -p rpcrdma-shm --example sleep_calls -- /path/to/daemon.sock [N] [ms] [peer] [limit-ms]`
//! (default 32 calls of 100 ms). A server that answers one call at a time takes N times as long.
//! With `limit-ms`, each call gets that time limit (`CallBuilder::timeout`): the calls the
//! server has not answered by then end `TIMEOUT` (ABI.md §5), and the counts say how many.
use rpcrdma_shm::abi::status;
use rpcrdma_shm::client::Error;
use rpcrdma_shm::rdmatest;
use rpcrdma_shm::Client;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: sleep_calls <daemon-socket> [calls] [ms] [peer-name] [limit-ms]")?;
    let calls: u32 = args.next().map_or(Ok(32), |a| a.parse())?;
    let ms: u32 = args.next().map_or(Ok(100), |a| a.parse())?;
    let name = args.next().unwrap_or_else(|| "loopback".into());
    let limit: Option<u64> = args.next().map(|a| a.parse()).transpose()?;
    let mut client = Client::connect(&path)?;
    let peer = client
        .peer(&name)
        .ok_or_else(|| format!("no peer {name:?}; known: {:?}", client.peers()))?;
    let start = Instant::now();
    for _ in 0..calls {
        let mut call = client.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::SLEEP);
        call.args().put_u32(ms.saturating_mul(1000));
        if let Some(l) = limit {
            call.timeout(Duration::from_millis(l));
        }
        call.submit()?;
    }
    let (mut answered, mut timed_out) = (0u32, 0u32);
    for _ in 0..calls {
        let (_, reply) = client.wait_any(Some(Duration::from_secs(60)))?;
        match reply {
            Ok(_) => answered += 1,
            Err(Error::Status(status::TIMEOUT)) => timed_out += 1,
            Err(e) => return Err(e.into()),
        }
    }
    let took = start.elapsed().as_secs_f64();
    match limit {
        None => println!("{calls} SLEEP calls of {ms} ms, all at once: {took:.3} s"),
        Some(l) => println!(
            "{calls} SLEEP calls of {ms} ms with a limit of {l} ms, all at once: {answered} answered, {timed_out} timed out, {took:.3} s"
        ),
    }
    Ok(())
}
