//! Listeners and lifecycle: the visitor listeners (plain and TLS) and the
//! admin listener, connection caps (`conn`), HTTP/1.1 + HTTP/2 serving,
//! the https redirect (`redirect`), background refresh of room figures,
//! reloads (rooms and certificates), and graceful drain on shutdown.

pub(crate) mod conn;
pub(crate) mod redirect;
pub(crate) mod serve;
pub(crate) mod streams;
pub(crate) mod worker;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::Request;
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::admin::{Admin, Reloader};
use crate::clock::{SharedClock, SystemClock};
use crate::config::{Backend, Config};
use crate::gate::{Gate, GateError, SharedGate};
use crate::store::memory::MemoryStore;
use crate::store::SharedStore;
use crate::telemetry::Telemetry;
use crate::tls::{CertMap, SniResolver};
use worker::{Shared, TlsListen, Workers};

/// How often each instance reads operators' runtime room changes from the
/// store (so every instance applies a change within a second).
const OVERRIDES_REFRESH: Duration = Duration::from_millis(500);
/// How often each instance refreshes its rooms' figures (ETA rate), in
/// `OVERRIDES_REFRESH` ticks.
const FIGURES_EVERY: u32 = 4;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Gate(#[from] GateError),
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("server.admin_listen {0} is not a loopback address: set an admin token (server.admin_token_env) before exposing the admin API")]
    AdminWithoutToken(SocketAddr),
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Tls(#[from] crate::tls::SetupError),
}

/// What a daemon runs on, beyond its config. Tests inject a clock or a store.
#[derive(Default)]
pub struct Deps {
    /// The store to use instead of the one `[store]` names.
    pub store: Option<SharedStore>,
    /// The clock to use instead of the system's.
    pub clock: Option<SharedClock>,
    /// The config file, for reloads (`SIGHUP`, `POST /api/reload`).
    pub config_path: Option<PathBuf>,
}

/// A running daemon: its bound addresses, and the way to stop it.
pub struct Daemon {
    /// The public listener's address.
    pub addr: SocketAddr,
    /// The admin listener's address.
    pub admin_addr: SocketAddr,
    /// The TLS listener's address, when `[tls]` is configured.
    pub tls_addr: Option<SocketAddr>,
    live: Live,
    config_path: Option<PathBuf>,
    stop: watch::Sender<bool>,
    /// The admin listener and the background refresh.
    tasks: Vec<JoinHandle<()>>,
    /// The visitor listener's worker threads.
    workers: Option<Workers>,
    /// Region mode's link to the global store (its sync rounds, for tests).
    region: Option<Arc<crate::region::Region>>,
}

impl Daemon {
    /// Binds every listener (so a port in use fails here, before serving) and
    /// starts serving.
    pub async fn start(config: &Config, deps: Deps) -> Result<Self, StartError> {
        if !config.server.admin_listen.ip().is_loopback() && config.server.admin_token.is_none() {
            return Err(StartError::AdminWithoutToken(config.server.admin_listen));
        }
        if config.server.admin_token.is_none() {
            tracing::warn!(
                admin = %config.server.admin_listen,
                "no admin token: the admin API answers only loopback host names and same-origin requests; set server.admin_token_env to require a token"
            );
        }
        // The TLS listener and the Redis client's `rediss://` build their
        // rustls configurations on the process-wide provider.
        crate::tls::install_default_provider();
        let clock = deps.clock.unwrap_or_else(|| Arc::new(SystemClock));
        let webhooks = crate::webhook::Webhooks::new(&config.webhooks, clock.clone());
        let telemetry = Arc::new(Telemetry::new(webhooks));
        let mut region = None;
        let store = match deps.store {
            Some(s) => s,
            None => {
                let (store, r) = open_store(config, &telemetry).await?;
                region = r;
                store
            }
        };
        let gates: SharedGate = Arc::new(ArcSwap::from_pointee(Gate::new(
            config,
            store,
            clock,
            telemetry.clone(),
        )?));
        // Operators' runtime changes apply before the first visitor is served.
        gates.load().refresh_overrides().await;
        let admin_listener = bind(config.server.admin_listen).await?;
        let admin_addr = local_addr(&admin_listener, config.server.admin_listen);
        let (stop, stopped) = watch::channel(false);

        let limits = Limits::from(config);
        let visitor_caps = conn::Caps::new(
            config.server.max_connections,
            config.server.max_connections_per_ip,
            config.server.max_streams_per_ip,
        );
        let admin_caps = conn::Caps::new(
            ADMIN_MAX_CONNECTIONS.min(config.server.max_connections),
            ADMIN_MAX_CONNECTIONS_PER_IP,
            ADMIN_MAX_STREAMS_PER_IP,
        );
        let (certs, tls) = match &config.tls {
            None => (None, None),
            Some(t) => {
                let resolver = Arc::new(SniResolver::new(CertMap::new(t)));
                let acceptor = crate::tls::server_config(resolver.clone())?.into();
                let hosts = t
                    .certs
                    .iter()
                    .flat_map(|c| c.hosts.iter().cloned())
                    .chain(config.rooms.iter().filter_map(|r| r.host.clone()))
                    .collect();
                let listen = TlsListen {
                    addr: t.listen,
                    acceptor,
                    redirect_http: t.redirect_http,
                    hosts,
                };
                (Some(resolver), Some(listen))
            }
        };
        let live = Live {
            gates: gates.clone(),
            telemetry: telemetry.clone(),
            certs,
            tls_started: config.tls.as_ref().map(|t| (t.listen, t.redirect_http)),
        };
        let workers = Workers::start(
            config.server.listen,
            tls,
            config.server.workers(),
            Shared {
                gates: gates.clone(),
                limits: limits.clone(),
                caps: visitor_caps,
                stop: stopped.clone(),
                health_path: Arc::from(format!("{}health", config.server.reserved_prefix)),
            },
        )
        .await?;
        let (addr, tls_addr) = (workers.addr, workers.tls_addr);
        let reload: Option<Reloader> = deps.config_path.clone().map(|path| {
            let live = live.clone();
            let reload: Reloader = Arc::new(move || {
                let (live, path) = (live.clone(), path.clone());
                Box::pin(async move { live.reload_from(&path).await.map_err(|e| e.to_string()) })
            });
            reload
        });
        let admin = Arc::new(Admin {
            gates: gates.clone(),
            telemetry: telemetry.clone(),
            token: config.server.admin_token.clone(),
            loopback: admin_addr.ip().is_loopback(),
            reload,
        });
        let admin_listener = admin_listener
            .into_std()
            .map_err(|source| StartError::Bind {
                addr: admin_addr,
                source,
            })?;
        let admin_done = serve_admin(admin_listener, admin, limits, admin_caps, stopped.clone());
        let mut tasks = vec![
            tokio::spawn(async move {
                let _ = admin_done.await;
            }),
            tokio::spawn(refresh_rooms(gates.clone(), stopped.clone())),
        ];
        let region = region.map(|(region, redis)| {
            tasks.push(tokio::spawn(region.clone().run(
                redis,
                gates.clone(),
                stopped,
            )));
            region
        });
        let rooms = gates.load().rooms.all().len();
        let threads = config.server.workers();
        match tls_addr {
            Some(tls) => {
                tracing::info!(%addr, %tls, %admin_addr, rooms, workers = threads, "waitroom listening")
            }
            None => {
                tracing::info!(%addr, %admin_addr, rooms, workers = threads, "waitroom listening")
            }
        }
        Ok(Self {
            addr,
            admin_addr,
            tls_addr,
            live,
            config_path: deps.config_path,
            stop,
            tasks,
            workers: Some(workers),
            region,
        })
    }

    /// Region mode's link to the global store (`None` in the central mode).
    pub fn region(&self) -> Option<&Arc<crate::region::Region>> {
        self.region.as_ref()
    }

    /// The gate in force now.
    pub fn gate(&self) -> Arc<Gate> {
        self.live.gates.load_full()
    }

    /// Applies a new configuration without dropping connections: rooms are
    /// added, changed and removed; requests in flight finish on the old
    /// rooms; new TLS handshakes get the new certificates while open
    /// connections keep theirs. Listener addresses (and turning TLS on or
    /// off) and the store backend need a restart.
    pub async fn reload(&self, config: &Config) -> Result<(), StartError> {
        self.live.swap_in(config).await
    }

    /// Reloads the config file the daemon was started from. An invalid file
    /// is refused and the running configuration stays.
    pub async fn reload_from_file(&self) -> Result<(), StartError> {
        let path = self
            .config_path
            .as_ref()
            .ok_or_else(|| StartError::Config("not started from a config file".into()))?;
        self.live.reload_from(path).await
    }

    /// Stops accepting, drains in-flight requests (up to the drain timeout),
    /// and returns when every listener has finished.
    pub async fn shutdown(self) {
        // Not ready first, so load balancers stop sending new visitors here.
        self.live.telemetry.draining.store(true, Ordering::Relaxed);
        let _ = self.stop.send(true);
        let mut this = self;
        if let Some(workers) = this.workers.take() {
            workers.stopped().await;
        }
        for task in std::mem::take(&mut this.tasks) {
            let _ = task.await;
        }
        // What the webhooks hold goes out within a short grace.
        this.live
            .telemetry
            .webhooks
            .shutdown(std::time::Duration::from_secs(2))
            .await;
    }
}

/// What a reload replaces: the gate (rooms and settings) and the TLS
/// listener's certificates.
#[derive(Clone)]
struct Live {
    gates: SharedGate,
    telemetry: Arc<Telemetry>,
    /// The TLS listener's certificates, when it runs.
    certs: Option<Arc<SniResolver>>,
    /// `tls.listen` and `tls.redirect_http` as started, which a reload
    /// cannot change (it warns instead).
    tls_started: Option<(SocketAddr, bool)>,
}

impl Live {
    /// Installs `config`'s rooms and certificates: both, or (when the new
    /// gate cannot be built) neither.
    async fn swap_in(&self, config: &Config) -> Result<(), StartError> {
        let current = self.gates.load_full();
        let next = Gate::new(
            config,
            current.store.shared().clone(),
            current.clock.clone(),
            self.telemetry.clone(),
        )?;
        next.refresh_overrides().await;
        for room in next.rooms.all() {
            let old = current.rooms.by_id(&room.config.id);
            if let (Some(new), Some(old)) = (&room.jwks, old.and_then(|r| r.jwks.as_ref())) {
                new.carry_over(old);
            }
        }
        self.gates.store(Arc::new(next));
        self.telemetry.webhooks.reload(&config.webhooks);
        match (&self.certs, &config.tls) {
            (Some(resolver), Some(tls)) => {
                resolver.replace(CertMap::new(tls));
                tracing::info!(certificates = tls.certs.len(), "TLS certificates reloaded");
                if self.tls_started != Some((tls.listen, tls.redirect_http)) {
                    tracing::warn!("tls.listen and tls.redirect_http change only on a restart");
                }
            }
            (Some(_), None) => tracing::warn!(
                "[tls] was removed from the configuration; the TLS listener keeps its certificates until a restart"
            ),
            (None, Some(_)) => tracing::warn!(
                "[tls] was added to the configuration; the TLS listener starts only on a restart"
            ),
            (None, None) => {}
        }
        tracing::info!(rooms = config.rooms.len(), "configuration reloaded");
        Ok(())
    }

    /// Reloads the config file; an invalid one (a certificate that cannot
    /// be read, or does not match its key, included) is refused and the
    /// running configuration stays.
    async fn reload_from(&self, path: &std::path::Path) -> Result<(), StartError> {
        let config = crate::config::load(path).map_err(|e| {
            tracing::error!(error = %e, "reload refused: the running configuration stays");
            StartError::Config(e.to_string())
        })?;
        self.swap_in(&config).await
    }
}

/// Runs the daemon until `shutdown` resolves, reloading its config file on
/// `reload` signals (SIGHUP in the binary).
pub async fn run(
    config: Config,
    config_path: Option<PathBuf>,
    shutdown: impl Future<Output = ()>,
    mut reload: impl futures_util::Stream<Item = ()> + Unpin,
) -> Result<(), StartError> {
    let deps = Deps {
        config_path,
        ..Deps::default()
    };
    let daemon = Daemon::start(&config, deps).await?;
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(()) = futures_util::StreamExt::next(&mut reload) => {
                let _ = daemon.reload_from_file().await;
            }
        }
    }
    tracing::info!("shutting down: draining in-flight requests");
    daemon.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

/// Region mode's sync task, to start once the gate exists.
type RegionTask = (Arc<crate::region::Region>, crate::store::redis::RedisStore);

async fn open_store(
    config: &Config,
    telemetry: &Arc<Telemetry>,
) -> Result<(SharedStore, Option<RegionTask>), StartError> {
    use crate::store::redis::{Options, RedisStore, Target};
    let target = match &config.store.backend {
        Backend::Memory => return Ok((Arc::new(MemoryStore::new()), None)),
        Backend::Sentinel(s) => Target::Sentinel(s),
        Backend::Redis { urls } => Target::Urls(urls),
    };
    let ca = match &config.store.tls_ca {
        None => None,
        Some(path) => Some(std::fs::read(path).map_err(|e| {
            StartError::Config(format!("store.tls_ca: cannot read {}: {e}", path.display()))
        })?),
    };
    let options = Options {
        ca,
        replica_acks: config.store.replica_acks,
        replica_ack_timeout: config.store.replica_ack_timeout,
        ..Options::new(config.store.timeout)
    };
    let store = RedisStore::open_with(target, options).await?;
    let region = match &config.region {
        None => None,
        Some(r) => {
            let region = Arc::new(crate::region::Region::new(
                r,
                config.store.timeout,
                Some(telemetry.clone()),
            )?);
            store.set_region(region.clone());
            tracing::info!(region = %r.name, "region mode: deciding against the region's grants");
            Some((region, store.clone()))
        }
    };
    Ok((Arc::new(store), region))
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })
}

fn local_addr(listener: &TcpListener, configured: SocketAddr) -> SocketAddr {
    listener.local_addr().unwrap_or(configured)
}

/// Per-listener limits from `[server]`.
#[derive(Clone)]
pub(crate) struct Limits {
    max_header_bytes: usize,
    header_read_timeout: Duration,
    drain_timeout: Duration,
    max_streams_per_connection: u32,
    send_timeout: Duration,
}

impl From<&Config> for Limits {
    fn from(c: &Config) -> Self {
        Self {
            max_header_bytes: c.server.max_header_bytes,
            header_read_timeout: c.server.header_read_timeout,
            drain_timeout: c.server.drain_timeout,
            max_streams_per_connection: c.server.max_streams_per_connection,
            send_timeout: c.server.send_timeout,
        }
    }
}

/// The admin listener's caps: its peers are operators and scrapers, a few
/// connections each; it shares the process's descriptors with the visitor
/// listeners, so a flood of it must not take them.
const ADMIN_MAX_CONNECTIONS: usize = 256;
const ADMIN_MAX_CONNECTIONS_PER_IP: usize = 64;
const ADMIN_MAX_STREAMS_PER_IP: usize = 256;

/// The admin listener, on a thread of its own served like a visitor
/// worker's (caps per address, the HTTP/2 watch, the send timeout):
/// accepts connections until told to stop, then drains them. Resolves
/// when it has.
fn serve_admin(
    listener: std::net::TcpListener,
    admin: Arc<Admin>,
    limits: Limits,
    caps: conn::Caps,
    mut stop: watch::Receiver<bool>,
) -> tokio::sync::oneshot::Receiver<()> {
    let (done, done_rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("waitroom-admin".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    tracing::error!(error = %e, "admin runtime failed to start");
                    return;
                }
            };
            let local = tokio::task::LocalSet::new();
            local.block_on(&runtime, async move {
                let listener = match TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!(error = %e, "admin listener failed");
                        return;
                    }
                };
                let serving = Rc::new(serve::Serving::new(&limits));
                let open = serve::Open::default();
                while let Some((stream, peer, admission)) =
                    conn::accept(&listener, &caps, &mut stop).await
                {
                    let _ = stream.set_nodelay(true);
                    let admin = admin.clone();
                    let budget = admission.streams();
                    let (serving, stop, open) = (serving.clone(), stop.clone(), open.enter());
                    tokio::task::spawn_local(async move {
                        let (_open, _admission) = (open, admission);
                        let handler = move |req: Request<Incoming>| {
                            let admin = admin.clone();
                            async move { admin.handle(req, peer).await }
                        };
                        if let Err(e) = serve::serve(stream, handler, budget, &serving, stop).await
                        {
                            tracing::debug!(error = %e, %peer, "connection ended with an error");
                        }
                    });
                }
                drop(listener);
                caps.close();
                if tokio::time::timeout(limits.drain_timeout, open.all_closed())
                    .await
                    .is_err()
                {
                    tracing::warn!("admin drain timed out; closing remaining connections");
                }
            });
            let _ = done.send(());
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "admin thread failed to start");
    }
    done_rx
}

/// Keeps each room's runtime settings and observed admission rate fresh.
async fn refresh_rooms(gates: SharedGate, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(OVERRIDES_REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for n in 0u32.. {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let gate = gates.load_full();
        gate.refresh_overrides().await;
        if n % FIGURES_EVERY == 0 {
            gate.refresh_room_figures().await;
        }
    }
}
