//! Chunk lists shared by versions 1 and 2 (RFC 8166 §4.3, §4.7): segments, the Read list,
//! Write chunks, the Write list and the Reply chunk.
//!
//! A list is either a validated view over received bytes (zero-copy, from `parse`) or a
//! slice the sender owns (from `from_*`); both iterate and encode the same way, so a
//! decoded header re-encodes byte for byte and a new one is built without allocation.

use core::fmt;

use crate::xdr::{Reader, Writer};
use crate::Error;

/// Hard caps applied while decoding, so a hostile header cannot make us do unbounded work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Read segments in one Read list (all positions together).
    pub max_read_segments: usize,
    /// Distinct positions (Read chunks) in one Read list (IMPL-3.2-c).
    pub max_read_chunks: usize,
    /// Write chunks in one Write list.
    pub max_write_chunks: usize,
    /// Segments in one chunk (Read chunk, Write chunk or Reply chunk).
    pub max_segments_per_chunk: usize,
    /// Highest `rdma_vers` accepted (1, or 2 to also speak version two).
    pub max_version: u32,
}

impl Limits {
    /// Caps large enough for Linux peers (which use at most a few dozen segments).
    pub const DEFAULT: Limits = Limits {
        max_read_segments: 64,
        max_read_chunks: 8,
        max_write_chunks: 8,
        max_segments_per_chunk: 64,
        max_version: 2,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// A plain segment (HLOO, RFC 8166 §3.4.3): a registered memory region of the requester.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Segment {
    /// Steering tag (R_key).
    pub handle: u32,
    /// Length in bytes.
    pub length: u32,
    /// Address or offset in the region.
    pub offset: u64,
}

/// Bytes of one plain segment on the wire.
pub const SEGMENT_LEN: usize = 16;
/// Bytes of one Read list entry on the wire: discriminator, position, segment.
const READ_ENTRY_LEN: usize = 4 + 4 + SEGMENT_LEN;

impl Segment {
    /// Builds a segment.
    pub const fn new(handle: u32, length: u32, offset: u64) -> Self {
        Segment {
            handle,
            length,
            offset,
        }
    }

    /// One past the last byte addressed, or `None` if `offset + length` wraps 64 bits.
    #[inline]
    pub fn end(&self) -> Option<u64> {
        self.offset.checked_add(u64::from(self.length))
    }

    #[inline]
    fn from_wire(b: &[u8; SEGMENT_LEN]) -> Self {
        Segment {
            handle: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            length: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            offset: u64::from_be_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
        }
    }

    #[inline]
    fn emit(&self, w: &mut Writer<'_>) -> Result<(), Error> {
        w.u32(self.handle)?;
        w.u32(self.length)?;
        w.u64(self.offset)
    }
}

/// One Read list entry (PHLOO, RFC 8166 §3.4.5): a segment and its Payload-stream position.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReadSegment {
    /// Offset of the reduced item in the unreduced Payload stream (0 = the RPC XID).
    pub position: u32,
    /// The memory to pull with RDMA Read.
    pub target: Segment,
}

impl ReadSegment {
    /// Builds a read segment.
    pub const fn new(position: u32, target: Segment) -> Self {
        ReadSegment { position, target }
    }
}

#[derive(Clone, Copy, Debug)]
enum ReadRepr<'a> {
    /// Validated `1 P H L O` entries, without the terminating 0.
    Wire(&'a [u8]),
    Slice(&'a [ReadSegment]),
}

/// The Read list: read segments in list order.
#[derive(Clone, Copy)]
pub struct ReadList<'a>(ReadRepr<'a>);

impl<'a> ReadList<'a> {
    /// The empty Read list.
    pub const EMPTY: ReadList<'static> = ReadList(ReadRepr::Slice(&[]));

    /// A Read list to send, in the order given (send sorted by position, AMB-11).
    pub const fn from_segments(segments: &'a [ReadSegment]) -> Self {
        ReadList(ReadRepr::Slice(segments))
    }

    /// Number of read segments.
    #[inline]
    pub fn len(&self) -> usize {
        match self.0 {
            ReadRepr::Wire(b) => b.len() / READ_ENTRY_LEN,
            ReadRepr::Slice(s) => s.len(),
        }
    }

    /// True when the list holds no segment.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Read segments in list order.
    #[inline]
    pub fn iter(&self) -> ReadSegments<'a> {
        match self.0 {
            ReadRepr::Wire(b) => ReadSegments::Wire(b.chunks_exact(READ_ENTRY_LEN)),
            ReadRepr::Slice(s) => ReadSegments::Slice(s.iter()),
        }
    }

    /// Read chunks: segments grouped by position, in order of first appearance, keeping
    /// list order within a position (AMB-11).
    #[inline]
    pub fn chunks(&self) -> ReadChunks<'a> {
        ReadChunks {
            list: *self,
            next: 0,
        }
    }

    /// True if some segment has position 0 (a Position Zero Read chunk, RFC 8166 §3.5.3).
    #[inline]
    pub fn has_position_zero(&self) -> bool {
        self.iter().any(|s| s.position == 0)
    }

    /// Bytes of this list on the wire, terminator included.
    #[inline]
    pub fn wire_len(&self) -> usize {
        4 + READ_ENTRY_LEN * self.len()
    }

    #[inline]
    fn parse(r: &mut Reader<'a>, limits: &Limits) -> Result<Self, Error> {
        let start = r.rest();
        let mut n = 0usize;
        // One pass covers lists sent sorted by position (AMB-11, as Linux sends them);
        // anything else is checked again by the general `validate`.
        let mut sorted = true;
        let (mut pos, mut len, mut segs, mut chunks) = (0u32, 0u32, 0usize, 0usize);
        loop {
            match r.u32("read list entry discriminator")? {
                0 => break,
                1 => {
                    n += 1;
                    if n > limits.max_read_segments {
                        return Err(Error::TooMany("read segments"));
                    }
                    let e = r.take(READ_ENTRY_LEN - 4, "read segment")?;
                    let (p, seg) = e
                        .split_first_chunk::<4>()
                        .ok_or(Error::Truncated("read segment"))?;
                    let position = u32::from_be_bytes(*p);
                    let seg = Segment::from_wire(
                        seg.first_chunk().ok_or(Error::Truncated("read segment"))?,
                    );
                    if position % 4 != 0 {
                        return Err(Error::MisalignedPosition(position));
                    }
                    seg.end().ok_or(Error::SegmentWraps)?;
                    if !sorted {
                        continue;
                    }
                    if n == 1 || position != pos {
                        if n > 1 && position < pos {
                            sorted = false;
                            continue;
                        }
                        if n > 1
                            && pos != 0
                            && u64::from(pos) + u64::from(len) > u64::from(position)
                        {
                            return Err(Error::OverlappingReadChunks);
                        }
                        chunks += 1;
                        if chunks > limits.max_read_chunks {
                            return Err(Error::TooMany("read chunks"));
                        }
                        (pos, len, segs) = (position, 0, 0);
                    }
                    segs += 1;
                    if segs > limits.max_segments_per_chunk {
                        return Err(Error::TooMany("segments in a read chunk"));
                    }
                    len = len.checked_add(seg.length).ok_or(Error::ChunkTooLong)?;
                }
                v => return Err(Error::BadValue("read list entry discriminator", v)),
            }
        }
        let bytes = start
            .get(..n * READ_ENTRY_LEN)
            .ok_or(Error::Truncated("read list"))?;
        let list = ReadList(ReadRepr::Wire(bytes));
        if !sorted {
            list.validate(limits)?;
        }
        Ok(list)
    }

    /// Checks the header-visible MUSTs: positions multiple of 4, no wrapping segment,
    /// chunk lengths within 32 bits, caps on chunks and segments, no overlapping chunks.
    #[inline]
    fn validate(&self, limits: &Limits) -> Result<(), Error> {
        for s in self.iter() {
            if s.position % 4 != 0 {
                return Err(Error::MisalignedPosition(s.position));
            }
            s.target.end().ok_or(Error::SegmentWraps)?;
        }
        let mut chunks = 0usize;
        for c in self.chunks() {
            chunks += 1;
            if chunks > limits.max_read_chunks {
                return Err(Error::TooMany("read chunks"));
            }
            if c.segment_count() > limits.max_segments_per_chunk {
                return Err(Error::TooMany("segments in a read chunk"));
            }
            let len = c.length().ok_or(Error::ChunkTooLong)?;
            if c.position == 0 {
                continue;
            }
            let end = u64::from(c.position) + u64::from(len);
            // Chunks other than the PZRC must not cover each other's bytes (AMB-11).
            for other in self.chunks() {
                if other.position > c.position && u64::from(other.position) < end {
                    return Err(Error::OverlappingReadChunks);
                }
            }
        }
        Ok(())
    }

    #[inline]
    fn emit(&self, w: &mut Writer<'_>) -> Result<(), Error> {
        match self.0 {
            ReadRepr::Wire(b) => w.bytes(b)?,
            ReadRepr::Slice(s) => {
                for e in s {
                    w.u32(1)?;
                    w.u32(e.position)?;
                    e.target.emit(w)?;
                }
            }
        }
        w.u32(0)
    }
}

impl PartialEq for ReadList<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for ReadList<'_> {}

impl fmt::Debug for ReadList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Iterator over the segments of a [`ReadList`].
#[derive(Clone, Debug)]
pub enum ReadSegments<'a> {
    #[doc(hidden)]
    Wire(core::slice::ChunksExact<'a, u8>),
    #[doc(hidden)]
    Slice(core::slice::Iter<'a, ReadSegment>),
}

impl Iterator for ReadSegments<'_> {
    type Item = ReadSegment;

    #[inline]
    fn next(&mut self) -> Option<ReadSegment> {
        match self {
            ReadSegments::Wire(it) => {
                let e: &[u8; READ_ENTRY_LEN] = it.next()?.first_chunk()?;
                let (_, rest) = e.split_first_chunk::<8>()?;
                Some(ReadSegment {
                    position: u32::from_be_bytes([e[4], e[5], e[6], e[7]]),
                    target: Segment::from_wire(rest.first_chunk()?),
                })
            }
            ReadSegments::Slice(it) => it.next().copied(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            ReadSegments::Wire(it) => it.size_hint(),
            ReadSegments::Slice(it) => it.size_hint(),
        }
    }
}

/// A Read chunk: the segments of a Read list that share one position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadChunk<'a> {
    /// Position shared by all segments of the chunk.
    pub position: u32,
    list: ReadList<'a>,
}

impl<'a> ReadChunk<'a> {
    /// The chunk's segments, in list order.
    pub fn segments(&self) -> impl Iterator<Item = Segment> + 'a {
        let pos = self.position;
        self.list
            .iter()
            .filter(move |s| s.position == pos)
            .map(|s| s.target)
    }

    /// Number of segments in the chunk.
    pub fn segment_count(&self) -> usize {
        self.segments().count()
    }

    /// Sum of the segment lengths, or `None` if it exceeds 32 bits.
    pub fn length(&self) -> Option<u32> {
        self.segments()
            .try_fold(0u32, |acc, s| acc.checked_add(s.length))
    }
}

/// Iterator over the Read chunks of a [`ReadList`].
#[derive(Clone, Debug)]
pub struct ReadChunks<'a> {
    list: ReadList<'a>,
    next: usize,
}

impl<'a> Iterator for ReadChunks<'a> {
    type Item = ReadChunk<'a>;

    fn next(&mut self) -> Option<ReadChunk<'a>> {
        loop {
            let i = self.next;
            let seg = self.list.iter().nth(i)?;
            self.next += 1;
            if !self.list.iter().take(i).any(|s| s.position == seg.position) {
                return Some(ReadChunk {
                    position: seg.position,
                    list: self.list,
                });
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum ChunkRepr<'a> {
    /// Validated plain segments, without the count word.
    Wire(&'a [u8]),
    Slice(&'a [Segment]),
}

/// A Write chunk or the Reply chunk: a counted array of plain segments (RFC 8166 §3.4.6).
#[derive(Clone, Copy)]
pub struct Chunk<'a>(ChunkRepr<'a>);

impl<'a> Chunk<'a> {
    /// A chunk to send made of `segments` (an empty slice is an empty chunk, count 0).
    pub const fn from_segments(segments: &'a [Segment]) -> Self {
        Chunk(ChunkRepr::Slice(segments))
    }

    /// Number of segments.
    #[inline]
    pub fn len(&self) -> usize {
        match self.0 {
            ChunkRepr::Wire(b) => b.len() / SEGMENT_LEN,
            ChunkRepr::Slice(s) => s.len(),
        }
    }

    /// True for an empty chunk (segment count 0, R8166-3.4.6-d).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True for an unused chunk: at least one segment and every length 0 (R8166-3.4.6-d).
    pub fn is_unused(&self) -> bool {
        !self.is_empty() && self.segments().all(|s| s.length == 0)
    }

    /// The segments in array order.
    #[inline]
    pub fn segments(&self) -> Segments<'a> {
        match self.0 {
            ChunkRepr::Wire(b) => Segments::Wire(b.chunks_exact(SEGMENT_LEN)),
            ChunkRepr::Slice(s) => Segments::Slice(s.iter()),
        }
    }

    /// Sum of segment lengths (decoded chunks are checked to fit 32 bits).
    pub fn length(&self) -> u64 {
        self.segments().map(|s| u64::from(s.length)).sum()
    }

    /// Bytes of this chunk on the wire (count word and segments).
    #[inline]
    pub fn wire_len(&self) -> usize {
        4 + SEGMENT_LEN * self.len()
    }

    #[inline]
    fn parse(r: &mut Reader<'a>, limits: &Limits, what: &'static str) -> Result<Self, Error> {
        let n = r.u32("segment count")? as usize;
        if n > limits.max_segments_per_chunk {
            return Err(Error::TooMany(what));
        }
        let bytes = r.take(n * SEGMENT_LEN, "segment")?;
        let chunk = Chunk(ChunkRepr::Wire(bytes));
        let mut total = 0u32;
        for s in chunk.segments() {
            s.end().ok_or(Error::SegmentWraps)?;
            total = total.checked_add(s.length).ok_or(Error::ChunkTooLong)?;
        }
        Ok(chunk)
    }

    #[inline]
    fn emit(&self, w: &mut Writer<'_>) -> Result<(), Error> {
        let n = u32::try_from(self.len()).map_err(|_| Error::Unencodable("segment count"))?;
        w.u32(n)?;
        match self.0 {
            ChunkRepr::Wire(b) => w.bytes(b),
            ChunkRepr::Slice(s) => s.iter().try_for_each(|seg| seg.emit(w)),
        }
    }
}

impl PartialEq for Chunk<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.segments().eq(other.segments())
    }
}

impl Eq for Chunk<'_> {}

impl fmt::Debug for Chunk<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.segments()).finish()
    }
}

/// Iterator over the segments of a [`Chunk`].
#[derive(Clone, Debug)]
pub enum Segments<'a> {
    #[doc(hidden)]
    Wire(core::slice::ChunksExact<'a, u8>),
    #[doc(hidden)]
    Slice(core::slice::Iter<'a, Segment>),
}

impl Iterator for Segments<'_> {
    type Item = Segment;

    #[inline]
    fn next(&mut self) -> Option<Segment> {
        match self {
            Segments::Wire(it) => Some(Segment::from_wire(it.next()?.first_chunk()?)),
            Segments::Slice(it) => it.next().copied(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            Segments::Wire(it) => it.size_hint(),
            Segments::Slice(it) => it.size_hint(),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum WriteRepr<'a> {
    /// Validated `1 n HLOO...` entries, without the terminating 0.
    Wire {
        bytes: &'a [u8],
        count: usize,
    },
    Slice(&'a [Chunk<'a>]),
}

/// The Write list: Write chunks in list order.
#[derive(Clone, Copy)]
pub struct WriteList<'a>(WriteRepr<'a>);

impl<'a> WriteList<'a> {
    /// The empty Write list.
    pub const EMPTY: WriteList<'static> = WriteList(WriteRepr::Slice(&[]));

    /// A Write list to send.
    pub const fn from_chunks(chunks: &'a [Chunk<'a>]) -> Self {
        WriteList(WriteRepr::Slice(chunks))
    }

    /// Number of Write chunks.
    #[inline]
    pub fn len(&self) -> usize {
        match self.0 {
            WriteRepr::Wire { count, .. } => count,
            WriteRepr::Slice(s) => s.len(),
        }
    }

    /// True when the list holds no chunk.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The Write chunks in list order.
    #[inline]
    pub fn iter(&self) -> WriteChunks<'a> {
        match self.0 {
            WriteRepr::Wire { bytes, .. } => WriteChunks::Wire(Reader::new(bytes)),
            WriteRepr::Slice(s) => WriteChunks::Slice(s.iter()),
        }
    }

    /// Bytes of this list on the wire, terminator included.
    #[inline]
    pub fn wire_len(&self) -> usize {
        match self.0 {
            WriteRepr::Wire { bytes, .. } => bytes.len() + 4,
            WriteRepr::Slice(s) => 4 + s.iter().map(|c| 4 + c.wire_len()).sum::<usize>(),
        }
    }

    #[inline]
    fn parse(r: &mut Reader<'a>, limits: &Limits) -> Result<Self, Error> {
        let start = r.rest();
        let begin = r.position();
        let mut count = 0usize;
        let mut end = begin;
        loop {
            match r.u32("write list entry discriminator")? {
                0 => break,
                1 => {
                    count += 1;
                    if count > limits.max_write_chunks {
                        return Err(Error::TooMany("write chunks"));
                    }
                    Chunk::parse(r, limits, "segments in a write chunk")?;
                    end = r.position();
                }
                v => return Err(Error::BadValue("write list entry discriminator", v)),
            }
        }
        let bytes = start
            .get(..end - begin)
            .ok_or(Error::Truncated("write list"))?;
        Ok(WriteList(WriteRepr::Wire { bytes, count }))
    }

    #[inline]
    fn emit(&self, w: &mut Writer<'_>) -> Result<(), Error> {
        match self.0 {
            WriteRepr::Wire { bytes, .. } => w.bytes(bytes)?,
            WriteRepr::Slice(s) => {
                for c in s {
                    w.u32(1)?;
                    c.emit(w)?;
                }
            }
        }
        w.u32(0)
    }
}

impl PartialEq for WriteList<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for WriteList<'_> {}

impl fmt::Debug for WriteList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Iterator over the chunks of a [`WriteList`].
#[derive(Clone, Debug)]
pub enum WriteChunks<'a> {
    #[doc(hidden)]
    Wire(Reader<'a>),
    #[doc(hidden)]
    Slice(core::slice::Iter<'a, Chunk<'a>>),
}

impl<'a> Iterator for WriteChunks<'a> {
    type Item = Chunk<'a>;

    fn next(&mut self) -> Option<Chunk<'a>> {
        match self {
            WriteChunks::Wire(r) => {
                // The bytes were validated by `WriteList::parse`.
                r.u32("").ok()?;
                let n = r.u32("").ok()? as usize;
                let bytes = r.take(n.checked_mul(SEGMENT_LEN)?, "").ok()?;
                Some(Chunk(ChunkRepr::Wire(bytes)))
            }
            WriteChunks::Slice(it) => it.next().copied(),
        }
    }
}

/// The three chunk fields of an RDMA_MSG / RDMA_NOMSG body (RFC 8166 §4.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkLists<'a> {
    /// The Read list (empty in replies, R8166-4.3.1-b).
    pub reads: ReadList<'a>,
    /// The Write list.
    pub writes: WriteList<'a>,
    /// The Reply chunk, if present.
    pub reply: Option<Chunk<'a>>,
}

impl<'a> ChunkLists<'a> {
    /// No chunks at all: three zero words.
    pub const EMPTY: ChunkLists<'static> = ChunkLists {
        reads: ReadList::EMPTY,
        writes: WriteList::EMPTY,
        reply: None,
    };

    /// True when the Read list and Write list are empty and no Reply chunk is present.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.reads.is_empty() && self.writes.is_empty() && self.reply.is_none()
    }

    /// Bytes of the three fields on the wire.
    #[inline]
    pub fn wire_len(&self) -> usize {
        self.reads.wire_len()
            + self.writes.wire_len()
            + self.reply.as_ref().map_or(4, |c| 4 + c.wire_len())
    }

    /// Decodes and validates the three fields.
    #[inline]
    pub fn parse(r: &mut Reader<'a>, limits: &Limits) -> Result<Self, Error> {
        let reads = ReadList::parse(r, limits)?;
        let writes = WriteList::parse(r, limits)?;
        let reply = match r.u32("reply chunk discriminator")? {
            0 => None,
            1 => Some(Chunk::parse(r, limits, "segments in the reply chunk")?),
            v => return Err(Error::BadValue("reply chunk discriminator", v)),
        };
        Ok(ChunkLists {
            reads,
            writes,
            reply,
        })
    }

    /// Encodes the three fields.
    #[inline]
    pub fn emit(&self, w: &mut Writer<'_>) -> Result<(), Error> {
        self.reads.emit(w)?;
        self.writes.emit(w)?;
        match &self.reply {
            None => w.u32(0),
            Some(c) => {
                w.u32(1)?;
                c.emit(w)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(ws: &[u32]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_be_bytes()).collect()
    }

    fn parse(ws: &[u32]) -> Result<ChunkLists<'static>, Error> {
        let b: &'static [u8] = Box::leak(words(ws).into_boxed_slice());
        ChunkLists::parse(&mut Reader::new(b), &Limits::DEFAULT)
    }

    #[test]
    fn amb_11_read_segments_grouped_by_position_in_any_order() {
        // position 8 (h1), position 0 (h2), position 8 (h3)
        let l = parse(&[
            1, 8, 1, 10, 0, 0, 1, 0, 2, 10, 0, 0, 1, 8, 3, 20, 0, 0, 0, 0, 0,
        ])
        .unwrap();
        let chunks: Vec<_> = l.reads.chunks().collect();
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[0].position, 8);
        let h: Vec<u32> = chunks[0].segments().map(|s| s.handle).collect();
        assert_eq!(h, [1, 3]);
        assert_eq!(chunks[0].length(), Some(30));
        assert_eq!(chunks[1].position, 0);
    }

    #[test]
    fn amb_11_overlapping_read_chunks_rejected() {
        // chunk at 8 of 10 bytes and chunk at 16: overlap
        let r = parse(&[1, 8, 1, 10, 0, 0, 1, 16, 2, 4, 0, 0, 0, 0, 0]);
        assert_eq!(r, Err(Error::OverlappingReadChunks));
        // chunk at 8 of 8 bytes and chunk at 16: fine
        parse(&[1, 8, 1, 8, 0, 0, 1, 16, 2, 4, 0, 0, 0, 0, 0]).unwrap();
        // chunk at 8 of 7 bytes (pad excluded) and chunk at 16: fine
        parse(&[1, 8, 1, 7, 0, 0, 1, 16, 2, 4, 0, 0, 0, 0, 0]).unwrap();
    }

    #[test]
    fn amb_11_sorted_fast_path_agrees_with_general_check() {
        // Every list of up to 3 segments over a few positions and lengths: the one-pass
        // check for sorted lists must accept exactly what the general one accepts.
        let tight = Limits {
            max_read_chunks: 2,
            max_segments_per_chunk: 2,
            ..Limits::DEFAULT
        };
        let choices: Vec<(u32, u32)> = [0u32, 4, 8, 12]
            .iter()
            .flat_map(|&p| [0u32, 3, 4, 8, 0xffff_fff0].map(move |l| (p, l)))
            .collect();
        let mut lists: Vec<Vec<(u32, u32)>> = vec![vec![]];
        for _ in 0..3 {
            let longer: Vec<_> = lists
                .iter()
                .filter(|l| l.len() == lists.last().map_or(0, |x| x.len()))
                .flat_map(|l| {
                    choices.iter().map(move |&c| {
                        let mut l = l.clone();
                        l.push(c);
                        l
                    })
                })
                .collect();
            lists.extend(longer);
        }
        for list in lists {
            let mut ws = Vec::new();
            for &(p, l) in &list {
                ws.extend_from_slice(&[1, p, 7, l, 0, 0]);
            }
            ws.push(0);
            let b = words(&ws);
            let fast = ReadList::parse(&mut Reader::new(&b), &tight);
            let entries = b.get(..b.len() - 4).unwrap();
            let general = ReadList(ReadRepr::Wire(entries)).validate(&tight);
            // Both reject (the first error found may differ: both are ERR_CHUNK) or accept.
            assert_eq!(
                fast.is_ok(),
                general.is_ok(),
                "{list:?}: {fast:?} {general:?}"
            );
        }
    }

    #[test]
    fn r8166_3_4_5_c_misaligned_position_rejected() {
        let r = parse(&[1, 6, 1, 10, 0, 0, 0, 0, 0]);
        assert_eq!(r, Err(Error::MisalignedPosition(6)));
    }

    #[test]
    fn segment_offset_wrap_and_chunk_length_overflow_rejected() {
        let r = parse(&[0, 1, 1, 7, 16, 0xffff_ffff, 0xffff_fff0, 0, 0]);
        assert_eq!(r, Err(Error::SegmentWraps));
        let r = parse(&[0, 1, 2, 7, 0x8000_0000, 0, 0, 8, 0x8000_0000, 0, 0, 0, 0]);
        assert_eq!(r, Err(Error::ChunkTooLong));
        let r = parse(&[
            1,
            4,
            1,
            0x8000_0000,
            0,
            0,
            1,
            4,
            2,
            0x8000_0000,
            0,
            0,
            0,
            0,
            0,
        ]);
        assert_eq!(r, Err(Error::ChunkTooLong));
    }

    #[test]
    fn counts_past_the_buffer_and_caps_rejected() {
        assert_eq!(
            parse(&[0, 1, 3, 1, 1, 0, 0]),
            Err(Error::Truncated("segment"))
        );
        assert_eq!(
            parse(&[0, 0, 1, 65]),
            Err(Error::TooMany("segments in the reply chunk"))
        );
        assert_eq!(
            parse(&[0, 0, 2]),
            Err(Error::BadValue("reply chunk discriminator", 2))
        );
    }
}
