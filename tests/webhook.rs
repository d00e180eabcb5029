//! Webhooks over real HTTP: a receiver on 127.0.0.1:0 that records what
//! it is sent and answers as each test scripts it (a 500, a 429, a 400,
//! no answer at all), against the real delivery tasks. Also `waitroom
//! check` refusing bad `[[webhook]]` sections with exit code 64.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use waitroom::clock::{ManualClock, SharedClock};
use waitroom::config::Secret;
use waitroom::webhook::{
    verify, Figures, Happening, Kind, Options, WebhookConfig, Webhooks, DELIVERY_HEADER,
    KIND_HEADER, MAX_REVOKES_PER_BATCH, SIGNATURE_HEADER, TIMESTAMP_HEADER,
};

/// 2027-01-15T08:00:00Z.
const T0: u64 = 1_800_000_000_000;
const SECRET: &str = "a webhook secret of 32 bytes....";

/// How the receiver answers one request.
#[derive(Clone, Copy, Debug)]
enum Answer {
    Status(u16),
    /// A status with `Retry-After: <seconds>`.
    RetryAfter(u16, u64),
    /// No answer, ever (the connection stays open).
    Stall,
}

/// One request the receiver got.
#[derive(Clone, Debug)]
struct Seen {
    headers: HeaderMap,
    body: Bytes,
}

impl Seen {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name}"))
            .to_str()
            .unwrap()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// A webhook receiver: the first answers as scripted, then `rest`.
struct Receiver {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl Receiver {
    async fn start(script: &[Answer], rest: Answer) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(script.iter().copied().collect::<VecDeque<_>>()));
        let recorded = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let seen = Arc::clone(&recorded);
                let script = Arc::clone(&script);
                tokio::spawn(async move {
                    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let seen = Arc::clone(&seen);
                        let script = Arc::clone(&script);
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body.collect().await.unwrap().to_bytes();
                            seen.lock().unwrap().push(Seen {
                                headers: parts.headers,
                                body,
                            });
                            let answer = script.lock().unwrap().pop_front().unwrap_or(rest);
                            let mut response = Response::builder();
                            let status = match answer {
                                Answer::Status(s) => s,
                                Answer::RetryAfter(s, after) => {
                                    response = response.header("retry-after", after);
                                    s
                                }
                                Answer::Stall => std::future::pending().await,
                            };
                            Ok::<_, Infallible>(
                                response
                                    .status(StatusCode::from_u16(status).unwrap())
                                    .body(Full::new(Bytes::new()))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Receiver { addr, seen, task }
    }

    fn url(&self) -> http::Uri {
        format!("http://{}/hook", self.addr).parse().unwrap()
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn clock() -> SharedClock {
    Arc::new(ManualClock::new(T0))
}

/// Back-off in milliseconds, so retries take no time worth waiting for.
fn fast() -> Options {
    Options {
        backoff_base: Duration::from_millis(10),
        backoff_cap: Duration::from_millis(40),
        grace: Duration::from_millis(500),
    }
}

fn hook(url: http::Uri) -> WebhookConfig {
    WebhookConfig::new(url, Secret(SECRET.to_owned()))
}

fn happening(id: &str, kind: Kind, room: &str) -> Happening {
    Happening {
        id: id.to_owned(),
        kind,
        room: room.to_owned(),
        at_ms: T0,
        data: json!({"from": "open", "to": "paused"}),
    }
}

/// Waits (at most 10 s) until `done` holds.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn figures(hooks: &Webhooks) -> Figures {
    hooks.figures().remove(0)
}

#[tokio::test]
async fn a_delivery_is_signed_and_carries_its_headers() {
    let receiver = Receiver::start(&[], Answer::Status(204)).await;
    let hooks = Webhooks::with_options(&[hook(receiver.url())], clock(), fast());
    hooks.emit(happening(
        "state_changed:shop:1",
        Kind::StateChanged,
        "shop",
    ));
    until("delivered", || figures(&hooks).sent == 1).await;

    let seen = receiver.seen();
    assert_eq!(seen.len(), 1);
    let got = &seen[0];
    assert_eq!(got.header("content-type"), "application/json");
    assert!(got.header("user-agent").starts_with("waitroom/"));
    assert_eq!(got.header(DELIVERY_HEADER), "state_changed:shop:1");
    assert_eq!(got.header(KIND_HEADER), "state_changed");
    assert_eq!(got.header(TIMESTAMP_HEADER), "1800000000");
    assert_eq!(
        got.json(),
        json!({
            "id": "state_changed:shop:1",
            "kind": "state_changed",
            "room": "shop",
            "at": "2027-01-15T08:00:00.000Z",
            "data": {"from": "open", "to": "paused"},
        })
    );
    let (ts, sig) = (got.header(TIMESTAMP_HEADER), got.header(SIGNATURE_HEADER));
    assert!(sig.starts_with("v1="), "{sig}");
    assert!(verify(SECRET.as_bytes(), ts, &got.body, sig));
    assert!(!verify(
        b"another secret of 32 bytes......",
        ts,
        &got.body,
        sig
    ));
    assert!(!verify(SECRET.as_bytes(), "1800000001", &got.body, sig));
    let mut tampered = got.body.to_vec();
    tampered[2] ^= 1;
    assert!(!verify(SECRET.as_bytes(), ts, &tampered, sig));
    hooks.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_500_then_a_429_are_retried_with_the_same_id_and_delivered_once() {
    let receiver = Receiver::start(
        &[Answer::Status(500), Answer::RetryAfter(429, 0)],
        Answer::Status(200),
    )
    .await;
    let hooks = Webhooks::with_options(&[hook(receiver.url())], clock(), fast());
    hooks.emit(happening("sold_out:shop:7", Kind::SoldOut, "shop"));
    until("delivered", || figures(&hooks).sent == 1).await;

    let seen = receiver.seen();
    assert_eq!(seen.len(), 3);
    for got in &seen {
        assert_eq!(got.header(DELIVERY_HEADER), "sold_out:shop:7");
        assert!(verify(
            SECRET.as_bytes(),
            got.header(TIMESTAMP_HEADER),
            &got.body,
            got.header(SIGNATURE_HEADER)
        ));
    }
    let f = figures(&hooks);
    assert_eq!(
        (f.sent, f.retried, f.failed, f.dropped),
        (1, 2, 0, 0),
        "{f:?}"
    );
}

#[tokio::test]
async fn a_400_is_not_retried() {
    let receiver = Receiver::start(&[Answer::Status(400)], Answer::Status(200)).await;
    let hooks = Webhooks::with_options(&[hook(receiver.url())], clock(), fast());
    hooks.emit(happening("a", Kind::SoldOut, "shop"));
    until("given up", || figures(&hooks).failed == 1).await;
    // The next one goes through: the 400 held nothing up.
    hooks.emit(happening("b", Kind::SoldOut, "shop"));
    until("delivered", || figures(&hooks).sent == 1).await;
    let ids: Vec<String> = receiver
        .seen()
        .iter()
        .map(|s| s.header(DELIVERY_HEADER).to_owned())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(figures(&hooks).retried, 0);
}

#[tokio::test]
async fn a_receiver_that_is_down_is_tried_max_attempts_times_then_failed() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut config = hook(format!("http://{closed}/hook").parse().unwrap());
    config.max_attempts = 3;
    let hooks = Webhooks::with_options(&[config], clock(), fast());
    hooks.emit(happening("a", Kind::StateChanged, "shop"));
    until("given up", || figures(&hooks).failed == 1).await;
    let f = figures(&hooks);
    assert_eq!(
        (f.sent, f.retried, f.failed, f.dropped),
        (0, 2, 1, 0),
        "{f:?}"
    );
}

#[tokio::test]
async fn a_full_buffer_drops_and_counts_while_emit_returns_at_once() {
    let receiver = Receiver::start(&[], Answer::Stall).await;
    let mut config = hook(receiver.url());
    config.buffer = 10;
    let hooks = Webhooks::with_options(&[config], clock(), fast());
    let h = happening("a", Kind::StockChanged, "shop");
    let start = Instant::now();
    for _ in 0..100_000 {
        // `emit` is not async: it cannot wait for the stalled receiver.
        hooks.emit(h.clone());
    }
    let took = start.elapsed();
    assert!(took < Duration::from_secs(2), "100k emits took {took:?}");
    // The test's runtime has one thread, busy emitting: the delivery task
    // took nothing yet, so the buffer holds 10 and the rest was dropped.
    let f = figures(&hooks);
    assert_eq!((f.queued, f.dropped), (10, 99_990), "{f:?}");
    // The delivery task takes one, which stalls; the queue stays full.
    until("the first one sent", || receiver.seen().len() == 1).await;
    hooks.emit(h.clone());
    hooks.emit(h);
    let f = figures(&hooks);
    assert_eq!((f.sent, f.queued, f.dropped), (0, 10, 99_991), "{f:?}");
}

#[tokio::test]
async fn shutdown_gives_the_queue_a_grace_then_counts_the_rest_dropped() {
    let receiver = Receiver::start(&[], Answer::Stall).await;
    let hooks = Webhooks::with_options(&[hook(receiver.url())], clock(), fast());
    for i in 0..5 {
        hooks.emit(happening(&format!("h{i}"), Kind::QueueFormed, "shop"));
    }
    until("the first one sent", || receiver.seen().len() == 1).await;
    let start = Instant::now();
    hooks.shutdown(Duration::from_millis(200)).await;
    let took = start.elapsed();
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
    hooks.emit(happening("late", Kind::QueueDrained, "shop"));
    let f = figures(&hooks);
    assert_eq!((f.sent, f.failed, f.dropped), (0, 0, 6), "{f:?}");
}

#[tokio::test]
async fn admissions_are_folded_into_batches_with_their_total() {
    let receiver = Receiver::start(&[], Answer::Status(200)).await;
    let mut config = hook(receiver.url());
    config.batch = Duration::from_millis(100);
    let hooks = Webhooks::with_options(&[config], clock(), fast());
    for _ in 0..1000 {
        hooks.emit_admissions("shop", 1);
    }
    hooks.emit_admissions("hall", 5);
    hooks.emit_revokes("shop", &["v1".to_owned(), "v2".to_owned()]);
    hooks.emit_revokes("shop", &["v3".to_owned()]);
    until("three batches", || figures(&hooks).sent == 3).await;

    let seen = receiver.seen();
    let mut admitted = std::collections::BTreeMap::new();
    let mut revoked = Vec::new();
    for got in &seen {
        let body = got.json();
        let room = body["room"].as_str().unwrap().to_owned();
        assert_eq!(got.header(DELIVERY_HEADER), body["id"]);
        let instance = format!("{:016x}", hooks.instance_id());
        match got.header(KIND_HEADER) {
            "admissions" => {
                assert!(
                    body["id"]
                        .as_str()
                        .unwrap()
                        .starts_with(&format!("admissions:{room}:{instance}:")),
                    "{body}"
                );
                assert_eq!(body["data"]["from"], "2027-01-15T08:00:00.000Z");
                assert_eq!(body["data"]["to"], "2027-01-15T08:00:00.000Z");
                *admitted.entry(room).or_insert(0) += body["data"]["count"].as_u64().unwrap();
            }
            "revokes" => {
                assert_eq!(room, "shop");
                revoked.extend(
                    body["data"]["visitors"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_str().unwrap().to_owned()),
                );
            }
            other => panic!("{other}"),
        }
    }
    assert_eq!(seen.len(), 3, "one batch per room and kind");
    assert_eq!(admitted["shop"], 1000);
    assert_eq!(admitted["hall"], 5);
    assert_eq!(revoked, ["v1", "v2", "v3"]);
}

#[tokio::test]
async fn a_revokes_batch_that_reaches_its_cap_is_sent_at_once() {
    let receiver = Receiver::start(&[], Answer::Status(200)).await;
    let mut config = hook(receiver.url());
    config.batch = Duration::from_secs(3600);
    let hooks = Webhooks::with_options(&[config], clock(), fast());
    let visitors: Vec<String> = (0..MAX_REVOKES_PER_BATCH + 1)
        .map(|i| format!("v{i}"))
        .collect();
    hooks.emit_revokes("shop", &visitors);
    until("the full batch sent", || figures(&hooks).sent == 1).await;
    let first = receiver.seen()[0].json();
    assert_eq!(
        first["data"]["visitors"].as_array().unwrap().len(),
        MAX_REVOKES_PER_BATCH
    );
    // The one over the cap waits for the next batch (here: shutdown).
    hooks.shutdown(Duration::from_secs(2)).await;
    let seen = receiver.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[1].json()["data"]["visitors"],
        json!([format!("v{MAX_REVOKES_PER_BATCH}")])
    );
    assert_ne!(seen[0].json()["id"], seen[1].json()["id"]);
}

#[tokio::test]
async fn shutdown_sends_the_batches_first() {
    let receiver = Receiver::start(&[], Answer::Status(200)).await;
    let mut config = hook(receiver.url());
    config.batch = Duration::from_secs(3600);
    let hooks = Webhooks::with_options(&[config], clock(), fast());
    hooks.emit_admissions("shop", 3);
    hooks.emit_admissions("shop", 4);
    hooks.shutdown(Duration::from_secs(2)).await;
    let seen = receiver.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].json()["data"]["count"], 7);
    assert_eq!(figures(&hooks).sent, 1);
}

#[tokio::test]
async fn routing_follows_events_and_rooms() {
    let a = Receiver::start(&[], Answer::Status(200)).await;
    let b = Receiver::start(&[], Answer::Status(200)).await;
    let mut sold_out_only = hook(a.url());
    sold_out_only.events = vec![Kind::SoldOut, Kind::Admissions];
    let mut hall_only = hook(b.url());
    hall_only.rooms = Some(vec!["hall".to_owned()]);
    hall_only.batch = Duration::from_millis(50);
    let hooks = Webhooks::with_options(&[sold_out_only, hall_only], clock(), fast());
    assert!(!hooks.wants(Kind::StateChanged, "shop"));
    assert!(hooks.wants(Kind::StateChanged, "hall"));
    assert!(hooks.wants(Kind::SoldOut, "shop"));
    assert!(hooks.wants(Kind::Test, "any"));
    let dated = hooks.happening("1", Kind::SoldOut, "shop", json!({}));
    assert_eq!((dated.at_ms, dated.room.as_str()), (T0, "shop"));
    hooks.emit(dated);
    hooks.emit(happening("2", Kind::StateChanged, "shop"));
    hooks.emit(happening("3", Kind::StateChanged, "hall"));
    hooks.emit(happening("4", Kind::SoldOut, "hall"));
    hooks.emit_admissions("shop", 2);
    let ping = hooks.ping().unwrap();
    hooks.shutdown(Duration::from_secs(2)).await;

    let ids = |r: &Receiver| -> Vec<String> {
        r.seen()
            .iter()
            .map(|s| s.header(DELIVERY_HEADER).to_owned())
            .collect()
    };
    let a_ids = ids(&a);
    assert_eq!(a_ids[..3], ["1".to_owned(), "4".to_owned(), ping.clone()]);
    assert_eq!(a_ids.len(), 4, "{a_ids:?}");
    assert!(a_ids[3].starts_with("admissions:shop:"), "{a_ids:?}");
    assert_eq!(ids(&b), ["3".to_owned(), "4".to_owned(), ping]);
    let kinds: Vec<String> = b
        .seen()
        .iter()
        .map(|s| s.header(KIND_HEADER).to_owned())
        .collect();
    assert_eq!(kinds, ["state_changed", "sold_out", "test"]);
}

#[tokio::test]
async fn a_reload_keeps_what_is_unchanged_and_every_clone_follows_it() {
    let (a, b, c) = (
        Receiver::start(&[], Answer::Status(200)).await,
        Receiver::start(&[], Answer::Status(200)).await,
        Receiver::start(&[], Answer::Status(200)).await,
    );
    let hooks = Webhooks::with_options(&[hook(a.url()), hook(b.url())], clock(), fast());
    let gate = hooks.clone();
    gate.emit(happening("1", Kind::StateChanged, "shop"));
    until("both delivered", || {
        hooks.figures().iter().all(|f| f.sent == 1)
    })
    .await;

    // b now takes sold_out only; c is new.
    let mut b_sold_out = hook(b.url());
    b_sold_out.events = vec![Kind::SoldOut];
    hooks.reload(&[hook(a.url()), b_sold_out, hook(c.url())]);
    gate.emit(happening("2", Kind::StateChanged, "shop"));
    gate.emit(happening("3", Kind::SoldOut, "shop"));
    until("delivered", || {
        let f = hooks.figures();
        (f[0].sent, f[1].sent, f[2].sent) == (3, 2, 2)
    })
    .await;
    let ids = |r: &Receiver| -> Vec<String> {
        r.seen()
            .iter()
            .map(|s| s.header(DELIVERY_HEADER).to_owned())
            .collect()
    };
    assert_eq!(ids(&a), ["1", "2", "3"]);
    assert_eq!(ids(&b), ["1", "3"]);
    assert_eq!(ids(&c), ["2", "3"]);
    let urls: Vec<String> = hooks.figures().into_iter().map(|f| f.url).collect();
    assert_eq!(urls, [a.url(), b.url(), c.url()].map(|u| u.to_string()));

    // Reloaded to none: nothing is sent, nothing is counted.
    hooks.reload(&[]);
    assert!(gate.is_empty());
    gate.emit(happening("4", Kind::SoldOut, "shop"));
    assert_eq!(gate.ping(), None);
    assert!(gate.figures().is_empty());
    hooks.shutdown(Duration::from_secs(1)).await;
    assert_eq!(ids(&a), ["1", "2", "3"]);
}

// `waitroom check` refuses a bad [[webhook]] with exit code 64, naming
// the key and what is allowed.

const KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

fn check(webhook: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("waitroom.toml");
    std::fs::write(
        &path,
        format!(
            "[origin]\nurl = \"http://127.0.0.1:3000\"\n\n\
             [[room]]\nid = \"shop\"\npath = \"/\"\ntotal_active_users = 10\nnew_users_per_minute = 60\n\n\
             [[webhook]]\n{webhook}\n"
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .args(["check", "--config"])
        .arg(&path)
        .env("WAITROOM_COOKIE_KEYS", KEY)
        .env_remove("HOOK_SECRET")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_accepts_a_good_webhook() {
    let (code, stderr) = check(
        "url = \"https://hooks.example/in\"\nsecret = \"0123456789abcdef\"\nevents = [\"sold_out\"]\nrooms = [\"shop\"]",
    );
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn check_exits_64_on_a_bad_webhook() {
    let secret = "secret = \"0123456789abcdef\"";
    let url = "url = \"https://hooks.example/in\"";
    for (webhook, says) in [
        (
            format!("url = \"ftp://hooks.example/in\"\n{secret}"),
            "webhook[0].url (line 11, column 7): \"ftp://hooks.example/in\" is not an http:// or https:// URL with a host",
        ),
        (
            url.to_owned(),
            "webhook[0].secret (line 10, column 1): missing: the signing secret, at least 16 bytes",
        ),
        (
            format!("{url}\nsecret = \"short\""),
            "webhook[0].secret (line 12, column 10): must be at least 16 bytes, got 5",
        ),
        (
            format!("{url}\nsecret_env = \"HOOK_SECRET\""),
            "webhook[0].secret_env (line 12, column 14): environment variable HOOK_SECRET is not set",
        ),
        (
            format!("{url}\n{secret}\nevents = [\"sold\"]"),
            "webhook[0].events[0] (line 13, column 11): unknown kind \"sold\"; the kinds are state_changed,",
        ),
        (
            format!("{url}\n{secret}\nrooms = [\"hall\"]"),
            "webhook[0].rooms[0] (line 13, column 10): \"hall\" is not a room's id; the rooms are shop",
        ),
        (
            format!("{url}\n{secret}\nbuffer = 0"),
            "webhook[0].buffer (line 13, column 10): must be between 1 and 1000000, got 0",
        ),
        (
            format!("{url}\n{secret}\ntimeout = \"90s\""),
            "webhook[0].timeout (line 13, column 11): must be between 100ms and 60s, got \"90s\"",
        ),
    ] {
        let (code, stderr) = check(&webhook);
        assert_eq!(code, Some(64), "{webhook}: {stderr}");
        assert!(stderr.contains(says), "{webhook}:\n{stderr}");
    }
}
