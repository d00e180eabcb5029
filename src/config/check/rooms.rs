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
pub(super) const MAX_PROOF_OF_WORK: u64 = 32;

/// Most sessions one item of stock is worth (beyond it the stock caps
/// nothing a room could hold).
const MAX_SESSIONS_PER_ITEM: f64 = 1000.0;

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
    /// the queue page, bypasses, language, events, bot score, autotune. Each step
    /// takes what it checks out of `raw`.
    fn room(&mut self, p: &KeyPath, mut raw: RawRoom, reserved_prefix: &str) -> RoomConfig {
        if let Err(why) = check_id(&raw.id) {
            self.fail(&p.key("id"), format!("{:?} {why}", raw.id));
        }
        let (proof_of_work, captcha, enqueue_token, lanes) = self.room_entry(p, &mut raw);
        let lanes_only_until_ms = self.lanes_only_until(p, raw.lanes_only_until.take(), &lanes);
        let (name, host, path) = self.room_place(p, &mut raw, reserved_prefix);
        let (session_duration, refresh_interval, abandon_after) = self.room_timing(p, &mut raw);
        let (queue_status_code, template) = self.room_page(p, &mut raw);
        let sessions_per_item = self.sessions_per_item(p, raw.sessions_per_item);
        let (bypass_paths, bypass_ips, bypass_header) = self.room_bypasses(p, &mut raw);
        let end_session_paths = self.end_session_paths(p, &mut raw, &path);
        let language = self.room_language(p, raw.language.take());
        let events = self.events(
            p,
            std::mem::take(&mut raw.event),
            !lanes.is_empty(),
            lanes_only_until_ms != 0,
        );
        let failed_challenge = raw.failed_challenge.unwrap_or_default();
        let bot_score = self.bot_score(p, &mut raw, failed_challenge);
        let autotune = self.autotune(p, raw.autotune.take(), raw.new_users_per_minute);
        let origin = raw
            .origin
            .take()
            .map(|o| self.origin_at(&p.key("origin"), o));
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
            sessions_per_item,
            show_stock: raw.show_stock.unwrap_or(false),
            refresh_interval,
            abandon_after,
            queue_status_code,
            json_response: raw.json_response.unwrap_or(true),
            template,
            bypass_paths,
            bypass_ips,
            bypass_header,
            end_session_paths,
            case_insensitive_paths: raw.case_insensitive_paths.unwrap_or(false),
            bypass_upgrades: raw.bypass_upgrades.unwrap_or(false),
            proof_of_work,
            bot_score,
            failed_challenge,
            captcha,
            enqueue_token,
            lanes,
            lanes_only_until_ms,
            state: raw.state.unwrap_or(RoomState::Open),
            language,
            events,
            autotune,
            origin,
        }
    }

    /// `room.sessions_per_item`: more than 0 and at most
    /// [`MAX_SESSIONS_PER_ITEM`]; 1 when absent.
    fn sessions_per_item(&mut self, p: &KeyPath, raw: Option<f64>) -> f64 {
        match raw {
            None => 1.0,
            Some(v) if v > 0.0 && v <= MAX_SESSIONS_PER_ITEM => v,
            Some(v) => {
                self.fail(
                    &p.key("sessions_per_item"),
                    format!("{v} must be more than 0 and at most {MAX_SESSIONS_PER_ITEM} (active sessions one item of stock is worth; 1 unless a buyer takes several)"),
                );
                1.0
            }
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

    /// `room.end_session_paths`: each a path prefix as `path` is (the same
    /// refusals), under the room's own `path` (elsewhere it could never
    /// match a request of the room), and each once.
    fn end_session_paths(
        &mut self,
        p: &KeyPath,
        raw: &mut RawRoom,
        room_path: &str,
    ) -> Vec<String> {
        let fold = raw.case_insensitive_paths.unwrap_or(false);
        // One entry per listed path (`None`: refused), so a duplicate names
        // the index it repeats.
        let mut ends: Vec<Option<String>> = Vec::new();
        let paths = raw.end_session_paths.take().unwrap_or_default();
        for (i, path) in paths.iter().enumerate() {
            let key = p.key("end_session_paths").index(i);
            let canonical = match check_path(path) {
                Ok(canonical) => canonical,
                Err(why) => {
                    self.fail(&key, format!("{path:?} {why}"));
                    ends.push(None);
                    continue;
                }
            };
            let same = |e: &Option<String>| {
                e.as_deref().is_some_and(|e| {
                    if fold {
                        e.eq_ignore_ascii_case(&canonical)
                    } else {
                        e == canonical
                    }
                })
            };
            if !crate::canonical::covers(room_path, &canonical, fold) {
                self.fail(
                    &key,
                    format!(
                        "{path:?} is not under the room's path {room_path:?}, so no request of this room can reach it"
                    ),
                );
                ends.push(None);
            } else if let Some(j) = ends.iter().position(same) {
                self.fail(
                    &key,
                    format!("{path:?} is listed twice (also end_session_paths[{j}]); name each path once"),
                );
                ends.push(None);
            } else {
                ends.push(Some(canonical));
            }
        }
        ends.into_iter().flatten().collect()
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

#[cfg(test)]
mod tests {
    use crate::config::check::tests::{refusals, with};
    use crate::i18n::Lang;

    fn room(keys: &str) -> Vec<String> {
        refusals(&with("room", keys))
    }

    /// A second room after the minimal one, with `keys`.
    fn two_rooms(keys: &str) -> Vec<String> {
        let limits = "total_active_users = 10\nnew_users_per_minute = 60";
        refusals(&format!("{}[[room]]\n{limits}\n{keys}\n", with("room", "")))
    }

    #[test]
    fn there_is_at_least_one_room() {
        assert_eq!(
            refusals("[origin]\nurl = \"http://127.0.0.1:3000\"\n"),
            ["room: at least one [[room]] is required (a daemon without rooms protects nothing)"]
        );
    }

    #[test]
    fn end_session_paths_are_paths_under_the_room_each_once() {
        let shop = |ends: &str| room(&format!("path = \"/shop\"\nend_session_paths = {ends}"));
        assert!(shop(r#"["/shop/order/complete", "/shop/thanks/"]"#).is_empty());
        assert!(shop("[]").is_empty());
        assert_eq!(
            shop(r#"["/shop/ok", "order/complete"]"#),
            [r#"room[0].end_session_paths[1]: "order/complete" must start with /"#]
        );
        assert_eq!(
            shop(r#"["/shop/a b", "/shop/x?y", "/shop/../../etc"]"#),
            [
                r#"room[0].end_session_paths[0]: "/shop/a b" must be a plain path prefix without spaces, ? or #"#,
                r#"room[0].end_session_paths[1]: "/shop/x?y" must be a plain path prefix without spaces, ? or #"#,
                r#"room[0].end_session_paths[2]: "/shop/../../etc" cannot be matched: the path climbs above the root"#,
            ]
        );
        assert_eq!(
            shop(r#"["/order/complete", "/shopping/done"]"#),
            [
                r#"room[0].end_session_paths[0]: "/order/complete" is not under the room's path "/shop", so no request of this room can reach it"#,
                r#"room[0].end_session_paths[1]: "/shopping/done" is not under the room's path "/shop", so no request of this room can reach it"#,
            ]
        );
        // Spellings of one path are one path.
        assert_eq!(
            shop(r#"["/shop/done", "/shop//%64one", "/shop/./done"]"#),
            [
                r#"room[0].end_session_paths[1]: "/shop//%64one" is listed twice (also end_session_paths[0]); name each path once"#,
                r#"room[0].end_session_paths[2]: "/shop/./done" is listed twice (also end_session_paths[0]); name each path once"#,
            ]
        );
        // Ignoring case, when the room's paths are matched so.
        let folded = room(
            "path = \"/shop\"\ncase_insensitive_paths = true\nend_session_paths = [\"/SHOP/Done\", \"/shop/done\"]",
        );
        assert_eq!(
            folded,
            [
                r#"room[0].end_session_paths[1]: "/shop/done" is listed twice (also end_session_paths[0]); name each path once"#
            ]
        );
    }

    #[test]
    fn rooms_differ_in_id_and_in_host_and_path() {
        assert_eq!(
            two_rooms("id = \"shop\"\npath = \"/other\""),
            [r#"room[1].id: duplicate room id "shop"; room[0] has it too, ids must be unique"#]
        );
        assert_eq!(
            two_rooms("id = \"other\"\npath = \"/\""),
            [
                r#"room[1].path: "/" on any host is also room[0]'s host and path; each room needs its own"#
            ]
        );
        let on_host = format!(
            "{}[[room]]\nid = \"b\"\nhost = \"Shop.Example\"\npath = \"/\"\ntotal_active_users = 1\nnew_users_per_minute = 1\n",
            with("room", "host = \"shop.example\"")
        );
        assert_eq!(
            refusals(&on_host),
            [
                r#"room[1].path: "/" on shop.example is also room[0]'s host and path; each room needs its own"#
            ]
        );
        // The same path on another host is another room.
        assert!(two_rooms("id = \"other\"\npath = \"/\"\nhost = \"b.example\"").is_empty());
    }

    #[test]
    fn the_id_and_name_are_checked() {
        assert_eq!(
            room("id = \"Shop\""),
            [r#"room[0].id: "Shop" must be 1 to 64 characters of a-z, 0-9, _ and -"#]
        );
        let long = "n".repeat(201);
        // As TOML writes them, and as the message quotes them.
        for (written, name) in [
            ("\" \"", " "),
            ("\"a\\u0007b\"", "a\u{7}b"),
            (&format!("{long:?}"), &long),
        ] {
            assert_eq!(
                room(&format!("name = {written}")),
                [format!(
                    "room[0].name: {name:?} must be 1 to 200 characters without control characters"
                )]
            );
        }
    }

    #[test]
    fn proof_of_work_is_at_most_32_bits() {
        assert_eq!(
            room("proof_of_work = 33"),
            ["room[0].proof_of_work: 33 is out of range: 0 (off) to 32 bits; 16 to 20 takes a browser a few hundred milliseconds"]
        );
    }

    #[test]
    fn host_and_path_are_matchable_and_outside_the_reserved_prefix() {
        assert_eq!(
            room("host = \"shop.example:443\""),
            [
                r#"room[0].host: "shop.example:443" must not contain a port; rooms match the Host header without its port"#
            ]
        );
        assert_eq!(
            room("path = \"shop\""),
            [r#"room[0].path: "shop" must start with /"#]
        );
        assert_eq!(
            room("path = \"/__waitroom/x\""),
            [
                r#"room[0].path: "/__waitroom/x" is under server.reserved_prefix "/__waitroom/", which the daemon answers itself"#
            ]
        );
    }

    #[test]
    fn limits_are_within_what_the_stores_count() {
        assert_eq!(
            room("total_active_users = 0"),
            [
                r#"room[0].total_active_users: must be at least 1, got 0 (to stop admissions, set state = "paused")"#
            ]
        );
        assert_eq!(
            room("new_users_per_minute = 1000000001"),
            ["room[0].new_users_per_minute: must be at most 1000000000, got 1000000001"]
        );
    }

    #[test]
    fn sessions_and_polls_are_at_least_a_second() {
        for key in ["session_duration", "refresh_interval"] {
            assert_eq!(
                room(&format!("{key} = \"999ms\"")),
                [format!("room[0].{key}: must be at least 1s, got \"999ms\"")]
            );
        }
    }

    #[test]
    fn abandon_after_outlasts_a_poll() {
        let why = |refresh: &str, got: &str| {
            format!("room[0].abandon_after: must be longer than refresh_interval ({refresh}), or queued visitors are dropped between two polls; got {got} (a few times refresh_interval is safer)")
        };
        assert_eq!(room("abandon_after = \"20s\""), [why("20s", "\"20s\"")]);
        assert_eq!(
            room("refresh_interval = \"2m\""),
            [why("2m", "the default 2m")]
        );
    }

    #[test]
    fn the_queue_page_has_a_status_and_a_template() {
        for code in [199, 600] {
            assert_eq!(
                room(&format!("queue_status_code = {code}")),
                [format!(
                    "room[0].queue_status_code: must be an HTTP status from 200 to 599, got {code}"
                )]
            );
        }
        assert_eq!(
            room("template = \" \""),
            ["room[0].template: must be a file path; leave it out for the built-in page"]
        );
    }

    #[test]
    fn the_language_is_auto_or_shipped() {
        let shipped: Vec<&str> = Lang::ALL.iter().map(|l| l.code()).collect();
        assert_eq!(
            room("language = \"xx\""),
            [format!(
                "room[0].language: \"xx\" is not \"auto\" or one of the languages shipped: {}",
                shipped.join(", ")
            )]
        );
    }
}
