//! The Redis store (single node or Cluster): every decision one Lua script.
//!
//! Each room lives in keys that share the hash tag `{room}`, so every
//! script touches one slot and the same scripts run on a single Redis and on
//! Redis Cluster. The decision logic is in `lua/*.lua` (see `lua/lib/ctx.lua`
//! for the key layout and arguments); this module builds the calls, bounds
//! each one by the store timeout and decodes the answers. Two things keep
//! the cost per visitor on Redis low:
//!
//! * `arrivals`: concurrent new visitors to a room are decided together,
//!   in one call;
//! * `frontier`: queued visitors far from the front are answered from a
//!   description of the queue each instance refreshes a few times a
//!   second, and their polls are written in one command per refresh.
//!
//! Time always comes from the caller (`now_ms` is a script argument, never
//! Redis `TIME`), so tests move a clock on Redis exactly as on the memory store.
//!
//! The files, one job each:
//!
//! * `conn`: reaching Redis (one node, the Sentinels' primary, a Cluster)
//!   and running calls on it, each bounded by the store timeout and, with
//!   acknowledgements on, waiting for the replicas;
//! * `server`: the server's clock (each call's deadline) and its primary's
//!   replication history (a loss holds the rooms);
//! * `drain`: deciding a room's new visitors a batch a call (`arrivals`
//!   keeps those waiting), and region mode's Anywhere pool;
//! * `poll`: polls and lane calls, and refreshing the queue descriptions
//!   (`frontier`);
//! * `ends`: ending sessions, and ending them again after a loss;
//! * `region`: region mode's regional half;
//! * `library`: the room functions; `wire`: their arguments and answers;
//!   `keys`: the names of a room's keys; `follow`: the primary the
//!   Sentinels name, across failovers.
//!
//! This file keeps the types, the room's key names and the `Store` and
//! `Maintenance` impls, which call into the files above.

mod arrivals;
mod calls;
mod conn;
mod drain;
mod ends;
mod follow;
pub(crate) mod frontier;
pub mod keys;
mod library;
mod poll;
pub(crate) mod region;
mod server;
mod wire;

pub(crate) use conn::{bounded, map_error};
pub use library::function_library;
pub use wire::{Layout, LAYOUT_VERSION};

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::{Script, Value};

use super::{
    Arrival, End, EventStart, Maintenance, Millis, Noted, ReportMinute, Reports, RoomOverrides,
    RoomPolicy, RoomStats, RoomTotals, Store, StoreError, Verdict, VisitorId, RATE_WINDOW_MS,
};
use arrivals::Arrivals;
use calls::Call;
use conn::{Connection, Handle};
use ends::{Expiry, RecentEnd};
use frontier::Frontiers;
use library::Library;
use wire::{as_u64, ints, protocol, LaneOp};

/// How long room keys outlive the longest-lived thing in them, so an idle
/// room disappears on its own but a live one never loses state to expiry.
const KEY_TTL_MARGIN_MS: Millis = 60 * 60 * 1000;

/// The scripts outside the room library (`library`), hashed once; `Script`
/// sends EVALSHA and loads the script on NOSCRIPT (after a restart,
/// `SCRIPT FLUSH` or a failover).
struct Scripts {
    totals: Script,
    overrides: Script,
    set_overrides: Script,
    note: Script,
    epoch: Script,
    report_add: Script,
    report_read: Script,
}

impl Scripts {
    fn new() -> Self {
        Self {
            totals: Script::new(include_str!("lua/totals.lua")),
            overrides: Script::new(include_str!("lua/overrides.lua")),
            set_overrides: Script::new(include_str!("lua/set_overrides.lua")),
            note: Script::new(include_str!("lua/note.lua")),
            epoch: Script::new(include_str!("lua/epoch.lua")),
            report_add: Script::new(include_str!("lua/report_add.lua")),
            report_read: Script::new(include_str!("lua/report_read.lua")),
        }
    }
}

/// Where the store finds Redis.
#[derive(Clone, Copy, Debug)]
pub enum Target<'a> {
    /// One Redis (one URL) or the seed nodes of a Cluster.
    Urls(&'a [String]),
    /// The primary the Sentinels monitor under a name.
    Sentinel(&'a crate::config::SentinelConfig),
}

/// How the store talks to Redis (`RedisStore::open_with`).
#[derive(Clone, Debug)]
pub struct Options {
    /// Bound on every call, reconnection and acknowledgements included.
    pub timeout: Duration,
    /// CAs (PEM) `rediss://` servers are checked against, else the system's.
    pub ca: Option<Vec<u8>>,
    /// The layout the room functions are built for.
    pub layout: Layout,
    /// Replicas that must acknowledge each writing decision (`WAIT`); 0: none.
    pub replica_acks: u32,
    /// Longest a decision waits for them.
    pub replica_ack_timeout: Duration,
}

impl Options {
    /// The production layout, no acknowledgements.
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            ca: None,
            layout: Layout::production(),
            replica_acks: 0,
            replica_ack_timeout: timeout / 2,
        }
    }
}

/// The shared store on Redis or Redis Cluster. Cheap to clone: clones
/// share the connection, the arrival batches and the queue descriptions.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Connection,
    /// The room functions (every decision).
    library: Library,
    scripts: Scripts,
    /// Bound on every call, reconnection included (I6).
    timeout: Duration,
    /// Redis server time minus this host's time, in microseconds, measured
    /// with `TIME` (`i64::MIN` until measured): what turns a call's local
    /// deadline into the server time its script checks.
    clock_offset_us: AtomicI64,
    /// New visitors waiting to be decided together.
    arrivals: Arrivals,
    /// The queue descriptions polls are answered from.
    frontiers: Frontiers,
    /// Shortest queue worth describing (`frontier::MIN_QUEUE`; tests lower it).
    frontier_min_queue: AtomicU64,
    /// Region mode (`region`): set once, before the first visitor.
    region: std::sync::OnceLock<Arc<dyn region::Anywhere>>,
    /// The layout the room functions were built for.
    layout: Layout,
    /// A room's layout was refused (logged once, loudly).
    layout_refused: std::sync::atomic::AtomicBool,
    /// What each writing call waits for (`WAIT`), if anything.
    acks: Option<library::Acks>,
    /// Whether the rooms must be marked with the primary's replication
    /// history before the next decision (`Inner::verify`): set at start
    /// and by the Sentinel follower's switch to a new primary. (The
    /// periodic upkeep verifies too, off the request path: a restarted
    /// server behind a plain URL is seen there.)
    unverified: Arc<AtomicBool>,
    /// The primary's replication id as last read (one verification at a time).
    replid: tokio::sync::Mutex<Option<String>>,
    /// Calls Redis answered (`Store::answers`).
    answers: AtomicU64,
    /// The sessions this instance ended lately (`End::Session`), sent again
    /// to a room held after a loss: a failover must not bring back a
    /// revoked session (the newest last).
    recent_ends: std::sync::Mutex<std::collections::VecDeque<RecentEnd>>,
    /// The rooms this instance decides for: name -> (hold, key TTL) in ms.
    rooms: std::sync::Mutex<HashMap<Arc<str>, (Millis, Millis)>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.inner.conn {
            Connection::Single(_) => "single",
            Connection::Cluster(_) => "cluster",
            Connection::Followed(_) => "sentinel",
        };
        f.debug_struct("RedisStore")
            .field("kind", &kind)
            .field("timeout", &self.inner.timeout)
            .finish()
    }
}

/// The key names of one room, in the order the scripts expect them.
struct RoomKeys([String; 10]);

impl RoomKeys {
    fn new(room: &str) -> Self {
        Self(keys::PASSED.map(|name| keys::room_key(room, name)))
    }

    fn meta(&self) -> &str {
        &self.0[4]
    }
}

fn key_ttl_ms(room: &RoomPolicy) -> Millis {
    let longest = (room
        .session_duration_ms
        .saturating_add(room.arrival_grace_ms))
    .max(room.abandon_after_ms)
    .max(RATE_WINDOW_MS);
    longest.saturating_add(KEY_TTL_MARGIN_MS)
}

#[async_trait]
impl Store for RedisStore {
    async fn arrive(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        lane: u8,
        kind: Arrival,
        now_ms: Millis,
    ) -> Result<Verdict, StoreError> {
        // The general queue's arrivals go through the batches (drain.rs), a
        // lane's through `lua/lane.lua` (its op as `kind`).
        if crate::store::lane_index(room, lane)? == 0 {
            return self.arrive_in_batch(room, visitor, kind, now_ms).await;
        }
        let op = match kind {
            Arrival::Known => LaneOp::Arrive,
            Arrival::New => LaneOp::ArriveNew,
            Arrival::Unseen => LaneOp::ArriveUnseen,
        };
        self.inner.in_lane(room, visitor, lane, op, 0, now_ms).await
    }

    async fn poll(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        lane: u8,
        seq: u64,
        now_ms: Millis,
    ) -> Result<Verdict, StoreError> {
        match crate::store::lane_index(room, lane)? {
            0 => self.poll_general(room, visitor, seq, now_ms).await,
            _ => {
                self.inner
                    .in_lane(room, visitor, lane, LaneOp::Poll, seq, now_ms)
                    .await
            }
        }
    }

    async fn check_in(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        ticket_expires_ms: Millis,
        now_ms: Millis,
    ) -> Result<Option<Millis>, StoreError> {
        let inner = &self.inner;
        let keys = RoomKeys::new(&room.room);
        let call = calls::CheckIn {
            visitor,
            ticket_expires_ms,
        };
        let inv = inner.room_call(&call, &keys.0, room, now_ms, inner.deadline_us());
        call.decode(&inner.run_room(&inv).await?)
    }

    async fn end(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        end: End,
        now_ms: Millis,
    ) -> Result<bool, StoreError> {
        let bounds = match end {
            End::Release => Expiry::Unknown,
            End::Session(ticket_expires_ms) => Expiry::Ticket(ticket_expires_ms),
            End::Arrival(arrived_ms) => Expiry::From(arrived_ms + room.session_duration_ms),
        };
        let ended = self.inner.release(room, visitor, bounds, now_ms).await;
        if let (Ok(_), End::Session(ticket_expires_ms)) = (&ended, end) {
            self.inner.ended(room, visitor, ticket_expires_ms, now_ms);
        }
        ended
    }

    async fn stats(&self, room: &RoomPolicy, now_ms: Millis) -> Result<RoomStats, StoreError> {
        let inner = &self.inner;
        let keys = RoomKeys::new(&room.room);
        let inv = inner.room_call(&calls::Stats, &keys.0, room, now_ms, 0);
        calls::Stats.decode(&inner.run_room(&inv).await?)
    }

    async fn totals(&self, room: &RoomPolicy) -> Result<RoomTotals, StoreError> {
        let keys = RoomKeys::new(&room.room);
        let mut inv = self.inner.scripts.totals.prepare_invoke();
        inv.key(keys.meta());
        let [admitted, queued, rejected, abandoned] =
            ints::<4>("totals", &self.inner.run(&inv).await?)?;
        Ok(RoomTotals {
            admitted,
            queued,
            rejected,
            abandoned,
        })
    }

    async fn reset(&self, room: &RoomPolicy, now_ms: Millis) -> Result<(), StoreError> {
        let keys = RoomKeys::new(&room.room);
        let call = calls::Reset {
            floor: super::next_seq(now_ms, 0),
        };
        let inv = self.inner.room_call(&call, &keys.0, room, now_ms, 0);
        call.decode(&self.inner.run_room(&inv).await?)?;
        self.inner.frontiers.forget(&room.room);
        Ok(())
    }

    async fn start_event(
        &self,
        room: &RoomPolicy,
        event: &EventStart,
        now_ms: Millis,
    ) -> Result<u64, StoreError> {
        let keys = RoomKeys::new(&room.room);
        let call = calls::StartEvent {
            key: event.key.as_str(),
            prequeue_seq: event.prequeue_seq,
            start_seq: event.start_seq,
            shuffle: event.shuffle,
            // Redis seeds its script generator with 32 bits.
            seed: crate::store::minstd_seed(event.seed),
        };
        let inv = self.inner.room_call(&call, &keys.0, room, now_ms, 0);
        let moved = call.decode(&self.inner.run_room(&inv).await?)?;
        if moved > 0 {
            self.inner.frontiers.forget(&room.room);
        }
        Ok(moved)
    }

    async fn forget(&self, room: &str, set: &str, members: &[u64]) -> Result<u64, StoreError> {
        let mut inv = self.inner.scripts.note.prepare_invoke();
        inv.key(keys::note(room, set)).arg(0).arg("-");
        for m in members {
            inv.arg(*m);
        }
        let reply = self.inner.run_writing(&inv).await?;
        match &reply {
            Value::Array(items) => match items.as_slice() {
                [taken, _] => as_u64(taken).ok_or_else(|| protocol("note", &reply)),
                _ => Err(protocol("note", &reply)),
            },
            _ => Err(protocol("note", &reply)),
        }
    }

    async fn note(
        &self,
        room: &str,
        set: &str,
        members: &[u64],
        until_ms: Millis,
        now_ms: Millis,
    ) -> Result<Noted, StoreError> {
        let mut inv = self.inner.scripts.note.prepare_invoke();
        inv.key(keys::note(room, set)).arg(now_ms).arg(until_ms);
        for m in members {
            inv.arg(*m);
        }
        let reply = self.inner.run_writing(&inv).await?;
        match &reply {
            Value::Array(items) => match items.as_slice() {
                [added, size] => match (as_u64(added), as_u64(size)) {
                    (Some(added), Some(size)) => Ok(Noted { added, size }),
                    _ => Err(protocol("note", &reply)),
                },
                _ => Err(protocol("note", &reply)),
            },
            _ => Err(protocol("note", &reply)),
        }
    }

    async fn overrides(&self, room: &str) -> Result<Option<RoomOverrides>, StoreError> {
        let mut inv = self.inner.scripts.overrides.prepare_invoke();
        inv.key(keys::overrides(room));
        match self.inner.run(&inv).await? {
            Value::Nil => Ok(None),
            Value::BulkString(json) => serde_json::from_slice(&json)
                .map(Some)
                .map_err(|e| StoreError::Protocol(format!("overrides: {e}"))),
            v => Err(protocol("overrides", &v)),
        }
    }

    async fn set_overrides(
        &self,
        room: &str,
        overrides: Option<&RoomOverrides>,
    ) -> Result<(), StoreError> {
        let mut inv = self.inner.scripts.set_overrides.prepare_invoke();
        inv.key(keys::overrides(room))
            .key(RoomKeys::new(room).meta());
        if let Some(o) = overrides {
            let json = serde_json::to_string(o)
                .map_err(|e| StoreError::Protocol(format!("overrides: {e}")))?;
            inv.arg(json).arg(o.revision);
        }
        self.inner.run_writing(&inv).await.map(|_| ())
    }
}

/// Hours read by one `report_read.lua` call: a day.
const REPORT_HOURS_PER_CALL: u64 = 24;

#[async_trait]
impl Reports for RedisStore {
    async fn report_add(
        &self,
        room: &str,
        minute: u64,
        add: &ReportMinute,
        keep_until_ms: Millis,
        now_ms: Millis,
    ) -> Result<(), StoreError> {
        let mut inv = self.inner.scripts.report_add.prepare_invoke();
        inv.key(keys::report(room, minute / 60))
            .arg(now_ms)
            .arg(minute % 60)
            .arg(keep_until_ms)
            .arg(add.sums.len());
        // HINCRBY takes signed 64-bit numbers.
        let value = |n: u64| n.min(i64::MAX as u64);
        for (name, n) in &add.sums {
            inv.arg(name.as_str()).arg(value(*n));
        }
        for (name, n) in &add.peaks {
            inv.arg(name.as_str()).arg(value(*n));
        }
        self.inner.run_writing(&inv).await.map(|_| ())
    }

    async fn report_read(
        &self,
        room: &str,
        from: u64,
        to: u64,
        now_ms: Millis,
    ) -> Result<Vec<(u64, ReportMinute)>, StoreError> {
        let to = to.min(from.saturating_add(super::REPORT_MAX_MINUTES - 1));
        let mut out = Vec::new();
        if from > to {
            return Ok(out);
        }
        let (first, last) = (from / 60, to / 60);
        let mut hour = first;
        while hour <= last {
            let end = last.min(hour + REPORT_HOURS_PER_CALL - 1);
            let mut inv = self.inner.scripts.report_read.prepare_invoke();
            for h in hour..=end {
                inv.key(keys::report(room, h));
            }
            let reply = self.inner.run(&inv).await?;
            let Value::Array(hours) = &reply else {
                return Err(protocol("report_read", &reply));
            };
            if hours.len() as u64 != end - hour + 1 {
                return Err(protocol("report_read", &reply));
            }
            for (h, fields) in (hour..=end).zip(hours) {
                let minutes = wire::report_hour(fields, now_ms)
                    .ok_or_else(|| protocol("report_read", &reply))?;
                out.extend(
                    minutes
                        .into_iter()
                        .map(|(m, minute)| (h * 60 + m, minute))
                        .filter(|(m, _)| (from..=to).contains(m)),
                );
            }
            hour = end + 1;
        }
        Ok(out)
    }
}

#[async_trait]
impl Maintenance for RedisStore {
    async fn check(&self, room: &RoomPolicy, now_ms: Millis) -> Result<Vec<String>, StoreError> {
        let keys = RoomKeys::new(&room.room);
        let inv = self
            .inner
            .room_call(&calls::Check, &keys.0, room, now_ms, 0);
        // It only reads: no acknowledgements to wait for.
        calls::Check.decode(&self.inner.run_room_acked(&inv, None).await?)
    }

    fn answers(&self) -> Option<u64> {
        Some(self.inner.answers.load(Ordering::Relaxed))
    }

    async fn ping(&self, within: Duration) -> Result<(), StoreError> {
        // (Not TIME: a ping that waited behind a long script would measure
        // the server clock wrong.)
        let reply: Result<String, StoreError> = match self.inner.conn.handle() {
            Handle::Single(mut c) => {
                bounded(within, redis::cmd("PING").query_async(&mut c)).await?
            }
            Handle::Cluster(mut c) => {
                bounded(within, redis::cmd("PING").query_async(&mut c)).await?
            }
        };
        self.inner.saw(&reply);
        reply.map(|_| ())
    }

    async fn upkeep(&self) {
        self.inner.verify_now(true).await;
        if let Err(e) = self.inner.sync_clock().await {
            tracing::debug!(error = %e, "Redis server clock not measured this time");
        }
    }

    async fn flush(&self, room: &RoomPolicy, now_ms: Millis) {
        // Polls answered from a description are written with the next
        // refresh; a room whose polls stopped gets one here.
        if let Some(seen) = self.inner.frontiers.claim_pending(&room.room) {
            self.inner.refresh_frontier(room, now_ms, seen).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{QueueingMethod, RoomState};

    #[test]
    fn room_keys_share_one_hash_tag() {
        let keys = RoomKeys::new("shop");
        for key in &keys.0 {
            assert!(key.starts_with("wr:{shop}:"), "{key}");
        }
        assert_eq!(keys.meta(), "wr:{shop}:meta");
    }

    #[test]
    fn key_ttl_outlives_sessions_queue_and_window() {
        let room = RoomPolicy {
            room: "r".into(),
            total_active_users: 1,
            new_users_per_minute: 0,
            session_duration_ms: 10_000,
            session_renewal: true,
            method: QueueingMethod::Fifo,
            max_queue_length: 0,
            abandon_after_ms: 5_000,
            arrival_grace_ms: 1_000,
            state: RoomState::Open,
            revision: 0,
            lanes: Default::default(),
        };
        assert_eq!(key_ttl_ms(&room), RATE_WINDOW_MS + KEY_TTL_MARGIN_MS);
        let long = RoomPolicy {
            abandon_after_ms: 7_200_000,
            ..room
        };
        assert_eq!(key_ttl_ms(&long), 7_200_000 + KEY_TTL_MARGIN_MS);
    }
}
