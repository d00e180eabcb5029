//! Every store call the request path makes goes through one [`StoreGuard`]:
//! it bounds the call by `store.timeout`, leaves a failed store alone for a
//! second (a breaker on the injected clock, one probe request per second),
//! falls back to this instance's own memory store in `fail_mode = "local"`,
//! counts errors and latency, logs the up/down transitions once, and undoes
//! decisions that were sent but never answered.
//!
//! Overload is not an outage: when this instance's own runtime runs late
//! (`gate::lag`), a newcomer is shed with `StoreError::Busy` before any
//! store call, and a call that timed out meanwhile is `Busy` too, neither
//! counted as a store failure nor answered with `fail_mode`.
//!
//! Nor is one slow call: a store is *unreachable* only once it has
//! answered nothing, to any call or to the guard's own ping (sent a few
//! times a second off the request path, [`Liveness`]), for
//! `store.unreachable_after` (1 s by default). Until then a call that
//! times out or fails is `Busy` ("busy, retry": nobody let in unchecked,
//! nothing created), counted as `waitroom_store_busy_total`; only after it
//! does the breaker open and `fail_mode` apply, counted as
//! `waitroom_store_errors_total` and logged once as "store unreachable".
//! Redis running a long script (a slow call, a `DEBUG SLEEP`) answers
//! nothing for a while and then answers: busy. Redis killed, or the
//! network cut, answers nothing at all: unreachable after the window.
//!
//! That last part matters with a frozen Redis: a new visitor's `arrive`
//! that timed out may still run when Redis thaws. The script refuses to run
//! past its deadline (`store/redis/lua/lib/ctx.lua`), and for the narrow window
//! where a script ran just before its deadline but the answer came too late,
//! the visitor id (never handed to anyone) is released once the store is
//! back, so no ghost session or queue place outlives the outage.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::clock::{Millis, SharedClock};
use crate::config::{Config, FailMode};
use crate::domain::{RoomOverrides, RoomPolicy, VisitorId};
use crate::store::memory::MemoryStore;
use crate::store::{
    Arrival, End, EventStart, RoomStats, RoomTotals, SharedStore, Store, StoreError, Verdict,
};
use crate::telemetry::Telemetry;

use super::lag::RuntimeLag;
use super::rooms::Room;

/// How long the store is left alone after a failure before one request
/// probes it again, so a frozen store does not cost every request the
/// whole timeout.
const RETRY_AFTER_FAILURE_MS: Millis = 1000;

/// When the shared store last answered anything, kept fresh by a ping a
/// few times a second (only for a store that answers across the network:
/// an in-process one always answers).
struct Liveness {
    /// Clock ms of the last answer.
    last_answer_ms: AtomicU64,
    /// A call went unanswered, and nothing answered since.
    suspect: AtomicBool,
    /// Wakes the pinger when a call goes unanswered.
    woken: tokio::sync::Notify,
}

impl Liveness {
    fn answered(&self, now: Millis) {
        self.last_answer_ms.fetch_max(now, Ordering::Relaxed);
        self.suspect.store(false, Ordering::Relaxed);
    }

    /// Whether the store answered anything within `window` before `now`.
    fn alive(&self, now: Millis, window: Duration) -> bool {
        let last = self.last_answer_ms.load(Ordering::Relaxed);
        now.saturating_sub(last) < window.as_millis() as u64
    }
}

/// Pings the store every `every` while the guard lives, each ping waiting
/// up to `window` (`store.unreachable_after`) for its answer; each answer
/// is noted when it comes. While a call has gone unanswered and nothing
/// has answered since ([`Liveness::suspect`]), pings go every
/// [`SUSPECT_PING_EVERY`], overlapping. A Redis busy in long scripts
/// answers the pings queued behind each script as it ends: late, but an
/// answer, so it is seen answering between scripts however loaded this
/// machine is (a ping bounded by the store timeout had to be sent in the
/// script's last moments and read in time, which a loaded machine
/// missed); one that answers nothing for the window is down.
async fn keep_pinging(
    liveness: std::sync::Weak<Liveness>,
    store: SharedStore,
    clock: SharedClock,
    every: Duration,
    window: Duration,
) {
    loop {
        let Some(live) = liveness.upgrade() else {
            return;
        };
        if live.suspect.load(Ordering::Relaxed) {
            tokio::time::sleep(SUSPECT_PING_EVERY).await;
        } else {
            // Woken early when a call goes unanswered.
            let _ = tokio::time::timeout(every, live.woken.notified()).await;
        }
        let (store, clock) = (store.clone(), clock.clone());
        tokio::spawn(async move {
            if let Ok(Ok(())) = tokio::time::timeout(window, store.ping(window)).await {
                live.answered(clock.now_ms());
            }
        });
    }
}

/// How often the store is pinged while a call of it went unanswered.
const SUSPECT_PING_EVERY: Duration = Duration::from_millis(10);

/// Most orphaned decisions remembered for release; beyond it the oldest are
/// dropped (their sessions then end by expiry).
const MAX_ORPHANS: usize = 100_000;

/// Orphans released per upkeep round.
const ORPHANS_PER_ROUND: usize = 1000;

/// The store as the request path sees it.
pub struct StoreGuard {
    /// The store every instance shares (memory or Redis).
    shared: SharedStore,
    /// This instance's own store for `fail_mode = "local"`.
    local: Option<Arc<MemoryStore>>,
    /// Instances sharing the store: the local share is 1/instances.
    instances: u64,
    timeout: Duration,
    /// How long the store must answer nothing before it is unreachable.
    unreachable_after: Duration,
    liveness: Arc<Liveness>,
    /// When (clock ms) a busy call was last logged.
    busy_logged_ms: AtomicU64,
    clock: SharedClock,
    telemetry: Arc<Telemetry>,
    /// Whether the last shared call failed; logs transitions once.
    down: AtomicBool,
    /// While the store is down: when (clock ms) to let one probe through.
    retry_at_ms: AtomicU64,
    /// Sessions ended here whose end the store did not record, with the
    /// policy and the ticket's expiry (`end_session`).
    ends: Mutex<Vec<(Arc<RoomPolicy>, VisitorId, Millis)>>,
    /// New visitors whose `arrive` was sent but not answered in time.
    /// (The policy and time of the arrival, by which a store can tell
    /// where the session it may have made lies.)
    orphans: Mutex<Vec<(Arc<RoomPolicy>, VisitorId, Millis)>>,
    /// How late this process runs its tasks.
    lag: Arc<RuntimeLag>,
}

impl StoreGuard {
    pub fn new(
        config: &Config,
        shared: SharedStore,
        clock: SharedClock,
        telemetry: Arc<Telemetry>,
    ) -> Self {
        let liveness = Arc::new(Liveness {
            last_answer_ms: AtomicU64::new(clock.now_ms()),
            suspect: AtomicBool::new(false),
            woken: tokio::sync::Notify::new(),
        });
        let unreachable_after = config.store.unreachable_after.max(config.store.timeout);
        if shared.answers().is_some() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let every = (unreachable_after / 4)
                    .clamp(Duration::from_millis(20), Duration::from_millis(250));
                runtime.spawn(keep_pinging(
                    Arc::downgrade(&liveness),
                    shared.clone(),
                    clock.clone(),
                    every,
                    unreachable_after,
                ));
            }
        }
        Self {
            shared,
            local: (config.store.fail_mode == FailMode::Local)
                .then(|| Arc::new(MemoryStore::new())),
            instances: config.store.instances.max(1),
            timeout: config.store.timeout,
            unreachable_after,
            liveness,
            busy_logged_ms: AtomicU64::new(0),
            clock,
            telemetry,
            down: AtomicBool::new(false),
            retry_at_ms: AtomicU64::new(0),
            orphans: Mutex::new(Vec::new()),
            ends: Mutex::new(Vec::new()),
            lag: RuntimeLag::start(),
        }
    }

    /// The runtime sampler this guard reads (tests feed it).
    pub fn lag(&self) -> &RuntimeLag {
        &self.lag
    }

    /// Whether this instance is too far behind to decide in time: its
    /// runtime ran a task a quarter of a store timeout late within the last
    /// second (an idle runtime is late by microseconds).
    fn behind(&self) -> bool {
        self.lag.recent() >= self.late_limit()
    }

    /// How late a task may run before this instance counts as behind.
    fn late_limit(&self) -> Duration {
        (self.timeout / 4).max(Duration::from_millis(5))
    }

    /// A new visitor arrives (in priority lane `lane`; 0: the general
    /// queue): `arrive` on the shared store, or, when that fails and the
    /// fail mode is `local`, on this instance's own store (with a fresh id,
    /// so the orphan's release cannot touch it).
    pub async fn arrive(
        &self,
        room: &Room,
        lane: u8,
        now: Millis,
    ) -> Result<(VisitorId, Verdict), StoreError> {
        // A store that answers across the network, far behind: shed
        // before anything is created anywhere. (An in-process store
        // decides in microseconds however late this runtime runs.)
        if self.shared.answers().is_some() && self.lag.recent() >= self.timeout / 2 {
            return Err(StoreError::Busy);
        }
        let visitor = VisitorId::random();
        let mut policy = room.policy_at(now);
        let shared = self
            .decide(room, now, |p| {
                policy = p.clone();
                async move {
                    self.shared
                        .arrive(&p, visitor, lane, Arrival::New, now)
                        .await
                }
            })
            .await;
        match shared {
            Ok(verdict) => Ok((visitor, verdict)),
            Err(e) => {
                if !matches!(e, StoreError::Down) {
                    self.orphan(policy, visitor, now);
                }
                if matches!(e, StoreError::Busy) {
                    return Err(e);
                }
                match self.local_policy(room) {
                    Some((local, policy)) => {
                        let visitor = VisitorId::random();
                        let verdict = local
                            .arrive(&policy, visitor, lane, Arrival::Known, now)
                            .await?;
                        Ok((visitor, verdict))
                    }
                    None => Err(e),
                }
            }
        }
    }

    /// A member (a verified enqueue token's `sub`) arrives under the id the
    /// room knows them by: the store gives back the session or place that
    /// id holds, or decides anew. Nothing is orphaned when the answer comes
    /// too late: the id may hold a place it earned before, and a new one
    /// made meanwhile is the member's own, found again at their next try.
    /// `unseen`: the room has not seen the member lately
    /// (`Arrival::Unseen`).
    pub async fn arrive_member(
        &self,
        room: &Room,
        visitor: VisitorId,
        lane: u8,
        unseen: bool,
        now: Millis,
    ) -> Result<Verdict, StoreError> {
        if self.shared.answers().is_some() && self.lag.recent() >= self.timeout / 2 {
            return Err(StoreError::Busy);
        }
        let kind = match unseen {
            true => Arrival::Unseen,
            false => Arrival::Known,
        };
        let shared = self
            .decide(room, now, |p| async move {
                self.shared.arrive(&p, visitor, lane, kind, now).await
            })
            .await;
        match shared {
            Err(e) if !matches!(e, StoreError::Busy) => match self.local_policy(room) {
                Some((local, policy)) => {
                    local
                        .arrive(&policy, visitor, lane, Arrival::Known, now)
                        .await
                }
                None => Err(e),
            },
            other => other,
        }
    }

    /// A queued visitor polls (from priority lane `lane`), with the same
    /// fallback as `arrive`.
    pub async fn poll(
        &self,
        room: &Room,
        visitor: VisitorId,
        lane: u8,
        seq: u64,
        now: Millis,
    ) -> Result<Verdict, StoreError> {
        match self
            .decide(room, now, |p| async move {
                self.shared.poll(&p, visitor, lane, seq, now).await
            })
            .await
        {
            Err(e) => match self.local_policy(room) {
                Some((local, policy)) => local.poll(&policy, visitor, lane, seq, now).await,
                None => Err(e),
            },
            ok => ok,
        }
    }

    /// An admitted visitor checks in, with the same fallback as `arrive`.
    pub async fn check_in(
        &self,
        room: &Room,
        visitor: VisitorId,
        ticket_expires: Millis,
        now: Millis,
    ) -> Result<Option<Millis>, StoreError> {
        match self
            .decide(room, now, |p| async move {
                self.shared.check_in(&p, visitor, ticket_expires, now).await
            })
            .await
        {
            Err(e) => match self.local_policy(room) {
                Some((local, policy)) => {
                    local.check_in(&policy, visitor, ticket_expires, now).await
                }
                None => Err(e),
            },
            ok => ok,
        }
    }

    /// Ends a visitor's session or queue place (the admin API's release;
    /// a newcomer who got a place without its proof of work).
    pub async fn release(
        &self,
        room: &Room,
        visitor: VisitorId,
        now: Millis,
    ) -> Result<bool, StoreError> {
        self.on_room(room, now, |p| async move {
            self.shared.end(&p, visitor, End::Release, now).await
        })
        .await
    }

    /// Ends an admitted visitor's session by its ticket (the origin's
    /// revoke; a ticket used from too many networks). One the store did
    /// not record (down, or too few replicas acknowledged it) is sent
    /// again at each upkeep until it is: other instances would otherwise
    /// keep counting the session at its check-ins, and a failover could
    /// bring it back.
    pub async fn end_session(
        &self,
        room: &Room,
        visitor: VisitorId,
        ticket_expires: Millis,
        now: Millis,
    ) -> Result<bool, StoreError> {
        let result = self
            .on_room(room, now, |p| async move {
                self.shared
                    .end(&p, visitor, End::Session(ticket_expires), now)
                    .await
            })
            .await;
        if result.is_err() {
            let mut ends = self.ends.lock().unwrap_or_else(PoisonError::into_inner);
            if ends.len() >= MAX_ORPHANS {
                ends.remove(0);
            }
            ends.push((room.policy_at(now), visitor, ticket_expires));
        }
        result
    }

    /// Ends of sessions not recorded yet (see `end_session`).
    pub fn unrecorded_ends(&self) -> usize {
        self.ends
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Sends the unrecorded ends again (off the request path).
    async fn record_ends(&self) {
        let batch: Vec<_> = {
            let mut ends = self.ends.lock().unwrap_or_else(PoisonError::into_inner);
            let n = ends.len().min(ORPHANS_PER_ROUND);
            ends.drain(..n).collect()
        };
        for (i, (policy, visitor, expires)) in batch.iter().enumerate() {
            let now = self.clock.now_ms();
            let end = self
                .shared
                .end(policy, *visitor, End::Session(*expires), now);
            if self.call(end).await.is_err() {
                let mut ends = self.ends.lock().unwrap_or_else(PoisonError::into_inner);
                ends.extend(batch[i..].iter().cloned());
                return;
            }
        }
        if !batch.is_empty() {
            tracing::info!(
                ended = batch.len(),
                "recorded session ends the store had missed"
            );
        }
    }

    /// The room's live figures (the store's periodic maintenance runs too).
    pub async fn stats(&self, room: &Room, now: Millis) -> Result<RoomStats, StoreError> {
        self.on_room(
            room,
            now,
            |p| async move { self.shared.stats(&p, now).await },
        )
        .await
    }

    /// What is violated of the invariants of the room's store layout.
    pub async fn check(&self, room: &Room, now: Millis) -> Result<Vec<String>, StoreError> {
        self.on_room(
            room,
            now,
            |p| async move { self.shared.check(&p, now).await },
        )
        .await
    }

    /// The room's cumulative counts.
    pub async fn totals(&self, room: &Room) -> Result<RoomTotals, StoreError> {
        self.call(self.shared.totals(&room.policy())).await
    }

    /// Empties the room (the admin API's reset).
    pub async fn reset(&self, room: &Room, now: Millis) -> Result<(), StoreError> {
        self.on_room(
            room,
            now,
            |p| async move { self.shared.reset(&p, now).await },
        )
        .await
    }

    /// Starts the event `start` describes (once however many ask).
    pub async fn start_event(
        &self,
        room: &Room,
        start: &EventStart,
        now: Millis,
    ) -> Result<u64, StoreError> {
        self.on_room(room, now, |p| async move {
            self.shared.start_event(&p, start, now).await
        })
        .await
    }

    /// Notes `members` in one of the room's expiring sets (see [`Store::note`]).
    pub async fn note(
        &self,
        room: &Room,
        set: &str,
        members: &[u64],
        until: Millis,
        now: Millis,
    ) -> Result<crate::store::Noted, StoreError> {
        self.call(self.shared.note(&room.config.id, set, members, until, now))
            .await
    }

    /// Takes single-use members back out of a note set (`Store::forget`).
    pub async fn forget(&self, room: &Room, set: &str, members: &[u64]) -> Result<u64, StoreError> {
        self.call(self.shared.forget(&room.config.id, set, members))
            .await
    }

    /// The operators' runtime changes to the room.
    pub async fn overrides(&self, room: &str) -> Result<Option<RoomOverrides>, StoreError> {
        self.call(self.shared.overrides(room)).await
    }

    /// Replaces the operators' runtime changes to the room.
    pub async fn set_overrides(
        &self,
        room: &str,
        overrides: &RoomOverrides,
    ) -> Result<(), StoreError> {
        self.call(self.shared.set_overrides(room, Some(overrides)))
            .await
    }

    /// Adds this instance's share of a minute to the room's report.
    pub async fn report_add(
        &self,
        room: &str,
        minute: u64,
        add: &crate::store::ReportMinute,
        keep_until: Millis,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.call(self.shared.report_add(room, minute, add, keep_until, now))
            .await
    }

    /// The room's report minutes in `from..=to`.
    pub async fn report_read(
        &self,
        room: &str,
        from: u64,
        to: u64,
        now: Millis,
    ) -> Result<Vec<(u64, crate::store::ReportMinute)>, StoreError> {
        self.call(self.shared.report_read(room, from, to, now))
            .await
    }

    /// The store's periodic upkeep, and the writes it holds back per room
    /// (off the request path; skipped while the store is down).
    pub async fn upkeep(&self, rooms: &[Arc<Room>], now: Millis) {
        self.shared.upkeep().await;
        if self.is_up() {
            for room in rooms {
                self.shared.flush(&room.policy_at(now), now).await;
            }
        }
    }

    /// The store every instance shares, unguarded (a reload keeps it).
    pub fn shared(&self) -> &SharedStore {
        &self.shared
    }

    /// Runs any other call on the shared store, bounded and skipped while
    /// the store is known to be down.
    pub async fn call<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        if !self.may_call() {
            return Err(StoreError::Down);
        }
        let started = Instant::now();
        let answers = self.shared.answers();
        let result = match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout),
        };
        if let Err(StoreError::Timeout) = result {
            // Its own or the store's: a timer that fired late, or a runtime
            // seen late a moment ago, means the answer may well have come
            // and this instance did not read it in time. Not a store
            // failure (no breaker, no fail_mode).
            // How long a task waits for its turn right now: the sampler
            // sees a saturated runtime only once it gets its own turn.
            let asked = Instant::now();
            tokio::task::yield_now().await;
            let waited = asked.elapsed();
            let late = started.elapsed().saturating_sub(self.timeout).max(waited);
            self.lag.record(late);
            // Answers kept coming while this one did not: the store is up.
            let answered = answers.is_some() && self.shared.answers() > answers;
            if answered || late >= self.late_limit() || self.behind() {
                return Err(StoreError::Busy);
            }
        }
        let now = self.clock.now_ms();
        match &result {
            // The store said something: it is there.
            Ok(_) | Err(StoreError::Stale(_) | StoreError::Layout(_) | StoreError::Protocol(_)) => {
                self.liveness.answered(now)
            }
            Err(StoreError::Busy) => {}
            // No answer to this call. Busy, unless the store has answered
            // nothing at all (no call, no ping) for the whole window.
            Err(StoreError::Timeout | StoreError::Unavailable(_) | StoreError::Down) => {
                // (Answers to other calls while this one waited count.)
                if answers.is_some() && self.shared.answers() > answers {
                    self.liveness.answered(now);
                } else if !self.liveness.suspect.swap(true, Ordering::Relaxed) {
                    self.liveness.woken.notify_one();
                }
                if self.liveness.alive(now, self.unreachable_after) {
                    self.telemetry.metrics.store_busy();
                    self.log_busy(now, &result);
                    return Err(StoreError::Busy);
                }
            }
        }
        self.record(&result);
        result
    }

    /// Says in the log, at most once a second, that a call got no answer
    /// from a store that still answers (busy, not unreachable).
    fn log_busy<T>(&self, now: Millis, result: &Result<T, StoreError>) {
        let last = self.busy_logged_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 1000
            && self
                .busy_logged_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            if let Err(e) = result {
                tracing::warn!(
                    error = %e,
                    "store busy: a call got no answer in time, but the store answers; answered \"busy, retry\", store.fail_mode not applied"
                );
            }
        }
    }

    /// Whether the shared store answered the last call.
    pub fn is_up(&self) -> bool {
        !self.down.load(Ordering::Relaxed)
    }

    /// Releases visitors whose `arrive` may have landed after its caller gave
    /// up, and records the session ends the store missed (called off the
    /// request path while the store is up).
    pub async fn release_orphans(&self) {
        if !self.is_up() {
            return;
        }
        self.record_ends().await;
        let batch: Vec<_> = {
            let mut orphans = self.orphans.lock().unwrap_or_else(PoisonError::into_inner);
            let n = orphans.len().min(ORPHANS_PER_ROUND);
            orphans.drain(..n).collect()
        };
        let mut released = 0u64;
        for (i, (policy, visitor, arrived)) in batch.iter().enumerate() {
            let now = self.clock.now_ms();
            let release = self
                .shared
                .end(policy, *visitor, End::Arrival(*arrived), now);
            match self.call(release).await {
                Ok(true) => released += 1,
                Ok(false) => {}
                Err(_) => {
                    // Still down: keep the rest for the next round.
                    let mut orphans = self.orphans.lock().unwrap_or_else(PoisonError::into_inner);
                    orphans.extend(batch[i..].iter().cloned());
                    break;
                }
            }
        }
        if released > 0 {
            tracing::info!(
                released,
                "released sessions and queue places of decisions that timed out"
            );
        }
    }

    /// Orphans waiting for release (for tests and metrics).
    pub fn orphans(&self) -> usize {
        self.orphans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn orphan(&self, policy: Arc<RoomPolicy>, visitor: VisitorId, arrived: Millis) {
        let mut orphans = self.orphans.lock().unwrap_or_else(PoisonError::into_inner);
        if orphans.len() >= MAX_ORPHANS {
            orphans.remove(0);
        }
        orphans.push((policy, visitor, arrived));
    }

    /// A decision on the room's policy in force at `now`. When the store
    /// holds newer runtime changes than this instance has applied (an
    /// operator changed the room through another instance a moment ago),
    /// it refuses to decide on the old ones: the changes are read and the
    /// decision asked again, once, so nobody is told "queued" under a
    /// limit already raised, nor admitted under one already lowered.
    async fn decide<T, F, Fut>(&self, room: &Room, now: Millis, call: F) -> Result<T, StoreError>
    where
        F: FnMut(Arc<RoomPolicy>) -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        self.on_policy(room, now, call, true).await
    }

    /// `decide` for calls that are no visitor's decision (figures,
    /// operators' actions): their latency is not a decision's.
    async fn on_room<T, F, Fut>(&self, room: &Room, now: Millis, call: F) -> Result<T, StoreError>
    where
        F: FnMut(Arc<RoomPolicy>) -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        self.on_policy(room, now, call, false).await
    }

    async fn on_policy<T, F, Fut>(
        &self,
        room: &Room,
        now: Millis,
        call: F,
        decision: bool,
    ) -> Result<T, StoreError>
    where
        F: FnMut(Arc<RoomPolicy>) -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let mut call = call;
        let run = |fut| async move {
            if decision {
                self.timed(room, fut).await
            } else {
                self.call(fut).await
            }
        };
        match run(call(room.policy_at(now))).await {
            Err(StoreError::Stale(revision)) => {
                tracing::debug!(room = %room.config.id, revision, "room settings changed elsewhere; reading them");
                match self.call(self.shared.overrides(&room.config.id)).await {
                    Ok(o) => {
                        room.apply_overrides(o.as_ref());
                    }
                    Err(e) => return Err(e),
                }
                run(call(room.policy_at(now))).await
            }
            result => result,
        }
    }

    /// A decision on the shared store, with its latency recorded.
    async fn timed<T>(
        &self,
        room: &Room,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = self.call(call).await;
        if !matches!(result, Err(StoreError::Down)) {
            room.metrics
                .decision_latency
                .observe(started.elapsed().as_secs_f64());
        }
        result
    }

    /// This instance's own store and its share of the room's limits (every
    /// limit divided by the number of instances, rounded up).
    fn local_policy(&self, room: &Room) -> Option<(&MemoryStore, RoomPolicy)> {
        let local = self.local.as_deref()?;
        let mut policy = (*room.policy()).clone();
        let share = |limit: u64| limit.div_ceil(self.instances);
        policy.total_active_users = share(policy.total_active_users);
        policy.new_users_per_minute = share(policy.new_users_per_minute);
        Some((local, policy))
    }

    /// False while the store is down and the next probe is not yet due;
    /// exactly one caller gets to probe.
    fn may_call(&self) -> bool {
        let retry_at = self.retry_at_ms.load(Ordering::Relaxed);
        if retry_at == 0 {
            return true;
        }
        let now = self.clock.now_ms();
        now >= retry_at
            && self
                .retry_at_ms
                .compare_exchange(
                    retry_at,
                    now + RETRY_AFTER_FAILURE_MS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    fn record<T>(&self, result: &Result<T, StoreError>) {
        // A refusal of stale settings is an answer: the store is up; so is
        // a call this instance was too busy to make or read in time.
        let failed =
            result.is_err() && !matches!(result, Err(StoreError::Stale(_) | StoreError::Busy));
        let retry_at = if failed {
            (self.clock.now_ms() + RETRY_AFTER_FAILURE_MS).max(1)
        } else {
            0
        };
        self.retry_at_ms.store(retry_at, Ordering::Relaxed);
        if failed {
            self.telemetry.metrics.store_error();
        }
        if self.down.swap(failed, Ordering::Relaxed) != failed {
            self.telemetry.metrics.set_store_up(!failed);
            match result {
                Err(e) => tracing::error!(
                    error = %e,
                    window_ms = self.unreachable_after.as_millis() as u64,
                    "store unreachable (no answer to any call or ping within the window); store.fail_mode applies"
                ),
                Ok(_) => tracing::info!("store available again"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::domain::RoomOverrides;
    use crate::store::{Arrival, End, RoomStats, RoomTotals, Store, StoreError, Verdict};
    use async_trait::async_trait;

    /// A store that carries out each decision and then answers too late, as
    /// Redis does when its reply is delayed past the caller's timeout.
    struct LateStore(MemoryStore);

    impl crate::store::Maintenance for LateStore {}

    #[async_trait]
    impl crate::store::Reports for LateStore {
        async fn report_add(
            &self,
            room: &str,
            minute: u64,
            add: &crate::store::ReportMinute,
            until: Millis,
            now: Millis,
        ) -> Result<(), StoreError> {
            self.0.report_add(room, minute, add, until, now).await
        }
        async fn report_read(
            &self,
            room: &str,
            from: u64,
            to: u64,
            now: Millis,
        ) -> Result<Vec<(u64, crate::store::ReportMinute)>, StoreError> {
            self.0.report_read(room, from, to, now).await
        }
    }

    #[async_trait]
    impl Store for LateStore {
        async fn arrive(
            &self,
            r: &RoomPolicy,
            v: VisitorId,
            lane: u8,
            kind: Arrival,
            now: Millis,
        ) -> Result<Verdict, StoreError> {
            let verdict = self.0.arrive(r, v, lane, kind, now).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            verdict
        }
        async fn poll(
            &self,
            r: &RoomPolicy,
            v: VisitorId,
            lane: u8,
            seq: u64,
            now: Millis,
        ) -> Result<Verdict, StoreError> {
            self.0.poll(r, v, lane, seq, now).await
        }
        async fn check_in(
            &self,
            r: &RoomPolicy,
            v: VisitorId,
            t: Millis,
            now: Millis,
        ) -> Result<Option<Millis>, StoreError> {
            self.0.check_in(r, v, t, now).await
        }
        async fn end(
            &self,
            r: &RoomPolicy,
            v: VisitorId,
            end: End,
            now: Millis,
        ) -> Result<bool, StoreError> {
            self.0.end(r, v, end, now).await
        }
        async fn stats(&self, r: &RoomPolicy, now: Millis) -> Result<RoomStats, StoreError> {
            self.0.stats(r, now).await
        }
        async fn totals(&self, r: &RoomPolicy) -> Result<RoomTotals, StoreError> {
            self.0.totals(r).await
        }
        async fn reset(&self, r: &RoomPolicy, now: Millis) -> Result<(), StoreError> {
            self.0.reset(r, now).await
        }
        async fn start_event(
            &self,
            r: &RoomPolicy,
            e: &crate::store::EventStart,
            now: Millis,
        ) -> Result<u64, StoreError> {
            self.0.start_event(r, e, now).await
        }
        async fn note(
            &self,
            room: &str,
            set: &str,
            members: &[u64],
            until: Millis,
            now: Millis,
        ) -> Result<crate::store::Noted, StoreError> {
            self.0.note(room, set, members, until, now).await
        }
        async fn forget(&self, room: &str, set: &str, members: &[u64]) -> Result<u64, StoreError> {
            self.0.forget(room, set, members).await
        }
        async fn overrides(&self, room: &str) -> Result<Option<RoomOverrides>, StoreError> {
            self.0.overrides(room).await
        }
        async fn set_overrides(
            &self,
            room: &str,
            o: Option<&RoomOverrides>,
        ) -> Result<(), StoreError> {
            self.0.set_overrides(room, o).await
        }
    }

    #[tokio::test]
    async fn a_decision_answered_too_late_is_released_once_the_store_is_back() {
        let config = crate::config::test_shop(2, r#"timeout = "20ms""#);
        let clock = ManualClock::new(1_800_000_000_000);
        let shared: SharedClock = Arc::new(clock.clone());
        let telemetry = Arc::new(Telemetry::default());
        let store = Arc::new(LateStore(MemoryStore::new()));
        let guard = StoreGuard::new(&config, store.clone(), shared.clone(), telemetry.clone());
        let room = Room::new(
            config.rooms[0].clone(),
            crate::queue_page::Template::builtin(),
            Vec::new(),
            telemetry.metrics.room("shop"),
            shared,
        );
        let now = clock.now_ms();
        // Two newcomers time out, though the store admitted both.
        for _ in 0..2 {
            clock.advance(Duration::from_secs(1));
            let err = guard.arrive(&room, 0, clock.now_ms()).await.unwrap_err();
            assert!(matches!(err, StoreError::Timeout), "{err:?}");
        }
        let policy = room.policy();
        assert_eq!(store.stats(&policy, now).await.unwrap().active, 2, "ghosts");
        assert_eq!(guard.orphans(), 2);
        // Nothing is released while the store is down.
        guard.release_orphans().await;
        assert_eq!(guard.orphans(), 2);
        // The next probe finds it up; the upkeep then releases both.
        clock.advance(Duration::from_secs(1));
        guard
            .call(store.stats(&policy, clock.now_ms()))
            .await
            .unwrap();
        guard.release_orphans().await;
        assert_eq!(guard.orphans(), 0);
        let stats = store.stats(&policy, clock.now_ms()).await.unwrap();
        assert_eq!(stats.active, 0, "no ghost outlives the outage");
    }
}
