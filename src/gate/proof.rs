//! Proof of work asked of new visitors while a room queues
//! (docs/how-it-works.md, "Bots, shared tickets and origin trust"), so
//! that holding a place costs every client some CPU time.
//!
//! A challenge is text the daemon signs and need not remember:
//!
//! ```text
//! w1.<room>.<issued ms>.<bits>.<nonce, 16 bytes b64url>.<mac, 16 bytes b64url>
//! ```
//!
//! with `mac` = HMAC-SHA256 under a key derived from the first cookie key
//! (so every instance sharing the cookie keys checks every challenge). A
//! solution is `<challenge>.<counter>` where the SHA-256 of that whole text
//! starts with `bits` zero bits. It comes back in the `waitroom_.proof`
//! cookie (the page's script sets it) or the `X-Waitroom-Proof` header
//! (apps), within [`CHALLENGE_TTL_MS`]; the gate then notes its nonce in
//! the store, so a solution is good once across all instances.
//!
//! The note says which network handed the solution in first ([`Claim`]):
//! that network handing it in again (two tabs, a double reload, a retried
//! request) gets a fresh challenge, while another network's copy is a
//! replay (the shadow queue where the room has one).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::engine::Engine;
use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderName};
use sha2::{Digest, Sha256};

use crate::clock::Millis;
use crate::config::Secret32;
use crate::proxy::headers;

/// How long a challenge can be solved and handed in.
pub const CHALLENGE_TTL_MS: Millis = 120_000;
/// A challenge issued this far in the future (another instance's clock) is still taken.
const CLOCK_SKEW_MS: Millis = 5_000;
/// The header apps return a solution in.
pub const X_WAITROOM_PROOF: HeaderName = HeaderName::from_static("x-waitroom-proof");
/// Longer solutions are refused unread.
const MAX_SOLUTION_LEN: usize = 256;
const VERSION: &str = "w1";
const MAC_LEN: usize = 16;

pub use crate::domain::{Challenge, PROOF_COOKIE};

/// A solution that holds: its nonce must now be claimed once in the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Solved {
    pub(crate) nonce: u64,
    pub(crate) expires_ms: Millis,
}

/// Why a solution was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("malformed")]
    Malformed,
    #[error("not signed by us")]
    Forged,
    #[error("for another room")]
    OtherRoom,
    #[error("expired")]
    Expired,
    #[error("not enough work")]
    TooWeak,
    /// Good, but handed in before from another network.
    #[error("replayed")]
    Replayed,
    /// Good, and handed in before from this network (two tabs, a double
    /// reload): an honest visitor's.
    #[error("handed in again")]
    Again,
}

/// Who hands in a single-use proof (a solution's nonce, a captcha token).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Nobody before: it is this request's.
    First,
    /// This network handed it in before.
    Again,
    /// Another network handed it in first.
    Foreign,
}

impl Claim {
    /// From what noting `[key, network_mark(key, net)]` added: both (new),
    /// neither (this network had noted both), or only the mark (the key
    /// was another network's). A network whose copy was refused as
    /// foreign is `Again` on its next try: still no place.
    pub fn of(added: u64) -> Self {
        match added {
            0 => Claim::Again,
            1 => Claim::Foreign,
            _ => Claim::First,
        }
    }
}

/// What marks `key` as handed in from network `net`.
pub fn network_mark(key: u64, net: u64) -> u64 {
    let digest = Sha256::new()
        .chain_update(b"waitroom/claim\0")
        .chain_update(key.to_be_bytes())
        .chain_update(net.to_be_bytes())
        .finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

impl super::Admission {
    /// Notes single-use `key` in the room's set `set` until `until`, with
    /// the request's network: whose it is.
    pub(super) async fn claim(
        &self,
        room: &super::Room,
        set: &str,
        key: u64,
        until: Millis,
        ctx: &super::Ctx<'_>,
    ) -> Result<Claim, crate::store::StoreError> {
        let members = [key, network_mark(key, ctx.net)];
        let noted = self.store.note(room, set, &members, until, ctx.now).await?;
        Ok(Claim::of(noted.added))
    }
}

/// Issues and checks challenges.
pub struct Proofs {
    keyed: Hmac<Sha256>,
}

impl Proofs {
    /// Keyed from the first cookie key (all instances share it); a ring
    /// without keys gets a random one.
    pub fn new(keys: &[Secret32]) -> Self {
        let base = keys.first().map_or_else(crate::secret::random_32, |k| k.0);
        let key = Sha256::new()
            .chain_update(b"waitroom/proof-key\0")
            .chain_update(base)
            .finalize();
        Self {
            keyed: Hmac::new_from_slice(&key).expect("HMAC accepts any key length"),
        }
    }

    /// The MAC of a challenge's body, before finalising.
    fn keyed(&self, body: &str) -> Hmac<Sha256> {
        let mut mac = self.keyed.clone();
        mac.update(b"waitroom/proof\0");
        mac.update(body.as_bytes());
        mac
    }

    fn mac(&self, body: &str) -> [u8; MAC_LEN] {
        let full = self.keyed(body).finalize().into_bytes();
        let mut out = [0u8; MAC_LEN];
        out.copy_from_slice(&full[..MAC_LEN]);
        out
    }

    /// A fresh challenge for `room`.
    pub fn issue(&self, room: &str, bits: u8, now: Millis) -> Challenge {
        let nonce: [u8; 16] = rand::random();
        let body = format!(
            "{VERSION}.{room}.{now}.{bits}.{}",
            URL_SAFE_NO_PAD.encode(nonce)
        );
        let mac = URL_SAFE_NO_PAD.encode(self.mac(&body));
        Challenge {
            text: format!("{body}.{mac}"),
            bits,
            expires_ms: now + CHALLENGE_TTL_MS,
        }
    }

    /// Checks a solution for `room` at `now`: signed by us, for this room,
    /// in time, and with the work done. Does not know whether it was used.
    pub(crate) fn check(&self, room: &str, solution: &str, now: Millis) -> Result<Solved, Refusal> {
        if solution.len() > MAX_SOLUTION_LEN {
            return Err(Refusal::Malformed);
        }
        let (challenge, counter) = solution.rsplit_once('.').ok_or(Refusal::Malformed)?;
        if counter.is_empty() || counter.len() > 20 || !counter.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(Refusal::Malformed);
        }
        let (body, mac) = challenge.rsplit_once('.').ok_or(Refusal::Malformed)?;
        let mut given = [0u8; MAC_LEN];
        match URL_SAFE_NO_PAD.decode_slice(mac, &mut given) {
            Ok(MAC_LEN) => {}
            _ => return Err(Refusal::Malformed),
        }
        // Constant time, on the truncated tag.
        self.keyed(body)
            .verify_truncated_left(&given)
            .map_err(|_| Refusal::Forged)?;
        // Authentic from here on.
        let mut parts = body.split('.');
        let (Some(VERSION), Some(for_room), Some(issued), Some(bits), Some(nonce), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(Refusal::Malformed);
        };
        if for_room != room {
            return Err(Refusal::OtherRoom);
        }
        let issued: Millis = issued.parse().map_err(|_| Refusal::Malformed)?;
        let bits: u32 = bits.parse().map_err(|_| Refusal::Malformed)?;
        let expires_ms = issued + CHALLENGE_TTL_MS;
        if now >= expires_ms || issued > now + CLOCK_SKEW_MS {
            return Err(Refusal::Expired);
        }
        if leading_zero_bits(solution) < bits {
            return Err(Refusal::TooWeak);
        }
        let mut raw = [0u8; 16];
        match URL_SAFE_NO_PAD.decode_slice(nonce, &mut raw) {
            Ok(16) => {}
            _ => return Err(Refusal::Malformed),
        }
        let mut first = [0u8; 8];
        first.copy_from_slice(&raw[..8]);
        Ok(Solved {
            nonce: u64::from_be_bytes(first),
            expires_ms,
        })
    }
}

/// Leading zero bits of SHA-256(`text`), counted up to 64.
pub fn leading_zero_bits(text: &str) -> u32 {
    let digest = Sha256::digest(text.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first).leading_zeros()
}

/// The solution a request hands in: the `X-Waitroom-Proof` header, else
/// the proof cookie.
pub fn presented(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(&X_WAITROOM_PROOF)
        .and_then(|v| v.to_str().ok())
        .or_else(|| headers::cookie(headers, PROOF_COOKIE))
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// The single-use cookies a request carried: the proof of work's and the
/// captcha token's.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spent {
    proof: bool,
    captcha: bool,
}

impl Spent {
    pub(crate) fn of(headers: &HeaderMap) -> Self {
        Self {
            proof: headers::cookie(headers, PROOF_COOKIE).is_some(),
            captcha: headers::cookie(headers, crate::queue_page::CAPTCHA_COOKIE).is_some(),
        }
    }

    /// Expires them in `resp` (`Max-Age=0`, the path the pages' scripts
    /// set them on), so a spent proof is not handed in again.
    pub fn expire(self, resp: &mut http::Response<crate::body::Body>) {
        let names = [
            (self.proof, PROOF_COOKIE),
            (self.captcha, crate::queue_page::CAPTCHA_COOKIE),
        ];
        for (_, name) in names.into_iter().filter(|(carried, _)| *carried) {
            crate::respond::push_cookie(
                resp.headers_mut(),
                format!("{name}=; Path=/; Max-Age=0; SameSite=Lax"),
            );
        }
    }
}

/// Finds a counter that solves `challenge` (what the page's script does;
/// for tests and the benchmark).
pub fn solve(challenge: &Challenge) -> String {
    (0u64..)
        .map(|counter| format!("{}.{counter}", challenge.text))
        .find(|s| leading_zero_bits(s) >= u32::from(challenge.bits))
        .expect("some counter below 2^64 solves any challenge of at most 64 bits")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: Millis = 1_800_000_000_000;

    fn proofs() -> Proofs {
        Proofs::new(&[Secret32([9; 32])])
    }

    #[test]
    fn a_solution_holds_once_solved_and_only_then() {
        let p = proofs();
        let c = p.issue("shop", 8, NOW);
        let s = solve(&c);
        let solved = p.check("shop", &s, NOW + 1_000).unwrap();
        assert_eq!(solved.expires_ms, NOW + CHALLENGE_TTL_MS);
        // The unsolved challenge with some counter: almost surely too weak.
        let weak = (0..)
            .map(|i| format!("{}.{i}", c.text))
            .find(|s| leading_zero_bits(s) < 8)
            .unwrap();
        assert_eq!(p.check("shop", &weak, NOW), Err(Refusal::TooWeak));
    }

    #[test]
    fn forged_expired_and_foreign_solutions_are_refused() {
        let p = proofs();
        let c = p.issue("shop", 4, NOW);
        let s = solve(&c);
        assert_eq!(p.check("other", &s, NOW), Err(Refusal::OtherRoom));
        assert_eq!(
            p.check("shop", &s, NOW + CHALLENGE_TTL_MS),
            Err(Refusal::Expired)
        );
        assert_eq!(p.check("shop", &s, NOW - 60_000), Err(Refusal::Expired));
        // Another key (another deployment) did not sign it.
        let other = Proofs::new(&[Secret32([8; 32])]);
        assert_eq!(other.check("shop", &s, NOW), Err(Refusal::Forged));
        // Lowering the bits in the text breaks the signature.
        let easier = s.replacen(".4.", ".0.", 1);
        assert_eq!(p.check("shop", &easier, NOW), Err(Refusal::Forged));
        for bad in [
            "",
            ".",
            "w1",
            "a.b",
            &format!("{}.", c.text),
            &format!("{}.12x", c.text),
        ] {
            assert_eq!(
                p.check("shop", bad, NOW),
                Err(Refusal::Malformed),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn every_challenge_has_its_own_nonce() {
        let p = proofs();
        let a = p
            .check("shop", &solve(&p.issue("shop", 1, NOW)), NOW)
            .unwrap();
        let b = p
            .check("shop", &solve(&p.issue("shop", 1, NOW)), NOW)
            .unwrap();
        assert_ne!(a.nonce, b.nonce);
    }

    proptest! {
        #[test]
        fn checking_never_panics(s in ".{0,300}") {
            let _ = proofs().check("shop", &s, NOW);
        }

        #[test]
        fn a_changed_byte_never_passes(at in 0usize..100, to in proptest::char::range('!', '~')) {
            let p = proofs();
            let s = solve(&p.issue("shop", 2, NOW));
            let mut bytes: Vec<char> = s.chars().collect();
            let at = at % bytes.len();
            prop_assume!(bytes[at] != to);
            bytes[at] = to;
            let changed: String = bytes.into_iter().collect();
            // Only the counter may change and still hold.
            let counter_at = s.rfind('.').unwrap();
            if at <= counter_at {
                prop_assert!(p.check("shop", &changed, NOW).is_err());
            }
        }
    }
}
