//! Test harness standing in for rpcrdmad: serves apps on a Unix socket and routes each call to the local app
//! that registered its program. Usage: `shm-loopback <socket-path> [spin-µs]` (busy-poll this long before
//! parking; default 200); stats: connect to `<socket-path>.ctl`.
fn main() -> std::io::Result<()> {
    let path = std::env::args_os()
        .nth(1)
        .ok_or_else(|| std::io::Error::other("usage: shm-loopback <socket-path>"))?;
    let mut lb = rpcrdma_shm::loopback::Loopback::bind(
        path.as_ref(),
        rpcrdma_shm::abi::Geometry::default(),
    )?;
    let spin_us = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    println!("ready");
    lb.run(std::time::Duration::from_micros(spin_us))
}
