//! `AsyncServer` (feature `tokio`) against the `shm-loopback` harness, with the harness in its
//! own process and a blocking `Client` on a thread of its own: calls taken with `next_call` can
//! be answered later and in any order, from handlers that run as tasks and await; `serve`
//! parks its task while no call comes; a daemon that goes away ends it with `Detached`.

mod common;

use common::{harness, runtime, sock, within_30s, xdr_opaque};
use rpcrdma_shm::async_server::AsyncServer;
use rpcrdma_shm::client::{Error, ReplyBuilder};
use rpcrdma_shm::rdmatest::{self, pattern};
use rpcrdma_shm::{Client, PendingCall, Server};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A server for RDMATEST, started (registered, receive buffers posted) and wrapped.
fn server(path: &Path) -> AsyncServer {
    let mut s = Server::connect(path).expect("attach");
    s.start(rdmatest::PROG, rdmatest::VERS).expect("start");
    AsyncServer::new(s).expect("AsyncFd")
}

/// ECHO `calls` calls of assorted sizes from a thread, `window` in flight, each checked for its
/// own bytes; the seeds in the order the replies came back.
fn echo_from_a_thread(path: PathBuf, calls: u32, window: u32) -> std::thread::JoinHandle<Vec<u32>> {
    std::thread::spawn(move || {
        let mut c = Client::connect(&path).expect("client attach");
        let peer = c.peer("loopback").expect("loopback peer");
        let (mut sent, mut order, mut out) = (0u32, Vec::new(), HashMap::new());
        while order.len() < calls as usize {
            while sent < calls && out.len() < window as usize {
                let data = pattern(sent, 1 + (sent as usize * 53) % 2000);
                let mut b = c.call(peer, rdmatest::PROG, rdmatest::VERS, rdmatest::ECHO);
                b.args().put_opaque(&data);
                out.insert(b.submit().expect("submit"), (sent, data));
                sent += 1;
            }
            let (t, r) = c.wait_any(Some(Duration::from_secs(20))).expect("a reply");
            let (seed, data) = out.remove(&t).expect("a ticket of ours, once");
            assert_eq!(r.expect("reply").body, xdr_opaque(&data), "call {seed}");
            order.push(seed);
        }
        order
    })
}

/// The ECHO answer to `call`, as `rdmatest::handle` builds it.
fn echo_reply(call: &PendingCall) -> ReplyBuilder {
    let mut rb = ReplyBuilder::default();
    rdmatest::handle(&call.call(), &mut rb);
    rb
}

/// Calls held and answered last to first: each reply reaches its own call, and the replies
/// come back in the order they were answered, not the order the calls were made.
#[test]
fn held_calls_answered_in_reverse_come_back_in_reverse() {
    let path = sock("async-srv-reverse");
    let _h = harness(&path);
    within_30s(move || {
        runtime().block_on(async move {
            let mut s = server(&path);
            let client = echo_from_a_thread(path, 8, 8);
            let mut held = Vec::new();
            while held.len() < 8 {
                held.push(s.next_call().await.expect("next_call"));
            }
            let mut xids: Vec<u32> = held.iter().map(|c| c.xid).collect();
            xids.sort_unstable();
            xids.dedup();
            assert_eq!(xids.len(), 8, "eight distinct calls");
            while let Some(call) = held.pop() {
                let rb = echo_reply(&call);
                s.answer(call, &rb).expect("answer");
            }
            let order = tokio::task::spawn_blocking(move || client.join())
                .await
                .expect("join task")
                .expect("client thread");
            assert_eq!(order, (0..8).rev().collect::<Vec<_>>());
        })
    });
}

/// The shape of `examples/async_server.rs`: each call's handler is a task that awaits (a
/// timer here, standing in for a database) and sends its reply back on a channel; the serving
/// task takes calls and answers them in one `select!`. 300 calls, 16 in flight: every call
/// gets its own bytes back once, replies overtake one another, and the serving task parks on
/// the descriptor instead of spinning.
#[test]
fn handlers_that_await_answer_through_one_serving_task() {
    let path = sock("async-srv-tasks");
    let _h = harness(&path);
    within_30s(move || {
        runtime().block_on(async move {
            let mut s = server(&path);
            let calls = 300u32;
            let client = echo_from_a_thread(path, calls, 16);
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let mut answered = 0u32;
            while answered < calls {
                tokio::select! {
                    call = s.next_call() => {
                        let call = call.expect("next_call");
                        let tx = tx.clone();
                        tokio::spawn(async move {
                            // Later calls wait less: replies overtake earlier ones.
                            let us = 3000 - u64::from(call.xid % 16) * 150;
                            tokio::time::sleep(Duration::from_micros(us)).await;
                            let rb = echo_reply(&call);
                            let _ = tx.send((call, rb));
                        });
                    }
                    Some((call, rb)) = rx.recv() => {
                        s.answer(call, &rb).expect("answer");
                        answered += 1;
                    }
                }
            }
            let order = tokio::task::spawn_blocking(move || client.join())
                .await
                .expect("join task")
                .expect("client thread");
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..calls).collect::<Vec<_>>(), "each call once");
            assert_ne!(order, sorted, "no reply overtook another");
            assert!(
                s.sleeps() <= u64::from(4 * calls),
                "{} parks for {calls} calls",
                s.sleeps()
            );
        })
    });
}

/// `serve` with no calls coming parks its task: a timer and a task beside it run, and it
/// wakes a handful of times, not thousands. Then it serves a client's calls, and when the
/// daemon dies it ends with `Detached`.
#[test]
fn serve_parks_while_idle_serves_and_ends_when_the_daemon_dies() {
    let path = sock("async-srv-idle");
    let mut h = harness(&path);
    within_30s(move || {
        runtime().block_on(async move {
            let mut s = server(&path);
            let beside = tokio::spawn(async { 7 });
            let idle = tokio::time::timeout(Duration::from_millis(300), s.serve(rdmatest::handle));
            assert!(idle.await.is_err(), "serve ended with no daemon change");
            assert_eq!(beside.await.expect("the task beside ran"), 7);
            assert!(s.sleeps() >= 1, "serve never parked on the descriptor");
            assert!(
                s.sleeps() < 100,
                "{} wake-ups in 300 ms: spinning",
                s.sleeps()
            );

            let client = echo_from_a_thread(path, 50, 8);
            let (done_tx, done) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let _ = done_tx.send(client.join());
            });
            tokio::select! {
                r = s.serve(rdmatest::handle) => panic!("serve ended while serving: {r:?}"),
                order = done => {
                    assert_eq!(order.expect("sender").expect("client thread").len(), 50);
                }
            }

            h.kill9();
            let gone = tokio::time::timeout(Duration::from_secs(10), s.serve(rdmatest::handle));
            let gone = gone.await;
            assert!(
                matches!(gone, Ok(Err(Error::Detached))),
                "after the daemon died: {gone:?}"
            );
        })
    });
}
