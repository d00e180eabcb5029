//! Admissions and revokes, folded per room and webhook and sent as one
//! happening every `webhook.batch`. Each is counted on the one instance
//! that let the visitor in (or revoked it), so a batch's id names that
//! instance and needs no claim across instances.

use std::sync::Arc;

use super::{lock, rfc3339, Common, Happening, Hook, Kind, MAX_REVOKES_PER_BATCH};
use crate::clock::Millis;

/// A room's admissions and revokes since its last batch.
#[derive(Default)]
pub(super) struct Pending {
    admitted: u64,
    /// When the first of `admitted` was counted.
    admitted_from: Millis,
    revoked: Vec<String>,
    /// When the first of `revoked` was noted.
    revoked_from: Millis,
}

impl Hook {
    pub(super) fn wants_batches(&self) -> bool {
        self.kinds & (Kind::Admissions.bit() | Kind::Revokes.bit()) != 0
    }

    pub(super) fn add_admissions(&self, room: &str, count: u64, now: Millis) {
        // Stopped, nobody would send the batch: keep nothing.
        if self.stop.is_cancelled() {
            return;
        }
        let mut pending = lock(&self.pending);
        // The room's entry is allocated once per batch, not per call.
        let p = match pending.get_mut(room) {
            Some(p) => p,
            None => pending.entry(room.to_owned()).or_default(),
        };
        if p.admitted == 0 {
            p.admitted_from = now;
        }
        p.admitted = p.admitted.saturating_add(count);
    }

    pub(super) fn add_revokes(&self, room: &str, visitors: &[String], now: Millis, c: &Common) {
        if self.stop.is_cancelled() {
            return;
        }
        let mut full = Vec::new();
        {
            let mut pending = lock(&self.pending);
            let p = match pending.get_mut(room) {
                Some(p) => p,
                None => pending.entry(room.to_owned()).or_default(),
            };
            for v in visitors {
                if p.revoked.is_empty() {
                    p.revoked_from = now;
                }
                p.revoked.push(v.clone());
                if p.revoked.len() >= MAX_REVOKES_PER_BATCH {
                    full.push((std::mem::take(&mut p.revoked), p.revoked_from));
                }
            }
        }
        for (visitors, from) in full {
            self.offer(Arc::new(revokes(c, room, visitors, from, now)));
        }
    }

    /// Sends every room's batch to the queue (outside the lock).
    pub(super) fn flush(&self, c: &Common) {
        let taken = std::mem::take(&mut *lock(&self.pending));
        if taken.is_empty() {
            return;
        }
        let now = c.clock.now_ms();
        for (room, p) in taken {
            if p.admitted > 0 {
                self.offer(Arc::new(Happening {
                    id: c.local_id(Kind::Admissions, &room),
                    kind: Kind::Admissions,
                    room: room.clone(),
                    at_ms: now,
                    data: serde_json::json!({
                        "count": p.admitted,
                        "from": rfc3339(p.admitted_from),
                        "to": rfc3339(now),
                    }),
                }));
            }
            if !p.revoked.is_empty() {
                self.offer(Arc::new(revokes(c, &room, p.revoked, p.revoked_from, now)));
            }
        }
    }
}

fn revokes(c: &Common, room: &str, visitors: Vec<String>, from: Millis, now: Millis) -> Happening {
    Happening {
        id: c.local_id(Kind::Revokes, room),
        kind: Kind::Revokes,
        room: room.to_owned(),
        at_ms: now,
        data: serde_json::json!({
            "visitors": visitors,
            "from": rfc3339(from),
            "to": rfc3339(now),
        }),
    }
}

/// Sends `hook`'s batches every `batch` until stopping (the last ones are
/// sent by whoever stops, before the queues close).
pub(super) async fn run(hook: Arc<Hook>, common: Arc<Common>) {
    let mut tick = tokio::time::interval(hook.config.batch);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = hook.stop.cancelled() => return,
            _ = tick.tick() => hook.flush(&common),
        }
    }
}
