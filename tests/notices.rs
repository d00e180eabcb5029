//! Notices to the people waiting and page previews, over real HTTP: an
//! operator's notice reaches every instance on one Redis within a refresh
//! and survives a restart, is chosen by language, expires, is shown as
//! text; events carry their own; previews render every page and write
//! nothing.

#[path = "support/redis_server.rs"]
mod redis_server;
mod support;

use std::time::{Duration, Instant};

use redis_server::RedisServer;
use serde_json::{json, Value};
use support::{from_origin, Harness};
use waitroom::config::{Backend, Config, EventConfig, FailMode, Secret};
use waitroom::domain::Notice;
use waitroom::store::{EventSpec, Settings};

const TOKEN: &str = "s3cret-admin-token";

/// A room of one place, with an admin token.
fn small(c: &mut Config) {
    c.server.admin_token = Some(Secret(TOKEN.into()));
    c.rooms[0].total_active_users = 1;
    c.rooms[0].abandon_after = Duration::from_secs(600);
}

fn on_redis(server: &RedisServer) -> impl Fn(&mut Config) + '_ {
    move |c: &mut Config| {
        small(c);
        c.store.backend = Backend::Redis {
            urls: vec![server.url()],
        };
        c.store.fail_mode = FailMode::Closed;
    }
}

async fn redis() -> RedisServer {
    tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap()
}

/// One visitor admitted, one queued (its client returned).
async fn queue_one(h: &Harness) -> reqwest::Client {
    let first = h.visitor();
    assert!(from_origin(&first.get(h.url("/")).send().await.unwrap()));
    let queued = h.visitor();
    assert!(!from_origin(&queued.get(h.url("/")).send().await.unwrap()));
    queued
}

/// The status JSON for `visitor` with these extra headers.
async fn status_with(h: &Harness, visitor: &reqwest::Client, headers: &[(&str, &str)]) -> Value {
    let mut req = visitor.get(h.url("/__waitroom/status?room=shop"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

/// Waits (polling, bounded) until `visitor`'s status on `h` satisfies
/// `done`; returns how long that took.
async fn until_status(
    h: &Harness,
    visitor: &reqwest::Client,
    within: Duration,
    done: impl Fn(&Value) -> bool,
) -> Duration {
    let started = Instant::now();
    loop {
        let s = h.status(visitor).await;
        if done(&s) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "not seen within {within:?}: {s}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_reaches_every_instance_within_a_refresh_and_survives_a_restart() {
    let server = redis().await;
    let a = Harness::start(on_redis(&server)).await;
    let b = Harness::start_on(
        on_redis(&server),
        support::origin::Origin::start().await,
        a.clock.clone(),
    )
    .await;
    let queued = queue_one(&a).await;
    assert!(a.status(&queued).await.get("notice").is_none(), "none yet");

    a.patch_room_ok(
        "shop",
        json!({"notice": {"text": "Restock at 18:00", "level": "warning"}}),
    )
    .await;
    // At once where it was made...
    let s = a.status(&queued).await;
    assert_eq!(
        s["notice"],
        json!({"text": "Restock at 18:00", "level": "warning"})
    );
    // ...and on the other instance within one refresh (a second).
    let took = until_status(&b, &queued, Duration::from_millis(1_600), |s| {
        s["notice"]["text"] == "Restock at 18:00"
    })
    .await;
    assert!(took <= Duration::from_millis(1_200), "took {took:?}");
    assert_eq!(b.status(&queued).await["state"], "queued");

    // A restarted daemon on the same Redis shows it from its first answer.
    let clock = a.clock.clone();
    let Harness { daemon, origin, .. } = a;
    daemon.shutdown().await;
    let b_clock = b.clock.clone();
    let Harness { daemon, .. } = b;
    daemon.shutdown().await;
    let c = Harness::start_on(on_redis(&server), origin, clock).await;
    assert_eq!(
        c.status(&queued).await["notice"]["text"],
        "Restock at 18:00"
    );
    let admin: Value = c
        .bare()
        .get(c.admin_url("/api/rooms/shop"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(admin["notice"]["level"], "warning");

    // `null` clears it, here at once and for every instance.
    c.patch_room_ok("shop", json!({"notice": null})).await;
    assert!(c.status(&queued).await.get("notice").is_none());
    let d = Harness::start_on(
        on_redis(&server),
        support::origin::Origin::start().await,
        b_clock,
    )
    .await;
    assert!(d.status(&queued).await.get("notice").is_none());
    // Other changes keep the notice: only `notice` touches it.
    c.patch_room_ok("shop", json!({"notice": {"text": "Back soon"}}))
        .await;
    c.patch_room_ok("shop", json!({"new_users_per_minute": 30}))
        .await;
    assert_eq!(c.status(&queued).await["notice"]["text"], "Back soon");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_speaks_the_visitors_language_and_expires_on_the_clock() {
    let h = Harness::start(small).await;
    let queued = queue_one(&h).await;
    let expires = support::T0 / 1000 + 60;
    h.patch_room_ok(
        "shop",
        json!({"notice": {
            "text": "Sizes are limited",
            "texts": {"de": "Größen sind begrenzt", "FR": "Tailles limitées"},
            "expires": expires,
        }}),
    )
    .await;
    let de = status_with(&h, &queued, &[("accept-language", "de-CH, en;q=0.5")]).await;
    assert_eq!(
        de["notice"],
        json!({"text": "Größen sind begrenzt", "level": "info", "expires": "2027-01-15T08:01:00Z"})
    );
    let fr = status_with(&h, &queued, &[("accept-language", "fr")]).await;
    assert_eq!(
        fr["notice"]["text"], "Tailles limitées",
        "codes in any case"
    );
    let other = status_with(&h, &queued, &[("accept-language", "ja")]).await;
    assert_eq!(
        other["notice"]["text"], "Sizes are limited",
        "the default text"
    );
    // The page in German says it in German.
    let page = queued
        .get(h.url("/"))
        .header("accept-language", "de")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("Größen sind begrenzt"), "{page}");

    // An RFC 3339 expiry works alike; the notice is gone once it passes.
    h.clock.advance(Duration::from_secs(59));
    assert!(h.status(&queued).await.get("notice").is_some());
    h.clock.advance(Duration::from_secs(1));
    assert!(h.status(&queued).await.get("notice").is_none(), "expired");
    let page = queued
        .get(h.url("/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!page.contains("Sizes are limited"));
    h.patch_room_ok(
        "shop",
        json!({"notice": {"text": "Later", "expires": "2027-01-15T09:00:00Z"}}),
    )
    .await;
    assert_eq!(
        h.status(&queued).await["notice"]["expires"],
        "2027-01-15T09:00:00Z"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attackers_notice_text_is_shown_as_text() {
    let h = Harness::start(small).await;
    let queued = queue_one(&h).await;
    let evil = "<script>alert(1)</script><img src=x onerror=alert(2)>\"'";
    h.patch_room_ok("shop", json!({"notice": {"text": evil}}))
        .await;
    for accept in ["text/html", "application/json"] {
        let body = queued
            .get(h.url("/"))
            .header("accept", accept)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if accept == "text/html" {
            assert!(!body.contains("<script>alert(1)"), "{body}");
            assert!(!body.contains("<img src=x"), "{body}");
            assert!(
                body.contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;"),
                "{body}"
            );
        } else {
            let s: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(s["notice"]["text"], evil, "JSON carries the text as it is");
        }
    }
    // The sold-out page shows it, escaped too.
    h.patch_room_ok("shop", json!({"state": "closed"})).await;
    let (code, _, page) = h.page("/", &[]).await;
    assert_eq!(code, 503);
    assert!(page.contains("&lt;script&gt;alert(1)"), "{page}");
    assert!(!page.contains("<script>"), "{page}");
}

#[tokio::test]
async fn bad_notices_are_refused_with_the_field_named() {
    let h = Harness::start(small).await;
    let past = support::T0 / 1000 - 1;
    for (body, message) in [
        (
            json!({"notice": {"text": "x".repeat(501)}}),
            "notice.text: at most 500 characters, got 501",
        ),
        (
            json!({"notice": {"text": "  "}}),
            "notice.text: must not be blank",
        ),
        (
            json!({"notice": {"text": "ok", "texts": {"de": "ü".repeat(501)}}}),
            "notice.texts.de: at most 500 characters, got 501",
        ),
        (
            json!({"notice": {"text": "ok", "texts": {"xx": "?"}}}),
            "notice.texts: \"xx\" is not a language of the pages; expected one of en, zh, de, es, fr, ja, pt, ru",
        ),
        (
            json!({"notice": {"text": "ok", "texts": {"de": "a", "DE": "b"}}}),
            "notice.texts: \"de\" is given twice",
        ),
        (
            json!({"notice": {"text": "ok", "expires": past}}),
            "notice.expires: 2027-01-15T07:59:59Z is already past (now 2027-01-15T08:00:00Z)",
        ),
        (
            json!({"notice": {"text": "ok", "expires": "soon"}}),
            "notice.expires: expected an RFC 3339 time such as \"2026-12-01T10:00:00Z\", got \"soon\"",
        ),
        (
            json!({"notice": {"text": "ok", "expires": -5}}),
            "notice.expires: expected Unix seconds or an RFC 3339 time, got -5",
        ),
    ] {
        let resp = h.patch_room("shop", body.clone()).await;
        assert_eq!(resp.status(), 400, "{body}");
        let e: Value = resp.json().await.unwrap();
        assert_eq!(e["error"], message, "{body}");
    }
    let resp = h
        .patch_room("shop", json!({"notice": {"text": "ok", "level": "panic"}}))
        .await;
    assert_eq!(resp.status(), 400);
    let e: Value = resp.json().await.unwrap();
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("unknown variant `panic`, expected `info` or `warning`"),
        "{e}"
    );
    // Nothing was stored.
    let room: Value = h
        .bare()
        .get(h.admin_url("/api/rooms/shop"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(room["notice"], Value::Null);
}

/// An event running from `T0 - 1 min` for an hour, with a notice.
fn with_event(c: &mut Config) {
    small(c);
    c.rooms[0].events = vec![EventConfig {
        spec: EventSpec {
            name: "drop".into(),
            prequeue_start_ms: None,
            start_ms: support::T0 - 60_000,
            end_ms: support::T0 + 3_600_000,
            shuffle_at_start: false,
            lanes_only_for_ms: None,
            settings: Settings::default(),
            notice: Some(Notice::plain("Two per customer")),
        },
        template: None,
    }];
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_shows_its_notice_while_in_force_unless_the_operator_has_one() {
    let h = Harness::start(with_event).await;
    let queued = queue_one(&h).await;
    assert_eq!(
        h.status(&queued).await["notice"]["text"],
        "Two per customer"
    );
    h.patch_room_ok("shop", json!({"notice": {"text": "Payment is slow"}}))
        .await;
    assert_eq!(h.status(&queued).await["notice"]["text"], "Payment is slow");
    h.patch_room_ok("shop", json!({"notice": null})).await;
    assert_eq!(
        h.status(&queued).await["notice"]["text"],
        "Two per customer"
    );
    // The admin API changes the event's notice like its other settings.
    let resp = h
        .bare()
        .patch(h.admin_url("/api/rooms/shop/events/drop"))
        .bearer_auth(TOKEN)
        .json(&json!({"notice": {"text": "One per customer", "level": "warning"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let events: Value = resp.json().await.unwrap();
    assert_eq!(events[0]["notice"]["text"], "One per customer");
    assert_eq!(
        h.status(&queued).await["notice"],
        json!({"text": "One per customer", "level": "warning"})
    );
    // Once the event ends, so does its notice.
    h.clock.advance(Duration::from_secs(3_600));
    assert!(h.status(&queued).await.get("notice").is_none());
}

async fn preview(h: &Harness, query: &str) -> reqwest::Response {
    h.bare()
        .get(h.admin_url(&format!("/api/rooms/shop/preview{query}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
}

/// Every key in the Redis store, sorted.
fn keys(server: &RedisServer) -> Vec<String> {
    let mut names: Vec<String> = server.cmd(&["KEYS", "*"]);
    names.sort();
    names
}

/// The room's figures as the store counts them: sessions, places, totals.
async fn figures(h: &Harness) -> (u64, u64, u64, u64) {
    let (active, queued) = h.counts().await;
    let totals = h.store().totals(&h.policy()).await.unwrap();
    (active, queued, totals.admitted, totals.queued)
}

/// The lines of `/metrics` about rooms and visitors.
async fn room_metrics(h: &Harness) -> Vec<String> {
    h.metrics()
        .await
        .lines()
        .filter(|l| l.contains("room=\"shop\"") && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previews_render_every_page_with_the_notice_and_write_nothing() {
    let server = redis().await;
    let h = Harness::start(on_redis(&server)).await;
    let _queued = queue_one(&h).await;
    h.patch_room_ok(
        "shop",
        json!({"notice": {"text": "Restock <soon>", "texts": {"de": "Nachschub <bald>"}}}),
    )
    .await;
    let keys_before = keys(&server);
    let figures_before = figures(&h).await;
    let metrics_before = room_metrics(&h).await;

    for (state, shows) in [
        ("queued", "42"),
        ("prequeue", "sample"),
        ("closed", "Sold out"),
        ("sold_out", "Sold out"),
        ("challenge", "Checking your browser"),
    ] {
        let resp = preview(&h, &format!("?state={state}&lang=en")).await;
        assert_eq!(resp.status(), 200, "{state}");
        let csp = resp.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(csp.contains("sandbox"), "{csp}");
        assert_eq!(resp.headers()["content-language"], "en");
        assert!(resp.headers().get("set-cookie").is_none(), "no ticket");
        let page = resp.text().await.unwrap();
        assert!(page.contains(shows), "{state}: {page}");
        if state != "challenge" {
            assert!(page.contains("Restock &lt;soon&gt;"), "{state}: {page}");
        }
    }
    let de = preview(&h, "?state=queued&lang=de")
        .await
        .text()
        .await
        .unwrap();
    assert!(de.contains("Nachschub &lt;bald&gt;") && de.contains("<html lang=\"de\">"));
    let fr = preview(&h, "?state=queued").await;
    assert_eq!(
        fr.headers()["content-language"],
        "en",
        "without lang: the room's choice"
    );

    assert_eq!(keys(&server), keys_before, "no store key written");
    assert_eq!(figures(&h).await, figures_before, "no place, no session");
    assert_eq!(room_metrics(&h).await, metrics_before, "no visitor counted");
}

#[tokio::test]
async fn a_preview_of_an_unknown_state_or_language_is_refused() {
    let h = Harness::start(small).await;
    for (query, message) in [
        (
            "?state=gone",
            "state: expected one of queued, prequeue, closed, challenge, sold_out, got \"gone\"",
        ),
        (
            "",
            "state: required, one of queued, prequeue, closed, challenge, sold_out",
        ),
        (
            "?state=queued&lang=xx",
            "lang: expected one of en, zh, de, es, fr, ja, pt, ru, got \"xx\"",
        ),
        (
            "?state=queued&visitor=1",
            "visitor: unknown parameter (state and lang are taken)",
        ),
    ] {
        let resp = preview(&h, query).await;
        assert_eq!(resp.status(), 400, "{query}");
        let e: Value = resp.json().await.unwrap();
        assert_eq!(e["error"], message);
    }
    let resp = h
        .bare()
        .get(h.admin_url("/api/rooms/shop/preview?state=queued"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401, "the admin API's token");
}
