//! `#[repr(C)]` types of the shared region (see `ABI.md` for the byte layout and memory ordering).

use crate::ring::RingIndices;
use std::sync::atomic::AtomicU32;

/// `"RPCRSHM1"` read as a little-endian `u64`: the first word of every region.
pub const MAGIC: u64 = u64::from_le_bytes(*b"RPCRSHM1");
/// The ABI version in the header; bumped on any incompatible layout change.
pub const ABI_VERSION: u32 = 1;
/// Size of the region header (the peer table follows it).
pub const HEADER_SIZE: u32 = 256;
/// Size of one peer-table entry.
pub const PEER_ENTRY_SIZE: u32 = 64;
/// Longest peer name (bytes, NUL-padded in the entry).
pub const PEER_NAME_MAX: usize = 60;
/// Most DDP pieces (arguments, or result buffers) one descriptor may name.
pub const MAX_PIECES: usize = 8;

/// A `u32` alone on a 64-byte cache line (a header flag that one side writes and the other polls).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct FlagLine {
    /// The flag's value.
    pub value: AtomicU32,
}

/// The region header at offset 0. Geometry words are written once by the daemon before the region is sent;
/// the daemon never reads them back (it keeps its own copy), so an app scribbling here only hurts itself.
#[repr(C)]
#[derive(Debug)]
pub struct RegionHeader {
    /// [`MAGIC`].
    pub magic: u64,
    /// [`ABI_VERSION`].
    pub abi_version: u32,
    /// [`HEADER_SIZE`].
    pub header_size: u32,
    /// Total mapped size in bytes.
    pub region_size: u64,
    /// Offset of the submission ring's [`RingIndices`]; [`Sqe`] slots follow 128 bytes later.
    pub sq_offset: u32,
    /// Submission ring slots (power of two).
    pub sq_entries: u32,
    /// Offset of the completion ring's [`RingIndices`]; [`Cqe`] slots follow 128 bytes later.
    pub cq_offset: u32,
    /// Completion ring slots (power of two).
    pub cq_entries: u32,
    /// Offset of the arena (page aligned); every arena offset in a descriptor is relative to it.
    pub arena_offset: u32,
    /// Arena size in bytes.
    pub arena_size: u32,
    /// Offset of the peer table ([`PeerEntry`] × `peers_count`).
    pub peers_offset: u32,
    /// Number of peers; a CALL's `target` is an index below this.
    pub peers_count: u32,
    /// The daemon's id for this app (diagnostics only).
    pub app_id: u32,
    /// Most submissions the daemon accepts before their completions are written (= `cq_entries`).
    pub max_outstanding: u32,
    /// Non-zero while the app sleeps waiting for completions (app writes, daemon reads).
    pub app_waiting: FlagLine,
    /// Non-zero while the daemon's poll thread is parked (daemon writes, app reads).
    pub daemon_waiting: FlagLine,
    /// [`STATE_ATTACHED`] or [`STATE_DETACHED`] (daemon writes, app reads).
    pub state: FlagLine,
}

/// `RegionHeader::state`: the daemon serves this app.
pub const STATE_ATTACHED: u32 = 1;
/// `RegionHeader::state`: the daemon dropped this app (ring corrupt, or shutting down); stop submitting.
pub const STATE_DETACHED: u32 = 2;

/// One row of the peer table: a NUL-padded name; its row number is the peer index.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PeerEntry {
    /// UTF-8 name from the daemon's config, NUL-padded.
    pub name: [u8; PEER_NAME_MAX],
    /// The largest reduced reply (`msg` bytes: the RPC reply header is not counted) that the
    /// daemon receives inline from this peer when the call has no Write chunk; each Write chunk
    /// the call carries takes [`WRITE_CHUNK_ROOM`] bytes from it. A reply buffer no larger
    /// never costs a Reply chunk (ABI.md §4). Zero: the daemon does not say (it was reserved,
    /// zero, before it was defined).
    pub reply_inline: u32,
}

/// What one result buffer offered as a Write chunk costs the inline room of the reply that
/// echoes it (RFC 8166 §4.2.1: a discriminator, a segment count and one 16-byte segment).
pub const WRITE_CHUNK_ROOM: u32 = 24;

/// The largest reply buffer that never costs a Reply chunk, for a call with `result_buffers`
/// result buffers to a peer whose entry says `reply_inline`; `None` when that is 0 (the daemon
/// does not say) or the Write chunks use it up.
pub fn inline_room(reply_inline: u32, result_buffers: usize) -> Option<u32> {
    let chunks = u32::try_from(result_buffers).ok()?;
    match reply_inline.checked_sub(chunks.checked_mul(WRITE_CHUNK_ROOM)?)? {
        0 => None,
        n => Some(n),
    }
}

/// Submission opcodes (`Sqe::opcode`); the completion carries the same value in `Cqe::kind`.
pub mod op {
    /// Call a remote procedure: `target` = peer index.
    pub const CALL: u8 = 1;
    /// Reply to an incoming call: `target` = the handle from its completion, `proc_` = accept_stat.
    pub const REPLY: u8 = 2;
    /// Serve (`prog`, `vers`): incoming calls arrive in posted receive buffers.
    pub const REGISTER: u8 = 3;
    /// Stop serving (`prog`, `vers`).
    pub const UNREGISTER: u8 = 4;
    /// Lend `msg_off`/`msg_len` of the arena to the daemon for one incoming call; it completes with that call.
    pub const POST_RECV: u8 = 5;
    /// The app is closing: the daemon detaches it at once, as if its socket had closed, without
    /// waiting for its periodic look at the sockets. No completion. Optional: a closed socket
    /// still detaches an app that never sends it (a crash, `kill -9`).
    pub const DETACH: u8 = 6;
    /// Cancel this app's call whose CALL carried `user_data`. No completion of its own: the
    /// call completes once, with `CANCELLED`, or with its reply if that came first. Naming no
    /// call in flight is not an error (it may have just ended). If the completion carries
    /// [`cqe_flag::LENT`], the call's memory is not the app's yet: see [`RELEASED`].
    pub const CANCEL: u8 = 7;
    /// A completion only (never submitted): the memory of a call that completed with
    /// [`cqe_flag::LENT`] (same `user_data`) is the app's again. The peer can no longer
    /// reach it: its late reply came, or its connection ended, and the daemon fenced it.
    pub const RELEASED: u8 = 8;
}

/// Completion flags (`Cqe::flags`).
pub mod cqe_flag {
    /// CALL that ended `CANCELLED` or `TIMEOUT` while the peer may still read or write its
    /// memory (its argument pieces, result buffers or reply buffer travelled as RDMA chunks):
    /// none of that memory may be reused, or freed, before the call's [`op::RELEASED`]
    /// completion. The daemon does not fence it under the peer's feet: a late access by the
    /// peer would cost the connection every app's calls share (RFC 8166 §8.1.4).
    ///
    /// [`op::RELEASED`]: super::op::RELEASED
    pub const LENT: u8 = 1;
}

/// Submission flags (`Sqe::flags`).
pub mod flag {
    /// CALL: use `Sqe::xid` as the XID (otherwise the daemon assigns one and reports it).
    pub const XID_APP: u8 = 1;
    /// REGISTER/UNREGISTER: a callback program for backward-direction calls on this app's connections.
    pub const BACKCHANNEL: u8 = 2;
    /// CALL: the call carries an AUTH_SYS credential (RFC 5531) naming `Sqe::auth_uid` and
    /// `Sqe::auth_gid` (otherwise AUTH_NONE). An app not running as root may name only its own
    /// uid and gid (`AUTH_DENIED`).
    pub const AUTH_SYS: u8 = 4;
    /// Every flag this ABI version defines.
    pub const ALL: u8 = XID_APP | BACKCHANNEL | AUTH_SYS;
}

/// Completion status codes (`Cqe::status`); 0 is success.
pub mod status {
    /// Success.
    pub const OK: u32 = 0;
    /// Unknown opcode.
    pub const BAD_OPCODE: u32 = 1;
    /// Unknown flag, or a reserved field not zero.
    pub const BAD_FLAGS: u32 = 2;
    /// An offset/length lies outside the arena (or overflows).
    pub const BAD_RANGE: u32 = 3;
    /// Too many pieces, or a piece position beyond the message or out of order or not 4-aligned.
    pub const BAD_PIECES: u32 = 4;
    /// CALL target is not a configured peer.
    pub const UNKNOWN_PEER: u32 = 5;
    /// Nobody serves the program/version (or it is not allowed towards that peer).
    pub const UNKNOWN_PROGRAM: u32 = 6;
    /// REPLY handle does not name a call awaiting a reply.
    pub const BAD_HANDLE: u32 = 7;
    /// The app has too many calls/receive buffers in flight.
    pub const TOO_MANY: u32 = 8;
    /// REGISTER: someone already serves that program/version.
    pub const ALREADY_REGISTERED: u32 = 9;
    /// UNREGISTER: this app does not serve that program/version.
    pub const NOT_REGISTERED: u32 = 10;
    /// The reply does not fit the reply buffer and result buffers.
    pub const REPLY_TOO_LARGE: u32 = 11;
    /// The server had no posted receive buffer large enough for the call.
    pub const NO_RECV_BUFFER: u32 = 12;
    /// Cancelled: the other side went away (server app died, connection lost) or the daemon detached.
    pub const CANCELLED: u32 = 13;
    /// The peer could not be reached or the transport failed.
    pub const TRANSPORT: u32 = 14;
    /// No reply in time.
    pub const TIMEOUT: u32 = 15;
    /// The peer refused the call's chunks (RDMA_ERROR ERR_CHUNK; BAD_HEADER or INVAL_OPTION in
    /// version 2): most often its reply did not fit the reply buffer (inline, or the Reply
    /// chunk offered) or a result buffer. The connection stays up.
    pub const CHUNK_REFUSED: u32 = 16;
    /// The peer's reply broke RPC-over-RDMA's rules for this call: a Write or Reply chunk
    /// echoed wrongly, or a result where the program's binding does not allow it (RFC 8166
    /// §6.1: a result that is not DDP-eligible in a Write chunk, or an eligible one sent
    /// inline although a Write chunk was offered). A permanent error for the call (the same
    /// call to the same peer is expected to fail again); the connection stays up.
    pub const BAD_REPLY: u32 = 17;
    /// CALL with [`flag::AUTH_SYS`](super::flag::AUTH_SYS): the app may not use that identity
    /// (an app not running as root may name only its own uid and gid).
    pub const AUTH_DENIED: u32 = 18;

    /// The name of status `code` as ABI.md §6 lists it, or `"unknown"` (a newer daemon's code).
    pub fn name(code: u32) -> &'static str {
        const NAMES: [&str; 19] = [
            "OK",
            "BAD_OPCODE",
            "BAD_FLAGS",
            "BAD_RANGE",
            "BAD_PIECES",
            "UNKNOWN_PEER",
            "UNKNOWN_PROGRAM",
            "BAD_HANDLE",
            "TOO_MANY",
            "ALREADY_REGISTERED",
            "NOT_REGISTERED",
            "REPLY_TOO_LARGE",
            "NO_RECV_BUFFER",
            "CANCELLED",
            "TRANSPORT",
            "TIMEOUT",
            "CHUNK_REFUSED",
            "BAD_REPLY",
            "AUTH_DENIED",
        ];
        usize::try_from(code)
            .ok()
            .and_then(|i| NAMES.get(i))
            .copied()
            .unwrap_or("unknown")
    }
}

/// A 64-byte submission descriptor (app → daemon). All offsets are relative to the arena.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sqe {
    /// One of [`op`].
    pub opcode: u8,
    /// Bits of [`flag`].
    pub flags: u8,
    /// CALL/REPLY: number of DDP-eligible pieces (records at `pieces_off`).
    pub n_args: u8,
    /// CALL: number of result buffers (records after the argument pieces).
    pub n_results: u8,
    /// CALL: peer index; REPLY: the handle of the call being answered.
    pub target: u32,
    /// Returned unchanged in the completion.
    pub user_data: u64,
    /// RPC program.
    pub prog: u32,
    /// RPC program version.
    pub vers: u32,
    /// CALL: procedure; REPLY: accept_stat (0 = SUCCESS).
    pub proc_: u32,
    /// CALL with [`flag::XID_APP`]: the XID.
    pub xid: u32,
    /// CALL: reduced argument XDR; REPLY: reduced result XDR; POST_RECV: the buffer lent.
    pub msg_off: u32,
    /// Length of `msg`.
    pub msg_len: u32,
    /// Offset of the [`Piece`] array (4-aligned): `n_args` pieces, then `n_results` result buffers.
    pub pieces_off: u32,
    /// CALL: where the reduced reply XDR goes.
    pub reply_off: u32,
    /// CALL: the maximum reply size (length of the reply buffer).
    pub reply_len: u32,
    /// CALL: milliseconds the daemon waits for the reply before it ends the call with
    /// `TIMEOUT` (cancelled as by [`op::CANCEL`]); 0 = no limit.
    pub timeout_ms: u32,
    /// CALL with [`flag::AUTH_SYS`]: the AUTH_SYS credential's uid; otherwise zero.
    pub auth_uid: u32,
    /// CALL with [`flag::AUTH_SYS`]: the AUTH_SYS credential's gid; otherwise zero.
    pub auth_gid: u32,
}

/// A 64-byte completion descriptor (daemon → app).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cqe {
    /// The opcode of the submission this completes (POST_RECV completes with an incoming call),
    /// or [`op::RELEASED`].
    pub kind: u8,
    /// [`cqe_flag`]s.
    pub flags: u8,
    /// CALL: number of result buffers whose record the daemon updated.
    pub n_results: u8,
    /// Reserved, zero.
    pub reserved0: u8,
    /// One of [`status`].
    pub status: u32,
    /// The submission's `user_data`.
    pub user_data: u64,
    /// RPC program.
    pub prog: u32,
    /// RPC version.
    pub vers: u32,
    /// RPC procedure.
    pub proc_: u32,
    /// The XID used on the wire.
    pub xid: u32,
    /// CALL: the reply's offset (= `reply_off`); POST_RECV: the arguments' offset (= the buffer).
    pub msg_off: u32,
    /// Bytes of reply / arguments written there.
    pub msg_len: u32,
    /// POST_RECV: handle to put in the REPLY's `target`.
    pub handle: u32,
    /// POST_RECV: the calling peer's index.
    pub peer: u32,
    /// CALL: the reply's accept_stat (0 = SUCCESS) when `status` is OK.
    pub rpc_stat: u32,
    /// POST_RECV: the call's credential flavor, 1 (AUTH_SYS) with the caller's identity in
    /// `auth_uid` and `auth_gid`, or 0 (AUTH_NONE; those zero). Zero for other completions.
    pub auth_flavor: u32,
    /// POST_RECV with `auth_flavor` 1: the caller's uid.
    pub auth_uid: u32,
    /// POST_RECV with `auth_flavor` 1: the caller's gid.
    pub auth_gid: u32,
}

/// A DDP piece record in the arena (16 bytes).
///
/// Argument pieces (CALL) and DDP results (REPLY): `len` bytes at `off` are inserted, padded to 4, at byte
/// `xdr_pos` of the reduced `msg` stream. Result buffers (CALL): `off`/`len` is the buffer; the daemon writes
/// `used` (bytes placed) and `xdr_pos` (where they belong in the reduced reply) before the completion.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Piece {
    /// Arena offset of the data.
    pub off: u32,
    /// Length of the data (or of the buffer).
    pub len: u32,
    /// Position in the reduced XDR stream (multiple of 4).
    pub xdr_pos: u32,
    /// Result buffers: bytes the daemon placed; otherwise zero.
    pub used: u32,
}

/// Bytes between a ring's [`RingIndices`] and its first slot.
pub const RING_INDICES_SIZE: u32 = 128;

const _: () = {
    assert!(core::mem::size_of::<Sqe>() == 64);
    assert!(core::mem::size_of::<Cqe>() == 64);
    assert!(core::mem::size_of::<Piece>() == 16);
    assert!(core::mem::size_of::<PeerEntry>() == PEER_ENTRY_SIZE as usize);
    assert!(core::mem::size_of::<RegionHeader>() == HEADER_SIZE as usize);
    assert!(core::mem::size_of::<RingIndices>() == RING_INDICES_SIZE as usize);
    assert!(core::mem::offset_of!(RegionHeader, app_waiting) == 64);
    assert!(core::mem::offset_of!(RegionHeader, daemon_waiting) == 128);
    assert!(core::mem::offset_of!(RegionHeader, state) == 192);
};

/// Region sizes chosen by the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Submission ring slots (power of two, 2..=65536).
    pub sq_entries: u32,
    /// Completion ring slots (power of two, 2..=65536).
    pub cq_entries: u32,
    /// Arena bytes (rounded up to a page; at most 1 GiB).
    pub arena_size: u32,
    /// Peer-table rows.
    pub peers: u32,
}

impl Default for Geometry {
    fn default() -> Self {
        Geometry {
            sq_entries: 256,
            cq_entries: 256,
            arena_size: 8 << 20,
            peers: 0,
        }
    }
}

/// Byte offsets of each part of a region with a given [`Geometry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The geometry (arena size rounded up to a page).
    pub geometry: Geometry,
    /// Peer table offset.
    pub peers_offset: u32,
    /// Submission ring offset.
    pub sq_offset: u32,
    /// Completion ring offset.
    pub cq_offset: u32,
    /// Arena offset.
    pub arena_offset: u32,
    /// Total size.
    pub region_size: u64,
}

const PAGE: u64 = 4096;

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

impl Layout {
    /// Lays out a region; `None` when the geometry is out of range.
    pub fn new(g: Geometry) -> Option<Layout> {
        let ring_ok = |n: u32| n.is_power_of_two() && (2..=65536).contains(&n);
        if !ring_ok(g.sq_entries)
            || !ring_ok(g.cq_entries)
            || g.peers > 1024
            || g.arena_size > 1 << 30
        {
            return None;
        }
        let arena_size = round_up(u64::from(g.arena_size.max(1)), PAGE);
        let peers_offset = u64::from(HEADER_SIZE);
        let sq_offset = round_up(
            peers_offset + u64::from(g.peers) * u64::from(PEER_ENTRY_SIZE),
            64,
        );
        let cq_offset = sq_offset + u64::from(RING_INDICES_SIZE) + u64::from(g.sq_entries) * 64;
        let arena_offset = round_up(
            cq_offset + u64::from(RING_INDICES_SIZE) + u64::from(g.cq_entries) * 64,
            PAGE,
        );
        Some(Layout {
            geometry: Geometry {
                arena_size: u32::try_from(arena_size).ok()?,
                ..g
            },
            peers_offset: u32::try_from(peers_offset).ok()?,
            sq_offset: u32::try_from(sq_offset).ok()?,
            cq_offset: u32::try_from(cq_offset).ok()?,
            arena_offset: u32::try_from(arena_offset).ok()?,
            region_size: arena_offset + arena_size,
        })
    }
}

/// A range of the arena that has been checked against the arena size (`off + len ≤ arena_size`, no overflow).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArenaRange {
    off: u32,
    len: u32,
}

impl ArenaRange {
    /// Checks `off`/`len` against an arena of `arena_size` bytes.
    pub fn new(off: u32, len: u32, arena_size: u32) -> Option<ArenaRange> {
        let end = off.checked_add(len)?;
        (end <= arena_size).then_some(ArenaRange { off, len })
    }

    /// Offset in the arena.
    pub fn off(&self) -> u32 {
        self.off
    }

    /// Length in bytes.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// True for an empty range.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first `len` bytes of this range, if it is that long.
    pub fn prefix(&self, len: u32) -> Option<ArenaRange> {
        (len <= self.len).then_some(ArenaRange { off: self.off, len })
    }
}

/// XDR padding: `n` rounded up to a multiple of 4 (saturating at `u32::MAX` rounded down).
pub fn xdr_pad(n: u32) -> Option<u32> {
    n.checked_add(3).map(|v| v & !3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_range_rejects_overflow_and_out_of_bounds() {
        assert!(ArenaRange::new(0, 4096, 4096).is_some());
        assert!(ArenaRange::new(1, 4096, 4096).is_none());
        assert!(ArenaRange::new(u32::MAX, 2, u32::MAX).is_none());
        assert!(ArenaRange::new(4096, 0, 4096).is_some());
        assert!(ArenaRange::new(4097, 0, 4096).is_none());
    }

    #[test]
    fn layout_is_aligned_and_rejects_bad_geometry() {
        let l = Layout::new(Geometry {
            sq_entries: 8,
            cq_entries: 16,
            arena_size: 5000,
            peers: 3,
        })
        .unwrap();
        assert_eq!(l.sq_offset % 64, 0);
        assert_eq!(l.cq_offset, l.sq_offset + 128 + 8 * 64);
        assert_eq!(l.arena_offset % 4096, 0);
        assert!(l.arena_offset >= l.cq_offset + 128 + 16 * 64);
        assert_eq!(l.geometry.arena_size, 8192);
        assert_eq!(l.region_size, u64::from(l.arena_offset) + 8192);
        let bad = |sq, cq| {
            Layout::new(Geometry {
                sq_entries: sq,
                cq_entries: cq,
                ..Geometry::default()
            })
        };
        assert!(bad(3, 4).is_none());
        assert!(bad(4, 0).is_none());
        assert!(bad(1 << 17, 4).is_none());
    }

    /// Every row of ABI.md §6 and of the C header names its code as `status::name` does, and
    /// every code `name` knows has both.
    #[test]
    fn status_names_match_the_abi_document_and_the_c_header() {
        let doc = include_str!("../ABI.md");
        let header = include_str!("../include/rpcrdma.h");
        let mut rows = 0;
        for line in doc.lines() {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let (Some(code), Some(name)) = (cells.get(1), cells.get(2)) else {
                continue;
            };
            let Ok(code) = code.parse::<u32>() else {
                continue;
            };
            if !name.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                continue;
            }
            assert_eq!(status::name(code), *name, "ABI.md row {code}");
            assert!(
                header.contains(&format!("#define RR_{name} {code}u")),
                "rpcrdma.h lacks RR_{name}"
            );
            rows += 1;
        }
        let known = (0..64).filter(|&c| status::name(c) != "unknown").count();
        assert_eq!(rows, known, "ABI.md §6 lists every status once");
        assert_eq!(status::name(status::CHUNK_REFUSED), "CHUNK_REFUSED");
        assert_eq!(status::name(status::BAD_REPLY), "BAD_REPLY");
        assert_eq!(status::name(status::AUTH_DENIED), "AUTH_DENIED");
        assert_eq!(status::name(19), "unknown");
    }
}
