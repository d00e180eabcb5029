//! The forwarding role: what an admitted (or bypassing, or unmatched)
//! request gets from the origin, through the proxy's pools; the tunnel a
//! WebSocket upgrade becomes, ended with its session; and the origin's
//! commands (`X-Waitroom-Command: close`, `revoke`) and stock
//! (`X-Waitroom-Stock`) carried out, and a session ended by the origin's
//! 2xx on one of the room's `end_session_paths`; for rooms with `[room.autotune]`,
//! how the origin answered counted (`autotune::OriginWindow`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{self, HeaderValue};
use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;

use super::operator::Operator;
use super::tickets::Tickets;
use super::{pages, Admitted, Ctx, Room};
use crate::body::Body;
use crate::clock::Millis;
use crate::config::Config;
use crate::domain::VisitorId;
use crate::proxy::{self, Outbound, Proxy};
use crate::respond::push_cookie;

/// The origin, and what comes back from it.
pub(super) struct Forwarding {
    /// `[origin]`'s connections.
    proxy: Proxy,
    /// The rooms with an origin of their own (`[room.origin]`), each with
    /// its own connections, by room id.
    room_proxies: std::collections::HashMap<String, Proxy>,
    /// Re-issues and expires admitted visitors' cookies.
    tickets: Arc<Tickets>,
    /// Carries out the origin's commands; checks tunnels' sessions in.
    operator: Operator,
    /// Pass WebSocket upgrades of requests no room matches.
    pub(super) unmatched_upgrades: bool,
    /// How long a tunnel may carry nothing.
    tunnel_idle_timeout: Duration,
}

impl Forwarding {
    pub(super) fn new(
        config: &Config,
        tickets: Arc<Tickets>,
        operator: Operator,
    ) -> Result<Self, proxy::OriginError> {
        let s = &config.server;
        let allowance = proxy::upload::Allowance {
            timeout: s.request_body_timeout,
            min_rate: s.request_body_min_rate,
        };
        let mut room_proxies = std::collections::HashMap::new();
        for room in &config.rooms {
            if let Some(origin) = &room.origin {
                let proxy = Proxy::new(origin, s.workers(), allowance)?;
                room_proxies.insert(room.id.clone(), proxy);
            }
        }
        Ok(Self {
            proxy: Proxy::new(&config.origin, s.workers(), allowance)?,
            room_proxies,
            tickets,
            operator,
            unmatched_upgrades: s.unmatched_upgrades,
            tunnel_idle_timeout: s.tunnel_idle_timeout,
        })
    }

    /// The origin signature naming `visitor` of room `room` (decision mode
    /// hands it to the proxy), when the origin asks for one.
    pub(super) fn signature(
        &self,
        visitor: &VisitorId,
        room: &str,
        now: Millis,
    ) -> Option<HeaderValue> {
        self.proxy_of(Some(room)).signature(visitor, room, now)
    }

    /// The connections of `room`'s origin: its own, else `[origin]`'s.
    fn proxy_of(&self, room: Option<&str>) -> &Proxy {
        room.and_then(|id| self.room_proxies.get(id))
            .unwrap_or(&self.proxy)
    }

    /// Forwards to the origin; for an admitted visitor names it to the
    /// origin, re-issues its cookie and carries out the origin's
    /// `X-Waitroom-Command` (`close` on any request of the room). A
    /// WebSocket upgrade passes for an admitted visitor (the tunnel ends
    /// with the session) and, when `upgrades` says so, for the others.
    pub(super) async fn forward(
        &self,
        req: Request<Incoming>,
        ctx: &Ctx<'_>,
        room: Option<&Arc<Room>>,
        admitted: Option<Admitted>,
        upgrades: bool,
    ) -> Response<Body> {
        // Only a request that asks for a WebSocket gets what a tunnel needs
        // (its session's watch is a registration per tunnel).
        let websocket = proxy::tunnel::asks_websocket(req.headers());
        let tunnel = match (&admitted, room) {
            _ if !websocket => None,
            (Some(a), Some(room)) => Some(Box::new(proxy::tunnel::Tunnel {
                place: ctx.conn.place.clone(),
                ended: Some(self.session_end(room, a.visitor, a.session_expires_ms)),
                idle_timeout: self.tunnel_idle_timeout,
            })),
            _ => upgrades.then(|| {
                Box::new(proxy::tunnel::Tunnel {
                    place: ctx.conn.place.clone(),
                    ended: None,
                    idle_timeout: self.tunnel_idle_timeout,
                })
            }),
        };
        let out = Outbound {
            peer_text: &ctx.conn.peer_text,
            peer_trusted: ctx.peer_trusted,
            canonical: &ctx.canonical,
            visitor: admitted.as_ref().map(|a| a.visitor),
            room: room.map(|r| r.config.id.as_str()),
            now_ms: ctx.now,
            worker: ctx.conn.worker,
            tls: ctx.conn.tls,
            tunnel,
        };
        // Kept (not parsed) for the page should the origin fail.
        let accept_language = req.headers().get(header::ACCEPT_LANGUAGE).cloned();
        let started = Instant::now();
        let proxy = self.proxy_of(room.map(|r| r.config.id.as_str()));
        let forwarded = proxy.forward(req, out).await;
        let took = started.elapsed();
        self.operator
            .telemetry
            .metrics
            .origin_latency(took.as_secs_f64());
        if let Some((room, autotune)) = room.and_then(|r| Some((r, r.config.autotune.as_ref()?))) {
            let failed = match &forwarded {
                Ok((resp, _)) => resp.status().is_server_error(),
                Err(_) => true,
            };
            room.origin_health.record(took, failed, autotune);
        }
        let (mut resp, from_origin) = match forwarded {
            Ok(forwarded) => forwarded,
            Err(e) => {
                tracing::warn!(error = %e, "origin request failed");
                return pages::origin_error(&e, room.map(|r| &**r), accept_language.as_ref());
            }
        };
        let Some(room) = room else {
            return resp;
        };
        let command = from_origin.command.as_ref().map(|c| c.as_bytes());
        if command.is_some_and(|c| c.eq_ignore_ascii_case(b"close")) {
            self.operator.sold_out(room).await;
        }
        if let Some(value) = &from_origin.stock {
            match stock(value) {
                Some(n) => self.operator.restock(room, n).await,
                None => tracing::debug!(
                    room = %room.config.id,
                    value = ?value,
                    "the origin's X-Waitroom-Stock is not a number from 0 to {}; ignored",
                    crate::domain::MAX_STOCK
                ),
            }
        }
        let Some(admitted) = admitted else {
            return resp;
        };
        let revoked = command.is_some_and(|c| c.eq_ignore_ascii_case(b"revoke"));
        // On an `end_session_paths` request only a success ends the
        // session: a refused payment, a redirect to an error page or a 5xx
        // keeps it, so the visitor can try again.
        let completed = admitted.ends_session && resp.status().is_success();
        if revoked || completed {
            let why = if revoked {
                "the origin's revoke"
            } else {
                "end_session_paths"
            };
            self.end_session(room, &admitted, why, ctx.now, resp.headers_mut())
                .await;
        } else if let Some(ticket) = admitted.ticket {
            push_cookie(
                resp.headers_mut(),
                self.tickets.set_cookie(room, &ticket, ctx.now),
            );
        }
        resp
    }

    /// Ends `admitted`'s session (`why`: the origin's `revoke`, or a
    /// request on one of the room's `end_session_paths`) as
    /// `Operator::end_session` does, counted as `revoked`, and expires its
    /// cookie in `headers`. Decision mode ends an `end_session_paths`
    /// session here too.
    pub(super) async fn end_session(
        &self,
        room: &Room,
        admitted: &Admitted,
        why: &'static str,
        now: Millis,
        headers: &mut HeaderMap,
    ) {
        tracing::debug!(
            room = %room.config.id,
            visitor = %admitted.visitor.to_hex(),
            why,
            "session ended"
        );
        let ended =
            self.operator
                .end_session(room, admitted.visitor, admitted.session_expires_ms, now);
        if let Err(e) = ended.await {
            tracing::warn!(room = %room.config.id, error = %e, why, "session end not recorded")
        }
        push_cookie(headers, self.tickets.expired_cookie(room));
    }

    /// What ends a tunnel opened by `visitor`'s session: the session ended
    /// here, or refused at a check-in (ended elsewhere, or expired). The
    /// tunnel checks in like a request would, once per check-in interval
    /// of the policy in force, so an open WebSocket keeps its session.
    fn session_end(
        &self,
        room: &Arc<Room>,
        visitor: VisitorId,
        expires: Millis,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        let (room, store) = (room.clone(), self.operator.store.clone());
        let clock = self.operator.clock.clone();
        let mut watch = room.tunnels.watch(visitor);
        Box::pin(async move {
            let mut expires = expires;
            loop {
                let every = Duration::from_millis(room.policy().check_in_interval_ms());
                tokio::select! {
                    () = watch.ended() => return,
                    () = tokio::time::sleep(every) => {}
                }
                match store
                    .check_in(&room, visitor, expires, clock.now_ms())
                    .await
                {
                    Ok(Some(renewed)) => expires = renewed,
                    Ok(None) => return,
                    // Unknown for now: asked again at the next interval.
                    Err(_) => {}
                }
            }
        })
    }
}

/// The items left an `X-Waitroom-Stock` value says: ASCII digits only,
/// at most [`MAX_STOCK`](crate::domain::MAX_STOCK).
fn stock(value: &HeaderValue) -> Option<u64> {
    let text = value.to_str().ok()?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u64>()
        .ok()
        .filter(|n| *n <= crate::domain::MAX_STOCK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stock_takes_plain_numbers_in_range() {
        let v = |s: &str| stock(&HeaderValue::from_str(s).expect("a header value"));
        assert_eq!(v("3"), Some(3));
        assert_eq!(v(" 0 "), Some(0));
        assert_eq!(v("1000000000"), Some(1_000_000_000));
        for bad in [
            "",
            "-1",
            "+3",
            "3.0",
            "1e3",
            "three",
            "1000000001",
            "99999999999999999999999",
        ] {
            assert_eq!(v(bad), None, "{bad:?}");
        }
    }
}
