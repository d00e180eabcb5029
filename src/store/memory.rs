//! The embedded, single-instance store: every operation one critical section.
//!
//! Each room lives behind its own `std::sync::Mutex`; an operation takes the
//! lock, does housekeeping, promotion and its decision, and lets go. Nothing
//! is awaited while a lock is held, so the async trait methods never block a
//! runtime thread for longer than one decision.
//!
//! Per room the store keeps:
//!
//! * sessions: a map visitor -> expiry, plus the same pairs ordered by expiry
//!   so expiring is amortised O(log n) instead of a scan;
//! * the rate window: admission times, run-length encoded per millisecond so
//!   an unlimited room admitting thousands per second stays small;
//! * the queue: an order-statistics tree (a treap with subtree sizes) keyed by
//!   `(seq, visitor)`, so a position is O(log n) even for a million waiters
//!   and a `seq` put back from a ticket (I5) may land anywhere, plus a map
//!   visitor -> node and an index by last-poll time for abandonment.
//!
//! Choices the `Store` contract leaves open, made the same way in the Redis
//! backend's scripts:
//!
//! * `passthrough` never promotes in bulk: a queued visitor left over from
//!   another method is admitted when it next polls.
//! * `reject` and `passthrough` ignore `paused` / `queue_all` (they have no
//!   queue to hold visitors in); `closed` rejects arrivals for every method.
//! * A renewal never shortens a session: a promoted visitor's grace survives
//!   an early check-in.
//! * `abandon_after_ms == 0` disables abandonment.
//! * Putting an entry back from a ticket does not count as an enqueue in the
//!   totals (the visitor was counted when it first queued).
//! * `totals.rejected` counts arrivals turned away, not polls told `closed`.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use async_trait::async_trait;
use rand::Rng;

use super::{
    next_seq, QueuePlace, QueueingMethod, RejectReason, RoomOverrides, RoomPolicy, RoomState,
    RoomStats, RoomTotals, Store, StoreError, Verdict, VisitorId, RATE_WINDOW_MS,
};
use crate::clock::Millis;

/// The in-process store. Cheap to share behind an `Arc`.
#[derive(Default)]
pub struct MemoryStore {
    /// Rooms are created on first use and never dropped: their number is
    /// bounded by the configuration, and dropping one could lose an operation
    /// that raced with the drop.
    rooms: RwLock<HashMap<Arc<str>, Arc<Mutex<Room>>>>,
    /// Operators' runtime changes, by room id.
    overrides: Mutex<HashMap<String, RoomOverrides>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn room(&self, id: &Arc<str>) -> Arc<Mutex<Room>> {
        // The map's own critical sections cannot leave it half-updated, so a
        // poisoned lock is safe to keep using.
        if let Some(room) = self
            .rooms
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
        {
            return Arc::clone(room);
        }
        let mut rooms = self.rooms.write().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(
            rooms
                .entry(Arc::clone(id))
                .or_insert_with(|| Arc::new(Mutex::new(Room::new()))),
        )
    }

    /// Runs `f` as one critical section on the room's state.
    fn with_room<R>(&self, policy: &RoomPolicy, f: impl FnOnce(&mut Room) -> R) -> R {
        let room = self.room(&policy.room);
        let mut guard = lock_room(&room, &policy.room);
        f(&mut guard)
    }
}

/// Locks a room. A panic inside a critical section may have left the room's
/// indexes disagreeing with each other, so a poisoned room is emptied (queued
/// visitors come back from their tickets, I5) rather than trusted.
fn lock_room<'a>(room: &'a Mutex<Room>, id: &str) -> MutexGuard<'a, Room> {
    match room.lock() {
        Ok(guard) => guard,
        Err(poisoned) => {
            let mut guard = poisoned.into_inner();
            let totals = guard.totals;
            *guard = Room::new();
            guard.totals = totals;
            room.clear_poison();
            tracing::error!(room = id, "room state was poisoned by a panic; emptied it");
            guard
        }
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn arrive(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        now_ms: Millis,
    ) -> Result<Verdict, StoreError> {
        Ok(self.with_room(room, |r| r.arrive(room, visitor, now_ms)))
    }

    async fn poll(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        seq: u64,
        now_ms: Millis,
    ) -> Result<Verdict, StoreError> {
        Ok(self.with_room(room, |r| r.poll(room, visitor, seq, now_ms)))
    }

    async fn check_in(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        now_ms: Millis,
    ) -> Result<Option<Millis>, StoreError> {
        Ok(self.with_room(room, |r| r.check_in(room, visitor, now_ms)))
    }

    async fn release(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        now_ms: Millis,
    ) -> Result<bool, StoreError> {
        Ok(self.with_room(room, |r| r.release(room, visitor, now_ms)))
    }

    async fn stats(&self, room: &RoomPolicy, now_ms: Millis) -> Result<RoomStats, StoreError> {
        Ok(self.with_room(room, |r| r.stats(room, now_ms)))
    }

    async fn totals(&self, room: &RoomPolicy) -> Result<RoomTotals, StoreError> {
        let existing = self
            .rooms
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&room.room)
            .cloned();
        Ok(match existing {
            Some(r) => lock_room(&r, &room.room).totals,
            None => RoomTotals::default(),
        })
    }

    async fn reset(&self, room: &RoomPolicy) -> Result<(), StoreError> {
        self.with_room(room, |r| *r = Room::new());
        Ok(())
    }

    async fn overrides(&self, room: &str) -> Result<Option<RoomOverrides>, StoreError> {
        let all = self
            .overrides
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(all.get(room).cloned())
    }

    async fn set_overrides(
        &self,
        room: &str,
        overrides: Option<&RoomOverrides>,
    ) -> Result<(), StoreError> {
        let mut all = self
            .overrides
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match overrides {
            Some(o) => all.insert(room.to_owned(), o.clone()),
            None => all.remove(room),
        };
        Ok(())
    }
}

/// One room's whole state.
struct Room {
    sessions: Sessions,
    window: RateWindow,
    queue: Queue,
    /// The last `seq` handed out or put back (see `next_seq`).
    last_seq: u64,
    totals: RoomTotals,
}

impl Room {
    fn new() -> Self {
        Self {
            sessions: Sessions::default(),
            window: RateWindow::default(),
            queue: Queue::new(),
            last_seq: 0,
            totals: RoomTotals::default(),
        }
    }

    /// Expiry, rate-window pruning, abandonment, then promotion: what every
    /// operation does before deciding.
    fn housekeeping(&mut self, p: &RoomPolicy, now: Millis) {
        self.sessions.expire(now);
        self.window.prune(now);
        if p.abandon_after_ms > 0 {
            let dropped = self
                .queue
                .drop_polled_before(now.saturating_sub(p.abandon_after_ms));
            self.totals.abandoned += dropped;
        }
        self.promote(p, now);
    }

    fn has_room(&self, p: &RoomPolicy) -> bool {
        (p.total_active_users == 0 || self.sessions.len() < p.total_active_users)
            && (p.new_users_per_minute == 0 || self.window.count() < p.new_users_per_minute)
    }

    fn promote(&mut self, p: &RoomPolicy, now: Millis) {
        if !matches!(p.state, RoomState::Open | RoomState::QueueAll)
            || p.method == QueueingMethod::Passthrough
        {
            return;
        }
        let expires = now + p.session_duration_ms + p.arrival_grace_ms;
        while self.queue.len() > 0 && self.has_room(p) {
            let node = match p.method {
                QueueingMethod::Random => {
                    let k = rand::thread_rng().gen_range(0..self.queue.len());
                    self.queue.order.select(k)
                }
                _ => self.queue.order.select(0),
            };
            let visitor = self.queue.remove(node);
            self.admit(visitor, expires, now);
        }
    }

    fn admit(&mut self, visitor: VisitorId, expires: Millis, now: Millis) -> Verdict {
        self.sessions.set(visitor, expires);
        self.window.record(now);
        self.totals.admitted += 1;
        Verdict::Admitted {
            session_expires_ms: expires,
        }
    }

    fn queued(&self, node: Idx) -> Verdict {
        Verdict::Queued(self.queue.place(node))
    }

    fn arrive(&mut self, p: &RoomPolicy, visitor: VisitorId, now: Millis) -> Verdict {
        self.housekeeping(p, now);
        if let Some(expires) = self.sessions.get(&visitor) {
            return Verdict::Admitted {
                session_expires_ms: expires,
            };
        }
        if p.state == RoomState::Closed {
            self.totals.rejected += 1;
            return Verdict::Rejected(RejectReason::Closed);
        }
        if let Some(node) = self.queue.find(&visitor) {
            return self.queued(node);
        }
        let fresh_session = now + p.session_duration_ms;
        match p.method {
            QueueingMethod::Passthrough => self.admit(visitor, fresh_session, now),
            QueueingMethod::Reject => {
                if self.has_room(p) {
                    self.admit(visitor, fresh_session, now)
                } else {
                    self.totals.rejected += 1;
                    Verdict::Rejected(RejectReason::OverLimit)
                }
            }
            QueueingMethod::Fifo | QueueingMethod::Random => {
                // Promotion has just run, so a non-empty queue means there is
                // no room; the explicit check keeps newcomers behind it even
                // in states that do not promote.
                if p.state == RoomState::Open && self.queue.len() == 0 && self.has_room(p) {
                    return self.admit(visitor, fresh_session, now);
                }
                if p.max_queue_length > 0 && self.queue.len() >= p.max_queue_length {
                    self.totals.rejected += 1;
                    return Verdict::Rejected(RejectReason::QueueFull);
                }
                let seq = next_seq(now, self.last_seq);
                self.last_seq = seq;
                let node = self.queue.insert(seq, visitor, now);
                self.totals.queued += 1;
                self.queued(node)
            }
        }
    }

    fn poll(&mut self, p: &RoomPolicy, visitor: VisitorId, seq: u64, now: Millis) -> Verdict {
        self.housekeeping(p, now);
        if let Some(expires) = self.sessions.get(&visitor) {
            return Verdict::Admitted {
                session_expires_ms: expires,
            };
        }
        let existing = self.queue.find(&visitor);
        if p.state == RoomState::Closed {
            if let Some(node) = existing {
                // Keep the place: an operator who reopens the room should
                // find the queue as it was.
                self.queue.touch(node, now);
            }
            return Verdict::Rejected(RejectReason::Closed);
        }
        if p.method == QueueingMethod::Passthrough {
            if let Some(node) = existing {
                self.queue.remove(node);
            }
            return self.admit(visitor, now + p.session_duration_ms, now);
        }
        if let Some(node) = existing {
            self.queue.touch(node, now);
            return self.queued(node);
        }
        // I5: the store lost this visitor (or dropped it); its ticket says
        // where it stood.
        self.last_seq = self.last_seq.max(seq);
        self.queue.insert(seq, visitor, now);
        self.promote(p, now);
        if let Some(expires) = self.sessions.get(&visitor) {
            return Verdict::Admitted {
                session_expires_ms: expires,
            };
        }
        match self.queue.find(&visitor) {
            Some(node) => self.queued(node),
            // Promotion either admitted the visitor or left it queued, so
            // this arm is not taken; it answers "at the back" rather than
            // panicking on a visitor's request.
            None => Verdict::Queued(QueuePlace {
                seq,
                position: self.queue.len() + 1,
                queue_length: self.queue.len(),
            }),
        }
    }

    fn check_in(&mut self, p: &RoomPolicy, visitor: VisitorId, now: Millis) -> Option<Millis> {
        self.housekeeping(p, now);
        let expires = self.sessions.get(&visitor)?;
        if !p.session_renewal {
            return Some(expires);
        }
        let renewed = expires.max(now + p.session_duration_ms);
        self.sessions.set(visitor, renewed);
        Some(renewed)
    }

    fn release(&mut self, p: &RoomPolicy, visitor: VisitorId, now: Millis) -> bool {
        self.housekeeping(p, now);
        if self.sessions.remove(&visitor) {
            return true;
        }
        match self.queue.find(&visitor) {
            Some(node) => {
                self.queue.remove(node);
                true
            }
            None => false,
        }
    }

    fn stats(&mut self, p: &RoomPolicy, now: Millis) -> RoomStats {
        self.housekeeping(p, now);
        RoomStats {
            active: self.sessions.len(),
            queued: self.queue.len(),
            admitted_last_minute: self.window.count(),
            oldest_admission_ms: self.window.oldest(),
        }
    }
}

/// Live sessions, with an expiry index so expiring them costs O(log n) each.
#[derive(Default)]
struct Sessions {
    expiry: HashMap<VisitorId, Millis>,
    by_expiry: BTreeSet<(Millis, VisitorId)>,
}

impl Sessions {
    fn len(&self) -> u64 {
        self.expiry.len() as u64
    }

    fn expire(&mut self, now: Millis) {
        while let Some(&(at, visitor)) = self.by_expiry.first() {
            if at > now {
                break;
            }
            self.by_expiry.pop_first();
            self.expiry.remove(&visitor);
        }
        if self.expiry.is_empty() {
            // Give back what a spike grew.
            self.expiry.shrink_to_fit();
        }
    }

    fn get(&self, visitor: &VisitorId) -> Option<Millis> {
        self.expiry.get(visitor).copied()
    }

    fn set(&mut self, visitor: VisitorId, expires: Millis) {
        if let Some(old) = self.expiry.insert(visitor, expires) {
            self.by_expiry.remove(&(old, visitor));
        }
        self.by_expiry.insert((expires, visitor));
    }

    fn remove(&mut self, visitor: &VisitorId) -> bool {
        match self.expiry.remove(visitor) {
            Some(old) => {
                self.by_expiry.remove(&(old, *visitor));
                true
            }
            None => false,
        }
    }
}

/// Admission times within the sliding window, one `(ms, count)` run per
/// millisecond, oldest first.
#[derive(Default)]
struct RateWindow {
    runs: VecDeque<(Millis, u64)>,
    /// Sum of the runs' counts.
    total: u64,
}

impl RateWindow {
    /// Forgets admissions outside `(now - 60 s, now]`. Admissions stamped
    /// later than `now` (a caller whose clock read came before another's
    /// lock) stay counted: over-counting can only delay an admission, never
    /// break I2.
    fn prune(&mut self, now: Millis) {
        let cutoff = now.saturating_sub(RATE_WINDOW_MS);
        while let Some(&(at, n)) = self.runs.front() {
            if at > cutoff {
                break;
            }
            self.runs.pop_front();
            self.total -= n;
        }
    }

    fn record(&mut self, now: Millis) {
        self.total += 1;
        let pos = self.runs.partition_point(|&(at, _)| at < now);
        match self.runs.get_mut(pos) {
            Some((at, n)) if *at == now => *n += 1,
            _ => self.runs.insert(pos, (now, 1)),
        }
    }

    fn count(&self) -> u64 {
        self.total
    }

    fn oldest(&self) -> Option<Millis> {
        self.runs.front().map(|&(at, _)| at)
    }
}

/// The waiting visitors: order, lookup by visitor, and age of last poll.
struct Queue {
    order: Treap,
    by_visitor: HashMap<VisitorId, Idx>,
    by_last_poll: BTreeSet<(Millis, Idx)>,
}

impl Queue {
    fn new() -> Self {
        Self {
            order: Treap::new(rand::random()),
            by_visitor: HashMap::new(),
            by_last_poll: BTreeSet::new(),
        }
    }

    fn len(&self) -> u64 {
        self.order.len() as u64
    }

    fn find(&self, visitor: &VisitorId) -> Option<Idx> {
        self.by_visitor.get(visitor).copied()
    }

    fn place(&self, node: Idx) -> QueuePlace {
        QueuePlace {
            seq: self.order.key(node).seq,
            position: self.order.rank(node) as u64 + 1,
            queue_length: self.len(),
        }
    }

    fn insert(&mut self, seq: u64, visitor: VisitorId, now: Millis) -> Idx {
        let node = self.order.insert(Key { seq, visitor }, now);
        self.by_visitor.insert(visitor, node);
        self.by_last_poll.insert((now, node));
        node
    }

    /// Removes an entry; returns its visitor.
    fn remove(&mut self, node: Idx) -> VisitorId {
        let visitor = self.order.key(node).visitor;
        self.by_last_poll
            .remove(&(self.order.last_poll(node), node));
        self.by_visitor.remove(&visitor);
        self.order.remove(node);
        if self.by_visitor.is_empty() {
            self.by_visitor.shrink_to_fit();
        }
        visitor
    }

    fn touch(&mut self, node: Idx, now: Millis) {
        let old = self.order.last_poll(node);
        // Never move a poll back in time: a caller with an older clock read
        // must not make a live visitor look abandoned.
        if now > old {
            self.by_last_poll.remove(&(old, node));
            self.by_last_poll.insert((now, node));
            self.order.set_last_poll(node, now);
        }
    }

    /// Removes entries last polled before `cutoff`; returns how many.
    fn drop_polled_before(&mut self, cutoff: Millis) -> u64 {
        let mut dropped = 0;
        while let Some(&(at, node)) = self.by_last_poll.first() {
            if at >= cutoff {
                break;
            }
            self.remove(node);
            dropped += 1;
        }
        dropped
    }
}

/// Index of a node in the treap's arena.
type Idx = u32;
const NIL: Idx = Idx::MAX;

/// Queue order: by `seq`, ties (impossible from `next_seq`, possible only
/// across a store loss) broken by visitor so every entry has its own key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    seq: u64,
    visitor: VisitorId,
}

#[derive(Clone, Copy)]
struct Node {
    key: Key,
    last_poll: Millis,
    left: Idx,
    right: Idx,
    /// Nodes in this subtree, itself included: what makes rank and select
    /// O(depth).
    size: u32,
    /// Heap priority; random, so the expected depth is O(log n).
    prio: u32,
}

/// An order-statistics tree: a treap over an arena of nodes, with subtree
/// sizes. Insert, remove, rank and select are O(log n) expected.
struct Treap {
    nodes: Vec<Node>,
    free: Vec<Idx>,
    root: Idx,
    /// splitmix64 state for priorities; they need to be spread, not secret.
    rng: u64,
}

impl Treap {
    fn new(seed: u64) -> Self {
        Self {
            nodes: Vec::new(),
            free: Vec::new(),
            root: NIL,
            rng: seed,
        }
    }

    fn len(&self) -> usize {
        self.size(self.root) as usize
    }

    fn key(&self, t: Idx) -> Key {
        self.nodes[t as usize].key
    }

    fn last_poll(&self, t: Idx) -> Millis {
        self.nodes[t as usize].last_poll
    }

    fn set_last_poll(&mut self, t: Idx, at: Millis) {
        self.nodes[t as usize].last_poll = at;
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
        let size = 1 + self.size(self.left(t)) + self.size(self.right(t));
        self.nodes[t as usize].size = size;
    }

    fn next_prio(&mut self) -> u32 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) as u32
    }

    fn insert(&mut self, key: Key, last_poll: Millis) -> Idx {
        let node = Node {
            key,
            last_poll,
            left: NIL,
            right: NIL,
            size: 1,
            prio: self.next_prio(),
        };
        let t = match self.free.pop() {
            Some(t) => {
                self.nodes[t as usize] = node;
                t
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as Idx
            }
        };
        let (l, r) = self.split(self.root, &key);
        let l = self.merge(l, t);
        self.root = self.merge(l, r);
        t
    }

    fn remove(&mut self, t: Idx) {
        let key = self.key(t);
        self.root = self.remove_below(self.root, &key);
        if self.root == NIL {
            // Give back what a spike grew.
            self.nodes = Vec::new();
            self.free = Vec::new();
        } else {
            self.free.push(t);
        }
    }

    fn remove_below(&mut self, t: Idx, key: &Key) -> Idx {
        if t == NIL {
            return NIL;
        }
        match key.cmp(&self.key(t)) {
            std::cmp::Ordering::Equal => self.merge(self.left(t), self.right(t)),
            std::cmp::Ordering::Less => {
                let l = self.remove_below(self.left(t), key);
                self.nodes[t as usize].left = l;
                self.fix_size(t);
                t
            }
            std::cmp::Ordering::Greater => {
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
        if self.key(t) < *key {
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
        if self.nodes[a as usize].prio > self.nodes[b as usize].prio {
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
            match key.cmp(&self.key(t)) {
                std::cmp::Ordering::Less => t = self.left(t),
                std::cmp::Ordering::Equal => return below + self.size(self.left(t)) as usize,
                std::cmp::Ordering::Greater => {
                    below += self.size(self.left(t)) as usize + 1;
                    t = self.right(t);
                }
            }
        }
        below
    }

    /// The node with `k` keys below it. Callers keep `k < len()`.
    fn select(&self, mut k: u64) -> Idx {
        let mut t = self.root;
        while t != NIL {
            let left = self.size(self.left(t)) as u64;
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
    fn check(t: &Treap, n: Idx, lo: Option<Key>, hi: Option<Key>) -> u32 {
        if n == NIL {
            return 0;
        }
        let node = t.nodes[n as usize];
        assert!(lo.is_none_or(|lo| lo < node.key));
        assert!(hi.is_none_or(|hi| node.key < hi));
        for c in [node.left, node.right] {
            if c != NIL {
                assert!(t.nodes[c as usize].prio <= node.prio);
            }
        }
        let size =
            1 + check(t, node.left, lo, Some(node.key)) + check(t, node.right, Some(node.key), hi);
        assert_eq!(size, node.size);
        size
    }

    #[test]
    fn treap_matches_a_sorted_vec() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut treap = Treap::new(1);
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
            if i % 997 == 0 {
                check(&treap, treap.root, None, None);
            }
            assert_eq!(treap.len(), model.len());
            if !model.is_empty() {
                let k = rng.gen_range(0..model.len());
                assert_eq!(treap.select(k as u64), model[k].1);
                assert_eq!(treap.rank(model[k].1), k);
            }
        }
        check(&treap, treap.root, None, None);
    }

    #[test]
    fn treap_depth_stays_logarithmic_for_increasing_keys() {
        let mut treap = Treap::new(42);
        for i in 0..100_000u64 {
            treap.insert(
                Key {
                    seq: i,
                    visitor: vid(i),
                },
                0,
            );
        }
        fn depth(t: &Treap, n: Idx) -> usize {
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
        let mut treap = Treap::new(3);
        let idx: Vec<Idx> = (0..1000)
            .map(|i| {
                treap.insert(
                    Key {
                        seq: i,
                        visitor: vid(i),
                    },
                    0,
                )
            })
            .collect();
        for i in idx {
            treap.remove(i);
        }
        assert_eq!(treap.len(), 0);
        assert_eq!(treap.nodes.capacity(), 0);
    }

    #[test]
    fn rate_window_counts_runs_and_prunes_at_the_edge() {
        let mut w = RateWindow::default();
        w.record(1_000_000);
        w.record(1_000_000);
        w.record(1_000_500);
        // An out-of-order stamp lands in order.
        w.record(1_000_200);
        assert_eq!(w.count(), 4);
        assert_eq!(w.runs.len(), 3);
        w.prune(1_060_000);
        assert_eq!(w.count(), 2);
        assert_eq!(w.oldest(), Some(1_000_200));
        w.prune(1_060_500);
        assert_eq!(w.count(), 0);
        assert_eq!(w.oldest(), None);
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
