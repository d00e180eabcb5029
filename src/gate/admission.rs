//! The admission role: what a request of a room earns (phases 4 and 5).
//! Its ticket opened; an admitted visitor checked in when due; a queued
//! one's poll; a newcomer limited per address, asked for its enqueue token,
//! lane code, proof of work or captcha, and given one `arrive` decision;
//! what to show otherwise, and what a failed store call means. Its parts,
//! each its own file: `tickets`, `limits`, `members` (enqueue tokens),
//! `lanes`, `proof`, `captcha`, `shadow` (the shadow queue) and `params`
//! (the daemon's own query parameters taken out).

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, Method, Response, StatusCode};

use super::guard::StoreGuard;
use super::limits::{self, AddressLimit, ClientLimits};
use super::pages::{self, Reply, Shown};
use super::tickets::Tickets;
use super::{captcha, members, proof, status, upkeep, Ctx, Room, Rooms};
use crate::body::Body;
use crate::clock::{Millis, SharedClock};
use crate::config::{Config, FailMode};
use crate::domain::VisitorId;
use crate::queue_page::VisitorState;
use crate::respond::{json, retry_after};
use crate::store::{QueuePlace, StoreError, Verdict};
use crate::ticket::{Grant, Ticket};

/// What a newcomer's arrival spent that is good once (noted in the store
/// before the decision): given back if the arrival gets no place.
#[derive(Clone, Copy)]
pub(super) struct Spent {
    /// An enqueue token's `jti` (its digest).
    pub(super) jti: Option<u64>,
    /// A single-use lane code (its digest).
    pub(super) code: Option<u64>,
}

/// Whether a new visitor must, or did, do the room's proof of work.
pub(super) enum Proof {
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

/// A ticket's answer: let in, or what to show.
pub(super) enum Answer {
    In(Admitted),
    Show(Shown),
    /// The store failed and `fail_mode` lets the request in unchecked.
    FailOpen,
}

/// An admitted visitor's request, on its way to the origin.
pub(super) struct Admitted {
    pub(super) visitor: VisitorId,
    /// Its session's expiry, as its ticket says (the store finds the
    /// session by it, should the origin revoke it).
    pub(super) session_expires_ms: Millis,
    /// Re-issue the cookie with this ticket.
    pub(super) ticket: Option<Ticket>,
    /// The request is on one of the room's `end_session_paths` (set by
    /// `Gate::route`): the session ends with it, on the origin's 2xx
    /// (`Forwarding::forward`) or, in decision mode, once let in.
    pub(super) ends_session: bool,
}

/// The outcome of the ticket phase.
pub(super) enum Decision {
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

/// Who is let in: the tickets, the per-address limits, the proofs,
/// captchas and enqueue tokens a newcomer may bring, and the store's
/// decisions behind its guard.
pub(super) struct Admission {
    pub(super) tickets: Arc<Tickets>,
    /// The store, behind its timeout, breaker and fallback.
    pub(super) store: Arc<StoreGuard>,
    /// Polls and new tickets per client address.
    pub(super) limits: ClientLimits,
    /// Proof-of-work challenges.
    pub(super) proofs: proof::Proofs,
    /// Asks captcha providers' verifiers (when a room has one).
    pub(super) captchas: Option<captcha::Verifier>,
    /// Derives members' visitor ids (`members`).
    pub(super) member_key: [u8; 32],
    /// What a failed store call means (`store_failure`).
    pub(super) fail_mode: FailMode,
}

impl Admission {
    pub(super) fn new(
        config: &Config,
        tickets: Arc<Tickets>,
        store: Arc<StoreGuard>,
        clock: &SharedClock,
    ) -> Self {
        let s = &config.server;
        Self {
            tickets,
            store,
            limits: ClientLimits::new(
                AddressLimit::new(s.ip_polls_per_second, s.ip_poll_burst, clock.clone()),
                AddressLimit::new(s.ip_arrivals_per_second, s.ip_arrival_burst, clock.clone()),
                clock.clone(),
            ),
            proofs: proof::Proofs::new(&config.cookie.keys),
            captchas: config
                .rooms
                .iter()
                .any(|r| r.captcha.is_some())
                .then(|| captcha::Verifier::new(&config.rooms)),
            member_key: members::member_key(
                &config.cookie.keys.first().map(|k| k.0).unwrap_or_default(),
            ),
            fail_mode: config.store.fail_mode,
        }
    }

    /// Phases 4 and 5 for a request of `room`: what its ticket (or its
    /// absence) earns, or what the store's failure means; then let in, or
    /// what to show (a browser that brought the daemon's own parameters is
    /// sent on without them).
    pub(super) async fn answer(
        &self,
        room: &Room,
        method: &Method,
        headers: &HeaderMap,
        ctx: &Ctx<'_>,
    ) -> Answer {
        let answer = match self.ticket(room, headers, ctx).await {
            Ok(d) => self.shown(room, d, ctx),
            Err(e) => match self.store_failure(room, &e) {
                None => return Answer::FailOpen,
                Some(shown) => Answer::Show(shown),
            },
        };
        self.cleaned(room, answer, method, headers, ctx)
    }

    /// Forgets idle entries of the per-visitor and per-address limits,
    /// when a sweep is due (upkeep).
    pub(super) fn forget_idle(&self, rooms: &Rooms) {
        if self.limits.sweep_due() {
            for room in rooms.all() {
                room.poll_limit.forget_idle();
                room.member_limit.forget_idle();
            }
            self.limits.forget_idle();
        }
    }

    /// The status JSON of `room` for the visitor whose request has these
    /// headers (`GET {prefix}status`). A queued visitor's call is a poll
    /// (and may admit them), through the same path as a page load.
    pub(super) async fn status_json(
        &self,
        room: &Room,
        headers: &HeaderMap,
        ctx: &Ctx<'_>,
    ) -> Response<Body> {
        let reply = Reply::for_room(room, headers);
        let ticket = self.tickets.open(room, headers, ctx.now, ctx.net);
        let polled = match ticket {
            Some(Ticket {
                visitor,
                grant: Grant::Queued { seq, lane },
                ..
            }) => Some(self.poll(room, visitor, lane, seq, ctx).await),
            Some(Ticket {
                visitor,
                grant: Grant::Shadow { since_ms, position },
                ..
            }) => Some(Ok(self.shadow_poll(room, visitor, since_ms, position, ctx))),
            _ => None,
        };
        let (status, cookie) = match (ticket, polled) {
            (_, Some(polled)) => match polled {
                Ok(Decision::Forward(Admitted { ticket, .. })) => (
                    status::of(room, ctx.now, VisitorState::Admitted, None, &reply),
                    ticket.map(|t| self.tickets.set_cookie(room, &t, ctx.now)),
                ),
                Ok(Decision::Queued { place, ticket }) => {
                    let status = status::queued(room, ctx.now, place, ticket.lane(), &reply);
                    (
                        status,
                        Some(self.tickets.set_cookie(room, &ticket, ctx.now)),
                    )
                }
                Ok(Decision::Rejected(reason)) => (
                    status::of(room, ctx.now, pages::reject_state(reason), None, &reply),
                    None,
                ),
                Ok(Decision::SlowDown(wait)) => {
                    let seconds = limits::retry_after_secs(wait);
                    let mut status = status::of(room, ctx.now, VisitorState::Queued, None, &reply);
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
                ) => (
                    status::of(room, ctx.now, VisitorState::None, None, &reply),
                    None,
                ),
                // The store is down: tell the page to keep waiting.
                Err(_) => (
                    status::of(room, ctx.now, VisitorState::Queued, None, &reply),
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
                status::of(room, ctx.now, VisitorState::Admitted, None, &reply),
                None,
            ),
            // No ticket while the room wants a proof of work: the challenge,
            // for apps to solve and hand in with their next request.
            _ if room.asks_proof(ctx.now) => {
                let challenge = self.challenge(room, ctx.now);
                (status::challenge(room, &challenge, ctx.now, &reply), None)
            }
            // The same for a captcha: which provider, and where the token goes.
            _ if room.asks_captcha(ctx.now) => (status::captcha(room, ctx.now, &reply), None),
            // No ticket: loading the room's page will hand one out.
            _ => (
                status::of(room, ctx.now, VisitorState::None, None, &reply),
                None,
            ),
        };
        json(StatusCode::OK, &status, cookie)
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
                        ends_session: false,
                        ticket: None,
                    }));
                }
                match self
                    .store
                    .check_in(room, visitor, session_expires_ms, now)
                    .await
                {
                    Ok(Some(expires)) => {
                        room.metrics.time_on_origin.seen(visitor, now);
                        Ok(Decision::Forward(Admitted {
                            visitor,
                            session_expires_ms: expires,
                            ends_session: false,
                            ticket: Some(
                                self.tickets.admitted(room, visitor, expires, now, ctx.net),
                            ),
                        }))
                    }
                    // Revoked, released or expired in the store: a new visitor.
                    Ok(None) => self.new_visitor(room, req, ctx).await,
                    // The ticket is valid; an unreachable store is no reason
                    // to stop an admitted visitor. The next request checks in again.
                    Err(_) => Ok(Decision::Forward(Admitted {
                        visitor,
                        session_expires_ms,
                        ends_session: false,
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
                ends_session: false,
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
                ends_session: false,
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
        upkeep::start_due_event(&self.store, room, ctx.now).await;
        let lane = room.known_lane(lane);
        let verdict = self.store.poll(room, visitor, lane, seq, ctx.now).await?;
        if matches!(verdict, Verdict::Admitted { .. }) {
            room.metrics.admitted.inc();
            room.metrics.queue_wait.admitted(seq, ctx.now);
            room.metrics.time_on_origin.admitted(visitor, ctx.now);
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
    pub(super) fn poll_limited(
        &self,
        room: &Room,
        visitor: VisitorId,
        ctx: &Ctx<'_>,
    ) -> Result<(), Duration> {
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
        upkeep::start_due_event(&self.store, room, ctx.now).await;
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
                    Verdict::Admitted { .. } => {
                        room.metrics.time_on_origin.admitted(visitor, ctx.now);
                        room.metrics.admitted.inc()
                    }
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
            Verdict::Admitted { .. } => {
                room.metrics.time_on_origin.admitted(visitor, ctx.now);
                room.metrics.admitted.inc()
            }
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
                ends_session: false,
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
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
