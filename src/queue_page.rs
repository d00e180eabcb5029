//! What a waiting visitor sees: the queue page (an operator-replaceable
//! template), the status JSON, and the daemon's own message pages
//! (rejected, closed, origin errors, store unavailable, slow down), each in
//! the visitor's language ([`crate::i18n`]).

use std::path::Path;
use std::sync::{Arc, LazyLock};

use minijinja::value::{Kwargs, Value};
use minijinja::{context, AutoEscape, Environment, HtmlEscape};
use serde::Serialize;

use crate::domain::{Notice, NoticeLevel};
use crate::i18n::{self, Lang};

/// The built-in queue page.
pub const DEFAULT_QUEUE_TEMPLATE: &str = include_str!("../static/queue.html");
/// The built-in page for every other message.
pub const MESSAGE_TEMPLATE: &str = include_str!("../static/message.html");
/// The proof-of-work page (its script solves the challenge).
pub const CHALLENGE_TEMPLATE: &str = include_str!("../static/challenge.html");
pub(crate) const CAPTCHA_TEMPLATE: &str = include_str!("../static/captcha.html");

/// An operator's queue page template that cannot be read or compiled.
#[derive(Debug, thiserror::Error)]
#[error("template {path}: {message}")]
pub struct TemplateError {
    pub(crate) path: String,
    pub(crate) message: String,
}

/// A compiled queue page template. Values are HTML-escaped.
#[derive(Clone)]
pub struct Template {
    env: Arc<Environment<'static>>,
}

impl Template {
    /// The built-in queue page.
    pub fn builtin() -> Self {
        Self::from_source("queue.html".into(), DEFAULT_QUEUE_TEMPLATE.into())
            .expect("the built-in template compiles")
    }

    /// Loads and compiles an operator's template, so a broken one is refused at start-up.
    pub(crate) fn load(path: &Path) -> Result<Self, TemplateError> {
        let fail = |message: String| TemplateError {
            path: path.display().to_string(),
            message,
        };
        let source = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        let template =
            Self::from_source("queue.html".into(), source).map_err(|e| fail(e.to_string()))?;
        // Render once with sample values so missing filters or bad syntax surface now.
        template
            .try_render(&QueueView::sample())
            .map_err(|e| fail(e.to_string()))?;
        Ok(template)
    }

    fn from_source(name: String, source: String) -> Result<Self, minijinja::Error> {
        let mut env = Environment::new();
        // Escape everything, whatever the template's file name.
        env.set_auto_escape_callback(|_| AutoEscape::Html);
        env.add_filter("fill", fill_filter);
        env.add_filter("count", count_filter);
        env.add_template_owned(name, source)?;
        Ok(Self { env: Arc::new(env) })
    }

    fn try_render(&self, view: &QueueView) -> Result<String, minijinja::Error> {
        // `t` is built once per language; the view's own fields come after.
        let ctx = minijinja::value::merge_maps([
            context! { t => view.language.strings().value() },
            Value::from_serialize(view),
        ]);
        self.env.get_template("queue.html")?.render(ctx)
    }

    /// The page for `view`; if the template fails, the built-in page (logged).
    pub fn render(&self, view: &QueueView) -> String {
        self.try_render(view).unwrap_or_else(|e| {
            tracing::error!(error = %e, "queue template failed; serving the built-in page");
            Template::builtin()
                .try_render(view)
                .unwrap_or_else(|_| "<!doctype html><title>Waiting room</title><p>You are in the queue. This page refreshes itself.</p>".into())
        })
    }
}

/// The `state` field of the status JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VisitorState {
    /// No ticket (or one whose place was ended): loading the room's page
    /// hands out a new one.
    None,
    /// Waiting in the queue.
    Queued,
    /// Let in: loading the room's page goes through.
    Admitted,
    /// Waiting for an event's start; places are handed out then.
    Prequeue,
    /// The room is closed.
    Closed,
    /// Turned away (a full queue, or over the limits with `reject`).
    Rejected,
    /// A proof of work must come first (`challenge` says which).
    Challenge,
}

/// `GET /__waitroom/status` and `Accept: application/json` answers
/// (docs/how-it-works.md, "The queue page and the status API").
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Status {
    /// The room's id.
    pub room: String,
    /// Where the visitor stands.
    pub state: VisitorState,
    /// 1-based place in the queue (0: not queued, or a shuffled prequeue).
    pub position: u64,
    /// Visitors waiting.
    pub queue_length: u64,
    /// Estimated wait.
    pub eta_seconds: u64,
    /// When to poll again.
    pub refresh_seconds: u64,
    /// The event in force (from its prequeue to its end).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<EventInfo>,
    /// During the event's prequeue: seconds until it starts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub starts_in_seconds: Option<u64>,
    /// With `state: "challenge"`: the proof of work to hand in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub challenge: Option<ChallengeInfo>,
    /// With `state: "challenge"` in a room that asks a captcha: the
    /// provider's widget to show, and where its token goes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub captcha: Option<CaptchaInfo>,
    /// The priority lane a queued visitor waits in (absent: the general
    /// queue); its position and the queue's length count that lane.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lane: Option<String>,
    /// In the general queue during a presale window (`lanes_only_until`):
    /// when the general queue starts to move, as an RFC 3339 time. Until
    /// then only the lanes are let in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub general_from: Option<String>,
    /// Items of stock left, in a room that shows them (`show_stock`)
    /// while it counts its stock (the origin's `X-Waitroom-Stock` or the
    /// admin API's `stock`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stock_left: Option<u64>,
    /// The operator's (or the event's) notice, in the visitor's language.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notice: Option<NoticeInfo>,
}

/// The status JSON's `notice`, and the page's: a message to the people
/// waiting, as text (the page never takes it as markup).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NoticeInfo {
    /// The text, in the visitor's language where the notice has it.
    pub text: String,
    /// How it is shown.
    pub level: NoticeLevel,
    /// Until when it is shown, RFC 3339 (absent: until cleared).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
}

impl NoticeInfo {
    /// `notice` in the language `lang` gives (called only when the notice
    /// has translations, so a poll without them never reads `Accept-Language`).
    pub fn of(notice: &Notice, lang: impl FnOnce() -> Lang) -> Self {
        let text = if notice.texts.is_empty() {
            &notice.text
        } else {
            notice.text_in(lang().code())
        };
        Self {
            text: text.to_owned(),
            level: notice.level,
            expires: notice.expires_ms.map(rfc3339),
        }
    }
}

/// The status JSON's `captcha`: show the provider's widget with this site
/// key, then send its token in the `X-Waitroom-Captcha` header (or the
/// `waitroom_.captcha` cookie) with the next request for the room's page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CaptchaInfo {
    pub(crate) provider: &'static str,
    pub(crate) site_key: String,
    pub(crate) header: &'static str,
    pub(crate) cookie: &'static str,
}

impl CaptchaInfo {
    pub(crate) fn of(provider: &'static str, site_key: &str) -> Self {
        Self {
            provider,
            site_key: site_key.to_owned(),
            header: "X-Waitroom-Captcha",
            cookie: CAPTCHA_COOKIE,
        }
    }
}

/// The cookie the captcha page's callback returns the token in.
pub const CAPTCHA_COOKIE: &str = "waitroom_.captcha";

/// The status JSON's `challenge`: find a decimal `counter` such that
/// SHA-256(`value` + "." + counter) starts with `bits` zero bits, then
/// send `value.counter` in the `X-Waitroom-Proof` header (or the
/// `waitroom_.proof` cookie) with the next request for the room's page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChallengeInfo {
    pub(crate) value: String,
    pub(crate) bits: u8,
    pub(crate) algorithm: &'static str,
    pub(crate) expires_in_seconds: u64,
    pub(crate) header: &'static str,
    pub(crate) cookie: &'static str,
}

impl ChallengeInfo {
    pub(crate) fn of(c: &crate::domain::Challenge, now_ms: u64) -> Self {
        Self {
            value: c.text.clone(),
            bits: c.bits,
            algorithm: "sha256-leading-zero-bits",
            expires_in_seconds: c.expires_ms.saturating_sub(now_ms) / 1000,
            header: "X-Waitroom-Proof",
            cookie: crate::domain::PROOF_COOKIE,
        }
    }
}

/// The status JSON's `event`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EventInfo {
    pub(crate) name: String,
    /// RFC 3339, UTC.
    pub start: String,
    pub(crate) end: String,
    /// Places in the prequeue are drawn at random at the start.
    pub shuffle_at_start: bool,
}

impl EventInfo {
    pub(crate) fn of(e: &crate::domain::EventSpec) -> Self {
        Self {
            name: e.name.clone(),
            start: rfc3339(e.start_ms),
            end: rfc3339(e.end_ms),
            shuffle_at_start: e.shuffle_at_start,
        }
    }
}

/// Milliseconds since the epoch as RFC 3339 (seconds, UTC).
pub fn rfc3339(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// `{{ t.key|fill(name=value, ...) }}`: the sentence with each `{name}`
/// replaced. The sentence and plain values are HTML-escaped; values marked
/// safe (markup built in the template, such as a `<time>` element from a
/// `{% set %}` block) are inserted as they are. A value the sentence does
/// not use is no error: one language's sentence may leave out what
/// another's needs ("every second").
fn fill_filter(text: Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    use std::fmt::Write;
    let escaped = |v: &Value, out: &mut String| {
        if v.is_safe() {
            let _ = write!(out, "{v}");
        } else {
            let _ = write!(out, "{}", HtmlEscape(&v.to_string()));
        }
    };
    let source = text.to_string();
    let mut out = String::with_capacity(source.len() + 32);
    let mut rest = source.as_str();
    while let Some(open) = rest.find('{') {
        let (before, after) = rest.split_at(open);
        escaped(&Value::from(before).with_safety(text.is_safe()), &mut out);
        let Some(close) = after.find('}') else {
            rest = after;
            break;
        };
        let name = &after[1..close];
        match kwargs.get::<Option<Value>>(name)? {
            Some(value) => escaped(&value, &mut out),
            None => escaped(&Value::from(&after[..=close]), &mut out),
        }
        rest = &after[close + 1..];
    }
    escaped(&Value::from(rest).with_safety(text.is_safe()), &mut out);
    for name in kwargs.args() {
        kwargs.get::<Value>(name)?;
    }
    Ok(Value::from_safe_string(out))
}

/// `{{ t.eta_minutes|count(n) }}`: the plural form of the page's
/// language (`lang`) for the whole number `n`, with `{n}` filled in; a
/// plain sentence is taken as it is.
fn count_filter(
    state: &minijinja::State<'_, '_>,
    forms: Value,
    n: u64,
) -> Result<Value, minijinja::Error> {
    let lang = state
        .lookup("lang")
        .and_then(|l| l.as_str().and_then(Lang::from_code))
        .unwrap_or(Lang::FALLBACK);
    let form = if forms.as_str().is_some() {
        forms
    } else {
        match forms.get_attr(lang.plural(n))? {
            v if v.is_undefined() || v.is_none() => forms.get_attr("other")?,
            v => v,
        }
    };
    let kwargs = Kwargs::from_iter([("n", Value::from(n))]);
    fill_filter(form, kwargs)
}

/// Marks a string value safe again when its source was.
trait WithSafety {
    fn with_safety(self, safe: bool) -> Value;
}

impl WithSafety for Value {
    fn with_safety(self, safe: bool) -> Value {
        if safe {
            Value::from_safe_string(self.to_string())
        } else {
            self
        }
    }
}

/// Everything the queue template can show. Documented in
/// `docs/how-it-works.md` ("Custom template").
#[derive(Clone, Debug, Serialize)]
pub struct QueueView {
    /// The page's language code (`<html lang>`); the template also gets
    /// `t`, this language's strings.
    pub lang: &'static str,
    #[serde(skip)]
    pub(crate) language: Lang,
    pub(crate) room_id: String,
    pub(crate) room_name: String,
    pub(crate) state: VisitorState,
    pub(crate) position: u64,
    pub(crate) queue_length: u64,
    pub(crate) eta_seconds: u64,
    /// "about 3 minutes", "less than a minute", ... (in the page's language)
    pub eta_text: String,
    /// Share of the queue behind this visitor, 0..=100.
    pub progress_percent: u64,
    /// Time of this answer, `HH:MM:SS` UTC.
    pub updated_at: String,
    /// The same time as RFC 3339, for scripts.
    pub updated_at_iso: String,
    pub(crate) refresh_seconds: u64,
    /// Where the page's script polls.
    pub status_url: String,
    /// Name of the event in force, if any.
    pub event_name: Option<String>,
    /// Seconds until the event starts, if in its prequeue window.
    pub event_countdown_seconds: Option<u64>,
    /// The event's start: RFC 3339 and `HH:MM` UTC.
    pub event_start_iso: Option<String>,
    pub(crate) event_start_at: Option<String>,
    /// Places in the prequeue are drawn at random at the start.
    pub event_shuffle: bool,
    /// The countdown for people: "12 min 5 s" (in the page's language).
    pub event_countdown_text: String,
    /// The priority lane the visitor waits in, if any.
    pub lane: Option<String>,
    /// In the general queue during a presale window: when it starts to
    /// move (RFC 3339); the built-in page says so in `#wr-general`, in
    /// the visitor's local time, and its script follows the status JSON.
    pub general_from: Option<String>,
    /// The same time as `HH:MM` UTC (for a page without script).
    pub general_from_at: Option<String>,
    /// Items of stock left, where the room shows them (`show_stock`);
    /// the built-in page keeps them in `#wr-stock`, which its script
    /// updates from the status JSON.
    pub stock_left: Option<u64>,
    /// The notice to show (`notice.text`, `notice.level`, `notice.expires`),
    /// if any; the built-in page keeps it in `#wr-notice`, which its
    /// script updates from the status JSON.
    pub notice: Option<NoticeInfo>,
}

impl QueueView {
    /// The template's view of `status`, for a room named `room_name`, at `now_ms`.
    pub fn new(
        status: &Status,
        room_name: &str,
        status_url: String,
        now_ms: u64,
        language: Lang,
    ) -> Self {
        let iso = rfc3339(now_ms);
        let behind = status.queue_length.saturating_sub(status.position) + 1;
        let progress = (behind * 100)
            .checked_div(status.queue_length)
            .unwrap_or(100);
        Self {
            lang: language.code(),
            language,
            room_id: status.room.clone(),
            room_name: room_name.to_owned(),
            state: status.state,
            position: status.position,
            queue_length: status.queue_length,
            eta_seconds: status.eta_seconds,
            eta_text: eta_text(status.eta_seconds, language),
            progress_percent: progress.min(100),
            updated_at: iso.get(11..19).unwrap_or("").to_owned(),
            updated_at_iso: iso,
            refresh_seconds: status.refresh_seconds,
            status_url,
            event_name: status.event.as_ref().map(|e| e.name.clone()),
            event_countdown_seconds: status.starts_in_seconds,
            event_start_iso: status.event.as_ref().map(|e| e.start.clone()),
            event_start_at: status
                .event
                .as_ref()
                .and_then(|e| e.start.get(11..16).map(str::to_owned)),
            event_shuffle: status.event.as_ref().is_some_and(|e| e.shuffle_at_start),
            event_countdown_text: countdown_text(status.starts_in_seconds.unwrap_or(0), language),
            lane: status.lane.clone(),
            general_from: status.general_from.clone(),
            general_from_at: status
                .general_from
                .as_ref()
                .and_then(|t| t.get(11..16).map(str::to_owned)),
            stock_left: status.stock_left,
            notice: status.notice.clone(),
        }
    }

    fn sample() -> Self {
        let status = Status {
            room: "sample".into(),
            state: VisitorState::Queued,
            position: 3,
            queue_length: 10,
            eta_seconds: 90,
            refresh_seconds: 20,
            event: None,
            starts_in_seconds: None,
            general_from: None,
            stock_left: None,
            challenge: None,
            captcha: None,
            lane: None,
            notice: None,
        };
        Self::new(
            &status,
            "Sample",
            "/__waitroom/status?room=sample".into(),
            0,
            Lang::FALLBACK,
        )
    }
}

/// A rounded, human wait.
pub fn eta_text(seconds: u64, lang: Lang) -> String {
    let t = lang.strings();
    match seconds {
        0..=59 => t.get("eta_under_minute").to_owned(),
        60..=119 => t.count("eta_minutes", 1),
        120..=3599 => t.count("eta_minutes", (seconds + 30) / 60),
        3600..=7199 => t.count("eta_hours", 1),
        _ => t.count("eta_hours", (seconds + 1800) / 3600),
    }
}

/// A countdown as the page's script writes it.
pub fn countdown_text(seconds: u64, lang: Lang) -> String {
    let t = lang.strings();
    let (h, m, s) = (
        (seconds / 3600).to_string(),
        (seconds / 60 % 60).to_string(),
        (seconds % 60).to_string(),
    );
    match seconds {
        0..=59 => i18n::fill(t.get("countdown_s"), &[("s", &s)]),
        60..=3599 => i18n::fill(t.get("countdown_min_s"), &[("m", &m), ("s", &s)]),
        _ => i18n::fill(t.get("countdown_h_min"), &[("h", &h), ("m", &m)]),
    }
}

/// Every page that is not the queue: a title and a sentence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Msg {
    /// The room is closed.
    Closed,
    /// `max_queue_length` visitors already wait.
    QueueFull,
    /// Over the limits with no queue (`reject`), or every captcha
    /// verification slot taken (503).
    OverLimit,
    /// Too many requests from the visitor or its address (429); a queue
    /// place is kept.
    SlowDown,
    /// An address asked for more new tickets than it may (429).
    TooManyArrivals,
    /// The store is unreachable and `fail_mode` is `closed` (503).
    StoreUnavailable,
    /// The origin did not answer in time (504).
    OriginTimeout,
    /// The origin cannot be reached (502).
    OriginDown,
    /// No `Host`, several, or one that is not valid (400).
    BadHost,
    /// A request that cannot be made canonical for another reason than its
    /// host (400), or a method never forwarded (405).
    BadAddress,
    /// The request body was malformed or cut short (400).
    BadBody,
    /// What the daemon does not serve (404).
    NotFound,
    /// The room requires an enqueue token and the request brought none (403).
    TokenRequired,
    /// The enqueue token the request brought does not hold here (403).
    TokenRefused,
}

impl Msg {
    pub(crate) const ALL: [Msg; 14] = [
        Msg::Closed,
        Msg::QueueFull,
        Msg::OverLimit,
        Msg::SlowDown,
        Msg::TooManyArrivals,
        Msg::StoreUnavailable,
        Msg::OriginTimeout,
        Msg::OriginDown,
        Msg::BadHost,
        Msg::BadAddress,
        Msg::BadBody,
        Msg::NotFound,
        Msg::TokenRequired,
        Msg::TokenRefused,
    ];

    /// The title's and the sentence's keys in the language files.
    pub fn keys(self) -> (&'static str, &'static str) {
        match self {
            Msg::Closed => ("closed_title", "closed_text"),
            Msg::QueueFull => ("busy_title", "queue_full_text"),
            Msg::OverLimit => ("busy_title", "over_limit_text"),
            Msg::SlowDown => ("slow_down_title", "slow_down_text"),
            Msg::TooManyArrivals => ("slow_down_title", "too_many_arrivals_text"),
            Msg::StoreUnavailable => ("unavailable_title", "unavailable_text"),
            Msg::OriginTimeout => ("origin_timeout_title", "origin_timeout_text"),
            Msg::OriginDown => ("origin_down_title", "origin_down_text"),
            Msg::BadHost => ("bad_request_title", "bad_host_text"),
            Msg::BadAddress => ("bad_request_title", "bad_address_text"),
            Msg::BadBody => ("bad_request_title", "bad_body_text"),
            Msg::NotFound => ("not_found_title", "not_found_text"),
            Msg::TokenRequired => ("token_title", "token_required_text"),
            Msg::TokenRefused => ("token_title", "token_refused_text"),
        }
    }
}

/// Stands in for the refresh seconds while the pages are built, then is
/// cut out, so a page costs one copy per request, not a template run.
const REFRESH_MARK: &str = "4000000001";

/// One message page in one language, rendered once.
struct Prerendered {
    /// Without a refresh.
    still: String,
    /// With `<meta http-equiv="refresh">`, split where its seconds go.
    head: String,
    tail: String,
}

/// The message page, compiled once.
static MESSAGE_ENV: LazyLock<Environment<'static>> = LazyLock::new(|| {
    let mut env = Environment::new();
    env.set_auto_escape_callback(|_| AutoEscape::Html);
    if let Err(e) = env.add_template("message.html", MESSAGE_TEMPLATE) {
        tracing::error!(error = %e, "the built-in message page does not compile");
    }
    env
});

/// The message page for `msg` in `lang`, with `notice` when there is one.
fn render_message_page(msg: Msg, lang: Lang, refresh: &str, notice: Option<&NoticeInfo>) -> String {
    let (title, text) = msg.keys();
    let t = lang.strings();
    MESSAGE_ENV
        .get_template("message.html")
        .and_then(|tpl| {
            tpl.render(context! {
                lang => lang.code(),
                title => t.get(title),
                text => t.get(text),
                refresh_seconds => refresh,
                notice => notice,
            })
        })
        .unwrap_or_else(|_| {
            format!(
                "<!doctype html><html lang=\"{}\"><title>{1}</title><h1>{1}</h1>",
                lang.code(),
                HtmlEscape(t.get(title))
            )
        })
}

/// Every message page in every language, built on first use: they answer
/// floods (429s, 503s), so a request only copies one.
static MESSAGES: LazyLock<Vec<Prerendered>> = LazyLock::new(|| {
    let mut pages = Vec::with_capacity(Msg::ALL.len() * Lang::ALL.len());
    for msg in Msg::ALL {
        for lang in Lang::ALL {
            let still = render_message_page(msg, lang, "", None);
            let marked = render_message_page(msg, lang, REFRESH_MARK, None);
            let (head, tail) = marked
                .split_once(REFRESH_MARK)
                .map(|(h, t)| (h.to_owned(), t.to_owned()))
                .unwrap_or_else(|| (still.clone(), String::new()));
            pages.push(Prerendered { still, head, tail });
        }
    }
    pages
});

/// A room's message page (sold out, too busy) with the room's notice:
/// rendered for the request when there is one, else the prerendered page.
pub fn render_message_with(
    msg: Msg,
    lang: Lang,
    refresh_seconds: u64,
    notice: Option<&NoticeInfo>,
) -> String {
    match notice {
        None => render_message(msg, lang, refresh_seconds),
        Some(n) => {
            let refresh = match refresh_seconds {
                0 => String::new(),
                s => s.to_string(),
            };
            render_message_page(msg, lang, &refresh, Some(n))
        }
    }
}

/// A message page in a language; it reloads itself after
/// `refresh_seconds` unless that is 0.
pub fn render_message(msg: Msg, lang: Lang, refresh_seconds: u64) -> String {
    let i = Msg::ALL.iter().position(|m| *m == msg).unwrap_or(0) * Lang::ALL.len() + lang as usize;
    let Some(page) = MESSAGES.get(i) else {
        return "<!doctype html><title>Please try again later</title>".into();
    };
    if refresh_seconds == 0 {
        return page.still.clone();
    }
    let seconds = itoa::Buffer::new().format(refresh_seconds).to_owned();
    let mut out = String::with_capacity(page.head.len() + seconds.len() + page.tail.len());
    out.push_str(&page.head);
    out.push_str(&seconds);
    out.push_str(&page.tail);
    out
}

/// The pages a newcomer sees before a place while a room queues (the
/// proof of work, a captcha's widget), compiled once: they answer every
/// new visitor then.
static CHECKING: std::sync::LazyLock<Environment<'static>> = std::sync::LazyLock::new(|| {
    let mut env = Environment::new();
    env.set_auto_escape_callback(|_| AutoEscape::Html);
    for (name, source) in [
        ("challenge.html", CHALLENGE_TEMPLATE),
        ("captcha.html", CAPTCHA_TEMPLATE),
    ] {
        if let Err(e) = env.add_template(name, source) {
            tracing::error!(error = %e, page = name, "a built-in page does not compile");
        }
    }
    env
});

/// `template` in `lang` for the room called `room_name`, with the
/// "checking your browser" sentences and `extra`.
fn render_checking(
    template: &str,
    room_name: &str,
    lang: crate::i18n::Lang,
    extra: minijinja::Value,
) -> String {
    let t = lang.strings();
    CHECKING
        .get_template(template)
        .and_then(|tmpl| {
            tmpl.render(context! {
                lang => lang.code(),
                room_name => room_name,
                title => t.get("challenge_title"),
                text => t.get("challenge_text"),
                noscript => t.get("challenge_noscript"),
                failed => t.get("challenge_failed"),
                ..extra
            })
        })
        .unwrap_or_else(|_| {
            "<!doctype html><title>Checking your browser</title><p>Please enable JavaScript and reload this page.".into()
        })
}

/// The proof-of-work page for `challenge` in the room called `room_name`,
/// in `lang`.
pub fn render_challenge(
    room_name: &str,
    challenge: &crate::domain::Challenge,
    lang: crate::i18n::Lang,
) -> String {
    let extra = context! {
        challenge => challenge.text,
        bits => challenge.bits,
        cookie_name => crate::domain::PROOF_COOKIE,
    };
    render_checking("challenge.html", room_name, lang, extra)
}

/// The page with the room's captcha widget: the element of class
/// `widget_class` that the provider's script at `script_url` turns into
/// its widget; its callback puts the token in the `waitroom_.captcha`
/// cookie and reloads.
pub fn render_captcha(
    room_name: &str,
    widget_class: &str,
    site_key: &str,
    script_url: &str,
    lang: crate::i18n::Lang,
) -> String {
    let extra = context! {
        widget_class => widget_class,
        site_key => site_key,
        script_url => script_url,
        cookie_name => CAPTCHA_COOKIE,
    };
    render_checking("captcha.html", room_name, lang, extra)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_challenge_page_is_in_every_language() {
        let challenge = crate::domain::Challenge {
            text: "w1.shop.1.18.n.m".into(),
            bits: 18,
            expires_ms: 0,
        };
        for lang in &crate::i18n::Lang::ALL {
            let page = super::render_challenge("Shop", &challenge, *lang);
            assert!(
                page.contains(&format!("<html lang=\"{}\">", lang.code())),
                "{page}"
            );
            let title = lang.strings().get("challenge_title");
            let escaped = title.replace('&', "&amp;").replace('\'', "&#x27;");
            assert!(page.contains(&escaped), "{lang:?}: {title}");
            assert!(page.contains("w1.shop.1.18.n.m"));
        }
    }

    use super::*;

    #[test]
    fn template_values_are_html_escaped() {
        let mut view = QueueView::sample();
        view.room_name = "<script>alert(1)</script>".into();
        let html = Template::builtin().render(&view);
        assert!(!html.contains("<script>alert(1)"));
        assert!(html.contains("&lt;script&gt;alert(1)"), "{html}");
    }

    #[test]
    fn a_notice_is_shown_as_text_on_the_queue_page_and_the_message_page() {
        let mut view = view_in(Lang::En, false);
        let page = Template::builtin().render(&view);
        assert!(
            page.contains("id=\"wr-notice\"") && page.contains(" hidden>"),
            "{page}"
        );
        view.notice = Some(NoticeInfo {
            text: "<b>Restock</b> & more".into(),
            level: NoticeLevel::Warning,
            expires: None,
        });
        for page in [
            Template::builtin().render(&view),
            render_message_with(Msg::Closed, Lang::En, 0, view.notice.as_ref()),
        ] {
            assert!(
                page.contains("&lt;b&gt;Restock&lt;&#x2f;b&gt; &amp; more"),
                "{page}"
            );
            assert!(page.contains("notice warning"), "{page}");
            assert!(!page.contains("<b>Restock"), "{page}");
        }
        assert_eq!(
            render_message_with(Msg::Closed, Lang::De, 9, None),
            render_message(Msg::Closed, Lang::De, 9),
            "without a notice: the prerendered page"
        );
    }

    fn view_in(lang: Lang, prequeue: bool) -> QueueView {
        view_with(lang, prequeue, 20)
    }

    fn view_with(lang: Lang, prequeue: bool, refresh_seconds: u64) -> QueueView {
        let mut status = Status {
            room: "shop".into(),
            state: VisitorState::Queued,
            position: 3,
            queue_length: 10,
            eta_seconds: 300,
            refresh_seconds,
            event: None,
            starts_in_seconds: None,
            general_from: None,
            stock_left: None,
            challenge: None,
            captcha: None,
            lane: None,
            notice: None,
        };
        if prequeue {
            status.state = VisitorState::Prequeue;
            status.starts_in_seconds = Some(725);
            status.event = Some(EventInfo {
                name: "<Drop>".into(),
                start: "2027-01-15T10:00:00Z".into(),
                end: "2027-01-15T12:00:00Z".into(),
                shuffle_at_start: false,
            });
        }
        QueueView::new(&status, "Shop", "/s".into(), 0, lang)
    }

    #[test]
    fn the_builtin_page_renders_in_every_language_for_every_plural_form() {
        let builtin = Template::builtin();
        for lang in Lang::ALL {
            for prequeue in [false, true] {
                for refresh in [1, 2, 5, 21, 22] {
                    let view = view_with(lang, prequeue, refresh);
                    if let Err(e) = builtin.try_render(&view) {
                        panic!("{lang:?} prequeue={prequeue} refresh={refresh}: {e:#}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_builtin_page_speaks_each_language_with_no_english_left() {
        let english = Lang::En.strings();
        for lang in Lang::ALL {
            let t = lang.strings();
            let html = |s: &str| HtmlEscape(s).to_string();
            let page = Template::builtin().render(&view_in(lang, false));
            assert!(
                page.contains(&format!("<html lang=\"{}\">", lang.code())),
                "{page}"
            );
            assert!(
                page.contains(&html(t.get("queue_intro"))),
                "{lang:?}: {page}"
            );
            assert!(page.contains(&eta_text(300, lang)), "{lang:?}: {page}");
            assert!(
                page.contains(&html(&t.count("checks_every", 20))),
                "{lang:?}: {page}"
            );
            let pre = Template::builtin().render(&view_in(lang, true));
            let heading = html(t.get("prequeue_heading"))
                .replace("{event}", "&lt;Drop&gt;")
                .replace(
                    "{time}",
                    "<time datetime=\"2027-01-15T10:00:00Z\">10:00</time>",
                );
            assert!(pre.contains(&heading), "{lang:?}: {heading} in {pre}");
            assert!(pre.contains(&countdown_text(725, lang)), "{lang:?}: {pre}");
            if lang != Lang::En {
                for key in english.entries().keys() {
                    if english.get(key) == t.get(key) {
                        continue; // "{s} s" is international
                    }
                    let en = html(english.get(key));
                    assert!(
                        !page.contains(&en) && !pre.contains(&en),
                        "{lang:?}: English {key}"
                    );
                }
                for word in ["about ", "less than", "You are", "\" s\""] {
                    assert!(!page.contains(word), "{lang:?}: {word:?} in {page}");
                }
            }
        }
    }

    #[test]
    fn eta_text_rounds_for_people() {
        let en = Lang::En;
        assert_eq!(eta_text(10, en), "less than a minute");
        assert_eq!(eta_text(75, en), "about 1 minute");
        assert_eq!(eta_text(170, en), "about 3 minutes");
        assert_eq!(eta_text(3 * 3600, en), "about 3 hours");
        assert_eq!(eta_text(300, Lang::Ru), "примерно 5 минут");
        assert_eq!(eta_text(130, Lang::De), "etwa 2 Minuten");
        assert_eq!(eta_text(4000, Lang::Fr), "environ 1 heure");
        assert_eq!(eta_text(30, Lang::Zh), "不到 1 分钟");
    }

    #[test]
    fn countdown_text_in_each_language() {
        assert_eq!(countdown_text(725, Lang::En), "12 min 5 s");
        assert_eq!(countdown_text(9, Lang::En), "9 s");
        assert_eq!(countdown_text(7300, Lang::En), "2 h 1 min");
        assert_eq!(countdown_text(725, Lang::Ja), "12分5秒");
        assert_eq!(countdown_text(725, Lang::De), "12 Min. 5 Sek.");
        assert_eq!(countdown_text(7300, Lang::Ru), "2 ч 1 мин");
    }

    #[test]
    fn message_pages_are_prerendered_per_language_with_the_refresh_cut_in() {
        for msg in Msg::ALL {
            for lang in Lang::ALL {
                let (title, text) = msg.keys();
                let t = lang.strings();
                let still = render_message(msg, lang, 0);
                assert!(
                    still.contains(&format!("<html lang=\"{}\">", lang.code())),
                    "{still}"
                );
                assert!(!still.contains("http-equiv"), "{still}");
                assert!(!still.contains(REFRESH_MARK));
                let text_html = HtmlEscape(t.get(text)).to_string();
                assert!(still.contains(&text_html), "{msg:?} {lang:?}: {still}");
                assert!(still.contains(&HtmlEscape(t.get(title)).to_string()));
                let page = render_message(msg, lang, 17);
                assert!(page.contains("content=\"17\""), "{page}");
                assert!(!page.contains(REFRESH_MARK));
                let refresh = "<meta http-equiv=\"refresh\" content=\"17\">";
                assert_eq!(page.replace(refresh, ""), still, "only the refresh differs");
            }
        }
    }

    #[test]
    fn fill_escapes_the_sentence_and_plain_values_but_not_markup() {
        let mut env = Environment::new();
        env.set_auto_escape_callback(|_| AutoEscape::Html);
        env.add_filter("fill", fill_filter);
        let out = env
            .render_str(
                r#"{% set when %}<time>{{ at }}</time>{% endset %}{{ "<{event}> at {time} {none}"|fill(event=name, time=when) }}"#,
                context! { name => "<b>Drop</b>", at => "10:00" },
            )
            .unwrap();
        assert_eq!(
            out,
            "&lt;&lt;b&gt;Drop&lt;&#x2f;b&gt;&gt; at <time>10:00</time> {none}"
        );
        let out = env
            .render_str(r#"{{ "every second"|fill(n=1) }}"#, context! {})
            .unwrap();
        assert_eq!(
            out, "every second",
            "a value the sentence leaves out is fine"
        );
    }
}
