//! Upper-Layer Binding tables: RDMATEST (TESTPROG.md) and NFSv2 and NFSv3 (RFC 8267 §4).
//!
//! The NFSv2 layouts are judged by Wireshark too (`rfc8267_nfs2_positions_agree_with_wireshark`;
//! needs `tshark`, which `scripts/setup` installs, and fails without it).

mod wire;

use std::path::PathBuf;

use rpcrdma_proto::chunk::{ReadList, ReadSegment, Segment};
use rpcrdma_proto::ulb::{self, nfs2, nfs3, rdmatest, Binding, Item};
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

#[test]
fn rfc8267_nfs2_binding_table() {
    let b = |p| ulb::binding(ulb::NFS_PROG, 2, p);
    assert!(b(nfs2::WRITE).arg_eligible && !b(nfs2::WRITE).result_eligible);
    assert!(b(nfs2::SYMLINK).arg_eligible && !b(nfs2::SYMLINK).result_eligible);
    assert!(b(nfs2::READ).result_eligible && !b(nfs2::READ).arg_eligible);
    assert!(b(nfs2::READLINK).result_eligible);
    assert_eq!(b(nfs2::READ).max_write_chunks, 1);
    assert_eq!(b(nfs2::WRITE).max_read_chunks, 1);
    // Version 2's WRITECACHE (7) and version 3's WRITE number carry nothing in version 2.
    assert_eq!(b(7), Binding::NONE);
    assert_eq!(b(10), Binding::NONE, "REMOVE, version 3's SYMLINK number");
    assert_eq!(b(1), Binding::NONE, "GETATTR");
}

/// An NFSv2 file handle: 32 bytes, fixed length.
fn fh2() -> Vec<u8> {
    (0..32).collect()
}

/// XDR opaque or string: length, bytes, zero pad to a multiple of 4.
fn opaque(data: &[u8]) -> Vec<u8> {
    let mut v = words(&[data.len() as u32]);
    v.extend_from_slice(data);
    v.resize(v.len().next_multiple_of(4), 0);
    v
}

const V2_DATA: &[u8] = b"0123456789abcdefghij-";
const V2_PATH: &[u8] = b"/target/pth";
/// The `uid` of SYMLINK's attributes, which follow the eligible path.
const V2_UID: u32 = 1000;

/// NFSv2 writeargs: file, beginoffset, offset, totalcount, data.
fn nfs2_write_args() -> Vec<u8> {
    [fh2(), words(&[7, 4096, 21]), opaque(V2_DATA)].concat()
}

/// NFSv2 symlinkargs: from (dir handle, name), to (the path), sattr (mode, uid, gid, size,
/// atime, mtime).
fn nfs2_symlink_args() -> Vec<u8> {
    [
        fh2(),
        opaque(b"ln"),
        opaque(V2_PATH),
        words(&[0o644, V2_UID, 1001, u32::MAX, 1, 2, 3, 4]),
    ]
    .concat()
}

/// NFSv2 readres, NFS_OK: status, fattr (17 words), data.
fn nfs2_read_res() -> Vec<u8> {
    let fattr: Vec<u32> = (1..=17).collect();
    [words(&[0]), words(&fattr), opaque(V2_DATA)].concat()
}

/// NFSv2 readlinkres, NFS_OK: status, path.
fn nfs2_readlink_res() -> Vec<u8> {
    [words(&[0]), opaque(V2_PATH)].concat()
}

#[test]
fn rfc8267_nfs2_item_positions() {
    let at = |position, length| Ok(Some(Item { position, length }));
    let arg = |proc, args: &[u8]| ulb::eligible_argument(ulb::NFS_PROG, 2, proc, args);
    let res = |proc, results: &[u8]| ulb::eligible_result(ulb::NFS_PROG, 2, proc, results);
    // WRITE: handle 32, three words, the data's length word.
    assert_eq!(arg(nfs2::WRITE, &nfs2_write_args()), at(32 + 12 + 4, 21));
    // SYMLINK: handle 32, name "ln" 8, the path's length word; 32 bytes of attributes follow.
    let symlink = nfs2_symlink_args();
    assert_eq!(arg(nfs2::SYMLINK, &symlink), at(32 + 8 + 4, 11));
    assert_eq!(symlink.len(), 32 + 8 + 4 + 12 + 32);
    // READ: status, fattr 68, the data's length word. READLINK: status, the length word.
    assert_eq!(res(nfs2::READ, &nfs2_read_res()), at(4 + 68 + 4, 21));
    assert_eq!(res(nfs2::READLINK, &nfs2_readlink_res()), at(8, 11));
    // An error status (NFSERR_IO, NFSERR_ACCES) has no result to place.
    assert_eq!(res(nfs2::READ, &words(&[5])), Ok(None));
    assert_eq!(res(nfs2::READLINK, &words(&[13])), Ok(None));
    // Cut short, or a name over NFSv2's 255 bytes: errors, never a wrong position.
    assert!(arg(nfs2::WRITE, &fh2()).is_err());
    assert!(res(nfs2::READ, &words(&[0, 1, 2])).is_err());
    let long_name = [fh2(), words(&[256])].concat();
    assert_eq!(
        arg(nfs2::SYMLINK, &long_name),
        Err(Error::BadValue("diropargs name", 256))
    );
}

#[test]
fn r8166_6_1_b_nfs2_symlink_read_chunk_with_arguments_after_it() {
    // The reduced SYMLINK keeps its attributes inline after the path's length word; a Read
    // chunk at the path's position, of the path's length (with or without pad), is eligible.
    let mut msg = call(ulb::NFS_PROG, 2, nfs2::SYMLINK);
    msg.extend_from_slice(&[fh2(), opaque(b"ln"), words(&[11])].concat());
    msg.extend_from_slice(&words(&[0o644, V2_UID, 1001, u32::MAX, 1, 2, 3, 4]));
    let position = 40 + 32 + 8 + 4;
    for len in [11, 12] {
        let r = reads(position, &[len]);
        assert_eq!(
            ulb::check_read_chunks(&msg, &ReadList::from_segments(&r)),
            Ok(())
        );
    }
    for (position, len) in [(position, 10), (position + 4, 11), (40 + 32 + 4, 11)] {
        let r = reads(position, &[len]);
        let e = ulb::check_read_chunks(&msg, &ReadList::from_segments(&r)).unwrap_err();
        assert!(
            matches!(e, Error::NotEligible(_)),
            "{position} {len}: {e:?}"
        );
    }
}

#[test]
fn rfc8267_nfs2_positions_agree_with_wireshark() {
    // Each call and reply goes into a capture; Wireshark's NFSv2 dissector must find, as the
    // eligible item, the very bytes the binding points at, and SYMLINK's uid right after it.
    let reply_head = |xid| words(&[xid, 1, 0, 0, 0, 0]);
    let mut pcap = wire::Pcap::new();
    let mut expect = Vec::new();
    for (xid, proc, args) in [
        (1, nfs2::WRITE, nfs2_write_args()),
        (2, nfs2::SYMLINK, nfs2_symlink_args()),
    ] {
        let msg = [v2_call(xid, proc), args].concat();
        let item = ulb::eligible_call_item(&msg).unwrap().unwrap();
        expect.push((
            pcap.push(true, &msg),
            proc,
            slice(&msg, item),
            after(&msg, item),
        ));
    }
    for (xid, proc, results) in [
        (3, nfs2::READ, nfs2_read_res()),
        (4, nfs2::READLINK, nfs2_readlink_res()),
    ] {
        pcap.push(true, &[v2_call(xid, proc), fh2()].concat());
        let item = ulb::eligible_result(ulb::NFS_PROG, 2, proc, &results)
            .unwrap()
            .unwrap();
        let reply = [reply_head(xid), results.clone()].concat();
        expect.push((pcap.push(false, &reply), proc, slice(&results, item), None));
    }
    let file = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nfs2-layouts.pcap");
    std::fs::write(&file, &pcap.bytes).unwrap();
    let fields = [
        "frame.number",
        "nfs.data",
        "nfs.symlink.to",
        "nfs.readlink.data",
        "nfs.fattr.uid",
        "_ws.malformed",
    ];
    let rows = wire::tshark(&file, &fields);
    for (frame, proc, item, next_word) in expect {
        let row = rows
            .iter()
            .find(|r| r.first() == Some(&frame.to_string()))
            .unwrap_or_else(|| panic!("tshark printed no frame {frame}"));
        let seen = match proc {
            nfs2::WRITE | nfs2::READ => row[1].clone(),
            nfs2::SYMLINK => hex(row[2].as_bytes()),
            _ => hex(row[3].as_bytes()),
        };
        assert_eq!(
            seen,
            hex(&item),
            "frame {frame}, procedure {proc}: eligible item"
        );
        if let Some(uid) = next_word {
            assert_eq!(
                row[4],
                uid.to_string(),
                "frame {frame}: the word after the item"
            );
        }
        assert!(row[5].is_empty(), "frame {frame} malformed");
    }
}

/// An NFSv2 call header (AUTH_NONE) with XID `xid`, for Wireshark to pair calls and replies.
fn v2_call(xid: u32, proc: u32) -> Vec<u8> {
    words(&[xid, 0, 2, ulb::NFS_PROG, 2, proc, 0, 0, 0, 0])
}

/// The item's bytes (pad excluded).
fn slice(msg: &[u8], item: Item) -> Vec<u8> {
    let at = item.position as usize;
    msg[at..at + item.length as usize].to_vec()
}

/// The second word after the item and its pad (SYMLINK's `uid`), if the message goes on.
fn after(msg: &[u8], item: Item) -> Option<u32> {
    let at = (item.position + item.length).next_multiple_of(4) as usize + 4;
    let w = msg.get(at..at + 4)?;
    Some(u32::from_be_bytes(w.try_into().unwrap()))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
