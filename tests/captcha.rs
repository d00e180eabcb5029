//! Captcha providers over real HTTP: a local stand-in for the provider's
//! `siteverify` API (the real ones are not reachable from here) that speaks
//! its form and JSON, and a stand-in for its widget script that calls the
//! page's callback, run in headless Chromium. A newcomer to a queueing room
//! gets the widget first; a token the provider takes earns a place; one it
//! refuses earns none (the shadow queue or the widget again); a verifier
//! that does not answer is `challenge_on_error`'s, and `open` only while
//! it does not answer most networks; verifications are bounded; a token
//! handed in twice by one network is never shadowed.

#[path = "support/browser.rs"]
mod browser;
mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use support::Harness;
use waitroom::config::{Captcha, ChallengeKind, FailedChallenge, OnVerifyError, Secret};

/// What the verifier was asked: (secret, response, remoteip).
type Asked = Arc<Mutex<Vec<(String, String, String)>>>;

/// A stand-in for the provider: `POST /siteverify` answers success for
/// tokens starting with `good` (once: then `timeout-or-duplicate`, as the
/// providers do), waits 5 s for `slow`, answers a bare status for
/// `status-NNN…`, a body that is no verdict for `garbled…`, and refuses
/// the rest; it answers one verification at a time, each taking `pace`
/// (a verifier that slows down under load); `GET /api.js` is a widget
/// that calls the page's callback with `good-browser`.
struct Provider {
    addr: SocketAddr,
    asked: Asked,
    /// The most verifications it was asked at once.
    most_at_once: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

/// The stand-in's state shared by its connections.
#[derive(Clone, Default)]
struct Shared {
    asked: Asked,
    pace: Duration,
    one_at_a_time: Arc<tokio::sync::Mutex<()>>,
    at_once: Arc<AtomicUsize>,
    most_at_once: Arc<AtomicUsize>,
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const WIDGET: &str = "setTimeout(function(){var el=document.querySelector('.cf-turnstile');\
window[el.getAttribute('data-callback')]('good-browser');},50);";

async fn answer(req: Request<Incoming>, shared: Shared) -> Response<Full<Bytes>> {
    let now = shared.at_once.fetch_add(1, Ordering::SeqCst) + 1;
    shared.most_at_once.fetch_max(now, Ordering::SeqCst);
    let resp = verdict(req, &shared).await;
    shared.at_once.fetch_sub(1, Ordering::SeqCst);
    resp
}

async fn verdict(req: Request<Incoming>, shared: &Shared) -> Response<Full<Bytes>> {
    let asked = &shared.asked;
    if req.uri().path() == "/api.js" {
        let mut resp = Response::new(Full::new(Bytes::from_static(WIDGET.as_bytes())));
        resp.headers_mut()
            .insert("content-type", "text/javascript".parse().unwrap());
        return resp;
    }
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let form: std::collections::HashMap<String, String> =
        form_urlencoded::parse(&body).into_owned().collect();
    let token = form.get("response").cloned().unwrap_or_default();
    asked.lock().unwrap().push((
        form.get("secret").cloned().unwrap_or_default(),
        token.clone(),
        form.get("remoteip").cloned().unwrap_or_default(),
    ));
    if !shared.pace.is_zero() {
        let _turn = shared.one_at_a_time.lock().await;
        tokio::time::sleep(shared.pace).await;
    }
    if token == "slow" {
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    if let Some(code) = token.strip_prefix("status-") {
        let mut resp = Response::new(Full::new(Bytes::from_static(b"{}")));
        *resp.status_mut() = code[..3].parse().unwrap();
        return resp;
    }
    if token.starts_with("garbled") {
        return Response::new(Full::new(Bytes::from_static(b"<html>busy</html>")));
    }
    let seen = asked
        .lock()
        .unwrap()
        .iter()
        .filter(|a| a.1 == token)
        .count();
    let json = if token.starts_with("good") && seen == 1 {
        serde_json::json!({"success": true, "error-codes": []})
    } else if token.starts_with("good") {
        serde_json::json!({"success": false, "error-codes": ["timeout-or-duplicate"]})
    } else {
        serde_json::json!({"success": false, "error-codes": ["invalid-input-response"]})
    };
    Response::new(Full::new(Bytes::from(json.to_string())))
}

impl Provider {
    async fn start() -> Self {
        Self::paced(Duration::ZERO).await
    }

    /// One that answers one verification at a time, each taking `pace`.
    async fn paced(pace: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Shared {
            pace,
            ..Shared::default()
        };
        let (asked, most_at_once) = (shared.asked.clone(), shared.most_at_once.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let shared = shared.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let shared = shared.clone();
                        async move { Ok::<_, std::convert::Infallible>(answer(req, shared).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self {
            addr,
            asked,
            most_at_once,
            task,
        }
    }

    fn captcha(&self, on_error: OnVerifyError) -> Captcha {
        Captcha {
            kind: ChallengeKind::Turnstile,
            site_key: "0x4AAA-site-key".into(),
            secret: Secret("s3cret".into()),
            verify_url: format!("http://{}/siteverify", self.addr).parse().unwrap(),
            script_url: format!("http://{}/api.js", self.addr),
            timeout: Duration::from_millis(300),
            on_error,
            concurrency: 64,
        }
    }
}

/// Room "shop" for one, full and queueing, asking the provider's captcha.
async fn daemon(provider: &Provider, on_error: OnVerifyError, failed: FailedChallenge) -> Harness {
    daemon_with(provider, on_error, failed, |_| {}).await
}

/// The same, with `tweak` applied to the config.
async fn daemon_with(
    provider: &Provider,
    on_error: OnVerifyError,
    failed: FailedChallenge,
    tweak: impl FnOnce(&mut waitroom::config::Config),
) -> Harness {
    let captcha = provider.captcha(on_error);
    let h = Harness::start(move |c| {
        c.rooms[0].total_active_users = 1;
        c.rooms[0].captcha = Some(captcha);
        c.rooms[0].failed_challenge = failed;
        tweak(c);
    })
    .await;
    let (status, _, _) = h.page("/shop/", &[]).await;
    assert_eq!(status, 200, "the first visitor is let in without a captcha");
    h.daemon
        .gate()
        .rooms
        .by_id("shop")
        .unwrap()
        .set_queueing(true);
    h
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap()
}

#[tokio::test]
async fn a_token_the_provider_takes_earns_a_place_and_nothing_else_does() {
    let provider = Provider::start().await;
    let h = daemon(&provider, OnVerifyError::Closed, FailedChallenge::Retry).await;
    // Without a token: the widget, and no place.
    let (status, cookie, page) = h.page("/shop/", &[]).await;
    assert_eq!((status, cookie), (200, None));
    assert!(
        page.contains(r#"class="cf-turnstile" data-sitekey="0x4AAA-site-key""#),
        "{page}"
    );
    // The provider's script (HTML-escaped in its attribute, `/` as `&#x2f;`).
    let script = format!("http://{}/api.js", provider.addr).replace('/', "&#x2f;");
    assert!(
        page.contains(&format!(r#"<script src="{script}""#)),
        "{page}"
    );
    let (_, _, body) = h.page("/shop/", &[("accept", "application/json")]).await;
    let v = json(&body);
    assert_eq!(v["state"], "challenge");
    assert_eq!(v["captcha"]["provider"], "turnstile");
    assert_eq!(v["captcha"]["site_key"], "0x4AAA-site-key");
    assert_eq!(h.counts().await, (1, 0));
    assert!(
        provider.asked.lock().unwrap().is_empty(),
        "nobody asked without a token"
    );
    // A refused token: the widget again, no place.
    let (_, cookie, body) = h
        .page(
            "/shop/",
            &[
                ("accept", "application/json"),
                ("x-waitroom-captcha", "bad"),
            ],
        )
        .await;
    assert_eq!(
        (json(&body)["state"].as_str(), cookie),
        (Some("challenge"), None)
    );
    assert_eq!(h.counts().await, (1, 0));
    // A token it takes (in the page's cookie, percent-encoded): a place.
    let (_, cookie, body) = h
        .page(
            "/shop/",
            &[
                ("accept", "application/json"),
                ("cookie", "waitroom_.captcha=good%2D1"),
            ],
        )
        .await;
    assert_eq!(json(&body)["state"], "queued", "{body}");
    assert!(cookie.is_some());
    assert_eq!(h.counts().await, (1, 1));
    let asked = provider.asked.lock().unwrap().clone();
    assert_eq!(
        asked,
        vec![
            ("s3cret".into(), "bad".into(), "127.0.0.1".into()),
            ("s3cret".into(), "good-1".into(), "127.0.0.1".into()),
        ],
        "the provider gets the secret, the token and the visitor's address"
    );
    let metrics = h.metrics().await;
    assert!(
        metrics.contains(r#"outcome="captcha_passed"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"outcome="captcha_failed"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_refused_token_goes_to_the_shadow_queue_when_the_room_says_so() {
    let provider = Provider::start().await;
    let h = daemon(&provider, OnVerifyError::Closed, FailedChallenge::Shadow).await;
    let (status, cookie, body) = h
        .page(
            "/shop/",
            &[
                ("accept", "application/json"),
                ("x-waitroom-captcha", "bad"),
            ],
        )
        .await;
    assert_eq!(status, 200);
    assert!(cookie.is_some(), "a ticket like a queued visitor's");
    assert_eq!(json(&body)["state"], "queued");
    assert_eq!(h.counts().await, (1, 0), "and no place");
}

#[tokio::test]
async fn a_verifier_that_does_not_answer_is_the_rooms_choice() {
    let provider = Provider::start().await;
    let closed = daemon(&provider, OnVerifyError::Closed, FailedChallenge::Retry).await;
    let slow = [
        ("accept", "application/json"),
        ("x-waitroom-captcha", "slow"),
    ];
    let (_, _, body) = closed.page("/shop/", &slow).await;
    assert_eq!(
        json(&body)["state"],
        "challenge",
        "closed: nobody passes unverified"
    );
    assert_eq!(closed.counts().await, (1, 0));
    let open = daemon(&provider, OnVerifyError::Open, FailedChallenge::Retry).await;
    let (_, _, body) = open.page("/shop/", &slow).await;
    assert_eq!(
        json(&body)["state"],
        "challenge",
        "open: one slow answer is not the verifier down"
    );
    assert_eq!(open.counts().await, (1, 0));
    // Down altogether: the same.
    drop(provider);
    let (_, _, body) = closed
        .page(
            "/shop/",
            &[
                ("accept", "application/json"),
                ("x-waitroom-captcha", "good"),
            ],
        )
        .await;
    assert_eq!(json(&body)["state"], "challenge");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_widget_hands_its_token_back_and_the_browser_gets_its_place() {
    let provider = Provider::start().await;
    let h = daemon(&provider, OnVerifyError::Closed, FailedChallenge::Retry).await;
    let browser = browser::Browser::start(browser::Options::default()).await;
    browser.client.goto(&h.url("/shop/")).await.unwrap();
    // The stand-in widget calls back, the page reloads with the token and
    // the daemon, having asked the provider, shows the queue page.
    browser
        .wait_until(
            "document.getElementById('wr-position') !== null",
            Duration::from_secs(20),
        )
        .await;
    assert_eq!(browser.text_of("wr-position").await, "1");
    assert_eq!(h.counts().await, (1, 1));
    let asked = provider.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].1, "good-browser");
}

#[test]
fn a_captcha_room_needs_its_site_key_and_secret() {
    let base = "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n[cookie]\nkeys = [\"BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=\"]\n[origin]\nurl = \"http://127.0.0.1:9\"\n[[room]]\nid = \"shop\"\npath = \"/\"\ntotal_active_users = 5\nnew_users_per_minute = 100\n";
    let env = |name: &str| (name == "TURNSTILE_SECRET").then(|| "s3cret".to_owned());
    let load =
        |extra: &str| waitroom::config::from_toml_str_with_env(&format!("{base}{extra}"), &env);
    let good = "challenge = \"turnstile\"\nchallenge_site_key = \"0x4AAA\"\nchallenge_secret_env = \"TURNSTILE_SECRET\"\n";
    let cfg = load(good).unwrap();
    let c = cfg.rooms[0].captcha.as_ref().unwrap();
    assert_eq!(
        c.verify_url.to_string(),
        "https://challenges.cloudflare.com/turnstile/v0/siteverify"
    );
    assert_eq!(
        c.script_url,
        "https://challenges.cloudflare.com/turnstile/v0/api.js"
    );
    assert_eq!(
        (c.timeout, c.on_error),
        (Duration::from_secs(3), OnVerifyError::Closed)
    );
    let hcaptcha = load("challenge = \"hcaptcha\"\nchallenge_site_key = \"k\"\nchallenge_secret_env = \"TURNSTILE_SECRET\"\nchallenge_on_error = \"open\"\n").unwrap();
    let c = hcaptcha.rooms[0].captcha.as_ref().unwrap();
    assert_eq!(
        c.verify_url.to_string(),
        "https://api.hcaptcha.com/siteverify"
    );
    assert_eq!(c.on_error, OnVerifyError::Open);
    assert!(load("challenge = \"proof_of_work\"\n").unwrap().rooms[0]
        .captcha
        .is_none());
    for (extra, key) in [
        ("challenge = \"turnstile\"\nchallenge_secret_env = \"TURNSTILE_SECRET\"\n", "challenge_site_key"),
        ("challenge = \"turnstile\"\nchallenge_site_key = \"k\"\n", "challenge_secret_env"),
        ("challenge = \"turnstile\"\nchallenge_site_key = \"k\"\nchallenge_secret_env = \"UNSET_SECRET\"\n", "challenge_secret_env"),
        (&format!("{good}proof_of_work = 18\n"), "proof_of_work"),
        (&format!("{good}challenge_verify_url = \"ftp://x\"\n"), "challenge_verify_url"),
        (&format!("{good}challenge_script_url = \"javascript:alert(1)\"\n"), "challenge_script_url"),
        (
            "challenge = \"turnstile\"\nchallenge_site_key = \"a\\\"b\"\nchallenge_secret_env = \"TURNSTILE_SECRET\"\n",
            "challenge_site_key",
        ),
        ("challenge = \"captchaz\"\n", "challenge"),
    ] {
        let err = load(extra).unwrap_err();
        assert!(err.to_string().contains(key), "{key}: {err}");
    }
}

/// What a burst of requests earned: places (queued with a ticket),
/// challenges, and "busy, try again" answers.
#[derive(Debug, Default, PartialEq, Eq)]
struct Earned {
    places: usize,
    challenges: usize,
    busy: usize,
}

async fn burst(h: &Harness, tokens: Vec<String>) -> Earned {
    let answers = futures_util::future::join_all(tokens.into_iter().map(|token| {
        let req = h
            .bare()
            .get(h.url("/shop/"))
            .header("accept", "application/json")
            .header("x-waitroom-captcha", token);
        async move {
            let resp = req.send().await.unwrap();
            let (status, ticket) = (
                resp.status().as_u16(),
                support::set_cookie(&resp, "waitroom_shop"),
            );
            let retry_after = resp.headers().contains_key("retry-after");
            (
                status,
                ticket,
                retry_after,
                json(&resp.text().await.unwrap()),
            )
        }
    }))
    .await;
    let mut earned = Earned::default();
    for (status, ticket, retry_after, v) in answers {
        match (status, v["state"].as_str()) {
            (200, Some("queued")) if ticket.is_some() => earned.places += 1,
            (200, Some("challenge")) => earned.challenges += 1,
            (503, Some("challenge")) if retry_after && v["retry_after"].as_u64() == Some(2) => {
                earned.busy += 1
            }
            other => panic!("unexpected answer {other:?}: {v}"),
        }
    }
    earned
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_bogus_tokens_against_a_slow_verifier_earns_no_place() {
    // 20 ms a verification, one at a time: within the 300 ms timeout it
    // answers about 15 of a burst; unbounded, the rest got no answer and
    // `open` passed them (826c187: 81 of 100).
    let provider = Provider::paced(Duration::from_millis(20)).await;
    let h = daemon_with(
        &provider,
        OnVerifyError::Open,
        FailedChallenge::Retry,
        |c| {
            c.rooms[0].captcha.as_mut().unwrap().concurrency = 8;
        },
    )
    .await;
    let tokens = (0..100).map(|i| format!("bogus-{i}")).collect();
    let earned = burst(&h, tokens).await;
    eprintln!("100 bogus tokens at once: {earned:?}");
    assert_eq!(earned.places, 0, "{earned:?}");
    assert!(earned.busy > 0, "the bound turned some away: {earned:?}");
    assert!(
        provider.most_at_once.load(Ordering::SeqCst) <= 8,
        "never more verifications at once than the bound"
    );
    assert_eq!(h.counts().await, (1, 0));
    let metrics = h.metrics().await;
    assert!(
        metrics.contains(r#"outcome="captcha_open_passed"} 0"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(r#"outcome="captcha_busy"}} {}"#, earned.busy)),
        "{metrics}"
    );
    // A busy answer spent nothing: the same token, handed in again, is
    // checked (and, being good, earns its place).
    let (status, _, body) = h
        .page(
            "/shop/",
            &[
                ("accept", "application/json"),
                ("x-waitroom-captcha", "good-after-busy"),
            ],
        )
        .await;
    assert_eq!(
        (status, json(&body)["state"].as_str()),
        (200, Some("queued"))
    );
}

#[tokio::test]
async fn a_refusal_in_any_form_passes_nobody_even_when_open() {
    let provider = Provider::start().await;
    let h = daemon(&provider, OnVerifyError::Open, FailedChallenge::Shadow).await;
    // A 4xx (a 429 too) and a 200 that is not `{"success": bool}` are
    // answers, and no verdict: the widget again (not the shadow queue).
    for token in ["status-429", "status-400", "garbled-1"] {
        let (status, cookie, body) = h
            .page(
                "/shop/",
                &[
                    ("accept", "application/json"),
                    ("x-waitroom-captcha", token),
                ],
            )
            .await;
        assert_eq!(
            (status, json(&body)["state"].as_str(), cookie),
            (200, Some("challenge"), None),
            "{token}"
        );
    }
    assert_eq!(h.counts().await, (1, 0));
    let metrics = h.metrics().await;
    assert!(
        metrics.contains(r#"outcome="captcha_failed"} 3"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"outcome="shadowed"} 0"#), "{metrics}");
}

#[tokio::test]
async fn open_passes_only_while_the_verifier_fails_most_networks_and_counts_each() {
    let provider = Provider::start().await;
    let h = daemon_with(
        &provider,
        OnVerifyError::Open,
        FailedChallenge::Retry,
        |c| c.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()],
    )
    .await;
    // A 5xx is no answer. Nine networks: too few to call the verifier down.
    let mut states = Vec::new();
    for i in 0..12 {
        let (_, _, body) = h
            .page(
                "/shop/",
                &[
                    ("accept", "application/json"),
                    ("x-forwarded-for", &format!("198.51.{i}.7")),
                    ("x-waitroom-captcha", &format!("status-503-{i}")),
                ],
            )
            .await;
        states.push(json(&body)["state"].as_str().unwrap().to_owned());
    }
    let expected: Vec<&str> = [["challenge"; 9].as_slice(), &["queued"; 3]].concat();
    assert_eq!(states, expected);
    assert_eq!(h.counts().await, (1, 3));
    // Every open pass is counted: metrics, the rooms API, the dashboard's source.
    let metrics = h.metrics().await;
    assert!(
        metrics.contains(r#"outcome="captcha_open_passed"} 3"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"outcome="captcha_passed"} 0"#),
        "{metrics}"
    );
    let room: serde_json::Value = h
        .bare()
        .get(h.admin_url("/api/rooms/shop"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(room["fairness"]["captcha_open_passed"], 3, "{room}");
    // The verifier answers again: a refusal is a refusal.
    let (_, _, body) = h
        .page(
            "/shop/",
            &[
                ("accept", "application/json"),
                ("x-forwarded-for", "203.0.113.9"),
                ("x-waitroom-captcha", "bogus"),
            ],
        )
        .await;
    assert_eq!(json(&body)["state"], "challenge");
}

#[tokio::test]
async fn a_token_handed_in_twice_by_one_network_never_lands_in_the_shadow_queue() {
    let provider = Provider::start().await;
    let h = daemon_with(
        &provider,
        OnVerifyError::Closed,
        FailedChallenge::Shadow,
        |c| c.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()],
    )
    .await;
    // Two tabs sharing cookies hand the same token in at once.
    let send = |from: &'static str| {
        h.bare()
            .get(h.url("/shop/"))
            .header("accept", "application/json")
            .header("x-forwarded-for", from)
            .header("cookie", "waitroom_.captcha=good-twice")
            .send()
    };
    let (a, b) = tokio::join!(send("192.0.2.10"), send("192.0.2.11"));
    let mut answers = Vec::new();
    for resp in [a.unwrap(), b.unwrap()] {
        let ticket = support::set_cookie(&resp, "waitroom_shop");
        let cleared = resp
            .headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.starts_with("waitroom_.captcha=;") && v.contains("Max-Age=0"));
        let v = json(&resp.text().await.unwrap());
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
        "one place, one fresh widget; the spent token cookie cleared in both"
    );
    assert_eq!(h.counts().await, (1, 1), "the place is a real one");
    assert_eq!(provider.asked.lock().unwrap().len(), 1, "asked once");
    // Another network's copy of it: the shadow queue, and nothing asked.
    let (_, ticket, body) = h
        .page(
            "/shop/",
            &[
                ("accept", "application/json"),
                ("x-forwarded-for", "203.0.113.5"),
                ("x-waitroom-captcha", "good-twice"),
            ],
        )
        .await;
    assert_eq!(
        (json(&body)["state"].as_str(), ticket.is_some()),
        (Some("queued"), true)
    );
    assert_eq!(h.counts().await, (1, 1), "a shadow place");
    assert_eq!(provider.asked.lock().unwrap().len(), 1);
    let metrics = h.metrics().await;
    assert!(metrics.contains(r#"outcome="shadowed"} 1"#), "{metrics}");
}
