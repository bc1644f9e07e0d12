//! STag table: memory regions and windows, key allocation, protection checks, and the only
//! code that touches registered memory.

use std::collections::VecDeque;

use crate::soft::wire::{TermCode, LAYER_DDP, LAYER_RDMAP};
use crate::{Access, PdId, QpId, Sge};

/// Freed STag indices wait behind this many others before reuse.
const REUSE_DELAY: usize = 64;

#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Free,
    Mr {
        pd: u32,
        addr: u64,
        len: u64,
        access: Access,
    },
    Window {
        pd: u32,
        qp: u32,
        mr: u32,
        addr: u64,
        len: u64,
        access: Access,
    },
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    key: u8,
    kind: Kind,
}

/// Why a remote access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Unknown, invalidated or stale STag.
    Invalid,
    /// Outside the region or window.
    Bounds,
    /// The needed right is missing.
    Access,
    /// Wrong protection domain or queue pair.
    NotAssociated,
}

impl Refused {
    /// The DDP tagged-buffer Terminate for an RDMA Write / Read Response placement.
    pub(crate) fn tagged_term(self) -> TermCode {
        let ecode = match self {
            // siw reports a missing remote-write right as an invalid STag.
            Refused::Invalid | Refused::Access => 0,
            Refused::Bounds => 1,
            Refused::NotAssociated => 2,
        };
        TermCode::new(LAYER_DDP, 1, ecode)
    }
    /// The RDMAP remote-protection Terminate for a refused Read Request source.
    pub(crate) fn read_term(self) -> TermCode {
        let ecode = match self {
            Refused::Invalid => 0,
            Refused::Bounds => 1,
            Refused::Access => 2,
            Refused::NotAssociated => 3,
        };
        TermCode::new(LAYER_RDMAP, 1, ecode)
    }
}

/// The STag table of one provider.
#[derive(Debug)]
pub(crate) struct Mem {
    entries: Vec<Entry>,
    free: VecDeque<u32>,
    rng: u64,
}

impl Mem {
    pub(crate) fn new() -> Mem {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(&h as *const _ as usize);
        // Index 0 is never handed out, so STag 0 is always invalid.
        Mem {
            entries: vec![Entry {
                key: 0,
                kind: Kind::Free,
            }],
            free: VecDeque::new(),
            rng: h.finish() | 1,
        }
    }

    fn next_rand(&mut self) -> u64 {
        // xorshift64*: cheap, seeded from the process's random hasher keys.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Allocate an STag for `kind`: index from the delayed free list, fresh 8-bit key.
    pub(crate) fn alloc(&mut self, kind: Kind) -> Option<u32> {
        let r = (self.next_rand() >> 32) as u8;
        let idx = if self.free.len() > REUSE_DELAY {
            self.free.pop_front()?
        } else {
            let idx = u32::try_from(self.entries.len()).ok()?;
            if idx >= 1 << 24 {
                return None;
            }
            self.entries.push(Entry {
                key: r,
                kind: Kind::Free,
            });
            idx
        };
        let e = self.entries.get_mut(idx as usize)?;
        // A new key differs from the previous one at this index, so a stale STag never
        // matches again right away.
        e.key = e.key.wrapping_add(1 + (r & 0x7f));
        e.kind = kind;
        Some((idx << 8) | u32::from(e.key))
    }

    pub(crate) fn lookup(&self, stag: u32) -> Option<Kind> {
        self.kind(stag).copied()
    }

    /// What `stag` names, borrowed: the per-segment checks read two or three fields of it,
    /// and [`Mem::lookup`]'s copy of the whole entry cost more than they did.
    #[inline]
    fn kind(&self, stag: u32) -> Option<&Kind> {
        let e = self.entries.get((stag >> 8) as usize)?;
        if e.key != stag as u8 {
            return None;
        }
        match &e.kind {
            Kind::Free => None,
            k => Some(k),
        }
    }

    /// Free an STag (no check of its kind).
    pub(crate) fn free(&mut self, stag: u32) {
        if self.lookup(stag).is_some() {
            if let Some(e) = self.entries.get_mut((stag >> 8) as usize) {
                e.kind = Kind::Free;
                self.free.push_back(stag >> 8);
            }
        }
    }

    /// Free the region `stag` and every window bound to it.
    pub(crate) fn free_mr(&mut self, stag: u32) -> bool {
        if !matches!(self.lookup(stag), Some(Kind::Mr { .. })) {
            return false;
        }
        let idx = stag >> 8;
        for i in 1..self.entries.len() {
            if let Kind::Window { mr, .. } = self.entries[i].kind {
                if mr == idx {
                    self.entries[i].kind = Kind::Free;
                    self.free.push_back(i as u32);
                }
            }
        }
        self.free(stag);
        true
    }

    /// Free every window bound to queue pair `qp` (its handle may be reused later).
    pub(crate) fn free_qp_windows(&mut self, qp: u32) {
        for i in 1..self.entries.len() {
            if let Kind::Window { qp: q, .. } = self.entries[i].kind {
                if q == qp {
                    self.entries[i].kind = Kind::Free;
                    self.free.push_back(i as u32);
                }
            }
        }
    }

    /// Invalidate a window of `pd` (local or Send with Invalidate); regions cannot be.
    pub(crate) fn invalidate(&mut self, pd: PdId, stag: u32) -> Result<(), TermCode> {
        match self.lookup(stag) {
            Some(Kind::Window { pd: p, .. }) if p == pd.0 => {
                self.free(stag);
                Ok(())
            }
            Some(Kind::Window { .. }) => Err(TermCode::new(LAYER_RDMAP, 1, 9)),
            _ => Err(TermCode::RDMAP_CANT_INVALIDATE),
        }
    }

    /// Invalidate a window for a peer's Send with Invalidate arriving on queue pair `qp`: only
    /// a window of `pd` bound to `qp`. A window bound to another queue pair is not the
    /// sender's to invalidate: RDMAP's remote protection error "STag not associated with
    /// RDMAP stream" (RFC 5040) ends the sender's stream, and no other stream's window changes.
    pub(crate) fn invalidate_remote(
        &mut self,
        pd: PdId,
        qp: QpId,
        stag: u32,
    ) -> Result<(), TermCode> {
        match self.lookup(stag) {
            Some(Kind::Window { pd: p, qp: q, .. }) if p == pd.0 && q != qp.0 => {
                Err(Refused::NotAssociated.read_term())
            }
            _ => self.invalidate(pd, stag),
        }
    }

    /// Check a peer's access of `len` bytes at `to` under `stag` from queue pair `qp`.
    pub(crate) fn check_remote(
        &self,
        pd: PdId,
        qp: QpId,
        stag: u32,
        to: u64,
        len: u64,
        need: Access,
    ) -> Result<*mut u8, Refused> {
        let (addr, rlen, access) = match self.lookup(stag).ok_or(Refused::Invalid)? {
            Kind::Mr {
                pd: p,
                addr,
                len,
                access,
            } => {
                if p != pd.0 {
                    return Err(Refused::NotAssociated);
                }
                (addr, len, access)
            }
            Kind::Window {
                pd: p,
                qp: q,
                addr,
                len,
                access,
                ..
            } => {
                if p != pd.0 || q != qp.0 {
                    return Err(Refused::NotAssociated);
                }
                (addr, len, access)
            }
            Kind::Free => return Err(Refused::Invalid),
        };
        if !access.contains(need) {
            return Err(Refused::Access);
        }
        let off = to.checked_sub(addr).ok_or(Refused::Bounds)?;
        let end = off.checked_add(len).ok_or(Refused::Bounds)?;
        if end > rlen {
            return Err(Refused::Bounds);
        }
        Ok(to as usize as *mut u8)
    }

    /// Check a local scatter/gather entry; regions only (window keys are not lkeys).
    // Always inline (see `scatter`).
    #[inline(always)]
    fn check_local(&self, pd: PdId, s: &Sge, write: bool) -> Option<*mut u8> {
        match *self.kind(s.lkey)? {
            Kind::Mr {
                pd: p,
                addr,
                len,
                access,
            } if p == pd.0 => {
                if write && !access.contains(Access::LOCAL_WRITE) {
                    return None;
                }
                let off = s.addr.checked_sub(addr)?;
                if off.checked_add(u64::from(s.len))? > len {
                    return None;
                }
                Some(s.addr as usize as *mut u8)
            }
            _ => None,
        }
    }

    /// Whether every entry of `sg` is a valid local buffer (writable if `write`).
    pub(crate) fn check_sg(&self, pd: PdId, sg: &[Sge], write: bool) -> bool {
        sg.iter().all(|s| self.check_local(pd, s, write).is_some())
    }

    /// Append `n` bytes of the gather list `sg`, starting at byte `off`, to `out`.
    ///
    /// Inline (as [`Mem::scatter`]): every Send and every received segment goes through one
    /// of them, usually with a single entry, and the call frame cost as much as the loop.
    #[inline]
    pub(crate) fn gather(
        &self,
        pd: PdId,
        sg: &[Sge],
        mut off: u64,
        mut n: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), ()> {
        for s in sg {
            if n == 0 {
                break;
            }
            let l = u64::from(s.len);
            if off >= l {
                off -= l;
                continue;
            }
            let take = ((l - off) as usize).min(n);
            let p = self.check_local(pd, s, false).ok_or(())?;
            out.reserve(take);
            // SAFETY: `check_local` proved `s` lies inside a registered region, which the
            // `register` contract keeps valid for reads; `off + take <= s.len`. `out` has
            // `take` spare bytes after `reserve`; the regions cannot overlap (ours vs the
            // caller's). Raw copies, no reference to the (possibly shared) source memory.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    p.add(off as usize),
                    out.as_mut_ptr().add(out.len()),
                    take,
                );
                out.set_len(out.len() + take);
            }
            n -= take;
            off = 0;
        }
        if n == 0 {
            Ok(())
        } else {
            Err(())
        }
    }

    /// Copy `data` into the scatter list `sg` starting at byte `off` (entries need local write).
    // Always inline: every receive scatters here, and LLVM's budget for the provider's poll
    // left it out of line as soon as that grew a little.
    #[inline(always)]
    pub(crate) fn scatter(
        &self,
        pd: PdId,
        sg: &[Sge],
        mut off: u64,
        mut data: &[u8],
    ) -> Result<(), ()> {
        for s in sg {
            if data.is_empty() {
                break;
            }
            let l = u64::from(s.len);
            if off >= l {
                off -= l;
                continue;
            }
            let take = ((l - off) as usize).min(data.len());
            let p = self.check_local(pd, s, true).ok_or(())?;
            // SAFETY: `check_local` proved `s` lies in a registered region with local-write
            // access, valid for writes by the `register` contract; `off + take <= s.len`;
            // `data` is our own receive buffer, disjoint from registered memory.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p.add(off as usize), take) };
            data = &data[take..];
            off = 0;
        }
        if data.is_empty() {
            Ok(())
        } else {
            Err(())
        }
    }

    /// Copy `data` to a remote-access destination checked by [`Mem::check_remote`].
    pub(crate) fn place(dst: *mut u8, data: &[u8]) {
        // SAFETY: callers pass a pointer returned by `check_remote` for exactly `data.len()`
        // bytes, inside a registered region valid for writes by the `register` contract.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
    }

    /// Append `n` bytes from a remote-access source checked by [`Mem::check_remote`].
    pub(crate) fn fetch(src: *const u8, n: usize, out: &mut Vec<u8>) {
        out.reserve(n);
        // SAFETY: `src` came from `check_remote` for `n` bytes inside a registered region
        // (valid for reads); `out` has `n` spare bytes after `reserve` and is disjoint.
        unsafe {
            std::ptr::copy_nonoverlapping(src, out.as_mut_ptr().add(out.len()), n);
            out.set_len(out.len() + n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(qp: u32) -> Kind {
        Kind::Window {
            pd: 0,
            qp,
            mr: 1,
            addr: 0x1000,
            len: 0x100,
            access: Access::REMOTE_WRITE,
        }
    }

    #[test]
    fn stag_never_reused_right_after_free() {
        let mut m = Mem::new();
        let mut freed_at = std::collections::HashMap::new();
        let mut live = std::collections::VecDeque::new();
        for n in 0..20_000usize {
            let s = m.alloc(window(1)).unwrap();
            if let Some(at) = freed_at.get(&s) {
                assert!(
                    n - at > REUSE_DELAY,
                    "stag {s:#x} back {} allocations after its free",
                    n - at
                );
            }
            live.push_back(s);
            if live.len() > 8 {
                let old = live.pop_front().unwrap();
                m.free(old);
                freed_at.insert(old, n);
                assert!(m.lookup(old).is_none(), "freed stag still valid");
            }
        }
        assert!(m.lookup(0).is_none(), "STag 0 is never valid");
    }

    #[test]
    fn windows_of_a_destroyed_qp_are_freed() {
        let mut m = Mem::new();
        let a = m.alloc(window(3)).unwrap();
        let b = m.alloc(window(4)).unwrap();
        m.free_qp_windows(3);
        assert!(m.lookup(a).is_none());
        assert!(m.lookup(b).is_some());
    }

    #[test]
    fn remote_checks_refuse_wrap_bounds_rights_and_association() {
        let mut m = Mem::new();
        let w = m.alloc(window(1)).unwrap();
        let (pd, qp) = (PdId(0), QpId(1));
        assert!(m
            .check_remote(pd, qp, w, 0x1000, 0x100, Access::REMOTE_WRITE)
            .is_ok());
        assert_eq!(
            m.check_remote(pd, qp, w, 0x1001, 0x100, Access::REMOTE_WRITE),
            Err(Refused::Bounds)
        );
        assert_eq!(
            m.check_remote(pd, qp, w, 0xfff, 1, Access::REMOTE_WRITE),
            Err(Refused::Bounds)
        );
        assert_eq!(
            m.check_remote(pd, qp, w, 0x1010, u64::MAX, Access::REMOTE_WRITE),
            Err(Refused::Bounds)
        );
        assert_eq!(
            m.check_remote(pd, qp, w, 0x1000, 1, Access::REMOTE_READ),
            Err(Refused::Access)
        );
        assert_eq!(
            m.check_remote(pd, QpId(2), w, 0x1000, 1, Access::REMOTE_WRITE),
            Err(Refused::NotAssociated)
        );
        assert_eq!(
            m.check_remote(PdId(1), qp, w, 0x1000, 1, Access::REMOTE_WRITE),
            Err(Refused::NotAssociated)
        );
        assert_eq!(
            m.check_remote(pd, qp, w ^ 1, 0x1000, 1, Access::REMOTE_WRITE),
            Err(Refused::Invalid)
        );
    }
}
