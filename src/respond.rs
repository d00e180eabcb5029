//! Building the daemon's own responses: HTML pages, JSON, plain text, the
//! message page, and the headers they share (`Cache-Control: no-store`,
//! `Referrer-Policy: no-referrer` on pages, `Retry-After`, `Set-Cookie`, `Content-Language`, `Vary`). Used by the
//! gate and the admin listener; no response body ever carries an internal
//! error.

use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};

use crate::body::{full, Body};
use crate::i18n::Chosen;
use crate::queue_page::{self, Msg};

pub(crate) fn html(status: StatusCode, page: String) -> Response<Body> {
    let mut resp = Response::new(full(page));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // A page's address may hold a token or a lane code: its links and
    // resources never pass it on.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    resp
}

pub(crate) fn json<T: serde::Serialize>(
    status: StatusCode,
    value: &T,
    cookie: Option<String>,
) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(c) = cookie {
        push_cookie(h, c);
    }
    resp
}

pub(crate) fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// The daemon's message page (not found, sold out, slow down, …) in the
/// chosen language, which reloads itself after `refresh_seconds` when that
/// is not 0.
pub(crate) fn message(
    status: StatusCode,
    msg: Msg,
    chosen: Chosen,
    refresh_seconds: u64,
) -> Response<Body> {
    let mut resp = html(
        status,
        queue_page::render_message(msg, chosen.lang, refresh_seconds),
    );
    language(&mut resp, chosen);
    if refresh_seconds > 0 {
        retry_after(&mut resp, refresh_seconds);
    }
    resp
}

/// Names a page's language, and says the answer depends on
/// `Accept-Language` when that chose it.
pub(crate) fn language(resp: &mut Response<Body>, chosen: Chosen) {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_LANGUAGE,
        HeaderValue::from_static(chosen.lang.code()),
    );
    if chosen.negotiated {
        h.append(header::VARY, HeaderValue::from_static("accept-language"));
    }
}

/// 404 for what the daemon does not serve.
pub(crate) fn not_found(chosen: Chosen) -> Response<Body> {
    message(StatusCode::NOT_FOUND, Msg::NotFound, chosen, 0)
}

/// 405 for a method the daemon never forwards (`CONNECT`), naming those
/// it does.
pub(crate) fn method_not_allowed(chosen: Chosen) -> Response<Body> {
    let mut resp = message(StatusCode::METHOD_NOT_ALLOWED, Msg::BadAddress, chosen, 0);
    resp.headers_mut().insert(
        header::ALLOW,
        HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
    );
    resp
}

/// 400 for a request that cannot be handled safely. The reason is one of a
/// few fixed sentences, never the request's own bytes.
pub(crate) fn bad_request(reason: Msg, chosen: Chosen) -> Response<Body> {
    let mut resp = message(StatusCode::BAD_REQUEST, reason, chosen, 0);
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

pub(crate) fn retry_after(resp: &mut Response<Body>, seconds: u64) {
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
}

pub(crate) fn push_cookie(headers: &mut HeaderMap, cookie: String) {
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        headers.append(header::SET_COOKIE, v);
    }
}
