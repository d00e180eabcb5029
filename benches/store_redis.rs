//! Figures for the Redis store on a throwaway loopback `redis-server`:
//! memory per queued visitor and per active session, Redis commands and
//! server time per operation, and decisions per second with N concurrent
//! callers with the Redis CPU time each costs (user + system time of the
//! redis-server process, from /proc, divided by the operations), next to
//! two baselines measured in the same run: PING, and an OpenResty-style
//! atomic check-and-admit (one small EVALSHA doing GET / INCR / SADD per
//! visitor, the recipe of docs/benchmarks.md, "Targets").
//!
//! `cargo bench --bench store_redis`; `WR_BENCH_N` (default 100000) sets the
//! number of visitors, `WR_BENCH_SECS` (default 5) each timed run,
//! `WR_BENCH_CALLERS` (default 64) the concurrent callers.
//! `WR_BENCH_FLOORS=1` adds the floors (see `FLOORS`): what a visitor costs
//! Redis when a call only writes it into one structure.
//!
//! Last, `replica_acks`: the same decisions and polls on a primary with one
//! replica, with `store.replica_acks` 0 and 1 in alternating rounds (what
//! waiting for the replica costs a decision).

#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_server::RedisServer;
use waitroom::clock::{Clock, SystemClock};
use waitroom::store::redis::{Options, RedisStore, Target};
use waitroom::store::{
    Arrival, End, QueueingMethod, RoomPolicy, RoomState, Store, Verdict, VisitorId,
};

const BATCH: usize = 1000;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn room(name: &str, cap: u64) -> RoomPolicy {
    RoomPolicy {
        room: Arc::from(name),
        total_active_users: cap,
        new_users_per_minute: 0,
        session_duration_ms: 600_000,
        session_renewal: true,
        method: QueueingMethod::Fifo,
        max_queue_length: 0,
        abandon_after_ms: 600_000,
        arrival_grace_ms: 30_000,
        state: RoomState::Open,
        revision: 0,
        lanes: Default::default(),
    }
}

fn used_memory(server: &RedisServer) -> i64 {
    server
        .info_field("memory", "used_memory")
        .and_then(|v| v.parse().ok())
        .expect("used_memory")
}

fn key_bytes(server: &RedisServer, key: &str) -> i64 {
    server
        .cmd::<Option<i64>>(&["MEMORY", "USAGE", key, "SAMPLES", "0"])
        .unwrap_or(0)
}

/// `(calls, usec)` summed over every command but the script calls (FCALL,
/// EVALSHA), and theirs.
fn commandstats(server: &RedisServer) -> ((u64, u64), (u64, u64)) {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    let mut inner = (0, 0);
    let mut script = (0, 0);
    for line in info.lines() {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        let field = |f: &str| -> u64 {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(f)?.parse().ok())
                .unwrap_or(0)
        };
        let (calls, usec) = (field("calls="), field("usec="));
        match name {
            // The room functions, and the recipe's script.
            "cmdstat_fcall" | "cmdstat_evalsha" => {
                script.0 += calls;
                script.1 += usec;
            }
            "cmdstat_config|resetstat" | "cmdstat_info" => {}
            _ => {
                inner.0 += calls;
                inner.1 += usec;
            }
        }
    }
    (inner, script)
}

/// Runs `n` operations, `BATCH` at a time concurrently.
async fn fill<F, Fut>(n: u64, op: F)
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut i = 0;
    while i < n {
        let end = (i + BATCH as u64).min(n);
        futures_util::future::join_all((i..end).map(&op)).await;
        i = end;
    }
}

/// Concurrent callers in the timed runs (`WR_BENCH_CALLERS`, default 64).
fn callers() -> usize {
    env_or("WR_BENCH_CALLERS", 64) as usize
}

fn vid(n: u64) -> VisitorId {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&n.to_be_bytes());
    b[8..].copy_from_slice(&(n.wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_be_bytes());
    VisitorId(b)
}

async fn memory(server: &RedisServer, store: &RedisStore, n: u64) {
    let now = SystemClock.now_ms();
    let _: () = server.cmd(&["FLUSHALL"]);
    let before = used_memory(server);
    let mut queued = room("mem-queue", 1);
    queued.state = RoomState::Paused;
    let seqs = tokio::sync::Mutex::new(Vec::with_capacity(n as usize));
    fill(n, |i| {
        let (p, seqs) = (&queued, &seqs);
        async move {
            match store
                .arrive(p, vid(i), 0, Arrival::Known, now)
                .await
                .expect("arrive")
            {
                Verdict::Queued(q) => seqs.lock().await.push((i, q.seq)),
                v => panic!("not queued: {v:?}"),
            }
        }
    })
    .await;
    let after = used_memory(server);
    let q = key_bytes(server, "wr:{mem-queue}:queue");
    let tail = key_bytes(server, "wr:{mem-queue}:tail");
    // The tail's ids, in chunks of 65,536 (lua/lib/tail.lua).
    let ids: i64 = (0..=n / 65_536)
        .map(|c| key_bytes(server, &format!("wr:{{mem-queue}}:tail_ids:{c}")))
        .sum();
    println!(
        "queued visitors: {n}: used_memory +{} B = {:.1} B/visitor (queue ZSET {:.1}, tail {:.1}, its ids {:.1}; a place has no poll record until its first poll)",
        after - before,
        (after - before) as f64 / n as f64,
        q as f64 / n as f64,
        tail as f64 / n as f64,
        ids as f64 / n as f64,
    );
    let seqs = seqs.into_inner();
    fill(n, |i| {
        let (p, (v, seq)) = (&queued, seqs[i as usize]);
        async move {
            let verdict = store.poll(p, vid(v), 0, seq, now).await.expect("poll");
            assert!(matches!(verdict, Verdict::Queued(_)));
        }
    })
    .await;
    let polled = used_memory(server);
    let polls = key_bytes(server, "wr:{mem-queue}:polls");
    println!(
        "  once each has polled: used_memory +{} B = {:.1} B/visitor (last-poll HASH {:.1})",
        polled - before,
        (polled - before) as f64 / n as f64,
        polls as f64 / n as f64
    );

    // Sessions made one at a time (`arrive`: promotion, renewal and
    // visitors who may have been seen before take this path) and those of
    // newcomers admitted together (`Arrival::New`, the daemon's path: one
    // `batches` entry per call).
    for (what, fresh) in [("one at a time", false), ("admitted together", true)] {
        let _: () = server.cmd(&["FLUSHALL"]);
        let before = used_memory(server);
        let active = room("mem-active", 0);
        // 64 arrivals a millisecond (a rush of 64,000 a second), so that
        // sessions end in different milliseconds, as they do.
        let revoked = vid(n / 2 + 1);
        let revoked_expiry = AtomicU64::new(0);
        fill(n, |i| {
            let (p, revoked_expiry) = (&active, &revoked_expiry);
            async move {
                let at = now + i / 64;
                let v = if fresh {
                    store.arrive(p, vid(i), 0, Arrival::New, at).await
                } else {
                    store.arrive(p, vid(i), 0, Arrival::Known, at).await
                };
                match v.expect("arrive") {
                    Verdict::Admitted { session_expires_ms } if vid(i) == revoked => {
                        revoked_expiry.store(session_expires_ms, Ordering::Relaxed)
                    }
                    Verdict::Admitted { .. } => {}
                    other => panic!("not admitted: {other:?}"),
                }
            }
        })
        .await;
        let now = now + n / 64;
        let after = used_memory(server);
        let sessions = key_bytes(server, "wr:{mem-active}:sessions")
            + key_bytes(server, "wr:{mem-active}:batches");
        let admits = key_bytes(server, "wr:{mem-active}:admits");
        println!(
            "active sessions, {what}: {n}: used_memory +{} B = {:.1} B/session (sessions and batches {:.1}; the 60 s admissions window adds {:.1} per admission while it lasts)",
            after - before,
            (after - before) as f64 / n as f64,
            sessions as f64 / n as f64,
            admits as f64 / n as f64
        );
        // A release without a ticket (the admin API's) reads every batch;
        // the origin's revoke looks its session up by its ticket's expiry.
        let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
        let released = store.end(&active, vid(n / 2), End::Release, now).await;
        let (_, (_, usec)) = commandstats(server);
        assert!(released.expect("release"));
        let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
        let expires = revoked_expiry.load(Ordering::Relaxed);
        let ended = store
            .end(&active, revoked, End::Session(expires), now)
            .await;
        let (_, (_, revoke_usec)) = commandstats(server);
        assert!(ended.expect("end_session"));
        println!(
            "  among them, server time: a release (no ticket) {usec} us, a revoke (by its ticket) {revoke_usec} us"
        );
    }
}

async fn commands_per_op(server: &RedisServer, store: &RedisStore) {
    let now = SystemClock.now_ms();
    let _: () = server.cmd(&["FLUSHALL"]);
    let p = room("cmds", 1000);
    let k = 1000u64;
    // Warm-up loads every script, and fills the room so the next arrivals queue.
    let mut seqs = Vec::new();
    for i in 0..k {
        store
            .arrive(&p, vid(i), 0, Arrival::Known, now)
            .await
            .expect("arrive");
    }
    let report = |what: &str, server: &RedisServer| {
        let ((calls, usec), (scripts, script_usec)) = commandstats(server);
        println!(
            "{what}: {:.1} Redis commands inside {:.1} script runs per op; server time {:.1} us/op (commands {:.1} us)",
            calls as f64 / k as f64,
            scripts as f64 / k as f64,
            script_usec as f64 / k as f64,
            usec as f64 / k as f64
        );
    };
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    for i in k..2 * k {
        match store
            .arrive(&p, vid(i), 0, Arrival::New, now)
            .await
            .expect("arrive")
        {
            Verdict::Queued(q) => seqs.push((i, q.seq)),
            other => panic!("expected a queue place, got {other:?}"),
        }
    }
    report("arrive (queued)", server);
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    for &(i, seq) in &seqs {
        store.poll(&p, vid(i), 0, seq, now + 1).await.expect("poll");
    }
    report("poll (still queued)", server);
    // The same polls of places in the tail (past the head's 2,000 places),
    // what a head kept as the tail's first members would cost every poll.
    let mut tail = Vec::new();
    for i in 2 * k..2 * k + 2_000 {
        if let Verdict::Queued(q) = store
            .arrive(&p, vid(i), 0, Arrival::New, now)
            .await
            .expect("arrive")
        {
            if i >= 2 * k + 1_000 {
                tail.push((i, q.seq));
            }
        }
    }
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    for &(i, seq) in &tail {
        store.poll(&p, vid(i), 0, seq, now + 1).await.expect("poll");
    }
    report("poll (still queued, in the tail)", server);
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    for i in 0..k {
        store
            .check_in(&p, vid(i), now + 2, now + 2)
            .await
            .expect("check_in");
    }
    report("check_in (renewed)", server);
    let _: () = server.cmd(&["FLUSHALL"]);
    let open = room("cmds-open", 0);
    store
        .arrive(&open, vid(0), 0, Arrival::Known, now)
        .await
        .expect("arrive");
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    for i in 1..=k {
        store
            .arrive(&open, vid(i), 0, Arrival::New, now)
            .await
            .expect("arrive");
    }
    report("arrive (admitted)", server);
    // Newcomers admitted together (their sessions one `batches` entry per
    // call), 64 a millisecond, then each one's first renewal, which takes
    // its session out (a check-in reads the batches that end in the same
    // millisecond as its ticket).
    let _: () = server.cmd(&["FLUSHALL"]);
    let expiries = std::sync::Mutex::new(Vec::new());
    fill(k, |i| {
        let (open, expiries) = (&open, &expiries);
        async move {
            let v = store
                .arrive(open, vid(i), 0, Arrival::New, now + i / 64)
                .await;
            match v.expect("arrive") {
                Verdict::Admitted { session_expires_ms } => {
                    expiries.lock().unwrap().push((i, session_expires_ms))
                }
                other => panic!("expected an admission, got {other:?}"),
            }
        }
    })
    .await;
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    for (i, expiry) in expiries.into_inner().unwrap() {
        store
            .check_in(&open, vid(i), expiry, now + k / 64 + 1)
            .await
            .expect("check_in");
    }
    report(
        "check_in (renewed: the first after admission together)",
        server,
    );
}

/// CPU time the process `pid` has used, in microseconds: (user, system).
fn cpu_us(pid: u32) -> (f64, f64) {
    static TICK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let tick = *TICK.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    });
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
    (ticks(11) * 1e6 / tick, ticks(12) * 1e6 / tick)
}

/// A run's figures: operations per second, p50, p99, and the Redis CPU
/// time per operation.
struct Run {
    rate: f64,
    p50: Duration,
    p99: Duration,
    redis_us: f64,
    /// Of `redis_us`, the time spent in the kernel (reading requests,
    /// writing replies, waking up).
    redis_sys_us: f64,
    /// Operations per script call (how well arrivals were batched).
    per_call: f64,
    /// Of `redis_us`, the time Redis spent running the scripts (their
    /// commands included), from INFO commandstats.
    script_us: f64,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.0}/s (p50 {:?}, p99 {:?}), Redis CPU {:.1} µs per operation (system {:.1}, scripts {:.1}), {:.1} operations per script call, {} callers",
            self.rate, self.p50, self.p99, self.redis_us, self.redis_sys_us, self.script_us, self.per_call, callers()
        )
    }
}

/// `timed` from `callers()` tasks, with the Redis server's CPU time per
/// operation.
async fn measured<F, Fut>(server: &RedisServer, secs: u64, op: F) -> Run
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    measured_from(server, callers(), secs, op).await
}

/// `measured` from `tasks` tasks.
async fn measured_from<F, Fut>(server: &RedisServer, tasks: usize, secs: u64, op: F) -> Run
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let before = cpu_us(server.pid());
    let (_, (calls_before, usec_before)) = commandstats(server);
    let started = Instant::now();
    let (rate, p50, p99) = timed(tasks, secs, op).await;
    let ops = rate * started.elapsed().as_secs_f64();
    let after = cpu_us(server.pid());
    let redis_us = (after.0 + after.1 - before.0 - before.1) / ops.max(1.0);
    let redis_sys_us = (after.1 - before.1) / ops.max(1.0);
    let (_, (calls_after, usec_after)) = commandstats(server);
    Run {
        rate,
        p50,
        p99,
        redis_us,
        redis_sys_us,
        per_call: ops / (calls_after - calls_before).max(1) as f64,
        script_us: (usec_after - usec_before) as f64 / ops.max(1.0),
    }
}

/// The OpenResty recipe: one EVALSHA per visitor, admit while a counter is
/// under the limit (no queue, no rate window, no expiry).
const CHECK_AND_ADMIT: &str = r"
local active = tonumber(redis.call('GET', KEYS[1]) or '0')
if active < tonumber(ARGV[2]) then
    redis.call('INCR', KEYS[1])
    redis.call('SADD', KEYS[2], ARGV[1])
    return 1
end
return 0
";

/// One timed run of the recipe, its visitors numbered from `first`.
async fn recipe(server: &RedisServer, client: &redis::Client, secs: u64, first: u64) -> Run {
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("script connection");
    let script = Arc::new(redis::Script::new(CHECK_AND_ADMIT));
    measured(server, secs, move |i| {
        let (mut c, script) = (conn.clone(), Arc::clone(&script));
        async move {
            let _: i64 = script
                .key("or:{room}:active")
                .key("or:{room}:admitted")
                .arg(vid(first + i).to_hex())
                .arg(1_000_000_000u64)
                .invoke_async(&mut c)
                .await
                .expect("check-and-admit");
        }
    })
    .await
}

/// Runs `op` from `tasks` tasks for `secs`; returns ops/s and p50/p99.
async fn timed<F, Fut>(tasks: usize, secs: u64, op: F) -> (f64, Duration, Duration)
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let counter = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let tasks: Vec<_> = (0..tasks)
        .map(|_| {
            let op = Arc::clone(&op);
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    let i = counter.fetch_add(1, Ordering::Relaxed);
                    let t = Instant::now();
                    op(i).await;
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.expect("task"));
    }
    let took = started.elapsed();
    lat.sort_unstable();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    (lat.len() as f64 / took.as_secs_f64(), pct(0.5), pct(0.99))
}

/// What the floors (below) are measured against: the recipe's Redis CPU
/// per decision in `throughput`'s two runs, and how many visitors the
/// store put in one call there.
struct Reference {
    recipe_us: [f64; 2],
    batch: usize,
}

async fn throughput(server: &RedisServer, store: Arc<RedisStore>, n: u64, secs: u64) -> Reference {
    let _: () = server.cmd(&["FLUSHALL"]);
    let client = redis::Client::open(server.url()).expect("client");
    let ping_conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("ping connection");
    let ping = measured(server, secs, move |_| {
        let mut c = ping_conn.clone();
        async move {
            let _: String = redis::cmd("PING").query_async(&mut c).await.expect("ping");
        }
    })
    .await;
    println!("baseline PING: {ping}");

    // The recipe runs before and after ours and the ratios use the mean of
    // the two: on a shared machine the CPU a run gets drifts over seconds.
    let before = recipe(server, &client, secs, 0).await;
    println!("baseline OpenResty-style check-and-admit (EVALSHA GET/INCR/SADD), before: {before}");

    let s = Arc::clone(&store);
    let open = Arc::new(room("tp-open", 0));
    let admitted = measured(server, secs, move |i| {
        let (s, p) = (Arc::clone(&s), Arc::clone(&open));
        async move {
            s.arrive(&p, vid(i), 0, Arrival::New, SystemClock.now_ms())
                .await
                .expect("arrive");
        }
    })
    .await;
    println!("arrive, admitted (new-visitor decisions): {admitted}");

    let s = Arc::clone(&store);
    let full = Arc::new(room("tp-full", 1));
    store
        .arrive(
            &full,
            vid(u64::MAX),
            0,
            Arrival::Known,
            SystemClock.now_ms(),
        )
        .await
        .expect("arrive");
    let queued = measured(server, secs, move |i| {
        let (s, p) = (Arc::clone(&s), Arc::clone(&full));
        async move {
            s.arrive(&p, vid(i), 0, Arrival::New, SystemClock.now_ms())
                .await
                .expect("arrive");
        }
    })
    .await;
    println!("arrive, queued behind a full room: {queued}");

    // New visitors again (the recipe's set keeps growing, as it would).
    let after = recipe(server, &client, secs, 1 << 40).await;
    println!("baseline OpenResty-style check-and-admit (EVALSHA GET/INCR/SADD), after: {after}");
    let recipe_us = (before.redis_us + after.redis_us) / 2.0;
    let recipe_rate = (before.rate + after.rate) / 2.0;
    // On this shared 2-core machine the callers (this process) compete with
    // Redis for CPU, so the throughput ratio says more about the callers;
    // what one Redis core carries is 1 / (its CPU time per decision).
    println!(
        "  new-visitor decisions / OpenResty check-and-admit: {:.2}x per Redis CPU second (what one Redis core carries; recipe {recipe_us:.1} us, the mean of before and after), {:.2}x throughput with {} callers on this machine",
        recipe_us / admitted.redis_us,
        admitted.rate / recipe_rate,
        callers()
    );
    println!(
        "  queued decisions / OpenResty check-and-admit: {:.2}x per Redis CPU second",
        recipe_us / queued.redis_us
    );

    // Polls against a queue of `n` waiting visitors.
    let mut paused = room("tp-poll", 1);
    paused.state = RoomState::Paused;
    let now = SystemClock.now_ms();
    let seqs = Arc::new(tokio::sync::Mutex::new(Vec::with_capacity(n as usize)));
    fill(n, |i| {
        let (p, seqs, store) = (&paused, Arc::clone(&seqs), &store);
        async move {
            if let Verdict::Queued(q) = store
                .arrive(p, vid(i), 0, Arrival::Known, now)
                .await
                .expect("arrive")
            {
                seqs.lock().await.push((i, q.seq));
            }
        }
    })
    .await;
    let seqs = Arc::new(std::mem::take(&mut *seqs.lock().await));
    let s = Arc::clone(&store);
    let paused = Arc::new(paused);
    let polls = measured(server, secs, move |i| {
        let (s, p, seqs) = (Arc::clone(&s), Arc::clone(&paused), Arc::clone(&seqs));
        async move {
            let (v, seq) = seqs[(i as usize * 7919) % seqs.len()];
            s.poll(&p, vid(v), 0, seq, SystemClock.now_ms())
                .await
                .expect("poll");
        }
    })
    .await;
    println!("poll in a queue of {n}: {polls}");
    Reference {
        recipe_us: [before.redis_us, after.redis_us],
        batch: (admitted.per_call.round() as usize).clamp(1, 256),
    }
}

/// The floors (`WR_BENCH_FLOORS=1`): what one visitor costs Redis when a
/// call does nothing but write each visitor of a batch into one structure,
/// through a function as `arrive` does, sent one call at a time as the
/// store's group commit sends them. No decision, no counts, no
/// housekeeping: the least any design built on that structure can cost.
/// `zadd` is the design of today (a sorted-set entry per session and per
/// queue place, its score a string made in Lua); `sadd` a set entry (the
/// recipe's); `rpush` a list entry (an append-only log); `batch` one
/// sorted-set entry for the whole batch, its visitors' ids joined
/// (docs/redis-layout.md).
const FLOORS: &str = r"#!lua name=waitroom_bench_floors
local DIGITS3
-- Kept from call to call, as arrive's ZADD arguments are.
local T = {}
redis.register_function('floor_zadd', function(keys, args)
    if not DIGITS3 then
        DIGITS3 = {}
        for i = 0, 999 do
            DIGITS3[i] = string.format('%03d', i)
        end
    end
    local prefix, n, t = args[1], #args - 1, T
    for i = 1, n do
        t[2 * i - 1] = prefix .. DIGITS3[i]
        t[2 * i] = args[i + 1]
    end
    for first = 1, 2 * n, 30 do
        redis.call('ZADD', keys[1], unpack(t, first, math.min(first + 29, 2 * n)))
    end
    return n
end)
redis.register_function('floor_sadd', function(keys, args)
    return redis.call('SADD', keys[1], unpack(args, 2))
end)
redis.register_function('floor_rpush', function(keys, args)
    return redis.call('RPUSH', keys[1], unpack(args, 2))
end)
redis.register_function('floor_batch', function(keys, args)
    local n = #args - 1
    local ids = table.concat(args, '', 2)
    return redis.call('ZADD', keys[1], args[1], args[1] .. ':' .. n .. ':' .. ids)
end)
";

async fn floors(server: &RedisServer, secs: u64, reference: Reference) {
    let client = redis::Client::open(server.url()).expect("client");
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("floor connection");
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(FLOORS)
        .query_async(&mut conn.clone())
        .await
        .expect("FUNCTION LOAD");
    let batch = reference.batch;
    let mut runs = Vec::new();
    for name in ["zadd", "sadd", "rpush", "batch"] {
        let _: () = server.cmd(&["FLUSHALL", "SYNC"]);
        let conn = conn.clone();
        // One caller: the store's drainer sends a room's calls one at a time.
        let run = measured_from(server, 1, secs, move |i| {
            let mut c = conn.clone();
            async move {
                let mut call = redis::cmd("FCALL");
                call.arg(format!("floor_{name}"))
                    .arg(1)
                    .arg("floor:{f}")
                    .arg(1_000_000_000 + i);
                for k in 0..batch as u64 {
                    call.arg(vid(i * 256 + k).to_hex());
                }
                let _: i64 = call.query_async(&mut c).await.expect("floor");
            }
        })
        .await;
        runs.push((name, run));
    }
    let after = recipe(server, &client, secs, 1 << 41).await;
    let recipe_us = (reference.recipe_us[0] + reference.recipe_us[1] + after.redis_us) / 3.0;
    println!(
        "floors, {batch} visitors a call, one call at a time (recipe {recipe_us:.1} us, the mean of three runs):"
    );
    for (name, run) in runs {
        let us = run.redis_us / batch as f64;
        println!(
            "  {name}: {:.0} visitors/s, Redis CPU {us:.2} us per visitor (system {:.2}, script {:.2}), {:.2}x the recipe per Redis CPU second",
            run.rate * batch as f64,
            run.redis_sys_us / batch as f64,
            run.script_us / batch as f64,
            recipe_us / us
        );
    }
}

/// The redis-server process held to a share of one core (a cgroup CPU
/// quota), so that it, not this process, is what runs out: its decisions
/// per second are then what one Redis carries, batching as it would under
/// that load. Removed when dropped (after the server has exited).
struct CpuLimit(Option<std::path::PathBuf>);

impl CpuLimit {
    fn apply(pid: u32, share: f64) -> Self {
        use std::fs;
        use std::path::Path;
        let period: u64 = 10_000;
        let quota = ((share * period as f64) as u64).max(1_000);
        let name = format!("waitroom-bench-{}", std::process::id());
        // cgroup v1 `cpu` hierarchy, else cgroup v2 with the cpu controller.
        let v1 = Path::new("/sys/fs/cgroup/cpu");
        let v2 = Path::new("/sys/fs/cgroup");
        let made = if v1.join("cpu.cfs_quota_us").exists() {
            let dir = v1.join(&name);
            fs::create_dir(&dir)
                .and_then(|()| fs::write(dir.join("cpu.cfs_period_us"), period.to_string()))
                .and_then(|()| fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string()))
                .map(|()| dir)
        } else {
            let dir = v2.join(&name);
            fs::write(v2.join("cgroup.subtree_control"), "+cpu")
                .and_then(|()| fs::create_dir(&dir))
                .and_then(|()| fs::write(dir.join("cpu.max"), format!("{quota} {period}")))
                .map(|()| dir)
        };
        match made
            .and_then(|dir| fs::write(dir.join("cgroup.procs"), pid.to_string()).map(|()| dir))
        {
            Ok(dir) => {
                println!("redis-server held to {share} of a core ({})", dir.display());
                CpuLimit(Some(dir))
            }
            Err(e) => {
                println!("WR_BENCH_REDIS_CPU: no cgroup CPU quota here ({e}); running unlimited");
                CpuLimit(None)
            }
        }
    }
}

impl Drop for CpuLimit {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// New-visitor decisions and polls with `replica_acks` 0 and 1 on a
/// primary with one replica, `rounds` rounds alternating.
async fn replica_acks(rounds: usize, secs: u64, n: u64) {
    let primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary);
    let urls = [primary.url()];
    let open = |acks: u32| {
        let options = Options {
            replica_acks: acks,
            replica_ack_timeout: Duration::from_secs(1),
            ..Options::new(Duration::from_secs(5))
        };
        RedisStore::open_with(Target::Urls(&urls), options)
    };
    let stores = [
        Arc::new(open(0).await.expect("connect")),
        Arc::new(open(1).await.expect("connect")),
    ];
    // One queue of `n` for the polls (a paused room: nobody leaves it).
    let mut paused = room("acks-poll", 1);
    paused.state = RoomState::Paused;
    let now = SystemClock.now_ms();
    let seqs = Arc::new(tokio::sync::Mutex::new(Vec::with_capacity(n as usize)));
    fill(n, |i| {
        let (p, seqs, store) = (&paused, Arc::clone(&seqs), &stores[0]);
        async move {
            if let Verdict::Queued(q) = store
                .arrive(p, vid(i), 0, Arrival::Known, now)
                .await
                .expect("arrive")
            {
                seqs.lock().await.push((i, q.seq));
            }
        }
    })
    .await;
    let seqs = Arc::new(std::mem::take(&mut *seqs.lock().await));
    let paused = Arc::new(paused);
    let mut first = 1u64 << 44;
    for round in 0..rounds {
        for (acks, store) in stores.iter().enumerate() {
            let s = Arc::clone(store);
            let open_room = Arc::new(room("acks-open", 0));
            let from = first;
            first += 1 << 32;
            let admitted = measured(&primary, secs, move |i| {
                let (s, p) = (Arc::clone(&s), Arc::clone(&open_room));
                async move {
                    s.arrive(&p, vid(from + i), 0, Arrival::New, SystemClock.now_ms())
                        .await
                        .expect("arrive");
                }
            })
            .await;
            let s = Arc::clone(store);
            let (p, sq) = (Arc::clone(&paused), Arc::clone(&seqs));
            let polls = measured(&primary, secs, move |i| {
                let (s, p, sq) = (Arc::clone(&s), Arc::clone(&p), Arc::clone(&sq));
                async move {
                    let (v, seq) = sq[(i as usize * 7919) % sq.len()];
                    s.poll(&p, vid(v), 0, seq, SystemClock.now_ms())
                        .await
                        .expect("poll");
                }
            })
            .await;
            println!("round {round}, replica_acks = {acks}: new visitors {admitted}");
            println!("round {round}, replica_acks = {acks}: polls in a queue of {n}: {polls}");
        }
    }
    drop(replica);
}

fn main() {
    // Under `cargo test` (no `--bench`) a quick smoke run keeps CI short.
    let measuring = std::env::args().any(|a| a == "--bench");
    let n = env_or("WR_BENCH_N", if measuring { 100_000 } else { 2_000 });
    let secs = env_or("WR_BENCH_SECS", if measuring { 5 } else { 1 });
    let server = RedisServer::start();
    let limit = std::env::var("WR_BENCH_REDIS_CPU")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .map(|share| CpuLimit::apply(server.pid(), share));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let store = Arc::new(
            RedisStore::connect(&[server.url()], Duration::from_secs(5))
                .await
                .expect("connect"),
        );
        println!("redis-server on 127.0.0.1:{}", server.port());
        memory(&server, &store, n).await;
        commands_per_op(&server, &store).await;
        let reference = throughput(&server, store, n, secs).await;
        // (In the quick run too, so that CI runs their code.)
        if !measuring || std::env::var_os("WR_BENCH_FLOORS").is_some() {
            floors(&server, secs, reference).await;
        }
        replica_acks(if measuring { 2 } else { 1 }, secs, n.min(20_000)).await;
    });
    // The server first: its cgroup can go only once it is empty.
    drop(server);
    drop(limit);
}
