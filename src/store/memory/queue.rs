//! The queue of one room in the memory store: an order-statistics treap by
//! `seq` threaded on a list by last poll, so positions are O(log n) in a
//! queue of a million and a poll is O(1).

use std::cmp::Ordering;

use super::{VisitorMap, SPIKE};
use crate::clock::Millis;
use crate::store::{QueuePlace, VisitorId};

/// The waiting visitors: their entries plus a lookup by visitor.
pub(super) struct Queue {
    pub(super) entries: Entries,
    by_visitor: VisitorMap<Idx>,
}

impl Queue {
    pub(super) fn new() -> Self {
        Self {
            entries: Entries::new(rand::random()),
            by_visitor: VisitorMap::default(),
        }
    }

    pub(super) fn len(&self) -> u64 {
        self.entries.len() as u64
    }

    /// Who waits here, in no order.
    pub(super) fn visitors(&self) -> impl Iterator<Item = VisitorId> + '_ {
        self.by_visitor.keys().copied()
    }

    pub(super) fn find(&self, visitor: &VisitorId) -> Option<Idx> {
        self.by_visitor.get(visitor).copied()
    }

    pub(super) fn place(&self, node: Idx) -> QueuePlace {
        QueuePlace {
            seq: self.entries.key(node).seq,
            position: self.entries.rank(node) as u64 + 1,
            queue_length: self.len(),
        }
    }

    pub(super) fn insert(&mut self, seq: u64, visitor: VisitorId, now: Millis) -> Idx {
        let node = self.entries.insert(Key { seq, visitor }, now);
        self.by_visitor.insert(visitor, node);
        node
    }

    /// Removes an entry; returns its visitor.
    pub(super) fn remove(&mut self, node: Idx) -> VisitorId {
        let visitor = self.entries.key(node).visitor;
        self.by_visitor.remove(&visitor);
        self.entries.remove(node);
        if self.by_visitor.is_empty() && self.by_visitor.capacity() > SPIKE {
            self.by_visitor.shrink_to_fit();
        }
        visitor
    }

    pub(super) fn touch(&mut self, node: Idx, now: Millis) {
        self.entries.touch(node, now);
    }

    /// Gives the entries with a `seq` in `lo..hi` the `seq`s just below `lo`
    /// (but above `floor`, the reset floor: see [`crate::store::shuffled_first`]), in the
    /// order [`crate::store::shuffle`] draws from `seed`; returns how many
    /// moved. Their abandonment clock starts again at `now`.
    pub(super) fn shuffle_range(
        &mut self,
        lo: u64,
        hi: u64,
        floor: u64,
        seed: u64,
        now: Millis,
    ) -> u64 {
        let mut moved: Vec<VisitorId> = (0..self.len())
            .map(|k| self.entries.key(self.entries.select(k)))
            .filter(|key| (lo..hi).contains(&key.seq))
            .map(|key| key.visitor)
            .collect();
        for visitor in &moved {
            if let Some(node) = self.find(visitor) {
                self.remove(node);
            }
        }
        crate::store::shuffle(moved.as_mut_slice(), seed);
        let first = crate::store::shuffled_first(lo, moved.len() as u64, floor);
        for (i, visitor) in moved.iter().enumerate() {
            self.insert(first + i as u64, *visitor, now);
        }
        moved.len() as u64
    }

    /// What is violated of: one entry per visitor, found by visitor, in
    /// (seq, visitor) order by rank; the highest seq (for `last_seq`).
    pub(super) fn violations(&self, out: &mut Vec<String>) -> Option<u64> {
        if self.by_visitor.len() != self.entries.len() {
            out.push(format!(
                "queue: {} entries, {} by visitor",
                self.entries.len(),
                self.by_visitor.len()
            ));
        }
        let mut last: Option<Key> = None;
        for k in 0..self.len() {
            let node = self.entries.select(k);
            let key = self.entries.key(node);
            if last.is_some_and(|l| l >= key) {
                out.push(format!("queue: rank {k} is out of order"));
            }
            if self.find(&key.visitor) != Some(node) {
                out.push(format!("queue: {} is not found at its entry", key.visitor));
            }
            last = Some(key);
        }
        last.map(|k| k.seq)
    }

    /// Removes entries last polled before `cutoff`; returns how many.
    pub(super) fn drop_polled_before(&mut self, cutoff: Millis) -> u64 {
        let mut dropped = 0;
        while let Some(node) = self.entries.least_recently_polled() {
            if self.entries.last_poll(node) >= cutoff {
                break;
            }
            self.remove(node);
            dropped += 1;
        }
        dropped
    }
}

/// Index of an entry in the queue's arena.
pub(super) type Idx = u32;
const NIL: Idx = Idx::MAX;

/// Queue order: by `seq`, ties (impossible from `next_seq`, possible only
/// across a store loss) broken by visitor so every entry has its own key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    seq: u64,
    visitor: VisitorId,
}

/// What a search touches. Kept apart from `Cold` so that a million of them
/// (24 MB) fit a server's last-level cache: a position in a queue of 1M
/// then costs cache hits, not a DRAM miss per level.
#[derive(Clone, Copy)]
struct Node {
    seq: u64,
    left: Idx,
    right: Idx,
    /// Nodes in this subtree, itself included: what makes rank and select
    /// O(depth).
    size: u32,
    /// Nodes in the left subtree, so that a search turning right need not
    /// read the left child (one cache miss fewer per level).
    left_size: u32,
}

/// What only the entry's owner reads (and a search on a `seq` tie).
#[derive(Clone, Copy)]
struct Cold {
    visitor: VisitorId,
    last_poll: Millis,
    /// Neighbours in the list by last poll.
    older: Idx,
    newer: Idx,
}

/// The queue entries, in one arena threaded two ways: an order-statistics
/// treap by key (insert, remove, rank, select in O(log n) expected) and a
/// doubly linked list by last poll, oldest first. A poll moves its entry to
/// the newest end, so polls cost O(1) and abandonment pops from the oldest
/// end, with no separate index to keep in step.
pub(super) struct Entries {
    nodes: Vec<Node>,
    /// Parallel to `nodes`.
    cold: Vec<Cold>,
    free: Vec<Idx>,
    root: Idx,
    oldest: Idx,
    newest: Idx,
    /// Seeds the heap priorities; they need to be spread, not secret.
    seed: u64,
}

impl Entries {
    fn new(seed: u64) -> Self {
        Self {
            nodes: Vec::new(),
            cold: Vec::new(),
            free: Vec::new(),
            root: NIL,
            oldest: NIL,
            newest: NIL,
            seed,
        }
    }

    fn least_recently_polled(&self) -> Option<Idx> {
        (self.oldest != NIL).then_some(self.oldest)
    }

    /// Records a poll at `now`. Polls never move back in time: a caller
    /// with an older clock read must not make a live visitor look abandoned.
    fn touch(&mut self, t: Idx, now: Millis) {
        if now > self.last_poll(t) {
            self.unlink(t);
            self.cold[t as usize].last_poll = now;
            self.push_newest(t);
        }
    }

    /// Puts `t` at the newest end. Its last poll is raised to the newest
    /// one's if a caller's clock read lags another's by a few ms, which keeps
    /// the list in order: abandonment may come those ms late, never early.
    fn push_newest(&mut self, t: Idx) {
        let newest = self.newest;
        if newest != NIL {
            let floor = self.last_poll(newest);
            let c = &mut self.cold[t as usize];
            c.last_poll = c.last_poll.max(floor);
            self.cold[newest as usize].newer = t;
        } else {
            self.oldest = t;
        }
        let c = &mut self.cold[t as usize];
        c.older = newest;
        c.newer = NIL;
        self.newest = t;
    }

    fn unlink(&mut self, t: Idx) {
        let Cold { older, newer, .. } = self.cold[t as usize];
        if older != NIL {
            self.cold[older as usize].newer = newer;
        } else {
            self.oldest = newer;
        }
        if newer != NIL {
            self.cold[newer as usize].older = older;
        } else {
            self.newest = older;
        }
    }

    fn len(&self) -> usize {
        self.size(self.root) as usize
    }

    fn key(&self, t: Idx) -> Key {
        Key {
            seq: self.nodes[t as usize].seq,
            visitor: self.cold[t as usize].visitor,
        }
    }

    /// `key` against node `t`'s key, reading the visitor only on a tie.
    fn cmp_at(&self, key: &Key, t: Idx) -> Ordering {
        key.seq
            .cmp(&self.nodes[t as usize].seq)
            .then_with(|| key.visitor.cmp(&self.cold[t as usize].visitor))
    }

    fn last_poll(&self, t: Idx) -> Millis {
        self.cold[t as usize].last_poll
    }

    fn size(&self, t: Idx) -> u32 {
        if t == NIL {
            0
        } else {
            self.nodes[t as usize].size
        }
    }

    fn left(&self, t: Idx) -> Idx {
        self.nodes[t as usize].left
    }

    fn right(&self, t: Idx) -> Idx {
        self.nodes[t as usize].right
    }

    fn fix_size(&mut self, t: Idx) {
        let left_size = self.size(self.left(t));
        let right_size = self.size(self.right(t));
        let node = &mut self.nodes[t as usize];
        node.left_size = left_size;
        node.size = 1 + left_size + right_size;
    }

    /// A node's heap priority: a hash of its arena slot (splitmix64), which
    /// is independent of its key and so as good as a stored random number,
    /// without the 4 bytes per node.
    fn prio(&self, t: Idx) -> u64 {
        let mut z = self.seed ^ u64::from(t).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn insert(&mut self, key: Key, last_poll: Millis) -> Idx {
        let node = Node {
            seq: key.seq,
            left: NIL,
            right: NIL,
            size: 1,
            left_size: 0,
        };
        let cold = Cold {
            visitor: key.visitor,
            last_poll,
            older: NIL,
            newer: NIL,
        };
        let t = match self.free.pop() {
            Some(t) => {
                self.nodes[t as usize] = node;
                self.cold[t as usize] = cold;
                t
            }
            None => {
                self.nodes.push(node);
                self.cold.push(cold);
                (self.nodes.len() - 1) as Idx
            }
        };
        self.push_newest(t);
        let (l, r) = self.split(self.root, &key);
        let l = self.merge(l, t);
        self.root = self.merge(l, r);
        t
    }

    fn remove(&mut self, t: Idx) {
        let key = self.key(t);
        self.unlink(t);
        self.root = self.remove_below(self.root, &key);
        if self.root == NIL {
            // Every slot is free: start the arena over, and give back what
            // a spike grew.
            self.free.clear();
            self.nodes.clear();
            self.cold.clear();
            if self.nodes.capacity() > SPIKE {
                self.nodes = Vec::new();
                self.cold = Vec::new();
                self.free = Vec::new();
            }
        } else {
            self.free.push(t);
        }
    }

    fn remove_below(&mut self, t: Idx, key: &Key) -> Idx {
        if t == NIL {
            return NIL;
        }
        match self.cmp_at(key, t) {
            Ordering::Equal => self.merge(self.left(t), self.right(t)),
            Ordering::Less => {
                let l = self.remove_below(self.left(t), key);
                self.nodes[t as usize].left = l;
                self.fix_size(t);
                t
            }
            Ordering::Greater => {
                let r = self.remove_below(self.right(t), key);
                self.nodes[t as usize].right = r;
                self.fix_size(t);
                t
            }
        }
    }

    /// Splits `t` into keys `< key` and keys `>= key`.
    fn split(&mut self, t: Idx, key: &Key) -> (Idx, Idx) {
        if t == NIL {
            return (NIL, NIL);
        }
        if self.cmp_at(key, t) == Ordering::Greater {
            let (a, b) = self.split(self.right(t), key);
            self.nodes[t as usize].right = a;
            self.fix_size(t);
            (t, b)
        } else {
            let (a, b) = self.split(self.left(t), key);
            self.nodes[t as usize].left = b;
            self.fix_size(t);
            (a, t)
        }
    }

    /// Joins two treaps where every key of `a` is below every key of `b`.
    fn merge(&mut self, a: Idx, b: Idx) -> Idx {
        if a == NIL {
            return b;
        }
        if b == NIL {
            return a;
        }
        if self.prio(a) > self.prio(b) {
            let m = self.merge(self.right(a), b);
            self.nodes[a as usize].right = m;
            self.fix_size(a);
            a
        } else {
            let m = self.merge(a, self.left(b));
            self.nodes[b as usize].left = m;
            self.fix_size(b);
            b
        }
    }

    /// Number of keys below node `target`'s key.
    fn rank(&self, target: Idx) -> usize {
        let key = self.key(target);
        let mut t = self.root;
        let mut below = 0;
        while t != NIL {
            match self.cmp_at(&key, t) {
                Ordering::Less => t = self.left(t),
                Ordering::Equal => return below + self.nodes[t as usize].left_size as usize,
                Ordering::Greater => {
                    below += self.nodes[t as usize].left_size as usize + 1;
                    t = self.right(t);
                }
            }
        }
        below
    }

    /// The node with `k` keys below it. Callers keep `k < len()`.
    pub(super) fn select(&self, mut k: u64) -> Idx {
        let mut t = self.root;
        while t != NIL {
            let left = u64::from(self.nodes[t as usize].left_size);
            if k < left {
                t = self.left(t);
            } else if k == left {
                return t;
            } else {
                k -= left + 1;
                t = self.right(t);
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn vid(n: u64) -> VisitorId {
        let mut b = [0u8; 16];
        b[8..].copy_from_slice(&n.to_be_bytes());
        VisitorId(b)
    }

    /// Checks sizes, key order and heap order; returns the subtree size.
    fn check(t: &Entries, n: Idx, lo: Option<Key>, hi: Option<Key>) -> u32 {
        if n == NIL {
            return 0;
        }
        let node = t.nodes[n as usize];
        let key = t.key(n);
        assert!(lo.is_none_or(|lo| lo < key));
        assert!(hi.is_none_or(|hi| key < hi));
        for c in [node.left, node.right] {
            if c != NIL {
                assert!(t.prio(c) <= t.prio(n));
            }
        }
        assert_eq!(node.left_size, t.size(node.left));
        let size = 1 + check(t, node.left, lo, Some(key)) + check(t, node.right, Some(key), hi);
        assert_eq!(size, node.size);
        size
    }

    /// The list by last poll links every entry once, both ways, in order.
    fn check_poll_list(t: &Entries, len: usize) {
        let mut seen = 0;
        let mut prev = NIL;
        let mut n = t.oldest;
        while n != NIL {
            let c = t.cold[n as usize];
            assert_eq!(c.older, prev);
            if prev != NIL {
                assert!(t.last_poll(prev) <= c.last_poll);
            }
            prev = n;
            n = c.newer;
            seen += 1;
        }
        assert_eq!(t.newest, prev);
        assert_eq!(seen, len);
    }

    #[test]
    fn treap_matches_a_sorted_vec() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut treap = Entries::new(1);
        let mut model: Vec<(Key, Idx)> = Vec::new();
        for i in 0..20_000u64 {
            if model.is_empty() || rng.gen_bool(0.6) {
                // Sparse keys, often smaller than existing ones (as from I5).
                let key = Key {
                    seq: rng.gen_range(0..1_000_000) * 1024,
                    visitor: vid(i),
                };
                let idx = treap.insert(key, i);
                let at = model.partition_point(|(k, _)| *k < key);
                model.insert(at, (key, idx));
            } else {
                let at = rng.gen_range(0..model.len());
                let (_, idx) = model.remove(at);
                treap.remove(idx);
            }
            if !model.is_empty() && rng.gen_bool(0.3) {
                // Polls at a clock that mostly moves forward.
                let (_, idx) = model[rng.gen_range(0..model.len())];
                treap.touch(idx, i + rng.gen_range(0..3));
            }
            if i % 997 == 0 {
                check(&treap, treap.root, None, None);
                check_poll_list(&treap, model.len());
            }
            assert_eq!(treap.len(), model.len());
            if !model.is_empty() {
                let k = rng.gen_range(0..model.len());
                assert_eq!(treap.select(k as u64), model[k].1);
                assert_eq!(treap.rank(model[k].1), k);
            }
        }
        check(&treap, treap.root, None, None);
        check_poll_list(&treap, model.len());
    }

    #[test]
    fn treap_depth_stays_logarithmic_for_increasing_keys() {
        let mut treap = Entries::new(42);
        for i in 0..100_000u64 {
            treap.insert(
                Key {
                    seq: i,
                    visitor: vid(i),
                },
                0,
            );
        }
        fn depth(t: &Entries, n: Idx) -> usize {
            if n == NIL {
                0
            } else {
                1 + depth(t, t.left(n)).max(depth(t, t.right(n)))
            }
        }
        // log2(100k) ~ 17; a treap's expected depth is ~2.5x that.
        assert!(depth(&treap, treap.root) < 60);
    }

    #[test]
    fn arena_is_released_when_the_queue_empties() {
        let key = |i: u64| Key {
            seq: i,
            visitor: vid(i),
        };
        let mut treap = Entries::new(3);
        let idx: Vec<Idx> = (0..10_000).map(|i| treap.insert(key(i), 0)).collect();
        for i in idx {
            treap.remove(i);
        }
        assert_eq!(treap.len(), 0);
        assert_eq!(treap.nodes.capacity(), 0);
        assert_eq!(treap.cold.capacity(), 0);
        // A small queue that empties keeps its arena for the next visitor.
        let a = treap.insert(key(1), 0);
        let cap = treap.nodes.capacity();
        treap.remove(a);
        assert_eq!((treap.nodes.len(), treap.nodes.capacity()), (0, cap));
        assert_eq!(treap.insert(key(2), 0), 0, "slots restart at 0");
    }

    #[test]
    fn queue_drops_by_last_poll_and_touch_never_goes_back() {
        let mut q = Queue::new();
        let a = q.insert(10, vid(1), 1_000);
        let b = q.insert(20, vid(2), 1_000);
        q.touch(a, 5_000);
        q.touch(a, 4_000);
        assert_eq!(q.drop_polled_before(4_500), 1);
        assert_eq!(q.find(&vid(2)), None);
        assert_eq!(q.place(a).position, 1);
        let _ = b;
    }
}
