//! What the server's test files share: starting `lethe_server::run` on a port of its own.

use std::sync::mpsc;

/// A server running on its own runtime thread.
pub struct Spawned {
    /// `host:port` it listens on.
    pub addr: String,
    /// Sends the graceful-shutdown signal.
    pub stop: tokio::sync::oneshot::Sender<()>,
    /// The runtime's thread; joins with what `run` returned.
    pub thread: std::thread::JoinHandle<std::io::Result<()>>,
}

/// Starts `server` on 127.0.0.1, port 0, in a two-worker runtime of its own thread.
pub fn spawn(server: lethe_server::Server) -> Spawned {
    let (addr_tx, addr_rx) = mpsc::channel();
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx
                .send(listener.local_addr().unwrap().to_string())
                .unwrap();
            lethe_server::run(listener, server, async move {
                let _ = stop_rx.await;
            })
            .await
        })
    });
    Spawned {
        addr: addr_rx.recv().unwrap(),
        stop,
        thread,
    }
}
