//! The compliance console: a web front door for compliance teams, auditors
//! and admins, served by `spillway serve` on `console.listen`.
//!
//! It is a gRPC client of the server it runs in. Each signed-in browser
//! session keeps the user's bearer token server-side ([`auth`]), and every
//! page and action calls the server's own gRPC API over loopback with that
//! token ([`grpc`]), so access decisions and audit are exactly those of any
//! other client. The token table is consulted once, at sign-in, to greet the
//! user by principal and to leave out links their roles may not use.
//!
//! Layout:
//! - [`config`]: the `[console]` section.
//! - [`auth`]: server-side sessions, cookies and CSRF tokens.
//! - [`grpc`]: the loopback channel and per-user clients.
//! - [`routes`]: the router, security headers (strict CSP), the signed-in
//!   extractor, sign-in and sign-out, and gRPC statuses as pages.
//! - [`views`]: the page frame and shared pieces (maud templates).
//! - [`charts`]: SVG charts (plotters).
//! - [`overview`], [`policy`], [`sessions`], [`audit`]: the pages.

pub mod audit;
pub mod auth;
pub mod charts;
pub mod config;
pub mod grpc;
pub mod overview;
pub mod policy;
pub mod routes;
pub mod sessions;
pub mod views;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

pub use config::ConsoleConfig;

use crate::auth::TokenTable;
use crate::config::Config;

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
    /// The loopback gRPC channel could not be set up.
    #[error("cannot set up the console's connection to the server: {0}")]
    Channel(String),
}

/// Binds the console's listener, if the console is on. In dev mode, when
/// the default address is taken or TLS leaves the console without what it
/// needs, the console stays off with a warning; an address that was asked
/// for must bind.
pub async fn bind(config: &Config) -> Result<Option<TcpListener>, ConsoleError> {
    let c = &config.console;
    let Some(addr) = c.address(config.dev_mode()) else {
        return Ok(None);
    };
    let asked = c.listen.is_some();
    if !asked && config.tls.cert.is_some() && c.grpc_ca.is_none() {
        tracing::warn!(
            "dev mode with TLS: the console stays off until console.grpc_ca names the CA of tls.cert"
        );
        return Ok(None);
    }
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
/// dropped. `grpc` is the server's own address.
pub fn spawn(
    listener: TcpListener,
    config: Arc<Config>,
    tokens: Arc<TokenTable>,
    grpc: SocketAddr,
    mut stop: tokio::sync::watch::Receiver<()>,
) -> Result<tokio::task::JoinHandle<()>, ConsoleError> {
    let c = config.console.clone();
    let loopback = if grpc.ip().is_unspecified() {
        SocketAddr::new(
            if grpc.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            },
            grpc.port(),
        )
    } else {
        grpc
    };
    let tls_on = config.tls.cert.is_some();
    let tls = match (&c.grpc_ca, tls_on) {
        (Some(ca), true) => {
            let identity = c.grpc_cert.as_deref().zip(c.grpc_key.as_deref());
            let t = crate::tls::client_config(ca, identity)
                .map_err(|e| ConsoleError::Channel(e.to_string()))?
                .domain_name(c.grpc_domain.clone());
            Some(t)
        }
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let channel = grpc::Grpc::new(
        &format!("{scheme}://{loopback}"),
        tls,
        config.limits.max_response_message_bytes,
    )
    .map_err(|e| ConsoleError::Channel(e.to_string()))?;
    let receipt_key =
        std::fs::read_to_string(config.data_dir.join(crate::store::signing::KEY_FILE))
            .ok()
            .and_then(|t| crate::store::signing::ReceiptKey::from_hex(t.trim()));
    if receipt_key.is_none() {
        tracing::warn!("console: cannot read the receipt key; receipts will be shown unverified");
    }
    let state = Arc::new(routes::Console {
        grpc: channel,
        sessions: auth::Sessions::new(c.session_lifetime, c.idle_timeout, c.max_sessions),
        tokens,
        config: config.clone(),
        receipt_key,
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
