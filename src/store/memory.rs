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
//!   and a `seq` put back from a ticket (I5) may land anywhere; the same
//!   entries are threaded on a list by last poll, so a poll is O(1) and
//!   abandonment pops from the old end; plus a map visitor -> entry.
//!
//! Choices the `Store` contract leaves open (the Redis backend should make
//! the same ones; the conformance suite pins those it can observe):
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

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use async_trait::async_trait;
use rand::Rng;

use super::{
    next_seq, QueuePlace, QueueingMethod, RejectReason, RoomOverrides, RoomPolicy, RoomState,
    RoomStats, RoomTotals, Store, StoreError, Verdict, VisitorId, RATE_WINDOW_MS,
};
use crate::clock::Millis;

/// Above this many slots, a table that empties is given back to the
/// allocator (below it, keeping it saves reallocating for the next visitor).
const SPIKE: usize = 4096;

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
        ticket_expires_ms: Millis,
        now_ms: Millis,
    ) -> Result<Option<Millis>, StoreError> {
        Ok(self.with_room(room, |r| {
            r.check_in(room, visitor, ticket_expires_ms, now_ms)
        }))
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
        self.with_room(room, |r| {
            // Sessions ended by the reset must not come back at check-in.
            let mut ended = std::mem::take(&mut r.ended);
            for (visitor, expires) in r.sessions.expiry.drain() {
                ended.set(visitor, expires);
            }
            *r = Room::new();
            r.ended = ended;
        });
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
    /// Sessions released, revoked or reset, kept until they would have
    /// expired so that a check-in with their ticket is refused (and not
    /// mistaken for a session the store lost).
    ended: Sessions,
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
            ended: Sessions::default(),
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
        self.ended.expire(now);
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
                    self.queue.entries.select(k)
                }
                _ => self.queue.entries.select(0),
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
        // passthrough and reject keep no queue of their own, but in `paused`
        // and `queue_all` newcomers wait in line like everyone else.
        let open = p.state == RoomState::Open;
        match p.method {
            QueueingMethod::Passthrough if open => self.admit(visitor, fresh_session, now),
            QueueingMethod::Reject if open => {
                if self.has_room(p) {
                    self.admit(visitor, fresh_session, now)
                } else {
                    self.totals.rejected += 1;
                    Verdict::Rejected(RejectReason::OverLimit)
                }
            }
            _ => {
                // Promotion has just run, so a non-empty queue means there is
                // no room; the explicit check keeps newcomers behind it even
                // in states that do not promote.
                if open && self.queue.len() == 0 && self.has_room(p) {
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
        // No limits to wait for, unless the room is paused.
        if p.method == QueueingMethod::Passthrough && p.state != RoomState::Paused {
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

    fn check_in(
        &mut self,
        p: &RoomPolicy,
        visitor: VisitorId,
        ticket_expires: Millis,
        now: Millis,
    ) -> Option<Millis> {
        self.housekeeping(p, now);
        let expires = match self.sessions.get(&visitor) {
            Some(expires) => expires,
            None if self.ended.get(&visitor).is_some() || ticket_expires <= now => return None,
            // The store lost a live session (restart without persistence):
            // the ticket proves the admission, so count it again.
            None => ticket_expires,
        };
        let renewed = if p.session_renewal {
            expires.max(now + p.session_duration_ms)
        } else {
            expires
        };
        self.sessions.set(visitor, renewed);
        Some(renewed)
    }

    fn release(&mut self, p: &RoomPolicy, visitor: VisitorId, now: Millis) -> bool {
        self.housekeeping(p, now);
        if let Some(expires) = self.sessions.get(&visitor) {
            self.sessions.remove(&visitor);
            self.ended.set(visitor, expires);
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
        if self.expiry.is_empty() && self.expiry.capacity() > SPIKE {
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

/// The waiting visitors: their entries plus a lookup by visitor.
struct Queue {
    entries: Entries,
    by_visitor: HashMap<VisitorId, Idx>,
}

impl Queue {
    fn new() -> Self {
        Self {
            entries: Entries::new(rand::random()),
            by_visitor: HashMap::new(),
        }
    }

    fn len(&self) -> u64 {
        self.entries.len() as u64
    }

    fn find(&self, visitor: &VisitorId) -> Option<Idx> {
        self.by_visitor.get(visitor).copied()
    }

    fn place(&self, node: Idx) -> QueuePlace {
        QueuePlace {
            seq: self.entries.key(node).seq,
            position: self.entries.rank(node) as u64 + 1,
            queue_length: self.len(),
        }
    }

    fn insert(&mut self, seq: u64, visitor: VisitorId, now: Millis) -> Idx {
        let node = self.entries.insert(Key { seq, visitor }, now);
        self.by_visitor.insert(visitor, node);
        node
    }

    /// Removes an entry; returns its visitor.
    fn remove(&mut self, node: Idx) -> VisitorId {
        let visitor = self.entries.key(node).visitor;
        self.by_visitor.remove(&visitor);
        self.entries.remove(node);
        if self.by_visitor.is_empty() && self.by_visitor.capacity() > SPIKE {
            self.by_visitor.shrink_to_fit();
        }
        visitor
    }

    fn touch(&mut self, node: Idx, now: Millis) {
        self.entries.touch(node, now);
    }

    /// Removes entries last polled before `cutoff`; returns how many.
    fn drop_polled_before(&mut self, cutoff: Millis) -> u64 {
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
type Idx = u32;
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
struct Entries {
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
    fn select(&self, mut k: u64) -> Idx {
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
