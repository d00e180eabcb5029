//! Cost of verifying an enqueue token (`waitroom::enqueue::verify`): HS256
//! and EdDSA, good and forged, with the bare signature check over the same
//! bytes (HMAC-SHA256, Ed25519 in ring) as the in-run baseline.

use std::hint::black_box;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use criterion::{criterion_group, criterion_main, Criterion};
use hmac::{Hmac, Mac};
use ring::signature::KeyPair;
use sha2::Sha256;
use waitroom::enqueue::{verify, PublicKey, TokenKeys};

const NOW: u64 = 1_700_000_000;
const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

fn claims() -> String {
    format!(
        r#"{{"sub":"user-42","room":"shop","exp":{},"jti":"j-1","aud":"shop"}}"#,
        NOW + 600
    )
}

fn hs256() -> (String, Vec<u8>) {
    let h = URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256","typ":"JWT"}"#);
    let p = URL_SAFE_NO_PAD.encode(claims());
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET).unwrap();
    mac.update(format!("{h}.{p}").as_bytes());
    let sig = mac.finalize().into_bytes().to_vec();
    (format!("{h}.{p}.{}", URL_SAFE_NO_PAD.encode(&sig)), sig)
}

fn bench(c: &mut Criterion) {
    let keys = TokenKeys {
        hmac: vec![SECRET.to_vec()],
        public: vec![],
    };
    let rules = waitroom::enqueue::Rules::for_room("shop");
    let (token, sig) = hs256();
    let signed = &token.as_bytes()[..token.rfind('.').unwrap()];
    let mut g = c.benchmark_group("enqueue token");
    g.bench_function("HS256 baseline: HMAC-SHA256 verify", |b| {
        b.iter(|| {
            let mut mac = Hmac::<Sha256>::new_from_slice(SECRET).unwrap();
            mac.update(black_box(signed));
            black_box(mac.verify_slice(&sig).is_ok())
        })
    });
    g.bench_function("HS256 verify (good)", |b| {
        b.iter(|| black_box(verify(black_box(&token), &keys, &rules, NOW).is_ok()))
    });
    let forged = format!("{}A", &token[..token.len() - 1]);
    g.bench_function("HS256 verify (forged)", |b| {
        b.iter(|| black_box(verify(black_box(&forged), &keys, &rules, NOW).is_err()))
    });

    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    let public = pair.public_key().as_ref().to_vec();
    let ed_keys = TokenKeys {
        hmac: vec![],
        public: vec![PublicKey::Ed25519 {
            kid: Some("k1".into()),
            key: public.clone(),
        }],
    };
    let h = URL_SAFE_NO_PAD.encode(r#"{"alg":"EdDSA","kid":"k1"}"#);
    let p = URL_SAFE_NO_PAD.encode(claims());
    let signed = format!("{h}.{p}");
    let sig = pair.sign(signed.as_bytes()).as_ref().to_vec();
    let ed_token = format!("{signed}.{}", URL_SAFE_NO_PAD.encode(&sig));
    g.bench_function("EdDSA baseline: Ed25519 verify", |b| {
        b.iter(|| {
            let key = ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, &public);
            black_box(key.verify(black_box(signed.as_bytes()), &sig).is_ok())
        })
    });
    g.bench_function("EdDSA verify (good)", |b| {
        b.iter(|| black_box(verify(black_box(&ed_token), &ed_keys, &rules, NOW).is_ok()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
