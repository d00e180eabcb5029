//! Ending sessions (`lua/release.lua`), and ending again, in a room held
//! after a loss, the sessions this instance ended lately: a failover must
//! not bring back a revoked session.

use std::sync::Arc;
use std::time::Duration;

use super::calls::{Call, Release, Released};
use super::{Inner, RoomKeys};
use crate::clock::Millis;
use crate::store::{RoomPolicy, StoreError, VisitorId};

/// A session ended here, kept for [`RECENT_ENDS_FOR`]: its room's policy,
/// the visitor, its ticket's expiry, when (the caller's clock) and when
/// (this host's).
pub(super) type RecentEnd = (RoomPolicy, VisitorId, Millis, Millis, std::time::Instant);

/// How long an ended session is remembered for a loss to undo: far longer
/// than any replica lags.
const RECENT_ENDS_FOR: Duration = Duration::from_secs(120);

/// Most ended sessions remembered.
const MAX_RECENT_ENDS: usize = 10_000;

/// What a release knows of the session's expiry (`lua/release.lua`).
pub(super) enum Expiry {
    Unknown,
    /// Its ticket's: the session, if still there, ends then.
    Ticket(Millis),
    /// No earlier than this (an arrival's session).
    From(Millis),
}

impl Inner {
    /// Remembers a session ended here (`recent_ends`).
    pub(super) fn ended(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        expires: Millis,
        now_ms: Millis,
    ) {
        let mut ends = self.recent_ends.lock().unwrap_or_else(|p| p.into_inner());
        while ends.len() >= MAX_RECENT_ENDS
            || ends
                .front()
                .is_some_and(|e| e.4.elapsed() > RECENT_ENDS_FOR)
        {
            ends.pop_front();
        }
        ends.push_back((
            room.clone(),
            visitor,
            expires,
            now_ms,
            std::time::Instant::now(),
        ));
    }

    /// Ends again, in the rooms `held` after a loss, the sessions this
    /// instance ended lately: the loss may have taken their marks.
    /// (Boxed: it decides through `run_room`, which verifies first.)
    pub(super) fn end_again<'a>(
        &'a self,
        held: &'a [Arc<str>],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
        Box::pin(self.end_again_now(held))
    }

    async fn end_again_now(&self, held: &[Arc<str>]) {
        if held.is_empty() {
            return;
        }
        let again: Vec<RecentEnd> = self
            .recent_ends
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|e| e.4.elapsed() <= RECENT_ENDS_FOR && held.contains(&e.0.room))
            .cloned()
            .collect();
        let mut ended = 0;
        for (room, visitor, expires, then_ms, at) in &again {
            // Now on the caller's clock, as near as this side can tell.
            let now_ms = then_ms + at.elapsed().as_millis() as Millis;
            match self
                .release(room, *visitor, Expiry::Ticket(*expires), now_ms)
                .await
            {
                Ok(_) => ended += 1,
                Err(e) => {
                    tracing::warn!(room = %room.room, error = %e, "a session ended before the loss could not be ended again");
                }
            }
        }
        if ended > 0 {
            tracing::info!(ended, "sessions ended before the loss ended again");
        }
    }

    /// `end`: a session in `batches` is looked up among the batches
    /// ending within what the caller knows of its expiry. Knowing nothing,
    /// the function reads the batches and the tail a bounded part a call
    /// and says where to go on (`lua/release.lua`): no call holds Redis long
    /// however many sessions and places the room has.
    pub(super) async fn release(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        expiry: Expiry,
        now_ms: Millis,
    ) -> Result<bool, StoreError> {
        let keys = RoomKeys::new(&room.room);
        let hex = visitor.to_hex();
        let (min, max) = match expiry {
            Expiry::Unknown => (String::new(), String::new()),
            Expiry::Ticket(at) => (at.to_string(), at.to_string()),
            Expiry::From(at) => (at.to_string(), String::new()),
        };
        let mut cursor = String::from("b:0");
        // Each part is bounded; so is their number (a room of ten million).
        for _ in 0..100_000 {
            let call = Release {
                visitor: &hex,
                expiry_min: &min,
                expiry_max: &max,
                cursor: &cursor,
            };
            let inv = self.room_call(&call, &keys.0, room, now_ms, self.deadline_us());
            match call.decode(&self.run_room(&inv).await?)? {
                Released::Done(false) => return Ok(false),
                Released::Done(true) => {
                    // Its ticket must now get "ended", which only the function says.
                    self.frontiers.forget(&room.room);
                    return Ok(true);
                }
                Released::Next(next) => cursor = next,
            }
        }
        Err(StoreError::Protocol(
            "release: the search did not end".into(),
        ))
    }
}
