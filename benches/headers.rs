//! What cleaning a visitor's request headers costs on every proxied request
//! (`proxy::headers::sanitize_inbound`): a typical browser request of 12
//! headers from an untrusted peer, nothing to remove. Beside it, the other
//! per-request step that reads the whole path: its match key
//! (`canonical::match_key`), for a plain path and one that needs trimming.
//!
//! `cargo bench --bench headers`

use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderMap, HeaderName, HeaderValue};
use waitroom::canonical::match_key;
use waitroom::proxy::headers::sanitize_inbound;

fn browser_request() -> HeaderMap {
    let mut h = HeaderMap::new();
    for (name, value) in [
        ("host", "shop.example"),
        (
            "user-agent",
            "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36",
        ),
        (
            "accept",
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
        ),
        ("accept-language", "en-GB,en;q=0.9"),
        ("accept-encoding", "gzip, deflate, br"),
        ("referer", "https://shop.example/"),
        ("sec-fetch-dest", "document"),
        ("sec-fetch-mode", "navigate"),
        ("sec-fetch-site", "same-origin"),
        ("upgrade-insecure-requests", "1"),
        ("cookie", "waitroom_shop=abc; theme=dark"),
        ("cache-control", "max-age=0"),
    ] {
        h.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    h
}

fn bench(c: &mut Criterion) {
    let template = browser_request();
    c.bench_function(
        "sanitize_inbound, 12 browser headers, untrusted peer",
        |b| {
            b.iter_batched_ref(
                || template.clone(),
                |h| sanitize_inbound(h, false, false),
                criterion::BatchSize::SmallInput,
            )
        },
    );
    for path in [
        "/shop/products/blue-shirt-42.html",
        "/shop./products;x/blue-shirt-42.html",
    ] {
        c.bench_function(&format!("match_key {path}"), |b| {
            b.iter(|| match_key(std::hint::black_box(path)).len())
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
