//! The queue page in a real headless Chromium against the real daemon and a
//! real origin: what a waiting visitor actually sees and does.

mod support;

#[path = "support/browser.rs"]
mod browser;

use std::time::Duration;

use browser::{Browser, Options};
use support::{from_origin, Harness};
use waitroom::store::{End, VisitorId};

const WAIT: Duration = Duration::from_secs(15);

/// A room of one place, with a fast-polling queue page.
async fn small_room() -> Harness {
    Harness::start(|c| {
        c.rooms[0].total_active_users = 1;
        c.rooms[0].refresh_interval = Duration::from_secs(1);
        c.rooms[0].abandon_after = Duration::from_secs(600);
    })
    .await
}

/// Admits a visitor outside the browser and returns its client and id.
async fn admit(h: &Harness) -> (reqwest::Client, VisitorId) {
    let v = h.visitor();
    let id = support::admitted_id(v.get(h.url("/")).send().await.unwrap()).await;
    (v, id)
}

async fn release(h: &Harness, id: VisitorId) {
    assert!(h
        .store()
        .end(&h.policy(), id, End::Release, h.clock_now())
        .await
        .unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_page_updates_in_place_and_lands_on_the_requested_url() {
    let h = small_room().await;
    let (_a, a) = admit(&h).await;
    let b = h.visitor();
    assert!(!from_origin(&b.get(h.url("/")).send().await.unwrap()));

    let browser = Browser::start(Options::default()).await;
    browser
        .client
        .goto(&h.url("/item/42?color=red&size=m"))
        .await
        .unwrap();
    assert_eq!(browser.text_of("wr-position").await, "2");
    assert_eq!(browser.text_of("wr-length").await, "2");
    assert!(
        browser.text_of("wr-eta").await.contains("minute"),
        "an estimated wait is shown"
    );
    assert_eq!(
        browser
            .eval("document.getElementById('wr-live').getAttribute('aria-live')")
            .await,
        "polite"
    );
    browser.eval("(window.__marker = 1)").await;

    // The one place frees up: the visitor ahead is admitted on the next poll
    // and this page moves to position 1 without reloading.
    release(&h, a).await;
    browser
        .wait_until(
            "document.getElementById('wr-position').textContent.trim() === '1'",
            WAIT,
        )
        .await;
    assert_eq!(
        browser.eval("window.__marker").await,
        1,
        "updated in place, not reloaded"
    );
    let updated = browser.text_of("wr-updated").await;
    assert_eq!(updated.len(), 8, "time of last update shown: {updated}");

    // The visitor ahead finishes: this browser is admitted and lands on the
    // exact URL it first asked for, by itself.
    let b_id = support::admitted_id(b.get(h.url("/")).send().await.unwrap()).await;
    release(&h, b_id).await;
    browser
        .wait_until("document.body.innerText.includes('\"uri\"')", WAIT)
        .await;
    let body = browser.eval("document.body.innerText").await;
    let echo: serde_json::Value = serde_json::from_str(body.as_str().unwrap()).unwrap();
    assert_eq!(echo["uri"], "/item/42?color=red&size=m");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloading_and_a_second_tab_keep_one_place() {
    let h = small_room().await;
    let _a = admit(&h).await;
    let ahead = h.visitor();
    assert!(!from_origin(&ahead.get(h.url("/")).send().await.unwrap()));
    let browser = Browser::start(Options::default()).await;
    browser.client.goto(&h.url("/")).await.unwrap();
    assert_eq!(browser.text_of("wr-position").await, "2");
    browser.client.refresh().await.unwrap();
    assert_eq!(browser.text_of("wr-position").await, "2");
    // A second tab of the same browser shares the ticket.
    let tab = browser.client.new_window(true).await.unwrap();
    browser.client.switch_to_window(tab.handle).await.unwrap();
    browser.client.goto(&h.url("/other")).await.unwrap();
    assert_eq!(browser.text_of("wr-position").await, "2");
    assert_eq!(
        browser.text_of("wr-length").await,
        "2",
        "two tabs hold one place"
    );
    assert_eq!(
        h.store()
            .stats(&h.policy(), h.clock_now())
            .await
            .unwrap()
            .queued,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_german_browser_gets_the_page_and_its_updates_in_german() {
    let h = small_room().await;
    let _a = admit(&h).await;
    let browser = Browser::start(Options {
        accept_language: Some("de-DE,de"),
        ..Options::default()
    })
    .await;
    browser.client.goto(&h.url("/")).await.unwrap();
    assert_eq!(browser.eval("document.documentElement.lang").await, "de");
    let eta = browser.text_of("wr-eta").await;
    assert!(eta.contains("Minute"), "served in German: {eta}");
    // Blank the estimate: the next poll's script writes it again, in German.
    browser
        .eval("(document.getElementById('wr-eta').textContent = '-')")
        .await;
    browser
        .wait_until(
            "document.getElementById('wr-eta').textContent !== '-'",
            WAIT,
        )
        .await;
    let eta = browser.text_of("wr-eta").await;
    assert!(
        eta.starts_with("etwa ") || eta == "weniger als eine Minute",
        "written by the script in German: {eta}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_javascript_the_page_refreshes_itself_and_admits() {
    let h = small_room().await;
    let (_a, a) = admit(&h).await;
    let browser = Browser::start(Options {
        javascript: false,
        ..Options::default()
    })
    .await;
    browser.client.goto(&h.url("/nojs?x=1")).await.unwrap();
    let source = browser.client.source().await.unwrap();
    assert!(source.contains("id=\"wr-position\">1<"), "queued at 1");
    release(&h, a).await;
    // The <noscript> meta refresh reloads the page every second.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let source = browser.client.source().await.unwrap_or_default();
        if source.contains("\"uri\":\"/nojs?x=1\"") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not admitted without JavaScript"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phone_and_desktop_viewports_need_no_horizontal_scrolling() {
    let h = Harness::start(|c| {
        c.rooms[0].state = waitroom::store::RoomState::Paused;
        c.rooms[0].name = "Spring drop: limited sneakers".into();
    })
    .await;
    for (w, hgt) in [(360, 740), (1280, 800)] {
        let browser = Browser::start(Options {
            width: w,
            height: hgt,
            ..Options::default()
        })
        .await;
        browser.client.goto(&h.url("/")).await.unwrap();
        let fits = browser
            .eval("document.documentElement.scrollWidth <= window.innerWidth")
            .await;
        assert_eq!(fits, true, "{w}x{hgt} scrolls sideways");
        let landmarks = browser
            .eval("['header','main','footer'].every(t => document.querySelector(t))")
            .await;
        assert_eq!(landmarks, true);
        let external = browser
            .eval("[...document.querySelectorAll('[src],[href]')].some(e => /^https?:/.test(e.getAttribute('src') || e.getAttribute('href')))")
            .await;
        assert_eq!(external, false, "no external resources");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_backs_off_when_told_to_slow_down() {
    // One poll per second per address, no burst: the page's ~1 s polls with
    // jitter run into 429 now and then.
    let h = Harness::start(|c| {
        c.rooms[0].state = waitroom::store::RoomState::Paused;
        c.rooms[0].refresh_interval = Duration::from_secs(1);
        c.server.ip_poll_burst = 1;
        c.server.ip_polls_per_second = 1;
    })
    .await;
    let browser = Browser::start(Options::default()).await;
    browser.client.goto(&h.url("/")).await.unwrap();
    // Record every poll the page makes.
    browser
        .eval("(window.__polls = [], window.__fetch = window.fetch, window.fetch = (...a) => window.__fetch(...a).then(r => { window.__polls.push([performance.now(), r.status]); return r; }), 1)")
        .await;
    // The manual clock does not move, so after the first poll every poll is limited.
    browser
        .wait_until(
            "window.__polls.filter(p => p[1] === 429).length >= 3",
            Duration::from_secs(40),
        )
        .await;
    let polls = browser.eval("window.__polls").await;
    let polls: Vec<(f64, u64)> = polls
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_f64().unwrap(), p[1].as_u64().unwrap()))
        .collect();
    // Each 429 doubles the wait: the gaps after consecutive 429s grow. The
    // page draws each wait within ±20% (static/queue.html), so a doubled
    // wait is at least 2 × 0.8 / 1.2 = 1.33 times the one before. (A bound
    // of 1.5 failed about one run in 25: 2,348 ms, then 3,232 ms.)
    let gaps: Vec<f64> = polls.windows(2).map(|w| w[1].0 - w[0].0).collect();
    let last = gaps.len() - 1;
    assert!(gaps[last] > 3000.0, "backed off to {:?} ms", gaps);
    assert!(gaps[last] > gaps[0] * 1.3, "gaps grow: {gaps:?}");
    // And the visitor is still queued.
    assert_eq!(
        h.store()
            .stats(&h.policy(), h.clock_now())
            .await
            .unwrap()
            .queued,
        1
    );
}

/// Writes the screenshots shown in the README (run on purpose:
/// `cargo test --test browser -- --ignored screenshots`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn screenshots() {
    let h = Harness::start(|c| {
        c.rooms[0].total_active_users = 1;
        c.rooms[0].name = "Spring drop".into();
        c.rooms[0].refresh_interval = Duration::from_secs(20);
    })
    .await;
    let _a = admit(&h).await;
    for _ in 0..41 {
        h.visitor().get(h.url("/")).send().await.unwrap();
    }
    for (name, w, hgt) in [("queue-phone", 360, 740), ("queue-desktop", 1280, 800)] {
        let browser = Browser::start(Options {
            width: w,
            height: hgt,
            ..Options::default()
        })
        .await;
        browser.client.goto(&h.url("/")).await.unwrap();
        let png = browser.client.screenshot().await.unwrap();
        std::fs::write(
            format!("{}/docs/{name}.png", env!("CARGO_MANIFEST_DIR")),
            png,
        )
        .unwrap();
    }
}

/// Timed drops (docs/how-it-works.md): a visitor who comes during the
/// prequeue sees the countdown; at the start the page turns into the queue
/// by itself, and then into the site, landing on the URL first asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prequeue_countdown_turns_into_the_queue_and_then_the_site() {
    use waitroom::store::EventSpec;
    let t0 = support::T0;
    let h = Harness::start(|c| {
        c.rooms[0].total_active_users = 1;
        c.rooms[0].session_duration = Duration::from_secs(600);
        c.rooms[0].refresh_interval = Duration::from_secs(1);
        c.rooms[0].abandon_after = Duration::from_secs(600);
        c.rooms[0].events = vec![waitroom::config::EventConfig {
            spec: EventSpec {
                name: "launch".into(),
                prequeue_start_ms: Some(t0 + 1_000),
                start_ms: t0 + 90_000,
                end_ms: t0 + 3_600_000,
                shuffle_at_start: true,
                lanes_only_for_ms: None,
                settings: waitroom::store::Settings {
                    session_duration_ms: Some(600_000),
                    ..Default::default()
                },
                notice: None,
            },
            template: None,
        }];
    })
    .await;
    // Someone got in before the prequeue and holds the one place.
    let (_a, a) = admit(&h).await;
    h.clock.advance(Duration::from_secs(1));

    let browser = Browser::start(Options::default()).await;
    browser.client.goto(&h.url("/launch?x=1")).await.unwrap();
    let title = browser.text_of("wr-title").await;
    assert!(title.starts_with("launch starts at"), "{title}");
    let countdown = browser.text_of("wr-countdown").await;
    assert!(
        countdown.starts_with("1 min 2") && countdown.ends_with(" s"),
        "{countdown}"
    );
    // Without JavaScript the countdown still makes sense: the start time
    // and the seconds left are in the page itself.
    let source = browser.client.source().await.unwrap();
    assert!(
        source.contains("datetime=\"2027-01-15T08:01:30Z\""),
        "start time shown"
    );
    assert!(
        source.contains("http-equiv=\"refresh\""),
        "refreshes without script"
    );

    // The start: the page polls, sees the queue and turns into it.
    h.clock.advance(Duration::from_secs(89));
    browser
        .wait_until(
            "document.getElementById('wr-title') && document.getElementById('wr-title').textContent === 'You are in the queue'",
            WAIT,
        )
        .await;
    assert_eq!(browser.text_of("wr-position").await, "1");

    // The place frees up: the page lands on the site, on the URL it asked for.
    release(&h, a).await;
    browser
        .wait_until("document.body.innerText.includes('\"uri\"')", WAIT)
        .await;
    let body = browser.eval("document.body.innerText").await;
    let echo: serde_json::Value = serde_json::from_str(body.as_str().unwrap()).unwrap();
    assert_eq!(echo["uri"], "/launch?x=1");
}

/// A room of one place that asks new visitors for a proof of work of
/// `bits` while it queues, already full.
async fn full_room_with_proof(bits: u8) -> (Harness, reqwest::Client) {
    let h = Harness::start(|c| {
        c.rooms[0].total_active_users = 1;
        c.rooms[0].refresh_interval = Duration::from_secs(1);
        c.rooms[0].abandon_after = Duration::from_secs(600);
        c.rooms[0].proof_of_work = bits;
    })
    .await;
    let (first, _) = admit(&h).await;
    (h, first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_browser_solves_the_proof_of_work_and_gets_its_place() {
    // 18 bits: the difficulty the README suggests.
    let (h, _first) = full_room_with_proof(18).await;
    let browser = Browser::start(Options::default()).await;
    browser.client.goto(&h.url("/item/7")).await.unwrap();
    // The challenge page, then by itself the queue page.
    browser
        .wait_until(
            "document.getElementById('wr-position')",
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(browser.text_of("wr-position").await, "1");
    let ms = browser
        .eval("Number(sessionStorage.getItem('waitroom-proof-ms'))")
        .await;
    let tries = browser
        .eval("Number(sessionStorage.getItem('waitroom-proof-tries'))")
        .await;
    eprintln!("proof of work, 18 bits, headless Chromium: {ms} ms, {tries} hashes");
    assert!(ms.as_f64().unwrap() > 0.0);
    let stats = h.store().stats(&h.policy(), h.clock_now()).await.unwrap();
    assert_eq!(
        stats.queued, 1,
        "one place, for the browser that did the work"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_javascript_the_challenge_page_explains() {
    let (h, _first) = full_room_with_proof(18).await;
    let browser = Browser::start(Options {
        javascript: false,
        ..Options::default()
    })
    .await;
    browser.client.goto(&h.url("/")).await.unwrap();
    let body = browser.client.source().await.unwrap();
    assert!(body.contains("needs JavaScript"), "{body}");
    let stats = h.store().stats(&h.policy(), h.clock_now()).await.unwrap();
    assert_eq!(stats.queued, 0);
}

/// The operator's notice appears, changes and goes on a waiting page
/// without a reload, as text (markup in it is shown, not run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_appears_and_changes_on_the_queue_page_without_a_reload() {
    let h = small_room().await;
    let _a = admit(&h).await;
    let notice = |body: serde_json::Value| {
        let req = h
            .bare()
            .patch(h.admin_url("/api/rooms/shop"))
            .json(&serde_json::json!({ "notice": body }));
        async move {
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), 200);
        }
    };
    let browser = Browser::start(Options::default()).await;
    browser.client.goto(&h.url("/")).await.unwrap();
    assert_eq!(browser.text_of("wr-position").await, "1");
    assert_eq!(
        browser
            .eval("document.getElementById('wr-notice').hidden")
            .await,
        true,
        "no notice yet"
    );
    browser.eval("(window.__marker = 1)").await;

    notice(serde_json::json!({"text": "Restock at <b>18:00</b>"})).await;
    browser
        .wait_until(
            "!document.getElementById('wr-notice').hidden && document.getElementById('wr-notice-text').textContent === 'Restock at <b>18:00</b>'",
            WAIT,
        )
        .await;
    assert_eq!(
        browser
            .eval("document.getElementById('wr-notice').querySelectorAll('b').length")
            .await,
        0,
        "text, not markup"
    );
    notice(serde_json::json!({"text": "Payment is slow", "level": "warning"})).await;
    browser
        .wait_until(
            "document.getElementById('wr-notice-text').textContent === 'Payment is slow' && document.getElementById('wr-notice').className.includes('warning')",
            WAIT,
        )
        .await;
    notice(serde_json::Value::Null).await;
    browser
        .wait_until("document.getElementById('wr-notice').hidden", WAIT)
        .await;
    assert_eq!(browser.eval("window.__marker").await, 1, "never reloaded");
}

/// `show_stock`: "N left" appears on a waiting page once the room counts
/// its stock, and follows the operator's changes without a reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stock_left_appears_and_follows_the_stock_without_a_reload() {
    let h = Harness::start(|c| {
        c.rooms[0].total_active_users = 1;
        c.rooms[0].refresh_interval = Duration::from_secs(1);
        c.rooms[0].abandon_after = Duration::from_secs(600);
        c.rooms[0].show_stock = true;
    })
    .await;
    let _a = admit(&h).await;
    let browser = Browser::start(Options::default()).await;
    browser.client.goto(&h.url("/")).await.unwrap();
    assert_eq!(browser.text_of("wr-position").await, "1");
    assert_eq!(
        browser
            .eval("document.getElementById('wr-stock').hidden")
            .await,
        true,
        "no stock counted yet"
    );
    browser.eval("(window.__marker = 1)").await;

    h.patch_room_ok("shop", serde_json::json!({"stock": 5}))
        .await;
    browser
        .wait_until(
            "!document.getElementById('wr-stock').hidden && document.getElementById('wr-stock').textContent === '5 left'",
            WAIT,
        )
        .await;
    h.patch_room_ok("shop", serde_json::json!({"stock": 1}))
        .await;
    browser
        .wait_until(
            "document.getElementById('wr-stock').textContent === '1 left'",
            WAIT,
        )
        .await;
    h.patch_room_ok("shop", serde_json::json!({"stock": null}))
        .await;
    browser
        .wait_until("document.getElementById('wr-stock').hidden", WAIT)
        .await;
    assert_eq!(browser.eval("window.__marker").await, 1, "never reloaded");
}

const PRESALE_CODE: &str = "PRESALE-2027";

/// A presale window (`lanes_only_until`): a general visitor's page says
/// when the general sale opens, in the visitor's own time, and stops
/// saying it once the window is over, without a reload; a lane visitor's
/// page never says it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_general_visitor_is_told_when_the_general_sale_opens() {
    let until = support::T0 + 40_000;
    let h = Harness::start(|c| {
        let room = &mut c.rooms[0];
        room.total_active_users = 1;
        room.refresh_interval = Duration::from_secs(1);
        room.abandon_after = Duration::from_secs(600);
        room.session_duration = Duration::from_secs(3600);
        room.lanes = vec![waitroom::config::LaneConfig {
            name: "presale".into(),
            share: 300,
            codes: std::collections::HashSet::from([waitroom::domain::digest64(PRESALE_CODE)]),
            single_use: std::collections::HashSet::new(),
            token_claim: false,
        }];
        room.lanes_only_until_ms = until;
    })
    .await;
    // A code holder fills the room.
    let inside = h.visitor();
    let resp = inside
        .get(h.url("/"))
        .header("x-waitroom-code", PRESALE_CODE)
        .send()
        .await
        .unwrap();
    assert!(from_origin(&resp));

    let browser = Browser::start(Options::default()).await;
    browser
        .client
        .goto(&h.url(&format!("/?waitroom_code={PRESALE_CODE}")))
        .await
        .unwrap();
    assert_eq!(browser.text_of("wr-lane").await, "Priority lane: presale");
    assert_eq!(
        browser
            .eval("document.getElementById('wr-general').hidden")
            .await,
        true,
        "a lane visitor is not held"
    );

    browser.client.delete_all_cookies().await.unwrap();
    browser.client.goto(&h.url("/")).await.unwrap();
    assert_eq!(
        browser
            .eval("document.getElementById('wr-general').hidden")
            .await,
        false,
        "a general visitor is told"
    );
    let time = "document.getElementById('wr-general-time')";
    assert_eq!(
        browser
            .eval(&format!("{time}.getAttribute('datetime')"))
            .await,
        "2027-01-15T08:00:40Z"
    );
    // In the browser's own time zone, with the hour and the minute.
    let local = browser
        .eval(&format!(
            "(function(){{ var d = new Date('2027-01-15T08:00:40Z'), t = {time}.textContent, \
             m = ':' + String(d.getMinutes()).padStart(2, '0'); \
             return t.includes(String(d.getHours()).padStart(2, '0') + m) \
             || t.includes(String(d.getHours() % 12 || 12).padStart(2, '0') + m); }})()"
        ))
        .await;
    assert_eq!(local, true, "{}", browser.text_of("wr-general").await);
    let sentence = browser.text_of("wr-general").await;
    assert!(
        sentence.starts_with("The general sale opens at "),
        "{sentence}"
    );
    browser.eval("(window.__marker = 1)").await;

    // The window ends; the room is still full, so the visitor still waits.
    h.clock.advance(Duration::from_secs(41));
    browser
        .wait_until("document.getElementById('wr-general').hidden", WAIT)
        .await;
    assert_eq!(browser.eval("window.__marker").await, 1, "never reloaded");
}
