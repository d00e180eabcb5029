//! The real binary: `check` exit codes, SIGHUP reloads the config file,
//! SIGTERM drains and exits 0.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KEY: &str = "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=";

fn config(rooms: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\naccess_log = true\ntrusted_proxies = [\"127.0.0.1/32\"]\n[cookie]\nkeys = [\"{KEY}\"]\nsecure = false\n[origin]\nurl = \"http://127.0.0.1:9\"\n{rooms}"
    )
}

const ONE: &str =
    "[[room]]\nid = \"shop\"\npath = \"/\"\ntotal_active_users = 5\nnew_users_per_minute = 100\n";

fn signal(name: &str, pid: u32) {
    let ok = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(ok.success());
}

#[test]
fn check_exits_64_on_a_bad_config_and_0_on_a_good_one() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(&good, config(ONE)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .args(["check", "--config"])
        .arg(&good)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        config(&ONE.replace("total_active_users = 5", "total_active_users = -5")),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .args(["check", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("room[0].total_active_users"));
    let out = Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .args(["run", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn sighup_reloads_and_sigterm_drains_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("waitroom.toml");
    std::fs::write(&path, config(ONE)).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .args(["--log-format", "json", "run", "--config"])
        .arg(&path)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut wait_for = |needle: &str| -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(Instant::now() < deadline, "no log line with {needle}");
            let line = lines.next().expect("log ended").unwrap();
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                if v["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(needle))
                {
                    return v;
                }
            }
        }
    };
    let started = wait_for("waitroom listening");
    let admin = started["fields"]["admin_addr"].as_str().unwrap().to_owned();
    let addr = started["fields"]["addr"].as_str().unwrap().to_owned();

    // The access log: one line per visitor request (the origin is down: 502).
    // From a trusted proxy: the client it names and its request id.
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", &format!("http://{addr}/hello")])
        .args([
            "-H",
            "X-Forwarded-For: 203.0.113.7",
            "-H",
            "X-Request-Id: req-42",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let line = wait_for("access");
    assert_eq!(line["target"], "waitroom::access");
    let f = &line["fields"];
    assert_eq!(
        (f["path"].as_str(), f["status"].as_u64()),
        (Some("/hello"), Some(502))
    );
    assert_eq!(
        (f["room"].as_str(), f["outcome"].as_str()),
        (Some("shop"), Some("admitted"))
    );
    assert_eq!(
        (f["client"].as_str(), f["peer"].as_str(), f["id"].as_str()),
        (Some("203.0.113.7"), Some("127.0.0.1"), Some("req-42"))
    );
    assert!(f["ms"].as_f64().is_some());
    let rooms = |admin: &str| -> usize {
        let out = Command::new("curl")
            .args(["-s", &format!("http://{admin}/api/rooms")])
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!(rooms(&admin), 1);

    let two = format!("{ONE}[[room]]\nid = \"vip\"\npath = \"/vip\"\ntotal_active_users = 1\nnew_users_per_minute = 10\n");
    std::fs::write(&path, config(&two)).unwrap();
    signal("HUP", child.id());
    wait_for("configuration reloaded");
    assert_eq!(rooms(&admin), 2);

    // A broken file on SIGHUP is refused; the daemon keeps running.
    std::fs::write(&path, "not toml [").unwrap();
    signal("HUP", child.id());
    wait_for("reload refused");
    assert_eq!(rooms(&admin), 2);

    signal("TERM", child.id());
    wait_for("stopped");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
}
