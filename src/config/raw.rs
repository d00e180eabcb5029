//! The serde image of the TOML file (docs/configuration.md): one struct per
//! section, `deny_unknown_fields` everywhere, and the value types that keep
//! what was written (durations, times, Redis URLs) so messages can quote it.

use std::fmt;
use std::time::{Duration, SystemTime};

use serde::de::{self, Deserializer, SeqAccess, Unexpected, Visitor};
use serde::Deserialize;

use super::{ChallengeKind, FailedChallenge, OnVerifyError};
use crate::domain::{QueueingMethod, RoomState};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub(super) server: RawServer,
    #[serde(default)]
    pub(super) store: RawStore,
    #[serde(default)]
    pub(super) cookie: RawCookie,
    /// How long reports are kept; absent: the default.
    pub(super) reports: Option<RawReports>,
    pub(super) origin: RawOrigin,
    #[serde(default)]
    pub(super) room: Vec<RawRoom>,
    /// Region mode (docs/regions.md); absent: the central mode.
    pub(super) region: Option<RawRegion>,
    pub(super) tls: Option<RawTls>,
    /// `[[webhook]]` (docs/webhooks.md).
    #[serde(default)]
    pub(super) webhook: Vec<RawWebhook>,
}

/// `[[webhook]]`: where happenings are POSTed, which ones, and the limits
/// of their delivery.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWebhook {
    pub(super) url: String,
    /// The signing secret inline (demos and tests), or…
    pub(super) secret: Option<String>,
    /// …the environment variable holding it.
    pub(super) secret_env: Option<String>,
    /// Kind names; absent: every kind.
    pub(super) events: Option<Vec<String>>,
    /// Room ids; absent: every room.
    pub(super) rooms: Option<Vec<String>>,
    pub(super) timeout: Option<RawDuration>,
    pub(super) max_attempts: Option<u64>,
    pub(super) buffer: Option<u64>,
    /// How often admissions and revokes are sent.
    pub(super) batch: Option<RawDuration>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReports {
    pub(super) retention: Option<RawDuration>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRegion {
    /// This instance's region (its instances share `store.url`).
    pub(super) name: String,
    /// The global Redis every region shares.
    pub(super) global_url: String,
    /// How often a region reports to the global store and receives its grant.
    pub(super) sync_interval: Option<RawDuration>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) listen: Option<String>,
    pub(super) redirect_http: Option<bool>,
    #[serde(default)]
    pub(super) cert: Vec<RawTlsCert>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTlsCert {
    #[serde(default)]
    pub(super) hosts: Vec<String>,
    pub(super) cert: String,
    pub(super) key: String,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    pub(super) listen: Option<String>,
    pub(super) admin_listen: Option<String>,
    pub(super) admin_token_env: Option<String>,
    pub(super) reserved_prefix: Option<String>,
    pub(super) trusted_proxies: Option<Vec<String>>,
    pub(super) unmatched: Option<RawUnmatched>,
    pub(super) max_connections: Option<u64>,
    pub(super) max_header_bytes: Option<u64>,
    pub(super) header_read_timeout: Option<RawDuration>,
    pub(super) drain_timeout: Option<RawDuration>,
    /// Queued polls per second one client address may make (after its burst).
    pub(super) ip_polls_per_second: Option<u64>,
    /// Queued polls one client address may make at once.
    pub(super) ip_poll_burst: Option<u64>,
    /// New tickets per second one client address may get (after its burst).
    pub(super) ip_arrivals_per_second: Option<u64>,
    /// New tickets one client address may get at once.
    pub(super) ip_arrival_burst: Option<u64>,
    /// Most concurrent connections from one client address.
    pub(super) max_connections_per_ip: Option<u64>,
    /// Worker threads (0 = one per core).
    pub(super) workers: Option<u64>,
    /// One log line per request (target `waitroom::access`).
    pub(super) access_log: Option<bool>,
    /// Concurrent requests (HTTP/2 streams) one connection may carry.
    pub(super) max_streams_per_connection: Option<u64>,
    /// Concurrent HTTP/2 streams the connections of one client address carry together.
    pub(super) max_streams_per_ip: Option<u64>,
    /// Longest a response may wait for the client to take more of it.
    pub(super) send_timeout: Option<RawDuration>,
    /// A request body's time allowance (extended by `request_body_min_rate`).
    pub(super) request_body_timeout: Option<RawDuration>,
    /// Bytes per second that extend a request body's allowance by a second.
    pub(super) request_body_min_rate: Option<u64>,
    /// Longest a WebSocket tunnel may carry nothing either way.
    pub(super) tunnel_idle_timeout: Option<RawDuration>,
    /// Pass WebSocket upgrades of requests that match no room.
    pub(super) unmatched_upgrades: Option<bool>,
    /// Paths may hold `:` (refused otherwise: `::$DATA`, drive letters).
    pub(super) allow_path_colons: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawUnmatched {
    Forward,
    NotFound,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    pub(super) backend: Option<RawBackend>,
    pub(super) url: Option<RawUrls>,
    /// The variable holding the Redis password, added to every URL (which
    /// then carries none of its own), so the file need not hold it.
    pub(super) password_env: Option<String>,
    pub(super) timeout: Option<RawDuration>,
    /// How long the store must answer nothing (no call, no ping) before
    /// `fail_mode` applies; a slower call meanwhile is "busy, retry".
    pub(super) unreachable_after: Option<RawDuration>,
    pub(super) fail_mode: Option<RawFailMode>,
    /// How many instances share the store: with `fail_mode = "local"` each
    /// enforces 1/instances of every limit while the store is away.
    pub(super) instances: Option<u64>,
    /// PEM CA bundle trusted for `rediss://` URLs.
    pub(super) tls_ca: Option<String>,
    /// The Sentinels to ask for the primary, instead of `url`.
    pub(super) sentinels: Option<Vec<String>>,
    /// The name the Sentinels know the primary by.
    pub(super) sentinel_master: Option<String>,
    /// Environment variable holding the Sentinels' own password.
    pub(super) sentinel_password_env: Option<String>,
    /// Replicas that must acknowledge every writing decision (0: none).
    pub(super) replica_acks: Option<u64>,
    /// Longest a decision waits for those acknowledgements.
    pub(super) replica_ack_timeout: Option<RawDuration>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawBackend {
    Memory,
    Redis,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawFailMode {
    Open,
    Closed,
    Local,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCookie {
    pub(super) keys_env: Option<String>,
    pub(super) keys: Option<Vec<String>>,
    pub(super) secure: Option<bool>,
    /// Bind tickets to the client's network (/24 or /64).
    pub(super) bind_to_client: Option<bool>,
    /// Distinct client networks one admitted session may be used from (0 = any).
    pub(super) max_networks_per_session: Option<u64>,
    /// `lax`, `strict` or `none`.
    pub(super) same_site: Option<String>,
    /// CHIPS: the cookie is kept per top-level site (an embedded room).
    pub(super) partitioned: Option<bool>,
    /// The `Domain` attribute: a parent of every room's host.
    pub(super) domain: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOrigin {
    pub(super) url: String,
    pub(super) timeout: Option<RawDuration>,
    pub(super) connect_timeout: Option<RawDuration>,
    /// Environment variable holding the key of `X-Waitroom-Signature`.
    pub(super) sign_key_env: Option<String>,
    /// Most connections to the origin per worker thread.
    pub(super) max_connections: Option<u64>,
    /// CAs (PEM) an https:// origin is checked against, else the system's.
    pub(super) ca_file: Option<String>,
    /// A client certificate (PEM chain) and its key for an https:// origin.
    pub(super) client_cert_file: Option<String>,
    pub(super) client_key_file: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoom {
    pub(super) id: String,
    pub(super) name: Option<String>,
    pub(super) host: Option<String>,
    pub(super) path: String,
    pub(super) total_active_users: u64,
    pub(super) new_users_per_minute: u64,
    pub(super) session_duration: Option<RawDuration>,
    pub(super) session_renewal: Option<bool>,
    pub(super) queueing_method: Option<QueueingMethod>,
    pub(super) max_queue_length: Option<u64>,
    pub(super) sessions_per_item: Option<f64>,
    /// Show waiting visitors the stock left.
    pub(super) show_stock: Option<bool>,
    pub(super) refresh_interval: Option<RawDuration>,
    pub(super) abandon_after: Option<RawDuration>,
    pub(super) queue_status_code: Option<u64>,
    pub(super) json_response: Option<bool>,
    pub(super) template: Option<String>,
    pub(super) bypass_paths: Option<Vec<String>>,
    pub(super) bypass_ips: Option<Vec<String>>,
    pub(super) bypass_header: Option<RawBypassHeader>,
    /// Path prefixes where the origin's 2xx answer ends the session.
    pub(super) end_session_paths: Option<Vec<String>>,
    pub(super) case_insensitive_paths: Option<bool>,
    /// Pass WebSocket upgrades of requests a bypass rule forwards.
    pub(super) bypass_upgrades: Option<bool>,
    /// Proof-of-work difficulty in leading zero bits (0 = off).
    pub(super) proof_of_work: Option<u64>,
    /// A trusted proxy's bot score header (e.g. a CDN's), and the score
    /// below which a newcomer is a bot.
    pub(super) bot_score_header: Option<String>,
    pub(super) min_bot_score: Option<u64>,
    /// `"retry"` or `"shadow"`.
    pub(super) failed_challenge: Option<FailedChallenge>,
    /// `"proof_of_work"` (with `proof_of_work` bits) or a captcha provider.
    pub(super) challenge: Option<ChallengeKind>,
    /// (the captcha settings below are read into [`RawCaptcha`])
    pub(super) challenge_site_key: Option<String>,
    pub(super) challenge_secret_env: Option<String>,
    pub(super) challenge_verify_url: Option<String>,
    pub(super) challenge_script_url: Option<String>,
    pub(super) challenge_timeout: Option<RawDuration>,
    /// `"closed"` or `"open"`: the verifier unreachable.
    pub(super) challenge_on_error: Option<OnVerifyError>,
    /// Most verifications in flight at once (per instance).
    pub(super) challenge_concurrency: Option<u64>,
    pub(super) enqueue_token: Option<RawEnqueueToken>,
    #[serde(default)]
    pub(super) lane: Vec<RawLane>,
    /// A presale window: until this time only the lanes are let in.
    pub(super) lanes_only_until: Option<RawTime>,
    pub(super) state: Option<RoomState>,
    /// `"auto"` or a shipped language code.
    pub(super) language: Option<String>,
    #[serde(default)]
    pub(super) event: Vec<RawEvent>,
    /// `[room.autotune]`; absent: the rate stays where it is set.
    pub(super) autotune: Option<RawAutotune>,
    /// This room's own origin (replaces `[origin]` for its requests).
    pub(super) origin: Option<RawOrigin>,
}

/// `[room.autotune]`: the rate follows the origin's health.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAutotune {
    pub(super) latency: Option<RawDuration>,
    pub(super) slow_share: Option<f64>,
    pub(super) error_share: Option<f64>,
    pub(super) floor: u64,
    pub(super) ceiling: u64,
    pub(super) step: Option<f64>,
    pub(super) interval: Option<RawDuration>,
    pub(super) min_requests: Option<u64>,
}

/// `[[room.lane]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLane {
    pub(super) name: String,
    /// Of the admissions while several lanes wait: more than 0, at most 1.
    pub(super) share: f64,
    /// A variable holding codes any number of visitors may bring, comma-separated.
    pub(super) codes_env: Option<String>,
    /// A file of codes good for one place each, one a line.
    pub(super) single_use_codes_file: Option<String>,
    /// A verified enqueue token whose `lane` claim names this lane enters it.
    pub(super) token_claim: Option<bool>,
}

/// `[room.enqueue_token]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEnqueueToken {
    /// `"off"`, `"optional"` or `"required"`.
    pub(super) mode: Option<String>,
    /// A variable holding HS256 secrets, base64, comma-separated.
    pub(super) hmac_keys_env: Option<String>,
    /// A JWKS file with Ed25519 (EdDSA) and RSA (RS256) public keys.
    pub(super) jwks_file: Option<String>,
    /// A JWKS URL (http or https) fetched at start and kept fresh.
    pub(super) jwks_url: Option<String>,
    /// The least time between two fetches asked for by an unknown `kid`.
    pub(super) jwks_min_refresh: Option<RawDuration>,
    /// How long a fetched set is used before it is fetched again.
    pub(super) jwks_max_age: Option<RawDuration>,
    /// `aud` values taken besides the room id; when given, `aud` is required.
    #[serde(default)]
    pub(super) audience: Vec<String>,
    /// `iss` values taken; when given, `iss` is required.
    #[serde(default)]
    pub(super) issuer: Vec<String>,
    /// The longest a token may still live (`exp` minus now).
    pub(super) max_lifetime: Option<RawDuration>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBypassHeader {
    pub(super) name: String,
    pub(super) value_env: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEvent {
    pub(super) name: String,
    pub(super) prequeue_start: Option<RawTime>,
    pub(super) start: RawTime,
    pub(super) end: RawTime,
    pub(super) shuffle_at_start: Option<bool>,
    /// A presale window from the start: this long only lanes are let in.
    pub(super) lanes_only_for: Option<RawDuration>,
    pub(super) total_active_users: Option<u64>,
    pub(super) new_users_per_minute: Option<u64>,
    pub(super) session_duration: Option<RawDuration>,
    pub(super) session_renewal: Option<bool>,
    pub(super) queueing_method: Option<QueueingMethod>,
    pub(super) template: Option<String>,
    pub(super) notice: Option<String>,
}

/// A duration string, kept with its text so messages quote what was written.
pub(super) struct RawDuration {
    pub(super) value: Duration,
    pub(super) text: String,
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
pub(super) struct RawTime(pub(super) SystemTime);

const TIME_EXPECTED: &str = r#"an RFC 3339 time with offset, such as "2026-12-01T10:00:00Z""#;

impl<'de> Deserialize<'de> for RawTime {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Going through toml::Value accepts both quoted strings (as in
        // config/example.toml) and bare TOML date-times, which operators
        // also write.
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
    let (Some(date), Some(clock)) = (dt.date, dt.time) else {
        return Err("needs both a date and a time of day".to_owned());
    };
    let offset_seconds = match dt.offset {
        Some(toml::value::Offset::Z) => 0,
        Some(toml::value::Offset::Custom { minutes }) => i32::from(minutes) * 60,
        None => return Err("needs a time zone offset such as Z or +02:00".to_owned()),
    };
    let month = time::Month::try_from(date.month).map_err(|_| "has no such month".to_owned())?;
    let date = time::Date::from_calendar_date(i32::from(date.year), month, date.day)
        .map_err(|_| "has no such day".to_owned())?;
    let clock = time::Time::from_hms_nano(clock.hour, clock.minute, clock.second, clock.nanosecond)
        .map_err(|_| "has no such time of day".to_owned())?;
    let offset = time::UtcOffset::from_whole_seconds(offset_seconds)
        .map_err(|_| "has an offset out of range".to_owned())?;
    Ok(time::PrimitiveDateTime::new(date, clock)
        .assume_offset(offset)
        .into())
}

/// `store.url`: one URL, or a list of Redis Cluster seed nodes.
pub(super) struct RawUrls {
    pub(super) urls: Vec<String>,
    /// Written as a list, so problems are reported as `store.url[i]`.
    pub(super) is_list: bool,
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

/// A room's captcha settings, taken out of [`RawRoom`] for checking.
pub(super) struct RawCaptcha {
    pub(super) kind: Option<ChallengeKind>,
    pub(super) site_key: Option<String>,
    pub(super) secret_env: Option<String>,
    pub(super) verify_url: Option<String>,
    pub(super) script_url: Option<String>,
    pub(super) timeout: Option<RawDuration>,
    pub(super) on_error: Option<OnVerifyError>,
    pub(super) concurrency: Option<u64>,
}

/// The captcha settings of `room`.
pub(super) fn raw_captcha(room: &mut RawRoom) -> RawCaptcha {
    RawCaptcha {
        kind: room.challenge,
        site_key: room.challenge_site_key.take(),
        secret_env: room.challenge_secret_env.take(),
        verify_url: room.challenge_verify_url.take(),
        script_url: room.challenge_script_url.take(),
        timeout: room.challenge_timeout.take(),
        on_error: room.challenge_on_error,
        concurrency: room.challenge_concurrency,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn at(text: &str) -> Result<u64, String> {
        let dt: toml::value::Datetime = text.parse().map_err(|e| format!("{e}"))?;
        datetime_to_system_time(&dt).map(|t| t.duration_since(UNIX_EPOCH).unwrap().as_secs())
    }

    #[test]
    fn event_times_are_instants_whatever_the_offset() {
        assert_eq!(at("2026-12-01T10:00:00Z"), Ok(1_796_119_200));
        assert_eq!(at("2026-12-01T12:00:00+02:00"), Ok(1_796_119_200));
        assert_eq!(at("2026-12-01T05:30:00-04:30"), Ok(1_796_119_200));
        assert_eq!(at("2028-02-29T00:00:00Z"), Ok(1_835_395_200));
        assert!(at("2026-12-01T10:00:00").unwrap_err().contains("offset"));
        assert!(at("2026-12-01").unwrap_err().contains("time of day"));
    }
}
