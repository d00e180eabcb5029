//! What the rooms tell the webhooks (`crate::webhook`): the operator's,
//! the origin's and autotune's changes (read from the overrides every
//! instance applies), event phases and the shuffle, the queue forming and
//! draining, and, batched, admissions and revokes.
//!
//! Every instance sees the room-level happenings; each has an id every
//! instance derives alike (the overrides' revision, the event and its
//! start, the queue's turn), and the instance that notes the id first in
//! the store's `hooks` set delivers it (`Operator::announce`): one
//! delivery per happening across instances, and none again after a
//! restart or a reload. When the store cannot be asked, the instance
//! delivers anyway: receivers dedupe on the id.

use std::sync::Mutex;

use serde_json::{json, Value};

use super::operator::Operator;
use super::rooms::Room;
use super::schedule::Phase;
use crate::clock::Millis;
use crate::domain::{RoomOverrides, RoomState, VisitorId};
use crate::webhook::Kind;

/// How long a claimed id stays noted: longer than a drop, shorter than
/// the set growing without end.
const CLAIM_KEEP_MS: Millis = 7 * 24 * 60 * 60 * 1000;

/// The claim set's name (`Store::note`).
const CLAIMS: &str = "hooks";

/// What a room's webhooks follow, as this instance last saw it.
#[derive(Default)]
pub(crate) struct Watch {
    inner: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    /// The event and phase last seen: (name, start, phase name).
    phase: Option<(String, Millis, &'static str)>,
    /// Whether anyone waited at the last upkeep.
    queued: Option<bool>,
    /// The admissions counter as last handed to the batch.
    admitted: Option<u64>,
    /// An event start this instance made that shuffled visitors: (the
    /// start's key, the event's name, how many), for the next upkeep.
    shuffled: Option<(String, String, u64)>,
}

impl Watch {
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This instance started event `name` (its start named `key`) and the
    /// store shuffled `visitors` (`upkeep::start_due_event`).
    pub(crate) fn shuffled(&self, key: &str, name: &str, visitors: u64) {
        self.seen().shuffled = Some((key.to_owned(), name.to_owned(), visitors));
    }
}

/// The figures of a room a change of its overrides can move.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Figures {
    revision: u64,
    state: RoomState,
    total_active_users: u64,
    new_users_per_minute: u64,
    stock: Option<u64>,
    notice: Option<String>,
    autotune: Option<(Millis, u64, String)>,
}

impl Figures {
    /// The room's figures as the config file and `overrides` set them
    /// (an event's own settings are its `event_phase`).
    pub(crate) fn of(room: &Room, overrides: &RoomOverrides) -> Self {
        let (state, total_active_users, new_users_per_minute) = room.overridden_by(overrides);
        Self {
            revision: overrides.revision,
            state,
            total_active_users,
            new_users_per_minute,
            stock: overrides.stock,
            notice: overrides.notice.as_ref().map(|n| n.text.clone()),
            autotune: overrides
                .autotune
                .as_ref()
                .map(|m| (m.at_ms, m.rate, m.reason.clone())),
        }
    }
}

fn state_name(s: RoomState) -> Value {
    serde_json::to_value(s).unwrap_or(Value::Null)
}

/// The happenings between two looks at a room: (id, kind, data). Ids name
/// the revision that made them, so every instance derives the same.
fn changes(before: &Figures, after: &Figures) -> Vec<(String, Kind, Value)> {
    let mut out = Vec::new();
    let rev = after.revision;
    if before.state != after.state {
        out.push((
            format!("rev:{rev}:state"),
            Kind::StateChanged,
            json!({"from": state_name(before.state), "to": state_name(after.state)}),
        ));
    }
    if before.stock != after.stock {
        out.push((
            format!("rev:{rev}:stock"),
            Kind::StockChanged,
            json!({"from": before.stock, "to": after.stock}),
        ));
    }
    if before.total_active_users != after.total_active_users {
        out.push((
            format!("rev:{rev}:total_active_users"),
            Kind::LimitChanged,
            json!({"field": "total_active_users", "from": before.total_active_users, "to": after.total_active_users}),
        ));
    }
    let tuned = before.autotune != after.autotune && after.autotune.is_some();
    if tuned {
        let (_, rate, reason) = after.autotune.clone().unwrap_or_default();
        out.push((
            format!("rev:{rev}:autotune"),
            Kind::AutotuneMoved,
            json!({"from": before.new_users_per_minute, "to": rate, "reason": reason}),
        ));
    } else if before.new_users_per_minute != after.new_users_per_minute {
        out.push((
            format!("rev:{rev}:new_users_per_minute"),
            Kind::LimitChanged,
            json!({"field": "new_users_per_minute", "from": before.new_users_per_minute, "to": after.new_users_per_minute}),
        ));
    }
    if before.notice != after.notice {
        out.push((
            format!("rev:{rev}:notice"),
            Kind::NoticeChanged,
            json!({"text": after.notice}),
        ));
    }
    out
}

impl Operator {
    /// Delivers a room-level happening once across instances: the first
    /// to note its id in the store sends it.
    pub(super) async fn announce(&self, room: &Room, id: String, kind: Kind, data: Value) {
        let room_id = &room.config.id;
        if !self.telemetry.webhooks.wants(kind, room_id) {
            return;
        }
        let now = self.clock.now_ms();
        let claim = crate::domain::digest64(&format!("{room_id}/{id}"));
        let mine = match self
            .store
            .note(room, CLAIMS, &[claim], now + CLAIM_KEEP_MS, now)
            .await
        {
            Ok(noted) => noted.added == 1,
            Err(e) => {
                tracing::debug!(room = %room_id, %id, error = %e, "webhook claim not recorded; sending anyway");
                true
            }
        };
        if mine {
            let id = format!("{room_id}:{id}");
            self.telemetry
                .webhooks
                .emit(self.telemetry.webhooks.happening(id, kind, room_id, data));
        }
    }

    /// An instance changed the room's overrides from `before` to
    /// `after` (`Operator::amend`, the one place they are written): what
    /// changed, named by the revision written.
    pub(super) async fn announce_changes(
        &self,
        room: &Room,
        before: &RoomOverrides,
        after: &RoomOverrides,
    ) {
        if self.telemetry.webhooks.is_empty() {
            return;
        }
        let (before, after) = (Figures::of(room, before), Figures::of(room, after));
        for (id, kind, data) in changes(&before, &after) {
            self.announce(room, id, kind, data).await;
        }
    }

    /// The origin said the room is sold out, and it was closed at `revision`.
    pub(super) async fn announce_sold_out(&self, room: &Room, revision: u64) {
        self.announce(
            room,
            format!("rev:{revision}:sold_out"),
            Kind::SoldOut,
            json!({}),
        )
        .await;
    }

    /// An event's start shuffled `visitors` waiting visitors.
    pub(super) async fn announce_shuffle(
        &self,
        room: &Room,
        key: &str,
        event: &str,
        visitors: u64,
    ) {
        self.announce(
            room,
            format!("shuffle:{key}"),
            Kind::Shuffled,
            json!({"event": event, "visitors": visitors}),
        )
        .await;
    }

    /// The upkeep's look at a room: the event phase, the queue forming or
    /// draining, the admissions since the last look.
    pub(super) async fn announce_figures(&self, room: &Room, queued: u64, now: Millis) {
        if self.telemetry.webhooks.is_empty() {
            return;
        }
        let room_id = &room.config.id;
        let in_force = room.in_force(now);
        let phase = in_force.event.as_ref().and_then(|e| {
            let name = match in_force.phase {
                Phase::Prequeue => "prequeue",
                Phase::Starting | Phase::Running => "started",
                Phase::None => return None,
            };
            Some((e.spec.name.clone(), e.spec.start_ms, name))
        });
        let admitted = room.metrics.admitted.get();
        let (last_phase, was_queued, last_admitted, shuffled) = {
            let mut seen = room.watch.seen();
            let last_phase = std::mem::replace(&mut seen.phase, phase.clone());
            let was = seen.queued.replace(queued > 0);
            let last = seen.admitted.replace(admitted);
            (last_phase, was, last, seen.shuffled.take())
        };
        if let Some((key, name, visitors)) = shuffled {
            self.announce_shuffle(room, &key, &name, visitors).await;
        }
        if let Some(before) = last_admitted {
            self.telemetry
                .webhooks
                .emit_admissions(room_id, admitted.saturating_sub(before));
        }
        if last_phase != phase {
            if let Some((name, start, _)) = &last_phase {
                let same_event = phase
                    .as_ref()
                    .is_some_and(|(n, s, _)| n == name && s == start);
                if !same_event {
                    self.announce(
                        room,
                        format!("event:{name}@{start}:ended"),
                        Kind::EventPhase,
                        json!({"event": name, "phase": "ended"}),
                    )
                    .await;
                }
            }
            if let Some((name, start, p)) = &phase {
                self.announce(
                    room,
                    format!("event:{name}@{start}:{p}"),
                    Kind::EventPhase,
                    json!({"event": name, "phase": p}),
                )
                .await;
            }
        }
        // (The first look, at a start or a reload, is no change: whoever
        // saw the queue form before announced it.)
        let queueing = queued > 0;
        if was_queued.is_some_and(|was| was != queueing) {
            self.announce_queue(room, queueing, queued, now).await;
        }
    }

    /// The queue formed (or drained): one instance claims the turn. The
    /// two marks take turns in the claim set, so the next forming after a
    /// drain is a new happening.
    async fn announce_queue(&self, room: &Room, formed: bool, queued: u64, now: Millis) {
        let room_id = &room.config.id;
        let (kind, mark, other) = if formed {
            (Kind::QueueFormed, "queue:formed", "queue:drained")
        } else {
            (Kind::QueueDrained, "queue:drained", "queue:formed")
        };
        if !self.telemetry.webhooks.wants(kind, room_id) {
            return;
        }
        let mark_id = crate::domain::digest64(&format!("{room_id}/{mark}"));
        let other_id = crate::domain::digest64(&format!("{room_id}/{other}"));
        let noted = self
            .store
            .note(room, CLAIMS, &[mark_id], now + CLAIM_KEEP_MS, now)
            .await;
        if !matches!(noted, Ok(n) if n.added == 1) {
            return;
        }
        let _ = self.store.forget(room, CLAIMS, &[other_id]).await;
        let data = if formed {
            json!({"queued": queued})
        } else {
            json!({})
        };
        let id = format!("{room_id}:{mark}@{now}");
        self.telemetry
            .webhooks
            .emit(self.telemetry.webhooks.happening(id, kind, room_id, data));
    }

    /// Sessions ended by the operator or the origin, for the `revokes` batch.
    pub(super) fn announce_revoke(&self, room: &Room, visitor: VisitorId) {
        self.telemetry
            .webhooks
            .emit_revokes(&room.config.id, &[visitor.to_hex()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures() -> Figures {
        Figures {
            revision: 4,
            state: RoomState::Open,
            total_active_users: 100,
            new_users_per_minute: 600,
            stock: None,
            notice: None,
            autotune: None,
        }
    }

    #[test]
    fn each_change_is_one_happening_named_by_its_revision() {
        let before = figures();
        let after = Figures {
            revision: 5,
            state: RoomState::Closed,
            stock: Some(0),
            notice: Some("back at 10:15".into()),
            ..figures()
        };
        let got: Vec<(String, Kind)> = changes(&before, &after)
            .into_iter()
            .map(|(id, kind, _)| (id, kind))
            .collect();
        assert_eq!(
            got,
            [
                ("rev:5:state".to_owned(), Kind::StateChanged),
                ("rev:5:stock".to_owned(), Kind::StockChanged),
                ("rev:5:notice".to_owned(), Kind::NoticeChanged),
            ]
        );
        assert!(changes(&before, &before).is_empty());
    }

    #[test]
    fn autotunes_move_is_its_own_kind_and_an_operators_rate_a_limit_change() {
        let before = figures();
        let tuned = Figures {
            revision: 6,
            new_users_per_minute: 500,
            autotune: Some((1, 500, "origin slow".into())),
            ..figures()
        };
        let got = changes(&before, &tuned);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1, Kind::AutotuneMoved);
        assert_eq!(
            got[0].2,
            json!({"from": 600, "to": 500, "reason": "origin slow"})
        );
        let by_hand = Figures {
            revision: 7,
            new_users_per_minute: 300,
            ..tuned.clone()
        };
        let got = changes(&tuned, &by_hand);
        assert_eq!(got[0].1, Kind::LimitChanged);
        assert_eq!(got[0].2["field"], "new_users_per_minute");
    }
}
