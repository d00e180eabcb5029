//! Reading the TOML file: the serde image of every section, and its validation into [`Config`].
//!
//! Parsing happens in two steps so that every error can name its key. The
//! text is first parsed into toml's spanned tree; the raw structs below
//! (`deny_unknown_fields`, mirroring SPEC §10) are deserialized from that
//! tree, and the byte span of any serde error is mapped back to a key path
//! such as `room[1].event[0].start`. Validation then checks every value,
//! collecting all problems rather than stopping at the first, and looks each
//! key up in the same tree to report its line.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ipnet::IpNet;
use serde::de::{self, Deserializer, SeqAccess, Unexpected, Visitor};
use serde::Deserialize;
use toml::de::{DeTable, DeValue};

use super::{
    Backend, Config, CookieConfig, EventConfig, FailMode, OriginConfig, RoomConfig, Secret,
    ServerConfig, StoreConfig, Unmatched,
};
use crate::store::{QueueingMethod, RoomState};

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
}

use super::bounds::{MAX_DURATION, MAX_DURATION_TEXT, MAX_LIMIT};

/// Most worker threads.
const MAX_WORKERS: u64 = 256;

/// Below hyper's smallest read buffer (8 KiB) the HTTP/1 builder panics.
const MIN_HEADER_BYTES: u64 = 8192;
const MAX_HEADER_BYTES: u64 = 1024 * 1024;

// ---------------------------------------------------------------------------
// Public entry points
// ---------------------------------------------------------------------------

/// Choices the caller makes about what a valid configuration needs.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadOptions {
    /// Accept a configuration with no cookie keys; the caller then supplies
    /// one (the `demo` command generates an ephemeral key).
    pub allow_missing_keys: bool,
}

/// One thing wrong with a configuration, named by its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Full key path, e.g. `room[1].session_duration` (arrays count from 0).
    pub key: String,
    /// Where the key (or, when absent, its enclosing table) is in the file.
    pub location: Option<Location>,
    /// What is wrong and what is allowed.
    pub message: String,
}

/// A 1-based line and column in the TOML text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    pub line: usize,
    pub column: usize,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key)?;
        if let Some(at) = self.location {
            write!(f, " (line {}, column {})", at.line, at.column)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The text is not valid TOML.
    #[error("TOML syntax error at line {line}, column {column}: {message}")]
    Syntax {
        line: usize,
        column: usize,
        message: String,
    },
    /// Unknown or missing keys, or bad values; never empty.
    #[error("{}", ProblemList(.0))]
    Invalid(Vec<Problem>),
}

impl ConfigError {
    /// The individual problems (empty for read and syntax errors).
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Invalid(problems) => problems,
            _ => &[],
        }
    }
}

struct ProblemList<'a>(&'a [Problem]);

impl fmt::Display for ProblemList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            [one] => write!(f, "{one}"),
            many => {
                write!(f, "{} problems in the configuration:", many.len())?;
                for p in many {
                    write!(f, "\n  {p}")?;
                }
                Ok(())
            }
        }
    }
}

/// Reads an environment variable the way the daemon does in production.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Parses and validates a configuration, reading secrets from the process environment.
pub fn from_toml_str(src: &str) -> Result<Config, ConfigError> {
    from_toml_str_with(src, LoadOptions::default(), &process_env)
}

/// As [`from_toml_str`], reading secrets through `env` (tests inject their own).
pub fn from_toml_str_with_env(
    src: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    from_toml_str_with(src, LoadOptions::default(), env)
}

/// Parses and validates a configuration with explicit options and environment.
pub fn from_toml_str_with(
    src: &str,
    options: LoadOptions,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let tree = DeTable::parse(src).map_err(|e| syntax_error(src, &e))?;
    let raw = RawConfig::deserialize(toml::de::Deserializer::from(tree.clone()))
        .map_err(|e| deserialize_error(src, tree.get_ref(), &e))?;
    let mut checker = Checker {
        src,
        tree: tree.get_ref(),
        env,
        problems: Vec::new(),
    };
    let config = checker.config(raw, options);
    if checker.problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError::Invalid(checker.problems))
    }
}

/// Reads, parses and validates the file at `path`, with secrets from the process environment.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    load_with(path, LoadOptions::default(), &process_env)
}

/// As [`load`], with explicit options and environment.
pub fn load_with(
    path: &Path,
    options: LoadOptions,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let src = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    from_toml_str_with(&src, options, env)
}

// ---------------------------------------------------------------------------
// Raw serde image of the file (SPEC §10)
// ---------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    cookie: RawCookie,
    origin: RawOrigin,
    #[serde(default)]
    room: Vec<RawRoom>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<String>,
    admin_listen: Option<String>,
    admin_token_env: Option<String>,
    reserved_prefix: Option<String>,
    trusted_proxies: Option<Vec<String>>,
    unmatched: Option<RawUnmatched>,
    max_connections: Option<u64>,
    max_header_bytes: Option<u64>,
    header_read_timeout: Option<RawDuration>,
    drain_timeout: Option<RawDuration>,
    /// Queued polls per second one client address may make (after its burst).
    ip_polls_per_second: Option<u64>,
    /// Queued polls one client address may make at once.
    ip_poll_burst: Option<u64>,
    /// New tickets per second one client address may get (after its burst).
    ip_arrivals_per_second: Option<u64>,
    /// New tickets one client address may get at once.
    ip_arrival_burst: Option<u64>,
    /// Most concurrent connections from one client address.
    max_connections_per_ip: Option<u64>,
    /// Worker threads (0 = one per core).
    workers: Option<u64>,
    /// One log line per request (target `waitroom::access`).
    access_log: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawUnmatched {
    Forward,
    NotFound,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    backend: Option<RawBackend>,
    url: Option<RawUrls>,
    /// Not in the SPEC sketch: SPEC §7 wants the Redis password from the environment.
    password_env: Option<String>,
    timeout: Option<RawDuration>,
    fail_mode: Option<RawFailMode>,
    /// How many instances share the store: with `fail_mode = "local"` each
    /// enforces 1/instances of every limit while the store is away.
    instances: Option<u64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawBackend {
    Memory,
    Redis,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawFailMode {
    Open,
    Closed,
    Local,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCookie {
    keys_env: Option<String>,
    keys: Option<Vec<String>>,
    secure: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOrigin {
    url: String,
    timeout: Option<RawDuration>,
    connect_timeout: Option<RawDuration>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoom {
    id: String,
    name: Option<String>,
    host: Option<String>,
    path: String,
    total_active_users: u64,
    new_users_per_minute: u64,
    session_duration: Option<RawDuration>,
    session_renewal: Option<bool>,
    queueing_method: Option<QueueingMethod>,
    max_queue_length: Option<u64>,
    refresh_interval: Option<RawDuration>,
    abandon_after: Option<RawDuration>,
    queue_status_code: Option<u64>,
    json_response: Option<bool>,
    template: Option<String>,
    bypass_paths: Option<Vec<String>>,
    bypass_ips: Option<Vec<String>>,
    bypass_header: Option<RawBypassHeader>,
    case_insensitive_paths: Option<bool>,
    state: Option<RoomState>,
    #[serde(default)]
    event: Vec<RawEvent>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBypassHeader {
    name: String,
    value_env: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEvent {
    name: String,
    prequeue_start: Option<RawTime>,
    start: RawTime,
    end: RawTime,
    shuffle_at_start: Option<bool>,
    total_active_users: Option<u64>,
    new_users_per_minute: Option<u64>,
}

/// A duration string, kept with its text so messages quote what was written.
struct RawDuration {
    value: Duration,
    text: String,
}

impl<'de> Deserialize<'de> for RawDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RawDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#"a duration string such as "20s", "5m" or "500ms""#)
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<RawDuration, E> {
                humantime::parse_duration(s.trim())
                    .map(|value| RawDuration {
                        value,
                        text: s.to_owned(),
                    })
                    .map_err(|e| {
                        E::custom(format!(
                            r#"invalid duration {s:?} ({e}); write it like "20s", "5m" or "500ms""#
                        ))
                    })
            }
        }
        d.deserialize_str(V)
    }
}

/// A point in time: an RFC 3339 string or a TOML offset date-time.
struct RawTime(SystemTime);

const TIME_EXPECTED: &str = r#"an RFC 3339 time with offset, such as "2026-12-01T10:00:00Z""#;

impl<'de> Deserialize<'de> for RawTime {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Going through toml::Value accepts both quoted strings (as in the
        // SPEC sketch) and bare TOML date-times, which operators also write.
        let (text, parsed) = match toml::Value::deserialize(d)? {
            toml::Value::String(s) => {
                let parsed = s.trim().parse::<toml::value::Datetime>().ok();
                (s, parsed)
            }
            toml::Value::Datetime(dt) => (dt.to_string(), Some(dt)),
            other => return Err(de::Error::invalid_type(unexpected(&other), &TIME_EXPECTED)),
        };
        let Some(dt) = parsed else {
            return Err(de::Error::custom(format!(
                "invalid time {text:?}; expected {TIME_EXPECTED}"
            )));
        };
        datetime_to_system_time(&dt)
            .map(RawTime)
            .map_err(|why| de::Error::custom(format!("invalid time {text:?}: {why}")))
    }
}

fn unexpected(v: &toml::Value) -> Unexpected<'_> {
    match v {
        toml::Value::String(s) => Unexpected::Str(s),
        toml::Value::Integer(i) => Unexpected::Signed(*i),
        toml::Value::Float(x) => Unexpected::Float(*x),
        toml::Value::Boolean(b) => Unexpected::Bool(*b),
        toml::Value::Array(_) => Unexpected::Seq,
        toml::Value::Table(_) | toml::Value::Datetime(_) => Unexpected::Map,
    }
}

/// Converts a full date-time with offset; local times are refused because
/// instances in different time zones must agree on when an event starts.
fn datetime_to_system_time(dt: &toml::value::Datetime) -> Result<SystemTime, String> {
    let (Some(date), Some(time)) = (dt.date, dt.time) else {
        return Err("needs both a date and a time of day".to_owned());
    };
    let offset_minutes = match dt.offset {
        Some(toml::value::Offset::Z) => 0,
        Some(toml::value::Offset::Custom { minutes }) => i64::from(minutes),
        None => return Err("needs a time zone offset such as Z or +02:00".to_owned()),
    };
    let days = days_from_civil(
        i64::from(date.year),
        i64::from(date.month),
        i64::from(date.day),
    );
    let secs = days * 86_400
        + i64::from(time.hour) * 3600
        + i64::from(time.minute) * 60
        + i64::from(time.second)
        - offset_minutes * 60;
    let nanos = Duration::from_nanos(u64::from(time.nanosecond));
    let at = if secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(secs.unsigned_abs()))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(secs.unsigned_abs()))
    };
    at.and_then(|t| t.checked_add(nanos))
        .ok_or_else(|| "is out of range".to_owned())
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// `store.url`: one URL, or a list of Redis Cluster seed nodes.
struct RawUrls {
    urls: Vec<String>,
    /// Written as a list, so problems are reported as `store.url[i]`.
    is_list: bool,
}

impl<'de> Deserialize<'de> for RawUrls {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawUrls;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a redis:// URL, or a list of them for Redis Cluster")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<RawUrls, E> {
                Ok(RawUrls {
                    urls: vec![s.to_owned()],
                    is_list: false,
                })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawUrls, A::Error> {
                let mut urls = Vec::new();
                while let Some(url) = seq.next_element::<String>()? {
                    urls.push(url);
                }
                Ok(RawUrls {
                    urls,
                    is_list: true,
                })
            }
        }
        d.deserialize_any(V)
    }
}

// ---------------------------------------------------------------------------
// Key paths and locations
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Seg {
    Key(String),
    Index(usize),
}

/// A key path such as `room[1].event[0].start`.
#[derive(Clone, Debug, Default)]
struct KeyPath(Vec<Seg>);

impl KeyPath {
    fn key(&self, key: &str) -> KeyPath {
        let mut segs = self.0.clone();
        segs.push(Seg::Key(key.to_owned()));
        KeyPath(segs)
    }

    fn index(&self, index: usize) -> KeyPath {
        let mut segs = self.0.clone();
        segs.push(Seg::Index(index));
        KeyPath(segs)
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(top level)");
        }
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Key(k) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    let bare = !k.is_empty()
                        && k.chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                    if bare {
                        f.write_str(k)?;
                    } else {
                        write!(f, "{k:?}")?;
                    }
                }
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

fn location(src: &str, offset: usize) -> Location {
    let offset = offset.min(src.len());
    let before = &src.as_bytes()[..offset];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let column = src
        .get(line_start..offset)
        .map_or(offset - line_start, |s| s.chars().count())
        + 1;
    Location { line, column }
}

fn contains(outer: &Range<usize>, inner: &Range<usize>) -> bool {
    outer.start <= inner.start && inner.end <= outer.end
}

/// The deepest key whose name or value covers `span`. Tables opened by a
/// header have the header as their span, so the walk visits every node
/// rather than descending only into spans that contain the error.
fn path_at(root: &DeTable<'_>, span: &Range<usize>) -> KeyPath {
    fn walk_table(
        table: &DeTable<'_>,
        path: &KeyPath,
        span: &Range<usize>,
        best: &mut Option<KeyPath>,
    ) {
        for (key, value) in table.iter() {
            let here = path.key(key.get_ref());
            if contains(&key.span(), span) {
                consider(&here, best);
            }
            walk_value(value, &here, span, best);
        }
    }
    fn walk_value(
        value: &toml::Spanned<DeValue<'_>>,
        path: &KeyPath,
        span: &Range<usize>,
        best: &mut Option<KeyPath>,
    ) {
        if contains(&value.span(), span) {
            consider(path, best);
        }
        match value.get_ref() {
            DeValue::Table(t) => walk_table(t, path, span, best),
            DeValue::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk_value(item, &path.index(i), span, best);
                }
            }
            _ => {}
        }
    }
    fn consider(path: &KeyPath, best: &mut Option<KeyPath>) {
        if best.as_ref().is_none_or(|b| path.0.len() > b.0.len()) {
            *best = Some(path.clone());
        }
    }
    let mut best = None;
    walk_table(root, &KeyPath::default(), span, &mut best);
    best.unwrap_or_default()
}

/// The span of `path`, or of its deepest present ancestor (a defaulted key
/// is reported at the table that lacks it).
fn span_of(root: &DeTable<'_>, path: &KeyPath) -> Option<Range<usize>> {
    let mut found = None;
    let mut table = Some(root);
    let mut array: Option<&[toml::Spanned<DeValue<'_>>]> = None;
    for seg in &path.0 {
        let next = match seg {
            Seg::Key(k) => table.and_then(|t| {
                t.iter()
                    .find(|(key, _)| key.get_ref().as_ref() == k.as_str())
                    .map(|(_, v)| v)
            }),
            Seg::Index(i) => array.and_then(|a| a.get(*i)),
        };
        let Some(value) = next else { break };
        found = Some(value.span());
        table = None;
        array = None;
        match value.get_ref() {
            DeValue::Table(t) => table = Some(t),
            DeValue::Array(a) => array = Some(a),
            _ => {}
        }
    }
    found
}

fn syntax_error(src: &str, e: &toml::de::Error) -> ConfigError {
    let at = location(src, e.span().map_or(0, |s| s.start));
    ConfigError::Syntax {
        line: at.line,
        column: at.column,
        message: e.message().trim().to_owned(),
    }
}

fn deserialize_error(src: &str, tree: &DeTable<'_>, e: &toml::de::Error) -> ConfigError {
    let span = e.span();
    let mut path = span.as_ref().map(|s| path_at(tree, s)).unwrap_or_default();
    let mut at = span.map(|s| location(src, s.start));
    // serde speaks of fields and variants; operators write keys and values.
    let mut message = e
        .message()
        .trim()
        .replacen("unknown field `", "unknown key `", 1)
        .replacen("unknown variant `", "unknown value `", 1);
    // serde names a missing field only in prose; make it part of the path.
    let missing = message
        .strip_prefix("missing field `")
        .and_then(|m| m.strip_suffix('`'))
        .map(str::to_owned);
    if let Some(field) = missing {
        if path.0.is_empty() {
            at = None;
        }
        path = path.key(&field);
        message = "required key is missing".to_owned();
    }
    ConfigError::Invalid(vec![Problem {
        key: path.to_string(),
        location: at,
        message,
    }])
}

// ---------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------

/// Walks the raw config, recording problems and substituting defaults so one
/// pass finds every problem; the result is used only when none was found.
struct Checker<'a, 'i> {
    src: &'a str,
    tree: &'a DeTable<'i>,
    env: &'a dyn Fn(&str) -> Option<String>,
    problems: Vec<Problem>,
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

    fn config(&mut self, raw: RawConfig, options: LoadOptions) -> Config {
        let server = self.server(raw.server);
        let store = self.store(raw.store);
        let cookie = self.cookie(raw.cookie, options);
        let origin = self.origin(raw.origin);
        let rooms = self.rooms(raw.room, &server.reserved_prefix);
        Config {
            server,
            store,
            cookie,
            origin,
            rooms,
        }
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
        }
    }

    fn store(&mut self, raw: RawStore) -> StoreConfig {
        let p = root().key("store");
        let backend = match raw.backend {
            None | Some(RawBackend::Memory) => {
                // A URL with the memory backend usually means a forgotten
                // `backend = "redis"`: instances would silently not share state.
                if raw.url.is_some() {
                    self.fail(
                        &p.key("url"),
                        r#"is only used with backend = "redis"; set store.backend = "redis" or remove the URL"#,
                    );
                }
                if raw.password_env.is_some() {
                    self.fail(
                        &p.key("password_env"),
                        r#"is only used with backend = "redis""#,
                    );
                }
                Backend::Memory
            }
            Some(RawBackend::Redis) => {
                let password = match raw.password_env {
                    None => None,
                    Some(name) => {
                        let path = p.key("password_env");
                        match self.env_name(&path, Some(name), "") {
                            Some(var) => {
                                let value = self.env_value(&var);
                                if value.is_none() {
                                    self.fail(
                                        &path,
                                        format!("environment variable {var} is not set"),
                                    );
                                }
                                value
                            }
                            None => None,
                        }
                    }
                };
                Backend::Redis {
                    urls: self.redis_urls(&p.key("url"), raw.url, password.as_deref()),
                }
            }
        };
        let timeout = self.duration(
            &p.key("timeout"),
            raw.timeout,
            defaults::STORE_TIMEOUT,
            Duration::ZERO,
        );
        let fail_mode = match raw.fail_mode {
            None | Some(RawFailMode::Open) => FailMode::Open,
            Some(RawFailMode::Closed) => FailMode::Closed,
            Some(RawFailMode::Local) => FailMode::Local,
        };
        let instances = raw.instances.unwrap_or(1);
        if instances == 0 {
            self.fail(&p.key("instances"), "must be at least 1, got 0");
        }
        StoreConfig {
            backend,
            timeout,
            fail_mode,
            instances: instances.max(1),
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
        CookieConfig {
            keys,
            secure: raw.secure.unwrap_or(true),
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
        OriginConfig {
            url,
            timeout,
            connect_timeout,
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

    fn room(&mut self, p: &KeyPath, raw: RawRoom, reserved_prefix: &str) -> RoomConfig {
        if let Err(why) = check_id(&raw.id) {
            self.fail(&p.key("id"), format!("{:?} {why}", raw.id));
        }
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
        let events = self.events(p, raw.event);
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
            state: raw.state.unwrap_or(RoomState::Open),
            events,
        }
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
            if let Some(j) = events.iter().position(|other| other.name == e.name) {
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
            let opens = prequeue_start.unwrap_or(start).min(start);
            // Overlapping events would leave it ambiguous whose limits apply.
            if let Some(j) = events.iter().position(|o| {
                let o_opens = o.prequeue_start.unwrap_or(o.start).min(o.start);
                opens < o.end && o_opens < end
            }) {
                self.fail(
                    &p.key("start"),
                    format!(
                        "event {:?} overlaps event[{j}] {:?} (prequeue included); events in a room must not overlap",
                        e.name, events[j].name
                    ),
                );
            }
            events.push(EventConfig {
                name: e.name,
                prequeue_start,
                start,
                end,
                shuffle_at_start: e.shuffle_at_start.unwrap_or(false),
                total_active_users: e.total_active_users,
                new_users_per_minute: e.new_users_per_minute,
            });
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

fn check_id(id: &str) -> Result<(), &'static str> {
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
    if let Err(e) = text.into_connection_info() {
        let why = e.to_string();
        if text.starts_with("rediss://") && why.contains("TLS") {
            return Err(
                "uses TLS (rediss://), which this build of waitroom does not support".to_owned(),
            );
        }
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
