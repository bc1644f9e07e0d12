//! The iWARP wire as Linux `siw` speaks it: MPA Request/Reply (RFC 5044, RFC 6581), FPDU
//! framing with CRC-32C, DDP (RFC 5041) and RDMAP (RFC 5040) headers.
//!
//! Pure code: parsing borrows the input and never panics on it; emitting appends to a
//! caller-owned `Vec` (reused, so nothing is allocated once it has grown).

/// Key of an MPA Request frame.
pub const MPA_REQ_KEY: &[u8; 16] = b"MPA ID Req Frame";
/// Key of an MPA Reply frame.
pub const MPA_REP_KEY: &[u8; 16] = b"MPA ID Rep Frame";
/// Bytes before an MPA frame's private data.
pub const MPA_HDR_LEN: usize = 20;
/// Largest private data (IRD/ORD prefix included) siw accepts.
pub const MPA_MAX_PD: usize = 256;
/// MPA flag: markers.
pub const MPA_M: u8 = 0x80;
/// MPA flag: CRC-32C.
pub const MPA_C: u8 = 0x40;
/// MPA flag: reject.
pub const MPA_R: u8 = 0x20;
/// MPA flag: RFC 6581 enhanced (IRD/ORD prefix present).
pub const MPA_ENHANCED: u8 = 0x10;
/// Largest IRD/ORD value in the RFC 6581 prefix (14 bits).
pub const MPA_IRD_ORD_MASK: u16 = 0x3fff;

/// DDP control: tagged.
pub const DDP_T: u8 = 0x80;
/// DDP control: last segment.
pub const DDP_L: u8 = 0x40;
/// DDP version 1.
pub const DDP_DV: u8 = 0x01;
/// RDMAP version 1 in the RDMAP control byte.
pub const RDMAP_RV: u8 = 0x40;

/// RDMAP opcode: RDMA Write.
pub const OP_WRITE: u8 = 0;
/// RDMAP opcode: RDMA Read Request.
pub const OP_READ_REQ: u8 = 1;
/// RDMAP opcode: RDMA Read Response.
pub const OP_READ_RESP: u8 = 2;
/// RDMAP opcode: Send.
pub const OP_SEND: u8 = 3;
/// RDMAP opcode: Send with Invalidate.
pub const OP_SEND_INV: u8 = 4;
/// RDMAP opcode: Send with Solicited Event.
pub const OP_SEND_SE: u8 = 5;
/// RDMAP opcode: Send with Solicited Event and Invalidate.
pub const OP_SEND_SE_INV: u8 = 6;
/// RDMAP opcode: Terminate.
pub const OP_TERMINATE: u8 = 7;

/// Tagged DDP header length (control bytes, STag, TO).
pub const TAGGED_HDR: usize = 14;
/// Untagged DDP header length (control bytes, reserved/STag, QN, MSN, MO).
pub const UNTAGGED_HDR: usize = 18;
/// RDMA Read Request body length.
pub const READ_REQ_BODY: usize = 28;
/// Largest ULPDU (16-bit length field).
pub const MAX_ULPDU: usize = 0xffff;
/// Largest FPDU on the wire: length field, ULPDU, pad, CRC.
pub const MAX_FPDU: usize = 2 + MAX_ULPDU + 3 + 4;

/// Terminate layer: RDMAP.
pub const LAYER_RDMAP: u8 = 0;
/// Terminate layer: DDP.
pub const LAYER_DDP: u8 = 1;
/// Terminate layer: LLP (MPA).
pub const LAYER_LLP: u8 = 2;

/// What a Terminate reports: layer, error type and code (RFC 5040 §4.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermCode {
    /// 0 RDMAP, 1 DDP, 2 LLP.
    pub layer: u8,
    /// Error type within the layer.
    pub etype: u8,
    /// Error code.
    pub ecode: u8,
}

impl TermCode {
    /// Build a code.
    pub const fn new(layer: u8, etype: u8, ecode: u8) -> TermCode {
        TermCode {
            layer,
            etype,
            ecode,
        }
    }
    /// LLP CRC error.
    pub const CRC: TermCode = TermCode::new(LAYER_LLP, 0, 2);
    /// RDMAP remote operation: invalid RDMAP version.
    pub const RDMAP_VERSION: TermCode = TermCode::new(LAYER_RDMAP, 2, 5);
    /// RDMAP remote operation: unexpected opcode.
    pub const RDMAP_OPCODE: TermCode = TermCode::new(LAYER_RDMAP, 2, 6);
    /// RDMAP remote operation: catastrophic, stream (IRD exceeded).
    pub const RDMAP_IRD: TermCode = TermCode::new(LAYER_RDMAP, 2, 7);
    /// RDMAP remote operation: STag cannot be invalidated.
    pub const RDMAP_CANT_INVALIDATE: TermCode = TermCode::new(LAYER_RDMAP, 2, 9);
    /// DDP catastrophic (local placement failure, unexpected Read Response).
    pub const DDP_CATASTROPHIC: TermCode = TermCode::new(LAYER_DDP, 0, 0);
    /// DDP tagged: bad DDP version.
    pub const DDP_TAGGED_VERSION: TermCode = TermCode::new(LAYER_DDP, 1, 4);
    /// DDP untagged: invalid QN.
    pub const DDP_INVALID_QN: TermCode = TermCode::new(LAYER_DDP, 2, 1);
    /// DDP untagged: no buffer available.
    pub const DDP_NO_BUFFER: TermCode = TermCode::new(LAYER_DDP, 2, 2);
    /// DDP untagged: MSN out of range.
    pub const DDP_MSN: TermCode = TermCode::new(LAYER_DDP, 2, 3);
    /// DDP untagged: invalid MO.
    pub const DDP_MO: TermCode = TermCode::new(LAYER_DDP, 2, 4);
    /// DDP untagged: message too long for the receive buffer.
    pub const DDP_TOO_LONG: TermCode = TermCode::new(LAYER_DDP, 2, 5);
    /// DDP untagged: bad DDP version.
    pub const DDP_UNTAGGED_VERSION: TermCode = TermCode::new(LAYER_DDP, 2, 6);
}

/// Why a frame or FPDU was refused; carries the Terminate to send where one applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// More bytes are needed.
    Incomplete,
    /// Not an MPA frame (bad key, revision, length): abort the connection.
    BadMpa(&'static str),
    /// A protocol violation answered with this Terminate.
    Term(TermCode, &'static str),
}

/// A parsed MPA Request or Reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MpaFrame<'a> {
    /// Reply (true) or Request (false).
    pub reply: bool,
    /// Flags byte (M, C, R, Enhanced, ...).
    pub flags: u8,
    /// Revision (1 or 2).
    pub revision: u8,
    /// The RFC 6581 prefix words (IRD word, ORD word, control bits included) when rev 2 +
    /// Enhanced.
    pub ird_ord: Option<(u16, u16)>,
    /// ULP private data (prefix stripped).
    pub private_data: &'a [u8],
}

impl MpaFrame<'_> {
    /// IRD from the prefix (14 bits), if any.
    pub fn ird(&self) -> Option<u16> {
        self.ird_ord.map(|(i, _)| i & MPA_IRD_ORD_MASK)
    }
    /// ORD from the prefix (14 bits), if any.
    pub fn ord(&self) -> Option<u16> {
        self.ird_ord.map(|(_, o)| o & MPA_IRD_ORD_MASK)
    }
}

/// Total length of the MPA frame starting at `buf` once its header is present.
pub fn mpa_frame_len(buf: &[u8]) -> Result<usize, WireError> {
    let hdr = buf.get(..MPA_HDR_LEN).ok_or(WireError::Incomplete)?;
    let pd_len = usize::from(u16::from_be_bytes([hdr[18], hdr[19]]));
    if pd_len > MPA_MAX_PD {
        return Err(WireError::BadMpa("private data longer than 256"));
    }
    Ok(MPA_HDR_LEN + pd_len)
}

/// Parse one MPA frame (exactly the bytes of [`mpa_frame_len`]; extra bytes are ignored).
pub fn parse_mpa(buf: &[u8]) -> Result<MpaFrame<'_>, WireError> {
    let total = mpa_frame_len(buf)?;
    let frame = buf.get(..total).ok_or(WireError::Incomplete)?;
    let reply = match &frame[..16] {
        k if k == MPA_REQ_KEY => false,
        k if k == MPA_REP_KEY => true,
        _ => return Err(WireError::BadMpa("bad MPA key")),
    };
    let flags = frame[16];
    let revision = frame[17];
    if revision > 2 {
        return Err(WireError::BadMpa("MPA revision above 2"));
    }
    let mut pd = &frame[MPA_HDR_LEN..];
    let mut ird_ord = None;
    if revision == 2 && flags & MPA_ENHANCED != 0 {
        if pd.len() < 4 {
            return Err(WireError::BadMpa("enhanced MPA without IRD/ORD prefix"));
        }
        ird_ord = Some((
            u16::from_be_bytes([pd[0], pd[1]]),
            u16::from_be_bytes([pd[2], pd[3]]),
        ));
        pd = &pd[4..];
    }
    Ok(MpaFrame {
        reply,
        flags,
        revision,
        ird_ord,
        private_data: pd,
    })
}

/// Append an MPA frame; `ird_ord` adds the RFC 6581 prefix (set [`MPA_ENHANCED`] in `flags`
/// and use revision 2 with it). Private data beyond the 256-byte limit is cut.
pub fn emit_mpa(
    out: &mut Vec<u8>,
    reply: bool,
    flags: u8,
    revision: u8,
    ird_ord: Option<(u16, u16)>,
    private_data: &[u8],
) {
    out.extend_from_slice(if reply { MPA_REP_KEY } else { MPA_REQ_KEY });
    out.push(flags);
    out.push(revision);
    let prefix = if ird_ord.is_some() { 4 } else { 0 };
    let pd = &private_data[..private_data.len().min(MPA_MAX_PD - prefix)];
    out.extend_from_slice(&((prefix + pd.len()) as u16).to_be_bytes());
    if let Some((ird, ord)) = ird_ord {
        out.extend_from_slice(&ird.to_be_bytes());
        out.extend_from_slice(&ord.to_be_bytes());
    }
    out.extend_from_slice(pd);
}

/// CRC-32C as MPA puts it on the wire (little-endian bytes).
pub fn mpa_crc(bytes: &[u8]) -> [u8; 4] {
    crc32c::crc32c(bytes).to_le_bytes()
}

/// Total FPDU length (length field, ULPDU, pad, CRC) for a ULPDU of `ulpdu_len` bytes.
pub const fn fpdu_len(ulpdu_len: usize) -> usize {
    ((2 + ulpdu_len + 3) & !3) + 4
}

/// One decoded DDP segment with its RDMAP message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment<'a> {
    /// RDMA Write segment: place `payload` at `to` under `stag`.
    Write {
        /// Data sink STag.
        stag: u32,
        /// Tagged offset of the first payload byte.
        to: u64,
        /// Last segment of the message.
        last: bool,
        /// The data.
        payload: &'a [u8],
    },
    /// RDMA Read Response segment.
    ReadResponse {
        /// Data sink STag (the Read Request's).
        stag: u32,
        /// Tagged offset of the first payload byte.
        to: u64,
        /// Last segment of the message.
        last: bool,
        /// The data.
        payload: &'a [u8],
    },
    /// Send (opcodes 3–6) segment on QN 0.
    Send {
        /// STag to invalidate (Send with Invalidate).
        invalidate: Option<u32>,
        /// Solicited event requested.
        solicited: bool,
        /// Message sequence number.
        msn: u32,
        /// Message offset of the first payload byte.
        mo: u32,
        /// Last segment of the message.
        last: bool,
        /// The data.
        payload: &'a [u8],
    },
    /// RDMA Read Request on QN 1.
    ReadRequest(ReadRequest),
    /// Terminate on QN 2.
    Terminate {
        /// What the peer reports.
        code: TermCode,
        /// Flags word (M, D, R).
        flags: u16,
        /// Bytes after the 4-byte Terminate control word.
        rest: &'a [u8],
    },
}

/// An RDMA Read Request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequest {
    /// MSN on QN 1.
    pub msn: u32,
    /// Requester's sink STag.
    pub sink_stag: u32,
    /// Requester's sink TO.
    pub sink_to: u64,
    /// Bytes to read.
    pub size: u32,
    /// Responder's source STag.
    pub src_stag: u32,
    /// Responder's source TO.
    pub src_to: u64,
}

fn be32(b: &[u8], off: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[off..off + 4]);
    u32::from_be_bytes(w)
}

fn be64(b: &[u8], off: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[off..off + 8]);
    u64::from_be_bytes(w)
}

/// Length of the complete FPDU at the start of `buf`, or `Incomplete`.
pub fn fpdu_total(buf: &[u8]) -> Result<usize, WireError> {
    let n = buf.get(..2).ok_or(WireError::Incomplete)?;
    let ulpdu = usize::from(u16::from_be_bytes([n[0], n[1]]));
    let total = fpdu_len(ulpdu);
    if buf.len() < total {
        return Err(WireError::Incomplete);
    }
    Ok(total)
}

/// Parse the FPDU at the start of `buf`; returns the segment and the bytes it used.
/// With `crc`, a CRC mismatch is `Term(TermCode::CRC)`.
#[inline]
pub fn parse_fpdu(buf: &[u8], crc: bool) -> Result<(Segment<'_>, usize), WireError> {
    let total = fpdu_total(buf)?;
    let fpdu = &buf[..total];
    if crc {
        let (body, c) = fpdu.split_at(total - 4);
        if mpa_crc(body) != c {
            return Err(WireError::Term(TermCode::CRC, "bad CRC"));
        }
    }
    let ulen = usize::from(u16::from_be_bytes([fpdu[0], fpdu[1]]));
    let u = &fpdu[2..2 + ulen];
    Ok((parse_ulpdu(u)?, total))
}

/// Parse a ULPDU (DDP segment) without its MPA framing.
pub fn parse_ulpdu(u: &[u8]) -> Result<Segment<'_>, WireError> {
    if u.len() < 2 {
        return Err(WireError::Term(TermCode::DDP_CATASTROPHIC, "short ULPDU"));
    }
    let ddp = u[0];
    let rdmap = u[1];
    let tagged = ddp & DDP_T != 0;
    let last = ddp & DDP_L != 0;
    if ddp & 0x03 != DDP_DV {
        return Err(WireError::Term(
            if tagged {
                TermCode::DDP_TAGGED_VERSION
            } else {
                TermCode::DDP_UNTAGGED_VERSION
            },
            "bad DDP version",
        ));
    }
    if rdmap & 0xc0 != RDMAP_RV {
        return Err(WireError::Term(
            TermCode::RDMAP_VERSION,
            "bad RDMAP version",
        ));
    }
    let op = rdmap & 0x0f;
    if tagged {
        if u.len() < TAGGED_HDR {
            return Err(WireError::Term(
                TermCode::DDP_CATASTROPHIC,
                "short tagged header",
            ));
        }
        let stag = be32(u, 2);
        let to = be64(u, 6);
        let payload = &u[TAGGED_HDR..];
        return match op {
            OP_WRITE => Ok(Segment::Write {
                stag,
                to,
                last,
                payload,
            }),
            OP_READ_RESP => Ok(Segment::ReadResponse {
                stag,
                to,
                last,
                payload,
            }),
            _ => Err(WireError::Term(TermCode::RDMAP_OPCODE, "bad tagged opcode")),
        };
    }
    if u.len() < UNTAGGED_HDR {
        return Err(WireError::Term(
            TermCode::DDP_CATASTROPHIC,
            "short untagged header",
        ));
    }
    let inv = be32(u, 2);
    let qn = be32(u, 6);
    let msn = be32(u, 10);
    let mo = be32(u, 14);
    let payload = &u[UNTAGGED_HDR..];
    match op {
        OP_SEND | OP_SEND_INV | OP_SEND_SE | OP_SEND_SE_INV => {
            if qn != 0 {
                return Err(WireError::Term(
                    TermCode::DDP_INVALID_QN,
                    "Send not on QN 0",
                ));
            }
            Ok(Segment::Send {
                invalidate: (op == OP_SEND_INV || op == OP_SEND_SE_INV).then_some(inv),
                solicited: op == OP_SEND_SE || op == OP_SEND_SE_INV,
                msn,
                mo,
                last,
                payload,
            })
        }
        OP_READ_REQ => {
            if qn != 1 {
                return Err(WireError::Term(
                    TermCode::DDP_INVALID_QN,
                    "Read Request not on QN 1",
                ));
            }
            if payload.len() != READ_REQ_BODY || !last || mo != 0 {
                return Err(WireError::Term(
                    TermCode::RDMAP_OPCODE,
                    "malformed Read Request",
                ));
            }
            Ok(Segment::ReadRequest(ReadRequest {
                msn,
                sink_stag: be32(payload, 0),
                sink_to: be64(payload, 4),
                size: be32(payload, 12),
                src_stag: be32(payload, 16),
                src_to: be64(payload, 20),
            }))
        }
        OP_TERMINATE => {
            if qn != 2 || payload.len() < 4 {
                return Err(WireError::Term(
                    TermCode::DDP_INVALID_QN,
                    "malformed Terminate",
                ));
            }
            Ok(Segment::Terminate {
                code: TermCode::new(payload[0] >> 4, payload[0] & 0x0f, payload[1]),
                flags: u16::from_be_bytes([payload[2], payload[3]]),
                rest: &payload[4..],
            })
        }
        _ => Err(WireError::Term(
            TermCode::RDMAP_OPCODE,
            "bad untagged opcode",
        )),
    }
}

/// Start an FPDU in `out`: reserves the length field and returns the FPDU's start offset.
#[inline]
pub fn begin_fpdu(out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0, 0]);
    start
}

/// Finish the FPDU begun at `start`: fill the ULPDU length, pad, and append the CRC (zeros
/// when `crc` is off, as siw sends).
// Always inline: every Send is finished here, and LLVM kept it out of line on its own.
#[inline(always)]
pub fn finish_fpdu(out: &mut Vec<u8>, start: usize, crc: bool) {
    let ulen = out.len() - start - 2;
    debug_assert!(ulen <= MAX_ULPDU);
    out[start..start + 2].copy_from_slice(&(ulen as u16).to_be_bytes());
    // Pad and CRC as fixed-size appends cut back to the FPDU's length: a byte-at-a-time pad
    // loop (or a variable-length copy, a `memcpy` call) cost more than the FPDU's framing
    // otherwise, and every Send pays it.
    let end = start + fpdu_len(ulen);
    if crc {
        out.extend_from_slice(&[0; 3]);
        out.truncate(end - 4);
        let c = mpa_crc(&out[start..]);
        out.extend_from_slice(&c);
    } else {
        out.extend_from_slice(&[0; 7]);
        out.truncate(end);
    }
}

/// A tagged DDP header (RDMA Write or Read Response), built whole: appended at once, it is one
/// capacity check instead of one per field.
#[inline]
fn tagged_hdr(opcode: u8, last: bool, stag: u32, to: u64) -> [u8; TAGGED_HDR] {
    let mut h = [0u8; TAGGED_HDR];
    h[0] = DDP_T | if last { DDP_L } else { 0 } | DDP_DV;
    h[1] = RDMAP_RV | opcode;
    h[2..6].copy_from_slice(&stag.to_be_bytes());
    h[6..14].copy_from_slice(&to.to_be_bytes());
    h
}

/// An untagged DDP header, built whole (see [`tagged_hdr`]).
#[inline]
fn untagged_hdr(
    opcode: u8,
    last: bool,
    inv_stag: u32,
    qn: u32,
    msn: u32,
    mo: u32,
) -> [u8; UNTAGGED_HDR] {
    let mut h = [0u8; UNTAGGED_HDR];
    h[0] = if last { DDP_L } else { 0 } | DDP_DV;
    h[1] = RDMAP_RV | opcode;
    h[2..6].copy_from_slice(&inv_stag.to_be_bytes());
    h[6..10].copy_from_slice(&qn.to_be_bytes());
    h[10..14].copy_from_slice(&msn.to_be_bytes());
    h[14..18].copy_from_slice(&mo.to_be_bytes());
    h
}

/// Append a tagged DDP header (RDMA Write or Read Response).
#[inline]
pub fn put_tagged(out: &mut Vec<u8>, opcode: u8, last: bool, stag: u32, to: u64) {
    out.extend_from_slice(&tagged_hdr(opcode, last, stag, to));
}

/// Append an untagged DDP header.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn put_untagged(
    out: &mut Vec<u8>,
    opcode: u8,
    last: bool,
    inv_stag: u32,
    qn: u32,
    msn: u32,
    mo: u32,
) {
    out.extend_from_slice(&untagged_hdr(opcode, last, inv_stag, qn, msn, mo));
}

/// [`begin_fpdu`] and [`put_tagged`] in one append (every Write and Read Response segment
/// starts so); returns the FPDU's start offset.
#[inline]
pub fn begin_tagged(out: &mut Vec<u8>, opcode: u8, last: bool, stag: u32, to: u64) -> usize {
    let mut f = [0u8; 2 + TAGGED_HDR];
    f[2..].copy_from_slice(&tagged_hdr(opcode, last, stag, to));
    let start = out.len();
    out.extend_from_slice(&f);
    start
}

/// [`begin_fpdu`] and [`put_untagged`] in one append (every Send segment starts so); returns
/// the FPDU's start offset.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn begin_untagged(
    out: &mut Vec<u8>,
    opcode: u8,
    last: bool,
    inv_stag: u32,
    qn: u32,
    msn: u32,
    mo: u32,
) -> usize {
    let mut f = [0u8; 2 + UNTAGGED_HDR];
    f[2..].copy_from_slice(&untagged_hdr(opcode, last, inv_stag, qn, msn, mo));
    let start = out.len();
    out.extend_from_slice(&f);
    start
}

/// Append a complete RDMA Read Request FPDU.
pub fn emit_read_request(out: &mut Vec<u8>, r: &ReadRequest, crc: bool) {
    let s = begin_fpdu(out);
    put_untagged(out, OP_READ_REQ, true, 0, 1, r.msn, 0);
    out.extend_from_slice(&r.sink_stag.to_be_bytes());
    out.extend_from_slice(&r.sink_to.to_be_bytes());
    out.extend_from_slice(&r.size.to_be_bytes());
    out.extend_from_slice(&r.src_stag.to_be_bytes());
    out.extend_from_slice(&r.src_to.to_be_bytes());
    finish_fpdu(out, s, crc);
}

/// Terminate flag: DDP Segment Length valid.
pub const TERM_M: u16 = 0x8000;
/// Terminate flag: DDP header included.
pub const TERM_D: u16 = 0x4000;
/// Terminate flag: RDMAP (Read Request) header included.
pub const TERM_R: u16 = 0x2000;

/// Append a Terminate FPDU. `ddp_hdr` (the offending segment's DDP/RDMAP header) sets M and D
/// with `seg_len`; `read_body` (a refused Read Request's 28 bytes) sets R.
pub fn emit_terminate(
    out: &mut Vec<u8>,
    code: TermCode,
    seg_len: u16,
    ddp_hdr: &[u8],
    read_body: &[u8],
    crc: bool,
) {
    let s = begin_fpdu(out);
    put_untagged(out, OP_TERMINATE, true, 0, 2, 1, 0);
    out.push((code.layer << 4) | (code.etype & 0x0f));
    out.push(code.ecode);
    let mut flags = 0u16;
    if !ddp_hdr.is_empty() {
        flags |= TERM_M | TERM_D;
    }
    if !read_body.is_empty() {
        flags |= TERM_R;
    }
    out.extend_from_slice(&flags.to_be_bytes());
    if flags & (TERM_M | TERM_D) != 0 {
        out.extend_from_slice(&seg_len.to_be_bytes());
        out.extend_from_slice(ddp_hdr);
    }
    out.extend_from_slice(read_body);
    finish_fpdu(out, s, crc);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    // IWARP.md §6 / §2: 32 zero bytes → wire aa 36 91 8a.
    #[test]
    fn iwarp_2_crc32c_little_endian_on_wire() {
        assert_eq!(mpa_crc(&[0u8; 32]), [0xaa, 0x36, 0x91, 0x8a]);
    }

    #[test]
    fn iwarp_6_mpa_request_rev2_golden() {
        let want = hex("4d 50 41 20 49 44 20 52 65 71 20 46 72 61 6d 65
             10 02 00 0c 00 80 00 00 f6 ab 0e 18 01 01 03 03");
        let mut out = Vec::new();
        emit_mpa(
            &mut out,
            false,
            MPA_ENHANCED,
            2,
            Some((128, 0)),
            &hex("f6 ab 0e 18 01 01 03 03"),
        );
        assert_eq!(out, want);
        let f = parse_mpa(&want).unwrap();
        assert!(!f.reply);
        assert_eq!((f.revision, f.flags), (2, MPA_ENHANCED));
        assert_eq!((f.ird(), f.ord()), (Some(128), Some(0)));
        assert_eq!(f.private_data, &want[24..]);
    }

    #[test]
    fn iwarp_6_mpa_reply_rev2_golden() {
        let mut want = MPA_REP_KEY.to_vec();
        want.extend(hex("10 02 00 0c 00 00 00 80 f6 ab 0e 18 01 00 03 03"));
        let f = parse_mpa(&want).unwrap();
        assert!(f.reply);
        assert_eq!((f.ird(), f.ord()), (Some(0), Some(128)));
        let mut out = Vec::new();
        emit_mpa(&mut out, true, f.flags, 2, f.ird_ord, f.private_data);
        assert_eq!(out, want);
    }

    #[test]
    fn iwarp_1_5_reject_reply_parses() {
        let mut buf = MPA_REP_KEY.to_vec();
        buf.extend(hex("60 01 00 00"));
        let f = parse_mpa(&buf).unwrap();
        assert_eq!(f.flags & MPA_R, MPA_R);
        assert_eq!(f.revision, 1);
        assert!(f.private_data.is_empty());
    }

    #[test]
    fn iwarp_1_1_mpa_refuses_bad_key_rev_and_length() {
        let mut buf = MPA_REQ_KEY.to_vec();
        buf.extend(hex("00 03 00 00"));
        assert!(matches!(parse_mpa(&buf), Err(WireError::BadMpa(_))));
        buf[17] = 2;
        buf[0] = b'X';
        assert!(matches!(parse_mpa(&buf), Err(WireError::BadMpa(_))));
        buf[0] = b'M';
        buf[18] = 0x01;
        buf[19] = 0x01; // 257
        assert!(matches!(parse_mpa(&buf), Err(WireError::BadMpa(_))));
        buf[16] = MPA_ENHANCED;
        buf[18] = 0;
        buf[19] = 2;
        buf.extend([0, 0]);
        assert!(matches!(parse_mpa(&buf), Err(WireError::BadMpa(_))));
    }

    const SEND_GOLDEN: &str = "00 56 41 43 00 00 00 00 00 00 00 00 00 00 00 01
        00 00 00 00 12 34 56 78 00 00 00 01 00 00 00 20
        00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
        12 34 56 78 00 00 00 00 00 00 00 02 00 01 86 a3
        00 00 00 03 00 00 00 00 00 00 00 00 00 00 00 00
        00 00 00 00 00 00 00 00 f2 00 c7 3b";

    #[test]
    fn iwarp_6_send_fpdu_with_crc_golden() {
        let want = hex(SEND_GOLDEN);
        let payload = &want[20..88];
        let mut out = Vec::new();
        let s = begin_fpdu(&mut out);
        put_untagged(&mut out, OP_SEND, true, 0, 0, 1, 0);
        out.extend_from_slice(payload);
        finish_fpdu(&mut out, s, true);
        assert_eq!(out, want);
        let (seg, used) = parse_fpdu(&want, true).unwrap();
        assert_eq!(used, 92);
        assert_eq!(
            seg,
            Segment::Send {
                invalidate: None,
                solicited: false,
                msn: 1,
                mo: 0,
                last: true,
                payload
            }
        );
    }

    #[test]
    fn iwarp_2_bad_crc_is_llp_terminate() {
        let mut b = hex(SEND_GOLDEN);
        b[30] ^= 1;
        assert_eq!(
            parse_fpdu(&b, true).unwrap_err(),
            WireError::Term(TermCode::CRC, "bad CRC")
        );
        // CRC off: receivers ignore the field.
        assert!(parse_fpdu(&b, false).is_ok());
    }

    #[test]
    fn iwarp_6_rdma_write_golden() {
        let want = hex("00 1b c1 40 00 00 a3 01 00 00 7f 00 12 34 50 00
             68 65 6c 6c 6f 2c 20 77 6f 72 6c 64 21 00 00 00 d0 b8 13 6b");
        let mut out = Vec::new();
        let s = begin_fpdu(&mut out);
        put_tagged(&mut out, OP_WRITE, true, 0xa301, 0x7f0012345000);
        out.extend_from_slice(b"hello, world!");
        finish_fpdu(&mut out, s, true);
        assert_eq!(out, want);
        let (seg, used) = parse_fpdu(&want, true).unwrap();
        assert_eq!(used, want.len());
        assert_eq!(
            seg,
            Segment::Write {
                stag: 0xa301,
                to: 0x7f0012345000,
                last: true,
                payload: b"hello, world!"
            }
        );
    }

    #[test]
    fn iwarp_6_read_request_golden() {
        let want = hex("00 2e 41 41 00 00 00 00 00 00 00 01 00 00 00 01
             00 00 00 00 00 00 12 34 00 00 7f 00 aa aa 00 00
             00 00 10 00 00 00 a3 01 00 00 7f 00 12 34 50 00 14 b0 af 67");
        let r = ReadRequest {
            msn: 1,
            sink_stag: 0x1234,
            sink_to: 0x7f00aaaa0000,
            size: 4096,
            src_stag: 0xa301,
            src_to: 0x7f0012345000,
        };
        let mut out = Vec::new();
        emit_read_request(&mut out, &r, true);
        assert_eq!(out, want);
        assert_eq!(parse_fpdu(&want, true).unwrap().0, Segment::ReadRequest(r));
    }

    #[test]
    fn iwarp_6_read_response_golden() {
        let want = hex(
            "00 16 c1 42 00 00 12 34 00 00 7f 00 aa aa 00 00 41 42 43 44 45 46 47 48 3a bd 55 a2",
        );
        let mut out = Vec::new();
        let s = begin_fpdu(&mut out);
        put_tagged(&mut out, OP_READ_RESP, true, 0x1234, 0x7f00aaaa0000);
        out.extend_from_slice(b"ABCDEFGH");
        finish_fpdu(&mut out, s, true);
        assert_eq!(out, want);
        assert_eq!(
            parse_fpdu(&want, true).unwrap().0,
            Segment::ReadResponse {
                stag: 0x1234,
                to: 0x7f00aaaa0000,
                last: true,
                payload: b"ABCDEFGH"
            }
        );
    }

    #[test]
    fn iwarp_6_send_with_invalidate_golden() {
        let want = hex(
            "00 16 41 44 00 00 a3 01 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 00 c9 e4 ed 79",
        );
        let mut out = Vec::new();
        let s = begin_fpdu(&mut out);
        put_untagged(&mut out, OP_SEND_INV, true, 0xa301, 0, 2, 0);
        out.extend_from_slice(&[0; 4]);
        finish_fpdu(&mut out, s, true);
        assert_eq!(out, want);
        assert_eq!(
            parse_fpdu(&want, true).unwrap().0,
            Segment::Send {
                invalidate: Some(0xa301),
                solicited: false,
                msn: 2,
                mo: 0,
                last: true,
                payload: &[0; 4]
            }
        );
    }

    #[test]
    fn iwarp_6_terminate_no_buffer_golden() {
        let want = hex("00 2a 41 47 00 00 00 00 00 00 00 02 00 00 00 01
             00 00 00 00 12 02 c0 00 00 44 41 43 00 00 00 00
             00 00 00 00 00 00 00 01 00 00 00 00 e6 00 30 d0");
        let mut hdr = Vec::new();
        put_untagged(&mut hdr, OP_SEND, true, 0, 0, 1, 0);
        let mut out = Vec::new();
        emit_terminate(&mut out, TermCode::DDP_NO_BUFFER, 68, &hdr, &[], true);
        assert_eq!(out, want);
        match parse_fpdu(&want, true).unwrap().0 {
            Segment::Terminate { code, flags, rest } => {
                assert_eq!(code, TermCode::DDP_NO_BUFFER);
                assert_eq!(flags, TERM_M | TERM_D);
                assert_eq!(&rest[2..], &hdr[..]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn iwarp_6_terminate_llp_crc_golden() {
        let want = hex(
            "00 16 41 47 00 00 00 00 00 00 00 02 00 00 00 01 00 00 00 00 20 02 00 00 7f e4 25 85",
        );
        let mut out = Vec::new();
        emit_terminate(&mut out, TermCode::CRC, 0, &[], &[], true);
        assert_eq!(out, want);
        assert!(matches!(
            parse_fpdu(&want, true).unwrap().0,
            Segment::Terminate {
                code: TermCode::CRC,
                flags: 0,
                ..
            }
        ));
    }

    #[test]
    fn iwarp_4_bad_opcode_and_versions_refused() {
        let mut b = hex(SEND_GOLDEN);
        b[3] = 0x48; // opcode 8
        assert!(matches!(
            parse_fpdu(&b, false),
            Err(WireError::Term(TermCode::RDMAP_OPCODE, _))
        ));
        b[3] = 0x83; // RDMAP version 2
        assert!(matches!(
            parse_fpdu(&b, false),
            Err(WireError::Term(TermCode::RDMAP_VERSION, _))
        ));
        b[3] = 0x43;
        b[2] = 0x42; // DDP version 2
        assert!(matches!(
            parse_fpdu(&b, false),
            Err(WireError::Term(TermCode::DDP_UNTAGGED_VERSION, _))
        ));
    }

    #[test]
    fn iwarp_2_incomplete_fpdu_waits() {
        let b = hex(SEND_GOLDEN);
        for n in 0..b.len() {
            assert_eq!(
                parse_fpdu(&b[..n], true).unwrap_err(),
                WireError::Incomplete
            );
        }
    }
}
