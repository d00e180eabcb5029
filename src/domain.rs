//! The words the whole daemon speaks about rooms and visitors: a visitor's
//! id, a room's policy, queueing method and state, an event, the
//! operators' runtime changes, notices to the people waiting, and why a
//! visitor is turned away. Config,
//! tickets, pages, the proxy and the store share them; this module depends
//! on nothing of the crate but the clock.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::clock::Millis;

/// A visitor's random, opaque identity (128 bits).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VisitorId(pub [u8; 16]);

impl VisitorId {
    /// A fresh id from the thread's CSPRNG.
    pub fn random() -> Self {
        Self(rand::random())
    }

    /// Lower-case hex, 32 characters (what the origin sees and Redis stores).
    pub fn to_hex(&self) -> String {
        String::from_utf8_lossy(&self.hex()).into_owned()
    }

    /// The hex digits without an allocation (this runs on every proxied request).
    pub fn hex(&self) -> [u8; 32] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, b) in self.0.iter().enumerate() {
            out[2 * i] = DIGITS[usize::from(b >> 4)];
            out[2 * i + 1] = DIGITS[usize::from(b & 0xF)];
        }
        out
    }

    /// Parses 32 hex digits (either case); `None` for anything else.
    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 32 || !s.is_ascii() {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Self(out))
    }
}

impl fmt::Display for VisitorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for VisitorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VisitorId({})", self.to_hex())
    }
}

/// How a room lets waiting visitors in (docs/configuration.md,
/// `room.queueing_method`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueingMethod {
    /// Waiting visitors are admitted in arrival order.
    Fifo,
    /// When room frees up, a random waiting visitor is admitted (a lottery).
    Random,
    /// No queue: everyone is admitted, the limits are only counted.
    Passthrough,
    /// No queue: over the limits, new visitors are rejected.
    Reject,
}

/// A room's runtime state (docs/operating.md, "Room states").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoomState {
    /// Normal operation.
    Open,
    /// Every new visitor joins the queue, even when there is room; the queue
    /// is admitted as capacity allows.
    QueueAll,
    /// Nobody is admitted; new visitors queue and the queue keeps its order.
    Paused,
    /// Sold out: no new tickets, queued visitors are told the room is closed.
    /// Active sessions continue.
    Closed,
}

/// Everything a store needs to know about a room to decide for it.
#[derive(Clone, Debug, PartialEq)]
pub struct RoomPolicy {
    /// The room id; also the Redis hash tag.
    pub room: Arc<str>,
    /// Most concurrently active sessions; 0 = unlimited.
    pub total_active_users: u64,
    /// Most admissions in any 60 s window; 0 = unlimited.
    pub new_users_per_minute: u64,
    /// How long a session lives after admission / after its last check-in.
    pub session_duration_ms: Millis,
    /// Whether a check-in extends the session (sliding) or not (fixed).
    pub session_renewal: bool,
    /// How waiting visitors are let in.
    pub method: QueueingMethod,
    /// Most visitors waiting; beyond it new visitors are rejected. 0 = unbounded.
    pub max_queue_length: u64,
    /// A queued visitor who has not polled for this long is dropped.
    pub abandon_after_ms: Millis,
    /// Extra session time given to a visitor promoted from the queue, so the
    /// session does not run out before the visitor's next poll collects it.
    pub arrival_grace_ms: Millis,
    /// Whether the room admits, queues everyone, or is paused or closed.
    pub state: RoomState,
    /// The revision of the operators' runtime changes this policy reflects
    /// (0: none). A store that holds a newer one refuses to decide on this
    /// policy (`StoreError::Stale` in `store`): the caller reads the new changes
    /// and asks again.
    pub revision: u64,
    /// The room's priority lanes (none by default).
    pub lanes: Lanes,
}

/// Most priority lanes a room may have beside its general queue.
pub const MAX_LANES: usize = 4;

/// A room's priority lanes as the store sees them: lane 0 is the general
/// queue, lanes `1..=count` the configured ones, in the order configured.
/// Each lane's share of admissions while several lanes wait is in
/// thousandths; a share of 0 (the general queue when the lanes' shares
/// add up to 1) is served only while no lane with a share waits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lanes {
    /// Configured lanes, 0 to [`MAX_LANES`].
    pub count: u8,
    /// Each lane's share in thousandths, indexed by lane (0: the general queue).
    pub shares: [u16; MAX_LANES + 1],
    /// A presale window: before this time (ms since the epoch) only the
    /// configured lanes are let in, and the general queue waits even while
    /// the room has room; from it the shares apply. 0: no window.
    pub only_until_ms: Millis,
}

impl Lanes {
    /// No lanes: everyone waits in the general queue.
    pub const NONE: Lanes = Lanes {
        count: 0,
        shares: [0; MAX_LANES + 1],
        only_until_ms: 0,
    };

    /// Lanes with these shares (thousandths, at most [`MAX_LANES`] of them,
    /// adding up to at most 1000); the general queue gets what is left.
    pub fn with_shares(shares: &[u16]) -> Lanes {
        let mut lanes = Lanes::NONE;
        let n = shares.len().min(MAX_LANES);
        lanes.count = n as u8;
        lanes.shares[1..=n].copy_from_slice(&shares[..n]);
        let taken: u32 = shares[..n].iter().map(|&s| u32::from(s)).sum();
        lanes.shares[0] = 1000u32.saturating_sub(taken) as u16;
        lanes
    }

    /// Whether the room has any.
    pub fn any(&self) -> bool {
        self.count > 0
    }

    /// The same lanes with a presale window until `until_ms` (0: none).
    pub fn only_until(self, until_ms: Millis) -> Lanes {
        Lanes {
            only_until_ms: until_ms,
            ..self
        }
    }

    /// Whether the general queue is held at `now_ms`: the room has lanes
    /// and its presale window has not ended, so nobody from the general
    /// queue is admitted, whatever room there is.
    pub fn general_held(&self, now_ms: Millis) -> bool {
        self.any() && now_ms < self.only_until_ms
    }
}

/// A short digest of a secret a visitor brings (a lane code, a token's
/// `sub` or `jti`): the first 64 bits of its SHA-256, as the store notes
/// them and the configuration keeps them.
pub fn digest64(text: &str) -> u64 {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(text.as_bytes());
    u64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

/// Shortest check-in interval (see [`RoomPolicy::check_in_interval_ms`]).
pub const MIN_CHECK_IN_MS: Millis = 1_000;

/// Longest check-in interval.
pub(crate) const MAX_CHECK_IN_MS: Millis = 60_000;

impl RoomPolicy {
    /// How often an admitted visitor's session is renewed in the store
    /// under this policy: a quarter of the session, at most 60 s, at least
    /// 1 s. It follows the session duration in force (the file's, an
    /// event's or an operator's), so a ticket always checks in before the
    /// session it carries runs out.
    pub fn check_in_interval_ms(&self) -> Millis {
        (self.session_duration_ms / 4).clamp(MIN_CHECK_IN_MS, MAX_CHECK_IN_MS)
    }
}

/// Why a visitor was turned away.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectReason {
    /// The room is `closed`.
    Closed,
    /// `max_queue_length` visitors are already waiting.
    QueueFull,
    /// `reject` method and over the limits.
    OverLimit,
}

/// Runtime changes an operator made to a room through the admin API. Kept in
/// the store so every instance applies them and they survive restarts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoomOverrides {
    /// Limits, session and method (stored flat: `lua/frontier.lua` reads
    /// `new_users_per_minute` and `queueing_method` at the top level).
    #[serde(flatten)]
    pub settings: Settings,
    /// The room state an operator set; `None`: the config file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<RoomState>,
    /// Fingerprint of the room's configuration when the changes were made:
    /// once the config file changes the room, the file wins again.
    pub config_fingerprint: u64,
    /// Counts the changes (1 for the first): an instance never replaces the
    /// overrides it applied with an older revision it read before them.
    #[serde(default)]
    pub revision: u64,
    /// The room's events as the operator changed them through the admin
    /// API (they replace the config file's list); `None`: the file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<EventSpec>>,
    /// The operator's notice to the people waiting (`None`: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<Notice>,
    /// Items left to sell, as the origin (`X-Waitroom-Stock`) or an
    /// operator last said (`None`: not counted). It caps active sessions
    /// (see [`cap_by_stock`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stock: Option<u64>,
    /// Autotune's last move (`[room.autotune]`): the rate it set in
    /// `settings.new_users_per_minute`, when and why. Instances step only
    /// once this is older than the interval, so one move per interval
    /// holds across them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autotune: Option<AutotuneMove>,
}

/// One move of a room's rate by autotune.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutotuneMove {
    /// The rate set (new users per minute).
    pub rate: u64,
    /// When (store time, ms).
    pub at_ms: Millis,
    /// Why, for people: "origin slow: 7% of requests over 2s".
    pub reason: String,
}

/// Largest stock taken (from the origin or the admin API); a larger
/// value is refused as a mistake.
pub const MAX_STOCK: u64 = 1_000_000_000;

/// Lowers `policy`'s capacity to the sessions `stock` items are worth,
/// ⌈stock × `sessions_per_item`⌉, never raising it (a room without a
/// capacity limit gets this one). No stock left pauses an open room:
/// nobody is admitted, newcomers queue behind the people waiting, the
/// queue keeps its order and the active sessions run their course
/// (docs/operating.md, "Stock").
pub fn cap_by_stock(policy: &mut RoomPolicy, stock: u64, sessions_per_item: f64) {
    let worth = (stock as f64 * sessions_per_item).ceil();
    // Past u64, `as` saturates; any such cap is no cap at all.
    let cap = worth as u64;
    if cap == 0 {
        if matches!(policy.state, RoomState::Open | RoomState::QueueAll) {
            policy.state = RoomState::Paused;
        }
        return;
    }
    if policy.total_active_users == 0 || cap < policy.total_active_users {
        policy.total_active_users = cap;
    }
}

/// Longest notice text, in characters (each language's too).
pub const MAX_NOTICE_CHARS: usize = 500;

/// Most translations a notice carries (besides its default text).
pub const MAX_NOTICE_LANGUAGES: usize = 16;

/// A short message to the people waiting in a room (docs/operating.md,
/// "Notices"): the operator's, set through the admin API and kept with
/// the overrides, or an event's while it is in force. Shown as text,
/// never as markup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    /// The text for every language without its own.
    pub text: String,
    /// The text per language code (`de`, `fr`, ...).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub texts: std::collections::BTreeMap<String, String>,
    /// How it is shown (`info` unless said).
    #[serde(default)]
    pub level: NoticeLevel,
    /// Shown until then (ms since the epoch); `None`: until cleared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<Millis>,
}

/// How a notice is shown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeLevel {
    /// News: shown plainly.
    #[default]
    Info,
    /// Something that changes the wait or the sale: shown to stand out.
    Warning,
}

impl Notice {
    /// A plain notice: one text, `info`, no expiry (an event's from the config file).
    pub fn plain(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            texts: Default::default(),
            level: NoticeLevel::Info,
            expires_ms: None,
        }
    }

    /// Whether it is shown at `now`.
    pub fn shown_at(&self, now: Millis) -> bool {
        self.expires_ms.is_none_or(|e| now < e)
    }

    /// The text in the language with this code, else the default text.
    pub fn text_in(&self, code: &str) -> &str {
        self.texts.get(code).map_or(&self.text, String::as_str)
    }

    /// Refuses a blank or too long text and too many languages, naming
    /// the field (`notice.text`, `notice.texts.de`).
    pub fn check_bounds(&self) -> Result<(), String> {
        check_notice_text(&self.text).map_err(|why| format!("notice.text: {why}"))?;
        if self.texts.len() > MAX_NOTICE_LANGUAGES {
            return Err(format!(
                "notice.texts: at most {MAX_NOTICE_LANGUAGES} languages, got {}",
                self.texts.len()
            ));
        }
        for (code, text) in &self.texts {
            check_notice_text(text).map_err(|why| format!("notice.texts.{code}: {why}"))?;
        }
        Ok(())
    }
}

/// Why a notice text is refused: blank, or over [`MAX_NOTICE_CHARS`]
/// characters.
pub fn check_notice_text(text: &str) -> Result<(), String> {
    if text.trim().is_empty() {
        return Err("must not be blank".into());
    }
    let chars = text.chars().count();
    if chars > MAX_NOTICE_CHARS {
        return Err(format!(
            "at most {MAX_NOTICE_CHARS} characters, got {chars}"
        ));
    }
    Ok(())
}

/// A scheduled period with its own settings (docs/how-it-works.md, "Timed
/// drops"), as the config file gives it or the admin API stores it. Times
/// in ms since the Unix epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventSpec {
    /// The event's name, shown on its pages and in the admin API.
    pub name: String,
    /// From here to `start` every visitor gets a queue ticket and waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prequeue_start_ms: Option<Millis>,
    /// When its settings take effect.
    pub start_ms: Millis,
    /// When the room's own settings return.
    pub end_ms: Millis,
    /// At `start`, put the prequeue in a random order.
    #[serde(default)]
    pub shuffle_at_start: bool,
    /// A presale window at the event's start: for this long from `start`
    /// only lane places are let in, then the shares apply (the policy's
    /// `lanes.only_until_ms` is `start` + this while the event runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lanes_only_for_ms: Option<Millis>,
    /// What the event changes from its start to its end.
    #[serde(flatten)]
    pub settings: Settings,
    /// Shown to the people waiting from its prequeue to its end, unless
    /// the operator's own notice is shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<Notice>,
}

/// Room settings an event or an operator changes (`None`: unchanged).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// Most concurrent sessions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_active_users: Option<u64>,
    /// Most admissions in any 60 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_users_per_minute: Option<u64>,
    /// Session length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_duration_ms: Option<Millis>,
    /// Whether a check-in extends the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_renewal: Option<bool>,
    /// How waiting visitors are let in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queueing_method: Option<QueueingMethod>,
}

impl Settings {
    /// Takes what `change` sets; keeps the rest.
    pub fn update(&mut self, change: &Settings) {
        self.total_active_users = change.total_active_users.or(self.total_active_users);
        self.new_users_per_minute = change.new_users_per_minute.or(self.new_users_per_minute);
        self.session_duration_ms = change.session_duration_ms.or(self.session_duration_ms);
        self.session_renewal = change.session_renewal.or(self.session_renewal);
        self.queueing_method = change.queueing_method.or(self.queueing_method);
    }

    /// `policy` with these changes.
    pub fn apply(&self, policy: &mut RoomPolicy) {
        if let Some(v) = self.total_active_users {
            policy.total_active_users = v;
        }
        if let Some(v) = self.new_users_per_minute {
            policy.new_users_per_minute = v;
        }
        if let Some(v) = self.session_duration_ms {
            policy.session_duration_ms = v;
        }
        if let Some(v) = self.session_renewal {
            policy.session_renewal = v;
        }
        if let Some(v) = self.queueing_method {
            policy.method = v;
        }
    }
}

impl EventSpec {
    /// When the event begins to matter: its prequeue, or its start.
    pub fn opens_ms(&self) -> Millis {
        self.prequeue_start_ms
            .unwrap_or(self.start_ms)
            .min(self.start_ms)
    }

    /// Whether two events' periods (prequeue included) overlap.
    pub fn overlaps(&self, other: &EventSpec) -> bool {
        self.opens_ms() < other.end_ms && other.opens_ms() < self.end_ms
    }
}

impl RoomOverrides {
    /// `base` with these changes applied.
    pub fn apply(&self, base: &RoomPolicy) -> RoomPolicy {
        let mut p = base.clone();
        self.settings.apply(&mut p);
        p.revision = self.revision;
        if let Some(v) = self.state {
            p.state = v;
        }
        p
    }
}

/// A proof-of-work challenge as handed to a visitor (`gate::proof`
/// issues and checks them; the page and the status JSON show them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    /// The text to hash, `.` and a counter appended.
    pub text: String,
    /// Leading zero bits the hash must have.
    pub bits: u8,
    /// Until when a solution is taken.
    pub expires_ms: Millis,
}

/// The cookie the page's script returns a solution in. `.` cannot be in a
/// room id, so no room's ticket cookie has this name; the `waitroom_`
/// prefix keeps it from the origin like every cookie of ours.
pub const PROOF_COOKIE: &str = "waitroom_.proof";

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(total_active_users: u64, state: RoomState) -> RoomPolicy {
        RoomPolicy {
            room: Arc::from("shop"),
            total_active_users,
            new_users_per_minute: 0,
            session_duration_ms: 60_000,
            session_renewal: true,
            method: QueueingMethod::Fifo,
            max_queue_length: 0,
            abandon_after_ms: 60_000,
            arrival_grace_ms: 10_000,
            state,
            revision: 0,
            lanes: Lanes::NONE,
        }
    }

    fn capped(limit: u64, state: RoomState, stock: u64, per_item: f64) -> (u64, RoomState) {
        let mut p = policy(limit, state);
        cap_by_stock(&mut p, stock, per_item);
        (p.total_active_users, p.state)
    }

    #[test]
    fn the_stock_only_ever_lowers_the_limit() {
        use RoomState::*;
        assert_eq!(capped(10, Open, 3, 1.0), (3, Open));
        assert_eq!(capped(10, Open, 50, 1.0), (10, Open), "never raised");
        assert_eq!(capped(0, Open, 4, 1.0), (4, Open), "no limit: the stock's");
        assert_eq!(capped(10, Open, 3, 1.5), (5, Open), "rounded up");
        assert_eq!(
            capped(10, Open, 1, 0.01),
            (1, Open),
            "an item is worth one at least"
        );
        assert_eq!(capped(0, Open, MAX_STOCK, 1000.0), (MAX_STOCK * 1000, Open));
    }

    #[test]
    fn no_stock_pauses_an_open_room_and_leaves_a_closed_one_closed() {
        use RoomState::*;
        assert_eq!(capped(10, Open, 0, 1.0), (10, Paused));
        assert_eq!(capped(10, QueueAll, 0, 2.0), (10, Paused));
        assert_eq!(capped(10, Paused, 0, 1.0), (10, Paused));
        assert_eq!(capped(10, Closed, 0, 1.0), (10, Closed));
    }
}
