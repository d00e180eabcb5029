//! A room's scheduled events (`[[room.event]]`).

use std::path::PathBuf;
use std::time::Duration;

use super::values::{check_id, check_limit};
use super::Checker;
use crate::config::bounds::MIN_SESSION;
use crate::config::keypath::KeyPath;
use crate::config::raw::RawEvent;
use crate::config::EventConfig;
use crate::domain::{check_notice_text, EventSpec, Notice, Settings};

impl Checker<'_, '_> {
    /// `[[room.event]]` of a room that has lanes (`lanes`) and a presale
    /// window of its own (`room_window`, its `lanes_only_until`) or not.
    pub(super) fn events(
        &mut self,
        room: &KeyPath,
        raw: Vec<RawEvent>,
        lanes: bool,
        room_window: bool,
    ) -> Vec<EventConfig> {
        let mut events: Vec<EventConfig> = Vec::with_capacity(raw.len());
        for (i, e) in raw.into_iter().enumerate() {
            let p = room.key("event").index(i);
            if let Err(why) = check_id(&e.name) {
                self.fail(&p.key("name"), format!("{:?} {why}", e.name));
            }
            if let Some(j) = events.iter().position(|other| other.spec.name == e.name) {
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
            let session_duration = e.session_duration.map(|raw| {
                self.duration(
                    &p.key("session_duration"),
                    Some(raw),
                    MIN_SESSION,
                    MIN_SESSION,
                )
            });
            let lanes_only_for = e.lanes_only_for.and_then(|raw| {
                let key = p.key("lanes_only_for");
                let text = raw.text.clone();
                let window = self.duration(&key, Some(raw), Duration::ZERO, Duration::ZERO);
                // An end not after the start is refused above, once.
                let length = match end.duration_since(start) {
                    Ok(d) if !d.is_zero() => d,
                    _ => Duration::MAX,
                };
                if window.is_zero() {
                    None
                } else if !lanes {
                    self.fail(
                        &key,
                        format!("{text:?} needs at least one [[room.lane]]: during it only lanes are let in"),
                    );
                    None
                } else if room_window {
                    self.fail(
                        &key,
                        format!("{text:?} and the room's lanes_only_until are both set; a room's presale windows come from one or the other, so remove one"),
                    );
                    None
                } else if window > length {
                    self.fail(
                        &key,
                        format!(
                            "{text:?} is longer than the event ({} from start to end)",
                            humantime::format_duration(length)
                        ),
                    );
                    None
                } else {
                    Some(window.as_millis() as u64)
                }
            });
            let template = e.template.and_then(|t| {
                if t.trim().is_empty() {
                    self.fail(
                        &p.key("template"),
                        "must be a file path; leave it out for the room's page",
                    );
                    None
                } else {
                    Some(PathBuf::from(t))
                }
            });
            let notice = e.notice.and_then(|text| match check_notice_text(&text) {
                Ok(()) => Some(Notice::plain(text)),
                Err(why) => {
                    self.fail(&p.key("notice"), why);
                    None
                }
            });
            let ms = |t: std::time::SystemTime| {
                t.duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64)
            };
            let spec = EventSpec {
                name: e.name,
                prequeue_start_ms: prequeue_start.map(ms),
                start_ms: ms(start),
                end_ms: ms(end),
                shuffle_at_start: e.shuffle_at_start.unwrap_or(false),
                lanes_only_for_ms: lanes_only_for,
                settings: Settings {
                    total_active_users: e.total_active_users,
                    new_users_per_minute: e.new_users_per_minute,
                    session_duration_ms: session_duration.map(|d| d.as_millis() as u64),
                    session_renewal: e.session_renewal,
                    queueing_method: e.queueing_method,
                },
                notice,
            };
            // Overlapping events would leave it ambiguous whose limits apply.
            if let Some(j) = events.iter().position(|o| o.spec.overlaps(&spec)) {
                self.fail(
                    &p.key("start"),
                    format!(
                        "event {:?} overlaps event[{j}] {:?} (prequeue included); events in a room must not overlap",
                        spec.name, events[j].spec.name
                    ),
                );
            }
            events.push(EventConfig { spec, template });
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use crate::config::check::tests::{overlay, refusals, refusals_with, with};

    /// An event from 10:00 to 12:00 on 1 January 2030 (UTC), with `keys`
    /// besides (a key given replaces the one here).
    fn event(keys: &str) -> String {
        let launch =
            "name = \"launch\"\nstart = \"2030-01-01T10:00:00Z\"\nend = \"2030-01-01T12:00:00Z\"";
        format!("[[room.event]]\n{}\n", overlay(launch, keys))
    }

    /// The minimal room with `events`.
    fn room_with(events: &str) -> Vec<String> {
        refusals(&format!("{}{events}", with("room", "")))
    }

    #[test]
    fn an_event_is_named_once_per_room() {
        assert!(room_with(&event("")).is_empty());
        assert_eq!(
            room_with(&event("name = \"Launch\"")),
            [r#"room[0].event[0].name: "Launch" must be 1 to 64 characters of a-z, 0-9, _ and -"#]
        );
        let later = event("start = \"2030-02-01T10:00:00Z\"\nend = \"2030-02-01T12:00:00Z\"");
        assert_eq!(
            room_with(&format!("{}{later}", event(""))),
            [
                r#"room[0].event[1].name: duplicate event name "launch"; event[0] of this room has it too"#
            ]
        );
    }

    #[test]
    fn an_event_ends_after_it_starts_and_queues_before() {
        assert_eq!(
            room_with(&event("end = \"2030-01-01T10:00:00Z\"")),
            ["room[0].event[0].end: 2030-01-01T10:00:00Z must be after start 2030-01-01T10:00:00Z"]
        );
        assert_eq!(
            room_with(&event("prequeue_start = \"2030-01-01T10:00:01Z\"")),
            ["room[0].event[0].prequeue_start: 2030-01-01T10:00:01Z must not be after start 2030-01-01T10:00:00Z"]
        );
    }

    #[test]
    fn an_events_limits_are_left_out_rather_than_0() {
        for key in ["total_active_users", "new_users_per_minute"] {
            assert_eq!(
                room_with(&event(&format!("{key} = 0"))),
                [format!("room[0].event[0].{key}: must be at least 1, got 0 (leave it out to keep the room's limit)")]
            );
            assert_eq!(
                room_with(&event(&format!("{key} = 1000000001"))),
                [format!(
                    "room[0].event[0].{key}: must be at most 1000000000, got 1000000001"
                )]
            );
        }
    }

    #[test]
    fn an_events_session_and_template_are_checked() {
        assert_eq!(
            room_with(&event("session_duration = \"0s\"")),
            [r#"room[0].event[0].session_duration: must be at least 1s, got "0s""#]
        );
        assert_eq!(
            room_with(&event("template = \"\"")),
            ["room[0].event[0].template: must be a file path; leave it out for the room's page"]
        );
    }

    #[test]
    fn an_events_notice_is_short_and_not_blank() {
        assert!(room_with(&event("notice = \"Doors open at 10:00\"")).is_empty());
        assert_eq!(
            room_with(&event(&format!("notice = \"{}\"", "x".repeat(501)))),
            ["room[0].event[0].notice: at most 500 characters, got 501"]
        );
        assert_eq!(
            room_with(&event("notice = \" \"")),
            ["room[0].event[0].notice: must not be blank"]
        );
    }

    #[test]
    fn events_in_a_room_do_not_overlap() {
        let overlap = r#"room[0].event[1].start: event "sale" overlaps event[0] "launch" (prequeue included); events in a room must not overlap"#;
        let sale = |keys: &str| event(&format!("name = \"sale\"\n{keys}"));
        let during = sale("start = \"2030-01-01T11:00:00Z\"\nend = \"2030-01-01T13:00:00Z\"");
        assert_eq!(room_with(&format!("{}{during}", event(""))), [overlap]);
        // The prequeue counts: it begins while the first event runs.
        let queued = sale(
            "prequeue_start = \"2030-01-01T11:30:00Z\"\nstart = \"2030-01-01T13:00:00Z\"\nend = \"2030-01-01T14:00:00Z\"",
        );
        assert_eq!(room_with(&format!("{}{queued}", event(""))), [overlap]);
    }

    /// The minimal room with a lane "vip" (its codes in `VIP`), `room_keys`
    /// and `events`: what `waitroom check` refuses.
    fn laned(room_keys: &str, events: &str) -> Vec<String> {
        let lane = "[[room.lane]]\nname = \"vip\"\nshare = 0.3\ncodes_env = \"VIP\"\n";
        refusals_with(
            &format!("{}{lane}{events}", with("room", room_keys)),
            &[("VIP", "vip-code-1")],
        )
    }

    #[test]
    fn an_events_presale_window_needs_lanes_and_fits_the_event() {
        assert!(laned("", &event("lanes_only_for = \"10m\"")).is_empty());
        assert!(laned("", &event("lanes_only_for = \"2h\"")).is_empty());
        assert_eq!(
            room_with(&event("lanes_only_for = \"10m\"")),
            [
                r#"room[0].event[0].lanes_only_for: "10m" needs at least one [[room.lane]]: during it only lanes are let in"#
            ]
        );
        assert_eq!(
            laned("", &event("lanes_only_for = \"0s\"")),
            [r#"room[0].event[0].lanes_only_for: must be longer than 0, got "0s""#]
        );
        assert_eq!(
            laned("", &event("lanes_only_for = \"2h 1s\"")),
            [
                r#"room[0].event[0].lanes_only_for: "2h 1s" is longer than the event (2h from start to end)"#
            ]
        );
        // An event that ends at its start is refused once, for its end.
        assert_eq!(
            laned(
                "",
                &event("end = \"2030-01-01T10:00:00Z\"\nlanes_only_for = \"10m\"")
            ),
            ["room[0].event[0].end: 2030-01-01T10:00:00Z must be after start 2030-01-01T10:00:00Z"]
        );
        let negative = laned("", &event("lanes_only_for = \"-5m\""));
        assert_eq!(negative.len(), 1, "{negative:?}");
        assert!(negative[0].contains("lanes_only_for"), "{negative:?}");
    }

    #[test]
    fn a_room_has_one_kind_of_presale_window() {
        assert_eq!(
            laned(
                "lanes_only_until = \"2030-01-01T09:00:00Z\"",
                &event("lanes_only_for = \"10m\"")
            ),
            [
                r#"room[0].event[0].lanes_only_for: "10m" and the room's lanes_only_until are both set; a room's presale windows come from one or the other, so remove one"#
            ]
        );
    }
}
