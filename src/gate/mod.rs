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
//! Every store call goes through the [`guard::StoreGuard`] (timeout,
//! breaker, local fallback); past the timeout, `store.fail_mode` decides.
//!
//! Around the phases, each in its own module: `decide` (decision mode's
//! sink: another proxy asks), `own` (the daemon's own paths
//! and the status JSON), `pages` (what is shown when nothing is
//! forwarded, with the request's one [`pages::Reply`]), `tickets`,
//! `limits`, `proof`, `schedule` and `eta` (what the phases consult),
//! `upkeep` (room figures, runtime changes and events, off the request
//! path), `operator` (changes operators and the origin make), `access`
//! (the access log's marks), `shadow` (the shadow queue) and `captcha` (a
//! captcha provider's challenge).

pub mod access;
pub mod captcha;
pub mod decide;
pub mod eta;
pub mod guard;
pub mod lag;
pub mod lanes;
pub mod limits;
pub mod members;
pub mod operator;
mod own;
pub mod pages;
mod params;
pub mod proof;
pub mod rooms;
pub mod schedule;
mod shadow;
pub mod tickets;
mod upkeep;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{self, HeaderValue};
use http::{HeaderMap, Method, Request, Response};
use hyper::body::Incoming;

use crate::body::Body;
use crate::canonical::Canonical;
use crate::clock::{Millis, SharedClock};
use crate::config::{Config, FailMode, Unmatched};
use crate::domain::VisitorId;
use crate::i18n::Language;
use crate::proxy::{self, headers, Outbound, Proxy};
use crate::queue_page::{self, Msg, Template};
use crate::respond::{bad_request, method_not_allowed, not_found, push_cookie};
use crate::store::{QueuePlace, SharedStore, StoreError, Verdict};
use crate::telemetry::Telemetry;
use crate::ticket::{Grant, KeyRing, Ticket};

use guard::StoreGuard;
use limits::{AddressLimit, ClientLimits};
pub use operator::AmendError;
use pages::{Reply, Shown};
pub use rooms::{Room, Rooms};
use tickets::Tickets;

pub use crate::proxy::X_WAITROOM_COMMAND;

/// The gate in force; a config reload swaps in a new one while requests in
/// flight finish on the old.
pub type SharedGate = Arc<arc_swap::ArcSwap<Gate>>;

/// Everything the admission path needs, built once from the config.
pub struct Gate {
    pub rooms: Rooms,
    tickets: Tickets,
    /// The store, behind its timeout, breaker and fallback (shared with
    /// the tunnels' check-ins).
    pub store: Arc<StoreGuard>,
    pub clock: SharedClock,
    proxy: Proxy,
    reserved_prefix: String,
    unmatched: Unmatched,
    trusted_proxies: Vec<ipnet::IpNet>,
    fail_mode: FailMode,
    /// Pass WebSocket upgrades of requests no room matches.
    unmatched_upgrades: bool,
    /// Which foldable path spellings are refused (see `canonical::check_folding`).
    folding: crate::canonical::Folding,
    /// How long a tunnel may carry nothing.
    tunnel_idle_timeout: Duration,
    pub telemetry: Arc<Telemetry>,
    /// Polls and new tickets per client address.
    pub limits: ClientLimits,
    /// Proof-of-work challenges.
    proofs: proof::Proofs,
    /// Asks captcha providers' verifiers (when a room has one).
    captchas: Option<captcha::Verifier>,
    /// Derives members' visitor ids (`members`).
    member_key: [u8; 32],
    access_log: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error(transparent)]
    Template(#[from] queue_page::TemplateError),
    #[error("origin: {0}")]
    Origin(#[from] proxy::OriginError),
}

/// What the gate knows of a visitor's connection, worked out once when
/// the connection is accepted.
pub struct ConnInfo {
    /// The TCP peer.
    pub peer: SocketAddr,
    /// The peer's address as header text (`X-Forwarded-For`).
    pub peer_text: HeaderValue,
    /// The worker thread serving the connection (its origin pool is used).
    pub worker: usize,
    /// The connection came in on the TLS listener.
    pub tls: bool,
    /// The connection's place under the listener's caps: a WebSocket
    /// tunnel the connection turns into keeps it for its whole life.
    pub place: Option<Arc<dyn Send + Sync>>,
}

impl ConnInfo {
    pub fn new(peer: SocketAddr, worker: usize) -> Self {
        Self {
            peer,
            peer_text: headers::peer_text(peer.ip()),
            worker,
            tls: false,
            place: None,
        }
    }

    /// The same, holding `place` (see [`ConnInfo::place`]).
    pub fn holding(self, place: Arc<dyn Send + Sync>) -> Self {
        Self {
            place: Some(place),
            ..self
        }
    }

    /// The same, for a connection on the TLS listener.
    pub fn over_tls(self) -> Self {
        Self { tls: true, ..self }
    }
}

/// What one request carries through the phases.
pub struct Ctx<'c> {
    /// The connection.
    pub conn: &'c ConnInfo,
    /// The peer is a trusted proxy: its forwarding headers are believed.
    pub peer_trusted: bool,
    /// The visitor's address (the peer, or from a trusted proxy's
    /// `X-Forwarded-For`); what per-address limits and bypasses use.
    pub client: IpAddr,
    /// The client's network (`ticket::network_of`): tickets record it.
    pub net: u64,
    /// The request as matched and forwarded.
    pub canonical: Canonical,
    /// The one clock read of this request.
    pub now: Millis,
}

/// What a newcomer's arrival spent that is good once (noted in the store
/// before the decision): given back if the arrival gets no place.
#[derive(Clone, Copy)]
struct Spent {
    /// An enqueue token's `jti` (its digest).
    jti: Option<u64>,
    /// A single-use lane code (its digest).
    code: Option<u64>,
}

/// Whether a new visitor must, or did, do the room's proof of work.
enum Proof {
    /// The room does not ask for one now.
    NotAsked,
    /// Solved, and the solution was not used before.
    Proven,
    /// This challenge first.
    Wanted(proof::Challenge),
    /// A solution that was no honest attempt (forged, replayed, for another
    /// room, too weak; a captcha token the provider refused) while the room
    /// sends such visitors to the shadow queue.
    Failed,
    /// The room's captcha first.
    CaptchaWanted,
    /// Every captcha verification slot is taken: the same token again shortly.
    CaptchaBusy,
}

/// Why phase 1 refused a request (nothing else was read).
enum Unread {
    /// CONNECT: a tunnel to an authority, which no origin of ours is.
    Connect,
    /// It has no canonical form.
    Malformed(crate::canonical::Refusal),
}

impl std::fmt::Display for Unread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unread::Connect => f.write_str("CONNECT"),
            Unread::Malformed(why) => why.fmt(f),
        }
    }
}

/// What the phases decided for a request ([`Gate::outcome`]), for a
/// sink to carry out: the reverse proxy forwards or renders
/// ([`Gate::phases`]), decision mode answers the proxy that asked
/// (`decide`).
enum Outcome {
    /// Under the reserved prefix ([`Gate::own_path`] gives the rest).
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

/// A ticket's answer: let in, or what to show.
enum Answer {
    In(Admitted),
    Show(Shown),
}

/// An admitted visitor's request, on its way to the origin.
struct Admitted {
    visitor: VisitorId,
    /// Its session's expiry, as its ticket says (the store finds the
    /// session by it, should the origin revoke it).
    session_expires_ms: Millis,
    /// Re-issue the cookie with this ticket.
    ticket: Option<Ticket>,
}

/// The outcome of the ticket phase.
enum Decision {
    /// Forward as this admitted visitor.
    Forward(Admitted),
    /// Show the queue (or its JSON) with this cookie.
    Queued {
        place: QueuePlace,
        ticket: Ticket,
    },
    Rejected(crate::domain::RejectReason),
    /// A queued visitor (or its address) polls too often: 429, place kept.
    SlowDown(Duration),
    /// The address asks for new tickets too fast: 429.
    TooManyArrivals(Duration),
    /// The queue place was ended (released, reset): a newcomer again.
    Ended,
    /// A new visitor must first solve this (proof of work).
    Challenge(proof::Challenge),
    /// A new visitor must first pass the room's captcha provider.
    Captcha,
    /// A new visitor's captcha token could not be checked now: hand it in
    /// again shortly.
    CaptchaBusy,
    /// Turned away for its enqueue token (`missing` where one is required).
    TokenRefused {
        missing: bool,
    },
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
        let s = &config.server;
        Ok(Self {
            rooms: Rooms::new(rooms),
            tickets: Tickets::new(KeyRing::new(&config.cookie.keys), &config.cookie),
            proofs: proof::Proofs::new(&config.cookie.keys),
            member_key: members::member_key(
                &config.cookie.keys.first().map(|k| k.0).unwrap_or_default(),
            ),
            captchas: config
                .rooms
                .iter()
                .any(|r| r.captcha.is_some())
                .then(|| captcha::Verifier::new(&config.rooms)),
            store: Arc::new(StoreGuard::new(
                config,
                store,
                clock.clone(),
                telemetry.clone(),
            )),
            proxy: Proxy::new(
                &config.origin,
                config.server.workers(),
                proxy::upload::Allowance {
                    timeout: s.request_body_timeout,
                    min_rate: s.request_body_min_rate,
                },
            )?,
            reserved_prefix: s.reserved_prefix.clone(),
            unmatched: s.unmatched,
            trusted_proxies: s.trusted_proxies.clone(),
            fail_mode: config.store.fail_mode,
            unmatched_upgrades: s.unmatched_upgrades,
            folding: crate::canonical::Folding {
                allow_colons: s.allow_path_colons,
                case_insensitive: config.rooms.iter().any(|r| r.case_insensitive_paths),
            },
            tunnel_idle_timeout: s.tunnel_idle_timeout,
            telemetry,
            limits: ClientLimits::new(
                AddressLimit::new(s.ip_polls_per_second, s.ip_poll_burst, clock.clone()),
                AddressLimit::new(s.ip_arrivals_per_second, s.ip_arrival_burst, clock.clone()),
                clock.clone(),
            ),
            clock,
            access_log: s.access_log,
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
        let client = headers::client_ip(req.headers(), peer, &self.trusted_proxies);
        let id = access::request_id(
            req.headers(),
            headers::is_trusted(peer, &self.trusted_proxies),
        );
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
        if let Some(rest) = self.decision_path(req.uri().path()) {
            let rest = rest.to_owned();
            return self.decide(req, conn, &rest).await;
        }
        let (ctx, outcome) = match self.outcome(&req, conn).await {
            Err(why) => {
                tracing::debug!(peer = %conn.peer, %why, "request refused");
                let lang = Language::Auto.choose(req.headers());
                let resp = match why {
                    Unread::Connect => method_not_allowed(lang),
                    Unread::Malformed(why) => bad_request(refusal_text(why), lang),
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
                let rest = self.own_path(&ctx).unwrap_or_default();
                let resp = self.reserved(&req, rest, &ctx).await;
                self.marked(resp, None, "own")
            }
            Outcome::Unmatched => {
                let upgrades = self.unmatched_upgrades;
                let resp = self.forward(req, &ctx, None, None, upgrades).await;
                self.marked(resp, None, "unmatched")
            }
            Outcome::NotFound => {
                let resp = not_found(Language::Auto.choose(req.headers()));
                self.marked(resp, None, "not_found")
            }
            Outcome::Bypass(room) => {
                let upgrades = room.config.bypass_upgrades;
                let resp = self.forward(req, &ctx, Some(&room), None, upgrades).await;
                self.marked(resp, Some(&room), "bypass")
            }
            Outcome::FailOpen(room) => {
                let resp = self.forward(req, &ctx, Some(&room), None, true).await;
                self.marked(resp, Some(&room), "fail_open")
            }
            Outcome::Admit(room, admitted) => {
                let mut resp = self
                    .forward(req, &ctx, Some(&room), Some(admitted), true)
                    .await;
                spent.expire(&mut resp);
                self.marked(resp, Some(&room), "admitted")
            }
            Outcome::Show(room, shown) => {
                let mut resp = self.show(Some(&room), &shown, req.headers(), ctx.now);
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
    /// Phase 1, canonical ([`Gate::context`]), then [`Gate::route`]:
    /// the reserved prefix, the room or none, bypass, ticket (or the
    /// store's failure policy), and let in or what to show.
    async fn outcome<'c, B>(
        &self,
        req: &Request<B>,
        conn: &'c ConnInfo,
    ) -> Result<(Ctx<'c>, Outcome), Unread> {
        if req.method() == Method::CONNECT {
            return Err(Unread::Connect);
        }
        let ctx = self.context(req, conn).map_err(Unread::Malformed)?;
        let outcome = self.route(req.method(), req.headers(), &ctx).await;
        Ok((ctx, outcome))
    }

    /// The rest of the canonical path after the reserved prefix, for the
    /// daemon's own paths (borrowed: every queued visitor's poll is one).
    fn own_path<'c>(&self, ctx: &'c Ctx<'_>) -> Option<&'c str> {
        ctx.canonical
            .path()
            .strip_prefix(self.reserved_prefix.as_str())
    }

    /// Phases 2 to 5 of [`Gate::outcome`]: 2. route (the reserved prefix,
    /// the room, or none); 3. bypass; 4. ticket, or the store's failure
    /// policy; 5. let in, or what to show (a browser that brought the
    /// daemon's own parameters is sent on without them).
    async fn route(&self, method: &Method, headers: &HeaderMap, ctx: &Ctx<'_>) -> Outcome {
        if self.own_path(ctx).is_some() {
            return Outcome::Own;
        }
        let path = ctx.canonical.path();
        let key = ctx.canonical.match_key();
        let Some(room) = self.rooms.matching(ctx.canonical.host(), &key).cloned() else {
            return match self.unmatched {
                Unmatched::Forward => Outcome::Unmatched,
                Unmatched::NotFound => Outcome::NotFound,
            };
        };
        if room.bypasses(&key, path, ctx.client, headers) {
            return Outcome::Bypass(room);
        }
        let answer = match self.ticket(&room, headers, ctx).await {
            Ok(d) => self.shown(&room, d, ctx),
            Err(e) => match self.store_failure(&room, &e) {
                None => return Outcome::FailOpen(room),
                Some(shown) => Answer::Show(shown),
            },
        };
        match self.cleaned(&room, answer, method, headers, ctx) {
            Answer::In(admitted) => Outcome::Admit(room, admitted),
            Answer::Show(shown) => Outcome::Show(room, shown),
        }
    }

    /// Phase 1 for `req`: its canonical form, its client, the clock.
    fn context<'c, B>(
        &self,
        req: &Request<B>,
        conn: &'c ConnInfo,
    ) -> Result<Ctx<'c>, crate::canonical::Refusal> {
        let canonical = Canonical::of(req)?;
        crate::canonical::check_folding(canonical.path(), self.folding)?;
        let peer = conn.peer.ip();
        let client = headers::client_ip(req.headers(), peer, &self.trusted_proxies);
        Ok(Ctx {
            conn,
            peer_trusted: headers::is_trusted(peer, &self.trusted_proxies),
            client,
            net: crate::ticket::network_of(client),
            canonical,
            now: self.clock.now_ms(),
        })
    }

    /// What a decision shows the visitor, or the admitted visitor to let in.
    fn shown(&self, room: &Room, decision: Decision, ctx: &Ctx<'_>) -> Answer {
        Answer::Show(match decision {
            Decision::Forward(admitted) => return Answer::In(admitted),
            Decision::Queued { place, ticket } => Shown::Queue {
                seq: place.seq,
                position: place.position,
                queue_length: place.queue_length,
                lane: ticket.lane(),
                cookie: self.tickets.set_cookie(room, &ticket, ctx.now),
            },
            Decision::Rejected(reason) => Shown::Rejected { reason },
            Decision::SlowDown(wait) => Shown::SlowDown { ms: millis(wait) },
            Decision::TooManyArrivals(wait) => Shown::TooManyArrivals { ms: millis(wait) },
            // `ticket` turns an ended place into a new arrival.
            Decision::Ended => Shown::Unavailable,
            Decision::Captcha => Shown::Captcha,
            Decision::CaptchaBusy => Shown::CaptchaBusy {
                ms: millis(captcha::BUSY_RETRY),
            },
            Decision::TokenRefused { missing } => Shown::TokenRefused { missing },
            Decision::Challenge(c) => Shown::Challenge {
                text: c.text,
                bits: c.bits,
                expires_ms: c.expires_ms,
            },
        })
    }

    /// Renders what the gate decided to show (the page, or JSON for apps
    /// that ask for it), for a request with these headers.
    /// The status is [`Shown::status`]'s: decision mode tells a proxy
    /// the status of a page it does not render.
    fn show(
        &self,
        room: Option<&Room>,
        shown: &Shown,
        headers: &HeaderMap,
        now: Millis,
    ) -> Response<Body> {
        let mut resp = self.render(room, shown, headers, now);
        *resp.status_mut() = shown.status(room);
        resp
    }

    fn render(
        &self,
        room: Option<&Room>,
        shown: &Shown,
        headers: &HeaderMap,
        now: Millis,
    ) -> Response<Body> {
        let Some(room) = room else {
            let lang = Reply::roomless(headers).lang();
            return match shown {
                Shown::Refused { host: true } => bad_request(Msg::BadHost, lang),
                Shown::Refused { host: false } => bad_request(Msg::BadAddress, lang),
                Shown::NotAllowed => method_not_allowed(lang),
                _ => not_found(lang),
            };
        };
        let reply = Reply::for_room(room, headers);
        match shown {
            Shown::Queue {
                seq,
                position,
                queue_length,
                lane,
                cookie,
            } => {
                let place = QueuePlace {
                    seq: *seq,
                    position: *position,
                    queue_length: *queue_length,
                };
                let status = self.queued_status(room, now, place, *lane);
                let in_force = room.in_force(now);
                let template = in_force
                    .event
                    .as_ref()
                    .and_then(|e| e.template.as_ref())
                    .unwrap_or(&room.template);
                pages::queue(
                    room,
                    template,
                    &status,
                    &reply,
                    self.status_url(room),
                    now,
                    Some(cookie.clone()),
                )
            }
            Shown::Challenge {
                text,
                bits,
                expires_ms,
            } => {
                let challenge = proof::Challenge {
                    text: text.clone(),
                    bits: *bits,
                    expires_ms: *expires_ms,
                };
                let status = self.challenge_status(room, &challenge, now);
                pages::challenge(room, &status, &challenge, &reply)
            }
            Shown::CaptchaBusy { ms } => pages::captcha_busy(Duration::from_millis(*ms), &reply),
            Shown::TokenRefused { missing } => pages::token_refused(*missing, &reply),
            Shown::Clean { to, cookie, .. } => pages::clean(to, cookie.clone()),
            Shown::Captcha => {
                let status = self.captcha_status(room, now);
                pages::captcha(room, &status, &reply)
            }
            Shown::Rejected { reason } => pages::rejected(room, *reason, &reply),
            Shown::SlowDown { ms } => pages::slow_down(Duration::from_millis(*ms), &reply),
            Shown::TooManyArrivals { ms } => {
                pages::too_many_arrivals(Duration::from_millis(*ms), &reply)
            }
            Shown::Unavailable | Shown::Shed => pages::store_unavailable(room, &reply),
            Shown::Refused { .. } | Shown::NotFound | Shown::NotAllowed => {
                self.render(None, shown, headers, now)
            }
        }
    }

    /// Phase 4: what this request's ticket (or its absence) earns.
    async fn ticket(
        &self,
        room: &Room,
        req: &HeaderMap,
        ctx: &Ctx<'_>,
    ) -> Result<Decision, StoreError> {
        let now = ctx.now;
        match self.tickets.open(room, req, now, ctx.net) {
            Some(Ticket {
                visitor,
                grant:
                    Grant::Admitted {
                        session_expires_ms,
                        check_in_due_ms,
                    },
                net,
                ..
            }) if now < session_expires_ms => {
                if let Some(issued) = net.filter(|&n| n != ctx.net && self.tickets.max_networks > 0)
                {
                    return self
                        .moved_network(room, req, visitor, issued, session_expires_ms, ctx)
                        .await;
                }
                if now < check_in_due_ms && !room.ended_here.holds(visitor, now) {
                    return Ok(Decision::Forward(Admitted {
                        visitor,
                        session_expires_ms,
                        ticket: None,
                    }));
                }
                match self
                    .store
                    .check_in(room, visitor, session_expires_ms, now)
                    .await
                {
                    Ok(Some(expires)) => Ok(Decision::Forward(Admitted {
                        visitor,
                        session_expires_ms: expires,
                        ticket: Some(self.tickets.admitted(room, visitor, expires, now, ctx.net)),
                    })),
                    // Revoked, released or expired in the store: a new visitor.
                    Ok(None) => self.new_visitor(room, req, ctx).await,
                    // The ticket is valid; an unreachable store is no reason
                    // to stop an admitted visitor. The next request checks in again.
                    Err(_) => Ok(Decision::Forward(Admitted {
                        visitor,
                        session_expires_ms,
                        ticket: None,
                    })),
                }
            }
            Some(Ticket {
                visitor,
                grant: Grant::Queued { seq, lane },
                ..
            }) => match self.poll(room, visitor, lane, seq, ctx).await? {
                Decision::Ended => self.new_visitor(room, req, ctx).await,
                decision => Ok(decision),
            },
            Some(Ticket {
                visitor,
                grant: Grant::Shadow { since_ms, position },
                ..
            }) => match self.shadow_poll(room, visitor, since_ms, position, ctx) {
                Decision::Ended => self.new_visitor(room, req, ctx).await,
                decision => Ok(decision),
            },
            _ => self.new_visitor(room, req, ctx).await,
        }
    }

    /// An admitted ticket used from another network than it was issued to:
    /// the store counts the session's networks. Within the limit the
    /// ticket follows the visitor (a phone moving from Wi-Fi to mobile
    /// data); over it the ticket is shared, and the session is ended.
    async fn moved_network(
        &self,
        room: &Room,
        req: &HeaderMap,
        visitor: VisitorId,
        issued: u64,
        session_expires_ms: Millis,
        ctx: &Ctx<'_>,
    ) -> Result<Decision, StoreError> {
        let set = format!("nets:{}", visitor.to_hex());
        let noted = self
            .store
            .note(room, &set, &[issued, ctx.net], session_expires_ms, ctx.now)
            .await;
        match noted {
            Ok(n) if n.size > self.tickets.max_networks => {
                room.metrics.shared.inc();
                tracing::warn!(
                    room = %room.config.id,
                    visitor = %visitor,
                    networks = n.size,
                    limit = self.tickets.max_networks,
                    "an admitted ticket was used from too many networks; its session is ended"
                );
                room.ended(visitor, ctx.now);
                let ended = self
                    .store
                    .end_session(room, visitor, session_expires_ms, ctx.now);
                if let Err(e) = ended.await {
                    tracing::warn!(room = %room.config.id, error = %e, "shared session not ended");
                }
                self.new_visitor(room, req, ctx).await
            }
            Ok(_) => Ok(Decision::Forward(Admitted {
                visitor,
                session_expires_ms,
                ticket: Some(self.tickets.admitted(
                    room,
                    visitor,
                    session_expires_ms,
                    ctx.now,
                    ctx.net,
                )),
            })),
            // Unknown for now: the ticket stands, and the next request asks again.
            Err(_) => Ok(Decision::Forward(Admitted {
                visitor,
                session_expires_ms,
                ticket: None,
            })),
        }
    }

    /// A queued visitor's poll: the one path for the page and the status
    /// endpoint. Limited per visitor and address before the store is asked.
    async fn poll(
        &self,
        room: &Room,
        visitor: VisitorId,
        lane: u8,
        seq: u64,
        ctx: &Ctx<'_>,
    ) -> Result<Decision, StoreError> {
        if let Err(wait) = self.poll_limited(room, visitor, ctx) {
            return Ok(Decision::SlowDown(wait));
        }
        self.start_due_event(room, ctx.now).await;
        let lane = room.known_lane(lane);
        let verdict = self.store.poll(room, visitor, lane, seq, ctx.now).await?;
        if matches!(verdict, Verdict::Admitted { .. }) {
            room.metrics.admitted.inc();
            room.metrics.queue_wait.admitted(seq, ctx.now);
            if let Some(m) = usize::from(lane)
                .checked_sub(1)
                .and_then(|i| room.metrics.lanes.get(i))
            {
                m.admitted.inc();
            }
        }
        Ok(self.verdict(room, visitor, lane, verdict, ctx))
    }

    /// A poll too soon for the visitor's or its address's allowance: how
    /// long to wait. The queue's polls and the shadow queue's alike.
    fn poll_limited(&self, room: &Room, visitor: VisitorId, ctx: &Ctx<'_>) -> Result<(), Duration> {
        room.poll_limit
            .check(visitor)
            .and_then(|()| self.limits.polls.check(ctx.client))
    }

    /// A visitor without a usable ticket: one decision, unless its address
    /// asks for new tickets too fast or the room wants a proof of work first.
    async fn new_visitor(
        &self,
        room: &Room,
        req: &HeaderMap,
        ctx: &Ctx<'_>,
    ) -> Result<Decision, StoreError> {
        if let Err(wait) = self.limits.arrivals.check(ctx.client) {
            room.metrics.limited.inc();
            return Ok(Decision::TooManyArrivals(wait));
        }
        if let Some(wait) = self.codes_blocked(room, req, ctx) {
            room.metrics.limited.inc();
            return Ok(Decision::TooManyArrivals(wait));
        }
        self.start_due_event(room, ctx.now).await;
        if self.is_bot(room, req, ctx) && self.shadows(room) {
            return Ok(self.shadowed(room, ctx));
        }
        // A member (a verified enqueue token) is who the site says: no
        // challenge, and their own session or place wherever they come from.
        match self.enqueue_entry(room, req, ctx).await? {
            members::Entry::Anyone => {}
            members::Entry::Refused { missing } => return Ok(Decision::TokenRefused { missing }),
            members::Entry::Limited(wait) => return Ok(Decision::TooManyArrivals(wait)),
            members::Entry::Member {
                visitor,
                claim,
                unseen,
                jti,
            } => {
                let spent = |code| Spent { jti, code };
                let (lane, code) = match self.lane_entry(room, req, ctx, claim.as_deref()).await {
                    Ok(entry) => entry,
                    Err(e) => return Err(self.give_back(room, spent(None), e, ctx).await),
                };
                let verdict = match self
                    .store
                    .arrive_member(room, visitor, lane, unseen, ctx.now)
                    .await
                {
                    Ok(verdict) => verdict,
                    Err(e) => return Err(self.give_back(room, spent(code), e, ctx).await),
                };
                match verdict {
                    Verdict::Admitted { .. } => room.metrics.admitted.inc(),
                    Verdict::Queued(_) => {
                        room.set_queueing(true);
                        room.metrics.queued.inc()
                    }
                    Verdict::Rejected(_) => {
                        self.give_back_unused(room, spent(code), ctx).await;
                        room.metrics.rejected.inc()
                    }
                    Verdict::Ended => 0,
                };
                return Ok(self.verdict(room, visitor, lane, verdict, ctx));
            }
        }
        let proof = match room.config.captcha {
            Some(_) => self.captcha_wanted(room, req, ctx).await?,
            None => self.proof_wanted(room, req, ctx).await?,
        };
        let proven = match proof {
            Proof::Wanted(challenge) => return Ok(Decision::Challenge(challenge)),
            Proof::CaptchaWanted => return Ok(Decision::Captcha),
            Proof::CaptchaBusy => return Ok(Decision::CaptchaBusy),
            Proof::Failed => return Ok(self.shadowed(room, ctx)),
            Proof::Proven => true,
            Proof::NotAsked => false,
        };
        // (A code is spent only once the challenge is passed, and given
        // back if the arrival gets no place.)
        let (lane, code) = self.lane_entry(room, req, ctx, None).await?;
        let spent = Spent { jti: None, code };
        let (visitor, verdict) = match self.store.arrive(room, lane, ctx.now).await {
            Ok(decided) => decided,
            Err(e) => return Err(self.give_back(room, spent, e, ctx).await),
        };
        if let Verdict::Rejected(_) = verdict {
            self.give_back_unused(room, spent, ctx).await;
        }
        match verdict {
            Verdict::Admitted { .. } => room.metrics.admitted.inc(),
            // The room just began to queue: this visitor gets no place
            // without the proof of work, like everyone after it (but for
            // a lane's, whose code vouched for it and is spent).
            Verdict::Queued(_) if room.config.proof_of_work > 0 && !proven && lane == 0 => {
                room.set_queueing(true);
                self.store.release(room, visitor, ctx.now).await?;
                return Ok(Decision::Challenge(self.challenge(room, ctx.now)));
            }
            Verdict::Queued(_) if room.config.captcha.is_some() && !proven && lane == 0 => {
                room.set_queueing(true);
                self.store.release(room, visitor, ctx.now).await?;
                room.metrics.challenged.inc();
                return Ok(Decision::Captcha);
            }
            Verdict::Queued(_) => {
                room.set_queueing(true);
                room.metrics.queued.inc()
            }
            Verdict::Rejected(_) => room.metrics.rejected.inc(),
            Verdict::Ended => 0,
        };
        Ok(self.verdict(room, visitor, lane, verdict, ctx))
    }

    /// While the room queues and asks for proof of work: a challenge for a
    /// request without a good solution; `Proven` for one with a solution
    /// that holds and was not used before.
    async fn proof_wanted(
        &self,
        room: &Room,
        req: &HeaderMap,
        ctx: &Ctx<'_>,
    ) -> Result<Proof, StoreError> {
        if !room.asks_proof(ctx.now) {
            return Ok(Proof::NotAsked);
        }
        let id = room.config.id.as_str();
        let refused = match proof::presented(req).map(|s| self.proofs.check(id, s, ctx.now)) {
            None => None,
            Some(Ok(solved)) => {
                match self
                    .claim(room, "proofs", solved.nonce, solved.expires_ms, ctx)
                    .await?
                {
                    proof::Claim::First => return Ok(Proof::Proven),
                    proof::Claim::Again => Some(proof::Refusal::Again),
                    proof::Claim::Foreign => Some(proof::Refusal::Replayed),
                }
            }
            Some(Err(why)) => Some(why),
        };
        if let Some(why) = refused {
            room.metrics.proof_refused.inc();
            tracing::debug!(room = id, client = %ctx.client, %why, "proof of work refused");
            // A late solution, or one its network hands in again, is an
            // honest one: it gets a new challenge.
            let honest = matches!(why, proof::Refusal::Expired | proof::Refusal::Again);
            if !honest && self.shadows(room) {
                return Ok(Proof::Failed);
            }
        }
        Ok(Proof::Wanted(self.challenge(room, ctx.now)))
    }

    /// Gives back what an arrival spent (a token's `jti`, a single-use
    /// lane code) when its decision failed: it bought no place, so its
    /// bearer may use it again. Returns the error, for the caller's `?`.
    async fn give_back(
        &self,
        room: &Room,
        spent: Spent,
        error: StoreError,
        ctx: &Ctx<'_>,
    ) -> StoreError {
        self.give_back_unused(room, spent, ctx).await;
        error
    }

    /// Gives back what an arrival spent that got no place (refused: the
    /// room closed, the queue full; or its decision failed).
    async fn give_back_unused(&self, room: &Room, spent: Spent, ctx: &Ctx<'_>) {
        for (set, member) in [("jti", spent.jti), ("codes", spent.code)] {
            let Some(member) = member else { continue };
            if let Err(e) = self.store.forget(room, set, &[member]).await {
                // The store away: what was noted stays spent.
                tracing::warn!(room = %room.config.id, client = %ctx.client, set, error = %e, "a single-use token or code could not be given back");
            }
        }
    }

    /// A fresh proof-of-work challenge for `room`, counted.
    fn challenge(&self, room: &Room, now: Millis) -> proof::Challenge {
        room.metrics.challenged.inc();
        self.proofs
            .issue(&room.config.id, room.config.proof_of_work, now)
    }

    fn verdict(
        &self,
        room: &Room,
        visitor: VisitorId,
        lane: u8,
        verdict: Verdict,
        ctx: &Ctx<'_>,
    ) -> Decision {
        let now = ctx.now;
        match verdict {
            Verdict::Admitted { session_expires_ms } => Decision::Forward(Admitted {
                visitor,
                session_expires_ms,
                ticket: Some(self.tickets.admitted(
                    room,
                    visitor,
                    session_expires_ms,
                    now,
                    ctx.net,
                )),
            }),
            Verdict::Queued(place) => Decision::Queued {
                place,
                ticket: self
                    .tickets
                    .queued(room, visitor, lane, place, now, ctx.net),
            },
            Verdict::Rejected(reason) => Decision::Rejected(reason),
            Verdict::Ended => Decision::Ended,
        }
    }

    /// What a store call that failed means for this request (the
    /// reverse proxy's and decision mode's alike): `None` lets it through
    /// unchecked (`fail_mode` open, or local, whose own store cannot
    /// fail), else what to show. An instance that is behind (`Busy`) lets
    /// nobody in unchecked, whatever the fail mode, and answers at next to
    /// no cost.
    fn store_failure(&self, room: &Room, error: &StoreError) -> Option<Shown> {
        tracing::debug!(room = %room.config.id, %error, "store call failed");
        if matches!(error, StoreError::Busy) {
            room.metrics.shed.inc();
            return Some(Shown::Shed);
        }
        match self.fail_mode {
            FailMode::Open | FailMode::Local => None,
            FailMode::Closed => Some(Shown::Unavailable),
        }
    }

    /// Forwards to the origin; for an admitted visitor names it to the
    /// origin, re-issues its cookie and carries out the origin's
    /// `X-Waitroom-Command` (`close` on any request of the room). A
    /// WebSocket upgrade passes for an admitted visitor (the tunnel ends
    /// with the session) and, when `upgrades` says so, for the others.
    async fn forward(
        &self,
        req: Request<Incoming>,
        ctx: &Ctx<'_>,
        room: Option<&Arc<Room>>,
        admitted: Option<Admitted>,
        upgrades: bool,
    ) -> Response<Body> {
        // Only a request that asks for a WebSocket gets what a tunnel needs
        // (its session's watch is a registration per tunnel).
        let websocket = proxy::tunnel::asks_websocket(req.headers());
        let tunnel = match (&admitted, room) {
            _ if !websocket => None,
            (Some(a), Some(room)) => Some(Box::new(proxy::tunnel::Tunnel {
                place: ctx.conn.place.clone(),
                ended: Some(self.session_end(room, a.visitor, a.session_expires_ms)),
                idle_timeout: self.tunnel_idle_timeout,
            })),
            _ => upgrades.then(|| {
                Box::new(proxy::tunnel::Tunnel {
                    place: ctx.conn.place.clone(),
                    ended: None,
                    idle_timeout: self.tunnel_idle_timeout,
                })
            }),
        };
        let out = Outbound {
            peer_text: &ctx.conn.peer_text,
            peer_trusted: ctx.peer_trusted,
            canonical: &ctx.canonical,
            visitor: admitted.as_ref().map(|a| a.visitor),
            room: room.map(|r| r.config.id.as_str()),
            now_ms: ctx.now,
            worker: ctx.conn.worker,
            tls: ctx.conn.tls,
            tunnel,
        };
        // Kept (not parsed) for the page should the origin fail.
        let accept_language = req.headers().get(header::ACCEPT_LANGUAGE).cloned();
        let started = Instant::now();
        let forwarded = self.proxy.forward(req, out).await;
        self.telemetry
            .metrics
            .origin_latency(started.elapsed().as_secs_f64());
        let (mut resp, command) = match forwarded {
            Ok(forwarded) => forwarded,
            Err(e) => {
                tracing::warn!(error = %e, "origin request failed");
                return pages::origin_error(&e, room.map(|r| &**r), accept_language.as_ref());
            }
        };
        let Some(room) = room else {
            return resp;
        };
        let command = command.as_ref().map(|c| c.as_bytes());
        if command.is_some_and(|c| c.eq_ignore_ascii_case(b"close")) {
            self.sold_out(room).await;
        }
        let Some(Admitted {
            visitor,
            session_expires_ms,
            ticket,
        }) = admitted
        else {
            return resp;
        };
        if command.is_some_and(|c| c.eq_ignore_ascii_case(b"revoke")) {
            let ended = self.end_session(room, visitor, session_expires_ms, ctx.now);
            if let Err(e) = ended.await {
                tracing::warn!(room = %room.config.id, error = %e, "revoke not recorded")
            }
            push_cookie(resp.headers_mut(), self.tickets.expired_cookie(room));
        } else if let Some(ticket) = ticket {
            push_cookie(
                resp.headers_mut(),
                self.tickets.set_cookie(room, &ticket, ctx.now),
            );
        }
        resp
    }

    /// What ends a tunnel opened by `visitor`'s session: the session ended
    /// here, or refused at a check-in (ended elsewhere, or expired). The
    /// tunnel checks in like a request would, once per check-in interval
    /// of the policy in force, so an open WebSocket keeps its session.
    fn session_end(
        &self,
        room: &Arc<Room>,
        visitor: VisitorId,
        expires: Millis,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        let (room, store, clock) = (room.clone(), self.store.clone(), self.clock.clone());
        let mut watch = room.tunnels.watch(visitor);
        Box::pin(async move {
            let mut expires = expires;
            loop {
                let every = Duration::from_millis(room.policy().check_in_interval_ms());
                tokio::select! {
                    () = watch.ended() => return,
                    () = tokio::time::sleep(every) => {}
                }
                match store
                    .check_in(&room, visitor, expires, clock.now_ms())
                    .await
                {
                    Ok(Some(renewed)) => expires = renewed,
                    Ok(None) => return,
                    // Unknown for now: asked again at the next interval.
                    Err(_) => {}
                }
            }
        })
    }
}

/// The `room=` parameter of a query (the daemon's own endpoints).
fn room_param(query: Option<&str>) -> Option<&str> {
    query?.split('&').find_map(|kv| kv.strip_prefix("room="))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The 400 page's sentence for a request that cannot be made canonical.
fn refusal_text(why: crate::canonical::Refusal) -> Msg {
    use crate::canonical::Refusal::*;
    match why {
        MissingHost | DuplicateHost | BadHost | HostMismatch => Msg::BadHost,
        _ => Msg::BadAddress,
    }
}
