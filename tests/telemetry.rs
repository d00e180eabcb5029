//! Telemetry as the operator's stack reads it: `/metrics` in both text
//! formats, each checked by Prometheus' own `promtool`, and the Grafana
//! dashboard in `deploy/grafana/` asking only for metrics the daemon
//! exports.
//!
//! `promtool` (Debian's `prometheus` package) must be installed: these
//! tests fail without it rather than skip. The dashboard's test starts two
//! throwaway `redis-server`s for region mode's metrics.

#[path = "support/redis_server.rs"]
mod redis_server;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use redis_server::RedisServer;
use support::{from_origin, Harness};
use waitroom::config::{Backend, RegionConfig};
use waitroom::store::End;
use waitroom::telemetry::exposition::{CLASSIC, OPENMETRICS_1_0_0};

/// What Prometheus 2.x sends when it scrapes (Debian's 2.42 included).
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// A daemon whose room has seen every kind of decision: two visitors
/// admitted, one queued and then let in from the queue (a time in queue),
/// one turned away by the full queue, and the figures refreshed.
async fn busy_room() -> Harness {
    let h = Harness::start(|c| {
        c.rooms[0].total_active_users = 2;
        c.rooms[0].max_queue_length = 1;
        c.rooms[0].abandon_after = Duration::from_secs(3600);
        c.rooms[0].session_duration = Duration::from_secs(3600);
    })
    .await;
    let first = h.visitor();
    let holder = support::admitted_id(first.get(h.url("/")).send().await.unwrap()).await;
    let second = h.visitor();
    assert!(from_origin(&second.get(h.url("/")).send().await.unwrap()));
    let waiting = h.visitor();
    assert!(!from_origin(&waiting.get(h.url("/")).send().await.unwrap()));
    let turned_away = h.visitor();
    assert!(!from_origin(
        &turned_away.get(h.url("/")).send().await.unwrap()
    ));
    h.clock.advance(Duration::from_secs(30));
    assert!(h
        .store()
        .end(&h.policy(), holder, End::Release, h.clock_now())
        .await
        .unwrap());
    assert_eq!(h.status(&waiting).await["state"], "admitted");
    h.daemon.gate().refresh_room_figures().await;
    h
}

/// `/metrics` with this `Accept` (none if `None`): content type and body.
async fn scrape(h: &Harness, accept: Option<&str>) -> (String, String) {
    let mut req = h.bare().get(h.admin_url("/metrics"));
    if let Some(accept) = accept {
        req = req.header("accept", accept);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let content_type = resp.headers()["content-type"].to_str().unwrap().to_owned();
    (content_type, resp.text().await.unwrap())
}

/// Runs promtool with `args` and `stdin`: whether it succeeded, and what it
/// printed (stdout and stderr).
fn promtool(args: &[&str], stdin: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs (Debian's prometheus package; see scripts/test)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), printed)
}

/// Runs promtool with `args` (no input): whether it succeeded, and what it
/// printed.
fn promtool_args(args: &[&std::ffi::OsStr]) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .output()
        .expect("promtool runs (Debian's prometheus package; see scripts/test)");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), printed)
}

/// A series as `promtool tsdb dump` names it (`__name__="x", a="b"`),
/// labels sorted and joined by commas. Label values here hold no commas.
fn normalized(series: &str) -> String {
    let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
    let mut labels: Vec<String> = labels
        .trim_end_matches('}')
        .split(',')
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    labels.push(format!("__name__=\"{name}\""));
    labels.sort_unstable();
    labels.join(",")
}

/// Every sample of an exposition: series (name and labels) to value.
fn samples(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_owned(), value.to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_format_passes_promtool_check_metrics() {
    let h = busy_room().await;
    for accept in [
        None,
        Some("*/*"),
        Some("text/plain"),
        Some("text/plain;version=0.0.4"),
    ] {
        let (content_type, text) = scrape(&h, accept).await;
        assert_eq!(content_type, CLASSIC, "{accept:?}");
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        assert!(!text.contains("_created"), "{text}");
    }
    let (_, text) = scrape(&h, None).await;
    for needle in [
        "# TYPE waitroom_decisions_total counter\n",
        "# HELP waitroom_decisions_total ",
        "# TYPE waitroom_decision_latency_seconds histogram\n",
        "# TYPE waitroom_room_active gauge\n",
        "waitroom_decisions_total{room=\"shop\",outcome=\"admitted\"} 3\n",
        "waitroom_decisions_total{room=\"shop\",outcome=\"queued\"} 1\n",
        "waitroom_decisions_total{room=\"shop\",outcome=\"rejected\"} 1\n",
        "waitroom_queue_wait_seconds_count{room=\"shop\"} 1\n",
        "waitroom_decision_latency_seconds_bucket{le=\"+Inf\",room=\"shop\"} 5\n",
        "waitroom_room_active{room=\"shop\"} 2\n",
        "waitroom_room_queued{room=\"shop\"} 0\n",
    ] {
        assert!(text.contains(needle), "{needle:?} not in\n{text}");
    }
    let (ok, printed) = promtool(&["check", "metrics"], &text);
    assert!(ok, "promtool check metrics refused it:\n{printed}\n{text}");
    assert_eq!(printed, "", "promtool's lint found problems:\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openmetrics_for_prometheus_parses_strictly_with_the_same_values() {
    let h = busy_room().await;
    let (content_type, om) = scrape(&h, Some(PROMETHEUS_ACCEPT)).await;
    assert_eq!(content_type, OPENMETRICS_1_0_0);
    assert!(om.ends_with("\n# EOF\n"), "{om}");
    // promtool's backfill reads OpenMetrics with the parser Prometheus
    // scrapes with (it wants `# EOF`, well-formed metadata, labels and
    // values). It also wants a timestamp on each sample, which a scrape
    // has not: one is added, and nothing else touched.
    assert!(!om.contains(" # "), "no exemplars expected: {om}");
    let at = 1_700_000_000u64;
    let stamped: String = om
        .lines()
        .map(|l| match l.starts_with('#') {
            true => format!("{l}\n"),
            false => format!("{l} {at}\n"),
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("scrape.om");
    std::fs::write(&file, &stamped).unwrap();
    let blocks = dir.path().join("blocks");
    let (ok, printed) = promtool_args(&[
        "tsdb".as_ref(),
        "create-blocks-from".as_ref(),
        "openmetrics".as_ref(),
        file.as_os_str(),
        blocks.as_os_str(),
    ]);
    assert!(
        ok,
        "promtool refused the OpenMetrics scrape:\n{printed}\n{om}"
    );
    // Every sample went in, with its value (the dump opens the blocks as
    // a database, which wants a WAL directory, empty here).
    std::fs::create_dir_all(blocks.join("wal")).unwrap();
    let (ok, dump) = promtool_args(&["tsdb".as_ref(), "dump".as_ref(), blocks.as_os_str()]);
    assert!(ok, "{dump}");
    let stored: BTreeMap<String, f64> = dump
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            let (series, rest) = l.split_once("} ").unwrap();
            let (value, ts) = rest.split_once(' ').unwrap();
            assert_eq!(ts, (at * 1000).to_string(), "{l}");
            let mut labels: Vec<&str> = series[1..].split(", ").collect();
            labels.sort_unstable();
            (labels.join(","), value.parse().unwrap())
        })
        .collect();
    let sent: BTreeMap<String, f64> = samples(&om)
        .into_iter()
        .map(|(series, value)| (normalized(&series), value.parse().unwrap()))
        .collect();
    assert_eq!(stored, sent);
    let (_, text) = scrape(&h, None).await;
    let (om_samples, text_samples) = (samples(&om), samples(&text));
    assert!(om_samples.len() > 50, "{om}");
    assert_eq!(om_samples, text_samples);
}

/// The names a scrape's samples may have: each family's, as the classic
/// format types it (a counter's with `_total`), and a histogram's
/// `_bucket`, `_sum` and `_count`.
fn exported(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        match kind {
            "histogram" | "summary" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

/// PromQL words that are not metric names.
const KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
];

/// The metric names a PromQL expression reads: every name outside label
/// matchers, strings, ranges and Grafana variables that is not a
/// function, an aggregation (`sum by (x) (...)` too), a keyword or the
/// label list of `by (...)` and its kin.
fn metric_names(expr: &str) -> Vec<String> {
    let b = expr.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut names = Vec::new();
    let mut braces = 0usize;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b'"' | b'\'' | b'`' => {
                i += 1;
                while i < b.len() && b[i] != c {
                    i += if b[i] == b'\\' && c != b'`' { 2 } else { 1 };
                }
                i += 1;
            }
            b'[' => i += expr[i..].find(']').map_or(b.len(), |n| n + 1),
            b'{' => {
                braces += 1;
                i += 1;
            }
            b'}' => {
                braces = braces.saturating_sub(1);
                i += 1;
            }
            // A Grafana variable: `$room`, `${room}`, `$__rate_interval`.
            b'$' => {
                i += 1;
                if b.get(i) == Some(&b'{') {
                    i += expr[i..].find('}').map_or(b.len(), |n| n + 1);
                } else {
                    while i < b.len() && word(b[i]) {
                        i += 1;
                    }
                }
            }
            b'0'..=b'9' | b'.' => {
                while i < b.len() && (word(b[i]) || b[i] == b'.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c == b':' => {
                let start = i;
                while i < b.len() && word(b[i]) {
                    i += 1;
                }
                let name = &expr[start..i];
                // A function or an aggregation: `f(`, `sum by (...) (`.
                let next = expr[i..].trim_start();
                let modifier = |m: &str| {
                    next.strip_prefix(m)
                        .is_some_and(|r| !r.bytes().next().is_some_and(word))
                };
                let call = next.starts_with('(') || modifier("by") || modifier("without");
                let grouping = matches!(
                    name,
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                );
                if grouping && call {
                    // Its label list.
                    i += expr[i..].find(')').map_or(b.len() - i, |n| n + 1);
                } else if braces == 0 && !call && !KEYWORDS.contains(&name) {
                    names.push(name.to_owned());
                }
            }
            _ => i += 1,
        }
    }
    names
}

#[test]
fn promql_metric_names_are_found() {
    let cases: &[(&str, &[&str])] = &[
        ("up", &["up"]),
        (
            r#"histogram_quantile(0.99, sum by (room, le) (rate(a_bucket{room=~"$room",x="y}"}[$__rate_interval])))"#,
            &["a_bucket"],
        ),
        (
            "sum(rate(a_total[5m])) by (job) / on (job) group_left (x) b offset 1h * 60",
            &["a_total", "b"],
        ),
        (
            "max without (instance) (c{d='e'}) > bool 1e3 or ${var} and nan",
            &["c"],
        ),
        (r#"{__name__="hidden"} + x:y:z"#, &["x:y:z"]),
    ];
    for (expr, want) in cases {
        assert_eq!(metric_names(expr), *want, "{expr}");
    }
}

/// A daemon in region mode (a regional and a global redis-server on free
/// loopback ports) whose region families all have samples: a sync gave
/// it its grants, and a visitor beyond its grant took an Anywhere slot.
async fn region_metrics() -> String {
    let spawn = || tokio::task::spawn_blocking(RedisServer::start);
    let (global, regional) = (spawn().await.unwrap(), spawn().await.unwrap());
    let h = Harness::start(|c| {
        c.store.backend = Backend::Redis {
            urls: vec![regional.url()],
        };
        c.region = Some(RegionConfig {
            name: "eu".into(),
            global_url: global.url(),
            sync_interval: Duration::from_millis(50),
        });
        c.rooms[0].total_active_users = 10;
        c.rooms[0].new_users_per_minute = 600;
        c.rooms[0].session_duration = Duration::from_secs(3600);
    })
    .await;
    let mut rounds = h.daemon.region().expect("region mode").rounds();
    h.clock.advance(Duration::from_millis(50));
    let now = h.clock_now();
    tokio::time::timeout(Duration::from_secs(20), rounds.wait_for(|t| *t >= now))
        .await
        .expect("a sync round in time")
        .expect("the sync task runs");
    // The sync keeps a fifth of the free slots in the Anywhere pool: the
    // visitors past the region's grant take from it.
    for _ in 0..10 {
        h.visitor().get(h.url("/")).send().await.unwrap();
        let (_, text) = scrape(&h, None).await;
        if text.contains("waitroom_region_anywhere_slots_total{") {
            return text;
        }
    }
    panic!("no Anywhere slot taken:\n{}", scrape(&h, None).await.1);
}

/// `/metrics` of a room with a priority lane.
async fn lane_metrics() -> String {
    let h = Harness::start(|c| {
        c.rooms[0].lanes = vec![waitroom::config::LaneConfig {
            name: "presale".into(),
            share: 300,
            codes: std::collections::HashSet::from([waitroom::domain::digest64("CODE")]),
            single_use: Default::default(),
            token_claim: false,
        }];
    })
    .await;
    scrape(&h, None).await.1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grafana_dashboard_reads_only_exported_metrics() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/waitroom.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();

    // What the daemon exports, central and region mode.
    let h = busy_room().await;
    let (_, text) = scrape(&h, None).await;
    let mut names = exported(&text);
    names.extend(exported(&region_metrics().await));
    names.extend(exported(&lane_metrics().await));
    for name in [
        "waitroom_decisions_total",
        "waitroom_lane_decisions_total",
        "waitroom_queue_wait_seconds_bucket",
        "waitroom_region_grant",
        "waitroom_region_anywhere_slots_total",
    ] {
        assert!(names.contains(name), "{name} not in {names:?}");
    }

    // Grafana's import asks for the Prometheus data source; the panels
    // follow the `datasource` variable and the `room` variable.
    assert_eq!(dashboard["__inputs"][0]["name"], "DS_PROMETHEUS");
    assert_eq!(dashboard["__inputs"][0]["pluginId"], "prometheus");
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let variable = |name: &str| {
        variables
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no {name} variable"))
    };
    assert_eq!(variable("datasource")["type"], "datasource");
    assert_eq!(variable("datasource")["query"], "prometheus");
    let room_query = variable("room")["definition"].as_str().unwrap();
    let room_metric = room_query
        .strip_prefix("label_values(")
        .and_then(|q| q.split_once(','))
        .map(|(metric, _)| metric.trim())
        .unwrap();
    assert!(names.contains(room_metric), "{room_query}");

    // Every panel (rows hold their own when collapsed) reads something,
    // every expression reads exported metrics only, and is PromQL that
    // Prometheus parses (promtool checks them as recording rules).
    let mut panels: Vec<&serde_json::Value> = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            panels.extend(panel["panels"].as_array().unwrap());
        } else {
            panels.push(panel);
        }
    }
    assert!(panels.len() >= 12, "{}", panels.len());
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let mut unknown = Vec::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap();
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().map_or(&[][..], Vec::as_slice);
        assert!(!targets.is_empty(), "panel {title:?} has no target");
        for target in targets {
            let expr = target["expr"].as_str().unwrap();
            let read = metric_names(expr);
            assert!(!read.is_empty(), "{title:?}: {expr} reads no metric");
            unknown.extend(
                read.into_iter()
                    .filter(|n| !names.contains(n))
                    .map(|n| format!("{title:?}: {n} in {expr}")),
            );
            let expr = expr
                .replace("$__rate_interval", "5m")
                .replace("$room", ".+");
            let _ = writeln!(
                rules,
                "      - record: dashboard:expr\n        expr: {}",
                serde_json::Value::from(expr)
            );
        }
    }
    assert!(unknown.is_empty(), "not exported:\n{}", unknown.join("\n"));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard.rules.yml");
    std::fs::write(&file, &rules).unwrap();
    let (ok, printed) = promtool_args(&["check".as_ref(), "rules".as_ref(), file.as_os_str()]);
    assert!(ok, "{printed}\n{rules}");

    // The check can fail: a misspelt name is caught.
    let typo = metric_names("sum(rate(waitroom_decision_total[5m]))");
    assert!(typo.iter().any(|n| !names.contains(n)), "{typo:?}");
}
