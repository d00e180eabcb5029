//! Connection hygiene for the listeners: who may open a connection, how
//! much one may hold, and how long it may stay silent or stalled.
//!
//! * Caps refuse at once: over `server.max_connections` in all, or over
//!   `server.max_connections_per_ip` from one address (its /64 for IPv6),
//!   a new connection is accepted and closed straight away, never left
//!   waiting in the backlog where it would hold real visitors up. A
//!   connection's place ([`Admission`]) is kept by a WebSocket tunnel it
//!   turns into, for the tunnel's whole life.
//! * The HTTP/2 connections of one address share a budget of streams
//!   (`server.max_streams_per_ip`, see `streams`).
//! * A connection that sends no complete request head within
//!   `header_read_timeout` is closed, the first byte included (hyper's own
//!   timer only starts with the first byte; before it, the HTTP version
//!   sniffing would wait forever).
//!   On the TLS listener the TLS handshake gets the same bound first.
//! * HTTP/2 has no such timer in hyper: an HTTP/2 connection (or one whose
//!   first bytes are part of the preface) is closed once it has had no
//!   request in flight for `header_read_timeout`, whatever control frames
//!   it sends, or once one of its responses has waited `send_timeout` for
//!   the client to take data ([`Activity`]).
//! * Every connection's writes have a send timeout ([`SendTimeout`]): a
//!   client that stops reading is cut off after `send_timeout`.
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

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Duration, Instant};

use crate::canonical::limit_key;

/// The next connection the caps admit, or `None` once `stop` changes. A
/// failed accept (usually: out of file descriptors) waits for some to free
/// up, backing off to a second; a connection over a cap is closed at once,
/// rather than left to wait, so the client learns at once.
pub(crate) async fn accept(
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

/// What one client address holds: its open connections, and the budget
/// of HTTP/2 streams they share.
struct PerAddress {
    open: usize,
    streams: Arc<Semaphore>,
}

/// Open connections by client address (its [`limit_key`]).
type OpenByAddress = Arc<Mutex<HashMap<IpAddr, PerAddress>>>;

/// The connection caps of one listener.
#[derive(Clone)]
pub(crate) struct Caps {
    total: Arc<Semaphore>,
    /// The most connections from one address, and who holds how many.
    per_ip: (usize, OpenByAddress),
    /// HTTP/2 streams the connections of one address may carry at once.
    streams_per_ip: usize,
}

/// A connection's place under the caps; dropping it frees the place. A
/// WebSocket tunnel keeps its connection's place (through an `Arc`) for
/// as long as it lives.
pub(crate) struct Admission {
    _total: OwnedSemaphorePermit,
    ip: IpAddr,
    map: OpenByAddress,
    /// The stream budget of the connection's address.
    streams: Arc<Semaphore>,
}

impl Admission {
    /// The HTTP/2 stream budget this connection shares with the others
    /// from its address.
    pub(crate) fn streams(&self) -> Arc<Semaphore> {
        self.streams.clone()
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = map.get_mut(&self.ip) {
            n.open -= 1;
            if n.open == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// Why a connection was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// `max_connections` are open.
    Total,
    /// `max_connections_per_ip` are open from this address.
    PerAddress,
}

impl Caps {
    /// `total` connections in all, `per_ip` from one address (its /64 for
    /// IPv6), whose HTTP/2 connections carry `streams_per_ip` streams
    /// together.
    pub(crate) fn new(total: usize, per_ip: usize, streams_per_ip: usize) -> Self {
        Self {
            total: Arc::new(Semaphore::new(total)),
            per_ip: (per_ip, Arc::new(Mutex::new(HashMap::new()))),
            streams_per_ip,
        }
    }

    /// A place for a connection from `ip`, or why there is none.
    pub(crate) fn admit(&self, ip: IpAddr) -> Result<Admission, Refused> {
        let total = self
            .total
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refused::Total)?;
        let ip = limit_key(ip);
        let (limit, map) = &self.per_ip;
        let mut open = map.lock().unwrap_or_else(PoisonError::into_inner);
        let n = open.entry(ip).or_insert_with(|| PerAddress {
            open: 0,
            streams: Arc::new(Semaphore::new(self.streams_per_ip)),
        });
        if n.open >= *limit {
            return Err(Refused::PerAddress);
        }
        n.open += 1;
        Ok(Admission {
            _total: total,
            ip,
            map: map.clone(),
            streams: n.streams.clone(),
        })
    }

    /// Closes the listener's semaphore so a stopped accept loop wakes.
    pub(crate) fn close(&self) {
        self.total.close();
    }
}

/// Waits up to `within` for the connection's first byte; false when none
/// came (or the peer closed first). hyper's header timer starts only with
/// the first byte, and before it the HTTP version sniffing would wait for
/// ever. (`readable()` may report a fresh socket ready with nothing in it;
/// `peek` waits for a byte.)
pub(crate) async fn first_byte(
    stream: &tokio::net::TcpStream,
    within: std::time::Duration,
) -> bool {
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
pub(crate) struct HeadWatch<T> {
    io: T,
    /// A `\n` was read since the last response started.
    line_ended: bool,
    /// A rewritten response being written: bytes, how many went out, and
    /// how many of the caller's bytes it stands for.
    rewrite: Option<(Vec<u8>, usize, usize)>,
}

impl<T> HeadWatch<T> {
    pub(crate) fn new(io: T) -> Self {
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

/// What an HTTP/2 connection is doing, for its watch (hyper has no
/// header or idle timeout for HTTP/2, nor a send timeout for a stream whose
/// window the client holds at 0):
///
/// * requests in flight, each until its response body is dropped, and
///   when the last one started or ended: a connection with none for
///   `header_read_timeout` is idle and closed, whatever control frames
///   (PING, SETTINGS, WINDOW_UPDATE) keep coming;
/// * for each response, since when it has waited for the client to take
///   data it holds (not for the origin to send more): one that waits for
///   `send_timeout` closes the connection, and with it everything its
///   streams hold at the origin.
#[derive(Clone)]
pub(crate) struct Activity {
    /// When the connection began; the times below count from it.
    start: Instant,
    /// The last request start or end, in ms after `start`.
    last_ms: Arc<AtomicU64>,
    in_flight: Arc<AtomicUsize>,
    /// One entry per response in flight: [`WAITS_ON_ORIGIN`], or 1 + the ms
    /// after `start` since which it has waited on the client. Entries of
    /// finished responses are dropped when the list is next read.
    waits: Arc<Mutex<Vec<Arc<AtomicU64>>>>,
}

/// A response that waits for the origin (or has not started) waits on nobody here.
const WAITS_ON_ORIGIN: u64 = 0;

/// A connection starting now.
impl Default for Activity {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
            in_flight: Arc::new(AtomicUsize::new(0)),
            waits: Arc::new(Mutex::new(Vec::new())),
        }
    }
}

impl Activity {
    fn ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn touch(&self) {
        self.last_ms.store(self.ms(), Ordering::Relaxed);
    }

    fn at(&self, ms: u64) -> Instant {
        self.start + Duration::from_millis(ms)
    }

    /// Since when the longest-waiting response has waited on the client.
    fn oldest_wait(&self) -> Option<Instant> {
        let mut waits = self.waits.lock().unwrap_or_else(PoisonError::into_inner);
        waits.retain(|w| Arc::strong_count(w) > 1);
        waits
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .filter(|&w| w != WAITS_ON_ORIGIN)
            .min()
            .map(|w| self.at(w - 1))
    }

    /// When to look at the connection next: when it will have been idle
    /// for `idle`, or when its longest-waiting response will have waited
    /// `send_timeout`; while requests are in flight, `idle` from now at
    /// the latest.
    pub(crate) fn due(&self, idle: Duration, send_timeout: Duration) -> Instant {
        if self.in_flight.load(Ordering::Relaxed) == 0 {
            return self.at(self.last_ms.load(Ordering::Relaxed)) + idle;
        }
        let next = Instant::now() + idle;
        match self.oldest_wait() {
            Some(since) => next.min(since + send_timeout),
            None => next,
        }
    }

    /// Whether the connection has had no request in flight, and none
    /// starting or ending, for `idle`.
    pub(crate) fn idle_for(&self, idle: Duration) -> bool {
        self.in_flight.load(Ordering::Relaxed) == 0
            && self.at(self.last_ms.load(Ordering::Relaxed)).elapsed() >= idle
    }

    /// Whether a response has waited on the client for `send_timeout`.
    pub(crate) fn stalled(&self, send_timeout: Duration) -> bool {
        self.oldest_wait()
            .is_some_and(|since| since.elapsed() >= send_timeout)
    }

    /// A request starts: it is in flight until the returned guard drops.
    pub(crate) fn request(&self) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.touch();
        let wait = Arc::new(AtomicU64::new(WAITS_ON_ORIGIN));
        self.waits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(wait.clone());
        InFlight {
            activity: self.clone(),
            wait,
        }
    }
}

/// One request in flight, for as long as it lives (its response body
/// holds it).
pub(crate) struct InFlight {
    activity: Activity,
    wait: Arc<AtomicU64>,
}

impl InFlight {
    /// The response has data for the client (its head, or a chunk handed
    /// to the connection) and waits for the client to take it.
    pub(crate) fn waits_on_client(&self) {
        self.wait.store(self.activity.ms() + 1, Ordering::Relaxed);
    }

    /// The response waits for the origin to send more.
    pub(crate) fn waits_on_origin(&self) {
        self.wait.store(WAITS_ON_ORIGIN, Ordering::Relaxed);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.activity.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.activity.touch();
    }
}

/// A connection's IO with a send timeout: a write (or flush) that the
/// client does not let through for `timeout` fails, which ends the
/// connection. A reader that never reads holds its origin connection and
/// buffers for that long at most.
pub(crate) struct SendTimeout<T> {
    io: T,
    timeout: Duration,
    /// Armed while a write waits; made at the first wait.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    armed: bool,
}

impl<T> SendTimeout<T> {
    pub(crate) fn new(io: T, timeout: Duration) -> Self {
        Self {
            io,
            timeout,
            timer: None,
            armed: false,
        }
    }

    /// `polled`, unless it has waited for `timeout`.
    fn watch<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if polled.is_ready() {
            self.armed = false;
            return polled;
        }
        let deadline = Instant::now() + self.timeout;
        let timer = match &mut self.timer {
            Some(timer) => {
                if !self.armed {
                    timer.as_mut().reset(deadline);
                }
                timer
            }
            None => self
                .timer
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        self.armed = true;
        if timer.as_mut().poll(cx).is_ready() {
            self.armed = false;
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took nothing for send_timeout",
            )));
        }
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for SendTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for SendTimeout<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_shutdown(cx);
        self.watch(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn caps_refuse_over_the_total_and_per_address() {
        let caps = Caps::new(3, 2, 10);
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
