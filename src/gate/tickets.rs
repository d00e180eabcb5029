//! The room's ticket cookie as the gate uses it: opened from the request,
//! built for an admission or a queue place, and written as `Set-Cookie`.

use cookie::{Cookie, SameSite};
use http::HeaderMap;

use crate::clock::Millis;
use crate::proxy::headers;
use crate::store::{QueuePlace, VisitorId};
use crate::ticket::{Grant, KeyRing, Ticket};

use super::rooms::Room;

/// The key ring and the cookie attributes.
pub struct Tickets {
    keys: KeyRing,
    /// Mark cookies `Secure`.
    secure: bool,
}

impl Tickets {
    pub fn new(keys: KeyRing, secure: bool) -> Self {
        Self { keys, secure }
    }

    /// The room's ticket in the request, if it opens (every failure is "none").
    pub fn open(&self, room: &Room, headers: &HeaderMap, now: Millis) -> Option<Ticket> {
        headers::cookie(headers, &room.cookie_name)
            .and_then(|v| self.keys.open(&room.config.id, v, now).ok())
    }

    /// The ticket of an admitted visitor whose session lives until `expires`.
    pub fn admitted(
        &self,
        room: &Room,
        visitor: VisitorId,
        expires: Millis,
        now: Millis,
    ) -> Ticket {
        Ticket {
            visitor,
            grant: Grant::Admitted {
                session_expires_ms: expires,
                check_in_due_ms: (now + room.check_in_interval_ms).min(expires),
            },
            expires_ms: expires,
        }
    }

    /// The ticket of a queued visitor; it lapses when the visitor would
    /// count as abandoned.
    pub fn queued(
        &self,
        room: &Room,
        visitor: VisitorId,
        place: QueuePlace,
        now: Millis,
    ) -> Ticket {
        Ticket {
            visitor,
            grant: Grant::Queued { seq: place.seq },
            expires_ms: now + room.policy().abandon_after_ms,
        }
    }

    /// `Set-Cookie` for `ticket`.
    pub fn set_cookie(&self, room: &Room, ticket: &Ticket, now: Millis) -> String {
        let max_age = ticket.expires_ms.saturating_sub(now) / 1000;
        Cookie::build((
            room.cookie_name.as_str(),
            self.keys.seal(&room.config.id, ticket),
        ))
        .path("/")
        .http_only(true)
        .same_site(SameSite::Lax)
        .secure(self.secure)
        .max_age(cookie::time::Duration::seconds(max_age as i64 + 1))
        .build()
        .to_string()
    }

    /// `Set-Cookie` that removes the room's ticket.
    pub fn expired_cookie(&self, room: &Room) -> String {
        Cookie::build((room.cookie_name.as_str(), ""))
            .path("/")
            .http_only(true)
            .same_site(SameSite::Lax)
            .secure(self.secure)
            .max_age(cookie::time::Duration::ZERO)
            .build()
            .to_string()
    }
}
