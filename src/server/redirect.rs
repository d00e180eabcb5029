//! `tls.redirect_http`: the plain listener sends every visitor to the same
//! URL on https with a 308 (method and body kept), except the daemon's
//! health check, which load balancers often probe over plain HTTP. Only
//! hosts the daemon serves (a certificate's names, a room's host) are
//! redirected to: any other Host gets 400, so the redirect never sends a
//! visitor to a name an attacker wrote.

use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};

use crate::body::Body;
use crate::canonical::Canonical;
use crate::queue_page::Msg;
use crate::respond;

/// Where plain HTTP is sent.
pub(crate) struct Redirect {
    /// The TLS listener's port, left out of the URL when it is 443.
    port: u16,
    /// Answered by the gate, not redirected.
    health_path: Arc<str>,
    /// The hosts redirected to: canonical names, or `*.example.com` for
    /// any name below `example.com`.
    hosts: Vec<String>,
}

impl Redirect {
    pub(crate) fn new(port: u16, health_path: Arc<str>, hosts: Vec<String>) -> Self {
        Self {
            port,
            health_path,
            hosts,
        }
    }

    /// Whether `host` (canonical) is one the daemon serves.
    fn serves(&self, host: &str) -> bool {
        self.hosts.iter().any(|h| match h.strip_prefix("*.") {
            Some(domain) => host
                .strip_suffix(domain)
                .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
            None => h == host,
        })
    }

    /// The redirect for `req`, or `None` for the health check (which the
    /// gate answers). The URL is built from the canonical host and path,
    /// so a malformed Host or path gets the gate's 400, not a Location
    /// made of it.
    pub(crate) fn answer<B>(&self, req: &Request<B>) -> Option<Response<Body>> {
        let chosen = crate::i18n::Language::Auto.choose(req.headers());
        let canonical = match Canonical::of(req) {
            Ok(c) => c,
            Err(_) => return Some(respond::bad_request(Msg::BadAddress, chosen)),
        };
        if canonical.path() == &*self.health_path {
            return None;
        }
        if !self.serves(canonical.host()) {
            return Some(respond::bad_request(Msg::BadHost, chosen));
        }
        Some(self.to_https(&canonical, chosen))
    }

    fn to_https(&self, canonical: &Canonical, chosen: crate::i18n::Chosen) -> Response<Body> {
        let location = match self.port {
            443 => format!("https://{}{}", canonical.host(), canonical.target),
            port => format!("https://{}:{port}{}", canonical.host(), canonical.target),
        };
        let Ok(location) = HeaderValue::from_str(&location) else {
            return respond::bad_request(Msg::BadHost, chosen);
        };
        let mut resp = respond::text(StatusCode::PERMANENT_REDIRECT, "");
        resp.headers_mut().insert(header::LOCATION, location);
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redirect(port: u16) -> Redirect {
        let hosts = ["shop.example", "[::1]", "*.cdn.example"];
        let hosts = hosts.iter().map(|h| h.to_string()).collect();
        Redirect::new(port, Arc::from("/__waitroom/health"), hosts)
    }

    fn location(port: u16, host: &str, target: &str) -> Option<String> {
        let redirect = redirect(port);
        let req = Request::get(target).header("host", host).body(()).unwrap();
        let resp = redirect.answer(&req)?;
        assert_eq!(resp.status(), StatusCode::PERMANENT_REDIRECT);
        Some(
            resp.headers()[header::LOCATION]
                .to_str()
                .unwrap()
                .to_owned(),
        )
    }

    #[test]
    fn redirects_to_the_same_url_on_https() {
        assert_eq!(
            location(443, "Shop.Example:8080", "/a/b?x=1&y").as_deref(),
            Some("https://shop.example/a/b?x=1&y")
        );
        assert_eq!(
            location(8443, "shop.example", "/").as_deref(),
            Some("https://shop.example:8443/")
        );
        assert_eq!(
            location(8443, "[::1]:80", "//a/./b").as_deref(),
            Some("https://[::1]:8443/a/b")
        );
        assert_eq!(location(443, "shop.example", "/__waitroom/health"), None);
    }

    #[test]
    fn only_served_hosts_are_redirected_to() {
        assert_eq!(
            location(443, "a.cdn.example", "/x").as_deref(),
            Some("https://a.cdn.example/x")
        );
        let redirect = redirect(443);
        for host in [
            "evil.example",
            "shop.example.evil.example",
            "cdn.example",
            "xcdn.example",
            "127.0.0.1",
        ] {
            let req = Request::get("/").header("host", host).body(()).unwrap();
            let resp = redirect.answer(&req).unwrap();
            assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{host:?}");
            assert!(resp.headers().get(header::LOCATION).is_none());
        }
    }

    #[test]
    fn a_bad_host_is_refused_not_echoed() {
        let redirect = redirect(443);
        for host in ["evil.example/x", "a b", ""] {
            let req = Request::get("/").header("host", host).body(()).unwrap();
            let resp = redirect.answer(&req).unwrap();
            assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{host:?}");
            assert!(resp.headers().get(header::LOCATION).is_none());
        }
    }
}
