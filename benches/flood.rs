//! The connection-level attacks, measured against a daemon binary (run it
//! for two builds, alternating, to compare): what one address can make the
//! daemon hold, and what legitimate visitors get meanwhile.
//!
//! * **streams**: 100 HTTP/2 connections from 127.0.0.1, each opening up
//!   to 200 streams for a large download on a bypass path, with every
//!   window held at 0 and a PING every 3 s, for `--seconds`; meanwhile
//!   visitors on 127.0.0.2 ask for a page or a download twenty times a
//!   second, each on a new connection. The daemon's descriptors and memory
//!   are sampled twice a second; the report gives their peaks, the memory
//!   5 s after the flood, and the visitors' requests served and failed,
//!   with their latency.
//! * **tunnels**: WebSocket tunnels opened from one address by one
//!   admitted visitor until 1,200 or a refusal; how many were held at once.
//! * **replay**: a visitor admitted from the queue lets its 5 s session run
//!   out, then replays the queue ticket it held before: where it stands.
//!
//! `cargo bench --bench flood -- --daemon target/release/waitroom [--seconds 40]`
//! (scripts/bench-flood runs two builds alternating). Without `--daemon`
//! it prints this usage and exits, so `cargo test` passes over it. The
//! daemon runs with at most 20,000 descriptors (`prlimit`), as in the
//! attack that found this.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

const KEY: &str = "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let Some(daemon) = arg("--daemon") else {
        println!("usage: cargo bench --bench flood -- --daemon PATH [--seconds N] [--only streams|tunnels|replay]");
        return;
    };
    let seconds: u64 = arg("--seconds").and_then(|s| s.parse().ok()).unwrap_or(40);
    let only = arg("--only");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let origin = origin().await;
        let run = |what: &str| only.as_deref().is_none_or(|o| o == what);
        if run("streams") {
            streams(&daemon, origin, seconds).await;
        }
        if run("tunnels") {
            tunnels(&daemon, origin).await;
        }
        if run("replay") {
            replay(&daemon, origin).await;
        }
    });
}

/// The origin: a large download in 64 KiB chunks, a WebSocket echo, and a
/// small page for anything else.
async fn origin() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let svc = service_fn(|req| async move { Ok::<_, Infallible>(answer(req)) });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

fn answer(mut req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path();
    if path.ends_with("/download") {
        let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
        let stream =
            futures::stream::repeat_with(move || Ok(Frame::data(chunk.clone()))).take(2000);
        return Response::new(BodyExt::boxed(StreamBody::new(stream)));
    }
    if path == "/ws" {
        if let Some(key) = req.headers().get("sec-websocket-key") {
            let accept =
                tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
            let upgrade = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                if let Ok(upgraded) = upgrade.await {
                    let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
                        TokioIo::new(upgraded),
                        tokio_tungstenite::tungstenite::protocol::Role::Server,
                        None,
                    )
                    .await;
                    while let Some(Ok(msg)) = ws.next().await {
                        if msg.is_text() && ws.send(msg).await.is_err() {
                            break;
                        }
                    }
                }
            });
            let mut resp = Response::new(Full::new(Bytes::new()).boxed());
            *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            let h = resp.headers_mut();
            h.insert("connection", "upgrade".parse().unwrap());
            h.insert("upgrade", "websocket".parse().unwrap());
            h.insert("sec-websocket-accept", accept.parse().unwrap());
            return resp;
        }
    }
    Response::new(Full::new(Bytes::from_static(b"a page of the shop")).boxed())
}

/// A daemon binary on free ports in front of `origin`.
struct Daemon {
    child: Child,
    addr: SocketAddr,
    admin: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn start(binary: &str, origin: SocketAddr, room: &str) -> Daemon {
    let (port, admin_port) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("waitroom.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin_port}\"\n\
             ip_arrival_burst = 1000000\nip_arrivals_per_second = 1000000\nworkers = 2\n\
             [cookie]\nsecure = false\n[origin]\nurl = \"http://{origin}\"\n\
             [[room]]\nid = \"shop\"\npath = \"/\"\nnew_users_per_minute = 1000000\n\
             bypass_paths = [\"/static/\"]\n{room}\n"
        ),
    )
    .unwrap();
    let child = Command::new("prlimit")
        .args(["--nofile=20000:20000", binary, "run", "--config"])
        .arg(&config)
        .env("WAITROOM_COOKIE_KEYS", KEY)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the daemon starts (is prlimit installed?)");
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    for _ in 0..400 {
        if TcpStream::connect(addr).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Daemon {
        child,
        addr,
        admin: format!("127.0.0.1:{admin_port}").parse().unwrap(),
        _dir: dir,
    }
}

/// The daemon's open descriptors and resident memory (MB).
fn sample(pid: u32) -> (usize, f64) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let rss_kb = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    (fds, rss_kb / 1024.0)
}

/// One stalling HTTP/2 connection: streams opened as the server allows,
/// none read, a PING every 3 s; ends when the daemon closes it.
async fn stall(addr: SocketAddr, streams: usize, until: Instant, opened: Arc<AtomicUsize>) {
    let Ok(tcp) = TcpStream::connect(addr).await else {
        return;
    };
    let Ok((client, mut conn)) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, Bytes>(tcp)
        .await
    else {
        return;
    };
    let mut ping = conn.ping_pong();
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let pinger = tokio::spawn(async move {
        if let Some(ping) = ping.as_mut() {
            loop {
                tokio::time::sleep(Duration::from_secs(3)).await;
                if ping.ping(h2::Ping::opaque()).await.is_err() {
                    return;
                }
            }
        }
    });
    let mut held = Vec::new();
    for _ in 0..streams {
        let Ok(Ok(mut c)) =
            tokio::time::timeout(Duration::from_secs(2), client.clone().ready()).await
        else {
            break;
        };
        let req = Request::get("http://shop.example/static/download")
            .body(())
            .unwrap();
        match c.send_request(req, true) {
            Ok((resp, _)) => {
                opened.fetch_add(1, Ordering::Relaxed);
                held.push(resp);
            }
            Err(_) => break,
        }
    }
    tokio::select! {
        _ = conn => {}
        () = tokio::time::sleep_until(until.into()) => {}
    }
    pinger.abort();
    drop(held);
}

async fn streams(binary: &str, origin: SocketAddr, seconds: u64) {
    let daemon = start(binary, origin, "total_active_users = 1000").await;
    let pid = daemon.child.id();
    let (fds_idle, rss_idle) = sample(pid);
    let until = Instant::now() + Duration::from_secs(seconds);
    let opened = Arc::new(AtomicUsize::new(0));
    let mut flood = Vec::new();
    for _ in 0..100 {
        flood.push(tokio::spawn(stall(daemon.addr, 200, until, opened.clone())));
    }
    // Visitors from another address, twenty a second, each on a connection
    // of its own (as distinct visitors would come).
    let visitor = reqwest::Client::builder()
        .local_address("127.0.0.2".parse::<IpAddr>().unwrap())
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let (mut served, mut failed) = (0u64, 0u64);
    let mut latencies = Vec::new();
    let (mut fds_peak, mut rss_peak) = (fds_idle, rss_idle);
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    let mut n = 0u64;
    while Instant::now() < until {
        tick.tick().await;
        let path = if n % 2 == 0 { "/" } else { "/static/download" };
        n += 1;
        let started = Instant::now();
        let ok = match visitor
            .get(format!("http://{}{path}", daemon.addr))
            .send()
            .await
        {
            Ok(resp) if resp.status().is_success() => {
                // The download's first chunk is enough.
                let mut body = resp.bytes_stream();
                matches!(body.next().await, Some(Ok(_)))
            }
            _ => false,
        };
        if ok {
            served += 1;
            latencies.push(started.elapsed());
        } else {
            failed += 1;
        }
        if n % 10 == 0 {
            let (fds, rss) = sample(pid);
            fds_peak = fds_peak.max(fds);
            rss_peak = rss_peak.max(rss);
        }
    }
    latencies.sort();
    let pct = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    for f in flood {
        f.abort();
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (fds_after, rss_after) = sample(pid);
    println!(
        "streams  {binary}: flood opened {} streams in {seconds} s; daemon descriptors {fds_idle} idle, {fds_peak} peak, {fds_after} after; \
         memory {rss_idle:.0} MB idle, {rss_peak:.0} MB peak, {rss_after:.0} MB 5 s after; \
         other visitors: {served} served, {failed} failed, p50 {:.1} ms, p99 {:.1} ms",
        opened.load(Ordering::Relaxed),
        pct(0.5),
        pct(0.99)
    );
}

async fn tunnels(binary: &str, origin: SocketAddr) {
    let daemon = start(binary, origin, "total_active_users = 1000").await;
    let page = reqwest::get(format!("http://{}/", daemon.addr))
        .await
        .unwrap();
    let cookie = page
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .unwrap_or_default()
        .to_owned();
    let mut open = Vec::new();
    for _ in 0..1200 {
        let mut req =
            tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
                format!("ws://{}/ws", daemon.addr),
            )
            .unwrap();
        req.headers_mut().insert("cookie", cookie.parse().unwrap());
        match tokio::time::timeout(
            Duration::from_secs(2),
            tokio_tungstenite::connect_async(req),
        )
        .await
        {
            Ok(Ok((ws, _))) => open.push(ws),
            _ => break,
        }
    }
    // Still open a second later?
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut alive = 0;
    for ws in &mut open {
        if ws.send("ping".into()).await.is_ok()
            && matches!(
                tokio::time::timeout(Duration::from_secs(2), ws.next()).await,
                Ok(Some(Ok(_)))
            )
        {
            alive += 1;
        }
    }
    println!(
        "tunnels  {binary}: {} opened from one address, {alive} alive (max_connections_per_ip = 512)",
        open.len()
    );
    let _ = daemon.admin;
}

/// The replayer: where a visitor stands when it replays the queue ticket
/// that led to a session that has since run out.
async fn replay(binary: &str, origin: SocketAddr) {
    let daemon = start(
        binary,
        origin,
        "total_active_users = 1\nsession_duration = \"5s\"\nrefresh_interval = \"1s\"\nabandon_after = \"120s\"",
    )
    .await;
    let addr = daemon.addr;
    let status = |cookie: String| async move {
        let client = reqwest::Client::new();
        let resp = client
            .get(format!("http://{addr}/__waitroom/status?room=shop"))
            .header("cookie", cookie)
            .send()
            .await
            .unwrap();
        let v: serde_json::Value = resp.json().await.unwrap_or_default();
        (
            v["state"].as_str().unwrap_or("").to_owned(),
            v["position"].as_u64().unwrap_or(0),
        )
    };
    let arrive = || async move {
        let resp = reqwest::Client::new()
            .get(format!("http://{addr}/"))
            .send()
            .await
            .unwrap();
        resp.headers()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .unwrap_or_default()
            .to_owned()
    };
    let _holder = arrive().await;
    let b = arrive().await;
    let others = [arrive().await, arrive().await, arrive().await];
    // B waits its turn (the holder's 5 s and its grace), polling.
    let mut b_in = false;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if status(b.clone()).await.0 == "admitted" {
            b_in = true;
            break;
        }
    }
    // B's session runs out unused (5 s and the 2 s grace); then it replays.
    tokio::time::sleep(Duration::from_secs(9)).await;
    let (state, position) = status(b.clone()).await;
    let waiting: Vec<u64> = {
        let mut v = Vec::new();
        for o in &others {
            v.push(status(o.clone()).await.1);
        }
        v
    };
    println!(
        "replay   {binary}: admitted from the queue: {b_in}; after its session ran out, its old queue ticket: {state} at position {position} (the others at {waiting:?})"
    );
}
