//! Secrets: values that never print (admin token, bypass header value,
//! cookie keys), how cookie keys are written and made, and comparing
//! secrets without leaking how much of a guess was right.

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::{DecodePaddingMode, Engine};
use rand::RngCore;
use subtle::ConstantTimeEq;

/// A secret string that never prints.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl Secret {
    /// Whether `given` is this secret, in time that does not depend on
    /// where the first difference is.
    pub fn matches(&self, given: &[u8]) -> bool {
        constant_time_eq(given, self.0.as_bytes())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// A 32-byte key that never prints.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret32(pub [u8; 32]);

impl std::fmt::Debug for Secret32 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret32(..)")
    }
}

/// Compares secrets without an early exit that leaks how much matched
/// (the length still shows, as it does on the wire).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
}

/// A fresh random cookie key, base64 (what `waitroom keygen` prints).
pub fn generate_key() -> String {
    base64::engine::general_purpose::STANDARD.encode(random_32())
}

/// Parses a cookie key from config: standard or url-safe base64, padded or
/// not, decoding to exactly 32 bytes. Surrounding whitespace is ignored (keys
/// often come from files or environment variables with a trailing newline).
/// The error never contains the value, which is a secret.
pub fn parse_key(s: &str) -> Result<Secret32, String> {
    const STANDARD_ANY_PAD: GeneralPurpose = GeneralPurpose::new(
        &alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    const URL_SAFE_ANY_PAD: GeneralPurpose = GeneralPurpose::new(
        &alphabet::URL_SAFE,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    const HINT: &str = "generate one with `waitroom keygen`";

    let s = s.trim();
    if s.is_empty() {
        return Err(format!("the key is empty; {HINT}"));
    }
    // 32 bytes are 43 base64 characters, 44 with padding. Checking first
    // gives a clear message for the common mistakes (a hex key, a passphrase)
    // and never decodes something large.
    if !(43..=44).contains(&s.len()) {
        return Err(format!(
            "the key must be 32 bytes in base64 (43 or 44 characters), got {} characters; {HINT}",
            s.len()
        ));
    }
    let engine = if s.contains(['-', '_']) {
        &URL_SAFE_ANY_PAD
    } else {
        &STANDARD_ANY_PAD
    };
    // The decoder's own error names the offending character; not repeated
    // here because it is part of the secret.
    let bytes = engine.decode(s).map_err(|_| {
        format!("the key is not valid base64 (standard or url-safe alphabet); {HINT}")
    })?;
    let key: [u8; 32] = bytes.as_slice().try_into().map_err(|_| {
        format!(
            "the key decodes to {} bytes, expected 32; {HINT}",
            bytes.len()
        )
    })?;
    Ok(Secret32(key))
}

pub(crate) fn random_32() -> [u8; 32] {
    let mut key = [0u8; 32];
    // Keys are long-lived, so take them straight from the OS; the thread RNG
    // (a CSPRNG seeded from the OS) is only the fallback should that fail.
    if rand::rngs::OsRng.try_fill_bytes(&mut key).is_err() {
        rand::thread_rng().fill_bytes(&mut key);
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares_exactly() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(Secret("s3".into()).matches(b"s3"));
    }

    #[test]
    fn generated_keys_parse_and_differ() {
        let a = generate_key();
        let b = generate_key();
        assert_ne!(a, b);
        assert_eq!(a.len(), 44);
        let key = parse_key(&a).expect("own key parses");
        assert_eq!(base64::engine::general_purpose::STANDARD.encode(key.0), a);
    }

    #[test]
    fn parse_key_accepts_every_base64_spelling() {
        // 0xFB.. makes '+' and '/' (or '-' and '_') appear in the text.
        let bytes = [0xFBu8; 32];
        use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE};
        for s in [
            STANDARD.encode(bytes),
            STANDARD_NO_PAD.encode(bytes),
            URL_SAFE.encode(bytes),
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes),
            format!("  {}\n", STANDARD.encode(bytes)),
        ] {
            assert_eq!(parse_key(&s), Ok(Secret32(bytes)), "{s:?}");
        }
    }

    #[test]
    fn parse_key_refuses_wrong_input_without_echoing_it() {
        use base64::engine::general_purpose::STANDARD;
        let std31 = STANDARD.encode([0xFBu8; 31]);
        let std33 = STANDARD.encode([0xFBu8; 33]);
        let mixed = {
            let mut s = STANDARD.encode([0xFBu8; 32]);
            s.replace_range(0..1, "-");
            s
        };
        let bad_char = format!("{}!", &STANDARD.encode([7u8; 32])[..42]);
        let hex = "ab".repeat(32);
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("   \n", "empty"),
            ("hunter2", "got 7 characters"),
            (&hex, "got 64 characters"),
            (&std31, "decodes to 31 bytes"),
            (&std33, "decodes to 33 bytes"),
            (&mixed, "not valid base64"),
            (&bad_char, "not valid base64"),
        ];
        for (input, want) in cases {
            let err = parse_key(input).expect_err(input);
            assert!(err.contains(want), "{input:?}: {err}");
            let trimmed = input.trim();
            if trimmed.len() > 3 {
                assert!(!err.contains(trimmed), "error echoes the secret: {err}");
            }
        }
    }
}
