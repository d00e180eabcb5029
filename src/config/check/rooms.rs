//! `[[room]]`: each room's own keys (id, name, host and path, limits,
//! timing, the queue page, language), and what must differ between rooms.
//! `room` calls the checks of the room's challenge and bot score, bypasses,
//! token, lanes and events, each in its own file.

use std::path::PathBuf;
use std::time::Duration;

use super::values::{check_host, check_id, check_limit, check_path};
use super::{defaults, root, Checker};
use crate::config::keypath::KeyPath;
use crate::config::raw::{raw_captcha, RawRoom};
use crate::config::{Captcha, EnqueueToken, LaneConfig, RoomConfig};
use crate::domain::{QueueingMethod, RoomState};
use crate::i18n::{Lang, Language};

/// Most proof-of-work bits: 2^32 hashes is minutes for a browser already.
pub const MAX_PROOF_OF_WORK: u64 = 32;

impl Checker<'_, '_> {
    pub(super) fn rooms(&mut self, raw: Vec<RawRoom>, reserved_prefix: &str) -> Vec<RoomConfig> {
        if raw.is_empty() {
            self.fail(
                &root().key("room"),
                "at least one [[room]] is required (a daemon without rooms protects nothing)",
            );
        }
        let rooms: Vec<RoomConfig> = raw
            .into_iter()
            .enumerate()
            .map(|(i, r)| self.room(&root().key("room").index(i), r, reserved_prefix))
            .collect();
        for (i, room) in rooms.iter().enumerate() {
            let p = root().key("room").index(i);
            if let Some(j) = rooms[..i].iter().position(|r| r.id == room.id) {
                self.fail(
                    &p.key("id"),
                    format!(
                        "duplicate room id {:?}; room[{j}] has it too, ids must be unique",
                        room.id
                    ),
                );
            }
            if let Some(j) = rooms[..i]
                .iter()
                .position(|r| r.host == room.host && r.path == room.path)
            {
                let host = room.host.as_deref().unwrap_or("any host");
                self.fail(
                    &p.key("path"),
                    format!(
                        "{:?} on {host} is also room[{j}]'s host and path; each room needs its own",
                        room.path
                    ),
                );
            }
        }
        rooms
    }

    /// One `[[room]]`, checked in the order its problems are reported: id,
    /// challenge, token and lanes, name, host and path, limits and timing,
    /// the queue page, bypasses, language, events, bot score. Each step
    /// takes what it checks out of `raw`.
    fn room(&mut self, p: &KeyPath, mut raw: RawRoom, reserved_prefix: &str) -> RoomConfig {
        if let Err(why) = check_id(&raw.id) {
            self.fail(&p.key("id"), format!("{:?} {why}", raw.id));
        }
        let (proof_of_work, captcha, enqueue_token, lanes) = self.room_entry(p, &mut raw);
        let (name, host, path) = self.room_place(p, &mut raw, reserved_prefix);
        let (session_duration, refresh_interval, abandon_after) = self.room_timing(p, &mut raw);
        let (queue_status_code, template) = self.room_page(p, &mut raw);
        let (bypass_paths, bypass_ips, bypass_header) = self.room_bypasses(p, &mut raw);
        let language = self.room_language(p, raw.language.take());
        let events = self.events(p, std::mem::take(&mut raw.event));
        let failed_challenge = raw.failed_challenge.unwrap_or_default();
        let bot_score = self.bot_score(p, &mut raw, failed_challenge);
        RoomConfig {
            id: raw.id,
            name,
            host,
            path,
            total_active_users: raw.total_active_users,
            new_users_per_minute: raw.new_users_per_minute,
            session_duration,
            session_renewal: raw.session_renewal.unwrap_or(true),
            queueing_method: raw.queueing_method.unwrap_or(QueueingMethod::Fifo),
            max_queue_length: raw.max_queue_length.unwrap_or(0),
            refresh_interval,
            abandon_after,
            queue_status_code,
            json_response: raw.json_response.unwrap_or(true),
            template,
            bypass_paths,
            bypass_ips,
            bypass_header,
            case_insensitive_paths: raw.case_insensitive_paths.unwrap_or(false),
            bypass_upgrades: raw.bypass_upgrades.unwrap_or(false),
            proof_of_work,
            bot_score,
            failed_challenge,
            captcha,
            enqueue_token,
            lanes,
            state: raw.state.unwrap_or(RoomState::Open),
            language,
            events,
        }
    }

    /// How a visitor gets in: the proof of work or captcha, the enqueue
    /// token, then the lanes (a lane's `token_claim` needs the token).
    fn room_entry(
        &mut self,
        p: &KeyPath,
        raw: &mut RawRoom,
    ) -> (u8, Option<Captcha>, Option<EnqueueToken>, Vec<LaneConfig>) {
        let proof_of_work = match raw.proof_of_work.unwrap_or(0) {
            bits @ 0..=MAX_PROOF_OF_WORK => bits as u8,
            bits => {
                self.fail(
                    &p.key("proof_of_work"),
                    format!("{bits} is out of range: 0 (off) to {MAX_PROOF_OF_WORK} bits; 16 to 20 takes a browser a few hundred milliseconds"),
                );
                0
            }
        };
        let captcha = self.captcha(p, &mut raw_captcha(raw), proof_of_work);
        let enqueue_token = raw
            .enqueue_token
            .take()
            .and_then(|t| self.enqueue_token(&p.key("enqueue_token"), &raw.id, t));
        let lanes = self.lanes(p, std::mem::take(&mut raw.lane), enqueue_token.is_some());
        (proof_of_work, captcha, enqueue_token, lanes)
    }

    /// The room's display name, and the host and path prefix it matches
    /// (canonical, and outside the reserved prefix).
    fn room_place(
        &mut self,
        p: &KeyPath,
        raw: &mut RawRoom,
        reserved_prefix: &str,
    ) -> (String, Option<String>, String) {
        let name = raw.name.take().unwrap_or_else(|| raw.id.clone());
        if name.trim().is_empty()
            || name.chars().count() > 200
            || name.chars().any(char::is_control)
        {
            self.fail(
                &p.key("name"),
                format!("{name:?} must be 1 to 200 characters without control characters"),
            );
        }
        let host = raw.host.take().and_then(|h| match check_host(&h) {
            Ok(host) => Some(host),
            Err(why) => {
                self.fail(&p.key("host"), format!("{h:?} {why}"));
                None
            }
        });
        let path = match check_path(&raw.path) {
            Err(why) => {
                self.fail(&p.key("path"), format!("{:?} {why}", raw.path));
                raw.path.clone()
            }
            Ok(path) => {
                if crate::canonical::covers(reserved_prefix, &path, false) {
                    self.fail(
                        &p.key("path"),
                        format!(
                            "{:?} is under server.reserved_prefix {reserved_prefix:?}, which the daemon answers itself",
                            raw.path
                        ),
                    );
                }
                path
            }
        };
        (name, host, path)
    }

    /// The limits, then `session_duration`, `refresh_interval` and
    /// `abandon_after` (returned in that order), which must outlast a poll.
    fn room_timing(&mut self, p: &KeyPath, raw: &mut RawRoom) -> (Duration, Duration, Duration) {
        for (key, value) in [
            ("total_active_users", raw.total_active_users),
            ("new_users_per_minute", raw.new_users_per_minute),
        ] {
            if let Err(why) = check_limit(value) {
                self.fail(&p.key(key), why);
            }
        }
        let one_second = Duration::from_secs(1);
        let session_duration = self.duration(
            &p.key("session_duration"),
            raw.session_duration.take(),
            defaults::SESSION_DURATION,
            one_second,
        );
        let refresh_interval = self.duration(
            &p.key("refresh_interval"),
            raw.refresh_interval.take(),
            defaults::REFRESH_INTERVAL,
            one_second,
        );
        let abandon_text = raw.abandon_after.as_ref().map(|d| d.text.clone());
        let abandon_after = self.duration(
            &p.key("abandon_after"),
            raw.abandon_after.take(),
            defaults::ABANDON_AFTER,
            Duration::ZERO,
        );
        if abandon_after <= refresh_interval {
            let written = abandon_text.map_or_else(
                || format!("the default {}", humantime::format_duration(abandon_after)),
                |t| format!("{t:?}"),
            );
            self.fail(
                &p.key("abandon_after"),
                format!(
                    "must be longer than refresh_interval ({}), or queued visitors are dropped \
                     between two polls; got {written} (a few times refresh_interval is safer)",
                    humantime::format_duration(refresh_interval)
                ),
            );
        }
        (session_duration, refresh_interval, abandon_after)
    }

    /// The queue page's status code and template.
    fn room_page(&mut self, p: &KeyPath, raw: &mut RawRoom) -> (http::StatusCode, Option<PathBuf>) {
        let code = raw.queue_status_code.unwrap_or(defaults::QUEUE_STATUS_CODE);
        let queue_status_code = match u16::try_from(code)
            .ok()
            .filter(|c| (200..=599).contains(c))
            .and_then(|c| http::StatusCode::from_u16(c).ok())
        {
            Some(status) => status,
            None => {
                self.fail(
                    &p.key("queue_status_code"),
                    format!("must be an HTTP status from 200 to 599, got {code}"),
                );
                http::StatusCode::OK
            }
        };
        let template = raw.template.take().and_then(|t| {
            if t.trim().is_empty() {
                self.fail(
                    &p.key("template"),
                    "must be a file path; leave it out for the built-in page",
                );
                None
            } else {
                Some(PathBuf::from(t))
            }
        });
        (queue_status_code, template)
    }

    /// `"auto"` or a shipped language.
    fn room_language(&mut self, p: &KeyPath, raw: Option<String>) -> Language {
        raw.map_or(Language::Auto, |code| {
            Language::parse(code.trim()).unwrap_or_else(|| {
                let codes: Vec<&str> = Lang::ALL.iter().map(|l| l.code()).collect();
                self.fail(
                    &p.key("language"),
                    format!(
                        "{code:?} is not \"auto\" or one of the languages shipped: {}",
                        codes.join(", ")
                    ),
                );
                Language::Auto
            })
        })
    }
}
