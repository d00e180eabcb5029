//! A queue of a million visitors in one room, polling every 20 seconds, on
//! a throwaway loopback `redis-server`, through the real Redis store (the
//! daemon's own code path below the HTTP layer).
//!
//! Reports, for the same queue and the same poll load:
//! * with the queue descriptions on (what the daemon does): polls answered
//!   per second, Redis CPU per second and per poll, scripts run per poll,
//!   and how stale the positions shown were (against the exact rank read
//!   right after, for a sample of polls);
//! * with every poll running its script (what it did before): the same
//!   figures, as the baseline;
//! * Redis memory per queued visitor.
//!
//! `cargo bench --bench million`; `WR_MILLION_N` (default 1000000) sets the
//! queue, `WR_MILLION_SECS` (default 20) each poll run, `WR_MILLION_RATE`
//! (default N / 20) the polls per second asked for. Under `cargo test` a
//! small smoke run keeps CI short.

#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_server::RedisServer;
use waitroom::clock::{Clock, SystemClock};
use waitroom::store::redis::RedisStore;
use waitroom::store::{Arrival, QueueingMethod, RoomPolicy, RoomState, Store, Verdict, VisitorId};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A sale's room: 1,000 places, 60 s sessions, 1,000 admissions a minute.
fn room() -> RoomPolicy {
    RoomPolicy {
        room: Arc::from("million"),
        total_active_users: 1_000,
        new_users_per_minute: 1_000,
        session_duration_ms: 60_000,
        session_renewal: false,
        method: QueueingMethod::Fifo,
        max_queue_length: 0,
        abandon_after_ms: 120_000,
        arrival_grace_ms: 40_000,
        state: RoomState::Open,
        revision: 0,
        lanes: Default::default(),
    }
}

fn vid(n: u64) -> VisitorId {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&n.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes());
    b[8..].copy_from_slice(&n.to_be_bytes());
    VisitorId(b)
}

/// CPU time (user + system) of process `pid`, in microseconds.
fn cpu_us(pid: u32) -> f64 {
    let tick: f64 = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) * 1e6 / tick
}

/// Room script runs so far: FCALL (the room functions), and EVALSHA (the
/// scripts before them, so an older build is measured the same way).
fn script_calls(server: &RedisServer) -> u64 {
    ["cmdstat_fcall", "cmdstat_evalsha"]
        .iter()
        .filter_map(|stat| {
            server.info_field("commandstats", stat).and_then(|v| {
                v.split(',')
                    .next()?
                    .strip_prefix("calls=")?
                    .parse::<u64>()
                    .ok()
            })
        })
        .sum()
}

fn used_memory(server: &RedisServer) -> f64 {
    server
        .info_field("memory", "used_memory")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Fills the room: `n` visitors arrive (1,000 get in, the rest queue).
async fn fill(store: &RedisStore, n: u64) -> Vec<(u64, u64)> {
    let policy = Arc::new(room());
    let mut queued = Vec::with_capacity(n as usize);
    let mut i = 0;
    while i < n {
        let end = (i + 2048).min(n);
        let now = SystemClock.now_ms();
        let verdicts = futures_util::future::join_all((i..end).map(|k| {
            let (store, policy) = (store.clone(), Arc::clone(&policy));
            async move { (k, store.arrive(&policy, vid(k), 0, Arrival::New, now).await) }
        }))
        .await;
        for (k, v) in verdicts {
            if let Ok(Verdict::Queued(place)) = v {
                queued.push((k, place.seq));
            }
        }
        i = end;
    }
    queued
}

/// Figures of one poll run.
struct PollRun {
    asked: f64,
    answered: f64,
    redis_cpu_per_s: f64,
    redis_us_per_poll: f64,
    scripts_per_poll: f64,
    /// Absolute and relative position errors of the sampled polls.
    errors: Vec<(u64, f64)>,
}

/// Polls every visitor once per `n / rate` seconds for `secs` seconds, as
/// evenly spread as the clock allows, and samples positions against the
/// exact rank.
async fn poll_run(
    server: &RedisServer,
    store: &RedisStore,
    queued: &Arc<Vec<(u64, u64)>>,
    rate: u64,
    secs: u64,
) -> PollRun {
    let policy = Arc::new(room());
    let mut check = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let answered = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicU64::new(0));
    let (cpu0, calls0) = (cpu_us(server.pid()), script_calls(server));
    let started = Instant::now();
    let tick = Duration::from_millis(10);
    let per_tick = (rate as f64 * tick.as_secs_f64()).round().max(1.0) as u64;
    let mut errors = Vec::new();
    // The checks below are scripts too: not counted as the store's.
    let mut checks = 0u64;
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut asked = 0u64;
    let mut inflight = Vec::new();
    while started.elapsed() < Duration::from_secs(secs) {
        ticker.tick().await;
        // One task per tick polls that tick's share of the visitors.
        let (store, policy, queued, answered, next) = (
            store.clone(),
            Arc::clone(&policy),
            Arc::clone(queued),
            Arc::clone(&answered),
            Arc::clone(&next),
        );
        asked += per_tick;
        inflight.push(tokio::spawn(async move {
            let now = SystemClock.now_ms();
            let first = next.fetch_add(per_tick, Ordering::Relaxed);
            let mut sample = None;
            for j in first..first + per_tick {
                let (k, seq) = queued[(j % queued.len() as u64) as usize];
                if let Ok(v) = store.poll(&policy, vid(k), 0, seq, now).await {
                    answered.fetch_add(1, Ordering::Relaxed);
                    if j % 997 == 0 {
                        if let Verdict::Queued(p) = v {
                            sample = Some((k, seq, p.position));
                        }
                    }
                }
            }
            sample
        }));
        // Compare the sampled positions with the exact rank now.
        let (done, running): (Vec<_>, Vec<_>) = std::mem::take(&mut inflight)
            .into_iter()
            .partition(|t| t.is_finished());
        inflight = running;
        for t in done {
            if let Ok(Some((k, seq, shown))) = t.await {
                checks += 1;
                let exact: Option<u64> = redis::Script::new(EXACT_POSITION)
                    .key("wr:{million}:queue")
                    .key("wr:{million}:tail")
                    .arg(vid(k).to_hex())
                    .arg(seq)
                    .invoke_async(&mut check)
                    .await
                    .unwrap_or(None);
                if let Some(exact) = exact {
                    errors.push((
                        shown.abs_diff(exact),
                        shown.abs_diff(exact) as f64 / exact as f64,
                    ));
                }
            }
        }
    }
    for t in inflight {
        let _ = t.await;
    }
    let took = started.elapsed().as_secs_f64();
    let answered = answered.load(Ordering::Relaxed) as f64;
    let cpu = cpu_us(server.pid()) - cpu0;
    PollRun {
        asked: asked as f64 / took,
        answered: answered / took,
        redis_cpu_per_s: cpu / took / 1e6,
        redis_us_per_poll: cpu / answered.max(1.0),
        scripts_per_poll: (script_calls(server) - calls0).saturating_sub(checks) as f64
            / answered.max(1.0),
        errors,
    }
}

/// A queued visitor's place counted in the store's keys: its rank in the
/// sorted set of the queue's head or, in the tail (one member per batch, see
/// lua/lib/tail.lua), the head's length plus the places ahead of its member
/// and its offset there. Nobody leaves the queue in this benchmark, so the
/// tail's count is exact.
const EXACT_POSITION: &str = r"
local rank = redis.call('ZRANK', KEYS[1], ARGV[1])
if rank then
    return rank + 1
end
local function header(m)
    return struct.unpack('>ddd', m)
end
local found = redis.call('ZRANGE', KEYS[2], ARGV[2], '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1)
local front = redis.call('ZRANGE', KEYS[2], 0, 0)
if #found == 0 or #front == 0 then
    return false
end
local first, k, cum = header(found[1])
local _, _, first_cum = header(front[1])
local offset = tonumber(ARGV[2]) - first
if offset >= k then
    return false
end
return redis.call('ZCARD', KEYS[1]) + cum - first_cum + offset + 1
";

fn report(what: &str, r: &PollRun) {
    let mut abs: Vec<u64> = r.errors.iter().map(|e| e.0).collect();
    let mut rel: Vec<f64> = r.errors.iter().map(|e| e.1).collect();
    abs.sort_unstable();
    rel.sort_by(f64::total_cmp);
    let pct = |v: &[f64], p: f64| {
        v.get(((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    };
    let pcu = |v: &[u64], p: f64| {
        v.get(((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "{what}: asked {:.0} polls/s, answered {:.0}/s; Redis CPU {:.3} s/s ({:.2} µs per poll); {:.4} scripts per poll",
        r.asked, r.answered, r.redis_cpu_per_s, r.redis_us_per_poll, r.scripts_per_poll
    );
    println!(
        "  positions shown vs exact rank ({} samples): off by median {} (p99 {}, max {}), relative median {:.3}% (p99 {:.3}%)",
        r.errors.len(),
        pcu(&abs, 0.5),
        pcu(&abs, 0.99),
        abs.last().copied().unwrap_or(0),
        pct(&rel, 0.5) * 100.0,
        pct(&rel, 0.99) * 100.0,
    );
}

fn main() {
    let measuring = std::env::args().any(|a| a == "--bench");
    let n = env_or("WR_MILLION_N", if measuring { 1_000_000 } else { 5_000 });
    let secs = env_or("WR_MILLION_SECS", if measuring { 20 } else { 2 });
    let rate = env_or("WR_MILLION_RATE", n / 20);
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let store = RedisStore::connect(&[server.url()], Duration::from_secs(5))
            .await
            .expect("connect");
        if !measuring {
            store.set_frontier_min_queue(1_000);
        }
        let before = used_memory(&server);
        let started = Instant::now();
        let queued = Arc::new(fill(&store, n).await);
        println!(
            "filled: {} visitors arrived in {:.1} s ({:.0}/s), {} queued; Redis memory {:.0} B per queued visitor",
            n,
            started.elapsed().as_secs_f64(),
            n as f64 / started.elapsed().as_secs_f64(),
            queued.len(),
            (used_memory(&server) - before) / queued.len().max(1) as f64
        );
        let described = poll_run(&server, &store, &queued, rate, secs).await;
        report(
            &format!("queue of {} polling every {:.0} s, descriptions on", queued.len(), n as f64 / rate as f64),
            &described,
        );
        store.set_frontier_min_queue(u64::MAX);
        let scripted = poll_run(&server, &store, &queued, rate, secs.min(10)).await;
        report("the same, every poll a script (before)", &scripted);
        println!(
            "Redis CPU per poll: {:.2} µs with descriptions vs {:.2} µs with scripts ({:.0}x less)",
            described.redis_us_per_poll,
            scripted.redis_us_per_poll,
            scripted.redis_us_per_poll / described.redis_us_per_poll.max(0.001)
        );
    });
}
