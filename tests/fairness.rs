//! Drop-day fairness over real HTTP: the shadow queue. A newcomer a
//! queueing room will not let in (a bot score below the minimum from a
//! trusted proxy, a forged or foreign proof of work) gets a page and JSON
//! like a queued visitor's, a ticket like theirs, a place that moves up at
//! the queue's pace and is never let in, and the store never hears of it;
//! once the room stops queueing it is a newcomer again. A person handing
//! one proof in twice is never shadowed.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use support::Harness;
use waitroom::config::{BotScore, FailedChallenge};

/// Room "shop" for one visitor at a time, behind a trusted proxy that
/// sends a bot score in `cf-bot-score`; under 30 is a bot.
async fn daemon() -> Harness {
    Harness::start(|c| {
        c.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        let room = &mut c.rooms[0];
        room.total_active_users = 1;
        room.bot_score = Some(BotScore {
            header: http::HeaderName::from_static("cf-bot-score"),
            min: 30,
        });
        room.failed_challenge = FailedChallenge::Shadow;
    })
    .await
}

fn keys(json: &str) -> BTreeSet<String> {
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    v.as_object().unwrap().keys().cloned().collect()
}

#[tokio::test]
async fn a_low_bot_score_gets_a_shadow_place_that_never_moves_in() {
    let h = daemon().await;
    let (status, _, _) = h.page("/shop/", &[("cf-bot-score", "80")]).await;
    assert_eq!(status, 200, "a person with a good score is let in");
    // A person waits: the queue page, position 1.
    let json = [("accept", "application/json")];
    let (status, person, queued_json) = h.page("/shop/", &json).await;
    assert_eq!(status, 200);
    let person = person.expect("a queue ticket");
    let v: serde_json::Value = serde_json::from_str(&queued_json).unwrap();
    assert_eq!(
        (v["state"].as_str(), v["position"].as_u64()),
        (Some("queued"), Some(1))
    );
    assert_eq!(h.counts().await, (1, 1));

    // Ten are waiting, as the last upkeep saw it.
    h.daemon.gate().rooms.by_id("shop").unwrap().saw_queued(10);
    let bot = [("cf-bot-score", "5"), ("accept", "application/json")];
    let (status, shadow, shadow_json) = h.page("/shop/", &bot).await;
    assert_eq!(status, 200, "the same status as a queued visitor's");
    let shadow = shadow.expect("a ticket like a queued visitor's");
    assert_eq!(shadow.len(), person.len(), "a cookie of the same size");
    assert_eq!(
        keys(&shadow_json),
        keys(&queued_json),
        "the same JSON fields"
    );
    let v: serde_json::Value = serde_json::from_str(&shadow_json).unwrap();
    assert_eq!(
        (v["state"].as_str(), v["position"].as_u64()),
        (Some("queued"), Some(11))
    );
    // Its page is the queue page.
    let (status, _, page) = h.page("/shop/", &[("cf-bot-score", "5")]).await;
    assert_eq!(status, 200);
    assert!(page.contains("/__waitroom/status?room=shop"));
    assert_eq!(h.counts().await, (1, 1), "the store never heard of it");

    // The room queues everyone from now on and empties; the shadow place
    // only crawls.
    let queue_all = h
        .bare()
        .patch(h.admin_url("/api/rooms/shop"))
        .json(&serde_json::json!({"state": "queue_all"}))
        .send()
        .await
        .unwrap();
    assert_eq!(queue_all.status(), 200);
    let released = h
        .bare()
        .post(h.admin_url("/api/rooms/shop/reset"))
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), 200);
    let mut cookie = format!("waitroom_shop={shadow}");
    let mut last = 11;
    for step in 1..=30 {
        h.clock.advance(Duration::from_secs(31));
        let resp = h
            .bare()
            .get(h.url("/__waitroom/status?room=shop"))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        if let Some(next) = support::set_cookie(&resp, "waitroom_shop") {
            cookie = format!("waitroom_shop={next}");
        }
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(v["state"], "queued", "step {step}: never let in");
        let position = v["position"].as_u64().unwrap();
        assert!(
            position <= last && position >= 1,
            "step {step}: {position} after {last}: up at the queue's pace, never back"
        );
        last = position;
        // Its page load is no arrival either.
        let (_, _, page) = h.page("/shop/", &[("cookie", &cookie)]).await;
        assert!(page.contains("/__waitroom/status?room=shop"), "step {step}");
    }
    let (active, queued) = h.counts().await;
    assert_eq!((active, queued), (0, 0), "no session, no place, ever");
    // The admin API (and the dashboard) count them for this instance.
    let room: serde_json::Value = h
        .bare()
        .get(h.admin_url("/api/rooms/shop"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(room["fairness"]["shadowed"], 2, "{room}");
    // Two newcomers were shadowed: the JSON one and the page one.
    let metrics = h.metrics().await;
    assert!(
        metrics.contains(r#"waitroom_decisions_total{room="shop",outcome="shadowed"} 2"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_bot_score_counts_only_from_a_trusted_proxy_and_only_as_a_number() {
    let h = daemon().await;
    for score in ["", "abc", "99999999999", "-5", "29.5"] {
        let (status, _, body) = h
            .page(
                "/shop/",
                &[("cf-bot-score", score), ("accept", "application/json")],
            )
            .await;
        assert_eq!(status, 200, "{score:?}: {body}");
    }
    // The first of those was let in and the rest really queued: 4 places.
    assert_eq!(h.counts().await, (1, 4));
    let untrusted = Harness::start(|c| {
        c.rooms[0].total_active_users = 1;
        c.rooms[0].bot_score = Some(BotScore {
            header: http::HeaderName::from_static("cf-bot-score"),
            min: 30,
        });
        c.rooms[0].failed_challenge = FailedChallenge::Shadow;
    })
    .await;
    let (status, _, _) = untrusted.page("/shop/", &[("cf-bot-score", "1")]).await;
    assert_eq!(status, 200);
    assert_eq!(
        untrusted.counts().await,
        (1, 0),
        "an untrusted peer's score is not read"
    );
}

#[tokio::test]
async fn a_forged_proof_of_work_goes_to_the_shadow_queue() {
    let h = Harness::start(|c| {
        c.rooms[0].total_active_users = 1;
        c.rooms[0].proof_of_work = 8;
        c.rooms[0].failed_challenge = FailedChallenge::Shadow;
    })
    .await;
    let (status, _, _) = h.page("/shop/", &[]).await;
    assert_eq!(status, 200);
    // The room queues now: a newcomer is asked for the proof first.
    h.daemon
        .gate()
        .rooms
        .by_id("shop")
        .unwrap()
        .set_queueing(true);
    let json = [("accept", "application/json")];
    let (_, _, asked) = h.page("/shop/", &json).await;
    let v: serde_json::Value = serde_json::from_str(&asked).unwrap();
    assert_eq!(v["state"], "challenge", "{v}");
    let forged = [
        ("accept", "application/json"),
        ("x-waitroom-proof", "w1.shop.1.8.AAAA.BBBB.1"),
    ];
    let (status, ticket, body) = h.page("/shop/", &forged).await;
    assert_eq!(status, 200);
    assert!(ticket.is_some());
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["state"], "queued", "a forged proof looks queued: {v}");
    assert_eq!(h.counts().await, (1, 0), "and holds nothing");
    let metrics = h.metrics().await;
    assert!(metrics.contains(r#"outcome="shadowed"} 1"#), "{metrics}");
}

#[test]
fn a_bot_score_needs_its_minimum_and_the_shadow_queue() {
    let base = "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n[cookie]\nkeys = [\"BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=\"]\n[origin]\nurl = \"http://127.0.0.1:9\"\n[[room]]\nid = \"shop\"\npath = \"/\"\ntotal_active_users = 5\nnew_users_per_minute = 100\n";
    let ok = format!("{base}bot_score_header = \"cf-bot-score\"\nmin_bot_score = 30\nfailed_challenge = \"shadow\"\n");
    let cfg = waitroom::config::from_toml_str(&ok).unwrap();
    assert_eq!(cfg.rooms[0].bot_score.as_ref().map(|b| b.min), Some(30));
    for (bad, key) in [
        (format!("{base}bot_score_header = \"cf-bot-score\"\nfailed_challenge = \"shadow\"\n"), "min_bot_score"),
        (format!("{base}min_bot_score = 30\nfailed_challenge = \"shadow\"\n"), "bot_score_header"),
        (format!("{base}bot_score_header = \"cf-bot-score\"\nmin_bot_score = 30\n"), "failed_challenge"),
        (format!("{base}bot_score_header = \"cf-bot-score\"\nmin_bot_score = 100\nfailed_challenge = \"shadow\"\n"), "min_bot_score"),
        (format!("{base}bot_score_header = \"bad header\"\nmin_bot_score = 30\nfailed_challenge = \"shadow\"\n"), "bot_score_header"),
        (format!("{base}failed_challenge = \"maybe\"\n"), "failed_challenge"),
    ] {
        let err = waitroom::config::from_toml_str(&bad).unwrap_err();
        assert!(err.to_string().contains(key), "{key}: {err}");
    }
}

/// Room "shop" for one asking proof of work of 8 bits, shadowing
/// failures, behind a trusted proxy; one visitor in, and queueing.
async fn proof_room() -> Harness {
    let h = Harness::start(|c| {
        c.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        c.rooms[0].total_active_users = 1;
        c.rooms[0].proof_of_work = 8;
        c.rooms[0].failed_challenge = FailedChallenge::Shadow;
    })
    .await;
    let (status, _, _) = h.page("/shop/", &[]).await;
    assert_eq!(status, 200);
    h.daemon
        .gate()
        .rooms
        .by_id("shop")
        .unwrap()
        .set_queueing(true);
    h
}

/// A solution of the challenge the room hands out now.
async fn solution(h: &Harness) -> String {
    let (_, _, asked) = h.page("/shop/", &[("accept", "application/json")]).await;
    let v: serde_json::Value = serde_json::from_str(&asked).unwrap();
    let challenge = waitroom::gate::proof::Challenge {
        text: v["challenge"]["value"].as_str().unwrap().to_owned(),
        bits: v["challenge"]["bits"].as_u64().unwrap() as u8,
        expires_ms: 0,
    };
    waitroom::gate::proof::solve(&challenge)
}

#[tokio::test]
async fn one_network_handing_a_proof_in_twice_gets_a_fresh_challenge_not_the_shadow() {
    let h = proof_room().await;
    let solved = solution(&h).await;
    // Two tabs sharing cookies, or a double reload: at once.
    let cookie = format!("waitroom_.proof={solved}");
    let send = || {
        h.bare()
            .get(h.url("/shop/"))
            .header("accept", "application/json")
            .header("cookie", &cookie)
            .send()
    };
    let (a, b) = tokio::join!(send(), send());
    let mut answers = Vec::new();
    for resp in [a.unwrap(), b.unwrap()] {
        let ticket = support::set_cookie(&resp, "waitroom_shop");
        let cleared = resp
            .headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.starts_with("waitroom_.proof=;") && v.contains("Max-Age=0"));
        let v: serde_json::Value = resp.json().await.unwrap();
        answers.push((
            v["state"].as_str().unwrap().to_owned(),
            ticket.is_some(),
            cleared,
        ));
    }
    answers.sort();
    assert_eq!(
        answers,
        vec![
            ("challenge".to_owned(), false, true),
            ("queued".to_owned(), true, true),
        ],
        "one real place, one fresh challenge; the spent proof cookie expired in both"
    );
    assert_eq!(h.counts().await, (1, 1));
    // Another network's copy: a replay, the shadow queue.
    let (_, ticket, body) = h
        .page(
            "/shop/",
            &[
                ("accept", "application/json"),
                ("x-forwarded-for", "203.0.113.5"),
                ("x-waitroom-proof", &solved),
            ],
        )
        .await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["state"].as_str(), ticket.is_some()),
        (Some("queued"), true)
    );
    assert_eq!(h.counts().await, (1, 1), "a shadow place");
    let metrics = h.metrics().await;
    assert!(metrics.contains(r#"outcome="shadowed"} 1"#), "{metrics}");
}

#[tokio::test]
async fn a_shadow_ticket_is_a_newcomer_again_once_the_room_stops_queueing() {
    let h = proof_room().await;
    let forged = [
        ("accept", "application/json"),
        ("x-waitroom-proof", "w1.shop.1.8.AAAA.BBBB.1"),
    ];
    let (_, shadow, _) = h.page("/shop/", &forged).await;
    let cookie = format!("waitroom_shop={}", shadow.expect("a shadow ticket"));
    // The room empties and stops queueing.
    let released = h
        .bare()
        .post(h.admin_url("/api/rooms/shop/reset"))
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), 200);
    h.daemon
        .gate()
        .rooms
        .by_id("shop")
        .unwrap()
        .set_queueing(false);
    // No place is shown in a room without a queue: the status says none,
    let status: serde_json::Value = h
        .bare()
        .get(h.url("/__waitroom/status?room=shop"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["state"], "none", "{status}");
    // and the page lets the visitor in, as any newcomer now.
    let resp = h
        .bare()
        .get(h.url("/shop/"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert!(support::from_origin(&resp), "{}", resp.status());
    assert_eq!(h.counts().await, (1, 0));
}

#[tokio::test]
async fn a_bot_score_is_read_only_while_the_room_queues_and_only_when_sent_once() {
    let h = daemon().await;
    // An empty room lets everyone straight in: a low score is not shadowed
    // (its "position 1" would contradict the public status).
    let resp = h
        .bare()
        .get(h.url("/shop/"))
        .header("cf-bot-score", "5")
        .send()
        .await
        .unwrap();
    assert!(support::from_origin(&resp), "{}", resp.status());
    assert_eq!(h.counts().await, (1, 0));
    // Full now, and queueing. Two scores: none is believed (a real place).
    let room = h.daemon.gate().rooms.by_id("shop").unwrap().clone();
    room.set_queueing(true);
    let json = ("accept", "application/json");
    let (_, _, body) = h
        .page(
            "/shop/",
            &[json, ("cf-bot-score", "5"), ("cf-bot-score", "90")],
        )
        .await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["state"], "queued");
    assert_eq!(h.counts().await, (1, 1), "a real place");
    // One low score while the room queues: the shadow queue, behind the one.
    room.saw_queued(1);
    let (_, _, body) = h.page("/shop/", &[json, ("cf-bot-score", "5")]).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["state"].as_str(), v["position"].as_u64()),
        (Some("queued"), Some(2))
    );
    assert_eq!(h.counts().await, (1, 1), "no place");
}

/// Log mode (`failed_challenge = "log"`): the rules are watched before
/// they bite. A low bot score in a queueing room and a forged proof of
/// work are treated as if the shadow rule were off (a real place; a new
/// challenge), and each is counted as `would_shadow` (the metrics; the
/// rooms API and the dashboard show it too), while nothing is shadowed. The config takes "log"
/// beside a bot score.
#[tokio::test]
async fn log_mode_counts_what_the_shadow_rule_would_do_and_does_nothing() {
    let h = Harness::start(|c| {
        c.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        let room = &mut c.rooms[0];
        room.total_active_users = 1;
        room.proof_of_work = 8;
        room.bot_score = Some(BotScore {
            header: http::HeaderName::from_static("cf-bot-score"),
            min: 30,
        });
        room.failed_challenge = FailedChallenge::Log;
    })
    .await;
    let (status, _, _) = h.page("/shop/", &[]).await;
    assert_eq!(status, 200);
    let room = h.daemon.gate().rooms.by_id("shop").unwrap().clone();
    room.set_queueing(true);
    let json = ("accept", "application/json");
    // A low score: not shadowed, asked for the proof like anyone.
    let (_, _, body) = h.page("/shop/", &[json, ("cf-bot-score", "5")]).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["state"], "challenge", "{v}");
    // A forged proof: a new challenge, not the shadow queue.
    let forged = [json, ("x-waitroom-proof", "w1.shop.1.8.AAAA.BBBB.1")];
    let (_, ticket, body) = h.page("/shop/", &forged).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["state"], "challenge", "{v}");
    assert!(ticket.is_none(), "no shadow ticket");
    let metrics = h.metrics().await;
    assert!(
        metrics.contains(r#"outcome="would_shadow"} 2"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"outcome="shadowed"} 0"#), "{metrics}");
    let base = "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n[cookie]\nkeys = [\"BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=\"]\n[origin]\nurl = \"http://127.0.0.1:9\"\n[[room]]\nid = \"shop\"\npath = \"/\"\ntotal_active_users = 5\nnew_users_per_minute = 100\n";
    let logged = format!("{base}bot_score_header = \"cf-bot-score\"\nmin_bot_score = 30\nfailed_challenge = \"log\"\n");
    let cfg = waitroom::config::from_toml_str(&logged).unwrap();
    assert_eq!(cfg.rooms[0].failed_challenge, FailedChallenge::Log);
}
