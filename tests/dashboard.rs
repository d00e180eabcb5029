//! The admin dashboard in a real headless Chromium: it renders each room and
//! follows the figures as they change.

mod support;

#[path = "support/browser.rs"]
mod browser;

use std::time::Duration;

use browser::{Browser, Options};
use support::Harness;

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
    assert_eq!(charts, 4, "active/limit, queue, admissions, ETA");
    let external = browser
        .eval("[...document.querySelectorAll('[src],[href]')].length")
        .await;
    assert_eq!(external, 0, "self-contained");

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
    // Half an hour of a sale: a rush, a queue that builds and drains.
    let mut visitors = Vec::new();
    for step in 0..360u64 {
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
