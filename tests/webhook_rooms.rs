//! What the rooms send their webhooks, over real HTTP in front of a real
//! origin, to a receiver on loopback: the operator's changes (state,
//! limits, stock, notice), the origin's sold out, the queue forming and
//! draining, event phases, and the admissions and revokes batches, each
//! signed; with two instances on one Redis, every room-level happening is
//! delivered once.

#[path = "support/redis_server.rs"]
mod redis_server;
mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use redis_server::RedisServer;
use serde_json::{json, Value};
use support::{admitted_id, from_origin, Harness};
use tokio::net::TcpListener;
use waitroom::config::{Backend, Config, FailMode, Secret};
use waitroom::webhook::{verify, WebhookConfig, SIGNATURE_HEADER, TIMESTAMP_HEADER};

const TOKEN: &str = "s3cret-admin-token";
const SECRET: &str = "a webhook secret of 32 bytes....";

/// Records every delivery (its body, once its signature checked out).
struct Receiver {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    async fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&got);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let got = Arc::clone(&recorded);
                tokio::spawn(async move {
                    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let got = Arc::clone(&got);
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body.collect().await.unwrap().to_bytes();
                            let header = |n: &str| {
                                parts.headers.get(n).unwrap().to_str().unwrap().to_owned()
                            };
                            assert!(verify(
                                SECRET.as_bytes(),
                                &header(TIMESTAMP_HEADER),
                                &body,
                                &header(SIGNATURE_HEADER)
                            ));
                            got.lock()
                                .unwrap()
                                .push(serde_json::from_slice(&body).unwrap());
                            Ok::<_, Infallible>(
                                Response::builder()
                                    .status(StatusCode::NO_CONTENT)
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
        Receiver { addr, got, task }
    }

    fn config(&self) -> WebhookConfig {
        WebhookConfig {
            batch: Duration::from_secs(1),
            ..WebhookConfig::new(
                format!("http://{}/hook", self.addr).parse().unwrap(),
                Secret(SECRET.to_owned()),
            )
        }
    }

    fn of(&self, kind: &str) -> Vec<Value> {
        let got = self.got.lock().unwrap();
        got.iter().filter(|h| h["kind"] == kind).cloned().collect()
    }

    /// Waits (bounded) until a delivery of `kind` satisfies `want`.
    async fn until(&self, kind: &str, want: impl Fn(&Value) -> bool) -> Value {
        let started = Instant::now();
        loop {
            if let Some(h) = self.of(kind).into_iter().find(|h| want(h)) {
                return h;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "no {kind} delivered; got {:?}",
                self.got.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn with_hook(receiver: &Receiver) -> impl Fn(&mut Config) + '_ {
    move |c: &mut Config| {
        c.server.admin_token = Some(Secret(TOKEN.into()));
        c.rooms[0].total_active_users = 1;
        c.rooms[0].session_duration = Duration::from_secs(600);
        c.rooms[0].abandon_after = Duration::from_secs(600);
        c.webhooks = vec![receiver.config()];
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rooms_happenings_reach_its_webhook_signed() {
    let r = Receiver::start().await;
    let h = Harness::start(with_hook(&r)).await;

    h.patch_room_ok("shop", json!({"state": "closed"})).await;
    let closed = r.until("state_changed", |_| true).await;
    assert_eq!(closed["room"], "shop");
    assert_eq!(closed["data"], json!({"from": "open", "to": "closed"}));
    assert!(closed["id"].as_str().unwrap().starts_with("shop:rev:"));
    h.patch_room_ok("shop", json!({"state": "open", "stock": 5}))
        .await;
    r.until("state_changed", |h| h["data"]["to"] == "open")
        .await;
    let stock = r.until("stock_changed", |_| true).await;
    assert_eq!(stock["data"], json!({"from": null, "to": 5}));
    h.patch_room_ok("shop", json!({"notice": {"text": "back at 10:15"}}))
        .await;
    let notice = r.until("notice_changed", |_| true).await;
    assert_eq!(notice["data"]["text"], "back at 10:15");
    h.patch_room_ok("shop", json!({"total_active_users": 2}))
        .await;
    let limit = r.until("limit_changed", |_| true).await;
    assert_eq!(
        limit["data"],
        json!({"field": "total_active_users", "from": 1, "to": 2})
    );

    // Two let in, two queued: the queue forms, and the admissions batch
    // counts the two.
    let a = admitted_id(h.visitor().get(h.url("/")).send().await.unwrap()).await;
    assert!(from_origin(
        &h.visitor().get(h.url("/")).send().await.unwrap()
    ));
    let waiting = h.visitor();
    assert!(!from_origin(&waiting.get(h.url("/")).send().await.unwrap()));
    assert!(!from_origin(
        &h.visitor().get(h.url("/")).send().await.unwrap()
    ));
    h.daemon.gate().refresh_room_figures().await;
    let formed = r.until("queue_formed", |_| true).await;
    assert_eq!(formed["data"], json!({"queued": 2}));
    h.daemon.gate().refresh_room_figures().await;
    let batch = r.until("admissions", |_| true).await;
    assert_eq!(batch["data"]["count"], 2, "{batch}");

    // A release is a revoke, and names the visitor.
    h.release_ok(a).await;
    let revokes = r.until("revokes", |_| true).await;
    assert_eq!(revokes["data"]["visitors"], json!([a.to_hex()]));

    // Nobody left waiting: drained.
    h.patch_room_ok("shop", json!({"total_active_users": 10}))
        .await;
    assert_eq!(h.status(&waiting).await["state"], "admitted");
    h.daemon.gate().refresh_room_figures().await;
    h.daemon.gate().refresh_room_figures().await;
    r.until("queue_drained", |_| true).await;

    // The origin's sold out.
    let buyer = h.visitor();
    assert!(from_origin(&buyer.get(h.url("/")).send().await.unwrap()));
    buyer.get(h.url("/sold-out")).send().await.unwrap();
    r.until("sold_out", |_| true).await;
    r.until("state_changed", |h| {
        h["data"]["to"] == "closed" && h["id"] != closed["id"]
    })
    .await;

    // Each happening once.
    let got = r.got.lock().unwrap().clone();
    let mut ids: Vec<&str> = got.iter().map(|h| h["id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    let n = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), n, "{got:?}");
    assert_eq!(r.of("queue_formed").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_deliver_each_happening_once() {
    let server = RedisServer::start();
    let r = Receiver::start().await;
    let on_redis = |c: &mut Config| {
        with_hook(&r)(c);
        c.store.backend = Backend::Redis {
            urls: vec![server.url()],
        };
        c.store.fail_mode = FailMode::Closed;
    };
    let h1 = Harness::start(on_redis).await;
    let h2 = Harness::start(on_redis).await;
    let both = [&h1, &h2];

    h1.patch_room_ok("shop", json!({"state": "paused"})).await;
    // An event whose prequeue begins a minute from now.
    let event = json!({"name": "drop", "prequeue_start": "2027-01-15T08:01:00Z",
                       "start": "2027-01-15T08:05:00Z", "end": "2027-01-15T09:00:00Z"});
    let resp = h1
        .bare()
        .post(h1.admin_url("/api/rooms/shop/events"))
        .bearer_auth(TOKEN)
        .json(&event)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    for h in both {
        h.daemon.gate().refresh_overrides().await;
        h.daemon.gate().refresh_room_figures().await;
    }
    // Into the prequeue; two newcomers wait; every instance looks twice.
    for h in both {
        h.clock.advance(Duration::from_secs(90));
    }
    assert!(!from_origin(
        &h1.visitor().get(h1.url("/")).send().await.unwrap()
    ));
    assert!(!from_origin(
        &h2.visitor().get(h2.url("/")).send().await.unwrap()
    ));
    for _ in 0..2 {
        for h in both {
            h.daemon.gate().refresh_overrides().await;
            h.daemon.gate().refresh_room_figures().await;
        }
    }
    // A marker from each instance, after anything it could send twice.
    h1.patch_room_ok("shop", json!({"notice": {"text": "one"}}))
        .await;
    r.until("notice_changed", |h| h["data"]["text"] == "one")
        .await;
    h2.patch_room_ok("shop", json!({"notice": {"text": "two"}}))
        .await;
    r.until("notice_changed", |h| h["data"]["text"] == "two")
        .await;
    for h in both {
        h.daemon.gate().refresh_overrides().await;
    }
    h1.patch_room_ok("shop", json!({"notice": {"text": "three"}}))
        .await;
    r.until("notice_changed", |h| h["data"]["text"] == "three")
        .await;
    h2.patch_room_ok("shop", json!({"notice": {"text": "four"}}))
        .await;
    r.until("notice_changed", |h| h["data"]["text"] == "four")
        .await;

    let states = r.of("state_changed");
    assert_eq!(states.len(), 1, "{states:?}");
    assert_eq!(states[0]["data"], json!({"from": "open", "to": "paused"}));
    let phases = r.of("event_phase");
    assert_eq!(phases.len(), 1, "{phases:?}");
    assert_eq!(
        phases[0]["data"],
        json!({"event": "drop", "phase": "prequeue"})
    );
    let formed = r.of("queue_formed");
    assert_eq!(formed.len(), 1, "{formed:?}");
    assert_eq!(r.of("notice_changed").len(), 4);
}
