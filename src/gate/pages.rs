//! What the gate answers when it does not forward: the queue page or its
//! JSON, the sold-out and too-busy pages, 429s, the fail-closed page and
//! the origin's failures. Each takes what the phases decided and the
//! request's [`Reply`]: JSON or HTML, and the page's language, worked out
//! once per request, the language only when a page needs one. None reads
//! the store.

use std::cell::OnceCell;
use std::time::Duration;

use http::{header, HeaderMap, HeaderValue, Response, StatusCode};

use crate::body::Body;
use crate::clock::Millis;
use crate::domain::RejectReason;
use crate::i18n::{Chosen, Language};
use crate::proxy::OriginError;
use crate::queue_page::{Msg, QueueView, Status, Template, VisitorState};
use crate::respond::{html, json, language, message, push_cookie, retry_after};

use super::intake::Intake;
use super::limits::retry_after_secs;
use super::rooms::Room;
use super::{proof, status};
use crate::respond::{bad_request, method_not_allowed, not_found};
use crate::store::QueuePlace;

/// How one request is answered: JSON when an app asks for it and the room
/// offers it, else a page in the visitor's language, chosen at most once.
pub(crate) struct Reply<'h> {
    pub json: bool,
    headers: &'h HeaderMap,
    setting: Language,
    lang: OnceCell<Chosen>,
}

impl<'h> Reply<'h> {
    /// For a request of `room` (its `json_response` and `language`).
    pub(crate) fn for_room(room: &Room, headers: &'h HeaderMap) -> Self {
        Self {
            json: room.config.json_response && wants_json(headers),
            headers,
            setting: room.config.language,
            lang: OnceCell::new(),
        }
    }

    /// For a request no room answers: a page in the visitor's language.
    pub(crate) fn roomless(headers: &'h HeaderMap) -> Self {
        Self {
            json: false,
            headers,
            setting: Language::Auto,
            lang: OnceCell::new(),
        }
    }

    /// The page's language.
    pub(crate) fn lang(&self) -> Chosen {
        *self.lang.get_or_init(|| self.setting.choose(self.headers))
    }
}

/// Renders what the gate decided to show (the page, or JSON for apps
/// that ask for it), for a request with these headers.
/// The status is [`Shown::status`]'s: decision mode tells a proxy
/// the status of a page it does not render.
pub(super) fn show(
    intake: &Intake,
    room: Option<&Room>,
    shown: &Shown,
    headers: &HeaderMap,
    now: Millis,
) -> Response<Body> {
    let mut resp = render(intake, room, shown, headers, now);
    *resp.status_mut() = shown.status(room);
    resp
}

fn render(
    intake: &Intake,
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
            let status = status::queued(room, now, place, *lane, &reply);
            let in_force = room.in_force(now);
            let template = in_force
                .event
                .as_ref()
                .and_then(|e| e.template.as_ref())
                .unwrap_or(&room.template);
            queue(
                room,
                template,
                &status,
                &reply,
                intake.status_url(&room.config.id),
                now,
                Some(cookie.clone()),
            )
        }
        Shown::Challenge {
            text,
            bits,
            expires_ms,
        } => {
            let asked = proof::Challenge {
                text: text.clone(),
                bits: *bits,
                expires_ms: *expires_ms,
            };
            let status = status::challenge(room, &asked, now, &reply);
            challenge(room, &status, &asked, &reply)
        }
        Shown::CaptchaBusy { ms } => captcha_busy(Duration::from_millis(*ms), &reply),
        Shown::TokenRefused { missing } => token_refused(*missing, &reply),
        Shown::Clean { to, cookie, .. } => clean(to, cookie.clone()),
        Shown::Captcha => {
            let status = status::captcha(room, now, &reply);
            captcha(room, &status, &reply)
        }
        Shown::Rejected { reason } => rejected(room, *reason, &reply, now),
        Shown::SlowDown { ms } => slow_down(Duration::from_millis(*ms), &reply),
        Shown::TooManyArrivals { ms } => too_many_arrivals(Duration::from_millis(*ms), &reply),
        Shown::Unavailable | Shown::Shed => store_unavailable(room, &reply),
        Shown::Refused { .. } | Shown::NotFound | Shown::NotAllowed => {
            render(intake, None, shown, headers, now)
        }
    }
}

/// Whether the request asks for JSON.
pub(crate) fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/json"))
}

/// What the gate shows a visitor it does not let in, decided once and
/// rendered by [`show`]: at once, or, in decision mode, by
/// `{reserved_prefix}page` after the proxy hands it back sealed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "k", rename_all = "snake_case")]
pub(crate) enum Shown {
    /// The queue page with the ticket cookie (a `Set-Cookie` value).
    Queue {
        seq: u64,
        position: u64,
        queue_length: u64,
        /// The priority lane (0: the general queue).
        #[serde(default)]
        lane: u8,
        cookie: String,
    },
    /// The proof of work to do first.
    Challenge {
        text: String,
        bits: u8,
        expires_ms: Millis,
    },
    /// The room's captcha to pass first.
    Captcha,
    /// The captcha's verifications all taken: the same token again in `ms`.
    CaptchaBusy {
        ms: u64,
    },
    /// Turned away for its enqueue token (403).
    TokenRefused {
        missing: bool,
    },
    Rejected {
        reason: RejectReason,
    },
    /// 429, the place kept.
    SlowDown {
        ms: u64,
    },
    /// 429 for an address asking for too many new tickets.
    TooManyArrivals {
        ms: u64,
    },
    /// The store cannot decide now (fail closed).
    Unavailable,
    /// This instance is too far behind to decide in time (the same page).
    Shed,
    /// The same request again without the daemon's own query parameters
    /// (`to`), once they are read, with the ticket cookie when there is
    /// one to set: 303, or 307 (`keep_method`) for a method a browser
    /// must repeat as it was.
    Clean {
        to: String,
        cookie: Option<String>,
        keep_method: bool,
    },
    /// A request that cannot be made canonical (400); `host` when it was the host.
    Refused {
        host: bool,
    },
    NotFound,
    /// A method no origin of ours takes (CONNECT): 405.
    NotAllowed,
}

impl Shown {
    /// The status its page is answered with (for a room's page, `room`).
    pub(crate) fn status(&self, room: Option<&Room>) -> StatusCode {
        match (room, self) {
            (Some(room), Shown::Queue { .. } | Shown::Challenge { .. } | Shown::Captcha) => {
                room.config.queue_status_code
            }
            (
                Some(_),
                Shown::Rejected { .. }
                | Shown::Unavailable
                | Shown::Shed
                | Shown::CaptchaBusy { .. },
            ) => StatusCode::SERVICE_UNAVAILABLE,
            (Some(_), Shown::SlowDown { .. } | Shown::TooManyArrivals { .. }) => {
                StatusCode::TOO_MANY_REQUESTS
            }
            (_, Shown::Clean { keep_method, .. }) => match keep_method {
                true => StatusCode::TEMPORARY_REDIRECT,
                false => StatusCode::SEE_OTHER,
            },
            (_, Shown::TokenRefused { .. }) => StatusCode::FORBIDDEN,
            (_, Shown::Refused { .. }) => StatusCode::BAD_REQUEST,
            (_, Shown::NotAllowed) => StatusCode::METHOD_NOT_ALLOWED,
            _ => StatusCode::NOT_FOUND,
        }
    }

    /// Its name in the access log.
    pub(crate) fn outcome(&self) -> &'static str {
        match self {
            Shown::Queue { .. } => "queued",
            Shown::Clean { .. } => "cleaned",
            Shown::Challenge { .. } | Shown::Captcha => "challenge",
            Shown::CaptchaBusy { .. } => "captcha_busy",
            Shown::TokenRefused { .. } => "token_refused",
            Shown::Rejected { .. } => "rejected",
            Shown::SlowDown { .. } => "slow_down",
            Shown::TooManyArrivals { .. } => "too_many_arrivals",
            Shown::Unavailable => "unavailable",
            Shown::Shed => "shed",
            Shown::Refused { .. } | Shown::NotAllowed => "refused",
            Shown::NotFound => "not_found",
        }
    }
}

/// The queue page (or, for apps, the status JSON) with the ticket cookie.
#[allow(clippy::too_many_arguments)]
pub(crate) fn queue(
    room: &Room,
    template: &Template,
    status: &Status,
    reply: &Reply<'_>,
    status_url: String,
    now_ms: u64,
    cookie: Option<String>,
) -> Response<Body> {
    let code = room.config.queue_status_code;
    let mut resp = if reply.json {
        json(code, status, cookie)
    } else {
        let chosen = reply.lang();
        let view = QueueView::new(status, &room.config.name, status_url, now_ms, chosen.lang);
        let mut resp = html(code, template.render(&view));
        language(&mut resp, chosen);
        if let Some(c) = cookie {
            push_cookie(resp.headers_mut(), c);
        }
        resp
    };
    retry_after(&mut resp, status.refresh_seconds);
    resp
}

/// Sends the visitor to `to` (its own request without the daemon's query
/// parameters), setting `cookie`; no body.
pub(crate) fn clean(to: &str, cookie: Option<String>) -> Response<Body> {
    let mut resp = Response::new(crate::body::empty());
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(to) {
        h.insert(header::LOCATION, v);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if let Some(c) = cookie {
        push_cookie(h, c);
    }
    resp
}

/// The proof of work a new visitor must do first: the page whose script
/// does it, or for apps the status JSON with the challenge.
pub(crate) fn challenge(
    room: &Room,
    status: &Status,
    challenge: &super::proof::Challenge,
    reply: &Reply<'_>,
) -> Response<Body> {
    let code = room.config.queue_status_code;
    if reply.json {
        return json(code, status, None);
    }
    let chosen = reply.lang();
    let page = crate::queue_page::render_challenge(&room.config.name, challenge, chosen.lang);
    let mut resp = html(code, page);
    crate::respond::language(&mut resp, chosen);
    resp
}

/// The room's captcha a new visitor must pass first: the page with the
/// provider's widget, or for apps the status JSON naming the provider.
pub(crate) fn captcha(room: &Room, status: &Status, reply: &Reply<'_>) -> Response<Body> {
    let code = room.config.queue_status_code;
    let Some(captcha) = room.config.captcha.as_ref().filter(|_| !reply.json) else {
        return json(code, status, None);
    };
    let chosen = reply.lang();
    let page = crate::queue_page::render_captcha(
        &room.config.name,
        captcha.kind.widget_class(),
        &captcha.site_key,
        &captcha.script_url,
        chosen.lang,
    );
    let mut resp = html(code, page);
    crate::respond::language(&mut resp, chosen);
    resp
}

/// 503 for a newcomer whose captcha token could not be checked now (every
/// verification slot taken): the page reloads by itself after `wait`,
/// handing the same token in again; apps get `{"error", "state":
/// "challenge", "retry_after"}` and `Retry-After`.
pub(crate) fn captcha_busy(wait: Duration, reply: &Reply<'_>) -> Response<Body> {
    let seconds = retry_after_secs(wait);
    if reply.json {
        let mut resp = json(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({
                "error": "the captcha cannot be checked right now; send the same token again shortly",
                "state": "challenge",
                "retry_after": seconds,
            }),
            None,
        );
        retry_after(&mut resp, seconds);
        return resp;
    }
    message(
        StatusCode::SERVICE_UNAVAILABLE,
        Msg::OverLimit,
        reply.lang(),
        seconds,
    )
}

/// A newcomer turned away for its enqueue token: 403, the page saying
/// why (none where one is required, or one that does not hold), or for
/// apps `{"error": ...}`.
pub(crate) fn token_refused(missing: bool, reply: &Reply<'_>) -> Response<Body> {
    let (short, msg) = if missing {
        ("an enqueue token is required", Msg::TokenRequired)
    } else {
        ("the enqueue token is not valid here", Msg::TokenRefused)
    };
    if reply.json {
        return json(
            StatusCode::FORBIDDEN,
            &serde_json::json!({"error": short, "state": "token_refused"}),
            None,
        );
    }
    message(StatusCode::FORBIDDEN, msg, reply.lang(), 0)
}

/// What a visitor the room turns away sees (503), with the room's notice.
pub(crate) fn rejected(
    room: &Room,
    reason: RejectReason,
    reply: &Reply<'_>,
    now: Millis,
) -> Response<Body> {
    let refresh = room.config.refresh_interval.as_secs().max(1);
    let notice = status::notice(&room.in_force(now), now, reply);
    if reply.json {
        let status = Status {
            room: room.config.id.clone(),
            state: reject_state(reason),
            position: 0,
            queue_length: 0,
            eta_seconds: 0,
            refresh_seconds: refresh,
            event: None,
            starts_in_seconds: None,
            general_from: None,
            stock_left: None,
            challenge: None,
            captcha: None,
            lane: None,
            notice,
        };
        return json(StatusCode::SERVICE_UNAVAILABLE, &status, None);
    }
    let (msg, retry) = match reason {
        RejectReason::Closed => (Msg::Closed, 0),
        RejectReason::QueueFull => (Msg::QueueFull, refresh * 3),
        RejectReason::OverLimit => (Msg::OverLimit, refresh),
    };
    let chosen = reply.lang();
    let page = crate::queue_page::render_message_with(msg, chosen.lang, retry, notice.as_ref());
    let mut resp = html(StatusCode::SERVICE_UNAVAILABLE, page);
    language(&mut resp, chosen);
    if retry > 0 {
        retry_after(&mut resp, retry);
    }
    resp
}

/// The status JSON `state` for a rejection.
pub(crate) fn reject_state(reason: RejectReason) -> VisitorState {
    match reason {
        RejectReason::Closed => VisitorState::Closed,
        RejectReason::QueueFull | RejectReason::OverLimit => VisitorState::Rejected,
    }
}

/// 429 for a queued visitor (or its address) polling too often; the place is kept.
pub(crate) fn slow_down(wait: Duration, reply: &Reply<'_>) -> Response<Body> {
    too_many(
        wait,
        reply,
        "too many requests; your place is kept",
        Msg::SlowDown,
    )
}

/// 429 for an address asking for more new tickets than it may.
pub(crate) fn too_many_arrivals(wait: Duration, reply: &Reply<'_>) -> Response<Body> {
    too_many(
        wait,
        reply,
        "too many new visitors from your network; try again shortly",
        Msg::TooManyArrivals,
    )
}

/// `short` is the JSON's `error` (machine-facing English, like every JSON
/// field); the page says `long` in the visitor's language.
fn too_many(wait: Duration, reply: &Reply<'_>, short: &str, long: Msg) -> Response<Body> {
    let seconds = retry_after_secs(wait);
    if reply.json {
        let mut resp = json(
            StatusCode::TOO_MANY_REQUESTS,
            &serde_json::json!({"error": short, "retry_after": seconds}),
            None,
        );
        retry_after(&mut resp, seconds);
        return resp;
    }
    message(StatusCode::TOO_MANY_REQUESTS, long, reply.lang(), seconds)
}

/// `fail_mode = "closed"` while the store is away.
pub(crate) fn store_unavailable(room: &Room, reply: &Reply<'_>) -> Response<Body> {
    message(
        StatusCode::SERVICE_UNAVAILABLE,
        Msg::StoreUnavailable,
        reply.lang(),
        room.config.refresh_interval.as_secs(),
    )
}

/// The origin did not answer: 502 or 504 (or 400 when the visitor's own
/// request body was broken). The request went to the origin, so its
/// `Accept-Language` was kept aside (`None` when there was none); it is
/// read only now.
pub(crate) fn origin_error(
    e: &OriginError,
    room: Option<&Room>,
    accept_language: Option<&HeaderValue>,
) -> Response<Body> {
    let setting = room.map_or(Language::Auto, |r| r.config.language);
    let chosen = setting.choose_from(accept_language);
    match e.status() {
        StatusCode::GATEWAY_TIMEOUT => {
            message(StatusCode::GATEWAY_TIMEOUT, Msg::OriginTimeout, chosen, 0)
        }
        StatusCode::BAD_REQUEST => crate::respond::bad_request(Msg::BadBody, chosen),
        status => message(status, Msg::OriginDown, chosen, 0),
    }
}
