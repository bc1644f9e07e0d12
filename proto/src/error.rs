//! The codec's single error type and the one place that maps a decode error to the
//! answer RFC 8166 §4.5 / REQUIREMENTS §8 prescribe.

use core::fmt;

/// Everything that can go wrong decoding or encoding a message; never allocates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// Shorter than the smallest header this message could be (AMB-1): dropped silently.
    TooShort,
    /// `rdma_vers` is not a version this end speaks.
    UnsupportedVersion(u32),
    /// An XDR item runs past the end of the message (the item is named).
    Truncated(&'static str),
    /// An enum, bool or optional-data discriminator holds a value outside its type.
    BadValue(&'static str, u32),
    /// Non-zero XDR pad after opaque data.
    BadPadding(&'static str),
    /// Bytes left over where the XDR type ends (inside a length-delimited part).
    TrailingBytes(&'static str),
    /// `rdma_proc` is not defined for this version.
    UnknownProc(u32),
    /// RDMA_MSGP (2), retired by RFC 8166 §4.6.1.
    Msgp,
    /// RDMA_DONE (3), retired by RFC 8166 §4.6.2.
    Done,
    /// RDMA_ERROR whose `rdma_err` is not defined (R8166-4.5-f: discard).
    UnknownErrorCode(u32),
    /// A Read segment position is not a multiple of 4 (R8166-3.4.5-c).
    MisalignedPosition(u32),
    /// Two Read chunks cover overlapping bytes of the Payload stream (AMB-11).
    OverlappingReadChunks,
    /// A segment's offset + length wraps past 2^64.
    SegmentWraps,
    /// The lengths of one chunk's segments add up to more than 2^32 - 1.
    ChunkTooLong,
    /// More segments or chunks than the configured [`Limits`](crate::Limits) allow.
    TooMany(&'static str),
    /// RDMA_NOMSG that carries no chunk at all (R8166-4.2.4-b).
    NomsgWithoutChunks,
    /// RDMA_MSG with a Position Zero Read chunk (AMB-9).
    PositionZeroInMsg,
    /// RDMA_MSG with no room for the RPC message's XID after the header.
    MissingPayload,
    /// The RPC XID after the header differs from `rdma_xid` (R8166-4.2.1-a).
    XidMismatch,
    /// A v2 direction field differs from the carried RPC message's msg_type (V2-4.2.2-b).
    DirectionMismatch,
    /// A reply with a non-empty Read list (R8166-4.3.1-b).
    ReadListInReply,
    /// An RDMA_MSG reply that used its Reply chunk (AMB-8/AMB-9).
    ReplyChunkUsedInMsg,
    /// A malformed RDMA2_OPTIONAL body (xcharext XDR error, AMB-22).
    BadOption(&'static str),
    /// An `rdma_opttype` this end does not support (V2-3.1-b).
    UnsupportedOption(u32),
    /// A Read chunk the procedure's Upper-Layer Binding does not allow (R8166-6.1-b).
    NotEligible(&'static str),
    /// The output buffer is too small for the message being encoded.
    BufferTooSmall,
    /// The value cannot be encoded (a length beyond 32 bits, an invalid combination).
    Unencodable(&'static str),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::TooShort => f.write_str("message shorter than the minimal header"),
            Error::UnsupportedVersion(v) => write!(f, "unsupported rdma_vers {v}"),
            Error::Truncated(what) => write!(f, "{what} runs past the end of the message"),
            Error::BadValue(what, v) => write!(f, "invalid {what}: {v}"),
            Error::BadPadding(what) => write!(f, "non-zero XDR pad after {what}"),
            Error::TrailingBytes(what) => write!(f, "trailing bytes after {what}"),
            Error::UnknownProc(p) => write!(f, "unknown rdma_proc {p}"),
            Error::Msgp => f.write_str("RDMA_MSGP is retired"),
            Error::Done => f.write_str("RDMA_DONE is retired"),
            Error::UnknownErrorCode(e) => write!(f, "unknown rdma_err {e}"),
            Error::MisalignedPosition(p) => write!(f, "read position {p} not a multiple of 4"),
            Error::OverlappingReadChunks => f.write_str("overlapping read chunks"),
            Error::SegmentWraps => f.write_str("segment offset + length wraps 64 bits"),
            Error::ChunkTooLong => f.write_str("chunk length exceeds 32 bits"),
            Error::TooMany(what) => write!(f, "too many {what}"),
            Error::NomsgWithoutChunks => f.write_str("RDMA_NOMSG without any chunk"),
            Error::PositionZeroInMsg => f.write_str("position-zero read chunk in RDMA_MSG"),
            Error::MissingPayload => f.write_str("RDMA_MSG without an RPC message"),
            Error::XidMismatch => f.write_str("rdma_xid differs from the RPC XID"),
            Error::DirectionMismatch => f.write_str("direction differs from the RPC msg_type"),
            Error::ReadListInReply => f.write_str("non-empty read list in a reply"),
            Error::ReplyChunkUsedInMsg => f.write_str("RDMA_MSG reply used its reply chunk"),
            Error::BadOption(what) => write!(f, "malformed optional body: {what}"),
            Error::UnsupportedOption(t) => write!(f, "unsupported rdma_opttype {t}"),
            Error::NotEligible(what) => write!(f, "DDP-eligibility violation: {what}"),
            Error::BufferTooSmall => f.write_str("output buffer too small"),
            Error::Unencodable(what) => write!(f, "cannot encode {what}"),
        }
    }
}

impl core::error::Error for Error {}

/// How the failing message reached us, which decides between answering and dropping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// At a responder, as a call (or an RDMA2_OPTIONAL message in either role).
    Call,
    /// At a requester, as a reply: header errors are dropped silently (R8166-4.5-c).
    Reply,
}

/// What the receiver of a message that failed to decode must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Discard silently; the connection stays up.
    Drop,
    /// RDMA_ERROR / ERR_VERS with the supported range (any version, R8166-4.5.1-a).
    ErrVers,
    /// RDMA_ERROR / ERR_CHUNK (version 1, R8166-4.5.2-a).
    ErrChunk,
    /// RDMA2_ERROR / RDMA2_ERR_BAD_HEADER (version 2, V2-4.2.3-a, AMB-22).
    BadHeader,
    /// RDMA2_ERROR / RDMA2_ERR_INVAL_OPTION (version 2, V2-3.1-b).
    InvalOption,
    /// Header fine, arguments not: an RPC reply with GARBAGE_ARGS in an RDMA_MSG
    /// (R8166-4.5.2-b, AMB-12); built by the RPC layer, not by this crate.
    GarbageArgs,
}

impl Error {
    /// The RFC's answer to this error in a message of version `vers` received as `received`.
    ///
    /// This is the only place the mapping lives (REQUIREMENTS rows 85–103, 177, 185, 189;
    /// AMB-1, -2, -6, -9, -22, -23).
    pub fn answer(&self, vers: u32, received: Received) -> Answer {
        let call = received == Received::Call;
        match *self {
            // R8166-4.5-a / AMB-1: too short to parse, always silent.
            Error::TooShort => Answer::Drop,
            // R8166-4.5-f: an RDMA_ERROR we cannot decode is discarded.
            Error::UnknownErrorCode(_) => Answer::Drop,
            // R8166-4.6.2-a: RDMA_DONE is discarded by everyone.
            Error::Done => Answer::Drop,
            // Encoder-side errors never come from a received message.
            Error::BufferTooSmall | Error::Unencodable(_) => Answer::Drop,
            // AMB-22/AMB-23: optional messages are answered in either role.
            Error::BadOption(_) if vers == 2 => Answer::BadHeader,
            Error::UnsupportedOption(_) if vers == 2 => Answer::InvalOption,
            // R8166-4.5-c: header errors in a reply are dropped.
            _ if !call => Answer::Drop,
            // R8166-6.1-b with AMB-12: the header parsed, the arguments are wrong.
            Error::NotEligible(_) => Answer::GarbageArgs,
            // R8166-4.5.1-a, IMPL-4.6.1-a.
            Error::UnsupportedVersion(_) => Answer::ErrVers,
            // V2-4.2-b, V2-4.2.3-a: every other v2 header error.
            _ if vers == 2 => Answer::BadHeader,
            // R8166-4.5.2-a, R8166-4.6.1-b (AMB-6), IMPL-7.2.1.1-a, AMB-9.
            _ => Answer::ErrChunk,
        }
    }
}
