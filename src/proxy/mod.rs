//! Forwarding to the origin: a pooled HTTP/1.1 client, streamed bodies both
//! ways, header rewriting, `Upgrade` passthrough and origin time limits.

pub mod headers;

use std::net::IpAddr;
use std::time::Duration;

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{header, HeaderValue, Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::body::{boxed, Body};
use crate::config::OriginConfig;

/// Why the origin did not give us a response.
#[derive(Debug, thiserror::Error)]
pub enum OriginError {
    #[error("origin did not answer within {0:?}")]
    Timeout(Duration),
    #[error("origin unreachable: {0}")]
    Unreachable(String),
    #[error("request cannot be forwarded: {0}")]
    BadRequest(String),
}

impl OriginError {
    pub fn status(&self) -> StatusCode {
        match self {
            OriginError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            OriginError::Unreachable(_) => StatusCode::BAD_GATEWAY,
            OriginError::BadRequest(_) => StatusCode::BAD_REQUEST,
        }
    }
}

/// Where and how requests are sent to the origin.
pub struct Proxy {
    client: Client<HttpConnector, Incoming>,
    scheme: Scheme,
    authority: Authority,
    /// Path prefix of the origin URL without its trailing `/` (often empty).
    base_path: String,
    timeout: Duration,
}

/// What the gate decided about the request, for the forwarding step.
pub struct Forward {
    /// The TCP peer.
    pub peer: IpAddr,
    /// Whether the peer is a trusted proxy.
    pub peer_trusted: bool,
}

impl Proxy {
    pub fn new(origin: &OriginConfig) -> Result<Self, OriginError> {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(origin.connect_timeout));
        connector.set_nodelay(true);
        connector.set_keepalive(Some(Duration::from_secs(60)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(1024)
            .build(connector);
        let parts = origin.url.clone().into_parts();
        let authority = parts
            .authority
            .ok_or_else(|| OriginError::BadRequest("origin url has no host".into()))?;
        let base_path = parts
            .path_and_query
            .map(|p| p.path().trim_end_matches('/').to_owned())
            .unwrap_or_default();
        Ok(Self {
            client,
            scheme: parts.scheme.unwrap_or(Scheme::HTTP),
            authority,
            base_path,
            timeout: origin.timeout,
        })
    }

    /// Sends `req` to the origin and returns its response, bodies streaming.
    /// The caller has already stripped the daemon's cookies and added its own
    /// headers; this step owns hop-by-hop and `X-Forwarded-*` handling.
    pub async fn forward(
        &self,
        mut req: Request<Incoming>,
        fwd: &Forward,
    ) -> Result<Response<Body>, OriginError> {
        let upgrade =
            req.headers().contains_key(header::UPGRADE) && req.version() == Version::HTTP_11;
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));

        let host = original_host_value(&req);
        let path_and_query = match (self.base_path.is_empty(), req.uri().path_and_query()) {
            (true, Some(pq)) => pq.clone(),
            (_, pq) => {
                let path = pq.map_or("/", PathAndQuery::as_str);
                PathAndQuery::try_from(format!("{}{}", self.base_path, path))
                    .map_err(|e| OriginError::BadRequest(e.to_string()))?
            }
        };
        let mut uri = http::uri::Parts::default();
        uri.scheme = Some(self.scheme.clone());
        uri.authority = Some(self.authority.clone());
        uri.path_and_query = Some(path_and_query);
        *req.uri_mut() =
            Uri::from_parts(uri).map_err(|e| OriginError::BadRequest(e.to_string()))?;
        *req.version_mut() = Version::HTTP_11;
        let headers = req.headers_mut();
        headers::strip_hop_by_hop(headers, upgrade);
        headers::set_forwarded(headers, fwd.peer, fwd.peer_trusted, host.clone());
        // Keep the visitor's Host so virtual-hosted origins see their own name
        // (an HTTP/2 visitor sent it as the URI's authority instead).
        if let Some(h) = host {
            headers.entry(header::HOST).or_insert(h);
        }

        let sent = tokio::time::timeout(self.timeout, self.client.request(req)).await;
        let mut resp = match sent {
            Err(_) => return Err(OriginError::Timeout(self.timeout)),
            Ok(Err(e)) => return Err(OriginError::Unreachable(error_chain(&e))),
            Ok(Ok(resp)) => resp,
        };

        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            if let Some(client_upgrade) = client_upgrade {
                let origin_upgrade = hyper::upgrade::on(&mut resp);
                tokio::spawn(async move {
                    let (Ok(client), Ok(origin)) = tokio::join!(client_upgrade, origin_upgrade)
                    else {
                        tracing::debug!("upgrade handshake abandoned");
                        return;
                    };
                    let mut client = TokioIo::new(client);
                    let mut origin = TokioIo::new(origin);
                    if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut origin).await {
                        tracing::debug!(error = %e, "upgraded connection closed");
                    }
                });
                let (mut parts, _) = resp.into_parts();
                headers::strip_hop_by_hop(&mut parts.headers, true);
                return Ok(Response::from_parts(parts, crate::body::empty()));
            }
        }
        let (mut parts, body) = resp.into_parts();
        headers::strip_hop_by_hop(&mut parts.headers, false);
        Ok(Response::from_parts(parts, boxed(body)))
    }
}

/// The host the visitor asked for (`Host`, or the authority of an HTTP/2 URI).
pub fn original_host<B>(req: &Request<B>) -> Option<&str> {
    req.headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().authority().map(Authority::as_str))
}

/// [`original_host`] as a header value, for `Host` and `X-Forwarded-Host`.
fn original_host_value<B>(req: &Request<B>) -> Option<HeaderValue> {
    match req.headers().get(header::HOST) {
        Some(h) => Some(h.clone()),
        None => req
            .uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok()),
    }
}

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
