//! NFS version 4 COMPOUND, as far as the Upper-Layer Binding needs it (RFC 8267 §5; restated in
//! draft-ietf-nfsv4-nfs-ulb-v2-07 §5.1): where the DDP-eligible items of a COMPOUND sit.
//!
//! Eligible are `WRITE4args.data` and the `linkdata` of CREATE's `NF4LNK` arm (arguments),
//! `READ4resok.data` and `READLINK4resok.link` (results). Finding one means stepping over every
//! operation before it, so this module knows the argument layout of every operation of minor
//! versions 0, 1 and 2 (RFC 7530, RFC 8881, RFC 7862) and of the extended attribute operations
//! (RFC 8276), and the result layout of every successful operation. An operation number it does
//! not know ends the walk with an error: nothing after it can be located.
//!
//! No XDR value is built: the walk reads lengths and discriminants and skips the rest, so it
//! never allocates, and every count it reads is bounded by the bytes left (each element it
//! steps over takes at least one word).

use crate::ulb::Item;
use crate::xdr::{opaque_len, Reader};
use crate::Error;

/// The NFS program's version number for all NFSv4 minor versions.
pub const VERSION: u32 = 4;
/// The COMPOUND procedure (the only other is NULL).
pub const COMPOUND: u32 = 1;

/// Operation numbers (`nfs_opnum4`).
#[allow(missing_docs)]
pub mod op {
    pub const ACCESS: u32 = 3;
    pub const CLOSE: u32 = 4;
    pub const COMMIT: u32 = 5;
    pub const CREATE: u32 = 6;
    pub const DELEGPURGE: u32 = 7;
    pub const DELEGRETURN: u32 = 8;
    pub const GETATTR: u32 = 9;
    pub const GETFH: u32 = 10;
    pub const LINK: u32 = 11;
    pub const LOCK: u32 = 12;
    pub const LOCKT: u32 = 13;
    pub const LOCKU: u32 = 14;
    pub const LOOKUP: u32 = 15;
    pub const LOOKUPP: u32 = 16;
    pub const NVERIFY: u32 = 17;
    pub const OPEN: u32 = 18;
    pub const OPENATTR: u32 = 19;
    pub const OPEN_CONFIRM: u32 = 20;
    pub const OPEN_DOWNGRADE: u32 = 21;
    pub const PUTFH: u32 = 22;
    pub const PUTPUBFH: u32 = 23;
    pub const PUTROOTFH: u32 = 24;
    pub const READ: u32 = 25;
    pub const READDIR: u32 = 26;
    pub const READLINK: u32 = 27;
    pub const REMOVE: u32 = 28;
    pub const RENAME: u32 = 29;
    pub const RENEW: u32 = 30;
    pub const RESTOREFH: u32 = 31;
    pub const SAVEFH: u32 = 32;
    pub const SECINFO: u32 = 33;
    pub const SETATTR: u32 = 34;
    pub const SETCLIENTID: u32 = 35;
    pub const SETCLIENTID_CONFIRM: u32 = 36;
    pub const VERIFY: u32 = 37;
    pub const WRITE: u32 = 38;
    pub const RELEASE_LOCKOWNER: u32 = 39;
    pub const BACKCHANNEL_CTL: u32 = 40;
    pub const BIND_CONN_TO_SESSION: u32 = 41;
    pub const EXCHANGE_ID: u32 = 42;
    pub const CREATE_SESSION: u32 = 43;
    pub const DESTROY_SESSION: u32 = 44;
    pub const FREE_STATEID: u32 = 45;
    pub const GET_DIR_DELEGATION: u32 = 46;
    pub const GETDEVICEINFO: u32 = 47;
    pub const GETDEVICELIST: u32 = 48;
    pub const LAYOUTCOMMIT: u32 = 49;
    pub const LAYOUTGET: u32 = 50;
    pub const LAYOUTRETURN: u32 = 51;
    pub const SECINFO_NO_NAME: u32 = 52;
    pub const SEQUENCE: u32 = 53;
    pub const SET_SSV: u32 = 54;
    pub const TEST_STATEID: u32 = 55;
    pub const WANT_DELEGATION: u32 = 56;
    pub const DESTROY_CLIENTID: u32 = 57;
    pub const RECLAIM_COMPLETE: u32 = 58;
    pub const ALLOCATE: u32 = 59;
    pub const COPY: u32 = 60;
    pub const COPY_NOTIFY: u32 = 61;
    pub const DEALLOCATE: u32 = 62;
    pub const IO_ADVISE: u32 = 63;
    pub const LAYOUTERROR: u32 = 64;
    pub const LAYOUTSTATS: u32 = 65;
    pub const OFFLOAD_CANCEL: u32 = 66;
    pub const OFFLOAD_STATUS: u32 = 67;
    pub const READ_PLUS: u32 = 68;
    pub const SEEK: u32 = 69;
    pub const WRITE_SAME: u32 = 70;
    pub const CLONE: u32 = 71;
    pub const GETXATTR: u32 = 72;
    pub const SETXATTR: u32 = 73;
    pub const LISTXATTRS: u32 = 74;
    pub const REMOVEXATTR: u32 = 75;
    pub const ILLEGAL: u32 = 10044;
}

/// `NF4LNK`, the `createtype4` arm that carries `linkdata`.
const NF4LNK: u32 = 5;
/// `NFS4_OK`.
const OK: u32 = 0;

// Fixed sizes of the types the walk steps over.
const STATEID: usize = 16;
const SESSIONID: usize = 16;
const DEVICEID: usize = 16;
const VERIFIER: usize = 8;
const NFSTIME: usize = 12;
/// `change_info4`: a bool and two `changeid4`.
const CHANGE_INFO: usize = 4 + 8 + 8;
/// `channel_attrs4` without its `ca_rdma_ird<1>`: six words.
const CHANNEL_FIXED: usize = 24;

type Walk = Result<(), Error>;

fn fixed(r: &mut Reader<'_>, n: usize) -> Walk {
    r.take(n, "NFSv4 operation").map(|_| ())
}

/// Any `opaque<>` or string: its length word, data and pad.
fn opaque(r: &mut Reader<'_>) -> Walk {
    let len = r.u32("NFSv4 opaque")? as usize;
    fixed(r, opaque_len(len) - 4)
}

/// A counted array whose elements `each` steps over (each takes at least a word, so the count
/// is bounded by the bytes left).
fn array(r: &mut Reader<'_>, mut each: impl FnMut(&mut Reader<'_>) -> Walk) -> Walk {
    let n = r.u32("NFSv4 array count")?;
    for _ in 0..n {
        each(r)?;
    }
    Ok(())
}

/// An array of fixed-size elements of `size` bytes.
fn array_of(r: &mut Reader<'_>, size: usize) -> Walk {
    let n = r.u32("NFSv4 array count")? as usize;
    fixed(
        r,
        n.checked_mul(size).ok_or(Error::Truncated("NFSv4 array"))?,
    )
}

fn bitmap(r: &mut Reader<'_>) -> Walk {
    array_of(r, 4)
}

/// `fattr4`: a bitmap and the attribute values as one opaque.
fn fattr(r: &mut Reader<'_>) -> Walk {
    bitmap(r)?;
    opaque(r)
}

/// An optional value (`bool` then the value when true), as in `newoffset4` or `entry4 *`.
fn optional(r: &mut Reader<'_>, value: impl FnOnce(&mut Reader<'_>) -> Walk) -> Walk {
    if r.bool("NFSv4 optional")? {
        value(r)?;
    }
    Ok(())
}

/// A union arm the walk does not know: the discriminant is bad.
fn bad_arm(what: &'static str, v: u32) -> Walk {
    Err(Error::BadValue(what, v))
}

/// `lock_owner4`, `open_owner4`, `client_owner4`, `nfs_client_id4`: a fixed part and an opaque.
fn owner(r: &mut Reader<'_>, fixed_part: usize) -> Walk {
    fixed(r, fixed_part)?;
    opaque(r)
}

/// `netaddr4`: two strings.
fn netaddr(r: &mut Reader<'_>) -> Walk {
    opaque(r)?;
    opaque(r)
}

/// `netloc4`.
fn netloc(r: &mut Reader<'_>) -> Walk {
    match r.u32("netloc_type4")? {
        1 | 2 => opaque(r),
        3 => netaddr(r),
        v => bad_arm("netloc_type4", v),
    }
}

/// `callback_sec_parms4`.
fn cb_sec_parms(r: &mut Reader<'_>) -> Walk {
    match r.u32("callback_sec_parms4 flavor")? {
        0 => Ok(()),
        // authsys_parms: stamp, machinename, uid, gid, gids<16>.
        1 => {
            fixed(r, 4)?;
            opaque(r)?;
            fixed(r, 8)?;
            array_of(r, 4)
        }
        // gss_cb_handles4: service and two handles.
        6 => {
            fixed(r, 4)?;
            opaque(r)?;
            opaque(r)
        }
        v => bad_arm("callback_sec_parms4 flavor", v),
    }
}

/// `state_protect_ops4`: two bitmaps.
fn protect_ops(r: &mut Reader<'_>) -> Walk {
    bitmap(r)?;
    bitmap(r)
}

/// `nfs_impl_id4`: domain, name, date.
fn impl_id(r: &mut Reader<'_>) -> Walk {
    opaque(r)?;
    opaque(r)?;
    fixed(r, NFSTIME)
}

/// `channel_attrs4`.
fn channel_attrs(r: &mut Reader<'_>) -> Walk {
    fixed(r, CHANNEL_FIXED)?;
    array_of(r, 4)
}

/// `layoutupdate4`, `device_addr4`, `layout_content4`: a type and an opaque body.
fn typed_body(r: &mut Reader<'_>) -> Walk {
    fixed(r, 4)?;
    opaque(r)
}

/// `nfsace4`: type, flag, mask, who.
fn ace(r: &mut Reader<'_>) -> Walk {
    fixed(r, 12)?;
    opaque(r)
}

/// `open_delegation4`.
fn delegation(r: &mut Reader<'_>) -> Walk {
    match r.u32("open_delegation_type4")? {
        0 => Ok(()),
        // Read: stateid, recall, permissions (4: the same with attribute delegation,
        // RFC 9754).
        1 | 4 => {
            fixed(r, STATEID + 4)?;
            ace(r)
        }
        // Write: stateid, recall, space limit, permissions (5: with attribute delegation).
        2 | 5 => {
            fixed(r, STATEID + 4)?;
            match r.u32("limit_by4")? {
                1 => fixed(r, 8)?,
                2 => fixed(r, 8)?,
                v => return bad_arm("limit_by4", v),
            }
            ace(r)
        }
        // None, with a reason: contention and resource carry a bool.
        3 => match r.u32("why_no_delegation4")? {
            // WND4_CONTENTION and WND4_RESOURCE carry a bool; every other reason is void.
            1 | 2 => fixed(r, 4),
            _ => Ok(()),
        },
        v => bad_arm("open_delegation_type4", v),
    }
}

/// `secinfo4<>`.
fn secinfo(r: &mut Reader<'_>) -> Walk {
    array(r, |r| match r.u32("secinfo4 flavor")? {
        // rpcsec_gss_info: oid, qop, service.
        6 => {
            opaque(r)?;
            fixed(r, 8)
        }
        _ => Ok(()),
    })
}

/// `write_response4`: callback id<1>, count, committed, verifier.
fn write_response(r: &mut Reader<'_>) -> Walk {
    array_of(r, STATEID)?;
    fixed(r, 8 + 4 + VERIFIER)
}

/// Steps over the arguments of operation `opnum` (anything but WRITE and CREATE, whose
/// eligible items the caller handles).
fn skip_args(r: &mut Reader<'_>, opnum: u32) -> Walk {
    match opnum {
        op::GETFH
        | op::LOOKUPP
        | op::PUTPUBFH
        | op::PUTROOTFH
        | op::READLINK
        | op::RESTOREFH
        | op::SAVEFH
        | op::ILLEGAL => Ok(()),
        op::ACCESS | op::OPENATTR | op::SECINFO_NO_NAME | op::RECLAIM_COMPLETE => fixed(r, 4),
        op::DELEGPURGE | op::RENEW | op::DESTROY_CLIENTID => fixed(r, 8),
        op::COMMIT => fixed(r, 8 + 4),
        op::DELEGRETURN
        | op::FREE_STATEID
        | op::DESTROY_SESSION
        | op::OFFLOAD_CANCEL
        | op::OFFLOAD_STATUS => fixed(r, STATEID),
        op::CLOSE | op::OPEN_CONFIRM => fixed(r, 4 + STATEID),
        op::OPEN_DOWNGRADE => fixed(r, STATEID + 12),
        op::GETATTR => bitmap(r),
        op::NVERIFY | op::VERIFY => fattr(r),
        op::LINK
        | op::LOOKUP
        | op::PUTFH
        | op::REMOVE
        | op::SECINFO
        | op::GETXATTR
        | op::REMOVEXATTR => opaque(r),
        op::RENAME => {
            opaque(r)?;
            opaque(r)
        }
        // locktype, reclaim, offset, length, then locker4.
        op::LOCK => {
            fixed(r, 4 + 4 + 8 + 8)?;
            if r.bool("locker4 new_lock_owner")? {
                // open_to_lock_owner4: open seqid, open stateid, lock seqid, lock owner.
                fixed(r, 4 + STATEID + 4)?;
                owner(r, 8)
            } else {
                fixed(r, STATEID + 4)
            }
        }
        op::LOCKT => {
            fixed(r, 4 + 8 + 8)?;
            owner(r, 8)
        }
        op::LOCKU => fixed(r, 4 + 4 + STATEID + 8 + 8),
        op::RELEASE_LOCKOWNER => owner(r, 8),
        op::OPEN => {
            // seqid, share access, share deny, owner.
            owner(r, 12 + 8)?;
            match r.u32("opentype4")? {
                0 => {}
                1 => match r.u32("createmode4")? {
                    0 | 1 => fattr(r)?,
                    2 => fixed(r, VERIFIER)?,
                    3 => {
                        fixed(r, VERIFIER)?;
                        fattr(r)?
                    }
                    v => return bad_arm("createmode4", v),
                },
                v => return bad_arm("opentype4", v),
            }
            match r.u32("open_claim_type4")? {
                0 | 3 => opaque(r),
                1 => fixed(r, 4),
                2 => {
                    fixed(r, STATEID)?;
                    opaque(r)
                }
                4 | 6 => Ok(()),
                5 => fixed(r, STATEID),
                v => bad_arm("open_claim_type4", v),
            }
        }
        op::READ | op::READ_PLUS | op::SEEK => fixed(r, STATEID + 8 + 4),
        op::READDIR => {
            fixed(r, 8 + VERIFIER + 4 + 4)?;
            bitmap(r)
        }
        op::SETATTR => {
            fixed(r, STATEID)?;
            fattr(r)
        }
        op::SETCLIENTID => {
            owner(r, VERIFIER)?;
            fixed(r, 4)?;
            netaddr(r)?;
            fixed(r, 4)
        }
        op::SETCLIENTID_CONFIRM => fixed(r, 8 + VERIFIER),
        op::BACKCHANNEL_CTL => {
            fixed(r, 4)?;
            array(r, cb_sec_parms)
        }
        op::BIND_CONN_TO_SESSION => fixed(r, SESSIONID + 4 + 4),
        op::EXCHANGE_ID => {
            owner(r, VERIFIER)?;
            fixed(r, 4)?;
            match r.u32("state_protect_how4")? {
                0 => {}
                1 => protect_ops(r)?,
                2 => {
                    protect_ops(r)?;
                    array(r, opaque)?;
                    array(r, opaque)?;
                    fixed(r, 8)?
                }
                v => return bad_arm("state_protect_how4", v),
            }
            array(r, impl_id)
        }
        op::CREATE_SESSION => {
            fixed(r, 8 + 4 + 4)?;
            channel_attrs(r)?;
            channel_attrs(r)?;
            fixed(r, 4)?;
            array(r, cb_sec_parms)
        }
        op::GET_DIR_DELEGATION => {
            fixed(r, 4)?;
            bitmap(r)?;
            fixed(r, 2 * NFSTIME)?;
            bitmap(r)?;
            bitmap(r)
        }
        op::GETDEVICEINFO => {
            fixed(r, DEVICEID + 4 + 4)?;
            bitmap(r)
        }
        op::GETDEVICELIST => fixed(r, 4 + 4 + 8 + VERIFIER),
        op::LAYOUTCOMMIT => {
            fixed(r, 8 + 8 + 4 + STATEID)?;
            optional(r, |r| fixed(r, 8))?;
            optional(r, |r| fixed(r, NFSTIME))?;
            typed_body(r)
        }
        op::LAYOUTGET => fixed(r, 4 + 4 + 4 + 8 + 8 + 8 + STATEID + 4),
        op::LAYOUTRETURN => {
            fixed(r, 4 + 4 + 4)?;
            match r.u32("layoutreturn_type4")? {
                1 => {
                    fixed(r, 8 + 8 + STATEID)?;
                    opaque(r)
                }
                _ => Ok(()),
            }
        }
        op::SEQUENCE => fixed(r, SESSIONID + 4 + 4 + 4 + 4),
        op::SET_SSV => {
            opaque(r)?;
            opaque(r)
        }
        op::TEST_STATEID => array_of(r, STATEID),
        op::WANT_DELEGATION => {
            fixed(r, 4)?;
            match r.u32("deleg_claim4")? {
                4 | 6 => Ok(()),
                1 => fixed(r, 4),
                v => bad_arm("deleg_claim4", v),
            }
        }
        op::ALLOCATE | op::DEALLOCATE => fixed(r, STATEID + 8 + 8),
        op::COPY => {
            fixed(r, 2 * STATEID + 8 + 8 + 8 + 4 + 4)?;
            array(r, netloc)
        }
        op::COPY_NOTIFY => {
            fixed(r, STATEID)?;
            netloc(r)
        }
        op::IO_ADVISE => {
            fixed(r, STATEID + 8 + 8)?;
            bitmap(r)
        }
        op::LAYOUTERROR => {
            fixed(r, 8 + 8 + STATEID)?;
            array_of(r, DEVICEID + 4 + 4)
        }
        // offset, length, stateid, read and write io_info4, deviceid, layoutupdate4.
        op::LAYOUTSTATS => {
            fixed(r, 8 + 8 + STATEID + 16 + 16 + DEVICEID)?;
            typed_body(r)
        }
        // stateid, stable, then app_data_block4: offset, block size, block count, reloff of
        // the block number, block number, reloff of the pattern, pattern.
        op::WRITE_SAME => {
            fixed(r, STATEID + 4 + 8 + 8 + 8 + 8 + 4 + 8)?;
            opaque(r)
        }
        op::CLONE => fixed(r, 2 * STATEID + 8 + 8 + 8),
        op::SETXATTR => {
            fixed(r, 4)?;
            opaque(r)?;
            opaque(r)
        }
        op::LISTXATTRS => fixed(r, 8 + 4),
        v => bad_arm("nfs_opnum4", v),
    }
}

/// Steps over the successful result (`NFS4_OK`) of operation `opnum` (anything but READ and
/// READLINK, whose eligible items the caller handles).
fn skip_resok(r: &mut Reader<'_>, opnum: u32) -> Walk {
    match opnum {
        op::DELEGPURGE
        | op::DELEGRETURN
        | op::LOCKT
        | op::LOOKUP
        | op::LOOKUPP
        | op::NVERIFY
        | op::OPENATTR
        | op::PUTFH
        | op::PUTPUBFH
        | op::PUTROOTFH
        | op::RENEW
        | op::RESTOREFH
        | op::SAVEFH
        | op::SETCLIENTID_CONFIRM
        | op::VERIFY
        | op::RELEASE_LOCKOWNER
        | op::BACKCHANNEL_CTL
        | op::DESTROY_SESSION
        | op::FREE_STATEID
        | op::DESTROY_CLIENTID
        | op::RECLAIM_COMPLETE
        | op::ALLOCATE
        | op::DEALLOCATE
        | op::LAYOUTERROR
        | op::LAYOUTSTATS
        | op::OFFLOAD_CANCEL
        | op::CLONE
        | op::ILLEGAL => Ok(()),
        op::ACCESS => fixed(r, 8),
        op::CLOSE | op::LOCK | op::LOCKU | op::OPEN_CONFIRM | op::OPEN_DOWNGRADE => {
            fixed(r, STATEID)
        }
        op::COMMIT => fixed(r, VERIFIER),
        op::CREATE => {
            fixed(r, CHANGE_INFO)?;
            bitmap(r)
        }
        op::GETATTR => fattr(r),
        // SETATTR4res is not a union: the bitmap follows every status.
        op::SETATTR => bitmap(r),
        op::GETFH => opaque(r),
        op::LINK | op::REMOVE | op::SETXATTR | op::REMOVEXATTR => fixed(r, CHANGE_INFO),
        op::RENAME => fixed(r, 2 * CHANGE_INFO),
        op::OPEN => {
            fixed(r, STATEID + CHANGE_INFO + 4)?;
            bitmap(r)?;
            delegation(r)
        }
        op::READDIR => {
            fixed(r, VERIFIER)?;
            // entry4 *entries: cookie, name, attributes, each behind a "there is one" bool.
            while r.bool("entry4 follows")? {
                fixed(r, 8)?;
                opaque(r)?;
                fattr(r)?;
            }
            fixed(r, 4)
        }
        op::SECINFO | op::SECINFO_NO_NAME => secinfo(r),
        op::SETCLIENTID => fixed(r, 8 + VERIFIER),
        op::WRITE => fixed(r, 4 + 4 + VERIFIER),
        op::BIND_CONN_TO_SESSION => fixed(r, SESSIONID + 4 + 4),
        op::EXCHANGE_ID => {
            fixed(r, 8 + 4 + 4)?;
            match r.u32("state_protect_how4")? {
                0 => {}
                1 => protect_ops(r)?,
                // ssv_prot_info4: ops, hash alg, encr alg, ssv len, window, handles.
                2 => {
                    protect_ops(r)?;
                    fixed(r, 16)?;
                    array(r, opaque)?
                }
                v => return bad_arm("state_protect_how4", v),
            }
            // server_owner4 (minor id, major id), server scope, server impl id<1>.
            owner(r, 8)?;
            opaque(r)?;
            array(r, impl_id)
        }
        op::CREATE_SESSION => {
            fixed(r, SESSIONID + 4 + 4)?;
            channel_attrs(r)?;
            channel_attrs(r)
        }
        op::GET_DIR_DELEGATION => match r.u32("gddrnf4_status")? {
            0 => {
                fixed(r, VERIFIER + STATEID)?;
                bitmap(r)?;
                bitmap(r)?;
                bitmap(r)
            }
            1 => fixed(r, 4),
            v => bad_arm("gddrnf4_status", v),
        },
        op::GETDEVICEINFO => {
            typed_body(r)?;
            bitmap(r)
        }
        op::GETDEVICELIST => {
            fixed(r, 8 + VERIFIER)?;
            array_of(r, DEVICEID)?;
            fixed(r, 4)
        }
        op::LAYOUTCOMMIT => optional(r, |r| fixed(r, 8)),
        op::LAYOUTGET => {
            fixed(r, 4 + STATEID)?;
            // layout4: offset, length, iomode, layout_content4.
            array(r, |r| {
                fixed(r, 8 + 8 + 4)?;
                typed_body(r)
            })
        }
        op::LAYOUTRETURN => optional(r, |r| fixed(r, STATEID)),
        op::SEQUENCE => fixed(r, SESSIONID + 5 * 4),
        op::SET_SSV => opaque(r),
        op::TEST_STATEID => array_of(r, 4),
        op::WANT_DELEGATION => delegation(r),
        // write_response4, then copy_requirements4 (two bools).
        op::COPY => {
            write_response(r)?;
            fixed(r, 8)
        }
        op::COPY_NOTIFY => {
            fixed(r, NFSTIME + STATEID)?;
            array(r, netloc)
        }
        op::IO_ADVISE => bitmap(r),
        // count, then complete<1> (status words).
        op::OFFLOAD_STATUS => {
            fixed(r, 8)?;
            array_of(r, 4)
        }
        op::READ_PLUS => {
            fixed(r, 4)?;
            array(r, |r| match r.u32("data_content4")? {
                0 => {
                    fixed(r, 8)?;
                    opaque(r)
                }
                1 => fixed(r, 16),
                _ => Ok(()),
            })
        }
        op::SEEK => fixed(r, 4 + 8),
        op::WRITE_SAME => write_response(r),
        op::GETXATTR => opaque(r),
        // cookie, names, eof.
        op::LISTXATTRS => {
            fixed(r, 8)?;
            array(r, opaque)?;
            fixed(r, 4)
        }
        v => bad_arm("nfs_opnum4", v),
    }
}

/// The eligible item whose length word is next: its length, and where its data starts.
fn item_here(r: &mut Reader<'_>, what: &'static str) -> Result<Item, Error> {
    let length = r.u32(what)?;
    let position = u32::try_from(r.position()).map_err(|_| Error::Unencodable(what))?;
    Ok(Item { position, length })
}

/// Steps over a COMPOUND's tag, minor version and operation count; the count is returned.
fn compound_head(r: &mut Reader<'_>, minorversion: bool) -> Result<u32, Error> {
    opaque(r)?;
    if minorversion {
        fixed(r, 4)?;
    }
    r.u32("COMPOUND operation count")
}

/// Walks `COMPOUND4args` (`args`: the call's argument XDR, which may be reduced) to the
/// eligible argument `pick` accepts: it is shown each eligible item in order (a WRITE's data,
/// a CREATE's link data) and answers whether that is the one wanted. An item it declines is
/// taken to be inline, so the walk steps over its data and goes on. `Ok(None)`: no item was
/// accepted. Positions count from the start of `args`.
pub fn argument(args: &[u8], mut pick: impl FnMut(Item) -> bool) -> Result<Option<Item>, Error> {
    let mut r = Reader::new(args);
    let n = compound_head(&mut r, true)?;
    for _ in 0..n {
        let opnum = r.u32("nfs_opnum4")?;
        let item = match opnum {
            // stateid, offset, stable, then the data.
            op::WRITE => {
                fixed(&mut r, STATEID + 8 + 4)?;
                Some(item_here(&mut r, "WRITE4args data")?)
            }
            op::CREATE => match r.u32("createtype4")? {
                NF4LNK => Some(item_here(&mut r, "CREATE4args linkdata")?),
                // NF4BLK, NF4CHR: specdata4.
                3 | 4 => {
                    fixed(&mut r, 8)?;
                    None
                }
                _ => None,
            },
            _ => {
                skip_args(&mut r, opnum)?;
                None
            }
        };
        if let Some(item) = item {
            if pick(item) {
                return Ok(Some(item));
            }
            fixed(&mut r, opaque_len(item.length as usize) - 4)?;
        }
        if opnum == op::CREATE {
            // objname, createattrs.
            opaque(&mut r)?;
            fattr(&mut r)?;
        }
    }
    Ok(None)
}

/// Walks `COMPOUND4res` (`results`: the reply's result XDR, which may be reduced) to the
/// eligible result of its first "READ operation" (READ or READLINK, draft-ietf-nfsv4-nfs-ulb-v2
/// §5.1.2.1), the one the first Write chunk is for. `Ok(None)`: no such operation succeeded
/// (a COMPOUND's results end at its first failed operation). Positions count from the start of
/// `results`.
pub fn result(results: &[u8]) -> Result<Option<Item>, Error> {
    let mut r = Reader::new(results);
    fixed(&mut r, 4)?; // COMPOUND status
    let n = compound_head(&mut r, false)?;
    for _ in 0..n {
        let opnum = r.u32("nfs_opnum4")?;
        if r.u32("nfsstat4")? != OK {
            return Ok(None);
        }
        match opnum {
            // eof, then the data.
            op::READ => {
                fixed(&mut r, 4)?;
                return item_here(&mut r, "READ4resok data").map(Some);
            }
            op::READLINK => return item_here(&mut r, "READLINK4resok link").map(Some),
            _ => skip_resok(&mut r, opnum)?,
        }
    }
    Ok(None)
}
