//! The compliance console: a web front door for compliance teams, auditors
//! and admins, served by `spillway serve` on `console.listen`.
//!
//! It is a front door like gRPC: sign-in authenticates the bearer token
//! against the server's token table (the same one the gRPC interceptor
//! uses) and keeps the principal server-side (`auth`); every page and
//! action then calls one [`crate::service::Service`] operation with that
//! principal, so the access decisions and audit are those of every other
//! door, decided once, in the service layer. The console never reads the
//! store itself. The only thing it checks on its own is which links and
//! buttons to show (`views::may`, from the same access table), and that
//! is a courtesy: the service decides.
//!
//! Layout:
//! - `config`: the `[console]` section.
//! - `auth`: server-side sessions, cookies and CSRF tokens.
//! - `routes`: the router, security headers (strict CSP), the signed-in
//!   extractor, sign-in and sign-out, and service errors as pages.
//! - `views`: the page frame and shared pieces (maud templates).
//! - `charts`: SVG charts (plotters).
//! - `overview`, `policy`, `sessions`, `audit`: the pages.

mod audit;
mod auth;
mod charts;
mod ctx;
mod overview;
mod policy;
mod routes;
mod sessions;
mod views;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

pub use crate::config::ConsoleConfig;

use crate::auth::TokenTable;
use crate::config::Config;
use crate::service::Service;

/// Why the console could not start.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// The address could not be bound.
    #[error(
        "cannot listen on console.listen = {addr}: {source}; choose a free port, or set console.enabled = false"
    )]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Binds the console's listener, if the console is on. In dev mode, when
/// the default address is taken, the console stays off with a warning; an
/// address that was asked for must bind.
pub async fn bind(config: &Config) -> Result<Option<TcpListener>, ConsoleError> {
    let c = &config.console;
    let Some(addr) = c.address(config.dev_mode()) else {
        return Ok(None);
    };
    let asked = c.listen.is_some();
    match TcpListener::bind(addr).await {
        Ok(l) => Ok(Some(l)),
        Err(e) if !asked => {
            tracing::warn!(%addr, error = %e, "dev mode: the console's default address is not free; the console stays off (set console.listen)");
            Ok(None)
        }
        Err(source) => Err(ConsoleError::Bind { addr, source }),
    }
}

/// Serves the console on `listener` until `stop` changes or its sender is
/// dropped; every action calls `service`.
pub fn spawn(
    listener: TcpListener,
    config: Arc<Config>,
    tokens: Arc<TokenTable>,
    service: Service,
    mut stop: tokio::sync::watch::Receiver<()>,
) -> Result<tokio::task::JoinHandle<()>, ConsoleError> {
    let c = config.console.clone();
    let receipt_key = std::fs::read_to_string(config.data_dir.join(crate::receipt::KEY_FILE))
        .ok()
        .and_then(|t| crate::receipt::ReceiptKey::from_hex(t.trim()));
    if receipt_key.is_none() {
        tracing::warn!("console: cannot read the receipt key; receipts will be shown unverified");
    }
    let state = Arc::new(ctx::Console {
        service,
        sessions: auth::Sessions::new(c.session_lifetime, c.idle_timeout, c.max_sessions),
        tokens,
        config: config.clone(),
        secure: c.secure_cookie,
        overview_max_sessions: c.overview_max_sessions,
        verified: Default::default(),
    });
    let app = routes::router(state, c.max_body_bytes, c.request_timeout);
    let addr = listener.local_addr().ok();
    tracing::info!(addr = ?addr, "console listening");
    Ok(tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stop.changed().await;
            })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "console stopped with an error");
        }
    }))
}
