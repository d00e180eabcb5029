//! `[tls]`: the TLS listener and its certificates.

use std::path::PathBuf;

use super::values::check_host;
use super::{defaults, root, Checker};
use crate::config::raw::RawTls;
use crate::config::{ServerConfig, TlsCert, TlsConfig};

impl Checker<'_, '_> {
    /// `[tls]`: every certificate is read and checked here, so `waitroom
    /// check` and a reload refuse what the listener could not serve.
    pub(super) fn tls(&mut self, raw: RawTls, server: &ServerConfig) -> Option<TlsConfig> {
        let p = root().key("tls");
        let listen = self.socket_addr(&p.key("listen"), raw.listen, defaults::TLS_LISTEN);
        for (other, addr) in [
            ("server.listen", server.listen),
            ("server.admin_listen", server.admin_listen),
        ] {
            if listen == addr && listen.port() != 0 {
                self.fail(
                    &p.key("listen"),
                    format!("{listen} is also {other}; the TLS listener needs its own address"),
                );
            }
        }
        let redirect_http = raw.redirect_http.unwrap_or(false);
        if raw.cert.is_empty() {
            self.fail(
                &p.key("cert"),
                "at least one certificate is required: add [[tls.cert]] with cert and key (PEM files)",
            );
            if redirect_http {
                self.fail(
                    &p.key("redirect_http"),
                    "sends plain HTTP to the TLS listener, which has no certificate; add [[tls.cert]]",
                );
            }
            return None;
        }
        let mut certs = Vec::with_capacity(raw.cert.len());
        let mut seen: Vec<(String, usize)> = Vec::new();
        let mut ok = true;
        for (i, c) in raw.cert.into_iter().enumerate() {
            let cp = p.key("cert").index(i);
            if c.hosts.is_empty() && i > 0 {
                self.fail(
                    &cp.key("hosts"),
                    "must list the host names this certificate is for; only the first certificate (the default) may leave hosts out",
                );
            }
            let mut hosts = Vec::with_capacity(c.hosts.len());
            for (j, host) in c.hosts.iter().enumerate() {
                let here = cp.key("hosts").index(j);
                let (wild, bare) = match host.strip_prefix("*.") {
                    Some(rest) => ("*.", rest),
                    None => ("", host.as_str()),
                };
                let host = match check_host(bare) {
                    Ok(h) if !h.starts_with('[') => format!("{wild}{h}"),
                    Ok(_) => {
                        self.fail(
                            &here,
                            format!("{host:?} is an IPv6 address; SNI carries host names only"),
                        );
                        continue;
                    }
                    Err(why) => {
                        let why = if bare.contains('*') {
                            "may hold * only as a whole first label, as in \"*.example.com\""
                        } else {
                            why
                        };
                        self.fail(&here, format!("{host:?} {why}"));
                        continue;
                    }
                };
                if let Some((_, k)) = seen.iter().find(|(h, _)| *h == host) {
                    self.fail(
                        &here,
                        format!("duplicate host {host:?}; tls.cert[{k}].hosts lists it too"),
                    );
                    continue;
                }
                seen.push((host.clone(), i));
                hosts.push(host);
            }
            let mut path = |key: &str, text: String| {
                if text.trim().is_empty() {
                    self.fail(&cp.key(key), "must be a file path (PEM)");
                    None
                } else {
                    Some(PathBuf::from(text))
                }
            };
            let (Some(cert), Some(key)) = (path("cert", c.cert), path("key", c.key)) else {
                ok = false;
                continue;
            };
            match crate::tls::load_certified_key(&cert, &key) {
                Ok(certified) => certs.push(TlsCert {
                    hosts,
                    cert,
                    key,
                    certified: std::sync::Arc::new(certified),
                }),
                Err(e) => {
                    let which = if e.is_key() { "key" } else { "cert" };
                    self.fail(&cp.key(which), e.to_string());
                    ok = false;
                }
            }
        }
        ok.then_some(TlsConfig {
            listen,
            redirect_http,
            certs,
        })
    }
}
