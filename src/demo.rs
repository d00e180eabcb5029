//! A tiny demo origin: a "shop" page that shows the visitor id the waiting
//! room passes on, a checkout that ends the session (`X-Waitroom-Command:
//! revoke`), and a static asset that bypasses the room.

use std::convert::Infallible;
use std::net::SocketAddr;

use http::{header, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use crate::body::{full, Body};

/// Serves the demo origin on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let svc = service_fn(|req| async move { Ok::<_, Infallible>(page(req)) });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Binds the demo origin and serves it in the background.
pub async fn spawn(addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(serve(listener));
    Ok(bound)
}

fn page(req: Request<Incoming>) -> Response<Body> {
    let visitor = req
        .headers()
        .get("x-waitroom-visitor")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("(none)")
        .to_owned();
    let (status, body, revoke, ctype) = match req.uri().path() {
        "/static/style.css" => (StatusCode::OK, "body{font-family:system-ui;max-width:40rem;margin:2rem auto;padding:0 1rem}".to_owned(), false, "text/css"),
        "/checkout" => (
            StatusCode::OK,
            shell("Thank you for your order", "Your session has ended, so the next visitor in the queue can come in. <a href=\"/\">Back to the shop</a> (you will queue again if the shop is full)."),
            true,
            "text/html; charset=utf-8",
        ),
        "/favicon.ico" => (StatusCode::NOT_FOUND, String::new(), false, "text/plain"),
        path => (
            StatusCode::OK,
            shell(
                "Demo shop: you are in",
                &format!(
                    "You were admitted by the waiting room. Your visitor id is <code>{visitor}</code>. You asked for <code>{}</code>. <a href=\"/checkout\">Check out</a> to free your place for the next visitor.",
                    escape(path)
                ),
            ),
            false,
            "text/html; charset=utf-8",
        ),
    };
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(ctype),
    );
    if revoke {
        resp.headers_mut().insert(
            "x-waitroom-command",
            header::HeaderValue::from_static("revoke"),
        );
    }
    resp
}

fn shell(title: &str, text: &str) -> String {
    format!("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><link rel=\"stylesheet\" href=\"/static/style.css\"><title>{title}</title></head><body><main><h1>{title}</h1><p>{text}</p></main></body></html>")
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
