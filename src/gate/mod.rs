//! The admission path. Every visitor request goes through these phases, in
//! this order (drawn in `docs/request-phases.md`), carrying one [`Ctx`]:
//!
//! 1. **canonical**: the path, host and client address in one spelling
//!    ([`crate::canonical`]); what cannot be made canonical gets 400.
//! 2. **route**: the reserved prefix is answered by the daemon; otherwise
//!    the room is matched by host and longest path prefix (no room: forward
//!    or 404).
//! 3. **bypass**: bypass paths, client addresses or the secret header
//!    forward without a ticket.
//! 4. **ticket**: open the room's cookie. Admitted and live: forward with no
//!    store round trip (check in when due). Queued: poll the store (one path
//!    for the page and `/__waitroom/status`). Missing or invalid: a new
//!    visitor, limited per address, one `arrive` decision.
//! 5. **respond**: forward to the origin (cookie re-issued when it changed,
//!    the origin's `X-Waitroom-Command` carried out), or the queue page or
//!    JSON, or a 503 / 429 page.
//!
//! The phases run in one function, `Gate::outcome`, which returns what
//! they decided (`Outcome`); the reverse proxy (`Gate::phases`) and
//! decision mode (`decide`) are its two sinks, so a rule added to a phase
//! holds in both (`tests/one_pipeline.rs`).
//!
//! The work is split by role, each a type that owns what it uses, so a
//! feature extends one role and this file only wires them:
//!
//! - `intake` (`Intake`): phase 1, the client, the reserved prefix;
//! - `admission` (`Admission`): phases 4 and 5, with its parts `tickets`,
//!   `limits`, `members` (enqueue tokens), `lanes`, `proof`, `captcha`,
//!   `shadow` (the shadow queue) and `params` (our query parameters);
//! - `forward` (`Forwarding`): the origin, tunnels, the origin's commands;
//! - `operator` ([`Operator`]): operators' changes, and `upkeep` off the
//!   request path (room figures, runtime changes, events).
//!
//! Every store call goes through the `guard::StoreGuard` (timeout,
//! breaker, local fallback); past the timeout, `store.fail_mode` decides.
//! The sinks and what they show: `decide` (decision mode), `own` (the
//! daemon's own paths), `pages` and `status` (what is shown when nothing
//! is forwarded, and the status JSON), `preview` (those pages for
//! operators, with sample figures); `schedule` and `eta` are what the
//! phases consult, `access` the access log's marks.

pub(crate) mod access;
mod admission;
pub(crate) mod autotune;
pub(crate) mod captcha;
mod decide;
pub(crate) mod eta;
mod forward;
pub(crate) mod guard;
mod happenings;
mod intake;
pub(crate) mod lag;
pub(crate) mod lanes;
pub(crate) mod limits;
pub(crate) mod members;
pub(crate) mod operator;
mod own;
pub(crate) mod pages;
mod params;
pub(crate) mod preview;
pub mod proof;
pub(crate) mod rooms;
pub(crate) mod schedule;
mod shadow;
mod status;
pub(crate) mod tickets;
mod upkeep;

use std::sync::Arc;
use std::time::Instant;

use http::{HeaderMap, Method, Request, Response};
use hyper::body::Incoming;

use crate::body::Body;
use crate::clock::SharedClock;
use crate::config::{Config, Unmatched};
use crate::i18n::Language;
use crate::proxy;
use crate::queue_page::{self, Template};
use crate::respond::{bad_request, method_not_allowed, not_found};
use crate::store::SharedStore;
use crate::telemetry::Telemetry;
use crate::ticket::KeyRing;

use admission::{Admission, Admitted, Answer, Decision};
use forward::Forwarding;
use guard::StoreGuard;
pub use intake::{ConnInfo, Ctx};
use intake::{Intake, Unread};
pub(crate) use operator::AmendError;
pub use operator::Operator;
use pages::Shown;
pub use rooms::{Room, Rooms};
use tickets::Tickets;

pub use crate::proxy::X_WAITROOM_COMMAND;

/// The gate in force; a config reload swaps in a new one while requests in
/// flight finish on the old.
pub type SharedGate = Arc<arc_swap::ArcSwap<Gate>>;

/// Everything the admission path needs, built once from the config: the
/// rooms, and the roles that work on them. Each role owns what it uses,
/// so a feature extends one: `Intake` reads requests (phase 1, the
/// reserved prefix), `Admission` decides who is let in, `Forwarding`
/// talks to the origin, and [`Operator`] makes operators' changes and the
/// upkeep. The store, clock and telemetry handles are shared by all.
pub struct Gate {
    /// The configured rooms.
    pub rooms: Rooms,
    /// The store, behind its timeout, breaker and fallback (each role
    /// that calls it holds the same).
    pub store: Arc<StoreGuard>,
    pub(crate) clock: SharedClock,
    /// Metrics and history, kept across reloads.
    pub telemetry: Arc<Telemetry>,
    /// Operators' and the origin's changes, and upkeep.
    pub operator: Operator,
    intake: Intake,
    admission: Admission,
    forwarding: Forwarding,
    access_log: bool,
}

/// Why a gate cannot be built from a config.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// A room's template cannot be read or does not compile.
    #[error(transparent)]
    Template(#[from] queue_page::TemplateError),
    /// The origin's settings cannot be used.
    #[error("origin: {0}")]
    Origin(#[from] proxy::OriginError),
}

/// What the phases decided for a request ([`Gate::outcome`]), for a
/// sink to carry out: the reverse proxy forwards or renders
/// ([`Gate::phases`]), decision mode answers the proxy that asked
/// (`decide`).
enum Outcome {
    /// Under the reserved prefix (`Intake::own_path` gives the rest).
    Own,
    /// No room matches, and `server.unmatched` forwards.
    Unmatched,
    /// No room matches, and `server.unmatched` answers 404.
    NotFound,
    /// A bypass of the room: let in without a ticket.
    Bypass(Arc<Room>),
    /// The store failed and `fail_mode` lets the request in unchecked.
    FailOpen(Arc<Room>),
    /// Let in, with its admission.
    Admit(Arc<Room>, Admitted),
    /// Not let in: what to show.
    Show(Arc<Room>, Shown),
}

impl Gate {
    pub(crate) fn new(
        config: &Config,
        store: SharedStore,
        clock: SharedClock,
        telemetry: Arc<Telemetry>,
    ) -> Result<Self, GateError> {
        let mut rooms = Vec::with_capacity(config.rooms.len());
        for room in &config.rooms {
            let template = match &room.template {
                Some(path) => Template::load(path)?,
                None => Template::builtin(),
            };
            let mut events = Vec::with_capacity(room.events.len());
            for e in &room.events {
                let template = e.template.as_deref().map(Template::load).transpose()?;
                events.push(Arc::new(schedule::Event::new(e.spec.clone(), template)));
            }
            let lanes: Vec<String> = room.lanes.iter().map(|l| l.name.clone()).collect();
            let metrics = telemetry.metrics.room_with_lanes(&room.id, &lanes);
            rooms.push(Arc::new(Room::new(
                room.clone(),
                template,
                events,
                metrics,
                clock.clone(),
            )));
        }
        let store = Arc::new(StoreGuard::new(
            config,
            store,
            clock.clone(),
            telemetry.clone(),
        ));
        let tickets = Arc::new(Tickets::new(
            KeyRing::new(&config.cookie.keys),
            &config.cookie,
        ));
        let operator = Operator {
            store: store.clone(),
            clock: clock.clone(),
            telemetry: telemetry.clone(),
            report_retention: config.reports.retention,
        };
        Ok(Self {
            rooms: Rooms::new(rooms),
            intake: Intake::new(config),
            admission: Admission::new(config, tickets.clone(), store.clone(), &clock),
            forwarding: Forwarding::new(config, tickets, operator.clone())?,
            operator,
            store,
            clock,
            telemetry,
            access_log: config.server.access_log,
        })
    }

    /// Answers one visitor request. Never fails: every error becomes a page.
    pub async fn handle(&self, req: Request<Incoming>, conn: &ConnInfo) -> Response<Body> {
        if !self.access_log {
            let resp = self.phases(req, conn).await;
            self.telemetry.metrics.response(resp.status());
            return resp;
        }
        let started = Instant::now();
        let (method, path) = (req.method().clone(), req.uri().path().to_owned());
        let peer = conn.peer.ip();
        let client = self.intake.client(req.headers(), peer);
        let id = access::request_id(req.headers(), self.intake.is_trusted(peer));
        let mut resp = self.phases(req, conn).await;
        self.telemetry.metrics.response(resp.status());
        let mark = resp.extensions_mut().remove::<access::Mark>();
        let (room, outcome) = mark.map_or((None, "none"), |m| (m.room, m.outcome));
        tracing::info!(
            target: "waitroom::access",
            id = %id,
            %method,
            path,
            status = resp.status().as_u16(),
            ms = started.elapsed().as_secs_f64() * 1000.0,
            client = %client,
            peer = %peer,
            room = room.as_deref().unwrap_or(""),
            outcome,
            "access"
        );
        resp
    }

    /// Notes the room and outcome of `resp` for the access log (nothing
    /// when there is no access log).
    fn marked(
        &self,
        mut resp: Response<Body>,
        room: Option<&Room>,
        outcome: &'static str,
    ) -> Response<Body> {
        if self.access_log {
            resp.extensions_mut().insert(access::Mark {
                room: room.map(|r| r.config.id.clone()),
                outcome,
            });
        }
        resp
    }

    /// The reverse proxy: runs the phases ([`Gate::outcome`]) and carries
    /// out what they decided (forward, the daemon's own answer, or a page).
    async fn phases(&self, req: Request<Incoming>, conn: &ConnInfo) -> Response<Body> {
        // CONNECT asks for a tunnel to an authority, which no origin of ours
        // is, nor the daemon (the phases refuse it again for decision mode's
        // original request).
        if req.method() == Method::CONNECT {
            let resp = method_not_allowed(Language::Auto.choose(req.headers()));
            return self.marked(resp, None, "refused");
        }
        if let Some(rest) = self.intake.decision_path(req.uri().path()) {
            let rest = rest.to_owned();
            return decide::decide(self, req, conn, &rest).await;
        }
        let (ctx, outcome) = match self.outcome(&req, conn).await {
            Err(why) => {
                tracing::debug!(peer = %conn.peer, %why, "request refused");
                let lang = Language::Auto.choose(req.headers());
                let resp = match why {
                    Unread::Connect => method_not_allowed(lang),
                    Unread::Malformed(why) => bad_request(intake::refusal_text(why), lang),
                };
                return self.marked(resp, None, "refused");
            }
            Ok(decided) => decided,
        };
        // A proof or captcha cookie the request carried was spent (or
        // refused): expired, unless it is to be handed in again.
        let spent = proof::Spent::of(req.headers());
        match outcome {
            Outcome::Own => {
                let rest = self.intake.own_path(&ctx).unwrap_or_default();
                let resp = own::answer(self, &req, rest, &ctx).await;
                self.marked(resp, None, "own")
            }
            Outcome::Unmatched => {
                let upgrades = self.forwarding.unmatched_upgrades;
                let resp = self
                    .forwarding
                    .forward(req, &ctx, None, None, upgrades)
                    .await;
                self.marked(resp, None, "unmatched")
            }
            Outcome::NotFound => {
                let resp = not_found(Language::Auto.choose(req.headers()));
                self.marked(resp, None, "not_found")
            }
            Outcome::Bypass(room) => {
                let upgrades = room.config.bypass_upgrades;
                let resp = self
                    .forwarding
                    .forward(req, &ctx, Some(&room), None, upgrades)
                    .await;
                self.marked(resp, Some(&room), "bypass")
            }
            Outcome::FailOpen(room) => {
                let resp = self
                    .forwarding
                    .forward(req, &ctx, Some(&room), None, true)
                    .await;
                self.marked(resp, Some(&room), "fail_open")
            }
            Outcome::Admit(room, admitted) => {
                let resp = self
                    .forwarding
                    .forward(req, &ctx, Some(&room), Some(admitted), true);
                let mut resp = resp.await;
                spent.expire(&mut resp);
                self.marked(resp, Some(&room), "admitted")
            }
            Outcome::Show(room, shown) => {
                let mut resp =
                    pages::show(&self.intake, Some(&room), &shown, req.headers(), ctx.now);
                if !matches!(shown, Shown::CaptchaBusy { .. }) {
                    spent.expire(&mut resp);
                }
                self.marked(resp, Some(&room), shown.outcome())
            }
        }
    }

    /// The phases, for the reverse proxy and decision mode alike (`req` is
    /// the request itself, or the original request a proxy described):
    /// written once, so a rule added to a phase holds in both modes.
    ///
    /// Phase 1, canonical (`Intake::context`), then [`Gate::route`].
    async fn outcome<'c, B>(
        &self,
        req: &Request<B>,
        conn: &'c ConnInfo,
    ) -> Result<(Ctx<'c>, Outcome), Unread> {
        let ctx = self.intake.context(req, conn, self.clock.now_ms())?;
        let outcome = self.route(req.method(), req.headers(), &ctx).await;
        Ok((ctx, outcome))
    }

    /// Phases 2 to 5 of [`Gate::outcome`]: 2. route (the reserved prefix,
    /// the room, or none); 3. bypass; 4 and 5, the admission's answer,
    /// and for a visitor let in whether the path is one of the room's
    /// `end_session_paths` (the session ends with this request).
    async fn route(&self, method: &Method, headers: &HeaderMap, ctx: &Ctx<'_>) -> Outcome {
        if self.intake.own_path(ctx).is_some() {
            return Outcome::Own;
        }
        let path = ctx.canonical.path();
        let key = ctx.canonical.match_key();
        let Some(room) = self.rooms.matching(ctx.canonical.host(), &key).cloned() else {
            return match self.intake.unmatched {
                Unmatched::Forward => Outcome::Unmatched,
                Unmatched::NotFound => Outcome::NotFound,
            };
        };
        if room.bypasses(&key, path, ctx.client, headers) {
            return Outcome::Bypass(room);
        }
        match self.admission.answer(&room, method, headers, ctx).await {
            Answer::In(mut admitted) => {
                admitted.ends_session = room.ends_session(&key, path);
                Outcome::Admit(room, admitted)
            }
            Answer::Show(shown) => Outcome::Show(room, shown),
            Answer::FailOpen => Outcome::FailOpen(room),
        }
    }

    /// Upkeep, on a timer: idle limiter entries forgotten, then every
    /// room's figures (`Operator::refresh_room_figures`).
    pub async fn refresh_room_figures(&self) {
        self.admission.forget_idle(&self.rooms);
        self.operator.refresh_room_figures(&self.rooms).await;
    }

    /// Operators' runtime changes and due events, on a timer
    /// (`Operator::refresh_overrides`).
    pub async fn refresh_overrides(&self) {
        self.operator.refresh_overrides(&self.rooms).await;
    }

    /// `room`'s page as a visitor in `state` would see it now, in `lang`,
    /// with sample figures (`preview`): nothing read from or written to
    /// the store.
    pub(crate) fn preview(
        &self,
        room: &Room,
        state: preview::PreviewState,
        lang: crate::i18n::Lang,
    ) -> String {
        let url = self.intake.status_url(&room.config.id);
        preview::render(room, state, lang, url, self.clock.now_ms())
    }
}

/// The `room=` parameter of a query (the daemon's own endpoints).
fn room_param(query: Option<&str>) -> Option<&str> {
    query?.split('&').find_map(|kv| kv.strip_prefix("room="))
}
