//! Region mode end to end: two `waitroom` daemons, each in its own region
//! (its own regional redis-server) and one global redis-server, real HTTP
//! visitors to both. Capacity holds across the two, visitors beyond it
//! queue and go in when sessions end (the tests' clock moves), and each
//! daemon's background sync runs (its grant on `/metrics`).
//!
//! The sync task runs on the tests' clock (every `sync_interval` of it, 50 ms
//! here): the test moves the clock one interval and waits for each daemon's
//! round at that time to finish (`Region::rounds`), never a fixed sleep.

#[path = "support/redis_server.rs"]
mod redis_server;
mod support;

use std::time::Duration;

use redis_server::RedisServer;
use support::{from_origin, origin::Origin, Harness};
use waitroom::clock::{Clock, ManualClock};
use waitroom::config::{Backend, Config, RegionConfig};

const LIMIT: u64 = 4;
const SESSION: Duration = Duration::from_secs(60);
const DEADLINE: Duration = Duration::from_secs(20);
const SYNC: Duration = Duration::from_millis(50);

async fn redis() -> RedisServer {
    tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap()
}

fn in_region<'a>(
    name: &'a str,
    regional: &'a RedisServer,
    global: &'a RedisServer,
) -> impl FnOnce(&mut Config) + 'a {
    move |c: &mut Config| {
        c.store.backend = Backend::Redis {
            urls: vec![regional.url()],
        };
        c.store.timeout = Duration::from_millis(500);
        // The test polls while it waits for the syncs.
        c.server.ip_polls_per_second = 100_000;
        c.server.ip_poll_burst = 100_000;
        c.region = Some(RegionConfig {
            name: name.into(),
            global_url: global.url(),
            sync_interval: SYNC,
        });
        let room = &mut c.rooms[0];
        room.total_active_users = LIMIT;
        room.session_duration = SESSION;
        room.session_renewal = false;
        room.abandon_after = Duration::from_secs(600);
    }
}

/// The value of the region grant gauge for room "shop", once a sync set it.
fn grant_of(metrics: &str) -> Option<u64> {
    metrics
        .lines()
        .find(|l| l.starts_with("waitroom_region_grant{") && l.contains("room=\"shop\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Waits until every daemon's region finished a sync round at `at` (or
/// later) on the tests' clock, with a deadline.
async fn synced(daemons: &[&Harness], at: u64) {
    for h in daemons {
        let mut rounds = h.daemon.region().expect("region mode").rounds();
        tokio::time::timeout(DEADLINE, rounds.wait_for(|t| *t >= at))
            .await
            .expect("a sync round in time")
            .expect("the sync task runs");
    }
}

/// Until `check` holds: between tries the clock moves one sync interval and
/// every daemon finishes the sync round that brings (at most 40 rounds).
async fn until<F, Fut>(what: &str, clock: &ManualClock, daemons: &[&Harness], mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..40 {
        if check().await {
            return;
        }
        clock.advance(SYNC);
        synced(daemons, clock.now_ms()).await;
    }
    panic!("{what}: not after 40 sync rounds");
}

/// Active sessions across both regional stores (each daemon's own view).
async fn active(daemons: &[&Harness]) -> u64 {
    let mut n = 0;
    for h in daemons {
        n += h
            .store()
            .stats(&h.policy(), h.clock_now())
            .await
            .unwrap()
            .active;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_regions_share_the_capacity_and_admit_the_queue_as_sessions_end() {
    let global = redis().await;
    let (eu, us) = (redis().await, redis().await);
    let a = Harness::start(in_region("eu", &eu, &global)).await;
    // The second daemon on the same clock (one "now" for both regions).
    let b = Harness::start_on(
        in_region("us", &us, &global),
        Origin::start().await,
        a.clock.clone(),
    )
    .await;
    let both = [&a, &b];

    // The sync task runs in each daemon: its grant is on /metrics.
    // Each daemon's first round runs at start-up, on the clock as it stands.
    synced(&both, a.clock_now()).await;
    for h in both {
        assert!(grant_of(&h.metrics().await).is_some());
    }

    // Six visitors, alternating between the regions, against a limit of 4.
    let mut admitted = Vec::new();
    let mut queued = Vec::new();
    for i in 0..6 {
        let h = both[i % 2];
        let v = h.visitor();
        let resp = v.get(h.url("/")).send().await.unwrap();
        if from_origin(&resp) {
            admitted.push((i % 2, v));
        } else {
            assert_eq!(h.status(&v).await["state"], "queued", "visitor {i}");
            queued.push((i % 2, v));
        }
        let n = active(&both).await;
        assert!(n <= LIMIT, "{n} sessions across regions, limit {LIMIT}");
    }
    assert!(!queued.is_empty());
    assert!(
        admitted.len() as u64 <= LIMIT,
        "{} admitted",
        admitted.len()
    );
    // The room fills across both regions: a visitor queued while the other
    // region had room goes in once the syncs move the slot.
    // (The waits watch the regional stores, not the visitors' polls: polls
    // are limited per visitor on the tests' clock, which stands still.)
    until("the room to fill", &a.clock, &both, || async {
        active(&both).await == LIMIT
    })
    .await;
    let mut still = Vec::new();
    for (r, v) in queued {
        if both[r].status(&v).await["state"] == "admitted" {
            admitted.push((r, v));
        } else {
            still.push((r, v));
        }
    }
    assert_eq!(admitted.len() as u64, LIMIT);
    assert_eq!(still.len(), 2, "two visitors wait beyond the limit");
    for (r, v) in &admitted {
        let resp = v.get(both[*r].url("/")).send().await.unwrap();
        assert!(from_origin(&resp), "an admitted visitor is forwarded");
    }

    // Halfway through the sessions nobody else goes in.
    a.clock.advance(SESSION / 2);
    for (r, v) in &still {
        assert_eq!(both[*r].status(v).await["state"], "queued");
    }
    assert_eq!(active(&both).await, LIMIT);

    // The sessions end: the two waiting visitors go in, in whichever region.
    a.clock.advance(SESSION);
    until(
        "the waiting visitors' admission",
        &a.clock,
        &both,
        || async {
            let n = active(&both).await;
            assert!(n <= LIMIT, "{n} sessions across regions, limit {LIMIT}");
            n == 2
        },
    )
    .await;
    for (r, v) in &still {
        assert_eq!(both[*r].status(v).await["state"], "admitted");
        let resp = v.get(both[*r].url("/")).send().await.unwrap();
        assert!(from_origin(&resp), "admitted visitor forwarded");
    }
    assert!(active(&both).await <= LIMIT);
    for h in both {
        let m = h.metrics().await;
        assert!(grant_of(&m).is_some(), "{m}");
        assert!(m.contains("waitroom_region_degraded 0"), "{m}");
    }
}
