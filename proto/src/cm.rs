//! RDMA-CM private data for RPC-over-RDMA version 1 (RFC 8797): inline sizes and the
//! remote-invalidation flag exchanged in the connect request and accept.

use core::fmt;

/// The magic word 0xf6ab0e18 that opens the private data.
pub const MAGIC: u32 = 0xf6ab_0e18;
/// The only format version defined.
pub const VERSION: u8 = 1;
/// Flags bit 0: the sender can take a Send With Invalidate.
pub const FLAG_REMOTE_INVALIDATE: u8 = 0x01;
/// Bytes of the private data.
pub const LEN: usize = 8;
/// Smallest size that can be encoded (and the size assumed when the data is absent).
pub const MIN_SIZE: u32 = 1024;
/// Largest size that can be encoded.
pub const MAX_SIZE: u32 = 256 * 1024;

/// Decoded private data; sizes are in bytes, multiples of 1 KiB in 1 KiB..=256 KiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PrivateData {
    /// Flags bit 0: the sender accepts Send With Invalidate.
    pub remote_invalidate: bool,
    /// Largest Send the sender of this data will transmit.
    pub send_size: u32,
    /// Size of the receive buffers the sender has posted.
    pub recv_size: u32,
}

/// One size octet: `KiB - 1`, rounded down, never below 1 KiB, clamped to 256 KiB.
fn encode_size(bytes: u32) -> u8 {
    let kib = bytes.clamp(MIN_SIZE, MAX_SIZE) / 1024;
    u8::try_from(kib - 1).unwrap_or(u8::MAX)
}

fn decode_size(octet: u8) -> u32 {
    (u32::from(octet) + 1) * 1024
}

impl PrivateData {
    /// Reads private data; `None` (treat as absent) if short, wrong magic or version != 1.
    /// Bytes after the first 8 are ignored (room for future fields).
    pub fn parse(buf: &[u8]) -> Option<Self> {
        let b: &[u8; LEN] = buf.first_chunk()?;
        if u32::from_be_bytes([b[0], b[1], b[2], b[3]]) != MAGIC || b[4] != VERSION {
            return None;
        }
        Some(PrivateData {
            remote_invalidate: b[5] & FLAG_REMOTE_INVALIDATE != 0,
            send_size: decode_size(b[6]),
            recv_size: decode_size(b[7]),
        })
    }

    /// The 8 bytes to put in the connect request or accept (sizes rounded down to KiB).
    pub fn emit(&self) -> [u8; LEN] {
        let m = MAGIC.to_be_bytes();
        let flags = if self.remote_invalidate {
            FLAG_REMOTE_INVALIDATE
        } else {
            0
        };
        [
            m[0],
            m[1],
            m[2],
            m[3],
            VERSION,
            flags,
            encode_size(self.send_size),
            encode_size(self.recv_size),
        ]
    }

    /// The value the peer will read back from [`emit`](Self::emit) (sizes rounded).
    pub fn normalized(&self) -> Self {
        PrivateData {
            remote_invalidate: self.remote_invalidate,
            send_size: decode_size(encode_size(self.send_size)),
            recv_size: decode_size(encode_size(self.recv_size)),
        }
    }
}

impl fmt::Display for PrivateData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RPC-over-RDMA CM private data v1: send {} B, receive {} B, remote invalidation {}",
            self.send_size,
            self.recv_size,
            if self.remote_invalidate { "yes" } else { "no" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc8797_linux_default_bytes() {
        let client = PrivateData {
            remote_invalidate: true,
            send_size: 4096,
            recv_size: 4096,
        };
        assert_eq!(client.emit(), [0xf6, 0xab, 0x0e, 0x18, 1, 1, 3, 3]);
        let server = PrivateData::parse(&[0xf6, 0xab, 0x0e, 0x18, 1, 0, 3, 3, 0xee]).unwrap();
        assert_eq!(
            server,
            PrivateData {
                remote_invalidate: false,
                send_size: 4096,
                recv_size: 4096
            }
        );
    }

    #[test]
    fn rfc8797_encode_rounds_down_and_clamps() {
        let p = PrivateData {
            remote_invalidate: false,
            send_size: 4095,
            recv_size: 100,
        };
        let b = p.emit();
        assert_eq!((b[6], b[7]), (2, 0));
        let p = PrivateData {
            remote_invalidate: false,
            send_size: 1 << 20,
            recv_size: 0,
        };
        let b = p.emit();
        assert_eq!((b[6], b[7]), (255, 0));
        assert_eq!(PrivateData::parse(&b).unwrap().send_size, MAX_SIZE);
    }

    #[test]
    fn rfc8797_absent_when_short_bad_magic_or_version() {
        assert_eq!(PrivateData::parse(&[0xf6, 0xab, 0x0e, 0x18, 1, 1, 3]), None);
        assert_eq!(
            PrivateData::parse(&[0xf6, 0xab, 0x0e, 0x19, 1, 1, 3, 3]),
            None
        );
        assert_eq!(
            PrivateData::parse(&[0xf6, 0xab, 0x0e, 0x18, 2, 1, 3, 3]),
            None
        );
    }
}
