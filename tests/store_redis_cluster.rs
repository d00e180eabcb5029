//! The Redis store against a real 3-master Redis Cluster on loopback: the
//! store conformance suite, then the Cluster specifics (one slot per room,
//! rooms spread over nodes, scripts reloaded on nodes that lost them).

mod conformance;
#[path = "support/redis_server.rs"]
mod redis_server;
#[path = "support/redis_store.rs"]
mod redis_store;

use std::collections::HashSet;
use std::sync::Arc;

use redis_server::RedisCluster;
use redis_store::{is_admitted, place, redis_lose, vid, T0, TIMEOUT};
use waitroom::store::redis::RedisStore;
use waitroom::store::{Arrival, QueueingMethod, RoomPolicy, RoomState, Store};

async fn start() -> (RedisCluster, RedisStore) {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let store = RedisStore::connect(&cluster.urls(), TIMEOUT).await.unwrap();
    (cluster, store)
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
    redis_store::queue_lost_to_flushall_is_rebuilt_from_tickets(&store, &room("lost"), || {
        for node in &cluster.nodes {
            let _: () = node.cmd(&["FLUSHALL"]);
        }
    })
    .await;
}
