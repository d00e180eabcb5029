//! Captcha providers over real HTTP: a local stand-in for the provider's
//! `siteverify` API (the real ones are not reachable from here) that speaks
//! its form and JSON, and a stand-in for its widget script that calls the
//! page's callback, run in headless Chromium. A newcomer to a queueing room
//! gets the widget first; a token the provider takes earns a place; one it
//! refuses earns none (the shadow queue or the widget again); a verifier
//! that does not answer is `challenge_on_error`'s.

#[path = "support/browser.rs"]
mod browser;
mod support;

use std::net::SocketAddr;
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
/// tokens starting with `good`, waits 5 s for `slow`, refuses the rest;
/// `GET /api.js` is a widget that calls the page's callback with `good-browser`.
struct Provider {
    addr: SocketAddr,
    asked: Asked,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const WIDGET: &str = "setTimeout(function(){var el=document.querySelector('.cf-turnstile');\
window[el.getAttribute('data-callback')]('good-browser');},50);";

async fn answer(req: Request<Incoming>, asked: Asked) -> Response<Full<Bytes>> {
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
    if token == "slow" {
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let success = token.starts_with("good");
    let json = serde_json::json!({"success": success, "error-codes": []});
    Response::new(Full::new(Bytes::from(json.to_string())))
}

impl Provider {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let asked: Asked = Arc::default();
        let log = asked.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let log = log.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let log = log.clone();
                        async move { Ok::<_, std::convert::Infallible>(answer(req, log).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self { addr, asked, task }
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
        }
    }
}

/// Room "shop" for one, full and queueing, asking the provider's captcha.
async fn daemon(provider: &Provider, on_error: OnVerifyError, failed: FailedChallenge) -> Harness {
    let captcha = provider.captcha(on_error);
    let h = Harness::start(move |c| {
        c.rooms[0].total_active_users = 1;
        c.rooms[0].captcha = Some(captcha);
        c.rooms[0].failed_challenge = failed;
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
        "queued",
        "open: the provider's outage stops nobody"
    );
    assert_eq!(open.counts().await, (1, 1));
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
