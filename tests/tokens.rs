//! Enqueue tokens over real HTTP: one person (a `sub`) holds one place
//! however many browsers and addresses they come from, on one instance or
//! two on one Redis; a `jti` is good once; a token for another room, or
//! expired, or signed with a key the room does not hold is refused; a
//! `required` room turns away newcomers without one with a page saying so.

#[path = "support/redis_server.rs"]
mod redis_server;
mod support;

use std::time::Duration;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::engine::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use support::Harness;
use waitroom::config::{Backend, EnqueueToken};
use waitroom::enqueue::TokenKeys;

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

/// An HS256 token with these claims.
fn token(claims: serde_json::Value, secret: &[u8]) -> String {
    let h = URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256","typ":"JWT"}"#);
    let p = URL_SAFE_NO_PAD.encode(claims.to_string());
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    mac.update(format!("{h}.{p}").as_bytes());
    format!(
        "{h}.{p}.{}",
        URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    )
}

/// Seconds since the epoch of the harness's clock.
fn now_s(h: &Harness) -> u64 {
    h.clock_now() / 1000
}

fn claims(h: &Harness, sub: &str) -> serde_json::Value {
    serde_json::json!({"sub": sub, "room": "shop", "exp": now_s(h) + 600})
}

/// Room "shop" for one, behind a trusted proxy, taking enqueue tokens.
async fn daemon(required: bool, redis: Option<String>) -> Harness {
    Harness::start(move |c| {
        c.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        c.rooms[0].total_active_users = 1;
        c.rooms[0].enqueue_token = Some(EnqueueToken {
            required,
            keys: TokenKeys {
                hmac: vec![SECRET.to_vec()],
                public: vec![],
            },
            jwks_url: None,
            rules: waitroom::enqueue::Rules::for_room("shop"),
        });
        if let Some(url) = redis {
            c.store.backend = Backend::Redis { urls: vec![url] };
        }
    })
    .await
}

/// (status, the room's cookie, body) of `path` from address `ip` (as the
/// trusted proxy names it).
async fn get(
    h: &Harness,
    path: &str,
    ip: &str,
    headers: &[(&str, &str)],
) -> (u16, Option<String>, String) {
    let mut all = vec![("x-forwarded-for", ip)];
    all.extend_from_slice(headers);
    h.page(path, &all).await
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_default()
}

const JSON: (&str, &str) = ("accept", "application/json");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_person_from_fifty_browsers_and_fifty_addresses_holds_one_place() {
    let h = daemon(false, None).await;
    let (status, _, _) = get(&h, "/shop/", "198.51.100.1", &[]).await;
    assert_eq!(status, 200, "someone without a token fills the room");
    let t = token(claims(&h, "user-42"), SECRET);
    let path = format!("/shop/?waitroom_token={t}");
    let mut positions = Vec::new();
    for i in 0..20 {
        // Twenty browsers (no cookies), twenty addresses, the link's
        // token: four at once, then one every two seconds (a member's
        // arrivals are spaced out, `gate::limits`).
        if i >= 4 {
            h.clock.advance(Duration::from_secs(2));
        }
        let ip = format!("203.0.113.{}", i + 1);
        let (status, cookie, body) = get(&h, &path, &ip, &[JSON]).await;
        assert_eq!(status, 200, "{body}");
        assert!(cookie.is_some());
        let v = json(&body);
        assert_eq!(v["state"], "queued", "{v}");
        positions.push(v["position"].as_u64().unwrap());
    }
    assert!(positions.iter().all(|&p| p == 1), "{positions:?}");
    // Thirty more at once, from thirty addresses: each costs the store a
    // lookup of the member's place, so they are told to come back (429),
    // and none gets a place.
    for i in 20..50 {
        let ip = format!("203.0.113.{}", i + 1);
        let (status, cookie, body) = get(&h, &path, &ip, &[JSON]).await;
        assert_eq!((status, cookie), (429, None), "{body}");
    }
    assert_eq!(h.counts().await, (1, 1), "one place for the one person");
    // Another person with a token of their own gets a place of their own.
    let other = token(claims(&h, "user-43"), SECRET);
    let (_, _, body) = get(
        &h,
        "/shop/",
        "203.0.113.99",
        &[JSON, ("x-waitroom-token", &other)],
    )
    .await;
    assert_eq!(json(&body)["position"], 2);
    let metrics = h.metrics().await;
    assert!(
        metrics.contains(r#"outcome="token_verified"} 21"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"outcome="token_folded"} 19"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"outcome="limited"} 30"#), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_person_holds_one_place_across_two_instances_on_one_redis() {
    let server = tokio::task::spawn_blocking(redis_server::RedisServer::start)
        .await
        .unwrap();
    let a = daemon(false, Some(server.url())).await;
    let b = daemon(false, Some(server.url())).await;
    let (status, _, _) = get(&a, "/shop/", "198.51.100.1", &[]).await;
    assert_eq!(status, 200);
    let t = token(claims(&a, "user-7"), SECRET);
    let mut positions = Vec::new();
    for (i, h) in [&a, &b, &a, &b].into_iter().enumerate() {
        let ip = format!("203.0.113.{}", i + 1);
        let (_, _, body) = get(h, "/shop/", &ip, &[JSON, ("x-waitroom-token", &t)]).await;
        positions.push((
            json(&body)["state"].clone(),
            json(&body)["position"].clone(),
        ));
    }
    assert!(
        positions.iter().all(|p| p.0 == "queued" && p.1 == 1),
        "{positions:?}"
    );
    assert_eq!(a.counts().await, (1, 1));
}

#[tokio::test]
async fn a_token_is_refused_when_replayed_foreign_expired_or_forged() {
    let h = daemon(false, None).await;
    let once = token(
        serde_json::json!({"sub": "u1", "room": "shop", "exp": now_s(&h) + 600, "jti": "j-1"}),
        SECRET,
    );
    let (status, _, _) = get(
        &h,
        "/shop/",
        "203.0.113.1",
        &[JSON, ("x-waitroom-token", &once)],
    )
    .await;
    assert_eq!(status, 200, "first use");
    // (Past the window in which a copy is the same arrival.)
    h.clock.advance(Duration::from_secs(11));
    let refused = [
        ("replayed", once.clone()),
        (
            "another room",
            token(
                serde_json::json!({"sub": "u2", "room": "vip", "exp": now_s(&h) + 600}),
                SECRET,
            ),
        ),
        (
            "expired",
            token(
                serde_json::json!({"sub": "u3", "room": "shop", "exp": now_s(&h) - 1}),
                SECRET,
            ),
        ),
        (
            "an unknown key",
            token(claims(&h, "u4"), b"another secret of thirty-two bytes!"),
        ),
        (
            "another address",
            token(
                serde_json::json!({"sub": "u5", "room": "shop", "exp": now_s(&h) + 600, "ip": "192.0.2.1"}),
                SECRET,
            ),
        ),
        (
            "not valid before an hour from now",
            token(
                serde_json::json!({"sub": "u7", "room": "shop", "exp": now_s(&h) + 7200, "nbf": now_s(&h) + 3600}),
                SECRET,
            ),
        ),
        (
            "living for ever",
            token(
                serde_json::json!({"sub": "u8", "room": "shop", "exp": u64::MAX}),
                SECRET,
            ),
        ),
        (
            "living longer than a day",
            token(
                serde_json::json!({"sub": "u8", "room": "shop", "exp": now_s(&h) + 86_401}),
                SECRET,
            ),
        ),
        (
            "another audience",
            token(
                serde_json::json!({"sub": "u9", "room": "shop", "aud": "billing", "exp": now_s(&h) + 600}),
                SECRET,
            ),
        ),
        (
            "alg none",
            format!(
                "{}.{}.",
                URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
                URL_SAFE_NO_PAD.encode(claims(&h, "u6").to_string())
            ),
        ),
    ];
    for (why, t) in refused {
        let (status, cookie, body) = get(
            &h,
            "/shop/",
            "203.0.113.2",
            &[JSON, ("x-waitroom-token", &t)],
        )
        .await;
        assert_eq!((status, cookie), (403, None), "{why}: {body}");
        assert_eq!(json(&body)["state"], "token_refused", "{why}");
    }
    assert_eq!(h.counts().await, (1, 0), "no refused token made a place");
    let metrics = h.metrics().await;
    assert!(
        metrics.contains(r#"outcome="token_replayed"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"outcome="token_refused"} 9"#),
        "{metrics}"
    );
    // The address bound in the token, from that address: good.
    let bound = token(
        serde_json::json!({"sub": "u5", "room": "shop", "exp": now_s(&h) + 600, "ip": "192.0.2.1"}),
        SECRET,
    );
    let (status, _, body) = get(
        &h,
        "/shop/",
        "192.0.2.1",
        &[JSON, ("x-waitroom-token", &bound)],
    )
    .await;
    assert_eq!(
        (status, json(&body)["state"].as_str()),
        (200, Some("queued"))
    );
    // Valid from within the minute's leeway, for the room by `aud`: good.
    let soon = token(
        serde_json::json!({"sub": "u10", "room": "shop", "aud": ["shop", "billing"], "exp": now_s(&h) + 600, "nbf": now_s(&h) + 30}),
        SECRET,
    );
    let (status, _, body) = get(
        &h,
        "/shop/",
        "203.0.113.3",
        &[JSON, ("x-waitroom-token", &soon)],
    )
    .await;
    assert_eq!(
        (status, json(&body)["state"].as_str()),
        (200, Some("queued")),
        "{body}"
    );
}

#[tokio::test]
async fn a_required_token_turns_away_newcomers_without_one_in_their_language() {
    let h = daemon(true, None).await;
    let (status, cookie, body) =
        get(&h, "/shop/", "203.0.113.1", &[("accept-language", "de")]).await;
    assert_eq!((status, cookie), (403, None));
    assert!(body.contains("Nur für eingeladene Besucher"), "{body}");
    let (status, _, body) = get(&h, "/shop/", "203.0.113.1", &[JSON]).await;
    assert_eq!(status, 403);
    assert_eq!(json(&body)["error"], "an enqueue token is required");
    assert_eq!(h.counts().await, (0, 0));
    // With one: in, and its ticket carries it from then on.
    let t = token(claims(&h, "u1"), SECRET);
    let (status, cookie, _) = get(
        &h,
        &format!("/shop/?waitroom_token={t}"),
        "203.0.113.1",
        &[],
    )
    .await;
    assert_eq!(status, 303, "read, then the same address without it");
    let cookie = format!("waitroom_shop={}", cookie.unwrap());
    h.clock.advance(Duration::from_secs(1));
    let (status, _, _) = get(&h, "/shop/next", "203.0.113.1", &[("cookie", &cookie)]).await;
    assert_eq!(status, 200, "the ticket carries the member on");
    assert_eq!(h.counts().await, (1, 0));
}

#[test]
fn the_keys_come_from_the_environment_and_a_jwks_file() {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(
        &jwks,
        format!(
            r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","kid":"k1","x":"{}"}}]}}"#,
            URL_SAFE_NO_PAD.encode([9u8; 32])
        ),
    )
    .unwrap();
    let base = "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n[cookie]\nkeys = [\"BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=\"]\n[origin]\nurl = \"http://127.0.0.1:9\"\n[[room]]\nid = \"shop\"\npath = \"/\"\ntotal_active_users = 5\nnew_users_per_minute = 100\n[room.enqueue_token]\n";
    let secret = STANDARD.encode(SECRET);
    let env = move |name: &str| (name == "ENQUEUE_KEYS").then(|| secret.clone());
    let load =
        |extra: &str| waitroom::config::from_toml_str_with_env(&format!("{base}{extra}"), &env);
    let cfg = load(&format!(
        "mode = \"required\"\nhmac_keys_env = \"ENQUEUE_KEYS\"\njwks_file = {:?}\n",
        jwks.display().to_string()
    ))
    .unwrap();
    let t = cfg.rooms[0].enqueue_token.as_ref().unwrap();
    assert!(t.required);
    assert_eq!((t.keys.hmac.len(), t.keys.public.len()), (1, 1));
    // Audience, issuer and lifetime: `aud` then required (the room id or
    // the audience), `iss` required, an hour at most.
    let cfg = load(
        "hmac_keys_env = \"ENQUEUE_KEYS\"\naudience = [\"https://shop.example\"]\nissuer = [\"https://login.example\"]\nmax_lifetime = \"1h\"\n",
    )
    .unwrap();
    let t = cfg.rooms[0].enqueue_token.as_ref().unwrap();
    let now = 1_700_000_000;
    let check = |claims: serde_json::Value| {
        waitroom::enqueue::verify(&token(claims, SECRET), &t.keys, &t.rules, now)
    };
    let iss = "https://login.example";
    assert!(check(serde_json::json!({"sub": "a", "room": "shop", "exp": now + 60, "aud": "https://shop.example", "iss": iss})).is_ok());
    assert!(check(
        serde_json::json!({"sub": "a", "room": "shop", "exp": now + 60, "aud": "shop", "iss": iss})
    )
    .is_ok());
    use waitroom::enqueue::TokenError;
    for (claims, why) in [
        (
            serde_json::json!({"sub": "a", "room": "shop", "exp": now + 60, "iss": iss}),
            TokenError::Audience,
        ),
        (
            serde_json::json!({"sub": "a", "room": "shop", "exp": now + 60, "aud": "shop"}),
            TokenError::Issuer,
        ),
        (
            serde_json::json!({"sub": "a", "room": "shop", "exp": now + 3601, "aud": "shop", "iss": iss}),
            TokenError::TooLong,
        ),
    ] {
        assert_eq!(check(claims.clone()), Err(why), "{claims}");
    }
    assert!(load("mode = \"off\"\n").unwrap().rooms[0]
        .enqueue_token
        .is_none());
    for (extra, key) in [
        ("mode = \"optional\"\n", "enqueue_token"),
        (
            "mode = \"sometimes\"\nhmac_keys_env = \"ENQUEUE_KEYS\"\n",
            "mode",
        ),
        ("hmac_keys_env = \"UNSET_KEYS\"\n", "hmac_keys_env"),
        ("jwks_file = \"/nonexistent/jwks.json\"\n", "jwks_file"),
        (
            "hmac_keys_env = \"ENQUEUE_KEYS\"\nmax_lifetime = \"5s\"\n",
            "max_lifetime",
        ),
        (
            "hmac_keys_env = \"ENQUEUE_KEYS\"\naudience = [\"\"]\n",
            "audience",
        ),
        (
            "hmac_keys_env = \"ENQUEUE_KEYS\"\nissuer = [\"a\\u0000b\"]\n",
            "issuer",
        ),
    ] {
        let err = load(extra).unwrap_err();
        assert!(err.to_string().contains(key), "{key}: {err}");
    }
}

#[tokio::test]
async fn a_token_passed_round_many_networks_is_a_shared_ticket() {
    let h = daemon(false, None).await;
    let t = token(claims(&h, "bob"), SECRET);
    // Four networks (cookie.max_networks_per_session) are one person
    // moving about; the fifth is a token passed round.
    for n in 1..=4 {
        let ip = format!("198.51.{n}.7");
        let (status, _, body) = get(&h, "/shop/", &ip, &[JSON, ("x-waitroom-token", &t)]).await;
        assert_eq!(status, 200, "network {n}: {body}");
    }
    // (Past the member's burst of arrivals.)
    h.clock.advance(Duration::from_secs(2));
    let (status, cookie, body) = get(
        &h,
        "/shop/",
        "198.51.5.7",
        &[JSON, ("x-waitroom-token", &t)],
    )
    .await;
    assert_eq!((status, cookie), (403, None), "{body}");
    assert_eq!(json(&body)["state"], "token_refused");
    let metrics = h.metrics().await;
    assert!(metrics.contains(r#"outcome="shared"} 1"#), "{metrics}");
}

/// What a browser is answered at `path` from a trusted proxy's client
/// `ip`, without following redirects.
async fn browse(h: &Harness, path: &str, cookie: Option<&str>) -> reqwest::Response {
    let mut req = h
        .bare()
        .get(h.url(path))
        .header("x-forwarded-for", "203.0.113.50")
        .header("accept", "text/html");
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn a_token_in_the_link_is_read_then_left_out_of_every_address_the_origin_sees() {
    let h = daemon(true, None).await;
    let t = token(claims(&h, "u1"), SECRET);
    // Read: the member is let in, and sent to the address without it,
    // every other byte of the query as written.
    let first = browse(
        &h,
        &format!("/shop/p?a=%2F+x&waitroom_token={t}&b&c="),
        None,
    )
    .await;
    assert_eq!(first.status(), 303);
    assert_eq!(first.headers()["location"], "/shop/p?a=%2F+x&b&c=");
    assert_eq!(first.headers()["referrer-policy"], "no-referrer");
    let cookie = format!(
        "waitroom_shop={}",
        support::set_cookie(&first, "waitroom_shop").expect("the ticket")
    );
    let there = browse(&h, "/shop/p?a=%2F+x&b&c=", Some(&cookie)).await;
    assert!(support::from_origin(&there), "{}", there.status());
    let echo: serde_json::Value = there.json().await.unwrap();
    assert_eq!(echo["uri"], "/shop/p?a=%2F+x&b&c=");
    // Whatever else the daemon forwards (an app's request, a bypassed
    // path, another method) reaches the origin without them too.
    let app = h
        .bare()
        .post(h.url(&format!("/shop/api?waitroom_code=C&x=1&waitroom_token={t}")))
        .header("cookie", &cookie)
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    assert!(support::from_origin(&app), "{}", app.status());
    let echo: serde_json::Value = app.json().await.unwrap();
    assert_eq!(echo["uri"], "/shop/api?x=1");
    let asset = browse(&h, &format!("/static/app.css?waitroom_token={t}"), None).await;
    assert!(support::from_origin(&asset));
    let echo: serde_json::Value = asset.json().await.unwrap();
    assert_eq!(echo["uri"], "/static/app.css");
    // A refused token's page passes no Referer on either.
    let refused = browse(&h, "/shop/?waitroom_token=forged", None).await;
    assert_eq!(refused.status(), 403);
    assert_eq!(refused.headers()["referrer-policy"], "no-referrer");
}

/// A token with a `jti` handed in twice at once (a double click, two tabs,
/// a retried request) is one arrival: both copies get the member's one
/// place, and the `jti` is spent once. Past ten seconds from its first
/// use, a copy is a replay. Before, the second copy was refused (403), and
/// whichever answer the browser kept decided whether the person had a
/// place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_handed_in_twice_at_once_is_one_arrival() {
    let h = daemon(true, None).await;
    let (status, _, _) = get(
        &h,
        "/shop/",
        "198.51.100.1",
        &[
            JSON,
            ("x-waitroom-token", &token(claims(&h, "first"), SECRET)),
        ],
    )
    .await;
    assert_eq!(status, 200, "someone fills the room");
    let t = token(
        serde_json::json!({"sub": "u9", "room": "shop", "exp": now_s(&h) + 600, "jti": "click-1"}),
        SECRET,
    );
    let headers = [JSON, ("x-waitroom-token", t.as_str())];
    let (a, b) = tokio::join!(
        get(&h, "/shop/", "203.0.113.7", &headers),
        get(&h, "/shop/", "203.0.113.7", &headers),
    );
    for (status, cookie, body) in [&a, &b] {
        assert_eq!(*status, 200, "{body}");
        assert!(cookie.is_some(), "{body}");
        assert_eq!(json(body)["position"], 1, "{body}");
    }
    h.clock.advance(Duration::from_secs(5));
    let (status, _, body) = get(&h, "/shop/", "203.0.113.8", &headers).await;
    assert_eq!(
        (status, json(&body)["position"].as_u64()),
        (200, Some(1)),
        "within the window: {body}"
    );
    assert_eq!(h.counts().await, (1, 1), "one place");
    h.clock.advance(Duration::from_secs(6));
    let (status, cookie, body) = get(&h, "/shop/", "203.0.113.9", &headers).await;
    assert_eq!((status, cookie), (403, None), "a replay: {body}");
    assert!(h.metrics().await.contains(r#"outcome="token_replayed"} 1"#));
}
