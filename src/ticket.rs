//! The visitor's ticket: an AES-256-GCM sealed cookie bound to one room.
//!
//! A cookie value is base64url (no padding) of
//!
//! ```text
//! version (1) | key id (1) | nonce (12) | ciphertext (33 or 41) | tag (16)
//! ```
//!
//! and the plaintext is a fixed binary layout, all integers big-endian:
//!
//! ```text
//! visitor (16) | grant tag (1) | grant fields (8 each) | expires_ms (8) [| network (8)]
//!   tag 1 = Queued   { seq }                        (the general queue)
//!   tag 2 = Admitted { session_expires_ms, check_in_due_ms }
//!   tag 3 = Shadow   { since_ms << 20 | position }  (the shadow queue)
//!   tag 4 = Queued   { lane << 56 | seq }            (a priority lane)
//! ```
//!
//! The client network the ticket was issued to ([`network_of`]) is the
//! optional last field: tickets sealed before it existed still open, with
//! no network.
//!
//! The associated data is `AAD_PREFIX | version | key id | room`, so a cookie
//! only opens for the room it was sealed for, and the clear header bytes are
//! authenticated too. Every failure is a [`TicketError`]; the caller treats
//! them all as "new visitor".

use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::{Aes256Gcm, Key, Nonce, Tag};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::engine::Engine;
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::clock::Millis;
use crate::domain::VisitorId;
use crate::secret::{random_32, Secret32};

/// What a ticket grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// A place in the queue, ordered by `seq`, in priority lane `lane`
    /// (0: the general queue).
    Queued {
        /// The place's arrival number (`store::next_seq`).
        seq: u64,
        /// The priority lane.
        lane: u8,
    },
    /// An admitted session the daemon believes live until `session_expires_ms`;
    /// the store is asked again (check-in) at `check_in_due_ms`.
    Admitted {
        /// When the session runs out unless checked in.
        session_expires_ms: Millis,
        /// When the store is next asked.
        check_in_due_ms: Millis,
    },
    /// A place in the shadow queue (a visitor the room will not let in):
    /// shown at `position` from `since_ms` on, moving up slowly and never
    /// admitted. No store holds it. Sealed as one number, the same size as
    /// a queue place, so the two cookies look alike.
    Shadow {
        /// When the visitor was put in the shadow queue.
        since_ms: Millis,
        /// The position shown at `since_ms`.
        position: u64,
    },
}

impl Ticket {
    /// The priority lane a queue ticket names (0: the general queue, and
    /// for any other ticket).
    pub fn lane(&self) -> u8 {
        match self.grant {
            Grant::Queued { lane, .. } => lane,
            _ => 0,
        }
    }
}

/// Bits of a shadow place's packed number that hold its first position.
const SHADOW_POSITION_BITS: u32 = 20;

impl Grant {
    /// `Shadow` packed into one number (`since_ms` above the position).
    fn shadow_packed(since_ms: Millis, position: u64) -> u64 {
        let max = (1 << SHADOW_POSITION_BITS) - 1;
        (since_ms << SHADOW_POSITION_BITS) | position.min(max)
    }

    fn shadow_unpacked(packed: u64) -> Self {
        Grant::Shadow {
            since_ms: packed >> SHADOW_POSITION_BITS,
            position: packed & ((1 << SHADOW_POSITION_BITS) - 1),
        }
    }
}

/// The decrypted content of a ticket cookie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// Whose ticket it is.
    pub visitor: VisitorId,
    /// What it grants.
    pub grant: Grant,
    /// After this time the ticket is no longer accepted.
    pub expires_ms: Millis,
    /// The client network it was issued to ([`network_of`]); `None` in
    /// tickets sealed before networks were recorded.
    pub net: Option<u64>,
}

/// A client's network as one number: the /24 of an IPv4 address (IPv4-mapped
/// IPv6 included) or the /64 of an IPv6 address. IPv4 networks are put in
/// `ff00::/8` (multicast, never a client), so the two kinds cannot meet.
pub fn network_of(ip: std::net::IpAddr) -> u64 {
    let v4 = match ip {
        std::net::IpAddr::V4(v4) => Some(v4),
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped(),
    };
    match (v4, ip) {
        (Some(v4), _) => 0xff00_0000_0000_0000 | u64::from(u32::from(v4) >> 8),
        (None, std::net::IpAddr::V6(v6)) => (u128::from(v6) >> 64) as u64,
        (None, std::net::IpAddr::V4(_)) => 0,
    }
}

/// Why a cookie was not accepted (every case means "new visitor").
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    /// Not base64url, the wrong length, or unreadable once opened.
    #[error("not valid base64url or wrong length")]
    Malformed,
    /// A first byte this build does not write.
    #[error("unknown version")]
    Version,
    /// Sealed with a key not in the ring.
    #[error("no key with this id")]
    UnknownKey,
    /// Tampered with, sealed with another key, or for another room.
    #[error("authentication failed (tampered, wrong key or wrong room)")]
    Forged,
    /// Past its `expires_ms`.
    #[error("expired")]
    Expired,
}

/// The format written by `seal`; any other first byte is refused before any
/// crypto, so a future format can be told apart from a forgery.
const VERSION: u8 = 1;

/// Separates ticket ciphertexts from anything else these keys might ever
/// authenticate. Fixed length and ahead of the fixed-length header, so the
/// room (last) cannot be confused with the other fields.
const AAD_PREFIX: &[u8] = b"waitroom/ticket\0";

/// Separates key ids from any other hash of the key, so the id reveals
/// nothing that another use of SHA-256(key) would.
const KEY_ID_PREFIX: &[u8] = b"waitroom/key-id\0";

const HEADER_LEN: usize = 2;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;

const TAG_QUEUED: u8 = 1;
const TAG_ADMITTED: u8 = 2;
const TAG_SHADOW: u8 = 3;
const TAG_LANE: u8 = 4;
/// A lane's place packs its lane above a seq's 53 bits.
const LANE_SHIFT: u32 = 56;
const QUEUED_PT_LEN: usize = 16 + 1 + 8 + 8;
const ADMITTED_PT_LEN: usize = 16 + 1 + 8 + 8 + 8;
const NET_LEN: usize = 8;
const MIN_PT_LEN: usize = QUEUED_PT_LEN;
const MAX_PT_LEN: usize = ADMITTED_PT_LEN + NET_LEN;

/// Longest decoded cookie `seal` writes.
const MAX_RAW_LEN: usize = HEADER_LEN + NONCE_LEN + MAX_PT_LEN + TAG_LEN;

/// Longer cookie values are refused before base64 decoding, so a hostile
/// client cannot make the daemon decode kilobytes per request. Generous over
/// the 106 characters of the longest ticket so a slightly larger future format
/// still fits the decode buffer.
pub const MAX_VALUE_LEN: usize = 256;

/// Decode buffer: exactly what `MAX_VALUE_LEN` characters can decode to.
const DECODE_BUF_LEN: usize = MAX_VALUE_LEN / 4 * 3;

/// Room ids are at most 64 characters (config), so the associated data fits
/// on the stack; longer rooms still work through a heap buffer.
const AAD_STACK_LEN: usize = 96;

/// One key of the ring, with its cipher built once.
struct RingKey {
    id: u8,
    cipher: Aes256Gcm,
}

/// The cookie keys: the first seals, every key opens.
///
/// Built once at start-up and shared (it is `Send + Sync`, `seal` and `open`
/// take `&self` and do not lock or allocate beyond the returned string).
pub struct KeyRing {
    /// Never empty: `new` substitutes an ephemeral key for an empty list.
    keys: Vec<RingKey>,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Key ids are public (they travel in every cookie); keys are not.
        f.debug_struct("KeyRing")
            .field(
                "key_ids",
                &self.keys.iter().map(|k| k.id).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl KeyRing {
    /// Panics never; an empty ring is refused by config validation.
    ///
    /// Should an empty list arrive anyway, the ring gets one random key: the
    /// daemon keeps working, but its cookies do not survive a restart and are
    /// not shared with other instances.
    pub fn new(keys: &[Secret32]) -> Self {
        let mut ring: Vec<RingKey> = Vec::with_capacity(keys.len().max(1));
        for (i, key) in keys.iter().enumerate() {
            // A key listed twice would only cost a second failed decryption
            // on every forged cookie.
            if keys[..i].contains(key) {
                continue;
            }
            ring.push(RingKey {
                id: key_id(key),
                cipher: Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&key.0)),
            });
        }
        if ring.is_empty() {
            tracing::warn!("empty cookie key ring: using an ephemeral random key");
            let key = Secret32(random_32());
            ring.push(RingKey {
                id: key_id(&key),
                cipher: Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&key.0)),
            });
        }
        Self { keys: ring }
    }

    /// The id of each key, sealing key first (for logs and the admin API).
    pub fn key_ids(&self) -> Vec<u8> {
        self.keys.iter().map(|k| k.id).collect()
    }

    /// Seals `ticket` for `room` into a cookie value (base64url, no padding).
    pub fn seal(&self, room: &str, ticket: &Ticket) -> String {
        let mut pt = [0u8; MAX_PT_LEN];
        let len = encode_plaintext(ticket, &mut pt);
        self.seal_plaintext(room, &pt[..len])
    }

    fn seal_plaintext(&self, room: &str, pt: &[u8]) -> String {
        let Some(key) = self.keys.first() else {
            // Unreachable: `new` never builds an empty ring.
            return String::new();
        };
        let mut raw = [0u8; MAX_RAW_LEN];
        let (header, rest) = raw.split_at_mut(HEADER_LEN);
        let (nonce, rest) = rest.split_at_mut(NONCE_LEN);
        let pt_len = pt.len().min(MAX_PT_LEN);
        let (body, rest) = rest.split_at_mut(pt_len);
        header[0] = VERSION;
        header[1] = key.id;
        // A fresh random nonce per seal: tickets are re-issued often and by
        // many instances sharing a key, so a counter could not stay unique.
        rand::thread_rng().fill_bytes(nonce);
        body.copy_from_slice(&pt[..pt_len]);
        let sealed = with_aad(key.id, room, |aad| {
            key.cipher
                .encrypt_in_place_detached(Nonce::from_slice(nonce), aad, body)
        });
        let Ok(tag) = sealed else {
            // Unreachable: GCM only refuses inputs of gigabytes. An empty
            // value opens as Malformed, i.e. the visitor is simply new.
            return String::new();
        };
        rest[..TAG_LEN].copy_from_slice(&tag);
        URL_SAFE_NO_PAD.encode(&raw[..HEADER_LEN + NONCE_LEN + pt_len + TAG_LEN])
    }

    /// Opens a cookie value for `room` at `now_ms`.
    pub fn open(&self, room: &str, value: &str, now_ms: Millis) -> Result<Ticket, TicketError> {
        // Checked before decoding: the value is attacker-controlled.
        if value.len() > MAX_VALUE_LEN {
            return Err(TicketError::Malformed);
        }
        let mut buf = [0u8; DECODE_BUF_LEN];
        let n = URL_SAFE_NO_PAD
            .decode_slice(value, &mut buf)
            .map_err(|_| TicketError::Malformed)?;
        let raw = buf.get(..n).ok_or(TicketError::Malformed)?;

        let (&[version, id], rest) = raw
            .split_first_chunk::<HEADER_LEN>()
            .ok_or(TicketError::Malformed)?;
        if version != VERSION {
            return Err(TicketError::Version);
        }
        let (nonce, rest) = rest
            .split_first_chunk::<NONCE_LEN>()
            .ok_or(TicketError::Malformed)?;
        let (body, tag) = rest
            .split_last_chunk::<TAG_LEN>()
            .ok_or(TicketError::Malformed)?;
        if !(MIN_PT_LEN..=MAX_PT_LEN).contains(&body.len()) {
            return Err(TicketError::Malformed);
        }

        // Ids are one byte, so two keys of a ring may share one (1 in 256 per
        // pair): try each key with this id.
        let mut id_known = false;
        for key in self.keys.iter().filter(|k| k.id == id) {
            id_known = true;
            let mut pt = [0u8; MAX_PT_LEN];
            let pt = &mut pt[..body.len()];
            pt.copy_from_slice(body);
            let opened = with_aad(id, room, |aad| {
                key.cipher.decrypt_in_place_detached(
                    Nonce::from_slice(nonce),
                    aad,
                    pt,
                    Tag::from_slice(tag),
                )
            });
            if opened.is_err() {
                continue;
            }
            // Authentic from here on: a layout we cannot read was written by
            // a holder of our key, i.e. a newer or buggy daemon.
            let ticket = decode_plaintext(pt).ok_or(TicketError::Malformed)?;
            // Only after authentication, so a forger learns nothing from
            // the answer about what the expiry field holds.
            if now_ms >= ticket.expires_ms {
                return Err(TicketError::Expired);
            }
            return Ok(ticket);
        }
        Err(if id_known {
            TicketError::Forged
        } else {
            TicketError::UnknownKey
        })
    }
}

impl KeyRing {
    /// Seals `pt` for `purpose` (a short note another of our endpoints
    /// reads back, such as the page a decision chose): base64url of
    /// `key id | nonce | ciphertext | tag`. Its associated data starts with
    /// `NOTE_PREFIX`, so a note never opens as a ticket nor a ticket as a note.
    pub fn seal_note(&self, purpose: &str, pt: &[u8]) -> String {
        let Some(key) = self.keys.first() else {
            return String::new();
        };
        let mut raw = Vec::with_capacity(1 + NONCE_LEN + pt.len() + TAG_LEN);
        raw.push(key.id);
        let mut nonce = [0u8; NONCE_LEN];
        rand::thread_rng().fill_bytes(&mut nonce);
        raw.extend_from_slice(&nonce);
        let mut body = pt.to_vec();
        let aad = note_aad(key.id, purpose);
        let Ok(tag) =
            key.cipher
                .encrypt_in_place_detached(Nonce::from_slice(&nonce), &aad, &mut body)
        else {
            return String::new();
        };
        raw.extend_from_slice(&body);
        raw.extend_from_slice(&tag);
        URL_SAFE_NO_PAD.encode(raw)
    }

    /// Opens a note `seal_note` wrote for `purpose`; `None` for anything
    /// else (at most `MAX_NOTE_LEN` characters are looked at).
    pub fn open_note(&self, purpose: &str, value: &str) -> Option<Vec<u8>> {
        if value.len() > MAX_NOTE_LEN {
            return None;
        }
        let raw = URL_SAFE_NO_PAD.decode(value).ok()?;
        let (&id, rest) = raw.split_first()?;
        let (nonce, rest) = rest.split_first_chunk::<NONCE_LEN>()?;
        let (body, tag) = rest.split_last_chunk::<TAG_LEN>()?;
        let aad = note_aad(id, purpose);
        self.keys.iter().filter(|k| k.id == id).find_map(|key| {
            let mut pt = body.to_vec();
            key.cipher
                .decrypt_in_place_detached(
                    Nonce::from_slice(nonce),
                    &aad,
                    &mut pt,
                    Tag::from_slice(tag),
                )
                .ok()
                .map(|()| pt)
        })
    }
}

/// Longest note `open_note` reads.
pub const MAX_NOTE_LEN: usize = 2048;

const NOTE_PREFIX: &[u8] = b"waitroom/note\0";

fn note_aad(id: u8, purpose: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(NOTE_PREFIX.len() + 1 + purpose.len());
    aad.extend_from_slice(NOTE_PREFIX);
    aad.push(id);
    aad.extend_from_slice(purpose.as_bytes());
    aad
}

/// The id a key carries in cookies: the first byte of
/// SHA-256(`KEY_ID_PREFIX` | key). Derived from the key alone, so it stays the
/// same wherever the key sits in the ring and whatever else the ring holds.
pub fn key_id(key: &Secret32) -> u8 {
    let digest = Sha256::new()
        .chain_update(KEY_ID_PREFIX)
        .chain_update(key.0)
        .finalize();
    digest[0]
}

/// Runs `f` with the associated data for a cookie of key `id` in `room`.
fn with_aad<R>(id: u8, room: &str, f: impl FnOnce(&[u8]) -> R) -> R {
    let len = AAD_PREFIX.len() + HEADER_LEN + room.len();
    let mut stack = [0u8; AAD_STACK_LEN];
    let mut heap = Vec::new();
    let buf: &mut [u8] = match stack.get_mut(..len) {
        Some(b) => b,
        None => {
            heap.resize(len, 0);
            &mut heap
        }
    };
    let (prefix, rest) = buf.split_at_mut(AAD_PREFIX.len());
    prefix.copy_from_slice(AAD_PREFIX);
    let (header, tail) = rest.split_at_mut(HEADER_LEN);
    header.copy_from_slice(&[VERSION, id]);
    tail.copy_from_slice(room.as_bytes());
    f(buf)
}

/// Writes the plaintext layout into `out`; returns its length.
fn encode_plaintext(t: &Ticket, out: &mut [u8; MAX_PT_LEN]) -> usize {
    let mut w = Writer { out, at: 0 };
    w.put(&t.visitor.0);
    match t.grant {
        Grant::Queued { seq, lane: 0 } => {
            w.put(&[TAG_QUEUED]);
            w.put(&seq.to_be_bytes());
        }
        Grant::Queued { seq, lane } => {
            w.put(&[TAG_LANE]);
            let packed = (u64::from(lane) << LANE_SHIFT) | (seq & ((1 << LANE_SHIFT) - 1));
            w.put(&packed.to_be_bytes());
        }
        Grant::Admitted {
            session_expires_ms,
            check_in_due_ms,
        } => {
            w.put(&[TAG_ADMITTED]);
            w.put(&session_expires_ms.to_be_bytes());
            w.put(&check_in_due_ms.to_be_bytes());
        }
        Grant::Shadow { since_ms, position } => {
            w.put(&[TAG_SHADOW]);
            w.put(&Grant::shadow_packed(since_ms, position).to_be_bytes());
        }
    }
    w.put(&t.expires_ms.to_be_bytes());
    if let Some(net) = t.net {
        w.put(&net.to_be_bytes());
    }
    w.at
}

struct Writer<'a> {
    out: &'a mut [u8; MAX_PT_LEN],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        // The layouts are constant and fit MAX_PT_LEN; the bound check only
        // keeps a future layout mistake from panicking.
        if let Some(dst) = self.out.get_mut(self.at..self.at + bytes.len()) {
            dst.copy_from_slice(bytes);
            self.at += bytes.len();
        }
    }
}

/// Reads the plaintext layout; `None` for an unknown tag or a length that does
/// not match the tag exactly.
fn decode_plaintext(pt: &[u8]) -> Option<Ticket> {
    let (visitor, rest) = pt.split_first_chunk::<16>()?;
    let (&tag, rest) = rest.split_first()?;
    let (grant, rest) = match tag {
        TAG_QUEUED => {
            let (seq, rest) = take_u64(rest)?;
            (Grant::Queued { seq, lane: 0 }, rest)
        }
        TAG_LANE => {
            let (packed, rest) = take_u64(rest)?;
            let lane = (packed >> LANE_SHIFT) as u8;
            if lane == 0 {
                return None;
            }
            let seq = packed & ((1 << LANE_SHIFT) - 1);
            (Grant::Queued { seq, lane }, rest)
        }
        TAG_SHADOW => {
            let (packed, rest) = take_u64(rest)?;
            (Grant::shadow_unpacked(packed), rest)
        }
        TAG_ADMITTED => {
            let (session_expires_ms, rest) = take_u64(rest)?;
            let (check_in_due_ms, rest) = take_u64(rest)?;
            (
                Grant::Admitted {
                    session_expires_ms,
                    check_in_due_ms,
                },
                rest,
            )
        }
        _ => return None,
    };
    let (expires_ms, rest) = take_u64(rest)?;
    let net = match rest.len() {
        0 => None,
        NET_LEN => Some(take_u64(rest)?.0),
        _ => return None,
    };
    Some(Ticket {
        visitor: VisitorId(*visitor),
        grant,
        expires_ms,
        net,
    })
}

fn take_u64(b: &[u8]) -> Option<(u64, &[u8])> {
    let (head, rest) = b.split_first_chunk::<8>()?;
    Some((u64::from_be_bytes(*head), rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const ROOM: &str = "sale";
    const NOW: Millis = 1_700_000_000_000;
    const EXPIRES: Millis = NOW + 60_000;

    fn key(b: u8) -> Secret32 {
        Secret32([b; 32])
    }

    #[test]
    fn a_lane_place_round_trips_and_a_lane_of_0_does_not_open() {
        let keys = KeyRing::new(&[key(1)]);
        let t = Ticket {
            visitor: VisitorId([9; 16]),
            grant: Grant::Queued {
                seq: (1 << 53) - 1,
                lane: 3,
            },
            expires_ms: EXPIRES,
            net: Some(42),
        };
        let sealed = keys.seal(ROOM, &t);
        assert_eq!(keys.open(ROOM, &sealed, NOW), Ok(t));
        // Tag 4 with lane 0 is no ticket this build writes.
        let mut pt = [0u8; MAX_PT_LEN];
        let n = encode_plaintext(&t, &mut pt);
        pt[16 + 1] = 0;
        assert_eq!(decode_plaintext(&pt[..n]), None);
    }

    fn queued() -> Ticket {
        Ticket {
            visitor: VisitorId([7; 16]),
            grant: Grant::Queued {
                seq: 0x0102_0304_0506_0708,
                lane: 0,
            },
            expires_ms: EXPIRES,
            net: None,
        }
    }

    fn admitted() -> Ticket {
        Ticket {
            visitor: VisitorId([0xAB; 16]),
            grant: Grant::Admitted {
                session_expires_ms: NOW + 600_000,
                check_in_due_ms: NOW + 30_000,
            },
            expires_ms: EXPIRES,
            net: Some(network_of([192, 0, 2, 77].into())),
        }
    }

    #[test]
    fn a_note_opens_only_for_its_purpose_and_never_as_a_ticket() {
        let ring = KeyRing::new(&[key(1), key(2)]);
        let note = ring.seal_note("page", b"what to show");
        assert_eq!(
            ring.open_note("page", &note).as_deref(),
            Some(&b"what to show"[..])
        );
        assert_eq!(ring.open_note("other", &note), None);
        // Any key of the ring opens it; a ring without the key does not.
        assert!(KeyRing::new(&[key(9), key(1)])
            .open_note("page", &note)
            .is_some());
        assert_eq!(KeyRing::new(&[key(2)]).open_note("page", &note), None);
        // A ticket is no note, and a note no ticket.
        let ticket = ring.seal(ROOM, &queued());
        assert_eq!(ring.open_note(ROOM, &ticket), None);
        assert!(ring.open(ROOM, &note, NOW).is_err());
        // Flipping any byte spoils it.
        let raw = decode(&note);
        for i in 0..raw.len() {
            let mut bad = raw.clone();
            bad[i] ^= 1;
            assert_eq!(ring.open_note("page", &encode(&bad)), None, "byte {i}");
        }
        assert_eq!(ring.open_note("page", &"A".repeat(MAX_NOTE_LEN + 1)), None);
    }

    fn decode(v: &str) -> Vec<u8> {
        URL_SAFE_NO_PAD.decode(v).expect("own cookie decodes")
    }

    fn encode(raw: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(raw)
    }

    /// Two distinct keys whose ids collide.
    fn colliding_keys() -> (Secret32, Secret32) {
        let mut seen = std::collections::HashMap::new();
        for i in 0..=u16::MAX {
            let mut k = [0u8; 32];
            k[..2].copy_from_slice(&i.to_be_bytes());
            let k = Secret32(k);
            if let Some(other) = seen.insert(key_id(&k), k.clone()) {
                return (other, k);
            }
        }
        unreachable!("256 ids cannot hold 65536 keys apart")
    }

    /// Two keys whose ids differ.
    fn distinct_keys() -> (Secret32, Secret32) {
        let a = key(1);
        let b = (2..=255)
            .map(key)
            .find(|b| key_id(b) != key_id(&a))
            .expect("some id differs");
        (a, b)
    }

    #[test]
    fn networks_are_the_slash_24_or_the_slash_64() {
        let net = |s: &str| network_of(s.parse().unwrap());
        assert_eq!(net("192.0.2.1"), net("192.0.2.254"));
        assert_ne!(net("192.0.2.1"), net("192.0.3.1"));
        assert_eq!(net("::ffff:192.0.2.9"), net("192.0.2.1"));
        assert_eq!(net("2001:db8:1:2::1"), net("2001:db8:1:2:ffff::9"));
        assert_ne!(net("2001:db8:1:2::1"), net("2001:db8:1:3::1"));
        // No IPv6 /64 is taken for an IPv4 /24.
        assert_ne!(net("0.0.0.1"), net("::1"));
        assert_eq!(net("10.1.2.3") >> 56, 0xff);
    }

    #[test]
    fn a_ticket_with_a_trailing_field_of_another_length_is_refused() {
        let mut pt = [0u8; MAX_PT_LEN];
        let len = encode_plaintext(&admitted(), &mut pt);
        assert!(decode_plaintext(&pt[..len]).is_some());
        assert!(decode_plaintext(&pt[..len - 1]).is_none());
        assert!(
            decode_plaintext(&pt[..len - 8]).is_some(),
            "no network: an older ticket"
        );
        assert!(decode_plaintext(&pt[..len - 9]).is_none());
    }

    #[test]
    fn round_trips_both_grants() {
        let ring = KeyRing::new(&[key(1)]);
        for t in [queued(), admitted()] {
            let v = ring.seal(ROOM, &t);
            assert_eq!(ring.open(ROOM, &v, NOW), Ok(t));
        }
    }

    #[test]
    fn a_shadow_place_round_trips_and_looks_like_a_queue_place() {
        let ring = KeyRing::new(&[key(1)]);
        let shadow = Ticket {
            grant: Grant::Shadow {
                since_ms: NOW,
                position: 1234,
            },
            ..queued()
        };
        let v = ring.seal(ROOM, &shadow);
        assert_eq!(ring.open(ROOM, &v, NOW), Ok(shadow));
        assert_eq!(v.len(), ring.seal(ROOM, &queued()).len());
        // Positions past the packed field's range are held at its top.
        let far = Ticket {
            grant: Grant::Shadow {
                since_ms: NOW,
                position: u64::MAX,
            },
            ..queued()
        };
        let opened = ring.open(ROOM, &ring.seal(ROOM, &far), NOW).unwrap();
        assert_eq!(
            opened.grant,
            Grant::Shadow {
                since_ms: NOW,
                position: (1 << SHADOW_POSITION_BITS) - 1
            }
        );
    }

    #[test]
    fn round_trips_extreme_values() {
        let ring = KeyRing::new(&[key(1)]);
        for t in [
            Ticket {
                visitor: VisitorId([0; 16]),
                grant: Grant::Queued { seq: 0, lane: 0 },
                expires_ms: 1,
                net: Some(0),
            },
            Ticket {
                visitor: VisitorId([0xFF; 16]),
                grant: Grant::Admitted {
                    session_expires_ms: u64::MAX,
                    check_in_due_ms: u64::MAX,
                },
                expires_ms: u64::MAX,
                net: Some(u64::MAX),
            },
        ] {
            assert_eq!(ring.open(ROOM, &ring.seal(ROOM, &t), 0), Ok(t));
        }
    }

    #[test]
    fn cookie_is_base64url_without_padding_and_of_known_length() {
        let ring = KeyRing::new(&[key(1)]);
        let q = ring.seal(ROOM, &queued());
        let a = ring.seal(ROOM, &admitted());
        // These lengths are the cookie budget the proxy pays per request.
        // (The queued one here is a ticket without a network, as sealed
        // before networks were recorded; with one it is 95.)
        assert_eq!(q.len(), 84);
        assert_eq!(a.len(), 106);
        for v in [q, a] {
            assert!(v
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
            assert_eq!(decode(&v)[0], VERSION);
        }
    }

    #[test]
    fn two_seals_of_one_ticket_differ() {
        let ring = KeyRing::new(&[key(1)]);
        let a = ring.seal(ROOM, &queued());
        let b = ring.seal(ROOM, &queued());
        assert_ne!(a, b);
        assert_ne!(decode(&a)[2..14], decode(&b)[2..14], "nonces differ");
        assert_eq!(ring.open(ROOM, &a, NOW), ring.open(ROOM, &b, NOW));
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        let ring = KeyRing::new(&[key(1)]);
        for t in [queued(), admitted()] {
            let raw = decode(&ring.seal(ROOM, &t));
            for pos in 0..raw.len() {
                for bit in 0..8 {
                    let mut bad = raw.clone();
                    bad[pos] ^= 1 << bit;
                    let want = match pos {
                        0 => TicketError::Version,
                        1 => TicketError::UnknownKey,
                        _ => TicketError::Forged,
                    };
                    assert_eq!(
                        ring.open(ROOM, &encode(&bad), NOW),
                        Err(want),
                        "byte {pos} bit {bit}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_truncation_is_refused() {
        let ring = KeyRing::new(&[key(1)]);
        for t in [queued(), admitted()] {
            let v = ring.seal(ROOM, &t);
            for len in 0..v.len() {
                let got = ring.open(ROOM, &v[..len], NOW);
                // A short admitted cookie can have a queued cookie's length;
                // it then reaches the cipher and fails there.
                assert!(
                    matches!(got, Err(TicketError::Malformed | TicketError::Forged)),
                    "prefix {len}: {got:?}"
                );
            }
            let raw = decode(&v);
            for len in 0..raw.len() {
                let got = ring.open(ROOM, &encode(&raw[..len]), NOW);
                assert!(
                    matches!(got, Err(TicketError::Malformed | TicketError::Forged)),
                    "byte prefix {len}: {got:?}"
                );
            }
        }
    }

    #[test]
    fn appended_bytes_are_refused() {
        let ring = KeyRing::new(&[key(1)]);
        let mut raw = decode(&ring.seal(ROOM, &admitted()));
        raw.push(0);
        assert!(ring.open(ROOM, &encode(&raw), NOW).is_err());
    }

    #[test]
    fn foreign_room_is_refused() {
        let ring = KeyRing::new(&[key(1)]);
        let v = ring.seal(ROOM, &queued());
        for other in ["sale2", "sal", "Sale", "", "other"] {
            assert_eq!(
                ring.open(other, &v, NOW),
                Err(TicketError::Forged),
                "{other}"
            );
        }
        // Rooms longer than the stack buffer take the heap path both ways.
        let long = "r".repeat(300);
        let v = ring.seal(&long, &queued());
        assert_eq!(ring.open(&long, &v, NOW), Ok(queued()));
        assert_eq!(ring.open(&long[1..], &v, NOW), Err(TicketError::Forged));
    }

    #[test]
    fn key_not_in_ring_is_refused() {
        let (a, b) = distinct_keys();
        let v = KeyRing::new(&[a]).seal(ROOM, &queued());
        assert_eq!(
            KeyRing::new(&[b]).open(ROOM, &v, NOW),
            Err(TicketError::UnknownKey)
        );
        // Same id, different key: the id matches, the tag does not.
        let (c, d) = colliding_keys();
        let v = KeyRing::new(&[c]).seal(ROOM, &queued());
        assert_eq!(
            KeyRing::new(&[d]).open(ROOM, &v, NOW),
            Err(TicketError::Forged)
        );
    }

    #[test]
    fn colliding_ids_try_every_key() {
        let (c, d) = colliding_keys();
        assert_ne!(c, d);
        assert_eq!(key_id(&c), key_id(&d));
        let by_c = KeyRing::new(std::slice::from_ref(&c)).seal(ROOM, &queued());
        let by_d = KeyRing::new(std::slice::from_ref(&d)).seal(ROOM, &queued());
        for ring in [KeyRing::new(&[c.clone(), d.clone()]), KeyRing::new(&[d, c])] {
            assert_eq!(ring.open(ROOM, &by_c, NOW), Ok(queued()));
            assert_eq!(ring.open(ROOM, &by_d, NOW), Ok(queued()));
        }
    }

    #[test]
    fn wrong_version_is_refused() {
        let ring = KeyRing::new(&[key(1)]);
        let raw = decode(&ring.seal(ROOM, &queued()));
        for version in [0, 2, 0x80, 0xFF] {
            let mut bad = raw.clone();
            bad[0] = version;
            assert_eq!(
                ring.open(ROOM, &encode(&bad), NOW),
                Err(TicketError::Version)
            );
        }
    }

    #[test]
    fn expiry_is_checked_at_and_after_expires_ms() {
        let ring = KeyRing::new(&[key(1)]);
        for t in [queued(), admitted()] {
            let v = ring.seal(ROOM, &t);
            assert_eq!(ring.open(ROOM, &v, EXPIRES - 1), Ok(t));
            assert_eq!(ring.open(ROOM, &v, EXPIRES), Err(TicketError::Expired));
            assert_eq!(ring.open(ROOM, &v, EXPIRES + 1), Err(TicketError::Expired));
            assert_eq!(ring.open(ROOM, &v, u64::MAX), Err(TicketError::Expired));
        }
    }

    #[test]
    fn authentication_comes_before_expiry() {
        let ring = KeyRing::new(&[key(1)]);
        let mut raw = decode(&ring.seal(ROOM, &queued()));
        let last = raw.len() - 1;
        raw[last] ^= 1;
        assert_eq!(
            ring.open(ROOM, &encode(&raw), u64::MAX),
            Err(TicketError::Forged)
        );
        let v = ring.seal(ROOM, &queued());
        assert_eq!(ring.open("other", &v, u64::MAX), Err(TicketError::Forged));
    }

    #[test]
    fn garbage_is_malformed() {
        let ring = KeyRing::new(&[key(1)]);
        let valid = ring.seal(ROOM, &admitted());
        let overlong_b64 = "A".repeat(MAX_VALUE_LEN + 1);
        let overlong_valid_prefix = format!("{valid}{}", "A".repeat(MAX_VALUE_LEN));
        let with_padding = format!("{valid}=");
        let with_plus = valid.replace(['-', '_'], "+");
        let cases: &[&str] = &[
            "",
            "A",
            "AA",
            "====",
            "not a cookie",
            "%00%01",
            "é€😀",
            "\0\0\0\0",
            &overlong_b64,
            &overlong_valid_prefix,
            &with_padding,
        ];
        for &c in cases {
            assert_eq!(
                ring.open(ROOM, c, NOW),
                Err(TicketError::Malformed),
                "{c:?}"
            );
        }
        // Up to the limit a value is decoded; these then fail on the header.
        for c in ["_".repeat(MAX_VALUE_LEN), "A".repeat(MAX_VALUE_LEN - 1)] {
            assert_eq!(ring.open(ROOM, &c, NOW), Err(TicketError::Version));
        }
        if with_plus != valid {
            assert_eq!(
                ring.open(ROOM, &with_plus, NOW),
                Err(TicketError::Malformed)
            );
        }
    }

    #[test]
    fn authentic_but_unreadable_plaintext_is_malformed() {
        let ring = KeyRing::new(&[key(1)]);
        let mut pt = [0u8; MAX_PT_LEN];
        let len = encode_plaintext(&queued(), &mut pt);
        // Unknown grant tags.
        for tag in [0, 5, 0xFF] {
            let mut bad = pt;
            bad[16] = tag;
            let v = ring.seal_plaintext(ROOM, &bad[..len]);
            assert_eq!(ring.open(ROOM, &v, NOW), Err(TicketError::Malformed));
        }
        // A queued tag with an admitted-sized body (with its network), and the reverse.
        let v = ring.seal_plaintext(ROOM, &pt[..ADMITTED_PT_LEN + NET_LEN]);
        assert_eq!(ring.open(ROOM, &v, NOW), Err(TicketError::Malformed));
        let mut apt = [0u8; MAX_PT_LEN];
        encode_plaintext(&admitted(), &mut apt);
        let v = ring.seal_plaintext(ROOM, &apt[..QUEUED_PT_LEN]);
        assert_eq!(ring.open(ROOM, &v, NOW), Err(TicketError::Malformed));
        // Every length in between, but the admitted ticket without a network.
        for n in (MIN_PT_LEN + 1..MAX_PT_LEN).filter(|&n| n != ADMITTED_PT_LEN) {
            let v = ring.seal_plaintext(ROOM, &apt[..n]);
            assert_eq!(ring.open(ROOM, &v, NOW), Err(TicketError::Malformed));
        }
    }

    #[test]
    fn rotation_opens_old_cookies_and_seals_with_the_new_key() {
        let (new, old) = distinct_keys();
        let before = KeyRing::new(std::slice::from_ref(&old));
        let after = KeyRing::new(&[new.clone(), old.clone()]);
        assert_eq!(after.key_ids(), vec![key_id(&new), key_id(&old)]);

        let old_cookie = before.seal(ROOM, &admitted());
        assert_eq!(after.open(ROOM, &old_cookie, NOW), Ok(admitted()));

        let new_cookie = after.seal(ROOM, &admitted());
        assert_eq!(decode(&new_cookie)[1], key_id(&new));
        assert_eq!(
            KeyRing::new(&[new]).open(ROOM, &new_cookie, NOW),
            Ok(admitted())
        );
        // The old ring does not know the new key: the cookie is from the future.
        assert_eq!(
            before.open(ROOM, &new_cookie, NOW),
            Err(TicketError::UnknownKey)
        );
    }

    #[test]
    fn key_id_depends_on_the_key_only() {
        let (a, b) = distinct_keys();
        let ring = KeyRing::new(&[b.clone(), a.clone(), a.clone()]);
        assert_eq!(
            ring.key_ids(),
            vec![key_id(&b), key_id(&a)],
            "duplicate dropped"
        );
        assert_eq!(key_id(&a), key_id(&a.clone()));
    }

    #[test]
    fn empty_ring_still_works_with_an_ephemeral_key() {
        let ring = KeyRing::new(&[]);
        let v = ring.seal(ROOM, &queued());
        assert_eq!(ring.open(ROOM, &v, NOW), Ok(queued()));
        assert!(KeyRing::new(&[]).open(ROOM, &v, NOW).is_err());
    }

    #[test]
    fn debug_shows_no_key_material() {
        let ring = KeyRing::new(&[key(0x41)]);
        let s = format!("{ring:?}");
        assert!(s.contains("key_ids"));
        assert!(!s.contains("65, 65") && !s.contains("AAAA"));
    }

    #[test]
    fn keyring_is_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<KeyRing>();
        let ring = std::sync::Arc::new(KeyRing::new(&[key(1)]));
        let handles: Vec<_> = (0..4u8)
            .map(|i| {
                let ring = ring.clone();
                std::thread::spawn(move || {
                    let mut t = queued();
                    t.visitor = VisitorId([i; 16]);
                    (0..100).all(|_| ring.open(ROOM, &ring.seal(ROOM, &t), NOW) == Ok(t))
                })
            })
            .collect();
        for h in handles {
            assert!(h.join().expect("thread ran"));
        }
    }

    #[test]
    fn random_input_never_panics_and_always_errs() {
        let ring = KeyRing::new(&[key(1)]);
        let id = key_id(&key(1));
        let mut rng = StdRng::seed_from_u64(0x7469_636b_6574);
        for _ in 0..4000 {
            // Arbitrary bytes, made into a &str.
            let len = rng.gen_range(0..400);
            let bytes: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            let s = String::from_utf8_lossy(&bytes);
            assert!(ring.open(ROOM, &s, NOW).is_err());

            // Arbitrary base64url strings, any length up to past the limit.
            const ALPHABET: &[u8] =
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
            let len = rng.gen_range(0..300);
            let s: String = (0..len)
                .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
                .collect();
            assert!(ring.open(ROOM, &s, NOW).is_err());

            // Random bodies behind a valid header, so they reach the cipher.
            let len = rng.gen_range(0..MAX_RAW_LEN + 8);
            let mut raw: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            if let Some(h) = raw.get_mut(..2) {
                h.copy_from_slice(&[VERSION, id]);
            }
            assert!(ring.open(ROOM, &encode(&raw), NOW).is_err());
        }
    }
}
