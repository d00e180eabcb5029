//! The operator's role: what operators (and the origin, on their behalf)
//! change — a room's runtime settings, sold out, a visitor's session or
//! place ended, a room emptied — and, in `upkeep`, what runs off the
//! request path. The admin API and the gate call these; each records the
//! change in the store for every instance and applies it here at once.

use std::sync::Arc;

use super::guard::StoreGuard;
use super::Room;
use crate::clock::{Millis, SharedClock};
use crate::domain::{EventSpec, RoomOverrides, VisitorId};
use crate::store::StoreError;
use crate::telemetry::Telemetry;

/// Why a runtime change was not made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AmendError {
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Works on the rooms through the store guard, for operators, the origin's
/// commands and upkeep. Cheap to clone: every field is shared.
#[derive(Clone)]
pub struct Operator {
    pub(super) store: Arc<StoreGuard>,
    pub(super) clock: SharedClock,
    pub(super) telemetry: Arc<Telemetry>,
    /// How long report minutes are kept (`[reports] retention`).
    pub(super) report_retention: std::time::Duration,
}

impl Operator {
    /// The origin said the room is sold out: `closed`, stored for every
    /// instance (the operator reopens it through the admin API).
    pub(super) async fn sold_out(&self, room: &Room) {
        if room.policy().state == crate::domain::RoomState::Closed {
            return;
        }
        match self
            .amend(room, |o, _| {
                o.state = Some(crate::domain::RoomState::Closed);
                Ok(())
            })
            .await
        {
            Ok(revision) => {
                tracing::warn!(room = %room.config.id, "the origin closed the room (sold out)");
                self.announce_sold_out(room, revision).await;
            }
            Err(e) => {
                tracing::error!(room = %room.config.id, error = %e, "the origin's close was not recorded")
            }
        }
    }

    /// The origin said how many items are left (`X-Waitroom-Stock`):
    /// stored for every instance when it differs from what this instance
    /// holds, so an origin that says it on every response costs a store
    /// write only when the stock moves.
    pub(super) async fn restock(&self, room: &Room, stock: u64) {
        if room.stock() == Some(stock) {
            return;
        }
        match self
            .amend(room, |o, _| {
                o.stock = Some(stock);
                Ok(())
            })
            .await
        {
            Ok(_) => tracing::info!(room = %room.config.id, stock, "the origin's stock recorded"),
            Err(e) => {
                tracing::warn!(room = %room.config.id, stock, error = %e, "the origin's stock was not recorded")
            }
        }
    }

    /// Changes the room's stored runtime settings (read, change, write
    /// with the next revision) and applies them here at once; the other
    /// instances read them within a second. `change` gets the overrides
    /// and the events in force, and may refuse. Returns the revision
    /// written; what changed goes to the webhooks.
    pub(crate) async fn amend(
        &self,
        room: &Room,
        change: impl FnOnce(&mut RoomOverrides, Vec<EventSpec>) -> Result<(), String>,
    ) -> Result<u64, AmendError> {
        let store = &self.store;
        let mut o = match store.overrides(&room.config.id).await? {
            Some(o) if o.config_fingerprint == room.fingerprint => o,
            _ => RoomOverrides {
                config_fingerprint: room.fingerprint,
                ..RoomOverrides::default()
            },
        };
        let before = o.clone();
        let events = room.events().iter().map(|e| e.spec.clone()).collect();
        change(&mut o, events).map_err(AmendError::Refused)?;
        o.revision += 1;
        store.set_overrides(&room.config.id, &o).await?;
        room.apply_overrides(Some(&o));
        self.announce_changes(room, &before, &o).await;
        Ok(o.revision)
    }

    /// Ends `visitor`'s session (its ticket says until `expires`): here at
    /// once, for its tunnels and its next request, and in the store for
    /// every instance. The origin's `revoke` and `{prefix}end` come here.
    pub async fn end_session(
        &self,
        room: &Room,
        visitor: VisitorId,
        expires: Millis,
        now: Millis,
    ) -> Result<bool, StoreError> {
        room.ended(visitor, now);
        room.metrics.time_on_origin.ended(visitor, now);
        let ended = self.store.end_session(room, visitor, expires, now).await?;
        room.metrics.revoked.inc();
        self.announce_revoke(room, visitor);
        Ok(ended)
    }

    /// The room's report over the minutes from `from_ms` to `to_ms`, what
    /// this instance tallied so far included.
    pub async fn report(
        &self,
        room: &Room,
        from_ms: Millis,
        to_ms: Millis,
    ) -> Result<crate::telemetry::report::RoomReport, StoreError> {
        let now = self.clock.now_ms();
        let seen = match self.store.stats(room, now).await {
            Ok(stats) => Some(crate::telemetry::report::Observed {
                active: stats.active,
                queued: stats.queued,
                limit: room.policy_at(now).total_active_users,
                totals: self.store.totals(room).await.ok(),
                idle_ms: room.policy_at(now).session_duration_ms,
            }),
            Err(_) => None,
        };
        let mine = self
            .telemetry
            .tally_now(&room.config.id, &room.metrics, seen, now);
        self.write_report(room, mine, now).await;
        let (from, to) = (from_ms / 60_000, to_ms / 60_000);
        // An hour before the window gives the store's totals a baseline.
        let minutes = self
            .store
            .report_read(&room.config.id, from.saturating_sub(60), to, now)
            .await?;
        Ok(crate::telemetry::report::build(
            &room.config.id,
            from,
            to,
            &minutes,
        ))
    }

    /// Ends a visitor's session, or removes its queue place, by its id
    /// (the admin API; the store looks the visitor up).
    pub async fn release(&self, room: &Room, visitor: VisitorId) -> Result<bool, StoreError> {
        let now = self.clock.now_ms();
        room.ended(visitor, now);
        room.metrics.time_on_origin.ended(visitor, now);
        let released = self.store.release(room, visitor, now).await?;
        if released {
            room.metrics.revoked.inc();
            self.announce_revoke(room, visitor);
        }
        Ok(released)
    }

    /// Empties the room: every session ends (and every tunnel one opened
    /// here), the queue and the rate history are cleared.
    pub async fn reset(&self, room: &Room) -> Result<(), StoreError> {
        self.store.reset(room, self.clock.now_ms()).await?;
        room.tunnels.end(None);
        tracing::info!(room = %room.config.id, "room reset by the operator");
        Ok(())
    }
}
