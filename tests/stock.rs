//! Capacity that follows the stock, over real HTTP in front of a real
//! origin: the origin's `X-Waitroom-Stock` (stripped, never taken from a
//! visitor) caps the room's sessions at the stock's worth, 0 closes it
//! to newcomers while those inside finish, a restock raises the cap back
//! up to the configured limit; the admin API sets and clears it, and
//! every instance on one Redis follows within one refresh; a room that
//! shows its stock (`show_stock`) tells the people waiting what is left.

#[path = "support/redis_server.rs"]
mod redis_server;
mod support;

use std::time::{Duration, Instant};

use redis_server::RedisServer;
use serde_json::{json, Value};
use support::{from_origin, Harness};
use waitroom::config::{Backend, Config, FailMode, Secret};
use waitroom::domain::RoomState;

const TOKEN: &str = "s3cret-admin-token";

/// A room of ten places, with an admin token.
fn ten(c: &mut Config) {
    c.server.admin_token = Some(Secret(TOKEN.into()));
    c.rooms[0].total_active_users = 10;
    c.rooms[0].abandon_after = Duration::from_secs(600);
}

fn on_redis(server: &RedisServer) -> impl Fn(&mut Config) + '_ {
    move |c: &mut Config| {
        ten(c);
        c.store.backend = Backend::Redis {
            urls: vec![server.url()],
        };
        c.store.fail_mode = FailMode::Closed;
    }
}

/// Waits (polling, bounded: two refreshes) until `done` holds.
async fn until<F: std::future::Future<Output = bool>>(done: impl Fn() -> F) {
    let started = Instant::now();
    while !done().await {
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "not seen in time"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A new visitor's first request: whether the origin answered it.
async fn newcomer(h: &Harness) -> (reqwest::Client, bool) {
    let v = h.visitor();
    let resp = v.get(h.url("/")).send().await.unwrap();
    let passed = from_origin(&resp);
    (v, passed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_origins_stock_caps_the_room_and_never_reaches_the_visitor() {
    let h = Harness::start(ten).await;
    let first = h.visitor();
    let resp = first.get(h.url("/stock?v=3")).send().await.unwrap();
    assert!(from_origin(&resp));
    assert!(
        !resp.headers().contains_key("x-waitroom-stock"),
        "stripped: {:?}",
        resp.headers()
    );
    assert_eq!(h.policy().total_active_users, 3);
    // Two more fit; the fourth waits.
    for _ in 0..2 {
        assert!(newcomer(&h).await.1);
    }
    let (fourth, passed) = newcomer(&h).await;
    assert!(!passed, "the fourth visitor is queued");
    assert_eq!(h.status(&fourth).await["state"], "queued");
    assert_eq!(h.counts().await, (3, 1));

    // A visitor's own X-Waitroom-Stock changes nothing, and never
    // reaches the origin (the echo shows what arrived).
    let resp = first
        .get(h.url("/echo"))
        .header("X-Waitroom-Stock", "1000")
        .header("X_Waitroom_Stock", "1000")
        .send()
        .await
        .unwrap();
    assert!(from_origin(&resp));
    let echo: Value = resp.json().await.unwrap();
    let arrived = echo["headers"].as_object().unwrap();
    assert!(arrived.keys().all(|k| !k.contains("stock")), "{arrived:?}");
    assert_eq!(h.policy().total_active_users, 3);
    assert_eq!(h.room_json("shop").await["stock"], 3);
    // The gauge follows at the next refresh of the room's figures.
    until(|| async {
        h.metrics()
            .await
            .contains("waitroom_room_stock{room=\"shop\"} 3")
    })
    .await;

    // Nonsense is ignored (and stripped, in every spelling).
    for bad in ["-1", "three", "2.5", "1000000001"] {
        let resp = first
            .get(h.url(&format!("/stock?v={bad}&also=1")))
            .send()
            .await
            .unwrap();
        assert!(from_origin(&resp));
        for name in ["x-waitroom-stock", "x_waitroom_stock"] {
            assert!(!resp.headers().contains_key(name), "{bad}: {name} stripped");
        }
        assert_eq!(h.policy().total_active_users, 3, "{bad} ignored");
    }
    // The underscore spelling alone counts for nothing either.
    first.get(h.url("/stock?also=1")).send().await.unwrap();
    assert_eq!(h.policy().total_active_users, 3);

    // Restock: up, but never past the configured limit.
    first.get(h.url("/stock?v=50")).send().await.unwrap();
    assert_eq!(h.policy().total_active_users, 10);
    assert_eq!(h.room_json("shop").await["stock"], 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_stock_is_not_written_again() {
    let h = Harness::start(ten).await;
    let v = h.visitor();
    v.get(h.url("/stock?v=4")).send().await.unwrap();
    let stored = h.store().overrides("shop").await.unwrap().unwrap();
    assert_eq!(stored.stock, Some(4));
    for _ in 0..3 {
        v.get(h.url("/stock?v=4")).send().await.unwrap();
    }
    let again = h.store().overrides("shop").await.unwrap().unwrap();
    assert_eq!(
        again.revision, stored.revision,
        "no write for the same stock"
    );
    v.get(h.url("/stock?v=2")).send().await.unwrap();
    let moved = h.store().overrides("shop").await.unwrap().unwrap();
    assert_eq!(
        (moved.stock, moved.revision),
        (Some(2), stored.revision + 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_zero_closes_to_newcomers_and_holds_the_queue_while_sessions_finish() {
    let h = Harness::start(|c| {
        ten(c);
        c.rooms[0].total_active_users = 2;
    })
    .await;
    let inside = h.visitor();
    assert!(from_origin(
        &inside.get(h.url("/stock?v=1")).send().await.unwrap()
    ));
    let (_, passed) = newcomer(&h).await;
    assert!(!passed, "one item: one session");
    let (waiting, _) = newcomer(&h).await;
    assert_eq!(h.counts().await, (1, 2));

    // Sold: the room admits nobody and promotes nobody...
    assert!(from_origin(
        &inside.get(h.url("/stock?v=0")).send().await.unwrap()
    ));
    assert_eq!(h.policy().state, RoomState::Paused);
    let (late, passed) = newcomer(&h).await;
    assert!(!passed, "a newcomer is not let in");
    assert_eq!(h.status(&late).await["state"], "queued");
    // ...even with places to spare: the queue stays put.
    h.patch_room_ok("shop", json!({"total_active_users": 5}))
        .await;
    let s = h.status(&waiting).await;
    assert_eq!(s["state"], "queued", "{s}");
    assert_eq!(h.counts().await.1, 3, "nobody thrown out of the queue");

    // The visitor inside still gets through.
    assert!(from_origin(
        &inside.get(h.url("/cart")).send().await.unwrap()
    ));

    // A restock lets the queue in, in order.
    h.patch_room_ok("shop", json!({"stock": 5})).await;
    assert_eq!(h.policy().state, RoomState::Open);
    assert_eq!(h.status(&waiting).await["state"], "admitted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_sets_checks_and_clears_the_stock() {
    let h = Harness::start(|c| {
        ten(c);
        // No capacity limit: the stock gives one.
        c.rooms[0].total_active_users = 0;
        c.rooms[0].sessions_per_item = 1.5;
    })
    .await;
    assert_eq!(h.room_json("shop").await["stock"], Value::Null);
    h.patch_room_ok("shop", json!({"stock": 3})).await;
    // ⌈3 × 1.5⌉.
    assert_eq!(h.policy().total_active_users, 5);
    let room = h.room_json("shop").await;
    assert_eq!(
        (room["stock"].clone(), room["total_active_users"].clone()),
        (json!(3), json!(5))
    );

    for (bad, why) in [
        (json!(-1), "-1"),
        (json!(2.5), "2.5"),
        (json!("3"), "\"3\""),
        (json!(1_000_000_001u64), "1000000001"),
    ] {
        let resp = h.patch_room("shop", json!({ "stock": bad })).await;
        assert_eq!(resp.status(), 400);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(
            body["error"],
            format!(
                "stock: expected a whole number from 0 to 1000000000 (items left) or null (not counted), got {why}"
            )
        );
    }
    assert_eq!(h.policy().total_active_users, 5, "refusals change nothing");

    h.patch_room_ok("shop", json!({"stock": null})).await;
    assert_eq!(h.policy().total_active_users, 0);
    assert_eq!(h.room_json("shop").await["stock"], Value::Null);
    until(|| async { !h.metrics().await.contains("waitroom_room_stock{") }).await;
}

/// `show_stock`: while the room counts its stock, a waiting visitor's
/// status JSON carries `stock_left` and the queue page says "N left";
/// without it (the default) neither the JSON nor the page reveals it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stock_left_is_shown_only_in_a_room_that_shows_it() {
    for show in [true, false] {
        let h = Harness::start(|c| {
            ten(c);
            c.rooms[0].total_active_users = 1;
            c.rooms[0].show_stock = show;
        })
        .await;
        assert!(newcomer(&h).await.1);
        let (waiting, passed) = newcomer(&h).await;
        assert!(!passed, "the second visitor waits");
        let s = h.status(&waiting).await;
        assert!(s.get("stock_left").is_none(), "no stock counted: {s}");

        h.patch_room_ok("shop", json!({"stock": 7})).await;
        let s = h.status(&waiting).await;
        assert_eq!(s["state"], "queued", "{s}");
        let page = waiting
            .get(h.url("/"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if show {
            assert_eq!(s["stock_left"], 7, "{s}");
            assert!(
                page.contains(r#"<p id="wr-stock" role="status">7 left</p>"#),
                "{page}"
            );
        } else {
            assert!(s.get("stock_left").is_none(), "{s}");
            assert!(
                page.contains(r#"<p id="wr-stock" role="status" hidden></p>"#),
                "{page}"
            );
            assert!(!page.contains("7 left"), "{page}");
        }
        // The operator's preview shows the page as the people waiting see it.
        let preview = h
            .bare()
            .get(h.admin_url("/api/rooms/shop/preview?state=queued&lang=en"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(preview.contains(">7 left</p>"), show, "{preview}");

        h.patch_room_ok("shop", json!({"stock": 1})).await;
        let s = h.status(&waiting).await;
        assert_eq!(s.get("stock_left"), show.then(|| json!(1)).as_ref(), "{s}");

        h.patch_room_ok("shop", json!({"stock": null})).await;
        let s = h.status(&waiting).await;
        assert!(s.get("stock_left").is_none(), "not counted any more: {s}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stock_set_on_one_instance_caps_the_other_within_a_refresh() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let a = Harness::start(on_redis(&server)).await;
    let b = Harness::start_on(
        on_redis(&server),
        support::origin::Origin::start().await,
        a.clock.clone(),
    )
    .await;
    for _ in 0..2 {
        assert!(newcomer(&b).await.1);
    }
    a.patch_room_ok("shop", json!({"stock": 2})).await;
    assert_eq!(a.policy().total_active_users, 2);
    let started = Instant::now();
    while b.policy().total_active_users != 2 {
        assert!(
            started.elapsed() < Duration::from_millis(1_600),
            "b still at {}",
            b.policy().total_active_users
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(started.elapsed() <= Duration::from_millis(1_200));
    let (_, passed) = newcomer(&b).await;
    assert!(!passed, "b holds the cap: two inside already");
    assert_eq!(b.counts().await, (2, 1));
}
