//! The visitor's language: the shipped translations (one data file per
//! language in `static/i18n/`, embedded and parsed once), their plural
//! rules, and the choice of a language from `Accept-Language` (RFC 9110
//! §12.5.4, RFC 4647 lookup reduced to the primary subtag).
//!
//! Adding a language: write `static/i18n/<code>.toml` with every key of
//! `en.toml`, then add it to [`Lang`] (`ALL`, `code`, `source`) and give it
//! a plural rule in [`Lang::plural`] and [`Lang::plural_forms`].

use std::collections::BTreeMap;
use std::sync::LazyLock;

use http::header::{HeaderMap, HeaderValue, ACCEPT_LANGUAGE};
use serde::Deserialize;

/// A language the daemon's pages are written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lang {
    /// English.
    En,
    /// Chinese (simplified).
    Zh,
    /// German.
    De,
    /// Spanish.
    Es,
    /// French.
    Fr,
    /// Japanese.
    Ja,
    /// Portuguese.
    Pt,
    /// Russian.
    Ru,
}

impl Lang {
    /// Every shipped language; English first, the fallback.
    pub const ALL: [Lang; 8] = [
        Lang::En,
        Lang::Zh,
        Lang::De,
        Lang::Es,
        Lang::Fr,
        Lang::Ja,
        Lang::Pt,
        Lang::Ru,
    ];

    /// The language when nothing else fits.
    pub const FALLBACK: Lang = Lang::En;

    /// The ISO 639-1 code, as written in `room.language` and `<html lang>`.
    pub fn code(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Zh => "zh",
            Lang::De => "de",
            Lang::Es => "es",
            Lang::Fr => "fr",
            Lang::Ja => "ja",
            Lang::Pt => "pt",
            Lang::Ru => "ru",
        }
    }

    /// The language of a code (ASCII case ignored); `None` for codes not shipped.
    pub fn from_code(code: &str) -> Option<Lang> {
        Lang::ALL
            .into_iter()
            .find(|l| l.code().eq_ignore_ascii_case(code))
    }

    /// The data file, embedded so the binary stays self-contained.
    fn source(self) -> &'static str {
        match self {
            Lang::En => include_str!("../static/i18n/en.toml"),
            Lang::Zh => include_str!("../static/i18n/zh.toml"),
            Lang::De => include_str!("../static/i18n/de.toml"),
            Lang::Es => include_str!("../static/i18n/es.toml"),
            Lang::Fr => include_str!("../static/i18n/fr.toml"),
            Lang::Ja => include_str!("../static/i18n/ja.toml"),
            Lang::Pt => include_str!("../static/i18n/pt.toml"),
            Lang::Ru => include_str!("../static/i18n/ru.toml"),
        }
    }

    /// The plural category of a whole number (CLDR names, integers only).
    /// The page's script uses `Intl.PluralRules`, which agrees on integers.
    pub fn plural(self, n: u64) -> &'static str {
        match self {
            Lang::En | Lang::De | Lang::Es => {
                if n == 1 {
                    "one"
                } else {
                    "other"
                }
            }
            // CLDR: 0 and 1 are singular in French and Portuguese.
            Lang::Fr | Lang::Pt => {
                if n <= 1 {
                    "one"
                } else {
                    "other"
                }
            }
            Lang::Zh | Lang::Ja => "other",
            Lang::Ru => match (n % 10, n % 100) {
                (1, r) if r != 11 => "one",
                (2..=4, r) if !(12..=14).contains(&r) => "few",
                _ => "many",
            },
        }
    }

    /// The plural forms each plural entry of this language's file has.
    /// `other` is always there (the script's fallback); Russian's `other`
    /// is its form for fractions.
    pub fn plural_forms(self) -> &'static [&'static str] {
        match self {
            Lang::En | Lang::De | Lang::Es | Lang::Fr | Lang::Pt => &["one", "other"],
            Lang::Zh | Lang::Ja => &["other"],
            Lang::Ru => &["one", "few", "many", "other"],
        }
    }

    /// This language's strings, parsed on first use.
    pub fn strings(self) -> &'static Strings {
        &TABLES[self as usize]
    }
}

/// One entry of a language file: a sentence, or a sentence per plural form.
#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(untagged)]
pub(crate) enum Entry {
    Text(String),
    Plural(BTreeMap<String, String>),
}

/// A language's strings by key, as written in its data file.
#[derive(Debug)]
pub struct Strings {
    pub(crate) lang: Lang,
    entries: BTreeMap<String, Entry>,
    /// The same entries as a template value (`t`), built once.
    value: minijinja::Value,
}

static TABLES: LazyLock<Vec<Strings>> = LazyLock::new(|| {
    Lang::ALL
        .into_iter()
        .map(|lang| {
            // A broken file is caught by the unit tests; at run time the
            // language then shows its keys rather than taking the daemon down.
            let entries: BTreeMap<String, Entry> =
                toml::from_str(lang.source()).unwrap_or_else(|e| {
                    tracing::error!(lang = lang.code(), error = %e, "translation file does not parse");
                    BTreeMap::new()
                });
            let value = minijinja::Value::from_serialize(&entries);
            Strings {
                lang,
                entries,
                value,
            }
        })
        .collect()
});

impl Strings {
    /// The sentence for `key` (the key itself when missing, which the
    /// tests rule out for shipped files).
    pub fn get<'a>(&'a self, key: &'a str) -> &'a str {
        match self.entries.get(key) {
            Some(Entry::Text(s)) => s,
            Some(Entry::Plural(forms)) => forms.get("other").map_or(key, String::as_str),
            None => key,
        }
    }

    /// The plural entry `key` for the number `n`, with `{n}` filled in.
    pub fn count(&self, key: &str, n: u64) -> String {
        let form = match self.entries.get(key) {
            Some(Entry::Plural(forms)) => forms
                .get(self.lang.plural(n))
                .or_else(|| forms.get("other"))
                .map_or(key, String::as_str),
            Some(Entry::Text(s)) => s,
            None => key,
        };
        fill(form, &[("n", &n.to_string())])
    }

    /// Every entry, for the template (`t`).
    pub fn value(&self) -> minijinja::Value {
        self.value.clone()
    }

    /// The keys and entries, for the tests.
    #[cfg(test)]
    pub(crate) fn entries(&self) -> &BTreeMap<String, Entry> {
        &self.entries
    }
}

/// Replaces each `{name}` in `text` with its value.
pub fn fill(text: &str, values: &[(&str, &str)]) -> String {
    let mut out = text.to_owned();
    for (name, value) in values {
        out = out.replace(&format!("{{{name}}}"), value);
    }
    out
}

/// The `{name}` placeholders in a sentence, in order.
pub fn placeholders(text: &str) -> Vec<&str> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        match after.find('}') {
            Some(close) => {
                names.push(&after[..close]);
                rest = &after[close + 1..];
            }
            None => break,
        }
    }
    names
}

/// `room.language`: chosen per request, or one for everyone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Language {
    /// From the visitor's `Accept-Language`, English when nothing fits.
    #[default]
    Auto,
    /// This language for everyone.
    Fixed(Lang),
}

impl Language {
    /// `"auto"` or one of the shipped codes.
    pub fn parse(text: &str) -> Option<Language> {
        if text.eq_ignore_ascii_case("auto") {
            return Some(Language::Auto);
        }
        Lang::from_code(text).map(Language::Fixed)
    }

    /// The language of a page answering a request with these headers.
    /// Reads the headers only for `auto`.
    pub fn choose(self, headers: &HeaderMap) -> Chosen {
        match self {
            Language::Fixed(lang) => Chosen {
                lang,
                negotiated: false,
            },
            Language::Auto => Chosen {
                lang: negotiate(headers.get_all(ACCEPT_LANGUAGE).iter()),
                negotiated: true,
            },
        }
    }

    /// As [`Language::choose`], from a saved `Accept-Language` value.
    pub fn choose_from(self, accept_language: Option<&HeaderValue>) -> Chosen {
        match self {
            Language::Fixed(lang) => Chosen {
                lang,
                negotiated: false,
            },
            Language::Auto => Chosen {
                lang: negotiate(accept_language.into_iter()),
                negotiated: true,
            },
        }
    }
}

/// The language a page is rendered in, and whether the request's
/// `Accept-Language` chose it (then the answer carries
/// `Vary: Accept-Language`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chosen {
    /// The language.
    pub lang: Lang,
    pub(crate) negotiated: bool,
}

impl Chosen {
    /// A page in a language fixed by the daemon, not by the request.
    pub fn fixed(lang: Lang) -> Self {
        Self {
            lang,
            negotiated: false,
        }
    }
}

/// Most bytes of `Accept-Language` read; a browser sends well under 200.
const MAX_HEADER_BYTES: usize = 1024;
/// Most language ranges considered.
const MAX_RANGES: usize = 32;

/// The shipped language the visitor prefers most (highest q, the first
/// written on a tie), English when none is acceptable. A range matches by
/// its primary subtag (`pt-BR` is `pt`, `zh-Hant-TW` is `zh`); `*` stands
/// for English unless English was refused with `q=0`, then for the first
/// language not refused. Malformed ranges and q-values are skipped; work
/// is bounded by `MAX_HEADER_BYTES` and `MAX_RANGES`.
pub fn negotiate<'a>(values: impl Iterator<Item = &'a HeaderValue>) -> Lang {
    // Best so far: (q in thousandths, language).
    let mut best: Option<(u16, Lang)> = None;
    let mut star: Option<u16> = None;
    let mut refused = [false; Lang::ALL.len()];
    let mut budget = MAX_HEADER_BYTES;
    let mut ranges = 0;
    'values: for value in values {
        let bytes = value.as_bytes();
        let bytes = &bytes[..bytes.len().min(budget)];
        budget -= bytes.len();
        for item in bytes.split(|&b| b == b',') {
            if ranges == MAX_RANGES {
                break 'values;
            }
            ranges += 1;
            let Some((range, q)) = parse_item(item) else {
                continue;
            };
            match range {
                Range::Any => star = star.max(Some(q)),
                Range::Lang(lang, exact) => {
                    if q == 0 {
                        // Only a bare code refuses the language itself:
                        // `fr-CA;q=0` does not refuse `fr`.
                        refused[lang as usize] |= exact;
                    } else if best.is_none_or(|(b, _)| q > b) {
                        best = Some((q, lang));
                    }
                }
            }
        }
        if budget == 0 {
            break;
        }
    }
    let star = star.filter(|&q| q > 0).and_then(|q| {
        Lang::ALL
            .into_iter()
            .find(|l| !refused[*l as usize])
            .map(|l| (q, l))
    });
    match (best, star) {
        (Some((q, lang)), Some((sq, any))) => {
            if sq > q {
                any
            } else {
                lang
            }
        }
        (Some((_, lang)), None) | (None, Some((_, lang))) => lang,
        (None, None) => Lang::FALLBACK,
    }
}

enum Range {
    Any,
    /// A shipped language, and whether the range was its bare code.
    Lang(Lang, bool),
}

/// One `range[;q=value]` item: `None` when malformed or not shipped.
fn parse_item(item: &[u8]) -> Option<(Range, u16)> {
    let item = std::str::from_utf8(item).ok()?;
    let mut parts = item.split(';');
    let range = parts.next()?.trim();
    let mut q = 1000;
    for param in parts {
        let (name, value) = param.trim().split_once('=')?;
        if name.trim().eq_ignore_ascii_case("q") {
            q = parse_q(value.trim())?;
        }
    }
    if range == "*" {
        return Some((Range::Any, q));
    }
    let mut subtags = range.split('-');
    let primary = subtags.next()?;
    let well_formed = (1..=8).contains(&primary.len())
        && primary.bytes().all(|b| b.is_ascii_alphabetic())
        && subtags
            .all(|s| (1..=8).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric()));
    if !well_formed {
        return None;
    }
    let lang = Lang::from_code(primary)?;
    Some((Range::Lang(lang, primary.len() == range.len()), q))
}

/// A q-value (`0`, `0.5`, `1.000`) in thousandths.
fn parse_q(text: &str) -> Option<u16> {
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut thousandths: u16 = 0;
    for (i, b) in frac.bytes().enumerate() {
        thousandths += u16::from(b - b'0') * [100, 10, 1][i];
    }
    match whole {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn pick(header: &str) -> &'static str {
        let v = HeaderValue::from_str(header).unwrap();
        negotiate(std::iter::once(&v)).code()
    }

    #[test]
    fn every_language_file_has_the_keys_and_placeholders_of_english() {
        let en = Lang::En.strings().entries();
        assert!(en.len() > 40, "en.toml parsed: {} keys", en.len());
        for lang in Lang::ALL {
            let strings = lang.strings().entries();
            let keys: BTreeSet<_> = strings.keys().collect();
            let en_keys: BTreeSet<_> = en.keys().collect();
            assert_eq!(keys, en_keys, "{}.toml keys", lang.code());
            for (key, entry) in strings {
                let want: BTreeSet<&str> = match &en[key] {
                    Entry::Text(s) => placeholders(s).into_iter().collect(),
                    Entry::Plural(forms) => placeholders(&forms["other"]).into_iter().collect(),
                };
                match (entry, &en[key]) {
                    (Entry::Text(s), Entry::Text(_)) => {
                        let got: BTreeSet<&str> = placeholders(s).into_iter().collect();
                        assert_eq!(got, want, "{}.toml {key}", lang.code());
                        assert!(!s.trim().is_empty(), "{}.toml {key} is empty", lang.code());
                    }
                    (Entry::Plural(forms), Entry::Plural(_)) => {
                        let names: Vec<&str> = forms.keys().map(String::as_str).collect();
                        let mut expected = lang.plural_forms().to_vec();
                        expected.sort_unstable();
                        assert_eq!(names, expected, "{}.toml {key} plural forms", lang.code());
                        for (form, s) in forms {
                            let got: BTreeSet<&str> = placeholders(s).into_iter().collect();
                            // "every second": a form only used for 1 (and
                            // 0, which no page counts) may leave the number out.
                            let only_one = (0..1000)
                                .filter(|&n| lang.plural(n) == form)
                                .all(|n| n <= 1);
                            if only_one {
                                assert!(got.is_subset(&want), "{}.toml {key}.{form}", lang.code());
                            } else {
                                assert_eq!(got, want, "{}.toml {key}.{form}", lang.code());
                            }
                        }
                    }
                    _ => panic!(
                        "{}.toml {key}: text in one file, plural in the other",
                        lang.code()
                    ),
                }
            }
        }
    }

    #[test]
    fn plural_rules_cover_their_forms() {
        for lang in Lang::ALL {
            for n in 0..200 {
                assert!(
                    lang.plural_forms().contains(&lang.plural(n)),
                    "{lang:?} {n}"
                );
            }
        }
        let ru = |n| Lang::Ru.strings().count("eta_minutes", n);
        assert_eq!(ru(1), "примерно 1 минута");
        assert_eq!(ru(3), "примерно 3 минуты");
        assert_eq!(ru(5), "примерно 5 минут");
        assert_eq!(ru(11), "примерно 11 минут");
        assert_eq!(ru(21), "примерно 21 минута");
        assert_eq!(ru(22), "примерно 22 минуты");
        assert_eq!(Lang::Ja.strings().count("eta_minutes", 7), "約7分");
        assert_eq!(Lang::En.strings().count("eta_hours", 1), "about 1 hour");
    }

    #[test]
    fn accept_language_picks_by_quality_then_order() {
        assert_eq!(pick("pt-BR,pt;q=0.9,en;q=0.8"), "pt");
        assert_eq!(pick("en;q=0.1, de;q=0.9"), "de");
        assert_eq!(pick("*"), "en");
        assert_eq!(pick("fr;q=0"), "en");
        assert_eq!(pick("xx, tlh"), "en");
        assert_eq!(pick("zh-Hans-CN"), "zh");
        assert_eq!(pick("zh-TW,zh;q=0.9"), "zh");
        assert_eq!(pick("JA-jp"), "ja");
        assert_eq!(pick("ru, de"), "ru", "a tie goes to the first written");
        assert_eq!(pick("nl, de;q=0.5"), "de", "unsupported ranges are skipped");
        assert_eq!(pick("de;q=0.5, *;q=0.8"), "en");
        assert_eq!(pick("en;q=0, *"), "zh", "* is the first not refused");
        assert_eq!(pick("fr-CA;q=0, fr;q=0.5"), "fr");
        assert_eq!(pick("es;Q=0.7 , ru ; q=0.6"), "es");
    }

    #[test]
    fn malformed_accept_language_is_ignored() {
        for header in [
            "",
            ",,,",
            ";q=1",
            "de;q=2",
            "de;q=0.1234",
            "de;q=abc",
            "de;q",
            "d e",
            "de-",
            "-de",
            "de_DE",
            "deutsch-de-de-de-de-de-de-de-de-de",
            "123",
            "de;q=-1",
        ] {
            assert_eq!(pick(header), "en", "{header:?}");
        }
        assert_eq!(pick("de;q=2, fr"), "fr");
        let bytes = [0xffu8, b'd', b'e'];
        let v = HeaderValue::from_bytes(&bytes).unwrap();
        assert_eq!(negotiate(std::iter::once(&v)), Lang::En);
    }

    #[test]
    fn work_on_long_headers_is_bounded() {
        let long = format!("{}de", "xx;q=0.5,".repeat(10_000));
        assert_eq!(pick(&long), "en", "ranges past the limit are not read");
        let early = format!("de,{}", "xx;q=0.5,".repeat(10_000));
        assert_eq!(pick(&early), "de");
    }

    #[test]
    fn several_header_lines_are_one_list() {
        let a = HeaderValue::from_static("xx");
        let b = HeaderValue::from_static("ja;q=0.4");
        assert_eq!(negotiate([&a, &b].into_iter()), Lang::Ja);
    }

    #[test]
    fn config_values() {
        assert_eq!(Language::parse("auto"), Some(Language::Auto));
        assert_eq!(Language::parse("ja"), Some(Language::Fixed(Lang::Ja)));
        assert_eq!(Language::parse("DE"), Some(Language::Fixed(Lang::De)));
        assert_eq!(Language::parse("pt-BR"), None);
        assert_eq!(Language::parse("xx"), None);
    }

    proptest::proptest! {
        #[test]
        fn negotiate_never_panics_and_answers_a_shipped_language(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400)) {
            if let Ok(v) = HeaderValue::from_bytes(&bytes) {
                let lang = negotiate(std::iter::once(&v));
                proptest::prop_assert!(Lang::ALL.contains(&lang));
            }
        }

        #[test]
        fn negotiate_handles_header_like_text(s in "([a-zA-Z*]{0,9}(-[a-zA-Z0-9]{0,9}){0,3}(;[qQ ]?=?[0-9.]{0,6})?[ ,]{0,2}){0,40}") {
            let v = HeaderValue::from_str(&s).unwrap();
            let lang = negotiate(std::iter::once(&v));
            proptest::prop_assert!(Lang::ALL.contains(&lang));
        }
    }
}
