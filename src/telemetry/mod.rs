//! What the daemon reports about itself and outlives a config reload:
//! Prometheus metrics, the last hour of each room's figures for the
//! dashboard, and the draining flag `/ready` reads. The gate writes it, the
//! admin listener reads it; it depends on neither.

pub mod history;
pub mod metrics;

use std::sync::atomic::AtomicBool;

pub use history::History;
pub use metrics::{Metrics, RoomMetrics};

/// Metrics, history and the draining flag, shared by every gate a reload builds.
#[derive(Default)]
pub struct Telemetry {
    pub metrics: Metrics,
    pub history: History,
    /// Set on SIGTERM: `/ready` answers 503 so load balancers stop sending.
    pub draining: AtomicBool,
}
