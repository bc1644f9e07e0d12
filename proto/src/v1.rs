//! RPC-over-RDMA version 1 headers (RFC 8166 §4).

use core::fmt;

use crate::chunk::{ChunkLists, Limits};
use crate::xdr::{Reader, Writer};
use crate::{display, Error};

/// `rdma_vers` of version 1.
pub const VERSION: u32 = 1;
/// `rdma_proc` RDMA_MSG: chunk lists, then the RPC message inline.
pub const RDMA_MSG: u32 = 0;
/// `rdma_proc` RDMA_NOMSG: chunk lists only; the RPC message travels in a chunk.
pub const RDMA_NOMSG: u32 = 1;
/// `rdma_proc` RDMA_MSGP: retired, never sent (RFC 8166 §4.6.1).
pub const RDMA_MSGP: u32 = 2;
/// `rdma_proc` RDMA_DONE: retired, never sent (RFC 8166 §4.6.2).
pub const RDMA_DONE: u32 = 3;
/// `rdma_proc` RDMA_ERROR.
pub const RDMA_ERROR: u32 = 4;
/// `rdma_err` ERR_VERS (value and body fixed for every version, RFC 8166 §7).
pub const ERR_VERS: u32 = 1;
/// `rdma_err` ERR_CHUNK.
pub const ERR_CHUNK: u32 = 2;
/// Smallest header: fixed part plus three empty chunk fields (RFC 8166 §4.5).
pub const MIN_HEADER_LEN: usize = 28;
/// Smallest message of all: an RDMA_ERROR with a void arm (AMB-1).
pub const MIN_ERROR_LEN: usize = 20;

/// A validated version-1 header (the `Repr`): decoded zero-copy, or built to be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header<'a> {
    /// `rdma_xid`: the XID of the carried RPC message.
    pub xid: u32,
    /// `rdma_credit`: credits requested (calls) or granted (replies).
    pub credit: u32,
    /// The `rdma_proc` arm.
    pub body: Body<'a>,
}

/// The body of a version-1 header; the retired RDMA_MSGP and RDMA_DONE are never built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body<'a> {
    /// RDMA_MSG: the (possibly reduced) RPC message follows the header.
    Msg(ChunkLists<'a>),
    /// RDMA_NOMSG: the RPC message is in the Position Zero Read chunk or the Reply chunk.
    Nomsg(ChunkLists<'a>),
    /// RDMA_ERROR.
    Error(ErrorBody),
}

/// The body of an RDMA_ERROR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorBody {
    /// ERR_VERS: the inclusive range of versions the sender supports.
    Vers {
        /// Lowest supported version.
        low: u32,
        /// Highest supported version.
        high: u32,
    },
    /// ERR_CHUNK: any other header error.
    Chunk,
}

impl Body<'_> {
    /// The `rdma_proc` value of this body.
    #[inline]
    pub fn proc(&self) -> u32 {
        match self {
            Body::Msg(_) => RDMA_MSG,
            Body::Nomsg(_) => RDMA_NOMSG,
            Body::Error(_) => RDMA_ERROR,
        }
    }
}

/// Reads the fixed words and applies the version-agnostic length rule (AMB-1):
/// at least 20 bytes, and 28 unless the message is an RDMA_ERROR with a void arm.
#[inline]
pub(crate) fn check_min_len(buf: &[u8], void_error_arm: impl Fn(u32) -> bool) -> Result<(), Error> {
    if buf.len() < MIN_ERROR_LEN {
        return Err(Error::TooShort);
    }
    if buf.len() < MIN_HEADER_LEN {
        let mut r = Reader::new(buf.get(12..).unwrap_or(&[]));
        let proc = r.u32("rdma_proc")?;
        let err = r.u32("rdma_err")?;
        if proc != RDMA_ERROR || !void_error_arm(err) {
            return Err(Error::TooShort);
        }
    }
    Ok(())
}

/// Checks that the payload of a message with an inline RPC message starts with `xid`.
#[inline]
pub(crate) fn check_payload_xid(payload: &[u8], xid: u32) -> Result<(), Error> {
    let (rpc_xid, _) = payload
        .split_first_chunk::<4>()
        .ok_or(Error::MissingPayload)?;
    if u32::from_be_bytes(*rpc_xid) != xid {
        return Err(Error::XidMismatch);
    }
    Ok(())
}

impl<'a> Header<'a> {
    /// Decodes a whole received message; returns the header and where the inline RPC
    /// message starts (equal to the header length).
    ///
    /// Enforces every MUST visible in the header alone; role-specific rules for replies
    /// are in [`Header::check_reply`].
    #[inline]
    pub fn parse(buf: &'a [u8], limits: &Limits) -> Result<(Self, usize), Error> {
        check_min_len(buf, |err| err == ERR_CHUNK)?;
        let mut r = Reader::new(buf);
        let xid = r.u32("rdma_xid")?;
        let vers = r.u32("rdma_vers")?;
        let credit = r.u32("rdma_credit")?;
        let proc = r.u32("rdma_proc")?;
        if vers != VERSION {
            return Err(Error::UnsupportedVersion(vers));
        }
        let body = match proc {
            RDMA_MSG => {
                let chunks = ChunkLists::parse(&mut r, limits)?;
                if chunks.reads.has_position_zero() {
                    return Err(Error::PositionZeroInMsg);
                }
                check_payload_xid(r.rest(), xid)?;
                Body::Msg(chunks)
            }
            RDMA_NOMSG => {
                let chunks = ChunkLists::parse(&mut r, limits)?;
                if chunks.is_empty() {
                    return Err(Error::NomsgWithoutChunks);
                }
                Body::Nomsg(chunks)
            }
            RDMA_MSGP => return Err(Error::Msgp),
            RDMA_DONE => return Err(Error::Done),
            RDMA_ERROR => Body::Error(match r.u32("rdma_err")? {
                ERR_VERS => ErrorBody::Vers {
                    low: r.u32("rdma_vers_low")?,
                    high: r.u32("rdma_vers_high")?,
                },
                ERR_CHUNK => ErrorBody::Chunk,
                e => return Err(Error::UnknownErrorCode(e)),
            }),
            p => return Err(Error::UnknownProc(p)),
        };
        Ok((Header { xid, credit, body }, r.position()))
    }

    /// Rules that apply only to a message received as a reply: an empty Read list
    /// (R8166-4.3.1-b) and no used Reply chunk in an RDMA_MSG (AMB-8, AMB-9).
    pub fn check_reply(&self) -> Result<(), Error> {
        check_reply_chunks(&self.body_chunks(), self.body.proc() == RDMA_MSG)
    }

    fn body_chunks(&self) -> Option<ChunkLists<'a>> {
        match self.body {
            Body::Msg(c) | Body::Nomsg(c) => Some(c),
            Body::Error(_) => None,
        }
    }

    /// Bytes of the encoded header.
    #[inline]
    pub fn buffer_len(&self) -> usize {
        16 + match &self.body {
            Body::Msg(c) | Body::Nomsg(c) => c.wire_len(),
            Body::Error(ErrorBody::Vers { .. }) => 12,
            Body::Error(ErrorBody::Chunk) => 4,
        }
    }

    /// Encodes the header at the start of `buf`; returns the number of bytes written.
    #[inline]
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        if let Body::Msg(c) = &self.body {
            if c.is_empty() {
                if let Some(n) = emit_msg(buf, self.xid, self.credit) {
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
            Body::Msg(c) | Body::Nomsg(c) => c.emit(&mut w)?,
            Body::Error(ErrorBody::Vers { low, high }) => {
                w.u32(ERR_VERS)?;
                w.u32(*low)?;
                w.u32(*high)?;
            }
            Body::Error(ErrorBody::Chunk) => w.u32(ERR_CHUNK)?,
        }
        Ok(w.position())
    }
}

/// Encodes the header of an RDMA_MSG without chunks (a fixed layout of seven words, what
/// [`Header::emit`] writes for it); returns its length, or `None` if `buf` is shorter.
#[inline]
pub fn emit_msg(buf: &mut [u8], xid: u32, credit: u32) -> Option<usize> {
    let b = buf.first_chunk_mut::<MIN_HEADER_LEN>()?;
    crate::xdr::put_words(b, &[xid, VERSION, credit, RDMA_MSG, 0, 0, 0]);
    Some(MIN_HEADER_LEN)
}

pub(crate) fn check_reply_chunks(chunks: &Option<ChunkLists<'_>>, msg: bool) -> Result<(), Error> {
    if let Some(c) = chunks {
        if !c.reads.is_empty() {
            return Err(Error::ReadListInReply);
        }
        if msg && c.reply.is_some_and(|r| r.length() != 0) {
            return Err(Error::ReplyChunkUsedInMsg);
        }
    }
    Ok(())
}

/// Name of a version-1 `rdma_proc`, as tshark prints it.
pub fn proc_name(proc: u32) -> &'static str {
    match proc {
        RDMA_MSG => "RDMA_MSG",
        RDMA_NOMSG => "RDMA_NOMSG",
        RDMA_MSGP => "RDMA_MSGP",
        RDMA_DONE => "RDMA_DONE",
        RDMA_ERROR => "RDMA_ERROR",
        _ => "unknown",
    }
}

impl fmt::Display for Header<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        display::fixed(f, self.xid, VERSION, self.credit)?;
        let proc = self.body.proc();
        writeln!(f, "    Message Type: {} ({proc})", proc_name(proc))?;
        match &self.body {
            Body::Msg(c) | Body::Nomsg(c) => display::chunk_lists(f, c),
            Body::Error(e) => match e {
                ErrorBody::Vers { low, high } => {
                    writeln!(f, "    Error Code: ERR_VERS ({ERR_VERS})")?;
                    writeln!(f, "    Version low: {low}")?;
                    writeln!(f, "    Version high: {high}")
                }
                ErrorBody::Chunk => writeln!(f, "    Error Code: ERR_CHUNK ({ERR_CHUNK})"),
            },
        }
    }
}
