//! Connection hygiene for the listeners: who may open a connection, and how
//! long a connection may stay silent.
//!
//! * Caps refuse at once: over `server.max_connections` in all, or over
//!   `server.max_connections_per_ip` from one address, a new connection is
//!   accepted and closed straight away, never left waiting in the backlog
//!   where it would hold real visitors up.
//! * A connection that sends no complete request head within
//!   `header_read_timeout` is closed, the first byte included (hyper's own
//!   timer only starts with the first byte; before it, the HTTP version
//!   sniffing would wait forever).
//!   On the TLS listener the TLS handshake gets the same bound first.
//! * HTTP/2 has no such timer in hyper: an HTTP/2 connection (or one whose
//!   first bytes are part of the preface) is closed once it has had no
//!   request in flight and no traffic for `header_read_timeout`
//!   ([`Activity`]).
//! * An overlong request line is answered 414, not 431: [`HeadWatch`] tells
//!   hyper's "head too large" apart when no line end was read yet.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Duration, Instant};

use crate::body::Body;

/// The next connection the caps admit, or `None` once `stop` changes. A
/// failed accept (usually: out of file descriptors) waits for some to free
/// up, backing off to a second; a connection over a cap is closed at once,
/// rather than left to wait, so the client learns at once.
pub async fn accept(
    listener: &TcpListener,
    caps: &Caps,
    stop: &mut watch::Receiver<bool>,
) -> Option<(TcpStream, SocketAddr, Admission)> {
    let mut backoff = std::time::Duration::from_millis(5);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(std::time::Duration::from_secs(1));
                    continue;
                }
            },
            _ = stop.changed() => return None,
        };
        match caps.admit(peer.ip()) {
            Ok(admission) => return Some((stream, peer, admission)),
            Err(why) => {
                tracing::debug!(%peer, ?why, "connection refused at the cap");
                drop(stream);
            }
        }
    }
}

/// Open connections by client address.
type OpenByAddress = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// The connection caps of one listener.
#[derive(Clone)]
pub struct Caps {
    total: Arc<Semaphore>,
    /// Open connections by client address; `None` for listeners where every
    /// peer is the same (the admin listener on loopback).
    per_ip: Option<(usize, OpenByAddress)>,
}

/// A connection's place under the caps; dropping it frees the place.
pub struct Admission {
    _total: OwnedSemaphorePermit,
    per_ip: Option<(IpAddr, OpenByAddress)>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let Some((ip, map)) = &self.per_ip {
            let mut map = map.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(n) = map.get_mut(ip) {
                *n -= 1;
                if *n == 0 {
                    map.remove(ip);
                }
            }
        }
    }
}

/// Why a connection was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// `max_connections` are open.
    Total,
    /// `max_connections_per_ip` are open from this address.
    PerAddress,
}

impl Caps {
    pub fn new(total: usize, per_ip: Option<usize>) -> Self {
        Self {
            total: Arc::new(Semaphore::new(total)),
            per_ip: per_ip.map(|n| (n, Arc::new(Mutex::new(HashMap::new())))),
        }
    }

    /// A place for a connection from `ip`, or why there is none.
    pub fn admit(&self, ip: IpAddr) -> Result<Admission, Refused> {
        let total = self
            .total
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refused::Total)?;
        let per_ip = match &self.per_ip {
            None => None,
            Some((limit, map)) => {
                let mut open = map.lock().unwrap_or_else(PoisonError::into_inner);
                let n = open.entry(ip).or_insert(0);
                if *n >= *limit {
                    if *n == 0 {
                        open.remove(&ip);
                    }
                    return Err(Refused::PerAddress);
                }
                *n += 1;
                Some((ip, map.clone()))
            }
        };
        Ok(Admission {
            _total: total,
            per_ip,
        })
    }

    /// Closes the listener's semaphore so a stopped accept loop wakes.
    pub fn close(&self) {
        self.total.close();
    }
}

/// Waits up to `within` for the connection's first byte; false when none
/// came (or the peer closed first). hyper's header timer starts only with
/// the first byte, and before it the HTTP version sniffing would wait for
/// ever. (`readable()` may report a fresh socket ready with nothing in it;
/// `peek` waits for a byte.)
pub async fn first_byte(stream: &tokio::net::TcpStream, within: std::time::Duration) -> bool {
    let mut first = [0u8; 1];
    matches!(
        tokio::time::timeout(within, stream.peek(&mut first)).await,
        Ok(Ok(1..))
    )
}

/// hyper's answer to a head that outgrew the read buffer.
const TOO_LARGE: &[u8] = b"HTTP/1.1 431 ";
/// Ours when the head was one unterminated line.
const URI_TOO_LONG: &[u8] = b"HTTP/1.1 414 URI Too Long";

/// A client connection's IO, watched for one thing: whether a line end has
/// been read since the last response began. When hyper refuses a head as
/// too large and none was, the head was a single overlong request line,
/// and the status line is rewritten to 414.
pub struct HeadWatch<T> {
    io: T,
    /// A `\n` was read since the last response started.
    line_ended: bool,
    /// A rewritten response being written: bytes, how many went out, and
    /// how many of the caller's bytes it stands for.
    rewrite: Option<(Vec<u8>, usize, usize)>,
}

impl<T> HeadWatch<T> {
    pub fn new(io: T) -> Self {
        Self {
            io,
            line_ended: false,
            rewrite: None,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for HeadWatch<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if !self.line_ended && memchr::memchr(b'\n', &buf.filled()[before..]).is_some() {
            self.line_ended = true;
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> HeadWatch<T> {
    /// Starts a rewrite of `first` (the response's first bytes) if it is
    /// hyper's 431 for a head that never ended a line.
    fn start_rewrite(&mut self, first: &[u8], all: impl FnOnce() -> Vec<u8>) {
        if first.starts_with(b"HTTP/1.") {
            let overlong_line = !self.line_ended && first.starts_with(TOO_LARGE);
            self.line_ended = false;
            if overlong_line {
                let original = all();
                let line_end = original
                    .windows(2)
                    .position(|w| w == b"\r\n")
                    .unwrap_or(original.len());
                let mut bytes = URI_TOO_LONG.to_vec();
                bytes.extend_from_slice(&original[line_end..]);
                self.rewrite = Some((bytes, 0, original.len()));
            }
        }
    }

    /// Writes out a pending rewrite; `Ready(n)` once all of it is out.
    fn poll_rewrite(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        while let Some((bytes, written, stands_for)) = &mut self.rewrite {
            if *written == bytes.len() {
                let n = *stands_for;
                self.rewrite = None;
                return Poll::Ready(Ok(n));
            }
            match Pin::new(&mut self.io).poll_write(cx, &bytes[*written..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => *written += n,
                other => return other,
            }
        }
        Poll::Ready(Ok(0))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for HeadWatch<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.rewrite.is_none() {
            this.start_rewrite(buf, || buf.to_vec());
        }
        if this.rewrite.is_some() {
            return this.poll_rewrite(cx);
        }
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.rewrite.is_none() {
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &b[..]);
            this.start_rewrite(first, || {
                bufs.iter().flat_map(|b| b.iter().copied()).collect()
            });
        }
        if this.rewrite.is_some() {
            return this.poll_rewrite(cx);
        }
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// What an HTTP/2 connection is doing, for its idle watch: hyper has no
/// header or idle timeout for HTTP/2, so a connection that sent only (part
/// of) its preface, or nothing after its last request, would stay open.
/// [`Active`] notes every read and write, [`Counted`] the requests in
/// flight; the worker closes the connection once it has had neither
/// traffic nor a request in flight for `header_read_timeout`.
#[derive(Clone)]
pub struct Activity {
    /// When the connection began; `last_ms` counts from it.
    start: Instant,
    /// The last traffic, in ms after `start`.
    last_ms: Arc<AtomicU64>,
    in_flight: Arc<AtomicUsize>,
}

/// A connection starting now.
impl Default for Activity {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
            in_flight: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl Activity {
    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    /// When the connection is due to be closed if nothing happens until
    /// then: `idle` after its last traffic, or, while a request is in
    /// flight, `idle` from now (to look again).
    pub fn due(&self, idle: Duration) -> Instant {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            Instant::now() + idle
        } else {
            self.last() + idle
        }
    }

    /// Whether the connection has been idle for `idle`: no request in
    /// flight, and no bytes in or out.
    pub fn idle_for(&self, idle: Duration) -> bool {
        self.in_flight.load(Ordering::Relaxed) == 0 && self.last().elapsed() >= idle
    }
}

/// An IO that notes its reads and writes in an [`Activity`].
pub struct Active<T> {
    io: T,
    activity: Activity,
}

impl<T> Active<T> {
    pub fn new(io: T, activity: Activity) -> Self {
        Self { io, activity }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Active<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Active<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A service that counts its requests in flight in an [`Activity`], each
/// until its response body is done (a quiet stream, such as server-sent
/// events, is a request in flight, not an idle connection).
pub struct Counted<S> {
    inner: S,
    activity: Activity,
}

impl<S> Counted<S> {
    pub fn new(inner: S, activity: Activity) -> Self {
        Self { inner, activity }
    }
}

/// One request in flight, for as long as it lives.
struct InFlight(Activity);

impl InFlight {
    fn new(activity: &Activity) -> Self {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

impl<S, R> hyper::service::Service<R> for Counted<S>
where
    S: hyper::service::Service<R, Response = http::Response<Body>>,
    S::Future: 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>>>>;

    fn call(&self, req: R) -> Self::Future {
        let in_flight = InFlight::new(&self.activity);
        let response = self.inner.call(req);
        Box::pin(async move {
            let response = response.await?;
            // The body keeps the request in flight until it is dropped.
            Ok(response.map(|body| {
                body.map_frame(move |frame| {
                    let _ = &in_flight;
                    frame
                })
                .boxed()
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn caps_refuse_over_the_total_and_per_address() {
        let caps = Caps::new(3, Some(2));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = caps.admit(a).unwrap();
        let _a2 = caps.admit(a).unwrap();
        assert_eq!(caps.admit(a).err(), Some(Refused::PerAddress));
        let _b1 = caps.admit(b).unwrap();
        assert_eq!(caps.admit(b).err(), Some(Refused::Total));
        drop(a1);
        let _b2 = caps.admit(b).unwrap();
        assert_eq!(caps.admit(b).err(), Some(Refused::Total));
    }

    async fn exchange(request: &[u8], response: &[u8]) -> Vec<u8> {
        let (client, server) = tokio::io::duplex(1 << 20);
        let mut watched = HeadWatch::new(server);
        let (mut client_r, mut client_w) = tokio::io::split(client);
        client_w.write_all(request).await.unwrap();
        let mut buf = vec![0u8; request.len()];
        watched.read_exact(&mut buf).await.unwrap();
        watched.write_all(response).await.unwrap();
        drop(watched);
        let mut out = Vec::new();
        client_r.read_to_end(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn a_refused_head_without_a_line_end_is_a_long_uri() {
        let refusal = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n";
        let long_line = format!("GET /{} HTTP/1.1", "a".repeat(1000));
        let out = exchange(long_line.as_bytes(), refusal).await;
        assert!(
            out.starts_with(b"HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\n"),
            "{}",
            String::from_utf8_lossy(&out)
        );

        let big_header = format!("GET / HTTP/1.1\r\nCookie: {}", "a".repeat(1000));
        let out = exchange(big_header.as_bytes(), refusal).await;
        assert_eq!(out, refusal, "a long header line stays 431");

        let fine = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(exchange(b"GET", fine).await, fine);
    }
}
