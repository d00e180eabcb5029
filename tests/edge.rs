//! The edge (docs/how-it-works.md, "Bots, shared tickets and origin
//! trust") as an attacker and an origin see it, over real HTTP:
//! proof of work before a queue place, tickets bound to a network, shared
//! admitted tickets ended, and the origin's signature.

mod support;

use std::time::Duration;

use support::*;
use waitroom::config::Secret;
use waitroom::gate::proof::{self, Challenge};
use waitroom::proxy::sign::Signer;

const COOKIE: &str = "waitroom_shop";

/// A client as seen through a trusted proxy at 127.0.0.1, from `ip`.
fn from(client: &reqwest::Client, url: &str, ip: &str) -> reqwest::RequestBuilder {
    client.get(url).header("x-forwarded-for", ip)
}

async fn harness(tweak: impl FnOnce(&mut waitroom::config::Config)) -> Harness {
    Harness::start(|c| {
        c.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        c.rooms[0].total_active_users = 1;
        tweak(c);
    })
    .await
}

async fn stats(h: &Harness) -> waitroom::store::RoomStats {
    h.store().stats(&h.policy(), h.clock_now()).await.unwrap()
}

/// The challenge in a status JSON.
fn challenge_of(json: &serde_json::Value) -> Challenge {
    assert_eq!(json["state"], "challenge", "{json}");
    let c = &json["challenge"];
    assert_eq!(c["algorithm"], "sha256-leading-zero-bits");
    Challenge {
        text: c["value"].as_str().unwrap().to_owned(),
        bits: c["bits"].as_u64().unwrap() as u8,
        expires_ms: 0,
    }
}

/// The answer to `req` as an app gets it: the status JSON.
async fn as_app(req: reqwest::RequestBuilder) -> serde_json::Value {
    req.header("accept", "application/json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Fills the room (limit 1) so that it queues.
async fn fill(h: &Harness) -> reqwest::Client {
    let first = h.visitor();
    let resp = from(&first, &h.url("/"), "198.51.100.1")
        .send()
        .await
        .unwrap();
    assert!(from_origin(&resp), "the first visitor is admitted at once");
    first
}

#[tokio::test]
async fn no_queue_place_exists_without_a_solved_proof_of_work() {
    let h = harness(|c| {
        c.rooms[0].proof_of_work = 10;
        // Longer than a challenge lives, so the places stay while it lapses.
        c.rooms[0].session_duration = Duration::from_secs(600);
        c.rooms[0].abandon_after = Duration::from_secs(600);
    })
    .await;
    // An empty room asks nothing: no friction while nobody queues.
    let first = fill(&h).await;
    assert_eq!(stats(&h).await.active, 1);
    drop(first);

    // The room is full: from now on new visitors are queued, so challenged.
    let bot = h.bare();
    for i in 0..200 {
        let resp = from(&bot, &h.url("/"), &format!("203.0.113.{}", i % 250))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert!(
            set_cookie(&resp, COOKIE).is_none(),
            "no ticket before the proof"
        );
        let page = resp.text().await.unwrap();
        assert!(page.contains("Checking your browser"), "{page}");
    }
    let s = stats(&h).await;
    assert_eq!(
        (s.active, s.queued),
        (1, 0),
        "200 requests without work hold no place"
    );

    // Apps read the challenge from the JSON and hand the solution back.
    let app = h.visitor();
    let json = as_app(from(&app, &h.url("/"), "192.0.2.10")).await;
    let solution = proof::solve(&challenge_of(&json));
    let resp = from(&app, &h.url("/"), "192.0.2.10")
        .header("x-waitroom-proof", &solution)
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    assert!(
        set_cookie(&resp, COOKIE).is_some(),
        "a ticket once the work is done"
    );
    let json: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(json["state"], "queued", "{json}");
    assert_eq!(stats(&h).await.queued, 1);

    // The same solution again (another client replaying it) is refused.
    let replay = h.bare();
    let resp = from(&replay, &h.url("/"), "192.0.2.11")
        .header("x-waitroom-proof", &solution)
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    assert!(set_cookie(&resp, COOKIE).is_none());
    assert_eq!(
        resp.json::<serde_json::Value>().await.unwrap()["state"],
        "challenge"
    );

    // Forged (bits lowered), for another room, expired, or no work done.
    let fresh = || async { challenge_of(&h.status(&h.bare()).await) };
    let c = fresh().await;
    let forged = format!("{}.0", c.text.replacen(".10.", ".0.", 1));
    let lazy = (0..)
        .map(|i| format!("{}.{i}", c.text))
        .find(|s| proof::leading_zero_bits(s) < 10)
        .unwrap();
    let other_room = proof::solve(&c).replacen("w1.shop.", "w1.shoe.", 1);
    let expired = proof::solve(&fresh().await);
    h.clock.advance(Duration::from_secs(121));
    for bad in [forged, lazy, other_room, expired] {
        let resp = from(&h.bare(), &h.url("/"), "192.0.2.12")
            .header("cookie", format!("{}={bad}", proof::PROOF_COOKIE))
            .send()
            .await
            .unwrap();
        assert!(set_cookie(&resp, COOKIE).is_none(), "{bad} was taken");
    }
    assert_eq!(
        stats(&h).await.queued,
        1,
        "only the one real solution holds a place"
    );

    // The metrics count it.
    let metrics = h.metrics().await;
    assert!(metrics.contains(r#"outcome="challenged""#), "{metrics}");
    assert!(metrics.contains(r#"outcome="proof_refused""#), "{metrics}");
}

#[tokio::test]
async fn the_proof_cookie_never_reaches_the_origin() {
    let h = harness(|c| {
        c.rooms[0].proof_of_work = 4;
        c.rooms[0].session_duration = Duration::from_secs(30);
    })
    .await;
    let _first = fill(&h).await;
    // The room's page, as an app asks for it: the room is full, so a challenge.
    let json = as_app(from(&h.bare(), &h.url("/"), "192.0.2.21")).await;
    let solution = proof::solve(&challenge_of(&json));
    // Solved while the room is full: queued; then room frees and it is admitted.
    let v = h.visitor();
    let resp = from(&v, &h.url("/"), "192.0.2.20")
        .header(
            "cookie",
            format!("{}={solution}; theme=dark", proof::PROOF_COOKIE),
        )
        .send()
        .await
        .unwrap();
    assert!(!from_origin(&resp));
    let ticket = set_cookie(&resp, COOKIE).unwrap();
    h.clock.advance(Duration::from_secs(31));
    let resp = from(&h.bare(), &h.url("/"), "192.0.2.20")
        .header(
            "cookie",
            format!(
                "{COOKIE}={ticket}; {}={solution}; theme=dark",
                proof::PROOF_COOKIE
            ),
        )
        .send()
        .await
        .unwrap();
    assert!(from_origin(&resp), "admitted once the first session ended");
    let echo: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(echo["headers"]["cookie"][0], "theme=dark");
}

#[tokio::test]
async fn a_bound_ticket_is_no_ticket_on_another_network() {
    let h = harness(|c| {
        c.cookie.bind_to_client = true;
        c.rooms[0].total_active_users = 1;
    })
    .await;
    let resp = from(&h.bare(), &h.url("/"), "198.51.100.7")
        .send()
        .await
        .unwrap();
    assert!(from_origin(&resp));
    let admitted = set_cookie(&resp, COOKIE).unwrap();
    let with = |ip: &'static str, ticket: &str| {
        from(&h.bare(), &h.url("/"), ip).header("cookie", format!("{COOKIE}={ticket}"))
    };
    // The same /24: still the visitor (a new address from the same carrier pool).
    assert!(from_origin(
        &with("198.51.100.200", &admitted).send().await.unwrap()
    ));
    // Another network: a new visitor, queued in the full room.
    let resp = with("203.0.113.9", &admitted).send().await.unwrap();
    assert!(
        !from_origin(&resp),
        "a copied admitted ticket passes no more"
    );
    let queued = set_cookie(&resp, COOKIE).unwrap();
    // IPv6 /64.
    assert!(!from_origin(
        &with("2001:db8::1", &admitted).send().await.unwrap()
    ));
    // A copied queue ticket from yet another network gets its own place, behind.
    let json = as_app(with("192.0.2.1", &queued)).await;
    assert_eq!(json["state"], "queued");
    assert!(json["position"].as_u64().unwrap() > 1, "{json}");
    let json = as_app(with("203.0.113.77", &queued)).await;
    assert_eq!(json["position"], 1, "the owner keeps its place: {json}");
}

#[tokio::test]
async fn an_admitted_ticket_shared_across_many_networks_is_ended() {
    // The probe of the issue: one admitted cookie copied to 50 clients.
    let h = harness(|c| c.cookie.max_networks_per_session = 4).await;
    let resp = from(&h.bare(), &h.url("/"), "10.0.0.1")
        .send()
        .await
        .unwrap();
    let cookie = set_cookie(&resp, COOKIE).unwrap();
    let original = admitted_id(resp).await;
    let mut through_with_the_copy = 0;
    for i in 2..=50 {
        let resp = from(&h.bare(), &h.url("/"), &format!("10.0.{i}.1"))
            .header("cookie", format!("{COOKIE}={cookie}"))
            .send()
            .await
            .unwrap();
        if from_origin(&resp) && admitted_id(resp).await == original {
            through_with_the_copy += 1;
        }
        assert!(stats(&h).await.active <= 1, "capacity holds");
    }
    // Networks 2, 3 and 4 (with the owner's, four): a phone moving between
    // networks is fine. The fifth ended the session.
    assert_eq!(through_with_the_copy, 3);
    // The owner keeps going until its next check-in, which finds the
    // session ended: a new visitor, queued behind whoever got the room.
    h.clock.advance(Duration::from_secs(31));
    let resp = from(&h.bare(), &h.url("/"), "10.0.0.1")
        .header("cookie", format!("{COOKIE}={cookie}"))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    assert!(!from_origin(&resp));
    assert_eq!(
        resp.json::<serde_json::Value>().await.unwrap()["state"],
        "queued"
    );
    let metrics = h.metrics().await;
    let shared = metrics
        .lines()
        .find(|l| l.contains(r#"outcome="shared""#))
        .unwrap_or_default()
        .to_owned();
    assert!(!shared.ends_with(" 0"), "{shared}");
}

#[tokio::test]
async fn a_phone_changing_networks_keeps_its_session() {
    let h = harness(|c| c.cookie.max_networks_per_session = 4).await;
    let phone = h.visitor();
    let resp = from(&phone, &h.url("/"), "192.0.2.5").send().await.unwrap();
    let id = admitted_id(resp).await;
    // Wi-Fi, mobile data, Wi-Fi again, mobile again, many times.
    for round in 0..10 {
        let ip = if round % 2 == 0 {
            "100.64.3.9"
        } else {
            "192.0.2.5"
        };
        let resp = from(&phone, &h.url("/"), ip).send().await.unwrap();
        assert_eq!(admitted_id(resp).await, id, "round {round}");
    }
}

#[tokio::test]
async fn the_origin_can_check_a_request_came_through_the_room() {
    const KEY: &str = "an origin signing key of some length";
    let h = harness(|c| {
        c.origin.sign_key = Some(Secret(KEY.into()));
        c.rooms[0].bypass_paths = vec!["/static/".into()];
    })
    .await;
    let resp = from(&h.bare(), &h.url("/"), "192.0.2.30")
        .header("x-waitroom-signature", "t=1,room=shop,v1=forged")
        .send()
        .await
        .unwrap();
    let echo: serde_json::Value = resp.json().await.unwrap();
    let visitor = echo["headers"]["x-waitroom-visitor"][0].as_str().unwrap();
    let signature = echo["headers"]["x-waitroom-signature"][0].as_str().unwrap();
    assert_eq!(
        echo["headers"]["x-waitroom-signature"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let now_s = h.clock_now() / 1000;
    let signer = Signer::new(&Secret(KEY.into()));
    assert_eq!(signer.verify(signature, visitor, now_s, 60), Some("shop"));
    assert_eq!(
        Signer::new(&Secret("another key entirely, also long".into()))
            .verify(signature, visitor, now_s, 60),
        None
    );
    // A bypassed request names no visitor and carries no signature, and
    // the visitor's own is gone.
    let resp = from(&h.bare(), &h.url("/static/app.css"), "192.0.2.30")
        .header("x-waitroom-signature", "t=1,room=shop,v1=forged")
        .send()
        .await
        .unwrap();
    let echo: serde_json::Value = resp.json().await.unwrap();
    assert!(
        echo["headers"].get("x-waitroom-signature").is_none(),
        "{echo}"
    );
}
