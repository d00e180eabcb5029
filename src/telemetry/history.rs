//! The last hour of each room's figures, kept in memory for the dashboard.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde::Serialize;

/// One sample every this many milliseconds at most.
pub const SAMPLE_EVERY_MS: u64 = 5_000;
/// An hour of samples.
pub const KEEP: usize = 720;

/// A room's figures at one moment.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct Sample {
    /// Milliseconds since the Unix epoch.
    pub t: u64,
    pub active: u64,
    pub limit: u64,
    pub queued: u64,
    pub admitted_per_minute: u64,
    pub eta_seconds: u64,
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
            admitted_per_minute: 4,
            eta_seconds: 5,
        }
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
