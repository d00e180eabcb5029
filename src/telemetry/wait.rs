//! Time in queue: how long each queued visitor waited before being let in,
//! kept per room as a Prometheus histogram and as the last hour of
//! per-minute log-scale histograms, from which the dashboard reads the
//! median and 90th percentile.
//!
//! A queue ticket's `seq` encodes its arrival time (see
//! [`crate::store::next_seq`]), so the wait is known where a queued
//! visitor's poll is admitted, without storing anything per visitor.

use std::sync::{Arc, Mutex};

use prometheus_client::metrics::histogram::Histogram;
use serde::Serialize;

use crate::clock::Millis;
use crate::store::seq_arrival_ms;

/// Waits below this fall in bucket 0.
const FLOOR_MS: f64 = 250.0;
/// Buckets per doubling: a bucket is 2^(1/8) ≈ 9% wide, so a quantile read
/// at a bucket's geometric middle is within 4.5% of the true value.
const PER_DOUBLING: f64 = 8.0;
/// Bucket 0 (under `FLOOR_MS`), then 159 buckets up to about 2.7 days; the
/// last one also holds everything longer.
pub(crate) const BUCKETS: usize = 160;
/// Minutes kept: one hour.
pub(crate) const MINUTES: usize = 60;
const MINUTE_MS: u64 = 60_000;

/// The buckets of `waitroom_queue_wait_seconds`, in seconds.
pub(crate) const PROMETHEUS_BUCKETS: [f64; 15] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0,
    28800.0, 86400.0,
];

/// The bucket a wait of `ms` falls in.
pub(crate) fn bucket(ms: u64) -> usize {
    let ms = ms as f64;
    if ms < FLOOR_MS {
        return 0;
    }
    let i = ((ms / FLOOR_MS).log2() * PER_DOUBLING).floor() as usize + 1;
    i.min(BUCKETS - 1)
}

/// The wait a bucket stands for, in milliseconds: its geometric middle (the
/// middle of bucket 0, the lower bound of the open-ended last one).
fn representative_ms(i: usize) -> f64 {
    match i {
        0 => FLOOR_MS / 2.0,
        i if i == BUCKETS - 1 => FLOOR_MS * ((i - 1) as f64 / PER_DOUBLING).exp2(),
        i => FLOOR_MS * ((i as f64 - 0.5) / PER_DOUBLING).exp2(),
    }
}

/// Counts of waits by bucket.
#[derive(Clone)]
pub(crate) struct Counts([u32; BUCKETS]);

impl Default for Counts {
    fn default() -> Self {
        Self([0; BUCKETS])
    }
}

impl Counts {
    /// Adds `n` waits to bucket `i` (an `i` past the last goes in the last).
    pub(crate) fn add_to(&mut self, i: usize, n: u32) {
        let c = &mut self.0[i.min(BUCKETS - 1)];
        *c = c.saturating_add(n);
    }

    /// The buckets that hold anything, and how much: what a report keeps.
    pub(crate) fn take(&mut self) -> Vec<(usize, u32)> {
        let out = self
            .0
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| (i, c))
            .collect();
        self.0 = [0; BUCKETS];
        out
    }

    pub(crate) fn total(&self) -> u64 {
        self.0.iter().map(|&c| u64::from(c)).sum()
    }

    fn add(&mut self, other: &Counts) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a = a.saturating_add(*b);
        }
    }

    /// The nearest-rank `q` quantile, in seconds; `None` without data.
    pub(crate) fn quantile_seconds(&self, q: f64) -> Option<f64> {
        let n = self.total();
        if n == 0 {
            return None;
        }
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0u64;
        for (i, &c) in self.0.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                return Some(round_tenth(representative_ms(i) / 1000.0));
            }
        }
        None
    }

    fn summary(&self) -> (u64, Option<f64>, Option<f64>) {
        (
            self.total(),
            self.quantile_seconds(0.5),
            self.quantile_seconds(0.9),
        )
    }
}

fn round_tenth(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// One clock minute's waits.
struct Slot {
    /// Minutes since the Unix epoch; `u64::MAX` while unused.
    minute: u64,
    counts: Counts,
}

/// A room's waits over the last hour, a histogram per clock minute in a
/// ring: recording and summing cost the same however many visitors wait.
pub(crate) struct WaitHour {
    slots: Vec<Slot>,
    /// Waits not yet written to the room's report (`telemetry::report`).
    pending: Counts,
}

impl Default for WaitHour {
    fn default() -> Self {
        Self {
            slots: (0..MINUTES)
                .map(|_| Slot {
                    minute: u64::MAX,
                    counts: Counts([0; BUCKETS]),
                })
                .collect(),
            pending: Counts::default(),
        }
    }
}

/// The waits of one minute (or of the hour), as `/api/history` serves them.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WaitFigures {
    /// Start of the minute, milliseconds since the Unix epoch (absent for the hour).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t: Option<u64>,
    /// Visitors let in from the queue.
    pub count: u64,
    /// Median time in queue, seconds (`null` without data).
    pub p50_seconds: Option<f64>,
    /// 90th percentile, seconds.
    pub p90_seconds: Option<f64>,
}

/// The last hour's waits of a room.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WaitSummary {
    /// Over the current minute and the 59 before it.
    #[serde(flatten)]
    pub hour: WaitFigures,
    /// Each minute that let anyone in from the queue, oldest first.
    pub minutes: Vec<WaitFigures>,
}

impl WaitHour {
    /// Records a visitor let in at `now` after waiting `wait_ms`.
    pub(crate) fn record(&mut self, wait_ms: u64, now: Millis) {
        let minute = now / MINUTE_MS;
        let slot = &mut self.slots[(minute % MINUTES as u64) as usize];
        if slot.minute != minute {
            slot.minute = minute;
            slot.counts.0 = [0; BUCKETS];
        }
        let c = &mut slot.counts.0[bucket(wait_ms)];
        *c = c.saturating_add(1);
        self.pending.add_to(bucket(wait_ms), 1);
    }

    /// The waits recorded since the last call, by bucket.
    pub(crate) fn take_pending(&mut self) -> Vec<(usize, u32)> {
        self.pending.take()
    }

    /// The hour up to `now`: the current minute and the 59 before it.
    pub(crate) fn summary(&self, now: Millis) -> WaitSummary {
        let current = now / MINUTE_MS;
        let mut live: Vec<&Slot> = self
            .slots
            .iter()
            .filter(|s| s.minute <= current && current - s.minute < MINUTES as u64)
            .collect();
        live.sort_by_key(|s| s.minute);
        let mut hour = Counts([0; BUCKETS]);
        let minutes = live
            .iter()
            .map(|s| {
                hour.add(&s.counts);
                let (count, p50, p90) = s.counts.summary();
                WaitFigures {
                    t: Some(s.minute * MINUTE_MS),
                    count,
                    p50_seconds: p50,
                    p90_seconds: p90,
                }
            })
            .collect();
        let (count, p50, p90) = hour.summary();
        WaitSummary {
            hour: WaitFigures {
                t: None,
                count,
                p50_seconds: p50,
                p90_seconds: p90,
            },
            minutes,
        }
    }
}

/// A room's handle for waits: one call feeds the Prometheus histogram and
/// the hour the dashboard reads.
#[derive(Clone)]
pub struct QueueWait {
    pub(crate) seconds: Histogram,
    pub(crate) hour: Arc<Mutex<WaitHour>>,
}

impl QueueWait {
    /// A visitor whose queue ticket has `seq` is let in at `now`.
    pub fn admitted(&self, seq: u64, now: Millis) {
        let wait_ms = now.saturating_sub(seq_arrival_ms(seq));
        self.seconds.observe(wait_ms as f64 / 1000.0);
        self.hour
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(wait_ms, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_800_000_000_000;

    fn within(got: Option<f64>, want: f64, tolerance: f64) -> bool {
        got.is_some_and(|g| (g - want).abs() <= want * tolerance)
    }

    #[test]
    fn buckets_are_ordered_and_their_middles_fall_inside() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(249), 0);
        assert_eq!(bucket(250), 1);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        let mut last = 0;
        for ms in (0..10_000_000u64).step_by(997) {
            let b = bucket(ms);
            assert!(b >= last, "monotonic at {ms}");
            last = b;
        }
        for i in 1..BUCKETS - 1 {
            let mid = representative_ms(i);
            assert_eq!(bucket(mid as u64), i, "middle of bucket {i}");
        }
        // Two days fit below the open-ended last bucket.
        assert!(bucket(2 * 86_400_000) < BUCKETS - 1);
    }

    #[test]
    fn quantiles_of_known_waits_are_within_the_bucket_error() {
        let mut h = WaitHour::default();
        for s in [20u64, 40, 60, 120, 300] {
            h.record(s * 1000, T0);
        }
        let sum = h.summary(T0);
        assert_eq!(sum.hour.count, 5);
        // Nearest rank: the 3rd and the 5th of five.
        assert!(within(sum.hour.p50_seconds, 60.0, 0.045), "{sum:?}");
        assert!(within(sum.hour.p90_seconds, 300.0, 0.045), "{sum:?}");

        // 1..=1000 s: the median is 500 s, the 90th percentile 900 s.
        let mut h = WaitHour::default();
        for s in 1..=1000u64 {
            h.record(s * 1000, T0);
        }
        let sum = h.summary(T0);
        assert!(within(sum.hour.p50_seconds, 500.0, 0.045), "{sum:?}");
        assert!(within(sum.hour.p90_seconds, 900.0, 0.045), "{sum:?}");
    }

    #[test]
    fn no_waits_no_figures() {
        let sum = WaitHour::default().summary(T0);
        assert_eq!(sum.hour.count, 0);
        assert_eq!(sum.hour.p50_seconds, None);
        assert_eq!(sum.hour.p90_seconds, None);
        assert!(sum.minutes.is_empty());
    }

    #[test]
    fn each_minute_has_its_own_figures_and_the_hour_sums_them() {
        let mut h = WaitHour::default();
        h.record(10_000, T0);
        h.record(10_000, T0 + 59_999);
        h.record(600_000, T0 + 60_000);
        let sum = h.summary(T0 + 61_000);
        assert_eq!(sum.minutes.len(), 2);
        assert_eq!(sum.minutes[0].t, Some(T0));
        assert_eq!(sum.minutes[0].count, 2);
        assert!(within(sum.minutes[0].p90_seconds, 10.0, 0.045));
        assert_eq!(sum.minutes[1].t, Some(T0 + 60_000));
        assert!(within(sum.minutes[1].p50_seconds, 600.0, 0.045));
        assert_eq!(sum.hour.count, 3);
        assert!(within(sum.hour.p50_seconds, 10.0, 0.045));
        assert!(within(sum.hour.p90_seconds, 600.0, 0.045));
    }

    #[test]
    fn minutes_older_than_an_hour_drop_out_and_slots_are_reused() {
        let mut h = WaitHour::default();
        h.record(1_000, T0);
        h.record(2_000, T0 + 59 * 60_000);
        assert_eq!(h.summary(T0 + 59 * 60_000).hour.count, 2);
        // An hour after the first minute began, it is out of the window.
        assert_eq!(h.summary(T0 + 60 * 60_000).hour.count, 1);
        // Its slot is reused by the minute an hour later, starting empty.
        h.record(3_000, T0 + 60 * 60_000);
        let sum = h.summary(T0 + 60 * 60_000);
        assert_eq!(sum.hour.count, 2);
        assert_eq!(sum.minutes.last().unwrap().count, 1);
        // A clock that went back does not count the future.
        assert_eq!(h.summary(T0).hour.count, 0);
    }

    #[test]
    fn the_wait_is_read_from_the_tickets_seq() {
        let handle = QueueWait {
            seconds: Histogram::new(PROMETHEUS_BUCKETS),
            hour: Arc::default(),
        };
        let arrived = T0 - 90_000;
        handle.admitted(crate::store::next_seq(arrived, 0), T0);
        let sum = handle.hour.lock().unwrap().summary(T0);
        assert!(within(sum.hour.p50_seconds, 90.0, 0.045), "{sum:?}");
        // A seq from a clock ahead of ours is no negative wait.
        handle.admitted(crate::store::next_seq(T0 + 5_000, 0), T0);
        assert_eq!(handle.hour.lock().unwrap().summary(T0).hour.count, 2);
    }
}
