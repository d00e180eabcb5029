//! What the daemon reports about itself and outlives a config reload:
//! Prometheus metrics (in the text format the scraper asks for), the last
//! hour of each room's figures and of its visitors' time in queue for the
//! dashboard, and the draining flag `/ready` reads. The gate writes it, the
//! admin listener reads it; it depends on neither.

pub mod exposition;
pub(crate) mod history;
pub(crate) mod metrics;
pub(crate) mod wait;

use std::sync::atomic::AtomicBool;

use history::{per_minute, Report, RoomHistory};

pub use history::History;
pub use metrics::{Metrics, RoomMetrics};

/// Metrics, history and the draining flag, shared by every gate a reload builds.
#[derive(Default)]
pub struct Telemetry {
    pub(crate) metrics: Metrics,
    pub(crate) history: History,
    /// Set on SIGTERM: `/ready` answers 503 so load balancers stop sending.
    pub draining: AtomicBool,
}

impl Telemetry {
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
