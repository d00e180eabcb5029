//! TLS termination (docs/operating.md, "TLS"): certificates read from PEM
//! files and checked (a chain, a key, the key matching the chain's leaf),
//! chosen per handshake by SNI, swapped in on reload for new handshakes
//! only; and the rustls server configuration the TLS listener accepts with
//! (ALPN `h2` and `http/1.1`, the ring provider).
//!
//! Not supported: client certificates, OCSP stapling, 0-RTT.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// `[tls]`: the TLS listener and its certificates (docs/operating.md, "TLS").
#[derive(Clone, Debug)]
pub struct TlsConfig {
    /// Where TLS connections are accepted.
    pub listen: SocketAddr,
    /// Answer every plain-HTTP request (but the health check) with a 308
    /// to the same URL on https.
    pub redirect_http: bool,
    /// At least one; the first is the default (no SNI, or an SNI name no
    /// certificate lists).
    pub certs: Vec<TlsCert>,
}

/// One `[[tls.cert]]`: a chain and key, read and checked at load.
#[derive(Clone, Debug)]
pub struct TlsCert {
    /// Lower-case host names (or `*.example.com`) whose SNI selects it.
    pub hosts: Vec<String>,
    /// The PEM chain file, leaf first.
    pub cert: PathBuf,
    /// The PEM private key file.
    pub key: PathBuf,
    /// The chain and key as loaded.
    pub certified: Arc<rustls::sign::CertifiedKey>,
}

/// The ALPN id of HTTP/2, the server's first choice.
pub const ALPN_H2: &[u8] = b"h2";
/// The ALPN id of HTTP/1.1, its second.
pub(crate) const ALPN_HTTP1: &[u8] = b"http/1.1";

/// The one crypto provider: ring (builds without a C toolchain beyond cc,
/// unlike aws-lc-rs).
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// Makes ring the process-wide default provider, for libraries that build
/// their rustls configs with the default (the Redis client, for `rediss://`).
/// Harmless when one is installed already.
pub fn install_default_provider() {
    if CryptoProvider::get_default().is_none() {
        let _ = CryptoProvider::install_default((*provider()).clone());
    }
}

/// Why a certificate or key file cannot be used; [`CertError::is_key`]
/// tells which of the two keys (`cert` or `key`) the problem belongs to.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CertError {
    #[error("cannot read {}: {source}", .path.display())]
    ReadCert {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not valid PEM: {why}", .path.display())]
    BadCertPem { path: PathBuf, why: String },
    #[error("{} holds no certificate (a PEM block -----BEGIN CERTIFICATE-----)", .path.display())]
    NoCertificate { path: PathBuf },
    #[error("{}: the first certificate cannot be parsed: {why}", .path.display())]
    BadCertificate { path: PathBuf, why: String },
    #[error("cannot read {}: {source}", .path.display())]
    ReadKey {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} holds no private key (a PEM block -----BEGIN PRIVATE KEY-----, RSA PRIVATE KEY or EC PRIVATE KEY)", .path.display())]
    NoKey { path: PathBuf },
    #[error("{}: the private key cannot be used: {why}", .path.display())]
    BadKey { path: PathBuf, why: String },
    #[error("{} does not match the certificate in {}", .key.display(), .cert.display())]
    Mismatch { key: PathBuf, cert: PathBuf },
}

impl CertError {
    /// Whether the problem lies in the key file (else in the certificate file).
    pub(crate) fn is_key(&self) -> bool {
        matches!(
            self,
            CertError::ReadKey { .. }
                | CertError::NoKey { .. }
                | CertError::BadKey { .. }
                | CertError::Mismatch { .. }
        )
    }
}

fn read(path: &Path, is_key: bool) -> Result<Vec<u8>, CertError> {
    std::fs::read(path).map_err(|source| {
        let path = path.to_owned();
        if is_key {
            CertError::ReadKey { path, source }
        } else {
            CertError::ReadCert { path, source }
        }
    })
}

/// The certificates of a PEM file (a chain, leaf first; or a CA bundle).
pub(crate) fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let pem = read(path, false)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CertError::BadCertPem {
            path: path.to_owned(),
            why: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(CertError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// Reads a PEM chain and its key and checks that they belong together.
pub(crate) fn load_certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, CertError> {
    let chain = load_certs(cert)?;
    let key_pem = read(key, true)?;
    let der = match PrivateKeyDer::from_pem_slice(&key_pem) {
        Ok(der) => der,
        Err(rustls_pki_types::pem::Error::NoItemsFound) => {
            return Err(CertError::NoKey {
                path: key.to_owned(),
            })
        }
        Err(e) => {
            return Err(CertError::BadKey {
                path: key.to_owned(),
                why: e.to_string(),
            })
        }
    };
    let signing = provider()
        .key_provider
        .load_private_key(der)
        .map_err(|e| CertError::BadKey {
            path: key.to_owned(),
            why: e.to_string(),
        })?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        Ok(()) => Ok(certified),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(CertError::Mismatch {
                key: key.to_owned(),
                cert: cert.to_owned(),
            })
        }
        // ring can always tell a key's public half; anything else is a
        // certificate rustls cannot parse.
        Err(e) => Err(CertError::BadCertificate {
            path: cert.to_owned(),
            why: e.to_string(),
        }),
    }
}

/// Which certificate each SNI name gets.
#[derive(Debug)]
pub struct CertMap {
    /// For handshakes without SNI or with a name no certificate lists.
    default: Arc<CertifiedKey>,
    /// Exact host names (lower case, no trailing dot).
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// `*.example.com` as `example.com`: one label in front of it.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
}

impl CertMap {
    /// The map of a validated `[tls]` section (the first certificate is the
    /// default; hosts are unique, lower case).
    pub fn new(config: &TlsConfig) -> Self {
        let mut exact = HashMap::new();
        let mut wildcard = HashMap::new();
        for cert in &config.certs {
            for host in &cert.hosts {
                match host.strip_prefix("*.") {
                    Some(parent) => wildcard.insert(parent.to_owned(), cert.certified.clone()),
                    None => exact.insert(host.clone(), cert.certified.clone()),
                };
            }
        }
        Self {
            default: config.certs[0].certified.clone(),
            exact,
            wildcard,
        }
    }

    /// The certificate for `sni`: an exact name, else a wildcard one label
    /// up, else the default.
    pub fn pick(&self, sni: Option<&str>) -> &Arc<CertifiedKey> {
        let Some(name) = sni else {
            return &self.default;
        };
        let name = name.strip_suffix('.').unwrap_or(name);
        let lower;
        let name = if name.bytes().any(|b| b.is_ascii_uppercase()) {
            lower = name.to_ascii_lowercase();
            lower.as_str()
        } else {
            name
        };
        if let Some(key) = self.exact.get(name) {
            return key;
        }
        if let Some((_, parent)) = name.split_once('.') {
            if let Some(key) = self.wildcard.get(parent) {
                return key;
            }
        }
        &self.default
    }
}

/// Chooses the certificate for each handshake from the map in force;
/// `SniResolver::replace` installs another for handshakes from then on
/// (connections already open keep theirs).
#[derive(Debug)]
pub struct SniResolver {
    map: ArcSwap<CertMap>,
}

impl SniResolver {
    pub(crate) fn new(map: CertMap) -> Self {
        Self {
            map: ArcSwap::from_pointee(map),
        }
    }

    pub(crate) fn replace(&self, map: CertMap) {
        self.map.store(Arc::new(map));
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.map.load().pick(hello.server_name()).clone())
    }
}

/// Why the TLS listener cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// rustls refused the configuration.
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The rustls configuration of the TLS listener: certificates from
/// `resolver`, ALPN `h2` then `http/1.1`, TLS 1.2 and 1.3, stateless
/// session tickets so returning clients resume without a full handshake.
pub(crate) fn server_config(
    resolver: Arc<SniResolver>,
) -> Result<Arc<rustls::ServerConfig>, SetupError> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()];
    config.ticketer = rustls::crypto::ring::Ticketer::new()?;
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> Arc<CertifiedKey> {
        #[derive(Debug)]
        struct NoKey;
        impl rustls::sign::SigningKey for NoKey {
            fn choose_scheme(
                &self,
                _: &[rustls::SignatureScheme],
            ) -> Option<Box<dyn rustls::sign::Signer>> {
                None
            }
            fn algorithm(&self) -> rustls::SignatureAlgorithm {
                rustls::SignatureAlgorithm::ECDSA
            }
        }
        Arc::new(CertifiedKey::new(
            vec![CertificateDer::from(vec![n])],
            Arc::new(NoKey),
        ))
    }

    fn leaf(k: &Arc<CertifiedKey>) -> u8 {
        k.cert[0].as_ref()[0]
    }

    #[test]
    fn sni_picks_exact_then_wildcard_then_default() {
        let map = CertMap {
            default: key(0),
            exact: [("shop.example.com".to_owned(), key(1))].into(),
            wildcard: [("example.com".to_owned(), key(2))].into(),
        };
        assert_eq!(leaf(map.pick(None)), 0);
        assert_eq!(leaf(map.pick(Some("other.test"))), 0);
        assert_eq!(leaf(map.pick(Some("shop.example.com"))), 1);
        assert_eq!(leaf(map.pick(Some("SHOP.Example.com."))), 1);
        assert_eq!(leaf(map.pick(Some("www.example.com"))), 2);
        // A wildcard covers one label only, and not the bare parent.
        assert_eq!(leaf(map.pick(Some("a.b.example.com"))), 0);
        assert_eq!(leaf(map.pick(Some("example.com"))), 0);
    }
}
