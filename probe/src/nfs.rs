//! NFSv3 calls through rpcrdmad's shared-memory API: READ data lands in a result buffer (a Write chunk),
//! WRITE data is a DDP-eligible piece (a Read chunk), large replies get a large reply buffer (a Reply chunk).

use crate::nfs3::{self, Fattr3, LookupOk, ReadOk, ReaddirplusOk, WriteOk};
use rpcrdma_shm::client::{CallBuilder, Reply, Ticket};
use rpcrdma_shm::Client;
use std::time::Duration;

/// Reduced-reply buffer for calls whose results are small (attributes, status, READ's
/// non-data part): 1 KiB holds any of them, as the Linux client's per-procedure reply sizes do.
/// Sizing it honestly keeps these replies inline (no Reply chunk against a 4 KiB inline
/// threshold), which matters beyond cost: Linux's svcrdma (seen on 6.1) drops the connection
/// when a call carries both a Write list and a Reply chunk shorter than the whole reply
/// *including* the Write chunk payload (`svc_rdma_encode_reply_chunk` returns -E2BIG).
pub const SMALL_REPLY: u32 = 1024;

/// An NFSv3 client over one daemon attachment and one peer.
#[derive(Debug)]
pub struct Nfs {
    /// The attachment.
    pub client: Client,
    /// Peer index of the NFS server.
    pub peer: u32,
    /// Per-call timeout.
    pub timeout: Duration,
    /// The daemon's app socket (a step may attach another app, such as the callback server).
    pub socket: String,
    /// AUTH_SYS `(uid, gid)` sent on every NFS call; `None`: AUTH_NONE.
    pub auth: Option<(u32, u32)>,
}

/// Probe errors are reported as text (each step prints its failure).
pub type R<T> = Result<T, String>;

fn status<T, E: std::fmt::Debug>(what: &str, r: nfs3::NfsResult<T, E>) -> R<T> {
    r.map_err(|(s, _)| format!("{what}: nfsstat3 {s}"))
}

impl Nfs {
    /// Attaches to the daemon at `socket` and resolves `peer`.
    pub fn connect(socket: &str, peer: &str, timeout: Duration) -> R<Nfs> {
        let client = Client::connect(socket).map_err(|e| format!("attach to {socket}: {e}"))?;
        let idx = client
            .peer(peer)
            .ok_or_else(|| format!("no peer {peer:?}; known: {:?}", client.peers()))?;
        Ok(Nfs {
            client,
            peer: idx,
            timeout,
            socket: socket.into(),
            auth: None,
        })
    }

    fn start(&mut self, proc_: u32) -> CallBuilder<'_> {
        self.call(nfs3::VERS, proc_)
    }

    /// A call of NFS version `vers` with this client's credential and a small reply buffer.
    pub(crate) fn call(&mut self, vers: u32, proc_: u32) -> CallBuilder<'_> {
        let auth = self.auth;
        let mut c = self.client.call(self.peer, nfs3::PROG, vers, proc_);
        c.max_reply(SMALL_REPLY);
        if let Some((uid, gid)) = auth {
            c.auth_sys(uid, gid);
        }
        c
    }

    /// Waits for `t` and checks the RPC-level outcome.
    pub fn finish(&mut self, t: Ticket) -> R<Reply> {
        let r = self
            .client
            .wait(t, Some(self.timeout))
            .map_err(|e| format!("call failed: {e}"))?;
        check_accept(r)
    }

    /// NFSPROC3_NULL.
    pub fn null(&mut self) -> R<()> {
        let t = self.start(nfs3::NULL).submit().map_err(sub)?;
        let r = self.finish(t)?;
        if r.body.is_empty() {
            Ok(())
        } else {
            Err(format!("NULL returned {} bytes", r.body.len()))
        }
    }

    /// NFSPROC3_GETATTR.
    pub fn getattr(&mut self, fh: &[u8]) -> R<Fattr3> {
        let mut c = self.start(nfs3::GETATTR);
        nfs3::getattr_args(c.args(), fh);
        let t = c.submit().map_err(sub)?;
        let r = self.finish(t)?;
        status("GETATTR", nfs3::getattr_res(&r.body).map_err(xdr)?)
    }

    /// NFSPROC3_LOOKUP.
    pub fn lookup(&mut self, dir: &[u8], name: &str) -> R<LookupOk> {
        let mut c = self.start(nfs3::LOOKUP);
        nfs3::lookup_args(c.args(), dir, name);
        let t = c.submit().map_err(sub)?;
        let r = self.finish(t)?;
        status(
            &format!("LOOKUP {name}"),
            nfs3::lookup_res(&r.body).map_err(xdr)?,
        )
    }

    /// Submits a READ whose data goes to a result buffer of `count` bytes (a Write chunk).
    pub fn submit_read(&mut self, fh: &[u8], offset: u64, count: u32) -> R<Ticket> {
        let mut c = self.start(nfs3::READ);
        nfs3::read_args(c.args(), fh, offset, count);
        c.result_buffer(count.max(4));
        c.submit().map_err(sub)
    }

    /// Decodes a READ reply for `count` bytes; returns the result and the bytes placed by DDP.
    pub fn read_reply(r: &Reply, count: u32) -> R<(ReadOk, u32)> {
        let ok = status("READ", nfs3::read_res(&r.body, count).map_err(xdr)?)?;
        if ok.count as usize != ok.data.len() {
            return Err(format!(
                "READ count {} but {} data bytes",
                ok.count,
                ok.data.len()
            ));
        }
        Ok((ok, r.ddp_bytes))
    }

    /// NFSPROC3_READ (data via a Write chunk): the result and the bytes placed by DDP.
    pub fn read(&mut self, fh: &[u8], offset: u64, count: u32) -> R<(ReadOk, u32)> {
        let t = self.submit_read(fh, offset, count)?;
        let r = self.finish(t)?;
        Self::read_reply(&r, count)
    }

    /// NFSPROC3_WRITE, FILE_SYNC; `ddp` false sends the data inline (forcing a Long call when large).
    pub fn write(&mut self, fh: &[u8], offset: u64, data: &[u8], ddp: bool) -> R<WriteOk> {
        let mut c = self.start(nfs3::WRITE);
        nfs3::write_args(c.args(), fh, offset, data, ddp);
        let t = c.submit().map_err(sub)?;
        let r = self.finish(t)?;
        let ok = status("WRITE", nfs3::write_res(&r.body).map_err(xdr)?)?;
        if ok.count as usize != data.len() {
            return Err(format!("WRITE short: {} of {}", ok.count, data.len()));
        }
        Ok(ok)
    }

    /// NFSPROC3_WRITE of `data` inline, FILE_SYNC: the `nfsstat3` it answered (0 when
    /// written whole), for the steps that expect an error such as NFS3ERR_JUKEBOX.
    pub fn write_status(&mut self, fh: &[u8], offset: u64, data: &[u8]) -> R<u32> {
        let mut c = self.start(nfs3::WRITE);
        nfs3::write_args(c.args(), fh, offset, data, false);
        let t = c.submit().map_err(sub)?;
        let r = self.finish(t)?;
        match nfs3::write_res(&r.body).map_err(xdr)? {
            Ok(ok) if ok.count as usize == data.len() => Ok(0),
            Ok(ok) => Err(format!("WRITE short: {} of {}", ok.count, data.len())),
            Err((s, _)) => Ok(s),
        }
    }

    /// NFSPROC3_SYMLINK: `name` in `dir` pointing at `target` (a Read chunk when `ddp` and
    /// long enough); the new link's handle, if the server returned one.
    pub fn symlink(
        &mut self,
        dir: &[u8],
        name: &str,
        target: &[u8],
        ddp: bool,
    ) -> R<Option<Vec<u8>>> {
        let mut c = self.start(nfs3::SYMLINK);
        nfs3::symlink_args(c.args(), dir, name, target, ddp);
        let t = c.submit().map_err(sub)?;
        let r = self.finish(t)?;
        status(
            &format!("SYMLINK {name}"),
            nfs3::symlink_res(&r.body).map_err(xdr)?,
        )
    }

    /// NFSPROC3_READLINK with a result buffer for the target (a Write chunk): the target and
    /// the bytes placed by DDP.
    pub fn readlink(&mut self, fh: &[u8]) -> R<(Vec<u8>, u32)> {
        let mut c = self.start(nfs3::READLINK);
        nfs3::readlink_args(c.args(), fh);
        c.result_buffer(nfs3::MAXPATHLEN);
        let t = c.submit().map_err(sub)?;
        let r = self.finish(t)?;
        let target = status(
            "READLINK",
            nfs3::readlink_res(&r.body, nfs3::MAXPATHLEN).map_err(xdr)?,
        )?;
        Ok((target, r.ddp_bytes))
    }

    /// NFSPROC3_REMOVE of `name` in `dir`; false if there was no such name.
    pub fn remove(&mut self, dir: &[u8], name: &str) -> R<bool> {
        let mut c = self.start(nfs3::REMOVE);
        nfs3::lookup_args(c.args(), dir, name);
        let t = c.submit().map_err(sub)?;
        let r = self.finish(t)?;
        match nfs3::remove_res(&r.body).map_err(xdr)? {
            Ok(_) => Ok(true),
            Err((nfs3::ERR_NOENT, _)) => Ok(false),
            Err((s, _)) => Err(format!("REMOVE {name}: nfsstat3 {s}")),
        }
    }

    /// NFSPROC3_READDIRPLUS with a reply buffer of `maxcount` plus headroom (a Reply chunk when large).
    pub fn readdirplus(
        &mut self,
        dir: &[u8],
        cookie: u64,
        verf: [u8; 8],
        maxcount: u32,
    ) -> R<ReaddirplusOk> {
        let mut c = self.start(nfs3::READDIRPLUS);
        nfs3::readdirplus_args(c.args(), dir, cookie, verf, maxcount, maxcount);
        c.max_reply(maxcount.saturating_add(SMALL_REPLY));
        let t = c.submit().map_err(sub)?;
        let r = self.finish(t)?;
        status("READDIRPLUS", nfs3::readdirplus_res(&r.body).map_err(xdr)?)
    }
}

/// Fails a reply whose accept_stat is not SUCCESS.
pub fn check_accept(r: Reply) -> R<Reply> {
    if r.accept_stat == 0 {
        Ok(r)
    } else {
        Err(format!("accept_stat {}", r.accept_stat))
    }
}

fn sub(e: rpcrdma_shm::client::Error) -> String {
    format!("submit failed: {e}")
}

fn xdr(e: crate::xdr::XdrError) -> String {
    format!("bad reply: {e}")
}

/// Byte `i` of a file made by `nfs-probe gen --seed S`: `(S + i*31 + (i >> 8)) & 0xff` (the RDMATEST
/// pattern of spec/TESTPROG.md, indexed by file offset).
pub fn pattern_at(seed: u32, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|k| {
            let i = offset.wrapping_add(k);
            u64::from(seed)
                .wrapping_add(i.wrapping_mul(31))
                .wrapping_add(i >> 8) as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_at_matches_the_rdmatest_pattern_at_any_offset() {
        let whole = rpcrdma_shm::rdmatest::pattern(7, 5000);
        assert_eq!(pattern_at(7, 0, 5000), whole);
        assert_eq!(pattern_at(7, 1234, 100), whole[1234..1334].to_vec());
    }
}
