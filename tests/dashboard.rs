//! The admin dashboard in a real headless Chromium: it renders each room and
//! follows the figures as they change; its charts have a clock-time axis,
//! values on the axes, admissions per clock minute as bars, time in queue,
//! and the rooms' event markers.

mod support;

#[path = "support/browser.rs"]
mod browser;

use std::time::Duration;

use browser::{Browser, Options};
use support::{Harness, T0};
use waitroom::store::End;

const WAIT: Duration = Duration::from_secs(15);

fn active_text(room: &str) -> String {
    format!("(document.querySelector('[data-room=\"{room}\"] .active') || {{}}).textContent")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_renders_rooms_and_follows_the_figures() {
    let h = Harness::start(|c| c.rooms[0].total_active_users = 3).await;
    h.daemon.gate().refresh_room_figures().await;
    let browser = Browser::start(Options::default()).await;
    browser.client.goto(&h.admin_url("/")).await.unwrap();
    browser
        .wait_until(
            &format!("{} === '0 / 3'", active_text("shop")),
            Duration::from_secs(15),
        )
        .await;
    let charts = browser
        .eval("document.querySelectorAll('[data-room=\"shop\"] svg').length")
        .await;
    assert_eq!(
        charts, 5,
        "active/limit, queue, admissions, ETA, time in queue"
    );
    let external = browser
        .eval("[...document.querySelectorAll('[src],[href]')].filter(e => !(e.getAttribute('href') || '').startsWith('#')).length")
        .await;
    assert_eq!(external, 0, "self-contained (links within the page aside)");

    for _ in 0..5 {
        h.visitor().get(h.url("/")).send().await.unwrap();
    }
    h.clock.advance(Duration::from_secs(5));
    h.daemon.gate().refresh_room_figures().await;
    browser
        .wait_until(
            &format!("{} === '3 / 3'", active_text("shop")),
            Duration::from_secs(15),
        )
        .await;
    let queued = browser
        .eval("document.querySelector('[data-room=\"shop\"] .queued').textContent")
        .await;
    assert_eq!(queued, "2");
    let badge = browser
        .eval("document.querySelector('[data-room=\"shop\"] .badge').textContent")
        .await;
    assert_eq!(
        badge, "queueing",
        "a full room with a queue is flagged at a glance"
    );
    let state = browser
        .eval("document.querySelector('[data-room=\"shop\"] .state b').textContent")
        .await;
    assert_eq!(state, "open");
    let fairness = browser
        .eval("[...document.querySelectorAll('[data-room=\"shop\"] .fairness div')].map(r => r.querySelector('dt').textContent + '=' + r.querySelector('dd').textContent).join(', ')")
        .await;
    assert_eq!(
        fairness,
        "shadow queue=0, challenges failed=0, tokens=0, tokens refused=0, tokens replayed=0, tokens folded=0"
    );
}

/// With every count the fairness features have (a lane, refused codes,
/// open captcha passes) and the drop's settings (a stock, a long notice),
/// each tile holds one figure and keeps its size, and the counts are rows
/// of their own, at a desktop's width and a phone's: before, the fairness
/// tile printed them all in the big-number font and stretched its whole
/// row of tiles to ~300 px.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tile_holds_one_figure_at_desktop_and_phone_widths() {
    let h = Harness::start(|c| {
        c.rooms[0].lanes = vec![waitroom::config::LaneConfig {
            name: "presale-members-early-access".into(),
            share: 300,
            codes: std::collections::HashSet::from([waitroom::domain::digest64("PRESALE-CODE-1")]),
            single_use: Default::default(),
            token_claim: false,
        }];
    })
    .await;
    let notice = "Size 10 is sold out; sizes 8 and 9 are left, and we restart the sale at 10:15 for everyone still waiting in line";
    let body = serde_json::json!({"stock": 1250, "notice": {"text": notice, "level": "warning"}});
    h.patch_room_ok("shop", body).await;
    for _ in 0..3 {
        h.visitor()
            .get(h.url("/?waitroom_code=WRONG-CODE-9"))
            .send()
            .await
            .unwrap();
    }
    h.daemon.gate().refresh_room_figures().await;
    for (width, height) in [(1300, 900), (390, 844)] {
        let browser = Browser::start(Options {
            width,
            height,
            ..Options::default()
        })
        .await;
        browser.client.goto(&h.admin_url("/")).await.unwrap();
        browser
            .wait_until(
                "['codes refused', 'stock left', 'we restart'].every(t => (document.querySelector('[data-room=\"shop\"]') || {textContent: ''}).textContent.includes(t))",
                Duration::from_secs(15),
            )
            .await;
        let tiles = browser
            .eval("[...document.querySelectorAll('[data-room=\"shop\"] .fig')].map(f => [f.getBoundingClientRect().height, f.scrollWidth - f.clientWidth, f.querySelectorAll('b').length])")
            .await;
        for tile in tiles.as_array().unwrap() {
            let (tall, over, figures) = (
                tile[0].as_f64().unwrap(),
                tile[1].as_f64().unwrap(),
                tile[2].as_u64().unwrap(),
            );
            assert!(tall <= 90.0, "{width} px: a tile {tall} px tall: {tiles}");
            assert!(
                over <= 0.0,
                "{width} px: a tile overflows by {over} px: {tiles}"
            );
            assert_eq!(figures, 1, "{width} px: one figure a tile: {tiles}");
        }
        let rows = browser
            .eval("[...document.querySelectorAll('[data-room=\"shop\"] .counts div')].map(r => [r.getBoundingClientRect().height, r.scrollWidth - r.clientWidth, r.textContent])")
            .await;
        for row in rows.as_array().unwrap() {
            let (tall, over) = (row[0].as_f64().unwrap(), row[1].as_f64().unwrap());
            assert!(
                tall <= 24.0,
                "{width} px: a count row {tall} px tall: {rows}"
            );
            assert!(over <= 0.0, "{width} px: a count row overflows: {rows}");
        }
        let page_over = browser
            .eval("document.documentElement.scrollWidth - document.documentElement.clientWidth")
            .await;
        assert!(
            page_over.as_f64().unwrap() <= 0.0,
            "{width} px: the page scrolls sideways by {page_over}"
        );
    }
}

/// `expr` evaluated over the elements matching `selector` in the shop room.
fn over(selector: &str, expr: &str) -> String {
    format!("[...document.querySelectorAll('[data-room=\"shop\"] {selector}')].map(e => {expr})")
}

/// The `.latest` figure in the heading of one of the shop room's charts.
fn latest(chart: &str) -> String {
    format!(
        "document.querySelector('[data-room=\"shop\"] [data-chart={chart}] .latest').textContent"
    )
}

/// A JS expression's value, as a list.
async fn list<T: serde::de::DeserializeOwned>(browser: &Browser, expr: &str) -> Vec<T> {
    serde_json::from_value(browser.eval(expr).await).unwrap()
}

async fn history(h: &Harness) -> serde_json::Value {
    h.bare()
        .get(h.admin_url("/api/history"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Advances the daemon's clock in 5 s steps, sampling after each.
async fn run_for(h: &Harness, seconds: u64) {
    for _ in 0..seconds / 5 {
        h.clock.advance(Duration::from_secs(5));
        h.daemon.gate().refresh_room_figures().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charts_have_a_clock_axis_values_and_admissions_per_clock_minute() {
    let h = Harness::start(|c| c.rooms[0].total_active_users = 1000).await;
    assert_eq!(T0 % 600_000, 0, "the test starts on ten whole minutes");
    h.daemon.gate().refresh_room_figures().await;
    // 46 quiet minutes, then admissions in each clock minute, 10 s into
    // it; a sample every 5 s.
    const QUIET: u64 = 46;
    run_for(&h, QUIET * 60).await;
    let per_minute = [3u64, 0, 5, 2];
    for &n in &per_minute {
        run_for(&h, 10).await;
        for _ in 0..n {
            h.visitor().get(h.url("/")).send().await.unwrap();
        }
        run_for(&h, 50).await;
    }
    // Now: the start of minute 50, which has admitted nobody so far.
    let now = h.clock_now();
    assert_eq!(now, T0 + (QUIET + 4) * 60_000);
    let expected: Vec<(u64, u64)> = [0; QUIET as usize]
        .iter()
        .chain(&per_minute)
        .chain(&[0])
        .enumerate()
        .map(|(i, &n)| (T0 + i as u64 * 60_000, n))
        .collect();

    let report = history(&h).await;
    assert_eq!(report["now"], now);
    let served: Vec<(u64, u64)> = report["rooms"]["shop"]["minutes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["t"].as_u64().unwrap(), m["admitted"].as_u64().unwrap()))
        .collect();
    assert_eq!(served, expected, "/api/history minutes");

    let browser = Browser::start(Options::default()).await;
    browser.client.goto(&h.admin_url("/")).await.unwrap();
    let bars = over(
        "[data-chart=admissions] .bar",
        "e.dataset.t + ':' + e.dataset.v + ':' + e.classList.contains('partial')",
    );
    browser
        .wait_until(&format!("{bars}.length === {}", expected.len()), WAIT)
        .await;
    let shown: Vec<String> = list(&browser, &bars).await;
    let want: Vec<String> = expected
        .iter()
        .map(|(t, n)| format!("{t}:{n}:{}", *t == now))
        .collect();
    assert_eq!(
        shown, want,
        "one bar per clock minute; the current one marked partial"
    );
    let heights: Vec<f64> = list(
        &browser,
        &over("[data-chart=admissions] .bar", "+e.getAttribute('height')"),
    )
    .await;
    let hs = &heights[QUIET as usize..];
    assert!(
        hs[2] > hs[0] && hs[0] > hs[3] && hs[3] > hs[1] && hs[1] <= 1.0,
        "bar heights follow the counts: {hs:?}"
    );
    let minute_3 = browser
        .eval(&format!(
            "new Date({}).toTimeString().slice(0, 5)",
            now - 60_000
        ))
        .await;
    assert_eq!(
        browser.eval(&latest("admissions")).await,
        format!("2 at {}", minute_3.as_str().unwrap()),
        "the latest full minute is shown"
    );

    // The time axis: clock labels every 10 minutes across the 50 charted
    // minutes (from the first sample).
    let ticks: Vec<(u64, String, String)> = list(
        &browser,
        &over(
            "[data-chart=queued] .xtick",
            "[+e.dataset.t, e.textContent, new Date(+e.dataset.t).toTimeString().slice(0, 5)]",
        ),
    )
    .await;
    let at: Vec<u64> = ticks.iter().map(|(t, _, _)| *t).collect();
    assert_eq!(at, (0..6).map(|i| T0 + i * 600_000).collect::<Vec<_>>());
    for (_, label, local) in &ticks {
        assert_eq!(label, local, "HH:MM in the browser's time zone");
        assert!(label.len() == 5 && label.as_bytes()[2] == b':', "{label}");
    }
    // Values on the axes: the admissions axis covers the largest bar, and
    // the active users' axis reaches the limit.
    let y: Vec<String> = list(
        &browser,
        &over("[data-chart=admissions] .ytick", "e.textContent"),
    )
    .await;
    assert_eq!(y, ["0", "2", "4", "6"]);
    let y: Vec<String> = list(
        &browser,
        &over("[data-chart=active] .ytick", "e.textContent"),
    )
    .await;
    assert_eq!(y, ["0", "500", "1000"]);
    let y: Vec<String> = list(&browser, &over("[data-chart=eta] .ytick", "e.textContent")).await;
    assert!(
        y.len() >= 2 && y[0] == "0s",
        "durations on the ETA axis: {y:?}"
    );
    // The latest values are shown.
    let last = report["rooms"]["shop"]["samples"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        browser.eval(&latest("active")).await,
        format!("{} / 1000", last["active"])
    );
    assert_eq!(browser.eval(&latest("queued")).await, "0");

    // Event markers: a room without events, none drawn.
    assert_eq!(
        browser
            .eval(&format!("{}.length", over(".marker", "e")))
            .await,
        0
    );
    // Rooms that carry events (the shape `/api/rooms` gives, checked in
    // tests/events.rs), odd ones included: the page's own fetch is wrapped
    // to add them at chosen instants, so the real rendering path draws them.
    browser
        .eval(&format!(
            r#"(function () {{
                var now = {now}, iso = function (ms) {{ return new Date(ms).toISOString(); }};
                var events = [
                    {{name: "Spring drop", prequeue_start: iso(now - 180000), start: iso(now - 120000),
                      end: iso(now + 1800000), phase: "running"}},
                    {{name: "Earlier", prequeue_start: null, start: iso(now - 7200000), end: iso(now - 5400000), phase: "ended"}},
                    {{name: 5, start: "not a time", end: null}},
                    null
                ];
                var fetch = window.fetch;
                window.fetch = function (url, opts) {{
                    return fetch(url, opts).then(function (r) {{
                        if (String(url) !== "/api/rooms") return r;
                        return r.json().then(function (rooms) {{
                            rooms.forEach(function (room) {{ room.events = events; }});
                            return new Response(JSON.stringify(rooms), {{status: 200, headers: {{"content-type": "application/json"}}}});
                        }});
                    }});
                }};
                return true;
            }})()"#
        ))
        .await;
    let markers = over(
        "[data-chart=queued] .marker",
        "[e.dataset.kind, +e.dataset.t, e.querySelector('text').textContent]",
    );
    browser
        .wait_until(&format!("{markers}.length > 0"), WAIT)
        .await;
    let shown: Vec<(String, u64, String)> = list(&browser, &markers).await;
    assert_eq!(
        shown,
        [
            (
                "prequeue".to_owned(),
                now - 180_000,
                "prequeue · Spring drop".to_owned()
            ),
            (
                "start".to_owned(),
                now - 120_000,
                "start · Spring drop".to_owned()
            ),
        ],
        "only the instants inside the charted hour; the end is still ahead"
    );
    assert_eq!(
        browser
            .eval(&format!("{}.length", over(".marker", "e")))
            .await,
        10,
        "on each of the five charts"
    );
    let listed: Vec<String> = list(&browser, &over(".event", "e.textContent")).await;
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert!(
        listed[0].starts_with("Event Spring drop · running · prequeue "),
        "{listed:?}"
    );
    assert_eq!(browser.text_of("err").await, "", "odd events break nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_in_queue_median_and_90th_percentile() {
    let h = Harness::start(|c| {
        c.rooms[0].total_active_users = 1;
        c.rooms[0].refresh_interval = Duration::from_secs(1);
        c.rooms[0].abandon_after = Duration::from_secs(3600);
        c.rooms[0].session_duration = Duration::from_secs(3600);
    })
    .await;
    let first = h.visitor();
    let mut holder = support::admitted_id(first.get(h.url("/")).send().await.unwrap()).await;
    // Five visitors queue at T0 and are let in one at a time after these waits.
    let waits = [20u64, 40, 60, 120, 300];
    let queued: Vec<reqwest::Client> = (0..waits.len()).map(|_| h.visitor()).collect();
    for v in &queued {
        assert!(!support::from_origin(
            &v.get(h.url("/")).send().await.unwrap()
        ));
    }
    for (v, wait) in queued.iter().zip(waits) {
        h.clock
            .advance(Duration::from_millis(T0 + wait * 1000 - h.clock_now()));
        assert!(h
            .store()
            .end(&h.policy(), holder, End::Release, h.clock_now())
            .await
            .unwrap());
        assert_eq!(h.status(v).await["state"], "admitted", "after {wait} s");
        holder = support::admitted_id(v.get(h.url("/")).send().await.unwrap()).await;
    }
    h.daemon.gate().refresh_room_figures().await;

    // Nearest rank of five: the 3rd (60 s) and the 5th (300 s), read from
    // log-scale buckets 9% wide.
    let close = |got: f64, want: f64| (got - want).abs() <= want * 0.045;
    let report = history(&h).await;
    let wait = &report["rooms"]["shop"]["queue_wait"];
    assert_eq!(wait["count"], 5);
    assert!(close(wait["p50_seconds"].as_f64().unwrap(), 60.0), "{wait}");
    assert!(
        close(wait["p90_seconds"].as_f64().unwrap(), 300.0),
        "{wait}"
    );
    let metrics = h.metrics().await;
    assert!(
        metrics.contains("waitroom_queue_wait_seconds_count{room=\"shop\"} 5"),
        "{metrics}"
    );
    assert!(
        metrics.contains("waitroom_queue_wait_seconds_sum{room=\"shop\"} 540"),
        "{metrics}"
    );

    let browser = Browser::start(Options::default()).await;
    browser.client.goto(&h.admin_url("/")).await.unwrap();
    let p50 = "document.querySelector('[data-room=\"shop\"] .wait-p50')";
    let p90 = "document.querySelector('[data-room=\"shop\"] .wait-p90')";
    browser
        .wait_until(&format!("{p50} && {p50}.dataset.seconds !== ''"), WAIT)
        .await;
    for (figure, want) in [(p50, 60.0), (p90, 300.0)] {
        let seconds = browser.eval(&format!("{figure}.dataset.seconds")).await;
        let seconds: f64 = seconds.as_str().unwrap().parse().unwrap();
        assert!(close(seconds, want), "{seconds} for {want}");
        assert_eq!(
            browser.eval(&format!("{figure}.textContent")).await,
            minutes_and_seconds(seconds),
        );
    }
    // The per-minute series: one point per minute that let anyone in.
    let dots = browser
        .eval(&format!(
            "{}.length",
            over("[data-chart=wait] circle.dot-p50", "e")
        ))
        .await;
    assert_eq!(dots, 4, "minutes 0, 1, 2 and 5 let visitors in");
}

/// How the page writes a wait under an hour.
fn minutes_and_seconds(seconds: f64) -> String {
    let (m, s) = (seconds as u64 / 60, (seconds % 60.0).round() as u64);
    match (m, s) {
        (0, s) => format!("{s} s"),
        (m, 60) => format!("{} min", m + 1),
        (m, 0) => format!("{m} min"),
        (m, s) => format!("{m} min {s} s"),
    }
}

/// The screenshot in the README (`cargo test --test dashboard -- --ignored`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn screenshot() {
    let h = Harness::start(|c| {
        c.rooms[0].total_active_users = 40;
        c.rooms[0].name = "Spring drop".into();
        c.rooms[0].session_duration = Duration::from_secs(120);
        c.rooms[0].abandon_after = Duration::from_secs(3600);
    })
    .await;
    // The first quarter hour of a sale: a rush and the queue it builds.
    let mut visitors = Vec::new();
    for step in 0..160u64 {
        let arrivals = match step {
            0..=60 => 3,
            61..=200 => 1,
            _ => u64::from(step % 4 == 0),
        };
        for _ in 0..arrivals {
            let v = h.visitor();
            v.get(h.url("/")).send().await.unwrap();
            visitors.push(v);
        }
        if step % 3 == 0 {
            for v in visitors.iter().rev().take(60) {
                v.get(h.url("/__waitroom/status?room=shop"))
                    .send()
                    .await
                    .unwrap();
            }
        }
        h.clock.advance(Duration::from_secs(5));
        h.daemon.gate().refresh_room_figures().await;
    }
    let browser = Browser::start(Options {
        width: 1280,
        height: 900,
        ..Options::default()
    })
    .await;
    browser.client.goto(&h.admin_url("/")).await.unwrap();
    browser
        .wait_until(
            "document.querySelector('[data-room] svg polyline')",
            Duration::from_secs(15),
        )
        .await;
    let png = browser.client.screenshot().await.unwrap();
    std::fs::write(
        format!("{}/docs/dashboard.png", env!("CARGO_MANIFEST_DIR")),
        png,
    )
    .unwrap();
}

/// A room with `[room.autotune]` shows the rate in force, its bounds and
/// the reason of the last move as a labelled row; a room without it
/// shows no such row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_autotunes_rate_and_reason() {
    let h = Harness::start(|c| {
        c.rooms[0].new_users_per_minute = 100;
        c.rooms[0].autotune = Some(waitroom::config::AutotuneConfig {
            latency: Duration::from_secs(2),
            slow_share: 0.02,
            error_share: 0.05,
            floor: 20,
            ceiling: 100,
            step: 0.2,
            interval: Duration::from_secs(30),
            min_requests: 5,
        });
        c.rooms.push(support::room("other", "/other/"));
    })
    .await;
    h.daemon.gate().refresh_room_figures().await;
    h.origin.set_trouble(support::origin::Trouble::Errors);
    for i in 0..10 {
        h.bare()
            .get(h.url(&format!("/static/{i}")))
            .send()
            .await
            .unwrap();
    }
    h.clock.advance(Duration::from_secs(30));
    h.daemon.gate().refresh_room_figures().await;
    let browser = Browser::start(Options::default()).await;
    browser.client.goto(&h.admin_url("/")).await.unwrap();
    let rate = "(document.querySelector('[data-room=\"shop\"] .autotune-rate') || {}).textContent";
    browser
        .wait_until(&format!("{rate} === '80 / min (20–100)'"), WAIT)
        .await;
    let reason = browser
        .eval("document.querySelector('[data-room=\"shop\"] .autotune-reason').textContent")
        .await;
    assert!(
        reason
            .as_str()
            .unwrap()
            .starts_with("origin errors: 100% of requests failed or answered 5xx ("),
        "{reason}"
    );
    let other = browser
        .eval("document.querySelectorAll('[data-room=\"other\"] .autotune').length")
        .await;
    assert_eq!(other, 0);
}

/// The report view (`#report/<room>`) in Chromium, at a desktop's and a
/// phone's width: the store's report of the last day with one figure a
/// tile, the window's counts as rows, and three charts whose bars and
/// lines are the report's minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_view_shows_the_window_with_charts() {
    let h = Harness::start(|c| {
        c.rooms[0].total_active_users = 2;
        c.rooms[0].session_duration = Duration::from_secs(600);
        c.rooms[0].abandon_after = Duration::from_secs(600);
    })
    .await;
    for _ in 0..5 {
        h.visitor().get(h.url("/")).send().await.unwrap();
    }
    h.daemon.gate().refresh_room_figures().await;
    h.clock.advance(Duration::from_secs(120));
    for (width, height) in [(1300, 900), (390, 844)] {
        let browser = Browser::start(Options {
            width,
            height,
            ..Options::default()
        })
        .await;
        browser
            .client
            .goto(&h.admin_url("/#report/shop"))
            .await
            .unwrap();
        browser
            .wait_until(
                "(document.querySelector('#report-body .r-admitted') || {}).textContent === '2'",
                WAIT,
            )
            .await;
        let hidden = browser
            .eval("[document.getElementById('rooms').hidden, document.getElementById('report').hidden]")
            .await;
        assert_eq!(hidden, serde_json::json!([true, false]));
        let counts = browser
            .eval("[...document.querySelectorAll('#report-body .counts div')].map(r => r.querySelector('dt').textContent + '=' + r.querySelector('dd').textContent).join(', ')")
            .await;
        assert_eq!(
            counts,
            "arrivals=5, admitted=2, queued=3, turned away=0, abandoned=0, no-shows=0, revoked=0, shadow queue=0, would shadow (log mode)=0, lane entries=0"
        );
        let peak = browser
            .eval("document.querySelector('#report-body .r-peak-queue').textContent")
            .await;
        assert_eq!(peak, "3");
        let charts = browser
            .eval("document.querySelectorAll('#report-body svg').length")
            .await;
        assert_eq!(charts, 3);
        // One bar: the minute of the two admissions.
        let bars = browser
            .eval("[...document.querySelectorAll('#report-body [data-chart=r-admissions] rect.bar')].map(b => +b.getAttribute('data-v'))")
            .await;
        assert_eq!(bars, serde_json::json!([2]));
        let lines = browser
            .eval("document.querySelectorAll('#report-body [data-chart=r-queue] polyline').length")
            .await;
        assert_eq!(lines, 3, "queue, sessions and the limit");
        let tiles = browser
            .eval("[...document.querySelectorAll('#report-body .fig')].map(f => [f.getBoundingClientRect().height, f.scrollWidth - f.clientWidth])")
            .await;
        for tile in tiles.as_array().unwrap() {
            assert!(tile[0].as_f64().unwrap() <= 90.0, "{width} px: {tiles}");
            assert!(tile[1].as_f64().unwrap() <= 0.0, "{width} px: {tiles}");
        }
        let page_over = browser
            .eval("document.documentElement.scrollWidth - document.documentElement.clientWidth")
            .await;
        assert!(
            page_over.as_f64().unwrap() <= 0.0,
            "{width} px: {page_over}"
        );
        // Back to the live view.
        browser.eval("location.hash = ''").await;
        browser
            .wait_until("!document.getElementById('rooms').hidden", WAIT)
            .await;
    }
}
