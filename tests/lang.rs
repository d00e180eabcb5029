//! The visitor's language (docs/how-it-works.md, "Languages") over real
//! HTTP: the queue, prequeue, closed and error pages in each shipped
//! language chosen from `Accept-Language`, the English fallback, a room's
//! fixed language, and an operator's template seeing `lang` and `t`.

mod support;

use std::time::Duration;

use support::{assert_queued_json, from_origin, Harness, T0};
use waitroom::config::{Config, EventConfig, Lang, Language};
use waitroom::store::{EventSpec, RoomState, Settings};

/// Per language: a header asking for it, and a known sentence of the queue
/// page, the prequeue page and the closed page (as they appear in HTML).
const LANGUAGES: &[(&str, &str, &str, &str, &str)] = &[
    (
        "en",
        "en-GB,en;q=0.9",
        "People in the queue",
        "Starts in:",
        "Sold out",
    ),
    ("zh", "zh-CN,zh;q=0.9", "排队人数", "距离开始：", "已售罄"),
    (
        "de",
        "de-DE",
        "Personen in der Warteschlange",
        "Beginnt in:",
        "Ausverkauft",
    ),
    (
        "es",
        "es-419,es;q=0.8",
        "Personas en la fila",
        "Empieza en:",
        "Agotado",
    ),
    (
        "fr",
        "fr-CA, fr;q=0.9",
        "Personnes dans la file",
        "Début dans\u{a0}:",
        "Épuisé",
    ),
    (
        "ja",
        "ja",
        "列に並んでいる人数",
        "開始まで：",
        "完売しました",
    ),
    (
        "pt",
        "pt-BR,pt;q=0.9,en;q=0.8",
        "Pessoas na fila",
        "Começa em:",
        "Esgotado",
    ),
    (
        "ru",
        "ru-RU,ru;q=0.9,en-US;q=0.8",
        "Человек в очереди",
        "До начала:",
        "Всё распродано",
    ),
];

/// A room of one place, already taken: every newcomer queues.
async fn full_room(tweak: impl FnOnce(&mut Config)) -> Harness {
    let h = Harness::start(|c| {
        c.rooms[0].total_active_users = 1;
        c.rooms[0].abandon_after = Duration::from_secs(600);
        tweak(c);
    })
    .await;
    assert!(from_origin(
        &h.visitor().get(h.url("/")).send().await.unwrap()
    ));
    h
}

/// A newcomer's page: status, `Content-Language`, `Vary`, body.
async fn page(h: &Harness, accept_language: Option<&str>) -> (u16, String, String, String) {
    let mut req = h.visitor().get(h.url("/shoes"));
    if let Some(al) = accept_language {
        req = req.header("accept-language", al);
    }
    let resp = req.send().await.unwrap();
    assert!(!from_origin(&resp));
    let header = |name: &str| {
        resp.headers()
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (language, vary) = (header("content-language"), header("vary"));
    (
        resp.status().as_u16(),
        language,
        vary,
        resp.text().await.unwrap(),
    )
}

fn lang_of(page: &str) -> &str {
    let start = page.find("<html lang=\"").expect("an <html lang>") + 12;
    &page[start..start + page[start..].find('"').unwrap()]
}

#[tokio::test]
async fn the_queue_page_speaks_each_language() {
    let h = full_room(|_| {}).await;
    for (code, header, queue, _, _) in LANGUAGES {
        let (status, language, vary, body) = page(&h, Some(header)).await;
        assert_eq!(status, 200);
        assert_eq!(lang_of(&body), *code, "{header}");
        assert!(body.contains(queue), "{code}: {body}");
        assert_eq!(language, *code);
        assert!(
            vary.to_ascii_lowercase().contains("accept-language"),
            "{vary}"
        );
    }
}

#[tokio::test]
async fn the_prequeue_page_speaks_each_language() {
    let h = Harness::start(|c| {
        c.rooms[0].abandon_after = Duration::from_secs(600);
        c.rooms[0].events = vec![EventConfig {
            spec: EventSpec {
                name: "drop".into(),
                prequeue_start_ms: Some(T0),
                start_ms: T0 + 3_600_000,
                end_ms: T0 + 7_200_000,
                shuffle_at_start: false,
                lanes_only_for_ms: None,
                settings: Settings::default(),
                notice: None,
            },
            template: None,
        }];
    })
    .await;
    for (code, header, _, starts_in, _) in LANGUAGES {
        let (status, _, _, body) = page(&h, Some(header)).await;
        assert_eq!(status, 200);
        assert_eq!(lang_of(&body), *code);
        assert!(body.contains(starts_in), "{code}: {body}");
        // The countdown (1 h) is in the language too.
        let countdown = waitroom::queue_page::countdown_text(3600, Lang::from_code(code).unwrap());
        assert!(body.contains(&countdown), "{code}: {countdown}");
    }
}

#[tokio::test]
async fn the_closed_page_speaks_each_language() {
    let h = Harness::start(|c| c.rooms[0].state = RoomState::Closed).await;
    for (code, header, _, _, closed) in LANGUAGES {
        let (status, language, _, body) = page(&h, Some(header)).await;
        assert_eq!(status, 503);
        assert_eq!(lang_of(&body), *code);
        assert_eq!(language, *code);
        assert!(body.contains(closed), "{code}: {body}");
    }
}

#[tokio::test]
async fn english_when_nothing_fits_and_the_preferred_language_otherwise() {
    let h = full_room(|_| {}).await;
    for (header, expected) in [
        (None, "en"),
        (Some("xx, tlh"), "en"),
        (Some(";;,=q=;de;q=abc,-,,"), "en"),
        (Some("de;q=1.5"), "en"),
        (Some("*"), "en"),
        (Some("fr;q=0"), "en"),
        (Some("pt-BR,pt;q=0.9,en;q=0.8"), "pt"),
        (Some("en;q=0.1, de;q=0.9"), "de"),
        (Some("zh-Hans-CN"), "zh"),
        (Some("zh-TW"), "zh"),
        (Some("nl-BE, nl;q=0.9, ja;q=0.2"), "ja"),
    ] {
        let (_, language, _, body) = page(&h, header).await;
        assert_eq!(lang_of(&body), expected, "{header:?}");
        assert_eq!(language, expected, "{header:?}");
    }
    // A long header (within server.max_header_bytes) is read only so far.
    let long = format!("{}ru", "x-y;q=0.1, ".repeat(700));
    let (status, _, _, body) = page(&h, Some(&long)).await;
    assert_eq!((status, lang_of(&body)), (200, "en"));
}

#[tokio::test]
async fn a_fixed_language_ignores_the_header() {
    let h = full_room(|c| c.rooms[0].language = Language::Fixed(Lang::Ja)).await;
    for header in [None, Some("de-DE,de;q=0.9"), Some("en")] {
        let (_, language, vary, body) = page(&h, header).await;
        assert_eq!(lang_of(&body), "ja", "{header:?}");
        assert_eq!(language, "ja");
        assert!(
            !vary.to_ascii_lowercase().contains("accept-language"),
            "{vary}"
        );
        assert!(body.contains("列に並んでいる人数"));
    }
}

#[tokio::test]
async fn the_status_json_stays_language_neutral() {
    let h = full_room(|_| {}).await;
    let v = h.visitor();
    let resp = v
        .get(h.url("/"))
        .header("accept-language", "ru")
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    assert!(resp.headers().get("content-language").is_none());
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_queued_json(&body);
    assert_eq!(body["state"], "queued");
}

#[tokio::test]
async fn error_pages_speak_the_language_too() {
    // 429: polls over the limit.
    let h = full_room(|c| {
        c.server.ip_poll_burst = 1;
        c.server.ip_polls_per_second = 1;
    })
    .await;
    let v = h.visitor();
    let mut slowed = None;
    for _ in 0..5 {
        let resp = v
            .get(h.url("/"))
            .header("accept-language", "de")
            .send()
            .await
            .unwrap();
        if resp.status() == 429 {
            slowed = Some(resp.text().await.unwrap());
            break;
        }
    }
    let body = slowed.expect("a 429 within five polls");
    assert_eq!(lang_of(&body), "de");
    assert!(body.contains("Sie behalten Ihren Platz"), "{body}");

    // 504 and 502 from the origin.
    let h = Harness::start(|c| c.origin.timeout = Duration::from_millis(300)).await;
    let resp = h
        .bare()
        .get(h.url("/slow?ms=2000"))
        .header("accept-language", "ja")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 504);
    assert!(resp.headers()["vary"]
        .to_str()
        .unwrap()
        .contains("accept-language"));
    let body = resp.text().await.unwrap();
    assert_eq!(lang_of(&body), "ja");
    assert!(body.contains("サイトの応答が遅れています"), "{body}");

    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let h = Harness::start(|c| c.origin.url = format!("http://{dead_addr}").parse().unwrap()).await;
    let resp = h
        .bare()
        .get(h.url("/"))
        .header("accept-language", "es-MX")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    let body = resp.text().await.unwrap();
    assert_eq!(lang_of(&body), "es");
    assert!(body.contains("No se pudo conectar con el sitio."), "{body}");

    // 503 while the store is away with fail_mode = "closed" is covered by
    // the same message machinery (tests/redis_daemon.rs checks the page);
    // 404 for an unknown reserved path:
    let resp = h
        .bare()
        .get(h.url("/__waitroom/nope"))
        .header("accept-language", "fr")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let body = resp.text().await.unwrap();
    assert_eq!(lang_of(&body), "fr");
    assert!(body.contains("Page introuvable"), "{body}");
}

#[tokio::test]
async fn an_operator_template_sees_lang_and_t() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queue.html");
    std::fs::write(
        &path,
        "<html lang=\"{{ lang }}\">[{{ t.queue_heading }}] [{{ eta_text }}] \
         [{{ t.eta_minutes|count(3) }}] [{{ t.last_updated|fill(time=updated_at) }}]",
    )
    .unwrap();
    let h = full_room(|c| c.rooms[0].template = Some(path.clone())).await;
    let (_, _, _, body) = page(&h, Some("ru")).await;
    assert!(
        body.starts_with("<html lang=\"ru\">[Вы в очереди] ["),
        "{body}"
    );
    assert!(body.contains("[примерно 3 минуты]"), "{body}");
    assert!(body.contains("[Обновлено в 08:00:00 UTC.]"), "{body}");
    let (_, _, _, body) = page(&h, None).await;
    assert!(
        body.starts_with("<html lang=\"en\">[You are in the queue] ["),
        "{body}"
    );
    assert!(body.contains("[about 3 minutes]"), "{body}");
}
