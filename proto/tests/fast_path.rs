//! The fixed-layout fast paths for chunk-less RDMA_MSG / RDMA2_MSG headers give exactly
//! what the general encoder and decoder give: the same bytes written, the same header or
//! the same rejection decoded, on many inputs around the fast layouts (hits and near
//! misses alike); and the fixed-layout RPC call header read gives what its general decoder
//! gives.

use proptest::prelude::*;
use rpcrdma_proto::chunk::{Chunk, ChunkLists, ReadList, ReadSegment, Segment, WriteList};
use rpcrdma_proto::rpc::CallHeader;
use rpcrdma_proto::{decode, decode_general, decode_short, v1, v2, Limits, MsgType};

/// Chunk lists picked by `kind`: empty most of the time, else one chunk of each kind.
fn with_lists<R>(kind: u8, seg: Segment, f: impl FnOnce(ChunkLists<'_>) -> R) -> R {
    let reads = [ReadSegment::new(if kind & 4 != 0 { 0 } else { 8 }, seg)];
    let segs = [seg];
    let writes = [Chunk::from_segments(&segs)];
    f(ChunkLists {
        reads: if kind & 1 != 0 {
            ReadList::from_segments(&reads)
        } else {
            ReadList::EMPTY
        },
        writes: if kind & 2 != 0 {
            WriteList::from_chunks(&writes)
        } else {
            WriteList::EMPTY
        },
        reply: (kind & 8 != 0).then(|| Chunk::from_segments(&segs)),
    })
}

/// Encodes with `emit` and `emit_general` into `len`-byte buffers pre-filled alike.
fn both(len: usize, emit: impl Fn(&mut [u8], bool) -> Result<usize, rpcrdma_proto::Error>) {
    let mut fast = vec![0xa5u8; len];
    let mut general = vec![0xa5u8; len];
    let a = emit(&mut fast, true);
    let b = emit(&mut general, false);
    assert_eq!(a, b);
    if a.is_ok() {
        assert_eq!(fast, general);
    }
}

/// Words drawn mostly from the values the fast path tests, so that hits and near misses
/// (one word off) are both frequent.
fn word(xid: u32) -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => Just(0u32),
        2 => Just(1u32),
        2 => Just(2u32),
        1 => Just(3u32),
        1 => Just(4u32),
        2 => Just(xid),
        1 => any::<u32>(),
    ]
}

/// A message laid out like a chunk-less RDMA_MSG of version 1 or 2, then mutated.
fn message() -> impl Strategy<Value = Vec<u8>> {
    any::<u32>().prop_flat_map(|xid| {
        (
            any::<bool>(),
            any::<u32>(),
            any::<bool>(),
            prop::collection::vec((0usize..12, word(xid)), 0..3),
            0usize..56,
        )
            .prop_map(move |(v2, credit, reply, muts, len)| {
                let dir = u32::from(reply);
                let mut w = if v2 {
                    vec![xid, 2, credit, 0, dir, 0, 0, 0, xid, dir, 0, 0]
                } else {
                    vec![xid, 1, credit, 0, 0, 0, 0, xid, dir, 0, 0, 0]
                };
                for (i, v) in muts {
                    if let Some(x) = w.get_mut(i) {
                        *x = v;
                    }
                }
                let mut b: Vec<u8> = w.iter().flat_map(|x| x.to_be_bytes()).collect();
                b.truncate(len);
                b
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    #[test]
    fn v1_emit_fast_path_writes_the_general_bytes(
        xid in any::<u32>(), credit in any::<u32>(), nomsg in any::<bool>(),
        kind in prop_oneof![3 => Just(0u8), 1 => 0u8..16],
        seg in (any::<u32>(), any::<u32>(), any::<u64>()), len in 0usize..160,
    ) {
        let seg = Segment::new(seg.0, seg.1, seg.2);
        with_lists(kind, seg, |c| {
            let body = if nomsg { v1::Body::Nomsg(c) } else { v1::Body::Msg(c) };
            let h = v1::Header { xid, credit, body };
            both(len, |b, fast| if fast { h.emit(b) } else { h.emit_general(b) });
        });
    }

    #[test]
    fn v2_emit_fast_path_writes_the_general_bytes(
        xid in any::<u32>(), credit in any::<u32>(), nomsg in any::<bool>(),
        reply in any::<bool>(),
        kind in prop_oneof![3 => Just(0u8), 1 => 0u8..16],
        seg in (any::<u32>(), any::<u32>(), any::<u64>()), len in 0usize..160,
    ) {
        let seg = Segment::new(seg.0, seg.1, seg.2);
        let direction = if reply { MsgType::Reply } else { MsgType::Call };
        with_lists(kind, seg, |chunks| {
            let body = if nomsg {
                v2::Body::Nomsg { direction, chunks }
            } else {
                v2::Body::Msg { direction, chunks }
            };
            let h = v2::Header { xid, credit, body };
            both(len, |b, fast| if fast { h.emit(b) } else { h.emit_general(b) });
        });
    }

    #[test]
    fn decode_fast_path_yields_the_general_result(
        msg in message(), max_version in 1u32..=2,
    ) {
        let limits = Limits { max_version, ..Limits::DEFAULT };
        let general = decode_general(&msg, &limits);
        if let Some(s) = decode_short(&msg, &limits) {
            prop_assert_eq!(Ok(s.decoded()), general);
        }
        prop_assert_eq!(decode(&msg, &limits), general);
    }

    /// `CallHeader::parse` reads AUTH_NONE calls from their fixed layout; every input gets
    /// what the general decoder gives (hits, near misses, short and garbage inputs alike).
    #[test]
    fn call_header_fast_path_yields_the_general_result(
        (ids, args) in (any::<[u32; 4]>(), proptest::collection::vec(word(7), 0..6)),
        change in proptest::option::of((0usize..10, word(7))),
        keep in proptest::option::of(0usize..64),
    ) {
        // An AUTH_NONE call: xid, CALL, rpcvers 2, prog, vers, proc, two empty auths.
        let mut words = vec![ids[0], 0, 2, ids[1], ids[2], ids[3], 0, 0, 0, 0];
        words.extend(&args);
        if let Some((k, v)) = change {
            words[k] = v;
        }
        let mut msg: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
        if let Some(n) = keep {
            msg.truncate(n);
        }
        let fast = CallHeader::parse(&msg);
        prop_assert_eq!(fast, CallHeader::parse_general(&msg));
    }
}

#[test]
fn fast_path_layouts_round_trip() {
    // The fast paths are taken for these (and the results match the general path above).
    let mut e = [0u8; 28];
    assert_eq!(v1::emit_msg(&mut e, 7, 32), Some(28));
    assert_eq!(v1::emit_msg(&mut e[..27], 7, 32), None);
    let mut b = [0u8; 40];
    let h = v1::Header {
        xid: 7,
        credit: 32,
        body: v1::Body::Msg(ChunkLists::EMPTY),
    };
    assert_eq!(h.emit(&mut b), Ok(28));
    b[28..32].copy_from_slice(&7u32.to_be_bytes());
    assert!(decode_short(&b[..32], &Limits::DEFAULT).is_some());
    let d = decode(&b[..32], &Limits::DEFAULT).expect("decodes");
    assert_eq!(d.header_len, 28);
    assert_eq!(d.message, rpcrdma_proto::Message::V1(h));

    let h = v2::Header {
        xid: 9,
        credit: 5,
        body: v2::Body::Msg {
            direction: MsgType::Reply,
            chunks: ChunkLists::EMPTY,
        },
    };
    assert_eq!(h.emit(&mut b), Ok(32));
    b[32..36].copy_from_slice(&9u32.to_be_bytes());
    b[36..40].copy_from_slice(&1u32.to_be_bytes());
    assert!(decode_short(&b, &Limits::DEFAULT).is_some());
    let d = decode(&b, &Limits::DEFAULT).expect("decodes");
    assert_eq!(d.header_len, 32);
    assert_eq!(d.message, rpcrdma_proto::Message::V2(h));
}
