//! A real fake origin on a loopback port: echo, streaming download and
//! upload, slow answers, a WebSocket echo, the revoke command and a stock
//! count; trouble on demand (every answer slow, or a 503); and, like
//! an origin that speaks h2c or answers any upgrade, `101` to any other
//! request that asks to upgrade, after which it records what arrives.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::WebSocketStream;
use waitroom::body::{boxed, full, Body};

pub struct Origin {
    pub addr: SocketAddr,
    /// TCP connections accepted so far (to see keep-alive reuse).
    pub connections: Arc<AtomicUsize>,
    /// TCP connections open now (what the daemon holds at the origin).
    pub open: Arc<AtomicUsize>,
    /// Bytes that arrived through upgraded connections other than `/ws`.
    pub tunneled: Arc<std::sync::Mutex<Vec<u8>>>,
    /// What ails the origin now; a test flips it.
    pub trouble: Arc<std::sync::Mutex<Trouble>>,
    task: tokio::task::JoinHandle<()>,
}

/// An origin's health, for every request while it lasts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Trouble {
    #[default]
    None,
    /// Every answer waits this long first.
    Slow(Duration),
    /// Every answer is `503 Service Unavailable`.
    Errors,
}

impl Origin {
    /// Makes every answer from now on `trouble`'s.
    pub fn set_trouble(&self, trouble: Trouble) {
        *self.trouble.lock().unwrap() = trouble;
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Origin {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let tunneled = Arc::new(std::sync::Mutex::new(Vec::new()));
        let trouble = Arc::new(std::sync::Mutex::new(Trouble::None));
        let (counter, open_now, log) = (connections.clone(), open.clone(), tunneled.clone());
        let ails = trouble.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                counter.fetch_add(1, Ordering::SeqCst);
                open_now.fetch_add(1, Ordering::SeqCst);
                let (open_now, log, ails) = (open_now.clone(), log.clone(), ails.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let log = log.clone();
                        let trouble = *ails.lock().unwrap();
                        async move {
                            match trouble {
                                Trouble::None => {}
                                Trouble::Slow(pause) => tokio::time::sleep(pause).await,
                                Trouble::Errors => {
                                    return Ok::<_, Infallible>(reply(
                                        StatusCode::SERVICE_UNAVAILABLE,
                                        full("unavailable"),
                                    ))
                                }
                            }
                            Ok::<_, Infallible>(handle(req, log).await)
                        }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                        .await;
                    open_now.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Self {
            addr,
            connections,
            open,
            tunneled,
            trouble,
            task,
        }
    }
}

/// The path as nginx resolves it before choosing what to serve: every
/// percent escape decoded, slashes merged, dot segments resolved (a path
/// above the root stays at the root).
pub fn normalize(path: &str) -> String {
    let b = path.as_bytes();
    let mut decoded = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                decoded.push(v);
                i += 3;
            }
            (c, _) => {
                decoded.push(c);
                i += 1;
            }
        }
    }
    let mut out: Vec<&[u8]> = Vec::new();
    for seg in decoded.split(|c| *c == b'/' || *c == b'\\') {
        match seg {
            b"" | b"." => {}
            b".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    let mut text = String::new();
    for s in out {
        text.push('/');
        text.push_str(&String::from_utf8_lossy(s));
    }
    if text.is_empty() {
        text.push('/');
    }
    text
}

fn query_u64(req: &Request<Incoming>, key: &str) -> u64 {
    req.uri()
        .query()
        .and_then(|q| {
            q.split('&')
                .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn reply(status: StatusCode, body: Body) -> Response<Body> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp.headers_mut().insert("x-origin", "1".parse().unwrap());
    resp
}

type Log = Arc<std::sync::Mutex<Vec<u8>>>;

async fn handle(mut req: Request<Incoming>, log: Log) -> Response<Body> {
    let path = req.uri().path().to_owned();
    if path != "/ws" {
        if let Some(protocol) = req.headers().get("upgrade").cloned() {
            // Like Jetty or Apache with `Protocols h2c`, or an origin that
            // switches for anyone who asks: whatever comes next is logged.
            let upgrade = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                let Ok(upgraded) = upgrade.await else { return };
                let mut io = TokioIo::new(upgraded);
                let mut buf = [0u8; 4096];
                loop {
                    match tokio::io::AsyncReadExt::read(&mut io, &mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => log.lock().unwrap().extend_from_slice(&buf[..n]),
                    }
                }
            });
            let mut resp = reply(StatusCode::SWITCHING_PROTOCOLS, waitroom::body::empty());
            let h = resp.headers_mut();
            h.insert("connection", "upgrade".parse().unwrap());
            h.insert("upgrade", protocol);
            return resp;
        }
    }
    match path.as_str() {
        "/download" => {
            let total = query_u64(&req, "bytes");
            let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
            let stream = futures::stream::unfold(0u64, move |sent| {
                let chunk = chunk.clone();
                async move {
                    if sent >= total {
                        return None;
                    }
                    let n = (total - sent).min(chunk.len() as u64) as usize;
                    Some((
                        Ok::<_, Infallible>(Frame::data(chunk.slice(..n))),
                        sent + n as u64,
                    ))
                }
            });
            reply(StatusCode::OK, boxed(StreamBody::new(stream)))
        }
        // Two chunks `ms` apart: a stream that goes quiet (server-sent events).
        "/drip" => {
            let pause = Duration::from_millis(query_u64(&req, "ms"));
            let stream = futures::stream::unfold(0u8, move |sent| async move {
                match sent {
                    0 => Some((Ok::<_, Infallible>(Frame::data(Bytes::from("one "))), 1)),
                    1 => {
                        tokio::time::sleep(pause).await;
                        Some((Ok(Frame::data(Bytes::from("two"))), 2))
                    }
                    _ => None,
                }
            });
            reply(StatusCode::OK, boxed(StreamBody::new(stream)))
        }
        "/upload" => {
            let mut body = req.into_body();
            let mut n = 0u64;
            while let Some(frame) = body.frame().await {
                match frame {
                    Ok(f) => n += f.data_ref().map_or(0, |d| d.len() as u64),
                    Err(_) => return reply(StatusCode::BAD_REQUEST, full("body error")),
                }
            }
            reply(StatusCode::OK, full(n.to_string()))
        }
        "/slow" => {
            tokio::time::sleep(Duration::from_millis(query_u64(&req, "ms"))).await;
            reply(StatusCode::OK, full("slow"))
        }
        "/sold-out" => {
            let mut resp = reply(StatusCode::OK, full("that was the last one"));
            resp.headers_mut()
                .insert("x-waitroom-command", "close".parse().unwrap());
            resp
        }
        "/stock" => {
            // `?v=N` is sent as `X-Waitroom-Stock: N` as it is written
            // (numbers or not); `&also=M` adds `X_Waitroom_Stock: M`.
            let query = req.uri().query().unwrap_or("");
            let param = |key: &str| {
                query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
                    .map(str::to_owned)
            };
            let mut resp = reply(StatusCode::OK, full("stock"));
            if let Some(v) = param("v") {
                resp.headers_mut()
                    .insert("x-waitroom-stock", v.parse().unwrap());
            }
            if let Some(v) = param("also") {
                resp.headers_mut()
                    .insert("x_waitroom_stock", v.parse().unwrap());
            }
            resp
        }
        "/revoke" => {
            let mut resp = reply(StatusCode::OK, full("thanks for your order"));
            resp.headers_mut()
                .insert("x-waitroom-command", "revoke".parse().unwrap());
            resp
        }
        "/hop" => {
            let mut resp = reply(StatusCode::OK, full("hop"));
            let h = resp.headers_mut();
            h.insert("connection", "x-secret-hop, keep-alive".parse().unwrap());
            h.insert("x-secret-hop", "1".parse().unwrap());
            h.insert("keep-alive", "timeout=5".parse().unwrap());
            resp
        }
        "/ws" => {
            let key = req.headers().get("sec-websocket-key").map(|k| {
                tokio_tungstenite::tungstenite::handshake::derive_accept_key(k.as_bytes())
            });
            let Some(accept) = key else {
                return reply(StatusCode::BAD_REQUEST, full("not a websocket"));
            };
            let upgrade = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                let Ok(upgraded) = upgrade.await else { return };
                let mut ws =
                    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None)
                        .await;
                while let Some(Ok(msg)) = ws.next().await {
                    if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                        break;
                    }
                }
            });
            let mut resp = reply(StatusCode::SWITCHING_PROTOCOLS, waitroom::body::empty());
            let h = resp.headers_mut();
            h.insert("connection", "upgrade".parse().unwrap());
            h.insert("upgrade", "websocket".parse().unwrap());
            h.insert("sec-websocket-accept", accept.parse().unwrap());
            resp
        }
        _ => {
            // Echo: what the origin received.
            let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (k, v) in req.headers() {
                headers
                    .entry(k.as_str().to_owned())
                    .or_default()
                    .push(v.to_str().unwrap_or("").to_owned());
            }
            let echo = serde_json::json!({
                "method": req.method().as_str(),
                "uri": req.uri().to_string(),
                // What a path-normalizing server (nginx) would serve.
                "served": normalize(req.uri().path()),
                "headers": headers,
            });
            // `?answer=NNN` answers with that status (a failed payment, a
            // redirect to an error page).
            let status = req
                .uri()
                .query()
                .unwrap_or("")
                .split('&')
                .find_map(|kv| kv.strip_prefix("answer="))
                .and_then(|v| v.parse::<u16>().ok())
                .and_then(|v| StatusCode::from_u16(v).ok())
                .unwrap_or(StatusCode::OK);
            let mut resp = reply(status, full(echo.to_string()));
            resp.headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            resp
        }
    }
}
