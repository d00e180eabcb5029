//! Reports over real HTTP: a drop's account (arrivals, admissions, queue,
//! revokes, no-shows, time in queue and on the origin, peaks, the
//! per-minute series) read from the admin API as JSON and CSV, per room
//! and per event; two instances on one Redis add up to one account; the
//! retention drops old minutes on the injected clock.

#[path = "support/redis_server.rs"]
mod redis_server;
mod support;

use std::time::Duration;

use redis_server::RedisServer;
use serde_json::{json, Value};
use support::{admitted_id, from_origin, Harness};
use waitroom::config::{Backend, Config, FailMode, Secret};

const TOKEN: &str = "s3cret-admin-token";

/// A room of two places, with an admin token.
fn two(c: &mut Config) {
    c.server.admin_token = Some(Secret(TOKEN.into()));
    c.rooms[0].total_active_users = 2;
    c.rooms[0].abandon_after = Duration::from_secs(600);
    c.rooms[0].session_duration = Duration::from_secs(300);
}

async fn report(h: &Harness, query: &str) -> Value {
    let resp = h.admin_get(&format!("/api/rooms/shop/report{query}")).await;
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

/// A newcomer: its client, and whether the origin answered it.
async fn newcomer(h: &Harness) -> (reqwest::Client, bool) {
    let v = h.visitor();
    let resp = v.get(h.url("/")).send().await.unwrap();
    (v, from_origin(&resp))
}

fn near(v: &Value, want: f64) -> bool {
    v.as_f64()
        .is_some_and(|got| (got - want).abs() <= want * 0.05)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_is_accounted_for_from_arrival_to_no_show() {
    let h = Harness::start(two).await;
    // Two let in at once, three queued.
    let a = admitted_id(h.visitor().get(h.url("/")).send().await.unwrap()).await;
    let b = admitted_id(h.visitor().get(h.url("/")).send().await.unwrap()).await;
    let mut queued = Vec::new();
    for _ in 0..3 {
        let (v, passed) = newcomer(&h).await;
        assert!(!passed);
        queued.push(v);
    }
    h.daemon.gate().refresh_room_figures().await;
    // 30 s later the first leaves; the head of the queue comes for its place.
    h.clock.advance(Duration::from_secs(30));
    h.release_ok(a).await;
    assert_eq!(h.status(&queued[0]).await["state"], "admitted");
    // 30 s later the second leaves; the next is let in but never comes.
    h.clock.advance(Duration::from_secs(30));
    h.release_ok(b).await;

    let r = report(&h, "").await;
    let t = &r["totals"];
    assert_eq!(t["arrivals"], 5, "{r}");
    assert_eq!(t["admitted"], 3, "{t}");
    assert_eq!(t["queued"], 3, "{t}");
    assert_eq!(t["revoked"], 2, "{t}");
    assert_eq!(t["no_shows"], 1, "{t}");
    assert_eq!(t["rejected"], 0, "{t}");
    assert_eq!(r["peak_queue"], 3, "{r}");
    assert_eq!(r["peak_active"], 2, "{r}");
    assert_eq!(r["wait"]["count"], 1);
    assert!(near(&r["wait"]["p50_seconds"], 30.0), "{}", r["wait"]);
    // Stays of 30 s and 60 s, ended by the releases.
    assert_eq!(r["time_on_origin"]["count"], 2);
    assert!(
        near(&r["time_on_origin"]["p50_seconds"], 30.0),
        "{}",
        r["time_on_origin"]
    );
    assert!(
        near(&r["time_on_origin"]["p90_seconds"], 60.0),
        "{}",
        r["time_on_origin"]
    );
    // The last day, minute by minute, quiet minutes included.
    let minutes = r["minutes"].as_array().unwrap();
    assert_eq!(minutes.len(), 24 * 60 + 1);
    let busy: u64 = minutes
        .iter()
        .map(|m| m["arrivals"].as_u64().unwrap())
        .sum();
    assert_eq!(busy, 5);
    assert_eq!(minutes.last().unwrap()["t"], "2027-01-15T08:01:00Z");

    // The same series as CSV.
    let resp = h.admin_get("/api/rooms/shop/report?format=csv").await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/csv"));
    let csv = resp.text().await.unwrap();
    let lines: Vec<&str> = csv.split("\r\n").filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), minutes.len() + 1);
    assert!(lines[0].starts_with("minute,arrivals,admitted,queued"));
    assert!(
        lines[lines.len() - 2].starts_with("2027-01-15T08:00:00Z,5,2,3,0,"),
        "{}",
        lines[lines.len() - 2]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_add_up_to_one_account() {
    let server = RedisServer::start();
    let on_redis = |c: &mut Config| {
        two(c);
        c.store.backend = Backend::Redis {
            urls: vec![server.url()],
        };
        c.store.fail_mode = FailMode::Closed;
    };
    let h1 = Harness::start(on_redis).await;
    let h2 = Harness::start(on_redis).await;
    assert!(newcomer(&h1).await.1);
    assert!(newcomer(&h2).await.1);
    assert!(!newcomer(&h1).await.1);
    assert!(!newcomer(&h2).await.1);
    // Each instance writes its share when asked; either reads the whole.
    let from_h2 = report(&h2, "").await;
    let from_h1 = report(&h1, "").await;
    for (name, r) in [("h1", &from_h1), ("h2", &from_h2)] {
        if name == "h2" {
            // Read before h1 wrote: h2's own share, and what h1 had written.
            assert!(
                r["totals"]["arrivals"].as_u64().unwrap() >= 2,
                "{name}: {r}"
            );
            continue;
        }
        assert_eq!(r["totals"]["arrivals"], 4, "{name}: {r}");
        assert_eq!(r["totals"]["admitted"], 2, "{name}: {r}");
        assert_eq!(r["totals"]["queued"], 2, "{name}: {r}");
        assert_eq!(r["totals"]["no_shows"], 0, "{name}: {r}");
        assert_eq!(r["peak_queue"], 2, "{name}: {r}");
    }
    // Read again, from h2: nothing counted twice.
    let again = report(&h2, "").await;
    assert_eq!(again["totals"], from_h1["totals"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_events_retention_and_bad_requests() {
    let h = Harness::start(|c| {
        two(c);
        c.reports.retention = Duration::from_secs(3600);
    })
    .await;
    assert!(newcomer(&h).await.1);
    let t0 = h.clock_now();
    let window = format!("?from={t0}&to={}", t0 + 60_000);
    assert_eq!(report(&h, &window).await["totals"]["admitted"], 1);
    // An RFC 3339 window that ends before the admission holds nothing.
    let before = report(&h, "?from=2027-01-15T07:00:00Z&to=2027-01-15T07:59:00Z").await;
    assert_eq!(before["totals"]["admitted"], 0);
    assert_eq!(before["minutes"].as_array().unwrap().len(), 60);

    // An event's report covers the event by default.
    let event =
        json!({"name": "drop", "start": "2027-01-15T10:00:00Z", "end": "2027-01-15T11:00:00Z"});
    let resp = h
        .bare()
        .post(h.admin_url("/api/rooms/shop/events"))
        .bearer_auth(TOKEN)
        .json(&event)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    h.clock.advance(Duration::from_secs(3 * 3600));
    let resp = h.admin_get("/api/rooms/shop/events/drop/report").await;
    assert_eq!(resp.status(), 200);
    let r: Value = resp.json().await.unwrap();
    assert_eq!(r["from"], "2027-01-15T10:00:00Z");
    assert_eq!(r["to"], "2027-01-15T11:01:00Z");
    assert_eq!(
        h.admin_get("/api/rooms/shop/events/nope/report")
            .await
            .status(),
        404
    );

    // Past the retention (an hour) the admission's minute is gone.
    assert_eq!(report(&h, &window).await["totals"]["admitted"], 0);

    for bad in [
        format!("?from={}&to={t0}", t0 + 1),
        format!("?from={t0}&to={}", t0 + 32 * 24 * 3600 * 1000),
        "?format=xml".to_owned(),
        "?from=yesterday".to_owned(),
        "?room=shop".to_owned(),
    ] {
        let resp = h.admin_get(&format!("/api/rooms/shop/report{bad}")).await;
        assert_eq!(resp.status(), 400, "{bad}");
    }
    // The token is needed.
    let resp = h
        .bare()
        .get(h.admin_url("/api/rooms/shop/report"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
}
