//! Answering queued visitors' polls without a script per poll.
//!
//! A queue of a million visitors polling every 20 s is 50,000 polls a
//! second against the one Redis core that holds the room. Nearly all of
//! those visitors are far from the front, and for them the answer is known
//! in advance: still queued, at about such a position. So each instance
//! keeps, per room, a *description* of the queue (`lua/frontier.lua`),
//! refreshed a few times a second while polls come in:
//!
//! * the **frontier**: the `seq` of the visitor at rank `bound`, where
//!   `bound` is the most admissions the room's sliding rate window can allow
//!   before the description goes stale. Whoever has a higher `seq` has more
//!   visitors ahead than can be admitted in that time, so cannot be
//!   admitted before then: FIFO promotion takes the front first (I3), and
//!   every admission counts in the rate window (I2). Such a visitor's poll
//!   is answered from the description, and nobody is told "queued" who
//!   could already be in;
//! * (rank, seq) **samples** from the frontier to the back, dense near the
//!   frontier and spaced by a fixed share of the distance beyond it, so a
//!   position read between two samples is off by at most that share;
//! * the queue places released since, and the reset floor: those tickets
//!   are ended and go to the scripts, which say so; and the range of `seq`s
//!   an event's shuffle renumbered: those tickets get their new `seq` from
//!   the scripts.
//!
//! Everything else goes to the scripts as before: visitors at or inside
//! the frontier (who may be admitted now), rooms that are not FIFO or not
//! rate-limited, short queues, and any description older than it may be.
//!
//! Abandonment still needs to know who polls: the polls answered here are
//! remembered and written with the next refresh into the poll records
//! (`HSET` of up to 2,000 visitors a command, in `lua/frontier.lua`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use crate::clock::Millis;
use crate::store::{QueuePlace, VisitorId};

/// A description is refreshed this often (in the caller's clock) while
/// polls come in.
pub(crate) const REFRESH_MS: Millis = 200;
/// ... and used for at most this long after it was made. The rate bound is
/// computed for `VALID_MS + SKEW_MS`, so other instances' clocks may run
/// that much ahead.
pub(crate) const VALID_MS: Millis = 1_000;
pub(crate) const SKEW_MS: Millis = 250;
/// One sample per this share of the distance from the frontier.
pub(crate) const PRECISION: u64 = 64;
/// Shorter queues are answered by the scripts (the description would save
/// little, and small queues are where positions are watched most closely).
pub(crate) const MIN_QUEUE: u64 = 1_000;

/// One room's queue, as a frontier script described it.
#[derive(Debug)]
pub(crate) struct Description {
    /// The caller's clock when it was made.
    pub made_ms: Millis,
    /// Visitors waiting.
    pub length: u64,
    /// The seq at rank `bound`, if polls may be answered from this description.
    pub frontier: Option<u64>,
    /// Queue tickets at or below this seq were voided by a reset.
    pub reset_floor: u64,
    /// Queue tickets with a seq in this range were renumbered when an event
    /// started (`lua/start_event.lua`): the scripts hand out the new one.
    pub stale: std::ops::Range<u64>,
    /// Queue places released (ended) but still remembered.
    pub ended: HashSet<VisitorId>,
    /// (rank, seq) from the frontier to the back, increasing in both.
    pub samples: Vec<(u64, u64)>,
}

impl Description {
    /// The place of a visitor with this `seq` at `now`, if this description
    /// may answer: fresh enough, beyond the frontier, not ended.
    pub(crate) fn answer(&self, visitor: VisitorId, seq: u64, now: Millis) -> Option<QueuePlace> {
        let frontier = self.frontier?;
        if now < self.made_ms || now > self.made_ms + VALID_MS {
            return None;
        }
        if seq <= frontier
            || seq <= self.reset_floor
            || self.stale.contains(&seq)
            || self.ended.contains(&visitor)
        {
            return None;
        }
        let rank = self.rank(seq);
        Some(QueuePlace {
            seq,
            position: rank + 1,
            queue_length: self.length.max(rank + 1),
        })
    }

    /// The rank a seq beyond the frontier has: exact at a sample, linear
    /// between two, and just behind the last place for a seq that came
    /// after this description was made.
    fn rank(&self, seq: u64) -> u64 {
        let after = self.samples.partition_point(|&(_, s)| s <= seq);
        let Some(&(r0, s0)) = after.checked_sub(1).and_then(|i| self.samples.get(i)) else {
            return self.samples.first().map_or(0, |&(r, _)| r);
        };
        if s0 == seq {
            return r0;
        }
        match self.samples.get(after) {
            // Between two samples: the ranks strictly between them, in
            // proportion to where the seq falls.
            Some(&(r1, s1)) if r1 > r0 + 1 => {
                let share = (seq - s0) as f64 / (s1 - s0) as f64;
                let inner = ((r1 - r0 - 1) as f64 * share).round() as u64;
                r0 + 1 + inner.min(r1 - r0 - 2)
            }
            Some(_) => r0 + 1,
            None => self.length.max(r0 + 1),
        }
    }
}

/// The descriptions of every room this instance has polls for, and the
/// polls answered from them that still have to be written.
#[derive(Default)]
pub(crate) struct Frontiers {
    rooms: Mutex<HashMap<Arc<str>, RoomFrontier>>,
}

#[derive(Default)]
struct RoomFrontier {
    description: Option<Arc<Description>>,
    /// A refresh is under way (one at a time per room).
    refreshing: bool,
    /// Visitors whose polls were answered here since the last refresh.
    seen: HashSet<VisitorId>,
}

/// What a poll learns from the frontiers.
pub(crate) struct Lookup {
    /// The answer, when the description may give it.
    pub place: Option<QueuePlace>,
    /// The description is due for a refresh and this caller should run it.
    pub refresh: bool,
}

impl Frontiers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, RoomFrontier>> {
        self.rooms.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Looks a poll up; remembers it for the next refresh when answered.
    pub(crate) fn lookup(
        &self,
        room: &Arc<str>,
        visitor: VisitorId,
        seq: u64,
        now: Millis,
    ) -> Lookup {
        let mut rooms = self.lock();
        let frontier = rooms.entry(Arc::clone(room)).or_default();
        let place = frontier
            .description
            .as_ref()
            .and_then(|d| d.answer(visitor, seq, now));
        if place.is_some() {
            frontier.seen.insert(visitor);
        }
        let due = frontier
            .description
            .as_ref()
            .is_none_or(|d| now >= d.made_ms + REFRESH_MS || now < d.made_ms);
        let refresh = due && !frontier.refreshing;
        if refresh {
            frontier.refreshing = true;
        }
        Lookup { place, refresh }
    }

    /// Takes the polls to write with a refresh of `room` (claiming the
    /// refresh if nobody holds it; `None` if somebody does).
    pub(crate) fn claim(&self, room: &Arc<str>, already_claimed: bool) -> Option<Vec<VisitorId>> {
        let mut rooms = self.lock();
        let frontier = rooms.entry(Arc::clone(room)).or_default();
        if frontier.refreshing && !already_claimed {
            return None;
        }
        frontier.refreshing = true;
        Some(frontier.seen.drain().collect())
    }

    /// Installs a new description (or, on failure, keeps the polls for the
    /// next try) and ends the refresh.
    pub(crate) fn finish(&self, room: &Arc<str>, outcome: Result<Description, Vec<VisitorId>>) {
        let mut rooms = self.lock();
        let frontier = rooms.entry(Arc::clone(room)).or_default();
        frontier.refreshing = false;
        match outcome {
            Ok(d) => frontier.description = Some(Arc::new(d)),
            Err(unwritten) => {
                // Not answered from a stale description meanwhile.
                frontier.description = None;
                frontier.seen.extend(unwritten);
            }
        }
    }

    /// Claims a refresh of `room` if it has polls waiting to be written
    /// and no refresh is under way.
    pub(crate) fn claim_pending(&self, room: &str) -> Option<Vec<VisitorId>> {
        let mut rooms = self.lock();
        let frontier = rooms.get_mut(room)?;
        if frontier.seen.is_empty() || frontier.refreshing {
            return None;
        }
        frontier.refreshing = true;
        Some(frontier.seen.drain().collect())
    }

    /// When the description of `room` in use was made.
    pub(crate) fn made(&self, room: &str) -> Option<Millis> {
        self.lock()
            .get(room)
            .and_then(|f| f.description.as_ref())
            .map(|d| d.made_ms)
    }

    /// Forgets every description (after the store reset or lost a room).
    pub(crate) fn forget(&self, room: &str) {
        if let Some(f) = self.lock().get_mut(room) {
            f.description = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vid(n: u8) -> VisitorId {
        VisitorId([n; 16])
    }

    fn description(samples: Vec<(u64, u64)>) -> Description {
        Description {
            made_ms: 1_000,
            length: 1_000,
            frontier: samples.first().map(|&(_, s)| s),
            reset_floor: 0,
            stale: 0..0,
            ended: HashSet::from([vid(9)]),
            samples,
        }
    }

    #[test]
    fn only_visitors_beyond_the_frontier_are_answered_and_only_while_fresh() {
        let d = description(vec![(100, 5_000), (101, 5_010), (200, 6_000), (999, 9_000)]);
        assert!(
            d.answer(vid(1), 4_000, 1_000).is_none(),
            "inside the frontier"
        );
        assert!(d.answer(vid(1), 5_000, 1_000).is_none(), "at the frontier");
        assert!(d.answer(vid(9), 5_500, 1_000).is_none(), "a released place");
        assert!(
            d.answer(vid(1), 5_500, 999).is_none(),
            "clock before the description"
        );
        assert!(
            d.answer(vid(1), 5_500, 1_000 + VALID_MS + 1).is_none(),
            "stale"
        );
        let at = |seq| d.answer(vid(1), seq, 1_500).map(|p| p.position);
        assert_eq!(at(5_010), Some(102), "exact at a sample");
        assert_eq!(at(5_005), Some(102), "between adjacent ranks");
        assert_eq!(at(5_505), Some(152), "proportionally between samples");
        assert_eq!(at(9_000), Some(1_000), "the last place");
        assert_eq!(at(9_500), Some(1_001), "arrived since: at the back");
    }

    #[test]
    fn tickets_an_event_renumbered_go_to_the_scripts() {
        let mut d = description(vec![(100, 5_000), (999, 9_000)]);
        d.stale = 6_000..7_000;
        assert!(d.answer(vid(1), 6_000, 1_000).is_none());
        assert!(d.answer(vid(1), 6_999, 1_000).is_none());
        assert!(d.answer(vid(1), 7_000, 1_000).is_some());
        assert!(d.answer(vid(1), 5_999, 1_000).is_some());
    }

    #[test]
    fn a_room_without_a_frontier_answers_nothing() {
        let mut d = description(vec![(100, 5_000)]);
        d.frontier = None;
        assert!(d.answer(vid(1), 9_999, 1_000).is_none());
    }

    #[test]
    fn one_refresh_at_a_time_and_polls_kept_when_it_fails() {
        let f = Frontiers::default();
        let room: Arc<str> = Arc::from("r");
        let first = f.lookup(&room, vid(1), 1, 0);
        assert!(first.refresh && first.place.is_none());
        assert!(!f.lookup(&room, vid(1), 1, 0).refresh, "already claimed");
        let polls = f.claim(&room, true).unwrap();
        assert!(polls.is_empty());
        f.finish(&room, Ok(description(vec![(100, 5_000), (999, 9_000)])));
        let answered = f.lookup(&room, vid(2), 6_000, 1_000);
        assert!(answered.place.is_some() && !answered.refresh);
        let polls = f.claim_pending(&room).unwrap();
        assert!(f.claim_pending(&room).is_none(), "one refresh at a time");
        assert_eq!(polls, vec![vid(2)]);
        f.finish(&room, Err(polls));
        let after_failure = f.lookup(&room, vid(3), 6_000, 1_000);
        assert!(after_failure.place.is_none(), "no stale answers");
        assert!(after_failure.refresh, "the next poll tries again");
        assert_eq!(
            f.claim(&room, true).unwrap(),
            vec![vid(2)],
            "the poll is kept"
        );
    }
}
