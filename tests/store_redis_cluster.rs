//! The Redis store against a real 3-master Redis Cluster on loopback: the
//! store conformance suite, then the Cluster specifics (one slot per room,
//! rooms spread over nodes, scripts reloaded on nodes that lost them).

mod conformance;
#[path = "support/redis_server.rs"]
mod redis_server;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use redis_server::RedisCluster;
use waitroom::clock::Millis;
use waitroom::store::redis::RedisStore;
use waitroom::store::{
    Arrival, QueuePlace, QueueingMethod, RoomPolicy, RoomState, Store, Verdict, VisitorId,
};

const TIMEOUT: Duration = Duration::from_secs(2);
const T0: Millis = 1_800_000_000_000;

fn vid(n: u64) -> VisitorId {
    let mut b = [0u8; 16];
    b[8..].copy_from_slice(&n.to_be_bytes());
    VisitorId(b)
}

#[track_caller]
fn place(v: &Verdict) -> QueuePlace {
    match v {
        Verdict::Queued(p) => *p,
        other => panic!("expected Queued, got {other:?}"),
    }
}

fn is_admitted(v: &Verdict) -> bool {
    matches!(v, Verdict::Admitted { .. })
}

async fn start() -> (RedisCluster, RedisStore) {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let store = RedisStore::connect(&cluster.urls(), TIMEOUT).await.unwrap();
    (cluster, store)
}

/// Drops a queue entry with plain commands, as a store that lost it would.
fn redis_lose(urls: Vec<String>) -> conformance::Lose {
    Box::new(move |room, visitor| {
        let hex = visitor.to_hex();
        let (queue, polls) = (
            format!("wr:{{{room}}}:queue"),
            format!("wr:{{{room}}}:polls"),
        );
        let lose = |c: &mut dyn redis::ConnectionLike| {
            let _: i64 = redis::cmd("ZREM").arg(&queue).arg(&hex).query(c).unwrap();
            let _: i64 = redis::cmd("HDEL").arg(&polls).arg(&hex).query(c).unwrap();
            for lane in 1..=waitroom::store::MAX_LANES {
                let key = format!("wr:{{{room}}}:lane:{lane}");
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

conformance::store_conformance!(|| async {
    let (cluster, store) = start().await;
    let mut harness = conformance::Harness::new(Arc::new(store), redis_lose(cluster.urls()));
    harness.guard = Some(Box::new(cluster));
    harness
});

fn room(name: &str) -> RoomPolicy {
    RoomPolicy {
        room: Arc::from(name),
        total_active_users: 1,
        new_users_per_minute: 0,
        session_duration_ms: 300_000,
        session_renewal: true,
        method: QueueingMethod::Fifo,
        max_queue_length: 0,
        abandon_after_ms: 120_000,
        arrival_grace_ms: 30_000,
        state: RoomState::Open,
        revision: 0,
        lanes: Default::default(),
    }
}

#[tokio::test]
async fn each_room_lives_in_one_slot_and_rooms_spread_over_nodes() {
    let (cluster, store) = start().await;
    let names: Vec<String> = (0..12).map(|i| format!("room-{i}")).collect();
    for name in &names {
        let p = room(name);
        store
            .arrive(&p, vid(1), 0, Arrival::Known, T0)
            .await
            .unwrap();
        store
            .arrive(&p, vid(2), 0, Arrival::Known, T0)
            .await
            .unwrap();
    }
    let mut nodes_used = HashSet::new();
    for name in &names {
        let mut holders = Vec::new();
        for (i, node) in cluster.nodes.iter().enumerate() {
            let keys: Vec<String> = node.cmd(&["KEYS", &format!("wr:{{{name}}}:*")]);
            if !keys.is_empty() {
                holders.push((i, keys));
            }
        }
        assert_eq!(holders.len(), 1, "{name}: {holders:?}");
        let (node, keys) = &holders[0];
        assert_eq!(keys.len(), 5, "{name}: {keys:?}");
        let slots: HashSet<i64> = keys
            .iter()
            .map(|k| cluster.nodes[*node].cmd::<i64>(&["CLUSTER", "KEYSLOT", k]))
            .collect();
        assert_eq!(slots.len(), 1, "{name}");
        nodes_used.insert(*node);
    }
    assert!(nodes_used.len() > 1, "12 rooms all landed on one node");
    assert_eq!(cluster.key_counts().iter().sum::<i64>(), 12 * 5);
}

#[tokio::test]
async fn scripts_are_reloaded_after_script_flush_on_every_node() {
    let (cluster, store) = start().await;
    let p = room("flushed");
    assert!(is_admitted(
        &store
            .arrive(&p, vid(1), 0, Arrival::Known, T0)
            .await
            .unwrap()
    ));
    for node in &cluster.nodes {
        let _: () = node.cmd(&["SCRIPT", "FLUSH"]);
    }
    let q = place(
        &store
            .arrive(&p, vid(2), 0, Arrival::Known, T0)
            .await
            .unwrap(),
    );
    assert_eq!(q.position, 1);
    assert_eq!(store.stats(&p, T0).await.unwrap().active, 1);
}

#[tokio::test]
async fn queue_lost_to_flushall_is_rebuilt_from_tickets() {
    let (cluster, store) = start().await;
    let p = room("lost");
    assert!(is_admitted(
        &store
            .arrive(&p, vid(0), 0, Arrival::Known, T0)
            .await
            .unwrap()
    ));
    let mut seqs = Vec::new();
    for i in 1..=3 {
        seqs.push(
            place(
                &store
                    .arrive(&p, vid(i), 0, Arrival::Known, T0 + i)
                    .await
                    .unwrap(),
            )
            .seq,
        );
    }
    for node in &cluster.nodes {
        let _: () = node.cmd(&["FLUSHALL"]);
    }
    let paused = RoomPolicy {
        state: RoomState::Paused,
        ..p.clone()
    };
    assert_eq!(
        place(
            &store
                .poll(&paused, vid(3), 0, seqs[2], T0 + 10)
                .await
                .unwrap()
        )
        .position,
        1
    );
    assert_eq!(
        place(
            &store
                .poll(&paused, vid(2), 0, seqs[1], T0 + 11)
                .await
                .unwrap()
        )
        .position,
        1
    );
    // The session was lost too: with room again, the ticket order decides.
    assert!(is_admitted(
        &store.poll(&p, vid(2), 0, seqs[1], T0 + 12).await.unwrap()
    ));
    assert_eq!(
        place(&store.poll(&p, vid(3), 0, seqs[2], T0 + 12).await.unwrap()).position,
        1
    );
}
