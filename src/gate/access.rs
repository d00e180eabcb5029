//! What the access log says of a request beyond its method, path and
//! status: the room and outcome the phases reached ([`Mark`], carried out
//! of the phases in the response's extensions, only while the access log
//! is on) and a request id. The line itself goes through the daemon's
//! log writer, which never blocks a request (see `main.rs`).

use http::HeaderMap;

/// The room and outcome of one request.
#[derive(Clone, Debug)]
pub(crate) struct Mark {
    pub room: Option<String>,
    /// `admitted`, `queued`, `bypass`, `unmatched`, `fail_open`, … (`docs/operating.md`).
    pub outcome: &'static str,
}

/// Longest `X-Request-Id` taken from a trusted proxy.
const MAX_ID_LEN: usize = 64;

/// The request's id: a trusted proxy's `X-Request-Id` when it is short
/// visible ASCII, else a fresh random one.
pub(crate) fn request_id(headers: &HeaderMap, peer_trusted: bool) -> String {
    let given = peer_trusted
        .then(|| headers.get("x-request-id"))
        .flatten()
        .map(|v| v.as_bytes())
        .filter(|v| {
            !v.is_empty() && v.len() <= MAX_ID_LEN && v.iter().all(|b| b.is_ascii_graphic())
        });
    match given.and_then(|v| std::str::from_utf8(v).ok()) {
        Some(id) => id.to_owned(),
        None => format!("{:016x}", rand::random::<u64>()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_id_is_taken_only_from_a_trusted_proxy_and_only_when_sane() {
        let mut h = HeaderMap::new();
        h.insert("x-request-id", "abc-123".parse().unwrap());
        assert_eq!(request_id(&h, true), "abc-123");
        assert_ne!(request_id(&h, false), "abc-123");
        for bad in ["a b", "", &"x".repeat(65)] {
            h.insert("x-request-id", bad.parse().unwrap());
            let id = request_id(&h, true);
            assert_eq!(id.len(), 16, "{bad:?} gives {id}");
        }
    }
}
