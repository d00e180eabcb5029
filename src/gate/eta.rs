//! The honest wait estimate: how fast the room lets people in *while someone
//! waits* (docs/how-it-works.md, "The queue page and the status API"),
//! not an average that still holds the quiet minutes
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
//! A room whose last minute used (nearly) its whole `new_users_per_minute`
//! is held back by that quota, which the store lets in by bursts as its 60 s
//! window frees: it is read over whole minutes of backlog, and is the quota
//! itself until a minute has passed. A room far from full whose young
//! sessions have hardly begun to end is taken to move at its quota too
//! (their stay says nothing yet).
//!
//! Visitors who give up leave the line too: the share of waiting visitors
//! dropped per second while backlogged (`abandon_after`) shortens the wait of
//! everyone behind them.
//!
//! Until the backlog has lasted the whole span, the part not yet observed is
//! filled with the turnover, so the estimate is right from the queue's first
//! second and hands over to the measured rate as evidence accumulates. While
//! a backlog lasts, the published rate moves by at most
//! `MAX_STEP_PER_SECOND` per second, so an estimate never jumps tenfold
//! between two polls. The wait told is rounded up to the poll of the queue
//! page that will find the visitor let in.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::Millis;
use crate::domain::{QueueingMethod, RoomPolicy, RoomState};
use crate::store::{RoomStats, RoomTotals, RATE_WINDOW_MS};

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
/// Below this many sessions seen ending, the mean stay of a room that is
/// not full is not trusted.
const TRUSTED_DEPARTURES: f64 = 20.0;
/// The longest wait ever told, in seconds (a day).
const MAX_ETA_S: f64 = 86_400.0;
/// Below this many places dropped (visitors who gave up), the line ahead is
/// taken to shrink by admissions alone.
const MIN_DROPS: f64 = 5.0;
/// A room this full is limited by its places (or about to be); a quota this
/// used is what holds the queue back.
const NEARLY_FULL: f64 = 0.9;
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
    /// Cumulative queue places dropped for want of polls.
    abandoned: u64,
    /// Admissions in the store's last 60 s window.
    admitted_last_minute: u64,
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
    /// The published estimate and when it was last set.
    published: Option<(Estimate, Millis)>,
}

/// How a waiting visitor moves up.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Estimate {
    /// Admissions per second.
    rate: f64,
    /// Share of the waiting visitors dropped per second for want of polls
    /// (they gave up): those ahead of a visitor leave the line too.
    dropout: f64,
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
            abandoned: totals.abandoned,
            admitted_last_minute: stats.admitted_last_minute,
            active: stats.active,
            queued: stats.queued,
            admitting: matches!(policy.state, RoomState::Open | RoomState::QueueAll)
                && policy.method != QueueingMethod::Passthrough,
        };
        match inner.readings.back() {
            // A reset (or a store that lost its data) starts the count again.
            Some(last)
                if reading.admitted < last.admitted
                    || reading.abandoned < last.abandoned
                    || reading.at < last.at =>
            {
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
        // Only visitors already waiting can see the estimate move.
        let backlogged = inner.readings.len() >= 2
            && inner
                .readings
                .range(inner.readings.len() - 2..)
                .all(|r| r.queued > 0);
        inner.published = match (target, inner.published) {
            (Some(next), Some((last, at))) if backlogged => {
                let seconds = now_ms.saturating_sub(at) as f64 / 1000.0;
                let step = MAX_STEP_PER_SECOND.powf(seconds.min(60.0));
                let rate = next.rate.clamp(last.rate / step, last.rate * step);
                Some((Estimate { rate, ..next }, now_ms))
            }
            (Some(next), _) => Some((next, now_ms)),
            (None, _) => None,
        };
    }

    /// The admission rate a waiting visitor can expect, if known.
    pub fn per_second(&self) -> Option<f64> {
        self.published().map(|e| e.rate)
    }

    fn published(&self) -> Option<Estimate> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.published.map(|(e, _)| e)
    }

    /// Seconds until the visitor at `position` is in: until the store lets
    /// them in, rounded up to the poll of their page (every `refresh`) that
    /// learns it. 0 when nothing is known.
    ///
    /// The line ahead shrinks by the admissions and by those ahead who give
    /// up: with `p` ahead, `dp/dt = -(rate + dropout·p)`, so the wait is
    /// `ln(1 + dropout·p/rate) / dropout`.
    pub fn eta_seconds(&self, position: u64, policy: &RoomPolicy, refresh: Duration) -> u64 {
        if position == 0 {
            return 0;
        }
        let estimate = self
            .published()
            .or_else(|| configured_rate(policy).map(|rate| Estimate { rate, dropout: 0.0 }));
        let Some(Estimate { rate, dropout }) = estimate else {
            return 0;
        };
        let p = position as f64;
        let seconds = if dropout > 0.0 {
            (dropout * p / rate).ln_1p() / dropout
        } else {
            p / rate
        };
        let refresh = refresh.as_secs_f64().max(1.0);
        // A room that has stopped letting anyone in has no honest figure
        // beyond "a long time".
        ((seconds / refresh).ceil() * refresh).min(MAX_ETA_S).ceil() as u64
    }
}

/// How a waiting visitor moves up, from the readings (oldest first).
fn estimate(readings: &VecDeque<Reading>, policy: &RoomPolicy) -> Option<Estimate> {
    let last = readings.back()?;
    let by_rate =
        (policy.new_users_per_minute > 0).then(|| policy.new_users_per_minute as f64 / 60.0);
    let (stay, departed) = mean_stay(readings, policy);
    let by_capacity =
        (policy.total_active_users > 0).then(|| policy.total_active_users as f64 / stay);
    // The rate limit is what holds the queue back when the last minute let
    // in (nearly) its whole quota. A room far from full that has seen few
    // sessions end says little about its turnover either (young sessions
    // have not ended *yet*): then too the rate limit is the figure.
    let quota_used =
        last.admitted_last_minute as f64 >= NEARLY_FULL * policy.new_users_per_minute as f64;
    let nearly_full = last.active as f64 >= NEARLY_FULL * policy.total_active_users as f64;
    let rate_bound = by_rate.is_some() && quota_used;
    let by_capacity = match by_rate {
        Some(_) if rate_bound || (!nearly_full && departed < TRUSTED_DEPARTURES) => None,
        _ => by_capacity,
    };
    // An unlimited room keeps no queue: nothing to estimate.
    let turnover = by_rate.into_iter().chain(by_capacity).reduce(f64::min)?;

    let horizon = HORIZON_MS as f64 / 1000.0;
    let span = if rate_bound {
        // The quota is let in whenever the 60 s window frees, in bursts; in
        // whole minutes of backlog it shows exactly, where part of a minute
        // would catch one burst more or less.
        let window = RATE_WINDOW_MS as f64 / 1000.0;
        let backlogged: f64 = readings
            .iter()
            .zip(readings.iter().skip(1))
            .filter(|(a, _)| a.queued > 0 && a.admitting)
            .map(|(a, b)| b.at.saturating_sub(a.at) as f64 / 1000.0)
            .sum();
        ((backlogged.min(horizon) / window).floor() * window).max(window)
    } else {
        (STAYS_PER_SPAN * stay)
            .max(ADMISSIONS_PER_SPAN / turnover)
            .clamp(MIN_SPAN_S, horizon)
    };

    // Admissions over the newest backlogged intervals, up to `span` seconds;
    // drops over all of them (they are rarer, and lag by `abandon_after`).
    let (mut admitted, mut seconds) = (0.0, 0.0);
    let (mut dropped, mut waiting_seconds) = (0.0, 0.0);
    for (a, b) in readings.iter().rev().skip(1).zip(readings.iter().rev()) {
        if a.queued == 0 || !a.admitting {
            continue;
        }
        let dt = b.at.saturating_sub(a.at) as f64 / 1000.0;
        if seconds < span {
            admitted += b.admitted.saturating_sub(a.admitted) as f64;
            seconds += dt;
        }
        dropped += b.abandoned.saturating_sub(a.abandoned) as f64;
        waiting_seconds += (a.queued + b.queued) as f64 / 2.0 * dt;
    }
    // The part of the span not observed yet runs at the turnover (a quota
    // not yet seen for a whole minute counts as the quota).
    let rate = if seconds >= span {
        admitted / seconds
    } else if rate_bound {
        turnover
    } else {
        (admitted + turnover * (span - seconds)) / span
    };
    let rate = by_rate.map_or(rate, |cap| rate.min(cap));
    let dropout = if dropped >= MIN_DROPS {
        dropped / waiting_seconds
    } else {
        0.0
    };
    Some(Estimate { rate, dropout })
}

/// Mean time on site in seconds, and the departures it rests on, by
/// Little's law over the readings: the sessions' exposure (active × time)
/// over the departures seen (admitted − Δactive), counting one departure
/// more than seen so a room whose first sessions have not ended yet gets a
/// long stay rather than an infinite one.
fn mean_stay(readings: &VecDeque<Reading>, policy: &RoomPolicy) -> (f64, f64) {
    let (mut exposure, mut departed) = (0.0, 0i64);
    for (a, b) in readings.iter().zip(readings.iter().skip(1)) {
        let seconds = b.at.saturating_sub(a.at) as f64 / 1000.0;
        exposure += (a.active + b.active) as f64 / 2.0 * seconds;
        departed +=
            b.admitted.saturating_sub(a.admitted) as i64 - b.active as i64 + a.active as i64;
    }
    let session = policy.session_duration_ms.max(1) as f64 / 1000.0;
    let departed = departed.max(0) as f64;
    if exposure <= 0.0 {
        return (session, departed);
    }
    let stay = exposure / (departed + 1.0);
    let stay = if policy.session_renewal {
        stay
    } else {
        // Nobody outstays a session that is not renewed.
        stay.min(session + policy.arrival_grace_ms as f64 / 1000.0)
    };
    (stay.max(0.001), departed)
}

/// What the limits allow per second in steady state: the rate limit, or the
/// turnover of a full room (one session length per slot), whichever is lower.
/// Used before the room has been observed at all.
pub(crate) fn configured_rate(policy: &RoomPolicy) -> Option<f64> {
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
            revision: 0,
            lanes: Default::default(),
        }
    }

    /// The store's admission counts as a test feeds them.
    #[derive(Default)]
    struct Count {
        total: f64,
        /// (second, total at its end), for the last minute's admissions.
        history: Vec<(u64, f64)>,
    }

    /// Feeds one reading a second from `from` to `to` (seconds, inclusive):
    /// `admitted` admissions a second, `active` sessions and `queued`
    /// visitors waiting.
    fn feed(
        r: &RateTracker,
        p: &RoomPolicy,
        count: &mut Count,
        (from, to): (u64, u64),
        admitted: f64,
        active: u64,
        queued: u64,
    ) {
        for t in from..=to {
            let minute_ago = count
                .history
                .iter()
                .rev()
                .find(|h| h.0 + 60 <= t)
                .map_or(0.0, |h| h.1);
            count.total += admitted;
            count.history.push((t, count.total));
            let stats = RoomStats {
                active,
                queued,
                admitted_last_minute: (count.total - minute_ago) as u64,
                ..RoomStats::default()
            };
            let totals = RoomTotals {
                admitted: count.total as u64,
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
        let (r, p, mut total) = (RateTracker::default(), policy(40, 0), Count::default());
        // Five quiet minutes: 0.5 a second, staying 2.5 s.
        feed(&r, &p, &mut total, (0, 299), 0.5, 1, 0);
        // A minute of backlog at 8 a second.
        feed(&r, &p, &mut total, (300, 359), 8.0, 40, 500);
        assert!(near(r.per_second(), 8.0, 0.05), "{:?}", r.per_second());
    }

    #[test]
    fn a_queue_that_just_formed_moves_at_the_turnover_of_a_full_room() {
        let (r, p, mut total) = (RateTracker::default(), policy(40, 0), Count::default());
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
        let (r, p, mut total) = (RateTracker::default(), policy(40, 300), Count::default());
        feed(&r, &p, &mut total, (0, 299), 2.0, 5, 0);
        assert!(near(r.per_second(), 5.0, 0.001), "{:?}", r.per_second());
    }

    #[test]
    fn those_ahead_who_give_up_shorten_the_wait() {
        let (r, p) = (RateTracker::default(), policy(40, 0));
        // Two a second let in from a line of 1000, and half a second's
        // worth of the line dropped for want of polls.
        for t in 0..=120u64 {
            let stats = RoomStats {
                active: 40,
                queued: 1000,
                ..RoomStats::default()
            };
            let totals = RoomTotals {
                admitted: 2 * t,
                abandoned: t / 2,
                ..RoomTotals::default()
            };
            r.observe(&stats, Some(&totals), &p, t * 1000);
        }
        let one = Duration::from_secs(1);
        // Without drop-outs the last in line would wait 500 s; those ahead
        // leave at 0.0005 each a second: ln(1.25) / 0.0005 = 446 s.
        assert_eq!(r.eta_seconds(1000, &p, one), 447);
        assert_eq!(r.eta_seconds(2, &p, one), 1);
    }

    #[test]
    fn a_room_that_lets_nobody_in_is_a_long_wait_not_forever() {
        let (r, p, mut total) = (RateTracker::default(), policy(40, 0), Count::default());
        feed(&r, &p, &mut total, (0, 299), 0.0, 40, 100);
        assert_eq!(r.eta_seconds(100, &p, Duration::from_secs(5)), 86_400);
    }

    #[test]
    fn a_room_held_back_by_its_rate_limit_moves_at_that_limit() {
        // 300 a minute, 1000 places: a crowd takes the minute's 300 places in
        // 30 s, nobody has left yet (sessions are young), and the rest wait.
        let (r, p, mut total) = (RateTracker::default(), policy(1000, 300), Count::default());
        for t in 0..30u64 {
            feed(&r, &p, &mut total, (t, t), 10.0, 10 * (t + 1), 0);
        }
        feed(&r, &p, &mut total, (30, 40), 0.0, 300, 500);
        assert!(near(r.per_second(), 5.0, 0.001), "{:?}", r.per_second());
    }

    #[test]
    fn a_quota_let_in_by_bursts_reads_as_the_quota() {
        // 300 a minute, let in during the first 10 s of each minute as the
        // 60 s window frees: any part of a minute shows more or less.
        let (r, p, mut total) = (RateTracker::default(), policy(1000, 300), Count::default());
        for t in 0..600u64 {
            let burst = if t % 60 < 10 { 30.0 } else { 0.0 };
            feed(&r, &p, &mut total, (t, t), burst, 500, 10_000);
            if t >= 10 {
                assert!(near(r.per_second(), 5.0, 0.01), "{t}: {:?}", r.per_second());
            }
        }
    }

    #[test]
    fn the_measured_rate_takes_over_from_the_turnover_as_the_backlog_lasts() {
        let (r, p, mut total) = (RateTracker::default(), policy(40, 0), Count::default());
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
        let (r, p, mut total) = (RateTracker::default(), policy(40, 0), Count::default());
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
        let (r, p, mut total) = (RateTracker::default(), policy(40, 0), Count::default());
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
        let (r, mut p, mut total) = (RateTracker::default(), policy(40, 0), Count::default());
        feed(&r, &p, &mut total, (0, 119), 8.0, 40, 100);
        p.state = RoomState::Paused;
        // Sessions end, nobody is let in, the queue waits.
        feed(&r, &p, &mut total, (120, 239), 0.0, 40, 300);
        assert!(near(r.per_second(), 8.0, 0.1), "{:?}", r.per_second());
    }

    #[test]
    fn a_room_whose_first_sessions_have_not_ended_assumes_long_stays() {
        let (r, p, mut total) = (RateTracker::default(), policy(40, 0), Count::default());
        feed(&r, &p, &mut total, (0, 0), 40.0, 40, 10);
        feed(&r, &p, &mut total, (1, 10), 0.0, 40, 10);
        // 400 session-seconds and no departure: a stay of ~400 s.
        let rate = r.per_second().unwrap();
        assert!(rate < 0.2, "{rate}");
    }

    #[test]
    fn a_reset_starts_over() {
        let (r, p, mut total) = (RateTracker::default(), policy(40, 0), Count::default());
        feed(&r, &p, &mut total, (0, 299), 8.0, 40, 100);
        let mut zero = Count::default();
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
        let (r, p, mut total) = (RateTracker::default(), policy(0, 0), Count::default());
        feed(&r, &p, &mut total, (0, 10), 8.0, 40, 0);
        assert_eq!(r.per_second(), None);
        assert_eq!(r.eta_seconds(10, &p, Duration::from_secs(5)), 0);
    }

    #[test]
    fn the_estimate_is_rounded_up_to_the_poll_that_lets_the_visitor_in() {
        let (r, p, mut total) = (RateTracker::default(), policy(40, 0), Count::default());
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
