//! Cost of one memory-store decision: `arrive` on the admit and enqueue
//! paths, and a queued visitor's `poll` in queues of 1,000, 100,000 and
//! 1,000,000 (positions are O(log n), so the last two should differ by a
//! small factor, not 10x).
//!
//! The memory store never suspends, so each future is driven with
//! `now_or_never` instead of a runtime: what is measured is the decision.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use futures_util::FutureExt;
use waitroom::clock::Millis;
use waitroom::store::memory::MemoryStore;
use waitroom::store::{Arrival, QueueingMethod, RoomPolicy, RoomState, Store, Verdict, VisitorId};

const T0: Millis = 1_800_000_000_000;

fn policy(room: &str) -> RoomPolicy {
    RoomPolicy {
        room: Arc::from(room),
        total_active_users: 0,
        new_users_per_minute: 0,
        session_duration_ms: 1_000,
        session_renewal: true,
        method: QueueingMethod::Fifo,
        max_queue_length: 0,
        abandon_after_ms: 1_000,
        arrival_grace_ms: 40_000,
        state: RoomState::Open,
        revision: 0,
        lanes: Default::default(),
    }
}

/// Cheap distinct ids, so the id generator is not what gets measured.
fn vid(n: u64) -> VisitorId {
    VisitorId(
        u128::from(n)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)
            .to_be_bytes(),
    )
}

fn run<T>(f: impl std::future::Future<Output = T>) -> T {
    match f.now_or_never() {
        Some(v) => v,
        None => panic!("the memory store never suspends"),
    }
}

/// A room whose one place is taken for a day, so nobody else is admitted.
fn blocked_room(store: &MemoryStore, room: &str) -> RoomPolicy {
    let mut p = policy(room);
    p.total_active_users = 1;
    p.session_duration_ms = 86_400_000;
    run(store.arrive(&p, vid(u64::MAX), 0, Arrival::Known, T0)).unwrap();
    p
}

fn arrive(c: &mut Criterion) {
    let mut g = c.benchmark_group("arrive");
    g.throughput(Throughput::Elements(1));

    // Unlimited room, 16 arrivals per ms and 1 s sessions: a steady ~16,000
    // live sessions, each arrival also expiring about one.
    let store = MemoryStore::new();
    let p = policy("admit");
    let first = run(store.arrive(&p, vid(0), 0, Arrival::Known, T0)).unwrap();
    assert!(matches!(first, Verdict::Admitted { .. }), "{first:?}");
    let mut i = 0u64;
    g.bench_function("admit", |b| {
        b.iter(|| {
            i += 1;
            run(store.arrive(&p, vid(i), 0, Arrival::Known, T0 + i / 16)).unwrap()
        })
    });

    // Full room, 16 arrivals per ms and abandonment after 1 s: a steady
    // ~16,000 waiting, each arrival also abandoning about one.
    let store = MemoryStore::new();
    let mut p = blocked_room(&store, "enqueue");
    p.session_duration_ms = 1_000;
    let first = run(store.arrive(&p, vid(0), 0, Arrival::Known, T0)).unwrap();
    assert!(matches!(first, Verdict::Queued(_)), "{first:?}");
    let mut i = 0u64;
    g.bench_function("enqueue", |b| {
        b.iter(|| {
            i += 1;
            run(store.arrive(&p, vid(i), 0, Arrival::Known, T0 + i / 16)).unwrap()
        })
    });
    g.finish();
}

fn poll(c: &mut Criterion) {
    let mut g = c.benchmark_group("poll");
    g.throughput(Throughput::Elements(1));
    for n in [1_000u64, 100_000, 1_000_000] {
        let store = MemoryStore::new();
        let mut p = blocked_room(&store, &format!("poll-{n}"));
        p.abandon_after_ms = 3_600_000;
        let mut seqs = Vec::with_capacity(n as usize);
        for i in 0..n {
            match run(store.arrive(&p, vid(i), 0, Arrival::Known, T0)).unwrap() {
                Verdict::Queued(place) => seqs.push(place.seq),
                other => panic!("expected a queue place, got {other:?}"),
            }
        }
        // Every visitor in a scattered order: the real pattern, where a
        // large queue no longer fits the CPU caches.
        let mut k = 0u64;
        g.bench_with_input(BenchmarkId::new("scattered", n), &n, |b, &n| {
            b.iter(|| {
                k = (k + 7_919) % n;
                run(store.poll(&p, vid(k), 0, seqs[k as usize], T0 + 1)).unwrap()
            })
        });
        // 256 visitors spread through the queue, polled in turn: their
        // paths stay cached, so this shows the algorithm's own growth.
        let stride = n / 256;
        let mut j = 0u64;
        g.bench_with_input(BenchmarkId::new("cached", n), &n, |b, _| {
            b.iter(|| {
                j = (j + 1) % 256;
                let k = j * stride;
                run(store.poll(&p, vid(k), 0, seqs[k as usize], T0 + 2)).unwrap()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, arrive, poll);
criterion_main!(benches);
