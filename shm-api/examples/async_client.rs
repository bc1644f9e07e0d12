//! Calls RDMATEST through rpcrdmad from a tokio task (feature `tokio`):
//! `cargo run -p rpcrdma-shm --features tokio --example async_client -- /path/to/daemon.sock [peer]`.
//!
//! While its waits are parked, the runtime's thread runs the other tasks: here a ticker that
//! counts how often it got the thread.
use rpcrdma_shm::async_client::AsyncClient;
use rpcrdma_shm::rdmatest::{self, pattern};
use rpcrdma_shm::Client;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: async_client <daemon-socket> [peer-name]")?;
    let name = args.next().unwrap_or_else(|| "loopback".into());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let client = Client::connect(&path)?;
        let peer = client
            .peer(&name)
            .ok_or_else(|| format!("no peer {name:?}; known: {:?}", client.peers()))?;
        let mut c = AsyncClient::new(client)?;
        let ticks = Arc::new(AtomicU32::new(0));
        let ticker = tokio::spawn({
            let ticks = ticks.clone();
            async move {
                let mut every = tokio::time::interval(Duration::from_millis(1));
                loop {
                    every.tick().await;
                    ticks.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        // 1000 ECHO calls of 1 KiB, 32 in flight, collected in completion order.
        let (calls, mut sent, mut done) = (1000u32, 0u32, 0u32);
        while done < calls {
            while sent < calls && sent - done < 32 {
                let mut call =
                    c.client()
                        .call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::ECHO);
                call.args().put_opaque(&pattern(sent, 1024));
                call.submit()?;
                sent += 1;
            }
            let (_ticket, reply) = c.wait_any().await?;
            reply?;
            done += 1;
        }
        ticker.abort();
        println!(
            "{done} ECHO calls done; the calling task parked {} times, the ticker beside it ran {} times",
            c.sleeps(),
            ticks.load(Ordering::Relaxed)
        );
        Ok::<_, Box<dyn std::error::Error>>(())
    })
}
