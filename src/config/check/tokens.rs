//! A room's enqueue tokens (`[room.enqueue_token]`): its mode, the keys
//! tokens are verified with, and the claims required of them.

use std::time::Duration;

use super::Checker;
use crate::config::keypath::KeyPath;
use crate::config::raw::{RawDuration, RawEnqueueToken};
use crate::config::{EnqueueToken, JwksUrl};

impl Checker<'_, '_> {
    /// `[room.enqueue_token]`: its mode and keys (at least one key).
    pub(super) fn enqueue_token(
        &mut self,
        p: &KeyPath,
        room: &str,
        raw: RawEnqueueToken,
    ) -> Option<EnqueueToken> {
        let required = match raw.mode.as_deref().unwrap_or("optional") {
            "off" => return None,
            "optional" => false,
            "required" => true,
            other => {
                self.fail(
                    &p.key("mode"),
                    format!("{other:?} is not \"off\", \"optional\" or \"required\""),
                );
                return None;
            }
        };
        let mut keys = crate::enqueue::TokenKeys::default();
        let path = p.key("hmac_keys_env");
        // A bad name is reported and the rest of the section still checked
        // (one pass finds every problem).
        if let Some(var) = raw
            .hmac_keys_env
            .and_then(|var| self.env_name(&path, Some(var), ""))
        {
            match self.env_value(&var) {
                Some(v) => {
                    for (i, k) in v.split(',').enumerate() {
                        use base64::engine::Engine;
                        match base64::engine::general_purpose::STANDARD.decode(k.trim()) {
                            Ok(bytes) if bytes.len() >= 32 => keys.hmac.push(bytes),
                            _ => self.fail(
                                &path,
                                format!(
                                    "key {} in {var} is not base64 of at least 32 bytes",
                                    i + 1
                                ),
                            ),
                        }
                    }
                }
                None => self.fail(
                    &path,
                    format!("environment variable {var} is not set; it holds the HS256 secrets"),
                ),
            }
        }
        if let Some(file) = raw.jwks_file {
            let path = p.key("jwks_file");
            match std::fs::read_to_string(&file) {
                Ok(text) => match crate::enqueue::parse_jwks(&text) {
                    Ok(public) => keys.public = public,
                    Err(why) => self.fail(&path, format!("{file}: {why}")),
                },
                Err(e) => self.fail(&path, format!("cannot read {file}: {e}")),
            }
        }
        let jwks_url = self.jwks_url(p, raw.jwks_url, raw.jwks_min_refresh, raw.jwks_max_age);
        for (key, values) in [("audience", &raw.audience), ("issuer", &raw.issuer)] {
            if let Some(bad) = values
                .iter()
                .find(|v| v.is_empty() || v.len() > 256 || v.chars().any(char::is_control))
            {
                self.fail(
                    &p.key(key),
                    format!(
                        "{bad:?} is not a valid {key}: 1 to 256 characters, no control characters"
                    ),
                );
            }
        }
        let max_lifetime = self.duration(
            &p.key("max_lifetime"),
            raw.max_lifetime,
            Duration::from_secs(crate::enqueue::DEFAULT_MAX_LIFETIME_S),
            Duration::from_secs(60),
        );
        if keys.hmac.is_empty() && keys.public.is_empty() && jwks_url.is_none() {
            self.fail(
                p,
                "no keys: give hmac_keys_env, jwks_file, jwks_url or several",
            );
            return None;
        }
        let rules =
            crate::enqueue::Rules::new(room, &raw.audience, &raw.issuer, max_lifetime.as_secs());
        Some(EnqueueToken {
            required,
            keys,
            jwks_url,
            rules,
        })
    }

    /// `jwks_url` and its refresh bounds. The URL is checked, not fetched.
    fn jwks_url(
        &mut self,
        p: &KeyPath,
        url: Option<String>,
        min_refresh: Option<RawDuration>,
        max_age: Option<RawDuration>,
    ) -> Option<JwksUrl> {
        let min_refresh = self.bounded(
            &p.key("jwks_min_refresh"),
            min_refresh,
            Duration::from_secs(60),
            (
                Duration::from_secs(1),
                Duration::from_secs(3600),
                "between 1s and 1h",
            ),
        );
        let max_age = self.bounded(
            &p.key("jwks_max_age"),
            max_age,
            Duration::from_secs(3600),
            (
                Duration::from_secs(60),
                Duration::from_secs(7 * 24 * 3600),
                "between 1m and 7days",
            ),
        );
        let text = url?;
        let path = p.key("jwks_url");
        let parsed = text.parse::<http::Uri>().ok().filter(|u| {
            matches!(u.scheme_str(), Some("http" | "https"))
                && u.host().is_some_and(|h| !h.is_empty())
        });
        let Some(url) = parsed else {
            self.fail(
                &path,
                format!("{text:?} is not an http:// or https:// URL with a host"),
            );
            return None;
        };
        if url.authority().is_some_and(|a| a.as_str().contains('@')) {
            self.fail(
                &path,
                format!("{text:?} holds a user or password; leave them out"),
            );
            return None;
        }
        Some(JwksUrl {
            url,
            min_refresh,
            max_age,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::config::check::tests::{file, refusals_with, with, KEY};

    const NO_KEYS: &str =
        "room[0].enqueue_token: no keys: give hmac_keys_env, jwks_file, jwks_url or several";

    /// `keys` in `[room.enqueue_token]`, with `vars` in the environment.
    fn token(keys: &str, vars: &[(&str, &str)]) -> Vec<String> {
        let src = format!("{}[room.enqueue_token]\n{keys}\n", with("room", ""));
        refusals_with(&src, vars)
    }

    #[test]
    fn the_token_mode_is_off_optional_or_required() {
        assert_eq!(
            token("mode = \"sometimes\"", &[]),
            [r#"room[0].enqueue_token.mode: "sometimes" is not "off", "optional" or "required""#]
        );
        // Off, the rest of the table is not read.
        assert!(token("mode = \"off\"\nmax_lifetime = \"1s\"", &[]).is_empty());
        assert_eq!(token("mode = \"required\"", &[]), [NO_KEYS]);
    }

    #[test]
    fn hmac_keys_are_set_and_long() {
        let keys = "hmac_keys_env = \"HK\"";
        assert_eq!(
            token(keys, &[]),
            [
                "room[0].enqueue_token.hmac_keys_env: environment variable HK is not set; it holds the HS256 secrets",
                NO_KEYS,
            ]
        );
        assert_eq!(
            token(keys, &[("HK", &format!("{KEY},c2hvcnQ="))]),
            // Counted from 1, as cookie.keys_env's are.
            ["room[0].enqueue_token.hmac_keys_env: key 2 in HK is not base64 of at least 32 bytes"]
        );
        // A bad name does not hide the rest of the section.
        assert_eq!(
            token("hmac_keys_env = \"1HK\"", &[]),
            [
                r#"room[0].enqueue_token.hmac_keys_env: "1HK" is not an environment variable name (letters, digits and _, not starting with a digit)"#,
                NO_KEYS,
            ]
        );
    }

    #[test]
    fn the_jwks_file_is_readable_and_a_jwks() {
        let key = "room[0].enqueue_token.jwks_file";
        let (_dir, ec) = file(r#"{"keys": [{"kty": "EC"}]}"#);
        assert_eq!(
            token(&format!("jwks_file = {ec:?}"), &[]),
            [
                format!(r#"{key}: {ec}: key 0: kty Some("EC") is not OKP (Ed25519) or RSA"#),
                NO_KEYS.to_owned()
            ]
        );
        let missing = format!("{ec}.missing");
        assert_eq!(
            token(&format!("jwks_file = {missing:?}"), &[]),
            [
                format!("{key}: cannot read {missing}: No such file or directory (os error 2)"),
                NO_KEYS.to_owned()
            ]
        );
    }

    #[test]
    fn the_jwks_url_is_http_with_a_host_and_no_user() {
        let key = "room[0].enqueue_token.jwks_url";
        for (url, why) in [
            (
                "ftp://idp.example/jwks.json",
                "is not an http:// or https:// URL with a host",
            ),
            (
                "https:///jwks.json",
                "is not an http:// or https:// URL with a host",
            ),
            (
                "idp.example/jwks.json",
                "is not an http:// or https:// URL with a host",
            ),
            (
                "https://a:b@idp.example/jwks.json",
                "holds a user or password; leave them out",
            ),
            (
                "https://a@idp.example/jwks.json",
                "holds a user or password; leave them out",
            ),
        ] {
            assert_eq!(
                token(&format!("jwks_url = {url:?}"), &[]),
                [format!("{key}: {url:?} {why}"), NO_KEYS.to_owned()],
                "{url}"
            );
        }
        // A URL alone is a key source; it is not fetched here.
        assert!(token(
            "jwks_url = \"https://idp.example/.well-known/jwks.json\"",
            &[]
        )
        .is_empty());
        assert!(token("jwks_url = \"http://127.0.0.1:9/jwks.json\"", &[]).is_empty());
        let url = "jwks_url = \"https://idp.example/jwks.json\"";
        assert_eq!(
            token(&format!("{url}\njwks_min_refresh = \"0.5s\""), &[]),
            [r#"room[0].enqueue_token.jwks_min_refresh: must be between 1s and 1h, got "0.5s""#]
        );
        assert_eq!(
            token(&format!("{url}\njwks_min_refresh = \"2h\""), &[]),
            [r#"room[0].enqueue_token.jwks_min_refresh: must be between 1s and 1h, got "2h""#]
        );
        assert_eq!(
            token(&format!("{url}\njwks_max_age = \"10s\""), &[]),
            [r#"room[0].enqueue_token.jwks_max_age: must be between 1m and 7days, got "10s""#]
        );
        assert!(token(
            &format!("{url}\njwks_min_refresh = \"5s\"\njwks_max_age = \"10m\""),
            &[]
        )
        .is_empty());
    }

    #[test]
    fn audiences_issuers_and_the_lifetime_are_checked() {
        let vars = [("HK", KEY)];
        for (keys, refusal) in [
            (
                "audience = [\"shop\", \"\"]",
                r#"room[0].enqueue_token.audience: "" is not a valid audience: 1 to 256 characters, no control characters"#,
            ),
            (
                "issuer = [\"a\\u0001\"]",
                r#"room[0].enqueue_token.issuer: "a\u{1}" is not a valid issuer: 1 to 256 characters, no control characters"#,
            ),
            (
                "max_lifetime = \"59s\"",
                r#"room[0].enqueue_token.max_lifetime: must be at least 1m, got "59s""#,
            ),
        ] {
            assert_eq!(
                token(&format!("hmac_keys_env = \"HK\"\n{keys}"), &vars),
                [refusal],
                "{keys}"
            );
        }
    }
}
