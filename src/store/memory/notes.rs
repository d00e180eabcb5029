//! [`Store::note`](crate::store::Store::note) in memory: expiring sets of
//! numbers per room, swept as they grow.

use std::collections::HashMap;

use crate::clock::Millis;
use crate::store::Noted;

/// Every room's sets, by `(room, set)`.
#[derive(Default)]
pub(super) struct Notes {
    sets: HashMap<(Box<str>, Box<str>), HashMap<u64, Millis>>,
    /// Members held in all sets.
    members: usize,
    /// Members left after the last sweep: the next sweep waits until the
    /// count has doubled, so sweeping is amortised O(1) per note.
    after_sweep: usize,
}

/// Below this many members, no sweep.
const SWEEP_FLOOR: usize = 1024;

impl Notes {
    /// Takes `members` back out of a set; how many were there.
    pub(super) fn forget(&mut self, room: &str, set: &str, members: &[u64]) -> u64 {
        let Some(entry) = self.sets.get_mut(&(room.into(), set.into())) else {
            return 0;
        };
        let mut taken = 0;
        for m in members {
            if entry.remove(m).is_some() {
                self.members = self.members.saturating_sub(1);
                taken += 1;
            }
        }
        taken
    }

    pub(super) fn note(
        &mut self,
        room: &str,
        set: &str,
        members: &[u64],
        until_ms: Millis,
        now_ms: Millis,
    ) -> Noted {
        if self.members >= SWEEP_FLOOR.max(self.after_sweep * 2) {
            self.sweep(now_ms);
        }
        let entry = self.sets.entry((room.into(), set.into())).or_default();
        let mut added = 0;
        for &m in members {
            match entry.get_mut(&m) {
                Some(until) if *until > now_ms => *until = (*until).max(until_ms),
                Some(until) => {
                    *until = until_ms;
                    added += 1;
                }
                None => {
                    entry.insert(m, until_ms);
                    self.members += 1;
                    added += 1;
                }
            }
        }
        let size = entry.values().filter(|&&until| until > now_ms).count() as u64;
        Noted { added, size }
    }

    fn sweep(&mut self, now_ms: Millis) {
        self.sets.retain(|_, set| {
            set.retain(|_, until| *until > now_ms);
            !set.is_empty()
        });
        self.members = self.sets.values().map(HashMap::len).sum();
        self.after_sweep = self.members;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_count_once_lapse_and_are_swept() {
        let mut n = Notes::default();
        assert_eq!(
            n.note("r", "s", &[1, 2], 100, 0),
            Noted { added: 2, size: 2 }
        );
        assert_eq!(
            n.note("r", "s", &[2, 3], 50, 10),
            Noted { added: 1, size: 3 }
        );
        // Another room's set of the same name is another set.
        assert_eq!(n.note("q", "s", &[1], 100, 10), Noted { added: 1, size: 1 });
        // 3 lapsed at 50; 2 was extended to 100 and stays.
        assert_eq!(n.note("r", "s", &[], 100, 60), Noted { added: 0, size: 2 });
        assert_eq!(n.note("r", "s", &[3], 200, 60), Noted { added: 1, size: 3 });
        for i in 0..5000 {
            n.note("r", &format!("x{i}"), &[i], 1_000, 500);
        }
        for i in 0..5000 {
            n.note("r", &format!("y{i}"), &[i], 10_000, 2_000);
        }
        assert!(
            n.members <= 5_003,
            "lapsed members are swept: {}",
            n.members
        );
    }
}
