//! Priority lanes at the gate (`[[room.lane]]`): which lane a newcomer
//! enters. A code it brings (the `waitroom_code` parameter of its first
//! link, or the `X-Waitroom-Code` header for apps) names a lane: a
//! multi-use code any number of times, a single-use code once across every
//! instance (noted in the store). A verified enqueue token's `lane` claim
//! names one too, where the lane takes claims. Anything else (no code, an
//! unknown or used one) is the general queue: a code that does not hold
//! costs its bearer the lane, not the place. The store keeps each lane's
//! line and takes turns between them (`store::LaneTurns`).

use http::{HeaderMap, HeaderName};

use super::{Admission, Ctx, Room};
use crate::clock::Millis;
use crate::domain::digest64;
use crate::store::StoreError;

/// The header apps send a lane code in.
pub(crate) const X_WAITROOM_CODE: HeaderName = HeaderName::from_static("x-waitroom-code");
/// The query parameter a link carries a lane code in.
pub(crate) const CODE_PARAM: &str = crate::canonical::OWN_PARAMS[1];

/// How long a used single-use code is remembered: longer than any sale.
const USED_CODE_MS: Millis = 366 * 24 * 3_600_000;

impl Room {
    /// The name of lane `lane` as visitors see it (`None`: the general queue).
    pub(super) fn lane_name(&self, lane: u8) -> Option<&str> {
        let i = usize::from(lane).checked_sub(1)?;
        self.config.lanes.get(i).map(|l| l.name.as_str())
    }

    /// The lane a ticket names, if the room still has it (else the
    /// general queue, where the ticket's place is put back at its seq).
    pub(super) fn known_lane(&self, lane: u8) -> u8 {
        match self.lane_name(lane) {
            Some(_) => lane,
            None => 0,
        }
    }
}

impl Admission {
    /// The lane a newcomer enters (0: the general queue): by the code it
    /// brings, else by its verified token's `lane` claim; and the
    /// single-use code it spent to enter, if any (given back if the
    /// arrival gets no place: `Admission::give_back`).
    pub(super) async fn lane_entry(
        &self,
        room: &Room,
        headers: &HeaderMap,
        ctx: &Ctx<'_>,
        claim: Option<&str>,
    ) -> Result<(u8, Option<u64>), StoreError> {
        let lanes = &room.config.lanes;
        if lanes.is_empty() {
            return Ok((0, None));
        }
        let query = ctx.canonical.query();
        if let Some(code) = super::members::presented(headers, query, &X_WAITROOM_CODE, CODE_PARAM)
        {
            let digest = digest64(code.trim());
            if let Some(i) = lanes.iter().position(|l| l.codes.contains(&digest)) {
                return Ok((self.entered(room, i), None));
            }
            if let Some(i) = lanes.iter().position(|l| l.single_use.contains(&digest)) {
                let until = ctx.now + USED_CODE_MS;
                let noted = self
                    .store
                    .note(room, "codes", &[digest], until, ctx.now)
                    .await?;
                if noted.added == 1 {
                    return Ok((self.entered(room, i), Some(digest)));
                }
                tracing::debug!(room = %room.config.id, client = %ctx.client, "a used lane code came again");
            }
            room.metrics.lane_code_refused.inc();
            self.limits.codes.refused(ctx.client);
        }
        let by_claim = claim.and_then(|c| lanes.iter().position(|l| l.token_claim && l.name == c));
        Ok((by_claim.map_or(0, |i| self.entered(room, i)), None))
    }

    /// `Some(retry_after)` when the request bears a lane code and its
    /// address had too many codes refused lately: it is answered 429, its
    /// code not looked at (a guess costs an attacker its time, and tells
    /// nothing).
    pub(super) fn codes_blocked(
        &self,
        room: &Room,
        headers: &HeaderMap,
        ctx: &Ctx<'_>,
    ) -> Option<std::time::Duration> {
        if room.config.lanes.is_empty() {
            return None;
        }
        let wait = self.limits.codes.blocked(ctx.client)?;
        let query = ctx.canonical.query();
        super::members::presented(headers, query, &X_WAITROOM_CODE, CODE_PARAM)?;
        Some(wait)
    }

    /// Lane `i + 1` entered, counted.
    fn entered(&self, room: &Room, i: usize) -> u8 {
        if let Some(m) = room.metrics.lanes.get(i) {
            m.entered.inc();
        }
        (i + 1) as u8
    }
}
