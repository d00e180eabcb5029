//! A room's scheduled events (`[[room.event]]`).

use std::path::PathBuf;

use super::values::{check_id, check_limit};
use super::Checker;
use crate::config::bounds::MIN_SESSION;
use crate::config::keypath::KeyPath;
use crate::config::raw::RawEvent;
use crate::config::EventConfig;
use crate::domain::{EventSpec, Settings};

impl Checker<'_, '_> {
    pub(super) fn events(&mut self, room: &KeyPath, raw: Vec<RawEvent>) -> Vec<EventConfig> {
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
                settings: Settings {
                    total_active_users: e.total_active_users,
                    new_users_per_minute: e.new_users_per_minute,
                    session_duration_ms: session_duration.map(|d| d.as_millis() as u64),
                    session_renewal: e.session_renewal,
                    queueing_method: e.queueing_method,
                },
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
