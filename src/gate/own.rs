//! The daemon's own paths under the reserved prefix (`status`, `health`,
//! `ready`, `page`, `end`; the decision endpoints are `decide`'s), and
//! the status JSON every page and poll shows.

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use super::{limits, pages, proof, Admitted, Ctx, Decision, Gate, Room};
use crate::body::Body;
use crate::clock::Millis;
use crate::config::FailMode;
use crate::i18n::Language;
use crate::queue_page::{self, Status, VisitorState};
use crate::respond::{json, not_found, retry_after, text};
use crate::store::QueuePlace;
use crate::ticket::{Grant, Ticket};

impl Gate {
    /// Phase 2 for the daemon's own paths.
    pub(super) async fn reserved(
        &self,
        req: &Request<Incoming>,
        rest: &str,
        ctx: &Ctx<'_>,
    ) -> Response<Body> {
        match (req.method(), rest) {
            (&Method::GET, "status") => self.status_endpoint(req, ctx).await,
            (&Method::GET, "health") => text(StatusCode::OK, "ok"),
            (&Method::GET, "ready") => self.ready_endpoint().await,
            (_, "page") => self.page_endpoint(req.headers(), ctx.peer_trusted),
            (&Method::POST, "end") => {
                let query = ctx.canonical.query();
                self.end_endpoint(req.headers(), query, ctx.peer_trusted)
                    .await
            }
            _ => not_found(Language::Auto.choose(req.headers())),
        }
    }

    /// `GET /__waitroom/status?room=ID`: the visitor's standing, as JSON.
    /// A queued visitor's call is a poll (and may admit them), through the
    /// same path as a page load.
    pub(super) async fn status_endpoint(
        &self,
        req: &Request<Incoming>,
        ctx: &Ctx<'_>,
    ) -> Response<Body> {
        let room = match super::room_param(ctx.canonical.query()) {
            Some(id) => self.rooms.by_id(id),
            None => self.rooms.matching(ctx.canonical.host(), "/"),
        };
        let Some(room) = room.cloned() else {
            return json(
                StatusCode::NOT_FOUND,
                &serde_json::json!({"error": "unknown room"}),
                None,
            );
        };
        let ticket = self.tickets.open(&room, req.headers(), ctx.now, ctx.net);
        let polled = match ticket {
            Some(Ticket {
                visitor,
                grant: Grant::Queued { seq, lane },
                ..
            }) => Some(self.poll(&room, visitor, lane, seq, ctx).await),
            Some(Ticket {
                visitor,
                grant: Grant::Shadow { since_ms, position },
                ..
            }) => Some(Ok(self.shadow_poll(&room, visitor, since_ms, position, ctx))),
            _ => None,
        };
        let (status, cookie) = match (ticket, polled) {
            (_, Some(polled)) => match polled {
                Ok(Decision::Forward(Admitted { ticket, .. })) => (
                    self.status(&room, ctx.now, VisitorState::Admitted, None),
                    ticket.map(|t| self.tickets.set_cookie(&room, &t, ctx.now)),
                ),
                Ok(Decision::Queued { place, ticket }) => {
                    let status = self.queued_status(&room, ctx.now, place, ticket.lane());
                    (
                        status,
                        Some(self.tickets.set_cookie(&room, &ticket, ctx.now)),
                    )
                }
                Ok(Decision::Rejected(reason)) => (
                    self.status(&room, ctx.now, pages::reject_state(reason), None),
                    None,
                ),
                Ok(Decision::SlowDown(wait)) => {
                    let seconds = limits::retry_after_secs(wait);
                    let mut status = self.status(&room, ctx.now, VisitorState::Queued, None);
                    status.refresh_seconds = seconds;
                    let mut resp = json(StatusCode::TOO_MANY_REQUESTS, &status, None);
                    retry_after(&mut resp, seconds);
                    return resp;
                }
                // The place is gone; loading the room's page hands out a new one.
                Ok(
                    Decision::Ended
                    | Decision::TooManyArrivals(_)
                    | Decision::Challenge(_)
                    | Decision::Captcha
                    | Decision::CaptchaBusy
                    | Decision::TokenRefused { .. },
                ) => (self.status(&room, ctx.now, VisitorState::None, None), None),
                // The store is down: tell the page to keep waiting.
                Err(_) => (
                    self.status(&room, ctx.now, VisitorState::Queued, None),
                    None,
                ),
            },
            (
                Some(Ticket {
                    grant: Grant::Admitted { .. },
                    ..
                }),
                None,
            ) => (
                self.status(&room, ctx.now, VisitorState::Admitted, None),
                None,
            ),
            // No ticket while the room wants a proof of work: the challenge,
            // for apps to solve and hand in with their next request.
            _ if room.asks_proof(ctx.now) => {
                let challenge = self.challenge(&room, ctx.now);
                (self.challenge_status(&room, &challenge, ctx.now), None)
            }
            // The same for a captcha: which provider, and where the token goes.
            _ if room.asks_captcha(ctx.now) => (self.captcha_status(&room, ctx.now), None),
            // No ticket: loading the room's page will hand one out.
            _ => (self.status(&room, ctx.now, VisitorState::None, None), None),
        };
        json(StatusCode::OK, &status, cookie)
    }

    /// `{prefix}ready`, for a load balancer or a kubelet: 503 from the
    /// start of a drain; otherwise 200 when the store answers, or when it
    /// does not and `store.fail_mode` decides without it.
    pub(super) async fn ready_endpoint(&self) -> Response<Body> {
        if self
            .telemetry
            .draining
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return text(StatusCode::SERVICE_UNAVAILABLE, "draining");
        }
        if self.store_ready().await {
            return text(StatusCode::OK, "ready");
        }
        match self.fail_mode {
            FailMode::Open | FailMode::Local => text(
                StatusCode::OK,
                "ready (the store does not answer; fail_mode decides)",
            ),
            FailMode::Closed => text(StatusCode::SERVICE_UNAVAILABLE, "store unavailable"),
        }
    }

    pub(super) fn status(
        &self,
        room: &Room,
        now: Millis,
        state: VisitorState,
        place: Option<QueuePlace>,
    ) -> Status {
        let (mut position, queue_length) = place.map_or((0, 0), |p| (p.position, p.queue_length));
        let in_force = room.in_force(now);
        let event = in_force.event.as_ref().map(|e| &e.spec);
        let mut state = state;
        let mut starts_in_seconds = None;
        let mut eta_seconds =
            room.rate
                .eta_seconds(position, &in_force.policy, room.config.refresh_interval);
        if let (true, Some(e), VisitorState::Queued) = (in_force.before_start(), event, state) {
            state = VisitorState::Prequeue;
            let starts_in = e.start_ms.saturating_sub(now).div_ceil(1000);
            starts_in_seconds = Some(starts_in);
            if e.shuffle_at_start {
                // Places are drawn at the start: no position to show yet.
                position = 0;
                eta_seconds = starts_in;
            } else {
                eta_seconds += starts_in;
            }
        }
        Status {
            room: room.config.id.clone(),
            state,
            position,
            queue_length,
            eta_seconds,
            refresh_seconds: room.config.refresh_interval.as_secs().max(1),
            event: event.map(queue_page::EventInfo::of),
            starts_in_seconds,
            challenge: None,
            captcha: None,
            lane: None,
        }
    }

    /// The status of a visitor queued at `place` in lane `lane`: its
    /// position counts that lane, and its wait is estimated at the lane's
    /// share of the admissions (an upper bound while the other lanes wait).
    pub(super) fn queued_status(
        &self,
        room: &Room,
        now: Millis,
        place: QueuePlace,
        lane: u8,
    ) -> Status {
        let mut status = self.status(room, now, VisitorState::Queued, Some(place));
        let policy = room.policy_at(now);
        let share = u64::from(policy.lanes.shares[usize::from(lane).min(crate::store::MAX_LANES)]);
        if policy.lanes.any() && share > 0 && status.state == VisitorState::Queued {
            let as_if = status.position.saturating_mul(1000) / share;
            status.eta_seconds =
                room.rate
                    .eta_seconds(as_if, &policy, room.config.refresh_interval);
        }
        status.lane = room.lane_name(lane).map(str::to_owned);
        status
    }

    /// The status JSON of a visitor who must first solve `challenge`.
    pub(super) fn challenge_status(
        &self,
        room: &Room,
        challenge: &proof::Challenge,
        now: Millis,
    ) -> Status {
        let mut status = self.status(room, now, VisitorState::Challenge, None);
        status.challenge = Some(queue_page::ChallengeInfo::of(challenge, now));
        status
    }

    /// The status JSON of a visitor who must first pass the room's captcha.
    pub(super) fn captcha_status(&self, room: &Room, now: Millis) -> Status {
        let mut status = self.status(room, now, VisitorState::Challenge, None);
        status.captcha = room
            .config
            .captcha
            .as_ref()
            .map(|c| queue_page::CaptchaInfo::of(c.kind.name(), &c.site_key));
        status
    }

    pub(super) fn status_url(&self, room: &Room) -> String {
        format!("{}status?room={}", self.reserved_prefix, room.config.id)
    }
}
