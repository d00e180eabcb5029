//! Previews for operators (`GET /api/rooms/{id}/preview` on the admin
//! listener): a room's page as a visitor in one state would see it now,
//! in one language, with sample figures and the notice in force. A
//! preview only reads what the room holds in memory: no store call, no
//! ticket, no metric.

use super::Room;
use crate::clock::Millis;
use crate::domain::{Challenge, EventSpec, Settings};
use crate::i18n::Lang;
use crate::queue_page::{self, EventInfo, Msg, NoticeInfo, QueueView, Status, VisitorState};

/// Sample figures: a visitor 42nd of 180, about 9 minutes from the front.
const SAMPLE_POSITION: u64 = 42;
const SAMPLE_QUEUE_LENGTH: u64 = 180;
const SAMPLE_ETA_SECONDS: u64 = 540;
/// In a room that shows its stock but counts none yet: this many left.
const SAMPLE_STOCK_LEFT: u64 = 25;
/// A prequeue without an event in sight shows a start this far ahead.
const SAMPLE_STARTS_IN_MS: Millis = 10 * 60_000;

/// The pages a preview shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PreviewState {
    Queued,
    Prequeue,
    Closed,
    Challenge,
    SoldOut,
}

impl PreviewState {
    /// Every state, by the name the API takes.
    pub(crate) const ALL: [(&'static str, PreviewState); 5] = [
        ("queued", PreviewState::Queued),
        ("prequeue", PreviewState::Prequeue),
        ("closed", PreviewState::Closed),
        ("challenge", PreviewState::Challenge),
        ("sold_out", PreviewState::SoldOut),
    ];

    pub(crate) fn parse(name: &str) -> Option<PreviewState> {
        Self::ALL
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, state)| *state)
    }
}

/// The page `room` shows in `state` at `now`, in `lang`; its script polls
/// `status_url` like the real page (the admin API serves previews
/// sandboxed, so it does not run).
pub(crate) fn render(
    room: &Room,
    state: PreviewState,
    lang: Lang,
    status_url: String,
    now: Millis,
) -> String {
    let in_force = room.in_force(now);
    let notice = in_force.notice(now).map(|n| NoticeInfo::of(n, || lang));
    let name = &room.config.name;
    match state {
        PreviewState::Queued | PreviewState::Prequeue => {
            let mut status = Status {
                room: room.config.id.clone(),
                state: VisitorState::Queued,
                position: SAMPLE_POSITION,
                queue_length: SAMPLE_QUEUE_LENGTH,
                eta_seconds: SAMPLE_ETA_SECONDS,
                refresh_seconds: room.config.refresh_interval.as_secs().max(1),
                event: None,
                starts_in_seconds: None,
                general_from: None,
                stock_left: if room.config.show_stock {
                    room.stock().or(Some(SAMPLE_STOCK_LEFT))
                } else {
                    None
                },
                challenge: None,
                captcha: None,
                lane: None,
                notice,
            };
            // The event in force, else the next one, shows its own page.
            let events = room.events();
            let event = in_force
                .event
                .clone()
                .or_else(|| events.iter().find(|e| e.spec.start_ms > now).cloned());
            let template = event
                .as_ref()
                .and_then(|e| e.template.as_ref())
                .unwrap_or(&room.template);
            if state == PreviewState::Prequeue {
                let sample = sample_event(now);
                let spec = event.as_ref().map_or(&sample, |e| &e.spec);
                let start_ms = if spec.start_ms > now {
                    spec.start_ms
                } else {
                    now + SAMPLE_STARTS_IN_MS
                };
                status.state = VisitorState::Prequeue;
                status.starts_in_seconds = Some((start_ms - now).div_ceil(1000));
                status.event = Some(EventInfo::of(&EventSpec {
                    start_ms,
                    ..spec.clone()
                }));
                if spec.shuffle_at_start {
                    status.position = 0;
                }
                // An event still to come shows its notice in its prequeue
                // (unless the operator's is shown).
                if status.notice.is_none() {
                    status.notice = spec.notice.as_ref().map(|n| NoticeInfo::of(n, || lang));
                }
            } else {
                status.event = in_force.event.as_ref().map(|e| EventInfo::of(&e.spec));
            }
            let view = QueueView::new(&status, name, status_url, now, lang);
            template.render(&view)
        }
        PreviewState::Closed | PreviewState::SoldOut => {
            queue_page::render_message_with(Msg::Closed, lang, 0, notice.as_ref())
        }
        PreviewState::Challenge => {
            let challenge = Challenge {
                text: format!("preview.{}", room.config.id),
                bits: 1,
                expires_ms: now + 60_000,
            };
            queue_page::render_challenge(name, &challenge, lang)
        }
    }
}

/// An event for a room without one, starting in ten minutes.
fn sample_event(now: Millis) -> EventSpec {
    EventSpec {
        name: "sample".into(),
        prequeue_start_ms: Some(now),
        start_ms: now + SAMPLE_STARTS_IN_MS,
        end_ms: now + SAMPLE_STARTS_IN_MS + 3_600_000,
        shuffle_at_start: false,
        lanes_only_for_ms: None,
        settings: Settings::default(),
        notice: None,
    }
}
