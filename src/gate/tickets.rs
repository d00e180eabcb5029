//! The room's ticket cookie as the gate uses it: opened from the request,
//! built for an admission or a queue place, and written as `Set-Cookie`.
//!
//! An admitted visitor sends the same cookie with every request until its
//! next check-in, and opening it (base64, AES-GCM) was the largest part of
//! the gate's own work per forwarded request. So each thread remembers the
//! tickets it opened, by key ring, room and exact cookie value: the same
//! bytes always open to the same ticket, and the expiry is checked at every
//! use. Only cookies that opened are remembered.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use http::HeaderMap;

use crate::clock::Millis;
use crate::config::CookieConfig;
use crate::domain::VisitorId;
use crate::proxy::headers;
use crate::store::QueuePlace;
use crate::ticket::{Grant, KeyRing, Ticket};

use super::rooms::Room;

/// Most tickets a thread remembers; past it the memory starts over (a few
/// MB at most).
const OPENED_MAX: usize = 32_768;

/// Tells key rings apart, so a reload's new keys never see the old ring's tickets.
static RINGS: AtomicU64 = AtomicU64::new(1);

/// Hashes a cookie value by eight of its characters from the nonce, which
/// is random for every cookie sealed: as good a spread as a full hash, for
/// a fraction of the work. Only cookies that opened are ever stored, so
/// nobody can choose keys that collide.
#[derive(Default, Clone, Copy)]
struct NonceHasher(u64);

impl Hasher for NonceHasher {
    fn write(&mut self, bytes: &[u8]) {
        match bytes.get(4..12) {
            Some(nonce) => {
                let mut word = [0u8; 8];
                word.copy_from_slice(nonce);
                self.0 ^= u64::from_le_bytes(word).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            }
            None => {
                for b in bytes {
                    self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
                }
            }
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A ticket this thread opened, and the room it opened for.
struct Remembered {
    room: Box<str>,
    ticket: Ticket,
}

/// Tickets this thread opened with one key ring, by cookie value.
#[derive(Default)]
struct Opened {
    ring: u64,
    by_cookie: HashMap<Box<[u8]>, Remembered, BuildHasherDefault<NonceHasher>>,
}

thread_local! {
    static OPENED: RefCell<Opened> = RefCell::new(Opened::default());
}

/// The key ring and the cookie attributes.
pub(crate) struct Tickets {
    keys: KeyRing,
    /// Which ring this is, for the per-thread memory of opened tickets.
    ring: u64,
    /// What follows the value in every ticket cookie: `HttpOnly`,
    /// `SameSite`, `Secure`, `Partitioned`, `Domain`, `Path`, built once
    /// from `[cookie]`.
    attributes: String,
    /// A ticket from another network than its own is no ticket.
    bind_to_client: bool,
    /// Most distinct networks an admitted session may be used from (0 = any).
    pub max_networks: u64,
}

impl Tickets {
    /// The cookie keys (they also seal the decision mode's pages).
    pub(crate) fn keys(&self) -> &KeyRing {
        &self.keys
    }

    pub(crate) fn new(keys: KeyRing, cookie: &CookieConfig) -> Self {
        Self {
            keys,
            ring: RINGS.fetch_add(1, Ordering::Relaxed),
            attributes: attributes(cookie),
            bind_to_client: cookie.bind_to_client,
            max_networks: cookie.max_networks_per_session,
        }
    }

    /// The room's ticket in the request, if it opens, has not expired and
    /// (with `bind_to_client`) was issued to the client's network `net`;
    /// every failure is "none". Tickets sealed before networks were
    /// recorded carry none and are taken from anywhere until they lapse.
    pub(crate) fn open(
        &self,
        room: &Room,
        headers: &HeaderMap,
        now: Millis,
        net: u64,
    ) -> Option<Ticket> {
        let ticket = self.open_any(room, headers, now)?;
        match ticket.net {
            Some(issued) if self.bind_to_client && issued != net => None,
            _ => Some(ticket),
        }
    }

    pub(crate) fn open_any(&self, room: &Room, headers: &HeaderMap, now: Millis) -> Option<Ticket> {
        let value = headers::cookie_bytes(headers, &room.cookie_finder)?;
        let id = room.config.id.as_str();
        let remembered = OPENED.with(|opened| {
            let mut opened = opened.borrow_mut();
            if opened.ring != self.ring {
                opened.by_cookie.clear();
                opened.ring = self.ring;
            }
            match opened.by_cookie.get(value) {
                Some(r) if &*r.room == id => Some(r.ticket),
                _ => None,
            }
        });
        if let Some(ticket) = remembered {
            return (now < ticket.expires_ms).then_some(ticket);
        }
        let ticket = self
            .keys
            .open(id, std::str::from_utf8(value).ok()?, now)
            .ok()?;
        OPENED.with(|opened| {
            let mut opened = opened.borrow_mut();
            if opened.ring == self.ring {
                if opened.by_cookie.len() >= OPENED_MAX {
                    opened.by_cookie.clear();
                }
                let room = id.into();
                opened
                    .by_cookie
                    .insert(value.into(), Remembered { room, ticket });
            }
        });
        Some(ticket)
    }

    /// The ticket of an admitted visitor whose session lives until `expires`.
    pub(crate) fn admitted(
        &self,
        room: &Room,
        visitor: VisitorId,
        expires: Millis,
        now: Millis,
        net: u64,
    ) -> Ticket {
        Ticket {
            visitor,
            grant: Grant::Admitted {
                session_expires_ms: expires,
                check_in_due_ms: (now + room.policy_at(now).check_in_interval_ms()).min(expires),
            },
            expires_ms: expires,
            net: Some(net),
        }
    }

    /// The ticket of a queued visitor; it lapses when the visitor would
    /// count as abandoned.
    pub(crate) fn queued(
        &self,
        room: &Room,
        visitor: VisitorId,
        lane: u8,
        place: QueuePlace,
        now: Millis,
        net: u64,
    ) -> Ticket {
        Ticket {
            visitor,
            grant: Grant::Queued {
                seq: place.seq,
                lane,
            },
            expires_ms: now + room.policy().abandon_after_ms,
            net: Some(net),
        }
    }

    /// The ticket of a shadow place (`gate::shadow`): it lapses like a
    /// queue place's, and looks like one.
    pub(crate) fn shadow(
        &self,
        room: &Room,
        visitor: VisitorId,
        since_ms: Millis,
        position: u64,
        now: Millis,
        net: u64,
    ) -> Ticket {
        Ticket {
            visitor,
            grant: Grant::Shadow { since_ms, position },
            expires_ms: now + room.policy().abandon_after_ms,
            net: Some(net),
        }
    }

    /// `Set-Cookie` for `ticket`, written directly (this runs for every
    /// new visitor: the generic cookie formatter cost as much as the seal).
    /// The value is base64url and the name `[a-z0-9_-]`, so nothing needs
    /// quoting.
    pub(crate) fn set_cookie(&self, room: &Room, ticket: &Ticket, now: Millis) -> String {
        let max_age = ticket.expires_ms.saturating_sub(now) / 1000 + 1;
        let value = self.keys.seal(&room.config.id, ticket);
        let mut out = String::with_capacity(room.cookie_name.len() + value.len() + 80);
        out.push_str(&room.cookie_name);
        out.push('=');
        out.push_str(&value);
        out.push_str(&self.attributes);
        out.push_str("; Max-Age=");
        out.push_str(itoa::Buffer::new().format(max_age));
        out
    }

    /// `Set-Cookie` that removes the room's ticket (with the attributes
    /// it was set with, or the browser would keep it).
    pub(crate) fn expired_cookie(&self, room: &Room) -> String {
        format!("{}={}; Max-Age=0", room.cookie_name, self.attributes)
    }
}

/// A ticket cookie's attributes after its value, from `[cookie]`.
fn attributes(cookie: &CookieConfig) -> String {
    let mut out = format!("; HttpOnly; SameSite={}", cookie.same_site.as_str());
    if cookie.secure {
        out.push_str("; Secure");
    }
    if cookie.partitioned {
        out.push_str("; Partitioned");
    }
    if let Some(domain) = &cookie.domain {
        out.push_str("; Domain=");
        out.push_str(domain);
    }
    out.push_str("; Path=/");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SameSite;

    #[test]
    fn the_cookie_attributes_follow_the_config() {
        let mut c = crate::config::test_shop(10, "").cookie;
        assert_eq!(attributes(&c), "; HttpOnly; SameSite=Lax; Secure; Path=/");
        c.same_site = SameSite::None;
        c.partitioned = true;
        c.domain = Some("shop.example".into());
        assert_eq!(
            attributes(&c),
            "; HttpOnly; SameSite=None; Secure; Partitioned; Domain=shop.example; Path=/"
        );
        c.same_site = SameSite::Strict;
        c.secure = false;
        c.partitioned = false;
        c.domain = None;
        assert_eq!(attributes(&c), "; HttpOnly; SameSite=Strict; Path=/");
    }
}
