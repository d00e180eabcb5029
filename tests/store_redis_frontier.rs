//! The queue descriptions (`store/redis/frontier.rs`) on a real Redis:
//! polls answered without a script keep every invariant. Nobody is told
//! "queued" who is already admitted, nobody earlier is told "queued" after
//! someone later was told "admitted", positions stay within the sampling
//! bound, answered polls keep visitors from being abandoned, and released
//! places, resets, a lost queue and another instance's rate change are all
//! seen at once.

#[path = "support/redis_server.rs"]
mod redis_server;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use redis_server::RedisServer;
use waitroom::clock::Millis;
use waitroom::store::redis::RedisStore;
use waitroom::store::{
    Arrival, End, Maintenance, QueuePlace, QueueingMethod, RoomOverrides, RoomPolicy, RoomState,
    Store, Verdict, VisitorId,
};

const T0: Millis = 1_800_000_000_000;
const SECOND: Millis = 1_000;

fn room(name: &str) -> RoomPolicy {
    RoomPolicy {
        room: Arc::from(name),
        total_active_users: 50,
        new_users_per_minute: 60,
        session_duration_ms: 30 * SECOND,
        session_renewal: false,
        method: QueueingMethod::Fifo,
        max_queue_length: 0,
        abandon_after_ms: 120 * SECOND,
        arrival_grace_ms: 40 * SECOND,
        state: RoomState::Open,
        revision: 0,
        lanes: Default::default(),
    }
}

async fn start() -> (RedisServer, RedisStore) {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let store = RedisStore::connect(&[server.url()], Duration::from_secs(5))
        .await
        .unwrap();
    store.set_frontier_min_queue(500);
    (server, store)
}

/// `n` visitors behind a full room, all arriving at `at`.
async fn fill(store: &RedisStore, p: &RoomPolicy, n: usize, at: Millis) -> Vec<(VisitorId, u64)> {
    let mut queued = Vec::new();
    for _ in 0..n {
        let v = VisitorId::random();
        if let Verdict::Queued(place) = store.arrive(p, v, 0, Arrival::Known, at).await.unwrap() {
            queued.push((v, place.seq));
        }
    }
    queued
}

fn exact_rank(server: &RedisServer, room: &str, v: VisitorId) -> Option<u64> {
    server.cmd(&["ZRANK", &format!("wr:{{{room}}}:queue"), &v.to_hex()])
}

fn in_session(server: &RedisServer, room: &str, v: VisitorId) -> bool {
    server
        .cmd::<Option<String>>(&["ZSCORE", &format!("wr:{{{room}}}:sessions"), &v.to_hex()])
        .is_some()
}

fn scripts_run(server: &RedisServer) -> u64 {
    server
        .info_field("commandstats", "cmdstat_fcall")
        .and_then(|v| v.split(',').next()?.strip_prefix("calls=")?.parse().ok())
        .unwrap_or(0)
}

/// Polls until the store has installed a description made at `at` (the
/// refresh runs in the background; the first poll at a new time starts it).
async fn described(store: &RedisStore, p: &RoomPolicy, probe: (VisitorId, u64), at: Millis) {
    for _ in 0..200 {
        if let Ok(Verdict::Queued(_)) = store.poll(p, probe.0, 0, probe.1, at).await {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if store.frontier_made(&p.room) == Some(at) {
            return;
        }
    }
    panic!("no description made at {at}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_without_a_script_never_hide_an_admission_or_reorder_the_queue() {
    let (server, store) = start().await;
    let p = room("walk");
    for _ in 0..50 {
        assert!(matches!(
            store
                .arrive(&p, VisitorId::random(), 0, Arrival::Known, T0)
                .await
                .unwrap(),
            Verdict::Admitted { .. }
        ));
    }
    let queued = fill(&store, &p, 1_500, T0).await;
    let mut rng = StdRng::seed_from_u64(11);
    // seq -> (visitor, last poll), for those still waiting (as far as they know).
    let mut waiting: BTreeMap<u64, (VisitorId, Millis)> =
        queued.iter().map(|(v, s)| (*s, (*v, T0))).collect();
    let (mut cached, mut total, mut admitted) = (0u64, 0u64, 0u64);
    let mut now = T0;
    while now < T0 + 180 * SECOND && !waiting.is_empty() {
        now += rng.gen_range(100..1_500);
        // Whoever has not polled for abandon_after holds an expired ticket:
        // the gate would make them a newcomer, so they stop polling here.
        waiting.retain(|_, (_, last)| now - *last <= p.abandon_after_ms);
        // Half the polls near the front, half anywhere.
        let seqs: Vec<u64> = waiting.keys().copied().collect();
        let mut batch: Vec<u64> = seqs.iter().take(80).copied().collect();
        batch.extend(seqs.choose_multiple(&mut rng, 80).copied());
        batch.sort_unstable();
        batch.dedup();
        for seq in batch {
            let Some(&(v, _)) = waiting.get(&seq) else {
                continue;
            };
            waiting.insert(seq, (v, now));
            let before = scripts_run(&server);
            let verdict = store.poll(&p, v, 0, seq, now).await.unwrap();
            total += 1;
            match verdict {
                Verdict::Queued(QueuePlace { position, .. }) => {
                    // Told "queued": not admitted in Redis.
                    assert!(!in_session(&server, "walk", v), "a hidden admission");
                    if scripts_run(&server) == before {
                        cached += 1;
                        let exact = exact_rank(&server, "walk", v).expect("still queued") + 1;
                        // Sampling (1/64 of the distance from the frontier)
                        // and staleness (at most a frontier's worth of
                        // admissions since the description was made).
                        let frontier_distance = exact.saturating_sub(60);
                        let allowed = frontier_distance / 64 + 2 + 61;
                        assert!(
                            position.abs_diff(exact) <= allowed,
                            "position {position}, exact {exact}"
                        );
                    }
                }
                Verdict::Admitted { .. } => {
                    admitted += 1;
                    waiting.remove(&seq);
                    // Nobody earlier is still told "queued" at the same time.
                    let earlier: Vec<(u64, VisitorId)> =
                        waiting.range(..seq).map(|(s, (v, _))| (*s, *v)).collect();
                    for (s, e) in earlier {
                        let v = store.poll(&p, e, 0, s, now).await.unwrap();
                        assert!(matches!(v, Verdict::Admitted { .. }), "an inversion: {v:?}");
                        waiting.remove(&s);
                        admitted += 1;
                    }
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        let _ = store.stats(&p, now).await.unwrap();
    }
    assert!(admitted > 100, "the queue moved: {admitted}");
    assert!(
        cached > total / 3,
        "most polls went without a script: {cached} of {total}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polls_answered_without_a_script_keep_a_visitor_from_being_abandoned() {
    let (server, store) = start().await;
    let mut p = room("alive");
    p.state = RoomState::Paused;
    let queued = fill(&store, &p, 1_000, T0).await;
    // 700 visitors poll every 20 s for five minutes; the first 300 never do.
    let (quitters, keen) = queued.split_at(300);
    let mut now = T0;
    let mut answered_without_script = 0;
    for _ in 0..15 {
        now += 20 * SECOND;
        // A description of the queue now (made by a first poll).
        described(&store, &p, keen[keen.len() - 1], now).await;
        for &(v, seq) in keen {
            let before = scripts_run(&server);
            let verdict = store.poll(&p, v, 0, seq, now).await.unwrap();
            assert!(matches!(verdict, Verdict::Queued(_)), "{verdict:?}");
            answered_without_script += usize::from(scripts_run(&server) == before);
        }
        // The polls are written with the next refresh or flush.
        store.flush(&p, now).await;
        let _ = store.stats(&p, now).await.unwrap();
    }
    for &(v, _) in keen {
        assert!(
            exact_rank(&server, "alive", v).is_some(),
            "a polling visitor was dropped"
        );
    }
    for &(v, _) in quitters {
        assert!(
            exact_rank(&server, "alive", v).is_none(),
            "a quitter kept its place"
        );
    }
    assert!(
        answered_without_script > 15 * 600,
        "{answered_without_script} of {} polls without a script",
        15 * keen.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_places_resets_and_lost_queues_are_seen_at_once() {
    let (server, store) = start().await;
    let mut p = room("ended");
    p.state = RoomState::Paused;
    let queued = fill(&store, &p, 1_000, T0).await;
    let (a, b) = (queued[800], queued[900]);
    let at = T0 + SECOND;
    described(&store, &p, a, at).await;
    assert!(matches!(
        store.poll(&p, b.0, 0, b.1, at).await.unwrap(),
        Verdict::Queued(_)
    ));

    // Released on another instance: this one's next description lists it.
    let other = RedisStore::connect(&[server.url()], Duration::from_secs(5))
        .await
        .unwrap();
    assert!(other.end(&p, b.0, End::Release, at).await.unwrap());
    let later = at + 300;
    described(&store, &p, a, later).await;
    assert_eq!(
        store.poll(&p, b.0, 0, b.1, later).await.unwrap(),
        Verdict::Ended
    );

    // A reset through this instance: every old ticket is ended at once.
    store.reset(&p, later).await.unwrap();
    assert_eq!(
        store.poll(&p, a.0, 0, a.1, later).await.unwrap(),
        Verdict::Ended
    );

    // A lost queue (FLUSHALL): tickets put their places back (I5).
    let queued = fill(&store, &p, 1_000, later).await;
    let c = queued[700];
    let at = later + SECOND;
    described(&store, &p, c, at).await;
    let _: () = server.cmd(&["FLUSHALL"]);
    let after = at + 300;
    for _ in 0..50 {
        let _ = store.poll(&p, c.0, 0, c.1, after).await;
        if exact_rank(&server, "ended", c.0).is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        exact_rank(&server, "ended", c.0),
        Some(0),
        "put back at its place"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_raised_elsewhere_is_read_before_deciding_and_widens_the_frontier() {
    let (server, store) = start().await;
    let mut p = room("raised");
    p.state = RoomState::Paused;
    let queued = fill(&store, &p, 2_000, T0).await;
    let near = queued[200];
    let at = T0 + SECOND;
    described(&store, &p, near, at).await;
    let before = scripts_run(&server);
    store.poll(&p, near.0, 0, near.1, at).await.unwrap();
    assert_eq!(
        scripts_run(&server),
        before,
        "rank 200 is beyond a frontier of 60"
    );

    // An operator raises the rate; another instance applies it at once.
    let change = RoomOverrides {
        settings: waitroom::store::Settings {
            new_users_per_minute: Some(1_000),
            ..Default::default()
        },
        config_fingerprint: 1,
        revision: 1,
        ..RoomOverrides::default()
    };
    store.set_overrides("raised", Some(&change)).await.unwrap();
    // This instance, still on the old rate, decides nothing: a script
    // refuses its policy as stale, so it reads the change (the gate's
    // guard does) and asks again.
    let far = queued[1_900];
    assert!(matches!(
        store.poll(&p, far.0, 0, far.1, at + 2_000).await,
        Err(waitroom::store::StoreError::Stale(1))
    ));
    // Read, the change widens its frontier.
    p.new_users_per_minute = 1_000;
    p.revision = 1;
    let later = at + 2_300;
    described(&store, &p, queued[1_500], later).await;
    let before = scripts_run(&server);
    store.poll(&p, near.0, 0, near.1, later).await.unwrap();
    assert_eq!(
        scripts_run(&server),
        before + 1,
        "now inside the frontier: a script"
    );
}

/// A frontier that falls in the tail of a long queue (lua/lib/tail.lua),
/// where ranks still count visitors who left it: the description
/// moves the places up to it into `queue` first, so that nobody its
/// admissions will reach is answered "queued" without a script. Here 600
/// released places sit just behind the head when the rate window is about
/// to free 3,000 admissions. (Sampled in the tail, the frontier sat 600
/// places too far forward, and the visitor at rank 2,900 was answered from
/// the description.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frontier_in_the_tail_is_counted_without_who_left() {
    let (server, store) = start().await;
    let mut p = room("long");
    p.total_active_users = 0;
    p.new_users_per_minute = 3_000;
    let mut queued = Vec::new();
    for _ in 0..(11_000 / 64 + 1) {
        let calls = (0..64).map(|_| {
            let (store, p) = (&store, &p);
            async move {
                let v = VisitorId::random();
                (v, store.arrive(p, v, 0, Arrival::New, T0).await.unwrap())
            }
        });
        for (v, verdict) in futures::future::join_all(calls).await {
            if let Verdict::Queued(place) = verdict {
                queued.push((v, place.seq));
            }
        }
    }
    queued.sort_by_key(|&(_, seq)| seq);
    let tail: u64 = server.cmd(&["ZCARD", "wr:{long}:tail"]);
    assert!(queued.len() > 7_000 && tail > 0, "{} queued", queued.len());
    for &(v, _) in &queued[2_000..2_600] {
        assert!(store.end(&p, v, End::Release, T0 + SECOND).await.unwrap());
    }
    // The admissions at T0 leave the window at T0 + 60 s: descriptions made
    // just before count them as free places ahead (the bound is 3,000).
    let probe = *queued.last().unwrap();
    for at in [T0 + 59_300, T0 + 59_500, T0 + 59_700, T0 + 59_900] {
        described(&store, &p, probe, at).await;
    }
    // Rank 2,900, 150 ms later (no refresh due, so a script that runs is
    // this poll's).
    let (v, seq) = queued[600 + 2_900];
    let before = scripts_run(&server);
    let verdict = store.poll(&p, v, 0, seq, T0 + 60_050).await.unwrap();
    assert!(
        !matches!(verdict, Verdict::Queued(_)) || scripts_run(&server) > before,
        "answered from the description: {verdict:?}"
    );
}
