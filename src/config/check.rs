//! Validation: walks the raw config, checks every value against what is
//! allowed, and builds the typed [`Config`]. Every problem is recorded with
//! its key path (all of them, not just the first), and defaults stand in
//! for bad values so one pass finds everything.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use toml::de::DeTable;

use super::bounds::{MAX_DURATION, MAX_DURATION_TEXT, MAX_LIMIT, MIN_SESSION};
use super::error::{LoadOptions, Problem};
use super::keypath::{location, span_of, KeyPath};
use super::raw::*;
use super::{
    Backend, BotScore, Captcha, ChallengeKind, Config, CookieConfig, EnqueueToken, EventConfig,
    FailMode, FailedChallenge, LaneConfig, OriginConfig, RegionConfig, RoomConfig, Secret,
    SentinelConfig, ServerConfig, StoreConfig, TlsCert, TlsConfig, Unmatched,
};
use crate::domain::{EventSpec, Settings};
use crate::domain::{QueueingMethod, RoomState, MAX_LANES};
use crate::i18n::{Lang, Language};

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

/// Most proof-of-work bits: 2^32 hashes is minutes for a browser already.
pub const MAX_PROOF_OF_WORK: u64 = 32;
/// Most captcha verifications in flight at once per room and instance,
/// and how many by default (`room.challenge_concurrency`).
const MAX_CHALLENGE_CONCURRENCY: u64 = 10_000;
const DEFAULT_CHALLENGE_CONCURRENCY: u64 = 64;
/// Shortest `origin.sign_key_env` value: an HMAC key this short is guessable.
const MIN_SIGN_KEY_LEN: usize = 32;

/// Most worker threads.
const MAX_WORKERS: u64 = 256;

/// Most concurrent streams per connection (HTTP/2's own default cap is
/// of this order; more only lets one client hold more).
const MAX_STREAMS: u64 = 1000;

/// Below hyper's smallest read buffer (8 KiB) the HTTP/1 builder panics.
const MIN_HEADER_BYTES: u64 = 8192;
const MAX_HEADER_BYTES: u64 = 1024 * 1024;

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

    /// `[tls]`: every certificate is read and checked here, so `waitroom
    /// check` and a reload refuse what the listener could not serve.
    fn tls(&mut self, raw: RawTls, server: &ServerConfig) -> Option<TlsConfig> {
        let p = root().key("tls");
        let listen = self.socket_addr(&p.key("listen"), raw.listen, defaults::TLS_LISTEN);
        for (other, addr) in [
            ("server.listen", server.listen),
            ("server.admin_listen", server.admin_listen),
        ] {
            if listen == addr && listen.port() != 0 {
                self.fail(
                    &p.key("listen"),
                    format!("{listen} is also {other}; the TLS listener needs its own address"),
                );
            }
        }
        let redirect_http = raw.redirect_http.unwrap_or(false);
        if raw.cert.is_empty() {
            self.fail(
                &p.key("cert"),
                "at least one certificate is required: add [[tls.cert]] with cert and key (PEM files)",
            );
            if redirect_http {
                self.fail(
                    &p.key("redirect_http"),
                    "sends plain HTTP to the TLS listener, which has no certificate; add [[tls.cert]]",
                );
            }
            return None;
        }
        let mut certs = Vec::with_capacity(raw.cert.len());
        let mut seen: Vec<(String, usize)> = Vec::new();
        let mut ok = true;
        for (i, c) in raw.cert.into_iter().enumerate() {
            let cp = p.key("cert").index(i);
            if c.hosts.is_empty() && i > 0 {
                self.fail(
                    &cp.key("hosts"),
                    "must list the host names this certificate is for; only the first certificate (the default) may leave hosts out",
                );
            }
            let mut hosts = Vec::with_capacity(c.hosts.len());
            for (j, host) in c.hosts.iter().enumerate() {
                let here = cp.key("hosts").index(j);
                let (wild, bare) = match host.strip_prefix("*.") {
                    Some(rest) => ("*.", rest),
                    None => ("", host.as_str()),
                };
                let host = match check_host(bare) {
                    Ok(h) if !h.starts_with('[') => format!("{wild}{h}"),
                    Ok(_) => {
                        self.fail(
                            &here,
                            format!("{host:?} is an IPv6 address; SNI carries host names only"),
                        );
                        continue;
                    }
                    Err(why) => {
                        let why = if bare.contains('*') {
                            "may hold * only as a whole first label, as in \"*.example.com\""
                        } else {
                            why
                        };
                        self.fail(&here, format!("{host:?} {why}"));
                        continue;
                    }
                };
                if let Some((_, k)) = seen.iter().find(|(h, _)| *h == host) {
                    self.fail(
                        &here,
                        format!("duplicate host {host:?}; tls.cert[{k}].hosts lists it too"),
                    );
                    continue;
                }
                seen.push((host.clone(), i));
                hosts.push(host);
            }
            let mut path = |key: &str, text: String| {
                if text.trim().is_empty() {
                    self.fail(&cp.key(key), "must be a file path (PEM)");
                    None
                } else {
                    Some(PathBuf::from(text))
                }
            };
            let (Some(cert), Some(key)) = (path("cert", c.cert), path("key", c.key)) else {
                ok = false;
                continue;
            };
            match crate::tls::load_certified_key(&cert, &key) {
                Ok(certified) => certs.push(TlsCert {
                    hosts,
                    cert,
                    key,
                    certified: std::sync::Arc::new(certified),
                }),
                Err(e) => {
                    let which = if e.is_key() { "key" } else { "cert" };
                    self.fail(&cp.key(which), e.to_string());
                    ok = false;
                }
            }
        }
        ok.then_some(TlsConfig {
            listen,
            redirect_http,
            certs,
        })
    }

    fn server(&mut self, raw: RawServer) -> ServerConfig {
        let p = root().key("server");
        let listen = self.socket_addr(&p.key("listen"), raw.listen, defaults::LISTEN);
        let admin_listen = self.socket_addr(
            &p.key("admin_listen"),
            raw.admin_listen,
            defaults::ADMIN_LISTEN,
        );
        if listen == admin_listen && listen.port() != 0 {
            self.fail(
                &p.key("admin_listen"),
                format!("{admin_listen} is also server.listen; the admin listener needs its own address"),
            );
        }
        let admin_token = self
            .env_name(
                &p.key("admin_token_env"),
                raw.admin_token_env,
                defaults::ADMIN_TOKEN_ENV,
            )
            .and_then(|var| self.env_value(&var))
            .map(Secret);
        let reserved_prefix = raw
            .reserved_prefix
            .unwrap_or_else(|| defaults::RESERVED_PREFIX.to_owned());
        if let Err(why) = check_reserved_prefix(&reserved_prefix) {
            self.fail(
                &p.key("reserved_prefix"),
                format!("{reserved_prefix:?} {why}"),
            );
        }
        let trusted_proxies = self.nets(&p.key("trusted_proxies"), raw.trusted_proxies);
        let unmatched = match raw.unmatched {
            None | Some(RawUnmatched::Forward) => Unmatched::Forward,
            Some(RawUnmatched::NotFound) => Unmatched::NotFound,
        };
        let max_connections = raw.max_connections.unwrap_or(defaults::MAX_CONNECTIONS);
        if max_connections == 0 {
            self.fail(&p.key("max_connections"), "must be at least 1, got 0");
        }
        let max_connections_per_ip = raw
            .max_connections_per_ip
            .unwrap_or(defaults::MAX_CONNECTIONS_PER_IP);
        if max_connections_per_ip == 0 {
            self.fail(
                &p.key("max_connections_per_ip"),
                "must be at least 1, got 0",
            );
        }
        let max_header_bytes = raw.max_header_bytes.unwrap_or(defaults::MAX_HEADER_BYTES);
        if !(MIN_HEADER_BYTES..=MAX_HEADER_BYTES).contains(&max_header_bytes) {
            self.fail(
                &p.key("max_header_bytes"),
                format!("must be between {MIN_HEADER_BYTES} and {MAX_HEADER_BYTES}, got {max_header_bytes}"),
            );
        }
        let header_read_timeout = self.duration(
            &p.key("header_read_timeout"),
            raw.header_read_timeout,
            defaults::HEADER_READ_TIMEOUT,
            Duration::ZERO,
        );
        let drain_timeout = self.duration(
            &p.key("drain_timeout"),
            raw.drain_timeout,
            defaults::DRAIN_TIMEOUT,
            Duration::ZERO,
        );
        let workers = raw.workers.unwrap_or(0);
        if workers > MAX_WORKERS {
            self.fail(
                &p.key("workers"),
                format!("must be between 0 (one per core) and {MAX_WORKERS}, got {workers}"),
            );
        }
        let mut poll_limit = |key: &str, value: Option<u64>, default: u32| -> u32 {
            let value = value.unwrap_or(u64::from(default));
            if !(1..=1_000_000).contains(&value) {
                self.fail(
                    &p.key(key),
                    format!("must be between 1 and 1000000, got {value}"),
                );
            }
            u32::try_from(value).unwrap_or(default).max(1)
        };
        let ip_polls_per_second = poll_limit(
            "ip_polls_per_second",
            raw.ip_polls_per_second,
            defaults::IP_POLLS_PER_SECOND,
        );
        let ip_poll_burst = poll_limit("ip_poll_burst", raw.ip_poll_burst, defaults::IP_POLL_BURST);
        let ip_arrivals_per_second = poll_limit(
            "ip_arrivals_per_second",
            raw.ip_arrivals_per_second,
            defaults::IP_ARRIVALS_PER_SECOND,
        );
        let ip_arrival_burst = poll_limit(
            "ip_arrival_burst",
            raw.ip_arrival_burst,
            defaults::IP_ARRIVAL_BURST,
        );
        let mut count = |key: &str, value: Option<u64>, default: u64, max: u64| -> u64 {
            let value = value.unwrap_or(default);
            if !(1..=max).contains(&value) {
                self.fail(
                    &p.key(key),
                    format!("must be between 1 and {max}, got {value}"),
                );
                return default;
            }
            value
        };
        let max_streams_per_connection = count(
            "max_streams_per_connection",
            raw.max_streams_per_connection,
            defaults::MAX_STREAMS_PER_CONNECTION,
            MAX_STREAMS,
        );
        let max_streams_per_ip = count(
            "max_streams_per_ip",
            raw.max_streams_per_ip,
            defaults::MAX_STREAMS_PER_IP,
            MAX_STREAMS * 1000,
        );
        let request_body_min_rate = count(
            "request_body_min_rate",
            raw.request_body_min_rate,
            defaults::REQUEST_BODY_MIN_RATE,
            1 << 40,
        );
        let send_timeout = self.duration(
            &p.key("send_timeout"),
            raw.send_timeout,
            defaults::SEND_TIMEOUT,
            Duration::ZERO,
        );
        let request_body_timeout = self.duration(
            &p.key("request_body_timeout"),
            raw.request_body_timeout,
            defaults::REQUEST_BODY_TIMEOUT,
            Duration::ZERO,
        );
        let tunnel_idle_timeout = self.duration(
            &p.key("tunnel_idle_timeout"),
            raw.tunnel_idle_timeout,
            defaults::TUNNEL_IDLE_TIMEOUT,
            Duration::ZERO,
        );
        ServerConfig {
            listen,
            admin_listen,
            admin_token,
            reserved_prefix,
            trusted_proxies,
            unmatched,
            ip_polls_per_second,
            ip_poll_burst,
            ip_arrivals_per_second,
            ip_arrival_burst,
            workers: usize::try_from(workers.min(MAX_WORKERS)).unwrap_or(1),
            access_log: raw.access_log.unwrap_or(false),
            max_connections: usize::try_from(max_connections).unwrap_or(usize::MAX),
            max_connections_per_ip: usize::try_from(max_connections_per_ip).unwrap_or(usize::MAX),
            max_header_bytes: usize::try_from(max_header_bytes).unwrap_or(usize::MAX),
            header_read_timeout,
            drain_timeout,
            max_streams_per_connection: u32::try_from(max_streams_per_connection).unwrap_or(1),
            max_streams_per_ip: usize::try_from(max_streams_per_ip).unwrap_or(usize::MAX),
            send_timeout,
            request_body_timeout,
            request_body_min_rate,
            tunnel_idle_timeout,
            unmatched_upgrades: raw.unmatched_upgrades.unwrap_or(false),
            allow_path_colons: raw.allow_path_colons.unwrap_or(false),
        }
    }

    fn store(&mut self, raw: RawStore) -> StoreConfig {
        let p = root().key("store");
        let redis = matches!(raw.backend, Some(RawBackend::Redis));
        if !redis {
            // A URL with the memory backend usually means a forgotten
            // `backend = "redis"`: instances would silently not share state.
            for (key, set) in [
                ("url", raw.url.is_some()),
                ("sentinels", raw.sentinels.is_some()),
                ("sentinel_master", raw.sentinel_master.is_some()),
                ("sentinel_password_env", raw.sentinel_password_env.is_some()),
                ("password_env", raw.password_env.is_some()),
                ("replica_acks", raw.replica_acks.is_some()),
                ("replica_ack_timeout", raw.replica_ack_timeout.is_some()),
            ] {
                if set {
                    self.fail(
                        &p.key(key),
                        r#"is only used with backend = "redis"; set store.backend = "redis" or remove it"#,
                    );
                }
            }
        }
        let backend = if !redis {
            Backend::Memory
        } else {
            let password = self.password(&p.key("password_env"), raw.password_env);
            match (raw.url, raw.sentinels) {
                (Some(_), Some(_)) => {
                    self.fail(
                        &p.key("sentinels"),
                        "and store.url are two ways to find Redis; give one",
                    );
                    Backend::Memory
                }
                (None, Some(sentinels)) => {
                    let sentinel_password =
                        self.password(&p.key("sentinel_password_env"), raw.sentinel_password_env);
                    self.sentinels(
                        &p,
                        sentinels,
                        raw.sentinel_master,
                        password,
                        sentinel_password.as_deref(),
                    )
                }
                (url, None) => {
                    for key in ["sentinel_master", "sentinel_password_env"] {
                        let set = match key {
                            "sentinel_master" => raw.sentinel_master.is_some(),
                            _ => raw.sentinel_password_env.is_some(),
                        };
                        if set {
                            self.fail(&p.key(key), "is only used with store.sentinels");
                        }
                    }
                    Backend::Redis {
                        urls: self.redis_urls(&p.key("url"), url, password.as_deref()),
                    }
                }
            }
        };
        let timeout = self.duration(
            &p.key("timeout"),
            raw.timeout,
            defaults::STORE_TIMEOUT,
            Duration::ZERO,
        );
        // One slow call is not an outage: the window must outlast a call.
        let unreachable_path = p.key("unreachable_after");
        let unreachable_after = self.duration(
            &unreachable_path,
            raw.unreachable_after,
            defaults::STORE_UNREACHABLE_AFTER.max(timeout),
            Duration::from_millis(1),
        );
        if unreachable_after < timeout {
            self.fail(
                &unreachable_path,
                format!(
                    "must be at least store.timeout ({} ms): one call that takes the whole timeout is a busy store, not an unreachable one",
                    timeout.as_millis()
                ),
            );
        }
        let fail_mode = match raw.fail_mode {
            None | Some(RawFailMode::Open) => FailMode::Open,
            Some(RawFailMode::Closed) => FailMode::Closed,
            Some(RawFailMode::Local) => FailMode::Local,
        };
        let instances = raw.instances.unwrap_or(1);
        if instances == 0 {
            self.fail(&p.key("instances"), "must be at least 1, got 0");
        }
        let replica_acks = raw.replica_acks.unwrap_or(0);
        if replica_acks > 16 {
            self.fail(
                &p.key("replica_acks"),
                format!("is the number of replicas that must acknowledge a decision: at most 16, got {replica_acks}"),
            );
        }
        // Within the store timeout, which bounds the whole decision.
        let ack_path = p.key("replica_ack_timeout");
        let replica_ack_timeout = self.duration(
            &ack_path,
            raw.replica_ack_timeout,
            timeout / 2,
            Duration::from_millis(1),
        );
        if replica_ack_timeout >= timeout && timeout > Duration::ZERO {
            self.fail(
                &ack_path,
                format!(
                    "must be shorter than store.timeout ({} ms), which bounds the decision and its acknowledgements together",
                    timeout.as_millis()
                ),
            );
        }
        let tls_ca = raw
            .tls_ca
            .and_then(|ca| self.tls_ca(&p.key("tls_ca"), ca, &backend));
        StoreConfig {
            backend,
            timeout,
            unreachable_after,
            fail_mode,
            instances: instances.max(1),
            tls_ca,
            replica_acks: u32::try_from(replica_acks.min(16)).unwrap_or(16),
            replica_ack_timeout,
        }
    }

    /// A password from the environment variable named at `path`, if any.
    fn password(&mut self, path: &KeyPath, name: Option<String>) -> Option<String> {
        let name = name?;
        let var = self.env_name(path, Some(name), "")?;
        let value = self.env_value(&var);
        if value.is_none() {
            self.fail(path, format!("environment variable {var} is not set"));
        }
        value
    }

    /// `store.sentinels`: `host:port` (or `redis://`/`rediss://` URLs of
    /// the Sentinels), with `store.sentinel_master`.
    fn sentinels(
        &mut self,
        p: &KeyPath,
        raw: Vec<String>,
        master: Option<String>,
        password: Option<String>,
        sentinel_password: Option<&str>,
    ) -> Backend {
        let path = p.key("sentinels");
        if raw.is_empty() {
            self.fail(&path, "must list at least one Sentinel (\"host:port\")");
        }
        let mut sentinels = Vec::with_capacity(raw.len());
        for (i, entry) in raw.into_iter().enumerate() {
            let url = if entry.contains("://") {
                entry.clone()
            } else {
                format!("redis://{entry}")
            };
            match check_redis_url(&url, sentinel_password) {
                Ok(url) if redis::parse_redis_url(&url).is_some_and(|u| u.port().is_some()) => {
                    sentinels.push(url)
                }
                Ok(_) => self.fail(
                    &path.index(i),
                    format!(
                        "{} needs a port (Sentinels listen on 26379 by default)",
                        redact_url(&entry)
                    ),
                ),
                Err(why) => self.fail(&path.index(i), format!("{} {why}", redact_url(&entry))),
            }
        }
        let tls = sentinels
            .iter()
            .filter(|u| u.starts_with("rediss://"))
            .count();
        if tls != 0 && tls != sentinels.len() {
            self.fail(
                &path,
                "mixes redis:// and rediss:// Sentinels; use TLS with all or none",
            );
        }
        let master = match master {
            Some(m) if !m.trim().is_empty() && !m.contains(char::is_whitespace) => m,
            Some(m) => {
                self.fail(
                    &p.key("sentinel_master"),
                    format!("{m:?} is not a master name (one word, as in the Sentinels' `sentinel monitor`)"),
                );
                String::new()
            }
            None => {
                self.fail(
                    &p.key("sentinel_master"),
                    "is required with store.sentinels: the name the Sentinels monitor the primary by",
                );
                String::new()
            }
        };
        Backend::Sentinel(SentinelConfig {
            sentinels,
            master,
            password,
            tls: tls > 0,
        })
    }

    /// `store.tls_ca`: a PEM bundle of the CAs `rediss://` servers are
    /// checked against, read here so a bad file is a config problem.
    fn tls_ca(&mut self, path: &KeyPath, text: String, backend: &Backend) -> Option<PathBuf> {
        let uses_tls = backend.uses_tls();
        if !uses_tls {
            self.fail(path, "is only used with rediss:// URLs (Redis over TLS)");
            return None;
        }
        let ca = PathBuf::from(text);
        match crate::tls::load_certs(&ca) {
            Ok(_) => Some(ca),
            Err(e) => {
                self.fail(path, e.to_string());
                None
            }
        }
    }

    fn region(&mut self, raw: RawRegion, store: &StoreConfig) -> RegionConfig {
        let p = root().key("region");
        if check_id(&raw.name).is_err() {
            self.fail(
                &p.key("name"),
                format!(
                    "{:?} must be 1 to 64 characters of a-z, 0-9, _ and -",
                    raw.name
                ),
            );
        }
        let global_url = match check_redis_url(&raw.global_url, None) {
            Ok(url) => url,
            Err(why) => {
                self.fail(
                    &p.key("global_url"),
                    format!("{} {why}", redact_url(&raw.global_url)),
                );
                String::new()
            }
        };
        match &store.backend {
            Backend::Memory => self.fail(
                &p.key("name"),
                r#"region mode needs store.backend = "redis": the instances of a region share store.url as their regional counter"#,
            ),
            Backend::Redis { urls } if urls.contains(&global_url) => self.fail(
                &p.key("global_url"),
                "is the same Redis as store.url; the global store must be a Redis of its own, shared by every region",
            ),
            Backend::Redis { .. } | Backend::Sentinel(_) => {}
        }
        let interval_text = raw.sync_interval.as_ref().map(|d| d.text.clone());
        let sync_interval = self.duration(
            &p.key("sync_interval"),
            raw.sync_interval,
            defaults::SYNC_INTERVAL,
            defaults::MIN_SYNC_INTERVAL,
        );
        if sync_interval > defaults::MAX_SYNC_INTERVAL {
            self.fail(
                &p.key("sync_interval"),
                format!(
                    "must be at most {}, got {:?}",
                    humantime::format_duration(defaults::MAX_SYNC_INTERVAL),
                    interval_text.unwrap_or_default()
                ),
            );
        }
        RegionConfig {
            name: raw.name,
            global_url,
            sync_interval: sync_interval.min(defaults::MAX_SYNC_INTERVAL),
        }
    }

    fn redis_urls(
        &mut self,
        path: &KeyPath,
        raw: Option<RawUrls>,
        password: Option<&str>,
    ) -> Vec<String> {
        let Some(raw) = raw else {
            self.fail(
                path,
                r#"is required when backend = "redis" (e.g. "redis://127.0.0.1:6379/")"#,
            );
            return Vec::new();
        };
        if raw.urls.is_empty() {
            self.fail(path, "must list at least one redis:// URL");
        }
        let mut urls = Vec::with_capacity(raw.urls.len());
        for (i, url) in raw.urls.into_iter().enumerate() {
            let here = if raw.is_list {
                path.index(i)
            } else {
                path.clone()
            };
            match check_redis_url(&url, password) {
                Ok(url) => urls.push(url),
                Err(why) => self.fail(&here, format!("{} {why}", redact_url(&url))),
            }
        }
        // A cluster client speaks TLS to every node or to none.
        let tls = urls.iter().filter(|u| u.starts_with("rediss://")).count();
        if tls != 0 && tls != urls.len() {
            self.fail(
                path,
                "mixes redis:// and rediss:// nodes; a Redis Cluster uses TLS on every node or on none",
            );
        }
        urls
    }

    fn cookie(&mut self, raw: RawCookie, options: LoadOptions) -> CookieConfig {
        let p = root().key("cookie");
        let env_path = p.key("keys_env");
        let var = self.env_name(&env_path, raw.keys_env, defaults::KEYS_ENV);
        let from_env = var
            .as_ref()
            .and_then(|v| self.env_value(v).map(|s| (v.clone(), s)));
        let mut keys = Vec::new();
        // The environment wins over inline keys, as the usual override order.
        if let Some((var, value)) = from_env {
            let entries = value.split(',').map(str::trim).filter(|e| !e.is_empty());
            for (i, entry) in entries.enumerate() {
                match crate::secret::parse_key(entry) {
                    Ok(key) => keys.push(key),
                    Err(why) => self.fail(
                        &env_path,
                        format!("key {} in environment variable {var}: {why}", i + 1),
                    ),
                }
            }
        } else if let Some(inline) = raw.keys {
            for (i, entry) in inline.iter().enumerate() {
                match crate::secret::parse_key(entry) {
                    Ok(key) => keys.push(key),
                    Err(why) => self.fail(&p.key("keys").index(i), why),
                }
            }
        }
        let had_errors = self
            .problems
            .iter()
            .any(|pr| pr.key.starts_with("cookie.keys"));
        if keys.is_empty() && !had_errors && !options.allow_missing_keys {
            let var = var.unwrap_or_else(|| defaults::KEYS_ENV.to_owned());
            self.fail(
                &env_path,
                format!(
                    "no cookie keys configured; set {var} to a comma-separated list of keys \
                     (make one with `waitroom keygen`), or list them in cookie.keys"
                ),
            );
        }
        let max_networks_per_session = raw
            .max_networks_per_session
            .unwrap_or(defaults::MAX_NETWORKS_PER_SESSION);
        if max_networks_per_session > 1_000 {
            self.fail(
                &p.key("max_networks_per_session"),
                format!("{max_networks_per_session} is over 1000 (0 turns the limit off)"),
            );
        }
        CookieConfig {
            keys,
            secure: raw.secure.unwrap_or(true),
            bind_to_client: raw.bind_to_client.unwrap_or(false),
            max_networks_per_session,
        }
    }

    fn origin(&mut self, raw: RawOrigin) -> OriginConfig {
        let p = root().key("origin");
        let url = match check_origin_url(&raw.url) {
            Ok(uri) => uri,
            Err(why) => {
                self.fail(&p.key("url"), format!("{:?} {why}", raw.url));
                http::Uri::from_static("http://127.0.0.1/")
            }
        };
        let timeout = self.duration(
            &p.key("timeout"),
            raw.timeout,
            defaults::ORIGIN_TIMEOUT,
            Duration::ZERO,
        );
        let connect_timeout = self.duration(
            &p.key("connect_timeout"),
            raw.connect_timeout,
            defaults::ORIGIN_CONNECT_TIMEOUT,
            Duration::ZERO,
        );
        let sign_key = match raw.sign_key_env {
            None => None,
            Some(name) => {
                let path = p.key("sign_key_env");
                let var = self.env_name(&path, Some(name), "");
                match var.as_ref().map(|v| (v, self.env_value(v))) {
                    Some((_, Some(value))) if value.len() >= MIN_SIGN_KEY_LEN => {
                        Some(Secret(value))
                    }
                    Some((var, Some(_))) => {
                        self.fail(
                            &path,
                            format!("the key in {var} is shorter than {MIN_SIGN_KEY_LEN} characters (make one with `waitroom keygen`)"),
                        );
                        None
                    }
                    Some((var, None)) => {
                        self.fail(
                            &path,
                            format!("environment variable {var} is not set (it must hold the signing key)"),
                        );
                        None
                    }
                    None => None,
                }
            }
        };
        let max_connections = raw
            .max_connections
            .unwrap_or(defaults::ORIGIN_MAX_CONNECTIONS);
        if !(1..=1_000_000).contains(&max_connections) {
            self.fail(
                &p.key("max_connections"),
                format!("must be between 1 and 1000000, got {max_connections}"),
            );
        }
        OriginConfig {
            url,
            timeout,
            connect_timeout,
            sign_key,
            max_connections: usize::try_from(max_connections.clamp(1, 1_000_000)).unwrap_or(1),
        }
    }

    fn rooms(&mut self, raw: Vec<RawRoom>, reserved_prefix: &str) -> Vec<RoomConfig> {
        if raw.is_empty() {
            self.fail(
                &root().key("room"),
                "at least one [[room]] is required (a daemon without rooms protects nothing)",
            );
        }
        let rooms: Vec<RoomConfig> = raw
            .into_iter()
            .enumerate()
            .map(|(i, r)| self.room(&root().key("room").index(i), r, reserved_prefix))
            .collect();
        for (i, room) in rooms.iter().enumerate() {
            let p = root().key("room").index(i);
            if let Some(j) = rooms[..i].iter().position(|r| r.id == room.id) {
                self.fail(
                    &p.key("id"),
                    format!(
                        "duplicate room id {:?}; room[{j}] has it too, ids must be unique",
                        room.id
                    ),
                );
            }
            if let Some(j) = rooms[..i]
                .iter()
                .position(|r| r.host == room.host && r.path == room.path)
            {
                let host = room.host.as_deref().unwrap_or("any host");
                self.fail(
                    &p.key("path"),
                    format!(
                        "{:?} on {host} is also room[{j}]'s host and path; each room needs its own",
                        room.path
                    ),
                );
            }
        }
        rooms
    }

    fn room(&mut self, p: &KeyPath, mut raw: RawRoom, reserved_prefix: &str) -> RoomConfig {
        if let Err(why) = check_id(&raw.id) {
            self.fail(&p.key("id"), format!("{:?} {why}", raw.id));
        }
        let proof_of_work = match raw.proof_of_work.unwrap_or(0) {
            bits @ 0..=MAX_PROOF_OF_WORK => bits as u8,
            bits => {
                self.fail(
                    &p.key("proof_of_work"),
                    format!("{bits} is out of range: 0 (off) to {MAX_PROOF_OF_WORK} bits; 16 to 20 takes a browser a few hundred milliseconds"),
                );
                0
            }
        };
        let captcha = self.captcha(p, &mut raw_captcha(&mut raw), proof_of_work);
        let enqueue_token = raw
            .enqueue_token
            .take()
            .and_then(|t| self.enqueue_token(&p.key("enqueue_token"), &raw.id, t));
        let lanes = self.lanes(p, std::mem::take(&mut raw.lane), enqueue_token.is_some());
        let name = raw.name.unwrap_or_else(|| raw.id.clone());
        if name.trim().is_empty()
            || name.chars().count() > 200
            || name.chars().any(char::is_control)
        {
            self.fail(
                &p.key("name"),
                format!("{name:?} must be 1 to 200 characters without control characters"),
            );
        }
        let host = raw.host.and_then(|h| match check_host(&h) {
            Ok(host) => Some(host),
            Err(why) => {
                self.fail(&p.key("host"), format!("{h:?} {why}"));
                None
            }
        });
        let path = match check_path(&raw.path) {
            Err(why) => {
                self.fail(&p.key("path"), format!("{:?} {why}", raw.path));
                raw.path.clone()
            }
            Ok(path) => {
                if crate::canonical::covers(reserved_prefix, &path, false) {
                    self.fail(
                        &p.key("path"),
                        format!(
                            "{:?} is under server.reserved_prefix {reserved_prefix:?}, which the daemon answers itself",
                            raw.path
                        ),
                    );
                }
                path
            }
        };
        for (key, value) in [
            ("total_active_users", raw.total_active_users),
            ("new_users_per_minute", raw.new_users_per_minute),
        ] {
            if let Err(why) = check_limit(value) {
                self.fail(&p.key(key), why);
            }
        }
        let one_second = Duration::from_secs(1);
        let session_duration = self.duration(
            &p.key("session_duration"),
            raw.session_duration,
            defaults::SESSION_DURATION,
            one_second,
        );
        let refresh_interval = self.duration(
            &p.key("refresh_interval"),
            raw.refresh_interval,
            defaults::REFRESH_INTERVAL,
            one_second,
        );
        let abandon_text = raw.abandon_after.as_ref().map(|d| d.text.clone());
        let abandon_after = self.duration(
            &p.key("abandon_after"),
            raw.abandon_after,
            defaults::ABANDON_AFTER,
            Duration::ZERO,
        );
        if abandon_after <= refresh_interval {
            let written = abandon_text.map_or_else(
                || format!("the default {}", humantime::format_duration(abandon_after)),
                |t| format!("{t:?}"),
            );
            self.fail(
                &p.key("abandon_after"),
                format!(
                    "must be longer than refresh_interval ({}), or queued visitors are dropped \
                     between two polls; got {written} (a few times refresh_interval is safer)",
                    humantime::format_duration(refresh_interval)
                ),
            );
        }
        let code = raw.queue_status_code.unwrap_or(defaults::QUEUE_STATUS_CODE);
        let queue_status_code = match u16::try_from(code)
            .ok()
            .filter(|c| (200..=599).contains(c))
            .and_then(|c| http::StatusCode::from_u16(c).ok())
        {
            Some(status) => status,
            None => {
                self.fail(
                    &p.key("queue_status_code"),
                    format!("must be an HTTP status from 200 to 599, got {code}"),
                );
                http::StatusCode::OK
            }
        };
        let template = raw.template.and_then(|t| {
            if t.trim().is_empty() {
                self.fail(
                    &p.key("template"),
                    "must be a file path; leave it out for the built-in page",
                );
                None
            } else {
                Some(PathBuf::from(t))
            }
        });
        let mut bypass_paths = Vec::new();
        for (i, path) in raw.bypass_paths.unwrap_or_default().iter().enumerate() {
            match check_path(path) {
                Ok(canonical) => bypass_paths.push(canonical),
                Err(why) => self.fail(&p.key("bypass_paths").index(i), format!("{path:?} {why}")),
            }
        }
        let bypass_ips = self.nets(&p.key("bypass_ips"), raw.bypass_ips);
        let bypass_header = raw
            .bypass_header
            .and_then(|h| self.bypass_header(&p.key("bypass_header"), h));
        let language = raw.language.map_or(Language::Auto, |code| {
            Language::parse(code.trim()).unwrap_or_else(|| {
                let codes: Vec<&str> = Lang::ALL.iter().map(|l| l.code()).collect();
                self.fail(
                    &p.key("language"),
                    format!(
                        "{code:?} is not \"auto\" or one of the languages shipped: {}",
                        codes.join(", ")
                    ),
                );
                Language::Auto
            })
        });
        let events = self.events(p, raw.event);
        let failed_challenge = raw.failed_challenge.unwrap_or_default();
        let bot_score = match (raw.bot_score_header, raw.min_bot_score) {
            (None, None) => None,
            (Some(header), Some(min)) => {
                let name = http::HeaderName::from_bytes(header.as_bytes()).ok();
                if name.is_none() {
                    self.fail(
                        &p.key("bot_score_header"),
                        format!("{header:?} is not a valid HTTP header name"),
                    );
                }
                if !(1..=99).contains(&min) {
                    self.fail(
                        &p.key("min_bot_score"),
                        format!("{min} is out of range: 1 to 99 (scores below it are bots)"),
                    );
                }
                if failed_challenge == FailedChallenge::Retry {
                    self.fail(
                        &p.key("failed_challenge"),
                        "bot_score_header sends the visitors it names to the shadow queue: set failed_challenge = \"shadow\" (or \"log\" to count them first)",
                    );
                }
                name.map(|header| BotScore {
                    header,
                    min: min.clamp(1, 99) as u8,
                })
            }
            (Some(_), None) => {
                self.fail(
                    &p.key("min_bot_score"),
                    "missing: bot_score_header needs the score below which a visitor is a bot",
                );
                None
            }
            (None, Some(_)) => {
                self.fail(
                    &p.key("bot_score_header"),
                    "missing: min_bot_score needs the header a trusted proxy puts the score in",
                );
                None
            }
        };
        RoomConfig {
            id: raw.id,
            name,
            host,
            path,
            total_active_users: raw.total_active_users,
            new_users_per_minute: raw.new_users_per_minute,
            session_duration,
            session_renewal: raw.session_renewal.unwrap_or(true),
            queueing_method: raw.queueing_method.unwrap_or(QueueingMethod::Fifo),
            max_queue_length: raw.max_queue_length.unwrap_or(0),
            refresh_interval,
            abandon_after,
            queue_status_code,
            json_response: raw.json_response.unwrap_or(true),
            template,
            bypass_paths,
            bypass_ips,
            bypass_header,
            case_insensitive_paths: raw.case_insensitive_paths.unwrap_or(false),
            bypass_upgrades: raw.bypass_upgrades.unwrap_or(false),
            proof_of_work,
            bot_score,
            failed_challenge,
            captcha,
            enqueue_token,
            lanes,
            state: raw.state.unwrap_or(RoomState::Open),
            language,
            events,
        }
    }

    /// `[[room.lane]]`: at most `MAX_LANES`, names unique, shares adding
    /// up to at most 1, each with a way in; every code in one lane only.
    fn lanes(&mut self, p: &KeyPath, raw: Vec<RawLane>, tokens: bool) -> Vec<LaneConfig> {
        use std::collections::HashSet;
        if raw.len() > MAX_LANES {
            self.fail(
                &p.key("lane"),
                format!("{} lanes; a room has at most {MAX_LANES}", raw.len()),
            );
        }
        let mut lanes: Vec<LaneConfig> = Vec::new();
        let mut seen_codes: HashSet<u64> = HashSet::new();
        for (i, raw) in raw.into_iter().enumerate().take(MAX_LANES) {
            let p = p.key("lane").index(i);
            let name_ok = (1..=32).contains(&raw.name.len())
                && raw.name.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'
                });
            if !name_ok {
                self.fail(
                    &p.key("name"),
                    format!(
                        "{:?} must be 1 to 32 characters of a-z, 0-9, _ and -",
                        raw.name
                    ),
                );
            } else if raw.name == "general" || lanes.iter().any(|l| l.name == raw.name) {
                self.fail(
                    &p.key("name"),
                    format!(
                        "{:?} is taken (\"general\" is the room's own queue)",
                        raw.name
                    ),
                );
            }
            let share = (raw.share * 1000.0).round();
            if !(raw.share > 0.0 && raw.share <= 1.0 && share >= 1.0) {
                self.fail(
                    &p.key("share"),
                    format!("{} must be more than 0 and at most 1 (0.3: 30% of admissions while the lanes wait)", raw.share),
                );
            }
            let mut lane = LaneConfig {
                name: raw.name,
                share: share.clamp(1.0, 1000.0) as u16,
                codes: HashSet::new(),
                single_use: HashSet::new(),
                token_claim: raw.token_claim.unwrap_or(false),
            };
            if let Some(var) = raw.codes_env {
                let path = p.key("codes_env");
                if let Some(var) = self.env_name(&path, Some(var), "") {
                    match self.env_value(&var) {
                        Some(v) => {
                            self.long_codes(&path, v.split(','));
                            lane.codes.extend(codes_in(v.split(',')));
                        }
                        None => self.fail(
                            &path,
                            format!(
                                "environment variable {var} is not set; it holds the lane's codes"
                            ),
                        ),
                    }
                    if lane.codes.is_empty() {
                        self.fail(&path, format!("{var} holds no code"));
                    }
                }
            }
            if let Some(file) = raw.single_use_codes_file {
                let path = p.key("single_use_codes_file");
                match std::fs::read_to_string(&file) {
                    Ok(text) => {
                        self.long_codes(&path, text.lines());
                        lane.single_use.extend(codes_in(text.lines()));
                        if lane.single_use.is_empty() {
                            self.fail(&path, format!("{file} holds no code"));
                        }
                    }
                    Err(e) => self.fail(&path, format!("cannot read {file}: {e}")),
                }
            }
            if lane.token_claim && !tokens {
                self.fail(
                    &p.key("token_claim"),
                    "needs [room.enqueue_token]: the claim is read from a verified token",
                );
            }
            if lane.codes.is_empty() && lane.single_use.is_empty() && !lane.token_claim {
                self.fail(
                    &p,
                    "no way in: give codes_env, single_use_codes_file or token_claim = true",
                );
            }
            for code in lane.codes.iter().chain(&lane.single_use) {
                if !seen_codes.insert(*code) {
                    self.fail(&p, "a code is given twice (in this lane or another): each code enters one lane, once");
                    break;
                }
            }
            lanes.push(lane);
        }
        let total: u32 = lanes.iter().map(|l| u32::from(l.share)).sum();
        if total > 1000 {
            self.fail(
                &p.key("lane"),
                format!(
                    "the lanes' shares add up to {}; at most 1 (the general queue gets the rest)",
                    f64::from(total) / 1000.0
                ),
            );
        }
        lanes
    }

    /// Refuses lane codes shorter than [`MIN_CODE_CHARS`]: a short code is
    /// found by guessing (each guess costs an address one of its refused
    /// codes, `gate::lanes`). The message names no code.
    fn long_codes<'a>(&mut self, path: &KeyPath, items: impl Iterator<Item = &'a str>) {
        let short = items
            .map(str::trim)
            .filter(|c| !c.is_empty() && !c.starts_with('#'))
            .filter(|c| c.chars().count() < MIN_CODE_CHARS)
            .count();
        if short > 0 {
            self.fail(
                path,
                format!("holds {short} code(s) shorter than {MIN_CODE_CHARS} characters: a short code is guessed; use at least {MIN_CODE_CHARS} random letters and digits"),
            );
        }
    }

    /// `[room.enqueue_token]`: its mode and keys (at least one key).
    fn enqueue_token(
        &mut self,
        p: &KeyPath,
        room: &str,
        raw: RawEnqueueToken,
    ) -> Option<EnqueueToken> {
        let required = match raw.mode.as_deref().unwrap_or("optional") {
            "off" => return None,
            "optional" => false,
            "required" => true,
            other => {
                self.fail(
                    &p.key("mode"),
                    format!("{other:?} is not \"off\", \"optional\" or \"required\""),
                );
                return None;
            }
        };
        let mut keys = crate::enqueue::TokenKeys::default();
        if let Some(var) = raw.hmac_keys_env {
            let path = p.key("hmac_keys_env");
            let var = self.env_name(&path, Some(var), "")?;
            match self.env_value(&var) {
                Some(v) => {
                    for (i, k) in v.split(',').enumerate() {
                        use base64::engine::Engine;
                        match base64::engine::general_purpose::STANDARD.decode(k.trim()) {
                            Ok(bytes) if bytes.len() >= 32 => keys.hmac.push(bytes),
                            _ => self.fail(
                                &path,
                                format!("key {i} in {var} is not base64 of at least 32 bytes"),
                            ),
                        }
                    }
                }
                None => self.fail(
                    &path,
                    format!("environment variable {var} is not set; it holds the HS256 secrets"),
                ),
            }
        }
        if let Some(file) = raw.jwks_file {
            let path = p.key("jwks_file");
            match std::fs::read_to_string(&file) {
                Ok(text) => match crate::enqueue::parse_jwks(&text) {
                    Ok(public) => keys.public = public,
                    Err(why) => self.fail(&path, format!("{file}: {why}")),
                },
                Err(e) => self.fail(&path, format!("cannot read {file}: {e}")),
            }
        }
        for (key, values) in [("audience", &raw.audience), ("issuer", &raw.issuer)] {
            if let Some(bad) = values
                .iter()
                .find(|v| v.is_empty() || v.len() > 256 || v.chars().any(char::is_control))
            {
                self.fail(
                    &p.key(key),
                    format!(
                        "{bad:?} is not a valid {key}: 1 to 256 characters, no control characters"
                    ),
                );
            }
        }
        let max_lifetime = self.duration(
            &p.key("max_lifetime"),
            raw.max_lifetime,
            Duration::from_secs(crate::enqueue::DEFAULT_MAX_LIFETIME_S),
            Duration::from_secs(60),
        );
        if keys.hmac.is_empty() && keys.public.is_empty() {
            self.fail(p, "no keys: give hmac_keys_env, jwks_file or both");
            return None;
        }
        let rules =
            crate::enqueue::Rules::new(room, &raw.audience, &raw.issuer, max_lifetime.as_secs());
        Some(EnqueueToken {
            required,
            keys,
            rules,
        })
    }

    /// `room.challenge` with a captcha provider, and its settings.
    fn captcha(&mut self, p: &KeyPath, raw: &mut RawCaptcha, proof_of_work: u8) -> Option<Captcha> {
        let kind = match raw.kind {
            None | Some(ChallengeKind::ProofOfWork) => return None,
            Some(kind) => kind,
        };
        if proof_of_work > 0 {
            self.fail(
                &p.key("proof_of_work"),
                format!(
                    "the room asks the {} challenge: proof_of_work must be 0",
                    kind.name()
                ),
            );
        }
        let (verify, script) = kind.default_urls().unwrap_or_default();
        let site_key = raw.site_key.take().unwrap_or_default();
        if site_key.is_empty()
            || !site_key.chars().all(|c| c.is_ascii_graphic())
            || site_key.contains(['"', '<', '>'])
        {
            self.fail(
                &p.key("challenge_site_key"),
                format!("missing or not a key: the {} site key", kind.name()),
            );
        }
        let secret_path = p.key("challenge_secret_env");
        let secret = match self.env_name(&secret_path, raw.secret_env.take(), "") {
            Some(var) => match self.env_value(&var) {
                Some(v) => Some(Secret(v)),
                None => {
                    self.fail(
                        &secret_path,
                        format!(
                            "environment variable {var} is not set; it holds the {} secret key",
                            kind.name()
                        ),
                    );
                    None
                }
            },
            None => None,
        };
        let verify_text = raw.verify_url.take().unwrap_or_else(|| verify.to_owned());
        let verify_url = match verify_text.parse::<http::Uri>() {
            Ok(u) if matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some() => {
                Some(u)
            }
            _ => {
                self.fail(
                    &p.key("challenge_verify_url"),
                    format!("{verify_text:?} is not an http(s) URL"),
                );
                None
            }
        };
        let script_url = raw.script_url.take().unwrap_or_else(|| script.to_owned());
        if !(script_url.starts_with("https://") || script_url.starts_with("http://"))
            || script_url.contains(['"', '<', '>', ' ', '\''])
        {
            self.fail(
                &p.key("challenge_script_url"),
                format!("{script_url:?} is not an http(s) URL"),
            );
        }
        let timeout = self.duration(
            &p.key("challenge_timeout"),
            raw.timeout.take(),
            Duration::from_secs(3),
            Duration::ZERO,
        );
        let concurrency = match raw.concurrency.unwrap_or(DEFAULT_CHALLENGE_CONCURRENCY) {
            n @ 1..=MAX_CHALLENGE_CONCURRENCY => n as usize,
            n => {
                self.fail(
                    &p.key("challenge_concurrency"),
                    format!("{n} is out of range: 1 to {MAX_CHALLENGE_CONCURRENCY} verifications in flight at once"),
                );
                1
            }
        };
        Some(Captcha {
            kind,
            site_key,
            secret: secret?,
            verify_url: verify_url?,
            script_url,
            timeout,
            on_error: raw.on_error.unwrap_or_default(),
            concurrency,
        })
    }

    fn bypass_header(
        &mut self,
        p: &KeyPath,
        raw: RawBypassHeader,
    ) -> Option<(http::HeaderName, Secret)> {
        let name = match http::HeaderName::from_bytes(raw.name.as_bytes()) {
            Ok(name) => Some(name),
            Err(_) => {
                self.fail(
                    &p.key("name"),
                    format!("{:?} is not a valid HTTP header name", raw.name),
                );
                None
            }
        };
        let value_path = p.key("value_env");
        let var = self.env_name(&value_path, Some(raw.value_env), "")?;
        // The value is a secret: messages name the variable, never its content.
        let value = match (self.env)(&var) {
            Some(v) if !v.is_empty() => v,
            _ => {
                self.fail(
                    &value_path,
                    format!("environment variable {var} is not set; it holds the bypass header's secret value"),
                );
                return None;
            }
        };
        if value.trim() != value || http::HeaderValue::from_str(&value).is_err() {
            self.fail(
                &value_path,
                format!(
                    "the value of {var} cannot match any request header: it has surrounding \
                     whitespace or characters not allowed in a header value"
                ),
            );
            return None;
        }
        Some((name?, Secret(value)))
    }

    fn events(&mut self, room: &KeyPath, raw: Vec<RawEvent>) -> Vec<EventConfig> {
        let mut events: Vec<EventConfig> = Vec::with_capacity(raw.len());
        for (i, e) in raw.into_iter().enumerate() {
            let p = room.key("event").index(i);
            if let Err(why) = check_id(&e.name) {
                self.fail(&p.key("name"), format!("{:?} {why}", e.name));
            }
            if let Some(j) = events.iter().position(|other| other.spec.name == e.name) {
                self.fail(
                    &p.key("name"),
                    format!(
                        "duplicate event name {:?}; event[{j}] of this room has it too",
                        e.name
                    ),
                );
            }
            let (start, end) = (e.start.0, e.end.0);
            if end <= start {
                self.fail(
                    &p.key("end"),
                    format!(
                        "{} must be after start {}",
                        humantime::format_rfc3339(end),
                        humantime::format_rfc3339(start)
                    ),
                );
            }
            let prequeue_start = e.prequeue_start.map(|t| t.0);
            if let Some(pre) = prequeue_start.filter(|pre| *pre > start) {
                self.fail(
                    &p.key("prequeue_start"),
                    format!(
                        "{} must not be after start {}",
                        humantime::format_rfc3339(pre),
                        humantime::format_rfc3339(start)
                    ),
                );
            }
            for (key, value) in [
                ("total_active_users", e.total_active_users),
                ("new_users_per_minute", e.new_users_per_minute),
            ] {
                if value == Some(0) {
                    self.fail(
                        &p.key(key),
                        "must be at least 1, got 0 (leave it out to keep the room's limit)",
                    );
                } else if let Some(Err(why)) = value.map(check_limit) {
                    self.fail(&p.key(key), why);
                }
            }
            let session_duration = e.session_duration.map(|raw| {
                self.duration(
                    &p.key("session_duration"),
                    Some(raw),
                    MIN_SESSION,
                    MIN_SESSION,
                )
            });
            let template = e.template.and_then(|t| {
                if t.trim().is_empty() {
                    self.fail(
                        &p.key("template"),
                        "must be a file path; leave it out for the room's page",
                    );
                    None
                } else {
                    Some(PathBuf::from(t))
                }
            });
            let ms = |t: std::time::SystemTime| {
                t.duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64)
            };
            let spec = EventSpec {
                name: e.name,
                prequeue_start_ms: prequeue_start.map(ms),
                start_ms: ms(start),
                end_ms: ms(end),
                shuffle_at_start: e.shuffle_at_start.unwrap_or(false),
                settings: Settings {
                    total_active_users: e.total_active_users,
                    new_users_per_minute: e.new_users_per_minute,
                    session_duration_ms: session_duration.map(|d| d.as_millis() as u64),
                    session_renewal: e.session_renewal,
                    queueing_method: e.queueing_method,
                },
            };
            // Overlapping events would leave it ambiguous whose limits apply.
            if let Some(j) = events.iter().position(|o| o.spec.overlaps(&spec)) {
                self.fail(
                    &p.key("start"),
                    format!(
                        "event {:?} overlaps event[{j}] {:?} (prequeue included); events in a room must not overlap",
                        spec.name, events[j].spec.name
                    ),
                );
            }
            events.push(EventConfig { spec, template });
        }
        events
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

pub(crate) fn check_id(id: &str) -> Result<(), &'static str> {
    let ok = (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err("must be 1 to 64 characters of a-z, 0-9, _ and -")
    }
}

/// A room or bypass path prefix, in the canonical form requests are matched in.
fn check_path(path: &str) -> Result<String, String> {
    if !path.starts_with('/') {
        return Err("must start with /".into());
    }
    if path
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '?' || c == '#')
    {
        return Err("must be a plain path prefix without spaces, ? or #".into());
    }
    crate::canonical::path(path)
        .map(std::borrow::Cow::into_owned)
        .map_err(|why| format!("cannot be matched: {why}"))
}

/// A user or rate limit within what the stores count exactly.
fn check_limit(value: u64) -> Result<(), String> {
    match value {
        0 => Err(r#"must be at least 1, got 0 (to stop admissions, set state = "paused")"#.into()),
        v if v > MAX_LIMIT => Err(format!("must be at most {MAX_LIMIT}, got {v}")),
        _ => Ok(()),
    }
}

fn check_reserved_prefix(prefix: &str) -> Result<(), String> {
    let canonical = check_path(prefix)?;
    if canonical != prefix {
        return Err(format!("is not in canonical form; write {canonical:?}"));
    }
    if prefix.len() < 3 || !prefix.ends_with('/') {
        return Err(
            r#"must start and end with / and name a directory, such as "/__waitroom/""#.into(),
        );
    }
    Ok(())
}

/// Lower-cases a host name and refuses anything the Host header match cannot use.
fn check_host(host: &str) -> Result<String, &'static str> {
    if host.is_empty() {
        return Err("must not be empty; leave host out to match any host");
    }
    if host.contains("://") {
        return Err(r#"must be a bare host name without a scheme, such as "shop.example.com""#);
    }
    if host.contains('/') {
        return Err("must not contain a path; put the path prefix in `path`");
    }
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return match inner.parse::<Ipv6Addr>() {
            // The spelling requests are matched in (`[::1]`, not `[0::1]`).
            Ok(addr) => Ok(format!("[{addr}]")),
            Err(_) => Err("is not a valid bracketed IPv6 address"),
        };
    }
    if host.contains(':') {
        return Err("must not contain a port; rooms match the Host header without its port");
    }
    // `shop.example.` is `shop.example`, as requests are matched.
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let labels_ok = host.len() <= 253
        && host.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if labels_ok {
        Ok(host)
    } else {
        Err("is not a valid host name (letters, digits, - and _ in dot-separated labels)")
    }
}

fn check_origin_url(text: &str) -> Result<http::Uri, &'static str> {
    let uri: http::Uri = text
        .parse()
        .map_err(|_| r#"is not a URL such as "http://127.0.0.1:3000""#)?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err("uses https, which is not supported; the origin must be http:// (terminate TLS in front of waitroom)")
        }
        _ => return Err(r#"must start with http://, such as "http://127.0.0.1:3000""#),
    }
    let Some(authority) = uri.authority() else {
        return Err("must name a host");
    };
    if authority.host().is_empty() {
        return Err("must name a host");
    }
    if authority.as_str().contains('@') {
        return Err("must not contain a user name or password");
    }
    if uri.query().is_some() {
        return Err("must not have a query string");
    }
    Ok(uri)
}

/// Checks one Redis URL and splices in the password from the environment.
fn check_redis_url(text: &str, password: Option<&str>) -> Result<String, String> {
    use redis::IntoConnectionInfo as _;
    if !text.starts_with("redis://") && !text.starts_with("rediss://") {
        return Err("must start with redis:// or rediss://".to_owned());
    }
    // `rediss://…#insecure` would turn certificate checks off; the way to
    // trust a private CA is store.tls_ca.
    if text.starts_with("rediss://") && text.contains("#insecure") {
        return Err(
            "turns off certificate checks (#insecure), which waitroom does not allow; trust the server's CA with store.tls_ca instead".to_owned(),
        );
    }
    if let Err(e) = text.into_connection_info() {
        let why = e.to_string();
        // RedisError's text ends in " - <kind>", which tells an operator nothing.
        let why = why.rsplit_once(" - ").map_or(why.as_str(), |(w, _)| w);
        return Err(format!("is not a usable Redis URL: {why}"));
    }
    let Some(password) = password else {
        return Ok(text.to_owned());
    };
    let mut url =
        redis::parse_redis_url(text).ok_or_else(|| "is not a usable Redis URL".to_owned())?;
    if url.password().is_some() {
        return Err(
            "already has a password, and store.password_env is set too; use one".to_owned(),
        );
    }
    url.set_password(Some(password))
        .map_err(|()| "cannot hold a password".to_owned())?;
    Ok(url.to_string())
}

/// Shows a Redis URL in a message without any password it carries.
fn redact_url(text: &str) -> String {
    match redis::parse_redis_url(text) {
        Some(mut url) if url.password().is_some() => {
            if url.set_password(Some("REDACTED")).is_ok() {
                format!("{:?}", url.as_str())
            } else {
                "the URL".to_owned()
            }
        }
        Some(_) => format!("{text:?}"),
        None if text.contains('@') => "the URL".to_owned(),
        None => format!("{text:?}"),
    }
}

/// The codes of a list (a variable's, a file's lines): trimmed, without
/// blanks and `#` comments, as digests.
/// The shortest lane code `waitroom check` takes.
pub const MIN_CODE_CHARS: usize = 8;

fn codes_in<'a>(items: impl Iterator<Item = &'a str>) -> Vec<u64> {
    items
        .map(str::trim)
        .filter(|c| !c.is_empty() && !c.starts_with('#'))
        .map(crate::domain::digest64)
        .collect()
}
