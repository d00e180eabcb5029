//! The reference model of the [`Store`] contract: plain maps and vectors,
//! every operation written the way the contract reads, nothing optimised.
//! It is not used by the daemon; the property tests (`tests/model.rs`) run
//! the same operations against it and a real store and compare, and check
//! the invariants on it. Where the memory store keeps a treap and the Redis
//! store batches and packed tails, this keeps a sorted `Vec`: if the two
//! disagree with it, they are wrong (or the difference is one the tests
//! list as allowed).
//!
//! The rules, as the store module states them (`store/mod.rs`):
//!
//! * Before deciding, every operation expires sessions at or before `now`,
//!   forgets ended marks at or before `now`, drops admissions at or before
//!   `now - 60 s` from the rate window, drops queue entries whose last poll
//!   is older than `abandon_after` (0: never), then promotes while there is
//!   room (open or queue-all rooms, not passthrough): the head in `fifo`,
//!   a random entry in `random`. A promoted visitor's session lasts the
//!   session plus the arrival grace, and its queue place is used up.
//! * Room: fewer than `total_active_users` sessions and fewer than
//!   `new_users_per_minute` admissions in the window (0: no limit).
//! * `seq`s are `max((now - SEQ_EPOCH_MS) * SEQ_PER_MS, last_seq + 1)`; a
//!   reset voids every ticket at or below the floor it sets.
//!
//! Nothing here is shared with the memory store: the seqs, the lanes'
//! turns and the event's shuffle are written again below, plainly, from
//! the contract's words, so that a bug in the memory store's copy shows up
//! as a disagreement with this one.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use rand::Rng;

use super::{
    Arrival, End, EventStart, Lanes, Noted, QueuePlace, QueueingMethod, RejectReason,
    RoomOverrides, RoomPolicy, RoomState, RoomStats, RoomTotals, Store, StoreError, Verdict,
    VisitorId, MAX_LANES, PASS_LIMIT, RATE_WINDOW_MS, SEQ_EPOCH_MS, SEQ_PER_MS, STRIDE,
};

/// The first seq a room may hand out at `now`: one per `1 / SEQ_PER_MS`
/// ms since the epoch, and above the last one handed out.
fn next_seq(now: Millis, last_seq: u64) -> u64 {
    let by_time = now.saturating_sub(SEQ_EPOCH_MS) * SEQ_PER_MS;
    if by_time > last_seq {
        by_time
    } else {
        last_seq + 1
    }
}

/// The event's shuffle as the contract gives it: Fisher-Yates from the
/// last item down, each pick from a Park-Miller (MINSTD) generator seeded
/// with `seed mod (2^31 - 2) + 1`.
fn shuffle(items: &mut [VisitorId], seed: u64) {
    const MODULUS: u64 = 2_147_483_647;
    let mut state = seed % (MODULUS - 1) + 1;
    let mut i = items.len();
    while i > 1 {
        i -= 1;
        state = state * 48_271 % MODULUS;
        let j = (state % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

/// Whose turn it is among the lanes (0: the general queue): stride
/// scheduling, as the contract states it. Each lane has a pass; of the
/// lanes with a share that have someone waiting, the one with the lowest
/// pass (counted from at least the last pass served; ties: the lower
/// lane) is served and its pass moves on by `STRIDE / share`. Lanes with a
/// share of 0 are served only when no other waits, in order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Turns {
    /// The pass of the lane served last.
    served: u64,
    passes: [u64; MAX_LANES + 1],
}

impl Turns {
    fn take(&mut self, lanes: &Lanes, waiting: impl Fn(usize) -> bool) -> Option<usize> {
        let all = 0..=usize::from(lanes.count);
        let mut best: Option<(usize, u64)> = None;
        for lane in all.clone().filter(|&l| lanes.shares[l] > 0 && waiting(l)) {
            let pass = self.passes[lane].max(self.served);
            if best.is_none_or(|(_, b)| pass < b) {
                best = Some((lane, pass));
            }
        }
        let Some((lane, pass)) = best else {
            return all.into_iter().find(|&l| waiting(l));
        };
        self.served = pass;
        self.passes[lane] = pass + STRIDE / u64::from(lanes.shares[lane]);
        if self.served > PASS_LIMIT {
            let by = self.served;
            self.served = 0;
            for p in self.passes.iter_mut() {
                *p = p.saturating_sub(by);
            }
        }
        Some(lane)
    }
}
use crate::clock::Millis;

/// One waiting visitor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub(crate) visitor: VisitorId,
    pub(crate) seq: u64,
    /// Its last poll (its arrival until the first).
    pub last_poll: Millis,
}

/// One room's whole state, open to the tests that check invariants on it.
#[derive(Clone, Debug, Default)]
pub struct ModelRoom {
    /// visitor -> session expiry.
    pub sessions: BTreeMap<VisitorId, Millis>,
    /// visitor -> until when its session or queue place stays ended.
    pub ended: BTreeMap<VisitorId, Millis>,
    /// One entry per admission, its time.
    pub admissions: Vec<Millis>,
    /// The general queue, ordered by (seq, visitor).
    pub queue: Vec<Waiting>,
    /// The priority lanes (lane 1 first), each ordered as `queue`.
    pub lanes: [Vec<Waiting>; MAX_LANES],
    /// Whose turn it is among the lanes.
    pub turns: Turns,
    pub(crate) last_seq: u64,
    pub(crate) reset_floor: u64,
    pub(crate) started_event: Option<String>,
    pub(crate) totals: RoomTotals,
}

impl ModelRoom {
    fn housekeeping(&mut self, p: &RoomPolicy, now: Millis) {
        self.sessions.retain(|_, expiry| *expiry > now);
        self.ended.retain(|_, until| *until > now);
        let cutoff = now.saturating_sub(RATE_WINDOW_MS);
        self.admissions.retain(|at| *at > cutoff);
        if p.abandon_after_ms > 0 {
            let seen = now.saturating_sub(p.abandon_after_ms);
            for lane in 0..=MAX_LANES {
                let line = self.line_mut(lane);
                let before = line.len();
                line.retain(|w| w.last_poll >= seen);
                let gone = (before - line.len()) as u64;
                self.totals.abandoned += gone;
            }
        }
        self.promote(p, now);
    }

    /// Whether the limits leave room for one more admission.
    pub fn has_room(&self, p: &RoomPolicy) -> bool {
        (p.total_active_users == 0 || (self.sessions.len() as u64) < p.total_active_users)
            && (p.new_users_per_minute == 0
                || (self.admissions.len() as u64) < p.new_users_per_minute)
    }

    fn promote(&mut self, p: &RoomPolicy, now: Millis) {
        if !matches!(p.state, RoomState::Open | RoomState::QueueAll)
            || p.method == QueueingMethod::Passthrough
        {
            return;
        }
        let expires = now + p.session_duration_ms + p.arrival_grace_ms;
        while self.has_room(p) {
            let lanes = &self.lanes;
            let queue = &self.queue;
            // In a presale window the general queue is not served at all.
            let held = p.lanes.general_held(now);
            let waiting = |lane: usize| match lane {
                0 => !held && !queue.is_empty(),
                _ => !lanes[lane - 1].is_empty(),
            };
            let Some(lane) = self.turns.take(&p.lanes, waiting) else {
                break;
            };
            let at = match p.method {
                QueueingMethod::Random if lane == 0 => {
                    rand::thread_rng().gen_range(0..self.queue.len())
                }
                _ => 0,
            };
            let w = self.line_mut(lane).remove(at);
            self.admit(w.visitor, expires, now);
            self.used_place(p, w.visitor, now);
        }
    }

    /// The visitors waiting in `lane` (0: the general queue).
    pub fn line(&self, lane: usize) -> &Vec<Waiting> {
        match lane {
            0 => &self.queue,
            _ => &self.lanes[lane - 1],
        }
    }

    fn line_mut(&mut self, lane: usize) -> &mut Vec<Waiting> {
        match lane {
            0 => &mut self.queue,
            _ => &mut self.lanes[lane - 1],
        }
    }

    /// Everyone waiting, in every lane.
    pub fn waiting(&self) -> usize {
        (0..=MAX_LANES).map(|lane| self.line(lane).len()).sum()
    }

    /// The lane a visitor waits in and its index there.
    fn find(&self, visitor: VisitorId) -> Option<(usize, usize)> {
        (0..=MAX_LANES).find_map(|lane| {
            let at = self.line(lane).iter().position(|w| w.visitor == visitor)?;
            Some((lane, at))
        })
    }

    fn admit(&mut self, visitor: VisitorId, expires: Millis, now: Millis) -> Verdict {
        self.sessions.insert(visitor, expires);
        self.admissions.push(now);
        self.totals.admitted += 1;
        Verdict::Admitted {
            session_expires_ms: expires,
        }
    }

    /// A queue place became a session: ended as long as its ticket can poll.
    fn used_place(&mut self, p: &RoomPolicy, visitor: VisitorId, now: Millis) {
        self.mark_ended(visitor, now + p.abandon_after_ms);
    }

    fn mark_ended(&mut self, visitor: VisitorId, until: Millis) {
        let mark = self.ended.entry(visitor).or_insert(until);
        *mark = (*mark).max(until);
    }

    fn place(&self, lane: usize, at: usize) -> Verdict {
        let line = self.line(lane);
        Verdict::Queued(QueuePlace {
            seq: line[at].seq,
            position: at as u64 + 1,
            queue_length: line.len() as u64,
        })
    }

    fn enqueue(&mut self, lane: usize, visitor: VisitorId, seq: u64, now: Millis) -> usize {
        let line = self.line_mut(lane);
        let at = line.partition_point(|w| (w.seq, w.visitor) < (seq, visitor));
        line.insert(
            at,
            Waiting {
                visitor,
                seq,
                last_poll: now,
            },
        );
        at
    }

    fn arrive(&mut self, p: &RoomPolicy, visitor: VisitorId, lane: usize, now: Millis) -> Verdict {
        self.housekeeping(p, now);
        if let Some(&expires) = self.sessions.get(&visitor) {
            return Verdict::Admitted {
                session_expires_ms: expires,
            };
        }
        if p.state == RoomState::Closed {
            self.totals.rejected += 1;
            return Verdict::Rejected(RejectReason::Closed);
        }
        if let Some((lane, at)) = self.find(visitor) {
            return self.place(lane, at);
        }
        let fresh = now + p.session_duration_ms;
        let open = p.state == RoomState::Open;
        match p.method {
            QueueingMethod::Passthrough if open => self.admit(visitor, fresh, now),
            QueueingMethod::Reject if open => {
                if self.has_room(p) {
                    self.admit(visitor, fresh, now)
                } else {
                    self.totals.rejected += 1;
                    Verdict::Rejected(RejectReason::OverLimit)
                }
            }
            _ => {
                // In a presale window the general queue waits whatever room
                // there is, and a lane newcomer waits only behind the lanes.
                let held = p.lanes.general_held(now);
                let ahead = if held {
                    self.waiting() - self.queue.len()
                } else {
                    self.waiting()
                };
                if open && !(held && lane == 0) && ahead == 0 && self.has_room(p) {
                    return self.admit(visitor, fresh, now);
                }
                if p.max_queue_length > 0 && self.line(lane).len() as u64 >= p.max_queue_length {
                    self.totals.rejected += 1;
                    return Verdict::Rejected(RejectReason::QueueFull);
                }
                let seq = next_seq(now, self.last_seq);
                self.last_seq = seq;
                let at = self.enqueue(lane, visitor, seq, now);
                self.totals.queued += 1;
                self.place(lane, at)
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
        if let Some(&expires) = self.sessions.get(&visitor) {
            return Verdict::Admitted {
                session_expires_ms: expires,
            };
        }
        let existing = self.line(lane).iter().position(|w| w.visitor == visitor);
        if p.state == RoomState::Closed {
            if let Some(at) = existing {
                self.line_mut(lane)[at].last_poll = now;
            }
            return Verdict::Rejected(RejectReason::Closed);
        }
        // An ended place stays ended, in passthrough too.
        if p.method == QueueingMethod::Passthrough && p.state != RoomState::Paused {
            if existing.is_none() && (seq <= self.reset_floor || self.ended.contains_key(&visitor))
            {
                return Verdict::Ended;
            }
            if let Some(at) = existing {
                self.line_mut(lane).remove(at);
            }
            self.used_place(p, visitor, now);
            return self.admit(visitor, now + p.session_duration_ms, now);
        }
        if let Some(at) = existing {
            self.line_mut(lane)[at].last_poll = now;
            return self.place(lane, at);
        }
        if seq <= self.reset_floor || self.ended.contains_key(&visitor) {
            return Verdict::Ended;
        }
        // I5: the store lost this place; the ticket says where it stood.
        self.last_seq = self.last_seq.max(seq);
        self.enqueue(lane, visitor, seq, now);
        self.promote(p, now);
        if let Some(&expires) = self.sessions.get(&visitor) {
            return Verdict::Admitted {
                session_expires_ms: expires,
            };
        }
        match self.find(visitor) {
            Some((lane, at)) => self.place(lane, at),
            None => Verdict::Ended,
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
            Some(&expires) => expires,
            None if self.ended.contains_key(&visitor) || ticket_expires <= now => return None,
            // Lost with the store's data: the ticket proves the admission.
            None => ticket_expires,
        };
        let renewed = if p.session_renewal {
            expires.max(now + p.session_duration_ms)
        } else {
            expires
        };
        self.sessions.insert(visitor, renewed);
        Some(renewed)
    }

    fn release(&mut self, p: &RoomPolicy, visitor: VisitorId, now: Millis) -> bool {
        self.housekeeping(p, now);
        if let Some(expires) = self.sessions.remove(&visitor) {
            self.mark_ended(visitor, expires.max(now + p.abandon_after_ms));
            return true;
        }
        match self.find(visitor) {
            Some((lane, at)) => {
                self.line_mut(lane).remove(at);
                self.mark_ended(visitor, now + p.abandon_after_ms);
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
        if ticket_expires > now {
            self.mark_ended(visitor, ticket_expires.max(now + p.abandon_after_ms));
        }
        false
    }

    fn stats(&mut self, p: &RoomPolicy, now: Millis) -> RoomStats {
        self.housekeeping(p, now);
        RoomStats {
            active: self.sessions.len() as u64,
            queued: self.waiting() as u64,
            admitted_last_minute: self.admissions.len() as u64,
            oldest_admission_ms: self.admissions.iter().min().copied(),
            lane_queued: std::array::from_fn(|i| self.lanes[i].len() as u64),
        }
    }

    fn reset(&mut self, now: Millis) {
        let mut ended = std::mem::take(&mut self.ended);
        for (visitor, expires) in std::mem::take(&mut self.sessions) {
            let mark = ended.entry(visitor).or_insert(expires);
            *mark = (*mark).max(expires);
        }
        let floor = next_seq(now, self.last_seq);
        *self = ModelRoom {
            ended,
            last_seq: floor,
            reset_floor: floor,
            ..ModelRoom::default()
        };
    }

    fn start_event(&mut self, event: &EventStart, now: Millis) -> u64 {
        if self.started_event.as_deref() == Some(event.key.as_str()) {
            return 0;
        }
        self.started_event = Some(event.key.clone());
        if !event.shuffle {
            return 0;
        }
        let (lo, hi) = (event.prequeue_seq, event.start_seq);
        let mut moved: Vec<VisitorId> = self
            .queue
            .iter()
            .filter(|w| (lo..hi).contains(&w.seq))
            .map(|w| w.visitor)
            .collect();
        self.queue.retain(|w| !(lo..hi).contains(&w.seq));
        shuffle(moved.as_mut_slice(), event.seed);
        // Just below the prequeue's first seq, behind nobody who came
        // before it; but above the reset floor, so no place is void.
        let first = lo
            .saturating_sub(moved.len() as u64)
            .max(self.reset_floor + 1);
        for (i, visitor) in moved.iter().enumerate() {
            self.enqueue(0, *visitor, first + i as u64, now);
        }
        moved.len() as u64
    }
}

/// The reference model as a [`Store`].
#[derive(Default)]
pub struct ModelStore {
    rooms: Mutex<HashMap<Arc<str>, ModelRoom>>,
    overrides: Mutex<HashMap<String, RoomOverrides>>,
    /// (room, set) -> member -> until.
    notes: Mutex<HashMap<(String, String), BTreeMap<u64, Millis>>>,
    /// Every report addition as given: (room, minute, what, until).
    report_adds: Mutex<Vec<(String, u64, super::ReportMinute, Millis)>>,
}

impl ModelStore {
    /// An empty model.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<R>(&self, p: &RoomPolicy, f: impl FnOnce(&mut ModelRoom) -> R) -> R {
        let mut rooms = self.rooms.lock().unwrap_or_else(PoisonError::into_inner);
        f(rooms.entry(p.room.clone()).or_default())
    }

    /// A copy of a room's state after housekeeping at `now` (for invariant
    /// checks).
    pub fn room(&self, p: &RoomPolicy, now: Millis) -> ModelRoom {
        self.with(p, |r| {
            r.housekeeping(p, now);
            r.clone()
        })
    }

    /// The lane a visitor waits in (0 when it waits in none).
    pub fn lane_of(&self, p: &RoomPolicy, visitor: VisitorId) -> u8 {
        self.with(p, |r| r.find(visitor).map_or(0, |(lane, _)| lane as u8))
    }

    /// Forgets a visitor's queue entry, as a store that lost it would.
    pub fn lose(&self, p: &RoomPolicy, visitor: VisitorId) {
        self.with(p, |r| {
            for lane in 0..=MAX_LANES {
                r.line_mut(lane).retain(|w| w.visitor != visitor);
            }
        });
    }

    /// Forgets the whole room, as a flushed store would (overrides are
    /// kept apart and survive, as in Redis).
    pub fn flush(&self, p: &RoomPolicy) {
        self.with(p, |r| *r = ModelRoom::default());
    }
}

impl super::Maintenance for ModelStore {}

/// Reports as the list of what was added: a minute is the fold of its
/// additions, kept until the latest `until` among them; an addition to a
/// minute that had lapsed starts it over.
#[async_trait]
impl super::Reports for ModelStore {
    async fn report_add(
        &self,
        room: &str,
        minute: u64,
        add: &super::ReportMinute,
        keep_until_ms: Millis,
        now_ms: Millis,
    ) -> Result<(), StoreError> {
        let mut adds = self
            .report_adds
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let lapsed: Vec<(String, u64)> = adds
            .iter()
            .map(|(r, m, _, _)| (r.clone(), *m))
            .filter(|(r, m)| minute_until(&adds, r, *m) <= now_ms)
            .collect();
        adds.retain(|(r, m, _, _)| !lapsed.contains(&(r.clone(), *m)));
        adds.push((room.to_owned(), minute, add.clone(), keep_until_ms));
        Ok(())
    }

    async fn report_read(
        &self,
        room: &str,
        from: u64,
        to: u64,
        now_ms: Millis,
    ) -> Result<Vec<(u64, super::ReportMinute)>, StoreError> {
        let to = to.min(from.saturating_add(super::REPORT_MAX_MINUTES - 1));
        let adds = self
            .report_adds
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut out: BTreeMap<u64, super::ReportMinute> = BTreeMap::new();
        for (r, m, add, _) in adds.iter() {
            if r == room && (from..=to).contains(m) && minute_until(&adds, r, *m) > now_ms {
                out.entry(*m).or_default().merge(add);
            }
        }
        out.retain(|_, m| !m.is_empty());
        Ok(out.into_iter().collect())
    }
}

/// How long a minute is kept: the latest `until` of its additions.
fn minute_until(
    adds: &[(String, u64, super::ReportMinute, Millis)],
    room: &str,
    minute: u64,
) -> Millis {
    adds.iter()
        .filter(|(r, m, _, _)| r == room && *m == minute)
        .map(|(_, _, _, until)| *until)
        .max()
        .unwrap_or(0)
}

#[async_trait]
impl Store for ModelStore {
    async fn arrive(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        lane: u8,
        _kind: Arrival,
        now_ms: Millis,
    ) -> Result<Verdict, StoreError> {
        let lane = super::lane_index(room, lane)?;
        Ok(self.with(room, |r| r.arrive(room, visitor, lane, now_ms)))
    }

    async fn poll(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        lane: u8,
        seq: u64,
        now_ms: Millis,
    ) -> Result<Verdict, StoreError> {
        let lane = super::lane_index(room, lane)?;
        Ok(self.with(room, |r| r.poll(room, visitor, lane, seq, now_ms)))
    }

    async fn check_in(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        ticket_expires_ms: Millis,
        now_ms: Millis,
    ) -> Result<Option<Millis>, StoreError> {
        Ok(self.with(room, |r| {
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
        Ok(self.with(room, |r| match end {
            End::Session(ticket_expires_ms) => {
                r.end_session(room, visitor, ticket_expires_ms, now_ms)
            }
            End::Release | End::Arrival(_) => r.release(room, visitor, now_ms),
        }))
    }

    async fn stats(&self, room: &RoomPolicy, now_ms: Millis) -> Result<RoomStats, StoreError> {
        Ok(self.with(room, |r| r.stats(room, now_ms)))
    }

    async fn totals(&self, room: &RoomPolicy) -> Result<RoomTotals, StoreError> {
        Ok(self.with(room, |r| r.totals))
    }

    async fn reset(&self, room: &RoomPolicy, now_ms: Millis) -> Result<(), StoreError> {
        self.with(room, |r| r.reset(now_ms));
        Ok(())
    }

    async fn start_event(
        &self,
        room: &RoomPolicy,
        event: &EventStart,
        now_ms: Millis,
    ) -> Result<u64, StoreError> {
        Ok(self.with(room, |r| r.start_event(event, now_ms)))
    }

    async fn forget(&self, room: &str, set: &str, members: &[u64]) -> Result<u64, StoreError> {
        let mut notes = self.notes.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(noted) = notes.get_mut(&(room.to_owned(), set.to_owned())) else {
            return Ok(0);
        };
        Ok(members.iter().filter(|m| noted.remove(m).is_some()).count() as u64)
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
        let noted = notes.entry((room.to_owned(), set.to_owned())).or_default();
        noted.retain(|_, until| *until > now_ms);
        let mut added = 0;
        for m in members {
            match noted.get_mut(m) {
                Some(until) => *until = (*until).max(until_ms),
                None => {
                    noted.insert(*m, until_ms);
                    added += 1;
                }
            }
        }
        noted.retain(|_, until| *until > now_ms);
        Ok(Noted {
            added,
            size: noted.len() as u64,
        })
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
