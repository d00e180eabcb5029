//! Serving one accepted connection, the same way on every listener (the
//! visitor workers' plain and TLS listeners, the admin listener): HTTP/1.1
//! or HTTP/2 told apart by the first bytes (or by ALPN), the limits of
//! [`super::conn`] applied, and a drain when the listener stops.
//!
//! Each serving thread runs a current-thread runtime in a `LocalSet`;
//! hyper's per-connection tasks (HTTP/2 streams) run on it too
//! ([`LocalExec`]), so a connection and everything it starts stay on one
//! thread.

use std::cell::Cell;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify, Semaphore};
use tokio_rustls::TlsAcceptor;
use tower::ServiceBuilder;

use super::conn::{self, Activity, HeadWatch, SendTimeout};
use super::streams::{self, StreamLayer};
use super::Limits;
use crate::body::Body;

/// Runs hyper's per-connection tasks (HTTP/2 streams) on the serving
/// thread itself.
#[derive(Clone, Copy)]
pub(crate) struct LocalExec;

impl<F> hyper::rt::Executor<F> for LocalExec
where
    F: Future + 'static,
{
    fn execute(&self, fut: F) {
        tokio::task::spawn_local(fut);
    }
}

/// The first bytes of every HTTP/2 connection (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Most bytes an HTTP/2 stream's response may have queued for the client
/// (hyper's default is 400 KiB): what a client that reads slowly can make
/// the daemon hold per stream.
const MAX_SEND_BUF: usize = 64 * 1024;

/// How connections are served, built once per serving thread.
pub(crate) struct Serving {
    http1: http1::Builder,
    http2: http2::Builder<LocalExec>,
    /// For a connection whose first bytes do not yet tell (rare).
    auto: auto::Builder<LocalExec>,
    header_read_timeout: Duration,
    send_timeout: Duration,
}

impl Serving {
    pub(crate) fn new(limits: &Limits) -> Self {
        let streams = limits.max_streams_per_connection;
        // hyper refuses buffers under 8 KiB; headers past the buffer get 431.
        let buf = limits.max_header_bytes.max(8192);
        let header_list = limits.max_header_bytes.min(u32::MAX as usize) as u32;
        let mut http1 = http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .max_buf_size(buf);
        let mut http2 = http2::Builder::new(LocalExec);
        http2
            .timer(TokioTimer::new())
            .max_header_list_size(header_list)
            .max_concurrent_streams(streams)
            .max_send_buf_size(MAX_SEND_BUF);
        let mut auto = auto::Builder::new(LocalExec);
        auto.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .max_buf_size(buf);
        auto.http2()
            .timer(TokioTimer::new())
            .max_header_list_size(header_list)
            .max_concurrent_streams(streams)
            .max_send_buf_size(MAX_SEND_BUF);
        Self {
            http1,
            http2,
            auto,
            header_read_timeout: limits.header_read_timeout,
            send_timeout: limits.send_timeout,
        }
    }
}

/// The connections one serving thread has open, so it can drain them.
#[derive(Clone, Default)]
pub(crate) struct Open {
    count: Rc<Cell<usize>>,
    closed: Rc<Notify>,
}

impl Open {
    pub(crate) fn enter(&self) -> OpenGuard {
        self.count.set(self.count.get() + 1);
        OpenGuard(self.clone())
    }

    pub(crate) async fn all_closed(&self) {
        while self.count.get() > 0 {
            self.closed.notified().await;
        }
    }
}

pub(crate) struct OpenGuard(Open);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        let open = &self.0;
        open.count.set(open.count.get() - 1);
        open.closed.notify_waiters();
    }
}

/// What a connection's requests are answered by: called once per request.
pub(crate) trait Handler: Fn(Request<Incoming>) -> Self::Answer + Clone + 'static {
    type Answer: Future<Output = Response<Body>> + 'static;
}

impl<F, Fut> Handler for F
where
    F: Fn(Request<Incoming>) -> Fut + Clone + 'static,
    Fut: Future<Output = Response<Body>> + 'static,
{
    type Answer = Fut;
}

/// The error a connection ended with, for the debug log.
pub(crate) type ConnError = Box<dyn std::error::Error + Send + Sync>;

/// Runs a connection to its end; when the thread is told to stop, asks it
/// to finish the request in flight and close.
async fn drive<C, E>(
    conn: C,
    shutdown: impl FnOnce(Pin<&mut C>),
    mut stop: watch::Receiver<bool>,
) -> Result<(), E>
where
    C: Future<Output = Result<(), E>>,
{
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => return result,
        _ = stop.changed() => {}
    }
    shutdown(conn.as_mut());
    conn.await
}

/// How long an HTTP/2 connection has after its GOAWAY to close by itself
/// before its socket is closed.
const GOAWAY_GRACE: Duration = Duration::from_secs(1);

/// `drive` for HTTP/2, closing the connection once it has had no request
/// in flight for `header_read_timeout`, or once a response has waited
/// `send_timeout` for the client to take data (see [`Activity`]): a
/// GOAWAY first, then, at most `GOAWAY_GRACE` later, the socket, and with
/// it every stream and what each held at the origin.
async fn drive_watched<C, E>(
    conn: C,
    shutdown: impl FnOnce(Pin<&mut C>),
    mut stop: watch::Receiver<bool>,
    activity: &Activity,
    serving: &Serving,
) -> Result<(), E>
where
    C: Future<Output = Result<(), E>>,
{
    let (idle, send_timeout) = (serving.header_read_timeout, serving.send_timeout);
    let mut conn = std::pin::pin!(conn);
    loop {
        tokio::select! {
            result = conn.as_mut() => return result,
            _ = stop.changed() => break,
            _ = tokio::time::sleep_until(activity.due(idle, send_timeout)) => {
                let why = if activity.stalled(send_timeout) {
                    "a response waited send_timeout for the client to take it"
                } else if activity.idle_for(idle) {
                    "idle HTTP/2"
                } else {
                    continue;
                };
                tracing::debug!(why, "connection closed");
                // hyper's graceful close waits for the peer to answer a
                // PING, which a peer that went quiet may never do.
                shutdown(conn.as_mut());
                let _ = tokio::time::timeout(GOAWAY_GRACE.min(idle), conn).await;
                return Ok(());
            }
        }
    }
    shutdown(conn.as_mut());
    conn.await
}

/// Serves HTTP/2 on `io`: the stream layers around `handler` (see
/// [`streams`]), watched by [`drive_watched`].
async fn serve_h2<I, H>(
    io: I,
    handler: H,
    budget: Arc<Semaphore>,
    serving: &Serving,
    stop: watch::Receiver<bool>,
    sniffed: bool,
) -> Result<(), ConnError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Handler,
{
    let activity = Activity::default();
    let svc = ServiceBuilder::new()
        .map_result(streams::shed)
        .load_shed()
        .layer(StreamLayer::new(budget, activity.clone()))
        .service(tower::service_fn(move |req| {
            // Boxed here, once: the layers above move the future around,
            // and the gate's is large (unboxed, the copies cost HTTP/2
            // about 25,000 memcpy instructions a request, callgrind).
            let answer = Box::pin(handler(req));
            async move { Ok::<_, Infallible>(answer.await) }
        }));
    let svc = TowerToHyperService::new(svc);
    let io = TokioIo::new(io);
    if sniffed {
        let conn = serving.http2.serve_connection(io, svc);
        drive_watched(conn, |c| c.graceful_shutdown(), stop, &activity, serving).await?;
    } else {
        // Part of the preface so far: HTTP/2 or nothing hyper can serve.
        let conn = serving.auto.serve_connection_with_upgrades(io, svc);
        drive_watched(conn, |c| c.graceful_shutdown(), stop, &activity, serving).await?;
    }
    Ok(())
}

/// Serves HTTP/1.1 on `io`, with upgrades (WebSocket tunnels).
async fn serve_h1<I, H>(
    io: I,
    handler: H,
    serving: &Serving,
    stop: watch::Receiver<bool>,
) -> Result<(), ConnError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Handler,
{
    let svc = hyper::service::service_fn(move |req| {
        let answer = Box::pin(handler(req));
        async move { Ok::<_, Infallible>(answer.await) }
    });
    let conn = serving
        .http1
        .serve_connection(TokioIo::new(HeadWatch::new(io)), svc)
        .with_upgrades();
    drive(conn, |c| c.graceful_shutdown(), stop).await?;
    Ok(())
}

/// Serves one plain connection as HTTP/1.1 or HTTP/2, told apart by its
/// first bytes (peeked, so nothing is read twice). `budget` is the stream
/// budget of the connection's address.
pub(crate) async fn serve<H: Handler>(
    stream: TcpStream,
    handler: H,
    budget: Arc<Semaphore>,
    serving: &Serving,
    stop: watch::Receiver<bool>,
) -> Result<(), ConnError> {
    if !conn::first_byte(&stream, serving.header_read_timeout).await {
        tracing::debug!("connection closed: nothing sent");
        return Ok(());
    }
    let mut head = [0u8; 24];
    let seen = stream.peek(&mut head).await.unwrap_or(0);
    let io = SendTimeout::new(stream, serving.send_timeout);
    if !H2_PREFACE.starts_with(&head[..seen]) {
        return serve_h1(io, handler, serving, stop).await;
    }
    // HTTP/2, or part of its preface so far: hyper's header timeout does
    // not apply, so the watch does.
    let sniffed = seen == H2_PREFACE.len();
    serve_h2(io, handler, budget, serving, stop, sniffed).await
}

/// Serves one TLS connection: the handshake first, bounded by
/// `header_read_timeout` like a plain connection's first bytes; then
/// HTTP/2 or HTTP/1.1 as ALPN chose (HTTP/1.1 when the client offered
/// no ALPN).
pub(crate) async fn serve_tls<H: Handler>(
    stream: TcpStream,
    acceptor: &TlsAcceptor,
    handler: H,
    budget: Arc<Semaphore>,
    serving: &Serving,
    stop: watch::Receiver<bool>,
) -> Result<(), ConnError> {
    let io = SendTimeout::new(stream, serving.send_timeout);
    let stream = match tokio::time::timeout(serving.header_read_timeout, acceptor.accept(io)).await
    {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            return Ok(());
        }
        Err(_) => {
            tracing::debug!("connection closed: no TLS handshake in time");
            return Ok(());
        }
    };
    if stream.get_ref().1.alpn_protocol() == Some(crate::tls::ALPN_H2) {
        serve_h2(stream, handler, budget, serving, stop, true).await
    } else {
        serve_h1(stream, handler, serving, stop).await
    }
}
