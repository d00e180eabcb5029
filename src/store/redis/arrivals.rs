//! New visitors to the same room, decided together: one script call
//! (`lua/arrive_many.lua`) admits or queues every visitor that arrived
//! while the previous call was in flight, each in arrival order exactly as
//! if it had run alone.
//!
//! No timer: an arrival to an idle room goes out at once; arrivals that
//! come while a call is out wait for it and go together in the next one
//! (group commit). Under load each call carries many visitors, so the
//! per-call work (the script's setup, housekeeping, promotion) is shared,
//! which is most of what a decision cost.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

use crate::clock::Millis;
use crate::store::{RoomPolicy, StoreError, Verdict, VisitorId};

/// Most visitors in one call (keeps a call short and its reply small).
pub(super) const MAX_BATCH: usize = 256;

/// One arrival waiting for its decision.
pub(super) struct Waiter {
    pub policy: RoomPolicy,
    pub visitor: VisitorId,
    /// What its id may hold.
    pub kind: crate::store::Arrival,
    pub now: Millis,
    /// Redis server time after which its caller has given up (0 = none).
    pub deadline_us: i64,
    /// Region mode: the Anywhere calls made for it so far (it is held for
    /// another only below `ANYWHERE_TRIES`).
    pub asked: u32,
    pub reply: oneshot::Sender<Result<Verdict, StoreError>>,
}

/// A room's waiting arrivals.
#[derive(Default)]
pub(super) struct Pending {
    waiting: VecDeque<Waiter>,
    /// A call for this room is out; its drainer will take the next batch.
    in_flight: bool,
}

/// The waiting arrivals of every room.
#[derive(Default)]
pub(super) struct Arrivals {
    rooms: Mutex<HashMap<Arc<str>, Arc<Mutex<Pending>>>>,
}

impl Arrivals {
    /// Adds an arrival. Returns the room's queue, and whether the caller
    /// must start draining it (no call is out for the room).
    pub(super) fn push(&self, room: &Arc<str>, waiter: Waiter) -> (Arc<Mutex<Pending>>, bool) {
        self.with_room(room, |waiting| waiting.push_back(waiter))
    }

    /// Puts arrivals back in front of the room's queue, in their order
    /// (held visitors back from the Anywhere pool go before anyone who
    /// came after them). Returns the same as [`Arrivals::push`].
    pub(super) fn push_front(
        &self,
        room: &Arc<str>,
        waiters: Vec<Waiter>,
    ) -> (Arc<Mutex<Pending>>, bool) {
        self.with_room(room, |waiting| {
            for w in waiters.into_iter().rev() {
                waiting.push_front(w);
            }
        })
    }

    /// Changes the room's waiting arrivals with `add`, and claims the
    /// drain if no call is out for the room.
    fn with_room(
        &self,
        room: &Arc<str>,
        add: impl FnOnce(&mut VecDeque<Waiter>),
    ) -> (Arc<Mutex<Pending>>, bool) {
        let pending = Arc::clone(
            self.rooms
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(Arc::clone(room))
                .or_default(),
        );
        let lead = {
            let mut p = pending.lock().unwrap_or_else(PoisonError::into_inner);
            add(&mut p.waiting);
            !std::mem::replace(&mut p.in_flight, true)
        };
        (pending, lead)
    }
}

/// The next call's arrivals: those in front that share the first one's
/// policy (a change of limits never mixes into one decision) and its
/// count of Anywhere calls (one decision holds them or not), at most
/// `MAX_BATCH`. `None` when none are left, which also ends the drain (the
/// next arrival starts a new one).
pub(super) fn next_batch(pending: &Mutex<Pending>) -> Option<Vec<Waiter>> {
    let mut p = pending.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(first) = p.waiting.front() else {
        p.in_flight = false;
        return None;
    };
    let n = p
        .waiting
        .iter()
        .take(MAX_BATCH)
        .take_while(|w| w.policy == first.policy && w.asked == first.asked)
        .count();
    Some(p.waiting.drain(..n).collect())
}
