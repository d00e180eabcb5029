//! A room's events at runtime (docs/how-it-works.md, "Timed drops"): which
//! one is in force at a moment, in which phase, and what the room's policy
//! is then.
//!
//! The phases of an event, in the time of the instance's clock:
//!
//! * **prequeue** (`prequeue_start..start`): every new visitor queues and
//!   nobody is admitted (the room's state is `paused` unless the operator
//!   made it `closed`);
//! * **starting** (from `start`, until this instance has seen the store
//!   start the event): still nobody admitted, because the prequeue's order
//!   is about to change; the first request that sees it asks the store for
//!   the one atomic step ([`crate::store::Store::start_event`]);
//! * **running** (`start..end`): the event's settings apply;
//! * after `end`, the room's own settings are back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::clock::Millis;
use crate::domain::{EventSpec, Notice, RoomPolicy, RoomState};
use crate::queue_page::Template;

/// One event as this instance runs it.
pub struct Event {
    pub spec: EventSpec,
    /// The page from its prequeue to its end (`None`: the room's).
    pub template: Option<Template>,
    /// This instance has seen the store start the event.
    started: AtomicBool,
    /// A start call is under way on this instance.
    starting: AtomicBool,
}

impl Event {
    pub fn new(spec: EventSpec, template: Option<Template>) -> Self {
        Self {
            spec,
            template,
            started: AtomicBool::new(false),
            starting: AtomicBool::new(false),
        }
    }

    /// Claims the store call that starts the event (one per instance at a time).
    pub fn claim_start(&self) -> bool {
        !self.started.load(Ordering::Acquire)
            && self
                .starting
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// The claimed start call ended: `done` if the store started the event.
    pub fn finish_start(&self, done: bool) {
        if done {
            self.started.store(true, Ordering::Release);
        }
        self.starting.store(false, Ordering::Release);
    }

    fn started(&self) -> bool {
        self.started.load(Ordering::Acquire)
    }
}

/// Where a room stands in its schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// No event in force.
    None,
    Prequeue,
    /// Past the start, waiting for the store to start the event.
    Starting,
    Running,
}

/// What is in force in a room from one moment to the next change.
pub struct InForce {
    pub policy: Arc<RoomPolicy>,
    pub phase: Phase,
    /// The event of the phase (`None` in [`Phase::None`]).
    pub event: Option<Arc<Event>>,
    /// Work this out again at or after this time.
    pub next_change_ms: Millis,
    /// The operator's notice (it may have expired: see [`InForce::notice`]).
    pub notice: Option<Arc<Notice>>,
}

impl InForce {
    /// The notice shown at `now`: the operator's until it expires, else
    /// the event's from its prequeue to its end.
    pub fn notice(&self, now: Millis) -> Option<&Notice> {
        let shown = |n: &&Notice| n.shown_at(now);
        self.notice.as_deref().filter(shown).or_else(|| {
            self.event
                .as_ref()
                .and_then(|e| e.spec.notice.as_ref())
                .filter(shown)
        })
    }

    /// Whether visitors are waiting for an event to start.
    pub fn before_start(&self) -> bool {
        matches!(self.phase, Phase::Prequeue | Phase::Starting)
    }

    /// The event whose start this instance should ask the store for now.
    pub fn event_to_start(&self) -> Option<&Arc<Event>> {
        match (&self.phase, &self.event) {
            (Phase::Starting, Some(e)) if e.claim_start() => Some(e),
            _ => None,
        }
    }
}

/// The event in force at `now`, its phase, and when that may change.
pub(crate) fn phase_at(events: &[Arc<Event>], now: Millis) -> (Phase, Option<Arc<Event>>, Millis) {
    let current = events
        .iter()
        .find(|e| e.spec.opens_ms() <= now && now < e.spec.end_ms);
    let Some(e) = current else {
        let next = events
            .iter()
            .map(|e| e.spec.opens_ms())
            .filter(|&t| t > now)
            .min()
            .unwrap_or(Millis::MAX);
        return (Phase::None, None, next);
    };
    let (phase, next) = if now < e.spec.start_ms {
        (Phase::Prequeue, e.spec.start_ms)
    } else if e.spec.shuffle_at_start && !e.started() {
        // `finish_start` is followed by a fresh look.
        (Phase::Starting, e.spec.end_ms)
    } else {
        (Phase::Running, e.spec.end_ms)
    };
    (phase, Some(e.clone()), next)
}

/// The policy of a room in `phase` of `event`: the event's settings on the
/// room's, the operator's on top (`operator` applies them), nobody
/// admitted before the start, and from the start the event's presale
/// window (`lanes_only_for`) in the lanes' `only_until_ms`.
pub(crate) fn policy_in(
    base: &RoomPolicy,
    phase: Phase,
    event: Option<&Event>,
    operator: impl FnOnce(&RoomPolicy) -> RoomPolicy,
) -> RoomPolicy {
    let mut p = base.clone();
    if let (Phase::Starting | Phase::Running, Some(e)) = (phase, event) {
        e.spec.settings.apply(&mut p);
        if let Some(window) = e.spec.lanes_only_for_ms {
            p.lanes = p.lanes.only_until(e.spec.start_ms.saturating_add(window));
        }
    }
    let mut p = operator(&p);
    if matches!(phase, Phase::Prequeue | Phase::Starting)
        && matches!(p.state, RoomState::Open | RoomState::QueueAll)
    {
        p.state = RoomState::Paused;
    }
    p
}

/// Checks an event an operator adds or changes against the room's others
/// (by name): the same rules as the config file.
pub(crate) fn check_event(event: &EventSpec, others: &[EventSpec]) -> Result<(), String> {
    crate::config::check_id(&event.name).map_err(|why| format!("name: {:?} {why}", event.name))?;
    if event.end_ms <= event.start_ms {
        return Err("end: must be after start".into());
    }
    if event.prequeue_start_ms.is_some_and(|p| p > event.start_ms) {
        return Err("prequeue_start: must not be after start".into());
    }
    if event
        .lanes_only_for_ms
        .is_some_and(|w| w > event.end_ms.saturating_sub(event.start_ms))
    {
        return Err("lanes_only_for: must not be longer than the event".into());
    }
    if let Some(o) = others
        .iter()
        .find(|o| o.name != event.name && o.overlaps(event))
    {
        return Err(format!(
            "start: overlaps event {:?} (prequeue included); events in a room must not overlap",
            o.name
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Settings;

    fn event(shuffle: bool) -> Arc<Event> {
        Arc::new(Event::new(
            EventSpec {
                name: "drop".into(),
                prequeue_start_ms: Some(1_000),
                start_ms: 2_000,
                end_ms: 3_000,
                shuffle_at_start: shuffle,
                lanes_only_for_ms: None,
                settings: Settings {
                    total_active_users: Some(50),
                    ..Settings::default()
                },
                notice: None,
            },
            None,
        ))
    }

    #[test]
    fn phases_change_exactly_at_the_scheduled_times() {
        let events = vec![event(true)];
        assert_eq!(phase_at(&events, 999).0, Phase::None);
        assert_eq!(phase_at(&events, 999).2, 1_000);
        assert_eq!(phase_at(&events, 1_000).0, Phase::Prequeue);
        assert_eq!(phase_at(&events, 1_999).0, Phase::Prequeue);
        assert_eq!(phase_at(&events, 1_999).2, 2_000);
        assert_eq!(phase_at(&events, 2_000).0, Phase::Starting);
        assert!(events[0].claim_start());
        assert!(!events[0].claim_start(), "one start call at a time");
        events[0].finish_start(true);
        assert!(!events[0].claim_start(), "started once");
        assert_eq!(phase_at(&events, 2_000).0, Phase::Running);
        assert_eq!(phase_at(&events, 3_000).0, Phase::None);
        assert_eq!(phase_at(&events, 3_000).2, Millis::MAX);
    }

    #[test]
    fn nobody_is_admitted_before_the_start_and_the_event_rules_while_it_runs() {
        let base = crate::config::test_shop(10, "").rooms[0].policy();
        let e = event(false);
        let same = |p: &RoomPolicy| p.clone();
        let pre = policy_in(&base, Phase::Prequeue, Some(&e), same);
        assert_eq!((pre.state, pre.total_active_users), (RoomState::Paused, 10));
        let run = policy_in(&base, Phase::Running, Some(&e), same);
        assert_eq!((run.state, run.total_active_users), (RoomState::Open, 50));
        // The operator's sold-out stays sold out in the prequeue.
        let closed = policy_in(&base, Phase::Prequeue, Some(&e), |p| RoomPolicy {
            state: RoomState::Closed,
            ..p.clone()
        });
        assert_eq!(closed.state, RoomState::Closed);
    }

    #[test]
    fn an_events_presale_window_counts_from_its_start_while_it_runs() {
        let base = crate::config::test_shop(10, "").rooms[0].policy();
        let mut spec = event(false).spec.clone();
        spec.lanes_only_for_ms = Some(400);
        let e = Event::new(spec.clone(), None);
        let same = |p: &RoomPolicy| p.clone();
        let pre = policy_in(&base, Phase::Prequeue, Some(&e), same);
        assert_eq!(pre.lanes.only_until_ms, 0, "not before the start");
        let run = policy_in(&base, Phase::Running, Some(&e), same);
        assert_eq!(run.lanes.only_until_ms, 2_400);
        assert_eq!(
            policy_in(&base, Phase::None, None, same)
                .lanes
                .only_until_ms,
            0
        );
        assert_eq!(check_event(&spec, &[]), Ok(()));
        spec.lanes_only_for_ms = Some(1_001);
        assert_eq!(
            check_event(&spec, &[]),
            Err("lanes_only_for: must not be longer than the event".into())
        );
    }
}
