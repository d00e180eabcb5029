//! [`Reports`](crate::store::Reports) in process: each room's minutes in
//! order, each with the time it is kept until. Expired minutes go when
//! the room is next written or read.

use std::collections::{BTreeMap, HashMap};

use crate::clock::Millis;
use crate::store::ReportMinute;

/// A kept minute.
struct Kept {
    minute: ReportMinute,
    until_ms: Millis,
}

/// Every room's minutes.
#[derive(Default)]
pub(super) struct Book {
    rooms: HashMap<String, BTreeMap<u64, Kept>>,
}

impl Book {
    pub(super) fn add(
        &mut self,
        room: &str,
        minute: u64,
        add: &ReportMinute,
        until_ms: Millis,
        now_ms: Millis,
    ) {
        let minutes = self.rooms.entry(room.to_owned()).or_default();
        minutes.retain(|_, k| k.until_ms > now_ms);
        let kept = minutes.entry(minute).or_insert_with(|| Kept {
            minute: ReportMinute::default(),
            until_ms,
        });
        kept.minute.merge(add);
        kept.until_ms = kept.until_ms.max(until_ms);
    }

    pub(super) fn read(
        &mut self,
        room: &str,
        from: u64,
        to: u64,
        now_ms: Millis,
    ) -> Vec<(u64, ReportMinute)> {
        let Some(minutes) = self.rooms.get_mut(room) else {
            return Vec::new();
        };
        minutes.retain(|_, k| k.until_ms > now_ms);
        if from > to {
            return Vec::new();
        }
        minutes
            .range(from..=to)
            .filter(|(_, k)| !k.minute.is_empty())
            .map(|(m, k)| (*m, k.minute.clone()))
            .collect()
    }
}
