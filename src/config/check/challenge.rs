//! A room's challenge: a captcha provider (`room.challenge` and its
//! settings) in place of the proof of work, and the bot score a trusted
//! proxy reports (`bot_score_header`, `min_bot_score`).

use std::time::Duration;

use super::Checker;
use crate::config::keypath::KeyPath;
use crate::config::raw::{RawCaptcha, RawRoom};
use crate::config::{BotScore, Captcha, ChallengeKind, FailedChallenge, Secret};

/// Most captcha verifications in flight at once per room and instance,
/// and how many by default (`room.challenge_concurrency`).
const MAX_CHALLENGE_CONCURRENCY: u64 = 10_000;
const DEFAULT_CHALLENGE_CONCURRENCY: u64 = 64;

impl Checker<'_, '_> {
    /// `room.challenge` with a captcha provider, and its settings.
    pub(super) fn captcha(
        &mut self,
        p: &KeyPath,
        raw: &mut RawCaptcha,
        proof_of_work: u8,
    ) -> Option<Captcha> {
        let kind = match raw.kind {
            None | Some(ChallengeKind::ProofOfWork) => return None,
            Some(kind) => kind,
        };
        if proof_of_work > 0 {
            self.fail(
                &p.key("proof_of_work"),
                format!(
                    "the room asks the {} challenge: proof_of_work must be 0",
                    kind.name()
                ),
            );
        }
        let (verify, script) = kind.default_urls().unwrap_or_default();
        let site_key = raw.site_key.take().unwrap_or_default();
        if site_key.is_empty()
            || !site_key.chars().all(|c| c.is_ascii_graphic())
            || site_key.contains(['"', '<', '>'])
        {
            self.fail(
                &p.key("challenge_site_key"),
                format!("missing or not a key: the {} site key", kind.name()),
            );
        }
        let secret_path = p.key("challenge_secret_env");
        let secret = match self.env_name(&secret_path, raw.secret_env.take(), "") {
            Some(var) => match self.env_value(&var) {
                Some(v) => Some(Secret(v)),
                None => {
                    self.fail(
                        &secret_path,
                        format!(
                            "environment variable {var} is not set; it holds the {} secret key",
                            kind.name()
                        ),
                    );
                    None
                }
            },
            None => None,
        };
        let verify_text = raw.verify_url.take().unwrap_or_else(|| verify.to_owned());
        let verify_url = match verify_text.parse::<http::Uri>() {
            Ok(u) if matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some() => {
                Some(u)
            }
            _ => {
                self.fail(
                    &p.key("challenge_verify_url"),
                    format!("{verify_text:?} is not an http(s) URL"),
                );
                None
            }
        };
        let script_url = raw.script_url.take().unwrap_or_else(|| script.to_owned());
        if !(script_url.starts_with("https://") || script_url.starts_with("http://"))
            || script_url.contains(['"', '<', '>', ' ', '\''])
        {
            self.fail(
                &p.key("challenge_script_url"),
                format!("{script_url:?} is not an http(s) URL"),
            );
        }
        let timeout = self.duration(
            &p.key("challenge_timeout"),
            raw.timeout.take(),
            Duration::from_secs(3),
            Duration::ZERO,
        );
        let concurrency = match raw.concurrency.unwrap_or(DEFAULT_CHALLENGE_CONCURRENCY) {
            n @ 1..=MAX_CHALLENGE_CONCURRENCY => n as usize,
            n => {
                self.fail(
                    &p.key("challenge_concurrency"),
                    format!("{n} is out of range: 1 to {MAX_CHALLENGE_CONCURRENCY} verifications in flight at once"),
                );
                1
            }
        };
        Some(Captcha {
            kind,
            site_key,
            secret: secret?,
            verify_url: verify_url?,
            script_url,
            timeout,
            on_error: raw.on_error.unwrap_or_default(),
            concurrency,
        })
    }

    /// `bot_score_header` and `min_bot_score`, both or neither; the bots
    /// they name go to the shadow queue, so `failed_challenge` must not
    /// be `"retry"`.
    pub(super) fn bot_score(
        &mut self,
        p: &KeyPath,
        raw: &mut RawRoom,
        failed_challenge: FailedChallenge,
    ) -> Option<BotScore> {
        match (raw.bot_score_header.take(), raw.min_bot_score) {
            (None, None) => None,
            (Some(header), Some(min)) => {
                let name = http::HeaderName::from_bytes(header.as_bytes()).ok();
                if name.is_none() {
                    self.fail(
                        &p.key("bot_score_header"),
                        format!("{header:?} is not a valid HTTP header name"),
                    );
                }
                if !(1..=99).contains(&min) {
                    self.fail(
                        &p.key("min_bot_score"),
                        format!("{min} is out of range: 1 to 99 (scores below it are bots)"),
                    );
                }
                if failed_challenge == FailedChallenge::Retry {
                    self.fail(
                        &p.key("failed_challenge"),
                        "bot_score_header sends the visitors it names to the shadow queue: set failed_challenge = \"shadow\" (or \"log\" to count them first)",
                    );
                }
                name.map(|header| BotScore {
                    header,
                    min: min.clamp(1, 99) as u8,
                })
            }
            (Some(_), None) => {
                self.fail(
                    &p.key("min_bot_score"),
                    "missing: bot_score_header needs the score below which a visitor is a bot",
                );
                None
            }
            (None, Some(_)) => {
                self.fail(
                    &p.key("bot_score_header"),
                    "missing: min_bot_score needs the header a trusted proxy puts the score in",
                );
                None
            }
        }
    }
}
