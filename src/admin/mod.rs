//! The operator's side, on the admin listener: the JSON API (rooms, runtime
//! changes, release, reset, reload), Prometheus metrics, liveness and
//! readiness, and the dashboard.
//!
//! The API and the dashboard need the bearer token when one is configured;
//! `/live`, `/ready` and `/metrics` need it only off loopback. The daemon
//! refuses to start an admin listener off loopback without a token.
//!
//! Without a token, loopback is the only protection, and a browser on the
//! operator's machine could be made to cross it: a page on another site
//! posting to `127.0.0.1:9090`, or a DNS name rebound to 127.0.0.1. So a
//! request must then name a loopback host in `Host`, and a request that
//! carries an `Origin` (every cross-site fetch or form does) must come from
//! the admin listener's own origin; bodies must be JSON, which a plain HTML
//! form cannot send. Runtime changes are held to the config file's bounds.

mod report;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;

use crate::body::{full, Body};
use crate::canonical::{host as parse_host, is_loopback_host};
use crate::config::bounds::{MAX_DURATION, MAX_DURATION_TEXT, MAX_LIMIT, MIN_SESSION};
use crate::config::Secret;
use crate::domain::{
    EventSpec, Notice, NoticeLevel, QueueingMethod, RoomState, Settings, VisitorId,
};
use crate::gate::preview::PreviewState;
use crate::gate::schedule::{self, Phase};
use crate::gate::{AmendError, Room, SharedGate};
use crate::i18n::{Chosen, Lang};
use crate::queue_page::rfc3339;
use crate::respond::{html, json, language, text};
use crate::store::StoreError;
use crate::telemetry::exposition::Format;

pub(crate) use crate::telemetry::Telemetry;

/// The built-in dashboard.
const DASHBOARD: &str = include_str!("../../static/dashboard.html");
/// Largest admin request body we read.
const MAX_BODY: usize = 64 * 1024;

/// Reloads the configuration (from its file); the error is the validation message.
pub(crate) type Reloader =
    Arc<dyn Fn() -> futures_util::future::BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// Everything the admin listener needs.
pub(crate) struct Admin {
    pub gates: SharedGate,
    pub telemetry: Arc<Telemetry>,
    pub token: Option<Secret>,
    /// Whether the admin listener is on loopback (health and metrics open).
    pub loopback: bool,
    pub reload: Option<Reloader>,
}

/// Why an admin request failed; mapped to a status in one place.
#[derive(Debug, thiserror::Error)]
enum AdminError {
    #[error("missing or wrong bearer token")]
    Unauthorized,
    #[error("{0}")]
    Forbidden(&'static str),
    #[error("body: expected Content-Type: application/json")]
    NotJson,
    #[error("no such room")]
    NoRoom,
    #[error("not found")]
    NotFound,
    #[error("{0}")]
    BadRequest(String),
    #[error("store unavailable")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Reload(String),
}

impl From<AmendError> for AdminError {
    fn from(e: AmendError) -> Self {
        match e {
            AmendError::Refused(why) => AdminError::BadRequest(why),
            AmendError::Store(e) => AdminError::Store(e),
        }
    }
}

impl AdminError {
    fn status(&self) -> StatusCode {
        match self {
            AdminError::Unauthorized => StatusCode::UNAUTHORIZED,
            AdminError::Forbidden(_) => StatusCode::FORBIDDEN,
            AdminError::NotJson => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            AdminError::NoRoom | AdminError::NotFound => StatusCode::NOT_FOUND,
            AdminError::BadRequest(_) | AdminError::Reload(_) => StatusCode::BAD_REQUEST,
            AdminError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl Admin {
    pub(crate) async fn handle(&self, req: Request<Incoming>, _peer: SocketAddr) -> Response<Body> {
        match self.route(req).await {
            Ok(resp) => resp,
            Err(e) => {
                let mut resp = json(
                    e.status(),
                    &serde_json::json!({ "error": e.to_string() }),
                    None,
                );
                if matches!(e, AdminError::Unauthorized) {
                    resp.headers_mut().insert(
                        header::WWW_AUTHENTICATE,
                        header::HeaderValue::from_static("Bearer"),
                    );
                }
                resp
            }
        }
    }

    /// Whether the request carries the token (`Bearer` in any case, as
    /// RFC 9110 has auth schemes), or no token is configured.
    fn authorized(&self, req: &Request<Incoming>) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let Some(value) = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
        else {
            return false;
        };
        let Some((scheme, given)) = value.trim().split_once(' ') else {
            return false;
        };
        scheme.eq_ignore_ascii_case("bearer") && token.matches(given.trim().as_bytes())
    }

    /// Refuses what a browser could be tricked into sending (see the module
    /// docs): a foreign `Origin` always, and without a token a `Host` that
    /// is not a loopback name.
    fn same_site(&self, req: &Request<Incoming>) -> Result<(), AdminError> {
        let host = req
            .headers()
            .get(header::HOST)
            .map(|h| parse_host(h.as_bytes()))
            .or_else(|| {
                req.uri()
                    .authority()
                    .map(|a| parse_host(a.as_str().as_bytes()))
            });
        let host = match host {
            Some(Ok((name, port))) => Some((name, port)),
            Some(Err(_)) => return Err(AdminError::Forbidden("the Host header is not valid")),
            None => None,
        };
        if self.token.is_none() && !host.as_ref().is_some_and(|(h, _)| is_loopback_host(h)) {
            return Err(AdminError::Forbidden(
                "without an admin token the admin API answers only loopback host names (localhost, 127.0.0.1, [::1])",
            ));
        }
        if let Some(origin) = req.headers().get(header::ORIGIN) {
            let same = origin
                .to_str()
                .ok()
                .and_then(|o| o.split_once("://"))
                .and_then(|(_, rest)| parse_host(rest.as_bytes()).ok())
                .is_some_and(|o| host.as_ref() == Some(&o));
            if !same {
                return Err(AdminError::Forbidden(
                    "cross-site requests are refused (the Origin is not this admin listener)",
                ));
            }
        }
        Ok(())
    }

    async fn route(&self, req: Request<Incoming>) -> Result<Response<Body>, AdminError> {
        self.same_site(&req)?;
        let path = req.uri().path().to_owned();
        let method = req.method().clone();
        let open = self.loopback || self.authorized(&req);
        match (&method, path.as_str()) {
            (&Method::GET, "/live") if open => return Ok(text(StatusCode::OK, "live")),
            (&Method::GET, "/ready") if open => return Ok(self.ready().await),
            (&Method::GET, "/metrics") if open => {
                // OpenMetrics when the scraper asks for it (Prometheus
                // does), the classic text format 0.0.4 otherwise.
                let format = Format::negotiate(
                    req.headers()
                        .get_all(header::ACCEPT)
                        .iter()
                        .filter_map(|v| v.to_str().ok()),
                );
                let mut resp = Response::new(full(self.telemetry.metrics.encode(format)));
                let headers = resp.headers_mut();
                headers.insert(
                    header::CONTENT_TYPE,
                    header::HeaderValue::from_static(format.content_type()),
                );
                headers.insert(header::VARY, header::HeaderValue::from_static("Accept"));
                return Ok(resp);
            }
            // The page itself holds no data; it asks for the token when the API needs one.
            (&Method::GET, "/") => return Ok(html(StatusCode::OK, DASHBOARD.to_owned())),
            _ => {}
        }
        if !self.authorized(&req) {
            return Err(AdminError::Unauthorized);
        }
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        match (&method, segments.as_slice()) {
            (&Method::GET, ["api", "rooms"]) => {
                let gate = self.gates.load_full();
                let mut rooms = Vec::new();
                for room in gate.rooms.all() {
                    rooms.push(self.room_json(room).await?);
                }
                Ok(json(StatusCode::OK, &rooms, None))
            }
            (&Method::GET, ["api", "rooms", id]) => {
                let room = self.room(id)?;
                Ok(json(StatusCode::OK, &self.room_json(&room).await?, None))
            }
            (&Method::GET, ["api", "rooms", id, "check"]) => {
                let room = self.room(id)?;
                let gate = self.gates.load_full();
                let violations = gate.store.check(&room, gate.clock.now_ms()).await?;
                if !violations.is_empty() {
                    tracing::error!(room = %room.config.id, ?violations, "the room's store state breaks its layout's invariants");
                }
                Ok(json(
                    StatusCode::OK,
                    &serde_json::json!({ "ok": violations.is_empty(), "violations": violations }),
                    None,
                ))
            }
            (&Method::PATCH, ["api", "rooms", id]) => {
                let room = self.room(id)?;
                let change: RoomChange = read_json(req).await?;
                self.change(&room, change).await?;
                Ok(json(StatusCode::OK, &self.room_json(&room).await?, None))
            }
            (&Method::GET, ["api", "rooms", id, "preview"]) => {
                let room = self.room(id)?;
                self.preview(&room, req.uri().query(), req.headers())
            }
            (&Method::GET, ["api", "rooms", id, "report"]) => {
                let room = self.room(id)?;
                self.report(&room, req.uri().query(), req.headers(), None)
                    .await
            }
            (&Method::GET, ["api", "rooms", id, "events", name, "report"]) => {
                let room = self.room(id)?;
                let window = self.event_window(&room, name)?;
                self.report(&room, req.uri().query(), req.headers(), Some(window))
                    .await
            }
            (&Method::GET, ["api", "rooms", id, "events"]) => {
                let room = self.room(id)?;
                Ok(json(StatusCode::OK, &self.events_json(&room), None))
            }
            (&Method::POST, ["api", "rooms", id, "events"]) => {
                let room = self.room(id)?;
                let change: EventChange = read_json(req).await?;
                let name = change
                    .name
                    .clone()
                    .ok_or_else(|| AdminError::BadRequest("name: required".into()))?;
                self.change_event(&room, &name, Some(change), false).await?;
                Ok(json(StatusCode::CREATED, &self.events_json(&room), None))
            }
            (&Method::PATCH, ["api", "rooms", id, "events", name]) => {
                let room = self.room(id)?;
                let change: EventChange = read_json(req).await?;
                self.change_event(&room, name, Some(change), true).await?;
                Ok(json(StatusCode::OK, &self.events_json(&room), None))
            }
            (&Method::DELETE, ["api", "rooms", id, "events", name]) => {
                let room = self.room(id)?;
                self.change_event(&room, name, None, true).await?;
                Ok(json(StatusCode::OK, &self.events_json(&room), None))
            }
            (&Method::POST, ["api", "rooms", id, "release"]) => {
                let room = self.room(id)?;
                let body: Release = read_json(req).await?;
                let visitor = VisitorId::from_hex(&body.visitor).ok_or_else(|| {
                    AdminError::BadRequest("visitor: expected 32 hex characters".into())
                })?;
                let released = self
                    .gates
                    .load_full()
                    .operator
                    .release(&room, visitor)
                    .await?;
                Ok(json(
                    StatusCode::OK,
                    &serde_json::json!({ "released": released }),
                    None,
                ))
            }
            (&Method::POST, ["api", "rooms", id, "reset"]) => {
                let room = self.room(id)?;
                self.gates.load_full().operator.reset(&room).await?;
                Ok(json(
                    StatusCode::OK,
                    &serde_json::json!({ "reset": true }),
                    None,
                ))
            }
            (&Method::POST, ["api", "reload"]) => {
                let reload = self.reload.as_ref().ok_or_else(|| {
                    AdminError::Reload("this daemon was not started from a config file".into())
                })?;
                reload().await.map_err(AdminError::Reload)?;
                Ok(json(
                    StatusCode::OK,
                    &serde_json::json!({ "reloaded": true }),
                    None,
                ))
            }
            (&Method::GET, ["api", "history"]) => {
                let now = self.gates.load_full().clock.now_ms();
                Ok(json(StatusCode::OK, &self.telemetry.history(now), None))
            }
            _ => Err(AdminError::NotFound),
        }
    }

    async fn ready(&self) -> Response<Body> {
        if self.telemetry.draining.load(Ordering::Relaxed) {
            return text(StatusCode::SERVICE_UNAVAILABLE, "draining");
        }
        let gate = self.gates.load_full();
        if gate.operator.store_ready(&gate.rooms).await {
            text(StatusCode::OK, "ready")
        } else {
            text(StatusCode::SERVICE_UNAVAILABLE, "store unavailable")
        }
    }

    fn room(&self, id: &str) -> Result<Arc<Room>, AdminError> {
        self.gates
            .load_full()
            .rooms
            .by_id(id)
            .cloned()
            .ok_or(AdminError::NoRoom)
    }

    async fn room_json(&self, room: &Room) -> Result<serde_json::Value, AdminError> {
        let gate = self.gates.load_full();
        let policy = room.policy();
        let store = &gate.store;
        let stats = store.stats(room, gate.clock.now_ms()).await?;
        let c = &room.config;
        Ok(serde_json::json!({
            "id": c.id,
            "name": c.name,
            "host": c.host,
            "path": c.path,
            "state": policy.state,
            "queueing_method": policy.method,
            "total_active_users": policy.total_active_users,
            "new_users_per_minute": policy.new_users_per_minute,
            "session_duration_seconds": policy.session_duration_ms / 1000,
            "configured": {
                "state": c.state,
                "queueing_method": c.queueing_method,
                "total_active_users": c.total_active_users,
                "new_users_per_minute": c.new_users_per_minute,
                "session_duration_seconds": c.session_duration.as_secs(),
            },
            "active": stats.active,
            "queued": stats.queued,
            "admitted_last_minute": stats.admitted_last_minute,
            "eta_seconds": room.rate.eta_seconds(stats.queued, &policy, c.refresh_interval),
            "events": self.events_json(room),
            "notice": room.notice().as_deref().map(notice_json),
            "stock": room.stock(),
            "sessions_per_item": c.sessions_per_item,
            "fairness": fairness_json(room),
            "autotune": autotune_json(room, &policy),
        }))
    }

    /// `GET /api/rooms/{id}/preview?state=..&lang=..`: the page, sandboxed
    /// (its script does not run, so it polls nothing); nothing is written.
    fn preview(
        &self,
        room: &Room,
        query: Option<&str>,
        headers: &http::HeaderMap,
    ) -> Result<Response<Body>, AdminError> {
        let (mut state, mut lang) = (None, None);
        for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            match key.as_ref() {
                "state" => state = Some(value.into_owned()),
                "lang" => lang = Some(value.into_owned()),
                other => {
                    return Err(AdminError::BadRequest(format!(
                        "{other}: unknown parameter (state and lang are taken)"
                    )))
                }
            }
        }
        let states = || {
            PreviewState::ALL
                .iter()
                .map(|(name, _)| *name)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let state = state.ok_or_else(|| {
            AdminError::BadRequest(format!("state: required, one of {}", states()))
        })?;
        let state = PreviewState::parse(&state).ok_or_else(|| {
            AdminError::BadRequest(format!(
                "state: expected one of {}, got {state:?}",
                states()
            ))
        })?;
        let chosen = match lang {
            None => room.config.language.choose(headers),
            Some(code) => Chosen {
                lang: Lang::from_code(&code).ok_or_else(|| {
                    AdminError::BadRequest(format!(
                        "lang: expected one of {}, got {code:?}",
                        language_codes()
                    ))
                })?,
                negotiated: false,
            },
        };
        let page = self.gates.load_full().preview(room, state, chosen.lang);
        let mut resp = html(StatusCode::OK, page);
        language(&mut resp, chosen);
        // Shown as it is, but inert: no script, no form, no cookie.
        resp.headers_mut().insert(
            header::CONTENT_SECURITY_POLICY,
            header::HeaderValue::from_static("sandbox; script-src 'none'"),
        );
        Ok(resp)
    }

    /// Merges a change into the room's stored overrides and applies it here
    /// at once; other instances pick it up within a second.
    async fn change(&self, room: &Room, change: RoomChange) -> Result<(), AdminError> {
        let settings = checked_settings(
            change.total_active_users,
            change.new_users_per_minute,
            change.session_duration.as_deref(),
            None,
            change.queueing_method,
        )
        .map_err(AdminError::BadRequest)?;
        let gate = self.gates.load_full();
        let now = gate.clock.now_ms();
        let notice = change
            .notice
            .map(|n| n.map(|n| n.notice(now)).transpose())
            .transpose()
            .map_err(AdminError::BadRequest)?;
        let stock = change
            .stock
            .as_ref()
            .map(|v| stock_change(v.as_ref()))
            .transpose()
            .map_err(AdminError::BadRequest)?;
        gate.operator
            .amend(room, |o, _| {
                o.settings.update(&settings);
                o.state = change.state.or(o.state);
                if let Some(notice) = notice {
                    o.notice = notice;
                }
                if let Some(stock) = stock {
                    o.stock = stock;
                }
                Ok(())
            })
            .await?;
        Ok(())
    }

    /// The room's events with their phase now.
    fn events_json(&self, room: &Room) -> serde_json::Value {
        let now = self.gates.load().clock.now_ms();
        let in_force = room.in_force(now);
        let events: Vec<_> = room
            .events()
            .iter()
            .map(|e| {
                let current = in_force
                    .event
                    .as_ref()
                    .is_some_and(|c| c.spec.name == e.spec.name);
                let phase = match in_force.phase {
                    Phase::Prequeue | Phase::Starting if current => "prequeue",
                    Phase::Running if current => "running",
                    _ if e.spec.end_ms <= now => "ended",
                    _ => "scheduled",
                };
                event_json(&e.spec, phase)
            })
            .collect();
        serde_json::Value::Array(events)
    }

    /// Adds (`name` absent from the list), changes or cancels an event.
    async fn change_event(
        &self,
        room: &Room,
        name: &str,
        change: Option<EventChange>,
        must_exist: bool,
    ) -> Result<(), AdminError> {
        let gate = self.gates.load_full();
        let now = gate.clock.now_ms();
        gate.operator
            .amend(room, |o, mut events| {
                let at = events.iter().position(|e| e.name == name);
                match (at, must_exist) {
                    (None, true) => return Err(format!("no event named {name:?}")),
                    (Some(_), false) => {
                        return Err(format!(
                            "an event named {name:?} exists; change it with PATCH"
                        ))
                    }
                    _ => {}
                }
                match change {
                    None => {
                        if let Some(i) = at {
                            events.remove(i);
                        }
                    }
                    Some(change) => {
                        let mut event = match at {
                            Some(i) => events.remove(i),
                            None => change.new_spec(name)?,
                        };
                        change.apply(&mut event, now)?;
                        schedule::check_event(&event, &events)?;
                        events.push(event);
                        events.sort_by_key(|e| e.start_ms);
                    }
                }
                o.events = Some(events);
                Ok(())
            })
            .await?;
        Ok(())
    }
}

fn event_json(e: &EventSpec, phase: &str) -> serde_json::Value {
    serde_json::json!({
        "name": e.name,
        "prequeue_start": e.prequeue_start_ms.map(rfc3339),
        "start": rfc3339(e.start_ms),
        "end": rfc3339(e.end_ms),
        "phase": phase,
        "shuffle_at_start": e.shuffle_at_start,
        "lanes_only_for_seconds": e.lanes_only_for_ms.map(|ms| ms / 1000),
        "total_active_users": e.settings.total_active_users,
        "new_users_per_minute": e.settings.new_users_per_minute,
        "session_duration_seconds": e.settings.session_duration_ms.map(|ms| ms / 1000),
        "session_renewal": e.settings.session_renewal,
        "queueing_method": e.settings.queueing_method,
        "notice": e.notice.as_ref().map(notice_json),
    })
}

/// A notice as the admin API shows it: every language, the expiry.
fn notice_json(n: &Notice) -> serde_json::Value {
    serde_json::json!({
        "text": n.text,
        "texts": n.texts,
        "level": n.level,
        "expires": n.expires_ms.map(rfc3339),
    })
}

/// The codes of the shipped languages, for messages.
fn language_codes() -> String {
    Lang::ALL.map(Lang::code).join(", ")
}

/// A notice as an operator gives it (`PATCH /api/rooms/{id}` and an
/// event's `notice`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoticeChange {
    text: String,
    /// The text per language code.
    #[serde(default)]
    texts: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    level: NoticeLevel,
    /// Unix seconds or RFC 3339.
    expires: Option<serde_json::Value>,
}

impl NoticeChange {
    /// The notice, held to its bounds; its expiry must be after `now`.
    fn notice(&self, now: u64) -> Result<Notice, String> {
        let mut texts = std::collections::BTreeMap::new();
        for (code, text) in &self.texts {
            let lang = Lang::from_code(code).ok_or_else(|| {
                format!(
                    "notice.texts: {code:?} is not a language of the pages; expected one of {}",
                    language_codes()
                )
            })?;
            if texts.insert(lang.code().to_owned(), text.clone()).is_some() {
                return Err(format!("notice.texts: {code:?} is given twice"));
            }
        }
        let expires_ms = match &self.expires {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(t)) => Some(instant("notice.expires", t)?),
            Some(serde_json::Value::Number(n)) => Some(
                n.as_u64()
                    .and_then(|s| s.checked_mul(1000))
                    .filter(|ms| *ms <= MAX_NOTICE_EXPIRY_MS)
                    .ok_or_else(|| {
                        format!(
                            "notice.expires: expected Unix seconds or an RFC 3339 time, got {n}"
                        )
                    })?,
            ),
            Some(other) => {
                return Err(format!(
                    "notice.expires: expected Unix seconds or an RFC 3339 time, got {other}"
                ))
            }
        };
        if let Some(ms) = expires_ms.filter(|ms| *ms <= now) {
            return Err(format!(
                "notice.expires: {} is already past (now {})",
                rfc3339(ms),
                rfc3339(now)
            ));
        }
        let notice = Notice {
            text: self.text.clone(),
            texts,
            level: self.level,
            expires_ms,
        };
        notice.check_bounds()?;
        Ok(notice)
    }
}

/// The latest expiry taken: the end of the year 9999.
const MAX_NOTICE_EXPIRY_MS: u64 = 253_402_300_799_000;

/// Settings an operator typed, held to the config file's bounds.
fn checked_settings(
    total_active_users: Option<u64>,
    new_users_per_minute: Option<u64>,
    session_duration: Option<&str>,
    session_renewal: Option<bool>,
    queueing_method: Option<QueueingMethod>,
) -> Result<Settings, String> {
    for (key, value) in [
        ("total_active_users", total_active_users),
        ("new_users_per_minute", new_users_per_minute),
    ] {
        if let Some(v) = value {
            within_limit(key, v).map_err(|e| e.to_string())?;
        }
    }
    Ok(Settings {
        total_active_users,
        new_users_per_minute,
        session_duration_ms: session_duration.map(session_duration_ms).transpose()?,
        session_renewal,
        queueing_method,
    })
}

/// A session duration an operator typed, within the config file's bounds.
fn session_duration_ms(v: &str) -> Result<u64, String> {
    humantime::parse_duration(v.trim())
        .ok()
        .filter(|d| (MIN_SESSION..=MAX_DURATION).contains(d))
        .map(|d| d.as_millis() as u64)
        .ok_or_else(|| {
            format!(
                "session_duration: expected a duration from {} to {} such as \"5m\", got {v:?}",
                humantime::format_duration(MIN_SESSION),
                MAX_DURATION_TEXT,
            )
        })
}

/// An RFC 3339 time an operator typed, as ms since the epoch.
fn instant(key: &str, v: &str) -> Result<u64, String> {
    humantime::parse_rfc3339_weak(v.trim())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
        .ok_or_else(|| {
            format!("{key}: expected an RFC 3339 time such as \"2026-12-01T10:00:00Z\", got {v:?}")
        })
}

/// `POST /api/rooms/{id}/events` (with `name`) and `PATCH
/// /api/rooms/{id}/events/{name}`: what is given replaces what was.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventChange {
    name: Option<String>,
    /// `null` removes the prequeue.
    #[serde(default, deserialize_with = "present")]
    prequeue_start: Option<Option<String>>,
    start: Option<String>,
    end: Option<String>,
    shuffle_at_start: Option<bool>,
    total_active_users: Option<u64>,
    new_users_per_minute: Option<u64>,
    session_duration: Option<String>,
    session_renewal: Option<bool>,
    queueing_method: Option<QueueingMethod>,
    /// Shown while the event is in force; `null` removes it.
    #[serde(default, deserialize_with = "present")]
    notice: Option<Option<NoticeChange>>,
}

/// Tells a field given as `null` from a field left out.
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

impl EventChange {
    /// A new event: `start` and `end` are needed.
    fn new_spec(&self, name: &str) -> Result<EventSpec, String> {
        let (Some(start), Some(end)) = (&self.start, &self.end) else {
            return Err("a new event needs start and end".into());
        };
        Ok(EventSpec {
            name: name.to_owned(),
            prequeue_start_ms: None,
            start_ms: instant("start", start)?,
            end_ms: instant("end", end)?,
            shuffle_at_start: false,
            lanes_only_for_ms: None,
            settings: Settings::default(),
            notice: None,
        })
    }

    fn apply(&self, e: &mut EventSpec, now: u64) -> Result<(), String> {
        if self.name.as_ref().is_some_and(|n| *n != e.name) {
            return Err("name: an event cannot be renamed; cancel it and add another".into());
        }
        if let Some(p) = &self.prequeue_start {
            e.prequeue_start_ms = p
                .as_deref()
                .map(|t| instant("prequeue_start", t))
                .transpose()?;
        }
        if let Some(t) = &self.start {
            e.start_ms = instant("start", t)?;
        }
        if let Some(t) = &self.end {
            e.end_ms = instant("end", t)?;
        }
        if let Some(v) = self.shuffle_at_start {
            e.shuffle_at_start = v;
        }
        if let Some(n) = &self.notice {
            e.notice = n.as_ref().map(|n| n.notice(now)).transpose()?;
        }
        e.settings.update(&checked_settings(
            self.total_active_users,
            self.new_users_per_minute,
            self.session_duration.as_deref(),
            self.session_renewal,
            self.queueing_method,
        )?);
        Ok(())
    }
}

/// The same bounds the config file holds the limits to.
fn within_limit(key: &str, v: u64) -> Result<(), AdminError> {
    if v == 0 {
        return Err(AdminError::BadRequest(format!(
            "{key}: must be at least 1 (to stop admissions, set state = \"paused\")"
        )));
    }
    if v > MAX_LIMIT {
        return Err(AdminError::BadRequest(format!(
            "{key}: must be at most {MAX_LIMIT}, got {v}"
        )));
    }
    Ok(())
}

/// `PATCH /api/rooms/{id}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RoomChange {
    total_active_users: Option<u64>,
    new_users_per_minute: Option<u64>,
    session_duration: Option<String>,
    queueing_method: Option<QueueingMethod>,
    state: Option<RoomState>,
    /// The notice to the people waiting; `null` clears it.
    #[serde(default, deserialize_with = "present")]
    notice: Option<Option<NoticeChange>>,
    /// Items left (checked by [`stock_change`]); `null` clears it.
    #[serde(default, deserialize_with = "present")]
    stock: Option<Option<serde_json::Value>>,
}

/// A room's autotune (`[room.autotune]`): the rate in force, its bounds
/// and autotune's last move; `null` when the room has none.
fn autotune_json(room: &Room, policy: &crate::domain::RoomPolicy) -> serde_json::Value {
    let Some(c) = &room.config.autotune else {
        return serde_json::Value::Null;
    };
    let last = room.autotune_move();
    serde_json::json!({
        "rate": policy.new_users_per_minute,
        "floor": c.floor,
        "ceiling": c.ceiling,
        "step": c.step_users(),
        "interval_seconds": c.interval.as_secs(),
        "latency_ms": c.latency.as_millis() as u64,
        "last_move": last.map(|m| serde_json::json!({
            "rate": m.rate,
            "at": rfc3339(m.at_ms),
            "reason": m.reason,
        })),
    })
}

/// The stock a `PATCH` sets: a whole number from 0 to
/// [`MAX_STOCK`](crate::domain::MAX_STOCK), or `null` (not counted).
fn stock_change(value: Option<&serde_json::Value>) -> Result<Option<u64>, String> {
    let Some(value) = value else {
        return Ok(None);
    };
    match value.as_u64() {
        Some(n) if n <= crate::domain::MAX_STOCK => Ok(Some(n)),
        _ => Err(format!(
            "stock: expected a whole number from 0 to {} (items left) or null (not counted), got {value}",
            crate::domain::MAX_STOCK
        )),
    }
}

/// `POST /api/rooms/{id}/release`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Release {
    visitor: String,
}

async fn read_json<T: serde::de::DeserializeOwned>(
    req: Request<Incoming>,
) -> Result<T, AdminError> {
    let json = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(AdminError::NotJson);
    }
    let bytes = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|_| AdminError::BadRequest(format!("body: unreadable or over {MAX_BODY} bytes")))?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| AdminError::BadRequest(format!("body: {e}")))
}

/// What this instance did for fairness in `room` since it started:
/// challenges asked and failed, the shadow queue, enqueue tokens.
fn fairness_json(room: &Room) -> serde_json::Value {
    let m = &room.metrics;
    serde_json::json!({
        "challenged": m.challenged.get(),
        "proof_refused": m.proof_refused.get(),
        "captcha_passed": m.captcha_passed.get(),
        "captcha_failed": m.captcha_failed.get(),
        "captcha_open_passed": m.captcha_open_passed.get(),
        "captcha_busy": m.captcha_busy.get(),
        "shadowed": m.shadowed.get(),
        "would_shadow": m.would_shadow.get(),
        "token_verified": m.token_verified.get(),
        "token_refused": m.token_refused.get(),
        "token_replayed": m.token_replayed.get(),
        "token_folded": m.token_folded.get(),
        "lane_code_refused": m.lane_code_refused.get(),
        "lanes": m.lanes.iter().map(|l| serde_json::json!({
            "name": l.name,
            "entered": l.entered.get(),
            "admitted": l.admitted.get(),
        })).collect::<Vec<_>>(),
    })
}
