//! How late this process's runtime runs its tasks: a sampler sleeps
//! [`TICK`] at a time and records how much later than asked it woke, and
//! how long a datagram it sends itself on loopback takes to be read. When
//! the daemon itself is saturated (a flash crowd on two cores), every
//! future waits its turn, a store call's timer fires late, and an answer
//! Redis gave in time looks like a timeout. The guard asks this before it
//! takes a timeout for a store that is down (`gate::guard`): a daemon
//! that is behind sheds newcomers with a fast "busy" answer that creates
//! nothing, rather than applying `fail_mode` (which, `open`, would let
//! them in).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How often the runtime is sampled.
const TICK: Duration = Duration::from_millis(10);

/// How long a late wake-up counts as recent.
const WINDOW: Duration = Duration::from_secs(1);

/// The runtime's recent lateness.
#[derive(Default)]
pub struct RuntimeLag {
    /// The largest lateness (µs) seen in the current and the previous window.
    current_us: AtomicU64,
    previous_us: AtomicU64,
}

impl RuntimeLag {
    /// A sampler on the current runtime (none outside one: then the lag
    /// reads 0). It stops when the returned value is dropped.
    pub fn start() -> Arc<Self> {
        let lag = Arc::new(Self::default());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(sample(Arc::downgrade(&lag)));
        }
        lag
    }

    /// The largest lateness of the last one to two seconds.
    pub fn recent(&self) -> Duration {
        let us = self
            .current_us
            .load(Ordering::Relaxed)
            .max(self.previous_us.load(Ordering::Relaxed));
        Duration::from_micros(us)
    }

    /// Records one lateness (tests feed it directly).
    pub fn record(&self, late: Duration) {
        let us = u64::try_from(late.as_micros()).unwrap_or(u64::MAX);
        self.current_us.fetch_max(us, Ordering::Relaxed);
    }

    fn rotate(&self) {
        let current = self.current_us.swap(0, Ordering::Relaxed);
        self.previous_us.store(current, Ordering::Relaxed);
    }
}

/// Each tick: how late the timer fired, and how long a datagram this task
/// sends itself on loopback takes to be read. The second is what a store
/// answer goes through (the runtime's I/O driver, then a turn for the task
/// it wakes), and under a saturated runtime it is late while timers still
/// fire on time.
async fn sample(lag: Weak<RuntimeLag>) {
    let probe = match tokio::net::UdpSocket::bind("127.0.0.1:0").await {
        Ok(socket) => socket.local_addr().ok().map(|addr| (socket, addr)),
        Err(e) => {
            tracing::debug!(error = %e, "runtime lag: no loopback probe; timers only");
            None
        }
    };
    let mut window_started = Instant::now();
    let mut buf = [0u8; 1];
    loop {
        let asked = Instant::now();
        tokio::time::sleep(TICK).await;
        let mut late = asked.elapsed().saturating_sub(TICK);
        if let Some((socket, addr)) = &probe {
            let sent = Instant::now();
            if socket.send_to(&[1], addr).await.is_ok() {
                // Bounded: a datagram lost on loopback must not stop the sampler.
                if let Ok(Ok(_)) = tokio::time::timeout(WINDOW, socket.recv_from(&mut buf)).await {
                    late = late.max(sent.elapsed());
                }
            }
        }
        let Some(lag) = lag.upgrade() else { return };
        lag.record(late);
        if window_started.elapsed() >= WINDOW {
            lag.rotate();
            window_started = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_wake_up_counts_for_one_to_two_windows() {
        let lag = RuntimeLag::default();
        assert_eq!(lag.recent(), Duration::ZERO);
        lag.record(Duration::from_millis(80));
        lag.record(Duration::from_millis(5));
        assert_eq!(lag.recent(), Duration::from_millis(80));
        lag.rotate();
        assert_eq!(lag.recent(), Duration::from_millis(80));
        lag.rotate();
        assert_eq!(lag.recent(), Duration::ZERO);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_blocked_runtime_is_seen() {
        let lag = RuntimeLag::start();
        tokio::time::sleep(Duration::from_millis(30)).await;
        // Hold the only worker: the sampler cannot run meanwhile.
        tokio::spawn(async { std::thread::sleep(Duration::from_millis(150)) })
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(
            lag.recent() >= Duration::from_millis(100),
            "{:?}",
            lag.recent()
        );
    }
}
