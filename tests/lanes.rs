//! Priority lanes over real HTTP: a code or a token's claim puts a
//! newcomer in its lane; the lanes share the admissions as configured and
//! keep arrival order inside; nobody's shown position goes back when
//! someone enters a lane; the page and the JSON say which lane; a
//! single-use code works once across two instances on one Redis; a
//! presale window lets only the lanes in until its end, on every instance,
//! and an event's window counts from the event's start.

#[path = "support/redis_server.rs"]
mod redis_server;
mod support;

use std::collections::HashSet;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::engine::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use support::Harness;
use waitroom::config::{Backend, EnqueueToken, LaneConfig, Secret};
use waitroom::domain::digest64;
use waitroom::enqueue::TokenKeys;
use waitroom::store::{End, VisitorId};

const MEMBERS: &str = "MEMBERS-2026";
const ONCE: &str = "ONE-TIME-7Q2";
const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

/// Room "shop" for one, behind a trusted proxy, with a lane "presale"
/// (30%: a multi-use code, a single-use code, and tokens claiming it).
async fn daemon(redis: Option<String>) -> Harness {
    daemon_with(redis, |_| {}).await
}

/// `daemon`, with `tweak` applied last.
async fn daemon_with(
    redis: Option<String>,
    tweak: impl FnOnce(&mut waitroom::config::Config),
) -> Harness {
    Harness::start(move |c| {
        c.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        let room = &mut c.rooms[0];
        room.total_active_users = 1;
        room.enqueue_token = Some(EnqueueToken {
            required: false,
            keys: TokenKeys {
                hmac: vec![SECRET.to_vec()],
                public: vec![],
            },
            jwks_url: None,
            rules: waitroom::enqueue::Rules::for_room("shop"),
        });
        room.lanes = vec![LaneConfig {
            name: "presale".into(),
            share: 300,
            codes: HashSet::from([digest64(MEMBERS)]),
            single_use: HashSet::from([digest64(ONCE)]),
            token_claim: true,
        }];
        if let Some(url) = redis {
            c.store.backend = Backend::Redis { urls: vec![url] };
        }
        tweak(c);
    })
    .await
}

/// One browser: its own cookies, its own address.
struct Browser {
    client: reqwest::Client,
    ip: String,
}

impl Browser {
    fn new(n: usize) -> Self {
        Self {
            client: reqwest::Client::builder()
                .cookie_store(true)
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            ip: format!("203.0.{}.{}", n / 200, n % 200 + 1),
        }
    }

    /// The room's answer to `path`, as JSON.
    async fn json(&self, h: &Harness, path: &str, headers: &[(&str, &str)]) -> serde_json::Value {
        let mut req = self
            .client
            .get(h.url(path))
            .header("x-forwarded-for", &self.ip)
            .header("accept", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send().await.unwrap();
        resp.json().await.unwrap_or_default()
    }

    /// A poll, as the page's script makes it.
    async fn poll(&self, h: &Harness) -> serde_json::Value {
        self.json(h, "/__waitroom/status?room=shop", &[]).await
    }

    /// The id the origin knows this admitted browser by.
    async fn admitted_id(&self, h: &Harness) -> VisitorId {
        let resp = self
            .client
            .get(h.url("/shop/"))
            .header("x-forwarded-for", &self.ip)
            .send()
            .await
            .unwrap();
        support::admitted_id(resp).await
    }
}

fn token(claims: serde_json::Value) -> String {
    let h = URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256","typ":"JWT"}"#);
    let p = URL_SAFE_NO_PAD.encode(claims.to_string());
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET).unwrap();
    mac.update(format!("{h}.{p}").as_bytes());
    format!(
        "{h}.{p}.{}",
        URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_share_admissions_keep_fifo_and_move_nobody_back() {
    let h = daemon(None).await;
    let holder = Browser::new(0);
    assert!(holder.json(&h, "/shop/", &[]).await["headers"].is_object());
    // Ten in the general queue, then ten with the presale code,
    // alternating arrivals; every position is within its own line.
    let mut general = Vec::new();
    let mut presale = Vec::new();
    for i in 0..10 {
        let g = Browser::new(1 + 2 * i);
        let v = g.json(&h, "/shop/", &[]).await;
        assert_eq!(
            (v["state"].as_str(), v["position"].as_u64()),
            (Some("queued"), Some(i as u64 + 1)),
            "{v}"
        );
        assert!(
            v.get("lane").is_none(),
            "the general queue names no lane: {v}"
        );
        general.push(g);
        let p = Browser::new(2 + 2 * i);
        let v = p
            .json(&h, &format!("/shop/?waitroom_code={MEMBERS}"), &[])
            .await;
        assert_eq!(v["lane"], "presale", "{v}");
        assert_eq!(v["position"].as_u64(), Some(i as u64 + 1), "{v}");
        presale.push(p);
    }
    // Positions before any admission: a lane's arrivals moved nobody in
    // the general queue.
    h.clock.advance(Duration::from_secs(5));
    for (i, g) in general.iter().enumerate() {
        let v = g.poll(&h).await;
        assert_eq!(v["position"].as_u64(), Some(i as u64 + 1), "{v}");
        assert_eq!(v["queue_length"].as_u64(), Some(10), "{v}");
    }
    let mut inside = holder.admitted_id(&h).await;
    let mut shown: Vec<u64> = vec![u64::MAX; 20];
    let mut let_in = Vec::new();
    for _ in 0..10 {
        h.clock.advance(Duration::from_secs(5));
        let now = h.clock_now();
        assert!(h
            .store()
            .end(&h.policy(), inside, End::Release, now)
            .await
            .unwrap());
        let mut admitted = None;
        for (lane, line) in [(0, &general), (1, &presale)] {
            for (i, b) in line.iter().enumerate() {
                let v = b.poll(&h).await;
                match v["state"].as_str() {
                    Some("queued") => {
                        let at = v["position"].as_u64().unwrap();
                        let k = lane * 10 + i;
                        assert!(
                            at <= shown[k],
                            "a position went back: {at} after {}",
                            shown[k]
                        );
                        shown[k] = at;
                    }
                    Some("admitted") if shown[lane * 10 + i] != 0 => {
                        assert!(admitted.is_none(), "two let in for one place");
                        // FIFO within the lane: the first still waiting.
                        let before = line[..i].len();
                        assert_eq!(
                            (0..before).filter(|&j| shown[lane * 10 + j] != 0).count(),
                            0,
                            "lane {lane}: {i} let in before an earlier arrival"
                        );
                        shown[lane * 10 + i] = 0;
                        admitted = Some((lane, i));
                    }
                    Some("admitted") => {}
                    other => panic!("{other:?}: {v}"),
                }
            }
        }
        let (lane, i) = admitted.expect("one let in per freed place");
        let_in.push(lane);
        let line = if lane == 0 { &general } else { &presale };
        inside = line[i].admitted_id(&h).await;
    }
    let from_lane = let_in.iter().filter(|&&l| l == 1).count();
    assert_eq!(from_lane, 3, "30% of ten admissions: {let_in:?}");
    let metrics = h.metrics().await;
    assert!(
        metrics.contains(
            r#"waitroom_lane_decisions_total{room="shop",lane="presale",outcome="entered"} 10"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"waitroom_lane_decisions_total{room="shop",lane="presale",outcome="admitted"} 3"#
        ),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_says_the_lane_and_a_token_claim_enters_it() {
    let h = daemon(None).await;
    let holder = Browser::new(0);
    holder.json(&h, "/shop/", &[]).await;
    let (status, cookie, _) = h
        .page(
            &format!("/shop/?waitroom_code={MEMBERS}"),
            &[
                ("x-forwarded-for", "203.0.113.5"),
                ("accept-language", "de"),
            ],
        )
        .await;
    // Read, then the page at the address without the code.
    assert_eq!(status, 303);
    let cookie = format!("waitroom_shop={}", cookie.expect("the queue ticket"));
    let (status, _, body) = h
        .page(
            "/shop/",
            &[
                ("x-forwarded-for", "203.0.113.5"),
                ("accept-language", "de"),
                ("cookie", &cookie),
            ],
        )
        .await;
    assert_eq!(status, 200);
    assert!(
        body.contains(r#"<p id="wr-lane">Vorrangige Warteschlange: presale</p>"#),
        "{body}"
    );
    let claims = serde_json::json!({
        "sub": "member-1", "room": "shop", "exp": h.clock_now() / 1000 + 600, "lane": "presale",
    });
    let b = Browser::new(7);
    let v = b
        .json(&h, "/shop/", &[("x-waitroom-token", &token(claims))])
        .await;
    assert_eq!(
        (v["lane"].as_str(), v["position"].as_u64()),
        (Some("presale"), Some(2)),
        "{v}"
    );
    // A claim naming a lane the room does not have is the general queue.
    let claims = serde_json::json!({
        "sub": "member-2", "room": "shop", "exp": h.clock_now() / 1000 + 600, "lane": "staff",
    });
    let v = Browser::new(8)
        .json(&h, "/shop/", &[("x-waitroom-token", &token(claims))])
        .await;
    assert!(v.get("lane").is_none(), "{v}");
    // An unknown code too, counted.
    let v = Browser::new(9)
        .json(&h, "/shop/?waitroom_code=GUESS", &[])
        .await;
    assert!(v.get("lane").is_none(), "{v}");
    let metrics = h.metrics().await;
    assert!(
        metrics.contains(r#"outcome="lane_code_refused"} 1"#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_use_code_works_once_across_two_instances_on_one_redis() {
    let server = tokio::task::spawn_blocking(redis_server::RedisServer::start)
        .await
        .unwrap();
    let a = daemon(Some(server.url())).await;
    let b = daemon(Some(server.url())).await;
    Browser::new(0).json(&a, "/shop/", &[]).await;
    let first = Browser::new(1)
        .json(&a, &format!("/shop/?waitroom_code={ONCE}"), &[])
        .await;
    assert_eq!(first["lane"], "presale", "{first}");
    // The same code at the other instance, from another browser and
    // address, and again at the first: the general queue.
    for (h, n) in [(&b, 2), (&a, 3)] {
        let again = Browser::new(n)
            .json(h, &format!("/shop/?waitroom_code={ONCE}"), &[])
            .await;
        assert_eq!(again["state"], "queued", "{again}");
        assert!(again.get("lane").is_none(), "a used code: {again}");
    }
    let stats = a.store().stats(&a.policy(), a.clock_now()).await.unwrap();
    assert_eq!((stats.queued, stats.lane_queued[0]), (3, 1));
    // The holder of the code keeps its place in the lane as it polls.
    assert!(b
        .metrics()
        .await
        .contains(r#"outcome="lane_code_refused"} 1"#));
}

/// A presale window (`lanes_only_until`) on two instances sharing one
/// Redis: before its end a code holder gets in at once while the room has
/// room, and a general visitor waits, shown a countdown to the end; once
/// the clocks pass it, the general visitor is let in, and both instances
/// say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_presale_window_lets_code_holders_in_first_on_every_instance() {
    let server = tokio::task::spawn_blocking(redis_server::RedisServer::start)
        .await
        .unwrap();
    let until = support::T0 + 40_000;
    let windowed = |c: &mut waitroom::config::Config| {
        c.rooms[0].total_active_users = 5;
        c.rooms[0].lanes_only_until_ms = until;
    };
    let a = daemon_with(Some(server.url()), windowed).await;
    let b = daemon_with(Some(server.url()), windowed).await;
    let general = Browser::new(1);
    let v = general.json(&a, "/shop/", &[]).await;
    assert_eq!(
        (v["state"].as_str(), v["position"].as_u64()),
        (Some("queued"), Some(1)),
        "an empty room, but the general queue waits: {v}"
    );
    assert_eq!(v["general_from"], "2027-01-15T08:00:40Z", "{v}");
    assert!(v["eta_seconds"].as_u64().unwrap() >= 40, "{v}");
    let member = Browser::new(2);
    let m = member
        .json(&b, &format!("/shop/?waitroom_code={MEMBERS}"), &[])
        .await;
    assert_eq!(m["served"], "/shop", "a code holder gets in: {m}");
    // Up to the end, at either instance, the general visitor waits, its
    // countdown shrinking with the clock.
    for step in 1..4 {
        a.clock.advance(Duration::from_secs(10));
        b.clock.advance(Duration::from_secs(10));
        let h = if step % 2 == 0 { &a } else { &b };
        let v = general.poll(h).await;
        assert_eq!(v["state"], "queued", "step {step}: {v}");
        assert!(v["eta_seconds"].as_u64().unwrap() >= 40 - 10 * step, "{v}");
    }
    a.clock.advance(Duration::from_secs(10));
    b.clock.advance(Duration::from_secs(10));
    let v = general.poll(&b).await;
    assert_eq!(v["state"], "admitted", "from the end the shares apply: {v}");
    assert!(v.get("general_from").is_none(), "{v}");
    let v = general.poll(&a).await;
    assert_eq!(v["state"], "admitted", "the other instance agrees: {v}");
    let stats = a.store().stats(&a.policy(), a.clock_now()).await.unwrap();
    assert_eq!((stats.active, stats.queued), (2, 0));
}

/// A presale window on an event (`lanes_only_for`): before the event the
/// room lets everyone in as usual; from the event's start, for the
/// window's length, a code holder gets in while a general visitor waits,
/// shown when the general queue moves; from the window's end the shares
/// apply. The clock is moved, nothing sleeps; on the memory store and
/// on Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_presale_window_on_an_event_counts_from_its_start() {
    let server = tokio::task::spawn_blocking(redis_server::RedisServer::start)
        .await
        .unwrap();
    for redis in [None, Some(server.url())] {
        an_events_window(redis).await;
    }
}

/// `a_presale_window_on_an_event_counts_from_its_start` on one store.
async fn an_events_window(redis: Option<String>) {
    let start = support::T0 + 60_000;
    let h = daemon_with(redis, |c| {
        c.rooms[0].total_active_users = 5;
        c.rooms[0].events = vec![waitroom::config::EventConfig {
            spec: waitroom::domain::EventSpec {
                name: "drop".into(),
                prequeue_start_ms: None,
                start_ms: start,
                end_ms: start + 600_000,
                shuffle_at_start: false,
                lanes_only_for_ms: Some(40_000),
                settings: waitroom::domain::Settings::default(),
                notice: None,
            },
            template: None,
        }];
    })
    .await;
    let early = Browser::new(1);
    let v = early.json(&h, "/shop/", &[]).await;
    assert_eq!(v["served"], "/shop", "before the event, no window: {v}");
    assert_eq!(h.policy().lanes.only_until_ms, 0);
    let event = &h.room_json("shop").await["events"][0];
    assert_eq!(event["lanes_only_for_seconds"], 40, "{event}");

    h.clock.advance(Duration::from_secs(60));
    assert_eq!(h.policy().lanes.only_until_ms, start + 40_000);
    let general = Browser::new(2);
    let v = general.json(&h, "/shop/", &[]).await;
    assert_eq!(
        (v["state"].as_str(), v["position"].as_u64()),
        (Some("queued"), Some(1)),
        "the event has started, the room has room, but the general queue waits: {v}"
    );
    assert_eq!(v["general_from"], "2027-01-15T08:01:40Z", "{v}");
    assert!(v["eta_seconds"].as_u64().unwrap() >= 40, "{v}");
    let member = Browser::new(3);
    let m = member
        .json(&h, &format!("/shop/?waitroom_code={MEMBERS}"), &[])
        .await;
    assert_eq!(m["served"], "/shop", "a code holder gets in: {m}");

    h.clock.advance(Duration::from_millis(39_999));
    let v = general.poll(&h).await;
    assert_eq!(v["state"], "queued", "a millisecond before the end: {v}");
    assert_eq!(v["general_from"], "2027-01-15T08:01:40Z", "{v}");
    h.clock.advance(Duration::from_millis(1));
    let v = general.poll(&h).await;
    assert_eq!(v["state"], "admitted", "from the end the shares apply: {v}");
    assert!(v.get("general_from").is_none(), "{v}");
    let stats = h.store().stats(&h.policy(), h.clock_now()).await.unwrap();
    assert_eq!(stats.queued, 0, "{stats:?}");
}

/// An attacker's spellings of a code: another case, padding inside, a
/// second parameter, the header beside the link, and twenty browsers at
/// once with one single-use code: the code as issued enters, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_code_enters_only_as_issued_and_a_single_use_one_only_once_at_once() {
    let h = daemon(None).await;
    Browser::new(0).json(&h, "/shop/", &[]).await;
    let lane_of = |v: &serde_json::Value| v.get("lane").and_then(|l| l.as_str()).map(str::to_owned);
    for (n, path, headers) in [
        (1, "/shop/?waitroom_code=members-2026".to_owned(), vec![]),
        (2, "/shop/?waitroom_code=MEMBERS%2D2026".to_owned(), vec![]),
        (3, "/shop/?waitroom_code=MEMBERS-%202026".to_owned(), vec![]),
        (4, "/shop/?WAITROOM_CODE=MEMBERS-2026".to_owned(), vec![]),
        (
            5,
            "/shop/?waitroom_code=GUESS&waitroom_code=MEMBERS-2026".to_owned(),
            vec![],
        ),
        (
            6,
            format!("/shop/?waitroom_code={MEMBERS}"),
            vec![("x-waitroom-code", "GUESS")],
        ),
    ] {
        let v = Browser::new(n).json(&h, &path, &headers).await;
        let want = (n == 2).then(|| "presale".to_owned());
        assert_eq!(lane_of(&v), want, "{path} {headers:?}: {v}");
    }
    let browsers: Vec<Browser> = (10..30).map(Browser::new).collect();
    let path = format!("/shop/?waitroom_code={ONCE}");
    let answers = futures::future::join_all(browsers.iter().map(|b| b.json(&h, &path, &[]))).await;
    let in_lane = answers.iter().filter(|v| lane_of(v).is_some()).count();
    assert_eq!(in_lane, 1, "{answers:?}");
    assert!(answers.iter().all(|v| v["state"] == "queued"));
}

/// A single-use code and a token's `jti` are spent only on a place: an
/// arrival that the room refuses (here it is closed) gives them back,
/// so whoever clicked early can use them once the room takes newcomers.
/// Before, both were gone: the code holder landed in the general queue,
/// the member was refused as "replayed".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_code_and_a_jti_are_given_back_when_the_arrival_gets_no_place() {
    let h = daemon_with(None, |c| {
        c.server.admin_token = Some(Secret("admin-token".into()));
    })
    .await;
    Browser::new(0).json(&h, "/shop/", &[]).await;
    let state = |state: &'static str| {
        h.bare()
            .patch(h.admin_url("/api/rooms/shop"))
            .bearer_auth("admin-token")
            .json(&serde_json::json!({ "state": state }))
            .send()
    };
    assert!(state("closed").await.unwrap().status().is_success());
    let exp = h.clock_now() / 1000 + 3600;
    let member =
        token(serde_json::json!({"sub": "early", "room": "shop", "exp": exp, "jti": "link-1"}));
    let code_path = format!("/shop/?waitroom_code={ONCE}");
    let (coder, tokener) = (Browser::new(10), Browser::new(11));
    let full = coder.json(&h, &code_path, &[]).await;
    assert_eq!(full["state"], "closed", "{full}");
    let full = tokener
        .json(&h, "/shop/", &[("x-waitroom-token", &member)])
        .await;
    assert_eq!(full["state"], "closed", "{full}");
    assert!(state("open").await.unwrap().status().is_success());
    let entered = coder.json(&h, &code_path, &[]).await;
    assert_eq!(
        (entered["state"].as_str(), entered["lane"].as_str()),
        (Some("queued"), Some("presale")),
        "the code was given back: {entered}"
    );
    let entered = tokener
        .json(&h, "/shop/", &[("x-waitroom-token", &member)])
        .await;
    assert_eq!(
        entered["state"], "queued",
        "the jti was given back: {entered}"
    );
    // Spent now: another browser with the same code gets no lane.
    let again = Browser::new(12).json(&h, &code_path, &[]).await;
    assert!(again.get("lane").is_none(), "{again}");
}

/// Guessing codes costs an address its time: past five refused codes (the
/// sixth is the one over), any request bearing a code is answered 429 without the code being looked
/// at (so the right code, guessed then, tells nothing), until the
/// allowance has a cell again. Other addresses are not affected. Before,
/// only the arrival limits spaced the guesses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_guessing_codes_is_stopped_and_learns_nothing() {
    let h = daemon(None).await;
    Browser::new(0).json(&h, "/shop/", &[]).await;
    let guesser = |n: usize| Browser {
        ip: "198.51.100.66".into(),
        ..Browser::new(n)
    };
    for n in 0..6 {
        let v = guesser(100 + n)
            .json(&h, &format!("/shop/?waitroom_code=GUESS-{n:04}"), &[])
            .await;
        assert_eq!(v["state"], "queued", "a wrong code: the general queue: {v}");
        assert!(v.get("lane").is_none());
    }
    let v = guesser(105)
        .json(&h, "/shop/?waitroom_code=GUESS-0006", &[])
        .await;
    assert!(
        v["retry_after"].as_u64().is_some_and(|s| s <= 10),
        "429: {v}"
    );
    for spelling in [
        format!("/shop/?waitroom_code={MEMBERS}"),
        format!("/shop/?waitroom_code={ONCE}"),
    ] {
        let v = guesser(106).json(&h, &spelling, &[]).await;
        assert!(v["retry_after"].as_u64().is_some(), "not looked at: {v}");
    }
    let v = guesser(107)
        .json(&h, "/shop/", &[("x-waitroom-code", MEMBERS)])
        .await;
    assert!(v["retry_after"].as_u64().is_some(), "the header too: {v}");
    // Without a code, the address is a newcomer like any other.
    let v = guesser(109).json(&h, "/shop/", &[]).await;
    assert_eq!(v["state"], "queued", "{v}");
    // Another address with the right code.
    let v = Browser::new(7)
        .json(&h, &format!("/shop/?waitroom_code={MEMBERS}"), &[])
        .await;
    assert_eq!(v["lane"], "presale", "{v}");
    // The single-use code was not spent by the blocked tries.
    h.clock.advance(Duration::from_secs(10));
    let v = guesser(108)
        .json(&h, &format!("/shop/?waitroom_code={ONCE}"), &[])
        .await;
    assert_eq!(v["lane"], "presale", "after the wait: {v}");
}
