//! A room's `[room.autotune]`: the thresholds, the floor and ceiling of
//! the rate, the step and the interval.

use std::time::Duration;

use super::values::check_limit;
use super::Checker;
use crate::config::keypath::KeyPath;
use crate::config::raw::RawAutotune;
use crate::config::AutotuneConfig;

/// Defaults of the keys one may leave out.
const LATENCY: Duration = Duration::from_secs(2);
const SLOW_SHARE: f64 = 0.02;
const ERROR_SHARE: f64 = 0.05;
const STEP: f64 = 0.1;
const INTERVAL: Duration = Duration::from_secs(30);
const MIN_REQUESTS: u64 = 20;

/// Shortest interval: a move needs requests to judge the origin by, and
/// every instance reads the stored rate within a second.
const MIN_INTERVAL: Duration = Duration::from_secs(1);

impl Checker<'_, '_> {
    /// `[room.autotune]` of a room whose rate is `rate` (0: unlimited).
    pub(super) fn autotune(
        &mut self,
        room: &KeyPath,
        raw: Option<RawAutotune>,
        rate: u64,
    ) -> Option<AutotuneConfig> {
        let raw = raw?;
        let p = room.key("autotune");
        if rate == 0 {
            self.fail(
                &p,
                "needs a room with a rate: set new_users_per_minute (autotune moves it between floor and ceiling)",
            );
        }
        let latency = self.duration(
            &p.key("latency"),
            raw.latency,
            LATENCY,
            Duration::from_millis(1),
        );
        let slow_share = self.share(&p.key("slow_share"), raw.slow_share, SLOW_SHARE);
        let error_share = self.share(&p.key("error_share"), raw.error_share, ERROR_SHARE);
        for (key, value) in [("floor", raw.floor), ("ceiling", raw.ceiling)] {
            if let Err(why) = check_limit(value) {
                self.fail(&p.key(key), why);
            }
        }
        if raw.floor > raw.ceiling {
            self.fail(
                &p.key("floor"),
                format!(
                    "{} must not be above ceiling {} (the rate moves between them)",
                    raw.floor, raw.ceiling
                ),
            );
        }
        let step = self.share(&p.key("step"), raw.step, STEP);
        let interval = self.duration(&p.key("interval"), raw.interval, INTERVAL, MIN_INTERVAL);
        let min_requests = match raw.min_requests {
            Some(0) => {
                self.fail(&p.key("min_requests"), "must be at least 1, got 0");
                MIN_REQUESTS
            }
            Some(n) => n,
            None => MIN_REQUESTS,
        };
        Some(AutotuneConfig {
            latency,
            slow_share,
            error_share,
            floor: raw.floor,
            ceiling: raw.ceiling,
            step,
            interval,
            min_requests,
        })
    }

    /// A share: more than 0 and at most 1; `default` when absent.
    fn share(&mut self, p: &KeyPath, raw: Option<f64>, default: f64) -> f64 {
        match raw {
            None => default,
            Some(v) if v > 0.0 && v <= 1.0 => v,
            Some(v) => {
                self.fail(
                    p,
                    format!("{v} must be more than 0 and at most 1 (a share: 0.05 is 5%)"),
                );
                default
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::check::tests::{overlay, refusals, with};

    /// A room of 60 a minute with `[room.autotune]` from 10 to 100, and
    /// `keys` besides (a key given replaces the one here).
    fn autotune(room: &str, keys: &str) -> Vec<String> {
        let table = overlay("floor = 10\nceiling = 100", keys);
        refusals(&format!("{}[room.autotune]\n{table}\n", with("room", room)))
    }

    #[test]
    fn a_plain_autotune_is_taken_with_its_defaults() {
        assert!(autotune("", "").is_empty());
        let src = format!(
            "{}[room.autotune]\nfloor = 10\nceiling = 100\n",
            with("room", "")
        );
        let c =
            crate::config::from_toml_str_with(&src, crate::config::LoadOptions::default(), &|n| {
                (n == "WAITROOM_COOKIE_KEYS").then(|| super::super::tests::KEY.to_owned())
            })
            .expect("accepted");
        let a = c.rooms[0].autotune.clone().expect("autotune on");
        assert_eq!(a.latency, std::time::Duration::from_secs(2));
        assert_eq!((a.slow_share, a.error_share, a.step), (0.02, 0.05, 0.1));
        assert_eq!(a.interval, std::time::Duration::from_secs(30));
        assert_eq!((a.floor, a.ceiling, a.min_requests), (10, 100, 20));
        assert_eq!(a.step_users(), 10);
    }

    #[test]
    fn floor_is_not_above_ceiling() {
        assert_eq!(
            autotune("", "floor = 200"),
            ["room[0].autotune.floor: 200 must not be above ceiling 100 (the rate moves between them)"]
        );
        assert_eq!(
            autotune("", "floor = 0"),
            [
                r#"room[0].autotune.floor: must be at least 1, got 0 (to stop admissions, set state = "paused")"#
            ]
        );
    }

    #[test]
    fn shares_and_step_are_within_0_and_1() {
        for key in ["slow_share", "error_share", "step"] {
            for bad in ["0", "-0.1", "1.5"] {
                assert_eq!(
                    autotune("", &format!("{key} = {bad}")),
                    [format!("room[0].autotune.{key}: {bad} must be more than 0 and at most 1 (a share: 0.05 is 5%)")]
                );
            }
            assert!(autotune("", &format!("{key} = 1")).is_empty());
        }
    }

    #[test]
    fn interval_is_at_least_a_second() {
        assert_eq!(
            autotune("", "interval = \"500ms\""),
            [r#"room[0].autotune.interval: must be at least 1s, got "500ms""#]
        );
        assert_eq!(
            autotune("", "min_requests = 0"),
            ["room[0].autotune.min_requests: must be at least 1, got 0"]
        );
    }

    #[test]
    fn a_room_without_a_rate_is_not_autotuned() {
        assert_eq!(
            autotune("new_users_per_minute = 0", ""),
            [r#"room[0].new_users_per_minute: must be at least 1, got 0 (to stop admissions, set state = "paused")"#,
             "room[0].autotune: needs a room with a rate: set new_users_per_minute (autotune moves it between floor and ceiling)"]
        );
    }
}
