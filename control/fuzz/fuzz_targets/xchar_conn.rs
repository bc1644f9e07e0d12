//! The transport-characteristics state of two connected peers (`rpcrdma_control::xchar`):
//! each side's RDMA2_OPTIONAL messages delivered to the other, sometimes with a byte
//! changed, among raw messages a hostile peer injects, requests, give-ups, operator changes
//! and idle points, as the input says. Fails on a panic or if a side:
//! - sends a message its own decoder refuses, or a RESPXCH under another XID than the
//!   REQXCH it answers (XCH-4.3-a);
//! - believes a peer RBSIZ outside 1 KiB..=256 KiB (XCH-7-a), or applies an RBSIZ of its own
//!   outside its policy;
//! - holds more than one pending change (a peer repeating requests must not grow it).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcrdma_control::xchar::{Action, ConnXchar, Policy, Value};
use rpcrdma_proto::xchar::{Operation, ROPT_REQXCH, ROPT_RESPXCH};

/// Messages waiting for a side, at most.
const INBOX: usize = 64;

struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }
}

fn policy(b: &mut Bytes<'_>) -> Policy {
    let sizes = [1024, 4096, 8192, 65536];
    let buffer_size = sizes[usize::from(b.u8() % 4)];
    let min_rbsiz = sizes[usize::from(b.u8() % 2)];
    let max_rbsiz = min_rbsiz.max(sizes[usize::from(b.u8() % 4)]);
    let rbsiz = min_rbsiz.max(buffer_size.min(max_rbsiz));
    Policy {
        rbsiz,
        buffer_size,
        min_rbsiz,
        max_rbsiz,
        reqreminv: b.u8() & 1 == 1,
        reqreminv_may_change: b.u8() & 1 == 1,
    }
}

/// A value as an operator writes it (`rpcrdmactl xchar set|request`), parsed as the daemon
/// parses it; `None` if refused.
fn value(b: &mut Bytes<'_>) -> Option<Value> {
    let text = match b.u8() % 5 {
        0 => format!("rbsiz={}", b.u32()),
        1 => format!(
            "rbsiz={}",
            [1024, 2048, 4096, 8192][usize::from(b.u8() % 4)]
        ),
        2 => format!("reqreminv={}", b.u8() & 1 == 1),
        3 => format!(
            "brs={}",
            ["none", "inline", "genl"][usize::from(b.u8() % 3)]
        ),
        _ => {
            let which = b.u32() % 8;
            let n = usize::from(b.u8() % 16);
            let hex: String = b.take(n).iter().map(|x| format!("{x:02x}")).collect();
            format!("id:{which}={hex}")
        }
    };
    Value::parse(&text).ok()
}

/// Checks what side `x` (with policy `p`) did; its messages go to `out`. `answering`: the
/// XID of the REQXCH it was given, if that is what it handled.
fn check(
    p: &Policy,
    x: &ConnXchar,
    acts: Vec<Action>,
    answering: Option<u32>,
    out: &mut Vec<(u32, u32, Vec<u8>)>,
) {
    for a in acts {
        match a {
            Action::Send { xid, opttype, body } => {
                assert!(
                    Operation::parse(opttype, &body).is_ok(),
                    "a message of ours does not decode: type {opttype}, {body:02x?}"
                );
                if opttype == ROPT_RESPXCH {
                    assert_eq!(Some(xid), answering, "RESPXCH under another XID");
                }
                if out.len() < INBOX {
                    out.push((xid, opttype, body));
                }
            }
            Action::PeerRbsiz(v) => assert!((1024..=256 * 1024).contains(&v), "believed RBSIZ {v}"),
            Action::OwnRbsiz(v) => assert!(
                v == p.rbsiz || (p.min_rbsiz..=p.buffer_size.min(p.max_rbsiz)).contains(&v),
                "own RBSIZ {v} outside {p:?}"
            ),
            _ => {}
        }
    }
    assert!(
        x.view().pending_local.len() <= 1,
        "{:?}",
        x.view().pending_local
    );
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes(data);
    let pols = [policy(&mut b), policy(&mut b)];
    let mut sides = [
        ConnXchar::new(pols[0], true),
        ConnXchar::new(pols[1], false),
    ];
    let mut inbox: [Vec<(u32, u32, Vec<u8>)>; 2] = [Vec::new(), Vec::new()];
    let mut asked: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..128 {
        if b.0.is_empty() {
            break;
        }
        let op = b.u8();
        let k = usize::from(op >> 7);
        let (x, p) = (&mut sides[k], &pols[k]);
        let mut out = Vec::new();
        match op % 8 {
            0 | 1 if !inbox[k].is_empty() => {
                let (xid, t, mut body) = inbox[k].remove(0);
                if op % 8 == 1 && !body.is_empty() {
                    let at = usize::from(b.u8()) % body.len();
                    body[at] = b.u8();
                }
                let answering = (t == ROPT_REQXCH).then_some(xid);
                let busy = b.u8() & 1 == 1;
                let acts = x.on_message(xid, t, &body, busy);
                check(p, x, acts, answering, &mut out);
            }
            0 | 1 | 2 => {
                let (xid, t) = (b.u32(), u32::from(b.u8() % 6));
                let n = usize::from(b.u8());
                let body = b.take(n).to_vec();
                let busy = b.u8() & 1 == 1;
                let acts = x.on_message(xid, t, &body, busy);
                check(p, x, acts, (t == ROPT_REQXCH).then_some(xid), &mut out);
            }
            3 => {
                let want: Vec<Value> = (0..1 + b.u8() % 4).filter_map(|_| value(&mut b)).collect();
                if want.is_empty() {
                    continue;
                }
                let (xid, acts) = x.request(want);
                asked[k].push(xid);
                check(p, x, acts, None, &mut out);
            }
            4 => {
                let pick = usize::from(b.u8());
                if let Some(&xid) = asked[k].get(pick % asked[k].len().max(1)) {
                    if b.u8() & 1 == 1 {
                        let acts = x.abandon(xid);
                        check(p, x, acts, None, &mut out);
                    } else {
                        let _ = x.take_answer(xid);
                    }
                }
            }
            5 => {
                if let Some(Ok(acts)) = value(&mut b).map(|v| x.set(v)) {
                    check(p, x, acts, None, &mut out);
                }
            }
            6 => {
                let acts = x.on_idle();
                check(p, x, acts, None, &mut out);
            }
            _ => {
                let acts = x.initxch();
                check(p, x, acts, None, &mut out);
            }
        }
        let peer = &mut inbox[1 - k];
        peer.extend(out.into_iter().take(INBOX.saturating_sub(peer.len())));
    }
});
