//! The admission path: every visitor request goes through these phases, in
//! this order (drawn in `docs/request-phases.md`):
//!
//! 1. **route**: reserved prefix -> the daemon answers; otherwise match a room
//!    by host and longest path prefix (no room: forward or 404).
//! 2. **bypass**: bypass paths, client addresses or the secret header forward
//!    without a ticket.
//! 3. **ticket**: open the room's cookie. Admitted and live -> forward without
//!    a store round trip (check in when due). Queued -> poll the store.
//!    Missing or invalid -> a new visitor: one `arrive` decision.
//! 4. **respond**: admitted -> forward to the origin (cookie re-issued when it
//!    changed); queued -> queue page or JSON; rejected -> a 503 page.
//!
//! Every store call is bounded by `store.timeout`; what happens past it is
//! `store.fail_mode`.

pub mod eta;
pub mod poll_limit;
pub mod rooms;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cookie::{Cookie, SameSite};
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::admin::Telemetry;
use crate::body::{full, Body};
use crate::clock::SharedClock;
use crate::config::{Config, FailMode, Unmatched};
use crate::proxy::{self, headers, Forward, Proxy};
use crate::queue_page::{self, Message, QueueView, Status, Template, VisitorState};
use crate::store::memory::MemoryStore;
use crate::store::{
    QueuePlace, RejectReason, RoomPolicy, SharedStore, Store, StoreError, Verdict, VisitorId,
};
use crate::ticket::{Grant, KeyRing, Ticket};

use poll_limit::AddressLimit;
pub use rooms::{Room, Rooms};

/// Tells the origin who the admitted visitor is.
pub const X_WAITROOM_VISITOR: HeaderName = HeaderName::from_static("x-waitroom-visitor");
/// The origin's way to end a visitor's session early (`revoke`).
pub const X_WAITROOM_COMMAND: HeaderName = HeaderName::from_static("x-waitroom-command");

/// Everything the admission path needs, built once from the config.
pub struct Gate {
    pub rooms: Rooms,
    keys: KeyRing,
    pub store: SharedStore,
    pub clock: SharedClock,
    proxy: Proxy,
    reserved_prefix: String,
    unmatched: Unmatched,
    trusted_proxies: Vec<ipnet::IpNet>,
    cookie_secure: bool,
    store_timeout: Duration,
    fail_mode: FailMode,
    /// Whether the last store call failed; logs transitions once.
    store_down: AtomicBool,
    /// While the store is down: when (ms after `started`) to probe it again; 0 = up.
    retry_at_ms: AtomicU64,
    started: Instant,
    /// This instance's own store for `fail_mode = "local"`.
    local: Option<Arc<MemoryStore>>,
    /// Instances sharing the store (the local share is 1/instances).
    instances: u64,
    pub telemetry: Arc<Telemetry>,
    /// How often one client address may poll.
    ip_limit: AddressLimit,
    access_log: bool,
    /// When idle poll-limit entries were last forgotten (clock ms).
    limits_swept_at: AtomicU64,
}

/// How often idle poll-limit entries are forgotten.
const SWEEP_LIMITS_MS: u64 = 30_000;

/// How long the store is left alone after a failure before one request
/// probes it again, so a frozen store does not cost every request the
/// whole timeout.
const STORE_RETRY_MS: u64 = 1000;

/// Where a decision is made.
struct Via<'a> {
    store: &'a dyn Store,
    metrics: &'a crate::admin::metrics::RoomMetrics,
    policy: Arc<RoomPolicy>,
    /// The shared store (bounded, breaker) or this instance's own.
    shared: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error(transparent)]
    Template(#[from] queue_page::TemplateError),
    #[error("origin: {0}")]
    Origin(#[from] proxy::OriginError),
}

/// The outcome of the ticket phase.
enum Decision {
    /// Forward, re-issuing the cookie when `ticket` is set.
    Forward {
        visitor: VisitorId,
        ticket: Option<Ticket>,
    },
    /// Show the queue (or the JSON) with this cookie.
    Queued {
        place: QueuePlace,
        ticket: Ticket,
    },
    Rejected(RejectReason),
    /// A queued visitor (or its address) polls too often: 429, place kept.
    SlowDown(Duration),
}

impl Gate {
    pub fn new(
        config: &Config,
        store: SharedStore,
        clock: SharedClock,
        telemetry: Arc<Telemetry>,
    ) -> Result<Self, GateError> {
        let mut rooms = Vec::with_capacity(config.rooms.len());
        for room in &config.rooms {
            if !room.events.is_empty() {
                tracing::warn!(room = %room.id, "[[room.event]] is validated but not applied yet: the room's own limits stay in force");
            }
            let template = match &room.template {
                Some(path) => Template::load(path)?,
                None => Template::builtin(),
            };
            let metrics = telemetry.metrics.room(&room.id);
            rooms.push(Arc::new(Room::new(
                room.clone(),
                template,
                metrics,
                clock.clone(),
            )));
        }
        Ok(Self {
            rooms: Rooms::new(rooms),
            keys: KeyRing::new(&config.cookie.keys),
            store,
            proxy: Proxy::new(&config.origin)?,
            reserved_prefix: config.server.reserved_prefix.clone(),
            unmatched: config.server.unmatched,
            trusted_proxies: config.server.trusted_proxies.clone(),
            cookie_secure: config.cookie.secure,
            store_timeout: config.store.timeout,
            fail_mode: config.store.fail_mode,
            store_down: AtomicBool::new(false),
            retry_at_ms: AtomicU64::new(0),
            started: Instant::now(),
            local: (config.store.fail_mode == FailMode::Local)
                .then(|| Arc::new(MemoryStore::new())),
            instances: config.store.instances.max(1),
            telemetry,
            ip_limit: AddressLimit::new(
                config.server.ip_polls_per_second,
                config.server.ip_poll_burst,
                clock.clone(),
            ),
            clock,
            limits_swept_at: AtomicU64::new(0),
            access_log: config.server.access_log,
        })
    }

    /// Reads every room's live figures: folds them into its ETA rate and
    /// publishes them as metrics and dashboard history.
    pub async fn refresh_room_figures(&self) {
        let now = self.clock.now_ms();
        if now.saturating_sub(self.limits_swept_at.swap(now, Ordering::Relaxed)) >= SWEEP_LIMITS_MS
        {
            for room in self.rooms.all() {
                room.poll_limit.forget_idle();
            }
            self.ip_limit.forget_idle();
        } else {
            // Not due yet: keep the older sweep time.
            self.limits_swept_at.fetch_min(now, Ordering::Relaxed);
        }
        for room in self.rooms.all() {
            let now = self.clock.now_ms();
            let policy = room.policy();
            let stats = match self.bounded(self.store.stats(&policy, now)).await {
                Ok(stats) => stats,
                Err(e) => {
                    tracing::debug!(room = %room.config.id, error = %e, "room figures unavailable");
                    continue;
                }
            };
            let totals = self.bounded(self.store.totals(&policy)).await.ok();
            room.rate.observe(&stats, totals.as_ref(), now);
            let eta_seconds = room.rate.eta_seconds(stats.queued, &policy);
            self.telemetry.metrics.set_room(
                &room.config.id,
                &crate::admin::metrics::RoomFigures {
                    active: stats.active,
                    queued: stats.queued,
                    limit: policy.total_active_users,
                    admitted_last_minute: stats.admitted_last_minute,
                    eta_seconds,
                    totals,
                },
            );
            self.telemetry.history.record(
                &room.config.id,
                crate::admin::history::Sample {
                    t: now,
                    active: stats.active,
                    limit: policy.total_active_users,
                    queued: stats.queued,
                    admitted_per_minute: stats.admitted_last_minute,
                    eta_seconds,
                },
            );
        }
    }

    /// Reads the operators' runtime changes for every room and applies them.
    pub async fn refresh_overrides(&self) {
        for room in self.rooms.all() {
            match self.bounded(self.store.overrides(&room.config.id)).await {
                Ok(o) => {
                    room.apply_overrides(o.as_ref());
                }
                Err(e) => {
                    tracing::debug!(room = %room.config.id, error = %e, "room overrides unavailable")
                }
            }
        }
    }

    /// Whether the store answers within its timeout.
    pub async fn store_ready(&self) -> bool {
        match self.rooms.all().first() {
            Some(room) => self
                .bounded(self.store.stats(&room.policy(), self.clock.now_ms()))
                .await
                .is_ok(),
            None => true,
        }
    }

    /// Answers one visitor request. Never fails: every error becomes a page.
    pub async fn handle(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
        if !self.access_log {
            let resp = self.phases(req, peer).await;
            self.telemetry.metrics.response(resp.status());
            return resp;
        }
        let started = Instant::now();
        let (method, path) = (req.method().clone(), req.uri().path().to_owned());
        let resp = self.phases(req, peer).await;
        self.telemetry.metrics.response(resp.status());
        tracing::info!(
            target: "waitroom::access",
            %method,
            path,
            status = resp.status().as_u16(),
            ms = started.elapsed().as_secs_f64() * 1000.0,
            peer = %peer.ip(),
            "access"
        );
        resp
    }

    async fn phases(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
        let peer_ip = peer.ip();
        let client = headers::client_ip(req.headers(), peer_ip, &self.trusted_proxies);
        let fwd = Forward {
            peer: peer_ip,
            peer_trusted: headers::is_trusted(peer_ip, &self.trusted_proxies),
        };

        // Phase 1: route.
        let path = req.uri().path();
        if let Some(rest) = path.strip_prefix(self.reserved_prefix.as_str()) {
            return self.reserved(&req, rest, client).await;
        }
        let matched = self.rooms.matching(proxy::original_host(&req), path);
        // Phase 2 is decided here too, while the request is only borrowed.
        let bypass = matched.is_some_and(|room| room.bypasses(path, client, req.headers()));
        let Some(room) = matched.cloned() else {
            return match self.unmatched {
                Unmatched::Forward => self.forward(req, &fwd, None, None, None).await,
                Unmatched::NotFound => message(
                    StatusCode::NOT_FOUND,
                    "Not found",
                    "There is nothing here.",
                    0,
                ),
            };
        };

        // Phase 2: bypass.
        if bypass {
            return self.forward(req, &fwd, None, None, None).await;
        }

        // Phase 3: ticket.
        let decision = match self.decide_anywhere(&room, &req, client).await {
            Ok(d) => d,
            Err(e) => return self.store_failed(&room, req, &fwd, e).await,
        };

        // Phase 4: respond.
        match decision {
            Decision::Forward { visitor, ticket } => {
                self.forward(req, &fwd, Some(&room), Some(visitor), ticket)
                    .await
            }
            Decision::Queued { place, ticket } => {
                let cookie = self.set_cookie(&room, &ticket);
                let status = self.status(&room, VisitorState::Queued, Some(place));
                self.queue_response(&room, &req, status, Some(cookie))
            }
            Decision::Rejected(reason) => rejected(&room, reason, wants_json(&req)),
            Decision::SlowDown(wait) => {
                let seconds = poll_limit::retry_after_secs(wait);
                if room.config.json_response && wants_json(&req) {
                    let mut resp = json(
                        StatusCode::TOO_MANY_REQUESTS,
                        &serde_json::json!({"error": "too many requests; your place is kept", "retry_after": seconds}),
                        None,
                    );
                    retry_after(&mut resp, seconds);
                    return resp;
                }
                message(
                    StatusCode::TOO_MANY_REQUESTS,
                    "Please slow down",
                    "You keep your place in the queue. This page tries again by itself in a moment.",
                    seconds,
                )
            }
        }
    }

    /// Phase 3: what this request's ticket (or its absence) earns.
    async fn decide(
        &self,
        room: &Room,
        req: &Request<Incoming>,
        client: IpAddr,
        via: &Via<'_>,
    ) -> Result<Decision, StoreError> {
        let now = self.clock.now_ms();
        let ticket = headers::cookie(req.headers(), &room.cookie_name)
            .and_then(|v| self.keys.open(&room.config.id, v, now).ok());
        match ticket {
            Some(Ticket {
                visitor,
                grant:
                    Grant::Admitted {
                        session_expires_ms,
                        check_in_due_ms,
                    },
                ..
            }) if now < session_expires_ms => {
                if now < check_in_due_ms {
                    return Ok(Decision::Forward {
                        visitor,
                        ticket: None,
                    });
                }
                let checked = self
                    .call(
                        via,
                        via.store
                            .check_in(&via.policy, visitor, session_expires_ms, now),
                    )
                    .await;
                match checked {
                    Ok(Some(expires)) => Ok(Decision::Forward {
                        visitor,
                        ticket: Some(self.admitted_ticket(room, visitor, expires, now)),
                    }),
                    // Revoked, released or expired in the store: a new visitor.
                    Ok(None) => self.arrive(room, now, via).await,
                    // The ticket is valid; an unreachable store is no reason
                    // to stop an admitted visitor. The next request checks in again.
                    Err(_) => Ok(Decision::Forward {
                        visitor,
                        ticket: None,
                    }),
                }
            }
            Some(Ticket {
                visitor,
                grant: Grant::Queued { seq },
                ..
            }) => {
                // Checked once, before the shared store; a local fallback
                // after a store failure does not count the poll twice.
                if via.shared {
                    if let Err(wait) = self.poll_allowed(room, visitor, client) {
                        return Ok(Decision::SlowDown(wait));
                    }
                }
                let verdict = self
                    .call(via, via.store.poll(&via.policy, visitor, seq, now))
                    .await?;
                if matches!(verdict, Verdict::Admitted { .. }) {
                    room.metrics.admitted.inc();
                }
                Ok(self.verdict(room, visitor, verdict, now))
            }
            _ => self.arrive(room, now, via).await,
        }
    }

    async fn arrive(&self, room: &Room, now: u64, via: &Via<'_>) -> Result<Decision, StoreError> {
        let visitor = VisitorId::random();
        let verdict = self
            .call(via, via.store.arrive(&via.policy, visitor, now))
            .await?;
        match verdict {
            Verdict::Admitted { .. } => room.metrics.admitted.inc(),
            Verdict::Queued(_) => room.metrics.queued.inc(),
            Verdict::Rejected(_) => room.metrics.rejected.inc(),
        };
        Ok(self.verdict(room, visitor, verdict, now))
    }

    /// Phase 3 in the shared store, or, when it fails and the fail mode is
    /// `local`, in this instance's own store with its share of the limits.
    async fn decide_anywhere(
        &self,
        room: &Room,
        req: &Request<Incoming>,
        client: IpAddr,
    ) -> Result<Decision, StoreError> {
        let shared = self.decide(room, req, client, &self.shared_via(room)).await;
        match (shared, self.local_via(room)) {
            (Err(_), Some(local)) => self.decide(room, req, client, &local).await,
            (result, _) => result,
        }
    }

    /// A queued visitor's poll, with the same fallback as `decide_anywhere`.
    async fn poll_anywhere(
        &self,
        room: &Room,
        visitor: VisitorId,
        seq: u64,
        now: u64,
    ) -> Result<Verdict, StoreError> {
        let shared = self.shared_via(room);
        let result = self
            .call(
                &shared,
                shared.store.poll(&shared.policy, visitor, seq, now),
            )
            .await;
        match (result, self.local_via(room)) {
            (Err(_), Some(local)) => local.store.poll(&local.policy, visitor, seq, now).await,
            (result, _) => result,
        }
    }

    /// Whether a queued visitor may poll now (per visitor, then per address).
    fn poll_allowed(
        &self,
        room: &Room,
        visitor: VisitorId,
        client: IpAddr,
    ) -> Result<(), Duration> {
        room.poll_limit.check(visitor)?;
        self.ip_limit.check(client)
    }

    fn shared_via<'a>(&'a self, room: &'a Room) -> Via<'a> {
        Via {
            store: &*self.store,
            metrics: &room.metrics,
            policy: room.policy(),
            shared: true,
        }
    }

    /// This instance's own store, in fail mode `local`: every limit divided
    /// by the number of instances (rounded up; 0 stays unlimited).
    fn local_via<'a>(&'a self, room: &'a Room) -> Option<Via<'a>> {
        let local = self.local.as_deref()?;
        let mut policy = (*room.policy()).clone();
        let share = |limit: u64| limit.div_ceil(self.instances);
        policy.total_active_users = share(policy.total_active_users);
        policy.new_users_per_minute = share(policy.new_users_per_minute);
        Some(Via {
            store: local,
            metrics: &room.metrics,
            policy: Arc::new(policy),
            shared: false,
        })
    }

    /// Runs a store call: on the shared store bounded by the timeout and
    /// skipped while the store is known to be down (one probe per
    /// `STORE_RETRY`); on the local store directly.
    async fn call<T>(
        &self,
        via: &Via<'_>,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        if !via.shared {
            return call.await;
        }
        if !self.store_may_be_called() {
            return Err(StoreError::Unavailable("down; retrying shortly".into()));
        }
        let started = Instant::now();
        let result = self.bounded(call).await;
        via.metrics
            .decision_latency
            .observe(started.elapsed().as_secs_f64());
        result
    }

    /// False while the store is down and the next probe is not yet due.
    fn store_may_be_called(&self) -> bool {
        let retry_at = self.retry_at_ms.load(Ordering::Relaxed);
        if retry_at == 0 {
            return true;
        }
        let now = self.started.elapsed().as_millis() as u64;
        // Let exactly one request through as the probe.
        now >= retry_at
            && self
                .retry_at_ms
                .compare_exchange(
                    retry_at,
                    now + STORE_RETRY_MS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    fn verdict(&self, room: &Room, visitor: VisitorId, verdict: Verdict, now: u64) -> Decision {
        match verdict {
            Verdict::Admitted { session_expires_ms } => Decision::Forward {
                visitor,
                ticket: Some(self.admitted_ticket(room, visitor, session_expires_ms, now)),
            },
            Verdict::Queued(place) => Decision::Queued {
                place,
                ticket: Ticket {
                    visitor,
                    grant: Grant::Queued { seq: place.seq },
                    expires_ms: now + room.policy().abandon_after_ms,
                },
            },
            Verdict::Rejected(reason) => Decision::Rejected(reason),
        }
    }

    fn admitted_ticket(&self, room: &Room, visitor: VisitorId, expires: u64, now: u64) -> Ticket {
        Ticket {
            visitor,
            grant: Grant::Admitted {
                session_expires_ms: expires,
                check_in_due_ms: (now + room.check_in_interval_ms).min(expires),
            },
            expires_ms: expires,
        }
    }

    /// Runs a store call under `store.timeout`, logging up/down transitions once.
    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let result = match tokio::time::timeout(self.store_timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout),
        };
        let failed = result.is_err();
        let retry_at = if failed {
            self.started.elapsed().as_millis() as u64 + STORE_RETRY_MS
        } else {
            0
        };
        self.retry_at_ms.store(retry_at, Ordering::Relaxed);
        if failed {
            self.telemetry.metrics.store_error();
        }
        if self.store_down.swap(failed, Ordering::Relaxed) != failed {
            self.telemetry.metrics.set_store_up(!failed);
            match &result {
                Err(e) => {
                    tracing::error!(error = %e, fail_mode = ?self.fail_mode, "store unavailable")
                }
                Ok(_) => tracing::info!("store available again"),
            }
        }
        result
    }

    async fn store_failed(
        &self,
        room: &Room,
        req: Request<Incoming>,
        fwd: &Forward,
        error: StoreError,
    ) -> Response<Body> {
        tracing::debug!(room = %room.config.id, %error, "store call failed");
        match self.fail_mode {
            // `local` only gets here if its own store failed, which it cannot;
            // availability first.
            FailMode::Open | FailMode::Local => self.forward(req, fwd, None, None, None).await,
            FailMode::Closed => message(
                StatusCode::SERVICE_UNAVAILABLE,
                "Temporarily unavailable",
                "We cannot check the queue right now. This page will try again shortly.",
                room.config.refresh_interval.as_secs(),
            ),
        }
    }

    /// Forwards to the origin, adding the visitor header and re-issued cookie,
    /// and carrying out the origin's `X-Waitroom-Command`.
    async fn forward(
        &self,
        mut req: Request<Incoming>,
        fwd: &Forward,
        room: Option<&Room>,
        visitor: Option<VisitorId>,
        ticket: Option<Ticket>,
    ) -> Response<Body> {
        headers::strip_own_cookies(req.headers_mut());
        req.headers_mut().remove(&X_WAITROOM_VISITOR);
        if let Some(v) = visitor.and_then(|v| HeaderValue::from_str(&v.to_hex()).ok()) {
            req.headers_mut().insert(X_WAITROOM_VISITOR, v);
        }
        let started = Instant::now();
        let forwarded = self.proxy.forward(req, fwd).await;
        self.telemetry
            .metrics
            .origin_latency(started.elapsed().as_secs_f64());
        let mut resp = match forwarded {
            Ok(resp) => resp,
            Err(e) => {
                tracing::warn!(error = %e, "origin request failed");
                return origin_error(&e);
            }
        };
        let command = resp.headers_mut().remove(&X_WAITROOM_COMMAND);
        if let (Some(room), Some(visitor)) = (room, visitor) {
            if command
                .as_ref()
                .is_some_and(|c| c.as_bytes().eq_ignore_ascii_case(b"revoke"))
            {
                let now = self.clock.now_ms();
                if let Err(e) = self
                    .bounded(self.store.release(&room.policy(), visitor, now))
                    .await
                {
                    tracing::warn!(room = %room.config.id, error = %e, "revoke not recorded");
                } else {
                    room.metrics.revoked.inc();
                }
                append_cookie(&mut resp, self.expired_cookie(room));
            } else if let Some(ticket) = ticket {
                append_cookie(&mut resp, self.set_cookie(room, &ticket));
            }
        }
        resp
    }

    /// Phase 1 for the daemon's own paths.
    async fn reserved(
        &self,
        req: &Request<Incoming>,
        rest: &str,
        client: IpAddr,
    ) -> Response<Body> {
        match (req.method(), rest) {
            (&Method::GET, "status") => self.status_endpoint(req, client).await,
            (&Method::GET, "health") => text(StatusCode::OK, "ok"),
            _ => message(
                StatusCode::NOT_FOUND,
                "Not found",
                "There is nothing here.",
                0,
            ),
        }
    }

    /// `GET /__waitroom/status?room=ID`: the visitor's standing, as JSON.
    /// A queued visitor's call counts as a poll (and may admit them).
    async fn status_endpoint(&self, req: &Request<Incoming>, client: IpAddr) -> Response<Body> {
        let room_id = req
            .uri()
            .query()
            .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("room=")));
        let room = match room_id {
            Some(id) => self.rooms.by_id(id),
            None => self.rooms.matching(proxy::original_host(req), "/"),
        };
        let Some(room) = room.cloned() else {
            return json(
                StatusCode::NOT_FOUND,
                &serde_json::json!({"error": "unknown room"}),
                None,
            );
        };
        let now = self.clock.now_ms();
        let ticket = headers::cookie(req.headers(), &room.cookie_name)
            .and_then(|v| self.keys.open(&room.config.id, v, now).ok());
        let (status, cookie) = match ticket {
            Some(Ticket {
                visitor,
                grant: Grant::Queued { seq },
                ..
            }) => {
                if let Err(wait) = self.poll_allowed(&room, visitor, client) {
                    let seconds = poll_limit::retry_after_secs(wait);
                    let mut status = self.status(&room, VisitorState::Queued, None);
                    status.refresh_seconds = seconds;
                    let mut resp = json(StatusCode::TOO_MANY_REQUESTS, &status, None);
                    retry_after(&mut resp, seconds);
                    return resp;
                }
                match self.poll_anywhere(&room, visitor, seq, now).await {
                    Ok(verdict) => match self.verdict(&room, visitor, verdict, now) {
                        Decision::Forward { ticket, .. } => (
                            self.status(&room, VisitorState::Admitted, None),
                            ticket.map(|t| self.set_cookie(&room, &t)),
                        ),
                        Decision::Queued { place, ticket } => (
                            self.status(&room, VisitorState::Queued, Some(place)),
                            Some(self.set_cookie(&room, &ticket)),
                        ),
                        Decision::Rejected(reason) => {
                            (self.status(&room, reject_state(reason), None), None)
                        }
                        // Not an outcome of a verdict; keep the page waiting.
                        Decision::SlowDown(_) => {
                            (self.status(&room, VisitorState::Queued, None), None)
                        }
                    },
                    // The store is down: tell the page to keep waiting.
                    Err(_) => (self.status(&room, VisitorState::Queued, None), None),
                }
            }
            Some(Ticket {
                grant: Grant::Admitted { .. },
                ..
            }) => (self.status(&room, VisitorState::Admitted, None), None),
            // No ticket: loading the room's page will hand one out.
            None => (self.status(&room, VisitorState::Admitted, None), None),
        };
        json(StatusCode::OK, &status, cookie)
    }

    fn status(&self, room: &Room, state: VisitorState, place: Option<QueuePlace>) -> Status {
        let (position, queue_length) = place.map_or((0, 0), |p| (p.position, p.queue_length));
        Status {
            room: room.config.id.clone(),
            state,
            position,
            queue_length,
            eta_seconds: room.rate.eta_seconds(position, &room.policy()),
            refresh_seconds: room.config.refresh_interval.as_secs().max(1),
        }
    }

    fn queue_response(
        &self,
        room: &Room,
        req: &Request<Incoming>,
        status: Status,
        cookie: Option<String>,
    ) -> Response<Body> {
        let code = room.config.queue_status_code;
        if room.config.json_response && wants_json(req) {
            let mut resp = json(code, &status, cookie);
            retry_after(&mut resp, status.refresh_seconds);
            return resp;
        }
        let status_url = format!("{}status?room={}", self.reserved_prefix, room.config.id);
        let view = QueueView::new(&status, &room.config.name, status_url, self.clock.now_ms());
        let mut resp = html(code, room.template.render(&view));
        retry_after(&mut resp, status.refresh_seconds);
        if let Some(c) = cookie {
            push_cookie(resp.headers_mut(), c);
        }
        resp
    }

    fn set_cookie(&self, room: &Room, ticket: &Ticket) -> String {
        let now = self.clock.now_ms();
        let max_age = ticket.expires_ms.saturating_sub(now) / 1000;
        Cookie::build((
            room.cookie_name.as_str(),
            self.keys.seal(&room.config.id, ticket),
        ))
        .path("/")
        .http_only(true)
        .same_site(SameSite::Lax)
        .secure(self.cookie_secure)
        .max_age(cookie::time::Duration::seconds(max_age as i64 + 1))
        .build()
        .to_string()
    }

    fn expired_cookie(&self, room: &Room) -> String {
        Cookie::build((room.cookie_name.as_str(), ""))
            .path("/")
            .http_only(true)
            .same_site(SameSite::Lax)
            .secure(self.cookie_secure)
            .max_age(cookie::time::Duration::ZERO)
            .build()
            .to_string()
    }
}

fn reject_state(reason: RejectReason) -> VisitorState {
    match reason {
        RejectReason::Closed => VisitorState::Closed,
        RejectReason::QueueFull | RejectReason::OverLimit => VisitorState::Rejected,
    }
}

fn rejected(room: &Room, reason: RejectReason, as_json: bool) -> Response<Body> {
    let refresh = room.config.refresh_interval.as_secs().max(1);
    if as_json && room.config.json_response {
        let status = Status {
            room: room.config.id.clone(),
            state: reject_state(reason),
            position: 0,
            queue_length: 0,
            eta_seconds: 0,
            refresh_seconds: refresh,
        };
        return json(StatusCode::SERVICE_UNAVAILABLE, &status, None);
    }
    let (title, text, retry) = match reason {
        RejectReason::Closed => (
            "Sold out",
            "This sale is closed. Thank you for your patience.",
            0,
        ),
        RejectReason::QueueFull => (
            "Too busy right now",
            "The queue is full at the moment. Please try again a little later.",
            refresh * 3,
        ),
        RejectReason::OverLimit => (
            "Too busy right now",
            "We are at capacity. Please try again in a moment.",
            refresh,
        ),
    };
    message(StatusCode::SERVICE_UNAVAILABLE, title, text, retry)
}

fn origin_error(e: &proxy::OriginError) -> Response<Body> {
    match e.status() {
        StatusCode::GATEWAY_TIMEOUT => message(
            StatusCode::GATEWAY_TIMEOUT,
            "The site is slow to answer",
            "The site did not answer in time. Please try again in a moment.",
            0,
        ),
        StatusCode::BAD_REQUEST => message(
            StatusCode::BAD_REQUEST,
            "Bad request",
            "This request cannot be handled.",
            0,
        ),
        status => message(
            status,
            "The site is unavailable",
            "The site could not be reached. Please try again in a moment.",
            0,
        ),
    }
}

fn wants_json<B>(req: &Request<B>) -> bool {
    req.headers()
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/json"))
}

fn retry_after(resp: &mut Response<Body>, seconds: u64) {
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
}

fn push_cookie(headers: &mut http::HeaderMap, cookie: String) {
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        headers.append(header::SET_COOKIE, v);
    }
}

fn append_cookie(resp: &mut Response<Body>, cookie: String) {
    push_cookie(resp.headers_mut(), cookie);
}

fn no_store(builder: http::response::Builder) -> http::response::Builder {
    builder.header(header::CACHE_CONTROL, "no-store")
}

pub fn html(status: StatusCode, page: String) -> Response<Body> {
    let mut resp = Response::new(full(page));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

pub fn json<T: serde::Serialize>(
    status: StatusCode,
    value: &T,
    cookie: Option<String>,
) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut resp = no_store(Response::builder())
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(body))
        .unwrap_or_else(|_| Response::new(crate::body::empty()));
    if let Some(c) = cookie {
        push_cookie(resp.headers_mut(), c);
    }
    resp
}

pub fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

pub fn message(
    status: StatusCode,
    title: &str,
    text: &str,
    refresh_seconds: u64,
) -> Response<Body> {
    let mut resp = html(
        status,
        queue_page::render_message(&Message {
            title,
            text,
            refresh_seconds,
        }),
    );
    if refresh_seconds > 0 {
        retry_after(&mut resp, refresh_seconds);
    }
    resp
}
