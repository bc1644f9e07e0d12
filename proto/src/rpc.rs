//! The few ONC RPC (RFC 5531) fields the transport needs from a Payload stream: the XID,
//! the message type, and a call's program, version, procedure, credential flavor and argument
//! offset.

use crate::xdr::Reader;
use crate::{Error, MsgType};

/// Largest credential or verifier body allowed by RFC 5531 (`opaque body<400>`).
pub const MAX_AUTH_LEN: usize = 400;
/// The RPCSEC_GSS authentication flavor (RFC 2203).
pub const RPCSEC_GSS: u32 = 6;
/// The AUTH_SYS authentication flavor (RFC 5531 §8.2, appendix A).
pub const AUTH_SYS: u32 = 1;

/// The identity an AUTH_SYS credential names: user and group. Encoded with stamp 0, an empty
/// machine name and no supplementary groups; decoded from any well-formed AUTH_SYS body
/// (machine name of at most 255 bytes, at most 16 groups, nothing after them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AuthSys {
    /// The caller's user id.
    pub uid: u32,
    /// The caller's group id.
    pub gid: u32,
}

impl AuthSys {
    /// Bytes of the `opaque_auth` [`encode`](Self::encode) writes.
    pub const ENCODED_LEN: usize = 28;

    /// The `opaque_auth` of this credential: flavor, body length, stamp, machine name, uid,
    /// gid, supplementary groups.
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let words = [AUTH_SYS, 20, 0, 0, self.uid, self.gid, 0];
        let mut b = [0u8; Self::ENCODED_LEN];
        for (d, w) in b.chunks_exact_mut(4).zip(words) {
            d.copy_from_slice(&w.to_be_bytes());
        }
        b
    }

    /// Decodes an AUTH_SYS credential body (`authsys_parms`); `None` unless it is well formed
    /// and whole.
    pub fn decode(body: &[u8]) -> Option<AuthSys> {
        let mut r = Reader::new(body);
        r.u32("stamp").ok()?;
        if r.opaque("machinename").ok()?.len() > 255 {
            return None;
        }
        let (uid, gid) = (r.u32("uid").ok()?, r.u32("gid").ok()?);
        let groups = r.u32("gids").ok()?;
        if groups > 16 {
            return None;
        }
        for _ in 0..groups {
            r.u32("gid").ok()?;
        }
        (r.position() == body.len()).then_some(AuthSys { uid, gid })
    }
}

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
    /// Flavor of the credential (AUTH_NONE 0, [`AUTH_SYS`] 1, [`RPCSEC_GSS`] 6, ...).
    pub cred_flavor: u32,
    /// The credential's identity when it is a well-formed AUTH_SYS one.
    pub auth_sys: Option<AuthSys>,
    /// Offset of the procedure arguments from the first byte of the XID.
    pub args_offset: usize,
}

/// Reads an `opaque_auth`: its flavor and body.
fn auth<'a>(r: &mut Reader<'a>, what: &'static str) -> Result<(u32, &'a [u8]), Error> {
    let flavor = r.u32(what)?;
    let body = r.opaque(what)?;
    if body.len() > MAX_AUTH_LEN {
        return Err(Error::BadValue(what, MAX_AUTH_LEN as u32 + 1));
    }
    Ok((flavor, body))
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
                    auth_sys: None,
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
        let (cred_flavor, cred) = auth(&mut r, "cred")?;
        auth(&mut r, "verf")?;
        Ok(CallHeader {
            xid,
            prog,
            vers,
            proc,
            cred_flavor,
            auth_sys: (cred_flavor == AUTH_SYS)
                .then(|| AuthSys::decode(cred))
                .flatten(),
            args_offset: r.position(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call header with `cred` as its credential and an AUTH_NONE verifier.
    fn call_with(cred: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        for w in [7u32, 0, 2, 100_003, 4, 1] {
            m.extend(w.to_be_bytes());
        }
        m.extend(cred);
        m.extend([0; 8]);
        m.extend(b"args");
        m
    }

    #[test]
    fn auth_sys_encodes_as_rfc_5531_and_decodes_back_from_a_call() {
        let a = AuthSys {
            uid: 1000,
            gid: 100,
        };
        let e = a.encode();
        let words: Vec<u32> = e
            .chunks(4)
            .map(|w| u32::from_be_bytes(w.try_into().unwrap()))
            .collect();
        assert_eq!(words, [1, 20, 0, 0, 1000, 100, 0]);
        let h = CallHeader::parse(&call_with(&e)).unwrap();
        assert_eq!((h.cred_flavor, h.auth_sys), (AUTH_SYS, Some(a)));
        assert_eq!(h.args_offset, 24 + AuthSys::ENCODED_LEN + 8);
    }

    #[test]
    fn a_linux_style_auth_sys_body_decodes_and_malformed_ones_do_not() {
        // Stamp, machine name "client" (padded), uid 0, gid 0, groups [0, 10].
        let mut body = Vec::new();
        for w in [0x1234u32, 6] {
            body.extend(w.to_be_bytes());
        }
        body.extend(b"client\0\0");
        for w in [0u32, 0, 2, 0, 10] {
            body.extend(w.to_be_bytes());
        }
        assert_eq!(AuthSys::decode(&body), Some(AuthSys { uid: 0, gid: 0 }));
        // Cut short, a byte left over, too many groups.
        assert_eq!(AuthSys::decode(&body[..body.len() - 4]), None);
        let mut long = body.clone();
        long.extend([0; 4]);
        assert_eq!(AuthSys::decode(&long), None);
        let mut many = body[..24].to_vec();
        many.extend(17u32.to_be_bytes());
        many.extend([0; 68]);
        assert_eq!(AuthSys::decode(&many), None);
        // In a call: flavor AUTH_SYS but a malformed body gives no identity.
        let mut cred = 1u32.to_be_bytes().to_vec();
        cred.extend(4u32.to_be_bytes());
        cred.extend([0; 4]);
        let h = CallHeader::parse(&call_with(&cred)).unwrap();
        assert_eq!((h.cred_flavor, h.auth_sys), (AUTH_SYS, None));
    }
}
