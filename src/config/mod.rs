//! The daemon's configuration: the validated, typed form everything else reads.
//!
//! `raw` holds the serde image of the TOML file (unknown keys rejected);
//! `load` has the entry points (`load`, `from_toml_str`) that turn it into a
//! [`Config`]; `check` validates every value and `keypath` names the key
//! and line of every problem, before any socket is bound.

pub(crate) mod bounds;
mod check;
mod error;
mod keypath;
mod load;
mod raw;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

use crate::domain::{Lanes, QueueingMethod, RoomPolicy, RoomState};

pub use crate::i18n::{Lang, Language};
pub use crate::secret::{Secret, Secret32};
pub use crate::tls::{TlsCert, TlsConfig};
pub use crate::webhook::{Kind as WebhookKind, WebhookConfig};
pub(crate) use check::check_id;
pub use error::{ConfigError, LoadOptions, Location, Problem};
#[cfg(test)]
pub(crate) use load::shop as test_shop;
pub use load::{
    from_toml_str, from_toml_str_with, from_toml_str_with_env, load, load_with, process_env,
};

/// The whole validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// `[server]`: the listeners, their limits and time limits.
    pub server: ServerConfig,
    /// `[store]`: where room state lives and what happens when it is unreachable.
    pub store: StoreConfig,
    /// `[cookie]`: the ticket cookie's keys and flags.
    pub cookie: CookieConfig,
    /// `[reports]`: how long the rooms' reports are kept.
    pub reports: ReportsConfig,
    /// `[origin]`: the protected site and how it is reached.
    pub origin: OriginConfig,
    /// `[[room]]`, in the order configured; a request goes to the one whose
    /// host and longest path prefix match it.
    pub rooms: Vec<RoomConfig>,
    /// `[region]`: regional counters and a global store (docs/regions.md);
    /// `None`: every decision on the one store (central mode).
    pub region: Option<RegionConfig>,
    /// The TLS listener (`[tls]`), if any.
    pub tls: Option<TlsConfig>,
    /// `[[webhook]]`, in the order configured (docs/webhooks.md).
    pub webhooks: Vec<WebhookConfig>,
}

/// `[reports]`: the rooms' reports, kept in the store (docs/operating.md, "Reports").
#[derive(Clone, Copy, Debug)]
pub struct ReportsConfig {
    /// How long a report's minutes are kept (1 h to 365 d; 30 d by default).
    pub retention: Duration,
}

/// `[region]`: this instance's region and the global store.
#[derive(Clone, Debug)]
pub struct RegionConfig {
    /// The region's name (a-z, 0-9, _ and -): the instances of a region
    /// share `store.url`, their regional counter.
    pub name: String,
    /// The global Redis (one URL) that holds the rooms' totals, each
    /// region's grant and report, and the Anywhere pool.
    pub global_url: String,
    /// How often the region reports to the global store and receives its grant.
    pub sync_interval: Duration,
}

/// `[server]`: listeners, connection and request limits, time limits.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Public listener (visitors).
    pub listen: SocketAddr,
    /// Admin listener (API, metrics, dashboard).
    pub admin_listen: SocketAddr,
    /// Bearer token for the admin API, read from `admin_token_env`.
    pub admin_token: Option<Secret>,
    /// Paths under this prefix are answered by the daemon; starts and ends with `/`.
    pub reserved_prefix: String,
    /// Peers whose inbound `X-Forwarded-*` headers are trusted.
    pub trusted_proxies: Vec<IpNet>,
    /// What to do with a request that matches no room.
    pub unmatched: Unmatched,
    /// Most concurrent client connections; more are closed at once.
    pub max_connections: usize,
    /// Most concurrent connections from one client address; more are closed at once.
    pub max_connections_per_ip: usize,
    /// Most bytes of request headers.
    pub max_header_bytes: usize,
    /// How long a client may take to send its request headers.
    pub header_read_timeout: Duration,
    /// How long `SIGTERM` waits for in-flight requests.
    pub drain_timeout: Duration,
    /// Queued polls per second one client address may make after its burst.
    pub ip_polls_per_second: u32,
    /// Queued polls one client address may make at once.
    pub ip_poll_burst: u32,
    /// New tickets per second one client address may get after its burst.
    pub ip_arrivals_per_second: u32,
    /// New tickets one client address may get at once.
    pub ip_arrival_burst: u32,
    /// Log one line per visitor request (target `waitroom::access`).
    pub access_log: bool,
    /// Worker threads serving visitors, each with its own listener and
    /// origin connections; 0 = one per CPU core.
    pub workers: usize,
    /// Most requests one connection carries at once (HTTP/2's
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`; HTTP/1 carries one).
    pub max_streams_per_connection: u32,
    /// Most HTTP/2 streams the connections of one client address (/64 for
    /// IPv6) carry at once; more are answered 503 at once.
    pub max_streams_per_ip: usize,
    /// Longest a response may wait for the client to take more of it (a
    /// full socket, or an HTTP/2 window held at 0); then the connection is
    /// closed, and with it what it held at the origin.
    pub send_timeout: Duration,
    /// A request body's allowance: it must end within this time plus one
    /// second per `request_body_min_rate` bytes received.
    pub request_body_timeout: Duration,
    /// Bytes per second a slow request body must average (see above).
    pub request_body_min_rate: u64,
    /// A WebSocket tunnel that carries nothing either way for this long
    /// is closed.
    pub tunnel_idle_timeout: Duration,
    /// Pass WebSocket upgrades of requests that match no room (off: the
    /// `Upgrade` is dropped and the request forwarded as plain HTTP).
    pub unmatched_upgrades: bool,
    /// Paths may hold `:` (`%3A`); refused otherwise, since Windows origins
    /// read `/shop::$DATA` as `/shop`.
    pub allow_path_colons: bool,
}

impl ServerConfig {
    /// The number of worker threads to run: `workers`, or one per core.
    pub fn workers(&self) -> usize {
        match self.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
}

/// `room.bot_score_header` and `room.min_bot_score`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BotScore {
    /// `room.bot_score_header`: the header a trusted proxy puts its score in.
    pub header: http::HeaderName,
    /// 1 to 99: scores below it are bots (a CDN's score: 1 almost surely a
    /// bot, 99 almost surely a person).
    pub min: u8,
}

pub use crate::enqueue::JwksUrl;

/// `[room.enqueue_token]`: tokens the site signs for its users.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnqueueToken {
    /// `required`: no place without a valid token; else `optional`.
    pub required: bool,
    /// `hmac_keys_env` and `jwks_file`: the keys a token may be signed with
    /// (with those fetched from `jwks_url`).
    pub keys: crate::enqueue::TokenKeys,
    /// `jwks_url`: more keys, fetched at start and kept fresh
    /// (`crate::enqueue::jwks`).
    pub jwks_url: Option<JwksUrl>,
    /// `audience`, `issuer` and `max_lifetime`, with the room id as an
    /// audience.
    pub rules: crate::enqueue::Rules,
}

/// `[[room.lane]]`: a priority lane. Its visitors wait in a line of their
/// own and get `share` of the admissions while several lanes wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneConfig {
    /// `[a-z0-9_-]{1,32}`: shown to its visitors and in metrics.
    pub name: String,
    /// Thousandths of the admissions while several lanes wait.
    pub share: u16,
    /// Digests (`domain::digest64`) of the codes any number of visitors
    /// may bring (`codes_env`).
    pub codes: std::collections::HashSet<u64>,
    /// Digests of the codes good for one place each
    /// (`single_use_codes_file`), across every instance.
    pub single_use: std::collections::HashSet<u64>,
    /// A verified enqueue token whose `lane` claim names this lane enters it.
    pub token_claim: bool,
}

/// What the room asks of a newcomer while it queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChallengeKind {
    /// `proof_of_work`: a SHA-256 puzzle solved by the queue page's script.
    ProofOfWork,
    /// `turnstile`: Cloudflare Turnstile.
    Turnstile,
    /// `hcaptcha`: hCaptcha.
    Hcaptcha,
    /// `recaptcha`: Google reCAPTCHA.
    Recaptcha,
}

impl ChallengeKind {
    /// The provider's `siteverify` API and its widget's script.
    pub fn default_urls(self) -> Option<(&'static str, &'static str)> {
        match self {
            ChallengeKind::ProofOfWork => None,
            ChallengeKind::Turnstile => Some((
                "https://challenges.cloudflare.com/turnstile/v0/siteverify",
                "https://challenges.cloudflare.com/turnstile/v0/api.js",
            )),
            ChallengeKind::Hcaptcha => Some((
                "https://api.hcaptcha.com/siteverify",
                "https://js.hcaptcha.com/1/api.js",
            )),
            ChallengeKind::Recaptcha => Some((
                "https://www.google.com/recaptcha/api/siteverify",
                "https://www.google.com/recaptcha/api.js",
            )),
        }
    }

    /// The class of the element the provider's script turns into its widget.
    pub fn widget_class(self) -> &'static str {
        match self {
            ChallengeKind::ProofOfWork => "",
            ChallengeKind::Turnstile => "cf-turnstile",
            ChallengeKind::Hcaptcha => "h-captcha",
            ChallengeKind::Recaptcha => "g-recaptcha",
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            ChallengeKind::ProofOfWork => "proof_of_work",
            ChallengeKind::Turnstile => "turnstile",
            ChallengeKind::Hcaptcha => "hcaptcha",
            ChallengeKind::Recaptcha => "recaptcha",
        }
    }
}

/// What happens to a newcomer when the captcha provider's verifier gives
/// no answer (no connection, no answer in time, a 5xx).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnVerifyError {
    /// The challenge again: nobody passes unverified.
    #[default]
    Closed,
    /// Taken as passed, but only while most recent verifications got no
    /// answer (the provider is down for everyone, not just slow for one):
    /// the provider's outage does not stop the sale.
    Open,
}

/// `room.challenge` with a captcha provider, and its settings.
#[derive(Clone, Debug)]
pub struct Captcha {
    /// `room.challenge`: the provider.
    pub kind: ChallengeKind,
    /// `room.challenge_site_key`: the site key the widget is shown with.
    pub site_key: String,
    /// The secret read from `room.challenge_secret_env`, sent to the verifier.
    pub secret: Secret,
    /// `room.challenge_verify_url`: the provider's `siteverify` API.
    pub verify_url: http::Uri,
    /// `room.challenge_script_url`: the widget's script.
    pub script_url: String,
    /// `room.challenge_timeout`: how long the verifier may take.
    pub timeout: Duration,
    /// `room.challenge_on_error`: what a newcomer gets when the verifier gives no answer.
    pub on_error: OnVerifyError,
    /// Most verifications in flight at once on this instance; a newcomer
    /// finding them all taken is asked to send its token again shortly.
    pub concurrency: usize,
}

/// What a visitor who fails the room's challenge gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailedChallenge {
    /// The challenge again (a bot score too low: refused, 403).
    #[default]
    Retry,
    /// The shadow queue: a page like the queue's whose place moves up
    /// slowly and is never let in, holding nothing in the store.
    Shadow,
    /// Watch before it bites: the visitor is treated as with `retry` (a
    /// failed challenge gets a new one, a low bot score counts for
    /// nothing), and what `shadow` would have done is counted
    /// (`outcome="would_shadow"`).
    Log,
}

/// What happens to a request no room matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unmatched {
    /// Forward it unprotected.
    Forward,
    /// Answer 404.
    NotFound,
}

/// `[store]`: the backend holding room state, its time limits and fail mode.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// `store.backend` with `store.url` or `store.sentinels`.
    pub backend: Backend,
    /// Longest a request waits for the store.
    pub timeout: Duration,
    /// How long the store must have answered nothing (no call, no ping)
    /// before `fail_mode` applies; until then a call that fails or times
    /// out is "busy, retry" and lets nobody in (`gate::guard`).
    pub unreachable_after: Duration,
    /// `store.fail_mode`: what the daemon does while the store is unreachable.
    pub fail_mode: FailMode,
    /// Instances sharing the store; in `local` fail mode each enforces
    /// `1/instances` of every limit.
    pub instances: u64,
    /// PEM file of the CAs trusted for `rediss://` (instead of the
    /// system's roots).
    pub tls_ca: Option<PathBuf>,
    /// Replicas that must acknowledge every writing decision (`WAIT`);
    /// 0: none.
    pub replica_acks: u32,
    /// Longest a decision waits for them.
    pub replica_ack_timeout: Duration,
}

/// `store.backend`: where room state lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// In this process only: for a single instance, lost on restart.
    Memory,
    /// One URL: a single Redis; several: the seed nodes of a Redis Cluster.
    Redis {
        /// `store.url`: one URL, or a list of seed nodes.
        urls: Vec<String>,
    },
    /// A primary found through Sentinel, followed across failovers.
    Sentinel(SentinelConfig),
}

/// `store.sentinels` and the keys that go with them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelConfig {
    /// The Sentinels, as `redis://` (or `rediss://`) URLs carrying the
    /// Sentinels' password when one is set.
    pub sentinels: Vec<String>,
    /// The name the Sentinels know the primary by.
    pub master: String,
    /// The primary's (and replicas') password, as for `store.url`.
    pub password: Option<String>,
    /// TLS to the Sentinels and to the primary (`rediss://` Sentinels).
    pub tls: bool,
}

impl Backend {
    /// Whether the store is reached over TLS.
    pub fn uses_tls(&self) -> bool {
        match self {
            Backend::Memory => false,
            Backend::Redis { urls } => urls.iter().any(|u| u.starts_with("rediss://")),
            Backend::Sentinel(s) => s.tls,
        }
    }
}

/// What the daemon does while the store is unreachable (docs/configuration.md,
/// `store.fail_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailMode {
    /// Forward everyone.
    Open,
    /// Serve a "temporarily unavailable" page.
    Closed,
    /// Enforce this instance's share of the limits in memory.
    Local,
}

/// `[cookie]`: the ticket cookie's key ring and flags.
#[derive(Clone, Debug)]
pub struct CookieConfig {
    /// The key ring: the first key seals, all keys open.
    pub keys: Vec<Secret32>,
    /// Mark cookies `Secure`.
    pub secure: bool,
    /// A ticket used from another client network (/24, /64) than the one
    /// it was issued to is ignored: that client is a new visitor.
    pub bind_to_client: bool,
    /// An admitted session used from more distinct client networks than
    /// this is ended (0 = no limit).
    pub max_networks_per_session: u64,
    /// `cookie.same_site`: when browsers send the ticket on requests from
    /// other sites.
    pub same_site: SameSite,
    /// `cookie.partitioned`: kept per top-level site (CHIPS), for a room
    /// embedded in another site's frame.
    pub partitioned: bool,
    /// `cookie.domain`: the `Domain` attribute (lower case, no leading
    /// dot), so one ticket serves the shop's subdomains.
    pub domain: Option<String>,
}

/// The ticket cookie's `SameSite` attribute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SameSite {
    /// Sent on top-level navigations from other sites, not on their
    /// form POSTs or frames (the default).
    #[default]
    Lax,
    /// Never sent on requests another site starts.
    Strict,
    /// Always sent (needs `Secure`): a buyer back from a payment page by a
    /// cross-site form POST keeps the place.
    None,
}

impl SameSite {
    /// As the attribute writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            SameSite::Lax => "Lax",
            SameSite::Strict => "Strict",
            SameSite::None => "None",
        }
    }
}

/// `[origin]`: the protected site, its time limits and connection cap.
#[derive(Clone, Debug)]
pub struct OriginConfig {
    /// Base URL of the origin (`http://host:port`, optionally with a path prefix).
    pub url: http::Uri,
    /// Longest wait for the origin's response headers.
    pub timeout: Duration,
    /// Longest wait for a TCP connection to the origin.
    pub connect_timeout: Duration,
    /// Key of the `X-Waitroom-Signature` HMAC (from `sign_key_env`).
    pub sign_key: Option<Secret>,
    /// Most connections to the origin per worker thread; a request that
    /// finds them all busy waits for one (within `timeout`).
    pub max_connections: usize,
    /// `origin.ca_file`: the CAs an `https://` origin's certificate is
    /// checked against (`None`: the system's).
    pub ca_file: Option<std::path::PathBuf>,
    /// `origin.client_cert_file` and `origin.client_key_file`: the
    /// certificate shown to an `https://` origin that asks for one.
    pub client_cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// `[[room]]`: which requests a room protects, its limits, pages and rules.
#[derive(Clone, Debug)]
pub struct RoomConfig {
    /// `[a-z0-9_-]{1,64}`; used in cookie names and Redis keys.
    pub id: String,
    /// Human name shown on the queue page (defaults to the id).
    pub name: String,
    /// Lower-case host without port; `None` matches any host.
    pub host: Option<String>,
    /// Path prefix in canonical form (see `gate::canonical::path`).
    pub path: String,
    /// `room.total_active_users`: most concurrent sessions (I1).
    pub total_active_users: u64,
    /// `room.new_users_per_minute`: most admissions in any 60 s (I2).
    pub new_users_per_minute: u64,
    /// `room.session_duration`: session length after the last request (or admission).
    pub session_duration: Duration,
    /// `room.session_renewal`: each request extends the session (sliding sessions).
    pub session_renewal: bool,
    /// `room.queueing_method`: how waiting visitors are let in.
    pub queueing_method: QueueingMethod,
    /// `room.max_queue_length`: beyond it newcomers get "too busy" (0 = unbounded).
    pub max_queue_length: u64,
    /// `room.sessions_per_item`: active sessions one item of stock is
    /// worth (the origin's `X-Waitroom-Stock`); more than 0, 1 by default.
    pub sessions_per_item: f64,
    /// `room.show_stock`: the status JSON (`stock_left`) and the queue
    /// page show waiting visitors the stock left, while one is counted.
    pub show_stock: bool,
    /// `room.refresh_interval`: how often the queue page polls.
    pub refresh_interval: Duration,
    /// `room.abandon_after`: a waiting visitor silent this long loses the place.
    pub abandon_after: Duration,
    /// `room.queue_status_code`: the HTTP status of the queue page.
    pub queue_status_code: http::StatusCode,
    /// Answer `Accept: application/json` requests with the status JSON.
    pub json_response: bool,
    /// Operator's queue page template; `None` = the built-in one.
    pub template: Option<PathBuf>,
    /// Path prefixes forwarded without a ticket, canonical, matched on whole segments.
    pub bypass_paths: Vec<String>,
    /// Client addresses forwarded without a ticket.
    pub bypass_ips: Vec<IpNet>,
    /// A header whose exact value lets a request through without a ticket.
    pub bypass_header: Option<(http::HeaderName, Secret)>,
    /// `room.end_session_paths`: path prefixes under `path`, canonical,
    /// matched on whole segments like `bypass_paths`, where an admitted
    /// visitor's session ends when the origin answers 2xx (in decision
    /// mode, once the request is let in).
    pub end_session_paths: Vec<String>,
    /// Match `path`, `bypass_paths` and `end_session_paths` ignoring ASCII
    /// case, for origins that serve paths that way.
    pub case_insensitive_paths: bool,
    /// Pass WebSocket upgrades of requests a bypass rule forwards (off:
    /// the `Upgrade` is dropped and the request forwarded as plain HTTP).
    pub bypass_upgrades: bool,
    /// Proof of work asked of new visitors while the room queues, in
    /// leading zero bits of SHA-256 (0 = off).
    pub proof_of_work: u8,
    /// Newcomers whose bot score (from a trusted proxy's header) is below
    /// the minimum are bots.
    pub bot_score: Option<BotScore>,
    /// What a visitor who fails the room's challenge (a forged or replayed
    /// proof of work, a captcha the provider refused) or its bot score gets.
    pub failed_challenge: FailedChallenge,
    /// A captcha provider's challenge asked of newcomers while the room
    /// queues, in place of the proof of work.
    pub captcha: Option<Captcha>,
    /// `[room.enqueue_token]` when not `off`.
    pub enqueue_token: Option<EnqueueToken>,
    /// `[[room.lane]]`: lanes 1.. in the order configured (lane 0 is the
    /// general queue).
    pub lanes: Vec<LaneConfig>,
    /// `lanes_only_until`: the end of the presale window (ms since the
    /// epoch; 0: none). Before it only the lanes are let in.
    pub lanes_only_until_ms: u64,
    /// Initial room state.
    pub state: RoomState,
    /// The language of the room's pages: from `Accept-Language`, or fixed.
    pub language: Language,
    /// `[[room.event]]`: scheduled periods with their own settings.
    pub events: Vec<EventConfig>,
    /// `[room.autotune]`: `new_users_per_minute` follows the origin's
    /// latency and errors (`None`: off).
    pub autotune: Option<AutotuneConfig>,
    /// `[room.origin]`: this room's own origin, with its own connections
    /// (`None`: the `[origin]` every room shares).
    pub origin: Option<OriginConfig>,
}

/// `[room.autotune]` (docs/operating.md, "Autotune"): once per
/// `interval`, the room's rate steps down when too many of the requests
/// forwarded for it were slow or failed, and up when the origin is
/// healthy again, between `floor` and `ceiling`.
#[derive(Clone, Debug, PartialEq)]
pub struct AutotuneConfig {
    /// A forwarded request that takes longer than this is slow.
    pub latency: Duration,
    /// Share of slow requests (0 to 1) above which the rate steps down.
    pub slow_share: f64,
    /// Share of the origin's 5xx answers (and failed requests) above
    /// which the rate steps down.
    pub error_share: f64,
    /// Lowest rate autotune sets (new users per minute).
    pub floor: u64,
    /// Highest rate autotune sets (new users per minute).
    pub ceiling: u64,
    /// One move, as a fraction of `ceiling` (more than 0, at most 1; at
    /// least one user per minute).
    pub step: f64,
    /// At most one move per interval, across every instance.
    pub interval: Duration,
    /// Fewer forwarded requests than this in an interval: no move (too
    /// little to judge the origin by).
    pub min_requests: u64,
}

impl AutotuneConfig {
    /// How much one move changes the rate: `step` × `ceiling`, at least 1.
    pub fn step_users(&self) -> u64 {
        ((self.step * self.ceiling as f64).round() as u64).max(1)
    }
}

impl RoomConfig {
    /// The store's view of this room.
    pub fn policy(&self) -> RoomPolicy {
        RoomPolicy {
            room: Arc::from(self.id.as_str()),
            total_active_users: self.total_active_users,
            new_users_per_minute: self.new_users_per_minute,
            session_duration_ms: self.session_duration.as_millis() as u64,
            session_renewal: self.session_renewal,
            method: self.queueing_method,
            max_queue_length: self.max_queue_length,
            abandon_after_ms: self.abandon_after.as_millis() as u64,
            arrival_grace_ms: self.refresh_interval.as_millis() as u64 * 2,
            state: self.state,
            revision: 0,
            lanes: Lanes::with_shares(&self.lanes.iter().map(|l| l.share).collect::<Vec<_>>())
                .only_until(self.lanes_only_until_ms),
        }
    }

    /// How often an admitted visitor's session is renewed in the store
    /// while the config file's session duration is in force (see
    /// [`RoomPolicy::check_in_interval_ms`]).
    pub fn check_in_interval(&self) -> Duration {
        Duration::from_millis(self.policy().check_in_interval_ms())
    }
}

/// A `[[room.event]]`: its schedule and settings, and the page shown from
/// its prequeue to its end (`None`: the room's).
#[derive(Clone, Debug)]
pub struct EventConfig {
    /// The schedule and the settings it changes.
    pub spec: crate::domain::EventSpec,
    /// `template`: the event's queue page template; `None`: the room's.
    pub template: Option<PathBuf>,
}
