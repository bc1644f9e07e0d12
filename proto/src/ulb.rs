//! Upper-Layer Bindings (RFC 8166 §6): which XDR items of which procedures may be reduced
//! (moved into chunks), for RDMATEST (TESTPROG.md), NFS versions 2 and 3 (RFC 8267 §4) and
//! NFS version 4's COMPOUND (RFC 8267 §5; the walk through its operations is in
//! [`crate::nfs4`]).
//!
//! Anything not named here is not DDP-eligible (IMPL-6.2.1-a): unknown programs get
//! [`Binding::NONE`] and may only use Long messages (PZRC / Reply chunk).

use crate::chunk::ReadList;
use crate::nfs4::{COMPOUND as NFS4_COMPOUND, VERSION as NFS4_VERS};
use crate::rpc::CallHeader;
use crate::xdr::Reader;
use crate::Error;

/// RDMATEST program number (TESTPROG.md).
pub const RDMATEST_PROG: u32 = 0x2052_4454;
/// RDMATEST version.
pub const RDMATEST_VERS: u32 = 1;
/// RDMATEST procedures.
pub mod rdmatest {
    /// NULL.
    pub const NULL: u32 = 0;
    /// ECHO: `opaque data<>` argument and result are eligible.
    pub const ECHO: u32 = 1;
    /// READ: the result opaque is eligible.
    pub const READ: u32 = 2;
    /// WRITE: `write_args.data` is eligible.
    pub const WRITE: u32 = 3;
    /// SLEEP.
    pub const SLEEP: u32 = 4;
    /// CALLBACK.
    pub const CALLBACK: u32 = 5;
}
/// RDMATEST_CB program number (backward calls; nothing eligible).
pub const RDMATEST_CB_PROG: u32 = 0x2052_4455;
/// NFS program number.
pub const NFS_PROG: u32 = 100_003;
/// NFS version 2 procedures with DDP-eligible items (RFC 8267 §4, on RFC 1094's
/// procedures): the same four items as in version 3, under other numbers.
pub mod nfs2 {
    /// READLINK: the `path` result is eligible.
    pub const READLINK: u32 = 5;
    /// READ: the `data` result is eligible.
    pub const READ: u32 = 6;
    /// WRITE: the `data` argument is eligible.
    pub const WRITE: u32 = 8;
    /// SYMLINK: the `to` path argument is eligible; unlike version 3's, attributes follow it.
    pub const SYMLINK: u32 = 13;
    /// Size of a version 2 file handle (fixed-length opaque).
    pub const FHSIZE: usize = 32;
}
/// NFS version 3 procedures with DDP-eligible items (RFC 8267 §4).
pub mod nfs3 {
    /// READLINK: the `nfspath3` result is eligible.
    pub const READLINK: u32 = 5;
    /// READ: the `data` result is eligible.
    pub const READ: u32 = 6;
    /// WRITE: the `data` argument is eligible.
    pub const WRITE: u32 = 7;
    /// SYMLINK: the `symlink_data` (`nfspath3`) argument is eligible.
    pub const SYMLINK: u32 = 10;
}

/// What a procedure allows to be reduced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    /// Read chunks (distinct non-zero positions) a call may carry.
    pub max_read_chunks: u8,
    /// Write chunks a call may offer.
    pub max_write_chunks: u8,
    /// The call has a DDP-eligible argument.
    pub arg_eligible: bool,
    /// The reply has a DDP-eligible result.
    pub result_eligible: bool,
}

impl Binding {
    /// Nothing eligible (the default for anything not named, IMPL-6.2.1-a).
    pub const NONE: Binding = Binding {
        max_read_chunks: 0,
        max_write_chunks: 0,
        arg_eligible: false,
        result_eligible: false,
    };
    const ARG: Binding = Binding {
        max_read_chunks: 1,
        max_write_chunks: 0,
        arg_eligible: true,
        result_eligible: false,
    };
    const RESULT: Binding = Binding {
        max_read_chunks: 0,
        max_write_chunks: 1,
        arg_eligible: false,
        result_eligible: true,
    };
    const BOTH: Binding = Binding {
        max_read_chunks: 1,
        max_write_chunks: 1,
        arg_eligible: true,
        result_eligible: true,
    };
}

/// The binding of procedure `proc` of program `prog` version `vers`.
pub fn binding(prog: u32, vers: u32, proc: u32) -> Binding {
    match (prog, vers, proc) {
        (RDMATEST_PROG, RDMATEST_VERS, rdmatest::ECHO) => Binding::BOTH,
        (RDMATEST_PROG, RDMATEST_VERS, rdmatest::READ) => Binding::RESULT,
        (RDMATEST_PROG, RDMATEST_VERS, rdmatest::WRITE) => Binding::ARG,
        (NFS_PROG, 2, nfs2::READ | nfs2::READLINK) => Binding::RESULT,
        (NFS_PROG, 2, nfs2::WRITE | nfs2::SYMLINK) => Binding::ARG,
        (NFS_PROG, 3, nfs3::READ | nfs3::READLINK) => Binding::RESULT,
        (NFS_PROG, 3, nfs3::WRITE | nfs3::SYMLINK) => Binding::ARG,
        // Any operation may carry an eligible item. By default a COMPOUND carries at most one
        // Read chunk besides a Position-Zero one and at most one Write chunk (RFC 8267 §5,
        // "chunk list complexity"), which every NFSv4 server must accept.
        (NFS_PROG, NFS4_VERS, NFS4_COMPOUND) => Binding::BOTH,
        _ => Binding::NONE,
    }
}

/// Where an eligible item sits: the bytes after its inline length word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Item {
    /// Offset of the item's data (after its length word), from the start of what was parsed.
    pub position: u32,
    /// The item's length in bytes, pad excluded (the inline length word).
    pub length: u32,
}

fn item_at(r: &mut Reader<'_>, base: usize, what: &'static str) -> Result<Item, Error> {
    let length = r.u32(what)?;
    let position = u32::try_from(base + r.position()).map_err(|_| Error::Unencodable(what))?;
    Ok(Item { position, length })
}

fn skip_opaque_head(r: &mut Reader<'_>, max: u32, what: &'static str) -> Result<(), Error> {
    let len = r.u32(what)?;
    if len > max {
        return Err(Error::BadValue(what, len));
    }
    r.take(crate::xdr::opaque_len(len as usize) - 4, what)?;
    Ok(())
}

/// Skips an NFSv3 `set_*` optional value of `words` words (sattr3 arms).
fn skip_set(r: &mut Reader<'_>, words: usize, what: &'static str) -> Result<(), Error> {
    if r.bool(what)? {
        r.take(4 * words, what)?;
    }
    Ok(())
}

/// Skips an NFSv3 `set_atime` / `set_mtime` (time_how 2 carries an nfstime3).
fn skip_set_time(r: &mut Reader<'_>, what: &'static str) -> Result<(), Error> {
    match r.u32(what)? {
        0 | 1 => Ok(()),
        2 => r.take(8, what).map(|_| ()),
        v => Err(Error::BadValue(what, v)),
    }
}

/// Finds the eligible argument in the (possibly reduced) argument XDR of a call.
///
/// Only the items before the eligible one are read, so a call whose item was moved to a
/// Read chunk works as well as an unreduced one. `Ok(None)`: nothing eligible.
pub fn eligible_argument(
    prog: u32,
    vers: u32,
    proc: u32,
    args: &[u8],
) -> Result<Option<Item>, Error> {
    let mut r = Reader::new(args);
    let item = match (prog, vers, proc) {
        (RDMATEST_PROG, RDMATEST_VERS, rdmatest::ECHO) => item_at(&mut r, 0, "echo data")?,
        (RDMATEST_PROG, RDMATEST_VERS, rdmatest::WRITE) => {
            r.u32("write_args.seed")?;
            item_at(&mut r, 0, "write_args.data")?
        }
        (NFS_PROG, 2, nfs2::WRITE) => {
            r.take(
                nfs2::FHSIZE + 4 + 4 + 4,
                "writeargs file, offsets, totalcount",
            )?;
            item_at(&mut r, 0, "writeargs data")?
        }
        (NFS_PROG, 2, nfs2::SYMLINK) => {
            r.take(nfs2::FHSIZE, "diropargs dir")?;
            skip_opaque_head(&mut r, 255, "diropargs name")?;
            item_at(&mut r, 0, "symlinkargs to")?
        }
        (NFS_PROG, 3, nfs3::WRITE) => {
            skip_opaque_head(&mut r, 64, "nfs_fh3")?;
            r.take(8 + 4 + 4, "WRITE3args offset, count, stable")?;
            item_at(&mut r, 0, "WRITE3args data")?
        }
        (NFS_PROG, 3, nfs3::SYMLINK) => {
            skip_opaque_head(&mut r, 64, "nfs_fh3")?;
            skip_opaque_head(&mut r, u32::MAX, "filename3")?;
            skip_set(&mut r, 1, "set_mode3")?;
            skip_set(&mut r, 1, "set_uid3")?;
            skip_set(&mut r, 1, "set_gid3")?;
            skip_set(&mut r, 2, "set_size3")?;
            skip_set_time(&mut r, "set_atime")?;
            skip_set_time(&mut r, "set_mtime")?;
            item_at(&mut r, 0, "symlink_data")?
        }
        (NFS_PROG, NFS4_VERS, NFS4_COMPOUND) => return crate::nfs4::argument(args, |_| true),
        _ => return Ok(None),
    };
    Ok(Some(item))
}

/// Finds the eligible argument that starts at `position` (counted as [`Item::position`] is),
/// for checking a Read chunk: only a COMPOUND has more than one, and those before `position`
/// are taken to be inline. `Ok(None)`: no eligible argument starts there.
pub fn eligible_argument_at(
    prog: u32,
    vers: u32,
    proc: u32,
    args: &[u8],
    position: u32,
) -> Result<Option<Item>, Error> {
    if is_compound(prog, vers, proc) {
        return crate::nfs4::argument(args, |item| item.position == position);
    }
    Ok(eligible_argument(prog, vers, proc, args)?.filter(|item| item.position == position))
}

/// Skips an NFSv3 `post_op_attr` (a boolean, then an 84-byte `fattr3` when true).
fn skip_post_op_attr(r: &mut Reader<'_>, what: &'static str) -> Result<(), Error> {
    skip_set(r, 21, what)
}

/// Finds the eligible result in the (possibly reduced) result XDR of a successful reply
/// (accept_stat SUCCESS; `results` starts after the RPC reply header), for the requester's
/// checks of R8166-6.1-c/d and the responder's reduction of a result its app left inline.
///
/// In a COMPOUND it is the result of the first READ or READLINK, which the first Write chunk
/// is for (RFC 8267 §5); in every other binding here it is the last item of its reply, so a
/// reduced reply ends with the item's length word ([`result_is_last`]). `Ok(None)`: the
/// procedure has no eligible result, or this reply carries none (an NFS error status). Only
/// the items before the eligible one are read.
pub fn eligible_result(
    prog: u32,
    vers: u32,
    proc: u32,
    results: &[u8],
) -> Result<Option<Item>, Error> {
    const NFS_OK: u32 = 0;
    let mut r = Reader::new(results);
    // Every NFSv2 and NFSv3 reply with an eligible result opens with a status; an error
    // status carries no result at all.
    let legacy_nfs = prog == NFS_PROG && matches!(vers, 2 | 3);
    if legacy_nfs && binding(prog, vers, proc).result_eligible && r.u32("NFS status")? != NFS_OK {
        return Ok(None);
    }
    let item = match (prog, vers, proc) {
        (RDMATEST_PROG, RDMATEST_VERS, rdmatest::ECHO | rdmatest::READ) => {
            item_at(&mut r, 0, "result opaque")?
        }
        (NFS_PROG, 2, nfs2::READ) => {
            // fattr: type, mode, nlink, uid, gid, size, blocksize, rdev, blocks, fsid,
            // fileid, then three timevals.
            r.take(17 * 4, "readres attributes")?;
            item_at(&mut r, 0, "readres data")?
        }
        (NFS_PROG, 2, nfs2::READLINK) => item_at(&mut r, 0, "readlinkres data")?,
        (NFS_PROG, 3, nfs3::READ) => {
            skip_post_op_attr(&mut r, "READ3resok file_attributes")?;
            r.take(4 + 4, "READ3resok count, eof")?;
            item_at(&mut r, 0, "READ3resok data")?
        }
        (NFS_PROG, 3, nfs3::READLINK) => {
            skip_post_op_attr(&mut r, "READLINK3resok symlink_attributes")?;
            item_at(&mut r, 0, "READLINK3resok data")?
        }
        (NFS_PROG, NFS4_VERS, NFS4_COMPOUND) => return crate::nfs4::result(results),
        _ => return Ok(None),
    };
    Ok(Some(item))
}

/// Whether the eligible result of procedure `proc` is the last item of its reply, so that a
/// reply whose result was reduced ends with the result's length word. Not so in a COMPOUND,
/// where operations may follow the READ.
pub fn result_is_last(prog: u32, vers: u32, proc: u32) -> bool {
    !is_compound(prog, vers, proc)
}

/// NFSv4's COMPOUND, the one binding here with several eligible items per message.
fn is_compound(prog: u32, vers: u32, proc: u32) -> bool {
    (prog, vers, proc) == (NFS_PROG, NFS4_VERS, NFS4_COMPOUND)
}

/// Finds the eligible argument of a whole RPC call message; the position is counted from
/// the first byte of the XID, as Read-chunk positions are (R8166-3.4.5-a).
pub fn eligible_call_item(msg: &[u8]) -> Result<Option<Item>, Error> {
    let call = CallHeader::parse(msg)?;
    let args = msg.get(call.args_offset..).unwrap_or(&[]);
    let Some(item) = eligible_argument(call.prog, call.vers, call.proc, args)? else {
        return Ok(None);
    };
    let position = u32::try_from(call.args_offset)
        .ok()
        .and_then(|o| o.checked_add(item.position))
        .ok_or(Error::Unencodable("position"))?;
    Ok(Some(Item { position, ..item }))
}

/// Checks a call's non-zero-position Read chunks against its binding (R8166-6.1-b,
/// R8166-3.4.5.2-b/c): at most the allowed number of chunks, each at the eligible item's
/// position, with the item's length (optionally plus its XDR pad).
///
/// `msg` is the inline (reduced) RPC call. Failures are [`Error::NotEligible`]
/// (answered with GARBAGE_ARGS, AMB-12).
pub fn check_read_chunks(msg: &[u8], reads: &ReadList<'_>) -> Result<(), Error> {
    let mut data_chunks = reads.chunks().filter(|c| c.position != 0);
    let Some(chunk) = data_chunks.next() else {
        return Ok(());
    };
    let call = CallHeader::parse(msg).map_err(|_| Error::NotEligible("unparsable call"))?;
    let b = binding(call.prog, call.vers, call.proc);
    if !b.arg_eligible || data_chunks.next().is_some() {
        return Err(Error::NotEligible("read chunk for a non-eligible argument"));
    }
    let args = msg.get(call.args_offset..).unwrap_or(&[]);
    let at = u32::try_from(call.args_offset)
        .ok()
        .and_then(|o| chunk.position.checked_sub(o))
        .ok_or(Error::NotEligible("read chunk at a non-eligible position"))?;
    let item = eligible_argument_at(call.prog, call.vers, call.proc, args, at)
        .map_err(|_| Error::NotEligible("unparsable arguments"))?
        .ok_or(Error::NotEligible("read chunk at a non-eligible position"))?;
    let len = u64::from(chunk.length().ok_or(Error::ChunkTooLong)?);
    let want = u64::from(item.length);
    if len != want && len != want + crate::xdr::pad(item.length as usize) as u64 {
        return Err(Error::NotEligible(
            "read chunk length differs from the item",
        ));
    }
    Ok(())
}
