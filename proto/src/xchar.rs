//! Transport characteristics (draft-dnoveck-nfsv4-rpcrdma-xcharext-02): characteristic
//! values, sets and subsets, and the four RDMA2_OPTIONAL operations that carry them.
//!
//! Every malformed body is [`Error::BadOption`] (answered RDMA2_ERR_BAD_HEADER, AMB-22);
//! an unknown `rdma_opttype` is [`Error::UnsupportedOption`] (RDMA2_ERR_INVAL_OPTION).

use core::fmt;

use crate::xdr::{opaque_len, Reader, Writer};
use crate::{v2, Error, MsgType};

/// Receive Buffer Size: `uint32` bytes, default 4096.
pub const XCHAR_RBSIZ: u32 = 1;
/// Requester Remote Invalidation: `bool`, default FALSE.
pub const XCHAR_REQREMINV: u32 = 2;
/// Backward Request Support: `enum bkreqsup`, default BKREQSUP_INLINE.
pub const XCHAR_BRS: u32 = 3;
/// First id of the experimental range (xcharext §6.2).
pub const EXPERIMENTAL_FIRST: u32 = 0xFFFF_FF00;
/// Default XCHAR_RBSIZ (Table 1).
pub const DEFAULT_RBSIZ: u32 = 4096;

/// Operation code of ROPT_INITXCH.
pub const ROPT_INITXCH: u32 = 1;
/// Operation code of ROPT_REQXCH.
pub const ROPT_REQXCH: u32 = 2;
/// Operation code of ROPT_RESPXCH.
pub const ROPT_RESPXCH: u32 = 3;
/// Operation code of ROPT_UPDXCH.
pub const ROPT_UPDXCH: u32 = 4;

/// True for ids in the experimental range 0xFFFFFF00–0xFFFFFFFF (XCH-6.2-a).
pub const fn is_experimental(id: u32) -> bool {
    id >= EXPERIMENTAL_FIRST
}

/// Name of an `rdma_opttype` defined by xcharext.
pub fn opttype_name(opttype: u32) -> &'static str {
    match opttype {
        ROPT_INITXCH => "ROPT_INITXCH",
        ROPT_REQXCH => "ROPT_REQXCH",
        ROPT_RESPXCH => "ROPT_RESPXCH",
        ROPT_UPDXCH => "ROPT_UPDXCH",
        _ => "unknown",
    }
}

/// Turns a reader error inside an optional body into an option error.
fn opt(e: Error) -> Error {
    match e {
        Error::Truncated(w) | Error::BadValue(w, _) | Error::BadPadding(w) => Error::BadOption(w),
        Error::TrailingBytes(w) => Error::BadOption(w),
        other => other,
    }
}

/// `enum bkreqsup`: level of backward-request support.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BkReqSup {
    /// No backward requests or replies accepted.
    None = 0,
    /// Only inline backward messages.
    Inline = 1,
    /// Backward messages supported like forward ones.
    Genl = 2,
}

/// One characteristic value (`xcharval`), typed for the ids this crate knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Xchar<'a> {
    /// XCHAR_RBSIZ.
    RbSiz(u32),
    /// XCHAR_REQREMINV.
    ReqRemInv(bool),
    /// XCHAR_BRS.
    Brs(BkReqSup),
    /// Any other id (experimental included), kept opaque so it can be skipped (XCH-2.1-e).
    Other {
        /// `xchv_which`.
        which: u32,
        /// `xchv_data`.
        data: &'a [u8],
    },
}

impl<'a> Xchar<'a> {
    /// The `xchv_which` id.
    pub fn which(&self) -> u32 {
        match self {
            Xchar::RbSiz(_) => XCHAR_RBSIZ,
            Xchar::ReqRemInv(_) => XCHAR_REQREMINV,
            Xchar::Brs(_) => XCHAR_BRS,
            Xchar::Other { which, .. } => *which,
        }
    }

    /// Decodes one `xcharval`, checking known ids' data against their typedef (XCH-2.1-d).
    pub fn parse(r: &mut Reader<'a>) -> Result<Self, Error> {
        let which = r.u32("xchv_which").map_err(opt)?;
        let data = r.opaque("xchv_data").map_err(opt)?;
        let mut d = Reader::new(data);
        let v = match which {
            XCHAR_RBSIZ => Xchar::RbSiz(d.u32("xchrbsiz").map_err(opt)?),
            XCHAR_REQREMINV => Xchar::ReqRemInv(d.bool("xchrreqrem").map_err(opt)?),
            XCHAR_BRS => Xchar::Brs(match d.u32("xchrbrs").map_err(opt)? {
                0 => BkReqSup::None,
                1 => BkReqSup::Inline,
                2 => BkReqSup::Genl,
                _ => return Err(Error::BadOption("xchrbrs")),
            }),
            _ => return Ok(Xchar::Other { which, data }),
        };
        d.expect_empty("xchv_data").map_err(opt)?;
        Ok(v)
    }

    /// Bytes on the wire.
    pub fn wire_len(&self) -> usize {
        4 + match self {
            Xchar::Other { data, .. } => opaque_len(data.len()),
            _ => 8,
        }
    }

    /// Encodes one `xcharval`.
    pub fn emit(&self, w: &mut Writer<'_>) -> Result<(), Error> {
        w.u32(self.which())?;
        match self {
            Xchar::RbSiz(v) => {
                w.u32(4)?;
                w.u32(*v)
            }
            Xchar::ReqRemInv(b) => {
                w.u32(4)?;
                w.bool(*b)
            }
            Xchar::Brs(b) => {
                w.u32(4)?;
                w.u32(*b as u32)
            }
            Xchar::Other { data, .. } => w.opaque(data),
        }
    }
}

impl fmt::Display for Xchar<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Xchar::RbSiz(v) => write!(f, "XCHAR_RBSIZ = {v}"),
            Xchar::ReqRemInv(b) => {
                write!(f, "XCHAR_REQREMINV = {}", if *b { "TRUE" } else { "FALSE" })
            }
            Xchar::Brs(b) => write!(f, "XCHAR_BRS = {b:?}"),
            Xchar::Other { which, data } if is_experimental(*which) => {
                write!(f, "experimental 0x{which:08x} ({} bytes)", data.len())
            }
            Xchar::Other { which, data } => write!(f, "unknown {which} ({} bytes)", data.len()),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum SpecRepr<'a> {
    /// Validated `xcharval`s without the count word.
    Wire {
        bytes: &'a [u8],
        count: usize,
    },
    Slice(&'a [Xchar<'a>]),
}

/// A set of characteristic values (`xcharspec`), in wire order.
#[derive(Clone, Copy)]
pub struct XcharSpec<'a>(SpecRepr<'a>);

impl<'a> XcharSpec<'a> {
    /// A set to send.
    pub const fn from_values(values: &'a [Xchar<'a>]) -> Self {
        XcharSpec(SpecRepr::Slice(values))
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match self.0 {
            SpecRepr::Wire { count, .. } => count,
            SpecRepr::Slice(s) => s.len(),
        }
    }

    /// True when the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values in wire order (unknown ids appear as [`Xchar::Other`]).
    pub fn iter(&self) -> XcharIter<'a> {
        match self.0 {
            SpecRepr::Wire { bytes, .. } => XcharIter::Wire(Reader::new(bytes)),
            SpecRepr::Slice(s) => XcharIter::Slice(s.iter()),
        }
    }

    /// Bytes on the wire.
    pub fn wire_len(&self) -> usize {
        match self.0 {
            SpecRepr::Wire { bytes, .. } => 4 + bytes.len(),
            SpecRepr::Slice(s) => 4 + s.iter().map(Xchar::wire_len).sum::<usize>(),
        }
    }

    /// Decodes and validates an `xcharspec`.
    pub fn parse(r: &mut Reader<'a>) -> Result<Self, Error> {
        let n = r.u32("xcharspec count").map_err(opt)? as usize;
        let start = r.rest();
        let begin = r.position();
        // Each value is at least 8 bytes: refuse counts the buffer cannot hold before looping.
        if n > r.remaining() / 8 {
            return Err(Error::BadOption("xcharspec count"));
        }
        for _ in 0..n {
            Xchar::parse(r)?;
        }
        let bytes = start
            .get(..r.position() - begin)
            .ok_or(Error::BadOption("xcharspec"))?;
        Ok(XcharSpec(SpecRepr::Wire { bytes, count: n }))
    }

    /// Encodes an `xcharspec`.
    pub fn emit(&self, w: &mut Writer<'_>) -> Result<(), Error> {
        let n = u32::try_from(self.len()).map_err(|_| Error::Unencodable("xcharspec count"))?;
        w.u32(n)?;
        match self.0 {
            SpecRepr::Wire { bytes, .. } => w.bytes(bytes),
            SpecRepr::Slice(s) => s.iter().try_for_each(|v| v.emit(w)),
        }
    }
}

impl PartialEq for XcharSpec<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for XcharSpec<'_> {}

impl fmt::Debug for XcharSpec<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Iterator over an [`XcharSpec`].
#[derive(Clone, Debug)]
pub enum XcharIter<'a> {
    #[doc(hidden)]
    Wire(Reader<'a>),
    #[doc(hidden)]
    Slice(core::slice::Iter<'a, Xchar<'a>>),
}

impl<'a> Iterator for XcharIter<'a> {
    type Item = Xchar<'a>;

    fn next(&mut self) -> Option<Xchar<'a>> {
        match self {
            // The bytes were validated by `XcharSpec::parse`.
            XcharIter::Wire(r) => Xchar::parse(r).ok(),
            XcharIter::Slice(it) => it.next().copied(),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum SubsetRepr<'a> {
    /// The words, without the count word.
    Wire(&'a [u8]),
    Slice(&'a [u32]),
}

/// A bitmap over positions in an `xcharspec` (`xcharsubset`): element N is bit N mod 32
/// (bit 0 = least significant, AMB-21) of word N div 32; missing words are zero.
#[derive(Clone, Copy)]
pub struct XcharSubset<'a>(SubsetRepr<'a>);

impl<'a> XcharSubset<'a> {
    /// The empty subset (no words).
    pub const EMPTY: XcharSubset<'static> = XcharSubset(SubsetRepr::Slice(&[]));

    /// A subset to send, from its words (build them with [`subset_insert`]).
    pub const fn from_words(words: &'a [u32]) -> Self {
        XcharSubset(SubsetRepr::Slice(words))
    }

    /// Number of words on the wire.
    pub fn word_count(&self) -> usize {
        match self.0 {
            SubsetRepr::Wire(b) => b.len() / 4,
            SubsetRepr::Slice(s) => s.len(),
        }
    }

    /// Word `i`, zero past the end.
    pub fn word(&self, i: usize) -> u32 {
        match self.0 {
            SubsetRepr::Wire(b) => b
                .get(i.saturating_mul(4)..)
                .and_then(|b| b.first_chunk::<4>())
                .map_or(0, |w| u32::from_be_bytes(*w)),
            SubsetRepr::Slice(s) => s.get(i).copied().unwrap_or(0),
        }
    }

    /// True if element `n` of the referenced `xcharspec` is in the subset.
    pub fn contains(&self, n: usize) -> bool {
        self.word(n / 32) & (1 << (n % 32)) != 0
    }

    /// Indices of the elements in the subset, ascending.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.word_count() * 32).filter(move |&n| self.contains(n))
    }

    /// Bytes on the wire.
    pub fn wire_len(&self) -> usize {
        4 + 4 * self.word_count()
    }

    /// Decodes an `xcharsubset`.
    pub fn parse(r: &mut Reader<'a>) -> Result<Self, Error> {
        let n = r.u32("xcharsubset count").map_err(opt)? as usize;
        let bytes = r
            .take(
                n.checked_mul(4)
                    .ok_or(Error::BadOption("xcharsubset count"))?,
                "xcharsubset",
            )
            .map_err(opt)?;
        Ok(XcharSubset(SubsetRepr::Wire(bytes)))
    }

    /// Encodes an `xcharsubset`.
    pub fn emit(&self, w: &mut Writer<'_>) -> Result<(), Error> {
        let n = u32::try_from(self.word_count())
            .map_err(|_| Error::Unencodable("xcharsubset count"))?;
        w.u32(n)?;
        match self.0 {
            SubsetRepr::Wire(b) => w.bytes(b),
            SubsetRepr::Slice(s) => s.iter().try_for_each(|&v| w.u32(v)),
        }
    }
}

/// Sets element `n` in `words`; false if `words` is too short to hold it.
pub fn subset_insert(words: &mut [u32], n: usize) -> bool {
    match words.get_mut(n / 32) {
        Some(w) => {
            *w |= 1 << (n % 32);
            true
        }
        None => false,
    }
}

impl PartialEq for XcharSubset<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.word_count() == other.word_count()
            && (0..self.word_count()).all(|i| self.word(i) == other.word(i))
    }
}

impl Eq for XcharSubset<'_> {}

impl fmt::Debug for XcharSubset<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// An xcharext operation: the typed content of an RDMA2_OPTIONAL `rdma_optinfo`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation<'a> {
    /// ROPT_INITXCH: initial characteristics (one-way).
    InitXch {
        /// `optixch_start`.
        start: XcharSpec<'a>,
        /// `optixch_nochg`: which of `start` will not change.
        nochg: XcharSubset<'a>,
    },
    /// ROPT_REQXCH: ask the peer to change characteristics.
    ReqXch {
        /// `optreqxch_want`.
        want: XcharSpec<'a>,
    },
    /// ROPT_RESPXCH: answer to a REQXCH (subsets index its `want`).
    RespXch {
        /// `optrespxch_done`.
        done: XcharSubset<'a>,
        /// `optrespxch_rej`.
        rej: XcharSubset<'a>,
        /// `optrespxch_pend`.
        pend: XcharSubset<'a>,
    },
    /// ROPT_UPDXCH: a characteristic changed.
    UpdXch {
        /// `optupdxch_now`.
        now: Xchar<'a>,
        /// `optupdxch_pendclr`.
        pendclr: bool,
    },
}

impl<'a> Operation<'a> {
    /// Decodes `optinfo` as operation `opttype`; the whole body must be consumed.
    pub fn parse(opttype: u32, optinfo: &'a [u8]) -> Result<Self, Error> {
        let mut r = Reader::new(optinfo);
        let op = match opttype {
            ROPT_INITXCH => Operation::InitXch {
                start: XcharSpec::parse(&mut r)?,
                nochg: XcharSubset::parse(&mut r)?,
            },
            ROPT_REQXCH => Operation::ReqXch {
                want: XcharSpec::parse(&mut r)?,
            },
            ROPT_RESPXCH => Operation::RespXch {
                done: XcharSubset::parse(&mut r)?,
                rej: XcharSubset::parse(&mut r)?,
                pend: XcharSubset::parse(&mut r)?,
            },
            ROPT_UPDXCH => Operation::UpdXch {
                now: Xchar::parse(&mut r)?,
                pendclr: r.bool("optupdxch_pendclr").map_err(opt)?,
            },
            t => return Err(Error::UnsupportedOption(t)),
        };
        r.expect_empty("rdma_optinfo").map_err(opt)?;
        Ok(op)
    }

    /// The `rdma_opttype` of this operation.
    pub fn opttype(&self) -> u32 {
        match self {
            Operation::InitXch { .. } => ROPT_INITXCH,
            Operation::ReqXch { .. } => ROPT_REQXCH,
            Operation::RespXch { .. } => ROPT_RESPXCH,
            Operation::UpdXch { .. } => ROPT_UPDXCH,
        }
    }

    /// Bytes of the encoded `rdma_optinfo` (always a multiple of 4).
    pub fn buffer_len(&self) -> usize {
        match self {
            Operation::InitXch { start, nochg } => start.wire_len() + nochg.wire_len(),
            Operation::ReqXch { want } => want.wire_len(),
            Operation::RespXch { done, rej, pend } => {
                done.wire_len() + rej.wire_len() + pend.wire_len()
            }
            Operation::UpdXch { now, .. } => now.wire_len() + 4,
        }
    }

    /// Encodes the `rdma_optinfo` body.
    pub fn emit_body(&self, w: &mut Writer<'_>) -> Result<(), Error> {
        match self {
            Operation::InitXch { start, nochg } => {
                start.emit(w)?;
                nochg.emit(w)
            }
            Operation::ReqXch { want } => want.emit(w),
            Operation::RespXch { done, rej, pend } => {
                done.emit(w)?;
                rej.emit(w)?;
                pend.emit(w)
            }
            Operation::UpdXch { now, pendclr } => {
                now.emit(w)?;
                w.bool(*pendclr)
            }
        }
    }

    /// Encodes a whole RDMA2_OPTIONAL message carrying this operation into `buf`.
    pub fn emit_message(
        &self,
        xid: u32,
        credit: u32,
        direction: MsgType,
        buf: &mut [u8],
    ) -> Result<usize, Error> {
        let len = u32::try_from(self.buffer_len()).map_err(|_| Error::Unencodable("optinfo"))?;
        let mut w = Writer::new(buf);
        w.u32(xid)?;
        w.u32(v2::VERSION)?;
        w.u32(credit)?;
        w.u32(v2::RDMA2_OPTIONAL)?;
        w.u32(direction as u32)?;
        w.u32(self.opttype())?;
        w.u32(len)?;
        self.emit_body(&mut w)?;
        Ok(w.position())
    }
}

fn spec(f: &mut fmt::Formatter<'_>, name: &str, s: &XcharSpec<'_>) -> fmt::Result {
    writeln!(f, "        {name} (count: {})", s.len())?;
    s.iter()
        .enumerate()
        .try_for_each(|(i, v)| writeln!(f, "            [{i}] {v}"))
}

fn subset(f: &mut fmt::Formatter<'_>, name: &str, s: &XcharSubset<'_>) -> fmt::Result {
    write!(f, "        {name}: {{")?;
    for (k, i) in s.iter().enumerate() {
        write!(f, "{}{i}", if k == 0 { "" } else { ", " })?;
    }
    writeln!(f, "}}")
}

impl fmt::Display for Operation<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Operation::InitXch { start, nochg } => {
                spec(f, "optixch_start", start)?;
                subset(f, "optixch_nochg", nochg)
            }
            Operation::ReqXch { want } => spec(f, "optreqxch_want", want),
            Operation::RespXch { done, rej, pend } => {
                subset(f, "optrespxch_done", done)?;
                subset(f, "optrespxch_rej", rej)?;
                subset(f, "optrespxch_pend", pend)
            }
            Operation::UpdXch { now, pendclr } => {
                writeln!(f, "        optupdxch_now: {now}")?;
                writeln!(
                    f,
                    "        optupdxch_pendclr: {}",
                    if *pendclr { "TRUE" } else { "FALSE" }
                )
            }
        }
    }
}
