//! A captcha provider's challenge (Cloudflare Turnstile, hCaptcha,
//! reCAPTCHA) asked of newcomers while a room queues, in place of the
//! proof of work (`room.challenge`). The page embeds the provider's widget;
//! its callback hands the token back in the `waitroom_.captcha` cookie (apps
//! send `X-Waitroom-Captcha`), and the daemon asks the provider's
//! `siteverify` API (its URL configurable) whether the token holds, within
//! `room.challenge_timeout`. The providers take a token once. A verifier
//! that does not answer is `room.challenge_on_error`'s to decide: `closed`
//! (the challenge again) or `open` (taken as passed).

use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::config::Captcha;
use crate::proxy::headers;

/// The header apps hand a token back in.
pub const X_WAITROOM_CAPTCHA: HeaderName = HeaderName::from_static("x-waitroom-captcha");
pub use crate::queue_page::CAPTCHA_COOKIE;
/// Longer tokens are refused unread (Turnstile's are about 2 KB).
const MAX_TOKEN_LEN: usize = 4096;
/// Most of a verifier's answer read.
const MAX_ANSWER_LEN: usize = 64 * 1024;

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// Why a token's verdict is unknown.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("request: {0}")]
    Request(String),
    #[error("answered {0}")]
    Status(StatusCode),
    #[error("unreadable answer")]
    Unreadable,
}

/// The client that asks the providers' verifiers (HTTPS with the system's
/// CA certificates, or HTTP).
pub struct Verifier {
    client: Client<Https, Full<Bytes>>,
}

impl Verifier {
    pub fn new() -> Self {
        let connector = match hyper_rustls::HttpsConnectorBuilder::new().with_native_roots() {
            Ok(b) => b.https_or_http().enable_http1().build(),
            Err(e) => {
                tracing::warn!(error = %e, "no CA certificates: captcha verifiers are reachable over plain HTTP only");
                let empty = rustls::ClientConfig::builder()
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth();
                hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(empty)
                    .https_or_http()
                    .enable_http1()
                    .build()
            }
        };
        Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
        }
    }

    /// Whether the provider takes `token` from a visitor at `remote_ip`.
    pub async fn verify(
        &self,
        captcha: &Captcha,
        token: &str,
        remote_ip: IpAddr,
    ) -> Result<bool, VerifyError> {
        let body: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("secret", &captcha.secret.0)
            .append_pair("response", token)
            .append_pair("remoteip", &remote_ip.to_string())
            .finish();
        let req = Request::builder()
            .method(Method::POST)
            .uri(captcha.verify_url.clone())
            .header(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-www-form-urlencoded"),
            )
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| VerifyError::Request(e.to_string()))?;
        let exchange = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| VerifyError::Request(e.to_string()))?;
            if resp.status() != StatusCode::OK {
                return Err(VerifyError::Status(resp.status()));
            }
            let body = Limited::new(resp.into_body(), MAX_ANSWER_LEN)
                .collect()
                .await
                .map_err(|_| VerifyError::Unreadable)?
                .to_bytes();
            let answer: serde_json::Value =
                serde_json::from_slice(&body).map_err(|_| VerifyError::Unreadable)?;
            answer["success"].as_bool().ok_or(VerifyError::Unreadable)
        };
        tokio::time::timeout(captcha.timeout, exchange)
            .await
            .map_err(|_| VerifyError::Timeout(captcha.timeout))?
    }
}

impl Default for Verifier {
    fn default() -> Self {
        Self::new()
    }
}

/// The token a request hands back, if it carries one of a sane size (the
/// page's cookie holds it percent-encoded).
pub fn presented(headers: &HeaderMap) -> Option<String> {
    if let Some(token) = headers.get(&X_WAITROOM_CAPTCHA) {
        return token
            .to_str()
            .ok()
            .filter(|t| !t.is_empty() && t.len() <= MAX_TOKEN_LEN)
            .map(str::to_owned);
    }
    let raw = headers::cookie(headers, CAPTCHA_COOKIE)
        .filter(|t| !t.is_empty() && t.len() <= MAX_TOKEN_LEN)?;
    let decoded: String = form_urlencoded::parse(format!("t={raw}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())?;
    Some(decoded)
}

impl super::Gate {
    /// While the room queues: the captcha for a request without a token;
    /// `Proven` for a token the provider takes; `Failed` (the shadow queue)
    /// or the captcha again for one it refuses; and when the verifier does
    /// not answer, what `challenge_on_error` says.
    pub(super) async fn captcha_wanted(
        &self,
        room: &super::Room,
        headers: &HeaderMap,
        ctx: &super::Ctx<'_>,
    ) -> super::Proof {
        use super::Proof;
        let (Some(captcha), Some(verifier)) =
            (room.config.captcha.as_ref(), self.captchas.as_ref())
        else {
            return Proof::NotAsked;
        };
        if !room.asks_captcha(ctx.now) {
            return Proof::NotAsked;
        }
        let Some(token) = presented(headers) else {
            room.metrics.challenged.inc();
            return Proof::CaptchaWanted;
        };
        match verifier.verify(captcha, &token, ctx.client).await {
            Ok(true) => {
                room.metrics.captcha_passed.inc();
                Proof::Proven
            }
            Ok(false) => {
                room.metrics.captcha_failed.inc();
                tracing::debug!(room = %room.config.id, client = %ctx.client, "captcha refused");
                if self.shadows(room) {
                    Proof::Failed
                } else {
                    room.metrics.challenged.inc();
                    Proof::CaptchaWanted
                }
            }
            Err(e) => {
                tracing::warn!(room = %room.config.id, error = %e, "captcha verifier unavailable");
                match captcha.on_error {
                    crate::config::OnVerifyError::Open => Proof::Proven,
                    crate::config::OnVerifyError::Closed => {
                        room.metrics.challenged.inc();
                        Proof::CaptchaWanted
                    }
                }
            }
        }
    }
}
