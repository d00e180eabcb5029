//! The ticket cookie's attributes in a real headless Chromium: a buyer
//! sent to a payment page on another site comes back by a cross-site form
//! POST (3-D Secure, a wallet). With `cookie.same_site = "none"` the
//! browser sends the ticket and the buyer keeps the session; with the
//! default `"lax"` it does not, and the buyer starts over as a newcomer.
//! The shop is `localhost`, the payment page `127.0.0.1`: two sites.

mod support;

#[path = "support/browser.rs"]
mod browser;

use std::convert::Infallible;
use std::time::Duration;

use browser::{Browser, Options};
use bytes::Bytes;
use http::Response;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use support::Harness;
use tokio::net::TcpListener;
use waitroom::config::{Config, SameSite};

const WAIT: Duration = Duration::from_secs(15);

/// A stand-in payment page on 127.0.0.1 that posts the buyer back to
/// `return_to` at once, as a payment provider's form does. Returns its URL.
async fn payment_page(return_to: String) -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let page = format!(
        "<!doctype html><title>pay</title><form id=f method=post action=\"{return_to}\">\
         <input type=hidden name=status value=paid></form>\
         <script>document.getElementById('f').submit()</script>"
    );
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let page = page.clone();
            tokio::spawn(async move {
                let service = service_fn(move |_req: http::Request<hyper::body::Incoming>| {
                    let page = page.clone();
                    async move {
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("content-type", "text/html")
                                .body(Full::new(Bytes::from(page)))
                                .unwrap(),
                        )
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (format!("http://{addr}/pay"), task)
}

/// Admitted on the shop, off to pay, posted back: whether the origin
/// answered the POST for the same visitor.
async fn back_from_paying(same_site: SameSite) -> (String, String) {
    let h = Harness::start(move |c: &mut Config| {
        c.rooms[0].total_active_users = 1;
        c.cookie.same_site = same_site;
        // Chromium takes Secure cookies from http://localhost.
        c.cookie.secure = true;
    })
    .await;
    let shop = format!("http://localhost:{}", h.daemon.addr.port());
    let (pay, server) = payment_page(format!("{shop}/checkout/return")).await;
    let browser = Browser::start(Options::default()).await;
    browser.client.goto(&format!("{shop}/")).await.unwrap();
    browser
        .wait_until(
            "document.body.innerText.includes('x-waitroom-visitor')",
            WAIT,
        )
        .await;
    let echo: serde_json::Value = serde_json::from_str(
        browser
            .eval("document.body.innerText")
            .await
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let visitor = echo["headers"]["x-waitroom-visitor"][0]
        .as_str()
        .unwrap()
        .to_owned();
    browser.client.goto(&pay).await.unwrap();
    browser
        .wait_until("location.pathname === '/checkout/return'", WAIT)
        .await;
    browser
        .wait_until("document.readyState === 'complete'", WAIT)
        .await;
    let landed = browser
        .eval("document.body.innerText")
        .await
        .as_str()
        .unwrap()
        .to_owned();
    server.abort();
    (visitor, landed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_site_none_keeps_the_session_across_a_payment_post() {
    let (visitor, landed) = back_from_paying(SameSite::None).await;
    let echo: serde_json::Value = serde_json::from_str(&landed)
        .unwrap_or_else(|e| panic!("not the origin's answer ({e}): {landed}"));
    assert_eq!(echo["method"], "POST", "{echo}");
    assert_eq!(echo["headers"]["x-waitroom-visitor"][0], visitor.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_site_lax_starts_over_after_a_payment_post() {
    let (visitor, landed) = back_from_paying(SameSite::Lax).await;
    // The room's one place is the buyer's, whose ticket the browser kept
    // back: the POST is a newcomer's, and it waits.
    assert!(!landed.contains(&visitor), "{landed}");
    assert!(
        serde_json::from_str::<serde_json::Value>(&landed).is_err(),
        "the origin answered: {landed}"
    );
}
