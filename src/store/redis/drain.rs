//! Deciding new visitors together (group commit, `arrivals`): the drain
//! that decides a room's waiting arrivals a batch a call
//! (`lua/arrive_many.lua`), and in region mode the newcomers it held back
//! for the Anywhere pool, put back in front of the room's arrivals.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::arrivals::{self, Waiter};
use super::calls::{Arrive, Call};
use super::wire::ArriveFlags;
use super::{Inner, RedisStore, RoomKeys};
use crate::clock::Millis;
use crate::store::{Arrival, QueueingMethod, RoomPolicy, StoreError, Verdict, VisitorId};

/// Anywhere calls at most for one held newcomer (see
/// `Inner::arrive_anywhere`): each further one only after the slots the
/// last one gave were taken meanwhile (by another instance's newcomers).
const ANYWHERE_TRIES: u32 = 3;

impl RedisStore {
    /// Joins the room's next arrival batch and waits for its verdict.
    pub(super) async fn arrive_in_batch(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        kind: Arrival,
        now_ms: Millis,
    ) -> Result<Verdict, StoreError> {
        let (reply, verdict) = tokio::sync::oneshot::channel();
        let waiter = Waiter {
            policy: room.clone(),
            visitor,
            kind,
            now: now_ms,
            deadline_us: self.inner.deadline_us(),
            asked: 0,
            reply,
        };
        let (pending, lead) = self.inner.arrivals.push(&room.room, waiter);
        if lead {
            // Its own task: the batch is decided even if this caller gives up.
            let inner = Arc::clone(&self.inner);
            tokio::spawn(inner.drain_arrivals(pending));
        }
        verdict
            .await
            .unwrap_or_else(|_| Err(StoreError::Unavailable("arrival batch dropped".into())))
    }
}

impl Inner {
    /// Decides batches of a room's arrivals until none are left waiting.
    async fn drain_arrivals(self: Arc<Self>, pending: Arc<std::sync::Mutex<arrivals::Pending>>) {
        while let Some(batch) = arrivals::next_batch(&pending) {
            let now = batch.iter().map(|w| w.now).max().unwrap_or(0);
            // The call must not land after any of its callers gave up.
            let deadline = batch
                .iter()
                .map(|w| w.deadline_us)
                .filter(|d| *d > 0)
                .min()
                .unwrap_or(0);
            let policy = batch[0].policy.clone();
            // Each visitor once per call (the script relies on it); a repeat
            // gets the first one's decision.
            let mut first_of: HashMap<VisitorId, usize> = HashMap::with_capacity(batch.len());
            let mut visitors = Vec::with_capacity(batch.len());
            let slots: Vec<usize> = batch
                .iter()
                .map(|w| {
                    *first_of.entry(w.visitor).or_insert_with(|| {
                        visitors.push(w.visitor);
                        visitors.len() - 1
                    })
                })
                .collect();
            // Region mode: whoever finds the region's slots used up is held
            // back to try the Anywhere pool (`region`).
            let hold = self.regional(&policy)
                && policy.method != QueueingMethod::Passthrough
                && batch[0].asked < ANYWHERE_TRIES;
            let flags = ArriveFlags {
                hold,
                fresh: batch.iter().all(|w| w.kind == Arrival::New),
                unseen: batch.iter().all(|w| w.kind != Arrival::Known),
            };
            let decided = self
                .decide_arrivals(&policy, now, deadline, &visitors, flags)
                .await;
            match decided {
                Ok(verdicts) => {
                    let mut held: Vec<Waiter> = Vec::new();
                    let mut wanted: HashSet<usize> = HashSet::new();
                    for (w, slot) in batch.into_iter().zip(slots) {
                        match verdicts[slot] {
                            Some(v) => {
                                let _ = w.reply.send(Ok(v));
                            }
                            None => {
                                wanted.insert(slot);
                                held.push(w);
                            }
                        }
                    }
                    if !held.is_empty() {
                        // Off this drain: the global round trip must not hold
                        // up the region's next batch.
                        let inner = Arc::clone(&self);
                        let wanted = wanted.len() as u64;
                        tokio::spawn(async move {
                            inner.arrive_anywhere(policy, now, wanted, held).await
                        });
                    }
                }
                Err(e) => {
                    for w in batch {
                        let _ = w.reply.send(Err(e.again()));
                    }
                }
            }
            // Group commit: whoever is already runnable (woken by the
            // replies just sent, or by a request that just came in) gets
            // to arrive before the next batch is taken, so it goes in that
            // call rather than waiting a whole round trip for the one after.
            tokio::task::yield_now().await;
        }
    }

    /// One `arrive_many` call: a verdict per visitor, `None` for one held
    /// back (only with `flags.hold`).
    async fn decide_arrivals(
        &self,
        policy: &RoomPolicy,
        now: Millis,
        deadline: i64,
        visitors: &[VisitorId],
        flags: ArriveFlags,
    ) -> Result<Vec<Option<Verdict>>, StoreError> {
        let keys = RoomKeys::new(&policy.room);
        let call = Arrive { flags, visitors };
        let inv = self.room_call(&call, &keys.0, policy, now, deadline);
        call.decode(&self.run_room(&inv).await?)
    }

    /// New visitors who found the region's slots used up: ask the global
    /// store for Anywhere slots (one cross-region round trip), then put
    /// them back in front of the room's arrivals, to be decided again by
    /// the drain before anyone who came after them: admitted within the
    /// raised grant, else queued. Deciding them anywhere else let the
    /// region's next batches take the slots first and queue them (issue
    /// 39). Held again (another instance of the region took the slots),
    /// they ask again, up to `ANYWHERE_TRIES` calls; after a call that gave
    /// nothing they are decided for good.
    /// (Boxed: it starts a drain, which starts it.)
    fn arrive_anywhere(
        self: Arc<Self>,
        policy: RoomPolicy,
        now: Millis,
        wanted: u64,
        mut held: Vec<Waiter>,
    ) -> futures_util::future::BoxFuture<'static, ()> {
        Box::pin(async move {
            let given = match self.region.get().cloned() {
                Some(hook) => {
                    let store = RedisStore {
                        inner: Arc::clone(&self),
                    };
                    hook.take(&store, &policy, wanted, now).await
                }
                None => 0,
            };
            for w in &mut held {
                w.asked = if given == 0 {
                    ANYWHERE_TRIES
                } else {
                    w.asked + 1
                };
            }
            let (pending, lead) = self.arrivals.push_front(&policy.room, held);
            if lead {
                tokio::spawn(self.drain_arrivals(pending));
            }
        })
    }
}

impl StoreError {
    /// The same error for another caller of a shared call.
    fn again(&self) -> StoreError {
        match self {
            StoreError::Timeout => StoreError::Timeout,
            StoreError::Down => StoreError::Down,
            StoreError::Unavailable(m) => StoreError::Unavailable(m.clone()),
            StoreError::Protocol(m) => StoreError::Protocol(m.clone()),
            StoreError::Stale(r) => StoreError::Stale(*r),
            StoreError::Layout(v) => StoreError::Layout(*v),
            StoreError::Busy => StoreError::Busy,
        }
    }
}
