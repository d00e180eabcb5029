//! Poll limits over real HTTP: a reload storm gets 429 with Retry-After, and
//! the visitor keeps their place.

mod support;

use std::time::Duration;

use support::{from_origin, Harness};

async fn queued_visitors(h: &Harness, n: usize) -> Vec<reqwest::Client> {
    let mut out = Vec::new();
    for _ in 0..n {
        let v = h.visitor();
        assert!(!from_origin(&v.get(h.url("/")).send().await.unwrap()));
        out.push(v);
    }
    out
}

async fn poll(h: &Harness, v: &reqwest::Client) -> reqwest::Response {
    v.get(h.url("/__waitroom/status?room=shop"))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_visitor_polling_too_often_gets_429_and_keeps_the_place() {
    // Paused: everyone queues. refresh 8 s -> after a burst of 5, one poll per 2 s.
    let h = Harness::start(|c| {
        c.rooms[0].state = waitroom::store::RoomState::Paused;
        c.rooms[0].refresh_interval = Duration::from_secs(8);
    })
    .await;
    let vs = queued_visitors(&h, 2).await;
    // A burst of five polls, then one per 2 s.
    for _ in 0..5 {
        assert_eq!(poll(&h, &vs[1]).await.status(), 200);
    }
    let limited = poll(&h, &vs[1]).await;
    assert_eq!(limited.status(), 429);
    assert_eq!(limited.headers()["retry-after"], "2");
    let body: serde_json::Value = limited.json().await.unwrap();
    assert_eq!(body["state"], "queued");

    // A browser reloading the page gets the 429 page, not the queue page.
    let page = vs[1].get(h.url("/")).send().await.unwrap();
    assert_eq!(page.status(), 429);
    assert!(page.headers().contains_key("retry-after"));
    assert!(page.text().await.unwrap().contains("You keep your place"));

    // Others are unaffected, and after the wait the place is unchanged.
    assert_eq!(poll(&h, &vs[0]).await.status(), 200);
    h.clock.advance(Duration::from_secs(2));
    let s: serde_json::Value = poll(&h, &vs[1]).await.json().await.unwrap();
    assert_eq!(
        (s["state"].as_str(), s["position"].as_u64()),
        (Some("queued"), Some(2))
    );
}

#[tokio::test]
async fn one_address_polling_for_many_visitors_is_limited_too() {
    let h = Harness::start(|c| {
        c.rooms[0].state = waitroom::store::RoomState::Paused;
        c.server.ip_poll_burst = 3;
        c.server.ip_polls_per_second = 1;
    })
    .await;
    // Arrivals are not polls: all four get their places.
    let vs = queued_visitors(&h, 4).await;
    for v in &vs[..3] {
        assert_eq!(poll(&h, v).await.status(), 200);
    }
    let limited = poll(&h, &vs[3]).await;
    assert_eq!(limited.status(), 429);
    assert_eq!(limited.headers()["retry-after"], "1");
    h.clock.advance(Duration::from_secs(1));
    let s: serde_json::Value = poll(&h, &vs[3]).await.json().await.unwrap();
    assert_eq!(s["position"], 4);
}

#[tokio::test]
async fn admitted_visitors_are_never_poll_limited() {
    let h = Harness::start(|c| c.server.ip_poll_burst = 1).await;
    let v = h.visitor();
    for _ in 0..20 {
        assert!(from_origin(&v.get(h.url("/")).send().await.unwrap()));
    }
}
