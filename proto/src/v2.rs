//! RPC-over-RDMA Version Two headers (draft-cel-nfsv4-rpcrdma-version-two-01 §4.2).

use core::fmt;

use crate::chunk::{ChunkLists, Limits};
use crate::v1::{check_min_len, check_payload_xid, check_reply_chunks};
use crate::xdr::{opaque_len, Reader, Writer};
use crate::{display, Error, MsgType};

/// `rdma_vers` of version two.
pub const VERSION: u32 = 2;
/// `rdma_proc` RDMA2_MSG.
pub const RDMA2_MSG: u32 = 0;
/// `rdma_proc` RDMA2_NOMSG.
pub const RDMA2_NOMSG: u32 = 1;
/// `rdma_proc` RDMA2_ERROR.
pub const RDMA2_ERROR: u32 = 4;
/// `rdma_proc` RDMA2_OPTIONAL.
pub const RDMA2_OPTIONAL: u32 = 5;
/// `rdma_err` RDMA2_ERR_VERS.
pub const RDMA2_ERR_VERS: u32 = 1;
/// `rdma_err` RDMA2_ERR_BAD_HEADER.
pub const RDMA2_ERR_BAD_HEADER: u32 = 2;
/// `rdma_err` RDMA2_ERR_INVAL_OPTION.
pub const RDMA2_ERR_INVAL_OPTION: u32 = 3;

/// A validated version-two header (the `Repr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header<'a> {
    /// `rdma_xid`.
    pub xid: u32,
    /// `rdma_credit`.
    pub credit: u32,
    /// The `rdma_proc` arm.
    pub body: Body<'a>,
}

/// The body of a version-two header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body<'a> {
    /// RDMA2_MSG: chunk lists, then the RPC message inline.
    Msg {
        /// `rdma_direction`: msg_type of the carried RPC message.
        direction: MsgType,
        /// Read list, Write list, Reply chunk.
        chunks: ChunkLists<'a>,
    },
    /// RDMA2_NOMSG: chunk lists only.
    Nomsg {
        /// `rdma_direction`.
        direction: MsgType,
        /// Read list, Write list, Reply chunk.
        chunks: ChunkLists<'a>,
    },
    /// RDMA2_ERROR (always in the REPLY direction, no direction word: AMB-17).
    Error(ErrorBody),
    /// RDMA2_OPTIONAL envelope.
    Optional(Optional<'a>),
}

/// The body of an RDMA2_ERROR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorBody {
    /// RDMA2_ERR_VERS with the supported range.
    Vers {
        /// Lowest supported version.
        low: u32,
        /// Highest supported version.
        high: u32,
    },
    /// RDMA2_ERR_BAD_HEADER.
    BadHeader,
    /// RDMA2_ERR_INVAL_OPTION.
    InvalOption,
}

/// The RDMA2_OPTIONAL envelope: an optional operation and its opaque body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Optional<'a> {
    /// `rdma_optdir`.
    pub direction: MsgType,
    /// `rdma_opttype`: the operation code (see [`crate::xchar`]).
    pub opttype: u32,
    /// `rdma_optinfo`: XDR of the operation's body.
    pub optinfo: &'a [u8],
}

impl Body<'_> {
    /// The `rdma_proc` value of this body.
    pub fn proc(&self) -> u32 {
        match self {
            Body::Msg { .. } => RDMA2_MSG,
            Body::Nomsg { .. } => RDMA2_NOMSG,
            Body::Error(_) => RDMA2_ERROR,
            Body::Optional(_) => RDMA2_OPTIONAL,
        }
    }
}

fn direction(r: &mut Reader<'_>, what: &'static str) -> Result<MsgType, Error> {
    match r.u32(what)? {
        0 => Ok(MsgType::Call),
        1 => Ok(MsgType::Reply),
        v => Err(Error::BadValue(what, v)),
    }
}

impl<'a> Header<'a> {
    /// Decodes a whole received message; returns the header and where the payload starts.
    #[inline]
    pub fn parse(buf: &'a [u8], limits: &Limits) -> Result<(Self, usize), Error> {
        check_min_len(buf, |err| {
            err == RDMA2_ERR_BAD_HEADER || err == RDMA2_ERR_INVAL_OPTION
        })?;
        let mut r = Reader::new(buf);
        let xid = r.u32("rdma_xid")?;
        let vers = r.u32("rdma_vers")?;
        let credit = r.u32("rdma_credit")?;
        let proc = r.u32("rdma_proc")?;
        if vers != VERSION {
            return Err(Error::UnsupportedVersion(vers));
        }
        let body = match proc {
            RDMA2_MSG => {
                let direction = direction(&mut r, "rdma_direction")?;
                let chunks = ChunkLists::parse(&mut r, limits)?;
                if chunks.reads.has_position_zero() {
                    return Err(Error::PositionZeroInMsg);
                }
                let payload = r.rest();
                check_payload_xid(payload, xid)?;
                let mtype = payload.get(4..8).ok_or(Error::MissingPayload)?;
                if mtype != (direction as u32).to_be_bytes() {
                    return Err(Error::DirectionMismatch);
                }
                Body::Msg { direction, chunks }
            }
            RDMA2_NOMSG => {
                let direction = direction(&mut r, "rdma_direction")?;
                let chunks = ChunkLists::parse(&mut r, limits)?;
                if chunks.is_empty() {
                    return Err(Error::NomsgWithoutChunks);
                }
                Body::Nomsg { direction, chunks }
            }
            RDMA2_ERROR => Body::Error(match r.u32("rdma_err")? {
                RDMA2_ERR_VERS => ErrorBody::Vers {
                    low: r.u32("rdma_vers_low")?,
                    high: r.u32("rdma_vers_high")?,
                },
                RDMA2_ERR_BAD_HEADER => ErrorBody::BadHeader,
                RDMA2_ERR_INVAL_OPTION => ErrorBody::InvalOption,
                e => return Err(Error::UnknownErrorCode(e)),
            }),
            RDMA2_OPTIONAL => Body::Optional(Optional {
                direction: direction(&mut r, "rdma_optdir")?,
                opttype: r.u32("rdma_opttype")?,
                optinfo: r.opaque("rdma_optinfo")?,
            }),
            p => return Err(Error::UnknownProc(p)),
        };
        Ok((Header { xid, credit, body }, r.position()))
    }

    /// Rules that apply only to a message received as a reply (as in version 1).
    pub fn check_reply(&self) -> Result<(), Error> {
        match &self.body {
            Body::Msg { chunks, .. } => check_reply_chunks(&Some(*chunks), true),
            Body::Nomsg { chunks, .. } => check_reply_chunks(&Some(*chunks), false),
            _ => Ok(()),
        }
    }

    /// Bytes of the encoded header.
    #[inline]
    pub fn buffer_len(&self) -> usize {
        16 + match &self.body {
            Body::Msg { chunks, .. } | Body::Nomsg { chunks, .. } => 4 + chunks.wire_len(),
            Body::Error(ErrorBody::Vers { .. }) => 12,
            Body::Error(_) => 4,
            Body::Optional(o) => 8 + opaque_len(o.optinfo.len()),
        }
    }

    /// Encodes the header at the start of `buf`; returns the number of bytes written.
    #[inline]
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        if let Body::Msg { direction, chunks } = &self.body {
            if chunks.is_empty() {
                if let Some(n) = emit_msg(buf, self.xid, self.credit, *direction) {
                    return Ok(n);
                }
            }
        }
        self.emit_general(buf)
    }

    /// [`emit`](Self::emit) without its fast path.
    #[doc(hidden)]
    #[inline]
    pub fn emit_general(&self, buf: &mut [u8]) -> Result<usize, Error> {
        let mut w = Writer::new(buf);
        w.u32(self.xid)?;
        w.u32(VERSION)?;
        w.u32(self.credit)?;
        w.u32(self.body.proc())?;
        match &self.body {
            Body::Msg { direction, chunks } | Body::Nomsg { direction, chunks } => {
                w.u32(*direction as u32)?;
                chunks.emit(&mut w)?;
            }
            Body::Error(ErrorBody::Vers { low, high }) => {
                w.u32(RDMA2_ERR_VERS)?;
                w.u32(*low)?;
                w.u32(*high)?;
            }
            Body::Error(ErrorBody::BadHeader) => w.u32(RDMA2_ERR_BAD_HEADER)?,
            Body::Error(ErrorBody::InvalOption) => w.u32(RDMA2_ERR_INVAL_OPTION)?,
            Body::Optional(o) => {
                w.u32(o.direction as u32)?;
                w.u32(o.opttype)?;
                w.opaque(o.optinfo)?;
            }
        }
        Ok(w.position())
    }
}

/// Length of an RDMA2_MSG header without chunks.
pub const MSG_HEADER_LEN: usize = 32;

/// Encodes the header of an RDMA2_MSG without chunks (a fixed layout of eight words, what
/// [`Header::emit`] writes for it); returns its length, or `None` if `buf` is shorter.
#[inline]
pub fn emit_msg(buf: &mut [u8], xid: u32, credit: u32, direction: MsgType) -> Option<usize> {
    let b = buf.first_chunk_mut::<MSG_HEADER_LEN>()?;
    let words = [xid, VERSION, credit, RDMA2_MSG, direction as u32, 0, 0, 0];
    crate::xdr::put_words(b, &words);
    Some(MSG_HEADER_LEN)
}

/// Name of a version-two `rdma_proc`.
pub fn proc_name(proc: u32) -> &'static str {
    match proc {
        RDMA2_MSG => "RDMA2_MSG",
        RDMA2_NOMSG => "RDMA2_NOMSG",
        RDMA2_ERROR => "RDMA2_ERROR",
        RDMA2_OPTIONAL => "RDMA2_OPTIONAL",
        _ => "unknown",
    }
}

impl fmt::Display for Header<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        display::fixed(f, self.xid, VERSION, self.credit)?;
        let proc = self.body.proc();
        writeln!(f, "    Message Type: {} ({proc})", proc_name(proc))?;
        match &self.body {
            Body::Msg { direction, chunks } | Body::Nomsg { direction, chunks } => {
                writeln!(f, "    Direction: {direction}")?;
                display::chunk_lists(f, chunks)
            }
            Body::Error(ErrorBody::Vers { low, high }) => {
                writeln!(f, "    Error Code: RDMA2_ERR_VERS ({RDMA2_ERR_VERS})")?;
                writeln!(f, "    Version low: {low}")?;
                writeln!(f, "    Version high: {high}")
            }
            Body::Error(ErrorBody::BadHeader) => writeln!(
                f,
                "    Error Code: RDMA2_ERR_BAD_HEADER ({RDMA2_ERR_BAD_HEADER})"
            ),
            Body::Error(ErrorBody::InvalOption) => writeln!(
                f,
                "    Error Code: RDMA2_ERR_INVAL_OPTION ({RDMA2_ERR_INVAL_OPTION})"
            ),
            Body::Optional(o) => {
                writeln!(f, "    Direction: {}", o.direction)?;
                writeln!(
                    f,
                    "    Optional type: {} ({})",
                    crate::xchar::opttype_name(o.opttype),
                    o.opttype
                )?;
                writeln!(f, "    Optional info ({} bytes)", o.optinfo.len())?;
                match crate::xchar::Operation::parse(o.opttype, o.optinfo) {
                    Ok(op) => write!(f, "{op}"),
                    Err(e) => writeln!(f, "        [{e}]"),
                }
            }
        }
    }
}
