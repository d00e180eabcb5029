//! What the daemon reports about itself and outlives a config reload:
//! Prometheus metrics (in the text format the scraper asks for), the last
//! hour of each room's figures and of its visitors' time in queue for the
//! dashboard, and the draining flag `/ready` reads. The gate writes it, the
//! admin listener reads it; it depends on neither.

pub(crate) mod dwell;
pub mod exposition;
pub(crate) mod history;
pub(crate) mod metrics;
pub(crate) mod report;
pub(crate) mod wait;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use history::{per_minute, Report, RoomHistory};

pub use history::History;
pub use metrics::{Metrics, RoomMetrics};

/// Metrics, history and the draining flag, shared by every gate a reload builds.
#[derive(Default)]
pub struct Telemetry {
    pub(crate) metrics: Metrics,
    pub(crate) history: History,
    /// Each room's report share not yet in the store (`report`).
    pub(crate) tallies: Mutex<HashMap<String, report::Tally>>,
    /// Where the rooms' happenings go (`[[webhook]]`); a reload puts the
    /// new list in force.
    pub webhooks: crate::webhook::Webhooks,
    /// Set on SIGTERM: `/ready` answers 503 so load balancers stop sending.
    pub draining: AtomicBool,
}

impl Telemetry {
    /// Telemetry sending to `webhooks`, whose figures `/metrics` exports.
    pub fn new(webhooks: crate::webhook::Webhooks) -> Self {
        Self {
            metrics: Metrics::with_webhooks(Some(webhooks.metrics())),
            webhooks,
            ..Self::default()
        }
    }

    /// Folds what this instance saw of `room` into its tally; returns the
    /// minutes to write to the store now ([`report::Tally::observe`]).
    pub(crate) fn tally(
        &self,
        room: &str,
        metrics: &RoomMetrics,
        seen: report::Observed,
        now: u64,
    ) -> Vec<(u64, crate::store::ReportMinute)> {
        let mut tallies = self.tallies.lock().unwrap_or_else(|p| p.into_inner());
        tallies.entry(room.to_owned()).or_default().observe(
            metrics,
            &metrics.time_on_origin,
            seen,
            now,
        )
    }

    /// Everything this instance tallied of `room` up to `now`, to write
    /// before its report is read.
    pub(crate) fn tally_now(
        &self,
        room: &str,
        metrics: &RoomMetrics,
        seen: Option<report::Observed>,
        now: u64,
    ) -> Vec<(u64, crate::store::ReportMinute)> {
        let mut tallies = self.tallies.lock().unwrap_or_else(|p| p.into_inner());
        tallies
            .entry(room.to_owned())
            .or_default()
            .now(metrics, &metrics.time_on_origin, seen, now)
    }

    /// Takes back minutes the store did not take.
    pub(crate) fn untallied(&self, room: &str, minutes: Vec<(u64, crate::store::ReportMinute)>) {
        let mut tallies = self.tallies.lock().unwrap_or_else(|p| p.into_inner());
        tallies
            .entry(room.to_owned())
            .or_default()
            .unwritten(minutes);
    }

    /// Every room's last hour up to `now`: samples, admissions per minute
    /// and time in queue.
    pub fn history(&self, now: u64) -> Report {
        let mut rooms: std::collections::BTreeMap<String, RoomHistory> = self
            .history
            .snapshot()
            .into_iter()
            .map(|(room, samples)| {
                let minutes = per_minute(&samples);
                let history = RoomHistory {
                    samples,
                    minutes,
                    queue_wait: Default::default(),
                };
                (room, history)
            })
            .collect();
        for (room, waits) in self.metrics.queue_waits(now) {
            rooms.entry(room).or_default().queue_wait = waits;
        }
        Report { now, rooms }
    }
}
