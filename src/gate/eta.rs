//! The honest wait estimate: the room's observed admission rate, measured
//! over several minutes, falling back to what the limits allow when there is
//! no history.
//!
//! Admissions come in batches (sessions that began together end together), so
//! a 60 s window can hold a whole batch or none of it. The rate is therefore
//! read from the store's cumulative admission counter over `HORIZON_MS`,
//! which spans several batches; only a room younger than `MIN_SPAN_MS` uses
//! the 60 s window.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::store::{RoomPolicy, RoomStats, RoomTotals, RATE_WINDOW_MS};

/// How far back the admission rate is measured.
const HORIZON_MS: u64 = 5 * 60 * 1000;
/// The counter is trusted once it spans this long.
const MIN_SPAN_MS: u64 = 2 * 60 * 1000;

/// Admissions per second, as observed from the store.
#[derive(Default)]
pub struct RateTracker {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// (time, cumulative admissions) readings, oldest first.
    counter: VecDeque<(u64, u64)>,
    per_second: Option<f64>,
}

impl RateTracker {
    /// Folds in a fresh reading of the room's figures.
    pub fn observe(&self, stats: &RoomStats, totals: Option<&RoomTotals>, now_ms: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = totals {
            // A reset (or a store that lost its data) starts the count again.
            if inner
                .counter
                .back()
                .is_some_and(|&(_, last)| t.admitted < last)
            {
                inner.counter.clear();
            }
            inner.counter.push_back((now_ms, t.admitted));
            while inner
                .counter
                .get(1)
                .is_some_and(|&(at, _)| now_ms.saturating_sub(at) >= HORIZON_MS)
            {
                inner.counter.pop_front();
            }
        }
        let window = stats.admitted_last_minute as f64 * 1000.0 / RATE_WINDOW_MS as f64;
        let rate = match (inner.counter.front(), inner.counter.back()) {
            (Some(&(t0, a0)), Some(&(t1, a1))) if t1.saturating_sub(t0) >= MIN_SPAN_MS => {
                a1.saturating_sub(a0) as f64 * 1000.0 / (t1 - t0) as f64
            }
            _ => window,
        };
        inner.per_second = (rate > 0.0).then_some(rate);
    }

    /// The observed rate, if any admissions have been seen recently.
    pub fn observed(&self) -> Option<f64> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .per_second
    }

    /// Seconds until the visitor at `position` is admitted.
    pub fn eta_seconds(&self, position: u64, policy: &RoomPolicy) -> u64 {
        if position == 0 {
            return 0;
        }
        // The rate limit is a hard ceiling on how fast anyone gets in.
        let ceiling =
            (policy.new_users_per_minute > 0).then(|| policy.new_users_per_minute as f64 / 60.0);
        let observed = self.observed().map(|r| ceiling.map_or(r, |c| r.min(c)));
        match observed.or_else(|| configured_rate(policy)) {
            Some(rate) => (position as f64 / rate).ceil() as u64,
            None => 0,
        }
    }
}

/// What the limits allow per second in steady state: the rate limit, or the
/// turnover of a full room (one session length per slot), whichever is lower.
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

    fn stats(last_minute: u64) -> RoomStats {
        RoomStats {
            admitted_last_minute: last_minute,
            ..RoomStats::default()
        }
    }

    fn totals(admitted: u64) -> RoomTotals {
        RoomTotals {
            admitted,
            ..RoomTotals::default()
        }
    }

    #[test]
    fn batches_are_averaged_over_minutes_not_one_window() {
        let r = RateTracker::default();
        // 10 admissions every 70 s, in one batch each.
        let mut admitted = 0;
        for t in (0..=600_000u64).step_by(2_000) {
            if t % 70_000 == 0 {
                admitted += 10;
            }
            let in_window = if t % 70_000 < 60_000 { 10 } else { 0 };
            r.observe(&stats(in_window), Some(&totals(admitted)), t);
        }
        let rate = r.observed().unwrap();
        assert!((rate - 10.0 / 70.0).abs() < 0.02, "{rate}");
    }

    #[test]
    fn a_young_room_uses_the_window_and_a_reset_starts_over() {
        let r = RateTracker::default();
        r.observe(&stats(30), Some(&totals(30)), 0);
        assert_eq!(r.observed(), Some(0.5));
        r.observe(&stats(0), Some(&totals(0)), 10_000);
        assert_eq!(r.observed(), None);
    }
}
