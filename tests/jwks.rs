//! Enqueue-token keys from a JWKS URL, over real HTTP: a local identity
//! provider on `127.0.0.1:0` that the test changes and stops. The set is
//! fetched at start; a token naming an unknown `kid` is refused at once
//! and triggers a fetch (at most one per `jwks_min_refresh` on the
//! daemon's clock), so the next such token is taken; a provider down,
//! failing or sending garbage leaves the last good set in use.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::engine::Engine;
use ring::signature::{Ed25519KeyPair, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use support::Harness;
use waitroom::config::{EnqueueToken, JwksUrl};
use waitroom::enqueue::TokenKeys;

/// An Ed25519 signing key and its `kid`.
struct Signer {
    kid: String,
    pair: Ed25519KeyPair,
}

impl Signer {
    fn new(kid: &str) -> Self {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        Self {
            kid: kid.to_owned(),
            pair: Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap(),
        }
    }

    fn jwk(&self) -> String {
        format!(
            r#"{{"kty":"OKP","crv":"Ed25519","kid":"{}","x":"{}"}}"#,
            self.kid,
            URL_SAFE_NO_PAD.encode(self.pair.public_key().as_ref())
        )
    }

    /// A token for room "shop" and `sub`, living ten minutes from `now_s`.
    fn token(&self, sub: &str, now_s: u64) -> String {
        let h = URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"EdDSA","kid":"{}"}}"#, self.kid));
        let claims = serde_json::json!({"sub": sub, "room": "shop", "exp": now_s + 600});
        let p = URL_SAFE_NO_PAD.encode(claims.to_string());
        let s = URL_SAFE_NO_PAD.encode(self.pair.sign(format!("{h}.{p}").as_bytes()).as_ref());
        format!("{h}.{p}.{s}")
    }
}

fn jwks(signers: &[&Signer]) -> String {
    let keys: Vec<String> = signers.iter().map(|s| s.jwk()).collect();
    format!(r#"{{"keys":[{}]}}"#, keys.join(","))
}

/// The provider's JWKS endpoint: answers every request with `answer`
/// (status and body), counting them; stopped by `stop`.
struct Provider {
    addr: std::net::SocketAddr,
    answer: Arc<Mutex<(u16, String)>>,
    served: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Provider {
    async fn start(body: String) -> Self {
        Self::serve(TcpListener::bind("127.0.0.1:0").await.unwrap(), body)
    }

    fn serve(listener: TcpListener, body: String) -> Self {
        let addr = listener.local_addr().unwrap();
        let answer = Arc::new(Mutex::new((200, body)));
        let served = Arc::new(AtomicUsize::new(0));
        let (a, n) = (answer.clone(), served.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let (a, n) = (a.clone(), n.clone());
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => request.extend_from_slice(&buf[..k]),
                        }
                    }
                    let (status, body) = a.lock().unwrap().clone();
                    n.fetch_add(1, Ordering::SeqCst);
                    let head = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(head.as_bytes()).await;
                    let _ = conn.write_all(body.as_bytes()).await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        Self {
            addr,
            answer,
            served,
            task,
        }
    }

    fn set(&self, status: u16, body: &str) {
        *self.answer.lock().unwrap() = (status, body.to_owned());
    }

    fn served(&self) -> usize {
        self.served.load(Ordering::SeqCst)
    }

    fn url(&self) -> String {
        format!("http://{}/.well-known/jwks.json", self.addr)
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Room "shop" behind a trusted proxy, taking tokens with keys from `url`.
async fn daemon(url: &str) -> Harness {
    let url = url.to_owned();
    Harness::start(move |c| tweak(c, &url)).await
}

fn tweak(c: &mut waitroom::config::Config, url: &str) {
    let url = url.parse().unwrap();
    {
        c.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        c.rooms[0].total_active_users = 1000;
        c.rooms[0].enqueue_token = Some(EnqueueToken {
            required: true,
            keys: TokenKeys::default(),
            jwks_url: Some(JwksUrl {
                url,
                min_refresh: Duration::from_secs(60),
                max_age: Duration::from_secs(3600),
            }),
            rules: waitroom::enqueue::Rules::for_room("shop"),
        });
    }
}

/// The status of a newcomer bringing `token` (each call another address).
async fn arrive(h: &Harness, token: &str) -> u16 {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    let ip = format!("203.0.{}.{}", n / 250, n % 250 + 1);
    let path = format!("/shop/?waitroom_token={token}");
    let (status, _, _) = h
        .page(
            &path,
            &[("x-forwarded-for", &ip), ("accept", "application/json")],
        )
        .await;
    status
}

/// Waits (up to ten seconds) until `done` holds.
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut done: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `waitroom_jwks_fetches_total{room="shop",outcome}` on the admin API.
async fn fetches(h: &Harness, outcome: &str) -> u64 {
    let text = h.metrics().await;
    let want = format!(r#"waitroom_jwks_fetches_total{{room="shop",outcome="{outcome}"}} "#);
    text.lines()
        .find_map(|l| l.strip_prefix(&want))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn now_s(h: &Harness) -> u64 {
    h.clock_now() / 1000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_is_taken_after_one_background_fetch() {
    let k1 = Signer::new("k1");
    let idp = Provider::start(jwks(&[&k1])).await;
    let h = daemon(&idp.url()).await;
    // Fetched at start, without a request asking for it.
    until("the first fetch", || async { fetches(&h, "ok").await == 1 }).await;
    assert_eq!(arrive(&h, &k1.token("a", now_s(&h))).await, 200);
    assert_eq!(idp.served(), 1, "a known kid fetches nothing");

    // The provider rotates to k2. Within jwks_min_refresh of the last
    // fetch, k2 is refused and nothing is fetched.
    let k2 = Signer::new("k2");
    idp.set(200, &jwks(&[&k2]));
    assert_eq!(arrive(&h, &k2.token("b", now_s(&h))).await, 403);
    // Past it, the next k2 token is still refused (the request path never
    // waits for a fetch) but sets one off; once it ran, k2 is taken.
    h.clock.advance(Duration::from_secs(61));
    assert_eq!(arrive(&h, &k2.token("c", now_s(&h))).await, 403);
    until("the refresh", || async { fetches(&h, "ok").await == 2 }).await;
    assert_eq!(arrive(&h, &k2.token("d", now_s(&h))).await, 200);
    assert_eq!(idp.served(), 2);
    // The old key went with the old set.
    assert_eq!(arrive(&h, &k1.token("e", now_s(&h))).await, 403);

    // Another unknown kid within jwks_min_refresh: refused, no fetch.
    let k3 = Signer::new("k3");
    for sub in ["f", "g", "h"] {
        assert_eq!(arrive(&h, &k3.token(sub, now_s(&h))).await, 403);
    }
    // A fetch, if one had been set off, would have reached the provider on
    // loopback by now; this proves an absence, so it can only wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(idp.served(), 2, "one fetch per jwks_min_refresh");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_good_set_outlives_a_provider_that_fails() {
    let k1 = Signer::new("k1");
    let idp = Provider::start(jwks(&[&k1])).await;
    let h = daemon(&idp.url()).await;
    until("the first fetch", || async { fetches(&h, "ok").await == 1 }).await;
    let unknown = Signer::new("unknown");
    // An error status, then an answer that is no JWKS, then an empty set:
    // each fetch (set off by an unknown kid) fails, and k1 still verifies.
    for (i, (status, body, outcome)) in [
        (500, "oops".to_owned(), "failed"),
        (200, "<html>maintenance</html>".to_owned(), "invalid"),
        (200, r#"{"keys":[]}"#.to_owned(), "invalid"),
    ]
    .into_iter()
    .enumerate()
    {
        idp.set(status, &body);
        let before = fetches(&h, outcome).await;
        h.clock.advance(Duration::from_secs(61));
        assert_eq!(arrive(&h, &unknown.token("x", now_s(&h))).await, 403);
        until(outcome, || async { fetches(&h, outcome).await > before }).await;
        assert_eq!(
            arrive(&h, &k1.token(&format!("ok{i}"), now_s(&h))).await,
            200,
            "{status} {body}"
        );
    }
    // The provider gone: no answer at all.
    let port = idp.addr;
    drop(idp);
    let before = fetches(&h, "failed").await;
    h.clock.advance(Duration::from_secs(61));
    assert_eq!(arrive(&h, &unknown.token("y", now_s(&h))).await, 403);
    until("a failed fetch", || async {
        fetches(&h, "failed").await > before
    })
    .await;
    assert_eq!(
        arrive(&h, &k1.token("down", now_s(&h))).await,
        200,
        "{port}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_starts_with_its_provider_down_and_keeps_trying() {
    // A port that was free a moment ago: nothing answers on it.
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/jwks.json");
    let h = daemon(&url).await;
    let k1 = Signer::new("k1");
    until("a failed fetch", || async {
        fetches(&h, "failed").await >= 1
    })
    .await;
    assert_eq!(arrive(&h, &k1.token("a", now_s(&h))).await, 403);
    // The provider comes up on that port: the task's back-off retry finds
    // it, without any token asking.
    let Ok(listener) = TcpListener::bind(("127.0.0.1", port)).await else {
        // Someone else took the port meanwhile; the rest cannot be shown.
        return;
    };
    let idp = Provider::serve(listener, jwks(&[&k1]));
    until("a fetch after back-off", || async {
        fetches(&h, "ok").await == 1
    })
    .await;
    assert_eq!(arrive(&h, &k1.token("b", now_s(&h))).await, 200);
    assert!(idp.served() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_fetches_again_and_keeps_the_set_meanwhile() {
    let k1 = Signer::new("k1");
    let idp = Provider::start(jwks(&[&k1])).await;
    let h = daemon(&idp.url()).await;
    until("the first fetch", || async { fetches(&h, "ok").await == 1 }).await;
    let mut cfg = support::config(h.origin.addr);
    tweak(&mut cfg, &idp.url());
    // A reload's rooms fetch at once...
    h.daemon.reload(&cfg).await.unwrap();
    until("the reload's fetch", || async {
        fetches(&h, "ok").await == 2
    })
    .await;
    assert_eq!(idp.served(), 2);
    // ...and, the provider down, the new rooms keep the old set.
    drop(idp);
    h.daemon.reload(&cfg).await.unwrap();
    until("the reload's failed fetch", || async {
        fetches(&h, "failed").await >= 1
    })
    .await;
    assert_eq!(arrive(&h, &k1.token("a", now_s(&h))).await, 200);
}
