//! `[cookie]`: the ticket cookie's keys and settings.

use super::{defaults, root, Checker};
use crate::config::error::LoadOptions;
use crate::config::raw::RawCookie;
use crate::config::CookieConfig;

impl Checker<'_, '_> {
    pub(super) fn cookie(&mut self, raw: RawCookie, options: LoadOptions) -> CookieConfig {
        let p = root().key("cookie");
        let env_path = p.key("keys_env");
        let var = self.env_name(&env_path, raw.keys_env, defaults::KEYS_ENV);
        let from_env = var
            .as_ref()
            .and_then(|v| self.env_value(v).map(|s| (v.clone(), s)));
        let mut keys = Vec::new();
        // The environment wins over inline keys, as the usual override order.
        if let Some((var, value)) = from_env {
            let entries = value.split(',').map(str::trim).filter(|e| !e.is_empty());
            for (i, entry) in entries.enumerate() {
                match crate::secret::parse_key(entry) {
                    Ok(key) => keys.push(key),
                    Err(why) => self.fail(
                        &env_path,
                        format!("key {} in environment variable {var}: {why}", i + 1),
                    ),
                }
            }
        } else if let Some(inline) = raw.keys {
            for (i, entry) in inline.iter().enumerate() {
                match crate::secret::parse_key(entry) {
                    Ok(key) => keys.push(key),
                    Err(why) => self.fail(&p.key("keys").index(i), why),
                }
            }
        }
        let had_errors = self
            .problems
            .iter()
            .any(|pr| pr.key.starts_with("cookie.keys"));
        if keys.is_empty() && !had_errors && !options.allow_missing_keys {
            let var = var.unwrap_or_else(|| defaults::KEYS_ENV.to_owned());
            self.fail(
                &env_path,
                format!(
                    "no cookie keys configured; set {var} to a comma-separated list of keys \
                     (make one with `waitroom keygen`), or list them in cookie.keys"
                ),
            );
        }
        let max_networks_per_session = raw
            .max_networks_per_session
            .unwrap_or(defaults::MAX_NETWORKS_PER_SESSION);
        if max_networks_per_session > 1_000 {
            self.fail(
                &p.key("max_networks_per_session"),
                format!("{max_networks_per_session} is over 1000 (0 turns the limit off)"),
            );
        }
        CookieConfig {
            keys,
            secure: raw.secure.unwrap_or(true),
            bind_to_client: raw.bind_to_client.unwrap_or(false),
            max_networks_per_session,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::check::tests::{refusals, refusals_with, with, KEY};

    const SHORT: &str = "the key must be 32 bytes in base64 (43 or 44 characters), got 5 characters; generate one with `waitroom keygen`";

    #[test]
    fn every_key_in_the_variable_is_a_key() {
        let keys = format!("{KEY}, short");
        assert_eq!(
            refusals_with(&with("room", ""), &[("WAITROOM_COOKIE_KEYS", &keys)]),
            [format!(
                "cookie.keys_env: key 2 in environment variable WAITROOM_COOKIE_KEYS: {SHORT}"
            )]
        );
    }

    #[test]
    fn every_inline_key_is_a_key_unless_the_variable_is_set() {
        let src = with("cookie", &format!("keys = [{KEY:?}, \"short\"]"));
        assert_eq!(
            refusals_with(&src, &[("WAITROOM_COOKIE_KEYS", "")]),
            [format!("cookie.keys[1]: {SHORT}")]
        );
        // The variable wins, and the inline keys are not read.
        assert!(refusals(&src).is_empty());
    }

    #[test]
    fn there_is_at_least_one_key() {
        let none = |var: &str| {
            format!("cookie.keys_env: no cookie keys configured; set {var} to a comma-separated list of keys (make one with `waitroom keygen`), or list them in cookie.keys")
        };
        let no_env = [("WAITROOM_COOKIE_KEYS", " ")];
        assert_eq!(
            refusals_with(&with("room", ""), &no_env),
            [none("WAITROOM_COOKIE_KEYS")]
        );
        assert_eq!(
            refusals_with(&with("cookie", "keys_env = \"KEYS\""), &no_env),
            [none("KEYS")]
        );
        // A variable that cannot be named is the one problem reported.
        assert_eq!(
            refusals(&with("cookie", "keys_env = \"1KEYS\"")),
            [
                r#"cookie.keys_env: "1KEYS" is not an environment variable name (letters, digits and _, not starting with a digit)"#
            ]
        );
    }

    #[test]
    fn networks_per_session_are_at_most_1000() {
        assert_eq!(
            refusals(&with("cookie", "max_networks_per_session = 1001")),
            ["cookie.max_networks_per_session: 1001 is over 1000 (0 turns the limit off)"]
        );
    }
}
