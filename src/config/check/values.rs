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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_1_to_64_of_a_z_digits_underscore_and_hyphen() {
        assert_eq!(check_id("shop_2-b"), Ok(()));
        assert_eq!(check_id(&"a".repeat(64)), Ok(()));
        for id in ["", "Shop", "shop 2", "shop.b", "café", &"a".repeat(65)] {
            assert_eq!(
                check_id(id),
                Err("must be 1 to 64 characters of a-z, 0-9, _ and -"),
                "{id:?}"
            );
        }
    }

    #[test]
    fn a_path_prefix_is_taken_in_its_canonical_form() {
        assert_eq!(check_path("/shop/").as_deref(), Ok("/shop/"));
        assert_eq!(check_path("//%73hop/./x").as_deref(), Ok("/shop/x"));
        let plain = "must be a plain path prefix without spaces, ? or #";
        for (path, why) in [
            ("shop", "must start with /"),
            ("", "must start with /"),
            ("/a b", plain),
            ("/a\tb", plain),
            ("/a?b", plain),
            ("/a#b", plain),
            ("/a%2Fb", "cannot be matched: the path holds an encoded separator (%2F or %5C) or a backslash"),
            ("/a/../..", "cannot be matched: the path climbs above the root"),
        ] {
            assert_eq!(check_path(path), Err(why.to_owned()), "{path:?}");
        }
    }

    #[test]
    fn a_limit_is_at_least_1_and_at_most_max_limit() {
        assert_eq!(check_limit(1), Ok(()));
        assert_eq!(check_limit(MAX_LIMIT), Ok(()));
        assert_eq!(
            check_limit(0).unwrap_err(),
            r#"must be at least 1, got 0 (to stop admissions, set state = "paused")"#
        );
        assert_eq!(
            check_limit(MAX_LIMIT + 1).unwrap_err(),
            "must be at most 1000000000, got 1000000001"
        );
    }

    #[test]
    fn a_host_is_lower_case_without_port_or_trailing_dot() {
        for (host, canonical) in [
            ("Shop.Example.", "shop.example"),
            ("localhost", "localhost"),
            ("[0::1]", "[::1]"),
            ("a_b-c.example", "a_b-c.example"),
        ] {
            assert_eq!(check_host(host).as_deref(), Ok(canonical), "{host:?}");
        }
        let invalid = "is not a valid host name (letters, digits, - and _ in dot-separated labels)";
        let long_label = format!("{}.example", "a".repeat(64));
        let long_name = vec!["a".repeat(63); 4].join(".") + ".ab";
        for (host, why) in [
            ("", "must not be empty; leave host out to match any host"),
            (
                "https://shop.example",
                r#"must be a bare host name without a scheme, such as "shop.example.com""#,
            ),
            (
                "shop.example/x",
                "must not contain a path; put the path prefix in `path`",
            ),
            ("[shop]", "is not a valid bracketed IPv6 address"),
            (
                "::1",
                "must not contain a port; rooms match the Host header without its port",
            ),
            (
                "shop.example:80",
                "must not contain a port; rooms match the Host header without its port",
            ),
            ("shop..example", invalid),
            ("shop example", invalid),
            (&long_label, invalid),
            (&long_name, invalid),
        ] {
            assert_eq!(check_host(host), Err(why), "{host:?}");
        }
    }
}
