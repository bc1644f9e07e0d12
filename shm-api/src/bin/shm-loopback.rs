//! Test harness standing in for rpcrdmad: serves apps on a Unix socket and routes each call to the local app
//! that registered its program. Usage: `shm-loopback <socket-path> [spin-µs] [stall-ms]`: busy-poll this
//! long before parking (default 200 µs); detach apps that leave completions undrained this long (default
//! 10 000 ms). Stats: connect to `<socket-path>.ctl`.
fn main() -> std::io::Result<()> {
    let path = std::env::args_os()
        .nth(1)
        .ok_or_else(|| std::io::Error::other("usage: shm-loopback <socket-path>"))?;
    let mut lb = rpcrdma_shm::loopback::Loopback::bind(
        path.as_ref(),
        rpcrdma_shm::abi::Geometry::default(),
    )?;
    let arg = |i: usize, d: u64| {
        std::env::args()
            .nth(i)
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let spin_us = arg(2, 200);
    lb.set_stall_limit(std::time::Duration::from_millis(arg(3, 10_000)));
    println!("ready");
    lb.run(std::time::Duration::from_micros(spin_us))
}
