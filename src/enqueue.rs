//! Enqueue tokens: a compact JWT the site signs (after its login) naming
//! the person (`sub`), the room, an expiry and optionally a one-time id
//! (`jti`) and the address it was given to (`ip`). The gate turns a
//! verified `sub` into the visitor id the room knows that person by, so
//! one person holds one place or session across every instance, however
//! many browsers and addresses they come from (`gate::Admission::enqueue_entry`).
//!
//! Verified here, by the `jsonwebtoken` crate: the three parts, `alg`
//! (HS256 with the room's shared keys; EdDSA (Ed25519) and RS256 with
//! public keys from a JWKS file; never `none`, and a key only ever
//! verifies its own algorithm family, so a public key can never be used as
//! an HMAC secret), the signature, `aud` (the room id or the room's
//! `audience`; required when `audience` is set) and `iss` (one of the
//! room's `issuer`, when set). Then, against the daemon's clock (the crate
//! reads the system's, which tests cannot move): `exp` in the future,
//! `nbf` not after now plus [`NBF_LEEWAY_S`], and `exp` no further than
//! the room's `max_lifetime` from now. The caller checks `room`, `ip` and
//! `jti`.

use std::net::IpAddr;

pub(crate) mod jwks;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::engine::Engine;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

/// Longer tokens are refused unread.
pub const MAX_TOKEN_LEN: usize = 4096;

/// How far ahead of the daemon's clock the site's clock may be: a token
/// whose `nbf` is at most this far in the future is taken.
pub const NBF_LEEWAY_S: u64 = 60;

/// `max_lifetime` when the room does not set it: a day.
pub const DEFAULT_MAX_LIFETIME_S: u64 = 24 * 3600;

/// `[room.enqueue_token]`'s `jwks_url` and how often it is fetched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JwksUrl {
    /// An `http://` or `https://` URL with a host and no user or password.
    pub url: http::Uri,
    /// `jwks_min_refresh`: the least time between two fetches asked for by
    /// a token naming a `kid` the set lacks.
    pub min_refresh: std::time::Duration,
    /// `jwks_max_age`: how long a fetched set is used before it is fetched
    /// again (a `Cache-Control: max-age` in the answer may shorten it).
    pub max_age: std::time::Duration,
}

/// A public key from the JWKS file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PublicKey {
    /// `kty: OKP`, `crv: Ed25519`: the 32-byte key.
    Ed25519 {
        /// The JWK's `kid`; a token naming another `kid` is not tried with it.
        kid: Option<String>,
        /// The public key's 32 bytes.
        key: Vec<u8>,
    },
    /// `kty: RSA`: modulus and exponent, big-endian.
    Rsa {
        /// The JWK's `kid`, as for `Ed25519`.
        kid: Option<String>,
        /// The modulus.
        n: Vec<u8>,
        /// The public exponent.
        e: Vec<u8>,
    },
}

/// The keys a room's tokens are checked with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenKeys {
    /// HS256 secrets.
    pub hmac: Vec<Vec<u8>>,
    /// Ed25519 and RSA keys from the JWKS file.
    pub public: Vec<PublicKey>,
}

/// What a room asks of a token besides a good signature: its audience,
/// issuer and longest lifetime, as `jsonwebtoken` validations made once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rules {
    /// Seconds: a token whose `exp` is further than this from now is refused.
    max_lifetime_s: u64,
    hs256: Validation,
    eddsa: Validation,
    rs256: Validation,
}

impl Rules {
    /// For room `room`: `aud`, when the token has one, is `room`; no
    /// issuer asked; the default lifetime cap.
    pub fn for_room(room: &str) -> Self {
        Self::new(room, &[], &[], DEFAULT_MAX_LIFETIME_S)
    }

    /// `aud` is `room` or one of `audience` (required when `audience` is
    /// not empty); `iss` one of `issuer` (required when not empty); `exp`
    /// at most `max_lifetime_s` ahead.
    pub fn new(room: &str, audience: &[String], issuer: &[String], max_lifetime_s: u64) -> Self {
        let validation = |alg| {
            let mut v = Validation::new(alg);
            // Times are checked against the daemon's clock (`verify`).
            v.validate_exp = false;
            v.validate_nbf = false;
            let mut required = vec!["exp"];
            let mut aud = vec![room.to_owned()];
            aud.extend(audience.iter().cloned());
            v.set_audience(&aud);
            if !audience.is_empty() {
                required.push("aud");
            }
            if !issuer.is_empty() {
                v.set_issuer(issuer);
                required.push("iss");
            }
            v.set_required_spec_claims(&required);
            v
        };
        Self {
            max_lifetime_s,
            hs256: validation(Algorithm::HS256),
            eddsa: validation(Algorithm::EdDSA),
            rs256: validation(Algorithm::RS256),
        }
    }
}

/// What a verified token says.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Claims {
    pub(crate) sub: String,
    pub(crate) room: String,
    /// Seconds since the Unix epoch.
    pub exp: u64,
    /// Not before: seconds since the Unix epoch.
    #[serde(default)]
    pub nbf: Option<u64>,
    #[serde(default)]
    pub(crate) jti: Option<String>,
    #[serde(default)]
    pub(crate) ip: Option<IpAddr>,
    /// The priority lane the site puts this user in (`[[room.lane]]` with
    /// `token_claim`).
    #[serde(default)]
    pub lane: Option<String>,
}

/// Why a token was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not a token this daemon reads: too long, not three parts, unreadable
    /// claims, or a `sub` empty or over 256 bytes.
    #[error("malformed")]
    Malformed,
    /// An `alg` other than HS256, EdDSA and RS256 (`none` among them).
    #[error("algorithm not accepted")]
    Algorithm,
    /// No key of the room verifies the signature.
    #[error("no key verifies it")]
    Signature,
    /// `exp` is past.
    #[error("expired")]
    Expired,
    /// `nbf` is further ahead than [`NBF_LEEWAY_S`].
    #[error("not valid yet (nbf)")]
    NotYet,
    /// `exp` is further ahead than the room's `max_lifetime`.
    #[error("lives longer than max_lifetime")]
    TooLong,
    /// `aud` names neither the room nor one of its `audience`.
    #[error("for another audience")]
    Audience,
    /// `iss` is not one of the room's `issuer`.
    #[error("from another issuer")]
    Issuer,
    /// The `room` claim names another room.
    #[error("for another room")]
    OtherRoom,
    /// The `ip` claim names another client address.
    #[error("for another address")]
    OtherAddress,
    /// Its `jti` was handed in before.
    #[error("used before")]
    Replayed,
}

/// Verifies `token` with `keys` and `rules` at `now_s` (seconds): its
/// signature, audience, issuer and times. Never panics, whatever `token`
/// holds.
pub fn verify(
    token: &str,
    keys: &TokenKeys,
    rules: &Rules,
    now_s: u64,
) -> Result<Claims, TokenError> {
    if token.len() > MAX_TOKEN_LEN || token.bytes().filter(|&b| b == b'.').count() != 2 {
        return Err(TokenError::Malformed);
    }
    let header = jsonwebtoken::decode_header(token).map_err(|_| unread_header(token))?;
    let kid = header.kid.as_deref();
    let kid_fits = |k: &Option<String>| kid.is_none() || k.is_none() || k.as_deref() == kid;
    let try_key = |key: DecodingKey, validation: &Validation| {
        jsonwebtoken::decode::<Claims>(token, &key, validation)
            .map(|data| data.claims)
            .map_err(|e| refusal(e.kind()))
    };
    let mut verified = Err(TokenError::Signature);
    match header.alg {
        Algorithm::HS256 => {
            for secret in &keys.hmac {
                verified = try_key(DecodingKey::from_secret(secret), &rules.hs256);
                if verified != Err(TokenError::Signature) {
                    break;
                }
            }
        }
        Algorithm::EdDSA | Algorithm::RS256 => {
            for k in &keys.public {
                verified = match (header.alg, k) {
                    (Algorithm::EdDSA, PublicKey::Ed25519 { kid, key }) if kid_fits(kid) => {
                        try_key(DecodingKey::from_ed_der(key), &rules.eddsa)
                    }
                    (Algorithm::RS256, PublicKey::Rsa { kid, n, e }) if kid_fits(kid) => {
                        try_key(DecodingKey::from_rsa_raw_components(n, e), &rules.rs256)
                    }
                    _ => continue,
                };
                if verified != Err(TokenError::Signature) {
                    break;
                }
            }
        }
        _ => return Err(TokenError::Algorithm),
    }
    let claims = verified?;
    if claims.sub.is_empty() || claims.sub.len() > 256 {
        return Err(TokenError::Malformed);
    }
    if claims.exp <= now_s {
        return Err(TokenError::Expired);
    }
    if claims
        .nbf
        .is_some_and(|nbf| nbf > now_s.saturating_add(NBF_LEEWAY_S))
    {
        return Err(TokenError::NotYet);
    }
    if claims.exp - now_s > rules.max_lifetime_s {
        return Err(TokenError::TooLong);
    }
    Ok(claims)
}

/// Whether `token` (refused for its signature) names a `kid` for a public
/// key that `keys` lacks: a key the room's JWKS URL may have since
/// gained.
pub(crate) fn names_unknown_kid(token: &str, keys: &TokenKeys) -> bool {
    let Ok(header) = jsonwebtoken::decode_header(token) else {
        return false;
    };
    let Some(kid) = header.kid else {
        return false;
    };
    matches!(header.alg, Algorithm::EdDSA | Algorithm::RS256)
        && !keys.public.iter().any(|k| match k {
            PublicKey::Ed25519 {
                kid: Some(have), ..
            }
            | PublicKey::Rsa {
                kid: Some(have), ..
            } => *have == kid,
            _ => false,
        })
}

/// Why a header `jsonwebtoken` cannot read was refused: an `alg` it does
/// not know (`none` among them) is the algorithm; anything else, the form.
fn unread_header(token: &str) -> TokenError {
    #[derive(Deserialize)]
    struct Named {
        #[allow(dead_code)]
        alg: String,
    }
    let header = token.split('.').next().unwrap_or_default();
    match URL_SAFE_NO_PAD
        .decode(header)
        .ok()
        .and_then(|h| serde_json::from_slice::<Named>(&h).ok())
    {
        Some(_) => TokenError::Algorithm,
        None => TokenError::Malformed,
    }
}

/// A `jsonwebtoken` refusal as ours.
fn refusal(kind: &ErrorKind) -> TokenError {
    match kind {
        ErrorKind::InvalidSignature
        | ErrorKind::InvalidEcdsaKey
        | ErrorKind::InvalidRsaKey(_)
        | ErrorKind::InvalidKeyFormat => TokenError::Signature,
        ErrorKind::InvalidAlgorithm
        | ErrorKind::InvalidAlgorithmName
        | ErrorKind::MissingAlgorithm => TokenError::Algorithm,
        ErrorKind::InvalidAudience => TokenError::Audience,
        ErrorKind::MissingRequiredClaim(c) if c == "aud" => TokenError::Audience,
        ErrorKind::InvalidIssuer => TokenError::Issuer,
        ErrorKind::MissingRequiredClaim(c) if c == "iss" => TokenError::Issuer,
        ErrorKind::ExpiredSignature => TokenError::Expired,
        ErrorKind::ImmatureSignature => TokenError::NotYet,
        _ => TokenError::Malformed,
    }
}

/// Reads a JWKS document's Ed25519 and RSA keys (others are skipped;
/// a key without a usable `kty` is an error).
pub fn parse_jwks(text: &str) -> Result<Vec<PublicKey>, String> {
    #[derive(Deserialize)]
    struct Jwks {
        keys: Vec<serde_json::Value>,
    }
    let jwks: Jwks = serde_json::from_str(text).map_err(|e| format!("not a JWKS document: {e}"))?;
    let mut keys = Vec::new();
    for (i, k) in jwks.keys.iter().enumerate() {
        let field = |name: &str| -> Result<Vec<u8>, String> {
            let v = k[name]
                .as_str()
                .ok_or_else(|| format!("key {i}: no `{name}`"))?;
            URL_SAFE_NO_PAD
                .decode(v)
                .map_err(|_| format!("key {i}: `{name}` is not base64url"))
        };
        let kid = k["kid"].as_str().map(str::to_owned);
        match (k["kty"].as_str(), k["crv"].as_str()) {
            (Some("OKP"), Some("Ed25519")) => {
                let key = field("x")?;
                if key.len() != 32 {
                    return Err(format!("key {i}: an Ed25519 key is 32 bytes"));
                }
                keys.push(PublicKey::Ed25519 { kid, key });
            }
            (Some("RSA"), _) => keys.push(PublicKey::Rsa {
                kid,
                n: field("n")?,
                e: field("e")?,
            }),
            (kty, _) => return Err(format!("key {i}: kty {kty:?} is not OKP (Ed25519) or RSA")),
        }
    }
    if keys.is_empty() {
        return Err("no keys".into());
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hmac::{Hmac, Mac};
    use proptest::prelude::*;
    use sha2::Sha256;

    fn hs256(secret: &[u8], header: &str, claims: &str) -> String {
        let h = URL_SAFE_NO_PAD.encode(header);
        let p = URL_SAFE_NO_PAD.encode(claims);
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
        mac.update(format!("{h}.{p}").as_bytes());
        let s = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
        format!("{h}.{p}.{s}")
    }

    const CLAIMS: &str = r#"{"sub":"u1","room":"shop","exp":2000}"#;

    fn keys() -> TokenKeys {
        TokenKeys {
            hmac: vec![b"secret".to_vec()],
            public: vec![],
        }
    }

    fn rules() -> Rules {
        Rules::for_room("shop")
    }

    fn good(claims: &str, rules: &Rules, now: u64) -> Result<Claims, TokenError> {
        verify(
            &hs256(b"secret", r#"{"alg":"HS256"}"#, claims),
            &keys(),
            rules,
            now,
        )
    }

    #[test]
    fn nbf_is_honoured_with_a_minute_of_leeway() {
        let at = |nbf: u64| format!(r#"{{"sub":"u1","room":"shop","exp":2000,"nbf":{nbf}}}"#);
        assert_eq!(good(&at(1000), &rules(), 1000).unwrap().nbf, Some(1000));
        assert!(good(&at(1060), &rules(), 1000).is_ok(), "within the leeway");
        assert_eq!(good(&at(1061), &rules(), 1000), Err(TokenError::NotYet));
        assert_eq!(good(&at(1900), &rules(), 1000), Err(TokenError::NotYet));
    }

    #[test]
    fn a_token_living_longer_than_max_lifetime_is_refused() {
        let until = |exp: u64| format!(r#"{{"sub":"u1","room":"shop","exp":{exp}}}"#);
        let day = DEFAULT_MAX_LIFETIME_S;
        assert!(good(&until(1000 + day), &rules(), 1000).is_ok());
        assert_eq!(
            good(&until(1001 + day), &rules(), 1000),
            Err(TokenError::TooLong)
        );
        assert_eq!(
            good(&until(u64::MAX), &rules(), 1000),
            Err(TokenError::TooLong)
        );
        let hour = Rules::new("shop", &[], &[], 3600);
        assert_eq!(good(&until(4601), &hour, 1000), Err(TokenError::TooLong));
        assert!(good(&until(4600), &hour, 1000).is_ok());
    }

    #[test]
    fn aud_is_the_room_or_a_configured_audience_and_iss_is_checked_when_set() {
        let with = |extra: &str| format!(r#"{{"sub":"u1","room":"shop","exp":2000{extra}}}"#);
        // No audience set: `aud` may be absent, else it names the room.
        assert!(good(&with(""), &rules(), 1000).is_ok());
        assert!(good(&with(r#","aud":"shop""#), &rules(), 1000).is_ok());
        // A list names every recipient: the room among them is enough.
        assert!(good(&with(r#","aud":["billing","shop"]"#), &rules(), 1000).is_ok());
        for aud in [
            r#","aud":"billing""#,
            r#","aud":["billing","vip"]"#,
            r#","aud":"""#,
        ] {
            assert_eq!(
                good(&with(aud), &rules(), 1000),
                Err(TokenError::Audience),
                "{aud}"
            );
        }
        // An audience set: `aud` is required, the room or that audience.
        let site = Rules::new("shop", &["https://shop.example".into()], &[], 3600);
        assert_eq!(good(&with(""), &site, 1000), Err(TokenError::Audience));
        assert!(good(&with(r#","aud":"https://shop.example""#), &site, 1000).is_ok());
        assert!(good(&with(r#","aud":"shop""#), &site, 1000).is_ok());
        assert_eq!(
            good(&with(r#","aud":"vip""#), &site, 1000),
            Err(TokenError::Audience)
        );
        // An issuer set: `iss` is required and must be it.
        let issued = Rules::new("shop", &[], &["https://login.example".into()], 3600);
        assert!(good(&with(r#","iss":"https://login.example""#), &issued, 1000).is_ok());
        assert_eq!(good(&with(""), &issued, 1000), Err(TokenError::Issuer));
        assert_eq!(
            good(&with(r#","iss":"https://evil.example""#), &issued, 1000),
            Err(TokenError::Issuer)
        );
        // Without an issuer set, any `iss` is taken.
        assert!(good(&with(r#","iss":"anyone""#), &rules(), 1000).is_ok());
    }

    #[test]
    fn an_oversized_token_is_refused_unread() {
        let big = format!(
            r#"{{"sub":"u1","room":"shop","exp":2000,"x":"{}"}}"#,
            "a".repeat(4096)
        );
        assert_eq!(good(&big, &rules(), 1000), Err(TokenError::Malformed));
    }

    #[test]
    fn a_good_token_verifies_and_a_bad_one_says_why() {
        let t = hs256(b"secret", r#"{"alg":"HS256"}"#, CLAIMS);
        let c = verify(&t, &keys(), &rules(), 1000).unwrap();
        assert_eq!(
            (c.sub.as_str(), c.room.as_str(), c.exp),
            ("u1", "shop", 2000)
        );
        assert_eq!(
            verify(&t, &keys(), &rules(), 2000),
            Err(TokenError::Expired)
        );
        let other = hs256(b"other", r#"{"alg":"HS256"}"#, CLAIMS);
        assert_eq!(
            verify(&other, &keys(), &rules(), 1000),
            Err(TokenError::Signature)
        );
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
            URL_SAFE_NO_PAD.encode(CLAIMS)
        );
        assert_eq!(
            verify(&none, &keys(), &rules(), 1000),
            Err(TokenError::Algorithm)
        );
        let none_upper = none.replacen(
            &URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
            &URL_SAFE_NO_PAD.encode(r#"{"alg":"NONE"}"#),
            1,
        );
        assert_eq!(
            verify(&none_upper, &keys(), &rules(), 1000),
            Err(TokenError::Algorithm)
        );
        assert_eq!(
            verify("a.b", &keys(), &rules(), 1000),
            Err(TokenError::Malformed)
        );
        assert_eq!(
            verify("a.b.c.d", &keys(), &rules(), 1000),
            Err(TokenError::Malformed)
        );
    }

    #[test]
    fn a_public_key_is_never_an_hmac_secret() {
        // Key confusion: an HS256 token "signed" with the bytes of a public
        // key the daemon holds for EdDSA or RS256.
        let public = vec![7u8; 32];
        let keys = TokenKeys {
            hmac: vec![],
            public: vec![
                PublicKey::Ed25519 {
                    kid: None,
                    key: public.clone(),
                },
                PublicKey::Rsa {
                    kid: None,
                    n: public.clone(),
                    e: vec![1, 0, 1],
                },
            ],
        };
        let forged = hs256(&public, r#"{"alg":"HS256"}"#, CLAIMS);
        assert_eq!(
            verify(&forged, &keys, &rules(), 1000),
            Err(TokenError::Signature)
        );
        // And an EdDSA header over an HMAC: no Ed25519 key takes it.
        let forged = hs256(b"secret", r#"{"alg":"EdDSA"}"#, CLAIMS);
        assert_eq!(
            verify(&forged, &self::keys(), &rules(), 1000),
            Err(TokenError::Signature)
        );
    }

    #[test]
    fn an_ed25519_token_verifies_with_its_jwks_key() {
        use ring::signature::KeyPair;
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        let jwks = format!(
            r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","kid":"k1","x":"{}"}}]}}"#,
            URL_SAFE_NO_PAD.encode(pair.public_key().as_ref())
        );
        let keys = TokenKeys {
            hmac: vec![],
            public: parse_jwks(&jwks).unwrap(),
        };
        let h = URL_SAFE_NO_PAD.encode(r#"{"alg":"EdDSA","kid":"k1"}"#);
        let p = URL_SAFE_NO_PAD.encode(CLAIMS);
        let s = URL_SAFE_NO_PAD.encode(pair.sign(format!("{h}.{p}").as_bytes()).as_ref());
        let token = format!("{h}.{p}.{s}");
        assert_eq!(verify(&token, &keys, &rules(), 1000).unwrap().sub, "u1");
        let other_kid = token.replacen(
            &h,
            &URL_SAFE_NO_PAD.encode(r#"{"alg":"EdDSA","kid":"k2"}"#),
            1,
        );
        assert_eq!(
            verify(&other_kid, &keys, &rules(), 1000),
            Err(TokenError::Signature)
        );
        assert!(parse_jwks(r#"{"keys":[{"kty":"EC"}]}"#).is_err());
        assert!(parse_jwks(r#"{"keys":[]}"#).is_err());
    }

    proptest! {
        #[test]
        fn verify_never_panics(token in ".{0,600}") {
            let _ = verify(&token, &keys(), &rules(), 1000);
        }

        #[test]
        fn verify_never_panics_on_three_base64_parts(
            h in proptest::collection::vec(any::<u8>(), 0..80),
            p in proptest::collection::vec(any::<u8>(), 0..80),
            s in proptest::collection::vec(any::<u8>(), 0..80),
        ) {
            let t = format!("{}.{}.{}", URL_SAFE_NO_PAD.encode(h), URL_SAFE_NO_PAD.encode(p), URL_SAFE_NO_PAD.encode(s));
            prop_assert!(verify(&t, &keys(), &rules(), 1000).is_err());
        }

        #[test]
        fn no_alg_but_the_three_is_taken(alg in "[A-Za-z0-9]{0,8}") {
            prop_assume!(!["HS256", "EdDSA", "RS256"].contains(&alg.as_str()));
            let t = hs256(b"secret", &format!(r#"{{"alg":"{alg}"}}"#), CLAIMS);
            prop_assert_eq!(verify(&t, &keys(), &rules(), 1000), Err(TokenError::Algorithm));
        }
    }
}
