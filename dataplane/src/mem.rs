//! How the engine names memory and reaches it: [`MemRef`] ranges of registered regions,
//! read and written through a [`Memory`] the poll thread provides, and exposed to the peer
//! through an [`Env`] (the [`Driver`](crate::Driver) implements it over a provider).

use std::cell::Cell;

use rpcrdma_proto::Segment;
use rpcrdma_verbs::mapped::Registered;
use rpcrdma_verbs::{Access, Mr, MrId};

/// The rights a poll thread registers its memory with (its buffer pool, the apps' arenas):
/// local write, and exposure ([`Access::BIND`]). No remote right: a peer reaches this memory
/// only through the keys of one RPC's exposures, never under a region's own key, which a
/// peer could guess and which would reach every connection's buffers and every app's arena
/// (R8166-8.1.3-a).
pub const REGISTERED_ACCESS: Access = Access::LOCAL_WRITE.union(Access::BIND);

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

/// The registered bytes of a [`rpcrdma_verbs::conformance::Side`] as [`Memory`]: its region
/// is `buf[GUARD..GUARD + len]` (the guards on both sides are never reached). For the tests,
/// benches and fuzz drivers that run `Driver`s on the soft provider over real memory.
#[derive(Debug)]
pub struct SideMem {
    /// The region's id.
    pub mr: MrId,
    /// The side's buffer, guards included.
    pub buf: Vec<u8>,
    /// The region's length.
    pub len: u64,
}

impl SideMem {
    fn range(&self, at: MemRef) -> Option<std::ops::Range<usize>> {
        let end = at.offset.checked_add(u64::from(at.len))?;
        let guard = rpcrdma_verbs::conformance::GUARD;
        (at.mr == self.mr && end <= self.len)
            .then(|| guard + at.offset as usize..guard + end as usize)
    }

    /// A copy of the bytes at `at` (empty if `at` is outside the region).
    pub fn get(&self, at: MemRef) -> Vec<u8> {
        self.range(at)
            .and_then(|r| self.buf.get(r))
            .map_or_else(Vec::new, <[u8]>::to_vec)
    }
}

impl Memory for SideMem {
    #[inline]
    fn read(&self, at: MemRef, dst: &mut [u8]) -> bool {
        match self
            .range(at)
            .and_then(|r| self.buf.get(r)?.get(..dst.len()))
        {
            Some(s) => {
                dst.copy_from_slice(s);
                true
            }
            None => false,
        }
    }

    #[inline]
    fn write(&mut self, at: MemRef, src: &[u8]) -> bool {
        let Some(r) = self.range(at) else {
            return false;
        };
        match self.buf.get_mut(r).and_then(|d| d.get_mut(..src.len())) {
            Some(d) => {
                d.copy_from_slice(src);
                true
            }
            None => false,
        }
    }

    #[inline]
    fn copy(&mut self, from: MemRef, to: MemRef) -> bool {
        match (self.range(from), self.range(to)) {
            (Some(f), Some(t)) if f.len() <= t.len() => {
                self.buf.copy_within(f, t.start);
                true
            }
            _ => false,
        }
    }
}

/// Something found by the id of the region it describes.
pub trait ByRegion {
    /// The region's id.
    fn region_id(&self) -> MrId;
}

impl ByRegion for Registered {
    #[inline]
    fn region_id(&self) -> MrId {
        self.mr().id
    }
}

impl ByRegion for Mr {
    #[inline]
    fn region_id(&self) -> MrId {
        self.id
    }
}

/// A poll thread's regions, found by id several times per RPC: the buffer pool plus one
/// arena per attached app, in the daemon's memory ([`RegisteredMem`]) and in the driver's
/// scatter/gather and exposure lookups.
///
/// The items are kept sorted by id (found by binary search), and the last two found are
/// tried first: an RPC's lookups alternate between the buffer pool and one app's arena, so
/// most of them end there, however many apps are attached. A copy between those two finds
/// both in one look ([`find_recent_pair`](Self::find_recent_pair)); the binary search is
/// out of line.
#[derive(Debug)]
pub struct RegionIndex<T> {
    /// Sorted by id, no id twice.
    items: Vec<T>,
    /// Indexes of the two items found last, the latest first (checked before use: an
    /// index made stale by an insert or removal only costs a search).
    recent: Cell<[u32; 2]>,
}

impl<T> Default for RegionIndex<T> {
    fn default() -> Self {
        RegionIndex {
            items: Vec::new(),
            recent: Cell::default(),
        }
    }
}

impl<T: ByRegion> RegionIndex<T> {
    /// An index of `items` (of two with the same id, the last is kept).
    pub fn new(items: Vec<T>) -> RegionIndex<T> {
        let mut ix = RegionIndex::default();
        for it in items {
            ix.insert(it);
        }
        ix
    }

    /// Adds `item`; returns the one it replaces (same id), if any.
    pub fn insert(&mut self, item: T) -> Option<T> {
        let id = item.region_id();
        match self.items.binary_search_by_key(&id, ByRegion::region_id) {
            Ok(i) => self
                .items
                .get_mut(i)
                .map(|old| std::mem::replace(old, item)),
            Err(i) => {
                self.items.insert(i, item);
                None
            }
        }
    }

    /// Takes the item of region `mr` out, if held.
    pub fn remove(&mut self, mr: MrId) -> Option<T> {
        let i = self
            .items
            .binary_search_by_key(&mr, ByRegion::region_id)
            .ok()?;
        Some(self.items.remove(i))
    }

    /// The items, by ascending id.
    pub fn items(&self) -> &[T] {
        &self.items
    }

    /// Takes every item out.
    pub fn take_all(&mut self) -> Vec<T> {
        std::mem::take(&mut self.items)
    }

    /// The item of region `mr`.
    #[inline]
    pub fn find(&self, mr: MrId) -> Option<&T> {
        match self.find_recent(mr) {
            Some(r) => Some(r),
            None => self.search(mr),
        }
    }

    /// The item of region `mr` if it is one of the two found last: the fast path of
    /// [`find`](Self::find), for callers that take the rest out of line.
    #[inline]
    pub fn find_recent(&self, mr: MrId) -> Option<&T> {
        let [a, b] = self.recent.get();
        let at = |i: u32| self.items.get(i as usize).filter(|r| r.region_id() == mr);
        if let Some(r) = at(a) {
            return Some(r);
        }
        let r = at(b)?;
        self.recent.set([b, a]);
        Some(r)
    }

    /// The items of regions `x` and `y` if they are the two found last (in either order):
    /// a copy between two regions looks both up at once. Both stay remembered, in their
    /// order (both were just used).
    #[inline]
    pub fn find_recent_pair(&self, x: MrId, y: MrId) -> Option<(&T, &T)> {
        let [a, b] = self.recent.get();
        let (p, q) = (self.items.get(a as usize)?, self.items.get(b as usize)?);
        let (pid, qid) = (p.region_id(), q.region_id());
        if pid == x && qid == y {
            Some((p, q))
        } else if pid == y && qid == x {
            Some((q, p))
        } else {
            None
        }
    }

    /// [`find`](Self::find) past the two remembered items: a binary search, out of line so
    /// that the callers' fast path stays small.
    #[cold]
    #[inline(never)]
    fn search(&self, mr: MrId) -> Option<&T> {
        let i = self
            .items
            .binary_search_by_key(&mr, ByRegion::region_id)
            .ok()?;
        let [a, _] = self.recent.get();
        self.recent.set([i as u32, a]);
        self.items.get(i)
    }
}

/// Registered memory reached by [`MemRef`]s: a poll thread's buffer pools and its apps' arenas
/// (found through a [`RegionIndex`]).
#[derive(Debug, Default)]
pub struct RegisteredMem {
    regs: RegionIndex<Registered>,
}

impl RegisteredMem {
    /// Memory made of `regs`.
    pub fn new(regs: Vec<Registered>) -> RegisteredMem {
        RegisteredMem {
            regs: RegionIndex::new(regs),
        }
    }

    /// Adds a region (its `MrId` is new: providers never reuse a live one).
    pub fn insert(&mut self, reg: Registered) {
        // A replaced region (never, by the rule above) would still be registered: it is
        // leaked with its mapping rather than unmapping memory a provider may use.
        let _ = self.regs.insert(reg);
    }

    /// Takes region `mr` out, if held.
    pub fn remove(&mut self, mr: MrId) -> Option<Registered> {
        self.regs.remove(mr)
    }

    /// The regions, by ascending `MrId`.
    pub fn regions(&self) -> &[Registered] {
        self.regs.items()
    }

    /// Takes every region out (to deregister them).
    pub fn take_all(&mut self) -> Vec<Registered> {
        self.regs.take_all()
    }

    /// [`Memory::read`] of a region not among the two found last (out of line: the fast
    /// path keeps no registers to save).
    #[cold]
    #[inline(never)]
    fn read_found(&self, at: MemRef, dst: &mut [u8]) -> bool {
        self.regs
            .find(at.mr)
            .is_some_and(|r| r.mem().read(at.offset, dst))
    }

    /// [`Memory::write`] of a region not among the two found last.
    #[cold]
    #[inline(never)]
    fn write_found(&self, at: MemRef, src: &[u8]) -> bool {
        self.regs
            .find(at.mr)
            .is_some_and(|r| r.mem().write(at.offset, src))
    }

    /// [`Memory::copy`] between regions not the two found last (one lookup if they are
    /// the same region).
    #[cold]
    #[inline(never)]
    fn copy_found(&self, from: MemRef, to: MemRef) -> bool {
        let Some(a) = self.regs.find(from.mr) else {
            return false;
        };
        let b = if to.mr == from.mr {
            a
        } else {
            match self.regs.find(to.mr) {
                Some(b) => b,
                None => return false,
            }
        };
        a.mem()
            .copy_to(from.offset, b.mem(), to.offset, from.len as usize)
    }
}

impl Memory for RegisteredMem {
    #[inline]
    fn read(&self, at: MemRef, dst: &mut [u8]) -> bool {
        if dst.len() > at.len as usize {
            return false;
        }
        match self.regs.find_recent(at.mr) {
            Some(r) => r.mem().read(at.offset, dst),
            None => self.read_found(at, dst),
        }
    }

    #[inline]
    fn write(&mut self, at: MemRef, src: &[u8]) -> bool {
        if src.len() > at.len as usize {
            return false;
        }
        match self.regs.find_recent(at.mr) {
            Some(r) => r.mem().write(at.offset, src),
            None => self.write_found(at, src),
        }
    }

    #[inline]
    fn copy(&mut self, from: MemRef, to: MemRef) -> bool {
        if from.len > to.len {
            return false;
        }
        match self.regs.find_recent_pair(from.mr, to.mr) {
            Some((a, b)) => a
                .mem()
                .copy_to(from.offset, b.mem(), to.offset, from.len as usize),
            None => self.copy_found(from, to),
        }
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

    /// The driver's index of region descriptions: an id added again replaces its entry (an
    /// app arena registered anew), and lookups stay right around removals.
    #[test]
    fn region_index_replaces_an_id_added_again() {
        let mr = |id: u32, len: u64| Mr {
            id: MrId(id),
            lkey: id,
            rkey: id,
            addr: 0x1000,
            len,
        };
        let mut ix = RegionIndex::new(vec![mr(30, 1), mr(10, 1), mr(20, 1)]);
        assert_eq!(ix.find(MrId(20)).map(|m| m.len), Some(1));
        assert_eq!(ix.insert(mr(20, 2)).map(|m| m.len), Some(1));
        assert_eq!(ix.insert(mr(15, 3)), None);
        let ids: Vec<u32> = ix.items().iter().map(|m| m.id.0).collect();
        assert_eq!(ids, [10, 15, 20, 30]);
        assert_eq!(ix.find(MrId(20)).map(|m| m.len), Some(2));
        assert_eq!(ix.find(MrId(15)).map(|m| m.len), Some(3));
        assert!(ix.remove(MrId(10)).is_some());
        assert_eq!(ix.find(MrId(10)), None);
        for (id, len) in [(15, 3), (20, 2), (30, 1), (20, 2)] {
            assert_eq!(ix.find(MrId(id)).map(|m| m.len), Some(len), "region {id}");
        }
    }

    /// Copies through the two remembered regions (either direction, and the same region
    /// with overlap) and through the search give what the bytes say, and every range past a
    /// region's end is refused, on the fast path as on the slow one.
    #[test]
    fn copies_between_remembered_regions_stay_checked() {
        let mut p = SoftProvider::memory(&MemFabric::new(), SoftConfig::default());
        let pd = p.alloc_pd().unwrap();
        let regs: Vec<Registered> = (0..3).map(|k| region(&mut p, pd, k as u8 + 1)).collect();
        let ids: Vec<MrId> = regs.iter().map(|r| r.mr().id).collect();
        let mut mem = RegisteredMem::new(regs);
        let at = |k: usize, off: u64, len: u32| MemRef::new(ids[k], off, len);
        let byte = |mem: &RegisteredMem, k: usize, off: u64| {
            let mut b = [0u8; 1];
            assert!(mem.read(at(k, off, 1), &mut b));
            b[0]
        };
        // Regions 0 and 1 remembered: copies both ways take the pair path.
        assert_eq!((byte(&mem, 0, 0), byte(&mem, 1, 0)), (1, 2));
        assert!(mem.copy(at(0, 0, 16), at(1, 100, 16)));
        assert!(mem.copy(at(1, 0, 8), at(0, 200, 8)));
        assert_eq!((byte(&mem, 1, 115), byte(&mem, 0, 207)), (1, 2));
        for (from, to) in [(0, 1), (1, 0)] {
            assert!(
                !mem.copy(at(from, 4090, 16), at(to, 0, 16)),
                "{from}->{to} source end"
            );
            assert!(
                !mem.copy(at(from, 0, 16), at(to, 4090, 16)),
                "{from}->{to} target end"
            );
            assert!(
                !mem.copy(at(from, u64::MAX, 2), at(to, 0, 2)),
                "{from}->{to} wrap"
            );
            assert!(
                !mem.copy(at(from, 0, 2), at(to, u64::MAX - 1, 2)),
                "{from}->{to} wrap"
            );
            assert!(
                !mem.copy(at(from, 0, 16), at(to, 0, 15)),
                "{from}->{to} longer"
            );
        }
        // The same region, overlapping; then a region not remembered, either side.
        assert!(mem.copy(at(0, 0, 16), at(0, 8, 16)));
        assert_eq!((byte(&mem, 0, 8), byte(&mem, 0, 23)), (1, 1));
        assert!(!mem.copy(at(0, 0, 16), at(0, 4088, 16)));
        assert!(mem.copy(at(2, 0, 16), at(0, 300, 16)));
        assert!(mem.copy(at(1, 0, 16), at(2, 400, 16)));
        assert_eq!((byte(&mem, 0, 315), byte(&mem, 2, 400)), (3, 2));
        assert!(!mem.copy(at(2, 4095, 2), at(1, 0, 2)));
        assert!(!mem.copy(at(0, 0, 1), MemRef::new(MrId(u32::MAX), 0, 1)));
        assert!(!mem.write(at(1, 4095, 2), &[9, 9]));
        assert!(!mem.read(at(2, 4095, 2), &mut [0u8; 2]));
        for r in mem.take_all() {
            r.deregister(&mut p).unwrap();
        }
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
