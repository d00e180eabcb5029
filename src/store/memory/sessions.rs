//! Sessions and the sliding rate window of one room in the memory store.

use std::collections::{BTreeSet, VecDeque};

use super::{VisitorMap, SPIKE};
use crate::clock::Millis;
use crate::store::{VisitorId, RATE_WINDOW_MS};

/// Live sessions, with an expiry index so expiring them costs O(log n) each.
#[derive(Default)]
pub(super) struct Sessions {
    pub(super) expiry: VisitorMap<Millis>,
    by_expiry: BTreeSet<(Millis, VisitorId)>,
}

impl Sessions {
    pub(super) fn len(&self) -> u64 {
        self.expiry.len() as u64
    }

    pub(super) fn expire(&mut self, now: Millis) {
        while let Some(&(at, visitor)) = self.by_expiry.first() {
            if at > now {
                break;
            }
            self.by_expiry.pop_first();
            self.expiry.remove(&visitor);
        }
        if self.expiry.is_empty() && self.expiry.capacity() > SPIKE {
            self.expiry.shrink_to_fit();
        }
    }

    pub(super) fn get(&self, visitor: &VisitorId) -> Option<Millis> {
        self.expiry.get(visitor).copied()
    }

    pub(super) fn set(&mut self, visitor: VisitorId, expires: Millis) {
        if let Some(old) = self.expiry.insert(visitor, expires) {
            self.by_expiry.remove(&(old, visitor));
        }
        self.by_expiry.insert((expires, visitor));
    }

    /// What is violated of: the map and the expiry index hold the same
    /// pairs.
    pub(super) fn violations(&self, what: &str, out: &mut Vec<String>) {
        if self.expiry.len() != self.by_expiry.len() {
            out.push(format!(
                "{what}: {} by visitor, {} by expiry",
                self.expiry.len(),
                self.by_expiry.len()
            ));
        }
        for (at, visitor) in &self.by_expiry {
            if self.expiry.get(visitor) != Some(at) {
                out.push(format!(
                    "{what}: {visitor} indexed at {at}, not in the map so"
                ));
            }
        }
    }

    pub(super) fn remove(&mut self, visitor: &VisitorId) -> bool {
        match self.expiry.remove(visitor) {
            Some(old) => {
                self.by_expiry.remove(&(old, *visitor));
                true
            }
            None => false,
        }
    }
}

/// Admission times within the sliding window, one `(ms, count)` run per
/// millisecond, oldest first.
#[derive(Default)]
pub(super) struct RateWindow {
    runs: VecDeque<(Millis, u64)>,
    /// Sum of the runs' counts.
    total: u64,
}

impl RateWindow {
    /// Forgets admissions outside `(now - 60 s, now]`. Admissions stamped
    /// later than `now` (a caller whose clock read came before another's
    /// lock) stay counted: over-counting can only delay an admission, never
    /// break I2.
    pub(super) fn prune(&mut self, now: Millis) {
        let cutoff = now.saturating_sub(RATE_WINDOW_MS);
        while let Some(&(at, n)) = self.runs.front() {
            if at > cutoff {
                break;
            }
            self.runs.pop_front();
            self.total -= n;
        }
    }

    pub(super) fn record(&mut self, now: Millis) {
        self.total += 1;
        let pos = self.runs.partition_point(|&(at, _)| at < now);
        match self.runs.get_mut(pos) {
            Some((at, n)) if *at == now => *n += 1,
            _ => self.runs.insert(pos, (now, 1)),
        }
    }

    pub(super) fn count(&self) -> u64 {
        self.total
    }

    /// What is violated of: runs in time order, their counts summed in `total`.
    pub(super) fn violations(&self, out: &mut Vec<String>) {
        let sum: u64 = self.runs.iter().map(|(_, n)| n).sum();
        if sum != self.total {
            out.push(format!(
                "window: runs hold {sum}, the total says {}",
                self.total
            ));
        }
        if self
            .runs
            .iter()
            .zip(self.runs.iter().skip(1))
            .any(|(a, b)| a.0 >= b.0)
        {
            out.push("window: runs out of time order".into());
        }
    }

    pub(super) fn oldest(&self) -> Option<Millis> {
        self.runs.front().map(|&(at, _)| at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_window_counts_runs_and_prunes_at_the_edge() {
        let mut w = RateWindow::default();
        w.record(1_000_000);
        w.record(1_000_000);
        w.record(1_000_500);
        // An out-of-order stamp lands in order.
        w.record(1_000_200);
        assert_eq!(w.count(), 4);
        assert_eq!(w.runs.len(), 3);
        w.prune(1_060_000);
        assert_eq!(w.count(), 2);
        assert_eq!(w.oldest(), Some(1_000_200));
        w.prune(1_060_500);
        assert_eq!(w.count(), 0);
        assert_eq!(w.oldest(), None);
    }
}
