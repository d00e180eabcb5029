//! Prometheus metrics: typed handles created once at start-up (per room when
//! the gate is built), so the request path only bumps atomics.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::dwell::TimeOnOrigin;
use super::exposition::{self, Format};
use super::wait::{QueueWait, WaitHour, WaitSummary, PROMETHEUS_BUCKETS};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoomLabel {
    room: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    room: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LaneLabel {
    room: String,
    lane: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    room: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabel {
    class: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 0.1 ms .. ~3.3 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

fn wait_histogram() -> Histogram {
    Histogram::new(PROMETHEUS_BUCKETS)
}

/// Every metric the daemon exports. Lives as long as the daemon (config
/// reloads keep it), so counters never reset while it runs.
pub struct Metrics {
    registry: Registry,
    /// Region mode (`crate::region`); unused in the central mode.
    pub region: RegionMetrics,
    active: Family<RoomLabel, Gauge>,
    queued: Family<RoomLabel, Gauge>,
    limit: Family<RoomLabel, Gauge>,
    /// Items left, while the room counts them.
    stock: Family<RoomLabel, Gauge>,
    /// `new_users_per_minute` in force in rooms with `[room.autotune]`.
    autotune_rate: Family<RoomLabel, Gauge>,
    admitted_last_minute: Family<RoomLabel, Gauge>,
    eta: Family<RoomLabel, Gauge>,
    /// Cumulative counts from the store, shared by every instance.
    store_totals: Family<KindLabel, Gauge>,
    /// Outcomes of this instance's decisions.
    decisions: Family<OutcomeLabel, Counter>,
    /// Fetches of the rooms' JWKS URLs by outcome (ok, failed, invalid).
    jwks_fetches: Family<OutcomeLabel, Counter>,
    /// Visitors who entered a priority lane, and who were let in from one.
    lane_decisions: Family<LaneLabel, Counter>,
    decision_latency: HistogramFamily<RoomLabel>,
    /// Time in queue of visitors let in from the queue by this instance.
    queue_wait: HistogramFamily<RoomLabel>,
    /// The same waits, the last hour by minute, per room (for the dashboard).
    wait_hours: Mutex<HashMap<String, Arc<Mutex<WaitHour>>>>,
    /// Each room's visitors' time on origin (for its report).
    stays: Mutex<HashMap<String, TimeOnOrigin>>,
    store_errors: Counter,
    store_busy: Counter,
    store_up: Gauge,
    proxy_responses: Family<ClassLabel, Counter>,
    /// The five status-class counters, looked up once: bumped on every response.
    by_class: [Counter; 5],
    origin_latency: Histogram,
}

/// The handles of one room, cloned out of the families once.
#[derive(Clone)]
pub struct RoomMetrics {
    pub(crate) admitted: Counter,
    pub(crate) queued: Counter,
    pub(crate) rejected: Counter,
    pub(crate) revoked: Counter,
    /// New visitors refused because their address asked for tickets too fast.
    pub limited: Counter,
    /// Admitted sessions ended because they were used from more networks
    /// than `cookie.max_networks_per_session` (a shared ticket).
    pub shared: Counter,
    /// Proof-of-work challenges handed out.
    pub challenged: Counter,
    /// Proof-of-work solutions refused (forged, expired, too weak, replayed).
    pub proof_refused: Counter,
    /// Newcomers and polls answered "busy": this instance ran too late to
    /// decide in time (`gate::lag`).
    pub shed: Counter,
    /// Newcomers sent to the shadow queue (a failed challenge, a bot score
    /// below the room's minimum).
    pub shadowed: Counter,
    /// Newcomers `failed_challenge = "log"` would have shadowed.
    pub would_shadow: Counter,
    /// Captcha tokens the provider took, and refused (or gave no verdict
    /// on, or another network handed in first).
    pub captcha_passed: Counter,
    pub(crate) captcha_failed: Counter,
    /// Captcha tokens passed unverified: the verifier gave no answer while
    /// it was down for most visitors and `challenge_on_error = "open"`.
    pub captcha_open_passed: Counter,
    /// Captcha tokens not checked because every verification slot was
    /// taken (`challenge_concurrency`): the visitor hands it in again.
    pub captcha_busy: Counter,
    /// Enqueue tokens verified, refused (missing where required, forged,
    /// expired, another room or address), replayed (a `jti` seen before),
    /// and arrivals of a `sub` the room had seen (folded into its place).
    pub token_verified: Counter,
    pub(crate) token_refused: Counter,
    pub(crate) token_replayed: Counter,
    pub(crate) token_folded: Counter,
    /// Fetches of the room's JWKS URL: ok, failed, invalid.
    pub(crate) jwks_fetches: [Counter; 3],
    /// Lane codes refused (unknown, or single-use and used): the visitor
    /// waits in the general queue.
    pub lane_code_refused: Counter,
    /// Per priority lane (lane 1 first): visitors who entered it, and who
    /// were let in from it.
    pub lanes: Vec<LaneMetrics>,
    pub(crate) decision_latency: Histogram,
    /// Where a queued visitor's wait is recorded when its poll is admitted.
    pub queue_wait: QueueWait,
    /// Where an admitted visitor's stay is followed.
    pub time_on_origin: TimeOnOrigin,
}

/// One priority lane's counts.
#[derive(Clone)]
pub struct LaneMetrics {
    pub name: String,
    pub entered: Counter,
    pub admitted: Counter,
}

/// Live figures of a room, as the refresh task reads them.
pub struct RoomFigures {
    pub active: u64,
    pub queued: u64,
    pub limit: u64,
    /// Items left (`None`: not counted; the series is removed).
    pub stock: Option<u64>,
    /// The rate in force, for rooms autotune moves (`None`: off).
    pub autotune_rate: Option<u64>,
    pub admitted_last_minute: u64,
    pub eta_seconds: u64,
    pub totals: Option<crate::store::RoomTotals>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub(crate) fn new() -> Self {
        Self::with_webhooks(None)
    }

    /// The daemon's metrics, the webhooks' figures among them.
    pub(crate) fn with_webhooks(webhooks: Option<crate::webhook::Metrics>) -> Self {
        let mut registry = Registry::with_prefix("waitroom");
        if let Some(webhooks) = webhooks {
            registry.register_collector(Box::new(webhooks));
        }
        let m = Self {
            region: RegionMetrics::default(),
            active: Family::default(),
            queued: Family::default(),
            limit: Family::default(),
            stock: Family::default(),
            autotune_rate: Family::default(),
            admitted_last_minute: Family::default(),
            eta: Family::default(),
            store_totals: Family::default(),
            decisions: Family::default(),
            jwks_fetches: Family::default(),
            lane_decisions: Family::default(),
            decision_latency: Family::new_with_constructor(latency_histogram),
            queue_wait: Family::new_with_constructor(wait_histogram),
            wait_hours: Mutex::default(),
            stays: Mutex::default(),
            store_errors: Counter::default(),
            store_busy: Counter::default(),
            store_up: Gauge::default(),
            proxy_responses: Family::default(),
            by_class: Default::default(),
            origin_latency: latency_histogram(),
            registry: Registry::default(),
        };
        registry.register("room_active", "Active sessions", m.active.clone());
        registry.register("room_queued", "Visitors waiting", m.queued.clone());
        registry.register("room_limit", "total_active_users in force", m.limit.clone());
        registry.register(
            "room_stock",
            "Items left, as the origin or an operator last said (rooms that count them)",
            m.stock.clone(),
        );
        registry.register(
            "room_autotune_rate",
            "new_users_per_minute in force in rooms with [room.autotune]",
            m.autotune_rate.clone(),
        );
        registry.register(
            "room_admitted_last_minute",
            "Admissions in the last 60 s (all instances)",
            m.admitted_last_minute.clone(),
        );
        registry.register(
            "room_eta_seconds",
            "Estimated wait at the back of the queue",
            m.eta.clone(),
        );
        registry.register(
            "room_store_totals",
            "Cumulative admitted/queued/rejected/abandoned counts kept by the store (all instances)",
            m.store_totals.clone(),
        );
        registry.register(
            "decisions",
            "This instance's decisions by outcome (admitted, queued, rejected, revoked, limited, shared, challenged, proof_refused, shed, shadowed, would_shadow, captcha_*, token_*, lane_code_refused)",
            m.decisions.clone(),
        );
        registry.register(
            "jwks_fetches",
            "Fetches of a room's enqueue-token JWKS URL by outcome: ok, failed (no answer, an error status), invalid (not a JWKS; the last good set kept)",
            m.jwks_fetches.clone(),
        );
        registry.register(
            "lane_decisions",
            "This instance's priority-lane decisions by lane and outcome (entered, admitted)",
            m.lane_decisions.clone(),
        );
        registry.register(
            "decision_latency_seconds",
            "Time of one store decision",
            m.decision_latency.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "Time in queue of visitors let in from the queue (this instance's polls)",
            m.queue_wait.clone(),
        );
        registry.register(
            "store_errors",
            "Store calls that failed: the store unreachable past store.unreachable_after (fail_mode applies), or answering wrongly",
            m.store_errors.clone(),
        );
        registry.register(
            "store_busy",
            "Store calls that timed out or failed while the store still answered (busy, not unreachable): answered busy, retry; fail_mode not applied",
            m.store_busy.clone(),
        );
        registry.register(
            "store_up",
            "1 while the store answers, 0 while it does not",
            m.store_up.clone(),
        );
        registry.register(
            "proxy_responses",
            "Responses to visitors by status class",
            m.proxy_responses.clone(),
        );
        registry.register(
            "origin_latency_seconds",
            "Time to the origin's response headers",
            m.origin_latency.clone(),
        );
        m.region.register(&mut registry);
        m.store_up.set(1);
        let by_class = ["1xx", "2xx", "3xx", "4xx", "5xx"]
            .map(|class| m.proxy_responses.get_or_create_owned(&ClassLabel { class }));
        Self {
            registry,
            by_class,
            ..m
        }
    }

    /// Handles for one room (created once per room when the gate is built).
    pub fn room(&self, room: &str) -> RoomMetrics {
        let outcome = |outcome| {
            self.decisions.get_or_create_owned(&OutcomeLabel {
                room: room.to_owned(),
                outcome,
            })
        };
        RoomMetrics {
            admitted: outcome("admitted"),
            queued: outcome("queued"),
            rejected: outcome("rejected"),
            revoked: outcome("revoked"),
            limited: outcome("limited"),
            shared: outcome("shared"),
            challenged: outcome("challenged"),
            proof_refused: outcome("proof_refused"),
            shed: outcome("shed"),
            shadowed: outcome("shadowed"),
            would_shadow: outcome("would_shadow"),
            captcha_passed: outcome("captcha_passed"),
            captcha_failed: outcome("captcha_failed"),
            captcha_open_passed: outcome("captcha_open_passed"),
            captcha_busy: outcome("captcha_busy"),
            token_verified: outcome("token_verified"),
            token_refused: outcome("token_refused"),
            token_replayed: outcome("token_replayed"),
            token_folded: outcome("token_folded"),
            jwks_fetches: ["ok", "failed", "invalid"].map(|outcome| {
                self.jwks_fetches.get_or_create_owned(&OutcomeLabel {
                    room: room.to_owned(),
                    outcome,
                })
            }),
            lane_code_refused: outcome("lane_code_refused"),
            lanes: Vec::new(),
            decision_latency: self.decision_latency.get_or_create_owned(&RoomLabel {
                room: room.to_owned(),
            }),
            queue_wait: QueueWait {
                seconds: self.queue_wait.get_or_create_owned(&RoomLabel {
                    room: room.to_owned(),
                }),
                hour: self
                    .wait_hours
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(room.to_owned())
                    .or_default()
                    .clone(),
            },
            time_on_origin: self
                .stays
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(room.to_owned())
                .or_default()
                .clone(),
        }
    }

    /// [`Metrics::room`] for a room with priority lanes named `lanes`.
    pub fn room_with_lanes(&self, room: &str, lanes: &[String]) -> RoomMetrics {
        let lane = |name: &str, outcome| {
            self.lane_decisions.get_or_create_owned(&LaneLabel {
                room: room.to_owned(),
                lane: name.to_owned(),
                outcome,
            })
        };
        RoomMetrics {
            lanes: lanes
                .iter()
                .map(|name| LaneMetrics {
                    name: name.clone(),
                    entered: lane(name, "entered"),
                    admitted: lane(name, "admitted"),
                })
                .collect(),
            ..self.room(room)
        }
    }

    /// Every room's time in queue over the hour up to `now`.
    pub fn queue_waits(&self, now: u64) -> HashMap<String, WaitSummary> {
        let hours: Vec<(String, Arc<Mutex<WaitHour>>)> = self
            .wait_hours
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(room, hour)| (room.clone(), hour.clone()))
            .collect();
        hours
            .into_iter()
            .map(|(room, hour)| {
                let summary = hour.lock().unwrap_or_else(|p| p.into_inner()).summary(now);
                (room, summary)
            })
            .collect()
    }

    /// Publishes a room's live figures (from the background refresh, not the request path).
    pub fn set_room(&self, room: &str, f: &RoomFigures) {
        let label = RoomLabel {
            room: room.to_owned(),
        };
        let set = |family: &Family<RoomLabel, Gauge>, v: u64| {
            family
                .get_or_create(&label)
                .set(v.min(i64::MAX as u64) as i64);
        };
        set(&self.active, f.active);
        set(&self.queued, f.queued);
        set(&self.limit, f.limit);
        match f.stock {
            Some(stock) => set(&self.stock, stock),
            None => {
                self.stock.remove(&label);
            }
        }
        match f.autotune_rate {
            Some(rate) => set(&self.autotune_rate, rate),
            None => {
                self.autotune_rate.remove(&label);
            }
        }
        set(&self.admitted_last_minute, f.admitted_last_minute);
        set(&self.eta, f.eta_seconds);
        if let Some(t) = f.totals {
            for (kind, v) in [
                ("admitted", t.admitted),
                ("queued", t.queued),
                ("rejected", t.rejected),
                ("abandoned", t.abandoned),
            ] {
                self.store_totals
                    .get_or_create(&KindLabel {
                        room: room.to_owned(),
                        kind,
                    })
                    .set(v.min(i64::MAX as u64) as i64);
            }
        }
    }

    /// A store call that got no answer from a store that still answers.
    pub fn store_busy(&self) {
        self.store_busy.inc();
    }

    pub(crate) fn store_error(&self) {
        self.store_errors.inc();
    }

    pub(crate) fn set_store_up(&self, up: bool) {
        self.store_up.set(i64::from(up));
    }

    pub(crate) fn response(&self, status: http::StatusCode) {
        let class = usize::from(status.as_u16() / 100).clamp(1, 5) - 1;
        self.by_class[class].inc();
    }

    pub(crate) fn origin_latency(&self, seconds: f64) {
        self.origin_latency.observe(seconds);
    }

    /// The exposition in `format` (see `super::exposition`).
    pub(crate) fn encode(&self, format: Format) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        match format {
            Format::OpenMetrics { .. } => out,
            Format::Classic => exposition::classic(&out),
        }
    }
}

/// Region mode's metrics (`crate::region`), updated by the background sync
/// and the Anywhere path.
#[derive(Default)]
pub struct RegionMetrics {
    grant: Family<RoomLabel, Gauge>,
    rate_grant: Family<RoomLabel, Gauge>,
    anywhere: Family<RoomLabel, Counter>,
    sync_failures: Counter,
    degraded: Gauge,
}

impl RegionMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "region_grant",
            "Sessions this region may hold at once (its grant from the global store)",
            self.grant.clone(),
        );
        registry.register(
            "region_rate_grant",
            "Admissions this region may make per rate window (its admission tokens from the global store)",
            self.rate_grant.clone(),
        );
        registry.register(
            "region_anywhere_slots",
            "Slots this region took from the global Anywhere pool for new visitors",
            self.anywhere.clone(),
        );
        registry.register(
            "region_sync_failures",
            "Calls to the global store that failed or timed out",
            self.sync_failures.clone(),
        );
        registry.register(
            "region_degraded",
            "1 while the global store is unreachable (the region decides within its grant)",
            self.degraded.clone(),
        );
    }

    pub fn set_grant(&self, room: &str, grant: u64) {
        self.grant
            .get_or_create(&RoomLabel {
                room: room.to_owned(),
            })
            .set(grant.min(i64::MAX as u64) as i64);
    }

    pub fn set_rate_grant(&self, room: &str, grant: u64) {
        self.rate_grant
            .get_or_create(&RoomLabel {
                room: room.to_owned(),
            })
            .set(grant.min(i64::MAX as u64) as i64);
    }

    pub fn anywhere(&self, room: &str, slots: u64) {
        self.anywhere
            .get_or_create(&RoomLabel {
                room: room.to_owned(),
            })
            .inc_by(slots);
    }

    pub fn sync_failed(&self) {
        self.sync_failures.inc();
    }

    pub fn set_degraded(&self, degraded: bool) {
        self.degraded.set(i64::from(degraded));
    }
}
