//! A tiny in-memory NFSv3-subset server (the procedures the probe uses) and a MOUNT v3 responder, for
//! end-to-end runs of the probe without a kernel server: through `shm-loopback` in the tests, or behind a
//! second rpcrdmad (`examples/miniserver.rs`). Not an NFS server: fixed names, no permissions.

use crate::nfs::pattern_at;
use crate::nfs3::{self, FILE_SYNC, NF3DIR, NF3REG};
use crate::tcprpc::read_record;
use crate::xdr::{Reader, Writer};
use rpcrdma_shm::client::{Call, ReplyBuilder, XdrBuilder};
use std::io::Write;
use std::net::TcpListener;

/// The export's root handle.
pub const ROOT: &[u8] = b"root-fh-0001";
const FH_READ: &[u8] = b"fh-read";
const FH_WRITE: &[u8] = b"fh-write";
const FH_DIR: &[u8] = b"fh-dir";
/// Largest WRITE accepted.
const MAX_WRITE: u32 = 4 << 20;
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

/// The file system: `read.bin` (pattern), `write.bin` (writable) and `dir/` with `entries` names.
#[derive(Debug)]
pub struct Fs {
    read: Vec<u8>,
    write: Vec<u8>,
    entries: u64,
}

impl Fs {
    /// `read.bin` holds `read_size` bytes of `nfs-probe gen --seed seed`.
    pub fn new(seed: u32, read_size: usize, entries: u64) -> Fs {
        Fs {
            read: pattern_at(seed, 0, read_size),
            write: Vec::new(),
            entries,
        }
    }

    fn attr(&self, fh: &[u8]) -> Option<(u32, u64, u64)> {
        match fh {
            ROOT => Some((NF3DIR, 4096, 1)),
            FH_READ => Some((NF3REG, self.read.len() as u64, 2)),
            FH_WRITE => Some((NF3REG, self.write.len() as u64, 3)),
            FH_DIR => Some((NF3DIR, 4096, 4)),
            _ => None,
        }
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

    /// Serves one call; malformed arguments get GARBAGE_ARGS, unknown procedures PROC_UNAVAIL.
    pub fn serve(&mut self, call: &Call<'_>, reply: &mut ReplyBuilder) {
        let mut r = Reader::new(call.args);
        match self.proc(call.proc_, &mut r, &mut reply.xdr) {
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
                let off = usize::try_from(r.u64().ok()?).unwrap_or(usize::MAX);
                let count = r.u32().ok()?.min(MAX_WRITE) as usize;
                let file = if fh == FH_READ {
                    &self.read
                } else {
                    &self.write
                };
                let start = off.min(file.len());
                let end = start.saturating_add(count).min(file.len());
                let data = file.get(start..end)?.to_vec();
                x.put_u32(0);
                self.post_op(x, fh);
                x.put_u32(data.len() as u32)
                    .put_u32(u32::from(end == file.len()))
                    .put_ddp_opaque(&data);
            }
            nfs3::WRITE => {
                let fh = r.opaque(nfs3::FHSIZE).ok()?;
                let off = usize::try_from(r.u64().ok()?).ok()?;
                let _count = r.u32().ok()?;
                let _stable = r.u32().ok()?;
                let data = r.opaque(MAX_WRITE).ok()?;
                let end = off.checked_add(data.len())?;
                if fh != FH_WRITE || end > MAX_FILE {
                    x.put_u32(13).put_u32(0).put_u32(0); // NFS3ERR_ACCES, empty wcc_data
                    return Some(true);
                }
                if self.write.len() < end {
                    self.write.resize(end, 0);
                }
                self.write.get_mut(off..end)?.copy_from_slice(data);
                x.put_u32(0).put_u32(0);
                self.post_op(x, fh);
                x.put_u32(data.len() as u32)
                    .put_u32(FILE_SYNC)
                    .put_u32(1)
                    .put_u32(2);
            }
            nfs3::READDIRPLUS => {
                let _dir = r.opaque(nfs3::FHSIZE).ok()?;
                let cookie = r.u64().ok()?;
                let _verf = r.fixed(8).ok()?;
                let _dircount = r.u32().ok()?;
                let maxcount = r.u32().ok()? as usize;
                x.put_u32(0);
                self.post_op(x, FH_DIR);
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

/// Answers one MNT call record: `/export` gets [`ROOT`] and AUTH_UNIX, anything else MNT3ERR_NOENT.
pub fn mount_reply(rec: &[u8]) -> Option<Vec<u8>> {
    let mut r = Reader::new(rec);
    let xid = r.u32().ok()?;
    for _ in 0..5 {
        r.u32().ok()?;
    }
    for _ in 0..2 {
        r.u32().ok()?;
        r.opaque(400).ok()?;
    }
    let path = r.opaque(1024).ok()?;
    let mut w = Writer::default();
    w.u32(xid).u32(1).u32(0).u32(0).u32(0).u32(0);
    if path == b"/export" {
        w.u32(0).opaque(ROOT).u32(1).u32(1);
    } else {
        w.u32(2);
    }
    let mut out = (0x8000_0000u32 | w.buf.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&w.buf);
    Some(out)
}

/// Serves MOUNT on `l` forever, one call per connection.
pub fn mountd(l: TcpListener) {
    for s in l.incoming() {
        let Ok(mut s) = s else { continue };
        if let Some(out) = read_record(&mut s).ok().and_then(|r| mount_reply(&r)) {
            let _ = s.write_all(&out);
        }
    }
}
