//! A small runtime of the store's own, for the async clients (Postgres,
//! object storage) behind the store's blocking interface: [`Bridge::wait`]
//! runs a future there and blocks the calling thread on a channel, which
//! works from any thread, inside another runtime's blocking pool too.

use std::future::Future;

/// A two-thread runtime that drives one client's connections.
pub struct Bridge {
    rt: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
}

impl std::fmt::Debug for Bridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bridge").finish_non_exhaustive()
    }
}

impl Bridge {
    /// Starts the runtime; its threads are named `name`.
    pub fn new(name: &str) -> std::io::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(name)
            .enable_all()
            .build()?;
        let handle = rt.handle().clone();
        Ok(Self {
            rt: Some(rt),
            handle,
        })
    }

    /// The runtime, for setting up clients that spawn onto it.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    /// Runs `f` on the runtime and waits for it; `None` when the runtime
    /// has stopped.
    pub fn wait<T: Send + 'static>(
        &self,
        f: impl Future<Output = T> + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.handle.spawn(async move {
            let _ = tx.send(f.await);
        });
        rx.recv().ok()
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which panics inside another runtime;
        // the connections' tasks need no waiting for.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}
