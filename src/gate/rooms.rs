//! Rooms at runtime: each configured room with its derived values, and the
//! matcher that picks a room by host and longest path prefix.

use std::net::IpAddr;
use std::sync::Arc;

use http::HeaderMap;

use crate::config::RoomConfig;
use crate::proxy::headers::COOKIE_PREFIX;
use crate::queue_page::Template;
use crate::store::RoomPolicy;

use super::eta::RateTracker;

/// One room, ready to serve.
pub struct Room {
    pub config: RoomConfig,
    pub policy: RoomPolicy,
    /// `waitroom_<id>`.
    pub cookie_name: String,
    pub check_in_interval_ms: u64,
    pub template: Template,
    /// Observed admission rate, for the ETA.
    pub rate: RateTracker,
}

impl Room {
    pub fn new(config: RoomConfig, template: Template) -> Self {
        Self {
            policy: config.policy(),
            cookie_name: format!("{COOKIE_PREFIX}{}", config.id),
            check_in_interval_ms: config.check_in_interval().as_millis() as u64,
            template,
            rate: RateTracker::default(),
            config,
        }
    }

    /// Whether this request skips the waiting room (SPEC §4 step 3).
    pub fn bypasses(&self, path: &str, client: IpAddr, headers: &HeaderMap) -> bool {
        let c = &self.config;
        c.bypass_paths.iter().any(|p| path.starts_with(p.as_str()))
            || c.bypass_ips.iter().any(|net| net.contains(&client))
            || c.bypass_header.as_ref().is_some_and(|(name, secret)| {
                headers
                    .get(name)
                    .is_some_and(|v| constant_time_eq(v.as_bytes(), secret.0.as_bytes()))
            })
    }
}

/// Compares secrets without an early exit that leaks how much matched.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// All rooms, matched by host and longest path prefix.
#[derive(Default)]
pub struct Rooms {
    rooms: Vec<Arc<Room>>,
}

impl Rooms {
    pub fn new(rooms: Vec<Arc<Room>>) -> Self {
        Self { rooms }
    }

    pub fn all(&self) -> &[Arc<Room>] {
        &self.rooms
    }

    pub fn by_id(&self, id: &str) -> Option<&Arc<Room>> {
        self.rooms.iter().find(|r| r.config.id == id)
    }

    /// The room for `host` (without port, any case) and `path`: the longest
    /// matching prefix; a room naming the host beats a room for any host.
    pub fn matching(&self, host: Option<&str>, path: &str) -> Option<&Arc<Room>> {
        let host = host.map(strip_port);
        self.rooms
            .iter()
            .filter(|r| match (&r.config.host, host) {
                (None, _) => true,
                (Some(want), Some(got)) => want.eq_ignore_ascii_case(got),
                (Some(_), None) => false,
            })
            .filter(|r| prefix_matches(&r.config.path, path))
            .max_by_key(|r| (r.config.path.len(), r.config.host.is_some()))
    }
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        // [v6]:port
        return host
            .split(']')
            .next()
            .map_or(host, |h| &host[..h.len() + 1]);
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

/// `/shop` matches `/shop`, `/shop/` and `/shop/x`, not `/shopping`.
fn prefix_matches(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_on_segment_boundaries() {
        assert!(prefix_matches("/", "/anything"));
        assert!(prefix_matches("/shop", "/shop"));
        assert!(prefix_matches("/shop", "/shop/cart"));
        assert!(!prefix_matches("/shop", "/shopping"));
        assert!(prefix_matches("/shop/", "/shop/cart"));
    }

    #[test]
    fn ports_are_ignored_when_matching_hosts() {
        assert_eq!(strip_port("shop.example:8080"), "shop.example");
        assert_eq!(strip_port("shop.example"), "shop.example");
        assert_eq!(strip_port("[::1]:8080"), "[::1]");
    }

    #[test]
    fn constant_time_eq_compares_exactly() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
    }
}
