//! The honest wait estimate: a smoothed observed admission rate per room,
//! falling back to what the limits allow when there is no history.

use std::sync::Mutex;

use crate::store::{RoomPolicy, RoomStats, RATE_WINDOW_MS};

/// Weight of the newest sample in the moving average. Samples come every few
/// seconds and each already averages up to 60 s, so this mostly damps noise.
const SMOOTHING: f64 = 0.3;

/// Admissions per second, as observed from the store's rate window.
#[derive(Default)]
pub struct RateTracker {
    per_second: Mutex<Option<f64>>,
}

impl RateTracker {
    /// Folds in a fresh reading of the room's figures.
    pub fn observe(&self, stats: &RoomStats) {
        // Always over the full window: a young room's first burst (filling
        // empty capacity) says nothing about how fast the queue will move.
        let sample = stats.admitted_last_minute as f64 * 1000.0 / RATE_WINDOW_MS as f64;
        let mut rate = self.per_second.lock().unwrap_or_else(|p| p.into_inner());
        // An idle room has no rate to smooth from: the first admissions set
        // it directly instead of being averaged up from zero.
        *rate = Some(match *rate {
            Some(old) if old > 0.001 => old + SMOOTHING * (sample - old),
            _ => sample,
        });
    }

    /// The observed rate, if any admissions have been seen recently.
    pub fn observed(&self) -> Option<f64> {
        let rate = *self.per_second.lock().unwrap_or_else(|p| p.into_inner());
        rate.filter(|r| *r > 0.001)
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
