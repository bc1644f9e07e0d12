//! Calls RDMATEST through rpcrdmad: `cargo run -p rpcrdma-shm --example client -- /path/to/daemon.sock [peer]`.
use rpcrdma_shm::rdmatest::{self, pattern};
use rpcrdma_shm::Client;
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: client <daemon-socket> [peer-name]")?;
    let name = args.next().unwrap_or_else(|| "loopback".into());
    let mut client = Client::connect(&path)?;
    let peer = client
        .peer(&name)
        .ok_or_else(|| format!("no peer {name:?}; known: {:?}", client.peers()))?;
    let timeout = Some(Duration::from_secs(10));

    // NULL: the smallest round trip.
    let t = client
        .call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::NULL)
        .submit()?;
    println!("NULL: accept_stat {}", client.wait(t, timeout)?.accept_stat);

    // WRITE: 64 KiB argument marked DDP-eligible (a Read chunk on the wire).
    let data = pattern(42, 64 << 10);
    let mut call = client.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::WRITE);
    call.args().put_u32(42).put_ddp_opaque(&data);
    let t = call.submit()?;
    let r = client.wait(t, timeout)?;
    println!(
        "WRITE: {} of {} bytes matched",
        u32::from_be_bytes(r.body[..4].try_into()?),
        data.len()
    );

    // READ: 32 KiB result into a result buffer (a Write chunk on the wire).
    let mut call = client.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::READ);
    call.args().put_u32(32 << 10).put_u32(7);
    call.result_buffer(32 << 10);
    let t = call.submit()?;
    let r = client.wait(t, timeout)?;
    println!(
        "READ: {} bytes, {} placed directly",
        r.body.len() - 4,
        r.ddp_bytes
    );

    // Pipelining: 100 ECHO calls in flight at once, collected in completion order.
    let mut tickets = Vec::new();
    for i in 0..100u32 {
        let mut call = client.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::ECHO);
        call.args().put_opaque(&i.to_be_bytes());
        tickets.push(call.submit()?);
    }
    let mut n = 0;
    while n < tickets.len() {
        let (_ticket, reply) = client.wait_any(timeout)?;
        reply?;
        n += 1;
    }
    println!("ECHO: {n} pipelined calls done");
    Ok(())
}
