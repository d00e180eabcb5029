//! A captcha provider's challenge (Cloudflare Turnstile, hCaptcha,
//! reCAPTCHA) asked of newcomers while a room queues, in place of the
//! proof of work (`room.challenge`). The page embeds the provider's widget;
//! its callback hands the token back in the `waitroom_.captcha` cookie (apps
//! send `X-Waitroom-Captcha`), and the daemon asks the provider's
//! `siteverify` API (its URL configurable) whether the token holds, within
//! `room.challenge_timeout`.
//!
//! What the verifier says is read strictly: a 200 with `"success": true`
//! passes; a 200 with `false`, a 4xx or a body that is not
//! `{"success": bool}` is a refusal. Only no answer (no connection, none
//! in time, a 5xx) is `room.challenge_on_error`'s to decide: `closed` (the
//! challenge again) or `open`, which passes the token only while the
//! verifier gave no answer to most of the networks it was recently asked
//! for ([`Recent`]), so neither one slow answer nor one network's burst
//! opens the gate; each such pass is counted (`captcha_open_passed`).
//! At most `room.challenge_concurrency` verifications are in flight per
//! room on this instance: a burst of tokens cannot make the verifier slow,
//! and a newcomer finding them all taken is asked to hand its token in
//! again shortly (it was not spent).
//!
//! The providers take a token once. Each token is noted in the store with
//! the network it came from before it is sent (`proof::claim`): the same
//! network handing it in again (two tabs, a double reload) gets the widget
//! again, never the shadow queue, and is never sent to the provider twice;
//! another network's copy is refused unasked.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use crate::clock::Millis;
use crate::config::{Captcha, OnVerifyError, RoomConfig};
use crate::proxy::headers;
use crate::store::StoreError;

/// The header apps hand a token back in.
pub(crate) const X_WAITROOM_CAPTCHA: HeaderName = HeaderName::from_static("x-waitroom-captcha");
pub(crate) use crate::queue_page::CAPTCHA_COOKIE;
/// Longer tokens are refused unread (Turnstile's are about 2 KB).
const MAX_TOKEN_LEN: usize = 4096;
/// Most of a verifier's answer read.
const MAX_ANSWER_LEN: usize = 64 * 1024;
/// How long a token is remembered after it was handed in: the providers'
/// tokens live 300 s.
const TOKEN_TTL_MS: Millis = 300_000;
/// How soon a newcomer who found every verification slot taken is asked
/// to hand its token in again.
pub(crate) const BUSY_RETRY: Duration = Duration::from_secs(2);
/// The recent verifications `open` looks at: the last outcome of each
/// network (`ticket::network_of`) in the last [`WINDOW_MS`], of at least
/// [`WINDOW_MIN`] networks, at most [`WINDOW_NETS`] of them.
const WINDOW_MS: Millis = 30_000;
const WINDOW_MIN: usize = 10;
const WINDOW_NETS: usize = 1024;

use crate::outbound::Https;

/// Why a token got no verdict: the verifier did not answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum VerifyError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("request: {0}")]
    Request(String),
    #[error("answered {0}")]
    Status(StatusCode),
}

/// What the verifier answered about a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Taken: the token holds.
    Taken,
    /// Refused: the token does not hold.
    Refused,
    /// Refused as used before or too old (`timeout-or-duplicate`,
    /// `already-seen-response`): what an honest double submission or a
    /// slow visitor gets.
    Spent,
    /// An answer that is no verdict on the token (a 4xx, a body that is
    /// not `{"success": bool}`): never a pass.
    NoVerdict,
}

/// The client that asks the providers' verifiers (HTTPS with the system's
/// CA certificates, or HTTP), and each captcha room's bound and record.
pub(crate) struct Verifier {
    client: Client<Https, Full<Bytes>>,
    /// By room id.
    rooms: HashMap<String, Checks>,
}

/// One room's verifications on this instance.
struct Checks {
    /// Verifications in flight, at most `room.challenge_concurrency`.
    pending: Semaphore,
    recent: Mutex<Recent>,
}

/// The outcomes of a room's recent verifications, one per network: the
/// last one's time and whether it got no answer. One network's burst
/// (which may well slow the verifier down) counts once, so it cannot
/// make the verifier look down to `open`; at worst, crowding the record,
/// it keeps `open` shut.
#[derive(Default)]
pub(crate) struct Recent {
    by_net: HashMap<u64, (Millis, bool)>,
}

impl Recent {
    /// Records a verification at `now` for network `net` that got an
    /// answer or (`unanswered`) none.
    pub(crate) fn record(&mut self, now: Millis, net: u64, unanswered: bool) {
        if self.by_net.len() >= WINDOW_NETS && !self.by_net.contains_key(&net) {
            self.by_net
                .retain(|_, (at, _)| at.saturating_add(WINDOW_MS) > now);
            if self.by_net.len() >= WINDOW_NETS {
                return;
            }
        }
        self.by_net.insert(net, (now, unanswered));
    }

    /// Whether the verifier is down for most visitors: of the networks
    /// verified in the last [`WINDOW_MS`] (at least [`WINDOW_MIN`]), more
    /// than half last got no answer.
    pub(crate) fn failing(&self, now: Millis) -> bool {
        let (total, unanswered) = self
            .by_net
            .values()
            .filter(|(at, _)| at.saturating_add(WINDOW_MS) > now)
            .fold((0, 0), |(t, u), (_, un)| (t + 1, u + usize::from(*un)));
        total >= WINDOW_MIN && unanswered * 2 > total
    }
}

impl Verifier {
    /// For `rooms` (those with a captcha get their bound).
    pub(crate) fn new(rooms: &[RoomConfig]) -> Self {
        let connector = crate::outbound::https_connector("captcha verifiers");
        let rooms = rooms
            .iter()
            .filter_map(|r| {
                let c = r.captcha.as_ref()?;
                Some((
                    r.id.clone(),
                    Checks {
                        pending: Semaphore::new(c.concurrency),
                        recent: Mutex::default(),
                    },
                ))
            })
            .collect();
        Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            rooms,
        }
    }

    /// What the provider says of `token` from a visitor at `remote_ip`.
    pub(crate) async fn verify(
        &self,
        captcha: &Captcha,
        token: &str,
        remote_ip: IpAddr,
    ) -> Result<Answer, VerifyError> {
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
            let status = resp.status();
            if status.is_server_error() {
                return Err(VerifyError::Status(status));
            }
            let body = Limited::new(resp.into_body(), MAX_ANSWER_LEN)
                .collect()
                .await
                .map(|b| b.to_bytes());
            // The headers came: whatever follows is an answer.
            Ok(match body {
                Ok(body) if status == StatusCode::OK => read_answer(&body),
                _ => Answer::NoVerdict,
            })
        };
        tokio::time::timeout(captcha.timeout, exchange)
            .await
            .map_err(|_| VerifyError::Timeout(captcha.timeout))?
    }
}

/// A verifier's 200 answer: `{"success": bool, "error-codes": [...]}`.
fn read_answer(body: &[u8]) -> Answer {
    let Ok(answer) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Answer::NoVerdict;
    };
    match answer["success"].as_bool() {
        Some(true) => Answer::Taken,
        Some(false) => {
            let spent = answer["error-codes"].as_array().is_some_and(|codes| {
                codes.iter().filter_map(|c| c.as_str()).any(|c| {
                    matches!(
                        c,
                        "timeout-or-duplicate"
                            | "already-seen-response"
                            | "invalid-or-already-seen-response"
                    )
                })
            });
            if spent {
                Answer::Spent
            } else {
                Answer::Refused
            }
        }
        None => Answer::NoVerdict,
    }
}

/// The token a request hands back, if it carries one of a sane size (the
/// page's cookie holds it percent-encoded).
pub(crate) fn presented(headers: &HeaderMap) -> Option<String> {
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

/// A token's name in the store's note of tokens handed in.
fn token_key(token: &str) -> u64 {
    let digest = Sha256::new()
        .chain_update(b"waitroom/captcha\0")
        .chain_update(token.as_bytes())
        .finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

impl super::Admission {
    /// While the room queues: the captcha for a request without a token;
    /// `Proven` for a token the provider takes; for one it refuses,
    /// `Failed` (the shadow queue) or the captcha again; the captcha again
    /// for a token this network handed in before, one the provider calls
    /// spent, and an answer that is no verdict; `CaptchaBusy` when every
    /// verification slot is taken; and when the verifier does not answer,
    /// what `challenge_on_error` says.
    pub(super) async fn captcha_wanted(
        &self,
        room: &super::Room,
        headers: &HeaderMap,
        ctx: &super::Ctx<'_>,
    ) -> Result<super::admission::Proof, StoreError> {
        use super::admission::Proof;
        let (Some(captcha), Some(verifier)) =
            (room.config.captcha.as_ref(), self.captchas.as_ref())
        else {
            return Ok(Proof::NotAsked);
        };
        if !room.asks_captcha(ctx.now) {
            return Ok(Proof::NotAsked);
        }
        let m = &room.metrics;
        let (Some(token), Some(checks)) = (presented(headers), verifier.rooms.get(&room.config.id))
        else {
            m.challenged.inc();
            return Ok(Proof::CaptchaWanted);
        };
        let Ok(_slot) = checks.pending.try_acquire() else {
            m.captcha_busy.inc();
            return Ok(Proof::CaptchaBusy);
        };
        let key = token_key(&token);
        match self
            .claim(room, "captchas", key, ctx.now + TOKEN_TTL_MS, ctx)
            .await?
        {
            super::proof::Claim::First => {}
            super::proof::Claim::Again => {
                tracing::debug!(room = %room.config.id, client = %ctx.client, "captcha token handed in again");
                m.challenged.inc();
                return Ok(Proof::CaptchaWanted);
            }
            super::proof::Claim::Foreign => {
                m.captcha_failed.inc();
                tracing::debug!(room = %room.config.id, client = %ctx.client, "captcha token from another network");
                return Ok(self.captcha_refused(room));
            }
        }
        let answer = verifier.verify(captcha, &token, ctx.client).await;
        checks
            .recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(ctx.now, ctx.net, answer.is_err());
        Ok(match answer {
            Ok(Answer::Taken) => {
                m.captcha_passed.inc();
                Proof::Proven
            }
            Ok(Answer::Refused) => {
                m.captcha_failed.inc();
                tracing::debug!(room = %room.config.id, client = %ctx.client, "captcha refused");
                self.captcha_refused(room)
            }
            Ok(why @ (Answer::Spent | Answer::NoVerdict)) => {
                m.captcha_failed.inc();
                tracing::debug!(room = %room.config.id, client = %ctx.client, ?why, "captcha not taken");
                m.challenged.inc();
                Proof::CaptchaWanted
            }
            Err(e) => {
                tracing::warn!(room = %room.config.id, error = %e, "captcha verifier unavailable");
                let down = checks
                    .recent
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .failing(ctx.now);
                if captcha.on_error == OnVerifyError::Open && down {
                    m.captcha_open_passed.inc();
                    Proof::Proven
                } else {
                    m.challenged.inc();
                    Proof::CaptchaWanted
                }
            }
        })
    }

    /// A token that does not hold: the shadow queue, or the captcha again.
    fn captcha_refused(&self, room: &super::Room) -> super::admission::Proof {
        if self.shadows(room) {
            super::admission::Proof::Failed
        } else {
            room.metrics.challenged.inc();
            super::admission::Proof::CaptchaWanted
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_clear_yes_passes() {
        assert_eq!(read_answer(br#"{"success":true}"#), Answer::Taken);
        assert_eq!(
            read_answer(br#"{"success":false,"error-codes":["invalid-input-response"]}"#),
            Answer::Refused
        );
        assert_eq!(
            read_answer(br#"{"success":false,"error-codes":["timeout-or-duplicate"]}"#),
            Answer::Spent
        );
        for body in [
            &b""[..],
            b"{}",
            br#"{"success":"true"}"#,
            b"<html>",
            br#"[true]"#,
        ] {
            assert_eq!(read_answer(body), Answer::NoVerdict, "{body:?}");
        }
    }

    #[test]
    fn the_verifier_is_down_only_when_most_networks_got_no_answer() {
        let mut r = Recent::default();
        for net in 0..9 {
            r.record(1_000 + net, net, true);
        }
        assert!(!r.failing(1_010), "too few to tell");
        // One network, however often, is one.
        for _ in 0..100 {
            r.record(1_010, 8, true);
        }
        assert!(!r.failing(1_010));
        r.record(1_010, 9, true);
        assert!(r.failing(1_010));
        for net in 10..20 {
            r.record(1_020, net, false);
        }
        assert!(!r.failing(1_030), "half answered: not most");
        r.record(1_031, 20, true);
        assert!(r.failing(1_031));
        assert!(!r.failing(1_031 + WINDOW_MS), "all of it too old");
    }
}
