//! `room.end_session_paths`: the origin's 2xx on such a path ends the
//! admitted visitor's session as its `X-Waitroom-Command: revoke` would
//! (the place is free at once, the cookie expired); any other answer keeps
//! it; every spelling of the path that the room's own matching treats as
//! the same path counts; decision mode ends it once the request is let in.

mod support;

use support::raw::{exchange, RawResponse};
use support::{from_origin, set_cookie, Harness};

const COOKIE: &str = "waitroom_shop";

/// A room of one place on `/` that ends sessions on `/order/complete`
/// (and on `/static/done`, under a bypass path); decision mode answers
/// loopback.
async fn shop() -> Harness {
    Harness::start(|c| {
        c.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        let room = &mut c.rooms[0];
        room.total_active_users = 1;
        room.end_session_paths = vec!["/order/complete".into(), "/static/done".into()];
    })
    .await
}

/// A visitor let in (the room must have a place): its client and ticket.
async fn admitted(h: &Harness) -> (reqwest::Client, String) {
    let v = h.visitor();
    let resp = v.get(h.url("/")).send().await.unwrap();
    assert!(from_origin(&resp), "let in");
    let ticket = set_cookie(&resp, COOKIE).expect("a ticket");
    (v, ticket)
}

/// `GET target` as written, with `ticket` as the room's cookie.
async fn raw_get(h: &Harness, target: &str, ticket: &str) -> RawResponse {
    let req = format!(
        "GET {target} HTTP/1.1\r\nHost: shop.example\r\nCookie: {COOKIE}={ticket}\r\nConnection: close\r\n\r\n"
    );
    exchange(h.daemon.addr, req.as_bytes()).await
}

/// Whether a response expires the room's cookie.
fn expires_cookie(set_cookie: Option<&str>) -> bool {
    set_cookie.is_some_and(|c| c.starts_with(&format!("{COOKIE}=;")) && c.contains("Max-Age=0"))
}

fn revoked(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("waitroom_decisions_total{room=\"shop\",outcome=\"revoked\"} ")
        })
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test]
async fn a_2xx_on_an_end_path_frees_the_place_at_once() {
    let h = shop().await;
    let (a, ticket) = admitted(&h).await;
    let b = h.visitor();
    assert!(!from_origin(&b.get(h.url("/")).send().await.unwrap()));
    assert_eq!(h.status(&b).await["state"], "queued");

    let done = a.get(h.url("/order/complete")).send().await.unwrap();
    assert_eq!(done.status(), 200);
    assert!(from_origin(&done));
    let cleared = done.headers()["set-cookie"].to_str().unwrap();
    assert!(expires_cookie(Some(cleared)), "{cleared}");
    assert_eq!(revoked(&h.metrics().await), 1);

    // The place was freed at once: B's next poll gets it.
    assert_eq!(h.status(&b).await["state"], "admitted");
    // A is a newcomer again (queued: B holds the place), with or without
    // the old ticket.
    assert!(!from_origin(&a.get(h.url("/")).send().await.unwrap()));
    let old = h
        .bare()
        .get(h.url("/"))
        .header("cookie", format!("{COOKIE}={ticket}"))
        .send()
        .await
        .unwrap();
    assert!(!from_origin(&old), "the ended ticket lets nobody in");
}

#[tokio::test]
async fn any_other_answer_on_an_end_path_keeps_the_session() {
    let h = shop().await;
    let (a, _) = admitted(&h).await;
    let b = h.visitor();
    assert!(!from_origin(&b.get(h.url("/")).send().await.unwrap()));
    for status in [302, 402, 404, 500, 503] {
        let resp = a
            .get(h.url(&format!("/order/complete?answer={status}")))
            .send()
            .await
            .unwrap();
        assert!(from_origin(&resp));
        assert_eq!(resp.status(), status);
        let cookie = resp
            .headers()
            .get("set-cookie")
            .map(|c| c.to_str().unwrap());
        assert!(!expires_cookie(cookie), "{status}: {cookie:?}");
        assert_eq!(h.counts().await, (1, 1), "{status}: A keeps the place");
    }
    assert!(from_origin(&a.get(h.url("/")).send().await.unwrap()));
    assert_eq!(h.status(&b).await["state"], "queued");
    assert_eq!(revoked(&h.metrics().await), 0);
}

#[tokio::test]
async fn every_spelling_of_an_end_path_ends_the_session() {
    let h = shop().await;
    for target in [
        "/order/complete",
        "/order/complete?x=1",
        "/order/%63omplete",
        "/%6f%72%64%65%72/complete",
        "//order/complete",
        "/order//complete",
        "/order/./complete",
        "/x/../order/complete",
        "/order/complete/",
        "/order/complete/receipt",
        "/order/complete;jsessionid=1",
        "/order/complete.",
    ] {
        let (_, ticket) = admitted(&h).await;
        let resp = raw_get(&h, target, &ticket).await;
        assert!(resp.answered_by_origin(), "{target}: {resp:?}");
        assert_eq!(resp.status, 200, "{target}");
        assert!(
            expires_cookie(resp.header("set-cookie")),
            "{target}: {resp:?}"
        );
        assert_eq!(h.counts().await, (0, 0), "{target}: the place is free");
    }
}

#[tokio::test]
async fn paths_that_only_look_alike_keep_the_session() {
    let h = shop().await;
    let (_, ticket) = admitted(&h).await;
    for target in [
        // Paths cover whole segments, as a room's `path` does.
        "/order/completed-not",
        "/order/completex",
        "/order",
        "/order/",
        // Case counts unless `case_insensitive_paths`.
        "/ORDER/COMPLETE",
        "/Order/complete",
        // The query is no path.
        "/order?next=/order/complete",
        "/?p=%2Forder%2Fcomplete",
        // Under a bypass path: forwarded without looking at the ticket.
        "/static/done",
    ] {
        let resp = raw_get(&h, target, &ticket).await;
        assert!(resp.answered_by_origin(), "{target}: {resp:?}");
        assert!(
            !expires_cookie(resp.header("set-cookie")),
            "{target}: {resp:?}"
        );
        assert_eq!(h.counts().await, (1, 0), "{target}: the session stands");
    }
    assert_eq!(revoked(&h.metrics().await), 0);
}

#[tokio::test]
async fn case_insensitive_rooms_end_on_any_case() {
    let h = Harness::start(|c| {
        let room = &mut c.rooms[0];
        room.total_active_users = 1;
        room.case_insensitive_paths = true;
        room.end_session_paths = vec!["/order/complete".into()];
    })
    .await;
    let (_, ticket) = admitted(&h).await;
    let resp = raw_get(&h, "/Order/COMPLETE", &ticket).await;
    assert!(expires_cookie(resp.header("set-cookie")), "{resp:?}");
    assert_eq!(h.counts().await, (0, 0));
}

#[tokio::test]
async fn a_visitor_without_a_session_changes_nothing() {
    let h = shop().await;
    let (a, _) = admitted(&h).await;
    // A newcomer while the room is full is queued, not forwarded: A's
    // session and the queue stand.
    let c = h.visitor();
    let resp = c.get(h.url("/order/complete")).send().await.unwrap();
    assert!(!from_origin(&resp));
    assert_eq!(h.counts().await, (1, 1));
    assert!(from_origin(&a.get(h.url("/")).send().await.unwrap()));
    assert_eq!(revoked(&h.metrics().await), 0);
}

/// The decision as the shipped nginx snippet asks for it.
async fn decide(h: &Harness, uri: &str, ticket: &str) -> RawResponse {
    let req = format!(
        "GET /__waitroom/auth HTTP/1.1\r\nHost: shop.example\r\nCookie: {COOKIE}={ticket}\r\nX-Original-Method: GET\r\nX-Original-URI: {uri}\r\nConnection: close\r\n\r\n"
    );
    exchange(h.daemon.addr, req.as_bytes()).await
}

#[tokio::test]
async fn decision_mode_lets_the_end_path_in_once_then_the_session_is_gone() {
    let h = shop().await;
    let (_, ticket) = admitted(&h).await;
    let b = h.visitor();
    assert!(!from_origin(&b.get(h.url("/")).send().await.unwrap()));

    assert_eq!(decide(&h, "/", &ticket).await.status, 200);
    // This one request is let in as the admitted visitor…
    let once = decide(&h, "/order/%63omplete", &ticket).await;
    assert_eq!(once.status, 200, "{once:?}");
    assert_eq!(once.header("x-waitroom-visitor").map(str::len), Some(32));
    assert!(expires_cookie(once.header("set-cookie")), "{once:?}");
    // …and the session ended with it: the place is B's, the ticket is spent.
    assert_eq!(h.status(&b).await["state"], "admitted");
    let after = decide(&h, "/", &ticket).await;
    assert_eq!(after.status, 401, "{after:?}");
    assert_eq!(revoked(&h.metrics().await), 1);
}
