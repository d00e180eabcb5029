//! Telemetry as the operator's stack reads it: `/metrics` in both text
//! formats, each checked by Prometheus' own `promtool`.
//!
//! `promtool` (Debian's `prometheus` package) must be installed: these
//! tests fail without it rather than skip.

mod support;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{from_origin, Harness};
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
        .release(&h.policy(), holder, h.clock_now())
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
