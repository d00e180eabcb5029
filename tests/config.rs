//! Configuration loading: the shipped configs, every bad-config fixture's
//! exact message, defaults, and secrets read through an injected environment.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, SystemTime};

use waitroom::config::{
    from_toml_str, from_toml_str_with, from_toml_str_with_env, load_with, Backend, Config,
    ConfigError, FailMode, LoadOptions, Location, Secret, Unmatched,
};
use waitroom::store::{QueueingMethod, RoomState};

/// 32 bytes 0..=31, standard base64 with padding.
const KEY_A: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
/// 32 bytes of 0xff, URL-safe base64 without padding.
const KEY_B: &str = "__________________________________________8";

const FIXTURES: &str = "tests/fixtures/config";

fn key_a() -> [u8; 32] {
    std::array::from_fn(|i| i as u8)
}

/// The environment the fixtures are checked against: a valid key ring,
/// one bypass secret and one enqueue-token secret, nothing else.
fn fixture_env(name: &str) -> Option<String> {
    match name {
        "WAITROOM_COOKIE_KEYS" => Some(KEY_A.to_owned()),
        "BYPASS_SECRET" => Some("s3cret".to_owned()),
        "ENQUEUE_KEYS" => Some(KEY_A.to_owned()),
        _ => None,
    }
}

fn no_env(_: &str) -> Option<String> {
    None
}

fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

fn load_file(path: &str, options: LoadOptions, env: &dyn Fn(&str) -> Option<String>) -> Config {
    load_with(Path::new(path), options, env).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn err(src: &str, env: &dyn Fn(&str) -> Option<String>) -> String {
    match from_toml_str_with_env(src, env) {
        Ok(_) => panic!("config was accepted:\n{src}"),
        Err(e) => e.to_string(),
    }
}

fn time(s: &str) -> SystemTime {
    humantime::parse_rfc3339(s).unwrap()
}

/// An RFC 3339 time as ms since the epoch (how events hold times).
fn ms(s: &str) -> u64 {
    time(s)
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

const MINIMAL: &str = r#"
[origin]
url = "http://127.0.0.1:3000"

[[room]]
id = "shop"
path = "/"
total_active_users = 10
new_users_per_minute = 60
"#;

fn with_room_keys(extra: &str) -> String {
    format!("{MINIMAL}{extra}\n")
}

// ---------------------------------------------------------------------------
// Shipped configs
// ---------------------------------------------------------------------------

#[test]
fn example_config_loads_with_documented_values() {
    let env = env_of(&[
        ("WAITROOM_COOKIE_KEYS", &format!("{KEY_A},{KEY_B}")),
        ("WAITROOM_ADMIN_TOKEN", "admin-secret"),
    ]);
    let c = load_file("config/example.toml", LoadOptions::default(), &env);

    let s = &c.server;
    assert_eq!(s.listen, "0.0.0.0:8080".parse::<SocketAddr>().unwrap());
    assert_eq!(
        s.admin_listen,
        "127.0.0.1:9090".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(s.admin_token, Some(Secret("admin-secret".to_owned())));
    assert_eq!(s.reserved_prefix, "/__waitroom/");
    assert!(s.trusted_proxies.is_empty());
    assert_eq!(s.unmatched, Unmatched::Forward);
    assert_eq!(s.max_connections, 10_000);
    assert_eq!(s.max_header_bytes, 16_384);
    assert_eq!(s.header_read_timeout, Duration::from_secs(10));
    assert_eq!(s.drain_timeout, Duration::from_secs(30));

    assert_eq!(c.store.backend, Backend::Memory);
    assert_eq!(c.store.timeout, Duration::from_millis(50));
    assert_eq!(c.store.fail_mode, FailMode::Open);

    assert_eq!(c.cookie.keys.len(), 2);
    assert_eq!(c.cookie.keys[0].0, key_a());
    assert_eq!(c.cookie.keys[1].0, [0xff; 32]);
    assert!(c.cookie.secure);

    assert_eq!(c.origin.url, "http://127.0.0.1:3000");
    assert_eq!(c.origin.timeout, Duration::from_secs(30));
    assert_eq!(c.origin.connect_timeout, Duration::from_secs(5));

    assert_eq!(c.rooms.len(), 1);
    let r = &c.rooms[0];
    assert_eq!(r.id, "shop");
    assert_eq!(r.name, "Example shop");
    assert_eq!(r.host.as_deref(), Some("shop.example.com"));
    assert_eq!(r.path, "/");
    assert_eq!(r.total_active_users, 1000);
    assert_eq!(r.new_users_per_minute, 300);
    assert_eq!(r.session_duration, Duration::from_secs(300));
    assert!(r.session_renewal);
    assert_eq!(r.queueing_method, QueueingMethod::Fifo);
    assert_eq!(r.max_queue_length, 0);
    assert_eq!(r.refresh_interval, Duration::from_secs(20));
    assert_eq!(r.abandon_after, Duration::from_secs(120));
    assert_eq!(r.queue_status_code, http::StatusCode::OK);
    assert!(r.json_response);
    assert_eq!(r.template, None);
    assert!(r.bypass_paths.is_empty());
    assert!(r.bypass_ips.is_empty());
    assert!(r.bypass_header.is_none());
    assert_eq!(r.state, RoomState::Open);
    assert_eq!(r.language, waitroom::config::Language::Auto);

    assert_eq!(r.events.len(), 1);
    let e = &r.events[0].spec;
    assert_eq!(e.name, "spring-drop");
    assert_eq!(e.prequeue_start_ms, Some(ms("2026-12-01T09:50:00Z")));
    assert_eq!(e.start_ms, ms("2026-12-01T10:00:00Z"));
    assert_eq!(e.end_ms, ms("2026-12-01T12:00:00Z"));
    assert!(e.shuffle_at_start);
    assert_eq!(e.settings.total_active_users, Some(5000));
    assert_eq!(e.settings.new_users_per_minute, Some(2000));
}

#[test]
fn example_config_documents_every_key_the_loader_accepts() {
    // Every key name the raw structs accept should appear in the reference
    // config, set or commented out.
    let example = std::fs::read_to_string("config/example.toml").unwrap();
    for key in [
        "listen",
        "admin_listen",
        "admin_token_env",
        "reserved_prefix",
        "trusted_proxies",
        "unmatched",
        "max_connections",
        "max_header_bytes",
        "header_read_timeout",
        "drain_timeout",
        "backend",
        "url",
        "password_env",
        "timeout",
        "fail_mode",
        "keys_env",
        "keys",
        "secure",
        "connect_timeout",
        "id",
        "name",
        "host",
        "path",
        "total_active_users",
        "new_users_per_minute",
        "session_duration",
        "session_renewal",
        "queueing_method",
        "max_queue_length",
        "sessions_per_item",
        "show_stock",
        "refresh_interval",
        "abandon_after",
        "queue_status_code",
        "json_response",
        "template",
        "bypass_paths",
        "bypass_ips",
        "bypass_header",
        "value_env",
        "state",
        "language",
        "prequeue_start",
        "start",
        "end",
        "shuffle_at_start",
        "lanes_only_for",
        "notice",
        "bind_to_client",
        "max_networks_per_session",
        "sign_key_env",
        "proof_of_work",
        "global_url",
        "sync_interval",
        "redirect_http",
        "hosts",
        "cert",
        "tls_ca",
        "latency",
        "slow_share",
        "error_share",
        "floor",
        "ceiling",
        "step",
        "interval",
        "min_requests",
        "jwks_url",
        "jwks_min_refresh",
        "jwks_max_age",
    ] {
        let written = example
            .lines()
            .map(|l| l.trim_start_matches(['#', ' ']))
            .any(|l| l.starts_with(&format!("{key} =")) || l.contains(&format!(" {key} = ")));
        assert!(written, "config/example.toml does not show `{key}`");
    }
}

#[test]
fn demo_config_loads_without_keys_when_allowed() {
    let options = LoadOptions {
        allow_missing_keys: true,
    };
    let c = load_file("config/demo.toml", options, &no_env);
    assert_eq!(
        c.server.listen,
        "127.0.0.1:8080".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(
        c.server.admin_listen,
        "127.0.0.1:9090".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(c.server.admin_token, None);
    assert_eq!(c.store.backend, Backend::Memory);
    assert!(c.cookie.keys.is_empty());
    assert!(!c.cookie.secure);
    assert_eq!(c.origin.url, "http://127.0.0.1:3000");

    let r = &c.rooms[0];
    assert_eq!((r.id.as_str(), r.name.as_str()), ("demo", "Demo shop"));
    assert_eq!(r.host, None);
    assert_eq!(r.path, "/");
    assert_eq!(r.total_active_users, 3);
    assert_eq!(r.new_users_per_minute, 60);
    assert_eq!(r.session_duration, Duration::from_secs(30));
    assert_eq!(r.refresh_interval, Duration::from_secs(5));
    assert_eq!(r.abandon_after, Duration::from_secs(30));
    assert_eq!(r.bypass_paths, ["/static/", "/favicon.ico"]);
    assert!(r.events.is_empty());
}

#[test]
fn demo_config_without_keys_is_refused_by_default() {
    let e = load_with(
        Path::new("config/demo.toml"),
        LoadOptions::default(),
        &no_env,
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        e,
        // keys_env is defaulted, so the [cookie] header is the location.
        "cookie.keys_env (line 12, column 1): no cookie keys configured; set WAITROOM_COOKIE_KEYS \
         to a comma-separated list of keys (make one with `waitroom keygen`), or list them in \
         cookie.keys"
    );
}

// ---------------------------------------------------------------------------
// Bad configs: one fixture each, exact message
// ---------------------------------------------------------------------------

/// Fixture name (without `.toml`) and the exact message it must produce.
const BAD: &[(&str, &str)] = &[
    (
        "abandon_default_too_short",
        "room[0].abandon_after (line 5, column 1): must be longer than refresh_interval (5m), or queued visitors are dropped between two polls; got the default 2m (a few times refresh_interval is safer)",
    ),
    (
        "abandon_not_after_refresh",
        "room[0].abandon_after (line 11, column 17): must be longer than refresh_interval (30s), or queued visitors are dropped between two polls; got \"30s\" (a few times refresh_interval is safer)",
    ),
    (
        "admin_listen_same_as_listen",
        "server.admin_listen (line 4, column 16): 127.0.0.1:8080 is also server.listen; the admin listener needs its own address",
    ),
    (
        "bad_bypass_header_name",
        "room[0].bypass_header.name (line 10, column 26): \"x bypass\" is not a valid HTTP header name",
    ),
    (
        "bad_bypass_ip",
        "room[0].bypass_ips[1] (line 10, column 29): \"10.0.0.300\" is not an IP address or CIDR block such as \"10.0.0.0/8\"",
    ),
    (
        "bad_duration",
        "room[0].session_duration (line 10, column 20): invalid duration \"5 mins please\" (expected number at 7); write it like \"20s\", \"5m\" or \"500ms\"",
    ),
    (
        "bad_fail_mode",
        "store.fail_mode (line 3, column 13): unknown value `retry`, expected one of `open`, `closed`, `local`",
    ),
    (
        "bad_inline_cookie_key",
        "cookie.keys[0] (line 4, column 9): the key must be 32 bytes in base64 (43 or 44 characters), got 8 characters; generate one with `waitroom keygen`",
    ),
    (
        "bad_keys_env_name",
        "cookie.keys_env (line 3, column 12): \"COOKIE-KEYS\" is not an environment variable name (letters, digits and _, not starting with a digit)",
    ),
    (
        "bad_language",
        "room[0].language (line 10, column 12): \"pt-BR\" is not \"auto\" or one of the languages shipped: en, zh, de, es, fr, ja, pt, ru",
    ),
    (
        "bad_listen",
        "server.listen (line 3, column 10): \"localhost:8080\" is not an IP address and port such as \"127.0.0.1:8080\" (host names are not accepted)",
    ),
    (
        "bad_queueing_method",
        "room[0].queueing_method (line 10, column 19): unknown value `lifo`, expected one of `fifo`, `random`, `passthrough`, `reject`",
    ),
    (
        "bad_room_id",
        "room[0].id (line 6, column 6): \"Shop!\" must be 1 to 64 characters of a-z, 0-9, _ and -",
    ),
    (
        "bad_room_state",
        "room[0].state (line 10, column 9): unknown value `sold_out`, expected one of `open`, `queue_all`, `paused`, `closed`",
    ),
    (
        "bad_store_backend",
        "store.backend (line 3, column 11): unknown value `mysql`, expected `memory` or `redis`",
    ),
    (
        "bad_trusted_proxy",
        "server.trusted_proxies[0] (line 3, column 20): \"127.0.0.1/33\" is not an IP address or CIDR block such as \"10.0.0.0/8\"",
    ),
    (
        "bad_unmatched",
        "server.unmatched (line 3, column 13): unknown value `drop`, expected `forward` or `not_found`",
    ),
    (
        "bypass_header_env_unset",
        "room[0].bypass_header.value_env (line 10, column 50): environment variable WAITROOM_TEST_UNSET is not set; it holds the bypass header's secret value",
    ),
    (
        "challenge_concurrency_zero",
        "room[0].challenge_concurrency (line 13, column 25): 0 is out of range: 1 to 10000 verifications in flight at once",
    ),
    (
        "proof_of_work_out_of_range",
        "room[0].proof_of_work (line 10, column 17): 40 is out of range: 0 (off) to 32 bits; 16 to 20 takes a browser a few hundred milliseconds",
    ),
    (
        "sign_key_env_unset",
        "origin.sign_key_env (line 4, column 16): environment variable WAITROOM_TEST_UNSET is not set (it must hold the signing key)",
    ),
    (
        "max_networks_too_large",
        "cookie.max_networks_per_session (line 3, column 28): 5000 is over 1000 (0 turns the limit off)",
    ),
    (
        "bypass_path_without_slash",
        "room[0].bypass_paths[1] (line 10, column 29): \"robots.txt\" must start with /",
    ),
    (
        "duplicate_host_path",
        "room[1].path (line 14, column 8): \"/\" on shop.example.com is also room[0]'s host and path; each room needs its own",
    ),
    (
        "duplicate_room_id",
        "room[1].id (line 12, column 6): duplicate room id \"shop\"; room[0] has it too, ids must be unique",
    ),
    (
        "duration_as_integer",
        "room[0].refresh_interval (line 10, column 20): invalid type: integer `20`, expected a duration string such as \"20s\", \"5m\" or \"500ms\"",
    ),
    (
        "event_bad_time",
        "room[0].event[0].start (line 13, column 9): invalid time \"next tuesday\"; expected an RFC 3339 time with offset, such as \"2026-12-01T10:00:00Z\"",
    ),
    (
        "event_duplicate_name",
        "room[0].event[1].name (line 17, column 8): duplicate event name \"drop\"; event[0] of this room has it too",
    ),
    (
        "event_end_before_start",
        "room[0].event[0].end (line 14, column 7): 2026-12-01T09:00:00Z must be after start 2026-12-01T10:00:00Z",
    ),
    (
        "event_lanes_only_for_negative",
        "room[0].event[0].lanes_only_for (line 15, column 18): invalid duration \"-15m\" (expected number at 0); write it like \"20s\", \"5m\" or \"500ms\"",
    ),
    (
        "event_lanes_only_for_without_lanes",
        "room[0].event[0].lanes_only_for (line 15, column 18): \"15m\" needs at least one [[room.lane]]: during it only lanes are let in",
    ),
    (
        "event_notice_too_long",
        "room[0].event[0].notice (line 15, column 10): at most 500 characters, got 569",
    ),
    (
        "event_overlap",
        "room[0].event[1].start (line 18, column 9): event \"late\" overlaps event[0] \"drop\" (prequeue included); events in a room must not overlap",
    ),
    (
        "event_prequeue_after_start",
        "room[0].event[0].prequeue_start (line 15, column 18): 2026-12-01T10:30:00Z must not be after start 2026-12-01T10:00:00Z",
    ),
    (
        "event_time_without_offset",
        "room[0].event[0].start (line 13, column 9): invalid time \"2026-12-01T10:00:00\": needs a time zone offset such as Z or +02:00",
    ),
    (
        "host_with_port",
        "room[0].host (line 10, column 8): \"shop.example.com:8443\" must not contain a port; rooms match the Host header without its port",
    ),
    (
        "host_with_scheme",
        "room[0].host (line 10, column 8): \"https://shop.example.com\" must be a bare host name without a scheme, such as \"shop.example.com\"",
    ),
    (
        "max_header_bytes_too_small",
        "server.max_header_bytes (line 3, column 20): must be between 8192 and 1048576, got 1024",
    ),
    (
        "missing_origin",
        "origin: required key is missing",
    ),
    (
        "missing_room_path",
        "room[0].path (line 5, column 1): required key is missing",
    ),
    (
        "no_cookie_keys",
        "cookie.keys_env (line 3, column 12): no cookie keys configured; set WAITROOM_TEST_UNSET to a comma-separated list of keys (make one with `waitroom keygen`), or list them in cookie.keys",
    ),
    (
        "no_rooms",
        "room: at least one [[room]] is required (a daemon without rooms protects nothing)",
    ),
    (
        "origin_ca_file_on_http",
        "origin.ca_file (line 4, column 11): is only used with an https:// origin; remove it or make origin.url https://",
    ),
    (
        "origin_not_http",
        "origin.url (line 3, column 7): \"127.0.0.1:3000\" must start with http:// or https://, such as \"http://127.0.0.1:3000\"",
    ),
    (
        "path_under_reserved_prefix",
        "room[0].path (line 7, column 8): \"/__waitroom/shop\" is under server.reserved_prefix \"/__waitroom/\", which the daemon answers itself",
    ),
    (
        "path_without_slash",
        "room[0].path (line 7, column 8): \"shop\" must start with /",
    ),
    (
        "queue_status_code_out_of_range",
        "room[0].queue_status_code (line 10, column 21): must be an HTTP status from 200 to 599, got 700",
    ),
    (
        "redis_url_wrong_scheme",
        "store.url[1] (line 4, column 34): \"http://10.0.0.2:6379/\" must start with redis:// or rediss://",
    ),
    (
        "redis_without_url",
        "store.url (line 2, column 1): is required when backend = \"redis\" (e.g. \"redis://127.0.0.1:6379/\")",
    ),
    (
        "refresh_interval_too_short",
        "room[0].refresh_interval (line 10, column 20): must be at least 1s, got \"500ms\"",
    ),
    (
        "reserved_prefix_without_trailing_slash",
        "server.reserved_prefix (line 3, column 19): \"/__waitroom\" must start and end with / and name a directory, such as \"/__waitroom/\"",
    ),
    (
        "several_problems",
        "3 problems in the configuration:\n  server.listen (line 3, column 10): \"nowhere\" is not an IP address and port such as \"127.0.0.1:8080\" (host names are not accepted)\n  room[0].session_duration (line 12, column 20): must be at least 1s, got \"0s\"\n  room[0].queue_status_code (line 13, column 21): must be an HTTP status from 200 to 599, got 100",
    ),
    (
        "syntax_error",
        "TOML syntax error at line 3, column 9: string values must be quoted, expected literal string",
    ),
    (
        "unknown_event_key",
        "room[0].event[0].shuffle (line 15, column 1): unknown key `shuffle`, expected one of `name`, `prequeue_start`, `start`, `end`, `shuffle_at_start`, `lanes_only_for`, `total_active_users`, `new_users_per_minute`, `session_duration`, `session_renewal`, `queueing_method`, `template`, `notice`",
    ),
    (
        "unknown_room_key",
        "room[1].max_users (line 16, column 1): unknown key `max_users`, expected one of `id`, `name`, `host`, `path`, `total_active_users`, `new_users_per_minute`, `session_duration`, `session_renewal`, `queueing_method`, `max_queue_length`, `sessions_per_item`, `show_stock`, `refresh_interval`, `abandon_after`, `queue_status_code`, `json_response`, `template`, `bypass_paths`, `bypass_ips`, `bypass_header`, `end_session_paths`, `case_insensitive_paths`, `bypass_upgrades`, `proof_of_work`, `bot_score_header`, `min_bot_score`, `failed_challenge`, `challenge`, `challenge_site_key`, `challenge_secret_env`, `challenge_verify_url`, `challenge_script_url`, `challenge_timeout`, `challenge_on_error`, `challenge_concurrency`, `enqueue_token`, `lane`, `lanes_only_until`, `state`, `language`, `event`, `autotune`, `origin`",
    ),
    (
        "unknown_server_key",
        "server.lisen (line 4, column 1): unknown key `lisen`, expected one of `listen`, `admin_listen`, `admin_token_env`, `reserved_prefix`, `trusted_proxies`, `unmatched`, `max_connections`, `max_header_bytes`, `header_read_timeout`, `drain_timeout`, `ip_polls_per_second`, `ip_poll_burst`, `ip_arrivals_per_second`, `ip_arrival_burst`, `max_connections_per_ip`, `workers`, `access_log`, `max_streams_per_connection`, `max_streams_per_ip`, `send_timeout`, `request_body_timeout`, `request_body_min_rate`, `tunnel_idle_timeout`, `unmatched_upgrades`, `allow_path_colons`",
    ),
    (
        "unknown_top_level_key",
        "colour (line 2, column 1): unknown key `colour`, expected one of `server`, `store`, `cookie`, `reports`, `origin`, `room`, `region`, `tls`, `webhook`",
    ),
    (
        "url_with_memory_backend",
        "store.url (line 3, column 7): is only used with backend = \"redis\"; set store.backend = \"redis\" or remove it",
    ),
    (
        "zero_max_connections",
        "server.max_connections (line 3, column 19): must be at least 1, got 0",
    ),
    (
        "zero_session_duration",
        "room[0].session_duration (line 10, column 20): must be at least 1s, got \"0s\"",
    ),
    (
        "zero_ip_poll_burst",
        "server.ip_poll_burst (line 2, column 17): must be between 1 and 1000000, got 0",
    ),
    (
        "zero_max_connections_per_ip",
        "server.max_connections_per_ip (line 2, column 26): must be at least 1, got 0",
    ),
    (
        "zero_ip_arrival_burst",
        "server.ip_arrival_burst (line 2, column 20): must be between 1 and 1000000, got 0",
    ),
    (
        "path_with_encoded_slash",
        "room[0].path (line 10, column 8): \"/shop%2Fcart\" cannot be matched: the path holds an encoded separator (%2F or %5C) or a backslash",
    ),
    (
        "bypass_path_above_root",
        "room[0].bypass_paths[0] (line 12, column 17): \"/static/../../x\" cannot be matched: the path climbs above the root",
    ),
    (
        "end_session_path_outside_room",
        "room[0].end_session_paths[1] (line 10, column 46): \"/order/complete\" is not under the room's path \"/shop\", so no request of this room can reach it",
    ),
    (
        "lanes_only_until_bad_time",
        "room[0].lanes_only_until (line 10, column 20): invalid time \"10:15 tomorrow\"; expected an RFC 3339 time with offset, such as \"2026-12-01T10:00:00Z\"",
    ),
    (
        "lanes_only_until_without_lanes",
        "room[0].lanes_only_until (line 10, column 20): 2030-01-01T10:15:00Z needs at least one [[room.lane]]: before it only lanes are let in",
    ),
    (
        "limit_too_large",
        "room[0].total_active_users (line 10, column 22): must be at most 1000000000, got 9007199254740993",
    ),
    (
        "reserved_prefix_not_canonical",
        "server.reserved_prefix (line 2, column 19): \"/__waitroom//x/../\" is not in canonical form; write \"/__waitroom/\"",
    ),
    (
        "zero_store_instances",
        "store.instances (line 2, column 13): must be at least 1, got 0",
    ),
    (
        "zero_store_timeout",
        "store.timeout (line 3, column 11): must be longer than 0, got \"0ms\"",
    ),
    (
        "region_bad_name",
        "region.name (line 7, column 8): \"EU West\" must be 1 to 64 characters of a-z, 0-9, _ and -",
    ),
    (
        "region_bad_global_url",
        "region.global_url (line 8, column 14): \"http://10.0.0.9:6379/\" must start with redis:// or rediss://",
    ),
    (
        "region_zero_sync_interval",
        "region.sync_interval (line 9, column 17): must be at least 100ms, got \"0s\"",
    ),
    (
        "region_with_memory_backend",
        "region.name (line 3, column 8): region mode needs store.backend = \"redis\": the instances of a region share store.url as their regional counter",
    ),
    (
        "region_global_is_store",
        "region.global_url (line 8, column 14): is the same Redis as store.url; the global store must be a Redis of its own, shared by every region",
    ),
    (
        "enqueue_token_jwks_url_ftp",
        "room[0].enqueue_token.jwks_url (line 11, column 12): \"ftp://idp.example/jwks.json\" is not an http:// or https:// URL with a host",
    ),
    (
        "enqueue_token_jwks_url_userinfo",
        "room[0].enqueue_token.jwks_url (line 11, column 12): \"https://user:pw@idp.example/jwks.json\" holds a user or password; leave them out",
    ),
    (
        "enqueue_token_jwks_url_no_host",
        "room[0].enqueue_token.jwks_url (line 11, column 12): \"https:///jwks.json\" is not an http:// or https:// URL with a host",
    ),
    (
        "enqueue_token_empty_audience",
        "room[0].enqueue_token.audience (line 12, column 12): \"\" is not a valid audience: 1 to 256 characters, no control characters",
    ),
    (
        "enqueue_token_short_max_lifetime",
        "room[0].enqueue_token.max_lifetime (line 12, column 16): must be at least 1m, got \"10s\"",
    ),
    (
        "zero_max_streams_per_ip",
        "server.max_streams_per_ip (line 4, column 22): must be between 1 and 1000000, got 0",
    ),
    (
        "zero_send_timeout",
        "server.send_timeout (line 4, column 16): must be longer than 0, got \"0s\"",
    ),
    (
        "zero_origin_max_connections",
        "origin.max_connections (line 6, column 19): must be between 1 and 1000000, got 0",
    ),
    (
        "sessions_per_item_negative",
        "room[0].sessions_per_item (line 10, column 21): -2.5 must be more than 0 and at most 1000 (active sessions one item of stock is worth; 1 unless a buyer takes several)",
    ),
    (
        "sessions_per_item_zero",
        "room[0].sessions_per_item (line 10, column 21): 0 must be more than 0 and at most 1000 (active sessions one item of stock is worth; 1 unless a buyer takes several)",
    ),
    (
        "autotune_floor_above_ceiling",
        "room[0].autotune.floor (line 12, column 9): 100 must not be above ceiling 50 (the rate moves between them)",
    ),
    (
        "autotune_share_out_of_range",
        "room[0].autotune.error_share (line 14, column 15): 5 must be more than 0 and at most 1 (a share: 0.05 is 5%)",
    ),
    (
        "autotune_short_interval",
        "room[0].autotune.interval (line 14, column 12): must be at least 1s, got \"100ms\"",
    ),
    (
        "zero_total_active_users",
        "room[0].total_active_users (line 8, column 22): must be at least 1, got 0 (to stop admissions, set state = \"paused\")",
    ),
];

#[test]
fn every_bad_fixture_fails_with_its_exact_message() {
    let mut failures = Vec::new();
    for (name, expected) in BAD {
        let path = format!("{FIXTURES}/{name}.toml");
        match load_with(Path::new(&path), LoadOptions::default(), &fixture_env) {
            Ok(_) => failures.push(format!("{name}: accepted")),
            Err(e) if e.to_string() != *expected => {
                failures.push(format!("{name}:\n  expected: {expected}\n  got:      {e}"))
            }
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_fixture_file_has_an_expected_message() {
    let mut files: Vec<String> = std::fs::read_dir(FIXTURES)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut listed: Vec<String> = BAD.iter().map(|(n, _)| n.to_string()).collect();
    listed.sort();
    assert_eq!(files, listed);
}

#[test]
fn errors_expose_structured_problems() {
    let e = load_with(
        Path::new(&format!("{FIXTURES}/several_problems.toml")),
        LoadOptions::default(),
        &fixture_env,
    )
    .unwrap_err();
    let keys: Vec<&str> = e.problems().iter().map(|p| p.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "server.listen",
            "room[0].session_duration",
            "room[0].queue_status_code"
        ]
    );
    assert_eq!(
        e.problems()[0].location,
        Some(Location {
            line: 3,
            column: 10
        })
    );
}

#[test]
fn syntax_errors_carry_line_and_column() {
    match from_toml_str_with_env("[server]\nlisten = \"a\"\nlisten = \"b\"\n", &no_env) {
        Err(ConfigError::Syntax {
            line,
            column,
            message,
        }) => {
            assert_eq!((line, column), (3, 1));
            assert_eq!(message, "duplicate key");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unreadable_file_names_the_path() {
    let e = load_with(
        Path::new("tests/fixtures/config/no-such-file.toml"),
        LoadOptions::default(),
        &no_env,
    )
    .unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }));
    assert!(e
        .to_string()
        .starts_with("cannot read config file tests/fixtures/config/no-such-file.toml: "));
}

#[test]
fn truncated_input_never_panics() {
    let example = std::fs::read_to_string("config/example.toml").unwrap();
    let env = env_of(&[("WAITROOM_COOKIE_KEYS", KEY_A)]);
    for (i, _) in example.char_indices() {
        let _ = from_toml_str_with_env(&example[..i], &env);
    }
}

#[test]
fn hostile_values_are_errors_not_panics() {
    for extra in [
        r#"session_duration = "99999999999999999999years""#,
        r#"session_duration = "-1s""#,
        "queue_status_code = -1",
        "queue_status_code = 18446744073709551615",
        r#"host = "..""#,
        r#"host = "[zz]""#,
        r#"bypass_header = { name = "", value_env = "" }"#,
        r#"bypass_header = { name = "a", value_env = "A=B" }"#,
        "event = [{ name = \"e\", start = 1, end = 2 }]",
        "event = [{ name = \"e\", start = 0001-01-01T00:00:00Z, end = 9999-12-31T23:59:60+23:59 }]",
        "event = [{ name = \"e\", start = 2026-01-01, end = 10:00:00 }]",
    ] {
        let _ = from_toml_str_with_env(&with_room_keys(extra), &fixture_env);
    }
}

// ---------------------------------------------------------------------------
// Defaults
// ---------------------------------------------------------------------------

#[test]
fn absent_keys_take_their_defaults() {
    let c = from_toml_str_with_env(MINIMAL, &fixture_env).unwrap();
    let s = &c.server;
    assert_eq!(s.listen, "0.0.0.0:8080".parse::<SocketAddr>().unwrap());
    assert_eq!(
        s.admin_listen,
        "127.0.0.1:9090".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(s.admin_token, None);
    assert_eq!(s.reserved_prefix, "/__waitroom/");
    assert!(s.trusted_proxies.is_empty());
    assert_eq!(s.unmatched, Unmatched::Forward);
    assert_eq!(s.max_connections, 10_000);
    assert_eq!(s.max_header_bytes, 16_384);
    assert_eq!(s.header_read_timeout, Duration::from_secs(10));
    assert_eq!(s.drain_timeout, Duration::from_secs(30));
    assert_eq!(c.store.backend, Backend::Memory);
    assert_eq!(c.store.timeout, Duration::from_millis(50));
    assert_eq!(c.store.fail_mode, FailMode::Open);
    assert!(c.cookie.secure);
    assert_eq!(c.origin.timeout, Duration::from_secs(30));
    assert_eq!(c.origin.connect_timeout, Duration::from_secs(5));

    let r = &c.rooms[0];
    assert_eq!(r.name, "shop", "name defaults to the id");
    assert_eq!(r.host, None);
    assert_eq!(r.session_duration, Duration::from_secs(300));
    assert!(r.session_renewal);
    assert_eq!(r.queueing_method, QueueingMethod::Fifo);
    assert_eq!(r.max_queue_length, 0);
    assert_eq!(r.refresh_interval, Duration::from_secs(20));
    assert_eq!(r.abandon_after, Duration::from_secs(120));
    assert_eq!(r.queue_status_code, http::StatusCode::OK);
    assert!(r.json_response);
    assert_eq!(r.template, None);
    assert!(r.bypass_paths.is_empty() && r.bypass_ips.is_empty());
    assert!(r.bypass_header.is_none());
    assert_eq!(r.state, RoomState::Open);
    assert_eq!(r.language, waitroom::config::Language::Auto);
    assert!(r.events.is_empty());
}

#[test]
fn event_without_optional_keys_keeps_room_limits() {
    let c = from_toml_str_with_env(
        &with_room_keys(
            "\n[[room.event]]\nname = \"e\"\nstart = \"2026-01-01T00:00:00Z\"\nend = \"2026-01-01T01:00:00Z\"",
        ),
        &fixture_env,
    )
    .unwrap();
    let e = &c.rooms[0].events[0].spec;
    assert_eq!(e.prequeue_start_ms, None);
    assert!(!e.shuffle_at_start);
    assert_eq!(
        (
            e.settings.total_active_users,
            e.settings.new_users_per_minute
        ),
        (None, None)
    );
}

// ---------------------------------------------------------------------------
// Values that are accepted and normalised
// ---------------------------------------------------------------------------

#[test]
fn short_durations_and_compound_durations_are_accepted() {
    let c = from_toml_str_with_env(
        &with_room_keys(
            "session_duration = \"3s\"\nrefresh_interval = \"1s\"\nabandon_after = \"1m 30s\"",
        ),
        &fixture_env,
    )
    .unwrap();
    let r = &c.rooms[0];
    assert_eq!(r.session_duration, Duration::from_secs(3));
    assert_eq!(r.refresh_interval, Duration::from_secs(1));
    assert_eq!(r.abandon_after, Duration::from_secs(90));
}

#[test]
fn host_is_lower_cased_and_addresses_normalised() {
    let src = format!(
        "[server]\ntrusted_proxies = [\"10.1.2.3/8\", \"127.0.0.1\", \"::1\"]\n{}",
        with_room_keys("host = \"Shop.Example.COM\"\nbypass_ips = [\"192.168.0.7\"]")
    );
    let c = from_toml_str_with_env(&src, &fixture_env).unwrap();
    assert_eq!(c.rooms[0].host.as_deref(), Some("shop.example.com"));
    let proxies: Vec<String> = c
        .server
        .trusted_proxies
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(proxies, ["10.0.0.0/8", "127.0.0.1/32", "::1/128"]);
    assert_eq!(c.rooms[0].bypass_ips[0].to_string(), "192.168.0.7/32");
}

#[test]
fn event_times_accept_bare_toml_datetimes_and_offsets() {
    let c = from_toml_str_with_env(
        &with_room_keys(
            "\n[[room.event]]\nname = \"e\"\nprequeue_start = 2026-12-01T10:50:00+01:00\n\
             start = \"2026-12-01T12:00:00.5+02:00\"\nend = \"2026-12-01 10:30:00-00:30\"",
        ),
        &fixture_env,
    )
    .unwrap();
    let e = &c.rooms[0].events[0].spec;
    assert_eq!(e.prequeue_start_ms, Some(ms("2026-12-01T09:50:00Z")));
    assert_eq!(e.start_ms, ms("2026-12-01T10:00:00.5Z"));
    assert_eq!(e.end_ms, ms("2026-12-01T11:00:00Z"));
}

#[test]
fn event_times_match_humantime_across_calendar_edges() {
    for t in [
        "1970-01-01T00:00:00Z",
        "2000-02-29T23:59:59Z",
        "2024-02-29T12:00:00Z",
        "2026-03-01T00:00:00Z",
        "2100-12-31T23:59:59Z",
    ] {
        let src = with_room_keys(&format!(
            "\n[[room.event]]\nname = \"e\"\nstart = \"{t}\"\nend = \"9999-01-01T00:00:00Z\""
        ));
        let c = from_toml_str_with_env(&src, &fixture_env).unwrap();
        assert_eq!(c.rooms[0].events[0].spec.start_ms, ms(t), "{t}");
    }
}

#[test]
fn redis_urls_single_and_cluster() {
    let one = format!("[store]\nbackend = \"redis\"\nurl = \"redis://10.0.0.1:6379/\"\n{MINIMAL}");
    let c = from_toml_str_with_env(&one, &fixture_env).unwrap();
    assert_eq!(
        c.store.backend,
        Backend::Redis {
            urls: vec!["redis://10.0.0.1:6379/".to_owned()]
        }
    );
    let cluster = format!(
        "[store]\nbackend = \"redis\"\nurl = [\"redis://a:7000\", \"redis://b:7001\"]\n\
         fail_mode = \"local\"\n{MINIMAL}"
    );
    let c = from_toml_str_with_env(&cluster, &fixture_env).unwrap();
    assert_eq!(
        c.store.backend,
        Backend::Redis {
            urls: vec!["redis://a:7000".to_owned(), "redis://b:7001".to_owned()]
        }
    );
    assert_eq!(c.store.fail_mode, FailMode::Local);
}

#[test]
fn sentinels_name_the_primary_and_carry_both_passwords() {
    use waitroom::config::SentinelConfig;
    let src = format!(
        "[store]\nbackend = \"redis\"\nsentinels = [\"10.0.0.1:26379\", \"redis://10.0.0.2:26380\"]\n\
         sentinel_master = \"shop\"\npassword_env = \"REDIS_PW\"\n\
         sentinel_password_env = \"SENTINEL_PW\"\nreplica_acks = 1\ntimeout = \"80ms\"\n{MINIMAL}"
    );
    let env = env_of(&[
        ("WAITROOM_COOKIE_KEYS", KEY_A),
        ("REDIS_PW", "primary"),
        ("SENTINEL_PW", "s:ntinel"),
    ]);
    let c = from_toml_str_with_env(&src, &env).unwrap();
    assert_eq!(
        c.store.backend,
        Backend::Sentinel(SentinelConfig {
            sentinels: vec![
                "redis://:s%3Antinel@10.0.0.1:26379".to_owned(),
                "redis://:s%3Antinel@10.0.0.2:26380".to_owned()
            ],
            master: "shop".into(),
            password: Some("primary".into()),
            tls: false,
        })
    );
    assert_eq!(c.store.replica_acks, 1);
    // Half the store timeout unless given.
    assert_eq!(c.store.replica_ack_timeout, Duration::from_millis(40));
}

#[test]
fn sentinel_and_acknowledgement_mistakes_are_named() {
    let redis = |extra: &str| format!("[store]\nbackend = \"redis\"\n{extra}\n{MINIMAL}");
    for (extra, want) in [
        (
            "sentinels = [\"a:26379\"]",
            "store.sentinel_master (line 1, column 1): is required with store.sentinels",
        ),
        (
            "url = \"redis://a/\"\nsentinels = [\"a:26379\"]\nsentinel_master = \"m\"",
            "store.sentinels (line 4, column 13): and store.url are two ways to find Redis; give one",
        ),
        (
            "sentinels = [\"a\"]\nsentinel_master = \"m\"",
            "store.sentinels[0] (line 3, column 14): \"a\" needs a port (Sentinels listen on 26379 by default)",
        ),
        (
            "sentinels = [\"a:1\", \"rediss://b:2\"]\nsentinel_master = \"m\"",
            "mixes redis:// and rediss:// Sentinels",
        ),
        (
            "sentinels = [\"a:1\"]\nsentinel_master = \"two words\"",
            "is not a master name",
        ),
        (
            "url = \"redis://a/\"\nsentinel_master = \"m\"",
            "store.sentinel_master (line 4, column 19): is only used with store.sentinels",
        ),
        (
            "url = \"redis://a/\"\nreplica_acks = 17",
            "store.replica_acks (line 4, column 16): is the number of replicas that must acknowledge a decision: at most 16, got 17",
        ),
        (
            "url = \"redis://a/\"\ntimeout = \"50ms\"\nreplica_ack_timeout = \"50ms\"",
            "store.replica_ack_timeout (line 5, column 23): must be shorter than store.timeout (50 ms)",
        ),
    ] {
        let e = err(&redis(extra), &fixture_env);
        assert!(e.starts_with(want) || e.contains(want), "{extra}: {e}");
    }
    for key in [
        "sentinels = [\"a:1\"]",
        "replica_acks = 1",
        "sentinel_master = \"m\"",
    ] {
        let src = format!("[store]\n{key}\n{MINIMAL}");
        let e = err(&src, &fixture_env);
        assert!(
            e.contains(
                "is only used with backend = \"redis\"; set store.backend = \"redis\" or remove it"
            ),
            "{key}: {e}"
        );
    }
}

#[test]
fn room_language_is_auto_or_a_shipped_code() {
    use waitroom::config::{Lang, Language};
    for (written, expected) in [
        ("auto", Language::Auto),
        ("ja", Language::Fixed(Lang::Ja)),
        ("RU", Language::Fixed(Lang::Ru)),
    ] {
        let src = with_room_keys(&format!("language = {written:?}"));
        let c = from_toml_str_with_env(&src, &fixture_env).unwrap();
        assert_eq!(c.rooms[0].language, expected, "{written}");
    }
    let e = err(&with_room_keys("language = \"klingon\""), &fixture_env);
    assert!(
        e.starts_with("room[0].language (line 10, column 12): \"klingon\" is not"),
        "{e}"
    );
}

#[test]
fn other_enum_values_are_accepted() {
    let src = format!(
        "[server]\nunmatched = \"not_found\"\n[store]\nfail_mode = \"closed\"\n{}",
        with_room_keys("queueing_method = \"random\"\nstate = \"queue_all\"")
    );
    let c = from_toml_str_with_env(&src, &fixture_env).unwrap();
    assert_eq!(c.server.unmatched, Unmatched::NotFound);
    assert_eq!(c.store.fail_mode, FailMode::Closed);
    assert_eq!(c.rooms[0].queueing_method, QueueingMethod::Random);
    assert_eq!(c.rooms[0].state, RoomState::QueueAll);
}

// ---------------------------------------------------------------------------
// Secrets from the environment
// ---------------------------------------------------------------------------

#[test]
fn admin_token_comes_from_the_named_variable() {
    let src = format!("[server]\nadmin_token_env = \"MY_TOKEN\"\n{MINIMAL}");
    let env = env_of(&[("WAITROOM_COOKIE_KEYS", KEY_A), ("MY_TOKEN", "t0ken")]);
    let c = from_toml_str_with_env(&src, &env).unwrap();
    assert_eq!(c.server.admin_token, Some(Secret("t0ken".to_owned())));
    assert_eq!(format!("{:?}", c.server.admin_token), "Some(Secret(..))");

    // Containers often declare variables they leave empty: that is "unset".
    let env = env_of(&[("WAITROOM_COOKIE_KEYS", KEY_A), ("MY_TOKEN", "")]);
    assert_eq!(
        from_toml_str_with_env(&src, &env)
            .unwrap()
            .server
            .admin_token,
        None
    );
}

#[test]
fn cookie_keys_come_from_the_environment_as_a_comma_list() {
    let env = env_of(&[("WAITROOM_COOKIE_KEYS", &format!(" {KEY_A} ,\n{KEY_B},"))]);
    let c = from_toml_str_with_env(MINIMAL, &env).unwrap();
    let keys: Vec<[u8; 32]> = c.cookie.keys.iter().map(|k| k.0).collect();
    assert_eq!(keys, [key_a(), [0xff; 32]]);
}

#[test]
fn cookie_keys_accept_every_base64_flavour() {
    let unpadded = KEY_A.trim_end_matches('=');
    let url_padded = format!("{KEY_B}=");
    for key in [KEY_A, unpadded, KEY_B, url_padded.as_str()] {
        let env = env_of(&[("WAITROOM_COOKIE_KEYS", key)]);
        assert!(from_toml_str_with_env(MINIMAL, &env).is_ok(), "{key}");
    }
}

#[test]
fn environment_keys_replace_inline_keys() {
    let src = format!("[cookie]\nkeys = [\"{KEY_B}\"]\n{MINIMAL}");
    let c = from_toml_str_with_env(&src, &env_of(&[("WAITROOM_COOKIE_KEYS", KEY_A)])).unwrap();
    assert_eq!(c.cookie.keys.len(), 1);
    assert_eq!(c.cookie.keys[0].0, key_a());
    let c = from_toml_str_with_env(&src, &no_env).unwrap();
    assert_eq!(c.cookie.keys[0].0, [0xff; 32]);
}

#[test]
fn bad_environment_key_is_named_but_never_printed() {
    let secret_but_short = "c2VjcmV0LXNob3J0";
    let env = env_of(&[(
        "WAITROOM_COOKIE_KEYS",
        &format!("{KEY_A},{secret_but_short}"),
    )]);
    let e = err(MINIMAL, &env);
    assert_eq!(
        e,
        "cookie.keys_env: key 2 in environment variable WAITROOM_COOKIE_KEYS: the key must be 32 \
         bytes in base64 (43 or 44 characters), got 16 characters; generate one with `waitroom keygen`"
    );
    // Right length, wrong alphabet.
    let bad = "not*base64!".repeat(4);
    let env = env_of(&[("WAITROOM_COOKIE_KEYS", &bad[..43])]);
    let e = err(MINIMAL, &env);
    assert_eq!(
        e,
        "cookie.keys_env: key 1 in environment variable WAITROOM_COOKIE_KEYS: the key is not valid \
         base64 (standard or url-safe alphabet); generate one with `waitroom keygen`"
    );
    assert!(!e.contains("not*base64!"));
}

#[test]
fn bypass_header_value_comes_from_the_environment() {
    let src =
        with_room_keys("bypass_header = { name = \"X-Load-Test\", value_env = \"LT_SECRET\" }");
    let env = env_of(&[("WAITROOM_COOKIE_KEYS", KEY_A), ("LT_SECRET", "let-me-in")]);
    let c = from_toml_str_with_env(&src, &env).unwrap();
    let (name, value) = c.rooms[0].bypass_header.clone().unwrap();
    assert_eq!(name.as_str(), "x-load-test");
    assert_eq!(value, Secret("let-me-in".to_owned()));

    let env = env_of(&[("WAITROOM_COOKIE_KEYS", KEY_A), ("LT_SECRET", " let-me-in")]);
    let e = err(&src, &env);
    assert_eq!(
        e,
        "room[0].bypass_header.value_env (line 10, column 53): the value of LT_SECRET cannot \
         match any request header: it has surrounding whitespace or characters not allowed in a \
         header value"
    );
    assert!(!e.contains("let-me-in"));
}

#[test]
fn redis_password_comes_from_the_environment() {
    let src = format!(
        "[store]\nbackend = \"redis\"\nurl = [\"redis://a:7000/\", \"redis://user@b:7001/\"]\n\
         password_env = \"REDIS_PW\"\n{MINIMAL}"
    );
    let env = env_of(&[("WAITROOM_COOKIE_KEYS", KEY_A), ("REDIS_PW", "p@ss word")]);
    match from_toml_str_with_env(&src, &env).unwrap().store.backend {
        Backend::Redis { urls } => assert_eq!(
            urls,
            [
                "redis://:p%40ss%20word@a:7000/",
                "redis://user:p%40ss%20word@b:7001/"
            ]
        ),
        other => panic!("{other:?}"),
    }

    let e = err(&src, &fixture_env);
    assert_eq!(
        e,
        "store.password_env (line 4, column 16): environment variable REDIS_PW is not set"
    );
}

#[test]
fn rediss_is_accepted_but_not_with_checks_turned_off() {
    let src = format!("[store]\nbackend = \"redis\"\nurl = \"rediss://a:7000/\"\n{MINIMAL}");
    match from_toml_str_with_env(&src, &fixture_env)
        .unwrap()
        .store
        .backend
    {
        Backend::Redis { urls } => assert_eq!(urls, ["rediss://a:7000/"]),
        other => panic!("{other:?}"),
    }
    let src =
        format!("[store]\nbackend = \"redis\"\nurl = \"rediss://a:7000/#insecure\"\n{MINIMAL}");
    assert_eq!(
        err(&src, &fixture_env),
        "store.url (line 3, column 7): \"rediss://a:7000/#insecure\" turns off certificate \
         checks (#insecure), which waitroom does not allow; trust the server's CA with \
         store.tls_ca instead"
    );
}

#[test]
fn unusable_redis_url_says_why() {
    let src = format!("[store]\nbackend = \"redis\"\nurl = \"redis://a:7000/x\"\n{MINIMAL}");
    assert_eq!(
        err(&src, &fixture_env),
        "store.url (line 3, column 7): \"redis://a:7000/x\" is not a usable Redis URL: \
         Invalid database number"
    );
}

#[test]
fn redis_password_twice_is_refused_without_printing_it() {
    let src = format!(
        "[store]\nbackend = \"redis\"\nurl = \"redis://:hunter2@a:7000/\"\n\
         password_env = \"REDIS_PW\"\n{MINIMAL}"
    );
    let env = env_of(&[("WAITROOM_COOKIE_KEYS", KEY_A), ("REDIS_PW", "pw")]);
    let e = err(&src, &env);
    assert_eq!(
        e,
        "store.url (line 3, column 7): \"redis://:REDACTED@a:7000/\" already has a password, and \
         store.password_env is set too; use one"
    );
    assert!(!e.contains("hunter2"));
}

#[test]
fn process_environment_is_the_default_source() {
    // Inline keys and a variable name nobody sets keep this independent of
    // the machine's environment.
    let src = format!(
        "[cookie]\nkeys_env = \"WAITROOM_TEST_SURELY_UNSET_7d1c\"\nkeys = [\"{KEY_A}\"]\n{MINIMAL}"
    );
    let c = from_toml_str(&src).unwrap();
    assert_eq!(c.cookie.keys[0].0, key_a());
}

#[test]
fn allow_missing_keys_only_relaxes_the_key_requirement() {
    let options = LoadOptions {
        allow_missing_keys: true,
    };
    assert!(from_toml_str_with(MINIMAL, options, &no_env).is_ok());
    // A bad key is still an error.
    let src = format!("[cookie]\nkeys = [\"abc\"]\n{MINIMAL}");
    assert!(from_toml_str_with(&src, options, &no_env).is_err());
}

/// `[[room.lane]]`: shares, names, ways in and codes are checked; a good
/// one becomes the room policy's lanes.
#[test]
fn lanes_are_checked_and_become_the_policy() {
    let dir = std::env::temp_dir().join(format!("wr-lanes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let once = dir.join("codes.txt");
    std::fs::write(&once, "# presale\nONE-TIME-1\n\nONE-TIME-2\n").unwrap();
    let short = dir.join("short.txt");
    std::fs::write(&short, "ONE-TIME-1\nONE-2\n").unwrap();
    let env = env_of(&[
        ("WAITROOM_COOKIE_KEYS", KEY_A),
        ("CODES", "PRESALE-A, PRESALE-B"),
        ("STAFF", "STAFF-0001"),
        ("SHORT", "PRESALE-A,ABC1234"),
    ]);
    let room = |lanes: &str| {
        format!(
            "[origin]\nurl = \"http://127.0.0.1:3000\"\n\n[[room]]\nid = \"shop\"\npath = \"/\"\ntotal_active_users = 10\nnew_users_per_minute = 60\n{lanes}"
        )
    };
    let good = room(&format!(
        "[[room.lane]]\nname = \"presale\"\nshare = 0.3\ncodes_env = \"CODES\"\nsingle_use_codes_file = {:?}\n\n[[room.lane]]\nname = \"staff\"\nshare = 0.2\ncodes_env = \"STAFF\"\n",
        once.to_str().unwrap()
    ));
    let c = from_toml_str_with_env(&good, &env).unwrap();
    let lanes = &c.rooms[0].lanes;
    assert_eq!((lanes[0].codes.len(), lanes[0].single_use.len()), (2, 2));
    let p = c.rooms[0].policy();
    assert_eq!(
        (p.lanes.count, &p.lanes.shares[..3]),
        (2, &[500, 300, 200][..])
    );
    assert_eq!(p.lanes.only_until_ms, 0, "no presale window unless set");
    let windowed = good.replacen(
        "new_users_per_minute = 60\n",
        "new_users_per_minute = 60\nlanes_only_until = \"2030-01-01T10:15:00Z\"\n",
        1,
    );
    let p = from_toml_str_with_env(&windowed, &env).unwrap().rooms[0].policy();
    assert_eq!(p.lanes.only_until_ms, ms("2030-01-01T10:15:00Z"));
    let short_file = format!(
        "[[room.lane]]\nname = \"a\"\nshare = 0.3\nsingle_use_codes_file = {:?}\n",
        short.to_str().unwrap()
    );
    for (lanes, want) in [
        (
            "[[room.lane]]\nname = \"presale\"\nshare = 0\ncodes_env = \"CODES\"\n",
            "room[0].lane[0].share",
        ),
        (
            "[[room.lane]]\nname = \"a\"\nshare = 0.6\ncodes_env = \"CODES\"\n[[room.lane]]\nname = \"b\"\nshare = 0.6\ntoken_claim = false\nsingle_use_codes_file = \"/nonexistent/codes\"\n",
            "add up to 1.2",
        ),
        (
            "[[room.lane]]\nname = \"presale\"\nshare = 0.3\n",
            "no way in",
        ),
        (
            "[[room.lane]]\nname = \"presale\"\nshare = 0.3\ntoken_claim = true\n",
            "needs [room.enqueue_token]",
        ),
        (
            "[[room.lane]]\nname = \"General\"\nshare = 0.3\ncodes_env = \"CODES\"\n",
            "room[0].lane[0].name",
        ),
        (
            "[[room.lane]]\nname = \"general\"\nshare = 0.3\ncodes_env = \"CODES\"\n",
            "is taken",
        ),
        (
            "[[room.lane]]\nname = \"a\"\nshare = 0.3\ncodes_env = \"CODES\"\n[[room.lane]]\nname = \"b\"\nshare = 0.3\ncodes_env = \"CODES\"\n",
            "a code is given twice",
        ),
        (
            "[[room.lane]]\nname = \"a\"\nshare = 0.3\ncodes_env = \"NOPE\"\n",
            "NOPE is not set",
        ),
        (
            "[[room.lane]]\nname = \"a\"\nshare = 0.3\ncodes_env = \"SHORT\"\n",
            "codes_env (line 12, column 13): holds 1 code(s) shorter than 8 characters",
        ),
        (
            short_file.as_str(),
            "single_use_codes_file (line 12, column 25): holds 1 code(s) shorter than 8",
        ),
    ] {
        let e = err(&room(lanes), &env);
        assert!(e.contains(want), "{lanes}: {e}");
    }
    let five: String = (0..5)
        .map(|i| format!("[[room.lane]]\nname = \"l{i}\"\nshare = 0.1\ncodes_env = \"CODES\"\n"))
        .collect();
    assert!(err(&room(&five), &env).contains("at most 4"));
    std::fs::remove_dir_all(&dir).ok();
}

/// `waitroom check` refuses a presale window without a lane, or at no
/// time, with exit code 64 and the key's name.
#[test]
fn check_exits_64_on_a_presale_window_it_cannot_keep() {
    for (fixture, says) in [
        (
            "lanes_only_until_without_lanes",
            "needs at least one [[room.lane]]",
        ),
        (
            "lanes_only_until_bad_time",
            "invalid time \"10:15 tomorrow\"",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_waitroom"))
            .args(["check", "--config"])
            .arg(format!("{FIXTURES}/{fixture}.toml"))
            .env("WAITROOM_COOKIE_KEYS", KEY_A)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{stderr}");
        assert!(stderr.contains("room[0].lanes_only_until"), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
}

/// `waitroom check` refuses a stock item worth no sessions with exit
/// code 64 and the key's name.
#[test]
fn check_exits_64_on_sessions_per_item_not_above_zero() {
    for (fixture, value) in [
        ("sessions_per_item_zero", "0"),
        ("sessions_per_item_negative", "-2.5"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_waitroom"))
            .args(["check", "--config"])
            .arg(format!("{FIXTURES}/{fixture}.toml"))
            .env("WAITROOM_COOKIE_KEYS", KEY_A)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "room[0].sessions_per_item (line 10, column 21): {value} must be more than 0"
            )),
            "{stderr}"
        );
    }
}

/// `waitroom check` refuses a bad `[room.autotune]` with exit code 64
/// and the key's name: a floor above the ceiling, a share outside
/// (0, 1], an interval under a second.
#[test]
fn check_exits_64_on_a_bad_autotune() {
    for (fixture, key) in [
        (
            "autotune_floor_above_ceiling",
            "room[0].autotune.floor (line 12",
        ),
        (
            "autotune_share_out_of_range",
            "room[0].autotune.error_share (line 14",
        ),
        (
            "autotune_short_interval",
            "room[0].autotune.interval (line 14",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_waitroom"))
            .args(["check", "--config"])
            .arg(format!("{FIXTURES}/{fixture}.toml"))
            .env("WAITROOM_COOKIE_KEYS", KEY_A)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{fixture}: {stderr}");
        assert!(stderr.contains(key), "{fixture}: {stderr}");
    }
}

/// `waitroom check` refuses a `jwks_url` that is not http(s) with a host
/// and no user or password with exit code 64 and the key's name; a good
/// one it takes without fetching it (nothing listens on it).
#[test]
fn check_exits_64_on_a_bad_jwks_url_and_fetches_none() {
    for fixture in [
        "enqueue_token_jwks_url_ftp",
        "enqueue_token_jwks_url_userinfo",
        "enqueue_token_jwks_url_no_host",
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_waitroom"))
            .args(["check", "--config"])
            .arg(format!("{FIXTURES}/{fixture}.toml"))
            .env("WAITROOM_COOKIE_KEYS", KEY_A)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{fixture}: {stderr}");
        assert!(
            stderr.contains("room[0].enqueue_token.jwks_url (line 11"),
            "{fixture}: {stderr}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    let text = std::fs::read_to_string(format!("{FIXTURES}/enqueue_token_jwks_url_ftp.toml"))
        .unwrap()
        .replace(
            "ftp://idp.example/jwks.json",
            "http://127.0.0.1:9/jwks.json",
        );
    std::fs::write(&good, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .args(["check", "--config"])
        .arg(&good)
        .env("WAITROOM_COOKIE_KEYS", KEY_A)
        .env("ENQUEUE_KEYS", KEY_A)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

/// `waitroom check` refuses an event's notice that is too long with exit
/// code 64 and the key's name, before anything starts.
#[test]
fn check_exits_64_on_an_events_notice_too_long() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .args(["check", "--config"])
        .arg(format!("{FIXTURES}/event_notice_too_long.toml"))
        .env("WAITROOM_COOKIE_KEYS", KEY_A)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains(
            "room[0].event[0].notice (line 15, column 10): at most 500 characters, got 569"
        ),
        "{stderr}"
    );
}
