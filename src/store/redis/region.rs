//! Region mode's regional half (docs/regions.md; the global half and the
//! sync task are in `crate::region`).
//!
//! In region mode a room's capacity in this regional store is the region's
//! *grant*, kept in the room's meta hash as two totals that only grow:
//! `g_raised` (slots the global store granted this region) and `g_lowered`
//! (slots the region gave back). Every room script reads the grant in the
//! same atomic run that decides (`lua/lib/ctx.lua`), so every instance of
//! the region decides against the same grant. The global store keeps the
//! same two totals per region; this store only ever takes the larger of
//! its own and the global one, which is why the order and lateness of the
//! global store's answers cannot raise a grant above what it granted.

use async_trait::async_trait;

use super::calls::{Call, RegionApply, RegionBegin};
use super::{Inner, RedisStore, RoomKeys};
use crate::clock::Millis;
use crate::store::{RoomPolicy, StoreError};

/// Where a region asks for Anywhere slots (`crate::region` implements it).
#[async_trait]
pub trait Anywhere: Send + Sync + 'static {
    /// New visitors of `room` found the region's slots used up and nobody
    /// waiting ahead: ask the global store for up to `wanted` slots of the
    /// Anywhere pool and apply them to `store` (with
    /// [`RedisStore::region_apply`]). The visitors are then decided again
    /// on the regional store. Returns how many visitors the call gave room
    /// for (slots, tokens, or both where the room has both limits): 0 when
    /// it gave none or failed, and the visitors are then decided for good.
    async fn take(&self, store: &RedisStore, room: &RoomPolicy, wanted: u64, now_ms: Millis)
        -> u64;
}

/// What a region reports for one room at the start of a sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub active: u64,
    /// The regional `g_raised` and `g_lowered` totals.
    pub raised: u64,
    pub lowered: u64,
    pub queued: u64,
    /// `seq` of the oldest visitor waiting here (0: nobody waits).
    pub head_seq: u64,
    /// New visitors since the previous sync.
    pub arrivals: u64,
    /// Admissions in the rate window: admission tokens in use (I2).
    pub window: u64,
    /// The regional `r_raised` and `r_lowered` totals (admission tokens).
    pub rate_raised: u64,
    pub rate_lowered: u64,
    /// (rank, seq) samples of the queue from the head to the last place.
    pub samples: Vec<(u64, u64)>,
}

impl Snapshot {
    /// The samples as the global script takes them: `rank:seq,rank:seq`.
    pub fn samples_text(&self) -> String {
        let mut out = String::with_capacity(self.samples.len() * 20);
        for (i, (rank, seq)) in self.samples.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&format!("{rank}:{seq}"));
        }
        out
    }
}

impl Snapshot {
    /// The grant in force: what the regional scripts let in at most.
    pub fn grant(&self) -> u64 {
        self.raised.saturating_sub(self.lowered)
    }
}

/// What applying the global store's answer did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    pub raised: u64,
    pub lowered: u64,
    /// Slots given back now (the region must report its new `lowered`).
    pub given: u64,
    /// The same for admission tokens.
    pub rate_raised: u64,
    pub rate_lowered: u64,
    pub rate_given: u64,
}

impl Applied {
    pub fn grant(&self) -> u64 {
        self.raised.saturating_sub(self.lowered)
    }
}

/// The global store's admission-token totals for a region and the rate
/// grant it wants the region to hold (`None`: keep).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateGrant {
    pub raised: u64,
    pub returned: u64,
    pub target: Option<u64>,
}

/// Another region's oldest waiting visitor, as the global store last said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// Leave the bound in force as it is.
    Keep,
    /// Nobody waits in another region.
    None,
    /// The oldest `seq` waiting elsewhere, in force until `until_ms`.
    Seq { seq: u64, until_ms: Millis },
}

impl RedisStore {
    /// Puts this store in region mode: rooms with a capacity limit are
    /// decided against the region's grant, and new visitors who find it
    /// used up ask `anywhere`. Call before the first visitor; a second call
    /// is refused (false).
    pub fn set_region(&self, anywhere: std::sync::Arc<dyn Anywhere>) -> bool {
        self.inner.region.set(anywhere).is_ok()
    }

    /// Whether this store decides against regional grants.
    pub fn is_regional(&self) -> bool {
        self.inner.region.get().is_some()
    }

    /// Starts a sync of `room`: takes the region's sync turn for `turn_ms`
    /// (unless another instance holds it: `None`; `force` takes it anyway)
    /// and reads what the global store needs.
    pub async fn region_begin(
        &self,
        room: &RoomPolicy,
        now_ms: Millis,
        turn_ms: Millis,
        force: bool,
    ) -> Result<Option<Snapshot>, StoreError> {
        let inner = &self.inner;
        let keys = RoomKeys::new(&room.room);
        let call = RegionBegin { turn_ms, force };
        let inv = inner.room_call(&call, &keys.0, room, now_ms, 0);
        call.decode(&inner.run_room(&inv).await?)
    }

    /// Applies the global store's totals for this region (the larger of
    /// ours and theirs), lowers the grant toward `target` (never below the
    /// active sessions), does the same for the admission tokens (never
    /// below the admissions in the rate window), and sets the cross-region
    /// FIFO bound.
    #[allow(clippy::too_many_arguments)]
    pub async fn region_apply(
        &self,
        room: &RoomPolicy,
        now_ms: Millis,
        raised: u64,
        returned: u64,
        target: Option<u64>,
        bound: Bound,
        rate: RateGrant,
    ) -> Result<Applied, StoreError> {
        let inner = &self.inner;
        let keys = RoomKeys::new(&room.room);
        let call = RegionApply {
            raised,
            returned,
            target,
            bound,
            rate,
        };
        let inv = inner.room_call(&call, &keys.0, room, now_ms, 0);
        call.decode(&inner.run_room(&inv).await?)
    }
}

impl Inner {
    /// Whether `room` is decided against a regional grant (region mode and
    /// a capacity or rate limit; an unlimited room needs no grant).
    pub(super) fn regional(&self, room: &RoomPolicy) -> bool {
        (room.total_active_users > 0 || room.new_users_per_minute > 0)
            && self.region.get().is_some()
    }
}
