//! Keeping in step with the Redis server: its clock, in which each call
//! carries its deadline, and its primary's replication history, whose
//! change (a failover, or a restart that lost data) holds the rooms closed
//! to newcomers for a while and has the sessions ended here lately ended
//! again.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use redis::Value;

use super::conn::{bounded, Handle};
use super::{key_ttl_ms, Inner, RedisStore, RoomKeys};
use crate::clock::Millis;
use crate::store::{RoomPolicy, StoreError};

/// The offset is not known yet: scripts then run without a deadline.
pub(super) const OFFSET_UNKNOWN: i64 = i64::MIN;

impl RedisStore {
    /// Measures the Redis server clock against this host's (`TIME`, with
    /// the round trip halved), so each call can carry a deadline in the
    /// server's time.
    pub async fn sync_clock(&self) -> Result<(), StoreError> {
        self.inner.sync_clock().await
    }
}

impl Inner {
    pub(super) async fn sync_clock(&self) -> Result<(), StoreError> {
        let sent = unix_us();
        let reply: Result<(String, String), StoreError> = match self.conn.handle() {
            Handle::Single(mut c) => {
                bounded(self.timeout, redis::cmd("TIME").query_async(&mut c)).await?
            }
            Handle::Cluster(mut c) => {
                bounded(self.timeout, redis::cmd("TIME").query_async(&mut c)).await?
            }
        };
        self.saw(&reply);
        let reply = reply?;
        let received = unix_us();
        let server = reply
            .0
            .parse::<i64>()
            .ok()
            .zip(reply.1.parse::<i64>().ok())
            .map(|(s, us)| s * 1_000_000 + us)
            .ok_or_else(|| StoreError::Protocol("TIME: not two integers".into()))?;
        let offset = server - (sent + received) / 2;
        let previous = self.clock_offset_us.swap(offset, Ordering::Relaxed);
        if previous != OFFSET_UNKNOWN && (previous - offset).abs() > 1_000_000 {
            tracing::warn!(
                offset_ms = offset / 1000,
                "the Redis server clock moved against this host's by more than a second"
            );
        }
        Ok(())
    }

    /// The server time after which a call sent now is of no use to its
    /// caller (0 when the offset is not known).
    pub(super) fn deadline_us(&self) -> i64 {
        match self.clock_offset_us.load(Ordering::Relaxed) {
            OFFSET_UNKNOWN => 0,
            offset => unix_us() + offset + self.timeout.as_micros() as i64,
        }
    }

    /// Before deciding on a primary that may be another (a failover) or
    /// may have lost its data (a restart without persistence): reads its
    /// replication id and marks every room this instance knows with it
    /// (`lua/epoch.lua`), which holds a room whose history changed closed
    /// to newcomers for one check-in interval. Not on a Cluster, whose
    /// nodes each have their own history (acknowledgements cover it).
    pub(super) async fn verify(&self) {
        if self.unverified.load(Ordering::Relaxed) {
            self.verify_now(false).await;
        }
    }

    /// `verify`, also when nothing asked for it (`force`: the upkeep).
    pub(super) async fn verify_now(&self, force: bool) {
        let mut replid = self.replid.lock().await;
        let asked = self.unverified.swap(false, Ordering::Relaxed);
        if !asked && !force {
            return;
        }
        // A verification that fails is asked for again only if it was
        // asked for (the upkeep's own is simply made at the next upkeep).
        let again = || {
            if asked {
                self.unverified.store(true, Ordering::Relaxed)
            }
        };
        let read = async {
            let info: String = match self.conn.handle() {
                Handle::Single(mut c) => {
                    bounded(
                        self.timeout,
                        redis::cmd("INFO").arg("replication").query_async(&mut c),
                    )
                    .await??
                }
                Handle::Cluster(_) => return Ok(None),
            };
            Ok::<_, StoreError>(info.lines().find_map(|l| {
                l.strip_prefix("master_replid:")
                    .map(|v| v.trim().to_owned())
            }))
        };
        let now = match read.await {
            Ok(Some(now)) => now,
            Ok(None) => return,
            Err(_) => return again(),
        };
        let other_before = replid.as_ref().is_some_and(|r| *r != now);
        let rooms: Vec<(Arc<str>, (Millis, Millis))> = self
            .rooms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(r, v)| (r.clone(), *v))
            .collect();
        let mut held: Vec<Arc<str>> = Vec::new();
        // A room that cannot be marked is asked again later; the others are
        // marked and held all the same, their ends sent again and named in
        // the warning. (Stopping at it left the rooms marked before it
        // with their ends never sent again, since the next pass finds them
        // marked already, and the rooms after it never marked at all.)
        let mut failed = false;
        for (room, (hold_ms, ttl_ms)) in rooms {
            let mut inv = self.scripts.epoch.prepare_invoke();
            inv.key(RoomKeys::new(&room).meta())
                .arg(&now)
                .arg(hold_ms)
                .arg(if other_before { "1" } else { "0" })
                .arg(ttl_ms);
            let result = match self.conn.handle() {
                Handle::Single(mut c) => self.run_on(&mut c, &inv, self.acks).await,
                Handle::Cluster(_) => return,
            };
            match result {
                Ok(Value::Int(1)) => held.push(room),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(room = %room, error = %e, "rooms not marked with the primary's history");
                    failed = true;
                }
            }
        }
        if !held.is_empty() {
            tracing::warn!(
                rooms = ?held,
                "the Redis primary's history changed (a failover or a restart): admissions it \
                 acknowledged may be lost, so these rooms admit nobody new for one check-in \
                 interval while the sessions that survive on their tickets check in"
            );
        }
        if failed {
            again();
        } else {
            *replid = Some(now);
        }
        drop(replid);
        self.end_again(&held).await;
    }

    /// Remembers `room`, so a verification marks it (`verify`).
    pub(super) fn know(&self, room: &RoomPolicy) {
        let mut rooms = self.rooms.lock().unwrap_or_else(|p| p.into_inner());
        let entry = (room.check_in_interval_ms(), key_ttl_ms(room));
        if rooms.get(&*room.room) != Some(&entry) {
            rooms.insert(room.room.clone(), entry);
        }
    }
}

/// Microseconds since the Unix epoch on this host's real clock (not the
/// injected one: deadlines are compared with Redis's own clock).
fn unix_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}
