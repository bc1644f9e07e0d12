//! The shared region: a sealed memfd mapped by the daemon and by one app.

use crate::abi::{
    ArenaRange, Cqe, Geometry, Layout, PeerEntry, RegionHeader, Sqe, ABI_VERSION, HEADER_SIZE,
    MAGIC, PEER_NAME_MAX, RING_INDICES_SIZE, STATE_ATTACHED,
};
use crate::ring::{Consumer, Producer, RingIndices};
use crate::sync::Slot;
use memmap2::{MmapOptions, MmapRaw};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{MemfdFlags, SealFlags};
use std::fs::File;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

static REGIONS_LIVE: AtomicUsize = AtomicUsize::new(0);

/// Regions currently mapped by this process (created or opened and not yet dropped).
pub fn regions_live() -> usize {
    REGIONS_LIVE.load(Ordering::Relaxed)
}

/// One row of the peer table as the daemon writes it and the app reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeerInfo {
    /// The peer's name from the daemon's config (at most [`PEER_NAME_MAX`] bytes are kept).
    pub name: String,
    /// [`PeerEntry::reply_inline`]: the largest reduced reply received inline from this peer by
    /// a call without Write chunks; 0 if unknown.
    pub reply_inline: u32,
}

impl PeerInfo {
    /// A peer the daemon says nothing more of than its name (`reply_inline` 0).
    pub fn named(name: &str) -> PeerInfo {
        PeerInfo {
            name: name.to_string(),
            reply_inline: 0,
        }
    }
}

impl From<&str> for PeerInfo {
    fn from(name: &str) -> PeerInfo {
        PeerInfo::named(name)
    }
}

/// One mapping of a shared region; unmapped and its fd closed on drop.
#[derive(Debug)]
pub struct Region {
    map: MmapRaw,
    file: File,
    layout: Layout,
}

// SAFETY: the mapping is plain shared memory; all shared state in it is atomics or accessed through ring roles.
unsafe impl Send for Region {}

fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl Region {
    /// Daemon side: creates a sealed memfd of the layout's size, maps it and writes the header and peer table.
    ///
    /// The seals (shrink, grow, seal) mean the app cannot truncate the file under the daemon's mapping.
    pub fn create(layout: Layout, app_id: u32, peers: &[PeerInfo]) -> io::Result<Region> {
        let fd = rustix::fs::memfd_create(
            "rpcrdma-shm",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        rustix::fs::ftruncate(&fd, layout.region_size)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let file = File::from(fd);
        let len = usize::try_from(layout.region_size).map_err(|_| invalid("region too large"))?;
        let map = MmapOptions::new().len(len).map_raw(&file)?;
        REGIONS_LIVE.fetch_add(1, Ordering::Relaxed);
        let r = Region { map, file, layout };
        let h = r.base().cast::<RegionHeader>();
        // SAFETY: the mapping is at least HEADER_SIZE bytes, page aligned, freshly zeroed and not yet shared;
        // we write plain fields through a raw pointer before any other process can see it.
        unsafe {
            (*h).magic = MAGIC;
            (*h).abi_version = ABI_VERSION;
            (*h).header_size = HEADER_SIZE;
            (*h).region_size = layout.region_size;
            (*h).sq_offset = layout.sq_offset;
            (*h).sq_entries = layout.geometry.sq_entries;
            (*h).cq_offset = layout.cq_offset;
            (*h).cq_entries = layout.geometry.cq_entries;
            (*h).arena_offset = layout.arena_offset;
            (*h).arena_size = layout.geometry.arena_size;
            (*h).peers_offset = layout.peers_offset;
            (*h).peers_count = layout.geometry.peers;
            (*h).app_id = app_id;
            (*h).max_outstanding = layout.geometry.cq_entries;
            (*h).state.value.store(STATE_ATTACHED, Ordering::Release);
        }
        for (i, peer) in peers
            .iter()
            .take(layout.geometry.peers as usize)
            .enumerate()
        {
            let mut e = PeerEntry {
                name: [0; PEER_NAME_MAX],
                reply_inline: peer.reply_inline,
            };
            let n = peer.name.len().min(PEER_NAME_MAX);
            e.name[..n].copy_from_slice(&peer.name.as_bytes()[..n]);
            // SAFETY: the peer table lies inside the mapping (Layout reserves `peers` entries after the header).
            unsafe {
                r.base()
                    .add(layout.peers_offset as usize)
                    .cast::<PeerEntry>()
                    .add(i)
                    .write(e)
            };
        }
        Ok(r)
    }

    /// App side: maps a region received from the daemon and checks its header against the file size.
    pub fn open(fd: OwnedFd) -> io::Result<Region> {
        let st = rustix::fs::fstat(&fd)?;
        let size = u64::try_from(st.st_size).map_err(|_| invalid("negative size"))?;
        let file = File::from(fd);
        let len = usize::try_from(size).map_err(|_| invalid("region too large"))?;
        if len < HEADER_SIZE as usize {
            return Err(invalid("region smaller than its header"));
        }
        let map = MmapOptions::new().len(len).map_raw(&file)?;
        REGIONS_LIVE.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the mapping holds at least a header; the daemon wrote it before sending the fd.
        let h = unsafe { &*map.as_ptr().cast::<RegionHeader>() };
        if h.magic != MAGIC || h.abi_version != ABI_VERSION || h.header_size != HEADER_SIZE {
            drop(Region::dummy(map, file));
            return Err(invalid("bad magic or ABI version"));
        }
        let g = Geometry {
            sq_entries: h.sq_entries,
            cq_entries: h.cq_entries,
            arena_size: h.arena_size,
            peers: h.peers_count,
        };
        let layout = Layout::new(g);
        match layout {
            Some(l)
                if l.region_size == size
                    && l.sq_offset == h.sq_offset
                    && l.cq_offset == h.cq_offset
                    && l.arena_offset == h.arena_offset
                    && l.peers_offset == h.peers_offset =>
            {
                Ok(Region {
                    map,
                    file,
                    layout: l,
                })
            }
            _ => {
                drop(Region::dummy(map, file));
                Err(invalid("region header does not match its size"))
            }
        }
    }

    fn dummy(map: MmapRaw, file: File) -> Region {
        Region {
            map,
            file,
            layout: Layout::new(Geometry::default()).expect("default geometry is valid"),
        }
    }

    /// The memfd (the daemon passes it with SCM_RIGHTS; it may also register it with the RDMA provider).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Base address of this process's mapping (for RDMA memory registration).
    pub fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// Mapped length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Always false (a region holds at least its header).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The layout this side trusts (the daemon's own copy, never re-read from shared memory).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The shared header (atomic flags; the app also reads the geometry words).
    pub fn header(&self) -> &RegionHeader {
        // SAFETY: the mapping holds a header at offset 0 for its whole lifetime; fields are plain integers and
        // atomics, valid for any bit pattern.
        unsafe { &*self.base().cast::<RegionHeader>() }
    }

    /// The peer table (app side; the daemon never reads it back).
    pub fn peer_table(&self) -> Vec<PeerInfo> {
        (0..self.layout.geometry.peers as usize)
            .map(|i| {
                // SAFETY: Layout reserves `peers` entries at `peers_offset`, inside the mapping; any bits are valid.
                let e = unsafe {
                    self.base()
                        .add(self.layout.peers_offset as usize)
                        .cast::<PeerEntry>()
                        .add(i)
                        .read_volatile()
                };
                let n = e.name.iter().position(|&b| b == 0).unwrap_or(PEER_NAME_MAX);
                PeerInfo {
                    name: String::from_utf8_lossy(&e.name[..n]).into_owned(),
                    reply_inline: e.reply_inline,
                }
            })
            .collect()
    }

    fn ring_parts<T>(&self, off: u32) -> (NonNull<RingIndices>, NonNull<Slot<T>>) {
        // SAFETY: Layout places the ring's indices and slots inside the mapping at `off`.
        unsafe {
            let p = self.base().add(off as usize);
            (
                NonNull::new_unchecked(p.cast()),
                NonNull::new_unchecked(p.add(RING_INDICES_SIZE as usize).cast()),
            )
        }
    }

    /// Daemon role on the submission ring.
    ///
    /// # Safety
    /// Called once per region (one consumer); the handle must not outlive `self`.
    pub unsafe fn sq_consumer(&self) -> Consumer<Sqe> {
        let (i, s) = self.ring_parts(self.layout.sq_offset);
        // SAFETY: caller guarantees uniqueness and lifetime; entries is a power of two (Layout checked).
        unsafe { Consumer::new(i, s, self.layout.geometry.sq_entries, 0) }
    }

    /// App role on the submission ring.
    ///
    /// # Safety
    /// As for [`Region::sq_consumer`], for the producer.
    pub unsafe fn sq_producer(&self) -> Producer<Sqe> {
        let (i, s) = self.ring_parts(self.layout.sq_offset);
        // SAFETY: as above; a fresh region's indices start at 0.
        unsafe { Producer::new(i, s, self.layout.geometry.sq_entries, 0) }
    }

    /// Daemon role on the completion ring.
    ///
    /// # Safety
    /// As for [`Region::sq_consumer`], for the completion ring's producer.
    pub unsafe fn cq_producer(&self) -> Producer<Cqe> {
        let (i, s) = self.ring_parts(self.layout.cq_offset);
        // SAFETY: as above.
        unsafe { Producer::new(i, s, self.layout.geometry.cq_entries, 0) }
    }

    /// App role on the completion ring.
    ///
    /// # Safety
    /// As for [`Region::sq_consumer`], for the completion ring's consumer.
    pub unsafe fn cq_consumer(&self) -> Consumer<Cqe> {
        let (i, s) = self.ring_parts(self.layout.cq_offset);
        // SAFETY: as above.
        unsafe { Consumer::new(i, s, self.layout.geometry.cq_entries, 0) }
    }

    /// Checks `off`/`len` against this arena.
    pub fn range(&self, off: u32, len: u32) -> Option<ArenaRange> {
        ArenaRange::new(off, len, self.layout.geometry.arena_size)
    }

    /// Address of a checked arena range in this process (for gathers and RDMA work requests).
    pub fn arena_ptr(&self, r: ArenaRange) -> *mut u8 {
        // SAFETY: ArenaRange was checked against this arena's size, which the mapping contains.
        unsafe {
            self.base()
                .add(self.layout.arena_offset as usize + r.off() as usize)
        }
    }

    /// Copies `dst.len()` bytes out of the arena from the start of `r` (at most `r.len()`); returns bytes copied.
    pub fn read_arena(&self, r: ArenaRange, dst: &mut [u8]) -> usize {
        let n = dst.len().min(r.len() as usize);
        // SAFETY: `n` ≤ r.len(), inside the mapping; `dst` is private memory, so no overlap. The other process
        // may write concurrently: that only yields garbage bytes, which callers treat as untrusted.
        unsafe { std::ptr::copy_nonoverlapping(self.arena_ptr(r), dst.as_mut_ptr(), n) };
        n
    }

    /// Copies `src` into the arena at the start of `r` (at most `r.len()` bytes); returns bytes copied.
    pub fn write_arena(&self, r: ArenaRange, src: &[u8]) -> usize {
        let n = src.len().min(r.len() as usize);
        // SAFETY: as for read_arena, in the other direction.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.arena_ptr(r), n) };
        n
    }

    /// Reads the `i`-th 16-byte piece record at arena offset `off` (checked; `None` if outside).
    pub(crate) fn read_piece(&self, off: u32, i: u32) -> Option<crate::abi::Piece> {
        let at = off.checked_add(i.checked_mul(16)?)?;
        let r = self.range(at, 16)?;
        let mut b = [0u8; 16];
        self.read_arena(r, &mut b);
        let w = |k: usize| u32::from_ne_bytes([b[k], b[k + 1], b[k + 2], b[k + 3]]);
        Some(crate::abi::Piece {
            off: w(0),
            len: w(4),
            xdr_pos: w(8),
            used: w(12),
        })
    }

    /// Writes the `i`-th piece record at arena offset `off` (checked; false if outside).
    pub(crate) fn write_piece(&self, off: u32, i: u32, p: crate::abi::Piece) -> bool {
        let Some(at) = i.checked_mul(16).and_then(|d| off.checked_add(d)) else {
            return false;
        };
        let Some(r) = self.range(at, 16) else {
            return false;
        };
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&p.off.to_ne_bytes());
        b[4..8].copy_from_slice(&p.len.to_ne_bytes());
        b[8..12].copy_from_slice(&p.xdr_pos.to_ne_bytes());
        b[12..16].copy_from_slice(&p.used.to_ne_bytes());
        self.write_arena(r, &b);
        true
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        REGIONS_LIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memfd_is_sealed_against_resize() {
        let l = Layout::new(Geometry {
            peers: 2,
            ..Geometry::default()
        })
        .unwrap();
        let peers = [
            PeerInfo {
                name: "alpha".into(),
                reply_inline: 4044,
            },
            PeerInfo::named("beta"),
        ];
        let r = Region::create(l, 7, &peers).unwrap();
        assert!(rustix::fs::ftruncate(r.fd(), 4096).is_err());
        assert!(rustix::fs::ftruncate(r.fd(), l.region_size * 2).is_err());
        assert!(rustix::fs::fcntl_add_seals(r.fd(), SealFlags::WRITE).is_err());
        let fd = rustix::io::fcntl_dupfd_cloexec(r.fd(), 0).unwrap();
        let app = Region::open(fd).unwrap();
        assert_eq!(app.peer_table(), peers);
        assert_eq!(app.layout(), r.layout());
        assert_eq!(app.header().app_id, 7);
    }

    #[test]
    fn open_rejects_a_file_that_is_not_a_region() {
        let fd = rustix::fs::memfd_create("x", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 8192).unwrap();
        assert!(Region::open(fd).is_err());
    }
}
