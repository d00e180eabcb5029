//! Region mode end to end: two `waitroom` daemons, each in its own region
//! (its own regional redis-server) and one global redis-server, real HTTP
//! visitors to both. Capacity holds across the two, visitors beyond it
//! queue and go in when sessions end (the tests' clock moves), and each
//! daemon's background sync runs (its grant on `/metrics`).
//!
//! The sync task runs on the tests' clock (every `sync_interval` of it, 50 ms
//! here): the test moves the clock one interval and waits for each daemon's
//! round at that time to finish (`Region::rounds`), never a fixed sleep.

#[path = "support/redis_server.rs"]
mod redis_server;
mod support;

use std::time::Duration;

use redis_server::RedisServer;
use support::{from_origin, origin::Origin, Harness};
use waitroom::clock::{Clock, ManualClock};
use waitroom::config::{Backend, Config, RegionConfig};

const LIMIT: u64 = 4;
const SESSION: Duration = Duration::from_secs(60);
const DEADLINE: Duration = Duration::from_secs(20);
const SYNC: Duration = Duration::from_millis(50);

async fn redis() -> RedisServer {
    tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap()
}

fn in_region<'a>(
    name: &'a str,
    regional: &'a RedisServer,
    global: &'a RedisServer,
) -> impl FnOnce(&mut Config) + 'a {
    move |c: &mut Config| {
        c.store.backend = Backend::Redis {
            urls: vec![regional.url()],
        };
        c.store.timeout = Duration::from_millis(500);
        // The test polls while it waits for the syncs.
        c.server.ip_polls_per_second = 100_000;
        c.server.ip_poll_burst = 100_000;
        c.region = Some(RegionConfig {
            name: name.into(),
            global_url: global.url(),
            sync_interval: SYNC,
        });
        let room = &mut c.rooms[0];
        room.total_active_users = LIMIT;
        room.session_duration = SESSION;
        room.session_renewal = false;
        room.abandon_after = Duration::from_secs(600);
    }
}

/// The value of the region grant gauge for room "shop", once a sync set it.
fn grant_of(metrics: &str) -> Option<u64> {
    metrics
        .lines()
        .find(|l| l.starts_with("waitroom_region_grant{") && l.contains("room=\"shop\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Waits until every daemon's region finished a sync round at `at` (or
/// later) on the tests' clock, with a deadline.
async fn synced(daemons: &[&Harness], at: u64) {
    for h in daemons {
        let mut rounds = h.daemon.region().expect("region mode").rounds();
        tokio::time::timeout(DEADLINE, rounds.wait_for(|t| *t >= at))
            .await
            .expect("a sync round in time")
            .expect("the sync task runs");
    }
}

/// Until `check` holds: between tries the clock moves one sync interval and
/// every daemon finishes the sync round that brings (at most 40 rounds).
async fn until<F, Fut>(what: &str, clock: &ManualClock, daemons: &[&Harness], mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..40 {
        if check().await {
            return;
        }
        clock.advance(SYNC);
        synced(daemons, clock.now_ms()).await;
    }
    panic!("{what}: not after 40 sync rounds");
}

/// Active sessions across both regional stores (each daemon's own view).
async fn active(daemons: &[&Harness]) -> u64 {
    let mut n = 0;
    for h in daemons {
        n += h
            .store()
            .stats(&h.policy(), h.clock_now())
            .await
            .unwrap()
            .active;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_regions_share_the_capacity_and_admit_the_queue_as_sessions_end() {
    let global = redis().await;
    let (eu, us) = (redis().await, redis().await);
    let a = Harness::start(in_region("eu", &eu, &global)).await;
    // The second daemon on the same clock (one "now" for both regions).
    let b = Harness::start_on(
        in_region("us", &us, &global),
        Origin::start().await,
        a.clock.clone(),
    )
    .await;
    let both = [&a, &b];

    // The sync task runs in each daemon: its grant is on /metrics.
    // Each daemon's first round runs at start-up, on the clock as it stands.
    synced(&both, a.clock_now()).await;
    for h in both {
        assert!(grant_of(&h.metrics().await).is_some());
    }

    // Six visitors, alternating between the regions, against a limit of 4.
    let mut admitted = Vec::new();
    let mut queued = Vec::new();
    for i in 0..6 {
        let h = both[i % 2];
        let v = h.visitor();
        let resp = v.get(h.url("/")).send().await.unwrap();
        if from_origin(&resp) {
            admitted.push((i % 2, v));
        } else {
            assert_eq!(h.status(&v).await["state"], "queued", "visitor {i}");
            queued.push((i % 2, v));
        }
        let n = active(&both).await;
        assert!(n <= LIMIT, "{n} sessions across regions, limit {LIMIT}");
    }
    assert!(!queued.is_empty());
    assert!(
        admitted.len() as u64 <= LIMIT,
        "{} admitted",
        admitted.len()
    );
    // The room fills across both regions: a visitor queued while the other
    // region had room goes in once the syncs move the slot.
    // (The waits watch the regional stores, not the visitors' polls: polls
    // are limited per visitor on the tests' clock, which stands still.)
    until("the room to fill", &a.clock, &both, || async {
        active(&both).await == LIMIT
    })
    .await;
    let mut still = Vec::new();
    for (r, v) in queued {
        if both[r].status(&v).await["state"] == "admitted" {
            admitted.push((r, v));
        } else {
            still.push((r, v));
        }
    }
    assert_eq!(admitted.len() as u64, LIMIT);
    assert_eq!(still.len(), 2, "two visitors wait beyond the limit");
    for (r, v) in &admitted {
        let resp = v.get(both[*r].url("/")).send().await.unwrap();
        assert!(from_origin(&resp), "an admitted visitor is forwarded");
    }

    // Halfway through the sessions nobody else goes in.
    a.clock.advance(SESSION / 2);
    for (r, v) in &still {
        assert_eq!(both[*r].status(v).await["state"], "queued");
    }
    assert_eq!(active(&both).await, LIMIT);

    // The sessions end: the two waiting visitors go in, in whichever region.
    a.clock.advance(SESSION);
    until(
        "the waiting visitors' admission",
        &a.clock,
        &both,
        || async {
            let n = active(&both).await;
            assert!(n <= LIMIT, "{n} sessions across regions, limit {LIMIT}");
            n == 2
        },
    )
    .await;
    for (r, v) in &still {
        assert_eq!(both[*r].status(v).await["state"], "admitted");
        let resp = v.get(both[*r].url("/")).send().await.unwrap();
        assert!(from_origin(&resp), "admitted visitor forwarded");
    }
    assert!(active(&both).await <= LIMIT);
    for h in both {
        let m = h.metrics().await;
        assert!(grant_of(&m).is_some(), "{m}");
        assert!(m.contains("waitroom_region_degraded 0"), "{m}");
    }
}

// ---------------------------------------------------------------------------
// The operator's drill of issue 39, on real time: two daemons, one per
// region, each on its own Redis, both on one global Redis 40 ms away each
// way (`support/latency_proxy.rs`, on a runtime of its own); 400 newcomers
// over 8 s, 90 % in region a, each one request on a new connection (from a
// runtime of their own, so neither they nor the daemons slow the link).

#[path = "support/latency_proxy.rs"]
mod latency_proxy;

mod drill {
    use std::time::{Duration, Instant};

    use super::latency_proxy::LatencyProxy;
    use super::redis_server::RedisServer;
    use super::support::{config, origin::Origin};
    use waitroom::config::{Backend, FailMode, RegionConfig};
    use waitroom::{Daemon, Deps};

    pub const LIMIT: u64 = 100;
    const LINK: Duration = Duration::from_millis(40);
    const NEWCOMERS: usize = 400;
    const OVER: Duration = Duration::from_secs(8);

    /// A latency proxy on a thread and runtime of its own; stops on drop.
    pub struct Link {
        pub url: String,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        thread: Option<std::thread::JoinHandle<()>>,
    }

    impl Link {
        pub fn start(target: std::net::SocketAddr) -> Self {
            let (url_tx, url_rx) = std::sync::mpsc::channel();
            let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let thread = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let proxy = LatencyProxy::start(target, LINK).await;
                    url_tx.send(proxy.url()).unwrap();
                    let _ = stop_rx.await;
                    drop(proxy);
                });
            });
            Self {
                url: url_rx.recv().unwrap(),
                stop: Some(stop),
                thread: Some(thread),
            }
        }
    }

    impl Drop for Link {
        fn drop(&mut self) {
            if let Some(s) = self.stop.take() {
                let _ = s.send(());
            }
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    pub async fn daemon(name: &str, regional: &RedisServer, global_url: &str) -> (Daemon, Origin) {
        let origin = Origin::start().await;
        let mut c = config(origin.addr);
        c.store.backend = Backend::Redis {
            urls: vec![regional.url()],
        };
        c.store.timeout = Duration::from_millis(500);
        c.store.fail_mode = FailMode::Open;
        c.region = Some(RegionConfig {
            name: name.into(),
            global_url: global_url.into(),
            sync_interval: Duration::from_secs(1),
        });
        let room = &mut c.rooms[0];
        room.total_active_users = LIMIT;
        // A rate that does not bind (400 newcomers in all).
        room.new_users_per_minute = 60_000;
        room.session_duration = Duration::from_secs(600);
        room.session_renewal = true;
        room.refresh_interval = Duration::from_secs(2);
        let d = Daemon::start(
            &c,
            Deps {
                store: None,
                clock: None,
                config_path: None,
            },
        )
        .await
        .expect("daemon starts");
        (d, origin)
    }

    /// One newcomer's request and what it got.
    #[derive(Debug, Clone)]
    pub struct Answer {
        pub region: usize,
        /// When it was sent and answered, from the crowd's start.
        pub sent: Duration,
        pub took: Duration,
        /// "admitted", "queued", or the status and state otherwise.
        pub outcome: String,
    }

    /// The crowd on a thread and runtime of its own: 90 % to `urls[0]`,
    /// 10 % to `urls[1]`, evenly over `OVER`, each a new connection.
    pub fn crowd(urls: [String; 2]) -> std::thread::JoinHandle<Vec<Answer>> {
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let client = reqwest::Client::builder()
                    .redirect(reqwest::redirect::Policy::none())
                    .pool_max_idle_per_host(0)
                    .timeout(Duration::from_secs(10))
                    .build()
                    .unwrap();
                let start = Instant::now();
                let mut tasks = Vec::new();
                for i in 0..NEWCOMERS {
                    let region = usize::from(i % 10 == 9);
                    let at = OVER.mul_f64(i as f64 / NEWCOMERS as f64);
                    let url = format!("{}/", urls[region]);
                    let client = client.clone();
                    tasks.push(tokio::spawn(async move {
                        tokio::time::sleep_until((start + at).into()).await;
                        let sent = start.elapsed();
                        let t = Instant::now();
                        let outcome = match client
                            .get(&url)
                            .header("accept", "application/json")
                            .send()
                            .await
                        {
                            Ok(resp) if super::support::from_origin(&resp) => "admitted".to_owned(),
                            Ok(resp) => {
                                let status = resp.status().as_u16();
                                let body: serde_json::Value = resp.json().await.unwrap_or_default();
                                match body["state"].as_str() {
                                    Some("queued") if status == 200 => "queued".to_owned(),
                                    s => format!("{status} {s:?}"),
                                }
                            }
                            Err(e) => format!("error {e}"),
                        };
                        Answer {
                            region,
                            sent,
                            took: t.elapsed(),
                            outcome,
                        }
                    }));
                }
                let mut out = Vec::new();
                for t in tasks {
                    out.push(t.await.unwrap());
                }
                out
            })
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_fills_before_anyone_queues_when_90_percent_come_to_one_region() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    let started = std::time::Instant::now();
    let global = redis().await;
    let (ra, rb) = (redis().await, redis().await);
    let link = drill::Link::start(([127, 0, 0, 1], global.port()).into());
    let (a, _oa) = drill::daemon("a", &ra, &link.url).await;
    let (b, _ob) = drill::daemon("b", &rb, &link.url).await;
    // Both regions have synced once; the crowd comes 2.5 s after the start.
    for d in [&a, &b] {
        let mut rounds = d.region().expect("region mode").rounds();
        tokio::time::timeout(DEADLINE, rounds.wait_for(|t| *t > 0))
            .await
            .expect("a first sync in time")
            .expect("the sync task runs");
    }
    tokio::time::sleep(Duration::from_millis(2500).saturating_sub(started.elapsed())).await;

    let stop = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (a, b) = (a.gate(), b.gate());
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut max = 0;
            while stop.load(Ordering::Relaxed) == 0 {
                use waitroom::clock::Clock;
                let now = waitroom::clock::SystemClock.now_ms();
                let mut n = 0;
                for g in [&a, &b] {
                    let policy = (*g.rooms.all()[0].policy()).clone();
                    if let Ok(s) = g.store.shared().stats(&policy, now).await {
                        n += s.active;
                    }
                }
                max = max.max(n);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            max
        })
    };
    let crowd = drill::crowd([format!("http://{}", a.addr), format!("http://{}", b.addr)]);
    let answers = tokio::task::spawn_blocking(move || crowd.join().unwrap())
        .await
        .unwrap();
    stop.store(1, Ordering::Relaxed);
    let max_active = sampler.await.unwrap();

    // The first newcomer refused a place, in the order they came: how many
    // who came before it were admitted (answered later or not).
    let mut by_arrival = answers.clone();
    by_arrival.sort_by_key(|x| x.sent);
    let first_queued = by_arrival.iter().position(|x| x.outcome != "admitted");
    let admitted_before = by_arrival[..first_queued.unwrap_or(by_arrival.len())].len();
    let admitted: Vec<_> = answers.iter().filter(|x| x.outcome == "admitted").collect();
    let per_region = |r: usize, what: &str| {
        answers
            .iter()
            .filter(|x| x.region == r && x.outcome == what)
            .count()
    };
    let mut other: Vec<_> = answers
        .iter()
        .filter(|x| x.outcome != "admitted" && x.outcome != "queued")
        .map(|x| x.outcome.clone())
        .collect();
    other.dedup();
    let mut lat: Vec<_> = answers
        .iter()
        .filter(|x| x.region == 0)
        .map(|x| x.took)
        .collect();
    lat.sort();
    let first = first_queued.map(|i| &by_arrival[i]);
    eprintln!(
        "drill: first non-admitted after {admitted_before} admissions ({first:?}); admitted {} (a {}, b {}), queued a {} b {}; other {:?}; max active {max_active}; a p50 {:?} p99 {:?}",
        admitted.len(),
        per_region(0, "admitted"),
        per_region(1, "admitted"),
        per_region(0, "queued"),
        per_region(1, "queued"),
        other,
        lat[lat.len() / 2],
        lat[lat.len() * 99 / 100],
    );
    let regions: Vec<String> = global.cmd(&["HGETALL", "wrg:{shop}:regions"]);
    eprintln!("drill: global records {regions:?}");
    eprintln!("drill: whole test {:?}", started.elapsed());

    let mut total = 0;
    for d in [&a, &b] {
        let g = d.gate();
        let policy = (*g.rooms.all()[0].policy()).clone();
        total += g
            .store
            .shared()
            .stats(&policy, waitroom::clock::SystemClock.now_ms())
            .await
            .unwrap()
            .active;
    }
    assert!(max_active <= drill::LIMIT, "{max_active} sessions at once");
    assert!(total <= drill::LIMIT, "{total} sessions");
    assert!(admitted.len() as u64 <= drill::LIMIT);
    assert!(
        admitted_before >= 95,
        "the first visitor was refused a place after {admitted_before} admissions"
    );
    assert_eq!(
        admitted.len() as u64,
        drill::LIMIT,
        "every place to a newcomer at their first request"
    );
    drop(link);
}
