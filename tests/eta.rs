//! The estimated wait is honest: in a steady queue, what a visitor is told on
//! arrival is within ±25% of the wait they actually get (docs/how-it-works.md,
//! "The queue page and the status API").

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use support::{admitted_id, from_origin, Harness, Lcg};
use waitroom::store::{End, VisitorId};

struct Visitor {
    client: reqwest::Client,
    joined: u64,
    /// `eta_seconds` told on arrival (None: admitted straight away).
    eta: Option<u64>,
    admitted: Option<u64>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_steady_queue_the_estimate_is_within_a_quarter_of_the_real_wait() {
    // 10 places; each admitted visitor shops for 40-100 s and checks out
    // (the origin's revoke), so about one place frees every 7 s. Arrivals at
    // one per 7 s on top of an initial crowd keep the queue steady.
    let h = Harness::start(|c| {
        c.rooms[0].total_active_users = 10;
        c.rooms[0].session_duration = Duration::from_secs(600);
        c.rooms[0].refresh_interval = Duration::from_secs(5);
        c.rooms[0].abandon_after = Duration::from_secs(600);
        c.server.ip_poll_burst = 1_000_000;
        c.server.ip_polls_per_second = 1_000_000;
    })
    .await;
    let mut rng = Lcg(42);
    let mut visitors: Vec<Visitor> = Vec::new();
    // Checkout time -> visitors leaving then.
    let mut checkouts: BTreeMap<u64, Vec<VisitorId>> = BTreeMap::new();

    const END: u64 = 50 * 60;
    for t in 0..=END {
        if t > 0 {
            h.clock.advance(Duration::from_secs(1));
        }
        for id in checkouts.remove(&t).unwrap_or_default() {
            h.store()
                .end(&h.policy(), id, End::Release, h.clock_now())
                .await
                .unwrap();
        }
        if t % 2 == 0 {
            h.daemon.gate().refresh_room_figures().await;
        }
        let arrivals = if t == 0 {
            40
        } else {
            u64::from(t % 7 == 0 && t < END - 900)
        };
        for _ in 0..arrivals {
            let client = h.visitor();
            let resp = client
                .get(h.url("/"))
                .header("accept", "application/json")
                .send()
                .await
                .unwrap();
            let mut v = Visitor {
                client,
                joined: t,
                eta: None,
                admitted: None,
            };
            if from_origin(&resp) {
                v.admitted = Some(t);
                let id = admitted_id(resp).await;
                checkouts
                    .entry(t + rng.between(40, 100))
                    .or_default()
                    .push(id);
            } else {
                let s: serde_json::Value = resp.json().await.unwrap();
                v.eta = s["eta_seconds"].as_u64();
            }
            visitors.push(v);
        }
        // Each waiting page polls every 5 s; once admitted it goes shopping.
        for v in visitors
            .iter_mut()
            .filter(|v| v.admitted.is_none() && (t - v.joined) % 5 == 0 && t > v.joined)
        {
            let s = h.status(&v.client).await;
            if s["state"] == "admitted" {
                v.admitted = Some(t);
                let id = admitted_id(v.client.get(h.url("/")).send().await.unwrap()).await;
                checkouts
                    .entry(t + rng.between(40, 100))
                    .or_default()
                    .push(id);
            }
        }
    }
    // Visitors who joined once the queue was steady (after 10 minutes).
    let measured: Vec<(u64, u64)> = visitors
        .iter()
        .filter(|v| v.joined >= 600 && v.eta.is_some())
        .map(|v| {
            (
                v.eta.unwrap(),
                v.admitted.expect("everyone gets in") - v.joined,
            )
        })
        .collect();
    assert!(
        measured.len() >= 100,
        "{} visitors measured",
        measured.len()
    );
    let errors: Vec<f64> = measured
        .iter()
        .map(|&(eta, real)| (eta as f64 - real as f64) / real as f64)
        .collect();
    let worst = errors.iter().fold(0f64, |m, e| m.max(e.abs()));
    let mean = errors.iter().map(|e| e.abs()).sum::<f64>() / errors.len() as f64;
    let mean_wait = measured.iter().map(|m| m.1).sum::<u64>() as f64 / measured.len() as f64;
    println!(
        "measured {} waits (mean {:.0} s); mean |error| {:.1}%, worst {:.1}%",
        errors.len(),
        mean_wait,
        mean * 100.0,
        worst * 100.0
    );
    assert!(
        worst <= 0.25,
        "worst estimate off by {:.0}%: {measured:?}",
        worst * 100.0
    );
}
