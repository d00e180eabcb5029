//! Polls and lane calls. A poll in the general queue is answered from the
//! queue's description where it can be (`frontier`), else by
//! `lua/poll.lua`; an arrival or a poll in a priority lane by
//! `lua/lane.lua`. Either call is made again while promotion moves toward
//! its visitor. Here too: refreshing the descriptions.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::calls::{self, Call, Step};
use super::conn::Connection;
use super::wire::LaneOp;
use super::{frontier, Inner, RedisStore, RoomKeys};
use crate::clock::Millis;
use crate::store::{QueueingMethod, RoomPolicy, RoomState, StoreError, Verdict, VisitorId};

/// Most calls one poll makes while promotion moves toward its visitor
/// (`wire::Tag::More`): a place a million back within the free room.
const MAX_POLL_ROUNDS: usize = 1_000;

impl RedisStore {
    /// Describes queues from `min` waiting visitors on (tests use short queues).
    pub fn set_frontier_min_queue(&self, min: u64) {
        self.inner.frontier_min_queue.store(min, Ordering::Relaxed);
    }

    /// When the description of `room` in use was made (tests wait for it).
    pub fn frontier_made(&self, room: &str) -> Option<Millis> {
        self.inner.frontiers.made(room)
    }

    /// A poll in the general queue: answered from the queue's description
    /// where it can be (a rate-limited FIFO room), else by `lua/poll.lua`.
    pub(super) async fn poll_general(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        seq: u64,
        now_ms: Millis,
    ) -> Result<Verdict, StoreError> {
        let inner = &self.inner;
        // Only a rate-limited FIFO queue has a frontier (see `frontier`).
        if room.method == QueueingMethod::Fifo
            && room.new_users_per_minute > 0
            && room.state != RoomState::Closed
        {
            let lookup = inner.frontiers.lookup(&room.room, visitor, seq, now_ms);
            if lookup.refresh {
                if let Some(seen) = inner.frontiers.claim(&room.room, true) {
                    let (inner, room) = (Arc::clone(inner), room.clone());
                    tokio::spawn(async move { inner.refresh_frontier(&room, now_ms, seen).await });
                }
            }
            if let Some(place) = lookup.place {
                return Ok(Verdict::Queued(place));
            }
        }
        let keys = RoomKeys::new(&room.room);
        // A visitor within the free room is admitted at this poll (I4),
        // however far back: each call promotes at most PROMOTE_MAX ahead
        // of it, so the poll is asked again while the function says so.
        // A poll that leaves its visitor queued promises nothing new (the
        // place is its ticket's), so on one node only a poll that admits
        // waits for the replicas; on a Cluster every poll does (a `WAIT`
        // must go with its call to the slot's primary).
        let cluster = matches!(inner.conn, Connection::Cluster(_));
        let acks = if cluster { inner.acks } else { None };
        for _ in 0..MAX_POLL_ROUNDS {
            let call = calls::Poll { visitor, seq };
            let inv = inner.room_call(&call, &keys.0, room, now_ms, inner.deadline_us());
            if let Step::Done(verdict) = call.decode(&inner.run_room_acked(&inv, acks).await?)? {
                if !cluster && matches!(verdict, Verdict::Admitted { .. }) {
                    inner.acknowledged().await?;
                }
                return Ok(verdict);
            }
        }
        Err(StoreError::Protocol(
            "poll: promotion did not reach the visitor".into(),
        ))
    }
}

impl Inner {
    /// A visitor arrives in or polls from (`LaneOp::Poll`, with its
    /// ticket's `seq`) priority lane `lane`
    /// (`lua/lane.lua`). Asked again while the function answers `MORE`,
    /// as a poll is.
    pub(super) async fn in_lane(
        &self,
        room: &RoomPolicy,
        visitor: VisitorId,
        lane: u8,
        op: LaneOp,
        seq: u64,
        now_ms: Millis,
    ) -> Result<Verdict, StoreError> {
        let keys = RoomKeys::new(&room.room);
        for _ in 0..MAX_POLL_ROUNDS {
            let call = calls::Lane {
                op,
                visitor,
                lane,
                seq,
            };
            let inv = self.room_call(&call, &keys.0, room, now_ms, self.deadline_us());
            if let Step::Done(verdict) = call.decode(&self.run_room(&inv).await?)? {
                return Ok(verdict);
            }
        }
        Err(StoreError::Protocol(
            "lane: promotion did not reach the visitor".into(),
        ))
    }

    /// Asks Redis for a new description of `room`'s queue, writing the
    /// polls answered since the last one, and installs it.
    pub(super) async fn refresh_frontier(
        &self,
        room: &RoomPolicy,
        now_ms: Millis,
        seen: Vec<VisitorId>,
    ) {
        let mut keys = RoomKeys::new(&room.room).0.to_vec();
        keys.push(super::keys::overrides(&room.room));
        let call = calls::Frontier {
            ahead_ms: frontier::VALID_MS + frontier::SKEW_MS,
            precision: frontier::PRECISION,
            min_queue: self.frontier_min_queue.load(Ordering::Relaxed),
            polls: &seen,
            now_ms,
        };
        let inv = self.room_call(&call, &keys, room, now_ms, 0);
        let outcome = match self.run_room(&inv).await.and_then(|v| call.decode(&v)) {
            Ok(d) => Ok(d),
            Err(e) => {
                tracing::debug!(room = %room.room, error = %e, "queue description not refreshed");
                Err(seen)
            }
        };
        self.frontiers.finish(&room.room, outcome);
    }
}
