//! The daemon's own paths under the reserved prefix (`status`, `health`,
//! `ready`, `page`, `end`; the decision endpoints are `decide`'s): the
//! reverse proxy's sink for [`super::Outcome::Own`].

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use super::{decide, Ctx, Gate};
use crate::body::Body;
use crate::config::FailMode;
use crate::i18n::Language;
use crate::respond::{json, not_found, text};

/// Answers a request for the daemon's own path `rest`.
pub(super) async fn answer(
    gate: &Gate,
    req: &Request<Incoming>,
    rest: &str,
    ctx: &Ctx<'_>,
) -> Response<Body> {
    match (req.method(), rest) {
        (&Method::GET, "status") => status(gate, req, ctx).await,
        (&Method::GET, "health") => text(StatusCode::OK, "ok"),
        (&Method::GET, "ready") => ready(gate).await,
        (_, "page") => decide::page_endpoint(gate, req.headers(), ctx.peer_trusted),
        (&Method::POST, "end") => {
            let query = ctx.canonical.query();
            decide::end_endpoint(gate, req.headers(), query, ctx.peer_trusted).await
        }
        _ => not_found(Language::Auto.choose(req.headers())),
    }
}

/// `GET {prefix}status?room=ID` (or the room of the host's `/`): the
/// visitor's standing, as JSON.
async fn status(gate: &Gate, req: &Request<Incoming>, ctx: &Ctx<'_>) -> Response<Body> {
    let room = match super::room_param(ctx.canonical.query()) {
        Some(id) => gate.rooms.by_id(id),
        None => gate.rooms.matching(ctx.canonical.host(), "/"),
    };
    let Some(room) = room else {
        return json(
            StatusCode::NOT_FOUND,
            &serde_json::json!({"error": "unknown room"}),
            None,
        );
    };
    gate.admission.status_json(room, req.headers(), ctx).await
}

/// `{prefix}ready`, for a load balancer or a kubelet: 503 from the
/// start of a drain; otherwise 200 when the store answers, or when it
/// does not and `store.fail_mode` decides without it.
async fn ready(gate: &Gate) -> Response<Body> {
    if gate
        .telemetry
        .draining
        .load(std::sync::atomic::Ordering::Relaxed)
    {
        return text(StatusCode::SERVICE_UNAVAILABLE, "draining");
    }
    if gate.operator.store_ready(&gate.rooms).await {
        return text(StatusCode::OK, "ready");
    }
    match gate.admission.fail_mode {
        FailMode::Open | FailMode::Local => text(
            StatusCode::OK,
            "ready (the store does not answer; fail_mode decides)",
        ),
        FailMode::Closed => text(StatusCode::SERVICE_UNAVAILABLE, "store unavailable"),
    }
}
