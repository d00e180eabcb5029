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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::check::tests::{refusals, with};

    /// A self-signed certificate and its key, as PEM files `<name>.pem`
    /// and `<name>.key` in `dir`.
    fn pem_files(dir: &Path, name: &str) {
        let made = rcgen::generate_simple_self_signed(vec!["a.example".to_owned()]).unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), made.cert.pem()).unwrap();
        std::fs::write(
            dir.join(format!("{name}.key")),
            made.key_pair.serialize_pem(),
        )
        .unwrap();
    }

    /// The minimal configuration with `tls` (the `[tls]` table and what
    /// follows it); `{dir}` in it stands for a directory that holds the
    /// certificate `a` (`a.pem`, `a.key`) and `b`.
    fn refusals_of(tls: &str) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        pem_files(dir.path(), "a");
        pem_files(dir.path(), "b");
        let tls = tls.replace("{dir}", &dir.path().display().to_string());
        refusals(&format!("{}{tls}", with("room", "")))
            .into_iter()
            .map(|r| r.replace(&dir.path().display().to_string(), "{dir}"))
            .collect()
    }

    const CERT_A: &str = "[[tls.cert]]\ncert = '{dir}/a.pem'\nkey = '{dir}/a.key'\n";

    #[test]
    fn a_valid_section_is_accepted() {
        let hosts = "hosts = [\"*.example.com\", \"Shop.Example.\"]\n";
        assert!(refusals_of(&format!("[tls]\nredirect_http = true\n{CERT_A}{hosts}")).is_empty());
    }

    #[test]
    fn the_tls_listener_has_its_own_address() {
        for (listen, other) in [
            ("0.0.0.0:8080", "server.listen"),
            ("127.0.0.1:9090", "server.admin_listen"),
        ] {
            assert_eq!(
                refusals_of(&format!("[tls]\nlisten = {listen:?}\n{CERT_A}")),
                [format!(
                    "tls.listen: {listen} is also {other}; the TLS listener needs its own address"
                )]
            );
        }
    }

    #[test]
    fn at_least_one_certificate_is_required() {
        let none = "tls.cert: at least one certificate is required: add [[tls.cert]] with cert and key (PEM files)";
        assert_eq!(refusals_of("[tls]\n"), [none]);
        assert_eq!(
            refusals_of("[tls]\nredirect_http = true\n"),
            [
                none,
                "tls.redirect_http: sends plain HTTP to the TLS listener, which has no certificate; add [[tls.cert]]"
            ]
        );
    }

    #[test]
    fn only_the_first_certificate_may_leave_hosts_out() {
        let second = "[[tls.cert]]\ncert = '{dir}/b.pem'\nkey = '{dir}/b.key'\n";
        assert_eq!(
            refusals_of(&format!("[tls]\n{CERT_A}{second}")),
            ["tls.cert[1].hosts: must list the host names this certificate is for; only the first certificate (the default) may leave hosts out"]
        );
    }

    #[test]
    fn hosts_are_host_names_or_wildcards() {
        let wildcard = r#"may hold * only as a whole first label, as in "*.example.com""#;
        for (host, why) in [
            ("[::1]", "is an IPv6 address; SNI carries host names only"),
            ("a.*.example", wildcard),
            ("*", wildcard),
            // The host checks are the rooms' (`check_host`), and so is their
            // wording: "leave host out", "rooms match".
            ("", "must not be empty; leave host out to match any host"),
            ("*.", "must not be empty; leave host out to match any host"),
            (
                "shop.example:443",
                "must not contain a port; rooms match the Host header without its port",
            ),
            (
                "https://shop.example",
                r#"must be a bare host name without a scheme, such as "shop.example.com""#,
            ),
            (
                "shop example",
                "is not a valid host name (letters, digits, - and _ in dot-separated labels)",
            ),
        ] {
            assert_eq!(
                refusals_of(&format!("[tls]\n{CERT_A}hosts = [{host:?}]\n")),
                [format!("tls.cert[0].hosts[0]: {host:?} {why}")]
            );
        }
    }

    #[test]
    fn a_host_is_named_once() {
        let second = "[[tls.cert]]\ncert = '{dir}/b.pem'\nkey = '{dir}/b.key'\n";
        assert_eq!(
            refusals_of(&format!(
                "[tls]\n{CERT_A}hosts = [\"a.example\"]\n{second}hosts = [\"A.Example.\"]\n"
            )),
            [r#"tls.cert[1].hosts[0]: duplicate host "a.example"; tls.cert[0].hosts lists it too"#]
        );
    }

    #[test]
    fn cert_and_key_are_usable_pem_files() {
        assert_eq!(
            refusals_of("[tls]\n[[tls.cert]]\ncert = ' '\nkey = ''\n"),
            [
                "tls.cert[0].cert: must be a file path (PEM)",
                "tls.cert[0].key: must be a file path (PEM)"
            ]
        );
        // A problem of the certificate file is the cert's, of the key file the key's.
        assert_eq!(
            refusals_of("[tls]\n[[tls.cert]]\ncert = '{dir}/a.key'\nkey = '{dir}/a.key'\n"),
            ["tls.cert[0].cert: {dir}/a.key holds no certificate (a PEM block -----BEGIN CERTIFICATE-----)"]
        );
        assert_eq!(
            refusals_of("[tls]\n[[tls.cert]]\ncert = '{dir}/a.pem'\nkey = '{dir}/b.key'\n"),
            ["tls.cert[0].key: {dir}/b.key does not match the certificate in {dir}/a.pem"]
        );
    }
}
