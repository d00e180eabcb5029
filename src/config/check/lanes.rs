//! A room's priority lanes (`[[room.lane]]`): their names and shares, and
//! the codes or token claim that enter each.

use super::Checker;
use crate::config::keypath::KeyPath;
use crate::config::raw::{RawLane, RawTime};
use crate::config::LaneConfig;
use crate::domain::MAX_LANES;

/// The shortest lane code `waitroom check` takes.
pub(super) const MIN_CODE_CHARS: usize = 8;

impl Checker<'_, '_> {
    /// `lanes_only_until`: the end of a presale window, in ms since the
    /// epoch (0: none). It needs a lane to let in before it.
    pub(super) fn lanes_only_until(
        &mut self,
        p: &KeyPath,
        raw: Option<RawTime>,
        lanes: &[LaneConfig],
    ) -> u64 {
        let Some(RawTime(at)) = raw else {
            return 0;
        };
        if lanes.is_empty() {
            self.fail(
                &p.key("lanes_only_until"),
                format!(
                    "{} needs at least one [[room.lane]]: before it only lanes are let in",
                    humantime::format_rfc3339(at)
                ),
            );
            return 0;
        }
        at.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

impl Checker<'_, '_> {
    /// `[[room.lane]]`: at most `MAX_LANES`, names unique, shares adding
    /// up to at most 1, each with a way in; every code in one lane only.
    pub(super) fn lanes(
        &mut self,
        p: &KeyPath,
        raw: Vec<RawLane>,
        tokens: bool,
    ) -> Vec<LaneConfig> {
        use std::collections::HashSet;
        if raw.len() > MAX_LANES {
            self.fail(
                &p.key("lane"),
                format!("{} lanes; a room has at most {MAX_LANES}", raw.len()),
            );
        }
        let mut lanes: Vec<LaneConfig> = Vec::new();
        let mut seen_codes: HashSet<u64> = HashSet::new();
        for (i, raw) in raw.into_iter().enumerate().take(MAX_LANES) {
            let p = p.key("lane").index(i);
            let name_ok = (1..=32).contains(&raw.name.len())
                && raw.name.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'
                });
            if !name_ok {
                self.fail(
                    &p.key("name"),
                    format!(
                        "{:?} must be 1 to 32 characters of a-z, 0-9, _ and -",
                        raw.name
                    ),
                );
            } else if raw.name == "general" || lanes.iter().any(|l| l.name == raw.name) {
                self.fail(
                    &p.key("name"),
                    format!(
                        "{:?} is taken (\"general\" is the room's own queue)",
                        raw.name
                    ),
                );
            }
            let share = (raw.share * 1000.0).round();
            if !(raw.share > 0.0 && raw.share <= 1.0 && share >= 1.0) {
                self.fail(
                    &p.key("share"),
                    format!("{} must be more than 0 and at most 1 (0.3: 30% of admissions while the lanes wait)", raw.share),
                );
            }
            let mut lane = LaneConfig {
                name: raw.name,
                share: share.clamp(1.0, 1000.0) as u16,
                codes: HashSet::new(),
                single_use: HashSet::new(),
                token_claim: raw.token_claim.unwrap_or(false),
            };
            // Each problem once: a way in that is named but broken is
            // reported as broken, not also as empty or as missing.
            let named =
                raw.codes_env.is_some() || raw.single_use_codes_file.is_some() || lane.token_claim;
            if let Some(var) = raw.codes_env {
                let path = p.key("codes_env");
                if let Some(var) = self.env_name(&path, Some(var), "") {
                    match self.env_value(&var) {
                        Some(v) => {
                            self.long_codes(&path, v.split(','));
                            lane.codes.extend(codes_in(v.split(',')));
                            if lane.codes.is_empty() {
                                self.fail(&path, format!("{var} holds no code"));
                            }
                        }
                        None => self.fail(
                            &path,
                            format!(
                                "environment variable {var} is not set; it holds the lane's codes"
                            ),
                        ),
                    }
                }
            }
            if let Some(file) = raw.single_use_codes_file {
                let path = p.key("single_use_codes_file");
                match std::fs::read_to_string(&file) {
                    Ok(text) => {
                        self.long_codes(&path, text.lines());
                        lane.single_use.extend(codes_in(text.lines()));
                        if lane.single_use.is_empty() {
                            self.fail(&path, format!("{file} holds no code"));
                        }
                    }
                    Err(e) => self.fail(&path, format!("cannot read {file}: {e}")),
                }
            }
            if lane.token_claim && !tokens {
                self.fail(
                    &p.key("token_claim"),
                    "needs [room.enqueue_token]: the claim is read from a verified token",
                );
            }
            if !named {
                self.fail(
                    &p,
                    "no way in: give codes_env, single_use_codes_file or token_claim = true",
                );
            }
            for code in lane.codes.iter().chain(&lane.single_use) {
                if !seen_codes.insert(*code) {
                    self.fail(&p, "a code is given twice (in this lane or another): each code enters one lane, once");
                    break;
                }
            }
            lanes.push(lane);
        }
        let total: u32 = lanes.iter().map(|l| u32::from(l.share)).sum();
        if total > 1000 {
            self.fail(
                &p.key("lane"),
                format!(
                    "the lanes' shares add up to {}; at most 1 (the general queue gets the rest)",
                    f64::from(total) / 1000.0
                ),
            );
        }
        lanes
    }

    /// Refuses lane codes shorter than [`MIN_CODE_CHARS`]: a short code is
    /// found by guessing (each guess costs an address one of its refused
    /// codes, `gate::lanes`). The message names no code.
    fn long_codes<'a>(&mut self, path: &KeyPath, items: impl Iterator<Item = &'a str>) {
        let short = items
            .map(str::trim)
            .filter(|c| !c.is_empty() && !c.starts_with('#'))
            .filter(|c| c.chars().count() < MIN_CODE_CHARS)
            .count();
        if short > 0 {
            self.fail(
                path,
                format!("holds {short} code(s) shorter than {MIN_CODE_CHARS} characters: a short code is guessed; use at least {MIN_CODE_CHARS} random letters and digits"),
            );
        }
    }
}

/// The codes of a list (a variable's, a file's lines): trimmed, without
/// blanks and `#` comments, as digests.
fn codes_in<'a>(items: impl Iterator<Item = &'a str>) -> Vec<u64> {
    items
        .map(str::trim)
        .filter(|c| !c.is_empty() && !c.starts_with('#'))
        .map(crate::domain::digest64)
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::config::check::tests::{file, refusals, refusals_with, with};

    /// The minimal configuration with `tables` (`[[room.lane]]`,
    /// `[room.enqueue_token]`) in its room.
    fn room_with(tables: &str) -> String {
        format!("{}{tables}\n", with("room", ""))
    }

    /// A lane named `name` with `share`, its codes in the variable `var`.
    fn lane(name: &str, share: f64, var: &str) -> String {
        format!("[[room.lane]]\nname = {name:?}\nshare = {share}\ncodes_env = {var:?}\n")
    }

    const NO_WAY_IN: &str =
        "room[0].lane[0]: no way in: give codes_env, single_use_codes_file or token_claim = true";

    #[test]
    fn a_room_has_at_most_4_lanes() {
        let lanes: String = (0..5)
            .map(|i| lane(&format!("l{i}"), 0.2, &format!("CODES{i}")))
            .collect();
        let vars: Vec<(String, String)> = (0..5)
            .map(|i| (format!("CODES{i}"), format!("lane-{i}-code")))
            .collect();
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            refusals_with(&room_with(&lanes), &vars),
            ["room[0].lane: 5 lanes; a room has at most 4"]
        );
    }

    #[test]
    fn lane_names_are_short_unique_and_not_general() {
        let vars = [("VIP", "vip-code-1"), ("VIP2", "vip-code-2")];
        assert_eq!(
            refusals_with(&room_with(&lane("VIP", 0.2, "VIP")), &vars),
            [r#"room[0].lane[0].name: "VIP" must be 1 to 32 characters of a-z, 0-9, _ and -"#]
        );
        assert_eq!(
            refusals_with(&room_with(&lane("general", 0.2, "VIP")), &vars),
            [r#"room[0].lane[0].name: "general" is taken ("general" is the room's own queue)"#]
        );
        let twice = format!("{}{}", lane("vip", 0.2, "VIP"), lane("vip", 0.2, "VIP2"));
        assert_eq!(
            refusals_with(&room_with(&twice), &vars),
            [r#"room[0].lane[1].name: "vip" is taken ("general" is the room's own queue)"#]
        );
    }

    #[test]
    fn a_share_is_more_than_0_and_at_most_1() {
        for share in [0.0, 1.5, 0.0004] {
            assert_eq!(
                refusals_with(&room_with(&lane("vip", share, "VIP")), &[("VIP", "vip-code-1")]),
                [format!("room[0].lane[0].share: {share} must be more than 0 and at most 1 (0.3: 30% of admissions while the lanes wait)")]
            );
        }
        let two = format!("{}{}", lane("a", 0.6, "A"), lane("b", 0.5, "B"));
        assert_eq!(
            refusals_with(&room_with(&two), &[("A", "a-code-one"), ("B", "b-code-one")]),
            ["room[0].lane: the lanes' shares add up to 1.1; at most 1 (the general queue gets the rest)"]
        );
    }

    #[test]
    fn the_codes_variable_is_set_and_holds_long_codes() {
        let src = room_with(&lane("vip", 0.2, "VIP"));
        assert_eq!(
            refusals(&src),
            ["room[0].lane[0].codes_env: environment variable VIP is not set; it holds the lane's codes"]
        );
        assert_eq!(
            refusals_with(&src, &[("VIP", "# none yet")]),
            ["room[0].lane[0].codes_env: VIP holds no code"]
        );
        assert_eq!(
            refusals_with(&src, &[("VIP", "short, long-enough, 1234567")]),
            ["room[0].lane[0].codes_env: holds 2 code(s) shorter than 8 characters: a short code is guessed; use at least 8 random letters and digits"]
        );
        assert_eq!(
            refusals(&room_with(&lane("vip", 0.2, "1VIP"))),
            [
                r#"room[0].lane[0].codes_env: "1VIP" is not an environment variable name (letters, digits and _, not starting with a digit)"#
            ]
        );
    }

    #[test]
    fn the_single_use_file_is_readable_and_holds_long_codes() {
        let at = |path: &str| {
            room_with(&format!(
                "[[room.lane]]\nname = \"vip\"\nshare = 0.2\nsingle_use_codes_file = {path:?}"
            ))
        };
        let key = "room[0].lane[0].single_use_codes_file";
        let (_dir, empty) = file("# none yet\n\n");
        assert_eq!(
            refusals(&at(&empty)),
            [format!("{key}: {empty} holds no code")]
        );
        let (_dir, short) = file("one-long-code\nshort\n");
        assert_eq!(
            refusals(&at(&short)),
            [format!("{key}: holds 1 code(s) shorter than 8 characters: a short code is guessed; use at least 8 random letters and digits")]
        );
        let missing = format!("{empty}.missing");
        assert_eq!(
            refusals(&at(&missing)),
            [format!(
                "{key}: cannot read {missing}: No such file or directory (os error 2)"
            )]
        );
    }

    #[test]
    fn a_lane_has_a_way_in_and_codes_of_its_own() {
        let bare = "[[room.lane]]\nname = \"vip\"\nshare = 0.2\n";
        assert_eq!(refusals(&room_with(bare)), [NO_WAY_IN]);
        assert_eq!(
            refusals(&room_with(&format!("{bare}token_claim = true"))),
            ["room[0].lane[0].token_claim: needs [room.enqueue_token]: the claim is read from a verified token"]
        );
        let two = format!("{}{}", lane("a", 0.2, "A"), lane("b", 0.2, "B"));
        assert_eq!(
            refusals_with(&room_with(&two), &[("A", "same-code-1"), ("B", "same-code-1")]),
            ["room[0].lane[1]: a code is given twice (in this lane or another): each code enters one lane, once"]
        );
    }
}
