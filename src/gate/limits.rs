//! Limits per visitor and per client address, so neither a reload storm nor
//! a bot can hammer the store:
//!
//! * queued polls, per visitor (a burst, then a few per refresh interval)
//!   and per client address (generous: many visitors share one NAT); a
//!   limited poll gets 429 with `Retry-After` and no store call, so the
//!   place is kept;
//! * new tickets per client address (`ip_arrival_burst`, then
//!   `ip_arrivals_per_second`): one address cannot fill a queue with places;
//! * arrivals per enqueue-token member (`sub`), per room: a member's token
//!   presented again and again (from any address) is limited to a few
//!   at once and then one per `MEMBER_EVERY`, each of which costs the
//!   store a lookup of the member's place;
//! * refused lane codes per client address (`REFUSED_CODE_BURST`, then one
//!   per `REFUSED_CODE_EVERY`): past that, a request bearing any code is
//!   answered 429 without the code being looked at, so codes cannot be
//!   guessed at the arrival rate.
//!
//! The limiters run on the gate's injected clock, so tests move time. Idle
//! entries are forgotten every `SWEEP_EVERY_MS`, so the tables stay as
//! small as the set of recently active visitors and addresses.

use std::hash::Hash;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};

use crate::clock::SharedClock;
use crate::domain::VisitorId;

/// The gate's clock as governor sees it: time since the Unix epoch.
#[derive(Clone)]
pub(crate) struct GateClock(pub SharedClock);

impl Clock for GateClock {
    type Instant = Duration;

    fn now(&self) -> Duration {
        Duration::from_millis(self.0.now_ms())
    }
}

type Keyed<K> = RateLimiter<K, DashMapStateStore<K>, GateClock, NoOpMiddleware<Duration>>;

/// Polls a visitor may make at once before being spaced out.
pub(crate) const VISITOR_BURST: u32 = 5;
/// A visitor may poll this many times per refresh interval after its burst.
pub(crate) const VISITOR_POLLS_PER_REFRESH: u32 = 4;

/// Arrivals a member (an enqueue token's `sub`) may make at once.
pub(crate) const MEMBER_BURST: u32 = 4;
/// After its burst, a member may arrive once per this long.
pub(crate) const MEMBER_EVERY: Duration = Duration::from_secs(2);

/// A limiter per key (a visitor, a client address), on the gate's clock.
pub(crate) struct KeyedLimit<K: Hash + Eq + Clone> {
    limiter: Keyed<K>,
    clock: GateClock,
}

impl<K: Hash + Eq + Clone> KeyedLimit<K> {
    fn with_quota(quota: Quota, clock: SharedClock) -> Self {
        let clock = GateClock(clock);
        Self {
            limiter: RateLimiter::dashmap_with_clock(quota, clock.clone()),
            clock,
        }
    }

    /// `Err(retry_after)` when `key` is over its allowance.
    fn check_key(&self, key: &K) -> Result<(), Duration> {
        self.limiter
            .check_key(key)
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }

    /// Forgets keys whose allowance is full again (bounded memory).
    pub(crate) fn forget_idle(&self) {
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
    }

    /// Keys currently remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.limiter.len()
    }
}

/// One room's per-visitor limiter.
pub(crate) type VisitorLimit = KeyedLimit<VisitorId>;

impl VisitorLimit {
    pub(crate) fn new(refresh_interval: Duration, clock: SharedClock) -> Self {
        let every = (refresh_interval / VISITOR_POLLS_PER_REFRESH).max(Duration::from_millis(1));
        Self::every(every, VISITOR_BURST, clock)
    }

    /// A burst of `burst`, then one per `every`: a room's members'
    /// arrivals ([`MEMBER_BURST`], [`MEMBER_EVERY`]).
    pub(crate) fn every(every: Duration, burst: u32, clock: SharedClock) -> Self {
        let quota = Quota::with_period(every.max(Duration::from_millis(1)))
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
            .allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN));
        Self::with_quota(quota, clock)
    }

    /// `Err(retry_after)` when the visitor polls too often.
    pub(crate) fn check(&self, visitor: VisitorId) -> Result<(), Duration> {
        self.check_key(&visitor)
    }
}

/// The per-client-address limiter, shared by every room.
pub(crate) type AddressLimit = KeyedLimit<IpAddr>;

impl AddressLimit {
    pub(crate) fn new(per_second: u32, burst: u32, clock: SharedClock) -> Self {
        let quota = Quota::per_second(NonZeroU32::new(per_second).unwrap_or(NonZeroU32::MIN))
            .allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN));
        Self::with_quota(quota, clock)
    }

    /// `Err(retry_after)` when `ip`'s address (its /64 for IPv6, see
    /// [`crate::canonical::limit_key`]) is over the limit.
    pub(crate) fn check(&self, ip: IpAddr) -> Result<(), Duration> {
        self.check_key(&crate::canonical::limit_key(ip))
    }
}

/// Lane codes an address may have refused at once.
pub(crate) const REFUSED_CODE_BURST: u32 = 5;
/// After its burst, an address may have one code refused per this long.
pub(crate) const REFUSED_CODE_EVERY: Duration = Duration::from_secs(10);

/// Refused lane codes per client address: an address over its allowance
/// is blocked from trying codes until the allowance has a cell again.
pub(crate) struct RefusedCodes {
    limiter: Keyed<IpAddr>,
    /// Addresses (limit keys) blocked, and until when (clock ms).
    blocked: std::sync::Mutex<std::collections::HashMap<IpAddr, u64>>,
    clock: GateClock,
}

impl RefusedCodes {
    pub(crate) fn new(clock: SharedClock) -> Self {
        let quota = Quota::with_period(REFUSED_CODE_EVERY)
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
            .allow_burst(NonZeroU32::new(REFUSED_CODE_BURST).unwrap_or(NonZeroU32::MIN));
        let clock = GateClock(clock);
        Self {
            limiter: RateLimiter::dashmap_with_clock(quota, clock.clone()),
            blocked: Default::default(),
            clock,
        }
    }

    /// `ip` had a code refused: one of its allowance spent; past it, the
    /// address is blocked from trying codes for the time one comes back.
    pub(crate) fn refused(&self, ip: IpAddr) {
        let key = crate::canonical::limit_key(ip);
        if self.limiter.check_key(&key).is_err() {
            // The refusal that went over blocks until the next cell.
            let now = self.clock.now();
            let until = now + REFUSED_CODE_EVERY;
            self.blocked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(key, until.as_millis() as u64);
        }
    }

    /// `Some(retry_after)` while `ip` may not try codes.
    pub(crate) fn blocked(&self, ip: IpAddr) -> Option<Duration> {
        let key = crate::canonical::limit_key(ip);
        let now = self.clock.now().as_millis() as u64;
        let blocked = self
            .blocked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let until = *blocked.get(&key)?;
        (until > now).then(|| Duration::from_millis(until - now))
    }

    pub(crate) fn forget_idle(&self) {
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
        let now = self.clock.now().as_millis() as u64;
        self.blocked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|_, until| *until > now);
    }
}

/// How often idle limiter entries are forgotten.
pub(crate) const SWEEP_EVERY_MS: u64 = 30_000;

/// The per-address limits the gate keeps for every room.
pub(crate) struct ClientLimits {
    /// Queued polls per client address.
    pub polls: AddressLimit,
    /// New tickets per client address.
    pub arrivals: AddressLimit,
    /// Refused lane codes per client address.
    pub codes: RefusedCodes,
    /// When idle entries were last forgotten (clock ms).
    swept_at: AtomicU64,
    clock: SharedClock,
}

impl ClientLimits {
    pub(crate) fn new(polls: AddressLimit, arrivals: AddressLimit, clock: SharedClock) -> Self {
        Self {
            polls,
            arrivals,
            codes: RefusedCodes::new(clock.clone()),
            swept_at: AtomicU64::new(clock.now_ms()),
            clock,
        }
    }

    /// True, once per `SWEEP_EVERY_MS`, for the one caller that should
    /// sweep now; the claim is a compare-and-swap, so concurrent callers
    /// never both sweep and the time only moves forward.
    pub(crate) fn sweep_due(&self) -> bool {
        let now = self.clock.now_ms();
        let last = self.swept_at.load(Ordering::Relaxed);
        now.saturating_sub(last) >= SWEEP_EVERY_MS
            && self
                .swept_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Forgets idle addresses in both limiters.
    pub(crate) fn forget_idle(&self) {
        self.polls.forget_idle();
        self.arrivals.forget_idle();
        self.codes.forget_idle();
    }
}

/// Seconds for a `Retry-After` header: rounded up, at least 1.
pub(crate) fn retry_after_secs(wait: Duration) -> u64 {
    (wait.as_millis().div_ceil(1000) as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::sync::Arc;

    #[test]
    fn a_visitor_gets_a_burst_then_one_poll_per_quarter_interval() {
        let clock = ManualClock::new(1_800_000_000_000);
        let limit = VisitorLimit::new(Duration::from_secs(20), Arc::new(clock.clone()));
        let v = VisitorId([1; 16]);
        for _ in 0..VISITOR_BURST {
            assert!(limit.check(v).is_ok());
        }
        let wait = limit.check(v).unwrap_err();
        assert_eq!(retry_after_secs(wait), 5);
        assert!(
            limit.check(VisitorId([2; 16])).is_ok(),
            "others are not affected"
        );
        clock.advance(Duration::from_secs(5));
        assert!(limit.check(v).is_ok());
        assert!(limit.check(v).is_err());
    }

    #[test]
    fn a_member_gets_a_few_arrivals_then_one_per_two_seconds() {
        let clock = ManualClock::new(1_800_000_000_000);
        let limit = VisitorLimit::every(MEMBER_EVERY, MEMBER_BURST, Arc::new(clock.clone()));
        let member = VisitorId([7; 16]);
        for _ in 0..MEMBER_BURST {
            assert!(limit.check(member).is_ok());
        }
        assert_eq!(retry_after_secs(limit.check(member).unwrap_err()), 2);
        clock.advance(MEMBER_EVERY);
        assert!(limit.check(member).is_ok());
        assert!(limit.check(member).is_err());
    }

    #[test]
    fn an_address_that_had_codes_refused_is_blocked_from_trying_more() {
        let clock = ManualClock::new(1_800_000_000_000);
        let codes = RefusedCodes::new(Arc::new(clock.clone()));
        let ip: IpAddr = "203.0.113.9".parse().unwrap();
        for _ in 0..REFUSED_CODE_BURST {
            assert_eq!(codes.blocked(ip), None);
            codes.refused(ip);
        }
        assert_eq!(codes.blocked(ip), None, "within the allowance");
        codes.refused(ip);
        assert_eq!(codes.blocked(ip), Some(REFUSED_CODE_EVERY));
        assert_eq!(codes.blocked("203.0.113.10".parse().unwrap()), None);
        clock.advance(REFUSED_CODE_EVERY);
        assert_eq!(codes.blocked(ip), None, "one more try");
        codes.refused(ip);
        assert_eq!(codes.blocked(ip), None);
        codes.refused(ip);
        assert!(codes.blocked(ip).is_some(), "and no more");
    }

    #[test]
    fn an_address_is_limited_independently() {
        let clock = ManualClock::new(1_800_000_000_000);
        let limit = AddressLimit::new(10, 3, Arc::new(clock.clone()));
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        for _ in 0..3 {
            assert!(limit.check(ip).is_ok());
        }
        assert!(limit.check(ip).is_err());
        clock.advance(Duration::from_millis(100));
        assert!(limit.check(ip).is_ok());
    }

    #[test]
    fn idle_entries_are_swept_every_interval_not_just_once() {
        let clock = ManualClock::new(1_800_000_000_000);
        let shared: SharedClock = Arc::new(clock.clone());
        let limits = ClientLimits::new(
            AddressLimit::new(10, 3, shared.clone()),
            AddressLimit::new(10, 3, shared.clone()),
            shared,
        );
        for round in 0..5u8 {
            assert!(!limits.sweep_due(), "round {round}: not due yet");
            let ip = IpAddr::from([10, 0, 0, round]);
            assert!(limits.arrivals.check(ip).is_ok());
            assert_eq!(limits.arrivals.len(), 1);
            clock.advance(Duration::from_millis(SWEEP_EVERY_MS));
            assert!(limits.sweep_due(), "round {round}: due");
            assert!(!limits.sweep_due(), "claimed once");
            limits.forget_idle();
            assert_eq!(limits.arrivals.len(), 0, "round {round}: swept");
        }
    }
}
