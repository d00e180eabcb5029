//! Room upkeep, off the request path: every room's live figures read and
//! published (ETA rate, metrics, dashboard history), the operators'
//! runtime changes applied, autotune's moves made (`autotune`), events
//! started when due, idle limiter
//! entries forgotten and orphaned decisions released. The daemon runs
//! [`super::Gate::refresh_room_figures`] and
//! [`Operator::refresh_overrides`] on a timer (`server`); a poll or an
//! arrival starts a due event itself ([`start_due_event`]).

use super::guard::StoreGuard;
use super::operator::Operator;
use super::{Room, Rooms};
use crate::clock::Millis;
use crate::store::ReportMinute;

impl Operator {
    /// Reads every room's live figures: folds them into its ETA rate and
    /// publishes them as metrics and dashboard history. Also the store's
    /// upkeep: releases orphaned decisions.
    pub async fn refresh_room_figures(&self, rooms: &Rooms) {
        self.store.upkeep(rooms.all(), self.clock.now_ms()).await;
        self.store.release_orphans().await;
        for room in rooms.all() {
            let now = self.clock.now_ms();
            let stats = match self.store.stats(room, now).await {
                Ok(stats) => stats,
                Err(e) => {
                    tracing::debug!(room = %room.config.id, error = %e, "room figures unavailable");
                    continue;
                }
            };
            self.autotune(room, now).await;
            let policy = room.policy_at(now);
            let totals = self.store.totals(room).await.ok();
            room.rate.observe(&stats, totals.as_ref(), &policy, now);
            let full = policy.total_active_users > 0 && stats.active >= policy.total_active_users;
            room.set_queueing(stats.queued > 0 || full);
            room.saw_queued(stats.queued);
            let refresh = room.config.refresh_interval;
            let eta_seconds = room.rate.eta_seconds(stats.queued, &policy, refresh);
            self.telemetry.metrics.set_room(
                &room.config.id,
                &crate::telemetry::metrics::RoomFigures {
                    active: stats.active,
                    queued: stats.queued,
                    limit: policy.total_active_users,
                    stock: room.stock(),
                    autotune_rate: room
                        .config
                        .autotune
                        .as_ref()
                        .map(|_| policy.new_users_per_minute),
                    admitted_last_minute: stats.admitted_last_minute,
                    eta_seconds,
                    totals,
                },
            );
            let seen = crate::telemetry::report::Observed {
                active: stats.active,
                queued: stats.queued,
                limit: policy.total_active_users,
                totals,
                idle_ms: policy.session_duration_ms,
            };
            let due = self
                .telemetry
                .tally(&room.config.id, &room.metrics, seen, now);
            self.write_report(room, due, now).await;
            self.announce_figures(room, stats.queued, now).await;
            self.telemetry.history.record(
                &room.config.id,
                crate::telemetry::history::Sample {
                    t: now,
                    active: stats.active,
                    limit: policy.total_active_users,
                    queued: stats.queued,
                    admitted_total: totals.map(|t| t.admitted),
                    eta_seconds,
                },
            );
        }
    }

    /// Adds this instance's share of the room's report to the store; what
    /// the store does not take is held for the next time.
    pub(super) async fn write_report(
        &self,
        room: &Room,
        due: Vec<(u64, ReportMinute)>,
        now: Millis,
    ) {
        let keep_until = now.saturating_add(self.report_retention.as_millis() as Millis);
        let mut due = due.into_iter();
        while let Some((minute, add)) = due.next() {
            let written = self
                .store
                .report_add(&room.config.id, minute, &add, keep_until, now)
                .await;
            if let Err(e) = written {
                tracing::debug!(room = %room.config.id, error = %e, "report not written yet");
                let mut held = vec![(minute, add)];
                held.extend(due);
                self.telemetry.untallied(&room.config.id, held);
                return;
            }
        }
    }

    /// Reads the operators' runtime changes for every room and applies
    /// them; starts events that are due.
    pub async fn refresh_overrides(&self, rooms: &Rooms) {
        for room in rooms.all() {
            start_due_event(&self.store, room, self.clock.now_ms()).await;
            match self.store.overrides(&room.config.id).await {
                Ok(o) => {
                    room.apply_overrides(o.as_ref());
                }
                Err(e) => {
                    tracing::debug!(room = %room.config.id, error = %e, "room overrides unavailable")
                }
            }
        }
    }

    /// Whether the store answers within its timeout.
    pub async fn store_ready(&self, rooms: &Rooms) -> bool {
        match rooms.all().first() {
            Some(room) => self.store.stats(room, self.clock.now_ms()).await.is_ok(),
            None => true,
        }
    }
}

/// Asks the store to start the room's event when it is due and this
/// instance has not seen it started (the prequeue's shuffle). Until
/// then nobody is admitted here.
pub(super) async fn start_due_event(store: &StoreGuard, room: &Room, now: Millis) {
    let in_force = room.in_force(now);
    let Some(event) = in_force.event_to_start() else {
        return;
    };
    let start = crate::store::EventStart::of(&event.spec, rand::random());
    let outcome = store.start_event(room, &start, now).await;
    if let Ok(shuffled @ 1..) = outcome {
        room.watch.shuffled(&start.key, &event.spec.name, shuffled);
    }
    match &outcome {
        Ok(shuffled) => tracing::info!(
            room = %room.config.id,
            event = %event.spec.name,
            shuffled,
            "event started"
        ),
        Err(e) => tracing::warn!(
            room = %room.config.id,
            event = %event.spec.name,
            error = %e,
            "event not started yet; trying again"
        ),
    }
    event.finish_start(outcome.is_ok());
    room.refresh(now);
}
