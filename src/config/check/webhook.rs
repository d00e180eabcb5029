//! `[[webhook]]`: the URL, the signing secret, the kinds and rooms sent,
//! and the limits of delivery (docs/webhooks.md).

use std::time::Duration;

use super::{root, Checker};
use crate::config::keypath::KeyPath;
use crate::config::raw::{RawDuration, RawWebhook};
use crate::config::{RoomConfig, Secret};
use crate::webhook::{self, Kind, WebhookConfig};

/// The shortest signing secret, in bytes.
const MIN_SECRET: usize = 16;
/// `timeout`'s bounds, and as operators write them.
const TIMEOUT: (Duration, Duration, &str) = (
    Duration::from_millis(100),
    Duration::from_secs(60),
    "between 100ms and 60s",
);
/// `batch`'s bounds, and as operators write them.
const BATCH: (Duration, Duration, &str) = (
    Duration::from_secs(1),
    Duration::from_secs(5 * 60),
    "between 1s and 5m",
);
const MAX_ATTEMPTS: u64 = 20;
const MAX_BUFFER: u64 = 1_000_000;

impl Checker<'_, '_> {
    /// Every `[[webhook]]`, against the rooms configured.
    pub(super) fn webhooks(
        &mut self,
        raw: Vec<RawWebhook>,
        rooms: &[RoomConfig],
    ) -> Vec<WebhookConfig> {
        let mut hooks: Vec<WebhookConfig> = Vec::with_capacity(raw.len());
        for (i, raw) in raw.into_iter().enumerate() {
            let p = root().key("webhook").index(i);
            let Some(hook) = self.webhook(&p, raw, rooms) else {
                continue;
            };
            if let Some(j) = hooks.iter().position(|h| h.url == hook.url) {
                self.fail(
                    &p.key("url"),
                    format!(
                        "{:?} is webhook[{j}]'s URL too; one webhook per URL",
                        hook.url.to_string()
                    ),
                );
            }
            hooks.push(hook);
        }
        hooks
    }

    fn webhook(
        &mut self,
        p: &KeyPath,
        raw: RawWebhook,
        rooms: &[RoomConfig],
    ) -> Option<WebhookConfig> {
        let url = self.webhook_url(&p.key("url"), &raw.url);
        let secret = self.webhook_secret(p, raw.secret, raw.secret_env);
        let events = self.webhook_events(&p.key("events"), raw.events);
        let rooms = self.webhook_rooms(&p.key("rooms"), raw.rooms, rooms);
        let timeout = self.bounded(
            &p.key("timeout"),
            raw.timeout,
            webhook::DEFAULT_TIMEOUT,
            TIMEOUT,
        );
        let batch = self.bounded(&p.key("batch"), raw.batch, webhook::DEFAULT_BATCH, BATCH);
        let max_attempts = self.count(
            &p.key("max_attempts"),
            raw.max_attempts,
            webhook::DEFAULT_MAX_ATTEMPTS.into(),
            MAX_ATTEMPTS,
        );
        let buffer = self.count(
            &p.key("buffer"),
            raw.buffer,
            webhook::DEFAULT_BUFFER as u64,
            MAX_BUFFER,
        );
        Some(WebhookConfig {
            url: url?,
            secret: secret?,
            events,
            rooms,
            timeout,
            max_attempts: max_attempts as u32,
            buffer: buffer as usize,
            batch,
        })
    }

    fn webhook_url(&mut self, p: &KeyPath, text: &str) -> Option<http::Uri> {
        let parsed = text.parse::<http::Uri>().ok().filter(|u| {
            matches!(u.scheme_str(), Some("http" | "https"))
                && u.host().is_some_and(|h| !h.is_empty())
        });
        let Some(url) = parsed else {
            self.fail(
                p,
                format!("{text:?} is not an http:// or https:// URL with a host"),
            );
            return None;
        };
        if url.authority().is_some_and(|a| a.as_str().contains('@')) {
            self.fail(
                p,
                format!("{text:?} holds a user or password; leave them out (the receiver checks the signature)"),
            );
            return None;
        }
        Some(url)
    }

    /// `secret` inline or the variable `secret_env` names: one of them.
    fn webhook_secret(
        &mut self,
        p: &KeyPath,
        inline: Option<String>,
        env: Option<String>,
    ) -> Option<Secret> {
        let (value, path, source) = match (inline, env) {
            (Some(_), Some(_)) => {
                self.fail(&p.key("secret"), "give secret or secret_env, not both");
                return None;
            }
            (None, None) => {
                self.fail(
                    &p.key("secret"),
                    format!("missing: the signing secret, at least {MIN_SECRET} bytes (or secret_env, the environment variable that holds it)"),
                );
                return None;
            }
            (Some(value), None) => (value, p.key("secret"), String::new()),
            (None, Some(name)) => {
                let path = p.key("secret_env");
                let var = self.env_name(&path, Some(name), "")?;
                let Some(value) = self.env_value(&var) else {
                    self.fail(
                        &path,
                        format!("environment variable {var} is not set; it holds the webhook's signing secret"),
                    );
                    return None;
                };
                (value, path, format!("the secret in {var} "))
            }
        };
        if value.len() < MIN_SECRET {
            self.fail(
                &path,
                format!(
                    "{source}must be at least {MIN_SECRET} bytes, got {}",
                    value.len()
                ),
            );
            return None;
        }
        Some(Secret(value))
    }

    fn webhook_events(&mut self, p: &KeyPath, raw: Option<Vec<String>>) -> Vec<Kind> {
        let Some(names) = raw else {
            return Kind::ALL.to_vec();
        };
        if names.is_empty() {
            self.fail(
                p,
                "must name at least one kind (leave it out for every kind)",
            );
        }
        let mut kinds = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            match Kind::from_name(name) {
                Some(kind) if !kinds.contains(&kind) => kinds.push(kind),
                Some(_) => {}
                None => {
                    let known: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
                    self.fail(
                        &p.index(i),
                        format!("unknown kind {name:?}; the kinds are {}", known.join(", ")),
                    );
                }
            }
        }
        kinds
    }

    fn webhook_rooms(
        &mut self,
        p: &KeyPath,
        raw: Option<Vec<String>>,
        rooms: &[RoomConfig],
    ) -> Option<Vec<String>> {
        let ids = raw?;
        if ids.is_empty() {
            self.fail(
                p,
                "must name at least one room (leave it out for every room)",
            );
        }
        for (i, id) in ids.iter().enumerate() {
            if !rooms.iter().any(|r| r.id == *id) {
                let known: Vec<&str> = rooms.iter().map(|r| r.id.as_str()).collect();
                self.fail(
                    &p.index(i),
                    format!(
                        "{id:?} is not a room's id; the rooms are {}",
                        known.join(", ")
                    ),
                );
            }
        }
        Some(ids)
    }

    /// A duration within `(min, max, as written)`; `default` when absent.
    pub(super) fn bounded(
        &mut self,
        p: &KeyPath,
        raw: Option<RawDuration>,
        default: Duration,
        (min, max, range): (Duration, Duration, &str),
    ) -> Duration {
        match raw {
            None => default,
            Some(d) if (min..=max).contains(&d.value) => d.value,
            Some(d) => {
                self.fail(p, format!("must be {range}, got {:?}", d.text));
                default
            }
        }
    }

    /// A count from 1 to `max`; `default` when absent.
    fn count(&mut self, p: &KeyPath, raw: Option<u64>, default: u64, max: u64) -> u64 {
        match raw {
            None => default,
            Some(n) if (1..=max).contains(&n) => n,
            Some(n) => {
                self.fail(p, format!("must be between 1 and {max}, got {n}"));
                default
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::check::tests::{overlay, refusals_with, with};
    use crate::config::{from_toml_str_with, LoadOptions, WebhookKind};

    const SECRET: &str = "0123456789abcdef";

    /// The minimal configuration (one room, `shop`) with a webhook of
    /// `keys` (a key given replaces the valid one here).
    fn hook(keys: &str) -> String {
        let valid = format!("url = \"https://hooks.example/in\"\nsecret = \"{SECRET}\"");
        format!(
            "{}[[webhook]]\n{}\n",
            with("room", ""),
            overlay(&valid, keys)
        )
    }

    fn refusals(src: &str) -> Vec<String> {
        refusals_with(src, &[("HOOK_SECRET", "a secret of 24 bytes....")])
    }

    #[test]
    fn a_plain_webhook_is_taken_with_its_defaults() {
        let env = |name: &str| {
            (name == "WAITROOM_COOKIE_KEYS").then(|| super::super::tests::KEY.to_owned())
        };
        let c = from_toml_str_with(&hook(""), LoadOptions::default(), &env).unwrap();
        let w = &c.webhooks[0];
        assert_eq!(w.url.to_string(), "https://hooks.example/in");
        assert_eq!(w.secret.0, SECRET);
        assert_eq!(w.events, WebhookKind::ALL);
        assert_eq!(w.rooms, None);
        assert_eq!(w.timeout, std::time::Duration::from_secs(5));
        assert_eq!((w.max_attempts, w.buffer), (8, 10_000));
        assert_eq!(w.batch, std::time::Duration::from_secs(10));
        let src = hook("events = [\"sold_out\", \"admissions\"]\nrooms = [\"shop\"]\ntimeout = \"100ms\"\nbatch = \"5m\"\nmax_attempts = 20\nbuffer = 1");
        let c = from_toml_str_with(&src, LoadOptions::default(), &env).unwrap();
        let w = &c.webhooks[0];
        assert_eq!(w.events, [WebhookKind::SoldOut, WebhookKind::Admissions]);
        assert_eq!(w.rooms.as_deref(), Some(&["shop".to_owned()][..]));
        assert_eq!((w.max_attempts, w.buffer), (20, 1));
    }

    #[test]
    fn the_url_is_http_or_https_with_a_host_and_no_user() {
        for url in [
            "ftp://hooks.example/",
            "/in",
            "https://",
            "hooks.example/in",
        ] {
            assert_eq!(
                refusals(&hook(&format!("url = {url:?}"))),
                [format!(
                    "webhook[0].url: {url:?} is not an http:// or https:// URL with a host"
                )],
                "{url}"
            );
        }
        assert_eq!(
            refusals(&hook("url = \"https://me:pw@hooks.example/in\"")),
            ["webhook[0].url: \"https://me:pw@hooks.example/in\" holds a user or password; leave them out (the receiver checks the signature)"]
        );
        assert!(refusals(&hook("url = \"http://127.0.0.1:9000/hook?x=1\"")).is_empty());
    }

    #[test]
    fn one_webhook_per_url() {
        let src = format!(
            "{}[[webhook]]\nurl = \"https://hooks.example/in\"\nsecret_env = \"HOOK_SECRET\"\n",
            hook("")
        );
        assert_eq!(
            refusals(&src),
            ["webhook[1].url: \"https://hooks.example/in\" is webhook[0]'s URL too; one webhook per URL"]
        );
    }

    #[test]
    fn the_secret_is_given_once_and_at_least_16_bytes() {
        let none = format!(
            "{}[[webhook]]\nurl = \"https://hooks.example/in\"\n",
            with("room", "")
        );
        assert_eq!(
            refusals(&none),
            ["webhook[0].secret: missing: the signing secret, at least 16 bytes (or secret_env, the environment variable that holds it)"]
        );
        assert_eq!(
            refusals(&hook("secret = \"short\"")),
            ["webhook[0].secret: must be at least 16 bytes, got 5"]
        );
        assert_eq!(
            refusals(&hook("secret_env = \"HOOK_SECRET\"")),
            ["webhook[0].secret: give secret or secret_env, not both"]
        );
        let env_only = |name: &str| {
            format!(
                "{}[[webhook]]\nurl = \"https://hooks.example/in\"\nsecret_env = \"{name}\"\n",
                with("room", "")
            )
        };
        assert!(refusals(&env_only("HOOK_SECRET")).is_empty());
        assert_eq!(
            refusals(&env_only("OTHER")),
            ["webhook[0].secret_env: environment variable OTHER is not set; it holds the webhook's signing secret"]
        );
        assert_eq!(
            refusals_with(&env_only("HOOK_SECRET"), &[("HOOK_SECRET", "tiny")]),
            ["webhook[0].secret_env: the secret in HOOK_SECRET must be at least 16 bytes, got 4"]
        );
    }

    #[test]
    fn the_events_are_known_kinds_and_the_rooms_configured_rooms() {
        assert_eq!(
            refusals(&hook("events = [\"sold_out\", \"sold\"]")),
            ["webhook[0].events[1]: unknown kind \"sold\"; the kinds are state_changed, limit_changed, event_phase, shuffled, sold_out, stock_changed, queue_formed, queue_drained, autotune_moved, notice_changed, admissions, revokes, test"]
        );
        assert_eq!(
            refusals(&hook("events = []")),
            ["webhook[0].events: must name at least one kind (leave it out for every kind)"]
        );
        assert_eq!(
            refusals(&hook("rooms = [\"shop\", \"nope\"]")),
            ["webhook[0].rooms[1]: \"nope\" is not a room's id; the rooms are shop"]
        );
        assert_eq!(
            refusals(&hook("rooms = []")),
            ["webhook[0].rooms: must name at least one room (leave it out for every room)"]
        );
    }

    #[test]
    fn the_limits_are_in_range() {
        for (keys, refusal) in [
            (
                "timeout = \"50ms\"",
                "webhook[0].timeout: must be between 100ms and 60s, got \"50ms\"",
            ),
            (
                "timeout = \"2m\"",
                "webhook[0].timeout: must be between 100ms and 60s, got \"2m\"",
            ),
            (
                "batch = \"500ms\"",
                "webhook[0].batch: must be between 1s and 5m, got \"500ms\"",
            ),
            (
                "batch = \"6m\"",
                "webhook[0].batch: must be between 1s and 5m, got \"6m\"",
            ),
            (
                "max_attempts = 0",
                "webhook[0].max_attempts: must be between 1 and 20, got 0",
            ),
            (
                "max_attempts = 21",
                "webhook[0].max_attempts: must be between 1 and 20, got 21",
            ),
            (
                "buffer = 0",
                "webhook[0].buffer: must be between 1 and 1000000, got 0",
            ),
            (
                "buffer = 1000001",
                "webhook[0].buffer: must be between 1 and 1000000, got 1000001",
            ),
        ] {
            assert_eq!(refusals(&hook(keys)), [refusal], "{keys}");
        }
    }
}
