//! The status JSON every queue page polls and every page embeds: where a
//! visitor stands, what it waits for and how long that should take, and
//! the notice shown to the people waiting, and the stock left where the
//! room shows it.

use super::pages::Reply;
use super::schedule::InForce;
use super::{proof, Room};
use crate::clock::Millis;
use crate::queue_page::{self, NoticeInfo, Status, VisitorState};
use crate::store::QueuePlace;

/// The status of a visitor in `state` at `now` (queued: at `place`),
/// with the notice in the language of `reply`.
pub(super) fn of(
    room: &Room,
    now: Millis,
    state: VisitorState,
    place: Option<QueuePlace>,
    reply: &Reply<'_>,
) -> Status {
    let (mut position, queue_length) = place.map_or((0, 0), |p| (p.position, p.queue_length));
    let in_force = room.in_force(now);
    let event = in_force.event.as_ref().map(|e| &e.spec);
    let mut state = state;
    let mut starts_in_seconds = None;
    let mut eta_seconds =
        room.rate
            .eta_seconds(position, &in_force.policy, room.config.refresh_interval);
    if let (true, Some(e), VisitorState::Queued) = (in_force.before_start(), event, state) {
        state = VisitorState::Prequeue;
        let starts_in = e.start_ms.saturating_sub(now).div_ceil(1000);
        starts_in_seconds = Some(starts_in);
        if e.shuffle_at_start {
            // Places are drawn at the start: no position to show yet.
            position = 0;
            eta_seconds = starts_in;
        } else {
            eta_seconds += starts_in;
        }
    }
    Status {
        room: room.config.id.clone(),
        state,
        position,
        queue_length,
        eta_seconds,
        refresh_seconds: room.config.refresh_interval.as_secs().max(1),
        event: event.map(queue_page::EventInfo::of),
        starts_in_seconds,
        challenge: None,
        captcha: None,
        lane: None,
        general_from: None,
        // Read only where the operator chose to show it.
        stock_left: if room.config.show_stock {
            room.stock()
        } else {
            None
        },
        notice: notice(&in_force, now, reply),
    }
}

/// The notice shown at `now` in the language of `reply` (read from what
/// is in force: no store call).
pub(super) fn notice(in_force: &InForce, now: Millis, reply: &Reply<'_>) -> Option<NoticeInfo> {
    in_force
        .notice(now)
        .map(|n| NoticeInfo::of(n, || reply.lang().lang))
}

/// The status of a visitor queued at `place` in lane `lane`: its
/// position counts that lane, and its wait is estimated at the lane's
/// share of the admissions (an upper bound while the other lanes wait).
/// In the general queue during a presale window nobody moves before the
/// window ends: the wait counts from then, and `general_from` says when.
pub(super) fn queued(
    room: &Room,
    now: Millis,
    place: QueuePlace,
    lane: u8,
    reply: &Reply<'_>,
) -> Status {
    let mut status = of(room, now, VisitorState::Queued, Some(place), reply);
    let policy = room.policy_at(now);
    let share = u64::from(policy.lanes.shares[usize::from(lane).min(crate::store::MAX_LANES)]);
    if policy.lanes.any() && share > 0 && status.state == VisitorState::Queued {
        let as_if = status.position.saturating_mul(1000) / share;
        status.eta_seconds = room
            .rate
            .eta_seconds(as_if, &policy, room.config.refresh_interval);
    }
    if lane == 0 && policy.lanes.general_held(now) && status.state == VisitorState::Queued {
        let until = policy.lanes.only_until_ms;
        status.eta_seconds = status
            .eta_seconds
            .saturating_add(until.saturating_sub(now).div_ceil(1000));
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(until);
        status.general_from = Some(humantime::format_rfc3339_seconds(at).to_string());
    }
    status.lane = room.lane_name(lane).map(str::to_owned);
    status
}

/// The status JSON of a visitor who must first solve `challenge`.
pub(super) fn challenge(
    room: &Room,
    challenge: &proof::Challenge,
    now: Millis,
    reply: &Reply<'_>,
) -> Status {
    let mut status = of(room, now, VisitorState::Challenge, None, reply);
    status.challenge = Some(queue_page::ChallengeInfo::of(challenge, now));
    status
}

/// The status JSON of a visitor who must first pass the room's captcha.
pub(super) fn captcha(room: &Room, now: Millis, reply: &Reply<'_>) -> Status {
    let mut status = of(room, now, VisitorState::Challenge, None, reply);
    status.captcha = room
        .config
        .captcha
        .as_ref()
        .map(|c| queue_page::CaptchaInfo::of(c.kind.name(), &c.site_key));
    status
}
