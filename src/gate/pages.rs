//! What the gate answers when it does not forward: the queue page or its
//! JSON, the sold-out and too-busy pages, 429s, the fail-closed page and
//! the origin's failures. Each takes what the phases decided; none reads
//! the store or the request beyond `wants_json`.

use std::time::Duration;

use http::{Response, StatusCode};

use crate::body::Body;
use crate::proxy::OriginError;
use crate::queue_page::{QueueView, Status, Template, VisitorState};
use crate::respond::{html, json, message, push_cookie, retry_after};
use crate::store::RejectReason;

use super::limits::retry_after_secs;
use super::rooms::Room;

/// The queue page (or, for apps, the status JSON) with the ticket cookie.
pub fn queue(
    room: &Room,
    template: &Template,
    status: &Status,
    wants_json: bool,
    status_url: String,
    now_ms: u64,
    cookie: Option<String>,
) -> Response<Body> {
    let code = room.config.queue_status_code;
    let mut resp = if room.config.json_response && wants_json {
        json(code, status, cookie)
    } else {
        let view = QueueView::new(status, &room.config.name, status_url, now_ms);
        let mut resp = html(code, template.render(&view));
        if let Some(c) = cookie {
            push_cookie(resp.headers_mut(), c);
        }
        resp
    };
    retry_after(&mut resp, status.refresh_seconds);
    resp
}

/// The proof of work a new visitor must do first: the page whose script
/// does it, or for apps the status JSON with the challenge.
pub fn challenge(
    room: &Room,
    status: &Status,
    challenge: &super::proof::Challenge,
    wants_json: bool,
) -> Response<Body> {
    let code = room.config.queue_status_code;
    if room.config.json_response && wants_json {
        return json(code, status, None);
    }
    html(
        code,
        crate::queue_page::render_challenge(&room.config.name, challenge),
    )
}

/// What a visitor the room turns away sees (503).
pub fn rejected(room: &Room, reason: RejectReason, wants_json: bool) -> Response<Body> {
    let refresh = room.config.refresh_interval.as_secs().max(1);
    if wants_json && room.config.json_response {
        let status = Status {
            room: room.config.id.clone(),
            state: reject_state(reason),
            position: 0,
            queue_length: 0,
            eta_seconds: 0,
            refresh_seconds: refresh,
            event: None,
            starts_in_seconds: None,
            challenge: None,
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

/// The status JSON `state` for a rejection.
pub fn reject_state(reason: RejectReason) -> VisitorState {
    match reason {
        RejectReason::Closed => VisitorState::Closed,
        RejectReason::QueueFull | RejectReason::OverLimit => VisitorState::Rejected,
    }
}

/// 429 for a queued visitor (or its address) polling too often; the place is kept.
pub fn slow_down(room: &Room, wait: Duration, wants_json: bool) -> Response<Body> {
    too_many(
        room,
        wait,
        wants_json,
        "too many requests; your place is kept",
        "You keep your place in the queue. This page tries again by itself in a moment.",
    )
}

/// 429 for an address asking for more new tickets than it may.
pub fn too_many_arrivals(room: &Room, wait: Duration, wants_json: bool) -> Response<Body> {
    too_many(
        room,
        wait,
        wants_json,
        "too many new visitors from your network; try again shortly",
        "Many visitors from your network arrived at once. This page tries again by itself in a moment.",
    )
}

fn too_many(
    room: &Room,
    wait: Duration,
    wants_json: bool,
    short: &str,
    long: &str,
) -> Response<Body> {
    let seconds = retry_after_secs(wait);
    if room.config.json_response && wants_json {
        let mut resp = json(
            StatusCode::TOO_MANY_REQUESTS,
            &serde_json::json!({"error": short, "retry_after": seconds}),
            None,
        );
        retry_after(&mut resp, seconds);
        return resp;
    }
    message(
        StatusCode::TOO_MANY_REQUESTS,
        "Please slow down",
        long,
        seconds,
    )
}

/// `fail_mode = "closed"` while the store is away.
pub fn store_unavailable(room: &Room) -> Response<Body> {
    message(
        StatusCode::SERVICE_UNAVAILABLE,
        "Temporarily unavailable",
        "We cannot check the queue right now. This page will try again shortly.",
        room.config.refresh_interval.as_secs(),
    )
}

/// The origin did not answer: 502 or 504 (or 400 when the visitor's own
/// request body was broken).
pub fn origin_error(e: &OriginError) -> Response<Body> {
    match e.status() {
        StatusCode::GATEWAY_TIMEOUT => message(
            StatusCode::GATEWAY_TIMEOUT,
            "The site is slow to answer",
            "The site did not answer in time. Please try again in a moment.",
            0,
        ),
        StatusCode::BAD_REQUEST => crate::respond::bad_request(
            "The request could not be read (its body was malformed or cut short).",
        ),
        status => message(
            status,
            "The site is unavailable",
            "The site could not be reached. Please try again in a moment.",
            0,
        ),
    }
}
