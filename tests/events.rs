//! Timed drops (docs/how-it-works.md, "Timed drops": events and sold out)
//! through the real daemon on a moved clock: the prequeue admits nobody, the
//! start shuffles it once (the same order on every instance), the event's
//! settings hold until its end, operators manage events at runtime, and the
//! origin can close the room.

#[path = "support/redis_server.rs"]
mod redis_server;
mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use redis_server::RedisServer;
use serde_json::Value;
use support::{from_origin, Harness, T0};
use waitroom::config::{Backend, Config, EventConfig};
use waitroom::store::{EventSpec, Settings};

const SECOND: u64 = 1_000;
const PREQUEUE: u64 = T0 + 60 * SECOND;
const START: u64 = T0 + 120 * SECOND;
const END: u64 = T0 + 600 * SECOND;

fn drop_event(total_active_users: u64) -> EventConfig {
    EventConfig {
        spec: EventSpec {
            name: "drop".into(),
            prequeue_start_ms: Some(PREQUEUE),
            start_ms: START,
            end_ms: END,
            shuffle_at_start: true,
            lanes_only_for_ms: None,
            settings: Settings {
                total_active_users: Some(total_active_users),
                ..Settings::default()
            },
            notice: None,
        },
        template: None,
    }
}

/// A room of 5 with a drop of 20, polled freely from one address.
fn with_drop(c: &mut Config) {
    c.rooms[0].total_active_users = 5;
    c.rooms[0].refresh_interval = Duration::from_secs(1);
    c.rooms[0].abandon_after = Duration::from_secs(600);
    c.rooms[0].events = vec![drop_event(20)];
    c.server.ip_poll_burst = 1_000_000;
    c.server.ip_polls_per_second = 1_000_000;
}

async fn redis() -> RedisServer {
    tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap()
}

fn on(server: &RedisServer) -> impl Fn(&mut Config) + '_ {
    move |c: &mut Config| {
        with_drop(c);
        c.store.backend = Backend::Redis {
            urls: vec![server.url()],
        };
        c.store.timeout = Duration::from_secs(2);
    }
}

fn advance_to(h: &Harness, t: u64) {
    let now = h.clock_now();
    assert!(t >= now);
    h.clock.advance(Duration::from_millis(t - now));
}

async fn state(h: &Harness, v: &reqwest::Client) -> Value {
    h.status(v).await
}

async fn active(h: &Harness) -> u64 {
    h.store()
        .stats(&h.policy(), h.clock_now())
        .await
        .unwrap()
        .active
}

/// The whole drop on one instance: see the module docs.
async fn a_drop(h: &Harness) {
    // Before the prequeue the room is open as usual.
    let early = h.visitor();
    assert!(from_origin(&early.get(h.url("/")).send().await.unwrap()));

    // The prequeue: everyone gets a ticket and the countdown, nobody gets in,
    // though the room has room.
    advance_to(h, PREQUEUE);
    let mut crowd = Vec::new();
    for _ in 0..30 {
        let v = h.visitor();
        let resp = v.get(h.url("/")).send().await.unwrap();
        assert!(!from_origin(&resp));
        let page = resp.text().await.unwrap();
        assert!(page.contains("drop starts at"), "{page}");
        crowd.push(v);
    }
    let s = state(h, &crowd[0]).await;
    assert_eq!(s["state"], "prequeue");
    assert_eq!(s["starts_in_seconds"], 60);
    assert_eq!(s["event"]["name"], "drop");
    assert_eq!(s["event"]["start"], "2027-01-15T08:02:00Z");
    assert_eq!(s["position"], 0, "places are drawn at the start");
    assert_eq!(s["queue_length"], 30);

    // One millisecond before the start: still nobody admitted.
    advance_to(h, START - 1);
    let last = h.visitor();
    assert!(!from_origin(&last.get(h.url("/")).send().await.unwrap()));
    crowd.push(last);
    for v in &crowd[..10] {
        let s = state(h, v).await;
        assert_eq!(s["state"], "prequeue");
        assert_eq!(s["starts_in_seconds"], 1);
    }
    // (The early visitor's session ran out meanwhile.)
    assert_eq!(active(h).await, 0);

    // The start: the event's limit (20) lets 20 of the prequeue in, in the
    // drawn order; a later arrival waits behind the whole prequeue.
    advance_to(h, START);
    for v in &crowd[10..] {
        let s = state(h, v).await;
        assert!(s["state"] == "admitted" || s["state"] == "queued", "{s}");
    }
    advance_to(h, START + 2 * SECOND);
    let late = h.visitor();
    assert!(!from_origin(&late.get(h.url("/")).send().await.unwrap()));
    let mut admitted = BTreeSet::new();
    let mut positions = BTreeSet::new();
    for (i, v) in crowd.iter().enumerate() {
        let s = state(h, v).await;
        match s["state"].as_str().unwrap() {
            "admitted" => {
                admitted.insert(i);
            }
            "queued" => {
                positions.insert(s["position"].as_u64().unwrap());
            }
            other => panic!("{i}: {other}"),
        }
    }
    assert_eq!(admitted.len(), 20, "{admitted:?}");
    assert_eq!(positions, (1..=11).collect(), "the rest in one line");
    assert_ne!(
        admitted,
        (0..20).collect(),
        "the prequeue was let in in arrival order: not shuffled"
    );
    let s = state(h, &late).await;
    assert_eq!(
        (s["state"].as_str(), s["position"].as_u64()),
        (Some("queued"), Some(12))
    );
    assert_eq!(h.policy().total_active_users, 20);

    // The end: the room's own settings are back.
    advance_to(h, END);
    assert_eq!(h.policy().total_active_users, 5);
    let s = state(h, &late).await;
    assert!(s.get("event").is_none(), "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_on_the_memory_store() {
    let h = Harness::start(with_drop).await;
    a_drop(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_on_redis() {
    let server = redis().await;
    let h = Harness::start(on(&server)).await;
    a_drop(&h).await;
}

/// Two instances on one Redis, each asked at the start: the prequeue is
/// shuffled once, and both show every visitor the same place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_draw_one_order() {
    let server = redis().await;
    let a = Harness::start(|c| {
        on(&server)(c);
        c.rooms[0].events = vec![drop_event(5)];
    })
    .await;
    let b = Harness::start(|c| {
        on(&server)(c);
        c.rooms[0].events = vec![drop_event(5)];
    })
    .await;
    let both = |t| {
        advance_to(&a, t);
        advance_to(&b, t);
    };
    both(PREQUEUE);
    let mut crowd = Vec::new();
    for i in 0..40 {
        let v = a.visitor();
        let h = if i % 2 == 0 { &a } else { &b };
        assert!(!from_origin(&v.get(h.url("/")).send().await.unwrap()));
        crowd.push(v);
    }
    both(START);
    // Both instances see the start at once.
    let (x, y) = tokio::join!(state(&a, &crowd[0]), state(&b, &crowd[1]));
    assert_ne!(x["state"], "prequeue");
    assert_ne!(y["state"], "prequeue");
    both(START + 2 * SECOND);
    let mut seen_a = Vec::new();
    for v in &crowd {
        seen_a.push(state(&a, v).await);
    }
    both(START + 4 * SECOND);
    let mut admitted = Vec::new();
    for (i, v) in crowd.iter().enumerate() {
        let on_b = state(&b, v).await;
        assert_eq!(on_b["state"], seen_a[i]["state"], "{i}");
        assert_eq!(on_b["position"], seen_a[i]["position"], "{i}");
        if on_b["state"] == "admitted" {
            admitted.push(i);
        }
    }
    assert_eq!(admitted.len(), 5);
    assert_ne!(admitted, (0..5).collect::<Vec<_>>(), "not shuffled");
    let positions: BTreeSet<u64> = seen_a
        .iter()
        .filter_map(|s| s["position"].as_u64().filter(|&p| p > 0))
        .collect();
    assert_eq!(positions, (1..=35).collect());
}

/// The origin's `X-Waitroom-Command: close` makes the room sold out, for
/// every instance (it is stored) and for the queue: newcomers and queued
/// visitors get the closed page; the origin never sees the header's value
/// reach a visitor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_origin_can_close_the_room() {
    let h = Harness::start(|c| {
        c.rooms[0].total_active_users = 1;
    })
    .await;
    let buyer = h.visitor();
    assert!(from_origin(&buyer.get(h.url("/")).send().await.unwrap()));
    let waiting = h.visitor();
    assert!(!from_origin(&waiting.get(h.url("/")).send().await.unwrap()));

    let resp = buyer.get(h.url("/sold-out")).send().await.unwrap();
    assert!(from_origin(&resp));
    assert!(resp.headers().get("x-waitroom-command").is_none());
    let stored = h.store().overrides("shop").await.unwrap().unwrap();
    assert_eq!(stored.state, Some(waitroom::store::RoomState::Closed));

    h.clock.advance(Duration::from_secs(6));
    assert_eq!(state(&h, &waiting).await["state"], "closed");
    let newcomer = h.bare().get(h.url("/")).send().await.unwrap();
    assert_eq!(newcomer.status(), 503);
    assert!(newcomer.text().await.unwrap().contains("Sold out"));
    // Whoever is inside finishes their purchase.
    assert!(from_origin(
        &buyer.get(h.url("/cart")).send().await.unwrap()
    ));
}

async fn admin(
    h: &Harness,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new().request(method, h.admin_url(path));
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Operators list, add, change and cancel events at runtime; bad ones are
/// refused with a message naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_manage_events_through_the_admin_api() {
    use reqwest::Method;
    let h = Harness::start(|c| {
        c.rooms[0].total_active_users = 5;
        c.rooms[0].refresh_interval = Duration::from_secs(1);
    })
    .await;
    let (code, list) = admin(&h, Method::GET, "/api/rooms/shop/events", None).await;
    assert_eq!((code, list), (200, serde_json::json!([])));

    let event = serde_json::json!({
        "name": "flash",
        "prequeue_start": "2027-01-15T08:01:00Z",
        "start": "2027-01-15T08:02:00Z",
        "end": "2027-01-15T08:30:00Z",
        "total_active_users": 50,
    });
    let (code, list) = admin(
        &h,
        Method::POST,
        "/api/rooms/shop/events",
        Some(event.clone()),
    )
    .await;
    assert_eq!(code, 201, "{list}");
    assert_eq!(list[0]["name"], "flash");
    assert_eq!(list[0]["phase"], "scheduled");
    let (code, err) = admin(&h, Method::POST, "/api/rooms/shop/events", Some(event)).await;
    assert_eq!(code, 400, "{err}");

    // Applied at once: the prequeue holds newcomers.
    h.clock.advance(Duration::from_secs(60));
    let v = h.visitor();
    assert!(!from_origin(&v.get(h.url("/")).send().await.unwrap()));
    assert_eq!(state(&h, &v).await["state"], "prequeue");
    let (_, list) = admin(&h, Method::GET, "/api/rooms/shop", None).await;
    assert_eq!(list["events"][0]["phase"], "prequeue");
    assert_eq!(list["state"], "paused");

    // Changed, then cancelled: the room is itself again.
    let (code, list) = admin(
        &h,
        Method::PATCH,
        "/api/rooms/shop/events/flash",
        Some(serde_json::json!({"total_active_users": 70, "prequeue_start": null})),
    )
    .await;
    assert_eq!(code, 200, "{list}");
    assert_eq!(list[0]["total_active_users"], 70);
    assert_eq!(list[0]["phase"], "scheduled");
    let (code, _) = admin(&h, Method::DELETE, "/api/rooms/shop/events/flash", None).await;
    assert_eq!(code, 200);
    assert_eq!(h.policy().state, waitroom::store::RoomState::Open);
    let (_, list) = admin(&h, Method::GET, "/api/rooms/shop/events", None).await;
    assert_eq!(list, serde_json::json!([]));

    // Refused, naming what is wrong.
    for (body, says) in [
        (
            serde_json::json!({"name": "x", "start": "2027-01-15T09:00:00Z", "end": "2027-01-15T08:00:00Z"}),
            "end",
        ),
        (
            serde_json::json!({"name": "x", "start": "tomorrow", "end": "2027-01-15T08:00:00Z"}),
            "start",
        ),
        (
            serde_json::json!({"name": "Bad Name", "start": "2027-01-15T09:00:00Z", "end": "2027-01-15T10:00:00Z"}),
            "name",
        ),
        (
            serde_json::json!({"name": "x", "start": "2027-01-15T09:00:00Z", "end": "2027-01-15T10:00:00Z", "total_active_users": 0}),
            "total_active_users",
        ),
        (
            serde_json::json!({"name": "x", "start": "2027-01-15T09:00:00Z", "end": "2027-01-15T10:00:00Z", "session_duration": "500000000y"}),
            "session_duration",
        ),
    ] {
        let (code, err) = admin(&h, Method::POST, "/api/rooms/shop/events", Some(body)).await;
        assert_eq!(code, 400, "{err}");
        assert!(err["error"].as_str().unwrap().contains(says), "{err}");
    }
    let ok = serde_json::json!({"name": "a", "start": "2027-01-15T09:00:00Z", "end": "2027-01-15T10:00:00Z"});
    assert_eq!(
        admin(&h, Method::POST, "/api/rooms/shop/events", Some(ok))
            .await
            .0,
        201
    );
    let overlapping = serde_json::json!({"name": "b", "start": "2027-01-15T09:30:00Z", "end": "2027-01-15T11:00:00Z"});
    let (code, err) = admin(
        &h,
        Method::POST,
        "/api/rooms/shop/events",
        Some(overlapping),
    )
    .await;
    assert_eq!(code, 400);
    assert!(err["error"].as_str().unwrap().contains("overlaps"), "{err}");
    assert_eq!(
        admin(&h, Method::DELETE, "/api/rooms/shop/events/nope", None)
            .await
            .0,
        400
    );
}
