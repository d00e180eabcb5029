//! `[[room]]`: each room's keys, and what must differ between rooms.
//! `room` calls the checks of the room's captcha, bypass header, token,
//! lanes and events, each in its own file.

use std::path::PathBuf;
use std::time::Duration;

use super::values::{check_host, check_id, check_limit, check_path};
use super::{defaults, root, Checker};
use crate::config::keypath::KeyPath;
use crate::config::raw::{raw_captcha, RawRoom};
use crate::config::{BotScore, FailedChallenge, RoomConfig};
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

    fn room(&mut self, p: &KeyPath, mut raw: RawRoom, reserved_prefix: &str) -> RoomConfig {
        if let Err(why) = check_id(&raw.id) {
            self.fail(&p.key("id"), format!("{:?} {why}", raw.id));
        }
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
        let captcha = self.captcha(p, &mut raw_captcha(&mut raw), proof_of_work);
        let enqueue_token = raw
            .enqueue_token
            .take()
            .and_then(|t| self.enqueue_token(&p.key("enqueue_token"), &raw.id, t));
        let lanes = self.lanes(p, std::mem::take(&mut raw.lane), enqueue_token.is_some());
        let name = raw.name.unwrap_or_else(|| raw.id.clone());
        if name.trim().is_empty()
            || name.chars().count() > 200
            || name.chars().any(char::is_control)
        {
            self.fail(
                &p.key("name"),
                format!("{name:?} must be 1 to 200 characters without control characters"),
            );
        }
        let host = raw.host.and_then(|h| match check_host(&h) {
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
            raw.session_duration,
            defaults::SESSION_DURATION,
            one_second,
        );
        let refresh_interval = self.duration(
            &p.key("refresh_interval"),
            raw.refresh_interval,
            defaults::REFRESH_INTERVAL,
            one_second,
        );
        let abandon_text = raw.abandon_after.as_ref().map(|d| d.text.clone());
        let abandon_after = self.duration(
            &p.key("abandon_after"),
            raw.abandon_after,
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
        let template = raw.template.and_then(|t| {
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
        let mut bypass_paths = Vec::new();
        for (i, path) in raw.bypass_paths.unwrap_or_default().iter().enumerate() {
            match check_path(path) {
                Ok(canonical) => bypass_paths.push(canonical),
                Err(why) => self.fail(&p.key("bypass_paths").index(i), format!("{path:?} {why}")),
            }
        }
        let bypass_ips = self.nets(&p.key("bypass_ips"), raw.bypass_ips);
        let bypass_header = raw
            .bypass_header
            .and_then(|h| self.bypass_header(&p.key("bypass_header"), h));
        let language = raw.language.map_or(Language::Auto, |code| {
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
        });
        let events = self.events(p, raw.event);
        let failed_challenge = raw.failed_challenge.unwrap_or_default();
        let bot_score = match (raw.bot_score_header, raw.min_bot_score) {
            (None, None) => None,
            (Some(header), Some(min)) => {
                let name = http::HeaderName::from_bytes(header.as_bytes()).ok();
                if name.is_none() {
                    self.fail(
                        &p.key("bot_score_header"),
                        format!("{header:?} is not a valid HTTP header name"),
                    );
                }
                if !(1..=99).contains(&min) {
                    self.fail(
                        &p.key("min_bot_score"),
                        format!("{min} is out of range: 1 to 99 (scores below it are bots)"),
                    );
                }
                if failed_challenge == FailedChallenge::Retry {
                    self.fail(
                        &p.key("failed_challenge"),
                        "bot_score_header sends the visitors it names to the shadow queue: set failed_challenge = \"shadow\" (or \"log\" to count them first)",
                    );
                }
                name.map(|header| BotScore {
                    header,
                    min: min.clamp(1, 99) as u8,
                })
            }
            (Some(_), None) => {
                self.fail(
                    &p.key("min_bot_score"),
                    "missing: bot_score_header needs the score below which a visitor is a bot",
                );
                None
            }
            (None, Some(_)) => {
                self.fail(
                    &p.key("bot_score_header"),
                    "missing: min_bot_score needs the header a trusted proxy puts the score in",
                );
                None
            }
        };
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
}
