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
// way (`support/latency_proxy.rs`, one link per region, on a runtime of its
// own); 400 newcomers over 8 s, 90 % in one region, each one request on a
// new connection (from a runtime of their own, so neither they nor the
// daemons slow the links). Variants: the split reversed, a cold start (the
// daemons start as the crowd arrives), and one region cut off from the
// global store for 5 s in the middle.

#[path = "support/latency_proxy.rs"]
mod latency_proxy;

mod drill {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::latency_proxy::LatencyProxy;
    use super::redis_server::RedisServer;
    use super::support::{config, origin::Origin};
    use waitroom::clock::{Clock, SystemClock};
    use waitroom::config::{Backend, FailMode, RegionConfig};
    use waitroom::{Daemon, Deps};

    pub const LIMIT: u64 = 100;
    const LINK: Duration = Duration::from_millis(40);
    const NEWCOMERS: usize = 400;
    const OVER: Duration = Duration::from_secs(8);
    /// A cut starts this long into the crowd and lasts `CUT_FOR`.
    const CUT_AT: Duration = Duration::from_millis(500);
    const CUT_FOR: Duration = Duration::from_secs(5);
    /// After a cut, how long the room may take to fill.
    const REFILL: Duration = Duration::from_secs(10);

    /// A latency proxy on a thread and runtime of its own; stops on drop.
    pub struct Link {
        pub url: String,
        proxy: Arc<LatencyProxy>,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        thread: Option<std::thread::JoinHandle<()>>,
    }

    impl Link {
        pub fn start(target: std::net::SocketAddr) -> Self {
            let (tx, rx) = std::sync::mpsc::channel();
            let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let thread = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let proxy = Arc::new(LatencyProxy::start(target, LINK).await);
                    tx.send(proxy.clone()).unwrap();
                    let _ = stop_rx.await;
                    drop(proxy);
                });
            });
            let proxy = rx.recv().unwrap();
            Self {
                url: proxy.url(),
                proxy,
                stop: Some(stop),
                thread: Some(thread),
            }
        }

        pub fn cut(&self) {
            self.proxy.cut();
        }

        pub fn restore(&self) {
            self.proxy.restore();
        }
    }

    impl Drop for Link {
        fn drop(&mut self) {
            self.proxy.cut();
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
        // Queued visitors poll from the test's one address.
        c.server.ip_polls_per_second = 100_000;
        c.server.ip_poll_burst = 100_000;
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
        /// Queued at first, it polled until this long into the crowd, when
        /// it was let in (`polls` only).
        pub in_at: Option<Duration>,
    }

    /// What a visitor's request got.
    async fn outcome(client: &reqwest::Client, url: &str) -> String {
        match client
            .get(url)
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
        }
    }

    /// The crowd on a thread and runtime of its own: 90 % to
    /// `urls[heavy]`, 10 % to the other, evenly over `OVER`, each a new
    /// connection. With `polls`, a queued visitor polls every second (its
    /// cookie kept) until it is let in or `until` has passed.
    pub fn crowd(
        urls: [String; 2],
        heavy: usize,
        polls: Option<Duration>,
    ) -> std::thread::JoinHandle<Vec<Answer>> {
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let start = Instant::now();
                let mut tasks = Vec::new();
                for i in 0..NEWCOMERS {
                    let region = if i % 10 == 9 { 1 - heavy } else { heavy };
                    let at = OVER.mul_f64(i as f64 / NEWCOMERS as f64);
                    let url = format!("{}/", urls[region]);
                    tasks.push(tokio::spawn(async move {
                        let client = reqwest::Client::builder()
                            .redirect(reqwest::redirect::Policy::none())
                            .pool_max_idle_per_host(0)
                            .cookie_store(true)
                            .timeout(Duration::from_secs(10))
                            .build()
                            .unwrap();
                        tokio::time::sleep_until((start + at).into()).await;
                        let sent = start.elapsed();
                        let t = Instant::now();
                        let first = outcome(&client, &url).await;
                        let took = t.elapsed();
                        let mut in_at = None;
                        if let (Some(until), "queued") = (polls, first.as_str()) {
                            while start.elapsed() < until {
                                tokio::time::sleep(Duration::from_secs(1)).await;
                                if outcome(&client, &url).await == "admitted" {
                                    in_at = Some(start.elapsed());
                                    break;
                                }
                            }
                        }
                        Answer {
                            region,
                            sent,
                            took,
                            outcome: first,
                            in_at,
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

    /// One run of the drill.
    pub struct Drill {
        /// The region 90 % of the newcomers come to.
        pub heavy: usize,
        /// The daemons start as the crowd arrives (else after both synced
        /// once, 2.5 s before it).
        pub cold: bool,
        /// This region loses the global store from `CUT_AT` for `CUT_FOR`;
        /// queued visitors poll until the room fills again.
        pub cut: Option<usize>,
    }

    /// What a run measured.
    pub struct Figures {
        /// Admitted before the first newcomer who was not, in arrival order.
        pub admitted_before: usize,
        /// Admitted at their first request.
        pub admitted: u64,
        /// The most sessions both regions held at once (sampled every 50 ms).
        pub max_active: u64,
        /// Sessions at the end.
        pub active_at_end: u64,
        /// With a cut: how long after the link came back the room was full
        /// (None: not within `REFILL`).
        pub full_after_restore: Option<Duration>,
    }

    /// Sessions across both regional stores.
    async fn active<G: std::ops::Deref<Target = waitroom::gate::Gate>>(gates: &[&G]) -> u64 {
        let mut n = 0;
        for g in gates {
            let policy = (*g.rooms.all()[0].policy()).clone();
            if let Ok(s) = g.store.shared().stats(&policy, SystemClock.now_ms()).await {
                n += s.active;
            }
        }
        n
    }

    pub async fn run(drill: Drill) -> Figures {
        let started = Instant::now();
        let global = super::redis().await;
        let (ra, rb) = (super::redis().await, super::redis().await);
        let target = ([127, 0, 0, 1], global.port()).into();
        let links = [Link::start(target), Link::start(target)];
        // Cold, the crowd comes as soon as the daemons listen (before any
        // sync); else after both synced once, 2.5 s after the start.
        let (a, _oa) = daemon("a", &ra, &links[0].url).await;
        let (b, _ob) = daemon("b", &rb, &links[1].url).await;
        if !drill.cold {
            for d in [&a, &b] {
                let mut rounds = d.region().expect("region mode").rounds();
                tokio::time::timeout(super::DEADLINE, rounds.wait_for(|t| *t > 0))
                    .await
                    .expect("a first sync in time")
                    .expect("the sync task runs");
            }
            tokio::time::sleep(Duration::from_millis(2500).saturating_sub(started.elapsed())).await;
        }
        let crowd_urls = [format!("http://{}", a.addr), format!("http://{}", b.addr)];
        let (ga, gb) = (a.gate(), b.gate());

        let done = Arc::new(AtomicBool::new(false));
        let max = Arc::new(AtomicU64::new(0));
        let sampler = {
            let (a, b) = (ga.clone(), gb.clone());
            let (done, max) = (done.clone(), max.clone());
            tokio::spawn(async move {
                while !done.load(Ordering::Relaxed) {
                    max.fetch_max(active(&[&a, &b]).await, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        };
        let polls = drill.cut.map(|_| CUT_AT + CUT_FOR + REFILL);
        let crowd = crowd(crowd_urls, drill.heavy, polls);
        let mut full_after_restore = None;
        if let Some(r) = drill.cut {
            tokio::time::sleep(CUT_AT).await;
            links[r].cut();
            tokio::time::sleep(CUT_FOR).await;
            links[r].restore();
            let back = Instant::now();
            while back.elapsed() < REFILL {
                if active(&[&ga, &gb]).await >= LIMIT {
                    full_after_restore = Some(back.elapsed());
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let answers = tokio::task::spawn_blocking(move || crowd.join().unwrap())
            .await
            .unwrap();
        done.store(true, Ordering::Relaxed);
        sampler.await.unwrap();
        let active_at_end = active(&[&ga, &gb]).await;
        let max_active = max.load(Ordering::Relaxed).max(active_at_end);

        let mut by_arrival = answers.clone();
        by_arrival.sort_by_key(|x| x.sent);
        let first_queued = by_arrival.iter().position(|x| x.outcome != "admitted");
        let admitted_before = first_queued.unwrap_or(by_arrival.len());
        let admitted = answers.iter().filter(|x| x.outcome == "admitted").count() as u64;
        let count = |r: usize, what: &str| {
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
            .filter(|x| x.region == drill.heavy)
            .map(|x| x.took)
            .collect();
        lat.sort();
        let polled_in = answers.iter().filter(|x| x.in_at.is_some()).count();
        eprintln!(
            "drill (heavy {}, cold {}, cut {:?}): first not admitted after {admitted_before} admissions ({:?}); admitted {admitted} (a {}, b {}), queued a {} b {}, polled in {polled_in}; other {other:?}; max active {max_active}, at end {active_at_end}, full {full_after_restore:?} after the restore; heavy p50 {:?} p99 {:?}; whole run {:?}",
            drill.heavy,
            drill.cold,
            drill.cut,
            first_queued.map(|i| &by_arrival[i]),
            count(0, "admitted"),
            count(1, "admitted"),
            count(0, "queued"),
            count(1, "queued"),
            lat[lat.len() / 2],
            lat[lat.len() * 99 / 100],
            started.elapsed(),
        );
        let regions: Vec<String> = global.cmd(&["HGETALL", "wrg:{shop}:regions"]);
        eprintln!("drill: global records {regions:?}");
        Figures {
            admitted_before,
            admitted,
            max_active,
            active_at_end,
            full_after_restore,
        }
    }
}

/// No oversell at any time, and the room filled before anyone queued: every
/// place went to a newcomer at their first request.
fn fills_first(f: &drill::Figures) {
    assert!(
        f.max_active <= drill::LIMIT,
        "{} sessions at once",
        f.max_active
    );
    assert!(f.active_at_end <= drill::LIMIT);
    assert!(
        f.admitted_before >= 95,
        "the first visitor was refused a place after {} admissions",
        f.admitted_before
    );
    assert_eq!(
        f.admitted,
        drill::LIMIT,
        "every place to a newcomer at their first request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_fills_before_anyone_queues_when_90_percent_come_to_one_region() {
    fills_first(
        &drill::run(drill::Drill {
            heavy: 0,
            cold: false,
            cut: None,
        })
        .await,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_fills_before_anyone_queues_when_90_percent_come_to_the_other_region() {
    fills_first(
        &drill::run(drill::Drill {
            heavy: 1,
            cold: false,
            cut: None,
        })
        .await,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_fills_before_anyone_queues_when_the_daemons_start_with_the_crowd() {
    fills_first(
        &drill::run(drill::Drill {
            heavy: 0,
            cold: true,
            cut: None,
        })
        .await,
    );
}

/// One region (the quiet one, then the busy one) loses the global store
/// for 5 s, 0.5 s into the crowd, well before the room is full: no
/// oversell while it decides alone (its grant counts as fully used by the
/// other), and once it is back the room fills (queued visitors polling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_cut_off_for_5_s_oversells_nothing_and_the_room_fills_once_it_is_back() {
    for cut in [1, 0] {
        let f = drill::run(drill::Drill {
            heavy: 0,
            cold: false,
            cut: Some(cut),
        })
        .await;
        assert!(
            f.max_active <= drill::LIMIT,
            "{} sessions at once",
            f.max_active
        );
        assert!(f.active_at_end <= drill::LIMIT);
        assert!(
            f.full_after_restore.is_some(),
            "region {cut} cut: the room did not fill after the link came back"
        );
    }
}
