//! What a waiting visitor sees: the queue page (an operator-replaceable
//! template), the status JSON, and the daemon's own message pages
//! (rejected, closed, origin errors, store unavailable, slow down).

use std::path::Path;
use std::sync::Arc;

use minijinja::{context, AutoEscape, Environment};
use serde::Serialize;

/// The built-in queue page.
pub const DEFAULT_QUEUE_TEMPLATE: &str = include_str!("../static/queue.html");
/// The built-in page for every other message.
pub const MESSAGE_TEMPLATE: &str = include_str!("../static/message.html");
/// The proof-of-work page (its script solves the challenge).
pub const CHALLENGE_TEMPLATE: &str = include_str!("../static/challenge.html");

#[derive(Debug, thiserror::Error)]
#[error("template {path}: {message}")]
pub struct TemplateError {
    pub path: String,
    pub message: String,
}

/// A compiled queue page template. Values are HTML-escaped.
#[derive(Clone)]
pub struct Template {
    env: Arc<Environment<'static>>,
}

impl Template {
    pub fn builtin() -> Self {
        Self::from_source("queue.html".into(), DEFAULT_QUEUE_TEMPLATE.into())
            .expect("the built-in template compiles")
    }

    /// Loads and compiles an operator's template, so a broken one is refused at start-up.
    pub fn load(path: &Path) -> Result<Self, TemplateError> {
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
        env.add_template_owned(name, source)?;
        Ok(Self { env: Arc::new(env) })
    }

    fn try_render(&self, view: &QueueView) -> Result<String, minijinja::Error> {
        self.env.get_template("queue.html")?.render(view)
    }

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
    Queued,
    Admitted,
    Prequeue,
    Closed,
    Rejected,
    /// A proof of work must come first (`challenge` says which).
    Challenge,
}

/// `GET /__waitroom/status` and `Accept: application/json` answers (SPEC §5).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Status {
    pub room: String,
    pub state: VisitorState,
    pub position: u64,
    pub queue_length: u64,
    pub eta_seconds: u64,
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
}

/// The status JSON's `challenge`: find a decimal `counter` such that
/// SHA-256(`value` + "." + counter) starts with `bits` zero bits, then
/// send `value.counter` in the `X-Waitroom-Proof` header (or the
/// `waitroom_.proof` cookie) with the next request for the room's page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChallengeInfo {
    pub value: String,
    pub bits: u8,
    pub algorithm: &'static str,
    pub expires_in_seconds: u64,
    pub header: &'static str,
    pub cookie: &'static str,
}

impl ChallengeInfo {
    pub fn of(c: &crate::gate::proof::Challenge, now_ms: u64) -> Self {
        Self {
            value: c.text.clone(),
            bits: c.bits,
            algorithm: "sha256-leading-zero-bits",
            expires_in_seconds: c.expires_ms.saturating_sub(now_ms) / 1000,
            header: "X-Waitroom-Proof",
            cookie: crate::gate::proof::PROOF_COOKIE,
        }
    }
}

/// The status JSON's `event`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EventInfo {
    pub name: String,
    /// RFC 3339, UTC.
    pub start: String,
    pub end: String,
    /// Places in the prequeue are drawn at random at the start.
    pub shuffle_at_start: bool,
}

impl EventInfo {
    pub fn of(e: &crate::store::EventSpec) -> Self {
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

/// Everything the queue template can show. Documented in the README.
#[derive(Clone, Debug, Serialize)]
pub struct QueueView {
    pub room_id: String,
    pub room_name: String,
    pub state: VisitorState,
    pub position: u64,
    pub queue_length: u64,
    pub eta_seconds: u64,
    /// "about 3 minutes", "less than a minute", ...
    pub eta_text: String,
    /// Share of the queue behind this visitor, 0..=100.
    pub progress_percent: u64,
    /// Time of this answer, `HH:MM:SS` UTC.
    pub updated_at: String,
    /// The same time as RFC 3339, for scripts.
    pub updated_at_iso: String,
    pub refresh_seconds: u64,
    /// Where the page's script polls.
    pub status_url: String,
    /// Name of the event in force, if any.
    pub event_name: Option<String>,
    /// Seconds until the event starts, if in its prequeue window.
    pub event_countdown_seconds: Option<u64>,
    /// The event's start: RFC 3339 and `HH:MM` UTC.
    pub event_start_iso: Option<String>,
    pub event_start_at: Option<String>,
    /// Places in the prequeue are drawn at random at the start.
    pub event_shuffle: bool,
    /// The countdown for people: "12 min 5 s".
    pub event_countdown_text: String,
}

impl QueueView {
    pub fn new(status: &Status, room_name: &str, status_url: String, now_ms: u64) -> Self {
        let iso = rfc3339(now_ms);
        let behind = status.queue_length.saturating_sub(status.position) + 1;
        let progress = (behind * 100)
            .checked_div(status.queue_length)
            .unwrap_or(100);
        Self {
            room_id: status.room.clone(),
            room_name: room_name.to_owned(),
            state: status.state,
            position: status.position,
            queue_length: status.queue_length,
            eta_seconds: status.eta_seconds,
            eta_text: eta_text(status.eta_seconds),
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
            event_countdown_text: countdown_text(status.starts_in_seconds.unwrap_or(0)),
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
            challenge: None,
        };
        Self::new(
            &status,
            "Sample",
            "/__waitroom/status?room=sample".into(),
            0,
        )
    }
}

/// A rounded, human wait.
pub fn eta_text(seconds: u64) -> String {
    match seconds {
        0..=59 => "less than a minute".into(),
        60..=119 => "about 1 minute".into(),
        120..=3599 => format!("about {} minutes", (seconds + 30) / 60),
        3600..=7199 => "about 1 hour".into(),
        _ => format!("about {} hours", (seconds + 1800) / 3600),
    }
}

/// A countdown as the page's script writes it.
pub fn countdown_text(seconds: u64) -> String {
    let (h, m, s) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    match seconds {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{m} min {s} s"),
        _ => format!("{h} h {m} min"),
    }
}

/// A page for everything that is not the queue.
pub struct Message<'a> {
    pub title: &'a str,
    pub text: &'a str,
    /// Seconds after which the page reloads itself (0 = never).
    pub refresh_seconds: u64,
}

/// The message page, compiled once: it answers floods (429s, 503s), so it
/// must be cheap.
static MESSAGES: std::sync::LazyLock<Environment<'static>> = std::sync::LazyLock::new(|| {
    let mut env = Environment::new();
    env.set_auto_escape_callback(|_| AutoEscape::Html);
    if let Err(e) = env.add_template("message.html", MESSAGE_TEMPLATE) {
        tracing::error!(error = %e, "the built-in message page does not compile");
    }
    env
});

pub fn render_message(message: &Message<'_>) -> String {
    MESSAGES
        .get_template("message.html")
        .and_then(|t| {
            t.render(context! {
                title => message.title,
                text => message.text,
                refresh_seconds => message.refresh_seconds,
            })
        })
        .unwrap_or_else(|_| {
            format!(
                "<!doctype html><title>{0}</title><h1>{0}</h1>",
                "Please try again later"
            )
        })
}

/// The challenge page, compiled once (it answers every new visitor while
/// a room with proof of work queues).
static CHALLENGE: std::sync::LazyLock<Environment<'static>> = std::sync::LazyLock::new(|| {
    let mut env = Environment::new();
    env.set_auto_escape_callback(|_| AutoEscape::Html);
    if let Err(e) = env.add_template("challenge.html", CHALLENGE_TEMPLATE) {
        tracing::error!(error = %e, "the built-in challenge page does not compile");
    }
    env
});

/// The proof-of-work page for `challenge` in the room called `room_name`.
pub fn render_challenge(room_name: &str, challenge: &crate::gate::proof::Challenge) -> String {
    CHALLENGE
        .get_template("challenge.html")
        .and_then(|t| {
            t.render(context! {
                lang => "en",
                room_name => room_name,
                title => "Checking your browser",
                text => "This takes a moment. You will get your place in line right after.",
                noscript => "This waiting room needs JavaScript to give you a place in line. Please enable JavaScript and reload this page.",
                failed => "The check did not succeed. Reloading the page starts a new one.",
                challenge => challenge.text,
                bits => challenge.bits,
                cookie_name => crate::gate::proof::PROOF_COOKIE,
            })
        })
        .unwrap_or_else(|_| {
            "<!doctype html><title>Checking your browser</title><p>Please enable JavaScript and reload this page.".into()
        })
}

#[cfg(test)]
mod tests {
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
    fn eta_text_rounds_for_people() {
        assert_eq!(eta_text(10), "less than a minute");
        assert_eq!(eta_text(75), "about 1 minute");
        assert_eq!(eta_text(170), "about 3 minutes");
        assert_eq!(eta_text(3 * 3600), "about 3 hours");
    }
}
