//! Keys from a room's `jwks_url`: fetched at start (a room built at the
//! daemon's start or at a config reload), kept in memory and fetched again
//! by one background task per room, so there is never more than one fetch
//! of a URL in flight and the request path never waits for one.
//!
//! The task fetches again when the set is `jwks_max_age` old (sooner if
//! the answer's `Cache-Control: max-age` says so, never sooner than
//! `jwks_min_refresh`), after a failure with back-off, and when a token
//! names a `kid` the set lacks ([`JwksKeys::unknown_kid`]), at most once
//! per `jwks_min_refresh` on the daemon's clock. Such a token is refused
//! with what is held now; the next one with that `kid` finds the key.
//!
//! The last good set is kept: an answer that does not come, an error
//! status, a body over [`MAX_BODY`] or one that is not a JWKS with at
//! least one usable key replaces nothing (logged, and counted in
//! `waitroom_jwks_fetches_total`).

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::Notify;

use super::{JwksUrl, PublicKey, TokenKeys};
use crate::clock::SharedClock;
use crate::outbound::{https_connector, Https};

/// The longest one fetch may take, answer and body.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest JWKS body read.
pub(crate) const MAX_BODY: usize = 1024 * 1024;
/// The first retry after a failed fetch; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(300);
const USER_AGENT: &str = concat!("waitroom/", env!("CARGO_PKG_VERSION"));

/// A room's token keys with those its `jwks_url` last gave.
pub(crate) struct JwksKeys {
    /// The config's keys plus the last good fetched set.
    keys: ArcSwap<TokenKeys>,
    /// The URL and the last good fetched set alone (`None`: none yet),
    /// which a reload's room takes over until its own first fetch.
    url: http::Uri,
    fixed: TokenKeys,
    fetched: ArcSwapOption<Vec<PublicKey>>,
    /// Held while the set changes, so a reload's carry-over cannot
    /// overwrite a fresher fetch.
    writing: Mutex<()>,
    /// Wakes the fetch task: a token named an unknown `kid`, or this
    /// room is gone.
    wake: Arc<Notify>,
}

impl JwksKeys {
    /// The keys to verify with now.
    pub(crate) fn keys(&self) -> Arc<TokenKeys> {
        self.keys.load_full()
    }

    /// A token named a `kid` the set lacks: the task fetches again if
    /// the last fetch is `jwks_min_refresh` old.
    pub(crate) fn unknown_kid(&self) {
        self.wake.notify_one();
    }

    /// A reload's room takes over `old`'s last good set (same URL), so
    /// tokens keep verifying while its own first fetch runs.
    pub(crate) fn carry_over(&self, old: &JwksKeys) {
        let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        if old.url != self.url || self.fetched.load().is_some() {
            return;
        }
        if let Some(public) = old.fetched.load_full() {
            self.store(public);
        }
    }

    /// Uses `public` with the config's keys from now on.
    fn hold(&self, public: Arc<Vec<PublicKey>>) {
        let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        self.store(public);
    }

    fn store(&self, public: Arc<Vec<PublicKey>>) {
        let mut all = self.fixed.clone();
        all.public.extend(public.iter().cloned());
        self.fetched.store(Some(public));
        self.keys.store(Arc::new(all));
    }

    /// Holds `fixed` (the config's keys) and starts fetching `jwks` in the
    /// background for room `room`. Without a Tokio runtime (unit tests
    /// building a room), nothing is fetched.
    pub(crate) fn start(
        room: &str,
        fixed: &TokenKeys,
        jwks: &JwksUrl,
        clock: SharedClock,
        counts: [Counter; 3],
    ) -> Arc<Self> {
        let keys = Arc::new(Self {
            keys: ArcSwap::from_pointee(fixed.clone()),
            url: jwks.url.clone(),
            fixed: fixed.clone(),
            fetched: ArcSwapOption::empty(),
            writing: Mutex::new(()),
            wake: Arc::new(Notify::new()),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let task = Fetcher {
                room: room.to_owned(),
                jwks: jwks.clone(),
                clock,
                counts,
                client: Client::builder(TokioExecutor::new()).build(https_connector("JWKS URLs")),
                keys: Arc::downgrade(&keys),
                wake: keys.wake.clone(),
            };
            runtime.spawn(task.run());
        }
        keys
    }
}

impl Drop for JwksKeys {
    fn drop(&mut self) {
        // The task finds the room gone and ends.
        self.wake.notify_one();
    }
}

/// Why a fetch gave no keys.
enum Failure {
    /// No answer in time, or an error status: `failed`.
    Failed(String),
    /// An answer that is no JWKS with a usable key: `invalid`.
    Invalid(String),
}

/// One room's fetch task.
struct Fetcher {
    room: String,
    jwks: JwksUrl,
    clock: SharedClock,
    /// ok, failed, invalid.
    counts: [Counter; 3],
    client: Client<Https, Full<Bytes>>,
    keys: Weak<JwksKeys>,
    wake: Arc<Notify>,
}

impl Fetcher {
    async fn run(self) {
        let min_refresh_ms = self.jwks.min_refresh.as_millis() as u64;
        let mut failures: u32 = 0;
        loop {
            let Some(keys) = self.keys.upgrade() else {
                return;
            };
            let started = self.clock.now_ms();
            let wait = match tokio::time::timeout(FETCH_TIMEOUT, self.fetch()).await {
                Ok(Ok((public, max_age))) => {
                    self.counts[0].inc();
                    tracing::debug!(room = %self.room, url = %self.jwks.url, keys = public.len(), "JWKS fetched");
                    keys.hold(Arc::new(public));
                    failures = 0;
                    next_fetch(max_age, &self.jwks)
                }
                outcome => {
                    let (counter, why) = match outcome {
                        Ok(Err(Failure::Invalid(why))) => (&self.counts[2], why),
                        Ok(Err(Failure::Failed(why))) => (&self.counts[1], why),
                        _ => (
                            &self.counts[1],
                            format!("no answer within {FETCH_TIMEOUT:?}"),
                        ),
                    };
                    counter.inc();
                    tracing::warn!(room = %self.room, url = %self.jwks.url, %why, "JWKS fetch failed; the last good keys are kept");
                    failures = failures.saturating_add(1);
                    FIRST_BACKOFF
                        .saturating_mul(1 << failures.saturating_sub(1).min(16))
                        .min(MAX_BACKOFF)
                        .min(self.jwks.max_age)
                }
            };
            drop(keys);
            let due = tokio::time::Instant::now() + wait;
            loop {
                tokio::select! {
                    () = tokio::time::sleep_until(due) => break,
                    () = self.wake.notified() => {
                        if self.keys.strong_count() == 0 {
                            return;
                        }
                        // At most one fetch per min_refresh for unknown kids.
                        if self.clock.now_ms().saturating_sub(started) >= min_refresh_ms {
                            break;
                        }
                    }
                }
            }
        }
    }

    /// One GET of the URL: its keys and the answer's `max-age`.
    async fn fetch(&self) -> Result<(Vec<PublicKey>, Option<Duration>), Failure> {
        let request = Request::get(self.jwks.url.clone())
            .header(header::USER_AGENT, USER_AGENT)
            .header(header::ACCEPT, "application/json")
            .body(Full::new(Bytes::new()))
            .map_err(|e| Failure::Failed(e.to_string()))?;
        let answer = self
            .client
            .request(request)
            .await
            .map_err(|e| Failure::Failed(e.to_string()))?;
        let status = answer.status();
        if status != StatusCode::OK {
            return Err(Failure::Failed(format!("answered {status}")));
        }
        let max_age = answer
            .headers()
            .get(header::CACHE_CONTROL)
            .and_then(|v| v.to_str().ok())
            .and_then(max_age);
        let body = Limited::new(answer.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| Failure::Invalid(format!("body: {e}")))?
            .to_bytes();
        let text = std::str::from_utf8(&body)
            .map_err(|_| Failure::Invalid("the body is not UTF-8".into()))?;
        parse_fetched(text)
            .map(|keys| (keys, max_age))
            .map_err(Failure::Invalid)
    }
}

/// A fetched JWKS's Ed25519 and RSA keys; keys of other types (an
/// identity provider's EC keys, say) are left out rather than refused.
pub(crate) fn parse_fetched(text: &str) -> Result<Vec<PublicKey>, String> {
    let mut doc: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not a JWKS document: {e}"))?;
    if let Some(keys) = doc.get_mut("keys").and_then(|k| k.as_array_mut()) {
        keys.retain(|k| {
            matches!(
                (k["kty"].as_str(), k["crv"].as_str()),
                (Some("OKP"), Some("Ed25519")) | (Some("RSA"), _)
            ) && k["use"].as_str().is_none_or(|u| u == "sig")
        });
    }
    super::parse_jwks(&doc.to_string())
}

/// How long a set fetched with `max_age` (its answer's) is used:
/// `jwks_max_age` at most, `jwks_min_refresh` at least (which wins when
/// the two cross, as the config allows).
fn next_fetch(max_age: Option<Duration>, jwks: &JwksUrl) -> Duration {
    max_age
        .unwrap_or(jwks.max_age)
        .min(jwks.max_age)
        .max(jwks.min_refresh)
}

/// `max-age` of a `Cache-Control` value.
fn max_age(value: &str) -> Option<Duration> {
    value.split(',').find_map(|d| {
        let (name, seconds) = d.trim().split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("max-age")
            .then(|| seconds.trim().trim_matches('"').parse().ok())
            .flatten()
            .map(Duration::from_secs)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_age_is_read_from_cache_control() {
        assert_eq!(
            max_age("public, max-age=300"),
            Some(Duration::from_secs(300))
        );
        assert_eq!(max_age("MAX-AGE=\"60\""), Some(Duration::from_secs(60)));
        assert_eq!(max_age("no-cache"), None);
        assert_eq!(max_age("max-age=soon"), None);
    }

    #[test]
    fn the_next_fetch_is_within_the_bounds_even_when_they_cross() {
        let s = Duration::from_secs;
        let jwks = |min, max| JwksUrl {
            url: http::Uri::from_static("http://idp.example/jwks.json"),
            min_refresh: s(min),
            max_age: s(max),
        };
        assert_eq!(next_fetch(None, &jwks(60, 3600)), s(3600));
        assert_eq!(next_fetch(Some(s(300)), &jwks(60, 3600)), s(300));
        assert_eq!(next_fetch(Some(s(5)), &jwks(60, 3600)), s(60));
        assert_eq!(next_fetch(Some(s(86400)), &jwks(60, 3600)), s(3600));
        assert_eq!(next_fetch(None, &jwks(3600, 60)), s(3600));
    }

    #[test]
    fn a_fetched_set_skips_other_key_types_but_needs_one_usable_key() {
        let ed = r#"{"kty":"OKP","crv":"Ed25519","kid":"k1","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}"#;
        let ec = r#"{"kty":"EC","crv":"P-256","kid":"e1","x":"a","y":"b"}"#;
        let keys = parse_fetched(&format!(r#"{{"keys":[{ec},{ed}]}}"#)).unwrap();
        assert_eq!(keys.len(), 1);
        assert!(parse_fetched(&format!(r#"{{"keys":[{ec}]}}"#)).is_err());
        assert!(parse_fetched(r#"{"keys":[]}"#).is_err());
        assert!(parse_fetched("<html>down for maintenance</html>").is_err());
        assert!(parse_fetched(r#"{"keys":"none"}"#).is_err());
    }
}
