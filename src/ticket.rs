//! The visitor's ticket: an AES-256-GCM sealed cookie bound to one room.
//!
//! STUB: the API below is fixed; the implementation is being written.

use crate::clock::Millis;
use crate::config::Secret32;
use crate::store::VisitorId;

/// What a ticket grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// A place in the queue, ordered by `seq`.
    Queued { seq: u64 },
    /// An admitted session the daemon believes live until `session_expires_ms`;
    /// the store is asked again (check-in) at `check_in_due_ms`.
    Admitted {
        session_expires_ms: Millis,
        check_in_due_ms: Millis,
    },
}

/// The decrypted content of a ticket cookie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub visitor: VisitorId,
    pub grant: Grant,
    /// After this time the ticket is no longer accepted.
    pub expires_ms: Millis,
}

/// Why a cookie was not accepted (every case means "new visitor").
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    #[error("not valid base64url or wrong length")]
    Malformed,
    #[error("unknown version")]
    Version,
    #[error("no key with this id")]
    UnknownKey,
    #[error("authentication failed (tampered, wrong key or wrong room)")]
    Forged,
    #[error("expired")]
    Expired,
}

/// The cookie keys: the first seals, every key opens.
pub struct KeyRing {}

impl KeyRing {
    /// Panics never; an empty ring is refused by config validation.
    pub fn new(_keys: &[Secret32]) -> Self {
        unimplemented!()
    }

    /// Seals `ticket` for `room` into a cookie value (base64url, no padding).
    pub fn seal(&self, _room: &str, _ticket: &Ticket) -> String {
        unimplemented!()
    }

    /// Opens a cookie value for `room` at `now_ms`.
    pub fn open(&self, _room: &str, _value: &str, _now_ms: Millis) -> Result<Ticket, TicketError> {
        unimplemented!()
    }
}

/// A fresh random cookie key, base64 (what `waitroom keygen` prints).
pub fn generate_key() -> String {
    unimplemented!()
}
