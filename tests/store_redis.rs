//! The Redis store against a throwaway single `redis-server`: the store
//! conformance suite, then what only the Redis backend can get wrong (scripts
//! flushed, a frozen or restarted server, key layout, one round trip per
//! operation, bounded script runs).

mod conformance;
#[path = "support/redis_server.rs"]
mod redis_server;
#[path = "support/redis_store.rs"]
mod redis_store;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_server::RedisServer;
use redis_store::{is_admitted, place, redis_lose, vid, T0, TIMEOUT};
use waitroom::clock::Millis;
use waitroom::store::redis::{Options, RedisStore, Target};
use waitroom::store::{
    Arrival, End, Maintenance, QueueingMethod, RoomPolicy, RoomState, Store, StoreError, Verdict,
    VisitorId,
};

const SESSION: Millis = 300_000;
const ABANDON: Millis = 120_000;

fn policy(cap: u64, rate: u64) -> RoomPolicy {
    RoomPolicy {
        room: Arc::from("room-a"),
        total_active_users: cap,
        new_users_per_minute: rate,
        session_duration_ms: SESSION,
        session_renewal: true,
        method: QueueingMethod::Fifo,
        max_queue_length: 0,
        abandon_after_ms: ABANDON,
        arrival_grace_ms: 30_000,
        state: RoomState::Open,
        revision: 0,
        lanes: Default::default(),
    }
}

async fn start() -> (RedisServer, RedisStore) {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let store = RedisStore::connect(&[server.url()], TIMEOUT).await.unwrap();
    (server, store)
}

conformance::store_conformance!(|| async {
    let (server, store) = start().await;
    let mut harness = conformance::Harness::new(Arc::new(store), redis_lose(vec![server.url()]));
    harness.guard = Some(Box::new(server));
    harness
});

// Contract details the conformance suite does not pin (yet).

#[tokio::test]
async fn abandon_after_zero_disables_abandonment() {
    let (_server, store) = start().await;
    let mut p = policy(1, 0);
    p.abandon_after_ms = 0;
    p.state = RoomState::Paused;
    store
        .arrive(&p, vid(1), 0, Arrival::Known, T0)
        .await
        .unwrap();
    assert_eq!(
        store.stats(&p, T0 + 1000 * ABANDON).await.unwrap().queued,
        1
    );
    assert_eq!(store.totals(&p).await.unwrap().abandoned, 0);
}

/// A new place costs one sorted-set entry: its poll record is written by
/// its first poll, and until then its seq says when it was last seen.
#[tokio::test]
async fn a_place_gets_its_poll_record_from_its_first_poll() {
    let (server, store) = start().await;
    let p = policy(1, 0);
    assert!(is_admitted(
        &store
            .arrive(&p, vid(1), 0, Arrival::Known, T0)
            .await
            .unwrap()
    ));
    let q = place(
        &store
            .arrive(&p, vid(2), 0, Arrival::Known, T0)
            .await
            .unwrap(),
    );
    let polls = "wr:{room-a}:polls";
    let has = |v: u64| -> i64 { server.cmd(&["HEXISTS", polls, &vid(v).to_hex()]) };
    assert_eq!(has(2), 0);
    store.poll(&p, vid(2), 0, q.seq, T0 + 5_000).await.unwrap();
    assert_eq!(has(2), 1);
    // Seen at T0 + 5 s: still waiting at T0 + 5 s + ABANDON, gone 1 ms on.
    assert_eq!(
        store.stats(&p, T0 + 5_000 + ABANDON).await.unwrap().queued,
        1
    );
    assert_eq!(
        store.stats(&p, T0 + 5_001 + ABANDON).await.unwrap().queued,
        0
    );
    assert_eq!(store.totals(&p).await.unwrap().abandoned, 1);
}

/// The poll records' own field survives the sweep's clean-up of records
/// nobody waits for: were it taken for one, the next sweep would count
/// every unpolled place from then, and a visitor who never polled would
/// outstay abandon_after.
#[tokio::test]
async fn the_sweep_keeps_the_poll_records_start() {
    let (server, store) = start().await;
    let p = policy(1, 0);
    assert!(is_admitted(
        &store
            .arrive(&p, vid(1), 0, Arrival::Known, T0)
            .await
            .unwrap()
    ));
    place(
        &store
            .arrive(&p, vid(2), 0, Arrival::Known, T0)
            .await
            .unwrap(),
    );
    // The hash holds only its own field, so every sample draws it.
    for t in 1..=20 {
        store.stats(&p, T0 + t * 1_000).await.unwrap();
    }
    let since: Option<String> = server.cmd(&["HGET", "wr:{room-a}:polls", "~since"]);
    assert_eq!(since, Some(T0.to_string()));
    assert_eq!(store.stats(&p, T0 + ABANDON).await.unwrap().queued, 1);
    assert_eq!(store.stats(&p, T0 + ABANDON + 1).await.unwrap().queued, 0);
    assert_eq!(store.totals(&p).await.unwrap().abandoned, 1);
}

/// Poll records lost while the queue is not (the hash evicted, say): the
/// places they no longer vouch for are counted from the loss, so nobody is
/// dropped for polls the store forgot (I5), and abandonment goes on.
#[tokio::test]
async fn lost_poll_records_give_time_not_drop_places() {
    let (server, store) = start().await;
    // Paused: nobody is admitted while the clock runs on.
    let mut p = policy(1, 0);
    p.state = RoomState::Paused;
    let q2 = place(
        &store
            .arrive(&p, vid(2), 0, Arrival::Known, T0)
            .await
            .unwrap(),
    );
    place(
        &store
            .arrive(&p, vid(3), 0, Arrival::Known, T0)
            .await
            .unwrap(),
    );
    store
        .poll(&p, vid(2), 0, q2.seq, T0 + 60_000)
        .await
        .unwrap();
    let _: i64 = server.cmd(&["DEL", "wr:{room-a}:polls"]);
    // vid(3) last seen at T0, vid(2) at T0 + 60 s: both past abandon_after
    // when the sweep first finds the records gone, and both kept, counted
    // from then.
    let found = T0 + 60_001 + ABANDON;
    assert_eq!(store.stats(&p, found).await.unwrap().queued, 2);
    assert_eq!(store.totals(&p).await.unwrap().abandoned, 0);
    assert_eq!(store.stats(&p, found + ABANDON).await.unwrap().queued, 2);
    assert_eq!(
        store.stats(&p, found + ABANDON + 1).await.unwrap().queued,
        0
    );
    assert_eq!(store.totals(&p).await.unwrap().abandoned, 2);
}

/// The rate window's key evicted alone (its count lives in meta): the next
/// call forgets the stale count before it admits anyone (an admission makes
/// the key again, so a later look would not see the loss), and the window
/// counts exactly from there.
#[tokio::test]
async fn an_evicted_rate_window_is_forgotten_by_the_next_call() {
    let (server, store) = start().await;
    let p = policy(0, 2);
    assert!(is_admitted(
        &store
            .arrive(&p, vid(1), 0, Arrival::Known, T0)
            .await
            .unwrap()
    ));
    assert!(is_admitted(
        &store
            .arrive(&p, vid(2), 0, Arrival::Known, T0)
            .await
            .unwrap()
    ));
    let _: i64 = server.cmd(&["DEL", "wr:{room-a}:admits"]);
    assert!(is_admitted(
        &store
            .arrive(&p, vid(3), 0, Arrival::Known, T0 + 1)
            .await
            .unwrap()
    ));
    assert!(is_admitted(
        &store
            .arrive(&p, vid(4), 0, Arrival::Known, T0 + 1)
            .await
            .unwrap()
    ));
    place(
        &store
            .arrive(&p, vid(5), 0, Arrival::Known, T0 + 1)
            .await
            .unwrap(),
    );
    let s = store.stats(&p, T0 + 2).await.unwrap();
    assert_eq!((s.queued, s.admitted_last_minute), (1, 2));
}

#[tokio::test]
async fn seq_is_unique_and_increasing_within_one_millisecond() {
    let (_server, store) = start().await;
    let mut p = policy(0, 0);
    p.state = RoomState::Paused;
    let mut last = 0;
    for i in 0..50 {
        let q = place(
            &store
                .arrive(&p, vid(i), 0, Arrival::Known, T0)
                .await
                .unwrap(),
        );
        assert!(q.seq > last);
        assert_eq!(q.position, i + 1);
        last = q.seq;
    }
    let q = place(
        &store
            .arrive(&p, vid(99), 0, Arrival::Known, T0 + 1000)
            .await
            .unwrap(),
    );
    assert_eq!(q.seq, waitroom::store::next_seq(T0 + 1000, last));
}

#[tokio::test]
async fn queue_lost_to_flushall_is_rebuilt_from_tickets() {
    let (server, store) = start().await;
    redis_store::queue_lost_to_flushall_is_rebuilt_from_tickets(&store, &policy(1, 0), || {
        let _: () = server.cmd(&["FLUSHALL"]);
    })
    .await;
}

/// One visitor admitted to a room of one, then `n` newcomers queued behind
/// it, 64 at a time (decided together, as the daemon gathers them): their
/// numbers and seqs, in seq order.
async fn queue_long(store: &RedisStore, p: &RoomPolicy, n: u64) -> Vec<(u64, u64)> {
    assert!(is_admitted(
        &store
            .arrive(p, vid(0), 0, Arrival::Known, T0)
            .await
            .unwrap()
    ));
    let mut q = Vec::new();
    for chunk in (1..=n).collect::<Vec<_>>().chunks(64) {
        let calls = chunk.iter().map(|&i| async move {
            (
                i,
                place(&store.arrive(p, vid(i), 0, Arrival::New, T0).await.unwrap()).seq,
            )
        });
        q.extend(futures::future::join_all(calls).await);
    }
    q.sort_by_key(|&(_, seq)| seq);
    q
}

/// During a rolling upgrade, an instance of an earlier version, which does
/// not know the tail, writes newcomers into `queue` at seqs past the
/// tail's. This version never lets them in ahead of the tail (I3): here
/// they are written raw, as that instance's `arrive` would, and the room
/// then opens for all but one of the queue. (Without the guard in
/// `promote`, the first of them went in at once here.)
#[tokio::test]
async fn places_an_earlier_version_writes_past_the_tail_wait_their_turn() {
    const N: u64 = 2_600;
    let (server, store) = start().await;
    let p = policy(1, 0);
    let q = queue_long(&store, &p, N).await;
    let last_seq = q[N as usize - 1].1;
    let late: Vec<(u64, u64)> = (1..=100).map(|i| (N + i, last_seq + i)).collect();
    for &(v, seq) in &late {
        let _: i64 = server.cmd(&[
            "ZADD",
            "wr:{room-a}:queue",
            &seq.to_string(),
            &vid(v).to_hex(),
        ]);
    }
    // Room for all but one: everyone in the tail goes in before them.
    let open = policy(N, 0);
    for &(v, seq) in &late {
        let got = store.poll(&open, vid(v), 0, seq, T0 + 100).await.unwrap();
        assert!(!is_admitted(&got), "#{v}: {got:?}");
    }
    for &(v, seq) in &q[..N as usize - 1] {
        let got = store.poll(&open, vid(v), 0, seq, T0 + 200).await.unwrap();
        assert!(is_admitted(&got), "#{v}: {got:?}");
    }
    let (v, seq) = q[N as usize - 1];
    let last = place(&store.poll(&open, vid(v), 0, seq, T0 + 300).await.unwrap());
    let behind = place(
        &store
            .poll(&open, vid(late[0].0), 0, late[0].1, T0 + 300)
            .await
            .unwrap(),
    );
    assert_eq!((last.position, behind.position), (1, 2));
}

/// The tail's last member lost alone (a failover that lost the last
/// writes): its visitors' polls put them back one by one, past the end of
/// what is left, and lengths and positions stay whole numbers in order,
/// through the moving up that follows. (Each put-back once took the end's
/// count unchanged, so that moving some of them up made the length
/// negative, which no verdict can carry.)
#[tokio::test]
async fn places_put_back_past_the_end_of_the_tail_keep_lengths_whole() {
    const N: u64 = 2_600;
    let (server, store) = start().await;
    let full = policy(1, 0);
    let q = queue_long(&store, &full, N).await;
    let last: Vec<Vec<u8>> = server.cmd(&["ZRANGE", "wr:{room-a}:tail", "-1", "-1"]);
    let k = f64::from_be_bytes(last[0][8..16].try_into().unwrap()) as usize;
    let _: i64 = server.cmd(&["ZREMRANGEBYRANK", "wr:{room-a}:tail", "-1", "-1"]);
    // (Each is the last the store knows of when it comes back.)
    for (i, &(v, seq)) in q.iter().enumerate().skip(N as usize - k) {
        let at = place(&store.poll(&full, vid(v), 0, seq, T0 + 100).await.unwrap());
        assert_eq!(
            (at.position, at.queue_length),
            (i as u64 + 1, i as u64 + 1),
            "#{i}"
        );
    }
    // Room for all but the last three, then one more newcomer.
    let open = policy(N - 2, 0);
    for &(v, seq) in &q[..N as usize - 3] {
        assert!(is_admitted(
            &store.poll(&open, vid(v), 0, seq, T0 + 200).await.unwrap()
        ));
    }
    for (i, &(v, seq)) in q[N as usize - 3..].iter().enumerate() {
        let at = place(&store.poll(&open, vid(v), 0, seq, T0 + 300).await.unwrap());
        assert_eq!((at.position, at.queue_length), (i as u64 + 1, 3));
    }
    let newcomer = place(
        &store
            .arrive(&open, vid(N + 1), 0, Arrival::New, T0 + 400)
            .await
            .unwrap(),
    );
    assert_eq!((newcomer.position, newcomer.queue_length), (4, 4));
}

/// A reset empties the tail too, ids and all; its tickets are ended.
#[tokio::test]
async fn a_reset_empties_the_tail_and_its_ids() {
    let (server, store) = start().await;
    let p = policy(1, 0);
    let q = queue_long(&store, &p, 2_600).await;
    let ids = |server: &RedisServer| -> i64 { server.cmd(&["EXISTS", "wr:{room-a}:tail_ids:0"]) };
    assert_eq!(ids(&server), 1);
    store.reset(&p, T0 + 100).await.unwrap();
    let tail: i64 = server.cmd(&["EXISTS", "wr:{room-a}:tail"]);
    assert_eq!((tail, ids(&server)), (0, 0));
    let (v, seq) = q[2_500];
    assert_eq!(
        store.poll(&p, vid(v), 0, seq, T0 + 200).await.unwrap(),
        Verdict::Ended
    );
}

/// A room that turns `random` with a long queue picks over the whole of it,
/// not just over its head: its tail moves into `queue` at the first
/// promotion.
#[tokio::test]
async fn a_room_that_turns_random_picks_from_the_whole_queue() {
    const N: u64 = 2_600;
    let (server, store) = start().await;
    let q = queue_long(&store, &policy(1, 0), N).await;
    let mut random = policy(1 + N / 2, 0);
    random.method = QueueingMethod::Random;
    // Everyone polls once, which admits the picks (a pick may fall on a
    // visitor who polled before it), then once more to collect them.
    for &(v, seq) in &q {
        store.poll(&random, vid(v), 0, seq, T0 + 100).await.unwrap();
    }
    let mut admitted = Vec::new();
    for (i, &(v, seq)) in q.iter().enumerate() {
        if is_admitted(&store.poll(&random, vid(v), 0, seq, T0 + 200).await.unwrap()) {
            admitted.push(i);
        }
    }
    let in_tail: u64 = server.cmd(&["ZCARD", "wr:{room-a}:tail"]);
    assert_eq!((admitted.len() as u64, in_tail), (N / 2, 0));
    let far_back = admitted.iter().filter(|&&i| i >= 2_000).count();
    assert!(far_back > 100, "{far_back} of the last 600 picked");
}

/// The back of a long queue is written one member per batch of newcomers
/// (lua/lib/tail.lua), not one entry per visitor, with the ids
/// in one string; the ids or the tail lost alone come back from the
/// tickets at their seqs (I5), in ticket order.
#[tokio::test]
async fn a_long_queue_keeps_its_back_in_batches_and_a_lost_back_comes_back() {
    const N: u64 = 2_600;
    let (server, store) = start().await;
    let p = policy(1, 0);
    let q = queue_long(&store, &p, N).await;
    let head: u64 = server.cmd(&["ZCARD", "wr:{room-a}:queue"]);
    // A member is four big-endian doubles: first seq, count, cum, offset.
    let members: Vec<Vec<u8>> = server.cmd(&["ZRANGE", "wr:{room-a}:tail", "0", "-1"]);
    let in_tail: u64 = members
        .iter()
        .map(|m| f64::from_be_bytes(m[8..16].try_into().unwrap()) as u64)
        .sum();
    assert!(head <= 2_000, "the head holds {head}");
    assert_eq!(head + in_tail, N);
    assert!(
        (members.len() as u64) * 8 < in_tail,
        "{} members for {in_tail} places: written in batches",
        members.len()
    );
    assert!(
        members.iter().all(|m| m.len() == 32),
        "the ids are not in the members"
    );
    let ids: u64 = server.cmd(&["STRLEN", "wr:{room-a}:tail_ids:0"]);
    assert_eq!(ids, 32 * in_tail, "32 characters an id, in the first chunk");
    let (v, seq) = q[N as usize - 1];
    let last = place(&store.poll(&p, vid(v), 0, seq, T0 + 100).await.unwrap());
    assert_eq!((last.position, last.queue_length), (N, N));

    // Lost alone: first the ids (each place is put back as a member that
    // carries its id), then the tail's members (put back in `queue`).
    let mut paused = p.clone();
    paused.state = RoomState::Paused;
    for lost in ["wr:{room-a}:tail_ids:0", "wr:{room-a}:tail"] {
        let _: i64 = server.cmd(&["DEL", lost]);
        for &(v, seq) in q.iter().rev() {
            store.poll(&paused, vid(v), 0, seq, T0 + 200).await.unwrap();
        }
        for (i, &(v, seq)) in q.iter().enumerate().step_by(97) {
            let at = place(&store.poll(&paused, vid(v), 0, seq, T0 + 300).await.unwrap());
            assert_eq!(
                (at.position, at.queue_length, at.seq),
                (i as u64 + 1, N, seq),
                "{lost} lost"
            );
        }
    }
}

#[tokio::test]
async fn scripts_are_reloaded_after_script_flush() {
    let (server, store) = start().await;
    let p = policy(0, 0);
    assert!(is_admitted(
        &store
            .arrive(&p, vid(1), 0, Arrival::Known, T0)
            .await
            .unwrap()
    ));
    store.totals(&p).await.unwrap();
    // The room functions are not scripts; totals is, and must load again.
    let _: () = server.cmd(&["SCRIPT", "FLUSH"]);
    assert_eq!(store.totals(&p).await.unwrap().admitted, 1);
    assert!(is_admitted(
        &store
            .arrive(&p, vid(2), 0, Arrival::Known, T0)
            .await
            .unwrap()
    ));
    assert!(store
        .check_in(&p, vid(1), T0 + 1, T0 + 1)
        .await
        .unwrap()
        .is_some());
    assert_eq!(store.stats(&p, T0 + 1).await.unwrap().active, 2);
}

#[tokio::test]
async fn every_operation_is_one_script_call() {
    let (server, store) = start().await;
    let p = policy(1, 0);
    // Warm up so no SCRIPT LOAD is counted below.
    store
        .arrive(&p, vid(1), 0, Arrival::Known, T0)
        .await
        .unwrap();
    let q = place(
        &store
            .arrive(&p, vid(2), 0, Arrival::Known, T0)
            .await
            .unwrap(),
    );
    store.poll(&p, vid(2), 0, q.seq, T0).await.unwrap();
    store.check_in(&p, vid(1), T0, T0).await.unwrap();
    store.end(&p, vid(9), End::Release, T0).await.unwrap();
    store.stats(&p, T0).await.unwrap();
    store.totals(&p).await.unwrap();
    store.reset(&p, T0).await.unwrap();
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    store
        .arrive(&p, vid(1), 0, Arrival::Known, T0)
        .await
        .unwrap();
    store.poll(&p, vid(2), 0, q.seq, T0).await.unwrap();
    store.check_in(&p, vid(1), T0, T0).await.unwrap();
    store.end(&p, vid(1), End::Release, T0).await.unwrap();
    store.stats(&p, T0).await.unwrap();
    store.totals(&p).await.unwrap();
    store.reset(&p, T0).await.unwrap();
    let calls = |name: &str| -> u64 {
        server
            .info_field("commandstats", &format!("cmdstat_{name}"))
            .and_then(|v| v.split(',').next()?.strip_prefix("calls=")?.parse().ok())
            .unwrap_or(0)
    };
    let all: String = server.cmd(&["INFO", "commandstats"]);
    // The room functions (arrive, poll, check_in, release, stats, reset),
    // and the script outside the library (totals).
    assert_eq!(calls("fcall"), 6, "{all}");
    assert_eq!(calls("evalsha"), 1, "{all}");
    assert_eq!(
        calls("eval") + calls("script|load") + calls("function|load"),
        0
    );
}

#[tokio::test]
async fn a_server_that_lost_the_room_functions_gets_them_again() {
    let (server, store) = start().await;
    let p = policy(1, 0);
    store
        .arrive(&p, vid(1), 0, Arrival::Known, T0)
        .await
        .unwrap();
    let loaded: Vec<redis::Value> = server.cmd(&["FUNCTION", "LIST"]);
    assert_eq!(loaded.len(), 1, "one library");
    // As after a restart without persistence: the next call loads the
    // library again and is answered, with the room's state intact.
    let _: () = server.cmd(&["FUNCTION", "FLUSH"]);
    let q = place(
        &store
            .arrive(&p, vid(2), 0, Arrival::Known, T0)
            .await
            .unwrap(),
    );
    assert_eq!(q.position, 1);
    let loaded: Vec<redis::Value> = server.cmd(&["FUNCTION", "LIST"]);
    assert_eq!(loaded.len(), 1, "loaded again");
    assert!(store.check_in(&p, vid(1), T0, T0).await.unwrap().is_some());
}

#[tokio::test]
async fn room_keys_share_the_room_tag_expire_and_hold_hex_visitors() {
    let (server, store) = start().await;
    let p = policy(1, 0);
    store
        .arrive(&p, vid(1), 0, Arrival::Known, T0)
        .await
        .unwrap();
    store
        .arrive(&p, vid(2), 0, Arrival::Known, T0)
        .await
        .unwrap();
    let mut keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    keys.sort();
    assert_eq!(
        keys,
        ["admits", "meta", "polls", "queue", "sessions"].map(|k| format!("wr:{{room-a}}:{k}"))
    );
    for key in &keys {
        let ttl: i64 = server.cmd(&["PTTL", key]);
        let most = (p.session_duration_ms + p.arrival_grace_ms + 3_600_000) as i64;
        assert!(ttl > 0 && ttl <= most, "{key}: {ttl}");
    }
    let sessions: Vec<String> = server.cmd(&["ZRANGE", "wr:{room-a}:sessions", "0", "-1"]);
    assert_eq!(sessions, [vid(1).to_hex()]);
    let queue: Vec<String> = server.cmd(&["ZRANGE", "wr:{room-a}:queue", "0", "-1"]);
    assert_eq!(queue, [vid(2).to_hex()]);
    store.reset(&p, T0).await.unwrap();
    // Only the record of the ended session is left, and it expires with it,
    // and the meta hash with the reset floor, which expires with the room.
    let mut keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    keys.sort();
    assert_eq!(keys, ["wr:{room-a}:ended", "wr:{room-a}:meta"]);
    let floor: String = server.cmd(&["HGET", "wr:{room-a}:meta", "reset_floor"]);
    assert!(floor.parse::<u64>().unwrap() >= waitroom::store::next_seq(T0, 0));
    let ended: Vec<String> = server.cmd(&["ZRANGE", "wr:{room-a}:ended", "0", "-1"]);
    assert_eq!(ended, [vid(1).to_hex()]);
    let at: i64 = server.cmd(&["PEXPIRETIME", "wr:{room-a}:ended"]);
    assert_eq!(at as u64, T0 + p.session_duration_ms);
}

#[tokio::test]
async fn promotion_is_bounded_per_script_run() {
    let (_server, store) = start().await;
    let mut p = policy(0, 0);
    p.state = RoomState::Paused;
    for i in 0..2500 {
        store
            .arrive(&p, vid(i), 0, Arrival::Known, T0)
            .await
            .unwrap();
    }
    p.state = RoomState::Open;
    let first = store.stats(&p, T0).await.unwrap();
    assert_eq!((first.active, first.queued), (1000, 1500));
    store.stats(&p, T0).await.unwrap();
    let third = store.stats(&p, T0).await.unwrap();
    assert_eq!((third.active, third.queued), (2500, 0));
}

#[tokio::test]
async fn frozen_server_times_out_within_the_bound() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let timeout = Duration::from_millis(300);
    let store = RedisStore::connect(&[server.url()], timeout).await.unwrap();
    let p = policy(0, 0);
    assert!(is_admitted(
        &store
            .arrive(&p, vid(1), 0, Arrival::Known, T0)
            .await
            .unwrap()
    ));
    server.pause();
    for i in 2..5 {
        let started = Instant::now();
        let result = store.arrive(&p, vid(i), 0, Arrival::Known, T0).await;
        let took = started.elapsed();
        assert!(matches!(result, Err(StoreError::Timeout)), "{result:?}");
        assert!(
            took >= timeout && took < timeout + Duration::from_millis(250),
            "{took:?}"
        );
    }
    server.resume();
    assert!(is_admitted(
        &store
            .arrive(&p, vid(9), 0, Arrival::Known, T0)
            .await
            .unwrap()
    ));
}

#[tokio::test]
async fn reconnects_after_the_server_restarts_on_the_same_port() {
    let mut server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let timeout = Duration::from_millis(500);
    let store = RedisStore::connect(&[server.url()], timeout).await.unwrap();
    let p = policy(0, 0);
    assert!(is_admitted(
        &store
            .arrive(&p, vid(1), 0, Arrival::Known, T0)
            .await
            .unwrap()
    ));
    server.stop();
    for i in 0..3 {
        let started = Instant::now();
        let result = store.arrive(&p, vid(2), 0, Arrival::Known, T0).await;
        assert!(
            matches!(
                result,
                Err(StoreError::Unavailable(_) | StoreError::Timeout)
            ),
            "attempt {i}: {result:?}"
        );
        assert!(started.elapsed() < timeout + Duration::from_millis(250));
    }
    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    // The connection comes back on its own; the data (no persistence) does not.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.stats(&p, T0).await {
            Ok(stats) => {
                assert_eq!(stats.active, 0);
                break;
            }
            Err(e) => assert!(Instant::now() < deadline, "never reconnected: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(is_admitted(
        &store
            .arrive(&p, vid(3), 0, Arrival::Known, T0)
            .await
            .unwrap()
    ));
    drop(server);
}

#[tokio::test]
async fn connect_fails_fast_when_nothing_listens() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = Instant::now();
    let timeout = Duration::from_millis(500);
    let result = RedisStore::connect(&[format!("redis://127.0.0.1:{port}/")], timeout).await;
    assert!(
        matches!(
            result,
            Err(StoreError::Unavailable(_) | StoreError::Timeout)
        ),
        "{result:?}"
    );
    assert!(started.elapsed() < timeout + Duration::from_millis(250));
    let none = RedisStore::connect(&[], timeout).await;
    assert!(matches!(none, Err(StoreError::Unavailable(_))));
}

#[tokio::test]
async fn errors_never_carry_the_password() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let url = format!("redis://:hunter2-secret@127.0.0.1:{}/", server.port());
    let err = RedisStore::connect(&[url], TIMEOUT)
        .await
        .expect_err("no password is configured, so AUTH fails");
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    let bad = RedisStore::connect(&["not a url".to_string()], TIMEOUT).await;
    assert!(matches!(bad, Err(StoreError::Unavailable(_))), "{bad:?}");
}

#[tokio::test]
async fn many_instances_share_one_room() {
    let (server, a) = start().await;
    let b = RedisStore::connect(&[server.url()], TIMEOUT).await.unwrap();
    let p = policy(50, 0);
    let (ra, rb) = tokio::join!(
        futures_util::future::join_all((0..300).map(|i| a.arrive(
            &p,
            vid(i),
            0,
            Arrival::Known,
            T0
        ))),
        futures_util::future::join_all((300..600).map(|i| b.arrive(
            &p,
            vid(i),
            0,
            Arrival::Known,
            T0
        ))),
    );
    let verdicts: Vec<Verdict> = ra.into_iter().chain(rb).map(Result::unwrap).collect();
    assert_eq!(verdicts.iter().filter(|v| is_admitted(v)).count(), 50);
    let mut positions: Vec<u64> = verdicts
        .iter()
        .filter(|v| !is_admitted(v))
        .map(|v| place(v).position)
        .collect();
    positions.sort_unstable();
    assert_eq!(positions, (1..=550).collect::<Vec<u64>>());
}

/// I6 without ghosts: calls that timed out while Redis was frozen are
/// buffered by Redis and run when it thaws; their scripts find the caller's
/// deadline passed and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_timed_out_in_a_frozen_redis_never_land() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let store = Arc::new(
        RedisStore::connect(&[server.url()], Duration::from_millis(200))
            .await
            .unwrap(),
    );
    let p = policy(1, 0);
    // One visitor inside and one waiting before the freeze.
    assert!(is_admitted(
        &store
            .arrive(&p, vid(1), 0, Arrival::Known, T0)
            .await
            .unwrap()
    ));
    let waiting = place(
        &store
            .arrive(&p, vid(2), 0, Arrival::Known, T0)
            .await
            .unwrap(),
    );
    server.pause();
    let mut calls = Vec::new();
    for n in 10..30 {
        let (store, p) = (store.clone(), p.clone());
        calls.push(tokio::spawn(async move {
            store.arrive(&p, vid(n), 0, Arrival::Known, T0 + 1).await
        }));
    }
    for call in calls {
        assert!(matches!(call.await.unwrap(), Err(StoreError::Timeout)));
    }
    // And a release that would let the waiting visitor in.
    let release = store.end(&p, vid(1), End::Release, T0 + 2).await;
    assert!(matches!(release, Err(StoreError::Timeout)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.resume();
    let stats = store.stats(&p, T0 + 3).await.unwrap();
    assert_eq!(
        (stats.active, stats.queued),
        (1, 1),
        "the room is as it was before the freeze"
    );
    let totals = store.totals(&p).await.unwrap();
    assert_eq!((totals.admitted, totals.queued), (1, 1));
    assert_eq!(
        place(
            &store
                .poll(&p, vid(2), 0, waiting.seq, T0 + 4)
                .await
                .unwrap()
        )
        .position,
        1
    );
}

/// A room nobody uses any more leaves nothing behind: every key an arrival
/// creates expires, including one created between the arrivals' periodic
/// expiry refreshes (every 10 s, not every call).
#[tokio::test]
async fn keys_made_by_arrivals_expire() {
    let (server, store) = start().await;
    let p = policy(1, 0);
    assert!(is_admitted(
        &store
            .arrive(&p, vid(1), 0, Arrival::Known, T0)
            .await
            .unwrap()
    ));
    // 1 ms later, inside the refresh interval: the queue's keys are new.
    place(
        &store
            .arrive(&p, vid(2), 0, Arrival::Known, T0 + 1)
            .await
            .unwrap(),
    );
    for key in ["sessions", "admits", "meta", "queue", "polls"] {
        let key = format!("wr:{{room-a}}:{key}");
        let ttl: i64 = server.cmd(&["PTTL", &key]);
        assert!(ttl > 0, "{key} has no expiry ({ttl})");
    }
    // Emptied (its key gone) and made again within the interval: the new
    // key gets an expiry too.
    let _: i64 = server.cmd(&["DEL", "wr:{room-a}:sessions"]);
    assert!(is_admitted(
        &store
            .arrive(&policy(0, 0), vid(3), 0, Arrival::Known, T0 + 2)
            .await
            .unwrap()
    ));
    let ttl: i64 = server.cmd(&["PTTL", "wr:{room-a}:sessions"]);
    assert!(ttl > 0, "sessions made again has no expiry ({ttl})");
}

/// Arrives `n` new visitors (`Arrival::New`, the daemon's way) at once; returns
/// those admitted.
async fn admit_together(store: &Arc<RedisStore>, p: &RoomPolicy, n: u64, now: Millis) -> Vec<u64> {
    let mut joins = Vec::new();
    for i in 0..n {
        let (store, p) = (Arc::clone(store), p.clone());
        joins.push(tokio::spawn(async move {
            (
                i,
                store
                    .arrive(&p, vid(i), 0, Arrival::New, now)
                    .await
                    .unwrap(),
            )
        }));
    }
    let mut admitted = Vec::new();
    for j in joins {
        let (i, verdict) = j.await.unwrap();
        if is_admitted(&verdict) {
            admitted.push(i);
        }
    }
    admitted
}

/// Newcomers admitted together are one `batches` entry per call, counted
/// by the count member; `sessions` holds only sessions made one at a time
/// (here, the renewed one). The key expires like the others.
#[tokio::test]
async fn newcomers_admitted_together_are_one_entry_per_call() {
    let (server, store) = start().await;
    let store = Arc::new(store);
    let p = policy(0, 0);
    let admitted = admit_together(&store, &p, 64, T0).await;
    assert_eq!(admitted.len(), 64);
    let members: Vec<String> = server.cmd(&["ZRANGE", "wr:{room-a}:batches", "0", "-1"]);
    assert_eq!(members[0], "#");
    assert!(
        members.len() - 1 < 64,
        "{} entries for 64 sessions",
        members.len() - 1
    );
    let ids: String = members[1..].concat();
    assert_eq!(ids.len(), 64 * 32);
    let count: String = server.cmd(&["ZSCORE", "wr:{room-a}:batches", "#"]);
    assert_eq!(count, "-64");
    let sessions: i64 = server.cmd(&["EXISTS", "wr:{room-a}:sessions"]);
    assert_eq!(sessions, 0);
    let ttl: i64 = server.cmd(&["PTTL", "wr:{room-a}:batches"]);
    assert!(ttl > 0, "no expiry ({ttl})");

    // A renewal makes the session one of its own.
    let later = T0 + 1_000;
    assert_eq!(
        store
            .check_in(&p, vid(5), T0 + SESSION, later)
            .await
            .unwrap(),
        Some(later + SESSION)
    );
    let count: String = server.cmd(&["ZSCORE", "wr:{room-a}:batches", "#"]);
    assert_eq!(count, "-63");
    let single: Vec<String> = server.cmd(&["ZRANGE", "wr:{room-a}:sessions", "0", "-1"]);
    assert_eq!(single, [vid(5).to_hex()]);
    let ttl: i64 = server.cmd(&["PTTL", "wr:{room-a}:sessions"]);
    assert!(ttl > 0, "no expiry ({ttl})");
    // ... and leaves a mark in its batch, which ends with the batch.
    let mark: String = server.cmd(&[
        "ZSCORE",
        "wr:{room-a}:batches",
        &format!("-{}", vid(5).to_hex()),
    ]);
    // (Half a millisecond below: a lookup by the batch's expiry skips it.)
    assert_eq!(mark, format!("{}.5", T0 + SESSION - 1));
    assert_eq!(store.stats(&p, later).await.unwrap().active, 64);
    assert_eq!(store.stats(&p, T0 + SESSION).await.unwrap().active, 1);
    let left: Vec<String> = server.cmd(&["ZRANGE", "wr:{room-a}:batches", "0", "-1", "WITHSCORES"]);
    assert_eq!(left, ["#", "0"]);
}

/// I5 for batched sessions: lost with their key (FLUSHALL), each comes back
/// at its check-in; a count member lost by hand is counted again from the
/// batches (never read as a session expiry).
#[tokio::test]
async fn batched_sessions_lost_come_back_and_their_count_is_recounted() {
    let (server, store) = start().await;
    let store = Arc::new(store);
    let p = policy(10, 0);
    assert_eq!(admit_together(&store, &p, 10, T0).await.len(), 10);
    let _: () = server.cmd(&["ZREM", "wr:{room-a}:batches", "#"]);
    assert_eq!(store.stats(&p, T0).await.unwrap().active, 10);
    assert!(!is_admitted(
        &store
            .arrive(&p, vid(100), 0, Arrival::New, T0)
            .await
            .unwrap()
    ));

    let (server2, store2) = start().await;
    let store2 = Arc::new(store2);
    let admitted = admit_together(&store2, &p, 10, T0).await;
    let _: () = server2.cmd(&["FLUSHALL"]);
    assert_eq!(store2.stats(&p, T0).await.unwrap().active, 0);
    for (n, i) in admitted.iter().enumerate() {
        assert_eq!(
            store2
                .check_in(&p, vid(*i), T0 + SESSION, T0 + 1)
                .await
                .unwrap(),
            Some(T0 + 1 + SESSION)
        );
        assert_eq!(store2.stats(&p, T0 + 1).await.unwrap().active, n as u64 + 1);
    }
    assert!(!is_admitted(
        &store2
            .arrive(&p, vid(100), 0, Arrival::New, T0 + 1)
            .await
            .unwrap()
    ));
}

/// The origin's revoke ends a batched session by its ticket's expiry: only
/// the batches ending then are read, while `release` (no ticket) reads them
/// all. A ticket that names no batch of the visitor's (renewed by a store
/// that stood in) finds nothing there, but ends the visitor all the same:
/// neither ticket checks in again (its batch counts it until it ends).
#[tokio::test]
async fn a_revoke_reads_only_the_batch_its_ticket_names() {
    let (server, store) = start().await;
    let store = Arc::new(store);
    let p = policy(0, 0);
    assert_eq!(admit_together(&store, &p, 16, T0).await.len(), 16);
    let elsewhere = T0 + 1 + SESSION;
    assert!(!store
        .end(&p, vid(2), End::Session(elsewhere), T0 + 1)
        .await
        .unwrap());
    assert_eq!(store.stats(&p, T0 + 1).await.unwrap().active, 16);
    for ticket in [T0 + SESSION, elsewhere] {
        let checked = store.check_in(&p, vid(2), ticket, T0 + 2).await.unwrap();
        assert_eq!(checked, None, "ticket {ticket}");
    }
    assert_eq!(store.stats(&p, T0 + 2).await.unwrap().active, 16);
    assert!(store
        .end(&p, vid(3), End::Session(T0 + SESSION), T0 + 3)
        .await
        .unwrap());
    let mark: String = server.cmd(&[
        "ZSCORE",
        "wr:{room-a}:batches",
        &format!("-{}", vid(3).to_hex()),
    ]);
    assert_eq!(mark, format!("{}.5", T0 + SESSION - 1));
    assert_eq!(store.stats(&p, T0 + 3).await.unwrap().active, 15);
    assert!(store.end(&p, vid(4), End::Release, T0 + 4).await.unwrap());
    assert_eq!(store.stats(&p, T0 + 4).await.unwrap().active, 14);
    // An arrival whose caller gave up: only batches from its arrival on.
    assert!(!store
        .end(&p, vid(5), End::Arrival(T0 + 1), T0 + 5)
        .await
        .unwrap());
    assert!(store
        .end(&p, vid(5), End::Arrival(T0), T0 + 5)
        .await
        .unwrap());
    assert_eq!(store.stats(&p, T0 + 5).await.unwrap().active, 13);
}

/// A store on `server` with the test-size layout (a head of 8 places,
/// chunks of 16 ids, runs of 5).
async fn small(server: &RedisServer) -> RedisStore {
    RedisStore::connect_with_layout(
        &[server.url()],
        TIMEOUT,
        waitroom::store::redis::Layout::small(),
    )
    .await
    .unwrap()
}

/// `n` newcomers queued one call at a time at `now` (non-fresh arrivals).
async fn queue_n(store: &RedisStore, p: &RoomPolicy, n: u64, now: Millis) -> Vec<(VisitorId, u64)> {
    let mut out = Vec::new();
    for i in 0..n {
        let v = vid(10_000 + i);
        out.push((
            v,
            place(&store.arrive(p, v, 0, Arrival::Known, now).await.unwrap()).seq,
        ));
    }
    out
}

/// I4 with promotion bounded per call: when room opens for forty waiting
/// visitors at once, the fortieth is admitted at its own poll, though one
/// call promotes at most five (test size) ahead of it; and nobody behind
/// the room is. (Each poll was told "queued" until enough calls had run:
/// at scale, visitors inside a raised limit were told so.)
#[tokio::test]
async fn a_visitor_within_the_free_room_is_admitted_at_its_poll_however_far_back() {
    let (server, _) = start().await;
    let store = small(&server).await;
    let mut p = policy(40, 0);
    p.room = Arc::from("far-back");
    p.state = RoomState::Paused;
    let waiting = queue_n(&store, &p, 50, T0).await;
    p.state = RoomState::Open;
    let (v, seq) = waiting[39];
    assert!(is_admitted(
        &store.poll(&p, v, 0, seq, T0 + 1).await.unwrap()
    ));
    for (v, seq) in &waiting[..39] {
        assert!(is_admitted(
            &store.poll(&p, *v, 0, *seq, T0 + 2).await.unwrap()
        ));
    }
    let (v, seq) = waiting[40];
    assert_eq!(
        place(&store.poll(&p, v, 0, seq, T0 + 3).await.unwrap()).position,
        1
    );
    assert!(store.check(&p, T0 + 3).await.unwrap().is_empty());
}

/// `Store::arrive` of a visitor whose place is in the tail returns that
/// place; it got a second one (the tail is not looked up by visitor).
#[tokio::test]
async fn an_arrival_again_of_a_visitor_in_the_tail_keeps_its_place() {
    let (server, _) = start().await;
    let store = small(&server).await;
    let mut p = policy(1, 0);
    p.room = Arc::from("again");
    p.state = RoomState::Paused;
    let waiting = queue_n(&store, &p, 30, T0).await;
    let (v, seq) = waiting[20];
    let again = place(
        &store
            .arrive(&p, v, 0, Arrival::Known, T0 + 1)
            .await
            .unwrap(),
    );
    assert_eq!(again.seq, seq);
    assert_eq!(store.stats(&p, T0 + 1).await.unwrap().queued, 30);
}

/// A member's arrival again (a stable id, no ticket: an enqueue token sent
/// again without its cookie) finds its place in the tail by the seq noted
/// for it, reading one member, not the tail: before, the call read every
/// member of the tail (GETRANGE per member; 67 ms of Redis at 180,000
/// queued), so one account could stall Redis. The same for a member the
/// room had not seen lately, and for one whose place has moved up since.
#[tokio::test]
async fn an_arrival_again_by_a_stable_id_reads_a_bounded_part_of_the_tail() {
    let (server, _) = start().await;
    let store = small(&server).await;
    let mut p = policy(1, 0);
    p.room = Arc::from("member-again");
    p.state = RoomState::Paused;
    let getranges = |server: &RedisServer| -> u64 {
        server
            .info_field("commandstats", "cmdstat_getrange")
            .and_then(|v| v.split(',').next()?.strip_prefix("calls=")?.parse().ok())
            .unwrap_or(0)
    };
    // Newcomers one call each (a tail member each), a member, a member
    // not seen lately, and many more newcomers behind them both.
    for i in 0..400 {
        place(
            &store
                .arrive(&p, VisitorId::random(), 0, Arrival::New, T0 + i)
                .await
                .unwrap(),
        );
    }
    let (member, unseen) = (vid(77), vid(78));
    let first = place(
        &store
            .arrive(&p, member, 0, Arrival::Known, T0 + 500)
            .await
            .unwrap(),
    );
    let second = place(
        &store
            .arrive(&p, unseen, 0, Arrival::Unseen, T0 + 501)
            .await
            .unwrap(),
    );
    for i in 0..400 {
        place(
            &store
                .arrive(&p, VisitorId::random(), 0, Arrival::New, T0 + 600 + i)
                .await
                .unwrap(),
        );
    }
    for (v, was) in [(member, first), (unseen, second)] {
        for round in 0..3 {
            let before = getranges(&server);
            let again = place(
                &store
                    .arrive(&p, v, 0, Arrival::Known, T0 + 2_000 + round)
                    .await
                    .unwrap(),
            );
            assert_eq!(again.seq, was.seq, "the same place");
            assert_eq!(again.position, was.position);
            let read = getranges(&server) - before;
            assert!(read <= 2, "{read} tail reads for one arrival of {v:?}");
        }
    }
    assert_eq!(store.stats(&p, T0 + 3_000).await.unwrap().queued, 802);
    // Once the queue moves past their members, the places are in the head
    // and still found (their notes are gone with the move).
    p.state = RoomState::Open;
    p.total_active_users = 0;
    p.new_users_per_minute = 0;
    let _ = store
        .poll(&p, member, 0, first.seq, T0 + 4_000)
        .await
        .unwrap();
    assert!(is_admitted(
        &store
            .arrive(&p, member, 0, Arrival::Known, T0 + 4_001)
            .await
            .unwrap()
    ));
    assert!(store.check(&p, T0 + 4_001).await.unwrap().is_empty());
}

/// The tail's ids chunks keep their expiry whatever the queue's size: the
/// periodic refresh reached the first 64 chunks only (4.2 million places at
/// production size; 69 chunks here). Their expiry is taken away by hand,
/// and one round of maintenance gives it back to every one.
#[tokio::test]
async fn every_ids_chunk_keeps_its_expiry_at_any_queue_size() {
    let (server, _) = start().await;
    let store = small(&server).await;
    let mut p = policy(1, 0);
    p.room = Arc::from("chunks");
    p.state = RoomState::Paused;
    for round in 0..18u64 {
        let calls = (0..64u64).map(|i| {
            let (store, p) = (&store, &p);
            async move {
                let v = vid(1_000_000 + round * 64 + i);
                store.arrive(p, v, 0, Arrival::New, T0).await.unwrap()
            }
        });
        futures::future::join_all(calls).await;
    }
    let chunks: Vec<String> = server.cmd(&["KEYS", "wr:{chunks}:tail_ids:*"]);
    assert!(chunks.len() > 64, "{} chunks", chunks.len());
    for key in &chunks {
        let _: i64 = server.cmd(&["PERSIST", key]);
    }
    // A new ten seconds of the clock: the call refreshes every key's expiry.
    store.stats(&p, T0 + 10_000).await.unwrap();
    // (-2: a chunk the queue has moved past, deleted; -1: no expiry.)
    let none: Vec<&String> = chunks
        .iter()
        .filter(|key| server.cmd::<i64>(&["PTTL", key]) == -1)
        .collect();
    assert!(none.is_empty(), "no expiry: {none:?} of {}", chunks.len());
    assert!(store.check(&p, T0 + 10_000).await.unwrap().is_empty());
}

/// The admin API's release (no ticket, so no expiry to find a batched
/// session by) reads the batches a bounded part a call: a session in the
/// last of 600 batches is found, over several calls, none of which reads
/// them all. (One call read every batch: 11 ms of Redis per 100,000
/// sessions.)
#[tokio::test]
async fn a_release_without_a_ticket_reads_the_batches_a_part_a_call() {
    let (server, store) = start().await;
    let mut p = policy(0, 0);
    p.room = Arc::from("ticketless");
    let mut last = None;
    for round in 0..600u64 {
        let v = vid(2_000_000 + round);
        // One newcomer a call at its own millisecond: one batch each.
        assert!(is_admitted(
            &store
                .arrive(&p, v, 0, Arrival::New, T0 + round)
                .await
                .unwrap()
        ));
        last = Some(v);
    }
    let calls = |server: &RedisServer| -> u64 {
        server
            .info_field("commandstats", "cmdstat_fcall")
            .and_then(|v| v.split(',').next()?.strip_prefix("calls=")?.parse().ok())
            .unwrap_or(0)
    };
    let before = calls(&server);
    assert!(store
        .end(&p, last.unwrap(), End::Release, T0 + 1_000)
        .await
        .unwrap());
    assert!(calls(&server) - before >= 3, "a part a call");
    assert!(!store
        .end(&p, vid(42), End::Release, T0 + 1_000)
        .await
        .unwrap());
    assert_eq!(store.stats(&p, T0 + 1_000).await.unwrap().active, 599);
}

/// At production size, the tail's ids cross a chunk boundary (65,536 ids):
/// a batch whose ids straddle it is written in two parts, read back in two,
/// found at its place, and once the queue has moved past it the first
/// chunk is deleted; the layout's invariants hold throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_crosses_an_ids_chunk_boundary_at_production_size() {
    let (server, store) = start().await;
    let mut p = policy(0, 0);
    p.room = Arc::from("boundary");
    p.state = RoomState::Paused;
    // 2,000 in the head, then 65,536 ids and a few more in the tail.
    let total: u64 = 2_000 + 65_536 + 300;
    let mut places = Vec::new();
    let mut next = 0u64;
    while next < total {
        let calls = (0..64u64).map(|i| {
            let (store, p) = (&store, &p);
            async move {
                let v = vid(5_000_000 + next + i);
                (
                    v,
                    place(&store.arrive(p, v, 0, Arrival::New, T0).await.unwrap()).seq,
                )
            }
        });
        places.extend(futures::future::join_all(calls).await);
        next += 64;
    }
    places.sort_by_key(|(_, seq)| *seq);
    let chunks: Vec<String> = server.cmd(&["KEYS", "wr:{boundary}:tail_ids:*"]);
    assert_eq!(chunks.len(), 2, "{chunks:?}");
    assert!(store.check(&p, T0).await.unwrap().is_empty());
    // Places on both sides of the boundary are found where they stand.
    for rank in [2_000 + 65_535, 2_000 + 65_536, 2_000 + 65_600] {
        let (v, seq) = places[rank];
        let at = place(&store.poll(&p, v, 0, seq, T0 + 1).await.unwrap());
        assert_eq!(at.position, rank as u64 + 1, "rank {rank}");
    }
    // The queue moves past the first chunk: it is deleted.
    p.state = RoomState::Open;
    p.total_active_users = 2_000 + 65_600;
    for (v, seq) in places.iter().step_by(997) {
        let _ = store.poll(&p, *v, 0, *seq, T0 + 2).await.unwrap();
    }
    let (v, seq) = places[2_000 + 65_599];
    assert!(is_admitted(
        &store.poll(&p, v, 0, seq, T0 + 2).await.unwrap()
    ));
    let chunks: Vec<String> = server.cmd(&["KEYS", "wr:{boundary}:tail_ids:*"]);
    assert_eq!(chunks, ["wr:{boundary}:tail_ids:1"]);
    assert!(store.check(&p, T0 + 2).await.unwrap().is_empty());
}

/// A rolling upgrade across layouts: the next build (layout 2, which reads
/// 1 and marks what it touches as 2) and this one (layout 1) decide for the
/// same room at once, under load. This build decides while the room is
/// marked 1, then refuses (StoreError::Layout) once the next build has
/// marked it: nobody is ever admitted over the limit, whoever decides.
/// (Before the mark, an earlier build admitted "as if the batched
/// sessions had left".)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn builds_of_two_layouts_on_one_redis_never_oversell() {
    use waitroom::store::redis::{Layout, LAYOUT_VERSION};
    use waitroom::store::StoreError;
    let (server, current) = start().await;
    let next = RedisStore::connect_with_layout(
        &[server.url()],
        TIMEOUT,
        Layout {
            version: LAYOUT_VERSION + 1,
            oldest: LAYOUT_VERSION,
            ..Layout::production()
        },
    )
    .await
    .unwrap();
    let mut p = policy(100, 0);
    p.room = Arc::from("upgrade");
    // This build makes the room: it is marked as this layout.
    assert!(is_admitted(
        &current
            .arrive(&p, vid(1), 0, Arrival::New, T0)
            .await
            .unwrap()
    ));
    let layout: String = server.cmd(&["HGET", "wr:{upgrade}:meta", "layout"]);
    assert_eq!(layout, LAYOUT_VERSION.to_string());
    // Both decide at once: newcomers, every other one on each build, in
    // two waves; between them the next build has surely touched the room.
    let wave = |from: u64| {
        let (current, next, p) = (&current, &next, &p);
        futures::future::join_all((from..from + 500).map(move |i| async move {
            let v = vid(100 + i);
            if i % 2 == 0 {
                current.arrive(p, v, 0, Arrival::New, T0 + 1).await
            } else {
                next.arrive(p, v, 0, Arrival::New, T0 + 1).await
            }
        }))
    };
    let mut verdicts = wave(0).await;
    next.stats(&p, T0 + 1).await.unwrap();
    let second = wave(500).await;
    assert!(
        second
            .iter()
            .step_by(2)
            .all(|v| matches!(v, Err(StoreError::Layout(2)))),
        "this build refuses the newer layout"
    );
    verdicts.extend(second);
    let admitted = verdicts
        .iter()
        .filter(|v| matches!(v, Ok(Verdict::Admitted { .. })))
        .count();
    assert!(admitted < 100, "{admitted} admitted beside the first");
    assert!(verdicts
        .iter()
        .all(|v| matches!(v, Ok(_) | Err(StoreError::Layout(2)))));
    // The next build counts every session, whoever made it.
    assert_eq!(next.stats(&p, T0 + 1).await.unwrap().active, 100);
    assert!(matches!(
        current.stats(&p, T0 + 1).await,
        Err(StoreError::Layout(2))
    ));
    assert!(next.check(&p, T0 + 1).await.unwrap().is_empty());
}

/// The seamless path (expand, then contract): an "expand" release of this
/// layout that already reads the next one, beside the next build, under
/// load. Neither refuses anything, the room keeps the newer mark, and
/// exactly the limit is admitted, whoever decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expand_release_decides_beside_the_next_layout() {
    use waitroom::store::redis::{Layout, LAYOUT_VERSION};
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let urls = [server.url()];
    let with = |layout: Layout| RedisStore::connect_with_layout(&urls, TIMEOUT, layout);
    let expand = with(Layout {
        newest: LAYOUT_VERSION + 1,
        ..Layout::production()
    })
    .await
    .unwrap();
    let next = with(Layout {
        version: LAYOUT_VERSION + 1,
        oldest: LAYOUT_VERSION,
        ..Layout::production()
    })
    .await
    .unwrap();
    let mut p = policy(100, 0);
    p.room = Arc::from("expand");
    assert!(is_admitted(
        &expand
            .arrive(&p, vid(1), 0, Arrival::New, T0)
            .await
            .unwrap()
    ));
    let verdicts = futures::future::join_all((0..1_000u64).map(|i| {
        let (expand, next, p) = (&expand, &next, &p);
        async move {
            let v = vid(100 + i);
            if i % 2 == 0 {
                expand.arrive(p, v, 0, Arrival::New, T0 + 1).await
            } else {
                next.arrive(p, v, 0, Arrival::New, T0 + 1).await
            }
        }
    }))
    .await;
    let admitted = verdicts
        .iter()
        .map(|v| match v {
            Ok(v) => is_admitted(v),
            Err(e) => panic!("refused: {e:?}"),
        })
        .filter(|a| *a)
        .count();
    assert_eq!(admitted, 99);
    assert_eq!(expand.stats(&p, T0 + 1).await.unwrap().active, 100);
    // The expand release touched the room last: the newer mark stays.
    let layout: String = server.cmd(&["HGET", "wr:{expand}:meta", "layout"]);
    assert_eq!(layout, (LAYOUT_VERSION + 1).to_string());
    assert!(expand.check(&p, T0 + 1).await.unwrap().is_empty());
    assert!(next.check(&p, T0 + 1).await.unwrap().is_empty());
}

/// A room written before layouts were marked (layout 0: the same keys as
/// 1) is read by this build, which marks it.
#[tokio::test]
async fn an_unmarked_room_is_read_and_marked() {
    let (server, store) = start().await;
    let mut p = policy(5, 0);
    p.room = Arc::from("unmarked");
    assert!(is_admitted(
        &store.arrive(&p, vid(1), 0, Arrival::New, T0).await.unwrap()
    ));
    let _: i64 = server.cmd(&["HDEL", "wr:{unmarked}:meta", "layout"]);
    assert_eq!(store.stats(&p, T0 + 1).await.unwrap().active, 1);
    let layout: String = server.cmd(&["HGET", "wr:{unmarked}:meta", "layout"]);
    assert_eq!(layout, waitroom::store::redis::LAYOUT_VERSION.to_string());
}

/// `replica_acks`: a decision no replica acknowledged is "unavailable" (the
/// guard answers with `fail_mode`), and what it wrote still counts; with a
/// replica, decisions go through. `NOREPLICAS` (from
/// `min-replicas-to-write`) is "unavailable" too, not a protocol error.
#[tokio::test]
async fn unacknowledged_decisions_and_noreplicas_are_unavailable() {
    // The replica first: a primary's first replica changes its replication
    // id, which the store would take for a loss (docs/failover.md).
    let (server, replica) = tokio::task::spawn_blocking(|| {
        let server = RedisServer::start();
        let replica = RedisServer::start_replica_of(&server);
        (server, replica)
    })
    .await
    .unwrap();
    let urls = [server.url()];
    let options = Options {
        replica_acks: 1,
        replica_ack_timeout: Duration::from_millis(50),
        ..Options::new(TIMEOUT)
    };
    let acked = RedisStore::open_with(Target::Urls(&urls), options)
        .await
        .unwrap();
    let plain = RedisStore::connect(&urls, TIMEOUT).await.unwrap();
    let p = policy(5, 0);
    assert!(is_admitted(
        &acked
            .arrive(&p, vid(1), 0, Arrival::Known, T0)
            .await
            .unwrap()
    ));

    replica.pause();
    let result = acked.arrive(&p, vid(2), 0, Arrival::Known, T0).await;
    match &result {
        Err(StoreError::Unavailable(why)) => assert!(why.contains("0 of 1 replicas"), "{why}"),
        other => panic!("{other:?}"),
    }
    // Written, so counted: the safe direction.
    assert_eq!(plain.stats(&p, T0).await.unwrap().active, 2);
    replica.resume();

    let _: () = server.cmd(&["CONFIG", "SET", "min-replicas-max-lag", "1"]);
    let _: () = server.cmd(&["CONFIG", "SET", "min-replicas-to-write", "2"]);
    let result = plain.arrive(&p, vid(3), 0, Arrival::Known, T0).await;
    assert!(
        matches!(&result, Err(StoreError::Unavailable(why)) if why == "NOREPLICAS"),
        "{result:?}"
    );
    drop(replica);
}

/// A server that comes back without its data (a restart without
/// persistence; a failover is the same to the store) holds each room it
/// knew closed to newcomers for one check-in interval from the room's next
/// decision, so a session that survives on its ticket is counted again
/// before a newcomer takes its place; then the room is as full as before.
#[tokio::test]
async fn a_lost_history_holds_newcomers_until_the_sessions_checked_in() {
    let mut server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let store = RedisStore::connect(&[server.url()], TIMEOUT).await.unwrap();
    let p = policy(2, 0);
    let mut expiries = Vec::new();
    for i in 1..=2 {
        match store
            .arrive(&p, vid(i), 0, Arrival::Known, T0)
            .await
            .unwrap()
        {
            Verdict::Admitted { session_expires_ms } => expiries.push(session_expires_ms),
            v => panic!("{v:?}"),
        }
    }
    // Both instances' upkeep has marked the room with the history.
    store.upkeep().await;
    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.stats(&p, T0).await.is_err() {
        assert!(Instant::now() < deadline, "never reconnected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The stats call above decided before the upkeep saw the loss; a
    // newcomer now would be admitted (nothing held yet). The upkeep sees it:
    store.upkeep().await;
    let t1 = T0 + 1_000;
    let held = store
        .arrive(&p, vid(10), 0, Arrival::Known, t1)
        .await
        .unwrap();
    assert!(matches!(held, Verdict::Queued(_)), "{held:?}");
    // Within the hold, the lost sessions check in and are counted again.
    let check_in = p.check_in_interval_ms();
    for (i, expiry) in (1..=2).zip(&expiries) {
        let renewed = store.check_in(&p, vid(i), *expiry, t1 + check_in - 1).await;
        assert!(renewed.unwrap().is_some());
    }
    // After it, the room is full: the newcomer waits.
    let after = t1 + check_in + 1;
    assert!(matches!(
        store
            .arrive(&p, vid(11), 0, Arrival::Known, after)
            .await
            .unwrap(),
        Verdict::Queued(_)
    ));
    assert_eq!(store.stats(&p, after).await.unwrap().active, 2);
    drop(server);
}

/// A lost history with one room the upkeep cannot mark (its meta key of
/// another type): the rooms marked before it in the same pass still have
/// the sessions this instance ended sent again, so no ticket of them
/// brings them back. (The pass used to stop at the failing room: the
/// rooms marked before it never had their ends sent again, since the next
/// pass found them marked already, and those after it were never marked.)
#[tokio::test]
async fn rooms_marked_before_one_that_fails_still_get_their_ends_again() {
    let mut server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let store = RedisStore::connect(&[server.url()], TIMEOUT).await.unwrap();
    let room = |name: String| RoomPolicy {
        room: Arc::from(name.as_str()),
        ..policy(2, 0)
    };
    let rooms: Vec<RoomPolicy> = (0..20).map(|i| room(format!("good-{i}"))).collect();
    let mut tickets = Vec::new();
    for p in &rooms {
        let expiry = match store
            .arrive(p, vid(1), 0, Arrival::Known, T0)
            .await
            .unwrap()
        {
            Verdict::Admitted { session_expires_ms } => session_expires_ms,
            v => panic!("{v:?}"),
        };
        // The origin revokes it: ended here, remembered to send again.
        assert!(store
            .end(p, vid(1), End::Session(expiry), T0 + 1)
            .await
            .unwrap());
        tickets.push(expiry);
    }
    let bad = room("bad".into());
    store
        .arrive(&bad, vid(1), 0, Arrival::Known, T0)
        .await
        .unwrap();
    store.upkeep().await;
    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.stats(&bad, T0 + 2).await.is_err() {
        assert!(Instant::now() < deadline, "never reconnected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _: () = server.cmd(&["SET", "wr:{bad}:meta", "not a hash"]);
    store.upkeep().await;
    for (p, expiry) in rooms.iter().zip(&tickets) {
        let back = store.check_in(p, vid(1), *expiry, T0 + 3).await.unwrap();
        assert_eq!(back, None, "{}: the ended session came back", p.room);
    }
    drop(server);
}

/// Issue 38's figure, at production size: 180,000 newcomers queued (a call
/// of 64 each, so the tail holds ~2,800 members), one member among them,
/// then the member's token sent again without its cookie, 20 times: the
/// Redis time of each of those calls (INFO commandstats, fcall's
/// usec_per_call over those calls only). Run by hand:
/// `cargo test --release --test store_redis -- --ignored member_again --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (docs/benchmarks.md), minutes long"]
async fn member_again_redis_time_at_180000_queued() {
    let (server, store) = start().await;
    let store = Arc::new(store);
    let mut p = policy(1, 0);
    p.room = Arc::from("member-cost");
    p.state = RoomState::Paused;
    let member = vid(4242);
    let mut queued = 0u64;
    while queued < 180_000 {
        let calls: Vec<_> = (0..64)
            .map(|i| {
                let (store, p) = (store.clone(), p.clone());
                tokio::spawn(async move {
                    store
                        .arrive(&p, VisitorId::random(), 0, Arrival::New, T0 + i)
                        .await
                        .unwrap()
                })
            })
            .collect();
        for c in calls {
            c.await.unwrap();
        }
        queued += 64;
        if queued == 64 * 1_000 {
            place(
                &store
                    .arrive(&p, member, 0, Arrival::Known, T0 + 1)
                    .await
                    .unwrap(),
            );
        }
    }
    let stat = |server: &RedisServer| -> (u64, u64) {
        let v = server
            .info_field("commandstats", "cmdstat_fcall")
            .unwrap_or_default();
        let field = |name: &str| -> u64 {
            v.split(',')
                .find_map(|kv| kv.strip_prefix(name)?.parse().ok())
                .unwrap_or(0)
        };
        (field("calls="), field("usec="))
    };
    let (calls0, usec0) = stat(&server);
    for round in 0..20 {
        store
            .arrive(&p, member, 0, Arrival::Known, T0 + 10_000 + round)
            .await
            .unwrap();
    }
    let (calls1, usec1) = stat(&server);
    let per_call = (usec1 - usec0) as f64 / (calls1 - calls0) as f64;
    println!(
        "queued {}: member again: {per_call:.1} µs of Redis per call ({} calls)",
        store.stats(&p, T0 + 20_000).await.unwrap().queued,
        calls1 - calls0
    );
}
