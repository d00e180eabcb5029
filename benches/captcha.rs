//! What a captcha provider's `siteverify` round trip adds to a newcomer's
//! wait for its queue place: the daemon (memory store, a full room that
//! queues) in front of a local origin, newcomers one after the other,
//! each bringing a captcha token the local stand-in verifier takes, next
//! to the same newcomers in the same room without a challenge, measured in
//! the same run, alternating. The stand-in answers at once (the loopback
//! round trip and the daemon's own work) or after a delay like a real
//! provider's across the internet.
//!
//! `cargo bench --bench captcha`; `WR_BENCH_N` (default 2000) newcomers
//! per variant and round, `WR_BENCH_ROUNDS` (default 2),
//! `WR_BENCH_VERIFY_MS` (default 30) the slow verifier's delay.

#[path = "../tests/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use support::Harness;
use waitroom::config::{Captcha, ChallengeKind, OnVerifyError, Secret};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A stand-in `siteverify`: takes every token, after `delay`.
async fn verifier(delay: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| async move {
                    let _ = req.into_body().collect().await;
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    let body = r#"{"success":true,"error-codes":[]}"#;
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(body))))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

/// Room "shop" for one, full (so it queues), asking the captcha verified
/// at `verify` (none: no challenge).
async fn daemon(verify: Option<SocketAddr>) -> Harness {
    let h = Harness::start(move |c| {
        c.rooms[0].total_active_users = 1;
        c.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        c.rooms[0].captcha = verify.map(|addr| Captcha {
            kind: ChallengeKind::Turnstile,
            site_key: "0x4AAA-site-key".into(),
            secret: Secret("s3cret".into()),
            verify_url: format!("http://{addr}/siteverify").parse().unwrap(),
            script_url: format!("http://{addr}/api.js"),
            timeout: Duration::from_secs(3),
            on_error: OnVerifyError::Closed,
            concurrency: 64,
        });
    })
    .await;
    let (status, _, _) = h
        .page("/shop/", &[("x-forwarded-for", "198.51.100.1")])
        .await;
    assert_eq!(status, 200, "the first visitor fills the room");
    // The next one finds it full: from then on the room queues (and asks).
    h.page("/shop/", &[("x-forwarded-for", "198.51.100.2")])
        .await;
    h
}

/// Sorted latencies of `n` newcomers, each a new address and token.
async fn newcomers(h: &Harness, n: u64, round: u64) -> Vec<Duration> {
    let client = h.bare();
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let k = round * n + i;
        let ip = format!("10.{}.{}.{}", k >> 16 & 255, k >> 8 & 255, k & 255);
        let token = format!("good-{k}");
        let started = Instant::now();
        let resp = client
            .get(h.url("/shop/"))
            .header("x-forwarded-for", ip)
            .header("x-waitroom-captcha", token)
            .header("accept", "application/json")
            .send()
            .await
            .unwrap();
        let body: serde_json::Value = resp.json().await.unwrap();
        out.push(started.elapsed());
        assert_eq!(body["state"], "queued", "{body}");
    }
    out.sort();
    out
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn main() {
    // Under `cargo test` (no `--bench`) a quick smoke run keeps CI short.
    let measuring = std::env::args().any(|a| a == "--bench");
    let n = env_or("WR_BENCH_N", if measuring { 2000 } else { 20 });
    let rounds = env_or("WR_BENCH_ROUNDS", if measuring { 2 } else { 1 });
    let slow = Duration::from_millis(env_or("WR_BENCH_VERIFY_MS", 30));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let fast = verifier(Duration::ZERO).await;
        let delayed = verifier(slow).await;
        let variants = [
            ("no challenge", None),
            ("captcha, verifier at once", Some(fast)),
            ("captcha, verifier slow", Some(delayed)),
        ];
        println!(
            "captcha: a newcomer's time to its queue place, {n} newcomers per variant and round (slow verifier: {} ms)",
            slow.as_millis()
        );
        for round in 0..rounds {
            println!("round {}:", round + 1);
            let mut base = None;
            let mut order: Vec<_> = variants.iter().collect();
            if round % 2 == 1 {
                order.reverse();
            }
            let mut lines = Vec::new();
            for (name, verify) in order {
                let h = daemon(*verify).await;
                let lat = newcomers(&h, n, round).await;
                let p50 = pct(&lat, 0.5);
                if verify.is_none() {
                    base = Some(p50);
                }
                lines.push((name, p50, pct(&lat, 0.99)));
            }
            let base = base.unwrap();
            for (name, p50, p99) in lines {
                println!(
                    "  {name:<28} p50 {p50:>7.3} ms (+{:.3} ms)  p99 {p99:>7.3} ms",
                    p50 - base
                );
            }
        }
    });
}
