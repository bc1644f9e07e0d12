//! Serves the in-memory NFSv3 subset through a daemon, with MOUNT on TCP:
//! `cargo run -p rpcrdma-nfsprobe --example miniserver -- APP_SOCKET MOUNT_ADDR [DIR_ENTRIES] [READ_SIZE] [SEED]`.
use rpcrdma_nfsprobe::miniserver::{mountd, Fs};
use rpcrdma_nfsprobe::nfs3;
use rpcrdma_shm::Server;
use std::net::TcpListener;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let (Some(sock), Some(mount)) = (a.first(), a.get(1)) else {
        return Err(
            "usage: miniserver APP_SOCKET MOUNT_ADDR [DIR_ENTRIES] [READ_SIZE] [SEED]".into(),
        );
    };
    let entries = a.get(2).map_or(Ok(2000), |s| s.parse())?;
    let read_size = a.get(3).map_or(Ok(2 << 20), |s| s.parse())?;
    let seed = a.get(4).map_or(Ok(7), |s| s.parse())?;
    let l = TcpListener::bind(mount)?;
    std::thread::spawn(move || mountd(l));
    let mut fs = Fs::new(seed, read_size, entries);
    let mut server = Server::connect(sock)?;
    server.receive_buffers(2, (1 << 20) + 8192);
    // NFSv4.1 (the probe's `--nfs4` step) on the same server.
    server.start(nfs3::PROG, 4)?;
    println!("ready");
    server.serve(nfs3::PROG, nfs3::VERS, |c, r| fs.serve(c, r))?;
    Ok(())
}
