//! `[origin]`: where admitted requests are forwarded, and how.

use std::time::Duration;

use super::{defaults, root, Checker};
use crate::config::raw::RawOrigin;
use crate::config::{OriginConfig, Secret};

/// Shortest `origin.sign_key_env` value: an HMAC key this short is guessable.
const MIN_SIGN_KEY_LEN: usize = 32;

impl Checker<'_, '_> {
    pub(super) fn origin(&mut self, raw: RawOrigin) -> OriginConfig {
        let p = root().key("origin");
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
        OriginConfig {
            url,
            timeout,
            connect_timeout,
            sign_key,
            max_connections: usize::try_from(max_connections.clamp(1, 1_000_000)).unwrap_or(1),
        }
    }
}

fn check_origin_url(text: &str) -> Result<http::Uri, &'static str> {
    let uri: http::Uri = text
        .parse()
        .map_err(|_| r#"is not a URL such as "http://127.0.0.1:3000""#)?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err("uses https, which is not supported; the origin must be http:// (terminate TLS in front of waitroom)")
        }
        _ => return Err(r#"must start with http://, such as "http://127.0.0.1:3000""#),
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
