//! Cost of the ticket cookie on the request path: seal, open (valid and
//! forged), with base64 decoding of the same cookie as the in-run baseline.

use std::hint::black_box;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use criterion::{criterion_group, criterion_main, Criterion};
use waitroom::config::Secret32;
use waitroom::store::VisitorId;
use waitroom::ticket::{Grant, KeyRing, Ticket};

const ROOM: &str = "sale";
const NOW: u64 = 1_700_000_000_000;

fn tickets() -> [(&'static str, Ticket); 2] {
    [
        (
            "queued",
            Ticket {
                visitor: VisitorId([7; 16]),
                grant: Grant::Queued {
                    seq: 123_456_789,
                    lane: 0,
                },
                expires_ms: NOW + 60_000,
                net: Some(0xff00_0000_00c0_0002),
            },
        ),
        (
            "admitted",
            Ticket {
                visitor: VisitorId([7; 16]),
                grant: Grant::Admitted {
                    session_expires_ms: NOW + 600_000,
                    check_in_due_ms: NOW + 30_000,
                },
                expires_ms: NOW + 600_000,
                net: Some(0xff00_0000_00c0_0002),
            },
        ),
    ]
}

/// The cookie with one ciphertext bit flipped: decodes, reaches the cipher,
/// fails the tag check (the most expensive refusal).
fn tampered(value: &str) -> String {
    let mut raw = URL_SAFE_NO_PAD.decode(value).expect("own cookie decodes");
    raw[20] ^= 1;
    URL_SAFE_NO_PAD.encode(raw)
}

fn bench(c: &mut Criterion) {
    // A rotated ring: the sealing key first, an old one behind it.
    let ring = KeyRing::new(&[Secret32([1; 32]), Secret32([2; 32])]);
    let mut g = c.benchmark_group("ticket");
    for (name, t) in tickets() {
        let value = ring.seal(ROOM, &t);
        let forged = tampered(&value);
        assert!(ring.open(ROOM, &value, NOW).is_ok());
        assert!(ring.open(ROOM, &forged, NOW).is_err());
        eprintln!("{name}: cookie value is {} bytes", value.len());

        g.bench_function(format!("baseline_b64_decode/{name}"), |b| {
            b.iter(|| URL_SAFE_NO_PAD.decode(black_box(&value)))
        });
        g.bench_function(format!("seal/{name}"), |b| {
            b.iter(|| ring.seal(black_box(ROOM), black_box(&t)))
        });
        g.bench_function(format!("open_valid/{name}"), |b| {
            b.iter(|| ring.open(black_box(ROOM), black_box(&value), NOW))
        });
        g.bench_function(format!("open_tampered/{name}"), |b| {
            b.iter(|| ring.open(black_box(ROOM), black_box(&forged), NOW))
        });
    }
    let overlong = "A".repeat(4096);
    g.bench_function("open_overlong", |b| {
        b.iter(|| ring.open(black_box(ROOM), black_box(&overlong), NOW))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
