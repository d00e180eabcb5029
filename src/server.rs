//! Listeners and lifecycle: the visitor and admin listeners, the connection
//! cap, HTTP/1.1 + HTTP/2 serving, background refresh of room figures, and
//! graceful drain on shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

use crate::body::Body;
use crate::clock::{SharedClock, SystemClock};
use crate::config::{Backend, Config};
use crate::gate::{self, Gate, GateError};
use crate::store::memory::MemoryStore;
use crate::store::SharedStore;

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
}

/// What a daemon runs on, beyond its config. Tests inject a clock or a store.
#[derive(Default)]
pub struct Deps {
    pub store: Option<SharedStore>,
    pub clock: Option<SharedClock>,
}

/// The gate in force; a config reload swaps in a new one while requests in
/// flight finish on the old.
pub type SharedGate = Arc<ArcSwap<Gate>>;

/// A running daemon: its bound addresses, and the way to stop it.
pub struct Daemon {
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
    gates: SharedGate,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Daemon {
    /// Binds every listener (so a port in use fails here, before serving) and
    /// starts serving.
    pub async fn start(config: &Config, deps: Deps) -> Result<Self, StartError> {
        let clock = deps.clock.unwrap_or_else(|| Arc::new(SystemClock));
        let store = match deps.store {
            Some(s) => s,
            None => open_store(config).await?,
        };
        let gates: SharedGate = Arc::new(ArcSwap::from_pointee(Gate::new(config, store, clock)?));
        let listener = bind(config.server.listen).await?;
        let admin_listener = bind(config.server.admin_listen).await?;
        let addr = local_addr(&listener, config.server.listen);
        let admin_addr = local_addr(&admin_listener, config.server.admin_listen);
        let (stop, stopped) = watch::channel(false);

        let limits = Limits::from(config);
        let visitor_gates = gates.clone();
        let visitor_service = move |req: Request<Incoming>, peer: SocketAddr| {
            let gate = visitor_gates.load_full();
            async move { gate.handle(req, peer).await }
        };
        let admin_gates = gates.clone();
        let admin_service = move |req: Request<Incoming>, _peer: SocketAddr| {
            let gate = admin_gates.load_full();
            async move { admin(&gate, req).await }
        };
        let tasks = vec![
            tokio::spawn(serve(
                listener,
                visitor_service,
                limits.clone(),
                stopped.clone(),
            )),
            tokio::spawn(serve(
                admin_listener,
                admin_service,
                limits,
                stopped.clone(),
            )),
            tokio::spawn(refresh_rooms(gates.clone(), stopped)),
        ];
        let rooms = gates.load().rooms.all().len();
        tracing::info!(%addr, %admin_addr, rooms, "waitroom listening");
        Ok(Self {
            addr,
            admin_addr,
            gates,
            stop,
            tasks,
        })
    }

    /// The gate in force now.
    pub fn gate(&self) -> Arc<Gate> {
        self.gates.load_full()
    }

    /// Applies a new configuration without dropping connections: rooms are
    /// added, changed and removed; requests in flight finish on the old
    /// rooms. Listener addresses and the store backend need a restart.
    pub async fn reload(&self, config: &Config) -> Result<(), StartError> {
        let current = self.gate();
        let next = Gate::new(config, current.store.clone(), current.clock.clone())?;
        next.refresh_overrides().await;
        self.gates.store(Arc::new(next));
        tracing::info!(rooms = config.rooms.len(), "configuration reloaded");
        Ok(())
    }

    /// Stops accepting, drains in-flight requests (up to the drain timeout),
    /// and returns when every listener has finished.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Runs the daemon until `shutdown` resolves.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), StartError> {
    let daemon = Daemon::start(&config, Deps::default()).await?;
    shutdown.await;
    tracing::info!("shutting down: draining in-flight requests");
    daemon.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

async fn open_store(config: &Config) -> Result<SharedStore, StartError> {
    match &config.store.backend {
        Backend::Memory => Ok(Arc::new(MemoryStore::new())),
        Backend::Redis { urls } => {
            let store =
                crate::store::redis::RedisStore::connect(urls, config.store.timeout).await?;
            Ok(Arc::new(store))
        }
    }
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
struct Limits {
    max_connections: usize,
    max_header_bytes: usize,
    header_read_timeout: Duration,
    drain_timeout: Duration,
}

impl From<&Config> for Limits {
    fn from(c: &Config) -> Self {
        Self {
            max_connections: c.server.max_connections,
            max_header_bytes: c.server.max_header_bytes,
            header_read_timeout: c.server.header_read_timeout,
            drain_timeout: c.server.drain_timeout,
        }
    }
}

/// Accepts connections until told to stop, then drains them.
async fn serve<S, F>(
    listener: TcpListener,
    service: S,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) where
    S: Fn(Request<Incoming>, SocketAddr) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // hyper refuses buffers under 8 KiB; headers past the buffer get 431.
        .max_buf_size(limits.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(limits.max_header_bytes.min(u32::MAX as usize) as u32);
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let mut backoff = Duration::from_millis(5);

    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = stop.changed() => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => { backoff = Duration::from_millis(5); a }
                Err(e) => {
                    // Usually out of file descriptors: wait for some to free up.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        let svc = service_fn(move |req| {
            let fut = service(req, peer);
            async move { Ok::<_, Infallible>(fut.await) }
        });
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc);
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("drain timed out; closing remaining connections");
    }
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

/// The admin listener. The operator API and metrics arrive with issue 4;
/// `/live` and `/ready` are here from the start for load balancers.
async fn admin(gate: &Gate, req: Request<Incoming>) -> Response<Body> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/live") => gate::text(StatusCode::OK, "live"),
        (&Method::GET, "/ready") => {
            if gate.store_ready().await {
                gate::text(StatusCode::OK, "ready")
            } else {
                gate::text(StatusCode::SERVICE_UNAVAILABLE, "store unavailable")
            }
        }
        _ => gate::text(StatusCode::NOT_FOUND, "not found"),
    }
}
