//! A tiny in-memory NFSv3-subset server (the procedures the probe uses, and those the Linux
//! client needs to mount it, read, list and write: ACCESS, READDIR, FSSTAT, FSINFO, PATHCONF,
//! COMMIT), the NFSv4.1 operations of the probe's `nfs4_chunks` step and of its
//! `nfs4_backchannel` step (a session with a back channel, OPEN with a read delegation on
//! `deleg.bin`, recalled with CB_COMPOUND over the backward direction when an NFSv3 WRITE
//! comes for that file, DELEGRETURN, CLOSE; the back channel probed with CB_SEQUENCE alone once
//! the session is complete), those the Linux client needs to mount it in NFSv4.1 and read it
//! (`miniserver/v41.rs`), and a MOUNT v3 responder,
//! for end-to-end runs without a kernel server: through `shm-loopback` in the tests, or behind
//! rpcrdmad (`nfs-probe serve`), where the probe or the kernel's NFS client mounts it. Not an
//! NFS server: fixed names, no permissions, one session.

use crate::callback;
use crate::nfs::pattern_at;
use crate::nfs3::{self, FILE_SYNC, NF3DIR, NF3LNK, NF3REG};
use crate::nfs4::{op, put_fixed};
use crate::probe::LINK_NAME;
use crate::tcprpc::read_record;
use crate::xdr::{Reader, Writer};
use rpcrdma_shm::client::{Call, ReplyBuilder, XdrBuilder};
use std::io::Write;
use std::net::TcpListener;

mod v41;

/// The export's root handle.
pub const ROOT: &[u8] = b"root-fh-0001";
const FH_READ: &[u8] = b"fh-read";
const FH_WRITE: &[u8] = b"fh-write";
const FH_DIR: &[u8] = b"fh-dir";
const FH_LINK: &[u8] = b"fh-link";
/// `deleg.bin`: an empty file, the one the server gives delegations on.
const FH_DELEG: &[u8] = b"fh-deleg";
/// The one open stateid and the one delegation stateid the server hands out.
const OPEN_STATEID: [u8; 16] = *b"\0\0\0\x01mini-open-01";
const DELEG_STATEID: [u8; 16] = *b"\0\0\0\x01mini-deleg-1";
/// Largest WRITE accepted.
const MAX_WRITE: u32 = 4 << 20;
/// The READ and WRITE size FSINFO offers (`rtmax`, `wtmax`): what `nfs-probe serve`'s receive
/// buffers hold with the call's header.
pub const MAX_IO: u32 = 1 << 20;
/// The write verifier of every WRITE and COMMIT (this server never loses what it acknowledged,
/// short of its own end).
const WRITE_VERF: [u32; 2] = [1, 2];
/// Largest file offset a WRITE may reach.
const MAX_FILE: usize = 16 << 20;

fn put_fattr(x: &mut XdrBuilder, ftype: u32, size: u64, fileid: u64) {
    x.put_u32(ftype)
        .put_u32(0o644)
        .put_u32(1)
        .put_u32(0)
        .put_u32(0);
    for v in [size, size, 0, 1, fileid] {
        x.put_u32((v >> 32) as u32).put_u32(v as u32);
    }
    for _ in 0..6 {
        x.put_u32(0);
    }
}

/// Makes one backward-direction call to a client: (peer, program, procedure, AUTH_SYS
/// identity or `None` for AUTH_NONE, arguments) to the reply's results, `None` if the call
/// failed.
pub type CallBack =
    Box<dyn FnMut(u32, u32, u32, Option<(u32, u32)>, &[u8]) -> Option<Vec<u8>> + Send>;

/// The session's back channel: the client's connection (its peer index), callback program and
/// callback credential (the first of CREATE_SESSION's `csa_sec_parms`: AUTH_SYS's identity, or
/// `None` for AUTH_NONE), the next CB_SEQUENCE sequence id, and whether the last callback was
/// answered.
#[derive(Debug, Clone, Copy)]
struct BackChannel {
    peer: u32,
    prog: u32,
    auth: Option<(u32, u32)>,
    seq: u32,
    up: bool,
}

/// The file system: `read.bin` (pattern), `write.bin` (writable), `dir/` with `entries` names,
/// `deleg.bin` (empty), and the probe's symbolic link once made.
pub struct Fs {
    read: Vec<u8>,
    write: Vec<u8>,
    entries: u64,
    /// The target of [`LINK_NAME`], if it exists.
    link: Option<Vec<u8>>,
    /// How callbacks are made (`None`: the server offers no back channel).
    callback: Option<CallBack>,
    /// The peer index of the call being served.
    caller: u32,
    /// The session's back channel, once CREATE_SESSION took one.
    back: Option<BackChannel>,
    /// The back channel is to be probed (CB_SEQUENCE alone) before the next call is answered.
    probe_due: bool,
    /// Whether `deleg.bin`'s read delegation is out.
    delegated: bool,
}

impl std::fmt::Debug for Fs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fs")
            .field("read", &self.read.len())
            .field("write", &self.write.len())
            .field("entries", &self.entries)
            .field("back", &self.back)
            .field("delegated", &self.delegated)
            .finish_non_exhaustive()
    }
}

impl Fs {
    /// `read.bin` holds `read_size` bytes of `nfs-probe gen --seed seed`.
    pub fn new(seed: u32, read_size: usize, entries: u64) -> Fs {
        Fs {
            read: pattern_at(seed, 0, read_size),
            write: Vec::new(),
            entries,
            link: None,
            callback: None,
            caller: 0,
            back: None,
            probe_due: false,
            delegated: false,
        }
    }

    /// Lets the server take a session's back channel and make callbacks through `call`.
    pub fn with_callbacks(mut self, call: CallBack) -> Fs {
        self.callback = Some(call);
        self
    }

    /// Recalls `deleg.bin`'s delegation with CB_COMPOUND (CB_SEQUENCE + CB_RECALL) over the
    /// session's back channel.
    fn recall(&mut self) {
        let sent = self.callback_compound(Some((&DELEG_STATEID, FH_DELEG)));
        if sent && self.back.is_some_and(|b| b.up) {
            eprintln!("delegation recalled: CB_RECALL answered");
        }
    }

    /// Makes a CB_COMPOUND over the session's back channel: CB_SEQUENCE, and CB_RECALL of
    /// `recall` if given; the back channel is down if the client does not answer it as RFC
    /// 8881 §20.9 asks. False if the client answered NFS4ERR_DELAY (to be sent again later,
    /// with the same sequence id), true otherwise.
    fn callback_compound(&mut self, recall: Option<(&[u8; 16], &[u8])>) -> bool {
        let (Some(call), Some(b)) = (self.callback.as_mut(), self.back.as_mut()) else {
            return true;
        };
        let args = callback::cb_compound_args(v4::SESSION, b.seq, recall);
        let res = call(b.peer, b.prog, callback::CB_COMPOUND, b.auth, &args);
        if res.as_deref().and_then(callback::cb_compound_status) == Some(callback::ERR_DELAY) {
            return false;
        }
        b.up = match res {
            Some(res)
                if callback::cb_compound_answered(&res, v4::SESSION, b.seq, recall.is_some()) =>
            {
                true
            }
            Some(res) => {
                eprintln!(
                    "CB_COMPOUND (sequence {}) answered wrongly: {res:02x?}",
                    b.seq
                );
                false
            }
            None => false,
        };
        b.seq = b.seq.wrapping_add(1);
        true
    }

    fn attr(&self, fh: &[u8]) -> Option<(u32, u64, u64)> {
        match fh {
            ROOT => Some((NF3DIR, 4096, 1)),
            FH_READ => Some((NF3REG, self.read.len() as u64, 2)),
            FH_WRITE => Some((NF3REG, self.write.len() as u64, 3)),
            FH_DIR => Some((NF3DIR, 4096, 4)),
            FH_LINK => self.link.as_ref().map(|t| (NF3LNK, t.len() as u64, 5)),
            FH_DELEG => Some((NF3REG, 0, 6)),
            // The handle of `dir/fNNNNN` is its name (READDIRPLUS hands it out).
            _ => entry_index(fh)
                .filter(|&i| i < self.entries)
                .map(|i| (NF3REG, 0, 100 + i)),
        }
    }

    /// Up to `count` bytes of the file `fh` from `off` (the read file, else the write file),
    /// and whether they reach its end.
    fn read_at(&self, fh: &[u8], off: u64, count: u32) -> Option<(Vec<u8>, bool)> {
        let file = if fh == FH_READ {
            &self.read
        } else {
            &self.write
        };
        let start = usize::try_from(off).unwrap_or(usize::MAX).min(file.len());
        let end = start
            .saturating_add(count.min(MAX_WRITE) as usize)
            .min(file.len());
        Some((file.get(start..end)?.to_vec(), end == file.len()))
    }

    /// Writes `data` at `off` of the write file; `Some(false)`: refused (another file, or past
    /// the largest size).
    fn write_at(&mut self, fh: &[u8], off: usize, data: &[u8]) -> Option<bool> {
        if fh == FH_DELEG {
            // `deleg.bin` stays empty: a WRITE of nothing succeeds.
            return Some(data.is_empty());
        }
        let end = off.checked_add(data.len())?;
        if fh != FH_WRITE || end > MAX_FILE {
            return Some(false);
        }
        if self.write.len() < end {
            self.write.resize(end, 0);
        }
        self.write.get_mut(off..end)?.copy_from_slice(data);
        Some(true)
    }

    /// NFS3_OK and the `post_op_attr` of `fh`: how most results begin.
    fn ok_post_op(&self, x: &mut XdrBuilder, fh: &[u8]) {
        x.put_u32(0);
        self.post_op(x, fh);
    }

    fn post_op(&self, x: &mut XdrBuilder, fh: &[u8]) {
        match self.attr(fh) {
            Some((t, s, id)) => {
                x.put_u32(1);
                put_fattr(x, t, s, id);
            }
            None => {
                x.put_u32(0);
            }
        }
    }

    /// Serves one call of NFS version 3 or 4; malformed arguments get GARBAGE_ARGS, unknown
    /// procedures PROC_UNAVAIL.
    pub fn serve(&mut self, call: &Call<'_>, reply: &mut ReplyBuilder) {
        self.caller = call.peer;
        let mut r = Reader::new(call.args);
        let done = if call.vers == 4 {
            self.compound(call.proc_, &mut r, &mut reply.xdr)
        } else {
            self.proc(call.proc_, &mut r, &mut reply.xdr)
        };
        match done {
            Some(true) => {}
            Some(false) => {
                reply.xdr = XdrBuilder::default();
                reply.accept_stat = 3;
            }
            None => {
                reply.xdr = XdrBuilder::default();
                reply.accept_stat = 4;
            }
        }
    }

    fn proc(&mut self, p: u32, r: &mut Reader<'_>, x: &mut XdrBuilder) -> Option<bool> {
        match p {
            nfs3::NULL => {}
            nfs3::GETATTR => {
                let fh = r.opaque(nfs3::FHSIZE).ok()?;
                match self.attr(fh) {
                    Some((t, s, id)) => {
                        x.put_u32(0);
                        put_fattr(x, t, s, id);
                    }
                    None => {
                        x.put_u32(70); // NFS3ERR_STALE
                    }
                }
            }
            nfs3::LOOKUP => {
                let _dir = r.opaque(nfs3::FHSIZE).ok()?;
                let fh: &[u8] = match r.opaque(nfs3::NAME_MAX).ok()? {
                    b"read.bin" => FH_READ,
                    b"write.bin" => FH_WRITE,
                    b"dir" => FH_DIR,
                    b"deleg.bin" => FH_DELEG,
                    n if n == LINK_NAME.as_bytes() && self.link.is_some() => FH_LINK,
                    _ => {
                        x.put_u32(2).put_u32(0); // NFS3ERR_NOENT, no directory attributes
                        return Some(true);
                    }
                };
                x.put_u32(0).put_opaque(fh);
                self.post_op(x, fh);
                x.put_u32(0);
            }
            nfs3::READ => {
                let fh = r.opaque(nfs3::FHSIZE).ok()?;
                let off = r.u64().ok()?;
                let (data, eof) = self.read_at(fh, off, r.u32().ok()?)?;
                self.ok_post_op(x, fh);
                x.put_u32(data.len() as u32)
                    .put_u32(u32::from(eof))
                    .put_ddp_opaque(&data);
            }
            nfs3::WRITE => {
                let fh = r.opaque(nfs3::FHSIZE).ok()?;
                let off = usize::try_from(r.u64().ok()?).ok()?;
                let _count = r.u32().ok()?;
                let _stable = r.u32().ok()?;
                let data = r.opaque(MAX_WRITE).ok()?;
                if fh == FH_DELEG && self.delegated {
                    // Try again once the delegation is back (as Linux's nfsd answers).
                    self.recall();
                    x.put_u32(nfs3::ERR_JUKEBOX).put_u32(0).put_u32(0);
                    return Some(true);
                }
                if !self.write_at(fh, off, data)? {
                    x.put_u32(13).put_u32(0).put_u32(0); // NFS3ERR_ACCES, empty wcc_data
                    return Some(true);
                }
                x.put_u32(0).put_u32(0);
                self.post_op(x, fh);
                x.put_u32(data.len() as u32)
                    .put_u32(FILE_SYNC)
                    .put_u32(WRITE_VERF[0])
                    .put_u32(WRITE_VERF[1]);
            }
            nfs3::SYMLINK => {
                let dir = r.opaque(nfs3::FHSIZE).ok()?;
                let name = r.opaque(nfs3::NAME_MAX).ok()?;
                skip_sattr3(r)?;
                let target = r.opaque(nfs3::MAXPATHLEN).ok()?;
                let status = match (dir == ROOT && name == LINK_NAME.as_bytes(), &self.link) {
                    (false, _) => 13,      // NFS3ERR_ACCES: the one name this server makes
                    (true, Some(_)) => 17, // NFS3ERR_EXIST
                    (true, None) => 0,
                };
                x.put_u32(status);
                if status == 0 {
                    self.link = Some(target.to_vec());
                    x.put_u32(1).put_opaque(FH_LINK);
                    self.post_op(x, FH_LINK);
                }
                x.put_u32(0).put_u32(0); // wcc_data of the directory: none
            }
            nfs3::READLINK => {
                let fh = r.opaque(nfs3::FHSIZE).ok()?;
                match self.link.as_ref().filter(|_| fh == FH_LINK) {
                    Some(target) => {
                        self.ok_post_op(x, FH_LINK);
                        x.put_ddp_opaque(target);
                    }
                    None => {
                        x.put_u32(70).put_u32(0); // NFS3ERR_STALE, no attributes
                    }
                }
            }
            nfs3::REMOVE => {
                let dir = r.opaque(nfs3::FHSIZE).ok()?;
                let name = r.opaque(nfs3::NAME_MAX).ok()?;
                let found = dir == ROOT && name == LINK_NAME.as_bytes() && self.link.is_some();
                if found {
                    self.link = None;
                }
                x.put_u32(if found { 0 } else { nfs3::ERR_NOENT })
                    .put_u32(0)
                    .put_u32(0);
            }
            nfs3::ACCESS => {
                let fh = r.opaque(nfs3::FHSIZE).ok()?;
                let want = r.u32().ok()?;
                if self.attr(fh).is_none() {
                    x.put_u32(70).put_u32(0); // NFS3ERR_STALE, no attributes
                    return Some(true);
                }
                self.ok_post_op(x, fh);
                x.put_u32(want); // everything asked for
            }
            nfs3::FSSTAT => {
                let fh = r.opaque(nfs3::FHSIZE).ok()?;
                self.ok_post_op(x, fh);
                // Bytes total, free, available; files total, free, available; invarsec.
                let (bytes, files) = (MAX_FILE as u64 * 4, 1u64 << 20);
                for v in [bytes, bytes / 2, bytes / 2, files, files / 2, files / 2] {
                    x.put_u32((v >> 32) as u32).put_u32(v as u32);
                }
                x.put_u32(0);
            }
            nfs3::FSINFO => {
                let fh = r.opaque(nfs3::FHSIZE).ok()?;
                self.ok_post_op(x, fh);
                // rtmax, rtpref, rtmult, wtmax, wtpref, wtmult, dtpref.
                for v in [MAX_IO, MAX_IO, 4096, MAX_IO, MAX_IO, 4096, 32768] {
                    x.put_u32(v);
                }
                x.put_u32(0).put_u32(MAX_FILE as u32); // maxfilesize
                x.put_u32(0).put_u32(1); // time_delta: 1 ns
                x.put_u32(0x1b); // FSF3_LINK | FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME
            }
            nfs3::PATHCONF => {
                let fh = r.opaque(nfs3::FHSIZE).ok()?;
                self.ok_post_op(x, fh);
                // linkmax, name_max; no_trunc, chown_restricted, case_insensitive, case_preserving.
                x.put_u32(1).put_u32(nfs3::NAME_MAX);
                x.put_u32(1).put_u32(1).put_u32(0).put_u32(1);
            }
            nfs3::COMMIT => {
                let fh = r.opaque(nfs3::FHSIZE).ok()?;
                let _off = r.u64().ok()?;
                let _count = r.u32().ok()?;
                x.put_u32(0).put_u32(0);
                self.post_op(x, fh);
                x.put_u32(WRITE_VERF[0]).put_u32(WRITE_VERF[1]);
            }
            nfs3::READDIR => {
                let _dir = r.opaque(nfs3::FHSIZE).ok()?;
                let cookie = r.u64().ok()?;
                let _verf = r.fixed(8).ok()?;
                let count = r.u32().ok()? as usize;
                self.ok_post_op(x, FH_DIR);
                x.put_u32(0).put_u32(0);
                let mut i = cookie;
                // `count` bounds the whole READDIR3resok: status, the directory's attributes
                // and the verifier (100 bytes), the list's end and eof (8); each entry is 32.
                let mut room = count.saturating_sub(108);
                while i < self.entries && room >= 32 {
                    x.put_u32(1).put_u32(0).put_u32(100 + i as u32);
                    x.put_opaque(format!("f{i:05}").as_bytes());
                    x.put_u32(0).put_u32(i as u32 + 1);
                    room -= 32;
                    i += 1;
                }
                x.put_u32(0).put_u32(u32::from(i >= self.entries));
            }
            nfs3::READDIRPLUS => {
                let _dir = r.opaque(nfs3::FHSIZE).ok()?;
                let cookie = r.u64().ok()?;
                let _verf = r.fixed(8).ok()?;
                let _dircount = r.u32().ok()?;
                let maxcount = r.u32().ok()? as usize;
                self.ok_post_op(x, FH_DIR);
                x.put_u32(0).put_u32(0);
                let mut i = cookie;
                let mut used = 0usize;
                // Each entry below encodes to at most 140 bytes; 200 leaves room for the trailer.
                while i < self.entries && used + 200 < maxcount {
                    let name = format!("f{i:05}");
                    x.put_u32(1).put_u32(0).put_u32(100 + i as u32);
                    x.put_opaque(name.as_bytes());
                    x.put_u32(0).put_u32(i as u32 + 1);
                    x.put_u32(1);
                    put_fattr(x, NF3REG, 0, 100 + i);
                    x.put_u32(1).put_opaque(name.as_bytes());
                    used += 140;
                    i += 1;
                }
                x.put_u32(0).put_u32(u32::from(i >= self.entries));
            }
            _ => return Some(false),
        }
        Some(true)
    }
}

/// The index of a `dir/` entry from its handle (`f` and five digits), if it is one.
fn entry_index(fh: &[u8]) -> Option<u64> {
    let digits = fh.strip_prefix(b"f").filter(|d| d.len() == 5)?;
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// An NFSv4 `change_info4` of the root: atomic, both change ids 0.
fn put_change_info(x: &mut XdrBuilder) {
    x.put_u32(1);
    for _ in 0..4 {
        x.put_u32(0);
    }
}

/// Steps over an NFSv3 `sattr3`: four optional values (mode, uid, gid, size), then two
/// `set_time` unions; `None` if it is malformed.
fn skip_sattr3(r: &mut Reader<'_>) -> Option<()> {
    for words in [1, 1, 1, 2] {
        if r.bool().ok()? {
            r.fixed(4 * words).ok()?;
        }
    }
    for _ in 0..2 {
        match r.u32().ok()? {
            0 | 1 => {}
            2 => {
                r.fixed(8).ok()?;
            }
            _ => return None,
        }
    }
    Some(())
}

/// NFSv4 statuses and the session id of the subset (its operations: [`crate::nfs4::op`]).
mod v4 {
    pub const ERR_STALE: u32 = 70;
    pub const ERR_NOFILEHANDLE: u32 = 10_020;
    pub const ERR_NOTSUPP: u32 = 10_004;
    pub const SESSION: &[u8; 16] = b"mini-session-001";
}

impl Fs {
    /// NFSv4 NULL and COMPOUND (minor version 1): the operations run in order until one fails.
    fn compound(&mut self, p: u32, r: &mut Reader<'_>, x: &mut XdrBuilder) -> Option<bool> {
        match p {
            0 => return Some(true),
            1 => {}
            _ => return Some(false),
        }
        r.opaque(1024).ok()?;
        r.u32().ok()?;
        let n = r.u32().ok()?;
        x.put_u32(0).put_u32(0);
        let count_at = x.len();
        x.put_u32(0);
        let (mut cur, mut saved): (Option<&'static [u8]>, _) = (None, None);
        let mut done = 0;
        for _ in 0..n.min(16) {
            let opnum = r.u32().ok()?;
            let status = self.op4(opnum, r, x, &mut cur, &mut saved)?;
            done += 1;
            if status != 0 {
                x.set_u32(0, status);
                break;
            }
        }
        x.set_u32(count_at, done);
        Some(true)
    }

    /// One operation: its arguments read, its result (number, status, result) written.
    fn op4(
        &mut self,
        opnum: u32,
        r: &mut Reader<'_>,
        x: &mut XdrBuilder,
        cur: &mut Option<&'static [u8]>,
        saved: &mut Option<&'static [u8]>,
    ) -> Option<u32> {
        x.put_u32(opnum);
        match opnum {
            op::SEQUENCE => {
                let id = r.fixed(16).ok()?;
                let (seq, slot, highest) = (r.u32().ok()?, r.u32().ok()?, r.u32().ok()?);
                r.bool().ok()?;
                x.put_u32(0);
                put_fixed(x, id);
                // The back channel's probe, due since RECLAIM_COMPLETE (again at the next call
                // if the client said NFS4ERR_DELAY).
                if self.probe_due {
                    self.probe_due = !self.callback_compound(None);
                    if !self.probe_due && self.back.is_some_and(|b| b.up) {
                        eprintln!("back channel up: CB_SEQUENCE answered");
                    }
                }
                // Every slot the client uses is served (no reply cache: replays are redone);
                // SEQ4_STATUS_CB_PATH_DOWN once a callback went unanswered.
                let down = self.back.is_some_and(|b| !b.up);
                x.put_u32(seq)
                    .put_u32(slot)
                    .put_u32(highest)
                    .put_u32(highest)
                    .put_u32(u32::from(down));
            }
            op::EXCHANGE_ID => {
                r.fixed(8).ok()?;
                r.opaque(1024).ok()?;
                r.u32().ok()?;
                if r.u32().ok()? != 0 {
                    // State protection other than SP4_NONE.
                    x.put_u32(v4::ERR_NOTSUPP);
                    return Some(v4::ERR_NOTSUPP);
                }
                // The client's implementation id, if any (Linux sends one): domain, name, date.
                for _ in 0..r.u32().ok()?.min(1) {
                    r.opaque(1024).ok()?;
                    r.opaque(1024).ok()?;
                    r.fixed(12).ok()?;
                }
                // Client id 1, sequence 1, USE_NON_PNFS, SP4_NONE, owner, scope, no impl id.
                x.put_u32(0)
                    .put_u32(0)
                    .put_u32(1)
                    .put_u32(1)
                    .put_u32(0x0001_0000);
                x.put_u32(0).put_u32(0).put_u32(0).put_opaque(b"mini");
                x.put_opaque(b"mini").put_u32(0);
            }
            op::CREATE_SESSION => {
                r.fixed(8).ok()?;
                let seq = r.u32().ok()?;
                let flags = r.u32().ok()?;
                let mut chans = [[0u32; 6]; 2];
                for c in &mut chans {
                    for w in c.iter_mut() {
                        *w = r.u32().ok()?;
                    }
                    let ird = r.u32().ok()?;
                    r.fixed(4 * ird.min(1) as usize).ok()?;
                }
                let cb_prog = r.u32().ok()?;
                // The callback security: AUTH_NONE, or AUTH_SYS (stamp, machine name, uid,
                // gid, groups) as Linux sends (its callback service refuses CB_COMPOUND under
                // AUTH_NONE); callbacks use the first.
                let mut cb_auth = None;
                for k in 0..r.u32().ok()?.min(4) {
                    match r.u32().ok()? {
                        0 => {}
                        1 => {
                            r.u32().ok()?;
                            r.opaque(255).ok()?;
                            let (uid, gid) = (r.u32().ok()?, r.u32().ok()?);
                            let groups = r.u32().ok()?;
                            r.fixed(4 * groups.min(16) as usize).ok()?;
                            if k == 0 {
                                cb_auth = Some((uid, gid));
                            }
                        }
                        _ => {
                            x.put_u32(v4::ERR_NOTSUPP);
                            return Some(v4::ERR_NOTSUPP);
                        }
                    }
                }
                x.put_u32(0);
                put_fixed(x, v4::SESSION);
                // The back channel on this connection, if asked for and callbacks can be made.
                let back = flags & crate::nfs4::FLAG_CONN_BACK_CHAN != 0 && self.callback.is_some();
                self.back = back.then_some(BackChannel {
                    peer: self.caller,
                    prog: cb_prog,
                    auth: cb_auth,
                    seq: 1,
                    up: true,
                });
                x.put_u32(seq).put_u32(if back {
                    crate::nfs4::FLAG_CONN_BACK_CHAN
                } else {
                    0
                });
                for c in chans {
                    for w in c {
                        x.put_u32(w);
                    }
                    x.put_u32(0);
                }
            }
            op::RECLAIM_COMPLETE => {
                r.u32().ok()?;
                // The session is the client's by now (RECLAIM_COMPLETE follows CREATE_SESSION's
                // reply): its back channel is probed with CB_SEQUENCE alone before the next
                // call is answered (not from here: Linux's client answers NFS4ERR_DELAY until
                // this completes the session's setup).
                self.probe_due = self.back.is_some();
                x.put_u32(0);
            }
            op::DESTROY_SESSION => {
                r.fixed(16).ok()?;
                self.back = None;
                self.probe_due = false;
                self.delegated = false;
                x.put_u32(0);
            }
            op::DESTROY_CLIENTID => {
                r.u64().ok()?;
                x.put_u32(0);
            }
            op::PUTFH => {
                let fh = r.opaque(128).ok()?;
                *cur = [FH_READ, FH_WRITE, FH_DIR, ROOT, FH_LINK, FH_DELEG]
                    .into_iter()
                    .find(|k| *k == fh && self.attr(k).is_some());
                let status = if cur.is_some() { 0 } else { v4::ERR_STALE };
                x.put_u32(status);
                return Some(status);
            }
            op::CREATE | op::GETFH | op::READLINK | op::REMOVE => {
                return self.link_op4(opnum, r, x, cur)
            }
            op::OPEN | op::DELEGRETURN | op::CLOSE => {
                let Some(fh) = *cur else {
                    x.put_u32(v4::ERR_NOFILEHANDLE);
                    return Some(v4::ERR_NOFILEHANDLE);
                };
                return self.state_op4(opnum, fh, r, x, cur);
            }
            op::READ | op::WRITE => {
                let Some(fh) = *cur else {
                    x.put_u32(v4::ERR_NOFILEHANDLE);
                    return Some(v4::ERR_NOFILEHANDLE);
                };
                return self.file_op4(opnum, fh, r, x);
            }
            _ => return self.op41(opnum, r, x, cur, saved),
        }
        Some(0)
    }

    /// The operations on the probe's link: CREATE of it (NF4LNK, in the root, named
    /// [`LINK_NAME`]), GETFH, READLINK (the target a DDP piece) and REMOVE of it.
    fn link_op4(
        &mut self,
        opnum: u32,
        r: &mut Reader<'_>,
        x: &mut XdrBuilder,
        cur: &mut Option<&'static [u8]>,
    ) -> Option<u32> {
        const ERR_NOENT: u32 = 2;
        const ERR_ACCESS: u32 = 13;
        const ERR_EXIST: u32 = 17;
        const ERR_INVAL: u32 = 22;
        let Some(fh) = *cur else {
            x.put_u32(v4::ERR_NOFILEHANDLE);
            return Some(v4::ERR_NOFILEHANDLE);
        };
        let status = match opnum {
            op::CREATE => {
                if r.u32().ok()? != crate::nfs4::NF4LNK {
                    x.put_u32(v4::ERR_NOTSUPP);
                    return Some(v4::ERR_NOTSUPP);
                }
                let target = r.opaque(nfs3::MAXPATHLEN).ok()?;
                let name = r.opaque(nfs3::NAME_MAX).ok()?;
                let words = r.u32().ok()?;
                r.fixed(4 * words.min(8) as usize).ok()?;
                r.opaque(1024).ok()?;
                match (fh == ROOT && name == LINK_NAME.as_bytes(), &self.link) {
                    (false, _) => ERR_ACCESS,
                    (true, Some(_)) => ERR_EXIST,
                    (true, None) => {
                        self.link = Some(target.to_vec());
                        *cur = Some(FH_LINK);
                        x.put_u32(0);
                        put_change_info(x);
                        x.put_u32(0); // no attributes set
                        return Some(0);
                    }
                }
            }
            op::GETFH => {
                x.put_u32(0).put_opaque(fh);
                return Some(0);
            }
            op::READLINK => match self.link.as_ref().filter(|_| fh == FH_LINK) {
                Some(target) => {
                    x.put_u32(0).put_ddp_opaque(target);
                    return Some(0);
                }
                None => ERR_INVAL,
            },
            _ => {
                let name = r.opaque(nfs3::NAME_MAX).ok()?;
                if fh != ROOT || name != LINK_NAME.as_bytes() || self.link.is_none() {
                    ERR_NOENT
                } else {
                    self.link = None;
                    x.put_u32(0);
                    put_change_info(x);
                    return Some(0);
                }
            }
        };
        x.put_u32(status);
        Some(status)
    }

    /// OPEN of an existing file by handle (CLAIM_FH: file `fh`) or by name in the root
    /// (CLAIM_NULL: `fh` the root; the file becomes the current handle `cur`), with a read
    /// delegation on `deleg.bin` opened for reading while the back channel is up; DELEGRETURN
    /// and CLOSE of file `fh`.
    fn state_op4(
        &mut self,
        opnum: u32,
        fh: &'static [u8],
        r: &mut Reader<'_>,
        x: &mut XdrBuilder,
        cur: &mut Option<&'static [u8]>,
    ) -> Option<u32> {
        const ERR_BAD_STATEID: u32 = 10_025;
        const CLAIM_NULL: u32 = 0;
        const CLAIM_FH: u32 = 4;
        let status = match opnum {
            op::OPEN => {
                r.u32().ok()?;
                let access = r.u32().ok()?;
                r.u32().ok()?;
                r.u64().ok()?;
                r.opaque(1024).ok()?;
                // OPEN4_NOCREATE only.
                if r.u32().ok()? != 0 {
                    x.put_u32(v4::ERR_NOTSUPP);
                    return Some(v4::ERR_NOTSUPP);
                }
                let fh = match r.u32().ok()? {
                    CLAIM_FH => fh,
                    CLAIM_NULL => {
                        let name = r.opaque(1024).ok()?;
                        let found = (fh == ROOT).then(|| self.root_entry(name)).flatten();
                        let Some(file) = found else {
                            x.put_u32(2); // NFS4ERR_NOENT
                            return Some(2);
                        };
                        *cur = Some(file);
                        file
                    }
                    _ => {
                        x.put_u32(v4::ERR_NOTSUPP);
                        return Some(v4::ERR_NOTSUPP);
                    }
                };
                x.put_u32(0);
                put_fixed(x, &OPEN_STATEID);
                put_change_info(x);
                x.put_u32(0).put_u32(0); // no result flags, no attributes set
                let reading = access & 0xff == 1;
                if fh == FH_DELEG && reading && self.back.is_some_and(|b| b.up) && !self.delegated {
                    self.delegated = true;
                    eprintln!("read delegation on deleg.bin granted");
                    // OPEN_DELEGATE_READ: its stateid, no recall, an empty ACE.
                    x.put_u32(1);
                    put_fixed(x, &DELEG_STATEID);
                    x.put_u32(0).put_u32(0).put_u32(0).put_u32(0).put_u32(0);
                } else if access & 0xff00 != 0 {
                    x.put_u32(3).put_u32(2); // asked for one: OPEN_DELEGATE_NONE_EXT, WND4_RESOURCE
                } else {
                    x.put_u32(0); // OPEN_DELEGATE_NONE
                }
                return Some(0);
            }
            op::DELEGRETURN => {
                let ok = r.fixed(16).ok()? == DELEG_STATEID && fh == FH_DELEG && self.delegated;
                self.delegated &= !ok;
                if ok {
                    eprintln!("delegation returned");
                    0
                } else {
                    ERR_BAD_STATEID
                }
            }
            _ => {
                r.u32().ok()?;
                if r.fixed(16).ok()? != OPEN_STATEID {
                    ERR_BAD_STATEID
                } else {
                    x.put_u32(0);
                    put_fixed(x, &OPEN_STATEID);
                    return Some(0);
                }
            }
        };
        x.put_u32(status);
        Some(status)
    }

    /// READ (the data a DDP piece) and WRITE on file `fh`.
    fn file_op4(
        &mut self,
        opnum: u32,
        fh: &'static [u8],
        r: &mut Reader<'_>,
        x: &mut XdrBuilder,
    ) -> Option<u32> {
        match opnum {
            op::READ => {
                r.fixed(16).ok()?;
                let off = r.u64().ok()?;
                let (data, eof) = self.read_at(fh, off, r.u32().ok()?)?;
                x.put_u32(0).put_u32(u32::from(eof));
                x.put_ddp_opaque(&data);
            }
            op::WRITE => {
                r.fixed(16).ok()?;
                let off = usize::try_from(r.u64().ok()?).ok()?;
                r.u32().ok()?;
                let data = r.opaque(MAX_WRITE).ok()?;
                if !self.write_at(fh, off, data)? {
                    x.put_u32(13); // NFS4ERR_ACCESS
                    return Some(13);
                }
                x.put_u32(0).put_u32(data.len() as u32).put_u32(2);
                x.put_u32(1).put_u32(2);
            }
            _ => {
                x.put_u32(v4::ERR_NOTSUPP);
                return Some(v4::ERR_NOTSUPP);
            }
        }
        Some(0)
    }
}

/// Answers one MOUNT v3 call record: NULL and UMNT succeed, MNT of `/export` gets [`ROOT`] and
/// AUTH_UNIX (anything else MNT3ERR_NOENT), other procedures PROC_UNAVAIL; `None` if the record
/// is not a call.
pub fn mount_reply(rec: &[u8]) -> Option<Vec<u8>> {
    const MNT: u32 = 1;
    const UMNT: u32 = 3;
    let mut r = Reader::new(rec);
    let xid = r.u32().ok()?;
    // Message type, RPC version, program, version: a MOUNT call is assumed.
    for _ in 0..4 {
        r.u32().ok()?;
    }
    let proc_ = r.u32().ok()?;
    for _ in 0..2 {
        r.u32().ok()?;
        r.opaque(400).ok()?;
    }
    let mut w = Writer::default();
    // REPLY, MSG_ACCEPTED, verifier AUTH_NONE.
    w.u32(xid).u32(1).u32(0).u32(0).u32(0);
    match proc_ {
        0 | UMNT => {
            w.u32(0);
        }
        MNT if r.opaque(1024).ok()? == b"/export" => {
            w.u32(0).u32(0).opaque(ROOT).u32(1).u32(1);
        }
        MNT => {
            w.u32(0).u32(2);
        }
        _ => {
            w.u32(3);
        }
    }
    let mut out = (0x8000_0000u32 | w.buf.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&w.buf);
    Some(out)
}

/// Serves MOUNT on `l` until it fails: each connection in turn, every call on it answered.
pub fn mountd(l: TcpListener) {
    for s in l.incoming() {
        let Ok(mut s) = s else { continue };
        let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(10)));
        while let Some(out) = read_record(&mut s).ok().and_then(|r| mount_reply(&r)) {
            if s.write_all(&out).is_err() {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcprpc::{call_header, mnt_res, parse_reply, MOUNT_PROG, MOUNT_VERS};

    /// A MOUNT call record with AUTH_UNIX credentials, as mount.nfs sends it.
    fn mount_call(xid: u32, proc_: u32, args: &[u8]) -> Vec<u8> {
        let mut w = call_header(xid, MOUNT_PROG, MOUNT_VERS, proc_);
        w.buf.extend_from_slice(args);
        w.buf
    }

    fn answer(rec: &[u8], xid: u32) -> Result<Vec<u8>, crate::tcprpc::RpcError> {
        let out = mount_reply(rec).expect("a call gets a reply");
        let (mark, body) = out.split_at(4);
        assert_eq!(
            u32::from_be_bytes(mark.try_into().unwrap()),
            0x8000_0000 | body.len() as u32,
            "one last fragment"
        );
        parse_reply(body, xid).map(<[u8]>::to_vec)
    }

    #[test]
    fn mountd_answers_null_mnt_and_umnt_as_mount_nfs_calls_them() {
        assert_eq!(answer(&mount_call(1, 0, &[]), 1).unwrap(), b"");
        let mut path = Writer::default();
        path.opaque(b"/export");
        let (fh, flavors) = mnt_res(&answer(&mount_call(2, 1, &path.buf), 2).unwrap()).unwrap();
        assert_eq!((fh.as_slice(), flavors.as_slice()), (ROOT, &[1u32][..]));
        let mut other = Writer::default();
        other.opaque(b"/elsewhere");
        assert!(mnt_res(&answer(&mount_call(3, 1, &other.buf), 3).unwrap()).is_err());
        assert_eq!(answer(&mount_call(4, 3, &path.buf), 4).unwrap(), b"");
        // EXPORT (5) is not served: PROC_UNAVAIL.
        assert!(answer(&mount_call(5, 5, &[]), 5).is_err());
        // A truncated call gets nothing.
        assert!(mount_reply(&mount_call(6, 1, &[])[..20]).is_none());
    }

    /// The reply to NFSv3 procedure `p` with arguments `args` (handle first), decoded up to its
    /// status and `post_op_attr`: what follows.
    fn proc_reply(fs: &mut Fs, p: u32, args: impl FnOnce(&mut XdrBuilder)) -> Vec<u8> {
        let mut a = XdrBuilder::default();
        args(&mut a);
        let a = a.to_full();
        let mut x = XdrBuilder::default();
        assert_eq!(fs.proc(p, &mut Reader::new(&a), &mut x), Some(true), "{p}");
        x.to_full()
    }

    fn ok_with_attrs(b: &[u8]) -> Reader<'_> {
        let mut r = Reader::new(b);
        assert_eq!(r.u32().unwrap(), 0, "NFS3_OK");
        assert!(nfs3::post_op_attr(&mut r).unwrap().is_some());
        r
    }

    #[test]
    fn the_procedures_a_linux_mount_needs_answer_with_attributes() {
        let mut fs = Fs::new(7, 4096, 3);
        let fh = |x: &mut XdrBuilder| {
            x.put_opaque(ROOT);
        };
        let b = proc_reply(&mut fs, nfs3::FSINFO, fh);
        let mut r = ok_with_attrs(&b);
        let w: Vec<u32> = (0..7).map(|_| r.u32().unwrap()).collect();
        assert_eq!(w, [MAX_IO, MAX_IO, 4096, MAX_IO, MAX_IO, 4096, 32768]);
        assert_eq!(r.u64().unwrap(), MAX_FILE as u64);
        assert_eq!(
            (r.u32().unwrap(), r.u32().unwrap(), r.u32().unwrap()),
            (0, 1, 0x1b)
        );
        assert_eq!(r.remaining(), 0);

        let b = proc_reply(&mut fs, nfs3::PATHCONF, fh);
        let mut r = ok_with_attrs(&b);
        assert_eq!((r.u32().unwrap(), r.u32().unwrap()), (1, nfs3::NAME_MAX));
        assert_eq!(r.remaining(), 16);

        let b = proc_reply(&mut fs, nfs3::FSSTAT, fh);
        let mut r = ok_with_attrs(&b);
        let total = r.u64().unwrap();
        assert!(total > 0 && r.u64().unwrap() <= total);
        assert_eq!(r.remaining(), 4 * 8 + 4);

        let b = proc_reply(&mut fs, nfs3::ACCESS, |x| {
            x.put_opaque(FH_READ).put_u32(0x3f);
        });
        let mut r = ok_with_attrs(&b);
        assert_eq!(r.u32().unwrap(), 0x3f, "everything asked for");
        let b = proc_reply(&mut fs, nfs3::ACCESS, |x| {
            x.put_opaque(b"no-such-handle").put_u32(1);
        });
        assert_eq!(Reader::new(&b).u32().unwrap(), 70, "NFS3ERR_STALE");

        let b = proc_reply(&mut fs, nfs3::COMMIT, |x| {
            x.put_opaque(FH_WRITE).put_u32(0).put_u32(0).put_u32(0);
        });
        let mut r = Reader::new(&b);
        assert_eq!(r.u32().unwrap(), 0);
        let wcc = nfs3::wcc_data(&mut r).unwrap();
        assert!(wcc.after.is_some());
        assert_eq!(
            (r.u32().unwrap(), r.u32().unwrap()),
            (WRITE_VERF[0], WRITE_VERF[1])
        );

        // READDIR pages through `dir/` by cookie: 3 names, then eof.
        let b = proc_reply(&mut fs, nfs3::READDIR, |x| {
            x.put_opaque(FH_DIR).put_u32(0).put_u32(0); // cookie 0
            x.put_u32(0).put_u32(0).put_u32(140); // verifier, count
        });
        let mut r = ok_with_attrs(&b);
        r.fixed(8).unwrap();
        let mut names = Vec::new();
        while r.bool().unwrap() {
            assert_eq!(r.u64().unwrap(), 100 + names.len() as u64, "fileid");
            names.push(String::from_utf8(r.opaque(255).unwrap().to_vec()).unwrap());
            assert_eq!(r.u64().unwrap(), names.len() as u64, "cookie");
        }
        assert!(
            !r.bool().unwrap(),
            "140 bytes hold one entry: not at the end"
        );
        assert_eq!(names, ["f00000"]);
        assert!(b.len() <= 140, "within count: {}", b.len());
        let b = proc_reply(&mut fs, nfs3::READDIR, |x| {
            x.put_opaque(FH_DIR).put_u32(0).put_u32(1);
            x.put_u32(0).put_u32(0).put_u32(4096);
        });
        let mut r = ok_with_attrs(&b);
        r.fixed(8).unwrap();
        let mut n = 0;
        while r.bool().unwrap() {
            r.u64().unwrap();
            r.opaque(255).unwrap();
            r.u64().unwrap();
            n += 1;
        }
        assert_eq!(
            (n, r.bool().unwrap()),
            (2, true),
            "from cookie 1: the other two, eof"
        );

        // `dir/`'s entries have attributes under the handles READDIRPLUS gives them.
        let b = proc_reply(&mut fs, nfs3::GETATTR, |x| {
            x.put_opaque(b"f00002");
        });
        let mut r = Reader::new(&b);
        assert_eq!(r.u32().unwrap(), 0);
        assert_eq!(nfs3::fattr3(&mut r).unwrap().ftype, NF3REG);
        let b = proc_reply(&mut fs, nfs3::GETATTR, |x| {
            x.put_opaque(b"f00003");
        });
        assert_eq!(
            Reader::new(&b).u32().unwrap(),
            70,
            "past the entries: stale"
        );
    }

    /// One NFSv4.1 COMPOUND of `n` operations (`ops` writes each number and its arguments)
    /// through `fs`: its status and the bytes after the status, tag and result count.
    fn compound4(fs: &mut Fs, n: u32, ops: impl FnOnce(&mut XdrBuilder)) -> (u32, Vec<u8>) {
        let mut a = XdrBuilder::default();
        a.put_opaque(b"").put_u32(1).put_u32(n);
        ops(&mut a);
        let a = a.to_full();
        let mut x = XdrBuilder::default();
        assert_eq!(fs.compound(1, &mut Reader::new(&a), &mut x), Some(true));
        let out = x.to_full();
        let mut r = Reader::new(&out);
        let status = r.u32().unwrap();
        r.opaque(64).unwrap();
        r.u32().unwrap();
        let rest = out.len() - r.remaining();
        (status, out[rest..].to_vec())
    }

    fn sequence_op(a: &mut XdrBuilder, seq: u32) {
        a.put_u32(op::SEQUENCE);
        put_fixed(a, v4::SESSION);
        a.put_u32(seq).put_u32(0).put_u32(0).put_u32(0);
    }

    /// SEQUENCE alone: its `sr_status_flags`.
    fn status_flags(fs: &mut Fs, seq: u32) -> u32 {
        let (st, res) = compound4(fs, 1, |a| sequence_op(a, seq));
        assert_eq!(st, 0);
        u32::from_be_bytes(res[res.len() - 4..].try_into().unwrap())
    }

    /// CREATE_SESSION asking for the back channel, then OPEN of `deleg.bin` for reading: the
    /// delegation type OPEN answered.
    fn session_and_open(fs: &mut Fs) -> u32 {
        let (st, res) = compound4(fs, 1, |a| {
            a.put_u32(op::CREATE_SESSION)
                .put_u32(0)
                .put_u32(1)
                .put_u32(1);
            a.put_u32(crate::nfs4::FLAG_CONN_BACK_CHAN);
            for _ in 0..2 {
                for w in [0, 4096, 4096, 0, 8, 16, 0] {
                    a.put_u32(w);
                }
            }
            a.put_u32(callback::PROG).put_u32(1).put_u32(0);
        });
        assert_eq!(st, 0);
        // Results: operation, status, session id, sequence, then the flags.
        assert_eq!(
            &res[28..32],
            &crate::nfs4::FLAG_CONN_BACK_CHAN.to_be_bytes()
        );
        let (st, res) = compound4(fs, 3, |a| {
            sequence_op(a, 1);
            a.put_u32(op::PUTFH).put_opaque(FH_DELEG);
            a.put_u32(op::OPEN).put_u32(0).put_u32(0x0101).put_u32(0);
            a.put_u32(0)
                .put_u32(1)
                .put_opaque(b"owner")
                .put_u32(0)
                .put_u32(4);
        });
        assert_eq!(st, 0);
        // In words: SEQUENCE's result 11 (number, status, 9 of resok), PUTFH's 2, then OPEN's
        // number and status, stateid 4, change_info 5, rflags and an empty attrset 2: the
        // delegation type next.
        let at = 4 * (11 + 2 + 2 + 4 + 5 + 2);
        u32::from_be_bytes(res[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn a_delegation_is_recalled_over_the_back_channel_and_an_unanswered_recall_marks_it_down() {
        for answered in [true, false] {
            let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let log = std::sync::Arc::clone(&seen);
            let mut fs =
                Fs::new(7, 4096, 3).with_callbacks(Box::new(move |peer, prog, p, _, args| {
                    let (accept, res, what) = callback::answer(p, args);
                    log.lock().unwrap().push((peer, prog, what));
                    (answered && accept == 0).then_some(res)
                }));
            fs.caller = 9;
            assert_eq!(session_and_open(&mut fs), 1, "OPEN_DELEGATE_READ");
            // An NFSv3 WRITE to the delegated file: JUKEBOX, after the recall.
            let b = proc_reply(&mut fs, nfs3::WRITE, |x| {
                x.put_opaque(FH_DELEG).put_u32(0).put_u32(0).put_u32(0);
                x.put_u32(FILE_SYNC).put_opaque(b"");
            });
            assert_eq!(Reader::new(&b).u32().unwrap(), nfs3::ERR_JUKEBOX);
            let recall = callback::Recall {
                stateid: DELEG_STATEID,
                truncate: false,
                fh: FH_DELEG.to_vec(),
            };
            assert_eq!(
                seen.lock().unwrap().as_slice(),
                [(
                    9,
                    callback::PROG,
                    callback::Seen::Compound {
                        session: *v4::SESSION,
                        seq: 1,
                        recall: Some(recall)
                    }
                )]
            );
            // SEQ4_STATUS_CB_PATH_DOWN only when the recall went unanswered.
            assert_eq!(status_flags(&mut fs, 2), u32::from(!answered));
        }
    }
}
