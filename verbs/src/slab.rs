//! Handle tables: a slot per live object, reused once the object is gone, with a generation
//! in the handle's top bits, so that the handle of a destroyed object never names its slot's
//! next occupant. A device may report a destroyed queue pair's work after it is gone, under
//! its handle; a table that handed the same handle to the next queue pair would send that
//! work to the wrong connection, and one that never reused a slot would grow with every
//! connection a long-running daemon ever had.
//!
//! Written here rather than taken from a crate: `slab` keeps no generations, and `slotmap`'s
//! keys are 64 bits wide where the providers' handles are 32.

/// Bits of a handle that index the slot; the rest hold the slot's generation.
const INDEX_BITS: u32 = 20;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;
/// Generations a slot goes through before its handles repeat.
const GENERATIONS: u32 = 1 << (32 - INDEX_BITS);

/// Live objects by handle.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    slots: Vec<Option<T>>,
    /// Per slot: the generation its current (or next) occupant's handle carries.
    gens: Vec<u32>,
    /// Free slots, most recently freed last.
    free: Vec<u32>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            slots: Vec::new(),
            gens: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    /// Stores `t`; its handle, or `None` when every slot a handle can index is taken.
    // Used by the `ibv` provider's tables (the soft provider keeps only queue pairs here).
    #[cfg_attr(not(feature = "ibv"), allow(dead_code))]
    pub(crate) fn insert(&mut self, t: T) -> Option<u32> {
        self.insert_with(|_| t)
    }

    /// Stores what `make` builds, given the handle it will have.
    pub(crate) fn insert_with(&mut self, make: impl FnOnce(u32) -> T) -> Option<u32> {
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                // The last index is never used: an all-ones handle (`QpId::GONE`) names
                // nothing.
                let i = u32::try_from(self.slots.len())
                    .ok()
                    .filter(|&i| i < INDEX_MASK)?;
                self.slots.push(None);
                self.gens.push(0);
                i
            }
        };
        let at = i as usize;
        let h = self.gens[at] << INDEX_BITS | i;
        self.slots[at] = Some(make(h));
        Some(h)
    }

    /// The slot `h` names, if it is still the slot's occupant's handle.
    fn index(&self, h: u32) -> Option<usize> {
        let i = (h & INDEX_MASK) as usize;
        (self.gens.get(i).copied() == Some(h >> INDEX_BITS)).then_some(i)
    }

    pub(crate) fn get(&self, h: u32) -> Option<&T> {
        self.slots.get(self.index(h)?)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, h: u32) -> Option<&mut T> {
        let i = self.index(h)?;
        self.slots.get_mut(i)?.as_mut()
    }

    /// Takes the object `h` names out; `h` names nothing from then on.
    pub(crate) fn remove(&mut self, h: u32) -> Option<T> {
        let i = self.index(h)?;
        let t = self.slots.get_mut(i)?.take()?;
        self.gens[i] = (self.gens[i] + 1) % GENERATIONS;
        self.free.push(i as u32);
        Some(t)
    }

    /// The live objects with their handles.
    #[cfg_attr(not(feature = "ibv"), allow(dead_code))]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.slots
            .iter()
            .zip(&self.gens)
            .enumerate()
            .filter_map(|(i, (s, g))| Some((g << INDEX_BITS | i as u32, s.as_ref()?)))
    }

    /// The live objects.
    #[cfg_attr(not(feature = "ibv"), allow(dead_code))]
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.slots.iter_mut().flatten()
    }

    /// Drops every object, in slot order.
    #[cfg_attr(not(feature = "ibv"), allow(dead_code))]
    pub(crate) fn clear(&mut self) {
        for (i, s) in self.slots.iter_mut().enumerate() {
            if s.take().is_some() {
                self.gens[i] = (self.gens[i] + 1) % GENERATIONS;
                self.free.push(i as u32);
            }
        }
    }

    /// Slots allocated (live or free): what the table costs, which churn does not grow.
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_slot_is_reused_under_a_new_handle() {
        let mut s = Slab::default();
        let a = s.insert("a").unwrap();
        let b = s.insert("b").unwrap();
        assert_eq!(s.remove(a), Some("a"));
        assert_eq!(s.get(a), None, "a removed handle names nothing");
        assert_eq!(s.remove(a), None);
        let c = s.insert("c").unwrap();
        assert_ne!(c, a, "the slot's next occupant has another handle");
        assert_eq!(c & INDEX_MASK, a & INDEX_MASK, "in the same slot");
        assert_eq!(
            (s.get(a), s.get(b), s.get(c)),
            (None, Some(&"b"), Some(&"c"))
        );
        let live: Vec<(u32, &str)> = s.iter().map(|(h, v)| (h, *v)).collect();
        assert_eq!(live, vec![(c, "c"), (b, "b")]);
    }

    #[test]
    fn churn_does_not_grow_the_table_and_old_handles_stay_dead() {
        let mut s = Slab::default();
        let keep = s.insert(0u32).unwrap();
        let mut old = Vec::new();
        for n in 1..10_000u32 {
            let h = s.insert(n).unwrap();
            *s.get_mut(h).unwrap() += 1;
            assert_eq!(s.remove(h), Some(n + 1));
            old.push(h);
        }
        assert_eq!(s.capacity(), 2);
        // A handle repeats only after a slot's every generation.
        let mut seen = old.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), old.len().min(GENERATIONS as usize));
        assert_eq!(s.get(keep), Some(&0));
        s.clear();
        assert_eq!(s.get(keep), None);
        assert_eq!(s.iter().count(), 0);
        assert!(s.values_mut().next().is_none());
    }

    #[test]
    fn a_handle_of_a_slot_never_allocated_names_nothing() {
        let mut s: Slab<u8> = Slab::default();
        assert_eq!(s.get(7), None);
        assert_eq!(s.get_mut(u32::MAX), None);
        assert_eq!(s.remove(1 << INDEX_BITS), None);
        s.slots.resize_with(INDEX_MASK as usize, || None);
        s.gens.resize(INDEX_MASK as usize, GENERATIONS - 1);
        assert_eq!(s.insert(1), None, "no slot for an all-ones handle");
    }
}
