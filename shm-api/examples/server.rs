//! Serves RDMATEST through rpcrdmad: `cargo run -p rpcrdma-shm --example server -- /path/to/daemon.sock`.
use rpcrdma_shm::client::{Call, ReplyBuilder};
use rpcrdma_shm::rdmatest::{self, XdrReader};
use rpcrdma_shm::Server;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: server <daemon-socket>")?;
    let mut server = Server::connect(&path)?;
    // 32 receive buffers of 128 KiB: how many calls can be delivered before we answer, and how large.
    server.receive_buffers(32, 128 << 10);
    println!("serving RDMATEST v1 on {path}");
    server.serve(
        rdmatest::PROG,
        rdmatest::VERS,
        |call: &Call<'_>, reply: &mut ReplyBuilder| {
            match call.proc_ {
                // ECHO, written out here to show the reply side: the result is marked DDP-eligible, so the
                // daemon may place it straight into the caller's result buffer (a Write chunk on the wire).
                rdmatest::ECHO => match XdrReader::new(call.args).opaque() {
                    Some(data) => {
                        reply.xdr.put_ddp_opaque(data);
                    }
                    None => reply.accept_stat = rdmatest::GARBAGE_ARGS,
                },
                // NULL, READ, WRITE, SLEEP: the crate's reference handler.
                _ => rdmatest::handle(call, reply),
            }
        },
    )?;
    Ok(())
}
