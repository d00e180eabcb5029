//! What one client can make the daemon hold, and what a connection can
//! carry past the gate, tried the way an attacker works: HTTP/2 frames with
//! a window held at 0 and PINGs, readers that never read, bodies that
//! trickle, upgrades on bypass and unmatched paths, tunnels, CONNECT, path
//! spellings some origins fold, a replayed queue ticket. Each against the
//! real daemon and a real origin on loopback.

#[path = "support/redis_server.rs"]
mod redis_server;
mod support;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use support::raw::{exchange, read_response, read_responses, RawResponse};
use support::{from_origin, Harness};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use waitroom::config::{Backend, Config};

const COOKIE: &str = "waitroom_shop";

fn get(target: &str, cookie: Option<&str>) -> Vec<u8> {
    let cookie = cookie.map_or(String::new(), |c| format!("Cookie: {COOKIE}={c}\r\n"));
    format!("GET {target} HTTP/1.1\r\nHost: shop.example\r\n{cookie}Connection: close\r\n\r\n")
        .into_bytes()
}

/// The room's ticket a response set.
fn ticket(resp: &RawResponse) -> String {
    let set = resp.header("set-cookie").expect("a ticket");
    let value = set.strip_prefix(&format!("{COOKIE}=")).expect("the room's");
    value.split(';').next().unwrap().to_owned()
}

/// Descriptors this process (the test, its daemon and its origin) holds.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Waits (up to `within`) for `done` to hold, polling every 20 ms.
async fn eventually(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    done()
}

/// An HTTP/2 client that never lets the daemon send a byte of body (its
/// streams' windows are 0) and pings every 200 ms to look alive.
struct Stalling {
    client: h2::client::SendRequest<Bytes>,
    /// Resolves when the daemon closes the connection.
    closed: tokio::task::JoinHandle<()>,
    pinger: tokio::task::JoinHandle<()>,
}

impl Stalling {
    async fn connect(addr: SocketAddr) -> Self {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (client, mut conn) = h2::client::Builder::new()
            .initial_window_size(0)
            .handshake::<_, Bytes>(tcp)
            .await
            .unwrap();
        let mut ping = conn.ping_pong().expect("ping_pong");
        let closed = tokio::spawn(async move {
            let _ = conn.await;
        });
        let pinger = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if ping.ping(h2::Ping::opaque()).await.is_err() {
                    return;
                }
            }
        });
        Self {
            client,
            closed,
            pinger,
        }
    }

    /// Opens `n` streams for `target` and returns the statuses of those
    /// answered within 3 s (their bodies are never taken).
    async fn open(&self, n: usize, target: &str, cookie: Option<&str>) -> Vec<u16> {
        let mut pending = Vec::new();
        for _ in 0..n {
            let Ok(mut client) = self.client.clone().ready().await else {
                break;
            };
            let mut req = http::Request::get(format!("http://shop.example{target}"));
            if let Some(c) = cookie {
                req = req.header("cookie", format!("{COOKIE}={c}"));
            }
            match client.send_request(req.body(()).unwrap(), true) {
                Ok((resp, _)) => pending.push(resp),
                Err(_) => break,
            }
        }
        let mut statuses = Vec::new();
        for resp in pending {
            if let Ok(Ok(resp)) = tokio::time::timeout(Duration::from_secs(3), resp).await {
                statuses.push(resp.status().as_u16());
                // Held, never read: its window stays 0.
                std::mem::forget(resp);
            }
        }
        statuses
    }

    fn is_closed(&self) -> bool {
        self.closed.is_finished()
    }
}

impl Drop for Stalling {
    fn drop(&mut self) {
        self.closed.abort();
        self.pinger.abort();
    }
}

/// A flood of HTTP/2 streams whose windows stay at 0 (ten connections of
/// a hundred streams from one address, pinging): the address holds at
/// most its stream budget at the origin, the rest is answered 429 at
/// once; another client is served meanwhile; and a send timeout later the
/// flood's connections are closed, PINGs or not, and what they held at the
/// origin with them. Without the budget the flood held 1,000 origin
/// connections; without the send timeout, all of them for as long as it
/// pinged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stalled_http2_streams_hold_a_budget_for_a_send_timeout() {
    const BUDGET: usize = 40;
    let h = Harness::start(|c| {
        c.server.max_streams_per_ip = BUDGET;
        c.server.send_timeout = Duration::from_secs(1);
        c.server.header_read_timeout = Duration::from_secs(1);
        c.rooms[0].bypass_paths = vec!["/download".into()];
    })
    .await;
    let addr = h.daemon.addr;
    let fds_before = open_fds();

    let mut flood = Vec::new();
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let conn = Stalling::connect(addr).await;
        statuses.extend(conn.open(100, "/download?bytes=100000000", None).await);
        flood.push(conn);
    }
    let served = statuses.iter().filter(|s| **s == 200).count();
    let refused = statuses.iter().filter(|s| **s == 429).count();
    let held = h.origin.open.load(Ordering::SeqCst);
    let fds_during = open_fds();
    assert!(served <= BUDGET, "{served} streams served");
    assert!(
        refused >= 1000 - BUDGET - 10,
        "the rest refused at once: {refused} of {}",
        statuses.len()
    );
    assert!(held <= BUDGET, "origin connections held: {held}");
    assert!(
        // Both ends of each connection are this process's.
        fds_during <= fds_before + 2 * 10 + 2 * BUDGET + 40,
        "descriptors {fds_before} -> {fds_during}"
    );

    // Another client is served while the flood holds.
    let other = reqwest::Client::builder()
        .local_address("127.0.0.2".parse::<IpAddr>().unwrap())
        .cookie_store(true)
        .build()
        .unwrap();
    for i in 0..20 {
        let path = if i % 2 == 0 {
            "/download?bytes=1000"
        } else {
            "/"
        };
        let resp = other.get(h.url(path)).send().await.unwrap();
        assert!(from_origin(&resp), "{path}: {}", resp.status());
        resp.bytes().await.unwrap();
    }

    // A send timeout (and the GOAWAY's grace) later, every flood connection
    // is closed though it pings, and the origin connections are let go.
    assert!(
        eventually(Duration::from_secs(6), || flood
            .iter()
            .all(Stalling::is_closed))
        .await,
        "{} of 10 still open",
        flood.iter().filter(|c| !c.is_closed()).count()
    );
    assert!(
        eventually(Duration::from_secs(3), || h
            .origin
            .open
            .load(Ordering::SeqCst)
            <= 4)
        .await,
        "origin connections still open: {}",
        h.origin.open.load(Ordering::SeqCst)
    );
}

/// One admitted visitor (in a room of one) holds no more streams than its
/// address's budget, whatever it asks for with its cookie.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_admitted_cookie_holds_its_budget_not_more() {
    const BUDGET: usize = 20;
    let h = Harness::start(|c| {
        c.server.max_streams_per_ip = BUDGET;
        c.server.send_timeout = Duration::from_secs(30);
        c.rooms[0].total_active_users = 1;
    })
    .await;
    let admitted = exchange(h.daemon.addr, &get("/", None)).await;
    assert!(admitted.answered_by_origin());
    let cookie = ticket(&admitted);
    let mut statuses = Vec::new();
    let mut conns = Vec::new();
    for _ in 0..2 {
        let conn = Stalling::connect(h.daemon.addr).await;
        statuses.extend(
            conn.open(100, "/download?bytes=100000000", Some(&cookie))
                .await,
        );
        conns.push(conn);
    }
    let served = statuses.iter().filter(|s| **s == 200).count();
    assert!(served <= BUDGET, "{served} of {}", statuses.len());
    // (And the admission's connection, idle in the pool.)
    assert!(h.origin.open.load(Ordering::SeqCst) <= BUDGET + 1);
}

/// An HTTP/2 connection with no request in flight is closed after the
/// header timeout, however often it pings or sends SETTINGS.
#[tokio::test]
async fn pings_keep_no_http2_connection_alive() {
    let h = Harness::start(|c| c.server.header_read_timeout = Duration::from_millis(500)).await;
    let conn = Stalling::connect(h.daemon.addr).await;
    let started = Instant::now();
    assert!(eventually(Duration::from_secs(5), || conn.is_closed()).await);
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(400), "{took:?}");

    // Nor do streams that were all refused (429s whose bodies wait on a
    // window at 0) keep it open.
    let h = Harness::start(|c| {
        c.server.header_read_timeout = Duration::from_millis(500);
        c.server.max_streams_per_ip = 1;
    })
    .await;
    let holder = Stalling::connect(h.daemon.addr).await;
    holder.open(1, "/download?bytes=100000000", None).await;
    let refused = Stalling::connect(h.daemon.addr).await;
    assert_eq!(
        refused.open(5, "/download?bytes=100000000", None).await,
        vec![429; 5]
    );
    assert!(eventually(Duration::from_secs(5), || refused.is_closed()).await);
}

/// A reader that never reads is cut off a send timeout after its socket
/// fills, and its origin connection with it (it held both, and about a
/// megabyte, for as long as it liked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_never_reads_is_cut_off() {
    let h = Harness::start(|c| c.server.send_timeout = Duration::from_millis(500)).await;
    let mut s = TcpStream::connect(h.daemon.addr).await.unwrap();
    s.write_all(&get("/download?bytes=500000000", None))
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(2), || h
            .origin
            .open
            .load(Ordering::SeqCst)
            == 1)
        .await
    );
    // The socket fills; then nothing is read for a while.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        eventually(Duration::from_secs(3), || h
            .origin
            .open
            .load(Ordering::SeqCst)
            == 0)
        .await,
        "the origin connection is let go"
    );
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return true,
                Ok(n) => got += n,
            }
        }
    })
    .await;
    assert_eq!(closed, Ok(true), "closed by the daemon");
    assert!(got < 500_000_000, "{got} bytes before the close");
}

/// A request body that trickles (a byte every 300 ms) gets 408 once its
/// allowance (`request_body_timeout` plus a second per
/// `request_body_min_rate` bytes) runs out, on HTTP/1 and on HTTP/2, and
/// the origin connection it held is closed. A fast upload of the same size
/// passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickling_request_bodies_get_408() {
    let h = Harness::start(|c| {
        c.server.request_body_timeout = Duration::from_secs(1);
        c.server.request_body_min_rate = 500;
    })
    .await;
    // HTTP/1: a byte every 300 ms until the daemon answers.
    let mut s = TcpStream::connect(h.daemon.addr).await.unwrap();
    s.write_all(b"POST /upload HTTP/1.1\r\nHost: shop.example\r\nContent-Length: 100\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let answer = loop {
        assert!(started.elapsed() < Duration::from_secs(6), "never answered");
        tokio::select! {
            readable = s.readable() => {
                if readable.is_ok() {
                    break read_response(&mut s).await;
                }
            }
            () = tokio::time::sleep(Duration::from_millis(300)) => {
                let _ = s.write_all(b"x").await;
            }
        }
    };
    assert_eq!(answer.status, 408, "{answer:?}");
    assert!(
        eventually(Duration::from_secs(2), || h
            .origin
            .open
            .load(Ordering::SeqCst)
            <= 1)
        .await
    );

    // HTTP/2: one stream of the same.
    let tcp = TcpStream::connect(h.daemon.addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let req = http::Request::post("http://shop.example/upload")
        .header("content-length", "100")
        .body(())
        .unwrap();
    let (resp, mut body) = client.send_request(req, false).unwrap();
    let dribble = tokio::spawn(async move {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if body.send_data(Bytes::from_static(b"x"), false).is_err() {
                break;
            }
        }
    });
    let resp = tokio::time::timeout(Duration::from_secs(5), resp)
        .await
        .expect("answered within its allowance")
        .unwrap();
    assert_eq!(resp.status(), 408);
    dribble.abort();
    conn.abort();

    // A fast upload of a megabyte passes.
    let resp = h
        .bare()
        .post(h.url("/upload"))
        .body(vec![b'x'; 1 << 20])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.text().await.unwrap(), (1 << 20).to_string());
}

/// Fills the room of one; returns the holder's ticket.
async fn fill(h: &Harness) -> String {
    let holder = exchange(h.daemon.addr, &get("/", None)).await;
    assert!(holder.answered_by_origin());
    ticket(&holder)
}

/// `request` then, on the same connection, `then`: both responses.
async fn pipelined(addr: SocketAddr, request: &[u8], then: &[u8]) -> (RawResponse, RawResponse) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&[request, then].concat()).await.unwrap();
    let mut both = read_responses(&mut s, 2).await;
    let second = both.pop().unwrap();
    (both.pop().unwrap(), second)
}

const H2C: &str = "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n";
const WEBSOCKET: &str = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";

fn upgrade_request(target: &str, upgrade: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nHost: shop.example\r\n{upgrade}\r\n").into_bytes()
}

/// With the room full, an upgrade on a bypass path (h2c, or a WebSocket
/// on a path that is not the room's) reaches the origin as a plain
/// request, and the request written after it on the same connection is the
/// daemon's to gate: the queue page, never the origin. `HTTP2-Settings`
/// never reaches the origin. (Before, the origin's 101 made the connection
/// a raw tunnel that carried requests for any path.)
#[tokio::test]
async fn upgrades_on_bypass_and_unmatched_paths_do_not_tunnel() {
    let h = Harness::start(|c| {
        c.rooms[0].total_active_users = 1;
        c.rooms[0].path = "/shop/".into();
        c.rooms[0].bypass_paths = vec!["/shop/static/".into()];
    })
    .await;
    let _holder = exchange(h.daemon.addr, &get("/shop/", None)).await;
    let secret = b"GET /shop/secret HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n";
    for (target, upgrade) in [
        ("/shop/static/app.js", H2C),
        ("/shop/static/app.js", WEBSOCKET),
        ("/elsewhere", H2C),
        ("/elsewhere", WEBSOCKET),
    ] {
        let (first, second) =
            pipelined(h.daemon.addr, &upgrade_request(target, upgrade), secret).await;
        assert_eq!(first.status, 200, "{target} {upgrade:?}: {first:?}");
        let seen = &first.echo()["headers"];
        for header in ["upgrade", "http2-settings"] {
            assert!(
                seen.get(header).is_none(),
                "{target}: {header} reached the origin"
            );
        }
        assert!(!second.answered_by_origin(), "{target}: {second:?}");
        assert_eq!(second.status, 200, "the queue page");
    }
    assert!(h.origin.tunneled.lock().unwrap().is_empty());
}

/// Operators may let WebSockets through bypass and unmatched paths; h2c
/// never passes, there or for an admitted visitor.
#[tokio::test]
async fn upgrades_pass_where_the_operator_lets_them_and_never_h2c() {
    let h = Harness::start(|c| {
        c.rooms[0].path = "/shop/".into();
        c.rooms[0].bypass_paths = vec!["/shop/static/".into()];
        c.rooms[0].bypass_upgrades = true;
        c.server.unmatched_upgrades = true;
    })
    .await;
    for target in ["/shop/static/live", "/elsewhere"] {
        let mut s = TcpStream::connect(h.daemon.addr).await.unwrap();
        s.write_all(&upgrade_request(target, WEBSOCKET))
            .await
            .unwrap();
        let resp = read_response(&mut s).await;
        assert_eq!(resp.status, 101, "{target}");
        s.write_all(b"through").await.unwrap();
        assert!(
            eventually(Duration::from_secs(2), || {
                let log = h.origin.tunneled.lock().unwrap();
                log.windows(7).any(|w| w == b"through")
            })
            .await
        );
        h.origin.tunneled.lock().unwrap().clear();
        let (first, _) = pipelined(
            h.daemon.addr,
            &upgrade_request(target, H2C),
            &get("/x", None),
        )
        .await;
        assert_eq!(first.status, 200, "{target}: h2c is never passed");
    }
    let admitted = exchange(h.daemon.addr, &get("/shop/", None)).await;
    let cookie = format!("Cookie: {COOKIE}={}\r\n{H2C}", ticket(&admitted));
    let (first, _) = pipelined(
        h.daemon.addr,
        &upgrade_request("/shop/", &cookie),
        &get("/x", None),
    )
    .await;
    assert_eq!(first.status, 200, "{first:?}");
    assert!(h.origin.tunneled.lock().unwrap().is_empty());
}

async fn websocket(
    addr: SocketAddr,
    cookie: &str,
) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>> {
    let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        format!("ws://{addr}/ws"),
    )
    .unwrap();
    req.headers_mut()
        .insert("cookie", format!("{COOKIE}={cookie}").parse().unwrap());
    let (ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .expect("upgrade through the proxy");
    ws
}

/// Whether the daemon closes the tunnel within `within`.
async fn tunnel_closes<S>(ws: &mut S, within: Duration) -> bool
where
    S: futures::Stream<
            Item = Result<
                tokio_tungstenite::tungstenite::Message,
                tokio_tungstenite::tungstenite::Error,
            >,
        > + Unpin,
{
    matches!(
        tokio::time::timeout(within, async {
            loop {
                match ws.next().await {
                    None | Some(Err(_)) => return,
                    Some(Ok(m)) if m.is_close() => return,
                    Some(Ok(_)) => {}
                }
            }
        })
        .await,
        Ok(())
    )
}

/// A tunnel keeps its connection's place under the per-address cap for its
/// whole life (1,200 were held from one address with a cap of 512), and is
/// closed once it carries nothing for the idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_hold_their_place_and_close_when_idle() {
    let h = Harness::start(|c| {
        c.server.max_connections_per_ip = 4;
        c.server.tunnel_idle_timeout = Duration::from_millis(800);
    })
    .await;
    let admitted = exchange(h.daemon.addr, &get("/", None)).await;
    let cookie = ticket(&admitted);
    let mut tunnels = Vec::new();
    for _ in 0..4 {
        tunnels.push(websocket(h.daemon.addr, &cookie).await);
    }
    // The address's four places are the tunnels': a fifth is closed at once.
    let mut fifth = TcpStream::connect(h.daemon.addr).await.unwrap();
    let mut sink = Vec::new();
    let refused =
        tokio::time::timeout(Duration::from_millis(500), fifth.read_to_end(&mut sink)).await;
    assert!(refused.is_ok(), "over the cap: closed at once");

    // One keeps talking; the others go quiet and are closed.
    let mut talker = tunnels.remove(0);
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(2000) {
        talker.send("ping".into()).await.unwrap();
        let echoed = talker.next().await.unwrap().unwrap();
        assert_eq!(echoed.into_text().unwrap(), "ping");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for mut quiet in tunnels {
        assert!(tunnel_closes(&mut quiet, Duration::from_secs(2)).await);
    }
    // Their places are free again.
    let resp = exchange(h.daemon.addr, &get("/", Some(&cookie))).await;
    assert!(resp.answered_by_origin());
}

/// A tunnel ends with the session that opened it: at once when the origin
/// revokes it or the admin API releases it on this instance; at its next
/// check-in when another instance ended it. (A revoked visitor's tunnel
/// kept carrying traffic while its place went to the next in line.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_end_with_their_session() {
    let store: waitroom::store::SharedStore =
        std::sync::Arc::new(waitroom::store::memory::MemoryStore::new());
    let short = |c: &mut Config| {
        c.rooms[0].session_duration = Duration::from_secs(4);
        c.server.tunnel_idle_timeout = Duration::from_secs(60);
    };
    let a = Harness::start_with_store(short, Some(store.clone())).await;
    let b = Harness::start_with_store(short, Some(store)).await;

    // The origin's revoke.
    let cookie = ticket(&exchange(a.daemon.addr, &get("/", None)).await);
    let mut ws = websocket(a.daemon.addr, &cookie).await;
    let revoked = exchange(a.daemon.addr, &get("/revoke", Some(&cookie))).await;
    assert!(revoked.answered_by_origin());
    assert!(
        tunnel_closes(&mut ws, Duration::from_millis(500)).await,
        "revoke"
    );

    // The admin API's release on this instance.
    let admitted = exchange(a.daemon.addr, &get("/", None)).await;
    let visitor = admitted.echo()["headers"]["x-waitroom-visitor"][0]
        .as_str()
        .unwrap()
        .to_owned();
    let mut ws = websocket(a.daemon.addr, &ticket(&admitted)).await;
    let release = |h: &Harness| {
        h.bare()
            .post(h.admin_url("/api/rooms/shop/release"))
            .json(&serde_json::json!({ "visitor": visitor }))
            .send()
    };
    assert!(release(&a).await.unwrap().status().is_success());
    assert!(
        tunnel_closes(&mut ws, Duration::from_millis(500)).await,
        "release here"
    );

    // A release on the other instance: closed at the tunnel's check-in (a
    // quarter of the 4 s session).
    let admitted = exchange(a.daemon.addr, &get("/", None)).await;
    let visitor = admitted.echo()["headers"]["x-waitroom-visitor"][0]
        .as_str()
        .unwrap()
        .to_owned();
    let mut ws = websocket(a.daemon.addr, &ticket(&admitted)).await;
    ws.send("still here".into()).await.unwrap();
    assert!(ws.next().await.unwrap().is_ok());
    let released = b
        .bare()
        .post(b.admin_url("/api/rooms/shop/release"))
        .json(&serde_json::json!({ "visitor": visitor }))
        .send()
        .await
        .unwrap();
    assert!(released.status().is_success());
    assert!(
        tunnel_closes(&mut ws, Duration::from_secs(3)).await,
        "release elsewhere"
    );
}

/// After a session ends by expiry, the queue ticket held before the
/// admission makes its holder a newcomer at the back, on memory and on
/// Redis (it was put back at the head: `B B 3 B B 4`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_queue_ticket_of_a_finished_session_waits_at_the_back() {
    let server = tokio::task::spawn_blocking(redis_server::RedisServer::start)
        .await
        .unwrap();
    for redis in [false, true] {
        let h = Harness::start(|c| {
            c.rooms[0].total_active_users = 1;
            c.rooms[0].session_duration = Duration::from_secs(5);
            c.rooms[0].abandon_after = Duration::from_secs(120);
            if redis {
                c.store.backend = Backend::Redis {
                    urls: vec![server.url()],
                };
                c.store.timeout = Duration::from_millis(500);
            }
        })
        .await;
        fill(&h).await;
        let b = exchange(h.daemon.addr, &get("/", None)).await;
        assert!(!b.answered_by_origin());
        let b_queue_ticket = ticket(&b);
        let c = exchange(h.daemon.addr, &get("/", None)).await;
        let c_ticket = ticket(&c);
        // The holder's session runs out (5 s, and the promoted grace); B
        // polls and is let in.
        h.clock.advance(Duration::from_secs(16));
        let b_in = exchange(h.daemon.addr, &get("/", Some(&b_queue_ticket))).await;
        assert!(b_in.answered_by_origin(), "redis {redis}: {b_in:?}");
        // B's session runs out unused (5 s plus the grace of two refreshes).
        h.clock.advance(Duration::from_secs(16));
        let replay = exchange(
            h.daemon.addr,
            &get("/__waitroom/status?room=shop", Some(&b_queue_ticket)),
        )
        .await;
        let standing = replay.echo();
        assert_ne!(standing["state"], "admitted", "redis {redis}: {standing}");
        // C, who waited, goes first.
        let c_in = exchange(h.daemon.addr, &get("/", Some(&c_ticket))).await;
        assert!(c_in.answered_by_origin(), "redis {redis}: {c_in:?}");
        let again = exchange(h.daemon.addr, &get("/", Some(&b_queue_ticket))).await;
        assert!(!again.answered_by_origin(), "redis {redis}");
        h.daemon.shutdown().await;
    }
}

/// The check-in interval follows the session duration in force: after an
/// operator shortens the session to 4 s (the file says 5 m, whose interval
/// is 60 s), a visitor who makes a request every second keeps its session.
/// (It lost it at 4 s: its ticket was not due to check in before then.)
#[tokio::test]
async fn a_runtime_session_change_keeps_active_visitors() {
    let h = Harness::start(|c| c.rooms[0].session_duration = Duration::from_secs(300)).await;
    let changed = h
        .bare()
        .patch(h.admin_url("/api/rooms/shop"))
        .json(&serde_json::json!({ "session_duration": "4s" }))
        .send()
        .await
        .unwrap();
    assert!(
        changed.status().is_success(),
        "{}",
        changed.text().await.unwrap()
    );
    let visitor = h.visitor();
    let first = support::admitted_id(visitor.get(h.url("/")).send().await.unwrap()).await;
    for second in 1..=12 {
        h.clock.advance(Duration::from_secs(1));
        let resp = visitor.get(h.url("/")).send().await.unwrap();
        let id = support::admitted_id(resp).await;
        assert_eq!(id, first, "the same session at {second} s");
    }
}

/// `CONNECT` is never forwarded, with or without an admitted ticket.
#[tokio::test]
async fn connect_gets_405() {
    let h = Harness::start(|_| {}).await;
    let admitted = exchange(h.daemon.addr, &get("/", None)).await;
    let cookie = ticket(&admitted);
    for target in ["/shop", "shop.example:443"] {
        let req = format!(
            "CONNECT {target} HTTP/1.1\r\nHost: shop.example\r\nCookie: {COOKIE}={cookie}\r\nConnection: close\r\n\r\n"
        );
        let resp = exchange(h.daemon.addr, req.as_bytes()).await;
        assert!(!resp.answered_by_origin(), "{target}");
        assert!(matches!(resp.status, 405 | 400), "{target}: {resp:?}");
        if target.starts_with('/') {
            assert_eq!(resp.status, 405);
            assert!(resp.header("allow").is_some());
        }
    }
}

/// Spellings some origins fold into another path are refused with 400:
/// double encoding, colons (NTFS streams), invisible and non-ASCII space
/// characters, full-width separators, and in a case-insensitive room,
/// non-ASCII letters whose case is ASCII and Windows short names. Paths in
/// other scripts, and what the operator allows, pass.
#[tokio::test]
async fn foldable_spellings_are_refused() {
    let h = Harness::start(|c| {
        c.rooms[0].total_active_users = 1000;
        let mut admin = support::room("admin", "/admin/");
        admin.case_insensitive_paths = true;
        c.rooms.push(admin);
    })
    .await;
    for target in [
        "/%252e%252e/secret",
        "/%2573hop",
        "/shop::$DATA",
        "/shop%3A%3A$DATA",
        "/shop%EF%BC%9A",
        "/static%EF%BC%8F..%EF%BC%8Fshop",
        "/static%EF%BC%8E%EF%BC%8E/shop",
        "/shop%E2%80%8B",
        "/shop%C2%A0",
        "/shop%E3%80%80",
        "/shop%EF%BB%BF",
        "/shop%E2%80%AE",
        "/%EF%BD%93hop",
        "/Adm%C4%B1n/",
        "/%C5%BFhop",
        "/ADMIN~1/",
        "/shop%E2%80%A4%E2%80%A4/",
    ] {
        let resp = exchange(h.daemon.addr, &get(target, None)).await;
        assert_eq!(resp.status, 400, "{target}: {resp:?}");
        assert!(!resp.answered_by_origin(), "{target}");
    }
    for target in [
        "/caf%C3%A9",
        "/%E6%97%A5%E6%9C%AC/%E3%82%AB%E3%82%BF",
        "/%D0%BC%D0%B0%D0%B3%D0%B0%D0%B7%D0%B8%D0%BD",
        "/~user/page",
        "/shop?q=a:b",
        "/100%25",
    ] {
        let resp = exchange(h.daemon.addr, &get(target, None)).await;
        assert!(resp.answered_by_origin(), "{target}: {resp:?}");
    }
    let h = Harness::start(|c| c.server.allow_path_colons = true).await;
    let resp = exchange(h.daemon.addr, &get("/api/items:batchGet", None)).await;
    assert!(resp.answered_by_origin(), "{resp:?}");
}

/// New tickets per address are counted by the /64 for IPv6: a client that
/// cycles through the addresses of its prefix shares one limit.
#[tokio::test]
async fn ipv6_clients_are_limited_by_their_64() {
    let h = Harness::start(|c| {
        c.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        c.server.ip_arrival_burst = 2;
        c.server.ip_arrivals_per_second = 1;
    })
    .await;
    let from = |client: &str| {
        format!(
            "GET / HTTP/1.1\r\nHost: shop.example\r\nX-Forwarded-For: {client}\r\nConnection: close\r\n\r\n"
        )
    };
    for client in ["2001:db8::1", "2001:db8::2"] {
        let resp = exchange(h.daemon.addr, from(client).as_bytes()).await;
        assert!(resp.answered_by_origin(), "{client}");
    }
    let resp = exchange(h.daemon.addr, from("2001:db8::ffff:3").as_bytes()).await;
    assert_eq!(resp.status, 429, "the same /64");
    let resp = exchange(h.daemon.addr, from("2001:db8:0:1::1").as_bytes()).await;
    assert!(resp.answered_by_origin(), "another /64");
}

/// The admin listener has the visitor listener's HTTP/2 watch and a cap
/// per address: silent HTTP/2 connections are closed after the header
/// timeout, and past the cap new ones are refused at once (1,500 silent
/// ones were held, sharing the visitors' descriptors).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_drops_silent_http2_and_caps_addresses() {
    let h = Harness::start(|c| c.server.header_read_timeout = Duration::from_millis(500)).await;
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    let mut held = Vec::new();
    for _ in 0..64 {
        let mut s = TcpStream::connect(h.daemon.admin_addr).await.unwrap();
        s.write_all(preface).await.unwrap();
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut over = TcpStream::connect(h.daemon.admin_addr).await.unwrap();
    let mut sink = Vec::new();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), over.read_to_end(&mut sink))
            .await
            .is_ok(),
        "over the cap: closed at once"
    );
    for mut s in held {
        let closed = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut sink)).await;
        assert!(closed.is_ok(), "a silent HTTP/2 connection is closed");
    }
    // The API answers again.
    let resp = h
        .bare()
        .get(h.admin_url("/api/rooms"))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
}
