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

mod notes;
mod queue;
mod reports;
mod sessions;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use async_trait::async_trait;
use rand::Rng;

use super::{
    lane_index, next_seq, Arrival, End, EventStart, LaneTurns, Maintenance, Noted, QueuePlace,
    QueueingMethod, RejectReason, ReportMinute, Reports, RoomOverrides, RoomPolicy, RoomState,
    RoomStats, RoomTotals, Store, StoreError, Verdict, VisitorId, MAX_LANES,
};
use crate::clock::Millis;
use queue::{Idx, Queue};
use sessions::{RateWindow, Sessions};

/// Hashes a visitor id by its first eight bytes. Ids are 128 random bits
/// the daemon draws itself (a client can only present one inside an
/// authenticated ticket), so they need no keyed hash to spread well or to
/// resist flooding; SipHash cost more than the rest of a lookup.
#[derive(Default, Clone, Copy)]
pub(crate) struct VisitorHasher(u64);

impl std::hash::Hasher for VisitorHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut word = [0u8; 8];
        let n = bytes.len().min(8);
        word[..n].copy_from_slice(&bytes[..n]);
        self.0 ^= u64::from_le_bytes(word);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map keyed by visitor id.
pub(crate) type VisitorMap<V> = HashMap<VisitorId, V, std::hash::BuildHasherDefault<VisitorHasher>>;

/// Above this many slots, a table that empties is given back to the
/// allocator (below it, keeping it saves reallocating for the next visitor).
pub(crate) const SPIKE: usize = 4096;

/// The in-process store. Cheap to share behind an `Arc`.
#[derive(Default)]
pub struct MemoryStore {
    /// Rooms are created on first use and never dropped: their number is
    /// bounded by the configuration, and dropping one could lose an operation
    /// that raced with the drop.
    rooms: RwLock<HashMap<Arc<str>, Arc<Mutex<Room>>>>,
    /// Operators' runtime changes, by room id.
    overrides: Mutex<HashMap<String, RoomOverrides>>,
    /// [`Store::note`]'s sets.
    notes: Mutex<notes::Notes>,
    /// [`Reports`]' minutes.
    reports: Mutex<reports::Book>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Drops a visitor's queue entry without remembering it, as a store
    /// that lost its data would: the conformance suite's way to prove that
    /// tickets put lost entries back (I5). A test hook: not in a release build.
    #[cfg(any(test, feature = "testing"))]
    pub fn lose_queue_entry(&self, room: &RoomPolicy, visitor: VisitorId) -> bool {
        self.with_room(room, |r| match r.find(&visitor) {
            Some((lane, node)) => {
                r.line_mut(lane).remove(node);
                true
            }
            None => false,
        })
    }

    /// Forgets the room's whole state, as a store that lost its data would
    /// (the property tests' loss; overrides are kept apart and stay). A
    /// test hook: not in a release build.
    #[cfg(any(test, feature = "testing"))]
    pub fn forget_room(&self, room: &RoomPolicy) {
        self.with_room(room, |r| *r = Room::new());
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
        lane: u8,
        _kind: Arrival,
        now_ms: Millis,
    ) -> Result<Verdict, StoreError> {
        let lane = lane_index(room, lane)?;
        Ok(self.with_room(room, |r| r.arrive(room, visitor, lane, now_ms)))
    }

    async fn poll(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        lane: u8,
        seq: u64,
        now_ms: Millis,
    ) -> Result<Verdict, StoreError> {
        let lane = lane_index(room, lane)?;
        Ok(self.with_room(room, |r| r.poll(room, visitor, lane, seq, now_ms)))
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

    async fn end(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        end: End,
        now_ms: Millis,
    ) -> Result<bool, StoreError> {
        Ok(self.with_room(room, |r| match end {
            End::Session(ticket_expires_ms) => {
                r.end_session(room, visitor, ticket_expires_ms, now_ms)
            }
            End::Release | End::Arrival(_) => r.release(room, visitor, now_ms),
        }))
    }

    async fn stats(&self, room: &RoomPolicy, now_ms: Millis) -> Result<RoomStats, StoreError> {
        Ok(self.with_room(room, |r| r.stats(room, now_ms)))
    }

    async fn forget(&self, room: &str, set: &str, members: &[u64]) -> Result<u64, StoreError> {
        let mut notes = self.notes.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(notes.forget(room, set, members))
    }

    async fn note(
        &self,
        room: &str,
        set: &str,
        members: &[u64],
        until_ms: Millis,
        now_ms: Millis,
    ) -> Result<Noted, StoreError> {
        let mut notes = self.notes.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(notes.note(room, set, members, until_ms, now_ms))
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

    async fn reset(&self, room: &RoomPolicy, now_ms: Millis) -> Result<(), StoreError> {
        self.with_room(room, |r| {
            // Sessions ended by the reset must not come back at check-in,
            // nor queue places from their tickets.
            let mut ended = std::mem::take(&mut r.ended);
            for (visitor, expires) in r.sessions.expiry.drain() {
                ended.set(visitor, expires);
            }
            let floor = next_seq(now_ms, r.last_seq);
            *r = Room::new();
            r.ended = ended;
            r.last_seq = floor;
            r.reset_floor = floor;
        });
        Ok(())
    }

    async fn start_event(
        &self,
        room: &RoomPolicy,
        event: &EventStart,
        now_ms: Millis,
    ) -> Result<u64, StoreError> {
        Ok(self.with_room(room, |r| {
            if r.started_event.as_deref() == Some(event.key.as_str()) {
                return 0;
            }
            r.started_event = Some(event.key.clone());
            if !event.shuffle {
                return 0;
            }
            let floor = r.reset_floor;
            r.queue.shuffle_range(
                event.prequeue_seq,
                event.start_seq,
                floor,
                event.seed,
                now_ms,
            )
        }))
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

#[async_trait]
impl Reports for MemoryStore {
    async fn report_add(
        &self,
        room: &str,
        minute: u64,
        add: &ReportMinute,
        keep_until_ms: Millis,
        now_ms: Millis,
    ) -> Result<(), StoreError> {
        self.reports
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(room, minute, add, keep_until_ms, now_ms);
        Ok(())
    }

    async fn report_read(
        &self,
        room: &str,
        from: u64,
        to: u64,
        now_ms: Millis,
    ) -> Result<Vec<(u64, ReportMinute)>, StoreError> {
        let to = to.min(from.saturating_add(super::REPORT_MAX_MINUTES - 1));
        Ok(self
            .reports
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .read(room, from, to, now_ms))
    }
}

#[async_trait]
impl Maintenance for MemoryStore {
    async fn check(&self, room: &RoomPolicy, _now_ms: Millis) -> Result<Vec<String>, StoreError> {
        Ok(self.with_room(room, |r| r.violations()))
    }
}

/// One room's whole state.
struct Room {
    sessions: Sessions,
    /// Sessions released, revoked or reset, kept until they would have
    /// expired so that a check-in with their ticket is refused (and not
    /// mistaken for a session the store lost); and released queue places
    /// and places that became sessions, kept for `abandon_after` so that a
    /// poll cannot put them back.
    ended: Sessions,
    window: RateWindow,
    queue: Queue,
    /// The priority lanes (lane 1 first), each a queue of its own.
    lanes: [Queue; MAX_LANES],
    /// Whose turn it is among the lanes.
    turns: LaneTurns,
    /// The last `seq` handed out or put back (see `next_seq`).
    last_seq: u64,
    /// Queue tickets with a `seq` at or below this were issued before the
    /// last reset: they are void.
    reset_floor: u64,
    /// The last event started here (`EventStart::key`): started once.
    started_event: Option<String>,
    totals: RoomTotals,
}

impl Room {
    fn new() -> Self {
        Self {
            sessions: Sessions::default(),
            ended: Sessions::default(),
            window: RateWindow::default(),
            queue: Queue::new(),
            lanes: std::array::from_fn(|_| Queue::new()),
            turns: LaneTurns::default(),
            last_seq: 0,
            reset_floor: 0,
            started_event: None,
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
            let seen = now.saturating_sub(p.abandon_after_ms);
            for lane in 0..=MAX_LANES {
                let dropped = self.line_mut(lane).drop_polled_before(seen);
                self.totals.abandoned += dropped;
            }
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
        if !p.lanes.any() && self.lanes.iter().all(|l| l.len() == 0) {
            // No lanes: the general queue alone, without taking turns.
            while self.queue.len() > 0 && self.has_room(p) {
                self.promote_one(p, 0, expires, now);
            }
            return;
        }
        // A presale window holds the general queue: it is not served.
        let held = p.lanes.general_held(now);
        while self.has_room(p) {
            let (queue, lanes) = (&self.queue, &self.lanes);
            let waiting = |lane: usize| match lane {
                0 => !held && queue.len() > 0,
                _ => lanes[lane - 1].len() > 0,
            };
            match self.turns.take(&p.lanes, waiting) {
                Some(lane) => self.promote_one(p, lane, expires, now),
                None => break,
            }
        }
    }

    /// Admits the next visitor of `lane` (which someone waits in).
    fn promote_one(&mut self, p: &RoomPolicy, lane: usize, expires: Millis, now: Millis) {
        let line = self.line_mut(lane);
        let node = match p.method {
            QueueingMethod::Random if lane == 0 => {
                let k = rand::thread_rng().gen_range(0..line.len());
                line.entries.select(k)
            }
            _ => line.entries.select(0),
        };
        let visitor = line.remove(node);
        self.admit(visitor, expires, now);
        self.used_place(p, visitor, now);
    }

    /// The visitors waiting in `lane` (0: the general queue).
    fn line(&self, lane: usize) -> &Queue {
        match lane {
            0 => &self.queue,
            _ => &self.lanes[lane - 1],
        }
    }

    fn line_mut(&mut self, lane: usize) -> &mut Queue {
        match lane {
            0 => &mut self.queue,
            _ => &mut self.lanes[lane - 1],
        }
    }

    /// Everyone waiting, in every lane.
    fn waiting(&self) -> u64 {
        self.queue.len() + self.lanes.iter().map(Queue::len).sum::<u64>()
    }

    /// The lane a visitor waits in and its entry there.
    fn find(&self, visitor: &VisitorId) -> Option<(usize, Idx)> {
        (0..=MAX_LANES).find_map(|lane| Some((lane, self.line(lane).find(visitor)?)))
    }

    /// A queue place became a session: it is used up. Its ticket (last
    /// issued at or before now, good for `abandon_after`) must not put it
    /// back once the session has ended, by expiry included.
    fn used_place(&mut self, p: &RoomPolicy, visitor: VisitorId, now: Millis) {
        if self
            .ended
            .get(&visitor)
            .is_none_or(|until| until < now + p.abandon_after_ms)
        {
            self.ended.set(visitor, now + p.abandon_after_ms);
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

    fn queued(&self, lane: usize, node: Idx) -> Verdict {
        Verdict::Queued(self.line(lane).place(node))
    }

    fn arrive(&mut self, p: &RoomPolicy, visitor: VisitorId, lane: usize, now: Millis) -> Verdict {
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
        if let Some((lane, node)) = self.find(&visitor) {
            return self.queued(lane, node);
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
                // A presale window keeps general newcomers waiting, and
                // lane newcomers behind the lanes only.
                let held = p.lanes.general_held(now);
                let ahead = match held {
                    true => self.waiting() - self.queue.len(),
                    false => self.waiting(),
                };
                if open && !(held && lane == 0) && ahead == 0 && self.has_room(p) {
                    return self.admit(visitor, fresh_session, now);
                }
                if p.max_queue_length > 0 && self.line(lane).len() >= p.max_queue_length {
                    self.totals.rejected += 1;
                    return Verdict::Rejected(RejectReason::QueueFull);
                }
                let seq = next_seq(now, self.last_seq);
                self.last_seq = seq;
                let node = self.line_mut(lane).insert(seq, visitor, now);
                self.totals.queued += 1;
                self.queued(lane, node)
            }
        }
    }

    fn poll(
        &mut self,
        p: &RoomPolicy,
        visitor: VisitorId,
        lane: usize,
        seq: u64,
        now: Millis,
    ) -> Verdict {
        self.housekeeping(p, now);
        if let Some(expires) = self.sessions.get(&visitor) {
            return Verdict::Admitted {
                session_expires_ms: expires,
            };
        }
        let existing = self.line(lane).find(&visitor);
        if p.state == RoomState::Closed {
            if let Some(node) = existing {
                // Keep the place: an operator who reopens the room should
                // find the queue as it was.
                self.line_mut(lane).touch(node, now);
            }
            return Verdict::Rejected(RejectReason::Closed);
        }
        // No limits to wait for, unless the room is paused; but an ended
        // place stays ended (the visitor is a newcomer, as anywhere else).
        if p.method == QueueingMethod::Passthrough && p.state != RoomState::Paused {
            if existing.is_none() && (seq <= self.reset_floor || self.ended.get(&visitor).is_some())
            {
                return Verdict::Ended;
            }
            if let Some(node) = existing {
                self.line_mut(lane).remove(node);
            }
            self.used_place(p, visitor, now);
            return self.admit(visitor, now + p.session_duration_ms, now);
        }
        if let Some(node) = existing {
            self.line_mut(lane).touch(node, now);
            return self.queued(lane, node);
        }
        if seq <= self.reset_floor || self.ended.get(&visitor).is_some() {
            return Verdict::Ended;
        }
        // I5: the store lost this visitor; its ticket says where it stood.
        self.last_seq = self.last_seq.max(seq);
        self.line_mut(lane).insert(seq, visitor, now);
        self.promote(p, now);
        if let Some(expires) = self.sessions.get(&visitor) {
            return Verdict::Admitted {
                session_expires_ms: expires,
            };
        }
        match self.line(lane).find(&visitor) {
            Some(node) => self.queued(lane, node),
            // Promotion either admitted the visitor or left it queued, so
            // this arm is not taken; it answers "at the back" rather than
            // panicking on a visitor's request.
            None => Verdict::Queued(QueuePlace {
                seq,
                position: self.line(lane).len() + 1,
                queue_length: self.line(lane).len(),
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
            self.end(p, visitor, expires, now);
            return true;
        }
        match self.find(&visitor) {
            Some((lane, node)) => {
                self.line_mut(lane).remove(node);
                self.ended.set(visitor, now + p.abandon_after_ms);
                true
            }
            None => false,
        }
    }

    fn end_session(
        &mut self,
        p: &RoomPolicy,
        visitor: VisitorId,
        ticket_expires: Millis,
        now: Millis,
    ) -> bool {
        if self.release(p, visitor, now) {
            return true;
        }
        // Not here (lost, or renewed by a store that stood in): ended all
        // the same while its ticket lives.
        if ticket_expires > now {
            self.end(p, visitor, ticket_expires, now);
        }
        false
    }

    /// Remembers a session (ending at `expires`) as ended: until it would
    /// have expired, and as long as the queue ticket that led to it could
    /// still poll.
    fn end(&mut self, p: &RoomPolicy, visitor: VisitorId, expires: Millis, now: Millis) {
        self.ended
            .set(visitor, expires.max(now + p.abandon_after_ms));
    }

    /// What is violated of the room's indexes agreeing with each other.
    fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.sessions.violations("sessions", &mut out);
        self.ended.violations("ended", &mut out);
        self.window.violations(&mut out);
        for lane in 0..=MAX_LANES {
            let line = self.line(lane);
            if let Some(top) = line.violations(&mut out) {
                if top > self.last_seq {
                    out.push(format!(
                        "lane {lane}: seq {top} above last_seq {}",
                        self.last_seq
                    ));
                }
            }
            let first = (line.len() > 0).then(|| line.place(line.entries.select(0)).seq);
            if first.is_some_and(|s| s <= self.reset_floor) {
                out.push(format!(
                    "lane {lane}: a seq at or below the reset floor {}",
                    self.reset_floor
                ));
            }
        }
        let mut seen = std::collections::HashSet::new();
        for lane in 0..=MAX_LANES {
            for visitor in self.line(lane).visitors() {
                if !seen.insert(visitor) {
                    out.push(format!("{visitor:?} waits in two lanes"));
                }
            }
        }
        out
    }

    fn stats(&mut self, p: &RoomPolicy, now: Millis) -> RoomStats {
        self.housekeeping(p, now);
        RoomStats {
            active: self.sessions.len(),
            queued: self.waiting(),
            admitted_last_minute: self.window.count(),
            oldest_admission_ms: self.window.oldest(),
            lane_queued: std::array::from_fn(|i| self.lanes[i].len()),
        }
    }
}
