//! `[cookie]`: the ticket cookie's keys and settings.

use super::{defaults, root, Checker};
use crate::config::error::LoadOptions;
use crate::config::raw::RawCookie;
use crate::config::{CookieConfig, RoomConfig, SameSite};

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
        let secure = raw.secure.unwrap_or(true);
        let same_site = match raw.same_site.as_deref() {
            None | Some("lax") => SameSite::Lax,
            Some("strict") => SameSite::Strict,
            Some("none") => SameSite::None,
            Some(other) => {
                self.fail(
                    &p.key("same_site"),
                    format!("expected \"lax\", \"strict\" or \"none\", got {other:?}"),
                );
                SameSite::Lax
            }
        };
        if same_site == SameSite::None && !secure {
            self.fail(
                &p.key("same_site"),
                "\"none\" needs cookie.secure = true: browsers drop a SameSite=None cookie that is not Secure",
            );
        }
        let partitioned = raw.partitioned.unwrap_or(false);
        if partitioned && (same_site != SameSite::None || !secure) {
            self.fail(
                &p.key("partitioned"),
                "needs cookie.same_site = \"none\" and cookie.secure = true: a partitioned cookie is for a room in another site's frame, where only a Secure SameSite=None cookie is sent",
            );
        }
        let domain = raw
            .domain
            .map(|d| d.trim_start_matches('.').to_ascii_lowercase());
        if let Some(d) = &domain {
            let valid = !d.is_empty()
                && d.parse::<std::net::IpAddr>().is_err()
                && d.split('.').all(|label| {
                    !label.is_empty()
                        && label.len() <= 63
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                        && !label.starts_with('-')
                        && !label.ends_with('-')
                });
            if !valid {
                self.fail(
                    &p.key("domain"),
                    format!("{d:?} is not a host name such as \"shop.example\" (no port, no IP address)"),
                );
            }
        }
        CookieConfig {
            keys,
            secure,
            bind_to_client: raw.bind_to_client.unwrap_or(false),
            max_networks_per_session,
            same_site,
            partitioned,
            domain,
        }
    }

    /// `cookie.domain` must cover the host of every room: the room's
    /// ticket is set by a response from that host.
    pub(super) fn cookie_domain_covers(&mut self, cookie: &CookieConfig, rooms: &[RoomConfig]) {
        let Some(domain) = &cookie.domain else { return };
        for room in rooms {
            let covered = room.host.as_deref().is_some_and(|host| {
                host == domain
                    || host
                        .strip_suffix(domain.as_str())
                        .is_some_and(|rest| rest.ends_with('.'))
            });
            if !covered {
                let why = match &room.host {
                    Some(host) => format!(
                        "{domain:?} does not cover room {:?}'s host {host:?}: its ticket would be refused by browsers",
                        room.id
                    ),
                    None => format!(
                        "room {:?} has no host (it matches any); with a cookie domain every room needs a host under {domain:?}",
                        room.id
                    ),
                };
                self.fail(&root().key("cookie").key("domain"), why);
            }
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

    /// A config whose `[cookie]` has `keys` and whose room has `room`
    /// (the minimal `[cookie]` is empty, so `with` writes none).
    fn cookie_and_room(keys: &str, room: &str) -> Vec<String> {
        let config = with("room", room);
        assert!(!config.contains("[cookie]"));
        refusals(&format!("{config}\n[cookie]\n{keys}\n"))
    }

    #[test]
    fn same_site_partitioned_and_domain_are_checked() {
        let ok: Vec<String> = Vec::new();
        assert_eq!(refusals(&with("cookie", "same_site = \"strict\"")), ok);
        assert_eq!(
            refusals(&with("cookie", "same_site = \"none\"\npartitioned = true")),
            ok
        );
        assert_eq!(
            refusals(&with("cookie", "same_site = \"sometimes\"")),
            ["cookie.same_site: expected \"lax\", \"strict\" or \"none\", got \"sometimes\""]
        );
        assert_eq!(
            refusals(&with("cookie", "same_site = \"none\"\nsecure = false")),
            ["cookie.same_site: \"none\" needs cookie.secure = true: browsers drop a SameSite=None cookie that is not Secure"]
        );
        let partitioned = refusals(&with("cookie", "partitioned = true"));
        assert_eq!(partitioned.len(), 1);
        assert!(partitioned[0].starts_with("cookie.partitioned: needs cookie.same_site = \"none\""));
        // A domain covers each room's host, itself or a parent.
        for host in [
            "shop.example",
            "www.shop.example",
            "checkout.eu.shop.example",
        ] {
            let got = cookie_and_room("domain = \".Shop.example\"", &format!("host = \"{host}\""));
            assert_eq!(got, ok, "{host}");
        }
        assert_eq!(
            cookie_and_room("domain = \"shop.example\"", "host = \"myshop.example\""),
            ["cookie.domain: \"shop.example\" does not cover room \"shop\"'s host \"myshop.example\": its ticket would be refused by browsers"]
        );
        assert_eq!(
            cookie_and_room("domain = \"shop.example\"", ""),
            ["cookie.domain: room \"shop\" has no host (it matches any); with a cookie domain every room needs a host under \"shop.example\""]
        );
        for bad in [
            "127.0.0.1",
            "shop.example:8080",
            "shop..example",
            "-shop.example",
            "",
        ] {
            let got = cookie_and_room(&format!("domain = \"{bad}\""), "host = \"shop.example\"");
            assert!(
                got.iter().any(|p| p.contains("is not a host name")),
                "{bad}: {got:?}"
            );
        }
    }
}
