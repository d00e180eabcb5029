//! Three daemon processes (the real binary) sharing one Redis: the limits
//! and the queue order hold across instances.
//!
//! Separate processes cannot share the tests' manual clock, so this file lets
//! a few seconds of real time pass for sessions to end; every other test
//! moves a clock instead.

#[path = "support/redis_server.rs"]
mod redis_server;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use redis_server::{RedisCluster, RedisServer};

const KEY: &str = "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=";
const SESSION_SECS: u64 = 3;

/// The two scenarios each run three daemons and 600 clients: one at a time,
/// so neither starves the other of the machine's cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One `waitroom run` process, killed on drop.
struct Instance {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Instance {
    /// Starts the binary and reads the bound address from its JSON log.
    fn start(redis_urls: &[String], origin: &str) -> Self {
        let urls: Vec<String> = redis_urls.iter().map(|u| format!("\"{u}\"")).collect();
        let redis_url = format!("[{}]", urls.join(", "));
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("waitroom.toml");
        std::fs::write(
            &config,
            format!(
                r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[store]
backend = "redis"
url = {redis_url}
timeout = "2s"
fail_mode = "closed"
[cookie]
keys = ["{KEY}"]
secure = false
[origin]
url = "{origin}"
[[room]]
id = "drop"
path = "/"
total_active_users = 100
new_users_per_minute = 10000
session_duration = "{SESSION_SECS}s"
session_renewal = false
refresh_interval = "2s"
abandon_after = "60s"
"#
            ),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_waitroom"))
            .args(["--log-format", "json", "run", "--config"])
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start waitroom");
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = loop {
            assert!(Instant::now() < deadline, "waitroom did not start");
            let line = lines.next().expect("waitroom exited early").unwrap();
            let Ok(log) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if let Some(addr) = log["fields"]["addr"].as_str() {
                break addr.to_owned();
            }
        };
        // Keep draining the log so the process never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Self {
            child,
            addr,
            _dir: dir,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

/// The ticket cookie a response set.
fn ticket(resp: &reqwest::Response) -> String {
    resp.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("waitroom_drop="))
        .and_then(|v| v.split(';').next())
        .expect("a ticket")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_on_one_redis_admit_exactly_the_limit_and_keep_fifo() {
    let redis = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    scenario(vec![redis.url()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_on_redis_cluster_admit_exactly_the_limit_and_keep_fifo() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    scenario(cluster.urls()).await;
}

async fn scenario(redis_urls: Vec<String>) {
    let _one_at_a_time = SERIAL.lock().await;
    let origin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin_addr = origin.local_addr().unwrap();
    tokio::spawn(waitroom::demo::serve(origin));
    let origin_url = format!("http://{origin_addr}");
    let instances: Arc<Vec<Instance>> = Arc::new(
        tokio::task::spawn_blocking(move || {
            (0..3)
                .map(|_| Instance::start(&redis_urls, &origin_url))
                .collect()
        })
        .await
        .unwrap(),
    );
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap();

    // 600 brand-new visitors at once, spread over the three instances.
    let mut tasks = Vec::new();
    for i in 0..600 {
        let (instances, client) = (instances.clone(), client.clone());
        tasks.push(tokio::spawn(async move {
            let resp = client
                .get(instances[i % 3].url("/item?x=1"))
                .header("accept", "application/json")
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            let cookie = ticket(&resp);
            let queued = resp.headers().get("content-type").map(|v| v.as_bytes())
                == Some(b"application/json");
            let position = if queued {
                let s: serde_json::Value = resp.json().await.unwrap();
                assert_eq!(s["state"], "queued");
                Some(s["position"].as_u64().unwrap())
            } else {
                None
            };
            (cookie, position)
        }));
    }
    let mut visitors = Vec::new();
    for t in tasks {
        visitors.push(t.await.unwrap());
    }
    let admitted = visitors.iter().filter(|(_, p)| p.is_none()).count();
    assert_eq!(
        admitted, 100,
        "exactly total_active_users admitted across instances"
    );
    let mut positions: Vec<u64> = visitors.iter().filter_map(|(_, p)| *p).collect();
    positions.sort_unstable();
    assert_eq!(
        positions,
        (1..=500).collect::<Vec<_>>(),
        "distinct places, nobody lost"
    );

    // Let the first 100 sessions end (real time: separate processes).
    tokio::time::sleep(Duration::from_millis(SESSION_SECS * 1000 + 300)).await;

    // The queued visitors poll in random order through random instances.
    let mut queued: Vec<(String, u64)> = visitors
        .into_iter()
        .filter_map(|(c, p)| p.map(|p| (c, p)))
        .collect();
    queued.shuffle(&mut rand::thread_rng());
    let mut tasks = Vec::new();
    for (i, (cookie, position)) in queued.into_iter().enumerate() {
        let (instances, client) = (instances.clone(), client.clone());
        let pick = (i * 7 + position as usize) % 3;
        tasks.push(tokio::spawn(async move {
            let s: serde_json::Value = client
                .get(instances[pick].url("/__waitroom/status?room=drop"))
                .header("cookie", cookie)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            (position, s["state"].as_str().unwrap().to_owned())
        }));
    }
    let mut now_admitted = BTreeSet::new();
    for t in tasks {
        let (position, state) = t.await.unwrap();
        match state.as_str() {
            "admitted" => {
                now_admitted.insert(position);
            }
            "queued" => {}
            other => panic!("unexpected state {other}"),
        }
    }
    assert_eq!(
        now_admitted,
        (1..=100).collect::<BTreeSet<_>>(),
        "exactly the first 100 in line, whatever instance they polled"
    );
}
