//! `[store]`: the backend (memory, Redis, Redis Cluster or Sentinel), the
//! password, timeouts, fail mode and replica acknowledgements. Where a
//! Redis store is (its URLs, Sentinels and CA) is checked in `store_redis`.

use std::time::Duration;

use super::{defaults, root, Checker};
use crate::config::keypath::KeyPath;
use crate::config::raw::{RawBackend, RawFailMode, RawStore};
use crate::config::{Backend, FailMode, StoreConfig};

impl Checker<'_, '_> {
    pub(super) fn store(&mut self, raw: RawStore) -> StoreConfig {
        let p = root().key("store");
        let redis = matches!(raw.backend, Some(RawBackend::Redis));
        if !redis {
            // A URL with the memory backend usually means a forgotten
            // `backend = "redis"`: instances would silently not share state.
            for (key, set) in [
                ("url", raw.url.is_some()),
                ("sentinels", raw.sentinels.is_some()),
                ("sentinel_master", raw.sentinel_master.is_some()),
                ("sentinel_password_env", raw.sentinel_password_env.is_some()),
                ("password_env", raw.password_env.is_some()),
                ("replica_acks", raw.replica_acks.is_some()),
                ("replica_ack_timeout", raw.replica_ack_timeout.is_some()),
            ] {
                if set {
                    self.fail(
                        &p.key(key),
                        r#"is only used with backend = "redis"; set store.backend = "redis" or remove it"#,
                    );
                }
            }
        }
        let backend = if !redis {
            Backend::Memory
        } else {
            let password = self.password(&p.key("password_env"), raw.password_env);
            match (raw.url, raw.sentinels) {
                (Some(_), Some(_)) => {
                    self.fail(
                        &p.key("sentinels"),
                        "and store.url are two ways to find Redis; give one",
                    );
                    Backend::Memory
                }
                (None, Some(sentinels)) => {
                    let sentinel_password =
                        self.password(&p.key("sentinel_password_env"), raw.sentinel_password_env);
                    self.sentinels(
                        &p,
                        sentinels,
                        raw.sentinel_master,
                        password,
                        sentinel_password.as_deref(),
                    )
                }
                (url, None) => {
                    for key in ["sentinel_master", "sentinel_password_env"] {
                        let set = match key {
                            "sentinel_master" => raw.sentinel_master.is_some(),
                            _ => raw.sentinel_password_env.is_some(),
                        };
                        if set {
                            self.fail(&p.key(key), "is only used with store.sentinels");
                        }
                    }
                    Backend::Redis {
                        urls: self.redis_urls(&p.key("url"), url, password.as_deref()),
                    }
                }
            }
        };
        let timeout = self.duration(
            &p.key("timeout"),
            raw.timeout,
            defaults::STORE_TIMEOUT,
            Duration::ZERO,
        );
        // One slow call is not an outage: the window must outlast a call.
        let unreachable_path = p.key("unreachable_after");
        let unreachable_after = self.duration(
            &unreachable_path,
            raw.unreachable_after,
            defaults::STORE_UNREACHABLE_AFTER.max(timeout),
            Duration::from_millis(1),
        );
        if unreachable_after < timeout {
            self.fail(
                &unreachable_path,
                format!(
                    "must be at least store.timeout ({} ms): one call that takes the whole timeout is a busy store, not an unreachable one",
                    timeout.as_millis()
                ),
            );
        }
        let fail_mode = match raw.fail_mode {
            None | Some(RawFailMode::Open) => FailMode::Open,
            Some(RawFailMode::Closed) => FailMode::Closed,
            Some(RawFailMode::Local) => FailMode::Local,
        };
        let instances = raw.instances.unwrap_or(1);
        if instances == 0 {
            self.fail(&p.key("instances"), "must be at least 1, got 0");
        }
        let replica_acks = raw.replica_acks.unwrap_or(0);
        if replica_acks > 16 {
            self.fail(
                &p.key("replica_acks"),
                format!("is the number of replicas that must acknowledge a decision: at most 16, got {replica_acks}"),
            );
        }
        // Within the store timeout, which bounds the whole decision.
        let ack_path = p.key("replica_ack_timeout");
        let replica_ack_timeout = self.duration(
            &ack_path,
            raw.replica_ack_timeout,
            timeout / 2,
            Duration::from_millis(1),
        );
        if replica_ack_timeout >= timeout && timeout > Duration::ZERO {
            self.fail(
                &ack_path,
                format!(
                    "must be shorter than store.timeout ({} ms), which bounds the decision and its acknowledgements together",
                    timeout.as_millis()
                ),
            );
        }
        let tls_ca = raw
            .tls_ca
            .and_then(|ca| self.tls_ca(&p.key("tls_ca"), ca, &backend));
        StoreConfig {
            backend,
            timeout,
            unreachable_after,
            fail_mode,
            instances: instances.max(1),
            tls_ca,
            replica_acks: u32::try_from(replica_acks.min(16)).unwrap_or(16),
            replica_ack_timeout,
        }
    }

    /// A password from the environment variable named at `path`, if any.
    fn password(&mut self, path: &KeyPath, name: Option<String>) -> Option<String> {
        let name = name?;
        let var = self.env_name(path, Some(name), "")?;
        let value = self.env_value(&var);
        if value.is_none() {
            self.fail(path, format!("environment variable {var} is not set"));
        }
        value
    }
}

#[cfg(test)]
mod tests {
    use crate::config::check::tests::{refusals, with};

    /// A Redis store at one URL, and `keys` besides.
    fn redis(keys: &str) -> String {
        with(
            "store",
            &format!("backend = \"redis\"\nurl = \"redis://10.0.0.1:6379\"\n{keys}"),
        )
    }

    #[test]
    fn redis_keys_need_the_redis_backend() {
        for keys in [
            "url = \"redis://10.0.0.1:6379\"",
            "sentinels = [\"10.0.0.1:26379\"]",
            "sentinel_master = \"mymaster\"",
            "sentinel_password_env = \"SENTINEL_PASSWORD\"",
            "password_env = \"REDIS_PASSWORD\"",
            "replica_acks = 1",
            "replica_ack_timeout = \"10ms\"",
        ] {
            let key = keys.split(' ').next().unwrap();
            assert_eq!(
                refusals(&with("store", keys)),
                [format!("store.{key}: is only used with backend = \"redis\"; set store.backend = \"redis\" or remove it")]
            );
        }
    }

    #[test]
    fn url_and_sentinels_are_two_ways_to_find_redis() {
        assert_eq!(
            refusals(&redis("sentinels = [\"10.0.0.1:26379\"]")),
            ["store.sentinels: and store.url are two ways to find Redis; give one"]
        );
        for key in [
            "sentinel_master = \"mymaster\"",
            "sentinel_password_env = \"SP\"",
        ] {
            let name = key.split(' ').next().unwrap();
            assert_eq!(
                refusals(&redis(key)),
                [format!("store.{name}: is only used with store.sentinels")]
            );
        }
    }

    #[test]
    fn unreachable_after_outlasts_the_timeout() {
        assert_eq!(
            refusals(&with("store", "unreachable_after = \"10ms\"")),
            ["store.unreachable_after: must be at least store.timeout (50 ms): one call that takes the whole timeout is a busy store, not an unreachable one"]
        );
    }

    #[test]
    fn instances_are_at_least_one() {
        assert_eq!(
            refusals(&with("store", "instances = 0")),
            ["store.instances: must be at least 1, got 0"]
        );
    }

    #[test]
    fn replica_acknowledgements_are_bounded() {
        assert_eq!(
            refusals(&redis("replica_acks = 17")),
            ["store.replica_acks: is the number of replicas that must acknowledge a decision: at most 16, got 17"]
        );
        assert_eq!(
            refusals(&redis("replica_ack_timeout = \"50ms\"")),
            ["store.replica_ack_timeout: must be shorter than store.timeout (50 ms), which bounds the decision and its acknowledgements together"]
        );
    }

    #[test]
    fn a_password_variable_is_set() {
        assert_eq!(
            refusals(&redis("password_env = \"REDIS_PASSWORD\"")),
            ["store.password_env: environment variable REDIS_PASSWORD is not set"]
        );
    }
}
