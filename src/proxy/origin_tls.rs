//! TLS to an `https://` origin: rustls (the ring provider) checking the
//! origin's certificate against the system's roots or `origin.ca_file`,
//! the URL's host as SNI and the name checked, and a client certificate
//! when `origin.client_cert_file` gives one. HTTP/1.1 over it (ALPN
//! `http/1.1`), as to a plain-HTTP origin.

use std::sync::Arc;

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::OriginError;
use crate::config::OriginConfig;

/// How this daemon talks TLS to its origin.
#[derive(Clone)]
pub(crate) struct OriginTls {
    connector: TlsConnector,
    name: ServerName<'static>,
}

impl std::fmt::Debug for OriginTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OriginTls")
            .field("name", &self.name)
            .finish()
    }
}

impl OriginTls {
    /// For `origin` (an `https://` URL naming `host`); `None` for `http://`.
    pub(crate) fn new(origin: &OriginConfig, host: &str) -> Result<Option<Self>, OriginError> {
        if origin.url.scheme_str() != Some("https") {
            return Ok(None);
        }
        let bad = |why: String| OriginError::BadRequest(format!("origin TLS: {why}"));
        let builder = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(e.to_string()))?;
        let builder = match &origin.ca_file {
            Some(path) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in crate::tls::load_certs(path).map_err(|e| bad(e.to_string()))? {
                    roots
                        .add(cert)
                        .map_err(|e| bad(format!("{}: {e}", path.display())))?;
                }
                builder.with_root_certificates(roots)
            }
            None => {
                use hyper_rustls::ConfigBuilderExt;
                builder
                    .with_native_roots()
                    .map_err(|e| bad(format!("no system CA certificates: {e}")))?
            }
        };
        let mut config = match &origin.client_cert {
            Some((cert, key)) => {
                let certified =
                    crate::tls::load_certified_key(cert, key).map_err(|e| bad(e.to_string()))?;
                builder.with_client_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(
                    Arc::new(certified),
                )))
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![crate::tls::ALPN_HTTP1.to_vec()];
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| bad(format!("{host:?} is no server name: {e}")))?;
        Ok(Some(Self {
            connector: TlsConnector::from(Arc::new(config)),
            name,
        }))
    }

    /// The TLS handshake over a connected stream. A certificate the origin
    /// cannot prove is an unreachable origin (the 502 page), said plainly
    /// in the log.
    pub(crate) async fn connect(
        &self,
        stream: TcpStream,
    ) -> Result<TlsStream<TcpStream>, OriginError> {
        self.connector
            .connect(self.name.clone(), stream)
            .await
            .map_err(|e| {
                tracing::warn!(server = ?self.name, error = %e, "TLS to the origin failed");
                OriginError::Unreachable(format!("TLS to the origin: {e}"))
            })
    }
}
