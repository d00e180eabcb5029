//! Central mode against region mode on the same traffic (docs/regions.md,
//! "Measured"), through the real Redis path on loopback.
//!
//! Three regions. Central mode: every region's instance reaches one shared
//! Redis through a proxy adding 40 ms each way. Region mode: each region
//! has its own Redis (no added latency) and reaches the global Redis
//! through a proxy adding 40 ms each way. Visitors arrive at a rate that
//! ramps up to twice what the room turns over, hold their session until it
//! expires, and queued visitors poll until admitted.
//!
//! Time is scaled by 4 (sessions of 24 s, polls every 2 s, sync every 1 s,
//! a 30 s cut-off become 6 s, 0.5 s, 250 ms and 7.5 s); latency is not.
//! Bounded: 4 scenarios x 2 modes x `ROUNDS` rounds of `RUN` each (about
//! 2.5 minutes). Writes `docs/regions-bench.svg` and prints the table.
//!
//! `cargo bench --bench regions`. Under `cargo test` (no `--bench`) one
//! round of one scenario runs, so that CI runs the code, and nothing is
//! written.

#[path = "../tests/support/latency_proxy.rs"]
mod latency_proxy;
#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use latency_proxy::LatencyProxy;
use redis_server::RedisServer;
use waitroom::clock::{Clock, Millis, SystemClock};
use waitroom::config::RegionConfig;
use waitroom::region::Region;
use waitroom::store::redis::RedisStore;
use waitroom::store::{
    seq_arrival_ms, Arrival, QueueingMethod, RoomPolicy, RoomState, Store, Verdict, VisitorId,
};

const REGIONS: usize = 3;
const ONE_WAY: Duration = Duration::from_millis(40);
const LIMIT: u64 = 300;
const SESSION_MS: Millis = 6_000;
const GRACE_MS: Millis = 1_000;
const POLL: Duration = Duration::from_millis(500);
const SYNC: Duration = Duration::from_millis(250);
const RUN: Duration = Duration::from_secs(9);
const ROUNDS: usize = 2;
/// Peak arrivals per second (all regions): twice the turnover LIMIT / session.
const PEAK_RATE: f64 = 2.0 * LIMIT as f64 / (SESSION_MS as f64 / 1000.0);
const CUT_FROM: Duration = Duration::from_millis(1_000);
const CUT_FOR: Duration = Duration::from_millis(7_500);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Central,
    Regional,
}

#[derive(Clone, Copy, Debug)]
enum Scenario {
    /// Traffic split evenly.
    Even,
    /// 90 % of the traffic in region 0.
    Skewed,
    /// 90 % in region 0, then 90 % in region 1 from half-time.
    Moving,
    /// Even traffic; region 2 loses the shared/global store for 7.5 s.
    CutOff,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Even => "even",
            Scenario::Skewed => "90% in one region",
            Scenario::Moving => "traffic moves mid-run",
            Scenario::CutOff => "one region cut off 30 s (scaled)",
        }
    }

    fn weights(self, t: f64) -> [f64; REGIONS] {
        match self {
            Scenario::Even | Scenario::CutOff => [1.0 / 3.0; 3],
            Scenario::Skewed => [0.9, 0.05, 0.05],
            Scenario::Moving if t < 0.5 => [0.9, 0.05, 0.05],
            Scenario::Moving => [0.05, 0.9, 0.05],
        }
    }
}

/// An admitted visitor: when it arrived and when it was let in (store time).
#[derive(Clone, Copy)]
struct Admission {
    region: usize,
    arrived: Millis,
    admitted: Millis,
}

#[derive(Default)]
struct Record {
    latency_us: [Vec<u64>; REGIONS],
    admissions: Vec<Admission>,
    failed: u64,
    queued: u64,
}

#[derive(Clone, Default, Debug)]
struct Outcome {
    exceeded_samples: u64,
    max_active: u64,
    utilization_at_first_queue: Option<f64>,
    p50_ms: [f64; REGIONS],
    p99_ms: [f64; REGIONS],
    inversions: u64,
    max_inversion_ms: u64,
    admitted: u64,
    queued: u64,
    failed: u64,
    /// (seconds, active) samples for the chart.
    active: Vec<(f64, u64)>,
}

struct Setup {
    _servers: Vec<RedisServer>,
    proxies: Vec<LatencyProxy>,
    stores: Vec<RedisStore>,
    regions: Vec<Arc<Region>>,
}

async fn server() -> RedisServer {
    tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap()
}

fn addr(s: &RedisServer) -> SocketAddr {
    format!("127.0.0.1:{}", s.port()).parse().unwrap()
}

async fn setup(mode: Mode) -> Setup {
    let timeout = Duration::from_secs(1);
    let mut servers = Vec::new();
    let mut proxies = Vec::new();
    let mut stores = Vec::new();
    let mut regions = Vec::new();
    match mode {
        Mode::Central => {
            let central = server().await;
            for _ in 0..REGIONS {
                let proxy = LatencyProxy::start(addr(&central), ONE_WAY).await;
                stores.push(RedisStore::connect(&[proxy.url()], timeout).await.unwrap());
                proxies.push(proxy);
            }
            servers.push(central);
        }
        Mode::Regional => {
            let global = server().await;
            for i in 0..REGIONS {
                let regional = server().await;
                let proxy = LatencyProxy::start(addr(&global), ONE_WAY).await;
                let store = RedisStore::connect(&[regional.url()], timeout)
                    .await
                    .unwrap();
                let config = RegionConfig {
                    name: format!("r{i}"),
                    global_url: proxy.url(),
                    sync_interval: SYNC,
                };
                let region = Arc::new(Region::new(&config, timeout, None).unwrap());
                store.set_region(region.clone());
                stores.push(store);
                regions.push(region);
                proxies.push(proxy);
                servers.push(regional);
            }
            servers.push(global);
        }
    }
    Setup {
        _servers: servers,
        proxies,
        stores,
        regions,
    }
}

fn policy(room: &str) -> RoomPolicy {
    RoomPolicy {
        room: Arc::from(room),
        total_active_users: LIMIT,
        new_users_per_minute: 0,
        session_duration_ms: SESSION_MS,
        session_renewal: false,
        method: QueueingMethod::Fifo,
        max_queue_length: 0,
        abandon_after_ms: 600_000,
        arrival_grace_ms: GRACE_MS,
        state: RoomState::Open,
        revision: 0,
        lanes: Default::default(),
    }
}

async fn total_active(stores: &[RedisStore], room: &RoomPolicy, mode: Mode, now: Millis) -> u64 {
    match mode {
        Mode::Central => stores[0]
            .stats(room, now)
            .await
            .map(|s| s.active)
            .unwrap_or(0),
        Mode::Regional => {
            let mut sum = 0;
            for s in stores {
                sum += s.stats(room, now).await.map(|s| s.active).unwrap_or(0);
            }
            sum
        }
    }
}

async fn run(mode: Mode, scenario: Scenario, round: usize) -> Outcome {
    let setup = Arc::new(setup(mode).await);
    let room = policy(&format!("bench-{round}"));
    let clock = SystemClock;
    let done = Arc::new(AtomicBool::new(false));
    let record = Arc::new(Mutex::new(Record::default()));
    let first_queue = Arc::new(Mutex::new(None::<f64>));
    let queue_seen = Arc::new(AtomicBool::new(false));
    let next_id = Arc::new(AtomicU64::new(1));

    // The regions' background syncs.
    let mut background = Vec::new();
    if mode == Mode::Regional {
        for i in 0..REGIONS {
            let (setup, room, done) = (setup.clone(), room.clone(), done.clone());
            background.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(SYNC);
                while !done.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let now = SystemClock.now_ms();
                    let _ = setup.regions[i]
                        .sync_room(&setup.stores[i], &room, now, false)
                        .await;
                }
            }));
        }
    }
    // No warm-up: the crowd comes as the regions first report (a cold
    // start, which the global store's warm-up must handle).
    let start = Instant::now();
    // Capacity sampler.
    let samples = Arc::new(Mutex::new(Vec::new()));
    {
        let (setup, room, done, samples) =
            (setup.clone(), room.clone(), done.clone(), samples.clone());
        background.push(tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                let now = SystemClock.now_ms();
                let active = total_active(&setup.stores, &room, mode, now).await;
                samples
                    .lock()
                    .unwrap()
                    .push((start.elapsed().as_secs_f64(), active));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    // Arrivals.
    let mut visitors = Vec::new();
    let mut owed = [0.0f64; REGIONS];
    let mut cut = false;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    while start.elapsed() < RUN {
        tick.tick().await;
        let t = start.elapsed().as_secs_f64() / RUN.as_secs_f64();
        if let Scenario::CutOff = scenario {
            let e = start.elapsed();
            let should = e >= CUT_FROM && e < CUT_FROM + CUT_FOR;
            if should != cut {
                cut = should;
                if cut {
                    setup.proxies[2].cut();
                } else {
                    setup.proxies[2].restore();
                }
            }
        }
        // Ramp to the peak over the first 60 % of the run, then hold.
        let rate = PEAK_RATE * (t / 0.6).min(1.0);
        let w = scenario.weights(t);
        for r in 0..REGIONS {
            owed[r] += rate * w[r] * 0.01;
            while owed[r] >= 1.0 {
                owed[r] -= 1.0;
                let id = next_id.fetch_add(1, Ordering::Relaxed);
                let mut b = [0u8; 16];
                b[8..].copy_from_slice(&id.to_be_bytes());
                let visitor = VisitorId(b);
                let (setup, room, record, done) =
                    (setup.clone(), room.clone(), record.clone(), done.clone());
                let (first_queue, queue_seen) = (first_queue.clone(), queue_seen.clone());
                visitors.push(tokio::spawn(async move {
                    let store = &setup.stores[r];
                    let now = clock.now_ms();
                    let t0 = Instant::now();
                    let verdict = store.arrive(&room, visitor, 0, Arrival::Known, now).await;
                    let us = t0.elapsed().as_micros() as u64;
                    let place = match verdict {
                        Ok(Verdict::Admitted { .. }) => {
                            let mut rec = record.lock().unwrap();
                            rec.latency_us[r].push(us);
                            rec.admissions.push(Admission {
                                region: r,
                                arrived: now,
                                admitted: now,
                            });
                            return;
                        }
                        Ok(Verdict::Queued(p)) => {
                            {
                                let mut rec = record.lock().unwrap();
                                rec.latency_us[r].push(us);
                                rec.queued += 1;
                            }
                            if !queue_seen.swap(true, Ordering::SeqCst) {
                                let active = total_active(&setup.stores, &room, mode, now).await;
                                *first_queue.lock().unwrap() = Some(active as f64 / LIMIT as f64);
                            }
                            p
                        }
                        _ => {
                            record.lock().unwrap().failed += 1;
                            return;
                        }
                    };
                    while !done.load(Ordering::Relaxed) {
                        tokio::time::sleep(POLL).await;
                        let now = clock.now_ms();
                        if let Ok(Verdict::Admitted { session_expires_ms }) =
                            store.poll(&room, visitor, 0, place.seq, now).await
                        {
                            record.lock().unwrap().admissions.push(Admission {
                                region: r,
                                arrived: seq_arrival_ms(place.seq),
                                admitted: session_expires_ms - SESSION_MS - GRACE_MS,
                            });
                            return;
                        }
                    }
                }));
            }
        }
    }
    done.store(true, Ordering::Relaxed);
    setup.proxies.iter().for_each(LatencyProxy::restore);
    for v in visitors {
        let _ = v.await;
    }
    for b in background {
        let _ = b.await;
    }
    let rec = std::mem::take(&mut *record.lock().unwrap());
    let samples = std::mem::take(&mut *samples.lock().unwrap());
    let mut out = Outcome {
        exceeded_samples: samples.iter().filter(|(_, a)| *a > LIMIT).count() as u64,
        max_active: samples.iter().map(|(_, a)| *a).max().unwrap_or(0),
        utilization_at_first_queue: *first_queue.lock().unwrap(),
        admitted: rec.admissions.len() as u64,
        queued: rec.queued,
        failed: rec.failed,
        active: samples,
        ..Outcome::default()
    };
    for r in 0..REGIONS {
        let mut l = rec.latency_us[r].clone();
        l.sort_unstable();
        let q = |p: f64| {
            if l.is_empty() {
                f64::NAN
            } else {
                l[((l.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
            }
        };
        out.p50_ms[r] = q(0.5);
        out.p99_ms[r] = q(0.99);
    }
    // FIFO inversions across regions: a visitor who arrived earlier (by a
    // whole millisecond) let in later than one from another region.
    let a = &rec.admissions;
    for x in a {
        for y in a {
            if x.region != y.region && x.arrived < y.arrived && x.admitted > y.admitted {
                out.inversions += 1;
                out.max_inversion_ms = out.max_inversion_ms.max(x.admitted - y.admitted);
            }
        }
    }
    out
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3}"))
}

fn chart(results: &[(Mode, Scenario, Outcome)]) -> String {
    // One panel per scenario: active sessions over time, central vs regional.
    use std::fmt::Write;
    let (w, ph, top, left) = (900.0, 150.0, 30.0, 60.0);
    let scen = [
        Scenario::Even,
        Scenario::Skewed,
        Scenario::Moving,
        Scenario::CutOff,
    ];
    let h = top + scen.len() as f64 * (ph + 50.0);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(
        s,
        r#"<text x="{left}" y="18" font-size="14">Active sessions (all regions) against the limit of {LIMIT}: central (grey) vs regions (blue), first round</text>"#
    );
    let run_s = RUN.as_secs_f64();
    for (k, sc) in scen.iter().enumerate() {
        let y0 = top + k as f64 * (ph + 50.0) + 20.0;
        let x = |t: f64| left + (w - left - 20.0) * t / run_s;
        let y = |v: f64| y0 + ph - ph * v / (LIMIT as f64 * 1.1);
        let _ = write!(
            s,
            r##"<text x="{left}" y="{}">{}</text><rect x="{left}" y="{y0}" width="{}" height="{ph}" fill="none" stroke="#ccc"/>"##,
            y0 - 4.0,
            sc.name(),
            w - left - 20.0
        );
        let _ = write!(
            s,
            r#"<line x1="{left}" x2="{}" y1="{ly}" y2="{ly}" stroke="red" stroke-dasharray="4 3"/><text x="8" y="{ly}">{LIMIT}</text>"#,
            w - 20.0,
            ly = y(LIMIT as f64)
        );
        for t in [0.0, 3.0, 6.0, 9.0] {
            let _ = write!(
                s,
                r#"<text x="{}" y="{}">{t:.0}s</text>"#,
                x(t) - 6.0,
                y0 + ph + 14.0
            );
        }
        for (mode, color) in [(Mode::Central, "#888"), (Mode::Regional, "#1f6fd1")] {
            if let Some((_, _, o)) = results.iter().find(|(m, c, _)| {
                *m == mode && std::mem::discriminant(c) == std::mem::discriminant(sc)
            }) {
                let pts: Vec<String> = o
                    .active
                    .iter()
                    .map(|(t, a)| format!("{:.1},{:.1}", x(*t), y(*a as f64)))
                    .collect();
                let _ = write!(
                    s,
                    r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
                    pts.join(" ")
                );
            }
        }
    }
    s.push_str("</svg>\n");
    s
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // `REGIONS_ONLY=moving` (a word of a scenario's name) runs only that
    // scenario, and leaves the chart alone.
    let measuring = std::env::args().any(|a| a == "--bench");
    let only = std::env::var("REGIONS_ONLY")
        .ok()
        .or_else(|| (!measuring).then(|| "cut".to_owned()));
    let scenarios: Vec<Scenario> = [
        Scenario::Even,
        Scenario::Skewed,
        Scenario::Moving,
        Scenario::CutOff,
    ]
    .into_iter()
    .filter(|s| only.as_ref().is_none_or(|w| s.name().contains(w.as_str())))
    .collect();
    let mut results: Vec<(Mode, Scenario, Outcome)> = Vec::new();
    let mut round_no = 0;
    for round in 0..if measuring { ROUNDS } else { 1 } {
        for &sc in &scenarios {
            // Alternate which mode goes first, so drift favours neither.
            let modes = if round % 2 == 0 {
                [Mode::Central, Mode::Regional]
            } else {
                [Mode::Regional, Mode::Central]
            };
            for mode in modes {
                round_no += 1;
                let o = rt.block_on(run(mode, sc, round_no));
                println!(
                    "round {round} {:>8?} {:<34} exceeded {} max {} util@queue {} p50 {:.1}/{:.1}/{:.1} ms p99 {:.1}/{:.1}/{:.1} ms inversions {} (max {} ms) admitted {} queued {} failed {}",
                    mode,
                    sc.name(),
                    o.exceeded_samples,
                    o.max_active,
                    fmt_opt(o.utilization_at_first_queue),
                    o.p50_ms[0], o.p50_ms[1], o.p50_ms[2],
                    o.p99_ms[0], o.p99_ms[1], o.p99_ms[2],
                    o.inversions,
                    o.max_inversion_ms,
                    o.admitted,
                    o.queued,
                    o.failed,
                );
                results.push((mode, sc, o));
            }
        }
    }
    if only.is_some() {
        return;
    }
    let first: Vec<(Mode, Scenario, Outcome)> =
        results.iter().take(scenarios.len() * 2).cloned().collect();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/regions-bench.svg");
    if let Err(e) = std::fs::write(&path, chart(&first)) {
        eprintln!("cannot write {}: {e}", path.display());
    }
}
