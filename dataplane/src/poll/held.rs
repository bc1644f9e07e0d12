//! Incoming calls waiting for a receive buffer of the app that serves them: one first-in,
//! first-out line per serving app.
//!
//! A busy server keeps every buffer it posted in use, so most of its incoming calls wait here.
//! With one line for every app, each buffer the server posted sent the poll thread through the
//! whole line to place one call (most of a thread's instructions per call with 32 calls in
//! flight and a server with a few buffers). With a line per app, a posted buffer costs a look at
//! the head of each line and the calls it places.
//!
//! The lines share one arena of nodes sized once ([`HeldLines::new`]), so holding a call never
//! allocates; only the first line of an app new to the thread may grow the (short) list of lines.

/// No node.
const NIL: u32 = u32::MAX;

#[derive(Debug)]
struct Node<T> {
    item: Option<T>,
    next: u32,
}

#[derive(Debug, Clone, Copy)]
struct Line<K> {
    key: K,
    head: u32,
    tail: u32,
    len: u32,
}

/// First-in, first-out lines of `T`, one per key, holding `capacity` items in all.
#[derive(Debug)]
pub(crate) struct HeldLines<K, T> {
    nodes: Vec<Node<T>>,
    /// Unused nodes.
    free: Vec<u32>,
    /// The lines holding at least one item (a line that empties is removed).
    lines: Vec<Line<K>>,
}

impl<K: Copy + Eq, T> HeldLines<K, T> {
    /// Room for `capacity` items in all (at most `u32::MAX - 1`).
    pub(crate) fn new(capacity: usize) -> HeldLines<K, T> {
        let capacity = capacity.min(NIL as usize - 1);
        HeldLines {
            nodes: (0..capacity)
                .map(|_| Node {
                    item: None,
                    next: NIL,
                })
                .collect(),
            free: (0..capacity as u32).rev().collect(),
            lines: Vec::new(),
        }
    }

    /// Items held in all lines.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    /// Items in the line of `key`.
    pub(crate) fn line_len(&self, key: K) -> usize {
        self.lines
            .iter()
            .find(|l| l.key == key)
            .map_or(0, |l| l.len as usize)
    }

    /// Lines holding items.
    #[cfg(test)]
    pub(crate) fn lines(&self) -> usize {
        self.lines.len()
    }

    /// The key of line `k` (`k < lines()`), and its first item.
    pub(crate) fn head(&self, k: usize) -> Option<(K, &T)> {
        let l = self.lines.get(k)?;
        let item = self.nodes.get(l.head as usize)?.item.as_ref()?;
        Some((l.key, item))
    }

    /// Puts `item` at the back of the line of `key`; gives it back if every node is in use.
    pub(crate) fn push(&mut self, key: K, item: T) -> Result<(), T> {
        let Some(n) = self.free.pop() else {
            return Err(item);
        };
        if let Some(node) = self.nodes.get_mut(n as usize) {
            node.item = Some(item);
            node.next = NIL;
        }
        match self.lines.iter_mut().find(|l| l.key == key) {
            Some(l) => {
                if let Some(t) = self.nodes.get_mut(l.tail as usize) {
                    t.next = n;
                }
                l.tail = n;
                l.len += 1;
            }
            None => self.lines.push(Line {
                key,
                head: n,
                tail: n,
                len: 1,
            }),
        }
        Ok(())
    }

    /// Takes the first item of line `k`; the line goes when it empties (the lines after it
    /// move: the last one takes its place).
    pub(crate) fn pop(&mut self, k: usize) -> Option<T> {
        let l = self.lines.get_mut(k)?;
        let n = l.head;
        let node = self.nodes.get_mut(n as usize)?;
        let item = node.item.take();
        l.head = node.next;
        l.len -= 1;
        if l.len == 0 {
            self.lines.swap_remove(k);
        }
        self.free.push(n);
        item
    }

    /// Removes every item for which `gone` is true, keeping the order of the rest.
    pub(crate) fn remove_where(&mut self, mut gone: impl FnMut(&T) -> bool) {
        let mut k = 0;
        while let Some(l) = self.lines.get_mut(k) {
            let (mut prev, mut n) = (NIL, l.head);
            while n != NIL {
                let Some(node) = self.nodes.get_mut(n as usize) else {
                    break;
                };
                let next = node.next;
                if node.item.as_ref().is_some_and(&mut gone) {
                    node.item = None;
                    self.free.push(n);
                    l.len -= 1;
                    if prev == NIL {
                        l.head = next;
                    } else if let Some(p) = self.nodes.get_mut(prev as usize) {
                        p.next = next;
                    }
                    if l.tail == n {
                        l.tail = prev;
                    }
                } else {
                    prev = n;
                }
                n = next;
            }
            if l.len == 0 {
                self.lines.swap_remove(k);
            } else {
                k += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(h: &mut HeldLines<u8, u32>, key: u8) -> Vec<u32> {
        let mut out = Vec::new();
        while let Some(k) = (0..h.lines()).find(|&k| h.head(k).is_some_and(|(x, _)| x == key)) {
            out.extend(h.pop(k));
        }
        out
    }

    /// Each key keeps its own order, whatever the interleaving of pushes.
    #[test]
    fn each_line_is_first_in_first_out() {
        let mut h = HeldLines::new(16);
        for (key, v) in [(1, 10), (2, 20), (1, 11), (3, 30), (2, 21), (1, 12)] {
            assert!(h.push(key, v).is_ok());
        }
        assert_eq!((h.len(), h.lines()), (6, 3));
        assert_eq!((h.line_len(1), h.line_len(2), h.line_len(9)), (3, 2, 0));
        assert_eq!(drain(&mut h, 2), [20, 21]);
        assert_eq!(h.lines(), 2, "an emptied line goes");
        assert_eq!(drain(&mut h, 1), [10, 11, 12]);
        assert_eq!(drain(&mut h, 3), [30]);
        assert_eq!((h.len(), h.lines()), (0, 0));
    }

    /// The arena bounds the lines together; a node freed by one line serves another.
    #[test]
    fn capacity_is_shared_by_all_lines_and_refused_items_come_back() {
        let mut h = HeldLines::new(3);
        assert!(h.push(1, 1).is_ok());
        assert!(h.push(2, 2).is_ok());
        assert!(h.push(1, 3).is_ok());
        assert_eq!(h.push(3, 4), Err(4));
        assert_eq!(h.line_len(3), 0);
        assert_eq!(drain(&mut h, 2), [2]);
        assert!(h.push(3, 4).is_ok());
        assert_eq!(drain(&mut h, 1), [1, 3]);
        assert_eq!(drain(&mut h, 3), [4]);
    }

    /// Removal by predicate unlinks heads, middles and tails, and pushing after it still
    /// appends at the right end.
    #[test]
    fn remove_where_keeps_the_order_of_the_rest() {
        let mut h = HeldLines::new(16);
        for v in 0..6 {
            assert!(h.push(1, v).is_ok());
        }
        assert!(h.push(2, 100).is_ok());
        h.remove_where(|&v| v == 0 || v == 3 || v == 5 || v == 100);
        assert_eq!((h.len(), h.lines()), (3, 1));
        assert!(h.push(1, 6).is_ok());
        assert_eq!(drain(&mut h, 1), [1, 2, 4, 6]);
        h.remove_where(|_| true);
        assert_eq!(h.len(), 0);
    }
}
