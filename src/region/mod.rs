//! Region mode: regional counters, a global store and
//! the Anywhere pool. See `docs/regions.md` for the design and the
//! argument that capacity (I1) is never exceeded.
//!
//! Each region's instances share a regional Redis (`store.url`), where a
//! room's capacity is the region's *grant* (`store::redis::region`). The
//! global Redis (`region.global_url`) holds, per room, every region's grant
//! (as two growing totals, raised and returned) and its last report. This
//! module is the global half:
//!
//! * [`Region::sync_room`], run every `sync_interval` per room by one
//!   instance of the region (off the request path): report the room's
//!   active sessions, recent arrivals and oldest waiting visitor; receive
//!   the new grant (a share of the free slots, following queue backlog
//!   first and then traffic) and the other regions' oldest waiting visitor
//!   (the FIFO bound); lower the grant locally first when asked to, and
//!   report that.
//! * [`Region`] as `Anywhere`: a new visitor who finds the region's slots
//!   used up asks the global store for a slot of the Anywhere pool (one
//!   cross-region round trip) before being queued.
//!
//! When the global store cannot be reached the region keeps deciding within
//! the grant it holds (never raising it), says so in the
//! `waitroom_region_degraded` gauge and one log line per transition, and
//! resumes at the next successful sync.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

mod global;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};
use tokio::sync::watch;

use crate::clock::Millis;
use crate::config::RegionConfig;
use crate::domain::RoomPolicy;
use crate::gate::SharedGate;
use crate::store::redis::region::{Anywhere, Bound, RateGrant};
use crate::store::redis::{bounded, map_error, RedisStore};
use crate::store::{StoreError, SEQ_PER_MS};
use crate::telemetry::Telemetry;
use global::GlobalCall;
pub use global::Taken;

/// Share of the free slots (permille) left in the Anywhere pool at each
/// sync rather than handed to a region (measured: see docs/regions.md).
pub const DEFAULT_RESERVE_PERMILLE: u64 = 200;

/// A region that has not reported for this many sync intervals is not
/// live: its waiting visitors no longer hold others back, and its grant
/// counts as fully used (it is never taken from it; see docs/regions.md).
pub const LEASE_INTERVALS: u32 = 3;

/// The global store's key for a room (one hash tag per room, as the
/// regional keys, so a Cluster can hold the global store too).
fn regions_key(room: &str) -> String {
    format!("wrg:{{{room}}}:regions")
}

/// What the global store answered a sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncReply {
    /// This region's totals in the global store.
    pub raised: u64,
    pub(crate) returned: u64,
    /// The grant the global store wants this region to hold now.
    pub target: u64,
    /// The oldest `seq` waiting in another live region (0: none).
    pub bound: u64,
    /// Slots no region's grant holds (the Anywhere pool) after this sync.
    pub free: u64,
    /// This region's admission-token totals in the global store, and the
    /// rate grant it wants the region to hold (all 0 for an unrated room).
    pub rate_raised: u64,
    pub(crate) rate_returned: u64,
    pub(crate) rate_target: u64,
}

/// What one sync of one room did (for tests, the benchmark and logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Synced {
    /// Another instance of the region holds the sync turn, or the room has
    /// neither a capacity nor a rate limit.
    Skipped,
    /// The global store answered; the grant in force is `grant`.
    Done {
        /// The region's grant now.
        grant: u64,
        /// The global store's answer.
        reply: SyncReply,
    },
    /// The global store did not answer: the region keeps `grant`.
    Degraded {
        /// The grant the region held before.
        grant: u64,
    },
}

/// One region's link to the global store.
pub struct Region {
    name: Arc<str>,
    client: redis::Client,
    conn: Mutex<Option<ConnectionManager>>,
    /// Bound on an Anywhere call (it is on a new visitor's path).
    request_timeout: Duration,
    sync_interval: Duration,
    reserve_permille: u64,
    sync: Script,
    anywhere: Script,
    degraded: AtomicBool,
    telemetry: Option<Arc<Telemetry>>,
    /// The clock time of the last round [`Region::run`] finished (0: none
    /// yet), so tests wait for a round instead of sleeping.
    rounds: watch::Sender<Millis>,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("name", &self.name)
            .field("sync_interval", &self.sync_interval)
            .finish()
    }
}

impl Region {
    /// A link to the global store; it connects on first use, so a region
    /// starts (degraded) even when the global store is away.
    /// `request_timeout` bounds an Anywhere call (use `store.timeout`).
    pub fn new(
        config: &RegionConfig,
        request_timeout: Duration,
        telemetry: Option<Arc<Telemetry>>,
    ) -> Result<Self, StoreError> {
        let client = redis::Client::open(config.global_url.as_str()).map_err(|e| map_error(&e))?;
        let [(_, sync), (_, anywhere)] = scripts();
        Ok(Self {
            name: Arc::from(config.name.as_str()),
            client,
            conn: Mutex::new(None),
            request_timeout,
            sync_interval: config.sync_interval,
            reserve_permille: DEFAULT_RESERVE_PERMILLE,
            sync: Script::new(&sync),
            anywhere: Script::new(&anywhere),
            degraded: AtomicBool::new(false),
            telemetry,
            rounds: watch::Sender::new(0),
        })
    }

    /// Changes the share of free slots kept in the Anywhere pool (permille;
    /// the benchmark compares a few).
    pub fn with_reserve_permille(mut self, permille: u64) -> Self {
        self.reserve_permille = permille.min(1000);
        self
    }

    /// Whether the last call to the global store failed.
    pub fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }

    fn lease_ms(&self) -> Millis {
        (self.sync_interval * LEASE_INTERVALS).as_millis() as Millis
    }

    /// The global connection, made on first use (and again after a failed
    /// first attempt); once made it reconnects on its own.
    async fn conn(&self, timeout: Duration) -> Result<ConnectionManager, StoreError> {
        if let Some(c) = self
            .conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Ok(c);
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_secs(1));
        let c = bounded(
            timeout,
            ConnectionManager::new_with_config(self.client.clone(), config),
        )
        .await??;
        *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = Some(c.clone());
        Ok(c)
    }

    /// Runs one global script, bounded by `timeout`.
    async fn call(
        &self,
        timeout: Duration,
        inv: &redis::ScriptInvocation<'_>,
    ) -> Result<Value, StoreError> {
        let mut conn = self.conn(timeout).await?;
        bounded(timeout, inv.invoke_async::<Value>(&mut conn)).await?
    }

    /// Records the outcome of a global call: the degraded gauge, the
    /// failure counter and one log line per transition.
    fn outcome<T>(&self, result: &Result<T, StoreError>) {
        let failed = result.is_err();
        let was = self.degraded.swap(failed, Ordering::Relaxed);
        if let Some(t) = &self.telemetry {
            if failed {
                t.metrics.region.sync_failed();
            }
            t.metrics.region.set_degraded(failed);
        }
        match (was, result) {
            (false, Err(e)) => tracing::warn!(
                region = %self.name,
                error = %e,
                "global store unreachable: the region decides within the grants it holds"
            ),
            (true, Ok(_)) => tracing::info!(
                region = %self.name,
                "global store reachable again: grants follow traffic again"
            ),
            _ => {}
        }
    }

    /// One sync of `room` (see the module docs). `force` takes the sync
    /// turn even if another instance of the region holds it (tests).
    pub async fn sync_room(
        &self,
        store: &RedisStore,
        room: &RoomPolicy,
        now_ms: Millis,
        force: bool,
    ) -> Result<Synced, StoreError> {
        if room.total_active_users == 0 && room.new_users_per_minute == 0 {
            return Ok(Synced::Skipped);
        }
        let interval_ms = self.sync_interval.as_millis() as Millis;
        // Slightly under an interval, so the next tick (any instance) takes it.
        let turn_ms = interval_ms.saturating_mul(4) / 5;
        let Some(snap) = store.region_begin(room, now_ms, turn_ms, force).await? else {
            return Ok(Synced::Skipped);
        };
        let report = global::Sync {
            reserve_permille: self.reserve_permille,
            active: snap.active,
            lowered: snap.lowered,
            queued: snap.queued,
            head_seq: snap.head_seq,
            arrivals: snap.arrivals,
            only_lowered: false,
            samples: snap.samples_text(),
            rate: room.new_users_per_minute,
            window: snap.window,
            rate_lowered: snap.rate_lowered,
        };
        // Off the request path: a slow global store may take up to an interval.
        let timeout = self.sync_interval.max(self.request_timeout);
        let reply = self
            .global(timeout, &self.sync, room, now_ms, &report)
            .await;
        self.outcome(&reply);
        let reply = match reply {
            Ok(r) => r,
            Err(_) => {
                self.publish_grant(room, snap.grant());
                return Ok(Synced::Degraded {
                    grant: snap.grant(),
                });
            }
        };
        let bound = if reply.bound > 0 {
            Bound::Seq {
                // Everyone who arrived in the frontier's millisecond: the
                // order within one millisecond across regions is a tie.
                seq: (reply.bound / SEQ_PER_MS + 1) * SEQ_PER_MS - 1,
                until_ms: now_ms + self.lease_ms(),
            }
        } else {
            Bound::None
        };
        let applied = store
            .region_apply(
                room,
                now_ms,
                reply.raised,
                reply.returned,
                Some(reply.target),
                bound,
                RateGrant {
                    raised: reply.rate_raised,
                    returned: reply.rate_returned,
                    target: Some(reply.rate_target),
                },
            )
            .await?;
        if applied.given > 0 || applied.rate_given > 0 {
            // Given back here first; now the global store may hand them out.
            let given_back = global::Sync {
                reserve_permille: self.reserve_permille,
                lowered: applied.lowered,
                only_lowered: true,
                rate: room.new_users_per_minute,
                rate_lowered: applied.rate_lowered,
                ..global::Sync::default()
            };
            let r = self
                .global(timeout, &self.sync, room, now_ms, &given_back)
                .await;
            self.outcome(&r);
        }
        self.publish_grant(room, applied.grant());
        if let Some(t) = &self.telemetry {
            if room.new_users_per_minute > 0 {
                t.metrics.region.set_rate_grant(
                    &room.room,
                    applied.rate_raised.saturating_sub(applied.rate_lowered),
                );
            }
        }
        Ok(Synced::Done {
            grant: applied.grant(),
            reply,
        })
    }

    fn publish_grant(&self, room: &RoomPolicy, grant: u64) {
        if let Some(t) = &self.telemetry {
            t.metrics.region.set_grant(&room.room, grant);
        }
    }

    /// Runs `call` of a global script about `room`, bounded by `timeout`:
    /// the room's key, the arguments every one of them starts with (the
    /// time, this region, the room's limit and the lease), then its own.
    async fn global<C: GlobalCall>(
        &self,
        timeout: Duration,
        script: &Script,
        room: &RoomPolicy,
        now_ms: Millis,
        call: &C,
    ) -> Result<C::Reply, StoreError> {
        let mut inv = script.prepare_invoke();
        inv.key(regions_key(&room.room));
        let common = [
            now_ms.to_string(),
            self.name.to_string(),
            room.total_active_users.to_string(),
            self.lease_ms().to_string(),
        ];
        let common = global::COMMON_ARGS.into_iter().zip(common).collect();
        global::put(&mut inv, &global::COMMON_ARGS, common);
        global::put(&mut inv, C::ARGS, call.args());
        C::decode(&self.call(timeout, &inv).await?)
    }

    /// Asks the global store for up to `wanted` Anywhere slots of `room`
    /// (and as many admission tokens, for a rated room), as `Anywhere`
    /// applies them.
    pub async fn take_anywhere(
        &self,
        room: &RoomPolicy,
        wanted: u64,
        now_ms: Millis,
    ) -> Result<Taken, StoreError> {
        let call = global::Anywhere {
            wanted,
            rate: room.new_users_per_minute,
        };
        let reply = self
            .global(self.request_timeout, &self.anywhere, room, now_ms, &call)
            .await;
        self.outcome(&reply);
        reply
    }

    /// Syncs every room with a capacity limit each `sync_interval` of the
    /// daemon's clock until `stop`. Every instance of the region runs this;
    /// one of them per interval does the work (the sync turn in the
    /// regional store). On a test's manual clock a round runs when the
    /// test moves the clock past the next one, never on real time.
    pub async fn run(
        self: Arc<Self>,
        store: RedisStore,
        gates: SharedGate,
        mut stop: watch::Receiver<bool>,
    ) {
        let interval_ms = (self.sync_interval.as_millis() as Millis).max(1);
        let mut next = gates.load().clock.now_ms();
        loop {
            let gate = gates.load_full();
            // A clock set back waits one interval, not until it catches up.
            next = next.min(gate.clock.now_ms().saturating_add(interval_ms));
            tokio::select! {
                _ = gate.clock.sleep_until(next) => {}
                _ = stop.changed() => return,
            }
            let now = gate.clock.now_ms();
            for room in gate.rooms.all() {
                let policy = room.policy_at(now);
                if let Err(e) = self.sync_room(&store, &policy, now, false).await {
                    tracing::debug!(room = %policy.room, error = %e, "region sync: regional store did not answer");
                }
            }
            self.rounds.send_replace(now);
            next = now.saturating_add(interval_ms);
        }
    }

    /// Follows the rounds of [`Region::run`]: the value is the clock time
    /// the last finished round ran at (0 before the first).
    pub fn rounds(&self) -> watch::Receiver<Millis> {
        self.rounds.subscribe()
    }
}

#[async_trait]
impl Anywhere for Region {
    async fn take(
        &self,
        store: &RedisStore,
        room: &RoomPolicy,
        wanted: u64,
        now_ms: Millis,
    ) -> u64 {
        if self.is_degraded() {
            // Each visitor would wait out the timeout for nothing; the
            // background sync finds out when the global store is back.
            return 0;
        }
        let Ok(Taken {
            raised,
            returned,
            slots,
            tokens,
            rate,
        }) = self.take_anywhere(room, wanted, now_ms).await
        else {
            return 0;
        };
        let given = slots.max(tokens);
        if given == 0 {
            return 0;
        }
        if let Some(t) = &self.telemetry {
            t.metrics.region.anywhere(&room.room, given);
        }
        if let Err(e) = store
            .region_apply(room, now_ms, raised, returned, None, Bound::Keep, rate)
            .await
        {
            // The next sync brings the regional totals up to the global ones.
            tracing::debug!(room = %room.room, error = %e, "Anywhere slots not applied yet");
        }
        // A visitor of a room with both limits needs a slot and a token.
        if room.total_active_users > 0 && room.new_users_per_minute > 0 {
            slots.min(tokens)
        } else {
            given
        }
    }
}

/// The global region scripts as they are sent (`lua/region_sync.lua`,
/// `lua/region_anywhere.lua`, each after the argument positions and
/// `lua/region_record.lua`), by file name: for tools that check the Lua
/// (`tests/lint.rs`).
pub fn scripts() -> [(&'static str, String); 2] {
    [
        (
            "region_sync.lua",
            global::script(
                global::Sync::ARGS,
                include_str!("../store/redis/lua/region_sync.lua"),
            ),
        ),
        (
            "region_anywhere.lua",
            global::script(
                global::Anywhere::ARGS,
                include_str!("../store/redis/lua/region_anywhere.lua"),
            ),
        ),
    ]
}
