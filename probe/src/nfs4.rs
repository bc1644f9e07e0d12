//! A minimal NFSv4.1 client (RFC 8881) through rpcrdmad, enough to move file data through
//! chunks the way the NFSv4 Upper-Layer Binding (RFC 8267 §5) places it: a session
//! (EXCHANGE_ID, CREATE_SESSION), then SEQUENCE + PUTFH + READ with the READ's data in a
//! Write chunk, and SEQUENCE + PUTFH + WRITE + GETATTR with the WRITE's data in a Read chunk
//! and an operation after it; CREATE of a symbolic link whose target is a DDP piece, and
//! READLINK with the target in a Write chunk. File handles come from the NFSv3 side (Linux's
//! knfsd handles are the same for both versions); I/O uses the anonymous stateid, so no OPEN
//! state is kept.

use crate::nfs::{Nfs, R, SMALL_REPLY};
use crate::xdr::{Reader, Res, XdrError};
use rpcrdma_shm::client::{CallBuilder, XdrBuilder};

/// NFS version 4 (all minor versions).
pub const VERS: u32 = 4;
/// The COMPOUND procedure.
pub const COMPOUND: u32 = 1;
const MINOR: u32 = 1;

/// The operation numbers (`nfs_opnum4`), as the wire codec knows them.
pub use rpcrdma_proto::nfs4::op;

/// `nfs_ftype4` NF4LNK.
pub const NF4LNK: u32 = 5;
/// NFS4ERR_NOENT.
pub const ERR_NOENT: u32 = 2;
/// The largest NFSv4 file handle (NFS4_FHSIZE).
pub const FHSIZE: u32 = 128;
/// NFS4ERR_COMPLETE_ALREADY: RECLAIM_COMPLETE sent twice, harmless.
const ERR_COMPLETE_ALREADY: u32 = 10_054;
const FILE_SYNC4: u32 = 2;
/// FATTR4_SIZE, bit 4 of word 0.
pub const SIZE_MASK: u32 = 1 << 4;

/// `CREATE_SESSION4_FLAG_CONN_BACK_CHAN`: the session's connection also carries its back
/// channel (RFC 8881 §18.36; over RDMA, the backward direction of RFC 8167).
pub const FLAG_CONN_BACK_CHAN: u32 = 2;
/// `sr_status_flags` that say the server cannot reach the client's back channel
/// (SEQ4_STATUS_CB_PATH_DOWN, _CB_PATH_DOWN_SESSION, _BACKCHANNEL_FAULT).
pub const SEQ4_STATUS_CB_DOWN: u32 = 0x1 | 0x200 | 0x400;
/// OPEN4_SHARE_ACCESS_READ with OPEN4_SHARE_ACCESS_WANT_READ_DELEG.
const SHARE_READ_WANT_READ_DELEG: u32 = 0x0101;
/// `open_claim_type4` CLAIM_FH: open the file PUTFH named (NFSv4.1).
const CLAIM_FH: u32 = 4;
/// `open_delegation_type4`.
const OPEN_DELEGATE_READ: u32 = 1;
const OPEN_DELEGATE_NONE_EXT: u32 = 3;

/// A session on one NFSv4.1 server, its single slot used for every request.
#[derive(Debug)]
pub struct Session {
    clientid: u64,
    id: [u8; 16],
    seq: u32,
    /// The flags CREATE_SESSION answered (`csr_flags`).
    pub flags: u32,
}

impl Session {
    /// The session id.
    pub fn id(&self) -> [u8; 16] {
        self.id
    }
}

/// What OPEN gave: the open's stateid and a read delegation's, or why none.
#[derive(Debug)]
pub struct Opened {
    /// The open stateid.
    pub stateid: [u8; 16],
    /// The read delegation's stateid, or the server's reason for none (text).
    pub delegation: Result<[u8; 16], String>,
}

/// What a WRITE answered.
#[derive(Debug)]
pub struct Written {
    /// Bytes written.
    pub count: u32,
    /// The file size GETATTR reported after it.
    pub size: u64,
}

fn put_u64(x: &mut XdrBuilder, v: u64) {
    x.put_u32((v >> 32) as u32).put_u32(v as u32);
}

/// Fixed-length opaque `d`, zero-padded to a multiple of 4 (also: XDR already encoded, into a
/// call's arguments or a reply's results).
pub fn put_fixed(x: &mut XdrBuilder, d: &[u8]) {
    for w in d.chunks(4) {
        let mut b = [0u8; 4];
        b[..w.len()].copy_from_slice(w);
        x.put_u32(u32::from_be_bytes(b));
    }
}

/// Reads a COMPOUND4res up to its operations: fails on a COMPOUND error, naming the
/// first failed operation.
fn results(body: &[u8]) -> R<Reader<'_>> {
    let mut r = Reader::new(body);
    let status = r.u32().map_err(bad)?;
    r.opaque(1024).map_err(bad)?;
    let n = r.u32().map_err(bad)?;
    if status != 0 {
        // Find the failed operation for the message.
        let mut last = None;
        for _ in 0..n {
            let (Ok(op), Ok(st)) = (r.u32(), r.u32()) else {
                break;
            };
            last = Some((op, st));
            if st != 0 {
                break;
            }
            // The results of the successful operations before it are not stepped over.
            if op != op::SEQUENCE && op != op::PUTFH {
                break;
            }
            if op == op::SEQUENCE && r.fixed(36).is_err() {
                break;
            }
        }
        return Err(match last {
            Some((op, st)) if st != 0 => format!("COMPOUND failed: operation {op}, nfsstat4 {st}"),
            _ => format!("COMPOUND failed: nfsstat4 {status}"),
        });
    }
    Ok(r)
}

/// The next operation's number and status; `want` must be its number and the status OK.
fn expect_op(r: &mut Reader<'_>, want: u32) -> R<()> {
    let (got, st) = (r.u32().map_err(bad)?, r.u32().map_err(bad)?);
    if got != want || st != 0 {
        return Err(format!(
            "operation {got} (expected {want}) answered nfsstat4 {st}"
        ));
    }
    Ok(())
}

fn bad(e: XdrError) -> String {
    format!("bad COMPOUND reply: {e}")
}

/// `channel_attrs4`: header pad, request, response, cached response sizes, operations,
/// requests, no RDMA IRD.
fn channel(x: &mut XdrBuilder, req: u32, resp: u32, cached: u32, ops: u32, reqs: u32) {
    for w in [0, req, resp, cached, ops, reqs, 0] {
        x.put_u32(w);
    }
}

fn skip_channel(r: &mut Reader<'_>) -> Res<()> {
    r.fixed(24)?;
    let n = r.u32()?;
    r.fixed(4 * n.min(1) as usize)?;
    Ok(())
}

impl Nfs {
    fn compound(&mut self, ops: u32) -> CallBuilder<'_> {
        let mut c = self.call(VERS, COMPOUND);
        c.args().put_u32(0).put_u32(MINOR).put_u32(ops);
        c
    }

    /// EXCHANGE_ID and CREATE_SESSION (no back channel), then RECLAIM_COMPLETE.
    pub fn session(&mut self, owner: &[u8]) -> R<Session> {
        self.session_with(owner, 0)
    }

    /// [`session`](Self::session) asking for the session's back channel on this connection
    /// (the callback program [`crate::callback::PROG`], AUTH_NONE): the server's callbacks
    /// then come as backward-direction calls (RFC 8167). Whether the server took it is in
    /// the session's [`flags`](Session::flags).
    pub fn session_back_channel(&mut self, owner: &[u8]) -> R<Session> {
        self.session_with(owner, FLAG_CONN_BACK_CHAN)
    }

    fn session_with(&mut self, owner: &[u8], flags: u32) -> R<Session> {
        let mut c = self.compound(1);
        let x = c.args();
        x.put_u32(op::EXCHANGE_ID);
        put_fixed(x, &std::process::id().to_be_bytes().repeat(2));
        x.put_opaque(owner);
        // No flags, SP4_NONE, no implementation id.
        x.put_u32(0).put_u32(0).put_u32(0);
        let t = c.submit().map_err(|e| format!("submit failed: {e}"))?;
        let reply = self.finish(t)?;
        let mut r = results(&reply.body)?;
        expect_op(&mut r, op::EXCHANGE_ID)?;
        let clientid = r.u64().map_err(bad)?;
        let seq = r.u32().map_err(bad)?;

        let mut c = self.compound(1);
        let x = c.args();
        x.put_u32(op::CREATE_SESSION);
        put_u64(x, clientid);
        x.put_u32(seq).put_u32(flags);
        channel(x, 1_049_620, 1_049_480, 7584, 8, 16);
        channel(x, 4096, 4096, 0, 2, 16);
        // The callback program and one AUTH_NONE security parameter.
        x.put_u32(crate::callback::PROG).put_u32(1).put_u32(0);
        let t = c.submit().map_err(|e| format!("submit failed: {e}"))?;
        let reply = self.finish(t)?;
        let mut r = results(&reply.body)?;
        expect_op(&mut r, op::CREATE_SESSION)?;
        let mut id = [0u8; 16];
        id.copy_from_slice(r.fixed(16).map_err(bad)?);
        r.u32().map_err(bad)?;
        let flags = r.u32().map_err(bad)?;
        skip_channel(&mut r).map_err(bad)?;
        skip_channel(&mut r).map_err(bad)?;
        let mut s = Session {
            clientid,
            id,
            seq: 1,
            flags,
        };

        let mut c = self.compound(2);
        sequence(c.args(), &mut s);
        c.args().put_u32(op::RECLAIM_COMPLETE).put_u32(0);
        let t = c.submit().map_err(|e| format!("submit failed: {e}"))?;
        let reply = self.finish(t)?;
        let mut r = Reader::new(&reply.body);
        r.fixed(4).map_err(bad)?;
        r.opaque(1024).map_err(bad)?;
        r.u32().map_err(bad)?;
        expect_op(&mut r, op::SEQUENCE)?;
        r.fixed(36).map_err(bad)?;
        let (o, st) = (r.u32().map_err(bad)?, r.u32().map_err(bad)?);
        if o != op::RECLAIM_COMPLETE || (st != 0 && st != ERR_COMPLETE_ALREADY) {
            return Err(format!("RECLAIM_COMPLETE answered nfsstat4 {st}"));
        }
        Ok(s)
    }

    /// SEQUENCE + PUTFH + READ of `count` bytes at `offset` into a result buffer (a Write
    /// chunk); the data and the bytes that came by DDP.
    pub fn read4(
        &mut self,
        s: &mut Session,
        fh: &[u8],
        offset: u64,
        count: u32,
    ) -> R<(Vec<u8>, u32)> {
        let mut c = self.compound(3);
        io_head(c.args(), s, fh, op::READ, offset);
        c.args().put_u32(count);
        c.result_buffer(count.max(4));
        let t = c.submit().map_err(|e| format!("submit failed: {e}"))?;
        let reply = self.finish(t)?;
        let mut r = io_results(&reply.body, op::READ)?;
        r.bool().map_err(bad)?;
        let data = r.opaque(count).map_err(bad)?.to_vec();
        Ok((data, reply.ddp_bytes))
    }

    /// SEQUENCE + PUTFH + WRITE (FILE_SYNC4, the data a DDP piece: a Read chunk) + GETATTR
    /// of the size, an operation after the chunk's place.
    pub fn write4(&mut self, s: &mut Session, fh: &[u8], offset: u64, data: &[u8]) -> R<Written> {
        let mut c = self.compound(4);
        let x = c.args();
        io_head(x, s, fh, op::WRITE, offset);
        x.put_u32(FILE_SYNC4).put_ddp_opaque(data);
        x.put_u32(op::GETATTR).put_u32(1).put_u32(SIZE_MASK);
        let t = c.submit().map_err(|e| format!("submit failed: {e}"))?;
        let reply = self.finish(t)?;
        let mut r = io_results(&reply.body, op::WRITE)?;
        let count = r.u32().map_err(bad)?;
        r.fixed(12).map_err(bad)?;
        expect_op(&mut r, op::GETATTR)?;
        let words = r.u32().map_err(bad)?;
        let mask = r.fixed(4 * words.min(8) as usize).map_err(bad)?;
        let vals = r.opaque(1024).map_err(bad)?;
        if mask.get(..4) != Some(&SIZE_MASK.to_be_bytes()[..]) || vals.len() != 8 {
            return Err(format!(
                "GETATTR answered mask {mask:?}, {} value bytes",
                vals.len()
            ));
        }
        let size = u64::from_be_bytes(vals.try_into().map_err(|_| "size")?);
        Ok(Written { count, size })
    }

    /// SEQUENCE + PUTFH `dir` + CREATE of a symbolic link `name` to `target` (the target a DDP
    /// piece: a Read chunk at `linkdata`, with the name and attributes after it) + GETFH: the
    /// new link's handle.
    pub fn symlink4(
        &mut self,
        s: &mut Session,
        dir: &[u8],
        name: &str,
        target: &[u8],
    ) -> R<Vec<u8>> {
        let mut c = self.compound(4);
        let x = c.args();
        sequence(x, s);
        x.put_u32(op::PUTFH).put_opaque(dir);
        x.put_u32(op::CREATE).put_u32(NF4LNK).put_ddp_opaque(target);
        // The name, then no attributes (an empty bitmap, an empty attribute list).
        x.put_opaque(name.as_bytes()).put_u32(0).put_u32(0);
        x.put_u32(op::GETFH);
        let t = c.submit().map_err(|e| format!("submit failed: {e}"))?;
        let reply = self.finish(t)?;
        let mut r = results(&reply.body)?;
        expect_op(&mut r, op::SEQUENCE)?;
        r.fixed(36).map_err(bad)?;
        expect_op(&mut r, op::PUTFH)?;
        expect_op(&mut r, op::CREATE)?;
        // change_info4, then the attributes set.
        r.fixed(20).map_err(bad)?;
        let words = r.u32().map_err(bad)?;
        r.fixed(4 * words.min(8) as usize).map_err(bad)?;
        expect_op(&mut r, op::GETFH)?;
        Ok(r.opaque(FHSIZE).map_err(bad)?.to_vec())
    }

    /// SEQUENCE + PUTFH `fh` + READLINK, with a result buffer for the target (a Write chunk)
    /// when `ddp`, else with room for it in the reply: the target and the bytes that came by
    /// DDP.
    pub fn readlink4(&mut self, s: &mut Session, fh: &[u8], ddp: bool) -> R<(Vec<u8>, u32)> {
        let mut c = self.compound(3);
        sequence(c.args(), s);
        c.args()
            .put_u32(op::PUTFH)
            .put_opaque(fh)
            .put_u32(op::READLINK);
        if ddp {
            c.result_buffer(crate::nfs3::MAXPATHLEN);
        } else {
            c.max_reply(crate::nfs3::MAXPATHLEN + SMALL_REPLY);
        }
        let t = c.submit().map_err(|e| format!("submit failed: {e}"))?;
        let reply = self.finish(t)?;
        let mut r = io_results(&reply.body, op::READLINK)?;
        let target = r.opaque(crate::nfs3::MAXPATHLEN).map_err(bad)?.to_vec();
        Ok((target, reply.ddp_bytes))
    }

    /// SEQUENCE + PUTFH `dir` + REMOVE `name`; false if there was no such name.
    pub fn remove4(&mut self, s: &mut Session, dir: &[u8], name: &str) -> R<bool> {
        let mut c = self.compound(3);
        sequence(c.args(), s);
        c.args().put_u32(op::PUTFH).put_opaque(dir);
        c.args().put_u32(op::REMOVE).put_opaque(name.as_bytes());
        let t = c.submit().map_err(|e| format!("submit failed: {e}"))?;
        let reply = self.finish(t)?;
        // Not `results`: a REMOVE that found no such name fails the COMPOUND.
        let mut r = Reader::new(&reply.body);
        r.u32().map_err(bad)?;
        r.opaque(1024).map_err(bad)?;
        r.u32().map_err(bad)?;
        expect_op(&mut r, op::SEQUENCE)?;
        r.fixed(36).map_err(bad)?;
        expect_op(&mut r, op::PUTFH)?;
        match (r.u32().map_err(bad)?, r.u32().map_err(bad)?) {
            (op::REMOVE, 0) => Ok(true),
            (op::REMOVE, ERR_NOENT) => Ok(false),
            (o, st) => Err(format!(
                "REMOVE {name}: operation {o} answered nfsstat4 {st}"
            )),
        }
    }

    /// SEQUENCE alone: the server's `sr_status_flags` (RFC 8881 §18.46.3).
    pub fn sequence_flags(&mut self, s: &mut Session) -> R<u32> {
        let mut c = self.compound(1);
        sequence(c.args(), s);
        let t = c.submit().map_err(|e| format!("submit failed: {e}"))?;
        let reply = self.finish(t)?;
        let mut r = results(&reply.body)?;
        expect_op(&mut r, op::SEQUENCE)?;
        r.fixed(32).map_err(bad)?;
        r.u32().map_err(bad)
    }

    /// SEQUENCE + PUTFH `fh` + OPEN of that file (CLAIM_FH) for reading, asking for a read
    /// delegation (OPEN4_SHARE_ACCESS_WANT_READ_DELEG), as the open owner `owner`.
    pub fn open_read(&mut self, s: &mut Session, fh: &[u8], owner: &[u8]) -> R<Opened> {
        let mut c = self.compound(3);
        let x = c.args();
        sequence(x, s);
        x.put_u32(op::PUTFH).put_opaque(fh);
        // seqid (unused in 4.1), share access and deny, open_owner4, OPEN4_NOCREATE, claim.
        x.put_u32(op::OPEN)
            .put_u32(0)
            .put_u32(SHARE_READ_WANT_READ_DELEG)
            .put_u32(0);
        put_u64(x, s.clientid);
        x.put_opaque(owner).put_u32(0).put_u32(CLAIM_FH);
        let t = c.submit().map_err(|e| format!("submit failed: {e}"))?;
        let reply = self.finish(t)?;
        let mut r = io_results(&reply.body, op::OPEN)?;
        let mut stateid = [0u8; 16];
        stateid.copy_from_slice(r.fixed(16).map_err(bad)?);
        // change_info4, rflags, the attributes set.
        r.fixed(24).map_err(bad)?;
        let words = r.u32().map_err(bad)?;
        r.fixed(4 * words.min(8) as usize).map_err(bad)?;
        let delegation = match r.u32().map_err(bad)? {
            OPEN_DELEGATE_READ => {
                let mut d = [0u8; 16];
                d.copy_from_slice(r.fixed(16).map_err(bad)?);
                Ok(d)
            }
            OPEN_DELEGATE_NONE_EXT => Err(format!(
                "no delegation (OPEN_DELEGATE_NONE_EXT, why_no_delegation4 {})",
                r.u32().map_err(bad)?
            )),
            t => Err(format!("no read delegation (open_delegation_type4 {t})")),
        };
        Ok(Opened {
            stateid,
            delegation,
        })
    }

    /// SEQUENCE + PUTFH `fh` + DELEGRETURN of delegation `stateid`.
    pub fn delegreturn(&mut self, s: &mut Session, fh: &[u8], stateid: &[u8; 16]) -> R<()> {
        self.stateid_op(s, fh, op::DELEGRETURN, &[], stateid)
    }

    /// SEQUENCE + PUTFH `fh` + CLOSE of open `stateid`.
    pub fn close(&mut self, s: &mut Session, fh: &[u8], stateid: &[u8; 16]) -> R<()> {
        // CLOSE's seqid, unused in 4.1, before the stateid.
        self.stateid_op(s, fh, op::CLOSE, &[0], stateid)
    }

    /// SEQUENCE + PUTFH `fh` + operation `o` with words `pre` then `stateid`; its status must
    /// be NFS4_OK (CLOSE's result stateid is not read).
    fn stateid_op(
        &mut self,
        s: &mut Session,
        fh: &[u8],
        o: u32,
        pre: &[u32],
        stateid: &[u8; 16],
    ) -> R<()> {
        let mut c = self.compound(3);
        let x = c.args();
        sequence(x, s);
        x.put_u32(op::PUTFH).put_opaque(fh).put_u32(o);
        pre.iter().for_each(|&w| {
            x.put_u32(w);
        });
        put_fixed(x, stateid);
        let t = c.submit().map_err(|e| format!("submit failed: {e}"))?;
        let reply = self.finish(t)?;
        io_results(&reply.body, o).map(|_| ())
    }

    /// DESTROY_SESSION, then DESTROY_CLIENTID.
    pub fn end_session(&mut self, s: Session) -> R<()> {
        let mut c = self.compound(1);
        c.args().put_u32(op::DESTROY_SESSION);
        put_fixed(c.args(), &s.id);
        let t = c.submit().map_err(|e| format!("submit failed: {e}"))?;
        let reply = self.finish(t)?;
        expect_op(&mut results(&reply.body)?, op::DESTROY_SESSION)?;
        let mut c = self.compound(1);
        c.args().put_u32(op::DESTROY_CLIENTID);
        put_u64(c.args(), s.clientid);
        let t = c.submit().map_err(|e| format!("submit failed: {e}"))?;
        let reply = self.finish(t)?;
        expect_op(&mut results(&reply.body)?, op::DESTROY_CLIENTID)
    }
}

/// SEQUENCE, PUTFH `fh`, then operation `op` (READ or WRITE) up to its offset, with the
/// anonymous stateid.
fn io_head(x: &mut XdrBuilder, s: &mut Session, fh: &[u8], op: u32, offset: u64) {
    sequence(x, s);
    x.put_u32(op::PUTFH).put_opaque(fh);
    x.put_u32(op);
    put_fixed(x, &[0; 16]);
    put_u64(x, offset);
}

/// The results of a SEQUENCE + PUTFH + `want` COMPOUND ([`io_head`] and others), read up to
/// `want`'s result.
fn io_results(body: &[u8], want: u32) -> R<Reader<'_>> {
    let mut r = results(body)?;
    expect_op(&mut r, op::SEQUENCE)?;
    r.fixed(36).map_err(bad)?;
    expect_op(&mut r, op::PUTFH)?;
    expect_op(&mut r, want)?;
    Ok(r)
}

/// SEQUENCE on slot 0 with the session's next sequence id.
fn sequence(x: &mut XdrBuilder, s: &mut Session) {
    x.put_u32(op::SEQUENCE);
    put_fixed(x, &s.id);
    x.put_u32(s.seq).put_u32(0).put_u32(0).put_u32(0);
    s.seq = s.seq.wrapping_add(1);
}
