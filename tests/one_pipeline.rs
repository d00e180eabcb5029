//! The reverse proxy and decision mode run the same phases (`Gate::outcome`)
//! and differ only in what they do with the outcome. One table of requests
//! (path, host and method spellings of tests/gate_security.rs, bypasses,
//! reserved paths, lane codes, tickets, a proof-of-work room, an end of
//! session path) goes to two
//! daemons with the same configuration and the same history: to one as
//! the request itself (raw bytes), to the other as nginx describes it to
//! `{prefix}auth`. For every request both must agree: let in, or the same
//! page status; and what the reverse proxy answers as the daemon's own,
//! decision mode refuses with 404 (its own paths are reached directly).

mod support;

use std::collections::HashSet;
use std::time::Duration;

use support::raw::{exchange, RawResponse};
use support::{set_cookie, Harness};
use waitroom::config::LaneConfig;
use waitroom::domain::digest64;

const CODE: &str = "presale-7f3k2q9x";

/// How a request is sent.
#[derive(Clone, Copy)]
struct Req {
    method: &'static str,
    target: &'static str,
    host: &'static str,
    /// Send the visitor inside the room's ticket (each daemon its own).
    ticket: bool,
    /// Under the reserved prefix: the reverse proxy answers it itself.
    own: bool,
}

const fn get(target: &'static str) -> Req {
    Req {
        method: "GET",
        target,
        host: "shop.example",
        ticket: false,
        own: false,
    }
}

const fn at(host: &'static str, target: &'static str) -> Req {
    Req {
        host,
        ..get(target)
    }
}

const fn with_ticket(target: &'static str) -> Req {
    Req {
        ticket: true,
        ..get(target)
    }
}

const fn own(target: &'static str) -> Req {
    Req {
        own: true,
        ..get(target)
    }
}

const fn method(method: &'static str, target: &'static str) -> Req {
    Req {
        method,
        ..get(target)
    }
}

/// The table: every way through (or around) the phases.
const TABLE: &[Req] = &[
    // The room, every spelling (queued: the room is full).
    get("/shop"),
    get("//shop"),
    get("///shop/checkout"),
    get("/%73hop"),
    get("/%73%68%6f%70/cart"),
    get("/./shop"),
    get("/x/../shop"),
    get("/x/%2e%2e/shop"),
    get("/x/.%2E/shop"),
    get("/shop/."),
    get("/shop;jsessionid=1"),
    get("/;/shop"),
    get("/shop."),
    get("/shop%20"),
    get("/.../shop"),
    // Refused in phase 1.
    get("/shop%2fcart"),
    get("/shop%5ccart"),
    get("/shop\\cart"),
    get("/shop%00"),
    get("/x/..;/shop"),
    get("/../shop"),
    get("/%2e%2e/shop"),
    get("/%c0%afshop"),
    // No room: forwarded (`unmatched = "forward"`).
    get("/shopping"),
    get("/other//page"),
    get("/SHOP"),
    // Bypasses, and what only looks like one.
    get("/shop/static/app.js"),
    get("/shop/static//app.js"),
    get("/shop/static/../checkout"),
    get("/shop/static/%2e%2e/checkout"),
    get("/shop/static/..%2fcheckout"),
    get("/shop/static./x"),
    get("/shop/staticx"),
    // Hosts.
    at("Shop.Example.", "/shop"),
    at("shop.example:80", "/shop"),
    at("other.example", "/shop"),
    at("shop.example@evil", "/shop"),
    at("shop..example", "/shop"),
    at("", "/shop"),
    // The daemon's own paths, and spellings that reach them.
    own("/__waitroom/health"),
    own("/__waitroom/status?room=shop"),
    own("/%5f_waitroom/health"),
    own("/x/../__waitroom/health"),
    own("//__waitroom/health"),
    get("/__waitroomx/health"),
    // A lane code (a browser is sent on without it), right and wrong.
    get("/shop?waitroom_code=presale-7f3k2q9x"),
    get("/shop?a=1&waitroom_code=presale-7f3k2q9x&b=2"),
    get("/shop?waitroom_code=wrong-code-123"),
    get("/shop?waitroom_code="),
    // The visitor inside, with its ticket, every spelling.
    with_ticket("/shop"),
    with_ticket("/shop/cart?x=1"),
    with_ticket("//shop/./cart"),
    with_ticket("/shop%2fcart"),
    with_ticket("/shop?waitroom_code=presale-7f3k2q9x"),
    // Methods.
    method("POST", "/shop"),
    method("HEAD", "/shop"),
    method("DELETE", "/shop/cart"),
    method("OPTIONS", "/shop"),
    method("CONNECT", "/shop"),
    method("POST", "/shop?waitroom_code=presale-7f3k2q9x"),
    // The proof-of-work room.
    get("/pow"),
    get("/pow/../pow/x"),
    get("/POW"),
    // The end of a purchase: let in by both (the session then ends, so
    // this comes last of the rows with a ticket).
    with_ticket("/shop/order/%63omplete"),
];

/// A daemon with a full room on /shop (one visitor inside, whose ticket
/// cookie is returned), a lane, bypasses, and a proof-of-work room.
async fn daemon() -> (Harness, String) {
    let h = Harness::start(|c| {
        c.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        // Every request here is a newcomer from one address.
        c.server.ip_arrivals_per_second = 1_000_000;
        c.server.ip_arrival_burst = 1_000_000;
        let mut shop = support::room("shop", "/shop");
        shop.host = Some("shop.example".into());
        shop.total_active_users = 1;
        shop.abandon_after = Duration::from_secs(600);
        shop.bypass_paths = vec!["/shop/static/".into()];
        shop.end_session_paths = vec!["/shop/order/complete".into()];
        shop.lanes = vec![LaneConfig {
            name: "presale".into(),
            share: 300,
            codes: HashSet::from([digest64(CODE)]),
            single_use: HashSet::new(),
            token_claim: false,
        }];
        let mut pow = support::room("pow", "/pow");
        pow.host = Some("shop.example".into());
        pow.total_active_users = 0;
        pow.proof_of_work = 8;
        c.rooms = vec![shop, pow];
    })
    .await;
    let inside = reqwest::Client::new()
        .get(h.url("/shop"))
        .header("host", "shop.example")
        .send()
        .await
        .unwrap();
    assert!(support::from_origin(&inside), "the first visitor gets in");
    let cookie = set_cookie(&inside, "waitroom_shop").expect("a ticket");
    (h, cookie)
}

/// What a sink made of a request: let in, or a status (the page's, in
/// decision mode the one it tells the proxy).
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    In,
    Page(u16),
}

fn head(r: &Req, cookie: &str) -> String {
    let mut h = String::new();
    if !r.host.is_empty() {
        h += &format!("Host: {}\r\n", r.host);
    }
    if r.ticket {
        h += &format!("Cookie: waitroom_shop={cookie}\r\n");
    }
    h
}

async fn reverse(h: &Harness, cookie: &str, r: &Req) -> (Verdict, RawResponse) {
    let req = format!(
        "{} {} HTTP/1.1\r\n{}Content-Length: 0\r\nConnection: close\r\n\r\n",
        r.method,
        r.target,
        head(r, cookie)
    );
    let resp = exchange(h.daemon.addr, req.as_bytes()).await;
    // (A HEAD answer has a length and no body: the raw reader leaves it
    // unparsed, its status line first.)
    let status = match resp.status {
        0 => resp.body[9..12].parse().unwrap_or(0),
        s => s,
    };
    let v =
        if resp.answered_by_origin() || (resp.status == 0 && resp.body.contains("\r\nx-origin:")) {
            Verdict::In
        } else {
            Verdict::Page(status)
        };
    (v, resp)
}

async fn decision(h: &Harness, cookie: &str, r: &Req) -> (Verdict, RawResponse) {
    // As the shipped nginx snippet asks: the original method and URI, the
    // visitor's Host and cookies.
    let req = format!(
        "GET /__waitroom/auth HTTP/1.1\r\n{}X-Original-Method: {}\r\nX-Original-URI: {}\r\nConnection: close\r\n\r\n",
        head(r, cookie),
        r.method,
        r.target,
    );
    let resp = exchange(h.daemon.addr, req.as_bytes()).await;
    let v = match resp.status {
        200 => Verdict::In,
        _ => Verdict::Page(
            resp.header("x-waitroom-status")
                .and_then(|s| s.parse().ok())
                .unwrap_or(resp.status),
        ),
    };
    (v, resp)
}

#[tokio::test]
async fn the_reverse_proxy_and_decision_mode_decide_every_request_alike() {
    let ((a, ticket_a), (b, ticket_b)) = (daemon().await, daemon().await);
    let mut seen = HashSet::new();
    for r in TABLE {
        let (by_proxy, resp) = reverse(&a, &ticket_a, r).await;
        let (by_decision, dresp) = decision(&b, &ticket_b, r).await;
        let what = format!("{} {} (Host {:?})", r.method, r.target, r.host);
        if r.own {
            assert!(
                by_proxy != Verdict::In && !resp.answered_by_origin(),
                "{what}: the reverse proxy answers its own path itself: {resp:?}"
            );
            assert_eq!(
                by_decision,
                Verdict::Page(404),
                "{what}: decision mode never lets its own paths through: {dresp:?}"
            );
        } else {
            assert_eq!(
                by_proxy, by_decision,
                "{what}: reverse proxy {resp:?}\ndecision {dresp:?}"
            );
        }
        seen.insert(format!("{by_proxy:?}"));
    }
    // The table reaches every kind of answer, or it proves little.
    for want in [
        "In",
        "Page(200)",
        "Page(400)",
        "Page(303)",
        "Page(307)",
        "Page(405)",
    ] {
        assert!(seen.contains(want), "no request answered {want}: {seen:?}");
    }
}
