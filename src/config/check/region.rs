//! `[region]`: this instance's region and the global store (region mode).

use super::store_redis::{check_redis_url, redact_url};
use super::values::check_id;
use super::{defaults, root, Checker};
use crate::config::raw::RawRegion;
use crate::config::{Backend, RegionConfig, StoreConfig};

impl Checker<'_, '_> {
    pub(super) fn region(&mut self, raw: RawRegion, store: &StoreConfig) -> RegionConfig {
        let p = root().key("region");
        if check_id(&raw.name).is_err() {
            self.fail(
                &p.key("name"),
                format!(
                    "{:?} must be 1 to 64 characters of a-z, 0-9, _ and -",
                    raw.name
                ),
            );
        }
        let global_url = match check_redis_url(&raw.global_url, None, "") {
            Ok(url) => url,
            Err(why) => {
                self.fail(
                    &p.key("global_url"),
                    format!("{} {why}", redact_url(&raw.global_url)),
                );
                String::new()
            }
        };
        match &store.backend {
            Backend::Memory => self.fail(
                &p.key("name"),
                r#"region mode needs store.backend = "redis": the instances of a region share store.url as their regional counter"#,
            ),
            Backend::Redis { urls } if urls.contains(&global_url) => self.fail(
                &p.key("global_url"),
                "is the same Redis as store.url; the global store must be a Redis of its own, shared by every region",
            ),
            Backend::Redis { .. } | Backend::Sentinel(_) => {}
        }
        let interval_text = raw.sync_interval.as_ref().map(|d| d.text.clone());
        let sync_interval = self.duration(
            &p.key("sync_interval"),
            raw.sync_interval,
            defaults::SYNC_INTERVAL,
            defaults::MIN_SYNC_INTERVAL,
        );
        if sync_interval > defaults::MAX_SYNC_INTERVAL {
            self.fail(
                &p.key("sync_interval"),
                format!(
                    "must be at most {}, got {:?}",
                    humantime::format_duration(defaults::MAX_SYNC_INTERVAL),
                    interval_text.unwrap_or_default()
                ),
            );
        }
        RegionConfig {
            name: raw.name,
            global_url,
            sync_interval: sync_interval.min(defaults::MAX_SYNC_INTERVAL),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::check::tests::{refusals, with};

    /// A region (`keys` in `[region]`) on a Redis store at 10.0.0.1.
    fn region(keys: &str) -> Vec<String> {
        let store = with(
            "store",
            "backend = \"redis\"\nurl = \"redis://10.0.0.1:6379\"",
        );
        refusals(&format!("{store}[region]\n{keys}\n"))
    }

    const GLOBAL: &str = "global_url = \"redis://10.0.0.2:6379\"";

    #[test]
    fn a_region_is_named_like_a_room() {
        assert_eq!(
            region(&format!("name = \"EU west\"\n{GLOBAL}")),
            [r#"region.name: "EU west" must be 1 to 64 characters of a-z, 0-9, _ and -"#]
        );
    }

    #[test]
    fn the_global_store_is_a_redis_of_its_own() {
        assert_eq!(
            region("name = \"eu\"\nglobal_url = \"http://10.0.0.2:6379\""),
            [r#"region.global_url: "http://10.0.0.2:6379" must start with redis:// or rediss://"#]
        );
        assert_eq!(
            region("name = \"eu\"\nglobal_url = \"redis://10.0.0.1:6379\""),
            ["region.global_url: is the same Redis as store.url; the global store must be a Redis of its own, shared by every region"]
        );
    }

    #[test]
    fn region_mode_needs_redis() {
        let src = format!("{}[region]\nname = \"eu\"\n{GLOBAL}\n", with("room", ""));
        assert_eq!(
            refusals(&src),
            [
                r#"region.name: region mode needs store.backend = "redis": the instances of a region share store.url as their regional counter"#
            ]
        );
    }

    #[test]
    fn the_sync_interval_is_between_100ms_and_a_minute() {
        assert_eq!(
            region(&format!("name = \"eu\"\n{GLOBAL}\nsync_interval = \"61s\"")),
            [r#"region.sync_interval: must be at most 1m, got "61s""#]
        );
        assert_eq!(
            region(&format!(
                "name = \"eu\"\n{GLOBAL}\nsync_interval = \"50ms\""
            )),
            [r#"region.sync_interval: must be at least 100ms, got "50ms""#]
        );
    }
}
