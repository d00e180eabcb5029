//! `waitroom simulate`: a flash crowd run against the real memory store and
//! ETA estimator on a virtual clock. The limits hold, every visitor is
//! accounted for, the summary adds up, the chart is well-formed SVG, and the
//! command line writes both.

use std::process::Command;
use std::time::Duration;

use waitroom::config::{self, LoadOptions, RoomConfig};
use waitroom::simulate::{self, Crowd, Outcome};
use waitroom::store::memory::MemoryStore;

fn room(limits: &str) -> RoomConfig {
    let src = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n[origin]\nurl = \"http://127.0.0.1:9\"\n\
         [[room]]\nid = \"drop\"\npath = \"/\"\n{limits}\nsession_duration = \"2m\"\nrefresh_interval = \"5s\"\nabandon_after = \"30s\"\n"
    );
    let options = LoadOptions {
        allow_missing_keys: true,
    };
    let mut c = config::from_toml_str_with(&src, options, &|_| None).unwrap();
    c.rooms.remove(0)
}

fn crowd(peak: f64) -> Crowd {
    Crowd {
        peak_per_second: peak,
        ramp: Duration::from_secs(20),
        duration: Duration::from_secs(90),
        time_on_site: Duration::from_secs(20),
        abandon: 0.1,
        seed: 5,
    }
}

async fn simulate(room: &RoomConfig, crowd: &Crowd) -> Outcome {
    simulate::run(&MemoryStore::new(), room, crowd)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_drop_at_a_full_room_keeps_the_limit_and_accounts_for_everyone() {
    let room = room("total_active_users = 50\nnew_users_per_minute = 1000000");
    let crowd = crowd(20.0);
    let out = simulate(&room, &crowd).await;
    let s = &out.summary;
    println!("{s}");

    assert!(out.samples.iter().all(|x| x.active <= 50));
    assert_eq!(s.max_active, 50, "the room fills");
    // About peak × (duration − ramp) = 1,400 people.
    assert!((1_300..1_500).contains(&s.arrived), "{}", s.arrived);
    assert_eq!(s.arrived, s.admitted_at_once + s.queued + s.rejected);
    assert_eq!(s.rejected, 0);
    // Everyone who queued got in or gave up: nobody is left behind.
    assert_eq!(s.queued, s.admitted_from_queue + s.gave_up);
    assert_eq!(out.waits.len() as u64, s.queued);
    assert!(s.gave_up > 0 && s.gave_up < s.queued / 5, "{}", s.gave_up);
    // Without a rate limit the queue forms when the room is full.
    assert_eq!(s.utilization_when_queueing_started, Some(1.0));
    let formed = s.queue_formed_at.unwrap();
    assert!(formed > 0.0 && formed < 30.0, "{formed}");
    assert!(s.peak_queue > 500, "{}", s.peak_queue);
    let (median, longest) = (s.median_wait.unwrap(), s.longest_wait.unwrap());
    assert!(0.0 < median && median <= s.p90_wait.unwrap() && s.p90_wait.unwrap() <= longest);
    assert!(s.queue_empty_at.unwrap() <= s.simulated);
    assert!(formed + longest <= s.queue_empty_at.unwrap() + 1.0);
    // The estimate told on arrival is honest here too.
    assert!(s.eta_error_median.unwrap() <= 0.25, "{s}");
    assert!(s.largest_eta_jump.unwrap() < 10.0, "{s}");

    // The same seed, the same run.
    assert_eq!(simulate(&room, &crowd).await.summary, *s);
}

#[tokio::test]
async fn a_rate_limited_room_queues_before_it_is_full() {
    let room = room("total_active_users = 1000\nnew_users_per_minute = 300");
    let out = simulate(&room, &crowd(20.0)).await;
    let s = &out.summary;
    println!("{s}");
    assert!(out.samples.iter().all(|x| x.admitted_last_minute <= 300));
    assert_eq!(s.peak_admissions_per_minute, 300);
    let used = s.utilization_when_queueing_started.unwrap();
    assert!(used < 0.5, "{used}");
    assert_eq!(s.queued, s.admitted_from_queue + s.gave_up);
}

#[tokio::test]
async fn nobody_queues_when_the_room_keeps_up() {
    let room = room("total_active_users = 1000\nnew_users_per_minute = 1000000");
    let out = simulate(&room, &crowd(2.0)).await;
    let s = &out.summary;
    assert_eq!((s.queued, s.peak_queue), (0, 0));
    assert_eq!(s.queue_formed_at, None);
    assert_eq!(s.median_wait, None);
    assert!(s.to_string().contains("| queue formed at"));
    assert!(s.to_string().contains("never"));
}

#[tokio::test]
async fn a_paused_room_stops_the_run_instead_of_waiting_forever() {
    let room = room("total_active_users = 10\nnew_users_per_minute = 100\nstate = \"paused\"");
    let mut crowd = crowd(2.0);
    crowd.abandon = 0.0;
    let out = simulate(&room, &crowd).await;
    let s = &out.summary;
    assert!(s.stopped_early);
    assert_eq!(s.admitted_at_once + s.admitted_from_queue, 0);
    assert_eq!(s.queue_empty_at, None);
    assert!(s.simulated <= 90.0 + 30.0 * 60.0 + 1.0, "{}", s.simulated);
    assert!(
        s.to_string()
            .contains("not yet when the run stopped at 30:00"),
        "{s}"
    );
}

/// Checks that every tag is closed in order and that `&` only starts an
/// entity: enough to know a browser will draw the file.
fn assert_well_formed(svg: &str) {
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(svg.trim_end().ends_with("</svg>"));
    let mut open: Vec<&str> = vec![];
    let mut rest = svg;
    while let Some(start) = rest.find('<') {
        let end = start + rest[start..].find('>').expect("tag closes");
        let tag = &rest[start + 1..end];
        assert!(!tag.contains('<'), "{tag}");
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(open.pop(), Some(name), "closing {name}");
        } else if !tag.ends_with('/') {
            open.push(tag.split_whitespace().next().unwrap());
        }
        // Quotes balance inside the tag.
        assert_eq!(tag.matches('"').count() % 2, 0, "{tag}");
        rest = &rest[end + 1..];
    }
    assert!(open.is_empty(), "unclosed: {open:?}");
    for (i, _) in svg.match_indices('&') {
        let entity = &svg[i..svg.len().min(i + 6)];
        assert!(
            ["&amp;", "&lt;", "&gt;", "&quot;"]
                .iter()
                .any(|e| entity.starts_with(e)),
            "{entity}"
        );
    }
}

#[tokio::test]
async fn the_chart_is_well_formed_svg_with_every_panel() {
    let room = room("total_active_users = 50\nnew_users_per_minute = 300");
    let out = simulate(&room, &crowd(20.0)).await;
    let svg = simulate::chart::svg(&out);
    assert_well_formed(&svg);
    for text in [
        "Active sessions",
        "total_active_users (50)",
        "Queue",
        "Admissions a minute",
        "new_users_per_minute (300)",
        "rate behind the ETA",
        "told on arrival (ETA)",
        "real wait",
        "&quot;drop&quot;",
    ] {
        assert!(svg.contains(text), "{text}");
    }
    // Eight series; the ETA's rate is drawn only while someone waits.
    assert!(svg.matches("<polyline").count() >= 8);
}

#[test]
fn the_command_prints_the_summary_and_writes_the_chart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("waitroom.toml");
    std::fs::write(
        &path,
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n[origin]\nurl = \"http://127.0.0.1:9\"\n\
         [[room]]\nid = \"shop\"\npath = \"/\"\ntotal_active_users = 5\nnew_users_per_minute = 60\n\
         [[room]]\nid = \"drop\"\npath = \"/drop\"\ntotal_active_users = 40\nnew_users_per_minute = 600\nrefresh_interval = \"5s\"\n",
    )
    .unwrap();
    let svg = dir.path().join("sim.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .args([
            "simulate",
            "--room",
            "drop",
            "--visitors",
            "600",
            "--ramp",
            "10s",
        ])
        .args(["--duration", "40s", "--time-on-site", "15s", "--config"])
        .arg(&path)
        .arg("--out")
        .arg(&svg)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("| room "), "{stdout}");
    assert!(
        stdout.contains("drop (40 places, 600 a minute)"),
        "{stdout}"
    );
    assert!(stdout.contains("| peak queue"), "{stdout}");
    assert!(stdout.contains("| ETA told on arrival, error (median / p90)"));
    assert_well_formed(&std::fs::read_to_string(&svg).unwrap());

    // A room that is not there, and a share that is not one, are named.
    let out = Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .args(["simulate", "--room", "nope", "--peak", "5", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("no room \"nope\" in the config (rooms: shop, drop)"));
    let out = Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .args(["simulate", "--peak", "5", "--abandon", "2", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("--abandon must be a share between 0 and 1; got 2"));
    // A bad config file is a bad config, as for `check`.
    std::fs::write(&path, "[server]\nlisten = 5\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .args(["simulate", "--peak", "5", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
}
