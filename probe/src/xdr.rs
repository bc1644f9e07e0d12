//! Minimal XDR (RFC 4506) encoder and bounds-checked decoder: every read returns `Err` on short or
//! hostile input, never panics.

use std::fmt;

/// Why a reply could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XdrError {
    /// The input ended before the item did.
    Short,
    /// An opaque or string longer than its declared bound (or the input).
    TooLong(u32),
    /// A discriminant or boolean outside its type's values.
    BadValue(u32),
}

impl fmt::Display for XdrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            XdrError::Short => f.write_str("XDR: input too short"),
            XdrError::TooLong(n) => write!(f, "XDR: length {n} over its bound"),
            XdrError::BadValue(v) => write!(f, "XDR: bad discriminant {v}"),
        }
    }
}

impl std::error::Error for XdrError {}

/// Result of a decode step.
pub type Res<T> = Result<T, XdrError>;

/// A bounds-checked XDR reader over a byte slice.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Reads from `b`.
    pub fn new(b: &'a [u8]) -> Self {
        Reader { b }
    }

    /// Bytes not yet consumed.
    pub fn remaining(&self) -> usize {
        self.b.len()
    }

    /// A big-endian `u32`.
    pub fn u32(&mut self) -> Res<u32> {
        let (h, t) = self.b.split_first_chunk::<4>().ok_or(XdrError::Short)?;
        self.b = t;
        Ok(u32::from_be_bytes(*h))
    }

    /// A big-endian `u64` (hyper).
    pub fn u64(&mut self) -> Res<u64> {
        let (h, t) = self.b.split_first_chunk::<8>().ok_or(XdrError::Short)?;
        self.b = t;
        Ok(u64::from_be_bytes(*h))
    }

    /// An XDR bool (0 or 1; anything else is an error).
    pub fn bool(&mut self) -> Res<bool> {
        match self.u32()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(XdrError::BadValue(v)),
        }
    }

    /// Fixed-length opaque of `n` bytes (plus pad).
    pub fn fixed(&mut self, n: usize) -> Res<&'a [u8]> {
        let padded = n.checked_add(3).ok_or(XdrError::Short)? & !3;
        if padded > self.b.len() {
            return Err(XdrError::Short);
        }
        let (d, t) = self.b.split_at(padded);
        self.b = t;
        d.get(..n).ok_or(XdrError::Short)
    }

    /// Variable-length opaque of at most `max` bytes.
    pub fn opaque(&mut self, max: u32) -> Res<&'a [u8]> {
        let n = self.u32()?;
        if n > max {
            return Err(XdrError::TooLong(n));
        }
        self.fixed(n as usize)
    }
}

/// An XDR encoder appending to a `Vec`.
#[derive(Debug, Default, Clone)]
pub struct Writer {
    /// The encoded bytes.
    pub buf: Vec<u8>,
}

impl Writer {
    /// A big-endian `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// A big-endian `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// Fixed-length opaque (bytes plus pad).
    pub fn fixed(&mut self, d: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(d);
        self.buf
            .extend(std::iter::repeat_n(0, (4 - d.len() % 4) % 4));
        self
    }

    /// Variable-length opaque (length, bytes, pad).
    pub fn opaque(&mut self, d: &[u8]) -> &mut Self {
        self.u32(d.len() as u32);
        self.fixed(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opaque_round_trip_with_pad() {
        let mut w = Writer::default();
        w.opaque(b"abcde").u64(0x0102_0304_0506_0708);
        assert_eq!(
            w.buf,
            [0, 0, 0, 5, b'a', b'b', b'c', b'd', b'e', 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]
        );
        let mut r = Reader::new(&w.buf);
        assert_eq!(r.opaque(5).unwrap(), b"abcde");
        assert_eq!(r.u64().unwrap(), 0x0102_0304_0506_0708);
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn reader_rejects_short_bounds_and_bad_bool() {
        assert_eq!(
            Reader::new(&[0, 0, 0, 5, 1]).opaque(8),
            Err(XdrError::Short)
        );
        assert_eq!(
            Reader::new(&[0, 0, 0, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 0, 0]).opaque(8),
            Err(XdrError::TooLong(9))
        );
        assert_eq!(
            Reader::new(&[0xff; 4]).opaque(u32::MAX),
            Err(XdrError::Short)
        );
        assert_eq!(
            Reader::new(&[0, 0, 0, 2]).bool(),
            Err(XdrError::BadValue(2))
        );
        assert_eq!(Reader::new(&[0; 7]).u64(), Err(XdrError::Short));
    }
}
