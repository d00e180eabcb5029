//! Autotune (`[room.autotune]`, docs/operating.md "Autotune"): the rate
//! of a room follows its origin's health. Forwarding counts, per room,
//! the requests it forwarded, the slow ones and the failed ones
//! ([`OriginWindow`], atomics only); once per interval the instance's
//! upkeep reads and clears the counts and, when they say so, moves the
//! rate by one step through [`Operator::amend`], with the time and the
//! reason of the move, so every instance applies one value and at most
//! one move is made per interval across them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::operator::{AmendError, Operator};
use super::Room;
use crate::clock::Millis;
use crate::config::AutotuneConfig;
use crate::domain::AutotuneMove;

/// What the origin did with one room's forwarded requests since the
/// window last opened. Each count is its own atomic: a read taken while
/// requests finish may split one request across two windows, which
/// moves nothing by more than that one request.
#[derive(Debug, Default)]
pub(crate) struct OriginWindow {
    forwarded: AtomicU64,
    slow: AtomicU64,
    errors: AtomicU64,
    /// When the window opened (store time, ms; 0: not yet).
    opened_ms: AtomicU64,
}

/// The counts of one closed window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) forwarded: u64,
    pub(crate) slow: u64,
    pub(crate) errors: u64,
}

impl OriginWindow {
    /// One forwarded request: how long the origin took and whether it
    /// failed (a 5xx answer, or no answer at all).
    pub(crate) fn record(&self, took: Duration, failed: bool, config: &AutotuneConfig) {
        self.forwarded.fetch_add(1, Ordering::Relaxed);
        if took > config.latency {
            self.slow.fetch_add(1, Ordering::Relaxed);
        }
        if failed {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counts of the window, once it has been open `interval` at
    /// `now`; a new window opens then. The first call only opens one.
    fn close(&self, now: Millis, interval: Duration) -> Option<Counts> {
        let opened = self.opened_ms.load(Ordering::Relaxed);
        if opened != 0 && now.saturating_sub(opened) < interval.as_millis() as u64 {
            return None;
        }
        // Only one upkeep closes a window (the timer's and a test's may meet).
        if self
            .opened_ms
            .compare_exchange(opened, now.max(1), Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return None;
        }
        let counts = Counts {
            forwarded: self.forwarded.swap(0, Ordering::Relaxed),
            slow: self.slow.swap(0, Ordering::Relaxed),
            errors: self.errors.swap(0, Ordering::Relaxed),
        };
        (opened != 0).then_some(counts)
    }
}

/// The move `counts` call for from the rate `current`: down one step
/// (not below the floor) when the slow or the failed share is above its
/// threshold; up one step (not above the ceiling) when both are at most
/// half theirs; else none. A rate outside floor and ceiling (the file's,
/// an operator's) is first brought inside them. Too few requests: none.
pub(crate) fn next_rate(
    config: &AutotuneConfig,
    counts: Counts,
    current: u64,
) -> Option<(u64, String)> {
    if counts.forwarded < config.min_requests || counts.forwarded == 0 {
        return None;
    }
    let current_in = current.clamp(config.floor, config.ceiling);
    let n = counts.forwarded as f64;
    let (slow, errors) = (counts.slow as f64 / n, counts.errors as f64 / n);
    let step = config.step_users();
    let (rate, reason) = if errors > config.error_share {
        (
            current_in.saturating_sub(step).max(config.floor),
            format!(
                "origin errors: {} of requests failed or answered 5xx",
                percent(errors)
            ),
        )
    } else if slow > config.slow_share {
        (
            current_in.saturating_sub(step).max(config.floor),
            format!(
                "origin slow: {} of requests over {}",
                percent(slow),
                humantime::format_duration(config.latency)
            ),
        )
    } else if errors <= config.error_share / 2.0 && slow <= config.slow_share / 2.0 {
        (
            current_in.saturating_add(step).min(config.ceiling),
            "recovered".to_owned(),
        )
    } else {
        (current_in, "brought within floor and ceiling".to_owned())
    };
    (rate != current).then_some((rate, reason))
}

/// A share as people read it: "7%", "0.5%".
fn percent(share: f64) -> String {
    let p = share * 100.0;
    if p >= 1.0 {
        format!("{p:.0}%")
    } else {
        format!("{p:.1}%")
    }
}

impl Operator {
    /// The room's autotune step, from upkeep: closes the room's window
    /// once per interval and, when its counts call for a move, stores the
    /// new rate unless a move (any instance's) was stored less than an
    /// interval ago.
    pub(super) async fn autotune(&self, room: &Room, now: Millis) {
        let Some(config) = &room.config.autotune else {
            return;
        };
        let Some(counts) = room.origin_health.close(now, config.interval) else {
            return;
        };
        let in_force = room.policy_at(now).new_users_per_minute;
        let interval = config.interval.as_millis() as u64;
        let mut moved = None;
        let outcome = self
            .amend(room, |o, _| {
                if let Some(last) = &o.autotune {
                    if now.saturating_sub(last.at_ms) < interval {
                        return Err("moved less than an interval ago".to_owned());
                    }
                }
                let current = o.settings.new_users_per_minute.unwrap_or(in_force);
                let Some((rate, reason)) = next_rate(config, counts, current) else {
                    return Err("hold".to_owned());
                };
                o.settings.new_users_per_minute = Some(rate);
                o.autotune = Some(AutotuneMove {
                    rate,
                    at_ms: now,
                    reason: reason.clone(),
                });
                moved = Some((current, rate, reason));
                Ok(())
            })
            .await;
        match (outcome, moved) {
            (Ok(_), Some((from, to, reason))) => tracing::info!(
                room = %room.config.id,
                from,
                to,
                reason,
                "autotune moved the rate"
            ),
            (Err(AmendError::Refused(why)), _) => tracing::debug!(
                room = %room.config.id,
                forwarded = counts.forwarded,
                slow = counts.slow,
                errors = counts.errors,
                why,
                "autotune held the rate"
            ),
            (Err(e), _) => {
                tracing::warn!(room = %room.config.id, error = %e, "autotune's move was not recorded")
            }
            (Ok(_), None) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> AutotuneConfig {
        AutotuneConfig {
            latency: Duration::from_secs(2),
            slow_share: 0.02,
            error_share: 0.05,
            floor: 20,
            ceiling: 100,
            step: 0.2,
            interval: Duration::from_secs(30),
            min_requests: 10,
        }
    }

    fn counts(forwarded: u64, slow: u64, errors: u64) -> Counts {
        Counts {
            forwarded,
            slow,
            errors,
        }
    }

    #[test]
    fn slow_or_failing_origins_step_down_to_the_floor() {
        let c = config();
        assert_eq!(
            next_rate(&c, counts(100, 7, 0), 100),
            Some((80, "origin slow: 7% of requests over 2s".to_owned()))
        );
        assert_eq!(
            next_rate(&c, counts(100, 0, 6), 30),
            Some((
                20,
                "origin errors: 6% of requests failed or answered 5xx".to_owned()
            ))
        );
        assert_eq!(next_rate(&c, counts(100, 50, 50), 20), None);
    }

    #[test]
    fn healthy_origins_step_up_to_the_ceiling() {
        let c = config();
        assert_eq!(
            next_rate(&c, counts(100, 1, 2), 20),
            Some((40, "recovered".to_owned()))
        );
        assert_eq!(
            next_rate(&c, counts(100, 0, 0), 90),
            Some((100, "recovered".to_owned()))
        );
        assert_eq!(next_rate(&c, counts(100, 0, 0), 100), None);
    }

    #[test]
    fn between_half_and_the_threshold_holds_and_few_requests_move_nothing() {
        let c = config();
        assert_eq!(next_rate(&c, counts(100, 2, 4), 60), None);
        assert_eq!(next_rate(&c, counts(9, 9, 9), 60), None);
        assert_eq!(next_rate(&c, counts(0, 0, 0), 60), None);
    }

    #[test]
    fn a_rate_outside_the_bounds_is_brought_inside() {
        let c = config();
        assert_eq!(
            next_rate(&c, counts(100, 1, 1), 500),
            Some((100, "recovered".to_owned()))
        );
        assert!(matches!(
            next_rate(&c, counts(100, 50, 0), 5),
            Some((20, _))
        ));
        // Holding, a rate outside is still brought inside, and says so.
        assert_eq!(
            next_rate(&c, counts(100, 2, 4), 500),
            Some((100, "brought within floor and ceiling".to_owned()))
        );
    }

    #[test]
    fn a_window_closes_once_per_interval() {
        let (w, c) = (OriginWindow::default(), config());
        assert_eq!(w.close(1_000, c.interval), None, "the first call opens it");
        w.record(Duration::from_secs(3), false, &c);
        w.record(Duration::from_millis(10), true, &c);
        assert_eq!(w.close(30_999, c.interval), None);
        assert_eq!(w.close(31_000, c.interval), Some(counts(2, 1, 1)));
        assert_eq!(w.close(31_000, c.interval), None);
        assert_eq!(w.close(61_000, c.interval), Some(counts(0, 0, 0)));
    }
}
