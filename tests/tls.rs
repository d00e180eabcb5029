//! TLS termination over real sockets: certificates made at test time with
//! rcgen, a real TLS client (reqwest over rustls trusting only the test CA;
//! tokio-rustls where the served certificate itself is checked), HTTP/2
//! and HTTP/1.1 by ALPN, SNI, reload, the https redirect, the handshake
//! timeout, garbage instead of a ClientHello, `rediss://` to a real
//! `redis-server` with TLS, and every bad `[tls]` config's message.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use waitroom::config::{self, ConfigError};
use waitroom::{Daemon, Deps};

const KEY: &str = "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=";

// --- certificates ---

/// A test CA that signs leaf certificates.
struct Ca {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

/// A leaf certificate and its key, as PEM, and the leaf's DER to compare
/// with what a server presents.
struct Leaf {
    cert_pem: String,
    key_pem: String,
    der: Vec<u8>,
}

impl Ca {
    fn new() -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "waitroom test CA");
        let cert = params.self_signed(&key).unwrap();
        Self { cert, key }
    }

    fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A leaf for these names (DNS names, or IP addresses).
    fn leaf(&self, names: &[&str]) -> Leaf {
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let params = rcgen::CertificateParams::new(names).unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }
}

impl Leaf {
    /// Writes `NAME.pem` and `NAME.key` in `dir`; returns their paths.
    fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert, &self.cert_pem).unwrap();
        std::fs::write(&key, &self.key_pem).unwrap();
        (cert, key)
    }
}

/// A TOML string holding a path.
fn q(path: &Path) -> String {
    format!("{:?}", path.display().to_string())
}

/// One `[[tls.cert]]` entry.
fn cert_entry(hosts: &[&str], cert: &Path, key: &Path) -> String {
    let hosts: Vec<String> = hosts.iter().map(|h| format!("{h:?}")).collect();
    format!(
        "[[tls.cert]]\nhosts = [{}]\ncert = {}\nkey = {}\n",
        hosts.join(", "),
        q(cert),
        q(key)
    )
}

/// A config file's text: one room in front of `origin`, then `tail`
/// (the `[tls]` and `[store]` parts under test).
fn config_text(origin: SocketAddr, tail: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nworkers = 2\n\
         header_read_timeout = \"10s\"\n[cookie]\nkeys = [\"{KEY}\"]\nsecure = true\n\
         [origin]\nurl = \"http://{origin}\"\n[[room]]\nid = \"shop\"\npath = \"/\"\n\
         total_active_users = 5\nnew_users_per_minute = 100\n{tail}"
    )
}

// --- a daemon started from a config file, as operators run it ---

struct Site {
    dir: tempfile::TempDir,
    path: PathBuf,
    ca: Ca,
    /// Kept running for the daemon.
    _origin: support::origin::Origin,
    daemon: Daemon,
}

impl Site {
    /// A daemon with one certificate for `shop.test` (and 127.0.0.1), and
    /// `more` added to the file (after `[tls]`'s own keys, so it can add
    /// `[[tls.cert]]` entries; `server` replaces keys of `[server]`).
    async fn start(tls_keys: &str, server: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new();
        let (cert, key) = ca
            .leaf(&["shop.test", "127.0.0.1"])
            .write(dir.path(), "shop");
        let origin = support::origin::Origin::start().await;
        let path = dir.path().join("waitroom.toml");
        let tail = format!(
            "[tls]\nlisten = \"127.0.0.1:0\"\n{tls_keys}\n{}",
            cert_entry(&["shop.test"], &cert, &key)
        );
        let text = config_text(origin.addr, &tail).replace(
            "header_read_timeout = \"10s\"\n",
            &format!("header_read_timeout = \"10s\"\n{server}\n"),
        );
        std::fs::write(&path, text).unwrap();
        let cfg = config::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let daemon = Daemon::start(
            &cfg,
            Deps {
                config_path: Some(path.clone()),
                ..Deps::default()
            },
        )
        .await
        .expect("daemon starts");
        Self {
            dir,
            path,
            ca,
            _origin: origin,
            daemon,
        }
    }

    fn tls_addr(&self) -> SocketAddr {
        self.daemon.tls_addr.expect("TLS listener")
    }

    /// An https client that trusts only the test CA and finds `shop.test`
    /// on the TLS listener.
    fn https(&self, http1_only: bool) -> reqwest::Client {
        let ca = reqwest::Certificate::from_pem(self.ca.pem().as_bytes()).unwrap();
        let mut b = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca)
            .resolve("shop.test", self.tls_addr())
            .cookie_store(true)
            .redirect(reqwest::redirect::Policy::none());
        if http1_only {
            b = b.http1_only();
        }
        b.build().unwrap()
    }

    fn https_url(&self, path: &str) -> String {
        format!("https://shop.test:{}{path}", self.tls_addr().port())
    }

    fn read_config(&self) -> String {
        std::fs::read_to_string(&self.path).unwrap()
    }
}

// --- a client that shows which certificate was served ---

/// Accepts any certificate: these tests look at which one was presented
/// (for an unknown name too), not whether the client would trust it; the
/// reqwest tests check that the chain verifies against the CA.
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

type ClientTls = tokio_rustls::client::TlsStream<TcpStream>;

/// A TLS connection to `addr`, sending `sni` (none for `None`), offering `alpn`.
async fn connect(addr: SocketAddr, sni: Option<&str>, alpn: &[&[u8]]) -> ClientTls {
    let provider = waitroom::tls::provider();
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
        .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    // An IP address as the server name sends no SNI.
    let name = match sni {
        Some(host) => ServerName::try_from(host.to_owned()).unwrap(),
        None => ServerName::IpAddress(addr.ip().into()),
    };
    let tcp = TcpStream::connect(addr).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await
        .expect("TLS handshake")
}

/// The leaf certificate `sni` gets from `addr`.
async fn served_leaf(addr: SocketAddr, sni: Option<&str>) -> Vec<u8> {
    let tls = connect(addr, sni, &[b"http/1.1"]).await;
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

/// An HTTP/1.1 connection over `tls`, kept open for several requests.
async fn http1_over(tls: ClientTls) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

async fn get_status(
    sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    path: &str,
) -> u16 {
    sender.ready().await.unwrap();
    let req = http::Request::get(path)
        .header("host", "shop.test")
        .body(Empty::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    resp.into_body().collect().await.unwrap();
    status
}

/// Waits (up to `within`) for the peer to close `stream`; true if it did.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // An alert before the close.
            Ok(Ok(_)) => continue,
        }
    }
}

// --- serving ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn visitors_get_through_over_http2_and_http1_with_https_forwarded() {
    let site = Site::start("", "").await;

    let h2 = site.https(false);
    let resp = h2.get(site.https_url("/")).send().await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert!(support::from_origin(&resp), "{}", resp.status());
    let cookie = resp
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|c| c.starts_with(waitroom::proxy::headers::COOKIE_PREFIX))
        .expect("a ticket cookie");
    assert!(cookie.contains("Secure"), "{cookie}");
    let echo: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(echo["headers"]["x-forwarded-proto"][0], "https", "{echo}");
    let visitor = echo["headers"]["x-waitroom-visitor"][0].clone();
    // The Secure ticket comes back over TLS: the same visitor, again.
    let again = h2.get(site.https_url("/again")).send().await.unwrap();
    assert_eq!(again.version(), http::Version::HTTP_2);
    let echo: serde_json::Value = again.json().await.unwrap();
    assert_eq!(echo["headers"]["x-waitroom-visitor"][0], visitor);

    let h1 = site.https(true);
    let resp = h1.get(site.https_url("/")).send().await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_11);
    assert!(support::from_origin(&resp));
    let echo: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(echo["headers"]["x-forwarded-proto"][0], "https");

    // A client without ALPN speaks HTTP/1.1.
    let mut plain_alpn = http1_over(connect(site.tls_addr(), Some("shop.test"), &[]).await).await;
    assert_eq!(get_status(&mut plain_alpn, "/").await, 200);

    // The plain listener still says http.
    let resp = reqwest::get(format!("http://{}/", site.daemon.addr))
        .await
        .unwrap();
    let echo: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(echo["headers"]["x-forwarded-proto"][0], "http");
    site.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_chooses_the_certificate_and_unknown_names_get_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let shop = ca.leaf(&["shop.test"]);
    let blog = ca.leaf(&["blog.test", "*.blog.test"]);
    let (shop_cert, shop_key) = shop.write(dir.path(), "shop");
    let (blog_cert, blog_key) = blog.write(dir.path(), "blog");
    let origin = support::origin::Origin::start().await;
    let tail = format!(
        "[tls]\nlisten = \"127.0.0.1:0\"\n{}{}",
        cert_entry(&["shop.test"], &shop_cert, &shop_key),
        cert_entry(&["blog.test", "*.blog.test"], &blog_cert, &blog_key)
    );
    let cfg = config::from_toml_str(&config_text(origin.addr, &tail)).unwrap();
    let daemon = Daemon::start(&cfg, Deps::default()).await.unwrap();
    let addr = daemon.tls_addr.unwrap();

    assert_eq!(served_leaf(addr, Some("shop.test")).await, shop.der);
    assert_eq!(served_leaf(addr, Some("blog.test")).await, blog.der);
    assert_eq!(served_leaf(addr, Some("BLOG.test")).await, blog.der);
    assert_eq!(served_leaf(addr, Some("www.blog.test")).await, blog.der);
    // Unknown names, a wildcard two labels down, and no SNI: the first.
    assert_eq!(served_leaf(addr, Some("other.test")).await, shop.der);
    assert_eq!(served_leaf(addr, Some("a.b.blog.test")).await, shop.der);
    assert_eq!(served_leaf(addr, None).await, shop.der);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_serves_new_certificates_to_new_connections_and_refuses_broken_ones() {
    let site = Site::start("", "").await;
    let addr = site.tls_addr();
    let first = served_leaf(addr, Some("shop.test")).await;
    let mut open = http1_over(connect(addr, Some("shop.test"), &[b"http/1.1"]).await).await;
    assert_eq!(get_status(&mut open, "/").await, 200);

    // A new certificate at the same paths, picked up by a reload.
    let renewed = site.ca.leaf(&["shop.test"]);
    renewed.write(site.dir.path(), "shop");
    let admin = reqwest::Client::new();
    let reload = format!("http://{}/api/reload", site.daemon.admin_addr);
    let resp = admin.post(&reload).send().await.unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    assert_eq!(served_leaf(addr, Some("shop.test")).await, renewed.der);
    assert_ne!(renewed.der, first);
    // The connection opened before the reload goes on serving.
    assert_eq!(get_status(&mut open, "/still-here").await, 200);

    // A key that does not match its certificate: refused, with the key named.
    let other = site.ca.leaf(&["shop.test"]);
    std::fs::write(site.dir.path().join("shop.key"), &other.key_pem).unwrap();
    let resp = admin.post(&reload).send().await.unwrap();
    assert_eq!(resp.status(), 400);
    let e: serde_json::Value = resp.json().await.unwrap();
    let msg = e["error"].as_str().unwrap();
    assert!(
        msg.starts_with("tls.cert[0].key (line ") && msg.contains("does not match the certificate"),
        "{msg}"
    );
    assert_eq!(served_leaf(addr, Some("shop.test")).await, renewed.der);

    // A certificate file that is not PEM: refused too, through the same
    // path SIGHUP takes.
    std::fs::write(site.dir.path().join("shop.key"), &renewed.key_pem).unwrap();
    std::fs::write(site.dir.path().join("shop.pem"), "not a certificate\n").unwrap();
    let err = site
        .daemon
        .reload_from_file()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("tls.cert[0].cert"), "{err}");
    assert!(err.contains("holds no certificate"), "{err}");
    assert_eq!(served_leaf(addr, Some("shop.test")).await, renewed.der);
    assert_eq!(get_status(&mut open, "/").await, 200);
    site.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirect_http_answers_plain_http_with_308_to_https() {
    let site = Site::start("redirect_http = true", "").await;
    let port = site.tls_addr().port();
    let plain = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let resp = plain
        .post(format!("http://{}/cart/add?item=7&n=2", site.daemon.addr))
        .header("host", "Shop.Test:8080")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 308);
    assert_eq!(
        resp.headers()["location"],
        format!("https://shop.test:{port}/cart/add?item=7&n=2").as_str()
    );
    assert!(!support::from_origin(&resp));

    // The health check answers on plain HTTP, for load balancers.
    let resp = plain
        .get(format!("http://{}/__waitroom/health", site.daemon.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), "ok");

    // A Host that is no host name gets 400, never a Location made of it.
    let raw = support::raw::exchange(
        site.daemon.addr,
        b"GET / HTTP/1.1\r\nHost: evil.example/x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(raw.status, 400);
    assert!(raw.header("location").is_none());
    // Nor is a valid name the daemon does not serve redirected to: the
    // redirect goes only to the certificates' and rooms' hosts.
    for host in ["evil.example", "shop.test.evil.example", "127.0.0.1"] {
        let raw = support::raw::exchange(
            site.daemon.addr,
            format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
        assert_eq!(raw.status, 400, "{host}");
        assert!(raw.header("location").is_none(), "{host}");
    }

    // And the https side serves.
    let resp = site
        .https(false)
        .get(site.https_url("/"))
        .send()
        .await
        .unwrap();
    assert!(support::from_origin(&resp));
    site.daemon.shutdown().await;
}

// --- hostile and idle clients ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_sends_no_handshake_is_closed_after_the_timeout() {
    let site = Site::start("", "").await;
    let cfg = site.read_config().replace(
        "header_read_timeout = \"10s\"",
        "header_read_timeout = \"300ms\"",
    );
    std::fs::write(&site.path, cfg).unwrap();
    site.daemon.shutdown().await;
    // A fresh daemon with the short timeout (listener settings need a restart).
    let cfg = config::load(&site.path).unwrap();
    let daemon = Daemon::start(&cfg, Deps::default()).await.unwrap();
    let addr = daemon.tls_addr.unwrap();

    let started = Instant::now();
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(5)).await);
    assert!(started.elapsed() >= Duration::from_millis(250));

    // Half a ClientHello, then nothing: the handshake is bounded too.
    let mut stalled = TcpStream::connect(addr).await.unwrap();
    stalled
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();
    assert!(closed_within(&mut stalled, Duration::from_secs(5)).await);

    // After the handshake, the request head has the same bound.
    let mut tls = connect(addr, Some("shop.test"), &[b"http/1.1"]).await;
    let mut buf = [0u8; 256];
    let read = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(_)) | Ok(Err(_))), "never closed");
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_instead_of_a_client_hello_is_closed_and_serving_goes_on() {
    let site = Site::start("", "").await;
    let addr = site.tls_addr();
    let garbage: [&[u8]; 4] = [
        b"GET / HTTP/1.1\r\nHost: shop.test\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        &[0x16, 0x03, 0x01, 0x00, 0x05, 0xff, 0xff, 0xff, 0xff, 0xff],
        &[0u8; 4096],
    ];
    for bytes in garbage {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(bytes).await;
        assert!(
            closed_within(&mut s, Duration::from_secs(5)).await,
            "{:?}",
            &bytes[..8]
        );
    }
    let resp = site
        .https(false)
        .get(site.https_url("/"))
        .send()
        .await
        .unwrap();
    assert!(support::from_origin(&resp));
    site.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tls_listener_keeps_the_per_address_cap_and_drains_on_shutdown() {
    let site = Site::start("", "max_connections_per_ip = 2").await;
    let addr = site.tls_addr();
    // Two connections from 127.0.0.1 are the cap: one plain, one TLS, each
    // known to be admitted (a request answered, a handshake done).
    let mut plain = TcpStream::connect(site.daemon.addr).await.unwrap();
    plain
        .write_all(b"GET /__waitroom/health HTTP/1.1\r\nHost: shop.test\r\n\r\n")
        .await
        .unwrap();
    let answer = support::raw::read_response(&mut plain).await;
    assert_eq!(answer.status, 200);
    let mut tls = http1_over(connect(addr, Some("shop.test"), &[b"http/1.1"]).await).await;
    let origin_connections = site._origin.connections.clone();
    let slow = tokio::spawn(async move { get_status(&mut tls, "/slow?ms=800").await });
    // The third is closed at once, long before the 10 s header timeout.
    let mut third = TcpStream::connect(addr).await.unwrap();
    assert!(closed_within(&mut third, Duration::from_secs(3)).await);
    // Shutdown lets the request in flight over TLS finish: shut down once
    // the slow request is in flight (the origin has its connection).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while origin_connections.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the slow request never reached the origin"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    site.daemon.shutdown().await;
    assert_eq!(slow.await.unwrap(), 200);
}

// --- rediss:// ---

/// A `redis-server` speaking only TLS on a free loopback port, with a
/// certificate for 127.0.0.1 from `ca`; killed (by its pid) on drop.
struct TlsRedis {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl TlsRedis {
    fn start(ca: &Ca, extra: &[&str]) -> Self {
        for _ in 0..10 {
            let dir = tempfile::tempdir().unwrap();
            let (cert, key) = ca.leaf(&["127.0.0.1"]).write(dir.path(), "redis");
            let ca_path = dir.path().join("ca.pem");
            std::fs::write(&ca_path, ca.pem()).unwrap();
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut child = Command::new("redis-server")
                .args(["--port", "0", "--tls-port", &port.to_string()])
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--tls-cert-file")
                .arg(&cert)
                .arg("--tls-key-file")
                .arg(&key)
                .arg("--tls-ca-cert-file")
                .arg(&ca_path)
                .args(["--tls-auth-clients", "no"])
                .arg("--dir")
                .arg(dir.path())
                .arg("--logfile")
                .arg(dir.path().join("redis.log"))
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server");
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Self {
                        port,
                        child,
                        _dir: dir,
                    };
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("redis-server with TLS did not start");
    }

    fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.port)
    }

    /// `redis-cli` over TLS against this server.
    fn cli(&self, ca: &Path, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["--tls", "--cacert"])
            .arg(ca)
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_to_a_redis_server_with_tls_trusting_store_tls_ca() {
    let ca = Ca::new();
    let redis = TlsRedis::start(&ca, &[]);
    let dir = tempfile::tempdir().unwrap();
    let ca_path = dir.path().join("redis-ca.pem");
    std::fs::write(&ca_path, ca.pem()).unwrap();
    let origin = support::origin::Origin::start().await;
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"\ntls_ca = {}\n",
        redis.url(),
        q(&ca_path)
    );
    let cfg = config::from_toml_str(&config_text(origin.addr, &store)).unwrap();
    let daemon = Daemon::start(&cfg, Deps::default())
        .await
        .expect("starts on rediss://");
    let resp = reqwest::get(format!("http://{}/", daemon.addr))
        .await
        .unwrap();
    assert!(support::from_origin(&resp), "{}", resp.status());
    let stats: serde_json::Value = reqwest::get(format!("http://{}/api/rooms", daemon.admin_addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(stats.to_string().contains("shop"), "{stats}");
    daemon.shutdown().await;
    let keys: u64 = redis.cli(&ca_path, &["DBSIZE"]).parse().unwrap();
    assert!(keys > 0, "the visitor went through Redis over TLS");

    // Without the CA the server's certificate is not trusted: start fails
    // with the store's error, within the store timeout.
    let no_ca = store.replace(&format!("tls_ca = {}\n", q(&ca_path)), "");
    let cfg = config::from_toml_str(&config_text(origin.addr, &no_ca)).unwrap();
    let started = Instant::now();
    let err = match Daemon::start(&cfg, Deps::default()).await {
        Ok(_) => panic!("connected without trusting the CA"),
        Err(e) => e.to_string(),
    };
    assert!(err.starts_with("store: "), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_to_a_redis_cluster_with_tls_on_every_node() {
    let ca = Ca::new();
    let dir = tempfile::tempdir().unwrap();
    let ca_path = dir.path().join("redis-ca.pem");
    std::fs::write(&ca_path, ca.pem()).unwrap();
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
            .to_string()
    };
    let nodes: Vec<TlsRedis> = (0..3)
        .map(|_| {
            let bus = free();
            TlsRedis::start(
                &ca,
                &[
                    "--tls-cluster",
                    "yes",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-port",
                    &bus,
                    "--cluster-node-timeout",
                    "5000",
                ],
            )
        })
        .collect();
    let mut create = Command::new("redis-cli");
    create.args(["--tls", "--cacert"]).arg(&ca_path);
    create.args(["--cluster", "create"]);
    for n in &nodes {
        create.arg(format!("127.0.0.1:{}", n.port));
    }
    let out = create
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !nodes.iter().all(|n| {
        let info = n.cli(&ca_path, &["CLUSTER", "INFO"]);
        info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")
    }) {
        assert!(Instant::now() < deadline, "cluster never became ok");
        std::thread::sleep(Duration::from_millis(50));
    }

    let origin = support::origin::Origin::start().await;
    let urls: Vec<String> = nodes.iter().map(|n| format!("{:?}", n.url())).collect();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = [{}]\ntimeout = \"2s\"\ntls_ca = {}\n",
        urls.join(", "),
        q(&ca_path)
    );
    let cfg = config::from_toml_str(&config_text(origin.addr, &store)).unwrap();
    let daemon = Daemon::start(&cfg, Deps::default())
        .await
        .expect("starts on a TLS cluster");
    let client = reqwest::Client::new();
    for _ in 0..3 {
        let resp = client
            .get(format!("http://{}/", daemon.addr))
            .send()
            .await
            .unwrap();
        assert!(support::from_origin(&resp), "{}", resp.status());
    }
    daemon.shutdown().await;
    let keys: u64 = nodes
        .iter()
        .map(|n| n.cli(&ca_path, &["DBSIZE"]).parse::<u64>().unwrap())
        .sum();
    assert!(keys > 0, "visitors went through the cluster over TLS");
}

// --- the config checker ---

/// `line L, column C` of the first `needle` in `src` (1-based, as problems say).
fn at(src: &str, needle: &str) -> String {
    at_after(src, "", needle)
}

/// [`at`] of `value` where it follows `before` (to tell apart two keys
/// with the same value).
fn at_after(src: &str, before: &str, value: &str) -> String {
    let offset = src
        .find(&format!("{before}{value}"))
        .unwrap_or_else(|| panic!("{before}{value} not in {src}"))
        + before.len();
    let before = &src[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap().chars().count() + 1;
    format!("line {line}, column {column}")
}

fn problems(src: &str) -> String {
    match config::from_toml_str(src) {
        Ok(_) => panic!("accepted:\n{src}"),
        Err(e @ ConfigError::Invalid(_)) => e.to_string(),
        Err(e) => panic!("not a problem list: {e}"),
    }
}

const ORIGIN: &str = "127.0.0.1:9";

#[test]
fn each_bad_certificate_file_is_named_by_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new();
    let (cert, key) = ca.leaf(&["shop.test"]).write(d, "good");
    let (_, other_key) = ca.leaf(&["shop.test"]).write(d, "other");
    let missing = d.join("missing.pem");
    let origin: SocketAddr = ORIGIN.parse().unwrap();
    let case = |cert: &Path, key: &Path| {
        let src = config_text(
            origin,
            &format!("[tls]\n{}", cert_entry(&["shop.test"], cert, key)),
        );
        (problems(&src), src)
    };

    let (e, src) = case(&missing, &key);
    assert_eq!(
        e,
        format!(
            "tls.cert[0].cert ({}): cannot read {}: No such file or directory (os error 2)",
            at(&src, &q(&missing)),
            missing.display()
        )
    );

    let (e, src) = case(&cert, &missing);
    assert_eq!(
        e,
        format!(
            "tls.cert[0].key ({}): cannot read {}: No such file or directory (os error 2)",
            at_after(&src, "key = ", &q(&missing)),
            missing.display()
        )
    );

    // The key file where the chain belongs: no certificate in it.
    let (e, src) = case(&key, &key);
    assert_eq!(
        e,
        format!(
            "tls.cert[0].cert ({}): {} holds no certificate (a PEM block -----BEGIN CERTIFICATE-----)",
            at(&src, &q(&key)),
            key.display()
        )
    );

    // The chain where the key belongs: no key in it.
    let (e, src) = case(&cert, &cert);
    assert_eq!(
        e,
        format!(
            "tls.cert[0].key ({}): {} holds no private key (a PEM block -----BEGIN PRIVATE KEY-----, RSA PRIVATE KEY or EC PRIVATE KEY)",
            at_after(&src, "key = ", &q(&cert)),
            cert.display()
        )
    );

    let (e, src) = case(&cert, &other_key);
    assert_eq!(
        e,
        format!(
            "tls.cert[0].key ({}): {} does not match the certificate in {}",
            at(&src, &q(&other_key)),
            other_key.display(),
            cert.display()
        )
    );

    // Broken PEM (an unterminated block).
    let broken = d.join("broken.pem");
    std::fs::write(&broken, "-----BEGIN CERTIFICATE-----\nAAAA\n").unwrap();
    let (e, _) = case(&broken, &key);
    assert!(
        e.starts_with("tls.cert[0].cert (line ") && e.contains("is not valid PEM"),
        "{e}"
    );

    // A certificate block that holds no certificate.
    let junk = d.join("junk.pem");
    std::fs::write(
        &junk,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let (e, _) = case(&junk, &key);
    assert!(
        e.starts_with("tls.cert[0].cert (line ") && e.contains("cannot be parsed"),
        "{e}"
    );
}

#[test]
fn tls_section_problems_name_their_keys() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let (cert, key) = ca.leaf(&["a.test"]).write(dir.path(), "a");
    let origin: SocketAddr = ORIGIN.parse().unwrap();

    // [tls] without a certificate, and redirect_http with nothing to redirect to.
    let src = config_text(origin, "[tls]\nredirect_http = true\n");
    assert_eq!(
        problems(&src),
        format!(
            "2 problems in the configuration:\n  tls.cert ({}): at least one certificate is \
             required: add [[tls.cert]] with cert and key (PEM files)\n  tls.redirect_http ({}): \
             sends plain HTTP to the TLS listener, which has no certificate; add [[tls.cert]]",
            at(&src, "[tls]"),
            at_after(&src, "redirect_http = ", "true")
        )
    );

    // The same host twice; a second certificate without hosts; bad names.
    let src = config_text(
        origin,
        &format!(
            "[tls]\n{}{}{}",
            cert_entry(&["a.test", "*.a.test"], &cert, &key),
            cert_entry(&["b.test", "A.TEST"], &cert, &key),
            cert_entry(&[], &cert, &key).replace("hosts = []\n", "hosts = [\"a/b\", \"*.*.c\"]\n"),
        ),
    );
    let e = problems(&src);
    assert!(
        e.contains(&format!(
            "tls.cert[1].hosts[1] ({}): duplicate host \"a.test\"; tls.cert[0].hosts lists it too",
            at(&src, "\"A.TEST\"")
        )),
        "{e}"
    );
    assert!(
        e.contains(&format!(
            "tls.cert[2].hosts[0] ({}): \"a/b\" must not contain a path",
            at(&src, "\"a/b\"")
        )),
        "{e}"
    );
    assert!(
        e.contains(&format!(
            "tls.cert[2].hosts[1] ({}): \"*.*.c\" may hold * only as a whole first label, as in \"*.example.com\"",
            at(&src, "\"*.*.c\"")
        )),
        "{e}"
    );

    let src = config_text(
        origin,
        &format!(
            "[tls]\n{}{}",
            cert_entry(&["a.test"], &cert, &key),
            cert_entry(&[], &cert, &key)
        ),
    );
    assert_eq!(
        problems(&src),
        format!(
            "tls.cert[1].hosts ({}): must list the host names this certificate is for; only the \
             first certificate (the default) may leave hosts out",
            at(&src, "[]")
        )
    );

    // The TLS listener on the plain listener's address.
    let src = config_text(
        origin,
        &format!(
            "[tls]\nlisten = \"127.0.0.1:8080\"\n{}",
            cert_entry(&[], &cert, &key)
        ),
    )
    .replacen(
        "\nlisten = \"127.0.0.1:0\"",
        "\nlisten = \"127.0.0.1:8080\"",
        1,
    );
    assert_eq!(
        problems(&src),
        format!(
            "tls.listen ({}): 127.0.0.1:8080 is also server.listen; the TLS listener needs its own address",
            at(&src, "\"127.0.0.1:8080\"\n[[tls")
        )
    );

    // Unknown keys are refused as everywhere.
    let src = config_text(
        origin,
        &format!("[tls]\nhsts = true\n{}", cert_entry(&[], &cert, &key)),
    );
    assert!(
        problems(&src).starts_with("tls.hsts ("),
        "{}",
        problems(&src)
    );

    // A valid section: the default (no hosts) and one named certificate.
    let src = config_text(
        origin,
        &format!(
            "[tls]\nredirect_http = true\n{}{}",
            cert_entry(&[], &cert, &key),
            cert_entry(&["Shop.Test.", "*.shop.test"], &cert, &key)
        ),
    );
    let tls = config::from_toml_str(&src).unwrap().tls.unwrap();
    assert_eq!(tls.listen, "0.0.0.0:8443".parse().unwrap());
    assert!(tls.redirect_http);
    assert_eq!(tls.certs[1].hosts, ["shop.test", "*.shop.test"]);
}

#[test]
fn store_tls_ca_problems_name_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let origin: SocketAddr = ORIGIN.parse().unwrap();
    let ca_path = dir.path().join("ca.pem");
    std::fs::write(&ca_path, Ca::new().pem()).unwrap();
    let store = |url: &str, ca: &Path| {
        config_text(
            origin,
            &format!(
                "[store]\nbackend = \"redis\"\nurl = {url}\ntls_ca = {}\n",
                q(ca)
            ),
        )
    };

    let ok = store("\"rediss://127.0.0.1:6380/\"", &ca_path);
    let cfg = config::from_toml_str(&ok).unwrap();
    assert_eq!(cfg.store.tls_ca.as_deref(), Some(ca_path.as_path()));

    let src = store("\"redis://127.0.0.1:6380/\"", &ca_path);
    assert_eq!(
        problems(&src),
        format!(
            "store.tls_ca ({}): is only used with rediss:// URLs (Redis over TLS)",
            at(&src, &q(&ca_path))
        )
    );

    let missing = dir.path().join("nope.pem");
    let src = store("\"rediss://127.0.0.1:6380/\"", &missing);
    assert_eq!(
        problems(&src),
        format!(
            "store.tls_ca ({}): cannot read {}: No such file or directory (os error 2)",
            at(&src, &q(&missing)),
            missing.display()
        )
    );

    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let src = store("\"rediss://127.0.0.1:6380/\"", &empty);
    assert!(
        problems(&src).contains("holds no certificate"),
        "{}",
        problems(&src)
    );

    let src = store(
        "[\"rediss://127.0.0.1:7000/\", \"redis://127.0.0.1:7001/\"]",
        &ca_path,
    );
    assert_eq!(
        problems(&src),
        format!(
            "store.url ({}): mixes redis:// and rediss:// nodes; a Redis Cluster uses TLS on every node or on none",
            at(&src, "[\"rediss")
        )
    );
}

#[test]
fn waitroom_check_exits_64_naming_a_bad_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let (cert, _) = ca.leaf(&["a.test"]).write(dir.path(), "a");
    let (_, wrong) = ca.leaf(&["a.test"]).write(dir.path(), "b");
    let path = dir.path().join("waitroom.toml");
    let origin: SocketAddr = ORIGIN.parse().unwrap();
    let write = |key: &Path| {
        std::fs::write(
            &path,
            config_text(origin, &format!("[tls]\n{}", cert_entry(&[], &cert, key))),
        )
        .unwrap()
    };
    write(&wrong);
    let out = Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("tls.cert[0].key") && stderr.contains("does not match"),
        "{stderr}"
    );
    write(&dir.path().join("a.key"));
    let out = Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
