//! WebSocket tunnels: once the origin answers an upgrade with `101`, the
//! client's and the origin's connections are joined and bytes pass both
//! ways unread. What a tunnel may be, and how long it lives, is decided
//! here:
//!
//! * only `Upgrade: websocket` is passed (never `h2c`, whose tunnel would
//!   carry requests for any path past the gate; `HTTP2-Settings` is always
//!   dropped); the gate says whether this request may upgrade at all
//!   ([`Tunnel`]);
//! * a tunnel holds its client connection's place under the connection
//!   caps for its whole life;
//! * a tunnel that carries nothing either way for `tunnel_idle_timeout`
//!   is closed, and so is one whose `ended` future resolves (the gate's:
//!   the session that opened it was revoked or released).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{self, HeaderMap};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// What the gate allows a request that asks to upgrade.
pub struct Tunnel {
    /// The client connection's place under the caps (see
    /// `gate::ConnInfo::place`), kept while the tunnel lives.
    pub place: Option<Arc<dyn Send + Sync>>,
    /// Resolves when the tunnel must close (its session ended).
    pub ended: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// Closed after carrying nothing either way for this long.
    pub idle_timeout: Duration,
}

/// Whether `headers` ask for a WebSocket upgrade and nothing else:
/// `Upgrade` names only `websocket` (one line), and `Connection` names
/// `upgrade`.
pub(crate) fn asks_websocket(headers: &HeaderMap) -> bool {
    if !headers.contains_key(header::UPGRADE) {
        return false;
    }
    let mut upgrades = headers.get_all(header::UPGRADE).iter();
    let (Some(upgrade), None) = (upgrades.next(), upgrades.next()) else {
        return false;
    };
    let only_websocket = upgrade.to_str().is_ok_and(|v| {
        v.split(',')
            .all(|token| token.trim().eq_ignore_ascii_case("websocket"))
    });
    let connection_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    only_websocket && connection_upgrade
}

/// Joins the client's and the origin's upgraded connections, on the
/// current thread's runtime, until either side closes, the tunnel goes
/// idle or its session ends.
pub(crate) fn spawn(client: OnUpgrade, origin: OnUpgrade, tunnel: Tunnel) {
    tokio::spawn(async move {
        let Tunnel {
            place,
            ended,
            idle_timeout,
        } = tunnel;
        let _place = place;
        let (Ok(client), Ok(origin)) = tokio::join!(client, origin) else {
            tracing::debug!("upgrade handshake abandoned");
            return;
        };
        let last = Traffic::default();
        let mut client = Watched::new(TokioIo::new(client), &last);
        let mut origin = Watched::new(TokioIo::new(origin), &last);
        let ended = async move {
            match ended {
                Some(ended) => ended.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            copied = tokio::io::copy_bidirectional(&mut client, &mut origin) => {
                if let Err(e) = copied {
                    tracing::debug!(error = %e, "tunnel closed");
                }
            }
            () = last.idle_for(idle_timeout) => tracing::debug!("tunnel closed: idle"),
            () = ended => tracing::debug!("tunnel closed: its session ended"),
        }
    });
}

/// When a tunnel last carried bytes either way.
#[derive(Clone)]
struct Traffic {
    start: Instant,
    /// ms after `start`.
    last_ms: Arc<AtomicU64>,
}

impl Default for Traffic {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl Traffic {
    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    /// Resolves once nothing has passed for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let due = self.last() + idle;
            tokio::time::sleep_until(due).await;
            if self.last() + idle <= Instant::now() {
                return;
            }
        }
    }
}

/// One side of a tunnel, noting its traffic.
struct Watched<T> {
    io: T,
    traffic: Traffic,
}

impl<T> Watched<T> {
    fn new(io: T, traffic: &Traffic) -> Self {
        Self {
            io,
            traffic: traffic.clone(),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.traffic.touch();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.traffic.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn only_websocket_upgrades_are_asked() {
        for (pairs, want) in [
            (
                &[("upgrade", "websocket"), ("connection", "Upgrade")][..],
                true,
            ),
            (
                &[
                    ("upgrade", "WebSocket"),
                    ("connection", "keep-alive, upgrade"),
                ],
                true,
            ),
            (
                &[
                    ("upgrade", "h2c"),
                    ("connection", "Upgrade, HTTP2-Settings"),
                ],
                false,
            ),
            (
                &[("upgrade", "websocket, h2c"), ("connection", "upgrade")],
                false,
            ),
            (
                &[("upgrade", "h2c, websocket"), ("connection", "upgrade")],
                false,
            ),
            (
                &[
                    ("upgrade", "websocket"),
                    ("upgrade", "h2c"),
                    ("connection", "upgrade"),
                ],
                false,
            ),
            (&[("upgrade", "websocket")], false),
            (&[("upgrade", "TLS/1.2"), ("connection", "upgrade")], false),
            (&[("upgrade", ""), ("connection", "upgrade")], false),
            (&[("connection", "upgrade")], false),
        ] {
            assert_eq!(asks_websocket(&headers(pairs)), want, "{pairs:?}");
        }
    }
}
