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
//! * A queue place that became a session is used up: it is marked ended for
//!   `abandon_after` from the admission (as long as its ticket can poll), so
//!   once the session is over, by expiry too, that ticket gets
//!   [`Verdict::Ended`] and its holder is a newcomer at the back.

pub mod memory;
pub mod model;
pub mod redis;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

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

/// A visitor's random, opaque identity (128 bits).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VisitorId(pub [u8; 16]);

impl VisitorId {
    pub fn random() -> Self {
        Self(rand::random())
    }

    /// Lower-case hex, 32 characters (what the origin sees and Redis stores).
    pub fn to_hex(&self) -> String {
        String::from_utf8_lossy(&self.hex()).into_owned()
    }

    /// The hex digits without an allocation (this runs on every proxied request).
    pub fn hex(&self) -> [u8; 32] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, b) in self.0.iter().enumerate() {
            out[2 * i] = DIGITS[usize::from(b >> 4)];
            out[2 * i + 1] = DIGITS[usize::from(b & 0xF)];
        }
        out
    }

    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 32 || !s.is_ascii() {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Self(out))
    }
}

impl fmt::Display for VisitorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for VisitorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VisitorId({})", self.to_hex())
    }
}

/// How a room lets waiting visitors in (docs/configuration.md,
/// `room.queueing_method`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueingMethod {
    /// Waiting visitors are admitted in arrival order.
    Fifo,
    /// When room frees up, a random waiting visitor is admitted (a lottery).
    Random,
    /// No queue: everyone is admitted, the limits are only counted.
    Passthrough,
    /// No queue: over the limits, new visitors are rejected.
    Reject,
}

/// A room's runtime state (docs/operating.md, "Room states").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoomState {
    /// Normal operation.
    Open,
    /// Every new visitor joins the queue, even when there is room; the queue
    /// is admitted as capacity allows.
    QueueAll,
    /// Nobody is admitted; new visitors queue and the queue keeps its order.
    Paused,
    /// Sold out: no new tickets, queued visitors are told the room is closed.
    /// Active sessions continue.
    Closed,
}

/// Everything a store needs to know about a room to decide for it.
#[derive(Clone, Debug, PartialEq)]
pub struct RoomPolicy {
    /// The room id; also the Redis hash tag.
    pub room: Arc<str>,
    /// Most concurrently active sessions; 0 = unlimited.
    pub total_active_users: u64,
    /// Most admissions in any 60 s window; 0 = unlimited.
    pub new_users_per_minute: u64,
    /// How long a session lives after admission / after its last check-in.
    pub session_duration_ms: Millis,
    /// Whether a check-in extends the session (sliding) or not (fixed).
    pub session_renewal: bool,
    pub method: QueueingMethod,
    /// Most visitors waiting; beyond it new visitors are rejected. 0 = unbounded.
    pub max_queue_length: u64,
    /// A queued visitor who has not polled for this long is dropped.
    pub abandon_after_ms: Millis,
    /// Extra session time given to a visitor promoted from the queue, so the
    /// session does not run out before the visitor's next poll collects it.
    pub arrival_grace_ms: Millis,
    pub state: RoomState,
    /// The revision of the operators' runtime changes this policy reflects
    /// (0: none). A store that holds a newer one refuses to decide on this
    /// policy ([`StoreError::Stale`]): the caller reads the new changes
    /// and asks again.
    pub revision: u64,
}

/// Shortest and longest check-in interval (see [`RoomPolicy::check_in_interval_ms`]).
pub const MIN_CHECK_IN_MS: Millis = 1_000;
pub const MAX_CHECK_IN_MS: Millis = 60_000;

impl RoomPolicy {
    /// How often an admitted visitor's session is renewed in the store
    /// under this policy: a quarter of the session, at most 60 s, at least
    /// 1 s. It follows the session duration in force (the file's, an
    /// event's or an operator's), so a ticket always checks in before the
    /// session it carries runs out.
    pub fn check_in_interval_ms(&self) -> Millis {
        (self.session_duration_ms / 4).clamp(MIN_CHECK_IN_MS, MAX_CHECK_IN_MS)
    }
}

/// Where a queued visitor stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueuePlace {
    /// The visitor's order in the room (carried in the ticket; see `next_seq`).
    pub seq: u64,
    /// 1-based position among the visitors still waiting.
    pub position: u64,
    /// Number of visitors waiting.
    pub queue_length: u64,
}

/// Why a visitor was turned away.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectReason {
    /// The room is `closed`.
    Closed,
    /// `max_queue_length` visitors are already waiting.
    QueueFull,
    /// `reject` method and over the limits.
    OverLimit,
}

/// The outcome of `arrive` or `poll`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The visitor holds a live session until `session_expires_ms`.
    Admitted {
        session_expires_ms: Millis,
    },
    Queued(QueuePlace),
    Rejected(RejectReason),
    /// The visitor's queue place was ended (released, or the room reset):
    /// its ticket is void and the visitor is a newcomer again. Only `poll`
    /// answers this.
    Ended,
}

/// Live figures of one room.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RoomStats {
    pub active: u64,
    pub queued: u64,
    /// Admissions in `(now - 60 s, now]`.
    pub admitted_last_minute: u64,
    /// Time of the oldest admission in that window, if any (for the ETA rate).
    pub oldest_admission_ms: Option<Millis>,
}

/// Cumulative counts the store keeps per room (for metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RoomTotals {
    pub admitted: u64,
    pub queued: u64,
    pub rejected: u64,
    pub abandoned: u64,
}

/// Runtime changes an operator made to a room through the admin API. Kept in
/// the store so every instance applies them and they survive restarts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoomOverrides {
    /// Limits, session and method (stored flat: `lua/frontier.lua` reads
    /// `new_users_per_minute` and `queueing_method` at the top level).
    #[serde(flatten)]
    pub settings: Settings,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<RoomState>,
    /// Fingerprint of the room's configuration when the changes were made:
    /// once the config file changes the room, the file wins again.
    pub config_fingerprint: u64,
    /// Counts the changes (1 for the first): an instance never replaces the
    /// overrides it applied with an older revision it read before them.
    #[serde(default)]
    pub revision: u64,
    /// The room's events as the operator changed them through the admin
    /// API (they replace the config file's list); `None`: the file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<EventSpec>>,
}

/// A scheduled period with its own settings (docs/how-it-works.md, "Timed
/// drops"), as the config file gives it or the admin API stores it. Times
/// in ms since the Unix epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventSpec {
    pub name: String,
    /// From here to `start` every visitor gets a queue ticket and waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prequeue_start_ms: Option<Millis>,
    pub start_ms: Millis,
    pub end_ms: Millis,
    /// At `start`, put the prequeue in a random order.
    #[serde(default)]
    pub shuffle_at_start: bool,
    /// What the event changes from its start to its end.
    #[serde(flatten)]
    pub settings: Settings,
}

/// Room settings an event or an operator changes (`None`: unchanged).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_active_users: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_users_per_minute: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_duration_ms: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_renewal: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queueing_method: Option<QueueingMethod>,
}

impl Settings {
    /// Takes what `change` sets; keeps the rest.
    pub fn update(&mut self, change: &Settings) {
        self.total_active_users = change.total_active_users.or(self.total_active_users);
        self.new_users_per_minute = change.new_users_per_minute.or(self.new_users_per_minute);
        self.session_duration_ms = change.session_duration_ms.or(self.session_duration_ms);
        self.session_renewal = change.session_renewal.or(self.session_renewal);
        self.queueing_method = change.queueing_method.or(self.queueing_method);
    }

    /// `policy` with these changes.
    pub fn apply(&self, policy: &mut RoomPolicy) {
        if let Some(v) = self.total_active_users {
            policy.total_active_users = v;
        }
        if let Some(v) = self.new_users_per_minute {
            policy.new_users_per_minute = v;
        }
        if let Some(v) = self.session_duration_ms {
            policy.session_duration_ms = v;
        }
        if let Some(v) = self.session_renewal {
            policy.session_renewal = v;
        }
        if let Some(v) = self.queueing_method {
            policy.method = v;
        }
    }
}

impl EventSpec {
    /// When the event begins to matter: its prequeue, or its start.
    pub fn opens_ms(&self) -> Millis {
        self.prequeue_start_ms
            .unwrap_or(self.start_ms)
            .min(self.start_ms)
    }

    /// Whether two events' periods (prequeue included) overlap.
    pub fn overlaps(&self, other: &EventSpec) -> bool {
        self.opens_ms() < other.end_ms && other.opens_ms() < self.end_ms
    }

    /// What the store needs to start this event's admissions.
    pub fn start(&self, seed: u64) -> EventStart {
        EventStart {
            key: format!("{}@{}", self.name, self.start_ms),
            prequeue_seq: next_seq(self.opens_ms(), 0),
            start_seq: next_seq(self.start_ms, 0),
            shuffle: self.shuffle_at_start,
            seed,
        }
    }
}

/// The one store step that starts an event (see [`Store::start_event`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventStart {
    /// Names this event's start, so it is done once: `name@start_ms`.
    pub key: String,
    /// Visitors queued with a `seq` in `prequeue_seq..start_seq` arrived
    /// during the prequeue.
    pub prequeue_seq: u64,
    pub start_seq: u64,
    /// Put the prequeue in a random order.
    pub shuffle: bool,
    /// Seeds the shuffle.
    pub seed: u64,
}

impl RoomOverrides {
    /// `base` with these changes applied.
    pub fn apply(&self, base: &RoomPolicy) -> RoomPolicy {
        let mut p = base.clone();
        self.settings.apply(&mut p);
        p.revision = self.revision;
        if let Some(v) = self.state {
            p.state = v;
        }
        p
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store timed out")]
    Timeout,
    /// Not tried: the store failed a moment ago and is left alone until its
    /// next probe (`gate::guard`).
    #[error("store down; retrying shortly")]
    Down,
    #[error("store unavailable: {0}")]
    Unavailable(String),
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

/// The shared state of every room. See the module docs for the semantics.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// A visitor without a valid ticket arrives: admit, enqueue at the back,
    /// or reject, in one atomic step. A visitor the room already holds gets
    /// its session or place back. (On Redis, finding a place in the tail
    /// reads the whole tail, which grows with the queue: visitors whose id
    /// was just made come through [`Store::arrive_new`].)
    async fn arrive(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        now_ms: Millis,
    ) -> Result<Verdict, StoreError>;

    /// `arrive` for a visitor whose id was just made for it
    /// ([`VisitorId::random`]), so it holds no session and no place: a
    /// store may skip looking it up. The daemon's new visitors all come
    /// this way.
    async fn arrive_new(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        now_ms: Millis,
    ) -> Result<Verdict, StoreError> {
        self.arrive(room, visitor, now_ms).await
    }

    /// A queued visitor polls. `seq` is the order its ticket carries: if the
    /// store has no entry and no session for the visitor, the entry is put
    /// back at `seq` (I5), unless the place was ended ([`Verdict::Ended`]).
    /// Updates the visitor's last-poll time.
    async fn poll(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
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

    /// Ends a visitor's session (or queue place). True if there was one. An
    /// ended session is remembered until it would have expired, so its
    /// ticket cannot re-create it at check-in; an ended queue place for
    /// `abandon_after`, so its ticket cannot put it back.
    async fn release(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        now_ms: Millis,
    ) -> Result<bool, StoreError>;

    /// `release` of an admitted visitor whose ticket the caller holds:
    /// `ticket_expires_ms` is the session expiry that ticket carries (as
    /// for `check_in`), by which a store may find the session without
    /// reading every session. A session the store does not hold (lost, or
    /// renewed by a store that stood in) is recorded as ended all the
    /// same, while the ticket lives, so no ticket of it brings it back.
    /// The origin's `revoke` and a ticket used from too many networks come
    /// this way.
    async fn end_session(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        ticket_expires_ms: Millis,
        now_ms: Millis,
    ) -> Result<bool, StoreError>;

    /// `release` of a visitor whose `arrive` at `arrived_ms` may have
    /// landed after its caller gave up: a session it got ends no earlier
    /// than `arrived_ms` plus the room's session duration, which a store
    /// may use to look less far.
    async fn release_arrival(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        arrived_ms: Millis,
        now_ms: Millis,
    ) -> Result<bool, StoreError> {
        let _ = arrived_ms;
        self.release(room, visitor, now_ms).await
    }

    /// Live figures (after the same housekeeping every operation does).
    async fn stats(&self, room: &RoomPolicy, now_ms: Millis) -> Result<RoomStats, StoreError>;

    /// Cumulative counts since the room was created or reset.
    async fn totals(&self, room: &RoomPolicy) -> Result<RoomTotals, StoreError>;

    /// Empties the room: no sessions (they are ended, as by `release`), no
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

    /// The operator's runtime changes to a room, if any.
    async fn overrides(&self, room: &str) -> Result<Option<RoomOverrides>, StoreError>;

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

    /// Writes out what a backend holds back for a room to write in batches
    /// (Redis: polls answered from a queue description); the daemon calls
    /// it every few seconds per room.
    async fn flush(&self, _room: &RoomPolicy, _now_ms: Millis) {}

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
