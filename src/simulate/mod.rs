//! A flash crowd, simulated before it happens (`waitroom simulate`): the real
//! store and the real ETA estimator on a virtual clock, with arrivals that
//! ramp up, hold and ramp down, visitors who poll like the queue page, stay a
//! while once in, leave, or give up waiting.
//!
//! Nothing sleeps: the run is a queue of timed events (arrivals, polls,
//! check-ins, departures, and the once-a-second reading of the room's
//! figures the daemon does), taken in time order, each one store operation at
//! its own virtual millisecond. Fifty thousand visitors in five minutes at a
//! room of a thousand take seconds.
//!
//! Visitor behaviour, as the built-in queue page and a typical shopper:
//!
//! * arrivals are a Poisson process whose rate follows the profile;
//! * a queued page polls every `refresh_interval` × 0.8–1.2 (the page's
//!   jitter) and learns it is in at the first poll after its promotion;
//! * an admitted visitor stays an exponentially distributed time (mean
//!   `time_on_site`: most look briefly, a few stay long), checks in every
//!   `check_in_interval` meanwhile (renewing the session), then leaves
//!   (release, as a checkout does);
//! * a share `abandon` of queued visitors stops polling at a random moment
//!   before the wait they were told; the store's `abandon_after` drops them
//!   (or, if promoted first, their session runs out unused).

pub mod chart;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::clock::Millis;
use crate::config::RoomConfig;
use crate::domain::VisitorId;
use crate::gate::eta::RateTracker;
use crate::store::{Arrival, End, Store, StoreError, Verdict};

/// The virtual clock starts here (any time after the store's `seq` epoch).
const START_MS: Millis = 1_800_000_000_000;
/// How often the room's figures are read (for the ETA) and sampled.
const TICK_MS: Millis = 1000;
/// A run whose queue has not drained this long after the last arrival stops.
const MAX_DRAIN_MS: Millis = 24 * 3600 * 1000;
/// A run stops when nobody has been let in for this long while people wait
/// (a paused room never drains).
const STALL_MS: Millis = 30 * 60 * 1000;

/// Who comes, when, and how they behave.
#[derive(Clone, Debug, PartialEq)]
pub struct Crowd {
    /// Arrivals per second at the peak.
    pub peak_per_second: f64,
    /// How long arrivals take to climb from none to the peak, and to fall
    /// back at the end (at most half of `duration`).
    pub ramp: Duration,
    /// How long people keep arriving.
    pub duration: Duration,
    /// Mean time an admitted visitor stays (exponentially distributed).
    pub time_on_site: Duration,
    /// Share of queued visitors who give up waiting (0 to 1).
    pub abandon: f64,
    /// Seed of the run's random choices: the same seed, the same run.
    pub seed: u64,
}

/// A crowd that cannot be simulated, named by its option.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum CrowdError {
    /// `--peak` is not a positive rate.
    #[error("--peak must be a positive number of arrivals per second; got {0}")]
    Peak(f64),
    /// `--visitors` is 0.
    #[error("--visitors must be at least 1")]
    Visitors,
    /// `--duration` is under a second.
    #[error("--duration must be at least 1s")]
    Duration,
    /// `--time-on-site` is under a second.
    #[error("--time-on-site must be at least 1s")]
    TimeOnSite,
    /// `--abandon` is not a share between 0 and 1.
    #[error("--abandon must be a share between 0 and 1; got {0}")]
    Abandon(f64),
}

impl Crowd {
    /// Checks the figures make a crowd.
    pub fn check(&self) -> Result<(), CrowdError> {
        if !(self.peak_per_second > 0.0 && self.peak_per_second.is_finite()) {
            return Err(CrowdError::Peak(self.peak_per_second));
        }
        if self.duration < Duration::from_secs(1) {
            return Err(CrowdError::Duration);
        }
        if self.time_on_site < Duration::from_secs(1) {
            return Err(CrowdError::TimeOnSite);
        }
        if !(0.0..=1.0).contains(&self.abandon) {
            return Err(CrowdError::Abandon(self.abandon));
        }
        Ok(())
    }

    /// The peak that brings `visitors` people (on average) over the profile.
    pub fn peak_for(visitors: u64, ramp: Duration, duration: Duration) -> Result<f64, CrowdError> {
        if visitors == 0 {
            return Err(CrowdError::Visitors);
        }
        let full = duration.as_secs_f64() - effective_ramp(ramp, duration);
        if full <= 0.0 {
            return Err(CrowdError::Duration);
        }
        Ok(visitors as f64 / full)
    }

    /// Expected arrivals over the whole profile.
    pub fn expected_visitors(&self) -> f64 {
        self.peak_per_second
            * (self.duration.as_secs_f64() - effective_ramp(self.ramp, self.duration))
    }

    /// Arrivals per second `t` seconds in.
    pub fn rate_at(&self, t: f64) -> f64 {
        let duration = self.duration.as_secs_f64();
        let ramp = effective_ramp(self.ramp, self.duration);
        if !(0.0..duration).contains(&t) {
            return 0.0;
        }
        let share = if ramp <= 0.0 {
            1.0
        } else {
            (t / ramp).min((duration - t) / ramp).min(1.0)
        };
        self.peak_per_second * share
    }

    /// The next arrival after `t` seconds (thinning a Poisson process at the
    /// peak rate), or `None` once arrivals are over.
    fn next_arrival(&self, rng: &mut StdRng, mut t: f64) -> Option<f64> {
        let duration = self.duration.as_secs_f64();
        loop {
            let u: f64 = 1.0 - rng.gen::<f64>();
            t += -u.ln() / self.peak_per_second;
            if t >= duration {
                return None;
            }
            if rng.gen::<f64>() * self.peak_per_second < self.rate_at(t) {
                return Some(t);
            }
        }
    }
}

fn effective_ramp(ramp: Duration, duration: Duration) -> f64 {
    ramp.as_secs_f64().min(duration.as_secs_f64() / 2.0)
}

/// The room's figures, once a second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// Seconds since the first arrival could come.
    pub t: u32,
    /// Active sessions.
    pub active: u64,
    pub(crate) queued: u64,
    /// Admissions in the last 60 s.
    pub admitted_last_minute: u64,
    /// What a visitor joining the back of the queue is told, in seconds.
    pub eta_back: u64,
    /// The admission rate behind the estimate, per second.
    pub eta_rate: Option<f64>,
}

/// One visitor who waited in the queue.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Wait {
    /// Seconds since the start when the visitor arrived.
    pub arrived: f64,
    /// The estimated wait told on arrival, in seconds.
    pub told: u64,
    /// How long the visitor really waited, in seconds (`None`: never got in).
    pub waited: Option<f64>,
}

/// What a run found.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The room's figures, once a second.
    pub samples: Vec<Sample>,
    /// Every visitor who was queued, in arrival order.
    pub waits: Vec<Wait>,
    /// The figures an operator wants.
    pub summary: Summary,
}

/// The figures an operator wants from a run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub(crate) room: String,
    /// `total_active_users` of the room (0: none).
    pub limit: u64,
    /// `new_users_per_minute` of the room (0: none).
    pub(crate) rate_limit: u64,
    /// Visitors who came.
    pub arrived: u64,
    /// Let in on arrival, without waiting.
    pub admitted_at_once: u64,
    /// Visitors who had to queue.
    pub queued: u64,
    /// Queued visitors who got in.
    pub admitted_from_queue: u64,
    /// Queued visitors who stopped polling before they got in.
    pub gave_up: u64,
    /// Places the store dropped for want of polls (`abandon_after`).
    pub dropped: u64,
    /// Turned away (closed room, full queue, `reject` method).
    pub rejected: u64,
    /// Most active sessions seen at once.
    pub max_active: u64,
    /// Most visitors waiting at once.
    pub peak_queue: u64,
    pub(crate) peak_queue_at: f64,
    /// Most admissions in any minute.
    pub peak_admissions_per_minute: u64,
    /// When the first visitor had to queue, in seconds (`None`: nobody queued).
    pub queue_formed_at: Option<f64>,
    /// The share of the places in use when the first visitor had to queue
    /// (`None`: nobody queued, or no `limit`).
    pub utilization_when_queueing_started: Option<f64>,
    /// When the last waiting visitor got in (or gave up), once arrivals were
    /// over; `None` if the run stopped first.
    pub queue_empty_at: Option<f64>,
    /// The run stopped with people still waiting: nobody was let in for
    /// half an hour, or a day passed after the last arrival.
    pub stopped_early: bool,
    /// Longest wait of a queued visitor who got in, in seconds.
    pub longest_wait: Option<f64>,
    /// Median of those waits.
    pub median_wait: Option<f64>,
    /// 90th percentile of those waits.
    pub p90_wait: Option<f64>,
    /// Median of |told − waited| / waited of the estimate told on arrival.
    pub eta_error_median: Option<f64>,
    /// The same, 90th percentile.
    pub(crate) eta_error_p90: Option<f64>,
    /// The largest ratio between two estimates a visitor saw in a row.
    pub largest_eta_jump: Option<f64>,
    /// Virtual seconds simulated.
    pub simulated: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// Read the room's figures.
    Tick,
    Poll(u32),
    CheckIn(u32),
    Leave(u32),
}

/// A visitor's state in the run.
struct Visitor {
    id: VisitorId,
    joined: Millis,
    /// The order the visitor's ticket carries, once queued.
    seq: u64,
    /// Estimate told on arrival, if queued.
    told: Option<u64>,
    /// The last estimate the visitor saw.
    last_told: u64,
    admitted: Option<Millis>,
    /// When the visitor stops polling, if they give up.
    gives_up: Option<Millis>,
    leaves: Millis,
    session_expires: Millis,
}

/// The run's moving parts.
struct Run<'a> {
    store: &'a dyn Store,
    room: &'a RoomConfig,
    crowd: &'a Crowd,
    policy: crate::domain::RoomPolicy,
    tracker: RateTracker,
    rng: StdRng,
    events: BinaryHeap<Reverse<(Millis, u64, Event)>>,
    /// Breaks ties between events at one millisecond: first scheduled, first run.
    scheduled: u64,
    visitors: Vec<Visitor>,
    /// Queued visitors who have not yet got in, given up or been turned away.
    waiting: u64,
    samples: Vec<Sample>,
    summary: Summary,
    largest_jump: f64,
    /// The admissions count and when it last moved.
    admitted: (u64, Millis),
}

/// Runs `crowd` against `room` on `store` (normally a fresh
/// [`MemoryStore`](crate::store::memory::MemoryStore)).
pub async fn run(
    store: &dyn Store,
    room: &RoomConfig,
    crowd: &Crowd,
) -> Result<Outcome, StoreError> {
    let policy = room.policy();
    let mut run = Run {
        store,
        room,
        crowd,
        summary: Summary {
            room: room.id.clone(),
            limit: policy.total_active_users,
            rate_limit: policy.new_users_per_minute,
            ..Summary::default()
        },
        policy,
        tracker: RateTracker::default(),
        rng: StdRng::seed_from_u64(crowd.seed),
        events: BinaryHeap::new(),
        scheduled: 0,
        visitors: Vec::new(),
        waiting: 0,
        samples: Vec::new(),
        largest_jump: 1.0,
        admitted: (0, START_MS),
    };
    run.go().await?;
    Ok(run.finish())
}

impl Run<'_> {
    fn schedule(&mut self, at: Millis, event: Event) {
        self.scheduled += 1;
        self.events.push(Reverse((at, self.scheduled, event)));
    }

    fn refresh(&self) -> Duration {
        self.room.refresh_interval
    }

    /// One poll interval of the page, with its jitter.
    fn poll_delay(&mut self) -> Millis {
        let refresh = self.refresh().as_millis() as f64;
        (refresh * self.rng.gen_range(0.8..1.2)) as Millis
    }

    async fn go(&mut self) -> Result<(), StoreError> {
        let mut next_arrival = self
            .crowd
            .next_arrival(&mut self.rng, 0.0)
            .map(|t| (t, START_MS + (t * 1000.0) as Millis));
        let arrivals_end = START_MS + self.crowd.duration.as_millis() as Millis;
        self.schedule(START_MS, Event::Tick);
        while let Some(&Reverse((at, _, event))) = self.events.peek() {
            if let Some((t, arrival_at)) = next_arrival.filter(|&(_, a)| a < at) {
                self.arrive(arrival_at).await?;
                next_arrival = self
                    .crowd
                    .next_arrival(&mut self.rng, t)
                    .map(|t| (t, START_MS + (t * 1000.0) as Millis));
                continue;
            }
            self.events.pop();
            match event {
                Event::Tick => {
                    let done = next_arrival.is_none() && at >= arrivals_end;
                    if done && self.waiting == 0 && self.summary.queue_empty_at.is_none() {
                        self.summary.queue_empty_at = Some(seconds(at));
                    }
                    let active = self.tick(at).await?;
                    // Done once everyone is in and out again, or has had
                    // time to leave (a promoted visitor who gave up holds a
                    // session until it expires).
                    let linger = (self.crowd.time_on_site.as_millis() as f64 * 1.5) as Millis;
                    let settled = self
                        .summary
                        .queue_empty_at
                        .is_some_and(|e| at >= START_MS + (e * 1000.0) as Millis + linger);
                    if done && self.waiting == 0 && (active == 0 || settled) {
                        break;
                    }
                    let stalled = self.waiting > 0 && at >= self.admitted.1 + STALL_MS;
                    if at >= arrivals_end + MAX_DRAIN_MS || stalled {
                        self.summary.stopped_early = self.waiting > 0;
                        break;
                    }
                    self.schedule(at + TICK_MS, Event::Tick);
                }
                Event::Poll(i) => self.poll(i, at).await?,
                Event::CheckIn(i) => self.check_in(i, at).await?,
                Event::Leave(i) => {
                    let id = self.visitors[i as usize].id;
                    self.store.end(&self.policy, id, End::Release, at).await?;
                }
            }
        }
        Ok(())
    }

    /// Reads the room's figures as the daemon does once a second; returns
    /// the active sessions.
    async fn tick(&mut self, now: Millis) -> Result<u64, StoreError> {
        let stats = self.store.stats(&self.policy, now).await?;
        let totals = self.store.totals(&self.policy).await?;
        if totals.admitted != self.admitted.0 {
            self.admitted = (totals.admitted, now);
        }
        self.tracker
            .observe(&stats, Some(&totals), &self.policy, now);
        let eta_back = self
            .tracker
            .eta_seconds(stats.queued, &self.policy, self.refresh());
        let s = &mut self.summary;
        s.max_active = s.max_active.max(stats.active);
        if stats.queued > s.peak_queue {
            s.peak_queue = stats.queued;
            s.peak_queue_at = seconds(now);
        }
        s.peak_admissions_per_minute = s.peak_admissions_per_minute.max(stats.admitted_last_minute);
        s.dropped = totals.abandoned;
        self.samples.push(Sample {
            t: ((now - START_MS) / 1000) as u32,
            active: stats.active,
            queued: stats.queued,
            admitted_last_minute: stats.admitted_last_minute,
            eta_back,
            eta_rate: self.tracker.per_second(),
        });
        Ok(stats.active)
    }

    async fn arrive(&mut self, now: Millis) -> Result<(), StoreError> {
        let i = self.visitors.len() as u32;
        let id = VisitorId(self.rng.gen());
        self.summary.arrived += 1;
        let verdict = self
            .store
            .arrive(&self.policy, id, 0, Arrival::New, now)
            .await?;
        let mut visitor = Visitor {
            id,
            joined: now,
            seq: 0,
            told: None,
            last_told: 0,
            admitted: None,
            gives_up: None,
            leaves: 0,
            session_expires: 0,
        };
        match verdict {
            Verdict::Admitted { session_expires_ms } => {
                self.summary.admitted_at_once += 1;
                visitor.admitted = Some(now);
                visitor.session_expires = session_expires_ms;
                self.visitors.push(visitor);
                self.on_site(i, now);
            }
            Verdict::Queued(place) => {
                if self.summary.queue_formed_at.is_none() {
                    let stats = self.store.stats(&self.policy, now).await?;
                    self.summary.queue_formed_at = Some(seconds(now));
                    self.summary.utilization_when_queueing_started =
                        (self.policy.total_active_users > 0)
                            .then(|| stats.active as f64 / self.policy.total_active_users as f64);
                }
                self.summary.queued += 1;
                self.waiting += 1;
                let told = self
                    .tracker
                    .eta_seconds(place.position, &self.policy, self.refresh());
                visitor.seq = place.seq;
                visitor.told = Some(told);
                visitor.last_told = told;
                if self.rng.gen::<f64>() < self.crowd.abandon {
                    // Patience runs out some time before the wait told (or
                    // within ten minutes when nothing was told).
                    let horizon = if told > 0 { told * 1000 } else { 600_000 };
                    visitor.gives_up = Some(now + self.rng.gen_range(0..horizon.max(1)));
                }
                self.visitors.push(visitor);
                let delay = self.poll_delay();
                self.schedule(now + delay, Event::Poll(i));
            }
            Verdict::Rejected(_) | Verdict::Ended => {
                self.summary.rejected += 1;
                self.visitors.push(visitor);
            }
        }
        Ok(())
    }

    async fn poll(&mut self, i: u32, now: Millis) -> Result<(), StoreError> {
        let v = &mut self.visitors[i as usize];
        if v.gives_up.is_some_and(|at| now >= at) {
            self.summary.gave_up += 1;
            self.waiting -= 1;
            return Ok(());
        }
        let (id, seq) = (v.id, v.seq);
        match self.store.poll(&self.policy, id, 0, seq, now).await? {
            Verdict::Admitted { session_expires_ms } => {
                let v = &mut self.visitors[i as usize];
                v.admitted = Some(now);
                v.session_expires = session_expires_ms;
                self.summary.admitted_from_queue += 1;
                self.waiting -= 1;
                self.on_site(i, now);
            }
            Verdict::Queued(place) => {
                let told = self
                    .tracker
                    .eta_seconds(place.position, &self.policy, self.refresh());
                let v = &mut self.visitors[i as usize];
                let (a, b) = (v.last_told.max(1) as f64, told.max(1) as f64);
                self.largest_jump = self.largest_jump.max(a.max(b) / a.min(b));
                v.last_told = told;
                let delay = self.poll_delay();
                self.schedule(now + delay, Event::Poll(i));
            }
            Verdict::Rejected(_) | Verdict::Ended => {
                self.summary.rejected += 1;
                self.waiting -= 1;
            }
        }
        Ok(())
    }

    /// An admitted visitor browses for a while, then leaves.
    fn on_site(&mut self, i: u32, now: Millis) {
        let mean = self.crowd.time_on_site.as_millis() as f64;
        // Exponential: most visitors look briefly, a few stay long.
        let u: f64 = self.rng.gen();
        let stay = (-mean * (1.0 - u).ln()).max(1.0) as Millis;
        self.visitors[i as usize].leaves = now + stay;
        self.schedule(now + stay, Event::Leave(i));
        let every = self.room.check_in_interval().as_millis() as Millis;
        if every < stay {
            self.schedule(now + every, Event::CheckIn(i));
        }
    }

    async fn check_in(&mut self, i: u32, now: Millis) -> Result<(), StoreError> {
        let v = &self.visitors[i as usize];
        let (id, expires, leaves) = (v.id, v.session_expires, v.leaves);
        if let Some(renewed) = self.store.check_in(&self.policy, id, expires, now).await? {
            self.visitors[i as usize].session_expires = renewed;
            let next = now + self.room.check_in_interval().as_millis() as Millis;
            if next < leaves {
                self.schedule(next, Event::CheckIn(i));
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Outcome {
        let waits: Vec<Wait> = self
            .visitors
            .iter()
            .filter_map(|v| {
                Some(Wait {
                    arrived: seconds(v.joined),
                    told: v.told?,
                    waited: v.admitted.map(|a| (a - v.joined) as f64 / 1000.0),
                })
            })
            .collect();
        let mut waited: Vec<f64> = waits.iter().filter_map(|w| w.waited).collect();
        waited.sort_by(f64::total_cmp);
        let mut errors: Vec<f64> = waits
            .iter()
            .filter_map(|w| {
                let real = w.waited.filter(|&r| r > 0.0)?;
                Some((w.told as f64 - real).abs() / real)
            })
            .collect();
        errors.sort_by(f64::total_cmp);
        let s = &mut self.summary;
        s.longest_wait = waited.last().copied();
        s.median_wait = quantile(&waited, 0.5);
        s.p90_wait = quantile(&waited, 0.9);
        s.eta_error_median = quantile(&errors, 0.5);
        s.eta_error_p90 = quantile(&errors, 0.9);
        s.largest_eta_jump = (s.queued > 0).then_some(self.largest_jump);
        s.simulated = self.samples.last().map_or(0.0, |x| f64::from(x.t));
        Outcome {
            samples: self.samples,
            waits,
            summary: self.summary,
        }
    }
}

/// Seconds since the start of the run.
fn seconds(at: Millis) -> f64 {
    at.saturating_sub(START_MS) as f64 / 1000.0
}

/// The value at quantile `q` of sorted `xs`.
pub fn quantile(xs: &[f64], q: f64) -> Option<f64> {
    (!xs.is_empty()).then(|| xs[((xs.len() - 1) as f64 * q).round() as usize])
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Seconds as `1:02:03` or `2:03`.
pub fn clock(seconds: f64) -> String {
    let s = seconds.round() as u64;
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

impl fmt::Display for Summary {
    /// A Markdown table: readable in a terminal, pastable into a document.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = |n: u64| thousands(n);
        let time = |s: Option<f64>| s.map_or_else(|| "-".to_owned(), clock);
        let share =
            |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |x| format!("{:.1}%", x * 100.0));
        let limits = match (self.limit, self.rate_limit) {
            (0, 0) => "no limits".to_owned(),
            (l, 0) => format!("{} places", count(l)),
            (0, r) => format!("{} a minute", count(r)),
            (l, r) => format!("{} places, {} a minute", count(l), count(r)),
        };
        let mut rows: Vec<(&str, String)> = vec![
            ("room", format!("{} ({limits})", self.room)),
            ("visitors", count(self.arrived)),
            ("let in at once", count(self.admitted_at_once)),
            ("queued", count(self.queued)),
            ("let in from the queue", count(self.admitted_from_queue)),
            ("gave up waiting", count(self.gave_up)),
            ("places dropped (abandon_after)", count(self.dropped)),
            ("turned away", count(self.rejected)),
            (
                "most active at once",
                format!("{} of {}", count(self.max_active), count(self.limit)),
            ),
            (
                "peak queue",
                format!(
                    "{} at {}",
                    count(self.peak_queue),
                    clock(self.peak_queue_at)
                ),
            ),
            (
                "peak admissions a minute",
                count(self.peak_admissions_per_minute),
            ),
        ];
        rows.push((
            "queue formed at",
            match (self.queue_formed_at, self.utilization_when_queueing_started) {
                (Some(at), Some(u)) => {
                    format!("{} with {:.0}% of places in use", clock(at), u * 100.0)
                }
                (Some(at), None) => clock(at),
                (None, _) => "never".to_owned(),
            },
        ));
        rows.push((
            "queue empty at",
            match self.queue_empty_at {
                Some(at) => clock(at),
                None if self.stopped_early => {
                    format!("not yet when the run stopped at {}", clock(self.simulated))
                }
                None => "-".to_owned(),
            },
        ));
        rows.push(("longest wait", time(self.longest_wait)));
        rows.push(("median wait", time(self.median_wait)));
        rows.push(("90th percentile wait", time(self.p90_wait)));
        rows.push((
            "ETA told on arrival, error (median / p90)",
            format!(
                "{} / {}",
                share(self.eta_error_median),
                share(self.eta_error_p90)
            ),
        ));
        rows.push((
            "largest ETA change between two polls",
            self.largest_eta_jump
                .map_or_else(|| "-".to_owned(), |j| format!("{j:.1}x")),
        ));
        let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        let value_width = rows.iter().map(|r| r.1.len()).max().unwrap_or(0);
        writeln!(f, "| {:width$} | {:value_width$} |", "figure", "value")?;
        writeln!(
            f,
            "|{}|{}:|",
            "-".repeat(width + 2),
            "-".repeat(value_width + 1)
        )?;
        for (name, value) in rows {
            writeln!(f, "| {name:width$} | {value:>value_width$} |")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crowd(peak: f64) -> Crowd {
        Crowd {
            peak_per_second: peak,
            ramp: Duration::from_secs(60),
            duration: Duration::from_secs(300),
            time_on_site: Duration::from_secs(180),
            abandon: 0.1,
            seed: 1,
        }
    }

    #[test]
    fn the_profile_ramps_holds_and_falls() {
        let c = crowd(100.0);
        assert_eq!(c.rate_at(-1.0), 0.0);
        assert_eq!(c.rate_at(30.0), 50.0);
        assert_eq!(c.rate_at(150.0), 100.0);
        assert_eq!(c.rate_at(270.0), 50.0);
        assert_eq!(c.rate_at(300.0), 0.0);
        assert_eq!(c.expected_visitors(), 24_000.0);
        let peak = Crowd::peak_for(24_000, c.ramp, c.duration).unwrap();
        assert!((peak - 100.0).abs() < 1e-9);
        // A ramp longer than half the run makes a triangle.
        let mut t = crowd(10.0);
        t.ramp = Duration::from_secs(1000);
        assert_eq!(t.rate_at(150.0), 10.0);
        assert_eq!(t.expected_visitors(), 1500.0);
    }

    #[test]
    fn bad_crowds_are_refused_by_option() {
        let mut c = crowd(0.0);
        assert_eq!(c.check(), Err(CrowdError::Peak(0.0)));
        c.peak_per_second = 1.0;
        c.abandon = 1.5;
        assert_eq!(
            c.check().unwrap_err().to_string(),
            "--abandon must be a share between 0 and 1; got 1.5"
        );
        assert_eq!(
            Crowd::peak_for(0, c.ramp, c.duration),
            Err(CrowdError::Visitors)
        );
    }

    #[test]
    fn arrivals_follow_the_profile() {
        let c = crowd(50.0);
        let mut rng = StdRng::seed_from_u64(3);
        let (mut n, mut t, mut in_ramp) = (0u32, 0.0, 0u32);
        while let Some(next) = c.next_arrival(&mut rng, t) {
            n += 1;
            in_ramp += u32::from(next < 60.0);
            t = next;
        }
        // 12,000 expected; 1,500 in the first minute.
        assert!((11_700..12_300).contains(&n), "{n}");
        assert!((1_380..1_620).contains(&in_ramp), "{in_ramp}");
    }

    #[test]
    fn figures_read_for_people() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(50_000), "50,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(clock(59.6), "1:00");
        assert_eq!(clock(3_723.0), "1:02:03");
    }
}
