//! `[server]`: the listeners, the reserved prefix, trusted proxies and the
//! per-connection and per-address limits.

use std::time::Duration;

use super::values::check_path;
use super::{defaults, root, Checker};
use crate::config::raw::{RawServer, RawUnmatched};
use crate::config::{Secret, ServerConfig, Unmatched};

/// Most worker threads.
const MAX_WORKERS: u64 = 256;

/// Most concurrent streams per connection (HTTP/2's own default cap is
/// of this order; more only lets one client hold more).
const MAX_STREAMS: u64 = 1000;

/// Below hyper's smallest read buffer (8 KiB) the HTTP/1 builder panics.
const MIN_HEADER_BYTES: u64 = 8192;
const MAX_HEADER_BYTES: u64 = 1024 * 1024;

impl Checker<'_, '_> {
    pub(super) fn server(&mut self, raw: RawServer) -> ServerConfig {
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

#[cfg(test)]
mod tests {
    use crate::config::check::tests::{refusals, with};

    fn server(keys: &str) -> Vec<String> {
        refusals(&with("server", keys))
    }

    #[test]
    fn the_admin_listener_has_its_own_address() {
        assert_eq!(
            server("listen = \"127.0.0.1:9090\""),
            ["server.admin_listen: 127.0.0.1:9090 is also server.listen; the admin listener needs its own address"]
        );
        // Port 0 asks the system for a free port: two of them never clash.
        assert!(server("listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"").is_empty());
    }

    #[test]
    fn the_reserved_prefix_is_a_canonical_directory() {
        let directory = r#"must start and end with / and name a directory, such as "/__waitroom/""#;
        for (prefix, why) in [
            ("__waitroom/", "must start with /"),
            (
                "/wait room/",
                "must be a plain path prefix without spaces, ? or #",
            ),
            ("/w?/", "must be a plain path prefix without spaces, ? or #"),
            ("/../", "cannot be matched: the path climbs above the root"),
            ("/a//b/", r#"is not in canonical form; write "/a/b/""#),
            ("/__waitroom", directory),
            ("/a", directory),
        ] {
            assert_eq!(
                server(&format!("reserved_prefix = {prefix:?}")),
                [format!("server.reserved_prefix: {prefix:?} {why}")]
            );
        }
    }

    #[test]
    fn connection_and_header_limits_are_in_range() {
        for (keys, refusal) in [
            (
                "max_connections = 0",
                "server.max_connections: must be at least 1, got 0",
            ),
            (
                "max_connections_per_ip = 0",
                "server.max_connections_per_ip: must be at least 1, got 0",
            ),
            (
                "max_header_bytes = 8191",
                "server.max_header_bytes: must be between 8192 and 1048576, got 8191",
            ),
            (
                "max_header_bytes = 1048577",
                "server.max_header_bytes: must be between 8192 and 1048576, got 1048577",
            ),
            (
                "workers = 257",
                "server.workers: must be between 0 (one per core) and 256, got 257",
            ),
        ] {
            assert_eq!(server(keys), [refusal], "{keys}");
        }
    }

    #[test]
    fn per_address_rates_are_between_1_and_a_million() {
        for key in [
            "ip_polls_per_second",
            "ip_poll_burst",
            "ip_arrivals_per_second",
            "ip_arrival_burst",
        ] {
            for value in [0, 1_000_001] {
                assert_eq!(
                    server(&format!("{key} = {value}")),
                    [format!(
                        "server.{key}: must be between 1 and 1000000, got {value}"
                    )]
                );
            }
        }
    }

    #[test]
    fn stream_counts_and_the_body_rate_are_in_range() {
        for (keys, refusal) in [
            (
                "max_streams_per_connection = 1001",
                "server.max_streams_per_connection: must be between 1 and 1000, got 1001",
            ),
            (
                "max_streams_per_connection = 0",
                "server.max_streams_per_connection: must be between 1 and 1000, got 0",
            ),
            (
                "max_streams_per_ip = 1000001",
                "server.max_streams_per_ip: must be between 1 and 1000000, got 1000001",
            ),
            (
                "request_body_min_rate = 0",
                "server.request_body_min_rate: must be between 1 and 1099511627776, got 0",
            ),
        ] {
            assert_eq!(server(keys), [refusal], "{keys}");
        }
    }

    #[test]
    fn every_timeout_is_longer_than_0() {
        for key in [
            "header_read_timeout",
            "drain_timeout",
            "send_timeout",
            "request_body_timeout",
            "tunnel_idle_timeout",
        ] {
            assert_eq!(
                server(&format!("{key} = \"0s\"")),
                [format!("server.{key}: must be longer than 0, got \"0s\"")]
            );
        }
    }
}
