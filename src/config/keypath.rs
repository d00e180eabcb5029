//! Where a problem is: key paths such as `room[1].event[0].start`, and
//! their lines and columns in the TOML text, found in toml's spanned tree
//! so that serde's errors (which carry byte spans) name the key.

use std::fmt;
use std::ops::Range;

use toml::de::{DeTable, DeValue};

use super::error::{ConfigError, Location, Problem};

#[derive(Clone, Debug)]
pub(super) enum Seg {
    Key(String),
    Index(usize),
}

/// A key path such as `room[1].event[0].start`.
#[derive(Clone, Debug, Default)]
pub(super) struct KeyPath(pub(super) Vec<Seg>);

impl KeyPath {
    pub(super) fn key(&self, key: &str) -> KeyPath {
        let mut segs = self.0.clone();
        segs.push(Seg::Key(key.to_owned()));
        KeyPath(segs)
    }

    pub(super) fn index(&self, index: usize) -> KeyPath {
        let mut segs = self.0.clone();
        segs.push(Seg::Index(index));
        KeyPath(segs)
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(top level)");
        }
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Key(k) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    let bare = !k.is_empty()
                        && k.chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                    if bare {
                        f.write_str(k)?;
                    } else {
                        write!(f, "{k:?}")?;
                    }
                }
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

pub(super) fn location(src: &str, offset: usize) -> Location {
    let offset = offset.min(src.len());
    let before = &src.as_bytes()[..offset];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let column = src
        .get(line_start..offset)
        .map_or(offset - line_start, |s| s.chars().count())
        + 1;
    Location { line, column }
}

fn contains(outer: &Range<usize>, inner: &Range<usize>) -> bool {
    outer.start <= inner.start && inner.end <= outer.end
}

/// The deepest key whose name or value covers `span`. Tables opened by a
/// header have the header as their span, so the walk visits every node
/// rather than descending only into spans that contain the error.
fn path_at(root: &DeTable<'_>, span: &Range<usize>) -> KeyPath {
    fn walk_table(
        table: &DeTable<'_>,
        path: &KeyPath,
        span: &Range<usize>,
        best: &mut Option<KeyPath>,
    ) {
        for (key, value) in table.iter() {
            let here = path.key(key.get_ref());
            if contains(&key.span(), span) {
                consider(&here, best);
            }
            walk_value(value, &here, span, best);
        }
    }
    fn walk_value(
        value: &toml::Spanned<DeValue<'_>>,
        path: &KeyPath,
        span: &Range<usize>,
        best: &mut Option<KeyPath>,
    ) {
        if contains(&value.span(), span) {
            consider(path, best);
        }
        match value.get_ref() {
            DeValue::Table(t) => walk_table(t, path, span, best),
            DeValue::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk_value(item, &path.index(i), span, best);
                }
            }
            _ => {}
        }
    }
    fn consider(path: &KeyPath, best: &mut Option<KeyPath>) {
        if best.as_ref().is_none_or(|b| path.0.len() > b.0.len()) {
            *best = Some(path.clone());
        }
    }
    let mut best = None;
    walk_table(root, &KeyPath::default(), span, &mut best);
    best.unwrap_or_default()
}

/// The span of `path`, or of its deepest present ancestor (a defaulted key
/// is reported at the table that lacks it).
pub(super) fn span_of(root: &DeTable<'_>, path: &KeyPath) -> Option<Range<usize>> {
    let mut found = None;
    let mut table = Some(root);
    let mut array: Option<&[toml::Spanned<DeValue<'_>>]> = None;
    for seg in &path.0 {
        let next = match seg {
            Seg::Key(k) => table.and_then(|t| {
                t.iter()
                    .find(|(key, _)| key.get_ref().as_ref() == k.as_str())
                    .map(|(_, v)| v)
            }),
            Seg::Index(i) => array.and_then(|a| a.get(*i)),
        };
        let Some(value) = next else { break };
        found = Some(value.span());
        table = None;
        array = None;
        match value.get_ref() {
            DeValue::Table(t) => table = Some(t),
            DeValue::Array(a) => array = Some(a),
            _ => {}
        }
    }
    found
}

pub(super) fn syntax_error(src: &str, e: &toml::de::Error) -> ConfigError {
    let at = location(src, e.span().map_or(0, |s| s.start));
    ConfigError::Syntax {
        line: at.line,
        column: at.column,
        message: e.message().trim().to_owned(),
    }
}

pub(super) fn deserialize_error(src: &str, tree: &DeTable<'_>, e: &toml::de::Error) -> ConfigError {
    let span = e.span();
    let mut path = span.as_ref().map(|s| path_at(tree, s)).unwrap_or_default();
    let mut at = span.map(|s| location(src, s.start));
    // serde speaks of fields and variants; operators write keys and values.
    let mut message = e
        .message()
        .trim()
        .replacen("unknown field `", "unknown key `", 1)
        .replacen("unknown variant `", "unknown value `", 1);
    // serde names a missing field only in prose; make it part of the path.
    let missing = message
        .strip_prefix("missing field `")
        .and_then(|m| m.strip_suffix('`'))
        .map(str::to_owned);
    if let Some(field) = missing {
        if path.0.is_empty() {
            at = None;
        }
        path = path.key(&field);
        message = "required key is missing".to_owned();
    }
    ConfigError::Invalid(vec![Problem {
        key: path.to_string(),
        location: at,
        message,
    }])
}
