//! Throwaway `redis-server` processes for tests and benches: a single node,
//! a replica, a Sentinel, or a 3-master Redis Cluster on free loopback
//! ports, each in its own temporary directory and killed on drop. Never
//! touches the shared Redis on 6379.
//!
//! `WR_REDIS_SERVER` names another server binary (Valkey's
//! `valkey-server`: `scripts/test` runs the Redis suites on both).
//!
//! Include it with `#[path = "support/redis_server.rs"] mod redis_server;`.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const REDIS_CLI: &str = "redis-cli";

/// The server binary: `WR_REDIS_SERVER`, else `redis-server`.
pub fn server_binary() -> String {
    std::env::var("WR_REDIS_SERVER")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".into())
}
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
        panic!(
            "{} did not start on a free port (is it installed?)",
            server_binary()
        );
    }

    /// Spawns the process; false if it died (port taken) before answering.
    fn spawn_and_wait(&mut self) -> bool {
        let dir = self.dir.path();
        let mut cmd = Command::new(server_binary());
        if self.args.first().is_some_and(|a| a.ends_with(".conf")) {
            // A config file (a Sentinel's) comes first.
            cmd.arg(&self.args[0]);
        }
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .args(self.args.iter().skip_while(|a| a.ends_with(".conf")))
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

    /// Starts a replica of `primary` and waits until it has synced.
    pub fn start_replica_of(primary: &RedisServer) -> Self {
        let replica = Self::start_with(vec![
            "--replicaof".into(),
            "127.0.0.1".into(),
            primary.port().to_string(),
            // A replica promoted by Sentinel answers at once.
            "--replica-serve-stale-data".into(),
            "yes".into(),
        ]);
        replica.wait_synced();
        replica
    }

    /// Waits until this replica's link to its primary is up.
    pub fn wait_synced(&self) {
        let deadline = Instant::now() + READY_WITHIN;
        while self
            .info_field("replication", "master_link_status")
            .as_deref()
            != Some("up")
        {
            assert!(Instant::now() < deadline, "the replica never synced");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `master` or `slave`, from `INFO replication`.
    pub fn role(&self) -> String {
        self.info_field("replication", "role").unwrap_or_default()
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

/// A Sentinel (`redis-server --sentinel`) monitoring `primary` as
/// [`Sentinel::MASTER`], quorum 1: it declares the primary down after
/// `down_after_ms` without an answer and promotes a replica.
pub struct Sentinel {
    pub server: RedisServer,
}

impl Sentinel {
    pub const MASTER: &'static str = "wr-primary";

    pub fn start(primary: &RedisServer, down_after_ms: u64) -> Self {
        // Sentinel rewrites its config file: one of its own, in a temp dir.
        let dir = tempfile::tempdir().expect("temp dir for the sentinel config");
        let conf = dir.path().join("sentinel.conf");
        let name = Self::MASTER;
        std::fs::write(
            &conf,
            format!(
                "sentinel monitor {name} 127.0.0.1 {port} 1\n\
                 sentinel down-after-milliseconds {name} {down_after_ms}\n\
                 sentinel failover-timeout {name} 5000\n\
                 sentinel parallel-syncs {name} 1\n",
                port = primary.port()
            ),
        )
        .expect("write sentinel.conf");
        let path = dir.keep().join("sentinel.conf");
        let server = RedisServer::start_with(vec![
            path.to_string_lossy().into_owned(),
            "--sentinel".into(),
        ]);
        Self { server }
    }

    /// The Sentinel's address, as `store.sentinels` takes it.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.server.port())
    }

    /// The port the Sentinel names as the primary's now.
    pub fn primary_port(&self) -> Option<u16> {
        let mut c = redis::cmd("SENTINEL");
        c.arg("GET-MASTER-ADDR-BY-NAME").arg(Self::MASTER);
        let reply: Option<(String, u16)> = c.query(&mut self.server.conn()).ok()?;
        reply.map(|(_, port)| port)
    }

    /// Waits until the Sentinel names `port` as the primary.
    pub fn wait_primary(&self, port: u16, within: Duration) -> Duration {
        let started = Instant::now();
        while self.primary_port() != Some(port) {
            assert!(
                started.elapsed() < within,
                "the Sentinel did not promote port {port} within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        started.elapsed()
    }
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
        Self::start_with(0, 5000)
    }

    /// Three masters with `replicas` replicas each (the masters are
    /// `nodes[..3]`), a node declared failed after `node_timeout_ms`.
    pub fn start_with(replicas: usize, node_timeout_ms: u64) -> Self {
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
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
                    node_timeout_ms.to_string(),
                ])
            })
            .collect();
        let mut create = Command::new(REDIS_CLI);
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port()));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Self { nodes };
        cluster.wait_ok();
        for n in &cluster.nodes {
            // A replica counts once it has synced with its primary.
            let deadline = Instant::now() + READY_WITHIN;
            while n.role() == "slave"
                && n.info_field("replication", "master_link_status").as_deref() != Some("up")
            {
                assert!(Instant::now() < deadline, "a replica never synced");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        cluster
    }

    fn wait_ok(&self) {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            let known = format!("cluster_known_nodes:{}", self.nodes.len());
            let ok = self.nodes.iter().all(|n| {
                let info: String = n.cmd(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok") && info.contains(&known)
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

    /// The node that serves `key`'s slot as primary now.
    pub fn primary_of(&self, key: &str) -> usize {
        let slot: i64 = self.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key]);
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            for (i, n) in self.nodes.iter().enumerate() {
                if n.child.is_none() {
                    continue;
                }
                let Ok(nodes) = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query::<String>(&mut n.conn())
                else {
                    continue;
                };
                let me = nodes.lines().find(|l| l.contains("myself")).unwrap_or("");
                if me.contains("master") && owns_slot(me, slot) {
                    return i;
                }
            }
            assert!(Instant::now() < deadline, "no primary serves slot {slot}");
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

/// Whether a `CLUSTER NODES` line lists `slot` among its ranges.
fn owns_slot(line: &str, slot: i64) -> bool {
    line.split_whitespace().skip(8).any(|range| {
        let mut ends = range.split('-').map(|n| n.parse::<i64>().ok());
        match (ends.next().flatten(), ends.next()) {
            (Some(lo), None) => lo == slot,
            (Some(lo), Some(Some(hi))) => lo <= slot && slot <= hi,
            _ => false,
        }
    })
}
