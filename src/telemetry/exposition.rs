//! The two text formats `/metrics` speaks, and which one a scraper gets.
//!
//! `prometheus_client` writes OpenMetrics 1.0 only. Prometheus asks for it
//! first, but everything else that reads `/metrics` (`promtool check
//! metrics`, older agents, `curl` by hand) expects the classic Prometheus
//! text format 0.0.4. So the OpenMetrics text is what we encode, and
//! [`classic`] rewrites it line by line when the scraper did not ask for
//! OpenMetrics (types mapped as the Python reference client maps them for
//! the classic format):
//!
//! - a counter family `x` (samples `x_total`) is named `x_total` in
//!   `# HELP` and `# TYPE`; an info family `x` (samples `x_info`) becomes
//!   the gauge `x_info`;
//! - `stateset` becomes `gauge`, `gaugehistogram` becomes `histogram` (its
//!   `_gsum`/`_gcount` read as `_sum`/`_count`), `unknown` becomes
//!   `untyped`;
//! - `# UNIT` and `# EOF` go, as do the `_created` samples of counters,
//!   histograms and summaries, and exemplars;
//! - a sample's timestamp, in seconds, is given in milliseconds;
//! - in `# HELP`, the escaped quote `\"` (which 0.0.4 does not know) is
//!   written as a plain quote.
//!
//! Label sets pass through untouched: both formats escape label values the
//! same way.

use std::fmt::Write;

/// `Content-Type` of the classic format.
pub const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";
/// `Content-Type` of OpenMetrics 1.0.0.
pub const OPENMETRICS_1_0_0: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// `Content-Type` of OpenMetrics 0.0.1 (what older Prometheus versions ask
/// for; the text is the same).
pub const OPENMETRICS_0_0_1: &str = "application/openmetrics-text; version=0.0.1; charset=utf-8";

/// What `/metrics` answers in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// The Prometheus text format 0.0.4.
    Classic,
    /// OpenMetrics, labelled with the version the scraper named (1.0.0
    /// unless it named only 0.0.1).
    OpenMetrics { v0_0_1: bool },
}

impl Format {
    /// The `Content-Type` of a body in this format.
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::Classic => CLASSIC,
            Format::OpenMetrics { v0_0_1: false } => OPENMETRICS_1_0_0,
            Format::OpenMetrics { v0_0_1: true } => OPENMETRICS_0_0_1,
        }
    }

    /// The format for a request's `Accept` header values (RFC 9110 §12.5.1).
    ///
    /// Each format takes the quality of the most specific range that
    /// matches it (a named version we can send, the bare type, `type/*`,
    /// `*/*`). OpenMetrics is sent when its quality is above zero and
    /// above the classic format's, or equal to it and named more
    /// specifically (`application/openmetrics-text, */*`); the classic
    /// format otherwise, so no `Accept`, `*/*`, `text/plain` and anything
    /// we cannot send get it.
    pub(crate) fn negotiate<'a>(accept: impl IntoIterator<Item = &'a str>) -> Format {
        let mut om = Match::NONE;
        let mut text = Match::NONE;
        for range in accept.into_iter().flat_map(|v| v.split(',')) {
            let Some(range) = Range::parse(range) else {
                continue;
            };
            om = om.max(range.matches("application", "openmetrics-text", &["1.0.0", "0.0.1"]));
            text = text.max(range.matches("text", "plain", &["0.0.4"]));
        }
        let om_wins =
            om.q > 0 && (om.q > text.q || (om.q == text.q && om.specificity > text.specificity));
        if om_wins {
            Format::OpenMetrics {
                v0_0_1: om.version == Some("0.0.1"),
            }
        } else {
            Format::Classic
        }
    }
}

/// How one `Accept` range matches a format we can send. Compared by
/// specificity, then quality.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Match {
    /// -1 no match, 0 `*/*`, 1 `type/*`, 2 the type, 3 the type and a version.
    specificity: i8,
    /// Quality in thousandths.
    q: u16,
    version: Option<&'static str>,
}

impl Match {
    const NONE: Match = Match {
        specificity: -1,
        q: 0,
        version: None,
    };
}

/// One media range of an `Accept` header.
struct Range<'a> {
    kind: &'a str,
    subtype: &'a str,
    version: Option<&'a str>,
    q: u16,
}

impl<'a> Range<'a> {
    fn parse(text: &'a str) -> Option<Range<'a>> {
        let mut parts = text.split(';');
        let (kind, subtype) = parts.next()?.trim().split_once('/')?;
        let mut range = Range {
            kind: kind.trim(),
            subtype: subtype.trim(),
            version: None,
            q: 1000,
        };
        for param in parts {
            let Some((key, value)) = param.split_once('=') else {
                continue;
            };
            let value = value.trim().trim_matches('"');
            match key.trim() {
                k if k.eq_ignore_ascii_case("q") => range.q = quality(value)?,
                k if k.eq_ignore_ascii_case("version") => range.version = Some(value),
                _ => {}
            }
        }
        Some(range)
    }

    /// How this range matches `kind/subtype` in one of `versions`.
    fn matches(&self, kind: &str, subtype: &str, versions: &[&'static str]) -> Match {
        let at = |specificity, version| Match {
            specificity,
            q: self.q,
            version,
        };
        if self.kind == "*" && self.subtype == "*" {
            return at(0, None);
        }
        if !self.kind.eq_ignore_ascii_case(kind) {
            return Match::NONE;
        }
        if self.subtype == "*" {
            return at(1, None);
        }
        if !self.subtype.eq_ignore_ascii_case(subtype) {
            return Match::NONE;
        }
        match self.version {
            None => at(2, None),
            Some(v) => match versions.iter().find(|&&known| known == v) {
                Some(&known) => at(3, Some(known)),
                None => Match::NONE,
            },
        }
    }
}

/// A `q` value in thousandths (`0`, `0.5`, `1.000`); `None` if it is not one.
fn quality(v: &str) -> Option<u16> {
    let (whole, fraction) = v.split_once('.').unwrap_or((v, ""));
    if fraction.len() > 3 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut thousandths: u16 = match whole {
        "0" => 0,
        "1" => 1000,
        _ => return None,
    };
    let mut scale = 100;
    for digit in fraction.bytes() {
        thousandths += u16::from(digit - b'0') * scale;
        scale /= 10;
    }
    (thousandths <= 1000).then_some(thousandths)
}

/// An OpenMetrics family type, as far as the conversion needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
    GaugeHistogram,
    Summary,
    Info,
    StateSet,
    Unknown,
}

impl Kind {
    fn parse(name: &str) -> Kind {
        match name {
            "counter" => Kind::Counter,
            "gauge" => Kind::Gauge,
            "histogram" => Kind::Histogram,
            "gaugehistogram" => Kind::GaugeHistogram,
            "summary" => Kind::Summary,
            "info" => Kind::Info,
            "stateset" => Kind::StateSet,
            _ => Kind::Unknown,
        }
    }

    /// Its name in the classic format.
    fn classic(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge | Kind::Info | Kind::StateSet => "gauge",
            Kind::Histogram | Kind::GaugeHistogram => "histogram",
            Kind::Summary => "summary",
            Kind::Unknown => "untyped",
        }
    }

    /// The suffix the classic format adds to the family's name.
    fn classic_suffix(self) -> &'static str {
        match self {
            Kind::Counter => "_total",
            Kind::Info => "_info",
            _ => "",
        }
    }

    /// Whether its samples may include `_created`.
    fn has_created(self) -> bool {
        matches!(
            self,
            Kind::Counter | Kind::Histogram | Kind::GaugeHistogram | Kind::Summary
        )
    }
}

/// The family whose metadata and samples are being read.
struct Family<'a> {
    name: &'a str,
    kind: Option<Kind>,
    help: Option<&'a str>,
    /// Whether its `# HELP` and `# TYPE` have been written.
    written: bool,
}

impl<'a> Family<'a> {
    fn new(name: &'a str) -> Self {
        Family {
            name,
            kind: None,
            help: None,
            written: false,
        }
    }

    fn kind(&self) -> Kind {
        self.kind.unwrap_or(Kind::Unknown)
    }

    /// Writes its metadata, once. A family without `# TYPE` stays untyped
    /// (no `# TYPE` line), as in OpenMetrics.
    fn write_metadata(&mut self, out: &mut String) {
        if self.written || self.name.is_empty() {
            return;
        }
        self.written = true;
        let suffix = self.kind().classic_suffix();
        if let Some(help) = self.help {
            out.push_str("# HELP ");
            out.push_str(self.name);
            out.push_str(suffix);
            out.push(' ');
            push_help(out, help);
            out.push('\n');
        }
        if let Some(kind) = self.kind {
            out.push_str("# TYPE ");
            out.push_str(self.name);
            out.push_str(suffix);
            out.push(' ');
            out.push_str(kind.classic());
            out.push('\n');
        }
    }
}

/// OpenMetrics HELP text as 0.0.4 HELP text: `\\` and `\n` stay escaped,
/// `\"` is a plain quote, and a backslash that escapes nothing 0.0.4 knows
/// is written as an escaped backslash.
fn push_help(out: &mut String, help: &str) {
    if !help.contains('\\') {
        out.push_str(help);
        return;
    }
    let mut chars = help.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('"') => out.push('"'),
            Some(e @ ('\\' | 'n')) => {
                out.push('\\');
                out.push(e);
            }
            Some(other) => {
                out.push_str("\\\\");
                out.push(other);
            }
            None => out.push_str("\\\\"),
        }
    }
}

/// The classic text format 0.0.4 of an OpenMetrics exposition (see the
/// module docs for the rules). Lines it does not understand are kept as
/// they are, so a fault shows as a parse error at the scraper rather than
/// as a missing series.
pub fn classic(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut family = Family::new("");
    for line in openmetrics.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix("# ") {
            let (keyword, rest) = comment.split_once(' ').unwrap_or((comment, ""));
            let (name, rest) = rest.split_once(' ').unwrap_or((rest, ""));
            match keyword {
                "EOF" => break,
                "HELP" | "TYPE" | "UNIT" => {
                    if name != family.name {
                        family.write_metadata(&mut out);
                        family = Family::new(name);
                    }
                    match keyword {
                        "HELP" => family.help = Some(rest),
                        "TYPE" => family.kind = Some(Kind::parse(rest)),
                        _ => {}
                    }
                }
                _ => {}
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        family.write_metadata(&mut out);
        sample(&mut out, line, &family);
    }
    family.write_metadata(&mut out);
    out
}

/// One sample line of `family`, written in the classic format (or left out).
fn sample(out: &mut String, line: &str, family: &Family<'_>) {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    let labels_end = if line[name_end..].starts_with('{') {
        match label_set_end(line, name_end) {
            Some(end) => end,
            None => return keep(out, line),
        }
    } else {
        name_end
    };
    let kind = family.kind();
    let suffix = name
        .strip_prefix(family.name)
        .and_then(|s| s.strip_prefix('_'));
    if kind.has_created() && suffix == Some("created") {
        return;
    }
    let mut tokens = line[labels_end..].split(' ').filter(|t| !t.is_empty());
    let Some(value) = tokens.next() else {
        return keep(out, line);
    };
    let timestamp = tokens.next().filter(|t| *t != "#");
    let renamed = match (kind, suffix) {
        (Kind::GaugeHistogram, Some("gsum")) => Some("_sum"),
        (Kind::GaugeHistogram, Some("gcount")) => Some("_count"),
        _ => None,
    };
    match renamed {
        Some(suffix) => {
            out.push_str(family.name);
            out.push_str(suffix);
        }
        None => out.push_str(name),
    }
    out.push_str(&line[name_end..labels_end]);
    out.push(' ');
    out.push_str(value);
    if let Some(ms) = timestamp.and_then(milliseconds) {
        let _ = write!(out, " {ms}");
    }
    out.push('\n');
}

fn keep(out: &mut String, line: &str) {
    out.push_str(line);
    out.push('\n');
}

/// The byte just past the `}` closing the label set that opens at `open`,
/// skipping quoted label values (with their escapes).
fn label_set_end(line: &str, open: usize) -> Option<usize> {
    let bytes = line.as_bytes();
    let mut quoted = false;
    let mut i = open + 1;
    while i < bytes.len() {
        match (quoted, bytes[i]) {
            (true, b'\\') => i += 1,
            (_, b'"') => quoted = !quoted,
            (false, b'}') => return Some(i + 1),
            _ => {}
        }
        i += 1;
    }
    None
}

/// An OpenMetrics timestamp (seconds) in milliseconds, rounded.
fn milliseconds(seconds: &str) -> Option<i64> {
    let ms = (seconds.parse::<f64>().ok()? * 1000.0).round();
    (ms.is_finite() && ms.abs() < 9.0e18).then_some(ms as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_follows_the_accept_header() {
        let om = Format::OpenMetrics { v0_0_1: false };
        let om_0 = Format::OpenMetrics { v0_0_1: true };
        let cases: &[(&[&str], Format)] = &[
            (&[], Format::Classic),
            (&["*/*"], Format::Classic),
            (&["text/plain"], Format::Classic),
            (&["text/plain; version=0.0.4"], Format::Classic),
            (&["application/json"], Format::Classic),
            (&["application/openmetrics-text"], om),
            (&["Application/OpenMetrics-Text; Version=1.0.0"], om),
            (&["application/openmetrics-text; version=\"1.0.0\""], om),
            (&["application/openmetrics-text; version=0.0.1"], om_0),
            (&["application/openmetrics-text; version=2.0.0"], Format::Classic),
            (&["application/openmetrics-text;q=0"], Format::Classic),
            (&["application/openmetrics-text;q=0.4, text/plain;q=0.5"], Format::Classic),
            (&["application/openmetrics-text;q=0.5, text/plain;q=0.4"], om),
            (&["application/openmetrics-text, */*"], om),
            (&["*/*;q=1, application/openmetrics-text;q=0"], Format::Classic),
            (&["application/*"], om),
            (&["text/plain;q=0.5", "application/openmetrics-text"], om),
            // Prometheus 2.x, older 2.x, and 3.x (protobuf first, which
            // we do not speak; text/plain 1.0.0, which we do not either).
            (
                &["application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"],
                om,
            ),
            (
                &["application/openmetrics-text;version=0.0.1,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"],
                om_0,
            ),
            (
                &["application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5,application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.4,application/openmetrics-text;version=0.0.1;q=0.3,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.2,text/plain;version=0.0.4;q=0.1,*/*;q=0.05"],
                om,
            ),
            // A range with an unreadable q is skipped.
            (&["application/openmetrics-text;q=high"], Format::Classic),
            (&["garbage, ;;, /, a/b;q"], Format::Classic),
        ];
        for (accept, want) in cases {
            assert_eq!(
                Format::negotiate(accept.iter().copied()),
                *want,
                "{accept:?}"
            );
        }
    }

    #[test]
    fn quality_values() {
        for (text, want) in [
            ("0", Some(0)),
            ("1", Some(1000)),
            ("1.000", Some(1000)),
            ("0.5", Some(500)),
            ("0.75", Some(750)),
            ("0.001", Some(1)),
            ("1.5", None),
            ("0.0001", None),
            ("2", None),
            ("", None),
            ("0.a", None),
            ("-0", None),
        ] {
            assert_eq!(quality(text), want, "{text:?}");
        }
    }

    #[test]
    fn counters_gauges_and_histograms_from_prometheus_client() {
        let om = "\
# HELP waitroom_decisions Decisions.
# TYPE waitroom_decisions counter
waitroom_decisions_total{room=\"shop\",outcome=\"admitted\"} 2
waitroom_decisions_created{room=\"shop\",outcome=\"admitted\"} 1700000000.5
# HELP waitroom_store_up 1 while the store answers.
# TYPE waitroom_store_up gauge
waitroom_store_up 1
# HELP waitroom_latency_seconds Time.
# TYPE waitroom_latency_seconds histogram
# UNIT waitroom_latency_seconds seconds
waitroom_latency_seconds_sum{room=\"shop\"} 0.25
waitroom_latency_seconds_count{room=\"shop\"} 3
waitroom_latency_seconds_bucket{le=\"0.0001\",room=\"shop\"} 0
waitroom_latency_seconds_bucket{le=\"+Inf\",room=\"shop\"} 3 # {trace=\"a}b\"} 0.2 1700000000.1
waitroom_latency_seconds_created{room=\"shop\"} 1700000000
# HELP waitroom_region_grant Grant.
# TYPE waitroom_region_grant gauge
# EOF
";
        let want = "\
# HELP waitroom_decisions_total Decisions.
# TYPE waitroom_decisions_total counter
waitroom_decisions_total{room=\"shop\",outcome=\"admitted\"} 2
# HELP waitroom_store_up 1 while the store answers.
# TYPE waitroom_store_up gauge
waitroom_store_up 1
# HELP waitroom_latency_seconds Time.
# TYPE waitroom_latency_seconds histogram
waitroom_latency_seconds_sum{room=\"shop\"} 0.25
waitroom_latency_seconds_count{room=\"shop\"} 3
waitroom_latency_seconds_bucket{le=\"0.0001\",room=\"shop\"} 0
waitroom_latency_seconds_bucket{le=\"+Inf\",room=\"shop\"} 3
# HELP waitroom_region_grant Grant.
# TYPE waitroom_region_grant gauge
";
        assert_eq!(classic(om), want);
    }

    #[test]
    fn info_stateset_gaugehistogram_unknown_and_untyped() {
        let om = "\
# TYPE build info
# HELP build Build \\\"facts\\\" \\\\ and\\nlines.
build_info{version=\"1.0\"} 1
# TYPE mode stateset
mode{mode=\"a\"} 1
mode{mode=\"b\"} 0
# TYPE queue gaugehistogram
queue_bucket{le=\"+Inf\"} 4
queue_gcount 4
queue_gsum 9.5
# TYPE odd unknown
odd 7 1520879607.789
bare{a=\"x\\\"}\"} NaN
# EOF
";
        let want = "\
# HELP build_info Build \"facts\" \\\\ and\\nlines.
# TYPE build_info gauge
build_info{version=\"1.0\"} 1
# TYPE mode gauge
mode{mode=\"a\"} 1
mode{mode=\"b\"} 0
# TYPE queue histogram
queue_bucket{le=\"+Inf\"} 4
queue_count 4
queue_sum 9.5
# TYPE odd untyped
odd 7 1520879607789
bare{a=\"x\\\"}\"} NaN
";
        assert_eq!(classic(om), want);
    }

    #[test]
    fn help_escapes() {
        let mut out = String::new();
        push_help(&mut out, r#"a \" b \\ c \n d \t e \"#);
        assert_eq!(out, r#"a " b \\ c \n d \\t e \\"#);
    }

    #[test]
    fn malformed_lines_are_kept_and_nothing_follows_eof() {
        let om = "x{a=\"1\" 2\n# TYPE y gauge\ny\n# EOF\nz 1\n";
        assert_eq!(classic(om), "x{a=\"1\" 2\n# TYPE y gauge\ny\n");
    }

    #[test]
    fn the_daemons_own_exposition_converts() {
        let metrics = crate::telemetry::Metrics::new();
        let room = metrics.room("shop");
        room.admitted.inc();
        room.decision_latency.observe(0.002);
        metrics.response(http::StatusCode::OK);
        let om = metrics.encode(Format::OpenMetrics { v0_0_1: false });
        let text = metrics.encode(Format::Classic);
        assert!(om.ends_with("# EOF\n"), "{om}");
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE waitroom_decisions_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE waitroom_store_errors_total counter\n"),
            "{text}"
        );
        assert!(text.contains("waitroom_decisions_total{room=\"shop\",outcome=\"admitted\"} 1\n"));
        // Every sample line is the same in both.
        let samples = |s: &str| -> Vec<String> {
            s.lines()
                .filter(|l| !l.starts_with('#'))
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(samples(&om), samples(&text));
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_any_text(input in ".*") {
            let _ = classic(&input);
        }

        #[test]
        fn never_panics_on_exposition_like_text(
            lines in proptest::collection::vec(
                r#"(# (HELP|TYPE|UNIT|EOF) ?)?[a-z_]{0,6}(_total|_created|_gsum|_info)?(\{([a-z]+="([^"\\]|\\.)*",?)*\}?)? ?[0-9.e+-]{0,6} ?(# \{[^}]*\} ?[0-9.]*)? ?[0-9.]{0,4}"#,
                0..12,
            ),
            accept in r#"[a-z*/;=.,0-9 "]{0,40}"#,
        ) {
            let _ = classic(&lines.join("\n"));
            let _ = Format::negotiate([accept.as_str()]);
        }
    }
}
