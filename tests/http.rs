//! The daemon over real HTTP on loopback, in front of a real fake origin.

mod support;

use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use support::{assert_queued_json, from_origin, set_cookie, Harness, KEY, T0};
use waitroom::config::Secret32;
use waitroom::store::{End, VisitorId};
use waitroom::ticket::{Grant, KeyRing, Ticket};

const COOKIE: &str = "waitroom_shop";

#[tokio::test]
async fn admitted_visitor_is_forwarded_with_visitor_id_and_without_our_cookie() {
    let h = Harness::start(|_| {}).await;
    let v = h.visitor();
    let first = v.get(h.url("/shoes?size=42")).send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert!(from_origin(&first));
    let ticket = set_cookie(&first, COOKIE).expect("an admitted ticket is set");
    let set = first.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Lax") && set.contains("Path=/"),
        "{set}"
    );
    let echo: serde_json::Value = first.json().await.unwrap();
    assert_eq!(echo["uri"], "/shoes?size=42");
    let visitor = echo["headers"]["x-waitroom-visitor"][0]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(visitor.len(), 32);

    // The second request carries the ticket and another cookie: only ours is stripped.
    let second = h
        .bare()
        .get(h.url("/again"))
        .header("cookie", format!("theme=dark; {COOKIE}={ticket}"))
        .send()
        .await
        .unwrap();
    assert!(from_origin(&second));
    assert!(
        set_cookie(&second, COOKIE).is_none(),
        "no re-issue before check-in is due"
    );
    let echo: serde_json::Value = second.json().await.unwrap();
    assert_eq!(echo["headers"]["cookie"][0], "theme=dark");
    assert_eq!(echo["headers"]["x-waitroom-visitor"][0], visitor.as_str());
}

#[tokio::test]
async fn visitors_over_the_limit_queue_in_order_and_are_admitted_as_room_frees() {
    let h = Harness::start(|c| {
        c.rooms[0].total_active_users = 3;
        c.rooms[0].abandon_after = Duration::from_secs(120);
    })
    .await;
    let admitted: Vec<_> = (0..3).map(|_| h.visitor()).collect();
    for v in &admitted {
        assert!(from_origin(&v.get(h.url("/")).send().await.unwrap()));
    }
    let queued: Vec<_> = (0..4).map(|_| h.visitor()).collect();
    for (i, v) in queued.iter().enumerate() {
        let resp = v.get(h.url("/item/7?x=1")).send().await.unwrap();
        assert!(!from_origin(&resp));
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["cache-control"], "no-store");
        assert_eq!(resp.headers()["retry-after"], "5");
        let page = resp.text().await.unwrap();
        assert!(
            page.contains(&format!("id=\"wr-position\">{}<", i + 1)),
            "position {} in page",
            i + 1
        );
    }
    // Reloading keeps the place.
    let again = h.status(&queued[2]).await;
    assert_eq!(again["position"], 3);
    assert_eq!(again["queue_length"], 4);
    assert_eq!(again["state"], "queued");

    // Sessions end (60 s, renewed never since no check-in): the queue moves up.
    h.clock.advance(Duration::from_secs(61));
    let s = h.status(&queued[3]).await;
    assert_eq!(
        s["state"], "queued",
        "the fourth waits behind three free places"
    );
    for v in &queued[..3] {
        assert_eq!(h.status(v).await["state"], "admitted");
        let resp = v.get(h.url("/item/7?x=1")).send().await.unwrap();
        assert!(from_origin(&resp), "admitted visitors reach the origin");
    }
    let s = h.status(&queued[3]).await;
    assert_eq!(
        (s["state"].as_str(), s["position"].as_u64()),
        (Some("queued"), Some(1))
    );
}

#[tokio::test]
async fn json_clients_get_the_status_fields_exactly() {
    let h = Harness::start(|c| c.rooms[0].total_active_users = 1).await;
    assert!(from_origin(
        &h.visitor().get(h.url("/")).send().await.unwrap()
    ));
    let app = h.visitor();
    let resp = app
        .get(h.url("/api/cart"))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "application/json");
    assert_eq!(resp.headers()["retry-after"], "5");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_queued_json(&body);
    assert_eq!(body["room"], "shop");
    assert_eq!(body["state"], "queued");
    assert_eq!(body["position"], 1);
    assert_eq!(body["refresh_seconds"], 5);
    // One place, one second per session turnover of 60 s: the fallback ETA.
    assert_eq!(body["eta_seconds"], 60);
}

#[tokio::test]
async fn every_bad_cookie_is_a_new_visitor() {
    let h = Harness::start(|c| c.rooms[0].total_active_users = 100).await;
    let ring = KeyRing::new(&[Secret32(KEY)]);
    let admitted = |expires_ms| Ticket {
        visitor: VisitorId([1; 16]),
        grant: Grant::Admitted {
            session_expires_ms: expires_ms,
            check_in_due_ms: expires_ms,
        },
        expires_ms,
        net: None,
    };
    let good = ring.seal("shop", &admitted(T0 + 60_000));
    let mut tampered = good.clone().into_bytes();
    let mid = tampered.len() / 2;
    tampered[mid] = if tampered[mid] == b'A' { b'B' } else { b'A' };
    let other_key = KeyRing::new(&[Secret32([9; 32])]).seal("shop", &admitted(T0 + 60_000));
    let cases = [
        ("tampered", String::from_utf8(tampered).unwrap()),
        ("truncated", good[..good.len() - 5].to_owned()),
        ("foreign room", ring.seal("other", &admitted(T0 + 60_000))),
        ("unknown key", other_key),
        ("expired", ring.seal("shop", &admitted(T0 - 1))),
        ("garbage", "%%%not-a-cookie%%%".to_owned()),
        ("oversized", "A".repeat(4000)),
    ];
    for (case, value) in cases {
        let resp = h
            .bare()
            .get(h.url("/"))
            .header("cookie", format!("{COOKIE}={value}"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{case}");
        assert!(from_origin(&resp), "{case}: admitted as a new visitor");
        let fresh = set_cookie(&resp, COOKIE).unwrap_or_else(|| panic!("{case}: new ticket"));
        assert_ne!(fresh, value, "{case}");
        let echo: serde_json::Value = resp.json().await.unwrap();
        assert_ne!(
            echo["headers"]["x-waitroom-visitor"][0],
            VisitorId([1; 16]).to_hex(),
            "{case}"
        );
    }
    // The good one is accepted as it is.
    let resp = h
        .bare()
        .get(h.url("/"))
        .header("cookie", format!("{COOKIE}={good}"))
        .send()
        .await
        .unwrap();
    let echo: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(
        echo["headers"]["x-waitroom-visitor"][0],
        VisitorId([1; 16]).to_hex()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_hundred_concurrent_newcomers_at_a_limit_of_fifty_admit_exactly_fifty() {
    let h = Arc::new(Harness::start(|c| c.rooms[0].total_active_users = 50).await);
    let mut tasks = Vec::new();
    for _ in 0..400 {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            let resp = h
                .bare()
                .get(h.url("/"))
                .header("accept", "application/json")
                .send()
                .await
                .unwrap();
            if from_origin(&resp) {
                None
            } else {
                let s: serde_json::Value = resp.json().await.unwrap();
                Some(s["position"].as_u64().unwrap())
            }
        }));
    }
    let mut positions = Vec::new();
    let mut admitted = 0;
    for t in tasks {
        match t.await.unwrap() {
            None => admitted += 1,
            Some(p) => positions.push(p),
        }
    }
    assert_eq!(admitted, 50);
    positions.sort_unstable();
    assert_eq!(positions, (1..=350).collect::<Vec<_>>());
    let stats = h.store().stats(&h.policy(), T0).await.unwrap();
    assert_eq!((stats.active, stats.queued), (50, 350));
}

#[tokio::test]
async fn origin_revoke_frees_the_place_expires_the_cookie_and_is_stripped() {
    let h = Harness::start(|c| c.rooms[0].total_active_users = 1).await;
    let buyer = h.visitor();
    assert!(from_origin(&buyer.get(h.url("/")).send().await.unwrap()));
    let waiting = h.visitor();
    assert!(!from_origin(&waiting.get(h.url("/")).send().await.unwrap()));

    let done = buyer.get(h.url("/revoke")).send().await.unwrap();
    assert!(from_origin(&done));
    assert!(!done.headers().contains_key("x-waitroom-command"));
    let cleared = done.headers()["set-cookie"].to_str().unwrap();
    assert!(
        cleared.starts_with(&format!("{COOKIE}=;")) && cleared.contains("Max-Age=0"),
        "{cleared}"
    );

    assert_eq!(h.status(&waiting).await["state"], "admitted");
}

#[tokio::test]
async fn a_session_the_store_forgot_is_a_new_visitor_at_the_next_check_in() {
    let h = Harness::start(|c| c.rooms[0].total_active_users = 1).await;
    let v = h.visitor();
    let id = support::admitted_id(v.get(h.url("/")).send().await.unwrap()).await;
    let policy = h.policy();
    assert!(h.store().end(&policy, id, End::Release, T0).await.unwrap());
    // Before the check-in is due the ticket is trusted without a store trip.
    let resp = v.get(h.url("/")).send().await.unwrap();
    assert!(from_origin(&resp));
    // At the check-in (a quarter of 60 s) the store is asked: unknown -> new visitor.
    h.clock.advance(Duration::from_secs(16));
    let resp = v.get(h.url("/")).send().await.unwrap();
    assert!(
        from_origin(&resp),
        "room is free again, so the newcomer is admitted"
    );
    let echo: serde_json::Value = resp.json().await.unwrap();
    assert_ne!(echo["headers"]["x-waitroom-visitor"][0], id.to_hex());
}

#[tokio::test]
async fn check_in_renews_the_session_in_the_store() {
    let h = Harness::start(|c| c.rooms[0].total_active_users = 1).await;
    let v = h.visitor();
    assert!(from_origin(&v.get(h.url("/")).send().await.unwrap()));
    // Keep visiting every 20 s for 3 minutes: the 60 s session keeps sliding.
    for _ in 0..9 {
        h.clock.advance(Duration::from_secs(20));
        assert!(from_origin(&v.get(h.url("/")).send().await.unwrap()));
    }
    // Meanwhile the room stays full for others.
    assert!(!from_origin(
        &h.visitor().get(h.url("/")).send().await.unwrap()
    ));
}

#[tokio::test]
async fn bypass_paths_and_reserved_paths_are_never_queued_or_forwarded_wrongly() {
    // Paused: every new visitor queues, so a forwarded request must be a bypass.
    let h = Harness::start(|c| c.rooms[0].state = waitroom::store::RoomState::Paused).await;
    let resp = h.bare().get(h.url("/static/app.css")).send().await.unwrap();
    assert!(from_origin(&resp));
    assert!(set_cookie(&resp, COOKIE).is_none());
    let resp = h.bare().get(h.url("/")).send().await.unwrap();
    assert!(!from_origin(&resp), "paused: queued");
    let resp = h
        .bare()
        .get(h.url("/__waitroom/health"))
        .send()
        .await
        .unwrap();
    assert!(!from_origin(&resp));
    assert_eq!(resp.text().await.unwrap(), "ok");
    let resp = h
        .bare()
        .get(h.url("/__waitroom/anything"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    assert!(!from_origin(&resp));
}

#[tokio::test]
async fn forwarded_headers_are_set_and_only_trusted_peers_may_supply_them() {
    let h = Harness::start(|_| {}).await;
    let resp = h
        .bare()
        .get(h.url("/"))
        .header("x-forwarded-for", "6.6.6.6")
        .header("x-forwarded-proto", "https")
        .header("host", "shop.example")
        .send()
        .await
        .unwrap();
    let echo: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(echo["headers"]["x-forwarded-for"][0], "127.0.0.1");
    assert_eq!(echo["headers"]["x-forwarded-proto"][0], "http");
    assert_eq!(echo["headers"]["x-forwarded-host"][0], "shop.example");
    assert_eq!(echo["headers"]["host"][0], "shop.example");

    let h =
        Harness::start(|c| c.server.trusted_proxies = vec!["127.0.0.0/8".parse().unwrap()]).await;
    let resp = h
        .bare()
        .get(h.url("/"))
        .header("x-forwarded-for", "6.6.6.6")
        .header("x-forwarded-proto", "https")
        .send()
        .await
        .unwrap();
    let echo: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(echo["headers"]["x-forwarded-for"][0], "6.6.6.6, 127.0.0.1");
    assert_eq!(echo["headers"]["x-forwarded-proto"][0], "https");
}

#[tokio::test]
async fn hop_by_hop_headers_are_removed_both_ways() {
    let h = Harness::start(|_| {}).await;
    let resp = h
        .bare()
        .get(h.url("/echo"))
        .header("connection", "x-private")
        .header("x-private", "secret")
        .header("te", "trailers")
        .header("proxy-authorization", "Basic Zm9v")
        .send()
        .await
        .unwrap();
    let echo: serde_json::Value = resp.json().await.unwrap();
    for gone in ["x-private", "te", "proxy-authorization"] {
        assert!(
            echo["headers"].get(gone).is_none(),
            "{gone} reached the origin"
        );
    }
    let resp = h.bare().get(h.url("/hop")).send().await.unwrap();
    assert!(from_origin(&resp));
    assert!(!resp.headers().contains_key("x-secret-hop"));
    assert!(!resp.headers().contains_key("keep-alive"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_stream_both_ways() {
    let h = Harness::start(|_| {}).await;
    const SIZE: u64 = 64 * 1024 * 1024;
    // Download: read chunk by chunk, never the whole body at once.
    let mut resp = h
        .bare()
        .get(h.url(&format!("/download?bytes={SIZE}")))
        .send()
        .await
        .unwrap();
    assert!(from_origin(&resp));
    let mut got = 0u64;
    while let Some(chunk) = resp.chunk().await.unwrap() {
        got += chunk.len() as u64;
    }
    assert_eq!(got, SIZE);
    // Upload: a generated stream of the same size.
    let chunks = futures::stream::iter(
        (0..SIZE / 65536).map(|_| Ok::<_, std::io::Error>(vec![b'y'; 65536])),
    );
    let resp = h
        .bare()
        .post(h.url("/upload"))
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.text().await.unwrap(), SIZE.to_string());
}

#[tokio::test]
async fn websocket_upgrades_pass_through_for_admitted_visitors() {
    let h = Harness::start(|_| {}).await;
    let resp = h.bare().get(h.url("/")).send().await.unwrap();
    let ticket = set_cookie(&resp, COOKIE).unwrap();
    let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        format!("ws://{}/ws", h.daemon.addr),
    )
    .unwrap();
    req.headers_mut()
        .insert("cookie", format!("{COOKIE}={ticket}").parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .expect("upgrade through the proxy");
    ws.send("hello".into()).await.unwrap();
    let echoed = ws.next().await.unwrap().unwrap();
    assert_eq!(echoed.into_text().unwrap(), "hello");
}

#[tokio::test]
async fn http2_clients_are_served() {
    let h = Harness::start(|_| {}).await;
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let resp = client.get(h.url("/h2")).send().await.unwrap();
    assert_eq!(resp.version(), reqwest::Version::HTTP_2);
    assert!(from_origin(&resp));
    let echo: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(echo["uri"], "/h2");
}

#[tokio::test]
async fn origin_failures_get_clear_pages() {
    let h = Harness::start(|c| c.origin.timeout = Duration::from_millis(300)).await;
    let resp = h.bare().get(h.url("/slow?ms=2000")).send().await.unwrap();
    assert_eq!(resp.status(), 504);
    assert!(resp
        .text()
        .await
        .unwrap()
        .contains("did not answer in time"));

    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let h = Harness::start(|c| c.origin.url = format!("http://{dead_addr}").parse().unwrap()).await;
    let resp = h.bare().get(h.url("/")).send().await.unwrap();
    assert_eq!(resp.status(), 502);
    let page = resp.text().await.unwrap();
    assert!(page.contains("could not be reached"));
    assert!(
        !page.contains("Connection refused"),
        "no internals in the page"
    );
}

#[tokio::test]
async fn oversized_headers_are_refused_cleanly() {
    let h = Harness::start(|_| {}).await;
    let resp = h
        .bare()
        .get(h.url("/"))
        .header("x-big", "a".repeat(64 * 1024))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 431);
    // And the daemon keeps serving.
    assert!(from_origin(&h.bare().get(h.url("/")).send().await.unwrap()));
}

#[tokio::test]
async fn origin_connections_are_reused() {
    let h = Harness::start(|_| {}).await;
    let v = h.visitor();
    for _ in 0..20 {
        assert!(from_origin(&v.get(h.url("/")).send().await.unwrap()));
    }
    let opened = h
        .origin
        .connections
        .load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        opened <= 2,
        "{opened} origin connections for 20 sequential requests"
    );
}

#[tokio::test]
async fn queue_page_escapes_the_room_name() {
    let h = Harness::start(|c| {
        c.rooms[0].name = "<b>Drop</b> & \"sale\"".into();
        c.rooms[0].state = waitroom::store::RoomState::Paused;
    })
    .await;
    let page = h
        .bare()
        .get(h.url("/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("&lt;b&gt;Drop&lt;&#x2f;b&gt; &amp; &quot;sale&quot;"),
        "{page}"
    );
    assert!(!page.contains("<b>Drop"));
}

#[tokio::test]
async fn bypass_addresses_and_the_secret_header_skip_the_room() {
    let h = Harness::start(|c| {
        c.rooms[0].state = waitroom::store::RoomState::Paused;
        c.rooms[0].bypass_header = Some((
            http::HeaderName::from_static("x-load-test"),
            waitroom::config::Secret("let-me-in".into()),
        ));
    })
    .await;
    let with = |value: &'static str| h.bare().get(h.url("/")).header("x-load-test", value);
    assert!(from_origin(&with("let-me-in").send().await.unwrap()));
    assert!(
        !from_origin(&with("let-me-out").send().await.unwrap()),
        "wrong secret queues"
    );

    let h = Harness::start(|c| {
        c.rooms[0].state = waitroom::store::RoomState::Paused;
        c.rooms[0].bypass_ips = vec!["127.0.0.0/8".parse().unwrap()];
    })
    .await;
    let resp = h.bare().get(h.url("/")).send().await.unwrap();
    assert!(from_origin(&resp));
    assert!(
        set_cookie(&resp, COOKIE).is_none(),
        "no ticket for bypassed clients"
    );
}
