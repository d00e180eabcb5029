//! Validation: walks the raw config, checks every value against what is
//! allowed, and builds the typed [`Config`]. Every problem is recorded with
//! its key path (all of them, not just the first), and defaults stand in
//! for bad values so one pass finds everything.
//!
//! This module holds the `Checker`, its entry point and the value helpers
//! every section uses; `values` has the checks of an id, a path, a limit
//! and a host that several sections make. Each section is checked in its
//! own file: `server`, `tls`, `store` and `store_redis` (where Redis is),
//! `region`, `cookie`, `reports`, `origin`, and a room's keys in `rooms`,
//! `challenge` (captcha, bot score), `bypass`, `tokens`, `lanes`, `events`
//! and `autotune`; `[[webhook]]` in `webhook`.

mod autotune;
mod bypass;
mod challenge;
mod cookie;
mod events;
mod lanes;
mod origin;
mod region;
mod reports;
mod rooms;
mod server;
mod store;
mod store_redis;
mod tls;
mod tokens;
mod values;
mod webhook;

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

    pub(super) const LISTEN: &str = "0.0.0.0:8080";
    pub(super) const ADMIN_LISTEN: &str = "127.0.0.1:9090";
    pub(super) const ADMIN_TOKEN_ENV: &str = "WAITROOM_ADMIN_TOKEN";
    pub(super) const RESERVED_PREFIX: &str = "/__waitroom/";
    pub(super) const MAX_CONNECTIONS: u64 = 10_000;
    pub(super) const MAX_HEADER_BYTES: u64 = 16_384;
    pub(super) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
    pub(super) const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
    pub(super) const STORE_TIMEOUT: Duration = Duration::from_millis(50);
    /// How long the store answers nothing before `fail_mode` applies.
    pub(super) const STORE_UNREACHABLE_AFTER: Duration = Duration::from_secs(1);
    pub(super) const KEYS_ENV: &str = "WAITROOM_COOKIE_KEYS";
    /// `[reports] retention`: a month.
    pub(super) const REPORT_RETENTION: Duration = Duration::from_secs(30 * 24 * 60 * 60);
    pub(super) const ORIGIN_TIMEOUT: Duration = Duration::from_secs(30);
    pub(super) const ORIGIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
    pub(super) const SESSION_DURATION: Duration = Duration::from_secs(5 * 60);
    pub(super) const REFRESH_INTERVAL: Duration = Duration::from_secs(20);
    pub(super) const ABANDON_AFTER: Duration = Duration::from_secs(2 * 60);
    pub(super) const QUEUE_STATUS_CODE: u64 = 200;
    pub(super) const MAX_CONNECTIONS_PER_IP: u64 = 512;
    pub(super) const IP_POLLS_PER_SECOND: u32 = 50;
    pub(super) const IP_POLL_BURST: u32 = 200;
    pub(super) const IP_ARRIVALS_PER_SECOND: u32 = 20;
    pub(super) const IP_ARRIVAL_BURST: u32 = 200;
    pub(super) const MAX_NETWORKS_PER_SESSION: u64 = 4;
    pub(super) const SYNC_INTERVAL: Duration = Duration::from_secs(1);
    pub(super) const MIN_SYNC_INTERVAL: Duration = Duration::from_millis(100);
    pub(super) const MAX_SYNC_INTERVAL: Duration = Duration::from_secs(60);
    pub(super) const TLS_LISTEN: &str = "0.0.0.0:8443";
    pub(super) const MAX_STREAMS_PER_CONNECTION: u64 = 100;
    pub(super) const MAX_STREAMS_PER_IP: u64 = 256;
    pub(super) const SEND_TIMEOUT: Duration = Duration::from_secs(30);
    pub(super) const REQUEST_BODY_TIMEOUT: Duration = Duration::from_secs(20);
    pub(super) const REQUEST_BODY_MIN_RATE: u64 = 500;
    pub(super) const TUNNEL_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
    pub(super) const ORIGIN_MAX_CONNECTIONS: u64 = 512;
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
        let reports = self.reports(raw.reports);
        let origin = self.origin(raw.origin);
        let rooms = self.rooms(raw.room, &server.reserved_prefix);
        self.cookie_domain_covers(&cookie, &rooms);
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
        let webhooks = self.webhooks(raw.webhook, &rooms);
        Config {
            server,
            store,
            cookie,
            reports,
            origin,
            rooms,
            region,
            tls,
            webhooks,
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

/// What every section's tests share: the smallest configuration the
/// checker accepts, a way to set keys in one of its sections, and the
/// problems a configuration is refused for. The tests of the value
/// helpers above are here too.
#[cfg(test)]
pub(super) mod tests {
    use crate::config::{from_toml_str_with, LoadOptions};

    /// A cookie key (32 bytes 0..=31 in base64), in the environment of
    /// every check as `WAITROOM_COOKIE_KEYS` unless a test says otherwise.
    pub(super) const KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

    /// The smallest configuration the checker accepts, section by section
    /// in the order `with` writes them; the ones left empty are left out.
    const MINIMAL: [(&str, &str); 5] = [
        ("server", ""),
        ("store", ""),
        ("cookie", ""),
        ("origin", r#"url = "http://127.0.0.1:3000""#),
        (
            "room",
            "id = \"shop\"\npath = \"/\"\ntotal_active_users = 10\nnew_users_per_minute = 60",
        ),
    ];

    /// The lines of `keys` (`key = value`, one a line) with those of
    /// `over` in place of theirs: of two lines for one key, the last wins.
    pub(super) fn overlay(keys: &str, over: &str) -> String {
        let key_of = |line: &str| line.split('=').next().unwrap_or("").trim().to_owned();
        let all: Vec<&str> = keys
            .lines()
            .chain(over.lines())
            .filter(|l| !l.trim().is_empty())
            .collect();
        let last: Vec<&str> = all
            .iter()
            .enumerate()
            .filter(|(i, l)| !all[i + 1..].iter().any(|m| key_of(m) == key_of(l)))
            .map(|(_, l)| *l)
            .collect();
        last.join("\n")
    }

    /// The minimal configuration with `keys` set in `section`: "server",
    /// "store", "cookie", "origin" or "room" (the one room), as
    /// [`overlay`] sets them. The room is written last, so a test appends
    /// its sub-tables (`[[room.lane]]`) and the other tables (`[tls]`,
    /// `[region]`) to the result.
    pub(super) fn with(section: &str, keys: &str) -> String {
        assert!(
            MINIMAL.iter().any(|(name, _)| *name == section),
            "no section {section:?}"
        );
        let mut toml = String::new();
        for (name, minimal) in MINIMAL {
            let lines = if name == section {
                overlay(minimal, keys)
            } else {
                minimal.to_owned()
            };
            if lines.is_empty() {
                continue;
            }
            let header = if name == "room" {
                "[[room]]".to_owned()
            } else {
                format!("[{name}]")
            };
            toml.push_str(&format!("{header}\n{lines}\n\n"));
        }
        toml
    }

    /// The problems `src` is refused for, each as `key: message` in the
    /// order they were found, with `vars` in the environment besides the
    /// cookie key (a `WAITROOM_COOKIE_KEYS` in `vars` replaces it); empty
    /// when `src` is accepted.
    pub(super) fn refusals_with(src: &str, vars: &[(&str, &str)]) -> Vec<String> {
        let env = |name: &str| {
            let given = vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v);
            match (given, name) {
                (Some(v), _) => Some(v.to_string()),
                (None, "WAITROOM_COOKIE_KEYS") => Some(KEY.to_owned()),
                (None, _) => None,
            }
        };
        match from_toml_str_with(src, LoadOptions::default(), &env) {
            Ok(_) => Vec::new(),
            Err(e) => {
                assert!(!e.problems().is_empty(), "not a checker's refusal: {e}");
                e.problems()
                    .iter()
                    .map(|p| format!("{}: {}", p.key, p.message))
                    .collect()
            }
        }
    }

    /// As [`refusals_with`], with only the cookie key in the environment.
    pub(super) fn refusals(src: &str) -> Vec<String> {
        refusals_with(src, &[])
    }

    /// A file in a fresh directory holding `text`, and the directory
    /// (the file lives as long as it does).
    pub(super) fn file(text: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file");
        std::fs::write(&path, text).unwrap();
        (dir, path.display().to_string())
    }

    #[test]
    fn the_minimal_configuration_is_accepted() {
        assert_eq!(refusals(&with("room", "")), Vec::<String>::new());
        // A key given replaces the minimal one rather than repeating it.
        assert!(with("room", "path = \"/shop\"").contains("path = \"/shop\""));
        assert!(!with("room", "path = \"/shop\"").contains("path = \"/\""));
    }

    #[test]
    fn lanes_are_refused_in_region_mode() {
        let src = format!(
            "{}[[room.lane]]\nname = \"vip\"\nshare = 0.5\ncodes_env = \"VIP\"\n\n\
             [region]\nname = \"eu\"\nglobal_url = \"redis://10.0.0.2:6379\"\n",
            with(
                "store",
                "backend = \"redis\"\nurl = \"redis://10.0.0.1:6379\""
            ),
        );
        assert_eq!(
            refusals_with(&src, &[("VIP", "code-one-x")]),
            ["room[0].lane: priority lanes are not available in region mode (a region's grant has no lanes)"]
        );
    }

    #[test]
    fn a_duration_is_longer_than_0_and_its_minimum_and_at_most_365_days() {
        for (section, keys, refusal) in [
            (
                "server",
                "drain_timeout = \"0s\"",
                "server.drain_timeout: must be longer than 0, got \"0s\"",
            ),
            (
                "room",
                "session_duration = \"500ms\"",
                "room[0].session_duration: must be at least 1s, got \"500ms\"",
            ),
            (
                "room",
                "session_duration = \"0s\"",
                "room[0].session_duration: must be at least 1s, got \"0s\"",
            ),
            (
                "server",
                "drain_timeout = \"366d\"",
                "server.drain_timeout: must be at most 365d, got \"366d\"",
            ),
        ] {
            assert_eq!(refusals(&with(section, keys)), [refusal], "{keys}");
        }
    }

    #[test]
    fn a_listen_address_is_an_ip_address_and_port() {
        assert_eq!(
            refusals(&with("server", "listen = \"localhost:8080\"")),
            [
                r#"server.listen: "localhost:8080" is not an IP address and port such as "127.0.0.1:8080" (host names are not accepted)"#
            ]
        );
    }

    #[test]
    fn a_network_is_an_address_or_a_cidr_block() {
        assert_eq!(
            refusals(&with(
                "server",
                r#"trusted_proxies = ["10.0.0.1", "10.0.0.0/33"]"#
            )),
            [
                r#"server.trusted_proxies[1]: "10.0.0.0/33" is not an IP address or CIDR block such as "10.0.0.0/8""#
            ]
        );
    }

    #[test]
    fn an_environment_variable_name_is_letters_digits_and_underscores() {
        for name in ["1TOKEN", "ADMIN-TOKEN", ""] {
            assert_eq!(
                refusals(&with("server", &format!("admin_token_env = {name:?}"))),
                [format!("server.admin_token_env: {name:?} is not an environment variable name (letters, digits and _, not starting with a digit)")]
            );
        }
    }
}
