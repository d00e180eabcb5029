//! Phase 1, and where a request goes: its connection ([`ConnInfo`]), its
//! one canonical form and client ([`Ctx`]), and whether it is for the
//! daemon itself (the reserved prefix) or one of decision mode's
//! endpoints. What it cannot make canonical it refuses ([`Unread`]), and
//! nothing else is read.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::header::HeaderValue;
use http::{HeaderMap, Method, Request};

use crate::canonical::{Canonical, Folding, Refusal};
use crate::clock::Millis;
use crate::config::{Config, Unmatched};
use crate::proxy::headers;
use crate::queue_page::Msg;

/// What the gate knows of a visitor's connection, worked out once when
/// the connection is accepted.
pub struct ConnInfo {
    /// The TCP peer.
    pub peer: SocketAddr,
    /// The peer's address as header text (`X-Forwarded-For`).
    pub peer_text: HeaderValue,
    /// The worker thread serving the connection (its origin pool is used).
    pub worker: usize,
    /// The connection came in on the TLS listener.
    pub tls: bool,
    /// The connection's place under the listener's caps: a WebSocket
    /// tunnel the connection turns into keeps it for its whole life.
    pub place: Option<Arc<dyn Send + Sync>>,
}

impl ConnInfo {
    /// A plain connection from `peer`, served by worker `worker`.
    pub fn new(peer: SocketAddr, worker: usize) -> Self {
        Self {
            peer,
            peer_text: headers::peer_text(peer.ip()),
            worker,
            tls: false,
            place: None,
        }
    }

    /// The same, holding `place` (see [`ConnInfo::place`]).
    pub fn holding(self, place: Arc<dyn Send + Sync>) -> Self {
        Self {
            place: Some(place),
            ..self
        }
    }

    /// The same, for a connection on the TLS listener.
    pub fn over_tls(self) -> Self {
        Self { tls: true, ..self }
    }
}

/// What one request carries through the phases.
pub struct Ctx<'c> {
    /// The connection.
    pub conn: &'c ConnInfo,
    /// The peer is a trusted proxy: its forwarding headers are believed.
    pub peer_trusted: bool,
    /// The visitor's address (the peer, or from a trusted proxy's
    /// `X-Forwarded-For`); what per-address limits and bypasses use.
    pub client: IpAddr,
    /// The client's network (`ticket::network_of`): tickets record it.
    pub net: u64,
    /// The request as matched and forwarded.
    pub canonical: Canonical,
    /// The one clock read of this request.
    pub now: Millis,
}

/// Why phase 1 refused a request (nothing else was read).
pub(super) enum Unread {
    /// CONNECT: a tunnel to an authority, which no origin of ours is.
    Connect,
    /// It has no canonical form.
    Malformed(Refusal),
}

impl std::fmt::Display for Unread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unread::Connect => f.write_str("CONNECT"),
            Unread::Malformed(why) => why.fmt(f),
        }
    }
}

/// The 400 page's sentence for a request that cannot be made canonical.
pub(super) fn refusal_text(why: Refusal) -> Msg {
    use Refusal::*;
    match why {
        MissingHost | DuplicateHost | BadHost | HostMismatch => Msg::BadHost,
        _ => Msg::BadAddress,
    }
}

/// How requests are read and told apart: the server's settings that
/// phase 1 and routing use.
pub(super) struct Intake {
    reserved_prefix: String,
    /// What a request no room matches gets.
    pub(super) unmatched: Unmatched,
    trusted_proxies: Vec<ipnet::IpNet>,
    /// Which foldable path spellings are refused (see `canonical::check_folding`).
    folding: Folding,
}

impl Intake {
    pub(super) fn new(config: &Config) -> Self {
        let s = &config.server;
        Self {
            reserved_prefix: s.reserved_prefix.clone(),
            unmatched: s.unmatched,
            trusted_proxies: s.trusted_proxies.clone(),
            folding: Folding {
                allow_colons: s.allow_path_colons,
                case_insensitive: config.rooms.iter().any(|r| r.case_insensitive_paths),
            },
        }
    }

    /// Phase 1 for `req`, read at `now`: its canonical form and its client.
    /// CONNECT is refused before anything is read.
    pub(super) fn context<'c, B>(
        &self,
        req: &Request<B>,
        conn: &'c ConnInfo,
        now: Millis,
    ) -> Result<Ctx<'c>, Unread> {
        if req.method() == Method::CONNECT {
            return Err(Unread::Connect);
        }
        let canonical = Canonical::of(req).map_err(Unread::Malformed)?;
        crate::canonical::check_folding(canonical.path(), self.folding)
            .map_err(Unread::Malformed)?;
        let peer = conn.peer.ip();
        let client = self.client(req.headers(), peer);
        Ok(Ctx {
            conn,
            peer_trusted: self.is_trusted(peer),
            client,
            net: crate::ticket::network_of(client),
            canonical,
            now,
        })
    }

    /// The visitor's address: `peer`, or what a trusted proxy says.
    pub(super) fn client(&self, headers: &HeaderMap, peer: IpAddr) -> IpAddr {
        headers::client_ip(headers, peer, &self.trusted_proxies)
    }

    /// Whether `peer` is one of `server.trusted_proxies`.
    pub(super) fn is_trusted(&self, peer: IpAddr) -> bool {
        headers::is_trusted(peer, &self.trusted_proxies)
    }

    /// The rest of the canonical path after the reserved prefix, for the
    /// daemon's own paths (borrowed: every queued visitor's poll is one).
    pub(super) fn own_path<'c>(&self, ctx: &'c Ctx<'_>) -> Option<&'c str> {
        ctx.canonical
            .path()
            .strip_prefix(self.reserved_prefix.as_str())
    }

    /// Whether `raw_path` (the request's own, not canonical) is one of the
    /// decision endpoints. Checked on the raw path: the original path that
    /// Envoy appends must not be folded into the endpoint's.
    pub(super) fn decision_path<'p>(&self, raw_path: &'p str) -> Option<&'p str> {
        let rest = raw_path.strip_prefix(self.reserved_prefix.as_str())?;
        (rest == "auth" || rest.starts_with("auth/")).then_some(rest)
    }

    /// The address of the status JSON of `room` (what pages poll).
    pub(super) fn status_url(&self, room: &str) -> String {
        format!("{}status?room={room}", self.reserved_prefix)
    }
}
