//! Reaching Redis: one node, the primary the Sentinels name (followed
//! across failovers, `follow`) or a Cluster. Every call is bounded by the
//! store timeout, its errors sorted into the store's kinds, and, with
//! acknowledgements on, a writing call counts only once the replicas hold
//! its writes (`WAIT`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{RedisError, ScriptInvocation, Value};

use super::arrivals::Arrivals;
use super::calls::{Args, Call};
use super::frontier::{self, Frontiers};
use super::library::{self, Library};
use super::server::OFFSET_UNKNOWN;
use super::wire::CapKind;
use super::{follow, key_ttl_ms, wire, Inner, Layout, Options, RedisStore, Scripts, Target};
use crate::clock::Millis;
use crate::store::{RoomPolicy, StoreError};

/// A multiplexed connection that reconnects on its own; both kinds are cheap
/// to clone (a handle to one shared connection task).
#[derive(Clone)]
pub(super) enum Handle {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// How the store reaches Redis.
pub(super) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    /// The primary the Sentinels name, followed across failovers.
    Followed(Arc<follow::Follower>),
}

impl Connection {
    /// A handle for one call.
    pub(super) fn handle(&self) -> Handle {
        match self {
            Connection::Single(c) => Handle::Single(c.clone()),
            Connection::Cluster(c) => Handle::Cluster(c.clone()),
            Connection::Followed(f) => Handle::Single(f.get()),
        }
    }
}

impl RedisStore {
    /// Connects to one Redis (one URL) or to a Redis Cluster (several URLs,
    /// the seed nodes). Fails if the first connection is not made within
    /// `timeout`; after that, lost connections are re-established on their own.
    pub async fn connect(urls: &[String], timeout: Duration) -> Result<Self, StoreError> {
        Self::connect_with_ca(urls, timeout, None).await
    }

    /// As [`RedisStore::connect`], with the room functions built for
    /// `layout` (tests: small sizes, or another layout version).
    pub async fn connect_with_layout(
        urls: &[String],
        timeout: Duration,
        layout: Layout,
    ) -> Result<Self, StoreError> {
        let options = Options {
            layout,
            ..Options::new(timeout)
        };
        Self::open_with(Target::Urls(urls), options).await
    }

    /// As [`RedisStore::connect`]; `rediss://` servers are checked against
    /// the CAs in `ca` (PEM) when given, else against the system's roots.
    pub async fn connect_with_ca(
        urls: &[String],
        timeout: Duration,
        ca: Option<Vec<u8>>,
    ) -> Result<Self, StoreError> {
        let options = Options {
            ca,
            ..Options::new(timeout)
        };
        Self::open_with(Target::Urls(urls), options).await
    }

    /// Connects to Redis at `target`. Fails if the first connection is not
    /// made within the timeout; after that, lost connections are
    /// re-established on their own (and, through Sentinel, a new primary
    /// is followed).
    pub async fn open_with(target: Target<'_>, options: Options) -> Result<Self, StoreError> {
        let Options {
            timeout,
            ca,
            layout,
            replica_acks,
            replica_ack_timeout,
        } = options;
        // The client builds its rustls config with the process default provider.
        let certs = |ca: &Option<Vec<u8>>| redis::TlsCertificates {
            client_tls: None,
            root_cert: ca.clone(),
        };
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            // Retry quickly at first, and never wait long between
            // attempts: requests fail fast (fail_mode) meanwhile.
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_secs(1));
        let urls = match target {
            Target::Urls(urls) => urls,
            Target::Sentinel(_) => &[],
        };
        let unverified = Arc::new(AtomicBool::new(true));
        let conn = match (target, urls) {
            (Target::Sentinel(sentinel), _) => Connection::Followed(
                follow::Follower::connect(
                    sentinel,
                    timeout,
                    ca.clone(),
                    manager,
                    unverified.clone(),
                )
                .await?,
            ),
            (_, []) => return Err(StoreError::Unavailable("no Redis URL configured".into())),
            (_, [url]) => {
                let client = match &ca {
                    Some(_) if url.starts_with("rediss://") => {
                        redis::Client::build_with_tls(url.as_str(), certs(&ca))
                    }
                    _ => redis::Client::open(url.as_str()),
                }
                .map_err(|e| map_error(&e))?;
                let manager =
                    bounded(timeout, ConnectionManager::new_with_config(client, manager)).await??;
                Connection::Single(manager)
            }
            (_, seeds) => {
                let mut builder = ClusterClientBuilder::new(seeds.iter().map(String::as_str))
                    .connection_timeout(timeout)
                    .response_timeout(timeout);
                if ca.is_some() && seeds.iter().all(|u| u.starts_with("rediss://")) {
                    builder = builder.certs(certs(&ca));
                }
                let client = builder.build().map_err(|e| map_error(&e))?;
                let conn = bounded(timeout, client.get_async_connection()).await??;
                Connection::Cluster(conn)
            }
        };
        let store = Self {
            inner: Arc::new(Inner {
                conn,
                library: Library::new(&layout),
                scripts: Scripts::new(),
                timeout,
                clock_offset_us: AtomicI64::new(OFFSET_UNKNOWN),
                arrivals: Arrivals::default(),
                frontiers: Frontiers::default(),
                frontier_min_queue: AtomicU64::new(frontier::MIN_QUEUE),
                region: std::sync::OnceLock::new(),
                layout,
                layout_refused: std::sync::atomic::AtomicBool::new(false),
                acks: (replica_acks > 0).then(|| library::Acks {
                    replicas: replica_acks,
                    timeout_ms: replica_ack_timeout.as_millis().max(1) as u64,
                }),
                unverified,
                replid: tokio::sync::Mutex::new(None),
                rooms: std::sync::Mutex::new(HashMap::new()),
                answers: AtomicU64::new(0),
                recent_ends: std::sync::Mutex::new(std::collections::VecDeque::new()),
            }),
        };
        if let Err(e) = store.sync_clock().await {
            tracing::warn!(error = %e, "cannot read the Redis server clock yet; calls carry no deadline until it is read");
        }
        Ok(store)
    }
}

impl Inner {
    /// Sees how a call ended: Redis's answers are counted
    /// (`Store::answers`); one that failed as on a demoted or lost primary
    /// sends the Sentinel follower to look for the new primary.
    pub(super) fn saw<T>(&self, result: &Result<T, StoreError>) {
        if !matches!(
            result,
            Err(StoreError::Unavailable(_) | StoreError::Timeout)
        ) {
            self.answers.fetch_add(1, Ordering::Relaxed);
        }
        if let (Err(StoreError::Unavailable(_) | StoreError::Timeout), Connection::Followed(f)) =
            (result, &self.conn)
        {
            f.suspect();
        }
    }

    /// Runs one script invocation that only reads, bounded by the store
    /// timeout.
    pub(super) async fn run(&self, invocation: &ScriptInvocation<'_>) -> Result<Value, StoreError> {
        let result = match self.conn.handle() {
            Handle::Single(mut c) => self.run_on(&mut c, invocation, None).await,
            Handle::Cluster(mut c) => self.run_on(&mut c, invocation, None).await,
        };
        self.saw(&result);
        result
    }

    /// As [`Inner::run`], for a script that writes: with acknowledgements
    /// on, it counts only once the replicas have its writes.
    pub(super) async fn run_writing(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<Value, StoreError> {
        self.verify().await;
        let result = match self.conn.handle() {
            Handle::Single(mut c) => self.run_on(&mut c, invocation, self.acks).await,
            Handle::Cluster(mut c) => self.run_on(&mut c, invocation, self.acks).await,
        };
        self.saw(&result);
        result
    }

    pub(super) async fn run_on<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        invocation: &ScriptInvocation<'_>,
        acks: Option<library::Acks>,
    ) -> Result<Value, StoreError> {
        let run = async {
            let value = invocation.invoke_async::<Value>(conn).await?;
            if let Some(acks) = acks {
                let acked: i64 = acks.wait().query_async(conn).await?;
                return Ok(acks.check(acked).map(|()| value));
            }
            Ok(Ok(value))
        };
        bounded(self.timeout, run).await??
    }

    /// With acknowledgements on, waits until the replicas hold every write
    /// made so far on the connection (one node: the connection all calls
    /// share). Not for a Cluster, where the `WAIT` goes with its call.
    pub(super) async fn acknowledged(&self) -> Result<(), StoreError> {
        let Some(acks) = self.acks else {
            return Ok(());
        };
        let result = match self.conn.handle() {
            Handle::Single(mut c) => {
                bounded(self.timeout, acks.wait().query_async::<i64>(&mut c)).await?
            }
            Handle::Cluster(_) => return Ok(()),
        };
        self.saw(&result);
        acks.check(result?)
    }

    /// Runs one room function call, bounded by the store timeout; with
    /// acknowledgements on, every function but `check` waits for them.
    pub(super) async fn run_room(&self, call: &redis::Cmd) -> Result<Value, StoreError> {
        self.run_room_acked(call, self.acks).await
    }

    pub(super) async fn run_room_acked(
        &self,
        call: &redis::Cmd,
        acks: Option<library::Acks>,
    ) -> Result<Value, StoreError> {
        self.verify().await;
        let result = match self.conn.handle() {
            Handle::Single(mut c) => {
                bounded(self.timeout, self.library.run(&mut c, call, acks)).await?
            }
            Handle::Cluster(mut c) => {
                bounded(self.timeout, self.library.run(&mut c, call, acks)).await?
            }
        };
        let result = result.and_then(|r| r);
        self.saw(&result);
        if let Err(StoreError::Layout(version)) = &result {
            if !self.layout_refused.swap(true, Ordering::Relaxed) {
                tracing::error!(
                    layout = version,
                    reads = %format!("{}..={}", self.layout.oldest, self.layout.version),
                    "a room's keys in Redis were written by a layout this build does not read: \
                     it decides nothing for that room (store.fail_mode answers) until a build \
                     that reads it replaces this one"
                );
            }
        }
        result
    }

    /// A room function call: `now`, the policy and a deadline (see
    /// `lua/lib/ctx.lua`), then `call`'s own arguments.
    pub(super) fn room_call<C: Call>(
        &self,
        call: &C,
        keys: &[String],
        room: &RoomPolicy,
        now_ms: Millis,
        deadline_us: i64,
    ) -> redis::Cmd {
        self.know(room);
        let mut inv = self.library.call(C::FN, keys);
        // The region's grants, kept in the regional store (`region`): of
        // sessions and admission tokens, or of tokens alone for a room
        // without a capacity limit.
        let cap_kind = if !self.regional(room) {
            CapKind::Room
        } else if room.total_active_users > 0 {
            CapKind::Grant
        } else {
            CapKind::RateGrant
        };
        // One argument, parsed once per distinct string (`lua/lib/ctx.lua`).
        let policy = wire::policy_arg(room, cap_kind, key_ttl_ms(room));
        inv.arg(now_ms).arg(policy).arg(deadline_us);
        let mut args = Args::new(&mut inv, C::ARGS);
        call.put(&mut args);
        args.finish();
        inv
    }
}

/// Awaits `fut` for at most `timeout`.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<T, RedisError>>,
) -> Result<Result<T, StoreError>, StoreError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(result) => Ok(result.map_err(|e| map_error(&e))),
        Err(_) => Err(StoreError::Timeout),
    }
}

/// Sorts a Redis error into the store's three kinds. Messages name the error
/// class only: URLs (and any password in them) never reach logs or pages.
pub(crate) fn map_error(e: &RedisError) -> StoreError {
    use redis::{ErrorKind, ServerErrorKind};
    // The function saw its deadline pass before it started
    // (`lua/lib/ctx.lua`): Redis answered, the call reached it late. The
    // delay was this side's (a saturated daemon, or the network).
    if e.code() == Some("DEADLINE") {
        return StoreError::Busy;
    }
    if e.is_timeout() {
        return StoreError::Timeout;
    }
    // It refused the policy or the room's layout (`lua/lib/ctx.lua`).
    let number = || {
        e.detail()
            .and_then(|d| d.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    match e.code() {
        Some("STALE") => return StoreError::Stale(number()),
        Some("LAYOUT") => return StoreError::Layout(number()),
        // `min-replicas-to-write` refused the write: no replica to hold it.
        Some("NOREPLICAS") => return StoreError::Unavailable("NOREPLICAS".into()),
        _ => {}
    }
    match e.kind() {
        ErrorKind::Io
        | ErrorKind::AuthenticationFailed
        | ErrorKind::InvalidClientConfig
        | ErrorKind::ClusterConnectionNotFound
        | ErrorKind::Server(
            ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::TryAgain
            | ServerErrorKind::BusyLoading
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask,
        ) => StoreError::Unavailable(e.category().to_string()),
        _ => StoreError::Protocol(match (e.code(), e.detail()) {
            (Some(code), Some(detail)) => format!("{}: {code} {detail}", e.category()),
            (Some(code), None) => format!("{}: {code}", e.category()),
            _ => e.category().to_string(),
        }),
    }
}
