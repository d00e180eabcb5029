//! Rooms at runtime: each configured room with its derived values, and the
//! matcher that picks a room by host and longest path prefix.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use http::HeaderMap;
use sha2::{Digest, Sha256};

use crate::canonical::covers;
use crate::config::RoomConfig;
use crate::proxy::headers::COOKIE_PREFIX;
use crate::queue_page::Template;
use crate::store::{RoomOverrides, RoomPolicy};
use crate::telemetry::metrics::RoomMetrics;

use super::eta::RateTracker;
use super::limits::VisitorLimit;
use crate::clock::SharedClock;

/// One room, ready to serve.
pub struct Room {
    pub config: RoomConfig,
    /// The policy the config file gives.
    base_policy: RoomPolicy,
    /// The policy in force: the base with the operator's runtime overrides.
    policy: ArcSwap<RoomPolicy>,
    /// Revision of the overrides in `policy` (0: none), held while a new
    /// policy is chosen so a stale read cannot undo a newer change.
    applied_revision: Mutex<u64>,
    /// Identifies this room's configuration, so overrides made against an
    /// older config file are dropped once the file changes the room.
    pub fingerprint: u64,
    /// `waitroom_<id>`.
    pub cookie_name: String,
    /// Finds the cookie name in a `Cookie` header (built once: building
    /// costs more than searching).
    pub cookie_finder: memchr::memmem::Finder<'static>,
    pub check_in_interval_ms: u64,
    pub template: Template,
    /// Observed admission rate, for the ETA.
    pub rate: RateTracker,
    pub metrics: RoomMetrics,
    /// How often each visitor may poll.
    pub poll_limit: VisitorLimit,
}

impl Room {
    pub fn new(
        config: RoomConfig,
        template: Template,
        metrics: RoomMetrics,
        clock: SharedClock,
    ) -> Self {
        let base_policy = config.policy();
        Self {
            fingerprint: fingerprint(&base_policy),
            policy: ArcSwap::from_pointee(base_policy.clone()),
            applied_revision: Mutex::new(0),
            base_policy,
            cookie_name: format!("{COOKIE_PREFIX}{}", config.id),
            cookie_finder: memchr::memmem::Finder::new(&format!("{COOKIE_PREFIX}{}", config.id))
                .into_owned(),
            check_in_interval_ms: config.check_in_interval().as_millis() as u64,
            template,
            rate: RateTracker::default(),
            metrics,
            poll_limit: VisitorLimit::new(config.refresh_interval, clock),
            config,
        }
    }

    /// The policy in force now.
    pub fn policy(&self) -> Arc<RoomPolicy> {
        self.policy.load_full()
    }

    /// Applies the operator's runtime changes (or drops them when they were
    /// made against another config). Returns true if the policy changed.
    ///
    /// Overrides older than those already applied are ignored: the refresh
    /// task may have read the store just before an operator's change that
    /// this instance applied at once. Missing overrides, or overrides made
    /// against another config, count as revision 0.
    pub fn apply_overrides(&self, overrides: Option<&RoomOverrides>) -> bool {
        let (next, revision) = match overrides {
            Some(o) if o.config_fingerprint == self.fingerprint => {
                (o.apply(&self.base_policy), o.revision)
            }
            _ => (self.base_policy.clone(), 0),
        };
        let mut applied = self
            .applied_revision
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if revision < *applied {
            return false;
        }
        *applied = revision;
        if *self.policy.load_full() == next {
            return false;
        }
        tracing::info!(
            room = %self.config.id,
            state = ?next.state,
            method = ?next.method,
            total_active_users = next.total_active_users,
            new_users_per_minute = next.new_users_per_minute,
            session_duration_ms = next.session_duration_ms,
            "room settings changed"
        );
        self.policy.store(Arc::new(next));
        true
    }

    /// Whether this request skips the waiting room (SPEC §4 step 3).
    /// `path` is the canonical request's match key; bypass paths cover
    /// whole segments (`/static/` never covers `/staticX`).
    pub fn bypasses(&self, path: &str, client: IpAddr, headers: &HeaderMap) -> bool {
        let c = &self.config;
        c.bypass_paths
            .iter()
            .any(|p| covers(p, path, c.case_insensitive_paths))
            || c.bypass_ips.iter().any(|net| net.contains(&client))
            || c.bypass_header.as_ref().is_some_and(|(name, secret)| {
                let mut values = headers.get_all(name).iter();
                // One value, exactly the secret: a repeated header is no bypass.
                match (values.next(), values.next()) {
                    (Some(v), None) => secret.matches(v.as_bytes()),
                    _ => false,
                }
            })
    }
}

/// A stable digest of the limits a config file gives a room.
fn fingerprint(p: &RoomPolicy) -> u64 {
    let canonical = format!(
        "{}|{}|{}|{}|{}|{:?}|{}|{}|{}|{:?}",
        p.room,
        p.total_active_users,
        p.new_users_per_minute,
        p.session_duration_ms,
        p.session_renewal,
        p.method,
        p.max_queue_length,
        p.abandon_after_ms,
        p.arrival_grace_ms,
        p.state
    );
    let digest = Sha256::digest(canonical.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// All rooms, matched by host and longest path prefix.
#[derive(Default)]
pub struct Rooms {
    rooms: Vec<Arc<Room>>,
}

impl Rooms {
    pub fn new(rooms: Vec<Arc<Room>>) -> Self {
        Self { rooms }
    }

    pub fn all(&self) -> &[Arc<Room>] {
        &self.rooms
    }

    pub fn by_id(&self, id: &str) -> Option<&Arc<Room>> {
        self.rooms.iter().find(|r| r.config.id == id)
    }

    /// The room for a canonical `host` and match key `path`: the longest
    /// prefix covering the path on whole segments; a room naming the host
    /// beats a room for any host.
    pub fn matching(&self, host: &str, path: &str) -> Option<&Arc<Room>> {
        self.rooms
            .iter()
            .filter(|r| r.config.host.as_deref().is_none_or(|want| want == host))
            .filter(|r| covers(&r.config.path, path, r.config.case_insensitive_paths))
            .max_by_key(|r| (r.config.path.len(), r.config.host.is_some()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shop() -> Room {
        let config = crate::config::from_toml_str(
            r#"
            [cookie]
            keys = ["__________________________________________8"]
            [origin]
            url = "http://127.0.0.1:3000"
            [[room]]
            id = "shop"
            path = "/"
            total_active_users = 10
            new_users_per_minute = 60
            "#,
        )
        .unwrap();
        let metrics = crate::telemetry::metrics::Metrics::new().room("shop");
        let clock: SharedClock = Arc::new(crate::clock::ManualClock::new(0));
        Room::new(config.rooms[0].clone(), Template::builtin(), metrics, clock)
    }

    fn limit(room: &Room, users: u64, revision: u64) -> RoomOverrides {
        RoomOverrides {
            total_active_users: Some(users),
            config_fingerprint: room.fingerprint,
            revision,
            ..RoomOverrides::default()
        }
    }

    #[test]
    fn a_stale_read_never_undoes_a_newer_change() {
        let room = shop();
        assert!(room.apply_overrides(Some(&limit(&room, 5, 2))));
        assert_eq!(room.policy().total_active_users, 5);
        // What the refresh task read just before the operator's change.
        assert!(!room.apply_overrides(Some(&limit(&room, 7, 1))));
        assert!(!room.apply_overrides(None));
        assert_eq!(room.policy().total_active_users, 5);
        // Same revision written by another instance: the store wins.
        assert!(room.apply_overrides(Some(&limit(&room, 6, 2))));
        assert!(room.apply_overrides(Some(&limit(&room, 8, 3))));
        assert_eq!(room.policy().total_active_users, 8);
    }

    #[test]
    fn without_overrides_the_config_file_rules() {
        let room = shop();
        let mut foreign = limit(&room, 5, 1);
        foreign.config_fingerprint ^= 1;
        assert!(!room.apply_overrides(Some(&foreign)));
        assert!(!room.apply_overrides(None));
        assert_eq!(room.policy().total_active_users, 10);
    }
}
