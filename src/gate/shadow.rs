//! The shadow queue: where a room with `failed_challenge = "shadow"` sends
//! a newcomer it will not let in (a forged or replayed proof of work, a
//! bot score below `min_bot_score` from a trusted proxy). The visitor gets
//! the queue page and its JSON exactly as a queued visitor does, and a
//! ticket of the same size, with a place that moves up one step per
//! [`STEP_MS`] and is never let in. The place lives only in the ticket:
//! the store never hears of it, so a bot farm costs the room nothing.

use http::HeaderMap;

use super::{Ctx, Decision, Gate, Room};
use crate::clock::Millis;
use crate::config::FailedChallenge;
use crate::domain::VisitorId;
use crate::store::QueuePlace;

/// A shadow place moves up one position this often.
pub const STEP_MS: Millis = 30_000;

/// Longest bot score header value read.
const MAX_SCORE_LEN: usize = 8;

impl Gate {
    /// Whether a newcomer's bot score, from a trusted proxy, is below the
    /// room's minimum. A score that is missing or not a number says
    /// nothing.
    pub(super) fn is_bot(&self, room: &Room, headers: &HeaderMap, ctx: &Ctx<'_>) -> bool {
        let Some(rule) = room.config.bot_score.as_ref().filter(|_| ctx.peer_trusted) else {
            return false;
        };
        headers
            .get(&rule.header)
            .map(|v| v.as_bytes())
            .filter(|v| v.len() <= MAX_SCORE_LEN)
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.trim().parse::<u32>().ok())
            .is_some_and(|score| score < u32::from(rule.min))
    }

    /// Whether the room sends those who fail to the shadow queue.
    pub(super) fn shadows(&self, room: &Room) -> bool {
        room.config.failed_challenge == FailedChallenge::Shadow
    }

    /// A newcomer sent to the shadow queue: at the back of the queue as
    /// this instance last saw it.
    pub(super) fn shadowed(&self, room: &Room, ctx: &Ctx<'_>) -> Decision {
        room.metrics.shadowed.inc();
        let position = room.queued_seen() + 1;
        self.shadow_place(room, VisitorId::random(), ctx.now, position, ctx)
    }

    /// A shadow place's page or poll: limited like any poll, answered from
    /// its ticket (re-issued, as a queue place's is).
    pub(super) fn shadow_poll(
        &self,
        room: &Room,
        visitor: VisitorId,
        since_ms: Millis,
        position: u64,
        ctx: &Ctx<'_>,
    ) -> Decision {
        if let Err(wait) = self.poll_limited(room, visitor, ctx) {
            return Decision::SlowDown(wait);
        }
        self.shadow_place(room, visitor, since_ms, position, ctx)
    }

    /// The shadow place's page (or JSON) and its ticket, re-issued.
    fn shadow_place(
        &self,
        room: &Room,
        visitor: VisitorId,
        since_ms: Millis,
        position: u64,
        ctx: &Ctx<'_>,
    ) -> Decision {
        let ticket = self
            .tickets
            .shadow(room, visitor, since_ms, position, ctx.now, ctx.net);
        Decision::Queued {
            place: place_at(room, since_ms, position, ctx.now),
            ticket,
        }
    }
}

/// Where a shadow place stands at `now`: a step up per [`STEP_MS`] since
/// it was given, never past the front; the queue at least that long.
pub fn place_at(room: &Room, since_ms: Millis, position: u64, now: Millis) -> QueuePlace {
    let moved = now.saturating_sub(since_ms) / STEP_MS;
    let position = position.saturating_sub(moved).max(1);
    QueuePlace {
        seq: 0,
        position,
        queue_length: room.queued_seen().max(position),
    }
}
