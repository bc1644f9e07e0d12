//! Upper-Layer Binding tables: RDMATEST (TESTPROG.md) and NFSv3 (RFC 8267).

use rpcrdma_proto::chunk::{ReadList, ReadSegment, Segment};
use rpcrdma_proto::ulb::{self, nfs3, rdmatest, Binding, Item};
use rpcrdma_proto::{Answer, Error, Received};

fn words(ws: &[u32]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_be_bytes()).collect()
}

/// An RPC call header with AUTH_NONE credential and verifier (40 bytes).
fn call(prog: u32, vers: u32, proc: u32) -> Vec<u8> {
    words(&[0x99, 0, 2, prog, vers, proc, 0, 0, 0, 0])
}

fn reads(position: u32, lengths: &[u32]) -> Vec<ReadSegment> {
    lengths
        .iter()
        .enumerate()
        .map(|(i, &l)| ReadSegment::new(position, Segment::new(i as u32 + 1, l, 0x1000)))
        .collect()
}

#[test]
fn impl_6_2_1_a_unknown_program_nothing_eligible() {
    assert_eq!(ulb::binding(100_005, 3, 1), Binding::NONE);
    assert_eq!(ulb::binding(ulb::RDMATEST_CB_PROG, 1, 1), Binding::NONE);
    assert_eq!(
        ulb::binding(ulb::RDMATEST_PROG, 1, rdmatest::NULL),
        Binding::NONE
    );
    // NFSv3 GETATTR, NFSv4 NULL: not named, not eligible.
    assert_eq!(ulb::binding(ulb::NFS_PROG, 3, 1), Binding::NONE);
    assert_eq!(ulb::binding(ulb::NFS_PROG, 4, 0), Binding::NONE);
    let mut msg = call(100_005, 3, 1);
    msg.extend_from_slice(&words(&[4, 0]));
    assert_eq!(ulb::eligible_call_item(&msg), Ok(None));
}

#[test]
fn testprog_binding_table() {
    let b = |p| ulb::binding(ulb::RDMATEST_PROG, 1, p);
    assert!(b(rdmatest::ECHO).arg_eligible && b(rdmatest::ECHO).result_eligible);
    assert!(!b(rdmatest::READ).arg_eligible && b(rdmatest::READ).result_eligible);
    assert!(b(rdmatest::WRITE).arg_eligible && !b(rdmatest::WRITE).result_eligible);
    assert_eq!(b(rdmatest::SLEEP), Binding::NONE);
    assert_eq!(b(rdmatest::CALLBACK), Binding::NONE);
}

#[test]
fn rfc8267_nfs3_binding_table() {
    let b = |p| ulb::binding(ulb::NFS_PROG, 3, p);
    assert!(b(nfs3::WRITE).arg_eligible && !b(nfs3::WRITE).result_eligible);
    assert!(b(nfs3::SYMLINK).arg_eligible);
    assert!(b(nfs3::READ).result_eligible && !b(nfs3::READ).arg_eligible);
    assert!(b(nfs3::READLINK).result_eligible);
    assert_eq!(b(nfs3::READ).max_write_chunks, 1);
}

#[test]
fn r8166_3_4_5_a_rdmatest_write_item_position() {
    // write_args { seed, data<5> } follows the 40-byte call header.
    let mut msg = call(ulb::RDMATEST_PROG, 1, rdmatest::WRITE);
    msg.extend_from_slice(&words(&[7, 5]));
    msg.extend_from_slice(b"abcde\0\0\0");
    let item = ulb::eligible_call_item(&msg).unwrap().unwrap();
    assert_eq!(
        item,
        Item {
            position: 48,
            length: 5
        }
    );
    // The same from the args alone.
    let args = &msg[40..];
    assert_eq!(
        ulb::eligible_argument(ulb::RDMATEST_PROG, 1, rdmatest::WRITE, args),
        Ok(Some(Item {
            position: 8,
            length: 5
        }))
    );
    // ECHO's data is the first argument.
    let mut echo = call(ulb::RDMATEST_PROG, 1, rdmatest::ECHO);
    echo.extend_from_slice(&words(&[4096]));
    assert_eq!(
        ulb::eligible_call_item(&echo),
        Ok(Some(Item {
            position: 44,
            length: 4096
        }))
    );
}

#[test]
fn r8166_6_1_b_read_chunk_at_eligible_position_accepted() {
    // The reduced call: data moved out, length word kept (R8166-3.4.4.1-a).
    let mut msg = call(ulb::RDMATEST_PROG, 1, rdmatest::WRITE);
    msg.extend_from_slice(&words(&[7, 5]));
    // Exact length (pad excluded) and length + pad are both fine (R8166-3.4.5.2-b/c).
    for lens in [&[5u32][..], &[8], &[3, 2]] {
        let r = reads(48, lens);
        ulb::check_read_chunks(&msg, &ReadList::from_segments(&r)).unwrap();
    }
    // A PZRC alone is not checked here.
    let r = reads(0, &[100]);
    ulb::check_read_chunks(&msg, &ReadList::from_segments(&r)).unwrap();
}

#[test]
fn r8166_6_1_b_read_chunk_at_non_eligible_position_rejected() {
    let mut msg = call(ulb::RDMATEST_PROG, 1, rdmatest::WRITE);
    msg.extend_from_slice(&words(&[7, 5]));
    let cases: [(Vec<ReadSegment>, &str); 3] = [
        (reads(44, &[5]), "wrong position"),
        (reads(48, &[4]), "too short (R8166-3.4.5.2-c)"),
        (
            [reads(48, &[5]), reads(64, &[4])].concat(),
            "two chunks, binding allows one",
        ),
    ];
    for (r, what) in cases {
        let e = ulb::check_read_chunks(&msg, &ReadList::from_segments(&r)).unwrap_err();
        assert!(matches!(e, Error::NotEligible(_)), "{what}: {e:?}");
        // AMB-12: the header parsed, so GARBAGE_ARGS, not ERR_CHUNK.
        assert_eq!(e.answer(1, Received::Call), Answer::GarbageArgs, "{what}");
        assert_eq!(e.answer(1, Received::Reply), Answer::Drop, "{what}");
    }
    // READ's argument is not eligible at all; nor is anything of an unknown program.
    for (prog, proc) in [(ulb::RDMATEST_PROG, rdmatest::READ), (100_005, 1)] {
        let mut m = call(prog, 1, proc);
        m.extend_from_slice(&words(&[4096, 1]));
        let r = reads(40, &[4]);
        let e = ulb::check_read_chunks(&m, &ReadList::from_segments(&r)).unwrap_err();
        assert!(matches!(e, Error::NotEligible(_)));
    }
}

#[test]
fn rfc8267_nfs3_write_data_position() {
    // WRITE3args: fh (32 bytes), offset u64, count, stable, data<>.
    let mut args = words(&[32]);
    args.extend_from_slice(&[0xab; 32]);
    args.extend_from_slice(&words(&[0, 4096, 8192, 2, 8192]));
    assert_eq!(
        ulb::eligible_argument(ulb::NFS_PROG, 3, nfs3::WRITE, &args),
        Ok(Some(Item {
            position: 4 + 32 + 16 + 4,
            length: 8192
        }))
    );
    // A file handle longer than NFS3_FHSIZE is malformed.
    let bad = words(&[65]);
    assert!(ulb::eligible_argument(ulb::NFS_PROG, 3, nfs3::WRITE, &bad).is_err());
}

#[test]
fn rfc8267_nfs3_symlink_path_position() {
    // SYMLINK3args: dir fh (8), name "ln" (pad 2), sattr3 {mode set 0644, uid unset,
    // gid unset, size unset, atime SET_TO_CLIENT_TIME, mtime DONT_CHANGE}, path<11>.
    let mut args = words(&[8, 1, 2, 2]);
    args.extend_from_slice(b"ln\0\0");
    args.extend_from_slice(&words(&[1, 0o644, 0, 0, 0, 2, 100, 200, 0, 11]));
    // fh 12, name 8, mode 8, uid/gid/size 12, atime 12, mtime 4, path length 4.
    let expect = 12 + 8 + 8 + 12 + 12 + 4 + 4;
    assert_eq!(
        ulb::eligible_argument(ulb::NFS_PROG, 3, nfs3::SYMLINK, &args),
        Ok(Some(Item {
            position: expect,
            length: 11
        }))
    );
    // time_how 3 does not exist.
    let mut bad = words(&[8, 1, 2, 2]);
    bad.extend_from_slice(b"ln\0\0");
    bad.extend_from_slice(&words(&[0, 0, 0, 0, 3, 0, 11]));
    assert_eq!(
        ulb::eligible_argument(ulb::NFS_PROG, 3, nfs3::SYMLINK, &bad),
        Err(Error::BadValue("set_atime", 3))
    );
}

#[test]
fn r8166_6_1_c_d_result_positions_of_each_binding() {
    // RDMATEST ECHO and READ: the result is the whole reply, an opaque; reduced, only its
    // length word is left.
    for p in [rdmatest::ECHO, rdmatest::READ] {
        assert_eq!(
            ulb::eligible_result(ulb::RDMATEST_PROG, 1, p, &words(&[4096])),
            Ok(Some(Item {
                position: 4,
                length: 4096
            }))
        );
    }
    assert_eq!(
        ulb::eligible_result(ulb::RDMATEST_PROG, 1, rdmatest::WRITE, &words(&[7])),
        Ok(None),
        "WRITE's result is not eligible"
    );
    // NFSv3 READ3resok: status, post_op_attr (with an 84-byte fattr3), count, eof, data<>.
    let mut ok = words(&[0, 1]);
    ok.extend_from_slice(&[0x5a; 84]);
    ok.extend_from_slice(&words(&[8192, 1, 8192]));
    assert_eq!(
        ulb::eligible_result(ulb::NFS_PROG, 3, nfs3::READ, &ok),
        Ok(Some(Item {
            position: 4 + 4 + 84 + 8 + 4,
            length: 8192
        }))
    );
    // Without attributes the data comes 84 bytes sooner.
    assert_eq!(
        ulb::eligible_result(ulb::NFS_PROG, 3, nfs3::READ, &words(&[0, 0, 10, 0, 10])),
        Ok(Some(Item {
            position: 20,
            length: 10
        }))
    );
    // An error status (NFS3ERR_IO, no attributes) carries no eligible result.
    assert_eq!(
        ulb::eligible_result(ulb::NFS_PROG, 3, nfs3::READ, &words(&[5, 0])),
        Ok(None)
    );
    // READLINK3resok: status, post_op_attr, nfspath3.
    assert_eq!(
        ulb::eligible_result(ulb::NFS_PROG, 3, nfs3::READLINK, &words(&[0, 0, 11])),
        Ok(Some(Item {
            position: 12,
            length: 11
        }))
    );
    assert_eq!(
        ulb::eligible_result(ulb::NFS_PROG, 3, nfs3::READLINK, &words(&[2, 0])),
        Ok(None)
    );
    // Nothing named, nothing eligible; a truncated or malformed reply is an error.
    assert_eq!(
        ulb::eligible_result(ulb::NFS_PROG, 3, nfs3::WRITE, &words(&[0])),
        Ok(None)
    );
    assert!(ulb::eligible_result(ulb::NFS_PROG, 3, nfs3::READ, &words(&[0, 1, 0])).is_err());
    assert!(ulb::eligible_result(ulb::NFS_PROG, 3, nfs3::READ, &words(&[0, 2])).is_err());
    assert!(ulb::eligible_result(ulb::RDMATEST_PROG, 1, rdmatest::READ, &[]).is_err());
}
