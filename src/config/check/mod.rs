//! Validation: walks the raw config, checks every value against what is
//! allowed, and builds the typed [`Config`]. Every problem is recorded with
//! its key path (all of them, not just the first), and defaults stand in
//! for bad values so one pass finds everything.
//!
//! This module holds the `Checker`, its entry point and the value helpers
//! every section uses; `values` has the checks of an id, a path, a limit
//! and a host that several sections make. Each section is checked in its
//! own file: `server`, `tls`, `store` and `store_redis` (where Redis is),
//! `region`, `cookie`, `origin`, and a room's keys in `rooms`, `challenge`
//! (captcha, bot score), `bypass`, `tokens`, `lanes` and `events`.

mod bypass;
mod challenge;
mod cookie;
mod events;
mod lanes;
mod origin;
mod region;
mod rooms;
mod server;
mod store;
mod store_redis;
mod tls;
mod tokens;
mod values;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ipnet::IpNet;
use toml::de::DeTable;

use super::bounds::{MAX_DURATION, MAX_DURATION_TEXT};
use super::error::{LoadOptions, Problem};
use super::keypath::{location, span_of, KeyPath};
use super::raw::{RawConfig, RawDuration};
use super::Config;

pub(crate) use values::check_id;

/// Defaults for every optional key; `config/example.toml` shows the same values.
mod defaults {
    use std::time::Duration;

    pub const LISTEN: &str = "0.0.0.0:8080";
    pub const ADMIN_LISTEN: &str = "127.0.0.1:9090";
    pub const ADMIN_TOKEN_ENV: &str = "WAITROOM_ADMIN_TOKEN";
    pub const RESERVED_PREFIX: &str = "/__waitroom/";
    pub const MAX_CONNECTIONS: u64 = 10_000;
    pub const MAX_HEADER_BYTES: u64 = 16_384;
    pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
    pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
    pub const STORE_TIMEOUT: Duration = Duration::from_millis(50);
    /// How long the store answers nothing before `fail_mode` applies.
    pub const STORE_UNREACHABLE_AFTER: Duration = Duration::from_secs(1);
    pub const KEYS_ENV: &str = "WAITROOM_COOKIE_KEYS";
    pub const ORIGIN_TIMEOUT: Duration = Duration::from_secs(30);
    pub const ORIGIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
    pub const SESSION_DURATION: Duration = Duration::from_secs(5 * 60);
    pub const REFRESH_INTERVAL: Duration = Duration::from_secs(20);
    pub const ABANDON_AFTER: Duration = Duration::from_secs(2 * 60);
    pub const QUEUE_STATUS_CODE: u64 = 200;
    pub const MAX_CONNECTIONS_PER_IP: u64 = 512;
    pub const IP_POLLS_PER_SECOND: u32 = 50;
    pub const IP_POLL_BURST: u32 = 200;
    pub const IP_ARRIVALS_PER_SECOND: u32 = 20;
    pub const IP_ARRIVAL_BURST: u32 = 200;
    pub const MAX_NETWORKS_PER_SESSION: u64 = 4;
    pub const SYNC_INTERVAL: Duration = Duration::from_secs(1);
    pub const MIN_SYNC_INTERVAL: Duration = Duration::from_millis(100);
    pub const MAX_SYNC_INTERVAL: Duration = Duration::from_secs(60);
    pub const TLS_LISTEN: &str = "0.0.0.0:8443";
    pub const MAX_STREAMS_PER_CONNECTION: u64 = 100;
    pub const MAX_STREAMS_PER_IP: u64 = 256;
    pub const SEND_TIMEOUT: Duration = Duration::from_secs(30);
    pub const REQUEST_BODY_TIMEOUT: Duration = Duration::from_secs(20);
    pub const REQUEST_BODY_MIN_RATE: u64 = 500;
    pub const TUNNEL_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
    pub const ORIGIN_MAX_CONNECTIONS: u64 = 512;
}

/// Walks the raw config, recording problems and substituting defaults so one
/// pass finds every problem; the result is used only when none was found.
pub(super) struct Checker<'a, 'i> {
    pub(super) src: &'a str,
    pub(super) tree: &'a DeTable<'i>,
    pub(super) env: &'a dyn Fn(&str) -> Option<String>,
    pub(super) problems: Vec<Problem>,
}

fn root() -> KeyPath {
    KeyPath::default()
}

impl Checker<'_, '_> {
    fn fail(&mut self, path: &KeyPath, message: impl Into<String>) {
        let at = span_of(self.tree, path).map(|s| location(self.src, s.start));
        self.problems.push(Problem {
            key: path.to_string(),
            location: at,
            message: message.into(),
        });
    }

    pub(super) fn config(&mut self, raw: RawConfig, options: LoadOptions) -> Config {
        let server = self.server(raw.server);
        let store = self.store(raw.store);
        let cookie = self.cookie(raw.cookie, options);
        let origin = self.origin(raw.origin);
        let rooms = self.rooms(raw.room, &server.reserved_prefix);
        let region = raw.region.map(|r| self.region(r, &store));
        if region.is_some() {
            if let Some(i) = rooms.iter().position(|r| !r.lanes.is_empty()) {
                self.fail(
                    &root().key("room").index(i).key("lane"),
                    "priority lanes are not available in region mode (a region's grant has no lanes)",
                );
            }
        }
        let tls = raw.tls.and_then(|t| self.tls(t, &server));
        Config {
            server,
            store,
            cookie,
            origin,
            rooms,
            region,
            tls,
        }
    }

    // --- value helpers: record a problem and return a stand-in ---

    fn duration(
        &mut self,
        path: &KeyPath,
        raw: Option<RawDuration>,
        default: Duration,
        min: Duration,
    ) -> Duration {
        let Some(raw) = raw else { return default };
        if raw.value.is_zero() || raw.value < min {
            let allowed = if min.is_zero() {
                "longer than 0".to_owned()
            } else {
                format!("at least {}", humantime::format_duration(min))
            };
            self.fail(path, format!("must be {allowed}, got {:?}", raw.text));
            default
        } else if raw.value > MAX_DURATION {
            self.fail(
                path,
                format!("must be at most {}, got {:?}", MAX_DURATION_TEXT, raw.text),
            );
            default
        } else {
            raw.value
        }
    }

    fn socket_addr(&mut self, path: &KeyPath, raw: Option<String>, default: &str) -> SocketAddr {
        let fallback = SocketAddr::from(([127, 0, 0, 1], 0));
        let text = raw.as_deref().unwrap_or(default);
        text.parse().unwrap_or_else(|_| {
            self.fail(
                path,
                format!(
                    r#"{text:?} is not an IP address and port such as "127.0.0.1:8080" (host names are not accepted)"#
                ),
            );
            fallback
        })
    }

    fn nets(&mut self, path: &KeyPath, raw: Option<Vec<String>>) -> Vec<IpNet> {
        let mut nets = Vec::new();
        for (i, text) in raw.unwrap_or_default().iter().enumerate() {
            let parsed = text
                .parse::<IpNet>()
                .map(|n| n.trunc())
                .ok()
                .or_else(|| text.parse::<IpAddr>().ok().map(IpNet::from));
            match parsed {
                Some(net) => nets.push(net),
                None => self.fail(
                    &path.index(i),
                    format!(r#"{text:?} is not an IP address or CIDR block such as "10.0.0.0/8""#),
                ),
            }
        }
        nets
    }

    /// Validates an environment variable name (or takes `default`); `None` if invalid.
    fn env_name(&mut self, path: &KeyPath, raw: Option<String>, default: &str) -> Option<String> {
        let name = raw.unwrap_or_else(|| default.to_owned());
        let mut chars = name.chars();
        let valid = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if valid {
            Some(name)
        } else {
            self.fail(
                path,
                format!("{name:?} is not an environment variable name (letters, digits and _, not starting with a digit)"),
            );
            None
        }
    }

    /// An empty variable counts as unset, as container environments often
    /// declare variables they leave empty.
    fn env_value(&self, name: &str) -> Option<String> {
        (self.env)(name).filter(|v| !v.trim().is_empty())
    }
}
