//! Golden vectors: every hex example of WIRE.md §5 (typed in from the spec), checked field
//! by field against the annotated dumps and re-encoded to the same bytes.

use rpcrdma_proto::chunk::{Chunk, ChunkLists, ReadList, ReadSegment, Segment, WriteList};
use rpcrdma_proto::xchar::{BkReqSup, Operation, Xchar, XcharSpec, XcharSubset};
use rpcrdma_proto::{decode, v1, v2, xchar, Limits, Message, MsgType};

const EX1: &str = "8a3b2c1d0000000100000020000000000000000000000000000000008a3b2c1d0000000000000002000186a3000000030000000000000000000000000000000000000000";
const EX2: &str = "2f4e6a800000000100000010000000010000000100000000112233440000100000007f0012340000000000010000000011223345000004b000007f001236000000000000000000000000000100000001556677880000200000007f0012380000";
const EX3: &str = "2f4e6a81000000020000002000000004000000010000000100000001";
const EX3_CHUNK: &str = "2f4e6a8200000001000000200000000400000002";
const EX4: &str = "00000001000000020000002000000005000000000000000100000024000000020000000100000004000010000000000300000004000000010000000100000001";
const EX5: &str = "2f4e6a8300000001000000200000000000000000000000010000000299aabbcc0000100000007f00aa00000099aabbcd0000038800007f00aa0010000000000000000000";
const EX6: &str = "0000000100000002000000200000000400000003";
const EX7: &str = "0000000200000002000000200000000500000000000000020000001c00000002000000010000000400002000000000020000000400000001";
const EX8: &str = "000000020000000200000020000000050000000100000003000000140000000100000001000000010000000200000000";
const EX9: &str =
    "0000000700000002000000200000000500000001000000040000001000000001000000040000200000000001";
const EX10: &str = "0000000300000002000000200000000000000000000000000000000000000000";

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn v1_of(buf: &[u8]) -> (v1::Header<'_>, usize) {
    let d = decode(buf, &Limits::DEFAULT).unwrap();
    match d.message {
        Message::V1(h) => (h, d.header_len),
        m => panic!("not v1: {m:?}"),
    }
}

fn v2_of(buf: &[u8]) -> (v2::Header<'_>, usize) {
    let d = decode(buf, &Limits::DEFAULT).unwrap();
    match d.message {
        Message::V2(h) => (h, d.header_len),
        m => panic!("not v2: {m:?}"),
    }
}

fn reencode_v1(h: &v1::Header<'_>, wire: &[u8]) {
    let mut out = vec![0u8; h.buffer_len()];
    assert_eq!(h.emit(&mut out).unwrap(), out.len());
    assert_eq!(out, wire);
}

fn reencode_v2(h: &v2::Header<'_>, wire: &[u8]) {
    let mut out = vec![0u8; h.buffer_len()];
    assert_eq!(h.emit(&mut out).unwrap(), out.len());
    assert_eq!(out, wire);
}

#[test]
fn wire_example_1_rdma_msg_empty_lists() {
    let b = hex(EX1);
    assert_eq!(b.len(), 68);
    let (h, n) = v1_of(&b);
    assert_eq!(n, 28);
    assert_eq!(h.xid, 0x8a3b2c1d);
    assert_eq!(h.credit, 32);
    assert_eq!(h.body, v1::Body::Msg(ChunkLists::EMPTY));
    // Payload starts with the RPC XID (R8166-3.2-a).
    assert_eq!(&b[n..n + 4], &[0x8a, 0x3b, 0x2c, 0x1d]);
    reencode_v1(&h, &b[..n]);
    // Built from scratch, the same header.
    let built = v1::Header {
        xid: 0x8a3b2c1d,
        credit: 32,
        body: v1::Body::Msg(ChunkLists::EMPTY),
    };
    reencode_v1(&built, &b[..28]);
}

#[test]
fn wire_example_2_rdma_nomsg_pzrc_and_reply_chunk() {
    let b = hex(EX2);
    assert_eq!(b.len(), 96);
    let (h, n) = v1_of(&b);
    assert_eq!(n, 96);
    assert_eq!((h.xid, h.credit), (0x2f4e6a80, 16));
    let v1::Body::Nomsg(c) = h.body else {
        panic!("not NOMSG")
    };
    let reads: Vec<_> = c.reads.iter().collect();
    assert_eq!(
        reads,
        [
            ReadSegment::new(0, Segment::new(0x11223344, 4096, 0x00007f0012340000)),
            ReadSegment::new(0, Segment::new(0x11223345, 1200, 0x00007f0012360000)),
        ]
    );
    let chunks: Vec<_> = c.reads.chunks().collect();
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0].length(), Some(5296));
    assert!(c.writes.is_empty());
    let reply = c.reply.unwrap();
    assert_eq!(
        reply.segments().collect::<Vec<_>>(),
        [Segment::new(0x55667788, 8192, 0x00007f0012380000)]
    );
    reencode_v1(&h, &b);
    // Built from the sender's own slices.
    let rs = [
        ReadSegment::new(0, Segment::new(0x11223344, 4096, 0x00007f0012340000)),
        ReadSegment::new(0, Segment::new(0x11223345, 1200, 0x00007f0012360000)),
    ];
    let rc = [Segment::new(0x55667788, 8192, 0x00007f0012380000)];
    let built = v1::Header {
        xid: 0x2f4e6a80,
        credit: 16,
        body: v1::Body::Nomsg(ChunkLists {
            reads: ReadList::from_segments(&rs),
            writes: WriteList::EMPTY,
            reply: Some(Chunk::from_segments(&rc)),
        }),
    };
    assert_eq!(built, h);
    reencode_v1(&built, &b);
}

#[test]
fn wire_example_3_err_vers_with_copied_version() {
    let b = hex(EX3);
    assert_eq!(b.len(), 28);
    // rdma_vers = 2: decoded as a v2 RDMA2_ERROR / ERR_VERS (same layout, RFC 8166 §7).
    let (h, n) = v2_of(&b);
    assert_eq!(n, 28);
    assert_eq!((h.xid, h.credit), (0x2f4e6a81, 32));
    assert_eq!(
        h.body,
        v2::Body::Error(v2::ErrorBody::Vers { low: 1, high: 1 })
    );
    reencode_v2(&h, &b);
    // A v1-only receiver accepts it too (AMB-2: any rdma_vers for ERR_VERS).
    let v1_only = Limits {
        max_version: 1,
        ..Limits::DEFAULT
    };
    let d = decode(&b, &v1_only).unwrap();
    assert_eq!(d.message.err_vers(), Some((1, 1)));
    assert_eq!(d.message.xid(), 0x2f4e6a81);
}

#[test]
fn wire_example_3_err_chunk_20_byte_form() {
    let b = hex(EX3_CHUNK);
    assert_eq!(b.len(), 20);
    let (h, n) = v1_of(&b);
    assert_eq!(n, 20);
    assert_eq!((h.xid, h.credit), (0x2f4e6a82, 32));
    assert_eq!(h.body, v1::Body::Error(v1::ErrorBody::Chunk));
    reencode_v1(&h, &b);
}

#[test]
fn wire_example_4_initxch() {
    let b = hex(EX4);
    assert_eq!(b.len(), 64);
    let (h, n) = v2_of(&b);
    assert_eq!(n, 64);
    assert_eq!((h.xid, h.credit), (1, 32));
    let v2::Body::Optional(o) = h.body else {
        panic!("not OPTIONAL")
    };
    assert_eq!(o.direction, MsgType::Call);
    assert_eq!(o.opttype, xchar::ROPT_INITXCH);
    assert_eq!(o.optinfo.len(), 36);
    let op = Operation::parse(o.opttype, o.optinfo).unwrap();
    let Operation::InitXch { start, nochg } = op else {
        panic!("not INITXCH")
    };
    assert_eq!(
        start.iter().collect::<Vec<_>>(),
        [Xchar::RbSiz(4096), Xchar::Brs(BkReqSup::Inline)]
    );
    assert_eq!(nochg.iter().collect::<Vec<_>>(), [0]);
    reencode_v2(&h, &b);
    // Built from slices with the one-step encoder.
    let vals = [Xchar::RbSiz(4096), Xchar::Brs(BkReqSup::Inline)];
    let op = Operation::InitXch {
        start: XcharSpec::from_values(&vals),
        nochg: XcharSubset::from_words(&[1]),
    };
    let mut out = [0u8; 64];
    assert_eq!(op.emit_message(1, 32, MsgType::Call, &mut out).unwrap(), 64);
    assert_eq!(&out[..], &b[..]);
}

#[test]
fn wire_example_5_reply_returning_write_chunk() {
    let b = hex(EX5);
    assert_eq!(b.len(), 68);
    // The example is the header only; append a reply's XID so RDMA_MSG has a payload.
    let mut msg = b.clone();
    msg.extend_from_slice(&0x2f4e6a83u32.to_be_bytes());
    msg.extend_from_slice(&1u32.to_be_bytes());
    let (h, n) = v1_of(&msg);
    assert_eq!(n, 68);
    assert_eq!((h.xid, h.credit), (0x2f4e6a83, 32));
    let v1::Body::Msg(c) = h.body else {
        panic!("not MSG")
    };
    assert!(c.reads.is_empty());
    assert!(c.reply.is_none());
    let w: Vec<_> = c.writes.iter().collect();
    assert_eq!(w.len(), 1);
    assert_eq!(
        w[0].segments().collect::<Vec<_>>(),
        [
            Segment::new(0x99aabbcc, 4096, 0x00007f00aa000000),
            Segment::new(0x99aabbcd, 904, 0x00007f00aa001000),
        ]
    );
    assert_eq!(w[0].length(), 5000);
    assert!(Message::V1(h).check_reply().is_ok());
    reencode_v1(&h, &b);
}

#[test]
fn wire_example_6_inval_option() {
    let b = hex(EX6);
    assert_eq!(b.len(), 20);
    let (h, n) = v2_of(&b);
    assert_eq!(n, 20);
    assert_eq!((h.xid, h.credit), (1, 32));
    assert_eq!(h.body, v2::Body::Error(v2::ErrorBody::InvalOption));
    reencode_v2(&h, &b);
}

#[test]
fn wire_example_7_reqxch() {
    let b = hex(EX7);
    assert_eq!(b.len(), 56);
    let (h, _) = v2_of(&b);
    assert_eq!(h.xid, 2);
    let v2::Body::Optional(o) = h.body else {
        panic!("not OPTIONAL")
    };
    assert_eq!(
        (o.direction, o.opttype),
        (MsgType::Call, xchar::ROPT_REQXCH)
    );
    let Operation::ReqXch { want } = Operation::parse(o.opttype, o.optinfo).unwrap() else {
        panic!("not REQXCH")
    };
    assert_eq!(
        want.iter().collect::<Vec<_>>(),
        [Xchar::RbSiz(8192), Xchar::ReqRemInv(true)]
    );
    reencode_v2(&h, &b);
}

#[test]
fn wire_example_8_respxch() {
    let b = hex(EX8);
    assert_eq!(b.len(), 48);
    let (h, _) = v2_of(&b);
    assert_eq!(h.xid, 2);
    let v2::Body::Optional(o) = h.body else {
        panic!("not OPTIONAL")
    };
    assert_eq!(
        (o.direction, o.opttype),
        (MsgType::Reply, xchar::ROPT_RESPXCH)
    );
    let Operation::RespXch { done, rej, pend } = Operation::parse(o.opttype, o.optinfo).unwrap()
    else {
        panic!("not RESPXCH")
    };
    assert!(done.contains(0) && !done.contains(1));
    assert!(rej.contains(1) && !rej.contains(0));
    assert_eq!(pend.word_count(), 0);
    reencode_v2(&h, &b);
}

#[test]
fn wire_example_9_updxch() {
    let b = hex(EX9);
    assert_eq!(b.len(), 44);
    let (h, _) = v2_of(&b);
    assert_eq!(h.xid, 7);
    let v2::Body::Optional(o) = h.body else {
        panic!("not OPTIONAL")
    };
    assert_eq!(
        (o.direction, o.opttype),
        (MsgType::Reply, xchar::ROPT_UPDXCH)
    );
    assert_eq!(
        Operation::parse(o.opttype, o.optinfo).unwrap(),
        Operation::UpdXch {
            now: Xchar::RbSiz(8192),
            pendclr: true
        }
    );
    reencode_v2(&h, &b);
}

#[test]
fn wire_example_10_rdma2_msg_no_chunks() {
    let b = hex(EX10);
    assert_eq!(b.len(), 32);
    // Append the RPC call's XID and msg_type so RDMA2_MSG has its payload.
    let mut msg = b.clone();
    msg.extend_from_slice(&[0, 0, 0, 3, 0, 0, 0, 0]);
    let (h, n) = v2_of(&msg);
    assert_eq!(n, 32);
    assert_eq!((h.xid, h.credit), (3, 32));
    assert_eq!(
        h.body,
        v2::Body::Msg {
            direction: MsgType::Call,
            chunks: ChunkLists::EMPTY
        }
    );
    reencode_v2(&h, &b);
}

#[test]
fn display_reads_like_tshark_rpc_over_rdma_tree() {
    let b = hex(EX2);
    let d = decode(&b, &Limits::DEFAULT).unwrap();
    let text = d.message.to_string();
    for line in [
        "RPC over RDMA",
        "    XID: 0x2f4e6a80",
        "    Version: 1",
        "    Flow Control: 16",
        "    Message Type: RDMA_NOMSG (1)",
        "    Read list (count: 2)",
        "            Position: 0",
        "    Write list (count: 0)",
        "    Reply chunk (count: 1)",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    assert!(text.contains("handle 0x55667788, length 8192, offset 0x00007f0012380000"));
}
