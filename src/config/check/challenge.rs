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
        let named = match raw.secret_env.take() {
            Some(name) => self.env_name(&secret_path, Some(name), ""),
            None => {
                self.fail(
                    &secret_path,
                    format!(
                        "missing: the name of the environment variable that holds the {} secret key",
                        kind.name()
                    ),
                );
                None
            }
        };
        let secret = match named {
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

#[cfg(test)]
mod tests {
    use crate::config::check::tests::{overlay, refusals, refusals_with, with};

    fn room(keys: &str) -> Vec<String> {
        refusals(&with("room", keys))
    }

    /// A room asking the Turnstile captcha, with `keys` besides (a key
    /// given replaces the valid one) and its secret in the environment.
    fn turnstile(keys: &str) -> Vec<String> {
        let valid = "challenge = \"turnstile\"\nchallenge_site_key = \"0x4AAAAAAA\"\nchallenge_secret_env = \"TS_SECRET\"";
        let src = with("room", &overlay(valid, keys));
        refusals_with(&src, &[("TS_SECRET", "secret")])
    }

    #[test]
    fn a_captcha_room_asks_no_proof_of_work() {
        assert!(turnstile("").is_empty());
        assert_eq!(
            turnstile("proof_of_work = 16"),
            ["room[0].proof_of_work: the room asks the turnstile challenge: proof_of_work must be 0"]
        );
    }

    #[test]
    fn the_site_key_is_one_printable_word() {
        for key in ["", "0x4 AAA", "0x4\\\"<b>"] {
            assert_eq!(
                turnstile(&format!("challenge_site_key = \"{key}\"")),
                ["room[0].challenge_site_key: missing or not a key: the turnstile site key"],
                "{key}"
            );
        }
    }

    #[test]
    fn the_secret_variable_is_named_and_set() {
        assert_eq!(
            turnstile("challenge_secret_env = \"OTHER\""),
            ["room[0].challenge_secret_env: environment variable OTHER is not set; it holds the turnstile secret key"]
        );
        // Left out, it is said to be missing.
        let src = with(
            "room",
            "challenge = \"hcaptcha\"\nchallenge_site_key = \"k\"",
        );
        assert_eq!(
            refusals_with(&src, &[]),
            ["room[0].challenge_secret_env: missing: the name of the environment variable that holds the hcaptcha secret key"]
        );
    }

    #[test]
    fn the_provider_urls_are_http_or_https() {
        for url in ["ftp://verify.example/", "/siteverify", "https://"] {
            assert_eq!(
                turnstile(&format!("challenge_verify_url = {url:?}")),
                [format!(
                    "room[0].challenge_verify_url: {url:?} is not an http(s) URL"
                )]
            );
        }
        for url in [
            "javascript:alert(1)",
            "https://cdn.example/a b.js",
            "https://cdn.example/\"x",
        ] {
            assert_eq!(
                turnstile(&format!("challenge_script_url = {url:?}")),
                [format!(
                    "room[0].challenge_script_url: {url:?} is not an http(s) URL"
                )]
            );
        }
    }

    #[test]
    fn the_timeout_and_concurrency_are_in_range() {
        assert_eq!(
            turnstile("challenge_timeout = \"0s\""),
            ["room[0].challenge_timeout: must be longer than 0, got \"0s\""]
        );
        for n in [0, 10_001] {
            assert_eq!(
                turnstile(&format!("challenge_concurrency = {n}")),
                [format!("room[0].challenge_concurrency: {n} is out of range: 1 to 10000 verifications in flight at once")]
            );
        }
    }

    #[test]
    fn a_bot_score_needs_its_header_its_minimum_and_the_shadow_queue() {
        assert_eq!(
            room("bot_score_header = \"cf-bot-score\"\nfailed_challenge = \"shadow\""),
            ["room[0].min_bot_score: missing: bot_score_header needs the score below which a visitor is a bot"]
        );
        assert_eq!(
            room("min_bot_score = 30\nfailed_challenge = \"shadow\""),
            ["room[0].bot_score_header: missing: min_bot_score needs the header a trusted proxy puts the score in"]
        );
        assert_eq!(
            room("bot_score_header = \"bot score\"\nmin_bot_score = 100"),
            [
                r#"room[0].bot_score_header: "bot score" is not a valid HTTP header name"#,
                "room[0].min_bot_score: 100 is out of range: 1 to 99 (scores below it are bots)",
                "room[0].failed_challenge: bot_score_header sends the visitors it names to the shadow queue: set failed_challenge = \"shadow\" (or \"log\" to count them first)",
            ]
        );
        let valid = "bot_score_header = \"cf-bot-score\"\nmin_bot_score = 30";
        assert!(room(&format!("{valid}\nfailed_challenge = \"log\"")).is_empty());
    }
}
