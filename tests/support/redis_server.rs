//! Throwaway `redis-server` processes for tests and benches: a single node or
//! a 3-master Redis Cluster on free loopback ports, each in its own temporary
//! directory and killed on drop. Never touches the shared Redis on 6379.
//!
//! Include it with `#[path = "support/redis_server.rs"] mod redis_server;`.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const REDIS_SERVER: &str = "redis-server";
const REDIS_CLI: &str = "redis-cli";
/// How long a fresh server (or cluster) may take to answer.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// A port nobody listens on right now. Another process may take it before the
/// server binds it; `start` then retries on a new one.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

/// One `redis-server` process.
pub struct RedisServer {
    port: u16,
    /// Extra command-line options, kept so `restart` brings back the same server.
    args: Vec<String>,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a standalone server and waits until it answers PING.
    pub fn start() -> Self {
        Self::start_with(Vec::new())
    }

    /// Starts a server with extra options (e.g. cluster mode).
    pub fn start_with(args: Vec<String>) -> Self {
        for _ in 0..10 {
            let mut server = Self {
                port: free_port(),
                args: args.clone(),
                child: None,
                dir: tempfile::tempdir().expect("temp dir for redis-server"),
            };
            if server.spawn_and_wait() {
                return server;
            }
        }
        panic!("redis-server did not start on a free port (is {REDIS_SERVER} installed?)");
    }

    /// Spawns the process; false if it died (port taken) before answering.
    fn spawn_and_wait(&mut self) -> bool {
        let dir = self.dir.path();
        let mut cmd = Command::new(REDIS_SERVER);
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().expect("spawn redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + READY_WITHIN;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    self.child = None;
                    return false;
                }
            }
            if self.ping() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        false
    }

    fn ping(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200)) else {
            return false;
        };
        redis::cmd("PING").query::<String>(&mut conn).is_ok()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server is running").id()
    }

    /// A plain synchronous connection for setting up and inspecting a test.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .expect("client")
            .get_connection_with_timeout(Duration::from_secs(5))
            .expect("connect to test redis")
    }

    /// Runs one command and returns its reply.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut self.conn()).expect("redis command")
    }

    /// A field of `INFO`, e.g. `info_field("memory", "used_memory")`.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        let info: String = self.cmd(&["INFO", section]);
        info.lines().find_map(|l| {
            l.strip_prefix(&format!("{field}:"))
                .map(|v| v.trim().to_string())
        })
    }

    /// Freezes the process (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        signal("STOP", self.pid());
    }

    /// Undoes `pause` (SIGCONT).
    pub fn resume(&self) {
        signal("CONT", self.pid());
    }

    /// Kills the process; the port becomes free.
    pub fn stop(&mut self) {
        self.kill();
    }

    /// Starts the server again on the same port (with empty data).
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + READY_WITHIN;
        while Instant::now() < deadline {
            if self.spawn_and_wait() {
                return;
            }
            // The old socket may linger for a moment.
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL also ends a stopped process.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn signal(name: &str, pid: u32) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid} failed");
}

/// A Redis Cluster of three masters (no replicas) on loopback.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers, joins them with
    /// `redis-cli --cluster create` and waits until every node reports
    /// `cluster_state:ok`.
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                // The bus port is chosen explicitly (Redis 7) because the
                // default, port + 10000, may not be free or even valid.
                RedisServer::start_with(vec![
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-config-file".into(),
                    "nodes.conf".into(),
                    "--cluster-port".into(),
                    free_port().to_string(),
                    "--cluster-node-timeout".into(),
                    "5000".into(),
                ])
            })
            .collect();
        let mut create = Command::new(REDIS_CLI);
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port()));
        }
        let out = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Self { nodes };
        cluster.wait_ok();
        cluster
    }

    fn wait_ok(&self) {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            let ok = self.nodes.iter().all(|n| {
                let info: String = n.cmd(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "cluster never reached cluster_state:ok"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Seed URLs for a cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// How many keys each node holds.
    pub fn key_counts(&self) -> Vec<i64> {
        self.nodes.iter().map(|n| n.cmd(&["DBSIZE"])).collect()
    }
}
