//! XDR (RFC 4506) primitives: a bounded [`Reader`] over received bytes and a [`Writer`]
//! into a caller-provided buffer. Neither allocates; every read is bounds-checked.

use crate::Error;

/// Number of zero bytes that follow `len` bytes of opaque data to reach a 4-byte boundary.
#[inline]
pub const fn pad(len: usize) -> usize {
    (4 - (len & 3)) & 3
}

/// Length of `opaque<>` data of `len` bytes on the wire: length word, data and pad.
#[inline]
pub const fn opaque_len(len: usize) -> usize {
    4 + len + pad(len)
}

/// A cursor over untrusted bytes; every method fails instead of reading past the end.
#[derive(Clone, Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Starts reading at the first byte of `buf`.
    #[inline]
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes consumed so far.
    #[inline]
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes not yet consumed.
    #[inline]
    pub fn rest(&self) -> &'a [u8] {
        self.buf.get(self.pos..).unwrap_or(&[])
    }

    /// Number of bytes not yet consumed.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// Takes the next `n` bytes; `what` names the item for the error.
    #[inline]
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Error> {
        let end = self.pos.checked_add(n).ok_or(Error::Truncated(what))?;
        let bytes = self.buf.get(self.pos..end).ok_or(Error::Truncated(what))?;
        self.pos = end;
        Ok(bytes)
    }

    /// Reads a big-endian `uint32` (also `enum` and the word of a `bool`).
    #[inline]
    pub fn u32(&mut self, what: &'static str) -> Result<u32, Error> {
        let (head, _) = self
            .rest()
            .split_first_chunk::<4>()
            .ok_or(Error::Truncated(what))?;
        self.pos += 4;
        Ok(u32::from_be_bytes(*head))
    }

    /// Reads a big-endian `uint64`.
    #[inline]
    pub fn u64(&mut self, what: &'static str) -> Result<u64, Error> {
        let (head, _) = self
            .rest()
            .split_first_chunk::<8>()
            .ok_or(Error::Truncated(what))?;
        self.pos += 8;
        Ok(u64::from_be_bytes(*head))
    }

    /// Reads an XDR `bool`; any word other than 0 or 1 is an error.
    #[inline]
    pub fn bool(&mut self, what: &'static str) -> Result<bool, Error> {
        match self.u32(what)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(Error::BadValue(what, v)),
        }
    }

    /// Reads `opaque<>`: length word, data and pad; the pad must be zero.
    pub fn opaque(&mut self, what: &'static str) -> Result<&'a [u8], Error> {
        let len = self.u32(what)? as usize;
        let data = self.take(len, what)?;
        let pad = self.take(pad(len), what)?;
        if pad.iter().any(|&b| b != 0) {
            return Err(Error::BadPadding(what));
        }
        Ok(data)
    }

    /// Reads `opaque<>` and returns a reader bounded to its data, for length-prefixed parts.
    pub fn sub(&mut self, what: &'static str) -> Result<Reader<'a>, Error> {
        self.opaque(what).map(Reader::new)
    }

    /// Fails unless every byte has been consumed.
    pub fn expect_empty(&self, what: &'static str) -> Result<(), Error> {
        if self.remaining() == 0 {
            Ok(())
        } else {
            Err(Error::TrailingBytes(what))
        }
    }
}

/// A cursor writing XDR into a caller-provided buffer; fails instead of overrunning it.
#[derive(Debug)]
pub struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    /// Starts writing at the first byte of `buf`.
    #[inline]
    pub fn new(buf: &'a mut [u8]) -> Self {
        Writer { buf, pos: 0 }
    }

    /// Bytes written so far.
    #[inline]
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Copies `bytes` as they are.
    #[inline]
    pub fn bytes(&mut self, bytes: &[u8]) -> Result<(), Error> {
        let end = self
            .pos
            .checked_add(bytes.len())
            .ok_or(Error::BufferTooSmall)?;
        self.buf
            .get_mut(self.pos..end)
            .ok_or(Error::BufferTooSmall)?
            .copy_from_slice(bytes);
        self.pos = end;
        Ok(())
    }

    /// Writes a big-endian `uint32`.
    #[inline]
    pub fn u32(&mut self, v: u32) -> Result<(), Error> {
        self.bytes(&v.to_be_bytes())
    }

    /// Writes a big-endian `uint64`.
    #[inline]
    pub fn u64(&mut self, v: u64) -> Result<(), Error> {
        self.bytes(&v.to_be_bytes())
    }

    /// Writes an XDR `bool`.
    #[inline]
    pub fn bool(&mut self, v: bool) -> Result<(), Error> {
        self.u32(u32::from(v))
    }

    /// Writes `opaque<>`: length word, data, zero pad.
    pub fn opaque(&mut self, data: &[u8]) -> Result<(), Error> {
        let len = u32::try_from(data.len()).map_err(|_| Error::Unencodable("opaque length"))?;
        self.u32(len)?;
        self.bytes(data)?;
        self.bytes(&[0u8; 3][..pad(data.len())])
    }
}

/// Writes `words` big-endian at the start of `buf` (which holds at least as many words).
#[inline]
pub(crate) fn put_words(buf: &mut [u8], words: &[u32]) {
    for (d, w) in buf.chunks_exact_mut(4).zip(words) {
        d.copy_from_slice(&w.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn r8166_2_2_4_a_opaque_pad_not_counted() {
        let mut buf = [0xffu8; 12];
        let mut w = Writer::new(&mut buf);
        w.opaque(b"abcde").unwrap();
        assert_eq!(w.position(), 12);
        assert_eq!(buf, [0, 0, 0, 5, b'a', b'b', b'c', b'd', b'e', 0, 0, 0]);
        let mut r = Reader::new(&buf);
        assert_eq!(r.opaque("x").unwrap(), b"abcde");
        r.expect_empty("x").unwrap();
    }

    #[test]
    fn reader_rejects_nonzero_pad_and_overrun() {
        let buf = [0, 0, 0, 1, 7, 0, 1, 0];
        assert_eq!(Reader::new(&buf).opaque("o"), Err(Error::BadPadding("o")));
        let buf = [0xff, 0xff, 0xff, 0xff, 1, 2];
        assert_eq!(Reader::new(&buf).opaque("o"), Err(Error::Truncated("o")));
        assert_eq!(Reader::new(&buf[..3]).u32("w"), Err(Error::Truncated("w")));
        assert_eq!(
            Reader::new(&[0, 0, 0, 2]).bool("b"),
            Err(Error::BadValue("b", 2))
        );
    }

    #[test]
    fn writer_refuses_to_overrun() {
        let mut buf = [0u8; 6];
        let mut w = Writer::new(&mut buf);
        w.u32(1).unwrap();
        assert_eq!(w.u32(2), Err(Error::BufferTooSmall));
        assert_eq!(w.position(), 4);
    }
}
