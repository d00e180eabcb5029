//! Stateful property tests of the stores against the reference model
//! (`store::model`): random sequences of what happens to a room (bursts of
//! newcomers arriving at once, polls and check-ins with the tickets the
//! visitors really hold, a replayed old ticket, releases and revokes,
//! resets, event starts with shuffles, losses, clock jumps, changes of
//! limits, method and state) run against the model and a store side by
//! side. After every step the store's verdicts must agree with the model's
//! (up to the divergences listed in [`agree`]) and the invariants I1-I5
//! must hold on the store's own figures. proptest shrinks a failing
//! sequence to a short one.
//!
//! The suite runs a fixed number of cases per backend; `WR_MODEL_CASES=N`
//! runs N (the long mode, for nights). The Redis layout is built at test
//! size (a head of 8 places, chunks of 16 ids), so tens of visitors reach
//! the tail and cross chunks.

#[path = "support/redis_server.rs"]
mod redis_server;

use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use waitroom::clock::Millis;
use waitroom::store::memory::MemoryStore;
use waitroom::store::model::ModelStore;
use waitroom::store::redis::{Layout, RedisStore};
use waitroom::store::{
    next_seq, Arrival, End, EventStart, Lanes, QueueingMethod, RoomPolicy, RoomState, SharedStore,
    Store, Verdict, VisitorId, MAX_LANES,
};

/// 2027-01-15.
const T0: Millis = 1_800_000_000_000;
const SESSION: Millis = 30_000;
const GRACE: Millis = 10_000;
const ABANDON: Millis = 90_000;

/// One thing that happens to the room.
#[derive(Clone, Debug)]
enum Op {
    /// This many newcomers arrive at once (concurrently: a store may decide
    /// them in one call).
    Burst(u8),
    /// A newcomer arrives in a priority lane (this number picks which; the
    /// general queue while the room has none).
    LaneArrive(u8),
    /// A visitor that came by a lane arrives again without a ticket (as a
    /// token's member id does), into a lane this number picks: it keeps
    /// what it holds, in any lane. (Only those: a newcomer's id is made
    /// for it and never arrives twice, so its batched session is not
    /// looked up by id. Nor those the admin API released: Redis gives such
    /// a visitor back its released place while it is in the tail, until it
    /// moves up; docs/redis-layout.md.)
    Again(u16),
    /// The room's lanes become two, with the shares this number picks
    /// (from then on it has two lanes; their shares may change again);
    /// from 4 on with a presale window ending some seconds from now (the
    /// general queue held until then).
    Lanes(u8),
    /// A visitor holding a queue ticket polls with it.
    Poll(u16),
    /// A visitor polls with the queue ticket it held before it was
    /// admitted (kept after the admission, as an attacker would).
    Replay(u16),
    /// A visitor holding an admitted ticket checks in with it.
    CheckIn(u16),
    /// The admin API releases a visitor (without its ticket).
    Release(u16),
    /// The origin revokes a visitor's session (by its ticket).
    Revoke(u16),
    /// The store loses a waiting visitor's place.
    Lose(u16),
    /// The store loses the whole room.
    Flush,
    Reset,
    /// The clock moves on by this many ms.
    Advance(u32),
    Limits {
        cap: u8,
        rate: u8,
    },
    Method(u8),
    State(u8),
    /// An event starts, its prequeue reaching back this many ms.
    Event {
        shuffle: bool,
        back_ms: u32,
    },
    Stats,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        20 => (1u8..=8).prop_map(Op::Burst),
        10 => any::<u8>().prop_map(Op::LaneArrive),
        2 => any::<u16>().prop_map(Op::Again),
        4 => (0u8..8).prop_map(Op::Lanes),
        25 => any::<u16>().prop_map(Op::Poll),
        3 => any::<u16>().prop_map(Op::Replay),
        10 => any::<u16>().prop_map(Op::CheckIn),
        3 => any::<u16>().prop_map(Op::Release),
        3 => any::<u16>().prop_map(Op::Revoke),
        3 => any::<u16>().prop_map(Op::Lose),
        1 => Just(Op::Flush),
        1 => Just(Op::Reset),
        15 => prop_oneof![1u32..2_000, 2_000u32..40_000, 40_000u32..200_000].prop_map(Op::Advance),
        3 => (0u8..=6, 0u8..=12).prop_map(|(cap, rate)| Op::Limits { cap, rate }),
        2 => (0u8..4).prop_map(Op::Method),
        2 => (0u8..4).prop_map(Op::State),
        1 => (any::<bool>(), 1u32..100_000).prop_map(|(shuffle, back_ms)| Op::Event { shuffle, back_ms }),
        5 => Just(Op::Stats),
    ]
}

fn ops(max: usize) -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(op(), 1..max)
}

/// What a visitor holds, as the daemon would have given it.
#[derive(Clone, Copy, Debug)]
enum Ticket {
    None,
    /// A place's seq, and when the ticket lapses (`abandon_after` after it
    /// was issued: the daemon opens no older one).
    Queued(u64, Millis),
    Admitted(Millis),
}

#[derive(Clone, Debug)]
struct Visitor {
    id: VisitorId,
    /// The lane its queue ticket names.
    lane: u8,
    /// It came by a lane, `Arrival::Known` (its id may arrive again).
    by_lane: bool,
    /// The admin API released it (see `Op::Again`).
    released: bool,
    ticket: Ticket,
    /// The last queue ticket it held (kept after an admission): its seq
    /// and when it lapses.
    old_queue: Option<(u64, Millis)>,
}

/// How a store may differ from the model.
#[derive(Clone, Copy)]
struct Divergence {
    /// Positions and lengths in the queue's back may count visitors who
    /// left unseen (Redis' tail): shown too high, never too low.
    positions_may_be_high: bool,
}

/// The verdicts agree: the same kind, expiry and seq; a position and
/// length exact, or (where allowed) no lower than the model's. After the
/// store lost places, a place put back inside Redis' tail counts in no
/// length until it moves to the head, so only the seq is compared.
fn agree(
    what: &str,
    model: &Verdict,
    store: &Verdict,
    d: Divergence,
    lost: bool,
) -> Result<(), TestCaseError> {
    let ok = match (model, store) {
        (Verdict::Queued(m), Verdict::Queued(s)) => {
            m.seq == s.seq
                && if d.positions_may_be_high && lost {
                    s.position >= 1 && s.position <= s.queue_length.max(s.position)
                } else if d.positions_may_be_high {
                    s.position >= m.position && s.queue_length >= m.queue_length
                } else {
                    s.position == m.position && s.queue_length == m.queue_length
                }
        }
        (m, s) => m == s,
    };
    prop_assert!(ok, "{what}: model {model:?}, store {store:?}");
    Ok(())
}

struct Case<'a> {
    model: ModelStore,
    store: &'a dyn Store,
    /// How the backend loses a visitor's place, or the whole room.
    lose: &'a (dyn Fn(&RoomPolicy, VisitorId) + Sync),
    flush: &'a (dyn Fn(&RoomPolicy) + Sync),
    d: Divergence,
    p: RoomPolicy,
    now: Millis,
    visitors: Vec<Visitor>,
    /// Until when the store may hold more than its limits: after a loss,
    /// tickets bring back sessions the store forgot (I5); after a limit is
    /// lowered, admitted visitors keep their sessions.
    over_until: Millis,
    /// The model and the store choose differently from here on (a random
    /// pick): only the invariants are checked.
    diverged: bool,
    /// The store lost places (or the room): positions may be off after.
    lost: bool,
    events: u32,
    /// Print each step and verdict (`WR_MODEL_REPLAY`).
    trace: bool,
    /// The figures before this step, for "never more while over".
    last_active: u64,
    last_window: u64,
}

impl Case<'_> {
    fn pick(&self, k: u16, want: impl Fn(&Visitor) -> bool) -> Option<usize> {
        let fit: Vec<usize> = (0..self.visitors.len())
            .filter(|&i| want(&self.visitors[i]))
            .collect();
        (!fit.is_empty()).then(|| fit[k as usize % fit.len()])
    }

    /// The lane `k` picks: one of the room's, or the general queue.
    fn lane_of(&self, k: u8) -> u8 {
        match self.p.lanes.count {
            0 => 0,
            n => 1 + k % n,
        }
    }

    /// The visitor now holds what `v` gave it.
    fn hold(&mut self, i: usize, v: &Verdict) {
        let lapses = self.now + self.p.abandon_after_ms;
        let visitor = &mut self.visitors[i];
        match *v {
            Verdict::Admitted { session_expires_ms } => {
                visitor.ticket = Ticket::Admitted(session_expires_ms)
            }
            Verdict::Queued(place) => {
                visitor.ticket = Ticket::Queued(place.seq, lapses);
                visitor.old_queue = Some((place.seq, lapses));
            }
            Verdict::Ended => visitor.ticket = Ticket::None,
            Verdict::Rejected(_) => {}
        }
    }

    async fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        if self.trace {
            eprintln!("@{} {op:?}", self.now - T0);
        }
        let (p, now) = (self.p.clone(), self.now);
        let d = self.d;
        match *op {
            Op::Burst(n) => {
                let ids: Vec<VisitorId> = (0..n).map(|_| VisitorId::random()).collect();
                let decided = futures::future::join_all(
                    ids.iter()
                        .map(|&v| self.store.arrive(&p, v, 0, Arrival::New, now)),
                )
                .await;
                let mut decided: Vec<(VisitorId, Verdict)> = ids
                    .into_iter()
                    .zip(decided)
                    .map(|(v, r)| (v, r.expect("arrive")))
                    .collect();
                // The store decided them in some order: admissions first,
                // then places by seq, then refusals. The model takes them
                // in that order.
                decided.sort_by_key(|(_, v)| match v {
                    Verdict::Admitted { .. } => (0, 0),
                    Verdict::Queued(place) => (1, place.seq),
                    _ => (2, 0),
                });
                for (id, verdict) in decided {
                    let model = self
                        .model
                        .arrive(&p, id, 0, Arrival::Known, now)
                        .await
                        .unwrap();
                    if self.trace {
                        eprintln!(
                            "   visitor {}: model {model:?} store {verdict:?}",
                            self.visitors.len()
                        );
                    }
                    if !self.diverged {
                        agree("arrive", &model, &verdict, d, self.lost)?;
                    }
                    self.visitors.push(Visitor {
                        id,
                        lane: 0,
                        by_lane: false,
                        released: false,
                        ticket: Ticket::None,
                        old_queue: None,
                    });
                    let i = self.visitors.len() - 1;
                    self.hold(i, &verdict);
                }
            }
            Op::LaneArrive(k) => {
                let lane = self.lane_of(k);
                let id = VisitorId::random();
                let model = self
                    .model
                    .arrive(&p, id, lane, Arrival::Known, now)
                    .await
                    .unwrap();
                // A newcomer's id, made for it, half of the time (a lane's
                // sessions are looked up by id either way; the general
                // queue's newcomers are batched, so never).
                let store = if lane > 0 && k & 2 == 0 {
                    self.store.arrive(&p, id, lane, Arrival::New, now).await
                } else if k & 4 == 0 {
                    // A member the room has not seen lately.
                    self.store.arrive(&p, id, lane, Arrival::Unseen, now).await
                } else {
                    self.store.arrive(&p, id, lane, Arrival::Known, now).await
                };
                let store = store.expect("lane");
                if self.trace {
                    eprintln!(
                        "   visitor {} lane {lane}: model {model:?} store {store:?}",
                        self.visitors.len()
                    );
                }
                if !self.diverged {
                    agree("arrive in a lane", &model, &store, d, self.lost)?;
                }
                self.visitors.push(Visitor {
                    id,
                    lane,
                    by_lane: true,
                    released: false,
                    ticket: Ticket::None,
                    old_queue: None,
                });
                let i = self.visitors.len() - 1;
                self.hold(i, &store);
            }
            Op::Again(k) => {
                let Some(i) = self.pick(k, |v| v.by_lane && !v.released) else {
                    return Ok(());
                };
                let lane = self.lane_of((k >> 8) as u8);
                let id = self.visitors[i].id;
                let model = self
                    .model
                    .arrive(&p, id, lane, Arrival::Known, now)
                    .await
                    .unwrap();
                let store = self
                    .store
                    .arrive(&p, id, lane, Arrival::Known, now)
                    .await
                    .expect("again");
                if self.trace {
                    eprintln!("   visitor {i} again, lane {lane}: model {model:?} store {store:?}");
                }
                if !self.diverged {
                    agree("arrive again", &model, &store, d, self.lost)?;
                }
                if matches!(store, Verdict::Queued(_)) {
                    // A new place or its old one, found by visitor: in the
                    // lane the model says it waits in.
                    self.visitors[i].lane = self.model.lane_of(&p, id);
                }
                self.hold(i, &store);
            }
            Op::Lanes(k) => {
                let shares: [&[u16]; 4] = [&[300, 200], &[500, 500], &[100, 100], &[700, 100]];
                let until = match k / 4 % 2 {
                    0 => 0,
                    _ => now + 20_000,
                };
                self.p.lanes = Lanes::with_shares(shares[k as usize % 4]).only_until(until);
            }
            Op::Poll(k) | Op::Replay(k) => {
                let replay = matches!(op, Op::Replay(_));
                // Only a ticket that has not lapsed is ever opened.
                let held = |v: &Visitor| match (v.ticket, v.old_queue) {
                    (Ticket::Queued(_, lapses), _) if !replay => lapses > now,
                    (Ticket::Queued(..), _) => false,
                    (_, Some((_, lapses))) => replay && lapses > now,
                    _ => false,
                };
                let Some(i) = self.pick(k, held) else {
                    return Ok(());
                };
                let seq = match (self.visitors[i].ticket, self.visitors[i].old_queue) {
                    (Ticket::Queued(seq, _), _) => seq,
                    (_, Some((seq, _))) => seq,
                    _ => return Ok(()),
                };
                let (id, lane) = (self.visitors[i].id, self.visitors[i].lane);
                let model = self.model.poll(&p, id, lane, seq, now).await.unwrap();
                let store = self.store.poll(&p, id, lane, seq, now).await.expect("poll");
                if self.trace {
                    eprintln!("   visitor {i} seq {seq}: model {model:?} store {store:?}");
                }
                if !self.diverged {
                    agree("poll", &model, &store, d, self.lost)?;
                }
                self.hold(i, &store);
            }
            Op::CheckIn(k) => {
                let Some(i) = self.pick(k, |v| matches!(v.ticket, Ticket::Admitted(_))) else {
                    return Ok(());
                };
                let Ticket::Admitted(expires) = self.visitors[i].ticket else {
                    return Ok(());
                };
                let id = self.visitors[i].id;
                if expires <= now {
                    // The daemon treats an expired ticket as a newcomer.
                    self.visitors[i].ticket = Ticket::None;
                    return Ok(());
                }
                let model = self.model.check_in(&p, id, expires, now).await.unwrap();
                let store = self
                    .store
                    .check_in(&p, id, expires, now)
                    .await
                    .expect("check_in");
                if !self.diverged {
                    prop_assert_eq!(model, store, "check_in");
                }
                self.visitors[i].ticket = match store {
                    Some(e) => Ticket::Admitted(e),
                    None => Ticket::None,
                };
            }
            Op::Release(k) => {
                let Some(i) = self.pick(k, |v| !matches!(v.ticket, Ticket::None)) else {
                    return Ok(());
                };
                let id = self.visitors[i].id;
                self.visitors[i].released = true;
                let model = self.model.end(&p, id, End::Release, now).await.unwrap();
                let store = self
                    .store
                    .end(&p, id, End::Release, now)
                    .await
                    .expect("release");
                if self.trace {
                    eprintln!("   visitor {i}: model {model} store {store}");
                }
                if !self.diverged {
                    prop_assert_eq!(model, store, "release");
                }
            }
            Op::Revoke(k) => {
                let Some(i) = self.pick(k, |v| matches!(v.ticket, Ticket::Admitted(_))) else {
                    return Ok(());
                };
                let Ticket::Admitted(expires) = self.visitors[i].ticket else {
                    return Ok(());
                };
                let id = self.visitors[i].id;
                let model = self
                    .model
                    .end(&p, id, End::Session(expires), now)
                    .await
                    .unwrap();
                let store = self
                    .store
                    .end(&p, id, End::Session(expires), now)
                    .await
                    .expect("end_session");
                if !self.diverged {
                    prop_assert_eq!(model, store, "end_session");
                }
                self.visitors[i].ticket = Ticket::None;
            }
            Op::Lose(k) => {
                let Some(i) = self.pick(k, |v| matches!(v.ticket, Ticket::Queued(..))) else {
                    return Ok(());
                };
                let id = self.visitors[i].id;
                self.model.lose(&p, id);
                (self.lose)(&p, id);
                self.lost = true;
            }
            Op::Flush => {
                self.model.flush(&p);
                (self.flush)(&p);
                self.lost = true;
                self.over_until = self.over_until.max(now + SESSION + GRACE + 1);
            }
            Op::Reset => {
                self.model.reset(&p, now).await.unwrap();
                self.store.reset(&p, now).await.expect("reset");
            }
            Op::Advance(ms) => self.now += Millis::from(ms),
            Op::Limits { cap, rate } => {
                let (cap, rate) = (u64::from(cap).max(1), u64::from(rate));
                if cap < self.p.total_active_users
                    || (rate > 0
                        && (self.p.new_users_per_minute == 0 || rate < self.p.new_users_per_minute))
                {
                    self.over_until = self.over_until.max(now + SESSION + GRACE + 60_001);
                }
                self.p.total_active_users = cap;
                self.p.new_users_per_minute = rate;
            }
            Op::Method(m) => {
                if self.p.method == QueueingMethod::Passthrough {
                    // What passthrough let in stays.
                    self.over_until = self.over_until.max(now + SESSION + GRACE + 60_001);
                }
                self.p.method = [
                    QueueingMethod::Fifo,
                    QueueingMethod::Random,
                    QueueingMethod::Passthrough,
                    QueueingMethod::Reject,
                ][m as usize % 4];
                if self.p.method == QueueingMethod::Random {
                    self.diverged = true;
                }
            }
            Op::State(s) => {
                self.p.state = [
                    RoomState::Open,
                    RoomState::QueueAll,
                    RoomState::Paused,
                    RoomState::Closed,
                ][s as usize % 4];
            }
            Op::Event { shuffle, back_ms } => {
                self.events += 1;
                let event = EventStart {
                    key: format!("e{}@{now}", self.events),
                    prequeue_seq: next_seq(now.saturating_sub(Millis::from(back_ms)), 0),
                    start_seq: next_seq(now, 0),
                    shuffle,
                    seed: u64::from(back_ms),
                };
                let model = self.model.start_event(&p, &event, now).await.unwrap();
                let store = self
                    .store
                    .start_event(&p, &event, now)
                    .await
                    .expect("start_event");
                if !self.diverged {
                    prop_assert_eq!(model, store, "start_event: shuffled");
                }
            }
            Op::Stats => {
                let model = self.model.stats(&p, now).await.unwrap();
                let store = self.store.stats(&p, now).await.expect("stats");
                if !self.diverged {
                    prop_assert_eq!(model.active, store.active, "active");
                    prop_assert_eq!(
                        model.admitted_last_minute,
                        store.admitted_last_minute,
                        "window"
                    );
                    if d.positions_may_be_high && self.lost {
                        // Places put back inside the tail count in no length.
                    } else if d.positions_may_be_high {
                        prop_assert!(
                            store.queued >= model.queued,
                            "queued {} < {}",
                            store.queued,
                            model.queued
                        );
                    } else {
                        prop_assert_eq!(model.queued, store.queued, "queued");
                    }
                }
            }
        }
        self.invariants().await
    }

    /// I1, I2 and I4 on the store's own figures (I3 and I5 are the verdicts'
    /// agreement with the model, which keeps them by construction). The
    /// model is asked too, so both see the same calls at the same times
    /// (every call promotes: who is let in when depends on it).
    async fn invariants(&mut self) -> Result<(), TestCaseError> {
        let (p, now) = (&self.p, self.now);
        // A Redis call promotes at most PROMOTE_MAX ahead and drops abandoned
        // places in bounded steps; the daemon's next calls go on (it reads
        // every room's figures every 2 s, and a poll within the free room
        // asks until it is in). So the store is read until it settles.
        let mut last = None;
        for _ in 0..100 {
            let queued = self.store.stats(p, now).await.expect("stats").queued;
            if last == Some(queued) {
                break;
            }
            last = Some(queued);
        }
        let violations = self.store.check(p, now).await.expect("check");
        prop_assert!(
            violations.is_empty(),
            "the layout's invariants: {violations:?}"
        );
        let stats = self.store.stats(p, now).await.expect("stats");
        let model = self.model.stats(p, now).await.unwrap();
        if !self.diverged {
            prop_assert_eq!(model.active, stats.active, "active");
        }
        let cap = p.total_active_users;
        let rate = p.new_users_per_minute;
        // passthrough only counts (it admits whoever comes).
        let over_allowed = now < self.over_until || p.method == QueueingMethod::Passthrough;
        if !over_allowed {
            // I1, I2: over a limit only by sessions or admissions it had
            // before (a limit lowered, a loss), never by new ones.
            if stats.active > cap {
                prop_assert!(
                    stats.active <= self.last_active,
                    "I1: {} > {cap}",
                    stats.active
                );
            }
            if rate > 0 && stats.admitted_last_minute > rate {
                prop_assert!(
                    stats.admitted_last_minute <= self.last_window,
                    "I2: {} > {rate}",
                    stats.admitted_last_minute
                );
            }
        }
        // I4: nobody waits while there is room in a room that promotes.
        let promotes = matches!(p.state, RoomState::Open | RoomState::QueueAll)
            && matches!(p.method, QueueingMethod::Fifo | QueueingMethod::Random);
        // In a presale window the general queue waits whatever room there
        // is: only the lanes' places count.
        let served = |s: &waitroom::store::RoomStats| match p.lanes.general_held(now) {
            true => s.lane_queued.iter().sum(),
            false => s.queued,
        };
        let waiting = if self.diverged {
            served(&stats)
        } else {
            served(&model)
        };
        if promotes && waiting > 0 && served(&stats) > 0 {
            let full = stats.active >= cap || (rate > 0 && stats.admitted_last_minute >= rate);
            prop_assert!(full, "I4: {} waiting with room: {stats:?}", stats.queued);
        }
        self.last_active = stats.active;
        self.last_window = stats.admitted_last_minute;
        Ok(())
    }
}

fn policy() -> RoomPolicy {
    RoomPolicy {
        room: Arc::from(format!("model-{:016x}", rand::random::<u64>()).as_str()),
        total_active_users: 3,
        new_users_per_minute: 0,
        session_duration_ms: SESSION,
        session_renewal: true,
        method: QueueingMethod::Fifo,
        max_queue_length: 0,
        abandon_after_ms: ABANDON,
        arrival_grace_ms: GRACE,
        state: RoomState::Open,
        revision: 0,
        lanes: Default::default(),
    }
}

/// Cases per backend: the suite's, or `WR_MODEL_CASES`.
fn cases(suite: u32) -> u32 {
    std::env::var("WR_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(suite)
}

/// Runs `cases` random sequences of up to `len` steps against `store`.
fn run(
    runtime: &tokio::runtime::Runtime,
    store: &dyn Store,
    lose: &(dyn Fn(&RoomPolicy, VisitorId) + Sync),
    flush: &(dyn Fn(&RoomPolicy) + Sync),
    d: Divergence,
    cases: u32,
    len: usize,
) {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&ops(len), |ops| {
        run_case(runtime, store, lose, flush, d, &ops, false)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Runs one sequence (with each step printed when `trace`).
fn run_case(
    runtime: &tokio::runtime::Runtime,
    store: &dyn Store,
    lose: &(dyn Fn(&RoomPolicy, VisitorId) + Sync),
    flush: &(dyn Fn(&RoomPolicy) + Sync),
    d: Divergence,
    ops: &[Op],
    trace: bool,
) -> Result<(), TestCaseError> {
    runtime.block_on(async {
        let mut case = Case {
            model: ModelStore::new(),
            store,
            lose,
            flush,
            d,
            p: policy(),
            now: T0,
            visitors: Vec::new(),
            over_until: 0,
            diverged: false,
            lost: false,
            events: 0,
            trace,
            last_active: 0,
            last_window: 0,
        };
        for op in ops {
            case.step(op).await?;
        }
        Ok(())
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The model against itself: the harness and the invariants hold.
#[test]
fn the_model_keeps_the_invariants() {
    let rt = runtime();
    let store = ModelStore::new();
    run(
        &rt,
        &store,
        &|p, v| store.lose(p, v),
        &|p| store.flush(p),
        Divergence {
            positions_may_be_high: false,
        },
        cases(500),
        80,
    );
}

#[test]
fn the_memory_store_agrees_with_the_model() {
    let rt = runtime();
    let store = MemoryStore::new();
    run(
        &rt,
        &store,
        &|p, v| {
            store.lose_queue_entry(p, v);
        },
        &|p| store.forget_room(p),
        Divergence {
            positions_may_be_high: false,
        },
        cases(500),
        80,
    );
}

/// What to run on a Redis store: the generated cases, or one sequence
/// (printed step by step when `trace`).
enum Run<'a> {
    Cases(u32),
    One(&'a [Op], bool),
}

fn redis_run(urls: Vec<String>, what: Run<'_>) {
    let rt = runtime();
    let store: SharedStore = rt.block_on(async {
        let store = RedisStore::connect_with_layout(
            &urls,
            std::time::Duration::from_secs(2),
            Layout::small(),
        )
        .await
        .unwrap();
        Arc::new(store)
    });
    let direct = move |c: &mut dyn FnMut(&mut dyn redis::ConnectionLike)| {
        if urls.len() == 1 {
            let client = redis::Client::open(urls[0].as_str()).unwrap();
            c(&mut client.get_connection().unwrap());
        } else {
            let client = redis::cluster::ClusterClient::new(urls.clone()).unwrap();
            c(&mut client.get_connection().unwrap());
        }
    };
    let direct = &direct;
    // A place lost: its entry in `queue`, or its id in the tail (read back
    // as no visitor's), or the member that carries it.
    let lose = move |p: &RoomPolicy, v: VisitorId| {
        let room = &p.room;
        let hex = v.to_hex();
        direct(&mut |c| {
            let removed: i64 = redis::cmd("ZREM")
                .arg(format!("wr:{{{room}}}:queue"))
                .arg(&hex)
                .query(c)
                .unwrap();
            let _: i64 = redis::cmd("HDEL")
                .arg(format!("wr:{{{room}}}:polls"))
                .arg(&hex)
                .query(c)
                .unwrap();
            if removed == 1 {
                return;
            }
            for lane in 1..=MAX_LANES {
                let removed: i64 = redis::cmd("ZREM")
                    .arg(format!("wr:{{{room}}}:lane:{lane}"))
                    .arg(&hex)
                    .query(c)
                    .unwrap();
                if removed == 1 {
                    return;
                }
            }
            let chunks: Vec<String> = redis::cmd("KEYS")
                .arg(format!("wr:{{{room}}}:tail_ids:*"))
                .query(c)
                .unwrap();
            for chunk in chunks {
                let ids: Vec<u8> = redis::cmd("GET").arg(&chunk).query(c).unwrap_or_default();
                for (i, id) in ids.chunks(32).enumerate() {
                    if id == hex.as_bytes() {
                        let _: i64 = redis::cmd("SETRANGE")
                            .arg(&chunk)
                            .arg(i * 32)
                            .arg("?".repeat(32))
                            .query(c)
                            .unwrap();
                    }
                }
            }
            let tail = format!("wr:{{{room}}}:tail");
            let members: Vec<Vec<u8>> = redis::cmd("ZRANGE")
                .arg(&tail)
                .arg(0)
                .arg(-1)
                .query(c)
                .unwrap();
            for m in members {
                if m.len() > 32 && m[32..].chunks(32).any(|id| id == hex.as_bytes()) {
                    let _: i64 = redis::cmd("ZREM").arg(&tail).arg(m).query(c).unwrap();
                }
            }
        });
    };
    let flush = move |p: &RoomPolicy| {
        let room = &p.room;
        direct(&mut |c| {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("wr:{{{room}}}:*"))
                .query(c)
                .unwrap();
            for key in keys.into_iter().filter(|k| !k.ends_with(":overrides")) {
                let _: i64 = redis::cmd("DEL").arg(key).query(c).unwrap();
            }
        });
    };
    let d = Divergence {
        positions_may_be_high: true,
    };
    match what {
        Run::Cases(n) => run(&rt, store.as_ref(), &lose, &flush, d, cases(n), 80),
        Run::One(ops, trace) => {
            if let Err(e) = run_case(&rt, store.as_ref(), &lose, &flush, d, ops, trace) {
                panic!("redis: {e}");
            }
        }
    }
}

#[test]
fn the_redis_store_agrees_with_the_model() {
    let server = redis_server::RedisServer::start();
    redis_run(vec![server.url()], Run::Cases(200));
}

#[test]
fn the_redis_cluster_store_agrees_with_the_model() {
    let cluster = redis_server::RedisCluster::start();
    redis_run(cluster.urls(), Run::Cases(100));
}

/// Runs the sequence in `WR_MODEL_REPLAY` (as a failing case prints it) on
/// Redis, each step printed: `WR_MODEL_REPLAY='[Burst(3,), ...]' cargo test
/// --test model -- --ignored replay --nocapture` (on a Cluster with
/// `WR_MODEL_CLUSTER=1`). A tool for a finding, not a test of its own.
#[test]
#[ignore]
fn replay() {
    let ops = parse_ops(&std::env::var("WR_MODEL_REPLAY").expect("WR_MODEL_REPLAY"));
    if std::env::var_os("WR_MODEL_CLUSTER").is_some() {
        let cluster = redis_server::RedisCluster::start();
        redis_run(cluster.urls(), Run::One(&ops, true));
        return;
    }
    let server = redis_server::RedisServer::start();
    redis_run(vec![server.url()], Run::One(&ops, true));
}

/// A sequence the property tests once shrank a failure to, run on the
/// memory store and on Redis (test-size layout) against the model: each
/// is a finding, fixed, kept as a test of its own.
fn finding(ops: &str) {
    let ops = parse_ops(ops);
    let rt = runtime();
    let memory = MemoryStore::new();
    let exact = Divergence {
        positions_may_be_high: false,
    };
    let lose = |p: &RoomPolicy, v: VisitorId| {
        memory.lose_queue_entry(p, v);
    };
    if let Err(e) = run_case(
        &rt,
        &memory,
        &lose,
        &|p| memory.forget_room(p),
        exact,
        &ops,
        false,
    ) {
        panic!("memory: {e}");
    }
    drop(rt);
    let server = redis_server::RedisServer::start();
    redis_run(vec![server.url()], Run::One(&ops, false));
}

/// The admin API's release of a visitor the room does not hold answered
/// "released" whenever the queue had a tail (its places are not looked up
/// by visitor); now the tail is read, a bounded part a call.
#[test]
fn finding_a_release_of_nobody_is_false_with_a_tail() {
    finding("[Burst(4,),Burst(2,),Flush,Burst(7,),Burst(7,),Release(20380,),Burst(1,),Burst(1,),]");
}

/// A place released in the tail was answered "released" again at a second
/// release (the mark stays until the place moves up).
#[test]
fn finding_a_tail_place_is_released_once() {
    finding("[Burst(2,),Burst(5,),Burst(6,),Release(52062,),Release(15623,),]");
}

/// A place abandoned in the tail, not yet swept out, was answered
/// "released".
#[test]
fn finding_an_abandoned_tail_place_is_not_released() {
    finding("[State(2,),Burst(8,),Burst(4,),Advance(50000,),Poll(0,),Poll(1,),Poll(2,),Poll(3,),Poll(4,),Poll(5,),Poll(6,),Poll(7,),Advance(50000,),Release(8,),Release(9,),Release(10,),Release(11,),]");
}

/// Newcomers to a room that is not FIFO (passthrough in queue_all here)
/// were written to `queue` while a tail existed, above its seqs: shown
/// ahead of the tail's visitors they came after.
#[test]
fn finding_newcomers_go_behind_the_tail_in_any_method() {
    finding("[Burst(7,),State(1,),Burst(5,),Method(2,),Burst(1,),]");
}

/// A place put back (I5) inside a tail member stayed in the tail when the
/// member moved up, behind places that came after it.
#[test]
fn finding_a_place_put_back_inside_a_member_moves_up_with_it() {
    finding("[Burst(7,),Advance(22536,),Poll(20,),Advance(7464,),Poll(1339,),Advance(60000,),Poll(0,),Poll(0,),Burst(7,),Burst(4,),CheckIn(15132,),Lose(37639,),Release(39941,),Poll(29139,),Burst(4,),Release(47804,),]");
}

/// In passthrough, a poll that admitted a place the store had lost did not
/// use it up: replaying that ticket after the session admitted again.
#[test]
fn finding_a_lost_place_admitted_in_passthrough_is_used_up() {
    finding("[Burst(7,),Burst(1,),Burst(7,),Method(2,),Poll(8669,),Burst(1,),Poll(50146,),Poll(3210,),Poll(9387,),Flush,Poll(57989,),Advance(30000,),Burst(1,),Method(3,),Poll(44294,),Replay(23835,),]");
}

/// In passthrough, every store admitted a released place's ticket.
#[test]
fn finding_passthrough_admits_no_ended_place() {
    finding("[Burst(3,),Burst(6,),Burst(4,),Release(65087,),Method(2,),Poll(54636,),Poll(12338,),Poll(38350,),]");
}

/// A closed room answered a released tail place "ended" on Redis and
/// "closed" in memory.
#[test]
fn finding_a_closed_room_says_closed_to_ended_places_too() {
    finding("[Burst(7,),Burst(8,),Burst(6,),State(3,),Release(59720,),Poll(29354,),]");
}

/// Each store drew its own order for an event's shuffle.
#[test]
fn finding_every_store_shuffles_the_same() {
    finding("[Burst(5,),Burst(6,),Advance(1,),Event{shuffle:true,back_ms:1,},Poll(0,),]");
}

/// A reset just before an event's prequeue left no seqs below it above the
/// reset floor: the shuffle gave places seqs at or below the floor, whose
/// tickets could not put them back after a loss.
#[test]
fn finding_a_shuffle_after_a_reset_stays_above_the_floor() {
    finding("[Reset,Burst(4,),Advance(1,),Event{shuffle:true,back_ms:1,},]");
}

/// Parses a sequence as a failing case prints it (whitespace removed).
fn parse_ops(text: &str) -> Vec<Op> {
    let text: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    let text = text.trim_start_matches('[').trim_end_matches(']');
    let mut ops = Vec::new();
    let mut rest = text;
    let num = |s: &str, key: &str| -> u64 {
        let at = s.find(&format!("{key}:")).unwrap() + key.len() + 1;
        s[at..].split([',', '}']).next().unwrap().parse().unwrap()
    };
    while !rest.is_empty() {
        let end = if rest.starts_with("Limits") || rest.starts_with("Event") {
            rest.find("},").map(|i| i + 2).unwrap_or(rest.len())
        } else if let Some(i) = rest.find("),") {
            if rest.find(',').unwrap() < rest.find('(').unwrap_or(usize::MAX) {
                rest.find(',').unwrap() + 1
            } else {
                i + 2
            }
        } else {
            rest.find(',').map(|i| i + 1).unwrap_or(rest.len())
        };
        let item = &rest[..end];
        rest = &rest[end..];
        let arg = || {
            item[item.find('(').unwrap() + 1..]
                .split([',', ')'])
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        };
        let op = match item.split(['(', '{', ',']).next().unwrap() {
            "Burst" => Op::Burst(arg() as u8),
            "LaneArrive" => Op::LaneArrive(arg() as u8),
            "Again" => Op::Again(arg() as u16),
            "Lanes" => Op::Lanes(arg() as u8),
            "Poll" => Op::Poll(arg() as u16),
            "Replay" => Op::Replay(arg() as u16),
            "CheckIn" => Op::CheckIn(arg() as u16),
            "Release" => Op::Release(arg() as u16),
            "Revoke" => Op::Revoke(arg() as u16),
            "Lose" => Op::Lose(arg() as u16),
            "Flush" => Op::Flush,
            "Reset" => Op::Reset,
            "Advance" => Op::Advance(arg() as u32),
            "Limits" => Op::Limits {
                cap: num(item, "cap") as u8,
                rate: num(item, "rate") as u8,
            },
            "Method" => Op::Method(arg() as u8),
            "State" => Op::State(arg() as u8),
            "Event" => Op::Event {
                shuffle: item.contains("shuffle:true"),
                back_ms: num(item, "back_ms") as u32,
            },
            "Stats" => Op::Stats,
            other => panic!("unknown op {other:?} in {item:?}"),
        };
        ops.push(op);
    }
    ops
}

/// A visitor whose session was revoked came back by id (as a token's
/// member does) to a new place in Redis' tail; its poll answered `Ended`,
/// since the tail read the revoke's `ended` mark as the place's. Only a
/// `places` mark now ends a place in the tail.
#[test]
fn finding_a_member_back_after_a_revoke_keeps_its_new_place_in_the_tail() {
    finding("[LaneArrive(0,),Burst(3,),Revoke(42897,),Burst(6,),Burst(3,),Again(0,),Advance(1,),Again(0,),Poll(23892,),]");
}

/// A lane's first visitor, still polling, was dropped as abandoned when
/// its turn came: promotion deleted its poll record before reading it.
#[test]
fn finding_a_lane_visitor_who_polls_is_let_in_not_dropped() {
    finding("[Burst(8,),LaneArrive(0,),Lanes(0,),Limits{cap:0,rate:0,},LaneArrive(0,),LaneArrive(0,),Burst(1,),Advance(19961,),Poll(31065,),Advance(70040,),]");
}

/// The general queue's turn came with more visitors who had stopped
/// polling at its front than one turn sweeps: the turn went to a lane,
/// which was let in ahead of its share. The turn now waits for the next
/// call (found by CI's run of the suite, 2026-11-28).
#[test]
fn finding_a_long_run_of_gone_visitors_does_not_give_the_general_turn_away() {
    finding("[Burst(1,),Again(0,),Burst(4,),Lanes(2,),Burst(8,),Advance(40000,),Burst(1,),Poll(6873,),Burst(2,),LaneArrive(224,),Again(0,),LaneArrive(30,),Burst(4,),Release(6354,),Advance(50001,),LaneArrive(0,),Burst(1,),Burst(1,),]");
}
