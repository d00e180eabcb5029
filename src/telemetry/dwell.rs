//! Time on origin: how long an admitted visitor stayed, from its admission
//! to the last time this instance saw it (an admission, a check-in, the
//! end of its session). Followed per visitor for the visitors this
//! instance admitted, at most [`MAX_FOLLOWED`] at once; a visitor is done
//! when its session ends here or when nothing was seen of it for a whole
//! session. Check-ins come at most a minute apart, so a stay is known to
//! within its room's check-in interval; with instances behind a balancer
//! that spreads one visitor's requests, the instance that admitted it
//! sees only some of its check-ins and a stay can read short by up to a
//! session (docs/operating.md, "Reports").

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::wait::{bucket, Counts};
use crate::clock::Millis;
use crate::domain::VisitorId;

/// Most visitors followed at once per room; past it new ones are not
/// followed (counted in `unfollowed`).
pub(crate) const MAX_FOLLOWED: usize = 200_000;

/// One room's followed visitors and the stays not yet reported.
#[derive(Default)]
pub(crate) struct Stays {
    /// Visitor -> (admitted at, last seen).
    open: HashMap<VisitorId, (Millis, Millis)>,
    pending: Counts,
    /// Admissions not followed because `MAX_FOLLOWED` were.
    pub(crate) unfollowed: u64,
}

impl Stays {
    fn admitted(&mut self, visitor: VisitorId, now: Millis) {
        if self.open.len() < MAX_FOLLOWED {
            self.open.entry(visitor).or_insert((now, now));
        } else {
            self.unfollowed += 1;
        }
    }

    fn seen(&mut self, visitor: VisitorId, now: Millis) {
        if let Some(stay) = self.open.get_mut(&visitor) {
            stay.1 = stay.1.max(now);
        }
    }

    fn ended(&mut self, visitor: VisitorId, now: Millis) {
        if let Some((admitted, _)) = self.open.remove(&visitor) {
            self.pending.add_to(bucket(now.saturating_sub(admitted)), 1);
        }
    }

    /// Ends the stays of visitors not seen for `idle` (their session ran
    /// out): each lasted until it was last seen. Returns the stays ended
    /// since the last call, by bucket (`wait::bucket`'s).
    pub(crate) fn take(&mut self, now: Millis, idle: Millis) -> Vec<(usize, u32)> {
        let pending = &mut self.pending;
        self.open.retain(|_, &mut (admitted, last)| {
            let gone = last.saturating_add(idle) <= now;
            if gone {
                pending.add_to(bucket(last.saturating_sub(admitted)), 1);
            }
            !gone
        });
        self.pending.take()
    }
}

/// A room's handle on its stays (cheap to clone; config reloads keep it).
#[derive(Clone, Default)]
pub struct TimeOnOrigin(pub(crate) Arc<Mutex<Stays>>);

impl TimeOnOrigin {
    fn stays(&self) -> std::sync::MutexGuard<'_, Stays> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `visitor` was admitted at `now`.
    pub fn admitted(&self, visitor: VisitorId, now: Millis) {
        self.stays().admitted(visitor, now);
    }

    /// `visitor`'s session was checked in at `now`.
    pub fn seen(&self, visitor: VisitorId, now: Millis) {
        self.stays().seen(visitor, now);
    }

    /// `visitor`'s session ended at `now` (released, revoked, ended by the origin).
    pub fn ended(&self, visitor: VisitorId, now: Millis) {
        self.stays().ended(visitor, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(n: u8) -> VisitorId {
        VisitorId([n; 16])
    }

    fn total(buckets: &[(usize, u32)]) -> u32 {
        buckets.iter().map(|(_, c)| c).sum()
    }

    #[test]
    fn a_stay_lasts_from_admission_to_the_last_sighting_or_the_end() {
        let mut s = Stays::default();
        s.admitted(v(1), 0);
        s.admitted(v(2), 0);
        s.seen(v(1), 120_000);
        s.ended(v(2), 30_000);
        // v(2) ended; v(1) still within its session.
        let got = s.take(150_000, 300_000);
        assert_eq!(got, vec![(bucket(30_000), 1)]);
        // Silent for a whole session: its stay ends at its last check-in.
        let got = s.take(420_000, 300_000);
        assert_eq!(got, vec![(bucket(120_000), 1)]);
        assert_eq!(total(&s.take(10_000_000, 1)), 0);
    }

    #[test]
    fn visitors_past_the_cap_are_counted_not_followed() {
        let mut s = Stays::default();
        for i in 0..MAX_FOLLOWED as u32 + 3 {
            let mut id = [0u8; 16];
            id[..4].copy_from_slice(&i.to_le_bytes());
            s.admitted(VisitorId(id), 0);
        }
        assert_eq!(s.unfollowed, 3);
        assert_eq!(total(&s.take(1_000, 1)), MAX_FOLLOWED as u32);
    }
}
