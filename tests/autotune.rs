//! `[room.autotune]` over real HTTP in front of a real origin that turns
//! slow or failing on demand: the rate steps down to its floor and back
//! up to its ceiling, one step per interval, never past either; the
//! capacity holds throughout; two instances on one Redis apply one rate
//! and make one move per interval between them.

#[path = "support/redis_server.rs"]
mod redis_server;
mod support;

use std::time::{Duration, Instant};

use support::origin::{Origin, Trouble};
use support::{from_origin, Harness};
use waitroom::config::{AutotuneConfig, Backend, Config};

const INTERVAL: Duration = Duration::from_secs(30);

/// The shop room at 100 a minute and 5 sessions, autotuned between 20
/// and 100 by steps of 20, every 30 s, judged on at least 5 requests;
/// slow means over 50 ms.
fn autotuned(c: &mut Config) {
    let room = &mut c.rooms[0];
    room.new_users_per_minute = 100;
    room.total_active_users = 5;
    room.autotune = Some(AutotuneConfig {
        latency: Duration::from_millis(50),
        slow_share: 0.02,
        error_share: 0.05,
        floor: 20,
        ceiling: 100,
        step: 0.2,
        interval: INTERVAL,
        min_requests: 5,
    });
}

/// `n` requests forwarded for the room (its bypass path needs no
/// ticket), all at once.
async fn forward(h: &Harness, n: usize) {
    let client = h.bare();
    let sent = (0..n).map(|i| client.get(h.url(&format!("/static/{i}"))).send());
    for resp in futures::future::join_all(sent).await {
        assert!(from_origin(&resp.unwrap()));
    }
}

/// New visitors arriving through `/`: the capacity must hold (I1).
async fn arrivals(h: &Harness, n: usize) {
    for _ in 0..n {
        h.visitor().get(h.url("/")).send().await.unwrap();
    }
    let (active, _) = h.counts().await;
    assert!(active <= 5, "{active} sessions in a room of 5");
}

/// Waits (bounded) until the instance applies `rate`: the daemon's own
/// timer may be the upkeep that made the move, a moment after ours.
async fn until_rate(h: &Harness, rate: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = h.policy().new_users_per_minute;
        if now == rate {
            return;
        }
        assert!(Instant::now() < deadline, "rate {now}, expected {rate}");
        h.daemon.gate().refresh_overrides().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One interval later: the upkeep closes the window and decides.
async fn next_interval(h: &Harness) {
    h.clock.advance(INTERVAL);
    h.daemon.gate().refresh_room_figures().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_follows_a_failing_origin_down_and_back_up() {
    let h = Harness::start(autotuned).await;
    // The first upkeep opens the window.
    h.daemon.gate().refresh_room_figures().await;
    assert_eq!(h.room_json("shop").await["autotune"]["rate"], 100);
    assert!(h.room_json("shop").await["autotune"]["last_move"].is_null());

    h.origin.set_trouble(Trouble::Errors);
    for expected in [80, 60, 40, 20, 20, 20] {
        arrivals(&h, 3).await;
        forward(&h, 10).await;
        next_interval(&h).await;
        until_rate(&h, expected).await;
        // Within the same interval nothing moves again (these failures
        // count in the next interval, which fails too).
        if expected == 80 {
            forward(&h, 10).await;
        }
        h.daemon.gate().refresh_room_figures().await;
        assert_eq!(h.policy().new_users_per_minute, expected);
        let shown = h.room_json("shop").await;
        assert_eq!(shown["new_users_per_minute"], expected);
        assert_eq!(shown["autotune"]["rate"], expected);
        assert_eq!(
            shown["autotune"]["last_move"]["reason"],
            "origin errors: 100% of requests failed or answered 5xx"
        );
        assert!(h.metrics().await.contains(&format!(
            "waitroom_room_autotune_rate{{room=\"shop\"}} {expected}"
        )));
    }
    // At the floor no move is stored: the last one is still the one to 20.
    assert_eq!(
        h.room_json("shop").await["autotune"]["last_move"]["rate"],
        20
    );

    h.origin.set_trouble(Trouble::None);
    // Half an interval is not an interval.
    forward(&h, 10).await;
    h.clock.advance(INTERVAL / 2);
    h.daemon.gate().refresh_room_figures().await;
    assert_eq!(h.policy().new_users_per_minute, 20);
    h.clock.advance(INTERVAL / 2);
    h.daemon.gate().refresh_room_figures().await;
    until_rate(&h, 40).await;
    for expected in [60, 80, 100, 100, 100] {
        arrivals(&h, 3).await;
        forward(&h, 10).await;
        next_interval(&h).await;
        until_rate(&h, expected).await;
        let shown = h.room_json("shop").await;
        assert_eq!(shown["autotune"]["last_move"]["reason"], "recovered");
        assert!(shown["active"].as_u64().unwrap() <= 5);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_origin_steps_the_rate_down_and_too_few_requests_hold_it() {
    let h = Harness::start(autotuned).await;
    h.daemon.gate().refresh_room_figures().await;
    h.origin
        .set_trouble(Trouble::Slow(Duration::from_millis(150)));
    forward(&h, 6).await;
    next_interval(&h).await;
    until_rate(&h, 80).await;
    assert_eq!(
        h.room_json("shop").await["autotune"]["last_move"]["reason"],
        "origin slow: 100% of requests over 50ms"
    );
    // Four requests are fewer than min_requests: nothing to judge by.
    forward(&h, 4).await;
    next_interval(&h).await;
    h.daemon.gate().refresh_room_figures().await;
    assert_eq!(h.policy().new_users_per_minute, 80);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_on_one_redis_apply_one_rate_and_one_move_per_interval() {
    let server = tokio::task::spawn_blocking(redis_server::RedisServer::start)
        .await
        .unwrap();
    let on = |c: &mut Config| {
        autotuned(c);
        c.store.backend = Backend::Redis {
            urls: vec![server.url()],
        };
        c.store.timeout = Duration::from_millis(500);
    };
    let a = Harness::start(on).await;
    let b = Harness::start_on(on, Origin::start().await, a.clock.clone()).await;
    for h in [&a, &b] {
        h.daemon.gate().refresh_room_figures().await;
        h.origin.set_trouble(Trouble::Errors);
    }
    // Both see a failing origin; each closes its window in the interval,
    // the first one to move wins and the other holds.
    let mut expected = 100;
    for first in [&a, &b, &a] {
        let second = if std::ptr::eq(first, &a) { &b } else { &a };
        forward(&a, 10).await;
        forward(&b, 10).await;
        a.clock.advance(INTERVAL);
        first.daemon.gate().refresh_room_figures().await;
        second.daemon.gate().refresh_room_figures().await;
        expected -= 20;
        for h in [&a, &b] {
            until_rate(h, expected).await;
        }
        // Nothing more moved: both apply one rate, one step down.
        for h in [&a, &b] {
            h.daemon.gate().refresh_overrides().await;
            assert_eq!(h.policy().new_users_per_minute, expected);
            assert_eq!(
                h.room_json("shop").await["autotune"]["last_move"]["rate"],
                expected
            );
            let (active, _) = h.counts().await;
            assert!(active <= 5);
        }
    }
}
