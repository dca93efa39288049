//! Binding a listener and running the router on it: inside the caller's tokio runtime
//! ([`bind`]), or on a runtime of its own for synchronous code such as the trainer ([`spawn`]).

use super::routes::router;
use super::state::ServeState;
use anyhow::{Context, Result};
use axum::serve::ListenerExt;
use std::net::SocketAddr;
use tokio::sync::oneshot;

/// A server running in the caller's runtime.
pub struct Server {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Binds `addr` (port 0: any free port) and serves `state`'s routes until shut down.
pub async fn bind(addr: &str, state: ServeState) -> Result<Server> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => "the port is in use (port 0 picks a free one)",
            std::io::ErrorKind::PermissionDenied => "ports below 1024 need privileges",
            _ => "is the host an address of this machine? (127.0.0.1 or 0.0.0.0)",
        };
        anyhow::anyhow!("binding {addr}: {hint}: {e}")
    })?;
    let addr = listener.local_addr()?;
    state.bound_to(addr);
    // Responses are small and latency matters more than packet count.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let app = router(state);
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    Ok(Server { addr, stop, task })
}

impl Server {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets requests in flight finish, and returns.
    pub async fn shutdown(self) -> Result<()> {
        let _ = self.stop.send(());
        self.task.await.context("the server task failed")??;
        Ok(())
    }

    /// Serves until the listener fails (or forever).
    pub async fn wait(self) -> Result<()> {
        let _keep_running = self.stop;
        self.task.await.context("the server task failed")??;
        Ok(())
    }
}

/// A server on its own runtime (`threads` worker threads), for callers outside async code.
/// Dropping it stops the server.
pub struct BackgroundServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    runtime: Option<tokio::runtime::Runtime>,
}

/// [`bind`] on a runtime of its own.
pub fn spawn(addr: &str, state: ServeState, threads: usize) -> Result<BackgroundServer> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name("skein-serve")
        .enable_all()
        .build()
        .context("starting the server's runtime")?;
    let server = runtime.block_on(bind(addr, state))?;
    let addr = server.addr;
    let (stop, stopped) = oneshot::channel::<()>();
    runtime.spawn(async move {
        let _ = stopped.await;
        let _ = server.shutdown().await;
    });
    Ok(BackgroundServer {
        addr,
        stop: Some(stop),
        runtime: Some(runtime),
    })
}

impl BackgroundServer {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for BackgroundServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(std::time::Duration::from_secs(5));
        }
    }
}
