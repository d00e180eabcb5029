//! A minimal hyper 1.x reverse proxy: the second baseline of
//! `scripts/bench-load`, so the cost of waitroom's own logic (canonical
//! form, ticket, metrics, header rewriting) stays visible next to the cost
//! of the proxy machinery both share.
//!
//! Same shape as waitroom's serving core and nothing else: one current-
//! thread runtime per core, an `SO_REUSEPORT` listener per core, a
//! per-thread pool of HTTP/1.1 connections to the origin, connection tasks
//! spawned locally. No header rewriting beyond `Host`.
//!
//! `cargo bench --bench bare_proxy -- --listen 127.0.0.1:8081 --origin 127.0.0.1:3000`
//! serves until killed; without `--listen` it prints this usage and exits
//! (so a plain `cargo bench` passes over it).

use std::cell::RefCell;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::rc::Rc;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpSocket, TcpStream};

type Body = UnsyncBoxBody<Bytes, hyper::Error>;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<SocketAddr>().ok())
    };
    let (Some(listen), Some(origin)) = (arg("--listen"), arg("--origin")) else {
        println!(
            "bare_proxy: pass --listen ADDR --origin ADDR to serve (used by scripts/bench-load)"
        );
        return;
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads: Vec<_> = (0..cores)
        .map(|_| {
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                tokio::task::LocalSet::new().block_on(&rt, serve(listen, origin));
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

async fn serve(listen: SocketAddr, origin: SocketAddr) {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_reuseaddr(true).expect("reuseaddr");
    socket.set_reuseport(true).expect("reuseport");
    socket.bind(listen).expect("bind");
    let listener = socket.listen(1024).expect("listen");
    let pool: Rc<RefCell<Vec<SendRequest<Incoming>>>> = Rc::default();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let pool = pool.clone();
        tokio::task::spawn_local(async move {
            let svc = service_fn(move |req| {
                let pool = pool.clone();
                async move { Ok::<_, Infallible>(forward(req, origin, pool).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

async fn forward(
    mut req: Request<Incoming>,
    origin: SocketAddr,
    pool: Rc<RefCell<Vec<SendRequest<Incoming>>>>,
) -> Response<Body> {
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    *req.uri_mut() = path.parse::<Uri>().unwrap_or_default();
    let mut sender = loop {
        let idle = pool.borrow_mut().pop();
        match idle {
            Some(mut s) if !s.is_closed() => {
                if s.ready().await.is_ok() {
                    break s;
                }
            }
            Some(_) => continue,
            None => match connect(origin).await {
                Some(s) => break s,
                None => return bad_gateway(),
            },
        }
    };
    let resp = match sender.send_request(req).await {
        Ok(resp) => resp,
        Err(_) => return bad_gateway(),
    };
    // Back in the pool now: `ready()` waits for the body to be read before
    // the next request uses it.
    pool.borrow_mut().push(sender);
    resp.map(|b| b.boxed_unsync())
}

async fn connect(origin: SocketAddr) -> Option<SendRequest<Incoming>> {
    let stream = TcpStream::connect(origin).await.ok()?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::task::spawn_local(conn);
    Some(sender)
}

fn bad_gateway() -> Response<Body> {
    let mut resp = Response::new(Empty::new().map_err(|never| match never {}).boxed_unsync());
    *resp.status_mut() = StatusCode::BAD_GATEWAY;
    resp
}
