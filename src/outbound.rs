//! The HTTP client connector for what the daemon calls out to: webhooks,
//! captcha verifiers, JWKS URLs.

use hyper_util::client::legacy::connect::HttpConnector;

/// `https://` and plain `http://`, HTTP/1.
pub(crate) type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// A connector for `https://` (trusting the system's CA certificates) and
/// plain `http://`; without any CA certificate, only plain HTTP, and a
/// warning says that `what` cannot be reached over HTTPS.
pub(crate) fn https_connector(what: &str) -> Https {
    match hyper_rustls::HttpsConnectorBuilder::new().with_native_roots() {
        Ok(b) => b.https_or_http().enable_http1().build(),
        Err(e) => {
            tracing::warn!(error = %e, "no CA certificates: {what} are reachable over plain HTTP only");
            let empty = rustls::ClientConfig::builder()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(empty)
                .https_or_http()
                .enable_http1()
                .build()
        }
    }
}
