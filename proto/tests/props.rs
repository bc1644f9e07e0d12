//! Property tests: random valid headers round-trip, random bytes never panic, and every
//! truncation of a valid header is rejected with the right error.

use proptest::prelude::*;
use rpcrdma_proto::chunk::{Chunk, ChunkLists, ReadList, ReadSegment, Segment, WriteList};
use rpcrdma_proto::xchar::{BkReqSup, Operation, Xchar, XcharSpec, XcharSubset};
use rpcrdma_proto::{cm, decode, v1, v2, Error, Limits, Message, MsgType};

/// Owned storage for a header's chunk lists, so a `Repr` can borrow it.
#[derive(Clone, Debug)]
struct Lists {
    reads: Vec<ReadSegment>,
    writes: Vec<Vec<Segment>>,
    reply: Option<Vec<Segment>>,
}

impl Lists {
    fn with<R>(&self, f: impl FnOnce(ChunkLists<'_>) -> R) -> R {
        let chunks: Vec<Chunk<'_>> = self
            .writes
            .iter()
            .map(|c| Chunk::from_segments(c))
            .collect();
        f(ChunkLists {
            reads: ReadList::from_segments(&self.reads),
            writes: WriteList::from_chunks(&chunks),
            reply: self.reply.as_deref().map(Chunk::from_segments),
        })
    }

    fn is_empty(&self) -> bool {
        self.reads.is_empty() && self.writes.is_empty() && self.reply.is_none()
    }
}

fn segment() -> impl Strategy<Value = Segment> {
    (any::<u32>(), 0u32..1 << 20, 0u64..u64::MAX - (1 << 32))
        .prop_map(|(h, l, o)| Segment::new(h, l, o))
}

fn chunk(max: usize) -> impl Strategy<Value = Vec<Segment>> {
    prop::collection::vec(segment(), 0..max)
}

/// Read chunks at non-overlapping positions (multiples of 4), optionally with a PZRC,
/// the segments of different chunks interleaved in list order (AMB-11 allows it).
fn reads(pzrc: bool) -> impl Strategy<Value = Vec<ReadSegment>> {
    (
        prop::collection::vec((0u32..64, prop::collection::vec(segment(), 1..4)), 0..4),
        prop::collection::vec(segment(), 1..4),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(move |(chunks, zero, with_zero, interleave)| {
            let mut out = Vec::new();
            let mut pos = 4u32;
            for (gap, segs) in chunks {
                pos += gap * 4;
                let len: u32 = segs.iter().map(|s| s.length).sum();
                out.extend(segs.into_iter().map(|s| ReadSegment::new(pos, s)));
                pos = (pos + len + 3) & !3;
            }
            if pzrc && with_zero {
                out.extend(zero.into_iter().map(|s| ReadSegment::new(0, s)));
            }
            if interleave && out.len() > 2 {
                let last = out.pop().unwrap_or_default();
                out.insert(1, last);
            }
            out
        })
}

fn lists(pzrc: bool) -> impl Strategy<Value = Lists> {
    (
        reads(pzrc),
        prop::collection::vec(chunk(5), 0..4),
        prop::option::of(chunk(5)),
    )
        .prop_map(|(reads, writes, reply)| Lists {
            reads,
            writes,
            reply,
        })
}

#[derive(Clone, Debug)]
enum Body {
    Msg(Lists),
    Nomsg(Lists),
    ErrVers(u32, u32),
    ErrChunk,
}

fn v1_body() -> impl Strategy<Value = Body> {
    prop_oneof![
        lists(false).prop_map(Body::Msg),
        lists(true)
            .prop_filter("NOMSG needs a chunk", |l| !l.is_empty())
            .prop_map(Body::Nomsg),
        (any::<u32>(), any::<u32>()).prop_map(|(l, h)| Body::ErrVers(l, h)),
        Just(Body::ErrChunk),
    ]
}

/// Encodes a v1 message (header plus, for RDMA_MSG, an RPC stub starting with the XID).
fn v1_message(xid: u32, credit: u32, body: &Body) -> (Vec<u8>, usize) {
    let mut out = vec![0u8; 4096];
    let emit = |b: v1::Body<'_>, out: &mut [u8]| {
        let h = v1::Header {
            xid,
            credit,
            body: b,
        };
        let n = h.emit(out).unwrap();
        assert_eq!(n, h.buffer_len());
        n
    };
    let n = match body {
        Body::Msg(l) => l.with(|c| emit(v1::Body::Msg(c), &mut out)),
        Body::Nomsg(l) => l.with(|c| emit(v1::Body::Nomsg(c), &mut out)),
        Body::ErrVers(low, high) => emit(
            v1::Body::Error(v1::ErrorBody::Vers {
                low: *low,
                high: *high,
            }),
            &mut out,
        ),
        Body::ErrChunk => emit(v1::Body::Error(v1::ErrorBody::Chunk), &mut out),
    };
    out.truncate(n);
    if matches!(body, Body::Msg(_)) {
        out.extend_from_slice(&xid.to_be_bytes());
        out.extend_from_slice(&0u32.to_be_bytes());
    }
    (out, n)
}

fn xchar_value() -> impl Strategy<Value = (u32, Vec<u8>, u32)> {
    // (kind, opaque data for unknown ids, value)
    (
        0u32..4,
        prop::collection::vec(any::<u8>(), 0..9),
        any::<u32>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn r8166_4_1_a_random_v1_headers_round_trip(xid: u32, credit: u32, body in v1_body()) {
        let (msg, n) = v1_message(xid, credit, &body);
        let d = decode(&msg, &Limits::DEFAULT).unwrap();
        prop_assert_eq!(d.header_len, n);
        let Message::V1(h) = d.message else { panic!("not v1") };
        let mut again = vec![0u8; n];
        prop_assert_eq!(h.emit(&mut again).unwrap(), n);
        prop_assert_eq!(&again[..], &msg[..n]);
        // The decoded Repr equals the one built from slices.
        match &body {
            Body::Msg(l) => l.with(|c| assert_eq!(h.body, v1::Body::Msg(c))),
            Body::Nomsg(l) => l.with(|c| assert_eq!(h.body, v1::Body::Nomsg(c))),
            _ => {}
        }
    }

    #[test]
    fn v2_4_2_a_random_v2_headers_round_trip(
        xid: u32, credit: u32, l in lists(true), reply: bool, opttype: u32,
        optinfo in prop::collection::vec(any::<u8>(), 0..20),
    ) {
        let dir = if reply { MsgType::Reply } else { MsgType::Call };
        let mut out = vec![0u8; 4096];
        let n = l.with(|chunks| {
            let body = if l.is_empty() {
                v2::Body::Optional(v2::Optional { direction: dir, opttype, optinfo: &optinfo })
            } else {
                v2::Body::Nomsg { direction: dir, chunks }
            };
            let h = v2::Header { xid, credit, body };
            let n = h.emit(&mut out).unwrap();
            assert_eq!(n, h.buffer_len());
            let d = decode(&out[..n], &Limits::DEFAULT).unwrap();
            assert_eq!(d.message, Message::V2(h));
            assert_eq!(d.header_len, n);
            n
        });
        prop_assert!(n >= 28);
    }

    #[test]
    fn xch_2_1_a_random_operations_round_trip(
        vals in prop::collection::vec(xchar_value(), 0..6),
        words in prop::collection::vec(any::<u32>(), 0..3),
        op in 0u32..4, pendclr: bool,
    ) {
        let vals: Vec<Xchar<'_>> = vals.iter().map(|(k, data, v)| match k {
            0 => Xchar::RbSiz(*v),
            1 => Xchar::ReqRemInv(v % 2 == 1),
            2 => Xchar::Brs([BkReqSup::None, BkReqSup::Inline, BkReqSup::Genl][(*v % 3) as usize]),
            _ => Xchar::Other { which: 4 + v % 0xffff_fff0, data },
        }).collect();
        let spec = XcharSpec::from_values(&vals);
        let sub = XcharSubset::from_words(&words);
        let op = match op {
            0 => Operation::InitXch { start: spec, nochg: sub },
            1 => Operation::ReqXch { want: spec },
            2 => Operation::RespXch { done: sub, rej: XcharSubset::EMPTY, pend: sub },
            _ => Operation::UpdXch { now: vals.first().copied().unwrap_or(Xchar::RbSiz(1)), pendclr },
        };
        let mut out = vec![0u8; 1024];
        let n = op.emit_message(5, 1, MsgType::Call, &mut out).unwrap();
        prop_assert_eq!(n, 28 + op.buffer_len());
        let d = decode(&out[..n], &Limits::DEFAULT).unwrap();
        let Message::V2(v2::Header { body: v2::Body::Optional(o), .. }) = d.message else {
            panic!("not optional")
        };
        prop_assert_eq!(Operation::parse(o.opttype, o.optinfo).unwrap(), op);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200), t in 0u32..6) {
        let tight = Limits { max_read_segments: 2, max_read_chunks: 1, max_write_chunks: 1,
                             max_segments_per_chunk: 2, max_version: 1 };
        for limits in [Limits::DEFAULT, tight] {
            if let Ok(d) = decode(&bytes, &limits) {
                let _ = d.message.to_string();
                let _ = d.message.check_reply();
            }
        }
        let _ = Operation::parse(t, &bytes);
        let _ = cm::PrivateData::parse(&bytes);
    }

    #[test]
    fn random_words_in_valid_headers_never_panic(
        xid: u32, body in v1_body(), at in any::<prop::sample::Index>(), word: u32,
    ) {
        // Small words hit discriminators and counts more often than random bytes do.
        let (mut msg, n) = v1_message(xid, 1, &body);
        let i = at.index(n / 4) * 4;
        msg[i..i + 4].copy_from_slice(&(word % 8).to_be_bytes());
        if let Ok(d) = decode(&msg, &Limits::DEFAULT) {
            let _ = d.message.to_string();
            if let Message::V1(h) = d.message {
                let mut out = vec![0u8; h.buffer_len()];
                prop_assert_eq!(h.emit(&mut out).unwrap(), out.len());
                prop_assert_eq!(&out[..], &msg[..d.header_len]);
            }
        }
    }

    #[test]
    fn r8166_4_5_a_every_truncation_of_a_valid_header_rejected(xid: u32, body in v1_body()) {
        let (msg, n) = v1_message(xid, 1, &body);
        let is_err_chunk = matches!(body, Body::ErrChunk);
        for len in 0..n {
            let r = decode(&msg[..len], &Limits::DEFAULT).unwrap_err();
            if len < 28 {
                prop_assert_eq!(r.error, Error::TooShort, "len {}", len);
            } else {
                prop_assert!(matches!(r.error, Error::Truncated(_)), "len {}: {:?}", len, r.error);
            }
            prop_assert!(!(is_err_chunk && len >= 20));
        }
    }

    #[test]
    fn rfc8797_private_data_round_trip(inv: bool, send in 1024u32..=262_144, recv in 1024u32..=262_144,
                                       trailing in prop::collection::vec(any::<u8>(), 0..8)) {
        let p = cm::PrivateData { remote_invalidate: inv, send_size: send, recv_size: recv };
        let mut b = p.emit().to_vec();
        b.extend_from_slice(&trailing);
        let back = cm::PrivateData::parse(&b).unwrap();
        prop_assert_eq!(back, p.normalized());
        prop_assert!(back.send_size <= send && send - back.send_size < 1024);
        prop_assert!(back.recv_size <= recv && recv - back.recv_size < 1024);
    }
}
