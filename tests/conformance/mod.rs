//! The store conformance suite: the behaviour every `Store` backend must share,
//! written once and instantiated per backend with `store_conformance!`.
//!
//! ```ignore
//! mod conformance;
//! conformance::store_conformance!(|| async {
//!     conformance::Harness::new(std::sync::Arc::new(MemoryStore::new()))
//! });
//! ```
//!
//! Every case uses its own room id (so one Redis can serve all the cases of a
//! file) and explicit clock values it advances; nothing sleeps. Times are
//! realistic (2027) so `next_seq` behaves as in production.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use waitroom::clock::Millis;
use waitroom::store::{
    Arrival, End, EventSpec, EventStart, Lanes, QueuePlace, QueueingMethod, RejectReason,
    ReportMinute, Reports, RoomOverrides, RoomPolicy, RoomState, RoomStats, RoomTotals, Settings,
    SharedStore, Verdict, VisitorId,
};

/// Drops a visitor's queue entry behind the store's back, as a store that
/// lost its data would (room id, visitor).
pub type Lose = Box<dyn Fn(&str, VisitorId) + Send + Sync>;

/// A backend under test, with whatever keeps it alive.
pub struct Harness {
    pub store: SharedStore,
    /// Dropped after the case ends, e.g. the handle of a `redis-server` child.
    #[allow(dead_code)] // held, never read: its `Drop` is the point
    pub guard: Option<Box<dyn std::any::Any + Send + Sync>>,
    /// The backend's way to lose an entry (I5 cases).
    pub lose: Lose,
}

impl Harness {
    pub fn new(store: SharedStore, lose: Lose) -> Self {
        Self {
            store,
            guard: None,
            lose,
        }
    }
}

/// Expands to one `#[tokio::test]` per conformance case, each building a fresh
/// `Harness` with the given `|| async { ... }` factory.
macro_rules! store_conformance {
    ($factory:expr) => {
        $crate::conformance::store_conformance!(@cases $factory;
            capacity_holds_under_concurrent_arrivals,
            forgotten_members_are_new_again,
            rate_limit_holds_under_concurrent_arrivals,
            rate_window_is_exact_at_its_edges,
            fifo_has_no_inversions_in_a_random_run,
            no_queueing_while_there_is_room,
            abandoned_visitors_are_dropped_and_the_queue_moves,
            lost_entries_come_back_at_their_place,
            reset_voids_every_queue_ticket,
            released_queue_places_stay_ended,
            an_ended_session_does_not_come_back_through_its_queue_ticket,
            a_queue_place_that_became_a_session_is_used_up,
            session_renewal_on_extends,
            session_renewal_off_keeps_expiry,
            check_in_of_unknown_released_or_expired_is_none,
            lost_sessions_come_back_at_check_in_but_ended_ones_do_not,
            newcomers_never_jump_the_queue,
            max_queue_length_rejects_when_full,
            passthrough_counts_and_never_refuses,
            reject_method_refuses_over_the_limits,
            paused_room_queues_and_keeps_order,
            states_hold_rooms_without_a_queue_too,
            queue_all_room_queues_then_promotes,
            closed_room_rejects_arrivals_and_queued_visitors,
            closed_room_keeps_sessions,
            random_method_admits_only_within_limits,
            stats_and_totals_report_exact_figures,
            arrive_and_poll_are_idempotent,
            overrides_round_trip_per_room_and_survive_reset,
            an_event_start_shuffles_the_prequeue_once,
            an_event_shuffle_ages_nobody,
            noted_sets_count_distinct_members_until_they_lapse,
            a_long_queue_keeps_its_order_past_its_head,
            visitors_who_leave_far_back_are_never_admitted,
            newcomers_admitted_together_are_sessions_one_by_one,
            lanes_share_admissions_and_keep_fifo_within,
            a_lane_arrival_moves_nobody_back,
            a_visitor_waits_in_one_lane_only,
            lane_places_are_released_reset_and_put_back,
            a_lane_nobody_waits_in_saves_no_turns,
            a_lane_with_all_the_share_goes_first,
            a_presale_window_lets_only_the_lanes_in,
            an_unseen_member_is_found_by_id_when_it_comes_again,
            report_minutes_add_up_keep_peaks_and_lapse,
            reports_match_the_model_on_generated_sequences,
        );
    };
    (@cases $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let harness: $crate::conformance::Harness = ($factory)().await;
                $crate::conformance::$case(&harness).await;
            }
        )*
    };
}
pub(crate) use store_conformance;

/// 2027-01-15T08:00:00Z.
const T0: Millis = 1_800_000_000_000;
const SECOND: Millis = 1_000;
const MINUTE: Millis = 60 * SECOND;
const SESSION: Millis = 5 * MINUTE;
const GRACE: Millis = 40 * SECOND;
const ABANDON: Millis = 2 * MINUTE;

/// A room with a unique id (so cases can share one Redis) and defaults an
/// operator might pick; cases change what they test.
fn room(case: &str) -> RoomPolicy {
    let id = format!("conf-{case}-{:08x}", rand::random::<u32>());
    RoomPolicy {
        room: Arc::from(id.as_str()),
        total_active_users: 10,
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

fn visitors(n: usize) -> Vec<VisitorId> {
    (0..n).map(|_| VisitorId::random()).collect()
}

#[track_caller]
fn admitted(v: Verdict) -> Millis {
    match v {
        Verdict::Admitted { session_expires_ms } => session_expires_ms,
        other => panic!("expected Admitted, got {other:?}"),
    }
}

#[track_caller]
fn queued(v: Verdict) -> QueuePlace {
    match v {
        Verdict::Queued(place) => place,
        other => panic!("expected Queued, got {other:?}"),
    }
}

/// Thin call helpers so cases read as scripts.
struct Room<'a> {
    h: &'a Harness,
    p: RoomPolicy,
}

impl Room<'_> {
    async fn arrive(&self, v: VisitorId, now: Millis) -> Verdict {
        self.h
            .store
            .arrive(&self.p, v, 0, Arrival::Known, now)
            .await
            .unwrap()
    }
    async fn poll(&self, v: VisitorId, seq: u64, now: Millis) -> Verdict {
        self.h.store.poll(&self.p, v, 0, seq, now).await.unwrap()
    }
    async fn arrive_in(&self, v: VisitorId, lane: u8, now: Millis) -> Verdict {
        self.h
            .store
            .arrive(&self.p, v, lane, Arrival::Known, now)
            .await
            .unwrap()
    }
    async fn poll_in(&self, v: VisitorId, lane: u8, seq: u64, now: Millis) -> Verdict {
        self.h.store.poll(&self.p, v, lane, seq, now).await.unwrap()
    }
    /// Arrives `n` new visitors in `lane` at `now`, each queued at its back.
    async fn queue_in(&self, lane: u8, n: usize, now: Millis) -> Vec<(VisitorId, u64)> {
        let mut out = Vec::with_capacity(n);
        for v in visitors(n) {
            let place = queued(self.arrive_in(v, lane, now).await);
            assert_eq!(
                place.position, place.queue_length,
                "at the back of its lane"
            );
            out.push((v, place.seq));
        }
        out
    }
    /// A check-in whose ticket claims nothing beyond `now` (so a session
    /// the store does not know is not re-created).
    async fn check_in(&self, v: VisitorId, now: Millis) -> Option<Millis> {
        self.check_in_with(v, now, now).await
    }
    /// A check-in with a ticket that says the session lives until `ticket_expires`.
    async fn check_in_with(
        &self,
        v: VisitorId,
        ticket_expires: Millis,
        now: Millis,
    ) -> Option<Millis> {
        self.h
            .store
            .check_in(&self.p, v, ticket_expires, now)
            .await
            .unwrap()
    }
    async fn release(&self, v: VisitorId, now: Millis) -> bool {
        self.h
            .store
            .end(&self.p, v, End::Release, now)
            .await
            .unwrap()
    }
    /// A release by a visitor's ticket (the origin's revoke).
    async fn end_session(&self, v: VisitorId, ticket_expires: Millis, now: Millis) -> bool {
        self.h
            .store
            .end(&self.p, v, End::Session(ticket_expires), now)
            .await
            .unwrap()
    }
    async fn stats(&self, now: Millis) -> RoomStats {
        self.h.store.stats(&self.p, now).await.unwrap()
    }
    async fn totals(&self) -> RoomTotals {
        self.h.store.totals(&self.p).await.unwrap()
    }
    async fn reset(&self, now: Millis) {
        self.h.store.reset(&self.p, now).await.unwrap()
    }
    fn lose(&self, v: VisitorId) {
        (self.h.lose)(&self.p.room, v)
    }
    /// Arrives `n` new visitors at `now`; each must be queued, at the back.
    async fn queue_up(&self, n: usize, now: Millis) -> Vec<(VisitorId, u64)> {
        let mut out = Vec::with_capacity(n);
        for v in visitors(n) {
            let place = queued(self.arrive(v, now).await);
            assert_eq!(
                place.position, place.queue_length,
                "a newcomer goes to the back"
            );
            out.push((v, place.seq));
        }
        out
    }
}

fn bind(h: &Harness, p: RoomPolicy) -> Room<'_> {
    Room { h, p }
}

/// I1 with many callers: 10,000 arrivals from 100 tasks at once into a room
/// of 100: exactly 100 admitted, 9,900 queued at distinct positions 1..=9,900
/// in `seq` order, nobody lost; freed places go to the head of the queue.
pub async fn capacity_holds_under_concurrent_arrivals(h: &Harness) {
    let mut p = room("cap");
    p.total_active_users = 100;
    let tasks = 100;
    let per_task = 100;
    let mut joins = Vec::new();
    for t in 0..tasks {
        let store = h.store.clone();
        let p = p.clone();
        joins.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..per_task {
                let v = VisitorId::random();
                // Clocks read a little apart, as on a busy server.
                let now = T0 + ((t * per_task + i) % 7) as Millis;
                // Half come the daemon's way (an id just made, looked up by
                // nobody), mixed with the others in the same batches.
                let verdict = if t % 2 == 0 {
                    store.arrive(&p, v, 0, Arrival::New, now).await
                } else {
                    store.arrive(&p, v, 0, Arrival::Known, now).await
                };
                out.push((v, verdict.unwrap()));
            }
            out
        }));
    }
    let mut admitted_ids = Vec::new();
    let mut places = Vec::new();
    for j in joins {
        for (v, verdict) in j.await.unwrap() {
            match verdict {
                Verdict::Admitted { .. } => admitted_ids.push(v),
                Verdict::Queued(place) => places.push((v, place)),
                other => panic!("nobody is rejected, got {other:?}"),
            }
        }
    }
    assert_eq!(admitted_ids.len(), 100);
    assert_eq!(places.len(), 9_900);
    let r = bind(h, p);
    let s = r.stats(T0 + 10).await;
    assert_eq!((s.active, s.queued), (100, 9_900));

    // Positions given at arrival are 1..=9,900, each once, and follow `seq`.
    let mut positions: Vec<u64> = places.iter().map(|(_, pl)| pl.position).collect();
    positions.sort_unstable();
    assert_eq!(positions, (1..=9_900).collect::<Vec<u64>>());
    places.sort_by_key(|(_, pl)| pl.seq);
    for (i, (_, pl)) in places.iter().enumerate() {
        assert_eq!(pl.position, i as u64 + 1, "position follows seq");
    }
    // Nobody lost: every queued visitor is still where it was.
    for (v, pl) in &places {
        let now = queued(r.poll(*v, pl.seq, T0 + 20).await);
        assert_eq!(
            (now.position, now.seq, now.queue_length),
            (pl.position, pl.seq, 9_900)
        );
    }
    // Freeing 100 places admits exactly the 100 at the head.
    for v in &admitted_ids {
        assert!(r.release(*v, T0 + 30).await);
    }
    let mut order: Vec<usize> = (0..places.len()).collect();
    order.shuffle(&mut StdRng::seed_from_u64(1));
    let mut newly = HashSet::new();
    for i in order {
        let (v, pl) = places[i];
        match r.poll(v, pl.seq, T0 + 40).await {
            Verdict::Admitted { .. } => {
                newly.insert(i);
            }
            Verdict::Queued(now) => assert_eq!(now.position, pl.position - 100),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(newly, (0..100).collect::<HashSet<usize>>());
    let t = r.totals().await;
    assert_eq!(
        (t.admitted, t.queued, t.rejected, t.abandoned),
        (200, 9_900, 0, 0)
    );
}

/// I2 with many callers: 2,000 concurrent arrivals into a room limited to 50
/// admissions a minute and unlimited capacity admit exactly 50.
pub async fn rate_limit_holds_under_concurrent_arrivals(h: &Harness) {
    let mut p = room("ratec");
    p.total_active_users = 0;
    p.new_users_per_minute = 50;
    let mut joins = Vec::new();
    for _ in 0..40 {
        let store = h.store.clone();
        let p = p.clone();
        joins.push(tokio::spawn(async move {
            let mut n = 0;
            for _ in 0..50 {
                let v = VisitorId::random();
                if let Verdict::Admitted { .. } =
                    store.arrive(&p, v, 0, Arrival::Known, T0).await.unwrap()
                {
                    n += 1;
                }
            }
            n
        }));
    }
    let mut total = 0;
    for j in joins {
        total += j.await.unwrap();
    }
    assert_eq!(total, 50);
    let s = bind(h, p).stats(T0).await;
    assert_eq!(
        (s.active, s.queued, s.admitted_last_minute),
        (50, 1_950, 50)
    );
}

/// I2 at its edges: N admissions in the window, the N+1th waits until the
/// first admission is exactly 60 s old, and is admitted then, not a
/// millisecond earlier.
pub async fn rate_window_is_exact_at_its_edges(h: &Harness) {
    let mut p = room("rate");
    p.total_active_users = 0;
    p.new_users_per_minute = 5;
    let r = bind(h, p);
    let first = visitors(5);
    for (i, v) in first.iter().enumerate() {
        let now = T0 + i as Millis * SECOND;
        assert_eq!(admitted(r.arrive(*v, now).await), now + SESSION);
    }
    let sixth = VisitorId::random();
    let place = queued(r.arrive(sixth, T0 + 5 * SECOND).await);
    assert_eq!(place.position, 1);

    // T0 is in (now - 60 s, now] until now = T0 + 60 s.
    let waiting = queued(r.poll(sixth, place.seq, T0 + MINUTE - 1).await);
    assert_eq!(waiting.position, 1);
    let s = r.stats(T0 + MINUTE - 1).await;
    assert_eq!(
        (s.admitted_last_minute, s.oldest_admission_ms),
        (5, Some(T0))
    );

    let at = T0 + MINUTE;
    assert_eq!(
        admitted(r.poll(sixth, place.seq, at).await),
        at + SESSION + GRACE
    );
    let s = r.stats(at).await;
    assert_eq!(
        (s.admitted_last_minute, s.oldest_admission_ms),
        (5, Some(T0 + SECOND))
    );

    // The window is full again: the next one waits for T0 + 1 s to leave.
    let seventh = VisitorId::random();
    let place = queued(r.arrive(seventh, at).await);
    assert_eq!(place.position, 1);
    queued(r.poll(seventh, place.seq, T0 + SECOND + MINUTE - 1).await);
    admitted(r.poll(seventh, place.seq, T0 + SECOND + MINUTE).await);
    let t = r.totals().await;
    assert_eq!((t.admitted, t.queued), (7, 2));
}

/// I3: a seeded random run of arrivals, polls in random order, session
/// expiries, releases and visitors who walk away. Whenever a visitor learns
/// it is admitted, every visitor who queued before it and still polls must
/// learn the same at that same instant (a poll at the same `now` cannot free
/// room, so a "still queued" answer is an inversion). Visitors poll at least
/// every refresh interval, so none lets a promotion's grace run out unseen.
pub async fn fifo_has_no_inversions_in_a_random_run(h: &Harness) {
    const REFRESH: Millis = 10 * SECOND;
    let mut p = room("fifo");
    p.total_active_users = 5;
    p.new_users_per_minute = 20;
    p.session_duration_ms = 15 * SECOND;
    // Twice the refresh interval, as the daemon configures it: a visitor who
    // polls every refresh interval always collects its admission.
    p.arrival_grace_ms = 2 * REFRESH;
    p.session_renewal = false;
    p.abandon_after_ms = MINUTE;
    let r = bind(h, p);
    let mut rng = StdRng::seed_from_u64(0x5eed);
    // Arrival order is `seq` order for everyone who queued.
    let mut people: BTreeMap<u64, (VisitorId, State)> = BTreeMap::new();
    let mut arrivals = 0u64;
    let mut now = T0;
    let mut admissions = 0;
    let mut max_queue = 0;

    for _ in 0..3_000 {
        now += rng.gen_range(0..1_500);
        // Everyone still interested polls at least every refresh interval.
        let stale: Vec<u64> = people
            .iter()
            .filter_map(|(k, (_, s))| match s {
                State::Waiting { last_poll, .. } if now - last_poll >= REFRESH => Some(*k),
                _ => None,
            })
            .collect();
        let mut to_poll = stale;
        match rng.gen_range(0..20) {
            0..=4 => {
                let v = VisitorId::random();
                arrivals += 1;
                let state = match r.arrive(v, now).await {
                    Verdict::Admitted { .. } => State::Admitted,
                    Verdict::Queued(pl) => State::Waiting {
                        seq: pl.seq,
                        last_poll: now,
                    },
                    other => panic!("unexpected {other:?}"),
                };
                people.insert(arrivals, (v, state));
                if state == State::Admitted {
                    admissions += 1;
                    check_no_one_earlier_waits(&r, &mut people, arrivals, now).await;
                }
            }
            5..=15 => {
                let waiting: Vec<u64> = people
                    .iter()
                    .filter(|(_, (_, s))| matches!(s, State::Waiting { .. }))
                    .map(|(k, _)| *k)
                    .collect();
                if let Some(k) = waiting.choose(&mut rng) {
                    to_poll.push(*k);
                }
            }
            16..=18 => {
                let admitted_now: Vec<u64> = people
                    .iter()
                    .filter(|(_, (_, s))| *s == State::Admitted)
                    .map(|(k, _)| *k)
                    .collect();
                if let Some(k) = admitted_now.choose(&mut rng) {
                    let (v, _) = people[k];
                    r.release(v, now).await;
                    people.insert(*k, (v, State::Left));
                }
            }
            _ => {
                // Somebody gives up waiting: stops polling for good.
                let waiting: Vec<u64> = people
                    .iter()
                    .filter(|(_, (_, s))| matches!(s, State::Waiting { .. }))
                    .map(|(k, _)| *k)
                    .collect();
                if let Some(k) = waiting.choose(&mut rng) {
                    let (v, _) = people[k];
                    people.insert(*k, (v, State::Left));
                }
            }
        }
        to_poll.shuffle(&mut rng);
        for k in to_poll {
            let (v, state) = people[&k];
            let State::Waiting { seq, .. } = state else {
                continue;
            };
            match r.poll(v, seq, now).await {
                Verdict::Admitted { .. } => {
                    people.insert(k, (v, State::Admitted));
                    admissions += 1;
                    check_no_one_earlier_waits(&r, &mut people, k, now).await;
                }
                Verdict::Queued(_) => {
                    people.insert(
                        k,
                        (
                            v,
                            State::Waiting {
                                seq,
                                last_poll: now,
                            },
                        ),
                    );
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        let s = r.stats(now).await;
        assert!(s.active <= 5, "I1: {} active", s.active);
        assert!(
            s.admitted_last_minute <= 20,
            "I2: {}",
            s.admitted_last_minute
        );
        max_queue = max_queue.max(s.queued);
    }
    // The run must have exercised both paths a lot to mean anything.
    let abandoned = r.totals().await.abandoned;
    let all = r.totals().await.admitted;
    eprintln!(
        "fifo run: {admissions} admissions seen of {all}, {abandoned} abandoned, longest queue {max_queue}"
    );
    assert!(admissions > 200, "only {admissions} admissions");
    assert!(abandoned > 20, "only {abandoned} abandoned");
    assert!(max_queue > 10, "the queue never grew ({max_queue})");
}

/// A visitor in the FIFO run, as the visitor sees it.
#[derive(Clone, Copy, PartialEq)]
enum State {
    Waiting {
        seq: u64,
        last_poll: Millis,
    },
    Admitted,
    /// Released its session or stopped polling; never polls again.
    Left,
}

/// Every visitor who arrived before `k` and is still waiting must be admitted
/// when polled at the same `now`.
async fn check_no_one_earlier_waits(
    r: &Room<'_>,
    people: &mut BTreeMap<u64, (VisitorId, State)>,
    k: u64,
    now: Millis,
) {
    let earlier: Vec<u64> = people.range(..k).map(|(k, _)| *k).collect();
    for e in earlier {
        let (v, s) = people[&e];
        if let State::Waiting { seq, .. } = s {
            match r.poll(v, seq, now).await {
                Verdict::Admitted { .. } => {
                    people.insert(e, (v, State::Admitted));
                }
                other => panic!("FIFO inversion: #{k} admitted while earlier #{e} gets {other:?}"),
            }
        }
    }
}

/// I4: an empty queue and room means admitted at once; a queued visitor whose
/// position is within the free capacity is admitted on its next poll.
pub async fn no_queueing_while_there_is_room(h: &Harness) {
    let mut p = room("room");
    p.total_active_users = 3;
    let r = bind(h, p);
    let front = visitors(3);
    for v in &front {
        assert_eq!(admitted(r.arrive(*v, T0).await), T0 + SESSION);
    }
    let q = r.queue_up(3, T0 + SECOND).await;
    assert!(r.release(front[0], T0 + 2 * SECOND).await);
    assert!(r.release(front[1], T0 + 2 * SECOND).await);
    // Two places free: positions 1 and 2 get them on their next poll.
    let at = T0 + 3 * SECOND;
    admitted(r.poll(q[1].0, q[1].1, at).await);
    admitted(r.poll(q[0].0, q[0].1, at).await);
    assert_eq!(queued(r.poll(q[2].0, q[2].1, at).await).position, 1);
    // Room again and an empty queue: a newcomer walks in.
    assert!(r.release(q[2].0, at).await);
    assert!(r.release(front[2], at).await);
    assert_eq!(
        admitted(r.arrive(VisitorId::random(), at).await),
        at + SESSION
    );
    let s = r.stats(at).await;
    assert_eq!((s.active, s.queued), (3, 0));
}

/// Abandonment: an entry not polled for more than `abandon_after` is dropped
/// (not at exactly `abandon_after`), counted, and those behind move up.
pub async fn abandoned_visitors_are_dropped_and_the_queue_moves(h: &Harness) {
    let mut p = room("abandon");
    p.total_active_users = 1;
    let r = bind(h, p);
    let holder = VisitorId::random();
    admitted(r.arrive(holder, T0).await);
    let q = r.queue_up(3, T0).await;
    // The quitter is in the middle: those around it keep polling.
    let (keen, quitter, late) = (q[0], q[1], q[2]);
    for t in [T0 + 50 * SECOND, T0 + 100 * SECOND] {
        assert_eq!(queued(r.poll(keen.0, keen.1, t).await).position, 1);
        assert_eq!(queued(r.poll(late.0, late.1, t).await).position, 3);
    }
    // The quitter last polled (joined) at T0.
    assert_eq!(r.stats(T0 + ABANDON).await.queued, 3);
    assert_eq!(r.totals().await.abandoned, 0);
    let s = r.stats(T0 + ABANDON + 1).await;
    assert_eq!(s.queued, 2);
    assert_eq!(r.totals().await.abandoned, 1);
    let at = T0 + ABANDON + SECOND;
    let place = queued(r.poll(keen.0, keen.1, at).await);
    assert_eq!((place.position, place.queue_length), (1, 2));
    assert_eq!(queued(r.poll(late.0, late.1, at).await).position, 2);
    assert!(!r.release(quitter.0, at).await, "the quitter is gone");
    // The queue keeps moving.
    assert!(r.release(holder, at).await);
    admitted(r.poll(keen.0, keen.1, at).await);
    assert_eq!(queued(r.poll(late.0, late.1, at).await).position, 1);
}

/// I5: entries the store lost come back at their `seq` when their visitors
/// poll, ahead of everyone who queued after them.
pub async fn lost_entries_come_back_at_their_place(h: &Harness) {
    let mut p = room("lost");
    p.total_active_users = 1;
    let r = bind(h, p);
    let holder = VisitorId::random();
    admitted(r.arrive(holder, T0).await);
    let q = r.queue_up(4, T0 + SECOND).await;
    // Lose the 2nd and 3rd entries.
    r.lose(q[1].0);
    r.lose(q[2].0);
    let newcomer = VisitorId::random();
    let nc = queued(r.arrive(newcomer, T0 + 3 * SECOND).await);
    assert_eq!((nc.position, nc.queue_length), (3, 3));
    let at = T0 + 4 * SECOND;
    let back = queued(r.poll(q[2].0, q[2].1, at).await);
    assert_eq!((back.seq, back.position, back.queue_length), (q[2].1, 2, 4));
    let back = queued(r.poll(q[1].0, q[1].1, at).await);
    assert_eq!((back.seq, back.position, back.queue_length), (q[1].1, 2, 5));
    assert_eq!(queued(r.poll(newcomer, nc.seq, at).await).position, 5);
    // Admission follows the restored order.
    let mut order = vec![(holder, 0)];
    order.extend(q.iter().copied());
    order.push((newcomer, nc.seq));
    for w in order.windows(2) {
        assert!(r.release(w[0].0, at).await);
        admitted(r.poll(w[1].0, w[1].1, at).await);
    }
}

/// An operator's reset ends every place: tickets issued before it are void
/// (`Ended`), even for visitors who keep polling, while newcomers after it
/// queue from the front. Unlike a store that *lost* its entries (I5).
pub async fn reset_voids_every_queue_ticket(h: &Harness) {
    let mut p = room("reset");
    p.total_active_users = 1;
    let r = bind(h, p);
    admitted(r.arrive(VisitorId::random(), T0).await);
    let q = r.queue_up(3, T0).await;
    r.reset(T0 + SECOND).await;
    assert_eq!(r.stats(T0 + SECOND).await, RoomStats::default());

    // Polling with the old tickets gets nothing back, not even in an empty room.
    let at = T0 + 2 * SECOND;
    for (v, seq) in &q {
        assert_eq!(r.poll(*v, *seq, at).await, Verdict::Ended);
    }
    assert_eq!(r.stats(at).await, RoomStats::default());
    // Newcomers start the room afresh; their tickets live on.
    let first = VisitorId::random();
    admitted(r.arrive(first, at).await);
    let second = queued(r.arrive(VisitorId::random(), at).await);
    assert_eq!((second.position, second.queue_length), (1, 1));
    assert!(
        second.seq > q[2].1,
        "seqs after a reset order after every older ticket"
    );
    assert_eq!(r.poll(q[0].0, q[0].1, at).await, Verdict::Ended);
    assert_eq!(
        queued(r.poll(VisitorId::random(), second.seq + 1, at).await).position,
        2
    );
}

/// A queue place the operator released stays ended while its ticket could
/// still poll: the next poll does not put it back.
pub async fn released_queue_places_stay_ended(h: &Harness) {
    let mut p = room("released-place");
    p.total_active_users = 1;
    let r = bind(h, p);
    admitted(r.arrive(VisitorId::random(), T0).await);
    let q = r.queue_up(3, T0).await;
    assert!(r.release(q[1].0, T0 + SECOND).await);
    assert_eq!(
        r.poll(q[1].0, q[1].1, T0 + 2 * SECOND).await,
        Verdict::Ended
    );
    assert_eq!(r.poll(q[1].0, q[1].1, T0 + ABANDON).await, Verdict::Ended);
    assert_eq!(
        queued(r.poll(q[2].0, q[2].1, T0 + 2 * SECOND).await).position,
        2
    );
    assert_eq!(r.stats(T0 + 2 * SECOND).await.queued, 2);
    assert!(!r.release(q[1].0, T0 + 3 * SECOND).await, "released once");
}

/// A session the operator ended (released or revoked) does not come back
/// through the queue ticket its visitor held before it was admitted: that
/// ticket's place was used up by the admission, so it is not put back at
/// the head (where it would be admitted again at once).
pub async fn an_ended_session_does_not_come_back_through_its_queue_ticket(h: &Harness) {
    let mut p = room("ended-via-queue");
    p.total_active_users = 1;
    // A queue ticket outlives the session it led to.
    p.abandon_after_ms = 2 * SESSION;
    let r = bind(h, p);
    let holder = VisitorId::random();
    admitted(r.arrive(holder, T0).await);
    let q = r.queue_up(2, T0).await;
    assert!(r.release(holder, T0 + SECOND).await);
    let (v, seq) = q[0];
    admitted(r.poll(v, seq, T0 + SECOND).await);
    // Revoked; the visitor replays the queue ticket it kept.
    assert!(r.release(v, T0 + 2 * SECOND).await);
    assert_eq!(r.poll(v, seq, T0 + 3 * SECOND).await, Verdict::Ended);
    assert_eq!(
        r.poll(v, seq, T0 + SESSION - SECOND).await,
        Verdict::Ended,
        "still ended while the revoked session would have lasted"
    );
    assert_eq!(
        r.poll(v, seq, T0 + SESSION + GRACE + SECOND).await,
        Verdict::Ended,
        "and after, while the queue ticket could still poll"
    );
    // The place it freed went to the next in line, and nobody else holds one.
    admitted(r.poll(q[1].0, q[1].1, T0 + 3 * SECOND).await);
    let stats = r.stats(T0 + 3 * SECOND).await;
    assert_eq!((stats.active, stats.queued), (1, 0));
}

/// A queue place that became a session is used up: once the session is
/// over by expiry (no release, no revoke), replaying the queue ticket that
/// led to it makes its holder a newcomer, not the head of the queue again
/// (the replayer took every other admission before: `B B 3 B B 4`).
pub async fn a_queue_place_that_became_a_session_is_used_up(h: &Harness) {
    let mut p = room("used-place");
    p.total_active_users = 1;
    p.session_duration_ms = 10 * SECOND;
    p.arrival_grace_ms = 0;
    // A queue ticket outlives the short session it led to.
    p.abandon_after_ms = 2 * MINUTE;
    let r = bind(h, p);
    let holder = VisitorId::random();
    admitted(r.arrive(holder, T0).await);
    let q = r.queue_up(3, T0).await;
    let (b, b_seq) = q[0];
    // The holder's session runs out; the first in line is admitted.
    let t1 = T0 + 11 * SECOND;
    let b_expires = admitted(r.poll(b, b_seq, t1).await);
    // While the session lives, its queue ticket says so.
    assert_eq!(
        r.poll(b, b_seq, t1 + SECOND).await,
        Verdict::Admitted {
            session_expires_ms: b_expires
        }
    );
    // The session expires unused; the next in line polls a little late.
    let t2 = b_expires + SECOND;
    assert_eq!(r.poll(b, b_seq, t2).await, Verdict::Ended, "used up");
    admitted(r.poll(q[1].0, q[1].1, t2).await);
    assert_eq!(r.poll(b, b_seq, t2 + SECOND).await, Verdict::Ended);
    let place = queued(r.poll(q[2].0, q[2].1, t2 + SECOND).await);
    assert_eq!(place.position, 1, "nobody got ahead of the one who waited");
    // As long as the ticket could poll, and it lapses before the mark.
    assert_eq!(
        r.poll(b, b_seq, t1 + 2 * MINUTE - SECOND).await,
        Verdict::Ended
    );
}

/// Renewal on: a check-in extends to `now + session_duration`, never
/// shortens (a promoted visitor keeps its grace), and an expired session is
/// gone at exactly its expiry.
pub async fn session_renewal_on_extends(h: &Harness) {
    let mut p = room("renew");
    p.total_active_users = 1;
    let r = bind(h, p);
    let v = VisitorId::random();
    assert_eq!(admitted(r.arrive(v, T0).await), T0 + SESSION);
    assert_eq!(
        r.check_in(v, T0 + MINUTE).await,
        Some(T0 + MINUTE + SESSION)
    );
    let last = T0 + MINUTE + SESSION - 1;
    assert_eq!(r.check_in(v, last).await, Some(last + SESSION));
    assert_eq!(r.check_in(v, last + SESSION).await, None);

    // A promoted visitor's grace survives an early check-in.
    let holder = VisitorId::random();
    let t1 = T0 + 20 * MINUTE;
    admitted(r.arrive(holder, t1).await);
    let q = r.queue_up(1, t1).await;
    assert!(r.release(holder, t1 + SECOND).await);
    let expires = admitted(r.poll(q[0].0, q[0].1, t1 + SECOND).await);
    assert_eq!(expires, t1 + SECOND + SESSION + GRACE);
    assert_eq!(r.check_in(q[0].0, t1 + 2 * SECOND).await, Some(expires));
    let later = t1 + 2 * MINUTE;
    assert_eq!(r.check_in(q[0].0, later).await, Some(later + SESSION));
}

/// Renewal off: a check-in confirms the session but its expiry is fixed at
/// admission; once expired, the place is free for someone else.
pub async fn session_renewal_off_keeps_expiry(h: &Harness) {
    let mut p = room("fixed");
    p.total_active_users = 1;
    p.session_renewal = false;
    let r = bind(h, p);
    let v = VisitorId::random();
    assert_eq!(admitted(r.arrive(v, T0).await), T0 + SESSION);
    assert_eq!(r.check_in(v, T0 + MINUTE).await, Some(T0 + SESSION));
    assert_eq!(r.check_in(v, T0 + SESSION - 1).await, Some(T0 + SESSION));
    let w = VisitorId::random();
    let place = queued(r.arrive(w, T0 + SESSION - 1).await);
    assert_eq!(r.check_in(v, T0 + SESSION).await, None);
    // The freed place went to the waiting visitor.
    assert_eq!(
        admitted(r.poll(w, place.seq, T0 + SESSION).await),
        T0 + SESSION + SESSION + GRACE
    );
}

pub async fn check_in_of_unknown_released_or_expired_is_none(h: &Harness) {
    let mut p = room("checkin");
    p.total_active_users = 2;
    let r = bind(h, p);
    assert_eq!(r.check_in(VisitorId::random(), T0).await, None);
    let released = VisitorId::random();
    admitted(r.arrive(released, T0).await);
    assert!(r.release(released, T0).await);
    assert!(!r.release(released, T0).await, "released twice");
    assert_eq!(r.check_in(released, T0 + 1).await, None);
    let expired = VisitorId::random();
    admitted(r.arrive(expired, T0).await);
    assert_eq!(r.check_in(expired, T0 + SESSION).await, None);
    // A queued visitor has no session to check in.
    admitted(r.arrive(VisitorId::random(), T0 + SESSION).await);
    admitted(r.arrive(VisitorId::random(), T0 + SESSION).await);
    let waiting = VisitorId::random();
    queued(r.arrive(waiting, T0 + SESSION).await);
    assert_eq!(r.check_in(waiting, T0 + SESSION).await, None);
}

/// I5 for admitted visitors: a live ticket whose session the store lost is
/// counted again at check-in; a session that was ended (release, revoke,
/// reset) or has expired stays ended.
pub async fn lost_sessions_come_back_at_check_in_but_ended_ones_do_not(h: &Harness) {
    let mut p = room("lost-sessions");
    p.total_active_users = 5;
    let r = bind(h, p.clone());
    let lost = VisitorId::random();
    let ticket = T0 + SESSION / 2;
    // Renewal on: the re-created session slides from now.
    assert_eq!(r.check_in_with(lost, ticket, T0).await, Some(T0 + SESSION));
    assert_eq!(r.stats(T0).await.active, 1, "counted again");
    assert_eq!(
        r.check_in_with(lost, ticket, T0 + 1).await,
        Some(T0 + 1 + SESSION)
    );

    let released = VisitorId::random();
    admitted(r.arrive(released, T0).await);
    assert!(r.release(released, T0 + 1).await);
    assert_eq!(r.check_in_with(released, T0 + SESSION, T0 + 2).await, None);

    // The origin revokes a live ticket whose session the store does not
    // hold (lost): ended all the same, its ticket cannot re-create it.
    let revoked = VisitorId::random();
    assert!(!r.end_session(revoked, T0 + SESSION, T0 + 1).await);
    assert_eq!(r.check_in_with(revoked, T0 + SESSION, T0 + 2).await, None);

    let reset = VisitorId::random();
    admitted(r.arrive(reset, T0).await);
    h.store.reset(&p, T0 + 1).await.unwrap();
    assert_eq!(r.check_in_with(reset, T0 + SESSION, T0 + 2).await, None);
    assert_eq!(
        r.check_in_with(lost, T0 + SESSION, T0 + 2).await,
        None,
        "reset ends every session"
    );
    assert_eq!(r.stats(T0 + 2).await.active, 0);

    // An expired ticket never re-creates anything.
    assert_eq!(
        r.check_in_with(VisitorId::random(), T0 + 2, T0 + 2).await,
        None
    );

    // Renewal off: the re-created session keeps the ticket's expiry.
    let mut fixed = room("lost-sessions-fixed");
    fixed.session_renewal = false;
    let r = bind(h, fixed);
    let v = VisitorId::random();
    assert_eq!(r.check_in_with(v, T0 + 1000, T0).await, Some(T0 + 1000));
    assert_eq!(r.stats(T0).await.active, 1);
    assert_eq!(r.stats(T0 + 1000).await.active, 0);
}

/// I3 for newcomers: while anyone waits, a newcomer goes to the back, even
/// the instant a place frees up before the head has polled.
pub async fn newcomers_never_jump_the_queue(h: &Harness) {
    let mut p = room("nojump");
    p.total_active_users = 2;
    let r = bind(h, p.clone());
    let front = visitors(2);
    for v in &front {
        admitted(r.arrive(*v, T0).await);
    }
    let q = r.queue_up(2, T0).await;
    assert!(r.release(front[0], T0 + SECOND).await);
    // The head took the freed place, so the newcomer queues behind the rest.
    let nc = queued(r.arrive(VisitorId::random(), T0 + SECOND).await);
    assert_eq!((nc.position, nc.queue_length), (2, 2));
    admitted(r.poll(q[0].0, q[0].1, T0 + SECOND).await);

    // Same with the rate limit as the binding constraint.
    let mut p = room("nojump-rate");
    p.total_active_users = 0;
    p.new_users_per_minute = 2;
    let r = bind(h, p);
    admitted(r.arrive(VisitorId::random(), T0).await);
    admitted(r.arrive(VisitorId::random(), T0 + SECOND).await);
    let q = r.queue_up(2, T0 + 2 * SECOND).await;
    let nc = queued(r.arrive(VisitorId::random(), T0 + MINUTE).await);
    assert_eq!((nc.position, nc.queue_length), (2, 2));
    admitted(r.poll(q[0].0, q[0].1, T0 + MINUTE).await);
    assert_eq!(
        queued(r.poll(q[1].0, q[1].1, T0 + MINUTE).await).position,
        1
    );
}

pub async fn max_queue_length_rejects_when_full(h: &Harness) {
    let mut p = room("maxq");
    p.total_active_users = 1;
    p.max_queue_length = 2;
    let r = bind(h, p);
    admitted(r.arrive(VisitorId::random(), T0).await);
    let q = r.queue_up(2, T0).await;
    assert_eq!(
        r.arrive(VisitorId::random(), T0).await,
        Verdict::Rejected(RejectReason::QueueFull)
    );
    // A place in the queue frees: the next newcomer gets it.
    assert!(r.release(q[0].0, T0 + SECOND).await);
    let place = queued(r.arrive(VisitorId::random(), T0 + SECOND).await);
    assert_eq!((place.position, place.queue_length), (2, 2));
    let t = r.totals().await;
    assert_eq!((t.admitted, t.queued, t.rejected), (1, 3, 1));
}

pub async fn passthrough_counts_and_never_refuses(h: &Harness) {
    let mut p = room("pass");
    p.total_active_users = 2;
    p.new_users_per_minute = 3;
    p.method = QueueingMethod::Passthrough;
    let r = bind(h, p);
    let vs = visitors(10);
    for (i, v) in vs.iter().enumerate() {
        let now = T0 + i as Millis;
        assert_eq!(admitted(r.arrive(*v, now).await), now + SESSION);
    }
    let s = r.stats(T0 + SECOND).await;
    assert_eq!((s.active, s.queued, s.admitted_last_minute), (10, 0, 10));
    assert_eq!(s.oldest_admission_ms, Some(T0));
    let t = r.totals().await;
    assert_eq!((t.admitted, t.queued, t.rejected), (10, 0, 0));
    assert_eq!(
        r.check_in(vs[9], T0 + MINUTE).await,
        Some(T0 + MINUTE + SESSION)
    );
}

pub async fn reject_method_refuses_over_the_limits(h: &Harness) {
    let mut p = room("reject");
    p.total_active_users = 2;
    p.method = QueueingMethod::Reject;
    let r = bind(h, p);
    let front = visitors(2);
    for v in &front {
        assert_eq!(admitted(r.arrive(*v, T0).await), T0 + SESSION);
    }
    let over = Verdict::Rejected(RejectReason::OverLimit);
    assert_eq!(r.arrive(VisitorId::random(), T0).await, over);
    assert!(r.release(front[0], T0 + SECOND).await);
    admitted(r.arrive(VisitorId::random(), T0 + SECOND).await);
    assert_eq!(r.arrive(VisitorId::random(), T0 + SECOND).await, over);

    // The rate limit refuses too.
    let mut p = room("reject-rate");
    p.total_active_users = 0;
    p.new_users_per_minute = 1;
    p.method = QueueingMethod::Reject;
    let r2 = bind(h, p);
    admitted(r2.arrive(VisitorId::random(), T0).await);
    assert_eq!(r2.arrive(VisitorId::random(), T0 + MINUTE - 1).await, over);
    admitted(r2.arrive(VisitorId::random(), T0 + MINUTE).await);

    let t = r.totals().await;
    assert_eq!((t.admitted, t.queued, t.rejected), (3, 0, 2));
    let s = r.stats(T0 + SECOND).await;
    assert_eq!((s.active, s.queued), (2, 0));
}

/// `paused`: nobody is admitted even with room; the queue keeps its order and
/// is admitted in it once the room opens.
pub async fn paused_room_queues_and_keeps_order(h: &Harness) {
    let mut p = room("paused");
    p.total_active_users = 2;
    p.state = RoomState::Paused;
    let r = bind(h, p.clone());
    let q = r.queue_up(3, T0).await;
    assert_eq!(
        queued(r.poll(q[0].0, q[0].1, T0 + SECOND).await).position,
        1
    );
    let s = r.stats(T0 + SECOND).await;
    assert_eq!((s.active, s.queued), (0, 3));
    p.state = RoomState::Open;
    let r = bind(h, p);
    let at = T0 + 2 * SECOND;
    assert_eq!(queued(r.poll(q[2].0, q[2].1, at).await).position, 1);
    admitted(r.poll(q[0].0, q[0].1, at).await);
    admitted(r.poll(q[1].0, q[1].1, at).await);
}

/// Room states hold `passthrough` and `reject` rooms too, though those
/// methods keep no queue of their own: newcomers wait in line. `paused`
/// admits nobody until the room opens; in `queue_all` (and once open) the line
/// is let in as the method allows: passthrough all at once, reject within the
/// limits.
pub async fn states_hold_rooms_without_a_queue_too(h: &Harness) {
    for method in [QueueingMethod::Passthrough, QueueingMethod::Reject] {
        for state in [RoomState::Paused, RoomState::QueueAll] {
            let case = format!("{method:?} {state:?}");
            let mut p = room(&case.replace(' ', "-").to_lowercase());
            p.total_active_users = 2;
            p.method = method;
            p.state = state;
            let r = bind(h, p.clone());
            let q = r.queue_up(3, T0).await;
            if state == RoomState::Paused {
                for (v, seq) in &q {
                    let place = queued(r.poll(*v, *seq, T0 + SECOND).await);
                    assert_eq!(place.queue_length, 3, "{case}");
                }
                let s = r.stats(T0 + SECOND).await;
                assert_eq!((s.active, s.queued), (0, 3), "{case}");
                p.state = RoomState::Open;
            }
            let r = bind(h, p);
            let at = T0 + 2 * SECOND;
            admitted(r.poll(q[0].0, q[0].1, at).await);
            admitted(r.poll(q[1].0, q[1].1, at).await);
            if method == QueueingMethod::Passthrough {
                admitted(r.poll(q[2].0, q[2].1, at).await);
            } else {
                let place = queued(r.poll(q[2].0, q[2].1, at).await);
                assert_eq!((place.position, place.queue_length), (1, 1), "{case}");
            }
        }
    }
}

/// `queue_all`: every newcomer queues even with room, and promotion admits
/// them (in order) on a later operation.
pub async fn queue_all_room_queues_then_promotes(h: &Harness) {
    let mut p = room("qall");
    p.total_active_users = 2;
    p.state = RoomState::QueueAll;
    let r = bind(h, p);
    let q = r.queue_up(3, T0).await;
    // Each arrival's promotion admitted the ones queued before it.
    let at = T0 + SECOND;
    assert_eq!(
        admitted(r.poll(q[1].0, q[1].1, at).await),
        T0 + SESSION + GRACE
    );
    admitted(r.poll(q[0].0, q[0].1, at).await);
    let place = queued(r.poll(q[2].0, q[2].1, at).await);
    assert_eq!((place.position, place.queue_length), (1, 1));
    let t = r.totals().await;
    assert_eq!((t.admitted, t.queued), (2, 3));
}

/// `closed`: no new tickets, queued visitors are told, active sessions live on.
pub async fn closed_room_rejects_arrivals_and_queued_visitors(h: &Harness) {
    let mut p = room("closed");
    p.total_active_users = 1;
    let r = bind(h, p.clone());
    let holder = VisitorId::random();
    admitted(r.arrive(holder, T0).await);
    let q = r.queue_up(1, T0).await;
    p.state = RoomState::Closed;
    let r = bind(h, p);
    let closed = Verdict::Rejected(RejectReason::Closed);
    assert_eq!(r.arrive(VisitorId::random(), T0 + SECOND).await, closed);
    assert_eq!(r.poll(q[0].0, q[0].1, T0 + SECOND).await, closed);
    // Nobody is promoted in a closed room, even with room.
    assert!(r.release(holder, T0 + 2 * SECOND).await);
    assert_eq!(r.poll(q[0].0, q[0].1, T0 + 3 * SECOND).await, closed);
    assert_eq!(r.stats(T0 + 3 * SECOND).await.active, 0);
    assert_eq!(r.totals().await.admitted, 1);
    assert_eq!(r.totals().await.rejected, 1);
}

pub async fn closed_room_keeps_sessions(h: &Harness) {
    let mut p = room("closed-s");
    let r = bind(h, p.clone());
    let v = VisitorId::random();
    admitted(r.arrive(v, T0).await);
    p.state = RoomState::Closed;
    let r = bind(h, p);
    assert_eq!(
        r.check_in(v, T0 + MINUTE).await,
        Some(T0 + MINUTE + SESSION)
    );
}

/// `random`: admissions stay within both limits and come from anywhere in
/// the queue (a lottery, not the head every time).
pub async fn random_method_admits_only_within_limits(h: &Harness) {
    let mut p = room("random");
    p.total_active_users = 3;
    p.method = QueueingMethod::Random;
    let r = bind(h, p);
    let mut holders = visitors(3);
    for v in &holders {
        admitted(r.arrive(*v, T0).await);
    }
    let mut q = r.queue_up(20, T0).await;
    let mut now = T0;
    let mut head_only = true;
    for _round in 0..5 {
        now += SECOND;
        for v in holders.drain(..2) {
            assert!(r.release(v, now).await);
        }
        let s = r.stats(now).await;
        assert_eq!((s.active, s.queued), (3, q.len() as u64 - 2));
        let mut still = Vec::new();
        let mut positions = Vec::new();
        for (i, (v, seq)) in q.iter().enumerate() {
            match r.poll(*v, *seq, now).await {
                Verdict::Admitted { .. } => {
                    holders.push(*v);
                    if i > 1 {
                        head_only = false;
                    }
                }
                Verdict::Queued(pl) => {
                    positions.push(pl.position);
                    still.push((*v, *seq));
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(
            still.len(),
            q.len() - 2,
            "exactly the two free places were filled"
        );
        positions.sort_unstable();
        assert_eq!(positions, (1..=still.len() as u64).collect::<Vec<_>>());
        q = still;
    }
    // Five draws of 2 from 20..12 all landing on the head: odds below 1e-9.
    assert!(!head_only, "random admitted the head every time");

    // The rate limit binds a random room too.
    let mut p = room("random-rate");
    p.total_active_users = 0;
    p.new_users_per_minute = 4;
    p.method = QueueingMethod::Random;
    let r = bind(h, p);
    let mut admitted_n = 0;
    for v in visitors(10) {
        if let Verdict::Admitted { .. } = r.arrive(v, T0).await {
            admitted_n += 1;
        }
    }
    assert_eq!(admitted_n, 4);
    let s = r.stats(T0 + MINUTE).await;
    assert_eq!((s.active, s.queued, s.admitted_last_minute), (8, 2, 4));
}

pub async fn stats_and_totals_report_exact_figures(h: &Harness) {
    let mut p = room("stats");
    p.total_active_users = 2;
    p.new_users_per_minute = 3;
    let r = bind(h, p);
    assert_eq!(r.totals().await, RoomTotals::default());
    let a = VisitorId::random();
    admitted(r.arrive(a, T0).await);
    admitted(r.arrive(VisitorId::random(), T0 + SECOND).await);
    r.queue_up(2, T0 + SECOND).await;
    assert!(r.release(a, T0 + 2 * SECOND).await);
    // Stats promote too: the head took the freed place.
    let s = r.stats(T0 + 2 * SECOND).await;
    assert_eq!(
        s,
        RoomStats {
            active: 2,
            queued: 1,
            admitted_last_minute: 3,
            oldest_admission_ms: Some(T0),
            lane_queued: [0; 4],
        }
    );
    let s = r.stats(T0 + MINUTE).await;
    assert_eq!(
        (
            s.active,
            s.queued,
            s.admitted_last_minute,
            s.oldest_admission_ms
        ),
        (2, 1, 2, Some(T0 + SECOND))
    );
    assert_eq!(
        r.totals().await,
        RoomTotals {
            admitted: 3,
            queued: 2,
            rejected: 0,
            abandoned: 0,
        }
    );
    // Everything left over is abandoned or expires.
    let end = T0 + 2 * SECOND + SESSION + GRACE;
    let s = r.stats(end).await;
    assert_eq!((s.active, s.queued, s.admitted_last_minute), (0, 0, 0));
    assert_eq!(s.oldest_admission_ms, None);
    assert_eq!(r.totals().await.abandoned, 1);
    r.reset(end).await;
    assert_eq!(r.totals().await, RoomTotals::default());
    assert_eq!(r.stats(end).await, RoomStats::default());
}

/// A visitor arriving twice, or polling with a stale `seq`, keeps what it has.
pub async fn arrive_and_poll_are_idempotent(h: &Harness) {
    let mut p = room("idem");
    p.total_active_users = 1;
    let r = bind(h, p);
    let a = VisitorId::random();
    assert_eq!(admitted(r.arrive(a, T0).await), T0 + SESSION);
    assert_eq!(admitted(r.arrive(a, T0 + SECOND).await), T0 + SESSION);
    assert_eq!(admitted(r.poll(a, 1, T0 + SECOND).await), T0 + SESSION);
    let b = VisitorId::random();
    let first = queued(r.arrive(b, T0).await);
    let again = queued(r.arrive(b, T0 + SECOND).await);
    assert_eq!(
        (again.seq, again.position, again.queue_length),
        (first.seq, 1, 1)
    );
    // The store's entry wins over whatever the ticket says.
    let polled = queued(r.poll(b, first.seq + 999, T0 + SECOND).await);
    assert_eq!((polled.seq, polled.position), (first.seq, 1));
    let t = r.totals().await;
    assert_eq!((t.admitted, t.queued), (1, 1));
}

/// An operator's runtime changes: stored per room, replaced whole, cleared
/// with `None`, and kept across a `reset` of the room's state.
pub async fn overrides_round_trip_per_room_and_survive_reset(h: &Harness) {
    let p = room("overrides");
    let other = room("overrides");
    let r = bind(h, p.clone());
    let store = &h.store;
    assert_eq!(store.overrides(&p.room).await.unwrap(), None);
    let first = RoomOverrides {
        settings: Settings {
            total_active_users: Some(7),
            ..Settings::default()
        },
        state: Some(RoomState::Paused),
        config_fingerprint: 0xfeed_beef_dead_cafe,
        ..RoomOverrides::default()
    };
    store.set_overrides(&p.room, Some(&first)).await.unwrap();
    assert_eq!(store.overrides(&p.room).await.unwrap(), Some(first.clone()));
    assert_eq!(store.overrides(&other.room).await.unwrap(), None);

    // Replaced whole, not merged.
    let second = RoomOverrides {
        settings: Settings {
            new_users_per_minute: Some(120),
            session_duration_ms: Some(90_000),
            queueing_method: Some(QueueingMethod::Random),
            ..Settings::default()
        },
        config_fingerprint: u64::MAX,
        ..RoomOverrides::default()
    };
    store.set_overrides(&p.room, Some(&second)).await.unwrap();
    assert_eq!(
        store.overrides(&p.room).await.unwrap(),
        Some(second.clone())
    );

    admitted(r.arrive(VisitorId::random(), T0).await);
    r.reset(T0).await;
    assert_eq!(r.stats(T0).await, RoomStats::default());
    assert_eq!(store.overrides(&p.room).await.unwrap(), Some(second));

    store.set_overrides(&p.room, None).await.unwrap();
    assert_eq!(store.overrides(&p.room).await.unwrap(), None);
}

/// At an event's start, whoever stopped polling leaves, and the shuffled
/// prequeue's abandonment clock starts again: a visitor who arrived shortly
/// before the start and has not polled since keeps its place for
/// `abandon_after` from the start.
pub async fn an_event_shuffle_ages_nobody(h: &Harness) {
    let prequeue_start = T0;
    let start = prequeue_start + 10 * MINUTE;
    let event = EventSpec {
        name: "drop".into(),
        prequeue_start_ms: Some(prequeue_start),
        start_ms: start,
        end_ms: start + 60 * MINUTE,
        shuffle_at_start: true,
        lanes_only_for_ms: None,
        settings: Settings::default(),
        notice: None,
    };
    let mut p = room("event-age");
    p.total_active_users = 0;
    p.state = RoomState::Paused;
    p.abandon_after_ms = 2 * MINUTE;
    let r = bind(h, p.clone());
    // One arrives as the prequeue opens, one 30 s before the start; neither
    // polls.
    let first = r.queue_up(1, prequeue_start).await[0];
    let last = r.queue_up(1, start - 30 * SECOND).await[0];
    let moved = h
        .store
        .start_event(&p, &EventStart::of(&event, 1), start)
        .await
        .unwrap();
    assert_eq!(moved, 1, "the first left at the start");
    assert_eq!(r.totals().await.abandoned, 1);
    assert!(!r.release(first.0, start).await, "the first is gone");
    assert_eq!(r.stats(start + 2 * MINUTE).await.queued, 1);
    assert_eq!(r.stats(start + 2 * MINUTE + 1).await.queued, 0);
    assert!(!r.release(last.0, start + 2 * MINUTE + 1).await);
}

/// Timed drops (docs/how-it-works.md): 1,000 visitors queue during a
/// prequeue (the room is paused, nobody admitted); at the start one atomic
/// step puts them in a random order, once however many callers ask at the
/// same moment; they stay behind whoever queued before the prequeue and
/// ahead of everyone who arrives after the start; their old tickets get
/// the new order; the room then lets them in in that order.
pub async fn an_event_start_shuffles_the_prequeue_once(h: &Harness) {
    let prequeue_start = T0 + MINUTE;
    let start = prequeue_start + 10 * MINUTE;
    let event = EventSpec {
        name: "drop".into(),
        prequeue_start_ms: Some(prequeue_start),
        start_ms: start,
        end_ms: start + 60 * MINUTE,
        shuffle_at_start: true,
        lanes_only_for_ms: None,
        settings: Settings {
            total_active_users: Some(50),
            new_users_per_minute: Some(50),
            ..Settings::default()
        },
        notice: None,
    };
    let mut p = room("event");
    p.total_active_users = 0;
    p.state = RoomState::Paused;
    // (Nobody here polls while waiting.)
    p.abandon_after_ms = 60 * MINUTE;
    let r = bind(h, p.clone());
    // Three were waiting before the prequeue opened.
    let early = r.queue_up(3, T0).await;
    // 1,000 arrive during the prequeue, one every 500 ms.
    let mut pre = Vec::new();
    for i in 0..1000u64 {
        let at = prequeue_start + i * 500;
        pre.extend(r.queue_up(1, at).await);
        if i == 999 {
            assert!(at < start);
        }
    }
    assert_eq!(r.stats(start - 1).await.active, 0);

    // At the start: two instances ask at once.
    let mut running = p.clone();
    running.state = RoomState::Paused; // still, until the start is confirmed
    let a = EventStart::of(&event, 1);
    let b = EventStart::of(&event, 2);
    let (ra, rb) = tokio::join!(
        h.store.start_event(&running, &a, start),
        h.store.start_event(&running, &b, start)
    );
    let mut moved = [ra.unwrap(), rb.unwrap()];
    moved.sort();
    assert_eq!(moved, [0, 1000], "shuffled once, by one caller");
    assert_eq!(
        h.store
            .start_event(&running, &a, start + SECOND)
            .await
            .unwrap(),
        0,
        "started once"
    );

    // Someone arriving after the start waits behind the whole prequeue.
    let late = r.queue_up(1, start + SECOND).await;
    let now = start + 2 * SECOND;
    for (i, (v, seq)) in early.iter().enumerate() {
        assert_eq!(queued(r.poll(*v, *seq, now).await).position, i as u64 + 1);
    }
    // The prequeue's old tickets learn their new place and seq.
    let mut order = BTreeMap::new();
    let mut fixed = 0;
    for (i, (v, seq)) in pre.iter().enumerate() {
        let place = queued(r.poll(*v, *seq, now).await);
        assert!(
            (4..=1003).contains(&place.position),
            "{i}: {}",
            place.position
        );
        assert!(place.seq < prequeue_start_seq(prequeue_start), "renumbered");
        if place.position == i as u64 + 4 {
            fixed += 1;
        }
        assert!(order.insert(place.position, (*v, place.seq)).is_none());
    }
    assert_eq!(order.len(), 1000, "a permutation");
    assert!(fixed < 20, "{fixed} kept their arrival place: not shuffled");
    assert_eq!(
        queued(r.poll(late[0].0, late[0].1, now).await).position,
        1004
    );

    // Open under the event's limits: the early three, then the drawn order.
    let mut open = p.clone();
    open.state = RoomState::Open;
    event.settings.apply(&mut open);
    let r = bind(h, open);
    let at = now + SECOND;
    for (v, seq) in &early {
        admitted(r.poll(*v, *seq, at).await);
    }
    let admitted_now: Vec<_> = {
        let mut out = Vec::new();
        for (position, (v, seq)) in &order {
            if let Verdict::Admitted { .. } = r.poll(*v, *seq, at).await {
                out.push(*position);
            }
        }
        out
    };
    assert_eq!(admitted_now, (4..=50).collect::<Vec<u64>>());
}

fn prequeue_start_seq(at: Millis) -> u64 {
    waitroom::store::next_seq(at, 0)
}

/// `note`: single-use proofs (added == 0 the second time) and the distinct
/// networks of a session (size), on the injected clock, per room and set.
pub async fn noted_sets_count_distinct_members_until_they_lapse(h: &Harness) {
    let s = &h.store;
    let room = "c-note";
    let n = s
        .note(room, "proofs", &[42], T0 + MINUTE, T0)
        .await
        .unwrap();
    assert_eq!((n.added, n.size), (1, 1));
    let n = s
        .note(room, "proofs", &[42], T0 + MINUTE, T0 + SECOND)
        .await
        .unwrap();
    assert_eq!((n.added, n.size), (0, 1), "a proof is good once");
    // Another set, another room: separate.
    let n = s
        .note(room, "nets:a", &[1, 2, 2], T0 + SESSION, T0)
        .await
        .unwrap();
    assert_eq!((n.added, n.size), (2, 2));
    let n = s
        .note("c-note-2", "nets:a", &[1], T0 + SESSION, T0)
        .await
        .unwrap();
    assert_eq!((n.added, n.size), (1, 1));
    let n = s
        .note(room, "nets:a", &[2, 3], T0 + SESSION, T0 + SECOND)
        .await
        .unwrap();
    assert_eq!((n.added, n.size), (1, 3));
    // Extended, never shortened: 1 keeps its longer life.
    let n = s
        .note(room, "nets:a", &[1], T0 + MINUTE, T0 + SECOND)
        .await
        .unwrap();
    assert_eq!((n.added, n.size), (0, 3));
    // After its time a member is gone, and noting it again counts it as new.
    let n = s
        .note(room, "proofs", &[], T0 + MINUTE, T0 + 2 * MINUTE)
        .await
        .unwrap();
    assert_eq!((n.added, n.size), (0, 0));
    let n = s
        .note(room, "proofs", &[42], T0 + 3 * MINUTE, T0 + 2 * MINUTE)
        .await
        .unwrap();
    assert_eq!((n.added, n.size), (1, 1));
    let n = s
        .note(room, "nets:a", &[], T0 + SESSION, T0 + SESSION)
        .await
        .unwrap();
    assert_eq!(n.size, 0, "every member lapsed at the session's end");
}

/// `forget`: a single-use member taken back (an arrival that got no place)
/// is new again; only the members named go, in that room and set.
pub async fn forgotten_members_are_new_again(h: &Harness) {
    let s = &h.store;
    let room = "c-forget";
    let n = s.note(room, "jti", &[7, 8], T0 + MINUTE, T0).await.unwrap();
    assert_eq!((n.added, n.size), (2, 2));
    s.note("c-forget-2", "jti", &[7], T0 + MINUTE, T0)
        .await
        .unwrap();
    assert_eq!(s.forget(room, "jti", &[7, 9]).await.unwrap(), 1);
    assert_eq!(
        s.forget(room, "codes", &[8]).await.unwrap(),
        0,
        "another set"
    );
    assert_eq!(s.forget("c-none", "jti", &[7]).await.unwrap(), 0);
    let n = s
        .note(room, "jti", &[7, 8], T0 + MINUTE, T0 + SECOND)
        .await
        .unwrap();
    assert_eq!((n.added, n.size), (1, 2), "7 is new again, 8 was kept");
    let n = s
        .note("c-forget-2", "jti", &[7], T0 + MINUTE, T0 + SECOND)
        .await
        .unwrap();
    assert_eq!(n.added, 0, "the other room's 7 stays");
}

/// `n` newcomers queued behind a full room, arriving 64 at a time (so a
/// store that gathers concurrent arrivals decides them together), in seq
/// order.
async fn queue_many(r: &Room<'_>, n: usize, now: Millis) -> Vec<(VisitorId, u64)> {
    let mut q = Vec::with_capacity(n);
    for chunk in visitors(n).chunks(64) {
        let calls = chunk.iter().map(|&v| {
            let (store, p) = (r.h.store.clone(), r.p.clone());
            async move {
                (
                    v,
                    queued(store.arrive(&p, v, 0, Arrival::New, now).await.unwrap()).seq,
                )
            }
        });
        q.extend(futures::future::join_all(calls).await);
    }
    q.sort_by_key(|&(_, seq)| seq);
    q
}

/// A queue far longer than any store keeps per visitor at its head (the
/// Redis store writes the back of a long queue one batch a member): every
/// place shows its position, a place released far back stays ended, and
/// the room admits in arrival order across the whole queue (I3), never the
/// released place.
pub async fn a_long_queue_keeps_its_order_past_its_head(h: &Harness) {
    const N: usize = 2_600;
    let mut p = room("long-queue");
    p.total_active_users = 1;
    let mut r = bind(h, p);
    admitted(r.arrive(VisitorId::random(), T0).await);
    let q = queue_many(&r, N, T0).await;
    let at = T0 + SECOND;
    for i in [0, 1, 999, 1_999, 2_000, 2_300, N - 1] {
        let place = queued(r.poll(q[i].0, q[i].1, at).await);
        assert_eq!(
            (place.position, place.queue_length),
            (i as u64 + 1, N as u64),
            "#{i}"
        );
    }
    // Released far back: ended, and (once the stores have seen it go)
    // nobody behind it is shown a place ahead of where they are.
    let gone = 2_300;
    assert!(r.release(q[gone].0, T0 + 2 * SECOND).await);
    assert_eq!(
        r.poll(q[gone].0, q[gone].1, T0 + 3 * SECOND).await,
        Verdict::Ended
    );
    let at = T0 + 3 * SECOND;
    let behind = queued(r.poll(q[2_400].0, q[2_400].1, at).await);
    assert!(
        (2_400..=2_401).contains(&behind.position),
        "at most the released place too many ahead: {behind:?}"
    );
    // Room for 1,500 more: the first 1,500 go in, the rest move up.
    r.p.total_active_users = 1 + 1_500;
    let at = T0 + 4 * SECOND;
    for (i, &(v, seq)) in q.iter().enumerate() {
        let verdict = r.poll(v, seq, at).await;
        match i {
            _ if i < 1_500 => {
                admitted(verdict);
            }
            _ if i < gone => assert_eq!(queued(verdict).position, (i - 1_500 + 1) as u64, "#{i}"),
            _ if i == gone => assert_eq!(verdict, Verdict::Ended),
            _ => assert!(
                (i - 1_500..=i - 1_500 + 1).contains(&(queued(verdict).position as usize)),
                "#{i}"
            ),
        }
    }
    // Room for everyone: all go in but the released place.
    r.p.total_active_users = 1 + N as u64;
    let at = T0 + 5 * SECOND;
    for (i, &(v, seq)) in q.iter().enumerate().skip(1_500) {
        let verdict = r.poll(v, seq, at).await;
        if i == gone {
            assert_eq!(verdict, Verdict::Ended);
        } else {
            admitted(verdict);
        }
    }
    let s = r.stats(at).await;
    assert_eq!((s.active, s.queued), (N as u64, 0));
}

/// Abandonment far back in a long queue: whoever stops polling there loses
/// the place (counted once) and is never admitted, while everyone who
/// polls keeps theirs and goes in in order.
pub async fn visitors_who_leave_far_back_are_never_admitted(h: &Harness) {
    const N: usize = 2_200;
    let mut p = room("long-abandon");
    p.total_active_users = 1;
    let mut r = bind(h, p);
    admitted(r.arrive(VisitorId::random(), T0).await);
    let q = queue_many(&r, N, T0).await;
    let quitters = [2_050, 2_051, 2_199];
    // Everyone else polls every minute, up to past abandon_after.
    for t in [T0 + MINUTE, T0 + 2 * MINUTE, T0 + 3 * MINUTE] {
        for (i, &(v, seq)) in q.iter().enumerate() {
            if !quitters.contains(&i) {
                queued(r.poll(v, seq, t).await);
            }
        }
    }
    r.p.total_active_users = 1 + N as u64;
    let at = T0 + 3 * MINUTE + SECOND;
    for (i, &(v, seq)) in q.iter().enumerate() {
        if !quitters.contains(&i) {
            admitted(r.poll(v, seq, at).await);
        }
    }
    let s = r.stats(at).await;
    assert_eq!((s.active, s.queued), ((1 + N - quitters.len()) as u64, 0));
    assert_eq!(r.totals().await.abandoned, quitters.len() as u64);
}

/// Newcomers admitted together (`Arrival::New`, the daemon's way, many at once;
/// the Redis store keeps their sessions as one entry per call, see
/// lua/lib/sessions.lua) are sessions one by one: each counts,
/// checks in by its ticket, renews, is released, reset or expires alone,
/// and nobody is admitted past the capacity (I1).
pub async fn newcomers_admitted_together_are_sessions_one_by_one(h: &Harness) {
    const N: usize = 40;
    let mut p = room("together");
    p.total_active_users = N as u64;
    let r = bind(h, p.clone());
    // N + 1 at once: N admitted, one queued.
    let (mut ids, mut waiting) = (Vec::new(), Vec::new());
    for (v, verdict) in arrive_together(h, &p, N + 1, T0).await {
        match verdict {
            Verdict::Admitted { session_expires_ms } => {
                assert_eq!(session_expires_ms, T0 + SESSION);
                ids.push(v);
            }
            Verdict::Queued(place) => waiting.push((v, place.seq)),
            other => panic!("admitted or queued, got {other:?}"),
        }
    }
    assert_eq!((ids.len(), waiting.len()), (N, 1));
    assert_eq!(r.stats(T0).await.active, N as u64);

    // Each checks in by its ticket; a renewed session is still one.
    let (renewed, released, expiring) = (ids[0], ids[1], ids[2]);
    assert_eq!(
        r.check_in_with(renewed, T0 + SESSION, T0 + 1).await,
        Some(T0 + 1 + SESSION)
    );
    assert_eq!(
        r.check_in_with(renewed, T0 + 1 + SESSION, T0 + 2).await,
        Some(T0 + 2 + SESSION)
    );
    assert_eq!(
        r.check_in_with(expiring, T0 + SESSION, T0).await,
        Some(T0 + SESSION),
        "nothing to renew yet"
    );
    assert_eq!(r.stats(T0 + 2).await.active, N as u64);

    // Released: its ticket cannot bring it back, and its room goes to the
    // one who waits (and to nobody else).
    assert!(r.release(released, T0 + 3).await);
    assert!(!r.release(released, T0 + 3).await, "released twice");
    assert_eq!(r.check_in_with(released, T0 + SESSION, T0 + 4).await, None);
    let (head, head_seq) = waiting[0];
    // (Promoted by whichever call came first after the release.)
    assert!(admitted(r.poll(head, head_seq, T0 + 4).await) >= T0 + 3 + SESSION + GRACE);
    let late = VisitorId::random();
    let late_place = queued(
        h.store
            .arrive(&p, late, 0, Arrival::New, T0 + 5)
            .await
            .unwrap(),
    );
    assert_eq!(r.stats(T0 + 5).await.active, N as u64);

    // Renewed, then released: neither of its tickets brings it back.
    let gone = ids[3];
    assert_eq!(
        r.check_in_with(gone, T0 + SESSION, T0 + 6).await,
        Some(T0 + 6 + SESSION)
    );
    assert!(r.release(gone, T0 + 7).await);
    for ticket in [T0 + SESSION, T0 + 6 + SESSION] {
        assert_eq!(r.check_in_with(gone, ticket, T0 + 8).await, None);
    }
    assert!(matches!(
        r.poll(late, late_place.seq, T0 + 8).await,
        Verdict::Admitted { .. }
    ));
    assert_eq!(r.stats(T0 + 8).await.active, N as u64);

    // Ended by a ticket (the origin's revoke): one still in its batch, and
    // one renewed since, whose request carried the ticket from before its
    // renewal. No ticket of theirs brings them back.
    let (revoked, renewed_revoked) = (ids[4], ids[5]);
    assert_eq!(
        r.check_in_with(renewed_revoked, T0 + SESSION, T0 + 9).await,
        Some(T0 + 9 + SESSION)
    );
    assert!(r.end_session(revoked, T0 + SESSION, T0 + 10).await);
    assert!(r.end_session(renewed_revoked, T0 + SESSION, T0 + 10).await);
    assert!(
        !r.end_session(revoked, T0 + SESSION, T0 + 10).await,
        "ended twice"
    );
    for (v, ticket) in [
        (revoked, T0 + SESSION),
        (renewed_revoked, T0 + SESSION),
        (renewed_revoked, T0 + 9 + SESSION),
    ] {
        assert_eq!(r.check_in_with(v, ticket, T0 + 11).await, None);
    }
    assert_eq!(r.stats(T0 + 11).await.active, N as u64 - 2);

    // At T0 + SESSION the others' sessions end together: the renewed one
    // and the two promoted are left.
    assert_eq!(
        r.check_in_with(expiring, T0 + SESSION, T0 + SESSION).await,
        None
    );
    assert_eq!(r.stats(T0 + SESSION).await.active, 3);

    // Renewal off: a check-in confirms the batch's expiry; a reset ends
    // every session, batched or not.
    let mut fixed = room("together-fixed");
    fixed.session_renewal = false;
    fixed.total_active_users = 0;
    let r = bind(h, fixed.clone());
    let mut ids = Vec::new();
    for (v, verdict) in arrive_together(h, &fixed, 8, T0).await {
        assert_eq!(admitted(verdict), T0 + SESSION);
        ids.push(v);
    }
    assert_eq!(
        r.check_in_with(ids[0], T0 + SESSION, T0 + MINUTE).await,
        Some(T0 + SESSION)
    );
    assert_eq!(r.stats(T0 + MINUTE).await.active, 8);
    r.reset(T0 + MINUTE).await;
    assert_eq!(r.stats(T0 + MINUTE).await.active, 0);
    for v in ids {
        assert_eq!(
            r.check_in_with(v, T0 + SESSION, T0 + MINUTE + 1).await,
            None,
            "reset ends every session"
        );
    }
}

/// `n` new visitors at once as the daemon arrives them, `Arrival::New` (so a store
/// that decides concurrent arrivals together does), in the order they were
/// sent, with their verdicts.
async fn arrive_together(
    h: &Harness,
    p: &RoomPolicy,
    n: usize,
    now: Millis,
) -> Vec<(VisitorId, Verdict)> {
    let joins: Vec<_> = visitors(n)
        .into_iter()
        .map(|v| {
            let (store, p) = (h.store.clone(), p.clone());
            (
                v,
                tokio::spawn(async move { store.arrive(&p, v, 0, Arrival::New, now).await }),
            )
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for (v, j) in joins {
        out.push((v, j.await.unwrap().unwrap()));
    }
    out
}

/// A full room with two lanes (30% and 20%; the general queue keeps 50%)
/// and everyone waiting: over 100 admissions each lane gets its share,
/// and inside each lane admissions follow arrival order (I3 per lane).
pub async fn lanes_share_admissions_and_keep_fifo_within(h: &Harness) {
    let mut p = room("lanes-share");
    p.total_active_users = 1;
    p.lanes = Lanes::with_shares(&[300, 200]);
    let r = bind(h, p);
    let mut inside = VisitorId::random();
    admitted(r.arrive(inside, T0).await);
    let mut lines = [
        r.queue_up(60, T0 + SECOND).await,
        r.queue_in(1, 60, T0 + SECOND).await,
        r.queue_in(2, 60, T0 + SECOND).await,
    ];
    let stats = r.stats(T0 + SECOND).await;
    assert_eq!((stats.queued, stats.lane_queued), (180, [60, 60, 0, 0]));
    let mut admitted_of = [0usize; 3];
    let mut at = T0 + 2 * SECOND;
    for _ in 0..100 {
        assert!(r.release(inside, at).await);
        // Exactly one waiting visitor was let in: the first of its lane.
        let mut let_in = None;
        for (lane, line) in lines.iter().enumerate() {
            let (v, seq) = line[0];
            match r.poll_in(v, lane as u8, seq, at).await {
                Verdict::Admitted { .. } => {
                    assert!(let_in.is_none(), "two let in for one place");
                    let_in = Some(lane);
                }
                Verdict::Queued(place) => assert_eq!(place.position, 1),
                other => panic!("lane {lane}: {other:?}"),
            }
        }
        let lane = let_in.expect("someone was let in");
        inside = lines[lane].remove(0).0;
        admitted_of[lane] += 1;
        at += SECOND;
    }
    assert_eq!(admitted_of, [50, 30, 20], "general, lane 1, lane 2");
}

/// A lane's arrival moves nobody back: positions in the general queue and
/// in other lanes stay, and each lane counts its own.
pub async fn a_lane_arrival_moves_nobody_back(h: &Harness) {
    let mut p = room("lanes-back");
    p.total_active_users = 1;
    p.lanes = Lanes::with_shares(&[500]);
    let r = bind(h, p);
    admitted(r.arrive(VisitorId::random(), T0).await);
    let general = r.queue_up(5, T0).await;
    let at = T0 + SECOND;
    let before: Vec<u64> = {
        let mut out = Vec::new();
        for &(v, seq) in &general {
            out.push(queued(r.poll(v, seq, at).await).position);
        }
        out
    };
    let lane = r.queue_in(1, 3, at).await;
    for (i, &(v, seq)) in general.iter().enumerate() {
        let place = queued(r.poll(v, seq, at).await);
        assert_eq!(place.position, before[i], "general place {i}");
        assert_eq!(place.queue_length, 5);
    }
    for (i, &(v, seq)) in lane.iter().enumerate() {
        let place = queued(r.poll_in(v, 1, seq, at).await);
        assert_eq!((place.position, place.queue_length), (i as u64 + 1, 3));
    }
    assert_eq!(r.stats(at).await.queued, 8);
}

/// A visitor holds one place: arriving again by id, in the same lane or
/// another, gives the place it holds, not a second one.
pub async fn a_visitor_waits_in_one_lane_only(h: &Harness) {
    let mut p = room("lanes-one");
    p.total_active_users = 1;
    p.lanes = Lanes::with_shares(&[300, 300]);
    let r = bind(h, p);
    admitted(r.arrive(VisitorId::random(), T0).await);
    let v = VisitorId::random();
    let first = queued(r.arrive_in(v, 1, T0).await);
    for lane in [0, 1, 2] {
        let again = queued(r.arrive_in(v, lane, T0 + SECOND).await);
        assert_eq!(again, first, "arriving again in lane {lane}");
    }
    let w = VisitorId::random();
    let general = queued(r.arrive(w, T0).await);
    assert_eq!(queued(r.arrive_in(w, 2, T0 + SECOND).await), general);
    let stats = r.stats(T0 + SECOND).await;
    assert_eq!((stats.queued, stats.lane_queued), (2, [1, 0, 0, 0]));
}

/// A lane's places end as the general queue's do: released (and not put
/// back by their tickets), voided by a reset, and put back at their seq in
/// their lane after a loss (I5).
pub async fn lane_places_are_released_reset_and_put_back(h: &Harness) {
    let mut p = room("lanes-end");
    p.total_active_users = 1;
    p.lanes = Lanes::with_shares(&[300]);
    let r = bind(h, p);
    let holder = VisitorId::random();
    admitted(r.arrive(holder, T0).await);
    let q = r.queue_in(1, 4, T0).await;
    let at = T0 + SECOND;
    // Released: gone, and its ticket does not bring it back.
    assert!(r.release(q[0].0, at).await);
    assert_eq!(r.poll_in(q[0].0, 1, q[0].1, at).await, Verdict::Ended);
    // Lost: its ticket puts it back where it stood.
    r.lose(q[2].0);
    assert_eq!(r.stats(at).await.lane_queued[0], 2);
    let back = queued(r.poll_in(q[2].0, 1, q[2].1, at).await);
    assert_eq!((back.seq, back.position, back.queue_length), (q[2].1, 2, 3));
    // Admitted in lane order.
    assert!(r.release(holder, at).await);
    admitted(r.poll_in(q[1].0, 1, q[1].1, at).await);
    assert_eq!(queued(r.poll_in(q[3].0, 1, q[3].1, at).await).position, 2);
    // A reset voids them all.
    r.reset(at + SECOND).await;
    assert_eq!(
        r.poll_in(q[3].0, 1, q[3].1, at + 2 * SECOND).await,
        Verdict::Ended
    );
    assert_eq!(r.stats(at + 2 * SECOND).await.queued, 0);
}

/// While a lane is empty the general queue takes every admission, and a
/// lane that starts waiting later gets its share from then on, not the
/// turns it missed.
pub async fn a_lane_nobody_waits_in_saves_no_turns(h: &Harness) {
    let mut p = room("lanes-idle");
    p.total_active_users = 1;
    p.lanes = Lanes::with_shares(&[500]);
    let r = bind(h, p);
    let mut inside = VisitorId::random();
    admitted(r.arrive(inside, T0).await);
    let mut general = r.queue_up(40, T0).await;
    let mut at = T0 + SECOND;
    for _ in 0..10 {
        assert!(r.release(inside, at).await);
        let (v, seq) = general.remove(0);
        admitted(r.poll(v, seq, at).await);
        inside = v;
        at += SECOND;
    }
    let mut lane = r.queue_in(1, 10, at).await;
    let mut of_lane = 0;
    for _ in 0..10 {
        assert!(r.release(inside, at).await);
        let (v, seq) = lane[0];
        if let Verdict::Admitted { .. } = r.poll_in(v, 1, seq, at).await {
            lane.remove(0);
            of_lane += 1;
            inside = v;
        } else {
            let (v, seq) = general.remove(0);
            admitted(r.poll(v, seq, at).await);
            inside = v;
        }
        at += SECOND;
    }
    assert_eq!(of_lane, 5, "half of the ten, not all ten");
}

/// Lanes whose shares add up to 1 go first: the general queue is let in
/// only once nobody waits in them (and is then let in at once, I4).
pub async fn a_lane_with_all_the_share_goes_first(h: &Harness) {
    let mut p = room("lanes-all");
    p.total_active_users = 2;
    p.lanes = Lanes::with_shares(&[1000]);
    let r = bind(h, p);
    let holders = visitors(2);
    for &v in &holders {
        admitted(r.arrive(v, T0).await);
    }
    let general = r.queue_up(2, T0).await;
    let lane = r.queue_in(1, 2, T0 + SECOND).await;
    let at = T0 + 2 * SECOND;
    assert!(r.release(holders[0], at).await);
    admitted(r.poll_in(lane[0].0, 1, lane[0].1, at).await);
    assert_eq!(
        queued(r.poll(general[0].0, general[0].1, at).await).position,
        1
    );
    assert!(r.release(lane[0].0, at).await);
    assert!(r.release(holders[1], at).await);
    admitted(r.poll_in(lane[1].0, 1, lane[1].1, at).await);
    admitted(r.poll(general[0].0, general[0].1, at).await);
}

/// A presale window: before its end only lane places are let in; the
/// general queue waits even while the room has room, and its newcomers
/// queue (by id or made new). From the end the general queue moves.
pub async fn a_presale_window_lets_only_the_lanes_in(h: &Harness) {
    let until = T0 + 10 * SECOND;
    let mut p = room("presale");
    p.total_active_users = 3;
    p.lanes = Lanes::with_shares(&[500]).only_until(until);
    let r = bind(h, p);
    // An empty room: a general newcomer queues all the same.
    let general = r.queue_up(1, T0).await;
    let fresh = queued(
        r.h.store
            .arrive(&r.p, VisitorId::random(), 0, Arrival::New, T0)
            .await
            .unwrap(),
    );
    assert_eq!(fresh.position, 2);
    // A lane newcomer is admitted: only the general queue waits.
    admitted(r.arrive_in(VisitorId::random(), 1, T0).await);
    // Polling just before the end changes nothing for the general queue.
    let at = until - 1;
    assert_eq!(
        queued(r.poll(general[0].0, general[0].1, at).await).position,
        1
    );
    // A lane place is promoted before the end.
    admitted(r.arrive_in(VisitorId::random(), 1, at).await);
    let stats = r.stats(at).await;
    assert_eq!((stats.active, stats.queued), (2, 2));
    // At the end the general queue moves into the room left.
    admitted(r.poll(general[0].0, general[0].1, until).await);
    let stats = r.stats(until).await;
    assert_eq!((stats.active, stats.queued), (3, 1));
}

/// A member the room had not seen (`Arrival::Unseen`, which may skip the
/// costly lookups) holds a session or a place like anyone, found by id at
/// its next arrival, in the general queue or a lane, past the head too.
pub async fn an_unseen_member_is_found_by_id_when_it_comes_again(h: &Harness) {
    let mut p = room("unseen");
    p.total_active_users = 1;
    p.lanes = Lanes::with_shares(&[300]);
    let r = bind(h, p);
    let inside = VisitorId::random();
    let expiry = admitted(
        r.h.store
            .arrive(&r.p, inside, 0, Arrival::Unseen, T0)
            .await
            .unwrap(),
    );
    assert_eq!(
        r.arrive(inside, T0 + SECOND).await,
        Verdict::Admitted {
            session_expires_ms: expiry
        }
    );
    r.queue_up(3000, T0).await;
    for lane in [0u8, 1] {
        let v = VisitorId::random();
        let place = queued(
            r.h.store
                .arrive(&r.p, v, lane, Arrival::Unseen, T0 + SECOND)
                .await
                .unwrap(),
        );
        for again in [0u8, 1] {
            let back = queued(r.arrive_in(v, again, T0 + 2 * SECOND).await);
            assert_eq!(
                back.seq, place.seq,
                "lane {lane}, arriving again in {again}"
            );
        }
    }
}

fn report_minute(sums: &[(&str, u64)], peaks: &[(&str, u64)]) -> ReportMinute {
    ReportMinute {
        sums: sums.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
        peaks: peaks.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
    }
}

/// Reports: two instances' shares of a minute add up (sums) and take the
/// highest (peaks); minutes are read by range across hours, per room; a
/// minute lapses at its `keep_until` on the caller's clock and starts
/// over when written again.
pub async fn report_minutes_add_up_keep_peaks_and_lapse(h: &Harness) {
    let s = &h.store;
    let room = format!("c-report-{:08x}", rand::random::<u32>());
    let m0 = T0 / MINUTE;
    let keep = T0 + 7 * 24 * 60 * MINUTE;
    let a = report_minute(&[("admitted", 3), ("w12", 2)], &[("queue_peak", 40)]);
    let b = report_minute(
        &[("admitted", 4), ("revoked", 1)],
        &[("queue_peak", 25), ("active_peak", 9)],
    );
    s.report_add(&room, m0, &a, keep, T0).await.unwrap();
    s.report_add(&room, m0, &b, keep, T0).await.unwrap();
    // Minute 59 and 61 lie in another hour than m0 (T0 is on the hour).
    assert_eq!(T0 % (60 * MINUTE), 0);
    s.report_add(&room, m0 + 61, &a, keep, T0).await.unwrap();
    s.report_add("c-report-other", m0, &b, keep, T0)
        .await
        .unwrap();
    let got = s.report_read(&room, m0, m0 + 120, T0).await.unwrap();
    let want_m0 = report_minute(
        &[("admitted", 7), ("w12", 2), ("revoked", 1)],
        &[("queue_peak", 40), ("active_peak", 9)],
    );
    assert_eq!(got, vec![(m0, want_m0.clone()), (m0 + 61, a.clone())]);
    // A range is inclusive at both ends and may cover nothing.
    assert_eq!(
        s.report_read(&room, m0 + 1, m0 + 60, T0).await.unwrap(),
        vec![]
    );
    assert_eq!(
        s.report_read(&room, m0 + 61, m0 + 61, T0).await.unwrap(),
        vec![(m0 + 61, a.clone())]
    );
    assert_eq!(s.report_read(&room, m0 + 5, m0, T0).await.unwrap(), vec![]);
    assert_eq!(
        s.report_read("c-report-none", m0, m0 + 5, T0)
            .await
            .unwrap(),
        vec![]
    );
    // A later, longer keep extends the minute; a shorter one never cuts it.
    s.report_add(&room, m0 + 61, &a, T0 + 10 * MINUTE, T0)
        .await
        .unwrap();
    let later = keep - 1;
    assert_eq!(
        s.report_read(&room, m0, m0 + 61, later)
            .await
            .unwrap()
            .len(),
        2
    );
    // At its keep the minute is gone, and written again it starts over.
    assert_eq!(
        s.report_read(&room, m0, m0 + 61, keep).await.unwrap(),
        vec![]
    );
    s.report_add(&room, m0, &a, keep + 60 * MINUTE, keep)
        .await
        .unwrap();
    assert_eq!(
        s.report_read(&room, m0, m0 + 61, keep).await.unwrap(),
        vec![(m0, a.clone())]
    );
}

/// Reports against the reference model: generated sequences of additions
/// (several minutes, hours apart or not, keeps that lapse while the clock
/// moves) and reads of random ranges answer what the model answers.
pub async fn reports_match_the_model_on_generated_sequences(h: &Harness) {
    let names = ["admitted", "queued", "w3", "w40"];
    let peak_names = ["queue_peak", "active_peak"];
    for seed in 0..6u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let room = format!("c-report-gen-{seed}-{:08x}", rand::random::<u32>());
        let model = waitroom::store::model::ModelStore::new();
        let m0 = T0 / MINUTE - 30;
        let mut now = T0;
        for _ in 0..60 {
            now += rng.gen_range(0..3 * MINUTE);
            if rng.gen_bool(0.7) {
                let minute = m0 + rng.gen_range(0..150);
                let mut add = ReportMinute::default();
                for n in names {
                    if rng.gen_bool(0.5) {
                        add.sums.insert(n.to_string(), rng.gen_range(0..1000));
                    }
                }
                for n in peak_names {
                    if rng.gen_bool(0.5) {
                        add.peaks.insert(n.to_string(), rng.gen_range(0..1000));
                    }
                }
                let keep = now + rng.gen_range(1..40) * MINUTE;
                h.store
                    .report_add(&room, minute, &add, keep, now)
                    .await
                    .unwrap();
                model
                    .report_add(&room, minute, &add, keep, now)
                    .await
                    .unwrap();
            } else {
                let from = m0 + rng.gen_range(0..160);
                let to = from + rng.gen_range(0..90);
                let got = h.store.report_read(&room, from, to, now).await.unwrap();
                let want = model.report_read(&room, from, to, now).await.unwrap();
                assert_eq!(got, want, "seed {seed}, {from}..={to} at {now}");
            }
        }
    }
}
