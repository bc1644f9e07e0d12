//! Conformance tests driving two engines through the simulator; each is named after the
//! REQUIREMENTS.md ID it proves.

use rpcrdma_proto::cm::PrivateData;
use rpcrdma_proto::ulb::{rdmatest, RDMATEST_PROG};
use rpcrdma_proto::{self as proto, v1, Message};

use super::sim::{
    self, answer_ready, call, done, intake, pattern, released, serve, Pair, BULK_PROG,
};
use super::*;
use crate::mem::Memory;
use crate::rpcmsg;

fn be(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_be_bytes()).collect()
}

/// What a peer announced in its RFC 8797 private data, for [`ConnConfig::peer`].
fn peer_announced(send_size: u32, recv_size: u32, remote_invalidate: bool) -> Option<PrivateData> {
    Some(PrivateData {
        remote_invalidate,
        send_size,
        recv_size,
    })
}

/// An ECHO of `data`, with the data as a DDP-eligible piece and a result buffer.
fn echo(p: &mut Pair, xid: u32, data: &[u8]) -> (MemRef, MemRef) {
    // Room for the result inline too, for when it is too small for a Write chunk.
    let n = data.len() as u32;
    echo_sized(p, xid, data, n, n + 8)
}

/// [`echo`] with a result buffer of `result_len` and a reply buffer of `reply_len` bytes.
fn echo_sized(
    p: &mut Pair,
    xid: u32,
    data: &[u8],
    result_len: u32,
    reply_len: u32,
) -> (MemRef, MemRef) {
    let msg = p.a.put(&(data.len() as u32).to_be_bytes());
    let piece = p.a.put(data);
    let result = p.a.alloc(result_len);
    let reply = p.a.alloc(reply_len);
    let spec = CallSpec {
        auth: None,
        user: u64::from(xid),
        xid,
        prog: RDMATEST_PROG,
        vers: 1,
        proc_: rdmatest::ECHO,
        msg,
        args: &[ArgPiece {
            mem: piece,
            xdr_pos: 4,
        }],
        results: &[result],
        reply,
    };
    p.a.conn.submit_call(&spec, &mut p.a.env).expect("submit");
    (result, reply)
}

/// A call to the bulk program (nothing eligible) echoing `data` inline in its arguments.
fn bulk(p: &mut Pair, xid: u32, data: &[u8], reply_max: u32) -> MemRef {
    let spec = bulk_spec(&mut p.a, xid, data, reply_max);
    p.a.conn.submit_call(&spec, &mut p.a.env).expect("submit");
    spec.reply
}

/// An RDMATEST READ of 8 KiB (pattern seed 1) from side `s` into a result buffer (a Write
/// chunk), not submitted: the spec and the result buffer.
fn read_8k_spec(s: &mut sim::Side, xid: u32) -> (CallSpec<'static>, MemRef) {
    let result = s.alloc(8192);
    let spec = CallSpec {
        auth: None,
        user: u64::from(xid),
        xid,
        prog: RDMATEST_PROG,
        vers: 1,
        proc_: rdmatest::READ,
        msg: s.put(&be(&[8192, 1])),
        args: &[],
        // A test's spec outlives its buffer list: leaked, a few bytes per test.
        results: Box::leak(Box::new([result])),
        reply: s.alloc(64),
    };
    (spec, result)
}

/// Submits from side `s` (the server) a backward-direction call of XID `xid`: program
/// 0x2052_4455, procedure 1, one argument word `word`; returns its 64-byte reply buffer.
fn submit_backward(s: &mut sim::Side, xid: u32, word: u32) -> MemRef {
    let msg = s.put(&be(&[4, word]));
    let reply = s.alloc(64);
    let spec = CallSpec {
        auth: None,
        user: u64::from(xid),
        xid,
        prog: 0x2052_4455,
        vers: 1,
        proc_: 1,
        msg,
        args: &[],
        results: &[],
        reply,
    };
    s.conn.submit_call(&spec, &mut s.env).unwrap();
    reply
}

/// The call [`bulk`] submits, from side `s`, not submitted.
fn bulk_spec(s: &mut sim::Side, xid: u32, data: &[u8], reply_max: u32) -> CallSpec<'static> {
    CallSpec {
        auth: None,
        user: u64::from(xid),
        xid,
        prog: BULK_PROG,
        vers: 1,
        proc_: 1,
        msg: s.put(data),
        args: &[],
        results: &[],
        reply: s.alloc(reply_max),
    }
}

fn decode_sent(bytes: &[u8]) -> (Vec<u8>, usize) {
    let bytes = bytes.to_vec();
    let d = proto::decode(&bytes, &proto::Limits::DEFAULT).expect("our own header decodes");
    (bytes.clone(), d.header_len)
}

fn header(bytes: &[u8]) -> v1::Header<'_> {
    match proto::decode(bytes, &proto::Limits::DEFAULT)
        .unwrap()
        .message
    {
        Message::V1(h) => h,
        m => panic!("not v1: {m:?}"),
    }
}

#[test]
fn r8166_3_5_1_a_null_call_is_one_68_byte_send() {
    let mut p = Pair::default_pair();
    let msg = p.a.alloc(0);
    let reply = p.a.alloc(16);
    let spec = CallSpec {
        auth: None,
        user: 9,
        xid: 0x1234,
        prog: RDMATEST_PROG,
        vers: 1,
        proc_: rdmatest::NULL,
        msg,
        args: &[],
        results: &[],
        reply,
    };
    call(&mut p, &spec);
    let sends = p.a.sent.clone();
    assert_eq!(sends.len(), 1);
    assert_eq!(sends[0].len(), 68);
    let (bytes, hl) = decode_sent(&sends[0]);
    assert_eq!(hl, 28);
    // R8166-3.2-a/b: the payload starts with the RPC XID, no record marker.
    assert_eq!(&bytes[28..32], &0x1234u32.to_be_bytes());
    assert!(!p
        .a
        .log
        .iter()
        .any(|w| matches!(w, Work::Read { .. } | Work::Write { .. })));
    serve(&mut p);
    let d = done(&mut p);
    assert_eq!(d.len(), 1);
    assert_eq!(
        (d[0].user, d[0].status, d[0].rpc_stat, d[0].reply_len),
        (9, CallStatus::Ok, 0, 0)
    );
}

#[test]
fn r8166_3_2_a_echo_64_bytes_short_both_ways() {
    let mut p = Pair::default_pair();
    let data = pattern(7, 64);
    let (result, reply) = echo(&mut p, 1, &data);
    p.run();
    serve(&mut p);
    let d = done(&mut p);
    assert_eq!(d[0].status, CallStatus::Ok);
    // 64 bytes is below the DDP threshold: everything inline, no RDMA operations.
    assert!(!p
        .b
        .log
        .iter()
        .any(|w| matches!(w, Work::Read { .. } | Work::Write { .. })));
    assert_eq!(d[0].reply_len, 68);
    let r = p.a.get(reply.prefix(68).unwrap());
    assert_eq!(&r[..4], &64u32.to_be_bytes());
    assert_eq!(&r[4..], &data[..]);
    // The result buffer got nothing: the result travelled inline.
    assert_eq!(d[0].results().collect::<Vec<_>>(), &[(68, 0)]);
    assert_eq!(p.a.get(result), vec![0; 64]);
}

#[test]
fn r8166_3_4_6_c_read_1mib_via_write_chunk_echoes_length() {
    let mut p = Pair::default_pair();
    let count = 1u32 << 20;
    let msg = p.a.put(&be(&[count, 77]));
    let result = p.a.alloc(count);
    let reply = p.a.alloc(64);
    let spec = CallSpec {
        auth: None,
        user: 1,
        xid: 5,
        prog: RDMATEST_PROG,
        vers: 1,
        proc_: rdmatest::READ,
        msg,
        args: &[],
        results: &[result],
        reply,
    };
    call(&mut p, &spec);
    let (bytes, _) = decode_sent(&p.a.sent[0]);
    assert_eq!(header(&bytes).body.proc(), v1::RDMA_MSG);
    serve(&mut p);
    let d = done(&mut p);
    assert_eq!(d[0].status, CallStatus::Ok, "{d:?}");
    assert_eq!(d[0].results().collect::<Vec<_>>(), &[(4, count)]);
    assert_eq!(p.a.get(result), pattern(77, count as usize));
    // The reply echoed the Write chunk with the length written (R8166-3.4.6-c).
    let reply_bytes = p.b.sent.last().unwrap().clone();
    let h = header(&reply_bytes);
    let v1::Body::Msg(c) = h.body else { panic!() };
    let w: Vec<_> = c.writes.iter().collect();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].length(), u64::from(count));
    // R8166-2.3.2-c: every Write precedes the reply's Send.
    let last_write =
        p.b.log
            .iter()
            .rposition(|w| matches!(w, Work::Write { .. }))
            .unwrap();
    let last_send =
        p.b.log
            .iter()
            .rposition(|w| matches!(w, Work::Send { .. }))
            .unwrap();
    assert!(last_write < last_send);
    // The Writes ask for no completion (the simulator then reports none, as a NIC does): the
    // reply's Send after them retires them, and with it the serve ends, once.
    assert!(p
        .b
        .log
        .iter()
        .all(|w| !matches!(w, Work::Write { signaled: true, .. })));
    p.run();
    let ends =
        p.b.events
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    Event::ReplyDone {
                        status: ReplyStatus::Sent,
                        ..
                    }
                )
            })
            .count();
    assert_eq!(ends, 1, "{:?}", p.b.events);
    assert_eq!(p.b.conn.send_free(), p.b.conn.config().send_slots);
    // R8166-4.4-b: everything exposed was invalidated before the completion.
    assert_eq!(p.a.env.live_windows(), 0);
}

/// One reply using a Write chunk and the Reply chunk at once: each echo carries the bytes
/// written into its own segments (R8166-3.4.6-c, R8166-4.3.3-c) and the other list's
/// segments keep theirs (the responder rewrites the echoed lengths of both lists in one
/// array). No valid ECHO reply is that long (its reduced results are one length word), so
/// the app's 1996 bytes before the result break the binding and the requester refuses the
/// reply (R8166-6.1-c); `r8166_3_4_6_c_long_reply_and_write_chunk_placed_together` has the
/// requester place a valid one.
#[test]
fn r8166_3_4_6_c_write_chunk_and_reply_chunk_echoed_in_one_reply() {
    let mut p = Pair::default_pair();
    let data = pattern(5, 4000);
    let msg = p.a.put(&4000u32.to_be_bytes());
    let piece = p.a.put(&data);
    let result = p.a.alloc(4000);
    // A reply buffer above the inline threshold: the call offers a Reply chunk.
    let reply = p.a.alloc(8192);
    let spec = CallSpec {
        auth: None,
        user: 3,
        xid: 33,
        prog: RDMATEST_PROG,
        vers: 1,
        proc_: rdmatest::ECHO,
        msg,
        args: &[ArgPiece {
            mem: piece,
            xdr_pos: 4,
        }],
        results: &[result],
        reply,
    };
    p.a.conn.submit_call(&spec, &mut p.a.env).expect("submit");
    p.run();
    let (bytes, _) = decode_sent(&p.a.sent[0]);
    let v1::Body::Msg(c) = header(&bytes).body else {
        panic!()
    };
    assert_eq!((c.writes.iter().count(), c.reply.is_some()), (1, true));
    // Take the call in, then answer by hand: a 2000-byte reduced reply (too long for an
    // inline reply) ending with the length word of a 4000-byte result for the Write chunk.
    let id = match p.b.events.pop_front() {
        Some(Event::IncomingCall(ic)) => ic.id,
        other => panic!("{other:?}"),
    };
    let args = p.b.alloc(4004);
    // The 4000-byte argument comes by RDMA Read: the arguments are ready later.
    let got = p.b.conn.accept_call(id, args, &mut p.b.env).unwrap();
    assert_eq!(got, Accepted::Pulling);
    p.run();
    assert!(matches!(
        p.b.events.pop_front(),
        Some(Event::ArgsReady { .. })
    ));
    let mut body = pattern(8, 1996);
    body.extend(4000u32.to_be_bytes());
    let out = pattern(9, 4000);
    let (m, r) = (p.b.put(&body), p.b.put(&out));
    let rspec = ReplySpec {
        accept_stat: 0,
        msg: m,
        results: &[ResultPiece {
            mem: r,
            xdr_pos: 2000,
        }],
    };
    p.b.conn.submit_reply(id, &rspec, &mut p.b.env).unwrap();
    p.run();
    let d = done(&mut p);
    assert_eq!((d.len(), d[0].status), (1, CallStatus::BadReply), "{d:?}");
    // The chunks were written all the same.
    assert_eq!(p.a.get(reply.prefix(2000).unwrap()), body);
    assert_eq!(p.a.get(result), out);
    let rb = p.b.sent.last().unwrap().clone();
    let v1::Body::Nomsg(rc) = header(&rb).body else {
        panic!()
    };
    let w: Vec<_> = rc.writes.iter().collect();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].length(), 4000);
    let used: Vec<u32> = rc.reply.unwrap().segments().map(|g| g.length).collect();
    assert_eq!(used, [24, 2000]);
    assert_eq!(p.a.env.live_windows(), 0);
}

#[test]
fn r8166_3_4_5_a_write_1mib_via_read_chunk_reassembled() {
    let mut p = Pair::default_pair();
    let n = 1u32 << 20;
    let data = pattern(3, n as usize);
    let msg = p.a.put(&be(&[3, n]));
    let piece = p.a.put(&data);
    let reply = p.a.alloc(64);
    let spec = CallSpec {
        auth: None,
        user: 1,
        xid: 6,
        prog: RDMATEST_PROG,
        vers: 1,
        proc_: rdmatest::WRITE,
        msg,
        args: &[ArgPiece {
            mem: piece,
            xdr_pos: 8,
        }],
        results: &[],
        reply,
    };
    call(&mut p, &spec);
    let (bytes, hl) = decode_sent(&p.a.sent[0]);
    let h = header(&bytes);
    let v1::Body::Msg(c) = h.body else { panic!() };
    let rs: Vec<_> = c.reads.iter().collect();
    assert_eq!(rs.len(), 1);
    // R8166-3.4.5-a: position in the unreduced stream = 40-byte RPC header + seed + length.
    assert_eq!(rs[0].position, 48);
    // R8166-3.4.5.2-a: no pad in the chunk; R8166-3.4.4.4-b: inline = header + 2 words.
    assert_eq!(rs[0].target.length, n);
    assert_eq!(bytes.len() - hl, 48);
    serve(&mut p);
    let d = done(&mut p);
    assert_eq!(d[0].status, CallStatus::Ok);
    assert_eq!(p.a.get(reply.prefix(4).unwrap()), n.to_be_bytes());
    assert!(p.b.max_reads_in_flight <= 4);
}

#[test]
fn r8166_3_4_6_2_b_odd_sized_write_chunk_no_pad_written() {
    let mut p = Pair::default_pair();
    let data = pattern(1, 5001);
    let (result, reply) = echo(&mut p, 2, &data);
    p.run();
    serve(&mut p);
    let d = done(&mut p);
    assert_eq!(d[0].status, CallStatus::Ok, "{d:?}");
    assert_eq!(d[0].results().collect::<Vec<_>>(), &[(4, 5001)]);
    assert_eq!(p.a.get(result), data);
    assert_eq!(p.a.get(reply.prefix(4).unwrap()), 5001u32.to_be_bytes());
    let written: u32 =
        p.b.log
            .iter()
            .filter_map(|w| match w {
                Work::Write { local, .. } => Some(local.len),
                _ => None,
            })
            .sum();
    assert_eq!(written, 5001);
    // The call side: 5001-byte read chunk, the responder padded the reassembled arguments.
    let (bytes, _) = decode_sent(&p.a.sent[0]);
    let v1::Body::Msg(c) = header(&bytes).body else {
        panic!()
    };
    assert_eq!(c.reads.iter().next().unwrap().target.length, 5001);
}

#[test]
fn r8166_3_5_3_b_long_call_pzrc_all_position_zero() {
    let mut p = Pair::default_pair();
    let data = pattern(9, 3000);
    let reply = bulk(&mut p, 11, &data, 4096);
    p.run();
    let (bytes, hl) = decode_sent(&p.a.sent[0]);
    let h = header(&bytes);
    let v1::Body::Nomsg(c) = h.body else {
        panic!("{h:?}")
    };
    assert!(c.reads.iter().all(|r| r.position == 0));
    let total: u32 = c.reads.iter().map(|r| r.target.length).sum();
    assert_eq!(total, 40 + 3000);
    assert_eq!(bytes.len(), hl, "nothing after the header");
    serve(&mut p);
    let d = done(&mut p);
    assert_eq!(d[0].status, CallStatus::Ok, "{d:?}");
    // The 3040-byte reply does not fit 1024: it came back through the Reply chunk.
    assert_eq!(d[0].reply_len, 3000);
    assert_eq!(p.a.get(reply.prefix(3000).unwrap()), data);
    let rb = p.b.sent.last().unwrap().clone();
    let rh = header(&rb);
    let v1::Body::Nomsg(rc) = rh.body else {
        panic!("{rh:?}")
    };
    // R8166-4.3.3-c: the used Reply chunk is echoed with the bytes written.
    assert_eq!(rc.reply.unwrap().length(), 24 + 3000);
    assert_eq!(p.a.env.live_windows(), 0);
}

#[test]
fn r8166_4_3_3_a_reply_chunk_only_when_reply_may_exceed_threshold() {
    let mut p = Pair::default_pair();
    bulk(&mut p, 1, &[0; 8], 200);
    bulk(&mut p, 2, &[0; 8], 8192);
    p.run();
    let sends = p.a.sent.clone();
    let first = sends[0].clone();
    let v1::Body::Msg(c) = header(&first).body else {
        panic!()
    };
    assert!(c.reply.is_none());
    // Second call is sent after the first reply (one credit at first); serve both.
    serve(&mut p);
    let sends = p.a.sent.clone();
    let second = sends[1].clone();
    let v1::Body::Msg(c) = header(&second).body else {
        panic!()
    };
    let rc = c.reply.unwrap();
    assert!(rc.length() >= 8192 + 24);
    assert_eq!(done(&mut p).len(), 2);
}

/// The boundary of R8166-4.3.3-a is [`reply_inline_room`] (what the daemon tells apps as
/// their default reply buffer): a reply buffer of that many bytes needs no Reply chunk, one
/// byte more does; each Write chunk the call offers takes [`WRITE_CHUNK_LEN`] from it.
#[test]
fn r8166_4_3_3_a_a_reply_buffer_of_the_inline_room_needs_no_reply_chunk() {
    assert_eq!(WRITE_CHUNK_LEN, rpcrdma_shm::abi::WRITE_CHUNK_ROOM);
    for (version, mut p) in [(1, Pair::default_pair()), (2, v2_pair())] {
        // (reply buffer beyond the room, result buffers) -> whether the call offered a Reply
        // chunk.
        let cases = [(0, 0, false), (1, 0, true), (0, 1, false), (1, 1, true)];
        for (k, &(beyond, results, want)) in cases.iter().enumerate() {
            // A version-two connection learns its peer's receive size along the way.
            let recv = p.a.conn.thresholds().1;
            let room = reply_inline_room(recv, version);
            // Fixed words, three empty lists, the accepted RPC reply header.
            let fixed = if version == 2 { 20 } else { 16 };
            assert_eq!(room, recv - fixed - 12 - 24, "version {version}");
            let reply_len = room - WRITE_CHUNK_LEN * results as u32 + beyond;
            let xid = 100 + k as u32;
            let result = p.a.alloc(8192);
            let results = &[result][..results];
            let msg = p.a.put(&be(&[8192, 7]));
            let spec = read_spec(xid, msg, results, p.a.alloc(reply_len));
            let before = p.a.conn.stats().reply_chunks;
            p.a.conn.submit_call(&spec, &mut p.a.env).expect("submit");
            p.run();
            let (bytes, _) = decode_sent(p.a.sent.last().expect("sent"));
            let d = proto::decode(&bytes, &proto::Limits::DEFAULT).expect("decodes");
            let (writes, reply) = match d.message {
                Message::V1(h) => match h.body {
                    v1::Body::Msg(c) => (c.writes.iter().count(), c.reply.is_some()),
                    other => panic!("{other:?}"),
                },
                Message::V2(h) => match h.body {
                    v2::Body::Msg { chunks, .. } => {
                        (chunks.writes.iter().count(), chunks.reply.is_some())
                    }
                    other => panic!("{other:?}"),
                },
                other => panic!("{other:?}"),
            };
            assert_eq!(
                (writes, reply),
                (results.len(), want),
                "version {version}, reply buffer {reply_len}, {} result buffers",
                results.len()
            );
            assert_eq!(p.a.conn.stats().reply_chunks - before, u64::from(want));
            serve(&mut p);
            let d = done(&mut p);
            assert_eq!(d.len(), 1, "version {version}: {d:?}");
        }
    }
}

#[test]
fn amb_8_inline_reply_marks_reply_chunk_absent() {
    let mut p = Pair::default_pair();
    bulk(&mut p, 1, &[1; 8], 8192);
    p.run();
    serve(&mut p);
    let d = done(&mut p);
    assert_eq!((d[0].status, d[0].reply_len), (CallStatus::Ok, 8));
    let rb = p.b.sent.last().unwrap().clone();
    let v1::Body::Msg(c) = header(&rb).body else {
        panic!()
    };
    assert!(c.reply.is_none());
}

#[test]
fn r8166_4_5_3_b_reply_too_large_without_reply_chunk_is_err_chunk() {
    let mut p = Pair::default_pair();
    // The app says at most 100 bytes of reply (no Reply chunk), the server answers 3000.
    bulk(&mut p, 1, &pattern(1, 3000), 100);
    p.run();
    serve(&mut p);
    let rb = p.b.sent.last().unwrap().clone();
    assert_eq!(rb, be(&[1, 1, 8, 4, 2]));
    assert!(p.b.events.iter().any(|e| matches!(
        e,
        Event::ReplyDone {
            status: ReplyStatus::ErrChunk,
            ..
        }
    )));
    let d = done(&mut p);
    assert_eq!(d[0].status, CallStatus::ErrChunk);
    let chunk = crate::ErrorCounts {
        chunk: 1,
        ..Default::default()
    };
    assert_eq!(p.b.conn.stats().errors_sent_by, chunk);
    assert_eq!(p.a.conn.stats().errors_received_by, chunk);
    // No RDMA Write overran anything (R8166-8.1.4-b).
    assert!(!p.b.log.iter().any(|w| matches!(w, Work::Write { .. })));
}

#[test]
fn r8166_3_3_3_a_first_call_alone_until_real_reply() {
    let mut p = Pair::default_pair();
    for x in 0..5 {
        bulk(&mut p, 100 + x, &[0; 4], 64);
    }
    p.run();
    assert_eq!(p.a.sent.len(), 1);
    assert_eq!(p.a.conn.calls_in_flight(), 1);
    // R8166-3.3.3-b: after the first reply (grant 8) the other four go.
    let first = p.b.events.clone();
    assert_eq!(first.len(), 1);
    serve(&mut p);
    assert_eq!(p.a.conn.credit_limit(), 8);
    assert_eq!(done(&mut p).len(), 5);
    assert_eq!(p.a.sent.len(), 5);
}

#[test]
fn r8166_3_3_1_b_never_more_outstanding_than_granted() {
    let mut p = Pair::new(sim::config(Role::Client, 8), sim::config(Role::Server, 2));
    for x in 0..6 {
        bulk(&mut p, x, &[0; 4], 64);
    }
    p.run();
    serve(&mut p);
    assert_eq!(p.a.conn.credit_limit(), 2);
    for x in 6..12 {
        bulk(&mut p, x, &[0; 4], 64);
    }
    p.run();
    assert!(p.a.conn.calls_in_flight() <= 2);
    let seen =
        p.b.events
            .iter()
            .filter(|e| matches!(e, Event::IncomingCall(_)))
            .count();
    assert_eq!(seen, 2, "the server sees only granted calls");
    serve(&mut p);
    assert_eq!(done(&mut p).len(), 12);
    assert!(p.a.conn.stats().credit_stalls > 0);
}

#[test]
fn r8166_3_3_1_d_in_flight_is_min_of_requested_and_granted() {
    let mut p = Pair::new(sim::config(Role::Client, 4), sim::config(Role::Server, 8));
    bulk(&mut p, 0, &[0; 4], 64);
    p.run();
    serve(&mut p);
    for x in 1..10 {
        bulk(&mut p, x, &[0; 4], 64);
    }
    p.run();
    assert_eq!(p.a.conn.calls_in_flight(), 4);
    serve(&mut p);
    assert_eq!(done(&mut p).len(), 10);
}

#[test]
fn r8166_3_3_1_a_calls_carry_requested_replies_carry_granted() {
    let mut p = Pair::new(sim::config(Role::Client, 5), sim::config(Role::Server, 3));
    bulk(&mut p, 0, &[0; 4], 64);
    p.run();
    serve(&mut p);
    let c = p.a.sent[0].clone();
    let r = p.b.sent[0].clone();
    assert_eq!(proto::Fixed::peek(&c).unwrap().credit, 5);
    assert_eq!(proto::Fixed::peek(&r).unwrap().credit, 3);
}

#[test]
fn r8166_3_3_1_c_never_grant_zero_and_amb_4_zero_read_as_one() {
    // A grant of 0 cannot be configured; 1 is the floor.
    let mut cfg = sim::config(Role::Server, 1);
    cfg.credits = 0;
    assert!(Connection::new(cfg).is_err());
    let mut p = Pair::default_pair();
    bulk(&mut p, 1, &[0; 4], 64);
    p.run();
    // Inject a reply with credit 0 for xid 1.
    let mut r = be(&[1, 1, 0, 0, 0, 0, 0]);
    r.extend(rpcmsg::reply_header(1, 0));
    p.inject(false, &r);
    let d = done(&mut p);
    assert_eq!(d[0].status, CallStatus::Ok);
    assert_eq!(p.a.conn.credit_limit(), 1);
}

#[test]
fn r8166_3_3_1_b_peer_credit_overrun_closes_connection() {
    let mut p = Pair::new(sim::config(Role::Client, 8), sim::config(Role::Server, 2));
    for x in 0..3 {
        let mut m = be(&[x, 1, 8, 0, 0, 0, 0]);
        m.extend(rpcmsg::call_header(x, BULK_PROG, 1, 1));
        p.inject(true, &m);
    }
    assert!(p
        .b
        .events
        .iter()
        .any(|e| *e == Event::Closed(CloseReason::CreditOverrun)));
    assert_eq!(p.b.conn.closed(), Some(CloseReason::CreditOverrun));
    // The two accepted calls are reported as aborted, each once.
    let aborted =
        p.b.events
            .iter()
            .filter(|e| matches!(e, Event::ServeAborted { .. }))
            .count();
    assert_eq!(aborted, 2);
}

/// Found by the engine fuzz target (`conn::script`): the overrunning call's buffer of the
/// shared receive queue was kept by nobody, so each peer that overran its grant took one
/// buffer from every connection of the poll thread for good.
#[test]
fn r8166_3_3_1_b_credit_overrun_gives_back_the_shared_receive_buffer() {
    let mut server = sim::config(Role::Server, 2);
    server.shared_recv = true;
    let mut p = Pair::new(sim::config(Role::Client, 8), server);
    for x in 0..3 {
        let mut m = be(&[x, 1, 8, 0, 0, 0, 0]);
        m.extend(rpcmsg::call_header(x, BULK_PROG, 1, 1));
        p.inject(true, &m);
    }
    assert_eq!(p.b.conn.closed(), Some(CloseReason::CreditOverrun));
    // The two calls within the grant give theirs back when they are aborted, the third as
    // the connection ends.
    assert_eq!(p.b.posted_len(), 16);
}

#[test]
fn r8166_3_3_1_h_receive_posted_for_every_reply() {
    let mut p = Pair::default_pair();
    for x in 0..20 {
        bulk(&mut p, x, &[0; 4], 64);
        p.run();
        serve(&mut p);
    }
    assert_eq!(done(&mut p).len(), 20);
    assert_eq!(p.rnr, 0, "no Send found an empty receive queue");
    assert_eq!(p.a.conn.recv_posted(), p.a.conn.config().recv_slots);
    assert_eq!(p.b.conn.recv_posted(), p.b.conn.config().recv_slots);
}

#[test]
fn r8166_4_5_1_a_err_vers_on_bad_version() {
    let mut p = Pair::default_pair();
    let mut cfg = sim::config(Role::Server, 8);
    cfg.version = 1;
    p.b = sim::Side::new(cfg);
    p.run();
    let mut m = be(&[0xabc, 3, 8, 0, 0, 0, 0]);
    m.extend(rpcmsg::call_header(0xabc, BULK_PROG, 1, 1));
    p.inject(true, &m);
    // WIRE.md Example 3 shape: xid, vers copied (AMB-2), grant, RDMA_ERROR, ERR_VERS, 1, 1.
    assert_eq!(p.b.sent[0].clone(), be(&[0xabc, 3, 8, 4, 1, 1, 1]));
}

#[test]
fn r8166_4_5_a_short_message_dropped_silently() {
    let mut p = Pair::default_pair();
    p.inject(true, &[0; 12]);
    p.inject(true, &be(&[1, 1, 1, 0, 0]));
    assert!(p.b.sent.is_empty());
    assert_eq!(p.b.conn.closed(), None);
    assert_eq!(p.b.conn.stats().dropped, 2);
}

#[test]
fn r8166_4_5_2_a_header_errors_get_err_chunk() {
    let mut p = Pair::default_pair();
    let rpc = rpcmsg::call_header(7, BULK_PROG, 1, 1);
    let cases: Vec<Vec<u8>> = vec![
        // Unknown rdma_proc (IMPL-7.2.1.1-a).
        [be(&[7, 1, 1, 9, 0, 0, 0]), rpc.to_vec()].concat(),
        // RDMA_NOMSG without chunks (R8166-4.2.4-b).
        be(&[7, 1, 1, 1, 0, 0, 0]),
        // rdma_xid differs from the RPC XID (R8166-4.2.1-a).
        [be(&[8, 1, 1, 0, 0, 0, 0]), rpc.to_vec()].concat(),
        // Misaligned read position (R8166-3.4.5-c).
        [be(&[7, 1, 1, 0, 1, 6, 1, 8, 0, 0, 0, 0, 0]), rpc.to_vec()].concat(),
        // RDMA_MSGP (R8166-4.6.1-b, AMB-6).
        [be(&[7, 1, 1, 2, 0, 0, 0, 0, 0]), rpc.to_vec()].concat(),
        // RDMA_MSG with a PZRC (AMB-9).
        [be(&[7, 1, 1, 0, 1, 0, 1, 8, 0, 0, 0, 0, 0]), rpc.to_vec()].concat(),
        // Truncated list.
        be(&[7, 1, 1, 0, 1, 0, 1]),
    ];
    for (k, m) in cases.iter().enumerate() {
        let before = p.b.sent.len();
        p.inject(true, m);
        let sends = p.b.sent.clone();
        assert_eq!(sends.len(), before + 1, "case {k}");
        let xid = proto::Fixed::peek(m).unwrap().xid;
        assert_eq!(sends[before].clone(), be(&[xid, 1, 8, 4, 2]), "case {k}");
    }
    assert_eq!(p.b.conn.closed(), None);
}

#[test]
fn r8166_4_6_2_a_rdma_done_discarded_and_requester_drops_msgp() {
    let mut p = Pair::default_pair();
    p.inject(true, &be(&[7, 1, 1, 3, 0, 0, 0]));
    assert!(p.b.sent.is_empty());
    bulk(&mut p, 1, &[0; 4], 64);
    p.run();
    let before = p.a.sent.len();
    // A requester receiving RDMA_MSGP for its call discards it (AMB-6).
    let mut r = be(&[1, 1, 8, 2, 0, 0, 0, 0, 0]);
    r.extend(rpcmsg::reply_header(1, 0));
    p.inject(false, &r);
    assert_eq!(p.a.sent.len(), before);
    assert!(done(&mut p).is_empty());
}

#[test]
fn r8166_4_2_4_c_responder_discards_rdma_error() {
    let mut p = Pair::default_pair();
    p.inject(true, &be(&[5, 1, 1, 4, 2]));
    assert!(p.b.sent.is_empty());
    assert_eq!(p.b.conn.closed(), None);
}

#[test]
fn r8166_4_5_e_err_chunk_completes_call_permanently_amb_5_no_credit_raise() {
    let mut p = Pair::default_pair();
    bulk(&mut p, 1, &[0; 4], 64);
    bulk(&mut p, 2, &[0; 4], 64);
    p.run();
    p.inject(false, &be(&[1, 1, 50, 4, 2]));
    let d = done(&mut p);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].status, CallStatus::ErrChunk);
    // AMB-5: still one credit; the second call went out alone.
    assert_eq!(p.a.conn.credit_limit(), 1);
    assert_eq!(p.a.conn.calls_in_flight(), 1);
    assert_eq!(p.a.sent.len(), 2);
}

#[test]
fn r8166_4_5_c_malformed_reply_dropped_silently() {
    let mut p = Pair::default_pair();
    bulk(&mut p, 1, &[0; 4], 64);
    p.run();
    // A reply with a non-empty Read list (R8166-4.3.1-b).
    let mut r = be(&[1, 1, 8, 0, 1, 4, 1, 8, 0, 0, 0, 0, 0]);
    r.extend(rpcmsg::reply_header(1, 0));
    p.inject(false, &r);
    // Unknown proc in a reply.
    p.inject(false, &be(&[1, 1, 8, 9, 0, 0, 0]));
    assert!(p.a.sent.len() == 1 && done(&mut p).is_empty());
    assert_eq!(p.a.conn.stats().dropped, 2);
}

#[test]
fn xch_3_2_b_send_with_invalidate_only_when_allowed_and_one_key() {
    let mut server = sim::config(Role::Server, 8);
    server.peer = peer_announced(4096, 4096, true);
    let mut p = Pair::new(sim::config(Role::Client, 8), server);
    // One key (the Write chunk): Send With Invalidate of it; the requester skips it.
    let count = 8192u32;
    let msg = p.a.put(&be(&[count, 1]));
    let result = p.a.alloc(count);
    let reply = p.a.alloc(64);
    let spec = CallSpec {
        auth: None,
        user: 1,
        xid: 1,
        prog: RDMATEST_PROG,
        vers: 1,
        proc_: rdmatest::READ,
        msg,
        args: &[],
        results: &[result],
        reply,
    };
    call(&mut p, &spec);
    serve(&mut p);
    let inv = p.b.log.iter().find_map(|w| match w {
        Work::Send { invalidate, .. } => Some(*invalidate),
        _ => None,
    });
    assert!(matches!(inv, Some(Some(_))));
    assert_eq!(done(&mut p)[0].status, CallStatus::Ok);
    assert_eq!(p.a.conn.stats().remote_invalidations, 1);
    assert_eq!(p.b.conn.stats().replies_with_invalidate, 1);
    assert!(!p.a.log.iter().any(|w| matches!(w, Work::Invalidate { .. })));
    assert_eq!(p.a.env.live_windows(), 0);
    // Two keys (read chunk + write chunk): plain Send, both invalidated locally.
    echo(&mut p, 2, &pattern(2, 4000));
    p.run();
    serve(&mut p);
    let last = p.b.log.iter().rev().find_map(|w| match w {
        Work::Send { invalidate, .. } => Some(*invalidate),
        _ => None,
    });
    assert_eq!(last, Some(None));
    assert_eq!(done(&mut p)[0].status, CallStatus::Ok);
    assert_eq!(p.a.env.live_windows(), 0);
}

#[test]
fn xch_3_2_a_no_send_with_invalidate_without_permission() {
    let mut p = Pair::default_pair();
    let count = 8192u32;
    let msg = p.a.put(&be(&[count, 1]));
    let result = p.a.alloc(count);
    let reply = p.a.alloc(64);
    let spec = CallSpec {
        auth: None,
        user: 1,
        xid: 1,
        prog: RDMATEST_PROG,
        vers: 1,
        proc_: rdmatest::READ,
        msg,
        args: &[],
        results: &[result],
        reply,
    };
    call(&mut p, &spec);
    serve(&mut p);
    assert!(p.b.log.iter().all(|w| !matches!(
        w,
        Work::Send {
            invalidate: Some(_),
            ..
        }
    )));
    assert_eq!(p.a.conn.stats().invalidations, 1);
}

#[test]
fn amb_7_unused_write_chunk_returned_with_zero_lengths() {
    let mut p = Pair::default_pair();
    // READ of an unknown procedure variant: the server rejects it, no result expected.
    let msg = p.a.put(&be(&[4096, 1]));
    let result = p.a.alloc(4096);
    let reply = p.a.alloc(64);
    let spec = CallSpec {
        auth: None,
        user: 1,
        xid: 1,
        prog: RDMATEST_PROG,
        vers: 1,
        proc_: rdmatest::READ,
        msg,
        args: &[],
        results: &[result],
        reply,
    };
    call(&mut p, &spec);
    // Answer with no results at all.
    let Some(Event::IncomingCall(c)) = p.b.events.pop_front() else {
        panic!()
    };
    let buf = p.b.alloc(c.args_len);
    let got = p.b.conn.accept_call(c.id, buf, &mut p.b.env).unwrap();
    // An inline call's arguments are in place at once (no ArgsReady follows).
    assert_eq!(
        got,
        Accepted::Ready {
            args_len: c.args_len
        }
    );
    p.run();
    p.b.events.clear();
    let m = p.b.put(&[]);
    p.b.conn
        .submit_reply(
            c.id,
            &ReplySpec {
                accept_stat: 5,
                msg: m,
                results: &[],
            },
            &mut p.b.env,
        )
        .unwrap();
    p.run();
    let rb = p.b.sent.last().unwrap().clone();
    let v1::Body::Msg(lists) = header(&rb).body else {
        panic!()
    };
    let w: Vec<_> = lists.writes.iter().collect();
    assert_eq!(w.len(), 1);
    assert!(w[0].is_unused());
    let d = done(&mut p);
    assert_eq!((d[0].status, d[0].rpc_stat), (CallStatus::Ok, 5));
}

#[test]
fn r8166_3_4_6_c_wrong_echoed_handle_is_bad_reply() {
    let mut p = Pair::default_pair();
    let msg = p.a.put(&be(&[4096, 1]));
    let result = p.a.alloc(4096);
    let reply = p.a.alloc(64);
    let spec = CallSpec {
        auth: None,
        user: 1,
        xid: 1,
        prog: RDMATEST_PROG,
        vers: 1,
        proc_: rdmatest::READ,
        msg,
        args: &[],
        results: &[result],
        reply,
    };
    call(&mut p, &spec);
    let mut r = be(&[1, 1, 8, 0, 0, 1, 1, 0xdead, 4096, 0, 0, 0, 0]);
    r.extend(rpcmsg::reply_header(1, 0));
    r.extend(be(&[4096]));
    p.inject(false, &r);
    assert_eq!(done(&mut p)[0].status, CallStatus::BadReply);
    assert_eq!(p.a.env.live_windows(), 0);
}

/// An RDMATEST READ call (arguments `msg`) offering `results` as Write chunks.
fn read_spec(xid: u32, msg: MemRef, results: &[MemRef], reply: MemRef) -> CallSpec<'_> {
    CallSpec {
        auth: None,
        user: u64::from(xid),
        xid,
        prog: RDMATEST_PROG,
        vers: 1,
        proc_: rdmatest::READ,
        msg,
        args: &[],
        results,
        reply,
    }
}

/// A READ of `count` bytes into a Write chunk; returns the segment the client offered.
fn read_with_write_chunk(p: &mut Pair, xid: u32, count: u32) -> (MemRef, proto::Segment) {
    with_write_chunk(p, xid, (RDMATEST_PROG, 1, rdmatest::READ), count)
}

/// A call of `(prog, vers, proc)` whose binding has an eligible result, with a result
/// buffer of `count` bytes offered as a Write chunk; returns the buffer and the segment.
fn with_write_chunk(
    p: &mut Pair,
    xid: u32,
    (prog, vers, proc_): (u32, u32, u32),
    count: u32,
) -> (MemRef, proto::Segment) {
    let msg = p.a.put(&be(&[count, 1]));
    let result = p.a.alloc(count);
    let reply = p.a.alloc(256);
    let results = [result];
    let spec = CallSpec {
        auth: None,
        prog,
        vers,
        proc_,
        ..read_spec(xid, msg, &results, reply)
    };
    call(p, &spec);
    let sent = p.a.sent.last().unwrap().clone();
    let v1::Body::Msg(c) = header(&sent).body else {
        panic!()
    };
    let seg = c.writes.iter().next().unwrap().segments().next().unwrap();
    (result, seg)
}

#[test]
fn r8166_3_4_6_c_returned_write_length_above_the_chunk_is_bad_reply() {
    // libevpl bug list: "returned Write-chunk lengths ignored". The echo names the right
    // handle and offset, but claims one byte more than the chunk holds (the inline length
    // word agrees, so only the chunk check can catch it).
    let mut p = Pair::default_pair();
    let (result, seg) = read_with_write_chunk(&mut p, 1, 4096);
    let mut r = be(&[1, 1, 8, 0, 0, 1, 1, seg.handle, 4097]);
    r.extend(seg.offset.to_be_bytes());
    r.extend(be(&[0, 0]));
    r.extend(rpcmsg::reply_header(1, 0));
    r.extend(be(&[4097]));
    p.inject(false, &r);
    let d = done(&mut p);
    assert_eq!((d.len(), d[0].status), (1, CallStatus::BadReply));
    assert!(d[0].results().all(|(_, used)| used == 0));
    assert_eq!(
        p.a.env.live_windows(),
        0,
        "the chunk is fenced all the same"
    );
    // The same echo with the true length is accepted: the check is on the length alone.
    let (result2, seg) = read_with_write_chunk(&mut p, 2, 4096);
    let mut r = be(&[2, 1, 8, 0, 0, 1, 1, seg.handle, 4096]);
    r.extend(seg.offset.to_be_bytes());
    r.extend(be(&[0, 0]));
    r.extend(rpcmsg::reply_header(2, 0));
    r.extend(be(&[4096]));
    p.inject(false, &r);
    let d = done(&mut p);
    assert_eq!(
        (d[0].status, &d[0].results().collect::<Vec<_>>()[..]),
        (CallStatus::Ok, &[(4, 4096)][..])
    );
    assert_ne!(result, result2);
}

/// A short reply to a call that offered one Write chunk: the echo of that chunk (its
/// segment with `used` bytes, or an empty chunk when `None`), then the RPC reply header and
/// `body`.
fn reply_with_chunk(xid: u32, seg: proto::Segment, used: Option<u32>, body: &[u32]) -> Vec<u8> {
    let mut r = match used {
        Some(n) => {
            let mut r = be(&[xid, 1, 8, 0, 0, 1, 1, seg.handle, n]);
            r.extend(seg.offset.to_be_bytes());
            r
        }
        None => be(&[xid, 1, 8, 0, 0, 1, 0]),
    };
    r.extend(be(&[0, 0]));
    r.extend(rpcmsg::reply_header(xid, 0));
    r.extend(be(body));
    r
}

#[test]
fn r8166_6_1_d_eligible_result_sent_inline_despite_a_write_chunk_is_a_permanent_error() {
    // The READ offered a 4096-byte Write chunk; the responder sends 100 bytes of the result
    // inline instead, the chunk echoed empty (its segment with length 0, or no segment).
    let mut p = Pair::default_pair();
    for (xid, used) in [(1, Some(0)), (2, None)] {
        let (result, seg) = read_with_write_chunk(&mut p, xid, 4096);
        let mut body = vec![100];
        body.extend([0x5a5a_5a5a; 25]);
        p.inject(false, &reply_with_chunk(xid, seg, used, &body));
        let d = done(&mut p);
        assert_eq!((d.len(), d[0].status), (1, CallStatus::BadReply), "{d:?}");
        assert_eq!(p.a.get(result), vec![0; 4096]);
        assert_eq!(
            p.a.env.live_windows(),
            0,
            "the chunk is fenced all the same"
        );
    }
    // An empty result needs no chunk: the same reply with a length word of 0 is accepted.
    let (_, seg) = read_with_write_chunk(&mut p, 3, 4096);
    p.inject(false, &reply_with_chunk(3, seg, Some(0), &[0]));
    let d = done(&mut p);
    assert_eq!(
        (
            d[0].status,
            d[0].reply_len,
            &d[0].results().collect::<Vec<_>>()[..]
        ),
        (CallStatus::Ok, 4, &[(4, 0)][..])
    );
    assert_eq!(p.a.conn.stats().bad_replies, 2);
    assert!(p.a.conn.closed().is_none(), "only the calls paid");
}

#[test]
fn r8166_6_1_c_a_write_chunk_holding_a_result_that_is_not_eligible_is_a_permanent_error() {
    use rpcrdma_proto::ulb::{nfs3, NFS_PROG};
    let mut p = Pair::default_pair();
    // An NFSv3 READ that failed (NFS3ERR_IO, no attributes) has no eligible result, yet the
    // echo says 8 bytes went into the chunk (and a last word agrees: only the binding can
    // tell).
    let (_, seg) = with_write_chunk(&mut p, 1, (NFS_PROG, 3, nfs3::READ), 4096);
    p.inject(false, &reply_with_chunk(1, seg, Some(8), &[5, 0, 8]));
    let d = done(&mut p);
    assert_eq!((d.len(), d[0].status), (1, CallStatus::BadReply), "{d:?}");
    // The same failure with the chunk unused reaches the app.
    let (_, seg) = with_write_chunk(&mut p, 2, (NFS_PROG, 3, nfs3::READ), 4096);
    p.inject(false, &reply_with_chunk(2, seg, Some(0), &[5, 0]));
    let d = done(&mut p);
    assert_eq!((d[0].status, d[0].reply_len), (CallStatus::Ok, 8));
    // A READ3resok reduced at the data: accepted, the result placed after the count, eof
    // and length words.
    let (_, seg) = with_write_chunk(&mut p, 3, (NFS_PROG, 3, nfs3::READ), 4096);
    p.inject(
        false,
        &reply_with_chunk(3, seg, Some(3000), &[0, 0, 3000, 1, 3000]),
    );
    let d = done(&mut p);
    assert_eq!(
        (d[0].status, &d[0].results().collect::<Vec<_>>()[..]),
        (CallStatus::Ok, &[(20, 3000)][..])
    );
    // Something after the length word: the chunk holds the result, but the reduced reply
    // goes on where nothing may follow it (an item reduced out of its place).
    let (_, seg) = read_with_write_chunk(&mut p, 4, 4096);
    p.inject(false, &reply_with_chunk(4, seg, Some(4096), &[4096, 7]));
    let d = done(&mut p);
    assert_eq!((d.len(), d[0].status), (1, CallStatus::BadReply), "{d:?}");
    assert_eq!(p.a.env.live_windows(), 0);
}

/// The responder's side of R8166-6.1: an app that writes a READ's result into its reply
/// stream, marking nothing, still has it reduced into the Write chunk the call offered (the
/// requester would fail the reply otherwise); an app whose stream goes on after the result is
/// sent as it wrote it.
/// Server B takes the call that reached it (8 bytes of arguments, inline) and answers it
/// with `stream`, marking no result; returns what client A's calls ended with.
fn answer_unmarked(p: &mut Pair, stream: &[u8]) -> Vec<CallDone> {
    p.run();
    let id = loop {
        match p.b.events.pop_front() {
            Some(Event::IncomingCall(ic)) => break ic.id,
            Some(_) => {}
            None => panic!("no call"),
        }
    };
    let args = p.b.alloc(8);
    let got = p.b.conn.accept_call(id, args, &mut p.b.env).unwrap();
    assert_eq!(got, Accepted::Ready { args_len: 8 });
    let spec = ReplySpec {
        accept_stat: 0,
        msg: p.b.put(stream),
        results: &[],
    };
    p.b.conn.submit_reply(id, &spec, &mut p.b.env).unwrap();
    p.run();
    done(p)
}

#[test]
fn r8166_6_1_d_responder_reduces_an_eligible_result_its_app_left_inline() {
    let mut p = Pair::default_pair();
    // 1001 bytes and their pad, after the length word.
    let data = pattern(6, 1001);
    let mut stream = be(&[1001]);
    stream.extend(&data);
    stream.extend([0; 3]);
    let (result, _) = read_with_write_chunk(&mut p, 1, 4096);
    let d = answer_unmarked(&mut p, &stream);
    assert_eq!(
        (
            d[0].status,
            d[0].reply_len,
            &d[0].results().collect::<Vec<_>>()[..]
        ),
        (CallStatus::Ok, 4, &[(4, 1001)][..]),
        "{d:?}"
    );
    assert_eq!(p.a.get(result.prefix(1001).unwrap()), data);
    let v1::Body::Msg(r) = header(p.b.sent.last().unwrap()).body else {
        panic!()
    };
    assert_eq!(r.writes.iter().next().unwrap().length(), 1001);
    // Without its pad it is found as well.
    let (result, _) = read_with_write_chunk(&mut p, 2, 4096);
    let d = answer_unmarked(&mut p, &stream[..1005]);
    assert_eq!(
        (d[0].status, &d[0].results().collect::<Vec<_>>()[..]),
        (CallStatus::Ok, &[(4, 1001)][..])
    );
    assert_eq!(p.a.get(result.prefix(1001).unwrap()), data);
    // A word after the result: not a READ reply; sent inline, and refused by the requester.
    let mut odd = be(&[100]);
    odd.extend(&data[..100]);
    odd.extend(be(&[7]));
    read_with_write_chunk(&mut p, 3, 4096);
    let d = answer_unmarked(&mut p, &odd);
    assert_eq!((d.len(), d[0].status), (1, CallStatus::BadReply), "{d:?}");
    assert!(p.b.sent.last().unwrap().ends_with(&odd), "sent as written");
}

#[test]
fn r8166_3_4_6_c_long_reply_and_write_chunk_placed_together() {
    // An ECHO with a 4000-byte result buffer (a Write chunk) and an 8192-byte reply buffer
    // (a Reply chunk); the peer answers RDMA_NOMSG, the RPC reply header and the result's
    // length word in the Reply chunk, the result in the Write chunk.
    let mut p = Pair::default_pair();
    let (result, reply) = echo_sized(&mut p, 9, &[7; 8], 4000, 8192);
    p.run();
    let sent = p.a.sent.last().unwrap().clone();
    let v1::Body::Msg(c) = header(&sent).body else {
        panic!()
    };
    let w = c.writes.iter().next().unwrap().segments().next().unwrap();
    let rc: Vec<_> = c.reply.unwrap().segments().collect();
    assert_eq!(rc.len(), 2);
    let out = pattern(4, 4000);
    assert!(p.a.remote_write(w.handle, w.offset, &out));
    assert!(p
        .a
        .remote_write(rc[0].handle, rc[0].offset, &rpcmsg::reply_header(9, 0)));
    assert!(p.a.remote_write(rc[1].handle, rc[1].offset, &be(&[4000])));
    let mut r = be(&[9, 1, 8, 1, 0, 1, 1, w.handle, 4000]);
    r.extend(w.offset.to_be_bytes());
    r.extend(be(&[0, 1, 2, rc[0].handle, 24]));
    r.extend(rc[0].offset.to_be_bytes());
    r.extend(be(&[rc[1].handle, 4]));
    r.extend(rc[1].offset.to_be_bytes());
    p.inject(false, &r);
    let d = done(&mut p);
    assert_eq!(
        (
            d[0].status,
            d[0].reply_len,
            &d[0].results().collect::<Vec<_>>()[..]
        ),
        (CallStatus::Ok, 4, &[(4, 4000)][..]),
        "{d:?}"
    );
    assert_eq!(p.a.get(reply.prefix(4).unwrap()), be(&[4000]));
    assert_eq!(p.a.get(result), out);
    assert_eq!(p.a.env.live_windows(), 0);
}

#[test]
fn r8166_4_5_3_b_reply_chunk_too_small_is_err_chunk() {
    // libevpl bug list: "undersized Reply chunk not answered with ERR_CHUNK". The peer
    // offers a 100-byte Reply chunk for a READ of 3000 bytes with no Write chunk: the
    // reply fits neither inline (1024) nor the chunk.
    let mut p = Pair::default_pair();
    let land = p.a.alloc(100);
    let seg =
        p.a.env
            .expose(land, rpcrdma_verbs::Access::REMOTE_WRITE)
            .unwrap();
    let mut m = be(&[5, 1, 8, 0, 0, 0, 1, 1, seg.handle, 100]);
    m.extend(seg.offset.to_be_bytes());
    m.extend(rpcmsg::call_header(5, RDMATEST_PROG, 1, rdmatest::READ));
    m.extend(be(&[3000, 1]));
    p.inject(true, &m);
    serve(&mut p);
    assert_eq!(p.b.sent.last().unwrap(), &be(&[5, 1, 8, 4, 2]));
    assert!(
        !p.b.log.iter().any(|w| matches!(w, Work::Write { .. })),
        "nothing written into the chunk"
    );
    assert_eq!(p.a.get(land), vec![0; 100]);
    assert!(p.b.events.iter().any(|e| matches!(
        e,
        Event::ReplyDone {
            status: ReplyStatus::ErrChunk,
            ..
        }
    )));
    assert_eq!(p.b.conn.closed(), None);

    // Through our own requester: a 2000-byte reply buffer makes a Reply chunk of 24 + 2000
    // bytes; the server's 3000-byte result does not fit it, and the app sees ErrChunk.
    let mut p = Pair::default_pair();
    let msg = p.a.put(&be(&[3000, 1]));
    let reply = p.a.alloc(2000);
    let spec = CallSpec {
        auth: None,
        user: 1,
        xid: 6,
        prog: RDMATEST_PROG,
        vers: 1,
        proc_: rdmatest::READ,
        msg,
        args: &[],
        results: &[],
        reply,
    };
    call(&mut p, &spec);
    let v1::Body::Msg(c) = header(&p.a.sent[0]).body else {
        panic!()
    };
    assert_eq!(
        c.reply.unwrap().length(),
        24 + 2000,
        "a Reply chunk was offered"
    );
    serve(&mut p);
    assert_eq!(p.b.sent.last().unwrap(), &be(&[6, 1, 8, 4, 2]));
    assert!(!p.b.log.iter().any(|w| matches!(w, Work::Write { .. })));
    let d = done(&mut p);
    assert_eq!((d.len(), d[0].status), (1, CallStatus::ErrChunk));
    assert_eq!(p.a.env.live_windows(), 0);
}

#[test]
fn impl_7_2_1_1_a_wrapping_lengths_and_offsets_are_header_errors() {
    // libevpl bug list: "32-bit overflow in XDR bounds checks". Each header below has a
    // sum that wraps (32-bit chunk lengths, 64-bit segment ends): each is a header error
    // answered with ERR_CHUNK before any RDMA operation, and the connection stays.
    let mut p = Pair::default_pair();
    let wcall = |xid: u32, n: u32| {
        let mut c = rpcmsg::call_header(xid, RDMATEST_PROG, 1, rdmatest::WRITE).to_vec();
        c.extend(be(&[5, n]));
        c
    };
    let seg = |h: u32, len: u32, off: u64| {
        let mut v = be(&[h, len]);
        v.extend(off.to_be_bytes());
        v
    };
    let cases: Vec<(u32, Vec<u8>)> = vec![
        // Two segments of one read chunk whose lengths sum to 2^32 + 4 (wraps to 4).
        (1, {
            let mut m = be(&[1, 1, 8, 0, 1, 48]);
            m.extend(seg(0x77, 0x8000_0000, 0));
            m.extend(be(&[1, 48]));
            m.extend(seg(0x77, 0x8000_0004, 0x1000));
            m.extend(be(&[0, 0, 0]));
            m.extend(wcall(1, 4));
            m
        }),
        // A PZRC whose two segments wrap the same way (a Long call of "8 bytes").
        (2, {
            let mut m = be(&[2, 1, 8, 1, 1, 0]);
            m.extend(seg(0x77, 0xffff_fffc, 0));
            m.extend(be(&[1, 0]));
            m.extend(seg(0x77, 12, 0x1000));
            m.extend(be(&[0, 0, 0]));
            m
        }),
        // A read segment whose offset + length wraps 64 bits.
        (3, {
            let mut m = be(&[3, 1, 8, 0, 1, 48]);
            m.extend(seg(0x77, 1500, u64::MAX - 100));
            m.extend(be(&[0, 0, 0]));
            m.extend(wcall(3, 1500));
            m
        }),
        // A Write chunk whose segment count times 16 wraps 32 bits (0x1000_0001 * 16 = 16).
        (4, {
            let mut m = be(&[4, 1, 8, 0, 0, 1, 0x1000_0001]);
            m.extend(seg(0x77, 4096, 0));
            m.extend(be(&[0, 0]));
            m.extend(rpcmsg::call_header(4, RDMATEST_PROG, 1, rdmatest::READ));
            m.extend(be(&[4096, 1]));
            m
        }),
        // A Reply chunk segment whose offset + length wraps 64 bits.
        (5, {
            let mut m = be(&[5, 1, 8, 0, 0, 0, 1, 1]);
            m.extend(seg(0x77, 8192, u64::MAX - 8000));
            m.extend(rpcmsg::call_header(5, RDMATEST_PROG, 1, rdmatest::READ));
            m.extend(be(&[3000, 1]));
            m
        }),
    ];
    for (xid, m) in &cases {
        let before = p.b.sent.len();
        p.inject(true, m);
        serve(&mut p);
        assert_eq!(p.b.sent.len(), before + 1, "case {xid}: one answer");
        assert_eq!(
            p.b.sent[before],
            be(&[*xid, 1, 8, 4, 2]),
            "case {xid}: ERR_CHUNK"
        );
    }
    // A data chunk at position 2^32 - 4, whose end wraps 32 bits: decoded (the decoder
    // computes ends in 64 bits), then refused by the reassembly plan as lying outside the
    // call: GARBAGE_ARGS, the call is not executed (AMB-12).
    let cases: Vec<(u32, Vec<u8>)> = vec![(6, {
        let mut m = be(&[6, 1, 8, 0, 1, 0xffff_fffc]);
        m.extend(seg(0x77, 8, 0));
        m.extend(be(&[1, 48]));
        m.extend(seg(0x77, 8, 0x100));
        m.extend(be(&[0, 0, 0]));
        m.extend(wcall(6, 8));
        m
    })];
    for (xid, m) in &cases {
        p.inject(true, m);
        serve(&mut p);
        assert_eq!(
            &p.b.sent.last().unwrap()[28..],
            &rpcmsg::reply_header(*xid, rpcmsg::GARBAGE_ARGS)[..]
        );
    }
    assert!(
        !p.b.log
            .iter()
            .any(|w| matches!(w, Work::Read { .. } | Work::Write { .. })),
        "no RDMA operation on a wrapped range"
    );
    assert!(!p
        .b
        .events
        .iter()
        .any(|e| matches!(e, Event::IncomingCall(_))));
    assert_eq!(p.b.conn.closed(), None);
    // An RPC credential whose length wraps the header offset: not a call, GARBAGE_ARGS.
    let mut rpc = be(&[7, 0, 2, RDMATEST_PROG, 1, 0, 1, 0xffff_fff8]);
    rpc.extend(be(&[0, 0, 0, 0]));
    let mut m = be(&[7, 1, 8, 0, 0, 0, 0]);
    m.extend(&rpc);
    p.inject(true, &m);
    serve(&mut p);
    assert_eq!(
        &p.b.sent.last().unwrap()[28..],
        &rpcmsg::reply_header(7, rpcmsg::GARBAGE_ARGS)[..]
    );
    assert_eq!(p.b.conn.closed(), None);
    // The connection still serves a real call.
    bulk(&mut p, 8, &[1; 8], 64);
    p.run();
    serve(&mut p);
    assert_eq!(done(&mut p)[0].status, CallStatus::Ok);
}

#[test]
fn amb_10_pzrc_plus_data_chunk_reassembled_and_amb_12_ineligible_chunk_garbage_args() {
    let mut p = Pair::default_pair();
    // Expose, as the peer, a PZRC holding an unreduced-except-data WRITE call and a data chunk.
    let data = pattern(5, 2000);
    let mut stream = rpcmsg::call_header(21, RDMATEST_PROG, 1, rdmatest::WRITE).to_vec();
    stream.extend(be(&[5, 2000]));
    let pz = p.a.put(&stream);
    let dc = p.a.put(&data);
    let pz_seg =
        p.a.env
            .expose(pz, rpcrdma_verbs::Access::REMOTE_READ)
            .unwrap();
    let dc_seg =
        p.a.env
            .expose(dc, rpcrdma_verbs::Access::REMOTE_READ)
            .unwrap();
    let mut m = be(&[21, 1, 8, 1]);
    m.extend(be(&[1, 0, pz_seg.handle, pz_seg.length]));
    m.extend(pz_seg.offset.to_be_bytes());
    m.extend(be(&[1, 48, dc_seg.handle, dc_seg.length]));
    m.extend(dc_seg.offset.to_be_bytes());
    m.extend(be(&[0, 0, 0]));
    p.inject(true, &m);
    serve(&mut p);
    let rb = p.b.sent.last().unwrap().clone();
    // WRITE returns the number of matching bytes: all 2000.
    assert_eq!(
        &rb[28..],
        &[rpcmsg::reply_header(21, 0).to_vec(), be(&[2000])].concat()[..]
    );

    // A data chunk at a position that is not the eligible item: GARBAGE_ARGS (AMB-12).
    let mut call = rpcmsg::call_header(22, RDMATEST_PROG, 1, rdmatest::WRITE).to_vec();
    call.extend(be(&[5, 2000]));
    let mut m = be(&[22, 1, 8, 0]);
    m.extend(be(&[1, 44, dc_seg.handle, dc_seg.length]));
    m.extend(dc_seg.offset.to_be_bytes());
    m.extend(be(&[0, 0, 0]));
    m.extend(&call);
    p.inject(true, &m);
    let rb = p.b.sent.last().unwrap().clone();
    assert_eq!(
        &rb[28..],
        &rpcmsg::reply_header(22, rpcmsg::GARBAGE_ARGS)[..]
    );
    assert!(!p
        .b
        .events
        .iter()
        .any(|e| matches!(e, Event::IncomingCall(c) if c.xid == 22)));
}

#[test]
fn r8166_3_4_5_2_c_short_read_chunk_is_garbage_args() {
    let mut p = Pair::default_pair();
    let dc = p.a.put(&[0; 4]);
    let seg =
        p.a.env
            .expose(dc, rpcrdma_verbs::Access::REMOTE_READ)
            .unwrap();
    let mut call = rpcmsg::call_header(3, RDMATEST_PROG, 1, rdmatest::WRITE).to_vec();
    call.extend(be(&[5, 5]));
    let mut m = be(&[3, 1, 8, 0, 1, 48, seg.handle, 4]);
    m.extend(seg.offset.to_be_bytes());
    m.extend(be(&[0, 0, 0]));
    m.extend(&call);
    p.inject(true, &m);
    let rb = p.b.sent.last().unwrap().clone();
    assert_eq!(
        &rb[28..],
        &rpcmsg::reply_header(3, rpcmsg::GARBAGE_ARGS)[..]
    );
}

#[test]
fn r8166_3_3_1_j_reads_never_exceed_ord() {
    let mut client = sim::config(Role::Client, 8);
    client.send_size = 1024;
    let mut server = sim::config(Role::Server, 8);
    server.max_reads = 2;
    let mut p = Pair::new(client, server);
    // A long call with several argument pieces gives a PZRC of many segments.
    let msg = p.a.put(&[0; 64]);
    let pieces: Vec<ArgPiece> = (0..4)
        .map(|k| ArgPiece {
            mem: p.a.put(&pattern(k, 999)),
            xdr_pos: 16 * k,
        })
        .collect();
    let reply = p.a.alloc(8192);
    let spec = CallSpec {
        auth: None,
        user: 1,
        xid: 1,
        prog: BULK_PROG,
        vers: 1,
        proc_: 1,
        msg,
        args: &pieces,
        results: &[],
        reply,
    };
    call(&mut p, &spec);
    serve(&mut p);
    let d = done(&mut p);
    assert_eq!(d[0].status, CallStatus::Ok);
    assert!(p.b.max_reads_in_flight <= 2, "{}", p.b.max_reads_in_flight);
    let reads =
        p.b.log
            .iter()
            .filter(|w| matches!(w, Work::Read { .. }))
            .count();
    assert!(reads > 2);
    // The echoed bytes are the unreduced stream: pieces inline with pad.
    let mut want = Vec::new();
    let mut cur = 0;
    for (k, pc) in pieces.iter().enumerate() {
        want.extend(&[0u8; 64][cur..pc.xdr_pos as usize]);
        cur = pc.xdr_pos as usize;
        want.extend(pattern(k as u32, 999));
        want.push(0);
    }
    want.extend(&[0u8; 64][cur..]);
    assert_eq!(p.a.get(reply.prefix(d[0].reply_len).unwrap()), want);
}

#[test]
fn r8166_4_5_4_a_exposure_failure_fails_call_at_once() {
    let mut p = Pair::default_pair();
    p.a.env.refuse_expose = true;
    echo(&mut p, 1, &pattern(1, 4000));
    p.run();
    let d = done(&mut p);
    assert_eq!(d[0].status, CallStatus::Local);
    assert!(p.a.sent.is_empty());
    // The connection stays usable.
    p.a.env.refuse_expose = false;
    bulk(&mut p, 2, &[0; 4], 64);
    p.run();
    serve(&mut p);
    assert_eq!(done(&mut p)[0].status, CallStatus::Ok);
}

#[test]
fn r8166_4_5_5_a_connection_loss_completes_every_call_once() {
    let mut p = Pair::default_pair();
    bulk(&mut p, 1, &[0; 4], 64);
    bulk(&mut p, 2, &[0; 4], 64);
    bulk(&mut p, 3, &[0; 4], 64);
    p.run();
    p.a.conn.close(CloseReason::Requested);
    p.run();
    let d = done(&mut p);
    assert_eq!(d.len(), 3);
    assert!(d.iter().all(|d| d.status == CallStatus::Closed));
    let mut xids: Vec<u32> = d.iter().map(|d| d.xid).collect();
    xids.sort();
    assert_eq!(xids, [1, 2, 3]);
    assert_eq!(
        p.a.events.back(),
        Some(&Event::Closed(CloseReason::Requested))
    );
    assert!(
        p.a.conn.submit_call(
            &CallSpec {
                auth: None,
                user: 0,
                xid: 9,
                prog: 1,
                vers: 1,
                proc_: 0,
                msg: MemRef::default(),
                args: &[],
                results: &[],
                reply: MemRef::default(),
            },
            &mut p.a.env
        ) == Err(SubmitError::Closed)
    );
}

#[test]
fn r8166_4_5_3_a_failed_rdma_operation_ends_connection() {
    let mut p = Pair::default_pair();
    // A read chunk whose key the peer never exposed: the Read fails, the connection ends.
    let mut call = rpcmsg::call_header(3, RDMATEST_PROG, 1, rdmatest::WRITE).to_vec();
    call.extend(be(&[5, 1500]));
    let mut m = be(&[3, 1, 8, 0, 1, 48, 0xbad, 1500, 0, 0, 0, 0, 0]);
    m.extend(&call);
    p.inject(true, &m);
    serve(&mut p);
    assert!(matches!(
        p.b.conn.closed(),
        Some(CloseReason::WorkFailed(_))
    ));
    assert!(p
        .b
        .events
        .iter()
        .any(|e| matches!(e, Event::ServeAborted { .. })));
}

#[test]
fn r8166_7_1_b_backward_call_routed_by_msg_type() {
    let mut p = Pair::default_pair();
    // The server (b) calls the client (a) on the same connection.
    let reply = submit_backward(&mut p.b, 1, 0x0102_0304);
    // At the same time the client has forward call xid 1 outstanding.
    bulk(&mut p, 1, &[9; 4], 64);
    p.run();
    let inc = p.a.events.iter().find_map(|e| match e {
        Event::IncomingCall(c) => Some(*c),
        _ => None,
    });
    let c = inc.expect("backward call delivered at the client");
    assert_eq!((c.prog, c.xid, c.args_len), (0x2052_4455, 1, 8));
    let buf = p.a.alloc(8);
    let got = p.a.conn.accept_call(c.id, buf, &mut p.a.env).unwrap();
    // An inline call's arguments are in place at once (no ArgsReady follows).
    assert_eq!(
        got,
        Accepted::Ready {
            args_len: c.args_len
        }
    );
    p.run();
    let m = p.a.put(&be(&[4, 0x0506_0708]));
    p.a.conn
        .submit_reply(
            c.id,
            &ReplySpec {
                accept_stat: 0,
                msg: m,
                results: &[],
            },
            &mut p.a.env,
        )
        .unwrap();
    p.run();
    serve(&mut p);
    let bd: Vec<CallDone> =
        p.b.events
            .iter()
            .filter_map(|e| match e {
                Event::CallDone(d) => Some(*d),
                _ => None,
            })
            .collect();
    assert_eq!(bd.len(), 1);
    assert_eq!((bd[0].user, bd[0].status), (1, CallStatus::Ok));
    assert_eq!(p.b.get(reply.prefix(8).unwrap()), be(&[4, 0x0506_0708]));
    let d = done(&mut p);
    assert_eq!((d[0].xid, d[0].status), (1, CallStatus::Ok));
}

#[test]
fn v2_5_2_a_err_vers_falls_back_to_version_1() {
    let mut client = sim::config(Role::Client, 8);
    client.version = 2;
    let mut p = Pair::new(client, sim::config(Role::Server, 8));
    bulk(&mut p, 1, &[3; 8], 64);
    p.run();
    // The v1-only responder answered ERR_VERS; the call went again as version 1.
    let sends = p.a.sent.clone();
    assert_eq!(sends.len(), 2);
    assert_eq!(proto::Fixed::peek(&sends[0].clone()).unwrap().vers, 2);
    assert_eq!(proto::Fixed::peek(&sends[1].clone()).unwrap().vers, 1);
    serve(&mut p);
    let d = done(&mut p);
    assert_eq!(
        (d.len(), d[0].status, d[0].reply_len),
        (1, CallStatus::Ok, 8)
    );
    assert_eq!(p.a.conn.version(), 1);
}

/// A version-two call answered ERR_VERS, cancelled while its chunk is being fenced before it
/// goes again as version 1: it ends then, cancelled (not lent: its memory is fenced), and is
/// not sent again.
#[test]
fn v2_5_2_a_a_call_cancelled_before_its_version_1_resend_ends_fenced() {
    let mut client = sim::config(Role::Client, 8);
    client.version = 2;
    let mut p = Pair::new(client, sim::config(Role::Server, 8));
    let (spec, _) = read_8k_spec(&mut p.a, 5);
    p.a.conn.submit_call(&spec, &mut p.a.env).unwrap();
    let mut cancelled = false;
    for _ in 0..100 {
        p.step();
        if p.a.conn.stats().invalidations == 1 && p.a.sent.len() == 1 {
            assert_eq!(
                p.a.conn.call_user(5),
                Some(5),
                "still the owner's to cancel"
            );
            p.a.conn.cancel_call(5).unwrap();
            cancelled = true;
            break;
        }
    }
    assert!(cancelled, "never caught between ERR_VERS and the resend");
    p.run();
    let d = done(&mut p);
    assert_eq!(
        (d.len(), d[0].status, d[0].lent),
        (1, CallStatus::Cancelled, false)
    );
    assert_eq!(p.a.sent.len(), 1, "not sent again");
    assert_eq!(p.a.env.live_windows(), 0);
    assert_eq!(p.a.conn.calls_in_flight(), 0);
}

#[test]
fn v2_5_3_a_version_two_call_and_reply() {
    let mut client = sim::config(Role::Client, 8);
    client.version = 2;
    let mut server = sim::config(Role::Server, 8);
    server.version = 2;
    let mut p = Pair::new(client, server);
    let data = pattern(4, 20000);
    let (result, _) = echo(&mut p, 1, &data);
    p.run();
    serve(&mut p);
    let d = done(&mut p);
    assert_eq!(d[0].status, CallStatus::Ok, "{d:?}");
    assert_eq!(p.a.get(result), data);
    let r = p.b.sent.last().unwrap().clone();
    let f = proto::Fixed::peek(&r).unwrap();
    assert_eq!((f.vers, f.proc), (2, 0));
    // V2-4.2.2-b: the direction word says REPLY.
    assert_eq!(&r[16..20], &1u32.to_be_bytes());
}

/// A responder configured for version two answers a version-1 call in version 1: an inline
/// reply (the plain path) and one using a Write chunk (the general path).
#[test]
fn v2_5_3_a_version_one_call_to_a_version_two_responder() {
    let mut server = sim::config(Role::Server, 8);
    server.version = 2;
    let mut p = Pair::new(sim::config(Role::Client, 8), server);
    let reply = bulk(&mut p, 1, &[3; 8], 64);
    p.run();
    serve(&mut p);
    let data = pattern(5, 20000);
    let (result, _) = echo(&mut p, 2, &data);
    p.run();
    serve(&mut p);
    let d = done(&mut p);
    assert_eq!(d.len(), 2);
    assert!(d.iter().all(|d| d.status == CallStatus::Ok), "{d:?}");
    assert_eq!(p.a.get(reply.prefix(8).unwrap()), vec![3; 8]);
    assert_eq!(p.a.get(result), data);
    assert_eq!(p.b.sent.len(), 2);
    for r in &p.b.sent {
        let f = proto::Fixed::peek(r).unwrap();
        assert_eq!((f.vers, f.proc), (1, v1::RDMA_MSG));
    }
    // The client speaks version 1, so the server's own calls on the connection (backward
    // direction) go in version 1 too, and the client takes them.
    assert_eq!(p.b.conn.version(), 1);
    submit_backward(&mut p.b, 77, 0x0102_0304);
    p.run();
    let last = p.b.sent.last().unwrap();
    assert_eq!(proto::Fixed::peek(last).unwrap().vers, 1);
    assert!(p
        .a
        .events
        .iter()
        .any(|e| matches!(e, Event::IncomingCall(c) if c.xid == 77)));
}

#[test]
fn v2_3_1_b_optional_messages_surface_and_unknown_get_inval_option() {
    let mut client = sim::config(Role::Client, 8);
    client.version = 2;
    let mut server = sim::config(Role::Server, 8);
    server.version = 2;
    let mut p = Pair::new(client, server);
    p.a.conn
        .send_optional(55, 0x1234, &[0, 0, 0, 1], &mut p.a.env)
        .unwrap();
    p.run();
    let Some(Event::Optional(o)) = p.b.events.pop_front() else {
        panic!("{:?}", p.b.events)
    };
    assert_eq!((o.xid, o.opttype, o.direction), (55, 0x1234, MsgType::Call));
    assert_eq!(o.optinfo(), &[0, 0, 0, 1]);
    p.b.conn.reject_optional(55, &mut p.b.env);
    p.run();
    assert_eq!(p.b.sent[0].clone(), be(&[55, 2, 8, 4, 3]));
    // Counted by code on both sides.
    let inval = crate::ErrorCounts {
        inval_option: 1,
        ..Default::default()
    };
    assert_eq!(p.b.conn.stats().errors_sent_by, inval);
    assert_eq!(p.a.conn.stats().errors_received_by, inval);
    assert_eq!(p.a.conn.stats().errors_received, 1);
}

#[test]
fn amb_11_reply_for_unknown_xid_dropped() {
    let mut p = Pair::default_pair();
    let mut r = be(&[99, 1, 8, 0, 0, 0, 0]);
    r.extend(rpcmsg::reply_header(99, 0));
    p.inject(false, &r);
    assert_eq!(p.a.conn.stats().dropped, 1);
    assert!(p.a.sent.is_empty());
}

mod props {
    use super::*;
    use proptest::prelude::*;

    /// The RDMATEST calls of the mix, by transfer mode (TESTPROG.md).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Kind {
        /// NULL: short both ways.
        Null,
        /// ECHO with the data as a DDP-eligible argument and a result buffer: inline, or a
        /// Read chunk and a Write chunk from ddp_threshold on.
        EchoDdp,
        /// ECHO with the data left in the reduced XDR and no result buffer: a Long call and
        /// a Long reply when large.
        EchoLong,
        /// READ into a result buffer: a Write chunk from ddp_threshold on.
        ReadDdp,
        /// READ without a result buffer: the result inline or in the Reply chunk.
        ReadLong,
        /// WRITE with the data as a DDP-eligible argument: a Read chunk when large.
        WriteDdp,
        /// WRITE with the data inline in the reduced XDR: a Long call when large.
        WriteLong,
    }

    const KINDS: [Kind; 7] = [
        Kind::Null,
        Kind::EchoDdp,
        Kind::EchoLong,
        Kind::ReadDdp,
        Kind::ReadLong,
        Kind::WriteDdp,
        Kind::WriteLong,
    ];

    /// One step of a mix: a call to submit, then what the test does before the next one.
    #[derive(Clone, Copy, Debug)]
    struct Op {
        kind: Kind,
        len: u32,
        /// Extra reply-buffer bytes (changes whether a Reply chunk is offered).
        slack: u32,
        /// 0..=2 submit on (calls pile up), 3 run, 4 answer one held call, 5 answer all
        /// held calls in a random order, 6 change the requested credits, 7 change the grant.
        then: u8,
        arg: u32,
    }

    #[derive(Clone, Debug)]
    struct Mix {
        /// Send and receive sizes: client send, client receive, server send, server receive.
        sizes: [u32; 4],
        credits: u32,
        grant: u32,
        shared: bool,
        remote_inv: bool,
        /// Both sides' providers report unsignaled Sends as well.
        report_unsignaled: bool,
        ops: Vec<Op>,
    }

    /// What a call must come back with.
    struct Want {
        xid: u32,
        kind: Kind,
        len: u32,
        data: Vec<u8>,
        result: Option<MemRef>,
        reply: MemRef,
    }

    fn round4(n: u32) -> u32 {
        n.div_ceil(4) * 4
    }

    fn padded(words: &[u32], data: &[u8]) -> Vec<u8> {
        let mut v = be(words);
        v.extend(data);
        v.resize(
            v.len() + (round4(data.len() as u32) as usize - data.len()),
            0,
        );
        v
    }

    fn submit(p: &mut Pair, xid: u32, op: &Op) -> (Want, bool) {
        let n = op.len;
        let seed = xid.wrapping_mul(7);
        let data = pattern(seed, n as usize);
        let mut args: Vec<ArgPiece> = Vec::new();
        let mut results: Vec<MemRef> = Vec::new();
        let (proc_, msg, reply_need, want_data) = match op.kind {
            Kind::Null => (rdmatest::NULL, Vec::new(), 0, Vec::new()),
            Kind::EchoDdp => {
                args.push(ArgPiece {
                    mem: p.a.put(&data),
                    xdr_pos: 4,
                });
                results.push(p.a.alloc(n));
                let need = if n >= 1024 { 4 } else { 4 + round4(n) };
                (rdmatest::ECHO, be(&[n]), need, data.clone())
            }
            Kind::EchoLong => (
                rdmatest::ECHO,
                padded(&[n], &data),
                4 + round4(n),
                data.clone(),
            ),
            Kind::ReadDdp => {
                results.push(p.a.alloc(n));
                let need = if n >= 1024 { 4 } else { 4 + round4(n) };
                (rdmatest::READ, be(&[n, seed]), need, data.clone())
            }
            Kind::ReadLong => (rdmatest::READ, be(&[n, seed]), 4 + round4(n), data.clone()),
            Kind::WriteDdp => {
                args.push(ArgPiece {
                    mem: p.a.put(&data),
                    xdr_pos: 8,
                });
                (rdmatest::WRITE, be(&[seed, n]), 4, Vec::new())
            }
            Kind::WriteLong => (rdmatest::WRITE, padded(&[seed, n], &data), 4, Vec::new()),
        };
        let msg = p.a.put(&msg);
        let reply = p.a.alloc(reply_need + op.slack);
        let spec = CallSpec {
            auth: None,
            user: u64::from(xid),
            xid,
            prog: RDMATEST_PROG,
            vers: 1,
            proc_,
            msg,
            args: &args,
            results: &results,
            reply,
        };
        let mut queued = false;
        for _ in 0..1000 {
            match p.a.conn.submit_call(&spec, &mut p.a.env) {
                Ok(()) => {
                    queued = true;
                    break;
                }
                // Every call slot is taken: let the server answer one, then retry.
                Err(SubmitError::Busy) => {
                    sim::intake(p);
                    sim::answer_ready(p, xid as usize);
                }
                Err(e) => panic!("submit {xid}: {e:?}"),
            }
        }
        let want = Want {
            xid,
            kind: op.kind,
            len: n,
            data: want_data,
            result: results.first().copied(),
            reply,
        };
        (want, queued)
    }

    fn check(p: &Pair, w: &Want, d: &CallDone) {
        let ctx = format!("xid {} {:?} len {}: {d:?}", w.xid, w.kind, w.len);
        assert_eq!(
            (d.user, d.status, d.rpc_stat),
            (u64::from(w.xid), CallStatus::Ok, 0),
            "{ctx}"
        );
        let got =
            p.a.get(w.reply.prefix(d.reply_len).expect("reply_len fits"));
        let n = w.len;
        match w.kind {
            Kind::Null => assert_eq!(d.reply_len, 0, "{ctx}"),
            Kind::WriteDdp | Kind::WriteLong => {
                // The server counted every byte as matching pattern(seed).
                assert_eq!(got, be(&[n]), "{ctx}");
            }
            Kind::EchoDdp | Kind::ReadDdp => {
                let (pos, used) = d.results().next().unwrap();
                if used > 0 {
                    // Through the Write chunk: the reply holds only the length word.
                    assert_eq!((pos, used, d.reply_len), (4, n, 4), "{ctx}");
                    assert!(p.a.get(w.result.unwrap()) == w.data, "{ctx}: chunk bytes");
                } else {
                    assert!(n < 1024, "{ctx}: a large result went inline");
                    assert!(got == padded(&[n], &w.data), "{ctx}: inline bytes");
                }
            }
            Kind::EchoLong | Kind::ReadLong => {
                assert!(got == padded(&[n], &w.data), "{ctx}: reply bytes");
            }
        }
    }

    /// Runs a mix; returns the most calls seen in flight at once and both sides' counters.
    fn run_mix(m: &Mix) -> (u32, Stats, Stats) {
        let [cs, cr, ss, sr] = m.sizes;
        let mut client = sim::config(Role::Client, 8);
        client.credits = m.credits;
        client.send_size = cs;
        client.recv_size = cr;
        client.shared_send = m.shared;
        client.peer = peer_announced(ss, sr, false);
        let mut server = sim::config(Role::Server, 8);
        server.credits = m.grant;
        server.send_size = ss;
        server.recv_size = sr;
        server.shared_recv = m.shared;
        server.shared_send = m.shared;
        server.peer = peer_announced(cs, cr, m.remote_inv);
        let mut p = Pair::new(sim::sized(client), sim::sized(server));
        p.a.report_unsignaled = m.report_unsignaled;
        p.b.report_unsignaled = m.report_unsignaled;
        // R8166-3.3.2-a: each side's threshold is min(own send, peer receive).
        assert_eq!(p.a.conn.thresholds(), (cs.min(sr), ss.min(cr)));
        assert_eq!(p.b.conn.thresholds().0, ss.min(cr));
        let mut wants = Vec::new();
        let mut max_in_flight = 0;
        for (k, op) in m.ops.iter().enumerate() {
            let xid = 100 + k as u32;
            let (w, queued) = submit(&mut p, xid, op);
            assert!(queued, "call {xid} never found a free slot");
            wants.push(w);
            match op.then {
                0..=2 => {}
                3 => p.run(),
                4 => {
                    sim::intake(&mut p);
                    sim::answer_ready(&mut p, op.arg as usize);
                }
                5 => {
                    sim::intake(&mut p);
                    let mut r = op.arg as usize;
                    while sim::answer_ready(&mut p, r) {
                        r = r.wrapping_mul(31).wrapping_add(7);
                    }
                }
                // R8166-3.3.1-f: either side changes its value mid-run.
                6 => p.a.conn.set_credits(1 + op.arg % 8),
                _ => p.b.conn.set_credits(1 + op.arg % 8),
            }
            max_in_flight = max_in_flight.max(p.a.conn.calls_in_flight());
            assert!(p.a.conn.calls_in_flight() <= 8);
        }
        // Drain: the server answers what it holds, newest first.
        for _ in 0..10_000 {
            max_in_flight = max_in_flight.max(p.a.conn.calls_in_flight());
            let ready = sim::intake(&mut p);
            if ready == 0 {
                break;
            }
            sim::answer_ready(&mut p, ready - 1);
        }
        assert_eq!(p.a.conn.closed(), None);
        assert_eq!(p.b.conn.closed(), None);
        let d = done(&mut p);
        // Every call exactly once, each with its own reply.
        assert_eq!(d.len(), wants.len(), "{d:?}");
        for w in &wants {
            let mine: Vec<&CallDone> = d.iter().filter(|c| c.xid == w.xid).collect();
            assert_eq!(mine.len(), 1, "xid {}", w.xid);
            check(&p, w, mine[0]);
        }
        assert_eq!(p.a.conn.calls_in_flight(), 0);
        assert_eq!(p.rnr, 0, "a Send found no posted receive");
        assert_eq!(p.a.env.live_windows(), 0, "exposed memory left valid");
        if m.shared {
            // Every shared receive and send buffer went back to its pool.
            assert_eq!(p.b.posted_len(), 16);
            assert_eq!(p.a.env.sends.len(), sim::SEND_COUNT);
            assert_eq!(p.b.env.sends.len(), sim::SEND_COUNT);
        } else {
            assert_eq!(p.b.conn.recv_posted(), p.b.conn.config().recv_slots);
        }
        // Every Send completed, signaled or not: each send buffer is free again.
        for side in [&p.a, &p.b] {
            assert_eq!(side.conn.send_free(), side.conn.config().send_slots);
        }
        (max_in_flight, p.a.conn.stats(), p.b.conn.stats())
    }

    fn op() -> impl Strategy<Value = Op> {
        (
            0usize..7,
            prop_oneof![0u32..64, 900u32..1300, 1300u32..9000, 9000u32..40_000],
            prop_oneof![Just(0u32), 1u32..4096],
            0u8..8,
            any::<u32>(),
        )
            .prop_map(|(k, len, slack, then, arg)| Op {
                kind: KINDS[k],
                len: if KINDS[k] == Kind::Null { 0 } else { len },
                slack: slack & !3,
                then,
                arg,
            })
    }

    fn size() -> impl Strategy<Value = u32> {
        (256u32..=2048).prop_map(|w| w * 4)
    }

    #[test]
    fn prop_every_call_gets_its_reply_fixed_mix_keeps_many_in_flight() {
        // Every kind at sizes around the thresholds, eight calls submitted before any answer.
        let ops: Vec<Op> = (0..21)
            .map(|k| Op {
                kind: KINDS[k % 7],
                len: [0, 1020, 1024, 1028, 3000, 20_000, 50][k % 7] + k as u32,
                slack: 0,
                then: if k % 8 == 7 { 5 } else { 0 },
                arg: k as u32,
            })
            .collect();
        let m = Mix {
            sizes: [2048, 4096, 3072, 1024],
            credits: 8,
            grant: 8,
            shared: false,
            remote_inv: true,
            report_unsignaled: false,
            ops,
        };
        for (shared, report_unsignaled) in [(false, false), (true, false), (false, true)] {
            let (depth, a, b) = run_mix(&Mix {
                shared,
                report_unsignaled,
                ..m.clone()
            });
            assert_eq!(depth, 8, "eight calls in flight at once");
            // Every transfer mode was used: short, Read chunk, Write chunk, Long call, Long
            // reply (R8166-3.5).
            assert!(a.short_sent > 0 && b.short_sent > 0, "{a:?} {b:?}");
            assert!(a.read_chunks > 0 && b.read_bytes > 0, "{a:?} {b:?}");
            assert!(a.write_chunks > 0 && b.write_bytes > 0, "{a:?} {b:?}");
            assert!(a.long_calls > 0 && b.long_replies > 0, "{a:?} {b:?}");
            assert_eq!((a.calls_sent, b.replies_sent), (21, 21));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Random mixes of RDMATEST calls of every procedure and transfer mode, several in
        /// flight, answered in random order, under random credits and grants (changed
        /// mid-run) and random inline thresholds on both sides: every call gets exactly its
        /// reply with its bytes intact, and every buffer and key comes back.
        #[test]
        fn prop_every_call_gets_its_reply(
            sizes in [size(), size(), size(), size()],
            credits in 1u32..=8,
            grant in 1u32..=8,
            shared in any::<bool>(),
            remote_inv in any::<bool>(),
            report_unsignaled in any::<bool>(),
            ops in proptest::collection::vec(op(), 1..24),
        ) {
            run_mix(&Mix { sizes, credits, grant, shared, remote_inv, report_unsignaled, ops });
        }

        /// Hostile replies (random bytes after a plausible header for an outstanding XID)
        /// never panic the requester; it still completes or keeps each call.
        #[test]
        fn prop_hostile_replies_never_panic(
            tail in proptest::collection::vec(any::<u32>(), 0..40),
            small in proptest::collection::vec(0u32..6, 0..40),
            proc_ in 0u32..6,
        ) {
            let mut p = Pair::default_pair();
            echo(&mut p, 1, &pattern(1, 3000));
            p.run();
            let mut m = be(&[1, 1, 3, proc_]);
            m.extend(be(&small));
            m.extend(be(&tail));
            p.inject(false, &m);
            let d = done(&mut p);
            prop_assert!(d.len() <= 1);
            if p.a.conn.closed().is_none() && d.is_empty() {
                // The call is still outstanding: a real reply still completes it.
                serve(&mut p);
                prop_assert_eq!(done(&mut p).len(), 1);
            }
            prop_assert_eq!(p.rnr, 0);
        }

        /// Sessions scripted by random bytes (the engine fuzz target's driver,
        /// `conn::script`: calls of every kind both ways, an app that answers, rejects or
        /// botches replies, a peer injecting raw and plausible messages, control changes,
        /// faults, closes): every call and every served call ends exactly once, closes are
        /// reported once, and the shared buffers all come back.
        #[test]
        fn prop_scripted_sessions_keep_the_engine_contract(
            data in proptest::collection::vec(any::<u8>(), 0..800)
        ) {
            super::super::script::run(&data);
        }

        /// Scripted sessions do the same fed their completions in batches
        /// (`handle_completions`) as one at a time.
        #[test]
        fn prop_batched_completions_do_what_single_ones_do(
            data in proptest::collection::vec(any::<u8>(), 0..800)
        ) {
            super::fed_alike(&data);
        }

        /// Hostile bytes never panic the engine; a bad message costs at most its connection.
        #[test]
        fn prop_hostile_messages_never_panic(msgs in proptest::collection::vec(
            proptest::collection::vec(any::<u8>(), 0..200), 1..20),
            words in proptest::collection::vec(0u32..8, 0..60)) {
            let mut p = Pair::default_pair();
            for m in &msgs {
                if p.b.conn.closed().is_some() || p.b.conn.recv_posted() == 0 {
                    break;
                }
                p.inject(true, m);
            }
            // Structured garbage: small words make plausible headers.
            let mut m = be(&[1, 1, 1]);
            m.extend(be(&words));
            if p.b.conn.closed().is_none() && p.b.conn.recv_posted() > 0 {
                p.inject(true, &m);
            }
            serve(&mut p);
            prop_assert_eq!(p.rnr, 0);
        }
    }
}

/// The engine fuzz target's seeds (`fuzz/seeds/engine`) replayed as the target plays them:
/// each keeps the engine's contract, and those named for an NFSv4 COMPOUND get at least one
/// back byte for byte (RFC 8267 §5: WRITE data through the Read chunk, READ data through the
/// Write chunk with operations after it, or inline).
#[test]
fn scripted_seeds_keep_the_engine_contract() {
    use super::script::{play, Kind};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/engine");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    assert!(names.len() > 70, "{dir:?}");
    for path in names {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let checked = play(&std::fs::read(&path).unwrap());
        for (part, kind) in [
            ("nfs4-write", Kind::Nfs4Write),
            ("nfs4-read", Kind::Nfs4Read),
        ] {
            if name.contains(part) {
                assert!(checked.get(&kind) >= Some(&1), "{name}: {checked:?}");
            }
        }
    }
}

#[test]
fn memory_copy_overlapping_moves_like_memmove() {
    let mut m = crate::mem::VecMemory::new();
    m.add(sim::APP, 16);
    assert!(m.write(MemRef::new(sim::APP, 0, 8), &[1, 2, 3, 4, 5, 6, 7, 8]));
    assert!(m.copy(MemRef::new(sim::APP, 2, 6), MemRef::new(sim::APP, 0, 6)));
    assert_eq!(
        m.slice(MemRef::new(sim::APP, 0, 8)).unwrap(),
        &[3, 4, 5, 6, 7, 8, 7, 8]
    );
    assert!(!m.copy(MemRef::new(sim::APP, 12, 8), MemRef::new(sim::APP, 0, 8)));
    // Across regions, both directions.
    m.add(sim::POOL, 8);
    assert!(m.copy(MemRef::new(sim::APP, 0, 4), MemRef::new(sim::POOL, 4, 4)));
    assert_eq!(
        m.slice(MemRef::new(sim::POOL, 0, 8)).unwrap(),
        &[0, 0, 0, 0, 3, 4, 5, 6]
    );
    assert!(m.copy(MemRef::new(sim::POOL, 4, 2), MemRef::new(sim::APP, 14, 2)));
    assert_eq!(m.slice(MemRef::new(sim::APP, 14, 2)).unwrap(), &[3, 4]);
    assert!(!m.copy(MemRef::new(sim::POOL, 4, 8), MemRef::new(sim::APP, 0, 8)));
}

#[test]
fn r8166_3_3_1_f_lowered_grant_obeyed_from_next_reply() {
    let mut p = Pair::default_pair();
    bulk(&mut p, 0, &[0; 4], 64);
    p.run();
    serve(&mut p);
    assert_eq!(p.a.conn.credit_limit(), 8);
    p.b.conn.set_credits(3);
    bulk(&mut p, 1, &[0; 4], 64);
    p.run();
    serve(&mut p);
    assert_eq!(p.a.conn.credit_limit(), 3);
    for x in 2..10 {
        bulk(&mut p, x, &[0; 4], 64);
    }
    p.run();
    assert_eq!(p.a.conn.calls_in_flight(), 3);
    serve(&mut p);
    assert_eq!(done(&mut p).len(), 10);
}

#[test]
fn r8166_3_3_1_f_calls_sent_under_the_old_grant_are_not_an_overrun() {
    let mut p = Pair::default_pair();
    bulk(&mut p, 0, &[0; 4], 64);
    p.run();
    serve(&mut p);
    assert_eq!(done(&mut p).len(), 1);
    assert_eq!(p.a.conn.credit_limit(), 8);
    // The server lowers its grant while the client, which has only seen 8, sends 8 calls.
    p.b.conn.set_credits(2);
    for x in 1..9 {
        bulk(&mut p, x, &[0; 4], 64);
    }
    p.run();
    assert_eq!(p.a.conn.calls_in_flight(), 8);
    assert_eq!(sim::intake(&mut p), 8, "all eight taken in");
    assert_eq!(
        p.b.conn.closed(),
        None,
        "a conforming peer is not an overrun"
    );
    serve(&mut p);
    assert_eq!(done(&mut p).len(), 8);
    // From the lowered grant's replies on, the client keeps to 2.
    assert_eq!(p.a.conn.credit_limit(), 2);
    for x in 9..15 {
        bulk(&mut p, x, &[0; 4], 64);
    }
    p.run();
    assert_eq!(p.a.conn.calls_in_flight(), 2);
    serve(&mut p);
    assert_eq!(done(&mut p).len(), 6);
}

#[test]
fn r8166_7_1_d_client_grants_backward_credits_from_spare_receives() {
    let p = Pair::default_pair();
    // Client: 10 receives, 8 for forward replies, 2 left for backward calls.
    assert_eq!(p.a.conn.grant(), 2);
    assert_eq!(p.b.conn.grant(), 8);
}

#[test]
fn amb_33_v2_first_call_unanswered_closes_for_v1_reconnect() {
    let mut client = sim::config(Role::Client, 8);
    client.version = 2;
    let mut server = sim::config(Role::Server, 8);
    server.version = 2;
    let mut p = Pair::new(client, server);
    bulk(&mut p, 1, &[0; 4], 64);
    p.run();
    assert!(p.a.conn.wants_timer());
    let t0 = p.now;
    p.a.conn.handle_timeout(t0);
    assert_eq!(p.a.conn.poll_timeout(), Some(t0 + V2_FIRST_REPLY_TIMEOUT));
    p.a.conn.handle_timeout(t0 + V2_FIRST_REPLY_TIMEOUT / 2);
    assert_eq!(p.a.conn.closed(), None);
    p.a.conn.handle_timeout(t0 + V2_FIRST_REPLY_TIMEOUT);
    assert_eq!(p.a.conn.closed(), Some(CloseReason::NoAnswer));
    p.run();
    let d = done(&mut p);
    assert_eq!((d.len(), d[0].status), (1, CallStatus::Closed));
}

#[test]
fn v2_5_b_first_message_within_1024_then_v2_2_3_b_4096() {
    let mut client = sim::config(Role::Client, 8);
    client.version = 2;
    let mut server = sim::config(Role::Server, 8);
    server.version = 2;
    let mut p = Pair::new(client, server);
    bulk(&mut p, 1, &pattern(1, 2000), 2100);
    p.run();
    assert!(p.a.sent[0].len() <= 1024);
    assert_eq!(
        proto::Fixed::peek(&p.a.sent[0]).unwrap().proc,
        v2::RDMA2_NOMSG
    );
    serve(&mut p);
    assert!(!p.a.conn.wants_timer());
    assert_eq!(p.a.conn.thresholds(), (4096, 4096));
    // After the first answer a 2000-byte call goes inline.
    bulk(&mut p, 2, &pattern(2, 2000), 2100);
    p.run();
    assert_eq!(
        proto::Fixed::peek(&p.a.sent[1]).unwrap().proc,
        v2::RDMA2_MSG
    );
    serve(&mut p);
    let d = done(&mut p);
    assert!(d
        .iter()
        .all(|d| d.status == CallStatus::Ok && d.reply_len == 2000));
}

/// A queued call is cancelled at once; a sent inline call ends at once but keeps its XID and
/// credit until its late reply, which is dropped.
#[test]
fn r8166_4_4_c_cancelled_inline_call_ends_at_once_and_late_reply_returns_credit() {
    let mut p = Pair::default_pair();
    bulk(&mut p, 1, &[0; 4], 64);
    bulk(&mut p, 2, &[0; 4], 64);
    p.run();
    p.a.conn.cancel_call(2).unwrap();
    p.run();
    let d = done(&mut p);
    assert_eq!(
        (d[0].xid, d[0].status, d[0].lent),
        (2, CallStatus::Cancelled, false)
    );
    // A sent call with no chunk: nothing to fence, reported at once.
    p.a.conn.cancel_call(1).unwrap();
    p.a.drain_events();
    let d = done(&mut p);
    assert_eq!(
        (d[0].xid, d[0].status, d[0].lent),
        (1, CallStatus::Cancelled, false)
    );
    assert_eq!(p.a.conn.calls_in_flight(), 1, "still owed a reply");
    assert_eq!(p.a.conn.call_user(1), None, "not cancelled twice");
    assert_eq!(p.a.conn.cancel_call(1), Err(SubmitError::BadId));
    serve(&mut p);
    // The late reply returned the credit and is not reported again.
    assert!(done(&mut p).is_empty());
    assert!(released(&mut p).is_empty());
    assert_eq!(p.a.conn.calls_in_flight(), 0);
    assert_eq!(p.a.conn.credit_limit(), 8);
    assert_eq!(p.a.conn.stats().dropped, 1);
}

/// A READ whose result the server places with RDMA Write, cancelled while the server holds
/// it.
fn cancelled_read(p: &mut Pair, xid: u32) -> MemRef {
    let (spec, result) = read_8k_spec(&mut p.a, xid);
    call(p, &spec);
    assert_eq!(p.a.env.live_windows(), 1);
    intake(p);
    p.a.conn.cancel_call(xid).unwrap();
    p.a.drain_events();
    result
}

/// R8166-8.1.4-c, R8166-4.4-c: a cancelled call whose Write chunk is exposed ends at once,
/// *lent*: nothing is invalidated under the server's feet, so its late RDMA Write lands and
/// the connection lives. Once the late reply has come, the chunk is fenced and only then is
/// the memory released, once. Meanwhile the XID stays taken.
#[test]
fn r8166_8_1_4_c_a_cancelled_call_with_chunks_ends_lent_then_is_fenced_and_released() {
    let mut p = Pair::default_pair();
    let result = cancelled_read(&mut p, 3);
    let d = done(&mut p);
    assert_eq!(
        (d[0].xid, d[0].status, d[0].lent),
        (3, CallStatus::Cancelled, true)
    );
    assert_eq!(
        p.a.env.live_windows(),
        1,
        "not fenced under the server's feet"
    );
    assert_eq!(p.a.conn.call_user(3), None);
    assert_eq!(p.a.conn.cancel_call(3), Err(SubmitError::BadId));
    let again = CallSpec {
        auth: None,
        user: 9,
        ..bulk_spec(&mut p.a, 3, &[0; 4], 64)
    };
    assert_eq!(
        p.a.conn.submit_call(&again, &mut p.a.env),
        Err(SubmitError::Invalid("xid already outstanding"))
    );
    assert!(released(&mut p).is_empty());
    // The server answers: its Write reaches the (still lent) buffer, the reply is dropped,
    // the chunk is fenced, then released.
    while answer_ready(&mut p, 0) {}
    serve(&mut p);
    let placed = p.a.get(result.prefix(8192).unwrap());
    assert!(placed.iter().any(|&b| b != 0), "the late Write landed");
    assert!(done(&mut p).is_empty(), "ended once");
    assert_eq!(released(&mut p), [(3, 3)]);
    assert_eq!(p.a.env.live_windows(), 0);
    assert_eq!(p.a.conn.closed(), None, "the late Write cost nothing");
    assert_eq!(p.a.conn.calls_in_flight(), 0);
    assert_eq!(p.a.conn.stats().invalidations, 1);
    p.a.conn.submit_call(&again, &mut p.a.env).unwrap();
    p.run();
    serve(&mut p);
    assert_eq!(done(&mut p)[0].status, CallStatus::Ok);
}

/// A lent call whose late reply never comes is released when its connection ends (its queue
/// pair then reaches nothing), once, and not reported as ended again.
#[test]
fn r8166_8_1_4_c_a_lent_call_is_released_when_its_connection_ends() {
    let mut p = Pair::default_pair();
    cancelled_read(&mut p, 4);
    assert!(done(&mut p)[0].lent);
    p.a.conn.close(CloseReason::Requested);
    p.run();
    assert_eq!(released(&mut p), [(4, 4)]);
    assert!(done(&mut p).is_empty());
}

/// A WRITE call whose data (len `n`) is pulled from segments `segs` of the peer.
fn write_call_with_chunk(p: &mut Pair, xid: u32, n: u32, segs: &[(u32, u32, u64)]) -> Vec<u8> {
    let mut m = be(&[xid, 1, 8, 0]);
    for &(h, l, o) in segs {
        m.extend(be(&[1, 48, h, l]));
        m.extend(o.to_be_bytes());
    }
    m.extend(be(&[0, 0, 0]));
    m.extend(rpcmsg::call_header(xid, RDMATEST_PROG, 1, rdmatest::WRITE));
    m.extend(be(&[5, n]));
    p.inject(true, &m);
    serve(p);
    p.b.sent.last().unwrap().clone()
}

#[test]
fn r8166_3_4_4_a_unaligned_split_same_position_gathered() {
    let mut p = Pair::default_pair();
    let data = pattern(5, 10001);
    let parts = [(0usize, 4097usize), (4097, 3000), (7097, 2904)];
    let segs: Vec<(u32, u32, u64)> = parts
        .iter()
        .map(|&(o, l)| {
            let at = p.a.put(&data[o..o + l]);
            let s =
                p.a.env
                    .expose(at, rpcrdma_verbs::Access::REMOTE_READ)
                    .unwrap();
            (s.handle, s.length, s.offset)
        })
        .collect();
    let r = write_call_with_chunk(&mut p, 4, 10001, &segs);
    assert_eq!(
        &r[28..],
        &[rpcmsg::reply_header(4, 0).to_vec(), be(&[10001])].concat()[..]
    );
}

#[test]
fn r8166_3_4_5_2_b_chunk_with_pad_accepted() {
    let mut p = Pair::default_pair();
    let mut data = pattern(5, 5);
    data.extend([0, 0, 0]);
    let at = p.a.put(&data);
    let s =
        p.a.env
            .expose(at, rpcrdma_verbs::Access::REMOTE_READ)
            .unwrap();
    let r = write_call_with_chunk(&mut p, 6, 5, &[(s.handle, 8, s.offset)]);
    assert_eq!(
        &r[28..],
        &[rpcmsg::reply_header(6, 0).to_vec(), be(&[5])].concat()[..]
    );
}

#[test]
fn r8166_8_1_4_a_huge_read_chunk_refused_without_reads() {
    let mut p = Pair::default_pair();
    let r = write_call_with_chunk(&mut p, 8, 1 << 30, &[(0x77, 1 << 30, 0)]);
    assert_eq!(r, be(&[8, 1, 8, 4, 2]));
    assert!(!p.b.log.iter().any(|w| matches!(w, Work::Read { .. })));
}

#[test]
fn r8166_3_1_a_responder_exposes_nothing_and_4_3_1_b_replies_have_empty_read_list() {
    let mut p = Pair::default_pair();
    echo(&mut p, 1, &pattern(1, 30000));
    p.run();
    serve(&mut p);
    bulk(&mut p, 2, &pattern(2, 5000), 6000);
    p.run();
    serve(&mut p);
    assert_eq!(done(&mut p).len(), 2);
    assert_eq!(p.b.env.exposed_total(), 0);
    for r in &p.b.sent {
        let h = header(r);
        match h.body {
            v1::Body::Msg(c) | v1::Body::Nomsg(c) => assert!(c.reads.is_empty()),
            v1::Body::Error(_) => {}
        }
    }
}

#[test]
fn r8166_2_3_2_d_read_chunk_memory_kept_until_reply() {
    let mut p = Pair::default_pair();
    echo(&mut p, 1, &pattern(1, 3000));
    p.run();
    // Read chunk, Write chunk and the two Reply chunk segments exposed; no answer yet.
    assert_eq!(p.a.env.live_windows(), 4);
    assert!(!p.a.log.iter().any(|w| matches!(w, Work::Invalidate { .. })));
    serve(&mut p);
    assert_eq!(p.a.env.live_windows(), 0);
    // R8166-4.4-b: the invalidations precede the completion report.
    assert_eq!(done(&mut p)[0].status, CallStatus::Ok);
}

#[test]
fn r8166_3_3_1_i_responder_sends_only_answers_and_3_3_1_e_grant_constant() {
    let mut p = Pair::default_pair();
    for x in 0..12 {
        bulk(&mut p, x, &[0; 4], 64);
    }
    p.run();
    serve(&mut p);
    assert_eq!(done(&mut p).len(), 12);
    assert_eq!(p.b.sent.len(), 12);
    assert!(p
        .b
        .sent
        .iter()
        .all(|r| proto::Fixed::peek(r).unwrap().credit == 8));
    p.run();
    assert_eq!(p.b.sent.len(), 12);
}

#[test]
fn r8166_3_3_2_a_thresholds_are_min_of_send_and_peer_receive() {
    let mut cfg = sim::config(Role::Client, 4);
    cfg.peer = peer_announced(2048, 8192, false);
    let c = Connection::new(cfg).unwrap();
    assert_eq!(c.thresholds(), (4096, 2048));
    let c = Connection::new(sim::config(Role::Client, 4)).unwrap();
    assert_eq!(c.thresholds(), (1024, 1024));
}

/// R8166-3.3.2-a: the threshold for what the peer sends is what the peer computes, from the
/// receive size this side announced, even when the buffers posted are larger (the daemon posts
/// `pools.recv-buffer-size` and announces `transport.inline-recv`). A call whose reply may
/// exceed it offers a Reply chunk (R8166-4.3.3-a); before the announced size was used, the
/// 8192-byte buffers made it 4096 and the call went without one.
#[test]
fn r8166_3_3_2_a_the_reply_threshold_is_the_announced_receive_size() {
    let mut cfg = sim::config(Role::Client, 4);
    cfg.recv_size = 8192;
    cfg.peer = peer_announced(4096, 4096, false);
    let mut c = Connection::new(sim::sized(cfg)).unwrap();
    assert_eq!(c.thresholds(), (4096, 4096));
    c.set_announced_receive_size(2048);
    assert_eq!(c.thresholds(), (4096, 2048));
    // The peer's RFC 8797 data arriving later keeps it (the minimum of both).
    c.set_peer_send_size(8192);
    assert_eq!(c.thresholds(), (4096, 2048));
    c.set_peer_send_size(1024);
    assert_eq!(c.thresholds(), (4096, 1024));
    // Never above the buffers posted, never below 1024.
    c.set_peer_send_size(65536);
    c.set_announced_receive_size(1 << 20);
    assert_eq!(c.thresholds().1, 8192);
    c.set_announced_receive_size(0);
    assert_eq!(c.thresholds().1, 1024);

    // Between two engines: a call with a 3000-byte reply buffer offers a Reply chunk.
    let mut client = sim::config(Role::Client, 8);
    client.recv_size = 8192;
    client.peer = peer_announced(4096, 4096, false);
    let mut server = sim::config(Role::Server, 8);
    server.send_size = 4096;
    server.peer = peer_announced(4096, 2048, false);
    let mut p = Pair::new(sim::sized(client), sim::sized(server));
    p.a.conn.set_announced_receive_size(2048);
    let reply = bulk(&mut p, 1, &[5; 100], 3000);
    p.run();
    let v1::Body::Msg(c) = header(&p.a.sent[0]).body else {
        panic!()
    };
    assert!(
        c.reply.is_some(),
        "a Reply chunk for a reply of up to 3000 bytes"
    );
    serve(&mut p);
    let d = done(&mut p);
    assert_eq!((d[0].status, d[0].reply_len), (CallStatus::Ok, 100));
    assert_eq!(p.a.get(reply.prefix(100).unwrap()), [5; 100]);
}

#[test]
fn r8166_3_3_3_d_receive_buffers_hold_1024() {
    let mut cfg = sim::config(Role::Server, 4);
    cfg.recv_size = 512;
    assert!(Connection::new(cfg).is_err());
}

#[test]
fn r8166_3_3_3_e_1024_bytes_inline_1028_not() {
    let mut p = Pair::default_pair();
    // 28-byte header + 40-byte RPC header + 956 bytes = 1024: inline.
    bulk(&mut p, 1, &[7; 956], 64);
    p.run();
    serve(&mut p);
    bulk(&mut p, 2, &[7; 960], 64);
    p.run();
    assert_eq!(p.a.sent[0].len(), 1024);
    assert_eq!(header(&p.a.sent[0]).body.proc(), v1::RDMA_MSG);
    assert_eq!(header(&p.a.sent[1]).body.proc(), v1::RDMA_NOMSG);
}

#[test]
fn r8166_3_4_2_a_ineligible_piece_never_reduced() {
    let mut client = sim::config(Role::Client, 4);
    client.send_size = 8192;
    client.peer = peer_announced(8192, 8192, false);
    let mut server = sim::config(Role::Server, 4);
    server.recv_size = 8192;
    let mut p = Pair::new(sim::sized(client), sim::sized(server));
    let msg = p.a.put(&[0; 8]);
    let piece = p.a.put(&pattern(1, 3000));
    let reply = p.a.alloc(8192);
    let spec = CallSpec {
        auth: None,
        user: 1,
        xid: 1,
        prog: BULK_PROG,
        vers: 1,
        proc_: 1,
        msg,
        args: &[ArgPiece {
            mem: piece,
            xdr_pos: 4,
        }],
        results: &[],
        reply,
    };
    call(&mut p, &spec);
    let h = header(&p.a.sent[0]);
    let v1::Body::Msg(c) = h.body else {
        panic!("{h:?}")
    };
    assert!(c.reads.is_empty());
    serve(&mut p);
    let d = done(&mut p);
    let mut want = vec![0; 4];
    want.extend(pattern(1, 3000));
    want.extend([0; 4]);
    assert_eq!(p.a.get(reply.prefix(d[0].reply_len).unwrap()), want);
}

#[test]
fn r8166_4_5_f_undecodable_error_dropped_and_amb_2_err_vers_any_version() {
    let mut p = Pair::default_pair();
    bulk(&mut p, 1, &[0; 4], 64);
    p.run();
    p.inject(false, &be(&[1, 1, 1, 4, 7]));
    assert!(done(&mut p).is_empty());
    p.inject(false, &be(&[1, 7, 1, 4, 1, 1, 1]));
    assert_eq!(done(&mut p)[0].status, CallStatus::ErrVers);
    // Only the decodable error is counted, as ERR_VERS.
    let s = p.a.conn.stats();
    assert_eq!((s.errors_received, s.errors_received_by.vers), (1, 1));
}

#[test]
fn r8166_3_3_1_f_shared_receive_queue_serves_every_mode_and_returns_buffers() {
    let mut server = sim::config(Role::Server, 4);
    server.shared_recv = true;
    server.shared_send = true;
    let mut client = sim::config(Role::Client, 4);
    client.shared_send = true;
    let mut p = Pair::new(client, server);
    assert_eq!(p.b.posted_len(), 16);
    let data = pattern(3, 40_000);
    let (result, _) = echo(&mut p, 1, &data);
    let reply = bulk(&mut p, 2, &pattern(4, 3000), 3100);
    p.run();
    serve(&mut p);
    let d = done(&mut p);
    assert!(d.iter().all(|d| d.status == CallStatus::Ok), "{d:?}");
    assert_eq!(p.a.get(result), data);
    assert_eq!(p.a.get(reply.prefix(3000).unwrap()), pattern(4, 3000));
    assert_eq!(p.b.posted_len(), 16);
    // A connection that ends while holding a shared buffer gives it back.
    let mut m = be(&[9, 1, 4, 0, 0, 0, 0]);
    m.extend(rpcmsg::call_header(9, BULK_PROG, 1, 1));
    p.inject(true, &m);
    assert_eq!(p.b.posted_len(), 15);
    p.b.conn.close(CloseReason::Requested);
    p.run();
    assert_eq!(p.b.posted_len(), 16);
    assert_eq!(p.a.env.sends.len(), sim::SEND_COUNT);
    assert_eq!(p.b.env.sends.len(), sim::SEND_COUNT);
}

#[test]
fn shared_send_pool_exhausted_calls_wait_and_replies_are_busy() {
    let mut client = sim::config(Role::Client, 8);
    client.shared_send = true;
    let mut server = sim::config(Role::Server, 8);
    server.shared_send = true;
    let mut p = Pair::new(client, server);
    // Leave the client two send buffers: the first reply raises the grant to 8, yet only
    // two calls can be out at once; the rest wait instead of failing.
    let keep: Vec<MemRef> = p.a.env.sends.drain(2..).collect();
    for x in 0..6 {
        bulk(&mut p, x, &[0; 4], 64);
    }
    p.run();
    serve(&mut p);
    assert_eq!(done(&mut p).len(), 6);
    assert_eq!(p.a.env.sends.len(), 2);
    // The server with no send buffer refuses a reply with Busy, then sends it later.
    p.a.env.sends.extend(keep);
    p.b.events.clear();
    bulk(&mut p, 10, &[1; 4], 64);
    p.run();
    let Some(Event::IncomingCall(c)) = p.b.events.pop_front() else {
        panic!("{:?}", p.b.events)
    };
    let buf = p.b.alloc(c.args_len);
    let got = p.b.conn.accept_call(c.id, buf, &mut p.b.env).unwrap();
    // An inline call's arguments are in place at once (no ArgsReady follows).
    assert_eq!(
        got,
        Accepted::Ready {
            args_len: c.args_len
        }
    );
    p.run();
    p.b.events.clear();
    let held: Vec<MemRef> = p.b.env.sends.drain(..).collect();
    let m = p.b.put(&[1; 4]);
    let spec = ReplySpec {
        accept_stat: 0,
        msg: m,
        results: &[],
    };
    assert_eq!(
        p.b.conn.submit_reply(c.id, &spec, &mut p.b.env),
        Err(SubmitError::Busy)
    );
    p.b.env.sends.extend(held);
    p.b.conn.submit_reply(c.id, &spec, &mut p.b.env).unwrap();
    p.run();
    let d = done(&mut p);
    assert_eq!(
        (d[0].xid, d[0].status, d[0].reply_len),
        (10, CallStatus::Ok, 4)
    );
}

/// Found by the engine fuzz target (`conn::script`): `close` dropped the work queue, and
/// with it buffers already on their way back to the shared pools.
#[test]
fn a_close_keeps_the_shared_buffers_already_released() {
    // A send buffer: a backward call too long to go inline fails at once, its buffer
    // queued for release; the connection closes before that work is taken.
    let mut server = sim::config(Role::Server, 1);
    server.shared_send = true;
    let mut p = Pair::new(sim::config(Role::Client, 1), server);
    let spec = bulk_spec(&mut p.b, 2, &pattern(1, 2000), 64);
    p.b.conn.submit_call(&spec, &mut p.b.env).unwrap();
    assert_eq!(p.b.env.sends.len(), sim::SEND_COUNT - 1);
    p.b.conn.close(CloseReason::Requested);
    p.run();
    assert_eq!(p.b.env.sends.len(), sim::SEND_COUNT);

    // A receive buffer: the reply's buffer of the shared receive queue is released as the
    // call ends; the connection closes in the same turn.
    let mut client = sim::config(Role::Client, 1);
    client.shared_recv = true;
    let mut p = Pair::new(client, sim::config(Role::Server, 1));
    bulk(&mut p, 1, &[0; 4], 64);
    p.run();
    let Some(Event::IncomingCall(c)) = p.b.events.pop_front() else {
        panic!("{:?}", p.b.events)
    };
    let buf = p.b.alloc(c.args_len);
    let got = p.b.conn.accept_call(c.id, buf, &mut p.b.env).unwrap();
    assert!(matches!(got, Accepted::Ready { .. }));
    let spec = ReplySpec {
        accept_stat: 0,
        msg: buf,
        results: &[],
    };
    p.b.conn.submit_reply(c.id, &spec, &mut p.b.env).unwrap();
    while !p.a.events.iter().any(|e| matches!(e, Event::CallDone(_))) {
        assert!(p.step(), "the reply never came");
    }
    p.a.conn.close(CloseReason::Requested);
    p.run();
    assert_eq!(p.a.posted_len(), 16);
}

/// Found by the engine fuzz target (`conn::script`): a call the app rejected while no send
/// buffer was free closed the connection, and the app never heard how the call ended.
#[test]
fn a_rejected_call_ends_once_even_when_its_answer_cannot_be_sent() {
    let mut server = sim::config(Role::Server, 2);
    server.shared_send = true;
    let mut p = Pair::new(sim::config(Role::Client, 2), server);
    bulk(&mut p, 1, &[0; 4], 64);
    p.run();
    let Some(Event::IncomingCall(c)) = p.b.events.pop_front() else {
        panic!("{:?}", p.b.events)
    };
    let held: Vec<MemRef> = p.b.env.sends.drain(..).collect();
    p.b.conn
        .reject_call(c.id, rpcmsg::PROG_UNAVAIL, &mut p.b.env)
        .unwrap();
    p.run();
    assert_eq!(
        p.b.conn.closed(),
        Some(CloseReason::Local("no send buffer"))
    );
    let ends: Vec<&Event> =
        p.b.events
            .iter()
            .filter(|e| {
                matches!(e, Event::ReplyDone { id, .. } | Event::ServeAborted { id } if *id == c.id)
            })
            .collect();
    assert_eq!(
        ends,
        [&Event::ReplyDone {
            id: c.id,
            status: ReplyStatus::Closed
        }]
    );
    p.b.env.sends.extend(held);
}

/// Found by the engine fuzz target (`conn::script`): a new call under the XID of a
/// cancelled call still owed a reply was taken, so the two answers crossed (the cancelled
/// call's late reply completed the new call; the new call's reply fed the old credit). Apps
/// may choose their XIDs, so one app's call could receive another's reply.
#[test]
fn r8166_4_4_c_a_cancelled_calls_xid_stays_taken_until_its_late_reply() {
    let mut p = Pair::default_pair();
    bulk(&mut p, 1, &[0; 4], 64);
    p.run();
    serve(&mut p);
    done(&mut p);
    bulk(&mut p, 2, &[1; 4], 64);
    p.run();
    p.a.conn.cancel_call(2).unwrap();
    p.run();
    assert_eq!(done(&mut p)[0].status, CallStatus::Cancelled);
    let spec = CallSpec {
        auth: None,
        user: 3,
        ..bulk_spec(&mut p.a, 2, &[2; 8], 64)
    };
    assert_eq!(
        p.a.conn.submit_call(&spec, &mut p.a.env),
        Err(SubmitError::Invalid("xid already outstanding"))
    );
    // The late reply comes and is dropped; the XID is free again, and a call under it gets
    // its own reply.
    serve(&mut p);
    assert!(done(&mut p).is_empty());
    p.a.conn.submit_call(&spec, &mut p.a.env).unwrap();
    p.run();
    serve(&mut p);
    let d = done(&mut p);
    assert_eq!(
        (d[0].user, d[0].status, d[0].reply_len),
        (3, CallStatus::Ok, 8)
    );
    assert_eq!(p.a.get(spec.reply.prefix(8).unwrap()), [2; 8]);
}

/// A shared send buffer whose Send is still posted when the connection closes goes back only
/// once the queue pair is destroyed (`teardown`): until then the device may still be sending
/// from it, and another connection must not put its message there.
#[test]
fn a_closed_connections_send_buffers_still_posted_wait_for_teardown() {
    let mut client = sim::config(Role::Client, 2);
    client.shared_send = true;
    let mut p = Pair::new(client, sim::config(Role::Server, 2));
    p.a.hold_sends = true;
    bulk(&mut p, 1, &[0; 4], 64);
    p.run();
    assert_eq!(p.a.env.sends.len(), sim::SEND_COUNT - 1);
    p.a.conn.close(CloseReason::Requested);
    p.a.release_sends();
    p.run();
    assert_eq!(
        p.a.env.sends.len(),
        sim::SEND_COUNT - 1,
        "released under a posted Send"
    );
    p.a.conn.teardown();
    p.run();
    assert_eq!(p.a.env.sends.len(), sim::SEND_COUNT);
}

#[test]
fn r8166_7_1_c_backward_calls_inline_only() {
    let mut p = Pair::default_pair();
    // A backward call that does not fit inline fails locally, never chunked; one that
    // fits goes inline with empty chunk lists, even with a large reply buffer.
    let big = p.b.put(&pattern(1, 2000));
    let reply = p.b.alloc(8000);
    let spec = CallSpec {
        auth: None,
        user: 1,
        xid: 2,
        prog: 0x2052_4455,
        vers: 1,
        proc_: 1,
        msg: big,
        args: &[],
        results: &[],
        reply,
    };
    p.b.conn.submit_call(&spec, &mut p.b.env).unwrap();
    p.run();
    let failed =
        p.b.events.iter().any(
            |e| matches!(e, Event::CallDone(d) if d.xid == 2 && d.status == CallStatus::Local),
        );
    assert!(failed, "{:?}", p.b.events);
    assert!(p.b.sent.is_empty());
    let msg = p.b.put(&be(&[8, 1, 2]));
    let spec = CallSpec {
        auth: None,
        xid: 1,
        msg,
        ..spec
    };
    p.b.conn.submit_call(&spec, &mut p.b.env).unwrap();
    p.run();
    let h = header(&p.b.sent[0]);
    assert_eq!(h.body, v1::Body::Msg(proto::ChunkLists::EMPTY));
}

#[test]
fn r8166_4_5_4_b_failed_invalidation_closes_before_completion() {
    let mut p = Pair::default_pair();
    echo(&mut p, 1, &pattern(1, 4000));
    p.run();
    p.a.env.refuse_invalidate = true;
    serve(&mut p);
    // The reply arrived, but its memory could not be fenced: the connection ends first and
    // the call is reported as lost with it, never as a success.
    assert!(matches!(
        p.a.conn.closed(),
        Some(CloseReason::WorkFailed(_))
    ));
    let d = done(&mut p);
    assert_eq!((d.len(), d[0].status), (1, CallStatus::Closed));
    let closed_at =
        p.a.events
            .iter()
            .position(|e| matches!(e, Event::Closed(_)));
    assert!(closed_at.is_some());
}

#[test]
fn r8166_3_3_1_b_call_right_after_a_reply_is_not_an_overrun() {
    // Grant = every receive slot: the peer may send its next calls as soon as it sees the
    // replies, before those replies' Send completions reach the responder.
    let mut server = sim::config(Role::Server, 4);
    server.recv_slots = 4;
    let mut p = Pair::new(sim::config(Role::Client, 4), sim::sized(server));
    bulk(&mut p, 0, &[0; 4], 64);
    p.run();
    serve(&mut p);
    p.b.hold_sends = true;
    for x in 1..9 {
        bulk(&mut p, x, &[0; 4], 64);
    }
    p.run();
    serve(&mut p);
    // Calls 5..8 arrived while the four reply Sends were still uncompleted.
    assert_eq!(p.b.conn.closed(), None);
    p.b.release_sends();
    p.run();
    serve(&mut p);
    assert_eq!(p.b.conn.closed(), None);
    assert_eq!(done(&mut p).len(), 9);
}

fn v2_pair() -> Pair {
    let mut client = sim::config(Role::Client, 8);
    client.version = 2;
    let mut server = sim::config(Role::Server, 8);
    server.version = 2;
    Pair::new(client, server)
}

#[test]
fn v2_4_2_2_b_direction_mismatch_is_bad_header() {
    let mut p = v2_pair();
    // Direction CALL, but the carried message is an RPC REPLY.
    let mut m = be(&[5, 2, 8, 0, 0, 0, 0, 0]);
    m.extend(rpcmsg::reply_header(5, 0));
    p.inject(true, &m);
    assert_eq!(p.b.sent[0], be(&[5, 2, 8, 4, 2]));
    assert_eq!(p.b.conn.closed(), None);
}

#[test]
fn v2_4_2_b_and_4_2_3_a_v2_header_errors_get_bad_header() {
    let mut p = v2_pair();
    let rpc = rpcmsg::call_header(6, BULK_PROG, 1, 1);
    // rdma_proc 2 is undefined in version two (V2-4.2-b).
    p.inject(
        true,
        &[be(&[6, 2, 8, 2, 0, 0, 0, 0]), rpc.to_vec()].concat(),
    );
    // A misaligned read position, as in version 1 but answered BAD_HEADER.
    p.inject(
        true,
        &[
            be(&[6, 2, 8, 0, 0, 1, 6, 1, 8, 0, 0, 0, 0, 0]),
            rpc.to_vec(),
        ]
        .concat(),
    );
    assert_eq!(p.b.sent, vec![be(&[6, 2, 8, 4, 2]), be(&[6, 2, 8, 4, 2])]);
    let s = p.b.conn.stats();
    assert_eq!((s.errors_sent, s.errors_sent_by.bad_header), (2, 2));
    assert_eq!(s.errors_sent_by.total(), 2);
}

#[test]
fn impl_3_9_c_results_beyond_the_write_list_go_inline() {
    let mut p = Pair::default_pair();
    let msg = p.a.put(&be(&[8192, 1]));
    let result = p.a.alloc(8192);
    let reply = p.a.alloc(64);
    let spec = CallSpec {
        auth: None,
        user: 1,
        xid: 1,
        prog: RDMATEST_PROG,
        vers: 1,
        proc_: rdmatest::READ,
        msg,
        args: &[],
        results: &[result],
        reply,
    };
    call(&mut p, &spec);
    let Some(Event::IncomingCall(c)) = p.b.events.pop_front() else {
        panic!()
    };
    let buf = p.b.alloc(c.args_len);
    let got = p.b.conn.accept_call(c.id, buf, &mut p.b.env).unwrap();
    // An inline call's arguments are in place at once (no ArgsReady follows).
    assert_eq!(
        got,
        Accepted::Ready {
            args_len: c.args_len
        }
    );
    p.run();
    p.b.events.clear();
    // Two results for one Write chunk: the first goes to the chunk, the second inline.
    let first = p.b.put(&pattern(1, 8192));
    let second = p.b.put(&[9, 9, 9, 9, 9]);
    let m = p.b.put(&be(&[8192, 5]));
    let results = [
        ResultPiece {
            mem: first,
            xdr_pos: 4,
        },
        ResultPiece {
            mem: second,
            xdr_pos: 8,
        },
    ];
    p.b.conn
        .submit_reply(
            c.id,
            &ReplySpec {
                accept_stat: 0,
                msg: m,
                results: &results,
            },
            &mut p.b.env,
        )
        .unwrap();
    p.run();
    let d = done(&mut p);
    assert_eq!(
        d[0].status,
        CallStatus::BadReply,
        "the length-word check sees 5, not 8192"
    );
    // The wire form is still right: one Write of 8192 bytes, then the inline rest.
    let written: u32 =
        p.b.log
            .iter()
            .filter_map(|w| match w {
                Work::Write { local, .. } => Some(local.len),
                _ => None,
            })
            .sum();
    assert_eq!(written, 8192);
    let r = p.b.sent.last().unwrap();
    let tail = &r[r.len() - 16..];
    assert_eq!(
        tail,
        &[be(&[8192, 5]), vec![9, 9, 9, 9, 9, 0, 0, 0]].concat()[..]
    );
}

#[test]
fn impl_4_1_b_chunk_lists_count_against_the_inline_budget() {
    let mut p = Pair::default_pair();
    // 956 bytes fit with an empty header (1024 in all); a Reply chunk adds 40 header bytes.
    bulk(&mut p, 1, &[7; 956], 8192);
    p.run();
    assert_eq!(header(&p.a.sent[0]).body.proc(), v1::RDMA_NOMSG);
}

#[test]
fn r8166_6_1_e_binding_limits_write_chunks() {
    let mut p = Pair::default_pair();
    let msg = p.a.put(&be(&[8192, 1]));
    let results = [p.a.alloc(8192), p.a.alloc(8192)];
    let reply = p.a.alloc(64);
    let spec = CallSpec {
        auth: None,
        user: 1,
        xid: 1,
        prog: RDMATEST_PROG,
        vers: 1,
        proc_: rdmatest::READ,
        msg,
        args: &[],
        results: &results,
        reply,
    };
    call(&mut p, &spec);
    let v1::Body::Msg(c) = header(&p.a.sent[0]).body else {
        panic!()
    };
    assert_eq!(c.writes.len(), 1, "RDMATEST READ allows one Write chunk");
    serve(&mut p);
    let d = done(&mut p);
    assert_eq!(d[0].results().collect::<Vec<_>>(), &[(4, 8192), (4, 0)]);
}

#[test]
fn xch_3_1_b_learned_rbsiz_moves_the_inline_threshold() {
    let mut client = sim::config(Role::Client, 8);
    client.version = 2;
    client.send_size = 8192;
    let mut server = sim::config(Role::Server, 8);
    server.version = 2;
    server.recv_size = 8192;
    let mut p = Pair::new(sim::sized(client), sim::sized(server));
    bulk(&mut p, 1, &[0; 8], 64);
    p.run();
    serve(&mut p);
    // Confirmed: 4096 by default; the server's INITXCH said RBSIZ 8192.
    assert_eq!(p.a.conn.thresholds().0, 4096);
    p.a.conn.set_peer_receive_size(8192);
    bulk(&mut p, 2, &[1; 6000], 6100);
    p.run();
    assert_eq!(
        proto::Fixed::peek(&p.a.sent[1]).unwrap().proc,
        v2::RDMA2_MSG
    );
    serve(&mut p);
    assert!(done(&mut p).iter().all(|d| d.status == CallStatus::Ok));
}

#[test]
fn r8166_3_3_1_g_raised_grant_is_covered_by_posted_receives() {
    let mut server = sim::config(Role::Server, 4);
    server.recv_slots = 10;
    server.send_slots = 4 + 10 + 1;
    let mut p = Pair::new(sim::config(Role::Client, 8), sim::sized(server));
    bulk(&mut p, 0, &[0; 4], 64);
    p.run();
    serve(&mut p);
    p.b.conn.set_credits(8);
    bulk(&mut p, 1, &[0; 4], 64);
    p.run();
    serve(&mut p);
    // The reply advertising 8 went out while at least 8 receives were posted.
    assert_eq!(
        proto::Fixed::peek(p.b.sent.last().unwrap()).unwrap().credit,
        8
    );
    assert!(p.b.conn.recv_posted() >= 8);
    assert_eq!(p.a.conn.credit_limit(), 8);
    // A grant beyond the receive buffers is never advertised.
    p.b.conn.set_credits(50);
    assert_eq!(p.b.conn.grant(), 10);
}

#[test]
fn impl_3_2_c_read_chunk_limit_counts_positions_not_segments() {
    let mut p = Pair::default_pair();
    let rpc = rpcmsg::call_header(3, BULK_PROG, 1, 1);
    // Six segments at one position: one chunk, accepted by the decoder (the binding then
    // refuses it: GARBAGE_ARGS, not ERR_CHUNK).
    let mut m = be(&[3, 1, 8, 0]);
    for _ in 0..6 {
        m.extend(be(&[1, 40, 0x77, 4, 0, 0]));
    }
    m.extend(be(&[0, 0, 0]));
    m.extend(&rpc);
    p.inject(true, &m);
    assert_eq!(
        &p.b.sent[0][28..],
        &rpcmsg::reply_header(3, rpcmsg::GARBAGE_ARGS)[..]
    );
    // Five positions: more chunks than the engine's cap, a header error.
    let mut m = be(&[4, 1, 8, 0]);
    for k in 0..5 {
        m.extend(be(&[1, 40 + 8 * k, 0x77, 4, 0, 0]));
    }
    m.extend(be(&[0, 0, 0]));
    m.extend(rpcmsg::call_header(4, BULK_PROG, 1, 1));
    p.inject(true, &m);
    assert_eq!(p.b.sent[1], be(&[4, 1, 8, 4, 2]));
}

#[test]
fn v2_4_2_2_a_backward_call_in_version_two() {
    let mut p = v2_pair();
    bulk(&mut p, 1, &[0; 4], 64);
    p.run();
    serve(&mut p);
    submit_backward(&mut p.b, 1, 0x0a0b_0c0d);
    p.run();
    let call = p.b.sent.last().unwrap().clone();
    let f = proto::Fixed::peek(&call).unwrap();
    assert_eq!((f.vers, f.proc), (2, v2::RDMA2_MSG));
    // V2-4.2.2-b: the direction word is CALL.
    assert_eq!(&call[16..20], &0u32.to_be_bytes());
    let c =
        p.a.events
            .iter()
            .find_map(|e| match e {
                Event::IncomingCall(c) => Some(*c),
                _ => None,
            })
            .expect("backward call at the client");
    let buf = p.a.alloc(c.args_len);
    let got = p.a.conn.accept_call(c.id, buf, &mut p.a.env).unwrap();
    // An inline call's arguments are in place at once (no ArgsReady follows).
    assert_eq!(
        got,
        Accepted::Ready {
            args_len: c.args_len
        }
    );
    p.run();
    let m = p.a.put(&be(&[4, 1]));
    p.a.conn
        .submit_reply(
            c.id,
            &ReplySpec {
                accept_stat: 0,
                msg: m,
                results: &[],
            },
            &mut p.a.env,
        )
        .unwrap();
    p.run();
    assert!(p
        .b
        .events
        .iter()
        .any(|e| matches!(e, Event::CallDone(d) if d.user == 1 && d.status == CallStatus::Ok)));
}

/// An RDMA_MSG call for RDMATEST WRITE whose credential is RPCSEC_GSS with `service`
/// (2 integrity, 3 privacy) and whose data is offered in a Read chunk at position `pos`.
fn gss_write_call(xid: u32, service: u32, pos: u32) -> Vec<u8> {
    // Transport header: one read segment (position, handle, length, offset), no Write list,
    // no Reply chunk.
    let mut m = be(&[xid, 1, 8, 0, 1, pos, 0x1234, 4096, 0, 0x10000, 0, 0, 0]);
    // RPC call, rpc_gss_cred_vers_1_t {version 1, RPCSEC_GSS_DATA, seq 1, service, handle<4>},
    // an 8-byte verifier, then the WRITE arguments' length word.
    m.extend(be(&[xid, 0, 2, RDMATEST_PROG, 1, rdmatest::WRITE]));
    m.extend(be(&[
        proto::rpc::RPCSEC_GSS,
        24,
        1,
        0,
        1,
        service,
        4,
        0xfeed_f00d,
    ]));
    m.extend(be(&[proto::rpc::RPCSEC_GSS, 8, 0x0102_0304, 0x0506_0708]));
    m.extend(be(&[4096]));
    m
}

#[test]
fn r8166_8_2_2_a_gss_integrity_and_privacy_calls_are_refused_never_reduced() {
    for service in [2, 3] {
        let mut p = Pair::default_pair();
        p.run();
        let pos = u32::try_from(gss_write_call(9, service, 0).len()).unwrap() - 52;
        p.inject(true, &gss_write_call(9, service, pos));
        // No app sees the call and nothing of it is pulled.
        assert!(!p
            .b
            .events
            .iter()
            .any(|e| matches!(e, Event::IncomingCall(_) | Event::ArgsReady { .. })));
        assert!(!p.b.log.iter().any(|w| matches!(w, Work::Read { .. })));
        // The answer: RDMA_MSG, empty lists, then MSG_DENIED / AUTH_ERROR / AUTH_BADCRED.
        let sent = p.b.sent.last().expect("an answer").clone();
        let mut want = be(&[9, 1, p.b.conn.grant(), 0, 0, 0, 0]);
        want.extend(rpcmsg::auth_error_reply(9, rpcmsg::AUTH_BADCRED));
        assert_eq!(sent, want, "service {service}");
        assert_eq!(p.b.conn.closed(), None, "the connection stays up");
    }
}

/// A confirmed version-two pair whose receive buffers are posted at 8192 bytes (the policy
/// maximum, `recv-buffer-size`) and whose sends may be as large; each side knows the other
/// announced `rbsiz` (as after INITXCH).
fn v2_pair_8k(rbsiz: u32) -> Pair {
    let mut client = sim::config(Role::Client, 8);
    let mut server = sim::config(Role::Server, 8);
    for c in [&mut client, &mut server] {
        c.version = 2;
        c.send_size = 8192;
        c.recv_size = 8192;
    }
    let mut p = Pair::new(sim::sized(client), sim::sized(server));
    bulk(&mut p, 1, &[0; 8], 64);
    p.run();
    serve(&mut p);
    assert_eq!(done(&mut p)[0].status, CallStatus::Ok);
    for s in [&mut p.a, &mut p.b] {
        s.conn.set_own_receive_size(rbsiz);
        s.conn.set_peer_receive_size(rbsiz);
    }
    p
}

/// A bulk echo of `len` bytes (reply up to `len + 100`); returns the bytes of its last Send
/// from `a`, and checks the reply came back intact.
fn bulk_echo(p: &mut Pair, xid: u32, len: usize) -> Vec<u8> {
    let data = pattern(xid, len);
    let reply = bulk(p, xid, &data, len as u32 + 100);
    p.run();
    let sent = p.a.sent.last().expect("a call went out").clone();
    serve(p);
    let d = done(p);
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].status, d[0].reply_len), (CallStatus::Ok, len as u32));
    assert_eq!(
        p.a.get(reply.prefix(len as u32).unwrap()),
        data,
        "bytes intact"
    );
    sent
}

fn chunks_of(bytes: &[u8]) -> (u32, bool, usize) {
    let d = proto::decode(bytes, &proto::Limits::DEFAULT).expect("decodes");
    match d.message {
        Message::V2(h) => match h.body {
            v2::Body::Msg { chunks, .. } => {
                (v2::RDMA2_MSG, chunks.reply.is_some(), chunks.reads.len())
            }
            v2::Body::Nomsg { chunks, .. } => {
                (v2::RDMA2_NOMSG, chunks.reply.is_some(), chunks.reads.len())
            }
            other => panic!("not a call: {other:?}"),
        },
        m => panic!("not v2: {m:?}"),
    }
}

#[test]
fn xch_3_1_c_raised_rbsiz_up_to_the_posted_size_needs_no_repost() {
    let mut p = v2_pair_8k(4096);
    assert_eq!(p.b.conn.thresholds().1, 4096);
    let posted = p.b.log.len();
    // Raise 4096 -> 8192: every receive the server ever posted already holds 8192 bytes
    // (XCH-3.1-a), so it may tell the peer at once (XCH-3.1-c), with no repost.
    p.b.conn.set_own_receive_size(8192);
    assert_eq!(p.b.log.len(), posted, "nothing posted by the raise");
    assert!(p
        .b
        .log
        .iter()
        .all(|w| !matches!(w, Work::Recv { buf, .. } if buf.len < 8192)));
    assert_eq!(p.b.conn.thresholds().1, 8192);
    // The client learns it (UPDXCH): a 6000-byte call goes inline and lands intact.
    p.a.conn.set_peer_receive_size(8192);
    let (proc_, _, _) = chunks_of(&bulk_echo(&mut p, 2, 6000));
    assert_eq!(proc_, v2::RDMA2_MSG);
    // A size beyond the posted receives is never assumed.
    p.b.conn.set_own_receive_size(16384);
    assert_eq!(p.b.conn.thresholds().1, 8192);
    assert!(p.b.log[posted..]
        .iter()
        .all(|w| !matches!(w, Work::Recv { buf, .. } if buf.len < 8192)));
}

#[test]
fn xch_3_e_lowered_own_rbsiz_offers_reply_chunks_without_disturbing_the_peer() {
    let mut p = v2_pair_8k(8192);
    // At 8192 a 6000-byte reply comes inline: no Reply chunk offered.
    let (_, reply_chunk, _) = chunks_of(&bulk_echo(&mut p, 2, 6000));
    assert!(!reply_chunk);
    // The client lowers its RBSIZ to 4096 (applied before its UPDXCH goes out): from now on
    // its calls offer a Reply chunk for replies that may exceed 4096.
    p.a.conn.set_own_receive_size(4096);
    assert_eq!(p.a.conn.thresholds().1, 4096);
    // The server has not heard yet and answers inline at 8192: the client's receives are
    // still 8192 bytes, so the reply lands intact (the peer is not disturbed).
    let (_, reply_chunk, _) = chunks_of(&bulk_echo(&mut p, 3, 6000));
    assert!(reply_chunk);
    let last = p.b.sent.last().unwrap();
    assert_eq!(proto::Fixed::peek(last).unwrap().proc, v2::RDMA2_MSG);
    // Once it has (UPDXCH), the server uses the offered Reply chunk.
    p.b.conn.set_peer_receive_size(4096);
    let replies_before = p.b.conn.stats().long_replies;
    let (_, reply_chunk, _) = chunks_of(&bulk_echo(&mut p, 4, 6000));
    assert!(reply_chunk);
    assert_eq!(p.b.conn.stats().long_replies, replies_before + 1);
    let last = p.b.sent.last().unwrap();
    assert_eq!(proto::Fixed::peek(last).unwrap().proc, v2::RDMA2_NOMSG);
}

#[test]
fn xch_3_1_d_requester_sends_within_the_asked_size_until_settled() {
    let mut p = v2_pair_8k(8192);
    assert_eq!(chunks_of(&bulk_echo(&mut p, 2, 6000)).0, v2::RDMA2_MSG);
    // The client asks the server to lower its RBSIZ to 2048: from that moment it sends no
    // more than 2048 inline, before any answer.
    p.a.conn.set_peer_receive_cap(Some(2048));
    assert_eq!(p.a.conn.thresholds().0, 2048);
    let (proc_, _, reads) = chunks_of(&bulk_echo(&mut p, 3, 3000));
    assert_eq!(proc_, v2::RDMA2_NOMSG, "a Long call");
    assert!(reads >= 1, "its message in a Position-zero Read chunk");
    // An update above the asked value while the request is pending changes nothing.
    p.a.conn.set_peer_receive_size(8192);
    assert_eq!(p.a.conn.thresholds().0, 2048);
    assert_eq!(chunks_of(&bulk_echo(&mut p, 4, 3000)).0, v2::RDMA2_NOMSG);
    // Rejected (or settled above): the limit is the announced size again.
    p.a.conn.set_peer_receive_cap(None);
    assert_eq!(p.a.conn.thresholds().0, 8192);
    assert_eq!(chunks_of(&bulk_echo(&mut p, 5, 6000)).0, v2::RDMA2_MSG);
    // Done at 2048: the announced size and the cap agree.
    p.a.conn.set_peer_receive_cap(Some(2048));
    p.a.conn.set_peer_receive_size(2048);
    p.a.conn.set_peer_receive_cap(None);
    assert_eq!(p.a.conn.thresholds().0, 2048);
    assert_eq!(chunks_of(&bulk_echo(&mut p, 6, 3000)).0, v2::RDMA2_NOMSG);
}

#[test]
fn amb_33_configured_first_reply_timeout_and_version_1_after_it() {
    let mut client = sim::config(Role::Client, 8);
    client.version = 2;
    let mut server = sim::config(Role::Server, 8);
    server.version = 2;
    let mut p = Pair::new(client, server);
    let t = Duration::from_millis(300);
    p.a.conn.set_first_reply_timeout(t);
    bulk(&mut p, 1, &[0; 4], 64);
    p.run();
    let t0 = p.now;
    p.a.conn.handle_timeout(t0);
    assert_eq!(p.a.conn.poll_timeout(), Some(t0 + t));
    p.a.conn.handle_timeout(t0 + t);
    assert_eq!(p.a.conn.closed(), Some(CloseReason::NoAnswer));
    p.run();
    let d = done(&mut p);
    assert_eq!((d.len(), d[0].status), (1, CallStatus::Closed), "once");
    // The reconnect speaks version 1 and has no timer.
    let mut client = sim::config(Role::Client, 8);
    client.version = 1;
    let mut server = sim::config(Role::Server, 8);
    server.version = 2;
    let mut p = Pair::new(client, server);
    bulk(&mut p, 2, &[0; 4], 64);
    p.run();
    assert!(!p.a.conn.wants_timer());
    assert_eq!(proto::Fixed::peek(&p.a.sent[0]).unwrap().vers, 1);
    serve(&mut p);
    assert_eq!(done(&mut p)[0].status, CallStatus::Ok);
}

#[test]
fn xch_3_e_own_rbsiz_set_before_confirmation_survives_it() {
    let mut client = sim::config(Role::Client, 8);
    let mut server = sim::config(Role::Server, 8);
    for c in [&mut client, &mut server] {
        c.version = 2;
        c.recv_size = 8192;
    }
    let mut p = Pair::new(sim::sized(client), sim::sized(server));
    // The server announces 2048 before the first call confirms version two: confirmation
    // must not put its threshold back to the 4096 default.
    p.b.conn.set_own_receive_size(2048);
    bulk(&mut p, 1, &[0; 8], 64);
    p.run();
    serve(&mut p);
    assert_eq!(done(&mut p)[0].status, CallStatus::Ok);
    assert_eq!(p.b.conn.thresholds().1, 2048);
    assert_eq!(
        p.a.conn.thresholds().1,
        4096,
        "the default where nothing was set"
    );
}

/// An RDMA_MSG bulk call whose Write list holds `chunks` chunks of `segs` segments each.
fn call_with_write_list(xid: u32, chunks: u32, segs: u32) -> Vec<u8> {
    let mut w = vec![xid, 1, 8, 0, 0];
    for c in 0..chunks {
        w.extend([1, segs]);
        for s in 0..segs {
            w.extend([0x100 + c * 16 + s, 512, 0, 0x4000 * (s + 1)]);
        }
    }
    w.extend([0, 0]);
    [be(&w), rpcmsg::call_header(xid, BULK_PROG, 1, 1).to_vec()].concat()
}

#[test]
fn r8166_4_5_2_a_configured_chunk_caps_answer_err_chunk_beyond_them() {
    let err_chunk = |xid| be(&[xid, 1, 8, 4, 2]);
    let mut p = Pair::default_pair();
    p.b.conn.set_chunk_caps(2, 1);
    p.run();
    // Within the caps: no transport error (the call itself is for the binding to judge).
    p.inject(true, &call_with_write_list(1, 1, 2));
    assert!(!p.b.sent.contains(&err_chunk(1)));
    // One segment too many, one chunk too many: ERR_CHUNK, the connection stays.
    p.inject(true, &call_with_write_list(2, 1, 3));
    assert_eq!(p.b.sent.last(), Some(&err_chunk(2)));
    p.inject(true, &call_with_write_list(3, 2, 1));
    assert_eq!(p.b.sent.last(), Some(&err_chunk(3)));
    assert_eq!(p.b.conn.closed(), None);
    // The engine's capacity bounds a larger configuration: 3 segments pass once allowed.
    p.b.conn.set_chunk_caps(1000, 1000);
    p.inject(true, &call_with_write_list(4, 1, 3));
    assert!(!p.b.sent.contains(&err_chunk(4)));
}

/// Selective signalling: of the Sends handed out in one batch only the last asks for a
/// completion, and that one completion frees every send buffer of the batch; a provider
/// that reports the unsignaled ones too changes nothing.
#[test]
fn sends_of_a_batch_complete_with_its_last() {
    for report_unsignaled in [false, true] {
        let mut p = Pair::new(sim::config(Role::Client, 8), sim::config(Role::Server, 8));
        p.a.report_unsignaled = report_unsignaled;
        p.b.report_unsignaled = report_unsignaled;
        // The first call goes alone (one credit until the first reply grants more).
        echo(&mut p, 1, b"first");
        p.run();
        serve(&mut p);
        assert_eq!(done(&mut p).len(), 1);
        let before = p.a.log.len();
        for xid in 2..10u32 {
            echo(&mut p, xid, &[xid as u8; 24]);
        }
        p.run();
        let sends: Vec<bool> = p.a.log[before..]
            .iter()
            .filter_map(|w| match w {
                Work::Send { signaled, .. } => Some(*signaled),
                _ => None,
            })
            .collect();
        // The eight calls were queued before the owner took any work: one batch.
        let mut want = vec![false; 7];
        want.push(true);
        assert_eq!(sends, want, "{report_unsignaled}");
        serve(&mut p);
        let d = done(&mut p);
        assert_eq!(d.len(), 8);
        assert!(d.iter().all(|c| c.status == CallStatus::Ok), "{d:?}");
        for side in [&p.a, &p.b] {
            assert_eq!(side.conn.send_free(), side.conn.config().send_slots);
        }
    }
}

/// `drain_work` hands out what `poll_work` would, one request at a time, signalling the
/// same Sends; a refused request stops it, and what follows stays queued.
#[test]
fn drain_work_takes_what_poll_work_would() {
    let queued = || {
        let mut p = Pair::new(sim::config(Role::Client, 8), sim::config(Role::Server, 8));
        echo(&mut p, 1, b"first");
        p.run();
        serve(&mut p);
        assert_eq!(done(&mut p).len(), 1);
        for xid in 2..10u32 {
            echo(&mut p, xid, &[xid as u8; 24]);
        }
        p
    };
    let mut polled = Vec::new();
    let mut p = queued();
    while let Some(w) = p.a.conn.poll_work() {
        polled.push(w);
    }
    assert!(
        polled
            .iter()
            .filter(|w| matches!(w, Work::Send { .. }))
            .count()
            == 8
    );
    let mut p = queued();
    let mut drained = Vec::new();
    let Ok(()) = p.a.conn.drain_work(|w| {
        drained.push(w);
        Ok::<(), std::convert::Infallible>(())
    });
    assert_eq!(drained, polled);
    assert_eq!(p.a.conn.poll_work(), None);
    // Refused at the third: the first three are gone, the rest come as before.
    let mut p = queued();
    let mut taken = Vec::new();
    let r = p.a.conn.drain_work(|w| {
        taken.push(w);
        if taken.len() == 3 {
            Err("refused")
        } else {
            Ok(())
        }
    });
    assert_eq!(r, Err("refused"));
    while let Some(w) = p.a.conn.poll_work() {
        taken.push(w);
    }
    assert_eq!(taken, polled);
}

/// What a scripted session did, fed its completions one at a time and in batches: the same
/// work posted, the same bytes sent, the same events, counters and closes on both sides.
fn fed_alike(data: &[u8]) {
    let (one_checked, one) = super::script::play_fed(data, false);
    let (batch_checked, batch) = super::script::play_fed(data, true);
    assert_eq!(batch_checked, one_checked);
    for (b, o) in [(&batch.a, &one.a), (&batch.b, &one.b)] {
        assert_eq!(b.log, o.log);
        assert_eq!(b.sent, o.sent);
        assert_eq!(b.event_log, o.event_log);
        assert_eq!(b.conn.stats(), o.conn.stats());
        assert_eq!(b.conn.closed(), o.conn.closed());
    }
}

/// `handle_completions` does what `handle_completion` does for each of its completions in
/// turn: calls waiting for credits and Reads waiting for ORD let go after each completion
/// (replies and Reads arriving together, a failed completion ending the connection before
/// the rest of its batch), and the engine fuzz target's seeds, each played both ways.
#[test]
fn handle_completions_does_what_handle_completion_would() {
    let session = |batched: bool| {
        let a = sim::config(Role::Client, 2);
        let mut b = sim::config(Role::Server, 2);
        b.max_reads = 1;
        let mut p = Pair::new(a, b);
        p.a.batched = batched;
        p.b.batched = batched;
        // Ten calls on two credits, every other one pulling its arguments by Reads.
        for xid in 1..=10u32 {
            let n = if xid % 2 == 0 { 3000 } else { 24 };
            echo(&mut p, xid, &pattern(xid, n));
        }
        while intake(&mut p) > 0 {
            sim::answer_all_ready(&mut p);
        }
        assert_eq!(done(&mut p).len(), 10);
        // Replies arriving together, the first one's memory not fenced: it ends the
        // connection, and the completions after it in the batch find it closed.
        for xid in 11..=12u32 {
            echo(&mut p, xid, &pattern(xid, 3000));
        }
        intake(&mut p);
        p.a.env.refuse_invalidate = true;
        sim::answer_all_ready(&mut p);
        assert!(matches!(
            p.a.conn.closed(),
            Some(CloseReason::WorkFailed(_))
        ));
        p
    };
    let (one, batch) = (session(false), session(true));
    for (b, o) in [(&batch.a, &one.a), (&batch.b, &one.b)] {
        assert_eq!(b.log, o.log);
        assert_eq!(b.sent, o.sent);
        assert_eq!(b.event_log, o.event_log);
        assert_eq!(b.conn.stats(), o.conn.stats());
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/engine");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        fed_alike(&std::fs::read(e.unwrap().path()).unwrap());
        n += 1;
    }
    assert!(n > 70, "{dir:?}");
}

/// An inline call's arguments are copied when it is accepted: `accept_call` says so with
/// `Accepted::Ready` and no `ArgsReady` follows (the poll thread delivers the call on that
/// answer, so a second signal would deliver it twice). A call with a Read chunk answers
/// `Accepted::Pulling` and gets its `ArgsReady` once the Reads are done
/// (`r8166_3_4_6_c_write_chunk_and_reply_chunk_echoed_in_one_reply` covers that side).
#[test]
fn accept_of_an_inline_call_is_ready_at_once() {
    let mut p = Pair::default_pair();
    bulk(&mut p, 1, &[7; 12], 64);
    p.run();
    let Some(Event::IncomingCall(c)) = p.b.events.pop_front() else {
        panic!("{:?}", p.b.events)
    };
    let buf = p.b.alloc(c.args_len);
    let got = p.b.conn.accept_call(c.id, buf, &mut p.b.env).unwrap();
    assert_eq!(got, Accepted::Ready { args_len: 12 });
    assert_eq!(p.b.get(buf), vec![7; 12]);
    p.run();
    assert!(
        !p.b.events
            .iter()
            .any(|e| matches!(e, Event::ArgsReady { .. })),
        "{:?}",
        p.b.events
    );
    // Accepting it again is refused: it is no longer waiting.
    assert_eq!(
        p.b.conn.accept_call(c.id, buf, &mut p.b.env),
        Err(SubmitError::BadId)
    );
}

/// The words of an NFSv4 COMPOUND4res whose first operations (SEQUENCE, PUTFH) succeeded,
/// `ops` more operations following, all with status `status`.
fn compound_res(status: u32, ops: u32) -> Vec<u32> {
    use rpcrdma_proto::nfs4::op;
    let sessionid = [0x5e5e_5e5e; 4];
    let mut w = vec![status, 0, 2 + ops, op::SEQUENCE, 0];
    w.extend(sessionid);
    w.extend([5, 0, 63, 63, 0, op::PUTFH, 0]);
    w
}

/// RFC 8267 §5 with R8166-6.1-c/d and R8166-3.4.6.2-c: a COMPOUND's first READ goes to the
/// Write chunk, and, unlike in NFSv3 or RDMATEST, operations may follow it in the reduced
/// reply. The requester still fails a READ result left inline beside the chunk, and a chunk
/// used by a COMPOUND whose READ failed.
#[test]
fn r8166_6_1_d_compound_read_in_the_write_chunk_with_operations_after_it() {
    use rpcrdma_proto::nfs4::{self, op};
    use rpcrdma_proto::ulb::NFS_PROG;
    let compound = (NFS_PROG, nfs4::VERSION, nfs4::COMPOUND);
    let mut p = Pair::default_pair();
    // SEQUENCE, PUTFH, READ (eof, 3000 bytes in the chunk), GETATTR (size).
    let (result, seg) = with_write_chunk(&mut p, 1, compound, 4096);
    let mut body = compound_res(0, 2);
    body.extend([op::READ, 0, 1, 3000, op::GETATTR, 0, 1, 1 << 4, 8, 0, 4096]);
    let data = pattern(3, 3000);
    assert!(p.a.remote_write(seg.handle, seg.offset, &data));
    p.inject(false, &reply_with_chunk(1, seg, Some(3000), &body));
    let d = done(&mut p);
    // The data belongs after the READ's length word, before the GETATTR.
    let len = 4 * body.len() as u32;
    let at = 4 * (compound_res(0, 2).len() as u32 + 4);
    assert_eq!(
        (
            d[0].status,
            d[0].reply_len,
            &d[0].results().collect::<Vec<_>>()[..]
        ),
        (CallStatus::Ok, len, &[(at, 3000)][..]),
        "{d:?}"
    );
    assert_eq!(p.a.get(result.prefix(3000).unwrap()), data);
    // The data inline, the chunk unused: R8166-6.1-d.
    let (_, seg) = with_write_chunk(&mut p, 2, compound, 4096);
    let mut body = compound_res(0, 2);
    body.extend([
        op::READ,
        0,
        1,
        8,
        0x5a5a_5a5a,
        0x5a5a_5a5a,
        op::GETATTR,
        0,
        0,
        0,
    ]);
    p.inject(false, &reply_with_chunk(2, seg, Some(0), &body));
    let d = done(&mut p);
    assert_eq!((d.len(), d[0].status), (1, CallStatus::BadReply), "{d:?}");
    // The READ failed (NFS4ERR_IO): no result for the chunk, so a chunk said to be used
    // holds something else (R8166-6.1-c), and an unused one is fine.
    let mut body = compound_res(5, 1);
    body.extend([op::READ, 5]);
    for (xid, used, status) in [(3, 8, CallStatus::BadReply), (4, 0, CallStatus::Ok)] {
        let (_, seg) = with_write_chunk(&mut p, xid, compound, 4096);
        p.inject(false, &reply_with_chunk(xid, seg, Some(used), &body));
        let d = done(&mut p);
        assert_eq!((d.len(), d[0].status), (1, status), "xid {xid}: {d:?}");
    }
    // The echoed length must be the READ's length word (R8166-3.4.6.2-c).
    let (_, seg) = with_write_chunk(&mut p, 5, compound, 4096);
    let mut body = compound_res(0, 1);
    body.extend([op::READ, 0, 1, 3000]);
    p.inject(false, &reply_with_chunk(5, seg, Some(2999), &body));
    let d = done(&mut p);
    assert_eq!((d.len(), d[0].status), (1, CallStatus::BadReply), "{d:?}");
    assert_eq!(p.a.conn.stats().bad_replies, 3);
    assert!(p.a.conn.closed().is_none());
}

/// R8166-6.1-d with RFC 8267 §5, responder side: a server app's COMPOUND reply that leaves
/// its READ data in the stream, a GETATTR after it, has the data reduced into the offered
/// Write chunk and the GETATTR sent after the READ's length word; the requester gets both
/// back in place. In NFSv3, where the result ends every reply, a word after it keeps the
/// reply as written (and the requester refuses it).
#[test]
fn r8166_6_1_d_responder_reduces_a_compound_read_left_inline_with_operations_after_it() {
    use rpcrdma_proto::nfs4::{self, op};
    use rpcrdma_proto::ulb::{nfs3, NFS_PROG};
    let mut p = Pair::default_pair();
    let data = pattern(8, 1001);
    let mut head = be(&compound_res(0, 2));
    head.extend(be(&[op::READ, 0, 1, 1001]));
    let getattr = be(&[op::GETATTR, 0, 1, 1 << 4, 8, 0, 1001]);
    let mut stream = head.clone();
    stream.extend(&data);
    stream.extend([0; 3]);
    stream.extend(&getattr);
    let (result, _) = with_write_chunk(&mut p, 1, (NFS_PROG, nfs4::VERSION, nfs4::COMPOUND), 4096);
    let d = answer_unmarked(&mut p, &stream);
    let reduced = (head.len() + getattr.len()) as u32;
    assert_eq!(
        (
            d[0].status,
            d[0].reply_len,
            &d[0].results().collect::<Vec<_>>()[..]
        ),
        (CallStatus::Ok, reduced, &[(head.len() as u32, 1001)][..]),
        "{d:?}"
    );
    assert_eq!(p.a.get(result.prefix(1001).unwrap()), data);
    let sent = p.b.sent.last().unwrap();
    let v1::Body::Msg(r) = header(sent).body else {
        panic!()
    };
    assert_eq!(r.writes.iter().next().unwrap().length(), 1001);
    let mut want = head.clone();
    want.extend(&getattr);
    assert!(
        sent.ends_with(&want),
        "the reduced COMPOUND, GETATTR after the READ"
    );
    // NFSv3 READ3resok (no attributes, count, eof, data) with a word after the data.
    let mut odd = be(&[0, 0, 100, 1, 100]);
    odd.extend(&data[..100]);
    odd.extend(be(&[7]));
    with_write_chunk(&mut p, 2, (NFS_PROG, 3, nfs3::READ), 4096);
    let d = answer_unmarked(&mut p, &odd);
    assert_eq!((d.len(), d[0].status), (1, CallStatus::BadReply), "{d:?}");
    assert!(p.b.sent.last().unwrap().ends_with(&odd), "sent as written");
}

/// The arguments of an NFSv4 COMPOUND with a WRITE of `data` between a PUTFH and a GETATTR,
/// reduced at the data (the length word stays); and the data's position in them.
fn compound_write(data_len: u32) -> (Vec<u8>, u32) {
    use rpcrdma_proto::nfs4::op;
    let mut a = be(&[0, 1, 3, op::PUTFH, 8, 0xfafa_fafa, 0xfafa_fafa, op::WRITE]);
    a.extend([7; 16]);
    a.extend(be(&[0, 4096, 2, data_len]));
    let at = a.len() as u32;
    a.extend(be(&[op::GETATTR, 1, 1 << 4]));
    (a, at)
}

/// RFC 8267 §4 with R8166-6.1-b and R8166-3.4.5-a: an NFSv2 SYMLINK's path, its eligible
/// argument, goes in a Read chunk although arguments follow it (its attributes, unlike in
/// NFSv3), and the server gets the whole call back in order.
#[test]
fn r8166_6_1_b_nfs2_symlink_path_through_a_read_chunk_attributes_after_it_intact() {
    use rpcrdma_proto::ulb::{nfs2, NFS_PROG};
    let mut p = Pair::default_pair();
    let path = pattern(5, 1024);
    // symlinkargs: dir handle (32), name "ln", the path's length word, then the sattr.
    let mut args = vec![0xd1; nfs2::FHSIZE];
    args.extend(be(&[2]));
    args.extend(b"ln\0\0");
    args.extend(be(&[1024]));
    let at = args.len() as u32;
    let sattr = be(&[0o644, 1000, 1001, u32::MAX, 1, 2, 3, 4]);
    args.extend(&sattr);
    let got = pulled_through_a_read_chunk(&mut p, (NFS_PROG, 2, nfs2::SYMLINK), &args, at, &path);
    let mut want = args[..at as usize].to_vec();
    want.extend(&path);
    want.extend(&sattr);
    assert_eq!(got, want);
}

/// Calls `rpc` (program, version, procedure) with `data` as its one DDP piece at `at` in the
/// reduced arguments `args`, checks that the call carries it in one Read chunk at its position
/// (R8166-3.4.5-a: counted from the XID), has the server accept the call and the engine pull
/// the chunk, and returns the arguments the server got.
fn pulled_through_a_read_chunk(
    p: &mut Pair,
    rpc: (u32, u32, u32),
    args: &[u8],
    at: u32,
    data: &[u8],
) -> Vec<u8> {
    let msg = p.a.put(args);
    let piece = p.a.put(data);
    let reply = p.a.alloc(256);
    let spec = CallSpec {
        auth: None,
        user: 1,
        xid: 1,
        prog: rpc.0,
        vers: rpc.1,
        proc_: rpc.2,
        msg,
        args: &[ArgPiece {
            mem: piece,
            xdr_pos: at,
        }],
        results: &[],
        reply,
    };
    call(p, &spec);
    let v1::Body::Msg(c) = header(&p.a.sent[0]).body else {
        panic!()
    };
    let rc: Vec<_> = c.reads.chunks().collect();
    assert_eq!(rc.len(), 1, "the piece is reduced");
    assert_eq!(
        (rc[0].position, rc[0].length()),
        (40 + at, Some(data.len() as u32))
    );
    let ic = match p.b.events.pop_front() {
        Some(Event::IncomingCall(ic)) => ic,
        other => panic!("{other:?}"),
    };
    let buf = p.b.alloc(ic.args_len);
    let got = p.b.conn.accept_call(ic.id, buf, &mut p.b.env).unwrap();
    assert_eq!(
        got,
        Accepted::Pulling,
        "a chunk the binding allows is pulled"
    );
    p.run();
    assert!(matches!(
        p.b.events.pop_front(),
        Some(Event::ArgsReady { .. })
    ));
    p.b.get(buf.prefix(ic.args_len).unwrap())
}

/// RFC 8267 §5 with R8166-6.1-b, R8166-3.4.5-a and IMPL-3.7-a: a COMPOUND's WRITE data goes
/// in a Read chunk at its position and comes back at that place in the server's arguments,
/// the GETATTR after it starting on the next word; a chunk anywhere else in a COMPOUND is
/// answered GARBAGE_ARGS.
#[test]
fn r8166_6_1_b_compound_write_data_through_a_read_chunk_operations_after_it_intact() {
    use rpcrdma_proto::nfs4;
    use rpcrdma_proto::ulb::NFS_PROG;
    let mut p = Pair::default_pair();
    let data = pattern(11, 5001);
    let (args, at) = compound_write(5001);
    let compound = (NFS_PROG, nfs4::VERSION, nfs4::COMPOUND);
    let got = pulled_through_a_read_chunk(&mut p, compound, &args, at, &data);
    let mut want = args[..at as usize].to_vec();
    want.extend(&data);
    want.extend([0; 3]);
    want.extend(&args[at as usize..]);
    assert_eq!(got, want);

    // By hand: the same call with its chunk at the GETATTR, then at the PUTFH's handle.
    let dc = p.a.put(&data);
    let seg =
        p.a.env
            .expose(dc, rpcrdma_verbs::Access::REMOTE_READ)
            .unwrap();
    for (xid, pos) in [(7u32, 40 + at + 4), (8, 40 + 20)] {
        let mut call = rpcmsg::call_header(xid, NFS_PROG, nfs4::VERSION, nfs4::COMPOUND).to_vec();
        call.extend(&args);
        let mut m = be(&[xid, 1, 8, 0, 1, pos, seg.handle, 5001]);
        m.extend(seg.offset.to_be_bytes());
        m.extend(be(&[0, 0, 0]));
        m.extend(&call);
        p.inject(true, &m);
        let rb = p.b.sent.last().unwrap().clone();
        assert_eq!(
            &rb[28..],
            &rpcmsg::reply_header(xid, rpcmsg::GARBAGE_ARGS)[..],
            "chunk at {pos}"
        );
    }
    assert!(p.b.conn.closed().is_none());
}

/// What [`two_compound_reads`] sent and answered.
struct TwoReads {
    /// Each offered chunk's buffer in `a`'s memory.
    bufs: [Option<MemRef>; 2],
    /// Each READ's data.
    data: [Vec<u8>; 2],
    /// The reduced reply stream `b`'s app wrote.
    res: Vec<u8>,
    /// Where each READ's data belongs in it.
    at: [u32; 2],
}

/// Injects into `p.b`, by hand, an NFSv4 COMPOUND of two READs (of 99 and 2000 bytes) whose
/// Write list has a chunk of 4096 bytes in `a`'s memory for each `true` in `chunks` and an
/// empty chunk for each `false`; `b`'s app answers both, marking each READ's data.
fn two_compound_reads(p: &mut Pair, chunks: [bool; 2]) -> TwoReads {
    use rpcrdma_proto::nfs4::{self, op};
    use rpcrdma_proto::ulb::NFS_PROG;
    // RDMA_MSG, no Read list, then the Write list.
    let mut m = be(&[9, 1, 8, 0, 0]);
    let mut bufs = [None; 2];
    for (k, offered) in chunks.into_iter().enumerate() {
        m.extend(be(&[1]));
        if !offered {
            m.extend(be(&[0]));
            continue;
        }
        let c = p.a.alloc(4096);
        let seg =
            p.a.env
                .expose(c, rpcrdma_verbs::Access::REMOTE_WRITE)
                .unwrap();
        m.extend(be(&[1, seg.handle, 4096]));
        m.extend(seg.offset.to_be_bytes());
        bufs[k] = Some(c);
    }
    m.extend(be(&[0, 0]));
    // READ, READ (no PUTFH: the app does not look).
    m.extend(rpcmsg::call_header(
        9,
        NFS_PROG,
        nfs4::VERSION,
        nfs4::COMPOUND,
    ));
    m.extend(be(&[0, 1, 2, op::READ]));
    m.extend([7; 16]);
    m.extend(be(&[0, 0, 0, 4096, op::READ]));
    m.extend([7; 16]);
    m.extend(be(&[0, 8192, 4096]));
    p.inject(true, &m);
    let ic = match p.b.events.pop_front() {
        Some(Event::IncomingCall(ic)) => ic,
        other => panic!("{other:?}"),
    };
    let args = p.b.alloc(ic.args_len);
    let got = p.b.conn.accept_call(ic.id, args, &mut p.b.env).unwrap();
    assert_eq!(got, Accepted::Ready { args_len: 80 });
    // The first READ not at the end of the file, the second at it.
    // 99 bytes: small enough to go inline (the call offers no Reply chunk), odd for the pad.
    let data = [pattern(1, 99), pattern(2, 2000)];
    let mut res = be(&[0, 0, 2, op::READ, 0, 0, 99]);
    let at1 = res.len() as u32;
    res.extend(be(&[op::READ, 0, 1, 2000]));
    let at2 = res.len() as u32;
    let msg = p.b.put(&res);
    let results = [(&data[0], at1), (&data[1], at2)].map(|(d, xdr_pos)| ResultPiece {
        mem: p.b.put(d),
        xdr_pos,
    });
    let spec = ReplySpec {
        accept_stat: 0,
        msg,
        results: &results,
    };
    p.b.conn.submit_reply(ic.id, &spec, &mut p.b.env).unwrap();
    p.run();
    TwoReads {
        bufs,
        data,
        res,
        at: [at1, at2],
    }
}

/// The echoed Write list of `b`'s last reply: each chunk's segment count and length.
fn echoed_chunks(p: &Pair) -> Vec<(usize, u64)> {
    let sent = p.b.sent.last().unwrap().clone();
    let v1::Body::Msg(r) = header(&sent).body else {
        panic!("{sent:?}")
    };
    r.writes
        .iter()
        .map(|w| (w.segments().count(), w.length()))
        .collect()
}

/// R8166-4.3.2.1-a (RFC 8267 §5): a responder puts a COMPOUND's READ results in the Write
/// chunks in order, first READ to first chunk, second to second (our requester offers one
/// Write chunk to a COMPOUND, the binding's default, so the call is made by hand).
#[test]
fn r8166_4_3_2_1_a_two_reads_of_a_compound_land_in_two_chunks_in_order() {
    let mut p = Pair::default_pair();
    let TwoReads {
        bufs: [c1, c2],
        data: [d1, d2],
        res,
        ..
    } = two_compound_reads(&mut p, [true, true]);
    assert_eq!(p.a.get(c1.unwrap().prefix(99).unwrap()), d1);
    assert_eq!(p.a.get(c2.unwrap().prefix(2000).unwrap()), d2);
    assert_eq!(echoed_chunks(&p), [(1, 99), (1, 2000)]);
    let sent = p.b.sent.last().unwrap();
    assert!(
        sent.ends_with(&res),
        "the reduced reply as the app wrote it"
    );
}

/// RFC 8267 §5: a client that wants a COMPOUND's first READ inline offers an empty Write
/// chunk in its place; the second READ still goes to the second chunk.
#[test]
fn r8166_4_3_2_1_a_an_empty_write_chunk_keeps_its_read_inline() {
    let mut p = Pair::default_pair();
    let TwoReads {
        bufs: [_, c2],
        data: [d1, d2],
        res,
        at: [at1, _],
    } = two_compound_reads(&mut p, [false, true]);
    assert_eq!(p.a.get(c2.unwrap().prefix(2000).unwrap()), d2);
    assert_eq!(echoed_chunks(&p), [(0, 0), (1, 2000)]);
    // The first READ's data inline, with its pad, before the second READ's result.
    let mut inline = res[..at1 as usize].to_vec();
    inline.extend(&d1);
    inline.push(0);
    inline.extend(&res[at1 as usize..]);
    assert!(
        p.b.sent.last().unwrap().ends_with(&inline),
        "the reply's stream"
    );
}

/// A call's AUTH_SYS identity (the app's, ABI `flag::AUTH_SYS`) goes on the wire in its RPC
/// header and comes out of the responder with the call, both in a Short call and in a Long
/// one (the header, 20 bytes longer than AUTH_NONE's, in the position-zero Read chunk), and
/// the reply still comes back whole.
#[test]
fn auth_sys_identity_travels_in_short_and_long_calls() {
    use rpcrdma_proto::rpc::{AuthSys, CallHeader};
    let me = AuthSys {
        uid: 1000,
        gid: 100,
    };
    for (xid, len) in [(21u32, 64usize), (22, 3000)] {
        let mut p = Pair::default_pair();
        let data = pattern(xid, len);
        let mut spec = bulk_spec(&mut p.a, xid, &data, 4096);
        spec.auth = Some(me);
        p.a.conn.submit_call(&spec, &mut p.a.env).expect("submit");
        p.run();
        let (bytes, hl) = decode_sent(&p.a.sent[0]);
        let rpc = match header(&bytes).body {
            // Short: the RPC message follows the transport header.
            v1::Body::Msg(_) => bytes[hl..].to_vec(),
            // Long: the whole message in the position-zero Read chunk, header first.
            v1::Body::Nomsg(c) => {
                let total: u32 = c.reads.iter().map(|r| r.target.length).sum();
                assert_eq!(total as usize, 24 + AuthSys::ENCODED_LEN + 8 + len);
                let t = c.reads.iter().next().expect("a PZRC").target;
                let at =
                    p.a.env
                        .resolve(
                            t.handle,
                            t.offset,
                            t.length,
                            rpcrdma_verbs::Access::REMOTE_READ,
                        )
                        .expect("the PZRC's first segment is exposed");
                p.a.get(at)
            }
            other => panic!("{other:?}"),
        };
        let h = CallHeader::parse(&rpc).expect("an RPC call header");
        assert_eq!((h.cred_flavor, h.auth_sys), (1, Some(me)), "xid {xid}");
        assert_eq!(h.args_offset, 60);
        let ic = p.b.events.iter().find_map(|e| match e {
            Event::IncomingCall(c) => Some(*c),
            _ => None,
        });
        assert_eq!(
            ic.map(|c| c.auth),
            Some(Some(me)),
            "the responder hands it on"
        );
        serve(&mut p);
        let d = done(&mut p);
        assert_eq!(d[0].status, CallStatus::Ok, "{d:?}");
        assert_eq!(p.a.get(spec.reply.prefix(len as u32).unwrap()), data);
    }
}

/// A call whose credential claims AUTH_SYS but whose body is not one is refused with
/// AUTH_BADCRED (RFC 5531 §9) before anything is handed to an app; the connection stays up.
#[test]
fn a_malformed_auth_sys_credential_is_refused_with_auth_badcred() {
    let mut p = Pair::default_pair();
    p.run();
    // RDMA_MSG with empty lists; CALL, RPC 2, the bulk program, AUTH_SYS with a 4-byte body,
    // an AUTH_NONE verifier, one argument word.
    let mut m = be(&[0x77, 1, 8, 0, 0, 0, 0]);
    m.extend(be(&[0x77, 0, 2, BULK_PROG, 1, 1, 1, 4, 0, 0, 0, 5]));
    p.inject(true, &m);
    assert!(!p
        .b
        .events
        .iter()
        .any(|e| matches!(e, Event::IncomingCall(_))));
    let sent = p.b.sent.last().expect("an answer").clone();
    let mut want = be(&[0x77, 1, p.b.conn.grant(), 0, 0, 0, 0]);
    want.extend(rpcmsg::auth_error_reply(0x77, rpcmsg::AUTH_BADCRED));
    assert_eq!(sent, want);
    assert_eq!(p.b.conn.closed(), None, "the connection stays up");
}
