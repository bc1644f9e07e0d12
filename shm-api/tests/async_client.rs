//! `AsyncClient` (feature `tokio`) against the `shm-loopback` harness, apps in their own
//! processes: its waits park the task on the client's descriptor and hand the thread back to
//! the runtime, every call comes back once and intact, and a daemon that goes away ends a
//! wait with `Detached`.

mod common;

use common::{app, harness, runtime, sock, within_30s, xdr_opaque};
use rpcrdma_shm::async_client::AsyncClient;
use rpcrdma_shm::client::Error;
use rpcrdma_shm::rdmatest::{self, pattern};
use rpcrdma_shm::Client;
use std::collections::HashMap;
use std::time::Duration;

fn client(path: &std::path::Path) -> (AsyncClient, u32) {
    let c = Client::connect(path).expect("attach");
    let peer = c.peer("loopback").expect("loopback peer");
    (AsyncClient::new(c).expect("AsyncFd"), peer)
}

/// 200 ECHO calls of assorted sizes, 16 in flight, taken as they finish (`wait_any`) and, for
/// every tenth, by its ticket (`wait`): each comes back once, with its own bytes, and the
/// waits park on the descriptor rather than loop on it.
#[test]
fn async_calls_come_back_once_and_intact() {
    let path = sock("async-echo");
    let _h = harness(&path);
    let _s = app("server", &path, &[]);
    within_30s(move || {
        runtime().block_on(async move {
            let (mut c, peer) = client(&path);
            let mut tickets = HashMap::new();
            let submit = |c: &mut AsyncClient, i: u32, tickets: &mut HashMap<_, _>| {
                let data = pattern(i, 1 + (i as usize * 37) % 3000);
                let mut b = c.client().call(peer, rdmatest::PROG, 1, rdmatest::ECHO);
                b.args().put_opaque(&data);
                tickets.insert(b.submit().expect("submit"), data);
            };
            let (calls, mut sent, mut done) = (200u32, 0u32, 0u32);
            while sent < 16 {
                submit(&mut c, sent, &mut tickets);
                sent += 1;
            }
            while done < calls {
                let (t, r) = if done % 10 == 0 {
                    let t = *tickets.keys().next().expect("a call in flight");
                    (t, c.wait(t).await)
                } else {
                    c.wait_any().await.expect("wait_any")
                };
                let data = tickets.remove(&t).expect("a ticket of ours, once");
                assert_eq!(r.expect("reply").body, xdr_opaque(&data));
                done += 1;
                if sent < calls {
                    submit(&mut c, sent, &mut tickets);
                    sent += 1;
                }
            }
            assert!(tickets.is_empty());
            assert_eq!(c.client().in_flight(), 0);
            // A wait parks at most about once per call it takes; one that kept a stale
            // readiness would loop on it instead.
            assert!(
                c.sleeps() <= u64::from(2 * calls),
                "{} parks for {calls} calls",
                c.sleeps()
            );
        })
    });
}

/// A call nobody answers: the wait gives the thread back (the runtime's timer fires and a
/// task beside it runs) and sleeps on the descriptor rather than spinning; after the timeout
/// the call is still in flight. Then the daemon dies: the next wait ends with `Detached`.
#[test]
fn an_unanswered_wait_parks_the_task_and_a_dead_daemon_ends_it() {
    let path = sock("async-park");
    let mut h = harness(&path);
    let s = app("blackhole", &path, &[]);
    within_30s(move || {
        runtime().block_on(async move {
            let _s = s;
            let (mut c, peer) = client(&path);
            let t = c
                .client()
                .call(peer, rdmatest::CB_PROG, 1, 0)
                .submit()
                .expect("submit");
            let beside = tokio::spawn(async { 7 });
            let waited = tokio::time::timeout(Duration::from_millis(300), c.wait(t)).await;
            assert!(waited.is_err(), "nobody answers: {waited:?}");
            assert_eq!(beside.await.expect("the task beside ran"), 7);
            assert!(c.sleeps() >= 1, "the wait never parked on the descriptor");
            assert!(
                c.sleeps() < 100,
                "{} wake-ups in 300 ms: spinning",
                c.sleeps()
            );
            assert_eq!(c.client().in_flight(), 1);
            h.kill9();
            let gone = tokio::time::timeout(Duration::from_secs(10), c.wait(t)).await;
            assert!(
                matches!(gone, Ok(Err(Error::Detached))),
                "after the daemon died: {gone:?}"
            );
        })
    });
}

/// A call nobody answers, given a time limit, ends `TIMEOUT` in an awaiting task (the daemon
/// ends it, the parked task is woken); another, cancelled from the task, ends `CANCELLED`.
/// Neither is left in flight, unlike a wait that `tokio::time::timeout` gave up on.
#[test]
fn a_time_limit_or_a_cancel_ends_an_awaited_call() {
    let path = sock("async-limit");
    let _h = harness(&path);
    let s = app("blackhole", &path, &[]);
    within_30s(move || {
        runtime().block_on(async move {
            let _s = s;
            let (mut c, peer) = client(&path);
            let mut call = c.client().call(peer, rdmatest::CB_PROG, 1, 0);
            call.timeout(Duration::from_millis(100));
            let limited = call.submit().expect("submit");
            let t0 = std::time::Instant::now();
            let r = c.wait(limited).await;
            assert!(
                matches!(r, Err(Error::Status(rpcrdma_shm::abi::status::TIMEOUT))),
                "{r:?}"
            );
            assert!(t0.elapsed() >= Duration::from_millis(100));
            assert!(c.sleeps() >= 1, "the task parked while it waited");

            let held = c
                .client()
                .call(peer, rdmatest::CB_PROG, 1, 0)
                .submit()
                .expect("submit");
            c.client().cancel(held).expect("cancel");
            let r = c.wait(held).await;
            assert!(
                matches!(r, Err(Error::Status(rpcrdma_shm::abi::status::CANCELLED))),
                "{r:?}"
            );
            assert_eq!(c.client().in_flight(), 0);
        })
    });
}
