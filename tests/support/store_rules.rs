//! The `Store` rules checked against the Redis backends (single node and
//! Cluster): every rule of the contract in `src/store/mod.rs`, one test each,
//! with time passed explicitly. `store_rules!(factory)` expands to one
//! `#[tokio::test]` per rule; the factory returns a fresh `Harness`.

#![allow(dead_code)]

use std::any::Any;
use std::collections::HashSet;
use std::sync::Arc;

use waitroom::clock::Millis;
use waitroom::store::{
    QueuePlace, QueueingMethod, RejectReason, RoomPolicy, RoomState, Store, Verdict, VisitorId,
};

/// A store under test and whatever keeps its backend alive.
pub struct Harness {
    pub store: Arc<dyn Store>,
    pub guard: Option<Box<dyn Any + Send>>,
}

pub const T0: Millis = 1_700_000_000_000;
pub const SESSION: Millis = 300_000;
pub const GRACE: Millis = 30_000;
pub const ABANDON: Millis = 60_000;

pub fn vid(n: u64) -> VisitorId {
    let mut b = [0u8; 16];
    b[8..].copy_from_slice(&n.to_be_bytes());
    VisitorId(b)
}

pub fn policy(cap: u64, rate: u64) -> RoomPolicy {
    RoomPolicy {
        room: Arc::from("room-a"),
        total_active_users: cap,
        new_users_per_minute: rate,
        session_duration_ms: SESSION,
        session_renewal: true,
        method: QueueingMethod::Fifo,
        max_queue_length: 0,
        abandon_after_ms: ABANDON,
        arrival_grace_ms: GRACE,
        state: RoomState::Open,
    }
}

pub fn admitted(expiry: Millis) -> Verdict {
    Verdict::Admitted {
        session_expires_ms: expiry,
    }
}

pub fn place(v: &Verdict) -> QueuePlace {
    match v {
        Verdict::Queued(p) => *p,
        other => panic!("expected Queued, got {other:?}"),
    }
}

pub fn is_admitted(v: &Verdict) -> bool {
    matches!(v, Verdict::Admitted { .. })
}

#[macro_export]
macro_rules! store_rules {
    ($make:expr) => {
        mod rules {
            #[allow(unused_imports)]
            use super::*;

            async fn harness() -> $crate::store_rules::Harness {
                ($make)().await
            }

            $crate::store_rules!(@tests
                capacity_holds_under_concurrent_arrivals,
                admits_while_room_then_queues_in_order,
                rate_window_is_sliding_and_exclusive_at_sixty_seconds,
                promotion_is_fifo_with_grace,
                promotion_respects_rate_window,
                arrive_is_idempotent,
                seq_is_unique_and_increasing_within_one_millisecond,
                poll_puts_lost_entry_back_at_its_seq,
                abandonment_drops_silent_visitors_only,
                abandon_zero_disables_abandonment,
                closed_rejects_but_keeps_sessions_and_places,
                paused_queues_everyone_and_keeps_order,
                queue_all_queues_then_promotes,
                passthrough_admits_over_limits,
                reject_method_turns_away_over_limit,
                max_queue_length_rejects_with_queue_full,
                random_admits_everyone_eventually_within_capacity,
                check_in_renews_or_not,
                release_frees_room_for_the_queue,
                stats_and_totals_count,
                reset_empties_the_room,
                rooms_are_independent,
            );
        }
    };
    (@tests $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let h = harness().await;
                $crate::store_rules::$name(&*h.store).await;
                drop(h);
            }
        )*
    };
}

pub async fn capacity_holds_under_concurrent_arrivals(store: &dyn Store) {
    let p = Arc::new(policy(100, 0));
    // Borrowed store, so the arrivals are joined rather than spawned.
    let arrivals = (0..1200u64).map(|i| {
        let p = Arc::clone(&p);
        async move { store.arrive(&p, vid(i), T0).await.unwrap() }
    });
    let verdicts = futures_util::future::join_all(arrivals).await;
    let admitted = verdicts.iter().filter(|v| is_admitted(v)).count();
    assert_eq!(admitted, 100);
    let positions: HashSet<u64> = verdicts
        .iter()
        .filter(|v| !is_admitted(v))
        .map(|v| place(v).position)
        .collect();
    assert_eq!(
        positions.len(),
        1100,
        "every queued visitor has its own place"
    );
    let stats = store.stats(&p, T0).await.unwrap();
    assert_eq!((stats.active, stats.queued), (100, 1100));
}

pub async fn admits_while_room_then_queues_in_order(store: &dyn Store) {
    let p = policy(2, 0);
    assert_eq!(
        store.arrive(&p, vid(1), T0).await.unwrap(),
        admitted(T0 + SESSION)
    );
    assert_eq!(
        store.arrive(&p, vid(2), T0).await.unwrap(),
        admitted(T0 + SESSION)
    );
    let a = place(&store.arrive(&p, vid(3), T0).await.unwrap());
    let b = place(&store.arrive(&p, vid(4), T0 + 1).await.unwrap());
    assert_eq!((a.position, a.queue_length), (1, 1));
    assert_eq!((b.position, b.queue_length), (2, 2));
    assert!(b.seq > a.seq);
}

pub async fn rate_window_is_sliding_and_exclusive_at_sixty_seconds(store: &dyn Store) {
    let mut p = policy(0, 3);
    p.method = QueueingMethod::Reject;
    for (i, t) in [0, 10_000, 20_000].into_iter().enumerate() {
        assert!(is_admitted(
            &store.arrive(&p, vid(i as u64), T0 + t).await.unwrap()
        ));
    }
    let over = Verdict::Rejected(RejectReason::OverLimit);
    assert_eq!(store.arrive(&p, vid(10), T0 + 59_999).await.unwrap(), over);
    // The admission at T0 leaves the window (now - 60 s, now] exactly at +60 s.
    assert!(is_admitted(
        &store.arrive(&p, vid(11), T0 + 60_000).await.unwrap()
    ));
    assert_eq!(store.arrive(&p, vid(12), T0 + 69_999).await.unwrap(), over);
    assert!(is_admitted(
        &store.arrive(&p, vid(13), T0 + 70_000).await.unwrap()
    ));
    let stats = store.stats(&p, T0 + 70_000).await.unwrap();
    assert_eq!(stats.admitted_last_minute, 3);
    assert_eq!(stats.oldest_admission_ms, Some(T0 + 20_000));
}

pub async fn promotion_is_fifo_with_grace(store: &dyn Store) {
    let p = policy(1, 0);
    assert!(is_admitted(&store.arrive(&p, vid(1), T0).await.unwrap()));
    let mut seqs = Vec::new();
    for i in 2..=4 {
        seqs.push(place(&store.arrive(&p, vid(i), T0 + i).await.unwrap()).seq);
    }
    assert!(store.release(&p, vid(1), T0 + 10).await.unwrap());
    // The head (visitor 2) was promoted by the next operation, whoever made it.
    let v4 = place(&store.poll(&p, vid(4), seqs[2], T0 + 20).await.unwrap());
    assert_eq!((v4.position, v4.queue_length), (2, 2));
    assert_eq!(
        store.poll(&p, vid(2), seqs[0], T0 + 30).await.unwrap(),
        admitted(T0 + 20 + SESSION + GRACE)
    );
    let v3 = place(&store.poll(&p, vid(3), seqs[1], T0 + 30).await.unwrap());
    assert_eq!(v3.position, 1);
    // Session of the head expires: visitor 3, not 4, goes next.
    let later = T0 + 20 + SESSION + GRACE;
    assert!(is_admitted(
        &store.poll(&p, vid(3), seqs[1], later).await.unwrap()
    ));
    assert_eq!(
        place(&store.poll(&p, vid(4), seqs[2], later).await.unwrap()).position,
        1
    );
}

pub async fn promotion_respects_rate_window(store: &dyn Store) {
    let p = policy(0, 2);
    assert!(is_admitted(&store.arrive(&p, vid(1), T0).await.unwrap()));
    assert!(is_admitted(
        &store.arrive(&p, vid(2), T0 + 1).await.unwrap()
    ));
    let q3 = place(&store.arrive(&p, vid(3), T0 + 2).await.unwrap());
    let q4 = place(&store.arrive(&p, vid(4), T0 + 3).await.unwrap());
    assert_eq!(
        place(&store.poll(&p, vid(3), q3.seq, T0 + 59_999).await.unwrap()).position,
        1
    );
    // One admission leaves the window: exactly one promotion.
    assert!(is_admitted(
        &store.poll(&p, vid(3), q3.seq, T0 + 60_000).await.unwrap()
    ));
    assert_eq!(
        place(&store.poll(&p, vid(4), q4.seq, T0 + 60_000).await.unwrap()).position,
        1
    );
    assert!(is_admitted(
        &store.poll(&p, vid(4), q4.seq, T0 + 60_001).await.unwrap()
    ));
}

pub async fn arrive_is_idempotent(store: &dyn Store) {
    let p = policy(1, 0);
    let first = store.arrive(&p, vid(1), T0).await.unwrap();
    assert_eq!(store.arrive(&p, vid(1), T0 + 5).await.unwrap(), first);
    let q = store.arrive(&p, vid(2), T0).await.unwrap();
    assert_eq!(store.arrive(&p, vid(2), T0 + 5).await.unwrap(), q);
    let totals = store.totals(&p).await.unwrap();
    assert_eq!((totals.admitted, totals.queued), (1, 1));
}

pub async fn seq_is_unique_and_increasing_within_one_millisecond(store: &dyn Store) {
    let mut p = policy(0, 0);
    p.state = RoomState::Paused;
    let mut last = 0;
    for i in 0..50 {
        let q = place(&store.arrive(&p, vid(i), T0).await.unwrap());
        assert!(q.seq > last);
        assert_eq!(q.position, i + 1);
        last = q.seq;
    }
    // Derived from time: a later arrival's seq jumps to its millisecond.
    let q = place(&store.arrive(&p, vid(99), T0 + 1000).await.unwrap());
    assert_eq!(q.seq, waitroom::store::next_seq(T0 + 1000, last));
}

pub async fn poll_puts_lost_entry_back_at_its_seq(store: &dyn Store) {
    // Simulated loss: the room is reset (the Redis tests also FLUSHALL).
    let mut p = policy(1, 0);
    assert!(is_admitted(&store.arrive(&p, vid(1), T0).await.unwrap()));
    let mut seqs = Vec::new();
    for i in 2..=4 {
        seqs.push(place(&store.arrive(&p, vid(i), T0 + i).await.unwrap()).seq);
    }
    store.reset(&p).await.unwrap();
    p.state = RoomState::Paused;
    // Visitors come back in any order; each lands at its original place.
    assert_eq!(
        place(&store.poll(&p, vid(4), seqs[2], T0 + 100).await.unwrap()).position,
        1
    );
    assert_eq!(
        place(&store.poll(&p, vid(2), seqs[0], T0 + 101).await.unwrap()).position,
        1
    );
    assert_eq!(
        place(&store.poll(&p, vid(3), seqs[1], T0 + 102).await.unwrap()).position,
        2
    );
    assert_eq!(
        place(&store.poll(&p, vid(4), seqs[2], T0 + 103).await.unwrap()).position,
        3
    );
    // A newcomer lands behind all of them, even with the same clock.
    let q = place(&store.arrive(&p, vid(5), T0 + 4).await.unwrap());
    assert_eq!(q.position, 4);
    assert!(q.seq > seqs[2]);
    // Re-inserting does not count as a new enqueue.
    assert_eq!(store.totals(&p).await.unwrap().queued, 1);
    // With room, the re-inserted head is admitted on its own poll.
    p.state = RoomState::Open;
    assert!(is_admitted(
        &store.poll(&p, vid(2), seqs[0], T0 + 200).await.unwrap()
    ));
}

pub async fn abandonment_drops_silent_visitors_only(store: &dyn Store) {
    let p = policy(1, 0);
    assert!(is_admitted(&store.arrive(&p, vid(1), T0).await.unwrap()));
    let a = place(&store.arrive(&p, vid(2), T0).await.unwrap());
    let b = place(&store.arrive(&p, vid(3), T0).await.unwrap());
    assert_eq!(
        place(&store.poll(&p, vid(3), b.seq, T0 + 20_000).await.unwrap()).position,
        2
    );
    // Exactly abandon_after since the last poll is not yet "older than".
    assert_eq!(store.stats(&p, T0 + ABANDON).await.unwrap().queued, 2);
    let stats = store.stats(&p, T0 + ABANDON + 1).await.unwrap();
    assert_eq!(stats.queued, 1);
    assert_eq!(store.totals(&p).await.unwrap().abandoned, 1);
    assert_eq!(
        place(
            &store
                .poll(&p, vid(3), b.seq, T0 + ABANDON + 2)
                .await
                .unwrap()
        )
        .position,
        1
    );
    // The abandoned visitor polling later is put back from its ticket (its
    // seq is older, so it is ahead again: only an expired ticket sends it back).
    assert_eq!(
        place(
            &store
                .poll(&p, vid(2), a.seq, T0 + ABANDON + 3)
                .await
                .unwrap()
        )
        .position,
        1
    );
}

pub async fn abandon_zero_disables_abandonment(store: &dyn Store) {
    let mut p = policy(1, 0);
    p.abandon_after_ms = 0;
    p.state = RoomState::Paused;
    store.arrive(&p, vid(1), T0).await.unwrap();
    assert_eq!(
        store.stats(&p, T0 + 1000 * ABANDON).await.unwrap().queued,
        1
    );
    assert_eq!(store.totals(&p).await.unwrap().abandoned, 0);
}

pub async fn closed_rejects_but_keeps_sessions_and_places(store: &dyn Store) {
    let mut p = policy(1, 0);
    assert!(is_admitted(&store.arrive(&p, vid(1), T0).await.unwrap()));
    let q = place(&store.arrive(&p, vid(2), T0).await.unwrap());
    p.state = RoomState::Closed;
    let closed = Verdict::Rejected(RejectReason::Closed);
    assert_eq!(store.arrive(&p, vid(3), T0 + 1).await.unwrap(), closed);
    assert_eq!(store.poll(&p, vid(2), q.seq, T0 + 1).await.unwrap(), closed);
    assert_eq!(
        store.arrive(&p, vid(1), T0 + 1).await.unwrap(),
        admitted(T0 + SESSION)
    );
    assert_eq!(
        store.check_in(&p, vid(1), T0 + 1).await.unwrap(),
        Some(T0 + 1 + SESSION)
    );
    // Closed promotes nobody, even with room.
    assert!(store.release(&p, vid(1), T0 + 2).await.unwrap());
    assert_eq!(store.poll(&p, vid(2), q.seq, T0 + 3).await.unwrap(), closed);
    let stats = store.stats(&p, T0 + 3).await.unwrap();
    assert_eq!((stats.active, stats.queued), (0, 1));
    // Only the arrival counts as a rejection.
    assert_eq!(store.totals(&p).await.unwrap().rejected, 1);
    p.state = RoomState::Open;
    assert!(is_admitted(
        &store.poll(&p, vid(2), q.seq, T0 + 4).await.unwrap()
    ));
}

pub async fn paused_queues_everyone_and_keeps_order(store: &dyn Store) {
    let mut p = policy(10, 0);
    p.state = RoomState::Paused;
    let a = place(&store.arrive(&p, vid(1), T0).await.unwrap());
    let b = place(&store.arrive(&p, vid(2), T0 + 1).await.unwrap());
    assert_eq!(
        place(&store.poll(&p, vid(1), a.seq, T0 + 2).await.unwrap()).position,
        1
    );
    assert_eq!(store.stats(&p, T0 + 2).await.unwrap().active, 0);
    p.state = RoomState::Open;
    assert!(is_admitted(
        &store.poll(&p, vid(2), b.seq, T0 + 3).await.unwrap()
    ));
    assert!(is_admitted(
        &store.poll(&p, vid(1), a.seq, T0 + 3).await.unwrap()
    ));
}

pub async fn queue_all_queues_then_promotes(store: &dyn Store) {
    let mut p = policy(10, 0);
    p.state = RoomState::QueueAll;
    let a = place(&store.arrive(&p, vid(1), T0).await.unwrap());
    assert_eq!(a.position, 1);
    // Promotion runs in queue_all: the next operation admits the waiting one.
    let b = place(&store.arrive(&p, vid(2), T0 + 1).await.unwrap());
    assert_eq!((b.position, b.queue_length), (1, 1));
    assert_eq!(
        store.poll(&p, vid(1), a.seq, T0 + 2).await.unwrap(),
        admitted(T0 + 1 + SESSION + GRACE)
    );
}

pub async fn passthrough_admits_over_limits(store: &dyn Store) {
    let mut p = policy(1, 1);
    p.method = QueueingMethod::Passthrough;
    for i in 0..5 {
        assert_eq!(
            store.arrive(&p, vid(i), T0).await.unwrap(),
            admitted(T0 + SESSION)
        );
    }
    let stats = store.stats(&p, T0).await.unwrap();
    assert_eq!((stats.active, stats.admitted_last_minute), (5, 5));
    // Paused and queue_all do not apply: there is no queue.
    p.state = RoomState::Paused;
    assert!(is_admitted(&store.arrive(&p, vid(9), T0).await.unwrap()));
    p.state = RoomState::Closed;
    assert_eq!(
        store.arrive(&p, vid(10), T0).await.unwrap(),
        Verdict::Rejected(RejectReason::Closed)
    );
}

pub async fn reject_method_turns_away_over_limit(store: &dyn Store) {
    let mut p = policy(2, 0);
    p.method = QueueingMethod::Reject;
    p.state = RoomState::QueueAll;
    assert!(is_admitted(&store.arrive(&p, vid(1), T0).await.unwrap()));
    assert!(is_admitted(&store.arrive(&p, vid(2), T0).await.unwrap()));
    assert_eq!(
        store.arrive(&p, vid(3), T0).await.unwrap(),
        Verdict::Rejected(RejectReason::OverLimit)
    );
    assert_eq!(store.stats(&p, T0).await.unwrap().queued, 0);
    assert_eq!(store.totals(&p).await.unwrap().rejected, 1);
    assert!(is_admitted(
        &store.arrive(&p, vid(3), T0 + SESSION).await.unwrap()
    ));
}

pub async fn max_queue_length_rejects_with_queue_full(store: &dyn Store) {
    let mut p = policy(1, 0);
    p.max_queue_length = 2;
    assert!(is_admitted(&store.arrive(&p, vid(1), T0).await.unwrap()));
    store.arrive(&p, vid(2), T0).await.unwrap();
    store.arrive(&p, vid(3), T0).await.unwrap();
    assert_eq!(
        store.arrive(&p, vid(4), T0).await.unwrap(),
        Verdict::Rejected(RejectReason::QueueFull)
    );
    assert_eq!(store.totals(&p).await.unwrap().rejected, 1);
}

pub async fn random_admits_everyone_eventually_within_capacity(store: &dyn Store) {
    let mut p = policy(3, 0);
    p.method = QueueingMethod::Random;
    // Rounds are a whole session apart; nobody polls in between.
    p.abandon_after_ms = 0;
    let mut seqs = Vec::new();
    for i in 0..3 {
        assert!(is_admitted(&store.arrive(&p, vid(i), T0).await.unwrap()));
    }
    for i in 3..20 {
        seqs.push((i, place(&store.arrive(&p, vid(i), T0).await.unwrap()).seq));
    }
    let mut admitted_ids = HashSet::new();
    let mut now = T0;
    // Each round every session ends; exactly `cap` waiting visitors go in.
    for round in 0..6 {
        now += SESSION + GRACE;
        let stats = store.stats(&p, now).await.unwrap();
        assert_eq!(stats.active, 3.min(17 - 3 * round as u64), "round {round}");
        for &(i, seq) in &seqs {
            if admitted_ids.contains(&i) {
                continue;
            }
            if is_admitted(&store.poll(&p, vid(i), seq, now).await.unwrap()) {
                admitted_ids.insert(i);
            }
        }
    }
    assert_eq!(admitted_ids.len(), 17);
}

pub async fn check_in_renews_or_not(store: &dyn Store) {
    let mut p = policy(0, 0);
    assert!(is_admitted(&store.arrive(&p, vid(1), T0).await.unwrap()));
    assert_eq!(
        store.check_in(&p, vid(1), T0 + 1000).await.unwrap(),
        Some(T0 + 1000 + SESSION)
    );
    p.session_renewal = false;
    assert_eq!(
        store.check_in(&p, vid(1), T0 + 2000).await.unwrap(),
        Some(T0 + 1000 + SESSION)
    );
    // Expiry is inclusive: at the expiry instant the session is gone.
    assert_eq!(
        store
            .check_in(&p, vid(1), T0 + 1000 + SESSION)
            .await
            .unwrap(),
        None
    );
    assert_eq!(store.check_in(&p, vid(2), T0).await.unwrap(), None);
}

pub async fn release_frees_room_for_the_queue(store: &dyn Store) {
    let p = policy(1, 0);
    assert!(is_admitted(&store.arrive(&p, vid(1), T0).await.unwrap()));
    let q = place(&store.arrive(&p, vid(2), T0).await.unwrap());
    assert!(store.release(&p, vid(1), T0 + 1).await.unwrap());
    assert!(!store.release(&p, vid(1), T0 + 1).await.unwrap());
    assert_eq!(store.check_in(&p, vid(1), T0 + 2).await.unwrap(), None);
    assert!(is_admitted(
        &store.poll(&p, vid(2), q.seq, T0 + 2).await.unwrap()
    ));
    // Releasing a queue place.
    let r = place(&store.arrive(&p, vid(3), T0 + 3).await.unwrap());
    assert_eq!(r.position, 1);
    assert!(store.release(&p, vid(3), T0 + 4).await.unwrap());
    assert_eq!(store.stats(&p, T0 + 4).await.unwrap().queued, 0);
}

pub async fn stats_and_totals_count(store: &dyn Store) {
    let mut p = policy(2, 0);
    p.max_queue_length = 1;
    for i in 0..4 {
        store.arrive(&p, vid(i), T0 + i).await.unwrap();
    }
    let stats = store.stats(&p, T0 + 10).await.unwrap();
    assert_eq!(
        (stats.active, stats.queued, stats.admitted_last_minute),
        (2, 1, 2)
    );
    assert_eq!(stats.oldest_admission_ms, Some(T0));
    let t = store.totals(&p).await.unwrap();
    assert_eq!(
        (t.admitted, t.queued, t.rejected, t.abandoned),
        (2, 1, 1, 0)
    );
    let fresh = RoomPolicy {
        room: Arc::from("never-used"),
        ..policy(1, 1)
    };
    assert_eq!(
        store.stats(&fresh, T0).await.unwrap().oldest_admission_ms,
        None
    );
    assert_eq!(store.totals(&fresh).await.unwrap().admitted, 0);
}

pub async fn reset_empties_the_room(store: &dyn Store) {
    let p = policy(1, 1);
    store.arrive(&p, vid(1), T0).await.unwrap();
    store.arrive(&p, vid(2), T0).await.unwrap();
    store.reset(&p).await.unwrap();
    let stats = store.stats(&p, T0).await.unwrap();
    assert_eq!(
        (stats.active, stats.queued, stats.admitted_last_minute),
        (0, 0, 0)
    );
    assert_eq!(store.totals(&p).await.unwrap().admitted, 0);
    assert!(is_admitted(&store.arrive(&p, vid(3), T0).await.unwrap()));
}

pub async fn rooms_are_independent(store: &dyn Store) {
    let a = policy(1, 0);
    let b = RoomPolicy {
        room: Arc::from("room-b"),
        ..policy(1, 0)
    };
    assert!(is_admitted(&store.arrive(&a, vid(1), T0).await.unwrap()));
    assert!(is_admitted(&store.arrive(&b, vid(2), T0).await.unwrap()));
    assert!(matches!(
        store.arrive(&a, vid(3), T0).await.unwrap(),
        Verdict::Queued(_)
    ));
}
