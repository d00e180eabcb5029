//! Decision mode: another proxy asks whether a request may pass (nginx
//! `auth_request`, Envoy `ext_authz`, Traefik `ForwardAuth`, Caddy
//! `forward_auth`, HAProxy through Lua) and forwards it itself. How each
//! proxy is set up, and what it shows the visitor: `docs/behind-a-proxy.md`.
//!
//! Only `server.trusted_proxies` are answered. The original request is
//! described in one of three ways, each its own path, so a header a
//! visitor made up and the proxy passed along is never read in place of
//! the one the proxy writes:
//!
//! - `{prefix}auth`: `X-Original-Method` and `X-Original-URI` (nginx,
//!   HAProxy), the host in `Host`;
//! - `{prefix}auth/forwarded`: `X-Forwarded-Method`, `-Uri`, `-Host`
//!   (Traefik, Caddy);
//! - `{prefix}auth/envoy/<original path>`: the original method and host
//!   as they are (Envoy's path prefix).
//!
//! The original request is then made canonical exactly as the reverse proxy
//! does, and the gate's phases decide. Let in: `200`, no body, the headers
//! the origin should get (always present, empty when there is nothing to
//! say) and at most one `Set-Cookie`. Not let in: `401` for nginx (which
//! reads no body), with what to show sealed in `X-Waitroom-Page` for
//! `{prefix}page` to render; for the others the page itself, with its own
//! status unless that is a success (then `401`), and `X-Waitroom-Status`.

use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use hyper::body::Incoming;

use crate::body::{empty, Body};
use crate::clock::Millis;
use crate::proxy::headers::X_FORWARDED_HOST;
use crate::proxy::{sign::X_WAITROOM_SIGNATURE, X_WAITROOM_VISITOR};
use crate::respond::{json, push_cookie, text};
use crate::ticket::{Grant, Ticket};

use super::pages::{self, Shown};
use super::{Admitted, ConnInfo, Gate, Outcome, Room};

/// The room the decision was about (empty when none matched).
pub(super) const X_WAITROOM_ROOM: HeaderName = HeaderName::from_static("x-waitroom-room");
/// What to show, sealed, for `{prefix}page`.
pub(super) const X_WAITROOM_PAGE: HeaderName = HeaderName::from_static("x-waitroom-page");
/// The status the page would have had from the reverse proxy.
pub(super) const X_WAITROOM_STATUS: HeaderName = HeaderName::from_static("x-waitroom-status");

const X_ORIGINAL_METHOD: HeaderName = HeaderName::from_static("x-original-method");
const X_ORIGINAL_URI: HeaderName = HeaderName::from_static("x-original-uri");
const X_FORWARDED_METHOD: HeaderName = HeaderName::from_static("x-forwarded-method");
const X_FORWARDED_URI: HeaderName = HeaderName::from_static("x-forwarded-uri");

/// How long a sealed page stays good: the proxy asks for it at once.
const PAGE_NOTE_MS: Millis = 30_000;
/// The sealed page's purpose (`KeyRing::seal_note`).
const PAGE_NOTE: &str = "page";

/// How the proxy describes the original request.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    /// `X-Original-*`: nginx, HAProxy. nginx reads no body of a denial.
    Original,
    /// `X-Forwarded-*`: Traefik, Caddy.
    Forwarded,
    /// The original path after `{prefix}auth/envoy`: Envoy.
    Envoy,
}

/// The sealed page: what to show, for which room, until when.
#[derive(serde::Serialize, serde::Deserialize)]
struct PageNote {
    room: String,
    until: Millis,
    shown: Shown,
}

/// Why the original request could not be read.
const UNDESCRIBED: &str = "the original request is not described: see docs/behind-a-proxy.md";

/// Answers a proxy's "may this request pass?" (`rest` is the raw path
/// after the reserved prefix).
pub(super) async fn decide(
    gate: &Gate,
    req: Request<Incoming>,
    conn: &ConnInfo,
    rest: &str,
) -> Response<Body> {
    if !gate.intake.is_trusted(conn.peer.ip()) {
        tracing::debug!(peer = %conn.peer, "decision asked by an untrusted peer");
        return text(
            StatusCode::FORBIDDEN,
            "the decision endpoint answers only server.trusted_proxies",
        );
    }
    let (form, envoy_path) = match rest {
        "auth" => (Form::Original, None),
        "auth/forwarded" => (Form::Forwarded, None),
        _ => match rest.strip_prefix("auth/envoy") {
            Some(path) if path.is_empty() || path.starts_with('/') => {
                (Form::Envoy, Some(path.to_owned()))
            }
            _ => return text(StatusCode::NOT_FOUND, "no such decision endpoint"),
        },
    };
    let now = gate.clock.now_ms();
    let original = match original_request(req, form, envoy_path) {
        Ok(original) => original,
        Err(Unread::Undescribed) => return text(StatusCode::BAD_REQUEST, UNDESCRIBED),
        Err(Unread::Unreadable(headers)) => {
            return deny(
                gate,
                None,
                Shown::Refused { host: false },
                &headers,
                form,
                now,
            )
        }
    };
    let headers = original.headers();
    let (ctx, outcome) = match gate.outcome(&original, conn).await {
        Err(why) => {
            tracing::debug!(peer = %conn.peer, %why, "original request refused");
            let shown = match why {
                super::intake::Unread::Connect => Shown::NotAllowed,
                super::intake::Unread::Malformed(why) => Shown::Refused {
                    host: matches!(
                        super::intake::refusal_text(why),
                        crate::queue_page::Msg::BadHost
                    ),
                },
            };
            return deny(gate, None, shown, headers, form, now);
        }
        Ok(decided) => decided,
    };
    match outcome {
        // The daemon's own paths are reached directly, never through a decision.
        Outcome::Own | Outcome::NotFound => {
            deny(gate, None, Shown::NotFound, headers, form, ctx.now)
        }
        Outcome::Unmatched => let_in(gate, None, None, ctx.now, "unmatched"),
        Outcome::Bypass(room) => let_in(gate, Some(&room), None, ctx.now, "bypass"),
        Outcome::FailOpen(room) => let_in(gate, Some(&room), None, ctx.now, "fail_open"),
        // The proxy asks before it forwards and never says how the origin
        // answered: an `end_session_paths` request is let in as admitted,
        // and the session ends now (the next request is a newcomer's).
        Outcome::Admit(room, admitted) if admitted.ends_session => {
            let mut resp = let_in(
                gate,
                Some(&room),
                Some(Admitted {
                    ticket: None,
                    ..admitted
                }),
                ctx.now,
                "admitted",
            );
            gate.forwarding
                .end_session(
                    &room,
                    &admitted,
                    "end_session_paths",
                    ctx.now,
                    resp.headers_mut(),
                )
                .await;
            resp
        }
        Outcome::Admit(room, admitted) => {
            let_in(gate, Some(&room), Some(admitted), ctx.now, "admitted")
        }
        Outcome::Show(room, shown) => deny(gate, Some(&room), shown, headers, form, ctx.now),
    }
}

/// `200`: the proxy forwards, with these headers set on the request.
fn let_in(
    gate: &Gate,
    room: Option<&Room>,
    admitted: Option<Admitted>,
    now: Millis,
    outcome: &'static str,
) -> Response<Body> {
    let mut resp = Response::new(empty());
    let h = resp.headers_mut();
    let none = || HeaderValue::from_static("");
    let room_id = room.map(|r| r.config.id.as_str());
    let visitor = admitted.as_ref().map(|a| a.visitor);
    h.insert(
        X_WAITROOM_VISITOR,
        visitor
            .and_then(|v| HeaderValue::from_bytes(&v.hex()).ok())
            .unwrap_or_else(none),
    );
    h.insert(
        X_WAITROOM_ROOM,
        room_id
            .and_then(|id| HeaderValue::from_str(id).ok())
            .unwrap_or_else(none),
    );
    let signature = visitor
        .zip(room_id)
        .and_then(|(v, id)| gate.forwarding.signature(&v, id, now));
    h.insert(X_WAITROOM_SIGNATURE, signature.unwrap_or_else(none));
    if let (Some(room), Some(ticket)) = (room, admitted.and_then(|a| a.ticket)) {
        push_cookie(h, gate.admission.tickets.set_cookie(room, &ticket, now));
    }
    gate.marked(resp, room, outcome)
}

/// Not let in: the page (or only its sealed description, for nginx).
fn deny(
    gate: &Gate,
    room: Option<&Room>,
    shown: Shown,
    headers: &HeaderMap,
    form: Form,
    now: Millis,
) -> Response<Body> {
    let note = PageNote {
        room: room.map(|r| r.config.id.clone()).unwrap_or_default(),
        until: now + PAGE_NOTE_MS,
        shown,
    };
    let sealed = serde_json::to_vec(&note)
        .map(|pt| gate.admission.tickets.keys().seal_note(PAGE_NOTE, &pt))
        .ok()
        .and_then(|s| HeaderValue::from_str(&s).ok());
    let page_status = note.shown.status(room);
    // nginx reads no body of a denial: its page comes from `{prefix}page`.
    let mut resp = if form == Form::Original {
        Response::new(empty())
    } else {
        pages::show(&gate.intake, room, &note.shown, headers, now)
    };
    *resp.status_mut() = if form == Form::Original || page_status.is_success() {
        StatusCode::UNAUTHORIZED
    } else {
        page_status
    };
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(page_status.as_str()) {
        h.insert(X_WAITROOM_STATUS, v);
    }
    if let Some(v) = sealed {
        h.insert(X_WAITROOM_PAGE, v);
    }
    gate.marked(resp, room, note.shown.outcome())
}

/// `{prefix}page`: the page a decision chose, handed back sealed by
/// the proxy in `X-Waitroom-Page` (nginx's named location); the
/// request's own headers choose HTML or JSON and the language.
pub(super) fn page_endpoint(
    gate: &Gate,
    headers: &HeaderMap,
    peer_trusted: bool,
) -> Response<Body> {
    let now = gate.clock.now_ms();
    let note = peer_trusted
        .then(|| headers.get(&X_WAITROOM_PAGE))
        .flatten()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| gate.admission.tickets.keys().open_note(PAGE_NOTE, v))
        .and_then(|pt| serde_json::from_slice::<PageNote>(&pt).ok())
        .filter(|n| now < n.until);
    let Some(note) = note else {
        // Nothing to show: reloading asks the proxy, and so us, again.
        return crate::respond::message(
            StatusCode::SERVICE_UNAVAILABLE,
            crate::queue_page::Msg::StoreUnavailable,
            crate::i18n::Language::Auto.choose(headers),
            1,
        );
    };
    let room = gate.rooms.by_id(&note.room);
    pages::show(&gate.intake, room.map(|r| &**r), &note.shown, headers, now)
}

/// `POST {prefix}end?room=ID` from a trusted proxy or the origin, with
/// the visitor's cookie: ends the session (or gives up the queue place)
/// the ticket names, as the reverse proxy's `X-Waitroom-Command: revoke`
/// does; the answer expires the cookie.
pub(super) async fn end_endpoint(
    gate: &Gate,
    headers: &HeaderMap,
    query: Option<&str>,
    peer_trusted: bool,
) -> Response<Body> {
    if !peer_trusted {
        return text(
            StatusCode::FORBIDDEN,
            "ending a session answers only server.trusted_proxies",
        );
    }
    let Some(room) = super::room_param(query)
        .and_then(|id| gate.rooms.by_id(id))
        .cloned()
    else {
        return json(
            StatusCode::NOT_FOUND,
            &serde_json::json!({"error": "unknown room"}),
            None,
        );
    };
    let now = gate.clock.now_ms();
    let outcome = match gate.admission.tickets.open_any(&room, headers, now) {
        Some(Ticket {
            visitor,
            grant: Grant::Admitted {
                session_expires_ms, ..
            },
            ..
        }) => {
            gate.operator
                .end_session(&room, visitor, session_expires_ms, now)
                .await
        }
        Some(Ticket {
            visitor,
            grant: Grant::Queued { .. },
            ..
        }) => gate.operator.release(&room, visitor).await,
        // A shadow place holds nothing to end.
        Some(Ticket {
            grant: Grant::Shadow { .. },
            ..
        }) => Ok(false),
        None => Ok(false),
    };
    match outcome {
        Ok(ended) => {
            let mut resp = json(StatusCode::OK, &serde_json::json!({"ended": ended}), None);
            push_cookie(
                resp.headers_mut(),
                gate.admission.tickets.expired_cookie(&room),
            );
            resp
        }
        Err(e) => {
            tracing::warn!(room = %room.config.id, error = %e, "session end not recorded");
            pages::store_unavailable(&room, &pages::Reply::for_room(&room, headers))
        }
    }
}

/// Why the original request could not be read.
enum Unread {
    /// The proxy does not describe it: its configuration is wrong.
    Undescribed,
    /// It is described, in a spelling that is no request target (the
    /// decision request's headers, for the page).
    Unreadable(HeaderMap),
}

/// The request the proxy describes: its method, target and host put in
/// place of the decision request's own, every other header kept (the
/// visitor's cookies, `Accept`, `Accept-Language`, `X-Forwarded-For`).
fn original_request(
    req: Request<Incoming>,
    form: Form,
    envoy_path: Option<String>,
) -> Result<Request<()>, Unread> {
    let (mut parts, _body) = req.into_parts();
    let h = &parts.headers;
    let described = |name: &HeaderName| h.get(name).ok_or(Unread::Undescribed);
    let forwarded_host = match form {
        Form::Forwarded => Some(described(&X_FORWARDED_HOST)?.clone()),
        _ => None,
    };
    let (method, target) = match form {
        Form::Original => (
            described(&X_ORIGINAL_METHOD)?.clone(),
            described(&X_ORIGINAL_URI)?.clone(),
        ),
        Form::Forwarded => (
            described(&X_FORWARDED_METHOD)?.clone(),
            described(&X_FORWARDED_URI)?.clone(),
        ),
        Form::Envoy => {
            let path = envoy_path
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "/".into());
            let target = match parts.uri.query() {
                Some(q) => format!("{path}?{q}"),
                None => path,
            };
            let method =
                HeaderValue::from_str(parts.method.as_str()).map_err(|_| Unread::Undescribed)?;
            (
                method,
                HeaderValue::from_str(&target).map_err(|_| Unread::Undescribed)?,
            )
        }
    };
    // An HTTP/2 decision request names its host in the URI, not `Host`.
    if !parts.headers.contains_key(header::HOST) {
        if let Some(host) = parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            parts.headers.insert(header::HOST, host);
        }
    }
    if let Some(host) = forwarded_host {
        parts.headers.insert(header::HOST, host);
    }
    let read = Method::from_bytes(method.as_bytes())
        .ok()
        .zip(Uri::try_from(target.as_bytes()).ok());
    let Some((method, uri)) = read else {
        return Err(Unread::Unreadable(parts.headers));
    };
    parts.method = method;
    parts.uri = uri;
    Ok(Request::from_parts(parts, ()))
}
