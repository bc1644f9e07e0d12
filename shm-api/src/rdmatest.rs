//! The RDMATEST program (`spec/TESTPROG.md`): constants, `pattern`, and a server handler for the examples,
//! tests and benchmarks.

use crate::client::{Call, ReplyBuilder};

/// Program number.
pub const PROG: u32 = 0x2052_4454;
/// Version.
pub const VERS: u32 = 1;
/// `void NULL(void)`.
pub const NULL: u32 = 0;
/// `opaque ECHO(opaque data<>)`.
pub const ECHO: u32 = 1;
/// `opaque READ(read_args)`.
pub const READ: u32 = 2;
/// `uint32 WRITE(write_args)`.
pub const WRITE: u32 = 3;
/// `void SLEEP(uint32 usec)`.
pub const SLEEP: u32 = 4;
/// The callback program (served by clients for backward calls).
pub const CB_PROG: u32 = 0x2052_4455;

/// accept_stat PROC_UNAVAIL.
pub const PROC_UNAVAIL: u32 = 3;
/// accept_stat GARBAGE_ARGS.
pub const GARBAGE_ARGS: u32 = 4;

/// Byte `i` of `pattern(seed)`: `(seed + i*31 + (i >> 8)) & 0xff`.
pub fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (seed as usize)
                .wrapping_add(i.wrapping_mul(31))
                .wrapping_add(i >> 8) as u8
        })
        .collect()
}

/// A bounds-checked XDR reader (never panics on short or hostile input).
#[derive(Debug)]
pub struct XdrReader<'a> {
    b: &'a [u8],
}

impl<'a> XdrReader<'a> {
    /// Reads from `b`.
    pub fn new(b: &'a [u8]) -> Self {
        XdrReader { b }
    }

    /// A big-endian `u32`.
    pub fn u32(&mut self) -> Option<u32> {
        let (h, t) = self.b.split_first_chunk::<4>()?;
        self.b = t;
        Some(u32::from_be_bytes(*h))
    }

    /// Variable-length opaque data (length, bytes, pad).
    pub fn opaque(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        let padded = n.checked_add(3)? & !3;
        if padded > self.b.len() {
            return None;
        }
        let d = &self.b[..n];
        self.b = &self.b[padded..];
        Some(d)
    }
}

/// Serves one RDMATEST call: ECHO and READ mark their result DDP-eligible; SLEEP is capped at one second.
pub fn handle(call: &Call<'_>, reply: &mut ReplyBuilder) {
    let mut r = XdrReader::new(call.args);
    let ok = match call.proc_ {
        NULL => true,
        ECHO => r.opaque().map(|d| reply.xdr.put_ddp_opaque(d)).is_some(),
        READ => match (r.u32(), r.u32()) {
            (Some(count), Some(seed)) if count <= 1 << 20 => {
                reply.xdr.put_ddp_opaque(&pattern(seed, count as usize));
                true
            }
            _ => false,
        },
        WRITE => match (r.u32(), r.opaque()) {
            (Some(seed), Some(d)) => {
                let p = pattern(seed, d.len());
                let same = d.iter().zip(&p).filter(|(a, b)| a == b).count();
                reply.xdr.put_u32(same as u32);
                true
            }
            _ => false,
        },
        SLEEP => match r.u32() {
            Some(us) => {
                std::thread::sleep(std::time::Duration::from_micros(u64::from(
                    us.min(1_000_000),
                )));
                true
            }
            None => false,
        },
        _ => {
            reply.accept_stat = PROC_UNAVAIL;
            return;
        }
    };
    if !ok {
        reply.xdr = Default::default();
        reply.accept_stat = GARBAGE_ARGS;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_matches_testprog_formula() {
        let p = pattern(7, 300);
        assert_eq!(p[0], 7);
        assert_eq!(p[1], 38);
        assert_eq!(p[256], ((7 + 256 * 31 + 1) & 0xff) as u8);
    }

    #[test]
    fn reader_rejects_short_and_oversized_opaque() {
        assert!(XdrReader::new(&[0, 0, 0]).u32().is_none());
        assert!(XdrReader::new(&[0, 0, 0, 5, 1, 2, 3, 4]).opaque().is_none());
        assert!(XdrReader::new(&[0xff, 0xff, 0xff, 0xff]).opaque().is_none());
        assert_eq!(
            XdrReader::new(&[0, 0, 0, 1, 9, 0, 0, 0]).opaque(),
            Some(&[9u8][..])
        );
    }
}
