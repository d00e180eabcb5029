//! `X-Waitroom-Signature`: lets an origin that can also be reached directly
//! check that a request came through the waiting room.
//!
//! The header is `t=<unix seconds>,room=<room id>,v1=<hex>` where `v1` is
//! HMAC-SHA256 under `origin.sign_key_env` of
//!
//! ```text
//! <visitor id, 32 hex digits> "\n" <room id> "\n" <t>
//! ```
//!
//! and the visitor id is the request's `X-Waitroom-Visitor`. The origin
//! recomputes it, compares in constant time and refuses an old `t`
//! (docs/how-it-works.md has a snippet). Only requests of admitted visitors
//! are signed.

use hmac::{Hmac, Mac};
use http::{HeaderName, HeaderValue};
use sha2::Sha256;

use crate::config::Secret;
use crate::domain::VisitorId;

/// The signature header.
pub const X_WAITROOM_SIGNATURE: HeaderName = HeaderName::from_static("x-waitroom-signature");

/// Signs forwarded requests; the key schedule is done once.
#[derive(Clone)]
pub struct Signer {
    keyed: Hmac<Sha256>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(..)")
    }
}

impl Signer {
    /// A signer with the `origin.sign_key_env` key.
    pub fn new(key: &Secret) -> Self {
        Self {
            // HMAC takes keys of any length.
            keyed: Hmac::new_from_slice(key.0.as_bytes()).expect("HMAC accepts any key length"),
        }
    }

    /// The HMAC of the documented message, before finalising.
    fn keyed(&self, visitor: &[u8], room: &str, unix_s: u64) -> Hmac<Sha256> {
        let mut mac = self.keyed.clone();
        mac.update(visitor);
        mac.update(b"\n");
        mac.update(room.as_bytes());
        mac.update(b"\n");
        mac.update(itoa::Buffer::new().format(unix_s).as_bytes());
        mac
    }

    fn mac(&self, visitor: &[u8], room: &str, unix_s: u64) -> [u8; 32] {
        self.keyed(visitor, room, unix_s)
            .finalize()
            .into_bytes()
            .into()
    }

    /// The header value for `visitor` in `room` at `unix_s`.
    pub fn header(&self, visitor: &VisitorId, room: &str, unix_s: u64) -> Option<HeaderValue> {
        let mac = self.mac(&visitor.hex(), room, unix_s);
        let mut out = String::with_capacity(24 + room.len() + 64);
        out.push_str("t=");
        out.push_str(itoa::Buffer::new().format(unix_s));
        out.push_str(",room=");
        out.push_str(room);
        out.push_str(",v1=");
        for b in mac {
            out.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
            out.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
        }
        HeaderValue::from_str(&out).ok()
    }

    /// What an origin does: checks `header` for `visitor_hex` and that its
    /// time is within `max_age_s` of `now_s`. Returns the room it names.
    pub fn verify<'h>(
        &self,
        header: &'h str,
        visitor_hex: &str,
        now_s: u64,
        max_age_s: u64,
    ) -> Option<&'h str> {
        let (mut t, mut room, mut v1) = (None, None, None);
        for part in header.split(',') {
            match part.trim().split_once('=') {
                Some(("t", v)) => t = v.parse::<u64>().ok(),
                Some(("room", v)) => room = Some(v),
                Some(("v1", v)) => v1 = Some(v),
                _ => {}
            }
        }
        let (t, room, v1) = (t?, room?, v1?);
        if now_s.abs_diff(t) > max_age_s || v1.len() != 64 {
            return None;
        }
        let mut given = [0u8; 32];
        for (i, pair) in v1.as_bytes().chunks(2).enumerate() {
            let hex = std::str::from_utf8(pair).ok()?;
            given[i] = u8::from_str_radix(hex, 16).ok()?;
        }
        // `verify_slice` compares in constant time.
        self.keyed(visitor_hex.as_bytes(), room, t)
            .verify_slice(&given)
            .ok()
            .map(|()| room)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer(key: &str) -> Signer {
        Signer::new(&Secret(key.into()))
    }

    #[test]
    fn a_signature_verifies_only_for_its_visitor_room_key_and_time() {
        let s = signer("k3y-k3y-k3y-k3y-k3y-k3y-k3y-k3y-k3y");
        let visitor = VisitorId([7; 16]);
        let hex = String::from_utf8(visitor.hex().to_vec()).unwrap();
        let h = s.header(&visitor, "shop", 1_000).unwrap();
        let h = h.to_str().unwrap();
        assert_eq!(s.verify(h, &hex, 1_010, 60), Some("shop"));
        // Too old, another visitor, another key, a changed room.
        assert_eq!(s.verify(h, &hex, 1_061, 60), None);
        let other = String::from_utf8(VisitorId([8; 16]).hex().to_vec()).unwrap();
        assert_eq!(s.verify(h, &other, 1_010, 60), None);
        assert_eq!(
            signer("another key of enough length....").verify(h, &hex, 1_010, 60),
            None
        );
        let moved = h.replace("room=shop", "room=shoq");
        assert_eq!(s.verify(&moved, &hex, 1_010, 60), None);
        assert_eq!(s.verify("garbage", &hex, 1_010, 60), None);
        assert_eq!(s.verify("t=1000,room=shop,v1=zz", &hex, 1_010, 60), None);
    }

    #[test]
    fn the_mac_is_rfc_2104_hmac_sha256_of_the_documented_message() {
        // Computed independently: printf 'vvv\nshop\n1700000000' | openssl dgst -sha256 -hmac key
        let s = signer("key");
        let mac = s.mac(b"vvv", "shop", 1_700_000_000);
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "340419f6790ff75f53251660e631e174484854e12d6145773f4148a39667f049"
        );
    }
}
