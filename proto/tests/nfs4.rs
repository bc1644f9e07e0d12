//! The NFSv4 Upper-Layer Binding (RFC 8267 §5): finding the eligible items of a COMPOUND.
//!
//! Every operation of NFSv4.0, 4.1, 4.2 and the extended attribute operations is encoded here
//! (arguments, and the result of a success, in one or more of its union arms) and put before
//! a WRITE (calls) or a READ (replies); the walk must land on that WRITE's or READ's data.
//! Those encodings are this file's reading of the RFCs' XDR, as the walk is the crate's, so
//! Wireshark judges both: `tshark` must decode each COMPOUND without a malformed packet and
//! find the WRITE's offset and length, or the READ's length, where they were written
//! (`every_operation_layout_agrees_with_wireshark`; needs `tshark`, which `scripts/setup`
//! installs, and fails without it).

mod wire;

use std::path::PathBuf;

use wire::{tshark, Pcap};

use rpcrdma_proto::chunk::{ReadList, ReadSegment, Segment};
use rpcrdma_proto::nfs4::{self, op};
use rpcrdma_proto::ulb::{self, Binding, Item, NFS_PROG};
use rpcrdma_proto::{Error, Received};

fn u32b(v: u32) -> Vec<u8> {
    v.to_be_bytes().to_vec()
}

/// Concatenates XDR pieces.
fn cat(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

fn w(ws: &[u32]) -> Vec<u8> {
    ws.iter().flat_map(|x| x.to_be_bytes()).collect()
}

fn u64b(v: u64) -> Vec<u8> {
    v.to_be_bytes().to_vec()
}

fn opq(data: &[u8]) -> Vec<u8> {
    let mut v = u32b(data.len() as u32);
    v.extend_from_slice(data);
    v.resize(v.len() + (4 - data.len() % 4) % 4, 0);
    v
}

fn stateid(n: u8) -> Vec<u8> {
    cat(&[u32b(1), vec![n; 12]])
}

fn fh() -> Vec<u8> {
    opq(&[0xfa; 28])
}

/// `fattr4` with the `size` attribute (word 0, bit 4) set.
fn fattr() -> Vec<u8> {
    cat(&[w(&[1, 1 << 4]), opq(&u64b(4096))])
}

fn bitmap(ws: &[u32]) -> Vec<u8> {
    cat(&[u32b(ws.len() as u32), w(ws)])
}

fn netaddr() -> Vec<u8> {
    cat(&[opq(b"tcp"), opq(b"10.0.0.1.8.1")])
}

fn lock_owner() -> Vec<u8> {
    cat(&[u64b(7), opq(b"owner-1")])
}

fn change_info() -> Vec<u8> {
    cat(&[u32b(1), u64b(10), u64b(11)])
}

fn nfstime() -> Vec<u8> {
    cat(&[u64b(1_700_000_000), u32b(5)])
}

fn channel_attrs(ird: &[u32]) -> Vec<u8> {
    cat(&[w(&[0, 1_049_620, 1_049_480, 4616, 8, 64]), bitmap(ird)])
}

fn impl_id() -> Vec<u8> {
    cat(&[opq(b"kernel.org"), opq(b"Linux 6.18"), nfstime()])
}

fn ace() -> Vec<u8> {
    cat(&[w(&[0, 0, 0x1f01ff]), opq(b"EVERYONE@")])
}

/// Operation `op` with arguments `args`, and the result it answers with on success.
struct Case {
    op: u32,
    args: Vec<u8>,
    resok: Vec<u8>,
    /// Why Wireshark 4.0 cannot judge the call (it does not follow the RFC's XDR there).
    ws_call: Option<&'static str>,
    /// The same for the reply.
    ws_reply: Option<&'static str>,
}

fn case(op: u32, args: Vec<u8>, resok: Vec<u8>) -> Case {
    Case {
        op,
        args,
        resok,
        ws_call: None,
        ws_reply: None,
    }
}

impl Case {
    fn ws_call(self, why: &'static str) -> Self {
        Case {
            ws_call: Some(why),
            ..self
        }
    }

    fn ws_reply(self, why: &'static str) -> Self {
        Case {
            ws_reply: Some(why),
            ..self
        }
    }

    fn ws_neither(self, why: &'static str) -> Self {
        self.ws_call(why).ws_reply(why)
    }
}

/// Wireshark 4.0 dissects neither the arguments nor the result of these operations.
const NOT_DISSECTED: &str = "Wireshark 4.0 shows the opcode only";
/// RFC 8881 §18.16.1: `open_none_delegation4` carries a bool for WND4_CONTENTION and
/// WND4_RESOURCE; Wireshark 4.0 stops after `ond_why`.
const WS_NONE_EXT: &str = "Wireshark 4.0 does not read open_none_delegation4's bool";

/// One case or more for every operation, its union arms included.
fn cases() -> Vec<Case> {
    let sid = stateid(3);
    let authsys = cat(&[
        u32b(1),
        u32b(9),
        opq(b"client"),
        w(&[0, 0]),
        w(&[2, 10, 11]),
    ]);
    let gss = cat(&[u32b(6), u32b(1), opq(b"srv"), opq(b"cli")]);
    let none = u32b(0);
    let open_head = cat(&[w(&[5, 2, 0]), lock_owner()]);
    let open_res = |deleg: Vec<u8>| {
        cat(&[
            sid.clone(),
            change_info(),
            u32b(4),
            bitmap(&[1 << 4]),
            deleg,
        ])
    };
    let write_response = cat(&[w(&[1]), sid.clone(), u64b(4096), u32b(2), vec![0x77; 8]]);
    let netloc_name = cat(&[u32b(1), opq(b"server.example")]);
    let netloc_addr = cat(&[u32b(3), netaddr()]);
    vec![
        case(op::ACCESS, u32b(0x3f), w(&[0x3f, 0x1f])),
        case(op::CLOSE, cat(&[u32b(2), sid.clone()]), sid.clone()),
        case(op::COMMIT, cat(&[u64b(0), u32b(0)]), vec![0x44; 8]),
        case(
            op::CREATE,
            cat(&[u32b(2), opq(b"dir"), fattr()]),
            cat(&[change_info(), bitmap(&[1 << 4])]),
        ),
        case(
            op::CREATE,
            cat(&[u32b(3), w(&[8, 1]), opq(b"blockdev"), fattr()]),
            cat(&[change_info(), bitmap(&[])]),
        ),
        // A symbolic link: its link data is eligible too, and is declined here.
        case(
            op::CREATE,
            cat(&[u32b(5), opq(b"../target"), opq(b"link"), fattr()]),
            cat(&[change_info(), bitmap(&[])]),
        ),
        case(op::DELEGPURGE, u64b(7), vec![]),
        case(op::DELEGRETURN, sid.clone(), vec![]),
        case(op::GETATTR, bitmap(&[1 << 4, 0]), fattr()),
        case(op::GETFH, vec![], fh()),
        case(op::LINK, opq(b"newname"), change_info()),
        case(
            op::LOCK,
            cat(&[
                w(&[2, 0]),
                u64b(0),
                u64b(100),
                u32b(1),
                u32b(4),
                sid.clone(),
                u32b(0),
                lock_owner(),
            ]),
            sid.clone(),
        ),
        case(
            op::LOCK,
            cat(&[w(&[1, 0]), u64b(0), u64b(100), u32b(0), sid.clone(), u32b(3)]),
            sid.clone(),
        ),
        case(
            op::LOCKT,
            cat(&[u32b(1), u64b(0), u64b(100), lock_owner()]),
            vec![],
        ),
        case(
            op::LOCKU,
            cat(&[w(&[1, 2]), sid.clone(), u64b(0), u64b(100)]),
            sid.clone(),
        ),
        case(op::LOOKUP, opq(b"name"), vec![]),
        case(op::LOOKUPP, vec![], vec![]),
        case(op::NVERIFY, fattr(), vec![]),
        // OPEN: no create, claim null; read delegation.
        case(
            op::OPEN,
            cat(&[open_head.clone(), u32b(0), u32b(0), opq(b"file")]),
            open_res(cat(&[u32b(1), sid.clone(), u32b(0), ace()])),
        ),
        // Create unchecked, claim previous; write delegation limited by size.
        case(
            op::OPEN,
            cat(&[open_head.clone(), w(&[1, 0]), fattr(), w(&[1, 1])]),
            open_res(cat(&[u32b(2), sid.clone(), u32b(0), u32b(1), u64b(1 << 20), ace()])),
        ),
        // Exclusive create, claim delegate cur; write delegation limited by blocks.
        case(
            op::OPEN,
            cat(&[
                open_head.clone(),
                w(&[1, 2]),
                vec![0x33; 8],
                u32b(2),
                sid.clone(),
                opq(b"f"),
            ]),
            open_res(cat(&[u32b(2), sid.clone(), u32b(1), w(&[2, 16, 512]), ace()])),
        ),
        // Exclusive 4.1 create, claim delegate prev; no delegation: contention.
        case(
            op::OPEN,
            cat(&[
                open_head.clone(),
                w(&[1, 3]),
                vec![0x33; 8],
                fattr(),
                u32b(3),
                opq(b"g"),
            ]),
            open_res(w(&[3, 1, 0])),
        )
        .ws_reply(WS_NONE_EXT),
        // Claim by file handle; no delegation, not wanted.
        case(
            op::OPEN,
            cat(&[open_head.clone(), u32b(0), u32b(4)]),
            open_res(w(&[3, 0])),
        ),
        // Claim delegation by file handle; no delegation at all.
        case(
            op::OPEN,
            cat(&[open_head.clone(), u32b(0), u32b(5), sid.clone()]),
            open_res(w(&[0])),
        )
        .ws_call("RFC 8881 §18.16.1: CLAIM_DELEG_CUR_FH carries a stateid4, which Wireshark 4.0 does not read"),
        case(
            op::OPEN,
            cat(&[open_head, u32b(0), u32b(6)]),
            open_res(w(&[3, 2, 1])),
        )
        .ws_reply(WS_NONE_EXT),
        case(op::OPENATTR, u32b(1), vec![]),
        case(op::OPEN_CONFIRM, cat(&[sid.clone(), u32b(3)]), sid.clone()),
        case(
            op::OPEN_DOWNGRADE,
            cat(&[sid.clone(), w(&[3, 1, 0])]),
            sid.clone(),
        ),
        case(op::PUTFH, fh(), vec![]),
        case(op::PUTPUBFH, vec![], vec![]),
        case(op::PUTROOTFH, vec![], vec![]),
        case(
            op::READDIR,
            cat(&[u64b(0), vec![0; 8], w(&[4096, 32768]), bitmap(&[1 << 4])]),
            cat(&[
                vec![0x66; 8],
                u32b(1),
                u64b(1),
                opq(b"a"),
                fattr(),
                u32b(1),
                u64b(2),
                opq(b"bb"),
                fattr(),
                u32b(0),
                u32b(1),
            ]),
        ),
        case(op::REMOVE, opq(b"gone"), change_info()),
        case(
            op::RENAME,
            cat(&[opq(b"old"), opq(b"new")]),
            cat(&[change_info(), change_info()]),
        ),
        case(op::RENEW, u64b(7), vec![]),
        case(op::RESTOREFH, vec![], vec![]),
        case(op::SAVEFH, vec![], vec![]),
        case(
            op::SECINFO,
            opq(b"name"),
            cat(&[
                u32b(3),
                u32b(1),
                u32b(6),
                opq(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x12, 0x01, 0x02, 0x02]),
                w(&[0, 1]),
                u32b(0),
            ]),
        ),
        case(op::SETATTR, cat(&[sid.clone(), fattr()]), bitmap(&[1 << 4])),
        case(
            op::SETCLIENTID,
            cat(&[vec![0x11; 8], opq(b"client-id"), u32b(0x4000_0000), netaddr(), u32b(1)]),
            cat(&[u64b(7), vec![0x22; 8]]),
        ),
        case(
            op::SETCLIENTID_CONFIRM,
            cat(&[u64b(7), vec![0x22; 8]]),
            vec![],
        ),
        case(op::VERIFY, fattr(), vec![]),
        case(op::WRITE, cat(&[sid.clone(), u64b(0), u32b(2), opq(b"earlier write")]), cat(&[w(&[13, 2]), vec![0x77; 8]])),
        case(op::RELEASE_LOCKOWNER, lock_owner(), vec![]),
        case(
            op::BACKCHANNEL_CTL,
            cat(&[u32b(0x4000_0000), u32b(3), none.clone(), authsys.clone(), gss.clone()]),
            vec![],
        ),
        case(
            op::BIND_CONN_TO_SESSION,
            cat(&[vec![0x5e; 16], w(&[3, 0])]),
            cat(&[vec![0x5e; 16], w(&[3, 0])]),
        ),
        case(
            op::EXCHANGE_ID,
            cat(&[vec![0x11; 8], opq(b"Linux NFSv4.1 host"), u32b(1), u32b(0), u32b(1), impl_id()]),
            cat(&[
                u64b(7),
                w(&[1, 0x10000]),
                u32b(0),
                u64b(0),
                opq(b"major"),
                opq(b"scope"),
                u32b(1),
                impl_id(),
            ]),
        ),
        case(
            op::EXCHANGE_ID,
            cat(&[
                vec![0x11; 8],
                opq(b"host"),
                u32b(1),
                u32b(1),
                bitmap(&[1 << 3]),
                bitmap(&[0]),
                u32b(0),
            ]),
            cat(&[
                u64b(7),
                w(&[1, 0x10000]),
                u32b(1),
                bitmap(&[1 << 3]),
                bitmap(&[]),
                u64b(0),
                opq(b"major"),
                opq(b""),
                u32b(0),
            ]),
        ),
        case(
            op::CREATE_SESSION,
            cat(&[
                u64b(7),
                w(&[1, 3]),
                channel_attrs(&[]),
                channel_attrs(&[4]),
                u32b(0x4000_0000),
                u32b(2),
                authsys.clone(),
                none.clone(),
            ]),
            cat(&[vec![0x5e; 16], w(&[1, 3]), channel_attrs(&[]), channel_attrs(&[])]),
        ),
        case(op::DESTROY_SESSION, vec![0x5e; 16], vec![]),
        case(op::FREE_STATEID, sid.clone(), vec![]),
        case(
            op::GET_DIR_DELEGATION,
            cat(&[u32b(0), bitmap(&[2]), nfstime(), nfstime(), bitmap(&[1 << 4]), bitmap(&[])]),
            cat(&[u32b(0), vec![0x66; 8], sid.clone(), bitmap(&[2]), bitmap(&[]), bitmap(&[])]),
        )
        .ws_neither(NOT_DISSECTED),
        case(
            op::GETDEVICEINFO,
            cat(&[vec![0xde; 16], w(&[1, 4096]), bitmap(&[])]),
            // A layout type Wireshark has no decoder for, so the body stays opaque.
            cat(&[u32b(0x8000_0001), opq(&[0xd0; 20]), bitmap(&[])]),
        ),
        case(
            op::GETDEVICELIST,
            cat(&[w(&[1, 16]), u64b(0), vec![0; 8]]),
            cat(&[u64b(1), vec![0x66; 8], u32b(2), vec![0xde; 32], u32b(1)]),
        ),
        case(
            op::LAYOUTCOMMIT,
            cat(&[
                u64b(0),
                u64b(4096),
                u32b(0),
                sid.clone(),
                u32b(1),
                u64b(4095),
                u32b(1),
                nfstime(),
                u32b(1),
                opq(b""),
            ]),
            cat(&[u32b(1), u64b(4096)]),
        ),
        case(
            op::LAYOUTGET,
            cat(&[w(&[0, 1, 1]), u64b(0), u64b(4096), u64b(4096), sid.clone(), u32b(4096)]),
            cat(&[
                u32b(0),
                sid.clone(),
                u32b(1),
                u64b(0),
                u64b(4096),
                w(&[1, 0x8000_0001]),
                opq(&[0xb0; 12]),
            ]),
        ),
        case(
            op::LAYOUTRETURN,
            cat(&[w(&[0, 1, 3]), u32b(1), u64b(0), u64b(4096), sid.clone(), opq(b"")]),
            cat(&[u32b(1), sid.clone()]),
        ),
        case(op::LAYOUTRETURN, w(&[0, 1, 3, 3]), u32b(0)),
        case(op::SECINFO_NO_NAME, u32b(0), cat(&[u32b(1), u32b(1)])),
        case(
            op::SEQUENCE,
            cat(&[vec![0x5e; 16], w(&[5, 0, 0, 1])]),
            cat(&[vec![0x5e; 16], w(&[5, 0, 63, 63, 0])]),
        ),
        case(
            op::SET_SSV,
            cat(&[opq(b"ssv"), opq(b"digest")]),
            opq(b"digest"),
        )
        .ws_neither(NOT_DISSECTED),
        case(
            op::TEST_STATEID,
            cat(&[u32b(2), sid.clone(), stateid(4)]),
            w(&[2, 0, 0]),
        ),
        case(
            op::WANT_DELEGATION,
            w(&[1, 4]),
            cat(&[u32b(1), sid.clone(), u32b(0), ace()]),
        )
        .ws_neither(NOT_DISSECTED),
        case(op::WANT_DELEGATION, w(&[1, 1, 1]), w(&[0])).ws_neither(NOT_DISSECTED),
        case(op::DESTROY_CLIENTID, u64b(7), vec![]),
        case(op::RECLAIM_COMPLETE, u32b(0), vec![]),
        case(op::ALLOCATE, cat(&[sid.clone(), u64b(0), u64b(4096)]), vec![]),
        case(
            op::COPY,
            cat(&[
                sid.clone(),
                stateid(4),
                u64b(0),
                u64b(0),
                u64b(4096),
                w(&[1, 1]),
                u32b(2),
                netloc_name.clone(),
                netloc_addr.clone(),
            ]),
            cat(&[write_response.clone(), w(&[1, 1])]),
        ),
        case(
            op::COPY_NOTIFY,
            cat(&[sid.clone(), netloc_addr]),
            cat(&[nfstime(), sid.clone(), u32b(1), netloc_name]),
        ),
        case(op::DEALLOCATE, cat(&[sid.clone(), u64b(0), u64b(4096)]), vec![]),
        case(
            op::IO_ADVISE,
            cat(&[sid.clone(), u64b(0), u64b(4096), bitmap(&[1 << 2])]),
            bitmap(&[1 << 2]),
        ),
        case(
            op::LAYOUTERROR,
            cat(&[u64b(0), u64b(4096), sid.clone(), u32b(1), vec![0xde; 16], w(&[5, 38])]),
            vec![],
        ),
        case(
            op::LAYOUTSTATS,
            cat(&[
                u64b(0),
                u64b(4096),
                sid.clone(),
                u64b(1),
                u64b(4096),
                u64b(2),
                u64b(8192),
                vec![0xde; 16],
                u32b(1),
                opq(&[0x10; 8]),
            ]),
            vec![],
        ),
        case(op::OFFLOAD_CANCEL, sid.clone(), vec![]),
        case(op::OFFLOAD_STATUS, sid.clone(), cat(&[u64b(4096), w(&[1, 0])])),
        case(
            op::READ_PLUS,
            cat(&[sid.clone(), u64b(0), u32b(8192)]),
            cat(&[
                u32b(1),
                u32b(2),
                u32b(0),
                u64b(0),
                opq(b"data"),
                u32b(1),
                u64b(4),
                u64b(4092),
            ]),
        ),
        case(op::SEEK, cat(&[sid.clone(), u64b(0), u32b(0)]), cat(&[u32b(0), u64b(0)])),
        case(
            op::WRITE_SAME,
            cat(&[
                sid.clone(),
                u32b(2),
                u64b(0),
                u64b(512),
                u64b(8),
                u64b(0),
                u32b(0),
                u64b(8),
                opq(b"pattern"),
            ]),
            write_response,
        )
        .ws_call(
            "RFC 7862 §15.12: app_data_block4 is offset4, three length4, a count4, a length4 and \
             the pattern; Wireshark 4.0 reads fewer words",
        ),
        case(
            op::CLONE,
            cat(&[sid.clone(), stateid(4), u64b(0), u64b(0), u64b(4096)]),
            vec![],
        ),
        case(op::GETXATTR, opq(b"user.key"), opq(b"value")),
        case(
            op::SETXATTR,
            cat(&[u32b(0), opq(b"user.key"), opq(b"value")]),
            change_info(),
        ),
        case(
            op::LISTXATTRS,
            cat(&[u64b(0), u32b(4096)]),
            cat(&[u64b(0), u32b(2), opq(b"user.a"), opq(b"user.bb"), u32b(1)]),
        ),
        case(op::REMOVEXATTR, opq(b"user.key"), change_info()),
        // A READ and a READLINK before the WRITE in a call: nothing eligible in their
        // arguments. Their results are eligible, so they stand only in calls.
        case(op::READ, cat(&[sid.clone(), u64b(0), u32b(4096)]), vec![]),
        case(op::READLINK, vec![], vec![]),
        case(op::ILLEGAL, vec![], vec![]),
    ]
}

/// The tag, minor version and operation count of a COMPOUND call.
fn compound_head(n: u32) -> Vec<u8> {
    cat(&[opq(b"tag"), u32b(2), u32b(n)])
}

const WRITE_OFFSET: u64 = 0x1122_3344_5566_7788;

/// `c`'s operation, then a WRITE of `data`, then GETATTR; and the position of the WRITE's data.
fn call_with_write(c: &Case, data: &[u8]) -> (Vec<u8>, Item) {
    let mut args = cat(&[compound_head(3), u32b(c.op), c.args.clone()]);
    args.extend(cat(&[
        u32b(op::WRITE),
        stateid(9),
        u64b(WRITE_OFFSET),
        u32b(2),
    ]));
    let position = args.len() as u32 + 4;
    args.extend(opq(data));
    args.extend(cat(&[u32b(op::GETATTR), bitmap(&[])]));
    let item = Item {
        position,
        length: data.len() as u32,
    };
    (args, item)
}

/// `c`'s operation, then a READ; the reply to it, and the position of the READ's data.
fn reply_with_read(c: &Case, data: &[u8]) -> (Vec<u8>, Vec<u8>, Item) {
    let args = cat(&[
        compound_head(2),
        u32b(c.op),
        c.args.clone(),
        u32b(op::READ),
        stateid(9),
        u64b(0),
        u32b(data.len() as u32),
    ]);
    let mut res = cat(&[
        u32b(0),
        opq(b"tag"),
        u32b(2),
        u32b(c.op),
        u32b(0),
        c.resok.clone(),
    ]);
    res.extend(cat(&[u32b(op::READ), u32b(0), u32b(1)]));
    let position = res.len() as u32 + 4;
    res.extend(opq(data));
    let item = Item {
        position,
        length: data.len() as u32,
    };
    (args, res, item)
}

/// Cases whose result may stand before a READ (READ and READLINK are eligible themselves).
fn before_read(c: &Case) -> bool {
    c.op != op::READ && c.op != op::READLINK
}

#[test]
fn every_operation_is_stepped_over_to_the_write_and_the_read() {
    for c in cases() {
        let (args, want) = call_with_write(&c, b"0123456789");
        let first = nfs4::argument(&args, |_| true).unwrap();
        let at = nfs4::argument(&args, |it| it.position == want.position);
        assert_eq!(at, Ok(Some(want)), "op {}", c.op);
        if c.op == op::WRITE || (c.op == op::CREATE && c.args.get(3) == Some(&5)) {
            // Its own item comes first.
            assert!(first.unwrap().position < want.position, "op {}", c.op);
        } else {
            assert_eq!(first, Some(want), "op {}", c.op);
        }
        if before_read(&c) {
            let (_, res, want) = reply_with_read(&c, b"file data");
            assert_eq!(nfs4::result(&res), Ok(Some(want)), "op {}", c.op);
        }
    }
}

#[test]
fn a_walk_cut_anywhere_fails_and_never_panics() {
    for c in cases() {
        let (args, want) = call_with_write(&c, b"abc");
        for cut in 0..want.position as usize {
            let at = nfs4::argument(&args[..cut], |it| it.position == want.position);
            assert!(at.is_err(), "op {} cut {cut}", c.op);
        }
        if before_read(&c) {
            let (_, res, want) = reply_with_read(&c, b"abc");
            for cut in 0..want.position as usize {
                assert!(nfs4::result(&res[..cut]).is_err(), "op {} cut {cut}", c.op);
            }
        }
    }
}

#[test]
fn an_unknown_operation_or_union_arm_ends_the_walk() {
    let args = cat(&[compound_head(2), u32b(76), u32b(op::WRITE)]);
    assert!(matches!(
        nfs4::argument(&args, |_| true),
        Err(Error::BadValue("nfs_opnum4", 76))
    ));
    // OPEN with an opentype of 2.
    let args = cat(&[
        compound_head(1),
        u32b(op::OPEN),
        w(&[5, 2, 0]),
        lock_owner(),
        u32b(2),
    ]);
    assert!(nfs4::argument(&args, |_| true).is_err());
    let res = cat(&[u32b(0), opq(b""), u32b(1), u32b(99), u32b(0)]);
    assert!(nfs4::result(&res).is_err());
}

#[test]
fn rfc8267_5_a_compound_whose_operation_failed_has_no_eligible_result() {
    // SEQUENCE succeeded, PUTFH failed (NFS4ERR_STALE): the results end there.
    let res = cat(&[
        u32b(70),
        opq(b""),
        u32b(2),
        u32b(op::SEQUENCE),
        u32b(0),
        vec![0x5e; 16],
        w(&[5, 0, 63, 63, 0]),
        u32b(op::PUTFH),
        u32b(70),
    ]);
    assert_eq!(nfs4::result(&res), Ok(None));
    // The READ itself failed.
    let res = cat(&[
        u32b(10_008),
        opq(b""),
        u32b(1),
        u32b(op::READ),
        u32b(10_008),
    ]);
    assert_eq!(nfs4::result(&res), Ok(None));
    // No READ at all.
    let res = cat(&[u32b(0), opq(b""), u32b(1), u32b(op::PUTROOTFH), u32b(0)]);
    assert_eq!(nfs4::result(&res), Ok(None));
}

#[test]
fn rfc8267_5_readlink_and_symlink_items() {
    let res = cat(&[
        u32b(0),
        opq(b""),
        u32b(2),
        u32b(op::PUTFH),
        u32b(0),
        u32b(op::READLINK),
        u32b(0),
        opq(b"../t"),
    ]);
    assert_eq!(
        nfs4::result(&res),
        Ok(Some(Item {
            position: 32,
            length: 4
        }))
    );
    let args = cat(&[
        compound_head(1),
        u32b(op::CREATE),
        u32b(5),
        opq(b"../target"),
        opq(b"l"),
        fattr(),
    ]);
    assert_eq!(
        nfs4::argument(&args, |_| true),
        Ok(Some(Item {
            position: 28,
            length: 9
        }))
    );
}

/// An RPC call header (AUTH_NONE) of NFSv4 COMPOUND.
fn rpc_call(xid: u32) -> Vec<u8> {
    w(&[xid, 0, 2, NFS_PROG, 4, 1, 0, 0, 0, 0])
}

#[test]
fn rfc8267_5_binding_one_read_chunk_one_write_chunk_and_results_not_last() {
    let b = ulb::binding(NFS_PROG, 4, nfs4::COMPOUND);
    assert!(b.arg_eligible && b.result_eligible);
    assert_eq!((b.max_read_chunks, b.max_write_chunks), (1, 1));
    assert_eq!(ulb::binding(NFS_PROG, 4, 0), Binding::NONE);
    assert!(!ulb::result_is_last(NFS_PROG, 4, nfs4::COMPOUND));
    assert!(ulb::result_is_last(NFS_PROG, 3, ulb::nfs3::READ));
}

/// R8166-6.1-b and IMPL-3.7-a in a COMPOUND: a Read chunk is accepted at the data of a WRITE
/// (the second one here, the first WRITE's data inline), the GETATTR after it is read from
/// the next word, and a chunk anywhere else is a violation.
#[test]
fn r8166_6_1_b_read_chunk_of_a_compound_only_at_a_write_s_data() {
    let data = vec![0xd7u8; 4097];
    let mut call = rpc_call(0x42);
    let mut args = cat(&[
        compound_head(4),
        u32b(op::PUTFH),
        fh(),
        u32b(op::WRITE),
        stateid(1),
        u64b(0),
        u32b(2),
        opq(b"inline"),
        u32b(op::WRITE),
        stateid(2),
        u64b(4096),
        u32b(2),
    ]);
    let position = (call.len() + args.len()) as u32 + 4;
    // Reduced: the length word stays, the data (and its pad) is in the chunk.
    args.extend(u32b(data.len() as u32));
    args.extend(cat(&[u32b(op::GETATTR), bitmap(&[1 << 4])]));
    call.extend(&args);
    let check = |pos: u32, len: u32| {
        let segs = [ReadSegment::new(pos, Segment::new(1, len, 0x1000))];
        ulb::check_read_chunks(&call, &ReadList::from_segments(&segs))
    };
    assert_eq!(check(position, 4097), Ok(()));
    assert_eq!(check(position, 4100), Ok(()), "with its pad");
    assert!(matches!(check(position, 4096), Err(Error::NotEligible(_))));
    // At the first WRITE's data (which is inline), at the GETATTR, at the PUTFH's handle.
    let first_write_data = position - 4 - (16 + 8 + 4 + 4) - 4 - 8;
    for bad in [first_write_data, position + 4, 40 + 12 + 8] {
        assert!(
            matches!(check(bad, 4097), Err(Error::NotEligible(_))),
            "position {bad}"
        );
    }
    // Answered with GARBAGE_ARGS (AMB-12).
    let e = check(position + 4, 4097).unwrap_err();
    assert_eq!(
        e.answer(1, Received::Call),
        rpcrdma_proto::Answer::GarbageArgs
    );
}

// ---- Wireshark as the judge of the layouts ----

#[test]
fn every_operation_layout_agrees_with_wireshark() {
    let data = b"0123456789abcdefghij-";
    let mut pcap = Pcap::new();
    // Frame numbers of each case's WRITE call, READ call and READ reply.
    let mut frames = Vec::new();
    for (k, c) in cases().iter().enumerate() {
        let xid = 0x100 + 2 * k as u32;
        let (args, _) = call_with_write(c, data);
        let fw = pcap.push(true, &cat(&[rpc_call(xid), args]));
        let fr = if before_read(c) {
            let (args, res, _) = reply_with_read(c, data);
            let call = pcap.push(true, &cat(&[rpc_call(xid + 1), args]));
            let reply = w(&[xid + 1, 1, 0, 0, 0, 0]);
            Some((call, pcap.push(false, &cat(&[reply, res]))))
        } else {
            None
        };
        frames.push((c.op, fw, fr, c.ws_call.is_none(), c.ws_reply.is_none()));
    }
    let file = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nfs4-layouts.pcap");
    std::fs::write(&file, &pcap.bytes).unwrap();
    let rows = tshark(
        &file,
        &[
            "frame.number",
            "nfs.opcode",
            "nfs.offset4",
            "nfs.write.data_length",
            "nfs.read.data_length",
            "_ws.malformed",
            "_ws.expert.severity",
        ],
    );
    let row = |f: u32| {
        rows.iter()
            .find(|r| r.first().map(String::as_str) == Some(&f.to_string()))
            .unwrap_or_else(|| panic!("tshark printed no frame {f}"))
            .clone()
    };
    let len = data.len().to_string();
    let mut wrong = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            wrong.push(what);
        }
    };
    for (opnum, fw, fr, judge_call, judge_reply) in frames {
        // Wireshark also names the operations of a bitmap of operations (EXCHANGE_ID's
        // state protection) with `nfs.opcode`: only the first and the last are compared.
        let r = row(fw);
        let ops = format!(",{},{}", op::WRITE, op::GETATTR);
        if judge_call {
            check(
                r[1].starts_with(&format!("{opnum},")) && r[1].ends_with(&ops),
                format!("frame {fw}: call with op {opnum} decoded as ops {}", r[1]),
            );
            check(
                r[2].split(',').any(|v| v == WRITE_OFFSET.to_string()),
                format!("frame {fw}: call with op {opnum}: WRITE offsets {}", r[2]),
            );
            check(
                r[3].rsplit(',').next() == Some(len.as_str()),
                format!("frame {fw}: call with op {opnum}: WRITE lengths {}", r[3]),
            );
            check(
                r[5].is_empty(),
                format!("frame {fw}: call with op {opnum} malformed"),
            );
        }
        if let Some((call, reply)) = fr.filter(|_| judge_reply) {
            check(
                row(call)[5].is_empty(),
                format!("frame {call}: op {opnum} malformed"),
            );
            let r = row(reply);
            check(
                r[1].starts_with(&format!("{opnum},")) && r[1].ends_with(&format!(",{}", op::READ)),
                format!(
                    "frame {reply}: reply with op {opnum} decoded as ops {}",
                    r[1]
                ),
            );
            check(
                r[4].rsplit(',').next() == Some(len.as_str()),
                format!(
                    "frame {reply}: reply with op {opnum}: READ lengths {}",
                    r[4]
                ),
            );
            check(
                r[5].is_empty(),
                format!("frame {reply}: reply with op {opnum} malformed"),
            );
        }
    }
    assert!(
        wrong.is_empty(),
        "Wireshark disagrees:\n{}",
        wrong.join("\n")
    );
}
