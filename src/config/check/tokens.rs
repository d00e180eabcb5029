//! A room's enqueue tokens (`[room.enqueue_token]`): its mode, the keys
//! tokens are verified with, and the claims required of them.

use std::time::Duration;

use super::Checker;
use crate::config::keypath::KeyPath;
use crate::config::raw::RawEnqueueToken;
use crate::config::EnqueueToken;

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
        if let Some(var) = raw.hmac_keys_env {
            let path = p.key("hmac_keys_env");
            let var = self.env_name(&path, Some(var), "")?;
            match self.env_value(&var) {
                Some(v) => {
                    for (i, k) in v.split(',').enumerate() {
                        use base64::engine::Engine;
                        match base64::engine::general_purpose::STANDARD.decode(k.trim()) {
                            Ok(bytes) if bytes.len() >= 32 => keys.hmac.push(bytes),
                            _ => self.fail(
                                &path,
                                format!("key {i} in {var} is not base64 of at least 32 bytes"),
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
        if keys.hmac.is_empty() && keys.public.is_empty() {
            self.fail(p, "no keys: give hmac_keys_env, jwks_file or both");
            return None;
        }
        let rules =
            crate::enqueue::Rules::new(room, &raw.audience, &raw.issuer, max_lifetime.as_secs());
        Some(EnqueueToken {
            required,
            keys,
            rules,
        })
    }
}
