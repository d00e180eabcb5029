//! Wall-clock time as an injected input, so tests move time instead of sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::BoxFuture;
use tokio::sync::watch;

/// Milliseconds since the Unix epoch. Every store operation takes one of these.
pub type Millis = u64;

/// A source of wall-clock time.
pub trait Clock: Send + Sync + 'static {
    /// The time now.
    fn now_ms(&self) -> Millis;

    /// Resolves once this clock reads `at` or later, so periodic work
    /// follows the injected clock. The default sleeps out the gap on
    /// tokio's timer (right for a clock that moves with real time).
    fn sleep_until(&self, at: Millis) -> BoxFuture<'_, ()> {
        let gap = at.saturating_sub(self.now_ms());
        Box::pin(tokio::time::sleep(Duration::from_millis(gap)))
    }
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
pub struct ManualClock(Arc<Manual>);

#[derive(Debug)]
struct Manual {
    now: AtomicU64,
    /// Told every time the clock moves, for whoever waits on it.
    moved: watch::Sender<()>,
}

impl ManualClock {
    /// A clock that reads `start_ms` until moved.
    pub fn new(start_ms: Millis) -> Self {
        Self(Arc::new(Manual {
            now: AtomicU64::new(start_ms),
            moved: watch::Sender::new(()),
        }))
    }

    /// Moves the clock forward by `by`, waking whoever sleeps on it.
    pub fn advance(&self, by: std::time::Duration) {
        self.0
            .now
            .fetch_add(by.as_millis() as u64, Ordering::SeqCst);
        self.0.moved.send_replace(());
    }

    /// Sets the clock to `to_ms` (backwards too), waking whoever sleeps on it.
    pub fn set(&self, to_ms: Millis) {
        self.0.now.store(to_ms, Ordering::SeqCst);
        self.0.moved.send_replace(());
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> Millis {
        self.0.now.load(Ordering::SeqCst)
    }

    /// Waits until a test moves the clock to `at` (never on real time).
    fn sleep_until(&self, at: Millis) -> BoxFuture<'_, ()> {
        // Subscribed before the first look, so a move in between is seen.
        let mut moved = self.0.moved.subscribe();
        Box::pin(async move {
            while self.now_ms() < at {
                if moved.changed().await.is_err() {
                    return;
                }
            }
        })
    }
}

/// A shared handle to whichever clock the daemon runs on.
pub type SharedClock = Arc<dyn Clock>;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manual_clock_wakes_a_sleeper_only_once_moved_to_its_time() {
        let clock = ManualClock::new(1_000);
        let c = clock.clone();
        let sleeper = tokio::spawn(async move {
            c.sleep_until(1_500).await;
            c.now_ms()
        });
        tokio::task::yield_now().await;
        clock.advance(Duration::from_millis(200));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished(), "woke at 1200 for 1500");
        clock.advance(Duration::from_millis(300));
        let woke = tokio::time::timeout(Duration::from_secs(5), sleeper)
            .await
            .expect("woken once the clock reached 1500")
            .unwrap();
        assert_eq!(woke, 1_500);
    }
}
