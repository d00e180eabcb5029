//! Enqueue tokens: a compact JWT the site signs (after its login) naming
//! the person (`sub`), the room, an expiry and optionally a one-time id
//! (`jti`) and the address it was given to (`ip`). The gate turns a
//! verified `sub` into the visitor id the room knows that person by, so
//! one person holds one place or session across every instance, however
//! many browsers and addresses they come from (`Gate::token_arrival`).
//!
//! Verified here: the three parts, `alg` (HS256 with the room's shared
//! keys; EdDSA (Ed25519) and RS256 with public keys from a JWKS file; never
//! `none`, and a key only ever verifies its own algorithm, so a public key
//! can never be used as an HMAC secret), the signature, `exp`. The caller
//! checks `room`, `ip` and `jti`.

use std::net::IpAddr;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::engine::Engine;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;

/// Longer tokens are refused unread.
pub const MAX_TOKEN_LEN: usize = 4096;

/// A public key from the JWKS file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PublicKey {
    /// `kty: OKP`, `crv: Ed25519`: the 32-byte key.
    Ed25519 { kid: Option<String>, key: Vec<u8> },
    /// `kty: RSA`: modulus and exponent, big-endian.
    Rsa {
        kid: Option<String>,
        n: Vec<u8>,
        e: Vec<u8>,
    },
}

/// The keys a room's tokens are checked with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenKeys {
    /// HS256 secrets.
    pub hmac: Vec<Vec<u8>>,
    pub public: Vec<PublicKey>,
}

/// What a verified token says.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Claims {
    pub sub: String,
    pub room: String,
    /// Seconds since the Unix epoch.
    pub exp: u64,
    #[serde(default)]
    pub jti: Option<String>,
    #[serde(default)]
    pub ip: Option<IpAddr>,
    /// The priority lane the site puts this user in (`[[room.lane]]` with
    /// `token_claim`).
    #[serde(default)]
    pub lane: Option<String>,
}

/// Why a token was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("malformed")]
    Malformed,
    #[error("algorithm not accepted")]
    Algorithm,
    #[error("no key verifies it")]
    Signature,
    #[error("expired")]
    Expired,
    #[error("for another room")]
    OtherRoom,
    #[error("for another address")]
    OtherAddress,
    #[error("used before")]
    Replayed,
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
}

/// Verifies `token` with `keys` at `now_s` (seconds): its signature and
/// expiry. Never panics, whatever `token` holds.
pub fn verify(token: &str, keys: &TokenKeys, now_s: u64) -> Result<Claims, TokenError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(TokenError::Malformed);
    }
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed);
    };
    let decode = |part: &str| {
        URL_SAFE_NO_PAD
            .decode(part)
            .map_err(|_| TokenError::Malformed)
    };
    let header: Header = serde_json::from_slice(&decode(h)?).map_err(|_| TokenError::Malformed)?;
    let signature = decode(s)?;
    let signed = &token.as_bytes()[..h.len() + 1 + p.len()];
    let kid_fits =
        |kid: &Option<String>| header.kid.is_none() || kid.is_none() || *kid == header.kid;
    let verified = match header.alg.as_str() {
        "HS256" => keys.hmac.iter().any(|secret| {
            Hmac::<Sha256>::new_from_slice(secret)
                .map(|mut mac| {
                    mac.update(signed);
                    mac.verify_slice(&signature).is_ok()
                })
                .unwrap_or(false)
        }),
        "EdDSA" => keys.public.iter().any(|k| match k {
            PublicKey::Ed25519 { kid, key } if kid_fits(kid) => {
                ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, key)
                    .verify(signed, &signature)
                    .is_ok()
            }
            _ => false,
        }),
        "RS256" => keys.public.iter().any(|k| match k {
            PublicKey::Rsa { kid, n, e } if kid_fits(kid) => {
                ring::signature::RsaPublicKeyComponents { n, e }
                    .verify(
                        &ring::signature::RSA_PKCS1_2048_8192_SHA256,
                        signed,
                        &signature,
                    )
                    .is_ok()
            }
            _ => false,
        }),
        _ => return Err(TokenError::Algorithm),
    };
    if !verified {
        return Err(TokenError::Signature);
    }
    // Read only once it is authentic.
    let claims: Claims = serde_json::from_slice(&decode(p)?).map_err(|_| TokenError::Malformed)?;
    if claims.sub.is_empty() || claims.sub.len() > 256 {
        return Err(TokenError::Malformed);
    }
    if claims.exp <= now_s {
        return Err(TokenError::Expired);
    }
    Ok(claims)
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
    use proptest::prelude::*;

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

    #[test]
    fn a_good_token_verifies_and_a_bad_one_says_why() {
        let t = hs256(b"secret", r#"{"alg":"HS256"}"#, CLAIMS);
        let c = verify(&t, &keys(), 1000).unwrap();
        assert_eq!(
            (c.sub.as_str(), c.room.as_str(), c.exp),
            ("u1", "shop", 2000)
        );
        assert_eq!(verify(&t, &keys(), 2000), Err(TokenError::Expired));
        let other = hs256(b"other", r#"{"alg":"HS256"}"#, CLAIMS);
        assert_eq!(verify(&other, &keys(), 1000), Err(TokenError::Signature));
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
            URL_SAFE_NO_PAD.encode(CLAIMS)
        );
        assert_eq!(verify(&none, &keys(), 1000), Err(TokenError::Algorithm));
        let none_upper = none.replacen(
            &URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
            &URL_SAFE_NO_PAD.encode(r#"{"alg":"NONE"}"#),
            1,
        );
        assert_eq!(
            verify(&none_upper, &keys(), 1000),
            Err(TokenError::Algorithm)
        );
        assert_eq!(verify("a.b", &keys(), 1000), Err(TokenError::Malformed));
        assert_eq!(verify("a.b.c.d", &keys(), 1000), Err(TokenError::Malformed));
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
        assert_eq!(verify(&forged, &keys, 1000), Err(TokenError::Signature));
        // And an EdDSA header over an HMAC: no Ed25519 key takes it.
        let forged = hs256(b"secret", r#"{"alg":"EdDSA"}"#, CLAIMS);
        assert_eq!(
            verify(&forged, &self::keys(), 1000),
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
        assert_eq!(verify(&token, &keys, 1000).unwrap().sub, "u1");
        let other_kid = token.replacen(
            &h,
            &URL_SAFE_NO_PAD.encode(r#"{"alg":"EdDSA","kid":"k2"}"#),
            1,
        );
        assert_eq!(verify(&other_kid, &keys, 1000), Err(TokenError::Signature));
        assert!(parse_jwks(r#"{"keys":[{"kty":"EC"}]}"#).is_err());
        assert!(parse_jwks(r#"{"keys":[]}"#).is_err());
    }

    proptest! {
        #[test]
        fn verify_never_panics(token in ".{0,600}") {
            let _ = verify(&token, &keys(), 1000);
        }

        #[test]
        fn verify_never_panics_on_three_base64_parts(
            h in proptest::collection::vec(any::<u8>(), 0..80),
            p in proptest::collection::vec(any::<u8>(), 0..80),
            s in proptest::collection::vec(any::<u8>(), 0..80),
        ) {
            let t = format!("{}.{}.{}", URL_SAFE_NO_PAD.encode(h), URL_SAFE_NO_PAD.encode(p), URL_SAFE_NO_PAD.encode(s));
            prop_assert!(verify(&t, &keys(), 1000).is_err());
        }

        #[test]
        fn no_alg_but_the_three_is_taken(alg in "[A-Za-z0-9]{0,8}") {
            prop_assume!(!["HS256", "EdDSA", "RS256"].contains(&alg.as_str()));
            let t = hs256(b"secret", &format!(r#"{{"alg":"{alg}"}}"#), CLAIMS);
            prop_assert_eq!(verify(&t, &keys(), 1000), Err(TokenError::Algorithm));
        }
    }
}
