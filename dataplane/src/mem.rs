//! How the engine names memory and reaches it: [`MemRef`] ranges of registered regions,
//! read and written through a [`Memory`] the poll thread provides, and exposed to the peer
//! through an [`Env`] (the [`Driver`](crate::Driver) implements it over a provider).

use std::cell::Cell;

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
///
/// Every `Memory` operation looks its region up by `MrId`, several times per RPC, and a poll
/// thread holds one region per attached app. The regions are kept sorted by id (found by
/// binary search), and the last two found are tried first: an RPC's operations alternate
/// between the buffer pool and one app's arena, so most lookups end there, however many apps
/// are attached.
#[derive(Debug, Default)]
pub struct RegisteredMem {
    /// Sorted by `MrId`.
    regs: Vec<Registered>,
    /// Indexes of the two regions found last, the latest first (checked before use: an
    /// index made stale by an insert or removal only costs a search).
    recent: Cell<[u32; 2]>,
}

impl RegisteredMem {
    /// Memory made of `regs`.
    pub fn new(mut regs: Vec<Registered>) -> RegisteredMem {
        regs.sort_unstable_by_key(|r| r.mr().id);
        RegisteredMem {
            regs,
            recent: Cell::default(),
        }
    }

    /// Adds a region (its `MrId` is new: providers never reuse a live one).
    pub fn insert(&mut self, reg: Registered) {
        let id = reg.mr().id;
        let at = self.regs.partition_point(|r| r.mr().id < id);
        self.regs.insert(at, reg);
    }

    /// Takes region `mr` out, if held.
    pub fn remove(&mut self, mr: MrId) -> Option<Registered> {
        let i = self.regs.binary_search_by_key(&mr, |r| r.mr().id).ok()?;
        Some(self.regs.remove(i))
    }

    /// The regions, by ascending `MrId`.
    pub fn regions(&self) -> &[Registered] {
        &self.regs
    }

    /// Takes every region out (to deregister them).
    pub fn take_all(&mut self) -> Vec<Registered> {
        std::mem::take(&mut self.regs)
    }

    #[inline]
    fn find(&self, mr: MrId) -> Option<&Registered> {
        let [a, b] = self.recent.get();
        let at = |i: u32| self.regs.get(i as usize).filter(|r| r.mr().id == mr);
        if let Some(r) = at(a) {
            return Some(r);
        }
        if let Some(r) = at(b) {
            self.recent.set([b, a]);
            return Some(r);
        }
        let i = self.regs.binary_search_by_key(&mr, |r| r.mr().id).ok()?;
        self.recent.set([i as u32, a]);
        self.regs.get(i)
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

#[cfg(test)]
mod tests {
    use super::*;
    use rpcrdma_verbs::mapped::Mapped;
    use rpcrdma_verbs::soft::link::MemFabric;
    use rpcrdma_verbs::soft::{SoftConfig, SoftMem, SoftProvider};
    use rpcrdma_verbs::{PdId, Provider};

    fn region(p: &mut SoftMem, pd: PdId, fill: u8) -> Registered {
        let m = Mapped::anonymous(4096).unwrap();
        assert!(m.write(0, &[fill; 16]));
        Registered::new(p, pd, m, Access::LOCAL_WRITE).unwrap()
    }

    /// Lookups find the right region whatever the order of inserts and removals, including
    /// through the two remembered indexes after the regions around them moved.
    #[test]
    fn regions_are_found_by_id_after_inserts_and_removals() {
        let mut p = SoftProvider::memory(&MemFabric::new(), SoftConfig::default());
        let pd = p.alloc_pd().unwrap();
        let regs: Vec<Registered> = (0..6).map(|k| region(&mut p, pd, k as u8 + 1)).collect();
        let ids: Vec<MrId> = regs.iter().map(|r| r.mr().id).collect();
        let mut it = regs.into_iter().rev();
        let mut mem = RegisteredMem::new(it.by_ref().take(3).collect());
        let first = |mem: &RegisteredMem, k: usize| {
            let mut b = [0u8; 1];
            mem.read(MemRef::new(ids[k], 0, 1), &mut b).then_some(b[0])
        };
        // Regions 5, 4, 3 held; 0..3 not yet.
        assert_eq!(first(&mem, 4), Some(5));
        assert_eq!(first(&mem, 3), Some(4));
        assert_eq!(first(&mem, 0), None);
        for r in it {
            mem.insert(r);
        }
        for k in [4, 0, 3, 5, 1, 2, 4, 4, 0] {
            assert_eq!(first(&mem, k), Some(k as u8 + 1), "region {k}");
        }
        assert!(mem
            .regions()
            .windows(2)
            .all(|w| w[0].mr().id < w[1].mr().id));
        // Remove the two regions just used: the remembered indexes now name others.
        let gone = [mem.remove(ids[0]).unwrap(), mem.remove(ids[4]).unwrap()];
        assert!(mem.remove(ids[0]).is_none());
        assert_eq!(first(&mem, 0), None);
        assert_eq!(first(&mem, 4), None);
        for k in [1, 2, 3, 5, 2] {
            assert_eq!(first(&mem, k), Some(k as u8 + 1), "region {k}");
        }
        // Copies between regions go through the same lookup.
        assert!(mem.copy(MemRef::new(ids[5], 0, 16), MemRef::new(ids[1], 0, 16)));
        assert_eq!(first(&mem, 1), Some(6));
        assert!(!mem.copy(MemRef::new(ids[0], 0, 16), MemRef::new(ids[1], 0, 16)));
        for r in gone.into_iter().chain(mem.take_all()) {
            r.deregister(&mut p).unwrap();
        }
    }
}
