//! ONC RPC (RFC 5531) over TCP with record marking, enough for PORTMAP GETPORT and MOUNT v3 MNT.

use crate::xdr::{Reader, Writer, XdrError};
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// PORTMAP program, version 2.
pub const PMAP_PROG: u32 = 100_000;
/// MOUNT program.
pub const MOUNT_PROG: u32 = 100_005;
/// MOUNT version 3.
pub const MOUNT_VERS: u32 = 3;
/// Largest reply record accepted (a MNT or GETPORT reply is tiny).
pub const MAX_RECORD: usize = 64 << 10;

/// Why a TCP RPC failed.
#[derive(Debug)]
pub enum RpcError {
    /// Socket failure.
    Io(io::Error),
    /// A malformed reply.
    Xdr(XdrError),
    /// The reply's XID or direction was wrong, or a record was too large.
    Protocol(&'static str),
    /// MSG_DENIED with this reject_stat.
    Denied(u32),
    /// MSG_ACCEPTED with this non-SUCCESS accept_stat.
    Accept(u32),
    /// The MOUNT server answered with this mountstat3.
    Mount(u32),
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RpcError::Io(e) => write!(f, "{e}"),
            RpcError::Xdr(e) => write!(f, "{e}"),
            RpcError::Protocol(s) => write!(f, "RPC protocol: {s}"),
            RpcError::Denied(s) => write!(f, "RPC call denied (reject_stat {s})"),
            RpcError::Accept(s) => write!(f, "RPC accept_stat {s}"),
            RpcError::Mount(s) => write!(f, "MNT failed: mountstat3 {s}"),
        }
    }
}

impl std::error::Error for RpcError {}

impl From<io::Error> for RpcError {
    fn from(e: io::Error) -> Self {
        RpcError::Io(e)
    }
}

impl From<XdrError> for RpcError {
    fn from(e: XdrError) -> Self {
        RpcError::Xdr(e)
    }
}

/// Encodes a CALL header with AUTH_UNIX (uid 0, gid 0, machine "nfs-probe") and a NULL verifier.
pub fn call_header(xid: u32, prog: u32, vers: u32, proc_: u32) -> Writer {
    let mut cred = Writer::default();
    cred.u32(0).opaque(b"nfs-probe").u32(0).u32(0).u32(0);
    let mut w = Writer::default();
    w.u32(xid).u32(0).u32(2).u32(prog).u32(vers).u32(proc_);
    w.u32(1).opaque(&cred.buf).u32(0).u32(0);
    w
}

/// Checks a REPLY record for `xid` and returns the procedure's result bytes.
pub fn parse_reply(rec: &[u8], xid: u32) -> Result<&[u8], RpcError> {
    let mut r = Reader::new(rec);
    if r.u32()? != xid {
        return Err(RpcError::Protocol("reply XID does not match"));
    }
    if r.u32()? != 1 {
        return Err(RpcError::Protocol("not a REPLY"));
    }
    match r.u32()? {
        0 => {}
        1 => return Err(RpcError::Denied(r.u32()?)),
        v => return Err(XdrError::BadValue(v).into()),
    }
    let _flavor = r.u32()?;
    r.opaque(400)?;
    match r.u32()? {
        0 => {}
        s => return Err(RpcError::Accept(s)),
    }
    let used = rec.len() - r.remaining();
    Ok(rec.get(used..).unwrap_or_default())
}

/// Reads one record (all fragments), at most [`MAX_RECORD`] bytes.
pub fn read_record(s: &mut impl Read) -> Result<Vec<u8>, RpcError> {
    let mut out = Vec::new();
    loop {
        let mut h = [0u8; 4];
        s.read_exact(&mut h)?;
        let h = u32::from_be_bytes(h);
        let len = (h & 0x7fff_ffff) as usize;
        if out.len().saturating_add(len) > MAX_RECORD {
            return Err(RpcError::Protocol("record too large"));
        }
        let start = out.len();
        out.resize(start + len, 0);
        s.read_exact(&mut out[start..])?;
        if h & 0x8000_0000 != 0 {
            return Ok(out);
        }
    }
}

/// One call on a fresh TCP connection; returns the result bytes.
pub fn call(
    addr: SocketAddr,
    prog: u32,
    vers: u32,
    proc_: u32,
    args: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, RpcError> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let xid = std::process::id() ^ 0x5052_4f42;
    let mut w = call_header(xid, prog, vers, proc_);
    w.buf.extend_from_slice(args);
    let mut rec = (0x8000_0000u32 | w.buf.len() as u32).to_be_bytes().to_vec();
    rec.extend_from_slice(&w.buf);
    s.write_all(&rec)?;
    let reply = read_record(&mut s)?;
    Ok(parse_reply(&reply, xid)?.to_vec())
}

/// PMAPPROC_GETPORT for `prog`/`vers` over TCP; 0 means not registered.
pub fn getport(host: SocketAddr, prog: u32, vers: u32, timeout: Duration) -> Result<u16, RpcError> {
    let mut a = Writer::default();
    a.u32(prog).u32(vers).u32(6).u32(0);
    let res = call(host, PMAP_PROG, 2, 3, &a.buf, timeout)?;
    let port = Reader::new(&res).u32()?;
    u16::try_from(port).map_err(|_| RpcError::Protocol("GETPORT returned a port above 65535"))
}

/// Decodes `mountres3`: the root handle and the server's auth flavors.
pub fn mnt_res(b: &[u8]) -> Result<(Vec<u8>, Vec<u32>), RpcError> {
    let mut r = Reader::new(b);
    match r.u32()? {
        0 => {}
        s => return Err(RpcError::Mount(s)),
    }
    let fh = r.opaque(crate::nfs3::FHSIZE)?.to_vec();
    let n = r.u32()?;
    if n as usize > r.remaining() / 4 {
        return Err(XdrError::TooLong(n).into());
    }
    let flavors = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
    Ok((fh, flavors))
}

/// MOUNTPROC3_MNT of `path` at `addr`: the export's root handle and auth flavors.
pub fn mount(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<(Vec<u8>, Vec<u32>), RpcError> {
    let mut a = Writer::default();
    a.opaque(path.as_bytes());
    mnt_res(&call(addr, MOUNT_PROG, MOUNT_VERS, 1, &a.buf, timeout)?)
}
