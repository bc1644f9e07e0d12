//! What the poll-thread tests share: a poll thread's specification, waiting for one of its
//! events, and a connection of a thread to itself.
#![allow(dead_code)]

use rpcrdma_dataplane::poll::{
    Command, Event, IdleSpec, PollHandle, PollSpec, PoolSpec, Snapshot, SpinLimit, ThreadStats,
    TransportSpec,
};
use rpcrdma_shm::abi::Geometry;
use rpcrdma_shm::attach::Listener;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub const T: Option<Duration> = Some(Duration::from_secs(30));

pub fn spec(index: usize) -> PollSpec {
    PollSpec {
        index,
        core: None,
        idle: IdleSpec::Backoff {
            spin: SpinLimit::For(Duration::from_micros(100)),
            backoff_max: Duration::from_micros(50),
            park_after: Duration::from_millis(2),
        },
        transport: TransportSpec {
            version: 1,
            inline_send: 4096,
            inline_recv: 4096,
            credits: 32,
            backchannel_credits: 0,
            ddp_threshold: 1024,
            remote_invalidation: false,
            recv_buffer_size: 4096,
            ird: 16,
            ord: 16,
            v2_first_reply_timeout: Duration::from_secs(5),
            max_segments_per_chunk: 16,
            max_chunks_per_list: 4,
        },
        max_conns: 2,
        pools: PoolSpec {
            recv_buffers: 128,
            send_buffers: 256,
            receive_queues: rpcrdma_dataplane::poll::ReceiveQueues::Shared,
        },
        max_apps: 4,
        geometry: Geometry {
            sq_entries: 256,
            cq_entries: 256,
            arena_size: 4 << 20,
            peers: 0,
        },
        peers: vec!["self".into()],
        queue_depth: 64,
    }
}

/// The next event of `h` matching `f`, other events dropped (panics after 20 s).
pub fn expect<T>(h: &PollHandle, what: &str, mut f: impl FnMut(Event) -> Option<T>) -> T {
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        match h.recv() {
            Some(Event::Failed(e)) => panic!("poll thread failed: {e}"),
            Some(ev) => {
                if let Some(x) = f(ev) {
                    return x;
                }
            }
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    panic!("no {what}");
}

/// Starts `app` (which attaches to `path`) on a thread and hands its attachment to `to`.
/// Makes thread `h` listen and connect to itself as configured peer 0 (both ends of the
/// connection are its own); the connection's id.
pub fn self_connection(h: &PollHandle) -> u32 {
    let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    h.send(Command::Listen {
        addr: any,
        index: 0,
        admit: Default::default(),
    })
    .expect("listen");
    let addr = expect(h, "Listening", |e| match e {
        Event::Listening { result, .. } => Some(result.expect("bound")),
        _ => None,
    });
    h.send(Command::Connect {
        peer: 0,
        addr,
        version: 1,
    })
    .expect("connect");
    expect(h, "Up", |e| match e {
        Event::Up {
            conn,
            peer: Some(0),
            ..
        } => Some(conn),
        _ => None,
    })
}

/// Thread `h`'s statistics.
pub fn stats(h: &PollHandle) -> ThreadStats {
    h.send(Command::Snapshot(Box::new(Snapshot::with_capacity(2))))
        .expect("snapshot");
    expect(h, "Snapshot", |e| match e {
        Event::Snapshot(s) => Some(s.thread),
        _ => None,
    })
}

/// Accepts the next app that connects to `apps` (waiting up to 20 s) and attaches it to `to`.
pub fn attach_next(apps: &mut Listener, to: &PollHandle) {
    let end = Instant::now() + Duration::from_secs(20);
    let att = loop {
        if let Some(a) = apps.accept().expect("accept") {
            break a;
        }
        assert!(Instant::now() < end, "the app never connected");
        std::thread::sleep(Duration::from_millis(1));
    };
    to.send(Command::Attach(Box::new(att))).expect("attach");
    expect(to, "AppAttached", |e| {
        matches!(e, Event::AppAttached { .. }).then_some(())
    });
}
