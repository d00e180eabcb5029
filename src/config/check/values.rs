//! The checks of a value more than one section makes: an id (rooms,
//! events, regions), a path prefix (rooms, bypasses, the reserved prefix),
//! a limit (rooms, events) and a host name (rooms, TLS certificates).

use std::net::Ipv6Addr;

use crate::config::bounds::MAX_LIMIT;

pub(crate) fn check_id(id: &str) -> Result<(), &'static str> {
    let ok = (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err("must be 1 to 64 characters of a-z, 0-9, _ and -")
    }
}

/// A room or bypass path prefix, in the canonical form requests are matched in.
pub(super) fn check_path(path: &str) -> Result<String, String> {
    if !path.starts_with('/') {
        return Err("must start with /".into());
    }
    if path
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '?' || c == '#')
    {
        return Err("must be a plain path prefix without spaces, ? or #".into());
    }
    crate::canonical::path(path)
        .map(std::borrow::Cow::into_owned)
        .map_err(|why| format!("cannot be matched: {why}"))
}

/// A user or rate limit within what the stores count exactly.
pub(super) fn check_limit(value: u64) -> Result<(), String> {
    match value {
        0 => Err(r#"must be at least 1, got 0 (to stop admissions, set state = "paused")"#.into()),
        v if v > MAX_LIMIT => Err(format!("must be at most {MAX_LIMIT}, got {v}")),
        _ => Ok(()),
    }
}

/// Lower-cases a host name and refuses anything the Host header match cannot use.
pub(super) fn check_host(host: &str) -> Result<String, &'static str> {
    if host.is_empty() {
        return Err("must not be empty; leave host out to match any host");
    }
    if host.contains("://") {
        return Err(r#"must be a bare host name without a scheme, such as "shop.example.com""#);
    }
    if host.contains('/') {
        return Err("must not contain a path; put the path prefix in `path`");
    }
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return match inner.parse::<Ipv6Addr>() {
            // The spelling requests are matched in (`[::1]`, not `[0::1]`).
            Ok(addr) => Ok(format!("[{addr}]")),
            Err(_) => Err("is not a valid bracketed IPv6 address"),
        };
    }
    if host.contains(':') {
        return Err("must not contain a port; rooms match the Host header without its port");
    }
    // `shop.example.` is `shop.example`, as requests are matched.
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let labels_ok = host.len() <= 253
        && host.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if labels_ok {
        Ok(host)
    } else {
        Err("is not a valid host name (letters, digits, - and _ in dot-separated labels)")
    }
}
