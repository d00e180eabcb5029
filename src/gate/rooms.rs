//! Rooms at runtime: each configured room with its derived values, and the
//! matcher that picks a room by host and longest path prefix.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use arc_swap::ArcSwap;
use http::HeaderMap;
use sha2::{Digest, Sha256};

use crate::canonical::covers;
use crate::config::RoomConfig;
use crate::domain::{RoomOverrides, RoomPolicy, VisitorId};
use crate::proxy::headers::COOKIE_PREFIX;
use crate::queue_page::Template;
use crate::store::memory::VisitorMap;
use crate::telemetry::metrics::RoomMetrics;

use super::eta::RateTracker;
use super::limits::{VisitorLimit, MEMBER_BURST, MEMBER_EVERY};
use super::schedule::{self, Event, InForce, Phase};
use crate::clock::{Millis, SharedClock};

/// One room, ready to serve.
pub struct Room {
    /// The room's settings from the config file.
    pub config: RoomConfig,
    /// The policy the config file gives.
    base_policy: RoomPolicy,
    /// The config file's events.
    config_events: Arc<Vec<Arc<Event>>>,
    /// The operator's runtime changes in force and their revision (0:
    /// none), held while the policy is worked out again, so a stale read
    /// cannot undo a newer change.
    applied: Mutex<Applied>,
    /// The policy and event phase in force until the next scheduled change.
    in_force: ArcSwap<InForce>,
    /// Identifies this room's configuration, so overrides made against an
    /// older config file are dropped once the file changes the room.
    pub fingerprint: u64,
    /// `waitroom_<id>`.
    pub cookie_name: String,
    /// Finds the cookie name in a `Cookie` header (built once: building
    /// costs more than searching).
    pub cookie_finder: memchr::memmem::Finder<'static>,
    pub(crate) template: Template,
    /// Observed admission rate, for the ETA.
    pub rate: RateTracker,
    pub(crate) metrics: RoomMetrics,
    /// How often each visitor may poll.
    pub(crate) poll_limit: VisitorLimit,
    /// Arrivals per enqueue-token member (`gate::members`).
    pub(crate) member_limit: VisitorLimit,
    /// Visitors waiting, as the last upkeep read it (where the shadow
    /// queue puts its newcomers).
    queued_seen: std::sync::atomic::AtomicU64,
    /// Whether new visitors are being queued (a verdict said so, or the
    /// last figures showed a queue or a full room); proof of work is asked
    /// only then.
    queueing: AtomicBool,
    /// Sessions this instance ended (see `EndedHere`).
    pub ended_here: EndedHere,
    /// WebSocket tunnels open here, by the visitor whose session opened them.
    pub tunnels: Arc<Tunnels>,
    /// What the origin did with the requests forwarded for this room
    /// (`[room.autotune]` reads it).
    pub(crate) origin_health: super::autotune::OriginWindow,
    /// What this room's webhooks follow, as this instance last saw it.
    pub(crate) watch: super::happenings::Watch,
    /// The enqueue-token keys with those fetched from `jwks_url`
    /// (`None`: the room names no JWKS URL).
    pub(crate) jwks: Option<Arc<crate::enqueue::jwks::JwksKeys>>,
    clock: SharedClock,
}

/// Sessions this instance ended (the origin's revoke, a ticket shared by
/// too many networks, the admin API's release), each until every ticket
/// issued before the end is due for its check-in anyway. An admitted
/// ticket is otherwise trusted without the store until its check-in is
/// due; a request with one of these checks in at once, so a copy of the
/// cookie kept past the end is refused by the store, not forwarded. (Other
/// instances refuse it at its check-in, within `check_in_interval`.)
#[derive(Default)]
pub struct EndedHere {
    /// The latest `until` (ms): none is held at or after it, so the
    /// admitted path pays one atomic load until a session is ended here.
    last: AtomicU64,
    visitors: Mutex<VisitorMap<Millis>>,
}

/// Most sessions held at once (a burst of revokes beyond it is checked at
/// the tickets' own check-ins, as on other instances).
const ENDED_HERE_MAX: usize = 100_000;

impl EndedHere {
    /// `visitor`'s session was ended at `now`; its tickets are all due for
    /// a check-in by `until`.
    pub fn add(&self, visitor: VisitorId, now: Millis, until: Millis) {
        let mut visitors = self.visitors.lock().unwrap_or_else(PoisonError::into_inner);
        if visitors.len() >= ENDED_HERE_MAX {
            visitors.retain(|_, u| *u > now);
            if visitors.len() >= ENDED_HERE_MAX {
                return;
            }
        }
        visitors.insert(visitor, until);
        self.last.fetch_max(until, Ordering::Relaxed);
    }

    /// Whether `visitor`'s session was ended here and a ticket of it may
    /// still be short of its check-in.
    pub fn holds(&self, visitor: VisitorId, now: Millis) -> bool {
        if now >= self.last.load(Ordering::Relaxed) {
            return false;
        }
        let visitors = self.visitors.lock().unwrap_or_else(PoisonError::into_inner);
        visitors.get(&visitor).is_some_and(|u| *u > now)
    }
}

/// The WebSocket tunnels open on this instance, by the visitor whose
/// session opened them, so that the end of that session here (the
/// origin's revoke, the admin API's release, a reset) closes them at
/// once. (A session ended on another instance closes them at their next
/// check-in.)
#[derive(Default)]
pub struct Tunnels {
    /// Per visitor: the signal its tunnels watch, and how many watch it.
    open: Mutex<VisitorMap<(tokio::sync::watch::Sender<bool>, usize)>>,
}

impl Tunnels {
    /// A watch for one tunnel of `visitor`'s, ended when its session is.
    pub fn watch(self: &Arc<Self>, visitor: VisitorId) -> TunnelWatch {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let (sender, watching) = open
            .entry(visitor)
            .or_insert_with(|| (tokio::sync::watch::channel(false).0, 0));
        *watching += 1;
        TunnelWatch {
            ended: sender.subscribe(),
            visitor,
            tunnels: self.clone(),
        }
    }

    /// Ends the tunnels of `visitor`, or (`None`) every tunnel.
    pub fn end(&self, visitor: Option<VisitorId>) {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        match visitor {
            Some(v) => {
                if let Some((sender, _)) = open.get(&v) {
                    sender.send_replace(true);
                }
            }
            None => open.values().for_each(|(sender, _)| {
                sender.send_replace(true);
            }),
        }
    }

    /// Visitors with a tunnel open (for tests).
    pub fn len(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One tunnel's view of its session's end.
pub struct TunnelWatch {
    ended: tokio::sync::watch::Receiver<bool>,
    visitor: VisitorId,
    tunnels: Arc<Tunnels>,
}

impl TunnelWatch {
    /// Resolves once the session was ended here.
    pub async fn ended(&mut self) {
        let _ = self.ended.wait_for(|ended| *ended).await;
    }
}

impl Drop for TunnelWatch {
    fn drop(&mut self) {
        let mut open = self
            .tunnels
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((_, watching)) = open.get_mut(&self.visitor) {
            *watching -= 1;
            if *watching == 0 {
                open.remove(&self.visitor);
            }
        }
    }
}

struct Applied {
    revision: u64,
    overrides: Option<RoomOverrides>,
    events: Arc<Vec<Arc<Event>>>,
}

impl Room {
    /// `events` are the config file's, with their pages compiled.
    pub fn new(
        config: RoomConfig,
        template: Template,
        events: Vec<Arc<Event>>,
        metrics: RoomMetrics,
        clock: SharedClock,
    ) -> Self {
        let base_policy = config.policy();
        let events = Arc::new(events);
        let jwks = config.enqueue_token.as_ref().and_then(|t| {
            Some(crate::enqueue::jwks::JwksKeys::start(
                &config.id,
                &t.keys,
                t.jwks_url.as_ref()?,
                clock.clone(),
                metrics.jwks_fetches.clone(),
            ))
        });
        let room = Self {
            fingerprint: fingerprint(&base_policy, &config),
            in_force: ArcSwap::from_pointee(InForce {
                policy: Arc::new(base_policy.clone()),
                phase: Phase::None,
                event: None,
                next_change_ms: 0,
                notice: None,
            }),
            applied: Mutex::new(Applied {
                revision: 0,
                overrides: None,
                events: events.clone(),
            }),
            config_events: events,
            base_policy,
            cookie_name: format!("{COOKIE_PREFIX}{}", config.id),
            cookie_finder: memchr::memmem::Finder::new(&format!("{COOKIE_PREFIX}{}", config.id))
                .into_owned(),
            template,
            rate: RateTracker::default(),
            metrics,
            poll_limit: VisitorLimit::new(config.refresh_interval, clock.clone()),
            member_limit: VisitorLimit::every(MEMBER_EVERY, MEMBER_BURST, clock.clone()),
            queued_seen: std::sync::atomic::AtomicU64::new(0),
            queueing: AtomicBool::new(false),
            ended_here: EndedHere::default(),
            tunnels: Arc::default(),
            origin_health: Default::default(),
            watch: Default::default(),
            jwks,
            clock,
            config,
        };
        room.settle(&room.lock_applied(), room.clock.now_ms());
        room
    }

    /// The operator's notice, expired or not (the admin API shows it).
    pub fn notice(&self) -> Option<Arc<crate::domain::Notice>> {
        self.in_force.load().notice.clone()
    }

    /// Autotune's last move, as last applied here (`None`: none yet).
    pub fn autotune_move(&self) -> Option<crate::domain::AutotuneMove> {
        self.lock_applied()
            .overrides
            .as_ref()
            .and_then(|o| o.autotune.clone())
    }

    /// The state and limits the config file and `o` give, events aside
    /// (what the webhooks' `state_changed` and `limit_changed` follow):
    /// (state, total_active_users, new_users_per_minute).
    pub(crate) fn overridden_by(&self, o: &RoomOverrides) -> (crate::domain::RoomState, u64, u64) {
        let base = &self.base_policy;
        (
            o.state.unwrap_or(base.state),
            o.settings
                .total_active_users
                .unwrap_or(base.total_active_users),
            o.settings
                .new_users_per_minute
                .unwrap_or(base.new_users_per_minute),
        )
    }

    /// Items left, as the origin or an operator last said.
    pub fn stock(&self) -> Option<u64> {
        self.lock_applied().overrides.as_ref().and_then(|o| o.stock)
    }

    /// The policy in force now.
    pub fn policy(&self) -> Arc<RoomPolicy> {
        self.policy_at(self.clock.now_ms())
    }

    /// The policy in force at `now` (the request's clock read).
    pub fn policy_at(&self, now: Millis) -> Arc<RoomPolicy> {
        self.in_force(now).policy.clone()
    }

    /// What is in force at `now`: one atomic load, unless a scheduled
    /// change is due.
    pub fn in_force(&self, now: Millis) -> Arc<InForce> {
        let current = self.in_force.load_full();
        if now < current.next_change_ms {
            return current;
        }
        let applied = self.lock_applied();
        // Another request may have done it meanwhile.
        let current = self.in_force.load_full();
        if now < current.next_change_ms {
            return current;
        }
        self.settle(&applied, now)
    }

    /// The events in force: the config file's, or the operator's list.
    /// Whether a new visitor would be queued now: the room holds everyone
    /// (paused, queue-all, an event's prequeue) or it is full or has a queue.
    pub fn is_queueing(&self, now: Millis) -> bool {
        use crate::domain::{QueueingMethod, RoomState};
        let in_force = self.in_force(now);
        let policy = &in_force.policy;
        match (policy.method, policy.state) {
            (QueueingMethod::Reject | QueueingMethod::Passthrough, _) | (_, RoomState::Closed) => {
                false
            }
            (_, RoomState::Paused | RoomState::QueueAll) => true,
            _ => self.queueing.load(Ordering::Relaxed),
        }
    }

    /// Whether a new visitor must first do the room's proof of work.
    pub fn asks_proof(&self, now: Millis) -> bool {
        self.config.proof_of_work > 0 && self.is_queueing(now)
    }

    /// Whether a newcomer must pass the room's captcha now (it queues).
    pub fn asks_captcha(&self, now: Millis) -> bool {
        self.config.captcha.is_some() && self.is_queueing(now)
    }

    /// `visitor`'s session was ended by this instance at `now`: its tickets
    /// check in at their next request (see `EndedHere`). A ticket may
    /// have been issued under another session duration than the one in
    /// force, so the longest check-in interval is waited out.
    pub fn ended(&self, visitor: VisitorId, now: Millis) {
        self.ended_here
            .add(visitor, now, now + crate::domain::MAX_CHECK_IN_MS);
        self.tunnels.end(Some(visitor));
    }

    /// Visitors waiting, as the last upkeep read it.
    pub fn queued_seen(&self) -> u64 {
        self.queued_seen.load(Ordering::Relaxed)
    }

    /// Records how many visitors wait (upkeep).
    pub fn saw_queued(&self, queued: u64) {
        self.queued_seen.store(queued, Ordering::Relaxed);
    }

    /// Records whether the room is queueing new visitors.
    pub fn set_queueing(&self, queueing: bool) {
        if self.queueing.load(Ordering::Relaxed) != queueing {
            self.queueing.store(queueing, Ordering::Relaxed);
        }
    }

    pub(crate) fn events(&self) -> Arc<Vec<Arc<Event>>> {
        self.lock_applied().events.clone()
    }

    /// Works out what is in force at `now` (again); call after an event's
    /// start call ended.
    pub fn refresh(&self, now: Millis) {
        let applied = self.lock_applied();
        self.settle(&applied, now);
    }

    fn lock_applied(&self) -> MutexGuard<'_, Applied> {
        self.applied.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Works out the policy at `now` from the base, the event and the
    /// operator's changes, and puts it in force.
    fn settle(&self, applied: &Applied, now: Millis) -> Arc<InForce> {
        let (phase, event, next_change_ms) = schedule::phase_at(&applied.events, now);
        let mut policy =
            schedule::policy_in(
                &self.base_policy,
                phase,
                event.as_deref(),
                |p| match &applied.overrides {
                    Some(o) => o.apply(p),
                    None => p.clone(),
                },
            );
        // The stock caps whatever limit is in force (the file's, an
        // event's or an operator's), so the store's own decision holds it.
        if let Some(stock) = applied.overrides.as_ref().and_then(|o| o.stock) {
            crate::domain::cap_by_stock(&mut policy, stock, self.config.sessions_per_item);
        }
        // The revision read, applied or not (changes made against an older
        // config file are read and dropped): the store then knows this
        // instance has seen them.
        policy.revision = applied.revision;
        let previous = self.in_force.load_full();
        if *previous.policy != policy || previous.phase != phase {
            tracing::info!(
                room = %self.config.id,
                state = ?policy.state,
                method = ?policy.method,
                total_active_users = policy.total_active_users,
                new_users_per_minute = policy.new_users_per_minute,
                session_duration_ms = policy.session_duration_ms,
                event = event.as_ref().map(|e| e.spec.name.as_str()),
                phase = ?phase,
                "room settings in force"
            );
        }
        let policy = if *previous.policy == policy {
            previous.policy.clone()
        } else {
            Arc::new(policy)
        };
        // The same notice keeps its allocation (this runs at every
        // scheduled change and every change an operator makes).
        let notice = match applied.overrides.as_ref().and_then(|o| o.notice.as_ref()) {
            Some(n) if previous.notice.as_deref() == Some(n) => previous.notice.clone(),
            Some(n) => Some(Arc::new(n.clone())),
            None => None,
        };
        let next = Arc::new(InForce {
            policy,
            phase,
            event,
            next_change_ms,
            notice,
        });
        self.in_force.store(next.clone());
        next
    }

    /// Applies the operator's runtime changes (or drops them when they were
    /// made against another config). Returns true if the policy changed.
    ///
    /// Overrides older than those already applied are ignored: the refresh
    /// task may have read the store just before an operator's change that
    /// this instance applied at once. Missing overrides, or overrides made
    /// against another config, count as revision 0.
    pub fn apply_overrides(&self, overrides: Option<&RoomOverrides>) -> bool {
        let revision = overrides.map_or(0, |o| o.revision);
        let overrides = overrides
            .filter(|o| o.config_fingerprint == self.fingerprint)
            .cloned();
        let mut applied = self.lock_applied();
        if revision < applied.revision
            || (applied.overrides == overrides && applied.revision == revision)
        {
            return false;
        }
        let events = match overrides.as_ref().and_then(|o| o.events.as_ref()) {
            Some(specs) => Arc::new(
                specs
                    .iter()
                    .map(|spec| {
                        // An unchanged event keeps what this instance knows of it.
                        applied
                            .events
                            .iter()
                            .chain(self.config_events.iter())
                            .find(|e| e.spec == *spec)
                            .cloned()
                            .unwrap_or_else(|| {
                                let template = self
                                    .config_events
                                    .iter()
                                    .find(|e| e.spec.name == spec.name)
                                    .and_then(|e| e.template.clone());
                                Arc::new(Event::new(spec.clone(), template))
                            })
                    })
                    .collect(),
            ),
            None => self.config_events.clone(),
        };
        applied.revision = revision;
        applied.overrides = overrides;
        applied.events = events;
        let before = self.in_force.load_full().policy.clone();
        let after = self.settle(&applied, self.clock.now_ms());
        // Whether the settings changed (the revision read changes with any).
        RoomPolicy {
            revision: after.policy.revision,
            ..(*before).clone()
        } != *after.policy
    }

    /// Whether this request skips the waiting room (docs/how-it-works.md,
    /// "How a request is handled", step 4).
    /// `key` is the canonical request's match key and `path` its canonical
    /// path: a bypass path must cover both, since the key folds spellings
    /// (`/static./shop` to `/static/shop`) that an origin which does not
    /// fold them serves elsewhere. Bypass paths cover whole segments
    /// (`/static/` never covers `/staticX`).
    pub fn bypasses(&self, key: &str, path: &str, client: IpAddr, headers: &HeaderMap) -> bool {
        let c = &self.config;
        c.bypass_paths.iter().any(|p| {
            covers(p, key, c.case_insensitive_paths) && covers(p, path, c.case_insensitive_paths)
        }) || c.bypass_ips.iter().any(|net| net.contains(&client))
            || c.bypass_header.as_ref().is_some_and(|(name, secret)| {
                let mut values = headers.get_all(name).iter();
                // One value, exactly the secret: a repeated header is no bypass.
                match (values.next(), values.next()) {
                    (Some(v), None) => secret.matches(v.as_bytes()),
                    _ => false,
                }
            })
    }

    /// Whether a request with this match key and canonical path (as
    /// [`Room::bypasses`] takes them) is on one of the room's
    /// `end_session_paths`, on whole segments. Either one covered is
    /// enough: ending a session is the safe direction (only the visitor's
    /// own place is lost), so no spelling the key folds (`complete.`,
    /// `complete;x`) keeps a session on a path the origin may serve as the
    /// one configured.
    pub fn ends_session(&self, key: &str, path: &str) -> bool {
        let c = &self.config;
        c.end_session_paths.iter().any(|p| {
            covers(p, key, c.case_insensitive_paths) || covers(p, path, c.case_insensitive_paths)
        })
    }
}

/// A stable digest of the limits and events a config file gives a room.
/// Events' notices are added only when there are any, so the digest of a
/// room without them stays what it was before events had notices (its
/// stored changes survive that upgrade).
fn fingerprint(p: &RoomPolicy, config: &RoomConfig) -> u64 {
    let events: Vec<_> = config
        .events
        .iter()
        .map(|e| SpecDigest::of(&e.spec))
        .collect();
    let notices: Vec<_> = config
        .events
        .iter()
        .filter_map(|e| e.spec.notice.as_ref())
        .collect();
    let mut canonical = format!(
        "{}|{}|{}|{}|{}|{:?}|{}|{}|{}|{:?}|{:?}",
        p.room,
        p.total_active_users,
        p.new_users_per_minute,
        p.session_duration_ms,
        p.session_renewal,
        p.method,
        p.max_queue_length,
        p.abandon_after_ms,
        p.arrival_grace_ms,
        p.state,
        events
    );
    if !notices.is_empty() {
        canonical.push_str(&format!("|{notices:?}"));
    }
    let digest = Sha256::digest(canonical.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// An event as the fingerprint has always seen it: formatted as
/// `EventSpec` was before events had notices.
struct SpecDigest<'a>(&'a crate::domain::EventSpec);

impl<'a> SpecDigest<'a> {
    fn of(e: &'a crate::domain::EventSpec) -> Self {
        Self(e)
    }
}

impl std::fmt::Debug for SpecDigest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = self.0;
        // A presale window counts when there is one, so the rooms without
        // keep the fingerprint they had.
        let mut d = f.debug_struct("EventSpec");
        d.field("name", &e.name)
            .field("prequeue_start_ms", &e.prequeue_start_ms)
            .field("start_ms", &e.start_ms)
            .field("end_ms", &e.end_ms)
            .field("shuffle_at_start", &e.shuffle_at_start);
        if let Some(window) = e.lanes_only_for_ms {
            d.field("lanes_only_for_ms", &Some(window));
        }
        d.field("settings", &e.settings).finish()
    }
}

/// All rooms, matched by host and longest path prefix.
#[derive(Default)]
pub struct Rooms {
    rooms: Vec<Arc<Room>>,
}

impl Rooms {
    pub(crate) fn new(rooms: Vec<Arc<Room>>) -> Self {
        Self { rooms }
    }

    /// Every room, in the order configured.
    pub fn all(&self) -> &[Arc<Room>] {
        &self.rooms
    }

    /// The room with this id.
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
        let config = crate::config::test_shop(10, "");
        let metrics = crate::telemetry::metrics::Metrics::new().room("shop");
        let clock: SharedClock = Arc::new(crate::clock::ManualClock::new(0));
        Room::new(
            config.rooms[0].clone(),
            Template::builtin(),
            Vec::new(),
            metrics,
            clock,
        )
    }

    fn limit(room: &Room, users: u64, revision: u64) -> RoomOverrides {
        RoomOverrides {
            settings: crate::domain::Settings {
                total_active_users: Some(users),
                ..Default::default()
            },
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
    fn an_events_fingerprint_is_unchanged_by_notices_it_does_not_have() {
        let mut spec = crate::domain::EventSpec {
            name: "drop".into(),
            prequeue_start_ms: Some(1),
            start_ms: 2,
            end_ms: 3,
            shuffle_at_start: true,
            lanes_only_for_ms: None,
            settings: crate::domain::Settings {
                total_active_users: Some(5),
                ..Default::default()
            },
            notice: None,
        };
        let before = format!("{spec:?}")
            .replace(", notice: None", "")
            .replace(", lanes_only_for_ms: None", "");
        assert_eq!(format!("{:?}", SpecDigest::of(&spec)), before);
        spec.notice = Some(crate::domain::Notice::plain("x"));
        assert_eq!(format!("{:?}", SpecDigest::of(&spec)), before);
        // A presale window is part of the event.
        spec.lanes_only_for_ms = Some(60_000);
        assert_ne!(format!("{:?}", SpecDigest::of(&spec)), before);
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
