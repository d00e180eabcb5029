//! The operator's side over real HTTP: the admin API, room states, metrics,
//! reloads and draining.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use support::{from_origin, Harness};
use waitroom::config::Secret;
use waitroom::store::memory::MemoryStore;
use waitroom::store::SharedStore;

const TOKEN: &str = "s3cret-admin-token";

async fn with_token() -> Harness {
    Harness::start(|c| {
        c.server.admin_token = Some(Secret(TOKEN.into()));
        c.rooms[0].total_active_users = 2;
        c.rooms[0].abandon_after = Duration::from_secs(600);
    })
    .await
}

fn admin(h: &Harness, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
    h.bare()
        .request(method, h.admin_url(path))
        .bearer_auth(TOKEN)
}

async fn room_list(client: &reqwest::Client, url: &str) -> serde_json::Value {
    client.get(url).send().await.unwrap().json().await.unwrap()
}

async fn room(h: &Harness) -> serde_json::Value {
    admin(h, reqwest::Method::GET, "/api/rooms/shop")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn patch(h: &Harness, body: serde_json::Value) -> reqwest::Response {
    admin(h, reqwest::Method::PATCH, "/api/rooms/shop")
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn the_api_needs_the_token_and_health_does_not_on_loopback() {
    let h = with_token().await;
    let resp = h
        .bare()
        .get(h.admin_url("/api/rooms"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(resp.headers()["www-authenticate"], "Bearer");
    let resp = h
        .bare()
        .get(h.admin_url("/api/rooms"))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(
        admin(&h, reqwest::Method::GET, "/api/rooms")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    for open in ["/live", "/ready", "/metrics", "/"] {
        assert_eq!(
            h.bare()
                .get(h.admin_url(open))
                .send()
                .await
                .unwrap()
                .status(),
            200,
            "{open}"
        );
    }
}

#[tokio::test]
async fn an_admin_listener_off_loopback_needs_a_token() {
    let origin = support::origin::Origin::start().await;
    let mut cfg = support::config(origin.addr);
    cfg.server.admin_listen = "0.0.0.0:0".parse().unwrap();
    let err = waitroom::Daemon::start(&cfg, Default::default())
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("not a loopback address"), "{err}");
}

#[tokio::test]
async fn rooms_show_configuration_and_live_figures() {
    let h = with_token().await;
    for _ in 0..3 {
        h.visitor().get(h.url("/")).send().await.unwrap();
    }
    let r = room(&h).await;
    assert_eq!(r["id"], "shop");
    assert_eq!(r["state"], "open");
    assert_eq!(
        (r["active"].as_u64(), r["queued"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(r["admitted_last_minute"], 2);
    assert_eq!(r["total_active_users"], 2);
    let all: serde_json::Value = admin(&h, reqwest::Method::GET, "/api/rooms")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(all.as_array().unwrap().len(), 1);
    assert_eq!(
        admin(&h, reqwest::Method::GET, "/api/rooms/nope")
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
}

#[tokio::test]
async fn raising_the_limit_admits_the_queue_at_once() {
    let h = with_token().await;
    for _ in 0..2 {
        assert!(from_origin(
            &h.visitor().get(h.url("/")).send().await.unwrap()
        ));
    }
    let waiting = h.visitor();
    assert!(!from_origin(&waiting.get(h.url("/")).send().await.unwrap()));
    let resp = patch(&h, json!({"total_active_users": 3})).await;
    assert_eq!(resp.status(), 200);
    let r: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(r["total_active_users"], 3);
    assert_eq!(r["configured"]["total_active_users"], 2);
    assert_eq!(h.status(&waiting).await["state"], "admitted");
}

#[tokio::test]
async fn bad_changes_are_refused_with_the_field_named() {
    let h = with_token().await;
    for (body, needle) in [
        (json!({"total_users": 3}), "total_users"),
        (json!({"total_active_users": 0}), "total_active_users"),
        (json!({"session_duration": "soon"}), "session_duration"),
        (json!({"state": "sleeping"}), "sleeping"),
        // Runtime changes are held to the config file's bounds.
        (json!({"session_duration": "500000000y"}), "from 1s to 365d"),
        (
            json!({"session_duration": "18446744073709551615s"}),
            "session_duration",
        ),
        (json!({"session_duration": "0s"}), "session_duration"),
        (
            json!({"total_active_users": 1_000_000_000_000u64}),
            "at most 1000000000",
        ),
        (
            json!({"new_users_per_minute": 1_000_000_001u64}),
            "at most 1000000000",
        ),
    ] {
        let resp = patch(&h, body).await;
        assert_eq!(resp.status(), 400);
        let e: serde_json::Value = resp.json().await.unwrap();
        assert!(e["error"].as_str().unwrap().contains(needle), "{e}");
    }
}

#[tokio::test]
async fn room_states_hold_admissions_and_close_the_sale() {
    // Two places. Every step below is decided by a request or a poll, so
    // the background refresh cannot change the outcome.
    let h = with_token().await;
    let active = h.visitor();
    let active_id = support::admitted_id(active.get(h.url("/")).send().await.unwrap())
        .await
        .to_hex();

    // queue_all: a place is free, yet a newcomer queues; sessions continue;
    // the line itself is still admitted in order as capacity allows.
    patch(&h, json!({"state": "queue_all"})).await;
    let first = h.visitor();
    assert!(!from_origin(&first.get(h.url("/")).send().await.unwrap()));
    assert!(from_origin(&active.get(h.url("/")).send().await.unwrap()));
    assert_eq!(h.status(&first).await["state"], "admitted");

    // paused: nobody is admitted, even when a place frees; order is kept.
    patch(&h, json!({"state": "paused"})).await;
    let second = h.visitor();
    let third = h.visitor();
    assert!(!from_origin(&second.get(h.url("/")).send().await.unwrap()));
    assert!(!from_origin(&third.get(h.url("/")).send().await.unwrap()));
    let resp = admin(&h, reqwest::Method::POST, "/api/rooms/shop/release")
        .json(&json!({"visitor": active_id}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(h.status(&third).await["position"], 2);
    let s = h.status(&second).await;
    assert_eq!(
        (s["state"].as_str(), s["position"].as_u64()),
        (Some("queued"), Some(1))
    );

    // open again: the free place goes to the first in line.
    patch(&h, json!({"state": "open"})).await;
    assert_eq!(h.status(&third).await["state"], "queued");
    assert_eq!(h.status(&second).await["state"], "admitted");

    // closed: the queue sees the closed page; no new tickets.
    patch(&h, json!({"state": "closed"})).await;
    let resp = third.get(h.url("/")).send().await.unwrap();
    assert_eq!(resp.status(), 503);
    assert!(resp.text().await.unwrap().contains("Sold out"));
    let resp = h.bare().get(h.url("/")).send().await.unwrap();
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().get("set-cookie").is_none());
    assert!(
        from_origin(&first.get(h.url("/")).send().await.unwrap()),
        "sessions continue"
    );
}

#[tokio::test]
async fn release_ends_a_session_and_reset_empties_the_room() {
    let h = with_token().await;
    let v = h.visitor();
    let id = support::admitted_id(v.get(h.url("/")).send().await.unwrap())
        .await
        .to_hex();
    let resp = admin(&h, reqwest::Method::POST, "/api/rooms/shop/release")
        .json(&json!({"visitor": id}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.json::<serde_json::Value>().await.unwrap()["released"],
        true
    );
    assert_eq!(room(&h).await["active"], 0);
    let resp = admin(&h, reqwest::Method::POST, "/api/rooms/shop/release")
        .json(&json!({"visitor": "xyz"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);

    for _ in 0..3 {
        h.visitor().get(h.url("/")).send().await.unwrap();
    }
    assert_eq!(room(&h).await["queued"], 1);
    let resp = admin(&h, reqwest::Method::POST, "/api/rooms/shop/reset")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let r = room(&h).await;
    assert_eq!(
        (r["active"].as_u64(), r["queued"].as_u64()),
        (Some(0), Some(0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_reach_every_instance_within_a_second_and_survive_a_restart() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    let tweak = |c: &mut waitroom::config::Config| {
        c.server.admin_token = Some(Secret(TOKEN.into()));
        c.rooms[0].total_active_users = 2;
    };
    let a = Harness::start_with_store(tweak, Some(store.clone())).await;
    let b = Harness::start_with_store(tweak, Some(store.clone())).await;
    patch(&a, json!({"total_active_users": 7, "state": "queue_all"})).await;
    let started = Instant::now();
    loop {
        let policy = b.policy();
        if policy.total_active_users == 7 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "instance b never saw the change"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        started.elapsed() <= Duration::from_millis(1100),
        "took {:?}",
        started.elapsed()
    );

    // A restarted instance with the same config applies the stored change...
    let c = Harness::start_with_store(tweak, Some(store.clone())).await;
    assert_eq!(room(&c).await["total_active_users"], 7);
    // ...until the config file changes that room.
    let d = Harness::start_with_store(
        |cfg| {
            tweak(cfg);
            cfg.rooms[0].total_active_users = 4;
        },
        Some(store),
    )
    .await;
    let r = room(&d).await;
    assert_eq!(
        (r["total_active_users"].as_u64(), r["state"].as_str()),
        (Some(4), Some("open"))
    );
}

#[tokio::test]
async fn metrics_show_rooms_decisions_and_proxy_figures() {
    let h = with_token().await;
    for _ in 0..3 {
        h.visitor().get(h.url("/")).send().await.unwrap();
    }
    // History keeps one sample per 5 s of the daemon's clock.
    h.clock.advance(Duration::from_secs(5));
    h.daemon.gate().refresh_room_figures().await;
    let text = h.metrics().await;
    for needle in [
        "waitroom_room_active{room=\"shop\"} 2",
        "waitroom_room_queued{room=\"shop\"} 1",
        "waitroom_room_limit{room=\"shop\"} 2",
        "waitroom_decisions_total{room=\"shop\",outcome=\"admitted\"} 2",
        "waitroom_decisions_total{room=\"shop\",outcome=\"queued\"} 1",
        "waitroom_room_store_totals{room=\"shop\",kind=\"abandoned\"} 0",
        "waitroom_decision_latency_seconds_count{room=\"shop\"} 3",
        "waitroom_proxy_responses_total{class=\"2xx\"} 3",
        "waitroom_origin_latency_seconds_count 2",
        "waitroom_store_errors_total 0",
        "waitroom_store_up 1",
        "waitroom_queue_wait_seconds_count{room=\"shop\"} 0",
    ] {
        assert!(text.contains(needle), "{needle} not in\n{text}");
    }
    let history: serde_json::Value = admin(&h, reqwest::Method::GET, "/api/history")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(history["now"], h.clock_now());
    let samples = history["rooms"]["shop"]["samples"].as_array().unwrap();
    assert_eq!(samples.last().unwrap()["active"], 2);
    assert_eq!(samples.last().unwrap()["queued"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_changes_rooms_without_dropping_requests_and_refuses_a_bad_file() {
    let origin = support::origin::Origin::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("waitroom.toml");
    let file = |rooms: &str| {
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n[cookie]\nkeys = [\"BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=\"]\nsecure = false\n[origin]\nurl = \"http://{}\"\n{rooms}",
            origin.addr
        )
    };
    let one = "[[room]]\nid = \"shop\"\npath = \"/\"\ntotal_active_users = 5\nnew_users_per_minute = 100\n";
    std::fs::write(&path, file(one)).unwrap();
    let cfg = waitroom::config::load(&path).unwrap();
    let daemon = waitroom::Daemon::start(
        &cfg,
        waitroom::Deps {
            config_path: Some(path.clone()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let url = |p: &str| format!("http://{}{}", daemon.addr, p);
    let admin_url = |p: &str| format!("http://{}{}", daemon.admin_addr, p);
    let client = reqwest::Client::new();

    // A slow request in flight across the reload completes.
    let slow = tokio::spawn(client.get(url("/slow?ms=1500")).send());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let two = format!("{one}[[room]]\nid = \"vip\"\npath = \"/vip\"\ntotal_active_users = 1\nnew_users_per_minute = 100\n");
    std::fs::write(&path, file(&two)).unwrap();
    let resp = client.post(admin_url("/api/reload")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let rooms = room_list(&client, &admin_url("/api/rooms")).await;
    assert_eq!(rooms.as_array().unwrap().len(), 2, "room added");
    let done = slow.await.unwrap().unwrap();
    assert_eq!(done.status(), 200);
    assert_eq!(done.text().await.unwrap(), "slow");

    // A bad file is refused with its message; the running config stays.
    std::fs::write(&path, file("[[room]]\nid = \"Bad Id\"\npath = \"/\"\ntotal_active_users = 5\nnew_users_per_minute = 1\n")).unwrap();
    let resp = client.post(admin_url("/api/reload")).send().await.unwrap();
    assert_eq!(resp.status(), 400);
    let e: serde_json::Value = resp.json().await.unwrap();
    assert!(e["error"].as_str().unwrap().contains("room[0].id"), "{e}");
    let rooms = room_list(&client, &admin_url("/api/rooms")).await;
    assert_eq!(rooms.as_array().unwrap().len(), 2);

    // Removing a room: its path now belongs to the remaining "/" room.
    std::fs::write(&path, file(one)).unwrap();
    daemon.reload_from_file().await.unwrap();
    let rooms = room_list(&client, &admin_url("/api/rooms")).await;
    assert_eq!(rooms.as_array().unwrap().len(), 1, "room removed");
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_in_flight_requests_then_refuses_connections() {
    let h = with_token().await;
    let client = reqwest::Client::new();
    let slow = tokio::spawn(client.get(h.url("/slow?ms=1000")).send());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let addr = h.daemon.addr;
    let Harness { daemon, origin, .. } = h;
    let drained = tokio::spawn(daemon.shutdown());
    let resp = slow.await.unwrap().unwrap();
    assert_eq!(
        resp.text().await.unwrap(),
        "slow",
        "in-flight request finished"
    );
    drained.await.unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
    drop(origin);
}

/// An admin request as a browser would send it, as raw bytes.
async fn raw_admin(addr: SocketAddr, head: &str) -> support::raw::RawResponse {
    let request = format!("{head}Connection: close\r\n\r\n");
    support::raw::exchange(addr, request.as_bytes()).await
}

#[tokio::test]
async fn without_a_token_only_loopback_names_and_same_origin_requests_are_answered() {
    let h = Harness::start(|c| c.rooms[0].total_active_users = 1).await;
    let addr = h.daemon.admin_addr;
    let port = addr.port();
    assert!(from_origin(
        &h.visitor().get(h.url("/")).send().await.unwrap()
    ));
    let active = |h: &Harness| {
        let store = h.store();
        let policy = h.policy();
        let now = h.clock_now();
        async move { store.stats(&policy, now).await.unwrap().active }
    };

    // DNS rebinding: a foreign name resolved to 127.0.0.1.
    for host in [
        "evil.example",
        "evil.example:9090",
        "localhost.evil.example",
    ] {
        let resp = raw_admin(
            addr,
            &format!("GET /api/rooms HTTP/1.1\r\nHost: {host}\r\n"),
        )
        .await;
        assert_eq!(resp.status, 403, "{host}: {resp:?}");
    }
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "[::1]".into(),
    ] {
        let resp = raw_admin(
            addr,
            &format!("GET /api/rooms HTTP/1.1\r\nHost: {host}\r\n"),
        )
        .await;
        assert_eq!(resp.status, 200, "{host}: {resp:?}");
    }
    // A web page posting across sites, with or without a body.
    for extra in [
        "Origin: http://evil.example\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n",
        "Origin: null\r\nContent-Length: 0\r\n",
        &format!(
            "Origin: http://127.0.0.1:{}\r\nContent-Length: 0\r\n",
            port + 1
        ),
    ] {
        let resp = raw_admin(
            addr,
            &format!("POST /api/rooms/shop/reset HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}"),
        )
        .await;
        assert_eq!(resp.status, 403, "{extra}: {resp:?}");
    }
    assert_eq!(active(&h).await, 1, "the room was not reset");
    // A form cannot send JSON: a text/plain body is refused.
    let body = r#"{"state":"paused"}"#;
    let request = format!(
        "PATCH /api/rooms/shop HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: text/plain\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let resp = support::raw::exchange(addr, request.as_bytes()).await;
    assert_eq!(resp.status, 415, "{resp:?}");
    assert_eq!(h.policy().state, waitroom::store::RoomState::Open);
    // The dashboard's own requests (same origin) work.
    let resp = raw_admin(
        addr,
        &format!(
            "POST /api/rooms/shop/reset HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: http://127.0.0.1:{port}\r\nContent-Length: 0\r\n"
        ),
    )
    .await;
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(active(&h).await, 0);
}

#[tokio::test]
async fn the_bearer_scheme_is_matched_in_any_case() {
    let h = with_token().await;
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let resp = h
            .bare()
            .get(h.admin_url("/api/rooms"))
            .header("authorization", format!("{scheme} {TOKEN}"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{scheme}");
    }
    for bad in [
        format!("Basic {TOKEN}"),
        TOKEN.to_owned(),
        format!("Bearer{TOKEN}"),
    ] {
        let resp = h
            .bare()
            .get(h.admin_url("/api/rooms"))
            .header("authorization", bad.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401, "{bad}");
    }
    // With a token, any host name may be used (the token is the protection),
    // but a cross-site Origin is still refused.
    let resp = h
        .bare()
        .post(h.admin_url("/api/rooms/shop/reset"))
        .bearer_auth(TOKEN)
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
}
