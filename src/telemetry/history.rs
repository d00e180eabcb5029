//! The last hour of each room's figures, kept in memory for the dashboard,
//! and the admissions of each clock minute worked out from them.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use serde::Serialize;

use super::wait::WaitSummary;

/// One sample every this many milliseconds at most.
pub(crate) const SAMPLE_EVERY_MS: u64 = 5_000;
/// An hour of samples.
pub(crate) const KEEP: usize = 720;
const MINUTE_MS: u64 = 60_000;

/// A room's figures at one moment.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct Sample {
    /// Milliseconds since the Unix epoch.
    pub t: u64,
    pub active: u64,
    pub limit: u64,
    pub queued: u64,
    /// The store's cumulative count of admissions (every instance); `None`
    /// when the store did not answer it.
    pub admitted_total: Option<u64>,
    pub eta_seconds: u64,
}

/// Admissions in one clock minute.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct Minute {
    /// Start of the minute, milliseconds since the Unix epoch.
    pub t: u64,
    pub admitted: u64,
}

/// Admissions per clock minute, from the samples' cumulative totals: a
/// minute's count is the total at its last sample less the total at the
/// last sample before it (the first minute counts from the first sample).
/// A total that went down (a reset, a store that lost its data) starts the
/// count over from that sample. Minutes without a sample are absent.
pub(crate) fn per_minute(samples: &[Sample]) -> Vec<Minute> {
    let mut minutes: Vec<Minute> = Vec::new();
    let mut last: Option<u64> = None;
    for s in samples {
        let Some(total) = s.admitted_total else {
            continue;
        };
        let admitted = match last {
            Some(before) if total >= before => total - before,
            _ => 0,
        };
        last = Some(total);
        let t = s.t - s.t % MINUTE_MS;
        match minutes.last_mut() {
            Some(m) if m.t == t => m.admitted += admitted,
            _ => minutes.push(Minute { t, admitted }),
        }
    }
    minutes
}

/// What `GET /api/history` answers.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The daemon's clock when the report was made (ms since the Unix
    /// epoch): the right end of the charted hour.
    pub now: u64,
    pub rooms: BTreeMap<String, RoomHistory>,
}

/// One room's last hour.
#[derive(Debug, Default, Serialize)]
pub struct RoomHistory {
    /// Oldest first.
    pub samples: Vec<Sample>,
    /// Admissions per clock minute (see [`per_minute`]), oldest first.
    pub minutes: Vec<Minute>,
    /// Time in queue over the hour and per minute.
    pub queue_wait: WaitSummary,
}

/// Ring buffers of samples by room id.
#[derive(Default)]
pub struct History {
    rooms: Mutex<HashMap<String, VecDeque<Sample>>>,
}

impl History {
    /// Records a sample unless the room's last one is younger than `SAMPLE_EVERY_MS`.
    pub fn record(&self, room: &str, sample: Sample) {
        let mut rooms = self.rooms.lock().unwrap_or_else(|p| p.into_inner());
        let samples = rooms.entry(room.to_owned()).or_default();
        if samples
            .back()
            .is_some_and(|last| sample.t < last.t + SAMPLE_EVERY_MS)
        {
            return;
        }
        if samples.len() == KEEP {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// Every room's samples, oldest first.
    pub fn snapshot(&self) -> HashMap<String, Vec<Sample>> {
        let rooms = self.rooms.lock().unwrap_or_else(|p| p.into_inner());
        rooms
            .iter()
            .map(|(id, s)| (id.clone(), s.iter().copied().collect()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t: u64) -> Sample {
        Sample {
            t,
            active: 1,
            limit: 2,
            queued: 3,
            admitted_total: Some(4),
            eta_seconds: 5,
        }
    }

    fn total_at(t: u64, total: Option<u64>) -> Sample {
        Sample {
            admitted_total: total,
            ..at(t)
        }
    }

    const M0: u64 = 1_800_000_000_000;

    fn minutes(samples: &[(u64, Option<u64>)]) -> Vec<(u64, u64)> {
        let samples: Vec<Sample> = samples.iter().map(|&(t, a)| total_at(t, a)).collect();
        per_minute(&samples)
            .iter()
            .map(|m| ((m.t - M0) / MINUTE_MS, m.admitted))
            .collect()
    }

    #[test]
    fn admissions_are_counted_per_clock_minute_between_boundaries() {
        // Samples every 20 s; admissions land between them.
        let got = minutes(&[
            (M0, Some(100)),
            (M0 + 20_000, Some(103)),
            (M0 + 40_000, Some(110)),
            // Minute 1: from 110 (the last total before it) to 125.
            (M0 + 60_000, Some(112)),
            (M0 + 80_000, Some(120)),
            (M0 + 100_000, Some(125)),
            // Minute 2: nothing.
            (M0 + 120_000, Some(125)),
            (M0 + 170_000, Some(125)),
            // Minute 3: the 5 between 170 s and 185 s count here.
            (M0 + 185_000, Some(130)),
        ]);
        assert_eq!(got, [(0, 10), (1, 15), (2, 0), (3, 5)]);
    }

    #[test]
    fn a_decreasing_total_starts_the_count_over() {
        let got = minutes(&[
            (M0, Some(50)),
            (M0 + 30_000, Some(60)),
            // Reset: the total drops to 2, then grows from there.
            (M0 + 65_000, Some(2)),
            (M0 + 90_000, Some(7)),
            (M0 + 125_000, Some(9)),
        ]);
        assert_eq!(got, [(0, 10), (1, 5), (2, 2)]);
    }

    #[test]
    fn samples_without_a_total_are_skipped_and_empty_minutes_absent() {
        let got = minutes(&[
            (M0 + 5_000, None),
            (M0 + 10_000, Some(1)),
            (M0 + 20_000, None),
            (M0 + 50_000, Some(4)),
            // Nothing recorded in minutes 1 and 2 (a store outage).
            (M0 + 190_000, Some(10)),
        ]);
        assert_eq!(got, [(0, 3), (3, 6)]);
        assert!(per_minute(&[]).is_empty());
    }

    #[test]
    fn keeps_one_sample_per_interval_and_one_hour_at_most() {
        let h = History::default();
        h.record("a", at(0));
        h.record("a", at(1_000));
        assert_eq!(h.snapshot()["a"].len(), 1);
        for i in 1..=KEEP as u64 + 10 {
            h.record("a", at(i * SAMPLE_EVERY_MS));
        }
        let samples = &h.snapshot()["a"];
        assert_eq!(samples.len(), KEEP);
        assert_eq!(
            samples.last().unwrap().t,
            (KEEP as u64 + 10) * SAMPLE_EVERY_MS
        );
    }
}
