//! An `https://` origin, over real TLS on loopback: a local origin with a
//! certificate from a private CA (rcgen) that waitroom trusts through
//! `origin.ca_file`; the wrong CA gives the visitor the 502 page (no
//! internals); an origin that asks for a client certificate gets the one
//! `origin.client_cert_file` names, and refuses a daemon without it. The
//! origin's commands and the origin signature work over it as over HTTP.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use support::{from_origin, Harness};
use tokio::net::TcpListener;
use waitroom::config::Config;

/// A CA that signs leaf certificates.
struct Ca {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Self { cert, key }
    }

    /// A leaf for `names`: its certificate (DER) and key (DER).
    fn leaf(
        &self,
        names: &[&str],
    ) -> (
        CertificateDer<'static>,
        PrivateKeyDer<'static>,
        String,
        String,
    ) {
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let params = rcgen::CertificateParams::new(names).unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (
            cert.der().clone(),
            PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            cert.pem(),
            key.serialize_pem(),
        )
    }

    fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, self.cert.pem()).unwrap();
        path
    }
}

/// An HTTPS origin on loopback with `leaf`'s certificate, answering every
/// request 200 with its path and whether the client showed a certificate;
/// with `clients`, it asks for (and needs) one that CA signed.
async fn tls_origin(
    leaf: (CertificateDer<'static>, PrivateKeyDer<'static>),
    clients: Option<&Ca>,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match clients {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca.cert.der().clone()).unwrap();
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder.with_single_cert(vec![leaf.0], leaf.1).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let client_cert = tls.get_ref().1.peer_certificates().is_some();
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let body = serde_json::json!({
                        "path": req.uri().path(),
                        "client_cert": client_cert,
                        "signed": req.headers().contains_key("x-waitroom-signature"),
                    })
                    .to_string();
                    let mut resp = Response::builder()
                        .header("content-type", "application/json")
                        .header("x-origin", "tls");
                    if req.uri().path() == "/sold-out" {
                        resp = resp.header("x-waitroom-command", "close");
                    }
                    async move { Ok::<_, Infallible>(resp.body(Full::new(Bytes::from(body))).unwrap()) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (addr, task)
}

/// The daemon in front of `https://localhost:<port>`.
fn https_origin(port: u16, tweak: impl Fn(&mut Config)) -> impl Fn(&mut Config) {
    move |c: &mut Config| {
        c.origin.url = format!("https://localhost:{port}").parse().unwrap();
        tweak(c);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_origin_with_a_private_ca_is_reached_and_a_wrong_one_is_a_502() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("origin CA");
    let ca_file = ca.write(dir.path(), "ca.pem");
    let (cert, key, _, _) = ca.leaf(&["localhost"]);
    let (addr, server) = tls_origin((cert, key), None).await;

    let trusted = ca_file.clone();
    let h = Harness::start(https_origin(addr.port(), move |c| {
        c.origin.ca_file = Some(trusted.clone());
        c.origin.sign_key = Some(waitroom::config::Secret("k".repeat(32)));
    }))
    .await;
    let v = h.visitor();
    let resp = v.get(h.url("/shoes")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-origin"], "tls");
    let echo: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(echo["path"], "/shoes");
    assert_eq!(echo["signed"], true, "the origin signature rides along");
    // Kept alive: a second request reuses the connection and still works.
    assert_eq!(v.get(h.url("/again")).send().await.unwrap().status(), 200);
    // The origin's command is heard over TLS too.
    v.get(h.url("/sold-out")).send().await.unwrap();
    assert_eq!(h.room_json("shop").await["state"], "closed");

    // Another CA: the daemon will not trust the origin.
    let other = Ca::new("someone else");
    let other_file = other.write(dir.path(), "other.pem");
    let h = Harness::start(https_origin(addr.port(), move |c| {
        c.origin.ca_file = Some(other_file.clone());
    }))
    .await;
    let resp = h.visitor().get(h.url("/")).send().await.unwrap();
    assert_eq!(resp.status(), 502);
    assert!(!from_origin(&resp));
    let page = resp.text().await.unwrap();
    assert!(
        !page.contains("certificate"),
        "no internals on the page: {page}"
    );
    // The system's roots do not know the private CA either.
    let h = Harness::start(https_origin(addr.port(), |_| {})).await;
    assert_eq!(
        h.visitor().get(h.url("/")).send().await.unwrap().status(),
        502
    );
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_that_asks_for_a_client_certificate_gets_it() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("origin CA");
    let ca_file = ca.write(dir.path(), "ca.pem");
    let (cert, key, _, _) = ca.leaf(&["localhost"]);
    let clients = Ca::new("client CA");
    let (_, _, client_pem, client_key_pem) = clients.leaf(&["waitroom"]);
    let (client_cert, client_key) = (dir.path().join("client.pem"), dir.path().join("client.key"));
    std::fs::write(&client_cert, client_pem).unwrap();
    std::fs::write(&client_key, client_key_pem).unwrap();
    let (addr, server) = tls_origin((cert, key), Some(&clients)).await;

    let (trusted, c_cert, c_key) = (ca_file.clone(), client_cert.clone(), client_key.clone());
    let h = Harness::start(https_origin(addr.port(), move |c| {
        c.origin.ca_file = Some(trusted.clone());
        c.origin.client_cert = Some((c_cert.clone(), c_key.clone()));
    }))
    .await;
    let resp = h.visitor().get(h.url("/")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let echo: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(echo["client_cert"], true);

    // Without one, the origin refuses the handshake: the 502 page.
    let trusted = ca_file.clone();
    let h = Harness::start(https_origin(addr.port(), move |c| {
        c.origin.ca_file = Some(trusted.clone());
    }))
    .await;
    assert_eq!(
        h.visitor().get(h.url("/")).send().await.unwrap().status(),
        502
    );
    server.abort();
}
