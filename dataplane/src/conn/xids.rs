//! The requester's index of sent, unanswered calls by XID: every reply looks its XID up
//! here, so it is a small open-addressing table (linear probing, deletion by backward shift)
//! instead of a scan of every call slot. XIDs come from apps and peers: the table never
//! trusts them beyond using them as keys.

/// Marks an empty entry.
const EMPTY: u32 = u32::MAX;

/// XID → call slot, for the calls sent and not yet answered.
#[derive(Debug)]
pub(super) struct XidIndex {
    /// (xid, slot) pairs; `slot == EMPTY` is a free entry. The length is a power of two
    /// at least twice the number of call slots, so probes stay short and one entry is
    /// always free (every probe ends).
    table: Vec<(u32, u32)>,
    /// `table.len() - 1`.
    mask: usize,
    /// 32 minus log2 of `table.len()`: the hash keeps the top bits of the product.
    shift: u32,
}

impl XidIndex {
    /// An empty index for calls numbered `0..slots`.
    pub(super) fn new(slots: u32) -> XidIndex {
        let len = (slots as usize)
            .max(1)
            .saturating_mul(2)
            .next_power_of_two();
        XidIndex {
            table: vec![(0, EMPTY); len],
            mask: len - 1,
            shift: 32u32.saturating_sub(len.trailing_zeros()),
        }
    }

    fn home(&self, xid: u32) -> usize {
        // Fibonacci hashing: consecutive XIDs spread over the table.
        (u64::from(xid.wrapping_mul(0x9e37_79b9)) >> self.shift) as usize & self.mask
    }

    /// The slot of the sent call with `xid`.
    pub(super) fn get(&self, xid: u32) -> Option<u32> {
        let mut i = self.home(xid);
        for _ in 0..self.table.len() {
            let &(x, s) = self.table.get(i)?;
            if s == EMPTY {
                return None;
            }
            if x == xid {
                return Some(s);
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    /// Records call `slot` as sent with `xid`.
    pub(super) fn insert(&mut self, xid: u32, slot: u32) {
        let mut i = self.home(xid);
        for _ in 0..self.table.len() {
            match self.table.get_mut(i) {
                Some(e) if e.1 == EMPTY => {
                    *e = (xid, slot);
                    return;
                }
                Some(_) => i = (i + 1) & self.mask,
                None => return,
            }
        }
    }

    /// Forgets call `slot` (sent with `xid`); nothing if it is not recorded.
    pub(super) fn remove(&mut self, xid: u32, slot: u32) {
        let mut i = self.home(xid);
        let mut found = None;
        for _ in 0..self.table.len() {
            match self.table.get(i) {
                Some(&(_, s)) if s == EMPTY => break,
                Some(&(x, s)) if x == xid && s == slot => {
                    found = Some(i);
                    break;
                }
                Some(_) => i = (i + 1) & self.mask,
                None => break,
            }
        }
        let Some(mut hole) = found else {
            return;
        };
        // Backward shift: move later entries of the run into the hole when their home
        // position allows, so that no lookup stops early at the hole.
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            let Some(&(x, s)) = self.table.get(j) else {
                break;
            };
            if s == EMPTY {
                break;
            }
            let home = self.home(x);
            // The entry at `j` may move to `hole` unless its home lies in (hole, j].
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                if let Some(h) = self.table.get_mut(hole) {
                    *h = (x, s);
                }
                hole = j;
            }
        }
        if let Some(h) = self.table.get_mut(hole) {
            *h = (0, EMPTY);
        }
    }

    /// Forgets every call.
    pub(super) fn clear(&mut self) {
        self.table.fill((0, EMPTY));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks the index against a plain list after every operation of a long mixed run,
    /// with XIDs chosen to collide (same home) and to wrap around the table's end.
    #[test]
    fn xid_index_agrees_with_a_list() {
        let mut ix = XidIndex::new(8);
        let mut model: Vec<(u32, u32)> = Vec::new();
        let mut seed = 12345u32;
        let mut rand = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        // A few XIDs only, so runs of colliding entries form and break up often.
        let pool: Vec<u32> = (0..24).map(|k| k * 16 + (k % 3)).collect();
        for _ in 0..20_000 {
            let r = rand();
            let xid = pool[(r as usize >> 4) % pool.len()];
            let present = model.iter().position(|e| e.0 == xid);
            match (present, r % 2) {
                (None, _) if model.len() < 8 => {
                    let slot = (0..8).find(|s| model.iter().all(|e| e.1 != *s)).unwrap();
                    ix.insert(xid, slot);
                    model.push((xid, slot));
                }
                (Some(p), 0) => {
                    let (x, s) = model.swap_remove(p);
                    ix.remove(x, s);
                }
                _ => {}
            }
            for &x in &pool {
                let want = model.iter().find(|e| e.0 == x).map(|e| e.1);
                assert_eq!(ix.get(x), want, "xid {x}");
            }
        }
        ix.clear();
        assert!(pool.iter().all(|&x| ix.get(x).is_none()));
    }

    #[test]
    fn xid_index_removes_only_the_named_slot() {
        let mut ix = XidIndex::new(4);
        ix.insert(7, 1);
        ix.remove(7, 2);
        assert_eq!(ix.get(7), Some(1));
        ix.remove(7, 1);
        assert_eq!(ix.get(7), None);
        // Extreme XIDs are ordinary keys.
        ix.insert(u32::MAX, 3);
        ix.insert(0, 0);
        assert_eq!((ix.get(u32::MAX), ix.get(0)), (Some(3), Some(0)));
    }
}
