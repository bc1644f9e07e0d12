//! The maps of in-flight RPCs, keyed by ids the poll thread mints itself (call tokens, hop tags,
//! op ids of the app table, serve ids): a direct-mapped table with a hash map for collisions.
//!
//! Each RPC inserts, finds and removes about twenty entries across these maps. No peer or app
//! chooses a key, so nothing needs a hash that resists crafted collisions (std's SipHash was a
//! tenth of the thread's instructions), and with Fx hashing, hashbrown's probing was still about
//! 6 % of them (an insert about 70 instructions). The live keys are few (the RPCs in flight) and
//! spread well under a multiplicative hash, so almost every key has a slot of its own in a table
//! sized for the thread's most RPCs in flight: a lookup is one multiply, one load and one
//! compare. The rare key whose slot is taken goes to the collision map, which is empty, and
//! costs one test, as long as no collision is live. No crate offers this shape (`slab` and
//! `slotmap` mint their own keys, and these keys come from several places).

use rustc_hash::FxHashMap;

/// Collisions live at once that the map holds without allocating.
const SPILL_ROOM: usize = 64;

/// A map from `u64` ids to `V` (see the module docs).
#[derive(Debug)]
pub(super) struct IdMap<V> {
    slots: Box<[Option<(u64, V)>]>,
    /// `64 - log2(slots)`: the hash's top bits pick the slot.
    shift: u32,
    /// Keys whose slot another key held when they came.
    spill: FxHashMap<u64, V>,
    len: usize,
}

impl<V> IdMap<V> {
    /// An empty map with `slots` slots (rounded up to a power of two, at least 2).
    pub(super) fn new(slots: usize) -> IdMap<V> {
        let n = slots.max(2).next_power_of_two();
        IdMap {
            slots: (0..n).map(|_| None).collect(),
            shift: 64 - n.trailing_zeros(),
            // Room reserved for collisions, so that the first ones (and a burst of them) do
            // not allocate on the hot path; a map never gives back what it grew to.
            spill: FxHashMap::with_capacity_and_hasher(SPILL_ROOM, Default::default()),
            len: 0,
        }
    }

    #[inline]
    fn slot(&self, k: u64) -> usize {
        // Fibonacci hashing: the golden-ratio multiply spreads sequential and strided ids.
        (k.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    /// Inserts `v` under `k`; the value it replaces, if any.
    #[inline]
    pub(super) fn insert(&mut self, k: u64, v: V) -> Option<V> {
        let i = self.slot(k);
        let spill = &mut self.spill;
        match self.slots.get_mut(i) {
            Some(Some((key, old))) if *key == k => Some(std::mem::replace(old, v)),
            Some(empty @ None) => {
                // A key that spilled while its slot was taken stays in the spill map.
                if !spill.is_empty() {
                    if let Some(old) = spill.get_mut(&k) {
                        return Some(std::mem::replace(old, v));
                    }
                }
                *empty = Some((k, v));
                self.len += 1;
                None
            }
            _ => {
                let old = spill.insert(k, v);
                if old.is_none() {
                    self.len += 1;
                }
                old
            }
        }
    }

    /// The value under `k`.
    #[inline]
    pub(super) fn get(&self, k: &u64) -> Option<&V> {
        match self.slots.get(self.slot(*k)) {
            Some(Some((key, v))) if key == k => Some(v),
            _ if self.spill.is_empty() => None,
            _ => self.spill.get(k),
        }
    }

    /// The value under `k`, to change.
    #[inline]
    pub(super) fn get_mut(&mut self, k: &u64) -> Option<&mut V> {
        let i = self.slot(*k);
        match self.slots.get_mut(i) {
            Some(Some((key, v))) if key == k => Some(v),
            _ if self.spill.is_empty() => None,
            _ => self.spill.get_mut(k),
        }
    }

    /// Takes the value under `k` out.
    #[inline]
    pub(super) fn remove(&mut self, k: &u64) -> Option<V> {
        let i = self.slot(*k);
        let taken = match self.slots.get_mut(i) {
            Some(s @ Some(_)) if s.as_ref().is_some_and(|(key, _)| key == k) => {
                s.take().map(|(_, v)| v)
            }
            _ if self.spill.is_empty() => None,
            _ => self.spill.remove(k),
        };
        if taken.is_some() {
            self.len -= 1;
        }
        taken
    }

    /// Entries held.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Every key, in no order (walks every slot: for rare checks, not per RPC).
    pub(super) fn keys(&self) -> impl Iterator<Item = &u64> {
        self.slots
            .iter()
            .filter_map(|s| s.as_ref().map(|(k, _)| k))
            .chain(self.spill.keys())
    }

    /// Every value, in no order (walks every slot: for rare checks, not per RPC).
    pub(super) fn values(&self) -> impl Iterator<Item = &V> {
        self.slots
            .iter()
            .filter_map(|s| s.as_ref().map(|(_, v)| v))
            .chain(self.spill.values())
    }
}

#[cfg(test)]
mod tests {
    use super::IdMap;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u32),
        Remove(u64),
        Get(u64),
    }

    fn op(keys: u64) -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..keys, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            (0..keys).prop_map(Op::Remove),
            (0..keys).prop_map(Op::Get),
        ]
    }

    proptest! {
        /// Any sequence of inserts, removes and lookups gives what std's `HashMap` gives: with
        /// 4 slots and up to 64 keys most keys collide, so the spill map and keys moving
        /// between a freed slot and the spill map are exercised.
        #[test]
        fn behaves_as_a_hash_map(slots in 2usize..16, keys in 1u64..64, ops in proptest::collection::vec(op(64), 1..400)) {
            let mut m = IdMap::new(slots);
            let mut want: HashMap<u64, u32> = HashMap::new();
            for o in ops {
                match o {
                    Op::Insert(k, v) => prop_assert_eq!(m.insert(k % keys, v), want.insert(k % keys, v)),
                    Op::Remove(k) => prop_assert_eq!(m.remove(&(k % keys)), want.remove(&(k % keys))),
                    Op::Get(k) => prop_assert_eq!(m.get(&(k % keys)), want.get(&(k % keys))),
                }
                prop_assert_eq!(m.len(), want.len());
            }
            let mut ks: Vec<u64> = m.keys().copied().collect();
            ks.sort_unstable();
            let mut wk: Vec<u64> = want.keys().copied().collect();
            wk.sort_unstable();
            prop_assert_eq!(ks, wk);
            let mut vs: Vec<u32> = m.values().copied().collect();
            vs.sort_unstable();
            let mut wv: Vec<u32> = want.values().copied().collect();
            wv.sort_unstable();
            prop_assert_eq!(vs, wv);
        }
    }

    /// The thread's keys (sequential tokens, tags with the thread in the top byte, op ids with
    /// slot and generation fields) mostly get slots of their own: 512 live of a table of 8192
    /// leave few in the spill map.
    #[test]
    fn minted_ids_rarely_spill() {
        let mut m = IdMap::new(8192);
        for t in 0..512u64 {
            m.insert((3 << 56) | (1_000_000 + t), ());
            m.insert((5u64 << 48) | (7 << 32) | (t << 16) | 9, ());
        }
        assert_eq!(m.len(), 1024);
        assert!(m.spill.len() < 64, "{} of 1024 spilled", m.spill.len());
    }
}
