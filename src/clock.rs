//! Wall-clock time as an injected input, so tests move time instead of sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch. Every store operation takes one of these.
pub type Millis = u64;

/// A source of wall-clock time.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> Millis;
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> Millis {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as Millis)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to. Cloning shares the same time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    pub fn new(start_ms: Millis) -> Self {
        Self(Arc::new(AtomicU64::new(start_ms)))
    }

    pub fn advance(&self, by: std::time::Duration) {
        self.0.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }

    pub fn set(&self, to_ms: Millis) {
        self.0.store(to_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> Millis {
        self.0.load(Ordering::SeqCst)
    }
}

/// A shared handle to whichever clock the daemon runs on.
pub type SharedClock = Arc<dyn Clock>;
