//! The RDMATEST server (`rpcrdma-bench serve`) and the client-side RDMATEST_CB server that answers the
//! backward PINGs a CALLBACK makes.

use crate::case::MAX_SIZE;
use rpcrdma_shm::client::{Call, Client, ReplyBuilder, Server, WaitPolicy};
use rpcrdma_shm::rdmatest::{self, pattern, XdrReader};
use std::path::Path;
use std::time::Duration;

/// RDMATEST procedure number of CALLBACK.
pub const CALLBACK: u32 = 5;
/// RDMATEST_CB PING.
pub const PING: u32 = 1;
/// Most backward calls one CALLBACK may ask for.
pub const MAX_CALLBACKS: u32 = 64;
/// How long one backward PING may take before it counts as failed.
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// Options of `serve`.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// Receive buffers posted and bytes each (the largest call accepted); `None`: sized from the arena the
    /// daemon hands out ([`crate::target::recv_buffers_for`]).
    pub recv: Option<(u32, u32)>,
    /// How the app polls before sleeping (busy or yielding, for how long).
    pub wait: WaitPolicy,
}

/// The arena size the daemon at `socket` gives an app (learnt from a short attachment).
pub fn arena_size(socket: &Path) -> std::io::Result<u64> {
    let c = rpcrdma_shm::attach::connect(socket)?;
    Ok(u64::from(c.region.layout().geometry.arena_size))
}

/// Makes `n` backward PINGs of `size` bytes of `pattern(n)` to `peer` and returns how many came back intact.
fn callbacks(cb: &mut Client, peer: u32, n: u32, size: u32) -> u32 {
    let data = pattern(n, size as usize);
    let mut ok = 0;
    for _ in 0..n {
        let mut b = cb.call(peer, rdmatest::CB_PROG, 1, PING);
        b.args().put_opaque(&data);
        b.max_reply(size.saturating_add(64).max(4096));
        let Ok(t) = b.submit() else { continue };
        if let Ok(r) = cb.wait(t, Some(PING_TIMEOUT)) {
            if r.accept_stat == 0 && XdrReader::new(&r.body).opaque() == Some(&data[..]) {
                ok += 1;
            }
        }
    }
    ok
}

/// Answers one RDMATEST call; CALLBACK makes its backward calls with `cb` (`None`: answers 0 intact).
pub fn handle(call: &Call<'_>, reply: &mut ReplyBuilder, cb: Option<&mut Client>) {
    let mut r = XdrReader::new(call.args);
    match call.proc_ {
        rdmatest::READ => match (r.u32(), r.u32()) {
            (Some(count), Some(seed)) if count <= MAX_SIZE => {
                reply.xdr.put_ddp_opaque(&pattern(seed, count as usize));
            }
            _ => reply.accept_stat = rdmatest::GARBAGE_ARGS,
        },
        CALLBACK => match (r.u32(), r.u32()) {
            (Some(n), Some(size)) if n <= MAX_CALLBACKS && size <= 1 << 20 => {
                let ok = cb.map_or(0, |c| callbacks(c, call.peer, n, size));
                reply.xdr.put_u32(ok);
            }
            _ => reply.accept_stat = rdmatest::GARBAGE_ARGS,
        },
        _ => rdmatest::handle(call, reply),
    }
}

/// Attaches to the daemon at `socket` and serves RDMATEST until the daemon detaches this app.
///
/// A second attachment makes CALLBACK's backward calls: the shm ABI names a call's destination by peer
/// index only, so the backward PING goes to the peer the CALLBACK came from, and the daemon decides the
/// connection (RFC 8167 wants the one the call arrived on).
pub fn serve(socket: &Path, opts: &ServeOptions, on_ready: impl FnOnce()) -> anyhow::Result<()> {
    let (count, size) = match opts.recv {
        Some(r) => r,
        None => crate::target::recv_buffers_for(
            arena_size(socket)
                .map_err(|e| anyhow::anyhow!("attach to {}: {e}", socket.display()))?,
        ),
    };
    let mut s = Server::connect(socket)
        .map_err(|e| anyhow::anyhow!("attach to {}: {e}", socket.display()))?;
    s.set_wait(opts.wait);
    s.receive_buffers(count, size);
    let mut cb = Client::connect(socket)
        .map_err(|e| anyhow::anyhow!("attach (callbacks) to {}: {e}", socket.display()))?;
    cb.set_wait(opts.wait);
    s.start(rdmatest::PROG, rdmatest::VERS)
        .map_err(|e| anyhow::anyhow!("register RDMATEST: {e}"))?;
    on_ready();
    s.serve(rdmatest::PROG, rdmatest::VERS, |c, r| {
        handle(c, r, Some(&mut cb))
    })
    .map_err(|e| anyhow::anyhow!("serving RDMATEST: {e}"))
}

/// Serves RDMATEST_CB PING (echo) as a backchannel program until detached; what a client app runs so
/// that CALLBACK cases get answers.
pub fn serve_callbacks(
    socket: &Path,
    wait: impl Into<WaitPolicy>,
    on_ready: impl FnOnce(),
) -> anyhow::Result<()> {
    let arena =
        arena_size(socket).map_err(|e| anyhow::anyhow!("attach to {}: {e}", socket.display()))?;
    let mut s = Server::connect(socket)
        .map_err(|e| anyhow::anyhow!("attach to {}: {e}", socket.display()))?;
    s.set_wait(wait.into());
    // PINGs carry at most 1 MiB (CALLBACK's limit); four buffers in at most half the arena.
    s.receive_buffers(4, (arena / 8).clamp(4096, (1 << 20) + 4096) as u32);
    s.register(rdmatest::CB_PROG, 1, true)
        .map_err(|e| anyhow::anyhow!("register RDMATEST_CB: {e}"))?;
    s.start(rdmatest::CB_PROG, 1)
        .map_err(|e| anyhow::anyhow!("post receive buffers: {e}"))?;
    on_ready();
    s.serve(rdmatest::CB_PROG, 1, |c, r| {
        match XdrReader::new(c.args).opaque() {
            Some(d) if c.proc_ == PING => {
                r.xdr.put_opaque(d);
            }
            _ if c.proc_ != PING => r.accept_stat = rdmatest::PROC_UNAVAIL,
            _ => r.accept_stat = rdmatest::GARBAGE_ARGS,
        }
    })
    .map_err(|e| anyhow::anyhow!("serving RDMATEST_CB: {e}"))
}

/// Runs [`serve_callbacks`] on a thread of this process and waits until it is registered.
pub fn start_callbacks(
    socket: std::path::PathBuf,
    wait: impl Into<WaitPolicy>,
) -> anyhow::Result<()> {
    let wait = wait.into();
    let (tx, rx) = std::sync::mpsc::channel();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        let r = serve_callbacks(&socket, wait, || {
            let _ = tx.send(Ok(()));
        });
        if let Err(e) = r {
            let _ = tx2.send(Err(e));
        }
    });
    rx.recv_timeout(Duration::from_secs(10))
        .map_err(|_| anyhow::anyhow!("the RDMATEST_CB server did not start"))?
}
