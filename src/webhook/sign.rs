//! The signature of a delivery (`X-Waitroom-Signature`): HMAC-SHA256 of
//! `"<timestamp>.<body>"` under the webhook's secret, written
//! `v1=<lowercase hex>`; and its check, as a receiver makes it
//! (docs/webhooks.md, "Verifying a delivery").

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

type HmacSha256 = Hmac<Sha256>;

/// The version tag of the signature scheme, before the `=`.
const SCHEME: &str = "v1";

fn mac(secret: &[u8], timestamp: &str, body: &[u8]) -> [u8; 32] {
    // HMAC takes a key of any length; this cannot fail.
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.finalize().into_bytes().into()
}

/// The `X-Waitroom-Signature` value of `body` sent at `timestamp` (Unix
/// seconds, as in `X-Waitroom-Timestamp`): `v1=` and the lowercase hex of
/// HMAC-SHA256(`secret`, `"<timestamp>.<body>"`).
pub fn sign(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    let digest = mac(secret, &timestamp.to_string(), body);
    let mut out = String::with_capacity(SCHEME.len() + 1 + 64);
    out.push_str(SCHEME);
    out.push('=');
    for b in digest {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Whether `header` (an `X-Waitroom-Signature` value) signs `body` sent
/// at `timestamp` (the `X-Waitroom-Timestamp` value, as received) under
/// `secret`. The header may carry several comma-separated `v1=` values;
/// one that matches is enough. The comparison takes the same time
/// wherever a guess differs. The timestamp's freshness is the
/// receiver's to check (docs/webhooks.md suggests 5 minutes).
pub fn verify(secret: &[u8], timestamp: &str, body: &[u8], header: &str) -> bool {
    let timestamp = timestamp.trim();
    if timestamp.is_empty() || !timestamp.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    let expected = mac(secret, timestamp, body);
    let mut any = false;
    for item in header.split(',') {
        let Some((scheme, hex)) = item.trim().split_once('=') else {
            continue;
        };
        if scheme != SCHEME {
            continue;
        }
        if let Some(given) = unhex(hex) {
            any |= bool::from(given.ct_eq(&expected));
        }
    }
    any
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        out[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_is_the_hmac_of_timestamp_dot_body_in_lowercase_hex() {
        // Against the MAC of the whole message computed in one piece.
        let sig = sign(b"Jefe", 12, b"body");
        assert!(sig.starts_with("v1="));
        assert_eq!(sig.len(), 3 + 64);
        assert!(sig[3..].bytes().all(|b| HEX.contains(&b)));
        let mut m = HmacSha256::new_from_slice(b"Jefe").unwrap();
        m.update(b"12.body");
        let want: [u8; 32] = m.finalize().into_bytes().into();
        assert_eq!(unhex(&sig[3..]), Some(want));
    }

    #[test]
    fn verify_takes_the_right_signature_only() {
        let secret = b"0123456789abcdef";
        let sig = sign(secret, 1_700_000_000, b"{\"a\":1}");
        // As `printf '1700000000.{"a":1}' | openssl dgst -sha256 -hmac
        // 0123456789abcdef` computes it (docs/webhooks.md).
        assert_eq!(
            sig,
            "v1=9eb18f493f8ec135d9eb2dad817c369bb4e9cbfa818657897a7437c1cd8c3a23"
        );
        assert!(verify(secret, "1700000000", b"{\"a\":1}", &sig));
        assert!(verify(
            secret,
            "1700000000",
            b"{\"a\":1}",
            &format!("v0=00, {}", sig.to_uppercase().replace("V1=", "v1="))
        ));
        assert!(!verify(
            b"another secret!!",
            "1700000000",
            b"{\"a\":1}",
            &sig
        ));
        assert!(!verify(secret, "1700000001", b"{\"a\":1}", &sig));
        assert!(!verify(secret, "1700000000", b"{\"a\":2}", &sig));
        assert!(!verify(secret, "", b"{\"a\":1}", &sig));
        assert!(!verify(secret, "1700000000", b"{\"a\":1}", &sig[..40]));
        assert!(!verify(secret, "1700000000", b"{\"a\":1}", ""));
        assert!(!verify(
            secret,
            "1700000000",
            b"{\"a\":1}",
            &sig.replace("v1=", "v2=")
        ));
    }
}
