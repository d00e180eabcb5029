//! Runs the store conformance suite against the in-memory store, plus a
//! footprint measurement run by hand:
//! `cargo test --release --test store_memory -- --ignored --nocapture footprint_100k`
//! (and `footprint_1m`), one at a time.

mod conformance;

use std::sync::Arc;

use waitroom::clock::Millis;
use waitroom::store::memory::MemoryStore;
use waitroom::store::{Arrival, QueueingMethod, RoomPolicy, RoomState, Store, Verdict, VisitorId};

conformance::store_conformance!(|| async {
    let store = Arc::new(MemoryStore::new());
    let lost = store.clone();
    let lose: conformance::Lose = Box::new(move |room, visitor| {
        let mut policy = any_policy();
        policy.room = Arc::from(room);
        lost.lose_queue_entry(&policy, visitor);
    });
    conformance::Harness::new(store, lose)
});

/// Only the room id matters to `lose_queue_entry`.
fn any_policy() -> RoomPolicy {
    RoomPolicy {
        room: Arc::from(""),
        total_active_users: 1,
        new_users_per_minute: 0,
        session_duration_ms: 1,
        session_renewal: true,
        method: QueueingMethod::Fifo,
        max_queue_length: 0,
        abandon_after_ms: 0,
        arrival_grace_ms: 0,
        state: RoomState::Open,
        revision: 0,
        lanes: Default::default(),
    }
}

/// Resident set size of this process, from `/proc/self/status` (Linux).
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// Bytes per active session and per queued visitor, as RSS growth while `n`
/// of each are added. RSS includes what the allocator keeps after growing a
/// table, so these are upper bounds. Ignored by default: RSS is process-wide,
/// so each must run alone.
#[tokio::test(flavor = "current_thread")]
#[ignore]
async fn footprint_100k() {
    footprint(100_000).await;
}

#[tokio::test(flavor = "current_thread")]
#[ignore]
async fn footprint_1m() {
    footprint(1_000_000).await;
}

async fn footprint(n: u64) {
    const T0: Millis = 1_800_000_000_000;
    {
        let store = MemoryStore::new();
        let mut p = RoomPolicy {
            room: Arc::from(format!("footprint-{n}").as_str()),
            total_active_users: 0,
            new_users_per_minute: 0,
            session_duration_ms: 3_600_000,
            session_renewal: true,
            method: QueueingMethod::Fifo,
            max_queue_length: 0,
            abandon_after_ms: 3_600_000,
            arrival_grace_ms: 40_000,
            state: RoomState::Open,
            revision: 0,
            lanes: Default::default(),
        };
        let ids: Vec<VisitorId> = (0..2 * n).map(|_| VisitorId::random()).collect();
        let before = rss_bytes();
        for (i, v) in ids[..n as usize].iter().enumerate() {
            // 1,000 admissions a second, as a busy unlimited room would see.
            let now = T0 + i as Millis;
            let verdict = store.arrive(&p, *v, 0, Arrival::Known, now).await.unwrap();
            assert!(matches!(verdict, Verdict::Admitted { .. }));
        }
        let with_sessions = rss_bytes();
        p.total_active_users = n;
        for (i, v) in ids[n as usize..].iter().enumerate() {
            let now = T0 + n + (i as Millis) / 16;
            let verdict = store.arrive(&p, *v, 0, Arrival::Known, now).await.unwrap();
            assert!(matches!(verdict, Verdict::Queued(_)));
        }
        let with_queue = rss_bytes();
        let stats = store.stats(&p, T0 + 2 * n).await.unwrap();
        assert_eq!((stats.active, stats.queued), (n, n));
        println!(
            "n = {n}: {} bytes per active session (incl. its rate-window share), {} bytes per queued visitor",
            (with_sessions - before) / n,
            (with_queue - with_sessions) / n,
        );
    }
}
