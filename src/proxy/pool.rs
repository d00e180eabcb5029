//! One worker's keep-alive connections to the origin.
//!
//! Each worker thread owns a pool, so a request and the origin connection
//! it uses live on the same thread: no channel between a request task and a
//! connection task on another core, no cross-thread wake-up per request
//! (what made the generic pooled client cost ~25 µs per request here).
//!
//! A connection is an HTTP/1.1 `SendRequest` whose connection task runs on
//! the worker. It is taken out of the pool for one request and put back
//! when that request's response body has been read to its end; a response
//! dropped early closes its connection (HTTP/1 cannot abandon a response
//! half-way), as does an upgrade (the connection becomes the tunnel).
//!
//! A worker holds at most `origin.max_connections` connections, busy and
//! idle together; a request that finds them all busy waits for one to be
//! returned or closed (within the origin timeout), so no number of stalled
//! clients can open more.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use super::upload::{TooSlow, Upload};
use super::OriginError;

/// Idle connections kept per worker; beyond it a returned one is closed.
const MAX_IDLE: usize = 512;
/// An idle connection older than this is closed rather than reused (the
/// origin may have given up on it).
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a returned connection may take to become ready for its next
/// request (its task has to see the end of the last response first).
const READY_WITHIN: Duration = Duration::from_millis(50);
/// Most bytes of an origin response hyper reads ahead of the client (its
/// default is about 400 KiB): what a client that stops reading makes the
/// daemon hold per origin connection.
const MAX_READ_BUF: usize = 64 * 1024;

/// Where the origin is and how patient to be with it.
#[derive(Clone, Debug)]
pub struct Target {
    /// `host:port`, resolved when a connection is made.
    pub addr: String,
    pub connect_timeout: Duration,
    /// TLS for an `https://` origin.
    pub(crate) tls: Option<super::origin_tls::OriginTls>,
}

struct Idle {
    sender: SendRequest<Upload>,
    since: Instant,
}

/// The origin connections of one worker. Shared through an `Arc` only so
/// response bodies can carry their way home; every use is on the worker's
/// own thread, so the lock is never contended.
pub struct Pool {
    target: Target,
    idle: Mutex<Vec<Idle>>,
    /// One permit per connection open (held by its connection task).
    open: Arc<Semaphore>,
}

impl Pool {
    /// Connections to `target`, at most `max_open` at once.
    pub fn new(target: Target, max_open: usize) -> Arc<Self> {
        Arc::new(Self {
            target,
            idle: Mutex::new(Vec::new()),
            open: Arc::new(Semaphore::new(max_open.max(1))),
        })
    }

    /// Sends `req` on a pooled connection (or a new one) and returns the
    /// response, whose body puts the connection back when it ends. A
    /// request that a reused connection could not take (the origin had
    /// just closed it) is sent once more on a fresh connection.
    pub(crate) async fn send(
        self: &Arc<Self>,
        req: Request<Upload>,
        reusable: bool,
    ) -> Result<Response<Pooled>, OriginError> {
        let (mut sender, reused) = self.checkout().await?;
        let resp = match sender.try_send_request(req).await {
            Ok(resp) => resp,
            Err(mut e) => match e.take_message() {
                Some(req) if reused => {
                    sender = self.connect().await?;
                    sender
                        .send_request(req)
                        .await
                        .map_err(|e| unreachable_error(&e))?
                }
                _ => return Err(unreachable_error(e.error())),
            },
        };
        let home = reusable.then(|| (sender, self.clone()));
        Ok(resp.map(|body| Pooled { body, home }))
    }

    /// An idle connection that is ready, or a new one; and whether it was reused.
    async fn checkout(&self) -> Result<(SendRequest<Upload>, bool), OriginError> {
        if let Some(sender) = self.ready_idle().await {
            return Ok((sender, true));
        }
        Ok((self.connect().await?, false))
    }

    /// An idle connection that is ready for a request, if any; the stale
    /// ones met on the way are closed.
    async fn ready_idle(&self) -> Option<SendRequest<Upload>> {
        loop {
            let idle = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            let Idle { mut sender, since } = idle?;
            if sender.is_closed() || since.elapsed() > IDLE_TIMEOUT {
                continue;
            }
            if sender.is_ready() {
                return Some(sender);
            }
            if let Ok(Ok(())) = tokio::time::timeout(READY_WITHIN, sender.ready()).await {
                return Some(sender);
            }
        }
    }

    fn checkin(&self, sender: SendRequest<Upload>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE {
            idle.push(Idle {
                sender,
                since: Instant::now(),
            });
        }
    }

    /// A new connection, once the worker holds fewer than its most.
    async fn connect(&self) -> Result<SendRequest<Upload>, OriginError> {
        let permit = match self.open.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                tracing::debug!("every origin connection of this worker is busy; waiting for one");
                loop {
                    // A connection put back meanwhile serves as well as a new one.
                    tokio::select! {
                        permit = self.open.clone().acquire_owned() => match permit {
                            Ok(permit) => break permit,
                            Err(_) => return Err(OriginError::Unreachable("pool closed".into())),
                        },
                        () = tokio::time::sleep(READY_WITHIN) => {
                            if let Some(sender) = self.ready_idle().await {
                                return Ok(sender);
                            }
                        }
                    }
                }
            }
        };
        let t = &self.target;
        let stream =
            match tokio::time::timeout(t.connect_timeout, TcpStream::connect(&t.addr)).await {
                Err(_) => {
                    return Err(OriginError::Unreachable(format!(
                        "no connection within {:?}",
                        t.connect_timeout
                    )))
                }
                Ok(Err(e)) => return Err(OriginError::Unreachable(e.to_string())),
                Ok(Ok(s)) => s,
            };
        let _ = stream.set_nodelay(true);
        match &t.tls {
            None => handshake(stream, permit).await,
            Some(tls) => handshake(tls.connect(stream).await?, permit).await,
        }
    }

    /// Connections open now, busy or idle (for tests).
    pub fn open(&self, max_open: usize) -> usize {
        max_open - self.open.available_permits()
    }

    /// Idle connections now (for tests).
    pub fn idle(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// HTTP/1.1 over a connected `stream` (plain or TLS); its connection task
/// runs on the worker and holds the pool's `permit`.
async fn handshake<S>(
    stream: S,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Result<SendRequest<Upload>, OriginError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (sender, conn) = http1::Builder::new()
        .max_buf_size(MAX_READ_BUF)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable_error(&e))?;
    tokio::task::spawn_local(async move {
        let _permit = permit;
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "origin connection ended with an error");
        }
    });
    Ok(sender)
}

/// A failed exchange with the origin, blamed on the side that failed: the
/// visitor's own request body (a bad chunk, cut short) is "user" input to
/// the client connection, anything else is the origin's.
fn unreachable_error(e: &hyper::Error) -> OriginError {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<TooSlow>() {
            return OriginError::BodyTooSlow;
        }
        source = s.source();
    }
    if e.is_user() {
        OriginError::Downstream(super::error_chain(e))
    } else {
        OriginError::Unreachable(super::error_chain(e))
    }
}

/// An origin response body that returns its connection to the pool when
/// it has been read to the end.
pub(crate) struct Pooled {
    body: Incoming,
    home: Option<(SendRequest<Upload>, Arc<Pool>)>,
}

impl Pooled {
    /// The connection is never put back (the origin switched protocols).
    pub(crate) fn disown(&mut self) {
        self.home = None;
    }

    fn go_home(&mut self) {
        if let Some((sender, pool)) = self.home.take() {
            pool.checkin(sender);
        }
    }
}

impl HttpBody for Pooled {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.go_home(),
            Poll::Ready(Some(Ok(_))) if self.body.is_end_stream() => self.go_home(),
            Poll::Ready(Some(Err(_))) => self.home = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        // A body the server never had to read (empty, HEAD) is complete too.
        if self.body.is_end_stream() {
            self.go_home();
        }
    }
}
