//! `[origin]`: where admitted requests are forwarded, and how.

use std::time::Duration;

use super::{defaults, root, Checker};
use crate::config::keypath::KeyPath;
use crate::config::raw::RawOrigin;
use crate::config::{OriginConfig, Secret};

/// Shortest `origin.sign_key_env` value: an HMAC key this short is guessable.
const MIN_SIGN_KEY_LEN: usize = 32;

impl Checker<'_, '_> {
    pub(super) fn origin(&mut self, raw: RawOrigin) -> OriginConfig {
        self.origin_at(&root().key("origin"), raw)
    }

    /// An origin's keys at `p` (`[origin]`, or a room's `[room.origin]`).
    pub(super) fn origin_at(&mut self, p: &KeyPath, raw: RawOrigin) -> OriginConfig {
        let p = p.clone();
        let url = match check_origin_url(&raw.url) {
            Ok(uri) => uri,
            Err(why) => {
                self.fail(&p.key("url"), format!("{:?} {why}", raw.url));
                http::Uri::from_static("http://127.0.0.1/")
            }
        };
        let timeout = self.duration(
            &p.key("timeout"),
            raw.timeout,
            defaults::ORIGIN_TIMEOUT,
            Duration::ZERO,
        );
        let connect_timeout = self.duration(
            &p.key("connect_timeout"),
            raw.connect_timeout,
            defaults::ORIGIN_CONNECT_TIMEOUT,
            Duration::ZERO,
        );
        let sign_key = match raw.sign_key_env {
            None => None,
            Some(name) => {
                let path = p.key("sign_key_env");
                let var = self.env_name(&path, Some(name), "");
                match var.as_ref().map(|v| (v, self.env_value(v))) {
                    Some((_, Some(value))) if value.len() >= MIN_SIGN_KEY_LEN => {
                        Some(Secret(value))
                    }
                    Some((var, Some(_))) => {
                        self.fail(
                            &path,
                            format!("the key in {var} is shorter than {MIN_SIGN_KEY_LEN} characters (make one with `waitroom keygen`)"),
                        );
                        None
                    }
                    Some((var, None)) => {
                        self.fail(
                            &path,
                            format!("environment variable {var} is not set (it must hold the signing key)"),
                        );
                        None
                    }
                    None => None,
                }
            }
        };
        let max_connections = raw
            .max_connections
            .unwrap_or(defaults::ORIGIN_MAX_CONNECTIONS);
        if !(1..=1_000_000).contains(&max_connections) {
            self.fail(
                &p.key("max_connections"),
                format!("must be between 1 and 1000000, got {max_connections}"),
            );
        }
        let https = url.scheme_str() == Some("https");
        let ca_file = raw.ca_file.map(std::path::PathBuf::from);
        if let Some(path) = &ca_file {
            if !https {
                self.fail(
                    &p.key("ca_file"),
                    "is only used with an https:// origin; remove it or make origin.url https://",
                );
            } else if let Err(e) = crate::tls::load_certs(path) {
                self.fail(&p.key("ca_file"), e.to_string());
            }
        }
        let client_cert = match (raw.client_cert_file, raw.client_key_file) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                let (cert, key) = (
                    std::path::PathBuf::from(cert),
                    std::path::PathBuf::from(key),
                );
                if !https {
                    self.fail(
                        &p.key("client_cert_file"),
                        "is only used with an https:// origin; remove it or make origin.url https://",
                    );
                } else if let Err(e) = crate::tls::load_certified_key(&cert, &key) {
                    let key_path = if e.is_key() {
                        "client_key_file"
                    } else {
                        "client_cert_file"
                    };
                    self.fail(&p.key(key_path), e.to_string());
                }
                Some((cert, key))
            }
            (Some(_), None) => {
                self.fail(
                    &p.key("client_key_file"),
                    "is required with client_cert_file",
                );
                None
            }
            (None, Some(_)) => {
                self.fail(
                    &p.key("client_cert_file"),
                    "is required with client_key_file",
                );
                None
            }
        };
        OriginConfig {
            url,
            timeout,
            connect_timeout,
            sign_key,
            max_connections: usize::try_from(max_connections.clamp(1, 1_000_000)).unwrap_or(1),
            ca_file,
            client_cert,
        }
    }
}

fn check_origin_url(text: &str) -> Result<http::Uri, &'static str> {
    let uri: http::Uri = text
        .parse()
        .map_err(|_| r#"is not a URL such as "http://127.0.0.1:3000""#)?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(r#"must start with http:// or https://, such as "http://127.0.0.1:3000""#),
    }
    let Some(authority) = uri.authority() else {
        return Err("must name a host");
    };
    if authority.host().is_empty() {
        return Err("must name a host");
    }
    if authority.as_str().contains('@') {
        return Err("must not contain a user name or password");
    }
    if uri.query().is_some() {
        return Err("must not have a query string");
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use crate::config::check::tests::{refusals, refusals_with, with};

    fn origin(keys: &str) -> Vec<String> {
        refusals(&with("origin", keys))
    }

    #[test]
    fn the_url_is_http_or_https_to_a_host() {
        let http = r#"must start with http:// or https://, such as "http://127.0.0.1:3000""#;
        for (url, why) in [
            (
                "not a url",
                r#"is not a URL such as "http://127.0.0.1:3000""#,
            ),
            ("ftp://127.0.0.1", http),
            ("127.0.0.1:3000", http),
            ("/shop", http),
            ("http://:80/", "must name a host"),
            (
                "http://user:pw@127.0.0.1:3000",
                "must not contain a user name or password",
            ),
            ("http://127.0.0.1:3000/?a=1", "must not have a query string"),
        ] {
            assert_eq!(
                origin(&format!("url = {url:?}")),
                [format!("origin.url: {url:?} {why}")]
            );
        }
    }

    #[test]
    fn timeouts_are_longer_than_0() {
        for key in ["timeout", "connect_timeout"] {
            assert_eq!(
                origin(&format!("{key} = \"0s\"")),
                [format!("origin.{key}: must be longer than 0, got \"0s\"")]
            );
        }
    }

    #[test]
    fn the_signing_key_is_set_and_long() {
        let src = with("origin", "sign_key_env = \"SIGN_KEY\"");
        assert_eq!(
            refusals(&src),
            ["origin.sign_key_env: environment variable SIGN_KEY is not set (it must hold the signing key)"]
        );
        assert_eq!(
            refusals_with(&src, &[("SIGN_KEY", &"k".repeat(31))]),
            ["origin.sign_key_env: the key in SIGN_KEY is shorter than 32 characters (make one with `waitroom keygen`)"]
        );
        assert!(refusals_with(&src, &[("SIGN_KEY", &"k".repeat(32))]).is_empty());
    }

    #[test]
    fn connections_are_between_1_and_a_million() {
        for value in [0, 1_000_001] {
            assert_eq!(
                origin(&format!("max_connections = {value}")),
                [format!(
                    "origin.max_connections: must be between 1 and 1000000, got {value}"
                )]
            );
        }
    }

    #[test]
    fn a_room_may_have_its_own_origin_checked_alike() {
        let room_origin =
            |keys: &str| refusals(&format!("{}[room.origin]\n{keys}\n", with("room", "")));
        assert_eq!(
            room_origin("url = \"https://drops.internal\""),
            Vec::<String>::new()
        );
        assert_eq!(
            room_origin("url = \"ftp://drops.internal\""),
            [
                r#"room[0].origin.url: "ftp://drops.internal" must start with http:// or https://, such as "http://127.0.0.1:3000""#
            ]
        );
        assert_eq!(
            room_origin("url = \"http://drops.internal\"\nca_file = \"/x.pem\""),
            ["room[0].origin.ca_file: is only used with an https:// origin; remove it or make origin.url https://"]
        );
    }
}
