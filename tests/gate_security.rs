//! Nobody walks around the gate (docs/how-it-works.md, "Canonical
//! matching"): every spelling of a protected URL, Host or client address
//! that a bot might try is sent as raw bytes to a full room, in front of an
//! origin that normalizes paths the way nginx does. Each one is queued or
//! refused with 400; none reaches the origin as the protected page without
//! a ticket.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::raw::{exchange, RawResponse};
use support::{from_origin, set_cookie, Harness, KEY, T0};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use waitroom::config::Secret32;
use waitroom::ticket::{Grant, KeyRing};

const COOKIE: &str = "waitroom_shop";

/// What the gate must do with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// Queue page (the room is full), never the origin.
    Queued,
    /// 400 before any room is consulted.
    Refused,
    /// Forwarded, and the origin serves this path.
    Served(&'static str),
}

fn get(target: &str, host: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").into_bytes()
}

#[track_caller]
fn check(resp: &RawResponse, expect: Expect, what: &str) {
    match expect {
        Expect::Queued => {
            assert!(
                !resp.answered_by_origin(),
                "{what}: reached the origin: {resp:?}"
            );
            assert_eq!(resp.status, 200, "{what}: {resp:?}");
            assert!(
                resp.body.contains("wr-position"),
                "{what}: not the queue page"
            );
        }
        Expect::Refused => {
            assert!(
                !resp.answered_by_origin(),
                "{what}: reached the origin: {resp:?}"
            );
            assert_eq!(resp.status, 400, "{what}: {resp:?}");
        }
        Expect::Served(path) => {
            assert!(resp.answered_by_origin(), "{what}: not forwarded: {resp:?}");
            assert_eq!(resp.served().as_deref(), Some(path), "{what}");
        }
    }
}

/// A daemon whose room takes one visitor, with that visitor inside.
async fn full(
    tweak: impl FnOnce(&mut waitroom::config::Config),
    host: &str,
    path: &str,
) -> Harness {
    let h = Harness::start(|c| {
        c.rooms[0].total_active_users = 1;
        c.rooms[0].abandon_after = Duration::from_secs(600);
        tweak(c);
    })
    .await;
    let inside = exchange(h.daemon.addr, &get(path, host)).await;
    assert!(
        inside.answered_by_origin(),
        "the first visitor gets in: {inside:?}"
    );
    h
}

#[tokio::test]
async fn every_spelling_of_a_protected_path_meets_the_room() {
    let h = full(
        |c| c.rooms[0].path = "/shop".into(),
        "shop.example",
        "/shop",
    )
    .await;
    use Expect::*;
    for (target, expect) in [
        ("/shop", Queued),
        ("//shop", Queued),
        ("///shop/checkout", Queued),
        ("/%73hop", Queued),
        ("/%73%68%6f%70/cart", Queued),
        ("/./shop", Queued),
        ("/x/../shop", Queued),
        ("/x/%2e%2e/shop", Queued),
        ("/x/.%2E/shop", Queued),
        ("/shop/.", Queued),
        ("/shop;jsessionid=1", Queued),
        ("/shop;x/cart", Queued),
        ("/;/shop", Queued),
        ("/;jsessionid=1/shop/cart", Queued),
        ("//;x/shop", Queued),
        ("/shop.", Queued),
        ("/shop%20", Queued),
        ("/shop.%20/cart", Queued),
        ("/.../shop", Queued),
        ("/shop%2fcart", Refused),
        ("/shop%2Fcart", Refused),
        ("/shop%5ccart", Refused),
        ("/shop\\cart", Refused),
        ("/shop%00", Refused),
        ("/x/..;/shop", Refused),
        ("/../shop", Refused),
        ("/%2e%2e/shop", Refused),
        ("/%c0%afshop", Refused),
        ("http://shop.example//shop", Queued),
        ("http://shop.example/x/../shop", Queued),
        ("*", Refused),
        // Not the room, and served as what it is.
        ("/shopping", Served("/shopping")),
        ("/other//page", Served("/other/page")),
        ("/SHOP", Served("/SHOP")),
    ] {
        let resp = exchange(h.daemon.addr, &get(target, "shop.example")).await;
        check(&resp, expect, target);
    }
}

#[tokio::test]
async fn case_insensitive_rooms_match_every_case() {
    let h = full(
        |c| {
            c.rooms[0].path = "/shop".into();
            c.rooms[0].case_insensitive_paths = true;
            c.rooms[0].bypass_paths = vec!["/shop/static/".into()];
        },
        "shop.example",
        "/shop",
    )
    .await;
    use Expect::*;
    for (target, expect) in [
        ("/SHOP", Queued),
        ("/Shop/Cart", Queued),
        ("/%53HOP", Queued),
        ("/SHOPPING", Served("/SHOPPING")),
        ("/SHOP/STATIC/app.js", Served("/SHOP/STATIC/app.js")),
    ] {
        let resp = exchange(h.daemon.addr, &get(target, "shop.example")).await;
        check(&resp, expect, target);
    }
}

#[tokio::test]
async fn bypass_paths_cover_whole_segments_of_the_canonical_path() {
    let h = full(
        |c| {
            c.rooms[0].bypass_paths =
                vec!["/static/".into(), "/robots.txt".into(), "/assets".into()]
        },
        "shop.example",
        "/shop",
    )
    .await;
    use Expect::*;
    for (target, expect) in [
        ("/static/app.js", Served("/static/app.js")),
        ("/static//app.js", Served("/static/app.js")),
        ("/robots.txt", Served("/robots.txt")),
        ("/assets", Served("/assets")),
        ("/assets/logo.png", Served("/assets/logo.png")),
        ("/static/../shop", Queued),
        ("/static/%2e%2e/shop", Queued),
        ("/static/./../shop", Queued),
        ("/static;x/../shop", Queued),
        ("/static/..%2fshop", Refused),
        ("/static/..%5cshop", Refused),
        ("/static/..;/shop", Refused),
        ("/assetsX", Queued),
        ("/robots.txt.php", Queued),
        ("/robots.txt/../shop", Queued),
        // The match key folds these into /static/...; an origin that does
        // not fold them serves them elsewhere: no bypass.
        ("/static./shop", Queued),
        ("/static;/checkout", Queued),
        ("/static%20/x", Queued),
        ("/static../admin", Queued),
        ("/static.%20./shop", Queued),
        ("/robots.txt.", Queued),
    ] {
        let resp = exchange(h.daemon.addr, &get(target, "shop.example")).await;
        check(&resp, expect, target);
    }
}

#[tokio::test]
async fn every_spelling_of_the_host_meets_the_room() {
    let h = full(
        |c| c.rooms[0].host = Some("shop.example.com".into()),
        "shop.example.com",
        "/",
    )
    .await;
    use Expect::*;
    let addr = h.daemon.addr;
    for (host, expect) in [
        ("shop.example.com", Queued),
        ("Shop.Example.com.", Queued),
        ("SHOP.EXAMPLE.COM", Queued),
        ("shop.example.com.:8080", Queued),
        ("shop.example.com:80", Queued),
        ("other.example", Served("/")),
        ("", Refused),
        ("shop.example.com:x", Refused),
        ("shop.example.com@evil", Refused),
        ("shop..example.com", Refused),
        ("shop.example.com/x", Refused),
    ] {
        check(&exchange(addr, &get("/", host)).await, expect, host);
    }
    for (request, expect, what) in [
        (&b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n"[..], Refused, "HTTP/1.1 without Host"),
        (b"GET / HTTP/1.0\r\n\r\n", Refused, "HTTP/1.0 without Host"),
        (
            b"GET / HTTP/1.1\r\nHost: other.example\r\nHost: shop.example.com\r\nConnection: close\r\n\r\n",
            Refused,
            "two Host headers",
        ),
        (
            b"GET http://shop.example.com/ HTTP/1.1\r\nHost: other.example\r\nConnection: close\r\n\r\n",
            Refused,
            "absolute form against another Host",
        ),
        (
            b"GET http://SHOP.example.com./ HTTP/1.1\r\nHost: shop.example.com\r\nConnection: close\r\n\r\n",
            Queued,
            "absolute form agreeing with Host",
        ),
        (
            b"GET ftp://shop.example.com/ HTTP/1.1\r\nHost: shop.example.com\r\nConnection: close\r\n\r\n",
            Refused,
            "absolute form with another scheme",
        ),
    ] {
        check(&exchange(addr, request).await, expect, what);
    }
    // The origin receives the canonical host.
    let served = exchange(addr, &get("/", "Other.Example.:81")).await;
    assert_eq!(served.echo()["headers"]["host"][0], "other.example:81");
    assert_eq!(
        served.echo()["headers"]["x-forwarded-host"][0],
        "other.example:81"
    );
}

#[tokio::test]
async fn a_forwarded_for_hop_that_is_not_an_address_ends_the_walk() {
    let h = full(
        |c| {
            c.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
            c.rooms[0].bypass_ips = vec!["10.9.9.9/32".parse().unwrap()];
        },
        "shop.example",
        "/",
    )
    .await;
    let with_xff = |xff: &str| {
        format!("GET / HTTP/1.1\r\nHost: shop.example\r\nX-Forwarded-For: {xff}\r\nConnection: close\r\n\r\n")
            .into_bytes()
    };
    for xff in [
        "10.9.9.9, 198.51.100.7:4711",
        "10.9.9.9, unknown",
        "10.9.9.9, [2001:db8::1]:4711",
        "10.9.9.9, [2001:db8::1]",
        "10.9.9.9, _hidden",
        "10.9.9.9,",
        "10.9.9.9, 198.51.100.7",
    ] {
        check(
            &exchange(h.daemon.addr, &with_xff(xff)).await,
            Expect::Queued,
            xff,
        );
    }
    // The bypass address itself, as the last untrusted hop, is let through.
    for xff in ["10.9.9.9", "6.6.6.6, 10.9.9.9"] {
        check(
            &exchange(h.daemon.addr, &with_xff(xff)).await,
            Expect::Served("/"),
            xff,
        );
    }
}

#[tokio::test]
async fn visitors_cannot_speak_for_the_daemon_to_the_origin() {
    let h = Harness::start(|_| {}).await;
    let v = h.visitor();
    let first = v.get(h.url("/")).send().await.unwrap();
    let ticket = set_cookie(&first, COOKIE).unwrap();
    let id = support::admitted_id(first).await.to_hex();
    let request = format!(
        "GET /page HTTP/1.1\r\nHost: shop.example\r\nCookie: {COOKIE}={ticket}\r\n\
         Connection: close, x-waitroom-visitor, x-forwarded-for\r\n\
         X-Waitroom-Visitor: forged\r\nX_Waitroom_Visitor: forged\r\nX-WAITROOM_SIGNATURE: forged\r\n\
         X_Forwarded_For: 10.9.9.9\r\nForwarded: for=10.9.9.9\r\nX-Real-IP: 10.9.9.9\r\n\
         X-Forwarded-Uri: /shop\r\nX-Forwarded-Ssl: on\r\nX-Forwarded-Scheme: https\r\n\
         X-Original-URL: /shop\r\nX-Rewrite-URL: /shop\r\nX-Original-URI: /shop\r\n\
         X-Client-IP: 10.9.9.9\r\nTrue-Client-IP: 10.9.9.9\r\nX-Host: shop.example\r\n\r\n"
    );
    let resp = exchange(h.daemon.addr, request.as_bytes()).await;
    assert!(resp.answered_by_origin(), "{resp:?}");
    let headers = &resp.echo()["headers"];
    assert_eq!(headers["x-waitroom-visitor"], serde_json::json!([id]));
    for name in [
        "x_waitroom_visitor",
        "x-waitroom_signature",
        "x_forwarded_for",
        "forwarded",
        "x-real-ip",
        "x-forwarded-uri",
        "x-forwarded-ssl",
        "x-forwarded-scheme",
        "x-original-url",
        "x-rewrite-url",
        "x-original-uri",
        "x-client-ip",
        "true-client-ip",
        "x-host",
    ] {
        assert!(
            headers.get(name).is_none(),
            "{name} reached the origin: {headers}"
        );
    }
    assert_eq!(headers["x-forwarded-for"], serde_json::json!(["127.0.0.1"]));
    assert!(
        headers.get("cookie").is_none(),
        "our cookie never reaches the origin"
    );
}

#[tokio::test]
async fn small_ones_status_without_ticket_bad_bodies_and_long_lines() {
    let h = Harness::start(|_| {}).await;
    // A status call without a ticket holds nothing: "none", not "admitted".
    let status: serde_json::Value = h
        .bare()
        .get(h.url("/__waitroom/status?room=shop"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["state"], "none");

    // A malformed chunked body is the visitor's fault: 400, not 502.
    let resp = exchange(
        h.daemon.addr,
        b"POST /upload HTTP/1.1\r\nHost: shop.example\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\nZZ\r\nbroken\r\n",
    )
    .await;
    assert_eq!(resp.status, 400, "{resp:?}");

    // A 100 KB request line is a URI too long: 414; a large header stays 431.
    let long = format!(
        "GET /{} HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n",
        "a".repeat(100 * 1024)
    );
    assert_eq!(exchange(h.daemon.addr, long.as_bytes()).await.status, 414);
    let big = format!(
        "GET / HTTP/1.1\r\nHost: shop.example\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
        "a".repeat(100 * 1024)
    );
    assert_eq!(exchange(h.daemon.addr, big.as_bytes()).await.status, 431);

    // Smuggling a second request behind conflicting framing: whatever hyper
    // makes of it, the hidden request meets the gate like any other.
    let smuggle = b"POST /x HTTP/1.1\r\nHost: shop.example\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /__waitroom/status?room=shop HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n";
    let mut s = TcpStream::connect(h.daemon.addr).await.unwrap();
    s.write_all(smuggle).await.unwrap();
    let mut all = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut all)).await;
    let text = String::from_utf8_lossy(&all);
    assert!(
        !text.contains("\"served\":\"/__waitroom"),
        "the reserved path reached the origin: {text}"
    );
}

/// Reads from a socket until the server closes it (whatever it says
/// first, such as a 408); the time that took.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let started = std::time::Instant::now();
    let mut sink = Vec::new();
    match tokio::time::timeout(limit, stream.read_to_end(&mut sink)).await {
        Ok(_) => Some(started.elapsed()),
        Err(_) => None,
    }
}

async fn connect(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.unwrap()
}

#[tokio::test]
async fn silent_connections_are_closed_and_caps_refuse_at_once() {
    let h = Harness::start(|c| {
        c.server.header_read_timeout = Duration::from_millis(400);
        c.server.max_connections = 4;
        c.server.max_connections_per_ip = 3;
    })
    .await;
    let addr = h.daemon.addr;
    // A connection that sends nothing at all is closed.
    let mut silent = connect(addr).await;
    let took = closed_within(&mut silent, Duration::from_secs(5)).await;
    assert!(
        took.is_some_and(|t| t >= Duration::from_millis(300)),
        "{took:?}"
    );

    // Three silent connections from one address: the fourth is refused at once.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect(addr).await);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut fourth = connect(addr).await;
    let took = closed_within(&mut fourth, Duration::from_millis(300)).await;
    assert!(took.is_some(), "over the per-address cap: closed at once");

    // Once they time out, visitors get in again.
    for mut s in held {
        assert!(closed_within(&mut s, Duration::from_secs(5))
            .await
            .is_some());
    }
    let resp = exchange(addr, &get("/", "shop.example")).await;
    assert!(resp.answered_by_origin());

    // An idle keep-alive connection is closed too.
    let mut kept = connect(addr).await;
    kept.write_all(b"GET / HTTP/1.1\r\nHost: shop.example\r\n\r\n")
        .await
        .unwrap();
    let first = support::raw::read_response(&mut kept).await;
    assert_eq!(first.status, 200);
    let took = closed_within(&mut kept, Duration::from_secs(5)).await;
    assert!(took.is_some(), "{took:?} {first:?}");
}

#[tokio::test]
async fn the_total_cap_refuses_at_once_instead_of_queueing_in_the_backlog() {
    let h = Harness::start(|c| {
        c.server.header_read_timeout = Duration::from_secs(30);
        c.server.max_connections = 2;
    })
    .await;
    let held = [connect(h.daemon.addr).await, connect(h.daemon.addr).await];
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut third = connect(h.daemon.addr).await;
    assert!(closed_within(&mut third, Duration::from_millis(300))
        .await
        .is_some());
    drop(held);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(exchange(h.daemon.addr, &get("/", "a.example"))
        .await
        .answered_by_origin());
}

#[tokio::test]
async fn new_tickets_are_limited_per_address_and_polls_are_not() {
    let h = Harness::start(|c| {
        c.server.ip_arrival_burst = 3;
        c.server.ip_arrivals_per_second = 1;
        c.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        c.rooms[0].total_active_users = 1;
    })
    .await;
    let visitors: Vec<_> = (0..3).map(|_| h.visitor()).collect();
    for v in &visitors {
        let resp = v.get(h.url("/")).send().await.unwrap();
        assert_ne!(resp.status(), 429);
    }
    let fourth = h.bare().get(h.url("/")).send().await.unwrap();
    assert_eq!(fourth.status(), 429);
    assert_eq!(fourth.headers()["retry-after"], "1");
    assert!(set_cookie(&fourth, COOKIE).is_none(), "no ticket, no place");
    // Queued visitors keep polling; the admitted one keeps browsing.
    assert_eq!(h.status(&visitors[1]).await["state"], "queued");
    assert!(from_origin(
        &visitors[0].get(h.url("/")).send().await.unwrap()
    ));
    // Another address behind the trusted proxy has its own allowance.
    let other = h
        .bare()
        .get(h.url("/"))
        .header("x-forwarded-for", "198.51.100.9")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 200);
    // A second later, one more.
    h.clock.advance(Duration::from_secs(1));
    assert_eq!(h.bare().get(h.url("/")).send().await.unwrap().status(), 200);
    assert_eq!(h.bare().get(h.url("/")).send().await.unwrap().status(), 429);
    let metrics = h.metrics().await;
    assert!(metrics.contains("outcome=\"limited\""), "{metrics}");
}

#[tokio::test]
async fn a_released_queue_place_stays_ended_at_the_next_poll() {
    let h = Harness::start(|c| c.rooms[0].total_active_users = 1).await;
    let inside = h.visitor();
    assert!(from_origin(&inside.get(h.url("/")).send().await.unwrap()));
    let (second, third) = (h.visitor(), h.visitor());
    let resp = second.get(h.url("/")).send().await.unwrap();
    let ticket = set_cookie(&resp, COOKIE).unwrap();
    let ring = KeyRing::new(&[Secret32(KEY)]);
    let t = ring.open("shop", &ticket, T0).unwrap();
    assert!(matches!(t.grant, Grant::Queued { .. }));
    assert!(!from_origin(&third.get(h.url("/")).send().await.unwrap()));

    let released: serde_json::Value = h
        .bare()
        .post(h.admin_url("/api/rooms/shop/release"))
        .json(&serde_json::json!({ "visitor": t.visitor.to_hex() }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(released["released"], true);
    // The ticket no longer holds a place, and the page puts the visitor at the back.
    assert_eq!(h.status(&second).await["state"], "none");
    assert_eq!(h.status(&third).await["position"], 1);
    let again = second.get(h.url("/")).send().await.unwrap();
    assert!(!from_origin(&again));
    assert_eq!(h.status(&second).await["position"], 2);
}

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// An HTTP/2 frame: 9-byte header, then the payload.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A GET of `path` on `host` as stream 1 (HPACK: static-table entries and
/// literals without Huffman coding), after the preface and empty SETTINGS.
fn h2_get(path: &str, host: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x86]; // :method GET, :scheme http
    block.push(0x44); // :path, literal with indexing
    block.push(path.len() as u8);
    block.extend_from_slice(path.as_bytes());
    block.push(0x41); // :authority, literal with indexing
    block.push(host.len() as u8);
    block.extend_from_slice(host.as_bytes());
    let mut out = H2_PREFACE.to_vec();
    out.extend(h2_frame(0x4, 0, 0, &[]));
    out.extend(h2_frame(0x1, 0x5, 1, &block)); // END_STREAM | END_HEADERS
    out
}

/// The (type, stream) of each whole frame in `bytes`.
fn h2_frames(bytes: &[u8]) -> Vec<(u8, u32)> {
    let mut frames = Vec::new();
    let mut at = 0;
    while at + 9 <= bytes.len() {
        let len = (usize::from(bytes[at]) << 16)
            | (usize::from(bytes[at + 1]) << 8)
            | usize::from(bytes[at + 2]);
        let stream = u32::from_be_bytes(bytes[at + 5..at + 9].try_into().unwrap()) & 0x7fff_ffff;
        frames.push((bytes[at + 3], stream));
        at += 9 + len;
    }
    frames
}

/// hyper has no header timeout for HTTP/2: without the daemon's idle watch
/// a connection that sends part of the preface, the preface alone, or
/// nothing after its request stays open for minutes (a slowloris route
/// around `header_read_timeout`). A request in flight longer than the
/// timeout is not cut.
#[tokio::test]
async fn http2_connections_that_go_quiet_are_closed_too() {
    let h = Harness::start(|c| {
        c.server.header_read_timeout = Duration::from_millis(400);
    })
    .await;
    let addr = h.daemon.addr;
    let quiet: [&[u8]; 3] = [
        b"PRI * HTTP/2.0\r\n",
        H2_PREFACE,
        &[H2_PREFACE, &h2_frame(0x4, 0, 0, &[])[..]].concat(),
    ];
    for sent in quiet {
        let mut s = connect(addr).await;
        s.write_all(sent).await.unwrap();
        let took = closed_within(&mut s, Duration::from_secs(5)).await;
        assert!(
            took.is_some_and(|t| t >= Duration::from_millis(300)),
            "{:?}: {took:?}",
            String::from_utf8_lossy(sent)
        );
    }

    // A request that takes 1.2 s at the origin (three timeouts) is answered,
    // then the connection, idle, is closed.
    let mut s = connect(addr).await;
    s.write_all(&h2_get("/slow?ms=1200", "shop.example"))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "still open after 10 s");
    let frames = h2_frames(&got);
    assert!(
        frames.contains(&(0x1, 1)) && frames.contains(&(0x0, 1)),
        "the response (HEADERS and DATA on stream 1) came before the close: {frames:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(1200));

    // Nor is a response body that goes quiet for three timeouts (as
    // server-sent events do): both chunks arrive.
    let mut s = connect(addr).await;
    s.write_all(&h2_get("/drip?ms=1200", "shop.example"))
        .await
        .unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "still open after 10 s");
    let data = h2_frames(&got).iter().filter(|f| **f == (0x0, 1)).count();
    assert!(data >= 2, "both chunks (DATA on stream 1) came: {data}");
}

/// A copy of an admitted cookie kept past the end of its session (the
/// origin's revoke, the admin API's release) gets nothing more through,
/// though its check-in is not due yet: the instance that ended the session
/// sends the ticket's next request to the store, which refuses it, and the
/// copy's holder is a newcomer at the back of the queue.
#[tokio::test]
async fn a_kept_copy_of_an_ended_sessions_cookie_is_not_forwarded() {
    let h = Harness::start(|c| c.rooms[0].total_active_users = 1).await;
    let with_ticket = |target: &str, ticket: &str| {
        format!(
            "GET {target} HTTP/1.1\r\nHost: shop.example\r\nCookie: {COOKIE}={ticket}\r\nConnection: close\r\n\r\n"
        )
        .into_bytes()
    };
    let ticket_of = |resp: &RawResponse| {
        let set = resp.header("set-cookie").expect("a ticket");
        let value = set
            .strip_prefix(&format!("{COOKIE}="))
            .expect("the room's cookie");
        value.split(';').next().unwrap().to_string()
    };
    let buyer = exchange(h.daemon.addr, &get("/", "shop.example")).await;
    assert!(buyer.answered_by_origin(), "the buyer gets in: {buyer:?}");
    let kept = ticket_of(&buyer);
    let next = exchange(h.daemon.addr, &get("/", "shop.example")).await;
    check(&next, Expect::Queued, "the next visitor");
    let next_ticket = ticket_of(&next);

    // The origin revokes the buyer's session; its response expires the
    // cookie, but the buyer kept a copy.
    let done = exchange(h.daemon.addr, &with_ticket("/revoke", &kept)).await;
    assert!(done.answered_by_origin(), "{done:?}");
    assert!(done.header("set-cookie").unwrap().contains("Max-Age=0"));
    for _ in 0..3 {
        let replay = exchange(h.daemon.addr, &with_ticket("/", &kept)).await;
        check(&replay, Expect::Queued, "the revoked session's kept cookie");
    }
    // The room went to the one who waited.
    let admitted = exchange(h.daemon.addr, &with_ticket("/", &next_ticket)).await;
    assert!(admitted.answered_by_origin(), "{admitted:?}");
    let next_ticket = ticket_of(&admitted);

    // The same for a session ended by the admin API.
    let ring = KeyRing::new(&[Secret32(KEY)]);
    let visitor = ring.open("shop", &next_ticket, T0).unwrap().visitor;
    let released: serde_json::Value = h
        .bare()
        .post(h.admin_url("/api/rooms/shop/release"))
        .json(&serde_json::json!({ "visitor": visitor.to_hex() }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(released["released"], true);
    // (The buyer's replays wait ahead: each was a newcomer.)
    let replay = exchange(h.daemon.addr, &with_ticket("/", &next_ticket)).await;
    check(
        &replay,
        Expect::Queued,
        "the released session's kept cookie",
    );
}
