//! Webhooks (`[[webhook]]`, docs/webhooks.md): room-level happenings
//! POSTed as signed JSON to the operator's URLs, retried with back-off,
//! through a bounded buffer per webhook that never blocks the caller.
//!
//! The gate calls [`Webhooks::emit`] where it sees a happening (a state
//! change, a sold-out room…), with an id that is the same on every
//! instance for one happening, and [`Webhooks::emit_admissions`] /
//! [`Webhooks::emit_revokes`] for what is counted per visitor: those are
//! folded per room and sent as one happening every `batch`. None of them
//! awaits: each webhook's queue takes the happening or, full, drops it and
//! counts the drop ([`Figures::dropped`]). One task per webhook delivers
//! its queue in order, one delivery at a time (`deliver`); another folds
//! and sends its batches (`batch`). The signature is `sign`'s; the
//! figures of each webhook are [`Webhooks::figures`], and Prometheus
//! families through [`Webhooks::metrics`]. [`Webhooks::reload`] puts a
//! reloaded configuration in force for every clone.

mod batch;
mod deliver;
mod metrics;
mod sign;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use arc_swap::ArcSwap;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::{Millis, SharedClock};
use crate::secret::Secret;

pub use deliver::{DELIVERY_HEADER, KIND_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER};
pub use metrics::Metrics;
pub use sign::{sign, verify};

/// `webhook.timeout` when left out: the longest one attempt may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// `webhook.max_attempts` when left out.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 8;
/// `webhook.buffer` when left out: happenings waiting for delivery.
pub const DEFAULT_BUFFER: usize = 10_000;
/// `webhook.batch` when left out: how often admissions and revokes are sent.
pub const DEFAULT_BATCH: Duration = Duration::from_secs(10);
/// Most visitors one `revokes` happening names; a batch that reaches it
/// is sent at once and a new one begun.
pub const MAX_REVOKES_PER_BATCH: usize = 10_000;

/// What a happening is about. Its snake_case name is the payload's
/// `kind`, the `X-Waitroom-Kind` header and what `webhook.events` lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A room's state changed (`{"from", "to"}`).
    StateChanged,
    /// `total_active_users` or `new_users_per_minute` changed
    /// (`{"field", "from", "to"}`).
    LimitChanged,
    /// An event entered a phase (`{"event", "phase"}`: `prequeue`,
    /// `started`, `ended`).
    EventPhase,
    /// The waiting visitors were shuffled at an event's start
    /// (`{"event", "visitors"}`).
    Shuffled,
    /// The room sold out (`{}`).
    SoldOut,
    /// The stock left changed (`{"from", "to"}`).
    StockChanged,
    /// Visitors began to wait (`{"queued"}`).
    QueueFormed,
    /// Nobody waits any more (`{}`).
    QueueDrained,
    /// Autotune moved the rate (`{"from", "to", "reason"}`).
    AutotuneMoved,
    /// The notice to waiting visitors changed (`{"text"}`, null when removed).
    NoticeChanged,
    /// Visitors let in since the last batch (`{"count", "from", "to"}`).
    Admissions,
    /// Sessions revoked since the last batch (`{"visitors", "from", "to"}`).
    Revokes,
    /// A manual ping ([`Webhooks::ping`]); every webhook gets it, whatever
    /// its `events` and `rooms`.
    Test,
}

impl Kind {
    /// Every kind, in the order docs/webhooks.md lists them.
    pub const ALL: [Kind; 13] = [
        Kind::StateChanged,
        Kind::LimitChanged,
        Kind::EventPhase,
        Kind::Shuffled,
        Kind::SoldOut,
        Kind::StockChanged,
        Kind::QueueFormed,
        Kind::QueueDrained,
        Kind::AutotuneMoved,
        Kind::NoticeChanged,
        Kind::Admissions,
        Kind::Revokes,
        Kind::Test,
    ];

    /// The kind's name, as `webhook.events` and the payload write it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::StateChanged => "state_changed",
            Kind::LimitChanged => "limit_changed",
            Kind::EventPhase => "event_phase",
            Kind::Shuffled => "shuffled",
            Kind::SoldOut => "sold_out",
            Kind::StockChanged => "stock_changed",
            Kind::QueueFormed => "queue_formed",
            Kind::QueueDrained => "queue_drained",
            Kind::AutotuneMoved => "autotune_moved",
            Kind::NoticeChanged => "notice_changed",
            Kind::Admissions => "admissions",
            Kind::Revokes => "revokes",
            Kind::Test => "test",
        }
    }

    /// The kind named `name`, if any.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// `[[webhook]]`: where happenings are sent, which ones, and the limits
/// of their delivery.
#[derive(Clone, Debug, PartialEq)]
pub struct WebhookConfig {
    /// `url`: `http://` or `https://`, without user or password.
    pub url: http::Uri,
    /// `secret` (or the variable `secret_env` names): the signing key, at
    /// least 16 bytes.
    pub secret: Secret,
    /// `events`: the kinds sent (every kind when left out).
    pub events: Vec<Kind>,
    /// `rooms`: the rooms whose happenings are sent; `None`: every room.
    pub rooms: Option<Vec<String>>,
    /// `timeout`: the longest one attempt may take (100ms to 60s).
    pub timeout: Duration,
    /// `max_attempts`: attempts before a delivery is given up (1 to 20).
    pub max_attempts: u32,
    /// `buffer`: happenings waiting for delivery; more are dropped and
    /// counted (1 to 1,000,000).
    pub buffer: usize,
    /// `batch`: how often admissions and revokes are sent (1s to 5m).
    pub batch: Duration,
}

impl WebhookConfig {
    /// A webhook to `url` signed with `secret`, for every kind and room,
    /// with the default limits.
    pub fn new(url: http::Uri, secret: Secret) -> Self {
        WebhookConfig {
            url,
            secret,
            events: Kind::ALL.to_vec(),
            rooms: None,
            timeout: DEFAULT_TIMEOUT,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            buffer: DEFAULT_BUFFER,
            batch: DEFAULT_BATCH,
        }
    }
}

/// One thing that happened to a room, as sent.
#[derive(Clone, Debug, PartialEq)]
pub struct Happening {
    /// The same on every instance for one happening (the receiver
    /// dedupes on it: `X-Waitroom-Delivery`); retries keep it.
    pub id: String,
    /// What happened.
    pub kind: Kind,
    /// The room's id (empty for [`Kind::Test`]).
    pub room: String,
    /// When it happened (ms since the epoch, the daemon's clock).
    pub at_ms: Millis,
    /// The kind's fields (docs/webhooks.md, "Kinds").
    pub data: serde_json::Value,
}

impl Happening {
    /// The JSON body sent: `{"id", "kind", "room", "at", "data"}`, `at`
    /// in RFC 3339 (UTC, milliseconds).
    pub fn body(&self) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct Payload<'a> {
            id: &'a str,
            kind: Kind,
            room: &'a str,
            at: String,
            data: &'a serde_json::Value,
        }
        let payload = Payload {
            id: &self.id,
            kind: self.kind,
            room: &self.room,
            at: rfc3339(self.at_ms),
            data: &self.data,
        };
        serde_json::to_vec(&payload).expect("a JSON value and strings serialize")
    }
}

/// `at_ms` as RFC 3339, UTC, with milliseconds.
pub(crate) fn rfc3339(at_ms: Millis) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(at_ms)).to_string()
}

/// One webhook's figures since start, for metrics and the dashboard.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    /// The webhook's URL.
    pub url: String,
    /// Happenings delivered (a 2xx answer).
    pub sent: u64,
    /// Happenings given up: a 4xx (other than 408 and 429) or another
    /// non-2xx that is not retried, or every attempt failed.
    pub failed: u64,
    /// Happenings never attempted to the end: the buffer was full, or the
    /// daemon stopped before their turn (or during their back-off).
    pub dropped: u64,
    /// Attempts after the first (each retry once).
    pub retried: u64,
    /// Happenings waiting in the buffer now.
    pub queued: u64,
}

/// How the delivery tasks wait; the defaults are the daemon's, tests
/// shorten them.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// The first back-off; each retry doubles it (±20%).
    pub backoff_base: Duration,
    /// The longest back-off, and the most of a `Retry-After` honoured.
    pub backoff_cap: Duration,
    /// How long what is buffered may still be delivered once stopping.
    pub grace: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(5 * 60),
            grace: Duration::from_secs(2),
        }
    }
}

/// A webhook's counters, shared by its emitters and its tasks, and kept
/// across a reload that changes the webhook's settings but not its URL.
#[derive(Default)]
struct Counts {
    sent: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
    retried: AtomicU64,
}

impl Counts {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// What every webhook's tasks share: the clock, the ids of batches and
/// the waits.
struct Common {
    clock: SharedClock,
    /// Random at start: batch ids name the instance that counted them.
    instance: u64,
    /// The sequence of batch (and ping) ids on this instance.
    seq: AtomicU64,
    options: Options,
}

impl Common {
    /// `"<kind>:<room>:<instance>:<sequence>"`, for happenings that occur
    /// on one instance only.
    fn local_id(&self, kind: Kind, room: &str) -> String {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        format!("{}:{room}:{:016x}:{seq}", kind.name(), self.instance)
    }
}

/// One configured webhook: its filter, its queue's sending end, its
/// batches and counters, and the stop signal of its tasks.
struct Hook {
    config: WebhookConfig,
    url: String,
    /// The kinds it takes, one bit each.
    kinds: u16,
    tx: mpsc::Sender<Arc<Happening>>,
    counts: Arc<Counts>,
    /// Admissions and revokes not yet sent, by room.
    pending: Mutex<HashMap<String, batch::Pending>>,
    stop: CancellationToken,
    /// When stopping, the end of the grace (set before `stop` fires).
    deadline: OnceLock<tokio::time::Instant>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Hook {
    /// The webhook of `config` (with `counts`, carried over from an
    /// earlier one to the same URL), its tasks spawned.
    fn start(
        config: &WebhookConfig,
        counts: Arc<Counts>,
        client: &deliver::HttpClient,
        common: &Arc<Common>,
    ) -> Arc<Hook> {
        let (tx, rx) = mpsc::channel(config.buffer.max(1));
        let hook = Arc::new(Hook {
            url: config.url.to_string(),
            kinds: config.events.iter().fold(0, |m, k| m | k.bit()),
            config: config.clone(),
            tx,
            counts,
            pending: Mutex::default(),
            stop: CancellationToken::new(),
            deadline: OnceLock::new(),
            tasks: Mutex::default(),
        });
        let mut tasks = vec![tokio::spawn(deliver::run(
            rx,
            Arc::clone(&hook),
            client.clone(),
            Arc::clone(common),
        ))];
        if hook.wants_batches() {
            tasks.push(tokio::spawn(batch::run(
                Arc::clone(&hook),
                Arc::clone(common),
            )));
        }
        *lock(&hook.tasks) = tasks;
        hook
    }

    fn wants(&self, kind: Kind, room: &str) -> bool {
        kind == Kind::Test
            || (self.kinds & kind.bit() != 0
                && self
                    .config
                    .rooms
                    .as_ref()
                    .is_none_or(|rooms| rooms.iter().any(|r| r == room)))
    }

    /// Queues `h` if there is room; counts it dropped otherwise. Never waits.
    fn offer(&self, h: Arc<Happening>) {
        if self.tx.try_send(h).is_err() {
            Counts::add(&self.counts.dropped, 1);
        }
    }

    fn figures(&self) -> Figures {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Figures {
            url: self.url.clone(),
            sent: get(&self.counts.sent),
            failed: get(&self.counts.failed),
            dropped: get(&self.counts.dropped),
            retried: get(&self.counts.retried),
            queued: (self.tx.max_capacity() - self.tx.capacity()) as u64,
        }
    }

    /// Sends the batches to the queue, sets the deadline `grace` from
    /// now, then tells the tasks (once).
    fn stop(&self, common: &Common, grace: Duration) {
        if self.stop.is_cancelled() {
            return;
        }
        self.flush(common);
        let _ = self.deadline.set(tokio::time::Instant::now() + grace);
        self.stop.cancel();
    }

    /// Whether stopping and past the grace.
    fn past(&self) -> bool {
        self.deadline
            .get()
            .is_some_and(|at| tokio::time::Instant::now() >= *at)
    }

    /// Resolves once stopping and past the grace.
    async fn past_deadline(&self) {
        self.stop.cancelled().await;
        if let Some(at) = self.deadline.get() {
            tokio::time::sleep_until(*at).await;
        }
    }

    fn finished(&self) -> bool {
        lock(&self.tasks).iter().all(JoinHandle::is_finished)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The configured webhooks and their delivery tasks. Cheap to clone (the
/// clones share everything, a reload included); when the last clone is
/// dropped, delivery stops as [`Webhooks::shutdown`] stops it, unawaited.
/// The tasks run on the tokio runtime it was built (or reloaded) on, which
/// should outlive it; the calls that hand happenings over may come from
/// any thread or runtime.
#[derive(Clone)]
pub struct Webhooks {
    inner: Arc<Inner>,
}

struct Inner {
    /// The webhooks in force, in the order configured.
    hooks: Arc<ArcSwap<Vec<Arc<Hook>>>>,
    /// Webhooks a reload removed, delivering what they hold within the grace.
    retired: Mutex<Vec<Arc<Hook>>>,
    common: Arc<Common>,
    client: OnceLock<deliver::HttpClient>,
    /// Reloads one at a time.
    reloading: Mutex<()>,
}

impl Default for Webhooks {
    /// No webhook (until a reload brings some), on the system clock.
    fn default() -> Self {
        Webhooks::new(&[], Arc::new(crate::clock::SystemClock))
    }
}

impl Webhooks {
    /// The webhooks of `configs`, their tasks spawned on the current
    /// tokio runtime (call it within one when `configs` is not empty).
    /// `clock` dates the happenings and signs with its time.
    pub fn new(configs: &[WebhookConfig], clock: SharedClock) -> Self {
        Self::with_options(configs, clock, Options::default())
    }

    /// As [`Webhooks::new`], with the back-off and grace of `options`.
    pub fn with_options(configs: &[WebhookConfig], clock: SharedClock, options: Options) -> Self {
        let inner = Inner {
            hooks: Arc::default(),
            retired: Mutex::default(),
            common: Arc::new(Common {
                clock,
                instance: rand::random(),
                seq: AtomicU64::new(0),
                options,
            }),
            client: OnceLock::new(),
            reloading: Mutex::default(),
        };
        let hooks = Webhooks {
            inner: Arc::new(inner),
        };
        hooks.reload(configs);
        hooks
    }

    /// Puts `configs` in force (a config reload), on the current tokio
    /// runtime. A webhook configured exactly as before keeps its queue,
    /// batches and tasks; one whose settings changed starts anew with its
    /// counters; one removed stops as at [`Webhooks::shutdown`], its
    /// queue delivered within the grace.
    pub fn reload(&self, configs: &[WebhookConfig]) {
        let inner = &self.inner;
        let _one = lock(&inner.reloading);
        let old = inner.hooks.load_full();
        let mut hooks = Vec::with_capacity(configs.len());
        for config in configs {
            let same = old.iter().find(|h| h.config == *config);
            let hook = match same {
                Some(hook) => Arc::clone(hook),
                None => {
                    let counts = old
                        .iter()
                        .find(|h| h.config.url == config.url)
                        .map_or_else(Arc::default, |h| Arc::clone(&h.counts));
                    let client = inner.client.get_or_init(deliver::client);
                    Hook::start(config, counts, client, &inner.common)
                }
            };
            hooks.push(hook);
        }
        let mut retired = lock(&inner.retired);
        retired.retain(|h| !h.finished());
        for hook in old.iter() {
            if !hooks.iter().any(|h| Arc::ptr_eq(h, hook)) {
                hook.stop(&inner.common, inner.common.options.grace);
                retired.push(Arc::clone(hook));
            }
        }
        inner.hooks.store(Arc::new(hooks));
    }

    /// Whether no webhook is configured.
    pub fn is_empty(&self) -> bool {
        self.inner.hooks.load().is_empty()
    }

    /// This instance's id in batch ids (random at start).
    pub fn instance_id(&self) -> u64 {
        self.inner.common.instance
    }

    /// Whether some webhook takes happenings of `kind` in `room`: when
    /// none does, the caller need not build the happening (nor claim it
    /// across instances).
    pub fn wants(&self, kind: Kind, room: &str) -> bool {
        self.inner.hooks.load().iter().any(|h| h.wants(kind, room))
    }

    /// A happening of `kind` in `room` dated now by the clock, with
    /// `id`: the same on every instance for this happening (the caller
    /// derives it from what happened, e.g. the room, kind and the
    /// stored revision or time it happened at).
    pub fn happening(
        &self,
        id: impl Into<String>,
        kind: Kind,
        room: &str,
        data: serde_json::Value,
    ) -> Happening {
        Happening {
            id: id.into(),
            kind,
            room: room.to_owned(),
            at_ms: self.inner.common.clock.now_ms(),
            data,
        }
    }

    /// Queues `h` for every webhook whose `events` and `rooms` take it.
    /// Never waits: a full queue drops it and counts the drop.
    pub fn emit(&self, h: Happening) {
        let hooks = self.inner.hooks.load();
        let mut shared: Option<Arc<Happening>> = None;
        for hook in hooks.iter() {
            if hook.wants(h.kind, &h.room) {
                let h = shared.get_or_insert_with(|| Arc::new(h.clone()));
                hook.offer(Arc::clone(h));
            }
        }
    }

    /// Counts `count` visitors let in to `room`, sent with the others of
    /// the batch as one `admissions` happening. Never waits.
    pub fn emit_admissions(&self, room: &str, count: u64) {
        let hooks = self.inner.hooks.load();
        if count == 0 || hooks.is_empty() {
            return;
        }
        let now = self.inner.common.clock.now_ms();
        for hook in hooks.iter() {
            if hook.wants(Kind::Admissions, room) {
                hook.add_admissions(room, count, now);
            }
        }
    }

    /// Notes `visitors` revoked in `room`, sent with the others of the
    /// batch as one `revokes` happening (at once when the batch reaches
    /// [`MAX_REVOKES_PER_BATCH`]). Never waits.
    pub fn emit_revokes(&self, room: &str, visitors: &[String]) {
        let hooks = self.inner.hooks.load();
        if visitors.is_empty() || hooks.is_empty() {
            return;
        }
        let common = &self.inner.common;
        let now = common.clock.now_ms();
        for hook in hooks.iter() {
            if hook.wants(Kind::Revokes, room) {
                hook.add_revokes(room, visitors, now, common);
            }
        }
    }

    /// Sends a `test` happening to every webhook, whatever its `events`
    /// and `rooms`; returns its id (`None` when there is no webhook).
    pub fn ping(&self) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        let common = &self.inner.common;
        let h = Happening {
            id: common.local_id(Kind::Test, ""),
            kind: Kind::Test,
            room: String::new(),
            at_ms: common.clock.now_ms(),
            data: serde_json::json!({}),
        };
        let id = h.id.clone();
        self.emit(h);
        Some(id)
    }

    /// Each webhook's figures, in the order configured.
    pub fn figures(&self) -> Vec<Figures> {
        self.inner
            .hooks
            .load()
            .iter()
            .map(|h| h.figures())
            .collect()
    }

    /// Stops delivery: the batches are sent to the queues, then what is
    /// queued (and a delivery in back-off) may still be delivered within
    /// `grace`; the rest is counted dropped, as is whatever is emitted
    /// from now on. Resolves once every task has ended.
    pub async fn shutdown(&self, grace: Duration) {
        let inner = &self.inner;
        let hooks: Vec<Arc<Hook>> = {
            let _one = lock(&inner.reloading);
            let mut all = inner.hooks.load().to_vec();
            all.extend(lock(&inner.retired).drain(..));
            all
        };
        for hook in &hooks {
            hook.stop(&inner.common, grace);
        }
        for hook in &hooks {
            let tasks = std::mem::take(&mut *lock(&hook.tasks));
            for task in tasks {
                let _ = task.await;
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for hook in self.hooks.load().iter() {
            hook.stop(&self.common, self.common.options.grace);
        }
    }
}

impl std::fmt::Debug for Webhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.figures().iter().map(|fig| &fig.url))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_snake_case_name_both_ways() {
        for kind in Kind::ALL {
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                serde_json::json!(kind.name())
            );
            assert_eq!(Kind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(Kind::from_name("sold"), None);
        let bits = Kind::ALL.iter().fold(0u16, |m, k| m | k.bit());
        assert_eq!(bits.count_ones() as usize, Kind::ALL.len());
    }

    #[test]
    fn the_body_is_the_happening_with_its_time_in_rfc_3339() {
        let h = Happening {
            id: "state_changed:shop:42".into(),
            kind: Kind::StateChanged,
            room: "shop".into(),
            at_ms: 1_800_000_000_123,
            data: serde_json::json!({"from": "open", "to": "paused"}),
        };
        let body: serde_json::Value = serde_json::from_slice(&h.body()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "id": "state_changed:shop:42",
                "kind": "state_changed",
                "room": "shop",
                "at": "2027-01-15T08:00:00.123Z",
                "data": {"from": "open", "to": "paused"},
            })
        );
    }

    #[tokio::test]
    async fn no_webhook_makes_every_call_a_no_op() {
        let none = Webhooks::new(&[], Arc::new(crate::clock::ManualClock::new(0)));
        none.emit(Happening {
            id: "a".into(),
            kind: Kind::SoldOut,
            room: "shop".into(),
            at_ms: 0,
            data: serde_json::json!({}),
        });
        assert!(none.is_empty());
        none.emit_admissions("shop", 3);
        assert_eq!(none.ping(), None);
        assert!(none.figures().is_empty());
        none.shutdown(Duration::ZERO).await;
    }
}
