//! The shared state of every room: the `Store` trait, the types its operations
//! speak, and the two backends (`memory`, `redis`).
//!
//! Every operation is one atomic step (one critical section in memory, one Lua
//! script on Redis) and takes the current time as an argument, so tests move a
//! clock instead of sleeping. The daemon never reads and then writes shared
//! state in two steps.
//!
//! ## Semantics shared by every backend
//!
//! * A room holds *sessions* (visitor -> expiry), a *queue* (visitor -> `seq`,
//!   ordered by `seq`, with the time of the visitor's last poll) and the
//!   admission times of the last 60 s (the sliding rate window).
//! * Before deciding anything, an operation expires sessions whose expiry is
//!   `<= now`, drops admissions older than 60 s, removes queue entries whose
//!   last poll is older than `abandon_after` (counted as abandoned), and then
//!   *promotes* waiting visitors while there is room: in `fifo` mode the head
//!   of the queue in order, in `random` mode random entries. A promoted visitor
//!   gets a session at once (it learns so on its next poll), which is what
//!   makes admission order equal queue order (no FIFO inversion) and keeps the
//!   room work-conserving.
//! * "Room" means `active < total_active_users` and fewer than
//!   `new_users_per_minute` admissions in `(now - 60 s, now]`. A limit of 0
//!   means unlimited.
//! * `seq` is unique and increasing per room: `max((now - SEQ_EPOCH) * 1024,
//!   last_seq + 1)`. Deriving it from time keeps tickets issued before a store
//!   loss ordered before every ticket issued after it, so an entry put back
//!   from a ticket (I5) lands at its original place.
//! * What an operator or the origin ends stays ended: a released session is
//!   remembered until it would have expired, a released queue place for
//!   `abandon_after`, and a reset voids every queue ticket issued before it
//!   (`seq` at or below the room's reset floor). Their tickets get
//!   [`Verdict::Ended`] or `None`, never their place back. Only a store that
//!   *lost* its data (restart, `FLUSHALL`) forgets these marks, and then the
//!   tickets restore what they carry (I5).
//! * A room may have priority lanes ([`Lanes`]): each a queue of its own,
//!   ordered by `seq`, positions counted within it. Promotion serves the
//!   lanes by turns ([`LaneTurns`]), each its share while several wait,
//!   FIFO within each; a visitor waits in one lane at most.
//! * A queue place that became a session is used up: it is marked ended for
//!   `abandon_after` from the admission (as long as its ticket can poll), so
//!   once the session is over, by expiry too, that ticket gets
//!   [`Verdict::Ended`] and its holder is a newcomer at the back.

pub mod memory;
/// The reference model the conformance suite checks every store against:
/// a test hook, not in a release build.
#[cfg(any(test, feature = "testing"))]
pub mod model;
pub mod redis;

pub use crate::domain::{
    EventSpec, Lanes, QueueingMethod, RejectReason, RoomOverrides, RoomPolicy, RoomState, Settings,
    VisitorId, MAX_LANES, MIN_CHECK_IN_MS,
};

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;

use crate::clock::Millis;

/// Length of the sliding rate window.
pub const RATE_WINDOW_MS: Millis = 60_000;

/// `seq` values count from here (2020-01-01T00:00:00Z) so that
/// `ms * SEQ_PER_MS` stays below 2^53 (exact in a Redis sorted-set score)
/// for centuries.
pub const SEQ_EPOCH_MS: Millis = 1_577_836_800_000;
/// How many distinct `seq` values one millisecond provides.
pub const SEQ_PER_MS: u64 = 1024;

/// The first `seq` a room may hand out at `now`, given the last one it handed out.
pub fn next_seq(now_ms: Millis, last_seq: u64) -> u64 {
    (now_ms.saturating_sub(SEQ_EPOCH_MS) * SEQ_PER_MS).max(last_seq + 1)
}

/// When the visitor holding `seq` arrived (to the millisecond; a burst of
/// more than `SEQ_PER_MS` arrivals in one millisecond reads a little later).
pub fn seq_arrival_ms(seq: u64) -> Millis {
    seq / SEQ_PER_MS + SEQ_EPOCH_MS
}

/// The one shuffle of an event's start: every backend (Redis' included,
/// `lua/start_event.lua`) puts a prequeue in the same order for the same
/// seed. Fisher-Yates over MINSTD (Park-Miller), whose products stay below
/// 2^53, so Lua's doubles compute them exactly.
pub fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut x = minstd_seed(seed);
    for i in (1..items.len()).rev() {
        x = x * 48_271 % 2_147_483_647;
        let j = (x % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

/// The first of the `n` seqs an event's shuffle gives the prequeue that
/// started at `lo`: just below `lo`, so still behind nobody who arrived
/// before the prequeue and ahead of everyone after the start, but above the
/// reset `floor` (a reset just before the prequeue leaves no room below
/// `lo`), so no shuffled place looks void. Never at or past the start's seq:
/// `n` places had seqs in the prequeue, above the floor.
pub fn shuffled_first(lo: u64, n: u64, floor: u64) -> u64 {
    lo.saturating_sub(n).max(floor + 1)
}

/// The MINSTD state a seed starts [`shuffle`] from (1 to 2^31 - 2).
pub fn minstd_seed(seed: u64) -> u64 {
    seed % 2_147_483_646 + 1
}

/// Whose turn it is among a room's lanes: stride scheduling. Each lane has
/// a pass; the waiting lane with the lowest pass (ties: the general queue,
/// then the configured lanes in order) is served next and its pass
/// moves on by `STRIDE / share`, so while several lanes wait each gets its
/// share of admissions, and a lane nobody waits in neither blocks the
/// others nor saves up turns (a lane that starts waiting again starts at
/// the pass of the last lane served). Integers only, so Redis' copy
/// (`lua/lib/lanes.lua`) picks exactly as this one does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaneTurns {
    /// The pass of the lane served last.
    pub virtual_time: u64,
    pub(crate) pass: [u64; MAX_LANES + 1],
}

/// One turn of a lane with a share of 1 (a thousandth moves a pass 1000
/// times as far).
pub const STRIDE: u64 = 1_000_000;

/// Passes are brought back toward 0 past this, all by the same amount.
pub const PASS_LIMIT: u64 = 1 << 50;

impl LaneTurns {
    /// The lane (0 = the general queue) the next admission goes to, of
    /// those for which `waiting` holds, and its turn taken; `None` if
    /// nobody waits.
    pub fn take(&mut self, lanes: &Lanes, waiting: impl Fn(usize) -> bool) -> Option<usize> {
        let order = 0..=usize::from(lanes.count);
        let mut best: Option<(usize, u64)> = None;
        for lane in order.clone() {
            if lanes.shares[lane] == 0 || !waiting(lane) {
                continue;
            }
            let pass = self.pass[lane].max(self.virtual_time);
            if best.is_none_or(|(_, b)| pass < b) {
                best = Some((lane, pass));
            }
        }
        let Some((lane, pass)) = best else {
            return order.into_iter().find(|&lane| waiting(lane));
        };
        self.virtual_time = pass;
        self.pass[lane] = pass + STRIDE / u64::from(lanes.shares[lane]);
        if self.virtual_time > PASS_LIMIT {
            let by = self.virtual_time;
            self.virtual_time = 0;
            for p in &mut self.pass {
                *p = p.saturating_sub(by);
            }
        }
        Some(lane)
    }
}

/// `lane` as an index into a room's lanes (0: the general queue), or an
/// error if the room has no such lane (its configuration changed under a
/// ticket: the gate then treats the ticket's lane as the general queue).
pub fn lane_index(room: &RoomPolicy, lane: u8) -> Result<usize, StoreError> {
    if lane > room.lanes.count {
        return Err(StoreError::Protocol(format!(
            "room {} has no lane {lane}",
            room.room
        )));
    }
    Ok(usize::from(lane))
}

/// Where a queued visitor stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueuePlace {
    /// The visitor's order in the room (carried in the ticket; see `next_seq`).
    pub seq: u64,
    /// 1-based position among the visitors still waiting in its lane.
    pub position: u64,
    /// Number of visitors waiting in its lane.
    pub queue_length: u64,
}

/// The outcome of `arrive` or `poll`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The visitor holds a live session until `session_expires_ms`.
    Admitted {
        /// When the session runs out unless checked in.
        session_expires_ms: Millis,
    },
    /// The visitor waits at this place.
    Queued(QueuePlace),
    /// The visitor is turned away.
    Rejected(RejectReason),
    /// The visitor's queue place was ended (released, or the room reset):
    /// its ticket is void and the visitor is a newcomer again. Only `poll`
    /// answers this.
    Ended,
}

/// Live figures of one room.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RoomStats {
    /// Live sessions.
    pub active: u64,
    /// Visitors waiting, every lane counted.
    pub queued: u64,
    /// Admissions in `(now - 60 s, now]`.
    pub admitted_last_minute: u64,
    /// Time of the oldest admission in that window, if any (for the ETA rate).
    pub oldest_admission_ms: Option<Millis>,
    /// Of `queued`, those waiting in each priority lane (lane 1 first).
    pub lane_queued: [u64; MAX_LANES],
}

/// Cumulative counts the store keeps per room (for metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RoomTotals {
    /// Admissions.
    pub admitted: u64,
    /// Visitors put in the queue.
    pub queued: u64,
    /// Arrivals turned away.
    pub rejected: u64,
    /// Queue places dropped for want of polls (`abandon_after`).
    pub abandoned: u64,
}

/// The one store step that starts an event (see [`Store::start_event`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventStart {
    /// Names this event's start, so it is done once: `name@start_ms`.
    pub key: String,
    /// Visitors queued with a `seq` in `prequeue_seq..start_seq` arrived
    /// during the prequeue.
    pub prequeue_seq: u64,
    /// The first `seq` of the event's start; later arrivals queue after the prequeue.
    pub start_seq: u64,
    /// Put the prequeue in a random order.
    pub shuffle: bool,
    /// Seeds the shuffle.
    pub seed: u64,
}

impl EventStart {
    /// What the store needs to start `spec`'s admissions.
    pub fn of(spec: &EventSpec, seed: u64) -> Self {
        EventStart {
            key: format!("{}@{}", spec.name, spec.start_ms),
            prequeue_seq: next_seq(spec.opens_ms(), 0),
            start_seq: next_seq(spec.start_ms, 0),
            shuffle: spec.shuffle_at_start,
            seed,
        }
    }
}

/// Why a store call failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No answer within `store.timeout`.
    #[error("store timed out")]
    Timeout,
    /// Not tried: the store failed a moment ago and is left alone until its
    /// next probe (`gate::guard`).
    #[error("store down; retrying shortly")]
    Down,
    /// No connection, or the store refused the call.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// An answer the store should not give.
    #[error("store answered something unexpected: {0}")]
    Protocol(String),
    /// The room's runtime changes in the store are newer (this revision)
    /// than those of the policy the call carried.
    #[error("room settings changed (revision {0}); read them again")]
    Stale(u64),
    /// The room's keys were written by a layout this build does not read.
    #[error("room keys written by layout {0}, which this build does not read")]
    Layout(u64),
    /// This instance is behind (its runtime runs tasks late): the store
    /// was not asked, or its answer was not read in time. Not the store's
    /// fault, so no `fail_mode`: the newcomer is told to come back
    /// (`gate::lag`).
    #[error("this instance is overloaded")]
    Busy,
}

/// What the caller of [`Store::arrive`] knows of the visitor's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Anything: the room may hold a session or a place for it.
    Known,
    /// Nothing: the id was just made for it ([`VisitorId::random`]) and is
    /// never looked up by id later. A store may skip looking it up; the
    /// daemon's newcomers all come this way.
    New,
    /// A stable id the room has not seen lately (a token's member whose
    /// `sub` was not noted within a day): a store may skip the lookups
    /// whose cost grows with the queue (Redis: reading the tail), not the
    /// others; its session and place are found by id at its next arrival.
    Unseen,
}

/// Which ending [`Store::end`] records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The operator releases a visitor (the admin API): its session or
    /// its place.
    Release,
    /// An admitted visitor's session, by the ticket the caller holds,
    /// whose session expiry this is (as for `check_in`): a store may find
    /// the session by it without reading every session. A session the
    /// store does not hold (lost, or renewed by a store that stood in) is
    /// recorded as ended all the same, while the ticket lives, so no
    /// ticket of it brings it back. The origin's `revoke` and a ticket
    /// used from too many networks come this way.
    Session(Millis),
    /// A visitor whose `arrive` at this time may have landed after its
    /// caller gave up: a session it got ends no earlier than this plus the
    /// room's session duration, which a store may use to look less far.
    Arrival(Millis),
}

/// The shared state of every room. See the module docs for the semantics.
/// What the daemon does with a store off the request path: checks,
/// pings, upkeep and flushes. Every hook has a default for a store that
/// needs none (an in-process store).
#[async_trait]
pub trait Maintenance: Send + Sync {
    /// Checks the room's state against the invariants of its layout (the
    /// relations between what a backend keeps in several places) and says
    /// what is violated, one sentence each; empty when nothing is. The
    /// property tests call it after every step; operators reach it through
    /// the admin API (`GET /api/rooms/{id}/check`).
    async fn check(&self, room: &RoomPolicy, now_ms: Millis) -> Result<Vec<String>, StoreError> {
        let _ = (room, now_ms);
        Ok(Vec::new())
    }

    /// How many answers the store's server has given so far, if it counts
    /// them: a call that timed out while answers kept coming was waiting
    /// on this process, not on a store that is down (`gate::guard`).
    fn answers(&self) -> Option<u64> {
        None
    }

    /// Periodic upkeep the daemon runs every few seconds, off the request
    /// path (Redis: re-measures the server clock that deadlines are set in).
    async fn upkeep(&self) {}

    /// The cheapest call the store answers, to tell a store that is busy
    /// (it answers, late) from one that is unreachable (`gate::guard`):
    /// waits up to `within` for the answer. An in-process store always
    /// answers.
    async fn ping(&self, within: std::time::Duration) -> Result<(), StoreError> {
        let _ = within;
        Ok(())
    }

    /// Writes out what a backend holds back for a room to write in batches
    /// (Redis: polls answered from a queue description); the daemon calls
    /// it every few seconds per room.
    async fn flush(&self, _room: &RoomPolicy, _now_ms: Millis) {}
}

/// One minute of a room's report as a store keeps it (`telemetry::report`
/// names the fields): counts every instance adds to and peaks every
/// instance raises. Names are `[a-z0-9_]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReportMinute {
    /// Added up across instances.
    pub sums: BTreeMap<String, u64>,
    /// The highest any instance gave.
    pub peaks: BTreeMap<String, u64>,
}

impl ReportMinute {
    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.sums.is_empty() && self.peaks.is_empty()
    }

    /// Folds `other` in: sums added, peaks raised.
    pub fn merge(&mut self, other: &ReportMinute) {
        for (name, n) in &other.sums {
            let sum = self.sums.entry(name.clone()).or_default();
            *sum = sum.saturating_add(*n);
        }
        for (name, n) in &other.peaks {
            let peak = self.peaks.entry(name.clone()).or_default();
            *peak = (*peak).max(*n);
        }
    }
}

/// Most minutes one [`Reports::report_read`] answers: 31 days and the
/// hour before them (a report's baseline).
pub const REPORT_MAX_MINUTES: u64 = 31 * 24 * 60 + 60;

/// The rooms' reports, minute by minute, kept in the shared store for the
/// operator's retention so every instance adds to one account.
#[async_trait]
pub trait Reports: Send + Sync {
    /// Adds one instance's share to minute `minute` (minutes since the Unix
    /// epoch) of the room's report: its sums added, its peaks raised to.
    /// The minute is kept until `keep_until_ms` (never shortened), in the
    /// caller's clock; a store may drop it up to an hour after that.
    async fn report_add(
        &self,
        room: &str,
        minute: u64,
        add: &ReportMinute,
        keep_until_ms: Millis,
        now_ms: Millis,
    ) -> Result<(), StoreError>;

    /// The room's minutes in `from..=to` (at most [`REPORT_MAX_MINUTES`])
    /// that hold anything and are kept at `now_ms`, oldest first.
    async fn report_read(
        &self,
        room: &str,
        from: u64,
        to: u64,
        now_ms: Millis,
    ) -> Result<Vec<(u64, ReportMinute)>, StoreError>;
}

/// All shared room state: every decision is one atomic call. The memory and
/// Redis stores implement it, and the conformance suite checks both.
#[async_trait]
pub trait Store: Maintenance + Reports + Send + Sync + 'static {
    /// A visitor without a valid ticket arrives in `lane` (0: the general
    /// queue; a priority lane `1..=room.lanes.count`): admit, enqueue at
    /// the back of its lane, or reject, in one atomic step. A visitor the
    /// room already holds, in any lane, gets its session or place back.
    /// `kind` says what the caller knows of the id, so a store may skip
    /// lookups that cannot find anything ([`Arrival`]).
    async fn arrive(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        lane: u8,
        kind: Arrival,
        now_ms: Millis,
    ) -> Result<Verdict, StoreError>;

    /// A queued visitor polls. `lane` and `seq` are its ticket's: if the
    /// store has no place and no session for the visitor, the place is put
    /// back in that lane at `seq` (I5), unless it was ended
    /// ([`Verdict::Ended`]). Updates the visitor's last-poll time.
    async fn poll(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        lane: u8,
        seq: u64,
        now_ms: Millis,
    ) -> Result<Verdict, StoreError>;

    /// An admitted visitor checks in with the session expiry its ticket
    /// carries. Returns the session's expiry (extended to `now +
    /// session_duration` when renewal is on; never shortened) or `None` if
    /// the session was ended (released, revoked, reset) or has expired. A
    /// live ticket whose session the store does not know at all (the store
    /// lost its data) re-creates the session: the visitor keeps it and is
    /// counted again.
    async fn check_in(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        ticket_expires_ms: Millis,
        now_ms: Millis,
    ) -> Result<Option<Millis>, StoreError>;

    /// Ends a visitor's session (or queue place); `end` says what the
    /// caller knows of it ([`End`]). True if there was one. An ended
    /// session is remembered until it would have expired, so its ticket
    /// cannot re-create it at check-in; an ended queue place for
    /// `abandon_after`, so its ticket cannot put it back.
    async fn end(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        end: End,
        now_ms: Millis,
    ) -> Result<bool, StoreError>;

    /// Live figures (after the same housekeeping every operation does).
    async fn stats(&self, room: &RoomPolicy, now_ms: Millis) -> Result<RoomStats, StoreError>;

    /// Cumulative counts since the room was created or reset.
    async fn totals(&self, room: &RoomPolicy) -> Result<RoomTotals, StoreError>;

    /// Empties the room: no sessions (they are ended, as by `end`), no
    /// queue (every queue ticket issued so far is void), no rate history.
    /// Overrides stay.
    async fn reset(&self, room: &RoomPolicy, now_ms: Millis) -> Result<(), StoreError>;

    /// Starts an event's admissions, once per `event.key` however many
    /// instances ask: when `event.shuffle`, the visitors queued during the
    /// prequeue (`seq` in `prequeue_seq..start_seq`) are put in a random
    /// order in one atomic step, every one of them ahead of whoever arrives
    /// after the start. The new order takes the `seq`s just below
    /// `prequeue_seq`, so tickets still carrying a prequeue `seq` are known
    /// to be stale and get the new one at their next poll. Returns how many
    /// visitors were shuffled (0 when already started).
    async fn start_event(
        &self,
        room: &RoomPolicy,
        event: &EventStart,
        now_ms: Millis,
    ) -> Result<u64, StoreError>;

    /// Notes `members` in the room's set `set` (a short name of
    /// `[a-z0-9:_-]`), each kept until `until_ms` (extended, never
    /// shortened). Returns how many of them were new and how many members
    /// the set holds at `now_ms`. The gate's memory of single-use proofs of
    /// work and of the networks an admitted session was used from.
    async fn note(
        &self,
        room: &str,
        set: &str,
        members: &[u64],
        until_ms: Millis,
        now_ms: Millis,
    ) -> Result<Noted, StoreError>;

    /// Takes `members` back out of the room's set `set` (a single-use
    /// token or code noted for an arrival that then got no place: closed,
    /// queue full, or the decision failed). Returns how many were there.
    async fn forget(&self, room: &str, set: &str, members: &[u64]) -> Result<u64, StoreError>;

    /// The operator's runtime changes to a room, if any.
    async fn overrides(&self, room: &str) -> Result<Option<RoomOverrides>, StoreError>;

    /// Replaces (or, with `None`, clears) the room's runtime changes.
    async fn set_overrides(
        &self,
        room: &str,
        overrides: Option<&RoomOverrides>,
    ) -> Result<(), StoreError>;
}

/// What [`Store::note`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Noted {
    /// Members that were not in the set (or had lapsed).
    pub added: u64,
    /// Live members after the call.
    pub size: u64,
}

/// A shared handle to the daemon's store.
pub type SharedStore = Arc<dyn Store>;
