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
        let global_url = match check_redis_url(&raw.global_url, None) {
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
