//! One poll thread's buffer plan carrying 1000 connections (32 credits, 4 KiB inline each):
//! receive memory is the shared receive queue, under 64 MiB, and every connection is served.
//! The scaling table (10, 100, 1000 connections, with RSS) is printed by
//! `cargo run --release -p rpcrdma-dataplane --example pool_scaling`.
#![forbid(unsafe_code)]

#[path = "support/scale.rs"]
#[allow(dead_code)]
mod scale;

use rpcrdma_dataplane::poll::{divide_share, PoolPlan, PoolSpec, SPARE_RECEIVES};

/// The goal: 1000 connections, 32 credits and 4 KiB inline each, receive memory
/// under 64 MiB: 12288 receive buffers of 4 KiB (48 MiB). Each connection submits 24 calls at
/// once, twice its grant (11), so every grant is in use together: 11000 receives taken
/// at the same time. The soft provider ends a connection whose Send finds no receive posted
/// (DDP_NO_BUFFER), so an over-committed queue would close connections here.
const GOAL: scale::Scenario = scale::Scenario {
    conns: 1000,
    credits: 32,
    inline: 4096,
    recv_buffers: 12288,
    calls: 22,
    overcommit: None,
    guard_secs: 600,
};

#[test]
fn r8166_3_3_1_f_thousand_connections_share_one_receive_queue_under_64_mib_all_served() {
    let f = scale::run(GOAL);
    // Every connection made its calls and got its replies, bytes intact.
    assert_eq!(f.served, GOAL.conns);
    assert_eq!(f.replies, u64::from(GOAL.conns) * u64::from(GOAL.calls));
    assert_eq!((f.failed, f.closed), (0, 0));
    // Receive memory is the shared queue's buffers, computed from the configuration.
    assert_eq!(f.recv_registered, 12288 * 4096);
    assert!(f.recv_registered < 64 << 20);
    // Per-connection blocks would need conns x (credits + 1) x 4 KiB = 129 MiB.
    assert!(f.recv_per_connection_blocks > 64 << 20);
    // Each connection's grant is its share of the queue less the spare: 12288 / 1000 = 12.
    assert_eq!(f.credits, 12 - SPARE_RECEIVES);
}

#[test]
fn r8166_3_3_1_g_overcommitted_shared_queue_loses_connections() {
    // The negative control of the test above: 200 connections granted 11 credits each on a
    // queue of 600 receives (their fair share is 3): Sends find no receive and the soft
    // provider ends those connections (DDP_NO_BUFFER); their calls fail.
    let f = scale::run(scale::Scenario {
        conns: 200,
        credits: 32,
        inline: 4096,
        recv_buffers: 600,
        calls: 22,
        overcommit: Some(11),
        guard_secs: 20,
    });
    eprintln!(
        "overcommitted: {} served, {} closed, {} failed",
        f.served, f.closed, f.failed
    );
    assert!(f.closed > 0 && f.failed > 0, "{f:?}");
    assert!(f.served < 200, "{f:?}");
}

#[test]
fn r8166_3_3_1_g_grants_summed_over_connections_never_exceed_the_receive_queue() {
    let t = |credits, backchannel_credits| rpcrdma_dataplane::poll::TransportSpec {
        version: 1,
        inline_send: 4096,
        inline_recv: 4096,
        credits,
        backchannel_credits,
        ddp_threshold: 1024,
        remote_invalidation: true,
        recv_buffer_size: 4096,
        ird: 16,
        ord: 16,
        v2_first_reply_timeout: rpcrdma_dataplane::conn::V2_FIRST_REPLY_TIMEOUT,
        max_segments_per_chunk: 16,
        max_chunks_per_list: 4,
    };
    for conns in [1u32, 10, 100, 1000, 4000] {
        for recv_buffers in [conns * 3, 4096, 12288, 65536] {
            for (c, b) in [(32, 0), (32, 8), (128, 8)] {
                let Ok(tmpl) = PoolPlan::template_for(&t(c, b), recv_buffers, conns, 1 << 20)
                else {
                    assert!(divide_share(c, b, recv_buffers / conns).is_none());
                    continue;
                };
                let pools = PoolSpec {
                    recv_buffers,
                    send_buffers: tmpl.send_slots() * conns,
                    receive_queues: rpcrdma_dataplane::poll::ReceiveQueues::Shared,
                };
                let plan = PoolPlan::new(&t(c, b), pools, conns, 1 << 20).expect("plan");
                // One send buffer fewer than every connection may hold: refused.
                let short = PoolSpec {
                    send_buffers: pools.send_buffers - 1,
                    ..pools
                };
                assert!(PoolPlan::new(&t(c, b), short, conns, 1 << 20).is_err());
                // Receives a connection can be asked to absorb: its share (grant and calls
                // in progress, or calls in flight and backchannel grant), plus the spare.
                let per_conn = u64::from(plan.share() + SPARE_RECEIVES);
                assert!(per_conn * u64::from(conns) <= u64::from(recv_buffers));
                assert!(plan.tmpl.credits >= 1 && plan.tmpl.credits <= c);
                // Receive memory does not depend on the number of connections.
                assert_eq!(plan.recv_len(), u64::from(recv_buffers) * 4096);
            }
        }
    }
}
