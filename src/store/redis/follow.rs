//! A primary found through Sentinel, and followed across failovers.
//!
//! The Sentinels are asked for the primary's address at start (the crate's
//! `SentinelClient`, which also checks with `ROLE` that the node it names
//! is a primary), then again every [`CHECK_EVERY`] and at once whenever a
//! call on the primary fails the way a demoted or dead primary fails
//! (`READONLY`, a lost connection, a timeout: [`Follower::suspect`]). When
//! the address changes, calls move to a new connection; the old one is
//! dropped. Decisions resume within about a second of the Sentinels'
//! promotion (`tests/failover.rs` measures it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{IntoConnectionInfo, RedisError, TlsMode};

use super::map_error;
use crate::config::SentinelConfig;
use crate::store::StoreError;

/// How often the Sentinels are asked whether the primary moved, failures
/// or not (a `+switch-master` seen by the Sentinels reaches us within it).
const CHECK_EVERY: Duration = Duration::from_millis(500);

/// The primary in use, and how to find the next one.
pub(super) struct Follower {
    /// The connection to the primary, and the address it goes to.
    current: Mutex<(ConnectionManager, String)>,
    /// Asks the Sentinels (one lookup at a time).
    sentinel: tokio::sync::Mutex<Lookup>,
    /// Wakes the follow task at once.
    wake: Arc<tokio::sync::Notify>,
    manager: ConnectionManagerConfig,
    timeout: Duration,
    /// Set when calls move to a new primary: the store verifies its rooms
    /// against the new primary's history before deciding there.
    switched: Arc<AtomicBool>,
}

struct Lookup {
    client: SentinelClient,
    /// The Sentinels' URLs, for the cheap check.
    urls: Vec<String>,
    master: String,
    /// CAs for `rediss://` Sentinels, when not the system's.
    ca: Option<Vec<u8>>,
    /// A connection to a Sentinel that answered, kept for the next check.
    asked: Option<MultiplexedConnection>,
}

impl Follower {
    /// Asks the Sentinels for the primary and connects to it; then follows
    /// it in a task of its own, which ends when the store is dropped.
    pub(super) async fn connect(
        config: &SentinelConfig,
        timeout: Duration,
        ca: Option<Vec<u8>>,
        manager: ConnectionManagerConfig,
        switched: Arc<AtomicBool>,
    ) -> Result<Arc<Self>, StoreError> {
        let client = sentinel_client(config, ca.clone()).map_err(|e| map_error(&e))?;
        let mut lookup = Lookup {
            client,
            urls: config.sentinels.clone(),
            master: config.master.clone(),
            ca,
            asked: None,
        };
        let (conn, addr) = bounded(timeout, lookup.primary(&manager)).await?;
        tracing::info!(primary = %addr, master = %config.master, "Sentinel: deciding on the primary");
        let follower = Arc::new(Self {
            current: Mutex::new((conn, addr)),
            sentinel: tokio::sync::Mutex::new(lookup),
            wake: Arc::new(tokio::sync::Notify::new()),
            manager,
            timeout,
            switched,
        });
        tokio::spawn(follow(Arc::downgrade(&follower), follower.wake.clone()));
        Ok(follower)
    }

    /// The connection to the primary as last known.
    pub(super) fn get(&self) -> ConnectionManager {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .clone()
    }

    /// A call failed as it would on a demoted or unreachable primary: ask
    /// the Sentinels now rather than at the next check.
    pub(super) fn suspect(&self) {
        self.wake.notify_one();
    }

    /// Asks the Sentinels where the primary is and moves there if it moved.
    async fn check(&self) -> Result<(), StoreError> {
        let mut lookup = self.sentinel.lock().await;
        let known = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .clone();
        // The cheap question first; the full lookup only when it differs.
        match bounded(self.timeout, lookup.address()).await {
            Ok(addr) if addr == known => return Ok(()),
            _ => {}
        }
        let (conn, addr) = bounded(self.timeout, lookup.primary(&self.manager)).await?;
        if addr != known {
            tracing::warn!(from = %known, to = %addr, "Sentinel: the primary moved; deciding on the new one");
            // Marked before the swap: no call reaches the new primary
            // before the store has verified its rooms there.
            self.switched.store(true, Ordering::Relaxed);
            *self.current.lock().unwrap_or_else(|p| p.into_inner()) = (conn, addr);
        }
        Ok(())
    }
}

impl Lookup {
    /// The primary's address as the Sentinels give it (`host:port`).
    async fn address(&mut self) -> Result<String, redis::RedisError> {
        if self.asked.is_none() {
            let mut last = None;
            for url in &self.urls {
                let client = match &self.ca {
                    Some(ca) if url.starts_with("rediss://") => redis::Client::build_with_tls(
                        url.as_str(),
                        redis::TlsCertificates {
                            client_tls: None,
                            root_cert: Some(ca.clone()),
                        },
                    )?,
                    _ => redis::Client::open(url.as_str())?,
                };
                match client.get_multiplexed_async_connection().await {
                    Ok(c) => {
                        self.asked = Some(c);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            if self.asked.is_none() {
                return Err(
                    last.unwrap_or_else(|| (redis::ErrorKind::Io, "no Sentinel to ask").into())
                );
            }
        }
        let conn = self.asked.as_mut().expect("connected above");
        let asked: Result<(String, u16), _> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.master)
            .query_async(conn)
            .await;
        match asked {
            Ok((host, port)) => Ok(format!("{host}:{port}")),
            Err(e) => {
                // Another Sentinel next time.
                self.asked = None;
                self.urls.rotate_left(1);
                Err(e)
            }
        }
    }

    /// A connection to the primary the Sentinels name, checked with `ROLE`.
    async fn primary(
        &mut self,
        config: &ConnectionManagerConfig,
    ) -> Result<(ConnectionManager, String), redis::RedisError> {
        let client = self.client.async_get_client().await?;
        let addr = match client.get_connection_info().addr() {
            redis::ConnectionAddr::Tcp(host, port)
            | redis::ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port}"),
            other => other.to_string(),
        };
        let conn = ConnectionManager::new_with_config(client, config.clone()).await?;
        Ok((conn, addr))
    }
}

/// Checks every [`CHECK_EVERY`], or at once when woken; ends with the store.
async fn follow(follower: Weak<Follower>, wake: Arc<tokio::sync::Notify>) {
    loop {
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(CHECK_EVERY) => {}
        }
        let Some(f) = follower.upgrade() else { return };
        if let Err(e) = f.check().await {
            tracing::warn!(error = %e, "Sentinel: cannot find the primary");
            drop(f);
            // Not in a tight loop while every Sentinel is away.
            tokio::time::sleep(CHECK_EVERY / 5).await;
        }
    }
}

/// The crate's Sentinel client for `config`: the Sentinels' password is
/// the one in their URLs; the primary's is `config.password`; TLS (and
/// `ca`) applies to both when the Sentinels are `rediss://`.
fn sentinel_client(
    config: &SentinelConfig,
    ca: Option<Vec<u8>>,
) -> Result<SentinelClient, RedisError> {
    let mut addrs = Vec::with_capacity(config.sentinels.len());
    let mut sentinel_password = None;
    for url in &config.sentinels {
        let info = url.as_str().into_connection_info()?;
        if let Some(p) = info.redis_settings().password() {
            sentinel_password = Some(p.to_owned());
        }
        addrs.push(info.addr().clone());
    }
    let mut builder =
        SentinelClientBuilder::new(addrs, &config.master, SentinelServerType::Master)?;
    if let Some(p) = &config.password {
        builder = builder.set_client_to_redis_password(p);
    }
    if let Some(p) = &sentinel_password {
        builder = builder.set_client_to_sentinel_password(p);
    }
    if config.tls {
        builder = builder
            .set_client_to_redis_tls_mode(TlsMode::Secure)
            .set_client_to_sentinel_tls_mode(TlsMode::Secure);
        if let Some(ca) = ca {
            let certs = || redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca.clone()),
            };
            builder = builder
                .set_client_to_redis_certificates(certs())
                .set_client_to_sentinel_certificates(certs());
        }
    }
    builder.build()
}

async fn bounded<T>(
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<T, redis::RedisError>>,
) -> Result<T, StoreError> {
    super::bounded(timeout, fut).await?
}
