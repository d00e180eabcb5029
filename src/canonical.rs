//! The canonical request: one spelling of the path, the host and the client
//! address, computed once before any room, bypass rule or reserved path is
//! consulted, and forwarded to the origin exactly as matched
//! (docs/how-it-works.md, "Canonical matching").
//!
//! A bot that tries `//shop`, `/%73hop`, `/x/../shop` or `Host: SHOP.example.`
//! meets the same room as a browser asking for `/shop` on `shop.example`,
//! and the origin receives the spelling the gate decided on. What cannot be
//! made canonical safely (an encoded `/`, a path that climbs above the root,
//! two Host headers) is refused with 400 before any room is matched.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv6Addr};

use http::header::{self, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Version};

/// Why a request cannot be made canonical; every case is a 400.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("the request target is not a path")]
    NotAPath,
    #[error("the path has a malformed percent escape")]
    BadEscape,
    #[error("the path holds an encoded separator (%2F or %5C) or a backslash")]
    EncodedSeparator,
    #[error("the path holds a control character")]
    ControlCharacter,
    #[error("the path holds a byte that never occurs in UTF-8")]
    NotUtf8,
    #[error("the path climbs above the root")]
    AboveRoot,
    #[error("the path holds a dot segment with parameters")]
    DotSegmentWithParameters,
    #[error("the request has no Host")]
    MissingHost,
    #[error("the request has more than one Host")]
    DuplicateHost,
    #[error("the Host is not a valid host name")]
    BadHost,
    #[error("the absolute request target and Host disagree")]
    HostMismatch,
    #[error("the path holds an escaped escape (%25 and two hex digits)")]
    DoubleEncoded,
    #[error("the path holds a colon")]
    Colon,
    #[error("the path holds a character some origins fold into another")]
    Foldable,
    #[error("the path holds a Windows short name (~ and a digit)")]
    ShortName,
}

/// The request as the gate matches it and the origin receives it. Built
/// without copying when the request already is canonical (the common
/// case): the path and query and the Host value are then the request's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Canonical {
    /// The canonical path with the query as sent, as the origin receives it.
    pub target: PathAndQuery,
    /// What the origin receives as `Host` (and `X-Forwarded-Host`): the
    /// canonical host and the port the visitor used, if any.
    pub host_header: HeaderValue,
    /// Length of the host name at the start of `host_header`.
    host_len: usize,
}

impl Canonical {
    /// Makes `req` canonical, or says why it cannot be.
    pub(crate) fn of<B>(req: &Request<B>) -> Result<Self, Refusal> {
        let (host_header, host_len) = request_host(req)?;
        let uri = req.uri();
        let raw_path = uri.path();
        if raw_path.is_empty() || !raw_path.starts_with('/') {
            return Err(Refusal::NotAPath);
        }
        let target = match (path(raw_path)?, uri.path_and_query()) {
            (Cow::Borrowed(_), Some(pq)) => pq.clone(),
            (canonical, _) => {
                let text = match uri.query() {
                    Some(q) => format!("{canonical}?{q}"),
                    None => canonical.into_owned(),
                };
                PathAndQuery::try_from(text).map_err(|_| Refusal::NotAPath)?
            }
        };
        Ok(Self {
            target,
            host_header,
            host_len,
        })
    }

    /// Lower case, without port or trailing dot; what rooms match.
    pub fn host(&self) -> &str {
        // Built from text that was checked to be ASCII.
        std::str::from_utf8(&self.host_header.as_bytes()[..self.host_len]).unwrap_or("")
    }

    /// The canonical path: see the function `path`.
    pub fn path(&self) -> &str {
        self.target.path()
    }

    /// The query string as sent (without `?`), if any.
    pub fn query(&self) -> Option<&str> {
        self.target.query()
    }

    /// The path rooms and bypass rules match: [`match_key`] of the path.
    pub fn match_key(&self) -> Cow<'_, str> {
        match_key(self.path())
    }

    /// The target without the daemon's own query parameters
    /// ([`OWN_PARAMS`]), every other byte as sent; `None` when it has none.
    pub fn without_own_params(&self) -> Option<PathAndQuery> {
        let kept = without_params(self.query()?, &OWN_PARAMS)?;
        let text = if kept.is_empty() {
            self.path().to_owned()
        } else {
            format!("{}?{kept}", self.path())
        };
        PathAndQuery::try_from(text).ok()
    }
}

/// The query parameters the daemon reads and the origin never receives:
/// an enqueue token and a lane code (the gate reads them as
/// `gate::members::TOKEN_PARAM` and `gate::lanes::CODE_PARAM`).
pub const OWN_PARAMS: [&str; 2] = ["waitroom_token", "waitroom_code"];

/// `query` without the `&`-separated pairs whose name, decoded as the gate
/// decodes it when it reads them (`form_urlencoded`), is one of `names`:
/// every other byte kept as written. `None` when no pair is one of them.
pub fn without_params(query: &str, names: &[&str]) -> Option<String> {
    // Every forwarded request with a query comes here: a name can only be
    // spelled with an escape, or as written.
    if !query.contains('%') && !names.iter().any(|n| query.contains(n)) {
        return None;
    }
    let named = |pair: &str| {
        form_urlencoded::parse(pair.as_bytes())
            .next()
            .is_some_and(|(k, _)| names.contains(&k.as_ref()))
    };
    if !query.split('&').any(named) {
        return None;
    }
    let kept: Vec<&str> = query.split('&').filter(|p| !named(p)).collect();
    Some(kept.join("&"))
}

/// `unreserved` of RFC 3986: what a percent escape may be decoded to
/// without changing the meaning of the path.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Bytes that start no valid UTF-8 sequence (overlong and out-of-range
/// leads): refusing them shuts out the old `%C0%AF` tricks for `/`.
fn never_in_utf8(b: u8) -> bool {
    matches!(b, 0xC0 | 0xC1 | 0xF5..=0xFF)
}

/// Printable ASCII a path may carry as is (RFC 3986 `pchar` and `/`, plus
/// the few characters browsers send unescaped).
fn is_plain(b: u8) -> bool {
    (0x21..0x7F).contains(&b) && !matches!(b, b'%' | b'\\' | b'?' | b'#')
}

/// Whether `raw` is already canonical, checked in one pass so that the
/// common path costs no allocation.
fn already_canonical(raw: &[u8]) -> bool {
    let Some((&b'/', rest)) = raw.split_first() else {
        return false;
    };
    let mut prev = b'/';
    let mut i = 0;
    while i < rest.len() {
        let b = rest[i];
        if prev == b'/' && b == b'/' {
            return false;
        }
        if prev == b'/' && b == b'.' {
            // A dot segment (also `..;x`) needs work; `.well-known` does not.
            let end = rest[i..]
                .iter()
                .position(|&c| c == b'/')
                .map_or(rest.len(), |n| i + n);
            let segment = &rest[i..end];
            let name = segment.split(|&c| c == b';').next().unwrap_or(segment);
            if name == b"." || name == b".." {
                return false;
            }
        }
        if b == b'%' {
            // Only an escape in its one canonical spelling.
            let digit = |c: Option<&u8>| match c {
                Some(&c @ b'0'..=b'9') => Some(c - b'0'),
                Some(&c @ b'A'..=b'F') => Some(c - b'A' + 10),
                _ => None,
            };
            let (Some(hi), Some(lo)) = (digit(rest.get(i + 1)), digit(rest.get(i + 2))) else {
                return false;
            };
            let byte = hi << 4 | lo;
            if is_unreserved(byte)
                || matches!(byte, b'/' | b'\\' | 0..=0x1F | 0x7F)
                || never_in_utf8(byte)
            {
                return false;
            }
            i += 3;
        } else if is_plain(b) {
            i += 1;
        } else {
            return false;
        }
        prev = b;
    }
    true
}

/// The canonical form of a path (the part of the target before `?`):
///
/// * percent escapes of unreserved characters are decoded, the others are
///   kept with upper-case hex digits; bytes outside printable ASCII are
///   escaped;
/// * `.` and `..` segments (also as `%2e`) are resolved and repeated
///   slashes merged; a trailing slash is kept;
/// * an encoded `/` or `\`, a raw `\`, an encoded NUL or control character,
///   a byte that never occurs in UTF-8, a dot segment with parameters
///   (`..;x`, which Java servers read as `..`) and a path that climbs
///   above the root are refused.
///
/// The result is printable ASCII, starts with `/`, and is its own
/// canonical form.
pub(crate) fn path(raw: &str) -> Result<Cow<'_, str>, Refusal> {
    let bytes = raw.as_bytes();
    if already_canonical(bytes) {
        return Ok(Cow::Borrowed(raw));
    }
    if bytes.first() != Some(&b'/') {
        return Err(Refusal::NotAPath);
    }
    let mut out = String::with_capacity(raw.len());
    // Where each kept segment starts in `out` (at its `/`), for `..`.
    let mut starts: Vec<usize> = Vec::new();
    let mut segment = String::new();
    let mut trailing_slash = false;
    for raw_segment in raw[1..].split('/') {
        segment.clear();
        decode_segment(raw_segment.as_bytes(), &mut segment)?;
        trailing_slash = matches!(segment.as_str(), "" | "." | "..");
        match segment.as_str() {
            "" | "." => {}
            ".." => match starts.pop() {
                Some(start) => out.truncate(start),
                None => return Err(Refusal::AboveRoot),
            },
            s => {
                let name = s.split(';').next().unwrap_or(s);
                if name == "." || name == ".." {
                    return Err(Refusal::DotSegmentWithParameters);
                }
                starts.push(out.len());
                out.push('/');
                out.push_str(s);
            }
        }
    }
    if out.is_empty() || trailing_slash {
        out.push('/');
    }
    Ok(Cow::Owned(out))
}

fn decode_segment(raw: &[u8], out: &mut String) -> Result<(), Refusal> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        let (byte, escaped) = if b == b'%' {
            let hi = raw.get(i + 1).and_then(|c| (*c as char).to_digit(16));
            let lo = raw.get(i + 2).and_then(|c| (*c as char).to_digit(16));
            let (Some(hi), Some(lo)) = (hi, lo) else {
                return Err(Refusal::BadEscape);
            };
            i += 3;
            ((hi * 16 + lo) as u8, true)
        } else {
            i += 1;
            (b, false)
        };
        match byte {
            b'/' if escaped => return Err(Refusal::EncodedSeparator),
            b'\\' => return Err(Refusal::EncodedSeparator),
            0..=0x1F | 0x7F => return Err(Refusal::ControlCharacter),
            b if never_in_utf8(b) => return Err(Refusal::NotUtf8),
            b if is_unreserved(b) => out.push(b as char),
            b if !escaped && is_plain(b) => out.push(b as char),
            b => {
                out.push('%');
                out.push(HEX[usize::from(b >> 4)] as char);
                out.push(HEX[usize::from(b & 0xF)] as char);
            }
        }
    }
    Ok(())
}

/// Which spellings an origin might fold into another path the daemon lets
/// through (see `check_folding`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Folding {
    /// `:` may appear in a path (`server.allow_path_colons`).
    pub allow_colons: bool,
    /// Some room matches paths ignoring case (`case_insensitive_paths`):
    /// its origin may fold more than ASCII case.
    pub case_insensitive: bool,
}

/// Refuses a canonical path that some origin would read as another path
/// than the one the gate matches, so that no room is walked around
/// through such a spelling:
///
/// * `%25` followed by two hex digits: an origin that decodes twice reads
///   `/%2573hop` as `/shop`;
/// * `:` (also `%3A` and the full-width colon), unless allowed: Windows
///   serves `/shop::$DATA` as `/shop`;
/// * non-ASCII white space and the invisible (default-ignorable)
///   characters, which some origins trim or drop (`/shop%E2%80%8B`);
/// * characters whose compatibility form (NFKC) holds ASCII, such as the
///   full-width solidus and full stop, which origins that normalize text
///   read as `/` and `.`;
/// * when a room matches case-insensitively: non-ASCII letters whose
///   upper or lower case is ASCII (`ı` is `I`, `ſ` is `S`, the Kelvin
///   sign is `k`), and Windows short names (`/SHOP~1`).
pub(crate) fn check_folding(path: &str, rules: Folding) -> Result<(), Refusal> {
    let b = path.as_bytes();
    let suspect = |c: &u8| *c == b'%' || *c == b':' || (rules.case_insensitive && *c == b'~');
    if !b.iter().any(suspect) {
        return Ok(());
    }
    let hex = |c: Option<&u8>| c.and_then(|c| (*c as char).to_digit(16));
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b':' if !rules.allow_colons => return Err(Refusal::Colon),
            b'~' if rules.case_insensitive && b.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                return Err(Refusal::ShortName)
            }
            b'%' => {
                let byte = match (hex(b.get(i + 1)), hex(b.get(i + 2))) {
                    (Some(hi), Some(lo)) => (hi * 16 + lo) as u8,
                    _ => return Err(Refusal::BadEscape),
                };
                if byte == b'%' && hex(b.get(i + 3)).is_some() && hex(b.get(i + 4)).is_some() {
                    return Err(Refusal::DoubleEncoded);
                }
                if byte == b':' && !rules.allow_colons {
                    return Err(Refusal::Colon);
                }
                if byte >= 0x80 {
                    // The escaped UTF-8 sequence this byte starts (or is in).
                    let mut bytes = Vec::with_capacity(4);
                    let mut j = i;
                    while bytes.len() < 4 && b.get(j) == Some(&b'%') {
                        match (hex(b.get(j + 1)), hex(b.get(j + 2))) {
                            (Some(hi), Some(lo)) if hi >= 8 => bytes.push((hi * 16 + lo) as u8),
                            _ => break,
                        }
                        j += 3;
                        if std::str::from_utf8(&bytes).is_ok() {
                            break;
                        }
                    }
                    if let Some(c) = std::str::from_utf8(&bytes)
                        .ok()
                        .and_then(|s| s.chars().next())
                    {
                        if folds(c, rules) {
                            return Err(Refusal::Foldable);
                        }
                        i = j;
                        continue;
                    }
                }
                i += 3;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// Whether a non-ASCII character is one some origin folds (see
/// [`check_folding`]).
fn folds(c: char, rules: Folding) -> bool {
    use unicode_normalization::UnicodeNormalization;
    if c.is_ascii() {
        return false;
    }
    if c.is_whitespace() || default_ignorable(c) {
        return true;
    }
    let mut one = [0u8; 4];
    let compat = c.encode_utf8(&mut one).nfkc().any(|d| d.is_ascii());
    if compat || (!rules.allow_colons && c == '\u{FF1A}') {
        return true;
    }
    rules.case_insensitive
        && (c.to_lowercase().any(|l| l.is_ascii()) || c.to_uppercase().any(|u| u.is_ascii()))
}

/// Unicode's Default_Ignorable_Code_Point: characters with no glyph
/// (zero-width spaces and joiners, direction marks, variation selectors,
/// the soft hyphen, tags), which text processing may drop.
fn default_ignorable(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{034F}'
            | '\u{061C}'
            | '\u{115F}'..='\u{1160}'
            | '\u{17B4}'..='\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF0}'..='\u{FFF8}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}'
    )
}

/// What rooms and bypass rules compare against: the canonical path with
/// each segment's parameters (`;jsessionid=…`) removed, since servers such
/// as Tomcat route `/shop;x` to `/shop`, and with each segment's trailing
/// dots and spaces removed, since Windows (IIS, NTFS) serves `/shop.` and
/// `/shop%20` as `/shop`. A segment that was nothing but these is then
/// empty, and goes as the canonical form merges `//` (Tomcat routes
/// `/;x/shop` to `/shop`), except at the end, where it is the trailing
/// slash.
pub fn match_key(path: &str) -> Cow<'_, str> {
    let needs_work = path.contains(';')
        || path.ends_with('.')
        || path.contains("./")
        || path.ends_with("%20")
        || path.contains("%20/");
    if !needs_work {
        return Cow::Borrowed(path);
    }
    let mut out = String::with_capacity(path.len());
    let mut segments = path.strip_prefix('/').unwrap_or(path).split('/').peekable();
    while let Some(segment) = segments.next() {
        let name = trimmed(segment.split(';').next().unwrap_or(segment));
        if name.is_empty() && segments.peek().is_some() {
            continue;
        }
        out.push('/');
        out.push_str(name);
    }
    Cow::Owned(out)
}

/// `segment` without the trailing dots and (escaped) spaces Windows ignores.
fn trimmed(mut segment: &str) -> &str {
    while let Some(rest) = segment
        .strip_suffix('.')
        .or_else(|| segment.strip_suffix("%20"))
    {
        segment = rest;
    }
    segment
}

/// Whether the path `prefix` covers `path` on whole segments: `/shop`
/// covers `/shop`, `/shop/` and `/shop/cart`, never `/shopping`; `/shop/`
/// covers what is below it.
pub fn covers(prefix: &str, path: &str, case_insensitive: bool) -> bool {
    let (p, s) = (prefix.as_bytes(), path.as_bytes());
    if s.len() < p.len() {
        return false;
    }
    let head = &s[..p.len()];
    let same = if case_insensitive {
        head.eq_ignore_ascii_case(p)
    } else {
        head == p
    };
    same && (p.ends_with(b"/") || s.len() == p.len() || s[p.len()] == b'/')
}

/// The host of a request as the origin receives it (from `Host` in
/// HTTP/1, the `:authority` in HTTP/2), and the length of its name part;
/// refused when absent, repeated or in conflict.
fn request_host<B>(req: &Request<B>) -> Result<(HeaderValue, usize), Refusal> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let from_header = match (hosts.next(), hosts.next()) {
        (_, Some(_)) => return Err(Refusal::DuplicateHost),
        (Some(v), None) => Some(v),
        (None, None) => None,
    };
    let from_target = match req.uri().authority() {
        Some(a) => {
            if req.version() < Version::HTTP_2
                && !matches!(req.uri().scheme_str(), Some("http" | "https"))
            {
                return Err(Refusal::NotAPath);
            }
            Some(a.as_str())
        }
        None => None,
    };
    match (from_header, from_target) {
        (Some(h), Some(t)) => {
            let (header_name, _) = host(h.as_bytes())?;
            let (target_name, target_port) = host(t.as_bytes())?;
            if header_name != target_name {
                return Err(Refusal::HostMismatch);
            }
            // The target's authority wins (RFC 9112 §3.2.2); the names agree.
            rebuilt(&target_name, target_port)
        }
        (None, Some(t)) => {
            let (name, port) = host(t.as_bytes())?;
            rebuilt(&name, port)
        }
        (Some(h), None) => match canonical_name_len(h.as_bytes()) {
            // Already canonical: kept as sent, no copy.
            Some(n) => Ok((h.clone(), n)),
            None => {
                let (name, port) = host(h.as_bytes())?;
                rebuilt(&name, port)
            }
        },
        (None, None) => Err(Refusal::MissingHost),
    }
}

/// The length of the name when `value` is a Host already in canonical
/// form (a lower-case DNS name or IPv4 address without a trailing dot, and
/// an optional port of 1 to 5 digits up to 65535), without allocating; `None`
/// when it needs the full parse (upper case, trailing dot, IPv6, invalid).
fn canonical_name_len(value: &[u8]) -> Option<usize> {
    if value.len() > 253 + 6 {
        return None;
    }
    let mut label = 0usize;
    let mut i = 0;
    while i < value.len() {
        match value[i] {
            b'.' if label > 0 => label = 0,
            b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' if label < 63 => label += 1,
            b':' => break,
            _ => return None,
        }
        i += 1;
    }
    if label == 0 || i > 253 {
        return None;
    }
    if i < value.len() {
        let digits = &value[i + 1..];
        if digits.is_empty() || digits.len() > 5 {
            return None;
        }
        let mut port = 0u32;
        for &d in digits {
            if !d.is_ascii_digit() {
                return None;
            }
            port = port * 10 + u32::from(d - b'0');
        }
        if port > u32::from(u16::MAX) {
            return None;
        }
    }
    Some(i)
}

/// A Host value from a canonical name and the port.
fn rebuilt(name: &str, port: Option<u16>) -> Result<(HeaderValue, usize), Refusal> {
    let value = match port {
        Some(p) => HeaderValue::from_str(&format!("{name}:{p}")),
        None => HeaderValue::from_str(name),
    };
    value.map(|v| (v, name.len())).map_err(|_| Refusal::BadHost)
}

/// Parses `host[:port]`: a DNS name (letters, digits, `-`, `_`), an IPv4
/// address or a bracketed IPv6 address. Lower-cases the name and drops one
/// trailing dot.
pub(crate) fn host(value: &[u8]) -> Result<(String, Option<u16>), Refusal> {
    let text = std::str::from_utf8(value).map_err(|_| Refusal::BadHost)?;
    let (name, port) = if let Some(rest) = text.strip_prefix('[') {
        let (inner, after) = rest.split_once(']').ok_or(Refusal::BadHost)?;
        let addr: Ipv6Addr = inner.parse().map_err(|_| Refusal::BadHost)?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or(Refusal::BadHost)?),
        };
        (format!("[{addr}]"), port)
    } else {
        let (name, port) = match text.rsplit_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (text, None),
        };
        let name = name.strip_suffix('.').unwrap_or(name);
        let valid = !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|label| {
                (1..=63).contains(&label.len())
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            });
        if !valid {
            return Err(Refusal::BadHost);
        }
        (name.to_ascii_lowercase(), port)
    };
    let port = match port {
        None | Some("") => None,
        Some(p) if p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => {
            Some(p.parse::<u16>().map_err(|_| Refusal::BadHost)?)
        }
        Some(_) => return Err(Refusal::BadHost),
    };
    Ok((name, port))
}

/// The key a client address is counted under by every per-address limit
/// (connections, streams, new tickets, polls): an IPv4 address as it is
/// (IPv4-mapped IPv6 included), an IPv6 address by its /64, the smallest
/// network one subscriber is usually given, so a client cannot step
/// around a limit by cycling through the addresses of its own prefix.
pub fn limit_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

/// Whether a canonical host names this machine (`localhost`, 127.0.0.0/8, `[::1]`).
pub fn is_loopback_host(host: &str) -> bool {
    if host == "localhost" || host.ends_with(".localhost") {
        return true;
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn canon(raw: &str) -> Result<String, Refusal> {
        path(raw).map(Cow::into_owned)
    }

    #[test]
    fn own_params_go_in_every_spelling_and_the_rest_stays_as_written() {
        let names = &OWN_PARAMS;
        assert_eq!(without_params("a=1&b=2", names), None);
        assert_eq!(
            without_params("waitroom_token=t", names).as_deref(),
            Some("")
        );
        for (query, kept) in [
            ("a=%2F+x&waitroom_token=t.t.t&b&c=", "a=%2F+x&b&c="),
            ("waitroom_code=X&a=1&waitroom_code=Y", "a=1"),
            ("waitroom%5Ftoken=t&a=1", "a=1"),
            ("waitroom_%74oken=t&a=1", "a=1"),
            ("waitroom_token&a=1", "a=1"),
            ("a=1&&waitroom_code=X&", "a=1&&"),
        ] {
            assert_eq!(
                without_params(query, names).as_deref(),
                Some(kept),
                "{query}"
            );
        }
        // Names that only look like ours stay.
        assert_eq!(
            without_params("waitroom_tokens=1&xwaitroom_code=2", names),
            None
        );
        let req = Request::get("/shop/?waitroom_token=t&q=%C3%A9")
            .header("host", "shop.example")
            .body(())
            .unwrap();
        let c = Canonical::of(&req).unwrap();
        assert_eq!(c.without_own_params().unwrap(), "/shop/?q=%C3%A9");
        let req = Request::get("/shop/?waitroom_code=X")
            .header("host", "shop.example")
            .body(())
            .unwrap();
        assert_eq!(
            Canonical::of(&req).unwrap().without_own_params().unwrap(),
            "/shop/"
        );
    }

    #[test]
    fn every_spelling_of_shop_is_shop() {
        for raw in [
            "/shop",
            "//shop",
            "///shop",
            "/%73hop",
            "/%73%68%6F%70",
            "/./shop",
            "/x/../shop",
            "/x/%2e%2e/shop",
            "/x/%2E%2e/shop",
            "/x/.%2e/shop",
            "/static/../shop",
            "/static/%2e%2e/shop",
            "/a/b/../../shop",
            "/shop/.",
            "/shop/x/..",
        ] {
            let got = canon(raw).unwrap();
            assert!(got == "/shop" || got == "/shop/", "{raw} -> {got}");
        }
    }

    #[test]
    fn what_cannot_be_made_canonical_is_refused() {
        use Refusal::*;
        for (raw, why) in [
            ("/shop%2fcart", EncodedSeparator),
            ("/shop%2Fcart", EncodedSeparator),
            ("/static/..%2fshop", EncodedSeparator),
            ("/shop%5ccart", EncodedSeparator),
            ("/shop\\cart", EncodedSeparator),
            ("/..", AboveRoot),
            ("/a/../..", AboveRoot),
            ("/%2e%2e/etc", AboveRoot),
            ("/shop%00", ControlCharacter),
            ("/shop%0d%0a", ControlCharacter),
            ("/shop%7f", ControlCharacter),
            ("/shop%", BadEscape),
            ("/shop%4", BadEscape),
            ("/shop%zz", BadEscape),
            ("/%c0%af", NotUtf8),
            ("/static/..;/shop", DotSegmentWithParameters),
            ("/static/.;x/shop", DotSegmentWithParameters),
            ("shop", NotAPath),
            ("*", NotAPath),
        ] {
            assert_eq!(canon(raw), Err(why), "{raw}");
        }
    }

    #[test]
    fn other_escapes_are_kept_in_one_spelling() {
        assert_eq!(canon("/a%20b").unwrap(), "/a%20b");
        assert_eq!(canon("/a%2cb%3Bc").unwrap(), "/a%2Cb%3Bc");
        assert_eq!(canon("/caf%c3%a9").unwrap(), "/caf%C3%A9");
        assert_eq!(canon("/%7e%41").unwrap(), "/~A");
        assert_eq!(
            canon("/shop;jsessionid=1/cart").unwrap(),
            "/shop;jsessionid=1/cart"
        );
        assert_eq!(canon("/").unwrap(), "/");
        assert_eq!(canon("//").unwrap(), "/");
        assert_eq!(canon("/a//b//").unwrap(), "/a/b/");
        assert_eq!(canon("/.well-known/x").unwrap(), "/.well-known/x");
    }

    #[test]
    fn plain_paths_are_borrowed() {
        assert!(matches!(path("/shop/cart"), Ok(Cow::Borrowed(_))));
        assert!(matches!(path("/a-b_c~d/e.f"), Ok(Cow::Borrowed(_))));
    }

    #[test]
    fn match_keys_drop_segment_parameters() {
        assert_eq!(match_key("/shop;jsessionid=1/cart"), "/shop/cart");
        assert_eq!(match_key("/shop;x"), "/shop");
        assert_eq!(match_key("/;/shop"), "/shop");
        assert_eq!(match_key("/;jsessionid=1/shop/cart"), "/shop/cart");
        assert_eq!(match_key("/a/;x/shop"), "/a/shop");
        assert_eq!(match_key("/shop/;x"), "/shop/");
        assert_eq!(match_key("/;x"), "/");
        assert_eq!(match_key("/plain"), "/plain");
    }

    #[test]
    fn match_keys_drop_trailing_dots_and_spaces() {
        assert_eq!(match_key("/shop."), "/shop");
        assert_eq!(match_key("/shop%20"), "/shop");
        assert_eq!(match_key("/shop.%20./cart"), "/shop/cart");
        assert_eq!(match_key("/shop.;x"), "/shop");
        assert_eq!(match_key("/.../shop"), "/shop");
        assert_eq!(match_key("/shop/..."), "/shop/");
        assert_eq!(match_key("/shop.html"), "/shop.html");
        assert_eq!(match_key("/a%20b/c"), "/a%20b/c");
        assert!(matches!(match_key("/shop/cart.html"), Cow::Borrowed(_)));
    }

    #[test]
    fn prefixes_cover_whole_segments() {
        assert!(covers("/", "/anything", false));
        assert!(covers("/shop", "/shop", false));
        assert!(covers("/shop", "/shop/cart", false));
        assert!(!covers("/shop", "/shopping", false));
        assert!(!covers("/static", "/staticX", false));
        assert!(covers("/shop/", "/shop/cart", false));
        assert!(!covers("/shop", "/SHOP", false));
        assert!(covers("/shop", "/SHOP/Cart", true));
        assert!(!covers("/shop", "/SHOPPING", true));
    }

    #[test]
    fn hosts_are_lower_cased_without_port_or_trailing_dot() {
        let h = |s: &str| host(s.as_bytes());
        assert_eq!(
            h("Shop.Example.com."),
            Ok(("shop.example.com".into(), None))
        );
        assert_eq!(
            h("shop.example.com.:8080"),
            Ok(("shop.example.com".into(), Some(8080)))
        );
        assert_eq!(h("[::1]:80"), Ok(("[::1]".into(), Some(80))));
        assert_eq!(h("[0:0::1]"), Ok(("[::1]".into(), None)));
        assert_eq!(h("127.0.0.1"), Ok(("127.0.0.1".into(), None)));
        for bad in [
            "", ".", "a..b", "sh op", "a@b", "a:b:c", "x:99999", "[::1", "[zz]", "a%2eb", "a/b",
            "x:-1",
        ] {
            assert_eq!(h(bad), Err(Refusal::BadHost), "{bad:?}");
        }
    }

    #[test]
    fn host_comes_from_exactly_one_place() {
        let req = |target: &str, hosts: &[&str], version: Version| {
            let mut b = Request::builder().uri(target).version(version);
            for h in hosts {
                b = b.header("host", *h);
            }
            b.body(()).unwrap()
        };
        let v11 = Version::HTTP_11;
        assert_eq!(
            Canonical::of(&req("/x", &[], v11)).unwrap_err(),
            Refusal::MissingHost
        );
        assert_eq!(
            Canonical::of(&req("/x", &[], Version::HTTP_10)).unwrap_err(),
            Refusal::MissingHost
        );
        assert_eq!(
            Canonical::of(&req("/x", &["a", "b"], v11)).unwrap_err(),
            Refusal::DuplicateHost
        );
        assert_eq!(
            Canonical::of(&req("http://a.example//shop", &["b.example"], v11)).unwrap_err(),
            Refusal::HostMismatch
        );
        let c = Canonical::of(&req("http://A.example:81//shop?q=1", &["a.example"], v11)).unwrap();
        assert_eq!((c.host(), c.path()), ("a.example", "/shop"));
        assert_eq!(c.host_header, "a.example:81");
        assert_eq!(c.target, "/shop?q=1");
        assert_eq!(c.query(), Some("q=1"));
        let h2 = Canonical::of(&req("https://a.example/x", &[], Version::HTTP_2)).unwrap();
        assert_eq!(h2.host(), "a.example");
        // Already canonical: the request's own bytes, host name and all.
        let plain = Canonical::of(&req("/a/b?c", &["shop.example:8080"], v11)).unwrap();
        assert_eq!(
            (plain.host(), plain.path(), plain.query()),
            ("shop.example", "/a/b", Some("c"))
        );
        assert_eq!(plain.host_header, "shop.example:8080");
        let folded = Canonical::of(&req("/", &["Shop.Example.:8080"], v11)).unwrap();
        assert_eq!(
            (folded.host(), folded.host_header.to_str().unwrap()),
            ("shop.example", "shop.example:8080")
        );
        let v6 = Canonical::of(&req("/", &["[0::1]:80"], v11)).unwrap();
        assert_eq!(
            (v6.host(), v6.host_header.to_str().unwrap()),
            ("[::1]", "[::1]:80")
        );
    }

    #[test]
    fn the_no_copy_host_check_agrees_with_the_parser() {
        for value in [
            "shop.example",
            "shop.example:8080",
            "a",
            "127.0.0.1:1",
            "x_y-z.example:65535",
            "Shop.example",
            "shop.example.",
            "shop..example",
            ".shop",
            "shop.example:",
            "shop:99999",
            "shop:0x1",
            "[::1]",
            "a:b:c",
            "",
            "sh op",
        ] {
            let fast = canonical_name_len(value.as_bytes());
            let slow = host(value.as_bytes());
            match fast {
                Some(n) => {
                    let (name, port) = slow.expect("the parser agrees it is valid");
                    assert_eq!(&value[..n], name, "{value}");
                    assert_eq!(value.len() > n, port.is_some(), "{value}");
                }
                // IPv6 literals always take the full parse.
                None if value.starts_with('[') => {}
                None => assert!(
                    slow.map_or(true, |(name, port)| {
                        let rebuilt = match port {
                            Some(p) => format!("{name}:{p}"),
                            None => name,
                        };
                        rebuilt != value
                    }),
                    "{value} is canonical but took the slow path"
                ),
            }
        }
    }

    #[test]
    fn loopback_hosts() {
        for h in [
            "localhost",
            "127.0.0.1",
            "127.9.9.9",
            "[::1]",
            "app.localhost",
        ] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "evil.example",
            "10.0.0.1",
            "[2001:db8::1]",
            "localhost.evil.example",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }

    /// An origin's view of a path, as nginx builds it: every escape decoded
    /// first, then slashes merged and dot segments resolved (None if it
    /// climbs above the root or an escape is broken).
    fn nginx_normalize(raw: &str) -> Option<String> {
        let b = raw.as_bytes();
        let mut decoded = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                decoded.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            } else {
                decoded.push(b[i]);
                i += 1;
            }
        }
        let mut out: Vec<&[u8]> = Vec::new();
        for seg in decoded.split(|c| *c == b'/') {
            match seg {
                b"" | b"." => {}
                b".." => {
                    out.pop()?;
                }
                s => out.push(s),
            }
        }
        let mut text = Vec::new();
        for s in out {
            text.push(b'/');
            text.extend_from_slice(s);
        }
        Some(String::from_utf8_lossy(&text).into_owned())
    }

    /// A path as an attacker writes it: segments of dots, escapes (valid,
    /// broken, of separators) and plain characters.
    fn hostile_path() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("/".to_owned()),
            Just(".".to_owned()),
            Just("..".to_owned()),
            Just("%2e".to_owned()),
            Just("%2F".to_owned()),
            Just("%5c".to_owned()),
            Just(";".to_owned()),
            Just("%".to_owned()),
            Just("%00".to_owned()),
            "[a-zA-Z0-9_~-]{1,3}",
            "%[0-9a-fA-F]{2}",
        ];
        prop::collection::vec(piece, 0..12).prop_map(|v| format!("/{}", v.concat()))
    }

    proptest! {
        #[test]
        fn never_panics_on_any_bytes(raw in prop::collection::vec(any::<u8>(), 0..96)) {
            let text = String::from_utf8_lossy(&raw);
            let _ = path(&text);
            let _ = path(&format!("/{text}"));
            let _ = host(&raw);
            let _ = match_key(&text);
            // The no-copy Host check only ever accepts what the parser keeps as is.
            if let Some(n) = canonical_name_len(&raw) {
                let (name, port) = host(&raw).expect("valid");
                prop_assert_eq!(name.as_bytes(), &raw[..n]);
                prop_assert_eq!(port.is_some(), raw.len() > n);
            }
        }

        #[test]
        fn canonical_form_is_idempotent(raw in hostile_path()) {
            if let Ok(once) = path(&raw) {
                let twice = path(&once).expect("a canonical path is valid");
                prop_assert_eq!(once.as_ref(), twice.as_ref());
                prop_assert!(matches!(twice, Cow::Borrowed(_)), "canonical means no work");
                prop_assert!(once.starts_with('/'));
                prop_assert!(once.bytes().all(|b| (0x21..0x7F).contains(&b)));
                prop_assert!(!once.contains("//"));
                prop_assert!(!once.split('/').any(|s| s == "." || s == ".."));
            }
        }

        /// The origin sees what the gate matched: an origin that decodes
        /// every escape and resolves dot segments (as nginx does) finds the
        /// same resource from the raw path and from the canonical one, and
        /// the gate's prefix decision is the origin's.
        #[test]
        fn the_origin_sees_what_was_matched(tail in hostile_path()) {
            let raw = format!("/p{tail}");
            if let Ok(c) = path(&raw) {
                let origin_raw = nginx_normalize(&raw);
                let origin_canonical = nginx_normalize(&c);
                prop_assert_eq!(&origin_raw, &origin_canonical);
                let inside = covers("/p", &match_key(&c), false);
                let origin_inside = origin_raw
                    .as_deref()
                    .is_some_and(|o| o == "/p" || o.starts_with("/p/"));
                // Protecting more than the origin's view is harmless (`/p;x`
                // is `/p` to Tomcat); protecting less would be a way round.
                if origin_inside {
                    prop_assert!(inside, "{} -> {} escapes the room", raw, c);
                }
            }
        }

        /// Decoding never makes a separator: the canonical path has exactly
        /// the segments the raw path had once dot segments are resolved.
        #[test]
        fn escapes_never_become_separators(seg in "[a-zA-Z0-9%.;~_-]{0,12}") {
            let raw = format!("/a/{seg}/b");
            if let Ok(c) = path(&raw) {
                prop_assert!(c.starts_with('/'));
                prop_assert!(c.ends_with("/b"));
            }
        }
    }
}
