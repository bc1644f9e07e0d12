//! Single-producer single-consumer ring of fixed-size descriptors (io_uring-style, free-running `u32` indices).
//!
//! Each side keeps its own index in private memory and only *stores* it to the shared word, so a hostile peer
//! rewriting our index cannot confuse us; the peer's index is loaded, checked against what is possible
//! (`0 ≤ produced − consumed ≤ capacity`) and reported as [`RingError::Corrupt`] otherwise.

use crate::sync::{AtomicU32, Ordering, Slot};
use core::ptr::NonNull;

/// A 64-byte cache line holding one ring index, so producer and consumer never share a line.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct IndexLine {
    /// The free-running index (wraps at 2^32; slot = index & (entries − 1)).
    pub value: AtomicU32,
}

/// The two shared indices at the start of a ring: producer's tail, then consumer's head, each on its own line.
#[repr(C)]
#[derive(Debug)]
pub struct RingIndices {
    /// Next index the producer will write; stored (Release) by the producer only.
    pub producer: IndexLine,
    /// Next index the consumer will read; stored (Release) by the consumer only.
    pub consumer: IndexLine,
}

impl RingIndices {
    /// Two zeroed indices (an empty ring).
    #[allow(dead_code)]
    pub(crate) fn new() -> Self {
        RingIndices {
            producer: IndexLine {
                value: AtomicU32::new(0),
            },
            consumer: IndexLine {
                value: AtomicU32::new(0),
            },
        }
    }
}

/// Why a ring operation did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingError {
    /// The ring has no free slot (push) — try again after the consumer advances.
    Full,
    /// The peer's index is impossible (it ran past ours or backwards): the peer is broken or hostile.
    Corrupt,
}

/// The producer role of a ring; exactly one exists per ring.
#[derive(Debug)]
pub struct Producer<T> {
    idx: NonNull<RingIndices>,
    slots: NonNull<Slot<T>>,
    mask: u32,
    tail: u32,
    head_cache: u32,
}

/// The consumer role of a ring; exactly one exists per ring.
#[derive(Debug)]
pub struct Consumer<T> {
    idx: NonNull<RingIndices>,
    slots: NonNull<Slot<T>>,
    mask: u32,
    head: u32,
    tail_cache: u32,
}

// SAFETY: a role handle is the only user of its side of the ring; moving it to another thread moves that right.
unsafe impl<T: Send> Send for Producer<T> {}
// SAFETY: as for Producer.
unsafe impl<T: Send> Send for Consumer<T> {}

impl<T: Copy> Producer<T> {
    /// Takes the producer role of the ring at `idx` with `entries` slots at `slots`, starting at index `start`.
    ///
    /// # Safety
    /// `idx` and `entries` slots at `slots` stay valid for the handle's lifetime, `entries` is a power of two,
    /// no other producer exists for this ring, and `start` is the ring's current producer index.
    pub unsafe fn new(
        idx: NonNull<RingIndices>,
        slots: NonNull<Slot<T>>,
        entries: u32,
        start: u32,
    ) -> Self {
        debug_assert!(entries.is_power_of_two());
        Producer {
            idx,
            slots,
            mask: entries - 1,
            tail: start,
            head_cache: start,
        }
    }

    fn indices(&self) -> &RingIndices {
        // SAFETY: valid for the handle's lifetime (constructor contract).
        unsafe { self.idx.as_ref() }
    }

    /// Ring capacity in descriptors.
    pub fn capacity(&self) -> u32 {
        self.mask + 1
    }

    /// Reloads the consumer index and returns how many slots are free.
    pub fn free(&mut self) -> Result<u32, RingError> {
        // SYNC POINT: Acquire pairs with the consumer's Release store in `Consumer::pop` (slot read done).
        let h = self.indices().consumer.value.load(Ordering::Acquire);
        let used = self.tail.wrapping_sub(h);
        // The consumer may only move forward, and never past what we produced.
        if h.wrapping_sub(self.head_cache) > self.tail.wrapping_sub(self.head_cache) {
            return Err(RingError::Corrupt);
        }
        self.head_cache = h;
        Ok(self.capacity() - used)
    }

    /// Appends `v`, or reports `Full`/`Corrupt` without writing anything.
    pub fn push(&mut self, v: T) -> Result<(), RingError> {
        if self.tail.wrapping_sub(self.head_cache) >= self.capacity() && self.free()? == 0 {
            return Err(RingError::Full);
        }
        let i = (self.tail & self.mask) as usize;
        // SAFETY: i ≤ mask < entries, so the slot is in bounds; the consumer released it (head moved past
        // tail − capacity, observed with Acquire above), so we own it.
        unsafe {
            self.slots
                .as_ptr()
                .add(i)
                .as_ref()
                .unwrap_unchecked()
                .write(v)
        };
        self.tail = self.tail.wrapping_add(1);
        // SYNC POINT: Release pairs with the consumer's Acquire load in `Consumer::pop` (slot write visible).
        self.indices()
            .producer
            .value
            .store(self.tail, Ordering::Release);
        Ok(())
    }

    /// Our producer index (what we have published).
    pub fn tail(&self) -> u32 {
        self.tail
    }
}

impl<T: Copy> Consumer<T> {
    /// Takes the consumer role of the ring at `idx` with `entries` slots at `slots`, starting at index `start`.
    ///
    /// # Safety
    /// As for [`Producer::new`], with "consumer" for "producer".
    pub unsafe fn new(
        idx: NonNull<RingIndices>,
        slots: NonNull<Slot<T>>,
        entries: u32,
        start: u32,
    ) -> Self {
        debug_assert!(entries.is_power_of_two());
        Consumer {
            idx,
            slots,
            mask: entries - 1,
            head: start,
            tail_cache: start,
        }
    }

    fn indices(&self) -> &RingIndices {
        // SAFETY: valid for the handle's lifetime (constructor contract).
        unsafe { self.idx.as_ref() }
    }

    /// Reloads the producer index and returns how many descriptors are ready.
    pub fn ready(&mut self) -> Result<u32, RingError> {
        // SYNC POINT: Acquire pairs with the producer's Release store in `Producer::push` (slot write visible).
        let t = self.indices().producer.value.load(Ordering::Acquire);
        let n = t.wrapping_sub(self.head);
        if n > self.mask + 1 {
            return Err(RingError::Corrupt);
        }
        self.tail_cache = t;
        Ok(n)
    }

    /// Removes the oldest descriptor, copying it out once; `Ok(None)` when the ring is empty.
    pub fn pop(&mut self) -> Result<Option<T>, RingError> {
        if self.tail_cache == self.head && self.ready()? == 0 {
            return Ok(None);
        }
        let i = (self.head & self.mask) as usize;
        // SAFETY: i ≤ mask < entries, in bounds; the producer published this slot (tail observed with Acquire
        // and head < tail), so it will not write it until we release it below. T is plain data (any bits valid).
        let v = unsafe {
            self.slots
                .as_ptr()
                .add(i)
                .as_ref()
                .unwrap_unchecked()
                .read()
        };
        self.head = self.head.wrapping_add(1);
        // SYNC POINT: Release pairs with the producer's Acquire load in `Producer::free` (slot read done).
        self.indices()
            .consumer
            .value
            .store(self.head, Ordering::Release);
        Ok(Some(v))
    }

    /// Our consumer index (what we have released).
    pub fn head(&self) -> u32 {
        self.head
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    struct HeapRing {
        idx: RingIndices,
        slots: Vec<Slot<u64>>,
    }

    fn ring(entries: u32) -> (Arc<HeapRing>, Producer<u64>, Consumer<u64>) {
        let r = Arc::new(HeapRing {
            idx: RingIndices::new(),
            slots: (0..entries).map(|_| Slot::new(0)).collect(),
        });
        let idx = NonNull::from(&r.idx);
        let slots = NonNull::new(r.slots.as_ptr() as *mut Slot<u64>).unwrap();
        // SAFETY: the Arc outlives the handles in each test; one producer and one consumer.
        let p = unsafe { Producer::new(idx, slots, entries, 0) };
        // SAFETY: as above.
        let c = unsafe { Consumer::new(idx, slots, entries, 0) };
        (r, p, c)
    }

    #[test]
    fn fifo_full_and_wraparound() {
        let (_r, mut p, mut c) = ring(4);
        for round in 0..10u64 {
            for k in 0..4 {
                p.push(round * 10 + k).unwrap();
            }
            assert_eq!(p.push(99), Err(RingError::Full));
            for k in 0..4 {
                assert_eq!(c.pop().unwrap(), Some(round * 10 + k));
            }
            assert_eq!(c.pop().unwrap(), None);
        }
    }

    #[test]
    fn indices_wrap_at_u32_max() {
        let (r, _, _) = ring(4);
        r.idx.producer.value.store(u32::MAX - 1, Ordering::Relaxed);
        r.idx.consumer.value.store(u32::MAX - 1, Ordering::Relaxed);
        let idx = NonNull::from(&r.idx);
        let slots = NonNull::new(r.slots.as_ptr() as *mut Slot<u64>).unwrap();
        // SAFETY: r outlives the handles; one role each.
        let mut p = unsafe { Producer::new(idx, slots, 4, u32::MAX - 1) };
        // SAFETY: as above.
        let mut c = unsafe { Consumer::new(idx, slots, 4, u32::MAX - 1) };
        for k in 0..4 {
            p.push(k).unwrap();
        }
        assert_eq!(p.push(9), Err(RingError::Full));
        for k in 0..4 {
            assert_eq!(c.pop().unwrap(), Some(k));
        }
        assert_eq!(c.head(), 2);
    }

    #[test]
    fn hostile_producer_index_is_corrupt_not_a_read() {
        let (r, _p, mut c) = ring(4);
        r.idx.producer.value.store(5, Ordering::Release);
        assert_eq!(c.pop(), Err(RingError::Corrupt));
        r.idx.producer.value.store(u32::MAX, Ordering::Release);
        assert_eq!(c.pop(), Err(RingError::Corrupt));
    }

    #[test]
    fn hostile_consumer_index_is_corrupt_not_an_overwrite() {
        let (r, mut p, _c) = ring(4);
        for k in 0..4 {
            p.push(k).unwrap();
        }
        // Consumer claims to have read more than was produced.
        r.idx.consumer.value.store(7, Ordering::Release);
        assert_eq!(p.push(1), Err(RingError::Corrupt));
        // Consumer moves backwards.
        r.idx.consumer.value.store(u32::MAX, Ordering::Release);
        assert_eq!(p.push(1), Err(RingError::Corrupt));
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    struct HeapRing {
        idx: RingIndices,
        slots: Vec<Slot<[u64; 2]>>,
    }

    fn ring(entries: u32) -> (Arc<HeapRing>, Producer<[u64; 2]>, Consumer<[u64; 2]>) {
        let r = Arc::new(HeapRing {
            idx: RingIndices::new(),
            slots: (0..entries).map(|_| Slot::new([0, 0])).collect(),
        });
        let idx = NonNull::from(&r.idx);
        let slots = NonNull::new(r.slots.as_ptr() as *mut Slot<[u64; 2]>).unwrap();
        // SAFETY: each model keeps the Arc alive in both threads; one producer and one consumer.
        let p = unsafe { Producer::new(idx, slots, entries, 0) };
        // SAFETY: as above.
        let c = unsafe { Consumer::new(idx, slots, entries, 0) };
        (r, p, c)
    }

    /// Every interleaving: items arrive once, in order, whole (loom flags any unsynchronised slot access).
    #[test]
    fn loom_spsc_fifo_no_torn_slots() {
        loom::model(|| {
            let (r, mut p, mut c) = ring(2);
            let r2 = r.clone();
            let t = loom::thread::spawn(move || {
                let _keep = r2;
                let mut k = 0u64;
                while k < 3 {
                    match p.push([k, !k]) {
                        Ok(()) => k += 1,
                        Err(RingError::Full) => loom::thread::yield_now(),
                        Err(RingError::Corrupt) => panic!("corrupt"),
                    }
                }
            });
            let mut want = 0u64;
            while want < 3 {
                match c.pop().unwrap() {
                    Some(v) => {
                        assert_eq!(v, [want, !want]);
                        want += 1;
                    }
                    None => loom::thread::yield_now(),
                }
            }
            t.join().unwrap();
            drop(r);
        });
    }

    /// Request/response over two rings (the SQ/CQ pair): the reply always matches the request.
    #[test]
    fn loom_sq_cq_round_trip() {
        loom::model(|| {
            let (sq, mut sq_p, mut sq_c) = ring(2);
            let (cq, mut cq_p, mut cq_c) = ring(2);
            let (sq2, cq2) = (sq.clone(), cq.clone());
            let daemon = loom::thread::spawn(move || {
                let _keep = (sq2, cq2);
                let mut served = 0;
                while served < 2 {
                    match sq_c.pop().unwrap() {
                        Some([a, b]) => {
                            while cq_p.push([a + 100, b]).is_err() {
                                loom::thread::yield_now();
                            }
                            served += 1;
                        }
                        None => loom::thread::yield_now(),
                    }
                }
            });
            for k in 0..2u64 {
                sq_p.push([k, k * 7]).unwrap();
            }
            let mut got = 0u64;
            while got < 2 {
                match cq_c.pop().unwrap() {
                    Some(v) => {
                        assert_eq!(v, [got + 100, got * 7]);
                        got += 1;
                    }
                    None => loom::thread::yield_now(),
                }
            }
            daemon.join().unwrap();
            drop((sq, cq));
        });
    }

    /// The sleep/wake handshake (`app_waiting` + SeqCst fences, ABI.md §5): a completion pushed while the
    /// app decides to sleep is either seen by the app's re-check or answered by a wake-up, never lost.
    #[test]
    fn loom_wakeup_flag_is_never_missed() {
        use crate::sync::{fence, AtomicU32};
        loom::model(|| {
            let (cq, mut cq_p, mut cq_c) = ring(2);
            let waiting = Arc::new(AtomicU32::new(0));
            let (w2, cq2) = (waiting.clone(), cq.clone());
            let daemon = loom::thread::spawn(move || {
                let _keep = cq2;
                cq_p.push([1, 1]).unwrap();
                fence(Ordering::SeqCst);
                w2.load(Ordering::Relaxed) != 0 // true: the daemon sends a wake-up
            });
            waiting.store(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            let seen = cq_c.pop().unwrap().is_some();
            let woken = daemon.join().unwrap();
            assert!(
                seen || woken,
                "completion pushed but the app sleeps without a wake-up"
            );
            drop(cq);
        });
    }
}
