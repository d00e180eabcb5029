//! What the Redis store's suites (one node, Cluster) share: visitor ids by
//! number, verdict readers, the room's key names as the store lays them
//! out (docs/redis-layout.md), a place lost with plain commands, and the
//! queue rebuilt from tickets after a FLUSHALL.
//!
//! Include it with `#[path = "support/redis_store.rs"] mod redis_store;`
//! beside `mod conformance;`.

#![allow(dead_code)]

use std::time::Duration;

use waitroom::clock::Millis;
use waitroom::store::{
    Arrival, QueuePlace, RoomPolicy, RoomState, Store, Verdict, VisitorId, MAX_LANES,
};

pub const TIMEOUT: Duration = Duration::from_secs(2);
/// 2027-01-15.
pub const T0: Millis = 1_800_000_000_000;

/// Visitor number `n`.
pub fn vid(n: u64) -> VisitorId {
    let mut b = [0u8; 16];
    b[8..].copy_from_slice(&n.to_be_bytes());
    VisitorId(b)
}

#[track_caller]
pub fn place(v: &Verdict) -> QueuePlace {
    match v {
        Verdict::Queued(p) => *p,
        other => panic!("expected Queued, got {other:?}"),
    }
}

pub fn is_admitted(v: &Verdict) -> bool {
    matches!(v, Verdict::Admitted { .. })
}

/// The room's key names (in its hash tag, so one Cluster slot), as the
/// store declares them (`waitroom::store::redis::keys`).
pub mod keys {
    use waitroom::store::redis::keys::{self, room_key};

    pub fn meta(room: &str) -> String {
        room_key(room, "meta")
    }
    pub fn queue(room: &str) -> String {
        room_key(room, "queue")
    }
    pub fn polls(room: &str) -> String {
        room_key(room, "polls")
    }
    pub fn sessions(room: &str) -> String {
        room_key(room, "sessions")
    }
    pub fn tail(room: &str) -> String {
        room_key(room, "tail")
    }
    /// Priority lane `n` (1 ..).
    pub fn lane(room: &str, n: usize) -> String {
        keys::lane(room, n)
    }
    /// Chunk `n` of the tail's ids.
    pub fn tail_chunk(room: &str, n: u64) -> String {
        keys::tail_chunk(room, n)
    }
}

/// Drops a queue entry with plain commands, as a store that lost it would
/// (one node, or a Cluster when `urls` names several).
pub fn redis_lose(urls: Vec<String>) -> crate::conformance::Lose {
    Box::new(move |room, visitor| {
        let hex = visitor.to_hex();
        let (queue, polls) = (keys::queue(room), keys::polls(room));
        let lose = |c: &mut dyn redis::ConnectionLike| {
            let _: i64 = redis::cmd("ZREM").arg(&queue).arg(&hex).query(c).unwrap();
            let _: i64 = redis::cmd("HDEL").arg(&polls).arg(&hex).query(c).unwrap();
            for lane in 1..=MAX_LANES {
                let key = keys::lane(room, lane);
                let _: i64 = redis::cmd("ZREM").arg(key).arg(&hex).query(c).unwrap();
            }
        };
        if urls.len() == 1 {
            let client = redis::Client::open(urls[0].as_str()).unwrap();
            lose(&mut client.get_connection().unwrap());
        } else {
            let client = redis::cluster::ClusterClient::new(urls.clone()).unwrap();
            lose(&mut client.get_connection().unwrap());
        }
    })
}

/// A room of one (`p`) with one visitor inside and five queued loses
/// everything (`flush`: FLUSHALL on every node); the queued visitors'
/// polls, in reverse order, put the queue back in ticket order (I5), and
/// with the lost session's room free again the head goes in first.
pub async fn queue_lost_to_flushall_is_rebuilt_from_tickets(
    store: &dyn Store,
    p: &RoomPolicy,
    flush: impl FnOnce(),
) {
    assert!(is_admitted(
        &store
            .arrive(p, vid(0), 0, Arrival::Known, T0)
            .await
            .unwrap()
    ));
    let mut seqs = Vec::new();
    for i in 1..=5 {
        let v = store
            .arrive(p, vid(i), 0, Arrival::Known, T0 + i)
            .await
            .unwrap();
        seqs.push(place(&v).seq);
    }
    flush();
    let paused = RoomPolicy {
        state: RoomState::Paused,
        ..p.clone()
    };
    for i in (1..=5u64).rev() {
        store
            .poll(&paused, vid(i), 0, seqs[i as usize - 1], T0 + 100)
            .await
            .unwrap();
    }
    for i in 1..=5u64 {
        let q = place(
            &store
                .poll(&paused, vid(i), 0, seqs[i as usize - 1], T0 + 200)
                .await
                .unwrap(),
        );
        assert_eq!(
            (q.position, q.queue_length, q.seq),
            (i, 5, seqs[i as usize - 1])
        );
    }
    // The session was lost too, so there is room: the head goes in first.
    let v = store.poll(p, vid(3), 0, seqs[2], T0 + 300).await.unwrap();
    assert_eq!(place(&v).position, 2);
    assert!(is_admitted(
        &store.poll(p, vid(1), 0, seqs[0], T0 + 300).await.unwrap()
    ));
}
