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
    ///
    /// The common case, AUTH_NONE credential and verifier (both empty), has a fixed layout of
    /// ten words and is read from it; anything else goes to
    /// [`parse_general`](Self::parse_general), which gives the same answer for every input
    /// (`tests/fast_path.rs`).
    #[inline]
    pub fn parse(msg: &[u8]) -> Result<Self, Error> {
        const LEN: usize = 40;
        if let Some(b) = msg.first_chunk::<LEN>() {
            let w = |k: usize| {
                let at = 4 * k;
                u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
            };
            // msg_type CALL, rpcvers 2, then (flavor 0, length 0) twice.
            if (w(1), w(2), w(6), w(7), w(8), w(9)) == (0, 2, 0, 0, 0, 0) {
                return Ok(CallHeader {
                    xid: w(0),
                    prog: w(3),
                    vers: w(4),
                    proc: w(5),
                    cred_flavor: 0,
                    args_offset: LEN,
                });
            }
        }
        Self::parse_general(msg)
    }

    /// [`parse`](Self::parse) by the general decoder, for any credential and verifier.
    pub fn parse_general(msg: &[u8]) -> Result<Self, Error> {
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
