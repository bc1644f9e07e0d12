//! The RPC-over-RDMA wire: XDR primitives, version 1 (RFC 8166), version 2
//! (draft-cel-nfsv4-rpcrdma-version-two-01), the transport-characteristics extension
//! (draft-dnoveck-nfsv4-rpcrdma-xcharext-02) and RDMA-CM private data (RFC 8797).
//!
//! Decoding never allocates and never panics: [`decode`] validates a received message
//! against [`Limits`] and returns zero-copy views; a failure comes back as [`Rejected`],
//! whose [`answer`](Rejected::answer) says what RFC 8166 §4.5 wants done about it.
//! Building a message to send uses the same types over the sender's own slices. The
//! crate is `no_std` and never allocates.
//!
//! ```
//! use rpcrdma_proto::{decode, v1, Chunk, ChunkLists, Limits, Message, Received, ReadList,
//!                     Segment, WriteList};
//!
//! // Send: an RDMA_NOMSG call whose reply comes back in a one-segment Reply chunk.
//! let reply = [Segment::new(0x5566_7788, 8192, 0x7f00_1238_0000)];
//! let pzrc = [rpcrdma_proto::ReadSegment::new(0, Segment::new(0x1122_3344, 2000, 0x7f00_0000))];
//! let header = v1::Header {
//!     xid: 42,
//!     credit: 32,
//!     body: v1::Body::Nomsg(ChunkLists {
//!         reads: ReadList::from_segments(&pzrc),
//!         writes: WriteList::EMPTY,
//!         reply: Some(Chunk::from_segments(&reply)),
//!     }),
//! };
//! let mut buf = [0u8; 128];
//! let n = header.emit(&mut buf)?;
//!
//! // Receive: decode, or answer as RFC 8166 §4.5 says.
//! match decode(&buf[..n], &Limits::DEFAULT) {
//!     Ok(d) => assert_eq!(d.message, Message::V1(header)),
//!     Err(rejected) => {
//!         if let Some(answer) = rejected.reply(Received::Call, 32, &Limits::DEFAULT) {
//!             let mut out = [0u8; 28];
//!             answer.emit(&mut out)?;
//!         }
//!     }
//! }
//! # Ok::<(), rpcrdma_proto::Error>(())
//! ```
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use core::fmt;

pub mod chunk;
pub mod cm;
pub mod credits;
mod display;
mod error;
pub mod nfs4;
pub mod rpc;
pub mod ulb;
pub mod v1;
pub mod v2;
pub mod xchar;
pub mod xdr;

pub use chunk::{Chunk, ChunkLists, Limits, ReadChunk, ReadList, ReadSegment, Segment, WriteList};
pub use error::{Answer, Error, Received};

/// RPC `msg_type` (RFC 5531), also the v2 direction fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MsgType {
    /// CALL (0).
    Call = 0,
    /// REPLY (1).
    Reply = 1,
}

impl fmt::Display for MsgType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MsgType::Call => "CALL (0)",
            MsgType::Reply => "REPLY (1)",
        })
    }
}

/// The four words every version puts at offsets 0, 4, 8, 12 (RFC 8166 §7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fixed {
    /// `rdma_xid`.
    pub xid: u32,
    /// `rdma_vers`.
    pub vers: u32,
    /// `rdma_credit`.
    pub credit: u32,
    /// `rdma_proc`.
    pub proc: u32,
}

impl Fixed {
    /// Reads the fixed words of any version; `None` if fewer than 16 bytes.
    #[inline]
    pub fn peek(buf: &[u8]) -> Option<Fixed> {
        let b: &[u8; 16] = buf.first_chunk()?;
        let w = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Some(Fixed {
            xid: w(0),
            vers: w(4),
            credit: w(8),
            proc: w(12),
        })
    }
}

/// An RDMA_ERROR / ERR_VERS of a version this end does not speak (the body layout is
/// fixed for all versions, RFC 8166 §7; `rdma_vers` may be any value, AMB-2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrVers {
    /// `rdma_xid`.
    pub xid: u32,
    /// `rdma_vers` as received.
    pub vers: u32,
    /// `rdma_credit` (ignored, AMB-3).
    pub credit: u32,
    /// Lowest version the sender supports.
    pub low: u32,
    /// Highest version the sender supports.
    pub high: u32,
}

/// A successfully decoded message of any version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message<'a> {
    /// Version 1.
    V1(v1::Header<'a>),
    /// Version two.
    V2(v2::Header<'a>),
    /// ERR_VERS carrying an `rdma_vers` other than 1 or 2.
    ErrVers(ErrVers),
}

impl Message<'_> {
    /// The `rdma_xid`.
    pub fn xid(&self) -> u32 {
        match self {
            Message::V1(h) => h.xid,
            Message::V2(h) => h.xid,
            Message::ErrVers(e) => e.xid,
        }
    }

    /// The version range of an ERR_VERS message, whatever its `rdma_vers`.
    pub fn err_vers(&self) -> Option<(u32, u32)> {
        match self {
            Message::V1(v1::Header {
                body: v1::Body::Error(v1::ErrorBody::Vers { low, high }),
                ..
            })
            | Message::V2(v2::Header {
                body: v2::Body::Error(v2::ErrorBody::Vers { low, high }),
                ..
            }) => Some((*low, *high)),
            Message::ErrVers(e) => Some((e.low, e.high)),
            _ => None,
        }
    }

    /// Applies the reply-only rules (empty Read list, no used Reply chunk in a *_MSG).
    pub fn check_reply(&self) -> Result<(), Error> {
        match self {
            Message::V1(h) => h.check_reply(),
            Message::V2(h) => h.check_reply(),
            Message::ErrVers(_) => Ok(()),
        }
    }
}

impl fmt::Display for Message<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Message::V1(h) => h.fmt(f),
            Message::V2(h) => h.fmt(f),
            Message::ErrVers(e) => {
                display::fixed(f, e.xid, e.vers, e.credit)?;
                writeln!(f, "    Message Type: RDMA_ERROR ({})", v1::RDMA_ERROR)?;
                writeln!(f, "    Error Code: ERR_VERS ({})", v1::ERR_VERS)?;
                writeln!(f, "    Version low: {}", e.low)?;
                writeln!(f, "    Version high: {}", e.high)
            }
        }
    }
}

/// A decoded message and where its payload (inline RPC message) starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// The header.
    pub message: Message<'a>,
    /// Length of the transport header = offset of the payload in the received buffer.
    pub header_len: usize,
}

/// A message that failed to decode, with what could be read of its fixed words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejected {
    /// The fixed words, if the message had at least 16 bytes.
    pub fixed: Option<Fixed>,
    /// Why it was rejected.
    pub error: Error,
}

impl Rejected {
    /// What to do about it (see [`Error::answer`]). An RDMA2_OPTIONAL message is not a
    /// reply to anything, so it is answered in either role (AMB-23).
    pub fn answer(&self, received: Received) -> Answer {
        let vers = self.fixed.map_or(0, |f| f.vers);
        let optional = self
            .fixed
            .is_some_and(|f| f.vers == v2::VERSION && f.proc == v2::RDMA2_OPTIONAL);
        let received = if optional { Received::Call } else { received };
        self.error.answer(vers, received)
    }

    /// The error message to send back, if any; `credit` is the current grant (AMB-3) and
    /// the ERR_VERS range is 1..=`limits.max_version`.
    pub fn reply(&self, received: Received, credit: u32, limits: &Limits) -> Option<ErrorReply> {
        let fixed = self.fixed?;
        let code = match self.answer(received) {
            Answer::Drop | Answer::GarbageArgs => return None,
            Answer::ErrVers => ErrorCode::Vers {
                low: v1::VERSION,
                high: limits.max_version,
            },
            Answer::ErrChunk => ErrorCode::Chunk,
            Answer::BadHeader => ErrorCode::BadHeader,
            Answer::InvalOption => ErrorCode::InvalOption,
        };
        Some(ErrorReply {
            xid: fixed.xid,
            vers: fixed.vers,
            credit: credit.max(1),
            code,
        })
    }
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.fixed {
            Some(x) => write!(
                f,
                "rejected xid 0x{:08x} vers {} proc {}: {}",
                x.xid, x.vers, x.proc, self.error
            ),
            None => write!(f, "rejected: {}", self.error),
        }
    }
}

/// The `rdma_err` arm of an error answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// ERR_VERS / RDMA2_ERR_VERS (1) with the supported range.
    Vers {
        /// Lowest supported version.
        low: u32,
        /// Highest supported version.
        high: u32,
    },
    /// ERR_CHUNK (2), version 1.
    Chunk,
    /// RDMA2_ERR_BAD_HEADER (2), version two.
    BadHeader,
    /// RDMA2_ERR_INVAL_OPTION (3), version two.
    InvalOption,
}

/// An RDMA_ERROR / RDMA2_ERROR to send: `rdma_xid` and `rdma_vers` copied from the
/// failing message (R8166-4.5-d, AMB-2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorReply {
    /// `rdma_xid` of the failing message.
    pub xid: u32,
    /// `rdma_vers` of the failing message.
    pub vers: u32,
    /// Current grant, at least 1 (AMB-3).
    pub credit: u32,
    /// The error.
    pub code: ErrorCode,
}

impl ErrorReply {
    /// Bytes of the encoded message: 28 for ERR_VERS, 20 otherwise.
    pub fn buffer_len(&self) -> usize {
        match self.code {
            ErrorCode::Vers { .. } => 28,
            _ => 20,
        }
    }

    /// Encodes the message; returns the number of bytes written.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        let mut w = xdr::Writer::new(buf);
        w.u32(self.xid)?;
        w.u32(self.vers)?;
        w.u32(self.credit)?;
        w.u32(v1::RDMA_ERROR)?;
        match self.code {
            ErrorCode::Vers { low, high } => {
                w.u32(v1::ERR_VERS)?;
                w.u32(low)?;
                w.u32(high)?;
            }
            ErrorCode::Chunk => w.u32(v1::ERR_CHUNK)?,
            ErrorCode::BadHeader => w.u32(v2::RDMA2_ERR_BAD_HEADER)?,
            ErrorCode::InvalOption => w.u32(v2::RDMA2_ERR_INVAL_OPTION)?,
        }
        Ok(w.position())
    }
}

/// Decodes a received message of any version this end speaks.
///
/// Version 1 and (if `limits.max_version >= 2`) version two are decoded fully; an ERR_VERS
/// with any other `rdma_vers` is accepted (AMB-2); anything else of an unknown version is
/// [`Error::UnsupportedVersion`] (or [`Error::TooShort`] under 28 bytes, AMB-1).
#[inline]
pub fn decode<'a>(buf: &'a [u8], limits: &Limits) -> Result<Decoded<'a>, Rejected> {
    if let Some(s) = decode_short(buf, limits) {
        return Ok(s.decoded());
    }
    decode_general(buf, limits)
}

/// A chunk-less RDMA_MSG (version 1) or RDMA2_MSG (version two): all [`decode`] would
/// say about it, in a few words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShortMsg {
    /// `rdma_xid` (equal to the RPC message's XID).
    pub xid: u32,
    /// `rdma_vers`: 1 or 2.
    pub vers: u32,
    /// `rdma_credit`.
    pub credit: u32,
    /// `rdma_direction` (version two; a version-1 message says [`MsgType::Call`]).
    pub direction: MsgType,
    /// Offset of the RPC message: 28 (version 1) or 32 (version two).
    pub header_len: usize,
}

impl ShortMsg {
    /// The same message as [`decode`] returns it.
    #[inline]
    pub fn decoded(&self) -> Decoded<'static> {
        let (xid, credit, chunks) = (self.xid, self.credit, ChunkLists::EMPTY);
        let message = if self.vers == v2::VERSION {
            let direction = self.direction;
            let body = v2::Body::Msg { direction, chunks };
            Message::V2(v2::Header { xid, credit, body })
        } else {
            let body = v1::Body::Msg(chunks);
            Message::V1(v1::Header { xid, credit, body })
        };
        Decoded {
            message,
            header_len: self.header_len,
        }
    }
}

/// Big-endian word `i` of `b`.
#[inline(always)]
fn word<const N: usize>(b: &[u8; N], i: usize) -> u32 {
    u32::from_be_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// The fixed-layout fast path of [`decode`]: an RDMA_MSG (version 1) or RDMA2_MSG
/// (version two, if `limits` allow it) with three empty chunk lists, followed by the
/// start of an RPC message with the same XID (and in version two the same direction).
/// [`decode`] gives exactly [`ShortMsg::decoded`] for such a message; anything else is
/// `None`, for the general path to decode or reject.
#[inline]
pub fn decode_short(buf: &[u8], limits: &Limits) -> Option<ShortMsg> {
    // v1: xid 1 credit MSG 0 0 0 | rpc xid
    let b: &[u8; 32] = buf.first_chunk()?;
    let (xid, vers, credit) = (word(b, 0), word(b, 1), word(b, 2));
    if word(b, 3) != v1::RDMA_MSG {
        return None;
    }
    let (r, w, c) = (word(b, 4), word(b, 5), word(b, 6));
    if vers == v1::VERSION && (r, w, c) == (0, 0, 0) && word(b, 7) == xid {
        return Some(ShortMsg {
            xid,
            vers,
            credit,
            direction: MsgType::Call,
            header_len: v1::MIN_HEADER_LEN,
        });
    }
    // v2: xid 2 credit MSG direction 0 0 0 | rpc xid, rpc msg_type
    if vers != v2::VERSION || limits.max_version < v2::VERSION {
        return None;
    }
    let b: &[u8; 40] = buf.first_chunk()?;
    let (dir, r, w, c) = (word(b, 4), word(b, 5), word(b, 6), word(b, 7));
    let direction = match dir {
        0 => MsgType::Call,
        1 => MsgType::Reply,
        _ => return None,
    };
    if (r, w, c) != (0, 0, 0) || word(b, 8) != xid || word(b, 9) != dir {
        return None;
    }
    Some(ShortMsg {
        xid,
        vers,
        credit,
        direction,
        header_len: v2::MSG_HEADER_LEN,
    })
}

/// [`decode`] without its fast path: every message goes through the full parsers.
#[doc(hidden)]
#[inline]
pub fn decode_general<'a>(buf: &'a [u8], limits: &Limits) -> Result<Decoded<'a>, Rejected> {
    let fixed = Fixed::peek(buf);
    let reject = |error| Rejected { fixed, error };
    let f = fixed.ok_or(reject(Error::TooShort))?;
    let (message, header_len) = match f.vers {
        v1::VERSION => {
            let (h, n) = v1::Header::parse(buf, limits).map_err(reject)?;
            (Message::V1(h), n)
        }
        v2::VERSION if limits.max_version >= v2::VERSION => {
            let (h, n) = v2::Header::parse(buf, limits).map_err(reject)?;
            (Message::V2(h), n)
        }
        vers => {
            if buf.len() < v1::MIN_HEADER_LEN {
                return Err(reject(Error::TooShort));
            }
            let mut r = xdr::Reader::new(buf.get(16..).unwrap_or(&[]));
            let err = r.u32("rdma_err").map_err(reject)?;
            if f.proc != v1::RDMA_ERROR || err != v1::ERR_VERS {
                return Err(reject(Error::UnsupportedVersion(vers)));
            }
            let low = r.u32("rdma_vers_low").map_err(reject)?;
            let high = r.u32("rdma_vers_high").map_err(reject)?;
            let e = ErrVers {
                xid: f.xid,
                vers,
                credit: f.credit,
                low,
                high,
            };
            (Message::ErrVers(e), v1::MIN_HEADER_LEN)
        }
    };
    Ok(Decoded {
        message,
        header_len,
    })
}
