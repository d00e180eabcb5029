//! The estimated wait is honest from the first second of a flash crowd: after
//! quiet minutes, a crowd ramps up on a room of 40 whose visitors stay 1-4 s,
//! holds, and ramps down. What each queued visitor is told on arrival is
//! within ±25% of the wait they actually get (median), and no visitor's
//! estimate jumps tenfold between two polls (docs/how-it-works.md, "The
//! queue page and the status API").

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use support::{admitted_id, from_origin, Harness, Lcg};
use waitroom::store::{End, VisitorId};

struct Visitor {
    client: reqwest::Client,
    joined: u64,
    /// Every `eta_seconds` the visitor was told while queued, first on arrival.
    etas: Vec<u64>,
    admitted: Option<u64>,
}

/// Quiet arrivals per second before and after the crowd.
const QUIET: f64 = 0.5;
/// Arrivals per second at the crowd's peak.
const PEAK: f64 = 20.0;
/// The crowd starts after this many quiet seconds.
const SPIKE_AT: u64 = 300;
const RAMP: u64 = 30;
const PLATEAU: u64 = 40;
/// Seconds of the whole run; the queue has drained well before.
const END: u64 = SPIKE_AT + 2 * RAMP + PLATEAU + 240;
/// How often a waiting page polls.
const REFRESH: u64 = 5;

/// Arrivals per second at second `t`.
fn arrival_rate(t: u64) -> f64 {
    let s = t as f64 - SPIKE_AT as f64;
    let (ramp, plateau) = (RAMP as f64, PLATEAU as f64);
    let share = if s < 0.0 {
        0.0
    } else if s < ramp {
        s / ramp
    } else if s < ramp + plateau {
        1.0
    } else if s < 2.0 * ramp + plateau {
        (2.0 * ramp + plateau - s) / ramp
    } else {
        0.0
    };
    QUIET + (PEAK - QUIET) * share
}

/// The value at quantile `q` of sorted `xs`.
fn quantile(xs: &[f64], q: f64) -> f64 {
    xs[((xs.len() - 1) as f64 * q).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_flash_crowd_the_first_estimate_is_within_a_quarter_of_the_real_wait() {
    let h = Harness::start(|c| {
        c.rooms[0].total_active_users = 40;
        c.rooms[0].session_duration = Duration::from_secs(600);
        c.rooms[0].refresh_interval = Duration::from_secs(REFRESH);
        c.rooms[0].abandon_after = Duration::from_secs(600);
        c.server.ip_poll_burst = 1_000_000;
        c.server.ip_polls_per_second = 1_000_000;
    })
    .await;
    let mut rng = Lcg(7);
    let mut visitors: Vec<Visitor> = Vec::new();
    // Second -> visitors leaving then.
    let mut departures: BTreeMap<u64, Vec<VisitorId>> = BTreeMap::new();
    let mut due = 0.0;

    for t in 0..=END {
        if t > 0 {
            h.clock.advance(Duration::from_secs(1));
        }
        for id in departures.remove(&t).unwrap_or_default() {
            h.store()
                .end(&h.policy(), id, End::Release, h.clock_now())
                .await
                .unwrap();
        }
        h.daemon.gate().refresh_room_figures().await;
        due += if t + 120 < END { arrival_rate(t) } else { 0.0 };
        while due >= 1.0 {
            due -= 1.0;
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
                etas: vec![],
                admitted: None,
            };
            if from_origin(&resp) {
                v.admitted = Some(t);
                let id = admitted_id(resp).await;
                departures
                    .entry(t + rng.between(1, 4))
                    .or_default()
                    .push(id);
            } else {
                let s: serde_json::Value = resp.json().await.unwrap();
                v.etas.push(s["eta_seconds"].as_u64().unwrap());
            }
            visitors.push(v);
        }
        // Each waiting page polls every few seconds; once admitted the
        // visitor loads the page, looks for 1-4 s and leaves.
        for v in visitors
            .iter_mut()
            .filter(|v| v.admitted.is_none() && t > v.joined && (t - v.joined) % REFRESH == 0)
        {
            let s = h.status(&v.client).await;
            if s["state"] == "admitted" {
                v.admitted = Some(t);
                let id = admitted_id(v.client.get(h.url("/")).send().await.unwrap()).await;
                departures
                    .entry(t + rng.between(1, 4))
                    .or_default()
                    .push(id);
            } else {
                assert_eq!(s["state"], "queued", "{s}");
                v.etas.push(s["eta_seconds"].as_u64().unwrap());
            }
        }
    }

    let queued: Vec<&Visitor> = visitors.iter().filter(|v| !v.etas.is_empty()).collect();
    assert!(queued.len() >= 500, "{} visitors queued", queued.len());
    let mut errors: Vec<f64> = queued
        .iter()
        .map(|v| {
            let real = v.admitted.expect("everyone gets in") - v.joined;
            (v.etas[0] as f64 - real as f64).abs() / real as f64
        })
        .collect();
    errors.sort_by(f64::total_cmp);
    let (median, p90) = (quantile(&errors, 0.5), quantile(&errors, 0.9));
    let waits: Vec<u64> = queued
        .iter()
        .map(|v| v.admitted.unwrap() - v.joined)
        .collect();
    println!(
        "{} of {} visitors queued (longest wait {} s); first estimate |error|: median {:.1}%, p90 {:.1}%",
        queued.len(),
        visitors.len(),
        waits.iter().max().unwrap(),
        median * 100.0,
        p90 * 100.0,
    );
    // The largest jump between two estimates a visitor saw in a row.
    let jump = queued
        .iter()
        .flat_map(|v| v.etas.windows(2))
        .map(|w| w[0].max(w[1]).max(1) as f64 / w[0].min(w[1]).max(1) as f64)
        .fold(1f64, f64::max);
    println!("largest jump between two polls: {jump:.1}x");
    // How the error runs through the crowd, by the second the visitor came.
    for chunk in queued.chunks(queued.len().div_ceil(10)) {
        let first = chunk[0];
        let mut e: Vec<f64> = chunk
            .iter()
            .map(|v| {
                let real = (v.admitted.unwrap() - v.joined) as f64;
                (v.etas[0] as f64 - real) / real
            })
            .collect();
        e.sort_by(f64::total_cmp);
        println!(
            "  joined from {:>4} s: wait {:>3} s, told {:>3} s, median error {:+.0}%",
            first.joined,
            first.admitted.unwrap() - first.joined,
            first.etas[0],
            quantile(&e, 0.5) * 100.0
        );
    }
    assert!(median <= 0.25, "median error {:.0}%", median * 100.0);
    assert!(p90 <= 0.40, "p90 error {:.0}%", p90 * 100.0);
    assert!(
        jump < 10.0,
        "an estimate jumped {jump:.1}x between two polls"
    );
}
