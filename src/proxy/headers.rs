//! Header rewriting between the visitor and the origin: hop-by-hop removal,
//! `X-Forwarded-*`, the client address, and stripping the daemon's cookies.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use ipnet::IpNet;

/// Prefix of every cookie the daemon sets; such cookies never reach the origin.
pub const COOKIE_PREFIX: &str = "waitroom_";

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1),
/// and `HTTP2-Settings`, which only an `h2c` upgrade carries (never passed).
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("http2-settings"),
];

pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(crate) const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub(crate) const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Headers named in `Connection`: they too describe only this connection.
fn connection_named(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect()
}

/// Removes every header `doomed` says must go, in one pass over the names
/// (the common request has none to remove and allocates nothing).
fn remove_where(headers: &mut HeaderMap, doomed: impl Fn(&HeaderName) -> bool) {
    let names: Vec<HeaderName> = headers.keys().filter(|n| doomed(n)).cloned().collect();
    for name in names {
        headers.remove(name);
    }
}

/// Removes hop-by-hop headers, including those the `Connection` header names.
/// With `keep_upgrade`, `Connection: upgrade` and `Upgrade` survive so a
/// WebSocket handshake can pass through.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let named = connection_named(headers);
    let upgrade = if keep_upgrade {
        headers.get(header::UPGRADE).cloned()
    } else {
        None
    };
    remove_where(headers, |n| HOP_BY_HOP.contains(n) || named.contains(n));
    if let Some(upgrade) = upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, upgrade);
    }
}

/// Whether `peer` is one of the configured proxies whose forwarding headers we believe.
pub fn is_trusted(peer: IpAddr, trusted: &[IpNet]) -> bool {
    trusted.iter().any(|net| net.contains(&peer))
}

/// The visitor's address (docs/how-it-works.md, "Canonical matching"): the
/// peer itself, or, when the peer is
/// a trusted proxy, `X-Forwarded-For` walked from the right through trusted
/// proxies to the first address that is not one. A hop that does not parse
/// as a bare IP address (`1.2.3.4:80`, `[::1]`, `unknown`) ends the walk at
/// the last trusted hop: what lies left of it was written by someone we do
/// not trust, so it is never skipped to reach a more convenient address.
pub fn client_ip(headers: &HeaderMap, peer: IpAddr, trusted: &[IpNet]) -> IpAddr {
    if !is_trusted(peer, trusted) {
        return peer;
    }
    let mut client = peer;
    for line in headers.get_all(&X_FORWARDED_FOR).iter().rev() {
        let Ok(line) = line.to_str() else {
            return client;
        };
        for hop in line.rsplit(',') {
            match hop.trim().parse::<IpAddr>() {
                Ok(ip) => {
                    client = ip;
                    if !is_trusted(ip, trusted) {
                        return ip;
                    }
                }
                Err(_) => return client,
            }
        }
    }
    client
}

/// Request headers that describe the client's path to us, or the request
/// as a proxy in front received it: an origin may believe them (IIS URL
/// Rewrite and older Symfony or Zend serve `X-Original-URL`'s path, not the
/// request target the gate decided on; Rack believes `X-Forwarded-Ssl`),
/// so only trusted proxies may supply them. With `FORWARDING_PREFIX`: every
/// `X-Forwarded-*`.
const FORWARDING: [&str; 13] = [
    "x-forwarded",
    "forwarded",
    "forwarded-for",
    "x-real-ip",
    "x-client-ip",
    "x-cluster-client-ip",
    "client-ip",
    "true-client-ip",
    "x-original-url",
    "x-original-uri",
    "x-rewrite-url",
    "x-original-host",
    "x-host",
];
const FORWARDING_PREFIX: &str = "x-forwarded-";

/// Our own request headers (`X-Waitroom-Visitor`, …) start with this.
const OWN_PREFIX: &str = "x-waitroom-";

/// `name` spelled as `want`, where `_` in `name` stands for `-`: CGI, PHP,
/// Rack and others fold `X_Waitroom_Visitor` and `X-Waitroom-Visitor` into
/// the same variable.
fn folds_to(name: &[u8], want: &[u8]) -> bool {
    name.len() == want.len()
        && name
            .iter()
            .zip(want)
            .all(|(a, b)| a == b || (*a == b'_' && *b == b'-'))
}

/// Whether a visitor's header must not reach the origin: any spelling of
/// our own headers; any underscore spelling of a forwarding header (no
/// proxy writes those); and, from untrusted peers, the forwarding headers.
fn not_from_visitors(name: &HeaderName, peer_trusted: bool) -> bool {
    let n = name.as_str().as_bytes();
    if n.len() >= OWN_PREFIX.len() && folds_to(&n[..OWN_PREFIX.len()], OWN_PREFIX.as_bytes()) {
        return true;
    }
    let forwarding = || {
        (n.len() > FORWARDING_PREFIX.len()
            && folds_to(&n[..FORWARDING_PREFIX.len()], FORWARDING_PREFIX.as_bytes()))
            || FORWARDING.iter().any(|f| folds_to(n, f.as_bytes()))
    };
    (!peer_trusted || n.contains(&b'_')) && forwarding()
}

/// Removes from a visitor's request what only we may tell the origin: our
/// headers in every spelling, forwarding headers a visitor made up, and
/// our cookies. Hop-by-hop headers go too (before anything of ours is
/// added, so `Connection: x-waitroom-visitor` cannot remove what we add),
/// except, when `websocket` says the request is a WebSocket upgrade the
/// gate allows (`tunnel::asks_websocket`), `Upgrade: websocket` with
/// `Connection: upgrade`. One pass over the header names. Returns whether
/// an upgrade was kept.
pub fn sanitize_inbound(headers: &mut HeaderMap, peer_trusted: bool, websocket: bool) -> bool {
    let mut connection = false;
    let mut upgrade = false;
    let mut doomed = false;
    for name in headers.keys() {
        connection |= name == header::CONNECTION;
        upgrade |= name == header::UPGRADE;
        doomed |= HOP_BY_HOP.contains(name) || not_from_visitors(name, peer_trusted);
    }
    let kept_upgrade = (websocket && upgrade).then(|| HeaderValue::from_static("websocket"));
    if doomed {
        let named = if connection {
            connection_named(headers)
        } else {
            Vec::new()
        };
        remove_where(headers, |n| {
            HOP_BY_HOP.contains(n) || named.contains(n) || not_from_visitors(n, peer_trusted)
        });
    }
    let kept = kept_upgrade.is_some();
    if let Some(upgrade) = kept_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, upgrade);
    }
    strip_own_cookies(headers);
    kept
}

/// What the origin tells the daemon in its response's own headers; they
/// are taken out of the response, so the visitor never sees them.
#[derive(Debug, Default)]
pub struct FromOrigin {
    /// `X-Waitroom-Command` (`revoke`, `close`).
    pub command: Option<HeaderValue>,
    /// `X-Waitroom-Stock`, as the origin wrote it; `None` when absent or
    /// given more than once (which value would count is unclear).
    pub stock: Option<HeaderValue>,
}

/// Takes the origin's commands out of `headers`, every spelling of
/// their names (`X_Waitroom_Stock` too, which some servers write for
/// `X-Waitroom-Stock`); only the proper spelling is read.
pub fn take_from_origin(headers: &mut HeaderMap) -> FromOrigin {
    use super::{X_WAITROOM_COMMAND, X_WAITROOM_STOCK};
    let command = headers.remove(&X_WAITROOM_COMMAND);
    let mut values = headers.get_all(&X_WAITROOM_STOCK).iter();
    let stock = match (values.next(), values.next()) {
        (Some(v), None) => Some(v.clone()),
        _ => None,
    };
    remove_where(headers, |n| {
        let n = n.as_str().as_bytes();
        folds_to(n, X_WAITROOM_COMMAND.as_str().as_bytes())
            || folds_to(n, X_WAITROOM_STOCK.as_str().as_bytes())
    });
    FromOrigin { command, stock }
}

/// Removes from the origin's response what describes only the origin's
/// connection (hop-by-hop headers, those `Connection` names) and takes
/// out what the origin tells the daemon (see [`take_from_origin`]). One
/// pass over the names unless there is something to remove.
pub fn sanitize_outbound(headers: &mut HeaderMap) -> FromOrigin {
    let mut connection = false;
    let mut doomed = false;
    let mut own = false;
    for name in headers.keys() {
        connection |= name == header::CONNECTION;
        doomed |= HOP_BY_HOP.contains(name);
        let n = name.as_str().as_bytes();
        own |=
            n.len() >= OWN_PREFIX.len() && folds_to(&n[..OWN_PREFIX.len()], OWN_PREFIX.as_bytes());
    }
    let from_origin = if own {
        take_from_origin(headers)
    } else {
        FromOrigin::default()
    };
    if doomed {
        let named = if connection {
            connection_named(headers)
        } else {
            Vec::new()
        };
        remove_where(headers, |n| HOP_BY_HOP.contains(n) || named.contains(n));
    }
    from_origin
}

/// Sets `X-Forwarded-For/-Proto/-Host`. Inbound values are kept (and the
/// peer appended) only when the peer is trusted; otherwise they are
/// replaced. `peer` is the peer address as header text (formatted once per
/// connection); `scheme` is what the visitor connected with (`"https"` on
/// the TLS listener), what `X-Forwarded-Proto` says when no trusted proxy
/// said it.
pub fn set_forwarded(
    headers: &mut HeaderMap,
    peer: &HeaderValue,
    trusted: bool,
    host: HeaderValue,
    scheme: &'static str,
) {
    let prior_for = trusted.then(|| joined(headers, &X_FORWARDED_FOR)).flatten();
    let xff = match prior_for {
        Some(prior) => {
            let peer = peer.to_str().unwrap_or_default();
            HeaderValue::from_str(&format!("{prior}, {peer}")).ok()
        }
        None => Some(peer.clone()),
    };
    if let Some(v) = xff {
        headers.insert(X_FORWARDED_FOR, v);
    }
    if !(trusted && headers.contains_key(&X_FORWARDED_PROTO)) {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(scheme));
    }
    if !(trusted && headers.contains_key(&X_FORWARDED_HOST)) {
        headers.insert(X_FORWARDED_HOST, host);
    }
}

/// The peer address as header text.
pub fn peer_text(peer: IpAddr) -> HeaderValue {
    HeaderValue::from_str(&peer.to_string()).unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

fn joined(headers: &HeaderMap, name: &HeaderName) -> Option<String> {
    let parts: Vec<&str> = headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// The `name=value` pairs of the `Cookie` header(s), trimmed; lines that are
/// not text are skipped.
fn cookie_pairs(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
}

fn is_ours(pair: &str) -> bool {
    pair.starts_with(COOKIE_PREFIX)
}

/// Removes the daemon's cookies from the `Cookie` header(s), keeping the rest.
pub fn strip_own_cookies(headers: &mut HeaderMap) {
    let mut lines = headers.get_all(header::COOKIE).iter();
    match (lines.next(), lines.next()) {
        (None, _) => return,
        // The common cases: one line without ours (left as is), or one
        // line that is only ours (removed).
        (Some(line), None) => {
            static OURS: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
                std::sync::LazyLock::new(|| memchr::memmem::Finder::new(COOKIE_PREFIX.as_bytes()));
            let bytes = line.as_bytes();
            let prefix = COOKIE_PREFIX.as_bytes();
            if OURS.find(bytes).is_none() {
                return;
            }
            if bytes.starts_with(prefix) && !bytes.contains(&b';') {
                headers.remove(header::COOKIE);
                return;
            }
        }
        _ => {}
    }
    let mut kept = String::new();
    for pair in cookie_pairs(headers).filter(|c| !c.is_empty() && !is_ours(c)) {
        if !kept.is_empty() {
            kept.push_str("; ");
        }
        kept.push_str(pair);
    }
    headers.remove(header::COOKIE);
    if !kept.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&kept) {
            headers.insert(header::COOKIE, v);
        }
    }
}

/// The value of the cookie `name`, if the request carries it.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    cookie_bytes(headers, &memchr::memmem::Finder::new(name))
        .and_then(|v| std::str::from_utf8(v).ok())
}

/// The value of the cookie whose name `finder` searches for, as bytes:
/// found with a substring search (this runs on every request; build the
/// finder once), then checked to start a `name=value` pair; quotes around
/// the value are removed.
pub fn cookie_bytes<'a>(
    headers: &'a HeaderMap,
    finder: &memchr::memmem::Finder<'_>,
) -> Option<&'a [u8]> {
    let name = finder.needle();
    for line in headers.get_all(header::COOKIE) {
        let line = line.as_bytes();
        for at in finder.find_iter(line) {
            let before = line[..at].trim_ascii_end();
            if !(before.is_empty() || before.ends_with(b";")) {
                continue;
            }
            let Some(rest) = line[at + name.len()..]
                .trim_ascii_start()
                .strip_prefix(b"=")
            else {
                continue;
            };
            let end = memchr::memchr(b';', rest).unwrap_or(rest.len());
            let value = rest[..end].trim_ascii();
            return Some(
                value
                    .strip_prefix(b"\"")
                    .and_then(|v| v.strip_suffix(b"\""))
                    .unwrap_or(value),
            );
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_origins_own_headers_are_taken_out_in_every_spelling() {
        let mut h = map(&[
            ("content-type", "text/html"),
            ("x-waitroom-stock", "3"),
            ("x_waitroom_stock", "9"),
            ("X_Waitroom-Command", "revoke"),
            ("x-waitroom-command", "close"),
            ("x-waitroomish", "kept"),
        ]);
        let from = sanitize_outbound(&mut h);
        assert_eq!(from.stock.as_ref().map(|v| v.as_bytes()), Some(&b"3"[..]));
        assert_eq!(
            from.command.as_ref().map(|v| v.as_bytes()),
            Some(&b"close"[..])
        );
        let left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["content-type", "x-waitroomish"]);
        // Twice is unclear: neither value counts, both go.
        let mut h = map(&[("x-waitroom-stock", "3"), ("x-waitroom-stock", "4")]);
        assert!(sanitize_outbound(&mut h).stock.is_none());
        assert!(h.is_empty());
    }

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn hop_by_hop_and_connection_listed_headers_are_removed() {
        let mut h = map(&[
            ("connection", "keep-alive, x-private"),
            ("keep-alive", "timeout=5"),
            ("x-private", "1"),
            ("te", "trailers"),
            ("accept", "*/*"),
        ]);
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("accept"));
    }

    #[test]
    fn upgrade_survives_only_when_asked() {
        let mut h = map(&[("connection", "Upgrade"), ("upgrade", "websocket")]);
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h["connection"], "upgrade");
        assert_eq!(h["upgrade"], "websocket");
        strip_hop_by_hop(&mut h, false);
        assert!(h.is_empty());
    }

    #[test]
    fn forwarded_for_is_replaced_from_untrusted_peers_and_appended_from_trusted() {
        let peer: IpAddr = "10.0.0.9".parse().unwrap();
        let mut h = map(&[
            ("x-forwarded-for", "1.2.3.4"),
            ("x-forwarded-proto", "https"),
        ]);
        set_forwarded(
            &mut h,
            &peer_text(peer),
            false,
            HeaderValue::from_static("shop.example"),
            "http",
        );
        assert_eq!(h["x-forwarded-for"], "10.0.0.9");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "shop.example");

        let mut h = map(&[
            ("x-forwarded-for", "1.2.3.4"),
            ("x-forwarded-proto", "https"),
        ]);
        set_forwarded(
            &mut h,
            &peer_text(peer),
            true,
            HeaderValue::from_static("shop.example"),
            "http",
        );
        assert_eq!(h["x-forwarded-for"], "1.2.3.4, 10.0.0.9");
        assert_eq!(h["x-forwarded-proto"], "https");
    }

    #[test]
    fn client_ip_trusts_forwarded_for_only_from_trusted_proxies() {
        let trusted: Vec<IpNet> = vec!["127.0.0.1/32".parse().unwrap()];
        let h = map(&[("x-forwarded-for", "6.6.6.6, 5.5.5.5")]);
        let lb: IpAddr = "127.0.0.1".parse().unwrap();
        let other: IpAddr = "9.9.9.9".parse().unwrap();
        assert_eq!(
            client_ip(&h, lb, &trusted),
            "5.5.5.5".parse::<IpAddr>().unwrap()
        );
        assert_eq!(client_ip(&h, other, &trusted), other);
    }

    #[test]
    fn forwarded_for_walk_stops_at_the_first_hop_that_is_not_a_bare_ip() {
        let trusted: Vec<IpNet> = vec![
            "127.0.0.1/32".parse().unwrap(),
            "10.0.0.0/8".parse().unwrap(),
        ];
        let lb: IpAddr = "127.0.0.1".parse().unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        for (xff, want) in [
            // A spoofed bypass address left of a hop we cannot read.
            ("10.9.9.9, 198.51.100.7:4711", "127.0.0.1"),
            ("10.9.9.9, unknown", "127.0.0.1"),
            ("10.9.9.9, [2001:db8::1]:4711", "127.0.0.1"),
            ("10.9.9.9, [2001:db8::1]", "127.0.0.1"),
            ("10.9.9.9, ", "127.0.0.1"),
            // Through trusted hops to the first untrusted one.
            ("6.6.6.6, 198.51.100.7, 10.1.1.1", "198.51.100.7"),
            ("2001:db8::7", "2001:db8::7"),
            // Only trusted hops: the left-most of them.
            ("10.2.2.2, 10.1.1.1", "10.2.2.2"),
            // Unreadable in the middle of trusted hops.
            ("6.6.6.6, x, 10.1.1.1", "10.1.1.1"),
        ] {
            let h = map(&[("x-forwarded-for", xff)]);
            assert_eq!(client_ip(&h, lb, &trusted), ip(want), "{xff}");
        }
        // Several lines are one list, in order.
        let h = map(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "10.1.1.1"),
        ]);
        assert_eq!(client_ip(&h, lb, &trusted), ip("6.6.6.6"));
    }

    #[test]
    fn visitors_cannot_speak_for_us_in_any_spelling() {
        let mut h = map(&[
            ("x-waitroom-visitor", "forged"),
            ("x_waitroom_visitor", "forged"),
            ("X_WAITROOM-Signature", "forged"),
            ("x-forwarded-for", "1.2.3.4"),
            ("x_forwarded_for", "1.2.3.4"),
            ("forwarded", "for=1.2.3.4"),
            ("x-real-ip", "1.2.3.4"),
            ("x-waitroomish", "kept"),
            ("connection", "x-keep-me-not"),
            ("x-keep-me-not", "1"),
            ("cookie", "a=1; waitroom_shop=t"),
            ("accept", "*/*"),
        ]);
        sanitize_inbound(&mut h, false, false);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["accept", "cookie", "x-waitroomish"]);
        assert_eq!(h["cookie"], "a=1");

        // A trusted proxy's forwarding headers stay; underscore spellings never.
        let mut h = map(&[
            ("x-forwarded-for", "1.2.3.4"),
            ("x_forwarded_for", "6.6.6.6"),
        ]);
        sanitize_inbound(&mut h, true, false);
        assert_eq!(h.len(), 1);
        assert_eq!(h["x-forwarded-for"], "1.2.3.4");
    }

    #[test]
    fn own_cookies_are_stripped_and_others_kept() {
        let mut h = map(&[("cookie", "a=1; waitroom_shop=xyz"), ("cookie", "b=2")]);
        assert_eq!(cookie(&h, "waitroom_shop"), Some("xyz"));
        strip_own_cookies(&mut h);
        assert_eq!(h.get_all("cookie").iter().count(), 1);
        assert_eq!(h["cookie"], "a=1; b=2");
        let mut h = map(&[("cookie", "waitroom_shop=xyz")]);
        strip_own_cookies(&mut h);
        assert!(!h.contains_key("cookie"));
        let mut h = map(&[("cookie", "a=1;b=2")]);
        strip_own_cookies(&mut h);
        assert_eq!(
            h["cookie"], "a=1;b=2",
            "a line without ours passes untouched"
        );
    }
}
