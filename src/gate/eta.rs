//! The honest wait estimate: how fast the room lets people in *while someone
//! waits* (SPEC §5), not an average that still holds the quiet minutes
//! before a spike.
//!
//! The tracker keeps the room's readings of the last `HORIZON_MS` (time,
//! cumulative admissions, active sessions, queue length) and derives two
//! figures from them:
//!
//! * the **backlogged rate**: admissions counted only over the intervals that
//!   began with someone waiting in a room that admits, newest first, over a
//!   span of several mean stays (so sessions that began together and end
//!   together are averaged over several batches);
//! * the **turnover** of a full room, by Little's law: `total_active_users`
//!   over the mean time on site, capped by `new_users_per_minute`. The mean
//!   time on site is the active sessions' exposure over the departures seen
//!   (`admitted - Δactive`), so it is known from the quiet minutes before a
//!   queue forms.
//!
//! Until the backlog has lasted the whole span, the part not yet observed is
//! filled with the turnover, so the estimate is right from the queue's first
//! second and hands over to the measured rate as evidence accumulates. The
//! published rate moves by at most `MAX_STEP_PER_SECOND` per second, so an
//! estimate never jumps tenfold between two polls.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::Millis;
use crate::store::{QueueingMethod, RoomPolicy, RoomState, RoomStats, RoomTotals};

/// How far back readings are kept (and the longest span the rate is read over).
const HORIZON_MS: Millis = 5 * 60 * 1000;
/// The backlogged rate is read over this many mean stays: sessions that
/// began in one batch end in one batch, so a span of a few stays holds
/// several batches.
const STAYS_PER_SPAN: f64 = 6.0;
/// ... and over a span expected to hold at least this many admissions, so a
/// slow room's estimate is not a handful of events.
const ADMISSIONS_PER_SPAN: f64 = 40.0;
/// The shortest span, in seconds.
const MIN_SPAN_S: f64 = 10.0;
/// The most the published rate changes in one second (up or down).
const MAX_STEP_PER_SECOND: f64 = 1.25;

/// Admissions per second while the room is backlogged, as observed from the store.
#[derive(Default)]
pub struct RateTracker {
    inner: Mutex<Inner>,
}

/// One reading of the room's figures.
#[derive(Clone, Copy, Debug)]
struct Reading {
    at: Millis,
    /// Cumulative admissions (the store's totals).
    admitted: u64,
    active: u64,
    queued: u64,
    /// Whether the room was letting waiting visitors in (not paused or
    /// closed), so time with a queue counts as backlogged.
    admitting: bool,
}

#[derive(Default)]
struct Inner {
    /// Readings of the last `HORIZON_MS`, oldest first.
    readings: VecDeque<Reading>,
    /// The published rate and when it was last set.
    published: Option<(f64, Millis)>,
}

impl RateTracker {
    /// Folds in a fresh reading of the room's figures. Without `totals`
    /// (the store did not answer) the published rate stays as it was.
    pub fn observe(
        &self,
        stats: &RoomStats,
        totals: Option<&RoomTotals>,
        policy: &RoomPolicy,
        now_ms: Millis,
    ) {
        let Some(totals) = totals else { return };
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let reading = Reading {
            at: now_ms,
            admitted: totals.admitted,
            active: stats.active,
            queued: stats.queued,
            admitting: matches!(policy.state, RoomState::Open | RoomState::QueueAll)
                && policy.method != QueueingMethod::Passthrough,
        };
        match inner.readings.back() {
            // A reset (or a store that lost its data) starts the count again.
            Some(last) if reading.admitted < last.admitted || reading.at < last.at => {
                inner.readings.clear();
                inner.published = None;
            }
            // Two readings at one instant: the later one stands.
            Some(last) if reading.at == last.at => {
                inner.readings.pop_back();
            }
            _ => {}
        }
        inner.readings.push_back(reading);
        while inner
            .readings
            .get(1)
            .is_some_and(|r| now_ms.saturating_sub(r.at) >= HORIZON_MS)
        {
            inner.readings.pop_front();
        }
        let target = estimate(&inner.readings, policy);
        inner.published = match (target, inner.published) {
            (Some(rate), Some((last, at))) => {
                let seconds = now_ms.saturating_sub(at) as f64 / 1000.0;
                let step = MAX_STEP_PER_SECOND.powf(seconds.min(60.0));
                Some((rate.clamp(last / step, last * step), now_ms))
            }
            (Some(rate), None) => Some((rate, now_ms)),
            (None, _) => None,
        };
    }

    /// The rate at which a waiting visitor can expect to move up, if known.
    pub fn per_second(&self) -> Option<f64> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.published.map(|(rate, _)| rate)
    }

    /// Seconds until the visitor at `position` is in: until the store lets
    /// them in, rounded up to the poll of their page (every `refresh`) that
    /// learns it. 0 when nothing is known.
    pub fn eta_seconds(&self, position: u64, policy: &RoomPolicy, refresh: Duration) -> u64 {
        if position == 0 {
            return 0;
        }
        let Some(rate) = self.per_second().or_else(|| configured_rate(policy)) else {
            return 0;
        };
        let seconds = position as f64 / rate;
        let refresh = refresh.as_secs_f64().max(1.0);
        ((seconds / refresh).ceil() * refresh).ceil() as u64
    }
}

/// The rate a waiting visitor moves up at, from the readings (oldest first).
fn estimate(readings: &VecDeque<Reading>, policy: &RoomPolicy) -> Option<f64> {
    let by_rate =
        (policy.new_users_per_minute > 0).then(|| policy.new_users_per_minute as f64 / 60.0);
    let stay = mean_stay(readings, policy);
    let by_capacity =
        (policy.total_active_users > 0).then(|| policy.total_active_users as f64 / stay);
    let rate_bound = match (by_rate, by_capacity) {
        (Some(a), Some(b)) => a <= b,
        (a, _) => a.is_some(),
    };
    // An unlimited room keeps no queue: nothing to estimate.
    let turnover = by_rate.into_iter().chain(by_capacity).reduce(f64::min)?;
    // When the rate limit is what holds visitors back, admissions come in a
    // burst each time the 60 s window frees, so the span holds several.
    let span = if rate_bound {
        HORIZON_MS as f64 / 1000.0
    } else {
        (STAYS_PER_SPAN * stay).max(ADMISSIONS_PER_SPAN / turnover)
    }
    .clamp(MIN_SPAN_S, HORIZON_MS as f64 / 1000.0);

    // Admissions over the newest backlogged intervals, up to `span` seconds.
    let (mut admitted, mut seconds) = (0.0, 0.0);
    for (a, b) in readings.iter().rev().skip(1).zip(readings.iter().rev()) {
        if seconds >= span {
            break;
        }
        if a.queued == 0 || !a.admitting {
            continue;
        }
        admitted += b.admitted.saturating_sub(a.admitted) as f64;
        seconds += b.at.saturating_sub(a.at) as f64 / 1000.0;
    }
    // The part of the span not observed yet runs at the turnover.
    let rate = if seconds >= span {
        admitted / seconds
    } else {
        (admitted + turnover * (span - seconds)) / span
    };
    Some(by_rate.map_or(rate, |cap| rate.min(cap)))
}

/// Mean time on site in seconds, by Little's law over the readings: the
/// sessions' exposure (active × time) over the departures seen, counting one
/// departure more than seen so a room whose first sessions have not ended
/// yet gets a stay at least as long as they have lasted.
fn mean_stay(readings: &VecDeque<Reading>, policy: &RoomPolicy) -> f64 {
    let (mut exposure, mut departed) = (0.0, 0i64);
    for (a, b) in readings.iter().zip(readings.iter().skip(1)) {
        let seconds = b.at.saturating_sub(a.at) as f64 / 1000.0;
        exposure += (a.active + b.active) as f64 / 2.0 * seconds;
        departed +=
            b.admitted.saturating_sub(a.admitted) as i64 - b.active as i64 + a.active as i64;
    }
    let session = policy.session_duration_ms.max(1) as f64 / 1000.0;
    if exposure <= 0.0 {
        return session;
    }
    let stay = exposure / (departed.max(0) as f64 + 1.0);
    if policy.session_renewal {
        stay
    } else {
        // Nobody outstays a session that is not renewed.
        stay.min(session + policy.arrival_grace_ms as f64 / 1000.0)
    }
    .max(0.001)
}

/// What the limits allow per second in steady state: the rate limit, or the
/// turnover of a full room (one session length per slot), whichever is lower.
/// Used before the room has been observed at all.
pub fn configured_rate(policy: &RoomPolicy) -> Option<f64> {
    let by_rate =
        (policy.new_users_per_minute > 0).then(|| policy.new_users_per_minute as f64 / 60.0);
    let by_capacity = (policy.total_active_users > 0).then(|| {
        policy.total_active_users as f64 * 1000.0 / policy.session_duration_ms.max(1) as f64
    });
    match (by_rate, by_capacity) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(places: u64, per_minute: u64) -> RoomPolicy {
        RoomPolicy {
            room: "shop".into(),
            total_active_users: places,
            new_users_per_minute: per_minute,
            session_duration_ms: 600_000,
            session_renewal: true,
            method: QueueingMethod::Fifo,
            max_queue_length: 0,
            abandon_after_ms: 60_000,
            arrival_grace_ms: 10_000,
            state: RoomState::Open,
        }
    }

    /// Feeds one reading a second from `from` to `to` (seconds, inclusive):
    /// `admitted` admissions a second on top of `total`, `active` sessions
    /// and `queued` visitors waiting.
    fn feed(
        r: &RateTracker,
        p: &RoomPolicy,
        total: &mut f64,
        (from, to): (u64, u64),
        admitted: f64,
        active: u64,
        queued: u64,
    ) {
        for t in from..=to {
            *total += admitted;
            let stats = RoomStats {
                active,
                queued,
                ..RoomStats::default()
            };
            let totals = RoomTotals {
                admitted: *total as u64,
                ..RoomTotals::default()
            };
            r.observe(&stats, Some(&totals), p, t * 1000);
        }
    }

    fn near(actual: Option<f64>, expected: f64, share: f64) -> bool {
        actual.is_some_and(|a| (a - expected).abs() <= expected * share)
    }

    #[test]
    fn quiet_minutes_do_not_dilute_a_backlog() {
        let (r, p, mut total) = (RateTracker::default(), policy(40, 0), 0.0);
        // Five quiet minutes: 0.5 a second, staying 2.5 s.
        feed(&r, &p, &mut total, (0, 299), 0.5, 1, 0);
        // A minute of backlog at 8 a second.
        feed(&r, &p, &mut total, (300, 359), 8.0, 40, 500);
        assert!(near(r.per_second(), 8.0, 0.05), "{:?}", r.per_second());
    }

    #[test]
    fn a_queue_that_just_formed_moves_at_the_turnover_of_a_full_room() {
        let (r, p, mut total) = (RateTracker::default(), policy(40, 0), 0.0);
        // 2 a second, 5 sessions at a time: each stays 2.5 s.
        feed(&r, &p, &mut total, (0, 299), 2.0, 5, 0);
        // Before anyone waits, the rate is ready: 40 places / 2.5 s.
        assert!(near(r.per_second(), 16.0, 0.05), "{:?}", r.per_second());
        // A crowd fills the room in a second.
        feed(&r, &p, &mut total, (300, 300), 37.0, 40, 10);
        assert!(near(r.per_second(), 16.0, 0.05), "{:?}", r.per_second());
    }

    #[test]
    fn the_rate_limit_caps_the_turnover() {
        let (r, p, mut total) = (RateTracker::default(), policy(40, 300), 0.0);
        feed(&r, &p, &mut total, (0, 299), 2.0, 5, 0);
        assert!(near(r.per_second(), 5.0, 0.001), "{:?}", r.per_second());
    }

    #[test]
    fn the_measured_rate_takes_over_from_the_turnover_as_the_backlog_lasts() {
        let (r, p, mut total) = (RateTracker::default(), policy(40, 0), 0.0);
        feed(&r, &p, &mut total, (0, 299), 2.0, 5, 0);
        // Promoted visitors stay longer than the quiet minutes' visitors did.
        let mut seen = vec![];
        for t in 300..330 {
            feed(&r, &p, &mut total, (t, t), 8.0, 40, 200);
            seen.push(r.per_second().unwrap());
        }
        assert!(seen[0] > 14.0, "{seen:?}");
        assert!(seen.windows(2).all(|w| w[1] <= w[0] + 1e-9), "{seen:?}");
        assert!(near(r.per_second(), 8.0, 0.05), "{seen:?}");
    }

    #[test]
    fn batches_are_averaged_over_several_stays() {
        // 40 places, fixed 60 s sessions: 40 let in together every minute.
        let (r, p, mut total) = (RateTracker::default(), policy(40, 0), 0.0);
        for t in 0..=900u64 {
            let batch = if t % 60 == 0 { 40.0 } else { 0.0 };
            feed(&r, &p, &mut total, (t, t), batch, 40, 100);
            if t >= 360 {
                let rate = r.per_second().unwrap();
                assert!(
                    (rate - 40.0 / 60.0).abs() < 0.25 * 40.0 / 60.0,
                    "{t}: {rate}"
                );
            }
        }
    }

    #[test]
    fn the_published_rate_moves_at_most_a_step_a_second() {
        let (r, p, mut total) = (RateTracker::default(), policy(40, 0), 0.0);
        feed(&r, &p, &mut total, (0, 299), 8.0, 40, 100);
        let before = r.per_second().unwrap();
        // The room stops admitting (stays suddenly last ten times longer).
        for t in 300..320 {
            feed(&r, &p, &mut total, (t, t), 0.8, 40, 100);
            let now = r.per_second().unwrap();
            assert!(now >= before / MAX_STEP_PER_SECOND.powi((t - 299) as i32) - 1e-9);
        }
    }

    #[test]
    fn paused_minutes_are_not_backlogged() {
        let (r, mut p, mut total) = (RateTracker::default(), policy(40, 0), 0.0);
        feed(&r, &p, &mut total, (0, 119), 8.0, 40, 100);
        p.state = RoomState::Paused;
        // Sessions end, nobody is let in, the queue waits.
        feed(&r, &p, &mut total, (120, 239), 0.0, 40, 300);
        assert!(near(r.per_second(), 8.0, 0.1), "{:?}", r.per_second());
    }

    #[test]
    fn a_room_whose_first_sessions_have_not_ended_assumes_long_stays() {
        let (r, p, mut total) = (RateTracker::default(), policy(40, 0), 0.0);
        feed(&r, &p, &mut total, (0, 0), 40.0, 40, 10);
        feed(&r, &p, &mut total, (1, 10), 0.0, 40, 10);
        // 400 session-seconds and no departure: a stay of ~400 s.
        let rate = r.per_second().unwrap();
        assert!(rate < 0.2, "{rate}");
    }

    #[test]
    fn a_reset_starts_over() {
        let (r, p, mut total) = (RateTracker::default(), policy(40, 0), 0.0);
        feed(&r, &p, &mut total, (0, 299), 8.0, 40, 100);
        let mut zero = 0.0;
        feed(&r, &p, &mut zero, (300, 300), 0.0, 0, 0);
        // No sessions yet: the configured session length is all there is.
        assert!(
            near(r.per_second(), 40.0 / 600.0, 0.001),
            "{:?}",
            r.per_second()
        );
    }

    #[test]
    fn an_unlimited_room_has_no_rate() {
        let (r, p, mut total) = (RateTracker::default(), policy(0, 0), 0.0);
        feed(&r, &p, &mut total, (0, 10), 8.0, 40, 0);
        assert_eq!(r.per_second(), None);
        assert_eq!(r.eta_seconds(10, &p, Duration::from_secs(5)), 0);
    }

    #[test]
    fn the_estimate_is_rounded_up_to_the_poll_that_lets_the_visitor_in() {
        let (r, p, mut total) = (RateTracker::default(), policy(40, 0), 0.0);
        feed(&r, &p, &mut total, (0, 299), 8.0, 40, 100);
        let five = Duration::from_secs(5);
        assert_eq!(r.eta_seconds(0, &p, five), 0);
        assert_eq!(r.eta_seconds(1, &p, five), 5);
        assert_eq!(r.eta_seconds(80, &p, five), 10);
        assert_eq!(r.eta_seconds(100, &p, five), 15);
        // Before any reading, what the limits allow: 40 places per 600 s.
        let fresh = RateTracker::default();
        assert_eq!(fresh.eta_seconds(40, &p, Duration::from_secs(1)), 600);
    }
}
