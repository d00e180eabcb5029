//! Forwarding to the origin: per-worker pools of HTTP/1.1 connections
//! (`pool`), streamed bodies both ways (the visitor's with a time
//! allowance, `upload`), header rewriting (`headers`), WebSocket tunnels
//! (`tunnel`) and origin time limits.

pub mod headers;
mod origin_tls;
pub(crate) mod pool;
pub mod sign;
pub(crate) mod tunnel;
pub(crate) mod upload;

use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::uri::PathAndQuery;
use http::{header, HeaderValue, Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;

use crate::body::{boxed, Body};
use crate::canonical::Canonical;
use crate::config::OriginConfig;
use crate::domain::VisitorId;
use pool::{Pool, Target};

/// Why the origin did not give us a response. Errors carry which side
/// failed, so the visitor's broken request is a 400 and the origin's
/// failure a 502/504.
#[derive(Debug, thiserror::Error)]
pub enum OriginError {
    /// No response headers within `origin.timeout` (504).
    #[error("origin did not answer within {0:?}")]
    Timeout(Duration),
    /// No connection, or the connection failed (502).
    #[error("origin unreachable: {0}")]
    Unreachable(String),
    /// The visitor's request cannot be sent as it is (400).
    #[error("request cannot be forwarded: {0}")]
    BadRequest(String),
    /// The visitor's request body broke off or was malformed (a bad chunk).
    #[error("the visitor's request body failed: {0}")]
    Downstream(String),
    /// The visitor's request body did not arrive within its allowance.
    #[error("the visitor's request body was too slow")]
    BodyTooSlow,
    /// The origin switched protocols for a request that asked for no upgrade.
    #[error("the origin answered 101 to a request that was not an upgrade")]
    UnaskedUpgrade,
}

impl OriginError {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            OriginError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            OriginError::Unreachable(_) | OriginError::UnaskedUpgrade => StatusCode::BAD_GATEWAY,
            OriginError::BadRequest(_) | OriginError::Downstream(_) => StatusCode::BAD_REQUEST,
            OriginError::BodyTooSlow => StatusCode::REQUEST_TIMEOUT,
        }
    }
}

/// Where and how requests are sent to the origin, with one connection pool
/// per worker thread.
pub struct Proxy {
    /// Path prefix of the origin URL without its trailing `/` (often empty).
    base_path: String,
    timeout: Duration,
    /// Indexed by worker.
    pools: Vec<Arc<Pool>>,
    /// Signs admitted visitors' requests when `origin.sign_key_env` is set.
    signer: Option<sign::Signer>,
    /// The time a visitor's request body has.
    allowance: upload::Allowance,
}

/// What the gate decided about a request, for the forwarding step.
pub struct Outbound<'a> {
    /// The TCP peer's address as header text.
    pub peer_text: &'a HeaderValue,
    /// Whether the peer is a trusted proxy (its `X-Forwarded-*` are kept).
    pub peer_trusted: bool,
    /// The request as the gate matched it; the origin receives this,
    /// without the daemon's own query parameters.
    pub canonical: &'a Canonical,
    /// The admitted visitor, named to the origin in `X-Waitroom-Visitor`.
    pub visitor: Option<VisitorId>,
    /// The room that admitted the visitor (for `X-Waitroom-Signature`).
    pub room: Option<&'a str>,
    /// The request's clock reading (ms since the epoch).
    pub now_ms: u64,
    /// The worker thread serving the request (its origin pool is used).
    pub worker: usize,
    /// The visitor's connection is TLS (`X-Forwarded-Proto: https`).
    pub tls: bool,
    /// Whether (and how) the request may become a WebSocket tunnel;
    /// `None`: its `Upgrade` is dropped. (Boxed: most requests carry none,
    /// and this travels in every request's future.)
    pub tunnel: Option<Box<tunnel::Tunnel>>,
}

impl Proxy {
    pub(crate) fn new(
        origin: &OriginConfig,
        workers: usize,
        allowance: upload::Allowance,
    ) -> Result<Self, OriginError> {
        let parts = origin.url.clone().into_parts();
        let authority = parts
            .authority
            .ok_or_else(|| OriginError::BadRequest("origin url has no host".into()))?;
        let https = origin.url.scheme_str() == Some("https");
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let target = Target {
            addr: format!("{}:{port}", authority.host()),
            connect_timeout: origin.connect_timeout,
            tls: origin_tls::OriginTls::new(origin, authority.host())?,
        };
        let base_path = parts
            .path_and_query
            .map(|p| p.path().trim_end_matches('/').to_owned())
            .unwrap_or_default();
        Ok(Self {
            base_path,
            timeout: origin.timeout,
            signer: origin.sign_key.as_ref().map(sign::Signer::new),
            pools: (0..workers.max(1))
                .map(|_| Pool::new(target.clone(), origin.max_connections))
                .collect(),
            allowance,
        })
    }

    /// The origin connections of one worker.
    pub fn pool(&self, worker: usize) -> &Arc<Pool> {
        &self.pools[worker % self.pools.len()]
    }

    /// Sends `req` to the origin and returns its response, bodies
    /// streaming, with the origin's `X-Waitroom-Command` taken out of it.
    /// The origin receives the canonical path and host, the query without
    /// the daemon's own parameters (`canonical::OWN_PARAMS`), our own headers
    /// (set here, after the visitor's spellings of them are removed), and
    /// none of the daemon's cookies or the hop-by-hop headers.
    pub(crate) async fn forward(
        &self,
        mut req: Request<Incoming>,
        out: Outbound<'_>,
    ) -> Result<(Response<Body>, headers::FromOrigin), OriginError> {
        // The daemon's own parameters (a token, a lane code) are never
        // the origin's to log.
        let cleaned = out.canonical.without_own_params();
        let target = cleaned.as_ref().unwrap_or(&out.canonical.target);
        let path_and_query = if self.base_path.is_empty() {
            target.clone()
        } else {
            PathAndQuery::try_from(format!("{}{target}", self.base_path))
                .map_err(|e| OriginError::BadRequest(e.to_string()))?
        };
        *req.uri_mut() = Uri::from(path_and_query);
        let websocket = out.tunnel.is_some()
            && req.version() == Version::HTTP_11
            && tunnel::asks_websocket(req.headers());
        *req.version_mut() = Version::HTTP_11;
        let headers = req.headers_mut();
        let upgrade = headers::sanitize_inbound(headers, out.peer_trusted, websocket);
        let host = &out.canonical.host_header;
        let scheme = if out.tls { "https" } else { "http" };
        headers::set_forwarded(
            headers,
            out.peer_text,
            out.peer_trusted,
            host.clone(),
            scheme,
        );
        // The visitor's own Host is kept when it was canonical already.
        if headers.get(header::HOST) != Some(host) {
            headers.insert(header::HOST, host.clone());
        }
        if let Some(visitor) = out.visitor {
            if let Ok(v) = HeaderValue::from_bytes(&visitor.hex()) {
                headers.insert(X_WAITROOM_VISITOR, v);
            }
            if let (Some(signer), Some(room)) = (&self.signer, out.room) {
                if let Some(v) = signer.header(&visitor, room, out.now_ms / 1000) {
                    headers.insert(sign::X_WAITROOM_SIGNATURE, v);
                }
            }
        }
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let req = req.map(|body| upload::Upload::new(body, self.allowance));

        let pool = self.pool(out.worker);
        let sent = tokio::time::timeout(self.timeout, pool.send(req, !upgrade)).await;
        let mut resp = match sent {
            Err(_) => return Err(OriginError::Timeout(self.timeout)),
            Ok(Err(e)) => return Err(e),
            Ok(Ok(resp)) => resp,
        };

        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            // The origin's connection is no longer HTTP, whatever follows.
            resp.body_mut().disown();
            let (Some(client_upgrade), Some(tunnel)) = (client_upgrade, out.tunnel) else {
                return Err(OriginError::UnaskedUpgrade);
            };
            let origin_upgrade = hyper::upgrade::on(&mut resp);
            tunnel::spawn(client_upgrade, origin_upgrade, *tunnel);
            let (mut parts, _) = resp.into_parts();
            let from_origin = headers::take_from_origin(&mut parts.headers);
            headers::strip_hop_by_hop(&mut parts.headers, true);
            return Ok((
                Response::from_parts(parts, crate::body::empty()),
                from_origin,
            ));
        }
        let (mut parts, body) = resp.into_parts();
        let from_origin = headers::sanitize_outbound(&mut parts.headers);
        Ok((Response::from_parts(parts, boxed(body)), from_origin))
    }
}

impl Proxy {
    /// The `X-Waitroom-Signature` value naming `visitor` in `room` to the
    /// origin, when `origin.sign_key_env` is set.
    pub fn signature(&self, visitor: &VisitorId, room: &str, now_ms: u64) -> Option<HeaderValue> {
        self.signer
            .as_ref()
            .and_then(|s| s.header(visitor, room, now_ms / 1000))
    }
}

/// Tells the origin who the admitted visitor is.
pub const X_WAITROOM_VISITOR: HeaderName = HeaderName::from_static("x-waitroom-visitor");
/// The origin's way to end a visitor's session early (`revoke`).
pub const X_WAITROOM_COMMAND: HeaderName = HeaderName::from_static("x-waitroom-command");
/// The origin's count of items left, which caps the room's sessions.
pub const X_WAITROOM_STOCK: HeaderName = HeaderName::from_static("x-waitroom-stock");

/// `e` and its sources, for the log (never for a response body).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
