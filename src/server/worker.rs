//! The visitor listeners' workers: one OS thread per core, each running a
//! current-thread runtime with its own `SO_REUSEPORT` listener (and one for
//! TLS when `[tls]` is set), its own connections and its own origin
//! connection pool.
//!
//! The kernel spreads new connections over the workers' listeners; from
//! then on a connection, its requests and the origin connections they use
//! stay on one thread. Nothing on the admitted path crosses cores: no task
//! is woken on another thread, no channel is shared, the gate in force is
//! read through a per-worker cache, and the only shared writes are the
//! metrics' counters.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{oneshot, watch};
use tokio_rustls::TlsAcceptor;

use super::conn::{self, Caps};
use super::redirect::Redirect;
use super::serve::{self, Open, Serving};
use super::{Limits, StartError};
use crate::gate::{ConnInfo, Gate, SharedGate};

/// The gate as one worker holds it: an `Rc` around the shared `Arc`, so
/// that each request's copy is a plain increment on this thread rather
/// than an atomic one on a cache line every core writes.
#[allow(clippy::redundant_allocation)]
type LocalGate = Rc<Arc<Gate>>;

/// The gate in force, read once per request without touching a shared
/// reference count: the `Arc` of the current gate is kept here and only
/// swapped when a reload installed another.
struct GateCache {
    gates: SharedGate,
    current: RefCell<LocalGate>,
}

impl GateCache {
    fn new(gates: SharedGate) -> Self {
        let current = RefCell::new(Rc::new(gates.load_full()));
        Self { gates, current }
    }

    fn get(&self) -> LocalGate {
        let installed = self.gates.load();
        let mut current = self.current.borrow_mut();
        if !Arc::ptr_eq(&installed, &current) {
            *current = Rc::new(Arc::clone(&installed));
        }
        Rc::clone(&current)
    }
}

/// The running workers.
pub(crate) struct Workers {
    /// Where they listen (one port, bound by each).
    pub addr: SocketAddr,
    /// Where they accept TLS, when `[tls]` is configured.
    pub tls_addr: Option<SocketAddr>,
    /// One per worker, resolved when it has drained and stopped.
    done: Vec<oneshot::Receiver<()>>,
}

/// The TLS listener, served by the same workers as the plain one.
#[derive(Clone)]
pub(crate) struct TlsListen {
    pub addr: SocketAddr,
    pub acceptor: TlsAcceptor,
    /// Plain HTTP is answered with a redirect to this listener.
    pub redirect_http: bool,
    /// The hosts plain HTTP is redirected to (see `redirect`).
    pub hosts: Vec<String>,
}

/// What every worker shares, cloned into each.
#[derive(Clone)]
pub(crate) struct Shared {
    pub gates: SharedGate,
    pub limits: Limits,
    /// One set of caps for both listeners: a client's plain and TLS
    /// connections count together.
    pub caps: Caps,
    pub stop: watch::Receiver<bool>,
    /// The daemon's health check path (answered on plain HTTP even when
    /// it redirects to https).
    pub health_path: Arc<str>,
}

impl Workers {
    /// Binds `count` listeners on `addr` (the first picks the port when it
    /// is 0), and as many on the TLS address when given, and starts a
    /// worker thread for each pair; returns once every one listens.
    pub(crate) async fn start(
        addr: SocketAddr,
        tls: Option<TlsListen>,
        count: usize,
        shared: Shared,
    ) -> Result<Self, StartError> {
        let bind_error = |addr, source| StartError::Bind { addr, source };
        let count = count.max(1);
        let mut sockets = Vec::with_capacity(count);
        let mut bound = addr;
        for _ in 0..count {
            let socket = reuseport_socket(bound).map_err(|e| bind_error(bound, e))?;
            bound = socket.local_addr().map_err(|e| bind_error(bound, e))?;
            sockets.push(socket);
        }
        let mut tls_sockets: Vec<Option<(TcpSocket, TlsListen)>> = Vec::with_capacity(count);
        let mut tls_addr = None;
        if let Some(mut tls) = tls {
            for _ in 0..count {
                let socket = reuseport_socket(tls.addr).map_err(|e| bind_error(tls.addr, e))?;
                tls.addr = socket.local_addr().map_err(|e| bind_error(tls.addr, e))?;
                tls_sockets.push(Some((socket, tls.clone())));
            }
            tls_addr = Some(tls.addr);
        } else {
            tls_sockets.resize_with(count, || None);
        }
        let mut done = Vec::with_capacity(sockets.len());
        let mut listening = Vec::with_capacity(sockets.len());
        for (index, (socket, tls)) in sockets.into_iter().zip(tls_sockets).enumerate() {
            let (finished, finished_rx) = oneshot::channel();
            done.push(finished_rx);
            let (ready, ready_rx) = oneshot::channel();
            listening.push(ready_rx);
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("waitroom-worker-{index}"))
                .spawn(move || {
                    match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(runtime) => {
                            let local = tokio::task::LocalSet::new();
                            local.block_on(&runtime, run(index, socket, tls, ready, shared));
                        }
                        Err(e) => tracing::error!(error = %e, "worker runtime failed to start"),
                    }
                    let _ = finished.send(());
                })
                .map_err(|e| bind_error(bound, e))?;
        }
        for ready in listening {
            match ready.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(bind_error(bound, e)),
                Err(_) => {
                    return Err(bind_error(
                        bound,
                        std::io::Error::other("worker thread ended before listening"),
                    ))
                }
            }
        }
        Ok(Self {
            addr: bound,
            tls_addr,
            done,
        })
    }

    /// Waits until every worker has drained and stopped.
    pub(crate) async fn stopped(self) {
        for done in self.done {
            let _ = done.await;
        }
    }
}

/// A listening socket on `addr` that other sockets of this process may
/// share (`SO_REUSEPORT`), so each worker accepts on its own.
fn reuseport_socket(addr: SocketAddr) -> std::io::Result<TcpSocket> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    #[cfg(unix)]
    socket.set_reuseport(true)?;
    socket.set_nodelay(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

/// One worker: accepts on its plain listener (and its TLS listener, when
/// there is one) until told to stop, then drains its connections.
async fn run(
    index: usize,
    socket: TcpSocket,
    tls: Option<(TcpSocket, TlsListen)>,
    ready: oneshot::Sender<std::io::Result<()>>,
    shared: Shared,
) {
    // Listening registers the sockets with this thread's runtime.
    let listened = socket.listen(1024).and_then(|plain| {
        let tls = match tls {
            Some((socket, tls)) => Some((socket.listen(1024)?, tls)),
            None => None,
        };
        Ok((plain, tls))
    });
    let (plain, tls) = match listened {
        Ok(l) => {
            let _ = ready.send(Ok(()));
            l
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let worker = Worker {
        index,
        cache: Rc::new(GateCache::new(shared.gates.clone())),
        serving: Rc::new(Serving::new(&shared.limits)),
        open: Open::default(),
        caps: shared.caps.clone(),
        stop: shared.stop.clone(),
    };
    let redirect = tls.as_ref().filter(|(_, t)| t.redirect_http).map(|(_, t)| {
        Rc::new(Redirect::new(
            t.addr.port(),
            shared.health_path.clone(),
            t.hosts.clone(),
        ))
    });
    let tls_loop = async {
        if let Some((listener, tls)) = tls {
            worker.accept(listener, Some(tls.acceptor), None).await;
        }
    };
    tokio::join!(worker.accept(plain, None, redirect), tls_loop);
    if tokio::time::timeout(shared.limits.drain_timeout, worker.open.all_closed())
        .await
        .is_err()
    {
        tracing::warn!(
            worker = index,
            "drain timed out; closing remaining connections"
        );
    }
}

/// One worker's state, shared by its accept loops.
struct Worker {
    index: usize,
    cache: Rc<GateCache>,
    serving: Rc<Serving>,
    open: Open,
    caps: Caps,
    stop: watch::Receiver<bool>,
}

impl Worker {
    /// Accepts on `listener` until told to stop: TLS connections when
    /// `tls` is given; plain ones otherwise, answered with a redirect to
    /// https when `redirect` is given.
    async fn accept(
        &self,
        listener: TcpListener,
        tls: Option<TlsAcceptor>,
        redirect: Option<Rc<Redirect>>,
    ) {
        let mut stop = self.stop.clone();
        while let Some((stream, peer, admission)) =
            conn::accept(&listener, &self.caps, &mut stop).await
        {
            let cache = self.cache.clone();
            let budget = admission.streams();
            // The connection's place under the caps, kept by a tunnel it
            // may turn into.
            let place = Arc::new(admission);
            let info = ConnInfo::new(peer, self.index).holding(place.clone());
            let info = Rc::new(if tls.is_some() { info.over_tls() } else { info });
            let (serving, stop, open) = (self.serving.clone(), stop.clone(), self.open.enter());
            let (tls, redirect) = (tls.clone(), redirect.clone());
            tokio::task::spawn_local(async move {
                let _open = open;
                let _place = place;
                let handler = move |req| {
                    let (gate, info, redirect) = (cache.get(), info.clone(), redirect.clone());
                    async move {
                        match redirect.as_ref().and_then(|r| r.answer(&req)) {
                            Some(resp) => resp,
                            None => gate.handle(req, &info).await,
                        }
                    }
                };
                let served = match tls {
                    Some(acceptor) => {
                        serve::serve_tls(stream, &acceptor, handler, budget, &serving, stop).await
                    }
                    None => serve::serve(stream, handler, budget, &serving, stop).await,
                };
                if let Err(e) = served {
                    tracing::debug!(error = %e, %peer, "connection ended with an error");
                }
            });
        }
    }
}
