//! Cost of the visitor's language on the pages that answer floods: a 429
//! page copied from the per-language prerender against rendering the message
//! template per request (how the English-only pages were made: the in-run
//! baseline), the queue page in English and in Russian, and choosing the
//! language from a browser's `Accept-Language` and from a hostile one.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use http::header::{HeaderMap, HeaderValue, ACCEPT_LANGUAGE};
use minijinja::{context, AutoEscape, Environment};
use waitroom::i18n::{negotiate, Lang, Language};
use waitroom::queue_page::{render_message, Msg, QueueView, Status, Template, VisitorState};

fn pages(c: &mut Criterion) {
    let mut g = c.benchmark_group("pages");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);

    // Baseline: the message template run per request (compiled once).
    let mut env = Environment::new();
    env.set_auto_escape_callback(|_| AutoEscape::Html);
    env.add_template("message.html", waitroom::queue_page::MESSAGE_TEMPLATE)
        .unwrap();
    let t = Lang::De.strings();
    g.bench_function("429 page: template per request (baseline)", |b| {
        b.iter(|| {
            env.get_template("message.html")
                .unwrap()
                .render(context! {
                    lang => "de",
                    title => t.get("slow_down_title"),
                    text => t.get("slow_down_text"),
                    refresh_seconds => black_box(7u64),
                })
                .unwrap()
        })
    });
    render_message(Msg::SlowDown, Lang::De, 7);
    g.bench_function("429 page: prerendered, German", |b| {
        b.iter(|| render_message(Msg::SlowDown, black_box(Lang::De), black_box(7)))
    });
    let mut headers = HeaderMap::new();
    headers.insert(
        ACCEPT_LANGUAGE,
        HeaderValue::from_static("de-DE,de;q=0.9,en-US;q=0.8,en;q=0.7"),
    );
    g.bench_function("429 page: choose from header + prerendered", |b| {
        b.iter(|| {
            let chosen = Language::Auto.choose(black_box(&headers));
            render_message(Msg::SlowDown, chosen.lang, black_box(7))
        })
    });

    let status = Status {
        room: "shop".into(),
        state: VisitorState::Queued,
        position: 1234,
        queue_length: 5000,
        eta_seconds: 700,
        refresh_seconds: 20,
        event: None,
        starts_in_seconds: None,
        general_from: None,
        stock_left: None,
        challenge: None,
        captcha: None,
        lane: None,
        notice: None,
    };
    let template = Template::builtin();
    for lang in [Lang::En, Lang::Ru] {
        let view = QueueView::new(&status, "Shop", "/s".into(), 0, lang);
        g.bench_function(format!("queue page: {}", lang.code()), |b| {
            b.iter(|| template.render(black_box(&view)))
        });
    }

    let browser = HeaderValue::from_static("de-DE,de;q=0.9,en-US;q=0.8,en;q=0.7");
    g.bench_function("negotiate: browser header", |b| {
        b.iter(|| negotiate(std::iter::once(black_box(&browser))))
    });
    let hostile = HeaderValue::from_str(&"x-y;q=0.1, ".repeat(1400)).unwrap();
    g.bench_function("negotiate: 15 KB hostile header", |b| {
        b.iter(|| negotiate(std::iter::once(black_box(&hostile))))
    });
    g.finish();
}

criterion_group!(benches, pages);
criterion_main!(benches);
