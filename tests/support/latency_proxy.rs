//! A TCP proxy on a loopback port that adds a fixed latency each way (a
//! cross-region link) and can be cut and restored (a region losing the
//! global store). Bytes keep their order and the delay does not throttle
//! throughput: each chunk is forwarded `delay` after it was read.
//!
//! Include it with `#[path = "support/latency_proxy.rs"] mod latency_proxy;`.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A running proxy; stops (and drops every connection) on drop.
pub struct LatencyProxy {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
    delay: Arc<std::sync::Mutex<Duration>>,
    task: JoinHandle<()>,
}

impl LatencyProxy {
    /// Forwards `127.0.0.1:<port>` to `target`, `delay` each way.
    pub async fn start(target: SocketAddr, delay: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let (cut, cut_rx) = watch::channel(false);
        let delay = Arc::new(std::sync::Mutex::new(delay));
        let task = tokio::spawn(accept_loop(listener, target, cut_rx, delay.clone()));
        Self {
            addr,
            cut,
            delay,
            task,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A redis:// URL through the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// Drops every connection and refuses new ones until `restore`.
    pub fn cut(&self) {
        let _ = self.cut.send(true);
    }

    pub fn restore(&self) {
        let _ = self.cut.send(false);
    }

    /// Changes the added latency for chunks read from now on.
    pub fn set_delay(&self, delay: Duration) {
        *self.delay.lock().unwrap() = delay;
    }
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        let _ = self.cut.send(true);
        self.task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    cut: watch::Receiver<bool>,
    delay: Arc<std::sync::Mutex<Duration>>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if *cut.borrow() {
            drop(client);
            continue;
        }
        let cut = cut.clone();
        let delay = delay.clone();
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(target).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            let up = pipe(cr, sw, delay.clone());
            let down = pipe(sr, cw, delay);
            let mut cut = cut;
            tokio::select! {
                _ = async { tokio::join!(up, down) } => {}
                _ = cut.wait_for(|c| *c) => {}
            }
        });
    }
}

/// Copies `from` to `to`, each chunk `delay` after it was read.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Arc<std::sync::Mutex<Duration>>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let d = *delay.lock().unwrap();
                    if tx.send((Instant::now() + d, buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    };
    tokio::join!(reader, writer);
}
