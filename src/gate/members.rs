//! Enqueue tokens at the gate (`[room.enqueue_token]`, `crate::enqueue`):
//! a newcomer who brings a verified token arrives under the visitor id the
//! room knows its `sub` by, derived from the cookie key, so every instance
//! finds the same session or place for the same person, however many
//! browsers and addresses they come from. A `jti` is good once across the
//! instances (noted in the store); `room` and `ip` must match. Without a
//! token, `required` turns the newcomer away with a page saying why.

use std::borrow::Cow;

use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderName};
use sha2::{Digest, Sha256};

use super::{Admission, Ctx, Room};
use crate::domain::VisitorId;
use crate::enqueue::{self, TokenError};
use crate::store::StoreError;

/// The header apps send a token in.
pub(crate) const X_WAITROOM_TOKEN: HeaderName = HeaderName::from_static("x-waitroom-token");
/// The query parameter a link carries a token in.
pub(crate) const TOKEN_PARAM: &str = crate::canonical::OWN_PARAMS[0];

/// How long the room remembers that a `sub` came (at least as long as its
/// token lives): a member not seen for this long holds no place in the
/// back of the queue that a store must read through to find.
pub(crate) const MEMBER_MEMORY_MS: u64 = 24 * 3_600_000;

/// How long after a `jti`'s first use a copy of the same token is the
/// same arrival (a double click, a retried request, a second tab), folded
/// into the member's place rather than refused as a replay.
pub(crate) const JTI_FOLD_MS: u64 = 10_000;

/// Separates the member-id key from any other use of the cookie key.
const MEMBER_KEY_PREFIX: &[u8] = b"waitroom/member\0";

/// What a newcomer's token says about its entry.
pub(super) enum Entry {
    /// No token and none needed: a visitor like any other.
    Anyone,
    /// A verified member, under this id, with its token's `lane` claim,
    /// and whether the room had not seen its `sub` within
    /// [`MEMBER_MEMORY_MS`] (so it holds no place a store must look for
    /// at length).
    Member {
        visitor: VisitorId,
        claim: Option<String>,
        unseen: bool,
        /// The token's `jti`, if this arrival is its first use (given
        /// back if it gets no place: `Admission::give_back`); `None` for a copy
        /// folded within `JTI_FOLD_MS`.
        jti: Option<u64>,
    },
    /// Turned away: no token where one is required (`missing`), or one
    /// that does not hold.
    Refused { missing: bool },
    /// A member arriving again too soon, too often (`Room::member_limit`):
    /// asked to come back after this long, nothing asked of the store.
    Limited(std::time::Duration),
}

/// The key member ids are derived with, from the first cookie key (so
/// every instance sharing the keys derives the same ids).
pub(crate) fn member_key(first_cookie_key: &[u8; 32]) -> [u8; 32] {
    Sha256::new()
        .chain_update(MEMBER_KEY_PREFIX)
        .chain_update(first_cookie_key)
        .finalize()
        .into()
}

/// What a request brings for `header` (an app's), else for `param` (its
/// link's): an enqueue token, a lane code.
pub(super) fn presented<'r>(
    headers: &'r HeaderMap,
    query: Option<&'r str>,
    header: &HeaderName,
    param: &str,
) -> Option<Cow<'r, str>> {
    if let Some(v) = headers.get(header) {
        return v.to_str().ok().map(Cow::Borrowed);
    }
    let query = query?;
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == param)
        .map(|(_, v)| Cow::Owned(v.into_owned()))
}

use crate::domain::digest64 as hash64;

impl Admission {
    /// What the newcomer's token (or its absence) means for its entry.
    pub(super) async fn enqueue_entry(
        &self,
        room: &Room,
        headers: &HeaderMap,
        ctx: &Ctx<'_>,
    ) -> Result<Entry, StoreError> {
        let Some(rule) = room.config.enqueue_token.as_ref() else {
            return Ok(Entry::Anyone);
        };
        let query = ctx.canonical.query();
        let Some(token) = presented(headers, query, &X_WAITROOM_TOKEN, TOKEN_PARAM) else {
            if rule.required {
                room.metrics.token_refused.inc();
                return Ok(Entry::Refused { missing: true });
            }
            return Ok(Entry::Anyone);
        };
        let fetched;
        let keys = match &room.jwks {
            Some(jwks) => {
                fetched = jwks.keys();
                &*fetched
            }
            None => &rule.keys,
        };
        let verified = enqueue::verify(&token, keys, &rule.rules, ctx.now / 1000);
        if let (Err(TokenError::Signature), Some(jwks)) = (&verified, &room.jwks) {
            if enqueue::names_unknown_kid(&token, keys) {
                // Refused with the keys held now; the fetch task looks
                // again (at most once per jwks_min_refresh), for the next.
                tracing::debug!(room = %room.config.id, "enqueue token names a kid the JWKS lacks; refused, and the JWKS is fetched again");
                jwks.unknown_kid();
            }
        }
        let checked = verified.and_then(|c| {
            if c.room != room.config.id {
                Err(TokenError::OtherRoom)
            } else if c.ip.is_some_and(|ip| ip != ctx.client) {
                Err(TokenError::OtherAddress)
            } else {
                Ok(c)
            }
        });
        let claims = match checked {
            Ok(c) => c,
            Err(why) => {
                room.metrics.token_refused.inc();
                tracing::debug!(room = %room.config.id, client = %ctx.client, %why, "enqueue token refused");
                return Ok(Entry::Refused { missing: false });
            }
        };
        let visitor = self.member_id(room, &claims.sub);
        // Each arrival of a member looks up its place: one token sent
        // again and again, from any number of addresses, is spaced out.
        if let Err(wait) = room.member_limit.check(visitor) {
            room.metrics.limited.inc();
            return Ok(Entry::Limited(wait));
        }
        let until = claims.exp.saturating_mul(1000);
        // A token passed round is a shared ticket: its networks count
        // with those of the member's session (`Admission::moved_network`).
        let max = self.tickets.max_networks;
        if max > 0 {
            let set = format!("nets:{}", visitor.to_hex());
            let noted = self
                .store
                .note(room, &set, &[ctx.net], until, ctx.now)
                .await?;
            if noted.size > max {
                room.metrics.shared.inc();
                tracing::warn!(
                    room = %room.config.id,
                    networks = noted.size,
                    limit = max,
                    "an enqueue token was used from too many networks; refused"
                );
                return Ok(Entry::Refused { missing: false });
            }
        }
        room.metrics.token_verified.inc();
        let remember = until.max(ctx.now + MEMBER_MEMORY_MS);
        let noted = self
            .store
            .note(room, "subs", &[hash64(&claims.sub)], remember, ctx.now)
            .await?;
        if noted.added == 0 {
            // Someone came back (another browser, address or instance):
            // they find their own place, not a second one.
            room.metrics.token_folded.inc();
        }
        let unseen = noted.added == 1;
        // Last, so that no refusal above spends it.
        let mut spent = None;
        if let Some(jti) = claims.jti.as_deref().map(hash64) {
            let noted = self.store.note(room, "jti", &[jti], until, ctx.now).await?;
            if noted.added == 1 {
                // The first use. A copy of it within JTI_FOLD_MS (a double
                // click, a retry, a second tab) is the same arrival.
                let window = ctx.now + JTI_FOLD_MS;
                self.store
                    .note(room, "jti_new", &[jti], window, ctx.now)
                    .await?;
                spent = Some(jti);
            } else {
                // Seen before: within the window of its first use, folded
                // into the member's place (a check that extends nothing);
                // after it, a replay.
                let first = self
                    .store
                    .note(room, "jti_new", &[jti], ctx.now, ctx.now)
                    .await?;
                if first.added == 1 {
                    room.metrics.token_replayed.inc();
                    tracing::debug!(room = %room.config.id, client = %ctx.client, "enqueue token replayed");
                    return Ok(Entry::Refused { missing: false });
                }
            }
        }
        Ok(Entry::Member {
            visitor,
            claim: claims.lane,
            unseen,
            jti: spent,
        })
    }

    /// The visitor id the room knows `sub` by.
    fn member_id(&self, room: &Room, sub: &str) -> VisitorId {
        let mut id = [0u8; 16];
        if let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.member_key) {
            mac.update(room.config.id.as_bytes());
            mac.update(b"\0");
            mac.update(sub.as_bytes());
            id.copy_from_slice(&mac.finalize().into_bytes()[..16]);
        }
        VisitorId(id)
    }
}
