//! The shadow queue: where a room with `failed_challenge = "shadow"` sends
//! a newcomer it will not let in (a forged, foreign or too-weak proof of
//! work, a captcha token the provider refused, a bot score below
//! `min_bot_score` from a trusted proxy while the room queues). The
//! visitor gets the queue page and its JSON exactly as a queued visitor
//! does, and a ticket of the same size, with a place that starts where a
//! newcomer's would and moves up at the real queue's pace (so its ETA
//! does too), never to the front. The place lives only in the ticket: the
//! store never hears of it, so a bot farm costs the room nothing. Once the
//! room stops queueing, a shadow ticket is a newcomer's again: no place
//! is shown in a room that has no queue.

use http::HeaderMap;

use super::{Admission, Ctx, Decision, Room};
use crate::clock::Millis;
use crate::config::FailedChallenge;
use crate::domain::VisitorId;
use crate::store::QueuePlace;

/// Longest bot score header value read.
const MAX_SCORE_LEN: usize = 8;

impl Admission {
    /// Whether a newcomer to a queueing room has a bot score, from a
    /// trusted proxy, below the room's minimum. A score that is missing,
    /// sent more than once, or not a number says nothing; so does any
    /// score while the room lets newcomers straight in.
    pub(super) fn is_bot(&self, room: &Room, headers: &HeaderMap, ctx: &Ctx<'_>) -> bool {
        let Some(rule) = room.config.bot_score.as_ref().filter(|_| ctx.peer_trusted) else {
            return false;
        };
        let mut scores = headers.get_all(&rule.header).iter();
        let (Some(score), None) = (scores.next(), scores.next()) else {
            return false;
        };
        let low = Some(score.as_bytes())
            .filter(|v| v.len() <= MAX_SCORE_LEN)
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.trim().parse::<u32>().ok())
            .is_some_and(|score| score < u32::from(rule.min));
        low && room.is_queueing(ctx.now)
    }

    /// Whether the room sends those who fail to the shadow queue. In log
    /// mode (`failed_challenge = "log"`) it does not, but counts each one
    /// it would have sent (`outcome="would_shadow"`).
    pub(super) fn shadows(&self, room: &Room) -> bool {
        match room.config.failed_challenge {
            FailedChallenge::Shadow => true,
            FailedChallenge::Log => {
                room.metrics.would_shadow.inc();
                false
            }
            FailedChallenge::Retry => false,
        }
    }

    /// A newcomer sent to the shadow queue: at the back of the queue as
    /// this instance last saw it.
    pub(super) fn shadowed(&self, room: &Room, ctx: &Ctx<'_>) -> Decision {
        room.metrics.shadowed.inc();
        let position = room.queued_seen() + 1;
        self.shadow_place(room, VisitorId::random(), ctx.now, position, ctx)
    }

    /// A shadow place's page or poll: limited like any poll, answered from
    /// its ticket (re-issued, as a queue place's is); `Ended` once the
    /// room does not queue (the visitor is a newcomer again).
    pub(super) fn shadow_poll(
        &self,
        room: &Room,
        visitor: VisitorId,
        since_ms: Millis,
        position: u64,
        ctx: &Ctx<'_>,
    ) -> Decision {
        if !room.is_queueing(ctx.now) {
            return Decision::Ended;
        }
        if let Err(wait) = self.poll_limited(room, visitor, ctx) {
            return Decision::SlowDown(wait);
        }
        self.shadow_place(room, visitor, since_ms, position, ctx)
    }

    /// The shadow place's page (or JSON) and its ticket, re-issued with
    /// where it stands now.
    fn shadow_place(
        &self,
        room: &Room,
        visitor: VisitorId,
        since_ms: Millis,
        position: u64,
        ctx: &Ctx<'_>,
    ) -> Decision {
        let rate = room
            .rate
            .per_second()
            .or_else(|| super::eta::configured_rate(&room.policy_at(ctx.now)));
        let (since_ms, position) = moved(since_ms, position, rate, ctx.now);
        let ticket = self
            .tickets
            .shadow(room, visitor, since_ms, position, ctx.now, ctx.net);
        Decision::Queued {
            place: QueuePlace {
                seq: 0,
                position,
                queue_length: room.queued_seen().max(position),
            },
            ticket,
        }
    }
}

/// Where a shadow place that stood at `position` at `since_ms` stands at
/// `now`, when the queue lets `rate` visitors a second in (none known: it
/// stays): up one place per admission, never past position 1. Returns
/// the place and the time it is reckoned from, so that re-issued at every
/// poll it keeps the fractions of a place and never goes back.
pub(super) fn moved(
    since_ms: Millis,
    position: u64,
    rate: Option<f64>,
    now: Millis,
) -> (Millis, u64) {
    let Some(rate) = rate.filter(|r| r.is_finite() && *r > 0.0) else {
        return (since_ms, position);
    };
    let elapsed = now.saturating_sub(since_ms);
    let places = (elapsed as f64 * rate / 1000.0).floor();
    let room_to_move = position.saturating_sub(1);
    if places >= room_to_move as f64 {
        return (now, 1);
    }
    let places = places as u64;
    let used_ms = (places as f64 * 1000.0 / rate).floor() as Millis;
    (since_ms + used_ms.min(elapsed), position - places)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shadow_place_moves_at_the_queues_pace_and_stops_at_one() {
        // Two admissions a second: 10 s later, 20 places up.
        assert_eq!(moved(0, 50, Some(2.0), 10_000), (10_000, 30));
        // Polled every 300 ms at one a second, it still moves (the
        // fractions are kept), one place a second.
        let (mut since, mut pos) = (0, 50);
        for t in (300..=10_200).step_by(300) {
            (since, pos) = moved(since, pos, Some(1.0), t);
        }
        assert_eq!(pos, 40);
        assert!(since <= 10_200);
        // Never to the front, nor back; nothing known: it stays.
        assert_eq!(moved(0, 5, Some(100.0), 60_000), (60_000, 1));
        assert_eq!(moved(0, 1, Some(100.0), 60_000), (60_000, 1));
        assert_eq!(moved(0, 7, None, 60_000), (0, 7));
        assert_eq!(moved(0, 7, Some(0.0), 60_000), (0, 7));
        assert_eq!(moved(10_000, 7, Some(1.0), 5_000), (10_000, 7));
    }
}
