//! What drop-day fairness costs the store per arrival, on a throwaway
//! loopback `redis-server`: the store calls the gate makes for one
//! newcomer to a full room, with and without enqueue tokens and priority
//! lanes, each measured as Redis server time (`INFO commandstats`) and
//! Redis CPU time (user + system of the redis-server process, from /proc)
//! per arrival, and as the ratio to a plain arrival measured in the same
//! run. Variants, as `gate::new_visitor` calls the store:
//!
//! * `plain`: `Arrival::New` (a fresh id), a room without lanes;
//! * `plain, room with lanes`: the same in a room with two lanes (its
//!   promotion takes turns);
//! * `lane code`: a single-use code noted once, then `Arrival::Known` in its lane;
//! * `token`: the token's `jti`, its networks and its `sub` noted, then
//!   `arrive` under the member's id;
//! * `token + lane claim`: the same, into the claimed lane;
//! * `token, sub seen before`: a member the room saw within a day comes
//!   again: looked for everywhere, the back of the queue included (its
//!   cost grows with the queue; here it finds nothing).
//!
//! Each run fills the room's queue by its own arrivals (`WR_BENCH_N`).
//!
//! `cargo bench --bench fairness`; `WR_BENCH_N` (default 20000) arrivals
//! per variant and round, `WR_BENCH_ROUNDS` (default 2) rounds, the
//! variants alternating within each.

#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_server::RedisServer;
use waitroom::clock::{Clock, SystemClock};
use waitroom::domain::digest64;
use waitroom::store::redis::RedisStore;
use waitroom::store::{
    Arrival, Lanes, QueueingMethod, RoomPolicy, RoomState, Store, Verdict, VisitorId,
};

/// Arrivals in flight at once (the daemon gathers concurrent ones).
const CONCURRENCY: usize = 64;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn room(name: &str, lanes: Lanes) -> RoomPolicy {
    RoomPolicy {
        room: Arc::from(name),
        total_active_users: 1,
        new_users_per_minute: 0,
        session_duration_ms: 600_000,
        session_renewal: true,
        method: QueueingMethod::Fifo,
        max_queue_length: 0,
        abandon_after_ms: 600_000,
        arrival_grace_ms: 30_000,
        state: RoomState::Open,
        revision: 0,
        lanes,
    }
}

/// Redis server time (µs) of every command since the last reset.
fn server_usec(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    info.lines()
        .filter(|l| !l.starts_with("cmdstat_info") && !l.starts_with("cmdstat_config"))
        .filter_map(|l| l.split_once(':'))
        .filter_map(|(_, rest)| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix("usec=")?.parse::<u64>().ok())
        })
        .sum()
}

/// CPU time (µs) the process `pid` has used, user + system.
fn cpu_us(pid: u32) -> f64 {
    let tick = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
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

#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    Plain,
    PlainWithLanes,
    LaneCode,
    Token,
    TokenLane,
    TokenAgain,
}

impl Variant {
    const ALL: [Variant; 6] = [
        Variant::Plain,
        Variant::PlainWithLanes,
        Variant::LaneCode,
        Variant::Token,
        Variant::TokenLane,
        Variant::TokenAgain,
    ];

    fn name(self) -> &'static str {
        match self {
            Variant::Plain => "plain",
            Variant::PlainWithLanes => "plain, room with lanes",
            Variant::LaneCode => "lane code",
            Variant::Token => "token",
            Variant::TokenLane => "token + lane claim",
            Variant::TokenAgain => "token, sub seen before",
        }
    }
}

/// One arrival as the gate makes it: the notes, then the decision.
async fn arrive(store: &RedisStore, p: &RoomPolicy, v: Variant, i: u64, now: u64) {
    let until = now + 600_000;
    let member = |i: u64| {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&digest64(&format!("member-{i}")).to_be_bytes());
        b[8..].copy_from_slice(&i.to_be_bytes());
        VisitorId(b)
    };
    let verdict = match v {
        Variant::Plain | Variant::PlainWithLanes => {
            store
                .arrive(p, VisitorId::random(), 0, Arrival::New, now)
                .await
        }
        Variant::LaneCode => {
            let code = digest64(&format!("code-{i}"));
            let noted = store
                .note(&p.room, "codes", &[code], until, now)
                .await
                .unwrap();
            assert_eq!(noted.added, 1);
            store
                .arrive(p, VisitorId::random(), 1, Arrival::New, now)
                .await
        }
        Variant::Token | Variant::TokenLane | Variant::TokenAgain => {
            let id = member(i);
            let jti = digest64(&format!("jti-{i}"));
            store
                .note(&p.room, "jti", &[jti], until, now)
                .await
                .unwrap();
            let nets = format!("nets:{}", id.to_hex());
            store
                .note(&p.room, &nets, &[i % 997], until, now)
                .await
                .unwrap();
            let sub = digest64(&format!("sub-{i}"));
            store
                .note(&p.room, "subs", &[sub], until, now)
                .await
                .unwrap();
            // A sub new to the room: the tail is not read for it; one
            // seen before is looked for everywhere (here it holds nothing).
            match v {
                Variant::TokenLane => store.arrive(p, id, 1, Arrival::Unseen, now).await,
                Variant::TokenAgain => store.arrive(p, id, 0, Arrival::Known, now).await,
                _ => store.arrive(p, id, 0, Arrival::Unseen, now).await,
            }
        }
    };
    assert!(matches!(
        verdict,
        Ok(Verdict::Queued(_) | Verdict::Admitted { .. })
    ));
}

struct Figures {
    server_us: f64,
    cpu_us: f64,
    wall: Duration,
}

async fn run(server: &RedisServer, store: &RedisStore, v: Variant, n: u64, round: u64) -> Figures {
    let lanes = match v {
        Variant::Plain | Variant::Token | Variant::TokenAgain => Lanes::NONE,
        _ => Lanes::with_shares(&[300, 200]),
    };
    let p = room(&format!("fair-{round}-{v:?}"), lanes);
    let now = SystemClock.now_ms();
    // The room is full: every arrival in the run queues.
    store
        .arrive(&p, VisitorId::random(), 0, Arrival::New, now)
        .await
        .unwrap();
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    let cpu0 = cpu_us(server.pid());
    let started = Instant::now();
    let mut i = 0;
    while i < n {
        let end = (i + CONCURRENCY as u64).min(n);
        futures_util::future::join_all((i..end).map(|k| arrive(store, &p, v, round * n + k, now)))
            .await;
        i = end;
    }
    let wall = started.elapsed();
    let cpu = cpu_us(server.pid()) - cpu0;
    Figures {
        server_us: server_usec(server) as f64 / n as f64,
        cpu_us: cpu / n as f64,
        wall,
    }
}

/// `a / b` as "1.23x", or "-" where `b` is too small to divide by (a
/// short run measures no CPU tick).
fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}x", a / b)
    } else {
        "-".into()
    }
}

fn main() {
    // Under `cargo test` (no `--bench`) a quick smoke run keeps CI short.
    let measuring = std::env::args().any(|a| a == "--bench");
    let n = env_or("WR_BENCH_N", if measuring { 20_000 } else { 200 });
    let rounds = env_or("WR_BENCH_ROUNDS", if measuring { 2 } else { 1 });
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let store = rt
        .block_on(RedisStore::connect(&[server.url()], Duration::from_secs(5)))
        .expect("connect");
    println!("fairness: store cost per arrival to a full room, {n} arrivals per variant and round, {CONCURRENCY} in flight");
    for round in 0..rounds {
        let mut base = None;
        // Alternate the order from round to round.
        let mut order = Variant::ALL.to_vec();
        if round % 2 == 1 {
            order.reverse();
            order.rotate_right(1);
        }
        let mut lines = Vec::new();
        for v in order {
            let f = rt.block_on(run(&server, &store, v, n, round));
            if v == Variant::Plain {
                base = Some((f.server_us, f.cpu_us));
            }
            lines.push((v, f));
        }
        let (bs, bc) = base.expect("plain ran");
        println!("round {}:", round + 1);
        for (v, f) in lines {
            println!(
                "  {:<24} server {:>6.1} us ({})  redis cpu {:>6.1} us ({})  {:>7.0} arrivals/s",
                v.name(),
                f.server_us,
                ratio(f.server_us, bs),
                f.cpu_us,
                ratio(f.cpu_us, bc),
                n as f64 / f.wall.as_secs_f64(),
            );
        }
    }
}
