//! Where the Redis store is (`backend = "redis"`): `store.url` (one
//! server, or a Cluster's nodes) or `store.sentinels` and the master's
//! name, and `store.tls_ca` for `rediss://`. Every Redis URL is checked
//! here, the region's global one too.

use std::path::PathBuf;

use super::Checker;
use crate::config::keypath::KeyPath;
use crate::config::raw::RawUrls;
use crate::config::{Backend, SentinelConfig};

impl Checker<'_, '_> {
    /// `store.sentinels`: `host:port` (or `redis://`/`rediss://` URLs of
    /// the Sentinels), with `store.sentinel_master`.
    pub(super) fn sentinels(
        &mut self,
        p: &KeyPath,
        raw: Vec<String>,
        master: Option<String>,
        password: Option<String>,
        sentinel_password: Option<&str>,
    ) -> Backend {
        let path = p.key("sentinels");
        if raw.is_empty() {
            self.fail(&path, "must list at least one Sentinel (\"host:port\")");
        }
        let mut sentinels = Vec::with_capacity(raw.len());
        for (i, entry) in raw.into_iter().enumerate() {
            let url = if entry.contains("://") {
                entry.clone()
            } else {
                format!("redis://{entry}")
            };
            match check_redis_url(&url, sentinel_password, "store.sentinel_password_env") {
                Ok(url) if redis::parse_redis_url(&url).is_some_and(|u| u.port().is_some()) => {
                    sentinels.push(url)
                }
                Ok(_) => self.fail(
                    &path.index(i),
                    format!(
                        "{} needs a port (Sentinels listen on 26379 by default)",
                        redact_url(&entry)
                    ),
                ),
                Err(why) => self.fail(&path.index(i), format!("{} {why}", redact_url(&entry))),
            }
        }
        let tls = sentinels
            .iter()
            .filter(|u| u.starts_with("rediss://"))
            .count();
        if tls != 0 && tls != sentinels.len() {
            self.fail(
                &path,
                "mixes redis:// and rediss:// Sentinels; use TLS with all or none",
            );
        }
        let master = match master {
            Some(m) if !m.trim().is_empty() && !m.contains(char::is_whitespace) => m,
            Some(m) => {
                self.fail(
                    &p.key("sentinel_master"),
                    format!("{m:?} is not a master name (one word, as in the Sentinels' `sentinel monitor`)"),
                );
                String::new()
            }
            None => {
                self.fail(
                    &p.key("sentinel_master"),
                    "is required with store.sentinels: the name the Sentinels monitor the primary by",
                );
                String::new()
            }
        };
        Backend::Sentinel(SentinelConfig {
            sentinels,
            master,
            password,
            tls: tls > 0,
        })
    }

    /// `store.tls_ca`: a PEM bundle of the CAs `rediss://` servers are
    /// checked against, read here so a bad file is a config problem.
    pub(super) fn tls_ca(
        &mut self,
        path: &KeyPath,
        text: String,
        backend: &Backend,
    ) -> Option<PathBuf> {
        let uses_tls = backend.uses_tls();
        if !uses_tls {
            self.fail(path, "is only used with rediss:// URLs (Redis over TLS)");
            return None;
        }
        let ca = PathBuf::from(text);
        match crate::tls::load_certs(&ca) {
            Ok(_) => Some(ca),
            Err(e) => {
                self.fail(path, e.to_string());
                None
            }
        }
    }

    pub(super) fn redis_urls(
        &mut self,
        path: &KeyPath,
        raw: Option<RawUrls>,
        password: Option<&str>,
    ) -> Vec<String> {
        let Some(raw) = raw else {
            self.fail(
                path,
                r#"is required when backend = "redis" (e.g. "redis://127.0.0.1:6379/")"#,
            );
            return Vec::new();
        };
        if raw.urls.is_empty() {
            self.fail(path, "must list at least one redis:// URL");
        }
        let mut urls = Vec::with_capacity(raw.urls.len());
        for (i, url) in raw.urls.into_iter().enumerate() {
            let here = if raw.is_list {
                path.index(i)
            } else {
                path.clone()
            };
            match check_redis_url(&url, password, "store.password_env") {
                Ok(url) => urls.push(url),
                Err(why) => self.fail(&here, format!("{} {why}", redact_url(&url))),
            }
        }
        // A cluster client speaks TLS to every node or to none.
        let tls = urls.iter().filter(|u| u.starts_with("rediss://")).count();
        if tls != 0 && tls != urls.len() {
            self.fail(
                path,
                "mixes redis:// and rediss:// nodes; a Redis Cluster uses TLS on every node or on none",
            );
        }
        urls
    }
}

/// Checks one Redis URL and splices in the password from the environment
/// (read from the key `password_key` names, for the message).
pub(super) fn check_redis_url(
    text: &str,
    password: Option<&str>,
    password_key: &str,
) -> Result<String, String> {
    use redis::IntoConnectionInfo as _;
    if !text.starts_with("redis://") && !text.starts_with("rediss://") {
        return Err("must start with redis:// or rediss://".to_owned());
    }
    // `rediss://…#insecure` would turn certificate checks off; the way to
    // trust a private CA is store.tls_ca.
    if text.starts_with("rediss://") && text.contains("#insecure") {
        return Err(
            "turns off certificate checks (#insecure), which waitroom does not allow; trust the server's CA with store.tls_ca instead".to_owned(),
        );
    }
    if let Err(e) = text.into_connection_info() {
        let why = e.to_string();
        // RedisError's text ends in " - <kind>", which tells an operator nothing.
        let why = why.rsplit_once(" - ").map_or(why.as_str(), |(w, _)| w);
        return Err(format!("is not a usable Redis URL: {why}"));
    }
    let Some(password) = password else {
        return Ok(text.to_owned());
    };
    let mut url =
        redis::parse_redis_url(text).ok_or_else(|| "is not a usable Redis URL".to_owned())?;
    if url.password().is_some() {
        return Err(format!(
            "already has a password, and {password_key} is set too; use one"
        ));
    }
    url.set_password(Some(password))
        .map_err(|()| "cannot hold a password".to_owned())?;
    Ok(url.to_string())
}

/// Shows a Redis URL in a message without any password it carries.
pub(super) fn redact_url(text: &str) -> String {
    match redis::parse_redis_url(text) {
        Some(mut url) if url.password().is_some() => {
            if url.set_password(Some("REDACTED")).is_ok() {
                format!("{:?}", url.as_str())
            } else {
                "the URL".to_owned()
            }
        }
        Some(_) => format!("{text:?}"),
        None if text.contains('@') => "the URL".to_owned(),
        None => format!("{text:?}"),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::check::tests::{refusals, refusals_with, with};

    /// A Sentinel store with `sentinels` and `keys` besides.
    fn sentinels(list: &str, keys: &str) -> String {
        with(
            "store",
            &format!("backend = \"redis\"\nsentinels = {list}\n{keys}"),
        )
    }

    #[test]
    fn sentinels_are_listed_with_ports_and_one_scheme() {
        let master = "sentinel_master = \"mymaster\"";
        for (list, refusal) in [
            (
                "[]",
                r#"store.sentinels: must list at least one Sentinel ("host:port")"#,
            ),
            (
                "[\"10.0.0.1\"]",
                r#"store.sentinels[0]: "10.0.0.1" needs a port (Sentinels listen on 26379 by default)"#,
            ),
            (
                "[\"http://10.0.0.1:26379\"]",
                r#"store.sentinels[0]: "http://10.0.0.1:26379" must start with redis:// or rediss://"#,
            ),
            (
                "[\"redis://10.0.0.1:26379\", \"rediss://10.0.0.2:26379\"]",
                "store.sentinels: mixes redis:// and rediss:// Sentinels; use TLS with all or none",
            ),
        ] {
            assert_eq!(refusals(&sentinels(list, master)), [refusal], "{list}");
        }
    }

    #[test]
    fn sentinels_need_the_master_name() {
        let list = "[\"10.0.0.1:26379\"]";
        assert_eq!(
            refusals(&sentinels(list, "")),
            ["store.sentinel_master: is required with store.sentinels: the name the Sentinels monitor the primary by"]
        );
        assert_eq!(
            refusals(&sentinels(list, "sentinel_master = \"my master\"")),
            ["store.sentinel_master: \"my master\" is not a master name (one word, as in the Sentinels' `sentinel monitor`)"]
        );
    }

    #[test]
    fn the_sentinel_password_variable_is_set() {
        let master = "sentinel_master = \"mymaster\"\nsentinel_password_env = \"SP\"";
        assert_eq!(
            refusals(&sentinels("[\"10.0.0.1:26379\"]", master)),
            ["store.sentinel_password_env: environment variable SP is not set"]
        );
    }

    #[test]
    fn a_sentinel_with_a_password_takes_none_from_the_environment() {
        let src = sentinels(
            "[\"redis://:pw@10.0.0.1:26379\"]",
            "sentinel_master = \"mymaster\"\nsentinel_password_env = \"SP\"",
        );
        assert_eq!(
            refusals_with(&src, &[("SP", "secret")]),
            [
                r#"store.sentinels[0]: "redis://:REDACTED@10.0.0.1:26379" already has a password, and store.sentinel_password_env is set too; use one"#
            ]
        );
    }

    #[test]
    fn a_ca_bundle_is_for_rediss_and_holds_certificates() {
        let only = "store.tls_ca: is only used with rediss:// URLs (Redis over TLS)";
        assert_eq!(refusals(&with("store", "tls_ca = \"ca.pem\"")), [only]);
        let plain = "backend = \"redis\"\nurl = \"redis://10.0.0.1:6379\"\ntls_ca = \"ca.pem\"";
        assert_eq!(refusals(&with("store", plain)), [only]);
        let not_pem = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
        let src = with(
            "store",
            &format!("backend = \"redis\"\nurl = \"rediss://10.0.0.1:6380\"\ntls_ca = {not_pem:?}"),
        );
        assert_eq!(
            refusals(&src),
            [format!("store.tls_ca: {not_pem} holds no certificate (a PEM block -----BEGIN CERTIFICATE-----)")]
        );
    }

    #[test]
    fn redis_needs_urls_of_one_scheme() {
        let store = |url: &str| refusals(&with("store", &format!("backend = \"redis\"\n{url}")));
        assert_eq!(
            store(""),
            [r#"store.url: is required when backend = "redis" (e.g. "redis://127.0.0.1:6379/")"#]
        );
        assert_eq!(
            store("url = []"),
            ["store.url: must list at least one redis:// URL"]
        );
        assert_eq!(
            store("url = \"http://10.0.0.1:6379\""),
            [r#"store.url: "http://10.0.0.1:6379" must start with redis:// or rediss://"#]
        );
        // In a list, the problem is the element's.
        assert_eq!(
            store("url = [\"redis://10.0.0.1:6379\", \"http://10.0.0.2:6379\"]"),
            [r#"store.url[1]: "http://10.0.0.2:6379" must start with redis:// or rediss://"#]
        );
        assert_eq!(
            store("url = [\"redis://10.0.0.1:6379\", \"rediss://10.0.0.2:6380\"]"),
            ["store.url: mixes redis:// and rediss:// nodes; a Redis Cluster uses TLS on every node or on none"]
        );
    }

    #[test]
    fn a_redis_url_is_usable_and_checks_certificates() {
        let store = |url: &str| {
            refusals(&with(
                "store",
                &format!("backend = \"redis\"\nurl = {url:?}"),
            ))
        };
        assert_eq!(
            store("rediss://10.0.0.1:6380/#insecure"),
            [
                r#"store.url: "rediss://10.0.0.1:6380/#insecure" turns off certificate checks (#insecure), which waitroom does not allow; trust the server's CA with store.tls_ca instead"#
            ]
        );
        assert_eq!(
            store("redis://10.0.0.1:6379/db"),
            [
                r#"store.url: "redis://10.0.0.1:6379/db" is not a usable Redis URL: Invalid database number"#
            ]
        );
    }

    #[test]
    fn a_url_with_a_password_takes_none_from_the_environment() {
        let src = with(
            "store",
            "backend = \"redis\"\nurl = \"redis://:pw@10.0.0.1:6379\"\npassword_env = \"RP\"",
        );
        assert_eq!(
            refusals_with(&src, &[("RP", "secret")]),
            [
                r#"store.url: "redis://:REDACTED@10.0.0.1:6379" already has a password, and store.password_env is set too; use one"#
            ]
        );
    }

    #[test]
    fn messages_never_show_a_password() {
        assert_eq!(
            refusals(&with(
                "store",
                "backend = \"redis\"\nurl = \"http://user:secret@10.0.0.1\""
            )),
            ["store.url: the URL must start with redis:// or rediss://"]
        );
    }
}
