//! The few ONC RPC (RFC 5531) fields the transport needs from a Payload stream: the XID,
//! the message type, and a call's program, version, procedure, credential flavor and argument
//! offset.

use crate::xdr::Reader;
use crate::{Error, MsgType};

/// Largest credential or verifier body allowed by RFC 5531 (`opaque body<400>`).
pub const MAX_AUTH_LEN: usize = 400;
/// The RPCSEC_GSS authentication flavor (RFC 2203).
pub const RPCSEC_GSS: u32 = 6;

/// The message type of an RPC message (the word after the XID), if readable.
pub fn msg_type(msg: &[u8]) -> Option<MsgType> {
    match u32::from_be_bytes(*msg.get(4..)?.first_chunk::<4>()?) {
        0 => Some(MsgType::Call),
        1 => Some(MsgType::Reply),
        _ => None,
    }
}

/// The routing fields of an RPC call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallHeader {
    /// XID.
    pub xid: u32,
    /// Program number.
    pub prog: u32,
    /// Program version.
    pub vers: u32,
    /// Procedure number.
    pub proc: u32,
    /// Flavor of the credential (AUTH_NONE 0, AUTH_SYS 1, [`RPCSEC_GSS`] 6, ...).
    pub cred_flavor: u32,
    /// Offset of the procedure arguments from the first byte of the XID.
    pub args_offset: usize,
}

/// Skips an `opaque_auth`, returning its flavor.
fn auth(r: &mut Reader<'_>, what: &'static str) -> Result<u32, Error> {
    let flavor = r.u32(what)?;
    if r.opaque(what)?.len() > MAX_AUTH_LEN {
        return Err(Error::BadValue(what, MAX_AUTH_LEN as u32 + 1));
    }
    Ok(flavor)
}

impl CallHeader {
    /// Decodes the call header at the start of `msg` (RPC version 2 only).
    pub fn parse(msg: &[u8]) -> Result<Self, Error> {
        let mut r = Reader::new(msg);
        let xid = r.u32("xid")?;
        match r.u32("msg_type")? {
            0 => {}
            v => return Err(Error::BadValue("msg_type", v)),
        }
        match r.u32("rpcvers")? {
            2 => {}
            v => return Err(Error::BadValue("rpcvers", v)),
        }
        let prog = r.u32("prog")?;
        let vers = r.u32("vers")?;
        let proc = r.u32("proc")?;
        let cred_flavor = auth(&mut r, "cred")?;
        auth(&mut r, "verf")?;
        Ok(CallHeader {
            xid,
            prog,
            vers,
            proc,
            cred_flavor,
            args_offset: r.position(),
        })
    }
}
