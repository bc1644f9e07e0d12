//! How the engine names memory and reaches it: [`MemRef`] ranges of registered regions,
//! read and written through a [`Memory`] the poll thread provides, and exposed to the peer
//! through an [`Env`] (the [`Driver`](crate::Driver) implements it over a provider).

use rpcrdma_proto::Segment;
use rpcrdma_verbs::mapped::Registered;
use rpcrdma_verbs::{Access, MrId};

/// A byte range of a registered region: `len` bytes at `offset` from the region's start.
///
/// App memory is named this way (the app's arena registered once, `offset` = arena offset
/// plus the arena's offset in the region), as are the engine's own send and receive buffers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemRef {
    /// The registered region.
    pub mr: MrId,
    /// Offset of the first byte from the start of the region.
    pub offset: u64,
    /// Length in bytes.
    pub len: u32,
}

impl MemRef {
    /// A range of `len` bytes at `offset` in `mr`.
    pub const fn new(mr: MrId, offset: u64, len: u32) -> MemRef {
        MemRef { mr, offset, len }
    }

    /// The sub-range `off..off + len`, or `None` if it does not lie inside this range.
    #[inline]
    pub fn sub(&self, off: u32, len: u32) -> Option<MemRef> {
        let end = off.checked_add(len)?;
        if end > self.len {
            return None;
        }
        Some(MemRef {
            mr: self.mr,
            offset: self.offset.checked_add(u64::from(off))?,
            len,
        })
    }

    /// The first `len` bytes, or `None` if the range is shorter.
    #[inline]
    pub fn prefix(&self, len: u32) -> Option<MemRef> {
        self.sub(0, len)
    }
}

/// Byte access to registered memory; every method is bounds-checked by the implementor and
/// returns false (never panics) for a range it does not hold.
pub trait Memory {
    /// Copies `dst.len()` bytes from the start of `at` into `dst` (`dst.len() <= at.len`).
    fn read(&self, at: MemRef, dst: &mut [u8]) -> bool;
    /// Copies `src` to the start of `at` (`src.len() <= at.len`).
    fn write(&mut self, at: MemRef, src: &[u8]) -> bool;
    /// Copies `from.len` bytes from `from` to the start of `to` (`from.len <= to.len`); the
    /// ranges may overlap.
    fn copy(&mut self, from: MemRef, to: MemRef) -> bool;
}

/// What a connection needs from its surroundings besides work queues: memory, and
/// per-RPC exposure of memory to the peer (a memory window bound on the connection).
pub trait Env: Memory {
    /// Exposes `at` to the peer with `access` for one RPC; returns the segment the peer
    /// uses (key, length, address), or `None` if the provider refused.
    fn expose(&mut self, at: MemRef, access: Access) -> Option<Segment>;

    /// A send buffer from a pool shared by connections (`send_size + SLOT_TAIL` bytes),
    /// for connections with [`ConnConfig::shared_send`](crate::ConnConfig::shared_send);
    /// it comes back as [`Work::Release`](crate::Work::Release). `None`: none free now.
    fn take_send(&mut self) -> Option<MemRef> {
        None
    }
}

/// Memory held in plain vectors, one per region: for tests and for the sans-IO examples.
#[derive(Debug, Default, Clone)]
pub struct VecMemory {
    regions: Vec<(MrId, Vec<u8>)>,
}

impl VecMemory {
    /// No regions.
    pub fn new() -> VecMemory {
        VecMemory::default()
    }

    /// Adds (or replaces) region `mr` with `len` zero bytes.
    pub fn add(&mut self, mr: MrId, len: usize) {
        self.regions.retain(|(id, _)| *id != mr);
        self.regions.push((mr, vec![0; len]));
    }

    /// The bytes of region `mr`.
    pub fn region(&self, mr: MrId) -> Option<&[u8]> {
        self.regions
            .iter()
            .find(|(id, _)| *id == mr)
            .map(|(_, v)| v.as_slice())
    }

    /// The bytes of region `mr`, writable.
    pub fn region_mut(&mut self, mr: MrId) -> Option<&mut [u8]> {
        self.regions
            .iter_mut()
            .find(|(id, _)| *id == mr)
            .map(|(_, v)| v.as_mut_slice())
    }

    /// The bytes of `at`.
    pub fn slice(&self, at: MemRef) -> Option<&[u8]> {
        let (s, e) = range(at)?;
        self.region(at.mr)?.get(s..e)
    }

    /// The bytes of `at`, writable.
    pub fn slice_mut(&mut self, at: MemRef) -> Option<&mut [u8]> {
        let (s, e) = range(at)?;
        self.region_mut(at.mr)?.get_mut(s..e)
    }
}

fn range(at: MemRef) -> Option<(usize, usize)> {
    let s = usize::try_from(at.offset).ok()?;
    Some((s, s.checked_add(at.len as usize)?))
}

impl Memory for VecMemory {
    fn read(&self, at: MemRef, dst: &mut [u8]) -> bool {
        match self.slice(at).and_then(|s| s.get(..dst.len())) {
            Some(s) => {
                dst.copy_from_slice(s);
                true
            }
            None => false,
        }
    }

    fn write(&mut self, at: MemRef, src: &[u8]) -> bool {
        match self.slice_mut(at).and_then(|s| s.get_mut(..src.len())) {
            Some(d) => {
                d.copy_from_slice(src);
                true
            }
            None => false,
        }
    }

    fn copy(&mut self, from: MemRef, to: MemRef) -> bool {
        if from.len > to.len {
            return false;
        }
        let (Some((fs, fe)), Some((ts, te))) =
            (range(from), range(to.prefix(from.len).unwrap_or(to)))
        else {
            return false;
        };
        let fi = self.regions.iter().position(|(id, _)| *id == from.mr);
        let ti = self.regions.iter().position(|(id, _)| *id == to.mr);
        let (Some(fi), Some(ti)) = (fi, ti) else {
            return false;
        };
        if fi == ti {
            let Some((_, r)) = self.regions.get_mut(fi) else {
                return false;
            };
            if fe > r.len() || te > r.len() {
                return false;
            }
            r.copy_within(fs..fe, ts);
            return true;
        }
        // Two regions: borrow both without copying through a temporary.
        let (lo, hi) = self.regions.split_at_mut(fi.max(ti));
        let (a, b) = match (lo.get_mut(fi.min(ti)), hi.first_mut()) {
            (Some(a), Some(b)) => (a, b),
            _ => return false,
        };
        let (src, dst) = if fi < ti {
            (&a.1, &mut b.1)
        } else {
            (&b.1, &mut a.1)
        };
        match (src.get(fs..fe), dst.get_mut(ts..te)) {
            (Some(s), Some(d)) => {
                d.copy_from_slice(s);
                true
            }
            _ => false,
        }
    }
}

/// Registered memory reached by [`MemRef`]s: a poll thread's buffer pools and its apps' arenas.
#[derive(Debug, Default)]
pub struct RegisteredMem {
    /// The regions, each found by its `MrId`.
    pub regs: Vec<Registered>,
}

impl RegisteredMem {
    fn find(&self, mr: MrId) -> Option<&Registered> {
        self.regs.iter().find(|r| r.mr().id == mr)
    }
}

impl Memory for RegisteredMem {
    fn read(&self, at: MemRef, dst: &mut [u8]) -> bool {
        dst.len() <= at.len as usize
            && self
                .find(at.mr)
                .is_some_and(|r| r.mem().read(at.offset, dst))
    }

    fn write(&mut self, at: MemRef, src: &[u8]) -> bool {
        src.len() <= at.len as usize
            && self
                .find(at.mr)
                .is_some_and(|r| r.mem().write(at.offset, src))
    }

    fn copy(&mut self, from: MemRef, to: MemRef) -> bool {
        if from.len > to.len {
            return false;
        }
        let (Some(a), Some(b)) = (self.find(from.mr), self.find(to.mr)) else {
            return false;
        };
        a.mem()
            .copy_to(from.offset, b.mem(), to.offset, from.len as usize)
    }
}
