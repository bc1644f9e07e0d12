//! The NFSv3 (RFC 1813) subset the probe needs: argument encoders and bounds-checked result decoders.
//!
//! Arguments are built into an [`XdrBuilder`] so that WRITE data can be marked DDP-eligible (RFC 8267 §4.3:
//! the `data` of WRITE3args and of READ3resok are the NFSv3 DDP-eligible items).

use crate::xdr::{Reader, Res, XdrError};
use rpcrdma_shm::client::XdrBuilder;

/// NFS program number.
pub const PROG: u32 = 100_003;
/// NFS version 3.
pub const VERS: u32 = 3;
/// NFSPROC3_NULL.
pub const NULL: u32 = 0;
/// NFSPROC3_GETATTR.
pub const GETATTR: u32 = 1;
/// NFSPROC3_LOOKUP.
pub const LOOKUP: u32 = 3;
/// NFSPROC3_ACCESS.
pub const ACCESS: u32 = 4;
/// NFSPROC3_READLINK.
pub const READLINK: u32 = 5;
/// NFSPROC3_READ.
pub const READ: u32 = 6;
/// NFSPROC3_WRITE.
pub const WRITE: u32 = 7;
/// NFSPROC3_SYMLINK.
pub const SYMLINK: u32 = 10;
/// NFSPROC3_REMOVE.
pub const REMOVE: u32 = 12;
/// NFSPROC3_READDIR.
pub const READDIR: u32 = 16;
/// NFSPROC3_READDIRPLUS.
pub const READDIRPLUS: u32 = 17;
/// NFSPROC3_FSSTAT.
pub const FSSTAT: u32 = 18;
/// NFSPROC3_FSINFO.
pub const FSINFO: u32 = 19;
/// NFSPROC3_PATHCONF.
pub const PATHCONF: u32 = 20;
/// NFSPROC3_COMMIT.
pub const COMMIT: u32 = 21;

/// NFS3_FHSIZE: the largest NFSv3 file handle.
pub const FHSIZE: u32 = 64;
/// The longest file name the probe accepts in a reply (Linux NAME_MAX).
pub const NAME_MAX: u32 = 255;

/// `stable_how` FILE_SYNC.
pub const FILE_SYNC: u32 = 2;

/// `nfsstat3` (0 = NFS3_OK).
pub type Status = u32;

/// `ftype3` NF3REG.
pub const NF3REG: u32 = 1;
/// `ftype3` NF3DIR.
pub const NF3DIR: u32 = 2;
/// `ftype3` NF3LNK.
pub const NF3LNK: u32 = 5;
/// NFS3_MAXPATHLEN as Linux has it (PATH_MAX): the longest symbolic link target.
pub const MAXPATHLEN: u32 = 4096;
/// `nfsstat3` NFS3ERR_NOENT.
pub const ERR_NOENT: Status = 2;
/// `nfsstat3` NFS3ERR_JUKEBOX: try again later (Linux's nfsd while a delegation is recalled).
pub const ERR_JUKEBOX: Status = 10_008;

/// `fattr3`: the attributes the probe checks (all fields decoded).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fattr3 {
    /// `ftype3` (1..=7).
    pub ftype: u32,
    /// Mode bits.
    pub mode: u32,
    /// Link count.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// Bytes used on disk.
    pub used: u64,
    /// Device numbers (specdata3).
    pub rdev: (u32, u32),
    /// File system id.
    pub fsid: u64,
    /// File id (inode number).
    pub fileid: u64,
    /// Access, modify and change times as (seconds, nanoseconds).
    pub times: [(u32, u32); 3],
}

fn time(r: &mut Reader<'_>) -> Res<(u32, u32)> {
    Ok((r.u32()?, r.u32()?))
}

/// Decodes a `fattr3` (84 bytes).
pub fn fattr3(r: &mut Reader<'_>) -> Res<Fattr3> {
    let ftype = r.u32()?;
    if !(1..=7).contains(&ftype) {
        return Err(XdrError::BadValue(ftype));
    }
    Ok(Fattr3 {
        ftype,
        mode: r.u32()?,
        nlink: r.u32()?,
        uid: r.u32()?,
        gid: r.u32()?,
        size: r.u64()?,
        used: r.u64()?,
        rdev: (r.u32()?, r.u32()?),
        fsid: r.u64()?,
        fileid: r.u64()?,
        times: [time(r)?, time(r)?, time(r)?],
    })
}

/// Decodes a `post_op_attr`.
pub fn post_op_attr(r: &mut Reader<'_>) -> Res<Option<Fattr3>> {
    if r.bool()? {
        Ok(Some(fattr3(r)?))
    } else {
        Ok(None)
    }
}

/// `wcc_attr`: size, mtime, ctime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WccAttr {
    /// Size before the operation.
    pub size: u64,
    /// mtime before.
    pub mtime: (u32, u32),
    /// ctime before.
    pub ctime: (u32, u32),
}

/// `wcc_data`: attributes before and after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WccData {
    /// `pre_op_attr`.
    pub before: Option<WccAttr>,
    /// `post_op_attr`.
    pub after: Option<Fattr3>,
}

/// Decodes a `wcc_data`.
pub fn wcc_data(r: &mut Reader<'_>) -> Res<WccData> {
    let before = if r.bool()? {
        Some(WccAttr {
            size: r.u64()?,
            mtime: time(r)?,
            ctime: time(r)?,
        })
    } else {
        None
    };
    Ok(WccData {
        before,
        after: post_op_attr(r)?,
    })
}

/// Decodes an `nfs_fh3`.
pub fn fh3(r: &mut Reader<'_>) -> Res<Vec<u8>> {
    Ok(r.opaque(FHSIZE)?.to_vec())
}

/// An NFSv3 result: `Ok` for NFS3_OK, otherwise the status and the failure arm's data.
pub type NfsResult<T, E = ()> = Result<T, (Status, E)>;

/// GETATTR3res.
pub fn getattr_res(b: &[u8]) -> Res<NfsResult<Fattr3>> {
    let mut r = Reader::new(b);
    match r.u32()? {
        0 => Ok(Ok(fattr3(&mut r)?)),
        s => Ok(Err((s, ()))),
    }
}

/// LOOKUP3resok.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupOk {
    /// The object's handle.
    pub fh: Vec<u8>,
    /// The object's attributes.
    pub obj: Option<Fattr3>,
    /// The directory's attributes.
    pub dir: Option<Fattr3>,
}

/// LOOKUP3res.
pub fn lookup_res(b: &[u8]) -> Res<NfsResult<LookupOk, Option<Fattr3>>> {
    let mut r = Reader::new(b);
    match r.u32()? {
        0 => Ok(Ok(LookupOk {
            fh: fh3(&mut r)?,
            obj: post_op_attr(&mut r)?,
            dir: post_op_attr(&mut r)?,
        })),
        s => Ok(Err((s, post_op_attr(&mut r)?))),
    }
}

/// READ3resok.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadOk {
    /// The file's attributes.
    pub attr: Option<Fattr3>,
    /// Bytes read (must equal `data.len()`).
    pub count: u32,
    /// End of file reached.
    pub eof: bool,
    /// The data.
    pub data: Vec<u8>,
}

/// READ3res; `max` bounds the data length (the count asked for).
pub fn read_res(b: &[u8], max: u32) -> Res<NfsResult<ReadOk, Option<Fattr3>>> {
    let mut r = Reader::new(b);
    let s = r.u32()?;
    let attr = post_op_attr(&mut r)?;
    if s != 0 {
        return Ok(Err((s, attr)));
    }
    let count = r.u32()?;
    let eof = r.bool()?;
    let data = r.opaque(max)?.to_vec();
    Ok(Ok(ReadOk {
        attr,
        count,
        eof,
        data,
    }))
}

/// WRITE3resok.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteOk {
    /// The file's attributes before and after.
    pub wcc: WccData,
    /// Bytes written.
    pub count: u32,
    /// `stable_how` committed.
    pub committed: u32,
    /// The write verifier.
    pub verf: [u8; 8],
}

/// WRITE3res.
pub fn write_res(b: &[u8]) -> Res<NfsResult<WriteOk, WccData>> {
    let mut r = Reader::new(b);
    let s = r.u32()?;
    let wcc = wcc_data(&mut r)?;
    if s != 0 {
        return Ok(Err((s, wcc)));
    }
    let count = r.u32()?;
    let committed = r.u32()?;
    if committed > FILE_SYNC {
        return Err(XdrError::BadValue(committed));
    }
    let mut verf = [0u8; 8];
    verf.copy_from_slice(r.fixed(8)?);
    Ok(Ok(WriteOk {
        wcc,
        count,
        committed,
        verf,
    }))
}

/// SYMLINK3res: the new link's handle (`post_op_fh3`, which a server may leave out).
pub fn symlink_res(b: &[u8]) -> Res<NfsResult<Option<Vec<u8>>, WccData>> {
    let mut r = Reader::new(b);
    let s = r.u32()?;
    if s != 0 {
        return Ok(Err((s, wcc_data(&mut r)?)));
    }
    let fh = if r.bool()? { Some(fh3(&mut r)?) } else { None };
    post_op_attr(&mut r)?;
    wcc_data(&mut r)?;
    Ok(Ok(fh))
}

/// READLINK3res: the link's target, at most `max` bytes.
pub fn readlink_res(b: &[u8], max: u32) -> Res<NfsResult<Vec<u8>, Option<Fattr3>>> {
    let mut r = Reader::new(b);
    let s = r.u32()?;
    let attr = post_op_attr(&mut r)?;
    if s != 0 {
        return Ok(Err((s, attr)));
    }
    Ok(Ok(r.opaque(max)?.to_vec()))
}

/// REMOVE3res: the directory's `wcc_data` whatever the status.
pub fn remove_res(b: &[u8]) -> Res<NfsResult<WccData, WccData>> {
    let mut r = Reader::new(b);
    let s = r.u32()?;
    let wcc = wcc_data(&mut r)?;
    Ok(if s == 0 { Ok(wcc) } else { Err((s, wcc)) })
}

/// One `entryplus3`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryPlus {
    /// File id.
    pub fileid: u64,
    /// Name (raw bytes; NFSv3 names are not required to be UTF-8).
    pub name: Vec<u8>,
    /// Cookie for the next READDIRPLUS.
    pub cookie: u64,
    /// Attributes, if the server sent them.
    pub attr: Option<Fattr3>,
    /// Handle, if the server sent it.
    pub fh: Option<Vec<u8>>,
}

/// READDIRPLUS3resok.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaddirplusOk {
    /// The directory's attributes.
    pub dir: Option<Fattr3>,
    /// The cookie verifier.
    pub verf: [u8; 8],
    /// The entries of this batch.
    pub entries: Vec<EntryPlus>,
    /// True when the listing is complete.
    pub eof: bool,
}

/// READDIRPLUS3res. The entry list is bounded by the input (each entry consumes at least 28 bytes).
pub fn readdirplus_res(b: &[u8]) -> Res<NfsResult<ReaddirplusOk, Option<Fattr3>>> {
    let mut r = Reader::new(b);
    let s = r.u32()?;
    let dir = post_op_attr(&mut r)?;
    if s != 0 {
        return Ok(Err((s, dir)));
    }
    let mut verf = [0u8; 8];
    verf.copy_from_slice(r.fixed(8)?);
    let mut entries = Vec::new();
    while r.bool()? {
        let fileid = r.u64()?;
        let name = r.opaque(NAME_MAX)?.to_vec();
        let cookie = r.u64()?;
        let attr = post_op_attr(&mut r)?;
        let fh = if r.bool()? { Some(fh3(&mut r)?) } else { None };
        entries.push(EntryPlus {
            fileid,
            name,
            cookie,
            attr,
            fh,
        });
    }
    let eof = r.bool()?;
    Ok(Ok(ReaddirplusOk {
        dir,
        verf,
        entries,
        eof,
    }))
}

fn put_u64(x: &mut XdrBuilder, v: u64) {
    x.put_u32((v >> 32) as u32).put_u32(v as u32);
}

/// GETATTR3args.
pub fn getattr_args(x: &mut XdrBuilder, fh: &[u8]) {
    x.put_opaque(fh);
}

/// LOOKUP3args (`diropargs3`).
pub fn lookup_args(x: &mut XdrBuilder, dir: &[u8], name: &str) {
    x.put_opaque(dir).put_opaque(name.as_bytes());
}

/// READ3args.
pub fn read_args(x: &mut XdrBuilder, fh: &[u8], offset: u64, count: u32) {
    x.put_opaque(fh);
    put_u64(x, offset);
    x.put_u32(count);
}

/// WRITE3args (FILE_SYNC); `ddp` marks the data DDP-eligible (a Read chunk), else it goes inline.
pub fn write_args(x: &mut XdrBuilder, fh: &[u8], offset: u64, data: &[u8], ddp: bool) {
    x.put_opaque(fh);
    put_u64(x, offset);
    x.put_u32(data.len() as u32).put_u32(FILE_SYNC);
    if ddp {
        x.put_ddp_opaque(data);
    } else {
        x.put_opaque(data);
    }
}

/// SYMLINK3args: `name` in `dir`, no attributes set, pointing at `target`, which `ddp`
/// marks DDP-eligible (RFC 8267 §4: `symlink_data` may go in a Read chunk).
pub fn symlink_args(x: &mut XdrBuilder, dir: &[u8], name: &str, target: &[u8], ddp: bool) {
    x.put_opaque(dir).put_opaque(name.as_bytes());
    // sattr3: mode, uid, gid and size not set; atime and mtime DONT_CHANGE.
    for _ in 0..6 {
        x.put_u32(0);
    }
    if ddp {
        x.put_ddp_opaque(target);
    } else {
        x.put_opaque(target);
    }
}

/// READLINK3args.
pub fn readlink_args(x: &mut XdrBuilder, fh: &[u8]) {
    x.put_opaque(fh);
}

/// READDIRPLUS3args.
pub fn readdirplus_args(
    x: &mut XdrBuilder,
    dir: &[u8],
    cookie: u64,
    verf: [u8; 8],
    dircount: u32,
    maxcount: u32,
) {
    x.put_opaque(dir);
    put_u64(x, cookie);
    x.put_u32(u32::from_be_bytes([verf[0], verf[1], verf[2], verf[3]]))
        .put_u32(u32::from_be_bytes([verf[4], verf[5], verf[6], verf[7]]))
        .put_u32(dircount)
        .put_u32(maxcount);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GETATTR3res for a directory, laid out by hand from RFC 1813 §2.5 (fattr3 is 84 bytes).
    #[test]
    fn rfc1813_getattr_res_hand_vector() {
        let mut b = vec![0, 0, 0, 0]; // NFS3_OK
        b.extend_from_slice(&[0, 0, 0, 2]); // NF3DIR
        b.extend_from_slice(&[0, 0, 0x41, 0xed]); // mode 040755
        b.extend_from_slice(&[0, 0, 0, 3, 0, 0, 3, 0xe8, 0, 0, 0, 100]); // nlink 3, uid 1000, gid 100
        b.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0]); // size 2^32
        b.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0x10, 0]); // used 4096
        b.extend_from_slice(&[0, 0, 0, 8, 0, 0, 0, 1]); // rdev 8,1
        b.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 9]); // fsid 9
        b.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 2]); // fileid 2
        b.extend_from_slice(&[
            0, 0, 0, 10, 0, 0, 0, 11, 0, 0, 0, 12, 0, 0, 0, 13, 0, 0, 0, 14, 0, 0, 0, 15,
        ]);
        assert_eq!(b.len(), 4 + 84);
        let a = getattr_res(&b).unwrap().unwrap();
        assert_eq!(
            a,
            Fattr3 {
                ftype: NF3DIR,
                mode: 0o40755,
                nlink: 3,
                uid: 1000,
                gid: 100,
                size: 1 << 32,
                used: 4096,
                rdev: (8, 1),
                fsid: 9,
                fileid: 2,
                times: [(10, 11), (12, 13), (14, 15)],
            }
        );
        // NFS3ERR_STALE (70) has no body; an ftype of 8 does not exist.
        assert_eq!(getattr_res(&[0, 0, 0, 70]).unwrap(), Err((70, ())));
        b[7] = 8;
        assert_eq!(getattr_res(&b), Err(XdrError::BadValue(8)));
    }

    /// SYMLINK3args as RFC 1813 §3.3.10 lays it out; the target's length word stays in the
    /// reduced stream, the target is the DDP piece.
    #[test]
    fn rfc8267_symlink_target_is_the_ddp_piece_after_its_length() {
        let mut x = XdrBuilder::default();
        symlink_args(&mut x, &[0xab; 4], "ln", b"/t", true);
        let full = x.to_full();
        let mut want = vec![
            0, 0, 0, 4, 0xab, 0xab, 0xab, 0xab, 0, 0, 0, 2, b'l', b'n', 0, 0,
        ];
        want.extend([0; 24]);
        want.extend([0, 0, 0, 2, b'/', b't', 0, 0]);
        assert_eq!(full, want);
        let mut inline = XdrBuilder::default();
        symlink_args(&mut inline, &[0xab; 4], "ln", b"/t", false);
        assert_eq!(inline.to_full(), full);
    }

    /// SYMLINK3res, READLINK3res and REMOVE3res, success and failure arms.
    #[test]
    fn rfc1813_symlink_readlink_remove_results() {
        let w = |ws: &[u32]| -> Vec<u8> { ws.iter().flat_map(|v| v.to_be_bytes()).collect() };
        // SYMLINK3resok: handle follows (4 bytes), no attributes, empty wcc_data.
        let ok = w(&[0, 1, 4, 0x0102_0304, 0, 0, 0]);
        assert_eq!(symlink_res(&ok).unwrap(), Ok(Some(vec![1, 2, 3, 4])));
        let exist = w(&[17, 0, 0]);
        assert!(matches!(symlink_res(&exist).unwrap(), Err((17, _))));
        // READLINK3resok: no attributes, "/t".
        let mut rl = w(&[0, 0, 2]);
        rl.extend(b"/t\0\0");
        assert_eq!(readlink_res(&rl, MAXPATHLEN).unwrap(), Ok(b"/t".to_vec()));
        assert_eq!(readlink_res(&rl, 1), Err(XdrError::TooLong(2)));
        assert_eq!(
            readlink_res(&w(&[70, 0]), MAXPATHLEN).unwrap(),
            Err((70, None))
        );
        assert!(remove_res(&w(&[0, 0, 0])).unwrap().is_ok());
        assert!(matches!(
            remove_res(&w(&[ERR_NOENT, 0, 0])).unwrap(),
            Err((ERR_NOENT, _))
        ));
    }

    /// WRITE3args: the data's length word stays in the reduced stream, the bytes become the DDP piece.
    #[test]
    fn rfc8267_write_data_is_the_ddp_piece_after_its_length() {
        let mut x = XdrBuilder::default();
        write_args(&mut x, &[0xab; 4], 5, &[1, 2, 3], true);
        let full = x.to_full();
        assert_eq!(
            full,
            [
                0, 0, 0, 4, 0xab, 0xab, 0xab, 0xab, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 3, 0, 0, 0, 2,
                0, 0, 0, 3, 1, 2, 3, 0
            ]
        );
        let mut inline = XdrBuilder::default();
        write_args(&mut inline, &[0xab; 4], 5, &[1, 2, 3], false);
        assert_eq!(inline.to_full(), full);
    }
}
