//! The ONC RPC (RFC 5531) headers the daemon writes and reads on behalf of apps: apps hand
//! over argument and result XDR only, so the engine builds call headers (AUTH_NONE, or
//! AUTH_SYS with the identity the app gave) and reply headers (AUTH_NONE verifier) and strips
//! the peer's.

use rpcrdma_proto::rpc::AuthSys;

/// Bytes of a call header with AUTH_NONE credential and verifier.
pub const CALL_HEADER_LEN: usize = 40;
/// Bytes of an accepted reply header with an AUTH_NONE verifier.
pub const REPLY_HEADER_LEN: usize = 24;
/// Largest reply header accepted (verifier body of at most 400 bytes, RFC 5531).
pub const MAX_REPLY_HEADER_LEN: usize = 24 + 400 + 8;

/// accept_stat SUCCESS.
pub const SUCCESS: u32 = 0;
/// accept_stat PROG_UNAVAIL.
pub const PROG_UNAVAIL: u32 = 1;
/// accept_stat GARBAGE_ARGS.
pub const GARBAGE_ARGS: u32 = 4;
/// accept_stat SYSTEM_ERR.
pub const SYSTEM_ERR: u32 = 5;

/// auth_stat AUTH_BADCRED (RFC 5531): what a server answers a credential flavor it lacks.
pub const AUTH_BADCRED: u32 = 1;
/// Bytes of a MSG_DENIED / AUTH_ERROR reply.
pub const DENIED_HEADER_LEN: usize = 20;

/// A rejected RPC reply for `xid`: MSG_DENIED, AUTH_ERROR with `auth_stat`.
pub fn auth_error_reply(xid: u32, auth_stat: u32) -> [u8; DENIED_HEADER_LEN] {
    let words = [xid, 1, 1, 1, auth_stat];
    let mut b = [0u8; DENIED_HEADER_LEN];
    for (d, w) in b.chunks_exact_mut(4).zip(words) {
        d.copy_from_slice(&w.to_be_bytes());
    }
    b
}

/// An RPC call header for `xid`, `prog`, `vers`, `proc_` with AUTH_NONE credentials.
#[inline]
pub fn call_header(xid: u32, prog: u32, vers: u32, proc_: u32) -> [u8; CALL_HEADER_LEN] {
    let words = [xid, 0, 2, prog, vers, proc_, 0, 0, 0, 0];
    let mut b = [0u8; CALL_HEADER_LEN];
    for (d, w) in b.chunks_exact_mut(4).zip(words) {
        d.copy_from_slice(&w.to_be_bytes());
    }
    b
}

/// Bytes of the longest call header the engine writes: an AUTH_SYS credential
/// ([`AuthSys::ENCODED_LEN`]) and an AUTH_NONE verifier.
pub const MAX_CALL_HEADER_LEN: usize = 24 + AuthSys::ENCODED_LEN + 8;

/// An RPC call header for `xid`, `prog`, `vers`, `proc_` with credential `auth` (AUTH_SYS) and
/// an AUTH_NONE verifier.
#[inline]
pub fn call_header_sys(
    xid: u32,
    prog: u32,
    vers: u32,
    proc_: u32,
    auth: AuthSys,
) -> [u8; MAX_CALL_HEADER_LEN] {
    let mut b = [0u8; MAX_CALL_HEADER_LEN];
    // AUTH_NONE's header up to its credential, then the AUTH_SYS one.
    b[..24].copy_from_slice(&call_header(xid, prog, vers, proc_)[..24]);
    b[24..24 + AuthSys::ENCODED_LEN].copy_from_slice(&auth.encode());
    // The verifier (AUTH_NONE, empty) is the zeros already there.
    b
}

/// An accepted RPC reply header for `xid` with an AUTH_NONE verifier and `accept_stat`.
#[inline]
pub fn reply_header(xid: u32, accept_stat: u32) -> [u8; REPLY_HEADER_LEN] {
    let mut b = [0u8; REPLY_HEADER_LEN];
    put_reply_header(&mut b, xid, accept_stat);
    b
}

/// Writes [`reply_header`]`(xid, accept_stat)` into `dst` (its first
/// [`REPLY_HEADER_LEN`] bytes; a shorter `dst` gets what fits).
#[inline]
pub fn put_reply_header(dst: &mut [u8], xid: u32, accept_stat: u32) {
    let words = [xid, 1, 0, 0, 0, accept_stat];
    for (d, w) in dst.chunks_exact_mut(4).zip(words) {
        d.copy_from_slice(&w.to_be_bytes());
    }
}

/// The outcome an RPC reply header carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyStat {
    /// MSG_ACCEPTED with this accept_stat (results follow only for SUCCESS).
    Accepted(u32),
    /// MSG_DENIED (RPC version mismatch or authentication error).
    Denied,
}

/// A parsed reply header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyHeader {
    /// XID.
    pub xid: u32,
    /// Outcome.
    pub stat: ReplyStat,
    /// Bytes of the header (where the results start).
    pub len: usize,
}

fn word(b: &[u8], at: usize) -> Option<u32> {
    let w: &[u8; 4] = b.get(at..)?.first_chunk()?;
    Some(u32::from_be_bytes(*w))
}

/// Parses an RPC reply header; `None` if `b` is not one (wrong type, truncated, bad arms).
#[inline(always)]
pub fn parse_reply(b: &[u8]) -> Option<ReplyHeader> {
    // Nearly every reply has the 24-byte shape `reply_header` writes: accepted, a verifier
    // of no bytes, an accept_stat without a mismatch range. Its six words are read after
    // one length check, inline in the reply's handling; any other reply takes the general
    // parse.
    if let Some(h) = b.first_chunk::<REPLY_HEADER_LEN>() {
        let w = |i: usize| u32::from_be_bytes([h[4 * i], h[4 * i + 1], h[4 * i + 2], h[4 * i + 3]]);
        let stat = w(5);
        if (w(1), w(2), w(4)) == (1, 0, 0) && stat <= 5 && stat != 2 {
            return Some(ReplyHeader {
                xid: w(0),
                stat: ReplyStat::Accepted(stat),
                len: REPLY_HEADER_LEN,
            });
        }
    }
    parse_reply_general(b)
}

/// [`parse_reply`] for any shape of reply header.
#[inline(never)]
fn parse_reply_general(b: &[u8]) -> Option<ReplyHeader> {
    let xid = word(b, 0)?;
    if word(b, 4)? != 1 {
        return None;
    }
    match word(b, 8)? {
        0 => {
            let vlen = word(b, 16)? as usize;
            if vlen > 400 {
                return None;
            }
            let at = 20 + vlen.checked_add(3)? / 4 * 4;
            let stat = word(b, at)?;
            let len = match stat {
                // PROG_MISMATCH carries the supported range.
                2 => at + 12,
                0..=5 => at + 4,
                _ => return None,
            };
            (len <= b.len()).then_some(ReplyHeader {
                xid,
                stat: ReplyStat::Accepted(stat),
                len,
            })
        }
        1 => {
            let len = match word(b, 12)? {
                0 => 24,
                1 => 20,
                _ => return None,
            };
            (len <= b.len()).then_some(ReplyHeader {
                xid,
                stat: ReplyStat::Denied,
                len,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_header_round_trip_and_long_verifier() {
        let h = reply_header(7, SUCCESS);
        assert_eq!(
            parse_reply(&h),
            Some(ReplyHeader {
                xid: 7,
                stat: ReplyStat::Accepted(0),
                len: 24
            })
        );
        // A 5-byte verifier body is padded to 8.
        let mut b = vec![];
        for w in [9u32, 1, 0, 6, 5] {
            b.extend_from_slice(&w.to_be_bytes());
        }
        b.extend_from_slice(&[1, 2, 3, 4, 5, 0, 0, 0]);
        b.extend_from_slice(&GARBAGE_ARGS.to_be_bytes());
        let r = parse_reply(&b).unwrap();
        assert_eq!((r.len, r.stat), (32, ReplyStat::Accepted(GARBAGE_ARGS)));
        assert_eq!(parse_reply(&b[..31]), None);
        assert_eq!(parse_reply(&call_header(1, 2, 3, 4)), None);
    }
}
