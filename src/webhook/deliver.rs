//! One webhook's delivery task: its queue in order, one delivery at a
//! time, each POSTed signed and retried with back-off while the answer
//! says it may succeed later (408, 429, 5xx, no answer). A retry keeps
//! the happening's id and gets a fresh timestamp and signature. While a
//! delivery waits out its back-off the queue keeps taking happenings
//! (and dropping, counted, what does not fit).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::Rng;
use tokio::sync::mpsc;

use super::{Common, Counts, Happening, Hook};

use crate::outbound::{https_connector, Https};
pub(super) type HttpClient = Client<Https, Full<Bytes>>;

/// `X-Waitroom-Delivery`: the happening's id, the same on every retry.
pub const DELIVERY_HEADER: &str = "x-waitroom-delivery";
/// `X-Waitroom-Kind`: the happening's kind.
pub const KIND_HEADER: &str = "x-waitroom-kind";
/// `X-Waitroom-Timestamp`: Unix seconds when this attempt was signed.
pub const TIMESTAMP_HEADER: &str = "x-waitroom-timestamp";
/// `X-Waitroom-Signature`: `v1=` and the HMAC (`sign`).
pub const SIGNATURE_HEADER: &str = "x-waitroom-signature";

const USER_AGENT: &str = concat!("waitroom/", env!("CARGO_PKG_VERSION"));
/// Most of a receiver's answer read (and thrown away).
const MAX_ANSWER_LEN: usize = 64 * 1024;

/// The webhooks' client: HTTP/1 over [`https_connector`].
pub(super) fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build(https_connector("webhooks"))
}

/// What one attempt came to.
enum Attempt {
    /// A 2xx.
    Delivered,
    /// Worth another attempt: 408, 429, 5xx (with the `Retry-After`
    /// seconds given, if any), no connection or no answer in time.
    Again {
        why: String,
        retry_after: Option<Duration>,
    },
    /// Not worth another: any other answer (or a request that cannot be
    /// made: an id that is no header value).
    Refused(String),
}

/// Delivers `rx` in order until stopping; then what is queued gets the
/// grace, and what is left past it is counted dropped.
pub(super) async fn run(
    mut rx: mpsc::Receiver<Arc<Happening>>,
    hook: Arc<Hook>,
    client: HttpClient,
    common: Arc<Common>,
) {
    let worker = Worker {
        hook: &hook,
        client: &client,
        common: &common,
    };
    loop {
        tokio::select! {
            biased;
            _ = hook.stop.cancelled() => break,
            next = rx.recv() => match next {
                Some(h) => worker.deliver(&h).await,
                None => return,
            },
        }
    }
    // From now on `emit` finds the queue closed and counts a drop.
    rx.close();
    while let Some(h) = rx.recv().await {
        if hook.past() {
            Counts::add(&hook.counts.dropped, 1);
        } else {
            worker.deliver(&h).await;
        }
    }
}

struct Worker<'a> {
    hook: &'a Hook,
    client: &'a HttpClient,
    common: &'a Common,
}

impl Worker<'_> {
    /// Attempts `h` up to `max_attempts` times, counting the outcome.
    async fn deliver(&self, h: &Happening) {
        let counts = &self.hook.counts;
        let body = Bytes::from(h.body());
        let max = self.hook.config.max_attempts.max(1);
        for attempt in 1..=max {
            if attempt > 1 {
                Counts::add(&counts.retried, 1);
            }
            let outcome = tokio::select! {
                outcome = self.attempt(h, &body) => outcome,
                _ = self.hook.past_deadline() => {
                    Counts::add(&counts.dropped, 1);
                    return;
                }
            };
            let (why, retry_after) = match outcome {
                Attempt::Delivered => {
                    Counts::add(&counts.sent, 1);
                    return;
                }
                Attempt::Refused(why) => {
                    Counts::add(&counts.failed, 1);
                    tracing::warn!(
                        url = %self.hook.url,
                        kind = h.kind.name(),
                        id = %h.id,
                        why = %why,
                        "webhook delivery refused; not retried"
                    );
                    return;
                }
                Attempt::Again { why, retry_after } => (why, retry_after),
            };
            if attempt == max {
                Counts::add(&counts.failed, 1);
                tracing::warn!(
                    url = %self.hook.url,
                    kind = h.kind.name(),
                    id = %h.id,
                    attempts = max,
                    last = %why,
                    "webhook delivery given up"
                );
                return;
            }
            tracing::debug!(url = %self.hook.url, id = %h.id, attempt, why = %why, "webhook delivery to be retried");
            let wait = backoff(&self.common.options, attempt, retry_after);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.hook.past_deadline() => {
                    Counts::add(&counts.dropped, 1);
                    return;
                }
            }
        }
    }

    /// One POST of `body`, signed now.
    async fn attempt(&self, h: &Happening, body: &Bytes) -> Attempt {
        let config = &self.hook.config;
        let timestamp = self.common.clock.now_ms() / 1000;
        let signature = super::sign(config.secret.0.as_bytes(), timestamp, body);
        let Ok(id) = HeaderValue::from_str(&h.id) else {
            // The gate's ids are plain text; one that is not cannot be
            // sent, now or later.
            return Attempt::Refused("the id is not a header value".to_owned());
        };
        let request = Request::post(config.url.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::USER_AGENT, USER_AGENT)
            .header(DELIVERY_HEADER, id)
            .header(KIND_HEADER, h.kind.name())
            .header(TIMESTAMP_HEADER, timestamp)
            .header(SIGNATURE_HEADER, signature)
            .body(Full::new(body.clone()));
        let request = match request {
            Ok(r) => r,
            Err(e) => return Attempt::Refused(format!("request: {e}")),
        };
        let exchange = async {
            let response = self.client.request(request).await?;
            let status = response.status();
            let retry_after = response
                .headers()
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            // Read to the end so the connection can be used again.
            let _ = Limited::new(response.into_body(), MAX_ANSWER_LEN)
                .collect()
                .await;
            Ok::<_, hyper_util::client::legacy::Error>((status, retry_after))
        };
        match tokio::time::timeout(config.timeout, exchange).await {
            Err(_) => Attempt::Again {
                why: format!("no answer within {:?}", config.timeout),
                retry_after: None,
            },
            Ok(Err(e)) => Attempt::Again {
                why: format!("request: {e}"),
                retry_after: None,
            },
            Ok(Ok((status, _))) if status.is_success() => Attempt::Delivered,
            Ok(Ok((status, retry_after)))
                if status == StatusCode::REQUEST_TIMEOUT
                    || status == StatusCode::TOO_MANY_REQUESTS
                    || status.is_server_error() =>
            {
                Attempt::Again {
                    why: format!("answered {status}"),
                    retry_after,
                }
            }
            Ok(Ok((status, _))) => Attempt::Refused(format!("answered {status}")),
        }
    }
}

/// The wait after failed attempt `attempt` (from 1): `Retry-After` when
/// given, else `backoff_base` × 2^(attempt−1) ±20%; either at most
/// `backoff_cap`.
fn backoff(options: &super::Options, attempt: u32, retry_after: Option<Duration>) -> Duration {
    if let Some(after) = retry_after {
        return after.min(options.backoff_cap);
    }
    let doubled = options
        .backoff_base
        .saturating_mul(1u32 << (attempt - 1).min(20));
    let jitter = rand::thread_rng().gen_range(0.8..=1.2);
    doubled.mul_f64(jitter).min(options.backoff_cap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webhook::Options;

    #[test]
    fn the_backoff_doubles_within_a_fifth_and_stops_at_the_cap() {
        let o = Options::default();
        for (attempt, base) in [(1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0)] {
            let w = backoff(&o, attempt, None).as_secs_f64();
            assert!(
                w >= base * 0.8 - 1e-9 && w <= base * 1.2 + 1e-9,
                "{attempt}: {w}"
            );
        }
        assert_eq!(backoff(&o, 12, None), Duration::from_secs(300));
        assert_eq!(backoff(&o, 40, None), Duration::from_secs(300));
        assert_eq!(
            backoff(&o, 1, Some(Duration::from_secs(7))),
            Duration::from_secs(7)
        );
        assert_eq!(
            backoff(&o, 1, Some(Duration::from_secs(3600))),
            Duration::from_secs(300)
        );
    }
}
