//! Atomics and cells used by the ring protocol: std in normal builds, loom under `--cfg loom`.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, Ordering};

/// One ring slot: plain memory that producer and consumer hand over through the ring indices.
///
/// Same layout as `T` (`repr(transparent)`), so a slot in shared memory is just a descriptor.
#[repr(transparent)]
#[derive(Debug)]
pub struct Slot<T> {
    #[cfg(not(loom))]
    cell: core::cell::UnsafeCell<T>,
    #[cfg(loom)]
    cell: loom::cell::UnsafeCell<T>,
}

impl<T: Copy> Slot<T> {
    /// A slot holding `v` (used to build rings on the heap, e.g. in loom models).
    #[allow(dead_code)]
    pub(crate) fn new(v: T) -> Self {
        Slot {
            #[cfg(not(loom))]
            cell: core::cell::UnsafeCell::new(v),
            #[cfg(loom)]
            cell: loom::cell::UnsafeCell::new(v),
        }
    }

    /// Copies the slot's value out.
    ///
    /// # Safety
    /// The caller owns the slot for reading (the ring protocol says the producer is not writing it),
    /// and every bit pattern is a valid `T`.
    pub(crate) unsafe fn read(&self) -> T {
        #[cfg(not(loom))]
        {
            // SAFETY: the caller guarantees exclusive read access; volatile because the memory is shared
            // with another process the compiler cannot see.
            unsafe { core::ptr::read_volatile(self.cell.get()) }
        }
        #[cfg(loom)]
        {
            // SAFETY: loom checks the caller's exclusivity claim.
            self.cell.with(|p| unsafe { *p })
        }
    }

    /// Stores `v` into the slot.
    ///
    /// # Safety
    /// The caller owns the slot for writing (the consumer has released it).
    pub(crate) unsafe fn write(&self, v: T) {
        #[cfg(not(loom))]
        {
            // SAFETY: the caller guarantees exclusive write access; volatile as for `read`.
            unsafe { core::ptr::write_volatile(self.cell.get(), v) }
        }
        #[cfg(loom)]
        {
            // SAFETY: loom checks the caller's exclusivity claim.
            self.cell.with_mut(|p| unsafe { *p = v })
        }
    }
}

// SAFETY: access to the inner value is arbitrated by the ring protocol (one owner at a time).
unsafe impl<T: Send> Sync for Slot<T> {}
