//! Decode errors and the answers the codec gives for them, one test per REQUIREMENTS row
//! or AMB decision (RFC 8166 §4.5, §4.6; v2-01 §3.1, §4.2; xcharext §2.1).

use rpcrdma_proto::chunk::{Chunk, ChunkLists, ReadList, ReadSegment, Segment, WriteList};
use rpcrdma_proto::{
    decode, v1, v2, xchar, Answer, Error, ErrorCode, Limits, Message, MsgType, Received, Rejected,
};

const L: Limits = Limits::DEFAULT;

fn words(ws: &[u32]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_be_bytes()).collect()
}

fn reject(buf: &[u8]) -> Rejected {
    match decode(buf, &L) {
        Err(r) => r,
        Ok(d) => panic!("decoded: {:?}", d.message),
    }
}

/// An RDMA_MSG call with empty lists carrying a 2-word RPC call stub.
fn msg_call(xid: u32) -> Vec<u8> {
    words(&[xid, 1, 32, 0, 0, 0, 0, xid, 0])
}

#[test]
fn r8166_4_5_a_short_message_dropped() {
    let r = reject(&words(&[1, 1, 32]));
    assert_eq!(r.error, Error::TooShort);
    assert_eq!(r.answer(Received::Call), Answer::Drop);
    let r = reject(&words(&[1, 1, 32, 0, 0, 0]));
    assert_eq!(r.error, Error::TooShort);
    assert_eq!(r.reply(Received::Call, 8, &L), None);
}

#[test]
fn amb_1_short_err_chunk_accepted() {
    let b = words(&[9, 1, 32, 4, 2]);
    let d = decode(&b, &L).unwrap();
    assert_eq!(d.header_len, 20);
    // An ERR_VERS needs its 28 bytes.
    assert_eq!(reject(&words(&[9, 1, 32, 4, 1, 1])).error, Error::TooShort);
    // v2 BAD_HEADER and INVAL_OPTION are 20 bytes too.
    decode(&words(&[9, 2, 32, 4, 2]), &L).unwrap();
    decode(&words(&[9, 2, 32, 4, 3]), &L).unwrap();
    // 20-27 bytes of anything else is dropped.
    assert_eq!(reject(&words(&[9, 1, 32, 0, 0, 0])).error, Error::TooShort);
}

#[test]
fn r8166_4_5_1_a_err_vers_on_bad_version() {
    let b = words(&[0x2f4e6a81, 7, 32, 0, 0, 0, 0, 0x2f4e6a81]);
    let r = reject(&b);
    assert_eq!(r.error, Error::UnsupportedVersion(7));
    assert_eq!(r.answer(Received::Call), Answer::ErrVers);
    let v1_only = Limits {
        max_version: 1,
        ..L
    };
    let reply = r.reply(Received::Call, 32, &v1_only).unwrap();
    assert_eq!(reply.code, ErrorCode::Vers { low: 1, high: 1 });
    let mut out = [0u8; 28];
    assert_eq!(reply.emit(&mut out).unwrap(), 28);
    // R8166-4.5-d: xid and vers copied from the failing message.
    assert_eq!(&out[..], &words(&[0x2f4e6a81, 7, 32, 4, 1, 1, 1])[..]);
}

#[test]
fn r8166_4_5_1_a_v1_only_responder_answers_example_3() {
    // A v2 call to a v1-only responder gives exactly WIRE.md Example 3.
    let v1_only = Limits {
        max_version: 1,
        ..L
    };
    let call = words(&[0x2f4e6a81, 2, 32, 0, 0, 0, 0, 0, 0x2f4e6a81, 0]);
    let r = decode(&call, &v1_only).unwrap_err();
    let reply = r.reply(Received::Call, 32, &v1_only).unwrap();
    let mut out = [0u8; 28];
    reply.emit(&mut out).unwrap();
    assert_eq!(
        &out[..],
        &words(&[0x2f4e6a81, 2, 32, 4, 1, 1, 1])[..],
        "WIRE.md Example 3"
    );
}

#[test]
fn r8166_4_5_c_reply_header_errors_dropped() {
    for b in [
        words(&[5, 1, 32, 9, 0, 0, 0]),
        words(&[5, 7, 32, 0, 0, 0, 0, 5]),
        words(&[5, 1, 32, 1, 0, 0, 0]),
    ] {
        let r = reject(&b);
        assert_ne!(r.answer(Received::Call), Answer::Drop, "{:?}", r.error);
        assert_eq!(r.answer(Received::Reply), Answer::Drop, "{:?}", r.error);
        assert_eq!(r.reply(Received::Reply, 8, &L), None);
    }
}

#[test]
fn r8166_4_5_2_a_err_chunk_for_header_errors() {
    let cases: [(Vec<u8>, Error); 5] = [
        (words(&[5, 1, 32, 9, 0, 0, 0]), Error::UnknownProc(9)),
        (words(&[5, 1, 32, 1, 0, 0, 0]), Error::NomsgWithoutChunks),
        (words(&[5, 1, 32, 0, 0, 0, 0, 6, 0]), Error::XidMismatch),
        (
            words(&[5, 1, 32, 1, 1, 0, 1]),
            Error::Truncated("read segment"),
        ),
        (
            words(&[5, 1, 32, 1, 1, 6, 1, 8, 0, 0, 0, 0, 0]),
            Error::MisalignedPosition(6),
        ),
    ];
    for (b, e) in cases {
        let r = reject(&b);
        assert_eq!(r.error, e);
        assert_eq!(r.answer(Received::Call), Answer::ErrChunk, "{e:?}");
        let reply = r.reply(Received::Call, 8, &L).unwrap();
        let mut out = [0u8; 20];
        assert_eq!(reply.emit(&mut out).unwrap(), 20);
        assert_eq!(&out[..], &words(&[5, 1, 8, 4, 2])[..]);
    }
}

#[test]
fn r8166_4_2_4_b_nomsg_without_chunks_is_err_chunk() {
    let r = reject(&words(&[5, 1, 32, 1, 0, 0, 0]));
    assert_eq!(r.error, Error::NomsgWithoutChunks);
    assert_eq!(r.answer(Received::Call), Answer::ErrChunk);
}

#[test]
fn r8166_4_2_1_a_xid_mismatch_is_err_chunk() {
    let mut b = msg_call(0x11);
    b[31] = 0x12;
    let r = reject(&b);
    assert_eq!(r.error, Error::XidMismatch);
    assert_eq!(r.answer(Received::Call), Answer::ErrChunk);
    // RDMA_MSG with nothing after the header.
    assert_eq!(
        reject(&words(&[5, 1, 32, 0, 0, 0, 0])).error,
        Error::MissingPayload
    );
}

#[test]
fn r8166_3_2_a_payload_starts_after_header() {
    let b = msg_call(0x77);
    let d = decode(&b, &L).unwrap();
    assert_eq!(d.header_len, 28);
    assert_eq!(&b[d.header_len..d.header_len + 4], &0x77u32.to_be_bytes());
}

#[test]
fn r8166_4_5_f_undecodable_rdma_error_dropped() {
    let r = reject(&words(&[5, 1, 32, 4, 7, 0, 0]));
    assert_eq!(r.error, Error::UnknownErrorCode(7));
    assert_eq!(r.answer(Received::Call), Answer::Drop);
    assert_eq!(r.answer(Received::Reply), Answer::Drop);
}

#[test]
fn r8166_4_6_1_b_msgp_err_chunk_at_responder_dropped_at_requester() {
    let r = reject(&words(&[5, 1, 32, 2, 0, 0, 0, 0, 0]));
    assert_eq!(r.error, Error::Msgp);
    assert_eq!(r.answer(Received::Call), Answer::ErrChunk);
    assert_eq!(r.answer(Received::Reply), Answer::Drop);
}

#[test]
fn r8166_4_6_2_a_done_dropped() {
    let r = reject(&words(&[5, 1, 32, 3, 0, 0, 0]));
    assert_eq!(r.error, Error::Done);
    assert_eq!(r.answer(Received::Call), Answer::Drop);
    assert_eq!(r.answer(Received::Reply), Answer::Drop);
}

#[test]
fn r8166_4_6_1_a_no_encoder_emits_msgp_or_done() {
    // Every body the encoder can build has rdma_proc 0, 1 or 4.
    let bodies = [
        v1::Body::Msg(ChunkLists::EMPTY),
        v1::Body::Nomsg(ChunkLists::EMPTY),
        v1::Body::Error(v1::ErrorBody::Chunk),
        v1::Body::Error(v1::ErrorBody::Vers { low: 1, high: 1 }),
    ];
    for body in bodies {
        let mut out = [0u8; 32];
        v1::Header {
            xid: 1,
            credit: 1,
            body,
        }
        .emit(&mut out)
        .unwrap();
        assert!(matches!(out[15], 0 | 1 | 4));
    }
}

#[test]
fn impl_7_2_1_1_a_unknown_proc_is_err_chunk() {
    let r = reject(&words(&[5, 1, 32, 7, 0, 0, 0]));
    assert_eq!(r.error, Error::UnknownProc(7));
    assert_eq!(r.answer(Received::Call), Answer::ErrChunk);
}

#[test]
fn amb_2_err_vers_accepted_with_any_version() {
    let b = words(&[5, 9, 1, 4, 1, 1, 2]);
    let d = decode(&b, &L).unwrap();
    assert_eq!(d.message.err_vers(), Some((1, 2)));
    assert!(matches!(d.message, Message::ErrVers(e) if e.vers == 9));
}

#[test]
fn amb_9_pzrc_in_rdma_msg_is_err_chunk() {
    let b = words(&[5, 1, 32, 0, 1, 0, 1, 8, 0, 0, 0, 0, 0, 5, 0]);
    let r = reject(&b);
    assert_eq!(r.error, Error::PositionZeroInMsg);
    assert_eq!(r.answer(Received::Call), Answer::ErrChunk);
}

#[test]
fn amb_8_reply_chunk_in_msg_reply_absent_or_zero_echo_accepted() {
    // Zero-length echo: fine.
    let b = words(&[5, 1, 32, 0, 0, 0, 1, 1, 9, 0, 0, 0, 5, 1]);
    let d = decode(&b, &L).unwrap();
    d.message.check_reply().unwrap();
    // A used Reply chunk in RDMA_MSG: the requester discards it (AMB-9).
    let b = words(&[5, 1, 32, 0, 0, 0, 1, 1, 9, 100, 0, 0, 5, 1]);
    let d = decode(&b, &L).unwrap();
    assert_eq!(d.message.check_reply(), Err(Error::ReplyChunkUsedInMsg));
}

#[test]
fn r8166_4_3_1_b_read_list_in_reply_rejected() {
    let b = words(&[5, 1, 32, 0, 1, 8, 1, 8, 0, 0, 0, 0, 0, 5, 1]);
    let d = decode(&b, &L).unwrap();
    let e = d.message.check_reply().unwrap_err();
    assert_eq!(e, Error::ReadListInReply);
    assert_eq!(e.answer(1, Received::Reply), Answer::Drop);
}

#[test]
fn r8166_3_4_6_d_empty_and_unused_write_chunks() {
    let b = words(&[
        5, 1, 32, 0, 0, 1, 0, 1, 2, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 5, 1,
    ]);
    let d = decode(&b, &L).unwrap();
    let Message::V1(v1::Header {
        body: v1::Body::Msg(c),
        ..
    }) = d.message
    else {
        panic!()
    };
    let w: Vec<_> = c.writes.iter().collect();
    assert!(w[0].is_empty() && !w[0].is_unused());
    assert!(w[1].is_unused() && !w[1].is_empty());
}

#[test]
fn r8166_3_4_3_a_zero_length_segment_accepted() {
    let b = words(&[5, 1, 32, 1, 0, 0, 1, 1, 9, 0, 0, 0]);
    decode(&b, &L).unwrap();
}

#[test]
fn r8166_2_3_2_a_full_width_handle_and_offset_round_trip() {
    let seg = [Segment::new(0xffff_ffff, 0, 0xffff_ffff_ffff_fff0)];
    let h = v1::Header {
        xid: 1,
        credit: 1,
        body: v1::Body::Nomsg(ChunkLists {
            reads: ReadList::EMPTY,
            writes: WriteList::EMPTY,
            reply: Some(Chunk::from_segments(&seg)),
        }),
    };
    let mut out = [0u8; 64];
    let n = h.emit(&mut out).unwrap();
    let (back, _) = v1::Header::parse(&out[..n], &L).unwrap();
    assert_eq!(back, h);
}

#[test]
fn r8166_3_4_5_b_segments_grouped_by_position() {
    let rs = [
        ReadSegment::new(16, Segment::new(1, 4, 0)),
        ReadSegment::new(16, Segment::new(2, 4, 0)),
    ];
    let h = v1::Header {
        xid: 3,
        credit: 1,
        body: v1::Body::Msg(ChunkLists {
            reads: ReadList::from_segments(&rs),
            writes: WriteList::EMPTY,
            reply: None,
        }),
    };
    let mut out = [0u8; 128];
    let n = h.emit(&mut out).unwrap();
    out[n..n + 4].copy_from_slice(&3u32.to_be_bytes());
    let d = decode(&out[..n + 8], &L).unwrap();
    let Message::V1(v1::Header {
        body: v1::Body::Msg(c),
        ..
    }) = d.message
    else {
        panic!()
    };
    let chunks: Vec<_> = c.reads.chunks().collect();
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0].segment_count(), 2);
}

#[test]
fn limits_cap_chunks_and_segments() {
    let tight = Limits {
        max_read_segments: 1,
        max_read_chunks: 1,
        max_write_chunks: 1,
        max_segments_per_chunk: 1,
        max_version: 2,
    };
    let two_reads = words(&[5, 1, 32, 1, 1, 0, 1, 8, 0, 0, 1, 0, 2, 8, 0, 0, 0, 0, 0]);
    let r = decode(&two_reads, &tight).unwrap_err();
    assert_eq!(r.error, Error::TooMany("read segments"));
    assert_eq!(r.answer(Received::Call), Answer::ErrChunk);
    let two_writes = words(&[5, 1, 32, 1, 0, 1, 0, 1, 0, 0, 0]);
    let r = decode(&two_writes, &tight).unwrap_err();
    assert_eq!(r.error, Error::TooMany("write chunks"));
}

#[test]
fn v2_4_2_b_undefined_proc_is_bad_header() {
    for proc in [2, 3, 6] {
        let r = reject(&words(&[5, 2, 32, proc, 0, 0, 0, 0]));
        assert_eq!(r.error, Error::UnknownProc(proc));
        assert_eq!(r.answer(Received::Call), Answer::BadHeader);
        let reply = r.reply(Received::Call, 4, &L).unwrap();
        let mut out = [0u8; 20];
        reply.emit(&mut out).unwrap();
        assert_eq!(&out[..], &words(&[5, 2, 4, 4, 2])[..]);
    }
}

#[test]
fn v2_4_2_1_a_rdma2_msg_needs_payload() {
    let r = reject(&words(&[5, 2, 32, 0, 0, 0, 0, 0]));
    assert_eq!(r.error, Error::MissingPayload);
    assert_eq!(r.answer(Received::Call), Answer::BadHeader);
}

#[test]
fn v2_4_2_2_b_direction_mismatch_is_bad_header() {
    let r = reject(&words(&[5, 2, 32, 0, 0, 0, 0, 0, 5, 1]));
    assert_eq!(r.error, Error::DirectionMismatch);
    assert_eq!(r.answer(Received::Call), Answer::BadHeader);
}

#[test]
fn v2_3_1_b_unknown_opttype_is_inval_option() {
    let b = words(&[1, 2, 32, 5, 0, 0x1234, 0]);
    let d = decode(&b, &L).unwrap();
    let Message::V2(v2::Header {
        body: v2::Body::Optional(o),
        ..
    }) = d.message
    else {
        panic!()
    };
    let e = xchar::Operation::parse(o.opttype, o.optinfo).unwrap_err();
    assert_eq!(e, Error::UnsupportedOption(0x1234));
    // Answered in either role (AMB-23), as WIRE.md Example 6.
    assert_eq!(e.answer(2, Received::Reply), Answer::InvalOption);
    let r = Rejected {
        fixed: rpcrdma_proto::Fixed::peek(&b),
        error: e,
    };
    let mut out = [0u8; 20];
    r.reply(Received::Call, 32, &L)
        .unwrap()
        .emit(&mut out)
        .unwrap();
    assert_eq!(&out[..], &words(&[1, 2, 32, 4, 3])[..]);
}

#[test]
fn xch_2_1_c_data_past_optinfo_is_bad_header() {
    // INITXCH whose xcharval claims 100 bytes with 8 left (AMB-26).
    let optinfo = words(&[1, 1, 100, 0, 0]);
    let e = xchar::Operation::parse(xchar::ROPT_INITXCH, &optinfo).unwrap_err();
    assert_eq!(e, Error::BadOption("xchv_data"));
    assert_eq!(e.answer(2, Received::Call), Answer::BadHeader);
    assert_eq!(e.answer(2, Received::Reply), Answer::BadHeader);
}

#[test]
fn xch_2_1_d_known_id_with_invalid_data_is_bad_header() {
    let cases = [
        (words(&[1, 1, 2]), "RBSIZ 2-byte data"),
        (words(&[1, 3, 4, 7]), "BRS = 7"),
        (words(&[1, 2, 4, 2]), "bool = 2"),
        (words(&[1, 1, 8, 4096, 0]), "RBSIZ 8-byte data"),
    ];
    for (mut spec, what) in cases {
        if what == "RBSIZ 2-byte data" {
            spec.extend_from_slice(&[0x10, 0x00, 0, 0]);
        }
        spec.extend_from_slice(&words(&[0]));
        let e = xchar::Operation::parse(xchar::ROPT_INITXCH, &spec).unwrap_err();
        assert!(matches!(e, Error::BadOption(_)), "{what}: {e:?}");
        assert_eq!(e.answer(2, Received::Call), Answer::BadHeader, "{what}");
    }
}

#[test]
fn xch_2_1_e_unknown_ids_skipped() {
    // id 99 and an experimental id between two known ones.
    let optinfo = words(&[
        4,
        1,
        4,
        8192,
        99,
        2,
        0xabcd_0000,
        0xffff_ff10,
        0,
        3,
        4,
        2,
        0,
    ]);
    let op = xchar::Operation::parse(xchar::ROPT_INITXCH, &optinfo).unwrap();
    let xchar::Operation::InitXch { start, .. } = op else {
        panic!()
    };
    let known: Vec<_> = start
        .iter()
        .filter(|v| !matches!(v, xchar::Xchar::Other { .. }))
        .collect();
    assert_eq!(
        known,
        [
            xchar::Xchar::RbSiz(8192),
            xchar::Xchar::Brs(xchar::BkReqSup::Genl)
        ]
    );
    assert!(start
        .iter()
        .any(|v| v.which() == 0xffff_ff10 && xchar::is_experimental(v.which())));
}

#[test]
fn xch_2_1_g_subset_bit_layout() {
    let mut w = [0u32; 2];
    assert!(xchar::subset_insert(&mut w, 33));
    assert_eq!(w, [0, 2]);
    let s = xchar::XcharSubset::from_words(&w);
    assert!(s.contains(33) && !s.contains(1) && !s.contains(200));
    assert!(!xchar::XcharSubset::EMPTY.contains(0));
    assert!(!xchar::subset_insert(&mut w, 64));
}

#[test]
fn v2_4_2_e_optional_round_trip_with_unknown_body() {
    let h = v2::Header {
        xid: 9,
        credit: 2,
        body: v2::Body::Optional(v2::Optional {
            direction: MsgType::Reply,
            opttype: 77,
            optinfo: b"abcde",
        }),
    };
    let mut out = [0u8; 40];
    let n = h.emit(&mut out).unwrap();
    assert_eq!(n, 28 + 8);
    assert_eq!(n, h.buffer_len());
    let d = decode(&out[..n], &L).unwrap();
    assert_eq!(d.message, Message::V2(h));
}

#[test]
fn r8166_7_a_fixed_fields_at_same_offsets_in_every_version() {
    let v1_msg = words(&[0xa, 1, 3, 1, 0, 0, 1, 0]);
    let v2_msg = words(&[0xb, 2, 4, 5, 1, 9, 0]);
    let other = words(&[0xc, 7, 5, 4, 1, 1, 1]);
    for (b, vers, proc) in [(&v1_msg, 1, 1), (&v2_msg, 2, 5), (&other, 7, 4)] {
        let f = rpcrdma_proto::Fixed::peek(b).unwrap();
        assert_eq!((f.vers, f.proc), (vers, proc));
        decode(b, &L).unwrap();
    }
    // ERR_VERS keeps rdma_err @16, low @20, high @24 whatever the version.
    let d = decode(&other, &L).unwrap();
    assert_eq!(d.message.err_vers(), Some((1, 1)));
    assert_eq!(rpcrdma_proto::Fixed::peek(&v1_msg[..15]), None);
}

#[test]
fn r8166_4_2_2_a_v1_encoder_writes_version_1() {
    let h = v1::Header {
        xid: 1,
        credit: 1,
        body: v1::Body::Msg(ChunkLists::EMPTY),
    };
    let mut out = [0u8; 28];
    h.emit(&mut out).unwrap();
    assert_eq!(&out[4..8], &[0, 0, 0, 1]);
}

#[test]
fn r8166_3_3_1_c_error_reply_never_grants_zero_credits() {
    let r = reject(&words(&[5, 1, 32, 9, 0, 0, 0]));
    let reply = r.reply(Received::Call, 0, &L).unwrap();
    assert_eq!(reply.credit, 1);
}

#[test]
fn impl_3_2_c_read_chunk_limit_counts_positions_not_segments() {
    let one_chunk = Limits {
        max_read_chunks: 1,
        ..L
    };
    // Two segments at one position: one chunk, accepted.
    let b = words(&[5, 1, 32, 1, 1, 8, 1, 8, 0, 0, 1, 8, 2, 8, 0, 0, 0, 0, 0]);
    decode(&b, &one_chunk).unwrap();
    // Two positions: two chunks, rejected.
    let b = words(&[5, 1, 32, 1, 1, 8, 1, 8, 0, 0, 1, 16, 2, 8, 0, 0, 0, 0, 0]);
    assert_eq!(
        decode(&b, &one_chunk).unwrap_err().error,
        Error::TooMany("read chunks")
    );
}

#[test]
fn impl_3_4_a_sixteen_segment_pzrc_accepted() {
    let mut ws = vec![5, 1, 32, 1];
    for i in 0..16 {
        ws.extend_from_slice(&[1, 0, i, 4096, 0, i * 4096]);
    }
    ws.extend_from_slice(&[0, 0, 0]);
    let b = words(&ws);
    let d = decode(&b, &L).unwrap();
    let Message::V1(v1::Header {
        body: v1::Body::Nomsg(c),
        ..
    }) = d.message
    else {
        panic!()
    };
    let chunks: Vec<_> = c.reads.chunks().collect();
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0].segment_count(), 16);
    assert_eq!(chunks[0].length(), Some(16 * 4096));
}

#[test]
fn impl_3_5_1_a_nomsg_pzrc_plus_data_chunk_accepted() {
    // AMB-10: a PZRC plus a Read chunk at position 128 (the PZRC is not an overlap).
    let b = words(&[
        5, 1, 32, 1, 1, 0, 1, 4096, 0, 0, 1, 128, 2, 64, 0, 0, 0, 0, 0,
    ]);
    let d = decode(&b, &L).unwrap();
    let Message::V1(v1::Header {
        body: v1::Body::Nomsg(c),
        ..
    }) = d.message
    else {
        panic!()
    };
    let pos: Vec<u32> = c.reads.chunks().map(|c| c.position).collect();
    assert_eq!(pos, [0, 128]);
}

#[test]
fn xch_2_1_b_non_contiguous_unknown_id_accepted() {
    let optinfo = words(&[1, 0x7fff_ffff, 0]);
    let op = xchar::Operation::parse(xchar::ROPT_REQXCH, &optinfo).unwrap();
    let xchar::Operation::ReqXch { want } = op else {
        panic!()
    };
    assert_eq!(want.iter().next().map(|v| v.which()), Some(0x7fff_ffff));
}

#[test]
fn v2_4_2_1_b_error_answers_carry_no_payload() {
    for (b, len) in [
        (words(&[5, 2, 32, 9, 0, 0, 0, 0]), 20),
        (words(&[5, 9, 32, 0, 0, 0, 0, 0]), 28),
    ] {
        let reply = reject(&b).reply(Received::Call, 1, &L).unwrap();
        assert_eq!(reply.buffer_len(), len);
        let mut out = [0xeeu8; 40];
        assert_eq!(reply.emit(&mut out).unwrap(), len);
        assert!(out[len..].iter().all(|&x| x == 0xee));
    }
}

#[test]
fn amb_23_malformed_optional_answered_at_the_requester_too() {
    // A truncated rdma_optinfo from the server reaches the client: BAD_HEADER, not a drop.
    let b = words(&[3, 2, 32, 5, 1, 1, 100, 0]);
    let r = reject(&b);
    assert_eq!(r.error, Error::Truncated("rdma_optinfo"));
    assert_eq!(r.answer(Received::Reply), Answer::BadHeader);
    // Any other v2 header error at the requester is still dropped.
    let r = reject(&words(&[3, 2, 32, 1, 0, 0, 0, 0]));
    assert_eq!(r.answer(Received::Reply), Answer::Drop);
}
