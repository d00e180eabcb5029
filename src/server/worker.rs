//! The visitor listeners' workers: one OS thread per core, each running a
//! current-thread runtime with its own `SO_REUSEPORT` listener (and one for
//! TLS when `[tls]` is set), its own connections and its own origin
//! connection pool.
//!
//! The kernel spreads new connections over the workers' listeners; from
//! then on a connection, its requests and the origin connections they use
//! stay on one thread. Nothing on the admitted path crosses cores: no task
//! is woken on another thread, no channel is shared, the gate in force is
//! read through a per-worker cache, and the only shared writes are the
//! metrics' counters.

use std::cell::{Cell, RefCell};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{oneshot, watch, Notify};
use tokio_rustls::TlsAcceptor;

use super::conn::{self, Active, Activity, Caps, Counted, HeadWatch};
use super::redirect::Redirect;
use super::{Limits, StartError};
use crate::gate::{ConnInfo, Gate, SharedGate};

/// Runs hyper's per-connection tasks (HTTP/2 streams) on the worker itself.
#[derive(Clone, Copy)]
struct LocalExec;

impl<F> hyper::rt::Executor<F> for LocalExec
where
    F: Future + 'static,
{
    fn execute(&self, fut: F) {
        tokio::task::spawn_local(fut);
    }
}

/// The gate as one worker holds it: an `Rc` around the shared `Arc`, so
/// that each request's copy is a plain increment on this thread rather
/// than an atomic one on a cache line every core writes.
#[allow(clippy::redundant_allocation)]
type LocalGate = Rc<Arc<Gate>>;

/// The gate in force, read once per request without touching a shared
/// reference count: the `Arc` of the current gate is kept here and only
/// swapped when a reload installed another.
struct GateCache {
    gates: SharedGate,
    current: RefCell<LocalGate>,
}

impl GateCache {
    fn new(gates: SharedGate) -> Self {
        let current = RefCell::new(Rc::new(gates.load_full()));
        Self { gates, current }
    }

    fn get(&self) -> LocalGate {
        let installed = self.gates.load();
        let mut current = self.current.borrow_mut();
        if !Arc::ptr_eq(&installed, &current) {
            *current = Rc::new(Arc::clone(&installed));
        }
        Rc::clone(&current)
    }
}

/// The running workers.
pub struct Workers {
    /// Where they listen (one port, bound by each).
    pub addr: SocketAddr,
    /// Where they accept TLS, when `[tls]` is configured.
    pub tls_addr: Option<SocketAddr>,
    /// One per worker, resolved when it has drained and stopped.
    done: Vec<oneshot::Receiver<()>>,
}

/// The TLS listener, served by the same workers as the plain one.
#[derive(Clone)]
pub struct TlsListen {
    pub addr: SocketAddr,
    pub acceptor: TlsAcceptor,
    /// Plain HTTP is answered with a redirect to this listener.
    pub redirect_http: bool,
}

/// What every worker shares, cloned into each.
#[derive(Clone)]
pub struct Shared {
    pub gates: SharedGate,
    pub limits: Limits,
    /// One set of caps for both listeners: a client's plain and TLS
    /// connections count together.
    pub caps: Caps,
    pub stop: watch::Receiver<bool>,
    /// The daemon's health check path (answered on plain HTTP even when
    /// it redirects to https).
    pub health_path: Arc<str>,
}

impl Workers {
    /// Binds `count` listeners on `addr` (the first picks the port when it
    /// is 0), and as many on the TLS address when given, and starts a
    /// worker thread for each pair; returns once every one listens.
    pub async fn start(
        addr: SocketAddr,
        tls: Option<TlsListen>,
        count: usize,
        shared: Shared,
    ) -> Result<Self, StartError> {
        let bind_error = |addr, source| StartError::Bind { addr, source };
        let count = count.max(1);
        let mut sockets = Vec::with_capacity(count);
        let mut bound = addr;
        for _ in 0..count {
            let socket = reuseport_socket(bound).map_err(|e| bind_error(bound, e))?;
            bound = socket.local_addr().map_err(|e| bind_error(bound, e))?;
            sockets.push(socket);
        }
        let mut tls_sockets: Vec<Option<(TcpSocket, TlsListen)>> = Vec::with_capacity(count);
        let mut tls_addr = None;
        if let Some(mut tls) = tls {
            for _ in 0..count {
                let socket = reuseport_socket(tls.addr).map_err(|e| bind_error(tls.addr, e))?;
                tls.addr = socket.local_addr().map_err(|e| bind_error(tls.addr, e))?;
                tls_sockets.push(Some((socket, tls.clone())));
            }
            tls_addr = Some(tls.addr);
        } else {
            tls_sockets.resize_with(count, || None);
        }
        let mut done = Vec::with_capacity(sockets.len());
        let mut listening = Vec::with_capacity(sockets.len());
        for (index, (socket, tls)) in sockets.into_iter().zip(tls_sockets).enumerate() {
            let (finished, finished_rx) = oneshot::channel();
            done.push(finished_rx);
            let (ready, ready_rx) = oneshot::channel();
            listening.push(ready_rx);
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("waitroom-worker-{index}"))
                .spawn(move || {
                    match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(runtime) => {
                            let local = tokio::task::LocalSet::new();
                            local.block_on(&runtime, run(index, socket, tls, ready, shared));
                        }
                        Err(e) => tracing::error!(error = %e, "worker runtime failed to start"),
                    }
                    let _ = finished.send(());
                })
                .map_err(|e| bind_error(bound, e))?;
        }
        for ready in listening {
            match ready.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(bind_error(bound, e)),
                Err(_) => {
                    return Err(bind_error(
                        bound,
                        std::io::Error::other("worker thread ended before listening"),
                    ))
                }
            }
        }
        Ok(Self {
            addr: bound,
            tls_addr,
            done,
        })
    }

    /// Waits until every worker has drained and stopped.
    pub async fn stopped(self) {
        for done in self.done {
            let _ = done.await;
        }
    }
}

/// A listening socket on `addr` that other sockets of this process may
/// share (`SO_REUSEPORT`), so each worker accepts on its own.
fn reuseport_socket(addr: SocketAddr) -> std::io::Result<TcpSocket> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    #[cfg(unix)]
    socket.set_reuseport(true)?;
    socket.set_nodelay(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

/// The first bytes of every HTTP/2 connection (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How the worker's connections are served, built once per worker.
struct Serving {
    http1: http1::Builder,
    http2: http2::Builder<LocalExec>,
    /// For a connection whose first bytes do not yet tell (rare).
    auto: auto::Builder<LocalExec>,
    header_read_timeout: Duration,
}

impl Serving {
    fn new(limits: &Limits) -> Self {
        let mut http1 = http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            // hyper refuses buffers under 8 KiB; headers past the buffer get 431.
            .max_buf_size(limits.max_header_bytes.max(8192));
        let mut http2 = http2::Builder::new(LocalExec);
        http2
            .timer(TokioTimer::new())
            .max_header_list_size(limits.max_header_bytes.min(u32::MAX as usize) as u32);
        let mut auto = auto::Builder::new(LocalExec);
        auto.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .max_buf_size(limits.max_header_bytes.max(8192));
        auto.http2()
            .timer(TokioTimer::new())
            .max_header_list_size(limits.max_header_bytes.min(u32::MAX as usize) as u32);
        Self {
            http1,
            http2,
            auto,
            header_read_timeout: limits.header_read_timeout,
        }
    }
}

/// The connections one worker has open, so it can drain them at shutdown.
#[derive(Clone, Default)]
struct Open {
    count: Rc<Cell<usize>>,
    closed: Rc<Notify>,
}

impl Open {
    fn enter(&self) -> OpenGuard {
        self.count.set(self.count.get() + 1);
        OpenGuard(self.clone())
    }

    async fn all_closed(&self) {
        while self.count.get() > 0 {
            self.closed.notified().await;
        }
    }
}

struct OpenGuard(Open);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        let open = &self.0;
        open.count.set(open.count.get() - 1);
        open.closed.notify_waiters();
    }
}

/// Runs a connection to its end; when the worker is told to stop, asks it
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

/// How long an idle HTTP/2 connection has after its GOAWAY to close by
/// itself before its socket is closed.
const GOAWAY_GRACE: Duration = Duration::from_secs(1);

/// `drive`, and closes the connection once it has had no request in
/// flight and no traffic for `header_read_timeout` (see [`Activity`]):
/// a GOAWAY first, then, at most `GOAWAY_GRACE` later, the socket.
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
    let idle = serving.header_read_timeout;
    let mut conn = std::pin::pin!(conn);
    loop {
        tokio::select! {
            result = conn.as_mut() => return result,
            _ = stop.changed() => break,
            _ = tokio::time::sleep_until(activity.due(idle)) => {
                if activity.idle_for(idle) {
                    tracing::debug!("connection closed: idle HTTP/2");
                    // hyper's graceful close waits for the peer to answer a
                    // PING, which a peer that went quiet may never do.
                    shutdown(conn.as_mut());
                    let _ = tokio::time::timeout(GOAWAY_GRACE.min(idle), conn).await;
                    return Ok(());
                }
            }
        }
    }
    shutdown(conn.as_mut());
    conn.await
}

/// One worker: accepts on its plain listener (and its TLS listener, when
/// there is one) until told to stop, then drains its connections.
async fn run(
    index: usize,
    socket: TcpSocket,
    tls: Option<(TcpSocket, TlsListen)>,
    ready: oneshot::Sender<std::io::Result<()>>,
    shared: Shared,
) {
    // Listening registers the sockets with this thread's runtime.
    let listened = socket.listen(1024).and_then(|plain| {
        let tls = match tls {
            Some((socket, tls)) => Some((socket.listen(1024)?, tls)),
            None => None,
        };
        Ok((plain, tls))
    });
    let (plain, tls) = match listened {
        Ok(l) => {
            let _ = ready.send(Ok(()));
            l
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let worker = Worker {
        index,
        cache: Rc::new(GateCache::new(shared.gates.clone())),
        serving: Rc::new(Serving::new(&shared.limits)),
        open: Open::default(),
        caps: shared.caps.clone(),
        stop: shared.stop.clone(),
    };
    let redirect = tls
        .as_ref()
        .filter(|(_, t)| t.redirect_http)
        .map(|(_, t)| Rc::new(Redirect::new(t.addr.port(), shared.health_path.clone())));
    let tls_loop = async {
        if let Some((listener, tls)) = tls {
            worker.accept(listener, Some(tls.acceptor), None).await;
        }
    };
    tokio::join!(worker.accept(plain, None, redirect), tls_loop);
    if tokio::time::timeout(shared.limits.drain_timeout, worker.open.all_closed())
        .await
        .is_err()
    {
        tracing::warn!(
            worker = index,
            "drain timed out; closing remaining connections"
        );
    }
}

/// One worker's state, shared by its accept loops.
struct Worker {
    index: usize,
    cache: Rc<GateCache>,
    serving: Rc<Serving>,
    open: Open,
    caps: Caps,
    stop: watch::Receiver<bool>,
}

impl Worker {
    /// Accepts on `listener` until told to stop: TLS connections when
    /// `tls` is given; plain ones otherwise, answered with a redirect to
    /// https when `redirect` is given.
    async fn accept(
        &self,
        listener: TcpListener,
        tls: Option<TlsAcceptor>,
        redirect: Option<Rc<Redirect>>,
    ) {
        let mut stop = self.stop.clone();
        while let Some((stream, peer, admission)) =
            conn::accept(&listener, &self.caps, &mut stop).await
        {
            let cache = self.cache.clone();
            let info = ConnInfo::new(peer, self.index);
            let info = Rc::new(if tls.is_some() { info.over_tls() } else { info });
            let (serving, stop, open) = (self.serving.clone(), stop.clone(), self.open.enter());
            let (tls, redirect) = (tls.clone(), redirect.clone());
            tokio::task::spawn_local(async move {
                let _open = open;
                let _admission = admission;
                let served = match (tls, redirect) {
                    (Some(acceptor), _) => {
                        let svc = service_fn(move |req| {
                            let (gate, info) = (cache.get(), info.clone());
                            async move { Ok::<_, Infallible>(gate.handle(req, &info).await) }
                        });
                        serve_tls(stream, &acceptor, svc, &serving, stop).await
                    }
                    (None, Some(redirect)) => {
                        let svc = service_fn(move |req| {
                            let (redirect, gate, info) =
                                (redirect.clone(), cache.get(), info.clone());
                            async move {
                                let resp = match redirect.answer(&req) {
                                    Some(resp) => resp,
                                    None => gate.handle(req, &info).await,
                                };
                                Ok::<_, Infallible>(resp)
                            }
                        });
                        serve(stream, svc, &serving, stop).await
                    }
                    (None, None) => {
                        let svc = service_fn(move |req| {
                            let (gate, info) = (cache.get(), info.clone());
                            async move { Ok::<_, Infallible>(gate.handle(req, &info).await) }
                        });
                        serve(stream, svc, &serving, stop).await
                    }
                };
                if let Err(e) = served {
                    tracing::debug!(error = %e, %peer, "connection ended with an error");
                }
            });
        }
    }
}

/// Serves one TLS connection: the handshake first, bounded by
/// `header_read_timeout` like a plain connection's first bytes; then
/// HTTP/2 or HTTP/1.1 as ALPN chose (HTTP/1.1 when the client offered
/// no ALPN).
async fn serve_tls<S>(
    stream: TcpStream,
    acceptor: &TlsAcceptor,
    svc: S,
    serving: &Serving,
    stop: watch::Receiver<bool>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
where
    S: hyper::service::Service<
            http::Request<Incoming>,
            Response = http::Response<crate::body::Body>,
            Error = Infallible,
        > + 'static,
    S::Future: 'static,
{
    let stream =
        match tokio::time::timeout(serving.header_read_timeout, acceptor.accept(stream)).await {
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
    let h2 = stream.get_ref().1.alpn_protocol() == Some(crate::tls::ALPN_H2);
    if h2 {
        let activity = Activity::default();
        let io = TokioIo::new(Active::new(stream, activity.clone()));
        let conn = serving
            .http2
            .serve_connection(io, Counted::new(svc, activity.clone()));
        drive_watched(conn, |c| c.graceful_shutdown(), stop, &activity, serving).await?;
    } else {
        let io = TokioIo::new(HeadWatch::new(stream));
        let conn = serving.http1.serve_connection(io, svc).with_upgrades();
        drive(conn, |c| c.graceful_shutdown(), stop).await?;
    }
    Ok(())
}

/// Serves one connection as HTTP/1.1 or HTTP/2, told apart by its first
/// bytes (peeked, so nothing is read twice).
async fn serve<S>(
    stream: TcpStream,
    svc: S,
    serving: &Serving,
    stop: watch::Receiver<bool>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
where
    S: hyper::service::Service<
            http::Request<Incoming>,
            Response = http::Response<crate::body::Body>,
            Error = Infallible,
        > + 'static,
    S::Future: 'static,
{
    if !conn::first_byte(&stream, serving.header_read_timeout).await {
        tracing::debug!("connection closed: nothing sent");
        return Ok(());
    }
    let mut head = [0u8; 24];
    let seen = stream.peek(&mut head).await.unwrap_or(0);
    let io = HeadWatch::new(stream);
    if !H2_PREFACE.starts_with(&head[..seen]) {
        let conn = serving
            .http1
            .serve_connection(TokioIo::new(io), svc)
            .with_upgrades();
        drive(conn, |c| c.graceful_shutdown(), stop).await?;
        return Ok(());
    }
    // HTTP/2, or part of its preface so far: hyper's header timeout does
    // not apply, so the idle watch does.
    let activity = Activity::default();
    let io = TokioIo::new(Active::new(io, activity.clone()));
    let svc = Counted::new(svc, activity.clone());
    if seen == H2_PREFACE.len() {
        let conn = serving.http2.serve_connection(io, svc);
        drive_watched(conn, |c| c.graceful_shutdown(), stop, &activity, serving).await?;
    } else {
        let conn = serving.auto.serve_connection_with_upgrades(io, svc);
        drive_watched(conn, |c| c.graceful_shutdown(), stop, &activity, serving).await?;
    }
    Ok(())
}
